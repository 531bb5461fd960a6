//! The port's Ethernet function through the command queue and the UDP wire (test-side driver in `common`,
//! builders here written from `mlx5_ifc.h` / `qp.h` / `device.h` offsets independently of the model's code):
//! bring-up (TD, TIS, CQs, SQ, RQ, TIR, NIC_RX flow table and root), sends read from the wire, frames from the
//! wire read from the RQ, and the refusals.

mod common;
mod support_qp;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::{Drv, QBUF, be32, cmd, create_cq_in, create_eq_cq, create_mkey_in, put32};
use mlx5_model::ModelConfig;
use mlx5_model::eth::rx::RxOutcome;
use mlx5_model::eth::wire::EthWire;
use mlx5_model::mem::Memory;
use support_qp::{alloc, alloc_pd, alloc_uar, getf, setf};

const BAD_PARAM: u8 = 0x03;
const BAD_RES_STATE: u8 = 0x09;

/// Queue memory above the pages `bring_up` gives (they end near 52 MiB) and below the EQ/CQ area (`QBUF`).
const SQ_RING: u64 = 0x380_0000;
const RQ_RING: u64 = 0x381_0000;
const SQ_DBR: u64 = 0x382_0000;
const RQ_DBR: u64 = 0x382_0040;
const TX_BUF: u64 = 0x383_0000;
const RX_BUF: u64 = 0x384_0000;
const BUF_END: u64 = 0x386_0000;
/// The receive CQ (the send CQ is `create_eq_cq`'s at QBUF + 0x1000).
const RX_CQ_RING: u64 = QBUF + 0x2000;
const RX_CQ_DBR: u64 = QBUF + 0x10_0040;
const TX_CQ_RING: u64 = QBUF + 0x1000;
const PORT_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01];
const PEER_MAC: [u8; 6] = [0x52, 0x55, 0x0a, 0x00, 0x02, 0x02];

/// Everything the bring-up made.
#[derive(Clone, Copy, Debug)]
struct Eth {
    uar: u32,
    pd: u32,
    td: u32,
    lkey: u32,
    tx_cq: u32,
    rx_cq: u32,
    tis: u32,
    sqn: u32,
    rqn: u32,
    tir: u32,
    table: u32,
    q_counter: u32,
}

/// The link up at once: these tests are about the data path (link training has its own, below and in
/// `tests/port.rs`).
fn config() -> ModelConfig {
    ModelConfig::instant()
}

fn create_tis_in(td: u32) -> Vec<u8> {
    let mut c = cmd(0x912, 0, 0xc0);
    setf(&mut c, 0x100 + 0x128, 24, td);
    c
}

/// `create_sq_in` / `create_rq_in` with its `wq` (at byte 0x50): cyclic, one PAS page at `ring`.
fn queue_in(opcode: u16, pd: u32, uar: u32, dbr: u64, ring: u64, log_stride: u32, log_size: u32) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 0x118);
    let wq = 0x280;
    setf(&mut c, wq, 4, 1);
    setf(&mut c, wq + 0x48, 24, pd);
    setf(&mut c, wq + 0x68, 24, uar);
    c[0x60..0x68].copy_from_slice(&dbr.to_be_bytes());
    setf(&mut c, wq + 0x10c, 4, log_stride);
    setf(&mut c, wq + 0x11b, 5, log_size);
    c[0x110..0x118].copy_from_slice(&ring.to_be_bytes());
    c
}

/// CREATE_SQ: 64 WQEBBs, flush in error, L2 inline, on `cqn` and `tis`.
fn create_sq_in(e: &Eth) -> Vec<u8> {
    let mut c = queue_in(0x904, e.pd, e.uar, SQ_DBR, SQ_RING, 6, 6);
    setf(&mut c, 0x100 + 3, 1, 1);
    setf(&mut c, 0x100 + 5, 3, 1);
    setf(&mut c, 0x100 + 0x48, 24, e.tx_cq);
    setf(&mut c, 0x100 + 0x100, 16, 1);
    setf(&mut c, 0x100 + 0x168, 24, e.tis);
    c
}

/// CREATE_RQ: 16 WQEs of one data segment, VLAN stripping off, flush in error, counting into `q_counter`.
fn create_rq_in(e: &Eth) -> Vec<u8> {
    let mut c = queue_in(0x908, e.pd, 0, RQ_DBR, RQ_RING, 4, 4);
    setf(&mut c, 0x100 + 3, 1, 1);
    setf(&mut c, 0x100 + 0xd, 1, 1);
    setf(&mut c, 0x100 + 0x48, 24, e.rx_cq);
    setf(&mut c, 0x100 + 0x60, 8, e.q_counter);
    c
}

/// QUERY_Q_COUNTER `out_of_buffer` (bit 0x180 of the 0x100-byte output), clearing it when `clear`.
fn out_of_buffer(d: &mut Drv, id: u32, clear: bool) -> u32 {
    let mut c = cmd(0x773, 0, 0x20);
    setf(&mut c, 0xc0, 1, clear.into());
    setf(&mut c, 0xf8, 8, id);
    be32(&d.ok(&c, 0x100), 0x30)
}

/// MODIFY_SQ (0x905) / MODIFY_RQ (0x909) from `cur` to `next`.
fn modify_in(opcode: u16, n: u32, cur: u32, next: u32) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 0x110);
    setf(&mut c, 0x40, 4, cur);
    setf(&mut c, 0x48, 24, n);
    setf(&mut c, 0x100 + 8, 4, next);
    c
}

fn number_in(opcode: u16, n: u32) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 16);
    setf(&mut c, 0x48, 24, n);
    c
}

fn create_tir_in(td: u32, rqn: u32) -> Vec<u8> {
    let mut c = cmd(0x900, 0, 0x110);
    setf(&mut c, 0x100 + 0xe8, 24, rqn);
    setf(&mut c, 0x100 + 0x120, 4, 1); // rx_hash_fn INVERTED_XOR8, as Linux sets it on direct TIRs
    setf(&mut c, 0x100 + 0x128, 24, td);
    c
}

fn number(out: &[u8]) -> u32 {
    be32(out, 8) & 0xff_ffff
}

/// A NIC_RX table (level 0, 4 entries) with one group matching the outer destination MAC, and entries
/// forwarding the port's MAC and broadcast to `tir`.
fn steering(d: &mut Drv, tir: u32) -> u32 {
    steering_at(d, tir, 0)
}

fn steering_at(d: &mut Drv, tir: u32, level: u32) -> u32 {
    let mut t = cmd(0x930, 0, 0x40);
    setf(&mut t, 0xc8, 8, level);
    setf(&mut t, 0xd8, 8, 2);
    let table = number(&d.ok(&t, 16));
    let mut g = cmd(0x933, 0, 0x400);
    setf(&mut g, 0xa8, 24, table);
    setf(&mut g, 0x120, 32, 3);
    setf(&mut g, 0x1f8, 8, 1);
    setf(&mut g, 0x200 + 0x40, 32, 0xffff_ffff);
    setf(&mut g, 0x200 + 0x60, 16, 0xffff);
    let group = number(&d.ok(&g, 16));
    for (index, mac) in [(0u32, PORT_MAC), (1, [0xff; 6])] {
        let mut f = cmd(0x936, 0, 0x348);
        setf(&mut f, 0xa8, 24, table);
        setf(&mut f, 0x100, 32, index);
        setf(&mut f, 0x220, 32, group);
        setf(&mut f, 0x270, 16, 0x4);
        setf(&mut f, 0x288, 24, 1);
        setf(&mut f, 0x440, 32, u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]]));
        setf(&mut f, 0x460, 16, u32::from(u16::from_be_bytes([mac[4], mac[5]])));
        put32(&mut f, 0x340, (2 << 24) | tir);
        d.ok(&f, 16);
    }
    table
}

fn set_root(d: &mut Drv, table: u32) {
    let mut r = cmd(0x92f, 0, 0x40);
    setf(&mut r, 0xa8, 24, table);
    d.ok(&r, 16);
}

/// The whole bring-up; `root` sets the NIC_RX root.
fn bring_up(d: &mut Drv, root: bool) -> Eth {
    d.bring_up();
    let pd = alloc_pd(d);
    let uar = alloc_uar(d);
    let td = alloc(d, 0x816);
    let (eqn, tx_cq) = create_eq_cq(d, uar);
    let rx_cq = number(&d.ok(&create_cq_in(6, uar, eqn, RX_CQ_RING, RX_CQ_DBR), 16));
    // Linux initialises every CQE's op_own to 0xf0 (opcode INVALID); so do we, to see what is written.
    for ring in [TX_CQ_RING, RX_CQ_RING] {
        for i in 0..64 {
            d.ram.write(ring + 64 * i + 63, &[0xf0]).unwrap();
        }
    }
    let index = number(&d.ok(&create_mkey_in(pd, 0, TX_BUF, BUF_END - TX_BUF, &[]), 16));
    let q_counter = getf(&d.ok(&cmd(0x771, 0, 16), 16), 0x58, 8);
    let mut e = Eth {
        uar,
        pd,
        td,
        lkey: (index << 8) | 0x5a,
        tx_cq,
        rx_cq,
        tis: 0,
        sqn: 0,
        rqn: 0,
        tir: 0,
        table: 0,
        q_counter,
    };
    e.tis = number(&d.ok(&create_tis_in(td), 16));
    e.sqn = number(&d.ok(&create_sq_in(&e), 16));
    e.rqn = number(&d.ok(&create_rq_in(&e), 16));
    d.ok(&modify_in(0x909, e.rqn, 0, 1), 16);
    e.tir = number(&d.ok(&create_tir_in(td, e.rqn), 16));
    e.table = steering(d, e.tir);
    if root {
        set_root(d, e.table);
    }
    e
}

fn sq_ready(d: &mut Drv, e: &Eth) {
    d.ok(&modify_in(0x905, e.sqn, 0, 1), 16);
}

/// A broadcast-free IPv4/UDP frame from the port to the peer, `len` bytes.
fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = Vec::from(dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    f.extend_from_slice(&[0x45, 0, (ip_len >> 8) as u8, ip_len as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 2, 15, 10, 0, 2, 2, 0x30, 0x39, 0x00, 0x35]);
    let udp_len = ip_len - 20;
    f.extend_from_slice(&[(udp_len >> 8) as u8, udp_len as u8, 0, 0]);
    while f.len() < len {
        f.push(f.len() as u8);
    }
    f
}

/// Posts one SEND WQE at producer counter `pc`: `inline` bytes of the frame inline, the rest in one data
/// segment from TX_BUF with `lkey`; a CQE requested. Writes the doorbell record and the BlueFlame register.
fn post_send(d: &Drv, e: &Eth, pc: u16, f: &[u8], inline: usize, lkey: u32) {
    let w = write_send(d, SqMem { sqn: e.sqn, ring: SQ_RING, dbr: SQ_DBR }, pc, f, inline, lkey, 0);
    ring(d, e.uar, &w);
}

/// Where an SQ's ring and doorbell record are.
#[derive(Clone, Copy)]
struct SqMem {
    sqn: u32,
    ring: u64,
    dbr: u64,
}

/// Writes the BlueFlame register of `uar` with the first 8 bytes of the control segment `w`.
fn ring(d: &Drv, uar: u32, w: &[u8]) {
    d.bar.write(u64::from(uar) * 4096 + 0x800, &w[..8]).unwrap();
}

/// Writes a SEND WQE (with `cs_flags`) and the doorbell record, without ringing; returns the WQE.
fn write_send(d: &Drv, q: SqMem, pc: u16, f: &[u8], inline: usize, lkey: u32, cs_flags: u8) -> [u8; 64] {
    d.ram.write(TX_BUF, f).unwrap();
    let mut w = [0u8; 64];
    let rest = inline.saturating_sub(2);
    let data_at = 32 + rest.div_ceil(16) * 16;
    let ds = (data_at / 16 + 1) as u32;
    put32(&mut w, 0, (u32::from(pc) << 8) | 0x0a);
    put32(&mut w, 4, (q.sqn << 8) | ds);
    w[11] = 0x08;
    w[20] = cs_flags;
    w[28..30].copy_from_slice(&(inline as u16).to_be_bytes());
    w[30..30 + inline.min(2)].copy_from_slice(&f[..inline.min(2)]);
    w[32..32 + rest].copy_from_slice(&f[2..inline.max(2)]);
    put32(&mut w, data_at, (f.len() - inline) as u32);
    put32(&mut w, data_at + 4, lkey);
    w[data_at + 8..data_at + 16].copy_from_slice(&(TX_BUF + inline as u64).to_be_bytes());
    let slot = q.ring + 64 * u64::from(pc % 64);
    d.ram.write(slot, &w).unwrap();
    d.ram.write_be32(q.dbr + 4, u32::from(pc) + 1).unwrap();
    w
}

/// Posts receive WQEs `from..to` (2 KiB buffers at RX_BUF) and the doorbell record.
fn post_recv(d: &Drv, e: &Eth, from: u16, to: u16) {
    for i in from..to {
        let mut s = [0u8; 16];
        put32(&mut s, 0, 2048);
        put32(&mut s, 4, e.lkey);
        s[8..16].copy_from_slice(&(RX_BUF + 2048 * u64::from(i % 16)).to_be_bytes());
        d.ram.write(RQ_RING + 16 * u64::from(i % 16), &s).unwrap();
    }
    d.ram.write_be32(RQ_DBR, u32::from(to)).unwrap();
}

fn cqe(d: &Drv, ring: u64, i: u64) -> [u8; 64] {
    let mut c = [0u8; 64];
    d.ram.read(ring + 64 * i, &mut c).unwrap();
    c
}

fn wire_pair() -> (EthWire, UdpSocket) {
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let wire = EthWire::bind("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
    (wire, peer)
}

/// Polls the model and the wire until `done` or 5 s pass (loopback datagrams arrive in microseconds).
fn pump(d: &mut Drv, wire: &mut EthWire, done: impl Fn(&Drv) -> bool) {
    pump_for(d, wire, Duration::from_secs(5), done);
}

fn pump_for(d: &mut Drv, wire: &mut EthWire, limit: Duration, done: impl Fn(&Drv) -> bool) {
    let end = Instant::now() + limit;
    while !done(d) && Instant::now() < end {
        d.model.poll();
        mlx5_model::dataplane::poll_eth(&mut d.model, wire).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn capabilities_vport_inline_mode_and_special_contexts() {
    let mut d = Drv::with(config(), 64 << 20);
    d.bring_up();
    // per_protocol_networking_offload_caps.wqe_inline_mode (bit 0x12): VPORT_CONTEXT.
    let caps = d.ok(&cmd(0x100, (1 << 1) | 1, 16), 0x1010);
    assert_eq!(getf(&caps[0x10..], 0x12, 2), 1);
    // nic_vport_context.min_wqe_inline_mode (bits 0x05..0x07 of the context at byte 0x10): L2.
    let v = d.ok(&cmd(0x754, 0, 16), 0x110);
    assert_eq!(getf(&v[0x10..], 0x05, 3), 1);
    let s = d.ok(&cmd(0x203, 0, 16), 0x20);
    assert_eq!(be32(&s, 0xc), mlx5_model::eth::RESD_LKEY);
}

#[test]
fn bring_up_send_to_the_wire_and_receive_from_it() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    let (mut wire, peer) = wire_pair();

    // Send: 18 bytes inline (Linux's MLX5E_MIN_INLINE), the rest gathered through the MKEY.
    let out = frame(PEER_MAC, PORT_MAC, 100);
    post_send(&d, &e, 0, &out, 18, e.lkey);
    pump(&mut d, &mut wire, |d| d.model.eth_counters().tx_frames == 1);
    let mut buf = [0u8; 2048];
    let (n, from) = peer.recv_from(&mut buf).unwrap();
    assert_eq!(from, wire.local_addr().unwrap());
    assert_eq!(&buf[..n], &out[..], "one datagram = the frame");
    let c = cqe(&d, TX_CQ_RING, 0);
    assert_eq!((c[63] >> 4, c[63] & 1, u16::from_be_bytes([c[60], c[61]])), (0x0, 0, 0), "REQ CQE, WQE 0");
    assert_eq!(be32(&c, 0x38), (0x0a << 24) | e.sqn);

    // A short frame is padded to 60 bytes by the MAC.
    let short = frame(PEER_MAC, PORT_MAC, 42);
    post_send(&d, &e, 1, &short, 18, e.lkey);
    pump(&mut d, &mut wire, |d| d.model.eth_counters().tx_frames == 2);
    let (n, _) = peer.recv_from(&mut buf).unwrap();
    assert_eq!((n, &buf[..42]), (60, &short[..]));

    // Receive: unicast to the port and broadcast reach the RQ; another MAC is not steered anywhere.
    post_recv(&d, &e, 0, 4);
    let to = wire.local_addr().unwrap();
    let unicast = frame(PORT_MAC, PEER_MAC, 300);
    let mut bcast = frame([0xff; 6], PEER_MAC, 64);
    bcast[12..14].copy_from_slice(&[0x08, 0x06]);
    peer.send_to(&frame(PEER_MAC, PEER_MAC, 80), to).unwrap();
    peer.send_to(&unicast, to).unwrap();
    peer.send_to(&bcast, to).unwrap();
    pump(&mut d, &mut wire, |d| d.model.eth_counters().rx_frames == 2);
    let k = d.model.eth_counters();
    assert_eq!((k.rx_frames, k.rx_steering_drop), (2, 1));
    for (i, f) in [&unicast, &bcast].iter().enumerate() {
        let c = cqe(&d, RX_CQ_RING, i as u64);
        assert_eq!(c[63] >> 4, 0x2, "RESP_SEND");
        assert_eq!(be32(&c, 0x2c) as usize, f.len(), "byte_cnt");
        assert_eq!(u16::from_be_bytes([c[60], c[61]]), i as u16, "wqe_counter");
        let mut got = vec![0u8; f.len()];
        d.ram.read(RX_BUF + 2048 * i as u64, &mut got).unwrap();
        assert_eq!(&got, *f);
    }
    // QUERY_RQ reports RDY and the consumer counter.
    let q = d.ok(&number_in(0x90b, e.rqn), 0x110);
    assert_eq!((getf(&q, 0x100 + 8, 4), be32(&q, 0x50 + 0x18)), (1, 2));
}

#[test]
fn ring_full_drops_and_counts_out_of_buffer() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    post_recv(&d, &e, 0, 1);
    let f = frame(PORT_MAC, PEER_MAC, 128);
    let mut sink = |_: Vec<u8>| {};
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::Delivered);
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::OutOfBuffer);
    assert_eq!(d.model.eth_counters().rx_out_of_buffer, 1);
    // The driver sees it in the RQ's Q counter; `clear` zeroes it after reading.
    assert_eq!(out_of_buffer(&mut d, e.q_counter, true), 1);
    assert_eq!(out_of_buffer(&mut d, e.q_counter, false), 0);
    // Posting one more WQE takes the next frame.
    post_recv(&d, &e, 1, 2);
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::Delivered);
    assert_eq!(d.model.eth_counters().rx_frames, 2);
}

#[test]
fn runt_oversize_and_no_root_are_dropped_and_counted() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, false);
    post_recv(&d, &e, 0, 4);
    let mut sink = |_: Vec<u8>| {};
    // No NIC_RX root: nothing is steered.
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 100), &mut sink), RxOutcome::NoRoot);
    assert_eq!(d.model.eth_counters().rx_no_root, 1);
    set_root(&mut d, e.table);
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 42), &mut sink), RxOutcome::Runt);
    assert_eq!(d.model.eth_receive(&[0u8; 10], &mut sink), RxOutcome::Runt);
    // PMTU oper_mtu 1522 counts the FCS: 1518 bytes is the largest frame.
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 1519), &mut sink), RxOutcome::Oversize);
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 1518), &mut sink), RxOutcome::Delivered);
    let k = d.model.eth_counters();
    assert_eq!((k.rx_runt, k.rx_oversize, k.rx_frames), (2, 1, 1));
    // RoCEv2 for the port's MAC goes to the RDMA responder, not to the RQ.
    let mut roce = frame(PORT_MAC, PEER_MAC, 100);
    roce[36..38].copy_from_slice(&4791u16.to_be_bytes());
    assert_eq!(d.model.eth_receive(&roce, &mut sink), RxOutcome::Roce);
    assert_eq!(d.model.eth_counters().rx_roce, 1);
}

#[test]
fn sq_send_before_rdy_is_refused() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    let f = frame(PEER_MAC, PORT_MAC, 100);
    post_send(&d, &e, 0, &f, 18, e.lkey);
    d.model.poll();
    let k = d.model.eth_counters();
    assert_eq!((k.sq_doorbells, k.sq_doorbells_not_ready, k.tx_frames), (1, 1, 0));
    assert!(d.model.take_eth_frames().is_empty());
    assert_eq!(cqe(&d, TX_CQ_RING, 0)[63], 0xf0, "no CQE");
    // The claimed current state must be the SQ's; RST→ERR is not a transition.
    assert_eq!(d.exec(&modify_in(0x905, e.sqn, 1, 3), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&modify_in(0x905, e.sqn, 0, 3), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&modify_in(0x905, e.sqn, 0, 2), 16).status(), BAD_PARAM, "state 2 does not exist");
    // Once RDY, the next doorbell runs what was posted.
    sq_ready(&mut d, &e);
    d.bar.write_be32(u64::from(e.uar) * 4096 + 0x904, e.sqn << 8 | 4).unwrap();
    d.model.poll();
    assert_eq!(d.model.take_eth_frames(), vec![f]);
    let q = d.ok(&number_in(0x907, e.sqn), 0x110);
    assert_eq!((getf(&q, 0x100 + 8, 4), be32(&q, 0x50 + 0x18)), (1, 1), "RDY, one WQEBB consumed");
}

#[test]
fn bad_lkey_and_short_inline_are_refused_with_error_cqes() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    let f = frame(PEER_MAC, PORT_MAC, 100);
    // Wrong variant byte: LOCAL_PROT_ERR, the SQ goes to ERR.
    post_send(&d, &e, 0, &f, 18, e.lkey ^ 1);
    d.model.poll();
    let c = cqe(&d, TX_CQ_RING, 0);
    assert_eq!((c[63] >> 4, c[0x37], be32(&c, 0x38) & 0xff_ffff), (0xd, 0x04, e.sqn));
    assert!(d.model.take_eth_frames().is_empty());
    let q = d.ok(&number_in(0x907, e.sqn), 0x110);
    assert_eq!(getf(&q, 0x100 + 8, 4), 3, "ERR");
    // Recovery as Linux does it: ERR→RST→RDY, counters back to 0.
    d.ok(&modify_in(0x905, e.sqn, 3, 0), 16);
    sq_ready(&mut d, &e);
    d.ram.write_be32(SQ_DBR + 4, 0).unwrap();
    // Outside the key's range: LOCAL_PROT_ERR.
    d.ram.write(TX_BUF, &f).unwrap();
    let mut far = f.clone();
    far.resize(100, 0);
    post_send(&d, &e, 0, &far, 18, e.lkey);
    let data_seg = SQ_RING + 48 + 8;
    d.ram.write(data_seg, &(BUF_END - 10).to_be_bytes()).unwrap();
    d.model.poll();
    assert_eq!(cqe(&d, TX_CQ_RING, 1)[0x37], 0x04);
    // The reserved lkey on an SQ created without rlky is a bad lkey too.
    d.ok(&modify_in(0x905, e.sqn, 3, 0), 16);
    sq_ready(&mut d, &e);
    d.ram.write_be32(SQ_DBR + 4, 0).unwrap();
    post_send(&d, &e, 0, &f, 18, mlx5_model::eth::RESD_LKEY);
    d.model.poll();
    assert_eq!(cqe(&d, TX_CQ_RING, 2)[0x37], 0x04);
    // Fewer inline bytes than the L2 header the vport requires: LOCAL_QP_OP_ERR.
    d.ok(&modify_in(0x905, e.sqn, 3, 0), 16);
    sq_ready(&mut d, &e);
    d.ram.write_be32(SQ_DBR + 4, 0).unwrap();
    post_send(&d, &e, 0, &f, 2, e.lkey);
    d.model.poll();
    let c = cqe(&d, TX_CQ_RING, 3);
    assert_eq!((c[63] >> 4, c[0x37]), (0xd, 0x02));
    assert_eq!(d.model.eth_counters().tx_errors, 4);
    assert_eq!(d.model.eth_counters().tx_frames, 0);
}

#[test]
fn references_states_and_bad_parameters() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    // A TIS in a transport domain that does not exist; an SQ on a CQ or TIS that does not exist.
    assert_eq!(d.exec(&create_tis_in(e.td + 7), 16).status(), BAD_PARAM);
    let mut bad = create_sq_in(&Eth { tx_cq: 60, ..e });
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    bad = create_sq_in(&Eth { tis: 60, ..e });
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    // A 128-byte SQ stride, a state other than RST, a reserved bit (hairpin) are refused.
    bad = create_sq_in(&e);
    setf(&mut bad, 0x280 + 0x10c, 4, 7);
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    bad = create_sq_in(&e);
    setf(&mut bad, 0x100 + 8, 4, 1);
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    bad = create_sq_in(&e);
    setf(&mut bad, 0x100 + 0xe, 1, 1);
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    // An indirect TIR (no RQTs), a TIR on an RQ that does not exist.
    bad = create_tir_in(e.td, e.rqn);
    setf(&mut bad, 0x100 + 0x20, 4, 1);
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_tir_in(e.td, 99), 16).status(), BAD_PARAM);
    // Objects in use cannot go: the RX CQ (RQ), the RQ (TIR), the TIR (flow entry), the TIS (SQ), the TD.
    assert_eq!(d.exec(&number_in(0x401, e.rx_cq), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&number_in(0x90a, e.rqn), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&number_in(0x902, e.tir), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&number_in(0x914, e.tis), 16).status(), BAD_RES_STATE);
    assert_eq!(d.exec(&number_in(0x817, e.td), 16).status(), BAD_RES_STATE);
    let mut dq = cmd(0x772, 0, 16);
    setf(&mut dq, 0x58, 8, e.q_counter);
    assert_eq!(d.exec(&dq, 16).status(), BAD_RES_STATE, "the RQ counts into it");
    // An RQ on a Q counter that was never allocated.
    let mut rq = create_rq_in(&Eth { q_counter: 200, ..e });
    assert_eq!(d.exec(&rq, 16).status(), BAD_PARAM);
    rq = create_rq_in(&e);
    setf(&mut rq, 0x100 + 4, 4, 1);
    assert_eq!(d.exec(&rq, 16).status(), BAD_PARAM, "RMP-backed RQs are not modelled");
    // A NIC_RX entry forwarding to a TIR that does not exist.
    let mut f = cmd(0x936, 0, 0x348);
    setf(&mut f, 0xa8, 24, e.table);
    setf(&mut f, 0x100, 32, 2);
    setf(&mut f, 0x270, 16, 0x4);
    setf(&mut f, 0x288, 24, 1);
    put32(&mut f, 0x340, (2 << 24) | 77);
    assert_eq!(d.exec(&f, 16).status(), BAD_PARAM);
    // Destroys in dependency order succeed.
    d.ok(&number_in(0x906, e.sqn), 16);
    d.ok(&number_in(0x914, e.tis), 16);
    assert_eq!(d.exec(&number_in(0x907, e.sqn), 16).status(), BAD_PARAM, "destroyed");
}

#[test]
fn late_link_comes_up_with_a_port_change_event() {
    let cfg = ModelConfig { link_up_delay: Duration::from_millis(50), ..config() };
    let mut d = Drv::with(cfg, 64 << 20);
    d.bring_up();
    let uar = alloc_uar(&mut d);
    let eq_buf = QBUF + 0x8000;
    for i in 0..4 {
        d.ram.write(eq_buf + 64 * i + 63, &[1]).unwrap();
    }
    d.ok(&common::create_eq_in(2, uar, 1 << 9, eq_buf), 16);
    let paos = |op_mod: u16, dw0: u32, dw1: u32| {
        let mut b = cmd(0x805, op_mod, 0x20);
        put32(&mut b, 8, 0x5006);
        put32(&mut b, 0x10, dw0);
        put32(&mut b, 0x14, dw1);
        b
    };
    let oper = |d: &mut Drv| be32(&d.ok(&paos(1, 1 << 16, 0), 0x20), 0x10) & 0xf;
    assert_eq!(oper(&mut d), 2, "down while training");
    let mut sink = |_: Vec<u8>| {};
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 64), &mut sink), RxOutcome::LinkDown);
    let end = Instant::now() + Duration::from_secs(5);
    while oper(&mut d) != 1 && Instant::now() < end {
        d.model.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(oper(&mut d), 1, "up after the delay");
    let mut eqe = [0u8; 64];
    d.ram.read(eq_buf, &mut eqe).unwrap();
    assert_eq!((eqe[1], eqe[3], eqe[0x28] >> 4), (0x09, 4, 1), "PORT_CHANGE ACTIVE, port 1");
    // Admin down: oper down at once, DOWN event; admin up: training again.
    d.ok(&paos(0, (1 << 16) | (2 << 8), 1 << 31), 0x20);
    d.ram.read(eq_buf + 64, &mut eqe).unwrap();
    assert_eq!((eqe[1], eqe[3]), (0x09, 1), "PORT_CHANGE DOWN");
    d.ok(&paos(0, (1 << 16) | (1 << 8), 1 << 31), 0x20);
    assert_eq!(oper(&mut d), 2, "training again");
}

/// Reads the receive buffer of WQE `i`.
fn rx_data(d: &Drv, i: u64, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    d.ram.read(RX_BUF + 2048 * i, &mut got).unwrap();
    got
}

#[test]
fn errors_move_queues_to_err_and_flush_what_is_posted() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    let q = SqMem { sqn: e.sqn, ring: SQ_RING, dbr: SQ_DBR };
    let f = frame(PEER_MAC, PORT_MAC, 100);
    // Two WQEs posted but not rung: MODIFY_SQ RDY→ERR flushes both (flush_in_error_en).
    write_send(&d, q, 0, &f, 18, e.lkey, 0);
    write_send(&d, q, 1, &f, 18, e.lkey, 0);
    d.ok(&modify_in(0x905, e.sqn, 1, 3), 16);
    for i in 0..2 {
        let c = cqe(&d, TX_CQ_RING, i);
        assert_eq!((c[63] >> 4, c[0x37], u16::from_be_bytes([c[60], c[61]])), (0xd, 0x05, i as u16));
    }
    assert!(d.model.take_eth_frames().is_empty());

    // Receive: the first WQE has a bad lkey → RESP_ERR local protection, RQ to ERR, the other two flushed.
    post_recv(&d, &e, 0, 3);
    put32_ram(&d, RQ_RING + 4, e.lkey ^ 0x80);
    let mut sink = |_: Vec<u8>| {};
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 100), &mut sink), RxOutcome::Error);
    let c = cqe(&d, RX_CQ_RING, 0);
    assert_eq!((c[63] >> 4, c[0x37]), (0xe, 0x04));
    for i in 1..3 {
        let c = cqe(&d, RX_CQ_RING, i);
        assert_eq!((c[63] >> 4, c[0x37], u16::from_be_bytes([c[60], c[61]])), (0xe, 0x05, i as u16));
    }
    let st = d.ok(&number_in(0x90b, e.rqn), 0x110);
    assert_eq!(getf(&st, 0x100 + 8, 4), 3, "RQ in ERR");
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 100), &mut sink), RxOutcome::RqNotReady);
    // Recovery ERR→RST→RDY; a WQE smaller than the frame → local length error.
    d.ok(&modify_in(0x909, e.rqn, 3, 0), 16);
    d.ok(&modify_in(0x909, e.rqn, 0, 1), 16);
    post_recv(&d, &e, 0, 1);
    put32_ram(&d, RQ_RING, 64);
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 100), &mut sink), RxOutcome::Error);
    assert_eq!(cqe(&d, RX_CQ_RING, 3)[0x37], 0x01);
    assert_eq!(d.model.eth_counters().rx_errors, 2);
}

fn put32_ram(d: &Drv, at: u64, v: u32) {
    d.ram.write_be32(at, v).unwrap();
}

#[test]
fn vlan_strip_checksum_offload_reserved_lkey_and_link_down() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    // MODIFY_RQ RDY→RDY with the VSD bit and vsd = 0: strip VLAN tags from now on.
    let mut m = modify_in(0x909, e.rqn, 1, 1);
    setf(&mut m, 0xa0, 32, 1 << 1);
    d.ok(&m, 16);
    post_recv(&d, &e, 0, 4);
    let plain = frame(PORT_MAC, PEER_MAC, 100);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x20, 0x64]);
    tagged.extend_from_slice(&plain[12..]);
    let mut sink = |_: Vec<u8>| {};
    assert_eq!(d.model.eth_receive(&tagged, &mut sink), RxOutcome::Delivered);
    let c = cqe(&d, RX_CQ_RING, 0);
    assert_eq!(be32(&c, 0x2c), 100, "byte_cnt without the tag");
    assert_eq!((c[0x1d] & 1, u16::from_be_bytes([c[0x1e], c[0x1f]])), (1, 0x2064), "stripped TCI");
    assert_eq!((c[0x1d] >> 2) & 3, 2, "L3 IPv4");
    assert_eq!((c[0x1d] >> 4) & 7, 2, "L4 UDP");
    assert_eq!(rx_data(&d, 0, 100), plain);

    // Checksum offload: the IPv4 header checksum is filled in.
    let q = SqMem { sqn: e.sqn, ring: SQ_RING, dbr: SQ_DBR };
    let w = write_send(&d, q, 0, &plain, 18, e.lkey, 0x40 | 0x80);
    ring(&d, e.uar, &w);
    d.model.poll();
    let out = d.model.take_eth_frames();
    assert_eq!(out.len(), 1);
    let hdr = &out[0][14..34];
    let sum: u32 = hdr.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff, "IPv4 header checksum verifies");
    assert_ne!(&out[0][40..42], &[0, 0], "UDP checksum filled in");

    // A second SQ created with rlky may use the reserved lkey (guest physical addresses).
    let mut c2 = queue_in(0x904, e.pd, e.uar, SQ_DBR + 0x80, SQ_RING + 0x7_0000, 6, 6);
    setf(&mut c2, 0x100, 1, 1);
    setf(&mut c2, 0x100 + 5, 3, 1);
    setf(&mut c2, 0x100 + 0x48, 24, e.tx_cq);
    setf(&mut c2, 0x100 + 0x100, 16, 1);
    setf(&mut c2, 0x100 + 0x168, 24, e.tis);
    let sq2 = number(&d.ok(&c2, 16));
    d.ok(&modify_in(0x905, sq2, 0, 1), 16);
    let q2 = SqMem { sqn: sq2, ring: SQ_RING + 0x7_0000, dbr: SQ_DBR + 0x80 };
    let w = write_send(&d, q2, 0, &plain, 18, mlx5_model::eth::RESD_LKEY, 0);
    ring(&d, e.uar, &w);
    d.model.poll();
    assert_eq!(d.model.take_eth_frames(), vec![plain.clone()]);

    // Link down (PAOS admin down): the send completes but the frame is discarded; nothing is received.
    let mut paos = cmd(0x805, 0, 0x20);
    put32(&mut paos, 8, 0x5006);
    put32(&mut paos, 0x10, (1 << 16) | (2 << 8));
    put32(&mut paos, 0x14, 1 << 31);
    d.ok(&paos, 0x20);
    let w = write_send(&d, q, 1, &plain, 18, e.lkey, 0);
    ring(&d, e.uar, &w);
    d.model.poll();
    assert!(d.model.take_eth_frames().is_empty());
    assert_eq!(d.model.eth_counters().tx_link_down, 1);
    assert_eq!(cqe(&d, TX_CQ_RING, 2)[63] >> 4, 0x0, "still completed (CQE 2: after the offload and the rlky sends)");
    assert_eq!(d.model.eth_receive(&plain, &mut sink), RxOutcome::LinkDown);
    let mut roce = frame(PORT_MAC, PEER_MAC, 100);
    roce[36..38].copy_from_slice(&4791u16.to_be_bytes());
    assert_eq!(d.model.eth_receive(&roce, &mut sink), RxOutcome::LinkDown, "RoCE too: the MAC drops it");
    assert_eq!(d.model.eth_counters().rx_roce, 0);
}

#[test]
fn steering_drop_entry_and_miss_forwarding_to_a_deeper_table() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, false);
    post_recv(&d, &e, 0, 4);
    // Table B (level 1): the usual DMAC entries. Root A (level 0): drops IPv6, misses go on to B.
    let b = steering_at(&mut d, e.tir, 1);
    let mut t = cmd(0x930, 0, 0x40);
    setf(&mut t, 0xc4, 4, 1);
    setf(&mut t, 0xd8, 8, 1);
    setf(&mut t, 0xe8, 24, b);
    let a = number(&d.ok(&t, 16));
    let mut g = cmd(0x933, 0, 0x400);
    setf(&mut g, 0xa8, 24, a);
    setf(&mut g, 0x120, 32, 1);
    setf(&mut g, 0x1f8, 8, 1);
    setf(&mut g, 0x200 + 0x30, 16, 0xffff);
    let group = number(&d.ok(&g, 16));
    let mut f = cmd(0x936, 0, 0x340);
    setf(&mut f, 0xa8, 24, a);
    setf(&mut f, 0x220, 32, group);
    setf(&mut f, 0x270, 16, 0x2);
    setf(&mut f, 0x400 + 0x30, 16, 0x86dd);
    d.ok(&f, 16);
    // A NIC_RX group on misc parameters cannot be matched: refused.
    let mut bad = cmd(0x933, 0, 0x400);
    setf(&mut bad, 0xa8, 24, a);
    setf(&mut bad, 0xe0, 32, 1);
    setf(&mut bad, 0x120, 32, 1);
    setf(&mut bad, 0x1f8, 8, 2);
    assert_eq!(d.exec(&bad, 16).status(), BAD_PARAM);
    set_root(&mut d, a);
    let mut sink = |_: Vec<u8>| {};
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 80), &mut sink), RxOutcome::Delivered);
    let mut v6 = frame(PORT_MAC, PEER_MAC, 80);
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    assert_eq!(d.model.eth_receive(&v6, &mut sink), RxOutcome::SteeringDrop);
    let k = d.model.eth_counters();
    assert_eq!((k.rx_frames, k.rx_steering_drop), (1, 1));
}

/// The QEMU child: killed and reaped when the test ends, passed or failed.
struct Qemu(std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// QEMU with no guest: `-netdev user` on a hub with `-netdev socket` whose peer is a wire bound here. Returns
/// QEMU and the wire (already pointing at QEMU's `localaddr`).
fn qemu_user_network() -> (Qemu, EthWire) {
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let qemu_addr = probe.local_addr().unwrap();
    drop(probe);
    let wire = EthWire::bind("127.0.0.1:0".parse().unwrap(), qemu_addr).unwrap();
    let local = wire.local_addr().unwrap();
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .args(["-M", "none", "-display", "none", "-nodefaults", "-monitor", "none", "-serial", "none"])
        .args(["-netdev", "user,id=u0"])
        .args(["-netdev", &format!("socket,id=s0,udp={local},localaddr={qemu_addr}")])
        .args(["-netdev", "hubport,id=h0,hubid=0,netdev=u0", "-netdev", "hubport,id=h1,hubid=0,netdev=s0"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("qemu-system-x86_64");
    (Qemu(qemu), wire)
}

/// Sends `f` (checksums by the port when `cs_flags` asks) until a frame lands in the RQ; QEMU needs a moment to
/// open its socket, so the first frames may go nowhere. Returns the received frame.
fn exchange(d: &mut Drv, e: &Eth, wire: &mut EthWire, f: &[u8], cs_flags: u8) -> Vec<u8> {
    let q = SqMem { sqn: e.sqn, ring: SQ_RING, dbr: SQ_DBR };
    let end = Instant::now() + Duration::from_secs(10);
    let mut pc = 0u16;
    while d.model.eth_counters().rx_frames == 0 && Instant::now() < end {
        let w = write_send(d, q, pc, f, 18, e.lkey, cs_flags);
        ring(d, e.uar, &w);
        pc += 1;
        pump_for(d, wire, Duration::from_millis(200), |d| d.model.eth_counters().rx_frames > 0);
    }
    let c = cqe(d, RX_CQ_RING, 0);
    assert_eq!(c[63] >> 4, 0x2, "RESP_SEND");
    let len = be32(&c, 0x2c) as usize;
    assert!(len >= 60, "QEMU pads short frames: {len}");
    rx_data(d, 0, len)
}

/// The wire against QEMU's own network (`-netdev socket` on a hub with `-netdev user`): the port's SQ sends an
/// ARP request for the gateway 10.0.2.2; QEMU's reply comes back over the wire, through the NIC_RX entries,
/// into the RQ. Needs `qemu-system-x86_64` (no guest is booted):
/// `cargo test -p mlx5-model --test ethernet -- --ignored`.
#[test]
#[ignore = "needs qemu-system-x86_64"]
fn arp_with_qemu_user_networking_over_the_wire() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    post_recv(&d, &e, 0, 4);
    let (qemu, mut wire) = qemu_user_network();
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&PORT_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&PORT_MAC);
    arp.extend_from_slice(&[10, 0, 2, 15, 0, 0, 0, 0, 0, 0, 10, 0, 2, 2]);
    let reply = exchange(&mut d, &e, &mut wire, &arp, 0);
    drop(qemu);
    assert_eq!(&reply[..6], &PORT_MAC, "unicast to the port");
    assert_eq!(&reply[12..14], &[0x08, 0x06]);
    assert_eq!(u16::from_be_bytes([reply[20], reply[21]]), 2, "ARP reply");
    assert_eq!(&reply[28..32], &[10, 0, 2, 2], "from the gateway");
}

/// DHCP through QEMU's user network: a DISCOVER whose IPv4 and UDP checksums the port fills in (`cs_flags` L3 and
/// L4: QEMU drops a datagram whose checksums are wrong) is answered with an OFFER of 10.0.2.15.
#[test]
#[ignore = "needs qemu-system-x86_64"]
fn dhcp_with_qemu_user_networking_and_checksum_offload() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    sq_ready(&mut d, &e);
    post_recv(&d, &e, 0, 4);
    let (qemu, mut wire) = qemu_user_network();
    let mut bootp = vec![1, 1, 6, 0, 0x12, 0x34, 0x56, 0x78, 0, 0, 0x80, 0];
    bootp.extend_from_slice(&[0; 16]);
    bootp.extend_from_slice(&PORT_MAC);
    bootp.resize(236, 0);
    bootp.extend_from_slice(&[0x63, 0x82, 0x53, 0x63, 53, 1, 1, 255]);
    let udp_len = 8 + bootp.len() as u16;
    let ip_len = 20 + udp_len;
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&PORT_MAC);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, (ip_len >> 8) as u8, ip_len as u8, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[0, 0, 0, 0, 255, 255, 255, 255, 0, 68, 0, 67, (udp_len >> 8) as u8, udp_len as u8, 0, 0]);
    f.extend_from_slice(&bootp);
    let reply = exchange(&mut d, &e, &mut wire, &f, 0x40 | 0x80);
    drop(qemu);
    assert_eq!(&reply[12..14], &[0x08, 0x00]);
    assert_eq!(&reply[34..38], &[0, 67, 0, 68], "UDP 67 → 68");
    let b = &reply[42..];
    assert_eq!((b[0], &b[4..8]), (2, &[0x12, 0x34, 0x56, 0x78][..]), "BOOTREPLY to our xid");
    assert_eq!(&b[16..20], &[10, 0, 2, 15], "yiaddr");
    assert_eq!(&b[236..240], &[0x63, 0x82, 0x53, 0x63]);
    assert_eq!(&b[240..243], &[53, 1, 2], "DHCPOFFER");
}

/// MODIFY_NIC_VPORT_CONTEXT selecting `addresses_list` (field_select bit 0x1d) with `allowed_list_type` UC and
/// `macs` as `current_uc_mac_address[]` (Linux `mlx5_modify_nic_vport_mac_list`).
fn uc_list_in(macs: &[[u8; 6]]) -> Vec<u8> {
    let mut m = cmd(0x755, 0, 0x200 + 8 * macs.len());
    put32(&mut m, 0xc, 1 << 2);
    put32(&mut m, 0x1f0, macs.len() as u32);
    for (i, mac) in macs.iter().enumerate() {
        m[0x202 + 8 * i..0x208 + 8 * i].copy_from_slice(mac);
    }
    m
}

/// Rule (docs/hca-model.md, "VF personality"): a VF sits behind its PF's legacy e-switch, which forwards it a
/// unicast frame — Ethernet or RoCE — only for a MAC in its vport's unicast list; broadcast still passes.
#[test]
fn a_vf_gets_no_unicast_for_a_mac_missing_from_its_list() {
    let mut d = Drv::with(ModelConfig { vf: true, ..config() }, 64 << 20);
    let e = bring_up(&mut d, true);
    post_recv(&d, &e, 0, 4);
    let mut sink = |_: Vec<u8>| {};
    let f = frame(PORT_MAC, PEER_MAC, 128);
    let mut roce = frame(PORT_MAC, PEER_MAC, 100);
    roce[36..38].copy_from_slice(&4791u16.to_be_bytes());
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::NotInUcList, "the list is empty");
    assert_eq!(d.model.eth_receive(&roce, &mut sink), RxOutcome::NotInUcList, "RoCE as well");
    assert_eq!(d.model.eth_receive(&frame([0xff; 6], PEER_MAC, 128), &mut sink), RxOutcome::Delivered);
    let k = d.model.eth_counters();
    assert_eq!((k.rx_eswitch_drop, k.rx_frames, k.rx_roce), (2, 1, 0));
    // The function publishes its MAC: both arrive.
    d.ok(&uc_list_in(&[PORT_MAC]), 16);
    assert_eq!(d.model.hca().port.uc_list, vec![PORT_MAC]);
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::Delivered);
    assert_eq!(d.model.eth_receive(&roce, &mut sink), RxOutcome::Roce);
    // A new list replaces the old one: without the MAC, nothing again.
    d.ok(&uc_list_in(&[PEER_MAC]), 16);
    assert_eq!(d.model.eth_receive(&f, &mut sink), RxOutcome::NotInUcList);
    assert_eq!(d.model.eth_counters().rx_eswitch_drop, 3);
}

/// The PF has no e-switch in front of it (it is the e-switch manager's uplink): an empty list takes nothing away.
#[test]
fn the_pf_takes_its_unicast_without_a_list() {
    let mut d = Drv::with(config(), 64 << 20);
    let e = bring_up(&mut d, true);
    post_recv(&d, &e, 0, 2);
    let mut sink = |_: Vec<u8>| {};
    assert!(d.model.hca().port.uc_list.is_empty());
    assert_eq!(d.model.eth_receive(&frame(PORT_MAC, PEER_MAC, 128), &mut sink), RxOutcome::Delivered);
    assert_eq!(d.model.eth_counters().rx_eswitch_drop, 0);
}
