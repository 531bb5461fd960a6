//! The checks behind the mlx5 driver's fuzz targets (`fuzz_targets/`, libFuzzer, nightly). Each stable twin in
//! `drivers/mlx5/tests/` includes its check's file by path and runs it in `cargo test`.

pub mod rings;
