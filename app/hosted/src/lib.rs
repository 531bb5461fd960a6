//! The hosted appliance as a library, so tests and benchmarks can start one in-process: the session core over
//! std TCP, with the lease service on the device model (`--hca`), the verbs reference responder on a real RDMA
//! device (`--verbs`, feature `verbs`; [`verbs_ref`]), or without an HCA (lease operations answer
//! NOT_IMPLEMENTED).

pub mod hca;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verbs_ref;

use leasebox_lease::LeaseOptions;
use leasebox_options::{OptionParser, Options, Registry};
use leasebox_proto::{HcaState, HcaStats};
use leasebox_session::{
    Appliance, Budget, ConnId, Entropy, EntropyError, Keyring, Leases, Limits, NoLeases, Server, SessionOptions, Source,
};
use std::any::Any;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How often a connection thread looks for output queued by timers (TIMEOUT frames), deferred answers and
/// notices, while it has had traffic lately ([`ACTIVE`]).
const POLL: Duration = Duration::from_millis(2);
/// A connection with no traffic for this long looks less often: every [`POLL`] × (connections / 64), at most
/// [`MAX_IDLE_POLL`], so that a thousand idle sessions cost the process a bounded rate of wake-ups (about 32,000
/// a second in all) rather than 500 a second each (docs/operations.md, "Scale").
const ACTIVE: Duration = Duration::from_millis(100);
/// The longest an idle connection waits before it looks for output (a notice to an idle session or its
/// heartbeat TIMEOUT is this late at most, with a thousand sessions).
const MAX_IDLE_POLL: Duration = Duration::from_millis(32);
/// Each connection thread's input and output buffer (one each). A frame is read in pieces if it is larger.
pub const CONN_BUF: usize = 16 * 1024;
/// What a connection thread costs beyond its session state: its two buffers and the part of its stack it
/// touches (the stack's reservation is virtual), for sizing `sessions=` from memory.
pub const CONN_BYTES: u64 = 2 * CONN_BUF as u64 + 64 * 1024;
/// How often the timer thread runs the session core's timers and the lease service while the service has work
/// under way (commands at the HCA or queued for it, memory being scrubbed): results reach it within this.
const TICK: Duration = Duration::from_micros(200);
/// The longest pause between ticks when nothing is under way: the interval doubles from [`TICK`] up to this.
/// Input that starts work wakes the thread at once ([`Hosted::start`]), so this bounds only how late a timer
/// with nothing under way fires (a TTL, a READY deadline, a session's grace or heartbeat timeout, the sweep
/// after the grace period: all of them tens of milliseconds or more). 1 ms ticks cost ~5 % of a core here.
const IDLE_TICK: Duration = Duration::from_millis(10);

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

type Shared = Arc<Mutex<Server<Box<dyn HostedLeases>, HostedAppliance>>>;

/// A running hosted appliance.
pub struct Hosted {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    server: Shared,
    hca: Option<hca::HcaThreads>,
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

impl Hosted {
    /// Binds and starts serving (accept thread + timer thread + one thread per connection).
    pub fn start(cfg: HostedConfig) -> Result<Hosted, String> {
        let start = Instant::now();
        let (backend, facts, hca): (Box<dyn HostedLeases>, _, _) = if let Some(spec) = &cfg.verbs {
            let (leases, summary) = start_verbs(spec, &cfg.lease)?;
            (Box::new(leases), HostedAppliance::Verbs(summary), None)
        } else if cfg.hca {
            let (b, t, facts) = hca::start(&cfg.lease, cfg.udp.as_deref(), cfg.timing)?;
            (Box::new(b), HostedAppliance::Model(facts), Some(t))
        } else {
            (Box::new(NoLeases::default()), HostedAppliance::NoHca, None)
        };
        let mut server = Server::new(cfg.limits, cfg.keys, backend, facts, 0).map_err(|e| e.to_string())?;
        server.set_budget(cfg.budget);
        if let Some(name) = &cfg.appliance {
            server.set_appliance_name(name);
        }
        let server: Shared = Arc::new(Mutex::new(server));
        let listener = TcpListener::bind(cfg.listen).map_err(|e| format!("binding {}: {e}", cfg.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let next_conn = Arc::new(AtomicU64::new(1));

        // Ticks every TICK while the backend has work under way, backing off to IDLE_TICK when it has none;
        // input that leaves work under way unparks it.
        let timer = {
            let (server, stop) = (server.clone(), stop.clone());
            thread::spawn(move || {
                let mut pause = TICK;
                while !stop.load(Ordering::Relaxed) {
                    let busy = {
                        let mut s = server.lock().expect("server lock");
                        s.tick(now_ms(start));
                        s.backend_mut().busy()
                    };
                    pause = if busy { TICK } else { (pause * 2).min(IDLE_TICK) };
                    thread::park_timeout(pause);
                }
            })
        };
        let ticker = timer.thread().clone();
        // Blocks in accept; `stop` ends it with a connection of its own.
        let acceptor = {
            let (server, stop) = (server.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok(_) if stop.load(Ordering::Relaxed) => break,
                        Ok((stream, _)) => {
                            let id = ConnId(next_conn.fetch_add(1, Ordering::Relaxed));
                            let (server, stop, ticker) = (server.clone(), stop.clone(), ticker.clone());
                            thread::spawn(move || serve(server, stream, id, start, stop, ticker));
                        }
                        // Out of descriptors and the like: try again shortly.
                        Err(_) => thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
        };
        Ok(Hosted { addr, stop, threads: vec![timer, acceptor], server, hca })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model and its memories (with `--hca`).
    pub fn hca(&self) -> Option<&hca::HcaThreads> {
        self.hca.as_ref()
    }

    /// Runs `f` on the lease backend (with `--hca`), under the server's lock.
    pub fn with_leases<R>(&self, f: impl FnOnce(&mut hca::HostedBackend) -> R) -> Option<R> {
        let mut s = self.server.lock().expect("server lock");
        let leases: &mut dyn Any = &mut **s.backend_mut();
        leases.downcast_mut::<hca::HostedBackend>().map(f)
    }

    /// Blocks until the service stops.
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops accepting and ends every connection thread (they notice within `POLL`).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        // The acceptor blocks in accept: a connection of our own ends it (an unspecified listen address is
        // reached on loopback).
        let mut to = self.addr;
        if to.ip().is_unspecified() {
            to.set_ip(if to.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&to, Duration::from_secs(1));
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

/// One connection: bytes from the socket into the core, the core's output back out; input that leaves the
/// backend with work under way wakes `ticker` (the timer thread), whose ticks move that work on.
fn serve(server: Shared, mut stream: TcpStream, id: ConnId, start: Instant, stop: Arc<AtomicBool>, ticker: Thread) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut inbuf = vec![0u8; CONN_BUF];
    let mut outbuf = vec![0u8; CONN_BUF];
    // Traffic either way puts the thread back to POLL; see `idle_poll` for the rest.
    let (mut last_traffic, mut timeout) = (Instant::now(), POLL);
    // Per-source limits key on the peer's address (docs/security.md, "Pre-authentication").
    // A refused connection still gets its BUSY frame from `output` below, then the core wants it closed.
    {
        let mut s = server.lock().expect("server lock");
        match stream.peer_addr() {
            Ok(peer) => s.open_from(id, Source::ip(peer.ip()), now_ms(start)),
            Err(_) => s.open(id, now_ms(start)),
        };
    }
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
            if stream.write_all(&outbuf[..n]).is_err() {
                break true;
            }
            last_traffic = Instant::now();
        };
        if done || stop.load(Ordering::Relaxed) {
            break;
        }
        let want = if last_traffic.elapsed() < ACTIVE { POLL } else { idle_poll(&server) };
        if want != timeout {
            timeout = want;
            let _ = stream.set_read_timeout(Some(timeout));
        }
        match stream.read(&mut inbuf) {
            Ok(0) => break,
            Ok(n) => {
                last_traffic = Instant::now();
                let busy = {
                    let mut s = server.lock().expect("server lock");
                    s.input(id, &inbuf[..n], now_ms(start));
                    s.backend_mut().busy()
                };
                // Only a request that started work needs the timer's quick ticks (a HEARTBEAT does not).
                if busy {
                    ticker.unpark();
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    server.lock().expect("server lock").closed(id, now_ms(start));
}

/// How often an idle connection looks for output: [`POLL`] × (connections / 64), from [`POLL`] to
/// [`MAX_IDLE_POLL`].
fn idle_poll(server: &Shared) -> Duration {
    let open = server.lock().map_or(0, |s| s.sessions()) as u32;
    (POLL * (open / 64).max(1)).min(MAX_IDLE_POLL)
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
