//! Flow steering objects for the receive domains the model accepts (`mlx5_ifc.h` `flow_table_context`,
//! `create_flow_group_in`, `flow_context`, `dest_format_struct`; docs/reference/mlx5.md §e.7, §h): NIC_RX (0) and
//! RDMA_RX (7). Tables hold groups (index ranges with match criteria) and entries (FTEs) at flow indexes.
//!
//! The Ethernet receive path steers through the NIC_RX root table (`crate::eth::rx`); the RoCE responder does
//! not consult RDMA_RX tables (`docs/hca-model.md`, "Flow steering").

use std::collections::BTreeMap;

/// `table_type` values (`core/fs_core.h:102-116`).
pub const NIC_RX: u8 = 0;
pub const RDMA_RX: u8 = 7;

/// `flow_context.action` bits (`mlx5_ifc.h` `MLX5_FLOW_CONTEXT_ACTION_*`).
pub mod action {
    pub const ALLOW: u16 = 0x1;
    pub const DROP: u16 = 0x2;
    pub const FWD_DEST: u16 = 0x4;
    pub const COUNT: u16 = 0x8;
}

/// `flow_table_context.table_miss_action` (docs/reference/mlx5.md §e.7).
pub mod miss {
    pub const DEFAULT: u8 = 0;
    pub const FORWARD_TO_TABLE: u8 = 1;
    pub const SWITCH_DOMAIN: u8 = 2;
}

/// `dest_format_struct.destination_type` FLOW_TABLE and TIR (`MLX5_IFC_FLOW_DESTINATION_TYPE_*`), the ones
/// modelled (a TIR only from a NIC_RX table).
pub const DEST_FLOW_TABLE: u8 = 1;
pub const DEST_TIR: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowGroup {
    pub start: u32,
    pub end: u32,
    pub match_criteria_enable: u8,
    /// `fte_match_param` (0x200 bytes).
    pub match_criteria: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fte {
    pub group_id: u32,
    pub action: u16,
    pub flow_tag: u32,
    /// (`destination_type`, `destination_id`).
    pub destinations: Vec<(u8, u32)>,
    /// `fte_match_param` (0x200 bytes).
    pub match_value: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowTable {
    pub table_type: u8,
    pub level: u8,
    pub log_size: u8,
    pub table_miss_action: u8,
    pub table_miss_id: u32,
    pub groups: BTreeMap<u32, FlowGroup>,
    pub entries: BTreeMap<u32, Fte>,
}

impl FlowTable {
    pub fn size(&self) -> u64 {
        1u64 << self.log_size
    }
}

/// All flow tables of the function; table and group ids are unique across table types.
#[derive(Clone, Debug, Default)]
pub struct FlowSteering {
    pub tables: BTreeMap<u32, FlowTable>,
    /// The root table of each table type (SET_FLOW_TABLE_ROOT).
    pub roots: BTreeMap<u8, u32>,
}

impl FlowSteering {
    /// The table `id` if it exists with type `table_type`.
    pub fn table(&self, table_type: u8, id: u32) -> Option<&FlowTable> {
        self.tables.get(&id).filter(|t| t.table_type == table_type)
    }

    pub fn table_mut(&mut self, table_type: u8, id: u32) -> Option<&mut FlowTable> {
        self.tables.get_mut(&id).filter(|t| t.table_type == table_type)
    }

    /// Lowest free table id in `[1, 2^24)`.
    pub fn free_table_id(&self) -> Option<u32> {
        lowest_free(self.tables.keys().copied())
    }

    /// Lowest free group id in `[1, 2^24)` across all tables.
    pub fn free_group_id(&self) -> Option<u32> {
        let mut ids: Vec<u32> = self.tables.values().flat_map(|t| t.groups.keys().copied()).collect();
        ids.sort_unstable();
        lowest_free(ids.into_iter())
    }

    /// Whether another table points at `id` (miss target or forward destination).
    pub fn referenced(&self, id: u32) -> bool {
        self.tables.iter().any(|(&tid, t)| {
            tid != id
                && ((t.table_miss_action == miss::FORWARD_TO_TABLE && t.table_miss_id == id)
                    || t.entries.values().any(|e| e.destinations.contains(&(DEST_FLOW_TABLE, id))))
        })
    }

    /// Whether an entry forwards to TIR `tirn`.
    pub fn uses_tir(&self, tirn: u32) -> bool {
        self.tables.values().any(|t| t.entries.values().any(|e| e.destinations.contains(&(DEST_TIR, tirn))))
    }

    pub fn clear(&mut self) {
        self.tables.clear();
        self.roots.clear();
    }
}

fn lowest_free(sorted: impl Iterator<Item = u32>) -> Option<u32> {
    let mut want = 1u32;
    for id in sorted {
        if id > want {
            break;
        }
        if id == want {
            want += 1;
        }
    }
    (want < 1 << 24).then_some(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_fills_holes() {
        assert_eq!(lowest_free([].into_iter()), Some(1));
        assert_eq!(lowest_free([1, 2, 4].into_iter()), Some(3));
        assert_eq!(lowest_free([2].into_iter()), Some(1));
    }
}
