//! The two memories the model sees: the BAR (what the driver reads and writes as the HCA's BAR0) and the
//! guest's RAM (where a device address is an offset). In QEMU runs both are shared files mapped by `shm`; in
//! hosted runs and tests they are plain buffers ([`VecMemory`]).
//!
//! Every access is bounds-checked and returns an error instead of touching memory outside the region: a
//! driver that hands the model a bad address must see a failed command, never a crashed model.

use std::fmt;
use std::sync::Mutex;

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
    }
}
