//! `leasebox-registrar`: the Linux daemon between appliances and etcd (docs/fleet.md).
//!
//! - [`config`]: which appliances (control address, admin key, RDMA address, labels) and which etcd.
//! - [`poll`]: one thread per appliance asks STATS and HEALTH over the control protocol every poll period.
//! - [`publish`]: the leader (etcd's election API) writes each answering appliance's advertisement under an etcd
//!   lease it keeps alive while the appliance answers; a registrar that cannot reach etcd retries with backoff.
//! - [`metrics`]: the Prometheus text exposition of every appliance's last answer, on `/metrics`.
//!
//! Nothing in an appliance depends on this: it only answers the control protocol.
#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
pub mod poll;
pub mod publish;

pub use config::{ApplianceSpec, Config};
pub use publish::Registrar;
