//! `cargo xtask bench lease`: the lease service at native speed, hosted. The device model runs on its own
//! thread (`ModelMode::Thread`), the driver's engines on another (as the hosted appliance does), and the
//! service with its link loop on this thread, the "appliance core"; clients are request generators in this
//! process, each its own tenant and session with one request outstanding.
//!
//! 1. ALLOC and REVOKE latency (p50/p99), rate, appliance-side time (request in → outcome out minus the time
//!    the HCA held the op's commands, `Completion::hca_ns`), the service's CPU time and HCA commands per
//!    op, with 1 and 8 clients on a service of [`LATENCY_SLOTS`] slots. Rounds: the clients fill the slots
//!    (ALLOC, READY at once), then revoke every lease; the sweep waits for the default grace period, which
//!    the bench skips between rounds by advancing the service's clock (no lease is live then), so the
//!    REVOKE figures are the immediate phase alone.
//! 2. Mass revoke of `--leases` leases (4 KiB each, one slot each, the default grace): the REVOKEs delivered as
//!    the link loop takes them from 8 pipelining tenants ([`REVOKES_PER_PASS`] per tenant and pass, the
//!    engines and the service stepped between passes); time to the last outcome (no sweep runs meanwhile, as in service), then, with the grace skipped by
//!    advancing the service's clock, until every slot is free again; compared with the same HCA commands driven
//!    straight through the driver's client with every regular command slot busy (31 of 32; the request ring
//!    kept full) on objects created for the purpose.
//!
//! `cargo run --release -p leasebox-lease --example lease_bench -- [--secs N] [--leases N] [--engines thread|inline]
//! [--timing zero|firmware] [lease_warm=N]` (`inline`: the engines polled from the link loop, one thread fewer, for machines
//! with fewer than three CPUs; `firmware`: the model holds each command for its firmware time, so the latency
//! rows show what a client waits for, not only the appliance's own time; `lease_warm=` as the appliance takes it,
//! `lease_warm=0` for the command path's figures). Figures only; nothing is asserted. The last line (`summary: ...`) is for xtask, which states the goals.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_lease::LeaseOptions;
use leasebox_lease::service::SCAN_INTERVAL_US;
use leasebox_lease::setup::PlatformHost;
use leasebox_lease::setup::{self, LeaseParts};
use leasebox_lease::{Config, LeaseService, Who};
use leasebox_mlx5::command::{Command, Output, opcode_name};
use leasebox_mlx5::driver::{Config as DriverConfig, Driver};
use leasebox_mlx5::engine::{Client, CommandEngine, Event, EventEngine, Refused};
use leasebox_mlx5::handles::{Mkey, Pdn, Qpn};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::{MkeyAccess, MkeyParams};
use leasebox_mlx5::ifc::qp::{Mtu, QpAccess, QpBase, RcPeer, RcQpParams, RtsParams};
use leasebox_mlx5::platform::{DmaBuf, Platform};
use leasebox_proto::{AllocReq, LeaseId, Reply, Request, Response, access};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;

/// Slots of the service the latency rows run on (the default `lease_slots=`).
const LATENCY_SLOTS: u32 = 1024;
/// Every lease: one 4 KiB extent.
const EXTENT: u64 = 4096;
/// Mass revoke size unless told otherwise.
const DEFAULT_LEASES: u32 = 10_000;
/// Mass revoke: the REVOKE frames the link loop takes from one session per pass. The image hands the service
/// up to 16 KiB per session and pass (`INPUT_CHUNK` in image/src/net.rs), hundreds of REVOKE frames from a
/// client that pipelines hard; the bench's clients pipeline more gently.
const REVOKES_PER_PASS: usize = 16;
/// No phase may take longer than this (a stuck service ends the bench instead of hanging it).
const PHASE_LIMIT: Duration = Duration::from_secs(300);
/// RAM beyond the pool and the QP buffers: the firmware's init pages (~50 MiB), queues.
const RAM_BASE: usize = 160 << 20;
/// Per lease beyond its extent: the QP buffer (4 KiB, 4 KiB aligned), its doorbell record and alignment.
const RAM_PER_LEASE: usize = 12 << 10;

type BenchHost = PlatformHost<HostedPlatform>;

/// A command handed to the client (under the service's tag, as `Link::step` does): the slot it is for.
struct Sent {
    slot: Option<u32>,
    /// A UMR work request, not a command.
    umr: bool,
}

/// One completed command, as seen by the link loop.
struct Done {
    slot: Option<u32>,
    /// Doorbell → the last poll that saw the command still owned by the HCA (the engine's polling delay is
    /// the appliance's time, not the HCA's).
    held_ns: u64,
    /// Time inside `svc.hca_done`.
    cpu_ns: u64,
}

/// The appliance core: the service and this bench's copy of the link loop (`Link::step`), which also sees
/// each completion's `hca_ns` and times the service's calls.
struct Core {
    platform: Arc<HostedPlatform>,
    parts: LeaseParts,
    svc: LeaseService<u64>,
    client: Client,
    host: BenchHost,
    stop: Arc<AtomicBool>,
    engines: Option<JoinHandle<()>>,
    /// `--engines inline`: the engines polled from the link loop instead of their own thread.
    inline: Option<(CommandEngine<HostedPlatform>, EventEngine<HostedPlatform>)>,
    start: Instant,
    /// Added to the service's clock: the grace periods the bench skipped.
    skew_us: u64,
    tags: HashMap<u64, Sent>,
    next_ticket: u64,
    /// Commands submitted by opcode.
    submitted: BTreeMap<u16, u64>,
    /// UMR work requests submitted.
    umr_submitted: u64,
    /// Per lease slot: commands and UMR work requests completed since the slot's op began (an ALLOC's slot is
    /// known only from its answer, so the counts start from the last settle, which clears them).
    slot_work: HashMap<u32, (u32, u32)>,
    /// Filled by `step`.
    done: Vec<Done>,
    answers: Vec<(u64, Reply)>,
    tick_ns: u64,
    ticks: u64,
    ticks_ns_total: u64,
    /// Inside the service: request, hca_done, tick.
    cpu_ns_total: u64,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.engines.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn elapsed_ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

impl Core {
    /// Model thread, driver, lease CQ and pool (room for `max_leases` extents), engines thread; the service
    /// is the latency rows' one.
    fn start(max_leases: u32, inline: bool, timing: Timing) -> Core {
        let pool_mib = (u64::from(max_leases) * EXTENT).div_ceil(1 << 20) as u32;
        let ram = RAM_BASE + (pool_mib as usize) * (1 << 20) + max_leases as usize * RAM_PER_LEASE;
        let model = match timing {
            Timing::Zero => ModelConfig::instant(),
            Timing::Firmware => ModelConfig { timing: ModelConfig::default().timing, ..ModelConfig::instant() },
        };
        let platform = Arc::new(HostedPlatform::with_model(model, ram, ModelMode::Thread));
        let dcfg = DriverConfig { part: "ConnectX-5", pre_init_timeout_ms: 5_000, ..DriverConfig::default() };
        let mut d = Driver::bring_up(platform.clone(), dcfg).unwrap_or_else(|e| fail(&format!("bring-up: {e}")));
        let o = LeaseOptions { pool_mib, slots: Some(max_leases.max(LATENCY_SLOTS)), ..LeaseOptions::default() };
        let parts = setup::prepare(&mut d, &o, None).unwrap_or_else(|e| fail(&format!("lease set-up: {e}")));
        let (cmd, ev, mut client, info) = d.into_engines();
        eprintln!(
            "lease_bench: HCA up ({} fw {}), pool {pool_mib} MiB, RAM {} MiB, {} CPUs, lease_warm={}",
            info.part,
            info.fw,
            ram >> 20,
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            WARM.load(Ordering::Relaxed)
        );
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let (engines, inline) =
            if inline { (None, Some((cmd, ev))) } else { (Some(spawn_engines(cmd, ev, &mut client, s)), None) };
        let svc = service(&parts, LATENCY_SLOTS, None);
        Core {
            host: PlatformHost::new(platform.clone(), parts.extents.clone()),
            platform,
            parts,
            svc,
            client,
            stop,
            engines,
            inline,
            start: Instant::now(),
            skew_us: 0,
            tags: HashMap::new(),
            next_ticket: 1,
            submitted: BTreeMap::new(),
            umr_submitted: 0,
            slot_work: HashMap::new(),
            done: Vec::new(),
            answers: Vec::new(),
            tick_ns: 0,
            ticks: 0,
            ticks_ns_total: 0,
            cpu_ns_total: 0,
        }
    }

    /// With `--engines inline`: one pass of each engine.
    fn poll_engines(&mut self) {
        if let Some((cmd, ev)) = &mut self.inline {
            cmd.poll();
            ev.poll();
        }
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64 + self.skew_us
    }

    /// One request; returns its ticket, the immediate answer if any and the time inside `svc.request`.
    fn request(&mut self, who: Who<'_>, req: &Request) -> (u64, Option<Reply>, u64) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let now = self.now_us();
        let t = Instant::now();
        let r = self.svc.request(who, req, ticket, now, &mut self.host);
        let cpu = elapsed_ns(t);
        self.cpu_ns_total += cpu;
        (ticket, r, cpu)
    }

    /// One pass of the link loop (`Link::step`): results to the service, events, the service's timers, its
    /// commands to the client; then the answers.
    fn step(&mut self) {
        self.poll_engines();
        self.done.clear();
        let now = self.now_us();
        while let Some(c) = self.client.poll() {
            let Some(s) = self.tags.remove(&c.tag) else { continue };
            let t = Instant::now();
            self.svc.hca_done(c.tag, c.result, now, &mut self.host);
            let cpu = elapsed_ns(t);
            self.cpu_ns_total += cpu;
            if let Some(slot) = s.slot {
                let w = self.slot_work.entry(slot).or_default();
                if s.umr { w.1 += 1 } else { w.0 += 1 }
            }
            self.done.push(Done { slot: s.slot, held_ns: c.hca_ns, cpu_ns: cpu });
        }
        while let Some(e) = self.client.next_event() {
            if let Event::Fatal(f) = e {
                fail(&format!("the HCA died: {f}"));
            }
        }
        // The scrub's share runs on the appliance's timer, off the request path; here it is left out of
        // the service's timed CPU.
        self.svc.scrub(now, &mut self.host);
        let t = Instant::now();
        self.svc.tick(now, &mut self.host);
        self.tick_ns = elapsed_ns(t);
        self.ticks += 1;
        self.ticks_ns_total += self.tick_ns;
        self.cpu_ns_total += self.tick_ns;
        // UMR work first, as `Link::step` submits it (a revoke's work request is its immediate phase). A copy
        // of the link loop that leaves this out strands every grant on a warm entry in the service's queue.
        while self.client.room() > 0 {
            let Some((svc_tag, work)) = self.svc.next_umr() else { break };
            match self.client.submit_umr(svc_tag, work) {
                Ok(()) => {
                    self.tags.insert(svc_tag, Sent { slot: LeaseService::<u64>::tag_lease_slot(svc_tag), umr: true });
                    self.umr_submitted += 1;
                }
                Err((work, None)) => {
                    self.svc.unsend_umr(svc_tag, work);
                    break;
                }
                Err((_, Some(e))) => fail(&format!("{e}")),
            }
        }
        while self.client.room() > 0 {
            let Some((svc_tag, cmd)) = self.svc.next_command() else { break };
            let opcode = cmd.opcode();
            // The tag names the slot, as for UMR work (the warm pool's own commands: none).
            let slot = LeaseService::<u64>::tag_lease_slot(svc_tag);
            match self.client.submit_as(svc_tag, cmd) {
                Ok(()) => {
                    self.tags.insert(svc_tag, Sent { slot, umr: false });
                    *self.submitted.entry(opcode).or_default() += 1;
                }
                Err(Refused::Full(cmd)) => {
                    self.svc.unsend(svc_tag, cmd);
                    break;
                }
                Err(Refused::ReservedTag(e)) => fail(&format!("{e}")),
            }
        }
        self.svc.take_answers(&mut self.answers);
    }

    /// Steps until every lease revoked so far is swept (skipping the grace period) and nothing is in flight.
    /// Returns the sweep's commands.
    fn settle(&mut self, swept_target: u64) -> u64 {
        self.skew_us += self.svc.config().grace_ms * 1000;
        let c0 = self.svc.counters.commands;
        let t0 = Instant::now();
        while self.svc.counters.swept < swept_target || self.svc.in_flight() > 0 || self.svc.has_commands() {
            self.step();
            self.answers.clear();
            if t0.elapsed() > PHASE_LIMIT {
                fail(&format!("the sweep did not finish: {:?} leases by state", self.svc.by_state()));
            }
        }
        self.slot_work.clear();
        self.svc.counters.commands - c0
    }
}

/// The engines on their own thread, as the hosted appliance runs them.
fn spawn_engines(
    cmd: CommandEngine<HostedPlatform>,
    ev: EventEngine<HostedPlatform>,
    client: &mut Client,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    mlx5_hosted::spawn_engines(cmd, ev, client, stop).expect("spawn the engines thread")
}

fn fail(msg: &str) -> ! {
    eprintln!("lease_bench: {msg}");
    std::process::exit(1)
}

/// The first `bytes` of the pool's runs.
fn first_bytes(runs: &[std::ops::Range<u64>], mut bytes: u64) -> Vec<std::ops::Range<u64>> {
    let mut out = Vec::new();
    for r in runs {
        let n = bytes.min(r.end - r.start);
        if n == 0 {
            break;
        }
        out.push(r.start..r.start + n);
        bytes -= n;
    }
    out
}

/// A service over the pool with `slots` slots of one extent each; `grace_ms` `None` keeps the default.
fn service(parts: &LeaseParts, slots: u32, grace_ms: Option<u64>) -> LeaseService<u64> {
    let o = LeaseOptions { slots: Some(slots), warm: WARM.load(Ordering::Relaxed), ..LeaseOptions::default() };
    let base = Config::from_options(&o, parts);
    let cfg = Config {
        extent: EXTENT,
        pool: first_bytes(&parts.pool, u64::from(slots) * EXTENT),
        tenant_leases: slots,
        default_ttl_ms: base.max_ttl_ms,
        grace_ms: grace_ms.unwrap_or(base.grace_ms),
        // The options' warm pool (the UMR path by default): the by-path table shows both paths, since a burst
        // outruns the warm pool and takes the commands.
        ..base
    };
    // A fixed seed: the benchmark wants reproducible runs.
    LeaseService::new(cfg, parts.hca, leasebox_session::IdRng::from_seed([0x1e; 32]))
        .unwrap_or_else(|e| fail(&format!("lease configuration: {e}")))
}

fn alloc_req(client: usize) -> AllocReq {
    AllocReq {
        size: EXTENT,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x1000 + client as u32,
        client_psn: 0x100,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
        client_mac: [0x02, 0, 0, 0, 0, 0x02],
    }
}

/// A simulated client: its own tenant and session.
struct Tenant {
    name: String,
    session: u64,
}

impl Tenant {
    fn who(&self) -> Who<'_> {
        Who { session: self.session, tenant: &self.name, admin: false }
    }
}

fn tenants(n: usize) -> Vec<Tenant> {
    (0..n).map(|i| Tenant { name: format!("client{i}"), session: 100 + i as u64 }).collect()
}

/// One operation's figures, ns.
#[derive(Clone, Copy, Default)]
struct Sample {
    latency: u64,
    /// The HCA's hold time of the op's commands (those attributed to it).
    held: u64,
    /// Inside the service: the op's `request` and `hca_done` calls, plus its share of each `tick` while it
    /// was outstanding.
    cpu: u64,
    /// HCA commands and UMR work requests for the op's slot that completed while it was outstanding (its
    /// immediate phase; for an ALLOC its build).
    cmds: u32,
    umr: u32,
}

impl Sample {
    fn appliance(&self) -> u64 {
        self.latency.saturating_sub(self.held)
    }
}

struct Pending {
    ticket: u64,
    slot: Option<u32>,
    t_in: Instant,
    s: Sample,
}

/// What a phase produced.
struct Phase {
    samples: Vec<Sample>,
    replies: Vec<Vec<Reply>>,
    secs: f64,
    commands: u64,
    /// Completions that could not be tied to one op (their hold time is in no sample).
    unattributed: u64,
}

/// Each client works through its queue with one request outstanding; ALLOC answers get their READY at once
/// (not timed). Returns every op's figures and every client's replies in order.
fn drive(core: &mut Core, who: &[Tenant], mut queues: Vec<VecDeque<Request>>) -> Phase {
    let n = who.len();
    let mut pending: Vec<Option<Pending>> = (0..n).map(|_| None).collect();
    let mut owner: HashMap<u64, usize> = HashMap::new();
    let mut out = Phase {
        samples: Vec::with_capacity(queues.iter().map(VecDeque::len).sum()),
        replies: vec![Vec::new(); n],
        secs: 0.0,
        commands: 0,
        unattributed: 0,
    };
    let c0 = core.svc.counters.commands;
    let t0 = Instant::now();
    loop {
        for i in 0..n {
            while pending[i].is_none() {
                let Some(req) = queues[i].pop_front() else { break };
                let slot = match &req {
                    Request::Revoke { lease, .. } => Some(lease.slot),
                    _ => None,
                };
                if let Some(s) = slot {
                    core.slot_work.remove(&s);
                }
                let t_in = Instant::now();
                let (ticket, now, cpu) = core.request(who[i].who(), &req);
                match now {
                    Some(r) => {
                        let s = Sample { latency: elapsed_ns(t_in), cpu, ..Sample::default() };
                        finish(core, &who[i], &mut out, i, s, r, slot);
                    }
                    None => {
                        owner.insert(ticket, i);
                        pending[i] = Some(Pending { ticket, slot, t_in, s: Sample { cpu, ..Sample::default() } });
                    }
                }
            }
        }
        let outstanding = pending.iter().filter(|p| p.is_some()).count();
        if outstanding == 0 {
            break;
        }
        core.step();
        let share = core.tick_ns / outstanding as u64;
        for p in pending.iter_mut().flatten() {
            p.s.cpu += share;
        }
        for d in &core.done {
            let mine = match d.slot {
                Some(s) => pending.iter_mut().flatten().find(|p| p.slot == Some(s)),
                None if outstanding == 1 => pending.iter_mut().flatten().next(),
                None => None,
            };
            match mine {
                Some(p) => {
                    p.s.held += d.held_ns;
                    p.s.cpu += d.cpu_ns;
                }
                None => {
                    out.unattributed += 1;
                    let share = d.cpu_ns / outstanding as u64;
                    for p in pending.iter_mut().flatten() {
                        p.s.cpu += share;
                    }
                }
            }
        }
        let at = Instant::now();
        for (ticket, r) in std::mem::take(&mut core.answers) {
            let Some(i) = owner.remove(&ticket) else { continue };
            let Some(p) = pending[i].take() else { continue };
            debug_assert_eq!(p.ticket, ticket);
            let s = Sample { latency: at.duration_since(p.t_in).as_nanos() as u64, ..p.s };
            finish(core, &who[i], &mut out, i, s, r, p.slot);
        }
        if t0.elapsed() > PHASE_LIMIT {
            fail(&format!("a phase took over {PHASE_LIMIT:?}: {:?} leases by state", core.svc.by_state()));
        }
    }
    out.secs = t0.elapsed().as_secs_f64();
    out.commands = core.svc.counters.commands - c0;
    out
}

fn finish(core: &mut Core, who: &Tenant, out: &mut Phase, i: usize, mut s: Sample, r: Reply, slot: Option<u32>) {
    let slot = match &r {
        Ok(Response::Alloc(a)) => Some(a.lease.slot),
        _ => slot,
    };
    if let Some((cmds, umr)) = slot.and_then(|slot| core.slot_work.remove(&slot)) {
        (s.cmds, s.umr) = (cmds, umr);
    }
    match &r {
        Ok(Response::Alloc(a)) => {
            let ready = Request::Ready { lease: a.lease, client_qpn: 0x1000 + i as u32, server_qpn: a.server_qpn };
            match core.request(who.who(), &ready) {
                (_, Some(Ok(Response::Ready { .. })), _) => {}
                (_, other, _) => fail(&format!("READY: {other:?}")),
            }
        }
        Ok(Response::Revoke { .. }) => {}
        other => fail(&format!("unexpected answer: {other:?}")),
    }
    out.samples.push(s);
    out.replies[i].push(r);
}

/// The leases ALLOC granted, per client.
fn granted(p: &Phase) -> Vec<Vec<LeaseId>> {
    p.replies
        .iter()
        .map(|rs| {
            rs.iter()
                .filter_map(|r| match r {
                    Ok(Response::Alloc(a)) => Some(a.lease),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

fn outcomes<'a>(replies: impl Iterator<Item = &'a Reply>, tally: &mut BTreeMap<String, u64>) {
    for r in replies {
        if let Ok(Response::Revoke { outcome, .. }) = r {
            *tally.entry(format!("{outcome:?}")).or_default() += 1;
        }
    }
}

/// One latency row (1 or 8 clients): rounds of fill, revoke, settle until `dur` has passed.
struct Row {
    clients: usize,
    alloc: Vec<Sample>,
    revoke: Vec<Sample>,
    alloc_secs: f64,
    revoke_secs: f64,
    alloc_cmds: u64,
    revoke_cmds: u64,
    sweep_cmds: u64,
    swept: u64,
    unattributed: u64,
    outcomes: BTreeMap<String, u64>,
    /// The warm pool over the row: entries built, entries the sweep gave back, its commands.
    warm_built: u64,
    warm_recycled: u64,
    warm_cmds: u64,
}

fn latency_row(core: &mut Core, clients: usize, per_client: usize, dur: Duration) -> Row {
    let who = tenants(clients);
    let mut row = Row {
        clients,
        alloc: Vec::new(),
        revoke: Vec::new(),
        alloc_secs: 0.0,
        revoke_secs: 0.0,
        alloc_cmds: 0,
        revoke_cmds: 0,
        sweep_cmds: 0,
        swept: 0,
        unattributed: 0,
        outcomes: BTreeMap::new(),
        warm_built: 0,
        warm_recycled: 0,
        warm_cmds: 0,
    };
    let c = &core.svc.counters;
    let (built0, recycled0, warm_cmds0) = (c.warm_built, c.warm_recycled, c.warm_commands);
    let t0 = Instant::now();
    while row.alloc.is_empty() || t0.elapsed() < dur {
        let queues = (0..clients).map(|i| (0..per_client).map(|_| Request::Alloc(alloc_req(i))).collect()).collect();
        let a = drive(core, &who, queues);
        let leases = granted(&a);
        let queues = leases
            .iter()
            .map(|ls| ls.iter().map(|&lease| Request::Revoke { lease, qp_first: false }).collect())
            .collect();
        // Read before the REVOKEs: on a slow machine a long phase outlasts the grace period, and the sweep of
        // its first leases starts while the last are still being revoked.
        let swept0 = core.svc.counters.swept;
        let r = drive(core, &who, queues);
        outcomes(r.replies.iter().flatten(), &mut row.outcomes);
        row.sweep_cmds += core.settle(swept0 + r.samples.len() as u64);
        row.swept += core.svc.counters.swept - swept0;
        row.alloc.extend(a.samples);
        row.revoke.extend(r.samples);
        row.alloc_secs += a.secs;
        row.revoke_secs += r.secs;
        row.alloc_cmds += a.commands;
        row.revoke_cmds += r.commands;
        row.unattributed += r.unattributed;
    }
    let c = &core.svc.counters;
    row.warm_built = c.warm_built - built0;
    row.warm_recycled = c.warm_recycled - recycled0;
    row.warm_cmds = c.warm_commands - warm_cmds0;
    eprintln!(
        "lease_bench: {clients} client(s): {} ALLOC at {:.0}/s, {} REVOKE at {:.0}/s",
        row.alloc.len(),
        row.alloc.len() as f64 / row.alloc_secs,
        row.revoke.len(),
        row.revoke.len() as f64 / row.revoke_secs
    );
    row
}

/// The mass revoke's figures.
struct Mass {
    leases: u32,
    fill_secs: f64,
    idle_tick_us: f64,
    issue_ms: f64,
    first_ms: f64,
    last_ms: f64,
    swept_ms: f64,
    outcomes: BTreeMap<String, u64>,
    /// Commands submitted during the mass revoke, by opcode.
    commands: BTreeMap<u16, u64>,
    ticks: u64,
    tick_ns: u64,
    /// Inside the service (request, hca_done, tick) from the first REVOKE to all swept.
    cpu_ns: u64,
}

fn mass_revoke(core: &mut Core, leases: u32) -> Mass {
    core.svc = service(&core.parts, leases, None);
    let grace_us = core.svc.config().grace_ms * 1000;
    let clients = 8usize;
    let who = tenants(clients);
    let queues = (0..clients)
        .map(|i| {
            let n = leases as usize / clients + usize::from(i < leases as usize % clients);
            (0..n).map(|_| Request::Alloc(alloc_req(i))).collect()
        })
        .collect();
    let fill = drive(core, &who, queues);
    let all = granted(&fill);
    let count: usize = all.iter().map(Vec::len).sum();
    eprintln!("lease_bench: mass revoke: {count} leases granted and READY in {:.2} s", fill.secs);
    // One timer scan over every slot live with nothing to do (the clock moves one scan interval per call,
    // since `tick` scans at most once per interval).
    let idle_tick_us = {
        let mut spent = 0;
        for _ in 0..100 {
            core.skew_us += SCAN_INTERVAL_US;
            let now = core.now_us();
            let t = Instant::now();
            core.svc.tick(now, &mut core.host);
            spent += elapsed_ns(t);
        }
        spent as f64 / 100.0 / 1e3
    };
    let before = core.submitted.clone();
    let (ticks0, tick_ns0, cpu0) = (core.ticks, core.ticks_ns_total, core.cpu_ns_total);
    let swept0 = core.svc.counters.swept;
    let mut answered = 0usize;
    let mut tally = BTreeMap::new();
    let t0 = Instant::now();
    let (mut first_ms, mut last_ms) = (None, None);
    let mut sweep_from = None;
    let mut issue_ms = None;
    let mut next = vec![0usize; all.len()];
    loop {
        // The REVOKEs arrive as the appliance's link loop takes them: each pass serves every session's
        // pending frames (here up to REVOKES_PER_PASS per client, as a client pipelining its REVOKEs fills its
        // socket), then steps the engines and the service, so the HCA works while later requests come in.
        if issue_ms.is_none() {
            for (i, ls) in all.iter().enumerate() {
                let end = (next[i] + REVOKES_PER_PASS).min(ls.len());
                for &lease in &ls[next[i]..end] {
                    let (_, now, _) = core.request(who[i].who(), &Request::Revoke { lease, qp_first: false });
                    if let Some(r) = now {
                        answered += 1;
                        outcomes([r].iter(), &mut tally);
                    }
                }
                next[i] = end;
            }
            if next.iter().zip(&all).all(|(&n, ls)| n == ls.len()) {
                issue_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        core.step();
        if !core.answers.is_empty() {
            let at = t0.elapsed().as_secs_f64() * 1e3;
            first_ms.get_or_insert(at);
            answered += core.answers.len();
            outcomes(core.answers.iter().map(|(_, r)| r), &mut tally);
            core.answers.clear();
            if answered >= count {
                last_ms.get_or_insert(at);
            }
        }
        if answered >= count && sweep_from.is_none() {
            // Every outcome is out: skip the grace period (the wait itself is not the service's work).
            core.skew_us += grace_us;
            sweep_from = Some(Instant::now());
        }
        // A Fenced slot is never swept (it stays fenced until an admin clears it): it counts as done here.
        if answered >= count
            && core.svc.in_flight() == 0
            && core.svc.counters.swept - swept0 + u64::from(core.svc.by_state()[4]) >= count as u64
        {
            break;
        }
        if t0.elapsed() > PHASE_LIMIT {
            fail(&format!("the mass revoke did not finish: {answered} outcomes, {:?} by state", core.svc.by_state()));
        }
    }
    // Last outcome, then the sweep's own time (the grace skipped).
    let issue_ms = issue_ms.unwrap_or(0.0);
    let swept_ms = last_ms.unwrap_or(issue_ms) + sweep_from.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
    let commands = core
        .submitted
        .iter()
        .map(|(&op, &n)| (op, n - before.get(&op).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect();
    Mass {
        leases: count as u32,
        fill_secs: fill.secs,
        idle_tick_us,
        issue_ms,
        first_ms: first_ms.unwrap_or(issue_ms),
        last_ms: last_ms.unwrap_or(issue_ms),
        swept_ms,
        outcomes: tally,
        commands,
        ticks: core.ticks - ticks0,
        tick_ns: core.ticks_ns_total - tick_ns0,
        cpu_ns: core.cpu_ns_total - cpu0,
    }
}

/// Runs `cmds` straight through the client with its request ring kept full (every regular command slot busy);
/// returns the outputs in order and the time, ms.
fn pipeline(core: &mut Core, cmds: Vec<Command>) -> (Vec<Output>, f64) {
    assert!(core.svc.in_flight() == 0 && !core.svc.has_commands() && core.tags.is_empty());
    let total = cmds.len();
    let mut todo: VecDeque<(usize, Command)> = cmds.into_iter().enumerate().collect();
    let mut outs: Vec<Option<Output>> = (0..total).map(|_| None).collect();
    let mut inflight: HashMap<u64, usize> = HashMap::with_capacity(256);
    let mut got = 0;
    let t0 = Instant::now();
    while got < total {
        // The request ring stays full (as the service's outbox keeps it), so a slot that frees finds its next
        // command waiting in the engine.
        while core.client.room() > 0 {
            let Some((i, cmd)) = todo.pop_front() else { break };
            match core.client.submit(cmd) {
                Ok(tag) => {
                    inflight.insert(tag, i);
                }
                Err(cmd) => {
                    todo.push_front((i, cmd));
                    break;
                }
            }
        }
        core.poll_engines();
        while let Some(c) = core.client.poll() {
            let Some(i) = inflight.remove(&c.tag) else { continue };
            match c.result {
                Ok(o) => outs[i] = Some(o),
                Err(e) => fail(&format!("model-alone command failed: {e}")),
            }
            got += 1;
        }
        if t0.elapsed() > PHASE_LIMIT {
            fail("the model-alone commands did not finish");
        }
    }
    (outs.into_iter().map(|o| o.expect("every output")).collect(), t0.elapsed().as_secs_f64() * 1e3)
}

/// The model alone: `n` leases' objects (PD, 4 KiB MKEY over a pool extent, RC QP in RTS, as ALLOC builds
/// them), then, timed, the revoke's DESTROY_MKEY for all, and the sweep's 2ERR_QP, 2RST_QP, DESTROY_QP,
/// DEALLOC_PD for all (one wave per opcode, every slot busy). Returns both times, ms.
fn model_alone(core: &mut Core, n: usize) -> (f64, f64) {
    let hca = core.parts.hca;
    let pool = core.parts.pool[0].start;
    let (pds, _) = pipeline(core, (0..n).map(|_| ifc::resources::alloc_pd()).collect());
    let pds: Vec<Pdn> = pds.iter().map(ifc::resources::parse_alloc_pd).collect();
    let bufs: Vec<(DmaBuf, DmaBuf)> = (0..n)
        .map(|_| {
            let b = core.platform.dma_alloc(4096, 4096).expect("a QP buffer");
            let d = core.platform.dma_alloc(64, 64).expect("a doorbell record");
            (b, d)
        })
        .collect();
    let creates = (0..n)
        .map(|i| {
            ifc::qp::create_rc_qp(&RcQpParams {
                pd: pds[i],
                uar_page: hca.uar,
                cqn_snd: hca.cqn,
                cqn_rcv: hca.cqn,
                log_rq_size: None,
                log_rq_stride: 0,
                log_sq_size: 6,
                log_msg_max: hca.qp.log_msg_max,
                ts_format: hca.qp.ts_format,
                user_index: hca.qp.user_index,
                log_page_size: 0,
                dbr_addr: bufs[i].1.addr(),
                pages: &[bufs[i].0.addr()],
            })
        })
        .collect();
    let (qps, _) = pipeline(core, creates);
    let base: Vec<QpBase> = (0..n)
        .map(|i| QpBase { qpn: ifc::qp::create_qp_out(&qps[i]), pd: pds[i], cqn_snd: hca.cqn, cqn_rcv: hca.cqn })
        .collect();
    let qpns: Vec<Qpn> = base.iter().map(|b| b.qpn).collect();
    let qp_access = QpAccess { remote_read: true, remote_write: true, remote_atomic: false };
    pipeline(core, base.iter().map(|b| ifc::qp::rst2init(b, qp_access, hca.qp.atomic_mode)).collect());
    let peer = |b: &QpBase| RcPeer {
        qpn: Qpn(0x1000),
        psn: 0x100,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
        mac: [0x02, 0, 0, 0, 0, 0x02],
        mtu: Mtu::Mtu1024,
        sgid_index: hca.gid_index,
        hop_limit: 64,
        udp_sport: ifc::qp::roce_udp_sport(b.qpn, Qpn(0x1000)),
        tclass: 0,
        eth_prio: 0,
        log_rra_max: 4,
        min_rnr_nak: 12,
    };
    pipeline(core, base.iter().map(|b| ifc::qp::init2rtr(b, &peer(b), hca.qp.log_msg_max)).collect());
    let rts = RtsParams { psn: 0x200, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 0 };
    pipeline(core, base.iter().map(|b| ifc::qp::rtr2rts(b, &rts)).collect());
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let mkeys = (0..n)
        .map(|i| {
            let page = pool + i as u64 * EXTENT;
            ifc::mkey::create_mkey_mtt(&MkeyParams {
                pd: pds[i],
                variant: i as u8,
                start: page,
                len: EXTENT,
                access,
                log_page_size: 12,
                pages: &[page],
            })
        })
        .collect();
    let (keys, _) = pipeline(core, mkeys);
    let keys: Vec<Mkey> = keys.iter().enumerate().map(|(i, o)| ifc::mkey::create_mkey_out_key(o, i as u8)).collect();
    let (_, mkey_ms) = pipeline(core, keys.iter().map(|k| ifc::mkey::destroy_mkey(k.index())).collect());
    let mut sweep_ms = 0.0;
    sweep_ms += pipeline(core, qpns.iter().map(|&q| ifc::qp::qp_2err(q)).collect()).1;
    sweep_ms += pipeline(core, qpns.iter().map(|&q| ifc::qp::qp_2rst(q)).collect()).1;
    sweep_ms += pipeline(core, qpns.iter().map(|&q| ifc::qp::destroy_qp(q)).collect()).1;
    sweep_ms += pipeline(core, pds.iter().map(|&pd| ifc::resources::dealloc_pd(pd)).collect()).1;
    for (b, d) in bufs {
        core.platform.dma_free(b);
        core.platform.dma_free(d);
    }
    (mkey_ms, sweep_ms)
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64
}

/// p50 and p99 of `f` over `samples`, µs.
fn p50_p99(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> (f64, f64) {
    let mut v: Vec<u64> = samples.iter().map(f).collect();
    v.sort_unstable();
    (percentile(&v, 0.50) / 1e3, percentile(&v, 0.99) / 1e3)
}

/// The command timing the model plays (`--timing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timing {
    /// Commands at the model's own speed (the default).
    Zero,
    /// The model's firmware-like command timing (docs/hca-model.md): what a client would wait for.
    Firmware,
}

/// `lease_warm=` (the options' default unless given), read by [`service`].
static WARM: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(LeaseOptions::DEFAULT.warm);

struct Args {
    secs: f64,
    leases: u32,
    inline: bool,
    timing: Timing,
}

fn parse_args() -> Result<Args, String> {
    let (mut secs, mut leases, mut engines_inline) = (2.0, DEFAULT_LEASES, false);
    let mut timing = Timing::Zero;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| args.next()).ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--secs" => {
                let v = value()?;
                secs = match v.parse::<f64>() {
                    Ok(s) if s > 0.0 && s <= 600.0 => s,
                    _ => return Err(format!("--secs needs a number of seconds from 0 to 600, got `{v}`")),
                };
            }
            "--leases" => {
                let v = value()?;
                leases = match v.parse::<u32>() {
                    Ok(n) if (8..=16_000).contains(&n) => n,
                    _ => return Err(format!("--leases needs a number from 8 to 16000, got `{v}`")),
                };
            }
            "--timing" => {
                timing = match value()?.as_str() {
                    "zero" => Timing::Zero,
                    "firmware" => Timing::Firmware,
                    v => return Err(format!("--timing needs `zero` or `firmware`, got `{v}`")),
                };
            }
            "--engines" => {
                engines_inline = match value()?.as_str() {
                    "thread" => false,
                    "inline" => true,
                    v => return Err(format!("--engines needs `thread` or `inline`, got `{v}`")),
                };
            }
            "lease_warm" => {
                let mut o = LeaseOptions::default();
                o.apply("lease_warm", &value()?).map_err(|e| format!("lease_warm: {e}"))?;
                WARM.store(o.warm, Ordering::Relaxed);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (usage: lease_bench [--secs N] [--leases N] [--engines \
                     thread|inline] [--timing zero|firmware] [lease_warm=N])"
                ));
            }
        }
    }
    Ok(Args { secs, leases, inline: engines_inline, timing })
}

fn main() {
    let Args { secs, leases, inline, timing } = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lease_bench: {e}");
            std::process::exit(2);
        }
    };
    let mut core = Core::start(leases.max(LATENCY_SLOTS), inline, timing);
    // Warm-up: one small round, not recorded.
    latency_row(&mut core, 8, 16, Duration::ZERO);
    let dur = Duration::from_secs_f64(secs);
    let rows: Vec<Row> =
        [1usize, 8].iter().map(|&c| latency_row(&mut core, c, LATENCY_SLOTS as usize / c, dur)).collect();
    let mass = mass_revoke(&mut core, leases);
    eprintln!(
        "lease_bench: mass revoke of {}: last outcome {:.1} ms, all swept {:.1} ms",
        mass.leases, mass.last_ms, mass.swept_ms
    );
    let (mkey_ms, sweep_ms) = model_alone(&mut core, mass.leases as usize);
    eprintln!(
        "lease_bench: model alone: DESTROY_MKEY ×{} {mkey_ms:.1} ms, sweep commands {sweep_ms:.1} ms",
        mass.leases
    );
    print!("{}", report(secs, inline, timing, &rows, &mass, mkey_ms, sweep_ms));
}

fn us(v: f64) -> String {
    format!("{v:.1}")
}

fn report(secs: f64, inline: bool, timing: Timing, rows: &[Row], m: &Mass, mkey_ms: f64, sweep_ms: f64) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "hosted, native: model on its own thread ({}), {}, service + link loop on the bench thread \
         ({LATENCY_SLOTS} slots, 4 KiB leases, {} CPUs):\n",
        match timing {
            Timing::Zero => "commands at the model's own speed",
            Timing::Firmware => "the model's firmware command timing",
        },
        if inline { "driver engines polled from the link loop" } else { "driver engines on another thread" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));
    let headers = [
        "op",
        "clients",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "appliance p50 µs",
        "appliance p99 µs",
        "service CPU p50 µs",
        "service CPU p99 µs",
        "HCA held p50 µs",
        "HCA cmds/op",
    ];
    let mut cells = Vec::new();
    for r in rows {
        for (op, samples, secs, cmds) in
            [("ALLOC", &r.alloc, r.alloc_secs, r.alloc_cmds), ("REVOKE", &r.revoke, r.revoke_secs, r.revoke_cmds)]
        {
            let (p50, p99) = p50_p99(samples, |s| s.latency);
            let (a50, a99) = p50_p99(samples, Sample::appliance);
            let (c50, c99) = p50_p99(samples, |s| s.cpu);
            let (h50, _) = p50_p99(samples, |s| s.held);
            cells.push(vec![
                op.to_string(),
                r.clients.to_string(),
                format!("{:.0}", samples.len() as f64 / secs),
                us(p50),
                us(p99),
                us(a50),
                us(a99),
                us(c50),
                us(c99),
                us(h50),
                format!("{:.2}", cmds as f64 / samples.len().max(1) as f64),
            ]);
        }
    }
    out.push_str(&mlx5_hosted::table::render(&headers, &cells, 1));
    for r in rows {
        let outcomes: Vec<String> = r.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push_str(&format!(
            "{} client(s): {} ALLOC, {} REVOKE ({}), sweep {:.2} HCA commands per lease over {} swept{}\n",
            r.clients,
            r.alloc.len(),
            r.revoke.len(),
            outcomes.join(", "),
            r.sweep_cmds as f64 / r.swept.max(1) as f64,
            r.swept,
            if r.unattributed > 0 {
                format!("; {} completions not tied to one op", r.unattributed)
            } else {
                String::new()
            }
        ));
    }
    out.push_str(&paths_table(rows));
    out.push_str(&format!(
        "({secs} s per row in rounds: the clients fill the {LATENCY_SLOTS} slots (ALLOC, then READY at once, \
         untimed), then revoke them all, then the sweep runs with the grace period skipped (service clock \
         advanced);\n each client is its own tenant with one request outstanding; latency = request in → answer \
         taken from the service; HCA held = doorbell → the last poll that saw the command still owned by the HCA\n \
         (Completion::hca_ns; the engine's polling delay after that counts as appliance time) of the op's commands; appliance = latency − HCA held; service CPU = time inside svc.request + svc.hca_done of the \
         op's commands + its share of svc.tick while outstanding; cmds/op from svc.counters.commands)\n"
    ));

    let outcomes: Vec<String> = m.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let n = f64::from(m.leases.max(1));
    let immediate = m.commands.get(&ifc::mkey::MLX5_CMD_OP_DESTROY_MKEY).copied().unwrap_or(0);
    let others: Vec<String> = m
        .commands
        .iter()
        .filter(|(op, _)| **op != ifc::mkey::MLX5_CMD_OP_DESTROY_MKEY)
        .map(|(op, c)| format!("{} {c}", opcode_name(*op)))
        .collect();
    let sweep_total: u64 =
        m.commands.iter().filter(|(op, _)| **op != ifc::mkey::MLX5_CMD_OP_DESTROY_MKEY).map(|(_, c)| *c).sum();
    let mass_ratio = m.last_ms / mkey_ms;
    let sweep_ratio = m.swept_ms / (mkey_ms + sweep_ms);
    out.push_str(&format!(
        "\nmass revoke: {} leases of 4 KiB in {} slots, 8 tenants; every tenant pipelines its REVOKEs and each pass \
         of the link loop takes up to {REVOKES_PER_PASS} per tenant, then steps the engines and the service (no sweep until the last \
         outcome: the grace period; then the grace is skipped):\n",
        m.leases, m.leases
    ));
    let figures = [
        (
            "fill: ALLOC + READY with 8 clients".to_string(),
            format!("{:.2} s ({:.0} ALLOC/s)", m.fill_secs, n / m.fill_secs),
        ),
        ("all REVOKEs taken in (svc.request)".to_string(), format!("{:.1} ms", m.issue_ms)),
        ("first outcome".to_string(), format!("{:.1} ms", m.first_ms)),
        ("last outcome".to_string(), format!("{:.1} ms", m.last_ms)),
        ("all swept (every slot free; the grace wait not counted)".to_string(), format!("{:.1} ms", m.swept_ms)),
        ("outcomes".to_string(), outcomes.join(", ")),
        (
            "HCA commands per lease".to_string(),
            format!(
                "immediate DESTROY_MKEY {:.2}; sweep {:.2} ({})",
                immediate as f64 / n,
                sweep_total as f64 / n,
                others.join(", ")
            ),
        ),
        (
            "service CPU during the mass revoke".to_string(),
            format!(
                "{:.1} ms ({:.1} µs per lease; svc.tick {:.1} ms over {} calls); one timer scan over {} live leases: \
                 {:.1} µs",
                m.cpu_ns as f64 / 1e6,
                m.cpu_ns as f64 / 1e3 / n,
                m.tick_ns as f64 / 1e6,
                m.ticks,
                m.leases,
                m.idle_tick_us
            ),
        ),
        (format!("model alone: {} DESTROY_MKEY, all slots busy", m.leases), format!("{mkey_ms:.1} ms")),
        (
            format!("model alone: {} × (2ERR_QP, 2RST_QP, DESTROY_QP, DEALLOC_PD)", m.leases),
            format!("{sweep_ms:.1} ms"),
        ),
        ("last outcome / DESTROY_MKEY alone".to_string(), format!("{mass_ratio:.2}×")),
        ("all swept / (DESTROY_MKEY + sweep commands) alone".to_string(), format!("{sweep_ratio:.2}×")),
    ];
    let cells: Vec<Vec<String>> = figures.into_iter().map(|(a, b)| vec![a, b]).collect();
    out.push_str(&mlx5_hosted::table::render(&["figure", "value"], &cells, 2));
    out.push_str(&format!(
        "(times from the first REVOKE request; \"model alone\" = the same commands straight through the driver's \
         client, its request ring kept full so all 31 regular command slots (of 32) stay busy, no service, on {} objects built as ALLOC \
         builds them\n (PD, RC QP in RTS, 4 KiB MKEY), one wave per opcode; the sweep figure includes scrubbing \
         the 4 KiB extents, the model-alone figure does not)\n",
        m.leases
    ));
    let (_, app1) = p50_p99(&rows_revoke(rows_of(rows, 1)), Sample::appliance);
    let (_, app8) = p50_p99(&rows_revoke(rows_of(rows, 8)), Sample::appliance);
    let allocs = |clients| rows_of(rows, clients).map_or_else(Vec::new, |r| r.alloc.clone());
    let (_, alloc1) = p50_p99(&allocs(1), Sample::appliance);
    let (_, alloc8) = p50_p99(&allocs(8), Sample::appliance);
    let (_, cpu1) = p50_p99(&rows_revoke(rows_of(rows, 1)), |s| s.cpu);
    let (_, cpu8) = p50_p99(&rows_revoke(rows_of(rows, 8)), |s| s.cpu);
    out.push_str(&format!(
        "summary: alloc_app_p99_us_1={} alloc_app_p99_us_8={} revoke_app_p99_us_1={app1:.1} \
         revoke_app_p99_us_8={app8:.1} revoke_cpu_p99_us_1={cpu1:.1} revoke_cpu_p99_us_8={cpu8:.1} leases={} mass_last_ms={:.1} mass_swept_ms={:.1} model_mkey_ms={mkey_ms:.1} \
         model_sweep_ms={sweep_ms:.1} mass_ratio={mass_ratio:.2} sweep_ratio={sweep_ratio:.2} fenced={}\n",
        us(alloc1),
        us(alloc8),
        m.leases,
        m.last_ms,
        m.swept_ms,
        m.outcomes.get("Fenced").copied().unwrap_or(0)
    ));
    out
}

/// Per path (UMR work request or commands alone): HCA commands and UMR work requests per ALLOC and per
/// REVOKE's immediate phase, counted by the op's slot while it was outstanding.
fn paths_table(rows: &[Row]) -> String {
    let headers = ["op", "clients", "path", "ops", "HCA cmds/op", "UMR WRs/op"];
    let mut cells = Vec::new();
    for r in rows {
        for (op, samples) in [("ALLOC", &r.alloc), ("REVOKE immediate", &r.revoke)] {
            for (path, umr) in [("umr", true), ("commands", false)] {
                let of: Vec<&Sample> = samples.iter().filter(|s| (s.umr > 0) == umr).collect();
                if of.is_empty() {
                    continue;
                }
                let n = of.len() as f64;
                let cmds: u64 = of.iter().map(|s| u64::from(s.cmds)).sum();
                let wrs: u64 = of.iter().map(|s| u64::from(s.umr)).sum();
                cells.push(vec![
                    op.to_string(),
                    r.clients.to_string(),
                    path.to_string(),
                    of.len().to_string(),
                    format!("{:.2}", cmds as f64 / n),
                    format!("{:.2}", wrs as f64 / n),
                ]);
            }
        }
    }
    let mut out = String::from("by path (commands and work requests for the op's own slot):\n");
    out.push_str(&mlx5_hosted::table::render(&headers, &cells, 1));
    for r in rows {
        out.push_str(&format!(
            "{} client(s): warm entries built {}, recycled by the sweep {}, {} warm-pool commands (off the request \
             path)\n",
            r.clients, r.warm_built, r.warm_recycled, r.warm_cmds
        ));
    }
    out
}

fn rows_of(rows: &[Row], clients: usize) -> Option<&Row> {
    rows.iter().find(|r| r.clients == clients)
}

fn rows_revoke(r: Option<&Row>) -> Vec<Sample> {
    r.map_or_else(Vec::new, |r| r.revoke.clone())
}
