//! Every lease slot's state changes, in an always-on fixed ring (like the driver's command ring): when, which
//! slot and generation, from which state to which, and why. It answers "why was slot 17 fenced" after the
//! fact: read over the control channel (LEASE_LOG) and printed by the image's panic dump.
//!
//! The ring holds [`CAPACITY`] records and allocates nothing after construction; the oldest are overwritten.
//! Each record has a sequence number (1, 2, ...); a reader keeps the sequence it wants next as its cursor and
//! learns how many records it missed when the ring wrapped past it.

use alloc::sync::Arc;

use crate::lease::{self, Phase, Slot};

/// Records the ring keeps.
pub const CAPACITY: usize = 1024;

/// The ring as the lease service and its readers (LEASE_LOG, the panic dump) share it. The service holds the
/// lock for one record's copy; the panic dump only tries it.
pub type SharedTransitions = Arc<spin::Mutex<Transitions>>;

/// The states, causes and record are the wire's (LEASE_LOG), declared once in `leasebox_proto`.
pub use leasebox_proto::{SlotState as State, Transition, TransitionCause as Why};

/// Why a slot fenced, from the fence's origin (`lease::origin`) and the steps that failed.
pub fn fenced_why(origin: u8, failed_mask: u32) -> Why {
    match origin {
        lease::origin::SWEEP => Why::SweepFailed,
        lease::origin::LEGACY => Why::UnwindFailed,
        _ if failed_mask & lease::step_bit::DEADLINE != 0 => Why::Deadline,
        _ => Why::TeardownFailed,
    }
}

/// A slot's state, the generation it holds (or gives next, when free) and its lease's failed steps.
pub fn of_slot<T>(s: &Slot<T>) -> (State, u32, u32) {
    match s {
        Slot::Free { next_generation: 0 } => (State::Retired, 0, 0),
        Slot::Free { next_generation } => (State::Free, *next_generation, 0),
        Slot::Fenced(f) => (State::Fenced, f.generation, f.failed_mask),
        Slot::Busy(l) => {
            let state = match l.phase {
                Phase::Building => State::Building,
                Phase::Granted { .. } => State::Granted,
                Phase::Active => State::Active,
                Phase::Fencing { .. } => State::Fencing,
                Phase::PendingDestroy { .. } => State::PendingDestroy,
                Phase::Sweeping => State::Sweeping,
                Phase::Unwinding => State::Unwinding,
            };
            (state, l.id.generation, l.failed_mask)
        }
    }
}

/// The ring.
pub struct Transitions {
    ring: [Option<Transition>; CAPACITY],
    /// The sequence number the next record gets.
    next: u64,
}

impl Default for Transitions {
    fn default() -> Self {
        Transitions { ring: [None; CAPACITY], next: 1 }
    }
}

impl core::fmt::Debug for Transitions {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Transitions").field("next", &self.next).finish_non_exhaustive()
    }
}

impl Transitions {
    pub fn shared() -> SharedTransitions {
        Arc::new(spin::Mutex::new(Transitions::default()))
    }

    /// Records one change; the oldest record goes when the ring is full.
    #[allow(clippy::too_many_arguments)]
    pub fn record(&mut self, at_us: u64, slot: u32, generation: u32, from: State, to: State, why: Why, mask: u32) {
        let seq = self.next;
        self.next += 1;
        let t = Transition { seq, at_us, slot, generation, from, to, why, failed_mask: mask };
        self.ring[(seq % CAPACITY as u64) as usize] = Some(t);
    }

    /// The sequence number the next record will get (a cursor that reads only what comes after now).
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The oldest sequence number still held (equal to `next_seq` when the ring is empty).
    pub fn oldest_seq(&self) -> u64 {
        self.next.saturating_sub(CAPACITY as u64).max(1)
    }

    /// Up to `max` records from sequence `cursor` on, oldest first, into `out`. Returns the cursor to ask with
    /// next and how many records from `cursor` on the ring no longer holds (it wrapped past the reader).
    /// Cursor 0 reads from the oldest record held.
    pub fn read(&self, cursor: u64, max: usize, mut out: impl FnMut(&Transition)) -> (u64, u64) {
        let oldest = self.oldest_seq();
        let start = cursor.max(oldest).min(self.next);
        let lost = if cursor == 0 { 0 } else { start - cursor.min(start) };
        let end = start.saturating_add(max as u64).min(self.next);
        for seq in start..end {
            if let Some(t) = &self.ring[(seq % CAPACITY as u64) as usize] {
                out(t);
            }
        }
        (end, lost)
    }

    /// The newest `n` records, newest first (the panic dump).
    pub fn last(&self, n: usize) -> impl Iterator<Item = &Transition> {
        let oldest = self.oldest_seq();
        let from = self.next.saturating_sub(n as u64).max(oldest);
        (from..self.next).rev().filter_map(|s| self.ring[(s % CAPACITY as u64) as usize].as_ref())
    }

    /// Every record held for `slot`, oldest first.
    pub fn of_slot(&self, slot: u32) -> impl Iterator<Item = &Transition> {
        (self.oldest_seq()..self.next)
            .filter_map(|s| self.ring[(s % CAPACITY as u64) as usize].as_ref())
            .filter(move |t| t.slot == slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn read_all(t: &Transitions, cursor: u64, max: usize) -> (Vec<Transition>, u64, u64) {
        let mut v = Vec::new();
        let (next, lost) = t.read(cursor, max, |r| v.push(*r));
        (v, next, lost)
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for c in 0..=255u8 {
            if let Some(s) = State::from_raw(c) {
                assert_eq!(s as u8, c);
            }
            if let Some(w) = Why::from_raw(c) {
                assert_eq!(w as u8, c);
            }
        }
        assert_eq!(State::from_raw(10), None);
        assert_eq!(Why::from_raw(0), None);
        assert_eq!(Why::from_raw(17), None);
    }

    #[test]
    fn the_ring_wraps_keeping_the_newest() {
        let mut t = Transitions::default();
        let n = CAPACITY as u64 + 10;
        for i in 0..n {
            t.record(i, i as u32, 1, State::Free, State::Building, Why::Alloc, 0);
        }
        assert_eq!(t.oldest_seq(), n + 1 - CAPACITY as u64);
        let (v, next, lost) = read_all(&t, 0, usize::MAX);
        assert_eq!(v.len(), CAPACITY);
        assert_eq!(v.first().unwrap().seq, 11);
        assert_eq!(v.last().unwrap().seq, n);
        assert_eq!(v.last().unwrap().slot, (n - 1) as u32);
        assert!(v.windows(2).all(|w| w[1].seq == w[0].seq + 1), "oldest first, no gaps");
        assert_eq!((next, lost), (n + 1, 0));
        // A reader whose cursor the ring passed hears how much it missed.
        let (v, _, lost) = read_all(&t, 3, 5);
        assert_eq!((v[0].seq, v.len(), lost), (11, 5, 8));
        let newest: Vec<u64> = t.last(3).map(|r| r.seq).collect();
        assert_eq!(newest, [n, n - 1, n - 2]);
    }

    #[test]
    fn a_reader_with_a_cursor_gets_everything_since_in_pages() {
        let mut t = Transitions::default();
        for i in 0..5 {
            t.record(i, 0, 1, State::Free, State::Building, Why::Alloc, 0);
        }
        let (_, mut cursor, _) = read_all(&t, 0, usize::MAX);
        assert_eq!(cursor, 6);
        for i in 0..7 {
            t.record(100 + i, 2, 3, State::Active, State::Fencing, Why::Revoke, 0);
        }
        let mut seen = Vec::new();
        loop {
            let (v, next, lost) = read_all(&t, cursor, 3);
            assert_eq!(lost, 0);
            if v.is_empty() {
                assert_eq!(next, cursor, "an empty page leaves the cursor where it is");
                break;
            }
            seen.extend(v);
            cursor = next;
        }
        assert_eq!(seen.iter().map(|r| r.at_us).collect::<Vec<_>>(), (100..107).collect::<Vec<_>>());
        // A cursor past the end reads nothing and stays at the end.
        let (v, next, lost) = read_all(&t, 1_000, 10);
        assert_eq!((v.len(), next, lost), (0, 13, 0));
    }

    #[test]
    fn a_line_names_the_states_the_cause_and_a_failed_step() {
        let mut t = Transitions::default();
        t.record(2_500_001, 17, 4, State::Fencing, State::Fenced, Why::TeardownFailed, 0x001);
        let line = alloc::format!("{}", t.last(1).next().unwrap());
        assert_eq!(line, "#1 2.500001 slot 17 gen 4 fencing -> fenced (teardown-failed) failed 0x001");
    }
}
