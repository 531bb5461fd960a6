//! The software RoCEv2 requester (`leasectl::rdma::SoftRoce`) against the real ConnectX-5 model in-process:
//! the native driver (hosted) brings the model up and creates the appliance side (PD, MTT MKEY, CQ, RC QP
//! connected toward our QP); a thread pumps the model's UDP responder (`dataplane::poll_udp`). Covers a
//! multi-packet WRITE, READ back, both revoke orders (MKEY first → REM_ACCESS_ERR; QP first → RETRY_EXC_ERR).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_mlx5::Platform;
use leasebox_mlx5::driver::{Config, Driver};
use leasebox_mlx5::handles::{Mkey, Qpn};
use leasebox_mlx5::ifc::mkey::MkeyAccess;
use leasebox_mlx5::ifc::qp::{Mtu, QpAccess, RcPeer, RtsParams};
use leasebox_mlx5::objects::{Cq, RcQp, RcQpSizes};
use leasectl::rdma::{Completion, QpEndpoint, RcConfig, Requester, SoftConfig, SoftRoce, WcStatus, gid_from_ipv4};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;
use mlx5_model::roce::udp::UdpResponder;

const LEN: usize = 8192;
/// The appliance's address in frames (its GID in the ALLOC reply would carry it).
const APPLIANCE_IP: [u8; 4] = [192, 0, 2, 1];

struct Appliance {
    d: Driver<HostedPlatform>,
    qp: RcQp,
    _cq: Cq,
    mkey: Mkey,
    buf: u64,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
}

impl Drop for Appliance {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.pump.take() {
            let _ = h.join();
        }
    }
}

/// Brings the model up, creates the appliance side toward `peer` (our requester), starts the UDP pump and
/// returns the appliance with the endpoint it would answer in ALLOC.
fn appliance(peer: &QpEndpoint) -> (Appliance, QpEndpoint, std::net::SocketAddr) {
    let p = Arc::new(HostedPlatform::with_model(ModelConfig::instant(), 128 << 20, ModelMode::InProcess));
    let cfg =
        Config { part: "ConnectX-5", pre_init_timeout_ms: 2_000, cmd_timeout_ms: Some(2_000), ..Config::default() };
    let mut d = Driver::bring_up(p.clone(), cfg).unwrap_or_else(|e| panic!("bring-up: {e}"));
    // GID 0: the appliance's RoCEv2 address (the table starts empty).
    d.roce_gid(0, APPLIANCE_IP).unwrap();
    let pd = d.alloc_pd().unwrap();
    let buf = p.dma_alloc(LEN, 4096).unwrap().addr();
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let mkey = d.create_mkey(pd, buf, LEN as u64, access, 12, &[buf, buf + 4096]).unwrap();
    let cq = d.create_cq(6).unwrap();
    let qp = d.create_rc_qp(pd, cq.cqn, RcQpSizes::default()).unwrap();
    d.qp_rst2init(&qp, QpAccess { remote_read: true, remote_write: true, remote_atomic: false }).unwrap();
    let rc_peer = RcPeer {
        qpn: Qpn(peer.qpn),
        psn: peer.psn,
        gid: peer.gid,
        mac: peer.mac,
        mtu: Mtu::Mtu1024,
        sgid_index: 0,
        hop_limit: 64,
        udp_sport: 0xC000,
        tclass: 0,
        eth_prio: 0,
        log_rra_max: 4,
        min_rnr_nak: 0,
    };
    d.qp_init2rtr(&qp, &rc_peer).unwrap();
    let rts = RtsParams { psn: 0x00AB_CDEF, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 4 };
    d.qp_rtr2rts(&qp, &rts).unwrap();

    let mut udp = UdpResponder::bind("127.0.0.1:0", Duration::from_millis(1)).unwrap();
    udp.set_nonblocking(true).unwrap();
    let addr = udp.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (s, pp) = (stop.clone(), p.clone());
    let pump = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let n = match pp.model() {
                Some(mut m) => mlx5_model::dataplane::poll_udp(&mut m, &mut udp).unwrap(),
                None => 0,
            };
            if n == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    });
    let remote = QpEndpoint {
        qpn: qp.qpn().0,
        psn: rts.psn,
        gid: gid_from_ipv4(APPLIANCE_IP.into()),
        mac: d.info.mac,
        mtu: 1024,
    };
    (Appliance { d, qp, _cq: cq, mkey, buf, stop, pump: Some(pump) }, remote, addr)
}

/// A requester, an appliance connected to it, and our side connected back.
fn connected(rc: RcConfig) -> (SoftRoce, Appliance) {
    // The model's address is known only once it is bound; bind it first through a throw-away requester
    // config, then point ours at it.
    let probe = SoftRoce::new(SoftConfig { rc, psn: Some(0xFF_FFF0), ..SoftConfig::default() }).unwrap();
    let (app, remote, model_addr) = appliance(&probe.local());
    let me = probe.local();
    drop(probe);
    let cfg = SoftConfig { peer: model_addr, rc, qpn: Some(me.qpn), psn: Some(me.psn), ..SoftConfig::default() };
    let mut r = SoftRoce::new(cfg).unwrap();
    r.connect(&remote).unwrap();
    (r, app)
}

/// The next `n` completions, in order.
fn next(r: &mut SoftRoce, n: usize, budget: Duration) -> Vec<Completion> {
    let end = Instant::now() + budget;
    let mut all = Vec::new();
    while all.len() < n {
        assert!(Instant::now() < end, "{} of {n} completions within {budget:?}", all.len());
        all.extend(r.poll(Duration::from_millis(50)));
    }
    assert_eq!(all.len(), n, "{all:?}");
    all
}

fn one(r: &mut SoftRoce, budget: Duration) -> Completion {
    next(r, 1, budget)[0]
}

/// Transport timer 4.096 µs × 2^18 ≈ 1.07 s: on loopback only a lost packet or a missing answer lets it expire,
/// never a busy machine; so "no timeout" is a fact about the responder, not about scheduling.
fn patient() -> RcConfig {
    RcConfig { timeout: 18, ..RcConfig::default() }
}

fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0]).collect()
}

#[test]
fn write_8k_lands_in_ram_and_reads_back() {
    let (mut r, app) = connected(patient());
    let data = pattern();
    r.post_write(1, app.buf, app.mkey.0, &data).unwrap();
    let c = one(&mut r, Duration::from_secs(2));
    assert_eq!((c.wr_id, c.status, c.byte_len), (1, WcStatus::Success, LEN as u32), "{c:?}");
    assert_eq!(r.stats().packets_sent, 8, "8 KiB at MTU 1024 is 8 packets (PSNs wrap past 0xFFFFFF)");
    let mut ram = vec![0u8; LEN];
    app.d.platform().ram().read(app.buf, &mut ram).unwrap();
    assert_eq!(ram, data);

    r.post_read(2, app.buf, app.mkey.0, LEN as u32).unwrap();
    let c = one(&mut r, Duration::from_secs(2));
    assert_eq!((c.wr_id, c.status, c.byte_len), (2, WcStatus::Success, LEN as u32), "{c:?}");
    assert_eq!(r.read_data(2).unwrap(), data);
    assert_eq!(r.counters().frames_bad, 0);
    assert_eq!(r.stats().timeouts, 0);
}

#[test]
fn mkey_first_revoke_gives_rem_access_err_before_any_retry_timer() {
    let rc = patient();
    let (mut r, mut app) = connected(rc);
    r.post_write(1, app.buf, app.mkey.0, &[7; 64]).unwrap();
    assert_eq!(one(&mut r, Duration::from_secs(5)).status, WcStatus::Success);
    app.d.destroy_mkey(app.mkey).unwrap();
    let before = r.stats();
    r.post_write(2, app.buf, app.mkey.0, &[8; 64]).unwrap();
    r.post_write(3, app.buf, app.mkey.0, &[9; 64]).unwrap();
    let c = next(&mut r, 2, Duration::from_secs(5));
    assert_eq!(c[0].status.name(), "IBV_WC_REM_ACCESS_ERR", "{c:?}");
    assert_eq!(c[0].wr_id, 2);
    assert_eq!((c[1].wr_id, c[1].status), (3, WcStatus::WrFlushErr));
    // The NAK answered the first transmission, before a single transport timer expired: counted, not timed
    // (a descheduled model thread makes the answer late, not a timer fire).
    let s = r.stats();
    assert_eq!((s.naks - before.naks, s.timeouts - before.timeouts), (1, 0), "{before:?} -> {s:?}");
}

#[test]
fn qp_first_revoke_gives_retry_exc_err_after_the_retries() {
    // timeout 12: 4.096 µs × 4096 ≈ 16.8 ms per attempt, 1 + 7 attempts ≈ 134 ms: short, yet a model thread
    // descheduled for tens of ms on a busy machine does not fail the first WRITE by the retry timer.
    let rc = RcConfig { timeout: 12, retry_cnt: 7, ..RcConfig::default() };
    let (mut r, mut app) = connected(rc);
    r.post_write(1, app.buf, app.mkey.0, &[7; 64]).unwrap();
    assert_eq!(one(&mut r, Duration::from_secs(5)).status, WcStatus::Success);
    app.d.qp_to_err(&app.qp).unwrap();
    // The counters are cumulative: on a busy machine the first WRITE may have been resent once already.
    let before = r.stats();
    let t0 = Instant::now();
    r.post_write(2, app.buf, app.mkey.0, &[8; 64]).unwrap();
    let c = one(&mut r, Duration::from_secs(5));
    assert_eq!(c.status.name(), "IBV_WC_RETRY_EXC_ERR", "{c:?}");
    // Silence: no NAK; the packet went out once per attempt and each attempt's timer expired.
    let s = r.stats();
    let attempts = u64::from(rc.retry_cnt) + 1;
    assert_eq!(s.naks - before.naks, 0, "{before:?} -> {s:?}");
    assert_eq!((s.timeouts - before.timeouts, s.packets_sent - before.packets_sent), (attempts, attempts), "{s:?}");
    // 8 whole periods at least. Wall clock, and it stays: a lower bound (load only makes the completion
    // later, so it cannot fail spuriously) on the real timer's expiries. That the timer and not the poll budget
    // ended it is the RETRY_EXC_ERR status and the expiry count above; the exact schedule is checked in virtual
    // time in rc.rs.
    let took = c.at.duration_since(t0);
    assert!(took >= rc.transport_timeout().unwrap() * 8, "{took:?}");
    let mut ram = [0u8; 64];
    app.d.platform().ram().read(app.buf, &mut ram).unwrap();
    assert_eq!(ram, [7; 64], "the write after 2ERR never landed");
}
