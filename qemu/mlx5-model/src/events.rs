//! Asynchronous events the device raises (docs/reference/mlx5.md §b.3, §f.1): PAGE_REQUEST at runtime — including the
//! firmware behaviour of holding a command until the pages it needs are given (the VFIO selftest: "the FW can raise
//! PAGE_REQUEST while a regular command is outstanding, and that command will not complete until the pages are
//! supplied via a second slot") — and the [`Model`] calls the data path and tests use for PORT_CHANGE,
//! CQ_ERROR and QP async errors.

use std::collections::{BTreeMap, BTreeSet};

use crate::cmd::{CmdError, reason, status};
use crate::cmdq::Entry;
use crate::eq::{self, event_type};
use crate::hca::{FnState, Hca};
use crate::ifc::{self, cmd_queue_entry as ent, hdr};
use crate::mem::Memory;
use crate::model::Model;
use crate::pages::query_pages_op_mod::REGULAR;

/// When the device asks for more pages at runtime (`ModelConfig::page_request`; off by default): the first
/// `times` commands of `opcode` each raise the REGULAR demand by `num_pages`, write a PAGE_REQUEST EQE and stay
/// HW-owned until the device owns enough pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub opcode: u16,
    pub num_pages: u32,
    pub times: u32,
}

/// Commands held for pages.
#[derive(Default)]
pub struct PageWaits {
    cfg: Option<PageRequest>,
    left: u32,
    /// slot → (entry address, pages its request added to the REGULAR demand).
    waiting: BTreeMap<u32, (u64, u32)>,
    /// Slots let go by [`ready`]: their next run executes.
    released: BTreeSet<u32>,
    /// Held commands the driver refused pages for (MANAGE_PAGES ALLOCATION_FAIL), to be handed to [`ready`].
    refused: BTreeMap<u32, u64>,
    /// Slots let go by [`ready`] after a refusal: their next run fails with this output header.
    failing: BTreeMap<u32, CmdError>,
}

/// What the command hook decides for the command in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Execute it now.
    Run,
    /// Leave it HW-owned: it waits for pages.
    Wait,
    /// Complete it without executing, with this status and syndrome: the pages it waited for were refused.
    Fail(CmdError),
}

impl PageWaits {
    pub fn new(cfg: Option<PageRequest>) -> PageWaits {
        PageWaits { cfg, left: cfg.map_or(0, |c| c.times), ..PageWaits::default() }
    }

    /// Slots whose command waits for pages.
    pub fn waiting(&self) -> Vec<u32> {
        self.waiting.keys().copied().collect()
    }

    /// Whether the command in `slot` is held for pages (waiting, or refused and not yet let go).
    pub fn holds(&self, slot: u32) -> bool {
        self.waiting.contains_key(&slot) || self.refused.contains_key(&slot)
    }
}

/// The command hook: whether the command in `slot` runs, waits for pages, or fails because they were refused.
pub fn hold(hca: &mut Hca, ram: &dyn Memory, slot: u32, addr: u64, e: &Entry) -> Hold {
    if let Some(err) = hca.page_waits.failing.remove(&slot) {
        return Hold::Fail(err);
    }
    if hca.page_waits.released.remove(&slot) {
        return Hold::Run;
    }
    if hca.page_waits.waiting.contains_key(&slot) || hca.page_waits.refused.contains_key(&slot) {
        return Hold::Wait;
    }
    let opcode = ifc::get(&e.raw[ent::COMMAND_INPUT_INLINE_DATA..], hdr::OPCODE) as u16;
    let w = &mut hca.page_waits;
    let Some(cfg) = w.cfg.filter(|c| c.opcode == opcode && w.left > 0) else { return Hold::Run };
    if hca.state != FnState::Initialized {
        return Hold::Run;
    }
    w.left -= 1;
    hca.pages.regular = hca.pages.regular.saturating_add(cfg.num_pages);
    let want = hca.pages.query(REGULAR);
    if want <= 0 {
        return Hold::Run;
    }
    hca.eqs.raise(ram, event_type::PAGE_REQUEST, 0, &eq::page_request_data(want));
    hca.page_waits.waiting.insert(slot, (addr, cfg.num_pages));
    Hold::Wait
}

/// MANAGE_PAGES ALLOCATION_FAIL: the driver cannot give the pages asked for. Every command held for pages fails
/// with `NO_RES` (syndrome `opcode << 16 | ALLOCATION_FAILED`, the held command's opcode) once [`ready`] lets
/// it go, and the REGULAR demand those commands raised is withdrawn (the request died with them). Demand raised
/// by [`Model::request_pages`] alone stays.
pub fn allocation_failed(hca: &mut Hca, ram: &dyn Memory) {
    let w = &mut hca.page_waits;
    for (slot, (addr, pages)) in std::mem::take(&mut w.waiting) {
        hca.pages.regular = hca.pages.regular.saturating_sub(pages);
        let opcode = Entry::read(ram, addr)
            .map_or(0, |e| ifc::get(&e.raw[ent::COMMAND_INPUT_INLINE_DATA..], hdr::OPCODE) as u16);
        let syndrome = (u32::from(opcode) << 16) | u32::from(reason::ALLOCATION_FAILED);
        w.failing.insert(slot, CmdError { status: status::NO_RES, syndrome });
        w.refused.insert(slot, addr);
    }
}

/// Held commands that may run now: all of them once the REGULAR demand is met (or the function left the
/// initialized state, where they fail as any command would).
pub fn ready(hca: &mut Hca) -> Vec<(u32, u64)> {
    // Refused ones first: they complete with their failure (`failing`) on their next run.
    let mut out: Vec<(u32, u64)> = std::mem::take(&mut hca.page_waits.refused).into_iter().collect();
    if hca.page_waits.waiting.is_empty() || (hca.state == FnState::Initialized && hca.pages.query(REGULAR) > 0) {
        return out;
    }
    let w = &mut hca.page_waits;
    let run: Vec<(u32, u64)> = std::mem::take(&mut w.waiting).into_iter().map(|(s, (a, _))| (s, a)).collect();
    w.released.extend(run.iter().map(|&(s, _)| s));
    out.extend(run);
    out
}

impl Model {
    /// Raises the REGULAR page demand by `num_pages` and tells the driver with a PAGE_REQUEST EQE (number of
    /// EQEs written).
    pub fn request_pages(&mut self, num_pages: u32) -> usize {
        let ram = self.ram().clone();
        let hca = self.hca_mut();
        hca.pages.regular = hca.pages.regular.saturating_add(num_pages);
        let want = hca.pages.query(REGULAR);
        hca.eqs.raise(ram.as_ref(), event_type::PAGE_REQUEST, 0, &eq::page_request_data(want))
    }

    /// A QP asynchronous event (`event_type` one of the QP types of `device.h`, e.g. WQ_ACCESS_ERROR 0x11) for
    /// `qpn`, written to every EQ subscribed to it (number of EQEs written). Other types, and a QPN that does
    /// not exist, are refused (0): hardware raises QP events only for its own QPs.
    pub fn raise_qp_event(&mut self, qpn: u32, event_type: u8) -> usize {
        if !eq::is_qp_event(event_type) || self.hca().qps.get(qpn).is_none() {
            return 0;
        }
        let ram = self.ram().clone();
        self.hca_mut().eqs.raise(ram.as_ref(), event_type, 0, &eq::qp_event_data(qpn))
    }

    /// CQ_ERROR for `cqn` (syndrome 1 = overrun, 2 = access violation); ignored for a CQ that does not exist.
    pub fn raise_cq_error(&mut self, cqn: u32, syndrome: u8) -> usize {
        if !self.hca().cqs.cqs.contains_key(&cqn) {
            return 0;
        }
        let ram = self.ram().clone();
        self.hca_mut().eqs.raise(ram.as_ref(), event_type::CQ_ERROR, 0, &eq::cq_error_data(cqn, syndrome))
    }
}
