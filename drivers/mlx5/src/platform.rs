//! What the driver needs from the world it runs in (`docs/architecture.md`, "The platform trait"): the HCA's
//! BAR0 as 32-bit big-endian registers, DMA memory handed out as [`DmaBuf`] handles (device address, length,
//! allocation id) and read and written only through a handle and an offset into it, a monotonic clock and a
//! relax hint. The image implements it over the kernel's register windows and DMA regions
//! (`image/src/hca_platform.rs`); `mlx5-hosted` over the model's shared files (device address = offset in the
//! RAM file).
//!
//! Everything here is safe to call, and fails closed: implementations keep the live allocations
//! ([`LiveAllocations`] does the bookkeeping for both) and refuse any DMA access whose handle is not live —
//! its address, length and id must be those of a live allocation, so a handle kept past its free cannot
//! reach a later allocation at the same address — or whose range leaves the handle (a read sees all ones, a
//! write is dropped), and any free of a handle that is not live, as BAR accesses outside the BAR read all
//! ones. A device address ([`DmaBuf::addr`], [`DmaBuf::at`]) is only ever handed to the device (queue
//! pages, mailbox pointers, doorbell records); the driver never reads or writes memory by address.

use alloc::collections::BTreeMap;

/// Size of the pages the HCA is given and of command-queue / queue buffers (`MLX5_ADAPTER_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

/// DMA memory from [`Platform::dma_alloc`]: its device address, its length, and which allocation it is (the
/// platform's id for it). Every access and free names the handle; a handle kept past its free reaches
/// nothing, not even a later allocation at the same address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaBuf {
    addr: u64,
    len: usize,
    id: u64,
}

impl DmaBuf {
    /// For platforms: the handle of allocation `id`, `len` bytes at device address `addr`.
    pub const fn new(addr: u64, len: usize, id: u64) -> DmaBuf {
        DmaBuf { addr, len, id }
    }

    /// The device address of its first byte (for the device, never for an access).
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// Its length in bytes, as asked for.
    pub const fn len(self) -> usize {
        self.len
    }

    /// Whether it is empty (platforms hand out no empty buffers).
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The platform's id for the allocation.
    pub const fn id(self) -> u64 {
        self.id
    }

    /// The device address `offset` bytes in (for the device, never for an access).
    pub const fn at(self, offset: u64) -> u64 {
        self.addr + offset
    }

    /// Whether `len` bytes at `offset` lie inside the buffer (overflow counts as outside).
    pub const fn holds(self, offset: usize, len: usize) -> bool {
        match offset.checked_add(len) {
            Some(end) => end <= self.len,
            None => false,
        }
    }
}

/// Why a DMA access or free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaFault {
    /// The handle is not a live allocation (freed, never handed out, or its length or id altered).
    NotLive,
    /// The handle is live but the range leaves it.
    OutOfBounds,
}

impl core::fmt::Display for DmaFault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DmaFault::NotLive => "the handle is not a live allocation",
            DmaFault::OutOfBounds => "the range leaves the allocation",
        })
    }
}

/// A platform's live DMA allocations, by device address, each with what backs it (`T`): hands out the ids of
/// new handles and checks every handle an access or free names. Lookups are by exact address (`O(log n)`).
#[derive(Debug)]
pub struct LiveAllocations<T> {
    live: BTreeMap<u64, (usize, u64, T)>,
    /// The id the last allocation got (ids start at 1 and are never reused).
    last_id: u64,
}

impl<T> Default for LiveAllocations<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> LiveAllocations<T> {
    pub const fn new() -> LiveAllocations<T> {
        LiveAllocations { live: BTreeMap::new(), last_id: 0 }
    }

    /// Records a new allocation of `len` bytes at `addr`, backed by `backing`, under a fresh id; returns its
    /// handle. The allocator never hands out live memory, so `addr` is not live; were it, the older handle
    /// would stop being live (and its backing is returned with the new handle).
    pub fn insert(&mut self, addr: u64, len: usize, backing: T) -> (DmaBuf, Option<T>) {
        self.last_id += 1;
        let id = self.last_id;
        let old = self.live.insert(addr, (len, id, backing)).map(|(_, _, b)| b);
        (DmaBuf::new(addr, len, id), old)
    }

    /// The backing of `buf` when it is live and `len` bytes at `offset` lie inside it.
    pub fn get(&self, buf: DmaBuf, offset: usize, len: usize) -> Result<&T, DmaFault> {
        match self.live.get(&buf.addr()) {
            Some((l, id, b)) if (*l, *id) == (buf.len(), buf.id()) => {
                if buf.holds(offset, len) {
                    Ok(b)
                } else {
                    Err(DmaFault::OutOfBounds)
                }
            }
            _ => Err(DmaFault::NotLive),
        }
    }

    /// Whether `buf` is a live allocation.
    pub fn is_live(&self, buf: DmaBuf) -> bool {
        self.get(buf, 0, 0).is_ok()
    }

    /// Ends allocation `buf`, returning its backing; `NotLive` (nothing changes) for a handle that is not live.
    pub fn remove(&mut self, buf: DmaBuf) -> Result<T, DmaFault> {
        if !self.is_live(buf) {
            return Err(DmaFault::NotLive);
        }
        self.live.remove(&buf.addr()).map(|(_, _, b)| b).ok_or(DmaFault::NotLive)
    }

    /// How many allocations are live.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

pub trait Platform: Sync {
    /// Reads the 32-bit register at BAR0 `offset`; the device stores it big-endian and the value returned
    /// is already in host order.
    fn bar_read32(&self, offset: usize) -> u32;

    /// Writes the 32-bit register at BAR0 `offset` (stored big-endian). Every earlier DMA write is visible
    /// to the device before this write reaches it (a doorbell is always written last).
    fn bar_write32(&self, offset: usize, value: u32);

    /// Zeroed DMA memory of `len` (> 0) bytes aligned to `align` (a power of two), or `None` when exhausted.
    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf>;

    /// DMA memory as [`Platform::dma_alloc`] gives it, but not necessarily cleared: the bool says whether it is
    /// known to be all zeros. For memory the caller clears later, on its own schedule (the lease pool, which
    /// would otherwise be written whole before the first answer: docs/operations.md "The lease pool"). By
    /// default the memory is cleared here, and says so.
    fn dma_alloc_uncleared(&self, len: usize, align: usize) -> Option<(DmaBuf, bool)> {
        self.dma_alloc(len, align).map(|b| (b, true))
    }

    /// Returns memory from [`Platform::dma_alloc`]. A handle that is not live frees nothing (a fault).
    fn dma_free(&self, buf: DmaBuf);

    /// Reads `out.len()` bytes at `offset` into `buf`. `buf` must be live and the range inside it; otherwise
    /// `out` is all ones and the fault is reported. Aligned 4- and 8-byte pieces are single accesses.
    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]);

    /// Writes `data` at `offset` into `buf`, which must be live with the range inside it; otherwise nothing is
    /// written and the fault is reported. Aligned 4- and 8-byte pieces are single accesses.
    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]);

    /// Writes `len` zeros at `offset` into `buf`, refused like [`Platform::dma_write`]. By default in 4 KiB
    /// writes; a platform with direct access does it in one.
    fn dma_zero(&self, buf: DmaBuf, offset: usize, len: usize) {
        const Z: [u8; 4096] = [0; 4096];
        let mut at = 0;
        while at < len {
            let k = (len - at).min(Z.len());
            self.dma_write(buf, offset + at, &Z[..k]);
            at += k;
        }
    }

    /// Monotonic nanoseconds.
    fn now_ns(&self) -> u64;

    /// Called in every wait loop iteration (a `pause`, a yield, or a step of an in-process model).
    fn relax(&self) {}

    /// The big-endian dword at `offset` in `buf` ([`Platform::dma_read`]: all ones when refused).
    fn dma_read32(&self, buf: DmaBuf, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        self.dma_read(buf, offset, &mut b);
        u32::from_be_bytes(b)
    }

    /// Stores `value` big-endian at `offset` in `buf` ([`Platform::dma_write`]).
    fn dma_write32(&self, buf: DmaBuf, offset: usize, value: u32) {
        self.dma_write(buf, offset, &value.to_be_bytes());
    }

    /// The byte at `offset` in `buf` ([`Platform::dma_read`]: 0xff when refused).
    fn dma_read8(&self, buf: DmaBuf, offset: usize) -> u8 {
        let mut b = [0u8; 1];
        self.dma_read(buf, offset, &mut b);
        b[0]
    }
}

/// A deadline on the platform's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(pub u64);

impl Deadline {
    pub fn after<P: Platform + ?Sized>(p: &P, ms: u64) -> Deadline {
        Deadline(p.now_ns().saturating_add(ms.saturating_mul(1_000_000)))
    }

    pub fn passed<P: Platform + ?Sized>(&self, p: &P) -> bool {
        p.now_ns() >= self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_handle_reaches_its_own_bytes_only() {
        let mut live = LiveAllocations::new();
        let (a, _) = live.insert(0x1000, 100, 'a');
        assert_eq!(live.get(a, 0, 100), Ok(&'a'));
        assert_eq!(live.get(a, 96, 4), Ok(&'a'));
        assert_eq!(live.get(a, 100, 0), Ok(&'a'), "an empty range at the end");
        assert_eq!(live.get(a, 98, 4), Err(DmaFault::OutOfBounds));
        assert_eq!(live.get(a, 100, 1), Err(DmaFault::OutOfBounds));
        assert_eq!(live.get(a, usize::MAX, 2), Err(DmaFault::OutOfBounds), "overflow is outside");
        // A handle with the right address but another length or id was never handed out.
        assert_eq!(live.get(DmaBuf::new(0x1000, 200, a.id()), 150, 4), Err(DmaFault::NotLive));
        assert_eq!(live.get(DmaBuf::new(0x1000, 100, a.id() + 1), 0, 4), Err(DmaFault::NotLive));
        assert_eq!(live.get(DmaBuf::new(0x1010, 16, a.id()), 0, 4), Err(DmaFault::NotLive), "not inside by address");
        assert_eq!(live.remove(DmaBuf::new(0x1000, 64, a.id())), Err(DmaFault::NotLive));
        assert!(live.is_live(a));
    }

    #[test]
    fn a_freed_handle_reaches_nothing_even_where_its_address_is_handed_out_again() {
        let mut live = LiveAllocations::new();
        let (old, _) = live.insert(0x2000, 64, 1);
        assert_eq!(live.remove(old), Ok(1));
        assert_eq!(live.get(old, 0, 4), Err(DmaFault::NotLive));
        assert_eq!(live.remove(old), Err(DmaFault::NotLive), "freed once only");
        let (new, _) = live.insert(0x2000, 64, 2);
        assert_eq!((new.addr(), new.len()), (old.addr(), old.len()));
        assert_ne!(new.id(), old.id(), "ids are never reused");
        assert_eq!(live.get(old, 0, 4), Err(DmaFault::NotLive), "the stale handle does not reach the new allocation");
        assert_eq!(live.remove(old), Err(DmaFault::NotLive));
        assert_eq!((live.get(new, 0, 64), live.len()), (Ok(&2), 1));
    }
}
