//! Control sessions, sans-I/O: bytes in, bytes out. The appliance drives a [`Server`] from its smoltcp loop;
//! the hosted appliance drives the same code from std TCP; tests drive it directly.
//!
//! A connection goes AwaitHello → Challenged → Authenticated (docs/wire-protocol.md, "Sessions"). Lease
//! operations and diagnostics are handed to a [`Backend`]; until the lease service exists, the default backend
//! answers lease operations with `NOT_IMPLEMENTED`.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

mod backend;
mod keyring;
mod server;

pub use backend::{Answer, Backend, CloseReason, NoLeases, Principal, Ticket};
pub use keyring::{KeyError, Keyring, parse_hex};
pub use server::{ConnId, Entropy, EntropyError, Limits, Server, StartError};

#[cfg(test)]
mod tests;
