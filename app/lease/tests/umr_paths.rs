//! The lease service's two paths against the device model (docs/revoke-semantics.md, "The UMR path"): with
//! the ConnectX-5 profile's UMR caps an ALLOC on a warm entry is granted by a UMR work request and a REVOKE
//! cut by one (the model's MKEY table says so), and the sweep returns the entry; with
//! `umr_modify_entity_size_disabled` (the model's `--umr-entity-size-disabled`) every lease takes the commands.

mod common;

use std::time::Duration;

use common::{Rig, TENANT, alloc_req, config, model};
use leasebox_lease::Config;
use leasebox_mlx5::engine::UmrCounters;
use leasebox_proto::{Outcome, Request, Response};
use mlx5_model::ModelConfig;

fn umr_rig(m: ModelConfig) -> Rig {
    let mut r = Rig::with_paths(m, Config { warm: 2, grace_ms: 10, ..config() }, 16 << 20, true);
    r.pump_until(Duration::from_secs(5), |r| r.svc.paths().warm == 2 || !r.svc.paths().grant_umr);
    r
}

fn counters(r: &Rig) -> UmrCounters {
    r.d.cmd.umr_counters().expect("the engine has a UMR QP")
}

#[test]
fn on_the_umr_path_a_grant_and_a_revoke_are_work_requests_and_the_entry_comes_back() {
    let mut r = umr_rig(model());
    assert_eq!(r.svc.paths().to_string(), "grant=umr revoke=umr warm=2");
    let lease_commands = |r: &Rig| r.svc.counters.commands - r.svc.counters.warm_commands;
    let cmds = lease_commands(&r);
    let a = r.alloc(TENANT, 3 << 20);
    assert_eq!(lease_commands(&r) - cmds, 2, "INIT2RTR and RTR2RTS (the pool's refill aside)");
    assert_eq!(r.svc.counters.umr_grants, 1);
    let m = r.platform().model().unwrap().mkey(a.rkey).expect("the model knows the granted rkey");
    assert_eq!(m.len, 3 << 20);
    r.ready(TENANT, &a);
    let before = counters(&r);
    let cmds = lease_commands(&r);
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::TornDown);
    assert_eq!(lease_commands(&r), cmds, "0 commands in the immediate phase");
    assert_eq!(counters(&r).ok, before.ok + 1, "one UMR revoke");
    assert_eq!(r.svc.counters.umr_revokes, 1);
    // The model no longer resolves the rkey the client holds: the key is free in the quarantine PD.
    assert!(r.platform().model().unwrap().mkey(a.rkey).is_none_or(|k| k.free), "the revoked key still reaches memory");
    r.settle();
    assert_eq!(r.svc.counters.warm_recycled, 1, "the sweep gave the entry back");
    // The recycled key is granted again under another variant.
    let b = r.alloc(TENANT, 1 << 20);
    assert_eq!(r.svc.counters.umr_grants, 2);
    assert_ne!(b.rkey, a.rkey);
    assert_eq!(r.revoke(TENANT, b.lease), Outcome::TornDown);
}

#[test]
fn entity_size_disabled_firmware_takes_the_commands_for_every_lease() {
    let m = ModelConfig { umr_entity_size_disabled: true, ..model() };
    let mut r = umr_rig(m);
    assert_eq!(r.svc.paths().to_string(), "grant=commands revoke=commands warm=0");
    let cmds = r.svc.counters.commands;
    let a = r.alloc(TENANT, 3 << 20);
    assert_eq!(r.svc.counters.commands - cmds, 6, "the six commands");
    r.ready(TENANT, &a);
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::TornDown);
    assert!(r.platform().model().unwrap().mkey(a.rkey).is_none(), "DESTROY_MKEY");
    assert_eq!((r.svc.counters.umr_grants, r.svc.counters.umr_revokes), (0, 0));
}

/// Requests of `TENANT` sent before any pump: their tickets, none answered at once.
fn send_all(r: &mut Rig, reqs: impl IntoIterator<Item = Request>) -> Vec<u64> {
    reqs.into_iter()
        .map(|req| match r.send(TENANT, &req) {
            (t, None) => t,
            (_, Some(now)) => panic!("{req:?} answered at once: {now:?}"),
        })
        .collect()
}

/// Eight grants in flight at once on the UMR QP (three-extent leases, so each grant WQE spans several basic
/// blocks), then eight revokes in flight at once, over enough rounds that the recycled entries and the UMR
/// send queue's indices wrap (`DEFAULT_LOG_SQ_BBS` blocks): every ALLOC is granted by a work request, every
/// REVOKE is cut by one, and each sweep gives its entry back.
#[test]
fn eight_grants_then_eight_revokes_in_flight_at_once_round_after_round() {
    const N: usize = 8;
    const ROUNDS: u64 = 12;
    let mut r = Rig::with_paths(model(), Config { warm: N as u32, grace_ms: 10, ..config() }, 64 << 20, true);
    assert!(r.pump_until(Duration::from_secs(5), |r| r.svc.paths().warm == N), "{}", r.svc.paths());
    for round in 0..ROUNDS {
        let before = counters(&r);
        let tickets = send_all(&mut r, (0..N).map(|_| Request::Alloc(alloc_req(3 << 20, 0x1234))));
        let mut grants = Vec::new();
        for t in tickets {
            match r.wait(t, Duration::from_secs(5)) {
                Ok(Response::Alloc(a)) => grants.push(a),
                other => panic!("round {round}: ALLOC: {other:?}"),
            }
        }
        assert_eq!(r.svc.counters.umr_grants, (round + 1) * N as u64, "round {round}: every ALLOC took a warm entry");
        for a in &grants {
            let m = r.platform().model().unwrap().mkey(a.rkey).expect("the model knows the granted rkey");
            assert_eq!((m.len, m.free), (3 << 20, false), "round {round}");
            r.ready(TENANT, a);
        }
        let tickets = send_all(&mut r, grants.iter().map(|a| Request::Revoke { lease: a.lease, qp_first: false }));
        for t in tickets {
            match r.wait(t, Duration::from_secs(5)) {
                Ok(Response::Revoke { outcome, .. }) => assert_eq!(outcome, Outcome::TornDown, "round {round}"),
                other => panic!("round {round}: REVOKE: {other:?}"),
            }
        }
        assert_eq!(r.svc.counters.umr_revokes, (round + 1) * N as u64, "round {round}");
        for a in &grants {
            assert!(r.platform().model().unwrap().mkey(a.rkey).is_none_or(|k| k.free), "round {round}");
        }
        assert_eq!(counters(&r).ok, before.ok + 2 * N as u64, "round {round}: 2 work requests per lease");
        r.settle();
        assert_eq!(r.svc.counters.warm_recycled, (round + 1) * N as u64, "round {round}");
    }
    assert_eq!(r.svc.counters.umr_revoke_failures, 0);
}
