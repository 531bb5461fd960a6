//! The Ethernet objects' commands (`mlx5_ifc.h`): CREATE/DESTROY_TIS (`create_tis_in`, `tisc`),
//! CREATE/MODIFY/DESTROY/QUERY_SQ (`create_sq_in`, `modify_sq_in`, `query_sq_out`, `sqc`, `wq`),
//! CREATE/MODIFY/DESTROY/QUERY_RQ (`create_rq_in`, `modify_rq_in`, `query_rq_out`, `rqc`),
//! CREATE/DESTROY_TIR (`create_tir_in`, `tirc`; direct dispatch only) and QUERY_SPECIAL_CONTEXTS
//! (`query_special_contexts_out`). Every `*_in` puts its context at byte 0x20 (`reserved_at_40[0xc0]` before
//! it); `sqc`/`rqc` hold `wq` at byte 0x30 and the PAS list follows at 0x110. Only the fields listed as known
//! may be non-zero; the others (hairpin, rate limits, UMEM, striding RQs, LRO, RSS…) are refused.

use super::eq::{pages_for, read_pas};
use super::{CmdError, CmdResult, Ctx, need_initialized, reason, status};
use crate::eth::{self, Rq, Sq, Tir, Tis, Wq, WqState, wq};
use crate::hca::Hca;
use crate::ifc::{self, Field};

/// Byte of the context in every create/modify input and query output.
const CTX: u32 = 0x20;
/// `wq` inside `sqc` / `rqc`.
const WQ: u32 = 0x30;
/// Fixed size of create_sq_in / create_rq_in / modify_*_in / query_*_out (the PAS list follows).
const QUEUE_IN_SIZE: usize = 0x110;
/// `sqc` / `rqc` with their `wq` (0xf0 bytes).
const QUEUE_CTX_SIZE: usize = 0xf0;
/// The object number in every `*_out` and destroy/query input (`sqn`, `rqn`, `tisn`, `tirn`).
const NUMBER: Field = Field::new(0x48, 24);
/// `modify_*_in`: current state, then the 64-bit `modify_bitmask`.
const MODIFY_CUR_STATE: Field = Field::new(0x40, 4);
const MODIFY_BITMASK_HI: Field = Field::new(0x80, 32);
const MODIFY_BITMASK_LO: Field = Field::new(0xa0, 32);
/// `MLX5_MODIFY_RQ_BITMASK_VSD`.
const RQ_BITMASK_VSD: u32 = 1 << 1;

/// `cmd_hca_cap` limits (bit offsets).
mod cap {
    use crate::ifc::Field;
    pub const LOG_MAX_RQ: Field = Field::new(0x363, 5);
    pub const LOG_MAX_SQ: Field = Field::new(0x36b, 5);
    pub const LOG_MAX_TIR: Field = Field::new(0x373, 5);
    pub const LOG_MAX_TIS: Field = Field::new(0x37b, 5);
    pub const LOG_MAX_WQ_SZ: Field = Field::new(0x3db, 5);
}

mod sqc {
    use crate::ifc::Field;
    pub const RLKY: Field = Field::new(0x00, 1);
    pub const FLUSH_IN_ERROR_EN: Field = Field::new(0x03, 1);
    pub const MIN_WQE_INLINE_MODE: Field = Field::new(0x05, 3);
    pub const STATE: Field = Field::new(0x08, 4);
    pub const TS_FORMAT: Field = Field::new(0x1a, 2);
    pub const USER_INDEX: Field = Field::new(0x28, 24);
    pub const CQN: Field = Field::new(0x48, 24);
    pub const TIS_LST_SZ: Field = Field::new(0x100, 16);
    pub const TIS_NUM_0: Field = Field::new(0x168, 24);
}

mod rqc {
    use crate::ifc::Field;
    pub const RLKY: Field = Field::new(0x00, 1);
    pub const VSD: Field = Field::new(0x03, 1);
    pub const MEM_RQ_TYPE: Field = Field::new(0x04, 4);
    pub const STATE: Field = Field::new(0x08, 4);
    pub const FLUSH_IN_ERROR_EN: Field = Field::new(0x0d, 1);
    pub const TS_FORMAT: Field = Field::new(0x1a, 2);
    pub const USER_INDEX: Field = Field::new(0x28, 24);
    pub const CQN: Field = Field::new(0x48, 24);
    pub const COUNTER_SET_ID: Field = Field::new(0x60, 8);
}

mod tisc {
    use crate::ifc::Field;
    pub const SIZE: usize = 0xa0;
    pub const PRIO: Field = Field::new(0x0c, 4);
    pub const TRANSPORT_DOMAIN: Field = Field::new(0x128, 24);
}

mod tirc {
    use crate::ifc::Field;
    pub const SIZE: usize = 0xf0;
    pub const DISP_TYPE: Field = Field::new(0x20, 4);
    pub const INLINE_RQN: Field = Field::new(0xe8, 24);
    pub const RX_HASH_FN: Field = Field::new(0x120, 4);
    pub const SELF_LB_BLOCK: Field = Field::new(0x126, 2);
    pub const TRANSPORT_DOMAIN: Field = Field::new(0x128, 24);
}

/// `query_special_contexts_out` (0x20 bytes): `dump_fill_mkey`, `resd_lkey`, `null_mkey`.
const RESD_LKEY: Field = Field::new(0x60, 32);
const SPECIAL_CONTEXTS_OUT_SIZE: usize = 0x20;

/// Largest WQ page (`log_wq_pg_sz`), as for EQ/CQ PAS pages.
const MAX_LOG_WQ_PG_SZ: u32 = 18;
/// `ts_format` values accepted: those the current `sq_ts_format` / `rq_ts_format` cap offers
/// (`caps::ts_format_offered`; both profiles say free running only, so REAL_TIME is refused).
fn ts_ok(hca: &Hca, cap: Field, ts: u32) -> bool {
    crate::caps::ts_format_offered(hca.caps.general(cap), ts)
}

fn bad(c: &Ctx, why: u16) -> CmdError {
    c.err(status::BAD_PARAM, why)
}

/// Absolute fields of a context at `CTX`.
fn at_ctx(f: &[Field]) -> impl Iterator<Item = Field> + '_ {
    f.iter().map(|x| x.at(CTX))
}

/// The `wq` fields a create may set (absolute), and the two dwords of `dbr_addr`.
fn wq_known() -> Vec<Field> {
    let base = CTX + WQ;
    let dbr = (base + wq::DBR_ADDR as u32) * 8;
    [wq::WQ_TYPE, wq::END_PADDING_MODE, wq::PD, wq::UAR_PAGE, wq::LOG_WQ_STRIDE, wq::LOG_WQ_PG_SZ, wq::LOG_WQ_SZ]
        .iter()
        .map(|f| f.at(base))
        .chain([Field::new(dbr, 32), Field::new(dbr + 32, 32)])
        .collect()
}

/// Decodes and checks the `wq` of a create: cyclic, PD and UAR (when `needs_uar`) allocated, doorbell record
/// 8-byte aligned in RAM, stride in `strides`, size within `log_max_wq_sz`, PAS pages as for CQs.
fn read_wq(hca: &Hca, c: &Ctx, strides: std::ops::RangeInclusive<u32>, needs_uar: bool) -> Result<Wq, CmdError> {
    let w = |f: Field| c.get(f.at(CTX + WQ));
    if w(wq::WQ_TYPE) != wq::TYPE_CYCLIC || w(wq::END_PADDING_MODE) > 1 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let pd = w(wq::PD);
    if !hca.pds.contains(&pd) {
        return Err(bad(c, reason::BAD_PD));
    }
    let uar_page = w(wq::UAR_PAGE);
    if (needs_uar || uar_page != 0) && !hca.uars.contains(&uar_page) {
        return Err(bad(c, reason::QP_BAD_UAR));
    }
    let dbr_addr = ifc::get64(c.input, (CTX + WQ) as usize + wq::DBR_ADDR);
    if !dbr_addr.is_multiple_of(8) || !c.ram.holds(dbr_addr, 8) {
        return Err(bad(c, reason::BAD_DOORBELL_RECORD));
    }
    let (log_stride, log_page_size, log_size) = (w(wq::LOG_WQ_STRIDE), w(wq::LOG_WQ_PG_SZ), w(wq::LOG_WQ_SZ));
    if !strides.contains(&log_stride) || log_size > hca.caps.general(cap::LOG_MAX_WQ_SZ) {
        return Err(bad(c, reason::QP_BAD_SIZE));
    }
    if log_page_size > MAX_LOG_WQ_PG_SZ {
        return Err(bad(c, reason::BAD_PAGE_SIZE));
    }
    let pas = read_pas(hca, c, pages_for(log_size, log_stride, log_page_size), log_page_size)?;
    Ok(Wq {
        pd,
        uar_page,
        dbr_addr,
        log_stride: log_stride as u8,
        log_page_size: log_page_size as u8,
        log_size: log_size as u8,
        pas,
    })
}

pub fn create_tis(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(CTX as usize + tisc::SIZE)?;
    c.op_mod_in(&[0])?;
    let known: Vec<Field> = at_ctx(&[tisc::PRIO, tisc::TRANSPORT_DOMAIN]).collect();
    c.reserved_zero(CTX as usize + tisc::SIZE, &known)?;
    need_initialized(hca, c)?;
    let td = c.get(tisc::TRANSPORT_DOMAIN.at(CTX));
    if !hca.tds.contains(&td) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    let mut out = c.output(0x10)?;
    let Some(n) = eth::free_number(&hca.eth.tises, hca.caps.general(cap::LOG_MAX_TIS)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    hca.eth.tises.insert(n, Tis { transport_domain: td, prio: c.get(tisc::PRIO.at(CTX)) as u8 });
    ifc::set(&mut out, NUMBER, n);
    Ok(out)
}

/// The number a destroy/query input names, after the common checks.
fn number(hca: &Hca, c: &Ctx) -> Result<u32, CmdError> {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[NUMBER])?;
    need_initialized(hca, c)?;
    Ok(c.get(NUMBER))
}

pub fn destroy_tis(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    if !hca.eth.tises.contains_key(&n) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    if hca.eth.sqs.values().any(|s| s.tisn == n) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    hca.eth.tises.remove(&n);
    Ok(out)
}

pub fn create_sq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(QUEUE_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    let mut known: Vec<Field> = at_ctx(&[
        sqc::RLKY,
        sqc::FLUSH_IN_ERROR_EN,
        sqc::MIN_WQE_INLINE_MODE,
        sqc::STATE,
        sqc::TS_FORMAT,
        sqc::USER_INDEX,
        sqc::CQN,
        sqc::TIS_LST_SZ,
        sqc::TIS_NUM_0,
    ])
    .collect();
    known.extend(wq_known());
    c.reserved_zero(QUEUE_IN_SIZE, &known)?;
    need_initialized(hca, c)?;
    let q = |f: Field| c.get(f.at(CTX));
    if q(sqc::STATE) != WqState::Rst.code() {
        return Err(bad(c, reason::QP_WRONG_STATE));
    }
    if q(sqc::MIN_WQE_INLINE_MODE) > u32::from(crate::eth::frame::inline_mode::TCP_UDP)
        || !ts_ok(hca, crate::caps::cmd_hca_cap::SQ_TS_FORMAT, q(sqc::TS_FORMAT))
    {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let cqn = q(sqc::CQN);
    if !hca.cqs.cqs.contains_key(&cqn) {
        return Err(bad(c, reason::QP_BAD_CQ));
    }
    // One TIS per SQ (`tis_lst_sz` 1, as Linux sets it).
    let tisn = q(sqc::TIS_NUM_0);
    if q(sqc::TIS_LST_SZ) != 1 || !hca.eth.tises.contains_key(&tisn) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    // 64-byte WQEBBs.
    let wq = read_wq(hca, c, 6..=6, true)?;
    let mut out = c.output(0x10)?;
    let Some(sqn) = eth::free_number(&hca.eth.sqs, hca.caps.general(cap::LOG_MAX_SQ)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    let ctx = c.input[CTX as usize..CTX as usize + QUEUE_CTX_SIZE].to_vec();
    hca.eth.sqs.insert(
        sqn,
        Sq {
            sqn,
            state: WqState::Rst,
            cqn,
            tisn,
            min_inline_mode: q(sqc::MIN_WQE_INLINE_MODE) as u8,
            rlky: q(sqc::RLKY) == 1,
            flush_in_error: q(sqc::FLUSH_IN_ERROR_EN) == 1,
            wq,
            ctx,
            cc: 0,
        },
    );
    ifc::set(&mut out, NUMBER, sqn);
    Ok(out)
}

/// Legal SQ/RQ transitions (Linux `mlx5e_modify_sq` / `mlx5e_modify_rq_state` and its recovery paths):
/// RST→RDY, RDY→ERR, RDY→RST, ERR→RST, and RDY→RDY (an RQ's VSD change through `modify_bitmask`).
fn legal(from: WqState, to: WqState) -> bool {
    matches!(
        (from, to),
        (WqState::Rst, WqState::Rdy)
            | (WqState::Rdy, WqState::Err)
            | (WqState::Rdy, WqState::Rst)
            | (WqState::Err, WqState::Rst)
            | (WqState::Rdy, WqState::Rdy)
    )
}

/// Common part of MODIFY_SQ / MODIFY_RQ: (number, current state claimed, next state, modify_bitmask).
fn modify_common(c: &Ctx, state: Field, extra: &[Field]) -> Result<(u32, WqState, WqState, u64), CmdError> {
    c.need_input(QUEUE_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    let mut known = vec![MODIFY_CUR_STATE, NUMBER, MODIFY_BITMASK_HI, MODIFY_BITMASK_LO, state.at(CTX)];
    known.extend(extra.iter().map(|f| f.at(CTX)));
    c.reserved_zero(QUEUE_IN_SIZE, &known)?;
    let cur = WqState::from_code(c.get(MODIFY_CUR_STATE)).ok_or_else(|| bad(c, reason::QP_BAD_FIELD))?;
    let next = WqState::from_code(c.get(state.at(CTX))).ok_or_else(|| bad(c, reason::QP_BAD_FIELD))?;
    let mask = (u64::from(c.get(MODIFY_BITMASK_HI)) << 32) | u64::from(c.get(MODIFY_BITMASK_LO));
    Ok((c.get(NUMBER), cur, next, mask))
}

pub fn modify_sq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let (sqn, cur, next, mask) = modify_common(c, sqc::STATE, &[])?;
    need_initialized(hca, c)?;
    // Rate limits and QoS groups (the only modify_bitmask bits for an SQ) are not modelled.
    if mask != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let Some(sq) = hca.eth.sqs.get_mut(&sqn) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if sq.state != cur || !legal(cur, next) || (cur, next) == (WqState::Rdy, WqState::Rdy) {
        return Err(c.err(status::BAD_RES_STATE, reason::QP_WRONG_STATE));
    }
    let out = c.output(0x10)?;
    sq.state = next;
    match next {
        WqState::Rst => sq.cc = 0,
        WqState::Err => eth::tx::flush(hca, c.ram, sqn),
        WqState::Rdy => {}
    }
    Ok(out)
}

/// QUERY_SQ / QUERY_RQ output: the stored context with `state` and `wq.hw_counter` (the model's consumer
/// counter) filled in.
fn query_out(c: &Ctx, ctx: &[u8], state: WqState, state_field: Field, hw_counter: u32) -> CmdResult {
    let mut out = c.output(QUEUE_IN_SIZE)?;
    out[CTX as usize..CTX as usize + QUEUE_CTX_SIZE].copy_from_slice(ctx);
    ifc::set(&mut out, state_field.at(CTX), state.code());
    ifc::set(&mut out, wq::HW_COUNTER.at(CTX + WQ), hw_counter);
    Ok(out)
}

pub fn query_sq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    let Some(sq) = hca.eth.sqs.get(&n) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    query_out(c, &sq.ctx, sq.state, sqc::STATE, sq.cc.into())
}

pub fn destroy_sq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    if !hca.eth.sqs.contains_key(&n) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    let out = c.output(0x10)?;
    hca.eth.sqs.remove(&n);
    Ok(out)
}

pub fn create_rq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(QUEUE_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    let mut known: Vec<Field> = at_ctx(&[
        rqc::RLKY,
        rqc::VSD,
        rqc::MEM_RQ_TYPE,
        rqc::STATE,
        rqc::FLUSH_IN_ERROR_EN,
        rqc::TS_FORMAT,
        rqc::USER_INDEX,
        rqc::CQN,
        rqc::COUNTER_SET_ID,
    ])
    .collect();
    known.extend(wq_known());
    c.reserved_zero(QUEUE_IN_SIZE, &known)?;
    need_initialized(hca, c)?;
    let q = |f: Field| c.get(f.at(CTX));
    if q(rqc::STATE) != WqState::Rst.code() {
        return Err(bad(c, reason::QP_WRONG_STATE));
    }
    // MEMORY_RQ_INLINE (0) only: no RMPs.
    if q(rqc::MEM_RQ_TYPE) != 0 || !ts_ok(hca, crate::caps::cmd_hca_cap::RQ_TS_FORMAT, q(rqc::TS_FORMAT)) {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let cqn = q(rqc::CQN);
    if !hca.cqs.cqs.contains_key(&cqn) {
        return Err(bad(c, reason::QP_BAD_CQ));
    }
    let counter_set_id = q(rqc::COUNTER_SET_ID);
    if counter_set_id != 0 && !hca.eth.q_counters.contains_key(&counter_set_id) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    // A WQE of 1 to 128 data segments (16 bytes each); no doorbell register, so no UAR needed.
    let wq = read_wq(hca, c, 4..=11, false)?;
    let mut out = c.output(0x10)?;
    let Some(rqn) = eth::free_number(&hca.eth.rqs, hca.caps.general(cap::LOG_MAX_RQ)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    let ctx = c.input[CTX as usize..CTX as usize + QUEUE_CTX_SIZE].to_vec();
    hca.eth.rqs.insert(
        rqn,
        Rq {
            rqn,
            state: WqState::Rst,
            cqn,
            rlky: q(rqc::RLKY) == 1,
            flush_in_error: q(rqc::FLUSH_IN_ERROR_EN) == 1,
            vsd: q(rqc::VSD) == 1,
            counter_set_id,
            wq,
            ctx,
            consumed: 0,
        },
    );
    ifc::set(&mut out, NUMBER, rqn);
    Ok(out)
}

pub fn modify_rq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let (rqn, cur, next, mask) = modify_common(c, rqc::STATE, &[rqc::VSD])?;
    need_initialized(hca, c)?;
    // Only VSD may be changed through the bitmask (scatter FCS and counter sets are not modelled); without
    // the bit the field must be 0.
    let vsd = c.get(rqc::VSD.at(CTX));
    if mask & !u64::from(RQ_BITMASK_VSD) != 0 || (mask == 0 && vsd != 0) {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let Some(rq) = hca.eth.rqs.get_mut(&rqn) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if rq.state != cur || !legal(cur, next) || ((cur, next) == (WqState::Rdy, WqState::Rdy) && mask == 0) {
        return Err(c.err(status::BAD_RES_STATE, reason::QP_WRONG_STATE));
    }
    let out = c.output(0x10)?;
    rq.state = next;
    if mask != 0 {
        rq.vsd = vsd == 1;
        ifc::set(&mut rq.ctx, rqc::VSD, vsd);
    }
    match next {
        WqState::Rst => rq.consumed = 0,
        WqState::Err => eth::rx::flush_rq(hca, c.ram, rqn),
        WqState::Rdy => {}
    }
    Ok(out)
}

pub fn query_rq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    let Some(rq) = hca.eth.rqs.get(&n) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    query_out(c, &rq.ctx, rq.state, rqc::STATE, rq.consumed.into())
}

pub fn destroy_rq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    if !hca.eth.rqs.contains_key(&n) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    if hca.eth.tirs.values().any(|t| t.inline_rqn == n) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    hca.eth.rqs.remove(&n);
    Ok(out)
}

pub fn create_tir(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(CTX as usize + tirc::SIZE)?;
    c.op_mod_in(&[0])?;
    let known: Vec<Field> =
        at_ctx(&[tirc::DISP_TYPE, tirc::INLINE_RQN, tirc::RX_HASH_FN, tirc::SELF_LB_BLOCK, tirc::TRANSPORT_DOMAIN])
            .collect();
    c.reserved_zero(CTX as usize + tirc::SIZE, &known)?;
    need_initialized(hca, c)?;
    let t = |f: Field| c.get(f.at(CTX));
    // Direct dispatch (0) only: indirect TIRs need RQTs, which are not modelled. A direct TIR may carry a
    // hash function (Linux sets INVERTED_XOR8); with one RQ it has no effect.
    if t(tirc::DISP_TYPE) != 0 || t(tirc::RX_HASH_FN) > 2 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let td = t(tirc::TRANSPORT_DOMAIN);
    let rqn = t(tirc::INLINE_RQN);
    if !hca.tds.contains(&td) || !hca.eth.rqs.contains_key(&rqn) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    let mut out = c.output(0x10)?;
    let Some(n) = eth::free_number(&hca.eth.tirs, hca.caps.general(cap::LOG_MAX_TIR)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    hca.eth.tirs.insert(n, Tir { transport_domain: td, inline_rqn: rqn });
    ifc::set(&mut out, NUMBER, n);
    Ok(out)
}

pub fn destroy_tir(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let n = number(hca, c)?;
    if !hca.eth.tirs.contains_key(&n) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    if hca.flow.uses_tir(n) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    hca.eth.tirs.remove(&n);
    Ok(out)
}

pub fn query_special_contexts(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[])?;
    need_initialized(hca, c)?;
    let mut out = c.output(SPECIAL_CONTEXTS_OUT_SIZE)?;
    // dump_fill_mkey and null_mkey are not modelled (0, and no capability bit claims them).
    ifc::set(&mut out, RESD_LKEY, eth::RESD_LKEY);
    Ok(out)
}

/// `alloc_q_counter_out.counter_set_id`, `dealloc_q_counter_in.counter_set_id` (bit 0x58, 8 bits).
const COUNTER_SET_ID: Field = Field::new(0x58, 8);
/// `query_q_counter_in` (0x20 bytes): `other_vport`, `vport_number`, `clear`, `aggregate`, `counter_set_id`.
mod qcq {
    use crate::ifc::Field;
    pub const SIZE: usize = 0x20;
    pub const OTHER_VPORT: Field = Field::new(0x40, 1);
    pub const VPORT_NUMBER: Field = Field::new(0x50, 16);
    pub const CLEAR: Field = Field::new(0xc0, 1);
    pub const AGGREGATE: Field = Field::new(0xc1, 1);
    pub const COUNTER_SET_ID: Field = Field::new(0xf8, 8);
    /// `query_q_counter_out` (0x100 bytes) and its `out_of_buffer` (bit 0x180).
    pub const OUT_SIZE: usize = 0x100;
    pub const OUT_OF_BUFFER: Field = Field::new(0x180, 32);
}
/// `cmd_hca_cap.max_qp_cnt` (bit 0x186, 10 bits): how many Q counters the function may allocate.
const MAX_QP_CNT: Field = Field::new(0x186, 10);

pub fn alloc_q_counter(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[])?;
    need_initialized(hca, c)?;
    let mut out = c.output(0x10)?;
    // Ids from 1 (0 is "no counter" in `rqc.counter_set_id`) up to `max_qp_cnt`, which fits the 8-bit field.
    let max = hca.caps.general(MAX_QP_CNT).min(0xff);
    let Some(id) = (1..=max).find(|n| !hca.eth.q_counters.contains_key(n)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    hca.eth.q_counters.insert(id, eth::QCounter::default());
    ifc::set(&mut out, COUNTER_SET_ID, id);
    Ok(out)
}

pub fn dealloc_q_counter(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[COUNTER_SET_ID])?;
    need_initialized(hca, c)?;
    let id = c.get(COUNTER_SET_ID);
    if !hca.eth.q_counters.contains_key(&id) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    if hca.eth.rqs.values().any(|r| r.counter_set_id == id) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    hca.eth.q_counters.remove(&id);
    Ok(out)
}

pub fn query_q_counter(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(qcq::SIZE)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(
        qcq::SIZE,
        &[qcq::OTHER_VPORT, qcq::VPORT_NUMBER, qcq::CLEAR, qcq::AGGREGATE, qcq::COUNTER_SET_ID],
    )?;
    need_initialized(hca, c)?;
    // Own vport only; aggregation across vports is not modelled.
    if c.get(qcq::OTHER_VPORT) != 0 || c.get(qcq::VPORT_NUMBER) != 0 || c.get(qcq::AGGREGATE) != 0 {
        return Err(bad(c, reason::WRONG_FUNCTION));
    }
    let id = c.get(qcq::COUNTER_SET_ID);
    let Some(q) = hca.eth.q_counters.get_mut(&id) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    let mut out = c.output(qcq::OUT_SIZE)?;
    ifc::set(&mut out, qcq::OUT_OF_BUFFER, q.out_of_buffer);
    if c.get(qcq::CLEAR) == 1 {
        *q = eth::QCounter::default();
    }
    Ok(out)
}
