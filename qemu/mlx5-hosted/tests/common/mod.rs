//! Hosted harness for the driver's integration tests: a fresh in-process model (stepped from `relax`, so
//! every run is deterministic) and a driver brought up on it.
#![allow(dead_code)]

use std::sync::Arc;

use leasebox_mlx5::driver::{Config, Driver};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;

pub type Hosted = Driver<HostedPlatform>;

/// RAM for the hosted model: init pages (~50 MiB with the model's defaults) plus room for queues and leases.
pub const RAM_BYTES: usize = 128 << 20;

/// The link up at once (no training): tests of link training set `link_up_delay` themselves.
pub fn model_config() -> ModelConfig {
    ModelConfig::instant()
}

pub fn driver_config() -> Config {
    Config { part: "ConnectX-5", pre_init_timeout_ms: 2_000, cmd_timeout_ms: Some(2_000), ..Config::default() }
}

pub fn platform(cfg: ModelConfig) -> Arc<HostedPlatform> {
    Arc::new(HostedPlatform::with_model(cfg, RAM_BYTES, ModelMode::InProcess))
}

/// A driver brought up on a fresh model with the defaults.
pub fn up() -> Hosted {
    up_with(model_config(), driver_config())
}

pub fn up_with(model: ModelConfig, cfg: Config) -> Hosted {
    match Driver::bring_up(platform(model), cfg) {
        Ok(d) => d,
        Err(e) => panic!("bring-up failed: {e}"),
    }
}
