//! Fail closed on crash, hosted (docs/revoke-semantics.md, "Fail closed on crash"): the
//! appliance with the device model in process (`--hca --udp`), a lease Active and a software RC requester
//! (`leasectl::rdma::SoftRoce`, the verifier's requester) whose WRITE succeeds; then the image's fatal path as
//! the panic handler runs it — the port-down command from the command queue's emergency slot, then bus
//! mastering cleared — and the next WRITE to the same lease gets no answer and changes no byte. Each step is
//! also shown to be enough on its own: the port-down command is what the QEMU rig's model can observe, bus
//! mastering what a real ConnectX-5 obeys whatever its firmware does.
//!
//! The data path runs in real time; what is asserted are counts (NAKs, timer expiries), not durations.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasebox_hosted::Hosted;
use leasebox_hosted::hca::FailClosed;
use leasebox_mlx5::cmdq::EmergencyOutcome;
use leasebox_proto::{AllocReq, AllocResp, LeaseState, Request, Response, access, mtu_bytes};
use leasectl::rdma::{Completion, QpEndpoint, RcConfig, Requester, SoftConfig, SoftRoce, WcStatus, mtu_enum};
use leasectl::{Client, Credentials, Timeouts};

/// Transport timer 4.096 µs × 2^12 ≈ 16.8 ms; 8 attempts ≈ 134 ms of silence before RETRY_EXC_ERR.
const RC: RcConfig = RcConfig { timeout: 12, retry_cnt: 7, rnr_retry: 7, max_wr: 16, max_pkts: 256 };
const HANG: Duration = Duration::from_secs(30);
const LEN: usize = 4096;

struct Rig {
    h: leasebox_hosted::testing::Rig,
    demo: Credentials,
    udp: SocketAddr,
}

impl Rig {
    fn start() -> Rig {
        let h = leasebox_hosted::testing::Rig::builder().model().tenant("demo").start().unwrap();
        let udp = h.udp().expect("--udp gives the responder an address");
        let demo = Credentials { name: "demo".into(), key: h.key("demo").bytes().to_vec() };
        Rig { h, demo, udp }
    }

    fn hosted(&self) -> &Hosted {
        &self.h
    }

    fn ram(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.hosted().hca().unwrap().platform.ram().read(addr, &mut buf).unwrap();
        buf
    }

    /// A session, an Active lease of [`LEN`] bytes and a requester connected to it whose first WRITE landed.
    fn live_lease(&self) -> (Client, SoftRoce, AllocResp, Vec<u8>) {
        let addr = self.hosted().addr().to_string();
        let mut c = Client::connect_and_hello(&addr, &self.demo, Timeouts::all(Duration::from_secs(5))).unwrap().0;
        let mut r = SoftRoce::new(SoftConfig { peer: self.udp, rc: RC, ..SoftConfig::default() }).unwrap();
        let me = r.local();
        let req = Request::Alloc(AllocReq {
            size: LEN as u64,
            access: access::REMOTE_READ | access::REMOTE_WRITE,
            mtu: mtu_enum(me.mtu).unwrap(),
            ttl_ms: 0,
            client_qpn: me.qpn,
            client_psn: me.psn,
            client_gid: me.gid,
            client_mac: me.mac,
        });
        let a = match c.call(&req).unwrap() {
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
        let data: Vec<u8> = (0..LEN as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 | 1).collect();
        r.post_write(1, a.remote_addr, a.rkey, &data).unwrap();
        let w = one(&mut r);
        assert_eq!((w.wr_id, w.status), (1, WcStatus::Success), "{w:?}");
        assert_eq!(self.ram(a.remote_addr, LEN), data, "the WRITE with the lease live landed");
        (c, r, a, data)
    }

    /// The next WRITE to the lease: no answer at all (no NAK, every attempt's timer expired), and the lease's
    /// memory still holds `data`.
    fn assert_unreachable(&self, r: &mut SoftRoce, a: &AllocResp, data: &[u8]) {
        let before = r.stats();
        r.post_write(2, a.remote_addr, a.rkey, &vec![0xee; LEN]).unwrap();
        let w = one(r);
        assert_eq!((w.wr_id, w.status), (2, WcStatus::RetryExcErr), "{w:?}");
        let s = r.stats();
        let attempts = u64::from(RC.retry_cnt) + 1;
        assert_eq!((s.naks - before.naks, s.timeouts - before.timeouts), (0, attempts), "silence, not a NAK: {s:?}");
        assert_eq!(self.ram(a.remote_addr, LEN), data, "nothing written after the fatal path");
    }
}

fn one(r: &mut SoftRoce) -> Completion {
    let end = Instant::now() + HANG;
    loop {
        if let Some(c) = r.poll(Duration::from_millis(20)).first() {
            return *c;
        }
        assert!(Instant::now() < end, "no completion within {HANG:?}");
    }
}

#[test]
fn the_fatal_path_stops_the_responder_serving_a_live_lease() {
    let rig = Rig::start();
    let (_c, mut r, a, data) = rig.live_lease();
    let hca = rig.hosted().hca().unwrap();
    assert_eq!(
        hca.fail_closed(),
        FailClosed {
            port_down: Some(EmergencyOutcome::Completed { delivery: 0, status: 0 }),
            bus_master_cleared: true
        }
    );
    rig.assert_unreachable(&mut r, &a, &data);
}

/// What the QEMU rig relies on (its model cannot see the ivshmem function's bus mastering): the driver's
/// emergency PAOS write alone takes the port down, and the port serves nothing.
#[test]
fn the_port_down_command_alone_stops_the_responder() {
    let rig = Rig::start();
    let (_c, mut r, a, data) = rig.live_lease();
    let hca = rig.hosted().hca().unwrap();
    assert_eq!(hca.port_down(), Some(EmergencyOutcome::Completed { delivery: 0, status: 0 }));
    let m = hca.platform.model().unwrap();
    assert_eq!(
        (m.hca().port.admin_status, m.hca().port.oper_status, m.bus_master()),
        (mlx5_model::port::PORT_DOWN, mlx5_model::port::PORT_DOWN, true)
    );
    drop(m);
    rig.assert_unreachable(&mut r, &a, &data);
}

/// What a real ConnectX-5 obeys whatever its firmware does: with bus mastering cleared (and the port left up)
/// no request reaches memory.
#[test]
fn bus_mastering_cleared_alone_stops_the_responder() {
    let rig = Rig::start();
    let (_c, mut r, a, data) = rig.live_lease();
    assert!(rig.hosted().hca().unwrap().platform.set_bus_master(false));
    rig.assert_unreachable(&mut r, &a, &data);
}
