//! `leasebox-lease`: the lease service (docs/architecture.md "Lease life cycle"; revocation: docs/revoke-semantics.md).
//! A sans-I/O state machine over the mlx5 driver's command builders: requests and HCA results in, answers and
//! HCA commands out; the image and the hosted appliance only move them.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![allow(clippy::result_large_err)]

extern crate alloc;

pub mod backend;
pub mod config;
pub mod lease;
pub mod link;
pub mod options;
pub mod pool;
pub mod service;
pub mod setup;
pub mod stats;
pub mod transitions;

pub use config::{Config, RevokeOrder};
pub use options::LeaseOptions;
pub use service::{HcaCtx, Host, LeaseService, Paths, UmrCtx, Who, port_ib_mtu};
