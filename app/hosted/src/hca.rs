//! The hosted appliance's HCA: the device model on its own thread (with its RoCEv2 responder on UDP when
//! asked), the native driver brought up on it, the engines on a thread of their own, and the lease service
//! as the session core's backend — the image's wiring, with threads for cores.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_lease::backend::{Environment, LeaseBackend};
use leasebox_lease::setup::PlatformHost;
use leasebox_lease::{Config, LeaseOptions, LeaseService};
use leasebox_mlx5::cmdq::{Emergency, EmergencyOutcome};
use leasebox_mlx5::driver::{Config as DriverConfig, Driver};
use leasebox_mlx5::engine::Shared;
use leasebox_mlx5::log::SharedLog;
use leasebox_proto::{HcaState, HcaStats};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;

use crate::ServiceWake;
use crate::stages::Stages;

/// RAM beyond the lease pool: the firmware's init pages (~50 MiB), queues and QP buffers.
const RAM_EXTRA: usize = 160 << 20;

/// DMA and scrubbing through the hosted platform (the model's RAM).
pub type HostedHost = PlatformHost<HostedPlatform>;

/// The lease service's clock.
pub struct HostedEnv {
    start: Instant,
    /// How far the lease service's clock runs ahead of real time ([`HostedEnv::skip`]).
    ahead: Duration,
}

impl Environment for HostedEnv {
    fn now_us(&self) -> u64 {
        (self.start.elapsed() + self.ahead).as_micros() as u64
    }
}

/// What the hosted appliance knows of the HCA the model plays: its state, its command queue's counters and
/// its summary line (`crate::HostedAppliance` tells the session core).
pub struct ModelFacts {
    shared: Arc<Shared>,
    log: SharedLog,
    summary: String,
}

impl ModelFacts {
    pub fn state(&self) -> HcaState {
        if self.shared.fatal().is_some() { HcaState::Fatal } else { HcaState::Ok }
    }

    /// The driver's command log (opcode, outcome and time of the last commands).
    pub fn command_log(&self) -> &SharedLog {
        &self.log
    }

    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// HCA_STATS from the command log's totals.
    pub fn stats(&self) -> HcaStats {
        leasebox_lease::backend::hca_stats(self.state(), &self.log.lock().counters)
    }
}

impl HostedEnv {
    /// Moves the lease service's clock on by `d` at once (tests: a grace period or a TTL passes without
    /// waiting for it). The service's next pass runs every timer now due; the driver's clock is not moved.
    pub fn skip(&mut self, d: Duration) {
        self.ahead += d;
    }
}

pub type HostedBackend = LeaseBackend<HostedHost, HostedEnv>;

/// The engines' thread and what the test or benchmark may want to reach: the platform (the model, its
/// memories, fault injection) and the UDP address of its RoCEv2 responder.
pub struct HcaThreads {
    stop: Arc<AtomicBool>,
    engines: Option<JoinHandle<()>>,
    pub platform: Arc<HostedPlatform>,
    pub udp: Option<std::net::SocketAddr>,
    /// The fatal path's port-down command, prepared at bring-up as the image prepares it.
    emergency: Option<Emergency>,
}

/// What [`HcaThreads::fail_closed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailClosed {
    /// The port-down command's fate (`None`: none was prepared, a VF).
    pub port_down: Option<EmergencyOutcome>,
    /// Bus mastering cleared (false: the model runs in another process).
    pub bus_master_cleared: bool,
}

/// How long the fatal path waits for the port-down command (as the image: `image/src/hca.rs`).
pub const EMERGENCY_MS: u64 = 1_000;

impl HcaThreads {
    /// The image's fatal path, on the hosted rig (docs/revoke-semantics.md, "Fail closed on crash"): the
    /// port-down command from the emergency slot, bounded by [`EMERGENCY_MS`], then bus mastering cleared
    /// whatever it returned. The engines go on running, as the other cores do when one core panics.
    pub fn fail_closed(&self) -> FailClosed {
        let port_down = self.port_down();
        let bus_master_cleared = self.platform.set_bus_master(false);
        FailClosed { port_down, bus_master_cleared }
    }

    /// The fatal path's first step alone: posts the port-down command and waits for it (bounded).
    pub fn port_down(&self) -> Option<EmergencyOutcome> {
        self.emergency.map(|e| e.fire(self.platform.as_ref(), EMERGENCY_MS * 1_000_000))
    }
}

impl Drop for HcaThreads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.engines.take() {
            // It may be parked in an idle sleep.
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// How long bring-up waits for the link (the model trains for `mlx5_model::hca::DEFAULT_LINK_UP_DELAY`); a link
/// still down then is reported, not an error.
const LINK_WAIT_MS: u64 = 5_000;

/// Brings the model and the driver up and builds the lease backend and the HCA's facts. `udp`: where the model's RoCEv2 responder
/// listens (`None`: no data path); `timing`: firmware time per command; `service`: whom the engines wake after a
/// pass with work (the service thread, once it exists); `stages`: the stage clock.
pub(crate) fn start(
    o: &LeaseOptions,
    udp: Option<&str>,
    timing: mlx5_model::Timing,
    service: Arc<ServiceWake>,
    stages: Arc<Stages>,
) -> Result<(HostedBackend, HcaThreads, ModelFacts), String> {
    let responder = match udp {
        Some(a) => {
            let r =
                mlx5_model::roce::udp::UdpResponder::bind(a, Duration::ZERO).map_err(|e| format!("--udp {a}: {e}"))?;
            r.set_nonblocking(true).map_err(|e| e.to_string())?;
            Some(r)
        }
        None => None,
    };
    let udp_addr = responder.as_ref().and_then(|r| r.local_addr().ok());
    let model = ModelConfig { init_delay: Duration::ZERO, timing, ..ModelConfig::default() };
    let ram = (o.pool_mib as usize) * (1 << 20) + RAM_EXTRA;
    let platform = Arc::new(HostedPlatform::with_model_udp(model, ram, ModelMode::Thread, responder));
    // Bring-up waits (bounded) for the model's link training, as the image does (`image/src/hca.rs`).
    let dcfg = DriverConfig {
        part: "ConnectX-5",
        pre_init_timeout_ms: 5_000,
        link_wait_ms: LINK_WAIT_MS,
        ..DriverConfig::default()
    };
    let mut d = Driver::bring_up(platform.clone(), dcfg).map_err(|e| format!("HCA bring-up: {e}"))?;
    let parts = leasebox_lease::setup::prepare(&mut d, o, None)?;
    let emergency = d.prepare_port_down();
    let (cmd, ev, mut client, info) = d.into_engines();
    let log = cmd.queue().log_handle();
    let stop = Arc::new(AtomicBool::new(false));
    // Every engine pass that did work wakes the service thread, so the lease service takes a completion when it
    // lands rather than at its next tick (docs/latency.md).
    let after_work = move || {
        stages.engine_work();
        service.by_engine();
    };
    let engines =
        mlx5_hosted::spawn_engines_then(cmd, ev, &mut client, stop.clone(), after_work).map_err(|e| e.to_string())?;
    // Initial PSNs and MKEY variants from a CSPRNG seeded by the OS, as the nonces are; none without it.
    let rng = leasebox_lease::setup::identifiers(&mut crate::OsEntropy)?;
    let cfg = Config::from_options(o, &parts);
    if let Some(w) = leasebox_lease::setup::fence_test_warning(o) {
        eprintln!("leasebox-hosted: {w}");
    }
    let svc = LeaseService::new(cfg, parts.hca, rng).map_err(|e| format!("lease configuration: {e}"))?;
    let facts = ModelFacts {
        shared: client.shared_handle(),
        log,
        summary: format!("{} fw {} port {} (model in process)", info.part, info.fw, info.port),
    };
    let env = HostedEnv { start: Instant::now(), ahead: Duration::ZERO };
    let backend = LeaseBackend::new(svc, client, PlatformHost::new(platform.clone(), parts.extents), env);
    Ok((backend, HcaThreads { stop, engines: Some(engines), platform, udp: udp_addr, emergency }, facts))
}
