//! Flush error CQEs (a QP entering ERR with receive WQEs posted), CQE ownership across a ring wrap, CQ arming
//! through the UAR CQ doorbell and the completion EQE, and CQ overrun → CQ_ERROR — all through real commands,
//! with the driver's side (doorbell records, UAR writes, CQ ring initialisation) written as Linux does.

mod common;
mod support_qp;

use common::{Drv, QBUF, be32, create_cq_in, create_eq_in};
use mlx5_model::dataplane::HcaTables;
use mlx5_model::mem::Memory;
use mlx5_model::roce::responder::{QpEvent, Tables};
use support_qp::*;

const EQ_BUF: u64 = QBUF;
const CQ_BUF: u64 = QBUF + 0x1000;
const CQ_DBR: u64 = QBUF + 0x10_0000;
/// `create_qp_in` bit offsets of `log_rq_size` / `log_rq_stride` (qpc at byte 0x18: 0xc0 + 0x49 / 0x4d).
const LOG_RQ_SIZE: usize = 0x109;
const LOG_RQ_STRIDE: usize = 0x10d;

struct T {
    d: Drv,
    r: Res,
    log_cq: u32,
}

/// PD, UAR, an EQ subscribed to CQ_ERROR (bit 4) with every EQE owner 1 (as Linux initialises them), and a
/// `2^log_cq`-entry CQ whose CQEs carry `op_own` 0xf0 (INVALID, owner 0: Linux `init_cq_frag_buf`).
fn setup_cq(log_cq: u32) -> T {
    let mut d = Drv::new();
    d.bring_up();
    roce_port(&mut d);
    let pd = alloc_pd(&mut d);
    let uar = alloc_uar(&mut d);
    for i in 0..16 {
        d.ram.write(EQ_BUF + 64 * i + 0x3f, &[1]).unwrap();
    }
    let eqn = u32::from(d.ok(&create_eq_in(4, uar, 1 << 4, EQ_BUF), 16)[0xb]);
    for i in 0..1u64 << log_cq {
        d.ram.write(CQ_BUF + 64 * i + 0x3f, &[0xf0]).unwrap();
    }
    let out = d.ok(&create_cq_in(log_cq, uar, eqn, CQ_BUF, CQ_DBR), 16);
    let cqn = be32(&out, 8) & 0xff_ffff;
    T { d, r: Res { pd, uar, eqn, cqn }, log_cq }
}

/// An RC QP with an 8-entry regular RQ (16-byte stride), moved to RTS.
fn rts_qp(t: &mut T) -> u32 {
    let mut c = create_qp_in(t.r);
    setf(&mut c, bit::RQ_TYPE, 3, 0);
    setf(&mut c, LOG_RQ_SIZE, 4, 3);
    setf(&mut c, LOG_RQ_STRIDE, 3, 0);
    let qpn = be32(&t.d.ok(&c, 16), 8) & 0xff_ffff;
    to_rts(t, qpn);
    qpn
}

fn to_rts(t: &mut T, qpn: u32) {
    let r = t.r;
    t.d.ok(&rst2init_in(qpn, r), 16);
    t.d.ok(&init2rtr_in(qpn, r, 0x77, 0x100), 16);
    t.d.ok(&rtr2rts_in(qpn, r, 0x200), 16);
    // Linux zeroes the doorbell record when it creates the QP.
    t.d.ram.write_be32(DBR, 0).unwrap();
}

/// Posting receive WQEs as Linux `mlx5_ib_post_recv` ends: the RQ producer counter (16 bits) in dword 0.
fn post_recv(t: &T, counter: u32) {
    t.d.ram.write_be32(DBR, counter & 0xffff).unwrap();
}

/// Software consumed CQEs up to `ci` (`set_ci`, dword 0 of the CQ doorbell record).
fn set_ci(t: &T, ci: u32) {
    t.d.ram.write_be32(CQ_DBR, ci).unwrap();
}

/// `mlx5_cq_arm`: the arm record in the doorbell record, then the 64-bit UAR write at UAR + 0x20.
fn arm(t: &mut T, sn: u32, ci: u32) {
    let v = (sn << 28) | ci;
    t.d.ram.write_be32(CQ_DBR + 4, v).unwrap();
    let at = u64::from(t.r.uar) * 4096 + 0x20;
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&v.to_be_bytes());
    b[4..].copy_from_slice(&t.r.cqn.to_be_bytes());
    t.d.bar.write(at, &b).unwrap();
    assert!(t.d.model.poll(), "the arm doorbell is work");
}

fn to_err(t: &mut T, qpn: u32) {
    t.d.ok(&short_in(QP_2ERR, qpn), 16);
}

fn cqe(t: &T, i: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    t.d.ram.read(CQ_BUF + 64 * (i % (1 << t.log_cq)), &mut b).unwrap();
    b
}

fn eqe(t: &T, i: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    t.d.ram.read(EQ_BUF + 64 * i, &mut b).unwrap();
    b
}

fn eqes_written(t: &T) -> u32 {
    t.d.model.hca().eqs.eqs[&(t.r.eqn as u8)].producer_counter
}

/// A flush error CQE as `struct mlx5_err_cqe` lays it out.
fn check_flush(c: &[u8; 64], qpn: u32, wqe_counter: u16, owner: u8) {
    assert_eq!(c[0x3f] >> 4, 0xe, "opcode RESP_ERR");
    assert_eq!(c[0x3f] & 1, owner, "owner bit");
    assert_eq!(c[0x37], 0x05, "syndrome WR_FLUSH_ERR");
    assert_eq!(be32(c, 0x38) & 0xff_ffff, qpn, "qpn");
    assert_eq!(u16::from_be_bytes([c[0x3c], c[0x3d]]), wqe_counter, "wqe_counter");
    // CQE version 1 (both profiles): the QP's user_index in srqn_uidx (the test QPs carry Linux's 0xffffff).
    assert_eq!(be32(c, 0x20), 0xff_ffff, "srqn_uidx = the QP's user_index");
    assert!(c[..0x20].iter().chain(&c[0x24..0x37]).all(|&b| b == 0), "no other field is set");
}

#[test]
fn two_err_flushes_each_posted_receive_wqe_and_raises_one_completion_event() {
    let mut t = setup_cq(3);
    let qpn = rts_qp(&mut t);
    post_recv(&t, 3);
    arm(&mut t, 1, 0);
    assert_eq!(eqes_written(&t), 0, "nothing to report yet");
    to_err(&mut t, qpn);
    assert_eq!(qp_state(&mut t.d, qpn), 6);
    for i in 0..3 {
        check_flush(&cqe(&t, i), qpn, i as u16, 0);
    }
    assert_eq!(cqe(&t, 3)[0x3f], 0xf0, "only the posted WQEs complete");
    // One completion EQE (type 0, CQN at data + 0x18, owner 0 on the first pass), then the CQ is disarmed.
    assert_eq!(eqes_written(&t), 1);
    let e = eqe(&t, 0);
    assert_eq!((e[1], e[3]), (0x00, 0));
    assert_eq!(be32(&e, 0x38) & 0xff_ffff, t.r.cqn);
    assert_eq!(e[0x3f] & 1, 0);
    assert_eq!(eqe(&t, 1)[0x3f], 1, "no second EQE");
    // Another 2ERR with nothing new posted writes nothing.
    to_err(&mut t, qpn);
    assert_eq!(cqe(&t, 3)[0x3f], 0xf0);
    assert_eq!(eqes_written(&t), 1);
}

#[test]
fn owner_bit_flips_across_a_ring_wrap_and_overrun_raises_cq_error() {
    let mut t = setup_cq(2); // 4 CQEs
    let qpn = rts_qp(&mut t);
    post_recv(&t, 3);
    to_err(&mut t, qpn);
    for i in 0..3 {
        check_flush(&cqe(&t, i), qpn, i as u16, 0);
    }
    assert_eq!(eqes_written(&t), 0, "an unarmed CQ raises no completion event");
    // Software consumes the three; the driver posts three more to the QP in ERR and repeats 2ERR.
    set_ci(&t, 3);
    post_recv(&t, 6);
    to_err(&mut t, qpn);
    check_flush(&cqe(&t, 3), qpn, 3, 0);
    check_flush(&cqe(&t, 4), qpn, 4, 1);
    check_flush(&cqe(&t, 5), qpn, 5, 1);
    // Three more, software still at 3: one fits (slot 2, second pass), then the ring is full. The unconsumed
    // CQE in slot 3 stays; the CQ is in error and CQ_ERROR (syndrome 1 = overrun) goes to the EQ.
    post_recv(&t, 9);
    to_err(&mut t, qpn);
    check_flush(&cqe(&t, 6), qpn, 6, 1);
    check_flush(&cqe(&t, 3), qpn, 3, 0);
    assert_eq!(eqes_written(&t), 1);
    let e = eqe(&t, 0);
    assert_eq!(e[1], 0x04, "CQ_ERROR");
    assert_eq!(be32(&e, 0x20) & 0xff_ffff, t.r.cqn);
    assert_eq!(e[0x2b], 1, "overrun");
    // A CQ in error writes nothing more, and raises no second CQ_ERROR.
    set_ci(&t, 7);
    to_err(&mut t, qpn);
    check_flush(&cqe(&t, 3), qpn, 3, 0);
    assert_eq!(eqes_written(&t), 1);
}

#[test]
fn arming_with_unconsumed_cqes_raises_the_event_at_once() {
    let mut t = setup_cq(3);
    let qpn = rts_qp(&mut t);
    post_recv(&t, 2);
    to_err(&mut t, qpn);
    assert_eq!(eqes_written(&t), 0);
    // Software polled one CQE and arms with ci 1: one CQE is still past it.
    set_ci(&t, 1);
    arm(&mut t, 0, 1);
    assert_eq!(eqes_written(&t), 1);
    assert_eq!(be32(&eqe(&t, 0), 0x38) & 0xff_ffff, t.r.cqn);
    // Consumed everything and armed again: no event until a CQE comes (2RST, back to RTS, a post, 2ERR).
    set_ci(&t, 2);
    arm(&mut t, 1, 2);
    assert_eq!(eqes_written(&t), 1);
    t.d.ok(&short_in(QP_2RST, qpn), 16);
    to_rts(&mut t, qpn);
    post_recv(&t, 1);
    to_err(&mut t, qpn);
    // After 2RST the RQ counts from 0 again.
    check_flush(&cqe(&t, 2), qpn, 0, 0);
    assert_eq!(eqes_written(&t), 2);
}

#[test]
fn the_responders_access_error_flushes_the_receive_queue() {
    let mut t = setup_cq(3);
    let qpn = rts_qp(&mut t);
    post_recv(&t, 2);
    HcaTables::new(&mut t.d.model).qp_error(qpn, QpEvent::WqAccessError);
    check_flush(&cqe(&t, 0), qpn, 0, 0);
    check_flush(&cqe(&t, 1), qpn, 1, 0);
    assert_eq!(cqe(&t, 2)[0x3f], 0xf0);
}

#[test]
fn no_cqe_when_nothing_was_posted() {
    let mut t = setup_cq(3);
    let qpn = rts_qp(&mut t);
    arm(&mut t, 0, 0);
    to_err(&mut t, qpn);
    assert!((0..8).all(|i| cqe(&t, i)[0x3f] == 0xf0));
    assert_eq!(eqes_written(&t), 0);
    // A zero-length RQ has no WQEs to flush, whatever its doorbell record holds.
    let r = t.r;
    let z = create_qp(&mut t.d, r);
    to_rts(&mut t, z);
    post_recv(&t, 5);
    to_err(&mut t, z);
    assert!((0..8).all(|i| cqe(&t, i)[0x3f] == 0xf0));
    assert_eq!(eqes_written(&t), 0);
    // The CQ's producer counter never moved.
    assert_eq!(t.d.model.hca().cqs.cqs[&r.cqn].producer_counter, 0);
}

/// The model's counters started just below their limits: the RQ's 16-bit consumed counter (the
/// flush CQEs' `wqe_counter`) and the CQ's and EQ's 24-bit producer counters all wrap in one flush. Each wraps
/// to 0 and keeps counting; slots and owner bits follow the counter (`(counter >> log_size) & 1`), so the
/// driver's consumer, which counts the same way, sees each entry once, in order.
#[test]
fn rq_cq_and_eq_counters_wrap_at_their_limits() {
    let mut t = setup_cq(2); // 4 CQEs
    let qpn = rts_qp(&mut t);
    {
        let hca = t.d.model.hca_mut();
        hca.qps.get_mut(qpn).unwrap().rq_consumed = 0xfffe;
        hca.cqs.cqs.get_mut(&t.r.cqn).unwrap().producer_counter = 0xff_fffe;
        let eq = hca.eqs.eqs.get_mut(&(t.r.eqn as u8)).unwrap();
        (eq.producer_counter, eq.consumer_counter) = (0xff_ffff, 0xff_ffff);
    }
    set_ci(&t, 0xff_fffe);
    arm(&mut t, 0, 0xff_fffe);
    // Four receive WQEs past 0xfffe: the record's 16-bit counter reads 2.
    post_recv(&t, 0x1_0002);
    to_err(&mut t, qpn);
    for (slot, counter, owner) in [(2, 0xfffe, 1), (3, 0xffff, 1), (0, 0, 0), (1, 1, 0)] {
        check_flush(&cqe(&t, slot), qpn, counter, owner);
    }
    let hca = t.d.model.hca();
    assert_eq!(hca.qps.get(qpn).unwrap().rq_consumed, 2);
    assert_eq!(hca.cqs.cqs[&t.r.cqn].producer_counter, 2);
    // One completion EQE, in the EQ's last slot (15) with owner (0xffffff >> 4) & 1; the counter is 0 after it.
    assert_eq!(eqes_written(&t), 0);
    let e = eqe(&t, 15);
    assert_eq!((e[1], be32(&e, 0x38) & 0xff_ffff, e[0x3f] & 1), (0x00, t.r.cqn, 1));
    // The CQ is full by the consumer counter across its wrap (0xfffffe → 2 is 4 CQEs): one more WQE overruns
    // it, and CQ_ERROR lands in EQ slot 0 with owner 0.
    post_recv(&t, 3);
    to_err(&mut t, qpn);
    let e = eqe(&t, 0);
    assert_eq!((e[1], be32(&e, 0x20) & 0xff_ffff, e[0x2b], e[0x3f] & 1), (0x04, t.r.cqn, 1, 0));
    assert_eq!(eqes_written(&t), 1);
}
