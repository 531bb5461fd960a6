//! Fuzz target: one frame from the port's segment through the neighbour table's ARP parser (see `src/arp.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_kernel_fuzz::arp::check(data);
});
