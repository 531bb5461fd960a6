//! Normalized boot information, whichever Multiboot protocol started us.
//!
//! The boot assembly hands over the boot loader's magic (EAX) and the physical address of its information
//! structure (EBX). [`parse`] dispatches on the magic to the Multiboot 1 parser ([`mb1`], Multiboot
//! Specification 0.6.96 §3.3 "Boot information format") or the Multiboot2 parser ([`mb2`], Multiboot2
//! Specification 2.0 §3.6 "Boot information"), and both produce the same [`BootInfo`]: a sorted,
//! non-overlapping [`MemoryMap`], the kernel command line, the boot modules, the RSDP location when the loader
//! gave one, and the list of physical ranges the loader's data occupies so the frame allocator leaves them
//! alone.
//!
//! Everything is read through [`PhysMem`] and stored in fixed-capacity arrays: this runs before there is a
//! heap, and a loader structure that points somewhere unreadable or overflows a limit is reported as a
//! [`BootError`] that the console prints, never as a wild read or a silent truncation.

pub mod mb1;
pub mod mb2;

use core::fmt;
use core::ops::Range;

use crate::physmem::PhysMem;

/// Normalized memory regions kept in a [`MemoryMap`].
pub const MAX_REGIONS: usize = 128;
/// Boot modules kept in a [`BootInfo`].
pub const MAX_MODULES: usize = 16;
/// Physical ranges of loader-owned data kept in [`BootInfo::boot_data`].
pub const MAX_BOOT_DATA: usize = 40;
/// Longest kernel command line accepted, in bytes, without the terminating NUL.
pub const MAX_CMDLINE: usize = 1024;
/// Longest module string accepted, in bytes, without the terminating NUL.
pub const MAX_MODULE_CMDLINE: usize = 128;

/// EAX value a Multiboot 1 compliant loader passes to the kernel (spec 0.6.96 §3.2).
pub const MB1_BOOTLOADER_MAGIC: u32 = 0x2BAD_B002;
/// EAX value a Multiboot2 compliant loader passes to the kernel (spec 2.0 §3.3).
pub const MB2_BOOTLOADER_MAGIC: u32 = 0x36d7_6289;

/// Which protocol the boot loader used to start us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootProtocol {
    Multiboot1,
    Multiboot2,
}

impl fmt::Display for BootProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootProtocol::Multiboot1 => "multiboot1",
            BootProtocol::Multiboot2 => "multiboot2",
        })
    }
}

/// What a memory region may be used for. Both Multiboot versions use the E820 type numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// Type 1: RAM free for the OS.
    Usable,
    /// Type 2 and every type the specs do not define: never touch.
    Reserved,
    /// Type 3: holds ACPI tables; reusable once they have been parsed, which we never bother to do.
    AcpiReclaimable,
    /// Type 4: must be preserved across hibernation.
    AcpiNvs,
    /// Type 5: defective RAM.
    BadMemory,
}

impl RegionKind {
    /// Maps a Multiboot 1 / Multiboot2 memory map type to a kind; unknown types are reserved, as both specs
    /// require.
    pub fn from_multiboot_type(t: u32) -> Self {
        match t {
            1 => RegionKind::Usable,
            3 => RegionKind::AcpiReclaimable,
            4 => RegionKind::AcpiNvs,
            5 => RegionKind::BadMemory,
            _ => RegionKind::Reserved,
        }
    }
}

impl fmt::Display for RegionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegionKind::Usable => "usable",
            RegionKind::Reserved => "reserved",
            RegionKind::AcpiReclaimable => "ACPI reclaimable",
            RegionKind::AcpiNvs => "ACPI NVS",
            RegionKind::BadMemory => "bad memory",
        })
    }
}

/// A physical memory range `[start, start + len)` and its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    pub start: u64,
    pub len: u64,
    pub kind: RegionKind,
}

impl MemoryRegion {
    /// One past the last byte. Saturates so a hand-built region cannot wrap; regions coming out of [`parse`]
    /// never need to.
    pub const fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }

    const EMPTY: MemoryRegion = MemoryRegion { start: 0, len: 0, kind: RegionKind::Reserved };
}

impl fmt::Display for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}, {:#x}) {}", self.start, self.end(), self.kind)
    }
}

/// The machine's physical memory layout: sorted by start, non-overlapping, no empty regions, and adjacent
/// regions of the same kind merged, so "how much RAM" and "what lies at X" have one answer each.
#[derive(Clone)]
pub struct MemoryMap {
    regions: [MemoryRegion; MAX_REGIONS],
    len: usize,
}

impl MemoryMap {
    /// A map with no regions (what [`parse`] never returns; useful as a placeholder).
    pub const fn empty() -> Self {
        MemoryMap { regions: [MemoryRegion::EMPTY; MAX_REGIONS], len: 0 }
    }

    /// Normalizes `raw` as the boot parsers do: drops empty entries, sorts, rejects overlaps, merges adjacent
    /// regions of the same kind, and requires some usable memory.
    pub fn from_regions(raw: &[MemoryRegion]) -> Result<Self, BootError> {
        let mut b = MapBuilder::new();
        for r in raw {
            b.push(r.start, r.len, r.kind)?;
        }
        b.finish()
    }

    /// The normalized regions, lowest address first.
    pub fn regions(&self) -> &[MemoryRegion] {
        &self.regions[..self.len]
    }

    /// The usable regions, lowest address first.
    pub fn usable(&self) -> impl Iterator<Item = &MemoryRegion> {
        self.regions().iter().filter(|r| r.kind == RegionKind::Usable)
    }

    /// Total bytes of usable RAM.
    pub fn usable_bytes(&self) -> u64 {
        self.usable().map(|r| r.len).sum()
    }

    /// One past the last usable byte (0 when there is none).
    pub fn highest_usable_end(&self) -> u64 {
        self.usable().map(MemoryRegion::end).max().unwrap_or(0)
    }

    /// One past the last byte of any region (0 for an empty map).
    pub fn highest_end(&self) -> u64 {
        self.regions().last().map_or(0, MemoryRegion::end)
    }
}

impl fmt::Debug for MemoryMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.regions()).finish()
    }
}

/// Collects raw loader entries and turns them into a [`MemoryMap`].
///
/// Entries are kept raw until [`MapBuilder::finish`] so an overlap error names the two entries the loader
/// actually gave, not a merged region it never wrote.
pub(crate) struct MapBuilder {
    raw: MemoryMap,
}

impl MapBuilder {
    pub(crate) const fn new() -> Self {
        MapBuilder { raw: MemoryMap::empty() }
    }

    pub(crate) fn push(&mut self, start: u64, len: u64, kind: RegionKind) -> Result<(), BootError> {
        if len == 0 {
            return Ok(());
        }
        if start.checked_add(len).is_none() {
            return Err(BootError::RegionOverflow { start, len });
        }
        let slot = self.raw.regions.get_mut(self.raw.len).ok_or(BootError::TooManyRegions { limit: MAX_REGIONS })?;
        *slot = MemoryRegion { start, len, kind };
        self.raw.len += 1;
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<MemoryMap, BootError> {
        let raw = &mut self.raw.regions[..self.raw.len];
        raw.sort_unstable_by_key(|r| (r.start, r.len));
        // Sorted by start, a region that overlaps any later one also overlaps its immediate successor, so
        // checking neighbours is enough.
        for pair in raw.windows(2) {
            if pair[0].end() > pair[1].start {
                return Err(BootError::OverlappingMemoryMap { a: pair[0], b: pair[1] });
            }
        }
        let mut out = MemoryMap::empty();
        for r in raw.iter() {
            match out.len.checked_sub(1).map(|i| &mut out.regions[i]) {
                Some(last) if last.kind == r.kind && last.end() == r.start => last.len += r.len,
                _ => {
                    out.regions[out.len] = *r;
                    out.len += 1;
                }
            }
        }
        if out.usable_bytes() == 0 {
            return Err(BootError::EmptyMemoryMap);
        }
        Ok(out)
    }
}

/// A boot module: an image the loader placed in memory, and the string it was given.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Module {
    /// First byte of the image.
    pub start: u64,
    /// One past the last byte of the image.
    pub end: u64,
    cmdline: [u8; MAX_MODULE_CMDLINE],
    cmdline_len: usize,
}

impl Module {
    const EMPTY: Module = Module { start: 0, end: 0, cmdline: [0; MAX_MODULE_CMDLINE], cmdline_len: 0 };

    /// The module's string (by convention its path and arguments).
    pub fn cmdline(&self) -> &str {
        // Only validated UTF-8 is ever stored, so the fallback is unreachable.
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }

    /// Size of the image in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the image is empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("start", &format_args!("{:#x}", self.start))
            .field("end", &format_args!("{:#x}", self.end))
            .field("cmdline", &self.cmdline())
            .finish()
    }
}

/// Where the physical address of the ACPI RSDP came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RsdpOrigin {
    /// Multiboot2 tag 14: a copy of an ACPI 1.0 RSDP inside the boot information.
    Mb2AcpiOld,
    /// Multiboot2 tag 15: a copy of an ACPI 2.0+ RSDP inside the boot information.
    Mb2AcpiNew,
    /// Found by scanning the EBDA and BIOS area (`acpi::find_rsdp_legacy`); never produced by [`parse`].
    LegacySearch,
}

/// Everything the kernel needs from the boot loader, in one protocol-independent shape.
#[derive(Clone)]
pub struct BootInfo {
    pub protocol: BootProtocol,
    pub memory: MemoryMap,
    /// Physical address of the RSDP structure. Multiboot 1 gives none; the kernel then searches for it.
    pub rsdp: Option<(u64, RsdpOrigin)>,
    cmdline: [u8; MAX_CMDLINE],
    cmdline_len: usize,
    modules: [Module; MAX_MODULES],
    modules_len: usize,
    boot_data: [Range<u64>; MAX_BOOT_DATA],
    boot_data_len: usize,
}

impl BootInfo {
    pub(crate) const fn new(protocol: BootProtocol) -> Self {
        BootInfo {
            protocol,
            memory: MemoryMap::empty(),
            rsdp: None,
            cmdline: [0; MAX_CMDLINE],
            cmdline_len: 0,
            modules: [Module::EMPTY; MAX_MODULES],
            modules_len: 0,
            boot_data: [const { 0..0 }; MAX_BOOT_DATA],
            boot_data_len: 0,
        }
    }

    /// The kernel command line (empty when the loader gave none).
    pub fn cmdline(&self) -> &str {
        // Only validated UTF-8 is ever stored, so the fallback is unreachable.
        core::str::from_utf8(&self.cmdline[..self.cmdline_len]).unwrap_or("")
    }

    /// The boot modules, in the order the loader listed them.
    pub fn modules(&self) -> &[Module] {
        &self.modules[..self.modules_len]
    }

    /// Every physical range holding loader data we still read or hand out (information structure, memory map
    /// buffer, strings, module list, module images). The frame allocator must not reuse them.
    pub fn boot_data(&self) -> &[Range<u64>] {
        &self.boot_data[..self.boot_data_len]
    }

    /// Stores the command line read from `addr`; `bytes` exclude the NUL.
    pub(crate) fn set_cmdline(&mut self, bytes: &[u8], addr: u64, what: &'static str) -> Result<(), BootError> {
        self.cmdline_len = copy_string(&mut self.cmdline, bytes, addr, what)?;
        Ok(())
    }

    /// Records a module; `string_addr` is only used in error messages.
    pub(crate) fn push_module(
        &mut self,
        start: u64,
        end: u64,
        string: &[u8],
        string_addr: u64,
    ) -> Result<(), BootError> {
        let index = self.modules_len;
        if end < start {
            return Err(BootError::BadModule { index, start, end });
        }
        let slot = self.modules.get_mut(index).ok_or(BootError::TooManyModules { limit: MAX_MODULES })?;
        let mut m = Module { start, end, ..Module::EMPTY };
        m.cmdline_len = copy_string(&mut m.cmdline, string, string_addr, "module string")?;
        *slot = m;
        self.modules_len += 1;
        self.add_boot_data(start, end)
    }

    /// Marks `[start, end)` as loader data. Empty ranges are not worth a slot.
    pub(crate) fn add_boot_data(&mut self, start: u64, end: u64) -> Result<(), BootError> {
        if end <= start {
            return Ok(());
        }
        let slot =
            self.boot_data.get_mut(self.boot_data_len).ok_or(BootError::TooManyBootRanges { limit: MAX_BOOT_DATA })?;
        *slot = start..end;
        self.boot_data_len += 1;
        Ok(())
    }
}

impl fmt::Debug for BootInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootInfo")
            .field("protocol", &self.protocol)
            .field("memory", &self.memory)
            .field("rsdp", &self.rsdp)
            .field("cmdline", &self.cmdline())
            .field("modules", &self.modules())
            .field("boot_data", &self.boot_data())
            .finish()
    }
}

/// Copies a loader string into a fixed buffer, refusing rather than truncating, and insisting on UTF-8 so the
/// rest of the kernel can treat it as `&str`.
fn copy_string(buf: &mut [u8], bytes: &[u8], addr: u64, what: &'static str) -> Result<usize, BootError> {
    let limit = buf.len();
    let dst = buf.get_mut(..bytes.len()).ok_or(BootError::StringTooLong { what, addr, limit })?;
    if core::str::from_utf8(bytes).is_err() {
        return Err(BootError::StringNotUtf8 { what, addr });
    }
    dst.copy_from_slice(bytes);
    Ok(bytes.len())
}

/// Reads the NUL-terminated string at `addr`, looking at no more than `limit + 1` bytes, and returns it
/// without the NUL.
///
/// Byte by byte on purpose: the string may end right before the edge of readable memory, so asking
/// [`PhysMem`] for a whole `limit`-sized block would wrongly fail.
pub(crate) fn read_c_string<'m>(
    mem: &'m impl PhysMem,
    addr: u64,
    limit: usize,
    what: &'static str,
) -> Result<&'m [u8], BootError> {
    let mut len = 0usize;
    loop {
        let at = addr.checked_add(len as u64).ok_or(BootError::Unreadable { what, addr })?;
        match mem.read_u8(at) {
            None => return Err(BootError::Unreadable { what, addr: at }),
            Some(0) => break,
            Some(_) if len == limit => return Err(BootError::StringTooLong { what, addr, limit }),
            Some(_) => len += 1,
        }
    }
    if len == 0 {
        return Ok(&[]);
    }
    mem.bytes(addr, len).ok_or(BootError::Unreadable { what, addr })
}

/// Why the boot information could not be used. Printed on the serial console before anything else runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootError {
    /// EAX held neither Multiboot magic: we were not started by a Multiboot loader.
    UnknownMagic(u32),
    /// A structure the loader pointed us at lies outside readable memory.
    Unreadable { what: &'static str, addr: u64 },
    /// Neither a memory map nor the basic lower/upper memory sizes were provided.
    MissingMemoryMap,
    /// The memory map has no usable bytes.
    EmptyMemoryMap,
    /// Two memory map entries claim the same bytes (`a` starts first).
    OverlappingMemoryMap { a: MemoryRegion, b: MemoryRegion },
    /// The memory map has more non-empty entries than we keep.
    TooManyRegions { limit: usize },
    /// A memory map entry's `base + length` does not fit in 64 bits.
    RegionOverflow { start: u64, len: u64 },
    /// More boot modules than we keep.
    TooManyModules { limit: usize },
    /// A module whose end lies before its start.
    BadModule { index: usize, start: u64, end: u64 },
    /// More loader-owned ranges than [`BootInfo::boot_data`] holds.
    TooManyBootRanges { limit: usize },
    /// A string longer than its buffer.
    StringTooLong { what: &'static str, addr: u64, limit: usize },
    /// A string that is not valid UTF-8.
    StringNotUtf8 { what: &'static str, addr: u64 },
    /// A Multiboot2 string whose NUL is missing from its tag.
    StringUnterminated { what: &'static str, addr: u64 },
    /// A Multiboot 1 memory map entry whose `size` is below 20 or which runs past `mmap_length`. `size` is 0 when
    /// fewer than 4 bytes remain for the `size` field itself.
    Mb1MmapEntryTruncated { offset: u32, size: u32, mmap_length: u32 },
    /// The Multiboot2 information is not 8-byte aligned (spec 2.0 §3.6.1).
    Mb2Misaligned { addr: u64 },
    /// The Multiboot2 `total_size` cannot even hold the header and the end tag.
    Mb2TotalSizeTooSmall { total_size: u32 },
    /// A Multiboot2 tag runs past `total_size`.
    Mb2TagTruncated { offset: u32, tag_type: u32, size: u32, total_size: u32 },
    /// A Multiboot2 tag too small for the fields its type defines.
    Mb2TagTooSmall { offset: u32, tag_type: u32, size: u32, min: u32 },
    /// The Multiboot2 tag list ends without the type-0 end tag.
    Mb2MissingEndTag { total_size: u32 },
    /// A Multiboot2 memory map whose `entry_size` is below 24 or not a multiple of 8.
    Mb2BadMmapEntrySize { offset: u32, entry_size: u32 },
    /// A Multiboot2 memory map tag whose entries do not fill it exactly.
    Mb2MmapPartialEntry { offset: u32, size: u32, entry_size: u32 },
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BootError::UnknownMagic(m) => write!(
                f,
                "unknown boot loader magic {m:#010x} (expected multiboot1 {MB1_BOOTLOADER_MAGIC:#010x} or \
                 multiboot2 {MB2_BOOTLOADER_MAGIC:#010x})"
            ),
            BootError::Unreadable { what, addr } => write!(f, "{what} at physical address {addr:#x} is not readable"),
            BootError::MissingMemoryMap => {
                f.write_str("boot loader provided no memory map and no basic memory information")
            }
            BootError::EmptyMemoryMap => f.write_str("boot memory map contains no usable memory"),
            BootError::OverlappingMemoryMap { a, b } => write!(f, "boot memory map entries overlap: {a} and {b}"),
            BootError::TooManyRegions { limit } => {
                write!(f, "boot memory map has more than {limit} non-empty entries")
            }
            BootError::RegionOverflow { start, len } => {
                write!(f, "boot memory map entry at {start:#x} with length {len:#x} runs past the 64-bit address space")
            }
            BootError::TooManyModules { limit } => write!(f, "more than {limit} boot modules"),
            BootError::BadModule { index, start, end } => {
                write!(f, "boot module {index} ends at {end:#x}, before its start {start:#x}")
            }
            BootError::TooManyBootRanges { limit } => {
                write!(f, "boot loader data occupies more than {limit} separate physical ranges")
            }
            BootError::StringTooLong { what, addr, limit } => {
                write!(f, "{what} at {addr:#x} is longer than {limit} bytes")
            }
            BootError::StringNotUtf8 { what, addr } => write!(f, "{what} at {addr:#x} is not valid UTF-8"),
            BootError::StringUnterminated { what, addr } => {
                write!(f, "{what} at {addr:#x} has no terminating NUL inside its tag")
            }
            BootError::Mb1MmapEntryTruncated { offset, size, mmap_length } if size < mb1::MMAP_ENTRY_MIN_SIZE => {
                write!(
                    f,
                    "multiboot1 memory map entry at offset {offset:#x} is truncated: size {size} is below the \
                     minimum {} (mmap_length {mmap_length})",
                    mb1::MMAP_ENTRY_MIN_SIZE
                )
            }
            BootError::Mb1MmapEntryTruncated { offset, size, mmap_length } => write!(
                f,
                "multiboot1 memory map entry at offset {offset:#x} is truncated: size {size} runs past mmap_length \
                 {mmap_length}"
            ),
            BootError::Mb2Misaligned { addr } => {
                write!(f, "multiboot2 information at {addr:#x} is not 8-byte aligned")
            }
            BootError::Mb2TotalSizeTooSmall { total_size } => write!(
                f,
                "multiboot2 information total_size {total_size} is too small (at least 16 bytes: header and end tag)"
            ),
            BootError::Mb2TagTruncated { offset, tag_type, size, total_size } => write!(
                f,
                "multiboot2 tag at offset {offset:#x} (type {tag_type}) is truncated: size {size} runs past \
                 total_size {total_size}"
            ),
            BootError::Mb2TagTooSmall { offset, tag_type, size, min } => write!(
                f,
                "multiboot2 tag at offset {offset:#x} (type {tag_type}) is too small: size {size}, its fields need \
                 {min}"
            ),
            BootError::Mb2MissingEndTag { total_size } => {
                write!(f, "multiboot2 tag list has no end tag within total_size {total_size}")
            }
            BootError::Mb2BadMmapEntrySize { offset, entry_size } => write!(
                f,
                "multiboot2 memory map tag at offset {offset:#x} has entry_size {entry_size} (must be at least 24 \
                 and a multiple of 8)"
            ),
            BootError::Mb2MmapPartialEntry { offset, size, entry_size } => write!(
                f,
                "multiboot2 memory map tag at offset {offset:#x} ends inside an entry: size {size} is not 16 plus \
                 a multiple of entry_size {entry_size}"
            ),
        }
    }
}

/// Parses the boot information the loader left at `info_addr`, choosing the format from `magic`.
pub fn parse(magic: u32, info_addr: u64, mem: &impl PhysMem) -> Result<BootInfo, BootError> {
    match magic {
        MB1_BOOTLOADER_MAGIC => mb1::parse(info_addr, mem),
        MB2_BOOTLOADER_MAGIC => mb2::parse(info_addr, mem),
        other => Err(BootError::UnknownMagic(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::physmem::FakeMem;

    fn r(start: u64, len: u64, kind: RegionKind) -> MemoryRegion {
        MemoryRegion { start, len, kind }
    }

    #[test]
    fn map_sorts_merges_and_drops_empty() {
        use RegionKind::*;
        let m = MemoryMap::from_regions(&[
            r(0x10_0000, 0x10_0000, Usable),
            r(0, 0x9_fc00, Usable),
            r(0x5000_0000, 0, Reserved),
            r(0x20_0000, 0x10_0000, Usable),
            r(0x9_fc00, 0x400, Reserved),
        ])
        .unwrap();
        assert_eq!(
            m.regions(),
            &[r(0, 0x9_fc00, Usable), r(0x9_fc00, 0x400, Reserved), r(0x10_0000, 0x20_0000, Usable)]
        );
        assert_eq!(m.usable_bytes(), 0x9_fc00 + 0x20_0000);
        assert_eq!(m.highest_usable_end(), 0x30_0000);
        assert_eq!(m.highest_end(), 0x30_0000);
    }

    #[test]
    fn map_rejects_overlap_naming_both_entries() {
        use RegionKind::*;
        let err =
            MemoryMap::from_regions(&[r(0x10_0000, 0x10_0000, Usable), r(0x18_0000, 0x1000, Reserved)]).unwrap_err();
        assert_eq!(
            err,
            BootError::OverlappingMemoryMap { a: r(0x10_0000, 0x10_0000, Usable), b: r(0x18_0000, 0x1000, Reserved) }
        );
    }

    #[test]
    fn map_rejects_empty_overflowing_and_too_many() {
        use RegionKind::*;
        assert_eq!(MemoryMap::from_regions(&[]).unwrap_err(), BootError::EmptyMemoryMap);
        assert_eq!(MemoryMap::from_regions(&[r(0, 0x1000, Reserved)]).unwrap_err(), BootError::EmptyMemoryMap);
        assert_eq!(
            MemoryMap::from_regions(&[r(u64::MAX - 0xfff, 0x2000, Usable)]).unwrap_err(),
            BootError::RegionOverflow { start: u64::MAX - 0xfff, len: 0x2000 }
        );
        let many: std::vec::Vec<_> = (0..=MAX_REGIONS as u64).map(|i| r(i * 0x2000, 0x1000, Usable)).collect();
        assert_eq!(MemoryMap::from_regions(&many).unwrap_err(), BootError::TooManyRegions { limit: MAX_REGIONS });
        assert_eq!(MemoryMap::from_regions(&many[..MAX_REGIONS]).unwrap().regions().len(), MAX_REGIONS);
    }

    #[test]
    fn unknown_magic_is_refused() {
        let mem = FakeMem::new();
        let err = parse(0xdead_beef, 0x1000, &mem).unwrap_err();
        assert_eq!(err, BootError::UnknownMagic(0xdead_beef));
        assert_eq!(
            std::format!("{err}"),
            "unknown boot loader magic 0xdeadbeef (expected multiboot1 0x2badb002 or multiboot2 0x36d76289)"
        );
    }

    #[test]
    fn c_string_reading_stops_at_readable_edge_and_limit() {
        let mut mem = FakeMem::new();
        mem.place(0x1000, b"abc\0");
        mem.place(0x2000, b"abcd");
        assert_eq!(read_c_string(&mem, 0x1000, 3, "s").unwrap(), b"abc");
        assert_eq!(
            read_c_string(&mem, 0x1000, 2, "s").unwrap_err(),
            BootError::StringTooLong { what: "s", addr: 0x1000, limit: 2 }
        );
        assert_eq!(
            read_c_string(&mem, 0x2000, 10, "s").unwrap_err(),
            BootError::Unreadable { what: "s", addr: 0x2004 }
        );
    }
}
