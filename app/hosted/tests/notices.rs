//! The boot id, notices, DRAIN and RESUME end to end on the hosted appliance (`--hca`, real TCP, the real
//! client): the boot id in the handshake, STATS and lease ids; notices on the owning tenant's sessions only (admin
//! REVOKE, DRAIN through `leasectl drain`); RESUME from a new connection; and the lost-session hand-over: a second
//! session that renews keeps the lease when the first one times out. No RDMA data path: READY needs only the QP
//! numbers.

use std::time::{Duration, Instant};

use leasebox_proto::{AllocReq, ErrorCode, LeaseId, LeaseState, Notice, Outcome, Request, Response, access};
use leasectl::{Client, ClientError, Credentials, Timeouts};

mod common;
use common::{Principals, lease, with_model};

/// The shipped rig with the model, and its principals' credentials (the admin's key in hex too, for leasectl's
/// command line).
struct Rig {
    h: leasebox_hosted::testing::Rig,
    demo: (String, Credentials),
    other: Credentials,
    admin: (String, Credentials),
}

impl Rig {
    fn start(extra: &[(&str, u64)]) -> Rig {
        let h = extra.iter().fold(with_model(), |b, (k, v)| b.option(k, v)).start().unwrap();
        let p = Principals::of(&h);
        Rig { demo: (h.key("demo").hex(), p.demo), other: p.other, admin: (h.admin_key().hex(), p.admin), h }
    }

    fn addr(&self) -> String {
        self.h.addr().to_string()
    }

    fn session(&self, who: &Credentials) -> (Client, leasectl::Welcome) {
        Client::connect_and_hello(&self.addr(), who, Timeouts::all(Duration::from_secs(5))).unwrap()
    }
}

fn code(r: Result<Response, ClientError>) -> Option<ErrorCode> {
    match r {
        Err(ClientError::Server(e)) => Some(e.code),
        _ => None,
    }
}

/// Waits up to 5 s for the first notice matching `want` (others are kept in `seen`).
fn wait_for(c: &mut Client, seen: &mut Vec<Notice>, want: impl Fn(&Notice) -> bool) -> Notice {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(n) = seen.iter().find(|n| want(n)) {
            return *n;
        }
        assert!(Instant::now() < end, "no such notice; got {seen:?}");
        seen.extend(c.wait_notices(Duration::from_millis(200)).unwrap());
    }
}

#[test]
fn the_boot_id_is_announced_in_stats_and_in_every_lease_id() {
    let r = Rig::start(&[]);
    let (mut c, w) = r.session(&r.demo.1);
    assert_ne!(w.boot_id, [0; 16]);
    let (_, w2) = r.session(&r.demo.1);
    assert_eq!(w2.boot_id, w.boot_id, "one boot, one id");
    assert_ne!(w2.resume_token, w.resume_token, "one token per session");
    let Response::Stats(s) = c.call(&Request::Stats).unwrap() else { panic!("STATS") };
    assert_eq!(s.boot_id, w.boot_id);
    let l = lease(&mut c);
    assert_eq!(l.boot_id, w.boot_id);
    // The same slot and generation under another boot's id: a lease that does not exist.
    let old = LeaseId { boot_id: [0x5a; 16], ..l };
    assert_eq!(code(c.call(&Request::Query { lease: old })), Some(ErrorCode::NotFound));
    assert_eq!(
        c.call(&Request::Free { lease: old }).unwrap(),
        Response::Free { outcome: Outcome::NotFound, elapsed_us: 0 }
    );
    assert!(matches!(c.call(&Request::Query { lease: l }), Ok(Response::Query(_))));
}

#[test]
fn an_admin_revoke_is_told_to_every_session_of_the_owner_and_nobody_else() {
    let r = Rig::start(&[]);
    let (mut a, _) = r.session(&r.demo.1);
    let (mut b, _) = r.session(&r.demo.1);
    let (mut other, _) = r.session(&r.other);
    let (mut admin, _) = r.session(&r.admin.1);
    let l = lease(&mut a);
    let Response::Revoke { outcome, .. } = admin.call(&Request::Revoke { lease: l, qp_first: false }).unwrap() else {
        panic!("REVOKE")
    };
    let want = Notice::Revoked { lease: l, outcome };
    for c in [&mut a, &mut b] {
        let mut seen = Vec::new();
        assert_eq!(wait_for(c, &mut seen, |n| matches!(n, Notice::Revoked { .. })), want);
    }
    assert!(other.wait_notices(Duration::from_millis(300)).unwrap().is_empty(), "another tenant hears nothing");
    assert!(admin.wait_notices(Duration::from_millis(100)).unwrap().is_empty());
    // The tenant's own FREE is answered, not told.
    let mine = lease(&mut a);
    assert!(matches!(a.call(&Request::Free { lease: mine }), Ok(Response::Free { .. })));
    assert!(b.wait_notices(Duration::from_millis(300)).unwrap().is_empty());
}

#[test]
fn leasectl_drain_warns_waits_revokes_and_reports() {
    let r = Rig::start(&[]);
    let (mut a, _) = r.session(&r.demo.1);
    let (mut other, _) = r.session(&r.other);
    let l = lease(&mut a);
    let kept = lease(&mut other);
    let args: Vec<String> =
        ["--addr", &r.addr(), "--key", &r.admin.0, "--json", "drain", "--tenant", "demo", "--notice-ms", "400"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let none = |_: &str| None;
    let t0 = Instant::now();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = std::thread::scope(|s| {
        let run = s.spawn(|| leasectl::cli::run(&args, &none, &mut out, &mut err));
        // Meanwhile the tenant is told, and its ALLOCs are refused.
        let mut seen = Vec::new();
        assert_eq!(
            wait_for(&mut a, &mut seen, |n| matches!(n, Notice::Draining { .. })),
            Notice::Draining { in_ms: 400 }
        );
        let refused = a.call(&Request::Alloc(AllocReq {
            size: 4096,
            access: access::REMOTE_READ,
            mtu: 3,
            ttl_ms: 0,
            client_qpn: 1,
            client_psn: 1,
            client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
            client_mac: [2, 0, 0, 0, 0, 2],
        }));
        assert!(
            matches!(&refused, Err(ClientError::Server(e)) if e.code == ErrorCode::Busy && e.message.contains("draining")),
            "{refused:?}"
        );
        let n = wait_for(&mut a, &mut seen, |n| matches!(n, Notice::Revoked { .. }));
        assert_eq!(n, Notice::Revoked { lease: l, outcome: Outcome::TornDown });
        // Wall clock, and it stays: a lower bound (load only makes the revoke later, so it cannot fail
        // spuriously) on a DRAIN whose notice time runs on the appliance's real clock.
        assert!(t0.elapsed() >= Duration::from_millis(400), "not before the notice time");
        run.join().unwrap()
    });
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        (&v["tenant"], &v["leases"], &v["notice_ms"], &v["left"]),
        (&"demo".into(), &1.into(), &400.into(), &0.into())
    );
    // The other tenant kept its lease and heard nothing.
    assert!(
        matches!(other.call(&Request::Query { lease: kept }), Ok(Response::Query(i)) if i.state == LeaseState::Active)
    );
    assert!(other.take_notices().is_empty());
    // A tenant's DRAIN is refused.
    let drain = Request::Drain { tenant: String::new(), notice_ms: 0 };
    assert_eq!(self::code(a.call(&drain)), Some(ErrorCode::Forbidden));
}

#[test]
fn resume_takes_the_leases_over_and_counts_a_reconnect() {
    let r = Rig::start(&[]);
    let (mut old, w) = r.session(&r.demo.1);
    let l = lease(&mut old);
    let (mut other, _) = r.session(&r.other);
    assert_eq!(
        code(other.call(&Request::Resume { session_id: w.session_id, token: w.resume_token })),
        Some(ErrorCode::NotFound),
        "another principal"
    );
    let (mut new, _) = r.session(&r.demo.1);
    assert_eq!(
        code(new.call(&Request::Resume { session_id: w.session_id, token: [0; 16] })),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(new.resume(w.session_id, w.resume_token).unwrap(), 1);
    // The old session is closed; the lease lives on, the new session's.
    assert!(old.call(&Request::Heartbeat { echo: 1 }).is_err());
    assert!(matches!(new.call(&Request::Renew { lease: l, ttl_ms: 0 }), Ok(Response::Renew { .. })));
    let (mut admin, _) = r.session(&r.admin.1);
    let Response::Stats(s) = admin.call(&Request::Stats).unwrap() else { panic!("STATS") };
    assert!(s.leases.reconnects >= 1, "{:?}", s.leases);
}

/// The report, shortened: heartbeat timeout 1 s, no session grace. Session A allocates and goes silent;
/// session B renews and queries every 250 ms; A times out; B's RENEW keeps working.
#[test]
fn a_second_session_that_renews_keeps_the_lease_when_the_first_times_out() {
    let r = Rig::start(&[("heartbeat_ms", 1000), ("session_grace_ms", 0)]);
    let (mut a, _) = r.session(&r.demo.1);
    let l = lease(&mut a);
    let (mut b, _) = r.session(&r.demo.1);
    let end = Instant::now() + Duration::from_millis(2_500);
    while Instant::now() < end {
        let renew = b.call(&Request::Renew { lease: l, ttl_ms: 5_000 });
        assert!(matches!(renew, Ok(Response::Renew { .. })), "{renew:?}");
        let q = b.call(&Request::Query { lease: l });
        assert!(matches!(&q, Ok(Response::Query(i)) if i.state == LeaseState::Active), "{q:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(a.call(&Request::Heartbeat { echo: 1 }).is_err(), "A timed out");
}
