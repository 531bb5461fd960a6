//! Queue pairs as the HCA holds them (`mlx5_ifc.h` `struct qpc`, `struct ads`; docs/reference/mlx5.md §e.5) and the PRM
//! QP state machine for RC (`include/linux/mlx5/qp.h` `MLX5_QP_STATE_*`, Linux `infiniband/hw/mlx5/qp.c`
//! `optab`): which modify command is legal from which state.
//!
//! The QP keeps its whole context as the `qpc` bytes the driver built, updated field by field by each
//! transition, so QUERY_QP returns exactly the `mlx5_ifc.h` layout. The responder's view is decoded from it.

use std::collections::{BTreeMap, VecDeque};

use crate::ifc::{self, Field};
use crate::roce::responder::{
    ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, QpState, QpView, ReplyPath, RespState,
};
use crate::roce::wire::Endpoints;

/// `struct qpc` fields (bit offsets inside `qpc` as `mlx5_ifc.h` lays it out).
pub mod qpc {
    use crate::ifc::Field;
    pub const SIZE: usize = 0xe8;
    pub const STATE: Field = Field::new(0x00, 4);
    pub const LAG_TX_PORT_AFFINITY: Field = Field::new(0x04, 4);
    pub const ST: Field = Field::new(0x08, 8);
    pub const ISOLATE_VL_TC: Field = Field::new(0x12, 1);
    pub const PM_STATE: Field = Field::new(0x13, 2);
    pub const REQ_E2E_CREDIT_MODE: Field = Field::new(0x16, 2);
    pub const OFFLOAD_TYPE: Field = Field::new(0x18, 4);
    pub const END_PADDING_MODE: Field = Field::new(0x1c, 2);
    pub const PD: Field = Field::new(0x28, 24);
    pub const MTU: Field = Field::new(0x40, 3);
    pub const LOG_MSG_MAX: Field = Field::new(0x43, 5);
    pub const LOG_RQ_SIZE: Field = Field::new(0x49, 4);
    pub const LOG_RQ_STRIDE: Field = Field::new(0x4d, 3);
    pub const NO_SQ: Field = Field::new(0x50, 1);
    pub const LOG_SQ_SIZE: Field = Field::new(0x51, 4);
    pub const TS_FORMAT: Field = Field::new(0x58, 2);
    pub const LATENCY_SENSITIVE: Field = Field::new(0x23, 1);
    pub const RLKY: Field = Field::new(0x5b, 1);
    pub const COUNTER_SET_ID: Field = Field::new(0x60, 8);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const USER_INDEX: Field = Field::new(0x88, 24);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xa3, 5);
    pub const REMOTE_QPN: Field = Field::new(0xa8, 24);
    /// `primary_address_path` (`struct ads`, 0x2c bytes) at byte 0x18 of `qpc`.
    pub const PRIMARY_ADDRESS_PATH: u32 = 0x18;
    pub const SECONDARY_ADDRESS_PATH: u32 = 0x44;
    pub const LOG_ACK_REQ_FREQ: Field = Field::new(0x380, 4);
    pub const LOG_SRA_MAX: Field = Field::new(0x388, 3);
    pub const RETRY_COUNT: Field = Field::new(0x38d, 3);
    pub const RNR_RETRY: Field = Field::new(0x390, 3);
    pub const FRE: Field = Field::new(0x394, 1);
    pub const NEXT_SEND_PSN: Field = Field::new(0x3c8, 24);
    pub const CQN_SND: Field = Field::new(0x3e8, 24);
    pub const DETH_SQPN: Field = Field::new(0x408, 24);
    pub const LOG_RRA_MAX: Field = Field::new(0x488, 3);
    pub const ATOMIC_MODE: Field = Field::new(0x48c, 4);
    pub const RRE: Field = Field::new(0x490, 1);
    pub const RWE: Field = Field::new(0x491, 1);
    pub const RAE: Field = Field::new(0x492, 1);
    pub const PAGE_OFFSET: Field = Field::new(0x494, 6);
    pub const CD_SLAVE_RECEIVE: Field = Field::new(0x49d, 1);
    pub const CD_SLAVE_SEND: Field = Field::new(0x49e, 1);
    pub const CD_MASTER: Field = Field::new(0x49f, 1);
    pub const MIN_RNR_NAK: Field = Field::new(0x4a3, 5);
    pub const NEXT_RCV_PSN: Field = Field::new(0x4a8, 24);
    pub const XRCD: Field = Field::new(0x4c8, 24);
    pub const CQN_RCV: Field = Field::new(0x4e8, 24);
    /// `dbr_addr`, big-endian u64 at this byte of `qpc`.
    pub const DBR_ADDR: usize = 0xa0;
    pub const Q_KEY: Field = Field::new(0x540, 32);
    pub const RQ_TYPE: Field = Field::new(0x565, 3);
    pub const SRQN_RMPN_XRQN: Field = Field::new(0x568, 24);
    pub const DBR_UMEM_VALID: Field = Field::new(0x683, 1);
}

/// `struct ads` fields (bit offsets inside `ads`).
pub mod ads {
    use crate::ifc::Field;
    pub const SIZE: usize = 0x2c;
    pub const FL: Field = Field::new(0x00, 1);
    pub const FREE_AR: Field = Field::new(0x01, 1);
    pub const PKEY_INDEX: Field = Field::new(0x10, 16);
    pub const GRH: Field = Field::new(0x28, 1);
    pub const MLID: Field = Field::new(0x29, 7);
    pub const RLID: Field = Field::new(0x30, 16);
    pub const ACK_TIMEOUT: Field = Field::new(0x40, 5);
    pub const SRC_ADDR_INDEX: Field = Field::new(0x48, 8);
    pub const STAT_RATE: Field = Field::new(0x54, 4);
    pub const HOP_LIMIT: Field = Field::new(0x58, 8);
    pub const TCLASS: Field = Field::new(0x64, 8);
    pub const FLOW_LABEL: Field = Field::new(0x6c, 20);
    /// `rgid_rip`, 16 bytes at this byte of `ads`.
    pub const RGID_RIP: usize = 0x10;
    pub const F_DSCP: Field = Field::new(0x104, 1);
    pub const F_ECN: Field = Field::new(0x105, 1);
    pub const F_ETH_PRIO: Field = Field::new(0x107, 1);
    pub const ECN: Field = Field::new(0x108, 2);
    pub const DSCP: Field = Field::new(0x10a, 6);
    pub const UDP_SPORT: Field = Field::new(0x110, 16);
    pub const DEI_CFI: Field = Field::new(0x120, 1);
    pub const ETH_PRIO: Field = Field::new(0x121, 3);
    pub const SL: Field = Field::new(0x124, 4);
    pub const VHCA_PORT_NUM: Field = Field::new(0x128, 8);
    pub const RMAC_47_32: Field = Field::new(0x130, 16);
    pub const RMAC_31_0: Field = Field::new(0x140, 32);
}

/// `qpc.st` for RC (`qp.h` `MLX5_QP_ST_RC`): the responder's QPs.
pub const ST_RC: u32 = 0;
/// `qpc.st` for REG_UMR (`qp.h` `MLX5_QP_ST_REG_UMR`): a send queue of UMR work requests only, no address path
/// and no receive side (`crate::umr`).
pub const ST_REG_UMR: u32 = 0xc;
/// `qpc.pm_state` MIGRATED (`qp.h` `MLX5_QP_PM_MIGRATED`): Linux always uses it; APM is not modelled.
pub const PM_MIGRATED: u32 = 3;
/// `qpc.rq_type` (`qp.h:125-130`).
pub const RQ_REGULAR: u32 = 0;
pub const RQ_ZERO_LEN: u32 = 3;

/// `opt_param_mask` bits (`qp.h` `MLX5_QP_OPTPAR_*`).
pub mod optpar {
    pub const ALT_ADDR_PATH: u32 = 1 << 0;
    pub const RRE: u32 = 1 << 1;
    pub const RAE: u32 = 1 << 2;
    pub const RWE: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const RNR_TIMEOUT: u32 = 1 << 6;
    pub const PM_STATE: u32 = 1 << 10;
    pub const LAG_TX_AFF: u32 = 1 << 15;
}

/// `qpc.state` encoding (`qp.h` `MLX5_QP_STATE_*`).
pub fn state_code(s: QpState) -> u32 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqe => 4,
        QpState::Sqd => 5,
        QpState::Err => 6,
    }
}

/// The modify commands of the PRM QP state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Rst2Init,
    Init2Rtr,
    Rtr2Rts,
    Rts2Rts,
    ToErr,
    ToRst,
}

impl Transition {
    pub const ALL: [Transition; 6] = [
        Transition::Rst2Init,
        Transition::Init2Rtr,
        Transition::Rtr2Rts,
        Transition::Rts2Rts,
        Transition::ToErr,
        Transition::ToRst,
    ];

    /// The state the QP must be in, or `None` when any state will do (2ERR and 2RST are legal from every
    /// state, Linux `optab` rows for RST..ERR all have `[ERR]` and `[RST]` entries).
    pub fn from(self) -> Option<QpState> {
        match self {
            Transition::Rst2Init => Some(QpState::Reset),
            Transition::Init2Rtr => Some(QpState::Init),
            Transition::Rtr2Rts => Some(QpState::Rtr),
            Transition::Rts2Rts => Some(QpState::Rts),
            Transition::ToErr | Transition::ToRst => None,
        }
    }

    pub fn to(self) -> QpState {
        match self {
            Transition::Rst2Init => QpState::Init,
            Transition::Init2Rtr => QpState::Rtr,
            Transition::Rtr2Rts | Transition::Rts2Rts => QpState::Rts,
            Transition::ToErr => QpState::Err,
            Transition::ToRst => QpState::Reset,
        }
    }

    pub fn legal_from(self, s: QpState) -> bool {
        self.from().is_none_or(|f| f == s)
    }

    /// Optional parameters the transition accepts for RC (Linux `opt_mask` in `infiniband/hw/mlx5/qp.c`).
    /// Alternate paths and path migration are not modelled, so ALT_ADDR_PATH is refused everywhere and
    /// PM_STATE accepted only with `pm_state` = MIGRATED.
    pub fn allowed_optpar(self) -> u32 {
        use optpar::*;
        match self {
            Transition::Rst2Init => 0,
            Transition::Init2Rtr => RRE | RAE | RWE | PKEY_INDEX | LAG_TX_AFF,
            Transition::Rtr2Rts | Transition::Rts2Rts => RRE | RAE | RWE | RNR_TIMEOUT | PM_STATE,
            Transition::ToErr | Transition::ToRst => 0,
        }
    }
}

/// One QP.
#[derive(Clone, Debug)]
pub struct Qp {
    pub qpn: u32,
    pub state: QpState,
    /// The context as created and modified (`qpc`, 0xe8 bytes; `state` is kept in [`Qp::state`]).
    pub qpc: Vec<u8>,
    /// Pages of the WQ buffer (`create_qp_in.pas`).
    pub pas: Vec<u64>,
    /// Responder state: reset on CREATE_QP and on 2RST.
    pub resp: RespState,
    /// RQ WQEs the model has completed (16 bits, as the RQ doorbell record counter): only flush CQEs
    /// (`crate::completion::flush_rq`). 0 on CREATE_QP and after 2RST (Linux zeroes the record on RESET).
    /// After 0xffff it wraps to 0, as the record's counter does; what is outstanding is their difference
    /// modulo 2^16 (`tests/cq_flush.rs`, `rq_cq_and_eq_counters_wrap_at_their_limits`).
    pub rq_consumed: u32,
    /// The send queue's progress (REG_UMR QPs only; `crate::umr`).
    pub sq: SqProgress,
}

/// Where the device is in a QP's send queue: WQEBBs consumed (16 bits, as the send doorbell record counts
/// them; 0 on CREATE_QP and after 2RST), whether a doorbell left work to do, and when the WQE under way
/// completes (its firmware time, `crate::timing::Timing::umr_latency`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqProgress {
    pub cc: u16,
    pub rung: bool,
    pub due: Option<std::time::Instant>,
}

impl Qp {
    pub fn get(&self, f: Field) -> u32 {
        ifc::get(&self.qpc, f)
    }

    pub fn path(&self, f: Field) -> u32 {
        ifc::get(&self.qpc, f.at(qpc::PRIMARY_ADDRESS_PATH))
    }

    pub fn pd(&self) -> u32 {
        self.get(qpc::PD)
    }

    /// A REG_UMR QP (`qpc.st` 0xc): never seen by the RoCE responder, its send queue run by `crate::umr`.
    pub fn is_umr(&self) -> bool {
        self.get(qpc::ST) == ST_REG_UMR
    }

    /// Path MTU in bytes (`qpc.mtu`: 1 = 256 … 5 = 4096), 0 before INIT2RTR.
    pub fn mtu_bytes(&self) -> u32 {
        match self.get(qpc::MTU) {
            m @ 1..=5 => 128 << m,
            _ => 0,
        }
    }

    /// The remote GID / IPv4-mapped address of the primary path.
    pub fn rgid(&self) -> [u8; 16] {
        let at = qpc::PRIMARY_ADDRESS_PATH as usize + ads::RGID_RIP;
        let mut g = [0u8; 16];
        g.copy_from_slice(&self.qpc[at..at + 16]);
        g
    }

    pub fn rmac(&self) -> [u8; 6] {
        let hi = self.path(ads::RMAC_47_32).to_be_bytes();
        let lo = self.path(ads::RMAC_31_0).to_be_bytes();
        [hi[2], hi[3], lo[0], lo[1], lo[2], lo[3]]
    }

    /// How the QP's frames are addressed, from its primary address path and the RoCE address table entry
    /// `src_addr_index` names: to `rmac` / `rgid`, from that entry's MAC and IPv4, `udp_sport`, TTL =
    /// `hop_limit`, TOS = `tclass`. `None` when the path or the entry is not RoCEv2 over IPv4 (the model sends
    /// IPv4 only) or the entry was deleted since INIT2RTR.
    pub fn reply_path(&self, gids: &[crate::port::RoceAddr]) -> Option<ReplyPath> {
        let ip_dst = crate::port::gid_ipv4(&self.rgid())?;
        let e = gids.get(self.path(ads::SRC_ADDR_INDEX) as usize)?;
        let ip_src = crate::port::gid_ipv4(&e.gid)?;
        if !e.is_v2_ipv4(ip_src) {
            return None;
        }
        Some(ReplyPath {
            endpoints: Endpoints {
                eth_src: e.mac,
                eth_dst: self.rmac(),
                ip_src,
                ip_dst,
                udp_sport: self.path(ads::UDP_SPORT) as u16,
            },
            tos: self.path(ads::TCLASS) as u8,
            ttl: self.path(ads::HOP_LIMIT) as u8,
        })
    }

    /// The responder's view; `path` is left `None` (the table's owner fills it from [`Qp::reply_path`]).
    pub fn view(&self) -> QpView {
        let mut access = 0;
        if self.get(qpc::RRE) == 1 {
            access |= ACCESS_REMOTE_READ;
        }
        if self.get(qpc::RWE) == 1 {
            access |= ACCESS_REMOTE_WRITE;
        }
        if self.get(qpc::RAE) == 1 {
            access |= ACCESS_REMOTE_ATOMIC;
        }
        QpView {
            qpn: self.qpn,
            state: self.state,
            pd: self.pd(),
            remote_qpn: self.get(qpc::REMOTE_QPN),
            expected_psn: self.get(qpc::NEXT_RCV_PSN),
            access,
            mtu: self.mtu_bytes(),
            path: None,
        }
    }
}

/// A QP async event the model raised (`device.h` `MLX5_EVENT_TYPE_*`), kept until the EQ side takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEventRecord {
    pub qpn: u32,
    pub event_type: u8,
}

/// Events kept while nobody takes them; the oldest go first.
pub const MAX_PENDING_EVENTS: usize = 1024;

/// The QP table.
#[derive(Clone, Debug, Default)]
pub struct QpTable {
    pub qps: BTreeMap<u32, Qp>,
    events: VecDeque<QpEventRecord>,
}

impl QpTable {
    pub fn get(&self, qpn: u32) -> Option<&Qp> {
        self.qps.get(&qpn)
    }

    pub fn get_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.qps.get_mut(&qpn)
    }

    /// Whether a QP sends or receives completions to `cqn` (DESTROY_CQ is refused while one does).
    pub fn uses_cq(&self, cqn: u32) -> bool {
        self.qps.values().any(|q| q.get(qpc::CQN_SND) == cqn || q.get(qpc::CQN_RCV) == cqn)
    }

    /// Lowest free QPN in `[2, hi)` (QPN 0 and 1 are the IB special QPs and never handed out).
    pub fn free_qpn(&self, hi: u32) -> Option<u32> {
        let mut want = 2;
        for &q in self.qps.range(2..hi).map(|(k, _)| k) {
            if q != want {
                break;
            }
            want += 1;
        }
        (want < hi).then_some(want)
    }

    /// Moves a QP to ERR and records `event_type` for the EQ side (the hook until events reach EQs:
    /// [`QpTable::take_events`]).
    pub fn to_error(&mut self, qpn: u32, event_type: u8) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.state = QpState::Err;
            if self.events.len() == MAX_PENDING_EVENTS {
                self.events.pop_front();
            }
            self.events.push_back(QpEventRecord { qpn, event_type });
        }
    }

    /// Async events raised since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<QpEventRecord> {
        self.events.drain(..).collect()
    }

    pub fn clear(&mut self) {
        self.qps.clear();
        self.events.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_shape() {
        assert!(Transition::Rst2Init.legal_from(QpState::Reset));
        assert!(!Transition::Rst2Init.legal_from(QpState::Init));
        assert!(Transition::ToErr.legal_from(QpState::Reset));
        assert!(Transition::ToRst.legal_from(QpState::Err));
        assert_eq!(Transition::Rts2Rts.to(), QpState::Rts);
    }

    #[test]
    fn qpc_offsets_match_the_layouts() {
        // Absolute offsets in create_qp_in (qpc at byte 0x18) from docs/reference/mlx5.md §e.5.
        assert_eq!(qpc::ST.at(0x18).bit, 0x0c8);
        assert_eq!(qpc::PM_STATE.at(0x18).bit, 0x0d3);
        assert_eq!(qpc::NEXT_RCV_PSN.at(0x18).bit, 0x568);
        assert_eq!(qpc::CQN_RCV.at(0x18).bit, 0x5a8);
        assert_eq!(qpc::RRE.at(0x18).bit, 0x550);
        assert_eq!(ads::UDP_SPORT.at(qpc::PRIMARY_ADDRESS_PATH).at(0x18).bit, 0x290);
        assert_eq!(ads::RMAC_31_0.at(qpc::PRIMARY_ADDRESS_PATH).at(0x18).bit, 0x2c0);
        assert_eq!(0x18 + qpc::DBR_ADDR, 0xb8);
    }
}
