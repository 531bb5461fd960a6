//! PCI enumeration, generic over how configuration space is reached.
//!
//! Implements, from the PCI Local Bus Specification 3.0 (§6.1 "Configuration Space Organization", §6.2.5
//! "Base Addresses", §6.7 "Capabilities List") and the PCI-to-PCI Bridge Architecture Specification 1.2
//! (type 1 header, secondary bus number): the common header fields, BAR decoding and sizing, bridge
//! traversal, the Command register, and the capability list. The PCI Express Base Specification keeps the same
//! layout in the first 256 bytes, which is all this module reads.
//!
//! Root buses that no bridge leads to (a server's peer host bridges) are found by probing every bus the bridge
//! walk did not reach (docs/reference/pci-peer-host-bridges.md).
//!
//! The bus is reached through [`ConfigAccess`]: the kernel implements it over ECAM (from the ACPI MCFG) or the
//! legacy 0xCF8/0xCFC ports, and host tests over a fake configuration space. Everything here is therefore safe
//! code with fixed-size results.

use alloc::vec::Vec;
use core::fmt;

/// Access to configuration space. Offsets are dword-aligned and below 4096 (256 without ECAM).
pub trait ConfigAccess {
    fn read32(&self, a: Bdf, offset: u16) -> u32;
    fn write32(&self, a: Bdf, offset: u16, value: u32);

    /// The 16-bit field at `offset` (2-byte aligned), taken from the containing dword.
    fn read16(&self, a: Bdf, offset: u16) -> u16 {
        (self.read32(a, offset & !3) >> ((offset & 2) * 8)) as u16
    }

    /// The byte at `offset`, taken from the containing dword.
    fn read8(&self, a: Bdf, offset: u16) -> u8 {
        (self.read32(a, offset & !3) >> ((offset & 3) * 8)) as u8
    }
}

/// A function's address: PCI segment (ECAM domain), bus, device (0-31) and function (0-7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub segment: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl Bdf {
    pub const fn new(segment: u16, bus: u8, device: u8, function: u8) -> Self {
        Bdf { segment, bus, device, function }
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segment != 0 {
            write!(f, "{:04x}:", self.segment)?;
        }
        write!(f, "{:02x}:{:02x}.{:x}", self.bus, self.device, self.function)
    }
}

/// A decoded Base Address Register with the size found by probing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar {
    /// Not implemented, or the upper half of a 64-bit BAR.
    None,
    Io {
        port: u32,
        size: u32,
    },
    Mem32 {
        addr: u32,
        size: u32,
        prefetchable: bool,
    },
    Mem64 {
        addr: u64,
        size: u64,
        prefetchable: bool,
    },
}

impl Bar {
    /// The memory address and size for memory BARs.
    pub fn mem(&self) -> Option<(u64, u64)> {
        match *self {
            Bar::Mem32 { addr, size, .. } => Some((u64::from(addr), u64::from(size))),
            Bar::Mem64 { addr, size, .. } => Some((addr, size)),
            _ => None,
        }
    }
}

/// Configuration space offsets of the common header (PCI 3.0 §6.1).
pub const VENDOR_ID: u16 = 0x00;
pub const COMMAND: u16 = 0x04;
pub const STATUS: u16 = 0x06;
pub const REVISION_ID: u16 = 0x08;
pub const HEADER_TYPE: u16 = 0x0E;
pub const BAR0: u16 = 0x10;
/// Type 1 header: secondary bus number.
pub const SECONDARY_BUS: u16 = 0x19;
pub const CAPABILITIES_POINTER: u16 = 0x34;

/// Command register bits.
pub const COMMAND_IO: u16 = 1 << 0;
pub const COMMAND_MEMORY: u16 = 1 << 1;
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;

/// Status bit 4: the capabilities pointer is valid.
const STATUS_CAP_LIST: u16 = 1 << 4;
/// Header type bit 7: the device implements functions 1-7.
const HEADER_MULTI_FUNCTION: u8 = 0x80;
const HEADER_TYPE_MASK: u8 = 0x7f;
const HEADER_TYPE_NORMAL: u8 = 0;
const HEADER_TYPE_BRIDGE: u8 = 1;
/// Vendor ID read from an absent function: the all-ones of a master abort.
const VENDOR_ABSENT: u16 = 0xffff;

/// BAR bit 0: I/O space.
const BAR_IO: u32 = 1 << 0;
/// BAR bits 2:1: memory decoder type.
const BAR_MEM_TYPE_MASK: u32 = 0b110;
const BAR_MEM_TYPE_32: u32 = 0b000;
/// Legacy "below 1 MiB" type, decoded like a 32-bit BAR.
const BAR_MEM_TYPE_1M: u32 = 0b010;
const BAR_MEM_TYPE_64: u32 = 0b100;
/// BAR bit 3: prefetchable memory.
const BAR_PREFETCHABLE: u32 = 1 << 3;
const BAR_IO_ADDR_MASK: u32 = !0b11;
const BAR_MEM_ADDR_MASK: u32 = !0b1111;

/// Capabilities live after the 64-byte header.
const CAP_MIN_OFFSET: u8 = 0x40;
/// At most (256 - 64) / 4 distinct capabilities fit, so more steps mean a loop.
const CAP_MAX_STEPS: u8 = 48;

/// Functions kept by [`enumerate`]. A two-socket server lists a few hundred (each IIO stack's root ports and
/// uncore functions, the uncore buses at the top of each socket's range with a hundred or more); the list is
/// in bus order, so the uncore buses are the ones cut. Kept on the heap (about 170 bytes a function).
pub const MAX_FUNCTIONS: usize = 256;
/// Root buses listed by [`PciBus::roots`].
pub const MAX_ROOTS: usize = 16;

/// A PCI function found by [`enumerate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub bdf: Bdf,
    pub vendor: u16,
    pub device: u16,
    pub class: u8,
    pub subclass: u8,
    pub prog_if: u8,
    pub revision: u8,
    /// Header type including the multi-function bit.
    pub header_type: u8,
    /// BARs in register order; a [`Bar::Mem64`] at slot `i` leaves slot `i + 1` as [`Bar::None`].
    pub bars: [Bar; 6],
}

impl Function {
    /// Whether this is a PCI-to-PCI bridge (type 1 header).
    pub fn is_bridge(&self) -> bool {
        self.header_type & HEADER_TYPE_MASK == HEADER_TYPE_BRIDGE
    }
}

/// The functions found on the machine's segments.
#[derive(Clone)]
pub struct PciBus {
    functions: Vec<Function>,
    truncated: bool,
    roots: [Bdf; MAX_ROOTS],
    roots_len: usize,
    peer_roots: usize,
}

impl PciBus {
    /// Functions in discovery order (per root bus, depth-first: a bridge's subtree right after the bridge).
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// Functions with the given vendor and device ID.
    pub fn find(&self, vendor: u16, device: u16) -> impl Iterator<Item = &Function> {
        self.functions().iter().filter(move |f| f.vendor == vendor && f.device == device)
    }

    /// Functions with the given class and subclass.
    pub fn find_class(&self, class: u8, subclass: u8) -> impl Iterator<Item = &Function> {
        self.functions().iter().filter(move |f| f.class == class && f.subclass == subclass)
    }

    /// Whether enumeration stopped because more than [`MAX_FUNCTIONS`] functions exist.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Records `f`; `false` (and the truncated mark) when full.
    fn push(&mut self, f: Function) -> bool {
        if self.functions.len() < MAX_FUNCTIONS {
            self.functions.push(f);
            true
        } else {
            self.truncated = true;
            false
        }
    }
}

impl fmt::Debug for PciBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PciBus").field("functions", &self.functions()).field("truncated", &self.truncated).finish()
    }
}

/// Where the depth-first walk stands on one bus: the next slot to probe.
#[derive(Clone, Copy)]
struct Cursor {
    bus: u8,
    device: u8,
    function: u8,
}

impl PciBus {
    /// An empty list, to be filled by [`PciBus::scan_segment`] (once per ECAM segment).
    pub const fn new() -> Self {
        PciBus {
            functions: Vec::new(),
            truncated: false,
            roots: [Bdf::new(0, 0, 0, 0); MAX_ROOTS],
            roots_len: 0,
            peer_roots: 0,
        }
    }

    /// The root buses the walks started from, as `segment:bus:00.0`: the first bus of each segment, then each
    /// peer root bus found by probing (at most [`MAX_ROOTS`] listed; all of them are walked).
    pub fn roots(&self) -> &[Bdf] {
        &self.roots[..self.roots_len]
    }

    /// How many root buses besides each segment's first were found by probing.
    pub fn peer_roots(&self) -> usize {
        self.peer_roots
    }

    /// Enumerates buses `[start_bus, end_bus]` of `segment` the way a server's firmware lays them out: a
    /// depth-first walk from `start_bus` through PCI-to-PCI bridges, then a probe of every bus that walk did
    /// not reach. A bus where function 0 of some slot answers is the root bus of a peer host bridge (one per
    /// Xeon SP IIO stack or EPYC IOHC; QEMU's `pxb`/`pxb-pcie`), which no bridge on `start_bus` leads to, and is
    /// walked the same way (docs/reference/pci-peer-host-bridges.md). Each bus is scanned once, whatever the
    /// bridges claim, so misprogrammed bus numbers cannot loop. BARs are sized on the way (see [`read_bars`]).
    ///
    /// The probe costs 32 configuration reads per unreached bus (function 0 of each slot; an absent function
    /// reads vendor 0xFFFF).
    pub fn scan_segment<C: ConfigAccess>(&mut self, cfg: &C, segment: u16, start_bus: u8, end_bus: u8) {
        if start_bus > end_bus {
            return;
        }
        let mut visited = [false; 256];
        if !self.walk(cfg, segment, start_bus, start_bus, end_bus, &mut visited) {
            return;
        }
        for bus in start_bus..=end_bus {
            if visited[usize::from(bus)] || !bus_answers(cfg, segment, bus) {
                continue;
            }
            self.peer_roots += 1;
            if !self.walk(cfg, segment, bus, start_bus, end_bus, &mut visited) {
                return;
            }
        }
    }

    /// Walks the tree under root bus `root`; `false` when the list filled up.
    fn walk<C: ConfigAccess>(
        &mut self,
        cfg: &C,
        segment: u16,
        root: u8,
        start_bus: u8,
        end_bus: u8,
        visited: &mut [bool; 256],
    ) -> bool {
        if let Some(slot) = self.roots.get_mut(self.roots_len) {
            *slot = Bdf::new(segment, root, 0, 0);
            self.roots_len += 1;
        }
        // One cursor per bus on the current path; each bus is entered at most once, so 256 suffice.
        let mut stack = [Cursor { bus: 0, device: 0, function: 0 }; 256];
        visited[usize::from(root)] = true;
        stack[0] = Cursor { bus: root, device: 0, function: 0 };
        let mut depth = 1;
        while depth > 0 {
            let cur = stack[depth - 1];
            if cur.device == 32 {
                depth -= 1;
                continue;
            }
            let bdf = Bdf::new(segment, cur.bus, cur.device, cur.function);
            let present = cfg.read16(bdf, VENDOR_ID) != VENDOR_ABSENT;
            let multi = present && cur.function == 0 && cfg.read8(bdf, HEADER_TYPE) & HEADER_MULTI_FUNCTION != 0;
            // Functions 1-7 exist only behind a present, multi-function function 0; some single-function
            // devices answer for every function number, so probing them anyway would list ghosts.
            stack[depth - 1] = if (cur.function == 0 && !multi) || cur.function == 7 {
                Cursor { device: cur.device + 1, function: 0, ..cur }
            } else {
                Cursor { function: cur.function + 1, ..cur }
            };
            if !present {
                continue;
            }
            let f = read_function(cfg, bdf);
            if !self.push(f) {
                return false;
            }
            if f.is_bridge() {
                let secondary = cfg.read8(bdf, SECONDARY_BUS);
                if (start_bus..=end_bus).contains(&secondary) && !visited[usize::from(secondary)] {
                    visited[usize::from(secondary)] = true;
                    stack[depth] = Cursor { bus: secondary, device: 0, function: 0 };
                    depth += 1;
                }
            }
        }
        true
    }
}

impl Default for PciBus {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether any slot of `bus` has a function 0 (Linux's peer-bridge probe reads the same: the vendor ID of
/// function 0 of each of the 32 slots, where 0xFFFF and 0x0000 mean nobody answered).
fn bus_answers<C: ConfigAccess>(cfg: &C, segment: u16, bus: u8) -> bool {
    (0..32).any(|device| {
        let vendor = cfg.read16(Bdf::new(segment, bus, device, 0), VENDOR_ID);
        vendor != VENDOR_ABSENT && vendor != 0
    })
}

/// Enumerates one segment (see [`PciBus::scan_segment`]).
pub fn enumerate<C: ConfigAccess>(cfg: &C, segment: u16, start_bus: u8, end_bus: u8) -> PciBus {
    let mut out = PciBus::new();
    out.scan_segment(cfg, segment, start_bus, end_bus);
    out
}

/// Reads the identification fields and sizes the BARs of a present function.
pub fn read_function<C: ConfigAccess>(cfg: &C, bdf: Bdf) -> Function {
    let id = cfg.read32(bdf, VENDOR_ID);
    let class = cfg.read32(bdf, REVISION_ID);
    let header_type = cfg.read8(bdf, HEADER_TYPE);
    Function {
        bdf,
        vendor: id as u16,
        device: (id >> 16) as u16,
        class: (class >> 24) as u8,
        subclass: (class >> 16) as u8,
        prog_if: (class >> 8) as u8,
        revision: class as u8,
        header_type,
        bars: read_bars(cfg, bdf, header_type),
    }
}

/// Decodes and sizes the BARs (6 in a type 0 header, 2 in a type 1 header, none otherwise).
///
/// Sizing writes all-ones and reads back which address bits stick (PCI 3.0 §6.2.5.1). Memory and I/O
/// decoding are switched off meanwhile so the transiently huge BAR cannot claim other devices' cycles, and the
/// BAR and Command register are restored afterwards.
pub fn read_bars<C: ConfigAccess>(cfg: &C, bdf: Bdf, header_type: u8) -> [Bar; 6] {
    let mut bars = [Bar::None; 6];
    let count = match header_type & HEADER_TYPE_MASK {
        HEADER_TYPE_NORMAL => 6,
        HEADER_TYPE_BRIDGE => 2,
        _ => return bars,
    };
    let command = cfg.read16(bdf, COMMAND);
    write_command(cfg, bdf, command & !(COMMAND_IO | COMMAND_MEMORY));

    let mut i = 0;
    while i < count {
        let offset = BAR0 + 4 * i as u16;
        let original = cfg.read32(bdf, offset);
        let mask = probe(cfg, bdf, offset, original);
        if original & BAR_IO != 0 {
            let size = lowest_set_bit(u64::from(mask & BAR_IO_ADDR_MASK)) as u32;
            if size != 0 {
                bars[i] = Bar::Io { port: original & BAR_IO_ADDR_MASK, size };
            }
            i += 1;
            continue;
        }
        let prefetchable = original & BAR_PREFETCHABLE != 0;
        match original & BAR_MEM_TYPE_MASK {
            BAR_MEM_TYPE_32 | BAR_MEM_TYPE_1M => {
                let size = lowest_set_bit(u64::from(mask & BAR_MEM_ADDR_MASK)) as u32;
                if size != 0 {
                    bars[i] = Bar::Mem32 { addr: original & BAR_MEM_ADDR_MASK, size, prefetchable };
                }
            }
            // A 64-bit BAR in the last slot has no upper half; treat it as unimplemented.
            BAR_MEM_TYPE_64 if i + 1 < count => {
                let upper_offset = offset + 4;
                let upper = cfg.read32(bdf, upper_offset);
                let upper_mask = probe(cfg, bdf, upper_offset, upper);
                let mask64 = (u64::from(upper_mask) << 32) | u64::from(mask & BAR_MEM_ADDR_MASK);
                let size = lowest_set_bit(mask64);
                if size != 0 {
                    let addr = (u64::from(upper) << 32) | u64::from(original & BAR_MEM_ADDR_MASK);
                    bars[i] = Bar::Mem64 { addr, size, prefetchable };
                }
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    write_command(cfg, bdf, command);
    bars
}

/// Writes all-ones to the BAR at `offset`, returns what stuck, and puts `original` back.
fn probe<C: ConfigAccess>(cfg: &C, bdf: Bdf, offset: u16, original: u32) -> u32 {
    cfg.write32(bdf, offset, u32::MAX);
    let mask = cfg.read32(bdf, offset);
    cfg.write32(bdf, offset, original);
    mask
}

/// The size a BAR decodes: the lowest writable address bit. Equal to `!mask + 1` when all upper bits are
/// implemented, and still right for I/O BARs that decode only 16 bits (upper half reads back zero).
fn lowest_set_bit(mask: u64) -> u64 {
    mask & mask.wrapping_neg()
}

/// Writes the Command register with zeros in the Status half: Status error bits are write-one-to-clear, so
/// writing back what was read would silently clear them.
fn write_command<C: ConfigAccess>(cfg: &C, bdf: Bdf, command: u16) {
    cfg.write32(bdf, COMMAND & !3, u32::from(command));
}

/// Sets the `set` bits and clears the `clear` bits of the Command register (clearing wins), leaving Status
/// untouched. Returns the new Command value.
pub fn set_command<C: ConfigAccess>(cfg: &C, bdf: Bdf, set: u16, clear: u16) -> u16 {
    let command = (cfg.read16(bdf, COMMAND) | set) & !clear;
    write_command(cfg, bdf, command);
    command
}

/// Iterator over a function's capability list, yielding `(capability ID, offset)`.
pub struct CapIter<'a, C: ConfigAccess> {
    cfg: &'a C,
    bdf: Bdf,
    next: u8,
    steps: u8,
}

impl<C: ConfigAccess> Iterator for CapIter<'_, C> {
    type Item = (u8, u8);

    fn next(&mut self) -> Option<(u8, u8)> {
        // Pointers into the header, a zero terminator, or more steps than capabilities can fit all end the
        // walk: a corrupt or looping list must not hang the boot.
        if self.next < CAP_MIN_OFFSET || self.steps >= CAP_MAX_STEPS {
            return None;
        }
        let offset = self.next;
        let header = self.cfg.read32(self.bdf, u16::from(offset));
        self.next = (header >> 8) as u8 & !3;
        self.steps += 1;
        Some((header as u8, offset))
    }
}

/// Walks the capability list of `bdf` (PCI 3.0 §6.7). Empty when Status says there is no list.
pub fn capabilities<C: ConfigAccess>(cfg: &C, bdf: Bdf) -> CapIter<'_, C> {
    let next =
        if cfg.read16(bdf, STATUS) & STATUS_CAP_LIST != 0 { cfg.read8(bdf, CAPABILITIES_POINTER) & !3 } else { 0 };
    CapIter { cfg, bdf, next, steps: 0 }
}

/// Offset of the first capability with ID `id`.
pub fn find_capability<C: ConfigAccess>(cfg: &C, bdf: Bdf, id: u8) -> Option<u8> {
    capabilities(cfg, bdf).find(|&(cap, _)| cap == id).map(|(_, offset)| offset)
}

/// Copies configuration bytes `[offset, offset + buf.len())` into `buf` (e.g. a whole capability structure),
/// using only dword reads.
pub fn read_config_bytes<C: ConfigAccess>(cfg: &C, bdf: Bdf, offset: u16, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = cfg.read8(bdf, offset + i as u16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::vec::Vec;

    /// A configuration space that answers like hardware: unknown functions read all-ones, BAR address bits
    /// below the decoded size are read-only zero, Status error bits are write-one-to-clear, and every BAR write
    /// made while decoding is enabled is recorded as a violation.
    #[derive(Default)]
    struct FakeCfg {
        space: RefCell<HashMap<Bdf, [u32; 1024]>>,
        /// Per (function, dword offset): bits that software can write.
        writable: HashMap<(Bdf, u16), u32>,
        violations: RefCell<Vec<(Bdf, u16)>>,
        reads: RefCell<usize>,
    }

    impl ConfigAccess for FakeCfg {
        fn read32(&self, a: Bdf, offset: u16) -> u32 {
            assert_eq!(offset % 4, 0);
            *self.reads.borrow_mut() += 1;
            self.space.borrow().get(&a).map_or(u32::MAX, |s| s[usize::from(offset / 4)])
        }
        fn write32(&self, a: Bdf, offset: u16, value: u32) {
            assert_eq!(offset % 4, 0);
            let mut space = self.space.borrow_mut();
            let Some(s) = space.get_mut(&a) else { return };
            let w = self.writable.get(&(a, offset)).copied().unwrap_or(u32::MAX);
            let decoding = s[1] as u16 & (COMMAND_IO | COMMAND_MEMORY) != 0;
            if (BAR0..BAR0 + 24).contains(&offset) && decoding {
                self.violations.borrow_mut().push((a, offset));
            }
            let dw = &mut s[usize::from(offset / 4)];
            if offset == COMMAND {
                let status_clear = value & 0xffff_0000;
                *dw = (*dw & 0xffff_0000 & !status_clear) | (value & 0xffff);
            } else {
                *dw = (*dw & !w) | (value & w);
            }
        }
    }

    impl FakeCfg {
        /// Adds a function with a type 0 or 1 header, command register `command`, status `status`.
        fn add(&mut self, bdf: Bdf, vendor: u16, device: u16, class: u32, header_type: u8) -> &mut Self {
            let mut s = [0u32; 1024];
            s[0] = u32::from(vendor) | (u32::from(device) << 16);
            s[1] = u32::from(COMMAND_IO | COMMAND_MEMORY | COMMAND_BUS_MASTER);
            s[2] = class;
            s[3] = u32::from(header_type) << 16;
            self.space.borrow_mut().insert(bdf, s);
            // Header registers are read-only unless a test says otherwise (no BAR there).
            for i in 0..6 {
                self.writable.insert((bdf, BAR0 + 4 * i), 0);
            }
            self
        }
        fn set(&mut self, bdf: Bdf, offset: u16, value: u32) -> &mut Self {
            self.space.borrow_mut().get_mut(&bdf).unwrap()[usize::from(offset / 4)] = value;
            self
        }
        fn get(&self, bdf: Bdf, offset: u16) -> u32 {
            self.space.borrow()[&bdf][usize::from(offset / 4)]
        }
        /// A memory or I/O BAR of `size` bytes at `addr`, with the read-only type bits `flags`.
        fn bar32(&mut self, bdf: Bdf, index: u16, addr: u32, size: u32, flags: u32) -> &mut Self {
            let offset = BAR0 + 4 * index;
            self.writable.insert((bdf, offset), !(size - 1));
            self.set(bdf, offset, addr | flags)
        }
        fn bar64(&mut self, bdf: Bdf, index: u16, addr: u64, size: u64, prefetchable: bool) -> &mut Self {
            let offset = BAR0 + 4 * index;
            let mask = !(size - 1);
            let flags = BAR_MEM_TYPE_64 | if prefetchable { BAR_PREFETCHABLE } else { 0 };
            self.writable.insert((bdf, offset), mask as u32 & BAR_MEM_ADDR_MASK);
            self.writable.insert((bdf, offset + 4), (mask >> 32) as u32);
            self.set(bdf, offset, addr as u32 | flags).set(bdf, offset + 4, (addr >> 32) as u32)
        }
        fn bridge_to(&mut self, bdf: Bdf, secondary: u8) -> &mut Self {
            self.add(bdf, 0x1b36, 0x000c, 0x0604_0000, HEADER_TYPE_BRIDGE);
            self.set(bdf, 0x18, (u32::from(secondary) << 8) | u32::from(bdf.bus))
        }
        fn caps(&mut self, bdf: Bdf, first: u8, list: &[(u8, u8, u8)]) -> &mut Self {
            let status = self.get(bdf, COMMAND) | (u32::from(STATUS_CAP_LIST) << 16);
            self.set(bdf, COMMAND, status).set(bdf, CAPABILITIES_POINTER, u32::from(first));
            for &(at, id, next) in list {
                self.set(bdf, u16::from(at), u32::from(id) | (u32::from(next) << 8) | 0xabcd_0000);
            }
            self
        }
    }

    fn bdf(bus: u8, device: u8, function: u8) -> Bdf {
        Bdf::new(0, bus, device, function)
    }

    /// A q35-like segment: host bridge, e1000, ivshmem-plain, a multi-function ICH9 LPC/SATA/SMBus, and a
    /// PCIe root port to bus 1 with a virtio-net behind it.
    fn q35() -> FakeCfg {
        let mut c = FakeCfg::default();
        c.add(bdf(0, 0, 0), 0x8086, 0x29c0, 0x0600_0000, 0);
        c.add(bdf(0, 1, 0), 0x8086, 0x100e, 0x0200_0003, 0)
            .bar32(bdf(0, 1, 0), 0, 0xfeb8_0000, 0x2_0000, 0)
            .bar32(bdf(0, 1, 0), 1, 0xc000, 0x40, BAR_IO)
            .caps(bdf(0, 1, 0), 0xdc, &[(0xdc, 0x01, 0xe4), (0xe4, 0x07, 0)]);
        c.add(bdf(0, 2, 0), 0x1af4, 0x1110, 0x0500_0001, 0).bar32(bdf(0, 2, 0), 0, 0xfebd_1000, 0x100, 0).bar64(
            bdf(0, 2, 0),
            2,
            0x8_0000_0000,
            0x10_0000,
            true,
        );
        c.add(bdf(0, 0x1f, 0), 0x8086, 0x2918, 0x0601_0002, HEADER_MULTI_FUNCTION)
            .add(bdf(0, 0x1f, 2), 0x8086, 0x2922, 0x0106_0102, 0)
            .bar32(bdf(0, 0x1f, 2), 4, 0xc060, 0x20, BAR_IO)
            .add(bdf(0, 0x1f, 3), 0x8086, 0x2930, 0x0c05_0002, 0);
        c.bridge_to(bdf(0, 3, 0), 1);
        c.add(bdf(1, 0, 0), 0x1af4, 0x1041, 0x0200_0001, 0).bar64(bdf(1, 0, 0), 4, 0xfe00_0000, 0x4000, true);
        c
    }

    #[test]
    fn enumerates_q35_depth_first() {
        let cfg = q35();
        let bus = enumerate(&cfg, 0, 0, 255);
        let order: Vec<Bdf> = bus.functions().iter().map(|f| f.bdf).collect();
        assert_eq!(
            order,
            [
                bdf(0, 0, 0),
                bdf(0, 1, 0),
                bdf(0, 2, 0),
                bdf(0, 3, 0),
                bdf(1, 0, 0),
                bdf(0, 0x1f, 0),
                bdf(0, 0x1f, 2),
                bdf(0, 0x1f, 3)
            ]
        );
        assert!(!bus.truncated());
        assert!(cfg.violations.borrow().is_empty(), "BAR written with decoding on: {:?}", cfg.violations.borrow());

        let e1000 = bus.find(0x8086, 0x100e).next().unwrap();
        assert_eq!((e1000.class, e1000.subclass, e1000.prog_if, e1000.revision), (2, 0, 0, 3));
        assert_eq!(
            e1000.bars,
            [
                Bar::Mem32 { addr: 0xfeb8_0000, size: 0x2_0000, prefetchable: false },
                Bar::Io { port: 0xc000, size: 0x40 },
                Bar::None,
                Bar::None,
                Bar::None,
                Bar::None
            ]
        );

        let ivshmem = bus.find(0x1af4, 0x1110).next().unwrap();
        assert_eq!(
            ivshmem.bars,
            [
                Bar::Mem32 { addr: 0xfebd_1000, size: 0x100, prefetchable: false },
                Bar::None,
                Bar::Mem64 { addr: 0x8_0000_0000, size: 0x10_0000, prefetchable: true },
                Bar::None,
                Bar::None,
                Bar::None
            ]
        );
        assert_eq!(ivshmem.bars[2].mem(), Some((0x8_0000_0000, 0x10_0000)));

        let virtio = bus.find(0x1af4, 0x1041).next().unwrap();
        assert_eq!(virtio.bdf, bdf(1, 0, 0));
        assert_eq!(virtio.bars[4], Bar::Mem64 { addr: 0xfe00_0000, size: 0x4000, prefetchable: true });
        assert!(bus.functions()[3].is_bridge());
        assert_eq!(bus.find_class(0x06, 0x04).count(), 1);
        assert_eq!(bus.functions()[6].bars[4], Bar::Io { port: 0xc060, size: 0x20 });
    }

    #[test]
    fn sizing_restores_bars_and_command_and_keeps_status() {
        let mut cfg = q35();
        let e1000 = bdf(0, 1, 0);
        // A Status error bit (Received Master Abort, write-one-to-clear) that sizing must not clear.
        let before = cfg.get(e1000, COMMAND) | (1 << 29);
        cfg.set(e1000, COMMAND, before);
        let bars_before: Vec<u32> = (0..6).map(|i| cfg.get(e1000, BAR0 + 4 * i)).collect();
        let f = read_function(&cfg, e1000);
        assert_eq!(f.vendor, 0x8086);
        assert_eq!(cfg.get(e1000, COMMAND), before, "Command restored, Status untouched");
        let bars_after: Vec<u32> = (0..6).map(|i| cfg.get(e1000, BAR0 + 4 * i)).collect();
        assert_eq!(bars_before, bars_after);
        assert!(cfg.violations.borrow().is_empty());
        let ivshmem = bdf(0, 2, 0);
        let _ = read_function(&cfg, ivshmem);
        assert_eq!(cfg.get(ivshmem, BAR0 + 8), 0x0000_000c);
        assert_eq!(cfg.get(ivshmem, BAR0 + 12), 0x8);
    }

    #[test]
    fn multifunction_bit_gates_functions_1_to_7() {
        let mut cfg = FakeCfg::default();
        // Device 4 is single-function but (as some do) answers at function 1 too: not listed.
        cfg.add(bdf(0, 4, 0), 0x1234, 0x0001, 0, 0).add(bdf(0, 4, 1), 0x1234, 0x0001, 0, 0);
        // Device 5: function 0 absent, function 1 present: not listed either (function 0 must exist).
        cfg.add(bdf(0, 5, 1), 0x1234, 0x0002, 0, 0);
        // Device 6: multi-function with a hole at function 1 and the last one at 7.
        cfg.add(bdf(0, 6, 0), 0x1234, 0x0003, 0, HEADER_MULTI_FUNCTION).add(bdf(0, 6, 2), 0x1234, 0x0004, 0, 0).add(
            bdf(0, 6, 7),
            0x1234,
            0x0005,
            0,
            0,
        );
        let bus = enumerate(&cfg, 0, 0, 0);
        let found: Vec<Bdf> = bus.functions().iter().map(|f| f.bdf).collect();
        assert_eq!(found, [bdf(0, 4, 0), bdf(0, 6, 0), bdf(0, 6, 2), bdf(0, 6, 7)]);
    }

    #[test]
    fn bridges_are_followed_once_and_within_range() {
        let mut cfg = FakeCfg::default();
        cfg.bridge_to(bdf(0, 1, 0), 1);
        // A bridge on bus 1 that (misprogrammed) points back to bus 0, and one to bus 2.
        cfg.bridge_to(bdf(1, 0, 0), 0);
        cfg.bridge_to(bdf(1, 1, 0), 2);
        cfg.add(bdf(2, 0, 0), 0x1234, 0x5678, 0, 0);
        // A bridge outside the requested range.
        cfg.bridge_to(bdf(0, 2, 0), 9);
        cfg.add(bdf(9, 0, 0), 0x1234, 0x9999, 0, 0);
        let bus = enumerate(&cfg, 0, 0, 8);
        let found: Vec<Bdf> = bus.functions().iter().map(|f| f.bdf).collect();
        assert_eq!(found, [bdf(0, 1, 0), bdf(1, 0, 0), bdf(1, 1, 0), bdf(2, 0, 0), bdf(0, 2, 0)]);
        // Scanning starts at start_bus: bus 0 is outside [1, 8].
        let from1 = enumerate(&cfg, 0, 1, 8);
        assert_eq!(from1.functions().len(), 3);
        assert_eq!(from1.functions()[0].bdf, bdf(1, 0, 0));
    }

    /// q35 with a `pxb-pcie` expander: its host bridge is an ordinary function on bus 0 (class 06.00, type 0
    /// header), its root bus 0x40 holds a root port to bus 0x41, and the device sits there.
    fn q35_with_expander() -> FakeCfg {
        let mut c = q35();
        c.add(bdf(0, 4, 0), 0x1b36, 0x000b, 0x0600_0000, 0);
        c.bridge_to(bdf(0x40, 0, 0), 0x41);
        c.add(bdf(0x41, 0, 0), 0x15b3, 0x1017, 0x0200_0000, 0).bar64(bdf(0x41, 0, 0), 0, 0x80_0000_0000, 1 << 25, true);
        c
    }

    #[test]
    fn peer_root_buses_are_found_by_probing() {
        let cfg = q35_with_expander();
        let bus = enumerate(&cfg, 0, 0, 255);
        let order: Vec<Bdf> = bus.functions().iter().map(|f| f.bdf).collect();
        // The walk from bus 0 first (the expander's host bridge leads nowhere), then the peer root bus.
        assert_eq!(&order[order.len() - 2..], [bdf(0x40, 0, 0), bdf(0x41, 0, 0)]);
        assert_eq!(order.len(), 11);
        assert_eq!(bus.roots(), [bdf(0, 0, 0), bdf(0x40, 0, 0)]);
        assert_eq!(bus.peer_roots(), 1);
        let hca = bus.find(0x15b3, 0x1017).next().expect("the device behind the expander");
        assert_eq!(hca.bars[0], Bar::Mem64 { addr: 0x80_0000_0000, size: 1 << 25, prefetchable: true });
        assert!(cfg.violations.borrow().is_empty());
        // Without the probe (a range ending before 0x40) it is not found: the walk alone never gets there.
        assert_eq!(enumerate(&cfg, 0, 0, 0x3f).find(0x15b3, 0x1017).count(), 0);
    }

    #[test]
    fn peer_probe_is_cheap_and_skips_reached_and_silent_buses() {
        // Bus 0 alone: the probe reads function 0 of each slot of the 255 other buses, nothing more.
        let mut cfg = FakeCfg::default();
        cfg.add(bdf(0, 0, 0), 0x8086, 0x1237, 0x0600_0000, 0);
        let bus = enumerate(&cfg, 0, 0, 255);
        assert_eq!(bus.functions().len(), 1);
        assert_eq!(bus.peer_roots(), 0);
        let reads = *cfg.reads.borrow();
        assert!((255 * 32..255 * 32 + 64).contains(&reads), "{reads} reads");

        // A bus reached through a bridge is not walked twice; a bus whose slots read vendor 0 is silent.
        let mut cfg = q35_with_expander();
        cfg.add(bdf(0x80, 3, 0), 0x0000, 0x0000, 0, 0);
        let bus = enumerate(&cfg, 0, 0, 255);
        assert_eq!(bus.functions().iter().filter(|f| f.bdf.bus == 1).count(), 1);
        assert_eq!(bus.roots().len(), 2);
        assert!(bus.functions().iter().all(|f| f.bdf.bus != 0x80));
    }

    #[test]
    fn segments_add_up_in_one_list() {
        let mut cfg = q35();
        let seg1 = Bdf::new(1, 0x80, 0, 0);
        cfg.add(seg1, 0x15b3, 0x1018, 0x0200_0000, 0);
        let mut bus = PciBus::new();
        bus.scan_segment(&cfg, 0, 0, 255);
        bus.scan_segment(&cfg, 1, 0x80, 0xff);
        assert_eq!(bus.find(0x15b3, 0x1018).next().map(|f| f.bdf), Some(seg1));
        assert_eq!(bus.roots(), [bdf(0, 0, 0), seg1]);
        // The first bus of a segment is its own root, not a peer found by probing.
        assert_eq!(bus.peer_roots(), 0);
        assert_eq!(std::format!("{}", seg1), "0001:80:00.0");
    }

    #[test]
    fn too_many_functions_truncates() {
        let mut cfg = FakeCfg::default();
        let buses = (MAX_FUNCTIONS / 32 + 1) as u8;
        for bus in 0..buses {
            for dev in 0..32u8 {
                cfg.add(bdf(bus, dev, 0), 0x1234, u16::from(bus) << 8 | u16::from(dev), 0, 0);
            }
        }
        for bus in 0..buses - 1 {
            cfg.set(bdf(bus, 31, 0), HEADER_TYPE & !3, u32::from(HEADER_TYPE_BRIDGE) << 16);
            cfg.set(bdf(bus, 31, 0), 0x18, u32::from(bus + 1) << 8);
        }
        let bus = enumerate(&cfg, 0, 0, 255);
        assert_eq!(bus.functions().len(), MAX_FUNCTIONS);
        assert!(bus.truncated());
        let exact = enumerate(&cfg, 0, 0, 0);
        assert_eq!(exact.functions().len(), 32);
        assert!(!exact.truncated());
    }

    #[test]
    fn capability_walk_and_loop_guard() {
        let cfg = q35();
        let e1000 = bdf(0, 1, 0);
        assert_eq!(capabilities(&cfg, e1000).collect::<Vec<_>>(), [(0x01, 0xdc), (0x07, 0xe4)]);
        assert_eq!(find_capability(&cfg, e1000, 0x07), Some(0xe4));
        assert_eq!(find_capability(&cfg, e1000, 0x11), None);
        // No capability list bit in Status: nothing, even with a pointer present.
        let mut cfg = q35();
        cfg.set(bdf(0, 2, 0), CAPABILITIES_POINTER, 0x40);
        assert_eq!(capabilities(&cfg, bdf(0, 2, 0)).count(), 0);

        // A loop 0x40 -> 0x50 -> 0x40 ... ends after the step limit.
        let mut cfg = q35();
        let d = bdf(0, 2, 0);
        cfg.caps(d, 0x40, &[(0x40, 0x05, 0x50), (0x50, 0x11, 0x40)]);
        let reads_before = *cfg.reads.borrow();
        assert_eq!(capabilities(&cfg, d).count(), usize::from(CAP_MAX_STEPS));
        assert!(*cfg.reads.borrow() - reads_before <= 2 + usize::from(CAP_MAX_STEPS));
        assert_eq!(find_capability(&cfg, d, 0x10), None);
        // Pointers into the header end the walk; low bits of pointers are ignored.
        cfg.caps(d, 0x43, &[(0x40, 0x05, 0x3c)]);
        assert_eq!(capabilities(&cfg, d).collect::<Vec<_>>(), [(0x05, 0x40)]);
        let mut cap = [0u8; 4];
        read_config_bytes(&cfg, d, 0x40, &mut cap);
        assert_eq!(cap, [0x05, 0x3c, 0xcd, 0xab]);
    }

    #[test]
    fn set_command_preserves_status() {
        let mut cfg = q35();
        let d = bdf(0, 1, 0);
        cfg.set(d, COMMAND, (1 << 29) | u32::from(COMMAND_IO));
        let new = set_command(&cfg, d, COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE, COMMAND_IO);
        assert_eq!(new, COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE);
        assert_eq!(cfg.get(d, COMMAND), (1 << 29) | u32::from(new));
        assert_eq!(cfg.read16(d, STATUS), 1 << 13);
    }

    #[test]
    fn bdf_display() {
        assert_eq!(std::format!("{}", bdf(0, 0x1f, 3)), "00:1f.3");
        assert_eq!(std::format!("{}", Bdf::new(1, 0x80, 2, 0)), "0001:80:02.0");
    }

    #[test]
    fn unusual_bars() {
        let mut cfg = FakeCfg::default();
        let d = bdf(0, 0, 0);
        cfg.add(d, 0x1234, 1, 0, 0);
        // 64-bit BAR in the last slot, a 16-bit-decode I/O BAR, a 64-bit BAR sized above 4 GiB.
        cfg.bar32(d, 5, 0xfe00_0000, 0x1000, BAR_MEM_TYPE_64);
        cfg.bar64(d, 0, 0x40_0000_0000, 0x2_0000_0000, false);
        cfg.bar32(d, 2, 0x1000, 0x100, BAR_IO);
        cfg.writable.insert((d, BAR0 + 8), 0x0000_ff00);
        let f = read_function(&cfg, d);
        assert_eq!(
            f.bars,
            [
                Bar::Mem64 { addr: 0x40_0000_0000, size: 0x2_0000_0000, prefetchable: false },
                Bar::None,
                Bar::Io { port: 0x1000, size: 0x100 },
                Bar::None,
                Bar::None,
                Bar::None
            ]
        );
        // Bridges have two BARs; the rest of their header is not BARs.
        let mut cfg = FakeCfg::default();
        cfg.bridge_to(d, 1);
        cfg.bar32(d, 0, 0xfe10_0000, 0x1000, 0);
        assert_eq!(read_function(&cfg, d).bars[0], Bar::Mem32 { addr: 0xfe10_0000, size: 0x1000, prefetchable: false });
        assert_eq!(cfg.get(d, 0x18), 0x100);
    }
}
