//! The lease service in the image: its host (DMA and scrubbing through the kernel's mlx5 platform), its
//! environment (TSC clock, role counts, HCA health) and its construction from the command line's options.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use leasebox_kernel::arch::hca::KernelHca;
use leasebox_kernel::lease_config::{LeaseOptions, RevokeOrder as Order};
use leasebox_kernel::time::Instant;
use leasebox_lease::backend::{Environment, LeaseBackend};
use leasebox_lease::{Config, Host, LeaseService, RevokeOrder};
use leasebox_mlx5::platform::Platform as _;
use leasebox_proto::HcaState;

pub struct KernelHost(pub Arc<KernelHca>);

impl Host for KernelHost {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<u64> {
        self.0.dma_alloc(len, align)
    }
    fn dma_free(&mut self, addr: u64, len: usize) {
        self.0.dma_free(addr, len)
    }
    fn zero(&mut self, addr: u64, len: u64) {
        let z = [0u8; 4096];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(z.len() as u64) as usize;
            self.0.dma_write(addr + at, &z[..n]);
            at += n as u64;
        }
    }
}

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

/// The service's configuration from the command line's lease options and the pool bring-up set aside.
pub fn config(o: &LeaseOptions, pool_base: u64, pool_bytes: u64) -> Config {
    Config {
        pool_base,
        pool_bytes,
        slots: o.slots,
        tenant_leases: o.tenant_leases,
        default_ttl_ms: o.ttl_ms,
        max_ttl_ms: o.ttl_ms.max(3_600_000),
        ready_timeout_ms: u64::from(o.ready_ms),
        grace_ms: u64::from(o.grace_ms),
        session_grace_ms: u64::from(o.session_grace_ms),
        heartbeat_renews: o.heartbeat_renews,
        order: match o.order {
            Order::MkeyFirst => RevokeOrder::MkeyFirst,
            Order::QpFirst => RevokeOrder::QpFirst,
        },
        flow_drop: o.flow_drop,
        fence_test: o.fence_test,
        psn_seed: leasebox_kernel::arch::rng::random_u64().unwrap_or(0x5eed) | 1,
        ..Config::default()
    }
}

/// The backend, when the HCA is up and its client is still unclaimed.
pub fn backend(o: &LeaseOptions) -> Result<Option<ImageBackend>, String> {
    let Some((parts, platform)) = crate::hca::leases() else { return Ok(None) };
    let Some(client) = crate::hca::CLIENT.lock().take() else { return Ok(None) };
    let cfg = config(o, parts.pool_base, parts.pool_bytes);
    if o.fence_test && !cfg!(feature = "fence-test") {
        log::warn!("lease: fence_test=on is ignored: this image was built without the `fence-test` feature");
    }
    let svc = LeaseService::new(cfg, parts.hca).map_err(|e| alloc::format!("lease configuration: {e}"))?;
    Ok(Some(LeaseBackend::new(svc, client, KernelHost(platform.clone()), KernelEnv)))
}
