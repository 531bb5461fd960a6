//! Machine-specific code (x86-64, bare metal). The only place in the kernel with `unsafe`.

pub mod boot;
pub mod cpu;
pub mod descriptors;
pub mod exceptions;
pub mod exit;
pub mod fail_closed;
pub mod lapic;
pub mod logger;
pub mod memory;
pub mod mmio;
pub mod pci_access;
pub mod percpu;
pub mod rng;
pub mod serial;
pub mod smp;
pub mod start;
pub mod tsc;

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static FATAL_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Registers a function that fatal paths (exceptions, panics) call after their dump and after
/// [`fail_closed::fail_closed`], e.g. to print event rings. It must not take locks another core may hold.
pub fn set_fatal_hook(f: fn()) {
    FATAL_HOOK.store(f as usize, Ordering::SeqCst);
}

fn fatal_hooks() {
    // Devices stop serving memory first (docs/revoke-semantics.md, "Fail closed on crash"), then the dumps.
    fail_closed::fail_closed();
    let f = FATAL_HOOK.load(Ordering::SeqCst);
    if f != 0 {
        // SAFETY: only `set_fatal_hook` stores here, always a valid `fn()`.
        let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
        f();
    }
}

static PANICKING: [AtomicBool; percpu::MAX_CPUS] = [const { AtomicBool::new(false) }; percpu::MAX_CPUS];

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let core = percpu::core_id();
    if PANICKING.get(core as usize).is_none_or(|p| p.swap(true, Ordering::SeqCst)) {
        // A panic inside the fatal path (in its port-down step, say): bus mastering is still cleared.
        fail_closed::clear_bus_masters();
        exit::fail();
    }
    serial::claim_for_fatal();
    let loc = info.location();
    serial::write_unlocked(format_args!(
        "\n!!! c{core} PANIC at {}:{}: {}\n",
        loc.map_or("?", |l| l.file()),
        loc.map_or(0, |l| l.line()),
        info.message()
    ));
    fatal_hooks();
    exit::fatal_end()
}
