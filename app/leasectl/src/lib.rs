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
#![forbid(unsafe_code)]

pub mod args;
pub mod bench_data;
pub mod cli;
pub mod config;
pub mod fleet;
pub mod render;
pub mod verify;

// The connection, hex keys and the RDMA requester live in the client library (`app/client`); leasectl is one
// of its users and keeps their old paths.
pub use leasebox_client::connection as client;
pub use leasebox_client::{hex, rdma};

pub use client::{Answer, Client, ClientError, Credentials, DEFAULT_PORT, Timeouts, Welcome};
pub use config::FileConfig;
