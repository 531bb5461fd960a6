//! The two capability profiles (`ModelConfig::caps`): what QUERY_HCA_CAP reports under each, and the rules the
//! caps imply — SET_HCA_CAP `roce` only with `roce_rw_supported`, the ATOMIC endianness mode only when offered
//! and within the maximum, `release_all_pages` only when the maximum offers it, CREATE_QP's `ts_format` only from
//! the clocks the caps offer and its `user_index` as the CQE version calls for (docs/hca-model.md, "The
//! ConnectX-5 profile").

mod common;
mod support_qp;

use common::{Drv, be32, cmd};
use mlx5_model::ModelConfig;
use mlx5_model::caps::{CapsProfile, atomic_caps, cap_type, cmd_hca_cap, roce_cap};
use mlx5_model::ifc::{self, Field};
use support_qp::*;

const QUERY_HCA_CAP: u16 = 0x100;
const SET_HCA_CAP: u16 = 0x109;
const BAD_PARAM: u8 = 0x03;
/// `cmd::reason` values the model puts in the syndrome's low 16 bits.
const CAP_ABOVE_MAX: u32 = 0x0e;
const CAP_READ_ONLY: u32 = 0x1f;
const QP_BAD_TS_FORMAT: u32 = 0x48;
const QP_BAD_USER_INDEX: u32 = 0x49;

fn drv(profile: CapsProfile, vf: bool) -> Drv {
    Drv::with(ModelConfig { caps: profile, vf, ..ModelConfig::instant() }, 64 << 20)
}

/// ENABLE_HCA and SET_ISSI (what SET_HCA_CAP needs), not yet INIT_HCA.
fn enabled(profile: CapsProfile) -> Drv {
    let mut d = drv(profile, false);
    d.ok(&cmd(0x104, 0, 16), 16);
    let mut s = cmd(0x10b, 0, 16);
    common::put32(&mut s, 8, 1);
    d.ok(&s, 16);
    d
}

/// The 4 KiB block QUERY_HCA_CAP returns for `cap_type` (maximum or current).
fn query(d: &mut Drv, cap_type: u16, current: bool) -> Vec<u8> {
    let out = d.ok(&cmd(QUERY_HCA_CAP, (cap_type << 1) | u16::from(current), 16), 0x1010);
    out[0x10..].to_vec()
}

/// SET_HCA_CAP of `cap_type` with `block`: (status, syndrome reason).
fn set(d: &mut Drv, cap_type: u16, block: &[u8]) -> (u8, u32) {
    let mut c = cmd(SET_HCA_CAP, cap_type << 1, 0x1010);
    c[0x10..].copy_from_slice(block);
    let r = d.exec(&c, 16);
    (r.status(), r.syndrome() & 0xffff)
}

#[test]
fn the_cx5_profile_reports_its_fields_and_the_cx4_profile_the_traces() {
    let mut cx5 = enabled(CapsProfile::ConnectX5);
    let mut cx4 = enabled(CapsProfile::ConnectX4Trace);
    let mut differ = 0;
    for (t, name, f, max, cur, source) in mlx5_model::caps::Caps::connectx5_fields() {
        assert!(!source.is_empty(), "{name} has a source");
        assert_eq!(ifc::get(&query(&mut cx5, t, false), f), max, "CX-5 maximum {name}");
        assert_eq!(ifc::get(&query(&mut cx5, t, true), f), cur, "CX-5 current {name}");
        if ifc::get(&query(&mut cx4, t, false), f) != max || ifc::get(&query(&mut cx4, t, true), f) != cur {
            differ += 1;
        }
    }
    // The CX-5 branches of bring-up the issue names.
    let g = query(&mut cx5, cap_type::GENERAL, true);
    assert_eq!(ifc::get(&g, cmd_hca_cap::ROCE_RW_SUPPORTED), 1);
    assert_eq!(ifc::get(&g, cmd_hca_cap::CQE_VERSION), 1);
    assert_eq!(ifc::get(&query(&mut cx5, cap_type::GENERAL, false), cmd_hca_cap::RELEASE_ALL_PAGES), 1);
    assert_eq!(ifc::get(&query(&mut cx5, cap_type::ROCE, true), roce_cap::QP_TS_FORMAT), 0, "free running only");
    // The trace's ConnectX-4 has none of them.
    let g4 = query(&mut cx4, cap_type::GENERAL, false);
    assert_eq!(ifc::get(&g4, cmd_hca_cap::ROCE_RW_SUPPORTED), 0);
    assert_eq!(ifc::get(&g4, cmd_hca_cap::RELEASE_ALL_PAGES), 0);
    let a4 = query(&mut cx4, cap_type::ATOMIC, false);
    assert_eq!(ifc::get(&a4, atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1), 0);
    // roce_rw_supported, release_all_pages, the two atomic endianness fields, umr_ptr_rlky.
    assert_eq!(differ, 5, "the profiles differ in exactly the fields the table says");
    // Everything else is the trace's, byte for byte, outside the changed fields: the Ethernet offloads and
    // flow table blocks are identical.
    for t in [cap_type::ETHERNET_OFFLOADS, 7] {
        for current in [false, true] {
            assert_eq!(query(&mut cx5, t, current), query(&mut cx4, t, current), "cap type {t}");
        }
    }
}

#[test]
fn the_default_profile_is_the_cx5() {
    assert_eq!(ModelConfig::default().caps, CapsProfile::ConnectX5);
    let mut d = Drv::new();
    d.ok(&cmd(0x104, 0, 16), 16);
    assert_eq!(ifc::get(&query(&mut d, cap_type::GENERAL, true), cmd_hca_cap::ROCE_RW_SUPPORTED), 1);
}

#[test]
fn roce_is_settable_only_with_roce_rw_supported() {
    // CX-5: roce_rw_supported, so the driver may switch RoCE off (and on again).
    let mut d = enabled(CapsProfile::ConnectX5);
    let mut b = query(&mut d, cap_type::GENERAL, true);
    ifc::set(&mut b, cmd_hca_cap::ROCE, 0);
    assert_eq!(set(&mut d, cap_type::GENERAL, &b), (0, 0));
    assert_eq!(ifc::get(&query(&mut d, cap_type::GENERAL, true), cmd_hca_cap::ROCE), 0);
    ifc::set(&mut b, cmd_hca_cap::ROCE, 1);
    assert_eq!(set(&mut d, cap_type::GENERAL, &b), (0, 0));
    assert_eq!(ifc::get(&query(&mut d, cap_type::GENERAL, true), cmd_hca_cap::ROCE), 1);
    // The trace's CX-4: roce is read-only; the current value passes, another is refused and nothing changes.
    let mut d = enabled(CapsProfile::ConnectX4Trace);
    let mut b = query(&mut d, cap_type::GENERAL, true);
    assert_eq!(set(&mut d, cap_type::GENERAL, &b), (0, 0), "the current block as it is");
    ifc::set(&mut b, cmd_hca_cap::ROCE, 0);
    ifc::set(&mut b, cmd_hca_cap::LOG_MAX_QP, 0x10);
    assert_eq!(set(&mut d, cap_type::GENERAL, &b), (BAD_PARAM, CAP_READ_ONLY));
    let now = query(&mut d, cap_type::GENERAL, true);
    assert_eq!(ifc::get(&now, cmd_hca_cap::ROCE), 1);
    assert_eq!(ifc::get(&now, cmd_hca_cap::LOG_MAX_QP), 0x0e, "a refused SET changes nothing");
}

#[test]
fn release_all_pages_is_settable_where_the_maximum_offers_it() {
    for (profile, want) in [(CapsProfile::ConnectX5, (0, 0)), (CapsProfile::ConnectX4Trace, (BAD_PARAM, CAP_ABOVE_MAX))]
    {
        let mut d = enabled(profile);
        let mut b = query(&mut d, cap_type::GENERAL, true);
        ifc::set(&mut b, cmd_hca_cap::RELEASE_ALL_PAGES, 1);
        assert_eq!(set(&mut d, cap_type::GENERAL, &b), want, "{profile:?}");
        let now = ifc::get(&query(&mut d, cap_type::GENERAL, true), cmd_hca_cap::RELEASE_ALL_PAGES);
        assert_eq!(now, u32::from(want.0 == 0), "{profile:?}");
    }
}

#[test]
fn the_atomic_endianness_mode_is_settable_when_offered_and_within_the_maximum() {
    let mode = atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE;
    // CX-5: offered; host endianness (1) is the maximum.
    let mut d = enabled(CapsProfile::ConnectX5);
    let mut b = query(&mut d, cap_type::ATOMIC, true);
    assert_eq!(ifc::get(&b, mode), 0, "network endianness until the driver asks");
    ifc::set(&mut b, mode, 2);
    assert_eq!(set(&mut d, cap_type::ATOMIC, &b), (BAD_PARAM, CAP_ABOVE_MAX));
    ifc::set(&mut b, mode, 1);
    // Read-only ATOMIC fields are ignored, as for the other blocks.
    ifc::set(&mut b, atomic_caps::ATOMIC_OPERATIONS, 0);
    assert_eq!(set(&mut d, cap_type::ATOMIC, &b), (0, 0));
    let now = query(&mut d, cap_type::ATOMIC, true);
    assert_eq!(ifc::get(&now, mode), 1);
    assert_eq!(ifc::get(&now, atomic_caps::ATOMIC_OPERATIONS), 0xf);
    // The trace's CX-4: not offered, so the mode stays 0.
    let mut d = enabled(CapsProfile::ConnectX4Trace);
    let mut b = query(&mut d, cap_type::ATOMIC, true);
    assert_eq!(set(&mut d, cap_type::ATOMIC, &b), (0, 0), "the current block as it is");
    ifc::set(&mut b, mode, 1);
    assert_eq!(set(&mut d, cap_type::ATOMIC, &b), (BAD_PARAM, CAP_READ_ONLY));
    assert_eq!(ifc::get(&query(&mut d, cap_type::ATOMIC, true), mode), 0);
}

#[test]
fn a_vf_of_either_profile_keeps_that_profiles_caps() {
    for (profile, rw) in [(CapsProfile::ConnectX5, 1), (CapsProfile::ConnectX4Trace, 0)] {
        let mut d = drv(profile, true);
        d.ok(&cmd(0x104, 0, 16), 16);
        let g = query(&mut d, cap_type::GENERAL, true);
        assert_eq!(ifc::get(&g, cmd_hca_cap::VPORT_GROUP_MANAGER), 0, "{profile:?}");
        assert_eq!(ifc::get(&g, cmd_hca_cap::VHCA_ID), mlx5_model::caps::VF_VHCA_ID, "{profile:?}");
        assert_eq!(ifc::get(&g, cmd_hca_cap::ROCE_RW_SUPPORTED), rw, "{profile:?}");
    }
}

/// `qpc.ts_format` and `qpc.user_index` inside `create_qp_in` (qpc at byte 0x18).
const TS_FORMAT: Field = Field::new(0xc0 + 0x58, 2);
const USER_INDEX: Field = Field::new(0xc0 + 0x88, 24);

fn up(profile: CapsProfile, edit: impl FnOnce(&mut mlx5_model::caps::Caps)) -> (Drv, Res) {
    let mut d = drv(profile, false);
    edit(&mut d.model.hca_mut().caps);
    d.bring_up();
    let r = setup(&mut d);
    (d, r)
}

/// CREATE_QP with `ts_format` and `user_index`: (status, syndrome reason).
fn create(d: &mut Drv, r: Res, ts: u32, uidx: u32) -> (u8, u32) {
    let mut c = create_qp_in(r);
    ifc::set(&mut c, TS_FORMAT, ts);
    ifc::set(&mut c, USER_INDEX, uidx);
    let o = d.exec(&c, 16);
    if o.status() == 0 {
        d.ok(&short_in(DESTROY_QP, be32(&o.out, 8) & 0xff_ffff), 16);
    }
    (o.status(), o.syndrome() & 0xffff)
}

#[test]
fn create_qp_takes_only_the_clocks_the_caps_offer() {
    const UIDX: u32 = 0xff_ffff;
    // CX-5: free running only — FREE_RUNNING and DEFAULT, never REAL_TIME.
    let (mut d, r) = up(CapsProfile::ConnectX5, |_| {});
    assert_eq!(create(&mut d, r, 0, UIDX), (0, 0), "FREE_RUNNING");
    assert_eq!(create(&mut d, r, 1, UIDX), (0, 0), "DEFAULT");
    assert_eq!(create(&mut d, r, 2, UIDX), (BAD_PARAM, QP_BAD_TS_FORMAT), "REAL_TIME");
    assert_eq!(create(&mut d, r, 3, UIDX), (BAD_PARAM, QP_BAD_TS_FORMAT), "reserved");
    // A real-time-only clock (MLX5_TIMESTAMP_FORMAT_CAP_REAL_TIME): FREE_RUNNING is refused.
    let (mut d, r) = up(CapsProfile::ConnectX5, |c| c.set_field(cap_type::ROCE, true, roce_cap::QP_TS_FORMAT, 1));
    assert_eq!(create(&mut d, r, 0, UIDX), (BAD_PARAM, QP_BAD_TS_FORMAT), "FREE_RUNNING");
    assert_eq!(create(&mut d, r, 2, UIDX), (0, 0), "REAL_TIME");
    // Both clocks.
    let (mut d, r) = up(CapsProfile::ConnectX5, |c| c.set_field(cap_type::ROCE, true, roce_cap::QP_TS_FORMAT, 2));
    for ts in 0..=2 {
        assert_eq!(create(&mut d, r, ts, UIDX), (0, 0), "ts_format {ts}");
    }
}

#[test]
fn create_qp_carries_the_user_index_the_cqe_version_calls_for() {
    // CQE version 1 (both profiles): Linux's MLX5_IB_DEFAULT_UIDX and nothing else.
    for profile in [CapsProfile::ConnectX5, CapsProfile::ConnectX4Trace] {
        let (mut d, r) = up(profile, |_| {});
        assert_eq!(create(&mut d, r, 0, 0xff_ffff), (0, 0), "{profile:?}");
        assert_eq!(create(&mut d, r, 0, 0), (BAD_PARAM, QP_BAD_USER_INDEX), "{profile:?}");
        assert_eq!(create(&mut d, r, 0, 7), (BAD_PARAM, QP_BAD_USER_INDEX), "{profile:?}");
    }
    // CQE version 0: the field is unused and must stay 0.
    let (mut d, r) = up(CapsProfile::ConnectX5, |c| {
        c.set_field(cap_type::GENERAL, false, cmd_hca_cap::CQE_VERSION, 0);
        c.set_field(cap_type::GENERAL, true, cmd_hca_cap::CQE_VERSION, 0);
    });
    assert_eq!(create(&mut d, r, 0, 0), (0, 0));
    assert_eq!(create(&mut d, r, 0, 0xff_ffff), (BAD_PARAM, QP_BAD_USER_INDEX));
}
