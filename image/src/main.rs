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

/// The session core's options (`tenant=`, `admin=`, `sessions=`, ...: `leasebox_session::options`), filled in
/// by the kernel's configuration parser.
#[cfg(target_os = "none")]
static SESSION_OPTIONS: leasebox_kernel::config::Options<'static, leasebox_session::SessionOptions<'static>> =
    leasebox_kernel::config::Options::checked(
        leasebox_session::SessionOptions::DEFAULT,
        leasebox_session::SessionOptions::apply,
        leasebox_session::SessionOptions::check,
    );

/// The parsers for the keys the kernel does not know, asked in this order: the session core's, the lease
/// service's.
#[cfg(target_os = "none")]
static PARSERS: [&dyn leasebox_kernel::config::OptionParser<'static>; 2] = [&SESSION_OPTIONS, &lease::OPTIONS];

/// The kernel asks for the image's option parsers before it reads the configuration.
#[cfg(target_os = "none")]
#[unsafe(no_mangle)]
fn leasebox_options() -> &'static [&'static dyn leasebox_kernel::config::OptionParser<'static>] {
    &PARSERS
}

/// Host builds (workspace-wide `cargo test`/`clippy`) get this stub: the image only runs on bare metal.
#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("leasebox: build with `cargo xtask image` (target x86_64-unknown-none)");
    std::process::exit(2);
}
