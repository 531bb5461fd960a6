//! Leasebox kernel library.
//!
//! Everything that parses, allocates or decides lives in safe modules that also build for the host and are
//! unit-tested there (`bootinfo`, `acpi`, `arp`, `frames`, `paging`, `pci`, `config`, `net_config`, `time`). The code
//! that touches the machine — boot assembly, descriptor tables, port and MMIO access, AP start-up — lives under
//! `arch/`, builds only for `target_os = "none"`, and is the only place with `unsafe` (besides the RDTSC in
//! `time`, which host tests use too); the crate denies `unsafe_code` everywhere else.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod acpi;
pub mod arp;
pub mod bootinfo;
pub mod config;
pub mod console;
pub mod frames;
pub mod net_config;
pub mod paging;
pub mod pci;
pub mod physmem;
pub mod sizing;
pub mod time;
pub mod watchdog;

#[cfg(target_os = "none")]
#[allow(unsafe_code, reason = "the machine-specific ground floor: boot, descriptors, port and MMIO access")]
pub mod arch;
