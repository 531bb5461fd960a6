//! How an idle poller of the model backs off, so a host shared with other work (a 2-core machine) stays
//! usable: spin briefly, then yield, then sleep with an interval that doubles up to [`MAX_IDLE_SLEEP`]; any
//! work starts again from spinning. A sleep is cut short when a command held for firmware time comes due
//! ([`Idle::until`]). The model process (`main.rs`) sleeps for the step; the hosted model thread
//! (`mlx5-hosted`) waits for the step on its wake-up descriptor and socket, so a doorbell or a datagram ends it
//! early.

use std::time::Duration;

/// The longest idle sleep: the worst-case added latency for work nobody announces (a timer of the model, a
/// frame on a wire the sleeper does not watch) after a quiet period. A command held for firmware time wakes
/// the loop when it comes due ([`Idle::until`]).
pub const MAX_IDLE_SLEEP: Duration = Duration::from_millis(1);
/// A sleep shorter than this is not taken (the OS rounds short sleeps up by tens of µs): the loop yields.
pub const MIN_SLEEP: Duration = Duration::from_micros(50);

/// Idle back-off: spin briefly, then yield, then sleep with exponential growth up to a cap
/// ([`MAX_IDLE_SLEEP`] by default); [`Backoff::reset`] on any work.
#[derive(Debug)]
pub struct Backoff {
    idle_rounds: u32,
    sleep: Duration,
    cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::capped(MAX_IDLE_SLEEP)
    }
}

impl Backoff {
    /// Sleeps grow up to `cap` (at least [`Backoff::FIRST_SLEEP`]): longer than [`MAX_IDLE_SLEEP`] only for a
    /// poller that every kind of its work wakes (the hosted threads: `mlx5-hosted`'s `idle`), where the cap
    /// bounds only the lateness of its own timers.
    pub fn capped(cap: Duration) -> Backoff {
        Backoff { idle_rounds: 0, sleep: Duration::ZERO, cap: cap.max(Self::FIRST_SLEEP) }
    }

    /// Idle rounds spent spinning, then yielding, before the first sleep.
    pub const SPINS: u32 = 64;
    pub const YIELDS: u32 = 16;
    /// The first sleep; each further idle round doubles it, up to [`MAX_IDLE_SLEEP`].
    pub const FIRST_SLEEP: Duration = Duration::from_micros(10);

    /// Work was done: the next idle round spins again.
    pub fn reset(&mut self) {
        self.idle_rounds = 0;
        self.sleep = Duration::ZERO;
    }

    /// What to do after an idle round.
    pub fn step(&mut self) -> Idle {
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        if self.idle_rounds <= Self::SPINS {
            Idle::Spin
        } else if self.idle_rounds <= Self::SPINS + Self::YIELDS {
            Idle::Yield
        } else {
            self.sleep = if self.sleep.is_zero() { Self::FIRST_SLEEP } else { (self.sleep * 2).min(self.cap) };
            Idle::Sleep(self.sleep)
        }
    }
}

/// One idle step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    Spin,
    Yield,
    Sleep(Duration),
}

impl Idle {
    /// The back-off's step, cut short so the loop is awake when a held command comes due in `due`: a sleep
    /// never runs past it, and one that would be shorter than [`MIN_SLEEP`] becomes a yield.
    pub fn until(self, due: Option<Duration>) -> Idle {
        match (self, due) {
            (Idle::Sleep(d), Some(due)) if due < d => {
                if due < MIN_SLEEP {
                    Idle::Yield
                } else {
                    Idle::Sleep(due - MIN_SLEEP / 2)
                }
            }
            (i, _) => i,
        }
    }

    /// Takes the step on this thread: a spin hint, a yield, or a plain sleep.
    pub fn take(self) {
        match self {
            Idle::Spin => std::hint::spin_loop(),
            Idle::Yield => std::thread::yield_now(),
            Idle::Sleep(d) => std::thread::sleep(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_yields_then_sleeps_up_to_the_cap() {
        let mut b = Backoff::default();
        let seq: Vec<Idle> = (0..200).map(|_| b.step()).collect();
        assert_eq!(seq[0], Idle::Spin);
        assert_eq!(seq[Backoff::SPINS as usize], Idle::Yield);
        assert_eq!(seq[(Backoff::SPINS + Backoff::YIELDS) as usize], Idle::Sleep(Backoff::FIRST_SLEEP));
        assert_eq!(seq[(Backoff::SPINS + Backoff::YIELDS) as usize + 1], Idle::Sleep(Backoff::FIRST_SLEEP * 2));
        assert_eq!(seq[199], Idle::Sleep(MAX_IDLE_SLEEP));
        b.reset();
        assert_eq!(b.step(), Idle::Spin);
        let mut long = Backoff::capped(Duration::from_millis(10));
        assert_eq!((0..300).map(|_| long.step()).last(), Some(Idle::Sleep(Duration::from_millis(10))));
    }

    #[test]
    fn an_idle_sleep_ends_by_the_next_due_command() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        assert_eq!(Idle::Sleep(ms(1)).until(None), Idle::Sleep(ms(1)));
        assert_eq!(Idle::Sleep(ms(1)).until(Some(ms(5))), Idle::Sleep(ms(1)), "due later: the back-off as is");
        let cut = Idle::Sleep(ms(1)).until(Some(us(400)));
        assert!(matches!(cut, Idle::Sleep(d) if d < us(400)), "{cut:?}");
        assert_eq!(Idle::Sleep(ms(1)).until(Some(us(20))), Idle::Yield, "too close to sleep");
        assert_eq!(Idle::Sleep(ms(1)).until(Some(Duration::ZERO)), Idle::Yield, "already due");
        assert_eq!(Idle::Spin.until(Some(Duration::ZERO)), Idle::Spin);
        assert_eq!(Idle::Yield.until(Some(us(1))), Idle::Yield);
    }
}
