//! Handle allocators: ALLOC/DEALLOC_UAR, ALLOC/DEALLOC_PD, ALLOC/DEALLOC_TRANSPORT_DOMAIN (`mlx5_ifc.h`
//! `alloc_uar_in/out`, `alloc_pd_in/out`, `alloc_transport_domain_in/out` and the dealloc inputs). All put the
//! 24-bit handle at bit 0x48 (`uar`, `pd`, `transport_domain`).

use std::collections::BTreeSet;

use super::{CmdError, CmdResult, Ctx, need_initialized, reason, status};
use crate::caps::cmd_hca_cap;
use crate::hca::Hca;
use crate::ifc::{self, Field};

const HANDLE: Field = Field::new(0x48, 24);

/// Lowest free handle in `[lo, hi)`.
fn alloc(set: &mut BTreeSet<u32>, lo: u32, hi: u32, c: &Ctx) -> Result<u32, CmdError> {
    let mut want = lo;
    for &h in set.range(lo..hi) {
        if h != want {
            break;
        }
        want += 1;
    }
    if want >= hi {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    }
    set.insert(want);
    Ok(want)
}

fn allocate(hca: &mut Hca, c: &Ctx, pick: impl Fn(&mut Hca, &Ctx) -> Result<u32, CmdError>) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[])?;
    need_initialized(hca, c)?;
    let mut out = c.output(0x10)?;
    let h = pick(hca, c)?;
    ifc::set(&mut out, HANDLE, h);
    Ok(out)
}

fn release(hca: &mut Hca, c: &Ctx, set: impl Fn(&mut Hca) -> &mut BTreeSet<u32>) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[HANDLE])?;
    need_initialized(hca, c)?;
    let out = c.output(0x10)?;
    if !set(hca).remove(&c.get(HANDLE)) {
        return Err(c.err(status::BAD_PARAM, reason::NO_SUCH_OBJECT));
    }
    Ok(out)
}

pub fn alloc_uar(hca: &mut Hca, c: &Ctx) -> CmdResult {
    allocate(hca, c, |h, c| {
        // The BAR's last page carries the model's signature (`shm`), never a UAR.
        let hi = c.bar_pages.saturating_sub(1).min(1 << 24) as u32;
        alloc(&mut h.uars, h.first_uar, hi, c)
    })
}

pub fn dealloc_uar(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    let uar = c.get(HANDLE);
    // An EQ, CQ or QP whose doorbells live on the page keeps it.
    if hca.eqs.eqs.values().any(|q| q.uar_page == uar)
        || hca.cqs.cqs.values().any(|q| q.uar_page == uar)
        || hca.qps.qps.values().any(|q| q.get(crate::qp::qpc::UAR_PAGE) == uar)
        || hca.eth.uses_uar(uar)
    {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    release(hca, c, |h| &mut h.uars)
}

pub fn alloc_pd(hca: &mut Hca, c: &Ctx) -> CmdResult {
    allocate(hca, c, |h, c| {
        let hi = 1u32 << h.caps.general(cmd_hca_cap::LOG_MAX_PD).min(24);
        alloc(&mut h.pds, 1, hi, c)
    })
}

pub fn dealloc_pd(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    if hca.mkeys.values().any(|m| m.pd == c.get(HANDLE))
        || hca.qps.qps.values().any(|q| q.pd() == c.get(HANDLE))
        || hca.eth.uses_pd(c.get(HANDLE))
    {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    release(hca, c, |h| &mut h.pds)
}

pub fn alloc_transport_domain(hca: &mut Hca, c: &Ctx) -> CmdResult {
    allocate(hca, c, |h, c| {
        let hi = 1u32 << h.caps.general(cmd_hca_cap::LOG_MAX_TRANSPORT_DOMAIN).min(24);
        alloc(&mut h.tds, 1, hi, c)
    })
}

pub fn dealloc_transport_domain(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    // A TIS or TIR in the domain keeps it.
    if hca.eth.uses_td(c.get(HANDLE)) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    release(hca, c, |h| &mut h.tds)
}
