//! Flow steering (`mlx5_ifc.h`: `create_flow_table_in/out`, `flow_table_context`, `destroy_flow_table_in`,
//! `create_flow_group_in/out`, `destroy_flow_group_in`, `set_fte_in`, `flow_context`, `dest_format_struct`,
//! `delete_fte_in`, `set_flow_table_root_in`, `fte_match_param`, `fte_match_set_lyr_2_4`, `fte_match_set_misc`;
//! docs/reference/mlx5.md §e.7, §h). The NIC_RX domain of the Ethernet port, matching the outer destination MAC
//! and forwarding to a TIR (docs/reference/mlx5.md §i.4); and RDMA_RX builders matching
//! `misc_parameters.bth_dst_qp` (a QPN) with DROP or ALLOW, which only the model's tests use: the lease service
//! installs no RDMA_RX rule (docs/revoke-semantics.md, "Why there is no flow-table DROP").

use crate::command::{Command, Output};
use crate::field::Field;
use crate::handles::{FlowGroupId, FlowIndex, FlowTableId, Qpn};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_CREATE_FLOW_GROUP, MLX5_CMD_OP_CREATE_FLOW_TABLE, MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY,
    MLX5_CMD_OP_DESTROY_FLOW_GROUP, MLX5_CMD_OP_DESTROY_FLOW_TABLE, MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY,
    MLX5_CMD_OP_SET_FLOW_TABLE_ROOT,
};

pub const CREATE_FLOW_TABLE_IN_LEN: usize = 0x40;
pub const DESTROY_FLOW_TABLE_IN_LEN: usize = 0x40;
pub const CREATE_FLOW_GROUP_IN_LEN: usize = 0x400;
pub const DESTROY_FLOW_GROUP_IN_LEN: usize = 0x40;
pub const SET_FTE_IN_LEN: usize = 0x340;
pub const DELETE_FTE_IN_LEN: usize = 0x40;
pub const SET_FLOW_TABLE_ROOT_IN_LEN: usize = 0x40;

/// Flow table types (`core/fs_core.h`; passed straight into `table_type`).
pub const FS_FT_NIC_RX: u8 = 0;
pub const FS_FT_RDMA_RX: u8 = 7;

/// `MLX5_FLOW_TABLE_MISS_ACTION_*` (`mlx5_ifc.h:2190-2194`).
pub const MLX5_FLOW_TABLE_MISS_ACTION_DEF: u8 = 0;
pub const MLX5_FLOW_TABLE_MISS_ACTION_FWD: u8 = 1;
pub const MLX5_FLOW_TABLE_MISS_ACTION_SWITCH_DOMAIN: u8 = 2;

/// `MLX5_MATCH_*` bits of `match_criteria_enable` (`device.h:1159-1166`).
pub const MLX5_MATCH_OUTER_HEADERS: u8 = 1 << 0;
pub const MLX5_MATCH_MISC_PARAMETERS: u8 = 1 << 1;

/// `MLX5_FLOW_CONTEXT_ACTION_*` (`mlx5_ifc.h:3716-3731`).
pub const MLX5_FLOW_CONTEXT_ACTION_ALLOW: u16 = 0x1;
pub const MLX5_FLOW_CONTEXT_ACTION_DROP: u16 = 0x2;
pub const MLX5_FLOW_CONTEXT_ACTION_FWD_DEST: u16 = 0x4;

/// `dest_format_struct.destination_type` for a TIR (`MLX5_IFC_FLOW_DESTINATION_TYPE_TIR`, `mlx5_ifc.h:2184`).
pub const MLX5_IFC_FLOW_DESTINATION_TYPE_TIR: u8 = 0x2;
/// `dest_format_struct` is 8 bytes; the destination list starts at `flow_context` byte 0x300, which is byte
/// 0x340 of `set_fte_in`: right after its fixed part.
pub const DEST_FORMAT_LEN: usize = 8;

/// `set_flow_table_root_in.op_mod`: 0 connects `table_id` as the root, 1 disconnects the root.
pub const SET_ROOT_CONNECT: u16 = 0;
pub const SET_ROOT_DISCONNECT: u16 = 1;

/// `table_type` and `table_id`, at the same place in every flow-table command that names a table
/// (`create_flow_table_in` has `table_type` only).
const TABLE_TYPE: Field = Field::new(0x80, 8);
const TABLE_ID: Field = Field::new(0xa8, 24);
/// `create_flow_table_out.table_id`, `create_flow_group_out.group_id`.
const CREATED_ID: Field = OBJECT_ID;

/// `flow_table_context`, offsets from its start; at bit 0xc0 of `create_flow_table_in`.
pub mod flow_table_context {
    use crate::field::Field;
    pub const TABLE_MISS_ACTION: Field = Field::new(0x04, 4);
    pub const LEVEL: Field = Field::new(0x08, 8);
    pub const LOG_SIZE: Field = Field::new(0x18, 8);
}
const FLOW_TABLE_CONTEXT: usize = 0xc0;

/// `create_flow_group_in`.
const START_FLOW_INDEX: Field = Field::new(0xe0, 32);
const END_FLOW_INDEX: Field = Field::new(0x120, 32);
const MATCH_CRITERIA_ENABLE: Field = Field::new(0x1f8, 8);
/// `create_flow_group_in.match_criteria` (an `fte_match_param`).
const GROUP_CRITERIA: usize = 0x200;
/// `destroy_flow_group_in.group_id`.
const DESTROY_GROUP_ID: Field = Field::new(0xc0, 32);

/// `set_fte_in.flow_index` (also `delete_fte_in.flow_index`) and its `flow_context` at bit 0x200.
const FLOW_INDEX: Field = Field::new(0x100, 32);
const FTE_CONTEXT: usize = 0x200;

/// `flow_context`, offsets from its start.
pub mod flow_context {
    use crate::field::Field;
    pub const GROUP_ID: Field = Field::new(0x20, 32);
    pub const ACTION: Field = Field::new(0x70, 16);
    pub const DESTINATION_LIST_SIZE: Field = Field::new(0x88, 24);
    /// `match_value` (an `fte_match_param`).
    pub const MATCH_VALUE: usize = 0x200;
    /// `destination[]`: `dest_format_struct`s from byte 0x300.
    pub const DESTINATION: usize = 0x1800;
}
const FTE_MATCH_VALUE: usize = FTE_CONTEXT + flow_context::MATCH_VALUE;
const FTE_DESTINATIONS: usize = FTE_CONTEXT + flow_context::DESTINATION;

/// `fte_match_param`, offsets from its start: `outer_headers` (`fte_match_set_lyr_2_4`) open it, and
/// `misc_parameters` (`fte_match_set_misc`) sit at bit 0x200.
pub mod fte_match_param {
    use crate::field::Field;
    /// `outer_headers.dmac_47_16`, `outer_headers.dmac_15_0`.
    pub const DMAC_47_16: Field = Field::new(0x40, 32);
    pub const DMAC_15_0: Field = Field::new(0x60, 16);
    /// `misc_parameters.bth_dst_qp` (misc block at bit 0x200, the field at 0x148 in it).
    pub const BTH_DST_QP: Field = Field::new(0x200 + 0x148, 24);
}

/// `dest_format_struct`, offsets from its start.
pub mod dest_format {
    use crate::field::Field;
    pub const DESTINATION_TYPE: Field = Field::new(0x00, 8);
    pub const DESTINATION_ID: Field = Field::new(0x08, 24);
}

fn table_cmd(opcode: u16, in_len: usize, table_type: u8, table: FlowTableId) -> Command {
    let mut c = Command::new(opcode, 0, in_len, CMD_HDR_LEN).with("table_id", table.0.into());
    c.set(TABLE_TYPE, table_type.into());
    c.set(TABLE_ID, table.0);
    c
}

/// CREATE_FLOW_TABLE of `table_type` with `2^log_size` entries at `level`; misses take the default action.
pub fn create_flow_table(table_type: u8, level: u8, log_size: u8) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_FLOW_TABLE, 0, CREATE_FLOW_TABLE_IN_LEN, CMD_HDR_LEN)
        .with("table_type", table_type.into())
        .with("log_size", log_size.into());
    c.set(TABLE_TYPE, table_type.into());
    c.set(flow_table_context::TABLE_MISS_ACTION.at(FLOW_TABLE_CONTEXT), MLX5_FLOW_TABLE_MISS_ACTION_DEF.into());
    c.set(flow_table_context::LEVEL.at(FLOW_TABLE_CONTEXT), level.into());
    c.set(flow_table_context::LOG_SIZE.at(FLOW_TABLE_CONTEXT), log_size.into());
    c
}

pub fn create_flow_table_out(out: &Output) -> FlowTableId {
    FlowTableId(out.get(CREATED_ID))
}

pub fn destroy_flow_table(table_type: u8, table: FlowTableId) -> Command {
    table_cmd(MLX5_CMD_OP_DESTROY_FLOW_TABLE, DESTROY_FLOW_TABLE_IN_LEN, table_type, table)
}

/// CREATE_FLOW_GROUP over entries `[start, end]` matching on `misc_parameters.bth_dst_qp` (all 24 bits).
pub fn create_flow_group_bth_dst_qp(table_type: u8, table: FlowTableId, start: u32, end: u32) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_CREATE_FLOW_GROUP, CREATE_FLOW_GROUP_IN_LEN, table_type, table);
    c.set(START_FLOW_INDEX, start);
    c.set(END_FLOW_INDEX, end);
    c.set(MATCH_CRITERIA_ENABLE, MLX5_MATCH_MISC_PARAMETERS.into());
    c.set(fte_match_param::BTH_DST_QP.at(GROUP_CRITERIA), 0x00ff_ffff);
    c
}

pub fn create_flow_group_out(out: &Output) -> FlowGroupId {
    FlowGroupId(out.get(CREATED_ID))
}

pub fn destroy_flow_group(table_type: u8, table: FlowTableId, group: FlowGroupId) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_DESTROY_FLOW_GROUP, DESTROY_FLOW_GROUP_IN_LEN, table_type, table)
        .with("group_id", group.0.into());
    c.set(DESTROY_GROUP_ID, group.0);
    c
}

/// SET_FLOW_TABLE_ENTRY (op_mod 0: a new entry) at `index` in `group`: packets whose BTH destination QP is
/// `qpn` get `action` (`MLX5_FLOW_CONTEXT_ACTION_DROP` or `_ALLOW`; no destinations).
pub fn set_fte_bth_dst_qp(
    table_type: u8,
    table: FlowTableId,
    group: FlowGroupId,
    index: FlowIndex,
    qpn: Qpn,
    action: u16,
) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY, SET_FTE_IN_LEN, table_type, table)
        .with("flow_index", index.0.into())
        .with("qpn", qpn.0.into());
    c.set(FLOW_INDEX, index.0);
    c.set(flow_context::GROUP_ID.at(FTE_CONTEXT), group.0);
    c.set(flow_context::ACTION.at(FTE_CONTEXT), action.into());
    c.set(fte_match_param::BTH_DST_QP.at(FTE_MATCH_VALUE), qpn.0);
    c
}

/// CREATE_FLOW_GROUP over entries `[start, end]` matching the whole outer destination MAC
/// (`match_criteria_enable` = outer headers).
pub fn create_flow_group_dmac(table_type: u8, table: FlowTableId, start: u32, end: u32) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_CREATE_FLOW_GROUP, CREATE_FLOW_GROUP_IN_LEN, table_type, table);
    c.set(START_FLOW_INDEX, start);
    c.set(END_FLOW_INDEX, end);
    c.set(MATCH_CRITERIA_ENABLE, MLX5_MATCH_OUTER_HEADERS.into());
    c.set(fte_match_param::DMAC_47_16.at(GROUP_CRITERIA), u32::MAX);
    c.set(fte_match_param::DMAC_15_0.at(GROUP_CRITERIA), 0xffff);
    c
}

/// SET_FLOW_TABLE_ENTRY (op_mod 0) at `index` in `group`: frames whose outer destination MAC is `dmac` are
/// forwarded (`FWD_DEST`) to TIR `tirn` (one destination, `destination_list_size` 1).
pub fn set_fte_dmac_to_tir(
    table_type: u8,
    table: FlowTableId,
    group: FlowGroupId,
    index: FlowIndex,
    dmac: [u8; 6],
    tirn: u32,
) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY, SET_FTE_IN_LEN + DEST_FORMAT_LEN, table_type, table)
        .with("flow_index", index.0.into())
        .with("tirn", tirn.into());
    c.set(FLOW_INDEX, index.0);
    c.set(flow_context::GROUP_ID.at(FTE_CONTEXT), group.0);
    c.set(flow_context::ACTION.at(FTE_CONTEXT), MLX5_FLOW_CONTEXT_ACTION_FWD_DEST.into());
    c.set(flow_context::DESTINATION_LIST_SIZE.at(FTE_CONTEXT), 1);
    let dmac_47_16 = u32::from_be_bytes([dmac[0], dmac[1], dmac[2], dmac[3]]);
    c.set(fte_match_param::DMAC_47_16.at(FTE_MATCH_VALUE), dmac_47_16);
    c.set(fte_match_param::DMAC_15_0.at(FTE_MATCH_VALUE), u16::from_be_bytes([dmac[4], dmac[5]]).into());
    c.set(dest_format::DESTINATION_TYPE.at(FTE_DESTINATIONS), MLX5_IFC_FLOW_DESTINATION_TYPE_TIR.into());
    c.set(dest_format::DESTINATION_ID.at(FTE_DESTINATIONS), tirn);
    c
}

pub fn delete_fte(table_type: u8, table: FlowTableId, index: FlowIndex) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY, DELETE_FTE_IN_LEN, table_type, table)
        .with("flow_index", index.0.into());
    c.set(FLOW_INDEX, index.0);
    c
}

/// SET_FLOW_TABLE_ROOT: makes `table` the root of its domain (`underlay_qpn` 0: Ethernet port).
pub fn set_flow_table_root(table_type: u8, table: FlowTableId) -> Command {
    table_cmd(MLX5_CMD_OP_SET_FLOW_TABLE_ROOT, SET_FLOW_TABLE_ROOT_IN_LEN, table_type, table)
}

/// SET_FLOW_TABLE_ROOT op_mod 1: disconnects the domain's root (before its table is destroyed; `table_id` 0).
pub fn clear_flow_table_root(table_type: u8) -> Command {
    let mut c =
        Command::new(MLX5_CMD_OP_SET_FLOW_TABLE_ROOT, SET_ROOT_DISCONNECT, SET_FLOW_TABLE_ROOT_IN_LEN, CMD_HDR_LEN)
            .with("table_type", table_type.into());
    c.set(TABLE_TYPE, table_type.into());
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, out};

    #[test]
    fn table() {
        let c = create_flow_table(FS_FT_RDMA_RX, 1, 4);
        let b = c.input();
        assert_eq!((be16(b, 0), b.len(), b[0x10]), (0x930, 0x40, 7));
        // flow_table_context dword 0 (byte 0x18): table_miss_action [27:24], level [23:16], log_size [7:0].
        assert_eq!(be32(b, 0x18), (1 << 16) | 4);
        assert_eq!(create_flow_table_out(&out(0x10, &[(0x08, &[0, 0, 0, 0x21])])), FlowTableId(0x21));
        let d = destroy_flow_table(FS_FT_RDMA_RX, FlowTableId(0x21));
        assert_eq!((be16(d.input(), 0), d.input()[0x10], be32(d.input(), 0x14)), (0x931, 7, 0x21));
        let r = set_flow_table_root(FS_FT_RDMA_RX, FlowTableId(0x21));
        assert_eq!((be16(r.input(), 0), be32(r.input(), 0x14), be32(r.input(), 0x18)), (0x92f, 0x21, 0));
    }

    #[test]
    fn group() {
        let c = create_flow_group_bth_dst_qp(FS_FT_RDMA_RX, FlowTableId(5), 0, 15);
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x933, 0x400));
        assert_eq!((b[0x10], be32(b, 0x14), be32(b, 0x1c), be32(b, 0x24)), (7, 5, 0, 15));
        assert_eq!(b[0x3f], 2);
        // match_criteria at byte 0x40, misc block +0x40, bth_dst_qp at misc byte 0x29: absolute 0xa9.
        assert_eq!(be32(b, 0xa8), 0x00ff_ffff);
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 2 + 1 + 1 + 1 + 1 + 3);
        assert_eq!(create_flow_group_out(&out(0x10, &[(0x0b, &[3])])), FlowGroupId(3));
        let d = destroy_flow_group(FS_FT_RDMA_RX, FlowTableId(5), FlowGroupId(3));
        assert_eq!((be16(d.input(), 0), be32(d.input(), 0x14), be32(d.input(), 0x18)), (0x934, 5, 3));
    }

    #[test]
    fn entries() {
        let c = set_fte_bth_dst_qp(
            FS_FT_RDMA_RX,
            FlowTableId(5),
            FlowGroupId(3),
            FlowIndex(2),
            Qpn(0x12_3456),
            MLX5_FLOW_CONTEXT_ACTION_DROP,
        );
        let b = c.input();
        assert_eq!((be16(b, 0), be16(b, 6), b.len()), (0x936, 0, 0x340));
        assert_eq!((b[0x10], be32(b, 0x14), be32(b, 0x20)), (7, 5, 2));
        assert_eq!(be32(b, 0x44), 3); // flow_context.group_id
        assert_eq!(be16(b, 0x4e), 2); // action DROP
        assert_eq!(be32(b, 0x50), 0); // destination_list_size
        // match_value at byte 0x80, misc +0x40, bth_dst_qp +0x29: absolute 0xe9.
        assert_eq!(be32(b, 0xe8), 0x12_3456);
        let d = delete_fte(FS_FT_RDMA_RX, FlowTableId(5), FlowIndex(2));
        assert_eq!((be16(d.input(), 0), be32(d.input(), 0x14), be32(d.input(), 0x20)), (0x938, 5, 2));
    }

    #[test]
    fn nic_rx_dmac_to_tir() {
        let t = create_flow_table(FS_FT_NIC_RX, 0, 1);
        assert_eq!((be16(t.input(), 0), t.input()[0x10], be32(t.input(), 0x18)), (0x930, 0, 1));
        let g = create_flow_group_dmac(FS_FT_NIC_RX, FlowTableId(4), 0, 1);
        let b = g.input();
        assert_eq!((be16(b, 0), b.len(), b[0x10], be32(b, 0x14)), (0x933, 0x400, 0, 4));
        assert_eq!((be32(b, 0x1c), be32(b, 0x24), b[0x3f]), (0, 1, 1));
        // match_criteria at byte 0x40; outer dmac_47_16 at +8, dmac_15_0 in the high half of +0xc.
        assert_eq!((be32(b, 0x48), be32(b, 0x4c)), (u32::MAX, 0xffff_0000));
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 2 + 1 + 1 + 1 + 6);

        let e = set_fte_dmac_to_tir(
            FS_FT_NIC_RX,
            FlowTableId(4),
            FlowGroupId(8),
            FlowIndex(1),
            [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01],
            0x12_3456,
        );
        let b = e.input();
        assert_eq!((be16(b, 0), b.len(), b[0x10], be32(b, 0x14), be32(b, 0x20)), (0x936, 0x348, 0, 4, 1));
        assert_eq!(be32(b, 0x44), 8); // group_id
        assert_eq!(be16(b, 0x4e), 4); // action FWD_DEST
        assert_eq!(be32(b, 0x50), 1); // destination_list_size
        // match_value at byte 0x80: outer dmac.
        assert_eq!((be32(b, 0x88), be32(b, 0x8c)), (0x024c_4200, 0x0001_0000));
        // The destination list at byte 0x340: type TIR in the top byte, id below; the second dword zero.
        assert_eq!((be32(b, 0x340), be32(b, 0x344)), ((2 << 24) | 0x12_3456, 0));

        let r = set_flow_table_root(FS_FT_NIC_RX, FlowTableId(4));
        assert_eq!((be16(r.input(), 0), be16(r.input(), 6), r.input()[0x10], be32(r.input(), 0x14)), (0x92f, 0, 0, 4));
        let c = clear_flow_table_root(FS_FT_NIC_RX);
        assert_eq!((be16(c.input(), 0), be16(c.input(), 6), be32(c.input(), 0x14)), (0x92f, 1, 0));
    }
}
