//! Multiboot2 boot information (Multiboot2 Specification 2.0, §3.6 "Boot information").
//!
//! The information is a `total_size`/`reserved` header followed by 8-byte-aligned tags (`type`, `size`), ending
//! with a type-0 tag of size 8. Implemented tags: 1 "Boot command line", 3 "Modules", 4 "Basic memory
//! information", 6 "Memory map" (`entry_size`, `entry_version`, entries of `base_addr`, `length`, `type`,
//! `reserved`), 14 "ACPI old RSDP" and 15 "ACPI new RSDP". Every other tag is skipped by its size.
//!
//! The whole structure is read as one slice once `total_size` is known, so every tag is bounds-checked
//! against what the loader said it wrote.

use super::{BootError, BootInfo, BootProtocol, MapBuilder, RegionKind, RsdpOrigin};
use crate::physmem::PhysMem;

const TAG_END: u32 = 0;
const TAG_CMDLINE: u32 = 1;
const TAG_MODULE: u32 = 3;
const TAG_BASIC_MEMINFO: u32 = 4;
const TAG_MMAP: u32 = 6;
const TAG_ACPI_OLD: u32 = 14;
const TAG_ACPI_NEW: u32 = 15;

/// `total_size` + `reserved`.
const HEADER_SIZE: u32 = 8;
/// `type` + `size`.
const TAG_HEADER_SIZE: u32 = 8;
/// Header plus the end tag: the least a well-formed structure can be.
const MIN_TOTAL_SIZE: u32 = HEADER_SIZE + TAG_HEADER_SIZE;

/// Tag header plus `mod_start` and `mod_end`, before the string.
const MODULE_MIN_SIZE: u32 = 16;
/// Tag header plus `mem_lower` and `mem_upper`.
const BASIC_MEMINFO_MIN_SIZE: u32 = 16;
/// Tag header plus `entry_size` and `entry_version`, before the entries.
const MMAP_HEADER_SIZE: u32 = 16;
/// `base_addr` (8), `length` (8), `type` (4), `reserved` (4).
const MMAP_ENTRY_MIN_SIZE: u32 = 24;
/// Tag header plus an ACPI 1.0 RSDP (20 bytes).
const ACPI_OLD_MIN_SIZE: u32 = 8 + 20;
/// Tag header plus an ACPI 2.0 RSDP (36 bytes).
const ACPI_NEW_MIN_SIZE: u32 = 8 + 36;

/// Where upper memory starts: `mem_upper` counts KiB from 1 MiB.
const UPPER_MEMORY_BASE: u64 = 0x10_0000;

/// Parses a Multiboot2 information structure at `info_addr`.
pub(crate) fn parse(info_addr: u64, mem: &impl PhysMem) -> Result<BootInfo, BootError> {
    if !info_addr.is_multiple_of(8) {
        return Err(BootError::Mb2Misaligned { addr: info_addr });
    }
    let total_size = mem
        .read_u32(info_addr)
        .ok_or(BootError::Unreadable { what: "multiboot2 information header", addr: info_addr })?;
    if total_size < MIN_TOTAL_SIZE {
        return Err(BootError::Mb2TotalSizeTooSmall { total_size });
    }
    let data = mem
        .bytes(info_addr, total_size as usize)
        .ok_or(BootError::Unreadable { what: "multiboot2 information", addr: info_addr })?;

    let mut info = BootInfo::new(BootProtocol::Multiboot2);
    // Strings and the RSDP copies live inside the tags, so this one range covers them.
    info.add_boot_data(info_addr, info_addr + u64::from(total_size))?;

    let mut map = MapBuilder::new();
    let mut saw_mmap = false;
    let mut basic: Option<(u32, u32)> = None;
    let mut acpi_old = None;
    let mut acpi_new = None;

    let mut offset = HEADER_SIZE;
    loop {
        if offset + TAG_HEADER_SIZE > total_size {
            return Err(BootError::Mb2MissingEndTag { total_size });
        }
        let tag_type = le32(data, offset);
        let size = le32(data, offset + 4);
        if size < TAG_HEADER_SIZE {
            return Err(BootError::Mb2TagTooSmall { offset, tag_type, size, min: TAG_HEADER_SIZE });
        }
        if u64::from(offset) + u64::from(size) > u64::from(total_size) {
            return Err(BootError::Mb2TagTruncated { offset, tag_type, size, total_size });
        }
        let tag = Tag {
            data: &data[offset as usize..(offset + size) as usize],
            offset,
            tag_type,
            addr: info_addr + u64::from(offset),
        };
        match tag_type {
            TAG_END => break,
            TAG_CMDLINE => {
                let s = tag.string(TAG_HEADER_SIZE, "multiboot2 command line")?;
                info.set_cmdline(s, tag.addr + u64::from(TAG_HEADER_SIZE), "multiboot2 command line")?;
            }
            TAG_MODULE => {
                tag.require(MODULE_MIN_SIZE)?;
                let start = u64::from(tag.u32_at(8));
                let end = u64::from(tag.u32_at(12));
                let s = tag.string(MODULE_MIN_SIZE, "multiboot2 module string")?;
                info.push_module(start, end, s, tag.addr + u64::from(MODULE_MIN_SIZE))?;
            }
            TAG_BASIC_MEMINFO => {
                tag.require(BASIC_MEMINFO_MIN_SIZE)?;
                basic = Some((tag.u32_at(8), tag.u32_at(12)));
            }
            TAG_MMAP => {
                tag.require(MMAP_HEADER_SIZE)?;
                walk_mmap(&tag, &mut map)?;
                saw_mmap = true;
            }
            TAG_ACPI_OLD => {
                tag.require(ACPI_OLD_MIN_SIZE)?;
                acpi_old.get_or_insert(tag.addr + u64::from(TAG_HEADER_SIZE));
            }
            TAG_ACPI_NEW => {
                tag.require(ACPI_NEW_MIN_SIZE)?;
                acpi_new.get_or_insert(tag.addr + u64::from(TAG_HEADER_SIZE));
            }
            _ => {}
        }
        // `size` excludes the padding to the next 8-byte boundary. `offset + size <= total_size` was checked, so
        // only the rounding can overflow, and then no end tag can follow.
        offset = (offset + size).checked_next_multiple_of(8).ok_or(BootError::Mb2MissingEndTag { total_size })?;
    }

    if !saw_mmap {
        // Same fallback as Multiboot 1: conventional memory below 640 KiB and contiguous RAM above 1 MiB.
        let (lower, upper) = basic.ok_or(BootError::MissingMemoryMap)?;
        map.push(0, u64::from(lower) * 1024, RegionKind::Usable)?;
        map.push(UPPER_MEMORY_BASE, u64::from(upper) * 1024, RegionKind::Usable)?;
    }
    info.memory = map.finish()?;
    // An ACPI 2.0+ RSDP reaches the XSDT and 64-bit table addresses; the 1.0 copy is only a fallback.
    info.rsdp = acpi_new.map(|a| (a, RsdpOrigin::Mb2AcpiNew)).or(acpi_old.map(|a| (a, RsdpOrigin::Mb2AcpiOld)));
    Ok(info)
}

/// One tag whose bytes (`size` of them, padding excluded) are known to lie inside the structure.
struct Tag<'a> {
    data: &'a [u8],
    offset: u32,
    tag_type: u32,
    /// Physical address of the tag, for error messages and the RSDP copies.
    addr: u64,
}

impl Tag<'_> {
    fn size(&self) -> u32 {
        self.data.len() as u32
    }

    fn require(&self, min: u32) -> Result<(), BootError> {
        if self.size() < min {
            return Err(BootError::Mb2TagTooSmall {
                offset: self.offset,
                tag_type: self.tag_type,
                size: self.size(),
                min,
            });
        }
        Ok(())
    }

    /// Only called after [`Tag::require`] covered the field.
    fn u32_at(&self, off: u32) -> u32 {
        le32(self.data, off)
    }

    /// The NUL-terminated string starting at `from`, which must end inside the tag.
    fn string(&self, from: u32, what: &'static str) -> Result<&[u8], BootError> {
        let bytes = &self.data[from as usize..];
        let addr = self.addr + u64::from(from);
        let nul = bytes.iter().position(|&b| b == 0).ok_or(BootError::StringUnterminated { what, addr })?;
        Ok(&bytes[..nul])
    }
}

/// Walks a memory map tag. `entry_size` may grow in later versions of the entry format, so entries advance by
/// it and any extra bytes are skipped; `entry_version` is therefore not checked.
fn walk_mmap(tag: &Tag<'_>, map: &mut MapBuilder) -> Result<(), BootError> {
    let entry_size = tag.u32_at(8);
    if entry_size < MMAP_ENTRY_MIN_SIZE || !entry_size.is_multiple_of(8) {
        return Err(BootError::Mb2BadMmapEntrySize { offset: tag.offset, entry_size });
    }
    let entries = &tag.data[MMAP_HEADER_SIZE as usize..];
    if !entries.len().is_multiple_of(entry_size as usize) {
        return Err(BootError::Mb2MmapPartialEntry { offset: tag.offset, size: tag.size(), entry_size });
    }
    for e in entries.chunks_exact(entry_size as usize) {
        let base = u64::from(le32(e, 0)) | (u64::from(le32(e, 4)) << 32);
        let len = u64::from(le32(e, 8)) | (u64::from(le32(e, 12)) << 32);
        map.push(base, len, RegionKind::from_multiboot_type(le32(e, 16)))?;
    }
    Ok(())
}

/// Callers have already checked `b` holds the field.
fn le32(b: &[u8], off: u32) -> u32 {
    let o = off as usize;
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[cfg(test)]
mod tests {
    use super::super::{MemoryRegion, RegionKind::*, parse as parse_boot};
    use super::*;
    use crate::bootinfo::{MAX_CMDLINE, MB2_BOOTLOADER_MAGIC};
    use crate::physmem::FakeMem;
    use std::vec::Vec;

    const INFO: u64 = 0x1_0000;

    /// Builds a Multiboot2 tag list. Tags are padded to 8 bytes as a loader must; `total_size` is computed
    /// unless overridden.
    #[derive(Default)]
    struct Mb2 {
        tags: Vec<u8>,
    }

    impl Mb2 {
        fn new() -> Self {
            Mb2::default()
        }
        /// A tag whose `size` field is `8 + payload.len()`.
        fn tag(self, ty: u32, payload: &[u8]) -> Self {
            self.raw_tag(ty, 8 + payload.len() as u32, payload)
        }
        /// A tag with an arbitrary `size` field.
        fn raw_tag(mut self, ty: u32, size: u32, payload: &[u8]) -> Self {
            self.tags.extend_from_slice(&ty.to_le_bytes());
            self.tags.extend_from_slice(&size.to_le_bytes());
            self.tags.extend_from_slice(payload);
            while !self.tags.len().is_multiple_of(8) {
                self.tags.push(0);
            }
            self
        }
        fn cmdline(self, s: &[u8]) -> Self {
            let mut p = s.to_vec();
            p.push(0);
            self.tag(TAG_CMDLINE, &p)
        }
        fn module(self, start: u32, end: u32, s: &str) -> Self {
            let mut p = Vec::new();
            p.extend_from_slice(&start.to_le_bytes());
            p.extend_from_slice(&end.to_le_bytes());
            p.extend_from_slice(s.as_bytes());
            p.push(0);
            self.tag(TAG_MODULE, &p)
        }
        fn mmap(self, entries: &[(u64, u64, u32)]) -> Self {
            self.mmap_sized(24, entries)
        }
        fn mmap_sized(self, entry_size: u32, entries: &[(u64, u64, u32)]) -> Self {
            let mut p = Vec::new();
            p.extend_from_slice(&entry_size.to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            for &(base, len, ty) in entries {
                let start = p.len();
                p.extend_from_slice(&base.to_le_bytes());
                p.extend_from_slice(&len.to_le_bytes());
                p.extend_from_slice(&ty.to_le_bytes());
                p.resize(start + entry_size as usize, 0);
            }
            self.tag(TAG_MMAP, &p)
        }
        fn end(self) -> Self {
            self.tag(TAG_END, &[])
        }
        fn bytes_with_total(&self, total_size: u32) -> Vec<u8> {
            let mut v = Vec::new();
            v.extend_from_slice(&total_size.to_le_bytes());
            v.extend_from_slice(&0u32.to_le_bytes());
            v.extend_from_slice(&self.tags);
            v
        }
        fn build(&self) -> FakeMem {
            let mut mem = FakeMem::new();
            mem.place(INFO, &self.bytes_with_total(8 + self.tags.len() as u32));
            mem
        }
    }

    fn rsdp_v1() -> Vec<u8> {
        let mut r = b"RSD PTR ".to_vec();
        r.push(0);
        r.extend_from_slice(b"BOCHS ");
        r.push(0);
        r.extend_from_slice(&0x7fb7_e074u32.to_le_bytes());
        r
    }

    fn rsdp_v2() -> Vec<u8> {
        let mut r = rsdp_v1();
        r[15] = 2;
        r.extend_from_slice(&36u32.to_le_bytes());
        r.extend_from_slice(&0x7fb7_e0e8u64.to_le_bytes());
        r.extend_from_slice(&[0; 4]);
        r
    }

    fn region(start: u64, len: u64, kind: RegionKind) -> MemoryRegion {
        MemoryRegion { start, len, kind }
    }

    /// Tag sequence of GRUB 2 booting under OVMF (`multiboot2` + `module2`), including tags we skip.
    fn grub_efi() -> Mb2 {
        Mb2::new()
            .cmdline(b"/boot/leasebox.elf log=info role=lessor")
            .tag(2, b"GRUB 2.12\0")
            .module(0x0080_0000, 0x0080_0400, "/boot/roles.toml")
            .tag(TAG_BASIC_MEMINFO, &[0x80, 0x02, 0, 0, 0x00, 0xfc, 0x01, 0])
            .mmap(&[
                (0, 0xa0000, 1),
                (0x10_0000, 0x70_0000, 1),
                (0x80_0000, 0x8000, 4),
                (0x80_8000, 0x3000, 1),
                (0x80_b000, 0x1000, 4),
                (0x80_c000, 0x5000, 1),
                (0x81_1000, 0xef000, 4),
                (0x90_0000, 0x70_0000, 1),
                (0x100_0000, 0x7e8e_c000, 1),
                (0x7f8e_c000, 0x28_0000, 2),
                (0x7fb6_c000, 0x1_2000, 3),
                (0x7fb7_e000, 0x8_0000, 4),
                (0x7fbf_e000, 0x2_0000, 1),
                (0xb000_0000, 0x1000_0000, 2),
                (0xffc0_0000, 0x40_0000, 2),
            ])
            .tag(8, &[0; 24])
            .tag(12, &0x7f9e_e018u64.to_le_bytes())
            .tag(TAG_ACPI_OLD, &rsdp_v1())
            .tag(TAG_ACPI_NEW, &rsdp_v2())
            .tag(21, &0x20_0000u32.to_le_bytes())
            .end()
    }

    #[test]
    fn grub_efi_boot_is_parsed() {
        let b = grub_efi();
        let total = 8 + b.tags.len() as u64;
        let info = parse_boot(MB2_BOOTLOADER_MAGIC, INFO, &b.build()).unwrap();
        assert_eq!(info.protocol, BootProtocol::Multiboot2);
        assert_eq!(info.cmdline(), "/boot/leasebox.elf log=info role=lessor");
        assert_eq!(
            info.memory.regions(),
            &[
                region(0, 0xa0000, Usable),
                region(0x10_0000, 0x70_0000, Usable),
                region(0x80_0000, 0x8000, AcpiNvs),
                region(0x80_8000, 0x3000, Usable),
                region(0x80_b000, 0x1000, AcpiNvs),
                region(0x80_c000, 0x5000, Usable),
                region(0x81_1000, 0xef000, AcpiNvs),
                region(0x90_0000, 0x7efe_c000, Usable),
                region(0x7f8e_c000, 0x28_0000, Reserved),
                region(0x7fb6_c000, 0x1_2000, AcpiReclaimable),
                region(0x7fb7_e000, 0x8_0000, AcpiNvs),
                region(0x7fbf_e000, 0x2_0000, Usable),
                region(0xb000_0000, 0x1000_0000, Reserved),
                region(0xffc0_0000, 0x40_0000, Reserved),
            ]
        );
        assert_eq!(info.memory.highest_usable_end(), 0x7fc1_e000);
        let m = info.modules();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].start, m[0].end, m[0].cmdline()), (0x80_0000, 0x80_0400, "/boot/roles.toml"));
        assert_eq!(info.boot_data(), &[INFO..INFO + total, 0x80_0000..0x80_0400]);
        // Tag 15 wins over tag 14; the RSDP address is the copy inside the tag, 8 bytes past its header.
        let (addr, origin) = info.rsdp.unwrap();
        assert_eq!(origin, RsdpOrigin::Mb2AcpiNew);
        assert_eq!(&crate::physmem::PhysMem::bytes(&b.build(), addr, 36).unwrap().to_vec(), &rsdp_v2());
    }

    #[test]
    fn acpi_old_is_used_without_new_and_order_does_not_matter() {
        let map = [(0, 0x9fc00, 1), (0x10_0000, 0x100_0000, 1)];
        let b = Mb2::new().tag(TAG_ACPI_OLD, &rsdp_v1()).mmap(&map).end();
        let info = parse(INFO, &b.build()).unwrap();
        assert_eq!(info.rsdp, Some((INFO + 16, RsdpOrigin::Mb2AcpiOld)));

        let b = Mb2::new().tag(TAG_ACPI_NEW, &rsdp_v2()).tag(TAG_ACPI_OLD, &rsdp_v1()).mmap(&map).end();
        assert_eq!(parse(INFO, &b.build()).unwrap().rsdp, Some((INFO + 16, RsdpOrigin::Mb2AcpiNew)));

        let b = Mb2::new().mmap(&map).end();
        assert_eq!(parse(INFO, &b.build()).unwrap().rsdp, None);
    }

    #[test]
    fn basic_meminfo_fallback_and_missing_map() {
        let mut basic = Vec::new();
        basic.extend_from_slice(&639u32.to_le_bytes());
        basic.extend_from_slice(&0x1_fc00u32.to_le_bytes());
        let info = parse(INFO, &Mb2::new().tag(TAG_BASIC_MEMINFO, &basic).end().build()).unwrap();
        assert_eq!(info.memory.regions(), &[region(0, 0x9fc00, Usable), region(0x10_0000, 0x7f0_0000, Usable)]);

        let err = parse(INFO, &Mb2::new().cmdline(b"x").end().build()).unwrap_err();
        assert_eq!(err, BootError::MissingMemoryMap);
    }

    #[test]
    fn truncated_tag_names_offset_and_type() {
        // Tag 1 fills offsets 8..0x48, then a memory map tag claims 200 bytes of a 160-byte structure.
        let b = Mb2::new().cmdline(&[b'a'; 55]).raw_tag(TAG_MMAP, 200, &[0; 80]);
        assert_eq!(b.tags.len(), 152);
        let mut mem = FakeMem::new();
        mem.place(INFO, &b.bytes_with_total(160));
        let err = parse(INFO, &mem).unwrap_err();
        assert_eq!(err, BootError::Mb2TagTruncated { offset: 0x48, tag_type: 6, size: 200, total_size: 160 });
        assert_eq!(
            std::format!("{err}"),
            "multiboot2 tag at offset 0x48 (type 6) is truncated: size 200 runs past total_size 160"
        );
    }

    #[test]
    fn tag_past_total_size_and_missing_end_tag() {
        // The end tag exists in memory but lies beyond total_size.
        let b = Mb2::new().cmdline(b"abc").end();
        let mut mem = FakeMem::new();
        mem.place(INFO, &b.bytes_with_total(24));
        assert_eq!(parse(INFO, &mem).unwrap_err(), BootError::Mb2MissingEndTag { total_size: 24 });

        // A module tag whose header fits but whose string runs past total_size.
        let b = Mb2::new().cmdline(b"abc").module(0x100_0000, 0x100_1000, "m").end();
        let mut mem = FakeMem::new();
        mem.place(INFO, &b.bytes_with_total(40));
        assert_eq!(
            parse(INFO, &mem).unwrap_err(),
            BootError::Mb2TagTruncated { offset: 24, tag_type: 3, size: 18, total_size: 40 }
        );

        let b = Mb2::new().mmap(&[(0, 0x9fc00, 1)]);
        assert_eq!(parse(INFO, &b.build()).unwrap_err(), BootError::Mb2MissingEndTag { total_size: 48 });
    }

    #[test]
    fn header_problems() {
        let mut mem = FakeMem::new();
        mem.place(INFO, &Mb2::new().bytes_with_total(8));
        let err = parse(INFO, &mem).unwrap_err();
        assert_eq!(err, BootError::Mb2TotalSizeTooSmall { total_size: 8 });

        // total_size says more than is readable.
        let mut mem = FakeMem::new();
        mem.place(INFO, &Mb2::new().end().bytes_with_total(4096));
        assert_eq!(
            parse(INFO, &mem).unwrap_err(),
            BootError::Unreadable { what: "multiboot2 information", addr: INFO }
        );

        assert_eq!(parse(INFO + 4, &grub_efi().build()).unwrap_err(), BootError::Mb2Misaligned { addr: INFO + 4 });
        assert_eq!(
            parse(INFO, &FakeMem::new()).unwrap_err(),
            BootError::Unreadable { what: "multiboot2 information header", addr: INFO }
        );
    }

    #[test]
    fn tag_size_below_header_is_refused() {
        let b = Mb2::new().raw_tag(5, 4, &[]).end();
        assert_eq!(
            parse(INFO, &b.build()).unwrap_err(),
            BootError::Mb2TagTooSmall { offset: 8, tag_type: 5, size: 4, min: 8 }
        );
        let b = Mb2::new().tag(TAG_ACPI_NEW, &rsdp_v1()).end();
        assert_eq!(
            parse(INFO, &b.build()).unwrap_err(),
            BootError::Mb2TagTooSmall { offset: 8, tag_type: 15, size: 28, min: 44 }
        );
    }

    #[test]
    fn mmap_entry_size_checks() {
        let b = Mb2::new().mmap_sized(16, &[(0, 0x9fc00, 1)]).end();
        let err = parse(INFO, &b.build()).unwrap_err();
        assert_eq!(err, BootError::Mb2BadMmapEntrySize { offset: 8, entry_size: 16 });
        assert_eq!(
            std::format!("{err}"),
            "multiboot2 memory map tag at offset 0x8 has entry_size 16 (must be at least 24 and a multiple of 8)"
        );
        let b = Mb2::new().mmap_sized(28, &[(0, 0x9fc00, 1)]).end();
        assert_eq!(parse(INFO, &b.build()).unwrap_err(), BootError::Mb2BadMmapEntrySize { offset: 8, entry_size: 28 });

        // A larger, future entry format still parses.
        let b = Mb2::new().mmap_sized(32, &[(0, 0x9fc00, 1), (0x10_0000, 0x10_0000, 1)]).end();
        assert_eq!(parse(INFO, &b.build()).unwrap().memory.usable_bytes(), 0x9fc00 + 0x10_0000);

        // 16 + 24 + 8 bytes: half an entry at the end.
        let mut p = Vec::new();
        p.extend_from_slice(&24u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&[0; 32]);
        let b = Mb2::new().tag(TAG_MMAP, &p).end();
        assert_eq!(
            parse(INFO, &b.build()).unwrap_err(),
            BootError::Mb2MmapPartialEntry { offset: 8, size: 48, entry_size: 24 }
        );
    }

    #[test]
    fn overlapping_and_empty_maps() {
        let b = Mb2::new().mmap(&[(0x10_0000, 0x10_0000, 1), (0, 0x10_0001, 2)]).end();
        assert_eq!(
            parse(INFO, &b.build()).unwrap_err(),
            BootError::OverlappingMemoryMap {
                a: region(0, 0x10_0001, Reserved),
                b: region(0x10_0000, 0x10_0000, Usable)
            }
        );
        let b = Mb2::new().mmap(&[]).end();
        assert_eq!(parse(INFO, &b.build()).unwrap_err(), BootError::EmptyMemoryMap);
        let b = Mb2::new().mmap(&[(0, 0x1000, 2), (0x10_0000, 0, 1)]).end();
        assert_eq!(parse(INFO, &b.build()).unwrap_err(), BootError::EmptyMemoryMap);
    }

    #[test]
    fn cmdline_problems() {
        let map = [(0, 0x9fc00, 1)];
        // No NUL inside the tag, though the padding after it is zero.
        let b = Mb2::new().tag(TAG_CMDLINE, b"log=debug").mmap(&map).end();
        let err = parse(INFO, &b.build()).unwrap_err();
        assert_eq!(err, BootError::StringUnterminated { what: "multiboot2 command line", addr: INFO + 16 });
        assert_eq!(std::format!("{err}"), "multiboot2 command line at 0x10010 has no terminating NUL inside its tag");

        let ok = Mb2::new().cmdline(&[b'x'; MAX_CMDLINE]).mmap(&map).end();
        assert_eq!(parse(INFO, &ok.build()).unwrap().cmdline().len(), MAX_CMDLINE);
        let long = Mb2::new().cmdline(&[b'x'; MAX_CMDLINE + 1]).mmap(&map).end();
        assert_eq!(
            parse(INFO, &long.build()).unwrap_err(),
            BootError::StringTooLong { what: "multiboot2 command line", addr: INFO + 16, limit: MAX_CMDLINE }
        );
        let bad = Mb2::new().cmdline(b"\xc3\x28").mmap(&map).end();
        assert_eq!(
            parse(INFO, &bad.build()).unwrap_err(),
            BootError::StringNotUtf8 { what: "multiboot2 command line", addr: INFO + 16 }
        );
    }

    #[test]
    fn module_problems() {
        let map = [(0, 0x9fc00, 1)];
        let b = Mb2::new().tag(TAG_MODULE, &[0; 4]).mmap(&map).end();
        assert_eq!(
            parse(INFO, &b.build()).unwrap_err(),
            BootError::Mb2TagTooSmall { offset: 8, tag_type: 3, size: 12, min: 16 }
        );
        let mut b = Mb2::new().mmap(&map);
        for i in 0..=crate::bootinfo::MAX_MODULES as u32 {
            b = b.module(0x100_0000 + i * 0x1000, 0x100_1000 + i * 0x1000, "m");
        }
        assert_eq!(parse(INFO, &b.end().build()).unwrap_err(), BootError::TooManyModules { limit: 16 });
        let b = Mb2::new().module(0x100_0000, 0x100_1000, "").mmap(&map).end();
        assert_eq!(parse(INFO, &b.build()).unwrap().modules()[0].cmdline(), "");
    }
}
