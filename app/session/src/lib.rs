//! Control sessions, sans-I/O: bytes in, bytes out. The appliance drives a [`Server`] from its smoltcp loop;
//! the hosted appliance drives the same code from std TCP; tests drive it directly.
//!
//! A connection goes AwaitHello → Authenticated through protocol v2's Noise handshake, after which every byte
//! travels in authenticated records (docs/wire-protocol.md, "Sessions"). Lease
//! operations and diagnostics are handed to a [`Backend`]: the lease service, or [`NoLeases`] when it is off
//! (lease operations answer `NOT_IMPLEMENTED` with the reason).
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod admission;
mod backend;
mod keyring;
mod rng;
pub mod scale;
mod server;

pub use admission::{Budget, HeapUse, MemoryGauge, Rate, Refusal, Source};
pub use backend::{Answer, Backend, CloseReason, ConnId, NoLeases, Principal, Ticket};
pub use keyring::{ADMIN_NAME, KeyError, Keyring, parse_hex, weak_key};
pub use rng::IdRng;
pub use server::{Entropy, EntropyError, Limits, SESSION_HEAP_BYTES, SESSION_IDLE_HEAP_BYTES, Server, StartError};

#[cfg(test)]
mod tests;
