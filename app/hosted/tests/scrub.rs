//! Scrubbing a large lease does not freeze the hosted appliance: the memory of a revoked lease is zeroed in
//! bounded slices between the service's other work, and the pool is prepared in the background at start.
//!
//! A hosted appliance with the model (`--hca --udp`), a 4 GiB pool and a short revoke grace; a 3 GiB lease is
//! written through RDMA at a few offsets (writing all of it through the software requester would take minutes)
//! and revoked. While STATS shows its memory waiting to be zeroed (`bytes_scrubbing > 0`): a HEARTBEAT and the
//! REVOKE of another lease are answered, and STATS asked after each answer still shows the scrub running — so
//! they were answered during it, not after (causal checks: no round trip is held to a wall-clock bound; the
//! round trips are printed); more HEARTBEATs are answered while it runs; a session that only heartbeats at the
//! shortest silence timeout (`heartbeat_ms=1000`) stays alive — the appliance's own timer is the bound there. Then the memory is back (nothing waiting, every byte not
//! leased free) and zero, in the model's RAM and through a fresh lease over the same memory.
//!
//! The figures (time to the pool being ready, round trips, the scrub's duration and rate) are printed; run with
//! `--nocapture` to see them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_hosted::Hosted;
use leasebox_proto::{
    AllocReq, AllocResp, LeaseId, LeaseState, LeaseStats, Outcome, Request, Response, access, mtu_bytes,
};
use leasectl::rdma::{Completion, QpEndpoint, RcConfig, Requester, SoftConfig, SoftRoce, WcStatus, mtu_enum};
use leasectl::{Client, Credentials, Timeouts};

mod common;
use common::{Principals, with_model};

/// The lease pool (`lease_pool_mib=`).
const POOL: u64 = 4 << 30;
/// The lease whose scrub the checks run beside.
const LEASE: u64 = 3 << 30;
/// The lease revoked during the scrub.
const SMALL: u64 = 2 << 20;
/// The revoke grace (`lease_grace_ms=`): the sweep, which scrubs, comes this long after a REVOKE.
const GRACE_MS: u64 = 200;
/// The shortest silence timeout the appliance takes (`heartbeat_ms=`): a session silent this long is closed, so
/// a scrub that held the service this long would end the heartbeat-only session.
const HEARTBEAT_MS: u64 = 1000;
/// How long the pool's preparation, a completion or the scrub may take before the test counts as hung.
const HANG: Duration = Duration::from_secs(180);
/// Bytes written, read and checked at each offset of the lease.
const CHUNK: usize = 4096;
/// Transport timer 4.096 µs × 2^18 ≈ 1.07 s: on loopback only a lost packet lets it expire, never a busy machine.
const PATIENT: RcConfig = RcConfig { timeout: 18, retry_cnt: 7, rnr_retry: 7, max_wr: 16, max_pkts: 256 };
/// Sessions that wait between calls send a HEARTBEAT this often (well inside [`HEARTBEAT_MS`]).
const KEEPALIVE: Duration = Duration::from_millis(250);

/// The offsets in the lease written before the revoke and read after the scrub.
fn offsets() -> [u64; 4] {
    [0, 1 << 30, (2 << 30) + 12_345 * 4096, LEASE - CHUNK as u64]
}

fn pattern(seed: u64) -> Vec<u8> {
    (0..CHUNK as u64).map(|i| ((i ^ seed).wrapping_mul(2_654_435_761) >> 24) as u8 | 1).collect()
}

struct Rig {
    h: leasebox_hosted::testing::Rig,
    addr: String,
    udp: SocketAddr,
    demo: Credentials,
    admin: Credentials,
}

impl Rig {
    fn start() -> Rig {
        let h = with_model()
            .lease_pool_mib(POOL >> 20)
            // One tenant takes most of the pool: lift the default fair share of the two tenants configured.
            .option("tenant_mib", POOL >> 20)
            .lease_grace_ms(GRACE_MS)
            .heartbeat_ms(HEARTBEAT_MS)
            .start()
            .unwrap();
        let udp = h.udp().expect("--udp gives the responder an address");
        let addr = h.addr().to_string();
        let Principals { demo, admin, .. } = Principals::of(&h);
        Rig { h, addr, udp, demo, admin }
    }

    fn hosted(&self) -> &Hosted {
        &self.h
    }

    /// A session that waits up to 30 s for an answer, so a slow answer is measured rather than lost.
    fn session(&self, who: &Credentials) -> Client {
        let t = Timeouts { receive: Duration::from_secs(30), ..Timeouts::all(Duration::from_secs(10)) };
        Client::connect_and_hello(&self.addr, who, t).unwrap().0
    }

    fn requester(&self) -> SoftRoce {
        SoftRoce::new(SoftConfig { peer: self.udp, rc: PATIENT, ..SoftConfig::default() }).unwrap()
    }

    /// The model's RAM at a device address.
    fn ram(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.hosted().hca().unwrap().platform.ram().read(addr, &mut buf).unwrap();
        buf
    }

    /// Where the lease keyed `rkey` keeps the byte at `va`, in the model's RAM.
    fn device_addr(&self, rkey: u32, va: u64) -> u64 {
        let model = self.hosted().hca().unwrap().platform.model().unwrap();
        let key = model.mkey(rkey).expect("the lease's MKEY");
        key.translate(va, CHUNK as u64).expect("inside the lease")[0].0
    }
}

/// ALLOC of `size` bytes for `r`'s QP, `r` to RTS toward the server QP, READY → Active.
fn lease(c: &mut Client, r: &mut SoftRoce, size: u64) -> AllocResp {
    let me = r.local();
    let req = Request::Alloc(AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: mtu_enum(me.mtu).unwrap(),
        ttl_ms: 0,
        client_qpn: me.qpn,
        client_psn: me.psn,
        client_gid: me.gid,
        client_mac: me.mac,
    });
    let a = match c.call(&req).unwrap() {
        Response::Alloc(a) => a,
        other => panic!("ALLOC of {size} bytes answered {other:?}"),
    };
    let mtu = mtu_bytes(a.mtu).unwrap();
    r.connect(&QpEndpoint { qpn: a.server_qpn, psn: a.server_psn, gid: a.server_gid, mac: a.server_mac, mtu }).unwrap();
    let ready = Request::Ready { lease: a.lease, client_qpn: me.qpn, server_qpn: a.server_qpn };
    assert_eq!(c.call(&ready).unwrap(), Response::Ready { state: LeaseState::Active });
    a
}

/// REVOKE → (outcome, how long the answer took).
fn revoke(c: &mut Client, lease: LeaseId) -> (Outcome, Duration) {
    let t0 = Instant::now();
    match c.call(&Request::Revoke { lease, qp_first: false }).unwrap() {
        Response::Revoke { outcome, .. } => (outcome, t0.elapsed()),
        other => panic!("REVOKE answered {other:?}"),
    }
}

fn stats(c: &mut Client) -> LeaseStats {
    match c.call(&Request::Stats).unwrap() {
        Response::Stats(s) => s.leases,
        other => panic!("STATS answered {other:?}"),
    }
}

fn figures(s: &LeaseStats) -> String {
    format!(
        "pool_bytes {} bytes_free {} bytes_scrubbing {} bytes_leased {}",
        s.pool_bytes, s.bytes_free, s.bytes_scrubbing, s.bytes_leased
    )
}

/// One HEARTBEAT round trip.
fn ping(c: &mut Client) -> Result<Duration, String> {
    let t0 = Instant::now();
    match c.call(&Request::Heartbeat { echo: 7 }) {
        Ok(Response::Heartbeat { echo: 7, .. }) => Ok(t0.elapsed()),
        other => Err(format!("{other:?}")),
    }
}

/// The next `n` completions (failing after [`HANG`]).
fn next(r: &mut SoftRoce, n: usize) -> Vec<Completion> {
    let end = Instant::now() + HANG;
    let mut all = Vec::new();
    while all.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions within {HANG:?}: {all:?}", all.len());
        all.extend(r.poll(Duration::from_millis(20)));
    }
    all
}

/// What the heartbeat thread returns: its session, and (heartbeats answered, slowest round trip) or why one
/// was not answered.
type Beats = (Client, Result<(u32, Duration), String>);

/// A session that only heartbeats, once every third of its silence timeout, on a thread of its own.
struct Heartbeats {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Beats>,
}

impl Heartbeats {
    fn start(mut c: Client) -> Heartbeats {
        let every = Duration::from_millis(u64::from(c.welcome().unwrap().heartbeat_ms) / 3);
        assert_eq!(every, Duration::from_millis(HEARTBEAT_MS / 3), "the appliance took heartbeat_ms=");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut n, mut max) = (0u32, Duration::ZERO);
            let r = loop {
                let at = Instant::now();
                match ping(&mut c) {
                    Ok(d) => (n, max) = (n + 1, max.max(d)),
                    Err(e) => break Err(format!("heartbeat {} answered {e}", n + 1)),
                }
                while at.elapsed() < every && !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if stopped.load(Ordering::Relaxed) {
                    break Ok((n, max));
                }
            };
            (c, r)
        });
        Heartbeats { stop, thread }
    }

    /// Every heartbeat answered, and the session still there for one more: (heartbeats, slowest round trip).
    fn finish(self) -> (u32, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut c, r) = self.thread.join().unwrap();
        let (n, max) = r.unwrap_or_else(|e| panic!("the heartbeat-only session did not live through the scrub: {e}"));
        ping(&mut c).unwrap_or_else(|e| panic!("the heartbeat-only session is gone after {n} heartbeats: {e}"));
        (n, max)
    }
}

#[test]
fn a_3_gib_scrub_leaves_the_appliance_answering_and_the_memory_zero() {
    let started = Instant::now();
    let rig = Rig::start();
    let mut admin = rig.session(&rig.admin);
    // The pool is prepared in the background: the appliance answers before it is all ready.
    let first = stats(&mut admin);
    let answered = started.elapsed();
    let end = Instant::now() + HANG;
    let ready = loop {
        let s = stats(&mut admin);
        if s.pool_bytes == POOL && s.bytes_scrubbing == 0 && s.bytes_free == POOL {
            break started.elapsed();
        }
        assert!(Instant::now() < end, "the pool not ready within {HANG:?}: {}", figures(&s));
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!(
        "start → first STATS {:.0} ms ({}), → pool ready {:.0} ms",
        answered.as_secs_f64() * 1e3,
        figures(&first),
        ready.as_secs_f64() * 1e3
    );
    // The admin's session would fall silent while the lease is set up: a fresh one comes before the revoke.
    admin.bye().unwrap();

    let mut tenant = rig.session(&rig.demo);
    let mut r = rig.requester();
    let a = lease(&mut tenant, &mut r, LEASE);
    assert_eq!(a.length, LEASE);
    for (i, off) in offsets().into_iter().enumerate() {
        r.post_write(i as u64, a.remote_addr + off, a.rkey, &pattern(off)).unwrap();
    }
    let cs = next(&mut r, offsets().len());
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    // Where the writes landed in the model's RAM (the lease's extents), to look there after the scrub.
    let at: Vec<u64> = offsets().iter().map(|&off| rig.device_addr(a.rkey, a.remote_addr + off)).collect();
    for (&dev, off) in at.iter().zip(offsets()) {
        assert_eq!(rig.ram(dev, CHUNK), pattern(off), "the WRITE at offset {off:#x} in the model's RAM");
    }
    let mut r2 = rig.requester();
    let small = lease(&mut tenant, &mut r2, SMALL);
    let mut pinger = rig.session(&rig.demo);
    let heartbeats = Heartbeats::start(rig.session(&rig.demo));
    let mut admin = rig.session(&rig.admin);

    let (outcome, _) = revoke(&mut tenant, a.lease);
    assert_eq!(outcome, Outcome::TornDown);
    let revoked = Instant::now();
    // After the grace the sweep scrubs: wait for STATS to show it (the other sessions kept alive meanwhile).
    let mut kept = Instant::now();
    let seen = loop {
        let s = stats(&mut admin);
        if s.bytes_scrubbing > SMALL {
            break s;
        }
        assert!(revoked.elapsed() < HANG, "no STATS with the lease's memory waiting to be scrubbed: {}", figures(&s));
        if kept.elapsed() >= KEEPALIVE {
            ping(&mut tenant).unwrap();
            ping(&mut pinger).unwrap();
            kept = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let seen_at = revoked.elapsed();

    // A HEARTBEAT from another session during the scrub; STATS after its answer: still scrubbing.
    let pinged = ping(&mut pinger).unwrap();
    let after = stats(&mut admin);
    assert!(
        after.bytes_scrubbing > 0,
        "the scrub was over when the HEARTBEAT was answered, so it does not show the appliance answering during \
         it (the scrub ran from {:?} after the REVOKE; use a larger lease): {}",
        seen_at,
        figures(&after)
    );
    // The REVOKE of the small lease during the scrub; STATS after its outcome: the large lease still scrubbing.
    let (outcome, revoke_took) = revoke(&mut tenant, small.lease);
    let after = stats(&mut admin);
    assert_eq!(outcome, Outcome::TornDown, "REVOKE of the {SMALL}-byte lease during the scrub");
    assert!(
        after.bytes_scrubbing > SMALL,
        "the large lease's scrub was over when the REVOKE was answered (use a larger lease): {}",
        figures(&after)
    );

    // Round trips through the rest of the scrub, until the memory is back.
    let mut pings = vec![pinged];
    let mut kept = Instant::now();
    let mut most = seen.bytes_scrubbing;
    // HEARTBEATs answered with the scrub still running after them (STATS after the answer shows it).
    let mut during = 0;
    let back = loop {
        let d = ping(&mut pinger).unwrap();
        pings.push(d);
        if kept.elapsed() >= KEEPALIVE {
            ping(&mut tenant).unwrap();
            kept = Instant::now();
        }
        let s = stats(&mut admin);
        most = most.max(s.bytes_scrubbing);
        if s.bytes_scrubbing > 0 {
            during += 1;
        }
        if s.bytes_scrubbing == 0 && s.bytes_free == s.pool_bytes - s.bytes_leased {
            break s;
        }
        assert!(revoked.elapsed() < HANG, "the memory not back within {HANG:?} of the REVOKE: {}", figures(&s));
        std::thread::sleep(Duration::from_millis(10));
    };
    // The scrub is sliced: besides the HEARTBEAT and the REVOKE above, the loop's round trips went on during it.
    assert!(during >= 1, "no HEARTBEAT in the loop was answered while the scrub ran: {}", figures(&back));
    let scrubbed = revoked.elapsed() - Duration::from_millis(GRACE_MS);
    assert_eq!((back.pool_bytes, back.bytes_leased, back.bytes_free), (POOL, 0, POOL), "{}", figures(&back));
    let (beats, slowest_beat) = heartbeats.finish();

    // The memory is zero where the writes were, in the model's RAM and through a fresh lease over it.
    for (&dev, off) in at.iter().zip(offsets()) {
        assert_eq!(
            rig.ram(dev, CHUNK),
            vec![0; CHUNK],
            "the model's RAM at {dev:#x} (offset {off:#x}) after the scrub"
        );
    }
    // The pool lends the extents it got back last after those never lent (first in, first out): a filler lease
    // takes the latter, and a fresh lease the size of the revoked one gets its memory, in its order.
    let mut rfill = rig.requester();
    lease(&mut tenant, &mut rfill, POOL - LEASE - SMALL);
    let mut rf = rig.requester();
    let b = lease(&mut tenant, &mut rf, LEASE);
    let fresh: Vec<u64> = offsets().iter().map(|&off| rig.device_addr(b.rkey, b.remote_addr + off)).collect();
    assert_eq!(fresh, at, "the fresh lease is not on the revoked lease's memory (the pool's order changed?)");
    for (i, off) in offsets().into_iter().enumerate() {
        rf.post_read(i as u64, b.remote_addr + off, b.rkey, CHUNK as u32).unwrap();
    }
    let cs = next(&mut rf, offsets().len());
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    for (i, off) in offsets().into_iter().enumerate() {
        assert_eq!(rf.read_data(i as u64).unwrap(), vec![0; CHUNK], "the fresh lease at offset {off:#x}");
    }

    let mut ms: Vec<f64> = pings.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "scrub of {} GiB: seen {:.0} ms after the REVOKE (grace {GRACE_MS} ms), memory back {:.0} ms after the \
         grace ({:.2} GiB/s, at most {} MiB waiting); during it: HEARTBEAT {:.2} ms, then p50 {:.2} / max {:.2} ms \
         over {} round trips; REVOKE of a 2 MiB lease {:.2} ms; {beats} heartbeats (max {:.2} ms) on a session with \
         a {HEARTBEAT_MS} ms silence timeout; a fresh lease on the same memory reads zero",
        LEASE >> 30,
        seen_at.as_secs_f64() * 1e3,
        scrubbed.as_secs_f64() * 1e3,
        LEASE as f64 / f64::from(1 << 30) / scrubbed.as_secs_f64(),
        most >> 20,
        pinged.as_secs_f64() * 1e3,
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms.len(),
        revoke_took.as_secs_f64() * 1e3,
        slowest_beat.as_secs_f64() * 1e3,
    );
}
