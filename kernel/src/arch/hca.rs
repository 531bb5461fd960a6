//! The mlx5 driver's platform on bare metal and in QEMU (`leasebox_mlx5::Platform`): BAR0 mapped uncached
//! and accessed with volatile 32-bit big-endian loads and stores; DMA memory from the frame allocator
//! (identity-mapped, so a device address is the physical address and the pointer); the TSC as the clock.
//!
//! Small DMA objects (doorbell records, mailbox-sized buffers) come from per-size free lists carved out of
//! whole frames, so a 64-byte record does not cost a 4 KiB frame; such chunks go back to their list, never to
//! the frame allocator. The free path gets only the length, so every allocation of a small length records
//! where it came from (its size class, or frames when its alignment asked for more than a class gives).

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::sync::atomic::{Ordering, compiler_fence};

use leasebox_mlx5::Platform;
use spin::Mutex;

use super::memory;
use crate::time::Instant;

const FRAME: usize = 4096;
/// Size classes 64, 128, ..., 2048 bytes.
const CLASSES: usize = 6;

pub struct KernelHca {
    /// Virtual (= physical) base of the mapped BAR0 (or the model's BAR2).
    bar: usize,
    bar_len: usize,
    small: Mutex<Small>,
}

/// Free chunks per size class, and where each live allocation of a small length came from (`None`: frames).
#[derive(Default)]
struct Small {
    free: [Vec<u64>; CLASSES],
    origin: BTreeMap<u64, Option<usize>>,
}

/// Lengths up to this may come from the size classes.
const SMALL_MAX: usize = 64 << (CLASSES - 1);

fn class_of(len: usize, align: usize) -> Option<usize> {
    let need = len.max(align).max(64).next_power_of_two();
    (need <= SMALL_MAX).then(|| need.trailing_zeros() as usize - 6)
}

impl KernelHca {
    /// `bar` must be mapped uncached for `bar_len` bytes (`memory::map_mmio`) with memory decoding enabled.
    pub fn new(bar: u64, bar_len: u64) -> KernelHca {
        KernelHca { bar: bar as usize, bar_len: bar_len as usize, small: Mutex::new(Default::default()) }
    }
}

impl Platform for KernelHca {
    fn bar_read32(&self, offset: usize) -> u32 {
        if offset + 4 > self.bar_len || !offset.is_multiple_of(4) {
            return u32::MAX;
        }
        // SAFETY: inside the BAR (checked), 4-aligned, mapped uncached by the constructor's contract; a device
        // register read is a plain load here.
        u32::from_be(unsafe { core::ptr::read_volatile((self.bar + offset) as *const u32) })
    }

    fn bar_write32(&self, offset: usize, value: u32) {
        if offset + 4 > self.bar_len || !offset.is_multiple_of(4) {
            return;
        }
        // Earlier DMA writes first: x86 keeps stores in order, the fence keeps the compiler from moving them.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as in `bar_read32`; the driver writes only registers it owns (cmdq address, doorbells).
        unsafe { core::ptr::write_volatile((self.bar + offset) as *mut u32, value.to_be()) }
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Option<u64> {
        let Some(c) = class_of(len, align) else {
            let r = memory::dma_alloc(len, align.max(FRAME)).ok()?;
            // Freed by address in `dma_free` (a `DmaRegion` has no destructor).
            let addr = r.device_addr();
            if len <= SMALL_MAX {
                self.small.lock().origin.insert(addr, None);
            }
            return Some(addr);
        };
        let size = 64usize << c;
        let mut small = self.small.lock();
        if small.free[c].is_empty() {
            let frame = memory::dma_alloc(FRAME, FRAME).ok()?;
            // The frame stays with this size class for good (a `DmaRegion` has no destructor).
            let base = frame.device_addr();
            small.free[c].extend((0..FRAME / size).rev().map(|i| base + (i * size) as u64));
        }
        let addr = small.free[c].pop()?;
        small.origin.insert(addr, Some(c));
        drop(small);
        // SAFETY: the chunk is ours (just taken from the free list), identity-mapped and `size` bytes long.
        unsafe { core::ptr::write_bytes(addr as *mut u8, 0, size) };
        Some(addr)
    }

    fn dma_free(&self, addr: u64, len: usize) {
        if len > SMALL_MAX {
            return memory::dma_free_addr(addr, len);
        }
        let mut small = self.small.lock();
        match small.origin.remove(&addr) {
            Some(Some(c)) => small.free[c].push(addr),
            Some(None) => {
                drop(small);
                memory::dma_free_addr(addr, len);
            }
            None => log::error!("mlx5 DMA: freeing {addr:#x}+{len:#x}, which was not allocated here"),
        }
    }

    fn dma_read(&self, addr: u64, buf: &mut [u8]) {
        compiler_fence(Ordering::SeqCst);
        let mut at = 0;
        while at < buf.len() {
            let a = addr as usize + at;
            let rest = buf.len() - at;
            if a.is_multiple_of(8) && rest >= 8 {
                // SAFETY: DMA memory the driver allocated (identity-mapped); the device writes it concurrently,
                // hence volatile, one aligned 8-byte access.
                let v = unsafe { core::ptr::read_volatile(a as *const u64) };
                buf[at..at + 8].copy_from_slice(&v.to_ne_bytes());
                at += 8;
            } else if a.is_multiple_of(4) && rest >= 4 {
                // SAFETY: as above, one aligned 4-byte access.
                let v = unsafe { core::ptr::read_volatile(a as *const u32) };
                buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
                at += 4;
            } else {
                // SAFETY: as above, one byte.
                buf[at] = unsafe { core::ptr::read_volatile(a as *const u8) };
                at += 1;
            }
        }
        compiler_fence(Ordering::SeqCst);
    }

    fn dma_write(&self, addr: u64, data: &[u8]) {
        compiler_fence(Ordering::SeqCst);
        let mut at = 0;
        while at < data.len() {
            let a = addr as usize + at;
            let rest = data.len() - at;
            if a.is_multiple_of(8) && rest >= 8 {
                let v = u64::from_ne_bytes(data[at..at + 8].try_into().unwrap_or([0; 8]));
                // SAFETY: DMA memory the driver allocated (identity-mapped); one aligned 8-byte store.
                unsafe { core::ptr::write_volatile(a as *mut u64, v) };
                at += 8;
            } else if a.is_multiple_of(4) && rest >= 4 {
                let v = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap_or([0; 4]));
                // SAFETY: as above, one aligned 4-byte store.
                unsafe { core::ptr::write_volatile(a as *mut u32, v) };
                at += 4;
            } else {
                // SAFETY: as above, one byte.
                unsafe { core::ptr::write_volatile(a as *mut u8, data[at]) };
                at += 1;
            }
        }
        compiler_fence(Ordering::SeqCst);
    }

    fn now_ns(&self) -> u64 {
        Instant::now().since_boot().as_nanos() as u64
    }

    fn relax(&self) {
        core::hint::spin_loop();
    }
}
