//! CREATE_CQ, DESTROY_CQ (`mlx5_ifc.h` `create_cq_in/out`, `cqc`, `destroy_cq_in`; docs/reference/mlx5.md §e.4, §f.3).
//! The CQ's events go to the EQ `c_eqn` names, which must exist; `dbr_addr` is the 8-byte doorbell record
//! (`set_ci`, `arm`) in guest RAM.

use super::eq::{pages_for, read_pas};
use super::{CmdResult, Ctx, need_initialized, reason, status};
use crate::caps::cmd_hca_cap;
use crate::cq::Cq;
use crate::hca::Hca;
use crate::ifc::{self, Field};

/// `create_cq_in`: `cqc` at byte 0x10, `cq_umem_valid` at bit 0x2e0, `pas` at 0x110.
const CREATE_CQ_IN_SIZE: usize = 0x110;
const CQC: u32 = 0x10;
const CQ_UMEM_VALID: Field = Field::new(0x2e0, 1);
mod cqc {
    use crate::ifc::Field;
    pub const STATUS: Field = Field::new(0x00, 4);
    pub const DBR_UMEM_VALID: Field = Field::new(0x06, 1);
    pub const APU_CQ: Field = Field::new(0x07, 1);
    pub const CQE_SZ: Field = Field::new(0x08, 3);
    pub const CC: Field = Field::new(0x0b, 1);
    pub const SCQE_BREAK_MODERATION_EN: Field = Field::new(0x0d, 1);
    pub const OI: Field = Field::new(0x0e, 1);
    pub const CQ_PERIOD_MODE: Field = Field::new(0x0f, 2);
    pub const CQE_COMP_EN: Field = Field::new(0x11, 1);
    pub const MINI_CQE_RES_FORMAT: Field = Field::new(0x12, 2);
    pub const ST: Field = Field::new(0x14, 4);
    pub const CQE_COMPRESSION_LAYOUT: Field = Field::new(0x1e, 2);
    pub const PAGE_OFFSET: Field = Field::new(0x54, 6);
    pub const LOG_CQ_SIZE: Field = Field::new(0x63, 5);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const CQ_PERIOD: Field = Field::new(0x84, 12);
    pub const CQ_MAX_COUNT: Field = Field::new(0x90, 16);
    pub const C_EQN_OR_APU_ELEMENT: Field = Field::new(0xa0, 32);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xc3, 5);
    pub const LAST_NOTIFIED_INDEX: Field = Field::new(0x108, 24);
    pub const LAST_SOLICIT_INDEX: Field = Field::new(0x128, 24);
    pub const CONSUMER_COUNTER: Field = Field::new(0x148, 24);
    pub const PRODUCER_COUNTER: Field = Field::new(0x168, 24);
    /// `dbr_addr` (u64) at byte 0x38 of `cqc`.
    pub const DBR_ADDR: usize = 0x38;
    pub const SIZE: usize = 0x40;
}
/// `create_cq_out.cqn`, `destroy_cq_in.cqn`.
const CQN: Field = Field::new(0x48, 24);
/// `cmd_hca_cap.log_max_cq_sz` (bit 0xc8, 8 bits).
const LOG_MAX_CQ_SZ: Field = Field::new(0xc8, 8);
/// Largest PAS page the model accepts (as for EQs).
const MAX_LOG_PAGE_SIZE: u32 = 18;
/// CQ states for `cqc.st` (`mlx5_ifc.h`): 0 as Linux writes it, 0x6 solicited-notification armed, 0x9 armed,
/// 0xa fired.
const CQ_STATES: [u32; 4] = [0x0, 0x6, 0x9, 0xa];

pub fn create_cq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(CREATE_CQ_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    need_initialized(hca, c)?;
    let q = |f: Field| c.get(f.at(CQC));
    let bad = |why| Err(c.err(status::BAD_PARAM, why));
    let mut known: Vec<Field> = [
        cqc::STATUS,
        cqc::DBR_UMEM_VALID,
        cqc::APU_CQ,
        cqc::CQE_SZ,
        cqc::CC,
        cqc::SCQE_BREAK_MODERATION_EN,
        cqc::OI,
        cqc::CQ_PERIOD_MODE,
        cqc::CQE_COMP_EN,
        cqc::MINI_CQE_RES_FORMAT,
        cqc::ST,
        cqc::CQE_COMPRESSION_LAYOUT,
        cqc::PAGE_OFFSET,
        cqc::LOG_CQ_SIZE,
        cqc::UAR_PAGE,
        cqc::CQ_PERIOD,
        cqc::CQ_MAX_COUNT,
        cqc::C_EQN_OR_APU_ELEMENT,
        cqc::LOG_PAGE_SIZE,
        cqc::LAST_NOTIFIED_INDEX,
        cqc::LAST_SOLICIT_INDEX,
        cqc::CONSUMER_COUNTER,
        cqc::PRODUCER_COUNTER,
    ]
    .iter()
    .map(|f| f.at(CQC))
    .collect();
    known.push(CQ_UMEM_VALID);
    known.push(Field::new((CQC * 8) + (cqc::DBR_ADDR as u32) * 8, 32));
    known.push(Field::new((CQC * 8) + (cqc::DBR_ADDR as u32) * 8 + 32, 32));
    c.reserved_zero(CREATE_CQ_IN_SIZE, &known)?;
    // Not modelled: UMEM, APU CQs, collapsed CQs, CQE compression, a start offset, non-reset counters.
    if c.get(CQ_UMEM_VALID) != 0
        || q(cqc::DBR_UMEM_VALID) != 0
        || q(cqc::APU_CQ) != 0
        || q(cqc::CC) != 0
        || q(cqc::CQE_COMP_EN) != 0
        || q(cqc::MINI_CQE_RES_FORMAT) != 0
        || q(cqc::CQE_COMPRESSION_LAYOUT) != 0
        || q(cqc::PAGE_OFFSET) != 0
        || q(cqc::STATUS) != 0
        || q(cqc::CONSUMER_COUNTER) != 0
        || q(cqc::PRODUCER_COUNTER) != 0
        || q(cqc::LAST_NOTIFIED_INDEX) != 0
        || q(cqc::LAST_SOLICIT_INDEX) != 0
        || !CQ_STATES.contains(&q(cqc::ST))
    {
        return bad(reason::UNSUPPORTED_FEATURE);
    }
    // CQE_STRIDE_64 = 0, CQE_STRIDE_128 = 1 (`cq.h:126-130`); 128-byte padded (2) is not modelled.
    let (cqe_size, log_stride) = match q(cqc::CQE_SZ) {
        0 => (64u16, 6),
        1 => (128, 7),
        _ => return bad(reason::UNSUPPORTED_FEATURE),
    };
    let log_cq_size = q(cqc::LOG_CQ_SIZE);
    if log_cq_size > hca.caps.general(LOG_MAX_CQ_SZ) {
        return bad(reason::CAP_ABOVE_MAX);
    }
    let log_page_size = q(cqc::LOG_PAGE_SIZE);
    if log_page_size > MAX_LOG_PAGE_SIZE {
        return bad(reason::BAD_PAGE_SIZE);
    }
    let uar_page = q(cqc::UAR_PAGE);
    if !hca.uars.contains(&uar_page) {
        return bad(reason::NO_SUCH_OBJECT);
    }
    let c_eqn = q(cqc::C_EQN_OR_APU_ELEMENT);
    if c_eqn > 0xff || !hca.eqs.eqs.contains_key(&(c_eqn as u8)) {
        return bad(reason::NO_SUCH_EQ);
    }
    let dbr_addr = ifc::get64(c.input, CQC as usize + cqc::DBR_ADDR);
    // The record is two big-endian dwords (`set_ci`, `arm`), read as one 8-byte unit.
    if !dbr_addr.is_multiple_of(8) || !c.ram.holds(dbr_addr, 8) {
        return bad(reason::BAD_DOORBELL_RECORD);
    }
    let n = pages_for(log_cq_size, log_stride, log_page_size);
    let pas = read_pas(hca, c, n, log_page_size)?;
    let mut out = c.output(0x10)?;
    let max = 1u32 << hca.caps.general(cmd_hca_cap::LOG_MAX_CQ).min(24);
    // CQN 0 is never handed out (Linux treats it as "none" in places, e.g. `qpc.cqn_snd` unset).
    let Some(cqn) = (1..max).find(|n| !hca.cqs.cqs.contains_key(n)) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    let base = CQC as usize;
    hca.cqs.cqs.insert(
        cqn,
        Cq {
            cqn,
            log_cq_size: log_cq_size as u8,
            cqe_size,
            uar_page,
            c_eqn: c_eqn as u8,
            log_page_size: log_page_size as u8,
            dbr_addr,
            pas,
            cqc: c.input[base..base + cqc::SIZE].to_vec(),
            oi: q(cqc::OI) == 1,
            producer_counter: 0,
            // 0x6 solicited-notification armed and 0x9 armed; error CQEs are solicited, so both fire.
            armed: matches!(q(cqc::ST), 0x6 | 0x9),
            arm_sn: 0,
            in_error: false,
        },
    );
    ifc::set(&mut out, CQN, cqn);
    Ok(out)
}

pub fn destroy_cq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[CQN])?;
    need_initialized(hca, c)?;
    let out = c.output(0x10)?;
    let cqn = c.get(CQN);
    if !hca.cqs.cqs.contains_key(&cqn) {
        return Err(c.err(status::BAD_PARAM, reason::NO_SUCH_OBJECT));
    }
    // A QP still completing to the CQ keeps it (as DESTROY_EQ with a CQ on the EQ).
    if hca.qps.uses_cq(cqn) || hca.eth.uses_cq(cqn) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    hca.cqs.cqs.remove(&cqn);
    Ok(out)
}
