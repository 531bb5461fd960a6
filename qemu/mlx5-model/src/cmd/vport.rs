//! The NIC vport and the RoCE GID table: QUERY/MODIFY_NIC_VPORT_CONTEXT (`mlx5_ifc.h`
//! `query_nic_vport_context_in/out`, `modify_nic_vport_context_in`, `nic_vport_context`,
//! `modify_nic_vport_field_select`), QUERY_HCA_VPORT_GID (`query_hca_vport_gid_in/out`) and
//! QUERY/SET_ROCE_ADDRESS (`query_roce_address_in/out`, `set_roce_address_in`, `roce_addr_layout`). Only the
//! function's own vport (0) and port 1 exist.

use super::{CmdResult, Ctx, need_initialized, reason, status};
use crate::caps::cap_type;
use crate::hca::Hca;
use crate::ifc::{self, Field};
use crate::port::{RoceAddr, eui64};

const OTHER_VPORT: Field = Field::new(0x40, 1);
const VPORT_NUMBER: Field = Field::new(0x50, 16);
const ALLOWED_LIST_TYPE: Field = Field::new(0x65, 3);
/// `nic_vport_context` fields (inside the context).
mod ctx {
    use crate::ifc::Field;
    pub const MIN_WQE_INLINE_MODE: Field = Field::new(0x05, 3);
    pub const ROCE_EN: Field = Field::new(0x1f, 1);
    pub const MTU: Field = Field::new(0x130, 16);
    pub const SYSTEM_IMAGE_GUID: usize = 0x28;
    pub const PORT_GUID: usize = 0x30;
    pub const NODE_GUID: usize = 0x38;
    /// `permanent_address` (`mac_address_layout`, 8 bytes) at 0xf4: MAC in its last 6 bytes.
    pub const PERMANENT_ADDRESS_MAC: usize = 0xf6;
    /// `allowed_list_type` (0 UC, 1 MC, 2 VLAN: `MLX5_NVPRT_LIST_TYPE_*`) and `allowed_list_size`.
    pub const ALLOWED_LIST_TYPE: Field = Field::new(0x785, 3);
    pub const ALLOWED_LIST_SIZE: Field = Field::new(0x794, 12);
    /// `current_uc_mac_address[]`: `mac_address_layout` entries of 8 bytes from byte 0x100 of the context.
    pub const ADDRESSES: usize = 0x100;
}
/// `mac_address_layout`: `mac_addr_47_32` (16 bits at 0x10) and `mac_addr_31_0` (32 bits at 0x20); bits 0..0x10
/// reserved.
const MAC_47_32: Field = Field::new(0x10, 16);
const MAC_31_0: Field = Field::new(0x20, 32);
const MAC_ADDRESS_LAYOUT_SIZE: usize = 8;
const LIST_TYPE_UC: u32 = 0;
const QUERY_CTX: u32 = 0x10;
const QUERY_NIC_VPORT_CONTEXT_OUT_SIZE: usize = 0x110;
const MODIFY_CTX: u32 = 0x100;
const MODIFY_NIC_VPORT_CONTEXT_IN_SIZE: usize = 0x200;
/// `modify_nic_vport_context_in.field_select` bits (absolute): `mtu`, `addresses_list` and `roce_en`; the others
/// are refused.
const SELECT_MTU: Field = Field::new(0x79, 1);
const SELECT_ADDRESSES_LIST: Field = Field::new(0x7d, 1);
const SELECT_ROCE_EN: Field = Field::new(0x7e, 1);
const FIELD_SELECT: Field = Field::new(0x60, 32);

/// `query_vport_state_out`: `admin_state` (4 bits at 0x78) and `state` (4 bits at 0x7c); 0x10 bytes.
const VPORT_ADMIN_STATE: Field = Field::new(0x78, 4);
const VPORT_STATE: Field = Field::new(0x7c, 4);
const QUERY_VPORT_STATE_OUT_SIZE: usize = 0x10;
/// `device.h`: `VPORT_STATE_DOWN` / `_UP`; `MLX5_VPORT_ADMIN_STATE_AUTO` (the vport follows the uplink).
const VPORT_STATE_DOWN: u32 = 0;
const VPORT_STATE_UP: u32 = 1;
const VPORT_ADMIN_STATE_AUTO: u32 = 2;

/// QUERY_VPORT_STATE (`query_vport_state_in/out`; Linux `mlx5_query_vport_state`, which `mlx5e_update_carrier`
/// calls with op_mod VNIC_VPORT and vport 0 on every PORT_CHANGE): the function's own vNIC vport only. `state`
/// follows the port's operational state; `admin_state` is AUTO (the vport follows the uplink: no e-switch
/// manager set it otherwise; docs/hca-model.md, "Events and the port").
pub fn query_vport_state(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    // MLX5_VPORT_STATE_OP_MOD_VNIC_VPORT only: the e-switch and uplink views are the e-switch manager's.
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[OTHER_VPORT, VPORT_NUMBER])?;
    need_initialized(hca, c)?;
    if c.get(OTHER_VPORT) != 0 || c.get(VPORT_NUMBER) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    let mut out = c.output(QUERY_VPORT_STATE_OUT_SIZE)?;
    let up = hca.port.oper_status == crate::port::PORT_UP;
    ifc::set(&mut out, VPORT_STATE, if up { VPORT_STATE_UP } else { VPORT_STATE_DOWN });
    ifc::set(&mut out, VPORT_ADMIN_STATE, VPORT_ADMIN_STATE_AUTO);
    Ok(out)
}

pub fn query_nic_vport_context(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[OTHER_VPORT, VPORT_NUMBER, ALLOWED_LIST_TYPE])?;
    need_initialized(hca, c)?;
    if c.get(OTHER_VPORT) != 0 || c.get(VPORT_NUMBER) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    // Address lists (allowed_list_type ≠ 0: current UC/MC/VLAN lists) are not modelled.
    if c.get(ALLOWED_LIST_TYPE) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::UNSUPPORTED_FEATURE));
    }
    let mut out = c.output(QUERY_NIC_VPORT_CONTEXT_OUT_SIZE)?;
    let p = &hca.port;
    let base = QUERY_CTX as usize;
    ifc::set(&mut out, ctx::ROCE_EN.at(QUERY_CTX), p.roce_en.into());
    ifc::set(&mut out, ctx::MIN_WQE_INLINE_MODE.at(QUERY_CTX), p.min_wqe_inline_mode.into());
    ifc::set(&mut out, ctx::MTU.at(QUERY_CTX), p.vport_mtu.into());
    let guid = u64::from_be_bytes(eui64(p.mac));
    for at in [ctx::SYSTEM_IMAGE_GUID, ctx::PORT_GUID, ctx::NODE_GUID] {
        ifc::set64(&mut out, base + at, guid);
    }
    out[base + ctx::PERMANENT_ADDRESS_MAC..base + ctx::PERMANENT_ADDRESS_MAC + 6].copy_from_slice(&p.mac);
    Ok(out)
}

/// MODIFY_NIC_VPORT_CONTEXT of the function's own vport: `mtu`, `roce_en`, and the unicast address list
/// (`addresses_list` with `allowed_list_type` UC, Linux `mlx5_modify_nic_vport_mac_list`: `allowed_list_size`
/// entries after the 0x200-byte fixed part, at most 2^`log_max_current_uc_list`). The list replaces the previous
/// one; the e-switch forwards unicast to the function by it (`Port::eswitch_admits`). Multicast and VLAN lists
/// are not modelled: refused.
pub fn modify_nic_vport_context(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(MODIFY_NIC_VPORT_CONTEXT_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    let list = c.get(SELECT_ADDRESSES_LIST) == 1;
    let size = if list { c.get(ctx::ALLOWED_LIST_SIZE.at(MODIFY_CTX)) as usize } else { 0 };
    let entries_at = MODIFY_CTX as usize + ctx::ADDRESSES;
    let in_len = entries_at + size * MAC_ADDRESS_LAYOUT_SIZE;
    let mut known = vec![
        OTHER_VPORT,
        VPORT_NUMBER,
        FIELD_SELECT,
        ctx::ROCE_EN.at(MODIFY_CTX),
        ctx::MTU.at(MODIFY_CTX),
        ctx::ALLOWED_LIST_TYPE.at(MODIFY_CTX),
        ctx::ALLOWED_LIST_SIZE.at(MODIFY_CTX),
    ];
    for i in 0..size {
        let at = (entries_at + i * MAC_ADDRESS_LAYOUT_SIZE) as u32;
        known.extend([MAC_47_32.at(at), MAC_31_0.at(at)]);
    }
    if list {
        c.need_input(in_len)?;
    }
    c.reserved_zero(in_len.max(MODIFY_NIC_VPORT_CONTEXT_IN_SIZE), &known)?;
    need_initialized(hca, c)?;
    if c.get(OTHER_VPORT) != 0 || c.get(VPORT_NUMBER) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    let select = c.get(FIELD_SELECT);
    let supported =
        [SELECT_MTU, SELECT_ADDRESSES_LIST, SELECT_ROCE_EN].iter().fold(0u32, |m, f| m | (1 << (31 - (f.bit - 0x60))));
    if select & !supported != 0 {
        return Err(c.err(status::BAD_PARAM, reason::UNSUPPORTED_FEATURE));
    }
    // A value in a field that is not selected is refused (by `reserved_zero` for the others; here for these).
    let list_type = c.get(ctx::ALLOWED_LIST_TYPE.at(MODIFY_CTX));
    if c.get(SELECT_MTU) == 0 && c.get(ctx::MTU.at(MODIFY_CTX)) != 0
        || c.get(SELECT_ROCE_EN) == 0 && c.get(ctx::ROCE_EN.at(MODIFY_CTX)) != 0
        || !list && (list_type != 0 || c.get(ctx::ALLOWED_LIST_SIZE.at(MODIFY_CTX)) != 0)
    {
        return Err(c.err(status::BAD_PARAM, reason::RESERVED_NOT_ZERO));
    }
    if list && list_type != LIST_TYPE_UC {
        return Err(c.err(status::BAD_PARAM, reason::UNSUPPORTED_FEATURE));
    }
    let max_list =
        1usize << hca.caps.current(cap_type::GENERAL, crate::caps::cmd_hca_cap::LOG_MAX_CURRENT_UC_LIST).min(16);
    if size > max_list {
        return Err(c.err(status::BAD_PARAM, reason::BAD_REGISTER_VALUE));
    }
    let mtu = c.get(ctx::MTU.at(MODIFY_CTX));
    if c.get(SELECT_MTU) == 1 && (mtu == 0 || mtu > u32::from(hca.port.max_mtu)) {
        return Err(c.err(status::BAD_PARAM, reason::BAD_REGISTER_VALUE));
    }
    let out = c.output(0x10)?;
    if c.get(SELECT_MTU) == 1 {
        hca.port.vport_mtu = mtu as u16;
    }
    if c.get(SELECT_ROCE_EN) == 1 {
        hca.port.roce_en = c.get(ctx::ROCE_EN.at(MODIFY_CTX)) == 1;
    }
    if list {
        hca.port.uc_list = (0..size)
            .map(|i| {
                let at = entries_at + i * MAC_ADDRESS_LAYOUT_SIZE + 2;
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&c.input[at..at + 6]);
                mac
            })
            .collect();
    }
    Ok(out)
}

const PORT_NUM: Field = Field::new(0x4c, 4);
const GID_INDEX: Field = Field::new(0x70, 16);
const GIDS_NUM: Field = Field::new(0x60, 16);
/// `gid_index` 0xffff asks for the whole table (Linux `mlx5_query_hca_vport_gid`).
const ALL_GIDS: u32 = 0xffff;

/// The GID table of the Ethernet port is the RoCE address table: `gid_table_size` is 0 in the reported
/// capabilities (an Ethernet port), so its size is `roce_address_table_size`.
pub fn query_hca_vport_gid(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[OTHER_VPORT, PORT_NUM, VPORT_NUMBER, GID_INDEX])?;
    need_initialized(hca, c)?;
    if c.get(OTHER_VPORT) != 0 || c.get(VPORT_NUMBER) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    if c.get(PORT_NUM) > 1 {
        return Err(c.err(status::BAD_PARAM, reason::BAD_PORT));
    }
    let table = &hca.port.roce_addrs;
    let index = c.get(GID_INDEX);
    let gids: Vec<[u8; 16]> = if index == ALL_GIDS {
        table.iter().map(|a| a.gid).collect()
    } else {
        match table.get(index as usize) {
            Some(a) => vec![a.gid],
            None => return Err(c.err(status::BAD_PARAM, reason::BAD_TABLE_INDEX)),
        }
    };
    let mut out = c.output(0x10 + 16 * gids.len())?;
    ifc::set(&mut out, GIDS_NUM, gids.len() as u32);
    for (i, g) in gids.iter().enumerate() {
        out[0x10 + 16 * i..0x20 + 16 * i].copy_from_slice(g);
    }
    Ok(out)
}

const ROCE_ADDRESS_INDEX: Field = Field::new(0x40, 16);
const VHCA_PORT_NUM: Field = Field::new(0x5c, 4);
const ROCE_ADDRESS: u32 = 0x10;
mod ra {
    use crate::ifc::Field;
    pub const VLAN_VALID: Field = Field::new(0x83, 1);
    pub const VLAN_ID: Field = Field::new(0x84, 12);
    pub const SOURCE_MAC_47_32: Field = Field::new(0x90, 16);
    pub const SOURCE_MAC_31_0: Field = Field::new(0xa0, 32);
    pub const ROCE_L3_TYPE: Field = Field::new(0xd4, 4);
    pub const ROCE_VERSION: Field = Field::new(0xd8, 8);
    pub const SIZE: usize = 0x20;
}
/// `roce_cap.roce_version` (bit 0x98): bit `v` set = RoCE version `v` supported.
const ROCE_CAP_ROCE_VERSION: Field = Field::new(0x98, 8);

fn roce_index(hca: &Hca, c: &Ctx) -> Result<usize, super::CmdError> {
    if c.get(VHCA_PORT_NUM) > 1 {
        return Err(c.err(status::BAD_PARAM, reason::BAD_PORT));
    }
    let index = c.get(ROCE_ADDRESS_INDEX) as usize;
    if index >= hca.port.roce_addrs.len() {
        return Err(c.err(status::BAD_PARAM, reason::BAD_TABLE_INDEX));
    }
    Ok(index)
}

pub fn query_roce_address(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[ROCE_ADDRESS_INDEX, VHCA_PORT_NUM])?;
    need_initialized(hca, c)?;
    let index = roce_index(hca, c)?;
    let mut out = c.output(0x10 + ra::SIZE)?;
    let a = hca.port.roce_addrs[index];
    let base = ROCE_ADDRESS as usize;
    out[base..base + 16].copy_from_slice(&a.gid);
    let f = |f: Field| f.at(ROCE_ADDRESS);
    ifc::set(&mut out, f(ra::VLAN_VALID), a.vlan_valid.into());
    ifc::set(&mut out, f(ra::VLAN_ID), a.vlan_id.into());
    ifc::set(&mut out, f(ra::SOURCE_MAC_47_32), u32::from(u16::from_be_bytes([a.mac[0], a.mac[1]])));
    ifc::set(&mut out, f(ra::SOURCE_MAC_31_0), u32::from_be_bytes([a.mac[2], a.mac[3], a.mac[4], a.mac[5]]));
    ifc::set(&mut out, f(ra::ROCE_L3_TYPE), a.l3_type.into());
    ifc::set(&mut out, f(ra::ROCE_VERSION), a.version.into());
    Ok(out)
}

pub fn set_roce_address(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10 + ra::SIZE)?;
    c.op_mod_in(&[0])?;
    let f = |f: Field| f.at(ROCE_ADDRESS);
    let gid_words = (0..4).map(|k| Field::new(ROCE_ADDRESS * 8 + 32 * k, 32));
    let known: Vec<Field> = [ROCE_ADDRESS_INDEX, VHCA_PORT_NUM]
        .into_iter()
        .chain(gid_words)
        .chain(
            [
                ra::VLAN_VALID,
                ra::VLAN_ID,
                ra::SOURCE_MAC_47_32,
                ra::SOURCE_MAC_31_0,
                ra::ROCE_L3_TYPE,
                ra::ROCE_VERSION,
            ]
            .map(f),
        )
        .collect();
    c.reserved_zero(0x10 + ra::SIZE, &known)?;
    need_initialized(hca, c)?;
    let index = roce_index(hca, c)?;
    let base = ROCE_ADDRESS as usize;
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&c.input[base..base + 16]);
    let hi = (c.get(f(ra::SOURCE_MAC_47_32)) as u16).to_be_bytes();
    let lo = c.get(f(ra::SOURCE_MAC_31_0)).to_be_bytes();
    let a = RoceAddr {
        gid,
        mac: [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]],
        vlan_valid: c.get(f(ra::VLAN_VALID)) == 1,
        vlan_id: c.get(f(ra::VLAN_ID)) as u16,
        l3_type: c.get(f(ra::ROCE_L3_TYPE)) as u8,
        version: c.get(f(ra::ROCE_VERSION)) as u8,
    };
    // An all-zero entry deletes (Linux `set_roce_addr` with no GID); anything else must be a valid entry.
    if !a.is_empty() {
        let versions = hca.caps.block(cap_type::ROCE, true).map_or(0, |b| ifc::get(b, ROCE_CAP_ROCE_VERSION));
        let version_ok = a.version < 8 && versions >> a.version & 1 == 1;
        if !version_ok || a.l3_type > 1 || (!a.vlan_valid && a.vlan_id != 0) || a.gid == [0; 16] {
            return Err(c.err(status::BAD_PARAM, reason::BAD_REGISTER_VALUE));
        }
    }
    let out = c.output(0x10)?;
    hca.port.roce_addrs[index] = a;
    Ok(out)
}
