//! Fuzz target: a Multiboot 1 or Multiboot2 information structure through `bootinfo::parse` (see `src/multiboot.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_kernel_fuzz::multiboot::check(data);
});
