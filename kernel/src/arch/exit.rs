//! Leaving the machine after a fatal error: under QEMU, the `isa-debug-exit` device (port 0xF4) turns a
//! write of `v` into process exit status `(v << 1) | 1`; on bare metal (no hypervisor) the CPU halts.

use super::cpu::{halt_forever, outb, under_hypervisor};

const DEBUG_EXIT_PORT: u16 = 0xF4;

/// Ends the run as a failure: QEMU exits with status 3; elsewhere this core halts.
pub fn fail() -> ! {
    if under_hypervisor() {
        // SAFETY: port 0xF4 is QEMU's isa-debug-exit when configured, and unused on the machine types we
        // run on otherwise; the write has no memory effects.
        unsafe { outb(DEBUG_EXIT_PORT, 1) };
    }
    halt_forever()
}

/// How long a core whose fatal report is silenced waits for the console's owner to end the run itself.
const OWNER_WAIT: core::time::Duration = core::time::Duration::from_secs(5);

/// Ends a fatal path. The core that owns the console ([`super::serial::fatal_console_is_mine`]) ends the run at
/// once; another core that crashed meanwhile waits (bounded) for it, so the run does not end in the middle of
/// the owner's report, and then ends it in the owner's stead.
pub fn fatal_end() -> ! {
    if !super::serial::fatal_console_is_mine() {
        let deadline = crate::time::Deadline::after(OWNER_WAIT);
        while !deadline.expired() {
            core::hint::spin_loop();
        }
    }
    fail()
}
