//! What the hosted appliance's integration tests share: fresh keys and credentials, and an appliance with the
//! device model (`--hca`) for tenants `demo` and `other` and the admin. Each test file includes this module and
//! uses what it needs.
#![allow(dead_code)]

use leasebox_hosted::{Hosted, HostedConfig};
use leasebox_proto::{AllocReq, LeaseId, LeaseState, Request, Response, access};
use leasectl::{Client, Credentials};

/// A fresh random 32-byte key in hex.
pub fn random_hex() -> String {
    leasectl::hex::random_key(32).expect("a random key")
}

/// `name` with the key `hex`.
pub fn creds(name: &str, hex: &str) -> Credentials {
    Credentials { name: name.into(), key: leasectl::hex::decode(hex).unwrap() }
}

/// The keys of [`start_with_model`]'s principals, in hex.
pub struct Keys {
    pub demo: String,
    pub other: String,
    pub admin: String,
}

/// A hosted appliance with the model and its RoCEv2 responder on UDP (`--hca --udp`), tenants `demo` and
/// `other` and the admin, each with a fresh key, plus the options in `extra`.
pub fn start_with_model(extra: &[String]) -> (Hosted, Keys) {
    let keys = Keys { demo: random_hex(), other: random_hex(), admin: random_hex() };
    let mut args: Vec<String> =
        ["--listen", "127.0.0.1:0", "--hca", "--udp", "127.0.0.1:0"].iter().map(|s| s.to_string()).collect();
    args.push(format!("tenant=demo:{}", keys.demo));
    args.push(format!("tenant=other:{}", keys.other));
    args.push(format!("admin={}", keys.admin));
    args.extend(extra.iter().cloned());
    (Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap(), keys)
}

/// ALLOC (client QP 0x1234) and READY on `c`: an Active lease of 4 KiB.
pub fn lease(c: &mut Client) -> LeaseId {
    let a = AllocReq {
        size: 4096,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x1234,
        client_psn: 1,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        client_mac: [2, 0, 0, 0, 0, 2],
    };
    let Response::Alloc(a) = c.call(&Request::Alloc(a)).unwrap() else { panic!("ALLOC") };
    let ready = Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn };
    assert_eq!(c.call(&ready).unwrap(), Response::Ready { state: LeaseState::Active });
    a.lease
}
