//! The checks behind the kernel's fuzz targets (`fuzz_targets/`, libFuzzer, nightly): ARP on the port, the
//! multiboot information, the ACPI tables and the command line. The stable twins in
//! `kernel/tests/fuzz_twins.rs` include these files by path and run them in `cargo test`.

pub mod acpi;
pub mod arp;
pub mod cmdline;
pub mod mem;
pub mod multiboot;
