//! QUERY_PAGES and MANAGE_PAGES (`mlx5_ifc.h` `query_pages_in/out`, `manage_pages_in/out`; docs/reference/mlx5.md
//! §b.3).

use super::{CmdResult, Ctx, EMBEDDED_CPU_FUNCTION, FUNCTION_ID, need_enabled, need_own_function, reason, status};
use crate::hca::{FnState, Hca};
use crate::ifc::{self, Field};
use crate::pages::{GiveError, manage_pages_op_mod as mp, query_pages_op_mod as qp};

const QUERY_PAGES_OUT_NUM_PAGES: Field = Field::new(0x60, 32);
const MANAGE_PAGES_IN_INPUT_NUM_ENTRIES: Field = Field::new(0x60, 32);
const MANAGE_PAGES_OUT_OUTPUT_NUM_ENTRIES: Field = Field::new(0x40, 32);
/// `pas[]` starts at byte 0x10 of both `manage_pages_in` and `manage_pages_out`, 8 bytes per page.
const PAS: usize = 0x10;

pub fn query_pages(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[qp::BOOT, qp::INIT, qp::REGULAR])?;
    c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID])?;
    need_own_function(c)?;
    need_enabled(hca, c)?;
    let mut out = c.output(0x10)?;
    // function_id (out bit 0x50) is ours, 0.
    ifc::set(&mut out, QUERY_PAGES_OUT_NUM_PAGES, hca.pages.query(c.op_mod) as u32);
    Ok(out)
}

pub fn manage_pages(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[mp::ALLOCATION_FAIL, mp::ALLOCATION_SUCCESS, mp::HCA_RETURN_PAGES])?;
    need_own_function(c)?;
    need_enabled(hca, c)?;
    let n = c.get(MANAGE_PAGES_IN_INPUT_NUM_ENTRIES) as usize;
    match c.op_mod {
        mp::ALLOCATION_SUCCESS => {
            if n > (crate::cmdq::MAX_MSG_LEN as usize) / 8 {
                return Err(c.err(status::BAD_PARAM, reason::TOO_MANY_ENTRIES));
            }
            c.need_input(PAS + 8 * n)?;
            c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID, MANAGE_PAGES_IN_INPUT_NUM_ENTRIES])?;
            let pas: Vec<u64> = (0..n).map(|i| ifc::get64(c.input, PAS + 8 * i)).collect();
            let out = c.output(0x10)?;
            hca.pages.give(&pas, c.ram).map_err(|e| match e {
                GiveError::Misaligned(_) => c.err(status::BAD_PARAM, reason::PAGE_MISALIGNED),
                GiveError::OutsideRam(_) => c.err(status::BAD_PARAM, reason::PAGE_OUTSIDE_RAM),
                GiveError::AlreadyOwned(_) => c.err(status::BAD_PARAM, reason::PAGE_ALREADY_OWNED),
            })?;
            Ok(out)
        }
        mp::HCA_RETURN_PAGES => {
            c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID, MANAGE_PAGES_IN_INPUT_NUM_ENTRIES])?;
            let keep = if hca.state == FnState::Initialized { hca.pages.in_use_when_initialized() } else { 0 };
            // Only as many as the output can carry are taken, so no page is lost between device and driver.
            let room = c.output_length.saturating_sub(PAS) / 8;
            let mut out = c.output(0x10)?;
            let pages = hca.pages.take(n.min(room), keep);
            out.resize(PAS + 8 * pages.len(), 0);
            ifc::set(&mut out, MANAGE_PAGES_OUT_OUTPUT_NUM_ENTRIES, pages.len() as u32);
            for (i, pa) in pages.iter().enumerate() {
                ifc::set64(&mut out, PAS + 8 * i, *pa);
            }
            Ok(out)
        }
        // ALLOCATION_FAIL: the driver cannot satisfy a page request; the commands waiting for it fail.
        _ => {
            c.reserved_zero(0x10, &[EMBEDDED_CPU_FUNCTION, FUNCTION_ID, MANAGE_PAGES_IN_INPUT_NUM_ENTRIES])?;
            let out = c.output(0x10)?;
            crate::events::allocation_failed(hca, c.ram);
            Ok(out)
        }
    }
}
