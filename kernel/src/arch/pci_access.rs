//! PCI configuration space access: ECAM (PCIe memory-mapped, from ACPI MCFG) and the legacy 0xCF8/0xCFC
//! port pair (PCI Local Bus spec 3.0, 3.2.2.3.2), for machines without MCFG such as QEMU's `pc`.

use super::cpu::{inl, outl};
use crate::pci::{Bdf, ConfigAccess};
use spin::Mutex;

/// One MCFG segment range, mapped uncached by the caller.
#[derive(Clone, Copy)]
pub struct Ecam {
    pub base: u64,
    pub segment: u16,
    pub start_bus: u8,
    pub end_bus: u8,
}

impl Ecam {
    fn addr(&self, a: Bdf, offset: u16) -> Option<u64> {
        if a.segment != self.segment || a.bus < self.start_bus || a.bus > self.end_bus || offset >= 4096 {
            return None;
        }
        let off = (u64::from(a.bus - self.start_bus) << 20)
            | (u64::from(a.device & 0x1F) << 15)
            | (u64::from(a.function & 0x7) << 12)
            | u64::from(offset & !3);
        Some(self.base + off)
    }
}

impl ConfigAccess for Ecam {
    fn read32(&self, a: Bdf, offset: u16) -> u32 {
        match self.addr(a, offset) {
            // SAFETY: the ECAM window of this segment's buses is mapped uncached (caller of `Ecam`), and the
            // address lies inside it (checked by `addr`).
            Some(p) => unsafe { super::mmio::read(p as *const u32) },
            None => u32::MAX,
        }
    }
    fn write32(&self, a: Bdf, offset: u16, value: u32) {
        if let Some(p) = self.addr(a, offset) {
            // SAFETY: as in `read32`.
            unsafe { super::mmio::write(p as *mut u32, value) }
        }
    }
}

/// Every MCFG window the kernel mapped, one per segment and bus range: an access goes to the window that holds
/// its segment and bus, and reads all-ones (writes nothing) outside them.
pub struct EcamSet {
    windows: [Ecam; crate::acpi::MAX_ECAM],
    len: usize,
}

impl EcamSet {
    pub const fn new() -> Self {
        EcamSet { windows: [Ecam { base: 0, segment: 0, start_bus: 1, end_bus: 0 }; crate::acpi::MAX_ECAM], len: 0 }
    }

    /// Adds a window; `false` when the set is full.
    pub fn push(&mut self, e: Ecam) -> bool {
        match self.windows.get_mut(self.len) {
            Some(slot) => {
                *slot = e;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    pub fn windows(&self) -> &[Ecam] {
        &self.windows[..self.len]
    }

    fn window(&self, a: Bdf) -> Option<&Ecam> {
        self.windows().iter().find(|w| w.segment == a.segment && (w.start_bus..=w.end_bus).contains(&a.bus))
    }
}

impl Default for EcamSet {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigAccess for EcamSet {
    fn read32(&self, a: Bdf, offset: u16) -> u32 {
        self.window(a).map_or(u32::MAX, |w| w.read32(a, offset))
    }
    fn write32(&self, a: Bdf, offset: u16, value: u32) {
        if let Some(w) = self.window(a) {
            w.write32(a, offset, value)
        }
    }
}

/// The two-step port mechanism is not atomic: one lock for all cores.
static PORTS: Mutex<()> = Mutex::new(());

/// Configuration mechanism #1 (segment 0, first 256 bytes only).
pub struct LegacyPorts;

fn cf8(a: Bdf, offset: u16) -> u32 {
    0x8000_0000
        | (u32::from(a.bus) << 16)
        | (u32::from(a.device & 0x1F) << 11)
        | (u32::from(a.function & 0x7) << 8)
        | u32::from(offset & 0xFC)
}

impl ConfigAccess for LegacyPorts {
    fn read32(&self, a: Bdf, offset: u16) -> u32 {
        if a.segment != 0 || offset >= 256 {
            return u32::MAX;
        }
        let _g = PORTS.lock();
        // SAFETY: 0xCF8/0xCFC are the PCI configuration ports; reads of config space have no memory effects.
        unsafe {
            outl(0xCF8, cf8(a, offset));
            inl(0xCFC)
        }
    }
    fn write32(&self, a: Bdf, offset: u16, value: u32) {
        if a.segment != 0 || offset >= 256 {
            return;
        }
        let _g = PORTS.lock();
        // SAFETY: as in `read32`; the caller decides what the write does to the device.
        unsafe {
            outl(0xCF8, cf8(a, offset));
            outl(0xCFC, value);
        }
    }
}

/// Attempts at the ports' lock on the fatal path before going ahead without it.
const FATAL_LOCK_TRIES: u32 = 1_000_000;

impl LegacyPorts {
    /// As `read32`/`write32`, for the fatal path (`fail_closed`): the lock is tried a bounded number of times,
    /// then the access goes ahead without it (its holder may be the core that stopped).
    fn fatal(&self, f: impl FnOnce()) {
        for _ in 0..FATAL_LOCK_TRIES {
            if let Some(_g) = PORTS.try_lock() {
                return f();
            }
            core::hint::spin_loop();
        }
        f()
    }
}

/// The configuration access the kernel enumerated with, kept for drivers (`Platform::pci_access`).
pub enum PciAccess {
    Ecam(EcamSet),
    Ports(LegacyPorts),
}

impl ConfigAccess for PciAccess {
    fn read32(&self, a: Bdf, offset: u16) -> u32 {
        match self {
            PciAccess::Ecam(e) => e.read32(a, offset),
            PciAccess::Ports(p) => p.read32(a, offset),
        }
    }
    fn write32(&self, a: Bdf, offset: u16, value: u32) {
        match self {
            PciAccess::Ecam(e) => e.write32(a, offset, value),
            PciAccess::Ports(p) => p.write32(a, offset, value),
        }
    }
}

impl PciAccess {
    /// A configuration read for the fatal path (`fail_closed`): never waits for long on a lock.
    pub fn read32_fatal(&self, a: Bdf, offset: u16) -> u32 {
        match self {
            PciAccess::Ecam(e) => e.read32(a, offset),
            PciAccess::Ports(p) => {
                if a.segment != 0 || offset >= 256 {
                    return u32::MAX;
                }
                let mut v = u32::MAX;
                // SAFETY: as in `LegacyPorts::read32`.
                p.fatal(|| unsafe {
                    outl(0xCF8, cf8(a, offset));
                    v = inl(0xCFC);
                });
                v
            }
        }
    }

    /// A configuration write for the fatal path (`fail_closed`): never waits for long on a lock.
    pub fn write32_fatal(&self, a: Bdf, offset: u16, value: u32) {
        match self {
            PciAccess::Ecam(e) => e.write32(a, offset, value),
            PciAccess::Ports(p) => {
                if a.segment != 0 || offset >= 256 {
                    return;
                }
                // SAFETY: as in `LegacyPorts::write32`.
                p.fatal(|| unsafe {
                    outl(0xCF8, cf8(a, offset));
                    outl(0xCFC, value);
                });
            }
        }
    }
}
