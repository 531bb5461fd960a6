//! ACCESS_REGISTER (`mlx5_ifc.h` `access_register_in/out`; docs/reference/mlx5.md §d, §e.6): op_mod 0 writes, 1 reads
//! (`core/port.c:57`); the register data follows the 16-byte header in both input and output. Registers:
//! PAOS (`paos_reg`), PMTU (`pmtu_reg`) and HOST_ENDIANNESS (`device.h` `mlx5_reg_host_endianness`, which
//! Linux writes during bring-up, reference trace).

use super::{CmdResult, Ctx, need_enabled, reason, status};
use crate::hca::Hca;
use crate::ifc::{self, Field};
use crate::port::{PORT_DOWN, PORT_UP};

const REGISTER_ID: Field = Field::new(0x50, 16);
const ARGUMENT: Field = Field::new(0x60, 32);
const DATA: u32 = 0x10;
/// Register ids (`driver.h:118-166`).
pub const PMTU: u32 = 0x5003;
pub const PAOS: u32 = 0x5006;
pub const HOST_ENDIANNESS: u32 = 0x7004;
const WRITE: u16 = 0;
const READ: u16 = 1;
/// All three registers are 16 bytes.
const REG_SIZE: usize = 0x10;

mod paos {
    use crate::ifc::Field;
    pub const SWID: Field = Field::new(0x00, 8);
    pub const LOCAL_PORT: Field = Field::new(0x08, 8);
    pub const ADMIN_STATUS: Field = Field::new(0x14, 4);
    pub const OPER_STATUS: Field = Field::new(0x1c, 4);
    pub const ASE: Field = Field::new(0x20, 1);
    pub const EE: Field = Field::new(0x21, 1);
    pub const E: Field = Field::new(0x3e, 2);
}
mod pmtu {
    use crate::ifc::Field;
    pub const LOCAL_PORT: Field = Field::new(0x08, 8);
    pub const MAX_MTU: Field = Field::new(0x20, 16);
    pub const ADMIN_MTU: Field = Field::new(0x40, 16);
    pub const OPER_MTU: Field = Field::new(0x60, 16);
}
/// `mlx5_reg_host_endianness.he` (byte 0).
const HE: Field = Field::new(0x00, 8);
/// Smallest PMTU `admin_mtu` accepted: the IPv4 minimum (68) plus the 22 bytes of L2 PMTU counts.
const MIN_HW_MTU: u32 = 68 + 22;

pub fn access_register(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(DATA as usize + REG_SIZE)?;
    c.op_mod_in(&[WRITE, READ])?;
    need_enabled(hca, c)?;
    let id = c.get(REGISTER_ID);
    let r = |f: Field| c.get(f.at(DATA));
    let bad = |why| Err(c.err(status::BAD_PARAM, why));
    if c.get(ARGUMENT) != 0 {
        return bad(reason::RESERVED_NOT_ZERO);
    }
    let write = c.op_mod == WRITE;
    let fields: &[Field] = match id {
        PAOS => &[paos::SWID, paos::LOCAL_PORT, paos::ADMIN_STATUS, paos::OPER_STATUS, paos::ASE, paos::EE, paos::E],
        PMTU => &[pmtu::LOCAL_PORT, pmtu::MAX_MTU, pmtu::ADMIN_MTU, pmtu::OPER_MTU],
        HOST_ENDIANNESS => &[HE],
        _ => return bad(reason::UNKNOWN_REGISTER),
    };
    // A VF's firmware keeps the host's endianness and the physical port's settings for the PF (Linux
    // `set_hca_ctrl` returns early unless `mlx5_core_is_pf`); stricter than known: refused, not ignored.
    if hca.vf && (id == HOST_ENDIANNESS || (write && (id == PAOS || id == PMTU))) {
        return bad(reason::NOT_PERMITTED_FOR_VF);
    }
    // `--vf-port-reads-refused`: the port's registers are not this function's to read either.
    if hca.port_reads_refused && (id == PAOS || id == PMTU) {
        return bad(reason::NOT_PERMITTED_FOR_VF);
    }
    let known: Vec<Field> = fields.iter().map(|f| f.at(DATA)).chain([REGISTER_ID, ARGUMENT]).collect();
    c.reserved_zero(DATA as usize + REG_SIZE, &known)?;
    let mut out = c.output(DATA as usize + REG_SIZE)?;
    let o = |out: &mut Vec<u8>, f: Field, v: u32| ifc::set(out, f.at(DATA), v);
    match id {
        PAOS => {
            if r(paos::LOCAL_PORT) != 1 || r(paos::SWID) != 0 {
                return bad(reason::BAD_PORT);
            }
            let p = &mut hca.port;
            if write {
                let admin = r(paos::ADMIN_STATUS) as u8;
                if r(paos::ASE) == 1 && admin != PORT_UP && admin != PORT_DOWN {
                    return bad(reason::BAD_REGISTER_VALUE);
                }
                if r(paos::EE) == 1 && r(paos::E) > 2 {
                    return bad(reason::BAD_REGISTER_VALUE);
                }
                if r(paos::EE) == 1 {
                    p.event_mode = r(paos::E) as u8;
                }
                if r(paos::ASE) == 1 {
                    p.admin_status = admin;
                    // The cable is always there: the link follows the administrative state, after the
                    // training delay when one is configured (`crate::port`).
                    if admin == PORT_UP {
                        crate::port::start_link(hca, c.ram, std::time::Instant::now());
                    } else {
                        crate::port::stop_link(hca, c.ram);
                    }
                }
            }
            let p = &hca.port;
            o(&mut out, paos::LOCAL_PORT, 1);
            o(&mut out, paos::ADMIN_STATUS, p.admin_status.into());
            o(&mut out, paos::OPER_STATUS, p.oper_status.into());
            o(&mut out, paos::E, p.event_mode.into());
        }
        PMTU => {
            if r(pmtu::LOCAL_PORT) != 1 {
                return bad(reason::BAD_PORT);
            }
            let p = &mut hca.port;
            if write {
                let mtu = r(pmtu::ADMIN_MTU);
                if !(MIN_HW_MTU..=u32::from(p.max_mtu)).contains(&mtu) {
                    return bad(reason::BAD_REGISTER_VALUE);
                }
                p.admin_mtu = mtu as u16;
                p.oper_mtu = mtu as u16;
            }
            o(&mut out, pmtu::LOCAL_PORT, 1);
            o(&mut out, pmtu::MAX_MTU, p.max_mtu.into());
            o(&mut out, pmtu::ADMIN_MTU, p.admin_mtu.into());
            o(&mut out, pmtu::OPER_MTU, p.oper_mtu.into());
        }
        _ => {
            // Little-endian host only (he = 0, `MLX5_SET_HOST_ENDIANNESS` on x86).
            if r(HE) != 0 {
                return bad(reason::UNSUPPORTED_FEATURE);
            }
        }
    }
    Ok(out)
}
