//! Bring-up on the model's two capability profiles (docs/hca-model.md, "The ConnectX-5 profile"): on the
//! ConnectX-5 default the driver takes the CX-5 branches Linux takes — `release_all_pages` and `roce` in the
//! GENERAL SET_HCA_CAP, host-endian 8-byte atomics in an ATOMIC SET_HCA_CAP (`handle_hca_cap_atomic`) — and
//! on the trace's ConnectX-4 it takes none of them (the model refuses each there).

mod common;

use mlx5_model::ModelConfig;
use mlx5_model::caps::{CapsProfile, atomic_caps, cap_type, cmd_hca_cap};

fn config(caps: CapsProfile) -> ModelConfig {
    ModelConfig { caps, ..ModelConfig::instant() }
}

/// Brings the driver up on `caps` after `edit` changed the model's blocks; returns the driver and the model's
/// current (release_all_pages, roce, atomic endianness mode) after bring-up.
fn bring_up(caps: CapsProfile, edit: impl FnOnce(&mut mlx5_model::caps::Caps)) -> (common::Hosted, (u32, u32, u32)) {
    let p = common::platform(config(caps));
    edit(&mut p.model().unwrap().hca_mut().caps);
    let d = leasebox_mlx5::driver::Driver::bring_up(p.clone(), common::driver_config())
        .unwrap_or_else(|e| panic!("bring-up on {caps:?}: {e}"));
    let m = p.model().unwrap();
    let c = &m.hca().caps;
    let now = (
        c.general(cmd_hca_cap::RELEASE_ALL_PAGES),
        c.general(cmd_hca_cap::ROCE),
        c.current(cap_type::ATOMIC, atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE),
    );
    drop(m);
    (d, now)
}

#[test]
fn the_driver_takes_the_cx5_branches_of_bring_up() {
    assert_eq!(common::model_config().caps, CapsProfile::ConnectX5, "the hosted tests run on the CX-5 profile");
    let (d, (release_all, roce, endianness)) = bring_up(CapsProfile::ConnectX5, |_| {});
    assert_eq!(release_all, 1, "release_all_pages set (the maximum offers it)");
    assert_eq!(roce, 1);
    assert_eq!(endianness, 1, "host-endian 8-byte atomic responses (handle_hca_cap_atomic)");
    assert!(d.info.roce);
    assert!(d.info.caps.release_all_pages);
    assert_eq!(d.info.qp.user_index, Some(leasebox_mlx5::ifc::qp::DEFAULT_USER_INDEX), "CQE version 1");
    assert_eq!(d.info.qp.ts_format, leasebox_mlx5::ifc::qp::TS_FORMAT_FREE_RUNNING, "free-running clock only");
}

#[test]
fn the_trace_profile_takes_none_of_them() {
    let (d, (release_all, roce, endianness)) = bring_up(CapsProfile::ConnectX4Trace, |_| {});
    assert_eq!((release_all, roce, endianness), (0, 1, 0));
    assert!(d.info.roce, "RoCE on, as the trace's firmware reports it");
}

#[test]
fn roce_off_is_switched_on_only_where_roce_rw_supported() {
    let off = |c: &mut mlx5_model::caps::Caps| c.set_field(cap_type::GENERAL, true, cmd_hca_cap::ROCE, 0);
    // CX-5: RoCE can be switched, and Linux's handle_hca_cap asks for it.
    let (d, (_, roce, _)) = bring_up(CapsProfile::ConnectX5, off);
    assert_eq!(roce, 1);
    assert!(d.info.roce);
    // The trace's CX-4 cannot switch it: the driver leaves it off (the model would refuse a change).
    let (d, (_, roce, _)) = bring_up(CapsProfile::ConnectX4Trace, off);
    assert_eq!(roce, 0);
    assert!(!d.info.roce);
}
