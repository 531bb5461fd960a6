//! An HCA that dies with leases live fails closed (docs/revoke-semantics.md, "fail closed"): the hosted
//! appliance with the device model (`--hca`), leases Active and Granted and a REVOKE in flight, then a fatal
//! health syndrome injected into the model. The driver's health monitor sees it, every command fails from then
//! on, the link revokes every live lease, and each slot is fenced: the pending REVOKE answers Fenced (origin
//! REVOKE), the others are fenced by their expiry's immediate phase (origin EXPIRY), HEALTH says Fatal, and a
//! new ALLOC is refused instead of handing out memory the dead HCA may still serve.
//!
//! Real time: the model runs on its own thread and the driver's health watch polls every 2 s, so the test
//! waits (bounded) for outcomes rather than for durations.

use std::time::{Duration, Instant};

use leasebox_hosted::Hosted;
use leasebox_hosted::testing::Rig;
use leasebox_proto::{AllocReq, ErrorCode, FencedSlot, HcaState, LeaseId, Outcome, Request, Response, access};
use leasectl::{Client, ClientError, Timeouts};
use mlx5_model::fault::Fault;

/// Long enough for the health watch (2 s) and the revoke deadline (1 s) on a loaded machine.
const HANG: Duration = Duration::from_secs(30);
/// FENCED_SUMMARY origins (docs/revoke-semantics.md).
const ORIGIN_REVOKE: u8 = 1;
const ORIGIN_EXPIRY: u8 = 3;

mod common;
use common::creds;

fn alloc(qpn: u32) -> Request {
    let mut gid = [0u8; 16];
    gid[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 2]);
    Request::Alloc(AllocReq {
        size: 4096,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: qpn,
        client_psn: 0x100,
        client_gid: gid,
        client_mac: [0x02, 0, 0, 0, 0, 0x02],
    })
}

fn fenced(c: &mut Client) -> Vec<FencedSlot> {
    match c.call(&Request::FencedSummary { cursor: 0, max: 64 }).unwrap() {
        Response::FencedSummary { slots, .. } => slots,
        other => panic!("FENCED_SUMMARY answered {other:?}"),
    }
}

/// An unrecoverable hardware error as stock firmware reports it: health syndrome 0x8 with `rfr` 0 (Linux's fatal
/// sensor would not fire; the driver's does, docs/mlx5-driver.md "Health").
#[test]
fn a_fatal_hca_fences_every_live_lease_and_answers_the_pending_revoke() {
    fences_every_live_lease(|h| {
        h.hca()
            .unwrap()
            .platform
            .model()
            .expect("the in-process model")
            .inject(Fault::HealthFatal { synd: 0x8, rfr: false })
    });
}

/// The async EQ overruns (more PORT_CHANGE events than its entries while the model holds the doorbell back):
/// the firmware enters internal error with syndrome 0xc, and the leases fence as for any fatal HCA.
#[test]
fn an_async_eq_overrun_fences_every_live_lease() {
    fences_every_live_lease(|h| {
        let hca = h.hca().unwrap();
        {
            let mut m = hca.platform.model().expect("the in-process model");
            let ram = m.ram().clone();
            let entries: usize = m.hca().eqs.eqs.values().map(|q| 1usize << q.log_eq_size).max().unwrap();
            for i in 0..=entries {
                let s = if i % 2 == 0 { mlx5_model::port::PORT_DOWN } else { mlx5_model::port::PORT_UP };
                mlx5_model::port::set_oper(m.hca_mut(), ram.as_ref(), s);
            }
            assert!(m.hca().eqs.overrun());
        }
        // The model's next pass enters internal error; wait for it so that the REVOKE below meets a dead firmware.
        let end = Instant::now() + HANG;
        while hca.platform.model().unwrap().fatal() != Some(0xc) {
            assert!(Instant::now() < end, "the model did not enter internal error");
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

/// Three live leases and a REVOKE sent right after `kill` makes the HCA fatal: everything fences.
fn fences_every_live_lease(kill: impl FnOnce(&Hosted)) {
    let h = Rig::builder().hca().tenant("demo").admin().start().unwrap();
    let addr = h.addr().to_string();
    let t = Timeouts::all(Duration::from_secs(10));
    let mut demo = Client::connect_and_hello(&addr, &creds("demo", h.key("demo")), t).unwrap().0;
    let mut admin = Client::connect_and_hello(&addr, &creds("admin", h.admin_key()), t).unwrap().0;

    // Three leases: A and B Active, C Granted (no READY).
    let mut leases: Vec<(LeaseId, u32)> = Vec::new();
    for qpn in [0x11, 0x12, 0x13] {
        match demo.call(&alloc(qpn)).unwrap() {
            Response::Alloc(a) => leases.push((a.lease, a.server_qpn)),
            other => panic!("ALLOC answered {other:?}"),
        }
    }
    for &(lease, server_qpn) in &leases[..2] {
        let client_qpn = 0x11 + leases.iter().position(|l| l.0 == lease).unwrap() as u32;
        assert!(matches!(demo.call(&Request::Ready { lease, client_qpn, server_qpn }), Ok(Response::Ready { .. })));
    }
    assert!(fenced(&mut admin).is_empty());

    // The firmware dies; at once a REVOKE of A goes in. Its DESTROY_MKEY is never executed by a dead firmware.
    kill(h.hosted());
    let a = leases[0].0;
    let ticket = admin.send(&Request::Revoke { lease: a, qp_first: false }).unwrap();
    let end = Instant::now() + HANG;
    let outcome = loop {
        match admin.receive() {
            Ok(ans) if ans.header.request_id == ticket => match ans.body {
                Ok(Response::Revoke { outcome, .. }) => break outcome,
                other => panic!("the REVOKE answered {other:?}"),
            },
            Ok(ans) => panic!("unexpected answer {ans:?}"),
            Err(ClientError::Timeout { .. }) if Instant::now() < end => continue,
            Err(e) => panic!("waiting for the REVOKE's outcome: {e}"),
        }
    };
    assert_eq!(outcome, Outcome::Fenced, "a revoke the HCA cannot carry out fails closed");

    // Every lease is fenced, none freed: A by its REVOKE, B and C by the expiry the dead HCA forced.
    let slots = loop {
        let s = fenced(&mut admin);
        if s.len() == 3 || Instant::now() > end {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let origin = |lease: LeaseId| {
        slots
            .iter()
            .find(|s| s.slot == lease.slot && s.generation == lease.generation)
            .unwrap_or_else(|| panic!("lease {lease:?} not fenced: {slots:?}"))
            .origin
    };
    assert_eq!(origin(a), ORIGIN_REVOKE);
    assert_eq!(origin(leases[1].0), ORIGIN_EXPIRY);
    assert_eq!(origin(leases[2].0), ORIGIN_EXPIRY);
    assert!(slots.iter().all(|s| s.failed_mask != 0), "each fenced slot names what failed: {slots:?}");

    // HEALTH says so, and no new memory is lent by a dead HCA.
    match admin.call(&Request::Health).unwrap() {
        Response::Health(hh) => assert_eq!(hh.hca, HcaState::Fatal, "{hh:?}"),
        other => panic!("HEALTH answered {other:?}"),
    }
    match demo.call(&alloc(0x14)) {
        Err(ClientError::Server(e)) => assert!(
            matches!(e.code, ErrorCode::HcaError | ErrorCode::NoMemory | ErrorCode::Limit),
            "ALLOC after the HCA died: {e:?}"
        ),
        other => panic!("ALLOC after the HCA died answered {other:?}"),
    }
    h.stop();
}
