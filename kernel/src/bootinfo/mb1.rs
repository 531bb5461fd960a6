//! Multiboot 1 boot information (Multiboot Specification 0.6.96, §3.3 "Boot information format").
//!
//! Implemented: the `flags` word, `mem_lower`/`mem_upper` (bit 0), `cmdline` (bit 2), `mods_count`/`mods_addr`
//! and the 16-byte module entries (bit 3), and `mmap_length`/`mmap_addr` with its variable-size entries (bit
//! 6). Everything else (boot device, symbols, drives, APM, VBE, framebuffer) is ignored. Multiboot 1 carries no
//! RSDP, so [`BootInfo::rsdp`] stays `None` and the kernel searches for it.

use super::read_c_string;
use super::{BootError, BootInfo, BootProtocol, MAX_CMDLINE, MAX_MODULE_CMDLINE, MAX_MODULES, MapBuilder, RegionKind};
use crate::physmem::PhysMem;

/// `flags` bit 0: `mem_lower` and `mem_upper` are valid.
const FLAG_MEM: u32 = 1 << 0;
/// `flags` bit 2: `cmdline` is valid.
const FLAG_CMDLINE: u32 = 1 << 2;
/// `flags` bit 3: `mods_count` and `mods_addr` are valid.
const FLAG_MODS: u32 = 1 << 3;
/// `flags` bit 6: `mmap_length` and `mmap_addr` are valid.
const FLAG_MMAP: u32 = 1 << 6;

const OFF_FLAGS: u64 = 0;
const OFF_MEM_LOWER: u64 = 4;
const OFF_MEM_UPPER: u64 = 8;
const OFF_CMDLINE: u64 = 16;
const OFF_MODS_COUNT: u64 = 20;
const OFF_MODS_ADDR: u64 = 24;
const OFF_MMAP_LENGTH: u64 = 44;
const OFF_MMAP_ADDR: u64 = 48;
/// The structure through the framebuffer fields; reserved whole because the loader owns all of it, even the
/// parts we do not read.
const INFO_SIZE: u64 = 116;

/// Size of a module entry: `mod_start`, `mod_end`, `string`, `reserved`.
const MODULE_ENTRY_SIZE: u64 = 16;

/// Smallest `size` of a memory map entry: `base_addr` (8), `length` (8), `type` (4). `size` excludes itself.
pub(crate) const MMAP_ENTRY_MIN_SIZE: u32 = 20;

/// Where upper memory starts: `mem_upper` counts KiB from 1 MiB.
const UPPER_MEMORY_BASE: u64 = 0x10_0000;

/// Parses a Multiboot 1 information structure at `info_addr`.
pub(crate) fn parse(info_addr: u64, mem: &impl PhysMem) -> Result<BootInfo, BootError> {
    let field = |off: u64| read_info_u32(mem, info_addr, off);
    let flags = field(OFF_FLAGS)?;
    let mut info = BootInfo::new(BootProtocol::Multiboot1);
    info.add_boot_data(info_addr, info_addr.saturating_add(INFO_SIZE))?;

    let mut map = MapBuilder::new();
    if flags & FLAG_MMAP != 0 {
        let length = field(OFF_MMAP_LENGTH)?;
        let addr = u64::from(field(OFF_MMAP_ADDR)?);
        // An empty map is reported as such below, not as an unreadable buffer at a meaningless address.
        if length != 0 {
            let buf = mem
                .bytes(addr, length as usize)
                .ok_or(BootError::Unreadable { what: "multiboot1 memory map", addr })?;
            walk_mmap(buf, &mut map)?;
        }
        info.add_boot_data(addr, addr + u64::from(length))?;
    } else if flags & FLAG_MEM != 0 {
        // Without a map the loader only knows conventional memory below 640 KiB and the contiguous RAM above
        // 1 MiB; both are usable by definition of these fields.
        let lower = u64::from(field(OFF_MEM_LOWER)?) * 1024;
        let upper = u64::from(field(OFF_MEM_UPPER)?) * 1024;
        map.push(0, lower, RegionKind::Usable)?;
        map.push(UPPER_MEMORY_BASE, upper, RegionKind::Usable)?;
    } else {
        return Err(BootError::MissingMemoryMap);
    }
    info.memory = map.finish()?;

    if flags & FLAG_CMDLINE != 0 {
        let addr = u64::from(field(OFF_CMDLINE)?);
        // A null pointer means "no command line": reading it would return the real-mode interrupt table.
        if addr != 0 {
            let s = read_c_string(mem, addr, MAX_CMDLINE, "multiboot1 command line")?;
            info.set_cmdline(s, addr, "multiboot1 command line")?;
            info.add_boot_data(addr, addr + s.len() as u64 + 1)?;
        }
    }

    if flags & FLAG_MODS != 0 {
        let count = field(OFF_MODS_COUNT)?;
        let addr = u64::from(field(OFF_MODS_ADDR)?);
        if count as usize > MAX_MODULES {
            return Err(BootError::TooManyModules { limit: MAX_MODULES });
        }
        let list_len = u64::from(count) * MODULE_ENTRY_SIZE;
        let list =
            mem.bytes(addr, list_len as usize).ok_or(BootError::Unreadable { what: "multiboot1 module list", addr })?;
        info.add_boot_data(addr, addr + list_len)?;
        for entry in list.chunks_exact(MODULE_ENTRY_SIZE as usize) {
            let start = u64::from(le32(entry, 0));
            let end = u64::from(le32(entry, 4));
            let string_addr = u64::from(le32(entry, 8));
            let string = if string_addr == 0 {
                &[][..]
            } else {
                read_c_string(mem, string_addr, MAX_MODULE_CMDLINE, "multiboot1 module string")?
            };
            info.push_module(start, end, string, string_addr)?;
            if string_addr != 0 {
                info.add_boot_data(string_addr, string_addr + string.len() as u64 + 1)?;
            }
        }
    }
    Ok(info)
}

/// Walks the `mmap_*` buffer. Each entry's `size` excludes the `size` field itself, so entries advance by
/// `size + 4`; loaders may use a `size` above 20 to append fields we skip.
fn walk_mmap(buf: &[u8], map: &mut MapBuilder) -> Result<(), BootError> {
    let mmap_length = buf.len() as u32;
    let mut offset = 0usize;
    while offset < buf.len() {
        let truncated = |size| BootError::Mb1MmapEntryTruncated { offset: offset as u32, size, mmap_length };
        let Some(size_bytes) = buf.get(offset..offset + 4) else {
            return Err(truncated(0));
        };
        let size = le32(size_bytes, 0);
        if size < MMAP_ENTRY_MIN_SIZE {
            return Err(truncated(size));
        }
        let Some(entry) = buf.get(offset + 4..offset + 4 + size as usize) else {
            return Err(truncated(size));
        };
        map.push(le64(entry, 0), le64(entry, 8), RegionKind::from_multiboot_type(le32(entry, 16)))?;
        offset += 4 + size as usize;
    }
    Ok(())
}

fn read_info_u32(mem: &impl PhysMem, info_addr: u64, off: u64) -> Result<u32, BootError> {
    let addr =
        info_addr.checked_add(off).ok_or(BootError::Unreadable { what: "multiboot1 information", addr: info_addr })?;
    mem.read_u32(addr).ok_or(BootError::Unreadable { what: "multiboot1 information", addr })
}

/// Callers have already checked `b` holds the field.
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn le64(b: &[u8], off: usize) -> u64 {
    u64::from(le32(b, off)) | (u64::from(le32(b, off + 4)) << 32)
}

#[cfg(test)]
// Free lists and boot data are slices of ranges; comparing against one-range slices is intended.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::super::{MemoryRegion, RegionKind::*, parse as parse_boot};
    use super::*;
    use crate::bootinfo::{BootError, MB1_BOOTLOADER_MAGIC};
    use crate::physmem::FakeMem;
    use std::vec::Vec;

    const INFO: u64 = 0x9000;
    const MMAP: u64 = 0x9100;
    const CMDLINE: u64 = 0x9400;
    const MODS: u64 = 0x9c00;
    const MOD_STRINGS: u64 = 0xa000;

    /// Builds a Multiboot 1 information structure the way a loader lays it out: fixed fields at `INFO`, the
    /// memory map, command line, module list and module strings in buffers of their own.
    #[derive(Default)]
    struct Mb1 {
        flags: u32,
        mem_lower: u32,
        mem_upper: u32,
        mmap: Vec<u8>,
        cmdline: Option<Vec<u8>>,
        cmdline_ptr: Option<u32>,
        modules: Vec<(u32, u32, &'static str)>,
    }

    impl Mb1 {
        fn new() -> Self {
            Mb1::default()
        }
        fn mem(mut self, lower_kib: u32, upper_kib: u32) -> Self {
            self.flags |= FLAG_MEM;
            self.mem_lower = lower_kib;
            self.mem_upper = upper_kib;
            self
        }
        fn entry(mut self, base: u64, len: u64, ty: u32) -> Self {
            self.flags |= FLAG_MMAP;
            self.mmap.extend_from_slice(&20u32.to_le_bytes());
            self.mmap.extend_from_slice(&base.to_le_bytes());
            self.mmap.extend_from_slice(&len.to_le_bytes());
            self.mmap.extend_from_slice(&ty.to_le_bytes());
            self
        }
        fn raw_mmap(mut self, bytes: &[u8]) -> Self {
            self.flags |= FLAG_MMAP;
            self.mmap.extend_from_slice(bytes);
            self
        }
        fn cmdline(mut self, s: &[u8]) -> Self {
            self.flags |= FLAG_CMDLINE;
            let mut v = s.to_vec();
            v.push(0);
            self.cmdline = Some(v);
            self
        }
        fn module(mut self, start: u32, end: u32, s: &'static str) -> Self {
            self.flags |= FLAG_MODS;
            self.modules.push((start, end, s));
            self
        }
        /// The QEMU `-kernel` e820 map from a 128 MiB q35 guest.
        fn qemu_map(self) -> Self {
            self.entry(0, 0x9fc00, 1)
                .entry(0x9fc00, 0x400, 2)
                .entry(0xf0000, 0x10000, 2)
                .entry(0x10_0000, 0x7ee_0000, 1)
                .entry(0x7fe_0000, 0x2_0000, 2)
                .entry(0xfffc_0000, 0x4_0000, 2)
        }
        fn build(&self) -> FakeMem {
            let mut info = [0u8; INFO_SIZE as usize];
            let mut put = |off: u64, v: u32| info[off as usize..off as usize + 4].copy_from_slice(&v.to_le_bytes());
            put(OFF_FLAGS, self.flags);
            put(OFF_MEM_LOWER, self.mem_lower);
            put(OFF_MEM_UPPER, self.mem_upper);
            put(OFF_CMDLINE, self.cmdline_ptr.unwrap_or(CMDLINE as u32));
            put(OFF_MODS_COUNT, self.modules.len() as u32);
            put(OFF_MODS_ADDR, MODS as u32);
            put(OFF_MMAP_LENGTH, self.mmap.len() as u32);
            put(OFF_MMAP_ADDR, MMAP as u32);
            let mut mem = FakeMem::new();
            mem.place(INFO, &info).place(MMAP, &self.mmap);
            if let Some(c) = &self.cmdline {
                mem.place(CMDLINE, c);
            }
            let mut list = Vec::new();
            for (i, (start, end, s)) in self.modules.iter().enumerate() {
                let string_addr = MOD_STRINGS + 0x100 * i as u64;
                list.extend_from_slice(&start.to_le_bytes());
                list.extend_from_slice(&end.to_le_bytes());
                list.extend_from_slice(&(string_addr as u32).to_le_bytes());
                list.extend_from_slice(&0u32.to_le_bytes());
                let mut sb = s.as_bytes().to_vec();
                sb.push(0);
                mem.place(string_addr, &sb);
            }
            mem.place(MODS, &list);
            mem
        }
    }

    fn region(start: u64, len: u64, kind: RegionKind) -> MemoryRegion {
        MemoryRegion { start, len, kind }
    }

    #[test]
    fn qemu_kernel_boot_is_parsed() {
        let cmdline = "/path/leasebox.elf log=debug";
        let mem = Mb1::new()
            .mem(639, 130_944)
            .qemu_map()
            .cmdline(cmdline.as_bytes())
            .module(0x0020_0000, 0x0020_1234, "/path/roles.toml role=lessor")
            .build();
        let info = parse_boot(MB1_BOOTLOADER_MAGIC, INFO, &mem).unwrap();
        assert_eq!(info.protocol, BootProtocol::Multiboot1);
        assert_eq!(
            info.memory.regions(),
            &[
                region(0, 0x9fc00, Usable),
                region(0x9fc00, 0x400, Reserved),
                region(0xf0000, 0x10000, Reserved),
                region(0x10_0000, 0x7ee_0000, Usable),
                region(0x7fe_0000, 0x2_0000, Reserved),
                region(0xfffc_0000, 0x4_0000, Reserved),
            ]
        );
        assert_eq!(info.memory.usable_bytes(), 0x9fc00 + 0x7ee_0000);
        assert_eq!(info.memory.highest_usable_end(), 0x7fe_0000);
        assert_eq!(info.memory.highest_end(), 0x1_0000_0000);
        assert_eq!(info.cmdline(), cmdline);
        assert_eq!(info.rsdp, None);
        assert_eq!(info.modules().len(), 1);
        let m = &info.modules()[0];
        assert_eq!((m.start, m.end, m.cmdline()), (0x0020_0000, 0x0020_1234, "/path/roles.toml role=lessor"));
        assert_eq!(m.len(), 0x1234);
        assert_eq!(
            info.boot_data(),
            &[
                INFO..INFO + 116,
                MMAP..MMAP + 6 * 24,
                CMDLINE..CMDLINE + cmdline.len() as u64 + 1,
                MODS..MODS + 16,
                0x0020_0000..0x0020_1234,
                MOD_STRINGS..MOD_STRINGS + 29,
            ]
        );
    }

    #[test]
    fn falls_back_to_mem_lower_upper() {
        let mem = Mb1::new().mem(639, 0x1_fc00).build();
        let info = parse(INFO, &mem).unwrap();
        assert_eq!(info.memory.regions(), &[region(0, 0x9fc00, Usable), region(0x10_0000, 0x7f0_0000, Usable)]);
        assert_eq!(info.cmdline(), "");
        assert!(info.modules().is_empty());
        assert_eq!(info.boot_data(), &[INFO..INFO + 116]);
    }

    #[test]
    fn no_memory_information_is_an_error() {
        let mem = Mb1::new().cmdline(b"x").build();
        assert_eq!(parse(INFO, &mem).unwrap_err(), BootError::MissingMemoryMap);
    }

    #[test]
    fn empty_and_reserved_only_maps_are_errors() {
        let mem = Mb1::new().raw_mmap(&[]).build();
        assert_eq!(parse(INFO, &mem).unwrap_err(), BootError::EmptyMemoryMap);
        let mem = Mb1::new().entry(0x10_0000, 0, 1).entry(0, 0x1000, 2).build();
        assert_eq!(parse(INFO, &mem).unwrap_err(), BootError::EmptyMemoryMap);
    }

    #[test]
    fn overlapping_entries_are_an_error() {
        let mem = Mb1::new().entry(0x10_0000, 0x10_0000, 1).entry(0x1f_f000, 0x2000, 2).build();
        assert_eq!(
            parse(INFO, &mem).unwrap_err(),
            BootError::OverlappingMemoryMap {
                a: region(0x10_0000, 0x10_0000, Usable),
                b: region(0x1f_f000, 0x2000, Reserved)
            }
        );
    }

    #[test]
    fn mmap_entries_with_larger_size_are_walked_by_size() {
        // size 24: four trailing bytes a newer loader might append.
        let mut e = Vec::new();
        for (base, len) in [(0u64, 0x9fc00u64), (0x10_0000, 0x10_0000)] {
            e.extend_from_slice(&24u32.to_le_bytes());
            e.extend_from_slice(&base.to_le_bytes());
            e.extend_from_slice(&len.to_le_bytes());
            e.extend_from_slice(&1u32.to_le_bytes());
            e.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
        }
        let mem = Mb1::new().raw_mmap(&e).build();
        let info = parse(INFO, &mem).unwrap();
        assert_eq!(info.memory.regions(), &[region(0, 0x9fc00, Usable), region(0x10_0000, 0x10_0000, Usable)]);
    }

    #[test]
    fn truncated_mmap_entries_are_errors() {
        let mut short = Mb1::new().entry(0, 0x9fc00, 1).mmap;
        short.extend_from_slice(&16u32.to_le_bytes());
        short.extend_from_slice(&[0; 16]);
        let mem = Mb1::new().raw_mmap(&short).build();
        let err = parse(INFO, &mem).unwrap_err();
        assert_eq!(err, BootError::Mb1MmapEntryTruncated { offset: 24, size: 16, mmap_length: 44 });
        assert_eq!(
            std::format!("{err}"),
            "multiboot1 memory map entry at offset 0x18 is truncated: size 16 is below the minimum 20 \
             (mmap_length 44)"
        );

        let mut past = Mb1::new().entry(0, 0x9fc00, 1).mmap;
        past.truncate(20);
        let mem = Mb1::new().raw_mmap(&past).build();
        let err = parse(INFO, &mem).unwrap_err();
        assert_eq!(err, BootError::Mb1MmapEntryTruncated { offset: 0, size: 20, mmap_length: 20 });
        assert_eq!(
            std::format!("{err}"),
            "multiboot1 memory map entry at offset 0x0 is truncated: size 20 runs past mmap_length 20"
        );

        let mem = Mb1::new().raw_mmap(&[20, 0]).build();
        assert_eq!(
            parse(INFO, &mem).unwrap_err(),
            BootError::Mb1MmapEntryTruncated { offset: 0, size: 0, mmap_length: 2 }
        );
    }

    #[test]
    fn unreadable_pointers_are_errors() {
        let mut b = Mb1::new().qemu_map().cmdline(b"x");
        b.cmdline_ptr = Some(0x7777_0000);
        let err = parse(INFO, &b.build()).unwrap_err();
        assert_eq!(err, BootError::Unreadable { what: "multiboot1 command line", addr: 0x7777_0000 });
        assert_eq!(std::format!("{err}"), "multiboot1 command line at physical address 0x77770000 is not readable");

        assert_eq!(
            parse(0x5000, &FakeMem::new()).unwrap_err(),
            BootError::Unreadable { what: "multiboot1 information", addr: 0x5000 }
        );

        // mmap_length claims more bytes than the buffer holds.
        let mut mem = Mb1::new().qemu_map().build();
        let mut info = [0u8; INFO_SIZE as usize];
        info[..4].copy_from_slice(&FLAG_MMAP.to_le_bytes());
        info[44..48].copy_from_slice(&0x1000u32.to_le_bytes());
        info[48..52].copy_from_slice(&(MMAP as u32).to_le_bytes());
        mem.place(0x8000, &info);
        assert_eq!(
            parse(0x8000, &mem).unwrap_err(),
            BootError::Unreadable { what: "multiboot1 memory map", addr: MMAP }
        );
    }

    #[test]
    fn cmdline_limits() {
        let exact = [b'a'; MAX_CMDLINE];
        let info = parse(INFO, &Mb1::new().qemu_map().cmdline(&exact).build()).unwrap();
        assert_eq!(info.cmdline().len(), MAX_CMDLINE);

        let long = [b'a'; MAX_CMDLINE + 1];
        let err = parse(INFO, &Mb1::new().qemu_map().cmdline(&long).build()).unwrap_err();
        assert_eq!(err, BootError::StringTooLong { what: "multiboot1 command line", addr: CMDLINE, limit: 1024 });
        assert_eq!(std::format!("{err}"), "multiboot1 command line at 0x9400 is longer than 1024 bytes");

        let err = parse(INFO, &Mb1::new().qemu_map().cmdline(b"log=\xff").build()).unwrap_err();
        assert_eq!(err, BootError::StringNotUtf8 { what: "multiboot1 command line", addr: CMDLINE });
    }

    #[test]
    fn module_limits() {
        let mut b = Mb1::new().qemu_map();
        for i in 0..=MAX_MODULES as u32 {
            b = b.module(0x20_0000 + i * 0x1000, 0x20_1000 + i * 0x1000, "m");
        }
        assert_eq!(parse(INFO, &b.build()).unwrap_err(), BootError::TooManyModules { limit: MAX_MODULES });

        let long: &'static str = std::boxed::Box::leak("x".repeat(MAX_MODULE_CMDLINE + 1).into_boxed_str());
        let err = parse(INFO, &Mb1::new().qemu_map().module(0x20_0000, 0x20_1000, long).build()).unwrap_err();
        assert_eq!(err, BootError::StringTooLong { what: "multiboot1 module string", addr: MOD_STRINGS, limit: 128 });

        let err = parse(INFO, &Mb1::new().qemu_map().module(0x20_1000, 0x20_0000, "m").build()).unwrap_err();
        assert_eq!(err, BootError::BadModule { index: 0, start: 0x20_1000, end: 0x20_0000 });
    }
}
