//! Bring-up and tear-down commands (`mlx5_ifc.h`: `enable_hca_in`, `disable_hca_in`, `parse_query_issi`,
//! `set_issi_in`, `query_pages_in/out`, `manage_pages_in/out`, `query_hca_cap_in/out`, `set_hca_cap_in`,
//! `init_hca_in`, `teardown_hca_in/out`, `access_register_in/out`) and the capability blocks we read and
//! write (`cmd_hca_cap`, `roce_cap`). Sequence and values follow Linux `core/main.c` (docs/reference/mlx5.md §b.2).

use alloc::vec;
use alloc::vec::Vec;

use crate::command::{Command, Output};
use crate::field::{ByteArray, Field, Field64};
use crate::ifc::{CMD_HDR_LEN, put_pas};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_ACCESS_REG, MLX5_CMD_OP_DISABLE_HCA, MLX5_CMD_OP_ENABLE_HCA, MLX5_CMD_OP_INIT_HCA,
    MLX5_CMD_OP_MANAGE_PAGES, MLX5_CMD_OP_QUERY_HCA_CAP, MLX5_CMD_OP_QUERY_ISSI, MLX5_CMD_OP_QUERY_PAGES,
    MLX5_CMD_OP_SET_HCA_CAP, MLX5_CMD_OP_SET_ISSI, MLX5_CMD_OP_TEARDOWN_HCA,
};

/// `query_issi_out` is 0x70 bytes; `supported_issi_dw0` is its last dword.
pub const QUERY_ISSI_OUT_LEN: usize = 0x70;
/// `query_hca_cap_out` / `set_hca_cap_in`: 16-byte header + the 4 KiB `capability` union.
pub const HCA_CAP_CMD_LEN: usize = 0x1010;
/// Byte offset of `capability` in `query_hca_cap_out` and `set_hca_cap_in`.
pub const HCA_CAP_OFFSET: usize = 0x10;
/// `capability` union size (bits 0x8000).
pub const HCA_CAP_LEN: usize = 0x1000;
/// `cmd_hca_cap` and `roce_cap` are 0x100 bytes each (what Linux copies from `cur` into SET_HCA_CAP).
pub const CAP_STRUCT_LEN: usize = 0x100;
/// `init_hca_in` is 0x20 bytes (`sw_owner_id[4]` after the header).
pub const INIT_HCA_IN_LEN: usize = 0x20;
/// One PAS entry per 4 KiB page (`MLX5_ADAPTER_PAGE_SIZE`).
pub const MANAGE_PAGES_PAS_OFFSET: usize = 0x10;

/// `MLX5_SET_HCA_CAP_OP_MOD_*` / `enum mlx5_cap_type` (`mlx5_ifc.h:67-74`, `device.h:1228-1255`).
pub const MLX5_CAP_GENERAL: u16 = 0x0;
pub const MLX5_CAP_ETHERNET_OFFLOADS: u16 = 0x1;
pub const MLX5_CAP_ODP: u16 = 0x2;
pub const MLX5_CAP_ATOMIC: u16 = 0x3;
pub const MLX5_CAP_ROCE: u16 = 0x4;
pub const MLX5_CAP_FLOW_TABLE: u16 = 0x7;
pub const MLX5_CAP_GENERAL_2: u16 = 0x20;

/// `HCA_CAP_OPMOD_GET_MAX` / `HCA_CAP_OPMOD_GET_CUR` (`device.h:1221-1222`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapMode {
    Max = 0,
    Cur = 1,
}

/// `MLX5_TEARDOWN_HCA_IN_PROFILE_*` (`mlx5_ifc.h:4849-4851`).
pub const MLX5_TEARDOWN_HCA_IN_PROFILE_GRACEFUL_CLOSE: u16 = 0x0;
pub const MLX5_TEARDOWN_HCA_IN_PROFILE_FORCE_CLOSE: u16 = 0x1;

/// Registers reached through ACCESS_REG (`driver.h` `MLX5_REG_*`).
pub const MLX5_REG_PMTU: u16 = 0x5003;
pub const MLX5_REG_PAOS: u16 = 0x5006;
pub const MLX5_REG_HOST_ENDIANNESS: u16 = 0x7004;

/// `MLX5_REG_ACCESS_OP_WRITE` / `_READ` (the ACCESS_REG op_mod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegOp {
    Write = 0,
    Read = 1,
}

/// `enable_hca_in` / `disable_hca_in`.
const EMBEDDED_CPU_FUNCTION: Field = Field::new(0x40, 1);
/// `function_id` of `enable_hca_in`, `query_pages_out`, `manage_pages_in`.
const FUNCTION_ID: Field = Field::new(0x50, 16);
/// `query_issi_out.current_issi`, `set_issi_in.current_issi`.
const CURRENT_ISSI: Field = Field::new(0x50, 16);
const SUPPORTED_ISSI_DW0: Field = Field::new(0x360, 32);
/// `query_pages_out.num_pages`, `manage_pages_in.input_num_entries`.
const NUM_PAGES: Field = Field::new(0x60, 32);
const INPUT_NUM_ENTRIES: Field = Field::new(0x60, 32);
/// `manage_pages_out.output_num_entries`.
const OUTPUT_NUM_ENTRIES: Field = Field::new(0x40, 32);
/// `manage_pages_in.pas[]` / `manage_pages_out.pas[]`: 64-bit entries from byte 0x10.
const MANAGE_PAGES_PAS: Field64 = Field64::new(MANAGE_PAGES_PAS_OFFSET * 8);
/// `query_hca_cap_out.capability`, `set_hca_cap_in.capability`.
const CAPABILITY: ByteArray = ByteArray::new(HCA_CAP_OFFSET * 8, HCA_CAP_LEN);
/// `teardown_hca_in.profile`, `teardown_hca_out.state`.
const TEARDOWN_PROFILE: Field = Field::new(0x50, 16);
const TEARDOWN_STATE: Field = Field::new(0x7f, 1);
/// `access_register_in.register_id`, `.argument`, and the register's bytes (in and out) from byte 0x10.
const REGISTER_ID: Field = Field::new(0x50, 16);
const ARGUMENT: Field = Field::new(0x60, 32);
pub const REGISTER_DATA: ByteArray = ByteArray::tail(0x80);

/// ENABLE_HCA for our own function (`function_id` 0); `embedded_cpu_function` comes from init segment
/// 0x1fc bit 23 (Linux `mlx5_core_enable_hca`).
pub fn enable_hca(embedded_cpu_function: bool) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_ENABLE_HCA, 0, CMD_HDR_LEN, CMD_HDR_LEN);
    c.set(EMBEDDED_CPU_FUNCTION, embedded_cpu_function as u32);
    c.set(FUNCTION_ID, 0);
    c
}

/// DISABLE_HCA for our own function (`embedded_cpu_function` as ENABLE_HCA had it), the last command of a
/// teardown.
pub fn disable_hca(embedded_cpu_function: bool) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_DISABLE_HCA, 0, CMD_HDR_LEN, CMD_HDR_LEN);
    c.set(EMBEDDED_CPU_FUNCTION, embedded_cpu_function as u32);
    c
}

pub fn query_issi() -> Command {
    Command::new(MLX5_CMD_OP_QUERY_ISSI, 0, CMD_HDR_LEN, QUERY_ISSI_OUT_LEN)
}

/// `query_issi_out.current_issi` and `supported_issi_dw0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Issi {
    pub current_issi: u16,
    /// Bit n set = ISSI n supported.
    pub supported_issi_dw0: u32,
}

impl Issi {
    pub fn supports(&self, issi: u32) -> bool {
        issi < 32 && self.supported_issi_dw0 & (1 << issi) != 0
    }
}

pub fn parse_query_issi(out: &Output) -> Issi {
    Issi { current_issi: out.get(CURRENT_ISSI) as u16, supported_issi_dw0: out.get(SUPPORTED_ISSI_DW0) }
}

pub fn set_issi(issi: u16) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_SET_ISSI, 0, CMD_HDR_LEN, CMD_HDR_LEN).with("issi", issi.into());
    c.set(CURRENT_ISSI, issi.into());
    c
}

/// QUERY_PAGES op_mod (`mlx5_ifc.h:5969-5973`: `MLX5_BOOT_PAGES`, `MLX5_INIT_PAGES`, `MLX5_POST_INIT_PAGES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagesKind {
    Boot = 1,
    Init = 2,
    Regular = 3,
}

pub fn query_pages(kind: PagesKind) -> Command {
    Command::new(MLX5_CMD_OP_QUERY_PAGES, kind as u16, CMD_HDR_LEN, CMD_HDR_LEN)
}

/// What QUERY_PAGES (or a PAGE_REQUEST event) asks for: `num_pages` > 0 wants pages, < 0 returns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageDemand {
    pub function_id: u16,
    pub num_pages: i32,
}

pub fn parse_query_pages(out: &Output) -> PageDemand {
    PageDemand { function_id: out.get(FUNCTION_ID) as u16, num_pages: out.get(NUM_PAGES) as i32 }
}

/// MANAGE_PAGES op_mod (`mlx5_ifc.h:7928-7932`).
pub const MLX5_PAGES_CANT_GIVE: u16 = 0;
pub const MLX5_PAGES_GIVE: u16 = 1;
pub const MLX5_PAGES_TAKE: u16 = 2;

/// MANAGE_PAGES GIVE: hands the firmware these 4 KiB pages (device addresses, 4 KiB aligned).
pub fn manage_pages_give(function_id: u16, pages: &[u64]) -> Command {
    let n = pages.len();
    let mut c = Command::new(MLX5_CMD_OP_MANAGE_PAGES, MLX5_PAGES_GIVE, MANAGE_PAGES_PAS_OFFSET + 8 * n, CMD_HDR_LEN)
        .with("pages", n as u64);
    c.set(FUNCTION_ID, function_id.into());
    c.set(INPUT_NUM_ENTRIES, n as u32);
    put_pas(&mut c, MANAGE_PAGES_PAS, pages);
    c
}

/// MANAGE_PAGES ALLOCATION_FAIL: tells the firmware a page request cannot be satisfied.
pub fn manage_pages_cant_give(function_id: u16) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_MANAGE_PAGES, MLX5_PAGES_CANT_GIVE, CMD_HDR_LEN, CMD_HDR_LEN);
    c.set(FUNCTION_ID, function_id.into());
    c
}

/// MANAGE_PAGES TAKE: asks for up to `count` pages back; the output has room for `count` addresses.
pub fn manage_pages_take(function_id: u16, count: u32) -> Command {
    let out_len = MANAGE_PAGES_PAS_OFFSET + 8 * count as usize;
    let mut c =
        Command::new(MLX5_CMD_OP_MANAGE_PAGES, MLX5_PAGES_TAKE, CMD_HDR_LEN, out_len).with("pages", count.into());
    c.set(FUNCTION_ID, function_id.into());
    c.set(INPUT_NUM_ENTRIES, count);
    c
}

/// The pages MANAGE_PAGES TAKE returned (`output_num_entries` addresses, bounded by what the output holds).
pub fn parse_manage_pages_take(out: &Output) -> Vec<u64> {
    let n = out.get(OUTPUT_NUM_ENTRIES) as usize;
    let room = out.bytes().len().saturating_sub(MANAGE_PAGES_PAS_OFFSET) / 8;
    (0..n.min(room)).map(|i| out.get64(MANAGE_PAGES_PAS.nth(i))).collect()
}

/// QUERY_HCA_CAP for `cap_type` (`MLX5_CAP_*`): op_mod = `cap_type << 1 | mode`.
pub fn query_hca_cap(cap_type: u16, mode: CapMode) -> Command {
    Command::new(MLX5_CMD_OP_QUERY_HCA_CAP, (cap_type << 1) | mode as u16, CMD_HDR_LEN, HCA_CAP_CMD_LEN)
        .with("cap_type", cap_type.into())
}

/// The 4 KiB capability block of a QUERY_HCA_CAP output (shorter if the output was).
pub fn hca_cap_block(out: &Output) -> &[u8] {
    out.array(CAPABILITY)
}

/// SET_HCA_CAP for `cap_type` with the capability bytes `block` (at most 4 KiB; the rest stays zero).
pub fn set_hca_cap(cap_type: u16, block: &[u8]) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_SET_HCA_CAP, cap_type << 1, HCA_CAP_CMD_LEN, CMD_HDR_LEN)
        .with("cap_type", cap_type.into());
    let n = block.len().min(HCA_CAP_LEN);
    c.put(CAPABILITY, &block[..n]);
    c
}

/// INIT_HCA (no `sw_owner_id`: we do not use software steering).
pub fn init_hca() -> Command {
    Command::new(MLX5_CMD_OP_INIT_HCA, 0, INIT_HCA_IN_LEN, CMD_HDR_LEN)
}

/// TEARDOWN_HCA with `profile` (`MLX5_TEARDOWN_HCA_IN_PROFILE_*`; Linux uses graceful close).
pub fn teardown_hca(profile: u16) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_TEARDOWN_HCA, 0, CMD_HDR_LEN, CMD_HDR_LEN).with("profile", profile.into());
    c.set(TEARDOWN_PROFILE, profile.into());
    c
}

/// `teardown_hca_out.state`: 0 success, 1 fail (meaningful for FORCE_CLOSE).
pub fn parse_teardown_hca_state(out: &Output) -> u8 {
    out.get(TEARDOWN_STATE) as u8
}

/// ACCESS_REG: reads or writes register `register_id` with `argument`; `data` is the register layout
/// (its length is also the length of the register data expected back).
pub fn access_reg(op: RegOp, register_id: u16, argument: u32, data: &[u8]) -> Command {
    let len = CMD_HDR_LEN + data.len();
    let mut c = Command::new(MLX5_CMD_OP_ACCESS_REG, op as u16, len, len).with("register_id", register_id.into());
    c.set(REGISTER_ID, register_id.into());
    c.set(ARGUMENT, argument);
    c.put(REGISTER_DATA, data);
    c
}

/// The register data of an ACCESS_REG output.
pub fn access_reg_data(out: &Output) -> &[u8] {
    out.array(REGISTER_DATA)
}

/// `cmd_hca_cap` fields, offsets inside the capability block.
pub mod cmd_hca_cap {
    use crate::field::Field;
    pub const PAGE_REQUEST_DISABLE: Field = Field::new(0x006, 1);
    pub const LOG_MAX_SRQ_SZ: Field = Field::new(0x080, 8);
    pub const LOG_MAX_QP_SZ: Field = Field::new(0x088, 8);
    pub const LOG_MAX_QP: Field = Field::new(0x09b, 5);
    pub const LOG_MAX_CQ_SZ: Field = Field::new(0x0c8, 8);
    pub const LOG_MAX_CQ: Field = Field::new(0x0db, 5);
    pub const LOG_MAX_EQ_SZ: Field = Field::new(0x0e0, 8);
    pub const LOG_MAX_MKEY: Field = Field::new(0x0ea, 6);
    pub const FAST_TEARDOWN: Field = Field::new(0x0fb, 1);
    pub const LOG_MAX_EQ: Field = Field::new(0x0fc, 4);
    pub const MAX_INDIRECTION: Field = Field::new(0x100, 8);
    pub const LOG_MAX_MRW_SZ: Field = Field::new(0x109, 7);
    pub const FORCE_TEARDOWN: Field = Field::new(0x110, 1);
    /// UMR may carry a translation offset wider than 16 bits (`xlt_offset_47_16`).
    pub const UMR_EXTENDED_TRANSLATION_OFFSET: Field = Field::new(0x118, 1);
    pub const LOG_MAX_KLM_LIST_SIZE: Field = Field::new(0x11a, 6);
    pub const RELEASE_ALL_PAGES: Field = Field::new(0x145, 1);
    pub const LOG_MAX_RA_REQ_QP: Field = Field::new(0x14a, 6);
    pub const LOG_MAX_RA_RES_QP: Field = Field::new(0x15a, 6);
    pub const CACHE_LINE_128BYTE: Field = Field::new(0x164, 1);
    pub const GID_TABLE_SIZE: Field = Field::new(0x170, 16);
    pub const PKEY_TABLE_SIZE: Field = Field::new(0x190, 16);
    pub const NIC_FLOW_TABLE: Field = Field::new(0x1a6, 1);
    pub const PORT_TYPE: Field = Field::new(0x1b6, 2);
    pub const NUM_PORTS: Field = Field::new(0x1b8, 8);
    pub const LOG_MAX_MSG: Field = Field::new(0x1c3, 5);
    pub const CQE_VERSION: Field = Field::new(0x1fc, 4);
    /// UMR may not change an mkey's page size (`MLX5_MKEY_MASK_PAGE_SIZE` refused).
    pub const UMR_MODIFY_ENTITY_SIZE_DISABLED: Field = Field::new(0x207, 1);
    /// UMR may not change an mkey's atomic access bit (`MLX5_MKEY_MASK_A` refused).
    pub const UMR_MODIFY_ATOMIC_DISABLED: Field = Field::new(0x208, 1);
    /// The fence a UMR needs before later work uses the key (`MLX5_CAP_UMR_FENCE_*`).
    pub const UMR_FENCE: Field = Field::new(0x20a, 2);
    pub const CMDIF_CHECKSUM: Field = Field::new(0x210, 2);
    pub const ETH_NET_OFFLOADS: Field = Field::new(0x21c, 1);
    pub const ROCE: Field = Field::new(0x21d, 1);
    pub const ATOMIC: Field = Field::new(0x21e, 1);
    /// A UMR's translation pointer (data segment) may name the reserved lkey.
    pub const UMR_PTR_RLKY: Field = Field::new(0x230, 1);
    pub const RC: Field = Field::new(0x23f, 1);
    pub const UAR_4K: Field = Field::new(0x240, 1);
    pub const UAR_SZ: Field = Field::new(0x24a, 6);
    pub const LOG_PG_SZ: Field = Field::new(0x258, 8);
    pub const BF: Field = Field::new(0x260, 1);
    pub const LOG_BF_REG_SIZE: Field = Field::new(0x26b, 5);
    /// The largest send WQE, bytes.
    pub const MAX_WQE_SZ_SQ: Field = Field::new(0x290, 16);
    pub const LOG_MAX_TRANSPORT_DOMAIN: Field = Field::new(0x323, 5);
    pub const LOG_MAX_PD: Field = Field::new(0x32b, 5);
    pub const ROCE_RW_SUPPORTED: Field = Field::new(0x3a1, 1);
    pub const LOG_MAX_CURRENT_UC_LIST: Field = Field::new(0x3fb, 5);
    pub const LOG_UAR_PAGE_SZ: Field = Field::new(0x490, 16);
    pub const SQ_TS_FORMAT: Field = Field::new(0x440, 2);
    pub const NUM_VHCA_PORTS: Field = Field::new(0x610, 8);
    /// How many Q counters the function may allocate (ALLOC_Q_COUNTER).
    pub const MAX_QP_CNT: Field = Field::new(0x186, 10);
}

/// `roce_cap` fields, offsets inside the capability block.
pub mod roce_cap {
    use crate::field::Field;
    pub const SW_R_ROCE_SRC_UDP_PORT: Field = Field::new(0x004, 1);
    pub const QP_OOO_TRANSMIT_DEFAULT: Field = Field::new(0x008, 1);
    pub const QP_TS_FORMAT: Field = Field::new(0x01e, 2);
    pub const L3_TYPE: Field = Field::new(0x08c, 4);
    pub const ROCE_VERSION: Field = Field::new(0x098, 8);
    pub const R_ROCE_DEST_UDP_PORT: Field = Field::new(0x0b0, 16);
    pub const R_ROCE_MAX_SRC_UDP_PORT: Field = Field::new(0x0c0, 16);
    pub const R_ROCE_MIN_SRC_UDP_PORT: Field = Field::new(0x0d0, 16);
    pub const ROCE_ADDRESS_TABLE_SIZE: Field = Field::new(0x0f0, 16);
}

/// `atomic_caps` fields, offsets inside the capability block.
pub mod atomic_caps {
    use crate::field::Field;
    /// Settable: the byte order of 8-byte atomic responses to this requester (`MLX5_ATOMIC_REQ_MODE_*`).
    pub const ATOMIC_REQ_8B_ENDIANNESS_MODE: Field = Field::new(0x040, 2);
    /// The HCA can answer this requester's 8-byte atomics in host byte order.
    pub const SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1: Field = Field::new(0x046, 1);
    pub const ATOMIC_OPERATIONS: Field = Field::new(0x090, 16);
    pub const ATOMIC_SIZE_QP: Field = Field::new(0x0b0, 16);
}

/// `atomic_operations` bits (`driver.h` `MLX5_ATOMIC_OPS_*`).
pub const MLX5_ATOMIC_OPS_CMP_SWAP: u16 = 1 << 0;
pub const MLX5_ATOMIC_OPS_FETCH_ADD: u16 = 1 << 1;
pub const MLX5_ATOMIC_OPS_EXTENDED_CMP_SWAP: u16 = 1 << 2;
pub const MLX5_ATOMIC_OPS_EXTENDED_FETCH_ADD: u16 = 1 << 3;

/// `MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS` (Linux `core/main.c`): 8-byte atomic responses in host byte order;
/// 0 (`MLX5_ATOMIC_REQ_MODE_BE`) is big-endian.
pub const MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS: u8 = 1;

/// The `atomic_caps` fields (cap type 3) the QP's atomic mode and bring-up's ATOMIC SET_HCA_CAP come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicCaps {
    /// `MLX5_ATOMIC_OPS_*` bits.
    pub atomic_operations: u16,
    /// Bit mask of the operand sizes a QP supports (bit n: 2^n bytes; `MLX5_ATOMIC_CAPS_ATOMIC_SIZE_QP_*`).
    pub atomic_size_qp: u16,
    /// `supported_atomic_req_8B_endianness_mode_1`: host-endian 8-byte atomic responses can be asked for.
    pub supported_req_8b_host_endianness: bool,
    /// `atomic_req_8B_endianness_mode` in force (`MLX5_ATOMIC_REQ_MODE_*`).
    pub req_8b_endianness_mode: u8,
}

impl AtomicCaps {
    /// Parses an `atomic_caps` block ([`hca_cap_block`] of a QUERY_HCA_CAP ATOMIC output).
    pub fn parse(block: &[u8]) -> AtomicCaps {
        AtomicCaps {
            atomic_operations: cap(block, atomic_caps::ATOMIC_OPERATIONS) as u16,
            atomic_size_qp: cap(block, atomic_caps::ATOMIC_SIZE_QP) as u16,
            supported_req_8b_host_endianness: cap(block, atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1) != 0,
            req_8b_endianness_mode: cap(block, atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE) as u8,
        }
    }
}

/// The ATOMIC block bring-up sets, as Linux `handle_hca_cap_atomic` builds it: only when the general caps
/// say `atomic` and the HCA offers host-endian 8-byte atomic responses
/// (`supported_atomic_req_8B_endianness_mode_1`); a zeroed `atomic_caps` with `atomic_req_8B_endianness_mode`
/// = [`MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS`] (Linux clears the input between its SET_HCA_CAP calls).
pub fn atomic_caps_to_set(general_atomic: bool, cur: &AtomicCaps) -> Option<Vec<u8>> {
    if !general_atomic || !cur.supported_req_8b_host_endianness {
        return None;
    }
    let mut b = vec![0u8; CAP_STRUCT_LEN];
    atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE.write(&mut b, MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS.into());
    Some(b)
}

/// A capability field; 0 where the block the device returned ends first.
fn cap(block: &[u8], f: Field) -> u32 {
    f.read(block)
}

/// The `cmd_hca_cap` (general device) fields the driver uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GeneralCaps {
    pub page_request_disable: bool,
    pub log_max_srq_sz: u8,
    pub log_max_qp_sz: u8,
    pub log_max_qp: u8,
    pub log_max_cq_sz: u8,
    pub log_max_cq: u8,
    pub log_max_eq_sz: u8,
    pub log_max_mkey: u8,
    pub fast_teardown: bool,
    pub log_max_eq: u8,
    pub max_indirection: u8,
    pub log_max_mrw_sz: u8,
    pub force_teardown: bool,
    pub umr_extended_translation_offset: bool,
    pub log_max_klm_list_size: u8,
    pub release_all_pages: bool,
    pub log_max_ra_req_qp: u8,
    pub log_max_ra_res_qp: u8,
    pub cache_line_128byte: bool,
    pub gid_table_size: u16,
    /// Encoded: 0 = 128 entries, 1 = 256, … (Linux `to_fw_pkey_sz`).
    pub pkey_table_size: u16,
    pub nic_flow_table: bool,
    /// 0 IB, 1 Ethernet.
    pub port_type: u8,
    pub num_ports: u8,
    pub log_max_msg: u8,
    pub cqe_version: u8,
    pub umr_modify_entity_size_disabled: bool,
    pub umr_modify_atomic_disabled: bool,
    /// `MLX5_CAP_UMR_FENCE_*`: 0 strong, 1 small, 2 none.
    pub umr_fence: u8,
    pub cmdif_checksum: u8,
    pub eth_net_offloads: bool,
    pub roce: bool,
    pub atomic: bool,
    pub umr_ptr_rlky: bool,
    pub rc: bool,
    pub uar_4k: bool,
    pub uar_sz: u8,
    pub log_pg_sz: u8,
    pub bf: bool,
    pub log_bf_reg_size: u8,
    /// Bytes; 0 when the block does not say.
    pub max_wqe_sz_sq: u16,
    pub log_max_transport_domain: u8,
    pub log_max_pd: u8,
    pub roce_rw_supported: bool,
    pub log_max_current_uc_list: u8,
    pub log_uar_page_sz: u16,
    /// Timestamp formats an SQ supports (`MLX5_TIMESTAMP_FORMAT_CAP_*`: 0 free running, 1 real time, 2 both).
    pub sq_ts_format: u8,
    pub num_vhca_ports: u8,
    /// Q counters the function may allocate (0: none).
    pub max_qp_cnt: u16,
}

impl GeneralCaps {
    /// Parses a `cmd_hca_cap` block ([`hca_cap_block`] of a QUERY_HCA_CAP GENERAL output).
    pub fn parse(block: &[u8]) -> GeneralCaps {
        use cmd_hca_cap as f;
        let b = |x| cap(block, x) != 0;
        let u8_ = |x| cap(block, x) as u8;
        let u16_ = |x| cap(block, x) as u16;
        GeneralCaps {
            page_request_disable: b(f::PAGE_REQUEST_DISABLE),
            log_max_srq_sz: u8_(f::LOG_MAX_SRQ_SZ),
            log_max_qp_sz: u8_(f::LOG_MAX_QP_SZ),
            log_max_qp: u8_(f::LOG_MAX_QP),
            log_max_cq_sz: u8_(f::LOG_MAX_CQ_SZ),
            log_max_cq: u8_(f::LOG_MAX_CQ),
            log_max_eq_sz: u8_(f::LOG_MAX_EQ_SZ),
            log_max_mkey: u8_(f::LOG_MAX_MKEY),
            fast_teardown: b(f::FAST_TEARDOWN),
            log_max_eq: u8_(f::LOG_MAX_EQ),
            max_indirection: u8_(f::MAX_INDIRECTION),
            log_max_mrw_sz: u8_(f::LOG_MAX_MRW_SZ),
            force_teardown: b(f::FORCE_TEARDOWN),
            umr_extended_translation_offset: b(f::UMR_EXTENDED_TRANSLATION_OFFSET),
            log_max_klm_list_size: u8_(f::LOG_MAX_KLM_LIST_SIZE),
            release_all_pages: b(f::RELEASE_ALL_PAGES),
            log_max_ra_req_qp: u8_(f::LOG_MAX_RA_REQ_QP),
            log_max_ra_res_qp: u8_(f::LOG_MAX_RA_RES_QP),
            cache_line_128byte: b(f::CACHE_LINE_128BYTE),
            gid_table_size: u16_(f::GID_TABLE_SIZE),
            pkey_table_size: u16_(f::PKEY_TABLE_SIZE),
            nic_flow_table: b(f::NIC_FLOW_TABLE),
            port_type: u8_(f::PORT_TYPE),
            num_ports: u8_(f::NUM_PORTS),
            log_max_msg: u8_(f::LOG_MAX_MSG),
            cqe_version: u8_(f::CQE_VERSION),
            umr_modify_entity_size_disabled: b(f::UMR_MODIFY_ENTITY_SIZE_DISABLED),
            umr_modify_atomic_disabled: b(f::UMR_MODIFY_ATOMIC_DISABLED),
            umr_fence: u8_(f::UMR_FENCE),
            cmdif_checksum: u8_(f::CMDIF_CHECKSUM),
            eth_net_offloads: b(f::ETH_NET_OFFLOADS),
            roce: b(f::ROCE),
            atomic: b(f::ATOMIC),
            umr_ptr_rlky: b(f::UMR_PTR_RLKY),
            rc: b(f::RC),
            uar_4k: b(f::UAR_4K),
            uar_sz: u8_(f::UAR_SZ),
            log_pg_sz: u8_(f::LOG_PG_SZ),
            bf: b(f::BF),
            log_bf_reg_size: u8_(f::LOG_BF_REG_SIZE),
            max_wqe_sz_sq: u16_(f::MAX_WQE_SZ_SQ),
            log_max_transport_domain: u8_(f::LOG_MAX_TRANSPORT_DOMAIN),
            log_max_pd: u8_(f::LOG_MAX_PD),
            roce_rw_supported: b(f::ROCE_RW_SUPPORTED),
            log_max_current_uc_list: u8_(f::LOG_MAX_CURRENT_UC_LIST),
            log_uar_page_sz: u16_(f::LOG_UAR_PAGE_SZ),
            sq_ts_format: u8_(f::SQ_TS_FORMAT),
            num_vhca_ports: u8_(f::NUM_VHCA_PORTS),
            max_qp_cnt: u16_(f::MAX_QP_CNT),
        }
    }
}

/// Linux's cap on `log_max_qp` for the default profile (`core/main.c` `handle_hca_cap`: min(18, max)).
pub const PROFILE_LOG_MAX_QP: u8 = 18;

/// The `cmd_hca_cap` block to send with SET_HCA_CAP GENERAL, made as Linux `handle_hca_cap` makes it: a
/// copy of the current block's 0x100 bytes with `pkey_table_size` = 128 entries (0), `log_max_qp` =
/// min(18, max), `cmdif_checksum` = 0, `log_uar_page_sz` = 0 (4 KiB pages; `uar_4k` is left alone as
/// Linux does with 4 KiB pages), `cache_line_128byte` = 0 (x86 lines are 64 bytes) when the max allows the
/// bit, `release_all_pages` = 1 and `roce` = 1 when the max allows them (`roce` only if
/// `roce_rw_supported`). Linux's optional bits we do not use (dct, pci_sync_*, num_vhca_ports,
/// mkey_by_name, vhca state events, dynamic MSI-X) are not set.
pub fn general_caps_to_set(cur_block: &[u8], max: &GeneralCaps) -> Vec<u8> {
    use cmd_hca_cap as f;
    let mut b = vec![0u8; CAP_STRUCT_LEN];
    let n = cur_block.len().min(CAP_STRUCT_LEN);
    b[..n].copy_from_slice(&cur_block[..n]);
    let cur = GeneralCaps::parse(&b);
    f::PKEY_TABLE_SIZE.write(&mut b, 0);
    f::LOG_MAX_QP.write(&mut b, max.log_max_qp.min(PROFILE_LOG_MAX_QP).into());
    f::CMDIF_CHECKSUM.write(&mut b, 0);
    f::LOG_UAR_PAGE_SZ.write(&mut b, 0);
    if max.cache_line_128byte {
        f::CACHE_LINE_128BYTE.write(&mut b, 0);
    }
    if max.release_all_pages {
        f::RELEASE_ALL_PAGES.write(&mut b, 1);
    }
    if cur.roce_rw_supported && max.roce {
        f::ROCE.write(&mut b, 1);
    }
    b
}

/// SET_HCA_CAP GENERAL from the QUERY_HCA_CAP GENERAL outputs (current, max): [`general_caps_to_set`].
pub fn set_general_caps(cur: &Output, max: &Output) -> Command {
    let max = GeneralCaps::parse(hca_cap_block(max));
    set_hca_cap(MLX5_CAP_GENERAL, &general_caps_to_set(hca_cap_block(cur), &max))
}

/// ACCESS_REG write of HOST_ENDIANNESS (`host_endianness_reg`, 16 bytes): `he` (byte 0 bit 7) = 0 for a
/// little-endian host (Linux `mlx5_set_host_endianness`, PF only).
pub fn host_endianness_le() -> Command {
    access_reg(RegOp::Write, MLX5_REG_HOST_ENDIANNESS, 0, &[0u8; 16])
}

/// The `roce_cap` fields (cap type 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceCaps {
    pub sw_r_roce_src_udp_port: bool,
    pub qp_ooo_transmit_default: bool,
    pub qp_ts_format: u8,
    /// Bit mask: `MLX5_ROCE_L3_TYPE_IPV4_CAP` (1 << 1), `_IPV6_CAP` (1 << 2).
    pub l3_type: u8,
    /// Bit mask: bit 0 RoCE v1, bit 2 RoCE v2 (`MLX5_ROCE_VERSION_*_CAP`).
    pub roce_version: u8,
    pub r_roce_dest_udp_port: u16,
    pub r_roce_max_src_udp_port: u16,
    pub r_roce_min_src_udp_port: u16,
    pub roce_address_table_size: u16,
}

impl RoceCaps {
    /// Parses a `roce_cap` block ([`hca_cap_block`] of a QUERY_HCA_CAP ROCE output).
    pub fn parse(block: &[u8]) -> RoceCaps {
        use roce_cap as f;
        RoceCaps {
            sw_r_roce_src_udp_port: cap(block, f::SW_R_ROCE_SRC_UDP_PORT) != 0,
            qp_ooo_transmit_default: cap(block, f::QP_OOO_TRANSMIT_DEFAULT) != 0,
            qp_ts_format: cap(block, f::QP_TS_FORMAT) as u8,
            l3_type: cap(block, f::L3_TYPE) as u8,
            roce_version: cap(block, f::ROCE_VERSION) as u8,
            r_roce_dest_udp_port: cap(block, f::R_ROCE_DEST_UDP_PORT) as u16,
            r_roce_max_src_udp_port: cap(block, f::R_ROCE_MAX_SRC_UDP_PORT) as u16,
            r_roce_min_src_udp_port: cap(block, f::R_ROCE_MIN_SRC_UDP_PORT) as u16,
            roce_address_table_size: cap(block, f::ROCE_ADDRESS_TABLE_SIZE) as u16,
        }
    }

    pub fn supports_roce_v2(&self) -> bool {
        self.roce_version & (1 << 2) != 0
    }
}

/// The `roce_cap` block for SET_HCA_CAP ROCE, or `None` when nothing needs changing — Linux
/// `handle_hca_cap_roce`: only if `sw_r_roce_src_udp_port` is off now and the max allows it; then also
/// `qp_ooo_transmit_default` if the max allows it.
pub fn roce_caps_to_set(cur_block: &[u8], max: &RoceCaps) -> Option<Vec<u8>> {
    use roce_cap as f;
    let mut b = vec![0u8; CAP_STRUCT_LEN];
    let n = cur_block.len().min(CAP_STRUCT_LEN);
    b[..n].copy_from_slice(&cur_block[..n]);
    if RoceCaps::parse(&b).sw_r_roce_src_udp_port || !max.sw_r_roce_src_udp_port {
        return None;
    }
    f::SW_R_ROCE_SRC_UDP_PORT.write(&mut b, 1);
    if max.qp_ooo_transmit_default {
        f::QP_OOO_TRANSMIT_DEFAULT.write(&mut b, 1);
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64, out};

    #[test]
    fn enable_disable_hca() {
        let c = enable_hca(true);
        assert_eq!(c.input().len(), 0x10);
        assert_eq!(be16(c.input(), 0), 0x104);
        // embedded_cpu_function = dword 2 bit 31; function_id = bytes 0xa..0xc.
        assert_eq!(c.input()[8], 0x80);
        assert_eq!(be16(c.input(), 0xa), 0);
        assert_eq!(c.out_len(), 0x10);
        let d = disable_hca(false);
        assert_eq!(be16(d.input(), 0), 0x105);
        assert_eq!(&d.input()[4..], &[0u8; 12]);
    }

    #[test]
    fn issi() {
        let c = query_issi();
        assert_eq!((be16(c.input(), 0), c.out_len()), (0x10a, 0x70));
        let o = out(0x70, &[(0x0a, &[0, 1]), (0x6c, &[0, 0, 0, 3])]);
        let i = parse_query_issi(&o);
        assert_eq!(i, Issi { current_issi: 1, supported_issi_dw0: 3 });
        assert!(i.supports(1) && i.supports(0) && !i.supports(2));
        let s = set_issi(1);
        assert_eq!(be16(s.input(), 0), 0x10b);
        assert_eq!(be16(s.input(), 0xa), 1);
    }

    #[test]
    fn pages() {
        let q = query_pages(PagesKind::Init);
        assert_eq!(be16(q.input(), 0), 0x107);
        assert_eq!(be16(q.input(), 6), 2);
        let o = out(0x10, &[(0x0a, &[0x12, 0x34]), (0x0c, &(-5i32).to_be_bytes())]);
        assert_eq!(parse_query_pages(&o), PageDemand { function_id: 0x1234, num_pages: -5 });

        let g = manage_pages_give(0, &[0x1000, 0xabcd_e000]);
        assert_eq!(g.input().len(), 0x20);
        assert_eq!(be16(g.input(), 6), 1);
        assert_eq!(be32(g.input(), 0xc), 2);
        assert_eq!(be64(g.input(), 0x10), 0x1000);
        assert_eq!(be64(g.input(), 0x18), 0xabcd_e000);
        assert_eq!(g.attrs().get("pages"), Some(2));

        let t = manage_pages_take(7, 3);
        assert_eq!(be16(t.input(), 6), 2);
        assert_eq!(be16(t.input(), 0xa), 7);
        assert_eq!(be32(t.input(), 0xc), 3);
        assert_eq!(t.out_len(), 0x10 + 24);
        let o = out(0x28, &[(0x08, &[0, 0, 0, 2]), (0x10, &0x5000u64.to_be_bytes()), (0x18, &0x9000u64.to_be_bytes())]);
        assert_eq!(parse_manage_pages_take(&o), vec![0x5000, 0x9000]);
        // A count larger than the output holds is clamped.
        let o = out(0x18, &[(0x08, &[0, 0, 0, 9]), (0x10, &0x5000u64.to_be_bytes())]);
        assert_eq!(parse_manage_pages_take(&o), vec![0x5000]);

        let f = manage_pages_cant_give(0);
        assert_eq!(be16(f.input(), 6), 0);
    }

    #[test]
    fn caps_commands() {
        let q = query_hca_cap(MLX5_CAP_ROCE, CapMode::Cur);
        assert_eq!(be16(q.input(), 0), 0x100);
        assert_eq!(be16(q.input(), 6), 9);
        assert_eq!(q.out_len(), 0x1010);
        let q = query_hca_cap(MLX5_CAP_GENERAL, CapMode::Max);
        assert_eq!(be16(q.input(), 6), 0);
        let s = set_hca_cap(MLX5_CAP_ROCE, &[0xaa, 0xbb]);
        assert_eq!(s.input().len(), 0x1010);
        assert_eq!(be16(s.input(), 0), 0x109);
        assert_eq!(be16(s.input(), 6), 8);
        assert_eq!(&s.input()[0x10..0x12], &[0xaa, 0xbb]);
        let i = init_hca();
        assert_eq!((be16(i.input(), 0), i.input().len()), (0x102, 0x20));
        assert_eq!(be16(teardown_hca(MLX5_TEARDOWN_HCA_IN_PROFILE_GRACEFUL_CLOSE).input(), 0xa), 0);
        let t = teardown_hca(MLX5_TEARDOWN_HCA_IN_PROFILE_FORCE_CLOSE);
        assert_eq!(be16(t.input(), 0), 0x103);
        assert_eq!(be16(t.input(), 0xa), 1);
        assert_eq!(parse_teardown_hca_state(&out(0x10, &[(0x0f, &[1])])), 1);
    }

    #[test]
    fn access_register() {
        let c = access_reg(RegOp::Read, MLX5_REG_PAOS, 0, &[0, 1, 0, 0]);
        assert_eq!(be16(c.input(), 0), 0x805);
        assert_eq!(be16(c.input(), 6), 1);
        assert_eq!(be16(c.input(), 0xa), 0x5006);
        assert_eq!(&c.input()[0x10..], &[0, 1, 0, 0]);
        assert_eq!(c.out_len(), 0x14);
        assert_eq!(access_reg_data(&out(0x14, &[(0x10, &[1, 2, 3, 4])])), &[1, 2, 3, 4]);
    }

    /// A general cap block with hand-placed values (byte positions from the layout: bit / 8).
    fn general_block() -> Vec<u8> {
        let mut b = vec![0u8; 0x100];
        b[0x11] = 0x11; // log_max_qp_sz (bit 0x88)
        b[0x13] = 0x18; // log_max_qp = 24 (bits 0x9b..0xa0: low 5 bits of byte 0x13)
        b[0x19] = 0x16; // log_max_cq_sz
        b[0x1b] = 0x18; // log_max_cq
        b[0x1c] = 0x16; // log_max_eq_sz
        b[0x1d] = 0x18; // log_max_mkey (bit 0xea w6: low 6 bits of byte 0x1d)
        b[0x1f] = 0x4; // log_max_eq (low 4 bits of byte 0x1f)
        b[0x21] = 0x40; // log_max_mrw_sz (bit 0x109 w7)
        b[0x2c] = 0x08; // cache_line_128byte (bit 0x164 = byte 0x2c bit 3)
        b[0x32..0x34].copy_from_slice(&[0, 2]); // pkey_table_size
        b[0x34] = 0x02; // nic_flow_table (bit 0x1a6 = byte 0x34 bit 1)
        b[0x36] = 0x01; // port_type = 1 (bits 0x1b6..0x1b8 = byte 0x36 bits 1:0)
        b[0x37] = 1; // num_ports
        b[0x38] = 0x1e; // log_max_msg (bit 0x1c3 w5)
        b[0x42] = 0xc0; // cmdif_checksum = 3 (bits 0x210..0x212)
        b[0x43] = 0x06; // roce (bit 0x21d = byte 0x43 bit 2), atomic (bit 1)
        b[0x48] = 0x80; // uar_4k
        b[0x4b] = 0x1e; // log_pg_sz
        b[0x65] = 0x18; // log_max_pd (bit 0x32b w5)
        b[0x74] = 0x40; // roce_rw_supported (bit 0x3a1 = byte 0x74 bit 6)
        b[0x92..0x94].copy_from_slice(&[0, 3]); // log_uar_page_sz
        b
    }

    #[test]
    fn general_caps_parse_and_set() {
        let blk = general_block();
        let g = GeneralCaps::parse(&blk);
        assert_eq!(g.log_max_qp_sz, 0x11);
        assert_eq!(g.log_max_qp, 24);
        assert_eq!((g.log_max_cq_sz, g.log_max_cq, g.log_max_eq_sz, g.log_max_mkey, g.log_max_eq), (22, 24, 22, 24, 4));
        assert_eq!(g.log_max_mrw_sz, 0x40);
        assert!(g.cache_line_128byte && g.nic_flow_table && g.roce && g.atomic && g.uar_4k && g.roce_rw_supported);
        assert_eq!((g.pkey_table_size, g.port_type, g.num_ports, g.log_max_msg), (2, 1, 1, 0x1e));
        assert_eq!((g.cmdif_checksum, g.log_pg_sz, g.log_max_pd, g.log_uar_page_sz), (3, 0x1e, 0x18, 3));

        let set = general_caps_to_set(&blk, &g);
        assert_eq!(set.len(), 0x100);
        assert_eq!(set[0x13] & 0x1f, 18);
        assert_eq!(&set[0x32..0x34], &[0, 0]);
        assert_eq!(set[0x42] & 0xc0, 0);
        assert_eq!(&set[0x92..0x94], &[0, 0]);
        assert_eq!(set[0x2c] & 0x08, 0);
        assert_eq!(set[0x43] & 0x04, 0x04);
        // Untouched fields survive the copy.
        assert_eq!(set[0x37], 1);
        assert_eq!(set[0x48], 0x80);
        // A smaller max keeps its own log_max_qp.
        let small = GeneralCaps { log_max_qp: 10, ..g };
        assert_eq!(general_caps_to_set(&blk, &small)[0x13] & 0x1f, 10);
    }

    #[test]
    fn umr_caps_parse() {
        // Byte positions from the layout (bit / 8, bit 7 of a byte being its first bit).
        let mut b = vec![0u8; 0x100];
        assert_eq!(
            {
                let g = GeneralCaps::parse(&b);
                (g.umr_modify_entity_size_disabled, g.umr_modify_atomic_disabled, g.umr_fence, g.umr_ptr_rlky)
            },
            (false, false, 0, false)
        );
        b[0x23] = 0x80; // umr_extended_translation_offset: bit 0x118 = byte 0x23, mask 0x80
        b[0x40] = 0x01; // umr_modify_entity_size_disabled: bit 0x207 = byte 0x40, mask 0x01
        b[0x41] = 0x80 | 0x10; // umr_modify_atomic_disabled bit 0x208 (0x80); umr_fence bits 0x20a..0x20c = 0b01 (0x10)
        b[0x46] = 0x80; // umr_ptr_rlky: bit 0x230 = byte 0x46, mask 0x80
        b[0x52..0x54].copy_from_slice(&0x0400u16.to_be_bytes()); // max_wqe_sz_sq: bits 0x290..0x2a0
        let g = GeneralCaps::parse(&b);
        assert!(g.umr_extended_translation_offset && g.umr_modify_entity_size_disabled);
        assert!(g.umr_modify_atomic_disabled && g.umr_ptr_rlky);
        assert_eq!((g.umr_fence, g.max_wqe_sz_sq), (1, 0x400));
        // Neighbours stay untouched: log_max_klm_list_size (0x11a w6), cqe_version (0x1fc w4), rc (0x23f).
        assert_eq!((g.log_max_klm_list_size, g.cqe_version, g.rc), (0, 0, false));
        b[0x41] = 0x20; // umr_fence = 0b10 (none)
        assert_eq!(GeneralCaps::parse(&b).umr_fence, 2);
        assert!(!GeneralCaps::parse(&b).umr_modify_atomic_disabled);
    }

    #[test]
    fn roce_caps() {
        let mut b = vec![0u8; 0x100];
        b[0x11] = 0x06; // l3_type (bit 0x8c w4: low nibble of byte 0x11)
        b[0x13] = 0x05; // roce_version
        b[0x16..0x18].copy_from_slice(&4791u16.to_be_bytes());
        b[0x18..0x1a].copy_from_slice(&0xffffu16.to_be_bytes());
        b[0x1a..0x1c].copy_from_slice(&0xc000u16.to_be_bytes());
        b[0x1e..0x20].copy_from_slice(&256u16.to_be_bytes());
        let r = RoceCaps::parse(&b);
        assert_eq!((r.l3_type, r.roce_version, r.r_roce_dest_udp_port), (6, 5, 4791));
        assert_eq!(
            (r.r_roce_max_src_udp_port, r.r_roce_min_src_udp_port, r.roce_address_table_size),
            (0xffff, 0xc000, 256)
        );
        assert!(r.supports_roce_v2() && !r.sw_r_roce_src_udp_port);
        let max = RoceCaps { sw_r_roce_src_udp_port: true, qp_ooo_transmit_default: true, ..r };
        let s = roce_caps_to_set(&b, &max).unwrap();
        // sw_r_roce_src_udp_port = byte 0 bit 3; qp_ooo_transmit_default = byte 1 bit 7.
        assert_eq!((s[0], s[1]), (0x08, 0x80));
        assert_eq!(s[0x13], 5);
        assert!(roce_caps_to_set(&s, &max).is_none());
        assert!(roce_caps_to_set(&b, &r).is_none());
    }

    #[test]
    fn atomic_endianness_is_set_only_where_offered() {
        // supported_atomic_req_8B_endianness_mode_1 is bit 0x46 (byte 8, bit 1 of that byte from the LSB).
        let mut blk = vec![0u8; CAP_STRUCT_LEN];
        blk[8] = 0x02;
        blk[0x12..0x14].copy_from_slice(&0x000fu16.to_be_bytes());
        let a = AtomicCaps::parse(&blk);
        assert!(a.supported_req_8b_host_endianness);
        assert_eq!((a.req_8b_endianness_mode, a.atomic_operations), (0, 0xf));
        let set = atomic_caps_to_set(true, &a).unwrap();
        assert_eq!(set.len(), CAP_STRUCT_LEN);
        // atomic_req_8B_endianness_mode: bits 0x40..0x42 = the top two bits of byte 8, value 1.
        assert_eq!(set[8], 0x40);
        assert!(set.iter().enumerate().all(|(i, &b)| i == 8 || b == 0), "everything else zero, as Linux");
        assert_eq!(AtomicCaps::parse(&set).req_8b_endianness_mode, MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS);
        assert!(atomic_caps_to_set(false, &a).is_none(), "no atomics in the general caps");
        assert!(atomic_caps_to_set(true, &AtomicCaps::default()).is_none(), "not offered");
    }
}
