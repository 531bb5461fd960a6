//! The Leasebox control client (docs/wire-protocol.md): a library for programs that talk to an appliance, and
//! the `leasectl` command built on it.
//!
//! ```no_run
//! use leasectl::{Client, Credentials, Timeouts};
//! use leasebox_proto::{Request, Response};
//!
//! let who = Credentials { name: "demo".into(), key: leasectl::hex::decode("00112233445566778899aabbccddeeff")? };
//! let (mut c, welcome) = Client::connect_and_hello("127.0.0.1:7470", &who, Timeouts::default())?;
//! println!("session {} with {} credits", welcome.session_id, welcome.credits);
//! if let Response::Heartbeat { uptime_ms, .. } = c.call(&Request::Heartbeat { echo: 1 })? {
//!     println!("server up for {uptime_ms} ms");
//! }
//! c.bye()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// No unsafe code, except the verbs backend's FFI to libibverbs (`rdma::verbs`, feature `verbs`).
#![deny(unsafe_code)]

pub mod args;
pub mod cli;
pub mod client;
pub mod config;
pub mod hex;
pub mod rdma;
pub mod render;
pub mod verify;

pub use client::{Answer, Client, ClientError, Credentials, DEFAULT_PORT, Timeouts, Welcome};
pub use config::FileConfig;
