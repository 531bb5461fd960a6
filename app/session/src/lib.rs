//! Control sessions, sans-I/O: bytes in, bytes out. The appliance drives a [`Server`] from its smoltcp loop;
//! the hosted appliance drives the same code from std TCP; tests drive it directly.
//!
//! A connection goes AwaitHello → Authenticated through protocol v2's Noise handshake, after which every byte
//! travels in authenticated records (docs/wire-protocol.md, "Sessions"). The server stands on two interfaces:
//! [`Leases`], the lease service (lease operations and the session events it follows; [`NoLeases`] when it is
//! off, whose lease operations answer `NOT_IMPLEMENTED` with the reason), and [`Appliance`], what the host
//! knows of itself (roles, its HCA, entropy). HEALTH is made of both by one rule ([`health()`]). The session's
//! options (principals, keys, budgets) are parsed here too ([`options`]), for whichever host boots it.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod admission;
mod backend;
mod health;
mod keyring;
pub mod options;
mod rng;
pub mod scale;
mod server;

pub use admission::{Budget, HeapUse, MemoryGauge, Rate, Refusal, Source};
pub use backend::{Answer, Appliance, CloseReason, ConnId, Leases, NoLeases, Principal, Ticket};
pub use health::{LeaseHealth, health};
pub use keyring::{ADMIN_NAME, KeyError, Keyring, parse_hex, weak_key};
pub use options::SessionOptions;
pub use rng::IdRng;
pub use server::{Entropy, EntropyError, Limits, SESSION_HEAP_BYTES, SESSION_IDLE_HEAP_BYTES, Server, StartError};

#[cfg(test)]
mod tests;
