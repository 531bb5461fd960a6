//! Function life cycle: ENABLE_HCA, DISABLE_HCA, QUERY_ISSI, SET_ISSI, INIT_HCA, TEARDOWN_HCA, QUERY_ADAPTER
//! (`mlx5_ifc.h` `enable_hca_in`, `disable_hca_in`, `query_issi_out`, `set_issi_in`, `init_hca_in`,
//! `teardown_hca_in/out`, `query_adapter_out`; Linux bring-up order docs/reference/mlx5.md §b.2, teardown §b.4).

use super::{CmdResult, Ctx, EMBEDDED_CPU_FUNCTION, FUNCTION_ID, need_enabled, need_own_function, reason, status};
use crate::hca::{FnState, Hca};
use crate::ifc::{self, Field};

/// `query_issi_out.current_issi`, `supported_issi_dw0` (size 0x70).
const QUERY_ISSI_OUT_CURRENT_ISSI: Field = Field::new(0x50, 16);
const QUERY_ISSI_OUT_SUPPORTED_ISSI_DW0: Field = Field::new(0x360, 32);
const QUERY_ISSI_OUT_SIZE: usize = 0x70;
/// The trace's ConnectX-4 reports `supported_issi_dw0` = 0x2: ISSI 1 (bit 1) only.
pub const SUPPORTED_ISSI_DW0: u32 = 0x2;
/// `set_issi_in.current_issi`.
const SET_ISSI_IN_CURRENT_ISSI: Field = Field::new(0x50, 16);
/// `init_hca_in`: `sw_vhca_id` (bit 0x62, 14 bits), `sw_owner_id[4]` at bytes 0x10..0x20; size 0x20.
const INIT_HCA_IN_SW_VHCA_ID: Field = Field::new(0x62, 14);
const INIT_HCA_IN_SIZE: usize = 0x20;
/// `teardown_hca_in.profile`, `teardown_hca_out.state`.
const TEARDOWN_HCA_IN_PROFILE: Field = Field::new(0x50, 16);
const TEARDOWN_HCA_OUT_STATE: Field = Field::new(0x7f, 1);
/// `query_adapter_out` is 0x110 bytes: header + `query_adapter_struct`.
const QUERY_ADAPTER_OUT_SIZE: usize = 0x110;

pub fn enable_hca(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID])?;
    need_own_function(c)?;
    if hca.state != FnState::Disabled {
        return Err(c.err(status::BAD_SYS_STATE, reason::ALREADY_ENABLED));
    }
    let out = c.output(0x10)?;
    hca.state = FnState::Enabled;
    Ok(out)
}

pub fn disable_hca(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID])?;
    need_own_function(c)?;
    match hca.state {
        FnState::Disabled => return Err(c.err(status::BAD_SYS_STATE, reason::NOT_ENABLED)),
        FnState::Initialized => return Err(c.err(status::BAD_SYS_STATE, reason::ALREADY_INITIALIZED)),
        FnState::Enabled => {}
    }
    let out = c.output(0x10)?;
    hca.disable();
    Ok(out)
}

pub fn query_issi(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[])?;
    need_enabled(hca, c)?;
    let mut out = c.output(QUERY_ISSI_OUT_SIZE)?;
    ifc::set(&mut out, QUERY_ISSI_OUT_CURRENT_ISSI, hca.issi.into());
    ifc::set(&mut out, QUERY_ISSI_OUT_SUPPORTED_ISSI_DW0, SUPPORTED_ISSI_DW0);
    Ok(out)
}

pub fn set_issi(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[SET_ISSI_IN_CURRENT_ISSI])?;
    need_enabled(hca, c)?;
    if hca.state == FnState::Initialized {
        return Err(c.err(status::BAD_SYS_STATE, reason::ALREADY_INITIALIZED));
    }
    let issi = c.get(SET_ISSI_IN_CURRENT_ISSI);
    // ISSI 0 is what the function starts with; ISSI n > 0 must be advertised in supported_issi_dw0.
    if issi != 0 && (issi >= 32 || SUPPORTED_ISSI_DW0 & (1 << issi) == 0) {
        return Err(c.err(status::BAD_PARAM, reason::UNSUPPORTED_ISSI));
    }
    let out = c.output(0x10)?;
    hca.issi = issi as u16;
    Ok(out)
}

pub fn init_hca(hca: &mut Hca, c: &Ctx) -> CmdResult {
    // Linux before 5.x sent a 16-byte init_hca_in; sw_owner_id extended it to 0x20. Accept both and treat
    // the missing part as zero.
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    let len = c.input.len().min(INIT_HCA_IN_SIZE);
    let mut known = vec![INIT_HCA_IN_SW_VHCA_ID];
    known.extend((0..4).map(|i| Field::new(0x80 + 32 * i, 32)));
    c.reserved_zero(len, &known)?;
    need_enabled(hca, c)?;
    if hca.state == FnState::Initialized {
        return Err(c.err(status::BAD_SYS_STATE, reason::ALREADY_INITIALIZED));
    }
    if !hca.pages.init_satisfied() {
        return Err(c.err(status::BAD_SYS_STATE, reason::PAGES_MISSING));
    }
    let out = c.output(0x10)?;
    hca.state = FnState::Initialized;
    // The port starts link training once the function is initialized (admin up by default).
    crate::port::start_link(hca, c.ram, std::time::Instant::now());
    Ok(out)
}

pub fn teardown_hca(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[TEARDOWN_HCA_IN_PROFILE])?;
    // GRACEFUL_CLOSE (0) and FORCE_CLOSE (1); PREPARE_FAST_TEARDOWN (2) needs the nic_interface handshake,
    // which the model does not implement, and force_teardown is not advertised.
    if c.get(TEARDOWN_HCA_IN_PROFILE) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::BAD_PROFILE));
    }
    if hca.state != FnState::Initialized {
        return Err(c.err(status::BAD_SYS_STATE, reason::NOT_INITIALIZED));
    }
    let mut out = c.output(0x10)?;
    ifc::set(&mut out, TEARDOWN_HCA_OUT_STATE, 0);
    hca.teardown();
    Ok(out)
}

pub fn query_adapter(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[])?;
    need_enabled(hca, c)?;
    let mut out = c.output(QUERY_ADAPTER_OUT_SIZE)?;
    // The trace's QUERY_ADAPTER output: ieee_vendor_id 0x0002c9 at byte 0x28, vsd_vendor_id 0x15b3 at byte
    // 0x2c, psid "MT_2430110027" at byte 0x100. The PSID is the CX-4 board's; no CX-5 PSID is on record.
    ifc::set(&mut out, Field::new(0x28 * 8 + 8, 24), 0x0002c9);
    ifc::set(&mut out, Field::new(0x2c * 8 + 16, 16), 0x15b3);
    out[0x100..0x100 + 13].copy_from_slice(b"MT_2430110027");
    Ok(out)
}
