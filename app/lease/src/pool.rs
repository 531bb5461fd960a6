//! The lease pool: fixed-size extents of DRAM handed out whole, from runs wherever free memory was at boot (no
//! run needs to touch the next). Freed extents go to the back of the queue, so
//! memory a lease just gave back is the last to be handed out again; extents of a fenced slot never come
//! back (they are counted as quarantined).
//!
//! Only zeroed extents are ever handed out. Memory that may hold data — a freed lease's, and at boot the part
//! of the pool the platform could not give cleared — waits in the scrub queue, which the service works off a
//! slice at a time between its other work ([`ExtentPool::scrub_slice`]); an extent joins the free queue only
//! once all of it is zero.

use alloc::collections::{BTreeSet, VecDeque};
use alloc::vec::Vec;
use core::ops::Range;

#[derive(Debug)]
pub struct ExtentPool {
    free: VecDeque<u64>,
    /// Extents waiting to be zeroed, oldest first, and how many bytes of the first are zero already.
    dirty: VecDeque<u64>,
    front_done: u64,
    /// Of `dirty`, how many (at its front) are the pool's own from boot, never handed out yet.
    unprepared: usize,
    extent: u64,
    total: usize,
    quarantined: usize,
}

impl ExtentPool {
    /// The extents of `runs` (each a whole number of `extent`s), lowest run first; those in `uncleared` may hold
    /// data and are scrubbed before they are first handed out.
    pub fn new(runs: &[Range<u64>], extent: u64, uncleared: &[u64]) -> ExtentPool {
        let uncleared: BTreeSet<u64> = uncleared.iter().copied().collect();
        let all = runs.iter().flat_map(|r| r.clone().step_by(extent as usize));
        let (mut free, mut dirty) = (VecDeque::new(), VecDeque::new());
        for e in all {
            if uncleared.contains(&e) { dirty.push_back(e) } else { free.push_back(e) }
        }
        let (total, unprepared) = (free.len() + dirty.len(), dirty.len());
        ExtentPool { free, dirty, front_done: 0, unprepared, extent, total, quarantined: 0 }
    }

    /// `n` zeroed extents, or `None` (nothing taken) when fewer are free.
    pub fn take(&mut self, n: usize) -> Option<Vec<u64>> {
        if n == 0 || n > self.free.len() {
            return None;
        }
        Some(self.free.drain(..n).collect())
    }

    /// Extents back that were never written (an ALLOC that failed before its lease existed): free at once.
    pub fn give_back(&mut self, extents: &[u64]) {
        self.free.extend(extents.iter().copied());
    }

    /// A freed lease's extents: they join the scrub queue and become free once zeroed.
    pub fn retire(&mut self, extents: &[u64]) {
        self.dirty.extend(extents.iter().copied());
    }

    /// Zeroes the next slice of the scrub queue, at most `max` bytes and never past the end of its extent,
    /// through `zero(addr, len)`; an extent whose last byte this zeroes becomes free. Returns the bytes zeroed,
    /// or `None` when nothing waits.
    pub fn scrub_slice(&mut self, max: u64, zero: impl FnOnce(u64, u64)) -> Option<u64> {
        let &e = self.dirty.front()?;
        let n = max.max(1).min(self.extent - self.front_done);
        zero(e + self.front_done, n);
        self.front_done += n;
        if self.front_done == self.extent {
            self.dirty.pop_front();
            self.front_done = 0;
            self.free.push_back(e);
            self.unprepared = self.unprepared.saturating_sub(1);
        }
        Some(n)
    }

    /// `n` extents of a fenced slot will never come back.
    pub fn quarantine(&mut self, n: usize) {
        self.quarantined += n;
    }

    pub fn free_extents(&self) -> usize {
        self.free.len()
    }

    /// Bytes ready to lend: free and zeroed.
    pub fn free_bytes(&self) -> u64 {
        self.free.len() as u64 * self.extent
    }

    /// Bytes waiting to be zeroed.
    pub fn scrubbing_bytes(&self) -> u64 {
        self.dirty.len() as u64 * self.extent - self.front_done
    }

    /// Bytes of the pool's own, from boot, not prepared yet (0 once the pool is ready whole).
    pub fn unprepared_bytes(&self) -> u64 {
        (self.unprepared as u64 * self.extent).saturating_sub(if self.unprepared > 0 { self.front_done } else { 0 })
    }

    /// The whole pool in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total as u64 * self.extent
    }

    pub fn quarantined_extents(&self) -> usize {
        self.quarantined
    }

    /// The free extents, next to be handed out first.
    pub fn free_list(&self) -> impl Iterator<Item = u64> + '_ {
        self.free.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_reuse_and_quarantine() {
        let run = 0x1000_0000..0x1000_0000 + (4 << 21);
        let mut p = ExtentPool::new(core::slice::from_ref(&run), 2 << 20, &[]);
        let a = p.take(2).unwrap();
        assert_eq!(a, [0x1000_0000, 0x1020_0000]);
        assert!(p.take(3).is_none(), "nothing taken when not enough");
        assert_eq!(p.free_extents(), 2);
        p.give_back(&a);
        // The extents just returned go last.
        assert_eq!(p.take(1).unwrap(), [0x1040_0000]);
        p.quarantine(1);
        assert_eq!(p.quarantined_extents(), 1);
        assert_eq!(p.free_bytes(), 3 * (2 << 20));
    }

    #[test]
    fn runs_need_not_touch() {
        let mut p = ExtentPool::new(&[0x4000_0000..0x4040_0000, 0x1_0000_0000..0x1_0020_0000], 2 << 20, &[]);
        assert_eq!(p.free_extents(), 3);
        assert_eq!(p.take(3).unwrap(), [0x4000_0000, 0x4020_0000, 0x1_0000_0000]);
    }

    /// A freed lease's extents come back only once every byte is zeroed, a slice at a time, in order; boot's
    /// uncleared extents are scrubbed before they are first handed out, and counted as unprepared until then.
    #[test]
    fn only_zeroed_extents_are_handed_out() {
        const E: u64 = 2 << 20;
        let run = 0x1000_0000..0x1000_0000 + 4 * E;
        let mut p = ExtentPool::new(core::slice::from_ref(&run), E, &[0x1000_0000 + 2 * E, 0x1000_0000 + 3 * E]);
        assert_eq!(
            (p.free_extents(), p.scrubbing_bytes(), p.unprepared_bytes(), p.total_bytes()),
            (2, 2 * E, 2 * E, 4 * E)
        );
        assert!(p.take(3).is_none(), "uncleared extents are not free");
        let a = p.take(2).unwrap();
        p.retire(&a);
        let mut zeroed = Vec::new();
        let mut slices = 0;
        while let Some(n) = p.scrub_slice(768 << 10, |at, n| zeroed.push((at, n))) {
            slices += 1;
            assert!(n <= 768 << 10);
            if slices == 3 {
                // One extent whole (3 slices of 768, 768, 512 KiB): it alone is free, unprepared halves.
                assert_eq!((p.free_extents(), p.unprepared_bytes()), (1, E));
                assert_eq!(p.take(1).unwrap(), [0x1000_0000 + 2 * E]);
                p.retire(&[0x1000_0000 + 2 * E]);
            }
        }
        assert_eq!(slices, 5 * 3, "four extents, one of them twice");
        assert_eq!((p.scrubbing_bytes(), p.unprepared_bytes(), p.free_extents()), (0, 0, 4));
        // Every byte of each extent zeroed, contiguously, before it was handed out.
        let first: Vec<_> = zeroed[..3].to_vec();
        assert_eq!(
            first,
            [
                (0x1000_0000 + 2 * E, 768 << 10),
                (0x1000_0000 + 2 * E + (768 << 10), 768 << 10),
                (0x1000_0000 + 2 * E + (1536 << 10), 512 << 10)
            ]
        );
        let total: u64 = zeroed.iter().map(|z| z.1).sum();
        assert_eq!(total, 5 * E);
    }
}
