//! The two memories the model sees: the BAR (what the driver reads and writes as the HCA's BAR0) and the
//! guest's RAM (where a device address is an offset). In QEMU runs both are shared files mapped by `shm`; in
//! hosted runs and tests they are plain buffers ([`VecMemory`]).
//!
//! Every access is bounds-checked and returns an error instead of touching memory outside the region: a
//! driver that hands the model a bad address must see a failed command, never a crashed model.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfRange {
    pub addr: u64,
    pub len: usize,
    pub size: u64,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "access {:#x}+{:#x} outside a region of {:#x} bytes", self.addr, self.len, self.size)
    }
}

/// Byte-addressed memory shared with the driver. Implementations must tolerate concurrent access by the
/// other side (the guest CPU or the hosted driver thread).
pub trait Memory: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange>;
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfRange>;

    /// Whether `[addr, addr + len)` is all memory (what a command's addresses must be before the device
    /// takes them; a memory with a hole says no for it).
    fn holds(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|end| end <= self.size())
    }

    /// Big-endian 32-bit register or field at `addr` (mlx5 structures are big-endian).
    fn read_be32(&self, addr: u64) -> Result<u32, OutOfRange> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn write_be32(&self, addr: u64, v: u32) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_be_bytes())
    }
    fn read_be64(&self, addr: u64) -> Result<u64, OutOfRange> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_be_bytes(b))
    }
    fn write_be64(&self, addr: u64, v: u64) -> Result<(), OutOfRange> {
        self.write(addr, &v.to_be_bytes())
    }

    /// The device's side of a register: replaces the big-endian 32-bit word at `addr` with `v` and returns what
    /// it held. One atomic step where the memory can make it one ([`VecMemory`], [`WriteOneToSet`]); by
    /// default a read then a write, so a write by the other side between the two is lost (shared files:
    /// `docs/hca-model.md`, "Command timing and doorbells").
    fn swap_be32(&self, addr: u64, v: u32) -> Result<u32, OutOfRange> {
        let old = self.read_be32(addr)?;
        self.write_be32(addr, v)?;
        Ok(old)
    }

    /// Whether the 32-bit word at `addr` is a write-1-to-set register: every write by the other side ORs its
    /// bits in and only [`Memory::swap_be32`] clears them, so no write is lost before the device takes it.
    fn write_one_to_set(&self, addr: u64) -> bool {
        let _ = addr;
        false
    }
}

/// Checks `[addr, addr + len)` against `size`.
pub fn check(addr: u64, len: usize, size: u64) -> Result<usize, OutOfRange> {
    let end = addr.checked_add(len as u64).ok_or(OutOfRange { addr, len, size })?;
    if end > size {
        return Err(OutOfRange { addr, len, size });
    }
    Ok(addr as usize)
}

/// Memory in a plain buffer (hosted runs without QEMU, unit tests).
pub struct VecMemory {
    bytes: Mutex<Vec<u8>>,
    size: u64,
}

impl VecMemory {
    pub fn new(size: usize) -> Self {
        VecMemory { bytes: Mutex::new(vec![0; size]), size: size as u64 }
    }

    /// A BAR of `size` bytes whose command doorbell at `at` is write-1-to-set ([`WriteOneToSet`]).
    pub fn with_doorbell(size: usize, at: u64) -> WriteOneToSet<VecMemory> {
        WriteOneToSet::new(VecMemory::new(size), at)
    }
}

/// `inner` with its aligned 32-bit word at `at` made a write-1-to-set register, as a ConnectX-5's command
/// doorbell (BAR0 0x18) is: every write ORs its bits in (the bytes of a wider write that cover the word too),
/// reads see the bits set so far, and only [`Memory::swap_be32`] — the device taking them — clears them. Two
/// doorbell writes before the device looks leave both bits set, where a plain word keeps only the second. The
/// word lives in an atomic, so both sides may use it from their own threads without a lock (the hosted
/// platform's in-process BAR and its model thread's shared mapping; never QEMU's, where the guest's store
/// goes straight to the file).
pub struct WriteOneToSet<M> {
    inner: M,
    at: u64,
    bits: AtomicU32,
}

impl<M: Memory> WriteOneToSet<M> {
    pub fn new(inner: M, at: u64) -> Self {
        WriteOneToSet { inner, at: at & !3, bits: AtomicU32::new(0) }
    }

    /// The bytes of `[addr, addr + len)` that fall in the word: (index in the access, index in the word).
    fn overlap(&self, addr: u64, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let at = self.at;
        (0..len).filter_map(move |i| {
            let a = addr + i as u64;
            (at..at + 4).contains(&a).then(|| (i, (a - at) as usize))
        })
    }
}

impl<M: Memory> Memory for WriteOneToSet<M> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn holds(&self, addr: u64, len: u64) -> bool {
        self.inner.holds(addr, len)
    }
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        self.inner.read(addr, buf)?;
        let word = self.bits.load(Ordering::Acquire).to_be_bytes();
        for (i, w) in self.overlap(addr, buf.len()) {
            buf[i] = word[w];
        }
        Ok(())
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        // The inner word is never read back, so the whole write may go through.
        self.inner.write(addr, data)?;
        let mut set = [0u8; 4];
        for (i, w) in self.overlap(addr, data.len()) {
            set[w] = data[i];
        }
        let set = u32::from_be_bytes(set);
        if set != 0 {
            self.bits.fetch_or(set, Ordering::AcqRel);
        }
        Ok(())
    }
    fn swap_be32(&self, addr: u64, v: u32) -> Result<u32, OutOfRange> {
        if addr != self.at {
            return self.inner.swap_be32(addr, v);
        }
        check(addr, 4, self.size())?;
        Ok(self.bits.swap(v, Ordering::AcqRel))
    }
    fn write_one_to_set(&self, addr: u64) -> bool {
        addr == self.at
    }
}

impl Memory for VecMemory {
    fn size(&self) -> u64 {
        self.size
    }
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        let at = check(addr, buf.len(), self.size)?;
        let b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        buf.copy_from_slice(&b[at..at + buf.len()]);
        Ok(())
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        let at = check(addr, data.len(), self.size)?;
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        b[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn swap_be32(&self, addr: u64, v: u32) -> Result<u32, OutOfRange> {
        let at = check(addr, 4, self.size)?;
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let old = u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let m = VecMemory::new(16);
        m.write_be32(12, 0x0102_0304).unwrap();
        assert_eq!(m.read_be32(12).unwrap(), 0x0102_0304);
        assert!(m.write_be32(13, 1).is_err());
        assert!(m.read(u64::MAX - 1, &mut [0; 4]).is_err());
        assert_eq!(m.swap_be32(12, 7), Ok(0x0102_0304));
        assert_eq!(m.read_be32(12), Ok(7));
        assert!(m.swap_be32(13, 1).is_err());
        assert!(!m.write_one_to_set(12));
    }

    #[test]
    fn a_doorbell_word_accumulates_writes_until_taken() {
        let m = VecMemory::with_doorbell(64, 0x18);
        assert!(m.write_one_to_set(0x18) && !m.write_one_to_set(0x14));
        m.write_be32(0x18, 1).unwrap();
        m.write_be32(0x18, 4).unwrap();
        assert_eq!(m.read_be32(0x18), Ok(5), "the second write does not replace the first");
        m.write(0x10, &[0xff; 16]).unwrap();
        assert_eq!(m.read_be32(0x18), Ok(u32::MAX), "a wide write sets bits too");
        assert_eq!(m.read_be32(0x14), Ok(u32::MAX), "its other words are plain");
        m.write(0x10, &[0; 16]).unwrap();
        assert_eq!((m.read_be32(0x14), m.read_be32(0x18)), (Ok(0), Ok(u32::MAX)), "zeros clear nothing");
        assert_eq!(m.swap_be32(0x18, 0), Ok(u32::MAX));
        assert_eq!(m.read_be32(0x18), Ok(0), "the device's take clears");
        m.write_be32(0x18, 2).unwrap();
        assert_eq!(m.read_be32(0x18), Ok(2));
        let mut b = [0u8; 2];
        m.read(0x1a, &mut b).unwrap();
        assert_eq!(b, [0, 2], "a narrow read sees its bytes of the word");
        m.write(0x1b, &[0x80]).unwrap();
        assert_eq!(m.read_be32(0x18), Ok(0x82), "a narrow write sets its bytes' bits");
        assert_eq!(m.swap_be32(0x14, 9), Ok(0), "other words swap as plain memory");
        assert_eq!(m.read_be32(0x14), Ok(9));
        assert!(m.swap_be32(0x40, 0).is_err());
    }
}
