//! A lease operation's answer goes out on the wake-up its last completion causes, not on a poll: with every
//! polling interval of the hosted appliance stretched to a minute (`Hosted::set_pace`), ALLOC, FREE and an
//! admin's REVOKE still answer and the owner still hears its notice, each within the client's 10 s timeout, and
//! the stage clock (`leasebox_hosted::stages`) says which thread woke which. No wall-clock assertion: a missed
//! wake-up shows as a call that times out.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leasebox_hosted::Pace;
use leasebox_hosted::stages::{Cause, Sample};
use leasebox_proto::{AllocReq, ErrorCode, Notice, Op, Request, Response, access};
use leasebox_session::admission::EVICT_MIN_AGE_MS;
use leasectl::{Client, ClientError, Timeouts};

mod common;
use common::{Principals, with_model};

const MINUTE: Duration = Duration::from_secs(60);

fn alloc(c: &mut Client) -> leasebox_proto::AllocResp {
    let a = AllocReq {
        size: 64 * 1024,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x77,
        client_psn: 1,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        client_mac: [2, 0, 0, 0, 0, 7],
    };
    match c.call(&Request::Alloc(a)) {
        Ok(Response::Alloc(a)) => a,
        other => panic!("ALLOC with every poll a minute long: {other:?} (an answer that waited for a poll)"),
    }
}

#[test]
fn answers_and_notices_ride_the_wake_ups_not_the_polls() {
    let h = with_model().lease_pool_mib(64).lease_grace_ms(100).start().unwrap();
    let k = Principals::of(&h);
    // The pool's first zeroing runs on the service thread's ticks: let it finish at the usual pace.
    let end = Instant::now() + Duration::from_secs(60);
    while h.with_leases(|b| b.svc.pool().unprepared_bytes() + b.svc.pool().scrubbing_bytes()) != Some(0) {
        assert!(Instant::now() < end, "the pool was not ready within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let addr = h.addr().to_string();
    let t = Timeouts::all(Duration::from_secs(10));
    let (mut demo, _) = Client::connect_and_hello(&addr, &k.demo, t).unwrap();
    let (mut watcher, _) = Client::connect_and_hello(&addr, &k.demo, t).unwrap();
    let (mut admin, _) = Client::connect_and_hello(&addr, &k.admin, t).unwrap();
    h.set_pace(Pace { tick: MINUTE, idle_tick: MINUTE, poll: MINUTE, max_idle_poll: MINUTE });
    assert_eq!(h.pace().tick, MINUTE);
    h.stages().record(true);
    let before = h.stages().passes();

    const N: usize = 4;
    for _ in 0..N {
        let a = alloc(&mut demo);
        assert!(matches!(demo.call(&Request::Free { lease: a.lease }), Ok(Response::Free { .. })));
    }
    let a = alloc(&mut demo);
    match admin.call(&Request::Revoke { lease: a.lease, qp_first: false }) {
        Ok(Response::Revoke { .. }) => {}
        other => panic!("REVOKE with every poll a minute long: {other:?}"),
    }
    // The owner's other session, idle and waiting on a minute-long poll, hears of it: the notice woke it.
    let notices = watcher.wait_notices(Duration::from_secs(10)).unwrap();
    assert!(
        notices.iter().any(|n| matches!(n, Notice::Revoked { lease, .. } if *lease == a.lease)),
        "no Revoked notice on the owner's idle session: {notices:?}"
    );

    // A sample is complete once its connection thread has written the answer, which it records just after the
    // write: the client may read the answer (and the notice) first. Wait for the REVOKE's.
    let end = Instant::now() + Duration::from_secs(5);
    let mut samples = h.stages().samples();
    while !samples.iter().any(|s| s.op == Op::Revoke) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
        samples = h.stages().samples();
    }
    let allocs: Vec<&Sample> = samples.iter().filter(|s| s.op == Op::Alloc).collect();
    assert_eq!(allocs.len(), N + 1, "every ALLOC timed: {samples:?}");
    for s in &allocs {
        // Deferred to the HCA (commands completed while it was under way), answered in a pass that a completion
        // started.
        assert_eq!(s.cause, Cause::Engine, "{s:?}");
        assert!(s.commands >= 1 && s.passes >= 1, "{s:?}");
    }
    let revoke = samples.iter().find(|s| s.op == Op::Revoke).expect("the REVOKE timed");
    assert!(matches!(revoke.cause, Cause::Engine | Cause::Inline), "{revoke:?}");
    let after = h.stages().passes();
    // Each deferred answer, and the notice, reached a connection thread that only a wake-up could move.
    let deferred = samples.iter().filter(|s| s.cause != Cause::Inline).count() as u64;
    assert!(after.conn_woken - before.conn_woken > deferred, "{before:?} → {after:?}, {deferred} deferred");
    assert!(after.engine > before.engine);
    drop((demo, watcher, admin));
    h.stop();
}

/// Output no request asked for wakes its connection's thread too: with every connection thread's own look a
/// minute apart (the service thread ticking as usual), a session that stops heartbeating gets its TIMEOUT, and a
/// silent unauthenticated connection evicted for a newer one gets its BUSY and is closed, each within 10 s.
#[test]
fn a_timeout_and_an_eviction_reach_threads_that_look_once_a_minute() {
    let h = with_model().heartbeat_ms(3000).option("preauth_sessions", 1).start().unwrap();
    let k = Principals::of(&h);
    h.set_pace(Pace { poll: MINUTE, max_idle_poll: MINUTE, ..Pace::DEFAULT });
    let addr = h.addr().to_string();
    let (mut silent, _) = Client::connect_and_hello(&addr, &k.demo, Timeouts::all(Duration::from_secs(10))).unwrap();
    // One record confirms the session (and proves its source, below); then it falls silent.
    assert!(matches!(silent.call(&Request::Heartbeat { echo: 1 }), Ok(Response::Heartbeat { .. })));
    match silent.wait_notices(Duration::from_secs(10)) {
        Err(ClientError::Server(e)) if e.code == ErrorCode::Timeout => {}
        other => panic!("a silent session with every poll a minute long: {other:?} (its TIMEOUT waited for a poll)"),
    }

    drop(silent);
    // 127.0.0.1 has confirmed a session, so its newest unauthenticated connection may take the place of its
    // older one once that has stood for EVICT_MIN_AGE_MS (docs/security.md, "Pre-authentication"). The older
    // one takes its place once the silent session is gone, and stands a while.
    let end = Instant::now() + Duration::from_secs(10);
    let settle = |n: usize| {
        while h.hosted().connections() != n {
            assert!(Instant::now() < end, "not {n} connections within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    settle(0);
    let mut older = TcpStream::connect(&addr).unwrap();
    older.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    settle(1);
    std::thread::sleep(Duration::from_millis(EVICT_MIN_AGE_MS + 200));
    let _newer = TcpStream::connect(&addr).unwrap();
    let mut got = Vec::new();
    match older.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) => panic!("the evicted connection was not closed within 10 s ({e}); it got {} bytes", got.len()),
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("evicted"), "the evicted connection's last words: {text:?}");
    h.stop();
}
