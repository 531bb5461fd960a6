//! The driver's RoCE set-up (`Driver::roce_gid`) against the in-process model: the GID the
//! lease QPs use is written and read back, `roce_en` is turned back on when it is off, and a port the model
//! reports as InfiniBand stops the set-up with an error naming the fix.

mod common;

use leasebox_mlx5::driver::Driver;
use leasebox_mlx5::ifc::vport;
use leasebox_mlx5::objects::RoceError;
use mlx5_model::caps::cap_type;
use mlx5_model::ifc::Field;

/// `cmd_hca_cap.port_type` (`mlx5_ifc.h`): 0 InfiniBand, 1 Ethernet.
const PORT_TYPE: Field = Field::new(0x1b6, 2);
/// `roce_cap.roce_version` (`mlx5_ifc.h`): bit 2 RoCEv2.
const ROCE_VERSION: Field = Field::new(0x98, 8);

#[test]
fn the_lease_gid_is_written_read_back_and_roce_en_restored() {
    let mut d = common::up();
    assert_eq!(d.exec(vport::query_roce_address(0)).map(|o| vport::query_roce_address_out(&o).gid).unwrap(), [0; 16]);
    // Something turned RoCE off on the vport: the set-up turns it on again.
    d.exec(vport::modify_nic_vport_roce_en(false)).unwrap();
    let gid = d.roce_gid(0, [192, 0, 2, 1]).unwrap();
    assert_eq!(gid, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1]);
    let ctx = vport::query_nic_vport_context_out(&d.exec(vport::query_nic_vport_context()).unwrap());
    assert!(ctx.roce_en);
    let e = vport::query_roce_address_out(&d.exec(vport::query_roce_address(0)).unwrap());
    assert_eq!(e, vport::RoceAddress::rocev2_ipv4([192, 0, 2, 1], d.info.mac));
    // An index outside the table is refused before anything is written.
    assert!(matches!(d.roce_gid(256, [192, 0, 2, 1]), Err(RoceError::TableTooSmall { index: 256, size: 256 })));
}

/// A driver brought up on a model whose capabilities were changed by `edit` first.
fn up_with_caps(edit: impl FnOnce(&mut mlx5_model::caps::Caps)) -> common::Hosted {
    let p = common::platform(common::model_config());
    edit(&mut p.model().unwrap().hca_mut().caps);
    Driver::bring_up(p, common::driver_config()).unwrap_or_else(|e| panic!("bring-up: {e}"))
}

#[test]
fn an_infiniband_port_stops_the_roce_set_up_and_names_the_fix() {
    let mut d = up_with_caps(|c| c.set_field(cap_type::GENERAL, true, PORT_TYPE, 0));
    let e = d.roce_gid(0, [192, 0, 2, 1]).unwrap_err();
    assert!(matches!(e, RoceError::InfiniBand), "{e}");
    let m = e.to_string();
    assert!(m.contains("InfiniBand") && m.contains("mlxconfig") && m.contains("LINK_TYPE_P1=2"), "{m}");
    // Nothing was written.
    let e = vport::query_roce_address_out(&d.exec(vport::query_roce_address(0)).unwrap());
    assert_eq!(e, vport::RoceAddress::default());
}

#[test]
fn a_port_without_rocev2_stops_the_roce_set_up() {
    let mut d = up_with_caps(|c| c.set_field(cap_type::ROCE, true, ROCE_VERSION, 1));
    let e = d.roce_gid(0, [192, 0, 2, 1]).unwrap_err();
    assert!(matches!(e, RoceError::NoRoceV2Ipv4 { roce_version: 1, .. }), "{e}");
}
