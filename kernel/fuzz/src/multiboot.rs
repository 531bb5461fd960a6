//! The multiboot check shared by the fuzz target `multiboot` (`fuzz_targets/multiboot.rs`, libFuzzer,
//! nightly) and its stable twin (`kernel/tests/fuzz_twins.rs`); both include this file (and `mem.rs`) by path.
//!
//! The boot loader's information structure is the first thing the kernel reads, before any check of its own
//! could stand between it and the loader. One input: byte 0 picks the format (bit 0: Multiboot2, else
//! Multiboot 1) and moves the structure 4 bytes off its 8-byte boundary (bit 1); the rest is physical memory
//! at [`BASE`], where the structure starts (pointers inside a Multiboot 1 structure reach the same block).
//! Checked, for `bootinfo::parse`:
//! - no panic, whatever the bytes, and an error that prints;
//! - an accepted structure yields a memory map sorted, without overlaps and without empty regions, a command
//!   line and module strings within their limits and without NUL, at most `MAX_MODULES` modules, boot data
//!   that holds the structure itself, and (Multiboot2) an RSDP copy inside the structure.

use crate::mem::Block;
use leasebox_kernel::bootinfo::{
    self, BootProtocol, MAX_CMDLINE, MAX_MODULE_CMDLINE, MAX_MODULES, MB1_BOOTLOADER_MAGIC, MB2_BOOTLOADER_MAGIC,
};

/// Where the input's memory lies.
pub const BASE: u64 = 0x1_0000;

/// What one input did (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub mb1_accepted: u64,
    pub mb2_accepted: u64,
    pub refused: u64,
    pub with_cmdline: u64,
    pub with_modules: u64,
    pub with_rsdp: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.mb1_accepted += o.mb1_accepted;
        self.mb2_accepted += o.mb2_accepted;
        self.refused += o.refused;
        self.with_cmdline += o.with_cmdline;
        self.with_modules += o.with_modules;
        self.with_rsdp += o.with_rsdp;
    }
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let Some((&mode, rest)) = data.split_first() else { return n };
    let mb2 = mode & 1 != 0;
    let info_addr = BASE + if mode & 2 != 0 { 4 } else { 0 };
    let mem = Block { base: info_addr, bytes: rest.to_vec() };
    let magic = if mb2 { MB2_BOOTLOADER_MAGIC } else { MB1_BOOTLOADER_MAGIC };
    let info = match bootinfo::parse(magic, info_addr, &mem) {
        Ok(info) => info,
        Err(e) => {
            n.refused += 1;
            assert!(!e.to_string().is_empty());
            return n;
        }
    };
    if mb2 {
        n.mb2_accepted += 1;
        assert_eq!(info.protocol, BootProtocol::Multiboot2);
        assert!(info_addr.is_multiple_of(8), "a misaligned Multiboot2 structure is refused");
    } else {
        n.mb1_accepted += 1;
        assert_eq!(info.protocol, BootProtocol::Multiboot1);
    }
    let regions = info.memory.regions();
    assert!(!regions.is_empty());
    for r in regions {
        assert!(r.len > 0, "{r:?}");
    }
    for w in regions.windows(2) {
        assert!(w[0].end() <= w[1].start, "sorted without overlaps: {:?}", w);
    }
    let cmdline = info.cmdline();
    assert!(cmdline.len() <= MAX_CMDLINE && !cmdline.contains('\0'));
    n.with_cmdline += u64::from(!cmdline.is_empty());
    assert!(info.modules().len() <= MAX_MODULES);
    n.with_modules += u64::from(!info.modules().is_empty());
    for m in info.modules() {
        assert!(m.cmdline().len() <= MAX_MODULE_CMDLINE && !m.cmdline().contains('\0'));
    }
    assert!(info.boot_data().iter().any(|r| r.start <= info_addr && info_addr < r.end), "{:x?}", info.boot_data());
    if let Some((rsdp, _)) = info.rsdp {
        n.with_rsdp += 1;
        assert!(mb2, "Multiboot 1 carries no RSDP");
        assert!(rsdp >= info_addr && rsdp < info_addr + rest.len() as u64, "the RSDP copy lies in the structure");
    }
    n
}
