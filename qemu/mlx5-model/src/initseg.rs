//! The initialization segment at BAR0 offset 0 (`mlx5_ifc.h` `initial_seg`, `device.h` `struct mlx5_init_seg`;
//! docs/reference/mlx5.md §b.1, §g): firmware revision, command-interface revision 5, the command-queue address
//! register with the read-only `log_cmdq_size` / `log_cmdq_stride`, the command doorbell, `initializing`, the health
//! buffer and counter, `cmd_exec_to` / `cmd_q_init_to` and the free-running internal timer.
//!
//! The BAR is plain shared memory, so "read-only" bits are enforced by rewriting them whenever the driver's
//! write clobbered them (Linux writes the whole `cmdq_addr_l_sz` dword with the low 12 bits zero).

use std::time::{Duration, Instant};

use crate::ifc::{self, initial_seg as seg};
use crate::mem::{Memory, OutOfRange};

/// 32 entries (`MLX5_MAX_COMMANDS`) of 64 bytes: 2 KiB, inside the one 4 KiB page Linux allocates.
pub const LOG_CMDQ_SIZE: u32 = 5;
pub const LOG_CMDQ_STRIDE: u32 = 6;
/// `CMD_IF_REV` (`core/cmd.c:70`).
pub const CMD_INTERFACE_REV: u32 = 5;

/// `cmd_exec_to` / `cmd_q_init_to` encoding (`core/lib/tout.c:66-98`): unit in bits 31:29, value in 19:0.
pub fn encode_timeout(d: Duration) -> u32 {
    let ms = d.as_millis();
    if ms <= 0xf_ffff {
        ms as u32
    } else if d.as_secs() <= 0xf_ffff {
        (1 << 29) | d.as_secs() as u32
    } else {
        (2 << 29) | (d.as_secs() / 60).min(0xf_ffff) as u32
    }
}

/// Where the driver put the command queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdqGeometry {
    pub base: u64,
    pub entries: u32,
    pub stride: u64,
}

pub struct InitSeg {
    start: Instant,
    init_delay: Duration,
    initializing: bool,
    health_period: Duration,
    health_stopped: bool,
    last_tick: Instant,
    counter: u32,
}

impl InitSeg {
    /// Writes the segment as firmware leaves it at reset: `initializing` set, doorbell clear.
    pub fn new(bar: &dyn Memory, cfg: &crate::ModelConfig, now: Instant) -> Result<InitSeg, OutOfRange> {
        let mut page = vec![0u8; 0x200];
        let (maj, min, sub) = cfg.fw_rev;
        ifc::set(&mut page, seg::FW_REV_MINOR, min.into());
        ifc::set(&mut page, seg::FW_REV_MAJOR, maj.into());
        ifc::set(&mut page, seg::CMD_INTERFACE_REV, CMD_INTERFACE_REV);
        ifc::set(&mut page, seg::FW_REV_SUBMINOR, sub.into());
        ifc::set(&mut page, seg::LOG_CMDQ_SIZE, LOG_CMDQ_SIZE);
        ifc::set(&mut page, seg::LOG_CMDQ_STRIDE, LOG_CMDQ_STRIDE);
        ifc::set(&mut page, seg::INITIALIZING, 1);
        bar.write(0, &page)?;
        bar.write(seg::HEALTH_BUFFER, &[0; ifc::health_buffer::SIZE])?;
        bar.write_be32(seg::BYTE_CMD_EXEC_TO, encode_timeout(cfg.cmd_exec_to))?;
        bar.write_be32(seg::BYTE_CMD_Q_INIT_TO, encode_timeout(cfg.cmd_q_init_to))?;
        bar.write_be64(seg::BYTE_INTERNAL_TIMER_H, 0)?;
        bar.write_be32(seg::BYTE_HEALTH_COUNTER, 0)?;
        Ok(InitSeg {
            start: now,
            init_delay: cfg.init_delay,
            initializing: true,
            health_period: cfg.health_period,
            health_stopped: false,
            last_tick: now,
            counter: 0,
        })
    }

    pub fn initializing(&self) -> bool {
        self.initializing
    }

    /// Stops (or restarts) the health counter, as a hung firmware would.
    pub fn set_health_stopped(&mut self, stopped: bool) {
        self.health_stopped = stopped;
    }

    /// Fatal health syndrome (docs/reference/mlx5.md §g): health buffer `synd` (0x23d) non-zero, `rfr` (0x238
    /// bit 7, "firmware requests reset") as given — stock firmware leaves it 0, so Linux's
    /// `mlx5_health_check_fatal_sensors` (which wants `rfr` and `synd`) does not see it; only its poller's
    /// devlink report does — severity valid + 2 (`LOGLEVEL_CRIT`, 0x238 bits 3:0), and `health_syndrome`
    /// (0x1010 bits 31:24, ifc `initial_seg`) set to the same value.
    pub fn raise_fatal(bar: &dyn Memory, synd: u8, rfr: bool) -> Result<(), OutOfRange> {
        let mut hb = [0u8; ifc::health_buffer::SIZE];
        bar.read(seg::HEALTH_BUFFER, &mut hb)?;
        ifc::set(&mut hb, ifc::health_buffer::SYND, synd.into());
        ifc::set(&mut hb, ifc::health_buffer::RFR, rfr.into());
        hb[0x38] = (hb[0x38] & 0xf0) | 0x8 | 2;
        bar.write(seg::HEALTH_BUFFER, &hb)?;
        let d = bar.read_be32(seg::BYTE_HEALTH_COUNTER)?;
        bar.write_be32(seg::BYTE_HEALTH_COUNTER, (d & 0xff_ffff) | (u32::from(synd) << 24))
    }

    pub fn health_counter(&self) -> u32 {
        self.counter
    }

    /// Timers: clears `initializing` after the delay, ticks the health counter, advances the internal timer
    /// (in device clock cycles at `freq_khz`), restores the read-only cmdq geometry bits. Returns true when
    /// `initializing` cleared in this pass.
    pub fn tick(&mut self, bar: &dyn Memory, now: Instant, freq_khz: u32) -> Result<bool, OutOfRange> {
        let mut cleared = false;
        if self.initializing && now.duration_since(self.start) >= self.init_delay {
            let d = bar.read_be32(seg::BYTE_INITIALIZING)?;
            bar.write_be32(seg::BYTE_INITIALIZING, d & !(1 << 31))?;
            self.initializing = false;
            cleared = true;
        }
        if !self.health_stopped && self.health_period > Duration::ZERO {
            while now.duration_since(self.last_tick) >= self.health_period {
                self.last_tick += self.health_period;
                self.counter = (self.counter + 1) & 0xff_ffff;
            }
            let d = bar.read_be32(seg::BYTE_HEALTH_COUNTER)?;
            bar.write_be32(seg::BYTE_HEALTH_COUNTER, (d & 0xff00_0000) | self.counter)?;
        }
        let ns = now.duration_since(self.start).as_nanos();
        // A device that reports no frequency (the trace's CX-4 firmware) still needs a running clock: 1 GHz.
        let freq_khz = if freq_khz == 0 { 1_000_000 } else { freq_khz };
        let cycles = (ns * u128::from(freq_khz) / 1_000_000) as u64;
        bar.write_be32(seg::BYTE_INTERNAL_TIMER_H, (cycles >> 32) as u32)?;
        bar.write_be32(seg::BYTE_INTERNAL_TIMER_L, cycles as u32)?;
        let lo = bar.read_be32(seg::BYTE_CMDQ_ADDR_L_SZ)?;
        let ro = (LOG_CMDQ_SIZE << 4) | LOG_CMDQ_STRIDE;
        if lo & 0xff != ro {
            bar.write_be32(seg::BYTE_CMDQ_ADDR_L_SZ, (lo & !0xff) | ro)?;
        }
        Ok(cleared)
    }

    /// The command queue as the driver last programmed it (address read at doorbell time).
    pub fn cmdq(bar: &dyn Memory) -> Result<CmdqGeometry, OutOfRange> {
        let hi = bar.read_be32(seg::BYTE_CMDQ_ADDR_H)?;
        let lo = bar.read_be32(seg::BYTE_CMDQ_ADDR_L_SZ)?;
        Ok(CmdqGeometry {
            base: (u64::from(hi) << 32) | u64::from(lo & 0xffff_f000),
            entries: 1 << LOG_CMDQ_SIZE,
            stride: 1 << LOG_CMDQ_STRIDE,
        })
    }

    /// Takes the command doorbell vector, leaving 0: one atomic swap where the BAR has a write-1-to-set doorbell
    /// (hosted rigs, `Memory::write_one_to_set`), so no ring is lost; over a shared file a read then a write, so
    /// a second driver write can be lost (`docs/hca-model.md`, "Command timing and doorbells"). A zero register
    /// is not written.
    pub fn take_doorbell(bar: &dyn Memory) -> Result<u32, OutOfRange> {
        if bar.read_be32(seg::BYTE_CMD_DBELL)? == 0 {
            return Ok(0);
        }
        bar.swap_be32(seg::BYTE_CMD_DBELL, 0)
    }

    /// Whether the BAR's command doorbell keeps every write until the device takes it.
    pub fn doorbell_accumulates(bar: &dyn Memory) -> bool {
        bar.write_one_to_set(seg::BYTE_CMD_DBELL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_encoding_follows_tout_c() {
        assert_eq!(encode_timeout(Duration::from_millis(2000)), 2000);
        assert_eq!(encode_timeout(Duration::from_secs(60)), 60_000);
        assert_eq!(encode_timeout(Duration::from_secs(3600)), (1 << 29) | 3600);
    }
}
