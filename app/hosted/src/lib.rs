//! The hosted appliance as a library, so tests and benchmarks can start one in-process: the session core over
//! std TCP, with the lease service on the device model (`--hca`), the verbs reference responder on a real RDMA
//! device (`--verbs`, feature `verbs`; [`verbs_ref`]), or without an HCA (lease operations answer
//! NOT_IMPLEMENTED).

pub mod hca;
pub mod stages;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verbs_ref;

use leasebox_lease::LeaseOptions;
use leasebox_mlx5::log::SharedLog;
use leasebox_options::{OptionParser, Options, Registry};
use leasebox_proto::{FencedSlot, HcaState, HcaStats, LeaseStats, Reply, Request, Transition};
use leasebox_session::{
    Answer, Appliance, Budget, CloseReason, ConnId, Entropy, EntropyError, Keyring, LeaseHealth, Leases, Limits,
    NoLeases, Principal, Server, SessionOptions, Source, Ticket,
};
use mlx5_hosted::idle::ModelWake;
use stages::{Cause, Stages};
use std::any::Any;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How often a connection thread looks for output on its own, while it has had traffic lately ([`ACTIVE`]): a
/// safety net only. Nothing waits for it: whatever thread gives a connection output or closes it (an answer, a
/// notice, a timer's TIMEOUT, an eviction) wakes that connection's thread ([`ConnWake`], [`take_due`]).
const POLL: Duration = Duration::from_millis(100);
/// A connection with no traffic for this long looks less often: every [`POLL`] × (connections / 64), at most
/// [`MAX_IDLE_POLL`], so that a thousand idle sessions cost the process about a thousand wake-ups a second
/// (docs/operations.md, "Scale").
const ACTIVE: Duration = Duration::from_millis(100);
/// The longest an idle connection waits before it looks for output on its own.
const MAX_IDLE_POLL: Duration = Duration::from_millis(1000);
/// Each connection thread's input and output buffer (one each). A frame is read in pieces if it is larger.
pub const CONN_BUF: usize = 16 * 1024;
/// What a connection thread costs beyond its session state: its two buffers and the part of its stack it
/// touches (the stack's reservation is virtual), for sizing `sessions=` from memory.
pub const CONN_BYTES: u64 = 2 * CONN_BUF as u64 + 64 * 1024;
/// How often the service thread runs the session core's timers and the lease service while the service has
/// work under way (commands at the HCA or queued for it, memory being scrubbed). Command completions do not
/// wait for it: the engines' thread wakes the service thread after every pass that did work ([`ServiceWake`]);
/// this paces the scrub's slices and the service's own timers.
const TICK: Duration = Duration::from_micros(200);
/// The longest pause between ticks when nothing is under way: the interval doubles from [`TICK`] up to this.
/// Input that starts work wakes the thread at once ([`Hosted::start`]), so this bounds only how late a timer
/// with nothing under way fires (a TTL, a READY deadline, a session's grace or heartbeat timeout, the sweep
/// after the grace period: all of them tens of milliseconds or more). 1 ms ticks cost ~5 % of a core here.
const IDLE_TICK: Duration = Duration::from_millis(10);

/// The hosted appliance's polling intervals: the service thread's tick while work is under way and its
/// longest idle pause, a connection thread's look for timer output while active and its longest idle one.
/// Nothing a client waits for depends on them (the threads wake one another: docs/latency.md); tests stretch
/// them ([`Hosted::set_pace`]) to show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub tick: Duration,
    pub idle_tick: Duration,
    pub poll: Duration,
    pub max_idle_poll: Duration,
}

impl Pace {
    pub const DEFAULT: Pace = Pace { tick: TICK, idle_tick: IDLE_TICK, poll: POLL, max_idle_poll: MAX_IDLE_POLL };
}

impl Default for Pace {
    fn default() -> Self {
        Pace::DEFAULT
    }
}

/// [`Pace`] as the threads read it, in nanoseconds.
struct PaceCell([AtomicU64; 4]);

impl PaceCell {
    fn new(p: Pace) -> PaceCell {
        let c = PaceCell(Default::default());
        c.set(p);
        c
    }
    fn set(&self, p: Pace) {
        for (a, d) in self.0.iter().zip([p.tick, p.idle_tick, p.poll, p.max_idle_poll]) {
            a.store(d.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
        }
    }
    fn get(&self) -> Pace {
        let d = |i: usize| Duration::from_nanos(self.0[i].load(Ordering::Relaxed));
        Pace { tick: d(0), idle_tick: d(1), poll: d(2), max_idle_poll: d(3) }
    }
}

/// How the service thread is woken, and why: by the engines' thread after a pass that did work, or by a
/// connection whose input left work under way.
#[derive(Default)]
pub(crate) struct ServiceWake {
    thread: OnceLock<Thread>,
    engine: AtomicBool,
    input: AtomicBool,
}

impl ServiceWake {
    pub(crate) fn by_engine(&self) {
        self.engine.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    fn by_input(&self) {
        self.input.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Why the pause just ended (the engines first: both may have knocked).
    fn cause(&self) -> Cause {
        let engine = self.engine.swap(false, Ordering::AcqRel);
        let input = self.input.swap(false, Ordering::AcqRel);
        if engine {
            Cause::Engine
        } else if input {
            Cause::Input
        } else {
            Cause::Timer
        }
    }
}

/// How a connection thread is woken from its wait for input: an eventfd beside the socket (`ModelWake`), and a
/// flag that says output was queued for it by another thread.
struct ConnWake {
    wake: ModelWake,
    pending: AtomicBool,
}

impl ConnWake {
    fn new() -> ConnWake {
        ConnWake { wake: ModelWake::new(), pending: AtomicBool::new(false) }
    }

    /// Output was queued for this connection (the caller has released nothing it needs: the output is in the
    /// server, read under its lock).
    fn notify(&self) {
        self.pending.store(true, Ordering::Release);
        self.wake.wake();
    }

    /// Waits up to `d` for input on `socket` or a [`ConnWake::notify`]; returns whether it was notified.
    fn wait(&self, socket: &TcpStream, d: Duration) -> bool {
        if self.pending.swap(false, Ordering::AcqRel) {
            return true;
        }
        let notified = self.wake.sleep(d, Some(socket.as_raw_fd()), || self.pending.load(Ordering::Acquire));
        self.pending.swap(false, Ordering::AcqRel) || notified
    }
}

/// Nonces from the OS.
pub(crate) struct OsEntropy;
impl Entropy for OsEntropy {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(buf)).map_err(|_| EntropyError)
    }
}

/// Listen address, limits, keys and the HCA.
pub struct HostedConfig {
    pub listen: SocketAddr,
    pub limits: Limits,
    /// Admission budgets (`sessions_per_tenant=`, `admin_sessions=`, `preauth_sessions=`); the hosted
    /// appliance has no memory budget (its heap is the process's).
    pub budget: Budget,
    pub keys: Keyring,
    /// `appliance=NAME`: the name bound into every handshake (none: no name).
    pub appliance: Option<String>,
    /// `--hca`: run the device model and the lease service.
    pub hca: bool,
    /// `--udp ADDR`: the model's RoCEv2 responder (with `--hca`).
    pub udp: Option<String>,
    /// `--timing T`: firmware time per command in the model (`mlx5_model::Timing::parse`; the trace's
    /// per-opcode table by default, as the model process).
    pub timing: mlx5_model::Timing,
    pub lease: LeaseOptions,
    /// `--verbs DEVICE[:GID_INDEX]` (with `--verbs-qp-teardown`): the reference responder on a real RDMA device
    /// instead of the model (feature `verbs`).
    pub verbs: Option<verbs_ref::VerbsSpec>,
}

/// What `--verbs` says in a binary built without the feature.
pub const NO_VERBS: &str = "--verbs: this leasebox-hosted was built without the `verbs` feature \
                            (cargo build -p leasebox-hosted --features verbs)";

impl HostedConfig {
    /// `--listen ADDR`, the other flags, and the option words the image takes from its command line for the
    /// session core and the lease service (`tenant=`, `sessions=`, `lease_pool_mib=`, ...: the same parsers,
    /// the same errors). The kernel's own words (`log=`, `cores=`, `ip=`, ...) mean nothing here and are refused
    /// as unknown.
    pub fn from_args(args: &[String]) -> Result<HostedConfig, String> {
        let mut listen: SocketAddr = "127.0.0.1:7470".parse().expect("literal address");
        let mut words = Vec::new();
        let (mut hca, mut udp, mut timing) = (false, None, mlx5_model::Timing::firmware());
        let (mut verbs, mut qp_teardown) = (None, None);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--listen" {
                let v = it.next().ok_or("--listen needs ADDR:PORT")?;
                listen = v.parse().map_err(|_| format!("--listen: '{v}' is not ADDR:PORT"))?;
            } else if a == "--hca" {
                hca = true;
            } else if a == "--udp" {
                let v = it.next().ok_or("--udp needs ADDR:PORT")?;
                v.parse::<SocketAddr>().map_err(|_| format!("--udp: '{v}' is not ADDR:PORT"))?;
                udp = Some(v.clone());
            } else if a == "--timing" {
                let v = it.next().ok_or("--timing needs firmware, zero or a latency such as 20us")?;
                timing = mlx5_model::Timing::parse(v).map_err(|e| format!("--timing: {e}"))?;
            } else if a == "--verbs" {
                let v = it.next().ok_or("--verbs needs DEVICE[:GID_INDEX], e.g. rxe0:1")?;
                verbs = Some(verbs_ref::VerbsSpec::parse(v)?);
            } else if a == "--verbs-qp-teardown" {
                let v = it.next().ok_or("--verbs-qp-teardown needs err or destroy")?;
                qp_teardown = Some(verbs_ref::QpTeardown::parse(v)?);
            } else if a.starts_with('-') {
                return Err(format!("unknown flag '{a}'"));
            } else {
                words.push(a.as_str());
            }
        }
        let line = words.join(" ");
        let line: &'static str = Box::leak(line.into_boxed_str());
        let session = Options::checked(SessionOptions::DEFAULT, SessionOptions::apply, SessionOptions::check);
        let lease = Options::new(LeaseOptions::DEFAULT, LeaseOptions::apply);
        let parsers: [&dyn OptionParser; 2] = [&session, &lease];
        let mut cfg = Registry::new(&parsers);
        cfg.apply(line).map_err(|e| e.to_string())?;
        cfg.check().map_err(|e| e.to_string())?;
        if let Some(w) = cfg.unknown().0.first() {
            return Err(format!("unknown option '{w}'"));
        }
        let control = session.get();
        let mut keys = Keyring::new();
        for (name, hex) in control.tenants() {
            keys.add_tenant(name, hex).map_err(|e| format!("tenant={name}: {e}"))?;
        }
        if let Some(hex) = control.admin_key_hex() {
            keys.set_admin(hex).map_err(|e| format!("admin=: {e}"))?;
        }
        let limits = Limits {
            sessions: control.sessions_or(default_sessions()) as usize,
            credits: control.credits as u16,
            heartbeat_ms: control.heartbeat_ms,
        };
        let budget = Budget::from_options(
            limits.sessions,
            control.sessions_per_tenant.map(|n| n as usize),
            control.admin_sessions.map(|n| n as usize),
            control.preauth_sessions.map(|n| n as usize),
            control.heap_high_water.map(|n| n as u8),
        );
        if udp.is_some() && !hca {
            return Err("--udp needs --hca".into());
        }
        if verbs.is_some() && hca {
            return Err("--verbs and --hca are two different lease backends: give one".into());
        }
        match (&mut verbs, qp_teardown) {
            (Some(v), Some(t)) => v.qp_teardown = t,
            (None, Some(_)) => return Err("--verbs-qp-teardown needs --verbs".into()),
            _ => {}
        }
        if verbs.is_some() && !cfg!(feature = "verbs") {
            return Err(NO_VERBS.into());
        }
        // The pool's fair shares divide it among the configured tenants (docs/security.md, "Fair shares").
        let lease = LeaseOptions { tenants: control.tenants().len() as u32, ..lease.get() };
        let appliance = control.appliance.map(String::from);
        Ok(HostedConfig { listen, limits, budget, keys, appliance, hca, udp, timing, lease, verbs })
    }
}

/// The session budget when `sessions=` is absent: what a sixteenth of the machine's memory affords, for the
/// session state and for the connection threads ([`CONN_BYTES`] each), within 16 to 1,024
/// (`leasebox_session::scale::default_sessions`).
pub fn default_sessions() -> u32 {
    let share = mem_total().unwrap_or(1 << 30) / 16;
    leasebox_session::scale::default_sessions(share, share, CONN_BYTES)
}

/// The machine's memory (`MemTotal` in /proc/meminfo), if it can be read.
fn mem_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The lease service the session core runs over, chosen at start: the lease service on the model (`--hca`),
/// the verbs reference responder (`--verbs`), or [`NoLeases`]. `Any`, so a test can reach the concrete one
/// ([`Hosted::with_leases`]).
pub trait HostedLeases: Leases + Any + Send {}
impl<T: Leases + Any + Send> HostedLeases for T {}

/// What the hosted appliance knows of itself (`leasebox_session::Appliance`): no cores, the OS's entropy, and
/// the HCA it runs — the device model's, a verbs device, or none.
pub enum HostedAppliance {
    /// No HCA (lease operations answer NOT_IMPLEMENTED).
    NoHca,
    /// The device model with the native driver (`--hca`).
    Model(hca::ModelFacts),
    /// A real RDMA device through libibverbs (`--verbs`): its summary line; it has no command queue to count.
    Verbs(String),
}

impl Entropy for HostedAppliance {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        OsEntropy.fill(buf)
    }
}

impl Appliance for HostedAppliance {
    fn hca(&self) -> (HcaState, String) {
        match self {
            HostedAppliance::NoHca => (HcaState::Absent, "no HCA (hosted, without --hca)".into()),
            HostedAppliance::Model(m) => (m.state(), m.summary().into()),
            HostedAppliance::Verbs(summary) => (HcaState::Ok, format!("verbs reference responder on {summary}")),
        }
    }
    fn hca_stats(&self) -> Option<HcaStats> {
        match self {
            HostedAppliance::Model(m) => Some(m.stats()),
            HostedAppliance::NoHca | HostedAppliance::Verbs(_) => None,
        }
    }
}

/// The lease service as the session core sees it (the one chosen at start), plus what the hosted threads need to wake one
/// another and to time the stages ([`stages`]). The session core notes which connections got output (answers,
/// notices, timer frames) or were closed ([`Server::track_touched`]), so
/// the thread that holds the server's lock wakes exactly those connections' threads when it lets go.
pub struct Wired {
    pub backend: Box<dyn HostedLeases>,
    /// The driver's command log (with the model), for the stage clock.
    log: Option<SharedLog>,
    /// Every open connection's wake-up, by id.
    conns: HashMap<ConnId, Arc<ConnWake>>,
    /// What ran the current pass (the service thread's), for the stage clock.
    cause: Cause,
    /// When the input being handled was read from its socket (the stage clock's first stamp).
    read_at: Option<Instant>,
    stages: Arc<Stages>,
}

impl Wired {
    /// The driver's command log's next sequence number (with the model), for the stage clock.
    fn log_seq(&mut self) -> u64 {
        self.log.as_ref().map_or(0, |l| l.lock().last(1).next().map_or(0, |r| r.seq + 1))
    }

    /// The commands of an operation `op` since `seq` (count, driver ns), as [`stages::Stages::commands_of`]
    /// attributes them.
    fn commands_since(&self, op: leasebox_proto::Op, seq: u64) -> (u32, u64) {
        let Some(log) = &self.log else { return (0, 0) };
        let log = log.lock();
        log.records()
            .filter(|r| r.seq >= seq && Stages::commands_of(op, leasebox_mlx5::command::opcode_name(r.opcode)))
            .fold((0, 0), |(n, ns), r| (n + 1, ns + r.elapsed_ns))
    }
}

/// The connections to wake now that `s`'s lock is about to be let go: every one the session core gave output
/// or marked to close since the last call ([`Server::take_touched`]), leaving out `me` (the caller's own,
/// which looks at its output next anyway).
fn take_due(s: &mut Server<Wired, HostedAppliance>, me: Option<ConnId>) -> Vec<Arc<ConnWake>> {
    let ids = s.take_touched();
    let w = s.backend_mut();
    ids.iter().filter(|id| Some(**id) != me).filter_map(|id| w.conns.get(id).cloned()).collect()
}

impl Leases for Wired {
    fn lease_op(&mut self, who: &Principal, req: &Request, ticket: Ticket, now_ms: u64) -> Answer {
        if self.stages.on() {
            let seq = self.log_seq();
            self.stages.op(ticket.conn, ticket.request_id, self.read_at, seq);
        }
        let a = self.backend.lease_op(who, req, ticket, now_ms);
        if matches!(a, Answer::Now(_)) {
            self.stages.answered(ticket.conn, ticket.request_id, ticket.op, Cause::Inline, (0, 0));
        }
        a
    }
    fn take_answers(&mut self, out: &mut Vec<(Ticket, Reply)>) {
        let from = out.len();
        self.backend.take_answers(out);
        for (t, _) in &out[from..] {
            if let Some(seq) = self.stages.log_seq(t.conn, t.request_id) {
                let cmds = self.commands_since(t.op, seq);
                self.stages.answered(t.conn, t.request_id, t.op, self.cause, cmds);
            }
        }
    }
    fn session_started(&mut self, who: &Principal, now_ms: u64) {
        self.backend.session_started(who, now_ms)
    }
    fn boot(&mut self, boot_id: [u8; leasebox_proto::BOOT_ID_LEN]) {
        self.backend.boot(boot_id)
    }
    fn take_notices(&mut self, out: &mut Vec<(String, leasebox_proto::Notice)>) {
        self.backend.take_notices(out)
    }
    fn resume(&mut self, from: &Principal, to: &Principal, now_ms: u64) -> u32 {
        self.backend.resume(from, to, now_ms)
    }
    fn session_alive(&mut self, who: &Principal, now_ms: u64) {
        self.backend.session_alive(who, now_ms)
    }
    fn tick(&mut self, now_ms: u64) {
        self.backend.tick(now_ms)
    }
    fn busy(&self) -> bool {
        self.backend.busy()
    }
    fn lease_stats(&mut self) -> LeaseStats {
        self.backend.lease_stats()
    }
    fn tenant_lease_stats(&mut self, who: &Principal) -> LeaseStats {
        self.backend.tenant_lease_stats(who)
    }
    fn fenced(&mut self, who: &Principal, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>) {
        self.backend.fenced(who, cursor, max)
    }
    fn lease_log(&mut self, cursor: u64, max: u16) -> Option<(u64, u64, Vec<Transition>)> {
        self.backend.lease_log(cursor, max)
    }
    fn health_facts(&mut self) -> LeaseHealth {
        self.backend.health_facts()
    }
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, now_ms: u64) {
        self.backend.session_lost(who, reason, now_ms)
    }
}

type Shared = Arc<Mutex<Server<Wired, HostedAppliance>>>;

/// What every thread of a running appliance shares besides the server.
struct Common {
    start: Instant,
    stop: AtomicBool,
    pace: PaceCell,
    service: Arc<ServiceWake>,
    stages: Arc<Stages>,
}

/// A running hosted appliance.
pub struct Hosted {
    addr: SocketAddr,
    common: Arc<Common>,
    threads: Vec<JoinHandle<()>>,
    server: Shared,
    hca: Option<hca::HcaThreads>,
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

fn notify(due: Vec<Arc<ConnWake>>) {
    for c in due {
        c.notify();
    }
}

impl Hosted {
    /// Binds and starts serving (accept thread + service thread + one thread per connection).
    pub fn start(cfg: HostedConfig) -> Result<Hosted, String> {
        let start = Instant::now();
        let service = Arc::new(ServiceWake::default());
        let stages = Arc::new(Stages::default());
        let (backend, facts, hca): (Box<dyn HostedLeases>, _, _) = if let Some(spec) = &cfg.verbs {
            let (leases, summary) = start_verbs(spec, &cfg.lease)?;
            (Box::new(leases), HostedAppliance::Verbs(summary), None)
        } else if cfg.hca {
            let (b, t, facts) =
                hca::start(&cfg.lease, cfg.udp.as_deref(), cfg.timing, service.clone(), stages.clone())?;
            (Box::new(b), HostedAppliance::Model(facts), Some(t))
        } else {
            (Box::new(NoLeases::default()), HostedAppliance::NoHca, None)
        };
        let log = match &facts {
            HostedAppliance::Model(m) => Some(m.command_log().clone()),
            HostedAppliance::NoHca | HostedAppliance::Verbs(_) => None,
        };
        let wired =
            Wired { backend, log, conns: HashMap::new(), cause: Cause::Inline, read_at: None, stages: stages.clone() };
        let mut server = Server::new(cfg.limits, cfg.keys, wired, facts, 0).map_err(|e| e.to_string())?;
        server.track_touched();
        server.set_budget(cfg.budget);
        if let Some(name) = &cfg.appliance {
            server.set_appliance_name(name);
        }
        let server: Shared = Arc::new(Mutex::new(server));
        let listener = TcpListener::bind(cfg.listen).map_err(|e| format!("binding {}: {e}", cfg.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let common = Arc::new(Common {
            start,
            stop: AtomicBool::new(false),
            pace: PaceCell::new(Pace::DEFAULT),
            service: service.clone(),
            stages,
        });
        let next_conn = Arc::new(AtomicU64::new(1));

        // The service thread: ticks every `tick` while the backend has work under way, backing off to
        // `idle_tick` when it has none; the engines (a completion) and input that leaves work under way wake
        // it at once. Each pass delivers what the backend finished and wakes the connections it went to.
        let timer = {
            let (server, common) = (server.clone(), common.clone());
            thread::Builder::new()
                .name("service".into())
                .spawn(move || {
                    let mut pause = common.pace.get().tick;
                    let mut cause = Cause::Timer;
                    while !common.stop.load(Ordering::Relaxed) {
                        let (busy, due) = {
                            let mut s = server.lock().expect("server lock");
                            s.backend_mut().cause = cause;
                            s.tick(now_ms(common.start));
                            s.backend_mut().cause = Cause::Inline;
                            let busy = s.backend_mut().backend.busy();
                            (busy, take_due(&mut s, None))
                        };
                        notify(due);
                        let pace = common.pace.get();
                        pause = if busy { pace.tick } else { (pause * 2).clamp(pace.tick, pace.idle_tick) };
                        thread::park_timeout(pause);
                        cause = common.service.cause();
                        common.stages.pass(cause);
                    }
                })
                .map_err(|e| format!("starting the service thread: {e}"))?
        };
        let _ = service.thread.set(timer.thread().clone());
        // Blocks in accept; `stop` ends it with a connection of its own.
        let acceptor = {
            let (server, common) = (server.clone(), common.clone());
            thread::spawn(move || {
                while !common.stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok(_) if common.stop.load(Ordering::Relaxed) => break,
                        Ok((stream, _)) => {
                            let id = ConnId(next_conn.fetch_add(1, Ordering::Relaxed));
                            let (server, common) = (server.clone(), common.clone());
                            thread::spawn(move || serve(server, stream, id, common));
                        }
                        // Out of descriptors and the like: try again shortly.
                        Err(_) => thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
        };
        Ok(Hosted { addr, common, threads: vec![timer, acceptor], server, hca })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model and its memories (with `--hca`).
    pub fn hca(&self) -> Option<&hca::HcaThreads> {
        self.hca.as_ref()
    }

    /// The stage clock and the wake-up counters (docs/latency.md).
    pub fn stages(&self) -> &Stages {
        &self.common.stages
    }

    /// Connections the session core holds (authenticated or not; a closed one until its thread has let go).
    pub fn connections(&self) -> usize {
        self.server.lock().map_or(0, |s| s.sessions())
    }

    /// The polling intervals in force.
    pub fn pace(&self) -> Pace {
        self.common.pace.get()
    }

    /// Sets the polling intervals (tests: stretched so far that only a wake-up can move an operation on); the
    /// threads take them from their next pause on, which this starts at once.
    pub fn set_pace(&self, p: Pace) {
        self.common.pace.set(p);
        self.wake_all();
    }

    /// Wakes the service thread and every connection thread.
    fn wake_all(&self) {
        if let Some(t) = self.common.service.thread.get() {
            t.unpark();
        }
        let conns: Vec<_> =
            self.server.lock().map_or(Vec::new(), |mut s| s.backend_mut().conns.values().cloned().collect());
        notify(conns);
    }

    /// Runs `f` on the lease backend (with `--hca`), under the server's lock.
    pub fn with_leases<R>(&self, f: impl FnOnce(&mut hca::HostedBackend) -> R) -> Option<R> {
        let mut s = self.server.lock().expect("server lock");
        let leases: &mut dyn Any = &mut *s.backend_mut().backend;
        leases.downcast_mut::<hca::HostedBackend>().map(f)
    }

    /// Blocks until the service stops.
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops accepting and ends every connection thread (each is woken to notice).
    pub fn stop(self) {
        self.common.stop.store(true, Ordering::Relaxed);
        // The acceptor blocks in accept: a connection of our own ends it (an unspecified listen address is
        // reached on loopback).
        let mut to = self.addr;
        if to.ip().is_unspecified() {
            to.set_ip(if to.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&to, Duration::from_secs(1));
        self.wake_all();
        for t in &self.threads {
            t.thread().unpark();
        }
        self.join();
    }
}

/// The reference responder's backend on `spec`'s device (`--verbs`), and its summary line.
#[cfg(feature = "verbs")]
fn start_verbs(spec: &verbs_ref::VerbsSpec, o: &LeaseOptions) -> Result<(verbs_ref::VerbsLeases, String), String> {
    let dev = verbs_ref::ibv::Ibv::open(&spec.device, spec.port, spec.gid_index)?;
    let rng = leasebox_session::IdRng::from_entropy(&mut OsEntropy).map_err(|_| "no random source for PSNs")?;
    let summary = format!(
        "{} port {} GID index {} (QP teardown: {})",
        spec.device,
        spec.port,
        spec.gid_index,
        spec.qp_teardown.name()
    );
    Ok((verbs_ref::VerbsLeases::new(Box::new(dev), *o, spec.qp_teardown, rng), summary))
}

/// Without the feature `--verbs` is refused when parsed; a config built by hand gets the same answer.
#[cfg(not(feature = "verbs"))]
fn start_verbs(_spec: &verbs_ref::VerbsSpec, _o: &LeaseOptions) -> Result<(verbs_ref::VerbsLeases, String), String> {
    Err(NO_VERBS.into())
}

/// Writes all of `buf` to the (non-blocking) socket; when the socket's buffer is full, the rest is written
/// blocking, within the socket's write timeout.
fn write_out(stream: &mut TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                stream.set_nonblocking(false)?;
                let r = stream.write_all(buf);
                stream.set_nonblocking(true)?;
                return r;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One connection: bytes from the socket into the core, the core's output back out. The thread waits for
/// input on the socket or a wake-up from a thread that queued output for it (an answer, a notice), and looks
/// for timer output (TIMEOUT frames) every [`Pace::poll`] at the least; input that leaves the backend with
/// work under way wakes the service thread, which moves that work on.
fn serve(server: Shared, mut stream: TcpStream, id: ConnId, common: Arc<Common>) {
    let start = common.start;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_nonblocking(true);
    let mut inbuf = vec![0u8; CONN_BUF];
    let mut outbuf = vec![0u8; CONN_BUF];
    let wake = Arc::new(ConnWake::new());
    // Traffic either way keeps the thread looking every `poll`; see `idle_poll` for the rest.
    let mut last_traffic = Instant::now();
    // Per-source limits key on the peer's address (docs/security.md, "Pre-authentication").
    // A refused connection still gets its BUSY frame from `output` below, then the core wants it closed.
    // Making room may evict another connection: its thread is woken to close it.
    let due = {
        let mut s = server.lock().expect("server lock");
        s.backend_mut().conns.insert(id, wake.clone());
        match stream.peer_addr() {
            Ok(peer) => s.open_from(id, Source::ip(peer.ip()), now_ms(start)),
            Err(_) => s.open(id, now_ms(start)),
        };
        take_due(&mut s, Some(id))
    };
    notify(due);
    loop {
        // Flush whatever the core has for this connection, then see whether it wants the connection closed.
        let done = loop {
            let (n, close) = {
                let mut s = server.lock().expect("server lock");
                let n = s.output(id, &mut outbuf);
                (n, n == 0 && s.wants_close(id))
            };
            if close {
                break true;
            }
            if n == 0 {
                break false;
            }
            if write_out(&mut stream, &outbuf[..n]).is_err() {
                break true;
            }
            // The answers delivered before `output` took these bytes are out (the stage clock's last stamp).
            common.stages.written(id);
            last_traffic = Instant::now();
        };
        if done || common.stop.load(Ordering::Relaxed) {
            break;
        }
        let pace = common.pace.get();
        let timeout = if last_traffic.elapsed() < ACTIVE { pace.poll } else { idle_poll(&server, pace) };
        if wake.wait(&stream, timeout) {
            common.stages.conn_woken();
        }
        match stream.read(&mut inbuf) {
            Ok(0) => break,
            Ok(n) => {
                let read_at = Instant::now();
                last_traffic = read_at;
                let (busy, due) = {
                    let mut s = server.lock().expect("server lock");
                    s.backend_mut().read_at = Some(read_at);
                    s.input(id, &inbuf[..n], now_ms(start));
                    s.backend_mut().read_at = None;
                    (s.backend_mut().backend.busy(), take_due(&mut s, Some(id)))
                };
                notify(due);
                // Only a request that started work needs the service thread (a HEARTBEAT does not).
                if busy {
                    common.service.by_input();
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    common.stages.closed(id);
    let due = {
        let mut s = server.lock().expect("server lock");
        s.backend_mut().conns.remove(&id);
        s.closed(id, now_ms(start));
        take_due(&mut s, None)
    };
    notify(due);
}

/// How often an idle connection looks for output: `poll` × (connections / 64), from `poll` to `max_idle_poll`.
fn idle_poll(server: &Shared, pace: Pace) -> Duration {
    let open = server.lock().map_or(0, |s| s.sessions()) as u32;
    (pace.poll * (open / 64).max(1)).min(pace.max_idle_poll.max(pace.poll))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn timing_defaults_to_firmware_and_parses_as_the_model_does() {
        let cfg = HostedConfig::from_args(&args(&["--hca"])).unwrap();
        assert_eq!(cfg.timing, mlx5_model::Timing::firmware());
        let cfg = HostedConfig::from_args(&args(&["--hca", "--timing", "zero"])).unwrap();
        assert_eq!(cfg.timing, mlx5_model::Timing::Zero);
        let cfg = HostedConfig::from_args(&args(&["--hca", "--timing", "20us"])).unwrap();
        assert_eq!(cfg.timing, mlx5_model::Timing::Fixed(Duration::from_micros(20)));
        let e = |a: &[&str]| HostedConfig::from_args(&args(a)).err().unwrap_or_default();
        assert!(e(&["--timing", "soon"]).contains("--timing: expected `firmware`"));
        assert!(e(&["--timing"]).contains("--timing needs"));
    }

    const KEY: &str = "5ad1e0c3b2f4978a6e1d0c9b8a7f6e5d";

    #[test]
    fn option_words_go_to_the_session_and_lease_parsers_as_in_the_image() {
        let cfg = HostedConfig::from_args(&args(&[
            &format!("tenant=alice:{KEY}"),
            &format!("admin={KEY}"),
            "sessions=6",
            "credits=3",
            "admin_sessions=2",
            "appliance=lb-1",
            "lease_pool_mib=64",
        ]))
        .unwrap();
        assert_eq!((cfg.limits.sessions, cfg.limits.credits, cfg.budget.admin_reserved), (6, 3, 2));
        assert_eq!((cfg.appliance.as_deref(), cfg.lease.pool_mib, cfg.lease.tenants), (Some("lb-1"), 64, 1));
        assert!(!cfg.keys.is_empty());
        let e = |a: &[&str]| HostedConfig::from_args(&args(a)).err().unwrap_or_default();
        assert_eq!(e(&["admin=001"]), "bad option admin=***: the key is not an even number of hex digits");
        assert_eq!(e(&["admin=0011"]), "bad option admin=***: keys are 16 to 64 bytes (32 to 128 hex digits)");
        assert_eq!(
            e(&["sessions=4", "admin_sessions=4"]),
            "bad option admin_sessions=4: must be less than sessions= (tenants need a place)"
        );
        assert_eq!(e(&["credits=0"]), "bad option credits=0: expected 1 to 64 credits per session");
        assert_eq!(
            e(&["log=debug"]),
            "unknown option 'log=debug'",
            "the kernel's words are not the hosted appliance's"
        );
        assert!(e(&["lease_pool_mib=x"]).starts_with("bad option lease_pool_mib=x: "));
    }

    #[test]
    fn verbs_flags_parse_and_conflict() {
        let e = |a: &[&str]| HostedConfig::from_args(&args(a)).err().unwrap_or_default();
        assert!(e(&["--verbs"]).contains("--verbs needs DEVICE"));
        assert!(e(&["--verbs", "rxe0:x"]).contains("GID index"));
        assert!(e(&["--verbs", "rxe0", "--hca"]).contains("two different lease backends"));
        assert!(e(&["--verbs-qp-teardown", "destroy"]).contains("needs --verbs"));
        assert!(e(&["--verbs", "rxe0", "--verbs-qp-teardown", "rst"]).contains("not err or destroy"));
        assert!(HostedConfig::from_args(&args(&[])).unwrap().verbs.is_none());
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn verbs_spec_with_the_feature() {
        let cfg = HostedConfig::from_args(&args(&["--verbs", "rxe0:1", "--verbs-qp-teardown", "destroy"])).unwrap();
        let v = cfg.verbs.unwrap();
        assert_eq!((v.device.as_str(), v.gid_index, v.qp_teardown), ("rxe0", 1, verbs_ref::QpTeardown::Destroy));
        assert!(!cfg.hca);
    }

    #[cfg(not(feature = "verbs"))]
    #[test]
    fn verbs_refused_without_the_feature() {
        let e = HostedConfig::from_args(&args(&["--verbs", "rxe0:1"])).err().unwrap_or_default();
        assert_eq!(e, NO_VERBS);
        assert!(e.contains("--features verbs"));
    }
}
