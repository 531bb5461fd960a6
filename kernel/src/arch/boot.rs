//! Boot entry: Multiboot 1 (spec 0.6.96, with the a.out kludge so QEMU `-kernel` accepts an ELF64) and
//! Multiboot 2 (spec 2.0) headers, the 32-bit protected-mode entry both loaders jump to, the switch to long
//! mode on an identity map of the first 4 GiB (2 MiB pages), and the real-mode AP trampoline that SMP
//! start-up copies to a low page.
//!
//! Boot code stays small: everything after `kernel_entry64` is Rust.

use core::arch::global_asm;

/// Physical address the AP trampoline is copied to (SIPI vector 0x08).
pub const TRAMPOLINE_ADDR: u64 = 0x8000;

unsafe extern "C" {
    pub static __image_start: u8;
    pub static __image_end: u8;
    pub static boot_pml4: u8;
    pub static boot_stack_guard: u8;
    pub static boot_stack_bottom: u8;
    pub static boot_stack_top: u8;
    pub static boot_entry_tsc: u64;
    pub static ap_trampoline_start: u8;
    pub static ap_trampoline_end: u8;
    pub static ap_tramp_stack: u8;
    pub static ap_tramp_arg: u8;
    pub static ap_tramp_entry: u8;
}

global_asm!(
    r#"
    .set MB1_MAGIC, 0x1BADB002
    .set MB1_FLAGS, 0x00010003          # page-aligned modules, memory info, a.out address fields
    .set MB2_MAGIC, 0xE85250D6

    .section .multiboot1, "a"
    .p2align 2
mb1_header:
    .long MB1_MAGIC
    .long MB1_FLAGS
    .long 0x100000000 - (MB1_MAGIC + MB1_FLAGS)
    .long mb1_header                    # header_addr
    .long __image_start                 # load_addr
    .long __load_end                    # load_end_addr
    .long __image_end                   # bss_end_addr
    .long _start                        # entry_addr

    .section .multiboot2, "a"
    .p2align 3
mb2_header:
    .long MB2_MAGIC
    .long 0                             # architecture: i386 protected mode
    .long mb2_header_end - mb2_header
    .long 0x100000000 - (MB2_MAGIC + (mb2_header_end - mb2_header))
    .p2align 3
    .short 2, 0                         # address tag
    .long 24
    .long mb2_header
    .long __image_start
    .long __load_end
    .long __image_end
    .p2align 3
    .short 3, 0                         # entry address tag
    .long 12
    .long _start
    .p2align 3
    .short 0, 0                         # end tag
    .long 8
mb2_header_end:

    .section .bss.pagetables, "aw", @nobits
    .p2align 12
    .global boot_pml4
boot_pml4:
    .skip 4096
boot_pdpt:
    .skip 4096
boot_pd:
    .skip 4096 * 4
    .p2align 12
    .global boot_stack_guard
boot_stack_guard:                       # unmapped once paging is ours (start.rs): an overflow faults here
    .skip 4096                          # instead of running into the page tables above
    .global boot_stack_bottom, boot_stack_top
boot_stack_bottom:
    .skip 131072
boot_stack_top:
    .p2align 3
    .global boot_entry_tsc
boot_entry_tsc:
    .skip 8

    .section .text.boot, "ax"
    .code32
    .global _start
_start:
    cli
    cld
    mov %eax, %edi                      # bootloader magic
    mov %ebx, %esi                      # boot information (physical)
    rdtsc
    mov %eax, boot_entry_tsc
    mov %edx, boot_entry_tsc + 4
    mov $boot_stack_top, %esp

    # Long mode must exist (CPUID 0x80000001 EDX bit 29) or nothing below can work.
    mov $0x80000000, %eax
    cpuid
    cmp $0x80000001, %eax
    jb no_long_mode
    mov $0x80000001, %eax
    cpuid
    bt $29, %edx
    jnc no_long_mode

    # PML4[0] -> PDPT; PDPT[0..4] -> four PDs; each PD maps 1 GiB with 2 MiB pages (P | RW | PS).
    mov $boot_pdpt, %eax
    or $0x3, %eax
    mov %eax, boot_pml4
    xor %ecx, %ecx
1:  mov %ecx, %eax
    shl $12, %eax
    add $boot_pd, %eax
    or $0x3, %eax
    mov %eax, boot_pdpt(,%ecx,8)
    inc %ecx
    cmp $4, %ecx
    jb 1b
    xor %ecx, %ecx
2:  mov %ecx, %eax
    shl $21, %eax
    or $0x83, %eax
    mov %eax, boot_pd(,%ecx,8)
    movl $0, boot_pd + 4(,%ecx,8)
    inc %ecx
    cmp $2048, %ecx
    jb 2b

    mov %cr4, %eax
    or $0x20, %eax                      # PAE
    mov %eax, %cr4
    mov $boot_pml4, %eax
    mov %eax, %cr3
    mov $0xC0000080, %ecx               # IA32_EFER
    rdmsr
    or $0x100, %eax                     # LME
    wrmsr
    mov %cr0, %eax
    and $0x9FFFFFFF, %eax               # caches on (clear CD, NW)
    or $0x80010001, %eax                # PG | WP | PE
    mov %eax, %cr0
    lgdt boot_gdt_ptr
    ljmp $0x08, $long_entry

no_long_mode:
    mov $no_long_mode_msg, %esi
3:  movb (%esi), %al
    test %al, %al
    jz 5f
    mov $0x3FD, %dx                     # COM1 line status: wait for THR empty (bounded)
    mov $100000, %ecx
4:  inb %dx, %al
    test $0x20, %al
    jnz 6f
    loop 4b
6:  movb (%esi), %al
    mov $0x3F8, %dx
    outb %al, %dx
    inc %esi
    jmp 3b
5:  cli
    hlt
    jmp 5b

    .code64
long_entry:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    xor %eax, %eax
    mov %ax, %fs
    mov %ax, %gs
    mov $boot_stack_top, %rsp
    mov %edi, %edi                      # zero-extend: upper halves are undefined after the mode switch
    mov %esi, %esi
    xor %ebp, %ebp
    call kernel_entry64
7:  cli
    hlt
    jmp 7b

    .section .rodata.boot, "a"
    .p2align 4
boot_gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF            # 0x08: 64-bit code
    .quad 0x00CF92000000FFFF            # 0x10: data
boot_gdt_end:
boot_gdt_ptr:
    .short boot_gdt_end - boot_gdt - 1
    .long boot_gdt
no_long_mode_msg:
    .asciz "leasebox: fatal: this CPU has no long mode (x86-64)\r\n"

    # The AP trampoline: copied to 0x8000 and entered in real mode by a SIPI with vector 0x08. Addresses
    # inside it are computed relative to its copy; the kernel symbols it uses are absolute and below 4 GiB.
    .p2align 4
    .global ap_trampoline_start
ap_trampoline_start:
    .code16
    cli
    cld
    xor %ax, %ax
    mov %ax, %ds
    lgdtl ap_tramp_gdt_ptr - ap_trampoline_start + 0x8000
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $0x08, $ap_tramp32 - ap_trampoline_start + 0x8000
    .code32
ap_tramp32:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %cr4, %eax
    or $0x20, %eax
    mov %eax, %cr4
    mov $boot_pml4, %eax
    mov %eax, %cr3
    mov $0xC0000080, %ecx
    rdmsr
    or $0x100, %eax
    wrmsr
    mov %cr0, %eax
    and $0x9FFFFFFF, %eax
    or $0x80010001, %eax
    mov %eax, %cr0
    ljmp $0x18, $ap_tramp64 - ap_trampoline_start + 0x8000
    .code64
ap_tramp64:
    xor %eax, %eax
    mov %ax, %fs
    mov %ax, %gs
    mov ap_tramp_stack - ap_trampoline_start + 0x8000, %rsp
    mov ap_tramp_arg - ap_trampoline_start + 0x8000, %rdi
    mov ap_tramp_entry - ap_trampoline_start + 0x8000, %rax
    xor %ebp, %ebp
    call *%rax
8:  cli
    hlt
    jmp 8b
    .p2align 3
ap_tramp_gdt:
    .quad 0
    .quad 0x00CF9A000000FFFF            # 0x08: 32-bit code
    .quad 0x00CF92000000FFFF            # 0x10: data
    .quad 0x00AF9A000000FFFF            # 0x18: 64-bit code
ap_tramp_gdt_ptr:
    .short 31
    .long ap_tramp_gdt - ap_trampoline_start + 0x8000
    .p2align 3
    .global ap_tramp_stack, ap_tramp_arg, ap_tramp_entry
ap_tramp_stack:
    .quad 0
ap_tramp_arg:
    .quad 0
ap_tramp_entry:
    .quad 0
    .global ap_trampoline_end
ap_trampoline_end:
    .text
"#,
    options(att_syntax)
);

/// The boot stack's size and the most of it ever used so far (the stack starts zeroed, so the lowest nonzero
/// byte is its high-water mark; a frame that reserved space and left it zero is not counted).
pub fn boot_stack_usage() -> (usize, usize) {
    // SAFETY: only the addresses of the linker symbols are taken.
    let (bottom, top) = unsafe { (&boot_stack_bottom as *const u8 as usize, &boot_stack_top as *const u8 as usize) };
    let mut at = bottom;
    // SAFETY: `[bottom, top)` is the boot stack, mapped and part of the image; the bytes below the live frames
    // are read while the BSP may be using the stack above them, which does not touch them.
    while at < top && unsafe { super::mmio::read(at as *const u64) } == 0 {
        at += 8;
    }
    (top - bottom, top - at)
}
