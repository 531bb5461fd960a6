//! The lease service's data path end to end, hosted: the appliance runs the device
//! model with its RoCEv2 responder on UDP (`--hca --udp`), the control channel over TCP, and a software RC
//! requester (`leasectl::rdma::SoftRoce`) plays the client's NIC. Covers WRITE/READ into a granted lease,
//! both revoke orders as a non-cooperating client sees them (MKEY first → `IBV_WC_REM_ACCESS_ERR` within a
//! round trip; QP first → silence, `IBV_WC_RETRY_EXC_ERR` after the retries), isolation between leases (own
//! PD each) and scrubbing before memory is lent again.
//!
//! The data path runs in real time (a model thread, UDP, the requester's transport timers), so what these tests
//! assert of it are counts (NAKs, timer expiries, packets), not durations. The lease service's clock is moved
//! on by the test instead: the revoke grace is an hour, and a test lets it pass ([`Rig::sweep`]) when it wants
//! the sweep — never before, however slow the machine.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasebox_hosted::Hosted;
use leasebox_proto::{
    AllocReq, AllocResp, ErrorCode, LeaseId, LeaseState, Outcome, Request, Response, access, mtu_bytes,
};
use leasectl::rdma::{Completion, QpEndpoint, RcConfig, Requester, SoftConfig, SoftRoce, WcStatus, mtu_enum};
use leasectl::{Client, ClientError, Credentials, Timeouts};

/// Transport timer 4.096 µs × 2^12 ≈ 16.8 ms; 1 + 7 attempts ≈ 134 ms of silence before RETRY_EXC_ERR (short, yet
/// long enough that a model thread descheduled on a busy machine does not fail a WRITE before the revoke).
const SHORT: RcConfig = RcConfig { timeout: 12, retry_cnt: 7, rnr_retry: 7, max_wr: 16, max_pkts: 256 };
/// Transport timer 4.096 µs × 2^18 ≈ 1.07 s: on loopback only a lost packet or a missing answer lets it expire,
/// never a busy machine; so "no timeout" is a fact about the appliance, not about scheduling.
const PATIENT: RcConfig = RcConfig { timeout: 18, ..SHORT };

/// The revoke grace: the sweep waits for the test to move the lease clock past it ([`Rig::sweep`]).
const GRACE: Duration = Duration::from_secs(3600);
/// How long a completion or the sweep may take before the test counts as hung.
const HANG: Duration = Duration::from_secs(30);

mod common;
use common::{Principals, with_model};
use leasebox_hosted::testing::Builder;

/// A hosted appliance with the model's responder on UDP, tenants `demo` and `other`, and the admin.
struct Rig {
    h: leasebox_hosted::testing::Rig,
    demo: Credentials,
    other: Credentials,
    admin: Credentials,
    udp: SocketAddr,
}

impl Rig {
    /// `opts`: lease options beyond the grace (`revoke_order=qp-first`, `lease_pool_mib=2`, …).
    fn start(opts: impl FnOnce(Builder) -> Builder) -> Rig {
        let h = opts(with_model().lease_grace_ms(GRACE.as_millis() as u64)).start().unwrap();
        let udp = h.udp().expect("--udp gives the responder an address");
        let Principals { demo, other, admin } = Principals::of(&h);
        Rig { h, demo, other, admin, udp }
    }

    fn hosted(&self) -> &Hosted {
        &self.h
    }

    fn session(&self, who: &Credentials) -> Client {
        let addr = self.hosted().addr().to_string();
        Client::connect_and_hello(&addr, who, Timeouts::all(Duration::from_secs(5))).unwrap().0
    }

    fn requester(&self, rc: RcConfig) -> SoftRoce {
        SoftRoce::new(SoftConfig { peer: self.udp, rc, ..SoftConfig::default() }).unwrap()
    }

    /// Lets the revoke grace pass on the lease service's clock, then waits for the sweep: QUERY answers
    /// NOT_FOUND or STALE once the slot is free again.
    /// Skips the grace, then waits until the lease is swept and its memory scrubbed (the scrub follows the
    /// sweep on the service's timer: docs/operations.md, "The lease pool").
    fn sweep(&self, c: &mut Client, lease: LeaseId) {
        self.hosted().with_leases(|b| b.env.skip(GRACE)).expect("the lease backend");
        let end = Instant::now() + HANG;
        loop {
            match c.call(&Request::Query { lease }) {
                Err(ClientError::Server(e)) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale) => break,
                Ok(Response::Query(info)) => assert!(
                    matches!(info.state, LeaseState::Fencing | LeaseState::PendingDestroy),
                    "revoked lease is {:?}",
                    info.state
                ),
                other => panic!("QUERY of a revoked lease answered {other:?}"),
            }
            assert!(Instant::now() < end, "lease {lease:?} not swept within {HANG:?} of its grace");
        }
        while self.hosted().with_leases(|b| b.svc.pool().scrubbing_bytes()).expect("the lease backend") > 0 {
            assert!(Instant::now() < end, "lease {lease:?}'s memory not scrubbed within {HANG:?} of its grace");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The model's RAM at a device address.
    fn ram(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.hosted().hca().unwrap().platform.ram().read(addr, &mut buf).unwrap();
        buf
    }
}

/// ALLOC of `size` bytes, read-write, for the requester QP `me`.
fn alloc(me: &QpEndpoint, size: u64) -> Request {
    Request::Alloc(AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: mtu_enum(me.mtu).unwrap(),
        ttl_ms: 0,
        client_qpn: me.qpn,
        client_psn: me.psn,
        client_gid: me.gid,
        client_mac: me.mac,
    })
}

/// ALLOC with `r`'s QP parameters, `r` to RTS toward the server QP, READY → Active.
fn lease(c: &mut Client, r: &mut SoftRoce, size: u64) -> AllocResp {
    let me = r.local();
    let a = match c.call(&alloc(&me, size)).unwrap() {
        Response::Alloc(a) => a,
        other => panic!("ALLOC answered {other:?}"),
    };
    let remote = QpEndpoint {
        qpn: a.server_qpn,
        psn: a.server_psn,
        gid: a.server_gid,
        mac: a.server_mac,
        mtu: mtu_bytes(a.mtu).unwrap(),
    };
    r.connect(&remote).unwrap();
    let ready = Request::Ready { lease: a.lease, client_qpn: me.qpn, server_qpn: a.server_qpn };
    assert_eq!(c.call(&ready).unwrap(), Response::Ready { state: LeaseState::Active });
    a
}

fn revoke(c: &mut Client, lease: LeaseId, qp_first: bool) -> Outcome {
    match c.call(&Request::Revoke { lease, qp_first }).unwrap() {
        Response::Revoke { outcome, .. } => outcome,
        other => panic!("REVOKE answered {other:?}"),
    }
}

/// The next `n` completions, in order (failing after [`HANG`]).
fn next(r: &mut SoftRoce, n: usize) -> Vec<Completion> {
    let end = Instant::now() + HANG;
    let mut all = Vec::new();
    while all.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions within {HANG:?}: {all:?}", all.len());
        all.extend(r.poll(Duration::from_millis(20)));
    }
    assert_eq!(all.len(), n, "{all:?}");
    all
}

fn one(r: &mut SoftRoce) -> Completion {
    next(r, 1)[0]
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8 | 1).collect()
}

#[test]
fn write_lands_in_the_lease_and_reads_back() {
    let rig = Rig::start(|b| b);
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(PATIENT);
    let a = lease(&mut c, &mut r, 64 << 10);
    assert_eq!(a.length, 64 << 10);
    assert_eq!(rig.ram(a.remote_addr, 64 << 10), vec![0; 64 << 10], "a new lease is zeroed");

    let data = pattern(12 << 10, 1);
    r.post_write(1, a.remote_addr + 4096, a.rkey, &data).unwrap();
    let w = one(&mut r);
    assert_eq!((w.wr_id, w.status, w.byte_len), (1, WcStatus::Success, data.len() as u32), "{w:?}");
    assert_eq!(rig.ram(a.remote_addr + 4096, data.len()), data, "the WRITE landed in the lease's memory");

    r.post_read(2, a.remote_addr + 4096, a.rkey, data.len() as u32).unwrap();
    let rd = one(&mut r);
    assert_eq!((rd.wr_id, rd.status), (2, WcStatus::Success), "{rd:?}");
    assert_eq!(r.read_data(2).unwrap(), data);
    assert_eq!(r.counters().frames_bad, 0);
    assert_eq!(r.stats().timeouts, 0);
}

#[test]
fn mkey_first_revoke_naks_the_next_write_before_its_timer() {
    let rig = Rig::start(|b| b);
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(PATIENT);
    let a = lease(&mut c, &mut r, 4096);
    r.post_write(1, a.remote_addr, a.rkey, &[7; 64]).unwrap();
    assert_eq!(one(&mut r).status, WcStatus::Success);

    assert_eq!(revoke(&mut c, a.lease, false), Outcome::TornDown);
    let before = r.stats();
    r.post_write(2, a.remote_addr, a.rkey, &[8; 64]).unwrap();
    r.post_write(3, a.remote_addr, a.rkey, &[9; 64]).unwrap();
    let cs = next(&mut r, 2);
    assert_eq!((cs[0].wr_id, cs[0].status.name(), cs[0].status.code()), (2, "IBV_WC_REM_ACCESS_ERR", 10), "{cs:?}");
    assert_eq!((cs[1].wr_id, cs[1].status), (3, WcStatus::WrFlushErr));
    // The QP is still in RTS and NAKs the first transmission: the transport timer (over a second) never ran out.
    let s = r.stats();
    assert_eq!((s.naks - before.naks, s.timeouts - before.timeouts), (1, 0), "a NAK, not the timer: {s:?}");
    assert_eq!(rig.ram(a.remote_addr, 64), vec![7; 64], "nothing landed after the revoke");
}

/// Silence after a QP-first revoke: the requester learns only from its own retries. The lease's memory is read
/// after them: the sweep (which scrubs it) waits for the test to let the grace pass, which it does not.
fn qp_first_silence(rig: &Rig, revoker: &Credentials, qp_first_flag: bool) {
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(SHORT);
    let a = lease(&mut c, &mut r, 4096);
    r.post_write(1, a.remote_addr, a.rkey, &[7; 64]).unwrap();
    assert_eq!(one(&mut r).status, WcStatus::Success);

    let mut rc = if revoker.name == "admin" { rig.session(revoker) } else { c };
    assert_eq!(revoke(&mut rc, a.lease, qp_first_flag), Outcome::TornDown);
    // The counters are cumulative: on a busy machine the first WRITE may have been resent once already.
    let before = r.stats();
    r.post_write(2, a.remote_addr, a.rkey, &[8; 64]).unwrap();
    let w = one(&mut r);
    assert_eq!((w.wr_id, w.status.name(), w.status.code()), (2, "IBV_WC_RETRY_EXC_ERR", 12), "{w:?}");
    let s = r.stats();
    assert_eq!(s.naks - before.naks, 0, "no answer at all from a QP in ERR: {s:?}");
    // The packet went out once per attempt and each attempt's timer expired: 1 + retry_cnt of each. (The
    // requester's own tests hold its timer to its period; here the count says the timer ended it.)
    let attempts = u64::from(SHORT.retry_cnt) + 1;
    assert_eq!((s.timeouts - before.timeouts, s.packets_sent - before.packets_sent), (attempts, attempts), "{s:?}");
    assert_eq!(rig.ram(a.remote_addr, 64), vec![7; 64], "nothing landed after the revoke");
}

#[test]
fn qp_first_order_configured_gives_silence_then_retry_exc_err() {
    let rig = Rig::start(|b| b.option("revoke_order", "qp-first"));
    let demo = rig.demo.clone();
    qp_first_silence(&rig, &demo, false);
}

#[test]
fn admin_revoke_with_qp_first_gives_silence_then_retry_exc_err() {
    let rig = Rig::start(|b| b);
    let admin = rig.admin.clone();
    qp_first_silence(&rig, &admin, true);
    // A tenant may not choose the order.
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(RcConfig::default());
    let a = lease(&mut c, &mut r, 4096);
    match c.call(&Request::Revoke { lease: a.lease, qp_first: true }) {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Forbidden, "{e:?}"),
        other => panic!("tenant REVOKE with qp_first answered {other:?}"),
    }
}

#[test]
fn a_qp_reaches_only_its_own_lease() {
    let rig = Rig::start(|b| b);
    let (mut c1, mut c2) = (rig.session(&rig.demo), rig.session(&rig.other));
    let (mut r1, mut r2) = (rig.requester(RcConfig::default()), rig.requester(RcConfig::default()));
    let l1 = lease(&mut c1, &mut r1, 4096);
    let l2 = lease(&mut c2, &mut r2, 4096);
    assert_ne!(l1.remote_addr, l2.remote_addr);
    r2.post_write(1, l2.remote_addr, l2.rkey, &[0x22; 256]).unwrap();
    assert_eq!(one(&mut r2).status, WcStatus::Success);
    r1.post_write(1, l1.remote_addr, l1.rkey, &[0x11; 256]).unwrap();
    assert_eq!(one(&mut r1).status, WcStatus::Success);

    // L1's QP with L2's key and address: L2's MKEY lives in another PD.
    r1.post_write(2, l2.remote_addr, l2.rkey, &[0xEE; 256]).unwrap();
    let w = one(&mut r1);
    assert_eq!((w.wr_id, w.status.name()), (2, "IBV_WC_REM_ACCESS_ERR"), "{w:?}");
    assert_eq!(rig.ram(l2.remote_addr, 256), vec![0x22; 256], "L2 untouched");
    assert_eq!(rig.ram(l1.remote_addr, 256), vec![0x11; 256], "L1 untouched");

    // Reading through L2's QP with L1's key fails the same way; L2's own key still works on a fresh lease QP.
    r2.post_read(2, l1.remote_addr, l1.rkey, 256).unwrap();
    let rd = one(&mut r2);
    assert_eq!((rd.wr_id, rd.status.name()), (2, "IBV_WC_REM_ACCESS_ERR"), "{rd:?}");
    assert_eq!(r2.read_data(2), None);
}

#[test]
fn revoked_memory_is_scrubbed_before_it_is_lent_again() {
    // One 2 MiB extent: the next lease must get the same memory, and only after the sweep scrubbed it.
    let rig = Rig::start(|b| b.lease_pool_mib(2));
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(RcConfig::default());
    let size = 2 << 20;
    let a = lease(&mut c, &mut r, size);
    let data = pattern(64 << 10, 5);
    r.post_write(1, a.remote_addr, a.rkey, &data).unwrap();
    r.post_write(2, a.remote_addr + size - data.len() as u64, a.rkey, &data).unwrap();
    let cs = next(&mut r, 2);
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    assert_eq!(rig.ram(a.remote_addr, data.len()), data);

    assert_eq!(revoke(&mut c, a.lease, false), Outcome::TornDown);
    // While the revoked lease waits for its sweep, its memory is not lent.
    let early = rig.requester(RcConfig::default());
    match c.call(&alloc(&early.local(), size)) {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::NoMemory, "{e:?}"),
        other => panic!("ALLOC during the grace period answered {other:?}"),
    }
    rig.sweep(&mut c, a.lease);
    assert_eq!(rig.ram(a.remote_addr, data.len()), vec![0; data.len()], "scrubbed in RAM");

    // The same tenant, then another tenant, get the same extent back: it reads as zeros through RDMA.
    for who in [&rig.demo, &rig.other] {
        let mut s = rig.session(who);
        let mut rr = rig.requester(RcConfig::default());
        let b = lease(&mut s, &mut rr, size);
        assert_eq!(b.remote_addr, a.remote_addr, "{}: the only extent again", who.name);
        rr.post_read(10, b.remote_addr, b.rkey, data.len() as u32).unwrap();
        rr.post_read(11, b.remote_addr + size - data.len() as u64, b.rkey, data.len() as u32).unwrap();
        let cs = next(&mut rr, 2);
        assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
        assert_eq!(rr.read_data(10).unwrap(), vec![0; data.len()], "{}: first bytes", who.name);
        assert_eq!(rr.read_data(11).unwrap(), vec![0; data.len()], "{}: last bytes", who.name);
        // Dirty it for the next round, then give it back.
        rr.post_write(12, b.remote_addr, b.rkey, &data).unwrap();
        assert_eq!(one(&mut rr).status, WcStatus::Success);
        match s.call(&Request::Free { lease: b.lease }).unwrap() {
            Response::Free { outcome, .. } => assert_eq!(outcome, Outcome::TornDown),
            other => panic!("FREE answered {other:?}"),
        }
        rig.sweep(&mut s, b.lease);
    }
}

#[test]
fn a_4_gib_lease_is_granted_written_at_both_ends_and_revoked() {
    // 2048 extents of 2 MiB: the MKEY's MTT list (16,656 bytes) needs a mailbox chain of 33 blocks. The RAM is
    // a sparse file; the sweep (which would scrub all 4 GiB) waits past the end of the test. `tenant_mib=`
    // lifts the default fair share (half the pool each for the two tenants configured).
    let rig = Rig::start(|b| b.lease_pool_mib(4200).option("tenant_mib", 4200));
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(PATIENT);
    let size = 4u64 << 30;
    let a = lease(&mut c, &mut r, size);
    assert_eq!(a.length, size);
    let (head, tail) = (pattern(4096, 3), pattern(4096, 4));
    let last = a.remote_addr + size - tail.len() as u64;
    r.post_write(1, a.remote_addr, a.rkey, &head).unwrap();
    r.post_write(2, last, a.rkey, &tail).unwrap();
    let cs = next(&mut r, 2);
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    r.post_read(3, a.remote_addr, a.rkey, head.len() as u32).unwrap();
    r.post_read(4, last, a.rkey, tail.len() as u32).unwrap();
    let cs = next(&mut r, 2);
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    assert_eq!((r.read_data(3).unwrap(), r.read_data(4).unwrap()), (head.clone(), tail.clone()));
    // In RAM where the MKEY's first and last MTT entries point.
    let key = rig.hosted().hca().unwrap().platform.model().unwrap().mkey(a.rkey).expect("the lease's MKEY");
    assert_eq!(key.mtt.len(), 2048);
    let at = |va: u64| key.translate(va, 1).unwrap()[0].0;
    assert_eq!(rig.ram(at(a.remote_addr), head.len()), head);
    assert_eq!(rig.ram(at(last), tail.len()), tail);

    assert_eq!(revoke(&mut c, a.lease, false), Outcome::TornDown);
    r.post_write(5, last, a.rkey, &head).unwrap();
    assert_eq!(one(&mut r).status.name(), "IBV_WC_REM_ACCESS_ERR");
    assert_eq!(rig.ram(at(last), tail.len()), tail, "nothing landed after the revoke");
}

#[test]
fn a_tenant_is_stopped_at_its_byte_limit_and_its_stats_are_its_own() {
    // `tenant_mib=4` on the command line: two 2 MiB extents per tenant.
    let rig = Rig::start(|b| b.option("tenant_mib", 4).lease_pool_mib(16));
    let mut c = rig.session(&rig.demo);
    let mut r = rig.requester(RcConfig::default());
    lease(&mut c, &mut r, 2 << 20);
    let mut r2 = rig.requester(RcConfig::default());
    lease(&mut c, &mut r2, 4096);
    let more = rig.requester(RcConfig::default());
    match c.call(&alloc(&more.local(), 4096)) {
        Err(ClientError::Server(e)) => {
            assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
            assert!(e.message.contains("the limit is 4194304"), "{}", e.message);
        }
        other => panic!("ALLOC past the tenant's bytes answered {other:?}"),
    }
    // Another tenant still gets memory.
    let mut o = rig.session(&rig.other);
    let mut ro = rig.requester(RcConfig::default());
    lease(&mut o, &mut ro, 4096);
    let stats = |c: &mut Client| match c.call(&Request::Stats).unwrap() {
        Response::Stats(s) => s,
        other => panic!("STATS answered {other:?}"),
    };
    let mine = stats(&mut c);
    assert_eq!(mine.leases.by_state.iter().sum::<u32>(), 2);
    assert_eq!((mine.leases.bytes_leased, mine.leases.bytes_free, mine.leases.allocs), (4 << 20, 0, 0));
    let theirs = stats(&mut o);
    assert_eq!((theirs.leases.bytes_leased, theirs.leases.bytes_free), (2 << 20, 2 << 20));
    let all = stats(&mut rig.session(&rig.admin));
    assert_eq!(all.leases.by_state.iter().sum::<u32>(), 3);
    assert_eq!((all.leases.bytes_leased, all.leases.bytes_free, all.leases.allocs), (6 << 20, 10 << 20, 3));
}
