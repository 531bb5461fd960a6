//! Completion queues as CREATE_CQ describes them (`mlx5_ifc.h` `cqc`, `create_cq_in`; docs/reference/mlx5.md §e.4,
//! §f.2, §f.3). The model records the ring (PAS pages), the CQE size, the EQ its events go to and the doorbell record
//! address, writes CQEs with the ownership bit ([`Cq::write_cqe`]), and takes arm requests from the UAR CQ
//! doorbell ([`CqTable::poll_doorbells`]). Which CQEs are written, and the completion EQEs, are in
//! `crate::completion`.
//!
//! A CQE at producer counter `pc` goes to entry `pc mod 2^log_cq_size` with `owner = (pc >> log_cq_size) & 1`:
//! Linux initialises every CQE with `op_own` = 0xf0 (opcode INVALID, owner 0) and takes the CQE at consumer
//! counter `cc` as software's when its opcode is not INVALID and `owner == (cc >> log_cq_size) & 1`
//! (`infiniband/hw/mlx5/cq.c` `get_sw_cqe`; docs/reference/mlx5.md §f.2), so the bit flips on every pass through the
//! ring.

use std::collections::BTreeMap;

use crate::mem::Memory;

/// CQE opcodes (`cq.h`, the high nibble of `op_own`).
pub mod opcode {
    pub const REQ_ERR: u8 = 0x0d;
    pub const RESP_ERR: u8 = 0x0e;
    pub const INVALID: u8 = 0x0f;
}

/// Error CQE syndromes (`cq.h` `MLX5_CQE_SYNDROME_*`).
pub mod syndrome {
    pub const WR_FLUSH_ERR: u8 = 0x05;
}

/// Byte offsets in the 64-byte CQE (`device.h` `struct mlx5_err_cqe`; docs/reference/mlx5.md §f.2).
pub mod cqe {
    pub const SIZE: usize = 64;
    /// `srqn` (`srqn_uidx` with CQE version 1: the QP's `user_index`), bits 23:0.
    pub const SRQN: usize = 0x20;
    pub const VENDOR_ERR_SYND: usize = 0x36;
    pub const SYNDROME: usize = 0x37;
    /// `s_wqe_opcode_qpn` / `sop_drop_qpn`: QPN in bits 23:0.
    pub const QPN: usize = 0x38;
    pub const WQE_COUNTER: usize = 0x3c;
    pub const OP_OWN: usize = 0x3f;
}

/// UAR page offset of the CQ doorbell (`doorbell.h` `MLX5_CQ_DOORBELL`): one 64-bit write, `(sn << 28) | cmd |
/// ci` then the CQN (docs/reference/mlx5.md §f.4).
pub const UAR_CQ_DOORBELL: u64 = 0x20;
/// Arm command `REQ_NOT_SOL` (`cq.h`): solicited (and error) completions only; 0 is `REQ_NOT`.
pub const ARM_SOLICITED: u32 = 1 << 24;
/// Written into the CQN dword of the doorbell after reading it (a CQN has 24 bits).
pub const DOORBELL_IDLE: u32 = 0xffff_ffff;
/// CQ_ERROR syndrome for an overrun (`device.h` `mlx5_eqe_cq_err`).
pub const CQ_ERROR_OVERRUN: u8 = 1;

/// What became of a CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeWrite {
    Written,
    /// Every entry still holds a CQE software has not consumed: the CQ is now in error (an overrun).
    Overrun,
    /// The CQ is already in error, or its ring is not reachable: nothing written.
    Dropped,
}

/// A 64-byte error CQE (`struct mlx5_err_cqe`): `opcode` (REQ_ERR / RESP_ERR), `syndrome`, QPN and
/// `wqe_counter`; the owner bit is set by [`Cq::write_cqe`].
pub fn error_cqe(op: u8, synd: u8, qpn: u32, wqe_counter: u16) -> [u8; cqe::SIZE] {
    let mut e = [0u8; cqe::SIZE];
    e[cqe::SYNDROME] = synd;
    e[cqe::QPN..cqe::QPN + 4].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    e[cqe::WQE_COUNTER..cqe::WQE_COUNTER + 2].copy_from_slice(&wqe_counter.to_be_bytes());
    e[cqe::OP_OWN] = op << 4;
    e
}

/// One completion queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cq {
    pub cqn: u32,
    pub log_cq_size: u8,
    /// 64 or 128 (`cqe_sz` 0 / 1).
    pub cqe_size: u16,
    pub uar_page: u32,
    pub c_eqn: u8,
    pub log_page_size: u8,
    pub dbr_addr: u64,
    pub pas: Vec<u64>,
    /// The `cqc` bytes of the CREATE_CQ input.
    pub cqc: Vec<u8>,
    /// `cqc.oi`: overruns are ignored (CQEs are written over unconsumed ones).
    pub oi: bool,
    /// Next CQE index (24 bits, not wrapped to the ring; the owner bit is bit `log_cq_size`). At 2^24 - 1 it wraps
    /// to 0, as the consumer counter software writes back (`set_ci`, 24 bits) does; every comparison is modulo
    /// 2^24 (`tests/cq_flush.rs`, `rq_cq_and_eq_counters_wrap_at_their_limits`).
    pub producer_counter: u32,
    /// Armed by the UAR CQ doorbell (or created armed, `cqc.st` 0x6 / 0x9): the next CQE raises a
    /// completion EQE, then the CQ is disarmed.
    pub armed: bool,
    /// `sn` of the last arm request (kept; the model does not check it).
    pub arm_sn: u8,
    /// Overrun: the CQ is in error and writes no more CQEs.
    pub in_error: bool,
}

/// The CQs of the function, by CQN.
#[derive(Default)]
pub struct CqTable {
    pub cqs: BTreeMap<u32, Cq>,
}

impl Cq {
    fn entries(&self) -> u32 {
        1 << self.log_cq_size
    }

    /// Device address of CQE slot `index` (PAS pages of `2^(12 + log_page_size)` bytes).
    fn entry_addr(&self, index: u32) -> Option<u64> {
        let off = u64::from(index) * u64::from(self.cqe_size);
        let shift = 12 + u32::from(self.log_page_size);
        let page = self.pas.get((off >> shift) as usize)?;
        Some(page + (off & ((1u64 << shift) - 1)))
    }

    /// The consumer counter software last wrote to the doorbell record (`set_ci`, 24 bits).
    pub fn consumer_counter(&self, ram: &dyn Memory) -> Option<u32> {
        ram.read_be32(self.dbr_addr).ok().map(|v| v & 0xff_ffff)
    }

    /// CQEs written that software has not consumed (by the doorbell record), 0 when it is unreadable.
    pub fn outstanding(&self, ram: &dyn Memory) -> u32 {
        self.consumer_counter(ram).map_or(0, |ci| self.producer_counter.wrapping_sub(ci) & 0xff_ffff)
    }

    /// Writes one 64-byte CQE with the owner bit of the current pass (in the second half of a 128-byte slot),
    /// the body before the last dword. A full ring (by `set_ci`) is an overrun unless `oi`.
    pub fn write_cqe(&mut self, ram: &dyn Memory, body: &[u8; cqe::SIZE]) -> CqeWrite {
        if self.in_error {
            return CqeWrite::Dropped;
        }
        let Some(ci) = self.consumer_counter(ram) else { return CqeWrite::Dropped };
        if self.producer_counter.wrapping_sub(ci) & 0xff_ffff >= self.entries() && !self.oi {
            self.in_error = true;
            return CqeWrite::Overrun;
        }
        let index = self.producer_counter & (self.entries() - 1);
        let Some(slot) = self.entry_addr(index) else { return CqeWrite::Dropped };
        let addr = slot + u64::from(self.cqe_size) - cqe::SIZE as u64;
        let mut e = *body;
        e[cqe::OP_OWN] = (e[cqe::OP_OWN] & !1) | ((self.producer_counter >> self.log_cq_size) & 1) as u8;
        if self.cqe_size > 64 && ram.write(slot, &[0u8; 64]).is_err() {
            return CqeWrite::Dropped;
        }
        if ram.write(addr, &e[..0x3c]).is_err() || ram.write(addr + 0x3c, &e[0x3c..]).is_err() {
            return CqeWrite::Dropped;
        }
        self.producer_counter = self.producer_counter.wrapping_add(1) & 0xff_ffff;
        CqeWrite::Written
    }
}

impl CqTable {
    pub fn clear(&mut self) {
        self.cqs.clear();
    }

    /// Whether any CQ reports to `eqn` (DESTROY_EQ is refused while one does).
    pub fn uses_eq(&self, eqn: u8) -> bool {
        self.cqs.values().any(|c| c.c_eqn == eqn)
    }

    /// Reads the CQ doorbell (UAR + 0x20) of every UAR page a CQ uses and arms the CQ it names (if that CQ is on
    /// the page). Returns the CQNs armed, or an empty list when no doorbell was written since the last call.
    pub fn poll_doorbells(&mut self, bar: &dyn Memory) -> Vec<u32> {
        let mut pages: Vec<u32> = self.cqs.values().map(|q| q.uar_page).collect();
        pages.sort_unstable();
        pages.dedup();
        let mut armed = Vec::new();
        for page in pages {
            let at = u64::from(page) * 4096 + UAR_CQ_DOORBELL;
            let (Ok(cmd), Ok(cqn)) = (bar.read_be32(at), bar.read_be32(at + 4)) else { continue };
            // CQN 0 is never allocated: an untouched page reads 0.
            if cqn == DOORBELL_IDLE || cqn == 0 {
                continue;
            }
            let _ = bar.write_be32(at + 4, DOORBELL_IDLE);
            if let Some(q) = self.cqs.get_mut(&(cqn & 0xff_ffff)).filter(|q| q.uar_page == page) {
                q.armed = true;
                q.arm_sn = (cmd >> 28) as u8 & 3;
                armed.push(q.cqn);
            }
        }
        armed
    }
}
