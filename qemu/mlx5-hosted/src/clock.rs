//! The hosted platform's clock ([`Platform::now_ns`](leasebox_mlx5::Platform::now_ns)): real time since the
//! platform was made, or — for deterministic tests over the in-process model — virtual time that moves only
//! when the driver waits ([`Platform::relax`](leasebox_mlx5::Platform::relax) adds one step) or when the test
//! moves it ([`Clock::advance`]). Every driver deadline is read from this clock, so with virtual time a wait
//! ends after a fixed number of passes, whatever the machine's load.
//!
//! The model keeps its own real-time timers (health counter, firmware time, `delay` faults): a test on virtual
//! time uses `ModelConfig::instant()` (no command latency: the default firmware timing would hold commands
//! for real milliseconds while the driver's virtual deadlines race ahead), adds no `Delay` faults, and turns
//! the driver's health watch off or keeps it within the model's real health period.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::HostedPlatform;

/// Real or virtual monotonic nanoseconds. Virtual mode is one-way: once on, the clock never reads real time
/// again, so it never goes back.
pub struct Clock {
    start: Instant,
    /// Nanoseconds one `relax` moves virtual time on; 0 = real time.
    step_ns: AtomicU64,
    /// Virtual now (nanoseconds), when `step_ns` is set.
    virtual_ns: AtomicU64,
}

impl Clock {
    /// A real clock counting from `start`.
    pub fn starting(start: Instant) -> Clock {
        Clock { start, step_ns: AtomicU64::new(0), virtual_ns: AtomicU64::new(0) }
    }

    pub fn now_ns(&self) -> u64 {
        if self.is_virtual() { self.virtual_ns.load(Ordering::Acquire) } else { self.start.elapsed().as_nanos() as u64 }
    }

    /// Switches to virtual time from the current reading; from now on each `relax` moves it on by `step`
    /// (at least 1 ns, so every driver wait still ends).
    pub fn go_virtual(&self, step: Duration) {
        if !self.is_virtual() {
            self.virtual_ns.store(self.now_ns(), Ordering::Release);
        }
        self.step_ns.store((step.as_nanos() as u64).max(1), Ordering::Release);
    }

    pub fn is_virtual(&self) -> bool {
        self.step_ns.load(Ordering::Acquire) != 0
    }

    /// Moves virtual time on by `d`; returns false (and does nothing) on a real clock.
    pub fn advance(&self, d: Duration) -> bool {
        if !self.is_virtual() {
            return false;
        }
        self.virtual_ns.fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
        true
    }

    /// One `relax`: a virtual clock moves on by its step.
    pub(crate) fn relaxed(&self) {
        let step = self.step_ns.load(Ordering::Acquire);
        if step != 0 {
            self.virtual_ns.fetch_add(step, Ordering::AcqRel);
        }
    }
}

impl HostedPlatform {
    /// The clock behind `now_ns` (tests switch it to virtual time and move it on).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasebox_mlx5::Platform;
    use leasebox_mlx5::platform::Deadline;
    use mlx5_model::ModelConfig;

    #[test]
    fn virtual_time_moves_only_by_relax_and_advance() {
        let p = HostedPlatform::with_model(ModelConfig::instant(), 4 << 20, crate::ModelMode::InProcess);
        assert!(!p.clock().advance(Duration::from_secs(1)), "a real clock cannot be moved");
        p.clock().go_virtual(Duration::from_micros(100));
        let t0 = p.now_ns();
        assert_eq!(p.now_ns(), t0, "no time passes by itself");
        let d = Deadline::after(&p, 1);
        for _ in 0..9 {
            p.relax();
        }
        assert_eq!(p.now_ns(), t0 + 900_000);
        assert!(!d.passed(&p));
        p.relax();
        assert!(d.passed(&p), "ten steps of 100 µs are 1 ms");
        assert!(p.clock().advance(Duration::from_secs(2)));
        assert_eq!(p.now_ns(), t0 + 2_001_000_000);
    }
}
