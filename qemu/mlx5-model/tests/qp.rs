//! CREATE/QUERY/DESTROY_QP and the RC state machine through the command queue (test-side driver in
//! `common`, builders in `support_qp`).

mod common;
mod support_qp;

use common::{Drv, QBUF, be32, cmd, create_cq_in};
use support_qp::*;

const OK: u8 = 0x00;
const BAD_PARAM: u8 = 0x03;
const BAD_RES_STATE: u8 = 0x09;
const NO_RES: u8 = 0x0f;
const BAD_QP_STATE: u8 = 0x10;
const BAD_INP_LEN: u8 = 0x50;

fn up() -> (Drv, Res) {
    let mut d = Drv::new();
    d.bring_up();
    let r = setup(&mut d);
    (d, r)
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
fn qp_in(d: &mut Drv, r: Res, s: S) -> u32 {
    let q = create_qp(d, r);
    if s == S::Err {
        d.ok(&short_in(QP_2ERR, q), 16);
        return q;
    }
    let steps: &[fn(u32, Res) -> Vec<u8>] =
        &[|q, r| rst2init_in(q, r), |q, r| init2rtr_in(q, r, 0x77, 0x100), |q, r| rtr2rts_in(q, r, 0x200)];
    for step in &steps[..s as usize] {
        d.ok(&step(q, r), 16);
    }
    assert_eq!(qp_state(d, q), s as u32);
    q
}

#[test]
fn every_state_and_transition() {
    let (mut d, r) = up();
    // (command, legal from, resulting state)
    type Build = fn(u32, Res) -> Vec<u8>;
    let cmds: [(&str, Build, &[S], S); 6] = [
        ("RST2INIT", |q, r| rst2init_in(q, r), &[S::Rst], S::Init),
        ("INIT2RTR", |q, r| init2rtr_in(q, r, 0x77, 0x100), &[S::Init], S::Rtr),
        ("RTR2RTS", |q, r| rtr2rts_in(q, r, 0x200), &[S::Rtr], S::Rts),
        ("RTS2RTS", |q, r| modify_in(RTS2RTS, q, r), &[S::Rts], S::Rts),
        ("2ERR", |q, _| short_in(QP_2ERR, q), &[S::Rst, S::Init, S::Rtr, S::Rts, S::Err], S::Err),
        ("2RST", |q, _| short_in(QP_2RST, q), &[S::Rst, S::Init, S::Rtr, S::Rts, S::Err], S::Rst),
    ];
    for from in [S::Rst, S::Init, S::Rtr, S::Rts, S::Err] {
        for (name, build, legal, to) in &cmds {
            let q = qp_in(&mut d, r, from);
            let r = d.exec(&build(q, r), 16);
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
    let (mut d, r) = up();
    let q = qp_in(&mut d, r, S::Rts);
    let out = query_qp(&mut d, q);
    assert_eq!(getf(&out, bit::STATE, 4), 3);
    assert_eq!(getf(&out, bit::PD, 24), r.pd);
    assert_eq!(getf(&out, bit::UAR_PAGE, 24), r.uar);
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
    let (mut d, r) = up();
    let st = |d: &mut Drv, c: &[u8]| d.exec(c, 16).status();
    // Unknown PD, unallocated UAR, UD service type, pm_state not MIGRATED.
    assert_eq!(st(&mut d, &create_qp_in(Res { pd: r.pd + 5, ..r })), BAD_PARAM);
    assert_eq!(st(&mut d, &create_qp_in(Res { uar: r.uar + 9, ..r })), BAD_PARAM);
    let mut c = create_qp_in(r);
    setf(&mut c, bit::ST, 8, 2);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(r);
    setf(&mut c, bit::PM_STATE, 2, 0);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    // A misaligned doorbell record; a misaligned or out-of-RAM PAS page; no PAS at all.
    let mut c = create_qp_in(r);
    c[bit::DBR_ADDR_BYTE + 7] = 4;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(r);
    c[0x116] = 0x08;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(r);
    c[0x110..0x118].copy_from_slice(&(1u64 << 40).to_be_bytes());
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    assert_eq!(st(&mut d, &create_qp_in(r)[..0x110]), BAD_INP_LEN);
    // Optional parameters at creation, a reserved bit, uid.
    let mut c = create_qp_in(r);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 2);
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(r);
    c[0x0c] = 1;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    let mut c = create_qp_in(r);
    c[3] = 1;
    assert_eq!(st(&mut d, &c), BAD_PARAM);
    // DEALLOC_PD refuses a PD a QP still uses.
    let q = create_qp(&mut d, r);
    let mut c = cmd(0x801, 0, 16);
    setf(&mut c, 0x48, 24, r.pd);
    assert_eq!(d.exec(&c, 16).status(), BAD_RES_STATE);
    d.ok(&short_in(DESTROY_QP, q), 16);
    d.ok(&c, 16);
}

#[test]
fn modify_validation() {
    let (mut d, r) = up();
    let q = qp_in(&mut d, r, S::Init);
    // Wrong PD, bad MTU, wrong port, no remote address, an optional parameter RTR does not take.
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, bit::PD, 24, r.pd + 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, bit::MTU, 3, 6);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, bit::VHCA_PORT_NUM, 8, 2);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, r, 1, 0);
    c[0x40..0x50].fill(0);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 1 << 6);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    assert_eq!(qp_state(&mut d, q), 1);
    // Nonexistent QPs.
    for op in [RST2INIT, INIT2RTR, RTR2RTS, RTS2RTS] {
        assert_eq!(d.exec(&modify_in(op, 0x00ff_fff0, r), 16).status(), BAD_PARAM);
    }
    for op in [QP_2ERR, QP_2RST, DESTROY_QP, QUERY_QP] {
        assert_eq!(d.exec(&short_in(op, 0x00ff_fff0), 0x1d0).status(), BAD_PARAM);
    }
    // RTS2RTS with an optional access change.
    let q = qp_in(&mut d, r, S::Rts);
    let mut c = modify_in(RTS2RTS, q, r);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 1 << 3); // RWE
    d.ok(&c, 16);
    let out = query_qp(&mut d, q);
    assert_eq!((getf(&out, bit::RRE, 1), getf(&out, bit::RWE, 1)), (1, 0));
}

#[test]
fn log_max_qp_limits_the_table() {
    let (mut d, r) = up();
    // log_max_qp = 2: QPNs 2 and 3 (0 and 1 are the special QPs).
    d.model.hca_mut().caps.set_field(0, true, mlx5_model::caps::cmd_hca_cap::LOG_MAX_QP, 2);
    let a = create_qp(&mut d, r);
    let b = create_qp(&mut d, r);
    assert_eq!((a, b), (2, 3));
    assert_eq!(d.exec(&create_qp_in(r), 16).status(), NO_RES);
    d.ok(&short_in(DESTROY_QP, a), 16);
    assert_eq!(be32(&d.ok(&create_qp_in(r), 16), 8), 2);
}

#[test]
fn create_qp_needs_existing_cqs_and_destroy_cq_waits_for_its_qps() {
    let (mut d, r) = up();
    let st = |d: &mut Drv, c: &[u8]| d.exec(c, 16);
    // A second CQ on the same EQ, for a QP whose send and receive CQs differ.
    let out = d.ok(&create_cq_in(6, r.uar, r.eqn, QBUF + 0x2000, QBUF + 0x10_0040), 16);
    let cq2 = be32(&out, 8) & 0xff_ffff;
    // cqn_snd or cqn_rcv naming no CQ (0 included): BAD_PARAM, reason QP_BAD_CQ (0x47).
    for (f, cqn) in [(bit::CQN_SND, 0x77), (bit::CQN_RCV, 0x77), (bit::CQN_SND, 0), (bit::CQN_RCV, 0)] {
        let mut c = create_qp_in(r);
        setf(&mut c, f, 24, cqn);
        let res = st(&mut d, &c);
        assert_eq!((res.status(), res.syndrome()), (BAD_PARAM, (0x500 << 16) | 0x47), "field {f:#x} cqn {cqn}");
    }
    assert!(d.model.hca().qps.qps.is_empty());
    let mut c = create_qp_in(r);
    setf(&mut c, bit::CQN_RCV, 24, cq2);
    let q = be32(&d.ok(&c, 16), 8) & 0xff_ffff;
    // DESTROY_CQ of either CQ while the QP uses it: BAD_RES_STATE, the CQ stays.
    let destroy_cq = |cqn: u32| {
        let mut y = cmd(0x401, 0, 16);
        setf(&mut y, 0x48, 24, cqn);
        y
    };
    for cqn in [r.cqn, cq2] {
        let res = st(&mut d, &destroy_cq(cqn));
        assert_eq!((res.status(), res.syndrome()), (BAD_RES_STATE, (0x401 << 16) | 0x1d));
        assert!(d.model.hca().cqs.cqs.contains_key(&cqn));
    }
    d.ok(&short_in(DESTROY_QP, q), 16);
    d.ok(&destroy_cq(cq2), 16);
    d.ok(&destroy_cq(r.cqn), 16);
}

#[test]
fn dealloc_uar_waits_for_its_eq_cq_and_qp() {
    let (mut d, r) = up();
    let q = create_qp(&mut d, r);
    let mut c = cmd(0x803, 0, 16);
    setf(&mut c, 0x48, 24, r.uar);
    let refused = |d: &mut Drv| {
        let res = d.exec(&c, 16);
        assert_eq!((res.status(), res.syndrome()), (BAD_RES_STATE, (0x803 << 16) | 0x1d));
        assert!(d.model.hca().uars.contains(&r.uar));
    };
    // The QP, then the CQ, then the EQ each keep the page.
    refused(&mut d);
    d.ok(&short_in(DESTROY_QP, q), 16);
    refused(&mut d);
    let mut y = cmd(0x401, 0, 16);
    setf(&mut y, 0x48, 24, r.cqn);
    d.ok(&y, 16);
    refused(&mut d);
    let mut x = cmd(0x302, 0, 16);
    setf(&mut x, 0x48, 24, r.eqn);
    d.ok(&x, 16);
    d.ok(&c, 16);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "gone");
}
