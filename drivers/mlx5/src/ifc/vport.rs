//! The port as the function sees it (`mlx5_ifc.h`: `query_nic_vport_context_in/out`, `nic_vport_context`,
//! `modify_nic_vport_context_in`, `modify_nic_vport_field_select`, `query_vport_state_in/out`,
//! `query_roce_address_in/out`, `set_roce_address_in`, `roce_addr_layout`, and through ACCESS_REG the
//! `pmtu_reg` and `paos_reg` registers; docs/reference/mlx5.md §e.5, §e.6).

use crate::command::{Command, Output};
use crate::field::{Field, Field64};
use crate::ifc::CMD_HDR_LEN;
use crate::ifc::init::{MLX5_REG_PAOS, MLX5_REG_PMTU, REGISTER_DATA, RegOp, access_reg};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT, MLX5_CMD_OP_QUERY_ROCE_ADDRESS,
    MLX5_CMD_OP_QUERY_VPORT_STATE, MLX5_CMD_OP_SET_ROCE_ADDRESS,
};

pub const QUERY_NIC_VPORT_CONTEXT_OUT_LEN: usize = 0x110;
pub const MODIFY_NIC_VPORT_CONTEXT_IN_LEN: usize = 0x200;
pub const QUERY_ROCE_ADDRESS_OUT_LEN: usize = 0x30;
pub const SET_ROCE_ADDRESS_IN_LEN: usize = 0x30;
/// `paos_reg` and `pmtu_reg` are 16 bytes each.
pub const PORT_REG_LEN: usize = 0x10;

/// `MLX5_QUERY_VPORT_STATE_OUT_STATE_*` (`mlx5_ifc.h:5268-5269`): 0 down, 1 up; `admin_state` also
/// 2 = auto (`MLX5_VPORT_ADMIN_STATE_*`).
pub const MLX5_VPORT_STATE_DOWN: u8 = 0;
pub const MLX5_VPORT_STATE_UP: u8 = 1;

/// `MLX5_ROCE_VERSION_*`, `MLX5_ROCE_L3_TYPE_*` (`device.h:402-413`).
pub const MLX5_ROCE_VERSION_1: u8 = 0;
pub const MLX5_ROCE_VERSION_2: u8 = 2;
pub const MLX5_ROCE_L3_TYPE_IPV4: u8 = 0;
pub const MLX5_ROCE_L3_TYPE_IPV6: u8 = 1;

/// PAOS status values (`driver.h:231-232`).
pub const MLX5_PORT_UP: u8 = 1;
pub const MLX5_PORT_DOWN: u8 = 2;

/// `nic_vport_context`, offsets from its start; at bit 0x80 of `query_nic_vport_context_out`
/// ([`QUERY_NIC_VPORT_CONTEXT_OUT_CTX`]) and at bit 0x800 of `modify_nic_vport_context_in`
/// ([`MODIFY_NIC_VPORT_CONTEXT_IN_CTX`]).
pub mod nic_vport_context {
    use crate::field::{ByteArray, Field, Field64};
    pub const MIN_WQE_INLINE_MODE: Field = Field::new(0x05, 3);
    pub const ROCE_EN: Field = Field::new(0x1f, 1);
    pub const MTU: Field = Field::new(0x130, 16);
    pub const SYSTEM_IMAGE_GUID: Field64 = Field64::new(0x140);
    pub const PORT_GUID: Field64 = Field64::new(0x180);
    pub const NODE_GUID: Field64 = Field64::new(0x1c0);
    pub const ALLOWED_LIST_TYPE: Field = Field::new(0x785, 3);
    pub const ALLOWED_LIST_SIZE: Field = Field::new(0x794, 12);
    /// A `mac_address_layout`: 16 reserved bits, then the address ([`MAC_ADDRESS`]).
    pub const PERMANENT_ADDRESS: ByteArray = ByteArray::new(0x7a0, 8);
    /// `current_uc_mac_address[]`: `mac_address_layout`s from bit 0x800, as many as the command carries.
    pub const CURRENT_UC_MAC_ADDRESS: ByteArray = ByteArray::new(0x800, 8);
    /// The 48-bit address inside a `mac_address_layout` (Linux copies from its byte 2).
    pub const MAC_ADDRESS: ByteArray = ByteArray::new(0x10, 6);
}

/// Where `nic_vport_context` sits in the query's output and the modify's input.
pub const QUERY_NIC_VPORT_CONTEXT_OUT_CTX: usize = 0x80;
pub const MODIFY_NIC_VPORT_CONTEXT_IN_CTX: usize = 0x800;

/// `modify_nic_vport_context_in.field_select` (`modify_nic_vport_field_select` at bit 0x60): which context
/// fields the command changes.
pub mod field_select {
    use crate::field::Field;
    pub const MTU: Field = Field::new(0x60 + 0x19, 1);
    pub const ADDRESSES_LIST: Field = Field::new(0x60 + 0x1d, 1);
    pub const ROCE_EN: Field = Field::new(0x60 + 0x1e, 1);
}

/// QUERY_NIC_VPORT_CONTEXT of our own vport.
pub fn query_nic_vport_context() -> Command {
    Command::new(MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT, 0, CMD_HDR_LEN, QUERY_NIC_VPORT_CONTEXT_OUT_LEN)
}

/// `nic_vport_context` fields we use (context at byte 0x10 of the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicVportContext {
    pub roce_en: bool,
    pub mtu: u16,
    pub system_image_guid: u64,
    pub port_guid: u64,
    pub node_guid: u64,
    /// `permanent_address` bytes 2..8 (Linux copies from `&field[2]`).
    pub permanent_address: [u8; 6],
}

pub fn query_nic_vport_context_out(out: &Output) -> NicVportContext {
    use nic_vport_context as n;
    const CTX: usize = QUERY_NIC_VPORT_CONTEXT_OUT_CTX;
    let g64 = |f: Field64| out.get64(f.at(CTX));
    NicVportContext {
        roce_en: out.get(n::ROCE_EN.at(CTX)) != 0,
        mtu: out.get(n::MTU.at(CTX)) as u16,
        system_image_guid: g64(n::SYSTEM_IMAGE_GUID),
        port_guid: g64(n::PORT_GUID),
        node_guid: g64(n::NODE_GUID),
        permanent_address: n::MAC_ADDRESS.at(n::PERMANENT_ADDRESS.byte() * 8).at(CTX).read_array(out.bytes()),
    }
}

/// MODIFY_NIC_VPORT_CONTEXT selecting `roce_en` only (Linux `mlx5_nic_vport_update_roce_state`).
pub fn modify_nic_vport_roce_en(enable: bool) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, 0, MODIFY_NIC_VPORT_CONTEXT_IN_LEN, CMD_HDR_LEN)
        .with("roce_en", enable.into());
    c.set(field_select::ROCE_EN, 1);
    c.set(nic_vport_context::ROCE_EN.at(MODIFY_NIC_VPORT_CONTEXT_IN_CTX), enable as u32);
    c
}

/// MODIFY_NIC_VPORT_CONTEXT selecting `mtu` only (hardware MTU, e.g. 1522 for Ethernet 1500).
pub fn modify_nic_vport_mtu(mtu: u16) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, 0, MODIFY_NIC_VPORT_CONTEXT_IN_LEN, CMD_HDR_LEN)
        .with("mtu", mtu.into());
    c.set(field_select::MTU, 1);
    c.set(nic_vport_context::MTU.at(MODIFY_NIC_VPORT_CONTEXT_IN_CTX), mtu.into());
    c
}

/// `MLX5_NVPRT_LIST_TYPE_UC`: `allowed_list_type` of the current unicast address list.
pub const MLX5_NVPRT_LIST_TYPE_UC: u32 = 0;
/// `mac_address_layout` is 8 bytes (16 reserved bits, then the 48-bit address).
pub const MAC_ADDRESS_LAYOUT_LEN: usize = 8;

/// MODIFY_NIC_VPORT_CONTEXT selecting `addresses_list` (field_select bit 0x1d) with `allowed_list_type` UC:
/// the vport's current unicast address list becomes `macs` (Linux `mlx5_modify_nic_vport_mac_list`). The
/// context sits at byte 0x100 of the input; `allowed_list_type` (3 bits at context bit 0x785) and
/// `allowed_list_size` (12 bits at 0x794); `current_uc_mac_address[i]` at byte 0x200 + 8·i, the address in
/// its last 6 bytes; the input grows by 8 bytes per address past the 0x200-byte fixed part. In legacy SR-IOV
/// mode the e-switch forwards a function only the unicast MACs in this list.
pub fn modify_nic_vport_mac_list(macs: &[[u8; 6]]) -> Command {
    let len = MODIFY_NIC_VPORT_CONTEXT_IN_LEN + macs.len() * MAC_ADDRESS_LAYOUT_LEN;
    let mut c = Command::new(MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, 0, len, CMD_HDR_LEN)
        .with("addresses_list", macs.len() as u64);
    use nic_vport_context as n;
    const CTX: usize = MODIFY_NIC_VPORT_CONTEXT_IN_CTX;
    c.set(field_select::ADDRESSES_LIST, 1);
    c.set(n::ALLOWED_LIST_TYPE.at(CTX), MLX5_NVPRT_LIST_TYPE_UC);
    c.set(n::ALLOWED_LIST_SIZE.at(CTX), macs.len() as u32);
    for (i, m) in macs.iter().enumerate() {
        let entry = n::CURRENT_UC_MAC_ADDRESS.at(CTX).nth(i);
        c.put(n::MAC_ADDRESS.at(entry.byte() * 8), m);
    }
    c
}

/// QUERY_VPORT_STATE of our own vport (op_mod 0 `MLX5_VPORT_STATE_OP_MOD_VNIC_VPORT`).
pub fn query_vport_state() -> Command {
    Command::new(MLX5_CMD_OP_QUERY_VPORT_STATE, 0, CMD_HDR_LEN, CMD_HDR_LEN)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VportState {
    /// `MLX5_VPORT_STATE_DOWN` 0 / `_UP` 1.
    pub state: u8,
    pub admin_state: u8,
}

/// `query_vport_state_out.admin_state` and `.state`.
const VPORT_ADMIN_STATE: Field = Field::new(0x78, 4);
const VPORT_STATE: Field = Field::new(0x7c, 4);

pub fn query_vport_state_out(out: &Output) -> VportState {
    VportState { state: out.get(VPORT_STATE) as u8, admin_state: out.get(VPORT_ADMIN_STATE) as u8 }
}

/// One GID table entry (`roce_addr_layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceAddress {
    /// `source_l3_address`: the GID (IPv4-mapped for IPv4).
    pub gid: [u8; 16],
    pub vlan: Option<u16>,
    pub source_mac: [u8; 6],
    pub roce_l3_type: u8,
    pub roce_version: u8,
}

/// `roce_addr_layout.roce_version` 2 and `roce_l3_type` IPv4 (`MLX5_ROCE_VERSION_2`, `MLX5_ROCE_L3_TYPE_IPV4`).
pub const ROCE_VERSION_2: u8 = 2;
pub const ROCE_L3_TYPE_IPV4: u8 = 0;

impl RoceAddress {
    /// The RoCEv2 entry for IPv4 address `ip` sent from `mac`: GID `::ffff:ip`, no VLAN (Linux
    /// `mlx5_ib` `set_roce_addr` for an IPv4 netdev address).
    pub fn rocev2_ipv4(ip: [u8; 4], mac: [u8; 6]) -> RoceAddress {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&ip);
        RoceAddress { gid, vlan: None, source_mac: mac, roce_l3_type: ROCE_L3_TYPE_IPV4, roce_version: ROCE_VERSION_2 }
    }
}

/// `roce_addr_layout`, offsets from its start; at bit 0x80 ([`ROCE_ADDR`]) of `query_roce_address_out` and
/// `set_roce_address_in`.
pub mod roce_addr_layout {
    use crate::field::{ByteArray, Field};
    pub const SOURCE_L3_ADDRESS: ByteArray = ByteArray::new(0x00, 16);
    pub const VLAN_VALID: Field = Field::new(0x83, 1);
    pub const VLAN_ID: Field = Field::new(0x84, 12);
    pub const SOURCE_MAC_47_32: Field = Field::new(0x90, 16);
    pub const SOURCE_MAC_31_0: Field = Field::new(0xa0, 32);
    pub const ROCE_L3_TYPE: Field = Field::new(0xd4, 4);
    pub const ROCE_VERSION: Field = Field::new(0xd8, 8);
}

pub const ROCE_ADDR: usize = 0x80;
/// `query_roce_address_in.roce_address_index`, `set_roce_address_in.roce_address_index`.
const ROCE_ADDRESS_INDEX: Field = Field::new(0x40, 16);

pub fn query_roce_address(index: u16) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_QUERY_ROCE_ADDRESS, 0, CMD_HDR_LEN, QUERY_ROCE_ADDRESS_OUT_LEN)
        .with("index", index.into());
    c.set(ROCE_ADDRESS_INDEX, index.into());
    c
}

pub fn query_roce_address_out(out: &Output) -> RoceAddress {
    use roce_addr_layout as l;
    let g = |f: Field| out.get(f.at(ROCE_ADDR));
    let hi = (g(l::SOURCE_MAC_47_32) as u16).to_be_bytes();
    let lo = g(l::SOURCE_MAC_31_0).to_be_bytes();
    RoceAddress {
        gid: l::SOURCE_L3_ADDRESS.at(ROCE_ADDR).read_array(out.bytes()),
        vlan: (g(l::VLAN_VALID) != 0).then(|| g(l::VLAN_ID) as u16),
        source_mac: [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]],
        roce_l3_type: g(l::ROCE_L3_TYPE) as u8,
        roce_version: g(l::ROCE_VERSION) as u8,
    }
}

/// SET_ROCE_ADDRESS at `index` (an all-zero `addr` deletes the entry, as Linux does).
pub fn set_roce_address(index: u16, addr: &RoceAddress) -> Command {
    use roce_addr_layout as l;
    const L: usize = ROCE_ADDR;
    let mut c =
        Command::new(MLX5_CMD_OP_SET_ROCE_ADDRESS, 0, SET_ROCE_ADDRESS_IN_LEN, CMD_HDR_LEN).with("index", index.into());
    c.set(ROCE_ADDRESS_INDEX, index.into());
    c.put(l::SOURCE_L3_ADDRESS.at(L), &addr.gid);
    if let Some(v) = addr.vlan {
        c.set(l::VLAN_VALID.at(L), 1);
        c.set(l::VLAN_ID.at(L), v.into());
    }
    let m = addr.source_mac;
    c.set(l::SOURCE_MAC_47_32.at(L), u32::from(u16::from_be_bytes([m[0], m[1]])));
    c.set(l::SOURCE_MAC_31_0.at(L), u32::from_be_bytes([m[2], m[3], m[4], m[5]]));
    c.set(l::ROCE_L3_TYPE.at(L), addr.roce_l3_type.into());
    c.set(l::ROCE_VERSION.at(L), addr.roce_version.into());
    c
}

/// `pmtu_reg` of `local_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pmtu {
    pub max_mtu: u16,
    pub admin_mtu: u16,
    pub oper_mtu: u16,
}

/// `pmtu_reg`, offsets from its start.
pub mod pmtu_reg {
    use crate::field::Field;
    pub const LOCAL_PORT: Field = Field::new(0x08, 8);
    pub const MAX_MTU: Field = Field::new(0x20, 16);
    pub const ADMIN_MTU: Field = Field::new(0x40, 16);
    pub const OPER_MTU: Field = Field::new(0x60, 16);
}

/// Bit offset of the register data in `access_register_in` / `_out`.
const REG: usize = REGISTER_DATA.byte() * 8;

/// ACCESS_REG read of PMTU.
pub fn pmtu_query(local_port: u8) -> Command {
    let mut r = [0u8; PORT_REG_LEN];
    pmtu_reg::LOCAL_PORT.write(&mut r, local_port.into());
    access_reg(RegOp::Read, MLX5_REG_PMTU, 0, &r)
}

/// ACCESS_REG write of PMTU `admin_mtu`.
pub fn pmtu_set(local_port: u8, admin_mtu: u16) -> Command {
    let mut r = [0u8; PORT_REG_LEN];
    pmtu_reg::LOCAL_PORT.write(&mut r, local_port.into());
    pmtu_reg::ADMIN_MTU.write(&mut r, admin_mtu.into());
    access_reg(RegOp::Write, MLX5_REG_PMTU, 0, &r).with("mtu", admin_mtu.into())
}

pub fn pmtu_out(out: &Output) -> Pmtu {
    let g = |f: Field| out.get(f.at(REG)) as u16;
    Pmtu { max_mtu: g(pmtu_reg::MAX_MTU), admin_mtu: g(pmtu_reg::ADMIN_MTU), oper_mtu: g(pmtu_reg::OPER_MTU) }
}

/// `paos_reg` statuses: `MLX5_PORT_UP` 1 / `MLX5_PORT_DOWN` 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paos {
    pub admin_status: u8,
    pub oper_status: u8,
}

/// `paos_reg`, offsets from its start.
pub mod paos_reg {
    use crate::field::Field;
    pub const LOCAL_PORT: Field = Field::new(0x08, 8);
    pub const ADMIN_STATUS: Field = Field::new(0x14, 4);
    pub const OPER_STATUS: Field = Field::new(0x1c, 4);
    pub const ASE: Field = Field::new(0x20, 1);
}

/// ACCESS_REG read of PAOS.
pub fn paos_query(local_port: u8) -> Command {
    let mut r = [0u8; PORT_REG_LEN];
    paos_reg::LOCAL_PORT.write(&mut r, local_port.into());
    access_reg(RegOp::Read, MLX5_REG_PAOS, 0, &r)
}

/// ACCESS_REG write of PAOS `admin_status` with `ase` (Linux `mlx5_set_port_admin_status`).
pub fn paos_set(local_port: u8, admin_status: u8) -> Command {
    let mut r = [0u8; PORT_REG_LEN];
    paos_reg::LOCAL_PORT.write(&mut r, local_port.into());
    paos_reg::ADMIN_STATUS.write(&mut r, admin_status.into());
    paos_reg::ASE.write(&mut r, 1);
    access_reg(RegOp::Write, MLX5_REG_PAOS, 0, &r).with("admin_status", admin_status.into())
}

pub fn paos_out(out: &Output) -> Paos {
    let g = |f: Field| out.get(f.at(REG)) as u8;
    Paos { admin_status: g(paos_reg::ADMIN_STATUS), oper_status: g(paos_reg::OPER_STATUS) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, out};

    #[test]
    fn nic_vport_context() {
        let q = query_nic_vport_context();
        assert_eq!((be16(q.input(), 0), q.out_len()), (0x754, 0x110));
        let o = out(
            0x110,
            &[
                (0x13, &[1]),
                (0x36, &1522u16.to_be_bytes()),
                (0x48, &0x024c_42ff_fe00_0001u64.to_be_bytes()),
                (0x104, &[0, 0, 2, 0x4c, 0x42, 0, 0, 1]),
            ],
        );
        let v = query_nic_vport_context_out(&o);
        assert!(v.roce_en);
        assert_eq!((v.mtu, v.node_guid, v.permanent_address), (1522, 0x024c_42ff_fe00_0001, [2, 0x4c, 0x42, 0, 0, 1]));

        let m = modify_nic_vport_roce_en(true);
        let b = m.input();
        assert_eq!((be16(b, 0), b.len()), (0x755, 0x200));
        assert_eq!(be32(b, 0xc), 2); // field_select.roce_en = dword 3 bit 1
        assert_eq!(b[0x103], 1); // nic_vport_context.roce_en = bit 0x81f
        let m = modify_nic_vport_mtu(4200);
        assert_eq!(be32(m.input(), 0xc), 1 << 6);
        assert_eq!(be16(m.input(), 0x126), 4200);
    }

    /// Golden bytes: one address, as Linux lays out `modify_nic_vport_context_in` for
    /// `mlx5_modify_nic_vport_mac_list(dev, MLX5_NVPRT_LIST_TYPE_UC, &mac, 1)`.
    #[test]
    fn mac_list() {
        let mac = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01];
        let c = modify_nic_vport_mac_list(&[mac]);
        let b = c.input();
        assert_eq!(b.len(), 0x208, "the fixed part and one mac_address_layout");
        assert_eq!(c.out_len(), 0x10);
        let mut want = vec![0u8; 0x208];
        want[0..2].copy_from_slice(&[0x07, 0x55]); // opcode
        want[0x0c..0x10].copy_from_slice(&[0, 0, 0, 0x04]); // field_select: addresses_list (bit 0x1d)
        // nic_vport_context at 0x100: dword 0xf0 holds promisc/allowed_list_type [0x785:3] (0 = UC) and
        // allowed_list_size [0x794:12].
        want[0x100 + 0xf0..0x100 + 0xf4].copy_from_slice(&[0, 0, 0, 1]);
        want[0x202..0x208].copy_from_slice(&mac);
        assert_eq!(b, &want[..]);
        // Two addresses: 0x210 bytes, size 2, the second at 0x208 + 2.
        let m2 = [0x02, 0, 0, 0, 0, 0x02];
        let c = modify_nic_vport_mac_list(&[mac, m2]);
        let b = c.input();
        assert_eq!(b.len(), 0x210);
        assert_eq!(&b[0x1f0..0x1f4], &[0, 0, 0, 2]);
        assert_eq!((&b[0x202..0x208], &b[0x20a..0x210]), (&mac[..], &m2[..]));
        assert_eq!(&b[0x208..0x20a], &[0, 0], "mac_address_layout's reserved bits");
    }

    #[test]
    fn vport_state() {
        let q = query_vport_state();
        assert_eq!((be16(q.input(), 0), be16(q.input(), 6)), (0x750, 0));
        assert_eq!(query_vport_state_out(&out(0x10, &[(0x0f, &[0x21])])), VportState { state: 1, admin_state: 2 });
    }

    #[test]
    fn roce_address() {
        let q = query_roce_address(3);
        assert_eq!((be16(q.input(), 0), be16(q.input(), 8), q.out_len()), (0x760, 3, 0x30));
        let a = RoceAddress {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x4c, 0x42, 0xff, 0xfe, 0, 0, 1],
            vlan: Some(0x123),
            source_mac: [2, 0x4c, 0x42, 0, 0, 1],
            roce_l3_type: MLX5_ROCE_L3_TYPE_IPV6,
            roce_version: MLX5_ROCE_VERSION_2,
        };
        let s = set_roce_address(1, &a);
        let b = s.input();
        assert_eq!((be16(b, 0), b.len(), be16(b, 8)), (0x761, 0x30, 1));
        assert_eq!(&b[0x10..0x20], &a.gid);
        assert_eq!(be32(b, 0x20), (1 << 28) | (0x123 << 16) | 0x024c);
        assert_eq!(&b[0x24..0x28], &[0x42, 0, 0, 1]);
        assert_eq!(be32(b, 0x28), (1 << 8) | 2);
        // The same bytes parsed as a query output give the entry back.
        let mut img = b.to_vec();
        img[..0x10].fill(0);
        assert_eq!(query_roce_address_out(&crate::command::Output::new(img)), a);
    }

    #[test]
    fn port_registers() {
        let q = pmtu_query(1);
        assert_eq!((be16(q.input(), 6), be16(q.input(), 0xa)), (1, 0x5003));
        assert_eq!(&q.input()[0x10..0x14], &[0, 1, 0, 0]);
        assert_eq!(q.out_len(), 0x20);
        let s = pmtu_set(1, 4200);
        assert_eq!((be16(s.input(), 6), be16(s.input(), 0x18)), (0, 4200));
        let o = out(0x20, &[(0x14, &[0x27, 0x10]), (0x18, &[0x05, 0xf2]), (0x1c, &[0x05, 0xf2])]);
        assert_eq!(pmtu_out(&o), Pmtu { max_mtu: 10000, admin_mtu: 1522, oper_mtu: 1522 });

        let p = paos_set(1, MLX5_PORT_UP);
        assert_eq!(be16(p.input(), 0xa), 0x5006);
        assert_eq!(&p.input()[0x10..0x18], &[0, 1, 1, 0, 0x80, 0, 0, 0]);
        assert_eq!(be16(paos_query(1).input(), 6), 1);
        assert_eq!(paos_out(&out(0x20, &[(0x12, &[1]), (0x13, &[2])])), Paos { admin_status: 1, oper_status: 2 });
    }
}
