//! x86-64 4-level page tables (Intel SDM vol. 3, 4.5), identity-mapped: the kernel's virtual address of
//! anything is its physical address. Boot maps the first 4 GiB with 2 MiB write-back pages; this module then
//! maps RAM above 4 GiB and device memory (BARs, ECAM, the local APIC) uncached anywhere in the 64-bit
//! space, splitting a 2 MiB page into 4 KiB pages when only part of it changes.
//!
//! The logic works on a [`TableMemory`], so the same code runs on real tables in the kernel and on a fake
//! in host tests.

pub const PAGE_4K: u64 = 1 << 12;
pub const PAGE_2M: u64 = 1 << 21;
pub const PAGE_1G: u64 = 1 << 30;

pub const PRESENT: u64 = 1 << 0;
pub const WRITABLE: u64 = 1 << 1;
pub const WRITE_THROUGH: u64 = 1 << 3;
pub const CACHE_DISABLE: u64 = 1 << 4;
pub const HUGE: u64 = 1 << 7;
pub const GLOBAL: u64 = 1 << 8;
pub const ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
/// Physical addresses the tables can express (52 bits).
pub const MAX_PHYS: u64 = 1 << 52;
/// Flags copied from a large page to the small pages it is split into (the PAT bit moves, and we never set
/// it, so it is excluded).
const SPLIT_FLAGS: u64 = PRESENT | WRITABLE | WRITE_THROUGH | CACHE_DISABLE | GLOBAL;

/// Memory type of a mapping (through PCD/PWT with the power-on PAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// RAM.
    WriteBack,
    /// Device registers: every access reaches the device, in order.
    Uncached,
}

impl Cache {
    fn bits(self) -> u64 {
        match self {
            Cache::WriteBack => 0,
            Cache::Uncached => CACHE_DISABLE | WRITE_THROUGH,
        }
    }
}

/// Access to page-table pages by physical address.
pub trait TableMemory {
    fn read(&self, table: u64, index: usize) -> u64;
    fn write(&mut self, table: u64, index: usize, entry: u64);
    /// A zeroed, 4 KiB-aligned page for a new table, or `None` when memory is exhausted.
    fn alloc_table(&mut self) -> Option<u64>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    OutOfMemory,
    /// The range reaches beyond 52-bit physical addresses (or wraps).
    OutOfRange {
        start: u64,
        end: u64,
    },
}

impl core::fmt::Display for MapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MapError::OutOfMemory => write!(f, "no memory left for page tables"),
            MapError::OutOfRange { start, end } => {
                write!(f, "range {start:#x}..{end:#x} is outside the 52-bit physical address space")
            }
        }
    }
}

fn index(addr: u64, level: u32) -> usize {
    ((addr >> (12 + 9 * level)) & 0x1FF) as usize
}

/// The next-level table under `table[i]`, creating it (or splitting a large page into it) when needed.
fn next_table(mem: &mut impl TableMemory, table: u64, i: usize, level: u32) -> Result<u64, MapError> {
    let e = mem.read(table, i);
    if e & PRESENT != 0 && e & HUGE == 0 {
        return Ok(e & ADDR_MASK);
    }
    let new = mem.alloc_table().ok_or(MapError::OutOfMemory)?;
    if e & PRESENT != 0 {
        // Split a large page: level 2 = 1 GiB page into 2 MiB pages, level 1 = 2 MiB page into 4 KiB pages.
        let base = e & ADDR_MASK & !((1u64 << (12 + 9 * level)) - 1);
        let step = 1u64 << (12 + 9 * (level - 1));
        let flags = e & SPLIT_FLAGS;
        let huge = if level == 2 { HUGE } else { 0 };
        for j in 0..512 {
            mem.write(new, j, (base + j as u64 * step) | flags | huge);
        }
    }
    mem.write(table, i, new | PRESENT | WRITABLE);
    Ok(new)
}

/// Identity-maps `[start, end)` (rounded out to 4 KiB) with the given cache mode, using 2 MiB pages where
/// the range covers them whole. Returns the number of entries written (0 = nothing changed; otherwise the
/// caller flushes the TLB).
pub fn identity_map(
    mem: &mut impl TableMemory,
    pml4: u64,
    start: u64,
    end: u64,
    cache: Cache,
) -> Result<usize, MapError> {
    let start = start & !(PAGE_4K - 1);
    let end = end.checked_add(PAGE_4K - 1).ok_or(MapError::OutOfRange { start, end })? & !(PAGE_4K - 1);
    if end > MAX_PHYS || start > end {
        return Err(MapError::OutOfRange { start, end });
    }
    let attrs = PRESENT | WRITABLE | cache.bits();
    let mut written = 0;
    let mut addr = start;
    while addr < end {
        let pdpt = next_table(mem, pml4, index(addr, 3), 3)?;
        let pd = next_table(mem, pdpt, index(addr, 2), 2)?;
        let pdi = index(addr, 1);
        let pde = mem.read(pd, pdi);
        let is_table = pde & PRESENT != 0 && pde & HUGE == 0;
        if addr.is_multiple_of(PAGE_2M) && end - addr >= PAGE_2M && !is_table {
            let want = addr | attrs | HUGE;
            if pde != want {
                mem.write(pd, pdi, want);
                written += 1;
            }
            addr += PAGE_2M;
        } else {
            let pt = next_table(mem, pd, pdi, 1)?;
            let want = addr | attrs;
            let pti = index(addr, 0);
            if mem.read(pt, pti) != want {
                mem.write(pt, pti, want);
                written += 1;
            }
            addr += PAGE_4K;
        }
    }
    Ok(written)
}

/// Walks the tables: the physical address `virt` maps to and the leaf entry's flags, or `None` if unmapped.
pub fn translate(mem: &impl TableMemory, pml4: u64, virt: u64) -> Option<(u64, u64)> {
    let mut table = pml4;
    for level in (0..4).rev() {
        let e = mem.read(table, index(virt, level));
        if e & PRESENT == 0 {
            return None;
        }
        let leaf = level == 0 || (e & HUGE != 0 && level <= 2);
        if leaf {
            let size = 1u64 << (12 + 9 * level);
            let base = e & ADDR_MASK & !(size - 1);
            return Some((base | (virt & (size - 1)), e & !ADDR_MASK));
        }
        table = e & ADDR_MASK;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake {
        tables: HashMap<u64, [u64; 512]>,
        next: u64,
        limit: usize,
    }
    impl Fake {
        fn new() -> (Self, u64) {
            let mut f = Fake { tables: HashMap::new(), next: 0x10_0000, limit: usize::MAX };
            let root = f.alloc_table().unwrap();
            (f, root)
        }
    }
    impl TableMemory for Fake {
        fn read(&self, t: u64, i: usize) -> u64 {
            self.tables[&t][i]
        }
        fn write(&mut self, t: u64, i: usize, e: u64) {
            self.tables.get_mut(&t).expect("write to a table that was never allocated")[i] = e;
        }
        fn alloc_table(&mut self) -> Option<u64> {
            if self.tables.len() >= self.limit {
                return None;
            }
            let a = self.next;
            self.next += PAGE_4K;
            self.tables.insert(a, [0; 512]);
            Some(a)
        }
    }

    #[test]
    fn first_4g_uses_2m_pages() {
        let (mut m, root) = Fake::new();
        let n = identity_map(&mut m, root, 0, 4 << 30, Cache::WriteBack).unwrap();
        assert_eq!(n, 2048);
        assert_eq!(m.tables.len(), 1 + 1 + 4, "root, one PDPT, four PDs");
        let (p, f) = translate(&m, root, 0xFEE0_0123).unwrap();
        assert_eq!(p, 0xFEE0_0123);
        assert_ne!(f & HUGE, 0);
        assert_eq!(f & CACHE_DISABLE, 0);
        assert_eq!(translate(&m, root, 4 << 30), None);
        assert_eq!(identity_map(&mut m, root, 0, 4 << 30, Cache::WriteBack).unwrap(), 0, "idempotent");
    }

    #[test]
    fn uncached_window_splits_a_large_page_and_keeps_neighbours() {
        let (mut m, root) = Fake::new();
        identity_map(&mut m, root, 0, 1 << 30, Cache::WriteBack).unwrap();
        let n = identity_map(&mut m, root, 0x0FEB_D000, 0x0FEB_D000 + 0x100, Cache::Uncached).unwrap();
        assert_eq!(n, 1);
        let (p, f) = translate(&m, root, 0x0FEB_D0FF).unwrap();
        assert_eq!(p, 0x0FEB_D0FF);
        assert_eq!(f & (CACHE_DISABLE | WRITE_THROUGH), CACHE_DISABLE | WRITE_THROUGH);
        assert_eq!(f & HUGE, 0, "now a 4 KiB page");
        let (p, f) = translate(&m, root, 0x0FEB_C000).unwrap();
        assert_eq!(p, 0x0FEB_C000);
        assert_eq!(f & CACHE_DISABLE, 0, "neighbour keeps write-back");
        let (_, f) = translate(&m, root, 0x0FE0_0000 - 1).unwrap();
        assert_ne!(f & HUGE, 0, "other 2 MiB pages untouched");
    }

    #[test]
    fn bars_above_4g_get_fresh_tables() {
        let (mut m, root) = Fake::new();
        let bar = 0x38_0000_0000u64;
        identity_map(&mut m, root, bar, bar + (32 << 20), Cache::Uncached).unwrap();
        for off in [0, 0x1234, (32 << 20) - 1] {
            let (p, f) = translate(&m, root, bar + off).unwrap();
            assert_eq!(p, bar + off);
            assert_ne!(f & CACHE_DISABLE, 0);
        }
        assert_eq!(translate(&m, root, bar + (32 << 20)), None);
        assert_eq!(translate(&m, root, bar - 1), None);
    }

    #[test]
    fn unaligned_tail_uses_small_pages() {
        let (mut m, root) = Fake::new();
        let n = identity_map(&mut m, root, 0x20_0000, 0x40_3000, Cache::WriteBack).unwrap();
        assert_eq!(n, 1 + 3);
        assert_ne!(translate(&m, root, 0x20_0000).unwrap().1 & HUGE, 0);
        assert_eq!(translate(&m, root, 0x40_2FFF).unwrap().1 & HUGE, 0);
        assert_eq!(translate(&m, root, 0x40_3000), None);
    }

    #[test]
    fn exhaustion_and_range_errors_are_reported() {
        let (mut m, root) = Fake::new();
        m.limit = 2;
        assert_eq!(identity_map(&mut m, root, 0, PAGE_2M, Cache::WriteBack), Err(MapError::OutOfMemory));
        let (mut m, root) = Fake::new();
        assert!(matches!(
            identity_map(&mut m, root, MAX_PHYS - PAGE_4K, MAX_PHYS + PAGE_4K, Cache::Uncached),
            Err(MapError::OutOfRange { .. })
        ));
        assert!(matches!(identity_map(&mut m, root, 0, u64::MAX, Cache::Uncached), Err(MapError::OutOfRange { .. })));
    }
}
