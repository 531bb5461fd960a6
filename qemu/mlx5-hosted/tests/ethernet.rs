//! The driver's Ethernet port (`leasebox_mlx5::eth::EthPort`) against the in-process model over the model's
//! UDP wire, with a local UDP socket as the station at the other end of the cable: frames both ways (the
//! port's MAC and broadcast delivered, another unicast MAC not; the reserved lkey and an MKEY), a full send ring
//! dropping and counting, a receive overrun (the model's `out_of_buffer`) the driver recovers from, a link that
//! comes up late (PORT_CHANGE ACTIVE recorded by the event engine), a port taken down and up again through
//! PAOS, the 16-bit ring counters wrapping, every minimal inline mode, an SQ in error flushing a full ring
//! without overrunning its CQ, and `destroy` — also with work outstanding — returning every object and every
//! byte of DMA memory without a DMA fault.
//!
//! The model only runs when the test steps it ([`Rig::step`]: one model pass, the wire, both driver engines),
//! so "before the model processed it" is a fact of the test, not a race. Real time enters only where the model
//! keeps real time (the link-up delay) and through the UDP sockets on loopback; every wait for either is a
//! bounded loop with a generous deadline.

mod common;

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasebox_mlx5::driver::Config;
use leasebox_mlx5::driver::PortState;
use leasebox_mlx5::engine::{Event, SideClient};
use leasebox_mlx5::eth::{BROADCAST, Dropped, EthConfig, EthPort, EthStats, LinkWait, Lkey, LkeySource};
use leasebox_mlx5::ifc;
use leasebox_mlx5::platform::Platform;
use mlx5_hosted::HostedPlatform;
use mlx5_model::eth::EthCounters;
use mlx5_model::eth::wire::EthWire;
use mlx5_model::{ModelConfig, dataplane};

/// The model's default MAC (`ModelConfig::mac`), the port's own.
const PORT_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01];
/// The station's MAC.
const PEER_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02];
/// A unicast MAC that is neither.
const OTHER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x99];
/// IEEE 802 local experimental ethertype: never RoCE, never IP, so nothing but steering looks at it.
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];
/// Bound on every wait for the wire or the model's real-time link delay.
const PATIENCE: Duration = Duration::from_secs(20);
/// Small rings, so filling them takes few frames.
const RING_LOG: u8 = 3;
const RING: usize = 1 << RING_LOG;

/// A `len`-byte frame (≥ 60, so neither side pads it) from `src` to `dst`, its payload counting from `tag`.
fn frame(dst: [u8; 6], src: [u8; 6], tag: u8, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| tag.wrapping_add(i as u8)).collect();
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE);
    f
}

fn eth_config() -> EthConfig {
    EthConfig { log_tx_frames: RING_LOG, log_rx_frames: RING_LOG, ..EthConfig::default() }
}

/// Frames the model has dealt with on receive, whatever became of them.
fn rx_seen(c: &EthCounters) -> u64 {
    c.rx_frames
        + c.rx_runt
        + c.rx_oversize
        + c.rx_link_down
        + c.rx_no_root
        + c.rx_steering_drop
        + c.rx_rq_not_ready
        + c.rx_out_of_buffer
        + c.rx_errors
        + c.rx_roce
}

/// Send WQEs the model has completed, sent or not.
fn tx_done(c: &EthCounters) -> u64 {
    c.tx_frames + c.tx_link_down + c.tx_errors
}

/// Driver, model and cable: the model's end of the wire (`EthWire`, as `--eth-udp` binds it) and the station's
/// socket, each sending to the other on loopback.
struct Rig {
    d: common::Hosted,
    /// The command engine's second submitting side, for the port's maintenance.
    side: SideClient,
    p: Arc<HostedPlatform>,
    wire: EthWire,
    station: UdpSocket,
    /// MKEYs the model held before any port existed.
    mkeys: usize,
}

impl Rig {
    fn new(model: ModelConfig) -> Rig {
        Rig::with_driver(model, common::driver_config())
    }

    fn with_driver(model: ModelConfig, cfg: Config) -> Rig {
        let mut d = common::up_with(model, cfg);
        let side = d.cmd.side_client().expect("the side client");
        let p = d.platform().clone();
        let station = UdpSocket::bind("127.0.0.1:0").expect("bind the station");
        station.set_read_timeout(Some(PATIENCE)).unwrap();
        let wire = EthWire::bind("127.0.0.1:0".parse().unwrap(), station.local_addr().unwrap()).expect("bind the wire");
        let mkeys = p.model().unwrap().hca().mkeys.len();
        Rig { d, side, p, wire, station, mkeys }
    }

    fn counters(&self) -> EthCounters {
        self.p.model().unwrap().eth_counters()
    }

    /// One model pass (doorbells, the link timer), the wire both ways, then both driver engines.
    fn step(&mut self) {
        self.p.relax();
        dataplane::poll_eth(&mut self.p.model().unwrap(), &mut self.wire).expect("the wire");
        self.d.pump();
    }

    /// Steps until `done` holds; panics after [`PATIENCE`].
    fn step_until(&mut self, what: &str, mut done: impl FnMut(&mut Rig) -> bool) {
        let t0 = Instant::now();
        while !done(self) {
            // Wall clock stays: a hang guard only (the model's link timer runs in real time).
            assert!(t0.elapsed() < PATIENCE, "gave up waiting for {what}");
            self.step();
        }
    }

    /// Runs the port's maintenance at `now_ms` and steps until it has nothing in flight.
    fn maintain(&mut self, port: &mut EthPort<HostedPlatform>, now_ms: u64) {
        port.maintain(&mut self.side, now_ms);
        self.step_until("the maintenance commands", |r| {
            port.maintain(&mut r.side, now_ms);
            !port.maintenance_pending()
        });
    }

    /// The station sends `f` onto the cable.
    fn station_send(&self, f: &[u8]) {
        self.station.send_to(f, self.wire.local_addr().unwrap()).expect("station send");
    }

    /// Sends `frames` from the station and steps until the model has dealt with all of them (the driver does
    /// not look at its receive ring meanwhile).
    fn deliver_to_model(&mut self, frames: &[Vec<u8>]) {
        let want = rx_seen(&self.counters()) + frames.len() as u64;
        for f in frames {
            self.station_send(f);
        }
        self.step_until("the model to receive the station's frames", |r| rx_seen(&r.counters()) >= want);
    }

    /// The next datagram the station receives.
    fn station_recv(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 16384];
        let (n, from) = self.station.recv_from(&mut buf).expect("a datagram from the wire");
        assert_eq!(from, self.wire.local_addr().unwrap(), "from the model's end of the wire");
        buf.truncate(n);
        buf
    }

    /// Steps until the model completed `n` more send WQEs than `before`, then reaps them.
    fn drain_tx(&mut self, port: &mut EthPort<HostedPlatform>, before: u64, n: usize) {
        self.step_until("the model to execute the sends", |r| tx_done(&r.counters()) >= before + n as u64);
        self.step();
        port.poll_tx();
    }

    /// Everything the port has received, up to `budget` frames per call, until a call delivers nothing.
    fn receive_all(port: &mut EthPort<HostedPlatform>) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while port.receive(64, |f| got.push(f.to_vec())) > 0 {}
        got
    }

    /// Destroys the port and checks that the model holds none of its objects and all DMA memory came back.
    fn destroy(&mut self, port: EthPort<HostedPlatform>, free_before: u64) {
        port.destroy(&mut self.d).unwrap_or_else(|e| panic!("destroy: {e}"));
        {
            let m = self.p.model().unwrap();
            let e = &m.hca().eth;
            assert!(
                e.sqs.is_empty() && e.rqs.is_empty() && e.tises.is_empty() && e.tirs.is_empty(),
                "the port's queues, TIS and TIR are gone"
            );
            assert!(e.q_counters.is_empty(), "the port's Q counter is gone");
            assert_eq!(m.hca().mkeys.len(), self.mkeys, "the port's MKEYs are gone");
        }
        assert_eq!(self.p.dma_free_bytes(), free_before, "every byte of the port's DMA memory came back");
        assert_eq!(self.p.dma_faults(), 0, "no DMA access outside a live allocation");
    }
}

fn create(r: &mut Rig) -> EthPort<HostedPlatform> {
    EthPort::create(&mut r.d, &eth_config()).unwrap_or_else(|e| panic!("create: {e}"))
}

#[test]
fn frames_cross_the_wire_both_ways_and_steering_admits_the_port_mac_and_broadcast_only() {
    frames_both_ways(LkeySource::Reserved);
}

#[test]
fn frames_cross_the_wire_with_an_mkey_over_the_buffers() {
    frames_both_ways(LkeySource::Mkey);
}

fn frames_both_ways(lkey: LkeySource) {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = EthPort::create(&mut r.d, &EthConfig { lkey, ..eth_config() }).unwrap_or_else(|e| panic!("{e}"));
    match lkey {
        LkeySource::Reserved => assert!(matches!(port.info.lkey, Lkey::Reserved(_)), "{:?}", port.info.lkey),
        LkeySource::Mkey => assert!(matches!(port.info.lkey, Lkey::Mkeys { .. }), "{:?}", port.info.lkey),
    }
    assert_eq!(port.info.mac, PORT_MAC);
    assert_eq!(port.state(), PortState::Active, "no link delay: up once administratively up");
    assert_eq!(port.tx_room(), RING);

    // Sent: each frame arrives as one datagram holding exactly its bytes, in order; `transmit_with` too.
    let sent: Vec<Vec<u8>> = (0..3).map(|i| frame(PEER_MAC, PORT_MAC, 0x10 * i, 60 + 100 * usize::from(i))).collect();
    let before = tx_done(&r.counters());
    for f in &sent {
        port.transmit(f).unwrap();
    }
    let big = frame(BROADCAST, PORT_MAC, 0x77, 1514);
    assert_eq!(port.transmit_with(big.len(), |b| b.copy_from_slice(&big)), Ok(()));
    r.drain_tx(&mut port, before, 4);
    for f in sent.iter().chain([&big]) {
        assert_eq!(&r.station_recv(), f);
    }
    assert_eq!(port.tx_room(), RING, "every slot reaped");

    // Received: to the port's MAC and to broadcast, delivered in order with their exact bytes; to another
    // unicast MAC, dropped by the NIC_RX table.
    let to_port = frame(PORT_MAC, PEER_MAC, 1, 60);
    let to_other = frame(OTHER_MAC, PEER_MAC, 2, 200);
    let to_all = frame(BROADCAST, PEER_MAC, 3, 1514);
    let c0 = r.counters();
    r.deliver_to_model(&[to_port.clone(), to_other, to_all.clone()]);
    let c1 = r.counters();
    assert_eq!((c1.rx_frames - c0.rx_frames, c1.rx_steering_drop - c0.rx_steering_drop), (2, 1));
    assert_eq!(Rig::receive_all(&mut port), vec![to_port, to_all]);

    let s = port.stats();
    assert_eq!(
        s,
        EthStats {
            tx_frames: 4,
            tx_bytes: (60 + 160 + 260 + 1514) as u64,
            rx_frames: 2,
            rx_bytes: (60 + 1514) as u64,
            ..EthStats::default()
        }
    );
    let (sq, rq) = port.query_queues(&mut r.d).unwrap();
    assert_eq!((sq.state, rq.state), (ifc::eth::MLX5_WQ_STATE_RDY, ifc::eth::MLX5_WQ_STATE_RDY));
    r.destroy(port, free_before);
}

#[test]
fn a_full_send_ring_drops_and_counts_and_a_receive_overrun_is_survived() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);

    // Send: the model does not run between these calls, so no completion can free a slot. RING frames fill
    // the ring; the next is dropped (RingFull) and counted, and nothing is rung for it.
    let sent: Vec<Vec<u8>> = (0..RING as u8).map(|i| frame(PEER_MAC, PORT_MAC, i, 64 + usize::from(i))).collect();
    let before = tx_done(&r.counters());
    for f in &sent {
        port.transmit(f).unwrap();
    }
    assert_eq!(port.tx_room(), 0);
    let lost = frame(PEER_MAC, PORT_MAC, 0xee, 90);
    assert_eq!(port.transmit(&lost), Err(Dropped::RingFull));
    assert_eq!(port.transmit_with(90, |b| b.copy_from_slice(&lost)), Err(Dropped::RingFull));
    assert_eq!((port.stats().tx_frames, port.stats().tx_drops), (RING as u64, 2));
    // The model runs: every queued frame goes out, the completions free the ring.
    r.drain_tx(&mut port, before, RING);
    assert_eq!(port.tx_room(), RING);
    for f in &sent {
        assert_eq!(&r.station_recv(), f);
    }
    // The next frame is the next datagram: the dropped ones never reached the wire.
    let after = frame(PEER_MAC, PORT_MAC, 0x55, 70);
    let before = tx_done(&r.counters());
    port.transmit(&after).unwrap();
    r.drain_tx(&mut port, before, 1);
    assert_eq!(r.station_recv(), after);
    assert_eq!(r.counters().tx_frames, RING as u64 + 1);

    // Receive: RING + 3 frames arrive before the driver looks; the model fills every posted buffer and counts
    // the rest as out_of_buffer (no WQE posted).
    let burst: Vec<Vec<u8>> = (0..RING as u8 + 3).map(|i| frame(PORT_MAC, PEER_MAC, i, 60 + usize::from(i))).collect();
    let c0 = r.counters();
    r.deliver_to_model(&burst);
    let c1 = r.counters();
    assert_eq!((c1.rx_frames - c0.rx_frames, c1.rx_out_of_buffer - c0.rx_out_of_buffer), (RING as u64, 3));
    // The driver hands out the first RING in order and reposts their buffers ...
    assert_eq!(Rig::receive_all(&mut port), burst[..RING].to_vec());
    // ... so the ring works again: a full ring's worth more arrives whole.
    let again: Vec<Vec<u8>> = (0..RING as u8).map(|i| frame(BROADCAST, PEER_MAC, 0x80 + i, 100)).collect();
    r.deliver_to_model(&again);
    assert_eq!(r.counters().rx_out_of_buffer, c1.rx_out_of_buffer, "no more drops");
    assert_eq!(Rig::receive_all(&mut port), again);
    let s = port.stats();
    assert_eq!((s.rx_frames, s.rx_drops, s.rx_errors), (2 * RING as u64, 0, 0));
    let (_, rq) = port.query_queues(&mut r.d).unwrap();
    assert_eq!(rq.state, ifc::eth::MLX5_WQ_STATE_RDY, "an overrun is not an error");
    r.destroy(port, free_before);
}

#[test]
fn a_link_that_comes_up_late_is_announced_by_port_change() {
    let delay = Duration::from_millis(1500);
    let mut r = Rig::new(ModelConfig { link_up_delay: delay, ..common::model_config() });
    // The model began training at INIT_HCA; take the port administratively down so that the training `create`
    // starts (its PAOS admin-up write) is the one that counts.
    r.d.exec(ifc::vport::paos_set(1, ifc::vport::MLX5_PORT_DOWN)).unwrap();
    let free_before = r.p.dma_free_bytes();
    let t0 = Instant::now();
    let mut port = create(&mut r);
    assert_eq!(port.state(), PortState::Down, "create does not wait for the link");
    assert_eq!(port.wait_link_up(&mut r.d, 5).unwrap(), LinkWait::NotYet(PortState::Down));
    assert_eq!(port.refresh_state(&mut r.d).unwrap(), PortState::Down);

    // While the link trains, a frame sent is completed but discarded; one received is dropped by the MAC.
    let c0 = r.counters();
    port.transmit(&frame(PEER_MAC, PORT_MAC, 0xd0, 64)).unwrap();
    r.drain_tx(&mut port, tx_done(&c0), 1);
    r.deliver_to_model(&[frame(PORT_MAC, PEER_MAC, 0xd1, 64)]);
    let c1 = r.counters();
    assert!(
        c1.tx_link_down == c0.tx_link_down + 1 && c1.rx_link_down == c0.rx_link_down + 1,
        "both dropped for the link: {c1:?}"
    );
    assert_eq!(Rig::receive_all(&mut port), Vec::<Vec<u8>>::new());
    assert_eq!(port.tx_room(), RING, "the discarded frame still completed");

    // Link up: the model raises PORT_CHANGE ACTIVE; the event engine records it, and the same EQE reaches the
    // client, where `on_event` turns it into the port's state.
    r.step_until("PORT_CHANGE ACTIVE", |r| r.d.client.shared().port_event(1) == Some(PortState::Active));
    // Wall clock stays: the model trains the link on a real-time timer (it has no virtual clock), and this is
    // the driver seeing that delay.
    assert!(t0.elapsed() >= delay, "not before the training delay");
    let mut announced = None;
    while let Some(e) = r.d.next_event() {
        announced = port.on_event(&e).or(announced);
    }
    assert_eq!((announced, port.state()), (Some(PortState::Active), PortState::Active));
    assert_eq!(port.refresh_state(&mut r.d).unwrap(), PortState::Active);
    assert_eq!(port.wait_link_up(&mut r.d, 5).unwrap(), LinkWait::Up);

    // Frames flow both ways now; the station's first datagram is the frame sent after link-up.
    let out = frame(PEER_MAC, PORT_MAC, 0xa0, 80);
    let before = tx_done(&r.counters());
    port.transmit(&out).unwrap();
    r.drain_tx(&mut port, before, 1);
    assert_eq!(r.station_recv(), out);
    let inb = frame(PORT_MAC, PEER_MAC, 0xa1, 80);
    r.deliver_to_model(std::slice::from_ref(&inb));
    assert_eq!(Rig::receive_all(&mut port), vec![inb]);

    // Retrained (admin down, then up): `wait_link_up` with a deadline past the delay polls PAOS until the
    // link is up; the event engine, pumped by every command, records DOWN then ACTIVE meanwhile.
    r.d.exec(ifc::vport::paos_set(1, ifc::vport::MLX5_PORT_DOWN)).unwrap();
    r.step_until("PORT_CHANGE DOWN", |r| r.d.client.shared().port_event(1) == Some(PortState::Down));
    let t1 = Instant::now();
    leasebox_mlx5::eth::port_admin_up(&mut r.d, 1).unwrap();
    assert_eq!(port.wait_link_up(&mut r.d, PATIENCE.as_millis() as u64).unwrap(), LinkWait::Up);
    // Wall clock stays, as above: the model's training delay is real time.
    assert!(t1.elapsed() >= delay, "not before the training delay");
    assert_eq!((port.state(), r.d.client.shared().port_event(1)), (PortState::Active, Some(PortState::Active)));
    r.destroy(port, free_before);
}

#[test]
fn a_port_taken_down_drops_frames_until_it_comes_back() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    assert_eq!(port.state(), PortState::Active);
    let changes = |r: &Rig| r.d.client.shared().port_changes.load(std::sync::atomic::Ordering::Relaxed);
    let changes0 = changes(&r);

    // Administratively down (PAOS write): the link drops at once with PORT_CHANGE DOWN.
    r.d.exec(ifc::vport::paos_set(1, ifc::vport::MLX5_PORT_DOWN)).unwrap();
    r.step_until("PORT_CHANGE DOWN", |r| r.d.client.shared().port_event(1) == Some(PortState::Down));
    assert_eq!(changes(&r), changes0 + 1);
    let mut announced = None;
    while let Some(e) = r.d.next_event() {
        announced = port.on_event(&e).or(announced);
    }
    assert_eq!((announced, port.state()), (Some(PortState::Down), PortState::Down));
    assert_eq!(port.refresh_state(&mut r.d).unwrap(), PortState::Down);

    // Down: nothing is delivered either way (counted by the model), and the driver's rings stay usable.
    let c0 = r.counters();
    let lost_out = frame(PEER_MAC, PORT_MAC, 0xc0, 64);
    port.transmit(&lost_out).unwrap();
    r.drain_tx(&mut port, tx_done(&c0), 1);
    r.deliver_to_model(&[frame(PORT_MAC, PEER_MAC, 0xc1, 64), frame(BROADCAST, PEER_MAC, 0xc2, 64)]);
    let c1 = r.counters();
    assert_eq!((c1.tx_link_down - c0.tx_link_down, c1.rx_link_down - c0.rx_link_down), (1, 2));
    assert_eq!((c1.tx_frames, c1.rx_frames), (c0.tx_frames, c0.rx_frames));
    assert_eq!(Rig::receive_all(&mut port), Vec::<Vec<u8>>::new());

    // Up again (PAOS admin up, no training delay): PORT_CHANGE ACTIVE, and frames flow again.
    leasebox_mlx5::eth::port_admin_up(&mut r.d, 1).unwrap();
    r.step_until("PORT_CHANGE ACTIVE", |r| r.d.client.shared().port_event(1) == Some(PortState::Active));
    assert_eq!(changes(&r), changes0 + 2);
    while let Some(e) = r.d.next_event() {
        port.on_event(&e);
    }
    assert_eq!(port.state(), PortState::Active);
    let out = frame(PEER_MAC, PORT_MAC, 0xb0, 64);
    let before = tx_done(&r.counters());
    port.transmit(&out).unwrap();
    r.drain_tx(&mut port, before, 1);
    assert_eq!(r.station_recv(), out, "the first datagram is the frame sent after the link came back");
    let inb = frame(BROADCAST, PEER_MAC, 0xb1, 64);
    r.deliver_to_model(std::slice::from_ref(&inb));
    assert_eq!(Rig::receive_all(&mut port), vec![inb]);
    assert_eq!(port.stats().tx_errors + port.stats().rx_errors, 0);
    r.destroy(port, free_before);
}

#[test]
fn the_sixteen_bit_ring_counters_wrap_on_both_sides() {
    // Past 65536 frames each way the driver's and the model's 16-bit producer/consumer counters (doorbell
    // records, WQE counters in CQEs) wrap; frames keep flowing in order. No wire here: frames go straight
    // into the model (`eth_receive`) and are taken from its outbox, so the run is quick and exact.
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    let rounds = (1usize << 16) / RING + 3;
    let mut seq = 0u32;
    for _ in 0..rounds {
        let mut out = Vec::with_capacity(RING);
        for _ in 0..RING {
            let mut f = frame(PEER_MAC, PORT_MAC, seq as u8, 64);
            f[14..18].copy_from_slice(&seq.to_be_bytes());
            port.transmit(&f).unwrap();
            out.push(f);
            seq += 1;
        }
        r.p.relax();
        let sent = r.p.model().unwrap().take_eth_frames();
        assert_eq!(sent, out);
        assert_eq!(port.poll_tx(), RING);
        let inb: Vec<Vec<u8>> = out
            .iter()
            .map(|f| {
                let mut g = f.clone();
                g[..6].copy_from_slice(&PORT_MAC);
                g[6..12].copy_from_slice(&PEER_MAC);
                g
            })
            .collect();
        {
            let mut m = r.p.model().unwrap();
            for g in &inb {
                assert_eq!(m.eth_receive(g, &mut |_| {}), mlx5_model::eth::rx::RxOutcome::Delivered);
            }
        }
        assert_eq!(Rig::receive_all(&mut port), inb);
    }
    let s = port.stats();
    assert_eq!(
        (s.tx_frames, s.rx_frames, s.tx_drops + s.rx_drops + s.tx_errors + s.rx_errors),
        (u64::from(seq), u64::from(seq), 0)
    );
    r.destroy(port, free_before);
}

/// An IPv4/UDP frame (IHL 5, UDP to port 9, never RoCE's 4791) of `len` bytes; checksums are left 0 (no
/// offload asked for, and the model does not verify received checksums).
fn udp_frame(dst: [u8; 6], src: [u8; 6], tag: u8, len: usize) -> Vec<u8> {
    let mut f = frame(dst, src, tag, len);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    f[14..34].fill(0);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 2, 2]);
    f[30..34].copy_from_slice(&[10, 0, 2, 15]);
    f[34..42].fill(0);
    f[34..36].copy_from_slice(&1234u16.to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f
}

#[test]
fn every_inline_mode_sends_whole_slots_the_model_accepts() {
    // The vport asks for no inline headers, then IP, then TCP/UDP headers inline: the driver's slots are 1, 2
    // and 4 basic blocks, padded with NOPs; the model checks the inline length on every WQE and would complete
    // a short one in error.
    for mode in [ifc::eth::MLX5_INLINE_MODE_NONE, ifc::eth::MLX5_INLINE_MODE_IP, ifc::eth::MLX5_INLINE_MODE_TCP_UDP] {
        let mut r = Rig::new(ModelConfig { min_wqe_inline_mode: mode, ..common::model_config() });
        let free_before = r.p.dma_free_bytes();
        let mut port = create(&mut r);
        assert_eq!(port.info.inline_mode, mode);
        // Two rings' worth, so the ring wraps with the larger slots; an ARP-like frame and UDP frames mixed.
        for round in 0..2u8 {
            let sent: Vec<Vec<u8>> = (0..RING as u8)
                .map(|i| match i % 3 {
                    0 => frame(PEER_MAC, PORT_MAC, i, 60),
                    _ => udp_frame(PEER_MAC, PORT_MAC, round * 16 + i, 60 + 50 * usize::from(i)),
                })
                .collect();
            let before = tx_done(&r.counters());
            for f in &sent {
                port.transmit(f).unwrap();
            }
            assert_eq!(port.tx_room(), 0);
            r.drain_tx(&mut port, before, RING);
            assert_eq!(port.tx_room(), RING);
            for f in &sent {
                assert_eq!(&r.station_recv(), f, "inline mode {mode}");
            }
        }
        let inb = udp_frame(PORT_MAC, PEER_MAC, 0x42, 300);
        r.deliver_to_model(std::slice::from_ref(&inb));
        assert_eq!(Rig::receive_all(&mut port), vec![inb]);
        assert_eq!((port.stats().tx_errors, r.counters().tx_errors), (0, 0));
        r.destroy(port, free_before);
    }
}

#[test]
fn destroy_with_work_outstanding_returns_everything_and_a_new_port_works() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    // Sends posted and rung but not yet executed (the model has not run since), and received frames never
    // reaped: destroy must not care.
    let sent: Vec<Vec<u8>> = (0..RING as u8).map(|i| frame(PEER_MAC, PORT_MAC, i, 64)).collect();
    for f in &sent {
        port.transmit(f).unwrap();
    }
    let stale = frame(PORT_MAC, PEER_MAC, 0x33, 64);
    {
        let mut m = r.p.model().unwrap();
        for _ in 0..3 {
            assert_eq!(m.eth_receive(&stale, &mut |_| {}), mlx5_model::eth::rx::RxOutcome::Delivered);
        }
    }
    r.destroy(port, free_before);
    // The model ran while destroy's commands did (before DESTROY_SQ): the rung sends went out from buffers
    // that were still live. Nothing more comes once the SQ is gone, and with no root table frames go nowhere.
    for _ in 0..4 {
        r.step();
    }
    for f in &sent {
        assert_eq!(&r.station_recv(), f);
    }
    let c = r.counters();
    for _ in 0..4 {
        r.step();
    }
    assert_eq!(tx_done(&r.counters()), tx_done(&c), "nothing more of the destroyed SQ");
    r.deliver_to_model(&[stale]);
    assert_eq!(r.counters().rx_no_root, c.rx_no_root + 1);

    // A new port on the same driver starts clean: its first datagram and first received frame are new ones.
    let mut port = create(&mut r);
    assert_eq!(port.stats(), EthStats::default());
    let out = frame(PEER_MAC, PORT_MAC, 0x61, 61);
    let before = tx_done(&r.counters());
    port.transmit(&out).unwrap();
    r.drain_tx(&mut port, before, 1);
    assert_eq!(r.station_recv(), out);
    let inb = frame(PORT_MAC, PEER_MAC, 0x62, 62);
    r.deliver_to_model(std::slice::from_ref(&inb));
    assert_eq!(Rig::receive_all(&mut port), vec![inb]);
    r.destroy(port, free_before);
    // And the driver itself still tears down to nothing.
    let report = r.d.teardown().unwrap_or_else(|(rep, e)| panic!("teardown: {e} ({rep:?})"));
    assert_eq!(report.pages_left, 0);
    assert_eq!(r.p.dma_faults(), 0);
}

#[test]
fn a_send_queue_flushed_in_error_completes_every_wqe_without_overrunning_its_cq() {
    // IP inline mode: two basic blocks per slot, and a non-IP frame fills only one, so each slot holds two
    // WQEs (the frame and a NOP asking for the CQE). Rung on an SQ in ERR, a full ring is flushed: every posted
    // WQE gets its own WR_FLUSH_ERR CQE — twice as many CQEs as frames — and the CQ must hold them all (Linux
    // sizes a send CQ by the SQ's basic blocks for this reason).
    let mut r = Rig::new(ModelConfig { min_wqe_inline_mode: ifc::eth::MLX5_INLINE_MODE_IP, ..common::model_config() });
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    let sqn = port.info.sqn;
    r.d.exec(ifc::eth::modify_sq(sqn, ifc::eth::MLX5_WQ_STATE_RDY, ifc::eth::MLX5_WQ_STATE_ERR)).unwrap();
    for i in 0..RING as u8 {
        port.transmit(&frame(PEER_MAC, PORT_MAC, i, 64)).unwrap();
    }
    assert_eq!(port.tx_room(), 0);
    for _ in 0..4 {
        r.step();
    }
    assert_eq!(r.counters().tx_frames, 0);
    assert_eq!(port.poll_tx(), 2 * RING, "one flush CQE per WQE");
    assert_eq!((port.tx_room(), port.stats().tx_errors), (RING, 2 * RING as u64));
    let cq_errors = std::iter::from_fn(|| r.d.next_event())
        .filter(|e| matches!(e, Event::Async(q) if q.event_type == ifc::eq::MLX5_EVENT_TYPE_CQ_ERROR))
        .count();
    assert_eq!(cq_errors, 0, "no CQ overrun");
    let (sq, _) = port.query_queues(&mut r.d).unwrap();
    assert_eq!(sq.state, ifc::eth::MLX5_WQ_STATE_ERR);
    r.destroy(port, free_before);
}

#[test]
fn the_q_counter_reports_an_overrun_exactly_through_maintain() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    let q = port.info.q_counter.expect("the model's max_qp_cnt allows a Q counter");
    assert_eq!(r.p.model().unwrap().hca().eth.rqs[&port.info.rqn].counter_set_id, u32::from(q), "the RQ counts there");

    // RING + 3 frames before the driver looks: 3 dropped for want of a buffer, and only the RQ's Q counter
    // knows. The first maintenance pass reads it.
    let burst: Vec<Vec<u8>> = (0..RING as u8 + 3).map(|i| frame(PORT_MAC, PEER_MAC, i, 64)).collect();
    r.deliver_to_model(&burst);
    r.maintain(&mut port, 0);
    assert_eq!(port.stats().rx_out_of_buffer, 3);
    assert_eq!(Rig::receive_all(&mut port), burst[..RING].to_vec());

    // Five more lost: not read again before the period has passed, then read and added exactly.
    r.deliver_to_model(&(0..RING as u8 + 5).map(|i| frame(PORT_MAC, PEER_MAC, i, 64)).collect::<Vec<_>>());
    assert!(!port.maintain(&mut r.side, leasebox_mlx5::eth::Q_COUNTER_PERIOD_MS - 1), "not due yet");
    assert_eq!(port.stats().rx_out_of_buffer, 3);
    r.maintain(&mut port, leasebox_mlx5::eth::Q_COUNTER_PERIOD_MS);
    assert_eq!(port.stats().rx_out_of_buffer, 8);
    assert_eq!(r.p.model().unwrap().hca().eth.q_counters[&u32::from(q)].out_of_buffer, 8);
    assert_eq!(Rig::receive_all(&mut port).len(), RING);
    // A read with nothing new adds nothing.
    r.maintain(&mut port, 2 * leasebox_mlx5::eth::Q_COUNTER_PERIOD_MS);
    let s = port.stats();
    assert_eq!((s.rx_out_of_buffer, s.maintenance_errors, s.rx_errors), (8, 0, 0));
    r.destroy(port, free_before);
}

#[test]
fn a_port_without_q_counters_goes_without() {
    let mut r = Rig::new(common::model_config());
    // The firmware refuses the allocation (as one with no counter left would).
    r.p.model().unwrap().inject(mlx5_model::fault::Fault::Fail {
        opcode: ifc::eth::MLX5_CMD_OP_ALLOC_Q_COUNTER,
        count: 1,
        status: 0x0f,
        syndrome: 0x1234,
    });
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    assert_eq!(port.info.q_counter, None);
    assert_eq!(r.p.model().unwrap().hca().eth.rqs[&port.info.rqn].counter_set_id, 0);
    assert!(!port.maintain(&mut r.side, 0), "nothing to read");
    let inb = frame(PORT_MAC, PEER_MAC, 1, 64);
    r.deliver_to_model(std::slice::from_ref(&inb));
    assert_eq!(Rig::receive_all(&mut port), vec![inb]);
    r.destroy(port, free_before);
}

#[test]
fn a_send_queue_in_error_is_recovered_and_frames_flow_again() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    // A frame longer than the port's MTU fits a buffer but not the wire: the model completes it with a local
    // length error and puts the SQ in ERR.
    let before = tx_done(&r.counters());
    port.transmit(&frame(PEER_MAC, PORT_MAC, 0, 1600)).unwrap();
    r.drain_tx(&mut port, before, 1);
    assert_eq!(r.counters().tx_errors, 1);
    assert_eq!(port.in_error(), (true, false));
    assert_eq!(port.transmit(&frame(PEER_MAC, PORT_MAC, 1, 64)), Err(Dropped::QueueInError));
    let (sq, _) = port.query_queues(&mut r.d).unwrap();
    assert_eq!(sq.state, ifc::eth::MLX5_WQ_STATE_ERR);

    // Maintenance: QUERY_SQ (ERR), ERR → RST, the ring reset, RST → RDY.
    r.step_until("the SQ recovered", |r| {
        port.maintain(&mut r.side, 0);
        port.stats().tx_recoveries == 1
    });
    assert_eq!(port.in_error(), (false, false));
    let (sq, _) = port.query_queues(&mut r.d).unwrap();
    assert_eq!((sq.state, sq.wq.hw_counter), (ifc::eth::MLX5_WQ_STATE_RDY, 0));
    // Frames flow again, a full ring's worth and more (the ring restarted at counter 0).
    for round in 0..2u8 {
        let sent: Vec<Vec<u8>> = (0..RING as u8).map(|i| frame(PEER_MAC, PORT_MAC, 0x40 * round + i, 70)).collect();
        let before = tx_done(&r.counters());
        for f in &sent {
            port.transmit(f).unwrap();
        }
        r.drain_tx(&mut port, before, RING);
        for f in &sent {
            assert_eq!(&r.station_recv(), f);
        }
    }
    let s = port.stats();
    assert_eq!((s.tx_errors, s.tx_drops, s.tx_recoveries, s.maintenance_errors), (1, 1, 1, 0));
    assert_eq!(r.counters().tx_errors, 1);
    r.destroy(port, free_before);
}

#[test]
fn a_receive_queue_in_error_is_recovered_and_frames_flow_again() {
    let mut r = Rig::new(common::model_config());
    let free_before = r.p.dma_free_bytes();
    let mut port = create(&mut r);
    let inb = frame(PORT_MAC, PEER_MAC, 1, 64);
    r.deliver_to_model(std::slice::from_ref(&inb));
    assert_eq!(Rig::receive_all(&mut port), vec![inb]);
    // Scribble over the next receive WQE's lkey (as a stray write would): the model cannot scatter the next
    // frame, completes it with a protection error and puts the RQ in ERR.
    {
        let m = r.p.model().unwrap();
        let rq = &m.hca().eth.rqs[&port.info.rqn];
        let at = rq.wq.entry_addr(1).unwrap();
        r.p.ram().write(at + 4, &0x00de_ad00u32.to_be_bytes()).unwrap();
    }
    r.deliver_to_model(&[frame(PORT_MAC, PEER_MAC, 2, 64)]);
    assert_eq!(r.counters().rx_errors, 1);
    assert_eq!(Rig::receive_all(&mut port), Vec::<Vec<u8>>::new());
    assert_eq!(port.in_error(), (false, true));
    let (_, rq) = port.query_queues(&mut r.d).unwrap();
    assert_eq!(rq.state, ifc::eth::MLX5_WQ_STATE_ERR);
    // Frames arriving meanwhile are dropped by the model (the RQ is not ready).
    r.deliver_to_model(&[frame(PORT_MAC, PEER_MAC, 3, 64)]);
    assert_eq!(r.counters().rx_rq_not_ready, 1);

    r.step_until("the RQ recovered", |r| {
        port.maintain(&mut r.side, 0);
        port.stats().rx_recoveries == 1
    });
    assert_eq!(port.in_error(), (false, false));
    let (_, rq) = port.query_queues(&mut r.d).unwrap();
    assert_eq!(rq.state, ifc::eth::MLX5_WQ_STATE_RDY);
    // Every buffer is posted again, with its WQE rewritten: two full rings' worth arrive whole.
    for round in 0..2u8 {
        let again: Vec<Vec<u8>> = (0..RING as u8).map(|i| frame(PORT_MAC, PEER_MAC, 0x40 * round + i, 90)).collect();
        r.deliver_to_model(&again);
        assert_eq!(Rig::receive_all(&mut port), again);
    }
    let s = port.stats();
    assert_eq!((s.rx_errors, s.rx_recoveries, s.maintenance_errors, s.rx_frames), (1, 1, 0, 1 + 2 * RING as u64));
    assert_eq!(r.counters().rx_out_of_buffer, 0);
    r.destroy(port, free_before);
}

#[test]
fn fatal_health_fails_a_maintenance_command_in_flight_and_stops_maintenance() {
    let cfg = Config { health_interval_ms: 50, cmd_timeout_ms: Some(60_000), ..common::driver_config() };
    let mut r = Rig::with_driver(common::model_config(), cfg);
    let mut port = create(&mut r);
    r.p.model().unwrap().inject(mlx5_model::fault::Fault::Hang { opcode: ifc::eth::MLX5_CMD_OP_QUERY_Q_COUNTER });
    assert!(port.maintain(&mut r.side, 0), "the Q counter query goes out");
    r.step_until("the query in flight", |r| r.d.cmd.queue().in_flight() == 1);
    r.p.model().unwrap().inject(mlx5_model::fault::Fault::HealthFatal { synd: 0x8, rfr: false });
    r.step_until("the query to fail", |r| {
        port.maintain(&mut r.side, 0);
        !port.maintenance_pending()
    });
    // Failed by the verdict, not by the 60 s command timeout: no command timed out.
    assert_eq!(r.d.cmd.queue().log().counters.timeouts, 0, "at once, not after the 60 s command timeout");
    assert_eq!(port.stats().maintenance_errors, 1);
    assert_eq!(r.side.fatal(), Some(0x8));
    // Nothing more is submitted once the HCA is dead, however much time passes.
    let submitted = r.d.cmd.queue().log().counters.submitted;
    for t in 1..5 {
        port.maintain(&mut r.side, t * leasebox_mlx5::eth::Q_COUNTER_PERIOD_MS);
        r.step();
    }
    assert!(!port.maintenance_pending());
    assert_eq!(r.d.cmd.queue().log().counters.submitted, submitted);
}
