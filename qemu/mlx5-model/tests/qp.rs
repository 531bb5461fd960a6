//! CREATE/QUERY/DESTROY_QP and the RC state machine through the command queue (test-side driver in
//! `common`, builders in `support_qp`).

mod common;
mod support_qp;

use common::{Drv, be32, cmd};
use support_qp::*;

const OK: u8 = 0x00;
const BAD_PARAM: u8 = 0x03;
const NO_RES: u8 = 0x0f;
const BAD_QP_STATE: u8 = 0x10;
const BAD_INP_LEN: u8 = 0x50;

fn up() -> (Drv, u32, u32) {
    let mut d = Drv::new();
    d.bring_up();
    let pd = alloc_pd(&mut d);
    let uar = alloc_uar(&mut d);
    (d, pd, uar)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum S {
    Rst = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Err = 6,
}

/// A fresh QP driven to `s` through legal transitions.
fn qp_in(d: &mut Drv, pd: u32, uar: u32, s: S) -> u32 {
    let q = create_qp(d, pd, uar);
    if s == S::Err {
        d.ok(&short_in(QP_2ERR, q), 16);
        return q;
    }
    let steps: &[fn(u32, u32) -> Vec<u8>] =
        &[|q, pd| rst2init_in(q, pd), |q, pd| init2rtr_in(q, pd, 0x77, 0x100), |q, pd| rtr2rts_in(q, pd, 0x200)];
    for step in &steps[..s as usize] {
        d.ok(&step(q, pd), 16);
    }
    assert_eq!(qp_state(d, q), s as u32);
    q
}

#[test]
fn every_state_and_transition() {
    let (mut d, pd, uar) = up();
    // (command, legal from, resulting state)
    type Build = fn(u32, u32) -> Vec<u8>;
    let cmds: [(&str, Build, &[S], S); 6] = [
        ("RST2INIT", |q, pd| rst2init_in(q, pd), &[S::Rst], S::Init),
        ("INIT2RTR", |q, pd| init2rtr_in(q, pd, 0x77, 0x100), &[S::Init], S::Rtr),
        ("RTR2RTS", |q, pd| rtr2rts_in(q, pd, 0x200), &[S::Rtr], S::Rts),
        ("RTS2RTS", |q, pd| modify_in(RTS2RTS, q, pd), &[S::Rts], S::Rts),
        ("2ERR", |q, _| short_in(QP_2ERR, q), &[S::Rst, S::Init, S::Rtr, S::Rts, S::Err], S::Err),
        ("2RST", |q, _| short_in(QP_2RST, q), &[S::Rst, S::Init, S::Rtr, S::Rts, S::Err], S::Rst),
    ];
    for from in [S::Rst, S::Init, S::Rtr, S::Rts, S::Err] {
        for (name, build, legal, to) in &cmds {
            let q = qp_in(&mut d, pd, uar, from);
            let r = d.exec(&build(q, pd), 16);
            if legal.contains(&from) {
                assert_eq!(r.status(), OK, "{name} from {from:?}: syndrome {:#x}", r.syndrome());
                assert_eq!(qp_state(&mut d, q), *to as u32, "{name} from {from:?}");
            } else {
                assert_eq!(r.status(), BAD_QP_STATE, "{name} from {from:?}");
                assert_eq!(qp_state(&mut d, q), from as u32, "{name} from {from:?} must not move the QP");
            }
            d.ok(&short_in(DESTROY_QP, q), 16);
        }
    }
}

#[test]
fn query_returns_the_context_as_modified() {
    let (mut d, pd, uar) = up();
    let q = qp_in(&mut d, pd, uar, S::Rts);
    let out = query_qp(&mut d, q);
    assert_eq!(getf(&out, bit::STATE, 4), 3);
    assert_eq!(getf(&out, bit::PD, 24), pd);
    assert_eq!(getf(&out, bit::UAR_PAGE, 24), uar);
    assert_eq!(getf(&out, bit::MTU, 3), 3);
    assert_eq!(getf(&out, bit::REMOTE_QPN, 24), 0x77);
    assert_eq!(getf(&out, bit::NEXT_RCV_PSN, 24), 0x100);
    assert_eq!(getf(&out, bit::NEXT_SEND_PSN, 24), 0x200);
    assert_eq!(getf(&out, bit::RETRY_COUNT, 3), 7);
    assert_eq!(getf(&out, bit::ACK_TIMEOUT, 5), 14);
    assert_eq!(getf(&out, bit::UDP_SPORT, 16), 0xc123);
    assert_eq!(getf(&out, bit::RMAC_31_0, 32), 1);
    assert_eq!((getf(&out, bit::RRE, 1), getf(&out, bit::RWE, 1)), (1, 1));
    assert_eq!(out[0x40 + 10..0x40 + 16], [0xff, 0xff, 192, 168, 7, 1]);
    // pas[0] follows the fixed part.
    assert_eq!(&out[0x110..0x118], &WQ_PAGE.to_be_bytes());
}

#[test]
fn create_qp_validation() {
    let (mut d, pd, uar) = up();
    let st = |d: &mut Drv, c: &[u8]| d.exec(c, 16).status();
    // Unknown PD, unallocated UAR, UD service type, pm_state not MIGRATED.
    assert_eq!(st(&mut d, &create_qp_in(pd + 5, uar)), BAD_PARAM);
    assert_eq!(st(&mut d, &create_qp_in(pd, uar + 9)), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    setf(&mut c, bit::ST, 8, 2);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    setf(&mut c, bit::PM_STATE, 2, 0);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    // A misaligned doorbell record; a misaligned or out-of-RAM PAS page; no PAS at all.
    let mut c = create_qp_in(pd, uar);
    c[bit::DBR_ADDR_BYTE + 7] = 4;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    c[0x116] = 0x08;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    c[0x110..0x118].copy_from_slice(&(1u64 << 40).to_be_bytes());
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    assert_eq!(st(&mut d, &create_qp_in(pd, uar)[..0x110]), BAD_INP_LEN);
    // Optional parameters at creation, a reserved bit, uid.
    let mut c = create_qp_in(pd, uar);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 2);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    c[0x0c] = 1;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(pd, uar);
    c[3] = 1;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    // DEALLOC_PD refuses a PD a QP still uses.
    let q = create_qp(&mut d, pd, uar);
    let mut c = cmd(0x801, 0, 16);
    setf(&mut c, 0x48, 24, pd);
    assert_eq!(d.exec(&c, 16).status(), 0x09);
    d.ok(&short_in(DESTROY_QP, q), 16);
    d.ok(&c, 16);
}

#[test]
fn modify_validation() {
    let (mut d, pd, uar) = up();
    let q = qp_in(&mut d, pd, uar, S::Init);
    // Wrong PD, bad MTU, wrong port, no remote address, an optional parameter RTR does not take.
    let mut c = init2rtr_in(q, pd, 1, 0);
    setf(&mut c, bit::PD, 24, pd + 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, pd, 1, 0);
    setf(&mut c, bit::MTU, 3, 6);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, pd, 1, 0);
    setf(&mut c, bit::VHCA_PORT_NUM, 8, 2);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, pd, 1, 0);
    c[0x40..0x50].fill(0);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, pd, 1, 0);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 1 << 6);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    assert_eq!(qp_state(&mut d, q), 1);
    // Nonexistent QPs.
    for op in [RST2INIT, INIT2RTR, RTR2RTS, RTS2RTS] {
        assert_eq!(d.exec(&modify_in(op, 0x00ff_fff0, pd), 16).status(), BAD_PARAM);
    }
    for op in [QP_2ERR, QP_2RST, DESTROY_QP, QUERY_QP] {
        assert_eq!(d.exec(&short_in(op, 0x00ff_fff0), 0x1d0).status(), BAD_PARAM);
    }
    // RTS2RTS with an optional access change.
    let q = qp_in(&mut d, pd, uar, S::Rts);
    let mut c = modify_in(RTS2RTS, q, pd);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 1 << 3); // RWE
    d.ok(&c, 16);
    let out = query_qp(&mut d, q);
    assert_eq!((getf(&out, bit::RRE, 1), getf(&out, bit::RWE, 1)), (1, 0));
}

#[test]
fn log_max_qp_limits_the_table() {
    let (mut d, pd, uar) = up();
    // log_max_qp = 2: QPNs 2 and 3 (0 and 1 are the special QPs).
    d.model.hca_mut().caps.set_field(0, true, mlx5_model::caps::cmd_hca_cap::LOG_MAX_QP, 2);
    let a = create_qp(&mut d, pd, uar);
    let b = create_qp(&mut d, pd, uar);
    assert_eq!((a, b), (2, 3));
    let r = d.exec(&create_qp_in(pd, uar), 16);
    assert_eq!(r.status(), NO_RES);
    d.ok(&short_in(DESTROY_QP, a), 16);
    assert_eq!(be32(&d.ok(&create_qp_in(pd, uar), 16), 8), 2);
}
