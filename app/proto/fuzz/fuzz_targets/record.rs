//! Fuzz target: protocol v2's handshake messages and record stream as a peer sends them (see
//! `src/record.rs`, which the stable twin `app/proto/tests/record_twin.rs` runs too).
#![no_main]

#[path = "../src/record.rs"]
mod record;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    record::check(data);
});
