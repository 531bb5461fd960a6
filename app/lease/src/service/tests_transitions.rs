//! The transition ring as the service writes it: every state change of a slot, with its cause.

use super::*;
use crate::transitions::{State, Transition, Why};

/// Every record held for `slot`, as (from, to, why, failed mask).
fn history(r: &Rig, slot: u32) -> Vec<(State, State, Why, u32)> {
    let ring = r.svc.transitions();
    let t = ring.lock();
    t.of_slot(slot).map(|t: &Transition| (t.from, t.to, t.why, t.failed_mask)).collect()
}

#[test]
fn a_lease_life_is_recorded_from_alloc_to_free_with_its_generation_and_times() {
    let mut r = Rig::new(cfg());
    let start = r.now_us;
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    r.sweep();
    use State::*;
    assert_eq!(
        history(&r, lease.slot),
        [
            (Free, Building, Why::Alloc, 0),
            (Building, Granted, Why::Granted, 0),
            (Granted, Active, Why::Confirm, 0),
            (Active, Fencing, Why::Revoke, 0),
            (Fencing, PendingDestroy, Why::TeardownOk, 0),
            (PendingDestroy, Sweeping, Why::SweepStart, 0),
            (Sweeping, Free, Why::SweepDone, 0),
        ]
    );
    let ring = r.svc.transitions();
    let t = ring.lock();
    assert!(t.of_slot(lease.slot).all(|t| t.generation == lease.generation));
    let times: Vec<u64> = t.of_slot(lease.slot).map(|t| t.at_us).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]) && times[0] == start, "{times:?}");
    assert!(*times.last().unwrap() >= start + r.svc.config().grace_ms * 1000, "the sweep came after the grace");
}

#[test]
fn a_fenced_slot_shows_the_failing_teardown_step_as_the_cause() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, false), Outcome::Fenced);
    let h = history(&r, lease.slot);
    assert_eq!(h.last(), Some(&(State::Fencing, State::Fenced, Why::TeardownFailed, step_bit::DESTROY_MKEY)));
    assert_eq!(h[h.len() - 2].2, Why::Revoke, "what started the teardown");

    // The HCA not answering is told apart from a refusal.
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Hang]);
    let _ = r.send(ADMIN, &Request::Revoke { lease, qp_first: false });
    r.advance(r.svc.config().revoke_deadline_ms * 1000);
    let h = history(&r, lease.slot);
    assert_eq!(h.last(), Some(&(State::Fencing, State::Fenced, Why::Deadline, step_bit::DEADLINE)));
}

#[test]
fn a_failed_sweep_and_a_failed_unwind_fence_with_their_own_causes() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    r.script(DESTROY_QP, &[Answer::Fail]);
    r.sweep();
    let h = history(&r, lease.slot);
    assert_eq!(h.last(), Some(&(State::Sweeping, State::Fenced, Why::SweepFailed, step_bit::DESTROY_QP)));

    let mut r = Rig::new(cfg());
    r.script(INIT2RTR, &[Answer::Fail]);
    r.script(DESTROY_QP, &[Answer::Fail]);
    assert!(r.call(TENANT, &Request::Alloc(alloc_req())).is_err());
    let h = history(&r, 0);
    assert_eq!(h[1], (State::Building, State::Unwinding, Why::BuildFailed, 0));
    assert_eq!(h[2], (State::Unwinding, State::Fenced, Why::UnwindFailed, step_bit::DESTROY_QP | step_bit::UNWIND));
}

#[test]
fn a_lost_session_and_a_ttl_are_told_apart() {
    let mut r = Rig::new(Config { session_grace_ms: 10, ..cfg() });
    let lease = r.active();
    r.svc.session_lost(TENANT.session, r.now_us);
    r.advance(20_000);
    assert!(history(&r, lease.slot).contains(&(State::Active, State::Fencing, Why::SessionLost, 0)));

    let mut r = Rig::new(cfg());
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(AllocReq { ttl_ms: 5, ..alloc_req() })) else {
        panic!("ALLOC")
    };
    let _ = r.call(TENANT, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn });
    r.advance(10_000);
    assert!(history(&r, a.lease.slot).contains(&(State::Active, State::Fencing, Why::Expiry, 0)));
}
