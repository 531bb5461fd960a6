//! Asynchronous events the device raises (facts §b.3, §f.1): PAGE_REQUEST at runtime — including the firmware
//! behaviour of holding a command until the pages it needs are given (the VFIO selftest: "the FW can raise
//! PAGE_REQUEST while a regular command is outstanding, and that command will not complete until the pages are
//! supplied via a second slot") — and the [`Model`] calls the data path and tests use for PORT_CHANGE,
//! CQ_ERROR and QP async errors.

use std::collections::{BTreeMap, BTreeSet};

use crate::cmdq::Entry;
use crate::eq::{self, event_type};
use crate::hca::{FnState, Hca, Model};
use crate::ifc::{self, cmd_queue_entry as ent, hdr};
use crate::mem::Memory;
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
    /// slot → entry address.
    waiting: BTreeMap<u32, u64>,
    /// Slots let go by [`ready`]: their next run executes.
    released: BTreeSet<u32>,
}

impl PageWaits {
    pub fn new(cfg: Option<PageRequest>) -> PageWaits {
        PageWaits { cfg, left: cfg.map_or(0, |c| c.times), ..PageWaits::default() }
    }

    /// Slots whose command waits for pages.
    pub fn waiting(&self) -> Vec<u32> {
        self.waiting.keys().copied().collect()
    }
}

/// The command hook: true when the command in `slot` must not run now (it waits for pages).
pub fn hold(hca: &mut Hca, ram: &dyn Memory, slot: u32, addr: u64, e: &Entry) -> bool {
    if hca.page_waits.released.remove(&slot) {
        return false;
    }
    if hca.page_waits.waiting.contains_key(&slot) {
        return true;
    }
    let opcode = ifc::get(&e.raw[ent::COMMAND_INPUT_INLINE_DATA..], hdr::OPCODE) as u16;
    let w = &mut hca.page_waits;
    let Some(cfg) = w.cfg.filter(|c| c.opcode == opcode && w.left > 0) else { return false };
    if hca.state != FnState::Initialized {
        return false;
    }
    w.left -= 1;
    hca.pages.regular = hca.pages.regular.saturating_add(cfg.num_pages);
    let want = hca.pages.query(REGULAR);
    if want <= 0 {
        return false;
    }
    hca.eqs.raise(ram, event_type::PAGE_REQUEST, 0, &eq::page_request_data(want));
    hca.page_waits.waiting.insert(slot, addr);
    true
}

/// Held commands that may run now: all of them once the REGULAR demand is met (or the function left the
/// initialized state, where they fail as any command would).
pub fn ready(hca: &mut Hca) -> Vec<(u32, u64)> {
    if hca.page_waits.waiting.is_empty() || (hca.state == FnState::Initialized && hca.pages.query(REGULAR) > 0) {
        return Vec::new();
    }
    let w = &mut hca.page_waits;
    let out: Vec<(u32, u64)> = std::mem::take(&mut w.waiting).into_iter().collect();
    w.released.extend(out.iter().map(|&(s, _)| s));
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
    /// `qpn`, written to every EQ subscribed to it. Other types are ignored.
    pub fn raise_qp_event(&mut self, qpn: u32, event_type: u8) {
        if !eq::is_qp_event(event_type) {
            return;
        }
        let ram = self.ram().clone();
        self.hca_mut().eqs.raise(ram.as_ref(), event_type, 0, &eq::qp_event_data(qpn));
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
