//! Thin wrappers over the x86-64 instructions the kernel needs: port I/O, MSRs, control registers, TSC,
//! CPUID, halting. Each is `unsafe` where misuse can break memory safety or the machine's state.

use core::arch::asm;

/// Writes a byte to an I/O port.
///
/// # Safety
/// The port must belong to a device whose side effects the caller accounts for.
pub unsafe fn outb(port: u16, value: u8) {
    // SAFETY: the caller vouches for the port; `out` touches no memory.
    unsafe { asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags)) }
}

/// Reads a byte from an I/O port.
///
/// # Safety
/// As [`outb`]: reads can have device side effects.
pub unsafe fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: the caller vouches for the port; `in` touches no memory.
    unsafe { asm!("in al, dx", out("al") v, in("dx") port, options(nomem, nostack, preserves_flags)) }
    v
}

/// Writes a dword to an I/O port.
///
/// # Safety
/// As [`outb`].
pub unsafe fn outl(port: u16, value: u32) {
    // SAFETY: the caller vouches for the port.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags)) }
}

/// Reads a dword from an I/O port.
///
/// # Safety
/// As [`outb`].
pub unsafe fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: the caller vouches for the port.
    unsafe { asm!("in eax, dx", out("eax") v, in("dx") port, options(nomem, nostack, preserves_flags)) }
    v
}

/// Reads a model-specific register.
///
/// # Safety
/// The MSR must exist on this CPU (a missing one raises #GP).
pub unsafe fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller vouches that the MSR exists.
    unsafe { asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Writes a model-specific register.
///
/// # Safety
/// The MSR must exist and the value must keep the machine in a state the kernel expects.
pub unsafe fn wrmsr(msr: u32, value: u64) {
    // SAFETY: the caller vouches for the MSR and value.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32,
             options(nostack, preserves_flags))
    }
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
    let v: u64;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// The current page-table root.
pub fn cr3() -> u64 {
    let v: u64;
    // SAFETY: reading CR3 has no side effects.
    unsafe { asm!("mov {}, cr3", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// Flushes all non-global TLB entries by reloading CR3.
///
/// # Safety
/// The current page tables must stay valid for the code and data in use.
pub unsafe fn flush_tlb() {
    // SAFETY: writing back the same root keeps the address space; only cached translations are dropped.
    unsafe { asm!("mov rax, cr3", "mov cr3, rax", out("rax") _, options(nostack, preserves_flags)) }
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
