//! Read access to physical memory, as the boot-time parsers see it.
//!
//! Multiboot and ACPI structures point at each other by physical address. The parsers never dereference those
//! addresses themselves: they ask a [`PhysMem`], which the kernel implements over its identity map (refusing
//! anything outside it) and host tests implement over byte fixtures. A structure that points outside readable
//! memory is then a clear error, not undefined behaviour.

/// Read-only view of physical memory.
pub trait PhysMem {
    /// The `len` bytes at physical address `addr`, or `None` when any of them is not readable.
    fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]>;

    /// Little-endian `u8`/`u16`/`u32`/`u64` readers built on [`PhysMem::bytes`].
    fn read_u8(&self, addr: u64) -> Option<u8> {
        self.bytes(addr, 1).map(|b| b[0])
    }
    fn read_u16(&self, addr: u64) -> Option<u16> {
        self.bytes(addr, 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn read_u32(&self, addr: u64) -> Option<u32> {
        self.bytes(addr, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn read_u64(&self, addr: u64) -> Option<u64> {
        self.bytes(addr, 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    }
}

/// Host-test fixture: a set of byte blocks placed at physical addresses.
#[cfg(test)]
#[derive(Default)]
pub struct FakeMem {
    blocks: std::vec::Vec<(u64, std::vec::Vec<u8>)>,
}

#[cfg(test)]
impl FakeMem {
    pub fn new() -> Self {
        Self::default()
    }
    /// Places `bytes` at physical address `addr`.
    pub fn place(&mut self, addr: u64, bytes: &[u8]) -> &mut Self {
        self.blocks.push((addr, bytes.to_vec()));
        self
    }
}

#[cfg(test)]
impl PhysMem for FakeMem {
    fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.blocks.iter().find_map(|(base, b)| {
            let off = addr.checked_sub(*base)? as usize;
            b.get(off..off.checked_add(len)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn fake_mem_reads_inside_blocks_only() {
        let mut m = FakeMem::new();
        m.place(0x1000, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(m.read_u32(0x1000), Some(0x0403_0201));
        assert_eq!(m.read_u32(0x1006), None);
        assert_eq!(m.read_u8(0xfff), None);
    }
}
