//! Physical frame allocator: 4 KiB frames handed out from the usable RAM of the boot memory map.
//!
//! Free memory is a sorted list of disjoint, non-adjacent `[start, end)` ranges in a fixed array, so it works
//! before any heap exists and its state is small enough to print. Allocation is first fit from the lowest
//! address, so the same boot hands out the same addresses (reproducible runs and dumps). That also means low
//! memory goes first: a caller that needs memory below some limit (32-bit DMA, the AP trampoline's data) uses
//! [`FrameAllocator::alloc_below`] and should allocate early.
//!
//! The ranges to keep out (kernel image, boot loader data from `BootInfo::boot_data`, anything below the
//! floor) are removed at construction. Every `free` is checked against the free list, so freeing frames that
//! are still free is an error instead of a frame later handed out twice.

use core::fmt;
use core::ops::Range;

use crate::bootinfo::MemoryMap;

/// Size of a frame in bytes.
pub const FRAME_SIZE: u64 = 4096;
/// Free ranges the allocator can track.
pub const MAX_FREE_RANGES: usize = 256;

/// Why a [`FrameAllocator::free`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Some of the frames were already free.
    DoubleFree { addr: u64, count: u64 },
    /// The free list is full and the frames touch no free range; they are lost (see
    /// [`FrameAllocator::lost_bytes`]).
    TooFragmented { addr: u64, count: u64 },
    /// The address is not on a frame boundary.
    Misaligned { addr: u64 },
    /// The range runs past the end of the address space.
    OutOfRange { addr: u64, count: u64 },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::DoubleFree { addr, count } => {
                write!(f, "double free: some of the {count} frames at {addr:#x} are already free")
            }
            FrameError::TooFragmented { addr, count } => {
                write!(f, "frame free list is full ({MAX_FREE_RANGES} ranges): {count} frames at {addr:#x} are lost")
            }
            FrameError::Misaligned { addr } => write!(f, "freed address {addr:#x} is not 4 KiB aligned"),
            FrameError::OutOfRange { addr, count } => {
                write!(f, "{count} frames at {addr:#x} run past the end of the address space")
            }
        }
    }
}

/// The free list. See the module documentation.
pub struct FrameAllocator {
    ranges: [Range<u64>; MAX_FREE_RANGES],
    len: usize,
    total: u64,
    free: u64,
    lost: u64,
}

const fn align_down(x: u64, align: u64) -> u64 {
    x & !(align - 1)
}

/// Rounds up, or `None` when the result would not fit in 64 bits.
const fn align_up(x: u64, align: u64) -> Option<u64> {
    match x.checked_add(align - 1) {
        Some(v) => Some(align_down(v, align)),
        None => None,
    }
}

impl FrameAllocator {
    /// An allocator with nothing to give, for statics initialized later.
    pub const fn empty() -> Self {
        FrameAllocator { ranges: [const { 0..0 }; MAX_FREE_RANGES], len: 0, total: 0, free: 0, lost: 0 }
    }

    /// Manages the usable regions of `map`, shrunk inward to whole frames, minus every `exclude` range (grown
    /// outward to whole frames, since sharing a frame with loader data is as bad as overwriting it) and minus
    /// everything below `floor` (where firmware, the EBDA and the AP trampoline live).
    pub fn new(map: &MemoryMap, exclude: &[Range<u64>], floor: u64) -> Self {
        let mut a = FrameAllocator::empty();
        let floor = align_up(floor, FRAME_SIZE).unwrap_or(u64::MAX);
        for r in map.usable() {
            let Some(start) = align_up(r.start, FRAME_SIZE) else { continue };
            let start = start.max(floor);
            let end = align_down(r.end(), FRAME_SIZE);
            // The map is sorted and merged, so appending keeps the list sorted and disjoint.
            if start < end && !a.insert(a.len, start..end) {
                log::warn!("frames: free list full, not managing [{start:#x}, {end:#x})");
            }
        }
        for ex in exclude {
            let end = align_up(ex.end, FRAME_SIZE).unwrap_or(u64::MAX);
            a.carve(align_down(ex.start, FRAME_SIZE)..end);
        }
        a.total = a.ranges().iter().map(|r| r.end - r.start).sum();
        a.free = a.total;
        a
    }

    /// The free ranges, lowest first.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges[..self.len]
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free
    }

    /// Bytes managed when the allocator was built.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Bytes freed while the list was full, which can never be handed out again.
    pub fn lost_bytes(&self) -> u64 {
        self.lost
    }

    /// Allocates `count` contiguous frames whose first address is a multiple of `align` (a power of two;
    /// anything below [`FRAME_SIZE`] means frame alignment). Returns the lowest such address, or `None`.
    pub fn alloc(&mut self, count: u64, align: u64) -> Option<u64> {
        self.alloc_below(count, align, u64::MAX)
    }

    /// Like [`FrameAllocator::alloc`], but the whole allocation ends at or below `limit`.
    pub fn alloc_below(&mut self, count: u64, align: u64, limit: u64) -> Option<u64> {
        let align = align.max(FRAME_SIZE);
        if count == 0 || !align.is_power_of_two() {
            return None;
        }
        let size = count.checked_mul(FRAME_SIZE)?;
        for i in 0..self.len {
            let r = self.ranges[i].clone();
            if r.start >= limit {
                break;
            }
            let Some(start) = align_up(r.start, align) else { break };
            let Some(end) = start.checked_add(size) else { break };
            if end > r.end || end > limit {
                continue;
            }
            match (start > r.start, end < r.end) {
                (false, false) => self.remove(i),
                (false, true) => self.ranges[i].start = end,
                (true, false) => self.ranges[i].end = start,
                (true, true) => {
                    // Splitting needs a slot; without one, a later range may still fit without splitting.
                    if !self.insert(i + 1, end..r.end) {
                        continue;
                    }
                    self.ranges[i].end = start;
                }
            }
            self.free -= size;
            return Some(start);
        }
        None
    }

    /// Returns `count` frames at `addr` to the free list, merging with free neighbours.
    pub fn free(&mut self, addr: u64, count: u64) -> Result<(), FrameError> {
        if count == 0 {
            return Ok(());
        }
        if !addr.is_multiple_of(FRAME_SIZE) {
            return Err(FrameError::Misaligned { addr });
        }
        let end = count.checked_mul(FRAME_SIZE).and_then(|s| addr.checked_add(s));
        let end = end.ok_or(FrameError::OutOfRange { addr, count })?;
        // `next` is the first range starting at or after `addr`; `prev` the one before it.
        let next = self.ranges().partition_point(|r| r.start < addr);
        let prev = next.checked_sub(1);
        let touches_prev = match prev.map(|p| self.ranges[p].end) {
            Some(prev_end) if prev_end > addr => return Err(FrameError::DoubleFree { addr, count }),
            Some(prev_end) => prev_end == addr,
            None => false,
        };
        let touches_next = match self.ranges().get(next).map(|r| r.start) {
            Some(next_start) if next_start < end => return Err(FrameError::DoubleFree { addr, count }),
            Some(next_start) => next_start == end,
            None => false,
        };
        match (prev, touches_prev, touches_next) {
            (Some(p), true, true) => {
                self.ranges[p].end = self.ranges[next].end;
                self.remove(next);
            }
            (Some(p), true, false) => self.ranges[p].end = end,
            (_, _, true) => self.ranges[next].start = addr,
            _ => {
                if !self.insert(next, addr..end) {
                    self.lost += end - addr;
                    return Err(FrameError::TooFragmented { addr, count });
                }
            }
        }
        self.free += end - addr;
        Ok(())
    }

    /// Inserts `r` at index `i`; `false` when the list is full.
    fn insert(&mut self, i: usize, r: Range<u64>) -> bool {
        if self.len == MAX_FREE_RANGES {
            return false;
        }
        self.ranges[i..=self.len].rotate_right(1);
        self.ranges[i] = r;
        self.len += 1;
        true
    }

    fn remove(&mut self, i: usize) {
        self.ranges[i..self.len].rotate_left(1);
        self.len -= 1;
    }

    /// Takes `ex` out of the free list (construction only).
    fn carve(&mut self, ex: Range<u64>) {
        // A reversed range would otherwise "split" a free range into two overlapping ones.
        if ex.start >= ex.end {
            return;
        }
        let mut i = 0;
        while i < self.len {
            let r = self.ranges[i].clone();
            if r.end <= ex.start || ex.end <= r.start {
                i += 1;
                continue;
            }
            match (r.start < ex.start, ex.end < r.end) {
                (false, false) => {
                    self.remove(i);
                    continue;
                }
                (false, true) => self.ranges[i].start = ex.end,
                (true, false) => self.ranges[i].end = ex.start,
                (true, true) => {
                    self.ranges[i].end = ex.start;
                    if !self.insert(i + 1, ex.end..r.end) {
                        log::warn!("frames: free list full, not managing [{:#x}, {:#x})", ex.end, r.end);
                    }
                }
            }
            i += 1;
        }
    }
}

impl fmt::Debug for FrameAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameAllocator")
            .field("free", &self.free)
            .field("total", &self.total)
            .field("lost", &self.lost)
            .field("ranges", &self.ranges())
            .finish()
    }
}

#[cfg(test)]
// Free lists and boot data are slices of ranges; comparing against one-range slices is intended.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use crate::bootinfo::{MemoryRegion, RegionKind};
    use std::vec::Vec;

    const MIB: u64 = 0x10_0000;

    fn map(regions: &[(u64, u64, RegionKind)]) -> MemoryMap {
        let raw: Vec<_> = regions.iter().map(|&(start, len, kind)| MemoryRegion { start, len, kind }).collect();
        MemoryMap::from_regions(&raw).unwrap()
    }

    /// The 128 MiB QEMU map used by the boot tests.
    fn qemu_map() -> MemoryMap {
        use RegionKind::*;
        map(&[
            (0, 0x9fc00, Usable),
            (0x9fc00, 0x400, Reserved),
            (0xf0000, 0x10000, Reserved),
            (MIB, 0x7ee_0000, Usable),
            (0x7fe_0000, 0x2_0000, Reserved),
            (0xfffc_0000, 0x4_0000, Reserved),
        ])
    }

    #[test]
    fn exclusions_split_ranges_and_floor_cuts_low_memory() {
        let kernel = MIB..0x18_0123;
        let boot_info = 0x9000..0x9074;
        let module = 0x20_0800..0x20_1234;
        let a = FrameAllocator::new(&qemu_map(), &[kernel, boot_info, module], MIB);
        assert_eq!(a.ranges(), &[0x18_1000..0x20_0000, 0x20_2000..0x7fe_0000]);
        assert_eq!(a.total_bytes(), (0x20_0000 - 0x18_1000) + (0x7fe_0000 - 0x20_2000));
        assert_eq!(a.free_bytes(), a.total_bytes());
    }

    #[test]
    fn usable_regions_are_rounded_inward() {
        let m = map(&[(0x10_0800, 0x5000, RegionKind::Usable), (0x20_0000, 0xfff, RegionKind::Usable)]);
        let a = FrameAllocator::new(&m, &[], 0);
        assert_eq!(a.ranges(), &[0x10_1000..0x10_5000]);
        // An exclusion straddling the end of a range and one covering a whole range.
        let m = map(&[(MIB, MIB, RegionKind::Usable), (4 * MIB, MIB, RegionKind::Usable)]);
        let a = FrameAllocator::new(&m, &[0x1f_f800..0x20_0800, 3 * MIB..6 * MIB], 0);
        assert_eq!(a.ranges(), &[MIB..0x1f_f000]);
        // Empty and reversed exclusions exclude nothing.
        #[allow(clippy::reversed_empty_ranges)]
        let odd = [0x18_0000..0x18_0000, 0x18_0000..0x17_0000];
        let a = FrameAllocator::new(&m, &odd, 0);
        assert_eq!(a.ranges(), &[MIB..2 * MIB, 4 * MIB..5 * MIB]);
    }

    #[test]
    fn two_mib_alignment() {
        let mut a = FrameAllocator::new(&qemu_map(), &[MIB..0x18_1000], MIB);
        assert_eq!(a.alloc(1, FRAME_SIZE), Some(0x18_1000));
        assert_eq!(a.alloc(512, 2 * MIB), Some(0x20_0000));
        assert_eq!(a.alloc(512, 2 * MIB), Some(0x40_0000));
        assert_eq!(a.ranges(), &[0x18_2000..0x20_0000, 0x60_0000..0x7fe_0000]);
        // The gap below 2 MiB is still used by smaller requests.
        assert_eq!(a.alloc(2, 0), Some(0x18_2000));
        assert_eq!(a.alloc(1, 3 * FRAME_SIZE), None, "alignment must be a power of two");
        assert_eq!(a.alloc(0, FRAME_SIZE), None);
    }

    #[test]
    fn exhaustion_returns_none() {
        let m = map(&[(MIB, 4 * FRAME_SIZE, RegionKind::Usable)]);
        let mut a = FrameAllocator::new(&m, &[], 0);
        assert_eq!(a.alloc(5, FRAME_SIZE), None);
        for i in 0..4 {
            assert_eq!(a.alloc(1, FRAME_SIZE), Some(MIB + i * FRAME_SIZE));
        }
        assert_eq!(a.alloc(1, FRAME_SIZE), None);
        assert_eq!(a.free_bytes(), 0);
        assert!(a.ranges().is_empty());
        assert_eq!(a.alloc(u64::MAX, FRAME_SIZE), None);
        assert_eq!(FrameAllocator::empty().alloc(1, FRAME_SIZE), None);
    }

    #[test]
    fn alloc_below_respects_limit() {
        let m = map(&[(MIB, MIB, RegionKind::Usable), (0x1_0000_0000, 16 * MIB, RegionKind::Usable)]);
        let mut a = FrameAllocator::new(&m, &[], 0);
        // 2 MiB does not fit below 4 GiB, though it fits above.
        assert_eq!(a.alloc_below(512, FRAME_SIZE, 0x1_0000_0000), None);
        assert_eq!(a.alloc_below(16, FRAME_SIZE, MIB + 16 * FRAME_SIZE), Some(MIB));
        assert_eq!(a.alloc_below(1, FRAME_SIZE, MIB + 16 * FRAME_SIZE), None);
        assert_eq!(a.alloc_below(1, FRAME_SIZE, MIB + 17 * FRAME_SIZE), Some(MIB + 16 * FRAME_SIZE));
        assert_eq!(a.alloc(512, FRAME_SIZE), Some(0x1_0000_0000));
    }

    #[test]
    fn free_merges_back_to_one_range() {
        let m = map(&[(MIB, 64 * FRAME_SIZE, RegionKind::Usable)]);
        let mut a = FrameAllocator::new(&m, &[], 0);
        let blocks: Vec<u64> = (0..8).map(|_| a.alloc(8, FRAME_SIZE).unwrap()).collect();
        assert_eq!(a.free_bytes(), 0);
        for &i in &[3usize, 5, 4, 0, 7, 1, 6, 2] {
            a.free(blocks[i], 8).unwrap();
        }
        assert_eq!(a.ranges(), &[MIB..MIB + 64 * FRAME_SIZE]);
        assert_eq!(a.free_bytes(), a.total_bytes());
    }

    #[test]
    fn double_free_is_detected() {
        let m = map(&[(MIB, 64 * FRAME_SIZE, RegionKind::Usable)]);
        let mut a = FrameAllocator::new(&m, &[], 0);
        let x = a.alloc(4, FRAME_SIZE).unwrap();
        let y = a.alloc(4, FRAME_SIZE).unwrap();
        a.free(x, 4).unwrap();
        let before = a.free_bytes();
        assert_eq!(a.free(x, 4), Err(FrameError::DoubleFree { addr: x, count: 4 }));
        assert_eq!(a.free(x + FRAME_SIZE, 1), Err(FrameError::DoubleFree { addr: x + FRAME_SIZE, count: 1 }));
        // Overlapping the allocated block and the free tail beyond it.
        assert_eq!(a.free(y, 5), Err(FrameError::DoubleFree { addr: y, count: 5 }));
        // Spanning a whole free range from below.
        assert_eq!(a.free(MIB - FRAME_SIZE, 6), Err(FrameError::DoubleFree { addr: MIB - FRAME_SIZE, count: 6 }));
        assert_eq!(a.free_bytes(), before);
        assert_eq!(a.free(y + 1, 1), Err(FrameError::Misaligned { addr: y + 1 }));
        let top = !0xfffu64;
        assert_eq!(a.free(top, 2), Err(FrameError::OutOfRange { addr: top, count: 2 }));
        a.free(y, 4).unwrap();
        assert_eq!(a.ranges(), &[MIB..MIB + 64 * FRAME_SIZE]);
        assert_eq!(
            std::format!("{}", FrameError::DoubleFree { addr: 0x1000, count: 2 }),
            "double free: some of the 2 frames at 0x1000 are already free"
        );
    }

    #[test]
    fn full_free_list_loses_frames_and_counts_them() {
        let n = 2 * MAX_FREE_RANGES as u64 + 4;
        let m = map(&[(MIB, n * FRAME_SIZE, RegionKind::Usable)]);
        let mut a = FrameAllocator::new(&m, &[], 0);
        assert_eq!(a.alloc(n, FRAME_SIZE), Some(MIB));
        for i in 0..MAX_FREE_RANGES as u64 {
            a.free(MIB + 2 * i * FRAME_SIZE, 1).unwrap();
        }
        assert_eq!(a.ranges().len(), MAX_FREE_RANGES);
        let lone = MIB + 2 * (MAX_FREE_RANGES as u64 + 1) * FRAME_SIZE;
        assert_eq!(a.free(lone, 1), Err(FrameError::TooFragmented { addr: lone, count: 1 }));
        assert_eq!(a.lost_bytes(), FRAME_SIZE);
        // Freeing next to an existing range still works: it merges instead of needing a slot.
        a.free(MIB + FRAME_SIZE, 1).unwrap();
        assert_eq!(a.free_bytes(), (MAX_FREE_RANGES as u64 + 1) * FRAME_SIZE);
        assert_eq!(a.ranges()[0], MIB..MIB + 3 * FRAME_SIZE);
        assert_eq!(a.ranges().len(), MAX_FREE_RANGES - 1);
    }

    /// Deterministic xorshift so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
        a.start < b.end && b.start < a.end
    }

    #[test]
    fn random_alloc_free_sequences_keep_invariants() {
        use RegionKind::*;
        let m = map(&[
            (0, 0x9fc00, Usable),
            (0x9fc00, 0x60400, Reserved),
            (MIB, 62 * MIB, Usable),
            (63 * MIB, MIB, Reserved),
            (0x1_0000_0000, 64 * MIB, Usable),
        ]);
        let exclude = [MIB..0x30_0000, 0x80_0123..0x80_5000, 0x1_0100_0000..0x1_0100_1000, 0x9000..0x9100];
        let initial = FrameAllocator::new(&m, &exclude, MIB);
        let mut a = FrameAllocator::new(&m, &exclude, MIB);
        let mut live: Vec<Range<u64>> = Vec::new();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for step in 0..20_000 {
            let op = rng.below(10);
            // Every free range is bounded by a live allocation or by unmanaged memory, so capping the live
            // set keeps the free list from filling up (that case has its own test).
            if (op < 6 && live.len() < 200) || live.is_empty() {
                let max_count = if rng.below(8) == 0 { 1024 } else { 16 };
                let count = 1 + rng.below(max_count);
                let align = FRAME_SIZE << rng.below(10);
                let got = if op == 0 {
                    let limit = 1 + rng.below(0x1_0400_0000);
                    a.alloc_below(count, align, limit).inspect(|&s| assert!(s + count * FRAME_SIZE <= limit))
                } else {
                    a.alloc(count, align)
                };
                if let Some(start) = got {
                    let r = start..start + count * FRAME_SIZE;
                    assert_eq!(start % align, 0, "step {step}");
                    assert!(start >= MIB, "step {step}: below floor");
                    assert!(
                        m.usable().any(|u| u.start <= r.start && r.end <= u.end()),
                        "step {step}: {r:x?} outside usable RAM"
                    );
                    assert!(!exclude.iter().any(|e| overlaps(e, &r)), "step {step}: {r:x?} hits an exclusion");
                    assert!(!live.iter().any(|l| overlaps(l, &r)), "step {step}: {r:x?} handed out twice");
                    live.push(r);
                }
            } else {
                let r = live.swap_remove(rng.below(live.len() as u64) as usize);
                a.free(r.start, (r.end - r.start) / FRAME_SIZE).unwrap();
                if rng.below(50) == 0 {
                    assert!(matches!(a.free(r.start, 1), Err(FrameError::DoubleFree { .. })));
                }
            }
            let used: u64 = live.iter().map(|r| r.end - r.start).sum();
            assert_eq!(a.free_bytes() + used, a.total_bytes(), "step {step}");
            let listed: u64 = a.ranges().iter().map(|r| r.end - r.start).sum();
            assert_eq!(listed, a.free_bytes(), "step {step}");
            assert!(a.ranges().windows(2).all(|w| w[0].end < w[1].start), "step {step}: unsorted or unmerged");
        }
        for r in live.drain(..) {
            a.free(r.start, (r.end - r.start) / FRAME_SIZE).unwrap();
        }
        assert_eq!(a.ranges(), initial.ranges());
        assert_eq!(a.lost_bytes(), 0);
    }
}
