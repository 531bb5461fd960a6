//! Physical memory at run time: the frame allocator behind a lock, the live page tables (identity map), the
//! kernel heap, and DMA regions for devices.
//!
//! Identity mapping makes a DMA region's device address equal to its virtual address; the API still
//! returns both, so drivers never assume it (an IOMMU or a hosted platform may differ).

use crate::frames::{FRAME_SIZE, FrameAllocator};
use crate::paging::{self, Cache, MapError, TableMemory};
use crate::physmem::PhysMem;
use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use spin::Mutex;
use x86_64::PhysAddr;
use x86_64::structures::paging::page_table::PageTableEntry;
use x86_64::structures::paging::{PageSize, PageTable, PageTableIndex, PhysFrame, Size4KiB};

/// All free physical frames.
pub static FRAMES: Mutex<FrameAllocator> = Mutex::new(FrameAllocator::empty());
/// Serializes page-table edits.
static TABLES: Mutex<()> = Mutex::new(());
const FOUR_GIB: u64 = 4 << 30;

// A table is a 4 KiB frame of 512 eight-byte entries, which is how `LiveTables` addresses it.
const _: () = assert!(FRAME_SIZE == Size4KiB::SIZE);
const _: () = assert!(size_of::<PageTable>() == FRAME_SIZE as usize);
const _: () = assert!(size_of::<PageTableEntry>() == size_of::<u64>());

fn root() -> PhysFrame {
    super::cpu::page_table_root()
}

/// The page tables in use (the boot assembly's, then tables added here), edited through the identity map.
struct LiveTables;

impl LiveTables {
    /// Where entry `index` of `table` lives.
    fn slot(table: PhysFrame, index: PageTableIndex) -> *mut u64 {
        (table.start_address().as_u64() as *mut PageTable).cast::<u64>().wrapping_add(usize::from(index))
    }
}

impl TableMemory for LiveTables {
    fn read(&self, table: PhysFrame, index: PageTableIndex) -> PageTableEntry {
        // SAFETY: `table` is a page-table frame (from CR3 or a present entry), identity-mapped, and `index` is
        // < 512; the entry is read whole, in one access, as the processor may be setting its accessed bit.
        paging::entry_from_bits(unsafe { super::mmio::read(Self::slot(table, index)) })
    }
    fn write(&mut self, table: PhysFrame, index: PageTableIndex, entry: PageTableEntry) {
        // SAFETY: as in `read`; edits happen under the TABLES lock, and each entry is stored in one access so
        // no walker sees half of it.
        unsafe { super::mmio::write(Self::slot(table, index), paging::entry_bits(&entry)) }
    }
    fn alloc_table(&mut self) -> Option<PhysFrame> {
        // Tables must be reachable through the boot map while they are being linked in: take them below 4 GiB.
        let a = FRAMES.lock().alloc_below(1, FRAME_SIZE, FOUR_GIB)?;
        // Frame-aligned and below 4 GiB, so this is exactly the frame at `a`.
        let frame = PhysFrame::containing_address(PhysAddr::new_truncate(a));
        // SAFETY: a fresh frame from the allocator, below 4 GiB and so identity-mapped; nobody else owns it.
        unsafe { core::ptr::write_bytes(a as *mut u8, 0, FRAME_SIZE as usize) };
        Some(frame)
    }
}

fn map(start: u64, end: u64, cache: Cache) -> Result<(), MapError> {
    let _g = TABLES.lock();
    let changed = paging::identity_map(&mut LiveTables, root(), start, end, cache)?;
    if changed > 0 {
        // The tables stay valid for everything already mapped; this only drops cached translations.
        super::cpu::flush_tlb();
    }
    Ok(())
}

/// Maps device registers `[phys, phys + len)` uncached (anywhere below 128 TiB, `paging::MAX_IDENTITY`). Call
/// before other cores touch the range: TLBs of other cores are not shot down.
pub fn map_mmio(phys: u64, len: u64) -> Result<(), MapError> {
    let end = phys.checked_add(len).ok_or(MapError::OutOfRange { start: phys, end: u64::MAX })?;
    map(phys, end, Cache::Uncached)
}

/// Unmaps the 4 KiB page at `page` (a guard page: any access faults). Only for pages inside the kernel image,
/// which no allocator hands out.
pub fn guard_page(page: u64) -> Result<(), MapError> {
    map(page, page + paging::PAGE_4K, Cache::Guard)
}

/// Maps RAM above 4 GiB (the boot map covers the first 4 GiB).
pub fn map_ram(start: u64, end: u64) -> Result<(), MapError> {
    map(start.max(FOUR_GIB), end, Cache::WriteBack)
}

/// Whether `[addr, addr + len)` is mapped.
pub fn is_mapped(addr: u64, len: usize) -> bool {
    let Some(end) = addr.checked_add(len as u64) else { return false };
    if end <= FOUR_GIB {
        // The boot map covers the first 4 GiB and nothing is unmapped there but the boot stack's guard page,
        // inside the kernel image (no boot structure or frame lies there).
        return true;
    }
    let mut page = addr & !(paging::PAGE_4K - 1);
    while page < end {
        if paging::translate(&LiveTables, root(), page).is_none() {
            return false;
        }
        page += paging::PAGE_4K;
    }
    true
}

/// Physical memory as the boot parsers read it: through the identity map, refusing unmapped addresses and
/// address 0.
pub struct IdentityMem;

impl PhysMem for IdentityMem {
    fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        if addr == 0 || !is_mapped(addr, len) {
            return None;
        }
        // SAFETY: the range is mapped (checked) and non-null; boot structures and firmware tables are not
        // written while the parsers read them (single core, before anything allocates over them).
        Some(unsafe { core::slice::from_raw_parts(addr as *const u8, len) })
    }
}

/// The kernel heap (`alloc`), carved from frames at boot.
struct KernelHeap(Mutex<linked_list_allocator::Heap>);

// SAFETY: every allocation goes through the inner heap under its lock; the heap's memory is owned by it.
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0.lock().allocate_first_fit(layout).map_or(core::ptr::null_mut(), |p| p.as_ptr())
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: `ptr` came from `alloc` with this layout (GlobalAlloc contract).
            unsafe { self.0.lock().deallocate(p, layout) }
        }
    }
}

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(Mutex::new(linked_list_allocator::Heap::empty()));

/// Gives the heap `bytes` of frames. Boot only, once.
pub fn init_heap(bytes: u64) -> Result<(u64, u64), &'static str> {
    let frames = bytes.div_ceil(FRAME_SIZE);
    let base = FRAMES.lock().alloc(frames, FRAME_SIZE).ok_or("no memory for the kernel heap")?;
    if !is_mapped(base, (frames * FRAME_SIZE) as usize) {
        return Err("kernel heap frames are not mapped");
    }
    // SAFETY: the frames are fresh from the allocator, mapped (checked) and handed to the heap for good.
    unsafe { HEAP.0.lock().init(base as *mut u8, (frames * FRAME_SIZE) as usize) };
    Ok((base, frames * FRAME_SIZE))
}

/// Heap bytes in use and free.
pub fn heap_usage() -> (usize, usize) {
    let h = HEAP.0.lock();
    (h.used(), h.free())
}

/// Memory a device may read and write: CPU pointer plus the address the device uses for it.
pub struct DmaRegion {
    virt: NonNull<u8>,
    device_addr: u64,
    len: usize,
}

// SAFETY: the region is plain memory owned by whoever holds the `DmaRegion`.
unsafe impl Send for DmaRegion {}
// SAFETY: through `&self` the region is only read and written with volatile accesses (`read`, `write`, `zero`),
// which is how the device shares it anyway; no reference into it is ever handed out.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// Whether `[offset, offset + len)` lies inside the region.
    fn inside(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` (aligned 4- and 8-byte pieces are single accesses);
    /// `false`, with `buf` untouched, when the range leaves the region.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> bool {
        if !self.inside(offset, buf.len()) {
            return false;
        }
        // SAFETY: inside the region (checked), which this value owns and which is identity-mapped.
        unsafe { super::mmio::copy_from(self.virt.as_ptr() as usize + offset, buf) };
        true
    }

    /// Writes `data` at `offset` (aligned 4- and 8-byte pieces are single accesses); `false`, with nothing
    /// written, when the range leaves the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        if !self.inside(offset, data.len()) {
            return false;
        }
        // SAFETY: as in `read`.
        unsafe { super::mmio::copy_to(self.virt.as_ptr() as usize + offset, data) };
        true
    }

    /// Zeroes `[offset, offset + len)`; `false`, with nothing written, when the range leaves the region.
    pub fn zero(&self, offset: usize, len: usize) -> bool {
        if !self.inside(offset, len) {
            return false;
        }
        // SAFETY: as in `read`; plain stores, ordered before any later doorbell by `Mmio::write32`'s fence.
        unsafe { core::ptr::write_bytes(self.virt.as_ptr().add(offset), 0, len) };
        true
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.virt.as_ptr()
    }
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaError {
    OutOfMemory { len: usize },
    BadAlignment { align: usize },
    Empty,
}

impl core::fmt::Display for DmaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DmaError::OutOfMemory { len } => write!(f, "no contiguous physical memory for a {len}-byte DMA region"),
            DmaError::BadAlignment { align } => write!(f, "DMA alignment {align} is not a power of two"),
            DmaError::Empty => write!(f, "zero-length DMA region"),
        }
    }
}

/// Allocates `len` bytes (rounded up to pages) of zeroed, physically contiguous memory aligned to `align`
/// (at least a page).
pub fn dma_alloc(len: usize, align: usize) -> Result<DmaRegion, DmaError> {
    let r = dma_alloc_uncleared(len, align)?;
    // SAFETY: fresh frames, identity-mapped (checked), owned by the new region.
    unsafe { core::ptr::write_bytes(r.virt.as_ptr(), 0, r.len) };
    Ok(r)
}

/// As [`dma_alloc`], without clearing: the memory holds whatever it held (after a warm reboot, the previous
/// boot's data), so the caller must clear it before anything reads it.
pub fn dma_alloc_uncleared(len: usize, align: usize) -> Result<DmaRegion, DmaError> {
    if len == 0 {
        return Err(DmaError::Empty);
    }
    if !align.is_power_of_two() {
        return Err(DmaError::BadAlignment { align });
    }
    let frames = (len as u64).div_ceil(FRAME_SIZE);
    let bytes = (frames * FRAME_SIZE) as usize;
    let phys = FRAMES.lock().alloc(frames, (align as u64).max(FRAME_SIZE)).ok_or(DmaError::OutOfMemory { len })?;
    if !is_mapped(phys, bytes) {
        let _ = FRAMES.lock().free(phys, frames);
        return Err(DmaError::OutOfMemory { len });
    }
    let virt = NonNull::new(phys as *mut u8).ok_or(DmaError::OutOfMemory { len })?;
    Ok(DmaRegion { virt, device_addr: phys, len: bytes })
}

/// Returns a region's frames. The caller must know the device can no longer reach it.
pub fn dma_free(region: DmaRegion) {
    let frames = region.len as u64 / FRAME_SIZE;
    if let Err(e) = FRAMES.lock().free(region.device_addr, frames) {
        log::error!("dma: freeing {:#x}+{:#x} failed: {e:?}", region.device_addr, region.len);
    }
}
