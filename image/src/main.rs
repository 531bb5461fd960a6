//! The Leasebox image: the kernel brings the machine up and calls `leasebox_main` on the bootstrap
//! processor; `appliance` wires the cores to their roles (`cores=`, docs/operations.md), prints the ready line
//! and runs core 0's roles.
//!
//! The `net` role runs the control channel (`net`: smoltcp over virtio-net) with a byte-stream service behind
//! the control port (`service`): the session core, in `control`, over the lease service (`lease`). The `cmd`
//! and `event` roles run the mlx5 driver's command and event engines (`hca`).
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
extern crate alloc;

#[cfg(target_os = "none")]
mod appliance;
#[cfg(target_os = "none")]
mod control;
#[cfg(target_os = "none")]
mod eth;
#[cfg(target_os = "none")]
mod hca;
#[cfg(target_os = "none")]
mod hca_platform;
#[cfg(target_os = "none")]
mod lease;
#[cfg(target_os = "none")]
mod net;
#[cfg(target_os = "none")]
mod service;

/// Host builds (workspace-wide `cargo test`/`clippy`) get this stub: the image only runs on bare metal.
#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("leasebox: build with `cargo xtask image` (target x86_64-unknown-none)");
    std::process::exit(2);
}
