//! The revoke contract on the UMR path (the default), end to end on the hosted appliance with the device model:
//! a lease granted from the warm pool whose UMR revoke the model fails, or never completes, falls back to
//! DESTROY_MKEY and answers TornDown well within the 1 s deadline; with DESTROY_MKEY failing too the slot is
//! Fenced, and its fence record names the failed step (docs/revoke-semantics.md, "The UMR path"). The command
//! path's twin of the last case is `lease_log.rs` (`lease_warm=0`).

use std::time::{Duration, Instant};

use leasebox_hosted::testing::Rig;
use leasebox_lease::lease::step_bit;
use leasebox_mlx5::ifc::mkey::MLX5_CMD_OP_DESTROY_MKEY as DESTROY_MKEY;
use leasebox_proto::{LeaseId, Outcome, Request, Response, SlotState, Transition, TransitionCause};
use leasectl::{Client, Timeouts};
use mlx5_model::fault::Fault;
use mlx5_model::umr::UmrCounters;

mod common;
use common::Principals;

/// The revoke contract's deadline for an outcome.
const DEADLINE: Duration = Duration::from_secs(1);

struct Warm {
    h: Rig,
    demo: Client,
    admin: Client,
}

/// The default appliance (no `lease_warm=`), once its lease service says both directions take UMR and the warm
/// pool has entries, so the next ALLOC is granted from it.
fn warm() -> Warm {
    let h = Rig::builder().hca().tenant("demo").tenant("other").admin().start().unwrap();
    let k = Principals::of(&h);
    let addr = h.addr().to_string();
    let t = Timeouts::all(Duration::from_secs(10));
    let demo = Client::connect_and_hello(&addr, &k.demo, t).unwrap().0;
    let admin = Client::connect_and_hello(&addr, &k.admin, t).unwrap().0;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let paths = h.hosted().with_leases(|b| b.svc.paths()).expect("the lease service on the model");
        assert!(paths.grant_umr && paths.revoke_umr, "the UMR path is the default: {paths}");
        if paths.warm > 0 {
            break;
        }
        assert!(Instant::now() < until, "no warm entry within 10 s: {paths}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Warm { h, demo, admin }
}

impl Warm {
    fn umr(&self) -> UmrCounters {
        self.h.hca().unwrap().platform.model().expect("the in-process model").hca().umr.counters
    }

    fn inject(&self, f: Fault) {
        self.h.hca().unwrap().platform.model().expect("the in-process model").inject(f);
    }

    /// An Active lease, granted by a UMR work request (the model ran one more without error).
    fn lease(&mut self) -> LeaseId {
        let before = self.umr();
        let l = common::lease(&mut self.demo);
        let after = self.umr();
        assert_eq!((after.completed, after.errors), (before.completed + 1, before.errors), "a UMR grant");
        l
    }

    /// The admin's REVOKE: its outcome and how long it took.
    fn revoke(&mut self, lease: LeaseId) -> (Outcome, Duration) {
        let t = Instant::now();
        match self.admin.call(&Request::Revoke { lease, qp_first: false }).unwrap() {
            Response::Revoke { outcome, .. } => (outcome, t.elapsed()),
            other => panic!("REVOKE answered {other:?}"),
        }
    }

    fn log(&mut self, cursor: u64) -> (u64, Vec<Transition>) {
        match self.admin.call(&Request::LeaseLog { cursor, max: 128 }).unwrap() {
            Response::LeaseLog { next_cursor, records, .. } => (next_cursor, records),
            other => panic!("LEASE_LOG answered {other:?}"),
        }
    }
}

#[test]
fn a_umr_revoke_the_model_fails_falls_back_to_destroy_mkey_and_tears_down_within_a_second() {
    let mut w = warm();
    let l = w.lease();
    let before = w.umr();
    w.inject(Fault::UmrFail { count: 1, syndrome: 0x4 });
    let (outcome, took) = w.revoke(l);
    assert_eq!(outcome, Outcome::TornDown, "DESTROY_MKEY after the failed UMR revoke");
    assert!(took < DEADLINE, "{took:?}");
    assert_eq!(w.umr().errors, before.errors + 1, "the revoke's work request failed in the model");
}

#[test]
fn a_umr_revoke_that_never_completes_falls_back_to_destroy_mkey_and_tears_down_within_a_second() {
    let mut w = warm();
    let l = w.lease();
    let before = w.umr();
    w.inject(Fault::UmrHang);
    let (outcome, took) = w.revoke(l);
    w.inject(Fault::Clear);
    assert_eq!(outcome, Outcome::TornDown, "the engine's UMR timeout, then DESTROY_MKEY");
    assert!(took < DEADLINE, "{took:?}");
    assert_eq!(w.umr().completed, before.completed, "no UMR completed the revoke");
}

#[test]
fn a_failed_umr_revoke_and_a_failed_destroy_mkey_fence_the_slot_with_the_failed_step() {
    let mut w = warm();
    let l = w.lease();
    let (cursor, _) = w.log(0);
    w.inject(Fault::UmrFail { count: 1, syndrome: 0x4 });
    w.inject(Fault::Fail { opcode: DESTROY_MKEY, count: 1, status: 0x3, syndrome: 0x1234 });
    let (outcome, took) = w.revoke(l);
    assert_eq!(outcome, Outcome::Fenced, "fail closed");
    assert!(took < DEADLINE, "{took:?}");
    let (_, since) = w.log(cursor);
    let mine: Vec<&Transition> = since.iter().filter(|r| r.slot == l.slot).collect();
    let steps: Vec<_> = mine.iter().map(|r| (r.from, r.to, r.why)).collect();
    assert_eq!(
        steps,
        [
            (SlotState::Active, SlotState::Fencing, TransitionCause::Revoke),
            (SlotState::Fencing, SlotState::Fenced, TransitionCause::TeardownFailed),
        ]
    );
    let fence = mine.last().unwrap();
    assert_eq!(fence.generation, l.generation);
    assert_eq!(fence.failed_mask & step_bit::DESTROY_MKEY, step_bit::DESTROY_MKEY, "{fence}");
}
