//! The Leasebox client library (docs/client.md, docs/wire-protocol.md): what a program that borrows remote
//! memory links.
//!
//! - [`Client`] and [`Lease`]: connect to one or more appliances, allocate leases (placed by free bytes),
//!   read and write them by offset over RDMA, get [`Event`]s (a revoke, a broken connection); a thread per
//!   appliance heartbeats, renews and reconnects.
//! - [`region`] and [`batch`]: memory registered once ([`Client::register`], [`Region`]) and moved without a
//!   copy ([`Lease::write_from`], [`Lease::read_into`], scatter/gather), and asynchronous batches across leases
//!   with one result per operation ([`Client::submit`], [`Op`], [`Client::poll`], [`Client::wait`],
//!   [`Client::completion_fd`]); docs/client.md, "Zero copy and batches".
//! - [`connection`]: one control connection — TCP with deadlines, the protocol v2 HELLO and records, and
//!   request/answer calls ([`Connection`]).
//! - [`rdma`]: the RDMA requester that reads and writes a lease's memory: RC RDMA WRITE / READ in software over
//!   UDP ([`rdma::SoftRoce`]) or through rdma-core's verbs (feature `verbs`), behind one [`rdma::Requester`]
//!   trait.
//!
//! ```no_run
//! use leasebox_client::{AllocOptions, Appliance, Client, ClientConfig, Credentials, RequesterConfig};
//! use leasebox_client::rdma::SoftConfig;
//!
//! let who = Credentials { name: "demo".into(), key: leasebox_client::hex::decode("00112233445566778899aabbccddeeff")? };
//! let appliance = Appliance {
//!     addr: "127.0.0.1:7470".into(),
//!     credentials: who,
//!     requester: RequesterConfig::Soft(SoftConfig::default()),
//! };
//! let client = Client::connect(ClientConfig::new(vec![appliance]))?;
//! let mut lease = client.alloc(64 << 20, AllocOptions::default())?;
//! lease.write(4096, b"hello")?;
//! let mut back = [0u8; 5];
//! lease.read(4096, &mut back)?;
//! assert_eq!(&back, b"hello");
//! lease.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// No unsafe code, except the verbs backend's FFI to libibverbs (`rdma::verbs`, feature `verbs`).
#![deny(unsafe_code)]

pub mod batch;
pub mod client;
pub mod connection;
mod engine;
pub mod error;
pub mod event;
pub mod fleet;
pub mod hex;
pub mod lease;
pub mod placement;
pub mod rdma;
pub mod region;
mod session;
pub mod setup;
pub mod store;

pub use batch::{Completed, Op, Ticket, Wait};
pub use client::{AllocOptions, Appliance, Client, ClientConfig, REQUESTER_SPECS, RequesterConfig};
pub use connection::Client as Connection;
pub use connection::{Answer, ClientError, Credentials, DEFAULT_PORT, Timeouts, Welcome};
pub use engine::{DEFAULT_QUEUE_DEPTH, MAX_QUEUE_DEPTH};
pub use error::Error;
pub use event::{Callback, Event};
pub use fleet::{FleetConfig, FleetMember};
pub use lease::Lease;
/// TLS and authentication to etcd ([`FleetConfig::etcd_tls`], [`FleetConfig::etcd_user`]).
pub use leasebox_fleet::{EtcdUser, TlsFiles};
pub use leasebox_proto::{LeaseId, Outcome};
/// A verbs device's configuration ([`RequesterConfig::Verbs`]).
#[cfg(feature = "verbs")]
pub use rdma::verbs::VerbsConfig;
pub use region::Region;
pub use store::{Store, StoreConfig, StoreEvent, StoreOptions};
