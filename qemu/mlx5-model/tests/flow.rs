//! Flow steering commands for NIC_RX (0) and RDMA_RX (7) through the command queue; offsets from docs/reference/mlx5.md
//! §e.7.

mod common;
mod support_qp;

use common::{Drv, be32, cmd};
use support_qp::setf;

const BAD_PARAM: u8 = 0x03;
/// docs/reference/revoke-spec.md §3.2: SET_FLOW_TABLE_ENTRY on an occupied flow_index returned status 0x08.
const OCCUPIED: u8 = 0x08;
const BAD_RES_STATE: u8 = 0x09;

fn create_table(d: &mut Drv, ty: u32, level: u32, log_size: u32, miss: u32) -> common::Done {
    let mut c = cmd(0x930, 0, 0x40);
    setf(&mut c, 0x80, 8, ty);
    setf(&mut c, 0xc4, 4, miss);
    setf(&mut c, 0xc8, 8, level);
    setf(&mut c, 0xd8, 8, log_size);
    d.exec(&c, 16)
}

fn id(done: &common::Done) -> u32 {
    assert_eq!(done.status(), 0, "syndrome {:#x}", done.syndrome());
    be32(&done.out, 8) & 0xff_ffff
}

/// A group over [start, end] matching outer_headers.ip_protocol (match_criteria_enable bit 0).
fn create_group(d: &mut Drv, ty: u32, table: u32, start: u32, end: u32) -> common::Done {
    let mut c = cmd(0x933, 0, 0x400);
    setf(&mut c, 0x80, 8, ty);
    setf(&mut c, 0xa8, 24, table);
    setf(&mut c, 0xe0, 32, start);
    setf(&mut c, 0x120, 32, end);
    setf(&mut c, 0x1f8, 8, 1);
    setf(&mut c, 0x200 + 0x80, 8, 0xff); // match_criteria.outer_headers.ip_protocol
    d.exec(&c, 16)
}

fn set_fte(d: &mut Drv, ty: u32, table: u32, group: u32, index: u32, action: u32) -> common::Done {
    let mut c = cmd(0x936, 0, 0x340);
    setf(&mut c, 0x80, 8, ty);
    setf(&mut c, 0xa8, 24, table);
    setf(&mut c, 0x100, 32, index);
    setf(&mut c, 0x220, 32, group);
    setf(&mut c, 0x270, 16, action);
    setf(&mut c, 0x400 + 0x80, 8, 17); // match_value.outer_headers.ip_protocol = UDP
    d.exec(&c, 16)
}

fn by_table(op: u16, ty: u32, table: u32, at: usize, v: u32) -> Vec<u8> {
    let mut c = cmd(op, 0, 0x40);
    setf(&mut c, 0x80, 8, ty);
    setf(&mut c, 0xa8, 24, table);
    setf(&mut c, at, 32, v);
    c
}

#[test]
fn rdma_rx_drop_rule_lifecycle_and_occupied_index() {
    let mut d = Drv::new();
    d.bring_up();
    for ty in [7, 0] {
        let miss = if ty == 7 { 2 } else { 0 };
        let t = id(&create_table(&mut d, ty, 0, 4, miss));
        let g = id(&create_group(&mut d, ty, t, 0, 7));
        assert_eq!(set_fte(&mut d, ty, t, g, 3, 2).status(), 0);
        // The spec's observation: no modify in place.
        assert_eq!(set_fte(&mut d, ty, t, g, 3, 2).status(), OCCUPIED);
        // Outside the group, outside the table, bad action (ALLOW|DROP), unknown group.
        assert_eq!(set_fte(&mut d, ty, t, g, 8, 2).status(), BAD_PARAM);
        assert_eq!(set_fte(&mut d, ty, t, g, 4, 3).status(), BAD_PARAM);
        assert_eq!(set_fte(&mut d, ty, t, g + 50, 4, 2).status(), BAD_PARAM);
        // Overlapping group, group beyond the table.
        assert_eq!(create_group(&mut d, ty, t, 7, 9).status(), BAD_PARAM);
        assert_eq!(create_group(&mut d, ty, t, 8, 16).status(), BAD_PARAM);
        d.ok(&by_table(0x92f, ty, t, 0xc0, 0), 16);
        // In use: the table is root and has a group; the group has an entry.
        assert_eq!(d.exec(&by_table(0x931, ty, t, 0xc0, 0), 16).status(), BAD_RES_STATE);
        assert_eq!(d.exec(&by_table(0x934, ty, t, 0xc0, g), 16).status(), BAD_RES_STATE);
        d.ok(&by_table(0x938, ty, t, 0x100, 3), 16);
        assert_eq!(d.exec(&by_table(0x938, ty, t, 0x100, 3), 16).status(), BAD_PARAM);
        assert_eq!(set_fte(&mut d, ty, t, g, 3, 1).status(), 0, "the index is free again");
        d.ok(&by_table(0x938, ty, t, 0x100, 3), 16);
        d.ok(&by_table(0x934, ty, t, 0xc0, g), 16);
        let mut disconnect = by_table(0x92f, ty, 0, 0xc0, 0);
        setf(&mut disconnect, 0x30, 16, 1);
        d.ok(&disconnect, 16);
        d.ok(&by_table(0x931, ty, t, 0xc0, 0), 16);
    }
}

#[test]
fn table_validation() {
    let mut d = Drv::new();
    d.bring_up();
    // Unsupported table type (NIC_TX), switch-domain miss outside RDMA_RX, other vport, log_size too big.
    assert_eq!(create_table(&mut d, 1, 0, 4, 0).status(), BAD_PARAM);
    assert_eq!(create_table(&mut d, 0, 0, 4, 2).status(), BAD_PARAM);
    assert_eq!(create_table(&mut d, 0, 0, 40, 0).status(), BAD_PARAM);
    let mut c = cmd(0x930, 0, 0x40);
    setf(&mut c, 0x40, 1, 1);
    assert_eq!(d.exec(&c, 16).status(), BAD_PARAM);
    // A group on a table of the other type; underlay_qpn on an Ethernet port.
    let t = id(&create_table(&mut d, 0, 0, 4, 0));
    assert_eq!(create_group(&mut d, 7, t, 0, 1).status(), BAD_PARAM);
    assert_eq!(d.exec(&by_table(0x92f, 0, t, 0xc0, 5), 16).status(), BAD_PARAM);
}
