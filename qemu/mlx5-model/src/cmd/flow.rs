//! CREATE_FLOW_TABLE, DESTROY_FLOW_TABLE, CREATE_FLOW_GROUP, DESTROY_FLOW_GROUP, SET_FLOW_TABLE_ENTRY,
//! DELETE_FLOW_TABLE_ENTRY, SET_FLOW_TABLE_ROOT for NIC_RX and RDMA_RX (`mlx5_ifc.h` `create_flow_table_in`,
//! `flow_table_context`, `destroy_flow_table_in`, `create_flow_group_in`, `destroy_flow_group_in`,
//! `set_fte_in`, `flow_context`, `dest_format_struct`, `delete_fte_in`, `set_flow_table_root_in`;
//! docs/reference/mlx5.md §e.7). An occupied flow_index gives status 0x08, as docs/reference/revoke-spec.md §3.2
//! observed on a CX-5.

use super::{CmdError, CmdResult, Ctx, need_initialized, reason, status};
use crate::flow::{self, DEST_FLOW_TABLE, DEST_TIR, FlowGroup, FlowTable, Fte, action, miss};
use crate::hca::Hca;
use crate::ifc::{self, Field};

const OTHER_VPORT: Field = Field::new(0x40, 1);
const VPORT_NUMBER: Field = Field::new(0x50, 16);
const TABLE_TYPE: Field = Field::new(0x80, 8);
const TABLE_ID: Field = Field::new(0xa8, 24);
/// `create_flow_table_out.table_id`, `create_flow_group_out.group_id`.
const OUT_ID: Field = Field::new(0x48, 24);

/// `flow_table_context` at byte 0x18 of `create_flow_table_in`.
mod ftc {
    use crate::ifc::Field;
    pub const AT: u32 = 0x18;
    pub const REFORMAT_EN: Field = Field::new(0x00, 1);
    pub const DECAP_EN: Field = Field::new(0x01, 1);
    pub const SW_OWNER: Field = Field::new(0x02, 1);
    pub const TERMINATION_TABLE: Field = Field::new(0x03, 1);
    pub const TABLE_MISS_ACTION: Field = Field::new(0x04, 4);
    pub const LEVEL: Field = Field::new(0x08, 8);
    pub const RTC_VALID: Field = Field::new(0x10, 1);
    pub const LOG_SIZE: Field = Field::new(0x18, 8);
    pub const TABLE_MISS_ID: Field = Field::new(0x28, 24);
    pub const LAG_MASTER_NEXT_TABLE_ID: Field = Field::new(0x48, 24);
}

/// `create_flow_group_in` (0x400 bytes).
mod fg {
    use crate::ifc::Field;
    pub const SIZE: usize = 0x400;
    pub const GROUP_TYPE: Field = Field::new(0x8c, 4);
    pub const SOURCE_ESWITCH_OWNER_VHCA_ID_VALID: Field = Field::new(0xc0, 1);
    pub const START_FLOW_INDEX: Field = Field::new(0xe0, 32);
    pub const END_FLOW_INDEX: Field = Field::new(0x120, 32);
    pub const MATCH_DEFINER_ID: Field = Field::new(0x150, 16);
    pub const MATCH_CRITERIA_ENABLE: Field = Field::new(0x1f8, 8);
    pub const MATCH_CRITERIA: usize = 0x40;
}

/// `destroy_flow_group_in.group_id`.
const GROUP_ID: Field = Field::new(0xc0, 32);

/// `set_fte_in` (0x340 bytes before `destination[]`); `flow_context` at byte 0x40.
mod fte {
    use crate::ifc::Field;
    pub const SIZE: usize = 0x340;
    pub const IGNORE_FLOW_LEVEL: Field = Field::new(0xc0, 1);
    pub const MODIFY_ENABLE_MASK: Field = Field::new(0xd8, 8);
    pub const FLOW_INDEX: Field = Field::new(0x100, 32);
    pub const FC: u32 = 0x40;
    pub const GROUP_ID: Field = Field::new(0x20, 32);
    pub const FLOW_TAG: Field = Field::new(0x48, 24);
    pub const ACTION: Field = Field::new(0x70, 16);
    pub const DESTINATION_LIST_SIZE: Field = Field::new(0x88, 24);
    pub const FLOW_COUNTER_LIST_SIZE: Field = Field::new(0xa8, 24);
    /// `flow_context.match_value` (byte 0x40 of `flow_context`) and `destination[]` (byte 0x300).
    pub const MATCH_VALUE: usize = 0x80;
    pub const DESTINATION: usize = 0x340;
    pub const DEST_TYPE: Field = Field::new(0x00, 8);
    pub const DEST_ID: Field = Field::new(0x08, 24);
}

/// `delete_fte_in.flow_index`.
const DELETE_FLOW_INDEX: Field = Field::new(0x100, 32);

/// `set_flow_table_root_in`.
mod root {
    use crate::ifc::Field;
    pub const TABLE_OF_OTHER_VPORT: Field = Field::new(0x8f, 1);
    pub const TABLE_VPORT_NUMBER: Field = Field::new(0x90, 16);
    pub const UNDERLAY_QPN: Field = Field::new(0xc8, 24);
    pub const TABLE_ESWITCH_OWNER_VHCA_ID_VALID: Field = Field::new(0xe0, 1);
    pub const TABLE_ESWITCH_OWNER_VHCA_ID: Field = Field::new(0xf0, 16);
}

/// `fte_match_param` size and the enable bits the model knows (outer, misc, inner, misc2, misc3).
const MATCH_PARAM_SIZE: usize = 0x200;
const MATCH_BLOCK: usize = 0x40;
const KNOWN_CRITERIA: u32 = 0x1f;
/// `match_criteria_enable` bit 0: outer headers.
const OUTER_HEADERS: u32 = 0x1;
/// Largest `log_size` accepted (the model's own limit, `docs/hca-model.md`).
pub const MAX_LOG_SIZE: u32 = 16;
/// Highest `level` accepted (flow tables chain to higher levels only).
pub const MAX_LEVEL: u32 = 63;

/// Every 32-bit word of a `fte_match_param` at `byte` (for `reserved_zero`).
fn match_fields(byte: usize) -> impl Iterator<Item = Field> {
    (0..MATCH_PARAM_SIZE / 4).map(move |i| Field::new(((byte + 4 * i) * 8) as u32, 32))
}

fn bad(c: &Ctx, why: u16) -> CmdError {
    c.err(status::BAD_PARAM, why)
}

/// The common prefix: own vport only, table type NIC_RX or RDMA_RX.
fn vport_and_type(c: &Ctx) -> Result<u8, CmdError> {
    if c.get(OTHER_VPORT) != 0 || c.get(VPORT_NUMBER) != 0 {
        return Err(bad(c, reason::WRONG_FUNCTION));
    }
    let t = c.get(TABLE_TYPE) as u8;
    if t != flow::NIC_RX && t != flow::RDMA_RX {
        return Err(bad(c, reason::FT_BAD_TABLE_TYPE));
    }
    Ok(t)
}

pub fn create_flow_table(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x40)?;
    c.op_mod_in(&[0])?;
    let f = |x: Field| x.at(ftc::AT);
    c.reserved_zero(
        0x40,
        &[
            OTHER_VPORT,
            VPORT_NUMBER,
            TABLE_TYPE,
            f(ftc::REFORMAT_EN),
            f(ftc::DECAP_EN),
            f(ftc::SW_OWNER),
            f(ftc::TERMINATION_TABLE),
            f(ftc::TABLE_MISS_ACTION),
            f(ftc::LEVEL),
            f(ftc::RTC_VALID),
            f(ftc::LOG_SIZE),
            f(ftc::TABLE_MISS_ID),
            f(ftc::LAG_MASTER_NEXT_TABLE_ID),
        ],
    )?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    let g = |x: Field| c.get(x.at(ftc::AT));
    if g(ftc::REFORMAT_EN) != 0
        || g(ftc::DECAP_EN) != 0
        || g(ftc::SW_OWNER) != 0
        || g(ftc::TERMINATION_TABLE) != 0
        || g(ftc::RTC_VALID) != 0
        || g(ftc::LAG_MASTER_NEXT_TABLE_ID) != 0
    {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let (level, log_size) = (g(ftc::LEVEL), g(ftc::LOG_SIZE));
    if level > MAX_LEVEL || log_size > MAX_LOG_SIZE {
        return Err(bad(c, reason::CAP_ABOVE_MAX));
    }
    let miss_action = g(ftc::TABLE_MISS_ACTION) as u8;
    let miss_id = g(ftc::TABLE_MISS_ID);
    match miss_action {
        miss::DEFAULT if miss_id == 0 => {}
        miss::FORWARD_TO_TABLE => {
            // The miss target must be a deeper table of the same type (no loops).
            let ok = hca.flow.table(table_type, miss_id).is_some_and(|t| u32::from(t.level) > level);
            if !ok {
                return Err(bad(c, reason::FT_BAD_DESTINATION));
            }
        }
        // Continue to normal RDMA processing: only for RDMA_RX (docs/reference/mlx5.md §h).
        miss::SWITCH_DOMAIN if table_type == flow::RDMA_RX && miss_id == 0 => {}
        _ => return Err(bad(c, reason::FT_BAD_ACTION)),
    }
    let mut out = c.output(0x10)?;
    let Some(id) = hca.flow.free_table_id() else { return Err(c.err(status::NO_RES, reason::TABLE_FULL)) };
    hca.flow.tables.insert(
        id,
        FlowTable {
            table_type,
            level: level as u8,
            log_size: log_size as u8,
            table_miss_action: miss_action,
            table_miss_id: miss_id,
            groups: Default::default(),
            entries: Default::default(),
        },
    );
    ifc::set(&mut out, OUT_ID, id);
    Ok(out)
}

pub fn destroy_flow_table(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x40)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x40, &[OTHER_VPORT, VPORT_NUMBER, TABLE_TYPE, TABLE_ID])?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    let id = c.get(TABLE_ID);
    let Some(t) = hca.flow.table(table_type, id) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if !t.groups.is_empty() || hca.flow.roots.get(&table_type) == Some(&id) || hca.flow.referenced(id) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    hca.flow.tables.remove(&id);
    Ok(out)
}

pub fn create_flow_group(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(fg::SIZE)?;
    c.op_mod_in(&[0])?;
    let mut known = vec![
        OTHER_VPORT,
        VPORT_NUMBER,
        TABLE_TYPE,
        fg::GROUP_TYPE,
        TABLE_ID,
        fg::SOURCE_ESWITCH_OWNER_VHCA_ID_VALID,
        fg::START_FLOW_INDEX,
        fg::END_FLOW_INDEX,
        fg::MATCH_DEFINER_ID,
        fg::MATCH_CRITERIA_ENABLE,
    ];
    known.extend(match_fields(fg::MATCH_CRITERIA));
    c.reserved_zero(fg::SIZE, &known)?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    if c.get(fg::GROUP_TYPE) != 0
        || c.get(fg::SOURCE_ESWITCH_OWNER_VHCA_ID_VALID) != 0
        || c.get(fg::MATCH_DEFINER_ID) != 0
    {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let id = c.get(TABLE_ID);
    let Some(t) = hca.flow.table(table_type, id) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    let (start, end) = (c.get(fg::START_FLOW_INDEX), c.get(fg::END_FLOW_INDEX));
    if start > end || u64::from(end) >= t.size() || t.groups.values().any(|g| start <= g.end && g.start <= end) {
        return Err(bad(c, reason::FT_BAD_INDEX));
    }
    let enable = c.get(fg::MATCH_CRITERIA_ENABLE);
    if enable & !KNOWN_CRITERIA != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    // The Ethernet receive path matches outer headers only (`crate::eth::frame::outer_headers`): a NIC_RX
    // group with other criteria could not be honoured.
    if table_type == flow::NIC_RX && enable & !OUTER_HEADERS != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let criteria = c.input[fg::MATCH_CRITERIA..fg::MATCH_CRITERIA + MATCH_PARAM_SIZE].to_vec();
    // A block that is not enabled must not carry criteria (stricter than the PRM, which would ignore them).
    for (i, block) in criteria.chunks(MATCH_BLOCK).enumerate() {
        if enable & (1 << i) == 0 && block.iter().any(|&b| b != 0) {
            return Err(bad(c, reason::RESERVED_NOT_ZERO));
        }
    }
    let mut out = c.output(0x10)?;
    let Some(gid) = hca.flow.free_group_id() else { return Err(c.err(status::NO_RES, reason::TABLE_FULL)) };
    if let Some(t) = hca.flow.table_mut(table_type, id) {
        t.groups.insert(gid, FlowGroup { start, end, match_criteria_enable: enable as u8, match_criteria: criteria });
    }
    ifc::set(&mut out, OUT_ID, gid);
    Ok(out)
}

pub fn destroy_flow_group(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x40)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x40, &[OTHER_VPORT, VPORT_NUMBER, TABLE_TYPE, TABLE_ID, GROUP_ID])?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    let gid = c.get(GROUP_ID);
    let Some(t) = hca.flow.table(table_type, c.get(TABLE_ID)) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if !t.groups.contains_key(&gid) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    if t.entries.values().any(|e| e.group_id == gid) {
        return Err(c.err(status::BAD_RES_STATE, reason::OBJECTS_IN_USE));
    }
    let out = c.output(0x10)?;
    if let Some(t) = hca.flow.table_mut(table_type, c.get(TABLE_ID)) {
        t.groups.remove(&gid);
    }
    Ok(out)
}

pub fn set_flow_table_entry(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(fte::SIZE)?;
    // op_mod 1 (modify in place) is not modelled: a CX-5 has none (docs/reference/revoke-spec.md §3.2).
    c.op_mod_in(&[0])?;
    let fc = |x: Field| x.at(fte::FC);
    let mut known = vec![
        OTHER_VPORT,
        VPORT_NUMBER,
        TABLE_TYPE,
        TABLE_ID,
        fte::IGNORE_FLOW_LEVEL,
        fte::MODIFY_ENABLE_MASK,
        fte::FLOW_INDEX,
        fc(fte::GROUP_ID),
        fc(fte::FLOW_TAG),
        fc(fte::ACTION),
        fc(fte::DESTINATION_LIST_SIZE),
        fc(fte::FLOW_COUNTER_LIST_SIZE),
    ];
    known.extend(match_fields(fte::MATCH_VALUE));
    c.reserved_zero(fte::SIZE, &known)?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    if c.get(fte::MODIFY_ENABLE_MASK) != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let id = c.get(TABLE_ID);
    let Some(t) = hca.flow.table(table_type, id) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    let index = c.get(fte::FLOW_INDEX);
    let group_id = c.get(fc(fte::GROUP_ID));
    let Some(g) = t.groups.get(&group_id) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if index < g.start || index > g.end {
        return Err(bad(c, reason::FT_BAD_INDEX));
    }
    if t.entries.contains_key(&index) {
        // docs/reference/revoke-spec.md §3.2: SET_FLOW_TABLE_ENTRY on an occupied flow_index returned status 0x08.
        return Err(c.err(status::LIM_ERR, reason::FT_INDEX_OCCUPIED));
    }
    let act = c.get(fc(fte::ACTION)) as u16;
    let terminal = act & (action::ALLOW | action::DROP | action::FWD_DEST);
    if act & !(action::ALLOW | action::DROP | action::FWD_DEST | action::COUNT) != 0 || terminal.count_ones() != 1 {
        return Err(bad(c, reason::FT_BAD_ACTION));
    }
    // Flow counters are not modelled.
    if act & action::COUNT != 0 || c.get(fc(fte::FLOW_COUNTER_LIST_SIZE)) != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let ndest = c.get(fc(fte::DESTINATION_LIST_SIZE)) as usize;
    if (terminal == action::FWD_DEST) != (ndest > 0) || ndest > 1024 {
        return Err(bad(c, reason::FT_BAD_DESTINATION));
    }
    c.need_input(fte::DESTINATION + 8 * ndest)?;
    let mut destinations = Vec::with_capacity(ndest);
    for i in 0..ndest {
        let d = &c.input[fte::DESTINATION + 8 * i..fte::DESTINATION + 8 * i + 8];
        let (dt, did) = (ifc::get(d, fte::DEST_TYPE) as u8, ifc::get(d, fte::DEST_ID));
        if ifc::get(d, Field::new(0x20, 32)) != 0 {
            return Err(bad(c, reason::UNSUPPORTED_FEATURE));
        }
        // Forwarding to a deeper table of the same type, or (NIC_RX) to an existing TIR; no vports exist.
        let ok = match dt {
            DEST_FLOW_TABLE => {
                hca.flow.table(table_type, did).is_some_and(|d| c.get(fte::IGNORE_FLOW_LEVEL) == 1 || d.level > t.level)
            }
            DEST_TIR => table_type == flow::NIC_RX && hca.eth.tirs.contains_key(&did),
            _ => false,
        };
        if !ok {
            return Err(bad(c, reason::FT_BAD_DESTINATION));
        }
        destinations.push((dt, did));
    }
    let match_value = c.input[fte::MATCH_VALUE..fte::MATCH_VALUE + MATCH_PARAM_SIZE].to_vec();
    // Value bits outside the group's criteria are refused (stricter than the PRM, which masks them).
    if match_value.iter().zip(&g.match_criteria).any(|(v, m)| v & !m != 0) {
        return Err(bad(c, reason::RESERVED_NOT_ZERO));
    }
    let out = c.output(0x10)?;
    let entry = Fte { group_id, action: act, flow_tag: c.get(fc(fte::FLOW_TAG)), destinations, match_value };
    if let Some(t) = hca.flow.table_mut(table_type, id) {
        t.entries.insert(index, entry);
    }
    Ok(out)
}

pub fn delete_flow_table_entry(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x40)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x40, &[OTHER_VPORT, VPORT_NUMBER, TABLE_TYPE, TABLE_ID, DELETE_FLOW_INDEX])?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    let index = c.get(DELETE_FLOW_INDEX);
    let Some(t) = hca.flow.table(table_type, c.get(TABLE_ID)) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if !t.entries.contains_key(&index) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    let out = c.output(0x10)?;
    if let Some(t) = hca.flow.table_mut(table_type, c.get(TABLE_ID)) {
        t.entries.remove(&index);
    }
    Ok(out)
}

pub fn set_flow_table_root(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x40)?;
    // op_mod 0 connects `table_id` as the root, 1 disconnects (docs/reference/mlx5.md §e.7).
    c.op_mod_in(&[0, 1])?;
    c.reserved_zero(
        0x40,
        &[
            OTHER_VPORT,
            VPORT_NUMBER,
            TABLE_TYPE,
            root::TABLE_OF_OTHER_VPORT,
            root::TABLE_VPORT_NUMBER,
            TABLE_ID,
            root::UNDERLAY_QPN,
            root::TABLE_ESWITCH_OWNER_VHCA_ID_VALID,
            root::TABLE_ESWITCH_OWNER_VHCA_ID,
        ],
    )?;
    need_initialized(hca, c)?;
    let table_type = vport_and_type(c)?;
    if c.get(root::TABLE_OF_OTHER_VPORT) != 0
        || c.get(root::TABLE_VPORT_NUMBER) != 0
        || c.get(root::TABLE_ESWITCH_OWNER_VHCA_ID_VALID) != 0
        || c.get(root::TABLE_ESWITCH_OWNER_VHCA_ID) != 0
    {
        return Err(bad(c, reason::WRONG_FUNCTION));
    }
    // underlay_qpn is for IPoIB on an IB port (docs/reference/mlx5.md §h); the model's port is Ethernet.
    if c.get(root::UNDERLAY_QPN) != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let id = c.get(TABLE_ID);
    if c.op_mod == 0 && hca.flow.table(table_type, id).is_none() {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    let out = c.output(0x10)?;
    if c.op_mod == 0 {
        hca.flow.roots.insert(table_type, id);
    } else {
        hca.flow.roots.remove(&table_type);
    }
    Ok(out)
}
