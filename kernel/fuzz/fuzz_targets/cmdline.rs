//! Fuzz target: a kernel command line through `Config::apply_cmdline` and `Config::check` (see `src/cmdline.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_kernel_fuzz::cmdline::check(data);
});
