//! The Leasebox client library (docs/wire-protocol.md): what a program that borrows remote memory links.
//!
//! - [`connection`]: one control connection — TCP with deadlines, the protocol v2 HELLO and records, and
//!   request/answer calls ([`Connection`]).
//! - [`rdma`]: the RDMA requester that reads and writes a lease's memory: RC RDMA WRITE / READ in software over
//!   UDP ([`rdma::SoftRoce`]) or through rdma-core's verbs (feature `verbs`), behind one [`rdma::Requester`]
//!   trait.
//!
//! ```no_run
//! use leasebox_client::{Connection, Credentials, Timeouts};
//! use leasebox_proto::{Request, Response};
//!
//! let who = Credentials { name: "demo".into(), key: leasebox_client::hex::decode("00112233445566778899aabbccddeeff")? };
//! let (mut c, welcome) = Connection::connect_and_hello("127.0.0.1:7470", &who, Timeouts::default())?;
//! println!("session {} with {} credits", welcome.session_id, welcome.credits);
//! if let Response::Heartbeat { uptime_ms, .. } = c.call(&Request::Heartbeat { echo: 1 })? {
//!     println!("server up for {uptime_ms} ms");
//! }
//! c.bye()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// No unsafe code, except the verbs backend's FFI to libibverbs (`rdma::verbs`, feature `verbs`).
#![deny(unsafe_code)]

pub mod connection;
pub mod hex;
pub mod rdma;

pub use connection::{Answer, Client as Connection, ClientError, Credentials, DEFAULT_PORT, Timeouts, Welcome};
