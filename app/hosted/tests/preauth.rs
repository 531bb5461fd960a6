//! Before authentication, over real TCP against the hosted appliance (docs/wire-protocol.md, "Bad frames" and
//! "Authentication"): a malformed frame gets its error and the connection is closed, and an unknown name is
//! refused with exactly the bytes a known name with a wrong MAC gets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasebox_hosted::{Hosted, HostedConfig};
use leasebox_proto::{ErrorBody, ErrorCode, FrameBuf, Hello, HelloInit, Kind, Next, Request};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn start() -> Hosted {
    let args: Vec<String> =
        ["--listen", "127.0.0.1:0", &format!("tenant=demo:{KEY}")].iter().map(|s| s.to_string()).collect();
    Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap()
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
fn one_frame(s: &mut TcpStream) -> Vec<u8> {
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

fn init(name: &str) -> Vec<u8> {
    let mut b = Vec::new();
    Request::Hello(Hello::Init(HelloInit { min_version: 1, max_version: 1, name: name.into(), client_nonce: [1; 16] }))
        .encode(1, &mut b);
    b
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
fn an_unknown_name_is_refused_as_a_wrong_mac_is() {
    let h = start();
    let mut answers = Vec::new();
    for name in ["demo", "nobody"] {
        let mut s = connect(&h);
        s.write_all(&init(name)).unwrap();
        let challenge = one_frame(&mut s);
        assert_eq!(challenge.len(), 16 + 35, "{name}: a challenge");
        let mut proof = Vec::new();
        Request::Hello(Hello::Proof { mac: [0x77; 32] }).encode(2, &mut proof);
        s.write_all(&proof).unwrap();
        answers.push(until_closed(&mut s));
    }
    assert_eq!(errors(&answers[0]), [ErrorCode::AuthFailed]);
    assert_eq!(answers[0], answers[1], "the same bytes for a wrong MAC and an unknown name");
    h.stop();
}
