//! The lease service on the native driver and the in-process model: the life cycle, revocation's outcomes,
//! fencing with its mask and origin for every teardown command that can fail, a hung HCA, page requests
//! during ALLOC bursts, isolation, sessions, FENCE-TEST, and 10,000 leases with nothing leaked.

mod common;

use std::time::Duration;

use common::{ADMIN, OTHER, Rig, TENANT, alloc_req};
use leasebox_lease::Config;
use leasebox_lease::RevokeOrder;
use leasebox_lease::lease::{origin, step_bit};
use leasebox_mlx5::ifc::opcode::{
    MLX5_CMD_OP_2ERR_QP as QP_2ERR, MLX5_CMD_OP_2RST_QP as QP_2RST, MLX5_CMD_OP_CREATE_MKEY as CREATE_MKEY,
    MLX5_CMD_OP_DESTROY_MKEY as DESTROY_MKEY, MLX5_CMD_OP_DESTROY_QP as DESTROY_QP,
    MLX5_CMD_OP_INIT2RTR_QP as INIT2RTR,
};
use leasebox_proto::{ErrorCode, LeaseId, LeaseState, Outcome, Request, Response};
use mlx5_model::events::PageRequest;
use mlx5_model::fault::Fault;

fn fail(rig: &Rig, opcode: u16) {
    rig.platform().model().unwrap().inject(Fault::Fail { opcode, count: 1, status: 0x03, syndrome: 0x7e57 });
}

#[test]
fn alloc_ready_revoke_sweep_and_scrub() {
    let mut r = Rig::new();
    let a = r.alloc(TENANT, 3 << 20);
    assert_eq!((a.lease.slot, a.lease.generation), (0, 1));
    assert_eq!(a.length, 3 << 20);
    assert_eq!(a.mtu, 3, "min(client 1024, port)");
    assert_ne!(a.rkey, 0);
    // The HCA holds what the reply says: the model's MKEY table has the key over the lease's memory.
    let m = r.platform().model().unwrap().mkey(a.rkey).expect("the model knows the rkey");
    assert_eq!(m.len, 3 << 20);
    let Ok(Response::Query(q)) = r.call(TENANT, &Request::Query { lease: a.lease }) else { panic!() };
    assert_eq!(q.state, LeaseState::Granted);
    r.ready(TENANT, &a);
    let Ok(Response::Query(q)) = r.call(TENANT, &Request::Query { lease: a.lease }) else { panic!() };
    assert_eq!(
        (q.state, q.server_qpn, q.client_qpn, q.tenant.as_str()),
        (LeaseState::Active, a.server_qpn, 0x1234, "alpha")
    );
    // The client writes into its memory (as RDMA would): it must be scrubbed before reuse.
    r.ram().write(a.remote_addr + 100, b"secret").unwrap();
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::TornDown);
    assert!(r.platform().model().unwrap().mkey(a.rkey).is_none(), "the key is gone at once");
    // The QP is left in RTS until the sweep (MKEY first).
    let Ok(Response::Query(q)) = r.call(TENANT, &Request::Query { lease: a.lease }) else { panic!() };
    assert_eq!(q.state, LeaseState::PendingDestroy);
    // Idempotent for the same generation.
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::TornDown);
    r.settle();
    let mut b = [0u8; 6];
    r.ram().read(a.remote_addr + 100, &mut b).unwrap();
    assert_eq!(&b, &[0; 6], "scrubbed");
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::NotFound, "swept: the old id is gone");
    let again = r.alloc(TENANT, 1 << 20);
    assert_eq!(again.lease.slot, 0);
    assert_eq!(again.lease.generation, 2, "a new generation for the reused slot");
    assert!(matches!(r.call(TENANT, &Request::Query { lease: a.lease }), Err(e) if e.code == ErrorCode::Stale));
}

#[test]
fn alloc_errors_name_the_field_or_the_limit() {
    let mut r = Rig::configured(Config { tenant_leases: 2, ..common::config() });
    let bad = |f: &dyn Fn(&mut leasebox_proto::AllocReq)| {
        let mut a = alloc_req(4096, 7);
        f(&mut a);
        Request::Alloc(a)
    };
    for (req, field) in [
        (bad(&|a| a.size = 0), "alloc.size"),
        (bad(&|a| a.access = 0), "alloc.access"),
        (bad(&|a| a.access = 0x80), "alloc.access"),
        (bad(&|a| a.mtu = 6), "alloc.mtu"),
        (bad(&|a| a.client_qpn = 0x100_0000), "alloc.client_qpn"),
        (bad(&|a| a.client_psn = 0x100_0000), "alloc.client_psn"),
        (bad(&|a| a.client_gid = [0; 16]), "alloc.client_gid"),
        (bad(&|a| a.client_mac = [1, 0, 0, 0, 0, 0]), "alloc.client_mac"),
        (bad(&|a| a.ttl_ms = u32::MAX), "alloc.ttl_ms"),
    ] {
        let e = r.call(TENANT, &req).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadParam, "{field}: {e:?}");
        assert!(e.message.contains(field), "{field}: {}", e.message);
    }
    let e = r.call(TENANT, &bad(&|a| a.size = 64 << 20)).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoMemory);
    r.alloc(TENANT, 2 << 20);
    r.alloc(TENANT, 2 << 20);
    let e = r.call(TENANT, &bad(&|_| {})).unwrap_err();
    assert_eq!(e.code, ErrorCode::Limit, "per-tenant lease limit: {e:?}");
    // Another tenant still gets memory until the pool runs dry.
    r.alloc(OTHER, 4 << 20);
    let e = r.call(OTHER, &bad(&|_| {})).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoMemory);
}

#[test]
fn a_lease_above_the_largest_is_refused_naming_the_field_before_any_command() {
    // The default reach: as many 2 MiB extents as one CREATE_MKEY's MTT list carries in the longest command.
    let reach = leasebox_mlx5::ifc::mkey::MAX_MTT_PAGES as u64 * (2 << 20);
    assert_eq!(Config::default().max_lease(), reach);
    assert_eq!(Config { max_region: 1 << 30, ..Config::default() }.max_lease(), 1 << 30, "the HCA's own limit");
    // An HCA whose largest region is 4 MiB, with an 8 MiB pool.
    let mut r = Rig::configured(Config { max_region: 4 << 20, ..common::config() });
    let commands = r.platform().model().unwrap().counters().commands;
    let e = r.call(TENANT, &Request::Alloc(alloc_req((4 << 20) + 1, 7))).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadParam, "{e:?}");
    assert!(e.message.contains("'alloc.size'") && e.message.contains("at most 4194304 bytes"), "{}", e.message);
    assert_eq!(r.platform().model().unwrap().counters().commands, commands, "the HCA was not asked");
    assert_eq!(r.svc.pool().free_extents(), 4, "nothing taken from the pool");
    r.alloc(TENANT, 4 << 20);
}

#[test]
fn an_hca_refusal_during_alloc_is_reported_and_undone() {
    let mut r = Rig::new();
    let free = r.svc.pool().free_extents();
    fail(&r, INIT2RTR);
    let e = r.call(TENANT, &Request::Alloc(alloc_req(4 << 20, 9))).unwrap_err();
    assert_eq!(e.code, ErrorCode::HcaError);
    assert_eq!(e.detail, [0x503 << 16, 0x03, 0x7e57], "opcode << 16 | op_mod, status, syndrome");
    assert!(e.message.contains("INIT2RTR_QP") && e.message.contains("BAD_PARAM"), "{}", e.message);
    r.settle();
    assert_eq!(r.svc.pool().free_extents(), free, "the extents came back");
    assert_eq!(r.svc.free_slots(), r.svc.config().slots as usize);
    assert_eq!(r.svc.fenced_count(), 0);
    let p = r.platform();
    let m = p.model().unwrap();
    assert!(m.hca().qps.qps.is_empty() && m.hca().mkeys.is_empty(), "QP and MKEY destroyed");
}

#[test]
fn ready_is_checked_and_a_missing_ready_expires_the_lease() {
    let mut r = Rig::configured(Config { ready_timeout_ms: 100, ..common::config() });
    let a = r.alloc(TENANT, 4096);
    let stale = LeaseId { generation: a.lease.generation + 1, ..a.lease };
    let e = r.call(TENANT, &Request::Ready { lease: stale, client_qpn: 0x1234, server_qpn: a.server_qpn }).unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale);
    let e =
        r.call(TENANT, &Request::Ready { lease: a.lease, client_qpn: 0x1235, server_qpn: a.server_qpn }).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadParam, "client QPN mismatch");
    let e = r
        .call(TENANT, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn + 1 })
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadParam, "server QPN mismatch");
    let e =
        r.call(OTHER, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn }).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "another tenant cannot see it");
    // No READY: revoked with origin EXPIRY, then swept.
    r.settle();
    assert_eq!(r.svc.counters.expiries, 1);
    assert_eq!(r.svc.free_slots(), r.svc.config().slots as usize);
}

#[test]
fn tenants_see_their_own_and_the_admin_sees_all() {
    let mut r = Rig::new();
    let a = r.alloc(TENANT, 4096);
    let b = r.alloc(OTHER, 4096);
    let list = |r: &mut Rig, who| match r.call(who, &Request::List { cursor: 0, max: 10 }) {
        Ok(Response::List { leases, next_cursor }) => (leases.iter().map(|l| l.lease).collect::<Vec<_>>(), next_cursor),
        other => panic!("{other:?}"),
    };
    assert_eq!(list(&mut r, TENANT), (vec![a.lease], 0));
    assert_eq!(list(&mut r, OTHER), (vec![b.lease], 0));
    assert_eq!(list(&mut r, ADMIN), (vec![a.lease, b.lease], 0));
    // Paged.
    let Ok(Response::List { leases, next_cursor }) = r.call(ADMIN, &Request::List { cursor: 0, max: 1 }) else {
        panic!()
    };
    assert_eq!((leases.len(), next_cursor), (1, 1));
    let Ok(Response::List { leases, next_cursor }) = r.call(ADMIN, &Request::List { cursor: next_cursor, max: 1 })
    else {
        panic!()
    };
    assert_eq!((leases[0].lease, next_cursor), (b.lease, 0));
    // Another tenant's FREE / REVOKE finds nothing; the admin's works.
    let Ok(Response::Free { outcome, .. }) = r.call(OTHER, &Request::Free { lease: a.lease }) else { panic!() };
    assert_eq!(outcome, Outcome::NotFound);
    assert_eq!(r.revoke(OTHER, a.lease), Outcome::NotFound);
    assert_eq!(r.revoke(ADMIN, a.lease), Outcome::TornDown);
    // Only the admin may pick the spec's order (QP first).
    let e = r.call(TENANT, &Request::Revoke { lease: b.lease, qp_first: true });
    assert!(matches!(&e, Err(e) if e.code == ErrorCode::Forbidden), "{e:?}");
    let Ok(Response::Revoke { outcome, .. }) = r.call(ADMIN, &Request::Revoke { lease: b.lease, qp_first: true })
    else {
        panic!()
    };
    assert_eq!(outcome, Outcome::TornDown);
}

fn fenced_after(mut r: Rig, revoke_qp_first: bool) -> (Rig, LeaseId, Outcome) {
    let a = r.alloc(TENANT, 4096);
    r.ready(TENANT, &a);
    let outcome = match r.call(ADMIN, &Request::Revoke { lease: a.lease, qp_first: revoke_qp_first }) {
        Ok(Response::Revoke { outcome, .. }) => outcome,
        other => panic!("{other:?}"),
    };
    (r, a.lease, outcome)
}

#[test]
fn each_failing_teardown_command_fences_with_its_mask_and_origin() {
    // (command failing, revoke qp-first?, outcome, mask, origin)
    let cases: [(u16, bool, Outcome, u32, u8); 5] = [
        (DESTROY_MKEY, false, Outcome::Fenced, step_bit::DESTROY_MKEY, origin::REVOKE),
        (QP_2ERR, true, Outcome::Fenced, step_bit::QP_2ERR, origin::REVOKE),
        (QP_2RST, false, Outcome::TornDown, step_bit::QP_2RST, origin::SWEEP),
        (DESTROY_QP, false, Outcome::TornDown, step_bit::DESTROY_QP, origin::SWEEP),
        (0x801, false, Outcome::TornDown, step_bit::DEALLOC_PD, origin::SWEEP),
    ];
    for (opcode, qp_first, outcome, mask, org) in cases {
        let r = Rig::configured(common::config());
        let a0 = r.svc.pool().free_extents();
        fail(&r, opcode);
        let (mut r, lease, got) = fenced_after(r, qp_first);
        assert_eq!(got, outcome, "opcode {opcode:#x}");
        r.settle();
        let f = r.svc.fenced(ADMIN, 0, 128).1;
        assert_eq!(f.len(), 1, "opcode {opcode:#x}");
        assert_eq!((f[0].slot, f[0].generation), (lease.slot, lease.generation));
        assert_eq!(f[0].failed_mask & mask, mask, "opcode {opcode:#x} mask {:#x}", f[0].failed_mask);
        assert_eq!(f[0].origin, org, "opcode {opcode:#x}");
        assert_eq!(r.svc.pool().free_extents(), a0 - 1, "the fenced slot's memory never returns");
        assert_eq!(r.svc.fenced(TENANT, 0, 128).1.len(), 1, "the owner sees its fenced slot");
        assert!(r.svc.fenced(OTHER, 0, 128).1.is_empty());
        // The next ALLOC takes neither the slot nor its memory.
        let b = r.alloc(TENANT, 4096);
        assert_ne!(b.lease.slot, lease.slot);
        assert_eq!(r.revoke(TENANT, lease), Outcome::Fenced, "a fenced slot answers Fenced for its generation");
    }
}

#[test]
fn a_failed_destroy_mkey_moves_the_qp_to_err_at_once() {
    let r = Rig::new();
    fail(&r, DESTROY_MKEY);
    let (r, lease, outcome) = fenced_after(r, false);
    assert_eq!(outcome, Outcome::Fenced);
    let f = r.svc.fence_info(lease.slot).unwrap();
    assert_eq!(f.failed_mask, step_bit::DESTROY_MKEY, "the fallback 2ERR_QP succeeded");
    let p = r.platform();
    let m = p.model().unwrap();
    let qp =
        m.hca().qps.qps.iter().next().map(|(_, q)| q.state).expect("the QP is still there (fenced, not destroyed)");
    assert_eq!(format!("{qp:?}"), "Err");
}

#[test]
fn a_hung_hca_during_revoke_answers_fenced_within_a_second() {
    let mut r = Rig::new();
    let a = r.alloc(TENANT, 4096);
    r.ready(TENANT, &a);
    r.platform().model().unwrap().inject(Fault::Hang { opcode: DESTROY_MKEY });
    let deadline = Duration::from_millis(r.svc.config().revoke_deadline_ms);
    assert!(deadline < common::CMD_TIMEOUT, "the revoke deadline comes first");
    let t0 = r.now_us();
    let (t, now) = r.send(TENANT, &Request::Revoke { lease: a.lease, qp_first: false });
    assert!(now.is_none());
    let reply = r.wait(t, Duration::from_secs(3));
    let waited = r.since(t0);
    assert!(matches!(reply, Ok(Response::Revoke { outcome: Outcome::Fenced, .. })), "{reply:?}");
    // The revoke deadline ended it (virtual time): not before it, and at the first deadline scan after it —
    // long before the hung command's own timeout would have.
    let scan = Duration::from_micros(leasebox_lease::service::SCAN_INTERVAL_US);
    assert!(waited >= deadline, "answered after {waited:?}, before the deadline");
    assert!(waited <= deadline + scan + common::STEP, "answered after {waited:?}: not by the deadline scan");
    let f = r.svc.fence_info(a.lease.slot).unwrap();
    assert_eq!(f.failed_mask, step_bit::DEADLINE);
    assert_eq!(f.origin, origin::REVOKE);
}

#[test]
fn a_page_request_storm_during_an_alloc_burst() {
    let model = mlx5_model::ModelConfig {
        page_request: Some(PageRequest { opcode: CREATE_MKEY, num_pages: 16, times: 40 }),
        ..common::model()
    };
    let mut r = Rig::with(model, Config { extent: 4096, ..common::config() }, 1 << 20);
    let given = r.d.cmd.pages().given();
    let mut tickets = Vec::new();
    for i in 0..40 {
        let (t, now) = r.send(TENANT, &Request::Alloc(alloc_req(4096, 0x100 + i)));
        assert!(now.is_none());
        tickets.push(t);
    }
    for t in tickets {
        assert!(matches!(r.wait(t, Duration::from_secs(10)), Ok(Response::Alloc(_))));
    }
    // Each PAGE_REQUEST carries the device's whole outstanding demand, so requests raised while others wait
    // overlap: at least the 640 pages asked for were given.
    assert!(r.d.cmd.pages().given() >= given + 40 * 16, "every page request was served");
    assert!(r.d.client.shared().page_requests.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[test]
fn lost_sessions_keep_their_leases_for_the_grace_then_expire() {
    let mut r = Rig::configured(Config { session_grace_ms: 100, ..common::config() });
    let a = r.alloc(TENANT, 4096);
    r.ready(TENANT, &a);
    let now = r.now_us();
    r.svc.session_lost(TENANT.session, now);
    // The same tenant reconnects within the grace: it resumes the lease.
    assert_eq!(r.svc.session_started(9, "alpha"), 1);
    assert_eq!(r.svc.counters.reconnects, 1);
    r.pass(Duration::from_millis(300));
    let Ok(Response::Query(q)) = r.call(TENANT, &Request::Query { lease: a.lease }) else { panic!() };
    assert_eq!(q.state, LeaseState::Active);
    // Lost again, nobody comes back: expired.
    let now = r.now_us();
    r.svc.session_lost(9, now);
    r.settle();
    assert_eq!(r.svc.counters.expiries, 1);
}

#[test]
fn ttl_expires_and_renew_or_heartbeats_extend_it() {
    let mut r = Rig::configured(Config { heartbeat_renews: true, ..common::config() });
    let mut req = alloc_req(4096, 0x1234);
    // A TTL of a second (virtual time): READY and the heartbeats, one a pump, come well within it.
    req.ttl_ms = 1000;
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(req)) else { panic!() };
    r.ready(TENANT, &a);
    // Heartbeats keep it alive past its TTL.
    let t0 = r.now_us();
    while r.since(t0) < Duration::from_millis(1500) {
        let now = r.now_us();
        r.svc.session_alive(TENANT.session, now);
        r.pump();
    }
    let Ok(Response::Renew { ttl_ms }) = r.call(TENANT, &Request::Renew { lease: a.lease, ttl_ms: 150 }) else {
        panic!()
    };
    assert_eq!(ttl_ms, 150);
    assert_eq!(r.svc.counters.expiries, 0);
    // Silence: it expires.
    r.settle();
    assert_eq!(r.svc.counters.expiries, 1);
}

#[test]
fn fence_test_corrupts_the_mkey_index_and_the_slot_is_never_reused() {
    let mut r = Rig::configured(Config { fence_test: true, ..common::config() });
    let a = r.alloc(TENANT, 2 << 20);
    r.ready(TENANT, &a);
    let fenced_before = r.svc.fenced_count();
    assert_eq!(r.revoke(TENANT, a.lease), Outcome::Fenced);
    r.settle();
    let f = r.svc.fence_info(a.lease.slot).unwrap();
    assert_eq!(f.failed_mask & step_bit::DESTROY_MKEY, step_bit::DESTROY_MKEY);
    assert!(f.detail.contains("DESTROY_MKEY") && f.detail.contains("BAD_PARAM"), "{}", f.detail);
    assert_eq!(r.svc.fenced_count(), fenced_before + 1);
    let Err(e) = r.call(TENANT, &Request::Query { lease: a.lease }) else { panic!() };
    assert_eq!(e.code, ErrorCode::NotFound, "not active");
    let b = r.alloc(TENANT, 2 << 20);
    assert_ne!(b.lease.slot, a.lease.slot);
    assert_ne!(b.remote_addr, a.remote_addr, "nor its memory");
}

#[test]
fn ten_thousand_leases_allocated_then_revoked_leak_nothing() {
    let cfg = Config {
        extent: 4096,
        slots: 10_000,
        tenant_leases: 10_000,
        grace_ms: 0,
        ready_timeout_ms: 600_000,
        default_ttl_ms: 600_000,
        ..common::config()
    };
    let mut r = Rig::with(common::model(), cfg, 10_000 * 4096);
    let dma_free = r.platform().dma_free_bytes();
    let pool = r.svc.pool().free_extents();
    let mut leases = Vec::new();
    r.pipelined(TENANT, (0..10_000u32).map(|i| Request::Alloc(alloc_req(4096, 0x10 + i))), |reply| match reply {
        Ok(Response::Alloc(a)) => leases.push(a.lease),
        other => panic!("ALLOC: {other:?}"),
    });
    assert_eq!(leases.len(), 10_000);
    assert_eq!(r.svc.by_state()[LeaseState::Granted as usize], 10_000);
    let revokes = leases.iter().map(|&lease| Request::Revoke { lease, qp_first: false });
    r.pipelined(TENANT, revokes, |reply| {
        assert!(matches!(reply, Ok(Response::Revoke { outcome: Outcome::TornDown, .. })), "{reply:?}")
    });
    r.settle();
    if let Some(f) = r.svc.fenced(ADMIN, 0, 128).1.first() {
        panic!("{} fenced, e.g. {f:?}: {:?}", r.svc.fenced_count(), r.svc.fence_info(f.slot));
    }
    assert_eq!(r.svc.free_slots(), 10_000);
    assert_eq!(r.svc.pool().free_extents(), pool);
    assert_eq!(r.platform().dma_free_bytes(), dma_free, "every QP buffer and doorbell record returned");
    let p = r.platform();
    let m = p.model().unwrap();
    assert!(
        m.hca().qps.qps.is_empty() && m.hca().mkeys.is_empty() && m.hca().pds.is_empty(),
        "nothing left on the HCA"
    );
    drop(m);
    let _ = RevokeOrder::MkeyFirst;
}

/// The tag sequence started just below each of its limits (bit 61 turning on; the top and the wrap to 1), on
/// the native driver and the model: ALLOC across it, REVOKE with DESTROY_MKEY failing (the 2ERR fallback runs,
/// the slot fences), and a second lease built, revoked and swept. Every result comes back to its lease through
/// the real command engine (which refuses a tag outside its client bits). `cargo test --release` runs it too.
#[test]
fn the_command_tag_sequence_crosses_its_limits_on_the_model() {
    use leasebox_lease::LeaseService;
    let max = LeaseService::<u64>::SEQUENCE_MAX;
    for start in [(1 << 29) - 3, (1 << 30) - 3, max - 3, max] {
        let mut r = Rig::configured(common::config());
        r.svc.start_sequence_at(start);
        let a0 = r.svc.pool().free_extents();
        fail(&r, DESTROY_MKEY);
        let (mut r, lease, outcome) = fenced_after(r, false);
        assert_eq!(outcome, Outcome::Fenced, "start {start}");
        let f = r.svc.fence_info(lease.slot).expect("fenced");
        assert_eq!(f.failed_mask, step_bit::DESTROY_MKEY, "start {start}: the fallback 2ERR_QP ran and succeeded");
        let b = r.alloc(TENANT, 4096);
        r.ready(TENANT, &b);
        assert_eq!(r.revoke(TENANT, b.lease), Outcome::TornDown, "start {start}");
        assert!(r.platform().model().unwrap().mkey(b.rkey).is_none(), "start {start}: the key is gone");
        r.settle();
        assert_eq!(r.svc.pool().free_extents(), a0 - 1, "start {start}: only the fenced slot's memory kept");
        let next = r.svc.next_sequence();
        assert!(next < start || next > start + 10, "start {start}: the sequence moved on to {next}");
        if start >= max - 3 {
            assert!(next < 100, "start {start}: wrapped to {next}");
        }
    }
}
