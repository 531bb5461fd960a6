//! CREATE_EQ, DESTROY_EQ, QUERY_EQ (`mlx5_ifc.h` `create_eq_in/out`, `eqc`, `destroy_eq_in`, `query_eq_in/out`;
//! docs/reference/mlx5.md §e.3). The EQ buffer is the PAS list of the input (pages of `2^(12 + log_page_size)` bytes).

use super::{CmdError, CmdResult, Ctx, need_initialized, reason, status};
use crate::caps::cmd_hca_cap;
use crate::eq::{self, Eq};
use crate::hca::Hca;
use crate::ifc::{self, Field};

/// `create_eq_in`: `eqc` at byte 0x10, `event_bitmask` (4 × u64) at 0x58, `pas` at 0x110.
const CREATE_EQ_IN_SIZE: usize = 0x110;
const EQC: u32 = 0x10;
const EVENT_BITMASK: usize = 0x58;
const PAS: usize = 0x110;
mod eqc {
    use crate::ifc::Field;
    pub const STATUS: Field = Field::new(0x00, 4);
    pub const EC: Field = Field::new(0x0d, 1);
    pub const OI: Field = Field::new(0x0e, 1);
    pub const ST: Field = Field::new(0x14, 4);
    pub const PAGE_OFFSET: Field = Field::new(0x54, 6);
    pub const LOG_EQ_SIZE: Field = Field::new(0x63, 5);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const INTR: Field = Field::new(0xb4, 12);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xc3, 5);
    pub const CONSUMER_COUNTER: Field = Field::new(0x148, 24);
    pub const PRODUCER_COUNTER: Field = Field::new(0x168, 24);
    pub const SIZE: usize = 0x40;
}
/// `create_eq_out.eq_number`, `destroy_eq_in.eq_number`, `query_eq_in.eq_number`.
const EQ_NUMBER: Field = Field::new(0x58, 8);
/// `query_eq_out`: `eq_context_entry` at 0x10, `event_bitmask` (one u64) at 0x58, `pas` at 0x110.
const QUERY_EQ_OUT_SIZE: usize = 0x110;
/// EQ states for `eqc.st` (`mlx5_ifc.h` `MLX5_EQ_STATE_*`): 0 as Linux writes it, armed, fired, always armed.
const EQ_STATES: [u32; 4] = [0x0, 0x9, 0xa, 0xb];
/// `cmd_hca_cap.log_max_eq_sz` (bit 0xe0, 8 bits).
const LOG_MAX_EQ_SZ: Field = Field::new(0xe0, 8);
/// Largest PAS page the model accepts (2^(12+18) = 1 GiB).
const MAX_LOG_PAGE_SIZE: u32 = 18;

/// Reads `n` PAS entries at `PAS` of the input: each aligned to the page size, inside guest RAM and not a page
/// the driver gave to the device (a queue in firmware's own memory would be overwritten by it).
pub(crate) fn read_pas(hca: &Hca, c: &Ctx, n: usize, log_page_size: u32) -> Result<Vec<u64>, CmdError> {
    c.need_input(PAS + 8 * n)?;
    let ps = 1u64 << (12 + log_page_size);
    let mut pas = Vec::with_capacity(n);
    for i in 0..n {
        let pa = ifc::get64(c.input, PAS + 8 * i);
        if !pa.is_multiple_of(ps) {
            return Err(c.err(status::BAD_PARAM, reason::PAGE_MISALIGNED));
        }
        if !c.ram.holds(pa, ps) {
            return Err(c.err(status::BAD_PARAM, reason::PAGE_OUTSIDE_RAM));
        }
        if (0..ps / 4096).any(|k| hca.pages.owns(pa + 4096 * k)) {
            return Err(c.err(status::BAD_PARAM, reason::PAGE_ALREADY_OWNED));
        }
        pas.push(pa);
    }
    Ok(pas)
}

/// Number of PAS pages a ring of `2^log_entries` entries of `2^log_stride` bytes needs.
pub(crate) fn pages_for(log_entries: u32, log_stride: u32, log_page_size: u32) -> usize {
    let bytes = 1u64 << (log_entries + log_stride);
    bytes.div_ceil(1u64 << (12 + log_page_size)) as usize
}

pub fn create_eq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(CREATE_EQ_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    need_initialized(hca, c)?;
    let q = |f: Field| c.get(f.at(EQC));
    let bad = |why| Err(c.err(status::BAD_PARAM, why));
    // Fixed part: only the header, the eqc fields below and the bitmask may be non-zero.
    let known: Vec<Field> = [
        eqc::EC,
        eqc::OI,
        eqc::ST,
        eqc::LOG_EQ_SIZE,
        eqc::UAR_PAGE,
        eqc::INTR,
        eqc::LOG_PAGE_SIZE,
        eqc::PAGE_OFFSET,
        eqc::STATUS,
        eqc::CONSUMER_COUNTER,
        eqc::PRODUCER_COUNTER,
    ]
    .iter()
    .map(|f| f.at(EQC))
    .chain((0..8).map(|k| Field::new((EVENT_BITMASK as u32 + 4 * k) * 8, 32)))
    .collect();
    c.reserved_zero(CREATE_EQ_IN_SIZE, &known)?;
    // Not modelled: event collapse, a non-zero start offset (the VFIO selftest: "EQ does not support
    // page_offset"), a status or counters other than the reset values.
    if q(eqc::EC) != 0
        || q(eqc::PAGE_OFFSET) != 0
        || q(eqc::STATUS) != 0
        || q(eqc::CONSUMER_COUNTER) != 0
        || q(eqc::PRODUCER_COUNTER) != 0
        || !EQ_STATES.contains(&q(eqc::ST))
    {
        return bad(reason::UNSUPPORTED_FEATURE);
    }
    let log_eq_size = q(eqc::LOG_EQ_SIZE);
    if log_eq_size > hca.caps.general(LOG_MAX_EQ_SZ) {
        return bad(reason::CAP_ABOVE_MAX);
    }
    let log_page_size = q(eqc::LOG_PAGE_SIZE);
    if log_page_size > MAX_LOG_PAGE_SIZE {
        return bad(reason::BAD_PAGE_SIZE);
    }
    let uar_page = q(eqc::UAR_PAGE);
    if !hca.uars.contains(&uar_page) {
        return bad(reason::NO_SUCH_OBJECT);
    }
    let n = pages_for(log_eq_size, 6, log_page_size);
    let pas = read_pas(hca, c, n, log_page_size)?;
    let mut event_bitmask = [0u64; 4];
    for (k, w) in event_bitmask.iter_mut().enumerate() {
        *w = ifc::get64(c.input, EVENT_BITMASK + 8 * k);
    }
    let mut out = c.output(0x10)?;
    let max = (1u32 << hca.caps.general(cmd_hca_cap::LOG_MAX_EQ).min(8)).min(eq::LAST_EQN + 1);
    let Some(eqn) = (eq::FIRST_EQN..max).find(|n| !hca.eqs.eqs.contains_key(&(*n as u8))) else {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    };
    let base = EQC as usize;
    hca.eqs.eqs.insert(
        eqn as u8,
        Eq {
            eqn: eqn as u8,
            log_eq_size: log_eq_size as u8,
            uar_page,
            intr: q(eqc::INTR) as u16,
            log_page_size: log_page_size as u8,
            oi: q(eqc::OI) == 1,
            pas,
            event_bitmask,
            producer_counter: 0,
            consumer_counter: 0,
            armed: true,
            overruns: 0,
            eqc: c.input[base..base + eqc::SIZE].to_vec(),
        },
    );
    ifc::set(&mut out, EQ_NUMBER, eqn);
    Ok(out)
}

fn eq_of(hca: &Hca, c: &Ctx) -> Result<u8, CmdError> {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[EQ_NUMBER])?;
    need_initialized(hca, c)?;
    let eqn = c.get(EQ_NUMBER) as u8;
    if !hca.eqs.eqs.contains_key(&eqn) {
        return Err(c.err(status::BAD_PARAM, reason::NO_SUCH_OBJECT));
    }
    Ok(eqn)
}

pub fn destroy_eq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let eqn = eq_of(hca, c)?;
    let out = c.output(0x10)?;
    if hca.cqs.uses_eq(eqn) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    hca.eqs.eqs.remove(&eqn);
    Ok(out)
}

pub fn query_eq(hca: &mut Hca, c: &Ctx) -> CmdResult {
    let eqn = eq_of(hca, c)?;
    let Some(q) = hca.eqs.eqs.get(&eqn) else { return Err(c.err(status::BAD_PARAM, reason::NO_SUCH_OBJECT)) };
    let mut out = c.output(QUERY_EQ_OUT_SIZE)?;
    out[0x10..0x10 + eqc::SIZE].copy_from_slice(&q.eqc);
    ifc::set(&mut out, eqc::CONSUMER_COUNTER.at(EQC), q.consumer_counter);
    ifc::set(&mut out, eqc::PRODUCER_COUNTER.at(EQC), q.producer_counter);
    ifc::set64(&mut out, EVENT_BITMASK, q.event_bitmask[0]);
    // The PAS list follows when the driver's output has room for it.
    let room = c.output_length.saturating_sub(QUERY_EQ_OUT_SIZE) / 8;
    for pa in q.pas.iter().take(room) {
        out.extend_from_slice(&pa.to_be_bytes());
    }
    Ok(out)
}
