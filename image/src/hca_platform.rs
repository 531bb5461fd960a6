//! The mlx5 driver's platform in the image (`leasebox_mlx5::Platform`), built from what the kernel exports: the
//! BAR as an uncached register window (`Mmio`), DMA memory as kernel `DmaRegion`s (identity-mapped, so a
//! device address is the physical address), the TSC as the clock. No `unsafe` here: every DMA read and write
//! is checked against the live allocations (bounds and liveness) and fails closed like the BAR accessors — a
//! read outside them returns all ones, a write there is dropped, and both are logged.
//!
//! Small DMA objects (doorbell records, mailbox-sized buffers) come from per-size free lists carved out of
//! whole frames, so a 64-byte record does not cost a 4 KiB frame; such chunks go back to their list, never to
//! the frame allocator. Each allocation's handle carries an id, so a stale handle (its memory freed and handed
//! out again) frees nothing.
#![forbid(unsafe_code)]

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use leasebox_kernel::arch::memory::{self, DmaRegion};
use leasebox_kernel::arch::mmio::Mmio;
use leasebox_kernel::time::Instant;
use leasebox_mlx5::{DmaBuf, Platform};
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

/// A live allocation: the length asked for, its id, and the memory behind it.
struct Live {
    len: usize,
    id: u64,
    backing: Backing,
}

#[derive(Default)]
struct Dma {
    /// Frames carved into chunks; they stay with their class for good.
    frames: Vec<DmaRegion>,
    free: [Vec<Chunk>; CLASSES],
    /// Every live allocation by device address.
    live: BTreeMap<u64, Live>,
    /// The id the last allocation got.
    last_id: u64,
}

impl Dma {
    /// The region and offset behind `[addr, addr + len)`, when one live allocation holds all of it.
    fn find(&self, addr: u64, len: usize) -> Option<(&DmaRegion, usize)> {
        let (&start, live) = self.live.range(..=addr).next_back()?;
        let off = usize::try_from(addr - start).ok()?;
        if off.checked_add(len)? > live.len {
            return None;
        }
        match &live.backing {
            Backing::Region(r) => Some((r, off)),
            Backing::Chunk { chunk, .. } => Some((&self.frames[chunk.frame], chunk.offset + off)),
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

    /// Runs `f` on the region and offset behind `[addr, addr + len)`; `false` when no live allocation holds it.
    fn access(&self, addr: u64, len: usize, f: impl FnOnce(&DmaRegion, usize) -> bool) -> bool {
        let dma = self.dma.read();
        dma.find(addr, len).is_some_and(|(r, off)| f(r, off))
    }

    fn fault(&self, what: &str, addr: u64, len: usize) {
        let n = self.faults.fetch_add(1, Ordering::Relaxed);
        if n < LOGGED_FAULTS {
            log::error!("mlx5 DMA: {what} {addr:#x}+{len:#x} refused: not inside one live allocation");
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
        dma.last_id += 1;
        let id = dma.last_id;
        dma.live.insert(addr, Live { len, id, backing });
        Some(DmaBuf::new(addr, len, id))
    }

    fn dma_free(&self, buf: DmaBuf) {
        let mut dma = self.dma.write();
        let live = match dma.live.remove(&buf.addr()) {
            Some(l) if (l.len, l.id) == (buf.len(), buf.id()) => l,
            other => {
                // Not a live handle: keep whatever is live, free nothing.
                if let Some(l) = other {
                    dma.live.insert(buf.addr(), l);
                }
                drop(dma);
                return self.fault("free of", buf.addr(), buf.len());
            }
        };
        match live.backing {
            Backing::Chunk { class, chunk } => dma.free[class].push(chunk),
            Backing::Region(r) => {
                drop(dma);
                memory::dma_free(r);
            }
        }
    }

    fn dma_read(&self, addr: u64, buf: &mut [u8]) {
        let len = buf.len();
        if !self.access(addr, len, |r, off| r.read(off, buf)) {
            buf.fill(0xff);
            self.fault("read of", addr, len);
        }
    }

    fn dma_write(&self, addr: u64, data: &[u8]) {
        if !self.access(addr, data.len(), |r, off| r.write(off, data)) {
            self.fault("write of", addr, data.len());
        }
    }

    fn now_ns(&self) -> u64 {
        Instant::now().since_boot().as_nanos() as u64
    }

    fn relax(&self) {
        core::hint::spin_loop();
    }
}
