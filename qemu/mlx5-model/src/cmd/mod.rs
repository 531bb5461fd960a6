//! Command execution: the output header (`status`, `syndrome`; docs/reference/mlx5.md §c.6), the status codes, and the
//! dispatch from opcode to the handlers, one file per concept. Every handler validates its input before it
//! changes any state: length (`BAD_INP_LEN`), op_mod and reserved fields (`BAD_PARAM`), device and object
//! state (`BAD_SYS_STATE`, `BAD_RES_STATE`), limits (`NO_RES`).
//!
//! Syndromes are the model's own (real firmware's are undocumented debug codes): `opcode << 16 | reason`, the
//! reasons listed in `reason` below, so a failing command names its opcode and cause in the trace.

mod caps;
mod cq;
mod eq;
mod eth;
mod flow;
mod init;
pub(crate) mod mkey;
mod pages;
mod qp;
mod reg;
mod resources;
mod vport;

use crate::hca::Hca;
use crate::ifc::{self, Field, hdr};
use crate::mem::Memory;

/// Command status (`device.h:1474-1492`).
pub mod status {
    pub const OK: u8 = 0x00;
    pub const INT_ERR: u8 = 0x01;
    pub const BAD_OP: u8 = 0x02;
    pub const BAD_PARAM: u8 = 0x03;
    pub const BAD_SYS_STATE: u8 = 0x04;
    pub const BAD_RES: u8 = 0x05;
    pub const RES_BUSY: u8 = 0x06;
    pub const NOT_READY: u8 = 0x07;
    pub const LIM_ERR: u8 = 0x08;
    pub const BAD_RES_STATE: u8 = 0x09;
    pub const BAD_INDEX: u8 = 0x0a;
    pub const NO_RES: u8 = 0x0f;
    pub const BAD_QP_STATE: u8 = 0x10;
    pub const BAD_INP_LEN: u8 = 0x50;
    pub const BAD_OUTP_LEN: u8 = 0x51;
}

/// Opcodes (`mlx5_ifc.h:119-320`).
pub mod opcode {
    pub const QUERY_HCA_CAP: u16 = 0x100;
    pub const QUERY_ADAPTER: u16 = 0x101;
    pub const INIT_HCA: u16 = 0x102;
    pub const TEARDOWN_HCA: u16 = 0x103;
    pub const ENABLE_HCA: u16 = 0x104;
    pub const DISABLE_HCA: u16 = 0x105;
    pub const QUERY_PAGES: u16 = 0x107;
    pub const MANAGE_PAGES: u16 = 0x108;
    pub const SET_HCA_CAP: u16 = 0x109;
    pub const QUERY_ISSI: u16 = 0x10a;
    pub const SET_ISSI: u16 = 0x10b;
    pub const QUERY_SPECIAL_CONTEXTS: u16 = 0x203;
    pub const CREATE_TIR: u16 = 0x900;
    pub const DESTROY_TIR: u16 = 0x902;
    pub const CREATE_SQ: u16 = 0x904;
    pub const MODIFY_SQ: u16 = 0x905;
    pub const DESTROY_SQ: u16 = 0x906;
    pub const QUERY_SQ: u16 = 0x907;
    pub const CREATE_RQ: u16 = 0x908;
    pub const MODIFY_RQ: u16 = 0x909;
    pub const DESTROY_RQ: u16 = 0x90a;
    pub const QUERY_RQ: u16 = 0x90b;
    pub const CREATE_TIS: u16 = 0x912;
    pub const DESTROY_TIS: u16 = 0x914;
    pub const CREATE_MKEY: u16 = 0x200;
    pub const QUERY_MKEY: u16 = 0x201;
    pub const DESTROY_MKEY: u16 = 0x202;
    pub const CREATE_EQ: u16 = 0x301;
    pub const DESTROY_EQ: u16 = 0x302;
    pub const QUERY_EQ: u16 = 0x303;
    pub const CREATE_CQ: u16 = 0x400;
    pub const DESTROY_CQ: u16 = 0x401;
    pub const CREATE_QP: u16 = 0x500;
    pub const DESTROY_QP: u16 = 0x501;
    pub const RST2INIT_QP: u16 = 0x502;
    pub const INIT2RTR_QP: u16 = 0x503;
    pub const RTR2RTS_QP: u16 = 0x504;
    pub const RTS2RTS_QP: u16 = 0x505;
    pub const QP_2ERR: u16 = 0x507;
    pub const QP_2RST: u16 = 0x50a;
    pub const QUERY_QP: u16 = 0x50b;
    pub const ALLOC_PD: u16 = 0x800;
    pub const DEALLOC_PD: u16 = 0x801;
    pub const ALLOC_UAR: u16 = 0x802;
    pub const DEALLOC_UAR: u16 = 0x803;
    pub const ALLOC_TRANSPORT_DOMAIN: u16 = 0x816;
    pub const DEALLOC_TRANSPORT_DOMAIN: u16 = 0x817;
    pub const ALLOC_Q_COUNTER: u16 = 0x771;
    pub const DEALLOC_Q_COUNTER: u16 = 0x772;
    pub const QUERY_Q_COUNTER: u16 = 0x773;
    pub const QUERY_VPORT_STATE: u16 = 0x750;
    pub const QUERY_NIC_VPORT_CONTEXT: u16 = 0x754;
    pub const MODIFY_NIC_VPORT_CONTEXT: u16 = 0x755;
    pub const QUERY_ROCE_ADDRESS: u16 = 0x760;
    pub const SET_ROCE_ADDRESS: u16 = 0x761;
    pub const QUERY_HCA_VPORT_GID: u16 = 0x764;
    pub const ACCESS_REG: u16 = 0x805;
    pub const SET_FLOW_TABLE_ROOT: u16 = 0x92f;
    pub const CREATE_FLOW_TABLE: u16 = 0x930;
    pub const DESTROY_FLOW_TABLE: u16 = 0x931;
    pub const CREATE_FLOW_GROUP: u16 = 0x933;
    pub const DESTROY_FLOW_GROUP: u16 = 0x934;
    pub const SET_FLOW_TABLE_ENTRY: u16 = 0x936;
    pub const DELETE_FLOW_TABLE_ENTRY: u16 = 0x938;
}

/// Syndrome reasons (low 16 bits of the syndrome).
pub mod reason {
    pub const INPUT_TOO_SHORT: u16 = 0x01;
    pub const OUTPUT_TOO_SHORT: u16 = 0x02;
    pub const BAD_OP_MOD: u16 = 0x03;
    pub const RESERVED_NOT_ZERO: u16 = 0x04;
    pub const UID_NOT_SUPPORTED: u16 = 0x05;
    pub const WRONG_FUNCTION: u16 = 0x06;
    pub const NOT_ENABLED: u16 = 0x07;
    pub const ALREADY_ENABLED: u16 = 0x08;
    pub const NOT_INITIALIZED: u16 = 0x09;
    pub const ALREADY_INITIALIZED: u16 = 0x0a;
    pub const PAGES_MISSING: u16 = 0x0b;
    pub const UNSUPPORTED_ISSI: u16 = 0x0c;
    pub const UNKNOWN_CAP_TYPE: u16 = 0x0d;
    pub const CAP_ABOVE_MAX: u16 = 0x0e;
    pub const PAGE_MISALIGNED: u16 = 0x0f;
    pub const PAGE_OUTSIDE_RAM: u16 = 0x10;
    pub const PAGE_ALREADY_OWNED: u16 = 0x11;
    pub const TOO_MANY_ENTRIES: u16 = 0x12;
    pub const NO_SUCH_OBJECT: u16 = 0x13;
    pub const TABLE_FULL: u16 = 0x14;
    pub const BAD_PD: u16 = 0x15;
    pub const BAD_ACCESS_MODE: u16 = 0x16;
    pub const BAD_PAGE_SIZE: u16 = 0x17;
    pub const TRANSLATIONS_SHORT: u16 = 0x18;
    pub const TRANSLATION_OUTSIDE_RAM: u16 = 0x19;
    pub const UNSUPPORTED_FEATURE: u16 = 0x1a;
    pub const BAD_LENGTH: u16 = 0x1b;
    pub const BAD_PROFILE: u16 = 0x1c;
    pub const OBJECTS_IN_USE: u16 = 0x1d;
    /// A command held for runtime pages failed: the driver answered MANAGE_PAGES ALLOCATION_FAIL.
    pub const ALLOCATION_FAILED: u16 = 0x1e;
    /// SET_HCA_CAP changed a field the current caps make read-only (`roce` without `roce_rw_supported`, the
    /// atomic endianness mode without `supported_atomic_req_8B_endianness_mode_1`).
    pub const CAP_READ_ONLY: u16 = 0x1f;
    // EQ, CQ, registers, vport (0x30..=0x3f).
    pub const NO_SUCH_EQ: u16 = 0x30;
    pub const BAD_DOORBELL_RECORD: u16 = 0x31;
    pub const UNKNOWN_REGISTER: u16 = 0x32;
    pub const BAD_PORT: u16 = 0x33;
    pub const BAD_REGISTER_VALUE: u16 = 0x34;
    pub const BAD_TABLE_INDEX: u16 = 0x35;
    /// A register only the PF may write (or, HOST_ENDIANNESS, access), from a VF (`--vf`).
    pub const NOT_PERMITTED_FOR_VF: u16 = 0x36;
    // QP and flow steering (0x40..=0x5f).
    pub const QP_WRONG_STATE: u16 = 0x40;
    pub const QP_BAD_OPT_PARAM: u16 = 0x41;
    pub const QP_BAD_FIELD: u16 = 0x42;
    pub const QP_BAD_UAR: u16 = 0x43;
    pub const QP_BAD_SIZE: u16 = 0x44;
    pub const QP_BAD_DBR: u16 = 0x45;
    pub const QP_BAD_PATH: u16 = 0x46;
    pub const QP_BAD_CQ: u16 = 0x47;
    /// `qpc.ts_format` names a clock the caps do not offer (`caps::ts_format_offered`).
    pub const QP_BAD_TS_FORMAT: u16 = 0x48;
    /// `qpc.user_index` is not the one the CQE version calls for (`Caps::qp_user_index`).
    pub const QP_BAD_USER_INDEX: u16 = 0x49;
    pub const FT_BAD_TABLE_TYPE: u16 = 0x50;
    pub const FT_BAD_INDEX: u16 = 0x51;
    pub const FT_INDEX_OCCUPIED: u16 = 0x52;
    pub const FT_BAD_ACTION: u16 = 0x53;
    pub const FT_BAD_DESTINATION: u16 = 0x54;
    pub const UNKNOWN_OPCODE: u16 = 0xff;
}

/// A failed command: the output header it produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdError {
    pub status: u8,
    pub syndrome: u32,
}

pub type CmdResult = Result<Vec<u8>, CmdError>;

/// What a handler sees of a delivered command.
pub struct Ctx<'a> {
    pub opcode: u16,
    pub op_mod: u16,
    pub input: &'a [u8],
    pub output_length: usize,
    pub ram: &'a dyn Memory,
    /// Number of 4 KiB pages in the BAR (bounds UAR indexes).
    pub bar_pages: u64,
}

impl Ctx<'_> {
    pub fn err(&self, status: u8, why: u16) -> CmdError {
        CmdError { status, syndrome: (u32::from(self.opcode) << 16) | u32::from(why) }
    }

    /// The input must hold the whole fixed structure.
    pub fn need_input(&self, len: usize) -> Result<(), CmdError> {
        if self.input.len() < len { Err(self.err(status::BAD_INP_LEN, reason::INPUT_TOO_SHORT)) } else { Ok(()) }
    }

    /// A zeroed output of `len` bytes, refused when the driver's output buffer is shorter.
    pub fn output(&self, len: usize) -> CmdResult {
        if self.output_length < len {
            return Err(self.err(status::BAD_OUTP_LEN, reason::OUTPUT_TOO_SHORT));
        }
        Ok(vec![0u8; len])
    }

    pub fn op_mod_in(&self, allowed: &[u16]) -> Result<(), CmdError> {
        if allowed.contains(&self.op_mod) { Ok(()) } else { Err(self.err(status::BAD_PARAM, reason::BAD_OP_MOD)) }
    }

    /// The first `len` bytes of the input may be non-zero only in `known` fields (and the header's opcode and
    /// op_mod); `uid` must be 0 (no user contexts in this model).
    pub fn reserved_zero(&self, len: usize, known: &[Field]) -> Result<(), CmdError> {
        if ifc::get(self.input, hdr::UID) != 0 {
            return Err(self.err(status::BAD_PARAM, reason::UID_NOT_SUPPORTED));
        }
        let mut rest = self.input[..len.min(self.input.len())].to_vec();
        for &f in [hdr::OPCODE, hdr::OP_MOD].iter().chain(known) {
            ifc::set(&mut rest, f, 0);
        }
        if rest.iter().any(|&b| b != 0) {
            return Err(self.err(status::BAD_PARAM, reason::RESERVED_NOT_ZERO));
        }
        Ok(())
    }

    pub fn get(&self, f: Field) -> u32 {
        ifc::get(self.input, f)
    }
}

/// Runs one delivered command; returns the output structure (header included) with status and syndrome.
pub fn execute(hca: &mut Hca, input: &[u8], output_length: usize, ram: &dyn Memory, bar_pages: u64) -> Vec<u8> {
    let ctx = Ctx {
        opcode: ifc::get(input, hdr::OPCODE) as u16,
        op_mod: ifc::get(input, hdr::OP_MOD) as u16,
        input,
        output_length,
        ram,
        bar_pages,
    };
    let r =
        if input.len() < 8 { Err(ctx.err(status::BAD_INP_LEN, reason::INPUT_TOO_SHORT)) } else { dispatch(hca, &ctx) };
    match r {
        Ok(out) => out,
        Err(e) => {
            let mut out = vec![0u8; 16];
            ifc::set(&mut out, hdr::STATUS, e.status.into());
            ifc::set(&mut out, hdr::SYNDROME, e.syndrome);
            out
        }
    }
}

fn dispatch(hca: &mut Hca, c: &Ctx) -> CmdResult {
    use opcode::*;
    match c.opcode {
        ENABLE_HCA => init::enable_hca(hca, c),
        DISABLE_HCA => init::disable_hca(hca, c),
        QUERY_ISSI => init::query_issi(hca, c),
        SET_ISSI => init::set_issi(hca, c),
        INIT_HCA => init::init_hca(hca, c),
        TEARDOWN_HCA => init::teardown_hca(hca, c),
        QUERY_ADAPTER => init::query_adapter(hca, c),
        QUERY_PAGES => pages::query_pages(hca, c),
        MANAGE_PAGES => pages::manage_pages(hca, c),
        QUERY_HCA_CAP => caps::query_hca_cap(hca, c),
        SET_HCA_CAP => caps::set_hca_cap(hca, c),
        ALLOC_UAR => resources::alloc_uar(hca, c),
        DEALLOC_UAR => resources::dealloc_uar(hca, c),
        ALLOC_PD => resources::alloc_pd(hca, c),
        DEALLOC_PD => resources::dealloc_pd(hca, c),
        ALLOC_TRANSPORT_DOMAIN => resources::alloc_transport_domain(hca, c),
        DEALLOC_TRANSPORT_DOMAIN => resources::dealloc_transport_domain(hca, c),
        CREATE_MKEY => mkey::create_mkey(hca, c),
        QUERY_MKEY => mkey::query_mkey(hca, c),
        DESTROY_MKEY => mkey::destroy_mkey(hca, c),
        CREATE_EQ => eq::create_eq(hca, c),
        DESTROY_EQ => eq::destroy_eq(hca, c),
        QUERY_EQ => eq::query_eq(hca, c),
        CREATE_CQ => cq::create_cq(hca, c),
        DESTROY_CQ => cq::destroy_cq(hca, c),
        ACCESS_REG => reg::access_register(hca, c),
        QUERY_VPORT_STATE => vport::query_vport_state(hca, c),
        QUERY_NIC_VPORT_CONTEXT => vport::query_nic_vport_context(hca, c),
        MODIFY_NIC_VPORT_CONTEXT => vport::modify_nic_vport_context(hca, c),
        QUERY_HCA_VPORT_GID => vport::query_hca_vport_gid(hca, c),
        QUERY_ROCE_ADDRESS => vport::query_roce_address(hca, c),
        SET_ROCE_ADDRESS => vport::set_roce_address(hca, c),
        CREATE_QP => qp::create_qp(hca, c),
        DESTROY_QP => qp::destroy_qp(hca, c),
        QUERY_QP => qp::query_qp(hca, c),
        RST2INIT_QP => qp::modify(hca, c, crate::qp::Transition::Rst2Init),
        INIT2RTR_QP => qp::modify(hca, c, crate::qp::Transition::Init2Rtr),
        RTR2RTS_QP => qp::modify(hca, c, crate::qp::Transition::Rtr2Rts),
        RTS2RTS_QP => qp::modify(hca, c, crate::qp::Transition::Rts2Rts),
        QP_2ERR => qp::to_err_or_rst(hca, c, crate::qp::Transition::ToErr),
        QP_2RST => qp::to_err_or_rst(hca, c, crate::qp::Transition::ToRst),
        CREATE_FLOW_TABLE => flow::create_flow_table(hca, c),
        DESTROY_FLOW_TABLE => flow::destroy_flow_table(hca, c),
        CREATE_FLOW_GROUP => flow::create_flow_group(hca, c),
        DESTROY_FLOW_GROUP => flow::destroy_flow_group(hca, c),
        SET_FLOW_TABLE_ENTRY => flow::set_flow_table_entry(hca, c),
        DELETE_FLOW_TABLE_ENTRY => flow::delete_flow_table_entry(hca, c),
        SET_FLOW_TABLE_ROOT => flow::set_flow_table_root(hca, c),
        QUERY_SPECIAL_CONTEXTS => eth::query_special_contexts(hca, c),
        CREATE_TIS => eth::create_tis(hca, c),
        DESTROY_TIS => eth::destroy_tis(hca, c),
        CREATE_SQ => eth::create_sq(hca, c),
        MODIFY_SQ => eth::modify_sq(hca, c),
        QUERY_SQ => eth::query_sq(hca, c),
        DESTROY_SQ => eth::destroy_sq(hca, c),
        CREATE_RQ => eth::create_rq(hca, c),
        MODIFY_RQ => eth::modify_rq(hca, c),
        QUERY_RQ => eth::query_rq(hca, c),
        DESTROY_RQ => eth::destroy_rq(hca, c),
        CREATE_TIR => eth::create_tir(hca, c),
        ALLOC_Q_COUNTER => eth::alloc_q_counter(hca, c),
        DEALLOC_Q_COUNTER => eth::dealloc_q_counter(hca, c),
        QUERY_Q_COUNTER => eth::query_q_counter(hca, c),
        DESTROY_TIR => eth::destroy_tir(hca, c),
        _ => Err(c.err(status::BAD_OP, reason::UNKNOWN_OPCODE)),
    }
}

/// Function-state preconditions shared by the handlers.
pub(crate) fn need_enabled(hca: &Hca, c: &Ctx) -> Result<(), CmdError> {
    if hca.state == crate::hca::FnState::Disabled {
        return Err(c.err(status::BAD_SYS_STATE, reason::NOT_ENABLED));
    }
    Ok(())
}

pub(crate) fn need_initialized(hca: &Hca, c: &Ctx) -> Result<(), CmdError> {
    if hca.state != crate::hca::FnState::Initialized {
        return Err(c.err(status::BAD_SYS_STATE, reason::NOT_INITIALIZED));
    }
    Ok(())
}

/// `embedded_cpu_function` (bit 0x40) and `function_id` (bit 0x50, 16 bits): this model is one PF, function 0.
pub(crate) const EMBEDDED_CPU_FUNCTION: Field = Field::new(0x40, 1);
pub(crate) const FUNCTION_ID: Field = Field::new(0x50, 16);

pub(crate) fn need_own_function(c: &Ctx) -> Result<(), CmdError> {
    if c.get(EMBEDDED_CPU_FUNCTION) != 0 || c.get(FUNCTION_ID) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    Ok(())
}
