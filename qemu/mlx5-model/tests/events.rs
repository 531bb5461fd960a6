//! Events: EQEs (type, sub type, data, owner bit per pass), the UAR EQ doorbell, PAGE_REQUEST holding a command
//! until pages are given on another slot, PORT_CHANGE from PAOS, QP and CQ errors.

mod common;
mod support_qp;

use common::{Drv, be32, cmd, create_cq_in, put32};
use mlx5_model::ModelConfig;
use mlx5_model::events::PageRequest;
use mlx5_model::mem::Memory;
use std::time::Duration;

const EQ_BUF: u64 = 0x3c0_0000;

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Brought-up driver with one UAR and a 4-entry EQ at `EQ_BUF` subscribed to `bitmask`; EQEs owner = 1.
fn with_eq(cfg: ModelConfig, bitmask: u64) -> (Drv, u32, u8) {
    let mut d = Drv::with(cfg, 64 << 20);
    d.bring_up();
    let uar = be32(&d.ok(&cmd(0x802, 0, 16), 16), 8);
    for i in 0..4 {
        d.ram.write(EQ_BUF + 64 * i + 63, &[1]).unwrap();
    }
    let mut b = cmd(0x301, 0, 0x118);
    put32(&mut b, 0x1c, (2 << 24) | uar);
    put64(&mut b, 0x58, bitmask);
    put64(&mut b, 0x110, EQ_BUF);
    let eqn = d.ok(&b, 16)[0xb];
    (d, uar, eqn)
}

/// `n` RC QPs (in RESET) on a new PD and a CQ reporting to `eqn`, through real commands: their QPNs.
fn qps(d: &mut Drv, uar: u32, eqn: u8, n: usize) -> Vec<u32> {
    let pd = support_qp::alloc_pd(d);
    let out = d.ok(&create_cq_in(6, uar, eqn.into(), EQ_BUF + 0x4000, EQ_BUF + 0x8000), 16);
    let r = support_qp::Res { pd, uar, eqn: eqn.into(), cqn: be32(&out, 8) & 0xff_ffff };
    (0..n).map(|_| support_qp::create_qp(d, r)).collect()
}

/// The link up at once (PORT_CHANGE here comes from PAOS writes; training is in `tests/port.rs`).
fn cfg() -> ModelConfig {
    ModelConfig::instant()
}

fn eqe(d: &Drv, i: u64) -> [u8; 64] {
    let mut e = [0u8; 64];
    d.ram.read(EQ_BUF + 64 * (i % 4), &mut e).unwrap();
    e
}

#[test]
fn eqes_carry_type_data_and_a_toggling_owner_bit() {
    let (mut d, uar, eqn) = with_eq(cfg(), (1 << 0x11) | (1 << 0x4));
    let q = qps(&mut d, uar, eqn, 6);
    // Not subscribed: nothing written.
    assert_eq!(d.model.raise_qp_event(q[0], 0x10), 0);
    assert_eq!(eqe(&d, 0)[1], 0);
    // A QPN that does not exist: refused, nothing written.
    assert_eq!(d.model.raise_qp_event(0x100, 0x11), 0);
    assert_eq!(eqe(&d, 0)[1], 0);
    // Four WQ_ACCESS_ERRORs fill the ring with owner 0 (first pass).
    for &n in &q[..4] {
        assert_eq!(d.model.raise_qp_event(n, 0x11), 1);
    }
    for i in 0..4 {
        let e = eqe(&d, i);
        assert_eq!((e[1], e[3], e[0x20 + 0x14], be32(&e, 0x38), e[63] & 1), (0x11, 0, 0, q[i as usize], 0));
    }
    // The consumer index moves through the UAR EQ doorbell (a fifth EQE before that would overrun the EQ:
    // `async_eq_overrun_is_fatal`).
    d.bar.write_be32(u64::from(uar) * 4096 + 0x40, (u32::from(eqn) << 24) | 2).unwrap();
    d.model.poll();
    assert_eq!(d.model.hca().eqs.eqs[&eqn].consumer_counter, 2);
    // Second pass: owner 1.
    assert_eq!(d.model.raise_cq_error(99, 1), 0, "no such CQ");
    assert_eq!(d.model.raise_qp_event(q[5], 0x11), 1);
    let e = eqe(&d, 4);
    assert_eq!((e[1], be32(&e, 0x38), e[63] & 1), (0x11, q[5], 1));
    // A destroyed QP raises nothing either.
    d.ok(&support_qp::short_in(support_qp::DESTROY_QP, q[5]), 16);
    assert_eq!(d.model.raise_qp_event(q[5], 0x11), 0);
}

/// Rule: an EQE for an EQ whose every entry is still the driver's (`oi` clear) is an overrun, and the firmware
/// enters internal error: health syndrome 0xc (`MLX5_INITIAL_SEG_HEALTH_SYNDROME_ASYNCHRONOUS_EQ_BUF_OVERRUN`),
/// stock `rfr` 0, commands no longer complete, the health counter stops, and the EQ takes no further EQE.
#[test]
fn async_eq_overrun_is_fatal() {
    let cfg = ModelConfig { health_period: Duration::from_millis(2), ..cfg() };
    let (mut d, uar, eqn) = with_eq(cfg, (1 << 0x11) | (1 << 0x4));
    let q = qps(&mut d, uar, eqn, 5);
    for &n in &q[..4] {
        assert_eq!(d.model.raise_qp_event(n, 0x11), 1);
    }
    d.model.poll();
    let mut hb = [0u8; 0x40];
    d.bar.read(0x200, &mut hb).unwrap();
    assert_eq!(hb[0x3d], 0, "a full EQ alone is no error");
    // The fifth has nowhere to go.
    assert_eq!(d.model.raise_qp_event(q[4], 0x11), 0);
    assert_eq!(d.model.hca().eqs.eqs[&eqn].overruns, 1);
    d.model.poll();
    d.bar.read(0x200, &mut hb).unwrap();
    assert_eq!(hb[0x3d], 0xc, "synd: async EQ buffer overrun");
    assert_eq!(hb[0x38] & 0x80, 0, "stock firmware's rfr 0");
    assert_eq!(d.bar.read_be32(0x1010).unwrap() >> 24, 0xc, "health_syndrome");
    // Commands are no longer answered.
    d.post(0, &cmd(0x107, 1, 16), 16);
    d.ring(1);
    for _ in 0..10 {
        d.model.poll();
    }
    let mut e = [0u8; 64];
    d.ram.read(common::CMDQ, &mut e).unwrap();
    assert_eq!(e[0x3f] & 1, 1, "QUERY_PAGES stays hardware-owned");
    // The health counter stops.
    let c = d.bar.read_be32(0x1010).unwrap() & 0xff_ffff;
    std::thread::sleep(Duration::from_millis(10));
    d.model.poll();
    assert_eq!(d.bar.read_be32(0x1010).unwrap() & 0xff_ffff, c, "health counter stopped");
    // Freeing entries does not bring the EQ back.
    d.bar.write_be32(u64::from(uar) * 4096 + 0x40, (u32::from(eqn) << 24) | 4).unwrap();
    d.model.poll();
    assert_eq!(d.model.raise_qp_event(q[0], 0x11), 0, "no EQE after the overrun");
}

#[test]
fn paos_down_and_up_raise_port_change() {
    let (mut d, _, _) = with_eq(cfg(), 1 << 0x9);
    let mut w = cmd(0x805, 0, 0x20);
    put32(&mut w, 8, 0x5006);
    put32(&mut w, 0x10, (1 << 16) | (2 << 8));
    put32(&mut w, 0x14, 1 << 31);
    let out = d.ok(&w, 0x20);
    assert_eq!(be32(&out, 0x10) & 0xf, 2, "oper down");
    let e = eqe(&d, 0);
    assert_eq!((e[1], e[3], e[0x28] >> 4, e[63] & 1), (0x09, 1, 1, 0));
    put32(&mut w, 0x10, (1 << 16) | (1 << 8));
    d.ok(&w, 0x20);
    let e = eqe(&d, 1);
    assert_eq!((e[1], e[3]), (0x09, 4), "ACTIVE");
}

/// Writes a command into `slot` with its own mailbox area (the common driver's is shared by all slots).
fn post_at(d: &Drv, slot: u32, input: &[u8], out_len: usize, mbox: u64, token: u8) {
    let inp = d.chain(mbox, input.get(16..).unwrap_or(&[]), token);
    let outp = d.chain(mbox + 0x8000, &vec![0u8; out_len.saturating_sub(16)], token);
    let mut e = [0u8; 64];
    e[0] = 7;
    put32(&mut e, 4, input.len() as u32);
    e[8..16].copy_from_slice(&inp.to_be_bytes());
    e[16..16 + input.len().min(16)].copy_from_slice(&input[..input.len().min(16)]);
    e[0x30..0x38].copy_from_slice(&outp.to_be_bytes());
    put32(&mut e, 0x38, out_len as u32);
    e[0x3c] = token;
    e[0x3f] = 1;
    d.ram.write(common::CMDQ + 64 * u64::from(slot), &e).unwrap();
}

/// A model that asks for 3 pages when it sees CREATE_CQ, with a CREATE_CQ posted on slot 0 and rung; returns the
/// driver and the CREATE_CQ input.
fn post_held_create_cq() -> (Drv, Vec<u8>) {
    let cfg = ModelConfig { page_request: Some(PageRequest { opcode: 0x400, num_pages: 3, times: 1 }), ..cfg() };
    let (mut d, uar, eqn) = with_eq(cfg, 1 << 0xb);
    let mut cq = cmd(0x400, 0, 0x118);
    put32(&mut cq, 0x1c, (6 << 24) | uar);
    put32(&mut cq, 0x24, eqn.into());
    put64(&mut cq, 0x48, EQ_BUF + 0x2000);
    put64(&mut cq, 0x110, EQ_BUF + 0x1000);
    post_at(&d, 0, &cq, 16, 0x3a0_0000, 0x41);
    d.ring(1);
    (d, cq)
}

fn owner(d: &Drv, slot: u32) -> u8 {
    let mut b = [0u8; 1];
    d.ram.read(common::CMDQ + 64 * u64::from(slot) + 0x3f, &mut b).unwrap();
    b[0]
}

#[test]
fn create_cq_waits_for_the_pages_it_asked_for() {
    let (mut d, cq) = post_held_create_cq();
    // The PAGE_REQUEST EQE: function 0, num_pages 3; the command is still the hardware's.
    let e = eqe(&d, 0);
    assert_eq!((e[1], be32(&e, 0x20), be32(&e, 0x24), e[63] & 1), (0x0b, 0, 3, 0));
    assert_eq!(owner(&d, 0) & 1, 1);
    assert_eq!(d.model.hca().page_waits.waiting(), vec![0]);
    d.model.poll();
    assert_eq!(owner(&d, 0) & 1, 1, "still held without pages");
    assert_eq!(d.model.hca().pages.query(3), 3, "QUERY_PAGES REGULAR would report the request too");
    // Give two pages on slot 1: not enough yet.
    let give = |d: &mut Drv, n: u32, tok: u8| {
        let mut g = cmd(0x108, 1, 16 + 8 * n as usize);
        put32(&mut g, 12, n);
        for i in 0..n as usize {
            put64(&mut g, 16 + 8 * i, d.next_page);
            d.next_page += 4096;
        }
        post_at(d, 1, &g, 16, 0x3b0_0000, tok);
        d.ring(2);
        assert_eq!(owner(d, 1), 0, "MANAGE_PAGES completes OK on its own slot");
    };
    give(&mut d, 2, 0x42);
    d.model.poll();
    assert_eq!(owner(&d, 0) & 1, 1);
    give(&mut d, 1, 0x43);
    d.model.poll();
    assert_eq!(owner(&d, 0), 0, "completed with delivery OK");
    let r = d.read_result(0, 16);
    assert_eq!(r.status(), 0, "syndrome {:#x}", r.syndrome());
    assert_eq!(be32(&r.out, 8), 1, "cqn");
    // Only once (times = 1): the next CREATE_CQ runs at once.
    d.ok(&cq, 16);
}

#[test]
fn runtime_page_request_without_a_command() {
    let (mut d, _, _) = with_eq(cfg(), 1 << 0xb);
    assert_eq!(d.model.request_pages(5), 1);
    let e = eqe(&d, 0);
    assert_eq!((e[1], be32(&e, 0x24)), (0x0b, 5));
    assert_eq!(d.query_pages(3), 5);
}

#[test]
fn allocation_fail_fails_the_command_held_for_pages() {
    let (mut d, cq) = post_held_create_cq();
    assert_eq!(eqe(&d, 0)[1], 0x0b, "PAGE_REQUEST");
    assert_eq!(owner(&d, 0) & 1, 1, "held");
    // The driver cannot allocate: MANAGE_PAGES op_mod ALLOCATION_FAIL (0), function 0, no entries (Linux
    // `page_notify_fail`), on slot 1. It completes OK itself.
    post_at(&d, 1, &cmd(0x108, 0, 16), 16, 0x3b0_0000, 0x42);
    d.ring(2);
    let r = d.read_result(1, 16);
    assert_eq!((r.delivery, r.status()), (0, 0));
    // The held CREATE_CQ completes (delivery OK, ownership back) with NO_RES and the model's syndrome
    // `opcode << 16 | ALLOCATION_FAILED (0x1e)`; no CQ was created and the demand it raised is withdrawn.
    d.model.poll();
    let r = d.read_result(0, 16);
    assert_eq!((r.delivery, r.status(), r.syndrome()), (0, 0x0f, (0x400 << 16) | 0x1e));
    assert!(d.model.hca().cqs.cqs.is_empty());
    assert!(d.model.hca().page_waits.waiting().is_empty());
    assert_eq!(d.query_pages(3), 0, "no REGULAR demand left");
    // Slot 0 is usable again, and the next CREATE_CQ runs at once (times = 1).
    let r = d.exec(&cq, 16);
    assert_eq!((r.delivery, r.status()), (0, 0), "syndrome {:#x}", r.syndrome());
}
