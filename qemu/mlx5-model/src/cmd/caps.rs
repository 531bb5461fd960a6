//! QUERY_HCA_CAP and SET_HCA_CAP (`mlx5_ifc.h` `query_hca_cap_in/out`, `set_hca_cap_in`; op_mod =
//! `(cap_type << 1) | current` for queries and `cap_type << 1` for SET; docs/reference/mlx5.md §b.2 step 11, §e.1).

use super::{CmdResult, Ctx, need_enabled, reason, status};
use crate::caps::{CAP_SIZE, SetCapError};
use crate::hca::{FnState, Hca};
use crate::ifc::Field;

const OTHER_FUNCTION: Field = Field::new(0x40, 1);
const EC_VF_FUNCTION: Field = Field::new(0x41, 1);
const FUNCTION_ID: Field = Field::new(0x50, 16);
/// `capability` at byte 0x10 of `query_hca_cap_out` and `set_hca_cap_in` (both 0x1010 bytes).
const CAPABILITY: usize = 0x10;
const SIZE: usize = CAPABILITY + CAP_SIZE;

fn own_function(c: &Ctx) -> Result<(), super::CmdError> {
    c.reserved_zero(0x10, &[OTHER_FUNCTION, EC_VF_FUNCTION, FUNCTION_ID])?;
    // Querying another function (VFs, the embedded CPU) is not modelled: one PF.
    if c.get(OTHER_FUNCTION) != 0 || c.get(EC_VF_FUNCTION) != 0 || c.get(FUNCTION_ID) != 0 {
        return Err(c.err(status::BAD_PARAM, reason::WRONG_FUNCTION));
    }
    Ok(())
}

pub fn query_hca_cap(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    own_function(c)?;
    need_enabled(hca, c)?;
    let (cap_type, current) = (c.op_mod >> 1, c.op_mod & 1 == 1);
    let Some(block) = hca.caps.block(cap_type, current) else {
        return Err(c.err(status::BAD_PARAM, reason::UNKNOWN_CAP_TYPE));
    };
    let mut out = c.output(SIZE)?;
    out[CAPABILITY..].copy_from_slice(block);
    Ok(out)
}

pub fn set_hca_cap(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(SIZE)?;
    own_function(c)?;
    need_enabled(hca, c)?;
    // The "current" bit has no meaning for SET.
    if c.op_mod & 1 != 0 {
        return Err(c.err(status::BAD_PARAM, reason::BAD_OP_MOD));
    }
    if hca.state == FnState::Initialized {
        return Err(c.err(status::BAD_SYS_STATE, reason::ALREADY_INITIALIZED));
    }
    let out = c.output(0x10)?;
    hca.caps.set(c.op_mod >> 1, &c.input[CAPABILITY..SIZE]).map_err(|e| match e {
        SetCapError::NotSettable => c.err(status::BAD_PARAM, reason::UNKNOWN_CAP_TYPE),
        SetCapError::AboveMax(_) => c.err(status::BAD_PARAM, reason::CAP_ABOVE_MAX),
        SetCapError::ReadOnly(_) => c.err(status::BAD_PARAM, reason::CAP_READ_ONLY),
    })?;
    Ok(out)
}
