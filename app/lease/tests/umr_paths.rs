//! The lease service's two paths against the device model (docs/revoke-semantics.md, "The UMR path"): with
//! the ConnectX-5 profile's UMR caps an ALLOC on a warm entry is granted by a UMR work request and a REVOKE
//! cut by one (the model's MKEY table says so), and the sweep returns the entry; with
//! `umr_modify_entity_size_disabled` (the model's `--umr-entity-size-disabled`) every lease takes the commands.

mod common;

use std::time::Duration;

use common::{Rig, TENANT, config, model};
use leasebox_lease::Config;
use leasebox_mlx5::engine::UmrCounters;
use leasebox_proto::Outcome;
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
