//! Fuzz target: a byte stream through `FrameBuf`, every frame through `Request::decode`,
//! `Response::decode` and `ErrorBody::decode` (see `leasebox_proto_fuzz::check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasebox_proto_fuzz::check(data);
});
