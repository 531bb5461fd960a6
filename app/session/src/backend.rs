//! The session core's two interfaces: the lease service ([`Leases`]: lease operations and the session events it
//! follows) and the appliance ([`Appliance`]: what it knows of itself), and the types they share.

use crate::health::LeaseHealth;
use crate::server::Entropy;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use leasebox_proto::{
    BOOT_ID_LEN, ErrorBody, ErrorCode, FencedSlot, HcaState, HcaStats, LeaseStats, Notice, Op, Reply, Request, Role,
    Transition,
};

/// A transport connection, unique within a boot (the transport names it; the server and the backend's
/// [`Principal`] carry it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Who sent a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    pub session_id: u64,
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The client said BYE.
    Bye,
    /// The peer closed or reset the connection.
    PeerClosed,
    /// No frame within the heartbeat timeout.
    HeartbeatTimeout,
    /// Framing lost, output overflow or a protocol violation.
    ProtocolError,
    /// A RESUME on a newer session of the same principal took its leases over (nothing is orphaned).
    Resumed,
}

/// Names one accepted lease request so its answer can be delivered later: the connection and session it came
/// on, its request id and operation. An answer whose ticket no longer matches an open session is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub conn: ConnId,
    pub session_id: u64,
    pub request_id: u32,
    pub op: Op,
}

/// What the backend makes of a lease request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answered at once.
    Now(Reply),
    /// The answer comes later through [`Leases::take_answers`], with this request's [`Ticket`]; the request
    /// holds its credit until then.
    Later,
}

/// The lease service, as sessions see it: lease operations and the session events it follows. The lease
/// service implements it (`leasebox_lease::backend::LeaseBackend`), so does the hosted appliance's verbs
/// reference responder, and [`NoLeases`] when the lease service is off. What the appliance itself knows (its
/// HCA, its cores, its entropy) is the other interface, [`Appliance`].
pub trait Leases {
    /// This boot's id, drawn by [`crate::Server::new`] from its entropy before any session exists: the lease
    /// service makes it part of every lease id and answers an id from another boot as a lease that does not
    /// exist.
    fn boot(&mut self, boot_id: [u8; BOOT_ID_LEN]) {
        let _ = boot_id;
    }
    /// Appends the notices raised since the last call, each with the tenant whose sessions get it (the empty
    /// name: every tenant's sessions). The server drains them where it drains answers ([`Leases::take_answers`]).
    fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        let _ = out;
    }
    /// RESUME: session `to` takes over the leases of `from`, an earlier session of the same principal (still
    /// open, or lost within the lease service's grace period). The server has checked the token and the
    /// principal; it closes `from` afterwards without orphaning anything. Returns the leases `to` now holds that
    /// were `from`'s.
    fn resume(&mut self, from: &Principal, to: &Principal, now_ms: u64) -> u32 {
        let _ = (from, to, now_ms);
        0
    }
    /// A lease operation (ALLOC, READY, RENEW, FREE, QUERY, LIST, REVOKE, and the admin's DRAIN) from an
    /// authenticated principal. An operation that waits on the HCA answers [`Answer::Later`] and keeps `ticket`
    /// for its answer.
    fn lease_op(&mut self, who: &Principal, req: &Request, ticket: Ticket, now_ms: u64) -> Answer;
    /// Appends the answers finished since the last call (in any order; request ids tell them apart).
    fn take_answers(&mut self, out: &mut Vec<(Ticket, Reply)>) {
        let _ = out;
    }
    /// A session has just authenticated (HELLO done): a tenant reconnecting may resume its leases.
    fn session_started(&mut self, who: &Principal, now_ms: u64) {
        let _ = (who, now_ms);
    }
    /// A HEARTBEAT arrived from an authenticated session (the lease service renews TTLs on it).
    fn session_alive(&mut self, who: &Principal, now_ms: u64) {
        let _ = (who, now_ms);
    }
    /// An authenticated session ended: the lease service decides what happens to its leases (kept for a
    /// grace period, then revoked).
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, now_ms: u64);
    /// Timers: called at the start of every [`crate::Server::tick`].
    fn tick(&mut self, now_ms: u64) {
        let _ = now_ms;
    }
    /// Whether work is under way that the next [`Leases::tick`] moves on (commands at the HCA or waiting for
    /// room in its ring, memory being scrubbed or prepared): a host whose loop sleeps ticks sooner while it is.
    fn busy(&self) -> bool {
        false
    }
    /// The lease part of STATS.
    fn lease_stats(&mut self) -> LeaseStats {
        LeaseStats::default()
    }
    /// The lease part of a tenant's STATS: `who`'s leases only (by state, bytes held, bytes it may still
    /// take); the global counters stay zero. The default shows nothing.
    fn tenant_lease_stats(&mut self, who: &Principal) -> LeaseStats {
        let _ = who;
        LeaseStats::default()
    }
    /// FENCED_SUMMARY: one page of the fenced slots `who` may see, from slot `cursor` on, at most `max`
    /// (clamped to 1..=`MAX_PAGE`); returns the next page's cursor (0 after the last) and the page.
    fn fenced(&mut self, who: &Principal, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>);
    /// LEASE_LOG (admin only; the session server has checked): up to `max` (clamped to 1..=`MAX_PAGE`) lease
    /// slot transitions from sequence `cursor` on (0: the oldest held), as (next cursor, records the ring no
    /// longer holds, the records). `None`: this lease service keeps no transitions (NOT_IMPLEMENTED).
    fn lease_log(&mut self, cursor: u64, max: u16) -> Option<(u64, u64, Vec<Transition>)> {
        let _ = (cursor, max);
        None
    }
    /// The lease part of HEALTH; [`crate::health`] makes the answer of it and the appliance's facts. No
    /// default: a lease service must say whether it runs.
    fn health_facts(&mut self) -> LeaseHealth;
}

/// A boxed lease service is one (a host that picks its lease service at run time holds a `Box<dyn ...>`).
impl<L: Leases + ?Sized> Leases for Box<L> {
    fn boot(&mut self, boot_id: [u8; BOOT_ID_LEN]) {
        (**self).boot(boot_id)
    }
    fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        (**self).take_notices(out)
    }
    fn resume(&mut self, from: &Principal, to: &Principal, now_ms: u64) -> u32 {
        (**self).resume(from, to, now_ms)
    }
    fn lease_op(&mut self, who: &Principal, req: &Request, ticket: Ticket, now_ms: u64) -> Answer {
        (**self).lease_op(who, req, ticket, now_ms)
    }
    fn take_answers(&mut self, out: &mut Vec<(Ticket, Reply)>) {
        (**self).take_answers(out)
    }
    fn session_started(&mut self, who: &Principal, now_ms: u64) {
        (**self).session_started(who, now_ms)
    }
    fn session_alive(&mut self, who: &Principal, now_ms: u64) {
        (**self).session_alive(who, now_ms)
    }
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, now_ms: u64) {
        (**self).session_lost(who, reason, now_ms)
    }
    fn tick(&mut self, now_ms: u64) {
        (**self).tick(now_ms)
    }
    fn busy(&self) -> bool {
        (**self).busy()
    }
    fn lease_stats(&mut self) -> LeaseStats {
        (**self).lease_stats()
    }
    fn tenant_lease_stats(&mut self, who: &Principal) -> LeaseStats {
        (**self).tenant_lease_stats(who)
    }
    fn fenced(&mut self, who: &Principal, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>) {
        (**self).fenced(who, cursor, max)
    }
    fn lease_log(&mut self, cursor: u64, max: u16) -> Option<(u64, u64, Vec<Transition>)> {
        (**self).lease_log(cursor, max)
    }
    fn health_facts(&mut self) -> LeaseHealth {
        (**self).health_facts()
    }
}

/// What the appliance knows of itself, for STATS, HEALTH and HCA_STATS, and where its randomness comes from:
/// implemented once by the image (its cores, its HCA, RDSEED/RDRAND) and once by the hosted appliance (no
/// cores, the device model's HCA or a verbs device, the OS). Uptime is the server's own clock.
pub trait Appliance: Entropy {
    /// Per-core role loop counts for STATS: (core, role, iterations). Default: none (a host without cores).
    fn role_counts(&self) -> Vec<(u16, u8, u64)> {
        Vec::new()
    }
    /// The HCA's state and the appliance's line about it, for HEALTH ([`crate::health`]). Default: none.
    fn hca(&self) -> (HcaState, String) {
        (HcaState::Absent, String::from("no HCA"))
    }
    /// HCA_STATS: the mlx5 command queue's counters, if this appliance drives one (none, the default: the server
    /// answers NOT_IMPLEMENTED).
    fn hca_stats(&self) -> Option<HcaStats> {
        None
    }
}

/// The lease service when it is off (no HCA, or it could not start): lease operations answer NOT_IMPLEMENTED
/// with the reason; nothing can be fenced.
pub struct NoLeases {
    /// Why there is no lease service, for every answer and HEALTH.
    pub reason: String,
    /// Sessions that ended, for tests and diagnostics (bounded).
    pub lost: Vec<(String, CloseReason)>,
}

impl NoLeases {
    /// The lease service is off because of `reason` (e.g. "no HCA").
    pub fn off(reason: impl Into<String>) -> NoLeases {
        NoLeases { reason: reason.into(), lost: Vec::new() }
    }
}

/// Without an HCA.
impl Default for NoLeases {
    fn default() -> Self {
        NoLeases::off("no HCA")
    }
}

impl Leases for NoLeases {
    fn lease_op(&mut self, _who: &Principal, req: &Request, _ticket: Ticket, _now_ms: u64) -> Answer {
        Answer::Now(Err(ErrorBody::new(
            ErrorCode::NotImplemented,
            &alloc::format!("{}: the lease service is off: {}", req.op().name(), self.reason),
        )))
    }
    fn fenced(&mut self, _who: &Principal, _cursor: u32, _max: u16) -> (u32, Vec<FencedSlot>) {
        (0, Vec::new())
    }
    fn health_facts(&mut self) -> LeaseHealth {
        LeaseHealth::Off(self.reason.clone())
    }
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, _now_ms: u64) {
        if self.lost.len() < 64 {
            self.lost.push((who.name.clone(), reason));
        }
    }
}
