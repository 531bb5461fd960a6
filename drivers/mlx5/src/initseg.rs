//! The initialization segment at BAR0 offset 0 (`device.h` `struct mlx5_init_seg`, ifc `initial_seg`;
//! docs/reference/mlx5.md §b.1) and the firmware timeouts it advertises (Linux `core/lib/tout.c`).

use crate::platform::Platform;

pub const FW_REV: usize = 0x000;
pub const CMDIF_REV_FW_SUB: usize = 0x004;
pub const CMDQ_ADDR_H: usize = 0x010;
pub const CMDQ_ADDR_L_SZ: usize = 0x014;
pub const CMD_DBELL: usize = 0x018;
pub const INITIALIZING: usize = 0x1fc;
/// Health buffer (`struct health_buffer`, 0x200..0x240).
pub const HEALTH_FW_VER: usize = 0x230;
/// The dword holding `rfr_severity` (byte 0x238) and, at byte 0x23d, `synd`.
pub const HEALTH_RFR_DW: usize = 0x238;
pub const HEALTH_SYND_DW: usize = 0x23c;
pub const CMD_EXEC_TO: usize = 0xff8;
pub const CMD_Q_INIT_TO: usize = 0xffc;
/// `health_syndrome` [31:24] + `health_counter` [23:0].
pub const HEALTH_COUNTER: usize = 0x1010;

/// `cmd_interface_rev` this driver speaks (`core/cmd.c:70`).
pub const CMD_INTERFACE_REV: u32 = 5;

/// Linux defaults (`core/lib/tout.c:11-29`).
pub const FW_PRE_INIT_TIMEOUT_MS: u64 = 120_000;
/// How often the pre-init wait reports that it is still waiting (Linux `FW_PRE_INIT_WARN_MESSAGE_INTERVAL_MS`:
/// 20 s, "Waiting for FW initialization, timeout abort in N s").
pub const FW_PRE_INIT_WARN_MS: u64 = 20_000;
pub const FW_INIT_TIMEOUT_MS: u64 = 2_000;
pub const CMD_TIMEOUT_MS: u64 = 60_000;
pub const TEARDOWN_TIMEOUT_MS: u64 = 3_000;
pub const RECLAIM_PAGES_TIMEOUT_MS: u64 = 5_000;
pub const HEALTH_POLL_INTERVAL_MS: u64 = 2_000;

/// `nic_interface` values (`mlx5_ifc.h:11013-11018`).
pub const NIC_IFC_FULL_DRIVER: u32 = 0;
pub const NIC_IFC_DISABLED: u32 = 1;
pub const NIC_IFC_SW_RESET: u32 = 7;

/// Firmware revision (`fw_rev_major`.`fw_rev_minor`.`fw_rev_subminor`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FwRev {
    pub major: u16,
    pub minor: u16,
    pub subminor: u16,
}

impl core::fmt::Display for FwRev {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.subminor)
    }
}

pub fn fw_rev<P: Platform + ?Sized>(p: &P) -> FwRev {
    let a = p.bar_read32(FW_REV);
    let b = p.bar_read32(CMDIF_REV_FW_SUB);
    FwRev { major: a as u16, minor: (a >> 16) as u16, subminor: b as u16 }
}

pub fn cmd_interface_rev<P: Platform + ?Sized>(p: &P) -> u32 {
    p.bar_read32(CMDIF_REV_FW_SUB) >> 16
}

pub fn initializing<P: Platform + ?Sized>(p: &P) -> bool {
    p.bar_read32(INITIALIZING) >> 31 != 0
}

/// `embedded_cpu` (BAR0 0x1fc bit 23), passed to ENABLE_HCA as `embedded_cpu_function`.
pub fn embedded_cpu<P: Platform + ?Sized>(p: &P) -> bool {
    (p.bar_read32(INITIALIZING) >> 23) & 1 != 0
}

/// Decodes an advertised timeout (`core/lib/tout.c:66-85`): bits 31:29 unit (low two bits: ms, s, min, h),
/// bits 19:0 value. `None` for 0 (not advertised).
pub fn decode_timeout(raw: u32) -> Option<u64> {
    let value = u64::from(raw & 0xf_ffff);
    if value == 0 {
        return None;
    }
    let unit_ms = match (raw >> 29) & 3 {
        0 => 1,
        1 => 1_000,
        2 => 60_000,
        _ => 3_600_000,
    };
    Some(value * unit_ms)
}

/// The command and init timeouts in force: the firmware's when `cmd_q_init_to` is advertised (non-zero), as
/// Linux `mlx5_tout_query_iseg`, otherwise Linux's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub cmd_ms: u64,
    pub init_ms: u64,
}

pub fn timeouts<P: Platform + ?Sized>(p: &P) -> Timeouts {
    match decode_timeout(p.bar_read32(CMD_Q_INIT_TO)) {
        Some(init_ms) => {
            Timeouts { cmd_ms: decode_timeout(p.bar_read32(CMD_EXEC_TO)).unwrap_or(CMD_TIMEOUT_MS), init_ms }
        }
        None => Timeouts { cmd_ms: CMD_TIMEOUT_MS, init_ms: FW_INIT_TIMEOUT_MS },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_units() {
        assert_eq!(decode_timeout(0), None);
        assert_eq!(decode_timeout(60 | (1 << 29)), Some(60_000));
        assert_eq!(decode_timeout(2000), Some(2000));
        assert_eq!(decode_timeout(1 | (2 << 29)), Some(60_000));
        assert_eq!(decode_timeout(1 | (3 << 29)), Some(3_600_000));
        // Only the low two bits of the unit count.
        assert_eq!(decode_timeout(5 | (5 << 29)), Some(5_000));
    }
}
