//! A memory node's scale over real TCP (docs/operations.md, "Scale"): the hosted appliance with the model
//! holds 1,024 tenant sessions (512 each of `demo` and `other`) that heartbeat through three heartbeat periods,
//! while another session of `demo` has leases granted (ALLOC + READY) and the admin revokes them, over and over.
//! At the end every one of the 1,024 sessions is still there (each answers a HEARTBEAT, and STATS counts them)
//! and every revoke tore its lease down.
//!
//! One process holds both ends, so it needs about 2,100 file descriptors: the test raises its soft
//! `RLIMIT_NOFILE` to the hard limit when it is lower, and stops with a message if even that is too low.
//! All connections come from 127.0.0.1, where a cluster's clients would come from many addresses: the
//! per-source connection and HELLO rates (docs/security.md, "Pre-authentication") are raised to what 32 hosts
//! would have together; the appliance-wide handshake budget (128 a second) is left as it is, so logging in
//! takes about eight seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasebox_proto::{Outcome, Request, Response};
use leasebox_session::Rate;
use leasectl::{Client, ClientError, Credentials, Timeouts};

mod common;
use common::{Principals, lease, with_model};

const SESSIONS: usize = 1024;
/// Heartbeat timeout of the appliance (`heartbeat_ms=`): the sessions heartbeat every third of it.
const HEARTBEAT_MS: u64 = 6_000;

/// Raises the soft limit on open files to `want` (or the hard limit, if lower); the limit in force after.
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    if r.rlim_cur < want {
        let raised = libc::rlimit { rlim_cur: want.min(r.rlim_max), rlim_max: r.rlim_max };
        // SAFETY: `raised` is a valid rlimit whose soft limit does not exceed its hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = raised.rlim_cur;
        }
    }
    r.rlim_cur
}

/// Connects and authenticates, trying again while the appliance answers BUSY (its handshake budget).
fn login(addr: &str, who: &Credentials) -> Result<Client, String> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        match Client::connect_and_hello(addr, who, Timeouts::all(Duration::from_secs(10))) {
            Ok((c, _)) => return Ok(c),
            Err(ClientError::Server(_)) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("{}: {e}", who.name)),
        }
    }
}

fn heartbeat(c: &mut Client, echo: u64) -> Result<(), String> {
    match c.call(&Request::Heartbeat { echo }) {
        Ok(Response::Heartbeat { echo: e, .. }) if e == echo => Ok(()),
        other => Err(format!("HEARTBEAT {echo}: {other:?}")),
    }
}

#[test]
fn a_thousand_sessions_heartbeat_while_leases_come_and_go() {
    let fds = raise_nofile(4096);
    assert!(fds >= 2 * SESSIONS as u64 + 64, "this test needs ~2,100 open files; the limit is {fds}");

    let cluster = Rate { burst: 64, per_s: 32 * 32 };
    let h = with_model()
        .timing("zero")
        .sessions(SESSIONS as u32 + 16)
        .heartbeat_ms(HEARTBEAT_MS)
        // A revoked lease's memory comes back at once (no grace), so the churn never runs into the holder's
        // fair share of the pool.
        .lease_grace_ms(0)
        .edit(move |cfg| {
            cfg.budget.conn_rate = cluster;
            cfg.budget.hello_rate = cluster;
        })
        .start()
        .unwrap();
    let addr = h.addr().to_string();
    let Principals { demo, other, admin } = Principals::of(&h);

    // Leases granted and revoked all along: a session of demo takes a lease, the admin revokes it.
    let stop = Arc::new(AtomicBool::new(false));
    let revoked = Arc::new(AtomicU64::new(0));
    let churn = {
        let (addr, demo, admin, stop, revoked) =
            (addr.clone(), demo.clone(), admin.clone(), stop.clone(), revoked.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let mut holder = login(&addr, &demo)?;
            let mut op = login(&addr, &admin)?;
            while !stop.load(Ordering::Relaxed) {
                let l = lease(&mut holder);
                match op.call(&Request::Revoke { lease: l, qp_first: false }) {
                    Ok(Response::Revoke { outcome: Outcome::TornDown, .. }) => {}
                    other => return Err(format!("REVOKE {l:?}: {other:?}")),
                }
                revoked.fetch_add(1, Ordering::Relaxed);
                // The holder's session stays alive too (its notices are read with the answers).
                heartbeat(&mut holder, 1)?;
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
    };

    // 1,024 sessions log in; everyone logged in so far heartbeats at least every third of the timeout.
    let t0 = Instant::now();
    let mut clients: Vec<Client> = Vec::with_capacity(SESSIONS);
    let mut last_round = Instant::now();
    let period = Duration::from_millis(HEARTBEAT_MS / 3);
    let round = |clients: &mut Vec<Client>, tag: u64| -> Result<(), String> {
        for (i, c) in clients.iter_mut().enumerate() {
            heartbeat(c, tag << 16 | i as u64).map_err(|e| format!("session {i}: {e}"))?;
        }
        Ok(())
    };
    for i in 0..SESSIONS {
        let who = if i % 2 == 0 { &demo } else { &other };
        clients.push(login(&addr, who).unwrap_or_else(|e| panic!("session {i}: {e}")));
        if last_round.elapsed() >= period {
            round(&mut clients, 1).unwrap();
            last_round = Instant::now();
        }
    }
    let logged_in = t0.elapsed();

    // Three heartbeat timeouts with every session heartbeating.
    let t1 = Instant::now();
    let mut rounds = 0u64;
    while t1.elapsed() < Duration::from_millis(3 * HEARTBEAT_MS) {
        round(&mut clients, 2 + rounds).unwrap();
        rounds += 1;
        std::thread::sleep(period.saturating_sub(Duration::from_millis(500)));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap().unwrap();

    // Every session is still there: each answers, and the appliance counts them all.
    round(&mut clients, 99).unwrap();
    let Response::Stats(s) = login(&addr, &admin).unwrap().call(&Request::Stats).unwrap() else { panic!("STATS") };
    let revoked = revoked.load(Ordering::Relaxed);
    println!(
        "{SESSIONS} sessions logged in in {logged_in:?}; {rounds} heartbeat rounds over {:?}; {revoked} leases \
         granted and revoked meanwhile; STATS sessions_current {}",
        t1.elapsed(),
        s.sessions_current
    );
    // The 1,024 and the admin's STATS session (the churn's two sessions have ended).
    assert!(s.sessions_current as usize > SESSIONS, "STATS counts {} sessions", s.sessions_current);
    assert!(revoked >= 10, "leases came and went meanwhile: {revoked}");
    h.stop();
}
