//! Fuzz target: one frame from the cable through the software requester's decoders (see `src/roce.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_client_fuzz::roce::check(data);
});
