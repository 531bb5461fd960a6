//! UMR (user-mode memory registration): the send queue of a REG_UMR QP (`qpc.st` 0xc, `qp.h`
//! `MLX5_QP_ST_REG_UMR`) and the work requests it runs, each of which changes one memory key in place —
//! revoke (free, quarantine PD), enable, re-point (translation, range, page size, access, PD, key variant) —
//! without a command. Layouts: `include/linux/mlx5/qp.h` (`mlx5_wqe_ctrl_seg`, `mlx5_wqe_umr_ctrl_seg`,
//! `mlx5_wqe_data_seg`, `MLX5_SEND_WQE_BB`), `device.h` (`mlx5_mkey_seg`, `MLX5_MKEY_MASK_*`, `MLX5_UMR_*`,
//! `MLX5_OPCODE_UMR`), `mlx5_ifc.h` (`mkc`, which the mkey segment is, and the `cmd_hca_cap` UMR bits). How Linux
//! builds them: `drivers/infiniband/hw/mlx5/umr.c`. Every rule, its source and the ambiguities resolved:
//! docs/hca-model.md, "UMR".
//!
//! A WQE is checked whole before anything changes; a good one is applied when it completes (its CQE is written
//! in the same step, after its firmware time: `crate::timing::Timing::umr_latency`), so the responder sees the
//! key as it was until the completion and as the WQE made it from then on. A bad one completes in error, the
//! QP goes to ERR, and every WQE posted after it is flushed.
//!
//! This decoder is the model's own. The driver's WQE builders are what it checks, so it shares no code with
//! them (docs/architecture.md, STYLE "Oracles stay independent").

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::caps::cmd_hca_cap;
use crate::cmd::mkey::{QPN_UNBOUND, mkc};
use crate::cq::cqe;
use crate::eth::DataSeg;
use crate::eth::tx::{cqe_body, cqe_op, syndrome};
use crate::hca::Hca;
use crate::ifc;
use crate::mem::Memory;
use crate::mkey::{AccessMode, MkeyInfo, Mtt};
use crate::pages::PAGE_SIZE;
use crate::qp::{Qp, qpc};
use crate::roce::responder::QpState;

/// `MLX5_OPCODE_UMR` (`device.h`).
pub const OPCODE_UMR: u8 = 0x25;
/// A send WQE basic block (`MLX5_SEND_WQE_BB`).
pub const WQEBB: usize = 64;
/// Byte offsets in a UMR WQE: control segment, UMR control segment, mkey segment, then the translation
/// (inline entries, or one data segment pointing at them).
pub const UMR_CTRL: usize = 16;
pub const MKEY_SEG: usize = 64;
pub const XLT: usize = 128;
/// DS count (16-byte units) of a WQE without translation: control 1 + UMR control 3 + mkey segment 4.
pub const BASE_DS: u8 = 8;

/// `mlx5_wqe_umr_ctrl_seg.flags` (`device.h` `MLX5_UMR_*`).
pub mod flags {
    /// `xlt_offset` (and `xlt_offset_47_16`) say where in the key's table the entries go.
    pub const TRANSLATION_OFFSET_EN: u8 = 1 << 4;
    /// Fail unless the key is free (Linux sets it to enable a key: "fail if not free").
    pub const CHECK_NOT_FREE: u8 = 1 << 5;
    /// Fail if the key is free (Linux sets it to change a key in use: "fail if free").
    pub const CHECK_FREE: u8 = 2 << 5;
    pub const CHECK_MASK: u8 = 3 << 5;
    /// The translation entries follow the mkey segment in the WQE.
    pub const INLINE: u8 = 1 << 7;
}

/// `mlx5_wqe_umr_ctrl_seg.mkey_mask` bits (`device.h` `MLX5_MKEY_MASK_*`): which mkey-segment fields the
/// UMR writes into the key.
pub mod mask {
    pub const LEN: u64 = 1 << 0;
    pub const PAGE_SIZE: u64 = 1 << 1;
    pub const START_ADDR: u64 = 1 << 6;
    pub const PD: u64 = 1 << 7;
    pub const EN_RINVAL: u64 = 1 << 8;
    pub const EN_SIGERR: u64 = 1 << 9;
    pub const BSF_EN: u64 = 1 << 12;
    pub const KEY: u64 = 1 << 13;
    pub const QPN: u64 = 1 << 14;
    pub const LR: u64 = 1 << 17;
    pub const LW: u64 = 1 << 18;
    pub const RR: u64 = 1 << 19;
    pub const RW: u64 = 1 << 20;
    pub const A: u64 = 1 << 21;
    pub const SMALL_FENCE: u64 = 1 << 23;
    pub const RELAXED_ORDERING_WRITE: u64 = 1 << 25;
    pub const FREE: u64 = 1 << 29;
    pub const PAGE_SIZE_5: u64 = 1 << 42;
    pub const RELAXED_ORDERING_READ: u64 = 1 << 47;
    /// The bits the model applies; any other bit completes the WQE in error.
    pub const MODELLED: u64 = LEN | PAGE_SIZE | START_ADDR | PD | KEY | QPN | LR | LW | RR | RW | A | FREE;
    /// The bits that change the translation (MTT keys only).
    pub const TRANSLATION: u64 = LEN | PAGE_SIZE | START_ADDR;
}

/// `fm_ce_se` (`qp.h`): fence mode in bits 7:5 (`MLX5_FENCE_MODE_*`, 0..=4), completion request in 3:2
/// (`MLX5_WQE_CTRL_CQ_UPDATE` 2, `_AND_EQE` 3), solicited in bit 1.
const FENCE_MODE_MAX: u8 = 4;
const CE_CQ_UPDATE: u8 = 2;

/// WQEs run per QP per polling pass at most (a pass's budget; the rest waits for the next pass).
pub const MAX_WQES_PER_POLL: u32 = 64;
/// Executed WQEs kept for the trace while nobody takes them; the oldest go first.
pub const MAX_RECORDS: usize = 4096;

/// The translation a WQE carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Xlt {
    None,
    /// `xlt_octowords × 16` bytes of entries in the WQE.
    Inline(Vec<u8>),
    /// A data segment naming them in memory.
    Pointer(DataSeg),
}

/// A UMR WQE as decoded (structure only: the key, the caps and the QP are checked by [`check`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UmrWqe {
    /// `opmod_idx_opcode` bits 23:8: the WQE's own send counter.
    pub index: u16,
    pub qpn: u32,
    pub ds: u8,
    pub fence: u8,
    pub signaled: bool,
    /// `umr_mkey`: the whole key (index and variant) the WQE changes.
    pub mkey: u32,
    pub flags: u8,
    pub xlt_octowords: u16,
    /// In octowords (`xlt_offset_47_16 << 16 | xlt_offset`).
    pub xlt_offset: u64,
    pub mask: u64,
    /// The mkey segment (`mkc` layout).
    pub seg: [u8; 64],
    pub xlt: Xlt,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl UmrWqe {
    /// Decodes a WQE (its `ds × 16` bytes, `wqe.len()` a multiple of 16). `Err` is the error CQE's syndrome:
    /// LOCAL_QP_OP_ERR for a malformed WQE, LOCAL_LENGTH_ERR when its size disagrees with what it says it carries.
    pub fn parse(wqe: &[u8]) -> Result<UmrWqe, u8> {
        let op = syndrome::LOCAL_QP_OP_ERR;
        if wqe.len() < XLT {
            return Err(syndrome::LOCAL_LENGTH_ERR);
        }
        let ds = wqe[7] & 0x3f;
        if usize::from(ds) * 16 != wqe.len() {
            return Err(syndrome::LOCAL_LENGTH_ERR);
        }
        // Control segment: opmod 0, the UMR opcode, reserved bits clear, no WQE signature (not modelled).
        if wqe[0] != 0 || wqe[3] != OPCODE_UMR || wqe[7] & 0xc0 != 0 || wqe[8..11] != [0; 3] {
            return Err(op);
        }
        let fm_ce_se = wqe[11];
        let (fence, ce) = (fm_ce_se >> 5, (fm_ce_se >> 2) & 3);
        if fence > FENCE_MODE_MAX || ce == 1 || fm_ce_se & 1 != 0 {
            return Err(op);
        }
        // UMR control segment.
        let u = &wqe[UMR_CTRL..MKEY_SEG];
        let flags = u[0];
        if flags & 0x0f != 0 || flags & flags::CHECK_MASK == flags::CHECK_MASK || u[1..4] != [0; 3] {
            return Err(op);
        }
        if u[20..48].iter().any(|&b| b != 0) {
            return Err(op);
        }
        let xlt_octowords = be16(u, 4);
        let xlt_offset = (u64::from(be32(u, 16)) << 16) | u64::from(be16(u, 6));
        if flags & flags::TRANSLATION_OFFSET_EN == 0 && xlt_offset != 0 {
            return Err(op);
        }
        // Translations move in 64-byte units (`MLX5_UMR_FLEX_ALIGNMENT`; Linux aligns both).
        if !xlt_octowords.is_multiple_of(4) || !xlt_offset.is_multiple_of(4) {
            return Err(op);
        }
        let mask = u64::from_be_bytes(u[8..16].try_into().map_err(|_| op)?);
        let mut seg = [0u8; 64];
        seg.copy_from_slice(&wqe[MKEY_SEG..XLT]);
        let xlt = if xlt_octowords == 0 {
            if ds != BASE_DS {
                return Err(syndrome::LOCAL_LENGTH_ERR);
            }
            Xlt::None
        } else if flags & flags::INLINE != 0 {
            if usize::from(ds) != usize::from(BASE_DS) + usize::from(xlt_octowords) {
                return Err(syndrome::LOCAL_LENGTH_ERR);
            }
            Xlt::Inline(wqe[XLT..].to_vec())
        } else {
            if ds != BASE_DS + 1 {
                return Err(syndrome::LOCAL_LENGTH_ERR);
            }
            Xlt::Pointer(DataSeg::parse(&wqe[XLT..]).ok_or(op)?)
        };
        Ok(UmrWqe {
            index: be16(wqe, 1),
            qpn: be32(wqe, 4) >> 8,
            ds,
            fence,
            signaled: ce >= CE_CQ_UPDATE,
            mkey: be32(wqe, 12),
            flags,
            xlt_octowords,
            xlt_offset,
            mask,
            seg,
            xlt,
        })
    }
}

/// What became of a WQE, for the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executed {
    pub at: Instant,
    pub qpn: u32,
    pub wqe_counter: u16,
    /// 0: completed and applied; else the error CQE's syndrome (WR_FLUSH_ERR: flushed, never executed).
    pub syndrome: u8,
    /// The WQE's bytes as read from the send queue (its DS count × 16; one WQEBB when that count was unusable).
    pub wqe: Vec<u8>,
}

/// What the UMR side counted (tests, the process's status).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UmrCounters {
    pub completed: u64,
    pub errors: u64,
    pub flushed: u64,
    /// Doorbells for a UMR QP that was not in RTS or ERR: nothing ran.
    pub doorbells_not_ready: u64,
}

/// The REG_UMR QPs and what their send queues have left to do.
#[derive(Clone, Debug, Default)]
pub struct UmrState {
    /// Every REG_UMR QP (their UAR pages are polled for doorbells).
    pub qps: BTreeSet<u32>,
    /// QPs a doorbell left work to; visited each polling pass until their queue is empty.
    pub rung: BTreeSet<u32>,
    /// Firmware time of one UMR WQE (`Timing::umr_latency`).
    pub latency: Duration,
    pub records: Vec<Executed>,
    pub counters: UmrCounters,
    /// Fault injection (`Fault::UmrFail`): WQEs left to fail, and with which syndrome.
    pub fail: Option<(u32, u8)>,
    /// Fault injection (`Fault::UmrHang`): no WQE runs.
    pub hang: bool,
}

impl UmrState {
    pub fn forget(&mut self, qpn: u32) {
        self.qps.remove(&qpn);
        self.rung.remove(&qpn);
    }

    pub fn clear(&mut self) {
        self.qps.clear();
        self.rung.clear();
        self.records.clear();
    }

    /// A UMR fault (`crate::fault::Fault::UmrFail`, `UmrHang`, `Clear`); other faults are not the UMR side's.
    pub fn inject(&mut self, f: crate::fault::Fault) {
        use crate::fault::Fault;
        match f {
            Fault::UmrFail { count: 0, .. } => self.fail = None,
            Fault::UmrFail { count, syndrome } => self.fail = Some((count, syndrome)),
            Fault::UmrHang => self.hang = true,
            Fault::Clear => {
                self.fail = None;
                self.hang = false;
            }
            _ => {}
        }
    }

    /// The injected failure for the next WQE, if any (counted down).
    fn take_fail(&mut self) -> Option<u8> {
        let (left, synd) = self.fail?;
        self.fail = if left > 1 { Some((left - 1, synd)) } else { None };
        Some(synd)
    }

    fn record(&mut self, e: Executed) {
        if self.records.len() >= MAX_RECORDS {
            self.records.remove(0);
        }
        self.records.push(e);
    }
}

/// The UAR page of each REG_UMR QP: where its doorbells land.
pub fn doorbell_pages(hca: &Hca) -> Vec<(u32, u32)> {
    hca.umr.qps.iter().filter_map(|&n| hca.qps.get(n).map(|q| (n, q.get(qpc::UAR_PAGE)))).collect()
}

/// A doorbell for `qpn` (seen on its UAR page): its send queue runs from the next pass on, in RTS (or is
/// flushed, in ERR). In RST, INIT and RTR nothing runs and the doorbell is forgotten (counted).
pub fn doorbell(hca: &mut Hca, qpn: u32) {
    let Some(q) = hca.qps.get_mut(qpn) else { return };
    match q.state {
        QpState::Rts | QpState::Err => {
            q.sq.rung = true;
            hca.umr.rung.insert(qpn);
        }
        _ => hca.umr.counters.doorbells_not_ready += 1,
    }
}

/// When the earliest WQE under way completes (an idle poller must look again by then).
pub fn next_due(hca: &Hca) -> Option<Instant> {
    hca.umr.rung.iter().filter_map(|&n| hca.qps.get(n).and_then(|q| q.sq.due)).min()
}

/// Runs every rung send queue as far as it can in this pass. Returns true when anything completed. Under a
/// UMR hang nothing runs (the queues stay rung).
pub fn run_pending(hca: &mut Hca, ram: &dyn Memory, now: Instant) -> bool {
    if hca.umr.hang {
        return false;
    }
    let rung: Vec<u32> = hca.umr.rung.iter().copied().collect();
    let mut did = false;
    for qpn in rung {
        did |= run_sq(hca, ram, qpn, now);
    }
    did
}

/// WQEBBs a WQE of `ds` 16-byte units takes (at least one).
fn wqebbs(ds: u8) -> u16 {
    (u16::from(ds) * 16).div_ceil(WQEBB as u16).max(1)
}

/// Device address of send WQEBB `counter` of a UMR QP (its queue starts at `page_offset × 64` in the QP's
/// buffer: the receive queue is zero-length).
fn sq_addr(q: &Qp, counter: u16) -> Option<u64> {
    let entries = 1u32 << q.get(qpc::LOG_SQ_SIZE);
    let page = PAGE_SIZE << q.get(qpc::LOG_PAGE_SIZE);
    let off = u64::from(q.get(qpc::PAGE_OFFSET)) * 64 + u64::from(u32::from(counter) & (entries - 1)) * WQEBB as u64;
    let base = q.pas.get(usize::try_from(off / page).ok()?)?;
    Some(base + off % page)
}

/// The send counter software last wrote (dword 1 of the doorbell record, `MLX5_SND_DBR`; 16 bits).
fn producer(q: &Qp, ram: &dyn Memory) -> Option<u16> {
    let dbr = ifc::get64(&q.qpc, qpc::DBR_ADDR);
    ram.read_be32(dbr + 4).ok().map(|v| v as u16)
}

/// The WQE at `cc`: its bytes (following the ring) and its size in WQEBBs; `Err` with one WQEBB when its DS
/// count is 0 or it runs past what was posted.
fn read_wqe(q: &Qp, ram: &dyn Memory, cc: u16, outstanding: u16) -> Result<(Vec<u8>, u16), Vec<u8>> {
    let mut first = vec![0u8; WQEBB];
    if sq_addr(q, cc).and_then(|a| ram.read(a, &mut first).ok()).is_none() {
        return Err(first);
    }
    let ds = first[7] & 0x3f;
    let n = wqebbs(ds);
    if ds == 0 || n > outstanding {
        return Err(first);
    }
    let mut wqe = vec![0u8; usize::from(n) * WQEBB];
    for (k, chunk) in wqe.chunks_mut(WQEBB).enumerate() {
        let a = sq_addr(q, cc.wrapping_add(k as u16)).ok_or_else(|| first.clone())?;
        ram.read(a, chunk).map_err(|_| first.clone())?;
    }
    wqe.truncate(usize::from(ds) * 16);
    Ok((wqe, n))
}

/// A CQE of `qpn`'s send queue: the WQE opcode and QPN, its counter, and with CQE version 1 the QP's
/// `user_index` (as the flush CQEs of `crate::completion` carry it).
fn write_cqe(hca: &mut Hca, ram: &dyn Memory, q: &Qp, op: u8, synd: u8, counter: u16) {
    let mut body = cqe_body(op, synd, OPCODE_UMR, q.qpn, counter, 0);
    if hca.caps.general(cmd_hca_cap::CQE_VERSION) == 1 {
        let uidx = q.get(qpc::USER_INDEX) & 0xff_ffff;
        body[cqe::SRQN..cqe::SRQN + 4].copy_from_slice(&uidx.to_be_bytes());
    }
    crate::completion::write_cqe(hca, ram, q.get(qpc::CQN_SND), &body);
}

/// Runs `qpn`'s send queue up to the doorbell record's counter (at most [`MAX_WQES_PER_POLL`] WQEs). Returns
/// true when a WQE completed.
fn run_sq(hca: &mut Hca, ram: &dyn Memory, qpn: u32, now: Instant) -> bool {
    let Some(q) = hca.qps.get(qpn) else {
        hca.umr.rung.remove(&qpn);
        return false;
    };
    match q.state {
        QpState::Rts => {}
        QpState::Err => {
            flush(hca, ram, qpn);
            return true;
        }
        _ => {
            idle(hca, qpn);
            return false;
        }
    }
    let mut did = false;
    for _ in 0..MAX_WQES_PER_POLL {
        let Some(q) = hca.qps.get(qpn).cloned() else { return did };
        let Some(pc) = producer(&q, ram) else {
            idle(hca, qpn);
            return did;
        };
        let cc = q.sq.cc;
        if pc == cc {
            idle(hca, qpn);
            return did;
        }
        // Firmware time: the WQE completes once its time has passed.
        if !hca.umr.latency.is_zero() {
            match q.sq.due {
                None => {
                    set_due(hca, qpn, Some(now + hca.umr.latency));
                    return did;
                }
                Some(t) if t > now => return did,
                Some(_) => set_due(hca, qpn, None),
            }
        }
        // At most one ring of WQEBBs can be outstanding; a counter further ahead is a driver bug.
        let entries = 1u32 << q.get(qpc::LOG_SQ_SIZE);
        let outstanding = (u32::from(pc.wrapping_sub(cc))).min(entries) as u16;
        let (wqe, n) = match read_wqe(&q, ram, cc, outstanding) {
            Ok(w) => w,
            Err(first) => {
                fail(hca, ram, &q, cc, 1, syndrome::LOCAL_QP_OP_ERR, first, now);
                return true;
            }
        };
        did = true;
        let verdict = match hca.umr.take_fail() {
            Some(synd) => Err(synd),
            None => UmrWqe::parse(&wqe).and_then(|w| check(hca, ram, &q, &w).map(|new| (w, new))),
        };
        match verdict {
            Ok((w, new)) => {
                hca.mkeys.insert(new.index, new);
                if w.signaled {
                    write_cqe(hca, ram, &q, cqe_op::REQ, 0, cc);
                }
                hca.umr.counters.completed += 1;
                hca.umr.record(Executed { at: now, qpn, wqe_counter: cc, syndrome: 0, wqe });
                if let Some(q) = hca.qps.get_mut(qpn) {
                    q.sq.cc = cc.wrapping_add(n);
                }
            }
            Err(synd) => {
                fail(hca, ram, &q, cc, n, synd, wqe, now);
                return true;
            }
        }
    }
    did
}

fn set_due(hca: &mut Hca, qpn: u32, due: Option<Instant>) {
    if let Some(q) = hca.qps.get_mut(qpn) {
        q.sq.due = due;
    }
}

/// Nothing left to run until the next doorbell.
fn idle(hca: &mut Hca, qpn: u32) {
    hca.umr.rung.remove(&qpn);
    if let Some(q) = hca.qps.get_mut(qpn) {
        q.sq.rung = false;
        q.sq.due = None;
    }
}

/// A WQE failed: nothing of it applied, an error CQE (written whether the WQE asked for a completion or not),
/// the QP to ERR (no async event: the error CQE reports it), the WQE consumed, the rest flushed.
#[allow(clippy::too_many_arguments)]
fn fail(hca: &mut Hca, ram: &dyn Memory, q: &Qp, cc: u16, n: u16, synd: u8, wqe: Vec<u8>, now: Instant) {
    hca.umr.counters.errors += 1;
    write_cqe(hca, ram, q, cqe_op::REQ_ERR, synd, cc);
    hca.umr.record(Executed { at: now, qpn: q.qpn, wqe_counter: cc, syndrome: synd, wqe });
    if let Some(qm) = hca.qps.get_mut(q.qpn) {
        qm.state = QpState::Err;
        qm.sq.cc = cc.wrapping_add(n);
        qm.sq.due = None;
    }
    flush(hca, ram, q.qpn);
}

/// Completes every WQE posted on a UMR QP in ERR with a flush error CQE (WR_FLUSH_ERR), in order, stopping at a
/// CQE that cannot be written. Nothing of them is applied.
pub fn flush(hca: &mut Hca, ram: &dyn Memory, qpn: u32) {
    let Some(q) = hca.qps.get(qpn).cloned() else { return };
    if !q.is_umr() || q.state != QpState::Err {
        return;
    }
    let Some(pc) = producer(&q, ram) else { return };
    let entries = 1u32 << q.get(qpc::LOG_SQ_SIZE);
    let mut cc = q.sq.cc;
    let mut budget = entries;
    while cc != pc && budget > 0 {
        let outstanding = (u32::from(pc.wrapping_sub(cc))).min(entries) as u16;
        let (wqe, n) = read_wqe(&q, ram, cc, outstanding).unwrap_or_else(|first| (first, 1));
        let cqn = q.get(qpc::CQN_SND);
        let before = hca.cqs.cqs.get(&cqn).map(|c| c.producer_counter);
        write_cqe(hca, ram, &q, cqe_op::REQ_ERR, syndrome::WR_FLUSH_ERR, cc);
        if hca.cqs.cqs.get(&cqn).map(|c| c.producer_counter) == before {
            break;
        }
        hca.umr.counters.flushed += 1;
        hca.umr.record(Executed { at: Instant::now(), qpn, wqe_counter: cc, syndrome: syndrome::WR_FLUSH_ERR, wqe });
        cc = cc.wrapping_add(n);
        budget = budget.saturating_sub(u32::from(n));
    }
    if let Some(q) = hca.qps.get_mut(qpn) {
        q.sq.cc = cc;
    }
    idle(hca, qpn);
}

/// Checks a decoded WQE against the QP, the caps and the key, and returns the key as the WQE leaves it. `Err` is
/// the error CQE's syndrome: LOCAL_QP_OP_ERR (the WQE asks what this HCA does not do), LOCAL_LENGTH_ERR
/// (sizes and translation bounds), LOCAL_PROT_ERR (the key, the PD, the translation's pages or pointer).
pub fn check(hca: &Hca, ram: &dyn Memory, q: &Qp, w: &UmrWqe) -> Result<MkeyInfo, u8> {
    let (op, len, prot) = (syndrome::LOCAL_QP_OP_ERR, syndrome::LOCAL_LENGTH_ERR, syndrome::LOCAL_PROT_ERR);
    let cap = |f| hca.caps.general(f);
    if w.qpn != q.qpn || w.index != q.sq.cc {
        return Err(op);
    }
    if u32::from(w.ds) * 16 > cap(cmd_hca_cap::MAX_WQE_SZ_SQ) {
        return Err(len);
    }
    // The mask: only the fields the model applies, and only those the caps let a UMR change (Linux
    // `umr_check_mkey_mask`).
    if w.mask & !mask::MODELLED != 0 {
        return Err(op);
    }
    if w.mask & mask::PAGE_SIZE != 0 && cap(cmd_hca_cap::UMR_MODIFY_ENTITY_SIZE_DISABLED) == 1 {
        return Err(op);
    }
    if w.mask & mask::A != 0 && cap(cmd_hca_cap::UMR_MODIFY_ATOMIC_DISABLED) == 1 {
        return Err(op);
    }
    if w.xlt_offset >> 16 != 0 && cap(cmd_hca_cap::UMR_EXTENDED_TRANSLATION_OFFSET) == 0 {
        return Err(op);
    }
    // The key: live, this variant, created with `umr_en`, and free or not as the flags demand.
    let old = hca.mkeys.get(&(w.mkey >> 8)).filter(|m| m.key == w.mkey).ok_or(prot)?;
    if !old.umr_en {
        return Err(prot);
    }
    match w.flags & flags::CHECK_MASK {
        flags::CHECK_NOT_FREE if !old.free => return Err(prot),
        flags::CHECK_FREE if old.free => return Err(prot),
        _ => {}
    }
    let mtt = old.access_mode == AccessMode::Mtt;
    if !mtt && (w.mask & mask::TRANSLATION != 0 || w.xlt_octowords != 0) {
        return Err(op);
    }
    let s = &w.seg;
    let get = |f| ifc::get(s, f);
    let mut new = old.clone();
    if w.mask & mask::FREE != 0 {
        // Status bit 31 is always 0 (`device.h` `mlx5_mkey_seg.status`).
        if s[0] & 0x80 != 0 {
            return Err(op);
        }
        new.free = get(mkc::FREE) == 1;
    }
    if w.mask & mask::PD != 0 {
        new.pd = get(mkc::PD);
        if !hca.pds.contains(&new.pd) {
            return Err(prot);
        }
    }
    if w.mask & mask::KEY != 0 {
        new.key = (new.index << 8) | get(mkc::MKEY_7_0);
    }
    if w.mask & mask::QPN != 0 && get(mkc::QPN) != QPN_UNBOUND {
        return Err(op);
    }
    for (bit, f, v) in [
        (mask::A, mkc::A, &mut new.access.remote_atomic),
        (mask::RW, mkc::RW, &mut new.access.remote_write),
        (mask::RR, mkc::RR, &mut new.access.remote_read),
        (mask::LW, mkc::LW, &mut new.access.local_write),
        (mask::LR, mkc::LR, &mut new.access.local_read),
    ] {
        if w.mask & bit != 0 {
            *v = get(f) == 1;
        }
    }
    if w.mask & mask::START_ADDR != 0 {
        new.start_addr = ifc::get64(s, mkc::START_ADDR);
    }
    if w.mask & mask::LEN != 0 {
        if get(mkc::LENGTH64) == 1 {
            return Err(op);
        }
        new.len = ifc::get64(s, mkc::LEN);
    }
    if w.mask & mask::PAGE_SIZE != 0 {
        let log = get(mkc::LOG_PAGE_SIZE);
        if !(12..=30).contains(&log) {
            return Err(op);
        }
        new.log_page_size = log as u8;
    }
    // The translation: inside the key's table, read from the WQE or through its pointer.
    if w.xlt_octowords != 0 {
        let entries = usize::from(w.xlt_octowords) * 2;
        let first = usize::try_from(w.xlt_offset.saturating_mul(2)).map_err(|_| len)?;
        if first.checked_add(entries).is_none_or(|end| end > new.mtt.len()) {
            return Err(len);
        }
        let bytes = match &w.xlt {
            Xlt::Inline(b) => b.clone(),
            Xlt::Pointer(d) => read_pointer(hca, ram, q, d, entries * 8)?,
            Xlt::None => return Err(op),
        };
        let ps = 1u64 << new.log_page_size;
        for (i, e) in bytes.chunks_exact(8).enumerate() {
            let e = u64::from_be_bytes(e.try_into().map_err(|_| op)?);
            // `mlx5_mtt`: the page address in bits 63:8, bits 7:2 reserved, `wr_en` bit 1, `rd_en` bit 0.
            if e & 0xfc != 0 {
                return Err(op);
            }
            let present = e & 3 != 0;
            let addr = e & !0xff;
            if !present && addr != 0 {
                return Err(op);
            }
            if present && !page_ok(ram, addr, ps) {
                return Err(prot);
            }
            new.mtt[first + i] = Mtt { addr, read: e & 1 != 0, write: e & 2 != 0 };
        }
    }
    if mtt {
        // The range must fit the table, and every page of it that is present must suit the page size (which may
        // just have changed) and lie in RAM.
        let ps = 1u64 << new.log_page_size;
        let span = (new.start_addr & (ps - 1)).checked_add(new.len).ok_or(len)?;
        if span.div_ceil(ps) > new.mtt.len() as u64 {
            return Err(len);
        }
        if new.covered().iter().any(|p| (p.read || p.write) && !page_ok(ram, p.addr, ps)) {
            return Err(prot);
        }
    } else if new.start_addr.checked_add(new.len).is_none() && !new.length64 {
        return Err(len);
    }
    write_mkc(&mut new);
    Ok(new)
}

/// A translation page: aligned to the key's page size (and to 4 KiB) and wholly in RAM.
fn page_ok(ram: &dyn Memory, addr: u64, ps: u64) -> bool {
    addr.is_multiple_of(ps) && addr.is_multiple_of(PAGE_SIZE) && ram.holds(addr, ps)
}

/// The translation entries a data segment points at: exactly `bytes` long, 64-byte aligned, through the
/// reserved lkey (only where `umr_ptr_rlky` and the QP's `rlky` allow it) or a key on the QP's PD with local
/// read.
fn read_pointer(hca: &Hca, ram: &dyn Memory, q: &Qp, d: &DataSeg, bytes: usize) -> Result<Vec<u8>, u8> {
    if d.byte_count as usize != bytes {
        return Err(syndrome::LOCAL_LENGTH_ERR);
    }
    if !d.addr.is_multiple_of(64) {
        return Err(syndrome::LOCAL_QP_OP_ERR);
    }
    let rlky = q.get(qpc::RLKY) == 1 && hca.caps.general(cmd_hca_cap::UMR_PTR_RLKY) == 1;
    let pieces = crate::eth::translate_segment(hca, ram, rlky, q.pd(), d, false, bytes as u64)
        .ok_or(syndrome::LOCAL_PROT_ERR)?;
    let mut out = Vec::with_capacity(bytes);
    for (a, l) in pieces {
        let at = out.len();
        out.resize(at + l as usize, 0);
        ram.read(a, &mut out[at..]).map_err(|_| syndrome::LOCAL_PROT_ERR)?;
    }
    Ok(out)
}

/// The stored `mkc` (what QUERY_MKEY returns) as the key now is.
fn write_mkc(m: &mut MkeyInfo) {
    let c = &mut m.mkc;
    ifc::set(c, mkc::FREE, m.free.into());
    ifc::set(c, mkc::A, m.access.remote_atomic.into());
    ifc::set(c, mkc::RW, m.access.remote_write.into());
    ifc::set(c, mkc::RR, m.access.remote_read.into());
    ifc::set(c, mkc::LW, m.access.local_write.into());
    ifc::set(c, mkc::LR, m.access.local_read.into());
    ifc::set(c, mkc::MKEY_7_0, m.key & 0xff);
    ifc::set(c, mkc::PD, m.pd);
    ifc::set64(c, mkc::START_ADDR, m.start_addr);
    ifc::set64(c, mkc::LEN, m.len);
    ifc::set(c, mkc::LOG_PAGE_SIZE, m.log_page_size.into());
}
