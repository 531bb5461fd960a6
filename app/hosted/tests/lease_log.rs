//! "Why was this slot fenced", answered after the fact: the hosted appliance with the device model, a lease
//! Active, DESTROY_MKEY made to fail in the model, a REVOKE that therefore fences the slot, then LEASE_LOG
//! through leasectl's client: the slot's history runs from ALLOC to the fence, and the fence's record names
//! the teardown step that failed. A tenant may not read the log.

use leasebox_lease::lease::step_bit;
use std::time::Duration;

use leasebox_hosted::testing::Rig;
use leasebox_mlx5::ifc::mkey::MLX5_CMD_OP_DESTROY_MKEY as DESTROY_MKEY;
use leasebox_proto::{AllocReq, ErrorCode, Outcome, Request, Response, SlotState, Transition, TransitionCause, access};
use leasectl::{Client, ClientError, Timeouts};
use mlx5_model::fault::Fault;

mod common;
use common::Principals;

fn log(c: &mut Client, cursor: u64) -> (u64, Vec<Transition>) {
    match c.call(&Request::LeaseLog { cursor, max: 128 }).unwrap() {
        Response::LeaseLog { next_cursor, lost, records } => {
            assert_eq!(lost, 0, "a fresh appliance's ring has not wrapped");
            (next_cursor, records)
        }
        other => panic!("LEASE_LOG answered {other:?}"),
    }
}

#[test]
fn a_revoke_whose_teardown_fails_leaves_the_failing_step_in_the_slots_history() {
    // The command path (`lease_warm=0`): the fault is in DESTROY_MKEY, which is the immediate phase only there
    // (on the UMR path it is the fallback; `umr_revoke.rs` fails both).
    let h = Rig::builder().hca().option("lease_warm", 0).tenant("demo").tenant("other").admin().start().unwrap();
    let k = Principals::of(&h);
    let addr = h.addr().to_string();
    let t = Timeouts::all(Duration::from_secs(10));
    let mut demo = Client::connect_and_hello(&addr, &k.demo, t).unwrap().0;
    let mut admin = Client::connect_and_hello(&addr, &k.admin, t).unwrap().0;

    let mut gid = [0u8; 16];
    gid[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 2]);
    let req = AllocReq {
        size: 4096,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x11,
        client_psn: 0x100,
        client_gid: gid,
        client_mac: [0x02, 0, 0, 0, 0, 0x02],
    };
    let Response::Alloc(a) = demo.call(&Request::Alloc(req)).unwrap() else { panic!("ALLOC") };
    let ready = Request::Ready { lease: a.lease, client_qpn: 0x11, server_qpn: a.server_qpn };
    assert!(matches!(demo.call(&ready), Ok(Response::Ready { .. })));

    // A tenant may not read every tenant's slots.
    match demo.call(&Request::LeaseLog { cursor: 0, max: 8 }) {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Forbidden),
        other => panic!("a tenant's LEASE_LOG answered {other:?}"),
    }

    let (cursor, before) = log(&mut admin, 0);
    assert!(!before.is_empty() && before.iter().all(|r| r.slot == a.lease.slot));
    assert_eq!(cursor, before.last().unwrap().seq + 1);

    h.hca().unwrap().platform.model().expect("the in-process model").inject(Fault::Fail {
        opcode: DESTROY_MKEY,
        count: 1,
        status: 0x3, // BAD_PARAM
        syndrome: 0x1234,
    });
    match admin.call(&Request::Revoke { lease: a.lease, qp_first: false }).unwrap() {
        Response::Revoke { outcome, .. } => assert_eq!(outcome, Outcome::Fenced),
        other => panic!("REVOKE answered {other:?}"),
    }

    // Read on from the cursor: only what happened since, ending in the fence with its cause.
    let (_, since) = log(&mut admin, cursor);
    let mine: Vec<(SlotState, SlotState, TransitionCause)> =
        since.iter().filter(|r| r.slot == a.lease.slot).map(|r| (r.from, r.to, r.why)).collect();
    assert_eq!(
        mine,
        [
            (SlotState::Active, SlotState::Fencing, TransitionCause::Revoke),
            (SlotState::Fencing, SlotState::Fenced, TransitionCause::TeardownFailed),
        ]
    );
    let fence = since.last().unwrap();
    assert_eq!(fence.generation, a.lease.generation);
    assert_eq!(fence.failed_mask & step_bit::DESTROY_MKEY, step_bit::DESTROY_MKEY, "{fence}");
    assert!(fence.to_string().contains("fencing -> fenced (teardown-failed) failed 0x001"), "{fence}");
}
