//! The device: [`Model`] ties the BAR (initialization segment, doorbell) and guest RAM (command queue,
//! mailboxes, pages) to the HCA state the commands act on ([`crate::hca::Hca`]). One polling pass per
//! [`Model::poll`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::caps::cmd_hca_cap;
use crate::cmdq::{self, Delivery, Entry};
use crate::fault::{Fault, FaultCounters, Faults, Verdict};
use crate::hca::{FnState, Hca, ModelConfig};
use crate::ifc::{self, hdr};
use crate::initseg::InitSeg;
use crate::mem::Memory;
use crate::mkey::MkeyInfo;
use crate::timing::Timing;
use crate::trace::{Record, Trace};

/// Which HW-owned command entries a doorbell runs (`ModelConfig::doorbells`; `docs/hca-model.md`, "Command
/// timing and doorbells").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Doorbells {
    /// [`Doorbells::PerSlot`] where the BAR's doorbell keeps every write until the device takes it
    /// (`Memory::write_one_to_set`: the hosted rigs), else [`Doorbells::Coalesce`] (QEMU's shared files).
    #[default]
    Auto,
    /// As a ConnectX-5: exactly the slots whose bits were written run; an entry handed to hardware without its
    /// doorbell never runs.
    PerSlot,
    /// Any doorbell also runs every other HW-owned entry not already held, because over shared memory a second
    /// doorbell write can replace the first before the model reads it (counted in
    /// `Counters::coalesced_doorbells`).
    Coalesce,
}

/// Counters for what the model refused to do (visible to tests and the binary's status output).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub commands: u64,
    pub doorbells_while_initializing: u64,
    pub doorbells_on_sw_owned_entry: u64,
    pub unreachable_entries: u64,
    /// HW-owned entries run although their own doorbell write was not seen (it was overwritten by a later
    /// write before the model read the register; see `coalesce`).
    pub coalesced_doorbells: u64,
}

pub struct Model {
    bar: Arc<dyn Memory>,
    ram: Arc<dyn Memory>,
    start: Instant,
    seg: Option<InitSeg>,
    hca: Hca,
    trace: Option<Trace>,
    counters: Counters,
    faults: Faults,
    /// Slots whose doorbell a `DropDoorbell` fault swallowed: they stay HW-owned until rung again.
    dropped: u32,
    /// Firmware time per command and how many commands it has timed (the jitter's sequence number).
    timing: Timing,
    timed: u64,
    /// Resolved: never `Auto`.
    doorbells: Doorbells,
}

impl Model {
    /// Writes the initialization segment (with `initializing` set) and opens the trace, if any.
    pub fn new(bar: Arc<dyn Memory>, ram: Arc<dyn Memory>, cfg: ModelConfig) -> Model {
        let now = Instant::now();
        // A BAR too small for the initialization segment leaves a model that never comes out of reset.
        let seg = InitSeg::new(bar.as_ref(), &cfg, now).ok();
        let path = cfg.trace.clone().or_else(|| std::env::var_os("MLX5_MODEL_TRACE").map(PathBuf::from));
        let trace = path.and_then(|p| match Trace::create(&p) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("mlx5-model: cannot create trace {}: {e}", p.display());
                None
            }
        });
        Model {
            ram,
            start: now,
            seg,
            hca: Hca::new(&cfg),
            trace,
            counters: Counters::default(),
            faults: Faults::default(),
            dropped: 0,
            timing: cfg.timing,
            timed: 0,
            doorbells: match cfg.doorbells {
                Doorbells::Auto if InitSeg::doorbell_accumulates(bar.as_ref()) => Doorbells::PerSlot,
                Doorbells::Auto => Doorbells::Coalesce,
                d => d,
            },
            bar,
        }
    }

    /// The doorbell mode in force (`ModelConfig::doorbells` with `Auto` resolved).
    pub fn doorbells(&self) -> Doorbells {
        self.doorbells
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// When the earliest command held for firmware time (or a `delay` fault) comes due: an idle poller must
    /// look again by then.
    pub fn next_due(&self) -> Option<Instant> {
        let umr = crate::umr::next_due(&self.hca);
        match (self.faults.next_due(), umr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// One polling pass: timers (initializing, health counter, internal timer), then the command doorbell.
    /// Returns true if it did work (the caller backs off when false).
    pub fn poll(&mut self) -> bool {
        if !self.hca.bus_master {
            // No DMA: the device can neither fetch a command nor write anything back.
            return false;
        }
        // Delayed commands (fault injection) whose time has come complete first.
        let due = self.faults.due(Instant::now());
        let released = !due.is_empty();
        for (slot, addr) in due {
            self.run_slot(slot, addr, true);
        }
        let released = self.poll_events() | released;
        let Some(seg) = self.seg.as_mut() else { return released };
        let freq = self.hca.caps.general(cmd_hca_cap::DEVICE_FREQUENCY_KHZ);
        let mut did = seg.tick(self.bar.as_ref(), Instant::now(), freq).unwrap_or(false) || released;
        let Ok(bell) = InitSeg::take_doorbell(self.bar.as_ref()) else { return did };
        if bell == 0 {
            return did;
        }
        if seg.initializing() {
            self.counters.doorbells_while_initializing += 1;
            return true;
        }
        if self.faults.take_doorbell_drop() {
            self.dropped |= bell;
            return true;
        }
        self.dropped &= !bell;
        let Ok(q) = InitSeg::cmdq(self.bar.as_ref()) else { return did };
        let bell = match self.doorbells {
            Doorbells::Coalesce => bell | self.coalesce(bell, &q),
            _ => bell,
        };
        for slot in 0..q.entries {
            if bell & (1 << slot) != 0 {
                self.run_slot(slot, q.base + u64::from(slot) * q.stride, false);
                did = true;
            }
        }
        did
    }

    /// [`Doorbells::Coalesce`]. The doorbell is a plain word in shared memory: when the driver rings slot A and
    /// then slot B before the model reads the register, the second write replaces the first, and on hardware
    /// both would run.
    /// So when any doorbell is seen, every other entry that is HW-owned and not already held (delayed, hung,
    /// waiting for pages, or left behind by a dropped doorbell) counts as rung too. The cost in strictness:
    /// an entry handed to hardware without its own doorbell runs once some other doorbell arrives
    /// (`docs/hca-model.md`).
    fn coalesce(&mut self, bell: u32, q: &crate::initseg::CmdqGeometry) -> u32 {
        let mut extra = 0;
        for slot in 0..q.entries.min(32) {
            let bit = 1u32 << slot;
            if bell & bit != 0 || self.dropped & bit != 0 || self.faults.holds(slot) {
                continue;
            }
            if self.hca.page_waits.holds(slot) {
                continue;
            }
            let owned =
                Entry::read(self.ram.as_ref(), q.base + u64::from(slot) * q.stride).is_some_and(|e| e.owned_by_hw());
            if owned {
                extra |= bit;
                self.counters.coalesced_doorbells += 1;
            }
        }
        extra
    }

    /// `released`: a delayed command coming due (not delayed again).
    fn run_slot(&mut self, slot: u32, addr: u64, released: bool) {
        if !released && self.faults.slot_busy(slot) {
            return;
        }
        let ram = self.ram.as_ref();
        let Some(e) = Entry::read(ram, addr) else {
            self.counters.unreachable_entries += 1;
            return;
        };
        if !e.owned_by_hw() {
            self.counters.doorbells_on_sw_owned_entry += 1;
            return;
        }
        let verdict = match crate::events::hold(&mut self.hca, ram, slot, addr, &e) {
            crate::events::Hold::Wait => return,
            // Refused pages: the firmware's answer, not subject to injected faults.
            crate::events::Hold::Fail(err) => Verdict::Fail { status: err.status, syndrome: err.syndrome },
            crate::events::Hold::Run => {
                let inline = &e.raw[ifc::cmd_queue_entry::COMMAND_INPUT_INLINE_DATA..];
                let opcode = ifc::get(inline, hdr::OPCODE) as u16;
                let latency = if released {
                    Duration::ZERO
                } else {
                    self.timed += 1;
                    self.timing.latency(inline, self.timed - 1)
                };
                self.faults.on_command(opcode, slot, addr, Instant::now(), released, latency)
            }
        };
        if !matches!(verdict, Verdict::Run | Verdict::Fail { .. }) {
            return;
        }
        self.counters.commands += 1;
        let sig = self.hca.checksums();
        let (input, output, delivery) = match cmdq::deliver(ram, &e, sig) {
            Ok(d) => {
                let bar_pages = self.bar.size() / 4096;
                let out = match verdict {
                    Verdict::Fail { status, syndrome } => crate::fault::output(status, syndrome),
                    _ => crate::cmd::execute(&mut self.hca, &d.input, d.output_length, ram, bar_pages),
                };
                let seen = cmdq::complete(ram, addr, Some(&d), &out, Delivery::Ok, sig);
                (d.input, seen, Delivery::Ok)
            }
            Err(delivery) => {
                let seen = cmdq::complete(ram, addr, None, &[], delivery, false);
                let inline = e.raw[0x10..0x20].to_vec();
                (inline, seen, delivery)
            }
        };
        if let Some(t) = self.trace.as_mut() {
            let r = Record {
                t_ns: self.start.elapsed().as_nanos(),
                slot,
                opcode: ifc::get(&input, hdr::OPCODE) as u16,
                op_mod: ifc::get(&input, hdr::OP_MOD) as u16,
                status: if delivery == Delivery::Ok { ifc::get(&output, hdr::STATUS) as u8 } else { 0 },
                syndrome: if delivery == Delivery::Ok { ifc::get(&output, hdr::SYNDROME) } else { 0 },
                delivery: delivery as u8,
                input: &input,
                output: &output,
            };
            if let Err(err) = t.write(&r) {
                eprintln!("mlx5-model: trace write failed: {err}; trace stopped");
                self.trace = None;
            }
        }
    }

    /// EQ and CQ doorbells (CQ arming, `crate::completion`), then commands that waited for pages and may run
    /// now (`crate::events`).
    fn poll_events(&mut self) -> bool {
        let mut did = self.hca.eqs.poll_doorbells(self.bar.as_ref());
        did |= crate::completion::poll_cq_doorbells(&mut self.hca, self.bar.as_ref(), self.ram.as_ref());
        did |= crate::port::tick(&mut self.hca, self.ram.as_ref(), Instant::now());
        did |= self.eq_overrun_check();
        did |= crate::eth::tx::poll_doorbells(&mut self.hca, self.bar.as_ref(), self.ram.as_ref());
        // A firmware in internal error runs no work request either.
        if self.faults.fatal().is_none() {
            did |= crate::umr::run_pending(&mut self.hca, self.ram.as_ref(), Instant::now());
        }
        self.trace_umr();
        for (slot, addr) in crate::events::ready(&mut self.hca) {
            self.run_slot(slot, addr, false);
            did = true;
        }
        did
    }

    /// Writes the UMR WQEs executed (or flushed) since the last call to the trace, raw bytes included, one line
    /// each (`trace::UmrRecord`); without a trace they are dropped.
    fn trace_umr(&mut self) {
        if self.hca.umr.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.hca.umr.records);
        let Some(t) = self.trace.as_mut() else { return };
        for e in &records {
            let r = crate::trace::UmrRecord {
                t_ns: e.at.saturating_duration_since(self.start).as_nanos(),
                qpn: e.qpn,
                wqe_counter: e.wqe_counter,
                syndrome: e.syndrome,
                wqe: &e.wqe,
            };
            if let Err(err) = t.write_line(&r.to_json()) {
                eprintln!("mlx5-model: trace write failed: {err}; trace stopped");
                self.trace = None;
                return;
            }
        }
    }

    /// An EQ that overran (an EQE was due and every entry was still the driver's, `oi` clear) puts the
    /// firmware in internal error: health syndrome 0xc (`MLX5_INITIAL_SEG_HEALTH_SYNDROME_ASYNCHRONOUS_EQ_BUF_OVERRUN`)
    /// with stock firmware's `rfr` 0, commands no longer complete and the health counter stops
    /// (docs/hca-model.md, "Events and the port"). Returns true when it happened in this pass.
    fn eq_overrun_check(&mut self) -> bool {
        if self.faults.fatal().is_some() || !self.hca.eqs.overrun() {
            return false;
        }
        self.inject(Fault::HealthFatal { synd: crate::eq::SYND_ASYNC_EQ_OVERRUN, rfr: false });
        self.set_health_stopped(true);
        true
    }

    /// The MKEY named by `key` (index `key >> 8` and variant `key & 0xff` must both match; a stale variant
    /// fails closed).
    pub fn mkey(&self, key: u32) -> Option<MkeyInfo> {
        self.hca.mkeys.get(&(key >> 8)).filter(|m| m.key == key).cloned()
    }

    /// Whether a PD is allocated (the responder checks QP and MKEY PDs against live ones).
    pub fn pd_exists(&self, pd: u32) -> bool {
        self.hca.pds.contains(&pd)
    }

    pub fn state(&self) -> FnState {
        self.hca.state
    }

    /// Guest RAM (the dataplane writes through it).
    pub fn ram(&self) -> &Arc<dyn Memory> {
        &self.ram
    }

    pub fn hca(&self) -> &Hca {
        &self.hca
    }

    pub fn hca_mut(&mut self) -> &mut Hca {
        &mut self.hca
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Fault injection: stop (or restart) the health counter.
    pub fn set_health_stopped(&mut self, stopped: bool) {
        if let Some(s) = self.seg.as_mut() {
            s.set_health_stopped(stopped);
        }
    }

    /// Fault injection (`crate::fault`; the control file's commands in `docs/hca-model.md`).
    pub fn inject(&mut self, f: Fault) {
        match f {
            Fault::HealthCounter { stopped } => self.set_health_stopped(stopped),
            Fault::HealthFatal { synd, rfr } if self.seg.is_some() => {
                let _ = InitSeg::raise_fatal(self.bar.as_ref(), synd, rfr);
            }
            _ => {}
        }
        self.hca.umr.inject(f);
        self.faults.add(f);
    }

    /// The health syndrome of the firmware's internal error, once in it (an injected fatal or an EQ overrun).
    pub fn fatal(&self) -> Option<u8> {
        self.faults.fatal()
    }

    pub fn fault_counters(&self) -> FaultCounters {
        self.faults.counters()
    }

    /// Frames the SQs put on the wire since the last call (the wire sends them; without one they are dropped).
    pub fn take_eth_frames(&mut self) -> Vec<Vec<u8>> {
        self.hca.eth.outbox.drain(..).collect()
    }

    /// A frame from the Ethernet wire: RoCEv2 for the port goes to the RDMA responder (its replies to `send`,
    /// QP errors raised as events), everything else through NIC_RX steering into an RQ.
    pub fn eth_receive(&mut self, frame: &[u8], send: &mut dyn FnMut(Vec<u8>)) -> crate::eth::rx::RxOutcome {
        if !self.hca.bus_master {
            return crate::eth::rx::RxOutcome::NoBusMaster;
        }
        if let Some(dropped) = crate::eth::rx::mac_filter(&mut self.hca, frame) {
            return dropped;
        }
        if !crate::eth::rx::is_roce(&self.hca, frame) {
            let ram = self.ram.clone();
            return crate::eth::rx::receive(&mut self.hca, ram.as_ref(), frame);
        }
        self.hca.eth.counters.rx_roce += 1;
        let mut t = crate::dataplane::HcaTables::new(self);
        crate::roce::responder::handle_into(&mut t, frame, send);
        for e in self.hca.qps.take_events() {
            self.raise_qp_event(e.qpn, e.event_type);
        }
        crate::eth::rx::RxOutcome::Roce
    }

    /// Sets or clears Bus Master Enable as a host clearing the PCI command register's bit 2 would (hosted rigs;
    /// [`Hca::bus_master`]). Cleared, [`Model::poll`] does nothing and no frame is taken.
    pub fn set_bus_master(&mut self, on: bool) {
        self.hca.bus_master = on;
    }

    pub fn bus_master(&self) -> bool {
        self.hca.bus_master
    }

    pub fn eth_counters(&self) -> crate::eth::EthCounters {
        self.hca.eth.counters
    }
}
