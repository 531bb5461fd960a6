//! Volatile access to memory a device shares: the one module that calls `read_volatile`/`write_volatile`
//! (`clippy.toml` disallows them elsewhere). Register windows ([`Mmio`]) are bounds-checked and fail closed:
//! a read outside the window or off a 4-byte boundary returns all ones, a write there is dropped. The raw
//! accessors are `unsafe fn`s whose callers vouch for the address.

use super::memory;
use crate::paging::MapError;
use core::sync::atomic::{Ordering, compiler_fence};

/// Reads a `T` at `addr` with one volatile load.
///
/// # Safety
/// `addr` is mapped, aligned for `T`, and readable as a `T` for the duration of the call (device registers,
/// DMA memory, page tables or boot data that the caller owns or that the device writes).
#[allow(clippy::disallowed_methods, reason = "the volatile accessors live here")]
pub unsafe fn read<T: Copy>(addr: *const T) -> T {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::read_volatile(addr) }
}

/// Writes a `T` at `addr` with one volatile store.
///
/// # Safety
/// `addr` is mapped, aligned for `T`, and writable by the caller (no Rust reference aliases it).
#[allow(clippy::disallowed_methods, reason = "the volatile accessors live here")]
pub unsafe fn write<T: Copy>(addr: *mut T, value: T) {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::write_volatile(addr, value) }
}

/// The pieces a copy of `len` bytes at `addr` is made of: (address, offset, size), each size 8 or 4 when the
/// address is aligned for it and enough bytes remain, else 1.
fn pieces(addr: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let mut at = 0;
    core::iter::from_fn(move || {
        let a = addr + at;
        let rest = len.checked_sub(at).filter(|&r| r > 0)?;
        let n = [8, 4].into_iter().find(|&n| a.is_multiple_of(n) && rest >= n).unwrap_or(1);
        at += n;
        Some((a, at - n, n))
    })
}

/// Copies `buf.len()` bytes from `addr` into `buf`: aligned 8- and 4-byte pieces are single loads, the rest
/// bytes. Compiler fences on both sides keep the copy in program order with the accesses around it.
///
/// # Safety
/// `[addr, addr + buf.len())` is mapped memory the caller may read (DMA memory it owns; the device may write
/// it concurrently).
pub unsafe fn copy_from(addr: usize, buf: &mut [u8]) {
    compiler_fence(Ordering::SeqCst);
    for (a, at, n) in pieces(addr, buf.len()) {
        // SAFETY: each piece is inside the range (the caller's contract) and aligned for its size.
        let v: [u8; 8] = unsafe {
            match n {
                8 => read(a as *const u64).to_ne_bytes(),
                4 => widen(read(a as *const u32).to_ne_bytes()),
                _ => widen([read(a as *const u8)]),
            }
        };
        buf[at..at + n].copy_from_slice(&v[..n]);
    }
    compiler_fence(Ordering::SeqCst);
}

/// Copies `data` to `addr`, in the pieces [`copy_from`] reads.
///
/// # Safety
/// `[addr, addr + data.len())` is mapped memory the caller may write (DMA memory it owns).
pub unsafe fn copy_to(addr: usize, data: &[u8]) {
    compiler_fence(Ordering::SeqCst);
    for (a, at, n) in pieces(addr, data.len()) {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&data[at..at + n]);
        // SAFETY: as in `copy_from`.
        unsafe {
            match n {
                8 => write(a as *mut u64, u64::from_ne_bytes(v)),
                4 => write(a as *mut u32, u32::from_ne_bytes([v[0], v[1], v[2], v[3]])),
                _ => write(a as *mut u8, v[0]),
            }
        }
    }
    compiler_fence(Ordering::SeqCst);
}

/// `b` at the start of 8 bytes.
fn widen<const N: usize>(b: [u8; N]) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..N].copy_from_slice(&b);
    v
}

/// A device's register window, mapped uncached: 32-bit registers at 4-byte offsets, bounds-checked.
#[derive(Debug)]
pub struct Mmio {
    base: usize,
    len: usize,
}

impl Mmio {
    /// Maps `[phys, phys + len)` uncached and returns the window.
    ///
    /// # Safety
    /// The range is a device's register window (a memory BAR), not RAM: nothing else in the address space
    /// uses it as memory, and its registers may be read and written by whoever holds the window.
    pub unsafe fn map(phys: u64, len: u64) -> Result<Mmio, MapError> {
        memory::map_mmio(phys, len)?;
        Ok(Mmio { base: phys as usize, len: len as usize })
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn inside(&self, offset: usize) -> bool {
        offset.checked_add(4).is_some_and(|end| end <= self.len) && offset.is_multiple_of(4)
    }

    /// The 32-bit register at `offset` as the bus delivers it (no byte swap); all ones outside the window
    /// or off a 4-byte boundary.
    pub fn read32(&self, offset: usize) -> u32 {
        if !self.inside(offset) {
            return u32::MAX;
        }
        // SAFETY: inside the window (checked), 4-aligned, mapped uncached by `map`'s contract.
        unsafe { read((self.base + offset) as *const u32) }
    }

    /// Writes the 32-bit register at `offset` (no byte swap) after every earlier memory write; dropped
    /// outside the window or off a 4-byte boundary.
    pub fn write32(&self, offset: usize, value: u32) {
        if !self.inside(offset) {
            return;
        }
        // Earlier DMA writes first: x86 keeps stores in order, the fence keeps the compiler from moving them.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as in `read32`.
        unsafe { write((self.base + offset) as *mut u32, value) }
    }
}
