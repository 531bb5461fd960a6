//! The QEMU runner for Leasebox: everything needed to boot the image under QEMU (TCG) from the host.
//!
//! - [`config`]: the QEMU command line for each boot path — `-kernel` (multiboot1 on SeaBIOS), the GRUB ISO on
//!   SeaBIOS, and the GRUB ISO on OVMF (UEFI) — with machine, CPU model, memory, CPU count and extra devices.
//! - [`firmware`]: where the OVMF code/vars pair lives, and the fresh per-run copy of the vars file.
//! - [`iso`]: `grub.cfg` for the hybrid BIOS/UEFI ISO and the `grub-mkrescue` call that builds it.
//! - [`process`]: spawning QEMU with a guard that kills and reaps it on every path, serial lines delivered
//!   through a channel so every wait has a deadline.
//! - [`model`]: the mlx5 model's fresh shared files (guest RAM and BAR) and its process, stopped with QEMU.
//! - [`exit`]: what QEMU's exit status means (`isa-debug-exit` encodes the guest's value as `(v << 1) | 1`).
//! - [`lifetime`]: children that never outlive the runner (stop signals caught and passed on, a death signal
//!   for the children when the runner is killed); the crate's only `unsafe` (system calls) is there.
#![deny(unsafe_code)]

pub mod config;
pub mod exit;
pub mod fake;
pub mod firmware;
pub mod iso;
pub mod lifetime;
pub mod model;
pub mod process;

pub use config::{Boot, HostFwd, HubSocket, Machine, ModelHub, ModelSlot, QemuConfig};
pub use exit::QemuExit;
pub use firmware::{Ovmf, ScratchFile};
pub use lifetime::StopSignals;
pub use model::{ModelCommand, ModelFiles, ModelProcess, ModelShm};
pub use process::{NextLine, QemuProcess, SerialLine, Stdio, Waited};
