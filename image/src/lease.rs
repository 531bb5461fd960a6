//! The lease service in the image: its host (DMA and scrubbing through the kernel's mlx5 platform), its
//! environment (TSC clock, role counts, HCA health) and its construction from the command line's options.

use alloc::string::String;
use alloc::vec::Vec;

use leasebox_kernel::arch::hca::KernelHca;
use leasebox_kernel::lease_config::LeaseOptions;
use leasebox_kernel::time::Instant;
use leasebox_lease::backend::{Environment, LeaseBackend};
use leasebox_lease::setup::PlatformHost;
use leasebox_lease::{Config, LeaseService};
use leasebox_proto::HcaState;

/// DMA and scrubbing through the kernel's mlx5 platform.
pub type KernelHost = PlatformHost<KernelHca>;

pub struct KernelEnv;

impl Environment for KernelEnv {
    fn now_us(&self) -> u64 {
        Instant::now().since_boot().as_micros() as u64
    }
    fn role_counts(&self) -> Vec<(u16, u8, u64)> {
        crate::appliance::role_counts()
    }
    fn hca_health(&self) -> (HcaState, String) {
        crate::hca::health()
    }
}

pub type ImageBackend = LeaseBackend<KernelHost, KernelEnv>;

/// The backend, when the HCA is up and its client is still unclaimed.
pub fn backend(o: &LeaseOptions) -> Result<Option<ImageBackend>, String> {
    let Some((parts, platform)) = crate::hca::leases() else { return Ok(None) };
    let Some(client) = crate::hca::CLIENT.lock().take() else { return Ok(None) };
    let seed = leasebox_kernel::arch::rng::random_u64().unwrap_or(0x5eed);
    let cfg = Config::from_options(o, parts, seed);
    if let Some(w) = leasebox_lease::setup::fence_test_warning(o) {
        log::warn!("lease: {w}");
    }
    let svc = LeaseService::new(cfg, parts.hca).map_err(|e| alloc::format!("lease configuration: {e}"))?;
    Ok(Some(LeaseBackend::new(svc, client, PlatformHost(platform.clone()), KernelEnv)))
}
