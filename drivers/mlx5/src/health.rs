//! Health monitoring after Linux `core/health.c` (docs/reference/mlx5.md §g): every 2 s check the fatal sensors
//! (PCI gone: `fw_ver` reads all ones; `nic_interface` DISABLED or SW_RESET; a health syndrome with `rfr`),
//! then the health syndrome and the health counter (BAR0 0x1010).
//!
//! Classified as Linux does, failing closed where isolation is at stake (docs/mlx5-driver.md, "Health"):
//! Linux calls a syndrome fatal only with `rfr` ("firmware requests reset") set, and only reports (devlink's
//! `fw` reporter) a syndrome without it and a stopped counter. Here a syndrome without `rfr` is reported and
//! counted only when it leaves the protection state intact — a firmware assert (0x1) and high temperature
//! (0x10), [`Class::Reported`]; every other syndrome, a syndrome this driver does not know, and a counter
//! that stopped for [`MAX_MISSES`] polls are fatal whatever `rfr` says: a lease appliance must not keep
//! granting on hardware whose ICM, event queue or firmware can no longer be trusted to enforce a revoke. A
//! reported syndrome is watched on: a fatal state after it (`rfr` set, `nic_interface`, PCI, a stopped
//! counter, another syndrome, or a command the firmware did not complete in time) is fatal.
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
    /// A health syndrome [`classify`] calls fatal, with `rfr` as read.
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

/// Health syndromes (Linux `health.c` `MLX5_HEALTH_SYNDR_*`, `mlx5_ifc.h` `initial_seg` health syndromes).
pub const SYND_FW_ERR: u8 = 0x1;
pub const SYND_HIGH_TEMP: u8 = 0x10;

/// The syndrome's name, as Linux `hsynd_str` describes it (0x12 from `mlx5_ifc.h`).
pub fn syndrome_name(synd: u8) -> &'static str {
    match synd {
        0x1 => "firmware internal error",
        0x7 => "irisc not responding",
        0x8 => "unrecoverable hardware error",
        0x9 => "firmware CRC error",
        0xa => "ICM fetch PCI error",
        0xb => "HW fatal error",
        0xc => "async EQ buffer overrun",
        0xd => "EQ error",
        0xe => "invalid EQ referenced",
        0xf => "FFSER error",
        0x10 => "high temperature",
        0x12 => "ICM PCI poisoned error",
        _ => "unrecognized error",
    }
}

/// What a health syndrome means to this driver (docs/mlx5-driver.md, "Health", the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Reported and counted; the HCA stays in service while no fatal state follows.
    Reported,
    /// Fatal: the HCA is taken out of service.
    Fatal,
}

/// Classifies `synd` (non-zero) with `rfr` as read. With `rfr` set every syndrome is fatal (Linux
/// `sensor_fw_synd_rfr`). Without it Linux only reports; here only a firmware assert and high temperature are
/// reported — the firmware goes on running and the device's protection state (ICM, MKeys, QP contexts) is not
/// in doubt — and everything else fails closed: hardware and ICM errors (0x7–0xb, 0xf, 0x12) put in doubt the
/// state that enforces isolation, the EQ errors (0xc–0xe) break the queue page requests and QP errors arrive
/// on, and an unknown syndrome is not assumed harmless.
pub fn classify(synd: u8, rfr: bool) -> Class {
    match synd {
        SYND_FW_ERR | SYND_HIGH_TEMP if !rfr => Class::Reported,
        _ => Class::Fatal,
    }
}

/// The syslog level of the health buffer's `rfr_severity` byte (Linux `mlx5_health_get_severity`): bits 2:0
/// when bit 3 says they are valid, else 3 (error).
pub fn severity(rfr_severity: u8) -> u8 {
    if rfr_severity & 0x8 != 0 { rfr_severity & 0x7 } else { 3 }
}

/// The name of a syslog level (Linux `mlx5_loglevel_str`).
pub fn severity_name(level: u8) -> &'static str {
    match level {
        0 => "EMERGENCY",
        1 => "ALERT",
        2 => "CRITICAL",
        3 => "ERROR",
        4 => "WARNING",
        5 => "NOTICE",
        6 => "INFO",
        7 => "DEBUG",
        _ => "unknown",
    }
}

/// A syndrome that was reported, not fatal ([`Class::Reported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub synd: u8,
    pub ext_synd: u16,
    /// The syslog level from `rfr_severity` ([`severity`]).
    pub severity: u8,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "health syndrome {:#x} ({}) ext_synd {:#x} severity {} ({}), reported: not fatal while the firmware runs",
            self.synd,
            syndrome_name(self.synd),
            self.ext_synd,
            self.severity,
            severity_name(self.severity)
        )
    }
}

/// What the sensors read at one poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    Healthy,
    Reported(Report),
    Fatal(Fatal),
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
    /// Reported syndromes: each change of the syndrome to a reported one counts once (Linux reports a syndrome
    /// when it differs from the previous poll's).
    pub reports: u64,
    last_report: Option<Report>,
    prev_synd: u8,
}

impl Health {
    pub fn new(now_ns: u64, interval_ms: u64) -> Health {
        let interval_ns = interval_ms.saturating_mul(1_000_000);
        Health {
            interval_ns,
            next_ns: now_ns + interval_ns,
            last_counter: None,
            misses: 0,
            verdict: None,
            polls: 0,
            reports: 0,
            last_report: None,
            prev_synd: 0,
        }
    }

    pub fn verdict(&self) -> Option<Fatal> {
        self.verdict
    }

    /// A command the firmware did not complete in time: fatal while a reported syndrome is showing (the
    /// firmware asserted and has stopped carrying out commands — a revoke among them); nothing otherwise (a
    /// timeout alone stays the command's error). Returns the new verdict once.
    pub fn command_timed_out(&mut self) -> Option<Fatal> {
        if self.verdict.is_some() || self.prev_synd == 0 {
            return None;
        }
        let r = self.last_report?;
        self.verdict = Some(Fatal::Syndrome { synd: r.synd, ext_synd: r.ext_synd, rfr: false });
        self.verdict
    }

    /// The newest reported (not fatal) syndrome, if any was.
    pub fn last_report(&self) -> Option<Report> {
        self.last_report
    }

    /// Reads the sensors now, whatever the interval.
    pub fn read<P: Platform + ?Sized>(p: &P) -> Reading {
        if p.bar_read32(initseg::HEALTH_FW_VER) == u32::MAX {
            return Reading::Fatal(Fatal::PciLost);
        }
        let nic = (p.bar_read32(initseg::CMDQ_ADDR_L_SZ) >> 8) & 7;
        if nic == initseg::NIC_IFC_DISABLED || nic == initseg::NIC_IFC_SW_RESET {
            return Reading::Fatal(Fatal::NicInterface(nic));
        }
        let dw = p.bar_read32(initseg::HEALTH_SYND_DW);
        let synd = (dw >> 16) as u8;
        if synd == 0 {
            return Reading::Healthy;
        }
        let rfr_severity = (p.bar_read32(initseg::HEALTH_RFR_DW) >> 24) as u8;
        let rfr = rfr_severity >> 7 != 0;
        let ext_synd = dw as u16;
        match classify(synd, rfr) {
            Class::Fatal => Reading::Fatal(Fatal::Syndrome { synd, ext_synd, rfr }),
            Class::Reported => Reading::Reported(Report { synd, ext_synd, severity: severity(rfr_severity) }),
        }
    }

    /// The fatal sensors only: [`Health::read`] without what is merely reported.
    pub fn sensors<P: Platform + ?Sized>(p: &P) -> Option<Fatal> {
        match Self::read(p) {
            Reading::Fatal(f) => Some(f),
            _ => None,
        }
    }

    /// One step: does nothing until the interval has passed; returns a new fatal verdict once. A newly
    /// reported syndrome is logged at its severity and counted in [`Health::reports`].
    pub fn poll<P: Platform + ?Sized>(&mut self, p: &P, now_ns: u64) -> Option<Fatal> {
        if self.verdict.is_some() || now_ns < self.next_ns {
            return None;
        }
        self.next_ns = now_ns + self.interval_ns;
        self.polls += 1;
        let reading = Self::read(p);
        if let Reading::Fatal(f) = reading {
            self.verdict = Some(f);
            return self.verdict;
        }
        let counter = p.bar_read32(initseg::HEALTH_COUNTER) & 0xff_ffff;
        if self.last_counter == Some(counter) {
            self.misses += 1;
        } else {
            self.misses = 0;
        }
        self.last_counter = Some(counter);
        if self.misses >= MAX_MISSES {
            self.verdict = Some(Fatal::Hang { counter });
            return self.verdict;
        }
        match reading {
            Reading::Reported(r) if r.synd != self.prev_synd => {
                self.prev_synd = r.synd;
                self.reports += 1;
                self.last_report = Some(r);
                if r.severity <= 3 {
                    log::error!("mlx5: {r}");
                } else {
                    log::warn!("mlx5: {r}");
                }
            }
            Reading::Reported(_) => {}
            _ => self.prev_synd = 0,
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Fake;

    /// A health buffer with `synd` (byte 0x23d), `ext_synd` (0x23e) and `rfr` (bit 7 of byte 0x238).
    fn bar(synd: u8, rfr: bool) -> Fake {
        let b = Fake::new();
        b.set_bar(initseg::HEALTH_FW_VER, 0x0010_0023);
        b.set_bar(initseg::HEALTH_SYND_DW, (u32::from(synd) << 16) | 0x1234);
        b.set_bar(initseg::HEALTH_RFR_DW, (u32::from(rfr) << 31) | (0x0a << 24));
        b
    }

    /// Every syndrome Linux names, without and with `rfr`: only the assert and high temperature are reported
    /// (and only without `rfr`); the rest, and syndromes nobody names, are fatal.
    #[test]
    fn syndromes_are_classified_as_the_table_says() {
        for synd in 1..=u8::MAX {
            let want = if synd == 0x1 || synd == 0x10 { Class::Reported } else { Class::Fatal };
            assert_eq!(classify(synd, false), want, "synd {synd:#x} rfr 0");
            assert_eq!(classify(synd, true), Class::Fatal, "synd {synd:#x} rfr 1 (Linux's fatal sensor)");
        }
        assert_eq!(syndrome_name(0x13), "unrecognized error");
        assert_eq!(syndrome_name(0xc), "async EQ buffer overrun");
    }

    #[test]
    fn severity_is_valid_only_with_bit_3() {
        assert_eq!(severity(0x0a), 2, "valid, CRITICAL");
        assert_eq!(severity(0x8c), 4, "rfr does not change the level");
        assert_eq!(severity(0x02), 3, "not valid: ERROR");
        assert_eq!(severity_name(severity(0x0e)), "INFO");
    }

    #[test]
    fn sensors_report_an_assert_and_fail_on_the_rest() {
        assert_eq!(Health::read(&bar(0, false)), Reading::Healthy);
        assert_eq!(Health::read(&bar(0, true)), Reading::Healthy, "rfr without a syndrome is nothing");
        assert_eq!(
            Health::read(&bar(0x1, false)),
            Reading::Reported(Report { synd: 0x1, ext_synd: 0x1234, severity: 2 }),
            "stock firmware's assert, rfr 0: reported as Linux's `fw` reporter does"
        );
        assert_eq!(Health::sensors(&bar(0x1, false)), None);
        assert_eq!(
            Health::sensors(&bar(0x1, true)),
            Some(Fatal::Syndrome { synd: 0x1, ext_synd: 0x1234, rfr: true }),
            "the firmware requests a reset: fatal, as in Linux"
        );
        assert_eq!(
            Health::sensors(&bar(0x8, false)),
            Some(Fatal::Syndrome { synd: 0x8, ext_synd: 0x1234, rfr: false }),
            "an unrecoverable hardware error is fatal without rfr (stricter than Linux)"
        );
        assert_eq!(Health::sensors(&bar(0xc, true)), Some(Fatal::Syndrome { synd: 0xc, ext_synd: 0x1234, rfr: true }));
        let s = format!("{}", Fatal::Syndrome { synd: 0xc, ext_synd: 0, rfr: false });
        assert!(s.contains("async EQ buffer overrun") && s.contains("rfr 0"), "{s}");
        let r = format!("{}", Report { synd: 0x10, ext_synd: 0, severity: 4 });
        assert!(r.contains("high temperature") && r.contains("WARNING"), "{r}");
    }

    /// Advances the health counter (BAR0 0x1010) by one.
    fn tick(b: &Fake) {
        b.set_bar(initseg::HEALTH_COUNTER, b.bar(initseg::HEALTH_COUNTER) + 1);
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_reported_assert_is_counted_once_and_a_fatal_state_after_it_is_fatal() {
        let b = bar(0, false);
        let mut h = Health::new(0, 10);
        let mut t = 0;
        let mut step = |h: &mut Health, b: &Fake| {
            t += 10 * MS;
            tick(b);
            h.poll(b, t)
        };
        assert_eq!(step(&mut h, &b), None);
        // The firmware asserts (rfr 0) and goes on running: reported once, however many polls see it.
        b.set_bar(initseg::HEALTH_SYND_DW, (0x1 << 16) | 0x55);
        for _ in 0..5 {
            assert_eq!(step(&mut h, &b), None, "an assert alone is not fatal");
        }
        assert_eq!(h.reports, 1);
        assert_eq!(h.last_report(), Some(Report { synd: 0x1, ext_synd: 0x55, severity: 2 }));
        assert_eq!(h.verdict(), None);
        // A different reported syndrome counts again.
        b.set_bar(initseg::HEALTH_SYND_DW, 0x10 << 16);
        assert_eq!(step(&mut h, &b), None);
        assert_eq!(h.reports, 2);
        // Then the firmware requests a reset: fatal.
        b.set_bar(initseg::HEALTH_RFR_DW, (1 << 31) | (0x0a << 24));
        assert_eq!(step(&mut h, &b), Some(Fatal::Syndrome { synd: 0x10, ext_synd: 0, rfr: true }));
        assert_eq!(h.verdict(), Some(Fatal::Syndrome { synd: 0x10, ext_synd: 0, rfr: true }));
        assert_eq!(step(&mut h, &b), None, "a verdict is returned once");
    }

    #[test]
    fn a_command_timeout_after_a_reported_assert_is_fatal() {
        let b = bar(0, false);
        let mut h = Health::new(0, 10);
        tick(&b);
        assert_eq!(h.poll(&b, 10 * MS), None);
        assert_eq!(h.command_timed_out(), None, "a timeout alone is the command's error");
        b.set_bar(initseg::HEALTH_SYND_DW, (0x1 << 16) | 0x77);
        tick(&b);
        assert_eq!(h.poll(&b, 20 * MS), None);
        assert_eq!(h.reports, 1);
        assert_eq!(h.command_timed_out(), Some(Fatal::Syndrome { synd: 0x1, ext_synd: 0x77, rfr: false }));
        assert_eq!(h.command_timed_out(), None, "once");
        assert_eq!(h.poll(&b, 30 * MS), None, "the verdict is final");
    }

    #[test]
    fn a_reported_assert_then_a_stopped_counter_is_a_hang() {
        let b = bar(0x1, false);
        let mut h = Health::new(0, 10);
        let mut t = 10 * MS;
        tick(&b);
        assert_eq!(h.poll(&b, t), None);
        assert_eq!(h.reports, 1);
        // The counter stops: three unchanged polls in a row.
        for i in 0..MAX_MISSES {
            t += 10 * MS;
            let v = h.poll(&b, t);
            if i + 1 < MAX_MISSES {
                assert_eq!(v, None, "poll {i}");
            } else {
                assert_eq!(v, Some(Fatal::Hang { counter: 1 }));
            }
        }
        assert_eq!(h.reports, 1);
    }

    #[test]
    fn a_nic_interface_in_reset_is_fatal_before_any_syndrome() {
        let b = bar(0x1, false);
        b.set_bar(initseg::CMDQ_ADDR_L_SZ, initseg::NIC_IFC_SW_RESET << 8);
        assert_eq!(Health::read(&b), Reading::Fatal(Fatal::NicInterface(7)));
        b.set_bar(initseg::HEALTH_FW_VER, u32::MAX);
        assert_eq!(Health::read(&b), Reading::Fatal(Fatal::PciLost));
    }
}
