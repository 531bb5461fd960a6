//! Event queues (`mlx5_ifc.h` `eqc`, `eqe`; `device.h` `struct mlx5_eqe` and its event data unions;
//! docs/reference/mlx5.md §e.3, §f.1, §f.4): the EQ table CREATE_EQ fills, EQE writing with the ownership bit, and the
//! consumer index the driver reports through the UAR EQ doorbell (UAR + 0x40 arm, + 0x48 no arm).
//!
//! An EQE at producer counter `pc` goes to entry `pc mod 2^log_eq_size` with `owner = (pc >> log_eq_size) & 1`:
//! Linux initialises every entry with owner 1 and takes the entry at consumer index `ci` as software's when
//! `owner == (ci >> log_eq_size) & 1` (`core/lib/eq.h:61-66`), so the bit flips on every pass through the ring.

use std::collections::BTreeMap;

use crate::ifc::{self, Field};
use crate::mem::Memory;

/// Event types (`device.h:315-364`).
pub mod event_type {
    pub const COMPLETION: u8 = 0x00;
    pub const PATH_MIG: u8 = 0x01;
    pub const COMM_EST: u8 = 0x02;
    pub const SQ_DRAINED: u8 = 0x03;
    pub const CQ_ERROR: u8 = 0x04;
    pub const WQ_CATAS_ERROR: u8 = 0x05;
    pub const PATH_MIG_FAILED: u8 = 0x07;
    pub const PORT_CHANGE: u8 = 0x09;
    pub const CMD: u8 = 0x0a;
    pub const PAGE_REQUEST: u8 = 0x0b;
    pub const WQ_INVAL_REQ_ERROR: u8 = 0x10;
    pub const WQ_ACCESS_ERROR: u8 = 0x11;
    pub const SRQ_LAST_WQE: u8 = 0x13;
}

/// PORT_CHANGE `event_sub_type` (`device.h` `MLX5_PORT_CHANGE_SUBTYPE_*`).
pub mod port_change {
    pub const DOWN: u8 = 1;
    pub const ACTIVE: u8 = 4;
}

/// `struct mlx5_ifc_eqe_bits` (64 bytes).
pub mod eqe {
    use crate::ifc::Field;
    pub const EVENT_TYPE: Field = Field::new(0x08, 8);
    pub const EVENT_SUB_TYPE: Field = Field::new(0x18, 8);
    /// `event_data` (28 bytes) starts at byte 0x20.
    pub const EVENT_DATA: usize = 0x20;
    pub const OWNER: Field = Field::new(0x1ff, 1);
    pub const SIZE: usize = 0x40;
}

/// UAR page offsets of the EQ doorbell (`core/eq.c:35`, `core/lib/eq.h:68-76`).
pub const UAR_EQ_DOORBELL_ARM: u64 = 0x40;
pub const UAR_EQ_DOORBELL_NO_ARM: u64 = 0x48;
/// The model writes this into a doorbell after reading it: EQN 0xff is never allocated, so a stale value is
/// never taken for a new write.
pub const DOORBELL_IDLE: u32 = 0xffff_ffff;

/// One event queue as CREATE_EQ described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eq {
    pub eqn: u8,
    pub log_eq_size: u8,
    pub uar_page: u32,
    pub intr: u16,
    pub log_page_size: u8,
    pub oi: bool,
    pub pas: Vec<u64>,
    /// `event_bitmask[0..4]` as four u64 (bit `t` of word `t / 64` enables type `t`).
    pub event_bitmask: [u64; 4],
    /// Next EQE index (24 bits, not wrapped to the ring; the owner bit is bit `log_eq_size`). At 2^24 - 1 it
    /// wraps to 0; fullness is computed modulo 2^24 against the consumer index (`tests/cq_flush.rs`,
    /// `rq_cq_and_eq_counters_wrap_at_their_limits`).
    pub producer_counter: u32,
    /// Last consumer index the driver wrote to the doorbell (24 bits).
    pub consumer_counter: u32,
    pub armed: bool,
    /// EQEs dropped because the ring was full (the EQ is then in overrun).
    pub overruns: u64,
    /// The `eqc` bytes of the CREATE_EQ input (QUERY_EQ returns them with the counters filled in).
    pub eqc: Vec<u8>,
}

impl Eq {
    pub fn subscribes(&self, t: u8) -> bool {
        let t = usize::from(t);
        t < 256 && self.event_bitmask[t / 64] >> (t % 64) & 1 == 1
    }

    fn entries(&self) -> u32 {
        1 << self.log_eq_size
    }

    /// Device address of EQE `index` (PAS pages of `2^(12 + log_page_size)` bytes).
    fn entry_addr(&self, index: u32) -> Option<u64> {
        let off = u64::from(index) * eqe::SIZE as u64;
        let shift = 12 + u32::from(self.log_page_size);
        let page = self.pas.get((off >> shift) as usize)?;
        Some(page + (off & ((1u64 << shift) - 1)))
    }

    /// Writes one EQE; false (and an overrun counted) when every entry is still the driver's, unless `oi`. An
    /// EQ in overrun takes no further EQE (the firmware is in internal error, [`EqTable::overrun`]).
    pub fn post(&mut self, ram: &dyn Memory, event_type: u8, sub_type: u8, data: &[u8]) -> bool {
        if self.overruns > 0 {
            self.overruns += 1;
            return false;
        }
        let used = self.producer_counter.wrapping_sub(self.consumer_counter) & 0xff_ffff;
        if used >= self.entries() && !self.oi {
            self.overruns += 1;
            return false;
        }
        let index = self.producer_counter & (self.entries() - 1);
        let Some(addr) = self.entry_addr(index) else { return false };
        let mut e = [0u8; eqe::SIZE];
        ifc::set(&mut e, eqe::EVENT_TYPE, event_type.into());
        ifc::set(&mut e, eqe::EVENT_SUB_TYPE, sub_type.into());
        let n = data.len().min(28);
        e[eqe::EVENT_DATA..eqe::EVENT_DATA + n].copy_from_slice(&data[..n]);
        ifc::set(&mut e, eqe::OWNER, (self.producer_counter >> self.log_eq_size) & 1);
        // Body first, then the last dword with the owner bit, so the driver never sees a half-written EQE.
        if ram.write(addr, &e[..0x3c]).is_err() || ram.write(addr + 0x3c, &e[0x3c..]).is_err() {
            return false;
        }
        self.producer_counter = self.producer_counter.wrapping_add(1) & 0xff_ffff;
        true
    }
}

/// Health syndrome of an EQ overrun (`mlx5_ifc.h` `MLX5_INITIAL_SEG_HEALTH_SYNDROME_ASYNCHRONOUS_EQ_BUF_OVERRUN`).
pub const SYND_ASYNC_EQ_OVERRUN: u8 = 0xc;

/// The EQs of the function, by EQ number.
#[derive(Default)]
pub struct EqTable {
    pub eqs: BTreeMap<u8, Eq>,
}

/// `eq_number` is 8 bits; the real ConnectX-4 handed out 0x10 first (reference trace), firmware keeping the
/// lower ones.
pub const FIRST_EQN: u32 = 0x10;
pub const LAST_EQN: u32 = 0xfe;

impl EqTable {
    pub fn clear(&mut self) {
        self.eqs.clear();
    }

    /// Has an EQ overrun (an EQE lost because the ring was full and `oi` clear)? The model then enters internal
    /// error (`crate::model`).
    pub fn overrun(&self) -> bool {
        self.eqs.values().any(|q| q.overruns > 0)
    }

    /// Writes an EQE into every EQ subscribed to `event_type`; returns how many were written.
    pub fn raise(&mut self, ram: &dyn Memory, event_type: u8, sub_type: u8, data: &[u8]) -> usize {
        self.eqs
            .values_mut()
            .filter(|q| q.subscribes(event_type))
            .map(|q| q.post(ram, event_type, sub_type, data))
            .filter(|&w| w)
            .count()
    }

    /// Reads the EQ doorbells of every UAR page an EQ uses and takes the consumer indexes written there.
    /// Returns true when a doorbell was consumed.
    pub fn poll_doorbells(&mut self, bar: &dyn Memory) -> bool {
        let mut pages: Vec<u32> = self.eqs.values().map(|q| q.uar_page).collect();
        pages.sort_unstable();
        pages.dedup();
        let mut did = false;
        for page in pages {
            for (off, arm) in [(UAR_EQ_DOORBELL_ARM, true), (UAR_EQ_DOORBELL_NO_ARM, false)] {
                let at = u64::from(page) * 4096 + off;
                let Ok(v) = bar.read_be32(at) else { continue };
                if v == DOORBELL_IDLE {
                    continue;
                }
                let _ = bar.write_be32(at, DOORBELL_IDLE);
                did = true;
                let eqn = (v >> 24) as u8;
                if let Some(q) = self.eqs.get_mut(&eqn).filter(|q| q.uar_page == page) {
                    q.consumer_counter = v & 0xff_ffff;
                    q.armed = arm;
                }
            }
        }
        did
    }
}

/// PAGE_REQUEST data (`mlx5_ifc.h` `pages_req_event`, `device.h` `mlx5_eqe_page_req`): `ec_function` (0:
/// this PF), `function_id` (0), `num_pages` (signed).
pub fn page_request_data(num_pages: i32) -> [u8; 28] {
    let mut d = [0u8; 28];
    ifc::set(&mut d, Field::new(0x20, 32), num_pages as u32);
    d
}

/// PORT_CHANGE data (`device.h` `mlx5_eqe_port_state`): port number in the high nibble of byte 8.
pub fn port_change_data(port: u8) -> [u8; 28] {
    let mut d = [0u8; 28];
    d[8] = port << 4;
    d
}

/// CQ_ERROR data (`device.h` `mlx5_eqe_cq_err`): CQN (be32) at 0, syndrome at byte 0xb.
pub fn cq_error_data(cqn: u32, syndrome: u8) -> [u8; 28] {
    let mut d = [0u8; 28];
    d[0..4].copy_from_slice(&(cqn & 0xff_ffff).to_be_bytes());
    d[0xb] = syndrome;
    d
}

/// QP/SRQ event data (`device.h` `mlx5_eqe_qp_srq`): resource type at byte 0x14 (0 = QP), number (be32, 24 bits)
/// at 0x18.
pub fn qp_event_data(qpn: u32) -> [u8; 28] {
    let mut d = [0u8; 28];
    d[0x14] = 0;
    d[0x18..0x1c].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    d
}

/// Event types that name a QP in `mlx5_eqe_qp_srq` (`device.h:315-364`).
pub fn is_qp_event(t: u8) -> bool {
    use event_type::*;
    matches!(
        t,
        PATH_MIG
            | COMM_EST
            | SQ_DRAINED
            | WQ_CATAS_ERROR
            | PATH_MIG_FAILED
            | WQ_INVAL_REQ_ERROR
            | WQ_ACCESS_ERROR
            | SRQ_LAST_WQE
    )
}
