//! The reference responder's bookkeeping over a fake device: slots and generations, who may see what, the
//! teardown order's verbs, fencing and the sweep, on a scripted clock.

use std::sync::{Arc, Mutex};

use leasebox_proto::{HcaState, HealthStatus, Op};
use leasebox_session::ConnId;

use super::*;

const BOOT: [u8; BOOT_ID_LEN] = [7; BOOT_ID_LEN];

/// What the fake device was asked, in order, and which calls fail.
#[derive(Default)]
struct Script {
    calls: Vec<String>,
    fail: Vec<&'static str>,
    next: u64,
}

struct FakeDevice {
    port: PortInfo,
    s: Arc<Mutex<Script>>,
}

impl FakeDevice {
    fn call(&self, what: &'static str, r: Region) -> Result<(), String> {
        let mut s = self.s.lock().unwrap();
        s.calls.push(format!("{what} {}", r.0));
        if s.fail.contains(&what) { Err(format!("{what} failed")) } else { Ok(()) }
    }
}

impl Device for FakeDevice {
    fn port(&self) -> &PortInfo {
        &self.port
    }
    fn build(&mut self, len: u64, peer: &Peer, _psn: u32) -> Result<Built, ErrorBody> {
        let mut s = self.s.lock().unwrap();
        if s.fail.contains(&"build") {
            return Err(ErrorBody::new(ErrorCode::HcaError, "ALLOC: ibv_reg_mr: fake"));
        }
        s.next += 1;
        let n = s.next;
        s.calls.push(format!("build {n} len {len} mtu {} qpn {:#x}", peer.mtu, peer.qpn));
        Ok(Built { region: Region(n), rkey: 0x100 + n as u32, addr: 0x10_0000 * n, qpn: 0x40 + n as u32 })
    }
    fn dereg_mr(&mut self, r: Region) -> Result<(), String> {
        self.call("dereg_mr", r)
    }
    fn qp_to_err(&mut self, r: Region) -> Result<(), String> {
        self.call("qp_to_err", r)
    }
    fn destroy_qp(&mut self, r: Region) -> Result<(), String> {
        self.call("destroy_qp", r)
    }
    fn release(&mut self, r: Region) -> Result<(), String> {
        self.call("release", r)
    }
    fn quarantine(&mut self, r: Region) {
        self.s.lock().unwrap().calls.push(format!("quarantine {}", r.0));
    }
}

struct Rig {
    b: VerbsLeases,
    s: Arc<Mutex<Script>>,
    now: u64,
}

fn tenant(name: &str, session_id: u64) -> Principal {
    Principal { name: name.into(), role: Role::Tenant, session_id }
}

fn admin() -> Principal {
    Principal { name: "admin".into(), role: Role::Admin, session_id: 99 }
}

fn ticket(op: Op) -> Ticket {
    Ticket { conn: ConnId(1), session_id: 1, request_id: 1, op }
}

fn alloc_req(size: u64) -> AllocReq {
    AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 5,
        ttl_ms: 0,
        client_qpn: 0x11,
        client_psn: 0x22,
        client_gid: [0xaa; 16],
        client_mac: [0; 6],
    }
}

impl Rig {
    fn new(opts: LeaseOptions, teardown: QpTeardown) -> Rig {
        let s = Arc::new(Mutex::new(Script::default()));
        let port = PortInfo { gid: [0xbb; 16], mac: [2, 0, 0, 0, 0, 1], active_mtu: 3 };
        let dev = FakeDevice { port, s: s.clone() };
        let mut b = VerbsLeases::new(Box::new(dev), opts, teardown, IdRng::from_seed([1; 32]));
        b.boot(BOOT);
        Rig { b, s, now: 1_000 }
    }

    fn call(&mut self, who: &Principal, req: Request) -> Reply {
        match self.b.lease_op(who, &req, ticket(req.op()), self.now) {
            Answer::Now(r) => r,
            Answer::Later => panic!("the verbs backend answers at once"),
        }
    }

    fn alloc(&mut self, who: &Principal, size: u64) -> AllocResp {
        match self.call(who, Request::Alloc(alloc_req(size))) {
            Ok(Response::Alloc(a)) => a,
            other => panic!("ALLOC answered {other:?}"),
        }
    }

    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut self.s.lock().unwrap().calls)
    }

    fn fail(&self, what: &'static str) {
        self.s.lock().unwrap().fail.push(what);
    }

    fn tick_to(&mut self, now: u64) {
        self.now = now;
        self.b.tick(now);
    }
}

fn code(r: Reply) -> Option<ErrorCode> {
    r.err().map(|e| e.code)
}

fn revoke_outcome(r: Reply) -> Outcome {
    match r {
        Ok(Response::Revoke { outcome, .. } | Response::Free { outcome, .. }) => outcome,
        other => panic!("answered {other:?}"),
    }
}

#[test]
fn alloc_answers_the_device_and_port_and_the_path_mtu_is_the_smaller() {
    let mut r = Rig::new(LeaseOptions::default(), QpTeardown::Err);
    let a = r.alloc(&tenant("demo", 1), 5000);
    assert_eq!(a.lease, LeaseId { boot_id: BOOT, slot: 0, generation: 1 });
    assert_eq!((a.rkey, a.remote_addr, a.length, a.server_qpn), (0x101, 0x10_0000, 5000, 0x41));
    assert_eq!((a.server_gid, a.server_mac, a.mtu), ([0xbb; 16], [2, 0, 0, 0, 0, 1], 3));
    assert_eq!(a.server_psn & !0xff_ffff, 0, "a 24-bit PSN");
    assert_eq!(a.ttl_ms, LeaseOptions::default().ttl_ms);
    assert_eq!(r.calls(), ["build 1 len 5000 mtu 3 qpn 0x11"]);
    // The pool counts whole pages.
    assert_eq!(r.b.lease_stats().bytes_leased, 8192);
}

#[test]
fn alloc_refusals() {
    let opts = LeaseOptions { pool_mib: 2, slots: Some(2), tenant_leases: 1, ..LeaseOptions::default() };
    let mut r = Rig::new(opts, QpTeardown::Err);
    let demo = tenant("demo", 1);
    assert_eq!(code(r.call(&demo, Request::Alloc(alloc_req(0)))), Some(ErrorCode::BadParam));
    assert_eq!(code(r.call(&demo, Request::Alloc(alloc_req(3 << 20)))), Some(ErrorCode::BadParam));
    let mut bad = alloc_req(10);
    bad.mtu = 6;
    assert_eq!(code(r.call(&demo, Request::Alloc(bad))), Some(ErrorCode::BadParam));
    r.alloc(&demo, 1 << 20);
    assert_eq!(code(r.call(&demo, Request::Alloc(alloc_req(10)))), Some(ErrorCode::Limit), "tenant_leases");
    let other = tenant("other", 2);
    assert_eq!(code(r.call(&other, Request::Alloc(alloc_req((1 << 20) + 1)))), Some(ErrorCode::NoMemory));
    r.alloc(&other, 1 << 20);
    assert_eq!(code(r.call(&tenant("third", 3), Request::Alloc(alloc_req(10)))), Some(ErrorCode::NoMemory));
    // A failed build is answered as the device says and takes no slot.
    let mut r = Rig::new(LeaseOptions::default(), QpTeardown::Err);
    r.fail("build");
    assert_eq!(code(r.call(&demo, Request::Alloc(alloc_req(10)))), Some(ErrorCode::HcaError));
    assert_eq!(r.b.lease_stats().by_state, [0; 5]);
}

#[test]
fn ready_checks_the_qpns_and_activates() {
    let mut r = Rig::new(LeaseOptions::default(), QpTeardown::Err);
    let demo = tenant("demo", 1);
    let a = r.alloc(&demo, 4096);
    let wrong = Request::Ready { lease: a.lease, client_qpn: 0x12, server_qpn: a.server_qpn };
    assert_eq!(code(r.call(&demo, wrong)), Some(ErrorCode::BadParam));
    let ready = Request::Ready { lease: a.lease, client_qpn: 0x11, server_qpn: a.server_qpn };
    assert_eq!(r.call(&demo, ready), Ok(Response::Ready { state: LeaseState::Active }));
    match r.call(&demo, Request::Query { lease: a.lease }) {
        Ok(Response::Query(i)) => {
            assert_eq!((i.state, i.rkey, i.client_qpn, i.tenant.as_str()), (LeaseState::Active, a.rkey, 0x11, "demo"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn mkey_first_deregisters_and_leaves_the_qp_for_the_sweep() {
    let mut r = Rig::new(LeaseOptions { grace_ms: 5_000, ..LeaseOptions::default() }, QpTeardown::Err);
    let demo = tenant("demo", 1);
    let a = r.alloc(&demo, 4096);
    r.calls();
    let out = r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: false });
    assert_eq!(revoke_outcome(out), Outcome::TornDown);
    assert_eq!(r.calls(), ["dereg_mr 1"]);
    let mut notices = Vec::new();
    r.b.take_notices(&mut notices);
    assert_eq!(notices, [("demo".to_string(), Notice::Revoked { lease: a.lease, outcome: Outcome::TornDown })]);
    // Idempotent while it waits for the sweep.
    let again = r.call(&demo, Request::Free { lease: a.lease });
    assert_eq!(again, Ok(Response::Free { outcome: Outcome::TornDown, elapsed_us: 0 }));
    assert!(r.calls().is_empty());
    r.tick_to(5_999);
    assert!(r.calls().is_empty(), "the sweep waits for the grace period");
    r.tick_to(6_000);
    assert_eq!(r.calls(), ["qp_to_err 1", "destroy_qp 1", "release 1"]);
    // The slot is free again, with the next generation; the old id names nothing.
    let b = r.alloc(&demo, 4096);
    assert_eq!((b.lease.slot, b.lease.generation), (0, 2));
    assert_eq!(
        revoke_outcome(r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: false })),
        Outcome::NotFound
    );
    assert_eq!(code(r.call(&demo, Request::Query { lease: a.lease })), Some(ErrorCode::Stale));
}

#[test]
fn revoke_notices_off_withholds_the_revoked_notice() {
    let opts = LeaseOptions { grace_ms: 5_000, revoke_notices: false, ..LeaseOptions::default() };
    let mut r = Rig::new(opts, QpTeardown::Err);
    let demo = tenant("demo", 1);
    let a = r.alloc(&demo, 4096);
    for qp_first in [false, true] {
        let l = if qp_first { r.alloc(&demo, 4096).lease } else { a.lease };
        assert_eq!(revoke_outcome(r.call(&admin(), Request::Revoke { lease: l, qp_first })), Outcome::TornDown);
    }
    let mut notices = Vec::new();
    r.b.take_notices(&mut notices);
    assert!(notices.is_empty(), "{notices:?}");
}

#[test]
fn qp_first_cuts_the_qp_then_deregisters_in_either_teardown_mode() {
    for (mode, cut, sweep) in [
        (QpTeardown::Err, "qp_to_err 1", vec!["destroy_qp 1", "release 1"]),
        (QpTeardown::Destroy, "destroy_qp 1", vec!["release 1"]),
    ] {
        let mut r = Rig::new(LeaseOptions { grace_ms: 0, ..LeaseOptions::default() }, mode);
        let a = r.alloc(&tenant("demo", 1), 4096);
        r.calls();
        assert_eq!(
            revoke_outcome(r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: true })),
            Outcome::TornDown
        );
        assert_eq!(r.calls(), [cut, "dereg_mr 1"], "{mode:?}");
        r.tick_to(r.now);
        assert_eq!(r.calls(), sweep, "{mode:?}");
    }
    // MKEY first with `destroy`: the sweep destroys the QP straight from RTS.
    let mut r = Rig::new(LeaseOptions { grace_ms: 0, ..LeaseOptions::default() }, QpTeardown::Destroy);
    let a = r.alloc(&tenant("demo", 1), 4096);
    r.calls();
    r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: false }).unwrap();
    r.tick_to(r.now);
    assert_eq!(r.calls(), ["dereg_mr 1", "destroy_qp 1", "release 1"]);
}

#[test]
fn a_tenant_may_not_choose_the_order_nor_see_another_tenants_lease() {
    let mut r = Rig::new(LeaseOptions::default(), QpTeardown::Err);
    let a = r.alloc(&tenant("demo", 1), 4096);
    assert_eq!(
        code(r.call(&tenant("demo", 1), Request::Revoke { lease: a.lease, qp_first: true })),
        Some(ErrorCode::Forbidden)
    );
    let other = tenant("other", 2);
    assert_eq!(revoke_outcome(r.call(&other, Request::Revoke { lease: a.lease, qp_first: false })), Outcome::NotFound);
    assert_eq!(code(r.call(&other, Request::Query { lease: a.lease })), Some(ErrorCode::NotFound));
    assert_eq!(
        r.call(&other, Request::List { cursor: 0, max: 10 }),
        Ok(Response::List { next_cursor: 0, leases: vec![] })
    );
    let another_boot = LeaseId { boot_id: [8; BOOT_ID_LEN], ..a.lease };
    assert_eq!(
        revoke_outcome(r.call(&admin(), Request::Revoke { lease: another_boot, qp_first: false })),
        Outcome::NotFound
    );
    // The admin sees every lease, paged.
    r.alloc(&other, 4096);
    match r.call(&admin(), Request::List { cursor: 0, max: 1 }) {
        Ok(Response::List { next_cursor: 1, leases }) => assert_eq!(leases[0].lease, a.lease),
        other => panic!("{other:?}"),
    }
    let no_override = LeaseOptions { allow_order_override: false, ..LeaseOptions::default() };
    let mut r = Rig::new(no_override, QpTeardown::Err);
    let a = r.alloc(&tenant("demo", 1), 4096);
    assert_eq!(code(r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: true })), Some(ErrorCode::Forbidden));
}

#[test]
fn a_failed_deregistration_cuts_the_qp_and_fences_for_good() {
    let mut r = Rig::new(LeaseOptions::default(), QpTeardown::Err);
    let demo = tenant("demo", 1);
    let a = r.alloc(&demo, 4096);
    r.calls();
    r.fail("dereg_mr");
    assert_eq!(revoke_outcome(r.call(&admin(), Request::Revoke { lease: a.lease, qp_first: false })), Outcome::Fenced);
    assert_eq!(r.calls(), ["dereg_mr 1", "qp_to_err 1", "quarantine 1"]);
    let (_, fenced) = r.b.fenced(&demo, 0, 10);
    assert_eq!(fenced.len(), 1);
    assert_eq!((fenced[0].generation, fenced[0].failed_mask, fenced[0].origin), (1, failed::DEREG_MR, 1));
    assert_eq!(revoke_outcome(r.call(&demo, Request::Free { lease: a.lease })), Outcome::Fenced);
    assert!(r.b.fenced(&tenant("other", 2), 0, 10).1.is_empty());
    let facts = r.b.health_facts();
    assert_eq!(leasebox_session::health(HcaState::Ok, "verbs", &facts, 0).status, HealthStatus::Degraded);
    // The fenced slot is never lent again; its bytes stay counted.
    let b = r.alloc(&demo, 4096);
    assert_eq!(b.lease.slot, 1);
    let s = r.b.lease_stats();
    assert_eq!((s.fenced_slots, s.by_state[LeaseState::Fenced as usize], s.bytes_leased), (1, 1, 8192));
}

#[test]
fn a_failed_sweep_fences_and_tells_the_tenant() {
    let mut r = Rig::new(LeaseOptions { grace_ms: 0, ..LeaseOptions::default() }, QpTeardown::Err);
    let a = r.alloc(&tenant("demo", 1), 4096);
    r.call(&tenant("demo", 1), Request::Free { lease: a.lease }).unwrap();
    r.fail("destroy_qp");
    r.tick_to(r.now);
    let (_, fenced) = r.b.fenced(&admin(), 0, 10);
    assert_eq!((fenced[0].failed_mask, fenced[0].origin), (failed::DESTROY_QP, 2));
    let mut notices = Vec::new();
    r.b.take_notices(&mut notices);
    assert_eq!(notices, [("demo".to_string(), Notice::Fenced { lease: a.lease })], "FREE itself is not told");
}

#[test]
fn expiries_ttl_ready_deadline_and_a_lost_session() {
    let opts = LeaseOptions { ready_ms: 100, session_grace_ms: 50, grace_ms: 1_000_000, ..LeaseOptions::default() };
    let mut r = Rig::new(opts, QpTeardown::Err);
    let demo = tenant("demo", 1);
    // READY deadline.
    let a = r.alloc(&demo, 4096);
    r.tick_to(1_100);
    assert_eq!(code(r.call(&demo, Request::Renew { lease: a.lease, ttl_ms: 0 })), Some(ErrorCode::BadState));
    // TTL, renewed by heartbeats.
    let mut req = alloc_req(4096);
    req.ttl_ms = 200;
    let Ok(Response::Alloc(b)) = r.call(&demo, Request::Alloc(req)) else { panic!("ALLOC") };
    r.call(&demo, Request::Ready { lease: b.lease, client_qpn: 0x11, server_qpn: b.server_qpn }).unwrap();
    r.b.session_alive(&demo, 1_250);
    r.tick_to(1_400);
    assert!(
        matches!(r.call(&demo, Request::Query { lease: b.lease }), Ok(Response::Query(i)) if i.state == LeaseState::Active)
    );
    r.tick_to(1_450);
    assert!(
        matches!(r.call(&demo, Request::Query { lease: b.lease }), Ok(Response::Query(i)) if i.state == LeaseState::PendingDestroy)
    );
    // A lost session: adopted by the tenant's next session within the grace, expired after it.
    let Ok(Response::Alloc(c)) = r.call(&demo, Request::Alloc(alloc_req(4096))) else { panic!("ALLOC") };
    r.call(&demo, Request::Ready { lease: c.lease, client_qpn: 0x11, server_qpn: c.server_qpn }).unwrap();
    r.b.session_lost(&demo, CloseReason::PeerClosed, 1_450);
    r.b.session_started(&tenant("demo", 2), 1_460);
    r.tick_to(1_600);
    assert!(
        matches!(r.call(&demo, Request::Query { lease: c.lease }), Ok(Response::Query(i)) if i.state == LeaseState::Active)
    );
    r.b.session_lost(&tenant("demo", 2), CloseReason::PeerClosed, 1_600);
    r.tick_to(1_650);
    assert!(
        matches!(r.call(&demo, Request::Query { lease: c.lease }), Ok(Response::Query(i)) if i.state == LeaseState::PendingDestroy)
    );
    let s = r.b.lease_stats();
    assert_eq!((s.expiries, s.revokes, s.allocs), (3, 0, 3));
    let mut notices = Vec::new();
    r.b.take_notices(&mut notices);
    assert_eq!(notices.len(), 3);
}

#[test]
fn spec_and_teardown_parse() {
    let s = VerbsSpec::parse("rxe0:1").unwrap();
    assert_eq!((s.device.as_str(), s.gid_index, s.port, s.qp_teardown), ("rxe0", 1, 1, QpTeardown::Err));
    assert_eq!(VerbsSpec::parse("mlx5_0").unwrap().gid_index, 0);
    assert!(VerbsSpec::parse("rxe0:300").is_err());
    assert!(VerbsSpec::parse(":1").is_err());
    assert!(VerbsSpec::parse("--hca").is_err());
    assert_eq!(QpTeardown::parse("destroy"), Ok(QpTeardown::Destroy));
    assert!(QpTeardown::parse("rst").is_err());
}
