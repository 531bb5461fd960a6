//! The frame and version 1 HELLO worked examples of docs/wire-protocol.md, byte for byte (v2's handshake and
//! records: app/session/src/tests/wire_v2.rs) (the MACs were computed independently with
//! `openssl dgst -sha256 -mac HMAC`).

use hmac::{Hmac, Mac};
use leasebox_proto::{
    ErrorBody, ErrorCode, Hello, HelloInit, HelloReply, LeaseId, Notice, Op, Outcome, Request, Response,
    hello_transcript,
};

fn hex(s: &str) -> Vec<u8> {
    leasectl::hex::decode(&s.split_whitespace().collect::<String>()).unwrap()
}

fn mac(key: &[u8], t: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).unwrap();
    m.update(t);
    m.finalize().into_bytes().to_vec()
}

const CLIENT_NONCE: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn server_nonce() -> [u8; 32] {
    core::array::from_fn(|i| 0x20 + i as u8)
}

#[test]
fn hello_init_and_challenge() {
    let mut b = Vec::new();
    let init = HelloInit { min_version: 1, max_version: 1, name: "demo".into(), client_nonce: CLIENT_NONCE };
    Request::Hello(Hello::Init(init)).encode(1, &mut b);
    assert_eq!(
        b,
        hex("4c 42 01 00 01 01 00 00 00 00 00 01 00 00 00 1a 01 00 01 00 01 04 64 65 6d 6f
             00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f")
    );
    let mut b = Vec::new();
    Response::Hello(HelloReply::Challenge { version: 1, server_nonce: server_nonce() }).encode(Op::Hello, 1, &mut b);
    let mut want = hex("4c 42 01 01 01 01 00 00 00 00 00 01 00 00 00 23 01 00 01");
    want.extend(server_nonce());
    assert_eq!(b, want);
}

#[test]
fn hello_macs() {
    let key: Vec<u8> = (0u8..32).collect();
    let t = hello_transcript(true, 1, "demo", &CLIENT_NONCE, &server_nonce());
    assert_eq!(t.len(), 72);
    assert_eq!(&t[..24], b"leasebox/1 client\x00\x01\x04demo");
    assert_eq!(mac(&key, &t), hex("00636d12adc42b943cd3ab9f060cd9df0a0dc88a3debf87e54cbd7e06e39d370"));
    let t = hello_transcript(false, 1, "demo", &CLIENT_NONCE, &server_nonce());
    assert_eq!(&t[..24], b"leasebox/1 server\x00\x01\x04demo");
    assert_eq!(&t[24..56], server_nonce());
    assert_eq!(mac(&key, &t), hex("e7ddcabfe5d9e62e7e024c50798449bd79f7af57111a3927d7d993d0f56f144a"));
}

#[test]
fn heartbeat_and_credit_exceeded() {
    let mut b = Vec::new();
    Request::Heartbeat { echo: 0x0102_0304_0506_0708 }.encode(2, &mut b);
    assert_eq!(b, hex("4c 42 01 00 01 02 00 00 00 00 00 02 00 00 00 08 01 02 03 04 05 06 07 08"));
    let mut b = Vec::new();
    Response::Heartbeat { echo: 0x0102_0304_0506_0708, uptime_ms: 12345 }.encode(Op::Heartbeat, 2, &mut b);
    assert_eq!(
        b,
        hex("4c 42 01 01 01 02 00 00 00 00 00 02 00 00 00 10 01 02 03 04 05 06 07 08 00 00 00 00 00 00 30 39")
    );
    let mut b = Vec::new();
    ErrorBody::new(ErrorCode::CreditExceeded, "more than 8 requests outstanding")
        .with_detail([8, 0, 0])
        .encode(0x0102, 9, &mut b);
    let mut want = hex("4c 42 01 02 01 02 00 00 00 00 00 09 00 00 00 30 00 08 00 20
                        00 00 00 08 00 00 00 00 00 00 00 00");
    want.extend(b"more than 8 requests outstanding");
    assert_eq!(b, want);
}

/// The boot id of the v2 worked example: `b0 b1 … bf`.
fn boot() -> [u8; 16] {
    core::array::from_fn(|i| 0xb0 + i as u8)
}

#[test]
fn a_lease_id_carries_its_boot() {
    let mut b = Vec::new();
    Request::Free { lease: LeaseId { boot_id: boot(), slot: 3, generation: 17 } }.encode(4, &mut b);
    assert_eq!(
        b,
        hex("4c 42 01 00 02 04 00 00 00 00 00 04 00 00 00 18
             b0 b1 b2 b3 b4 b5 b6 b7 b8 b9 ba bb bc bd be bf
             00 00 00 03 00 00 00 11")
    );
}

#[test]
fn notices_and_drain() {
    let mut b = Vec::new();
    let lease = LeaseId { boot_id: boot(), slot: 3, generation: 17 };
    Notice::Revoked { lease, outcome: Outcome::Fenced }.encode(&mut b);
    assert_eq!(
        b,
        hex("4c 42 01 03 01 04 00 00 00 00 00 00 00 00 00 20
             01 01 00 00 00 00 00 00
             b0 b1 b2 b3 b4 b5 b6 b7 b8 b9 ba bb bc bd be bf
             00 00 00 03 00 00 00 11")
    );
    let mut b = Vec::new();
    Request::Drain { tenant: "demo".into(), notice_ms: 5000 }.encode(5, &mut b);
    assert_eq!(b, hex("4c 42 01 00 02 0b 00 00 00 00 00 05 00 00 00 0c 00 00 13 88 04 00 00 00 64 65 6d 6f"));
    let mut b = Vec::new();
    Notice::Draining { in_ms: 5000 }.encode(&mut b);
    let mut want = hex("4c 42 01 03 01 04 00 00 00 00 00 00 00 00 00 20 04 00 00 00 00 00 13 88");
    want.extend([0; 24]);
    assert_eq!(b, want);
}
