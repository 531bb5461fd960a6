//! Monotonic time on the TSC: [`Instant`] (a TSC reading) and [`Deadline`] (an instant after which a wait
//! gives up). Every wait in the kernel and the drivers takes a `Deadline`: nothing polls hardware forever.
//!
//! The TSC rate is measured once at boot (`arch::tsc`) and published with [`set_tsc_hz`]; the conversions
//! here are plain integer arithmetic, tested on the host.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;

static TSC_HZ: AtomicU64 = AtomicU64::new(0);
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Publishes the calibrated TSC frequency and the TSC value counted as time zero (kernel entry).
pub fn set_tsc_hz(hz: u64, epoch_ticks: u64) {
    EPOCH.store(epoch_ticks, Ordering::Relaxed);
    TSC_HZ.store(hz, Ordering::Release);
}

/// The calibrated TSC frequency in Hz, 0 before calibration.
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Ordering::Acquire)
}

/// Converts a tick count at `hz` to a duration (saturating; 0 Hz gives zero).
pub fn ticks_to_duration(ticks: u64, hz: u64) -> Duration {
    if hz == 0 {
        return Duration::ZERO;
    }
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Converts a duration to ticks at `hz` (rounding up, saturating).
pub fn duration_to_ticks(d: Duration, hz: u64) -> u64 {
    let t = (d.as_nanos() * u128::from(hz)).div_ceil(1_000_000_000);
    u64::try_from(t).unwrap_or(u64::MAX)
}

/// A point in time: a TSC reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

impl Instant {
    pub const fn from_ticks(ticks: u64) -> Self {
        Instant(ticks)
    }
    pub const fn ticks(self) -> u64 {
        self.0
    }

    /// Now, from the TSC.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code, reason = "RDTSC, which the host-side unit tests use too (no `arch` there)")]
    pub fn now() -> Self {
        // SAFETY: RDTSC only reads the time-stamp counter.
        Instant(unsafe { core::arch::x86_64::_rdtsc() })
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn duration_since(self, earlier: Instant) -> Duration {
        ticks_to_duration(self.0.saturating_sub(earlier.0), tsc_hz())
    }

    /// Time since this instant.
    #[cfg(target_arch = "x86_64")]
    pub fn elapsed(self) -> Duration {
        Instant::now().duration_since(self)
    }

    /// This instant plus `d` (saturating).
    pub fn plus(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_to_ticks(d, tsc_hz())))
    }

    /// Time since kernel entry.
    pub fn since_boot(self) -> Duration {
        self.duration_since(Instant(EPOCH.load(Ordering::Relaxed)))
    }
}

/// The instant after which a wait gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    pub const fn at(at: Instant) -> Self {
        Deadline { at }
    }

    /// `d` from now.
    #[cfg(target_arch = "x86_64")]
    pub fn after(d: Duration) -> Self {
        Deadline { at: Instant::now().plus(d) }
    }

    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Whether the deadline has passed at `now`.
    pub fn expired_at(&self, now: Instant) -> bool {
        now >= self.at
    }

    /// Whether the deadline has passed.
    #[cfg(target_arch = "x86_64")]
    pub fn expired(&self) -> bool {
        self.expired_at(Instant::now())
    }

    /// Time left at `now` (zero once expired).
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.at.duration_since(now)
    }
}

/// Spins (with the CPU's pause hint) until `cond` holds or the deadline passes; returns whether `cond`
/// held. The one polling loop every hardware wait should use.
#[cfg(target_arch = "x86_64")]
pub fn wait_until(deadline: Deadline, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if deadline.expired() {
            return cond();
        }
        core::hint::spin_loop();
    }
}

/// Busy-waits for `d`.
#[cfg(target_arch = "x86_64")]
pub fn delay(d: Duration) {
    let dl = Deadline::after(d);
    while !dl.expired() {
        core::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_at_common_rates() {
        for hz in [1_000_000u64, 2_100_000_000, 3_000_000_000] {
            let d = Duration::from_millis(1500);
            let t = duration_to_ticks(d, hz);
            assert_eq!(t, hz * 3 / 2);
            assert_eq!(ticks_to_duration(t, hz), d);
        }
        assert_eq!(duration_to_ticks(Duration::from_nanos(1), 3_000_000_000), 3);
        assert_eq!(duration_to_ticks(Duration::from_nanos(1), 1_000_000), 1, "rounds up: never a zero wait");
        assert_eq!(ticks_to_duration(123, 0), Duration::ZERO);
        assert_eq!(duration_to_ticks(Duration::MAX, 3_000_000_000), u64::MAX);
    }

    #[test]
    fn deadline_compares_instants() {
        let dl = Deadline::at(Instant::from_ticks(1000));
        assert!(!dl.expired_at(Instant::from_ticks(999)));
        assert!(dl.expired_at(Instant::from_ticks(1000)));
        assert!(dl.expired_at(Instant::from_ticks(5000)));
        assert_eq!(Instant::from_ticks(5).duration_since(Instant::from_ticks(9)), Duration::ZERO);
    }
}
