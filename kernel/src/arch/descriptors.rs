//! GDT, TSS and IDT (Intel SDM vol. 3, ch. 3 and 6). One IDT shared by all cores; a GDT and TSS per core,
//! whose IST slots give double fault, NMI and machine check stacks of their own so a smashed kernel stack
//! still produces a dump.

use super::exceptions;
use super::percpu;
use core::arch::asm;
use core::cell::UnsafeCell;

pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const TSS_SEL: u16 = 0x18;

/// IST slot (1-based, as in the IDT entry) per vector; 0 = current stack.
fn ist_for(vector: usize) -> u8 {
    match vector {
        8 => 1,  // #DF
        2 => 2,  // NMI
        18 => 3, // #MC
        _ => 0,
    }
}
pub const IST_STACKS: usize = 3;

#[derive(Clone, Copy)]
#[repr(C)]
struct IdtEntry {
    offset_low: u16,
    selector: u16,
    ist: u8,
    type_attr: u8,
    offset_mid: u16,
    offset_high: u32,
    reserved: u32,
}
const _: () = assert!(core::mem::size_of::<IdtEntry>() == 16);

const EMPTY: IdtEntry =
    IdtEntry { offset_low: 0, selector: 0, ist: 0, type_attr: 0, offset_mid: 0, offset_high: 0, reserved: 0 };

struct Idt(UnsafeCell<[IdtEntry; 32]>);
// SAFETY: written once by the BSP (`build_idt`) before any core loads it; read-only afterwards.
unsafe impl Sync for Idt {}
static IDT: Idt = Idt(UnsafeCell::new([EMPTY; 32]));

#[repr(C, packed)]
struct DescriptorPointer {
    limit: u16,
    base: u64,
}

/// Fills the IDT with the exception stubs. BSP only, before the first `load`.
pub fn build_idt() {
    let stubs = exceptions::stub_addresses();
    // SAFETY: no core has loaded the IDT yet (BSP, single-threaded boot), so this is the only access.
    let idt = unsafe { &mut *IDT.0.get() };
    for (v, e) in idt.iter_mut().enumerate() {
        let a = stubs[v];
        *e = IdtEntry {
            offset_low: a as u16,
            selector: KERNEL_CS,
            ist: ist_for(v),
            type_attr: 0x8E, // present, DPL 0, 64-bit interrupt gate (IF stays clear)
            offset_mid: (a >> 16) as u16,
            offset_high: (a >> 32) as u32,
            reserved: 0,
        };
    }
}

fn tss_descriptor(base: u64, limit: u32) -> (u64, u64) {
    let low = u64::from(limit & 0xFFFF)
        | ((base & 0xFF_FFFF) << 16)
        | (0x89u64 << 40) // present, 64-bit TSS (available)
        | (u64::from((limit >> 16) & 0xF) << 48)
        | (((base >> 24) & 0xFF) << 56);
    (low, base >> 32)
}

/// Builds and loads this core's GDT and TSS (with the given IST stack tops) and the shared IDT.
///
/// # Safety
/// Must run on the core that owns `index` (after `percpu::activate`), after `build_idt`; the stack tops must
/// be the ends of memory reserved for this core for good.
pub unsafe fn load(index: usize, ist_tops: [u64; IST_STACKS]) {
    let b = percpu::block(index);
    // SAFETY: block `index` belongs to this core (caller contract); the GDT and TSS live in a static, so the
    // addresses handed to the CPU stay valid forever. The segment reloads use selectors of the GDT just
    // loaded; GS is not reloaded, so the per-CPU base survives.
    unsafe {
        for (i, top) in ist_tops.iter().enumerate() {
            (*b).tss.ist[i] = *top;
        }
        let tss_addr = core::ptr::addr_of!((*b).tss) as u64;
        let (lo, hi) = tss_descriptor(tss_addr, (core::mem::size_of::<percpu::Tss>() - 1) as u32);
        (*b).gdt = [0, 0x00AF_9A00_0000_FFFF, 0x00CF_9200_0000_FFFF, lo, hi];
        let gdtp = DescriptorPointer {
            limit: (core::mem::size_of::<[u64; 5]>() - 1) as u16,
            base: core::ptr::addr_of!((*b).gdt) as u64,
        };
        asm!("lgdt [{}]", in(reg) &gdtp, options(readonly, nostack, preserves_flags));
        asm!(
            "push {cs}",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "retfq",
            "2:",
            "mov ds, {ds:x}",
            "mov es, {ds:x}",
            "mov ss, {ds:x}",
            cs = in(reg) u64::from(KERNEL_CS),
            ds = in(reg) u64::from(KERNEL_DS),
            tmp = lateout(reg) _,
            options(preserves_flags),
        );
        asm!("ltr {:x}", in(reg) TSS_SEL, options(nostack, preserves_flags));
        let idtp =
            DescriptorPointer { limit: (core::mem::size_of::<[IdtEntry; 32]>() - 1) as u16, base: IDT.0.get() as u64 };
        asm!("lidt [{}]", in(reg) &idtp, options(readonly, nostack, preserves_flags));
    }
}
