//! Before authentication, over real TCP against the hosted appliance (docs/wire-protocol.md, "Bad frames" and
//! "Protocol v2: handshake"): a malformed frame gets its error and the connection is closed, an unknown name is
//! refused with exactly the bytes a known name with a wrong key gets, and a v1 HELLO is refused naming v2.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasebox_hosted::Hosted;
use leasebox_hosted::testing::{Key, Rig};
use leasebox_proto::{ErrorBody, ErrorCode, FrameBuf, Hello, HelloInit, HelloNoise, Kind, Next, Request, v2};

fn start() -> Rig {
    Rig::builder().tenant("demo").start().unwrap()
}

fn connect(h: &Hosted) -> TcpStream {
    let s = TcpStream::connect(h.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Everything the server sends until it closes the connection.
fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut v = Vec::new();
    s.read_to_end(&mut v).expect("the server closes the connection (no read timeout)");
    v
}

/// Reads exactly one frame.
fn one_frame(s: &mut impl Read) -> Vec<u8> {
    let mut h = [0u8; leasebox_proto::HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let len = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).unwrap();
    [&h[..], &p].concat()
}

fn errors(bytes: &[u8]) -> Vec<ErrorCode> {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    let mut v = Vec::new();
    while let Next::Frame(h, p) = fb.next_frame() {
        assert_eq!(h.kind, Kind::Error);
        v.push(ErrorBody::decode(&p).unwrap().code);
    }
    v
}

/// A v2 HELLO for `name` made with `key`.
fn init_with(name: &str, key: &[u8]) -> Vec<u8> {
    let (_, msg1) = v2::Initiator::start(&v2::prologue(2, 2, 0, name), &v2::psk_from_key(key), [9; 32]);
    let mut b = Vec::new();
    Request::Hello(Hello::Noise(HelloNoise { min_version: 2, max_version: 2, key_id: 0, name: name.into(), msg1 }))
        .encode(1, &mut b);
    b
}

fn init(name: &str) -> Vec<u8> {
    init_with(name, &[0x77; 32])
}

#[test]
fn a_malformed_frame_before_hello_closes_the_connection() {
    let h = start();
    let hello = init("demo");
    // An unknown frame kind, then reserved header bytes set: each gets MALFORMED and the connection closes,
    // even though a good HELLO follows in the same segment.
    for patch in [(3usize, 7u8), (7, 1)] {
        let mut bad = hello.clone();
        bad[patch.0] = patch.1;
        let mut s = connect(&h);
        s.write_all(&[&bad[..], &hello].concat()).unwrap();
        assert_eq!(errors(&until_closed(&mut s)), [ErrorCode::Malformed], "byte {} = {}", patch.0, patch.1);
    }
    h.stop();
}

#[test]
fn an_unknown_name_is_refused_as_a_wrong_key_is() {
    let h = start();
    let mut answers = Vec::new();
    for name in ["demo", "nobody"] {
        let mut s = connect(&h);
        s.write_all(&init(name)).unwrap();
        answers.push(until_closed(&mut s));
    }
    assert_eq!(errors(&answers[0]), [ErrorCode::AuthFailed]);
    assert_eq!(answers[0], answers[1], "the same bytes for a wrong key and an unknown name");
    h.stop();
}

#[test]
fn a_v1_hello_is_refused_naming_v2() {
    let h = start();
    let mut s = connect(&h);
    let mut b = Vec::new();
    Request::Hello(Hello::Init(HelloInit {
        min_version: 1,
        max_version: 1,
        name: "demo".into(),
        client_nonce: [1; 16],
    }))
    .encode(1, &mut b);
    s.write_all(&b).unwrap();
    let answer = until_closed(&mut s);
    let f = one_frame(&mut &answer[..]);
    let e = ErrorBody::decode(&f[leasebox_proto::HEADER_LEN..]).unwrap();
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);
    assert_eq!(e.message, "protocol v1 is not served: use v2 (docs/wire-protocol.md)");
    h.stop();
}

/// Over TCP: after HELLO, an altered record and a replayed record each end the session.
#[test]
fn an_altered_or_replayed_record_ends_the_session() {
    use leasectl::{Client, ClientError, Credentials, Timeouts};
    let h = start();
    let who = Credentials { name: "demo".into(), key: h.key("demo").bytes().to_vec() };
    let addr = h.addr().to_string();
    let mut hb = Vec::new();
    Request::Heartbeat { echo: 5 }.encode(50, &mut hb);
    // A flipped bit.
    let (mut c, _) = Client::connect_and_hello(&addr, &who, Timeouts::default()).unwrap();
    let mut rec = c.seal(&hb).unwrap();
    rec[10] ^= 0x04;
    c.send_wire(&rec).unwrap();
    match c.receive() {
        Ok(a) => assert!(matches!(&a.body, Err(e) if e.code == ErrorCode::Malformed), "{a:?}"),
        Err(e) => assert!(matches!(e, ClientError::Io(_)), "{e:?}"),
    }
    assert!(c.call(&Request::Heartbeat { echo: 6 }).is_err(), "the session is gone");
    // A replayed record: served once, then the session ends.
    let (mut c, _) = Client::connect_and_hello(&addr, &who, Timeouts::default()).unwrap();
    let rec = c.seal(&hb).unwrap();
    c.send_wire(&rec).unwrap();
    assert!(c.receive().unwrap().body.is_ok());
    c.send_wire(&rec).unwrap();
    match c.receive() {
        Ok(a) => assert!(matches!(&a.body, Err(e) if e.code == ErrorCode::Malformed), "{a:?}"),
        Err(e) => assert!(matches!(e, ClientError::Io(_)), "{e:?}"),
    }
    assert!(c.call(&Request::Heartbeat { echo: 7 }).is_err(), "the session is gone");
    h.stop();
}

/// Key rotation end to end: the hosted appliance with two keys for `demo`, leasectl naming the key id.
#[test]
fn leasectl_names_the_key_id_while_a_key_rotates() {
    use leasectl::{Client, ClientError, Credentials, Timeouts};
    // The new key is a short one (16 bytes): any length the key grammar takes works.
    let (old, new) = (Key::random(), Key::from_bytes((0xf0..=0xffu8).collect::<Vec<u8>>()));
    let h = Rig::builder().tenant_keys("demo", &[(0, old.clone()), (1, new.clone())]).start().unwrap();
    let addr = h.addr().to_string();
    let who = |name: &str, key: &Key| Credentials { name: name.into(), key: key.bytes().to_vec() };
    for (name, key) in [("demo", &old), ("demo#0", &old), ("demo#1", &new)] {
        let (mut c, _) = Client::connect_and_hello(&addr, &who(name, key), Timeouts::default()).unwrap();
        assert!(c.call(&Request::Heartbeat { echo: 1 }).is_ok(), "{name}");
    }
    for (name, key) in [("demo#1", &old), ("demo", &new), ("demo#2", &new)] {
        let e = Client::connect_and_hello(&addr, &who(name, key), Timeouts::default()).unwrap_err();
        assert!(matches!(&e, ClientError::Server(b) if b.code == ErrorCode::AuthFailed), "{name}: {e:?}");
    }
    h.stop();
}

/// Over TCP (docs/security.md, "Appliance identity"): two appliances share a tenant key; a client naming
/// `demo@lb-a` gets in on lb-a and is refused AUTH_FAILED on lb-b, a client naming no appliance is refused by
/// a named one, and an appliance with no name serves it as before.
#[test]
fn a_hello_for_one_appliance_fails_on_another() {
    use leasectl::{Client, ClientError, Credentials, Timeouts};
    let key = Key::random();
    let named = |name: &str| Rig::builder().tenant_with_key("demo", key.clone()).appliance(name).start().unwrap();
    let plain = Rig::builder().tenant_with_key("demo", key.clone()).start().unwrap();
    let (a, b) = (named("lb-a"), named("lb-b"));
    let login = |h: &Hosted, name: &str| {
        let who = Credentials { name: name.into(), key: key.bytes().to_vec() };
        Client::connect_and_hello(&h.addr().to_string(), &who, Timeouts::all(Duration::from_secs(10)))
    };
    let auth_failed = |r: Result<(Client, leasectl::Welcome), ClientError>| matches!(r, Err(ClientError::Server(e)) if e.code == ErrorCode::AuthFailed);
    assert!(login(&a, "demo@lb-a").is_ok());
    assert!(auth_failed(login(&b, "demo@lb-a")), "lb-b completes no HELLO meant for lb-a");
    assert!(auth_failed(login(&a, "demo")), "a named appliance wants its name");
    assert!(login(&plain, "demo").is_ok(), "an appliance without a name works as before");
    assert!(auth_failed(login(&plain, "demo@lb-a")));
    for h in [a, b, plain] {
        h.stop();
    }
}
