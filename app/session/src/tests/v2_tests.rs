//! Protocol v2 as an attacker sees it: v1 refused, relayed handshakes, altered / replayed /
//! reordered / truncated records, key rotation, and no name oracle.

use super::*;

fn heartbeat(id: u32) -> Vec<u8> {
    req(Request::Heartbeat { echo: u64::from(id) }, id)
}

fn first_error(a: &[(u32, Ans)]) -> Option<(ErrorCode, String)> {
    a.iter().find_map(|(_, x)| match x {
        Ans::Err(e) => Some((e.code, e.message.clone())),
        Ans::Ok(_) | Ans::Notice(_) => None,
    })
}

#[test]
fn a_v1_hello_is_refused_naming_v2() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    let init = Request::Hello(Hello::Init(HelloInit {
        min_version: 1,
        max_version: 1,
        name: "demo".into(),
        client_nonce: [0; 16],
    }));
    let a = exchange(&mut s, ConnId(1), &req(init, 1), 0);
    let Ans::Err(e) = &a[0].1 else { panic!("v1 HELLO answered") };
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);
    assert_eq!(e.message, "protocol v1 is not served: use v2 (docs/wire-protocol.md)");
    assert_eq!(e.detail[..2], [2, 2]);
    assert!(s.wants_close(ConnId(1)));
    // A v2 HELLO whose range excludes 2 is refused too.
    s.open(ConnId(2), 0);
    let (_, init) = hello_v2("demo", DEMO_KEY, 1);
    drop(init);
    let h = HelloNoise { min_version: 3, max_version: 5, key_id: 0, name: "demo".into(), msg1: [0; v2::MSG1_LEN] };
    let a = exchange(&mut s, ConnId(2), &req(Request::Hello(Hello::Noise(h)), 1), 0);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::UnsupportedVersion));
    assert!(s.wants_close(ConnId(2)));
}

#[test]
fn before_authentication_malformed_frames_close() {
    let hello = Op::Hello as u16;
    let (good, _) = hello_v2("demo", DEMO_KEY, 1);
    let payload = good[leasebox_proto::HEADER_LEN..].to_vec();
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        ("unknown frame kind", raw_frame(7, 0, hello, 3, &payload), ErrorCode::Malformed),
        ("reserved header bytes set", raw_frame(0, 1, hello, 3, &payload), ErrorCode::Malformed),
        ("a response frame", raw_frame(1, 0, hello, 3, &payload), ErrorCode::Malformed),
        ("HELLO step 3 cut short", raw_frame(0, 0, hello, 3, &payload[..payload.len() - 1]), ErrorCode::Malformed),
        (
            "HELLO step 3 with a byte too many",
            raw_frame(0, 0, hello, 3, &[&payload[..], &[0]].concat()),
            ErrorCode::Malformed,
        ),
        ("HELLO step 2", req(Request::Hello(Hello::Proof { mac: [0; 32] }), 3), ErrorCode::BadState),
        ("HELLO step 4", raw_frame(0, 0, hello, 3, &[4]), ErrorCode::BadParam),
        ("an unknown op", raw_frame(0, 0, 0x0999, 3, &[]), ErrorCode::UnknownOp),
        ("an op other than HELLO", req(Request::Stats, 3), ErrorCode::NotAuthenticated),
        ("bad magic", b"GET / HTTP/1.1\r\n\r\n".to_vec(), ErrorCode::BadMagic),
    ];
    for (n, (what, bytes, code)) in cases.iter().enumerate() {
        let mut s = server(Limits::default());
        let c = ConnId(n as u64 + 1);
        s.open(c, 0);
        // The malformed frame, then a good HELLO: nothing after the bad one is served.
        let a = exchange(&mut s, c, &[&bytes[..], &good[..]].concat(), 0);
        assert_eq!(a.len(), 1, "{what}: one answer");
        assert!(matches!(&a[0].1, Ans::Err(e) if e.code == *code), "{what}");
        assert!(s.wants_close(c), "{what} closes the connection");
    }
}

/// HELLO bytes in, answer bytes out, on a fresh connection.
fn raw_hello(s: &mut Server<NoLeases, Counter>, c: ConnId, name: &str, key: &str) -> Vec<u8> {
    s.open(c, 0);
    s.input(c, &hello_v2(name, key, 9).0, 0);
    let mut out = vec![0u8; 4096];
    let n = s.output(c, &mut out);
    out[..n].to_vec()
}

#[test]
fn a_wrong_key_an_unknown_name_and_an_unknown_key_id_answer_alike() {
    let mut s = server(Limits::default());
    let wrong_key = raw_hello(&mut s, ConnId(1), "demo", ADMIN_KEY);
    assert_eq!(s.hello_macs(), 1);
    let unknown = raw_hello(&mut s, ConnId(2), "dem0", DEMO_KEY);
    assert_eq!(s.hello_macs(), 2, "an unknown name's message is checked too");
    let long = raw_hello(&mut s, ConnId(3), "a-name-of-the-longest-length-32b", DEMO_KEY);
    let other_id = raw_hello(&mut s, ConnId(4), "demo#1", DEMO_KEY);
    assert_eq!(s.hello_macs(), 4);
    assert_eq!(wrong_key, unknown);
    assert_eq!(wrong_key, long);
    assert_eq!(wrong_key, other_id);
    let Some((Ans::Err(e), 1)) = take_one(&wrong_key) else { panic!("not an error") };
    assert_eq!((e.code, e.message.as_str()), (ErrorCode::AuthFailed, "authentication failed"));
    for c in 1..=4 {
        assert!(s.wants_close(ConnId(c)));
    }
    s.open(ConnId(5), 0);
    login(&mut s, ConnId(5), "demo", DEMO_KEY).unwrap();
    assert_eq!(s.hello_macs(), 5, "a good HELLO is one check too");
}

#[test]
fn two_key_ids_are_valid_while_rotating() {
    const NEW: &str = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";
    let mut k = Keyring::new();
    k.add_tenant("demo", &alloc::format!("0/{DEMO_KEY},1/{NEW}")).unwrap();
    let mut s = Server::new(Limits::default(), k, NoLeases::default(), Counter(3), 0).unwrap();
    for (c, name, key, ok) in [
        (1, "demo", DEMO_KEY, true),
        (2, "demo#0", DEMO_KEY, true),
        (3, "demo#1", NEW, true),
        (4, "demo#1", DEMO_KEY, false),
        (5, "demo", NEW, false),
        (6, "demo#2", NEW, false),
    ] {
        s.open(ConnId(c), 0);
        let r = login(&mut s, ConnId(c), name, key);
        assert_eq!(r.is_ok(), ok, "{name}");
    }
    // Key lists: ids by position unless given; each id once.
    let mut k = Keyring::new();
    k.add_tenant("a", &alloc::format!("{DEMO_KEY},{NEW}")).unwrap();
    assert_eq!(k.len(), 2);
    assert_eq!(k.add_tenant("b", &alloc::format!("1/{DEMO_KEY},1/{NEW}")), Err(KeyError::BadKeyId));
    assert_eq!(k.add_tenant("c", &alloc::format!("256/{DEMO_KEY}")), Err(KeyError::BadKeyId));
    assert_eq!(k.add_tenant("a", NEW), Err(KeyError::Duplicate));
}

#[test]
fn a_relayed_handshake_gives_no_usable_session() {
    let mut s = server(Limits::default());
    // The client's HELLO goes to the server on A; an on-path relay copies it into its own connection B (before
    // or after A's): whichever comes second is a replay, refused as a wrong key is, before any costly work.
    let (hello, init) = hello_v2("demo", DEMO_KEY, 0x21);
    s.open(ConnId(1), 0);
    s.open(ConnId(2), 0);
    s.input(ConnId(1), &hello, 0);
    s.input(ConnId(2), &hello, 0);
    let (mut a_out, mut b_out) = (vec![0u8; 4096], vec![0u8; 4096]);
    let na = s.output(ConnId(1), &mut a_out);
    let nb = s.output(ConnId(2), &mut b_out);
    let msg2 = |b: &[u8]| match take_one_response(b) {
        Some(Response::Hello(HelloReply::Noise { msg2 })) => msg2,
        _ => panic!("no HELLO answer"),
    };
    assert!(matches!(take_one(&b_out[..nb]), Some((Ans::Err(e), 1)) if e.code == ErrorCode::AuthFailed));
    assert!(s.wants_close(ConnId(2)));
    assert_eq!(s.hellos_replayed(), 1);
    let (_, mut client) = init.finish(&msg2(&a_out[..na])).unwrap();
    // A (the real client) is served.
    let mut rec = Vec::new();
    client.seal(&heartbeat(5), &mut rec).unwrap();
    s.input(ConnId(1), &rec, 1);
    assert!(!s.wants_close(ConnId(1)));
    let mut out = vec![0u8; 4096];
    let n = s.output(ConnId(1), &mut out);
    client.push(&out[..n]);
    let plain = client.open().unwrap().unwrap();
    assert_eq!(take_one_response(&plain), Some(Response::Heartbeat { echo: 5, uptime_ms: 1 }));
    // A relay that gets a message 2 of its own (a HELLO the server has not seen, forwarded before the client's
    // own copy) still has no keys: the client's record copied onto it fails there.
    let (hello2, init2) = hello_v2("demo", DEMO_KEY, 0x23);
    s.open(ConnId(3), 2);
    s.input(ConnId(3), &hello2, 2);
    let n3 = s.output(ConnId(3), &mut out);
    let (_, mut c2) = init2.finish(&msg2(&out[..n3])).unwrap();
    let mut rec2 = Vec::new();
    c2.seal(&heartbeat(6), &mut rec2).unwrap();
    s.open(ConnId(4), 2);
    s.input(ConnId(4), &hello2, 2);
    assert!(s.wants_close(ConnId(4)), "the client's own copy is the replay now");
    s.input(ConnId(1), &rec2, 3);
    assert!(s.wants_close(ConnId(1)), "a record sealed for one handshake fails on another");
    assert_eq!(s.records_rejected(), 1);
    // The answer to one handshake does not complete another (a relay swapping answers).
    let (_, other) = hello_v2("demo", DEMO_KEY, 0x22);
    assert!(other.finish(&msg2(&a_out[..na])).is_err());
}

fn take_one_response(bytes: &[u8]) -> Option<Response> {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    let Next::Frame(h, p) = fb.next_frame() else { return None };
    Response::decode(Op::from_raw(h.op)?, &p).ok()
}

/// A logged-in session on connection 1 and two sealed HEARTBEAT records (ids 7 and 8), not yet sent.
fn session_and_two_records() -> (Server<NoLeases, Counter>, Vec<u8>, Vec<u8>) {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let r1 = seal(ConnId(1), &heartbeat(7));
    let r2 = seal(ConnId(1), &heartbeat(8));
    (s, r1, r2)
}

fn closes_on(s: &mut Server<NoLeases, Counter>, wire: &[u8], what: &str) {
    s.input(ConnId(1), wire, 1);
    assert!(s.wants_close(ConnId(1)), "{what} closes the session");
    assert_eq!(s.records_rejected(), 1, "{what}");
    assert!(!s.backend().lost.is_empty(), "{what}: the session is reported lost");
}

#[test]
fn a_flipped_bit_closes_the_session() {
    for bit in [16usize, 40 * 8, 8 * 8 + 3] {
        let (mut s, mut r1, _) = session_and_two_records();
        r1[bit / 8] ^= 1 << (bit % 8);
        closes_on(&mut s, &r1, "a flipped bit");
        let a = take(&mut s, ConnId(1));
        assert!(matches!(first_error(&a), Some((ErrorCode::Malformed, m)) if m.contains("authentication")));
    }
}

#[test]
fn a_replayed_record_closes_the_session() {
    let (mut s, r1, _) = session_and_two_records();
    s.input(ConnId(1), &r1, 1);
    assert!(!s.wants_close(ConnId(1)));
    assert_eq!(take(&mut s, ConnId(1)).len(), 1);
    closes_on(&mut s, &r1, "a replayed record");
}

#[test]
fn reordered_records_close_the_session() {
    let (mut s, r1, r2) = session_and_two_records();
    closes_on(&mut s, &[&r2[..], &r1[..]].concat(), "reordered records");
}

#[test]
fn a_truncated_record_closes_the_session() {
    // The first record cut short (its length field too), then the next one: the tag cannot verify.
    let (mut s, mut r1, r2) = session_and_two_records();
    r1.truncate(r1.len() - 4);
    let len = (r1.len() - 2) as u16;
    r1[..2].copy_from_slice(&len.to_be_bytes());
    closes_on(&mut s, &[&r1[..], &r2[..]].concat(), "a truncated record");
    // A record dropped altogether (the stream cut) is seen at the next one.
    let (mut s, _, r2) = session_and_two_records();
    closes_on(&mut s, &r2, "a dropped record");
    // An impossible length.
    let (mut s, _, _) = session_and_two_records();
    closes_on(&mut s, &[0, 3, 1, 2, 3], "a record shorter than a tag");
}

#[test]
fn records_split_anywhere_are_reassembled() {
    let (mut s, r1, r2) = session_and_two_records();
    let wire = [&r1[..], &r2[..]].concat();
    for chunk in wire.chunks(7) {
        s.input(ConnId(1), chunk, 1);
    }
    let a = take(&mut s, ConnId(1));
    assert_eq!(a.len(), 2);
    assert!(!s.wants_close(ConnId(1)));
}

#[test]
fn a_replayed_message_1_is_refused_before_any_costly_work() {
    // One place per tenant. Someone who once saw the tenant's HELLO sends it again on a connection of its own:
    // the server has seen that ephemeral key, so it answers AUTH_FAILED as to a wrong key, with no message 2
    // (no key generation, no DH), and the connection never holds more than a pre-authentication place.
    let mut s = budgeted(4, 1, 1, 4);
    let (hello, init) = hello_v2("demo", DEMO_KEY, 0x31);
    s.open(ConnId(1), 0);
    let a = exchange(&mut s, ConnId(1), &hello, 0);
    let Ans::Ok(Response::Hello(HelloReply::Noise { msg2 })) = &a[0].1 else { panic!("message 2") };
    assert!(init.finish(msg2).is_ok());
    s.closed(ConnId(1), 0);
    let macs = s.hello_macs();
    for c in 2..5 {
        s.open(ConnId(c), 1);
        let a = exchange(&mut s, ConnId(c), &hello, 1);
        assert!(matches!(&a[..], [(1, Ans::Err(e))] if e.code == ErrorCode::AuthFailed), "replay {c}");
        assert!(s.wants_close(ConnId(c)));
        s.closed(ConnId(c), 1);
    }
    assert_eq!((s.hellos_replayed(), s.hello_macs() - macs), (3, 3), "each replay costs one tag check");
    assert_eq!(s.admission().preauth(), 0);
    // The tenant itself still gets its one place.
    s.open(ConnId(9), 2);
    login(&mut s, ConnId(9), "demo", DEMO_KEY).unwrap();
    assert_eq!((s.admission().sessions(), s.admission().preauth()), (1, 0));
}

#[test]
fn over_its_cap_a_tenant_is_refused_at_key_confirmation() {
    let mut s = budgeted(4, 1, 1, 4);
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    s.open(ConnId(2), 0);
    let e = busy(login(&mut s, ConnId(2), "demo", DEMO_KEY));
    assert_eq!(e.detail, [1, 4, 0], "the cap, and which budget refused");
    assert!(s.wants_close(ConnId(2)));
    assert_eq!((s.admission().sessions(), s.admission().preauth()), (1, 0));
}
