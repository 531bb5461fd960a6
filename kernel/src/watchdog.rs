//! The role watchdog (docs/architecture.md, "Cores and roles"): every core counts the passes of its role loop;
//! every core with roles looks at the others' counts now and then, and a core whose count has not moved for
//! the limit (`watchdog_ms=`, 5 s by default) is stuck — the core that notices panics, so the fatal path
//! fails closed (`arch::fail_closed`) as for any other crash. Interrupts are off everywhere, so no core can be
//! stopped from outside; a core that is only slow (a long scrub) still passes its loop within the limit.
//!
//! This is the decision only, on numbers the caller reads (pass counts, nanoseconds), so it runs in host tests.

/// What one core knows of the others: the last count it saw of each and when that count last moved.
#[derive(Clone, Debug)]
pub struct Watchdog<const N: usize> {
    last: [Option<(u64, u64)>; N],
    limit_ns: u64,
}

/// A core found stuck: its index and how long its count has not moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stuck {
    pub core: usize,
    pub for_ns: u64,
}

impl<const N: usize> Watchdog<N> {
    /// A watchdog with `limit_ns` of patience; 0 disables it.
    pub const fn new(limit_ns: u64) -> Self {
        Watchdog { last: [None; N], limit_ns }
    }

    /// Looks at every core `count` reports (`None`: not watched — offline, or the caller itself) at `now_ns`;
    /// the first one whose count has not moved for longer than the limit.
    pub fn check(&mut self, now_ns: u64, count: impl Fn(usize) -> Option<u64>) -> Option<Stuck> {
        if self.limit_ns == 0 {
            return None;
        }
        let mut stuck = None;
        for (core, seen) in self.last.iter_mut().enumerate() {
            let Some(c) = count(core) else {
                *seen = None;
                continue;
            };
            match *seen {
                Some((last, since)) if last == c => {
                    let for_ns = now_ns.saturating_sub(since);
                    if for_ns > self.limit_ns && stuck.is_none() {
                        stuck = Some(Stuck { core, for_ns });
                    }
                }
                _ => *seen = Some((c, now_ns)),
            }
        }
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_core_whose_count_stops_is_stuck_after_the_limit_and_not_before() {
        let mut w = Watchdog::<3>::new(5000 * MS);
        let counts = core::cell::Cell::new([10u64, 20, 30]);
        let of = |c: usize| if c == 0 { None } else { Some(counts.get()[c]) };
        assert_eq!(w.check(0, of), None);
        // Core 1 keeps going, core 2 stops.
        for t in 1..=5 {
            let mut c = counts.get();
            c[1] += 1;
            counts.set(c);
            assert_eq!(w.check(t * 1000 * MS, of), None, "{t} s: within the limit");
        }
        let mut c = counts.get();
        c[1] += 1;
        counts.set(c);
        assert_eq!(w.check(5001 * MS, of), Some(Stuck { core: 2, for_ns: 5001 * MS }));
        // It moves again: no longer stuck, and its patience starts over.
        let mut c = counts.get();
        c[1] += 1;
        c[2] += 1;
        counts.set(c);
        assert_eq!(w.check(5002 * MS, of), None);
        assert_eq!(w.check(9000 * MS, of), None);
        assert_eq!(w.check(10_003 * MS, of).map(|s| s.core), Some(1), "both stopped: the first one");
    }

    #[test]
    fn unwatched_cores_and_a_disabled_watchdog_never_fire() {
        let mut w = Watchdog::<2>::new(5 * MS);
        assert_eq!(w.check(0, |_| None), None);
        assert_eq!(w.check(u64::MAX, |_| None), None, "offline cores are not watched");
        // A core that comes online later gets the whole limit from then on.
        assert_eq!(w.check(100 * MS, |c| (c == 1).then_some(7)), None);
        assert_eq!(w.check(104 * MS, |c| (c == 1).then_some(7)), None);
        assert_eq!(w.check(106 * MS, |c| (c == 1).then_some(7)), Some(Stuck { core: 1, for_ns: 6 * MS }));
        let mut off = Watchdog::<2>::new(0);
        assert_eq!(off.check(0, |_| Some(1)), None);
        assert_eq!(off.check(u64::MAX, |_| Some(1)), None, "watchdog_ms=0 disables it");
    }
}
