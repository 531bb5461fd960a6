//! A lease service on the native driver over the in-process model (stepped from `relax`, deterministic),
//! with a synchronous `call` for tests. Time is virtual: the platform's clock moves [`STEP`] per `relax` (one
//! per [`Rig::pump`], more while the driver waits), the service reads the same clock, and every limit below is
//! in that time — so a deadline is met or missed after a fixed number of passes, however busy the machine.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasebox_lease::link::Link;
use leasebox_lease::setup::LEASE_GID_INDEX;
use leasebox_lease::setup::PlatformHost;
use leasebox_lease::{Config, HcaCtx, LeaseService, Who, port_ib_mtu};
use leasebox_mlx5::driver::{Config as DriverConfig, Driver};
use leasebox_mlx5::platform::Platform;
use leasebox_proto::{AllocReq, AllocResp, LeaseId, Outcome, Reply, Request, Response, access};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;
use mlx5_model::mem::Memory;

pub const RAM: usize = 512 << 20;
/// The driver's command timeout: a hung HCA command fails after this (the revoke deadline is shorter).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests [`Rig::pipelined`] keeps waiting at once.
pub const PIPELINE_DEPTH: usize = 64;
/// Virtual time one `relax` (so one [`Rig::pump`]) takes: a tenth of the service's deadline scan interval.
pub const STEP: Duration = Duration::from_micros(100);

pub struct Rig {
    pub d: Driver<HostedPlatform>,
    pub svc: LeaseService<u64>,
    pub host: PlatformHost<HostedPlatform>,
    pub link: Link,
    next_ticket: u64,
    pub answers: HashMap<u64, Reply>,
    pub pool_base: u64,
}

/// The driver's health watch interval here: a day of virtual time (off, in effect).
const HEALTH_OFF_MS: u64 = 24 * 3600 * 1000;

pub const TENANT: Who<'static> = Who { session: 1, tenant: "alpha", admin: false };
pub const OTHER: Who<'static> = Who { session: 2, tenant: "beta", admin: false };
pub const ADMIN: Who<'static> = Who { session: 3, tenant: "admin", admin: true };

/// No firmware time: the rig runs on the virtual clock, and the model's timers are real time, so a command
/// held for real milliseconds would meet driver deadlines that virtual time has already passed
/// (docs/hca-model.md, "Command timing and doorbells").
pub fn model() -> ModelConfig {
    ModelConfig::instant()
}

pub fn config() -> Config {
    Config { grace_ms: 50, ..Config::default() }
}

impl Rig {
    pub fn new() -> Rig {
        Rig::with(model(), config(), 64 << 20)
    }

    /// As [`Rig::new`] with `cfg`, over an 8 MiB pool.
    pub fn configured(cfg: Config) -> Rig {
        Rig::with(model(), cfg, 8 << 20)
    }

    /// A driver on a fresh model, a CQ for the lease QPs (watched by the event engine), a pool of
    /// `pool_bytes` and the service.
    pub fn with(model: ModelConfig, cfg: Config, pool_bytes: u64) -> Rig {
        Rig::with_paths(model, cfg, pool_bytes, false)
    }

    /// As [`Rig::with`]; `umr` gives the engine a UMR QP as the appliance's set-up does
    /// (`setup::umr_path`), so leases take the UMR path where the model's caps allow it.
    pub fn with_paths(model: ModelConfig, mut cfg: Config, pool_bytes: u64, umr: bool) -> Rig {
        assert_eq!(
            model.timing,
            mlx5_model::Timing::Zero,
            "a rig on the virtual clock needs a model without firmware time"
        );
        let p = Arc::new(HostedPlatform::with_model(model, RAM, ModelMode::InProcess));
        p.clock().go_virtual(STEP);
        let dcfg = DriverConfig {
            part: "ConnectX-5",
            pre_init_timeout_ms: 2000,
            cmd_timeout_ms: Some(CMD_TIMEOUT.as_millis() as u64),
            // The model's health counter ticks in real time, far slower than this virtual clock runs: the watch
            // would see it stuck. The driver's own tests cover the health watch.
            health_interval_ms: HEALTH_OFF_MS,
            ..DriverConfig::default()
        };
        let mut d = Driver::bring_up(p.clone(), dcfg).unwrap_or_else(|e| panic!("bring-up: {e}"));
        let cq = d.create_cq(10).unwrap();
        let cqn = cq.cqn;
        d.events.watch_cq(cq.cqn, cq.ring);
        let pool = p.dma_alloc(pool_bytes as usize, cfg.extent as usize).expect("pool memory");
        let pool_base = pool.addr();
        cfg.pool = std::iter::once(pool_base..pool_base + pool_bytes).collect();
        // RoCE on the port and the appliance's GID, written as the lease set-up writes it.
        let gid = d.roce_gid(LEASE_GID_INDEX.into(), [192, 0, 2, 1]).unwrap_or_else(|e| panic!("RoCE set-up: {e}"));
        let hca = HcaCtx {
            uar: d.info.uar,
            cqn,
            gid,
            gid_index: LEASE_GID_INDEX,
            mac: d.info.mac,
            port_mtu: port_ib_mtu(d.info.mtu),
            qp: d.info.qp,
            umr: if umr { leasebox_lease::setup::umr_path(&mut d) } else { leasebox_lease::service::UmrCtx::OFF },
        };
        let svc = LeaseService::new(cfg, hca, leasebox_session::IdRng::from_seed([0x5e; 32])).unwrap();
        Rig {
            d,
            svc,
            host: PlatformHost::new(p, vec![pool]),
            link: Link::new(),
            next_ticket: 1,
            answers: HashMap::new(),
            pool_base,
        }
    }

    /// The platform's (virtual) clock in microseconds: what the service is told.
    pub fn now_us(&self) -> u64 {
        self.host.0.now_ns() / 1_000
    }

    /// Virtual time since `t0_us`.
    pub fn since(&self, t0_us: u64) -> Duration {
        Duration::from_micros(self.now_us().saturating_sub(t0_us))
    }

    pub fn platform(&self) -> Arc<HostedPlatform> {
        self.host.0.clone()
    }

    /// One round: link, engines, the model.
    pub fn pump(&mut self) {
        let now = self.now_us();
        self.link.step(&mut self.svc, &mut self.d.client, now, &mut self.host);
        self.svc.scrub(now, &mut self.host);
        self.d.pump();
        self.host.0.relax();
        let mut out = Vec::new();
        self.svc.take_answers(&mut out);
        for (t, r) in out {
            self.answers.insert(t, r);
        }
    }

    /// Pumps until `cond` or until `limit` of virtual time has passed.
    pub fn pump_until(&mut self, limit: Duration, mut cond: impl FnMut(&mut Rig) -> bool) -> bool {
        let t0 = self.now_us();
        while self.since(t0) < limit {
            if cond(self) {
                return true;
            }
            self.pump();
        }
        cond(self)
    }

    /// Sends a request; returns its ticket and the immediate answer, if any.
    pub fn send(&mut self, who: Who<'_>, req: &Request) -> (u64, Option<Reply>) {
        let t = self.next_ticket;
        self.next_ticket += 1;
        let now = self.now_us();
        (t, self.svc.request(who, req, t, now, &mut self.host))
    }

    /// Lets `d` of virtual time pass with the service running (timers, the sweep).
    pub fn pass(&mut self, d: Duration) {
        self.pump_until(d, |_| false);
    }

    pub fn wait(&mut self, ticket: u64, limit: Duration) -> Reply {
        assert!(
            self.pump_until(limit, |r| r.answers.contains_key(&ticket)),
            "no answer for ticket {ticket} within {limit:?}"
        );
        self.answers.remove(&ticket).unwrap()
    }

    /// Sends `reqs` (each answered later, through the HCA) with up to [`PIPELINE_DEPTH`] waiting; `each` gets
    /// every answer in request order.
    pub fn pipelined(&mut self, who: Who<'_>, reqs: impl IntoIterator<Item = Request>, mut each: impl FnMut(Reply)) {
        let mut pending = std::collections::VecDeque::new();
        for req in reqs {
            let (t, now) = self.send(who, &req);
            assert!(now.is_none(), "{req:?} answered at once: {now:?}");
            pending.push_back(t);
            if pending.len() > PIPELINE_DEPTH {
                let t = pending.pop_front().unwrap();
                each(self.wait(t, Duration::from_secs(10)));
            }
        }
        for t in pending {
            each(self.wait(t, Duration::from_secs(10)));
        }
    }

    pub fn call(&mut self, who: Who<'_>, req: &Request) -> Reply {
        match self.send(who, req) {
            (_, Some(r)) => r,
            (t, None) => self.wait(t, Duration::from_secs(5)),
        }
    }

    pub fn alloc(&mut self, who: Who<'_>, size: u64) -> AllocResp {
        match self.call(who, &Request::Alloc(alloc_req(size, 0x1234))) {
            Ok(Response::Alloc(a)) => a,
            other => panic!("ALLOC: {other:?}"),
        }
    }

    pub fn ready(&mut self, who: Who<'_>, a: &AllocResp) {
        let r = self.call(who, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn });
        assert!(matches!(r, Ok(Response::Ready { .. })), "{r:?}");
    }

    pub fn revoke(&mut self, who: Who<'_>, lease: LeaseId) -> Outcome {
        match self.call(who, &Request::Revoke { lease, qp_first: false }) {
            Ok(Response::Revoke { outcome, .. }) => outcome,
            other => panic!("REVOKE: {other:?}"),
        }
    }

    /// Pumps until the sweep has run for every revoked lease (no lease left pending) and its memory is cleared.
    pub fn settle(&mut self) {
        assert!(
            self.pump_until(Duration::from_secs(20), |r| {
                let s = r.svc.by_state();
                s[0] + s[1] + s[2] + s[3] == 0 && r.svc.in_flight() == 0 && r.svc.pool().scrubbing_bytes() == 0
            }),
            "leases still live: {:?}",
            self.svc.by_state()
        );
    }

    pub fn ram(&self) -> Arc<dyn Memory> {
        self.host.0.ram().clone()
    }
}

pub fn alloc_req(size: u64, qpn: u32) -> AllocReq {
    AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: qpn,
        client_psn: 0x100,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
        client_mac: [0x02, 0, 0, 0, 0, 0x02],
    }
}
