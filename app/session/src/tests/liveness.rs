//! Liveness by complete records (docs/security.md, "Liveness"): only a record that opens keeps a session
//! alive, a record trickling in slower than `MIN_RECORD_RATE` is closed, and records that carry no frame
//! (empty ones, or pieces of a frame) are counted and bounded.

use super::*;
use crate::server::{MAX_RECORDS_WITHOUT_FRAME, MIN_RECORD_RATE, RECORD_GRACE_MS};

/// One record holding `plain` as the client end of `c` seals it.
fn record(c: ConnId, plain: &[u8]) -> Vec<u8> {
    CLIENTS.with(|m| {
        let mut w = Vec::new();
        m.borrow_mut().get_mut(&c.0).expect("logged in").seal_one(plain, &mut w).unwrap();
        w
    })
}

fn closed_with(s: &mut Server<NoLeases, Counter>, c: ConnId) -> Option<ErrorBody> {
    let a = take(s, c);
    if !s.wants_close(c) {
        return None;
    }
    a.into_iter().find_map(|(_, a)| match a {
        Ans::Err(e) => Some(e),
        _ => None,
    })
}

#[test]
fn a_record_trickled_in_is_closed() {
    let mut s = server(Limits::default());
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let rec = record(ConnId(1), &req(Request::Heartbeat { echo: 1 }, 5));
    // One byte every 900 ms: each byte is news, none completes the record.
    let allowed = RECORD_GRACE_MS + rec.len() as u64 * 1000 / MIN_RECORD_RATE;
    let mut t = 0;
    let mut sent = 0;
    let closed_at = loop {
        t += 100;
        if t % 900 == 0 && sent < rec.len() - 1 {
            s.input(ConnId(1), &rec[sent..sent + 1], t);
            sent += 1;
        }
        s.tick(t);
        if let Some(e) = closed_with(&mut s, ConnId(1)) {
            assert_eq!(e.code, ErrorCode::Timeout);
            assert!(e.message.contains("slower than"), "{}", e.message);
            break t;
        }
        assert!(t < 10_000, "still open at {t} ms");
    };
    // The first byte came at 900 ms; the record had `allowed` ms from then.
    assert!(closed_at > 900 + allowed && closed_at <= 900 + allowed + 100, "closed at {closed_at} ms");
}

#[test]
fn only_a_complete_record_resets_the_silence_timer() {
    let mut s = server(Limits::default());
    let limit = u64::from(Limits::default().heartbeat_ms);
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 2 }, 6), 5_000);
    assert!(matches!(&a[0].1, Ans::Ok(Response::Heartbeat { echo: 2, .. })));
    // Half a record just before the timeout, fast enough for the rate: it does not count as life.
    let rec = record(ConnId(1), &req(Request::Heartbeat { echo: 3 }, 7));
    s.input(ConnId(1), &rec[..rec.len() / 2], 5_000 + limit - 100);
    s.tick(5_000 + limit);
    assert!(closed_with(&mut s, ConnId(1)).is_none(), "within the timeout");
    s.tick(5_000 + limit + 1);
    let e = closed_with(&mut s, ConnId(1)).expect("silent for longer than the timeout");
    assert_eq!(e.code, ErrorCode::Timeout);
    assert!(e.message.contains("no complete record"), "{}", e.message);
}

#[test]
fn records_without_a_frame_are_counted_and_bounded() {
    let mut s = server(Limits::default());
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let (opened, _) = s.records_in();
    // As many empty records as allowed, then a frame split over two records: all served.
    let mut wire = Vec::new();
    for _ in 0..MAX_RECORDS_WITHOUT_FRAME - 1 {
        wire.extend(record(ConnId(1), &[]));
    }
    let hb = req(Request::Heartbeat { echo: 4 }, 8);
    wire.extend(record(ConnId(1), &hb[..10]));
    wire.extend(record(ConnId(1), &hb[10..]));
    s.input(ConnId(1), &wire, 10);
    let a = take(&mut s, ConnId(1));
    assert!(matches!(&a[..], [(8, Ans::Ok(Response::Heartbeat { echo: 4, .. }))]), "served");
    assert!(!s.wants_close(ConnId(1)));
    let (n, empty) = s.records_in();
    assert_eq!(
        (n - opened, empty),
        (u64::from(MAX_RECORDS_WITHOUT_FRAME) + 1, u64::from(MAX_RECORDS_WITHOUT_FRAME) - 1)
    );
    // One more than allowed in a row: the session is closed, and what follows is not served.
    let mut wire = Vec::new();
    for _ in 0..=MAX_RECORDS_WITHOUT_FRAME {
        wire.extend(record(ConnId(1), &[]));
    }
    wire.extend(record(ConnId(1), &req(Request::Heartbeat { echo: 5 }, 9)));
    s.input(ConnId(1), &wire, 20);
    let e = closed_with(&mut s, ConnId(1)).expect("closed");
    assert_eq!(e.code, ErrorCode::Malformed);
    assert!(e.message.contains("carried no frame"), "{}", e.message);
}
