//! The Leasebox image: the kernel brings the machine up and calls [`leasebox_main`] on the bootstrap
//! processor; this file wires the cores to their roles (`cores=`, docs/operations.md), prints the ready line
//! and runs core 0's roles.
//!
//! Roles are idle loops for now that count their iterations; the network stack, the lease service and the
//! mlx5 engines take their places in later work.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
mod appliance;

/// Host builds (workspace-wide `cargo test`/`clippy`) get this stub: the image only runs on bare metal.
#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("leasebox: build with `cargo xtask image` (target x86_64-unknown-none)");
    std::process::exit(2);
}
