//! Fuzz target: the firmware's ACPI tables through `acpi::parse` and the legacy RSDP search (see `src/acpi.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_kernel_fuzz::acpi::check(data);
});
