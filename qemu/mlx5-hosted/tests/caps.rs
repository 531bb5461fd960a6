//! The QP context values the driver takes from the HCA's capabilities (docs/mlx5-driver.md, "QP values from
//! the capabilities"): the model's caps are changed before bring-up and the QPs the driver builds follow.

mod common;

use leasebox_mlx5::driver::Driver;
use leasebox_mlx5::handles::Qpn;
use leasebox_mlx5::ifc::qp::{self, Mtu, QpAccess, RcPeer};
use leasebox_mlx5::objects::RcQpSizes;
use mlx5_hosted::HostedPlatform;
use mlx5_model::caps::cap_type::GENERAL;
use mlx5_model::ifc::Field;

use std::sync::Arc;

/// `cmd_hca_cap` fields (`mlx5_ifc.h`, offsets by offsetof): `log_max_ra_res_qp`, `log_max_msg`, `atomic`.
const LOG_MAX_RA_RES_QP: Field = Field::new(0x15a, 6);
const LOG_MAX_MSG: Field = Field::new(0x1c3, 5);
const ATOMIC: Field = Field::new(0x21e, 1);

/// A fresh model with `fields` set in both the maximum and the current GENERAL block.
fn platform_with(fields: &[(Field, u32)]) -> Arc<HostedPlatform> {
    let p = common::platform(common::model_config());
    {
        let mut m = p.model().unwrap();
        for &(f, v) in fields {
            for current in [false, true] {
                m.hca_mut().caps.set_field(GENERAL, current, f, v);
            }
        }
    }
    p
}

fn peer(log_rra_max: u8) -> RcPeer {
    RcPeer {
        qpn: Qpn(0xabcd),
        psn: 0x12_3456,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2],
        mac: [0x02, 0x4c, 0x42, 0, 0, 2],
        mtu: Mtu::Mtu1024,
        sgid_index: 0,
        hop_limit: 64,
        udp_sport: 0xc000,
        tclass: 0,
        eth_prio: 0,
        log_rra_max,
        min_rnr_nak: 12,
    }
}

#[test]
fn qp_values_follow_smaller_caps() {
    let p = platform_with(&[(LOG_MAX_MSG, 20), (LOG_MAX_RA_RES_QP, 2)]);
    let mut d = Driver::bring_up(p, common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert_eq!((d.info.qp.log_msg_max, d.info.qp.log_max_ra_res), (20, 2));
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(6).unwrap();
    d.roce_gid(0, [192, 0, 2, 1]).unwrap();
    let rc = d.create_rc_qp(pd, cq.cqn, RcQpSizes::default()).unwrap();
    assert_eq!(d.query_qp(rc.qpn()).unwrap().log_msg_max, 20, "CREATE_QP took log_max_msg");
    d.qp_rst2init(&rc, QpAccess { remote_read: true, remote_write: true, remote_atomic: false }).unwrap();
    // The model refuses a responder depth above log_max_ra_res_qp (docs/hca-model.md, "RoCE port rules"):
    // the constant the lease plan once used (4) no longer fits.
    assert_eq!(d.exec(qp::init2rtr(&rc.base, &peer(4), d.info.qp.log_msg_max)).unwrap_err().status(), Some(0x03));
    d.qp_init2rtr(&rc, &peer(4.min(d.info.qp.log_max_ra_res))).unwrap();
    let info = d.query_qp(rc.qpn()).unwrap();
    assert_eq!((info.state, info.log_msg_max, info.log_rra_max), (qp::QpState::Rtr, 20, 2));
}

#[test]
fn atomics_follow_the_caps() {
    // The ConnectX-4 trace's ATOMIC caps (all four operations, 4..32-byte operands): Linux `get_atomic_mode`
    // gives the 32-byte mode (5), and RST2INIT with remote atomics is accepted.
    let mut d = common::up();
    assert_eq!(d.info.qp.atomic_mode, Some(5));
    assert_eq!(d.info.qp.atomics_refused(), None);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(6).unwrap();
    let rc = d.create_rc_qp(pd, cq.cqn, RcQpSizes::default()).unwrap();
    d.qp_rst2init(&rc, QpAccess { remote_read: true, remote_write: false, remote_atomic: true }).unwrap();
    assert!(d.query_qp(rc.qpn()).unwrap().rae);

    // `cmd_hca_cap.atomic` off: no atomic mode, a reason to refuse, and the firmware refuses `rae` alone.
    let p = platform_with(&[(ATOMIC, 0)]);
    let mut d = Driver::bring_up(p, common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert_eq!(d.info.qp.atomic_mode, None);
    assert!(d.info.qp.atomics_refused().is_some_and(|why| why.contains("atomic")));
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(6).unwrap();
    let rc = d.create_rc_qp(pd, cq.cqn, RcQpSizes::default()).unwrap();
    let e = d.qp_rst2init(&rc, QpAccess { remote_read: true, remote_write: false, remote_atomic: true }).unwrap_err();
    assert!(e.status().is_some(), "{e}");
    d.qp_rst2init(&rc, QpAccess { remote_read: true, remote_write: true, remote_atomic: false }).unwrap();
}
