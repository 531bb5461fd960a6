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
