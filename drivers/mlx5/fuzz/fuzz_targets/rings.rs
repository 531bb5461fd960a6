//! Fuzz target: CQEs and EQEs as the device writes them, read by the driver's rings (see `src/rings.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_mlx5_fuzz::rings::check(data);
});
