//! `cargo xtask bench handshake`: how many replayed HELLOs the QEMU appliance absorbs while its revokes still
//! meet their deadline (docs/security.md, "Availability under a hostile network").
//!
//! Boots the appliance as shipped (virtio-net control channel, the mlx5 model attached, lease service up; TCG,
//! 1 CPU), captures one Noise message 1 (a HELLO that verified once), then, at each stepped rate, replays it
//! from worker threads — each replay a new TCP connection, as an attacker without the key must do: the server
//! closes a connection after AUTH_FAILED — while one tenant session allocates a lease and revokes it, over and
//! over. Per rate: replays answered (AUTH_FAILED after the tag check and the replay memory) and refused (BUSY:
//! the per-address or total rates) per second, REVOKE → outcome p50/p99/max, and whether every outcome arrived
//! within the 1 s revoke deadline. From QEMU's user network every host connection comes from one guest-side
//! address, so the per-address rates shape what is answered. Prints; asserts nothing.

use crate::Artifacts;
use crate::control::{self, Nic, Target};
use leasebox_proto::v2::{Initiator, prologue, psk_from_key};
use leasebox_proto::{ErrorBody, ErrorCode, FrameBuf, Hello, HelloNoise, Kind, Next, Request, Response};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Replays per second, stepped.
pub const RATES: [u32; 5] = [0, 100, 200, 400, 800];
/// Seconds per rate by default.
pub const DEFAULT_SECS: u64 = 10;
/// The revoke deadline every outcome must meet (docs/revoke-semantics.md).
const REVOKE_DEADLINE: Duration = Duration::from_secs(1);
/// Threads replaying: each connection waits for its answer, so the rate needs several in flight.
const WORKERS: u32 = 16;

/// What the replays got during one step.
#[derive(Default)]
struct Tally {
    attempts: AtomicU64,
    /// AUTH_FAILED: read, tag checked, found in the replay memory.
    answered: AtomicU64,
    /// BUSY: refused for a rate (or a full pool) before any handshake work.
    refused: AtomicU64,
    /// No answer within 2 s, or the connection failed.
    lost: AtomicU64,
}

/// One rate's figures.
pub struct Row {
    pub rate: u32,
    pub secs: f64,
    pub attempted: u64,
    pub answered: u64,
    pub refused: u64,
    pub lost: u64,
    /// REVOKE → outcome, client side, in µs.
    pub revokes: Vec<u64>,
    /// A revoke that failed outright (its error), if one did.
    pub revoke_error: Option<String>,
}

/// The HELLO frame of a tenant with a fresh ephemeral key.
fn hello_frame(t: &Target) -> Result<Vec<u8>, String> {
    let e_hex = leasectl::hex::random_key(32)?;
    let e: [u8; 32] = leasectl::hex::decode(&e_hex)?.try_into().map_err(|_| "ephemeral key length")?;
    let p = prologue(2, 2, 0, "demo");
    let (_init, msg1) = Initiator::start(&p, &psk_from_key(&t.tenant().key), e);
    let h = HelloNoise { min_version: 2, max_version: 2, key_id: 0, name: "demo".into(), msg1 };
    let mut b = Vec::new();
    Request::Hello(Hello::Noise(h)).encode(1, &mut b);
    Ok(b)
}

/// Sends `hello` on a new connection and reads the first frame back: the error code, or `None` for a HELLO
/// answer.
fn one_hello(addr: &SocketAddr, hello: &[u8], wait: Duration) -> Result<Option<ErrorCode>, String> {
    let mut s = TcpStream::connect_timeout(addr, wait).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.write_all(hello).map_err(|e| e.to_string())?;
    let mut fb = FrameBuf::new();
    let mut buf = [0u8; 512];
    loop {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed without an answer".into());
        }
        fb.push(&buf[..n]);
        if let Next::Frame(h, p) = fb.next_frame() {
            return match h.kind {
                Kind::Error => Ok(Some(ErrorBody::decode(&p).map_err(|e| e.to_string())?.code)),
                _ => Ok(None),
            };
        }
    }
}

/// Worker `w` of [`WORKERS`]: replays `hello` at its share of `rate` until `stop`.
fn replay(addr: SocketAddr, hello: Arc<Vec<u8>>, rate: u32, w: u32, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let every = Duration::from_secs_f64(f64::from(WORKERS) / f64::from(rate));
    // Workers start spread over one interval, so the replays do not arrive in bursts of WORKERS.
    let mut next = Instant::now() + every.mul_f64(f64::from(w) / f64::from(WORKERS));
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        // Behind (the appliance answers slower than the rate): no catching up in a burst.
        next = next.max(now - every) + every;
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        let counter = match one_hello(&addr, &hello, Duration::from_secs(2)) {
            Ok(Some(ErrorCode::AuthFailed)) => &tally.answered,
            Ok(Some(ErrorCode::Busy)) => &tally.refused,
            _ => &tally.lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// ALLOC then REVOKE on `c` until `dur` has passed: each REVOKE's round trip (request → outcome) in µs.
fn revoke_loop(c: &mut leasectl::client::Client, dur: Duration) -> Result<Vec<u64>, String> {
    let req = crate::control::bench_alloc_req();
    let start = Instant::now();
    let mut lat = Vec::new();
    while start.elapsed() < dur {
        let lease = match c.call(&Request::Alloc(req.clone())) {
            Ok(Response::Alloc(a)) => a.lease,
            // Revoked leases' memory is being scrubbed: try again shortly.
            Err(leasectl::client::ClientError::Server(e)) if e.code == ErrorCode::NoMemory => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            other => return Err(format!("ALLOC: {other:?}")),
        };
        let t0 = Instant::now();
        match c.call(&Request::Revoke { lease, qp_first: false }) {
            Ok(Response::Revoke { .. }) => lat.push(t0.elapsed().as_micros() as u64),
            other => return Err(format!("REVOKE: {other:?}")),
        }
        // A pause between leases: the revokes measure the appliance under the replays, not a saturated one.
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(lat)
}

/// One rate for `dur` against `t`.
fn step(t: &Target, hello: &Arc<Vec<u8>>, rate: u32, dur: Duration) -> Result<Row, String> {
    let addr: SocketAddr = t.addr.parse().map_err(|e| format!("{}: {e}", t.addr))?;
    let mut c = t.session(&t.tenant())?;
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let workers: Vec<_> = (0..if rate == 0 { 0 } else { WORKERS })
        .map(|w| {
            let (hello, tally, stop) = (hello.clone(), tally.clone(), stop.clone());
            std::thread::spawn(move || replay(addr, hello, rate, w, tally, stop))
        })
        .collect();
    let start = Instant::now();
    let revokes = revoke_loop(&mut c, dur);
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let (revokes, revoke_error) = match revokes {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Row {
        rate,
        secs,
        attempted: n(&tally.attempts),
        answered: n(&tally.answered),
        refused: n(&tally.refused),
        lost: n(&tally.lost),
        revokes,
        revoke_error,
    })
}

/// The table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>7}  {:>9}  {:>10}  {:>9}  {:>7}  {:>7}  {:>9}  {:>9}  {:>9}  all ≤ 1 s",
        "replays", "offered/s", "answered/s", "refused/s", "lost/s", "revokes", "p50 ms", "p99 ms", "max ms",
    );
    for r in rows {
        let mut v = r.revokes.clone();
        v.sort_unstable();
        let pct = |p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).map(|us| *us as f64 / 1000.0);
        let ms = |x: Option<f64>| x.map_or("-".to_string(), |m| format!("{m:.1}"));
        let within = match &r.revoke_error {
            Some(e) => format!("no: {e}"),
            None if v.is_empty() => "no revoke completed".into(),
            None => {
                let late = v.iter().filter(|us| Duration::from_micros(**us) > REVOKE_DEADLINE).count();
                if late == 0 { "yes".into() } else { format!("no: {late} late") }
            }
        };
        let per_s = |n: u64| n as f64 / r.secs;
        let _ = writeln!(
            s,
            "{:>5}/s  {:>9.0}  {:>10.1}  {:>9.1}  {:>7.1}  {:>7}  {:>9}  {:>9}  {:>9}  {within}",
            r.rate,
            per_s(r.attempted),
            per_s(r.answered),
            per_s(r.refused),
            per_s(r.lost),
            v.len(),
            ms(pct(0.5)),
            ms(pct(0.99)),
            ms(v.last().map(|us| *us as f64 / 1000.0)),
        );
    }
    s
}

/// The benchmark: boots the appliance, captures message 1, steps through [`RATES`] for `secs` each; returns the
/// table with a line on what was measured.
pub fn run(a: &Artifacts, secs: u64) -> Result<String, String> {
    let t = control::boot_qemu_nic(a, 1, Nic::Virtio, "")?;
    // The pool is prepared in the background after the ready line: wait for free bytes before measuring.
    let mut admin = t.session(&t.admin())?;
    let waited = Instant::now();
    loop {
        let free = admin.stats().map_err(|e| format!("STATS: {e}"))?.leases.bytes_free;
        if free >= 1 << 20 {
            break;
        }
        if waited.elapsed() > Duration::from_secs(180) {
            return Err(format!("the lease pool had {free} bytes free after 180 s"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("lease pool ready {:.1} s after the ready line", waited.elapsed().as_secs_f64());
    drop(admin);
    // The capture: a HELLO that verifies once (its answer read), so the appliance has seen its ephemeral.
    let hello = Arc::new(hello_frame(&t)?);
    let addr: SocketAddr = t.addr.parse().map_err(|e| format!("{}: {e}", t.addr))?;
    match one_hello(&addr, &hello, Duration::from_secs(10))? {
        None => {}
        Some(code) => return Err(format!("the captured HELLO was refused {code:?} the first time")),
    }
    let mut rows = Vec::new();
    for rate in RATES {
        let row = step(&t, &hello, rate, Duration::from_secs(secs))?;
        eprintln!("{}", table(std::slice::from_ref(&row)).lines().nth(1).unwrap_or_default());
        rows.push(row);
        // Let the per-address buckets refill between steps.
        std::thread::sleep(Duration::from_secs(3));
    }
    let mut out = table(&rows);
    let _ = writeln!(
        out,
        "(QEMU appliance as shipped: -kernel, q35, TCG, 1 CPU, virtio-net control channel, mlx5 model; one captured \
         message 1 replayed on a new connection each time by {WORKERS} threads; answered = AUTH_FAILED, refused = \
         BUSY, lost = no answer within 2 s; REVOKE → outcome on one tenant session, a 64 KiB lease allocated before \
         each, {secs} s per rate)"
    );
    Ok(out)
}
