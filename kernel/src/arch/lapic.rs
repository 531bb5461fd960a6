//! The local APIC (Intel SDM vol. 3, ch. 11), used only to start application processors: interrupts stay
//! off, so no timer, LVT or EOI handling. xAPIC (MMIO, mapped uncached) or x2APIC (MSRs), whichever the
//! firmware left enabled.

use super::cpu::{IA32_APIC_BASE, rdmsr, wrmsr};
use super::memory;
use crate::time::{Deadline, wait_until};
use core::time::Duration;

const REG_ID: u64 = 0x20;
const REG_SVR: u64 = 0xF0;
const REG_ICR_LOW: u64 = 0x300;
const REG_ICR_HIGH: u64 = 0x310;
const X2APIC_MSR_BASE: u32 = 0x800;
const ICR_DELIVERY_PENDING: u32 = 1 << 12;
const ICR_INIT_ASSERT: u32 = 0x0000_4500; // INIT, level assert, edge
const ICR_STARTUP: u32 = 0x0000_4600; // start-up IPI; low byte = vector (page number)

#[derive(Clone, Copy, Debug)]
pub enum Lapic {
    Xapic { base: u64 },
    X2apic,
}

impl Lapic {
    /// Finds the BSP's local APIC mode, maps xAPIC registers and software-enables the APIC.
    pub fn init() -> Result<Lapic, crate::paging::MapError> {
        // SAFETY: IA32_APIC_BASE exists on every x86-64 CPU.
        let msr = unsafe { rdmsr(IA32_APIC_BASE) };
        let l = if msr & (1 << 10) != 0 {
            Lapic::X2apic
        } else {
            let base = msr & 0x000F_FFFF_FFFF_F000;
            memory::map_mmio(base, 4096)?;
            Lapic::Xapic { base }
        };
        let svr = l.read(REG_SVR);
        l.write(REG_SVR, svr | 0x100 | 0xFF); // APIC software enable, spurious vector 0xFF
        Ok(l)
    }

    fn read(&self, reg: u64) -> u32 {
        match *self {
            // SAFETY: the xAPIC page is mapped uncached (init) and `reg` is a register offset within it.
            Lapic::Xapic { base } => unsafe { super::mmio::read((base + reg) as *const u32) },
            // SAFETY: x2APIC is enabled (checked in init); MSR 0x800 + reg/16 is the register's MSR.
            Lapic::X2apic => unsafe { rdmsr(X2APIC_MSR_BASE + (reg >> 4) as u32) as u32 },
        }
    }

    fn write(&self, reg: u64, v: u32) {
        match *self {
            // SAFETY: as in `read`.
            Lapic::Xapic { base } => unsafe { super::mmio::write((base + reg) as *mut u32, v) },
            // SAFETY: as in `read`.
            Lapic::X2apic => unsafe { wrmsr(X2APIC_MSR_BASE + (reg >> 4) as u32, u64::from(v)) },
        }
    }

    /// This CPU's APIC id.
    pub fn id(&self) -> u32 {
        match self {
            Lapic::Xapic { .. } => self.read(REG_ID) >> 24,
            Lapic::X2apic => self.read(REG_ID),
        }
    }

    /// Sends an IPI and waits (bounded) until the APIC has delivered it.
    fn ipi(&self, apic_id: u32, low: u32) -> bool {
        match *self {
            Lapic::Xapic { .. } => {
                self.write(REG_ICR_HIGH, apic_id << 24);
                self.write(REG_ICR_LOW, low);
                wait_until(Deadline::after(Duration::from_millis(100)), || {
                    self.read(REG_ICR_LOW) & ICR_DELIVERY_PENDING == 0
                })
            }
            Lapic::X2apic => {
                // SAFETY: x2APIC ICR is one 64-bit MSR (0x830); destination in the high half.
                unsafe { wrmsr(X2APIC_MSR_BASE + 0x30, (u64::from(apic_id) << 32) | u64::from(low)) };
                true
            }
        }
    }

    pub fn send_init(&self, apic_id: u32) -> bool {
        self.ipi(apic_id, ICR_INIT_ASSERT)
    }

    pub fn send_startup(&self, apic_id: u32, page: u8) -> bool {
        self.ipi(apic_id, ICR_STARTUP | u32::from(page))
    }
}
