//! RC queue pairs (`mlx5_ifc.h`: `create_qp_in/out`, `qpc`, `ads`, `rst2init_qp_in`, `init2rtr_qp_in`,
//! `rtr2rts_qp_in`, `qp_2err_in`, `qp_2rst_in`, `destroy_qp_in`, `query_qp_in/out`; states and service
//! types from `qp.h`). What each transition sets follows Linux `infiniband/hw/mlx5/qp.c` for a kernel RC QP
//! on RoCEv2 (docs/reference/mlx5.md §e.5). `qpc` sits at byte 0x18 (bit 0xc0) of every one of these structures.

use crate::command::{Command, Output};
use crate::field::{ByteArray, Field, Field64};
use crate::handles::{Cqn, Pdn, Qpn, UarPage};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID, PAS, PAS_OFFSET, put_pas, with_pas};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_2ERR_QP, MLX5_CMD_OP_2RST_QP, MLX5_CMD_OP_CREATE_QP, MLX5_CMD_OP_DESTROY_QP, MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_QUERY_QP, MLX5_CMD_OP_RST2INIT_QP, MLX5_CMD_OP_RTR2RTS_QP,
};

/// `create_qp_in` and the `*2*_qp_in` structures: 0x110 bytes (CREATE adds `pas[]`).
pub const QP_IN_LEN: usize = 0x110;
/// `query_qp_out`: 0x1d0 bytes (Linux asks for exactly this).
pub const QUERY_QP_OUT_LEN: usize = 0x1d0;

/// `MLX5_QP_ST_RC`, `MLX5_QP_PM_MIGRATED`, `MLX5_NON_ZERO_RQ` / `MLX5_ZERO_LEN_RQ` (`qp.h`).
pub const MLX5_QP_ST_RC: u32 = 0;
/// `MLX5_QP_ST_REG_UMR` (`qp.h`): a QP whose send queue carries only UMR work requests (and NOPs). It has no
/// address path and no receive queue; the firmware refuses its WQEs from any other QP type.
pub const MLX5_QP_ST_REG_UMR: u32 = 0xc;
pub const MLX5_QP_PM_MIGRATED: u32 = 3;
pub const MLX5_NON_ZERO_RQ: u32 = 0;
pub const MLX5_ZERO_LEN_RQ: u32 = 3;

/// QP states (`qp.h:78-88`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Rst,
    Init,
    Rtr,
    Rts,
    Sqer,
    Sqd,
    Err,
    SqDraining,
    Suspended,
    Unknown(u8),
}

impl QpState {
    pub fn from_raw(v: u8) -> QpState {
        match v {
            0 => QpState::Rst,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqer,
            5 => QpState::Sqd,
            6 => QpState::Err,
            7 => QpState::SqDraining,
            9 => QpState::Suspended,
            x => QpState::Unknown(x),
        }
    }
}

/// `qpc.mtu` (IB MTU encoding, `mlx5_ifc.h:3472-3478`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    pub fn from_raw(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// `qpc`, offsets from its start; it sits at bit 0xc0 ([`QPC`]) of `create_qp_in`, of every `*2*_qp_in` and of
/// `query_qp_out`.
pub mod qpc {
    use crate::field::{Field, Field64};
    pub const STATE: Field = Field::new(0x00, 4);
    pub const ST: Field = Field::new(0x08, 8);
    pub const PM_STATE: Field = Field::new(0x13, 2);
    pub const PD: Field = Field::new(0x28, 24);
    pub const MTU: Field = Field::new(0x40, 3);
    pub const LOG_MSG_MAX: Field = Field::new(0x43, 5);
    pub const LOG_RQ_SIZE: Field = Field::new(0x49, 4);
    pub const LOG_RQ_STRIDE: Field = Field::new(0x4d, 3);
    pub const LOG_SQ_SIZE: Field = Field::new(0x51, 4);
    pub const TS_FORMAT: Field = Field::new(0x58, 2);
    pub const RLKY: Field = Field::new(0x5b, 1);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const USER_INDEX: Field = Field::new(0x88, 24);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xa3, 5);
    pub const REMOTE_QPN: Field = Field::new(0xa8, 24);
    /// `primary_address_path` ([`super::ads`]).
    pub const PRIMARY_ADDRESS_PATH: usize = 0xc0;
    pub const LOG_ACK_REQ_FREQ: Field = Field::new(0x380, 4);
    pub const LOG_SRA_MAX: Field = Field::new(0x388, 3);
    pub const RETRY_COUNT: Field = Field::new(0x38d, 3);
    pub const RNR_RETRY: Field = Field::new(0x390, 3);
    pub const FRE: Field = Field::new(0x394, 1);
    pub const NEXT_SEND_PSN: Field = Field::new(0x3c8, 24);
    pub const CQN_SND: Field = Field::new(0x3e8, 24);
    pub const LOG_RRA_MAX: Field = Field::new(0x488, 3);
    pub const ATOMIC_MODE: Field = Field::new(0x48c, 4);
    pub const RRE: Field = Field::new(0x490, 1);
    pub const RWE: Field = Field::new(0x491, 1);
    pub const RAE: Field = Field::new(0x492, 1);
    pub const MIN_RNR_NAK: Field = Field::new(0x4a3, 5);
    pub const NEXT_RCV_PSN: Field = Field::new(0x4a8, 24);
    pub const CQN_RCV: Field = Field::new(0x4e8, 24);
    pub const DBR_ADDR: Field64 = Field64::new(0x500);
    pub const RQ_TYPE: Field = Field::new(0x565, 3);
}

/// `ads` (an address path), offsets from its start; the primary path sits at `qpc` bit 0xc0.
pub mod ads {
    use crate::field::{ByteArray, Field};
    pub const PKEY_INDEX: Field = Field::new(0x10, 16);
    pub const ACK_TIMEOUT: Field = Field::new(0x40, 5);
    pub const SRC_ADDR_INDEX: Field = Field::new(0x48, 8);
    pub const HOP_LIMIT: Field = Field::new(0x58, 8);
    pub const TCLASS: Field = Field::new(0x64, 8);
    pub const RGID_RIP: ByteArray = ByteArray::new(0x80, 16);
    pub const DSCP: Field = Field::new(0x10a, 6);
    pub const UDP_SPORT: Field = Field::new(0x110, 16);
    pub const ETH_PRIO: Field = Field::new(0x121, 3);
    pub const VHCA_PORT_NUM: Field = Field::new(0x128, 8);
    pub const RMAC_47_32: Field = Field::new(0x130, 16);
    pub const RMAC_31_0: Field = Field::new(0x140, 32);
}

/// Bit offset of `qpc` in `create_qp_in`, the `*2*_qp_in` structures and `query_qp_out`.
pub const QPC: usize = 0xc0;
/// The primary address path, absolute.
const PAP: usize = QPC + qpc::PRIMARY_ADDRESS_PATH;
/// `qpn` of `create_qp_out` and of every `*_qp_in` that names a QP.
const QPN: Field = OBJECT_ID;

// The fields as the commands carry them (absolute).
const STATE: Field = qpc::STATE.at(QPC);
const ST: Field = qpc::ST.at(QPC);
const PM_STATE: Field = qpc::PM_STATE.at(QPC);
const PD: Field = qpc::PD.at(QPC);
const MTU: Field = qpc::MTU.at(QPC);
const TS_FORMAT: Field = qpc::TS_FORMAT.at(QPC);
const LOG_MSG_MAX: Field = qpc::LOG_MSG_MAX.at(QPC);
const USER_INDEX: Field = qpc::USER_INDEX.at(QPC);
const LOG_RQ_SIZE: Field = qpc::LOG_RQ_SIZE.at(QPC);
const LOG_RQ_STRIDE: Field = qpc::LOG_RQ_STRIDE.at(QPC);
const LOG_SQ_SIZE: Field = qpc::LOG_SQ_SIZE.at(QPC);
const RLKY: Field = qpc::RLKY.at(QPC);
const UAR_PAGE: Field = qpc::UAR_PAGE.at(QPC);
const LOG_PAGE_SIZE: Field = qpc::LOG_PAGE_SIZE.at(QPC);
const REMOTE_QPN: Field = qpc::REMOTE_QPN.at(QPC);
const PKEY_INDEX: Field = ads::PKEY_INDEX.at(PAP);
const ACK_TIMEOUT: Field = ads::ACK_TIMEOUT.at(PAP);
const SRC_ADDR_INDEX: Field = ads::SRC_ADDR_INDEX.at(PAP);
const HOP_LIMIT: Field = ads::HOP_LIMIT.at(PAP);
const TCLASS: Field = ads::TCLASS.at(PAP);
const RGID: ByteArray = ads::RGID_RIP.at(PAP);
const DSCP: Field = ads::DSCP.at(PAP);
const UDP_SPORT: Field = ads::UDP_SPORT.at(PAP);
const ETH_PRIO: Field = ads::ETH_PRIO.at(PAP);
const VHCA_PORT_NUM: Field = ads::VHCA_PORT_NUM.at(PAP);
const RMAC_47_32: Field = ads::RMAC_47_32.at(PAP);
const RMAC_31_0: Field = ads::RMAC_31_0.at(PAP);
const LOG_ACK_REQ_FREQ: Field = qpc::LOG_ACK_REQ_FREQ.at(QPC);
const LOG_SRA_MAX: Field = qpc::LOG_SRA_MAX.at(QPC);
const RETRY_COUNT: Field = qpc::RETRY_COUNT.at(QPC);
const RNR_RETRY: Field = qpc::RNR_RETRY.at(QPC);
const FRE: Field = qpc::FRE.at(QPC);
const NEXT_SEND_PSN: Field = qpc::NEXT_SEND_PSN.at(QPC);
const CQN_SND: Field = qpc::CQN_SND.at(QPC);
const LOG_RRA_MAX: Field = qpc::LOG_RRA_MAX.at(QPC);
const ATOMIC_MODE: Field = qpc::ATOMIC_MODE.at(QPC);
/// `MLX5_ATOMIC_MODE_IB_COMP` (`driver.h`): IB-compatible 8-byte atomics, what Linux `get_atomic_mode`
/// chooses when the card has plain compare-and-swap and fetch-and-add only.
pub const ATOMIC_MODE_IB_COMP: u8 = 1;
/// `MLX5_ATOMIC_MODE_8B` (`driver.h`).
pub const ATOMIC_MODE_8B: u8 = 3;
/// `MLX5_IB_DEFAULT_UIDX`: the `user_index` Linux gives a kernel QP when `cqe_version` is 1 ("work with CQE
/// version 0").
pub const DEFAULT_USER_INDEX: u32 = 0xff_ffff;
/// `qpc.ts_format` values (`mlx5_ifc.h` `MLX5_TIMESTAMP_FORMAT_*`).
pub const TS_FORMAT_FREE_RUNNING: u8 = 0;
pub const TS_FORMAT_DEFAULT: u8 = 1;

/// The QP context values that come from the HCA's capabilities, read once after bring-up and used for every
/// RC QP, as Linux `mlx5_ib` derives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    /// `qpc.log_msg_max` = `cmd_hca_cap.log_max_msg` (Linux sets it from the cap at create and INIT2RTR).
    pub log_msg_max: u8,
    /// The bound on `log_rra_max` (responder reads/atomics in flight): `cmd_hca_cap.log_max_ra_res_qp`.
    pub log_max_ra_res: u8,
    /// The bound on `log_sra_max` (requester reads/atomics in flight): `cmd_hca_cap.log_max_ra_req_qp`.
    pub log_max_ra_req: u8,
    /// `qpc.ts_format`: Linux `mlx5_get_qp_default_ts` — DEFAULT when the timestamp cap in force
    /// (`roce_cap.qp_ts_format` with RoCE, else `cmd_hca_cap.sq_ts_format`) is non-zero, else FREE_RUNNING.
    pub ts_format: u8,
    /// `qpc.user_index`: [`DEFAULT_USER_INDEX`] when `cmd_hca_cap.cqe_version` is 1 (Linux sets it only then).
    pub user_index: Option<u32>,
    /// `qpc.atomic_mode` for remote atomics (Linux `get_atomic_mode`); `None` when the HCA offers none.
    pub atomic_mode: Option<u8>,
}

impl QpCaps {
    /// The values from the general caps, the RoCE caps (when RoCE is on) and the ATOMIC caps (when queried).
    pub fn from_caps(
        general: &crate::ifc::init::GeneralCaps,
        roce: Option<&crate::ifc::init::RoceCaps>,
        atomic: Option<&crate::ifc::init::AtomicCaps>,
    ) -> QpCaps {
        let ts_cap = roce.map_or(general.sq_ts_format, |r| r.qp_ts_format);
        QpCaps {
            log_msg_max: general.log_max_msg,
            log_max_ra_res: general.log_max_ra_res_qp,
            log_max_ra_req: general.log_max_ra_req_qp,
            ts_format: if ts_cap != 0 { TS_FORMAT_DEFAULT } else { TS_FORMAT_FREE_RUNNING },
            user_index: (general.cqe_version == 1).then_some(DEFAULT_USER_INDEX),
            atomic_mode: atomic.and_then(|a| atomic_mode(general.atomic, a)),
        }
    }

    /// Why remote atomics are not available, or `None` when they are.
    pub fn atomics_refused(&self) -> Option<&'static str> {
        if self.atomic_mode.is_none() {
            Some("the HCA offers no remote atomics (cmd_hca_cap.atomic or the ATOMIC capabilities say no)")
        } else {
            None
        }
    }
}

/// Linux `get_atomic_mode` for an RC QP: none without `cmd_hca_cap.atomic`; with extended atomics the mode of
/// the largest operand size the QP supports (`atomic_size_to_mode`: sizes above 256 bytes ignored, 8 bytes or
/// less → `MLX5_ATOMIC_MODE_8B`, else log2 of the size); otherwise IB-compatible when compare-and-swap and
/// fetch-and-add are both there.
pub fn atomic_mode(atomic: bool, a: &crate::ifc::init::AtomicCaps) -> Option<u8> {
    use crate::ifc::init::{
        MLX5_ATOMIC_OPS_CMP_SWAP, MLX5_ATOMIC_OPS_EXTENDED_CMP_SWAP, MLX5_ATOMIC_OPS_EXTENDED_FETCH_ADD,
        MLX5_ATOMIC_OPS_FETCH_ADD,
    };
    if !atomic {
        return None;
    }
    let ops = a.atomic_operations;
    if ops & (MLX5_ATOMIC_OPS_EXTENDED_CMP_SWAP | MLX5_ATOMIC_OPS_EXTENDED_FETCH_ADD) != 0 {
        let sizes = a.atomic_size_qp & 0x1ff;
        if sizes != 0 {
            let log_max = 15 - sizes.leading_zeros() as u8;
            return Some(if log_max > 3 { log_max } else { ATOMIC_MODE_8B });
        }
    }
    let plain = MLX5_ATOMIC_OPS_CMP_SWAP | MLX5_ATOMIC_OPS_FETCH_ADD;
    (ops & plain == plain).then_some(ATOMIC_MODE_IB_COMP)
}
const RRE: Field = qpc::RRE.at(QPC);
const RWE: Field = qpc::RWE.at(QPC);
const RAE: Field = qpc::RAE.at(QPC);
const MIN_RNR_NAK: Field = qpc::MIN_RNR_NAK.at(QPC);
const NEXT_RCV_PSN: Field = qpc::NEXT_RCV_PSN.at(QPC);
const CQN_RCV: Field = qpc::CQN_RCV.at(QPC);
const DBR_ADDR: Field64 = qpc::DBR_ADDR.at(QPC);
const RQ_TYPE: Field = qpc::RQ_TYPE.at(QPC);

/// What a QP is created with; the modify commands repeat `pd`, `cqn_snd`, `cqn_rcv` (as Linux does).
#[derive(Clone, Copy, Debug)]
pub struct RcQpParams<'a> {
    pub pd: Pdn,
    pub uar_page: UarPage,
    pub cqn_snd: Cqn,
    pub cqn_rcv: Cqn,
    /// log2 of the RQ WQE count; `None` = zero-length RQ (`rq_type` 3).
    pub log_rq_size: Option<u8>,
    /// log2(RQ WQE bytes) - 4.
    pub log_rq_stride: u8,
    /// log2 of the SQ size in 64-byte WQE basic blocks.
    pub log_sq_size: u8,
    pub log_msg_max: u8,
    /// `qpc.ts_format` ([`QpCaps::ts_format`]).
    pub ts_format: u8,
    /// `qpc.user_index` when the CQE version calls for one ([`QpCaps::user_index`]).
    pub user_index: Option<u32>,
    /// log2(page / 4 KiB) of the WQ buffer.
    pub log_page_size: u8,
    pub dbr_addr: u64,
    /// The buffer's pages (RQ first, SQ right after it).
    pub pages: &'a [u64],
}

/// The handles every modify repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpBase {
    pub qpn: Qpn,
    pub pd: Pdn,
    pub cqn_snd: Cqn,
    pub cqn_rcv: Cqn,
}

fn common(c: &mut Command, pd: Pdn, cqn_snd: Cqn, cqn_rcv: Cqn) {
    common_st(c, MLX5_QP_ST_RC, pd, cqn_snd, cqn_rcv);
}

/// What every create and modify carries, for a QP of service type `st` (Linux sets `qpc.st` on every
/// transition, `__mlx5_ib_modify_qp`).
fn common_st(c: &mut Command, st: u32, pd: Pdn, cqn_snd: Cqn, cqn_rcv: Cqn) {
    c.set(ST, st);
    c.set(PM_STATE, MLX5_QP_PM_MIGRATED);
    c.set(PD, pd.0);
    c.set(CQN_SND, cqn_snd.0);
    c.set(CQN_RCV, cqn_rcv.0);
}

/// CREATE_QP for an RC QP.
pub fn create_rc_qp(p: &RcQpParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_QP, 0, with_pas(PAS_OFFSET, p.pages.len()), CMD_HDR_LEN)
        .with("pd", p.pd.0.into())
        .with("cqn_snd", p.cqn_snd.0.into())
        .with("cqn_rcv", p.cqn_rcv.0.into());
    common(&mut c, p.pd, p.cqn_snd, p.cqn_rcv);
    c.set(LOG_MSG_MAX, p.log_msg_max.into());
    c.set(TS_FORMAT, p.ts_format.into());
    if let Some(u) = p.user_index {
        c.set(USER_INDEX, u);
    }
    match p.log_rq_size {
        Some(n) => {
            c.set(RQ_TYPE, MLX5_NON_ZERO_RQ);
            c.set(LOG_RQ_SIZE, n.into());
            c.set(LOG_RQ_STRIDE, p.log_rq_stride.into());
        }
        None => c.set(RQ_TYPE, MLX5_ZERO_LEN_RQ),
    }
    c.set(LOG_SQ_SIZE, p.log_sq_size.into());
    c.set(UAR_PAGE, p.uar_page.0);
    c.set(LOG_PAGE_SIZE, p.log_page_size.into());
    c.set(FRE, 1);
    c.set(RLKY, 1);
    c.set64(DBR_ADDR, p.dbr_addr);
    put_pas(&mut c, PAS, p.pages);
    c
}

/// What a REG_UMR QP is created with: one CQ for both directions (it has no receive queue), the send
/// queue's size and buffer.
#[derive(Clone, Copy, Debug)]
pub struct UmrQpParams<'a> {
    pub pd: Pdn,
    pub uar_page: UarPage,
    pub cqn: Cqn,
    /// log2 of the SQ size in 64-byte WQE basic blocks.
    pub log_sq_size: u8,
    pub ts_format: u8,
    pub user_index: Option<u32>,
    /// log2(page / 4 KiB) of the WQ buffer.
    pub log_page_size: u8,
    pub dbr_addr: u64,
    pub pages: &'a [u64],
}

/// The handles a REG_UMR QP's modifies repeat (its one CQ as `cqn_snd` and `cqn_rcv`).
fn umr_base(qpn: Qpn, pd: Pdn, cqn: Cqn) -> QpBase {
    QpBase { qpn, pd, cqn_snd: cqn, cqn_rcv: cqn }
}

/// CREATE_QP for the UMR queue pair (Linux `mlx5r_umr_resource_init` creates it as `MLX5_IB_QPT_REG_UMR`):
/// service type REG_UMR, a zero-length receive queue, the send queue, `rlky` so its WQEs may name the
/// reserved lkey. No `log_msg_max`, no fast-register bit: a UMR QP sends nothing on the wire.
pub fn create_umr_qp(p: &UmrQpParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_QP, 0, with_pas(PAS_OFFSET, p.pages.len()), CMD_HDR_LEN)
        .with("pd", p.pd.0.into())
        .with("cqn", p.cqn.0.into())
        .with("st", MLX5_QP_ST_REG_UMR.into());
    common_st(&mut c, MLX5_QP_ST_REG_UMR, p.pd, p.cqn, p.cqn);
    c.set(TS_FORMAT, p.ts_format.into());
    if let Some(u) = p.user_index {
        c.set(USER_INDEX, u);
    }
    c.set(RQ_TYPE, MLX5_ZERO_LEN_RQ);
    c.set(LOG_SQ_SIZE, p.log_sq_size.into());
    c.set(UAR_PAGE, p.uar_page.0);
    c.set(LOG_PAGE_SIZE, p.log_page_size.into());
    c.set(RLKY, 1);
    c.set64(DBR_ADDR, p.dbr_addr);
    put_pas(&mut c, PAS, p.pages);
    c
}

/// The UMR QP's three transitions to RTS, as Linux `mlx5r_umr_qp_rst2rts` asks for them: INIT with P_Key
/// index 0 and port 1, then RTR and RTS with nothing but the state (no address path, no PSNs, no peer). Each
/// carries the MTU 4096 and `log_msg_max` 12 Linux's modify gives every REG_UMR QP.
pub fn umr_rst2init(qpn: Qpn, pd: Pdn, cqn: Cqn) -> Command {
    let mut c = umr_modify(MLX5_CMD_OP_RST2INIT_QP, qpn, pd, cqn);
    c.set(PKEY_INDEX, 0);
    c.set(VHCA_PORT_NUM, 1);
    c.set(RLKY, 1);
    c
}

pub fn umr_init2rtr(qpn: Qpn, pd: Pdn, cqn: Cqn) -> Command {
    umr_modify(MLX5_CMD_OP_INIT2RTR_QP, qpn, pd, cqn)
}

pub fn umr_rtr2rts(qpn: Qpn, pd: Pdn, cqn: Cqn) -> Command {
    umr_modify(MLX5_CMD_OP_RTR2RTS_QP, qpn, pd, cqn)
}

/// `mtu_msgmax` Linux gives a REG_UMR QP on every modify (`__mlx5_ib_modify_qp`: `IB_MTU_4096 << 5 | 12`).
pub const UMR_QP_LOG_MSG_MAX: u8 = 12;

fn umr_modify(opcode: u16, qpn: Qpn, pd: Pdn, cqn: Cqn) -> Command {
    let q = umr_base(qpn, pd, cqn);
    let mut c = Command::new(opcode, 0, QP_IN_LEN, CMD_HDR_LEN).with("qpn", q.qpn.0.into());
    c.set(QPN, q.qpn.0);
    common_st(&mut c, MLX5_QP_ST_REG_UMR, q.pd, q.cqn_snd, q.cqn_rcv);
    c.set(MTU, Mtu::Mtu4096 as u32);
    c.set(LOG_MSG_MAX, UMR_QP_LOG_MSG_MAX.into());
    c
}

pub fn create_qp_out(out: &Output) -> Qpn {
    Qpn(out.get(QPN))
}

/// Remote access the responder side allows (`rre`, `rwe`, `rae`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAccess {
    pub remote_read: bool,
    pub remote_write: bool,
    pub remote_atomic: bool,
}

fn modify(opcode: u16, q: &QpBase) -> Command {
    let mut c = Command::new(opcode, 0, QP_IN_LEN, CMD_HDR_LEN).with("qpn", q.qpn.0.into());
    c.set(QPN, q.qpn.0);
    common(&mut c, q.pd, q.cqn_snd, q.cqn_rcv);
    c
}

/// RST2INIT: P_Key index 0, port 1, remote access bits; remote atomics with `atomic_mode` (from the caps,
/// [`QpCaps::atomic_mode`]), as Linux `to_mlx5_access_flags` sets `rae` only together with `atomic_mode`.
/// Asked for remote atomics with no mode, the command carries `rae` alone and the firmware refuses it.
pub fn rst2init(q: &QpBase, access: QpAccess, atomic_mode: Option<u8>) -> Command {
    let mut c = modify(MLX5_CMD_OP_RST2INIT_QP, q);
    c.set(PKEY_INDEX, 0);
    c.set(VHCA_PORT_NUM, 1);
    c.set(RRE, access.remote_read as u32);
    c.set(RWE, access.remote_write as u32);
    c.set(RAE, access.remote_atomic as u32);
    if let (true, Some(m)) = (access.remote_atomic, atomic_mode) {
        c.set(ATOMIC_MODE, m.into());
    }
    c.set(RLKY, 1);
    c
}

/// The remote side of an RC connection over RoCEv2, and our path parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcPeer {
    pub qpn: Qpn,
    /// The peer's first PSN: our `next_rcv_psn`.
    pub psn: u32,
    pub gid: [u8; 16],
    pub mac: [u8; 6],
    pub mtu: Mtu,
    /// Our GID table index (`src_addr_index`).
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub udp_sport: u16,
    /// Traffic class (DSCP = tclass >> 2 on RoCEv2).
    pub tclass: u8,
    /// SL & 7.
    pub eth_prio: u8,
    /// log2 of the RDMA reads/atomics we accept in flight (`log_rra_max`).
    pub log_rra_max: u8,
    /// IB RNR timer code.
    pub min_rnr_nak: u8,
}

/// INIT2RTR: path MTU, remote QPN, receive PSN and the RoCEv2 primary address path.
pub fn init2rtr(q: &QpBase, peer: &RcPeer, log_msg_max: u8) -> Command {
    let mut c = modify(MLX5_CMD_OP_INIT2RTR_QP, q).with("remote_qpn", peer.qpn.0.into());
    c.set(MTU, peer.mtu as u32);
    c.set(LOG_MSG_MAX, log_msg_max.into());
    c.set(REMOTE_QPN, peer.qpn.0);
    c.set(SRC_ADDR_INDEX, peer.sgid_index.into());
    c.set(HOP_LIMIT, peer.hop_limit.into());
    c.set(TCLASS, peer.tclass.into());
    c.put(RGID, &peer.gid);
    c.set(DSCP, (peer.tclass >> 2).into());
    c.set(UDP_SPORT, peer.udp_sport.into());
    c.set(ETH_PRIO, (peer.eth_prio & 7).into());
    c.set(VHCA_PORT_NUM, 1);
    c.set(RMAC_47_32, u32::from(u16::from_be_bytes([peer.mac[0], peer.mac[1]])));
    c.set(RMAC_31_0, u32::from_be_bytes([peer.mac[2], peer.mac[3], peer.mac[4], peer.mac[5]]));
    c.set(LOG_RRA_MAX, peer.log_rra_max.into());
    c.set(MIN_RNR_NAK, peer.min_rnr_nak.into());
    c.set(NEXT_RCV_PSN, peer.psn);
    c
}

/// Requester parameters for RTR2RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsParams {
    /// Our first PSN.
    pub psn: u32,
    /// 4.096 µs · 2^t.
    pub ack_timeout: u8,
    pub retry_count: u8,
    /// 7 = infinite.
    pub rnr_retry: u8,
    /// log2 of our RDMA reads/atomics in flight.
    pub log_sra_max: u8,
}

/// RTR2RTS: send PSN, timeouts and retries (`log_ack_req_freq` 8, as Linux).
pub fn rtr2rts(q: &QpBase, p: &RtsParams) -> Command {
    let mut c = modify(MLX5_CMD_OP_RTR2RTS_QP, q);
    c.set(ACK_TIMEOUT, p.ack_timeout.into());
    c.set(LOG_ACK_REQ_FREQ, 8);
    c.set(LOG_SRA_MAX, p.log_sra_max.into());
    c.set(RETRY_COUNT, p.retry_count.into());
    c.set(RNR_RETRY, p.rnr_retry.into());
    c.set(NEXT_SEND_PSN, p.psn);
    c
}

fn qpn_cmd(opcode: u16, qpn: Qpn, out_len: usize) -> Command {
    let mut c = Command::new(opcode, 0, CMD_HDR_LEN, out_len).with("qpn", qpn.0.into());
    c.set(QPN, qpn.0);
    c
}

pub fn qp_2err(qpn: impl Into<Qpn>) -> Command {
    qpn_cmd(MLX5_CMD_OP_2ERR_QP, qpn.into(), CMD_HDR_LEN)
}

pub fn qp_2rst(qpn: impl Into<Qpn>) -> Command {
    qpn_cmd(MLX5_CMD_OP_2RST_QP, qpn.into(), CMD_HDR_LEN)
}

pub fn destroy_qp(qpn: impl Into<Qpn>) -> Command {
    qpn_cmd(MLX5_CMD_OP_DESTROY_QP, qpn.into(), CMD_HDR_LEN)
}

pub fn query_qp(qpn: impl Into<Qpn>) -> Command {
    qpn_cmd(MLX5_CMD_OP_QUERY_QP, qpn.into(), QUERY_QP_OUT_LEN)
}

/// The parts of `query_qp_out.qpc` the driver checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    pub state: QpState,
    pub pd: Pdn,
    /// Raw `qpc.mtu` (see [`Mtu::from_raw`]).
    pub mtu: u8,
    pub log_msg_max: u8,
    pub remote_qpn: Qpn,
    pub next_send_psn: u32,
    pub next_rcv_psn: u32,
    pub cqn_snd: Cqn,
    pub cqn_rcv: Cqn,
    pub uar_page: UarPage,
    pub rre: bool,
    pub rwe: bool,
    pub rae: bool,
    pub rgid: [u8; 16],
    pub rmac: [u8; 6],
    pub src_addr_index: u8,
    pub hop_limit: u8,
    pub udp_sport: u16,
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub min_rnr_nak: u8,
    pub log_rra_max: u8,
    pub log_sra_max: u8,
    pub vhca_port_num: u8,
}

pub fn query_qp_out(out: &Output) -> QpInfo {
    let g = |f: Field| out.get(f);
    let rgid = RGID.read_array(out.bytes());
    let hi = (g(RMAC_47_32) as u16).to_be_bytes();
    let lo = g(RMAC_31_0).to_be_bytes();
    QpInfo {
        state: QpState::from_raw(g(STATE) as u8),
        pd: Pdn(g(PD)),
        mtu: g(MTU) as u8,
        log_msg_max: g(LOG_MSG_MAX) as u8,
        remote_qpn: Qpn(g(REMOTE_QPN)),
        next_send_psn: g(NEXT_SEND_PSN),
        next_rcv_psn: g(NEXT_RCV_PSN),
        cqn_snd: Cqn(g(CQN_SND)),
        cqn_rcv: Cqn(g(CQN_RCV)),
        uar_page: UarPage(g(UAR_PAGE)),
        rre: g(RRE) != 0,
        rwe: g(RWE) != 0,
        rae: g(RAE) != 0,
        rgid,
        rmac: [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]],
        src_addr_index: g(SRC_ADDR_INDEX) as u8,
        hop_limit: g(HOP_LIMIT) as u8,
        udp_sport: g(UDP_SPORT) as u16,
        ack_timeout: g(ACK_TIMEOUT) as u8,
        retry_count: g(RETRY_COUNT) as u8,
        rnr_retry: g(RNR_RETRY) as u8,
        min_rnr_nak: g(MIN_RNR_NAK) as u8,
        log_rra_max: g(LOG_RRA_MAX) as u8,
        log_sra_max: g(LOG_SRA_MAX) as u8,
        vhca_port_num: g(VHCA_PORT_NUM) as u8,
    }
}

/// RoCEv2 UDP source port from the QPNs when the flow label is 0 (`ib_verbs.h` `rdma_calc_flow_label` +
/// `rdma_flow_label_to_udp_sport`).
pub fn roce_udp_sport(lqpn: Qpn, rqpn: Qpn) -> u16 {
    let mut v = u64::from(lqpn.0) * u64::from(rqpn.0);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xf_ffff) as u32;
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Output;
    use crate::ifc::golden::{be16, be32, be64};

    const BASE: QpBase = QpBase { qpn: Qpn(0x42), pd: Pdn(7), cqn_snd: Cqn(3), cqn_rcv: Cqn(4) };

    fn check_common(b: &[u8]) {
        assert_eq!(be32(b, 0x08), 0x42);
        // qpc dword 0 (byte 0x18): st [23:16] = 0 (RC), pm_state [12:11] = 3.
        assert_eq!(be32(b, 0x18) & 0x00ff_1800, 3 << 11);
        assert_eq!(be32(b, 0x1c), 7);
        assert_eq!(be32(b, 0x94), 3); // cqn_snd: qpc dword 37 = byte 0x94
        assert_eq!(be32(b, 0xb4), 4); // cqn_rcv: qpc dword 45 = byte 0xb4
    }

    #[test]
    fn create() {
        let c = create_rc_qp(&RcQpParams {
            pd: Pdn(7),
            uar_page: UarPage(0x11),
            cqn_snd: Cqn(3),
            cqn_rcv: Cqn(4),
            log_rq_size: Some(6),
            log_rq_stride: 2,
            log_sq_size: 7,
            log_msg_max: 30,
            ts_format: TS_FORMAT_DEFAULT,
            user_index: Some(DEFAULT_USER_INDEX),
            log_page_size: 0,
            dbr_addr: 0xdead_0040,
            pages: &[0x1000, 0x2000, 0x3000],
        });
        let b = c.input();
        assert_eq!(be16(b, 0), 0x500);
        assert_eq!(b.len(), 0x110 + 24);
        assert_eq!(be32(b, 0x18), 3 << 11);
        assert_eq!(be32(b, 0x1c), 7);
        // qpc dword 2 (byte 0x20): mtu [31:29] 0, log_msg_max [28:24], log_rq_size [22:19], log_rq_stride
        // [18:16], log_sq_size [14:11], ts_format [7:6], rlky [4].
        assert_eq!(be32(b, 0x20), (30 << 24) | (6 << 19) | (2 << 16) | (7 << 11) | (1 << 6) | (1 << 4));
        assert_eq!(be32(b, 0x24), 0x11);
        // user_index: qpc bit 0x88 (24 bits) = bytes 0x29..0x2c.
        assert_eq!(be32(b, 0x28) & 0xff_ffff, 0xff_ffff);
        assert_eq!(be32(b, 0x2c), 0);
        assert_eq!(b[0x8a] & 0x08, 0x08); // fre: qpc dword 34 bit 11
        assert_eq!(be32(b, 0x94), 3);
        assert_eq!(be32(b, 0xb4), 4);
        assert_eq!(be64(b, 0xb8), 0xdead_0040);
        assert_eq!(be32(b, 0xc4) >> 24, 0); // rq_type regular
        assert_eq!(be64(b, 0x110), 0x1000);
        assert_eq!(be64(b, 0x120), 0x3000);
        let z = create_rc_qp(&RcQpParams {
            log_rq_size: None,
            ..RcQpParams {
                pd: Pdn(1),
                uar_page: UarPage(1),
                cqn_snd: Cqn(1),
                cqn_rcv: Cqn(1),
                log_rq_size: None,
                log_rq_stride: 0,
                log_sq_size: 0,
                log_msg_max: 0,
                ts_format: 0,
                user_index: None,
                log_page_size: 0,
                dbr_addr: 0,
                pages: &[],
            }
        });
        assert_eq!(be32(z.input(), 0xc4) >> 24, 3);
        assert_eq!((z.input()[0x23] & 0xc0, be32(z.input(), 0x28)), (0, 0));
        assert_eq!(
            create_qp_out(&Output::new(alloc::vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0])),
            Qpn(0x1234)
        );
    }

    #[test]
    fn transitions() {
        let c = rst2init(&BASE, QpAccess { remote_read: true, remote_write: true, remote_atomic: false }, Some(5));
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x502, 0x110));
        check_common(b);
        assert_eq!(be16(b, 0x32), 0); // pkey_index
        assert_eq!(b[0x55], 1); // vhca_port_num
        assert_eq!(be32(b, 0xa8) & 0xe000, 0xc000); // rre, rwe (qpc dword 42 bits 15, 14)
        assert_eq!(be32(b, 0xa8) & 0xf_0000, 0, "no atomic mode without remote atomics");
        let atomic = QpAccess { remote_read: false, remote_write: false, remote_atomic: true };
        let a = rst2init(&BASE, atomic, Some(ATOMIC_MODE_IB_COMP));
        // rae (bit 13) with atomic_mode IB_COMP (qpc bits 0x48c..0x490: dword 42 bits 19..16).
        assert_eq!(be32(a.input(), 0xa8) & 0xf_e000, 0x1_2000);
        let a = rst2init(&BASE, atomic, Some(5));
        assert_eq!(be32(a.input(), 0xa8) & 0xf_e000, 0x5_2000);
        // No mode: rae alone (the firmware refuses it).
        let a = rst2init(&BASE, atomic, None);
        assert_eq!(be32(a.input(), 0xa8) & 0xf_e000, 0x2000);

        let peer = RcPeer {
            qpn: Qpn(0xabcd),
            psn: 0x12_3456,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x4c, 0x42, 0xff, 0xfe, 0, 0, 1],
            mac: [0x02, 0x4c, 0x42, 0, 0, 1],
            mtu: Mtu::Mtu1024,
            sgid_index: 2,
            hop_limit: 64,
            udp_sport: 0xc123,
            tclass: 0x68,
            eth_prio: 3,
            log_rra_max: 4,
            min_rnr_nak: 12,
        };
        let c = init2rtr(&BASE, &peer, 30);
        let b = c.input();
        assert_eq!(be16(b, 0), 0x503);
        check_common(b);
        assert_eq!(b[0x20], (3 << 5) | 30);
        assert_eq!(be32(b, 0x2c), 0xabcd); // remote_qpn
        assert_eq!(be32(b, 0x38), (2 << 16) | 64); // src_addr_index, hop_limit
        assert_eq!(be32(b, 0x3c), 0x68 << 20); // tclass
        assert_eq!(&b[0x40..0x50], &peer.gid);
        assert_eq!(be32(b, 0x50), (0x1a << 16) | 0xc123); // dscp, udp_sport
        assert_eq!(be32(b, 0x54), (3 << 28) | (1 << 16) | 0x024c); // eth_prio, port, rmac_47_32
        assert_eq!(&b[0x58..0x5c], &[0x42, 0, 0, 1]);
        assert_eq!(b[0xa9] >> 5, 4); // log_rra_max
        assert_eq!(be32(b, 0xac), (12 << 24) | 0x12_3456); // min_rnr_nak, next_rcv_psn
        assert_eq!(c.attrs().get("remote_qpn"), Some(0xabcd));

        let c =
            rtr2rts(&BASE, &RtsParams { psn: 0x654321, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 3 });
        let b = c.input();
        assert_eq!(be16(b, 0), 0x504);
        check_common(b);
        assert_eq!(b[0x38] >> 3, 14);
        // qpc dword 34 (byte 0x88): log_ack_req_freq [31:28], log_sra_max [23:21], retry_count [18:16],
        // rnr_retry [15:13].
        assert_eq!(be32(b, 0x88), (8 << 28) | (3 << 21) | (7 << 16) | (7 << 13));
        assert_eq!(be32(b, 0x90), 0x65_4321);

        for (c, op) in [(qp_2err(Qpn(9)), 0x507), (qp_2rst(Qpn(9)), 0x50a), (destroy_qp(Qpn(9)), 0x501)] {
            assert_eq!((be16(c.input(), 0), be32(c.input(), 8), c.input().len()), (op, 9, 0x10));
        }
        let q = query_qp(Qpn(9));
        assert_eq!((be16(q.input(), 0), q.out_len()), (0x50b, 0x1d0));
    }

    #[test]
    fn umr_qp_create_and_transitions() {
        let pages = [0x7000u64];
        let c = create_umr_qp(&UmrQpParams {
            pd: Pdn(7),
            uar_page: UarPage(2),
            cqn: Cqn(0x21),
            log_sq_size: 6,
            ts_format: TS_FORMAT_DEFAULT,
            user_index: Some(DEFAULT_USER_INDEX),
            log_page_size: 0,
            dbr_addr: 0x8040,
            pages: &pages,
        });
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x500, 0x118));
        // qpc dword 0 (byte 0x18): st [23:16] = 0xc, pm_state [12:11] = migrated.
        assert_eq!(be32(b, 0x18), (0xc << 16) | (3 << 11));
        assert_eq!(be32(b, 0x1c) & 0xff_ffff, 7); // pd
        // qpc dword 2 (byte 0x20): mtu and log_msg_max [31:24] and the RQ's size [22:16] zero; log_sq_size
        // [14:11] = 6, ts_format [7:6] = 1, rlky [4].
        assert_eq!(be32(b, 0x20), (6 << 11) | (1 << 6) | (1 << 4));
        assert_eq!(be32(b, 0x24), 2); // uar_page: qpc dword 3
        assert_eq!(be32(b, 0x28) & 0xff_ffff, DEFAULT_USER_INDEX); // user_index
        assert_eq!(be32(b, 0x94) & 0xff_ffff, 0x21); // cqn_snd
        assert_eq!(be32(b, 0xb4) & 0xff_ffff, 0x21); // cqn_rcv
        assert_eq!(be64(b, 0xb8), 0x8040); // dbr_addr
        assert_eq!(be32(b, 0xc4) >> 24, 3); // rq_type: zero-length
        assert_eq!(be32(b, 0x88), 0, "no fre (qpc dword 34 bit 11), no retry counts on a UMR QP");
        assert_eq!(be64(b, 0x110), 0x7000);
        assert_eq!(c.attrs().get("st"), Some(0xc));

        let i = umr_rst2init(Qpn(0x99), Pdn(7), Cqn(0x21));
        let b = i.input();
        assert_eq!((be16(b, 0), be32(b, 8), b.len()), (0x502, 0x99, 0x110));
        assert_eq!(be32(b, 0x18), (0xc << 16) | (3 << 11));
        assert_eq!((be16(b, 0x32), b[0x55]), (0, 1)); // pkey_index, vhca_port_num
        assert_eq!(be32(b, 0x20), (5 << 29) | (12 << 24) | (1 << 4)); // mtu 4096, log_msg_max 12, rlky
        for (c, op) in
            [(umr_init2rtr(Qpn(0x99), Pdn(7), Cqn(0x21)), 0x503), (umr_rtr2rts(Qpn(0x99), Pdn(7), Cqn(0x21)), 0x504)]
        {
            let b = c.input();
            assert_eq!((be16(b, 0), be32(b, 8)), (op, 0x99));
            assert_eq!(be32(b, 0x18), (0xc << 16) | (3 << 11));
            // No address path, no PSNs: the primary path (bytes 0x30..0x70) and the rest of qpc stay zero but
            // for pd and the CQ numbers.
            assert!(b[0x30..0x70].iter().all(|&x| x == 0));
            assert_eq!(be32(b, 0x20), (5 << 29) | (12 << 24)); // mtu 4096, log_msg_max 12, nothing else
            assert_eq!(be32(b, 0x90), 0);
            assert_eq!(be32(b, 0xac), 0);
            assert_eq!(be32(b, 0x94) & 0xff_ffff, 0x21);
        }
    }

    #[test]
    fn query_parse_reads_what_init2rtr_wrote() {
        // query_qp_out has qpc at the same byte 0x18 as the modify inputs: feed an INIT2RTR input back as
        // an output image, with state RTR and a send PSN.
        let peer = RcPeer {
            qpn: Qpn(0x77),
            psn: 5,
            gid: [1; 16],
            mac: [1, 2, 3, 4, 5, 6],
            mtu: Mtu::Mtu4096,
            sgid_index: 1,
            hop_limit: 9,
            udp_sport: 0xc000,
            tclass: 0,
            eth_prio: 0,
            log_rra_max: 2,
            min_rnr_nak: 1,
        };
        let mut img = init2rtr(&BASE, &peer, 20).input().to_vec();
        img.resize(0x1d0, 0);
        img[0x18] = 0x20; // state 2 in qpc dword 0 [31:28]
        img[0x91..0x94].copy_from_slice(&[0, 0, 0x33]);
        let i = query_qp_out(&Output::new(img));
        assert_eq!(i.state, QpState::Rtr);
        assert_eq!((i.pd, i.remote_qpn, i.next_rcv_psn, i.next_send_psn), (Pdn(7), Qpn(0x77), 5, 0x33));
        assert_eq!(Mtu::from_raw(i.mtu), Some(Mtu::Mtu4096));
        assert_eq!((i.rgid, i.rmac, i.src_addr_index, i.hop_limit), ([1; 16], [1, 2, 3, 4, 5, 6], 1, 9));
        assert_eq!((i.cqn_snd, i.cqn_rcv, i.log_msg_max, i.vhca_port_num), (Cqn(3), Cqn(4), 20, 1));
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
    }

    #[test]
    fn caps_give_the_qp_values() {
        use crate::ifc::init::{AtomicCaps, GeneralCaps, RoceCaps};
        let general = GeneralCaps {
            log_max_msg: 20,
            log_max_ra_res_qp: 2,
            log_max_ra_req_qp: 1,
            cqe_version: 1,
            atomic: true,
            sq_ts_format: 0,
            ..GeneralCaps::default()
        };
        let roce = RoceCaps { qp_ts_format: 2, ..RoceCaps::default() };
        // The ConnectX-4 trace's ATOMIC caps: all four ops, sizes 4..32 bytes (0x3c) → the 32-byte mode (5).
        let ext = AtomicCaps { atomic_operations: 0xf, atomic_size_qp: 0x3c, ..Default::default() };
        let q = QpCaps::from_caps(&general, Some(&roce), Some(&ext));
        assert_eq!(
            q,
            QpCaps {
                log_msg_max: 20,
                log_max_ra_res: 2,
                log_max_ra_req: 1,
                ts_format: TS_FORMAT_DEFAULT,
                user_index: Some(DEFAULT_USER_INDEX),
                atomic_mode: Some(5),
            }
        );
        assert_eq!(q.atomics_refused(), None);
        // Without RoCE the SQ timestamp cap decides; CQE version 0 sets no user index.
        let q = QpCaps::from_caps(&GeneralCaps { cqe_version: 0, ..general }, None, Some(&ext));
        assert_eq!((q.ts_format, q.user_index), (TS_FORMAT_FREE_RUNNING, None));
        // Extended atomics up to 8 bytes → 8B mode; plain CAS + FA → IB-compatible; neither → none.
        assert_eq!(
            atomic_mode(true, &AtomicCaps { atomic_operations: 0x4, atomic_size_qp: 0x8, ..Default::default() }),
            Some(ATOMIC_MODE_8B)
        );
        assert_eq!(
            atomic_mode(true, &AtomicCaps { atomic_operations: 0x3, atomic_size_qp: 0x8, ..Default::default() }),
            Some(1)
        );
        assert_eq!(
            atomic_mode(true, &AtomicCaps { atomic_operations: 0x1, atomic_size_qp: 0x8, ..Default::default() }),
            None
        );
        assert_eq!(atomic_mode(false, &ext), None);
        // The general `atomic` bit off, or no ATOMIC caps: refused with a reason.
        let q = QpCaps::from_caps(&GeneralCaps { atomic: false, ..general }, Some(&roce), Some(&ext));
        assert!(q.atomics_refused().is_some_and(|r| r.contains("atomic")));
        assert!(QpCaps::from_caps(&general, Some(&roce), None).atomics_refused().is_some());
    }

    #[test]
    fn udp_sport_is_in_the_roce_range() {
        let s = roce_udp_sport(Qpn(0x11), Qpn(0x22));
        assert!(s >= 0xc000);
        // fl = 0x11 * 0x22 = 0x242 (no folding needed): sport = 0x242 | 0xc000.
        assert_eq!(s, 0xc242);
    }
}
