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

/// Absolute bits (inside the modify inputs) of the fields the RoCE path rules look at (`mlx5_ifc.h` `qpc`, `ads`).
const SRC_ADDR_INDEX: usize = 0x1c8;
const LOG_SRA_MAX: usize = 0x448;
const LOG_RRA_MAX: usize = 0x548;
const ATOMIC_MODE: usize = 0x54c;
const RAE: usize = 0x552;

#[test]
fn init2rtr_needs_a_written_rocev2_gid_of_the_paths_type_at_src_addr_index() {
    let (mut d, r) = up();
    let q = qp_in(&mut d, r, S::Init);
    // Index 0 holds the IPv4 RoCEv2 GID `setup` wrote; 5 was never written.
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, SRC_ADDR_INDEX, 8, 5);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "an empty entry");
    // Index 1: RoCEv2 but IPv6 (fe80::1) while the remote is IPv4-mapped.
    let mut v6 = set_roce_ipv4_in(1, [0; 4], PORT_MAC);
    v6[0x10..0x20].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    setf(&mut v6, 0x80 + 0xd4, 4, 1);
    d.ok(&v6, 16);
    setf(&mut c, SRC_ADDR_INDEX, 8, 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "an IPv6 GID for an IPv4 path");
    // Index 2: IPv4 but RoCE v1 (the model carries RoCEv2 only).
    let mut v1 = set_roce_ipv4_in(2, LOCAL_IP, PORT_MAC);
    setf(&mut v1, 0x80 + 0xd8, 8, 1);
    d.ok(&v1, 16);
    setf(&mut c, SRC_ADDR_INDEX, 8, 2);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "a RoCE v1 GID");
    assert_eq!(qp_state(&mut d, q), S::Init as u32);
    setf(&mut c, SRC_ADDR_INDEX, 8, 0);
    d.ok(&c, 16);
    // RTR2RTS looks again: the GID deleted meanwhile (an all-zero SET_ROCE_ADDRESS) stops it.
    let mut del = cmd(0x761, 0, 0x30);
    setf(&mut del, 0x40, 16, 0);
    d.ok(&del, 16);
    assert_eq!(d.exec(&rtr2rts_in(q, r, 0x200), 16).status(), BAD_PARAM);
    roce_port(&mut d);
    d.ok(&rtr2rts_in(q, r, 0x200), 16);
    assert_eq!(qp_state(&mut d, q), S::Rts as u32);
}

#[test]
fn init2rtr_refuses_a_path_firmware_cannot_use() {
    let (mut d, r) = up();
    let q = qp_in(&mut d, r, S::Init);
    type Edit = fn(&mut Vec<u8>);
    let bad: [(&str, Edit); 8] = [
        // The port runs 1500-byte frames: `iboe_get_mtu` gives 1024 (3); 2048 does not fit.
        ("MTU above the port's", |c| setf(c, bit::MTU, 3, 4)),
        // The reference caps: log_max_ra_res_qp = 4.
        ("log_rra_max above the cap", |c| setf(c, LOG_RRA_MAX, 3, 5)),
        ("a zero rmac", |c| {
            setf(c, bit::RMAC_47_32, 16, 0);
            setf(c, bit::RMAC_31_0, 32, 0);
        }),
        ("a multicast rmac", |c| setf(c, bit::RMAC_47_32, 16, 0x0100)),
        ("the broadcast rmac", |c| {
            setf(c, bit::RMAC_47_32, 16, 0xffff);
            setf(c, bit::RMAC_31_0, 32, u32::MAX);
        }),
        // roce_cap r_roce_min/max_src_udp_port: 0xc000..=0xffff.
        ("UDP source port below the range", |c| setf(c, bit::UDP_SPORT, 16, 0xbfff)),
        ("UDP source port 0", |c| setf(c, bit::UDP_SPORT, 16, 0)),
        ("UDP source port 4791", |c| setf(c, bit::UDP_SPORT, 16, 4791)),
    ];
    for (why, edit) in bad {
        let mut c = init2rtr_in(q, r, 1, 0);
        edit(&mut c);
        assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "{why}");
        assert_eq!(qp_state(&mut d, q), S::Init as u32, "{why}");
    }
    // The limits themselves are accepted.
    let mut c = init2rtr_in(q, r, 1, 0);
    setf(&mut c, bit::MTU, 3, 3);
    setf(&mut c, LOG_RRA_MAX, 3, 4);
    setf(&mut c, bit::UDP_SPORT, 16, 0xffff);
    d.ok(&c, 16);
    // The port's IB MTU follows its Ethernet MTU as Linux `iboe_get_mtu` computes it: 4096 needs 4096 + 96
    // bytes of RoCE headers + 22 of L2 (PMTU counts them).
    for (oper_mtu, ok) in [(4096 + 96 + 22 - 1, false), (4096 + 96 + 22, true)] {
        d.model.hca_mut().port.oper_mtu = oper_mtu;
        let q5 = qp_in(&mut d, r, S::Init);
        let mut c = init2rtr_in(q5, r, 1, 0);
        setf(&mut c, bit::MTU, 3, 5);
        assert_eq!(d.exec(&c, 16).status() == OK, ok, "PMTU {oper_mtu}");
    }
    // RTR2RTS: log_sra_max above log_max_ra_req_qp (4).
    let mut c = rtr2rts_in(q, r, 0x200);
    setf(&mut c, LOG_SRA_MAX, 3, 5);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    setf(&mut c, LOG_SRA_MAX, 3, 4);
    d.ok(&c, 16);
}

#[test]
fn remote_atomics_need_an_atomic_mode() {
    let (mut d, r) = up();
    let q = create_qp(&mut d, r);
    let mut c = rst2init_in(q, r);
    setf(&mut c, RAE, 1, 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM, "rae without atomic_mode");
    assert_eq!(qp_state(&mut d, q), S::Rst as u32);
    // MLX5_ATOMIC_MODE_IB_COMP (`driver.h`), as Linux `get_atomic_mode` picks on a card without extended atomics.
    setf(&mut c, ATOMIC_MODE, 4, 1);
    d.ok(&c, 16);
    let out = query_qp(&mut d, q);
    assert_eq!((getf(&out, RAE, 1), getf(&out, ATOMIC_MODE, 4)), (1, 1));
    // Later transitions that turn `rae` on (an optional parameter) need the mode too.
    let q = qp_in(&mut d, r, S::Rts);
    let mut c = modify_in(RTS2RTS, q, r);
    setf(&mut c, bit::OPT_PARAM_MASK, 32, 1 << 1 | 1 << 2 | 1 << 3); // RRE, RAE, RWE
    setf(&mut c, RAE, 1, 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    setf(&mut c, ATOMIC_MODE, 4, 1);
    d.ok(&c, 16);
}
