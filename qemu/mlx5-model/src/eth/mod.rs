//! The port's own Ethernet function: the objects the Ethernet commands create — TIS, SQ, RQ,
//! TIR (`mlx5_ifc.h` `tisc`, `sqc`, `rqc`, `tirc`, `wq`) — their counters, and the data path over them:
//! [`tx`] executes send WQEs rung through the UAR BlueFlame registers, [`rx`] steers frames through the NIC_RX
//! root flow table into receive WQEs, [`frame`] parses frames for matching and checksums, and [`wire`] carries
//! frames as UDP datagrams. What is modelled and every assumption: `docs/hca-model.md`, "The Ethernet port".

pub mod frame;
pub mod rx;
pub mod tx;
pub mod wire;

use std::collections::{BTreeMap, VecDeque};

use crate::ifc::{self, Field};
use crate::mem::Memory;

/// `MLX5_SQC_STATE_*` / `MLX5_RQC_STATE_*` (the same numbers for both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqState {
    Rst,
    Rdy,
    Err,
}

impl WqState {
    pub fn code(self) -> u32 {
        match self {
            WqState::Rst => 0,
            WqState::Rdy => 1,
            WqState::Err => 3,
        }
    }

    pub fn from_code(v: u32) -> Option<WqState> {
        match v {
            0 => Some(WqState::Rst),
            1 => Some(WqState::Rdy),
            3 => Some(WqState::Err),
            _ => None,
        }
    }
}

/// `struct mlx5_ifc_wq_bits` (0xc0 bytes, then `pas[]`), bit offsets inside `wq`.
pub mod wq {
    use crate::ifc::Field;
    pub const SIZE: usize = 0xc0;
    pub const WQ_TYPE: Field = Field::new(0x00, 4);
    pub const WQ_SIGNATURE: Field = Field::new(0x04, 1);
    pub const END_PADDING_MODE: Field = Field::new(0x05, 2);
    pub const CD_SLAVE: Field = Field::new(0x07, 1);
    pub const HDS_SKIP_FIRST_SGE: Field = Field::new(0x20, 1);
    pub const LOG2_HDS_BUF_SIZE: Field = Field::new(0x21, 3);
    pub const PAGE_OFFSET: Field = Field::new(0x2b, 5);
    pub const LWM: Field = Field::new(0x30, 16);
    pub const PD: Field = Field::new(0x48, 24);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    /// `dbr_addr` (u64) at this byte.
    pub const DBR_ADDR: usize = 0x10;
    pub const HW_COUNTER: Field = Field::new(0xc0, 32);
    pub const SW_COUNTER: Field = Field::new(0xe0, 32);
    pub const LOG_WQ_STRIDE: Field = Field::new(0x10c, 4);
    pub const LOG_WQ_PG_SZ: Field = Field::new(0x113, 5);
    pub const LOG_WQ_SZ: Field = Field::new(0x11b, 5);
    pub const DBR_UMEM_VALID: Field = Field::new(0x120, 1);
    pub const WQ_UMEM_VALID: Field = Field::new(0x121, 1);
    pub const LOG_HAIRPIN_NUM_PACKETS: Field = Field::new(0x123, 5);
    pub const LOG_HAIRPIN_DATA_SZ: Field = Field::new(0x12b, 5);
    pub const SINGLE_WQE_LOG_NUM_OF_STRIDES: Field = Field::new(0x134, 4);
    pub const TWO_BYTE_SHIFT_EN: Field = Field::new(0x138, 1);
    pub const SINGLE_STRIDE_LOG_NUM_OF_BYTES: Field = Field::new(0x13d, 3);
    pub const DBR_UMEM_ID: Field = Field::new(0x140, 32);
    pub const WQ_UMEM_ID: Field = Field::new(0x160, 32);
    /// `wq_umem_offset` (u64) at this byte.
    pub const WQ_UMEM_OFFSET: usize = 0x30;
    /// `MLX5_WQ_TYPE_CYCLIC`.
    pub const TYPE_CYCLIC: u32 = 1;
}

/// A work queue's memory as `wq` describes it: the ring (PAS pages of `4 KiB << log_wq_pg_sz`), its stride and
/// size, and the doorbell record (dword 0 receive counter, dword 1 send counter; `MLX5_RCV_DBR` /
/// `MLX5_SND_DBR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wq {
    pub pd: u32,
    pub uar_page: u32,
    pub dbr_addr: u64,
    pub log_stride: u8,
    pub log_page_size: u8,
    pub log_size: u8,
    pub pas: Vec<u64>,
}

impl Wq {
    pub fn entries(&self) -> u32 {
        1 << self.log_size
    }

    pub fn stride(&self) -> u64 {
        1 << self.log_stride
    }

    /// Device address of entry `counter mod entries` (an entry never crosses a PAS page: the stride is at most
    /// the page size).
    pub fn entry_addr(&self, counter: u32) -> Option<u64> {
        let index = counter & (self.entries() - 1);
        let off = u64::from(index) << self.log_stride;
        let shift = 12 + u32::from(self.log_page_size);
        let page = self.pas.get((off >> shift) as usize)?;
        Some(page + (off & ((1u64 << shift) - 1)))
    }

    /// The 16-bit counter software last wrote to dword `which` of the doorbell record.
    pub fn doorbell(&self, ram: &dyn Memory, which: u64) -> Option<u16> {
        ram.read_be32(self.dbr_addr + 4 * which).ok().map(|v| v as u16)
    }
}

/// A send queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sq {
    pub sqn: u32,
    pub state: WqState,
    pub cqn: u32,
    pub tisn: u32,
    /// `sqc.min_wqe_inline_mode` as created.
    pub min_inline_mode: u8,
    /// `sqc.rlky`: the reserved lkey may be used in this queue's data segments.
    pub rlky: bool,
    pub flush_in_error: bool,
    pub wq: Wq,
    /// The `sqc` bytes (QUERY_SQ returns them with `state` and `wq.hw_counter` filled in).
    pub ctx: Vec<u8>,
    /// WQEBBs consumed (16 bits, as the doorbell record counts them); 0 after RST.
    pub cc: u16,
}

/// A receive queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rq {
    pub rqn: u32,
    pub state: WqState,
    pub cqn: u32,
    pub rlky: bool,
    pub flush_in_error: bool,
    /// `rqc.vsd`: VLAN stripping disabled (0 = the outer C-VLAN tag is stripped into the CQE).
    pub vsd: bool,
    /// `rqc.counter_set_id`: the Q counter this RQ counts into (0: none).
    pub counter_set_id: u32,
    pub wq: Wq,
    pub ctx: Vec<u8>,
    /// WQEs consumed (16 bits, as the doorbell record counts them); 0 after RST.
    pub consumed: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tis {
    pub transport_domain: u32,
    pub prio: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tir {
    pub transport_domain: u32,
    pub inline_rqn: u32,
}

/// What the port did with frames, for tests and the process's log (a driver would read Q counters and vport
/// counters; those commands are not modelled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthCounters {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Send WQEs completed while the link was down: the frame was discarded.
    pub tx_link_down: u64,
    /// Send WQEs completed in error (error CQE, SQ to ERR).
    pub tx_errors: u64,
    /// Frames dropped because the outbox to the wire was full (nobody drains it).
    pub tx_outbox_drops: u64,
    pub sq_doorbells: u64,
    /// Doorbells for an SQ in RST: nothing executes.
    pub sq_doorbells_not_ready: u64,
    /// Doorbells naming no SQ on that UAR page.
    pub sq_doorbells_unknown: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Shorter than 60 bytes (the Ethernet minimum without FCS).
    pub rx_runt: u64,
    /// Longer than the port's `oper_mtu` − 4 (PMTU counts the FCS).
    pub rx_oversize: u64,
    /// Dropped because the link is down.
    pub rx_link_down: u64,
    /// Unicast frames the e-switch did not forward: their destination MAC is not in the VF's unicast list.
    pub rx_eswitch_drop: u64,
    /// No NIC_RX root table.
    pub rx_no_root: u64,
    /// A table miss with the default action, or a DROP entry.
    pub rx_steering_drop: u64,
    /// Steered to an RQ that is not RDY.
    pub rx_rq_not_ready: u64,
    /// Steered to an RQ with no posted WQE (`out_of_buffer`).
    pub rx_out_of_buffer: u64,
    /// Receive completions in error (bad lkey, frame larger than the WQE).
    pub rx_errors: u64,
    /// Frames handed to the RoCEv2 responder.
    pub rx_roce: u64,
}

/// Frames waiting for the wire at most (older ones are dropped and counted when nobody drains them).
pub const MAX_OUTBOX: usize = 4096;

/// Every Ethernet object of the function.
#[derive(Default)]
pub struct Eth {
    pub sqs: BTreeMap<u32, Sq>,
    pub rqs: BTreeMap<u32, Rq>,
    pub tises: BTreeMap<u32, Tis>,
    pub tirs: BTreeMap<u32, Tir>,
    pub counters: EthCounters,
    /// Frames sent and not yet taken by the wire.
    pub outbox: VecDeque<Vec<u8>>,
    /// Q counters (ALLOC_Q_COUNTER) by `counter_set_id`: `out_of_buffer` of the RQs attached to each.
    pub q_counters: BTreeMap<u32, QCounter>,
}

/// One Q counter set (`query_q_counter_out`); the model counts `out_of_buffer` only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QCounter {
    pub out_of_buffer: u32,
}

impl Eth {
    pub fn clear(&mut self) {
        self.sqs.clear();
        self.rqs.clear();
        self.tises.clear();
        self.tirs.clear();
        self.outbox.clear();
        self.q_counters.clear();
    }

    pub fn uses_cq(&self, cqn: u32) -> bool {
        self.sqs.values().any(|s| s.cqn == cqn) || self.rqs.values().any(|r| r.cqn == cqn)
    }

    pub fn uses_pd(&self, pd: u32) -> bool {
        self.sqs.values().any(|s| s.wq.pd == pd) || self.rqs.values().any(|r| r.wq.pd == pd)
    }

    pub fn uses_uar(&self, uar: u32) -> bool {
        self.sqs.values().any(|s| s.wq.uar_page == uar)
    }

    pub fn uses_td(&self, td: u32) -> bool {
        self.tises.values().any(|t| t.transport_domain == td) || self.tirs.values().any(|t| t.transport_domain == td)
    }

    pub fn push_tx(&mut self, frame: Vec<u8>) {
        if self.outbox.len() >= MAX_OUTBOX {
            self.outbox.pop_front();
            self.counters.tx_outbox_drops += 1;
        }
        self.outbox.push_back(frame);
    }
}

/// Lowest free number in `[1, 2^log_max)` (0 is never handed out: a zero field means "none" in contexts).
pub fn free_number<V>(map: &BTreeMap<u32, V>, log_max: u32) -> Option<u32> {
    let hi = 1u32 << log_max.min(24);
    (1..hi).find(|n| !map.contains_key(n))
}

/// A field of a context stored at `ctx[0..]`.
pub fn ctx_get(ctx: &[u8], f: Field) -> u32 {
    ifc::get(ctx, f)
}

/// `struct mlx5_wqe_data_seg` (`qp.h`): `byte_count`, `lkey`, `addr`, big-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSeg {
    pub byte_count: u32,
    pub lkey: u32,
    pub addr: u64,
}

impl DataSeg {
    pub fn parse(s: &[u8]) -> Option<DataSeg> {
        let s: &[u8; 16] = s.get(..16)?.try_into().ok()?;
        Some(DataSeg {
            byte_count: u32::from_be_bytes([s[0], s[1], s[2], s[3]]),
            lkey: u32::from_be_bytes([s[4], s[5], s[6], s[7]]),
            addr: u64::from_be_bytes([s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15]]),
        })
    }
}

/// The reserved lkey QUERY_SPECIAL_CONTEXTS reports (`resd_lkey`): memory index 0, which CREATE_MKEY never
/// hands out, variant 1. Honoured only in the data segments of an SQ or RQ created with `rlky` = 1, where it
/// names guest physical memory directly (bounds-checked against RAM); anywhere else it is a bad lkey.
pub const RESD_LKEY: u32 = 0x0000_0001;
/// `MLX5_INVALID_LKEY` / `MLX5_TERMINATE_SCATTER_LIST_LKEY` (`device.h`): a receive data segment with this lkey
/// and a zero byte count ends the scatter list (Linux pads cyclic RQ WQEs with it).
pub const TERMINATE_LKEY: u32 = 0x100;

/// Checks one data segment of a queue on PD `pd` and translates the first `used` bytes of it: the lkey must be
/// the reserved lkey on a queue with `rlky`, or name a live MKEY (index and variant) that is not `free`, on
/// `pd`, with local read (`write` false: gather) or local write (`write` true: scatter), and the whole segment
/// `[addr, addr + byte_count)` must lie inside the key. Returns the device-address pieces of the used part, or
/// `None` (a local protection error).
pub fn translate_segment(
    hca: &crate::hca::Hca,
    ram: &dyn Memory,
    rlky: bool,
    pd: u32,
    seg: &DataSeg,
    write: bool,
    used: u64,
) -> Option<Vec<(u64, u64)>> {
    let (lkey, addr, len) = (seg.lkey, seg.addr, u64::from(seg.byte_count));
    let used = used.min(len);
    if lkey == RESD_LKEY {
        return (rlky && ram.holds(addr, len)).then(|| vec![(addr, used)]);
    }
    let m = hca.mkeys.get(&(lkey >> 8)).filter(|m| m.key == lkey)?;
    let access = if write { m.access.local_write } else { m.access.local_read };
    if m.free || m.pd != pd || !access {
        return None;
    }
    // The whole segment inside the key (cheap: no translation of bytes that will not be touched).
    let end = addr.checked_add(len)?;
    if addr < m.start_addr || (!m.length64 && end > m.start_addr.checked_add(m.len)?) {
        return None;
    }
    let pieces = m.translate(addr, used)?;
    pieces.iter().all(|&(a, l)| ram.holds(a, l)).then_some(pieces)
}
