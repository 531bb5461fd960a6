//! ACPI table discovery: the processors and PCIe ECAM windows the firmware describes.
//!
//! Implements, from the ACPI Specification 6.x, §5.2: the Root System Description Pointer (RSDP, §5.2.5) and
//! its legacy BIOS search (§5.2.5.1), the System Description Table Header (§5.2.6), the RSDT (§5.2.7) and XSDT
//! (§5.2.8), and the Multiple APIC Description Table (MADT, signature "APIC", §5.2.12) with its Processor Local
//! APIC (type 0), Local APIC Address Override (type 5) and Processor Local x2APIC (type 9) structures. The PCI
//! Express memory-mapped configuration table (MCFG) comes from the PCI Firmware Specification 3.x, §4.1.2; the
//! Serial Port Console Redirection table (SPCR) from Microsoft's SPCR specification (docs/reference/acpi-tables.md, "SPCR").
//!
//! All reads go through [`PhysMem`]; every table header is checked for length and checksum before any field in
//! it is believed.

use core::fmt;

use crate::console::{SpcrConsole, spcr_console};
use crate::physmem::PhysMem;

/// Processors kept in an [`AcpiInfo`]: the first this many usable ones in MADT order; the rest are counted
/// ([`AcpiInfo::skipped_cpus`]) and never started.
pub const MAX_CPUS: usize = 64;
/// ECAM windows kept in an [`AcpiInfo`].
pub const MAX_ECAM: usize = 8;

const RSDP_SIGNATURE: &[u8; 8] = b"RSD PTR ";
/// Bytes covered by the ACPI 1.0 checksum.
const RSDP_V1_LEN: usize = 20;
/// Smallest `length` of an ACPI 2.0+ RSDP (through the reserved bytes after the extended checksum).
const RSDP_V2_MIN_LEN: u32 = 36;
/// Real-mode segment of the Extended BIOS Data Area, stored by the BIOS at 40:0Eh.
const EBDA_SEGMENT_PTR: u64 = 0x40E;
/// Only the first KiB of the EBDA may hold the RSDP.
const EBDA_SEARCH_LEN: u64 = 1024;
/// The BIOS read-only area searched after the EBDA.
const BIOS_AREA_START: u64 = 0xE_0000;
const BIOS_AREA_END: u64 = 0x10_0000;
/// The RSDP sits on a 16-byte boundary.
const RSDP_ALIGN: usize = 16;

/// Size of the System Description Table Header.
const HEADER_LEN: usize = 36;
/// MADT: header, Local Interrupt Controller Address (u32), Flags (u32), then the structures.
const MADT_ENTRIES_OFFSET: usize = 44;
/// MADT Flags bit 0: a dual 8259 PIC is installed and must be masked before using the APICs.
const MADT_PCAT_COMPAT: u32 = 1 << 0;
/// MCFG: header and 8 reserved bytes, then 16-byte allocation entries.
const MCFG_ENTRIES_OFFSET: usize = 44;
const MCFG_ENTRY_LEN: usize = 16;
/// SPCR: interface type at 36, base address GAS at 40 (space id at 40, 64-bit address at 44), baud code at 58.
const SPCR_INTERFACE_TYPE: usize = 36;
const SPCR_BASE_SPACE: usize = 40;
const SPCR_BASE_ADDRESS: usize = 44;
const SPCR_BAUD: usize = 58;

const MADT_LOCAL_APIC: u8 = 0;
const MADT_LOCAL_APIC_OVERRIDE: u8 = 5;
const MADT_LOCAL_X2APIC: u8 = 9;
const LOCAL_APIC_LEN: u8 = 8;
const LOCAL_APIC_OVERRIDE_LEN: u8 = 12;
const LOCAL_X2APIC_LEN: u8 = 16;
/// Local APIC Flags bit 0: the processor is ready for use.
const LAPIC_ENABLED: u32 = 1 << 0;
/// Local APIC Flags bit 1 (ACPI 6.3+): a disabled processor that may be brought online later.
const LAPIC_ONLINE_CAPABLE: u32 = 1 << 1;

/// A four-character ACPI table signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; 4]);

impl Signature {
    pub const RSDT: Signature = Signature(*b"RSDT");
    pub const XSDT: Signature = Signature(*b"XSDT");
    pub const MADT: Signature = Signature(*b"APIC");
    pub const MCFG: Signature = Signature(*b"MCFG");
    pub const SPCR: Signature = Signature(*b"SPCR");
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A corrupt signature is exactly what ends up in an error message, so keep it printable.
        for &b in &self.0 {
            if b.is_ascii_graphic() || b == b' ' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// A processor from the MADT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    /// Local APIC ID (8-bit for type 0 entries, 32-bit x2APIC ID for type 9).
    pub apic_id: u32,
    /// ACPI Processor UID, matching the processor objects in the namespace.
    pub processor_uid: u32,
    pub enabled: bool,
    pub online_capable: bool,
    /// Described by a Processor Local x2APIC structure.
    pub is_x2apic: bool,
}

impl Cpu {
    /// Whether we may start this processor: it is running, or the firmware says it can be brought online.
    pub fn is_usable(&self) -> bool {
        self.enabled || self.online_capable
    }

    const EMPTY: Cpu = Cpu { apic_id: 0, processor_uid: 0, enabled: false, online_capable: false, is_x2apic: false };
}

/// A PCIe enhanced configuration (ECAM) window from the MCFG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcamRegion {
    /// Physical address of bus 0's configuration space in this segment, even when `start_bus` is above 0.
    pub base: u64,
    pub segment: u16,
    pub start_bus: u8,
    pub end_bus: u8,
}

impl EcamRegion {
    const EMPTY: EcamRegion = EcamRegion { base: 0, segment: 0, start_bus: 0, end_bus: 0 };
}

/// What the kernel takes from the ACPI tables.
#[derive(Clone, Debug)]
pub struct AcpiInfo {
    /// RSDP revision: 0 for ACPI 1.0, 2 for ACPI 2.0 and later.
    pub revision: u8,
    /// RSDP OEM ID, space-padded ASCII.
    pub oem_id: [u8; 6],
    /// The root table actually used ("RSDT" or "XSDT").
    pub root_table: Signature,
    /// Physical address of the local APIC registers, after any MADT Local APIC Address Override.
    pub lapic_addr: u64,
    /// MADT PCAT_COMPAT: legacy 8259 PICs are present and must be masked.
    pub pcat_compat: bool,
    /// The SPCR's console port, when the firmware has an SPCR long enough to hold it.
    pub spcr: Option<SpcrConsole>,
    cpus: [Cpu; MAX_CPUS],
    cpus_len: usize,
    skipped_cpus: usize,
    ecam: [EcamRegion; MAX_ECAM],
    ecam_len: usize,
}

impl AcpiInfo {
    /// Processors in MADT order, usable ones first, then as many unusable ones as fit (for diagnostics).
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus[..self.cpus_len]
    }

    /// Usable processors the MADT lists beyond the [`MAX_CPUS`] kept (a two-socket server with hyper-threading
    /// has more): they are left parked in the firmware's wait-for-SIPI state.
    pub fn skipped_cpus(&self) -> usize {
        self.skipped_cpus
    }

    /// Processors we may start: enabled or online capable.
    pub fn usable_cpus(&self) -> impl Iterator<Item = &Cpu> {
        self.cpus().iter().filter(|c| c.is_usable())
    }

    /// ECAM windows from the MCFG (empty when there is no MCFG, e.g. the i440FX machine).
    pub fn ecam(&self) -> &[EcamRegion] {
        &self.ecam[..self.ecam_len]
    }

    fn push_cpu(&mut self, cpu: Cpu) -> bool {
        // Firmware may describe a processor both as local APIC and as x2APIC; starting it twice would be worse
        // than listing it once.
        if self.cpus().iter().any(|c| c.apic_id == cpu.apic_id) {
            return true;
        }
        match self.cpus.get_mut(self.cpus_len) {
            Some(slot) => {
                *slot = cpu;
                self.cpus_len += 1;
                true
            }
            None => false,
        }
    }
}

/// Why the ACPI tables could not be used. Printed on the serial console at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiError {
    /// A structure lies outside readable memory.
    Unreadable { what: &'static str, addr: u64 },
    /// No "RSD PTR " signature at the given RSDP address.
    BadRsdpSignature { addr: u64 },
    /// The first 20 bytes of the RSDP do not sum to zero.
    RsdpChecksum { addr: u64 },
    /// An ACPI 2.0+ RSDP whose `length` bytes do not sum to zero.
    RsdpExtendedChecksum { addr: u64 },
    /// An ACPI 2.0+ RSDP whose `length` is below 36.
    RsdpLength { addr: u64, length: u32 },
    /// The RSDP points at neither an RSDT nor an XSDT.
    NoRootTable { addr: u64 },
    /// A table found where another was expected.
    WrongSignature { addr: u64, expected: Signature, found: Signature },
    /// A table whose `length` is below what its header or fixed fields need.
    TableTooShort { signature: Signature, addr: u64, length: u32 },
    /// A table whose header is readable but whose body is not.
    TableUnreadable { signature: Signature, addr: u64, length: u32 },
    /// A table whose bytes do not sum to zero.
    TableChecksum { signature: Signature, addr: u64 },
    /// An RSDT/XSDT whose entry area is not a whole number of entries.
    RootTableLength { signature: Signature, length: u32 },
    /// The root table lists no MADT, so we cannot find the other processors or the local APIC.
    NoMadt,
    /// A MADT structure with length below 2 or running past the end of the table.
    MadtEntryTruncated { offset: usize, entry_type: u8, length: u8, table_length: u32 },
    /// A MADT structure too short for the fields its type defines.
    MadtEntryTooShort { offset: usize, entry_type: u8, length: u8, min: u8 },
    /// An MCFG whose allocation area is not a whole number of 16-byte entries.
    McfgLength { length: u32 },
    /// An MCFG entry whose end bus is below its start bus.
    McfgBusRange { index: usize, start_bus: u8, end_bus: u8 },
    /// More MCFG entries than we keep.
    TooManyEcam { limit: usize },
}

impl fmt::Display for AcpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AcpiError::Unreadable { what, addr } => write!(f, "ACPI {what} at {addr:#x} is not readable"),
            AcpiError::BadRsdpSignature { addr } => write!(f, "no ACPI RSDP signature \"RSD PTR \" at {addr:#x}"),
            AcpiError::RsdpChecksum { addr } => write!(f, "ACPI RSDP at {addr:#x} has a bad checksum"),
            AcpiError::RsdpExtendedChecksum { addr } => {
                write!(f, "ACPI 2.0 RSDP at {addr:#x} has a bad extended checksum")
            }
            AcpiError::RsdpLength { addr, length } => {
                write!(f, "ACPI 2.0 RSDP at {addr:#x} has length {length}, below the minimum {RSDP_V2_MIN_LEN}")
            }
            AcpiError::NoRootTable { addr } => write!(f, "ACPI RSDP at {addr:#x} gives no RSDT or XSDT address"),
            AcpiError::WrongSignature { addr, expected, found } => {
                write!(f, "ACPI table at {addr:#x} has signature \"{found}\", expected \"{expected}\"")
            }
            AcpiError::TableTooShort { signature, addr, length } => {
                write!(f, "ACPI table \"{signature}\" at {addr:#x} is too short: length {length}")
            }
            AcpiError::TableUnreadable { signature, addr, length } => {
                write!(f, "ACPI table \"{signature}\" at {addr:#x} (length {length}) is not readable")
            }
            AcpiError::TableChecksum { signature, addr } => {
                write!(f, "ACPI table \"{signature}\" at {addr:#x} has a checksum mismatch")
            }
            AcpiError::RootTableLength { signature, length } => {
                write!(f, "ACPI \"{signature}\" length {length} does not hold a whole number of table pointers")
            }
            AcpiError::NoMadt => f.write_str("ACPI tables have no MADT (\"APIC\"): cannot enumerate processors"),
            AcpiError::MadtEntryTruncated { offset, entry_type, length, table_length } => write!(
                f,
                "MADT entry at offset {offset:#x} (type {entry_type}) is truncated: length {length} with table \
                 length {table_length}"
            ),
            AcpiError::MadtEntryTooShort { offset, entry_type, length, min } => write!(
                f,
                "MADT entry at offset {offset:#x} (type {entry_type}) is too short: length {length}, its fields \
                 need {min}"
            ),
            AcpiError::McfgLength { length } => {
                write!(f, "MCFG length {length} does not hold a whole number of 16-byte allocation entries")
            }
            AcpiError::McfgBusRange { index, start_bus, end_bus } => {
                write!(f, "MCFG entry {index} has end bus {end_bus} below start bus {start_bus}")
            }
            AcpiError::TooManyEcam { limit } => write!(f, "MCFG lists more than {limit} ECAM regions"),
        }
    }
}

/// The fields of a validated RSDP that we use.
struct Rsdp {
    revision: u8,
    oem_id: [u8; 6],
    rsdt_address: u32,
    /// Only for revision 2 and later.
    xsdt_address: Option<u64>,
}

fn checksum_ok(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b)) == 0
}

fn read_rsdp(mem: &impl PhysMem, addr: u64) -> Result<Rsdp, AcpiError> {
    let v1 = mem.bytes(addr, RSDP_V1_LEN).ok_or(AcpiError::Unreadable { what: "RSDP", addr })?;
    if &v1[..8] != RSDP_SIGNATURE {
        return Err(AcpiError::BadRsdpSignature { addr });
    }
    if !checksum_ok(v1) {
        return Err(AcpiError::RsdpChecksum { addr });
    }
    let mut rsdp = Rsdp { revision: v1[15], oem_id: [0; 6], rsdt_address: le32(v1, 16), xsdt_address: None };
    rsdp.oem_id.copy_from_slice(&v1[9..15]);
    if rsdp.revision >= 2 {
        let length = mem.read_u32(addr + RSDP_V1_LEN as u64).ok_or(AcpiError::Unreadable { what: "RSDP", addr })?;
        if length < RSDP_V2_MIN_LEN {
            return Err(AcpiError::RsdpLength { addr, length });
        }
        let full = mem.bytes(addr, length as usize).ok_or(AcpiError::Unreadable { what: "RSDP", addr })?;
        if !checksum_ok(full) {
            return Err(AcpiError::RsdpExtendedChecksum { addr });
        }
        rsdp.xsdt_address = Some(le64(full, 24));
    }
    Ok(rsdp)
}

/// Finds the RSDP the way a BIOS-booted OS must (ACPI §5.2.5.1): in the first KiB of the EBDA, then in
/// 0xE0000..0x100000, at 16-byte boundaries, accepting only a structure whose checksums hold.
///
/// Returns its physical address, or `None` (for instance on UEFI machines, which have neither area).
pub fn find_rsdp_legacy(mem: &impl PhysMem) -> Option<u64> {
    let ebda = mem.read_u16(EBDA_SEGMENT_PTR).map(|seg| u64::from(seg) << 4).filter(|&a| a != 0);
    ebda.and_then(|start| scan_for_rsdp(mem, start, start + EBDA_SEARCH_LEN))
        .or_else(|| scan_for_rsdp(mem, BIOS_AREA_START, BIOS_AREA_END))
}

fn scan_for_rsdp(mem: &impl PhysMem, start: u64, end: u64) -> Option<u64> {
    // A stray "RSD PTR " with a bad checksum is not the RSDP; keep looking rather than fail.
    (start..end).step_by(RSDP_ALIGN).find(|&addr| read_rsdp(mem, addr).is_ok())
}

/// A table whose length and checksum have been verified.
struct Table<'m> {
    addr: u64,
    signature: Signature,
    bytes: &'m [u8],
}

impl Table<'_> {
    fn length(&self) -> u32 {
        self.bytes.len() as u32
    }

    fn require(&self, min: usize) -> Result<(), AcpiError> {
        if self.bytes.len() < min {
            return Err(AcpiError::TableTooShort { signature: self.signature, addr: self.addr, length: self.length() });
        }
        Ok(())
    }
}

fn read_table(mem: &impl PhysMem, addr: u64) -> Result<Table<'_>, AcpiError> {
    let header = mem.bytes(addr, HEADER_LEN).ok_or(AcpiError::Unreadable { what: "table header", addr })?;
    let signature = Signature([header[0], header[1], header[2], header[3]]);
    let length = le32(header, 4);
    if (length as usize) < HEADER_LEN {
        return Err(AcpiError::TableTooShort { signature, addr, length });
    }
    let bytes = mem.bytes(addr, length as usize).ok_or(AcpiError::TableUnreadable { signature, addr, length })?;
    if !checksum_ok(bytes) {
        return Err(AcpiError::TableChecksum { signature, addr });
    }
    Ok(Table { addr, signature, bytes })
}

/// Parses the tables reachable from the RSDP at `rsdp_addr`.
pub fn parse(mem: &impl PhysMem, rsdp_addr: u64) -> Result<AcpiInfo, AcpiError> {
    let rsdp = read_rsdp(mem, rsdp_addr)?;
    // The XSDT supersedes the RSDT when present (§5.2.5.3): its 64-bit pointers may reach tables the RSDT cannot.
    let (root_addr, expected, pointer_len) = match rsdp.xsdt_address {
        Some(x) if x != 0 => (x, Signature::XSDT, 8),
        _ if rsdp.rsdt_address != 0 => (u64::from(rsdp.rsdt_address), Signature::RSDT, 4),
        _ => return Err(AcpiError::NoRootTable { addr: rsdp_addr }),
    };
    let root = read_table(mem, root_addr)?;
    if root.signature != expected {
        return Err(AcpiError::WrongSignature { addr: root_addr, expected, found: root.signature });
    }
    let pointers = &root.bytes[HEADER_LEN..];
    if !pointers.len().is_multiple_of(pointer_len) {
        return Err(AcpiError::RootTableLength { signature: root.signature, length: root.length() });
    }

    let mut madt = None;
    let mut mcfg = None;
    let mut spcr = None;
    for p in pointers.chunks_exact(pointer_len) {
        let addr = if pointer_len == 8 { le64(p, 0) } else { u64::from(le32(p, 0)) };
        // Some firmware leaves null slots in the root table; they point at nothing.
        if addr == 0 {
            continue;
        }
        let table = read_table(mem, addr)?;
        match table.signature {
            Signature::MADT if madt.is_none() => madt = Some(table),
            Signature::MCFG if mcfg.is_none() => mcfg = Some(table),
            Signature::SPCR if spcr.is_none() => spcr = Some(table),
            _ => {}
        }
    }

    let mut info = AcpiInfo {
        revision: rsdp.revision,
        oem_id: rsdp.oem_id,
        root_table: root.signature,
        lapic_addr: 0,
        pcat_compat: false,
        // A table too short for the fields is ignored rather than failing the boot: the console stays on COM1.
        spcr: spcr.filter(|t| t.bytes.len() > SPCR_BAUD).map(|t| {
            spcr_console(
                t.bytes[SPCR_INTERFACE_TYPE],
                t.bytes[SPCR_BASE_SPACE],
                le64(t.bytes, SPCR_BASE_ADDRESS),
                t.bytes[SPCR_BAUD],
            )
        }),
        cpus: [Cpu::EMPTY; MAX_CPUS],
        cpus_len: 0,
        skipped_cpus: 0,
        ecam: [EcamRegion::EMPTY; MAX_ECAM],
        ecam_len: 0,
    };
    parse_madt(&madt.ok_or(AcpiError::NoMadt)?, &mut info)?;
    if let Some(mcfg) = mcfg {
        parse_mcfg(&mcfg, &mut info)?;
    }
    Ok(info)
}

/// One MADT Interrupt Controller Structure.
struct MadtEntry<'a> {
    offset: usize,
    entry_type: u8,
    bytes: &'a [u8],
}

impl MadtEntry<'_> {
    fn require(&self, min: u8) -> Result<(), AcpiError> {
        if self.bytes.len() < usize::from(min) {
            return Err(AcpiError::MadtEntryTooShort {
                offset: self.offset,
                entry_type: self.entry_type,
                length: self.bytes.len() as u8,
                min,
            });
        }
        Ok(())
    }
}

/// Calls `f` for every MADT structure, checking each `length` against the table first.
fn for_each_madt_entry<'a>(
    madt: &Table<'a>,
    mut f: impl FnMut(MadtEntry<'a>) -> Result<(), AcpiError>,
) -> Result<(), AcpiError> {
    let bytes = madt.bytes;
    let mut offset = MADT_ENTRIES_OFFSET;
    while offset < bytes.len() {
        let entry_type = bytes[offset];
        let length = bytes.get(offset + 1).copied().unwrap_or(0);
        if length < 2 || offset + usize::from(length) > bytes.len() {
            return Err(AcpiError::MadtEntryTruncated { offset, entry_type, length, table_length: madt.length() });
        }
        f(MadtEntry { offset, entry_type, bytes: &bytes[offset..offset + usize::from(length)] })?;
        offset += usize::from(length);
    }
    Ok(())
}

fn madt_cpu(e: &MadtEntry<'_>) -> Result<Option<Cpu>, AcpiError> {
    let (apic_id, processor_uid, flags, is_x2apic) = match e.entry_type {
        MADT_LOCAL_APIC => {
            e.require(LOCAL_APIC_LEN)?;
            (u32::from(e.bytes[3]), u32::from(e.bytes[2]), le32(e.bytes, 4), false)
        }
        MADT_LOCAL_X2APIC => {
            e.require(LOCAL_X2APIC_LEN)?;
            (le32(e.bytes, 4), le32(e.bytes, 12), le32(e.bytes, 8), true)
        }
        _ => return Ok(None),
    };
    Ok(Some(Cpu {
        apic_id,
        processor_uid,
        enabled: flags & LAPIC_ENABLED != 0,
        online_capable: flags & LAPIC_ONLINE_CAPABLE != 0,
        is_x2apic,
    }))
}

fn parse_madt(madt: &Table<'_>, info: &mut AcpiInfo) -> Result<(), AcpiError> {
    madt.require(MADT_ENTRIES_OFFSET)?;
    info.lapic_addr = u64::from(le32(madt.bytes, 36));
    info.pcat_compat = le32(madt.bytes, 40) & MADT_PCAT_COMPAT != 0;

    // Usable processors first, so that servers listing many disabled placeholder entries (one per possible
    // hot-plug socket) do not crowd out the processors we can actually run on. Beyond `MAX_CPUS` usable ones
    // the rest are counted, not kept: the kernel runs on the first ones, the rest stay parked. Every entry is
    // still checked, so a malformed table fails the same way whatever the processor count.
    for_each_madt_entry(madt, |e| {
        if e.entry_type == MADT_LOCAL_APIC_OVERRIDE {
            e.require(LOCAL_APIC_OVERRIDE_LEN)?;
            info.lapic_addr = le64(e.bytes, 4);
        }
        if let Some(cpu) = madt_cpu(&e)?
            && cpu.is_usable()
            && !info.push_cpu(cpu)
        {
            info.skipped_cpus += 1;
        }
        Ok(())
    })?;
    for_each_madt_entry(madt, |e| {
        if let Some(cpu) = madt_cpu(&e)?
            && !cpu.is_usable()
        {
            // Kept only for diagnostics; dropping the excess is harmless.
            let _ = info.push_cpu(cpu);
        }
        Ok(())
    })
}

fn parse_mcfg(mcfg: &Table<'_>, info: &mut AcpiInfo) -> Result<(), AcpiError> {
    mcfg.require(MCFG_ENTRIES_OFFSET)?;
    let entries = &mcfg.bytes[MCFG_ENTRIES_OFFSET..];
    if !entries.len().is_multiple_of(MCFG_ENTRY_LEN) {
        return Err(AcpiError::McfgLength { length: mcfg.length() });
    }
    for (index, e) in entries.chunks_exact(MCFG_ENTRY_LEN).enumerate() {
        let region = EcamRegion {
            base: le64(e, 0),
            segment: u16::from_le_bytes([e[8], e[9]]),
            start_bus: e[10],
            end_bus: e[11],
        };
        if region.end_bus < region.start_bus {
            return Err(AcpiError::McfgBusRange { index, start_bus: region.start_bus, end_bus: region.end_bus });
        }
        let slot = info.ecam.get_mut(index).ok_or(AcpiError::TooManyEcam { limit: MAX_ECAM })?;
        *slot = region;
        info.ecam_len = index + 1;
    }
    Ok(())
}

/// Callers have already checked `b` holds the field.
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn le64(b: &[u8], off: usize) -> u64 {
    u64::from(le32(b, off)) | (u64::from(le32(b, off + 4)) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::physmem::FakeMem;
    use std::vec::Vec;

    /// Fills in the checksum byte at `at` so that `bytes` sums to zero.
    fn fix_checksum(bytes: &mut [u8], at: usize) {
        bytes[at] = 0;
        let sum = bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b));
        bytes[at] = 0u8.wrapping_sub(sum);
    }

    /// A System Description Table with a correct length and checksum, as QEMU's `BOCHS `/`BXPC` builds them.
    fn table(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(sig);
        t.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_le_bytes());
        t.push(1); // revision
        t.push(0); // checksum
        t.extend_from_slice(b"BOCHS ");
        t.extend_from_slice(b"BXPC    ");
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(b"BXPC");
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(body);
        fix_checksum(&mut t, 9);
        t
    }

    fn rsdp(revision: u8, rsdt: u32, xsdt: u64) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(RSDP_SIGNATURE);
        r.push(0);
        r.extend_from_slice(b"BOCHS ");
        r.push(revision);
        r.extend_from_slice(&rsdt.to_le_bytes());
        if revision >= 2 {
            r.extend_from_slice(&36u32.to_le_bytes());
            r.extend_from_slice(&xsdt.to_le_bytes());
            r.extend_from_slice(&[0; 4]);
            fix_checksum(&mut r[..20], 8);
            fix_checksum(&mut r, 32);
        } else {
            fix_checksum(&mut r, 8);
        }
        r
    }

    fn rsdt(tables: &[u32]) -> Vec<u8> {
        table(b"RSDT", &tables.iter().flat_map(|a| a.to_le_bytes()).collect::<Vec<_>>())
    }

    fn xsdt(tables: &[u64]) -> Vec<u8> {
        table(b"XSDT", &tables.iter().flat_map(|a| a.to_le_bytes()).collect::<Vec<_>>())
    }

    fn lapic(uid: u8, id: u8, flags: u32) -> Vec<u8> {
        let mut e = std::vec![MADT_LOCAL_APIC, 8, uid, id];
        e.extend_from_slice(&flags.to_le_bytes());
        e
    }

    fn x2apic(id: u32, flags: u32, uid: u32) -> Vec<u8> {
        let mut e = std::vec![MADT_LOCAL_X2APIC, 16, 0, 0];
        e.extend_from_slice(&id.to_le_bytes());
        e.extend_from_slice(&flags.to_le_bytes());
        e.extend_from_slice(&uid.to_le_bytes());
        e
    }

    fn lapic_override(addr: u64) -> Vec<u8> {
        let mut e = std::vec![MADT_LOCAL_APIC_OVERRIDE, 12, 0, 0];
        e.extend_from_slice(&addr.to_le_bytes());
        e
    }

    /// I/O APIC (type 1), interrupt source override (type 2) and local APIC NMI (type 4), which QEMU emits and
    /// we skip.
    fn qemu_other_entries() -> Vec<Vec<u8>> {
        let mut ioapic = std::vec![1, 12, 0, 0];
        ioapic.extend_from_slice(&0xfec0_0000u32.to_le_bytes());
        ioapic.extend_from_slice(&0u32.to_le_bytes());
        let iso = std::vec![2, 10, 0, 0, 2, 0, 0, 0, 0, 0];
        let nmi = std::vec![4, 6, 0xff, 0, 0, 1];
        std::vec![ioapic, iso, nmi]
    }

    fn madt(lapic_addr: u32, flags: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&lapic_addr.to_le_bytes());
        body.extend_from_slice(&flags.to_le_bytes());
        for e in entries {
            body.extend_from_slice(e);
        }
        table(b"APIC", &body)
    }

    fn mcfg(entries: &[(u64, u16, u8, u8)]) -> Vec<u8> {
        let mut body = std::vec![0; 8];
        for &(base, seg, start, end) in entries {
            body.extend_from_slice(&base.to_le_bytes());
            body.extend_from_slice(&seg.to_le_bytes());
            body.extend_from_slice(&[start, end, 0, 0, 0, 0]);
        }
        table(b"MCFG", &body)
    }

    const RSDP_ADDR: u64 = 0xf_5a40;
    const RSDT_ADDR: u32 = 0x7ffe_2000;
    const FACP_ADDR: u32 = 0x7ffe_2100;
    const APIC_ADDR: u32 = 0x7ffe_2300;
    const MCFG_ADDR: u32 = 0x7ffe_2400;
    const XSDT_ADDR: u64 = 0x1_0000_0000;

    fn three_cpus() -> Vec<Vec<u8>> {
        let mut e = std::vec![lapic(0, 0, 1), lapic(1, 1, 1), lapic(2, 2, 1)];
        e.extend(qemu_other_entries());
        e
    }

    /// QEMU q35 with `-smp 3`: RSDP rev 0 in the BIOS area, RSDT -> FACP, APIC, MCFG.
    fn q35() -> FakeMem {
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0))
            .place(RSDT_ADDR.into(), &rsdt(&[FACP_ADDR, APIC_ADDR, MCFG_ADDR]))
            .place(FACP_ADDR.into(), &table(b"FACP", &[0; 208]))
            .place(APIC_ADDR.into(), &madt(0xfee0_0000, 1, &three_cpus()))
            .place(MCFG_ADDR.into(), &mcfg(&[(0xb000_0000, 0, 0, 255)]));
        mem
    }

    fn cpu(apic_id: u32, uid: u32, enabled: bool) -> Cpu {
        Cpu { apic_id, processor_uid: uid, enabled, online_capable: false, is_x2apic: false }
    }

    #[test]
    fn qemu_q35_tables() {
        let info = parse(&q35(), RSDP_ADDR).unwrap();
        assert_eq!(info.revision, 0);
        assert_eq!(&info.oem_id, b"BOCHS ");
        assert_eq!(info.root_table, Signature::RSDT);
        assert_eq!(info.lapic_addr, 0xfee0_0000);
        assert!(info.pcat_compat);
        assert_eq!(info.cpus(), &[cpu(0, 0, true), cpu(1, 1, true), cpu(2, 2, true)]);
        assert_eq!(info.usable_cpus().count(), 3);
        assert_eq!(info.ecam(), &[EcamRegion { base: 0xb000_0000, segment: 0, start_bus: 0, end_bus: 255 }]);
    }

    #[test]
    fn xsdt_is_preferred_for_revision_2() {
        let mut mem = q35();
        // The RSDT still describes three CPUs; the XSDT's MADT differs, proving which root was followed.
        let x_madt = 0x1_0000_1000u64;
        let entries = std::vec![
            lapic(0, 0, 1),
            x2apic(0x100, 1, 1),
            x2apic(0, 1, 0), // the BSP again, as some firmware does: listed once
            lapic_override(0x1_fee0_0000),
        ];
        mem.place(0xf_0000, &rsdp(2, RSDT_ADDR, XSDT_ADDR))
            .place(XSDT_ADDR, &xsdt(&[u64::from(FACP_ADDR), 0, x_madt]))
            .place(x_madt, &madt(0xfee0_0000, 0, &entries));
        let info = parse(&mem, 0xf_0000).unwrap();
        assert_eq!(info.revision, 2);
        assert_eq!(info.root_table, Signature::XSDT);
        assert_eq!(info.lapic_addr, 0x1_fee0_0000);
        assert!(!info.pcat_compat);
        assert_eq!(
            info.cpus(),
            &[
                cpu(0, 0, true),
                Cpu { apic_id: 0x100, processor_uid: 1, enabled: true, online_capable: false, is_x2apic: true }
            ]
        );
        assert!(info.ecam().is_empty(), "no MCFG in the XSDT");
    }

    #[test]
    fn revision_2_with_null_xsdt_uses_rsdt() {
        let mut mem = q35();
        mem.place(0xf_0000, &rsdp(2, RSDT_ADDR, 0));
        let info = parse(&mem, 0xf_0000).unwrap();
        assert_eq!(info.root_table, Signature::RSDT);
        assert_eq!(info.cpus().len(), 3);
    }

    #[test]
    fn legacy_search_finds_rsdp_in_ebda() {
        let mut mem = FakeMem::new();
        let ebda = 0x9_fc00u64;
        let mut area = std::vec![0u8; 1024];
        // A decoy with a broken checksum comes first and must be skipped.
        let mut decoy = rsdp(0, 0x1234, 0);
        decoy[8] ^= 0xff;
        area[0x20..0x20 + 20].copy_from_slice(&decoy);
        // Unaligned copies do not count.
        area[0x48..0x48 + 20].copy_from_slice(&rsdp(0, RSDT_ADDR, 0));
        area[0x80..0x80 + 36].copy_from_slice(&rsdp(2, RSDT_ADDR, XSDT_ADDR));
        mem.place(0x40e, &((ebda >> 4) as u16).to_le_bytes()).place(ebda, &area);
        assert_eq!(find_rsdp_legacy(&mem), Some(ebda + 0x80));
    }

    #[test]
    fn legacy_search_falls_back_to_bios_area() {
        let mut mem = FakeMem::new();
        mem.place(0x40e, &0x9fc0u16.to_le_bytes()).place(0x9_fc00, &[0; 1024]);
        // An ACPI 2.0 RSDP whose extended checksum is wrong is skipped too.
        let mut bad_ext = rsdp(2, RSDT_ADDR, XSDT_ADDR);
        bad_ext[32] ^= 1;
        mem.place(0xe_0010, &bad_ext).place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0));
        assert_eq!(find_rsdp_legacy(&mem), Some(RSDP_ADDR));
        // Also without any EBDA pointer.
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0));
        assert_eq!(find_rsdp_legacy(&mem), Some(RSDP_ADDR));
        assert_eq!(find_rsdp_legacy(&FakeMem::new()), None);
    }

    #[test]
    fn bad_checksums_are_reported() {
        let mut mem = q35();
        let mut r = rsdp(0, RSDT_ADDR, 0);
        r[9] ^= 0x20;
        mem.place(0xf_0000, &r);
        let err = parse(&mem, 0xf_0000).unwrap_err();
        assert_eq!(err, AcpiError::RsdpChecksum { addr: 0xf_0000 });
        assert_eq!(std::format!("{err}"), "ACPI RSDP at 0xf0000 has a bad checksum");

        let mut r2 = rsdp(2, RSDT_ADDR, XSDT_ADDR);
        r2[33] = 1;
        mem.place(0xf_1000, &r2);
        assert_eq!(parse(&mem, 0xf_1000).unwrap_err(), AcpiError::RsdpExtendedChecksum { addr: 0xf_1000 });

        let mut m = madt(0xfee0_0000, 1, &three_cpus());
        m[50] ^= 1;
        let mem = with_madt(&m);
        let err = parse(&mem, RSDP_ADDR).unwrap_err();
        assert_eq!(err, AcpiError::TableChecksum { signature: Signature::MADT, addr: APIC_ADDR.into() });
        assert_eq!(std::format!("{err}"), "ACPI table \"APIC\" at 0x7ffe2300 has a checksum mismatch");
    }

    fn with_madt(m: &[u8]) -> FakeMem {
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0))
            .place(RSDT_ADDR.into(), &rsdt(&[APIC_ADDR]))
            .place(APIC_ADDR.into(), m);
        mem
    }

    #[test]
    fn truncated_madt_entries_are_errors() {
        // Second entry claims 8 bytes but the table ends after 6 of them.
        let mut e = lapic(1, 1, 1);
        e.truncate(6);
        let mem = with_madt(&madt(0xfee0_0000, 1, &[lapic(0, 0, 1), e]));
        let err = parse(&mem, RSDP_ADDR).unwrap_err();
        assert_eq!(err, AcpiError::MadtEntryTruncated { offset: 52, entry_type: 0, length: 8, table_length: 58 });
        assert_eq!(
            std::format!("{err}"),
            "MADT entry at offset 0x34 (type 0) is truncated: length 8 with table length 58"
        );

        let mem = with_madt(&madt(0xfee0_0000, 1, &[lapic(0, 0, 1), std::vec![0x7f, 0, 0, 0]]));
        assert_eq!(
            parse(&mem, RSDP_ADDR).unwrap_err(),
            AcpiError::MadtEntryTruncated { offset: 52, entry_type: 0x7f, length: 0, table_length: 56 }
        );

        let mem = with_madt(&madt(0xfee0_0000, 1, &[std::vec![MADT_LOCAL_APIC, 6, 0, 0, 1, 0]]));
        assert_eq!(
            parse(&mem, RSDP_ADDR).unwrap_err(),
            AcpiError::MadtEntryTooShort { offset: 44, entry_type: 0, length: 6, min: 8 }
        );
    }

    #[test]
    fn disabled_and_online_capable_cpus() {
        let entries = [lapic(0, 0, 1), lapic(1, 1, 0), lapic(2, 2, LAPIC_ONLINE_CAPABLE), lapic(3, 3, 1)];
        let info = parse(&with_madt(&madt(0xfee0_0000, 1, &entries)), RSDP_ADDR).unwrap();
        let online = Cpu { online_capable: true, enabled: false, ..cpu(2, 2, false) };
        // Usable processors first, in MADT order; the disabled one after them.
        assert_eq!(info.cpus(), &[cpu(0, 0, true), online, cpu(3, 3, true), cpu(1, 1, false)]);
        let usable: Vec<u32> = info.usable_cpus().map(|c| c.apic_id).collect();
        assert_eq!(usable, [0, 2, 3]);
    }

    #[test]
    fn cpu_limit_counts_usable_processors_only() {
        let mut entries: Vec<Vec<u8>> = (0..10).map(|i| x2apic(1000 + i, 0, 1000 + i)).collect();
        entries.extend((0..MAX_CPUS as u32).map(|i| x2apic(i, 1, i)));
        let info = parse(&with_madt(&madt(0xfee0_0000, 0, &entries)), RSDP_ADDR).unwrap();
        assert_eq!(info.cpus().len(), MAX_CPUS);
        assert_eq!(info.usable_cpus().count(), MAX_CPUS);
        assert_eq!(info.skipped_cpus(), 0);

        entries.push(x2apic(MAX_CPUS as u32, 1, 99));
        let info = parse(&with_madt(&madt(0xfee0_0000, 0, &entries)), RSDP_ADDR).unwrap();
        assert_eq!(info.usable_cpus().count(), MAX_CPUS);
        assert_eq!(info.skipped_cpus(), 1);
        assert!(info.cpus().iter().all(|c| c.apic_id != MAX_CPUS as u32), "the one past the limit is skipped");
    }

    /// A server-like MADT of `n` processor entries: the first half xAPIC (type 0, IDs below 255), the rest
    /// x2APIC (type 9, IDs from 256 up, as firmware describes processors a type 0 entry cannot hold); every
    /// fifth processor disabled (an unpopulated or hot-plug position), plus QEMU's other entries.
    fn many_cpus(n: u32) -> (FakeMem, Vec<(u32, bool)>) {
        let mut entries = qemu_other_entries();
        let mut listed = Vec::new();
        for i in 0..n {
            let enabled = i % 5 != 4;
            let flags = u32::from(enabled);
            if i < n / 2 && i < 255 {
                entries.push(lapic(i as u8, i as u8, flags));
                listed.push((i, enabled));
            } else {
                entries.push(x2apic(256 + i, flags, i));
                listed.push((256 + i, enabled));
            }
        }
        (with_madt(&madt(0xfee0_0000, 1, &entries)), listed)
    }

    #[test]
    fn many_processors_keep_the_first_usable_ones() {
        for n in [8u32, 64, 65, 256, 512] {
            let (mem, listed) = many_cpus(n);
            let info = parse(&mem, RSDP_ADDR).unwrap_or_else(|e| panic!("{n} entries: {e}"));
            let usable: Vec<u32> = listed.iter().filter(|l| l.1).map(|l| l.0).collect();
            let kept = usable.len().min(MAX_CPUS);
            // The first usable ones in MADT order, xAPIC and x2APIC alike; the rest counted.
            let got: Vec<u32> = info.usable_cpus().map(|c| c.apic_id).collect();
            assert_eq!(got, usable[..kept], "{n} entries");
            assert_eq!(info.skipped_cpus(), usable.len() - kept, "{n} entries");
            for c in info.usable_cpus() {
                assert_eq!(c.is_x2apic, c.apic_id >= 256, "{n} entries: {c:?}");
                assert!(c.enabled);
            }
            // Disabled entries fill only what usable ones left free, for diagnostics.
            assert!(info.cpus().len() <= MAX_CPUS);
            assert_eq!(info.cpus().len(), listed.len().min(MAX_CPUS), "{n} entries");
            // The rest of the tables are unaffected: the MCFG-less machine, the local APIC address.
            assert_eq!(info.lapic_addr, 0xfee0_0000);
        }
        // With 65 entries, 52 are usable: all kept. With 512, 410 usable: 64 kept, 346 skipped.
        assert_eq!(parse(&many_cpus(65).0, RSDP_ADDR).unwrap().skipped_cpus(), 0);
        assert_eq!(parse(&many_cpus(512).0, RSDP_ADDR).unwrap().skipped_cpus(), 410 - 64);
        // 80 enabled xAPIC entries, as `-smp 80` on q35 gives: 64 kept, 16 skipped.
        let entries: Vec<Vec<u8>> = (0..80u8).map(|i| lapic(i, i, 1)).collect();
        let info = parse(&with_madt(&madt(0xfee0_0000, 1, &entries)), RSDP_ADDR).unwrap();
        assert_eq!((info.usable_cpus().count(), info.skipped_cpus()), (64, 16));
        assert_eq!(info.cpus().last().map(|c| c.apic_id), Some(63));
    }

    /// An SPCR (revision 2, 80 bytes) for a UART at `address` in `space`.
    fn spcr(interface_type: u8, space: u8, address: u64, baud: u8) -> Vec<u8> {
        let mut body = std::vec![0u8; 80 - HEADER_LEN];
        body[0] = interface_type;
        body[4] = space;
        body[5] = 8; // register bit width
        body[7] = 1; // byte access
        body[8..16].copy_from_slice(&address.to_le_bytes());
        body[SPCR_BAUD - HEADER_LEN] = baud;
        table(b"SPCR", &body)
    }

    #[test]
    fn spcr_is_read_when_present() {
        const SPCR_ADDR: u32 = 0x7ffe_2600;
        let with = |t: Vec<u8>| {
            let mut mem = FakeMem::new();
            mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0))
                .place(RSDT_ADDR.into(), &rsdt(&[APIC_ADDR, SPCR_ADDR]))
                .place(APIC_ADDR.into(), &madt(0xfee0_0000, 1, &three_cpus()))
                .place(SPCR_ADDR.into(), &t);
            parse(&mem, RSDP_ADDR).unwrap().spcr
        };
        use crate::console::Uart;
        assert_eq!(with(spcr(0, 1, 0x2f8, 7)), Some(SpcrConsole::Uart(Uart { port: 0x2f8, baud: 115_200 })));
        assert!(matches!(with(spcr(0x12, 0, 0xfedc_9000, 7)), Some(SpcrConsole::Unsupported { .. })));
        // Too short for the baud byte: ignored.
        assert_eq!(with(table(b"SPCR", &[0; 10])), None);
        assert_eq!(parse(&q35(), RSDP_ADDR).unwrap().spcr, None);
    }

    #[test]
    fn a_malformed_entry_past_the_limit_is_still_an_error() {
        let mut entries: Vec<Vec<u8>> = (0..70u8).map(|i| lapic(i, i, 1)).collect();
        entries.push(std::vec![MADT_LOCAL_X2APIC, 8, 0, 0, 0, 0, 0, 0]);
        let err = parse(&with_madt(&madt(0xfee0_0000, 1, &entries)), RSDP_ADDR).unwrap_err();
        assert!(matches!(err, AcpiError::MadtEntryTooShort { entry_type: MADT_LOCAL_X2APIC, .. }), "{err:?}");
    }

    #[test]
    fn missing_madt_and_other_table_problems() {
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0))
            .place(RSDT_ADDR.into(), &rsdt(&[FACP_ADDR]))
            .place(FACP_ADDR.into(), &table(b"FACP", &[0; 8]));
        let err = parse(&mem, RSDP_ADDR).unwrap_err();
        assert_eq!(err, AcpiError::NoMadt);

        // The RSDT points at a table that is not there.
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0)).place(RSDT_ADDR.into(), &rsdt(&[0x4000_0000]));
        assert_eq!(
            parse(&mem, RSDP_ADDR).unwrap_err(),
            AcpiError::Unreadable { what: "table header", addr: 0x4000_0000 }
        );

        // The RSDP names an XSDT but something else lives there.
        let mut mem = q35();
        mem.place(0xf_0000, &rsdp(2, RSDT_ADDR, u64::from(APIC_ADDR)));
        assert_eq!(
            parse(&mem, 0xf_0000).unwrap_err(),
            AcpiError::WrongSignature { addr: APIC_ADDR.into(), expected: Signature::XSDT, found: Signature::MADT }
        );

        assert_eq!(
            parse(&FakeMem::new(), RSDP_ADDR).unwrap_err(),
            AcpiError::Unreadable { what: "RSDP", addr: RSDP_ADDR }
        );
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &[0; 36]);
        assert_eq!(parse(&mem, RSDP_ADDR).unwrap_err(), AcpiError::BadRsdpSignature { addr: RSDP_ADDR });

        // Header claims more bytes than are readable.
        let mut t = rsdt(&[APIC_ADDR]);
        t[4..8].copy_from_slice(&0x1000u32.to_le_bytes());
        let mut mem = FakeMem::new();
        mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0)).place(RSDT_ADDR.into(), &t);
        let err = parse(&mem, RSDP_ADDR).unwrap_err();
        assert_eq!(
            err,
            AcpiError::TableUnreadable { signature: Signature::RSDT, addr: RSDT_ADDR.into(), length: 0x1000 }
        );
    }

    #[test]
    fn mcfg_problems() {
        let with_mcfg = |m: Vec<u8>| {
            let mut mem = FakeMem::new();
            mem.place(RSDP_ADDR, &rsdp(0, RSDT_ADDR, 0))
                .place(RSDT_ADDR.into(), &rsdt(&[APIC_ADDR, MCFG_ADDR]))
                .place(APIC_ADDR.into(), &madt(0xfee0_0000, 1, &three_cpus()))
                .place(MCFG_ADDR.into(), &m);
            mem
        };
        let two = mcfg(&[(0xb000_0000, 0, 0, 255), (0xe000_0000, 1, 0x80, 0xff)]);
        assert_eq!(
            parse(&with_mcfg(two), RSDP_ADDR).unwrap().ecam(),
            &[
                EcamRegion { base: 0xb000_0000, segment: 0, start_bus: 0, end_bus: 255 },
                EcamRegion { base: 0xe000_0000, segment: 1, start_bus: 0x80, end_bus: 0xff },
            ]
        );
        let backwards = mcfg(&[(0xb000_0000, 0, 9, 3)]);
        assert_eq!(
            parse(&with_mcfg(backwards), RSDP_ADDR).unwrap_err(),
            AcpiError::McfgBusRange { index: 0, start_bus: 9, end_bus: 3 }
        );
        let many: Vec<_> = (0..=MAX_ECAM as u16).map(|s| (0xb000_0000u64, s, 0u8, 255u8)).collect();
        assert_eq!(parse(&with_mcfg(mcfg(&many)), RSDP_ADDR).unwrap_err(), AcpiError::TooManyEcam { limit: MAX_ECAM });
        let ragged = table(b"MCFG", &[0; 8 + 20]);
        assert_eq!(parse(&with_mcfg(ragged), RSDP_ADDR).unwrap_err(), AcpiError::McfgLength { length: 64 });
    }
}
