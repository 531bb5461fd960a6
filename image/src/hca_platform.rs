//! The mlx5 driver's platform in the image (`leasebox_mlx5::Platform`), built from what the kernel exports: the
//! BAR as an uncached register window (`Mmio`), DMA memory as kernel `DmaRegion`s (identity-mapped, so a
//! device address is the physical address), the TSC as the clock. No `unsafe` here: every DMA read and write
//! names a handle and an offset, and is checked against the live allocations (the handle's address, length and
//! id those of a live allocation, one exact-key lookup; the range inside it) and fails closed like the BAR
//! accessors — a read refused returns all ones, a write refused is dropped, and both are logged.
//!
//! Small DMA objects (doorbell records, mailbox-sized buffers) come from per-size free lists carved out of
//! whole frames, so a 64-byte record does not cost a 4 KiB frame; such chunks go back to their list, never to
//! the frame allocator. Each allocation's handle carries an id, so a stale handle (its memory freed and handed
//! out again) reaches nothing: it neither reads, writes nor frees the new allocation.
#![forbid(unsafe_code)]

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use leasebox_kernel::arch::memory::{self, DmaRegion};
use leasebox_kernel::arch::mmio::Mmio;
use leasebox_kernel::time::Instant;
use leasebox_mlx5::{DmaBuf, DmaFault, LiveAllocations, Platform};
use spin::RwLock;

const FRAME: usize = 4096;
/// Size classes 64, 128, ..., 2048 bytes.
const CLASSES: usize = 6;
/// Lengths up to this may come from the size classes.
const SMALL_MAX: usize = 64 << (CLASSES - 1);
/// Refused accesses logged one by one; after these, only counted.
const LOGGED_FAULTS: u32 = 8;

pub struct KernelHca {
    /// BAR0 (or the model's BAR2).
    bar: Mmio,
    dma: RwLock<Dma>,
    /// Refused DMA accesses and frees so far.
    faults: AtomicU32,
}

/// A size-class chunk: which carved frame, and where in it.
#[derive(Clone, Copy)]
struct Chunk {
    frame: usize,
    offset: usize,
}

enum Backing {
    Chunk { class: usize, chunk: Chunk },
    Region(DmaRegion),
}

#[derive(Default)]
struct Dma {
    /// Frames carved into chunks; they stay with their class for good.
    frames: Vec<DmaRegion>,
    free: [Vec<Chunk>; CLASSES],
    /// Every live allocation (handle and the memory behind it).
    live: LiveAllocations<Backing>,
}

impl Dma {
    /// The region and offset behind `len` bytes at `offset` in `buf`, when `buf` is live and holds them.
    fn find(&self, buf: DmaBuf, offset: usize, len: usize) -> Result<(&DmaRegion, usize), DmaFault> {
        match self.live.get(buf, offset, len)? {
            Backing::Region(r) => Ok((r, offset)),
            Backing::Chunk { chunk, .. } => Ok((&self.frames[chunk.frame], chunk.offset + offset)),
        }
    }

    /// A chunk of class `c`, carving a fresh frame when the list is empty.
    fn chunk(&mut self, c: usize) -> Option<Chunk> {
        if self.free[c].is_empty() {
            let frame = memory::dma_alloc(FRAME, FRAME).ok()?;
            let size = 64usize << c;
            let index = self.frames.len();
            self.frames.push(frame);
            self.free[c].extend((0..FRAME / size).rev().map(|i| Chunk { frame: index, offset: i * size }));
        }
        self.free[c].pop()
    }
}

fn class_of(len: usize, align: usize) -> Option<usize> {
    let need = len.max(align).max(64).next_power_of_two();
    (need <= SMALL_MAX).then(|| need.trailing_zeros() as usize - 6)
}

impl KernelHca {
    /// The platform over the HCA's register window.
    pub fn new(bar: Mmio) -> KernelHca {
        KernelHca { bar, dma: RwLock::new(Dma::default()), faults: AtomicU32::new(0) }
    }

    /// Runs `f` on the region and offset behind `len` bytes at `offset` in `buf` (under the read lock, so the
    /// allocation stays live meanwhile); the fault when `buf` is not live or does not hold the range.
    fn access(
        &self,
        buf: DmaBuf,
        offset: usize,
        len: usize,
        f: impl FnOnce(&DmaRegion, usize) -> bool,
    ) -> Result<(), DmaFault> {
        let dma = self.dma.read();
        let (r, off) = dma.find(buf, offset, len)?;
        // The region holds the allocation, so this cannot fail; were it to, it is out of bounds.
        if f(r, off) { Ok(()) } else { Err(DmaFault::OutOfBounds) }
    }

    fn fault(&self, what: &str, buf: DmaBuf, offset: usize, len: usize, why: DmaFault) {
        let n = self.faults.fetch_add(1, Ordering::Relaxed);
        if n < LOGGED_FAULTS {
            log::error!(
                "mlx5 DMA: {what} {:#x}+{offset:#x} ({len:#x} bytes; handle {:#x} bytes, id {}) refused: {why}",
                buf.addr(),
                buf.len(),
                buf.id()
            );
        } else if n == LOGGED_FAULTS {
            log::error!("mlx5 DMA: more refused accesses; no longer logged");
        }
    }
}

impl Platform for KernelHca {
    fn bar_read32(&self, offset: usize) -> u32 {
        u32::from_be(self.bar.read32(offset))
    }

    fn bar_write32(&self, offset: usize, value: u32) {
        self.bar.write32(offset, value.to_be());
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf> {
        if len == 0 {
            return None;
        }
        let mut dma = self.dma.write();
        let (addr, backing) = match class_of(len, align) {
            Some(class) => {
                let chunk = dma.chunk(class)?;
                let frame = &dma.frames[chunk.frame];
                frame.zero(chunk.offset, 64 << class);
                (frame.device_addr() + chunk.offset as u64, Backing::Chunk { class, chunk })
            }
            None => {
                let r = memory::dma_alloc(len, align.max(FRAME)).ok()?;
                (r.device_addr(), Backing::Region(r))
            }
        };
        // Neither allocator hands out live memory, so nothing live is displaced.
        let (buf, _) = dma.live.insert(addr, len, backing);
        Some(buf)
    }

    /// Large regions straight from the frame allocator, without the clearing `dma_alloc` does (RAM may hold
    /// what the previous boot left there: the caller clears it before anyone reads it).
    fn dma_alloc_uncleared(&self, len: usize, align: usize) -> Option<(DmaBuf, bool)> {
        if len == 0 || class_of(len, align).is_some() {
            return self.dma_alloc(len, align).map(|b| (b, true));
        }
        let r = memory::dma_alloc_uncleared(len, align.max(FRAME)).ok()?;
        let mut dma = self.dma.write();
        let (buf, _) = dma.live.insert(r.device_addr(), len, Backing::Region(r));
        Some((buf, false))
    }

    fn dma_free(&self, buf: DmaBuf) {
        let mut dma = self.dma.write();
        let backing = match dma.live.remove(buf) {
            Ok(b) => b,
            Err(why) => {
                // Not a live handle: free nothing.
                drop(dma);
                return self.fault("free of", buf, 0, buf.len(), why);
            }
        };
        match backing {
            Backing::Chunk { class, chunk } => dma.free[class].push(chunk),
            Backing::Region(r) => {
                drop(dma);
                memory::dma_free(r);
            }
        }
    }

    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        let len = out.len();
        if let Err(why) = self.access(buf, offset, len, |r, off| r.read(off, out)) {
            out.fill(0xff);
            self.fault("read of", buf, offset, len, why);
        }
    }

    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        if let Err(why) = self.access(buf, offset, data.len(), |r, off| r.write(off, data)) {
            self.fault("write of", buf, offset, data.len(), why);
        }
    }

    /// One lookup and one `write_bytes` for the whole range (the lease scrub's path).
    fn dma_zero(&self, buf: DmaBuf, offset: usize, len: usize) {
        if let Err(why) = self.access(buf, offset, len, |r, off| r.zero(off, len)) {
            self.fault("zeroing of", buf, offset, len, why);
        }
    }

    fn now_ns(&self) -> u64 {
        Instant::now().since_boot().as_nanos() as u64
    }

    fn relax(&self) {
        core::hint::spin_loop();
    }
}

/// Attempts at the DMA table's read lock on the fatal path before an access is refused.
const FATAL_LOCK_TRIES: u32 = 100_000;

/// The platform as the fatal path uses it ([`KernelHca::fatal_view`]): the same BAR and DMA memory, but an
/// access never waits for long on the DMA table's lock (a core may have panicked while holding it for writing,
/// in `dma_alloc` on a full heap say): after a bounded number of tries it is refused, silently — the fatal path
/// logs nothing through locks. Allocation is refused outright.
pub struct FatalHca<'a>(&'a KernelHca);

impl KernelHca {
    /// The view of this platform that the fatal path posts its emergency command through.
    pub fn fatal_view(&self) -> FatalHca<'_> {
        FatalHca(self)
    }
}

impl FatalHca<'_> {
    fn access(&self, buf: DmaBuf, offset: usize, len: usize, f: impl FnOnce(&DmaRegion, usize) -> bool) -> bool {
        for _ in 0..FATAL_LOCK_TRIES {
            if let Some(dma) = self.0.dma.try_read() {
                return match dma.find(buf, offset, len) {
                    Ok((r, off)) => f(r, off),
                    Err(_) => false,
                };
            }
            core::hint::spin_loop();
        }
        false
    }
}

impl Platform for FatalHca<'_> {
    fn bar_read32(&self, offset: usize) -> u32 {
        self.0.bar_read32(offset)
    }

    fn bar_write32(&self, offset: usize, value: u32) {
        self.0.bar_write32(offset, value)
    }

    fn dma_alloc(&self, _: usize, _: usize) -> Option<DmaBuf> {
        None
    }

    fn dma_free(&self, _: DmaBuf) {}

    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        let len = out.len();
        if !self.access(buf, offset, len, |r, off| r.read(off, out)) {
            out.fill(0xff);
        }
    }

    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        self.access(buf, offset, data.len(), |r, off| r.write(off, data));
    }

    fn now_ns(&self) -> u64 {
        self.0.now_ns()
    }

    fn relax(&self) {
        core::hint::spin_loop();
    }
}
