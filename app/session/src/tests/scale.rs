//! A memory node's scale (docs/operations.md, "Scale"): a thousand sessions at once, heartbeating, on virtual
//! time. (What each costs the heap is measured in `tests/session_heap.rs`, whose allocator counts.)

use super::*;
use crate::admission::Source;
use core::net::{IpAddr, Ipv4Addr};

/// 1,024 sessions from 32 addresses (a cluster's clients) log in over ten virtual seconds, within every rate
/// (per source, and the appliance's handshake budget); then three heartbeat periods pass with every session
/// sending a HEARTBEAT each period, and every one is still there and answered; one that falls silent is
/// closed and the rest stay.
#[test]
fn a_thousand_sessions_heartbeat_and_stay() {
    const N: u64 = 1024;
    let limits = Limits { sessions: N as usize + 1, ..Limits::default() };
    let mut s = server(limits);
    s.set_budget(Budget::for_sessions(limits.sessions));
    let source = |i: u64| Source::ip(IpAddr::V4(Ipv4Addr::new(10, 1, 0, (i % 32) as u8 + 1)));
    let mut now = 0;
    for i in 0..N {
        now = i * 10;
        let c = ConnId(i + 1);
        assert!(s.open_from(c, source(i), now), "session {i} refused a place");
        let w = login_at(&mut s, c, "demo", DEMO_KEY, now).unwrap_or_else(|e| panic!("session {i}: {e:?}"));
        assert!(matches!(w, HelloReply::Welcome { role: Role::Tenant, .. }));
        // Every virtual second, the sessions in so far heartbeat and the timers run.
        if i % 100 == 99 {
            for k in 0..=i {
                let a = exchange(&mut s, ConnId(k + 1), &req(Request::Heartbeat { echo: k }, 100 + i as u32), now);
                assert!(matches!(a.as_slice(), [(_, Ans::Ok(Response::Heartbeat { .. }))]), "session {k}");
            }
            s.tick(now);
        }
    }
    assert_eq!(s.admission().sessions(), N as usize);

    let period = u64::from(limits.heartbeat_ms);
    for round in 0..3u64 {
        now += period - 500;
        for i in 0..N {
            let c = ConnId(i + 1);
            let a = exchange(&mut s, c, &req(Request::Heartbeat { echo: i }, 1 + round as u32), now);
            assert!(
                matches!(a.as_slice(), [(_, Ans::Ok(Response::Heartbeat { echo, .. }))] if *echo == i),
                "session {i} round {round}"
            );
        }
        s.tick(now);
    }
    assert_eq!(s.admission().sessions(), N as usize, "every session is still there");
    assert_eq!(s.stats(now).sessions_current, N as u32);
    // A session that stops heartbeating is closed at the timeout; the others stay.
    for i in 1..N {
        exchange(&mut s, ConnId(i + 1), &req(Request::Heartbeat { echo: i }, 9), now + period);
    }
    s.tick(now + period + 1);
    assert!(s.wants_close(ConnId(1)), "the silent session is closed");
    assert!((2..=N).all(|i| !s.wants_close(ConnId(i))), "the others stay");
}
