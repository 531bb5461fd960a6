//! The send side: UAR doorbells → send WQEs → frames on the wire and send CQEs.
//!
//! A driver posts WQEs in the SQ ring (64-byte WQEBBs), writes the new producer counter (16 bits, WQEBBs) into
//! dword 1 of the SQ's doorbell record, and writes the first 8 bytes of the last WQE's control segment to a
//! BlueFlame register of the SQ's UAR page (`MLX5_BF_OFFSET` 0x800; Linux alternates between the two halves of
//! a 512-byte `bfreg`, so the model looks at 0x800, 0x900, … 0xf00). Shared memory has no write trigger, so
//! each poll reads those 8 qwords of every UAR page an SQ uses; a non-idle one counts as a doorbell for every
//! SQ on that page (a second write before the poll would have replaced the first). The model then executes
//! the SQ's WQEs from its consumer counter up to the doorbell record's counter.
//!
//! A WQE (`qp.h`): control segment (`opmod_idx_opcode`, `qpn_ds` = SQN << 8 | DS count, `fm_ce_se`), Ethernet
//! segment (`mlx5_wqe_eth_seg`: `cs_flags`, `mss`, `inline_hdr.sz`, the first 2 inline bytes), the rest of the
//! inline headers padded to 16 bytes, then data segments (`byte_count`, `lkey`, `addr`).

use crate::completion::write_cqe;
use crate::cq::cqe;
use crate::eth::frame::{self, ETH_HLEN, ETH_ZLEN};
use crate::eth::{DataSeg, Sq, WqState, translate_segment};
use crate::hca::Hca;
use crate::mem::Memory;

/// First BlueFlame register of a UAR page, and how many 256-byte buffers follow it (4 bfregs × 2 halves).
pub const BF_OFFSET: u64 = 0x800;
pub const BF_BUFFERS: u64 = 8;
pub const BF_STRIDE: u64 = 0x100;
/// Written into the `qpn_ds` dword after reading a doorbell (SQN 0xffffff is never allocated).
pub const DOORBELL_IDLE: u32 = 0xffff_ffff;
/// One WQEBB.
pub const WQEBB: usize = 64;
/// `MLX5_OPCODE_NOP`, `MLX5_OPCODE_SEND` (`qp.h`).
pub const OPCODE_NOP: u8 = 0x00;
pub const OPCODE_SEND: u8 = 0x0a;
/// `fm_ce_se` CQ update bits 3:2 (`MLX5_WQE_CTRL_CQ_UPDATE` = 2 << 2): 2 or 3 = a CQE for this WQE.
pub const CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `mlx5_wqe_eth_seg.cs_flags` (`qp.h`).
pub const ETH_WQE_L3_INNER_CSUM: u8 = 1 << 4;
pub const ETH_WQE_L4_INNER_CSUM: u8 = 1 << 5;
pub const ETH_WQE_L3_CSUM: u8 = 1 << 6;
pub const ETH_WQE_L4_CSUM: u8 = 1 << 7;
/// `MLX5_ETH_WQE_INSERT_VLAN`: `inline_hdr.sz` with this bit is a VLAN insert request.
pub const ETH_WQE_INSERT_VLAN: u16 = 0x8000;
/// `MLX5_INLINE_SEG`: a data segment carrying inline data.
pub const INLINE_SEG: u32 = 0x8000_0000;

/// CQE opcodes and error syndromes (`cq.h`, `MLX5_CQE_*`, `MLX5_CQE_SYNDROME_*`).
pub mod cqe_op {
    pub const REQ: u8 = 0x0;
    pub const RESP_SEND: u8 = 0x2;
    pub const REQ_ERR: u8 = 0xd;
    pub const RESP_ERR: u8 = 0xe;
}
pub mod syndrome {
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    pub const WR_FLUSH_ERR: u8 = 0x05;
}

/// A 64-byte CQE body (`mlx5_cqe64` / `mlx5_err_cqe`): opcode, `byte_cnt`, the WQE opcode and queue number in
/// `sop_drop_qpn`, `wqe_counter`, and for errors the syndrome.
pub fn cqe_body(op: u8, synd: u8, wqe_opcode: u8, qn: u32, counter: u16, byte_cnt: u32) -> [u8; cqe::SIZE] {
    let mut e = [0u8; cqe::SIZE];
    e[0x2c..0x30].copy_from_slice(&byte_cnt.to_be_bytes());
    if synd != 0 {
        e[cqe::SYNDROME] = synd;
    }
    e[cqe::QPN..cqe::QPN + 4].copy_from_slice(&((u32::from(wqe_opcode) << 24) | (qn & 0xff_ffff)).to_be_bytes());
    e[cqe::WQE_COUNTER..cqe::WQE_COUNTER + 2].copy_from_slice(&counter.to_be_bytes());
    e[cqe::OP_OWN] = op << 4;
    e
}

/// Reads the BlueFlame registers of every UAR page an SQ uses and runs the SQs of each page that was rung.
/// Returns true when a doorbell was seen.
///
/// REG_UMR QPs ring the same registers with their `qpn_ds` (Linux `mlx5r_ring_db`), so their pages are read
/// here too and a rung page also marks each UMR QP on it for `crate::umr` to run.
pub fn poll_doorbells(hca: &mut Hca, bar: &dyn Memory, ram: &dyn Memory) -> bool {
    let umr = crate::umr::doorbell_pages(hca);
    let mut pages: Vec<u32> = hca.eth.sqs.values().map(|s| s.wq.uar_page).chain(umr.iter().map(|u| u.1)).collect();
    pages.sort_unstable();
    pages.dedup();
    let mut rung = false;
    for page in pages {
        let mut hit = false;
        for k in 0..BF_BUFFERS {
            let at = u64::from(page) * 4096 + BF_OFFSET + k * BF_STRIDE;
            let Ok(qpn_ds) = bar.read_be32(at + 4) else { continue };
            // An untouched page reads 0; SQN 0 is never allocated.
            if qpn_ds == DOORBELL_IDLE || qpn_ds == 0 {
                continue;
            }
            let _ = bar.write_be32(at + 4, DOORBELL_IDLE);
            hca.eth.counters.sq_doorbells += 1;
            let n = qpn_ds >> 8;
            if hca.eth.sqs.get(&n).is_none_or(|s| s.wq.uar_page != page) && !umr.contains(&(n, page)) {
                hca.eth.counters.sq_doorbells_unknown += 1;
            }
            hit = true;
        }
        if hit {
            rung = true;
            let sqns: Vec<u32> = hca.eth.sqs.values().filter(|s| s.wq.uar_page == page).map(|s| s.sqn).collect();
            for sqn in sqns {
                run_sq(hca, ram, sqn);
            }
            for &(qpn, _) in umr.iter().filter(|u| u.1 == page) {
                crate::umr::doorbell(hca, qpn);
            }
        }
    }
    rung
}

/// Executes what the driver posted on `sqn` (up to the doorbell record's counter). RST: nothing runs (counted);
/// ERR: posted WQEs are flushed with WR_FLUSH_ERR CQEs when the SQ has `flush_in_error_en`.
pub fn run_sq(hca: &mut Hca, ram: &dyn Memory, sqn: u32) {
    let Some(sq) = hca.eth.sqs.get(&sqn).cloned() else { return };
    let Some(pc) = sq.wq.doorbell(ram, 1) else { return };
    match sq.state {
        // Counted only when something is posted (another SQ on the same UAR page may have been rung).
        WqState::Rst if pc != sq.cc => hca.eth.counters.sq_doorbells_not_ready += 1,
        WqState::Rst => {}
        WqState::Err => flush(hca, ram, sqn),
        WqState::Rdy => {
            let mut cc = sq.cc;
            // At most one ring of WQEBBs can be outstanding; a counter further ahead is a driver bug.
            let mut budget = sq.wq.entries();
            while cc != pc && budget > 0 {
                let outstanding = u32::from(pc.wrapping_sub(cc));
                let Some((wqe, n)) = read_wqe(&sq, ram, cc, outstanding) else {
                    // The WQE cannot be read (DS count 0, or it runs past what was posted): a local QP operation
                    // error on that WQE, which takes what is left of the posted WQEBBs.
                    let n = read_ds(&sq, ram, cc).map_or(1, wqebbs).min(outstanding as u16).max(1);
                    fail(hca, ram, &sq, cc, n, 0, syndrome::LOCAL_QP_OP_ERR);
                    return;
                };
                let opcode = wqe[3];
                match execute(hca, ram, &sq, &wqe) {
                    Ok(frame) => {
                        if let Some(f) = frame {
                            transmit(hca, f);
                        }
                        if wqe[11] & CTRL_CQ_UPDATE != 0 {
                            let body = cqe_body(cqe_op::REQ, 0, opcode, sqn, cc, 0);
                            write_cqe(hca, ram, sq.cqn, &body);
                        }
                    }
                    Err(synd) => {
                        fail(hca, ram, &sq, cc, n, opcode, synd);
                        return;
                    }
                }
                cc = cc.wrapping_add(n);
                budget = budget.saturating_sub(u32::from(n));
                if let Some(s) = hca.eth.sqs.get_mut(&sqn) {
                    s.cc = cc;
                }
            }
        }
    }
}

/// A WQE failed: an error CQE (always written, signalled or not), the SQ to ERR, the WQE consumed, and the rest
/// flushed when `flush_in_error_en`.
fn fail(hca: &mut Hca, ram: &dyn Memory, sq: &Sq, cc: u16, n: u16, opcode: u8, synd: u8) {
    hca.eth.counters.tx_errors += 1;
    if let Some(s) = hca.eth.sqs.get_mut(&sq.sqn) {
        s.state = WqState::Err;
        s.cc = cc.wrapping_add(n);
    }
    let body = cqe_body(cqe_op::REQ_ERR, synd, opcode, sq.sqn, cc, 0);
    write_cqe(hca, ram, sq.cqn, &body);
    flush(hca, ram, sq.sqn);
}

/// Completes every posted WQE of an SQ in ERR with a flush error CQE (if `flush_in_error_en`).
pub fn flush(hca: &mut Hca, ram: &dyn Memory, sqn: u32) {
    let Some(sq) = hca.eth.sqs.get(&sqn).cloned() else { return };
    if sq.state != WqState::Err || !sq.flush_in_error {
        return;
    }
    let Some(pc) = sq.wq.doorbell(ram, 1) else { return };
    let mut cc = sq.cc;
    let mut budget = sq.wq.entries();
    while cc != pc && budget > 0 {
        let n = read_ds(&sq, ram, cc).map_or(1, wqebbs).min(pc.wrapping_sub(cc).max(1));
        let opcode = sq.wq.entry_addr(cc.into()).and_then(|a| ram.read_be32(a).ok()).map_or(0, |v| v as u8);
        let body = cqe_body(cqe_op::REQ_ERR, syndrome::WR_FLUSH_ERR, opcode, sqn, cc, 0);
        if write_cqe(hca, ram, sq.cqn, &body) != crate::cq::CqeWrite::Written {
            break;
        }
        cc = cc.wrapping_add(n);
        budget = budget.saturating_sub(u32::from(n));
    }
    if let Some(s) = hca.eth.sqs.get_mut(&sqn) {
        s.cc = cc;
    }
}

fn wqebbs(ds: u8) -> u16 {
    (u16::from(ds) * 16).div_ceil(WQEBB as u16).max(1)
}

/// The DS count of the WQE at `cc` (`qpn_ds` bits 5:0).
fn read_ds(sq: &Sq, ram: &dyn Memory, cc: u16) -> Option<u8> {
    let a = sq.wq.entry_addr(cc.into())?;
    ram.read_be32(a + 4).ok().map(|v| (v & 0x3f) as u8)
}

/// The WQE at `cc` (all its WQEBBs, following the ring) and its size in WQEBBs; `None` when its DS count is 0
/// or it is longer than what was posted.
fn read_wqe(sq: &Sq, ram: &dyn Memory, cc: u16, outstanding: u32) -> Option<(Vec<u8>, u16)> {
    let ds = read_ds(sq, ram, cc)?;
    if ds == 0 {
        return None;
    }
    let n = wqebbs(ds);
    if u32::from(n) > outstanding {
        return None;
    }
    let mut wqe = vec![0u8; usize::from(n) * WQEBB];
    for (k, chunk) in wqe.chunks_mut(WQEBB).enumerate() {
        let a = sq.wq.entry_addr(u32::from(cc.wrapping_add(k as u16)))?;
        ram.read(a, chunk).ok()?;
    }
    wqe.truncate(usize::from(ds) * 16);
    Some((wqe, n))
}

/// Executes one WQE: `Ok(Some(frame))` for a SEND, `Ok(None)` for a NOP, `Err(syndrome)` when it is refused.
fn execute(hca: &Hca, ram: &dyn Memory, sq: &Sq, wqe: &[u8]) -> Result<Option<Vec<u8>>, u8> {
    let opmod = wqe[0];
    let opcode = wqe[3];
    let qpn = u32::from_be_bytes([0, wqe[4], wqe[5], wqe[6]]);
    if qpn != sq.sqn || opmod != 0 {
        return Err(syndrome::LOCAL_QP_OP_ERR);
    }
    match opcode {
        OPCODE_NOP => return Ok(None),
        OPCODE_SEND => {}
        _ => return Err(syndrome::LOCAL_QP_OP_ERR),
    }
    // Control + Ethernet segment at least.
    if wqe.len() < 32 {
        return Err(syndrome::LOCAL_QP_OP_ERR);
    }
    let eseg = &wqe[16..32];
    let cs_flags = eseg[4];
    let mss = u16::from_be_bytes([eseg[6], eseg[7]]);
    let sz = u16::from_be_bytes([eseg[12], eseg[13]]);
    // Software parser offsets, LSO, VLAN insertion (not in the reported caps) and inner checksums are refused.
    if eseg[..4] != [0; 4]
        || eseg[5] != 0
        || mss != 0
        || sz & ETH_WQE_INSERT_VLAN != 0
        || cs_flags & !(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM) != 0
    {
        return Err(syndrome::LOCAL_QP_OP_ERR);
    }
    let sz = usize::from(sz);
    let mut f = Vec::with_capacity(1600);
    let mut data_at = 32;
    if sz > 0 {
        let rest = sz.saturating_sub(2);
        data_at = 32 + rest.div_ceil(16) * 16;
        if data_at > wqe.len() {
            return Err(syndrome::LOCAL_QP_OP_ERR);
        }
        f.extend_from_slice(&eseg[14..14 + sz.min(2)]);
        f.extend_from_slice(&wqe[32..32 + rest]);
    }
    for seg in wqe[data_at..].chunks_exact(16).filter_map(DataSeg::parse) {
        if seg.byte_count & INLINE_SEG != 0 {
            return Err(syndrome::LOCAL_QP_OP_ERR);
        }
        if f.len() as u64 + u64::from(seg.byte_count) > u64::from(hca.port.max_mtu) {
            return Err(syndrome::LOCAL_LENGTH_ERR);
        }
        let pieces = translate_segment(hca, ram, sq.rlky, sq.wq.pd, &seg, false, seg.byte_count.into())
            .ok_or(syndrome::LOCAL_PROT_ERR)?;
        for (a, l) in pieces {
            let at = f.len();
            f.resize(at + l as usize, 0);
            ram.read(a, &mut f[at..]).map_err(|_| syndrome::LOCAL_PROT_ERR)?;
        }
    }
    if f.len() < ETH_HLEN || f.len() > usize::from(hca.port.oper_mtu).saturating_sub(4) {
        return Err(syndrome::LOCAL_LENGTH_ERR);
    }
    if sz < frame::required_inline(&f, effective_inline_mode(hca, sq)) {
        return Err(syndrome::LOCAL_QP_OP_ERR);
    }
    if cs_flags != 0 {
        frame::offload_checksums(&mut f, cs_flags & ETH_WQE_L3_CSUM != 0, cs_flags & ETH_WQE_L4_CSUM != 0);
    }
    // The MAC pads short frames to the minimum.
    if f.len() < ETH_ZLEN {
        f.resize(ETH_ZLEN, 0);
    }
    Ok(Some(f))
}

/// The inline mode a WQE must meet: the SQ's own `min_wqe_inline_mode`, raised to what the port requires —
/// the vport context's `min_wqe_inline_mode` when the Ethernet caps say `wqe_inline_mode` = VPORT_CONTEXT (1),
/// L2 when they say L2 (0), nothing when NOT_REQUIRED (2).
pub fn effective_inline_mode(hca: &Hca, sq: &Sq) -> u8 {
    let port = match hca.eth_inline_cap() {
        0 => frame::inline_mode::L2,
        1 => hca.port.min_wqe_inline_mode,
        _ => frame::inline_mode::NONE,
    };
    sq.min_inline_mode.max(port)
}

/// Puts a frame on the wire (the outbox the wire drains), or discards it while the link is down.
fn transmit(hca: &mut Hca, f: Vec<u8>) {
    let c = &mut hca.eth.counters;
    if hca.port.oper_status != crate::port::PORT_UP {
        c.tx_link_down += 1;
        return;
    }
    c.tx_frames += 1;
    c.tx_bytes += f.len() as u64;
    hca.eth.push_tx(f);
}
