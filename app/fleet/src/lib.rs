//! The fleet's shared parts (docs/fleet.md): what the registrar writes to etcd, what clients and `leasectl fleet`
//! read from it, and how they all speak to etcd.
//!
//! - [`etcd`]: a small blocking client for etcd's JSON gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch`,
//!   `/v3/election/*`) over HTTP/1.1, plain or TLS ([`tls`]: rustls, with client certificates): no gRPC, no
//!   protoc.
//! - [`advert`]: the advertisement `/leasebox/v1/appliances/<boot id>` and its JSON.
//! - [`local`]: an etcd server on loopback with a temporary data directory, for tests and benchmarks.
//!
//! Nothing here is linked into the appliance: etcd holds advertisements, the appliance stays the only authority
//! over its leases.
#![forbid(unsafe_code)]

pub mod advert;
pub mod base64;
pub mod etcd;
mod http;
pub mod local;
pub mod tls;

pub use advert::{Advertisement, PREFIX};
pub use etcd::{Etcd, EtcdError, EtcdUser, WatchEvent};
pub use tls::TlsFiles;
