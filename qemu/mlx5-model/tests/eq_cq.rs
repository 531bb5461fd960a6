//! CREATE/DESTROY/QUERY_EQ and CREATE/DESTROY_CQ through the command queue: good input and each error class.

mod common;

use common::{Drv, QBUF, be32, cmd, create_cq_in, create_eq_in, put32};

const BAD_PARAM: u8 = 0x03;
const BAD_SYS_STATE: u8 = 0x04;
const BAD_RES_STATE: u8 = 0x09;
const NO_RES: u8 = 0x0f;
const BAD_INP_LEN: u8 = 0x50;
const BAD_OUTP_LEN: u8 = 0x51;

fn alloc_uar(d: &mut Drv) -> u32 {
    be32(&d.ok(&cmd(0x802, 0, 16), 16), 8) & 0xff_ffff
}

fn up() -> (Drv, u32) {
    let mut d = Drv::new();
    d.bring_up();
    let uar = alloc_uar(&mut d);
    (d, uar)
}

#[test]
fn create_query_destroy_eq() {
    let (mut d, uar) = up();
    let out = d.ok(&create_eq_in(4, uar, 1 << 0xb, QBUF), 16);
    let eqn = u32::from(out[0xb]);
    assert_eq!(eqn, 0x10, "the first EQ number a ConnectX-4 hands out");
    let out = d.ok(&create_eq_in(4, uar, 0x001f_02be, QBUF + 0x1000), 16);
    assert_eq!(out[0xb], 0x11);
    let mut q = cmd(0x303, 0, 16);
    put32(&mut q, 8, eqn);
    let out = d.ok(&q, 0x118);
    assert_eq!(be32(&out, 0x1c), (4 << 24) | uar, "eqc log_eq_size / uar_page echoed");
    assert_eq!(u64::from_be_bytes(out[0x58..0x60].try_into().unwrap()), 1 << 0xb, "event_bitmask");
    assert_eq!(u64::from_be_bytes(out[0x110..0x118].try_into().unwrap()), QBUF, "pas[0]");
    let mut x = cmd(0x302, 0, 16);
    put32(&mut x, 8, eqn);
    d.ok(&x, 16);
    // Gone: destroy and query again fail.
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&q, 0x110).status(), BAD_PARAM);
}

#[test]
fn create_eq_errors() {
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    // Before INIT_HCA.
    assert_eq!(d.exec(&create_eq_in(4, 0x10, 0, QBUF), 16).status(), BAD_SYS_STATE);
    let (mut d, uar) = up();
    // Short input: fixed part, then the PAS list.
    assert_eq!(d.exec(&cmd(0x301, 0, 0x100), 16).status(), BAD_INP_LEN);
    let mut short = create_eq_in(4, uar, 0, QBUF);
    short.truncate(0x110);
    assert_eq!(d.exec(&short, 16).status(), BAD_INP_LEN);
    // Output too short.
    assert_eq!(d.exec(&create_eq_in(4, uar, 0, QBUF), 8).status(), BAD_OUTP_LEN);
    // op_mod, reserved bits, uid.
    let mut b = create_eq_in(4, uar, 0, QBUF);
    put32(&mut b, 4, 1);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    let mut b = create_eq_in(4, uar, 0, QBUF);
    b[0x80] = 1;
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    // UAR not allocated; size above log_max_eq_sz (22); misaligned, outside-RAM and device-owned pages.
    assert_eq!(d.exec(&create_eq_in(4, uar + 1, 0, QBUF), 16).status(), BAD_PARAM);
    let mut b = create_eq_in(4, uar, 0, QBUF);
    put32(&mut b, 0x1c, (23 << 24) | uar);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_eq_in(4, uar, 0, QBUF + 8), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_eq_in(4, uar, 0, 64 << 20), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_eq_in(4, uar, 0, common::PAGES), 16).status(), BAD_PARAM);
    // page_offset (not supported) and ec.
    let mut b = create_eq_in(4, uar, 0, QBUF);
    put32(&mut b, 0x18, 1 << 6);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    // Table full: log_max_eq 8 → EQNs 0x10..=0xfe.
    for _ in 0x10..=0xfe {
        d.ok(&create_eq_in(0, uar, 0, QBUF), 16);
    }
    assert_eq!(d.exec(&create_eq_in(0, uar, 0, QBUF), 16).status(), NO_RES);
}

#[test]
fn create_destroy_cq_and_errors() {
    let (mut d, uar) = up();
    let eqn = u32::from(d.ok(&create_eq_in(4, uar, 0, QBUF), 16)[0xb]);
    let dbr = QBUF + 0x10_0000;
    let out = d.ok(&create_cq_in(6, uar, eqn, QBUF + 0x1000, dbr), 16);
    let cqn = be32(&out, 8) & 0xff_ffff;
    assert_eq!(cqn, 1);
    let model_cq = d.model.hca().cqs.cqs[&cqn].clone();
    assert_eq!((model_cq.log_cq_size, model_cq.cqe_size, model_cq.c_eqn, model_cq.dbr_addr), (6, 64, eqn as u8, dbr));
    assert_eq!(model_cq.pas, vec![QBUF + 0x1000]);
    // The EQ is in use while the CQ reports to it.
    let mut x = cmd(0x302, 0, 16);
    put32(&mut x, 8, eqn);
    assert_eq!(d.exec(&x, 16).status(), BAD_RES_STATE);
    // Errors: no such EQ, UAR, misaligned doorbell record, size above log_max_cq_sz (22), CQE size 2,
    // compression, short PAS list.
    assert_eq!(d.exec(&create_cq_in(6, uar, 0x40, QBUF + 0x1000, dbr), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_cq_in(6, uar + 3, eqn, QBUF + 0x1000, dbr), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_cq_in(6, uar, eqn, QBUF + 0x1000, dbr + 4), 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&create_cq_in(6, uar, eqn, QBUF + 0x1000, 64 << 20), 16).status(), BAD_PARAM);
    let mut b = create_cq_in(6, uar, eqn, QBUF + 0x1000, dbr);
    put32(&mut b, 0x1c, (23 << 24) | uar);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    let mut b = create_cq_in(6, uar, eqn, QBUF + 0x1000, dbr);
    put32(&mut b, 0x10, 2 << 21);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    let mut b = create_cq_in(6, uar, eqn, QBUF + 0x1000, dbr);
    put32(&mut b, 0x10, 1 << 14);
    assert_eq!(d.exec(&b, 16).status(), BAD_PARAM);
    let mut b = create_cq_in(8, uar, eqn, QBUF + 0x1000, dbr);
    b.truncate(0x118);
    assert_eq!(d.exec(&b, 16).status(), BAD_INP_LEN);
    // Destroy: good, then unknown CQN, reserved bits.
    let mut y = cmd(0x401, 0, 16);
    put32(&mut y, 8, cqn);
    d.ok(&y, 16);
    assert_eq!(d.exec(&y, 16).status(), BAD_PARAM);
    put32(&mut y, 12, 1);
    assert_eq!(d.exec(&y, 16).status(), BAD_PARAM);
    d.ok(&x, 16);
    // TEARDOWN_HCA drops EQs and CQs.
    d.ok(&create_eq_in(4, uar, 0, QBUF), 16);
    d.ok(&cmd(0x103, 0, 16), 16);
    assert!(d.model.hca().eqs.eqs.is_empty());
}
