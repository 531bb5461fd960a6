//! The lease service behind the control channel: `leasebox_session::Leases` over [`LeaseService`], the
//! mlx5 engines' [`Client`] and a [`Host`]. Lease requests that wait on the HCA answer later; every call from
//! the session core also moves commands and results ([`Link::step`]), so the service progresses whenever the
//! network loop runs. The image (core 0) and the hosted appliance use it alike.

use alloc::string::String;
use alloc::vec::Vec;

use leasebox_mlx5::engine::Client;
use leasebox_mlx5::log::Counters;
use leasebox_proto::{BOOT_ID_LEN, FencedSlot, HcaState, HcaStats, LeaseStats, Notice, Reply, Request, Role};
use leasebox_session::{Answer, CloseReason, LeaseHealth, Leases, Principal, Ticket};

use crate::link::Link;
use crate::service::{Host, LeaseService, Who};

/// HCA_STATS from the command log's totals (docs/wire-protocol.md, "HCA_STATS").
pub fn hca_stats(hca: HcaState, c: &Counters) -> HcaStats {
    HcaStats {
        hca,
        submitted: c.submitted,
        ok: c.ok,
        failed: c.failed,
        timeout: c.timeouts,
        late: c.late,
        aborted: c.aborted,
    }
}

/// What the host tells the backend: its clock, and the hooks it watches. (What the host knows of its HCA and
/// cores goes to the session core directly, through `leasebox_session::Appliance`.)
pub trait Environment {
    /// Monotonic microseconds.
    fn now_us(&self) -> u64;
    /// Every lease request as it arrives, before the service sees it. The image's `test=panic-after-lease`
    /// panics here (docs/revoke-semantics.md, "Fail closed on crash"); nothing else looks.
    fn request_seen(&mut self, _req: &Request) {}
    /// After every tick: the pool's size and how much of it is still being prepared after boot (the image
    /// shows them on its ready line).
    fn pool_progress(&mut self, _total_bytes: u64, _unprepared_bytes: u64) {}
}

pub struct LeaseBackend<H: Host, E: Environment> {
    pub svc: LeaseService<Ticket>,
    pub link: Link,
    pub client: Client,
    pub host: H,
    pub env: E,
}

fn who(p: &Principal) -> Who<'_> {
    Who { session: p.session_id, tenant: &p.name, admin: p.role == Role::Admin }
}

impl<H: Host, E: Environment> LeaseBackend<H, E> {
    pub fn new(svc: LeaseService<Ticket>, client: Client, host: H, env: E) -> Self {
        LeaseBackend { svc, link: Link::new(), client, host, env }
    }

    /// Moves commands and results, runs the service's timers.
    pub fn pump(&mut self) -> bool {
        let now = self.env.now_us();
        self.link.step(&mut self.svc, &mut self.client, now, &mut self.host)
    }
}

impl<H: Host, E: Environment> Leases for LeaseBackend<H, E> {
    fn lease_op(&mut self, p: &Principal, req: &Request, ticket: Ticket, _now_ms: u64) -> Answer {
        self.env.request_seen(req);
        let now = self.env.now_us();
        let r = self.svc.request(who(p), req, ticket, now, &mut self.host);
        self.pump();
        match r {
            Some(reply) => Answer::Now(reply),
            None => Answer::Later,
        }
    }

    /// The session core asks right after `input` and `tick`, both of which have just pumped.
    fn take_answers(&mut self, out: &mut Vec<(Ticket, Reply)>) {
        self.svc.take_answers(out);
    }

    fn boot(&mut self, boot_id: [u8; BOOT_ID_LEN]) {
        self.svc.set_boot_id(boot_id);
    }

    fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        self.svc.take_notices(out);
    }

    fn resume(&mut self, from: &Principal, to: &Principal, _now_ms: u64) -> u32 {
        let n = self.svc.resume(from.session_id, to.session_id, &to.name);
        log::info!("lease: session {} ({}) resumed session {}: {n} lease(s)", to.session_id, to.name, from.session_id);
        n as u32
    }

    fn session_started(&mut self, p: &Principal, _now_ms: u64) {
        let n = self.svc.session_started(p.session_id, &p.name);
        if n > 0 {
            log::info!("lease: session {} ({}) resumed {n} lease(s)", p.session_id, p.name);
        }
    }

    fn session_alive(&mut self, p: &Principal, _now_ms: u64) {
        let now = self.env.now_us();
        self.svc.session_alive(p.session_id, now);
    }

    fn tick(&mut self, _now_ms: u64) {
        self.pump();
        let now = self.env.now_us();
        self.svc.scrub(now, &mut self.host);
        let pool = self.svc.pool();
        self.env.pool_progress(pool.total_bytes(), pool.unprepared_bytes());
    }

    fn lease_stats(&mut self) -> LeaseStats {
        let c = &self.svc.counters;
        LeaseStats {
            by_state: self.svc.by_state(),
            bytes_leased: self.svc.bytes_leased(),
            bytes_free: self.svc.pool().free_bytes(),
            fenced_slots: self.svc.fenced_count(),
            allocs: c.allocs,
            revokes: c.revokes,
            expiries: c.expiries,
            reconnects: c.reconnects,
            alloc_us: c.alloc_us.clone(),
            revoke_us: c.revoke_us.clone(),
            pool_bytes: self.svc.pool().total_bytes(),
            bytes_scrubbing: self.svc.pool().scrubbing_bytes(),
        }
    }

    fn tenant_lease_stats(&mut self, p: &Principal) -> LeaseStats {
        let (by_state, bytes_leased, bytes_free) = self.svc.tenant_figures(&p.name);
        LeaseStats { by_state, bytes_leased, bytes_free, ..LeaseStats::default() }
    }

    fn fenced(&mut self, p: &Principal, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>) {
        self.svc.fenced(who(p), cursor, max)
    }

    fn lease_log(&mut self, cursor: u64, max: u16) -> Option<(u64, u64, Vec<leasebox_proto::Transition>)> {
        let max = usize::from(max).clamp(1, leasebox_proto::MAX_PAGE);
        let mut records = Vec::with_capacity(max);
        let (next, lost) = self.svc.transitions().lock().read(cursor, max, |t| records.push(*t));
        Some((next, lost, records))
    }

    /// HEALTH's lease part; the status rule and the message's shape are the session core's
    /// (`leasebox_session::health`). `detail` is this service's own phrase: which grant and revoke paths it uses.
    fn health_facts(&mut self) -> LeaseHealth {
        let detail = self.svc.paths().brief();
        LeaseHealth::On { by_state: self.svc.by_state(), fenced: self.svc.fenced_count(), detail }
    }

    /// Commands at the HCA or waiting for room in its ring, memory being scrubbed or prepared.
    fn busy(&self) -> bool {
        let pool = self.svc.pool();
        self.svc.in_flight() > 0 || self.svc.has_commands() || pool.scrubbing_bytes() > 0 || pool.unprepared_bytes() > 0
    }

    fn session_lost(&mut self, p: &Principal, reason: CloseReason, _now_ms: u64) {
        log::info!("lease: session {} ({}) ended: {reason:?}", p.session_id, p.name);
        let now = self.env.now_us();
        self.svc.session_lost(p.session_id, now);
    }
}
