//! One block of bytes at one physical address: the memory the multiboot and ACPI checks hand the parsers
//! (`leasebox_kernel::physmem::PhysMem`). Included by path next to the check that uses it.

use leasebox_kernel::physmem::PhysMem;

pub struct Block {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl PhysMem for Block {
    fn bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        self.bytes.get(off..off.checked_add(len)?)
    }
}
