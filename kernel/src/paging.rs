//! x86-64 4-level page tables (Intel SDM vol. 3, 4.5), identity-mapped: the kernel's virtual address of
//! anything is its physical address. Boot maps the first 4 GiB with 2 MiB write-back pages; this module then
//! maps RAM above 4 GiB and device memory (BARs, ECAM, the local APIC) uncached anywhere below 128 TiB,
//! splitting a 2 MiB page into 4 KiB pages when only part of it changes.
//!
//! Entries, flags, table indices and levels are the `x86_64` crate's types (`PageTableEntry`,
//! `PageTableFlags`, `PageTableIndex`, `PageTableLevel`, `PhysFrame`, `PhysAddr`); the walk and the
//! splitting are ours. The logic works on a [`TableMemory`], so the same code runs on real tables in the
//! kernel and on a fake made of the crate's `PageTable`s in host tests.

use x86_64::PhysAddr;
use x86_64::VirtAddr;
use x86_64::structures::paging::page_table::{PageTableEntry, PageTableLevel};
use x86_64::structures::paging::{PageSize, PageTableFlags, PageTableIndex, PhysFrame, Size2MiB, Size4KiB};

pub const PAGE_4K: u64 = Size4KiB::SIZE;
pub const PAGE_2M: u64 = Size2MiB::SIZE;
/// The end of what an identity map can cover: 4-level paging translates 48-bit virtual addresses, and a
/// virtual address equal to a physical one must be canonical, so below 2^47 (128 TiB). Above it the table
/// indices would wrap onto lower addresses (the tables themselves could hold 52-bit physical addresses).
pub const MAX_IDENTITY: u64 = 1 << 47;
/// Entries per table.
const ENTRIES: u16 = 512;
/// Flags copied from a large page to the small pages it is split into (the PAT bit moves, and we never set
/// it, so it is excluded).
const SPLIT_FLAGS: PageTableFlags = PageTableFlags::PRESENT
    .union(PageTableFlags::WRITABLE)
    .union(PageTableFlags::WRITE_THROUGH)
    .union(PageTableFlags::NO_CACHE)
    .union(PageTableFlags::GLOBAL);
/// Flags of an entry that points at a lower-level table.
const TABLE_FLAGS: PageTableFlags = PageTableFlags::PRESENT.union(PageTableFlags::WRITABLE);

/// Memory type of a mapping (through PCD/PWT with the power-on PAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// RAM.
    WriteBack,
    /// Device registers: every access reaches the device, in order.
    Uncached,
    /// Not mapped at all: a guard page, whose every access faults (always a 4 KiB page).
    Guard,
}

impl Cache {
    pub fn flags(self) -> PageTableFlags {
        match self {
            Cache::WriteBack => PageTableFlags::empty(),
            Cache::Uncached => PageTableFlags::NO_CACHE | PageTableFlags::WRITE_THROUGH,
            Cache::Guard => PageTableFlags::empty(),
        }
    }
}

/// Access to page-table pages by physical frame, one entry at a time.
pub trait TableMemory {
    fn read(&self, table: PhysFrame, index: PageTableIndex) -> PageTableEntry;
    fn write(&mut self, table: PhysFrame, index: PageTableIndex, entry: PageTableEntry);
    /// A zeroed frame for a new table, or `None` when memory is exhausted.
    fn alloc_table(&mut self) -> Option<PhysFrame>;
}

/// The entry whose 64 bits are `bits` (address bits 12..52, every other bit a flag), for reading tables
/// that live in memory.
pub fn entry_from_bits(bits: u64) -> PageTableEntry {
    let addr = PhysAddr::new_truncate(bits).align_down(PAGE_4K);
    entry(addr, PageTableFlags::from_bits_retain(bits ^ addr.as_u64()))
}

/// The 64 bits of `entry` as the processor reads them.
pub fn entry_bits(entry: &PageTableEntry) -> u64 {
    entry.addr().as_u64() | entry.flags().bits()
}

/// An entry for the 4 KiB-aligned `addr` with `flags`.
fn entry(addr: PhysAddr, flags: PageTableFlags) -> PageTableEntry {
    let mut e = PageTableEntry::new();
    e.set_addr(addr, flags);
    e
}

/// `addr` below [`MAX_IDENTITY`] as a physical address.
fn phys(addr: u64) -> PhysAddr {
    PhysAddr::new_truncate(addr)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    OutOfMemory,
    /// The range reaches beyond [`MAX_IDENTITY`] (or wraps).
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
                write!(f, "range {start:#x}..{end:#x} reaches beyond the identity-mappable 128 TiB")
            }
        }
    }
}

/// The index of `addr` in the table at `level`.
fn index(addr: u64, level: PageTableLevel) -> PageTableIndex {
    VirtAddr::new_truncate(addr).page_table_index(level)
}

/// Whether two entries hold the same 64 bits (accessed and dirty included).
fn same(a: &PageTableEntry, b: &PageTableEntry) -> bool {
    entry_bits(a) == entry_bits(b)
}

/// The next-level table under `table[i]`, where `table` is at `level` (Four, Three or Two), creating it (or
/// splitting a large page into it) when needed.
fn next_table(
    mem: &mut impl TableMemory,
    table: PhysFrame,
    i: PageTableIndex,
    level: PageTableLevel,
) -> Result<PhysFrame, MapError> {
    let e = mem.read(table, i);
    // `frame` is the lower table exactly when the entry is present and not a large page.
    if let Ok(lower) = e.frame() {
        return Ok(lower);
    }
    let new = mem.alloc_table().ok_or(MapError::OutOfMemory)?;
    if e.flags().contains(PageTableFlags::PRESENT) {
        // Split a large page: a level-3 entry (1 GiB page) into 2 MiB pages, a level-2 entry (2 MiB page)
        // into 4 KiB pages.
        let size = level.entry_address_space_alignment();
        let base = e.addr().align_down(size);
        let step = size / u64::from(ENTRIES);
        let huge = if level == PageTableLevel::Three { PageTableFlags::HUGE_PAGE } else { PageTableFlags::empty() };
        let flags = (e.flags() & SPLIT_FLAGS) | huge;
        for j in 0..ENTRIES {
            mem.write(new, PageTableIndex::new(j), entry(phys(base.as_u64() + u64::from(j) * step), flags));
        }
    }
    mem.write(table, i, entry(new.start_address(), TABLE_FLAGS));
    Ok(new)
}

/// Identity-maps `[start, end)` (rounded out to 4 KiB) with the given cache mode, using 2 MiB pages where
/// the range covers them whole. Returns the number of entries written (0 = nothing changed; otherwise the
/// caller flushes the TLB).
pub fn identity_map(
    mem: &mut impl TableMemory,
    pml4: PhysFrame,
    start: u64,
    end: u64,
    cache: Cache,
) -> Result<usize, MapError> {
    let start = start & !(PAGE_4K - 1);
    let end = end.checked_add(PAGE_4K - 1).ok_or(MapError::OutOfRange { start, end })? & !(PAGE_4K - 1);
    if end > MAX_IDENTITY || start > end {
        return Err(MapError::OutOfRange { start, end });
    }
    let attrs = match cache {
        Cache::Guard => PageTableFlags::empty(),
        c => PageTableFlags::PRESENT | PageTableFlags::WRITABLE | c.flags(),
    };
    let mut written = 0;
    let mut addr = start;
    while addr < end {
        let pdpt = next_table(mem, pml4, index(addr, PageTableLevel::Four), PageTableLevel::Four)?;
        let pd = next_table(mem, pdpt, index(addr, PageTableLevel::Three), PageTableLevel::Three)?;
        let pdi = index(addr, PageTableLevel::Two);
        let pde = mem.read(pd, pdi);
        let is_table = pde.frame().is_ok();
        if addr.is_multiple_of(PAGE_2M) && end - addr >= PAGE_2M && !is_table && cache != Cache::Guard {
            let want = entry(phys(addr), attrs | PageTableFlags::HUGE_PAGE);
            if !same(&pde, &want) {
                mem.write(pd, pdi, want);
                written += 1;
            }
            addr += PAGE_2M;
        } else {
            let pt = next_table(mem, pd, pdi, PageTableLevel::Two)?;
            let want = entry(phys(addr), attrs);
            let pti = index(addr, PageTableLevel::One);
            if !same(&mem.read(pt, pti), &want) {
                mem.write(pt, pti, want);
                written += 1;
            }
            addr += PAGE_4K;
        }
    }
    Ok(written)
}

/// Walks the tables: the physical address `virt` maps to and the leaf entry's flags, or `None` if unmapped.
pub fn translate(mem: &impl TableMemory, pml4: PhysFrame, virt: u64) -> Option<(PhysAddr, PageTableFlags)> {
    let mut table = pml4;
    let mut level = PageTableLevel::Four;
    loop {
        let e = mem.read(table, index(virt, level));
        let flags = e.flags();
        if !flags.contains(PageTableFlags::PRESENT) {
            return None;
        }
        let leaf = match level {
            PageTableLevel::One => true,
            PageTableLevel::Two | PageTableLevel::Three => flags.contains(PageTableFlags::HUGE_PAGE),
            // PS is reserved in a PML4 entry: it always points at a table.
            PageTableLevel::Four => false,
        };
        if leaf {
            let size = level.entry_address_space_alignment();
            let base = e.addr().align_down(size);
            return Some((phys(base.as_u64() | (virt & (size - 1))), flags));
        }
        table = PhysFrame::containing_address(e.addr());
        level = level.next_lower_level()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use x86_64::structures::paging::PageTable;

    const HUGE: PageTableFlags = PageTableFlags::HUGE_PAGE;
    const NO_CACHE: PageTableFlags = PageTableFlags::NO_CACHE;
    const WRITE_THROUGH: PageTableFlags = PageTableFlags::WRITE_THROUGH;

    struct Fake {
        tables: HashMap<PhysFrame, Box<PageTable>>,
        next: u64,
        limit: usize,
    }
    impl Fake {
        fn new() -> (Self, PhysFrame) {
            let mut f = Fake { tables: HashMap::new(), next: 0x10_0000, limit: usize::MAX };
            let root = f.alloc_table().unwrap();
            (f, root)
        }
        /// Stores the raw 64-bit `bits` in `table[i]`, as the boot assembly writes entries.
        fn poke(&mut self, table: PhysFrame, i: u16, bits: u64) {
            self.write(table, PageTableIndex::new(i), entry_from_bits(bits));
        }
    }
    impl TableMemory for Fake {
        fn read(&self, t: PhysFrame, i: PageTableIndex) -> PageTableEntry {
            self.tables[&t][i].clone()
        }
        fn write(&mut self, t: PhysFrame, i: PageTableIndex, e: PageTableEntry) {
            self.tables.get_mut(&t).expect("write to a table that was never allocated")[i] = e;
        }
        fn alloc_table(&mut self) -> Option<PhysFrame> {
            if self.tables.len() >= self.limit {
                return None;
            }
            let a = PhysFrame::from_start_address(PhysAddr::new(self.next)).unwrap();
            self.next += PAGE_4K;
            self.tables.insert(a, Box::new(PageTable::new()));
            Some(a)
        }
    }

    fn at(m: &Fake, root: PhysFrame, virt: u64) -> Option<(u64, PageTableFlags)> {
        translate(m, root, virt).map(|(p, f)| (p.as_u64(), f))
    }

    #[test]
    fn first_4g_uses_2m_pages() {
        let (mut m, root) = Fake::new();
        let n = identity_map(&mut m, root, 0, 4 << 30, Cache::WriteBack).unwrap();
        assert_eq!(n, 2048);
        assert_eq!(m.tables.len(), 1 + 1 + 4, "root, one PDPT, four PDs");
        let (p, f) = at(&m, root, 0xFEE0_0123).unwrap();
        assert_eq!(p, 0xFEE0_0123);
        assert!(f.contains(HUGE));
        assert!(!f.contains(NO_CACHE));
        assert_eq!(at(&m, root, 4 << 30), None);
        assert_eq!(identity_map(&mut m, root, 0, 4 << 30, Cache::WriteBack).unwrap(), 0, "idempotent");
    }

    #[test]
    fn boot_tables_read_back_as_the_same_map() {
        // The boot assembly's tables, bit for bit: PML4[0] -> PDPT (P | RW), PDPT[0..4] -> four PDs (P | RW),
        // each PD entry a 2 MiB page (P | RW | PS).
        let (mut m, root) = Fake::new();
        let pdpt = m.alloc_table().unwrap();
        m.poke(root, 0, pdpt.start_address().as_u64() | 0x3);
        for g in 0..4u16 {
            let pd = m.alloc_table().unwrap();
            m.poke(pdpt, g, pd.start_address().as_u64() | 0x3);
            for i in 0..512u16 {
                m.poke(pd, i, ((u64::from(g) << 30) | (u64::from(i) << 21)) | 0x83);
            }
        }
        let tables = m.tables.len();
        assert_eq!(identity_map(&mut m, root, 0, 4 << 30, Cache::WriteBack).unwrap(), 0, "nothing to change");
        assert_eq!(m.tables.len(), tables);
        let (p, f) = at(&m, root, 0xC012_3456).unwrap();
        assert_eq!(p, 0xC012_3456);
        assert_eq!(f, PageTableFlags::PRESENT | PageTableFlags::WRITABLE | HUGE);
        let pde = m.read(m.read(pdpt, PageTableIndex::new(3)).frame().unwrap(), PageTableIndex::new(0));
        assert_eq!(entry_bits(&pde), (3 << 30) | 0x83);
    }

    #[test]
    fn entry_bits_round_trip() {
        for bits in [
            0,
            0x83,
            0x0000_0001_2340_0083,
            0x000F_FFFF_FFFF_F01B, // highest address, PWT | PCD | U/S | RW | P
            0x8000_0000_0020_01E3, // NX, global, dirty, accessed, PS
            0x7FF0_0000_0000_0E00, // the software-available bits 52..62 and 9..11
        ] {
            assert_eq!(entry_bits(&entry_from_bits(bits)), bits, "{bits:#x}");
        }
        let e = entry_from_bits(0x8000_0000_FEB0_001B);
        assert_eq!(e.addr().as_u64(), 0xFEB0_0000);
        assert_eq!(
            e.flags(),
            PageTableFlags::PRESENT
                | PageTableFlags::WRITABLE
                | PageTableFlags::WRITE_THROUGH
                | NO_CACHE
                | PageTableFlags::NO_EXECUTE
        );
        assert_eq!(Cache::Uncached.flags().bits(), 0x18, "PCD | PWT");
    }

    #[test]
    fn uncached_window_splits_a_large_page_and_keeps_neighbours() {
        let (mut m, root) = Fake::new();
        identity_map(&mut m, root, 0, 1 << 30, Cache::WriteBack).unwrap();
        let n = identity_map(&mut m, root, 0x0FEB_D000, 0x0FEB_D000 + 0x100, Cache::Uncached).unwrap();
        assert_eq!(n, 1);
        let (p, f) = at(&m, root, 0x0FEB_D0FF).unwrap();
        assert_eq!(p, 0x0FEB_D0FF);
        assert!(f.contains(NO_CACHE | WRITE_THROUGH));
        assert!(!f.contains(HUGE), "now a 4 KiB page");
        let (p, f) = at(&m, root, 0x0FEB_C000).unwrap();
        assert_eq!(p, 0x0FEB_C000);
        assert!(!f.contains(NO_CACHE), "neighbour keeps write-back");
        let (_, f) = at(&m, root, 0x0FE0_0000 - 1).unwrap();
        assert!(f.contains(HUGE), "other 2 MiB pages untouched");
    }

    #[test]
    fn a_guard_page_is_unmapped_between_mapped_neighbours() {
        let (mut m, root) = Fake::new();
        identity_map(&mut m, root, 0, 1 << 30, Cache::WriteBack).unwrap();
        assert_eq!(identity_map(&mut m, root, 0x0018_4000, 0x0018_5000, Cache::Guard).unwrap(), 1);
        assert!(at(&m, root, 0x0018_4000).is_none() && at(&m, root, 0x0018_4FFF).is_none(), "the guard page");
        assert_eq!(at(&m, root, 0x0018_3FFF).unwrap().0, 0x0018_3FFF, "below it still mapped");
        assert_eq!(at(&m, root, 0x0018_5000).unwrap().0, 0x0018_5000, "above it still mapped");
        assert_eq!(identity_map(&mut m, root, 0x0018_4000, 0x0018_5000, Cache::Guard).unwrap(), 0, "idempotent");
        // Even a whole 2 MiB range is guarded page by page, never as a non-present large entry.
        assert_eq!(identity_map(&mut m, root, 0x0040_0000, 0x0060_0000, Cache::Guard).unwrap(), 512);
    }

    #[test]
    fn a_1g_page_splits_into_2m_pages() {
        let (mut m, root) = Fake::new();
        let pdpt = m.alloc_table().unwrap();
        m.poke(root, 0, pdpt.start_address().as_u64() | 0x3);
        m.poke(pdpt, 1, (1 << 30) | 0x83); // 1 GiB page at 1 GiB
        let n = identity_map(&mut m, root, 0x4000_1000, 0x4000_2000, Cache::Uncached).unwrap();
        assert_eq!(n, 1);
        let (p, f) = at(&m, root, 0x4000_1800).unwrap();
        assert_eq!(p, 0x4000_1800);
        assert!(f.contains(NO_CACHE) && !f.contains(HUGE));
        let (p, f) = at(&m, root, 0x7FFF_FFFF).unwrap();
        assert_eq!(p, 0x7FFF_FFFF);
        assert!(f.contains(HUGE) && !f.contains(NO_CACHE), "the rest is 2 MiB write-back pages");
    }

    #[test]
    fn bars_above_4g_get_fresh_tables() {
        let (mut m, root) = Fake::new();
        let bar = 0x38_0000_0000u64;
        identity_map(&mut m, root, bar, bar + (32 << 20), Cache::Uncached).unwrap();
        for off in [0, 0x1234, (32 << 20) - 1] {
            let (p, f) = at(&m, root, bar + off).unwrap();
            assert_eq!(p, bar + off);
            assert!(f.contains(NO_CACHE));
        }
        assert_eq!(at(&m, root, bar + (32 << 20)), None);
        assert_eq!(at(&m, root, bar - 1), None);
    }

    #[test]
    fn unaligned_tail_uses_small_pages() {
        let (mut m, root) = Fake::new();
        let n = identity_map(&mut m, root, 0x20_0000, 0x40_3000, Cache::WriteBack).unwrap();
        assert_eq!(n, 1 + 3);
        assert!(at(&m, root, 0x20_0000).unwrap().1.contains(HUGE));
        assert!(!at(&m, root, 0x40_2FFF).unwrap().1.contains(HUGE));
        assert_eq!(at(&m, root, 0x40_3000), None);
    }

    #[test]
    fn exhaustion_and_range_errors_are_reported() {
        let (mut m, root) = Fake::new();
        m.limit = 2;
        assert_eq!(identity_map(&mut m, root, 0, PAGE_2M, Cache::WriteBack), Err(MapError::OutOfMemory));
        let (mut m, root) = Fake::new();
        assert!(matches!(
            identity_map(&mut m, root, MAX_IDENTITY - PAGE_4K, MAX_IDENTITY + PAGE_4K, Cache::Uncached),
            Err(MapError::OutOfRange { .. })
        ));
        assert!(matches!(identity_map(&mut m, root, 0, u64::MAX, Cache::Uncached), Err(MapError::OutOfRange { .. })));
    }

    #[test]
    fn addresses_that_would_wrap_the_indices_are_refused() {
        // 2^48 has the same table indices as 0: mapping it must not touch the low map.
        let (mut m, root) = Fake::new();
        identity_map(&mut m, root, 0, PAGE_2M, Cache::WriteBack).unwrap();
        for start in [MAX_IDENTITY, 1 << 48] {
            assert_eq!(
                identity_map(&mut m, root, start, start + PAGE_4K, Cache::Uncached),
                Err(MapError::OutOfRange { start, end: start + PAGE_4K })
            );
        }
        let (p, f) = at(&m, root, 0x1000).unwrap();
        assert_eq!(p, 0x1000);
        assert!(f.contains(HUGE) && !f.contains(NO_CACHE));
        assert_eq!(identity_map(&mut m, root, MAX_IDENTITY - PAGE_4K, MAX_IDENTITY, Cache::Uncached), Ok(1));
    }
}
