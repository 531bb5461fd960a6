//! Ethernet transport objects (`mlx5_ifc.h`: `create_tis_in/out`, `tisc`, `destroy_tis_in`, `create_sq_in/out`,
//! `sqc`, `wq`, `modify_sq_in`, `destroy_sq_in`, `query_sq_in/out`, `create_rq_in/out`, `rqc`, `modify_rq_in`,
//! `destroy_rq_in`, `query_rq_in/out`, `create_tir_in/out`, `tirc`, `destroy_tir_in`,
//! `query_special_contexts_in/out`, the ETHERNET_OFFLOADS capability block
//! `per_protocol_networking_offload_caps` and `nic_vport_context.min_wqe_inline_mode`; docs/reference/mlx5.md
//! §i). Offsets were taken with `offsetof` over Linux 6.12's `mlx5_ifc.h`; every `*_in` below that carries a
//! context has it at byte 0x20 (bit 0x100), and the SQ/RQ `wq` sits 0x30 bytes into `sqc`/`rqc`, so at byte
//! 0x50 of the command, with its `pas[]` at byte 0x110.

use crate::command::{Command, Output};
use crate::field::{Field, Field64};
use crate::handles::{Cqn, Pdn, Tdn, UarPage};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID, PAS, put_pas, with_pas};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_ALLOC_Q_COUNTER, MLX5_CMD_OP_CREATE_RQ, MLX5_CMD_OP_CREATE_SQ, MLX5_CMD_OP_CREATE_TIR,
    MLX5_CMD_OP_CREATE_TIS, MLX5_CMD_OP_DEALLOC_Q_COUNTER, MLX5_CMD_OP_DESTROY_RQ, MLX5_CMD_OP_DESTROY_SQ,
    MLX5_CMD_OP_DESTROY_TIR, MLX5_CMD_OP_DESTROY_TIS, MLX5_CMD_OP_MODIFY_RQ, MLX5_CMD_OP_MODIFY_SQ,
    MLX5_CMD_OP_QUERY_Q_COUNTER, MLX5_CMD_OP_QUERY_RQ, MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS, MLX5_CMD_OP_QUERY_SQ,
};

/// `create_tis_in` (0xc0 bytes), `create_{sq,rq,tir}_in` / `modify_{sq,rq}_in` / `query_{sq,rq}_out` fixed
/// parts (0x110 bytes), `query_special_contexts_out` (0x20 bytes).
pub const CREATE_TIS_IN_LEN: usize = 0xc0;
pub const CTX_CMD_LEN: usize = 0x110;
pub const QUERY_SPECIAL_CONTEXTS_OUT_LEN: usize = 0x20;

/// `wq.wq_type` (`mlx5_ifc.h` `MLX5_WQ_TYPE_*`).
pub const MLX5_WQ_TYPE_LINKED_LIST: u8 = 0;
pub const MLX5_WQ_TYPE_CYCLIC: u8 = 1;
/// `sqc.state` / `rqc.state` (`MLX5_SQC_STATE_*`, `MLX5_RQC_STATE_*`: the same numbers).
pub const MLX5_WQ_STATE_RST: u8 = 0;
pub const MLX5_WQ_STATE_RDY: u8 = 1;
pub const MLX5_WQ_STATE_ERR: u8 = 3;
/// `tirc.disp_type` (`MLX5_TIRC_DISP_TYPE_*`).
pub const MLX5_TIRC_DISP_TYPE_DIRECT: u8 = 0;
pub const MLX5_TIRC_DISP_TYPE_INDIRECT: u8 = 1;

/// `per_protocol_networking_offload_caps.wqe_inline_mode` (Linux `vport.h` `MLX5_CAP_INLINE_MODE_*`).
pub const MLX5_CAP_INLINE_MODE_L2: u8 = 0;
pub const MLX5_CAP_INLINE_MODE_VPORT_CONTEXT: u8 = 1;
pub const MLX5_CAP_INLINE_MODE_NOT_REQUIRED: u8 = 2;
/// `sqc.min_wqe_inline_mode` / `nic_vport_context.min_wqe_inline_mode` (`device.h` `MLX5_INLINE_MODE_*`).
pub const MLX5_INLINE_MODE_NONE: u8 = 0;
pub const MLX5_INLINE_MODE_L2: u8 = 1;
pub const MLX5_INLINE_MODE_IP: u8 = 2;
pub const MLX5_INLINE_MODE_TCP_UDP: u8 = 3;

/// The context every context-carrying command here holds, at byte 0x20.
const CTX: usize = 0x100;
/// `sqc.wq` / `rqc.wq` at bit 0x180 of the context.
const WQ: usize = CTX + sqc::WQ;

/// `tisc`, offsets from its start.
pub mod tisc {
    use crate::field::Field;
    pub const TRANSPORT_DOMAIN: Field = Field::new(0x128, 24);
}

/// `sqc`, offsets from its start.
pub mod sqc {
    use crate::field::Field;
    pub const RLKY: Field = Field::new(0x00, 1);
    pub const FLUSH_IN_ERROR_EN: Field = Field::new(0x03, 1);
    pub const MIN_WQE_INLINE_MODE: Field = Field::new(0x05, 3);
    pub const STATE: Field = Field::new(0x08, 4);
    pub const CQN: Field = Field::new(0x48, 24);
    pub const TIS_LST_SZ: Field = Field::new(0x100, 16);
    pub const TIS_NUM_0: Field = Field::new(0x168, 24);
    /// `wq` ([`super::wq`]).
    pub const WQ: usize = 0x180;
}

/// `rqc`, offsets from its start (its `wq` sits where `sqc`'s does).
pub mod rqc {
    use crate::field::Field;
    pub const RLKY: Field = Field::new(0x00, 1);
    /// `vsd`: VLAN stripping disabled.
    pub const VSD: Field = Field::new(0x03, 1);
    pub const STATE: Field = Field::new(0x08, 4);
    pub const CQN: Field = Field::new(0x48, 24);
    pub const COUNTER_SET_ID: Field = Field::new(0x60, 8);
}

/// `wq`, offsets from its start.
pub mod wq {
    use crate::field::{Field, Field64};
    pub const WQ_TYPE: Field = Field::new(0x00, 4);
    pub const PD: Field = Field::new(0x48, 24);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const DBR_ADDR: Field64 = Field64::new(0x80);
    pub const HW_COUNTER: Field = Field::new(0xc0, 32);
    pub const SW_COUNTER: Field = Field::new(0xe0, 32);
    pub const LOG_WQ_STRIDE: Field = Field::new(0x10c, 4);
    pub const LOG_WQ_PG_SZ: Field = Field::new(0x113, 5);
    pub const LOG_WQ_SZ: Field = Field::new(0x11b, 5);
}

/// `tirc`, offsets from its start.
pub mod tirc {
    use crate::field::Field;
    pub const DISP_TYPE: Field = Field::new(0x20, 4);
    pub const INLINE_RQN: Field = Field::new(0xe8, 24);
    pub const TRANSPORT_DOMAIN: Field = Field::new(0x128, 24);
}

/// `modify_sq_in.sq_state` / `modify_rq_in.rq_state` (the current state), the queue number, `modify_bitmask`.
const MODIFY_CUR_STATE: Field = Field::new(0x40, 4);
const MODIFY_BITMASK: Field64 = Field64::new(0x80);
/// The queue or object number of `create_*_out`, `destroy_*_in`, `query_*_in`, `modify_*_in`.
const NUMBER: Field = OBJECT_ID;

fn handle_cmd(opcode: u16, name: &'static str, handle: u32) -> Command {
    let mut c = Command::new(opcode, 0, CMD_HDR_LEN, CMD_HDR_LEN).with(name, handle.into());
    c.set(NUMBER, handle);
    c
}

/// `create_*_out.{tisn,sqn,rqn,tirn}`: bit 0x48, 24 bits.
fn created(out: &Output) -> u32 {
    out.get(NUMBER)
}

/// CREATE_TIS in transport domain `td` (`tisc.prio` 0; Linux `mlx5e_create_tis`).
pub fn create_tis(td: Tdn) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_TIS, 0, CREATE_TIS_IN_LEN, CMD_HDR_LEN).with("td", td.0.into());
    c.set(tisc::TRANSPORT_DOMAIN.at(CTX), td.0);
    c
}

pub fn create_tis_out(out: &Output) -> u32 {
    created(out)
}

pub fn destroy_tis(tisn: u32) -> Command {
    handle_cmd(MLX5_CMD_OP_DESTROY_TIS, "tisn", tisn)
}

/// The `wq` of an SQ or RQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WqParams<'a> {
    pub wq_type: u8,
    pub pd: Pdn,
    /// The UAR page whose doorbell rings this WQ (SQ); 0 for an RQ (rung through its doorbell record only).
    pub uar_page: UarPage,
    pub dbr_addr: u64,
    /// log2 of the WQE stride in bytes (6 = 64-byte send WQE basic blocks; 4 = one 16-byte data segment).
    pub log_wq_stride: u8,
    /// log2(page / 4 KiB) of `pages`.
    pub log_wq_pg_sz: u8,
    /// log2 of the number of WQEs (strides).
    pub log_wq_sz: u8,
    pub pages: &'a [u64],
}

fn put_wq(c: &mut Command, w: &WqParams<'_>) {
    c.set(wq::WQ_TYPE.at(WQ), w.wq_type.into());
    c.set(wq::PD.at(WQ), w.pd.0);
    c.set(wq::UAR_PAGE.at(WQ), w.uar_page.0);
    c.set64(wq::DBR_ADDR.at(WQ), w.dbr_addr);
    c.set(wq::LOG_WQ_STRIDE.at(WQ), w.log_wq_stride.into());
    c.set(wq::LOG_WQ_PG_SZ.at(WQ), w.log_wq_pg_sz.into());
    c.set(wq::LOG_WQ_SZ.at(WQ), w.log_wq_sz.into());
    put_pas(c, PAS, w.pages);
}

/// What a created SQ gets (Linux `mlx5e_create_sq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqParams<'a> {
    /// `sqc.rlky`: the reserved lkey (QUERY_SPECIAL_CONTEXTS `resd_lkey`) may be used in this queue's WQEs.
    pub rlky: bool,
    pub cqn: Cqn,
    pub tisn: u32,
    /// `sqc.min_wqe_inline_mode`, set only when the capability says the vport context decides
    /// (`MLX5_CAP_INLINE_MODE_VPORT_CONTEXT`), as Linux does; `None` leaves it 0.
    pub min_wqe_inline_mode: Option<u8>,
    pub wq: WqParams<'a>,
}

/// CREATE_SQ in state RST: `flush_in_error_en`, `cqn`, one TIS (`tis_lst_sz` 1, `tis_num_0`), the `wq` and its
/// pages.
pub fn create_sq(p: &SqParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_SQ, 0, with_pas(CTX_CMD_LEN, p.wq.pages.len()), CMD_HDR_LEN)
        .with("cqn", p.cqn.0.into())
        .with("tisn", p.tisn.into())
        .with("log_wq_sz", p.wq.log_wq_sz.into());
    c.set(sqc::RLKY.at(CTX), p.rlky as u32);
    c.set(sqc::FLUSH_IN_ERROR_EN.at(CTX), 1);
    if let Some(m) = p.min_wqe_inline_mode {
        c.set(sqc::MIN_WQE_INLINE_MODE.at(CTX), m.into());
    }
    c.set(sqc::STATE.at(CTX), MLX5_WQ_STATE_RST.into());
    c.set(sqc::CQN.at(CTX), p.cqn.0);
    c.set(sqc::TIS_LST_SZ.at(CTX), 1);
    c.set(sqc::TIS_NUM_0.at(CTX), p.tisn);
    put_wq(&mut c, &p.wq);
    c
}

pub fn create_sq_out(out: &Output) -> u32 {
    created(out)
}

/// MODIFY_SQ `from` → `to` (`modify_sq_in.sq_state` the current state, `sqc.state` the next). The
/// `modify_bitmask` stays 0: Linux `mlx5e_modify_sq` sets bits only for rate-limit and QoS-group updates.
pub fn modify_sq(sqn: u32, from: u8, to: u8) -> Command {
    modify_wq(MLX5_CMD_OP_MODIFY_SQ, "sqn", sqn, from, to)
}

/// MODIFY_SQ / MODIFY_RQ share their layout: the current state at bit 0x40, the queue number at 0x48, the
/// 64-bit `modify_bitmask` at byte 0x10 and the next state in the context's `state` (`sqc`/`rqc` bit 8).
fn modify_wq(opcode: u16, name: &'static str, n: u32, from: u8, to: u8) -> Command {
    let mut c = Command::new(opcode, 0, CTX_CMD_LEN, CMD_HDR_LEN)
        .with(name, n.into())
        .with("from", from.into())
        .with("to", to.into());
    c.set(MODIFY_CUR_STATE, from.into());
    c.set(NUMBER, n);
    c.set64(MODIFY_BITMASK, 0);
    c.set(sqc::STATE.at(CTX), to.into());
    c
}

pub fn destroy_sq(sqn: u32) -> Command {
    handle_cmd(MLX5_CMD_OP_DESTROY_SQ, "sqn", sqn)
}

pub fn query_sq(sqn: u32) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_QUERY_SQ, 0, CMD_HDR_LEN, CTX_CMD_LEN).with("sqn", sqn.into());
    c.set(NUMBER, sqn);
    c
}

/// The `wq` fields a query returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WqInfo {
    pub wq_type: u8,
    pub pd: Pdn,
    pub uar_page: UarPage,
    pub dbr_addr: u64,
    pub log_wq_stride: u8,
    pub log_wq_pg_sz: u8,
    pub log_wq_sz: u8,
    /// `wq.hw_counter` (bit 0xc0) and `wq.sw_counter` (bit 0xe0).
    pub hw_counter: u32,
    pub sw_counter: u32,
}

fn wq_info(out: &Output) -> WqInfo {
    let g = |f: Field| out.get(f.at(WQ));
    WqInfo {
        wq_type: g(wq::WQ_TYPE) as u8,
        pd: Pdn(g(wq::PD)),
        uar_page: UarPage(g(wq::UAR_PAGE)),
        dbr_addr: out.get64(wq::DBR_ADDR.at(WQ)),
        log_wq_stride: g(wq::LOG_WQ_STRIDE) as u8,
        log_wq_pg_sz: g(wq::LOG_WQ_PG_SZ) as u8,
        log_wq_sz: g(wq::LOG_WQ_SZ) as u8,
        hw_counter: g(wq::HW_COUNTER),
        sw_counter: g(wq::SW_COUNTER),
    }
}

/// `query_sq_out.sq_context` fields we check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqInfo {
    pub rlky: bool,
    pub state: u8,
    pub min_wqe_inline_mode: u8,
    pub cqn: Cqn,
    pub tisn: u32,
    pub wq: WqInfo,
}

pub fn query_sq_out(out: &Output) -> SqInfo {
    let g = |f: Field| out.get(f.at(CTX));
    SqInfo {
        rlky: g(sqc::RLKY) != 0,
        state: g(sqc::STATE) as u8,
        min_wqe_inline_mode: g(sqc::MIN_WQE_INLINE_MODE) as u8,
        cqn: Cqn(g(sqc::CQN)),
        tisn: g(sqc::TIS_NUM_0),
        wq: wq_info(out),
    }
}

/// What a created RQ gets (Linux `mlx5e_create_rq` with a cyclic WQ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RqParams<'a> {
    /// `rqc.rlky`: the reserved lkey may be used in this queue's WQEs.
    pub rlky: bool,
    pub cqn: Cqn,
    /// `rqc.vsd`: VLAN stripping disabled (frames arrive as sent).
    pub vlan_strip_disable: bool,
    /// `rqc.counter_set_id`: the Q counter the RQ counts into (0: none).
    pub counter_set_id: u8,
    pub wq: WqParams<'a>,
}

/// CREATE_RQ in state RST (`mem_rq_type` 0: the RQ's own memory).
pub fn create_rq(p: &RqParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_RQ, 0, with_pas(CTX_CMD_LEN, p.wq.pages.len()), CMD_HDR_LEN)
        .with("cqn", p.cqn.0.into())
        .with("log_wq_sz", p.wq.log_wq_sz.into());
    c.set(rqc::RLKY.at(CTX), p.rlky as u32);
    c.set(rqc::VSD.at(CTX), p.vlan_strip_disable as u32);
    c.set(rqc::STATE.at(CTX), MLX5_WQ_STATE_RST.into());
    c.set(rqc::CQN.at(CTX), p.cqn.0);
    c.set(rqc::COUNTER_SET_ID.at(CTX), p.counter_set_id.into());
    put_wq(&mut c, &p.wq);
    c
}

pub fn create_rq_out(out: &Output) -> u32 {
    created(out)
}

/// MODIFY_RQ `from` → `to` (`modify_bitmask` 0, as Linux `mlx5e_modify_rq_state`).
pub fn modify_rq(rqn: u32, from: u8, to: u8) -> Command {
    modify_wq(MLX5_CMD_OP_MODIFY_RQ, "rqn", rqn, from, to)
}

pub fn destroy_rq(rqn: u32) -> Command {
    handle_cmd(MLX5_CMD_OP_DESTROY_RQ, "rqn", rqn)
}

pub fn query_rq(rqn: u32) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_QUERY_RQ, 0, CMD_HDR_LEN, CTX_CMD_LEN).with("rqn", rqn.into());
    c.set(NUMBER, rqn);
    c
}

/// `query_rq_out.rq_context` fields we check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RqInfo {
    pub rlky: bool,
    pub state: u8,
    pub vlan_strip_disable: bool,
    pub cqn: Cqn,
    pub wq: WqInfo,
}

pub fn query_rq_out(out: &Output) -> RqInfo {
    let g = |f: Field| out.get(f.at(CTX));
    RqInfo {
        rlky: g(rqc::RLKY) != 0,
        state: g(rqc::STATE) as u8,
        vlan_strip_disable: g(rqc::VSD) != 0,
        cqn: Cqn(g(rqc::CQN)),
        wq: wq_info(out),
    }
}

/// CREATE_TIR dispatching directly to `rqn` (`disp_type` DIRECT, `inline_rqn`) in transport domain `td`.
pub fn create_tir_direct(td: Tdn, rqn: u32) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_TIR, 0, CTX_CMD_LEN, CMD_HDR_LEN)
        .with("td", td.0.into())
        .with("rqn", rqn.into());
    c.set(tirc::DISP_TYPE.at(CTX), MLX5_TIRC_DISP_TYPE_DIRECT.into());
    c.set(tirc::INLINE_RQN.at(CTX), rqn);
    c.set(tirc::TRANSPORT_DOMAIN.at(CTX), td.0);
    c
}

pub fn create_tir_out(out: &Output) -> u32 {
    created(out)
}

pub fn destroy_tir(tirn: u32) -> Command {
    handle_cmd(MLX5_CMD_OP_DESTROY_TIR, "tirn", tirn)
}

/// `query_q_counter_in` (0x20 bytes) and `query_q_counter_out` (0x100 bytes).
pub const QUERY_Q_COUNTER_IN_LEN: usize = 0x20;
pub const QUERY_Q_COUNTER_OUT_LEN: usize = 0x100;

/// ALLOC_Q_COUNTER (Linux `mlx5e_create_q_counters`): a counter set for this function's queues.
pub fn alloc_q_counter() -> Command {
    Command::new(MLX5_CMD_OP_ALLOC_Q_COUNTER, 0, CMD_HDR_LEN, CMD_HDR_LEN)
}

/// `alloc_q_counter_out.counter_set_id` and `dealloc_q_counter_in.counter_set_id`.
const COUNTER_SET_ID: Field = Field::new(0x58, 8);
/// `query_q_counter_in.counter_set_id`.
const QUERY_COUNTER_SET_ID: Field = Field::new(0xf8, 8);
/// `query_q_counter_out.out_of_buffer`.
const OUT_OF_BUFFER: Field = Field::new(0x180, 32);

/// `alloc_q_counter_out.counter_set_id`: bit 0x58, 8 bits.
pub fn alloc_q_counter_out(out: &Output) -> u8 {
    out.get(COUNTER_SET_ID) as u8
}

/// DEALLOC_Q_COUNTER: `counter_set_id` at bit 0x58, as ALLOC returns it.
pub fn dealloc_q_counter(counter_set_id: u8) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_DEALLOC_Q_COUNTER, 0, CMD_HDR_LEN, CMD_HDR_LEN)
        .with("counter_set_id", counter_set_id.into());
    c.set(COUNTER_SET_ID, counter_set_id.into());
    c
}

/// QUERY_Q_COUNTER of our own vport (`other_vport` 0, `aggregate` 0, `clear` 0): `counter_set_id` at bit 0xF8.
pub fn query_q_counter(counter_set_id: u8) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_QUERY_Q_COUNTER, 0, QUERY_Q_COUNTER_IN_LEN, QUERY_Q_COUNTER_OUT_LEN)
        .with("counter_set_id", counter_set_id.into());
    c.set(QUERY_COUNTER_SET_ID, counter_set_id.into());
    c
}

/// `query_q_counter_out.out_of_buffer` (bit 0x180, 32 bits): frames dropped because their RQ had no WQE posted.
/// A free-running counter (it wraps).
pub fn query_q_counter_out_of_buffer(out: &Output) -> u32 {
    out.get(OUT_OF_BUFFER)
}

pub fn query_special_contexts() -> Command {
    Command::new(MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS, 0, CMD_HDR_LEN, QUERY_SPECIAL_CONTEXTS_OUT_LEN)
}

/// `query_special_contexts_out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialContexts {
    pub dump_fill_mkey: u32,
    /// The reserved lkey: local access by physical address, no MKEY needed.
    pub resd_lkey: u32,
    pub null_mkey: u32,
}

/// `query_special_contexts_out.dump_fill_mkey`, `.resd_lkey`, `.null_mkey`.
const DUMP_FILL_MKEY: Field = Field::new(0x40, 32);
const RESD_LKEY: Field = Field::new(0x60, 32);
const NULL_MKEY: Field = Field::new(0x80, 32);

pub fn query_special_contexts_out(out: &Output) -> SpecialContexts {
    SpecialContexts {
        dump_fill_mkey: out.get(DUMP_FILL_MKEY),
        resd_lkey: out.get(RESD_LKEY),
        null_mkey: out.get(NULL_MKEY),
    }
}

/// `per_protocol_networking_offload_caps`, the fields the driver reads.
pub mod per_protocol_networking_offload_caps {
    use crate::field::Field;
    pub const CSUM_CAP: Field = Field::new(0x00, 1);
    pub const WQE_VLAN_INSERT: Field = Field::new(0x07, 1);
    pub const WQE_INLINE_MODE: Field = Field::new(0x12, 2);
}

/// The ETHERNET_OFFLOADS capability fields we use (`per_protocol_networking_offload_caps`, the capability block
/// of QUERY_HCA_CAP op_mod `MLX5_CAP_ETHERNET_OFFLOADS << 1 | cur`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthCaps {
    pub csum_cap: bool,
    pub wqe_vlan_insert: bool,
    /// `MLX5_CAP_INLINE_MODE_*`: L2 (0), decided by the vport context (1), not required (2).
    pub wqe_inline_mode: u8,
}

impl EthCaps {
    /// Parses the block ([`crate::ifc::init::hca_cap_block`] of the query's output).
    pub fn parse(block: &[u8]) -> EthCaps {
        use per_protocol_networking_offload_caps as f;
        EthCaps {
            csum_cap: f::CSUM_CAP.read(block) != 0,
            wqe_vlan_insert: f::WQE_VLAN_INSERT.read(block) != 0,
            wqe_inline_mode: f::WQE_INLINE_MODE.read(block) as u8,
        }
    }
}

/// `nic_vport_context.min_wqe_inline_mode` from a QUERY_NIC_VPORT_CONTEXT output (context at byte 0x10).
pub fn nic_vport_min_wqe_inline_mode(out: &Output) -> u8 {
    use crate::ifc::vport::{QUERY_NIC_VPORT_CONTEXT_OUT_CTX, nic_vport_context};
    out.get(nic_vport_context::MIN_WQE_INLINE_MODE.at(QUERY_NIC_VPORT_CONTEXT_OUT_CTX)) as u8
}

/// The SQ's minimal inline mode as Linux `mlx5_query_min_inline` decides it: L2 when the capability says L2,
/// none when not required, and the vport context's `min_wqe_inline_mode` when the capability defers to it
/// (`vport` is `None` when that query failed: L2, as Linux falls back).
pub fn min_inline_mode(caps: &EthCaps, vport: Option<u8>) -> u8 {
    match caps.wqe_inline_mode {
        MLX5_CAP_INLINE_MODE_VPORT_CONTEXT => vport.unwrap_or(MLX5_INLINE_MODE_L2),
        MLX5_CAP_INLINE_MODE_NOT_REQUIRED => MLX5_INLINE_MODE_NONE,
        _ => MLX5_INLINE_MODE_L2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64, out};

    fn wq<'a>(pages: &'a [u64]) -> WqParams<'a> {
        WqParams {
            wq_type: MLX5_WQ_TYPE_CYCLIC,
            pd: Pdn(0x12),
            uar_page: UarPage(0x34),
            dbr_addr: 0x1_2345_6780,
            log_wq_stride: 6,
            log_wq_pg_sz: 0,
            log_wq_sz: 7,
            pages,
        }
    }

    #[test]
    fn tis() {
        let c = create_tis(Tdn(0xab_cdef));
        let b = c.input();
        assert_eq!((be16(b, 0), b.len(), c.out_len()), (0x912, 0xc0, 0x10));
        // tisc at byte 0x20; transport_domain at tisc bit 0x128 = byte 0x25 (24 bits of the dword at 0x44).
        assert_eq!(be32(b, 0x44), 0x00ab_cdef);
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 2 + 3);
        assert_eq!(create_tis_out(&out(0x10, &[(0x08, &[0xff, 0, 0, 7])])), 7);
        let d = destroy_tis(7);
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8), d.input().len()), (0x914, 7, 0x10));
    }

    #[test]
    fn sq() {
        let pages = [0x10_0000, 0x10_1000];
        let c = create_sq(&SqParams {
            rlky: true,
            cqn: Cqn(0x55),
            tisn: 0x66,
            min_wqe_inline_mode: Some(1),
            wq: wq(&pages),
        });
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x904, 0x110 + 16));
        // sqc dword 0 (byte 0x20): rlky bit 31, flush_in_error_en bit 28, min_wqe_inline_mode bits 26:24, state
        // bits 23:20.
        assert_eq!(be32(b, 0x20), (1 << 31) | (1 << 28) | (1 << 24));
        assert_eq!(be32(b, 0x28), 0x55); // cqn
        assert_eq!(be16(b, 0x40), 1); // tis_lst_sz
        assert_eq!(be32(b, 0x4c), 0x66); // tis_num_0 at byte 0x2d of sqc
        // wq at byte 0x50: wq_type bits 31:28, pd at 0x58, uar_page at 0x5c, dbr_addr at 0x60.
        assert_eq!(be32(b, 0x50), 1 << 28);
        assert_eq!((be32(b, 0x58), be32(b, 0x5c), be64(b, 0x60)), (0x12, 0x34, 0x1_2345_6780));
        // dword at wq byte 0x20: log_wq_stride [19:16], log_wq_pg_sz [12:8], log_wq_sz [4:0].
        assert_eq!(be32(b, 0x70), (6 << 16) | 7);
        assert_eq!((be64(b, 0x110), be64(b, 0x118)), (0x10_0000, 0x10_1000));
        let none = create_sq(&SqParams { rlky: false, cqn: Cqn(1), tisn: 2, min_wqe_inline_mode: None, wq: wq(&[]) });
        assert_eq!(be32(none.input(), 0x20), 1 << 28);
        assert_eq!(create_sq_out(&out(0x10, &[(0x08, &[0, 0, 1, 2])])), 0x102);

        let m = modify_sq(0x102, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY);
        let b = m.input();
        assert_eq!((be16(b, 0), b.len(), c.out_len()), (0x905, 0x110, 0x10));
        assert_eq!(be32(b, 0x08), 0x102); // sq_state RST (bits 31:28 = 0), sqn
        assert_eq!(be64(b, 0x10), 0); // modify_bitmask
        assert_eq!(be32(b, 0x20), 1 << 20); // sqc.state RDY
        let back = modify_sq(0x102, MLX5_WQ_STATE_RDY, MLX5_WQ_STATE_ERR);
        assert_eq!((be32(back.input(), 0x08), be32(back.input(), 0x20)), ((1 << 28) | 0x102, 3 << 20));

        let d = destroy_sq(0x102);
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8)), (0x906, 0x102));
        let q = query_sq(0x102);
        assert_eq!((be16(q.input(), 0), be32(q.input(), 8), q.out_len()), (0x907, 0x102, 0x110));
        // The create's context read back as a query output.
        let mut img =
            create_sq(&SqParams { rlky: true, cqn: Cqn(0x55), tisn: 0x66, min_wqe_inline_mode: Some(1), wq: wq(&[]) })
                .input()
                .to_vec();
        img[..0x20].fill(0);
        img[0x21] = 0x10; // state RDY
        img[0x68..0x6c].copy_from_slice(&5u32.to_be_bytes()); // hw_counter at wq byte 0x18
        let i = query_sq_out(&crate::command::Output::new(img));
        assert_eq!((i.rlky, i.state, i.min_wqe_inline_mode, i.cqn, i.tisn), (true, 1, 1, Cqn(0x55), 0x66));
        assert_eq!((i.wq.wq_type, i.wq.pd, i.wq.uar_page, i.wq.dbr_addr), (1, Pdn(0x12), UarPage(0x34), 0x1_2345_6780));
        assert_eq!((i.wq.log_wq_stride, i.wq.log_wq_sz, i.wq.hw_counter), (6, 7, 5));
    }

    #[test]
    fn rq() {
        let pages = [0x20_0000];
        let w = WqParams { uar_page: UarPage(0), log_wq_stride: 4, log_wq_sz: 9, ..wq(&pages) };
        let c =
            create_rq(&RqParams { rlky: false, cqn: Cqn(0x77), vlan_strip_disable: true, counter_set_id: 0, wq: w });
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x908, 0x118));
        assert_eq!(be32(b, 0x20), 1 << 28); // rlky 0, vsd (bit 3), mem_rq_type 0, state RST
        let r =
            create_rq(&RqParams { rlky: true, cqn: Cqn(0x77), vlan_strip_disable: false, counter_set_id: 5, wq: w });
        assert_eq!(be32(r.input(), 0x20), 1 << 31);
        // counter_set_id: rqc bit 0x60 = byte 0x2c of the command, the dword's top byte.
        assert_eq!((be32(b, 0x2c), be32(r.input(), 0x2c)), (0, 5 << 24));
        assert_eq!(be32(b, 0x28), 0x77);
        assert_eq!((be32(b, 0x50), be32(b, 0x58), be32(b, 0x5c)), (1 << 28, 0x12, 0));
        assert_eq!(be32(b, 0x70), (4 << 16) | 9);
        assert_eq!(be64(b, 0x110), 0x20_0000);
        assert_eq!(create_rq_out(&out(0x10, &[(0x09, &[0, 0, 9])])), 9);

        let m = modify_rq(9, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY);
        assert_eq!((be16(m.input(), 0), m.input().len()), (0x909, 0x110));
        assert_eq!((be32(m.input(), 0x08), be64(m.input(), 0x10), be32(m.input(), 0x20)), (9, 0, 1 << 20));
        let d = destroy_rq(9);
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8)), (0x90a, 9));
        let q = query_rq(9);
        assert_eq!((be16(q.input(), 0), be32(q.input(), 8), q.out_len()), (0x90b, 9, 0x110));
        let mut img = c.input()[..0x110].to_vec();
        img[..0x20].fill(0);
        img[0x21] |= 0x10;
        let i = query_rq_out(&crate::command::Output::new(img));
        assert_eq!((i.rlky, i.state, i.vlan_strip_disable, i.cqn), (false, 1, true, Cqn(0x77)));
        assert_eq!((i.wq.log_wq_stride, i.wq.log_wq_sz, i.wq.uar_page), (4, 9, UarPage(0)));
    }

    #[test]
    fn tir() {
        let c = create_tir_direct(Tdn(0x3), 0x12_3456);
        let b = c.input();
        assert_eq!((be16(b, 0), b.len(), c.out_len()), (0x900, 0x110, 0x10));
        assert_eq!(be32(b, 0x24), 0); // disp_type DIRECT (bits 31:28 of tirc dword 1)
        assert_eq!(be32(b, 0x3c), 0x12_3456); // inline_rqn: tirc bit 0xe8 = byte 0x1d
        assert_eq!(be32(b, 0x44), 3); // transport_domain: tirc bit 0x128 = byte 0x25; rx_hash_fn 0
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 1 + 3 + 1); // opcode 0x0900, rqn, td
        assert_eq!(create_tir_out(&out(0x10, &[(0x0b, &[0x42])])), 0x42);
        let d = destroy_tir(0x42);
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8)), (0x902, 0x42));
    }

    #[test]
    fn q_counters() {
        let a = alloc_q_counter();
        assert_eq!((be16(a.input(), 0), a.input().len(), a.out_len()), (0x771, 0x10, 0x10));
        // counter_set_id: bit 0x58 = byte 0xb, in the output of ALLOC and the input of DEALLOC.
        assert_eq!(alloc_q_counter_out(&out(0x10, &[(0x0b, &[7])])), 7);
        let d = dealloc_q_counter(7);
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8), d.input().len()), (0x772, 7, 0x10));
        // QUERY: 0x20 bytes in, counter_set_id at bit 0xF8 = byte 0x1f, clear (bit 0xC0) 0; 0x100 bytes out.
        let q = query_q_counter(7);
        assert_eq!((be16(q.input(), 0), q.input().len(), q.out_len()), (0x773, 0x20, 0x100));
        assert_eq!((be32(q.input(), 0x18), be32(q.input(), 0x1c)), (0, 7));
        assert_eq!(q.input().iter().filter(|&&x| x != 0).count(), 2 + 1);
        // out_of_buffer: bit 0x180 = byte 0x30.
        assert_eq!(query_q_counter_out_of_buffer(&out(0x100, &[(0x30, &[0, 1, 0, 2])])), 0x1_0002);
    }

    #[test]
    fn special_contexts() {
        let q = query_special_contexts();
        assert_eq!((be16(q.input(), 0), q.input().len(), q.out_len()), (0x203, 0x10, 0x20));
        let o = out(0x20, &[(0x08, &[0, 0, 0, 1]), (0x0c, &[0, 0, 0x01, 0x00]), (0x10, &[0, 0, 0, 3])]);
        assert_eq!(
            query_special_contexts_out(&o),
            SpecialContexts { dump_fill_mkey: 1, resd_lkey: 0x100, null_mkey: 3 }
        );
    }

    #[test]
    fn ethernet_caps_and_inline_mode() {
        // Byte 0: csum_cap bit 7, wqe_vlan_insert bit 0; byte 2 bits 5:4 wqe_inline_mode (bit 0x12, 2 wide).
        let mut block = [0u8; 0x100];
        block[0] = 0x81;
        block[2] = 0x10;
        let c = EthCaps::parse(&block);
        assert_eq!(c, EthCaps { csum_cap: true, wqe_vlan_insert: true, wqe_inline_mode: 1 });
        assert_eq!(EthCaps::parse(&[]), EthCaps::default());
        assert_eq!(min_inline_mode(&c, Some(MLX5_INLINE_MODE_IP)), MLX5_INLINE_MODE_IP);
        assert_eq!(min_inline_mode(&c, None), MLX5_INLINE_MODE_L2);
        let l2 = EthCaps { wqe_inline_mode: MLX5_CAP_INLINE_MODE_L2, ..c };
        assert_eq!(min_inline_mode(&l2, Some(MLX5_INLINE_MODE_NONE)), MLX5_INLINE_MODE_L2);
        let none = EthCaps { wqe_inline_mode: MLX5_CAP_INLINE_MODE_NOT_REQUIRED, ..c };
        assert_eq!(min_inline_mode(&none, Some(MLX5_INLINE_MODE_L2)), MLX5_INLINE_MODE_NONE);
        // nic_vport_context at byte 0x10 of the output; min_wqe_inline_mode bits 26:24 of its dword 0.
        assert_eq!(nic_vport_min_wqe_inline_mode(&out(0x110, &[(0x10, &[0x03])])), 3);
        let q = crate::ifc::init::query_hca_cap(
            crate::ifc::init::MLX5_CAP_ETHERNET_OFFLOADS,
            crate::ifc::init::CapMode::Cur,
        );
        assert_eq!(be16(q.input(), 6), 3);
    }
}
