//! `cargo xtask bench scrub`: what zeroing ("scrubbing") lease memory costs the appliance's responsiveness, at
//! boot (the pool prepared) and after a large lease is revoked (its memory scrubbed before it is lent again).
//!
//! - Boot: the QEMU appliance as shipped (`-kernel`, q35, 6144 MiB, 1 CPU, TCG, the mlx5 model attached,
//!   virtio-net) with a 64 MiB and a 3000 MiB pool, and the hosted appliance (`leasebox-hosted --hca`, a process)
//!   with a 16 GiB pool: start → the ready line, → the first HELLO answered, → the whole pool ready (the `lease:
//!   pool ready: T MiB in N ms` line on the console; hosted, STATS with nothing left to prepare). A build older
//!   than that line and those STATS fields has its ready line (QEMU) or first answer (hosted) stand for it,
//!   marked so.
//! - Scrub (same appliances, 3000 MiB and 16 GiB pools, `lease_grace_ms=1000`): a large lease and a 2 MiB one,
//!   an admin REVOKE of the large one; once its grace is over, HEARTBEAT round trips from another session every
//!   [`SAMPLE_EVERY`] while it is scrubbed (p50, max), the 2 MiB lease's REVOKE → outcome during the scrub, and
//!   the scrub's rate: the lease's bytes over the grace's end → STATS `bytes_free` back. A request without an
//!   answer within [`NO_ANSWER`] is reported as such, not as an error.
//!
//! The kernel is the one `cargo xtask` builds or `LEASEBOX_KERNEL_ELF`; the hosted binary the release build or
//! [`HOSTED_BIN_ENV`]: the same bench measures an older build. Prints tables; asserts nothing. The tables are
//! pure functions (tested below); [`run`] measures.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasebox_proto::{LeaseStats, Outcome, Request, Response};
use leasectl::client::{Client, ClientError, Credentials, Timeouts};
use leasectl::rdma::RcConfig;

use crate::Artifacts;
use crate::lease_qemu::{self, Appliance, POOL_READY, SAMPLE_EVERY, lease_stats, rdma_lease_at, revoke};

/// Names the hosted binary to run instead of the release build (e.g. an older build's).
pub const HOSTED_BIN_ENV: &str = "LEASEBOX_HOSTED_BIN";
/// The QEMU guest's RAM (q35 puts 4 GiB of it above the PCI hole).
pub const QEMU_MEM_MIB: u32 = 6144;
/// The QEMU boots' pools; the last one also runs the scrub.
pub const QEMU_POOLS_MIB: [u32; 2] = [64, 3000];
/// The lease scrubbed under QEMU.
pub const QEMU_LEASE: u64 = 2560 << 20;
/// The hosted appliance's pool and the lease scrubbed there.
pub const HOSTED_POOL_MIB: u32 = 16384;
pub const HOSTED_LEASE: u64 = 12 << 30;
/// The lease revoked during the scrub.
pub const SMALL_LEASE: u64 = 2 << 20;
/// `lease_grace_ms=` on every appliance: the sweep that scrubs comes this long after the REVOKE.
pub const GRACE: Duration = Duration::from_secs(1);
/// A request without an answer this long is reported as "no answer in 40 s".
pub const NO_ANSWER: Duration = Duration::from_secs(40);
/// The first HELLO (QEMU's boot under TCG, HCA bring-up included).
const HELLO_WAIT: Duration = Duration::from_secs(300);
/// The `lease: pool ready` line or STATS saying so (3000 MiB zeroed under TCG).
const POOL_READY_WAIT: Duration = Duration::from_secs(900);
/// The whole scrub (the old code took 31 s for 2560 MiB under TCG, frozen).
const SCRUB_WAIT: Duration = Duration::from_secs(900);
/// ALLOC of a multi-GiB lease under TCG.
const ALLOC_WAIT: Duration = Duration::from_secs(120);
/// An appliance whose STATS do not say what is being scrubbed: the 2 MiB REVOKE goes once a sampled HEARTBEAT
/// has waited this long for its answer (the scrub holds the appliance), or [`BLIND_LIMIT`] after the grace.
const BLIND_STALL: Duration = Duration::from_millis(250);
const BLIND_LIMIT: Duration = Duration::from_secs(5);
/// A session that waits between calls sends a HEARTBEAT this often (the silence timeout is 10 s).
const KEEPALIVE: Duration = Duration::from_secs(2);

/// How long something took; or no answer within [`NO_ANSWER`]; or the appliance closed the session instead of
/// answering (an appliance that stopped serving longer than the silence timeout closes sessions it did not hear
/// from meanwhile), after so long, with its error code.
#[derive(Clone, Debug, PartialEq)]
pub enum Wait {
    Took(Duration),
    NoAnswer,
    Closed { after: Duration, code: String },
}

impl Wait {
    /// The answer to a request sent at `t0`: `Ok` for a figure, `Err` for anything else.
    fn of(t0: Instant, r: Result<Response, ClientError>, ok: impl Fn(&Response) -> bool) -> Result<Wait, String> {
        match r {
            Ok(a) if ok(&a) => Ok(Wait::Took(t0.elapsed())),
            Err(ClientError::Timeout { .. }) => Ok(Wait::NoAnswer),
            Err(ClientError::Server(e)) => Ok(Wait::Closed { after: t0.elapsed(), code: format!("{:?}", e.code) }),
            Err(ClientError::Io(e)) => Ok(Wait::Closed { after: t0.elapsed(), code: e.kind().to_string() }),
            other => Err(format!("{other:?}")),
        }
    }

    fn cell_ms(&self) -> String {
        match self {
            Wait::Took(d) => format!("{:.1}", d.as_secs_f64() * 1e3),
            Wait::NoAnswer => format!("no answer in {} s", NO_ANSWER.as_secs()),
            Wait::Closed { after, code } => format!("session closed ({code}) after {:.1} s", after.as_secs_f64()),
        }
    }
}

/// When the whole pool was ready, and how that is known.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolReady {
    /// The `lease: pool ready: T MiB in N ms` line arrived `at_ms` after the start; `own_ms` is its N.
    Logged { at_ms: f64, own_ms: Option<u64> },
    /// STATS showed the whole pool free with nothing left to prepare (hosted), `at_ms` after the start; `own_ms`
    /// from the appliance's log when it has the line.
    Stats { at_ms: f64, own_ms: Option<u64> },
    /// A build without the line (QEMU: the ready line has no `pool_mib=`) or the STATS fields (hosted): the ready
    /// line or the first answer, named by `what`, stands for it.
    Before { at_ms: f64, what: &'static str },
    /// Not within the wait.
    NotSeen { waited_s: u64 },
}

impl PoolReady {
    fn cell(&self) -> String {
        let own = |o: &Option<u64>| o.map_or(String::new(), |n| format!(" (appliance: {n} ms)"));
        match self {
            PoolReady::Logged { at_ms, own_ms } => format!("{at_ms:.1}{}", own(own_ms)),
            PoolReady::Stats { at_ms, own_ms } => format!("{at_ms:.1} (STATS){}", own(own_ms)),
            PoolReady::Before { at_ms, what } => format!("{at_ms:.1} ({what})"),
            PoolReady::NotSeen { waited_s } => format!("not within {waited_s} s"),
        }
    }
}

/// One appliance's boot figures, milliseconds from its start (QEMU's spawn, the hosted process's).
#[derive(Clone, Debug, PartialEq)]
pub struct BootFigures {
    /// → the ready line (QEMU's console, the hosted binary's stdout).
    pub ready_ms: f64,
    /// → the first HELLO answered.
    pub hello_ms: f64,
    pub pool: PoolReady,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BootRow {
    pub target: String,
    pub result: Result<BootFigures, String>,
}

/// One scrub's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrubFigures {
    pub lease_bytes: u64,
    /// STATS carry `pool_bytes` and `bytes_scrubbing` (a build with them).
    pub reports_scrubbing: bool,
    /// HEARTBEAT round trips sampled from the grace's end until the memory was back (sampling stops at the first
    /// without an answer).
    pub pings: Vec<Wait>,
    /// The 2 MiB lease's REVOKE → outcome, sent once STATS showed the scrub (or, when STATS do not report it, once a
    /// HEARTBEAT waited [`BLIND_STALL`]).
    pub small_revoke: Wait,
    /// The grace's end → the first STATS showing the scrub.
    pub seen: Option<Duration>,
    /// The grace's end → STATS `bytes_free` back (`None`: not within the wait).
    pub back: Option<Duration>,
    /// The admin sessions polling STATS that the appliance closed meanwhile (each replaced by a new one).
    pub stats_closed: u32,
}

impl ScrubFigures {
    /// GiB/s over the grace's end → memory back.
    pub fn gib_per_s(&self) -> Option<f64> {
        self.back.map(|d| self.lease_bytes as f64 / f64::from(1 << 30) / d.as_secs_f64())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ScrubRow {
    pub target: String,
    pub result: Result<ScrubFigures, String>,
}

/// The boot table.
pub fn boot_table(rows: &[BootRow]) -> String {
    let headers =
        ["appliance", "start → ready line (ms)", "start → first HELLO answered (ms)", "start → pool ready (ms)"];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| match &r.result {
            Ok(f) => {
                vec![r.target.clone(), format!("{:.1}", f.ready_ms), format!("{:.1}", f.hello_ms), f.pool.cell()]
            }
            Err(e) => vec![r.target.clone(), format!("did not run: {}", first_line(e)), String::new(), String::new()],
        })
        .collect();
    mlx5_hosted::table::render(&headers, &cells, 1)
}

/// The scrub table.
pub fn scrub_table(rows: &[ScrubRow]) -> String {
    let headers = [
        "appliance",
        "lease",
        "HEARTBEAT p50 (ms)",
        "HEARTBEAT max (ms)",
        "samples",
        "2 MiB REVOKE → outcome (ms)",
        "grace end → bytes_free back (s)",
        "GiB/s",
        "STATS bytes_scrubbing",
        "STATS sessions closed",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| match &r.result {
            Ok(f) => {
                let answered: Vec<i64> = f
                    .pings
                    .iter()
                    .filter_map(|w| if let Wait::Took(d) = w { Some(d.as_micros() as i64) } else { None })
                    .collect();
                let s = crate::revoke_bench::stats(&answered);
                let ms = |us: i64| format!("{:.1}", us as f64 / 1e3);
                let max = match f.pings.iter().find(|w| !matches!(w, Wait::Took(_))) {
                    Some(w) => w.cell_ms(),
                    None => s.map_or("—".into(), |s| ms(s.max)),
                };
                vec![
                    r.target.clone(),
                    format!("{} MiB", f.lease_bytes >> 20),
                    s.map_or("—".into(), |s| ms(s.p50)),
                    max,
                    f.pings.len().to_string(),
                    f.small_revoke.cell_ms(),
                    f.back.map_or(format!("not within {} s", SCRUB_WAIT.as_secs()), |d| {
                        format!("{:.1}", d.as_secs_f64())
                    }),
                    f.gib_per_s().map_or("—".into(), |g| format!("{g:.2}")),
                    if f.reports_scrubbing {
                        f.seen.map_or("never > 0".into(), |d| format!("> 0 from {:.0} ms", d.as_secs_f64() * 1e3))
                    } else {
                        "not reported (older build)".into()
                    },
                    f.stats_closed.to_string(),
                ]
            }
            Err(e) => {
                let mut row = vec![r.target.clone(), format!("did not run: {}", first_line(e))];
                row.resize(headers.len(), String::new());
                row
            }
        })
        .collect();
    mlx5_hosted::table::render(&headers, &cells, 2)
}

fn first_line(e: &str) -> &str {
    e.lines().next().unwrap_or_default()
}

/// Where an appliance answers and how to reach its leases.
struct Endpoint {
    addr: String,
    tenant: Credentials,
    admin: Credentials,
    /// The RoCEv2 responder (the requester of an ALLOC names it; nothing is sent).
    udp: SocketAddr,
}

impl Endpoint {
    fn session(&self, who: &Credentials, receive: Duration) -> Result<Client, String> {
        let t = Timeouts { retry_for: Duration::from_secs(30), receive, ..Timeouts::default() };
        Client::connect_and_hello(&self.addr, who, t)
            .map(|(c, _)| c)
            .map_err(|e| format!("session to {} as {}: {e}", self.addr, who.name))
    }
}

/// Connects and says HELLO until answered or `deadline`: when it was answered. Each attempt waits
/// [`crate::bench::probe_wait`] for the answer, [`crate::bench::PROBE_PAUSE`] apart.
fn first_hello(addr: &str, who: &Credentials, deadline: Instant) -> Result<Instant, String> {
    for n in 0u32.. {
        let wait = crate::bench::probe_wait(n);
        match Client::connect_and_hello(addr, who, Timeouts { connect: wait, receive: wait, retry_for: wait }) {
            Ok((c, _)) => {
                let at = Instant::now();
                let _ = c.bye();
                return Ok(at);
            }
            Err(e) if Instant::now() >= deadline => return Err(format!("no HELLO answered: {e}")),
            Err(_) => std::thread::sleep(crate::bench::PROBE_PAUSE),
        }
    }
    unreachable!("the loop returns")
}

fn ms_since(start: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(start).as_secs_f64() * 1e3
}

/// HEARTBEAT round trips on a session of their own, every [`SAMPLE_EVERY`], until stopped or one gets no answer.
struct Sampler {
    stop: Arc<AtomicBool>,
    /// When the HEARTBEAT in flight was sent, in µs after `base`, plus 1; 0 while none is.
    in_flight: Arc<AtomicU64>,
    base: Instant,
    thread: std::thread::JoinHandle<Result<Vec<Wait>, String>>,
}

impl Sampler {
    fn start(mut c: Client) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicU64::new(0));
        let base = Instant::now();
        let (stopped, sent) = (stop.clone(), in_flight.clone());
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let at = Instant::now();
                let echo = out.len() as u64 + 1;
                sent.store(at.duration_since(base).as_micros() as u64 + 1, Ordering::Relaxed);
                let r = c.call(&Request::Heartbeat { echo });
                sent.store(0, Ordering::Relaxed);
                let w = Wait::of(at, r, |a| matches!(a, Response::Heartbeat { echo: e, .. } if *e == echo))
                    .map_err(|e| format!("HEARTBEAT {echo} during the scrub: {e}"))?;
                let done = !matches!(w, Wait::Took(_));
                out.push(w);
                if done {
                    break;
                }
                while at.elapsed() < SAMPLE_EVERY && !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let _ = c.bye();
            Ok(out)
        });
        Sampler { stop, in_flight, base, thread }
    }

    /// Whether a HEARTBEAT has waited at least `d` for its answer so far.
    fn stalled(&self, d: Duration) -> bool {
        match self.in_flight.load(Ordering::Relaxed) {
            0 => false,
            sent => self.base.elapsed().as_micros() as u64 >= sent - 1 + d.as_micros() as u64,
        }
    }

    fn finish(self) -> Result<Vec<Wait>, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| "the HEARTBEAT sampler panicked".to_string())?
    }
}

/// The scrub of a `lease`-byte lease on `ep` (its pool ready): that lease and a [`SMALL_LEASE`], the admin's
/// REVOKE of the large one; after the grace, round trips sampled until `bytes_free` is back, and the small one's
/// REVOKE once the scrub shows.
fn measure_scrub(ep: &Endpoint, lease: u64) -> Result<ScrubFigures, String> {
    // A session silent for 10 s is closed: the admin's first session ends before the ALLOCs (a multi-GiB one
    // may take longer than that), its second comes after them.
    let mut admin = ep.session(&ep.admin, SCRUB_WAIT)?;
    let base = lease_stats(&mut admin)?;
    let _ = admin.bye();
    let reports_scrubbing = base.pool_bytes > 0;
    // The large lease's bytes are back when at most the small lease (in its own grace, or scrubbed) is missing.
    let back = |s: &LeaseStats| s.bytes_free + SMALL_LEASE >= base.bytes_free;
    let mut tenant = ep.session(&ep.tenant, ALLOC_WAIT)?;
    let big = rdma_lease_at(ep.udp, &mut tenant, RcConfig::default(), lease)?;
    let small = rdma_lease_at(ep.udp, &mut tenant, RcConfig::default(), SMALL_LEASE)?;
    tenant.set_timeouts(Timeouts { receive: NO_ANSWER, ..tenant.timeouts() });
    let pinger = ep.session(&ep.tenant, NO_ANSWER)?;
    let mut admin = ep.session(&ep.admin, SCRUB_WAIT)?;
    let (outcome, _) = revoke(&mut admin, big.alloc.lease, false)?;
    if outcome != Outcome::TornDown {
        return Err(format!("admin REVOKE of the {} MiB lease: {outcome:?}", lease >> 20));
    }
    let grace_end = Instant::now() + GRACE;
    std::thread::sleep(GRACE);
    let sampler = Sampler::start(pinger);
    let mut seen = None;
    if reports_scrubbing {
        let until = Instant::now() + Duration::from_secs(60);
        let mut kept = Instant::now();
        loop {
            let s = lease_stats(&mut admin)?;
            if s.bytes_scrubbing > SMALL_LEASE {
                seen = Some(grace_end.elapsed());
                break;
            }
            if back(&s) || Instant::now() >= until {
                break;
            }
            if kept.elapsed() >= KEEPALIVE {
                lease_qemu::ping(&mut tenant, 1).map_err(|e| format!("keeping the tenant's session: {e}"))?;
                kept = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        // No keep-alive on the tenant's session here (one sent into the freeze would be what waits): the limit
        // keeps its silence well inside the appliance's timeout.
        let until = Instant::now() + BLIND_LIMIT;
        while !sampler.stalled(BLIND_STALL) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let t0 = Instant::now();
    let r = tenant.call(&Request::Revoke { lease: small.alloc.lease, qp_first: false });
    let small_revoke = Wait::of(t0, r, |a| matches!(a, Response::Revoke { .. }))
        .map_err(|e| format!("REVOKE of the {} MiB lease: {e}", SMALL_LEASE >> 20))?;
    let deadline = grace_end + SCRUB_WAIT;
    let mut stats_closed = 0;
    let back_after = loop {
        match admin.call(&Request::Stats) {
            Ok(Response::Stats(s)) if back(&s.leases) => break Some(grace_end.elapsed()),
            Ok(Response::Stats(_)) => {}
            // The appliance closed the session (it heard nothing from it for its silence timeout while it did
            // not serve): count it and go on with a new one.
            Err(ClientError::Server(_) | ClientError::Io(_)) => {
                stats_closed += 1;
                admin = ep.session(&ep.admin, SCRUB_WAIT)?;
            }
            other => return Err(format!("STATS during the scrub: {other:?}")),
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(SAMPLE_EVERY);
    };
    let pings = sampler.finish()?;
    let _ = (admin.bye(), tenant.bye());
    Ok(ScrubFigures {
        lease_bytes: lease,
        reports_scrubbing,
        pings,
        small_revoke,
        seen,
        back: back_after,
        stats_closed,
    })
}

/// Boots the QEMU appliance with a `pool_mib` pool (and `extra` kernel arguments) and takes its boot figures;
/// returns it for more.
fn qemu_boot(a: &Artifacts, elf: &Path, pool_mib: u32, extra: &str) -> Result<(BootFigures, Appliance), String> {
    let name = format!("scrub-bench-{pool_mib}");
    let args = format!("lease_pool_mib={pool_mib} {extra}");
    let mut app = Appliance::spawn_mem(a, elf, &name, &args, QEMU_MEM_MIB)?;
    let started = app.started();
    let hello = match first_hello(&app.addr, &app.tenant(), started + HELLO_WAIT) {
        Ok(at) => at,
        Err(e) => return Err(app.fail(e)),
    };
    app.wait_ready()?;
    let ready_at = app.ready_at.ok_or("no ready line")?;
    let pool = if app.ready.get("pool_mib").is_none() {
        PoolReady::Before { at_ms: ms_since(started, ready_at), what: "at ready: no pool_mib= on it, an older image" }
    } else {
        match app.wait_line(|l| l.contains(POOL_READY), started + POOL_READY_WAIT) {
            Ok(Some((line, at))) => PoolReady::Logged {
                at_ms: ms_since(started, at),
                own_ms: lease_qemu::parse_pool_ready(&line).map(|(_, n)| n),
            },
            Ok(None) => PoolReady::NotSeen { waited_s: POOL_READY_WAIT.as_secs() },
            Err(e) => return Err(app.fail(e)),
        }
    };
    let f = BootFigures { ready_ms: ms_since(started, ready_at), hello_ms: ms_since(started, hello), pool };
    Ok((f, app))
}

/// The hosted appliance as a process of `bin`: killed and reaped on drop.
struct HostedProcess {
    child: Child,
    addr: String,
    tenant_hex: String,
    admin_hex: String,
    started: Instant,
    /// Its stderr (the appliance's log).
    log: PathBuf,
}

impl Drop for HostedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HostedProcess {
    fn tenant(&self) -> Credentials {
        crate::control::credentials("demo", &self.tenant_hex)
    }
    fn admin(&self) -> Credentials {
        crate::control::credentials("admin", &self.admin_hex)
    }
}

/// `bin --listen 127.0.0.1:PORT --hca --udp 127.0.0.1:0 tenant=… admin=… lease_pool_mib=… lease_grace_ms=…`
/// with its stdout's lines (and when they came) on the returned channel.
fn spawn_hosted(
    a: &Artifacts,
    bin: &Path,
    pool_mib: u32,
) -> Result<(HostedProcess, mpsc::Receiver<(String, Instant)>), String> {
    let (tenant_hex, admin_hex) = (crate::control::random_hex()?, crate::control::random_hex()?);
    let addr = format!("127.0.0.1:{}", crate::control::free_port()?);
    std::fs::create_dir_all(&a.log_dir).map_err(|e| format!("creating {}: {e}", a.log_dir.display()))?;
    let log = a.log_dir.join("scrub-bench-hosted.log");
    let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", &addr, "--hca", "--udp", "127.0.0.1:0"])
        .arg(format!("tenant=demo:{tenant_hex}"))
        .arg(format!("admin={admin_hex}"))
        .arg(format!("lease_pool_mib={pool_mib}"))
        .arg(format!("lease_grace_ms={}", GRACE.as_millis()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("running {}: {e}", bin.display()))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send((line, Instant::now()));
        }
    });
    Ok((HostedProcess { child, addr, tenant_hex, admin_hex, started, log }, rx))
}

/// `N` of a `lease: pool ready: T MiB in N ms` line in `log`, if there is one.
fn logged_pool_ms(log: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find_map(lease_qemu::parse_pool_ready).map(|(_, n)| n)
}

/// The hosted appliance's boot figures; returns it, and its RoCEv2 address, for more.
fn hosted_boot(a: &Artifacts, bin: &Path) -> Result<(BootFigures, HostedProcess, SocketAddr), String> {
    let (h, lines) = spawn_hosted(a, bin, HOSTED_POOL_MIB)?;
    let hello = first_hello(&h.addr, &h.tenant(), h.started + HELLO_WAIT)?;
    let deadline = h.started + HELLO_WAIT;
    let (ready, ready_at) = loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((l, at)) if l.starts_with("leasebox: ready") => break (l, at),
            Ok(_) => {}
            Err(_) => return Err(format!("no ready line from {} (log {})", bin.display(), h.log.display())),
        }
    };
    let udp = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("udp="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no udp= on the ready line: {ready}"))?;
    let mut admin =
        Endpoint { addr: h.addr.clone(), tenant: h.tenant(), admin: h.admin(), udp }.session(&h.admin(), NO_ANSWER)?;
    let first = lease_stats(&mut admin)?;
    let answered = Instant::now();
    let pool = if first.pool_bytes == 0 {
        PoolReady::Before { at_ms: ms_since(h.started, answered), what: "at the first STATS: none of its pool fields" }
    } else {
        let deadline = Instant::now() + POOL_READY_WAIT;
        loop {
            let s = lease_stats(&mut admin)?;
            if s.bytes_scrubbing == 0 && s.bytes_free == s.pool_bytes {
                break PoolReady::Stats { at_ms: ms_since(h.started, Instant::now()), own_ms: logged_pool_ms(&h.log) };
            }
            if Instant::now() >= deadline {
                break PoolReady::NotSeen { waited_s: POOL_READY_WAIT.as_secs() };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let _ = admin.bye();
    let f = BootFigures { ready_ms: ms_since(h.started, ready_at), hello_ms: ms_since(h.started, hello), pool };
    Ok((f, h, udp))
}

/// Both tables' rows: the QEMU boots (the last one's appliance scrubs), then the hosted appliance.
pub fn measure(a: &Artifacts, elf: &Path, hosted_bin: &Path) -> (Vec<BootRow>, Vec<ScrubRow>) {
    let (mut boots, mut scrubs) = (Vec::new(), Vec::new());
    let grace = format!("lease_grace_ms={}", GRACE.as_millis());
    let scrub_pool = QEMU_POOLS_MIB[QEMU_POOLS_MIB.len() - 1];
    for pool in QEMU_POOLS_MIB {
        let target = format!("QEMU, pool {pool} MiB (q35, {QEMU_MEM_MIB} MiB, 1 CPU, TCG)");
        eprintln!("{target}: booting");
        match qemu_boot(a, elf, pool, &grace) {
            Ok((f, mut app)) => {
                eprintln!(
                    "{target}: ready line {:.1} ms, first HELLO {:.1} ms, pool ready {}",
                    f.ready_ms,
                    f.hello_ms,
                    f.pool.cell()
                );
                boots.push(BootRow { target: target.clone(), result: Ok(f) });
                if pool == scrub_pool {
                    let ep =
                        Endpoint { addr: app.addr.clone(), tenant: app.tenant(), admin: app.admin(), udp: app.udp };
                    let r = measure_scrub(&ep, QEMU_LEASE).map_err(|e| app.fail(e));
                    report_scrub(&target, &r);
                    app.drain();
                    scrubs.push(ScrubRow { target, result: r });
                }
            }
            Err(e) => {
                eprintln!("{target}: {e}");
                if pool == scrub_pool {
                    scrubs.push(ScrubRow { target: target.clone(), result: Err(format!("boot: {}", first_line(&e))) });
                }
                boots.push(BootRow { target, result: Err(e) });
            }
        }
    }
    let target = format!("hosted --hca, pool {HOSTED_POOL_MIB} MiB ({})", hosted_bin.display());
    eprintln!("{target}: starting");
    match hosted_boot(a, hosted_bin) {
        Ok((f, h, udp)) => {
            eprintln!(
                "{target}: ready line {:.1} ms, first HELLO {:.1} ms, pool ready {}",
                f.ready_ms,
                f.hello_ms,
                f.pool.cell()
            );
            boots.push(BootRow { target: target.clone(), result: Ok(f) });
            let ep = Endpoint { addr: h.addr.clone(), tenant: h.tenant(), admin: h.admin(), udp };
            let r = measure_scrub(&ep, HOSTED_LEASE);
            report_scrub(&target, &r);
            scrubs.push(ScrubRow { target, result: r });
        }
        Err(e) => {
            eprintln!("{target}: {e}");
            scrubs.push(ScrubRow { target: target.clone(), result: Err(format!("start: {}", first_line(&e))) });
            boots.push(BootRow { target, result: Err(e) });
        }
    }
    (boots, scrubs)
}

fn report_scrub(target: &str, r: &Result<ScrubFigures, String>) {
    match r {
        Ok(f) => eprintln!(
            "{target}: {} round trips sampled, 2 MiB REVOKE → outcome (ms) {}, memory back {}, {} GiB/s",
            f.pings.len(),
            f.small_revoke.cell_ms(),
            f.back.map_or("never".into(), |d| format!("{:.1} s after the grace", d.as_secs_f64())),
            f.gib_per_s().map_or("—".into(), |g| format!("{g:.2}"))
        ),
        Err(e) => eprintln!("{target}: scrub: {e}"),
    }
}

/// Measures ([`measure`]) and renders both tables, with what was run.
pub fn run(a: &Artifacts, elf: &Path, kernel: &str, hosted_bin: &Path, hosted: &str) -> String {
    let (boots, scrubs) = measure(a, elf, hosted_bin);
    let mut out = format!("kernel: {kernel}\nhosted: {hosted}\n\n");
    out.push_str("boot: the lease pool prepared (zeroed) before it is lent\n");
    out.push_str(&boot_table(&boots));
    out.push_str(&format!(
        "\nscrub: a large lease and a {} MiB one, admin REVOKE of the large one, lease_grace_ms={}; from the grace's \
         end until STATS bytes_free is back: HEARTBEAT from another session every {} ms, the {} MiB lease's REVOKE \
         once STATS shows the scrub (when STATS do not report bytes_scrubbing: once a HEARTBEAT has waited {} ms)\n",
        SMALL_LEASE >> 20,
        GRACE.as_millis(),
        SAMPLE_EVERY.as_millis(),
        SMALL_LEASE >> 20,
        BLIND_STALL.as_millis()
    ));
    out.push_str(&scrub_table(&scrubs));
    out.push_str(
        "\n(QEMU: the appliance as shipped under TCG on this machine's shared cores, the model in its own process; \
         hosted: the release binary (or LEASEBOX_HOSTED_BIN), the model in process. GiB/s counts the grace's end → \
         bytes_free back, the sweep's HCA commands included. Compare ratios, not absolute times.)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_rows() {
        let rows = vec![
            BootRow {
                target: "QEMU, pool 3000 MiB".into(),
                result: Ok(BootFigures {
                    ready_ms: 12_345.67,
                    hello_ms: 12_000.0,
                    pool: PoolReady::Logged { at_ms: 52_000.0, own_ms: Some(39_000) },
                }),
            },
            BootRow {
                target: "old".into(),
                result: Ok(BootFigures {
                    ready_ms: 40_000.0,
                    hello_ms: 41_000.0,
                    pool: PoolReady::Before { at_ms: 40_000.0, what: "at ready" },
                }),
            },
            BootRow { target: "broken".into(), result: Err("no ready line\nmore".into()) },
        ];
        let t = boot_table(&rows);
        let line = |k: &str| t.lines().find(|l| l.starts_with(k)).unwrap().to_string();
        assert!(line("QEMU").contains("12345.7") && line("QEMU").contains("52000.0 (appliance: 39000 ms)"), "{t}");
        assert!(line("old").contains("40000.0 (at ready)"), "{t}");
        assert!(line("broken").contains("did not run: no ready line") && !t.contains("more"), "{t}");
        assert_eq!(PoolReady::NotSeen { waited_s: 900 }.cell(), "not within 900 s");
        assert_eq!(PoolReady::Stats { at_ms: 5.0, own_ms: None }.cell(), "5.0 (STATS)");
        assert_eq!(PoolReady::Stats { at_ms: 5.0, own_ms: Some(3) }.cell(), "5.0 (STATS) (appliance: 3 ms)");
    }

    #[test]
    fn scrub_rows() {
        let ms = |n: u64| Wait::Took(Duration::from_millis(n));
        let new = ScrubFigures {
            lease_bytes: 2560 << 20,
            reports_scrubbing: true,
            pings: vec![ms(10), ms(30), ms(20)],
            small_revoke: ms(25),
            seen: Some(Duration::from_millis(150)),
            back: Some(Duration::from_secs(20)),
            stats_closed: 0,
        };
        assert_eq!(new.gib_per_s(), Some(0.125));
        let old = ScrubFigures {
            reports_scrubbing: false,
            pings: vec![Wait::Took(Duration::from_secs(31))],
            small_revoke: Wait::NoAnswer,
            seen: None,
            back: None,
            stats_closed: 2,
            ..new.clone()
        };
        let rows = vec![
            ScrubRow { target: "new".into(), result: Ok(new) },
            ScrubRow { target: "old".into(), result: Ok(old) },
            ScrubRow { target: "gone".into(), result: Err("boot: QEMU exited".into()) },
        ];
        let t = scrub_table(&rows);
        let line = |k: &str| t.lines().find(|l| l.starts_with(k)).unwrap().to_string();
        let new = line("new");
        assert!(new.contains("2560 MiB") && new.contains("20.0") && new.contains("30.0"), "{t}");
        assert!(new.contains("25.0") && new.contains("0.12") && new.contains("> 0 from 150 ms"), "{t}");
        let old = line("old");
        assert!(old.contains("31000.0") && old.contains("no answer in 40 s"), "{t}");
        assert!(old.contains("not within 900 s") && old.contains("not reported (older build)"), "{t}");
        assert!(old.ends_with(" 2"), "{t}");
        assert!(line("gone").contains("did not run: boot: QEMU exited"), "{t}");
        let none = ScrubFigures { pings: vec![ms(5), Wait::NoAnswer], ..rows_first() };
        let t = scrub_table(&[ScrubRow { target: "x".into(), result: Ok(none) }]);
        let x = t.lines().find(|l| l.starts_with('x')).unwrap();
        assert!(x.contains("5.0") && x.contains("no answer in 40 s"), "{t}");
        let closed = Wait::Closed { after: Duration::from_millis(31_250), code: "Timeout".into() };
        assert_eq!(closed.cell_ms(), "session closed (Timeout) after 31.2 s");
        let f = ScrubFigures { pings: vec![ms(5), closed.clone()], small_revoke: closed, ..rows_first() };
        let t = scrub_table(&[ScrubRow { target: "y".into(), result: Ok(f) }]);
        let y = t.lines().find(|l| l.starts_with('y')).unwrap();
        assert_eq!(y.matches("session closed (Timeout) after 31.2 s").count(), 2, "{t}");
    }

    fn rows_first() -> ScrubFigures {
        ScrubFigures {
            lease_bytes: 12 << 30,
            reports_scrubbing: true,
            pings: Vec::new(),
            small_revoke: Wait::Took(Duration::from_millis(1)),
            seen: None,
            back: Some(Duration::from_secs(3)),
            stats_closed: 0,
        }
    }
}
