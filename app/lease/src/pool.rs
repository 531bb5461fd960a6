//! The lease pool: fixed-size extents of DRAM handed out whole, from runs wherever free memory was at boot (no
//! run needs to touch the next). Freed extents go to the back of the queue, so
//! memory a lease just gave back is the last to be handed out again; extents of a fenced slot never come
//! back (they are counted as quarantined).

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::ops::Range;

#[derive(Debug)]
pub struct ExtentPool {
    free: VecDeque<u64>,
    extent: u64,
    quarantined: usize,
}

impl ExtentPool {
    /// The extents of `runs` (each a whole number of `extent`s), lowest run first.
    pub fn new(runs: &[Range<u64>], extent: u64) -> ExtentPool {
        let free = runs.iter().flat_map(|r| r.clone().step_by(extent as usize)).collect();
        ExtentPool { free, extent, quarantined: 0 }
    }

    /// `n` extents, or `None` (nothing taken) when fewer are free.
    pub fn take(&mut self, n: usize) -> Option<Vec<u64>> {
        if n == 0 || n > self.free.len() {
            return None;
        }
        Some(self.free.drain(..n).collect())
    }

    /// Extents back (already scrubbed).
    pub fn give_back(&mut self, extents: &[u64]) {
        self.free.extend(extents.iter().copied());
    }

    /// `n` extents of a fenced slot will never come back.
    pub fn quarantine(&mut self, n: usize) {
        self.quarantined += n;
    }

    pub fn free_extents(&self) -> usize {
        self.free.len()
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.len() as u64 * self.extent
    }

    pub fn quarantined_extents(&self) -> usize {
        self.quarantined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_reuse_and_quarantine() {
        let run = 0x1000_0000..0x1000_0000 + (4 << 21);
        let mut p = ExtentPool::new(core::slice::from_ref(&run), 2 << 20);
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
        let mut p = ExtentPool::new(&[0x4000_0000..0x4040_0000, 0x1_0000_0000..0x1_0020_0000], 2 << 20);
        assert_eq!(p.free_extents(), 3);
        assert_eq!(p.take(3).unwrap(), [0x4000_0000, 0x4020_0000, 0x1_0000_0000]);
    }
}
