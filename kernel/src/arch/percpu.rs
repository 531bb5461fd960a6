//! Per-CPU state, reached through the GS base: the core index (read by every log line), the APIC id, and
//! each core's own GDT and TSS (whose IST stacks differ per core).

use super::cpu::{IA32_GS_BASE, wrmsr};
use super::descriptors::Gdt;
use core::arch::asm;
use core::cell::UnsafeCell;
use x86_64::structures::tss::TaskStateSegment;

/// Upper bound on CPUs the kernel drives (budget; ACPI reports more → the rest stay parked).
pub const MAX_CPUS: usize = 64;

#[repr(C, align(64))]
pub struct PerCpu {
    /// Offset 0: `core_id()` reads it as `gs:[0]`.
    pub index: u32,
    pub apic_id: u32,
    pub gdt: Gdt,
    pub tss: TaskStateSegment,
}

impl PerCpu {
    const fn new() -> Self {
        PerCpu { index: 0, apic_id: 0, gdt: Gdt::empty(), tss: TaskStateSegment::new() }
    }
}

struct Table(UnsafeCell<[PerCpu; MAX_CPUS]>);
// SAFETY: entry i is written only by the BSP before core i starts, and afterwards only by core i itself.
unsafe impl Sync for Table {}

static PERCPU: Table = Table(UnsafeCell::new([const { PerCpu::new() }; MAX_CPUS]));

/// Raw pointer to core `index`'s block.
pub fn block(index: usize) -> *mut PerCpu {
    assert!(index < MAX_CPUS, "cpu index {index} beyond MAX_CPUS");
    // SAFETY: in bounds (checked); only a raw pointer is formed, no reference.
    unsafe { (PERCPU.0.get() as *mut PerCpu).add(index) }
}

/// Points this CPU's GS base at block `index` and records its identity.
///
/// # Safety
/// Must run on the CPU that owns `index`, once, before anything calls [`core_id`] on it.
pub unsafe fn activate(index: usize, apic_id: u32) {
    let b = block(index);
    // SAFETY: block `index` belongs to the calling CPU (caller contract); no other core touches it now.
    unsafe {
        (*b).index = index as u32;
        (*b).apic_id = apic_id;
        wrmsr(IA32_GS_BASE, b as u64);
    }
}

/// The index of the running core (0 = bootstrap processor).
#[inline]
pub fn core_id() -> u32 {
    let v: u32;
    // SAFETY: GS base points at this core's `PerCpu` (set by `activate` first thing on every core); offset 0
    // is `index`.
    unsafe { asm!("mov {:e}, gs:[0]", out(reg) v, options(nostack, readonly, preserves_flags)) }
    v
}
