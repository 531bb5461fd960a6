//! CPU exceptions (vectors 0–31). Every one is fatal in Leasebox: interrupts are off everywhere, so an
//! exception is a bug or a hardware fault. The stub saves the registers; `exception_dispatch` prints vector,
//! error code, RIP, CR2 and all registers with the core id, then fails the run (QEMU exit status 3, or halt).

use super::{cpu, exit, percpu, serial};
use core::arch::global_asm;
use core::sync::atomic::{AtomicBool, Ordering};

global_asm!(
    r#"
    .macro EXC_NOERR n
exc_stub_\n:
    push $0
    push $\n
    jmp exc_common
    .endm
    .macro EXC_ERR n
exc_stub_\n:
    push $\n
    jmp exc_common
    .endm

    .text
    .irp n, 0,1,2,3,4,5,6,7,9,16,18,19,20,28
    EXC_NOERR \n
    .endr
    .irp n, 8,10,11,12,13,14,17,21,29,30
    EXC_ERR \n
    .endr

exc_common:
    push %rax
    push %rbx
    push %rcx
    push %rdx
    push %rsi
    push %rdi
    push %rbp
    push %r8
    push %r9
    push %r10
    push %r11
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, %rdi
    and $-16, %rsp
    call exception_dispatch
1:  cli
    hlt
    jmp 1b

    .section .rodata
    .p2align 3
    .global exception_stub_table
exception_stub_table:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14
    .quad exc_stub_\n
    .endr
    .quad 0                             # 15: reserved
    .irp n, 16,17,18,19,20,21
    .quad exc_stub_\n
    .endr
    .fill 6, 8, 0                       # 22-27: reserved
    .irp n, 28,29,30
    .quad exc_stub_\n
    .endr
    .quad 0                             # 31: reserved
    .text
"#,
    options(att_syntax)
);

unsafe extern "C" {
    static exception_stub_table: [u64; 32];
}

/// Entry address of each exception vector's stub, for the IDT; 0 for the reserved vectors, which have none.
pub fn stub_addresses() -> [u64; 32] {
    // SAFETY: the table is a read-only array of 32 quads emitted by the assembly above.
    unsafe { exception_stub_table }
}

/// The registers as `exc_common` left them on the stack, lowest address first.
#[repr(C)]
pub struct Frame {
    r15: u64,
    r14: u64,
    r13: u64,
    r12: u64,
    r11: u64,
    r10: u64,
    r9: u64,
    r8: u64,
    rbp: u64,
    rdi: u64,
    rsi: u64,
    rdx: u64,
    rcx: u64,
    rbx: u64,
    rax: u64,
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

const NAMES: [&str; 32] = [
    "#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "#CSO", "#TS", "#NP", "#SS", "#GP", "#PF", "#15",
    "#MF", "#AC", "#MC", "#XM", "#VE", "#CP", "#22", "#23", "#24", "#25", "#26", "#27", "#HV", "#VC", "#SX", "#31",
];

static IN_FATAL: [AtomicBool; percpu::MAX_CPUS] = [const { AtomicBool::new(false) }; percpu::MAX_CPUS];

#[unsafe(no_mangle)]
extern "C" fn exception_dispatch(f: &Frame) -> ! {
    let core = percpu::core_id();
    if IN_FATAL.get(core as usize).is_none_or(|b| b.swap(true, Ordering::SeqCst)) {
        // A fault while reporting a fault: say nothing more; bus mastering is still cleared, then stop.
        super::fail_closed::clear_bus_masters();
        exit::fail();
    }
    serial::claim_for_fatal();
    let name = NAMES.get(f.vector as usize).copied().unwrap_or("#??");
    let p = serial::write_unlocked;
    p(format_args!(
        "\n!!! c{core} EXCEPTION {name} vector={} error={:#x} rip={:#018x} cr2={:#018x}\n",
        f.vector,
        f.error,
        f.rip,
        cpu::cr2()
    ));
    p(format_args!("!!! c{core} rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n", f.rax, f.rbx, f.rcx, f.rdx));
    p(format_args!("!!! c{core} rsi={:#018x} rdi={:#018x} rbp={:#018x} rsp={:#018x}\n", f.rsi, f.rdi, f.rbp, f.rsp));
    p(format_args!("!!! c{core} r8={:#018x} r9={:#018x} r10={:#018x} r11={:#018x}\n", f.r8, f.r9, f.r10, f.r11));
    p(format_args!("!!! c{core} r12={:#018x} r13={:#018x} r14={:#018x} r15={:#018x}\n", f.r12, f.r13, f.r14, f.r15));
    p(format_args!("!!! c{core} cs={:#x} ss={:#x} rflags={:#x} cr3={:#x}\n", f.cs, f.ss, f.rflags, cpu::cr3()));
    super::fatal_hooks();
    exit::fatal_end()
}
