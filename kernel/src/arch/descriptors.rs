//! GDT, TSS and IDT (Intel SDM vol. 3, ch. 3 and 6), built from the `x86_64` crate's types. One IDT shared by
//! all cores; a GDT and TSS per core, whose IST slots give double fault, NMI and machine check stacks of their
//! own so a smashed kernel stack still produces a dump.
//!
//! The IDT entries point at the hand-written stubs of `exceptions.rs`, not at crate handler functions: those
//! need the `x86-interrupt` ABI (nightly only), and the stubs push every register for the fatal dump.

use super::exceptions;
use super::percpu;
use spin::Once;
use x86_64::instructions::segmentation::{CS, DS, ES, SS, Segment};
use x86_64::instructions::tables::load_tss;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::idt::{EntryOptions, InterruptDescriptorTable};
use x86_64::{PrivilegeLevel, VirtAddr};

/// A core's GDT: null, 64-bit code, data, and the TSS (a system descriptor, two entries).
pub type Gdt = GlobalDescriptorTable<5>;

/// The kernel code selector: GDT index 1 here, as in the boot GDT (`boot.rs`) the IDT is built under.
const KERNEL_CS: SegmentSelector = SegmentSelector::new(1, PrivilegeLevel::Ring0);

/// IST slot (0-based, as the crate and the TSS array count) per vector; `None` = current stack.
fn ist_for(vector: u8) -> Option<u16> {
    match vector {
        8 => Some(0),  // #DF
        2 => Some(1),  // NMI
        18 => Some(2), // #MC
        _ => None,
    }
}
pub const IST_STACKS: usize = 3;

static IDT: Once<InterruptDescriptorTable> = Once::new();

/// Points `vector`'s entry at `addr` (64-bit interrupt gate, DPL 0, present) and returns its options.
/// Vectors that push an error code are fields of the crate's table, the others are reached by index.
///
/// # Safety
/// `addr` must be an exception stub that expects the frame the CPU pushes for `vector`.
unsafe fn set_entry(idt: &mut InterruptDescriptorTable, vector: u8, addr: VirtAddr) -> &mut EntryOptions {
    // SAFETY: `addr` suits `vector` (caller contract).
    unsafe {
        match vector {
            8 => idt.double_fault.set_handler_addr(addr),
            10 => idt.invalid_tss.set_handler_addr(addr),
            11 => idt.segment_not_present.set_handler_addr(addr),
            12 => idt.stack_segment_fault.set_handler_addr(addr),
            13 => idt.general_protection_fault.set_handler_addr(addr),
            14 => idt.page_fault.set_handler_addr(addr),
            17 => idt.alignment_check.set_handler_addr(addr),
            18 => idt.machine_check.set_handler_addr(addr),
            21 => idt.cp_protection_exception.set_handler_addr(addr),
            29 => idt.vmm_communication_exception.set_handler_addr(addr),
            30 => idt.security_exception.set_handler_addr(addr),
            v => idt[v].set_handler_addr(addr),
        }
    }
}

/// The IDT: every exception vector on its stub. The reserved vectors (15, 22–27, 31), which no CPU raises,
/// have no stub (the crate keeps their entries private) and stay not present, as do the interrupt vectors
/// 32–255 (interrupts are off everywhere).
fn build_idt() -> InterruptDescriptorTable {
    let mut idt = InterruptDescriptorTable::new();
    for (vector, &addr) in (0u8..).zip(exceptions::stub_addresses().iter()) {
        if addr == 0 {
            continue;
        }
        // SAFETY: the stub for `vector` is written for that vector's frame (with or without an error code);
        // KERNEL_CS is the 64-bit code segment of every GDT the kernel loads; the IST slots are filled in
        // every core's TSS by `load` before its IDT is loaded, and each is used by this one vector only.
        unsafe {
            let options = set_entry(&mut idt, vector, VirtAddr::new(addr));
            options.set_code_selector(KERNEL_CS);
            if let Some(ist) = ist_for(vector) {
                options.set_stack_index(ist);
            }
        }
    }
    idt
}

/// Builds and loads this core's GDT and TSS (with the given IST stack tops) and the shared IDT (built by the
/// first core to get here, the BSP).
///
/// # Safety
/// Must run on the core that owns `index` (after `percpu::activate`); the stack tops must be the ends of
/// memory reserved for this core for good.
pub unsafe fn load(index: usize, ist_tops: [u64; IST_STACKS]) {
    let b = percpu::block(index);
    // SAFETY: block `index` belongs to this core (caller contract) and lives in a static, so the references
    // are the only ones and the addresses handed to the CPU stay valid forever. The GDT and TSS are not
    // written again after loading. The segment reloads use selectors of the GDT just loaded; GS is not
    // reloaded, so the per-CPU base survives.
    unsafe {
        // A packed field: copied out and back whole, never referenced.
        let mut ist = (*b).tss.interrupt_stack_table;
        for (slot, &top) in ist.iter_mut().zip(&ist_tops) {
            *slot = VirtAddr::new(top);
        }
        (*b).tss.interrupt_stack_table = ist;
        let tss = &*core::ptr::addr_of!((*b).tss);
        let gdt = &mut *core::ptr::addr_of_mut!((*b).gdt);
        *gdt = Gdt::empty();
        let cs = gdt.append(Descriptor::kernel_code_segment());
        assert_eq!(cs, KERNEL_CS, "the IDT's code selector must be the GDT's code segment");
        let ds = gdt.append(Descriptor::kernel_data_segment());
        let tss_sel = gdt.append(Descriptor::tss_segment(tss));
        let gdt: &'static Gdt = gdt;
        gdt.load();
        CS::set_reg(cs);
        DS::set_reg(ds);
        ES::set_reg(ds);
        SS::set_reg(ds);
        load_tss(tss_sel);
    }
    IDT.call_once(build_idt).load();
}
