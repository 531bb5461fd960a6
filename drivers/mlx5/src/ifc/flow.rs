//! Flow steering for the RDMA_RX domain (`mlx5_ifc.h`: `create_flow_table_in/out`, `flow_table_context`,
//! `destroy_flow_table_in`, `create_flow_group_in/out`, `destroy_flow_group_in`, `set_fte_in`,
//! `flow_context`, `delete_fte_in`, `set_flow_table_root_in`, `fte_match_param`, `fte_match_set_misc`;
//! docs/reference/mlx5.md §e.7, §h). The one match we use is `misc_parameters.bth_dst_qp` (a QPN), the one action DROP.

use crate::command::{Command, Output};
use crate::handles::{FlowGroupId, FlowIndex, FlowTableId, Qpn};
use crate::ifc::CMD_HDR_LEN;

pub const MLX5_CMD_OP_SET_FLOW_TABLE_ROOT: u16 = 0x92f;
pub const MLX5_CMD_OP_CREATE_FLOW_TABLE: u16 = 0x930;
pub const MLX5_CMD_OP_DESTROY_FLOW_TABLE: u16 = 0x931;
pub const MLX5_CMD_OP_CREATE_FLOW_GROUP: u16 = 0x933;
pub const MLX5_CMD_OP_DESTROY_FLOW_GROUP: u16 = 0x934;
pub const MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY: u16 = 0x936;
pub const MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY: u16 = 0x938;

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

/// `fte_match_set_misc.bth_dst_qp` inside an `fte_match_param` (misc block at bit 0x200): bit 0x348.
const MATCH_BTH_DST_QP: usize = 0x200 + 0x148;
/// `create_flow_group_in.match_criteria` at bit 0x200; `set_fte_in.flow_context.match_value` at bit 0x400.
const GROUP_CRITERIA: usize = 0x200;
const FTE_CONTEXT: usize = 0x200;
const FTE_MATCH_VALUE: usize = FTE_CONTEXT + 0x200;

fn table_cmd(opcode: u16, in_len: usize, table_type: u8, table: FlowTableId) -> Command {
    let mut c = Command::new(opcode, 0, in_len, CMD_HDR_LEN).with("table_id", table.0.into());
    c.set(0x80, 8, table_type.into());
    c.set(0xa8, 24, table.0);
    c
}

/// CREATE_FLOW_TABLE of `table_type` with `2^log_size` entries at `level`; misses take the default action.
pub fn create_flow_table(table_type: u8, level: u8, log_size: u8) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_FLOW_TABLE, 0, CREATE_FLOW_TABLE_IN_LEN, CMD_HDR_LEN)
        .with("table_type", table_type.into())
        .with("log_size", log_size.into());
    c.set(0x80, 8, table_type.into());
    const CTX: usize = 0xc0;
    c.set(CTX + 0x04, 4, MLX5_FLOW_TABLE_MISS_ACTION_DEF.into());
    c.set(CTX + 0x08, 8, level.into());
    c.set(CTX + 0x18, 8, log_size.into());
    c
}

pub fn create_flow_table_out(out: &Output) -> FlowTableId {
    FlowTableId(out.get(0x48, 24))
}

pub fn destroy_flow_table(table_type: u8, table: FlowTableId) -> Command {
    table_cmd(MLX5_CMD_OP_DESTROY_FLOW_TABLE, DESTROY_FLOW_TABLE_IN_LEN, table_type, table)
}

/// CREATE_FLOW_GROUP over entries `[start, end]` matching on `misc_parameters.bth_dst_qp` (all 24 bits).
pub fn create_flow_group_bth_dst_qp(table_type: u8, table: FlowTableId, start: u32, end: u32) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_CREATE_FLOW_GROUP, CREATE_FLOW_GROUP_IN_LEN, table_type, table);
    c.set(0xe0, 32, start);
    c.set(0x120, 32, end);
    c.set(0x1f8, 8, MLX5_MATCH_MISC_PARAMETERS.into());
    c.set(GROUP_CRITERIA + MATCH_BTH_DST_QP, 24, 0x00ff_ffff);
    c
}

pub fn create_flow_group_out(out: &Output) -> FlowGroupId {
    FlowGroupId(out.get(0x48, 24))
}

pub fn destroy_flow_group(table_type: u8, table: FlowTableId, group: FlowGroupId) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_DESTROY_FLOW_GROUP, DESTROY_FLOW_GROUP_IN_LEN, table_type, table)
        .with("group_id", group.0.into());
    c.set(0xc0, 32, group.0);
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
    c.set(0x100, 32, index.0);
    c.set(FTE_CONTEXT + 0x20, 32, group.0);
    c.set(FTE_CONTEXT + 0x70, 16, action.into());
    c.set(FTE_MATCH_VALUE + MATCH_BTH_DST_QP, 24, qpn.0);
    c
}

pub fn delete_fte(table_type: u8, table: FlowTableId, index: FlowIndex) -> Command {
    let mut c = table_cmd(MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY, DELETE_FTE_IN_LEN, table_type, table)
        .with("flow_index", index.0.into());
    c.set(0x100, 32, index.0);
    c
}

/// SET_FLOW_TABLE_ROOT: makes `table` the root of its domain (`underlay_qpn` 0: Ethernet port).
pub fn set_flow_table_root(table_type: u8, table: FlowTableId) -> Command {
    table_cmd(MLX5_CMD_OP_SET_FLOW_TABLE_ROOT, SET_FLOW_TABLE_ROOT_IN_LEN, table_type, table)
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
}
