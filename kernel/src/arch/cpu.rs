//! The x86-64 instructions the kernel needs — port I/O, MSRs, control registers, TLB flushes from the `x86_64`
//! crate (`docs/architecture.md`, "Ground floor"); TSC, CPUID, halting here — behind small functions the rest of
//! `arch/` calls. Each is `unsafe` where misuse can break memory safety or the machine's state.

use core::arch::asm;
use x86_64::instructions::port::{PortReadOnly, PortWriteOnly};
use x86_64::registers::control::{Cr2, Cr3};
use x86_64::registers::model_specific::Msr;
use x86_64::structures::paging::PhysFrame;

/// Writes a byte to an I/O port.
///
/// # Safety
/// The port must belong to a device whose side effects the caller accounts for.
pub unsafe fn outb(port: u16, value: u8) {
    // SAFETY: the caller vouches for the port; `out` touches no memory.
    unsafe { PortWriteOnly::<u8>::new(port).write(value) }
}

/// Reads a byte from an I/O port.
///
/// # Safety
/// As [`outb`]: reads can have device side effects.
pub unsafe fn inb(port: u16) -> u8 {
    // SAFETY: the caller vouches for the port; `in` touches no memory.
    unsafe { PortReadOnly::<u8>::new(port).read() }
}

/// Writes a dword to an I/O port.
///
/// # Safety
/// As [`outb`].
pub unsafe fn outl(port: u16, value: u32) {
    // SAFETY: the caller vouches for the port.
    unsafe { PortWriteOnly::<u32>::new(port).write(value) }
}

/// Reads a dword from an I/O port.
///
/// # Safety
/// As [`outb`].
pub unsafe fn inl(port: u16) -> u32 {
    // SAFETY: the caller vouches for the port.
    unsafe { PortReadOnly::<u32>::new(port).read() }
}

/// Reads a model-specific register.
///
/// # Safety
/// The MSR must exist on this CPU (a missing one raises #GP).
pub unsafe fn rdmsr(msr: u32) -> u64 {
    // SAFETY: the caller vouches that the MSR exists.
    unsafe { Msr::new(msr).read() }
}

/// Writes a model-specific register.
///
/// # Safety
/// The MSR must exist and the value must keep the machine in a state the kernel expects.
pub unsafe fn wrmsr(msr: u32, value: u64) {
    // SAFETY: the caller vouches for the MSR and value.
    unsafe { Msr::new(msr).write(value) }
}

pub const IA32_APIC_BASE: u32 = 0x1B;
pub const IA32_GS_BASE: u32 = 0xC000_0101;

/// The time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the counter (CR4.TSD is clear in ring 0 anyway).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// CPUID leaf/subleaf → (eax, ebx, ecx, edx).
pub fn cpuid(leaf: u32, subleaf: u32) -> (u32, u32, u32, u32) {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    (r.eax, r.ebx, r.ecx, r.edx)
}

/// True when CPUID says we run under a hypervisor (leaf 1, ECX bit 31).
pub fn under_hypervisor() -> bool {
    cpuid(1, 0).2 & (1 << 31) != 0
}

/// The page-fault linear address.
pub fn cr2() -> u64 {
    Cr2::read_raw()
}

/// The current page-table root, as the register holds it (address and flags).
pub fn cr3() -> u64 {
    let (frame, flags) = Cr3::read_raw();
    frame.start_address().as_u64() | u64::from(flags)
}

/// The frame of the current top-level page table (CR3 without its flags).
pub fn page_table_root() -> PhysFrame {
    Cr3::read().0
}

/// Flushes all non-global TLB entries by reloading CR3 (the same root: only cached translations go).
pub fn flush_tlb() {
    x86_64::instructions::tlb::flush_all();
}

/// Spin-loop hint.
#[inline]
pub fn relax() {
    core::hint::spin_loop();
}

/// Halts this CPU for good with interrupts off.
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: with interrupts disabled `hlt` parks the CPU; nothing is touched.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
