//! The lease service as a sans-I/O state machine: requests and HCA results in, answers and HCA
//! commands out. It never waits: each command a lease needs is queued with a tag ([`LeaseService::next_command`]),
//! and the lease moves on when its result comes back ([`LeaseService::hca_done`]). Time comes in as
//! microseconds with every call; [`LeaseService::tick`] runs the deadlines (revoke outcome within 1 s,
//! READY, TTL, lost sessions) and the deferred sweep.
//!
//! By concern: [`plan`] decides the next step of a lease (pure), `alloc` grants, `revoke` ends leases (the
//! immediate phase, the deadline, the sweep, fencing), `query` answers READY, RENEW, QUERY, LIST and
//! FENCED_SUMMARY, `sessions` follows the control sessions. This file holds the table and moves commands.
//! Revocation's contract is `docs/revoke-semantics.md`.

mod alloc;
mod ids;
pub mod plan;
mod query;
mod revoke;
mod sessions;
#[cfg(test)]
mod soak;
#[cfg(test)]
mod tests;
mod warm;

use ::alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use ::alloc::format;
use ::alloc::string::String;
use ::alloc::vec::Vec;

use leasebox_mlx5::DmaBuf;
use leasebox_mlx5::command::{CmdError, Command, Output};
use leasebox_mlx5::engine::UmrWork;
use leasebox_mlx5::handles::{Cqn, Pdn, UarPage};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::qp::QpCaps;
use leasebox_proto::{AllocReq, BOOT_ID_LEN, ErrorBody, ErrorCode, LeaseState, Notice, Reply, Request, mtu_bytes};
use leasebox_session::IdRng;

use crate::config::{Config, RevokeOrder};
use crate::lease::{Cause, Lease, Phase, Slot, Step};
use crate::pool::ExtentPool;
use crate::stats::Counters;
use crate::transitions::{self, SharedTransitions, State, Transitions, Why};
use ids::Ids;
use plan::{CmdCtx, Next, Stage, View};

pub use plan::FENCE_TEST_MKEY_INDEX;

/// Who asks.
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    pub session: u64,
    pub tenant: &'a str,
    pub admin: bool,
}

/// What the host knows of a neighbour's MAC, for ALLOC's `client_mac` 0 ("resolve": docs/wire-protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Neighbour {
    Known([u8; 6]),
    /// Not known yet: the host is asking (ARP) and will know, or not, on a later call.
    Asking,
    /// The host cannot resolve at all (why).
    Unsupported(&'static str),
}

/// Why a host without neighbour resolution refuses ALLOC's `client_mac` 0.
pub const NO_RESOLVER: &str =
    "this appliance does not resolve MACs: its control channel is not on the RDMA port (ctl_nic=mlx5)";

/// How long an ALLOC with `client_mac` 0 waits for the client's MAC before it answers TIMEOUT.
pub const RESOLVE_TIMEOUT_MS: u64 = 3_000;

/// The memory services the lease service needs from its host: DMA memory for QP buffers and scrubbing, and
/// neighbour resolution on the RDMA port.
pub trait Host {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf>;
    fn dma_free(&mut self, buf: DmaBuf);
    /// Writes zeros over `[addr, addr + len)` of the pool (a slice of the scrub: [`crate::pool`]). The host
    /// writes only through the pool's DMA handles and refuses, and reports, a range not inside the pool
    /// (`setup::PlatformHost`).
    fn zero(&mut self, addr: u64, len: u64);
    /// Monotonic microseconds, read between scrub slices to keep each tick's share of the scrub within
    /// `Config::scrub_budget_us`.
    fn now_us(&self) -> u64;
    /// The MAC of `ip` on the RDMA port's segment (the client's next hop), as ARP finds it. Asked again on
    /// every timer scan while the answer is [`Neighbour::Asking`].
    fn neighbour(&mut self, _ip: core::net::Ipv4Addr) -> Neighbour {
        Neighbour::Unsupported(NO_RESOLVER)
    }
}

/// An ALLOC waiting for its client's MAC.
struct Parked<T> {
    tenant: String,
    session: u64,
    admin: bool,
    req: AllocReq,
    ticket: T,
    ip: core::net::Ipv4Addr,
    deadline_us: u64,
}

/// What the service needs to know about the HCA after bring-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcaCtx {
    pub uar: UarPage,
    /// The CQ every lease QP reports to (polled by the event engine).
    pub cqn: Cqn,
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// The RDMA port's MAC (the GID entry's source MAC), answered in ALLOC as `server_mac`.
    pub mac: [u8; 6],
    /// The largest IB MTU the port carries (1..=5).
    pub port_mtu: u8,
    /// The QP context values the HCA's caps dictate (`log_msg_max`, the read/atomic bounds, `ts_format`,
    /// `user_index`, the atomic mode; `HcaInfo::qp` after bring-up).
    pub qp: QpCaps,
    /// What the command engine's UMR QP allows ([`UmrCtx::OFF`] without one).
    pub umr: UmrCtx,
}

/// The UMR path as the HCA's caps and the engine's UMR QP allow it (docs/revoke-semantics.md, "The UMR
/// path"). Decided once at start-up, per direction; a lease that does not fit takes the commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UmrCtx {
    /// UMR grants (ALLOC on a warm entry): the engine has a UMR QP and `UmrCaps::grant_allowed`.
    pub grant: bool,
    /// UMR revokes of warm keys: the engine has a UMR QP and `UmrCaps::revoke_allowed`.
    pub revoke: bool,
    /// The UMR QP's quarantine PD: warm keys are created in it, revoked keys go back to it.
    pub quarantine_pd: Pdn,
    /// Translation entries (extents) one inline grant carries: the warm keys' capacity, so the largest lease
    /// on the UMR path is this many extents.
    pub max_entries: usize,
    /// A grant may set the key's atomic bit (`atomic` and not `umr_modify_atomic_disabled`); otherwise a
    /// lease that asks for atomics takes the commands.
    pub atomic: bool,
}

impl UmrCtx {
    /// No UMR QP: every lease takes the commands.
    pub const OFF: UmrCtx =
        UmrCtx { grant: false, revoke: false, quarantine_pd: Pdn(0), max_entries: 0, atomic: false };

    /// From the UMR QP's caps: what it allows for keys of `extent`-byte pages.
    pub fn from_caps(caps: &leasebox_mlx5::ifc::umr::UmrCaps, quarantine_pd: Pdn) -> UmrCtx {
        use leasebox_mlx5::ifc::umr::{MTT_ALIGNMENT, UMR_HEADER_LEN};
        // An inline list fills whole 64-byte chunks after the 128-byte header, within the largest WQE.
        let room = caps.max_wqe().saturating_sub(UMR_HEADER_LEN) / MTT_ALIGNMENT * MTT_ALIGNMENT;
        let max_entries = room / 8;
        let revoke = caps.revoke_allowed().is_ok();
        UmrCtx {
            // Grants need UMR-enabled keys, which only the warm pool makes; revoking one needs UMR revokes.
            grant: caps.grant_allowed().is_ok() && revoke && max_entries > 0,
            revoke,
            quarantine_pd,
            max_entries,
            atomic: caps.atomic && !caps.modify_atomic_disabled,
        }
    }
}

/// The path each direction takes, for the ready line and HEALTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paths {
    /// ALLOCs on warm entries are granted by UMR.
    pub grant_umr: bool,
    /// Warm keys are revoked by UMR.
    pub revoke_umr: bool,
    /// Warm entries ready now.
    pub warm: usize,
}

impl Paths {
    /// `grant=umr revoke=umr` (or `commands`), for the ready line: which path each direction takes.
    pub fn directions(&self) -> &'static str {
        match (self.grant_umr, self.revoke_umr) {
            (true, true) => "grant=umr revoke=umr",
            (true, false) => "grant=umr revoke=commands",
            (false, true) => "grant=commands revoke=umr",
            (false, false) => "grant=commands revoke=commands",
        }
    }

    /// The same for HEALTH's message, short (it shares the protocol's 256 bytes with the HCA's and the control
    /// port's lines): `umr grant+revoke warm N`, `umr revoke warm N`, `umr grant warm N` or `umr off`.
    pub fn brief(&self) -> String {
        let dirs = match (self.grant_umr, self.revoke_umr) {
            (true, true) => "grant+revoke",
            (false, true) => "revoke",
            (true, false) => "grant",
            (false, false) => return String::from("umr off"),
        };
        format!("umr {dirs} warm {}", self.warm)
    }

    /// The packed form the image's ready line keeps in an atomic (bit 0 grant, bit 1 revoke).
    pub fn bits(&self) -> u8 {
        u8::from(self.grant_umr) | u8::from(self.revoke_umr) << 1
    }

    /// [`Paths::directions`] of [`Paths::bits`].
    pub fn from_bits(b: u8) -> Paths {
        Paths { grant_umr: b & 1 != 0, revoke_umr: b & 2 != 0, warm: 0 }
    }
}

impl core::fmt::Display for Paths {
    /// `grant=umr revoke=umr warm=N`, or `commands` for a direction that uses them.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let p = |umr| if umr { "umr" } else { "commands" };
        write!(f, "grant={} revoke={} warm={}", p(self.grant_umr), p(self.revoke_umr), self.warm)
    }
}

/// The most LIST and FENCED_SUMMARY return in one page.
pub const LIST_MAX: usize = leasebox_proto::MAX_PAGE;

/// How often [`LeaseService::tick`] walks the table for deadlines (the revoke deadline is 1 s; READY, TTL and
/// grace timers are coarser).
pub const SCAN_INTERVAL_US: u64 = 1_000;

/// The IB MTU code an Ethernet port of `oper_mtu` bytes (PMTU, L2 included) carries, as Linux reports it
/// (`mlx5_query_port_roce`: `iboe_get_mtu` of the netdev MTU, `oper_mtu` minus 22 bytes of L2): the largest
/// IB MTU that fits after GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes; firmware refuses
/// a path MTU above it. 1 (256) at least.
pub fn port_ib_mtu(oper_mtu: u16) -> u8 {
    let room = u32::from(oper_mtu).saturating_sub(22);
    (1..=5u8).rev().find(|&c| mtu_bytes(c).is_some_and(|b| b + 96 <= room)).unwrap_or(1)
}

/// Notices held for the session server at most, per lease slot (a lease raises at most an Expiring, a Revoked
/// and a Fenced notice before its slot is free again), plus room for Draining notices.
pub const NOTICES_PER_SLOT: usize = 4;

/// A DRAIN waiting for its deadline.
struct Drain {
    /// The tenant drained; `None`: every lease.
    tenant: Option<String>,
    at_us: u64,
}

/// How long before its TTL runs out a lease gets its Expiring notice: a quarter of its TTL, at most 5 s
/// (docs/wire-protocol.md, "NOTICE").
pub fn expiring_threshold_ms(ttl_ms: u32) -> u64 {
    (u64::from(ttl_ms) / 4).min(5_000)
}

pub struct LeaseService<T: Copy> {
    cfg: Config,
    /// This boot's id (from the session server, `Backend::boot`): part of every lease id; an id with another
    /// boot's is a lease that does not exist.
    boot_id: [u8; BOOT_ID_LEN],
    /// Notices for the owning tenants' sessions, with the tenant (empty: every tenant), until taken.
    notices: Vec<(String, Notice)>,
    /// DRAINs whose deadline has not come (or whose leases were still being built when it came).
    drains: Vec<Drain>,
    /// Open sessions and their tenants (`session_started` to `session_lost`): where a lost session's leases go.
    live: BTreeMap<u64, String>,
    hca: HcaCtx,
    slots: Vec<Slot<T>>,
    pool: ExtentPool,
    /// Commands issued and not yet completed. A command's tag is its slot and a sequence number
    /// ([`tag_of`]), so a result finds its lease with no map.
    in_flight: usize,
    next_seq: u64,
    outbox: VecDeque<(u64, Command)>,
    /// Commands of revokes' immediate phases: they go out before anything in `outbox`, so ALLOCs and sweeps
    /// never delay an outcome that is due within the revoke deadline.
    urgent: VecDeque<(u64, Command)>,
    /// UMR work requests (grants, and revokes at the front), for the engine's UMR QP.
    umr_out: VecDeque<(u64, UmrWork)>,
    /// The warm pool and the entries being built for it (`warm`).
    warm: warm::WarmPool,
    answers: Vec<(T, Reply)>,
    /// Initial PSNs and MKEY variants, from the CSPRNG (`ids`).
    ids: Ids,
    /// Free slots; ALLOC takes the lowest.
    free: BTreeSet<u32>,
    /// One past the highest slot ever made busy: the timer scan (`tick`, every [`SCAN_INTERVAL_US`]) stops here,
    /// so it costs the most leases held at once rather than every configured slot (up to the HCA's limit).
    busy_end: u32,
    /// Busy leases and bytes per tenant (budgets).
    usage: BTreeMap<String, (u32, u64)>,
    /// ALLOC rate per tenant (`Config::tenant_allocs_per_s`): a token bucket each, as (tokens in millionths
    /// of an ALLOC, when last filled in µs).
    alloc_rate: BTreeMap<String, (u64, u64)>,
    /// The timer scan runs at most this often.
    next_scan_us: u64,
    /// ALLOCs waiting for the client's MAC (`client_mac` 0).
    resolving: Vec<Parked<T>>,
    /// When the service first ran, until the pool's boot-time preparation is done and logged.
    preparing_since_us: Option<u64>,
    pool_ready: bool,
    pub counters: Counters,
    /// Every slot's state changes (`transitions`), shared with LEASE_LOG and the panic dump.
    transitions: SharedTransitions,
}

fn err(code: ErrorCode, msg: &str) -> ErrorBody {
    ErrorBody::new(code, msg)
}

impl<T: Copy> LeaseService<T> {
    /// The service over `cfg` and the HCA's objects; `rng` draws the identifiers clients must not predict
    /// (initial PSNs, MKEY variants): seed it from [`IdRng::from_entropy`] (tests may use a fixed seed).
    pub fn new(cfg: Config, hca: HcaCtx, rng: IdRng) -> Result<Self, crate::config::ConfigError> {
        cfg.check()?;
        let cfg_slots = cfg.slots;
        let slots = (0..cfg.slots).map(|_| Slot::Free { next_generation: 1 }).collect();
        let pool = ExtentPool::new(&cfg.pool, cfg.extent, &cfg.uncleared);
        Ok(LeaseService {
            cfg,
            boot_id: [0; BOOT_ID_LEN],
            notices: Vec::new(),
            drains: Vec::new(),
            live: BTreeMap::new(),
            hca,
            slots,
            pool,
            in_flight: 0,
            next_seq: 1,
            outbox: VecDeque::new(),
            urgent: VecDeque::new(),
            umr_out: VecDeque::new(),
            warm: warm::WarmPool::default(),
            answers: Vec::new(),
            ids: Ids::new(rng),
            free: (0..cfg_slots).collect(),
            busy_end: 0,
            usage: BTreeMap::new(),
            alloc_rate: BTreeMap::new(),
            next_scan_us: 0,
            resolving: Vec::new(),
            preparing_since_us: None,
            pool_ready: false,
            counters: Counters::default(),
            transitions: Transitions::shared(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets this boot's id; the session server draws it at start, before any lease exists.
    pub fn set_boot_id(&mut self, boot_id: [u8; BOOT_ID_LEN]) {
        self.boot_id = boot_id;
    }

    pub fn boot_id(&self) -> [u8; BOOT_ID_LEN] {
        self.boot_id
    }

    /// Notices raised since the last call, each with the tenant whose sessions get it (empty: every tenant's).
    pub fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        out.append(&mut self.notices);
    }

    /// Tells `tenant`'s sessions `n`. The session server takes notices at every pass of its loop; should
    /// nobody take them (a rig without one), the queue stops at [`NOTICES_PER_SLOT`] per slot and later ones
    /// are counted as dropped rather than held without bound.
    fn notify(&mut self, tenant: &str, n: Notice) {
        if self.notices.len() >= NOTICES_PER_SLOT * self.slots.len() + 64 {
            self.counters.notices_dropped += 1;
            return;
        }
        self.notices.push((String::from(tenant), n));
    }

    /// Whether a DRAIN covers `tenant` (its ALLOCs are refused until its leases are revoked).
    fn draining(&self, tenant: &str) -> bool {
        self.drains.iter().any(|d| d.tenant.as_deref().is_none_or(|t| t == tenant))
    }

    /// The next HCA command to submit, with its tag.
    pub fn next_command(&mut self) -> Option<(u64, Command)> {
        self.urgent.pop_front().or_else(|| self.outbox.pop_front())
    }

    /// The next UMR work request to submit (`Client::submit_umr`), with its tag; revokes first.
    pub fn next_umr(&mut self) -> Option<(u64, UmrWork)> {
        self.umr_out.pop_front()
    }

    /// Puts a UMR work request back at the front (the submit ring was full).
    pub fn unsend_umr(&mut self, tag: u64, work: UmrWork) {
        self.umr_out.push_front((tag, work));
    }

    /// The lease slot a command's or work request's tag is for; `None` for the warm pool's own commands.
    pub fn tag_lease_slot(tag: u64) -> Option<u32> {
        let slot = tag_slot(tag);
        (slot < warm::FILL_SLOT_BASE).then_some(slot)
    }

    /// Which path grants and revokes take, and the warm entries ready.
    pub fn paths(&self) -> Paths {
        let umr = self.hca.umr;
        let on = umr.grant && self.cfg.warm > 0;
        Paths { grant_umr: on, revoke_umr: on && umr.revoke && !self.cfg.fence_test, warm: self.warm.ready() }
    }

    /// Puts a command back at the front (the submit ring was full).
    pub fn unsend(&mut self, tag: u64, cmd: Command) {
        // Back where it came from, at the front: an immediate-phase command goes back to the urgent queue.
        let urgent = self.lease(tag_slot(tag)).is_some_and(|l| matches!(l.phase, Phase::Fencing { .. }));
        if urgent { self.urgent.push_front((tag, cmd)) } else { self.outbox.push_front((tag, cmd)) }
    }

    /// Whether commands or UMR work requests wait to be submitted.
    pub fn has_commands(&self) -> bool {
        !self.outbox.is_empty() || !self.urgent.is_empty() || !self.umr_out.is_empty()
    }

    /// Answers ready since the last call.
    pub fn take_answers(&mut self, out: &mut Vec<(T, Reply)>) {
        out.append(&mut self.answers);
    }

    /// Commands issued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The sequence number the next command's tag carries (1..=[`LeaseService::SEQUENCE_MAX`]).
    pub fn next_sequence(&self) -> u64 {
        self.next_seq
    }

    /// The largest sequence number a tag carries; the one after it is 1.
    pub const SEQUENCE_MAX: u64 = SEQ_MAX;

    /// Starts the tag sequence at `seq` (1..=[`LeaseService::SEQUENCE_MAX`]): for tests that drive the
    /// service across the sequence's limits without issuing a billion commands first.
    pub fn start_sequence_at(&mut self, seq: u64) {
        assert!((1..=SEQ_MAX).contains(&seq), "sequence numbers run 1..={SEQ_MAX}");
        self.next_seq = seq;
    }

    /// The ring of every slot's state changes, for LEASE_LOG and the panic dump.
    pub fn transitions(&self) -> SharedTransitions {
        self.transitions.clone()
    }

    /// Records that `slot` is about to go to `to` because of `why`: the one hook of the transition ring, called
    /// just before the slot or its lease's phase changes (it reads the state, generation and failed steps the
    /// slot has now).
    fn note(&self, slot: u32, to: State, why: Why, now_us: u64) {
        let Some(s) = self.slots.get(slot as usize) else { return };
        let (from, generation, mask) = transitions::of_slot(s);
        self.transitions.lock().record(now_us, slot, generation, from, to, why, mask);
    }

    /// Why a lease's immediate phase starts: its cause, with an expiry of an orphaned lease told apart.
    fn revoke_why(&self, slot: u32, cause: Cause) -> Why {
        match cause {
            Cause::Free => Why::Free,
            Cause::Revoke => Why::Revoke,
            Cause::Expiry if self.lease(slot).is_some_and(|l| l.orphaned_at.is_some()) => Why::SessionLost,
            Cause::Expiry => Why::Expiry,
        }
    }

    /// The sweep or an unwind finished: the slot goes free, or retires at its last generation.
    fn note_released(&self, slot: u32, now_us: u64) {
        let Some(l) = self.lease(slot) else { return };
        let to = if l.id.generation == u32::MAX { State::Retired } else { State::Free };
        let why = if matches!(l.phase, Phase::Unwinding) { Why::UnwindDone } else { Why::SweepDone };
        self.note(slot, to, why, now_us);
    }

    pub fn pool(&self) -> &ExtentPool {
        &self.pool
    }

    fn lease(&self, slot: u32) -> Option<&Lease<T>> {
        match self.slots.get(slot as usize) {
            Some(Slot::Busy(l)) => Some(l),
            _ => None,
        }
    }

    fn lease_mut(&mut self, slot: u32) -> Option<&mut Lease<T>> {
        busy(&mut self.slots, slot)
    }

    /// One request from an authenticated principal. Returns the answer now, or `None` when it will come
    /// through [`LeaseService::take_answers`].
    pub fn request(
        &mut self,
        who: Who<'_>,
        req: &Request,
        ticket: T,
        now_us: u64,
        host: &mut dyn Host,
    ) -> Option<Reply> {
        match req {
            Request::Alloc(a) => self.alloc(who, a, ticket, now_us, host),
            Request::Ready { lease, client_qpn, server_qpn } => {
                Some(self.ready(who, *lease, *client_qpn, *server_qpn, now_us))
            }
            Request::Renew { lease, ttl_ms } => Some(self.renew(who, *lease, *ttl_ms, now_us)),
            Request::Free { lease } => self.revoke(who, *lease, Cause::Free, None, ticket, now_us, host),
            Request::Revoke { lease, qp_first } => {
                let order = if *qp_first { Some(RevokeOrder::QpFirst) } else { None };
                if order.is_some() && !(who.admin && self.cfg.allow_order_override) {
                    return Some(Err(err(
                        ErrorCode::Forbidden,
                        "REVOKE: only the admin may choose the teardown order (qp_first), and only when allowed",
                    )));
                }
                self.revoke(who, *lease, Cause::Revoke, order, ticket, now_us, host)
            }
            Request::Query { lease } => Some(self.query(who, *lease, now_us)),
            Request::Drain { tenant, notice_ms } => Some(self.drain(who, tenant, *notice_ms, now_us)),
            Request::List { cursor, max } => Some(self.list(who, *cursor, *max, now_us)),
            other => Some(Err(err(ErrorCode::UnknownOp, &format!("{} is not a lease operation", other.op().name())))),
        }
    }

    /// The plan a lease in `phase` follows.
    fn stage(l: &Lease<T>) -> Option<Stage> {
        match l.phase {
            Phase::Building => Some(Stage::Build),
            Phase::Fencing { .. } => Some(Stage::Revoke(l.order)),
            Phase::Sweeping => Some(Stage::Sweep),
            Phase::Unwinding => Some(Stage::Unwind),
            Phase::Granted { .. } | Phase::Active | Phase::PendingDestroy { .. } => None,
        }
    }

    /// Issues the lease's next step, or ends its stage when [`plan::next`] says so.
    fn advance(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        let mut ctx = CmdCtx {
            hca: self.hca,
            variant: 0,
            extent_log: self.cfg.extent.trailing_zeros() as u8,
            timers: (self.cfg.ack_timeout, self.cfg.retry_count, self.cfg.rnr_retry),
            fence_test: self.cfg.fence_test,
            tclass: self.cfg.tclass,
            eth_prio: self.cfg.eth_prio,
        };
        let end = loop {
            let Some(l) = busy(&mut self.slots, slot) else { return };
            if l.in_flight.is_some() {
                return;
            }
            let Some(stage) = Self::stage(l) else { return };
            let view = View {
                pd: l.pd.is_some(),
                mkey: l.mkey.is_some(),
                qp: l.qpn.is_some(),
                qp_in_err: l.qp_in_err,
                warm: l.warm,
                umr_revoke: l.warm && self.hca.umr.revoke && !self.cfg.fence_test,
                key_free: l.key_free,
                recycle: l.recycle,
                tried: l.tried,
                failed: l.failed,
            };
            let step = match plan::next(stage, &view) {
                Next::Issue(step) => step,
                end => break (stage, end),
            };
            l.tried.insert(step);
            if step.is_umr() {
                let Some(work) = umr_work(step, l, &self.hca.umr, &mut self.ids, &ctx) else { continue };
                let tag = tag_of(self.next_seq, slot);
                self.next_seq = self.next_seq % SEQ_MAX + 1;
                l.in_flight = Some((tag, step));
                self.in_flight += 1;
                if step == Step::UmrRevoke {
                    self.umr_out.push_front((tag, work));
                } else {
                    self.umr_out.push_back((tag, work));
                }
                return;
            }
            if step == Step::CreateMkey {
                ctx.variant = self.ids.variant();
                l.variant = ctx.variant;
            }
            let Some(cmd) = plan::command(step, stage, l, slot, &ctx) else { continue };
            if step == Step::DestroyMkey
                && let Some(k) = l.mkey
            {
                // The index is retired with its variant from the moment the HCA may act on the command, not
                // when its completion is read: the HCA can hand the index to a CREATE_MKEY whose completion
                // is read first, and that key must not be made or granted with the variant a revoked lease's
                // client still holds. If the destroy fails the key lives on (the slot fences) and its index is
                // not handed out, so the entry only narrows later variants.
                self.ids.destroyed(k.index().raw(), k.variant());
            }
            let tag = tag_of(self.next_seq, slot);
            self.next_seq = self.next_seq % SEQ_MAX + 1;
            l.in_flight = Some((tag, step));
            self.in_flight += 1;
            if matches!(stage, Stage::Revoke(_)) {
                self.urgent.push_back((tag, cmd));
            } else {
                self.outbox.push_back((tag, cmd));
            }
            self.counters.commands += 1;
            return;
        };
        match end {
            (Stage::Build, Next::Done) => self.granted(slot, now_us),
            (_, Next::Unwind) => self.unwind(slot, now_us, host),
            (Stage::Revoke(_), Next::Done) => self.torn_down(slot, now_us),
            (Stage::Sweep | Stage::Unwind, Next::Done) => self.release(slot, now_us, host),
            (stage, _) => self.fail_closed(slot, stage, now_us),
        }
    }

    /// A command finished. Every tag from [`LeaseService::next_command`] comes back here exactly once.
    pub fn hca_done(&mut self, tag: u64, result: Result<Output, CmdError>, now_us: u64, host: &mut dyn Host) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let slot = tag_slot(tag);
        if slot >= warm::FILL_SLOT_BASE {
            return self.fill_done(tag, result, host);
        }
        // A late completion for a slot already fenced (its revoke deadline passed) finds no lease: it stays
        // fenced.
        let Some(l) = busy(&mut self.slots, slot) else { return };
        let Some((t, step)) = l.in_flight.take() else { return };
        if t != tag {
            return;
        }
        match result {
            Ok(out) => match step {
                Step::AllocPd => l.pd = Some(ifc::resources::parse_alloc_pd(&out)),
                Step::CreateMkey => {
                    let key = ifc::mkey::create_mkey_out_key(&out, l.variant);
                    l.mkey = Some(key);
                    if !self.ids.created(key.index().raw(), key.variant()) {
                        // The HCA re-used an index with the variant its previous key had: a stale rkey would
                        // name this key. It is destroyed by the unwind; the client asks again.
                        self.variant_reused(slot, key, now_us);
                    }
                }
                Step::CreateQp => l.qpn = Some(ifc::qp::create_qp_out(&out)),
                // Its index was retired when the command was issued (`advance`).
                Step::DestroyMkey => l.mkey = None,
                Step::Qp2Err => l.qp_in_err = true,
                Step::DestroyQp => l.qpn = None,
                Step::DeallocPd => l.pd = None,
                Step::Rst2Init | Step::Init2Rtr | Step::Rtr2Rts | Step::Qp2Rst => {}
                // The key now carries the variant the grant drew (`umr_work`).
                Step::UmrGrant => {
                    l.mkey = l.mkey.map(|k| leasebox_mlx5::handles::Mkey::new(k.index(), l.variant));
                    l.key_free = false;
                    self.counters.umr_grants += 1;
                }
                Step::UmrRevoke => {
                    l.key_free = true;
                    self.counters.umr_revokes += 1;
                }
            },
            Err(e) => {
                if step == Step::UmrRevoke {
                    // DESTROY_MKEY follows (`plan::next`); logged, not fenced, unless that fails too.
                    self.counters.umr_revoke_failures += 1;
                    log::warn!("lease: slot {slot}: UMR revoke failed ({e}); DESTROY_MKEY instead");
                }
                self.step_failed(slot, step, &e, now_us)
            }
        }
        self.advance(slot, now_us, host);
    }

    /// CREATE_MKEY made a key equal to the one its index had before: the ALLOC fails as if the step had
    /// failed (answered now, the unwind follows), so no stale rkey ever names a granted lease.
    /// A lease revoked while it was built is not granted anyway: its revoke destroys the key as usual.
    fn variant_reused(&mut self, slot: u32, key: leasebox_mlx5::handles::Mkey, now_us: u64) {
        let Some(l) = busy(&mut self.slots, slot) else { return };
        if Self::stage(l) != Some(Stage::Build) {
            return;
        }
        let msg = format!("CREATE_MKEY re-used index {} with its previous variant; ask again", key.index());
        if l.failure.is_empty() {
            l.failure = msg.clone();
        }
        l.failed.insert(Step::CreateMkey);
        if let Some((ticket, since)) = l.alloc_ticket.take() {
            self.answers.push((ticket, Err(err(ErrorCode::Internal, &msg))));
            self.counters.alloc_us.record(now_us.saturating_sub(since));
        }
    }

    /// Books a failed step; [`plan::next`] decides what follows.
    fn step_failed(&mut self, slot: u32, step: Step, e: &CmdError, now_us: u64) {
        self.counters.failed_commands += 1;
        let Some(l) = busy(&mut self.slots, slot) else { return };
        let building = Self::stage(l) == Some(Stage::Build);
        if step.builds() && matches!(Self::stage(l), Some(Stage::Revoke(_))) {
            // A build step of a lease revoked while it was built: nothing was created, nothing to cut.
            return;
        }
        if l.failure.is_empty() {
            l.failure = format!("{e}");
        }
        l.failed.insert(step);
        let sweeping = Self::stage(l) == Some(Stage::Sweep);
        l.failed_mask |= if step == Step::Rst2Init && sweeping { crate::lease::step_bit::RECYCLE } else { step.bit() };
        if building && let Some((ticket, since)) = l.alloc_ticket.take() {
            // Answered now; the unwind follows.
            self.answers.push((ticket, Err(hca_error(e))));
            self.counters.alloc_us.record(now_us.saturating_sub(since));
        }
    }

    // ---- figures ----

    /// Leases by state (Granted, Active, Fencing, PendingDestroy, Fenced).
    pub fn by_state(&self) -> [u32; 5] {
        let mut n = [0u32; 5];
        for s in &self.slots {
            match s {
                Slot::Busy(l) => n[l.state() as usize] += 1,
                Slot::Fenced(_) => n[LeaseState::Fenced as usize] += 1,
                Slot::Free { .. } => {}
            }
        }
        n
    }

    pub fn bytes_leased(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Busy(l) => l.extents.len() as u64 * self.cfg.extent,
                _ => 0,
            })
            .sum()
    }

    pub fn fenced_count(&self) -> u32 {
        self.slots.iter().filter(|s| matches!(s, Slot::Fenced(_))).count() as u32
    }

    /// `tenant`'s part of STATS: its leases by state (fenced slots it held included), the bytes it holds and
    /// the bytes it may still take (its budget left, no more than the pool has free).
    pub fn tenant_figures(&self, tenant: &str) -> ([u32; 5], u64, u64) {
        let mut n = [0u32; 5];
        for s in &self.slots {
            match s {
                Slot::Busy(l) if l.tenant == tenant => n[l.state() as usize] += 1,
                Slot::Fenced(f) if f.tenant == tenant => n[LeaseState::Fenced as usize] += 1,
                _ => {}
            }
        }
        let held = self.usage.get(tenant).map_or(0, |u| u.1);
        let free = self.cfg.tenant_bytes.saturating_sub(held).min(self.pool.free_bytes());
        (n, held, free)
    }

    /// Free slots (neither busy nor fenced, nor retired at their generation's limit: `Slot::Free`).
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
}

/// A command's tag: the slot in the low [`SLOT_BITS`], a sequence number above it, in as many bits as the
/// command engine leaves its clients (`engine::CLIENT_TAG_BITS`, its one owner). Sequence numbers run
/// 1..=[`SEQ_MAX`] and then wrap to 1: never 0, so a tag never looks like one of `Client::submit`'s own.
/// At the wrap a sequence number comes back after 2^30 - 1 commands; a tag only has to differ from its slot's
/// one command in flight, which it does.
const SLOT_BITS: u32 = 32;
const SEQ_BITS: u32 = leasebox_mlx5::engine::CLIENT_TAG_BITS.count_ones() - SLOT_BITS;
const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;
// Every tag the service can make is one the engine takes; this fails the build if the layouts ever overlap.
const _: () = assert!(((SEQ_MAX << SLOT_BITS) | u32::MAX as u64) & !leasebox_mlx5::engine::CLIENT_TAG_BITS == 0);
const _: () = assert!(leasebox_mlx5::engine::CLIENT_TAG_BITS == (1u64 << (SLOT_BITS + SEQ_BITS)) - 1);

fn tag_of(seq: u64, slot: u32) -> u64 {
    (seq << SLOT_BITS) | u64::from(slot)
}

/// The slot a command's tag names.
fn tag_slot(tag: u64) -> u32 {
    tag as u32
}

/// The busy lease in `slot` (a borrow of the table alone, so the service's other fields stay usable).
fn busy<T>(slots: &mut [Slot<T>], slot: u32) -> Option<&mut Lease<T>> {
    match slots.get_mut(slot as usize) {
        Some(Slot::Busy(l)) => Some(l),
        _ => None,
    }
}

/// The UMR work request of `step` for lease `l`: a grant draws the key's next variant from the CSPRNG
/// (`Ids::regrant`: never the one it has, which a revoked lease's client may still hold); `None` when the key
/// is gone.
fn umr_work<T>(step: Step, l: &mut Lease<T>, umr: &UmrCtx, ids: &mut Ids, ctx: &CmdCtx) -> Option<UmrWork> {
    use leasebox_mlx5::ifc::mkey::MkeyAccess;
    let key = l.mkey?;
    match step {
        Step::UmrRevoke => Some(UmrWork::Revoke { mkey: key }),
        Step::UmrGrant => {
            let remote = |bit| l.access & bit != 0;
            let mut a = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE;
            if remote(leasebox_proto::access::REMOTE_READ) {
                a = a | MkeyAccess::REMOTE_READ;
            }
            if remote(leasebox_proto::access::REMOTE_WRITE) {
                a = a | MkeyAccess::REMOTE_WRITE;
            }
            if remote(leasebox_proto::access::REMOTE_ATOMIC) {
                a = a | MkeyAccess::ATOMIC;
            }
            l.variant = ids.regrant(key.variant());
            Some(UmrWork::Grant {
                mkey: key,
                new_variant: l.variant,
                pd: l.pd?,
                start: l.extents[0],
                len: l.size,
                access: a,
                log_page_size: ctx.extent_log,
                capacity: umr.max_entries,
                pages: l.extents.clone(),
            })
        }
        _ => None,
    }
}

fn hca_error(e: &CmdError) -> ErrorBody {
    ErrorBody::new(ErrorCode::HcaError, &format!("{e}")).with_detail([
        (u32::from(e.opcode) << 16) | u32::from(e.op_mod),
        u32::from(e.status_or_aborted()),
        e.syndrome().unwrap_or(0),
    ])
}
