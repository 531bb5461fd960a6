//! What the hosted appliance's integration tests share: the shipped rig ([`leasebox_hosted::testing`]) set up
//! with the device model for tenants `demo` and `other` and the admin, credentials from its keys, and a lease.
//! Each test file includes this module and uses what it needs.
#![allow(dead_code)]

use leasebox_hosted::testing::{Builder, Key, Rig};
use leasebox_proto::{AllocReq, LeaseId, LeaseState, Request, Response, access};
use leasectl::{Client, Credentials};

/// `name` with `key`.
pub fn creds(name: &str, key: &Key) -> Credentials {
    Credentials { name: name.into(), key: key.bytes().to_vec() }
}

/// A hosted appliance with the model and its RoCEv2 responder on UDP, tenants `demo` and `other` and the
/// admin, each with a fresh key; the test adds its options before `start()`.
pub fn with_model() -> Builder {
    Rig::builder().model().tenant("demo").tenant("other").admin()
}

/// The credentials of [`with_model`]'s principals.
pub struct Principals {
    pub demo: Credentials,
    pub other: Credentials,
    pub admin: Credentials,
}

impl Principals {
    pub fn of(rig: &Rig) -> Principals {
        Principals {
            demo: creds("demo", rig.key("demo")),
            other: creds("other", rig.key("other")),
            admin: creds("admin", rig.admin_key()),
        }
    }
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
