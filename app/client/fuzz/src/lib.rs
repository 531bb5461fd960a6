//! The checks behind the client library's fuzz targets (`fuzz_targets/`, libFuzzer, nightly). Each stable twin
//! in `app/client/tests/` includes its check's file by path and runs it in `cargo test`.

pub mod roce;
