//! UMR through the model: a REG_UMR QP made by real commands and brought to RTS as Linux's
//! `mlx5r_umr_resource_init` does, UMR WQEs posted on its send queue and rung through the UAR BlueFlame
//! register, their CQEs read back from the CQ ring, the key checked through QUERY_MKEY and the RoCE responder.
//!
//! The WQEs come from an encoder written here from `include/linux/mlx5/qp.h` and `device.h` (`mlx5_wqe_ctrl_seg`,
//! `mlx5_wqe_umr_ctrl_seg`, `mlx5_mkey_seg`, `MLX5_MKEY_MASK_*`, `MLX5_UMR_*`), independently of the model's
//! decoder and of the driver's builders; `golden_revoke_bytes` pins it to bytes laid out by hand.

mod common;
mod support_qp;

mod rocev2;

use common::{Drv, be32, cmd, put32};
use mlx5_model::fault::Fault;
use mlx5_model::mem::Memory;
use mlx5_model::roce::responder::{self, Disposition};
use mlx5_model::{ModelConfig, dataplane};
use support_qp::*;

// ---- The tests' own UMR encoder --------------------------------------------------------------------------

const OPCODE_UMR: u8 = 0x25;
/// `MLX5_UMR_*` (`device.h`).
const TRANSLATION_OFFSET_EN: u8 = 1 << 4;
const CHECK_NOT_FREE: u8 = 1 << 5;
const CHECK_FREE: u8 = 2 << 5;
const INLINE: u8 = 1 << 7;
/// `MLX5_MKEY_MASK_*` (`device.h`).
const M_LEN: u64 = 1 << 0;
const M_PAGE_SIZE: u64 = 1 << 1;
const M_START_ADDR: u64 = 1 << 6;
const M_PD: u64 = 1 << 7;
const M_EN_RINVAL: u64 = 1 << 8;
const M_KEY: u64 = 1 << 13;
const M_LR: u64 = 1 << 17;
const M_LW: u64 = 1 << 18;
const M_RR: u64 = 1 << 19;
const M_RW: u64 = 1 << 20;
const M_FREE: u64 = 1 << 29;
/// `fm_ce_se`: `MLX5_FENCE_MODE_INITIATOR_SMALL` (1 << 5) | `MLX5_WQE_CTRL_CQ_UPDATE` (2 << 2), as Linux's
/// `mlx5r_umr_post_send` on its signal-all UMR QP.
const FM_CE_SE: u8 = (1 << 5) | (2 << 2);
/// CQE opcodes and syndromes (`cq.h`).
const CQE_REQ: u8 = 0x0;
const CQE_REQ_ERR: u8 = 0xd;
const LOCAL_LENGTH_ERR: u8 = 0x01;
const LOCAL_QP_OP_ERR: u8 = 0x02;
const LOCAL_PROT_ERR: u8 = 0x04;
const WR_FLUSH_ERR: u8 = 0x05;

/// The `mlx5_mkey_seg` fields a UMR may set (byte offsets of `device.h`'s struct).
#[derive(Clone, Copy, Default)]
struct MkeySeg {
    free: bool,
    /// `flags` byte: a, rw, rr, lw, lr bits (`MLX5_PERM_*`), umr_en, access mode.
    perm: u8,
    variant: u8,
    pd: u32,
    start: u64,
    len: u64,
    xlt_oct_size: u32,
    log_page_size: u8,
}

const PERM_LOCAL_READ: u8 = 1 << 2;
const PERM_LOCAL_WRITE: u8 = 1 << 3;
const PERM_REMOTE_READ: u8 = 1 << 4;
const PERM_REMOTE_WRITE: u8 = 1 << 5;

impl MkeySeg {
    fn bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0] = if self.free { 0x40 } else { 0 };
        b[2] = self.perm;
        b[4..8].copy_from_slice(&(0xffff_ff00 | u32::from(self.variant)).to_be_bytes());
        b[0x0c..0x10].copy_from_slice(&(self.pd & 0xff_ffff).to_be_bytes());
        b[0x10..0x18].copy_from_slice(&self.start.to_be_bytes());
        b[0x18..0x20].copy_from_slice(&self.len.to_be_bytes());
        b[0x34..0x38].copy_from_slice(&self.xlt_oct_size.to_be_bytes());
        b[0x3b] = self.log_page_size;
        b
    }
}

/// A UMR WQE before encoding.
#[derive(Clone)]
struct Umr {
    index: u16,
    qpn: u32,
    fm_ce_se: u8,
    mkey: u32,
    flags: u8,
    xlt_octowords: u16,
    xlt_offset: u16,
    mask: u64,
    seg: MkeySeg,
    /// Inline translation bytes or a 16-byte data segment.
    tail: Vec<u8>,
}

impl Umr {
    fn encode(&self) -> Vec<u8> {
        let ds = (128 + self.tail.len()) / 16;
        let mut w = vec![0u8; ds * 16];
        w[0..4].copy_from_slice(&((u32::from(self.index) << 8) | u32::from(OPCODE_UMR)).to_be_bytes());
        w[4..8].copy_from_slice(&((self.qpn << 8) | ds as u32).to_be_bytes());
        w[11] = self.fm_ce_se;
        w[12..16].copy_from_slice(&self.mkey.to_be_bytes());
        w[16] = self.flags;
        w[20..22].copy_from_slice(&self.xlt_octowords.to_be_bytes());
        w[22..24].copy_from_slice(&self.xlt_offset.to_be_bytes());
        w[24..32].copy_from_slice(&self.mask.to_be_bytes());
        w[64..128].copy_from_slice(&self.seg.bytes());
        w[128..].copy_from_slice(&self.tail);
        w
    }
}

/// `mlx5_mtt` entries for `pages`, present for read and write (`MLX5_IB_MTT_PRESENT`), zero-padded to 64 bytes
/// as Linux pads a translation (`MLX5_UMR_FLEX_ALIGNMENT`).
fn mtt_bytes(pages: &[u64]) -> Vec<u8> {
    let mut b: Vec<u8> = pages.iter().flat_map(|p| (p | 3).to_be_bytes()).collect();
    b.resize(b.len().div_ceil(64) * 64, 0);
    b
}

/// Linux's revoke (`mlx5r_umr_revoke_mr`): mask PD | FREE, INLINE and nothing else, the key made free and moved
/// to `quarantine_pd`.
fn revoke(qpn: u32, index: u16, key: u32, quarantine_pd: u32) -> Umr {
    Umr {
        index,
        qpn,
        fm_ce_se: FM_CE_SE,
        mkey: key,
        flags: INLINE,
        xlt_octowords: 0,
        xlt_offset: 0,
        mask: M_PD | M_FREE,
        seg: MkeySeg { free: true, pd: quarantine_pd, variant: key as u8, ..MkeySeg::default() },
        tail: Vec::new(),
    }
}

#[allow(clippy::too_many_arguments)]
/// A grant: a free key re-pointed at `pages` (inline MTTs) for `[va, va + len)` on `pd`, remote read/write, a
/// new variant, enabled — the mask Linux's `mlx5r_umr_update_mr_pas` uses to enable a cached key, with the
/// key variant.
fn grant(qpn: u32, index: u16, key: u32, pd: u32, va: u64, len: u64, pages: &[u64], variant: u8) -> Umr {
    let tail = mtt_bytes(pages);
    Umr {
        index,
        qpn,
        fm_ce_se: FM_CE_SE,
        mkey: key,
        flags: INLINE | CHECK_NOT_FREE,
        xlt_octowords: (tail.len() / 16) as u16,
        xlt_offset: 0,
        mask: M_LEN | M_PAGE_SIZE | M_START_ADDR | M_PD | M_KEY | M_LR | M_LW | M_RR | M_RW | M_FREE,
        seg: MkeySeg {
            free: false,
            perm: PERM_LOCAL_READ | PERM_LOCAL_WRITE | PERM_REMOTE_READ | PERM_REMOTE_WRITE,
            variant,
            pd,
            start: va,
            len,
            log_page_size: 12,
            ..MkeySeg::default()
        },
        tail,
    }
}

// ---- The rig ---------------------------------------------------------------------------------------------

/// The UMR QP's send queue (one 4 KiB page: 64 WQEBBs) and doorbell record.
const UMR_WQ: u64 = 0x22_0000;
const UMR_DBR: u64 = 0x1f_e000;
const LOG_SQ: u32 = 6;
/// Where the test keys point (two 4 KiB pages, not contiguous) and the lease's virtual address.
const PAGES: [u64; 2] = [0x30_0000, 0x35_0000];
const OTHER_PAGES: [u64; 2] = [0x38_0000, 0x39_1000];
const VA: u64 = 0x7000_0000;
/// The CQ ring `common::create_eq_cq` made (64 entries of 64 bytes).
const CQ_RING: u64 = common::QBUF + 0x1000;

struct Rig {
    d: Drv,
    r: Res,
    qpn: u32,
    /// The UMR PD (Linux's `umrc.pd`): revoked keys move here.
    umr_pd: u32,
    /// Send WQEBBs posted; CQEs read.
    pc: u16,
    ci: u32,
}

/// CREATE_QP for a REG_UMR QP as Linux `create_kernel_qp` builds one: no PD, `latency_sensitive`, a 2^LOG_SQ
/// WQEBB send queue, a zero-length RQ, the send CQ only (Linux still names the receive CQ at creation; the rig
/// leaves it 0, which is allowed too).
fn create_umr_qp_in(r: Res, pd: u32, cqn_rcv: u32) -> Vec<u8> {
    let mut c = cmd(CREATE_QP, 0, 0x110 + 8);
    setf(&mut c, bit::ST, 8, 0xc);
    setf(&mut c, bit::PM_STATE, 2, 3);
    setf(&mut c, bit::PD, 24, pd);
    setf(&mut c, 0xc0 + 0x23, 1, 1); // latency_sensitive
    setf(&mut c, bit::UAR_PAGE, 24, r.uar);
    setf(&mut c, bit::LOG_SQ_SIZE, 4, LOG_SQ);
    setf(&mut c, bit::RQ_TYPE, 3, 3);
    setf(&mut c, bit::CQN_SND, 24, r.cqn);
    setf(&mut c, bit::CQN_RCV, 24, cqn_rcv);
    setf(&mut c, bit::USER_INDEX, 24, 0xff_ffff);
    c[bit::DBR_ADDR_BYTE..bit::DBR_ADDR_BYTE + 8].copy_from_slice(&UMR_DBR.to_be_bytes());
    c[0x110..0x118].copy_from_slice(&UMR_WQ.to_be_bytes());
    c
}

/// The modify inputs Linux's `mlx5r_umr_qp_rst2rts` produces: RST2INIT with port 1 and P_Key index 0, INIT2RTR
/// with mtu 4096 and log_msg_max 12 and no path, RTR2RTS with nothing; each names the UMR PD, `cqn_rcv` left 0.
fn umr_modify_in(opcode: u16, qpn: u32, r: Res, pd: u32) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 0x110);
    setf(&mut c, bit::QPN, 24, qpn);
    setf(&mut c, bit::ST, 8, 0xc);
    setf(&mut c, bit::PM_STATE, 2, 3);
    setf(&mut c, bit::PD, 24, pd);
    setf(&mut c, bit::CQN_SND, 24, r.cqn);
    match opcode {
        RST2INIT => {
            setf(&mut c, bit::VHCA_PORT_NUM, 8, 1);
            setf(&mut c, 0xc0 + 0x5b, 1, 1); // rlky, as Linux sets for kernel QPs at RST2INIT
        }
        INIT2RTR => {
            setf(&mut c, bit::MTU, 3, 5);
            setf(&mut c, 0x103, 5, 12); // log_msg_max
        }
        _ => {}
    }
    c
}

impl Rig {
    fn new() -> Rig {
        Rig::with(ModelConfig::instant())
    }

    fn with(cfg: ModelConfig) -> Rig {
        let mut d = Drv::with(cfg, 64 << 20);
        d.bring_up();
        let r = setup(&mut d);
        let umr_pd = alloc_pd(&mut d);
        let qpn = be32(&d.ok(&create_umr_qp_in(r, 0, 0), 16), 8) & 0xff_ffff;
        for op in [RST2INIT, INIT2RTR, RTR2RTS] {
            d.ok(&umr_modify_in(op, qpn, r, umr_pd), 16);
        }
        assert_eq!(qp_state(&mut d, qpn), 3, "RTS");
        Rig { d, r, qpn, umr_pd, pc: 0, ci: 0 }
    }

    /// Writes `wqe` at the producer counter, updates the send doorbell record, rings the BlueFlame register
    /// (the first 8 bytes of the control segment at UAR + 0x800, as Linux `mlx5r_ring_db`) and polls once.
    fn post(&mut self, wqe: &[u8]) {
        self.post_only(wqe);
        self.ring(wqe);
    }

    fn post_only(&mut self, wqe: &[u8]) {
        for (k, chunk) in wqe.chunks(64).enumerate() {
            let slot = u64::from(self.pc.wrapping_add(k as u16)) % (1 << LOG_SQ);
            self.d.ram.write(UMR_WQ + slot * 64, chunk).unwrap();
        }
        self.pc = self.pc.wrapping_add(wqe.len().div_ceil(64) as u16);
        self.d.ram.write_be32(UMR_DBR + 4, u32::from(self.pc)).unwrap();
    }

    fn ring(&mut self, wqe: &[u8]) {
        let bf = u64::from(self.r.uar) * 4096 + 0x800;
        self.d.bar.write(bf, &wqe[..8]).unwrap();
        self.d.model.poll();
    }

    /// The next CQE (64 bytes), or None when the CQ holds no new one (opcode INVALID or the owner bit of the
    /// previous pass).
    fn cqe(&mut self) -> Option<[u8; 64]> {
        let mut e = [0u8; 64];
        self.d.ram.read(CQ_RING + u64::from(self.ci % 64) * 64, &mut e).ok()?;
        let owner = (self.ci / 64) & 1;
        if e[0x3f] >> 4 == 0xf || u32::from(e[0x3f] & 1) != owner || e == [0u8; 64] && self.ci < 64 {
            return None;
        }
        self.ci += 1;
        Some(e)
    }

    /// The next CQE as (opcode, syndrome, WQE opcode, QPN, wqe_counter).
    fn completion(&mut self) -> (u8, u8, u8, u32, u16) {
        let e = self.cqe().expect("a CQE");
        let sop = be32(&e, 0x38);
        (e[0x3f] >> 4, e[0x37], (sop >> 24) as u8, sop & 0xff_ffff, u16::from_be_bytes([e[0x3c], e[0x3d]]))
    }

    fn next_index(&self) -> u16 {
        self.pc
    }

    fn state(&mut self) -> u32 {
        qp_state(&mut self.d, self.qpn)
    }
}

#[allow(clippy::too_many_arguments)]
/// A key made for UMR: CREATE_MKEY with `umr_en` (and `free` when asked), MTT mode, 4 KiB pages, a table of
/// `octwords × 2` entries of which `pages` are given, for `[va, va + len)`. Returns the whole key (variant 0x5a).
fn umr_mkey(d: &mut Drv, pd: u32, free: bool, umr_en: bool, va: u64, len: u64, pages: &[u64], octwords: u32) -> u32 {
    let mut c = common::create_mkey_in(pd, 1, va, len, pages);
    if free {
        c[0x10] |= 0x40;
    }
    if umr_en {
        c[0x12] |= 0x80;
    }
    put32(&mut c, 0x10 + 0x34, octwords);
    let index = be32(&d.ok(&c, 16), 8) & 0xff_ffff;
    (index << 8) | 0x5a
}

/// QUERY_MKEY's `mkc` (64 bytes).
fn query_mkc(d: &mut Drv, key: u32) -> Vec<u8> {
    let mut c = cmd(0x201, 0, 16);
    put32(&mut c, 8, key >> 8);
    d.ok(&c, 0x130)[0x10..0x50].to_vec()
}

/// An RDMA WRITE of 4 bytes at `va` with `rkey` to a fresh RC QP at RTS on the rig's PD, through the responder over the
/// model's tables: the reply's AETH syndrome (0x1f ACK, 0x62 NAK remote access error).
fn write_through(rig: &mut Rig, rkey: u32, va: u64) -> u8 {
    let pd_qp = rig.r;
    let d = &mut rig.d;
    let q = create_qp(d, pd_qp);
    d.ok(&rst2init_in(q, pd_qp), 16);
    d.ok(&init2rtr_in(q, pd_qp, 0x77, 0x100), 16);
    d.ok(&rtr2rts_in(q, pd_qp, 0x500), 16);
    let req = rocev2::Req {
        opcode: rocev2::OP_WRITE_ONLY,
        qpn: q,
        psn: 0x100,
        ack_req: true,
        reth: Some((va, rkey, 4)),
        payload: b"umr!".to_vec(),
    };
    let mut replies = Vec::new();
    let mut t = dataplane::HcaTables::new(&mut d.model);
    let how = responder::handle_into(&mut t, &rocev2::encode(&req), &mut |f| replies.push(f));
    assert_ne!(how, Disposition::NotForPort);
    assert_eq!(replies.len(), 1, "one reply");
    rocev2::decode(&replies[0]).syndrome.expect("an AETH")
}

// ---- Tests -----------------------------------------------------------------------------------------------

#[test]
fn golden_revoke_bytes() {
    // Laid out by hand from qp.h / device.h: control segment (index 3, opcode 0x25; QPN 0x12 with DS 8; fence
    // INITIATOR_SMALL + CQ_UPDATE; umr_mkey 0x000123a7), UMR control segment (flags INLINE; mask PD | FREE =
    // 0x2000_0080), mkey segment (status free 0x40; qpn 0xffffff and variant 0xa7; PD 0x000009).
    let mut want = [0u8; 128];
    want[..16].copy_from_slice(&[
        0x00, 0x00, 0x03, 0x25, 0x00, 0x00, 0x12, 0x08, 0x00, 0x00, 0x00, 0x28, 0x00, 0x01, 0x23, 0xa7,
    ]);
    want[16] = 0x80;
    want[24..32].copy_from_slice(&[0, 0, 0, 0, 0x20, 0, 0, 0x80]);
    want[64] = 0x40;
    want[68..72].copy_from_slice(&[0xff, 0xff, 0xff, 0xa7]);
    want[76..80].copy_from_slice(&[0, 0, 0, 0x09]);
    assert_eq!(revoke(0x12, 3, 0x0001_23a7, 9).encode(), want.to_vec());
    // The grant: 2 pages inline, padded to 64 bytes (4 octowords), DS 8 + 4.
    let g = grant(0x12, 5, 0x0001_23a7, 4, VA, 0x2000, &PAGES, 0x3c).encode();
    assert_eq!(g.len(), 192);
    assert_eq!(g[7], 12);
    assert_eq!(&g[20..22], &[0, 4]);
    assert_eq!(&g[128..136], &(PAGES[0] | 3).to_be_bytes());
    assert_eq!(&g[144..192], &[0u8; 48][..]);
}

#[test]
fn a_reg_umr_qp_is_created_and_brought_to_rts_as_linux_does() {
    let mut rig = Rig::new();
    let q = query_qp(&mut rig.d, rig.qpn);
    assert_eq!(getf(&q, bit::ST, 8), 0xc);
    assert_eq!(getf(&q, bit::PD, 24), rig.umr_pd, "the PD its first modify named");
    assert_eq!(getf(&q, bit::MTU, 3), 5);
    // A second modify naming another PD is refused: the QP's PD is fixed once named.
    let other = alloc_pd(&mut rig.d);
    let r = rig.d.exec(&umr_modify_in(RTS2RTS, rig.qpn, rig.r, other), 16);
    assert_eq!(r.status(), 3, "BAD_PARAM");
    // Creation rules: a receive queue, no send queue or an unknown PD are refused; the receive CQ may be named.
    let r0 = rig.r;
    let mut c = create_umr_qp_in(r0, 0, 0);
    setf(&mut c, bit::RQ_TYPE, 3, 0);
    assert_eq!(rig.d.exec(&c, 16).status(), 3);
    let mut c = create_umr_qp_in(r0, 0, 0);
    setf(&mut c, 0xc0 + 0x50, 1, 1); // no_sq
    setf(&mut c, bit::LOG_SQ_SIZE, 4, 0);
    assert_eq!(rig.d.exec(&c, 16).status(), 3);
    assert_eq!(rig.d.exec(&create_umr_qp_in(r0, 0x3333, 0), 16).status(), 3, "unknown PD");
    assert_eq!(rig.d.exec(&create_umr_qp_in(r0, 0, r0.cqn), 16).status(), 0, "Linux names its CQ as cqn_rcv");
    // INIT2RTR with an address path is not a UMR QP's.
    let q2 = be32(&rig.d.ok(&create_umr_qp_in(r0, 0, 0), 16), 8) & 0xff_ffff;
    rig.d.ok(&umr_modify_in(RST2INIT, q2, r0, rig.umr_pd), 16);
    let mut c = umr_modify_in(INIT2RTR, q2, r0, rig.umr_pd);
    setf(&mut c, bit::REMOTE_QPN, 24, 0x77);
    assert_eq!(rig.d.exec(&c, 16).status(), 3);
    // The RoCE responder never serves a UMR QP.
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    let req = rocev2::Req {
        opcode: rocev2::OP_WRITE_ONLY,
        qpn: rig.qpn,
        psn: 0,
        ack_req: true,
        reth: Some((VA, key, 4)),
        payload: b"abcd".to_vec(),
    };
    let mut sent = 0;
    let mut t = dataplane::HcaTables::new(&mut rig.d.model);
    responder::handle_into(&mut t, &rocev2::encode(&req), &mut |_| sent += 1);
    assert_eq!(sent, 0, "no reply from a UMR QP");
    let mut a = [0u8; 4];
    rig.d.ram.read(PAGES[0], &mut a).unwrap();
    assert_eq!(a, [0; 4]);
}

#[test]
fn revoke_frees_the_key_at_its_completion_and_the_responder_naks_it() {
    let mut rig = Rig::new();
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    assert_eq!(write_through(&mut rig, key, VA), 0x1f, "ACK before the revoke");
    let (qpn, pd) = (rig.qpn, rig.umr_pd);
    let w = revoke(qpn, rig.next_index(), key, pd).encode();
    rig.post(&w);
    assert_eq!(rig.completion(), (CQE_REQ, 0, OPCODE_UMR, qpn, 0));
    let m = query_mkc(&mut rig.d, key);
    assert_eq!(m[0] & 0x40, 0x40, "free");
    assert_eq!(be32(&m, 0x0c) & 0xff_ffff, pd, "in the UMR PD");
    assert_eq!(be32(&m, 4) & 0xff, 0x5a, "variant unchanged (no KEY in the mask)");
    assert_eq!(write_through(&mut rig, key, VA), 0x62, "NAK remote access error after the revoke");
    assert_eq!(rig.state(), 3, "the UMR QP stays in RTS");
    let c = rig.d.model.hca().umr.counters;
    assert_eq!((c.completed, c.errors), (1, 0));
}

#[test]
fn revoke_applies_only_when_its_firmware_time_has_passed() {
    assert_eq!(mlx5_model::Timing::firmware().umr_latency(), mlx5_model::timing::UMR);
    assert_eq!(mlx5_model::Timing::Zero.umr_latency(), std::time::Duration::ZERO);
    // Commands stay instant (the rig's driver waits for none); the UMR gets a latency long enough to look at
    // the key before its completion.
    let mut rig = Rig::new();
    rig.d.model.hca_mut().umr.latency = std::time::Duration::from_millis(50);
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    let w = revoke(rig.qpn, 0, key, rig.umr_pd).encode();
    rig.post(&w);
    // Rung and seen, not yet complete: the key still grants access and no CQE is there.
    assert!(rig.d.model.next_due().is_some(), "a UMR under way wakes the idle poller");
    assert!(rig.cqe().is_none());
    assert_eq!(query_mkc(&mut rig.d, key)[0] & 0x40, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while rig.d.model.hca().umr.counters.completed == 0 {
        assert!(std::time::Instant::now() < deadline, "the UMR never completed");
        rig.d.model.poll();
    }
    assert_eq!(rig.completion().0, CQE_REQ);
    assert_eq!(query_mkc(&mut rig.d, key)[0] & 0x40, 0x40);
    assert_eq!(mlx5_model::timing::UMR, std::time::Duration::from_micros(1));
}

#[test]
fn grant_repoints_a_free_key_with_a_new_variant_and_inline_mtts() {
    let mut rig = Rig::new();
    // A pool key: free, umr_en, an 8-entry table (translations move in 64-byte units), no translation yet.
    let key = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    let lease_pd = rig.r.pd;
    let w = grant(rig.qpn, 0, key, lease_pd, VA, 0x2000, &OTHER_PAGES, 0xc3).encode();
    rig.post(&w);
    assert_eq!(rig.completion(), (CQE_REQ, 0, OPCODE_UMR, rig.qpn, 0));
    let new_key = (key & !0xff) | 0xc3;
    let m = query_mkc(&mut rig.d, new_key);
    assert_eq!(m[0] & 0x40, 0, "enabled");
    assert_eq!(be32(&m, 4) & 0xff, 0xc3);
    assert_eq!(be32(&m, 0x0c) & 0xff_ffff, lease_pd);
    assert_eq!(u64::from_be_bytes(m[0x10..0x18].try_into().unwrap()), VA);
    assert_eq!(u64::from_be_bytes(m[0x18..0x20].try_into().unwrap()), 0x2000);
    // The new rkey writes into the new pages; the old variant is refused.
    assert_eq!(write_through(&mut rig, new_key, VA + 0x1000), 0x1f);
    let mut a = [0u8; 4];
    rig.d.ram.read(OTHER_PAGES[1], &mut a).unwrap();
    assert_eq!(&a, b"umr!");
    assert_eq!(write_through(&mut rig, key, VA), 0x62, "the old variant names nothing");
    // Revoke it, re-point it again through a translation offset (entries 2..4 of the table), then a data
    // pointer under the reserved lkey: all three complete.
    let w = revoke(rig.qpn, rig.next_index(), new_key, rig.umr_pd).encode();
    rig.post(&w);
    assert_eq!(rig.completion().0, CQE_REQ);
    let mut g = grant(rig.qpn, rig.next_index(), new_key, lease_pd, VA, 0x1000, &PAGES[..1], 0xc4);
    g.mask &= !M_START_ADDR;
    rig.post(&g.encode());
    assert_eq!(rig.completion().0, CQE_REQ);
    let k2 = (key & !0xff) | 0xc4;
    let w = revoke(rig.qpn, rig.next_index(), k2, rig.umr_pd).encode();
    rig.post(&w);
    assert_eq!(rig.completion().0, CQE_REQ);
    let xlt = 0x3f_0000u64;
    rig.d.ram.write(xlt, &mtt_bytes(&PAGES)).unwrap();
    let mut g = grant(rig.qpn, rig.next_index(), k2, lease_pd, VA, 0x2000, &[], 0xc5);
    g.flags = CHECK_NOT_FREE;
    g.xlt_octowords = 4;
    let mut dseg = Vec::new();
    dseg.extend_from_slice(&64u32.to_be_bytes());
    dseg.extend_from_slice(&1u32.to_be_bytes()); // the reserved lkey (QUERY_SPECIAL_CONTEXTS resd_lkey)
    dseg.extend_from_slice(&xlt.to_be_bytes());
    g.tail = dseg;
    rig.post(&g.encode());
    assert_eq!(rig.completion().0, CQE_REQ, "data pointer through the reserved lkey");
    let k3 = (key & !0xff) | 0xc5;
    assert_eq!(write_through(&mut rig, k3, VA), 0x1f);
    rig.d.ram.read(PAGES[0], &mut a).unwrap();
    assert_eq!(&a, b"umr!");
    // A translation offset of 4 octowords starts at entry 8, past the key's 8-entry table: out of bounds.
    let mut g = grant(rig.qpn, rig.next_index(), k3, lease_pd, VA, 0x2000, &OTHER_PAGES, 0xc6);
    g.flags = INLINE | TRANSLATION_OFFSET_EN;
    g.xlt_offset = 4;
    g.mask = M_LEN;
    rig.post(&g.encode());
    assert_eq!(rig.completion().1, LOCAL_LENGTH_ERR, "offset beyond the key's table");
}

/// Posts `w` on a fresh rig's UMR QP against `key` and expects an error CQE with `synd`, the QP in ERR, the key
/// untouched, and the WQE posted after it flushed.
fn expect_error(rig: &mut Rig, w: Umr, key: u32, synd: u8) {
    let before = query_mkc(&mut rig.d, key);
    let bytes = w.encode();
    rig.post_only(&bytes);
    // A second WQE behind it (a NOP-like revoke of the same key): flushed, never applied.
    let follow = revoke(rig.qpn, rig.next_index(), key, rig.umr_pd).encode();
    rig.post_only(&follow);
    rig.ring(&bytes);
    let (op, s, wop, q, counter) = rig.completion();
    assert_eq!((op, s, wop, q, counter), (CQE_REQ_ERR, synd, OPCODE_UMR, rig.qpn, w.index), "error CQE");
    let (op, s, _, _, counter) = rig.completion();
    assert_eq!((op, s), (CQE_REQ_ERR, WR_FLUSH_ERR), "the next WQE is flushed");
    assert_eq!(counter, w.index + bytes.len().div_ceil(64) as u16);
    assert!(rig.cqe().is_none());
    assert_eq!(rig.state(), 6, "the UMR QP is in ERR");
    assert_eq!(query_mkc(&mut rig.d, key), before, "nothing applied");
    // Recovery as Linux does it: 2RST, back to RTS, and the queue starts again at 0.
    rig.d.ok(&short_in(QP_2RST, rig.qpn), 16);
    for op in [RST2INIT, INIT2RTR, RTR2RTS] {
        let (qpn, r, pd) = (rig.qpn, rig.r, rig.umr_pd);
        rig.d.ok(&umr_modify_in(op, qpn, r, pd), 16);
    }
    rig.pc = 0;
    rig.d.ram.write_be32(UMR_DBR + 4, 0).unwrap();
}

#[test]
fn a_bad_mask_completes_in_error_and_flushes_the_rest() {
    let mut rig = Rig::new();
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    // Remote invalidation is not modelled: refused, not ignored.
    let mut w = revoke(rig.qpn, 0, key, rig.umr_pd);
    w.mask |= M_EN_RINVAL;
    expect_error(&mut rig, w, key, LOCAL_QP_OP_ERR);
    // Both check flags at once: reserved.
    let mut w = revoke(rig.qpn, 0, key, rig.umr_pd);
    w.flags |= CHECK_FREE | CHECK_NOT_FREE;
    expect_error(&mut rig, w, key, LOCAL_QP_OP_ERR);
    // After recovery the queue works again.
    let w = revoke(rig.qpn, 0, key, rig.umr_pd).encode();
    rig.post(&w);
    assert_eq!(rig.completion().0, CQE_REQ);
    assert_eq!(write_through(&mut rig, key, VA), 0x62);
}

#[test]
fn the_free_flags_and_umr_en_are_checked() {
    let mut rig = Rig::new();
    let plain = umr_mkey(&mut rig.d, rig.r.pd, false, false, VA, 0x2000, &PAGES, 4);
    let w = revoke(rig.qpn, 0, plain, rig.umr_pd);
    expect_error(&mut rig, w, plain, LOCAL_PROT_ERR);
    assert_eq!(write_through(&mut rig, plain, VA), 0x1f, "a key without umr_en keeps its access");
    // CHECK_NOT_FREE (fail unless free) on a key in use; CHECK_FREE (fail if free) on a free key.
    let used = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    let w = grant(rig.qpn, 0, used, rig.r.pd, VA, 0x2000, &OTHER_PAGES, 0x11);
    expect_error(&mut rig, w, used, LOCAL_PROT_ERR);
    let free = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    let mut w = revoke(rig.qpn, 0, free, rig.umr_pd);
    w.flags |= CHECK_FREE;
    expect_error(&mut rig, w, free, LOCAL_PROT_ERR);
    // A stale variant names no key.
    let w = revoke(rig.qpn, 0, (used & !0xff) | 0x01, rig.umr_pd);
    expect_error(&mut rig, w, used, LOCAL_PROT_ERR);
}

#[test]
fn translation_bounds_alignment_and_ram_are_checked() {
    let mut rig = Rig::new();
    let free = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    let pd = rig.r.pd;
    // Out of bounds: 16 entries into an 8-entry table.
    let pages: Vec<u64> = (0..16).map(|i| 0x30_0000 + 0x1000 * i).collect();
    let w = grant(rig.qpn, 0, free, pd, VA, 0x8000, &pages, 0x10);
    expect_error(&mut rig, w, free, LOCAL_LENGTH_ERR);
    // The range needs more pages than the table holds (9 pages of an 8-entry table).
    let w = grant(rig.qpn, 0, free, pd, VA, 0x9000, &PAGES, 0x10);
    expect_error(&mut rig, w, free, LOCAL_LENGTH_ERR);
    // A page not aligned to the page size.
    let w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &[PAGES[0] + 0x800, PAGES[1]], 0x10);
    expect_error(&mut rig, w, free, LOCAL_PROT_ERR);
    // 2 MiB pages: a 4 KiB-aligned page is misaligned.
    let mut w = grant(rig.qpn, 0, free, pd, VA, 0x20_0000, &[0x20_1000], 0x10);
    w.seg.log_page_size = 21;
    expect_error(&mut rig, w, free, LOCAL_PROT_ERR);
    // A page past the end of RAM (64 MiB).
    let w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &[PAGES[0], 64 << 20], 0x10);
    expect_error(&mut rig, w, free, LOCAL_PROT_ERR);
    // A translation length that is not a multiple of 64 bytes.
    let mut w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &PAGES, 0x10);
    w.xlt_octowords = 2;
    w.tail.truncate(32);
    expect_error(&mut rig, w, free, LOCAL_QP_OP_ERR);
    // A DS count that disagrees with the inline translation.
    let mut w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &PAGES, 0x10);
    w.xlt_octowords = 8;
    expect_error(&mut rig, w, free, LOCAL_LENGTH_ERR);
    // The key is still free and grants nothing.
    assert_eq!(query_mkc(&mut rig.d, free)[0] & 0x40, 0x40);
}

#[test]
fn entity_size_disabled_refuses_a_page_size_change_and_takes_the_same_grant_without_it() {
    let cfg = ModelConfig { umr_entity_size_disabled: true, ..ModelConfig::instant() };
    let mut rig = Rig::with(cfg);
    let caps = rig.d.ok(&cmd(0x100, 1, 16), 0x1010);
    assert_eq!(getf(&caps[0x10..], 0x207, 1), 1, "umr_modify_entity_size_disabled reported");
    let free = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    let pd = rig.r.pd;
    let w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &PAGES, 0x21);
    assert_ne!(w.mask & M_PAGE_SIZE, 0);
    expect_error(&mut rig, w, free, LOCAL_QP_OP_ERR);
    // Without PAGE_SIZE in the mask (the key keeps the 4 KiB pages it was created with): completes.
    let mut w = grant(rig.qpn, 0, free, pd, VA, 0x2000, &PAGES, 0x21);
    w.mask &= !M_PAGE_SIZE;
    rig.post(&w.encode());
    assert_eq!(rig.completion().0, CQE_REQ);
    assert_eq!(write_through(&mut rig, (free & !0xff) | 0x21, VA), 0x1f);
    // The default profile reports 0 and takes the first form.
    let mut rig = Rig::new();
    let free = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    let w = grant(rig.qpn, 0, free, rig.r.pd, VA, 0x2000, &PAGES, 0x21).encode();
    rig.post(&w);
    assert_eq!(rig.completion().0, CQE_REQ);
}

#[test]
fn a_doorbell_before_rts_runs_nothing_and_2err_flushes() {
    let mut d = Drv::new();
    d.bring_up();
    let r = setup(&mut d);
    let pd = alloc_pd(&mut d);
    let qpn = be32(&d.ok(&create_umr_qp_in(r, 0, 0), 16), 8) & 0xff_ffff;
    d.ok(&umr_modify_in(RST2INIT, qpn, r, pd), 16);
    let mut rig = Rig { d, r, qpn, umr_pd: pd, pc: 0, ci: 0 };
    let key = umr_mkey(&mut rig.d, r.pd, false, true, VA, 0x2000, &PAGES, 4);
    let w = revoke(qpn, 0, key, pd).encode();
    rig.post(&w);
    assert!(rig.cqe().is_none(), "INIT: nothing runs");
    assert_eq!(rig.d.model.hca().umr.counters.doorbells_not_ready, 1);
    assert_eq!(query_mkc(&mut rig.d, key)[0] & 0x40, 0);
    // 2ERR flushes what was posted.
    rig.d.ok(&short_in(QP_2ERR, qpn), 16);
    let (op, s, wop, q, counter) = rig.completion();
    assert_eq!((op, s, wop, q, counter), (CQE_REQ_ERR, WR_FLUSH_ERR, OPCODE_UMR, qpn, 0));
    assert_eq!(query_mkc(&mut rig.d, key)[0] & 0x40, 0, "flushed, not applied");
}

#[test]
fn every_executed_wqe_is_in_the_trace_with_its_bytes() {
    let dir = std::env::temp_dir().join(format!("mlx5-umr-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let cfg = ModelConfig { trace: Some(path.clone()), ..ModelConfig::instant() };
    let mut rig = Rig::with(cfg);
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    let ok = revoke(rig.qpn, 0, key, rig.umr_pd).encode();
    rig.post(&ok);
    assert_eq!(rig.completion().0, CQE_REQ);
    let mut bad = revoke(rig.qpn, rig.next_index(), key, rig.umr_pd);
    bad.mask |= M_EN_RINVAL;
    let bad = bad.encode();
    rig.post(&bad);
    assert_eq!(rig.completion().1, LOCAL_QP_OP_ERR);
    let text = std::fs::read_to_string(&path).unwrap();
    let umr: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("umr").is_some())
        .collect();
    assert_eq!(umr.len(), 2);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(umr[0]["wqe"], hex(&ok));
    assert_eq!(umr[0]["umr"]["status"], 0);
    assert_eq!(umr[0]["umr"]["qpn"], format!("{:#x}", rig.qpn));
    assert_eq!(umr[1]["wqe"], hex(&bad));
    assert_eq!(umr[1]["umr"]["status"], u64::from(LOCAL_QP_OP_ERR));
    assert_eq!(umr[1]["umr"]["wqe_counter"], 2);
    // Command lines are still there, and no UMR line carries an "opcode".
    assert!(text.lines().any(|l| l.contains("\"opcode\":\"0x500\"")));
    assert!(umr.iter().all(|v| v.get("opcode").is_none()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn injected_umr_faults_fail_hang_and_clear() {
    let mut rig = Rig::new();
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    // `umr fail 1 4`: the next (well-formed) revoke completes with LOCAL_PROT_ERR, unapplied.
    rig.d.model.inject(Fault::UmrFail { count: 1, syndrome: LOCAL_PROT_ERR });
    let w = revoke(rig.qpn, 0, key, rig.umr_pd);
    expect_error(&mut rig, w, key, LOCAL_PROT_ERR);
    assert_eq!(write_through(&mut rig, key, VA), 0x1f, "the failed revoke left the key usable");
    // The rule was for one WQE: the same revoke now completes.
    let ok = revoke(rig.qpn, 0, key, rig.umr_pd).encode();
    rig.post(&ok);
    assert_eq!(rig.completion().0, CQE_REQ);
    // `umr hang`: a grant posted and rung never completes, nothing applied, until `clear`.
    let free = umr_mkey(&mut rig.d, rig.umr_pd, true, true, 0, 0, &[], 4);
    rig.d.model.inject(Fault::UmrHang);
    let g = grant(rig.qpn, rig.next_index(), free, rig.r.pd, VA, 0x2000, &PAGES, 0x44).encode();
    rig.post(&g);
    for _ in 0..100 {
        rig.d.model.poll();
    }
    assert!(rig.cqe().is_none(), "no completion under a UMR hang");
    assert_eq!(query_mkc(&mut rig.d, free)[0] & 0x40, 0x40, "still free");
    rig.d.model.inject(Fault::Clear);
    rig.d.model.poll();
    assert_eq!(rig.completion().0, CQE_REQ, "runs once the hang is cleared");
    assert_eq!(write_through(&mut rig, (free & !0xff) | 0x44, VA), 0x1f);
}

#[test]
fn a_firmware_in_internal_error_runs_no_umr() {
    let mut rig = Rig::new();
    let key = umr_mkey(&mut rig.d, rig.r.pd, false, true, VA, 0x2000, &PAGES, 4);
    rig.d.model.inject(Fault::HealthFatal { synd: 0x7, rfr: false });
    let w = revoke(rig.qpn, 0, key, rig.umr_pd).encode();
    rig.post(&w);
    for _ in 0..100 {
        rig.d.model.poll();
    }
    assert!(rig.cqe().is_none(), "no completion after a fatal syndrome");
    assert_eq!(rig.d.model.hca().umr.counters.completed, 0);
    let m = rig.d.model.mkey(key).expect("the key is still there");
    assert!(!m.free, "nothing applied");
}
