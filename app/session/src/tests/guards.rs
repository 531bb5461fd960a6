//! STATS' guard block (docs/wire-protocol.md, "STATS"): each of the session layer's defences is provoked once
//! (an eviction, a rate refusal, a replayed message 1, an empty record) and read back through STATS as a client
//! reads it, the admin with the figures, a tenant with the block zeroed, and a plain STATS without the block.

use super::*;
use crate::admission::{DEFAULT_CONN_RATE, EVICT_MIN_AGE_MS, Source};
use core::net::{IpAddr, Ipv4Addr};
use leasebox_proto::{STATS_WANT_GUARDS, SessionGuards, Stats};

fn ip(d: u8) -> Source {
    Source::ip(IpAddr::V4(Ipv4Addr::new(10, 7, 0, d)))
}

fn stats(s: &mut Server<NoLeases, Counter>, c: ConnId, r: Request, now: u64) -> Stats {
    match exchange(s, c, &req(r, 11), now).into_iter().next().expect("an answer").1 {
        Ans::Ok(Response::Stats(st)) => *st,
        Ans::Ok(r) => panic!("unexpected {r:?}"),
        Ans::Err(e) => panic!("STATS refused: {e:?}"),
        Ans::Notice(n) => panic!("unexpected {n:?}"),
    }
}

#[test]
fn each_guard_is_counted_and_reported_in_stats() {
    let mut s = server(Limits::default());
    assert!(s.open_from(ConnId(1), ip(1), 0));
    login(&mut s, ConnId(1), "admin", ADMIN_KEY).unwrap();
    assert!(s.open_from(ConnId(2), ip(2), 0));
    login(&mut s, ConnId(2), "demo", DEMO_KEY).unwrap();
    let before = stats(&mut s, ConnId(1), Request::StatsWith { want: STATS_WANT_GUARDS }, 0).guards.unwrap();
    assert_eq!((before.evicted, before.rate_refusals, before.hellos_replayed, before.records_empty), (0, 0, 0, 0));

    // Eviction: an address never seen holds its share of the unauthenticated pool (2 places); a third
    // connection from it, once they are old enough, replaces the oldest.
    let share = s.admission().budget().preauth_per_source;
    for c in 0..share {
        assert!(s.open_from(ConnId(10 + c as u64), ip(9), 0));
    }
    assert!(s.open_from(ConnId(20), ip(9), EVICT_MIN_AGE_MS));
    assert!(s.wants_close(ConnId(10)), "the oldest was evicted");

    // Rate refusal: one address opening more connections at once than its burst; past the burst, refused.
    let burst = DEFAULT_CONN_RATE.burst as u64;
    let refused = (0..burst + 3).filter(|c| !s.open_from(ConnId(100 + c), ip(8), EVICT_MIN_AGE_MS)).count();
    assert!(refused >= 3, "{refused}");
    let rate_refusals = s.admission().rate_refusals;
    assert!(rate_refusals >= 3, "{rate_refusals}");

    // A replayed message 1: the second copy, on another connection, is refused before any key work.
    let (hello, _) = hello_v2("demo", DEMO_KEY, 0x5e);
    assert!(s.open_from(ConnId(300), ip(3), EVICT_MIN_AGE_MS));
    assert!(s.open_from(ConnId(301), ip(4), EVICT_MIN_AGE_MS));
    s.input(ConnId(300), &hello, EVICT_MIN_AGE_MS);
    s.input(ConnId(301), &hello, EVICT_MIN_AGE_MS);
    assert!(s.wants_close(ConnId(301)));

    // An empty record from the admin's session: opened and counted, no frame in it.
    let mut empty = Vec::new();
    CLIENTS.with(|m| m.borrow_mut().get_mut(&1).unwrap().seal_one(&[], &mut empty).unwrap());
    s.input(ConnId(1), &empty, EVICT_MIN_AGE_MS);

    let now = EVICT_MIN_AGE_MS + 1;
    let (records_in, records_empty) = s.records_in();
    let st = stats(&mut s, ConnId(1), Request::StatsWith { want: STATS_WANT_GUARDS }, now);
    let g = st.guards.expect("asked for");
    assert_eq!(
        g,
        SessionGuards {
            evicted: 1,
            rate_refusals,
            hellos_replayed: 1,
            // This STATS request's own record opened before the answer was made.
            records_in: records_in + 1,
            records_empty,
        }
    );
    assert_eq!(g.records_empty, before.records_empty + 1);
    assert!(g.records_in >= before.records_in + 2, "the empty record and this request");
    // Unknown bits are ignored: a later client may ask for parts this appliance does not have.
    let later = stats(&mut s, ConnId(1), Request::StatsWith { want: STATS_WANT_GUARDS | 0x8000_0000 }, now);
    assert_eq!(later.guards.map(|g| g.evicted), Some(1));
    assert_eq!(stats(&mut s, ConnId(1), Request::StatsWith { want: 0 }, now).guards, None);
    // A plain STATS (every older client's) is the layout before the block.
    assert_eq!(stats(&mut s, ConnId(1), Request::Stats, now).guards, None);
    // A tenant gets the block, zeroed: the appliance's defences are the admin's figures.
    let t = stats(&mut s, ConnId(2), Request::StatsWith { want: STATS_WANT_GUARDS }, now);
    assert_eq!(t.guards, Some(SessionGuards::default()));
}
