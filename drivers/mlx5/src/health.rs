//! Health monitoring after Linux `core/health.c` (docs/reference/mlx5.md §g): every 2 s check the fatal sensors
//! (PCI gone: `fw_ver` reads all ones; `nic_interface` DISABLED or SW_RESET; a non-zero health `synd`), then
//! the health counter (BAR0 0x1010) — three unchanged polls in a row mean the firmware hung.
//!
//! Stricter than Linux, failing closed (docs/mlx5-driver.md, "Health"): Linux's `sensor_fw_synd_rfr` calls a
//! syndrome fatal only with `rfr` ("firmware requests reset") set, which stock firmware leaves 0, and its
//! poller only reports a syndrome or a stopped counter to devlink. Here any non-zero `synd` is fatal whatever
//! `rfr` says, and so is a stopped counter: a lease appliance must not keep granting on a firmware that has
//! asserted.
//!
//! A fatal verdict is final: the driver stops trusting the command interface (Linux
//! `mlx5_enter_error_state`), fails everything in flight and reports the state to its user.

use core::fmt;

use crate::initseg;
use crate::platform::Platform;

/// Linux `MAX_MISSES`.
pub const MAX_MISSES: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fatal {
    /// `fw_ver` reads 0xffffffff: the device no longer answers on PCI.
    PciLost,
    /// `nic_interface` reads DISABLED (1) or SW_RESET (7).
    NicInterface(u32),
    /// Health syndrome `synd` non-zero (`mlx5_ifc.h` health syndromes: 0x1 FW internal error ...), with `rfr`
    /// as read (fatal either way).
    Syndrome { synd: u8, ext_synd: u16, rfr: bool },
    /// The health counter did not move for [`MAX_MISSES`] polls.
    Hang { counter: u32 },
}

impl Fatal {
    /// The syndrome byte reported with aborted commands (0xff for verdicts without one).
    pub fn syndrome(&self) -> u8 {
        match self {
            Fatal::Syndrome { synd, .. } => *synd,
            _ => 0xff,
        }
    }
}

/// `mlx5_ifc.h:11026-11039` / `core/health.c:351-381`.
pub fn syndrome_name(synd: u8) -> &'static str {
    match synd {
        0x1 => "FW internal error",
        0x7 => "dead IRISC",
        0x8 => "HW fatal error",
        0x9 => "FW CRC error",
        0xa => "ICM fetch PCI error",
        0xb => "HW fatal error",
        0xc => "async EQ buffer overrun",
        0xd => "EQ error",
        0xe => "invalid EQ referenced",
        0xf => "FFSER error",
        0x10 => "high temperature",
        0x12 => "ICM PCI poisoned error",
        _ => "unknown health syndrome",
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fatal::PciLost => write!(f, "PCI communication lost (fw_ver reads 0xffffffff)"),
            Fatal::NicInterface(v) => write!(f, "nic_interface {v} (disabled or in SW reset)"),
            Fatal::Syndrome { synd, ext_synd, rfr } => write!(
                f,
                "health syndrome {synd:#x} ({}) ext_synd {ext_synd:#x} rfr {}",
                syndrome_name(*synd),
                u8::from(*rfr)
            ),
            Fatal::Hang { counter } => {
                write!(f, "health counter stuck at {counter:#x} for {MAX_MISSES} polls (firmware hang)")
            }
        }
    }
}

/// The poller's state.
#[derive(Clone, Debug)]
pub struct Health {
    interval_ns: u64,
    next_ns: u64,
    last_counter: Option<u32>,
    misses: u32,
    verdict: Option<Fatal>,
    pub polls: u64,
}

impl Health {
    pub fn new(now_ns: u64, interval_ms: u64) -> Health {
        let interval_ns = interval_ms.saturating_mul(1_000_000);
        Health { interval_ns, next_ns: now_ns + interval_ns, last_counter: None, misses: 0, verdict: None, polls: 0 }
    }

    pub fn verdict(&self) -> Option<Fatal> {
        self.verdict
    }

    /// Reads the fatal sensors now, whatever the interval (also used right before giving up on a command).
    pub fn sensors<P: Platform + ?Sized>(p: &P) -> Option<Fatal> {
        if p.bar_read32(initseg::HEALTH_FW_VER) == u32::MAX {
            return Some(Fatal::PciLost);
        }
        let nic = (p.bar_read32(initseg::CMDQ_ADDR_L_SZ) >> 8) & 7;
        if nic == initseg::NIC_IFC_DISABLED || nic == initseg::NIC_IFC_SW_RESET {
            return Some(Fatal::NicInterface(nic));
        }
        // Any syndrome, `rfr` or not (stock firmware's `rfr` is 0; Linux would wait for it).
        let dw = p.bar_read32(initseg::HEALTH_SYND_DW);
        let synd = (dw >> 16) as u8;
        if synd != 0 {
            let rfr = p.bar_read32(initseg::HEALTH_RFR_DW) >> 31 != 0;
            return Some(Fatal::Syndrome { synd, ext_synd: dw as u16, rfr });
        }
        None
    }

    /// One step: does nothing until the interval has passed; returns a new fatal verdict once.
    pub fn poll<P: Platform + ?Sized>(&mut self, p: &P, now_ns: u64) -> Option<Fatal> {
        if self.verdict.is_some() || now_ns < self.next_ns {
            return None;
        }
        self.next_ns = now_ns + self.interval_ns;
        self.polls += 1;
        let verdict = Self::sensors(p).or_else(|| {
            let counter = p.bar_read32(initseg::HEALTH_COUNTER) & 0xff_ffff;
            if self.last_counter == Some(counter) {
                self.misses += 1;
            } else {
                self.misses = 0;
            }
            self.last_counter = Some(counter);
            (self.misses >= MAX_MISSES).then_some(Fatal::Hang { counter })
        });
        self.verdict = verdict;
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::DmaBuf;
    use alloc::collections::BTreeMap;
    use spin::Mutex;

    /// BAR words only; no DMA.
    #[derive(Default)]
    struct Bar(Mutex<BTreeMap<usize, u32>>);

    impl Platform for Bar {
        fn bar_read32(&self, offset: usize) -> u32 {
            self.0.lock().get(&offset).copied().unwrap_or(0)
        }
        fn bar_write32(&self, offset: usize, value: u32) {
            self.0.lock().insert(offset, value);
        }
        fn dma_alloc(&self, _len: usize, _align: usize) -> Option<DmaBuf> {
            None
        }
        fn dma_free(&self, _buf: DmaBuf) {}
        fn dma_read(&self, _buf: DmaBuf, _offset: usize, _out: &mut [u8]) {}
        fn dma_write(&self, _buf: DmaBuf, _offset: usize, _data: &[u8]) {}
        fn now_ns(&self) -> u64 {
            0
        }
    }

    /// A health buffer with `synd` (byte 0x23d), `ext_synd` (0x23e) and `rfr` (bit 7 of byte 0x238).
    fn bar(synd: u8, rfr: bool) -> Bar {
        let b = Bar::default();
        b.bar_write32(initseg::HEALTH_FW_VER, 0x0010_0023);
        b.bar_write32(initseg::HEALTH_SYND_DW, (u32::from(synd) << 16) | 0x1234);
        b.bar_write32(initseg::HEALTH_RFR_DW, (u32::from(rfr) << 31) | (0x0a << 24));
        b
    }

    #[test]
    fn a_syndrome_is_fatal_whatever_rfr_says() {
        assert_eq!(Health::sensors(&bar(0, false)), None);
        assert_eq!(Health::sensors(&bar(0, true)), None, "rfr without a syndrome is nothing");
        assert_eq!(
            Health::sensors(&bar(0x1, false)),
            Some(Fatal::Syndrome { synd: 0x1, ext_synd: 0x1234, rfr: false }),
            "stock firmware's assert: rfr 0 (Linux's sensor would not fire)"
        );
        assert_eq!(Health::sensors(&bar(0xc, true)), Some(Fatal::Syndrome { synd: 0xc, ext_synd: 0x1234, rfr: true }));
        let s = format!("{}", Fatal::Syndrome { synd: 0xc, ext_synd: 0, rfr: false });
        assert!(s.contains("async EQ buffer overrun") && s.contains("rfr 0"), "{s}");
    }
}
