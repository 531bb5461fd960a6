//! The reference responder (docs/rxe-guest.md, "The reference responder"): leases served by
//! a real RDMA device through libibverbs, behind the same control protocol as the appliance, so that
//! `leasectl verify --revoke-test` runs against it unchanged and shows what a real RoCE responder does for each
//! teardown order.
//!
//! Each lease is a zeroed page-aligned buffer, its own protection domain, a memory region over the buffer and an
//! RC QP taken to RTS toward the client's QP. The revoke's immediate phase follows the appliance's plan
//! (docs/revoke-semantics.md): MKEY first deregisters the MR and leaves the QP in RTS (the responder NAKs what
//! still arrives); QP first cuts the QP (to ERR, or destroyed with `--verbs-qp-teardown destroy`), then
//! deregisters the MR. The QP goes (ERR, then destroyed) in the deferred sweep, `lease_grace_ms=` later, and
//! only then is the buffer freed. What happens on the wire is the device's business (rxe, or a real RoCE NIC):
//! this module only drives verbs.
//!
//! This is a checker's reference, so it shares no code with what it checks (oracles stay independent): not the
//! lease service's state machine (`app/lease/src/service`), not the model. It takes the
//! lease service's option values (`lease_pool_mib=`, `lease_slots=`, timers, `revoke_order=`) so one command
//! line configures either, and the session core and the wire codec, which it must speak.
//!
//! The bookkeeping here is safe and runs in host tests over a fake [`Device`]; the libibverbs calls are in
//! `verbs_ref/ibv.rs` (feature `verbs`).

#[cfg(feature = "verbs")]
pub mod ibv;

use std::time::Instant;

use leasebox_lease::{LeaseOptions, RevokeOrder};
use leasebox_proto::{
    AllocReq, AllocResp, BOOT_ID_LEN, ErrorBody, ErrorCode, FencedSlot, LeaseId, LeaseInfo, LeaseState, LeaseStats,
    MAX_PAGE, Notice, Outcome, Reply, Request, Response, Role, access, mtu_bytes,
};
use leasebox_session::{Answer, CloseReason, IdRng, LeaseHealth, Leases, Principal, Ticket};

/// `--verbs DEVICE[:GID_INDEX]` and `--verbs-qp-teardown`: which device, which GID, how the QP is cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsSpec {
    /// The RDMA device (`ibv_devices`), e.g. `rxe0`.
    pub device: String,
    /// The RoCEv2 GID the lease QPs send from (rxe0's IPv4-mapped GID is index 1).
    pub gid_index: u8,
    /// The port (always 1 for RoCE devices).
    pub port: u8,
    pub qp_teardown: QpTeardown,
}

impl VerbsSpec {
    /// `DEVICE[:GID_INDEX]` (GID index 0 when not given, as `leasectl verify --gid-index`).
    pub fn parse(v: &str) -> Result<VerbsSpec, String> {
        let (device, gid) = match v.split_once(':') {
            Some((d, g)) => {
                let g = g.parse::<u8>().map_err(|_| format!("--verbs: GID index '{g}' is not 0 to 255"))?;
                (d, g)
            }
            None => (v, 0),
        };
        if device.is_empty() || device.starts_with('-') {
            return Err("--verbs needs DEVICE[:GID_INDEX], e.g. rxe0:1".into());
        }
        Ok(VerbsSpec { device: device.to_string(), gid_index: gid, port: 1, qp_teardown: QpTeardown::Err })
    }
}

/// How the QP is cut, in the immediate phase of a QP-first revoke and in the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpTeardown {
    /// `ibv_modify_qp` to ERR (the appliance's 2ERR_QP), destroyed in the sweep.
    Err,
    /// `ibv_destroy_qp` at once (for comparison: the QPN is gone, not merely in error).
    Destroy,
}

impl QpTeardown {
    pub fn parse(v: &str) -> Result<QpTeardown, String> {
        match v {
            "err" => Ok(QpTeardown::Err),
            "destroy" => Ok(QpTeardown::Destroy),
            _ => Err(format!("--verbs-qp-teardown: '{v}' is not err or destroy")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QpTeardown::Err => "err",
            QpTeardown::Destroy => "destroy",
        }
    }
}

/// The port the leases are served from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The GID at the chosen index (`ibv_query_gid`).
    pub gid: [u8; 16],
    /// The MAC of the GID's netdev (the destination MAC of the client's frames).
    pub mac: [u8; 6],
    /// The port's active MTU as an IB MTU code (1 = 256 … 5 = 4096).
    pub active_mtu: u8,
}

/// The client's side of a lease's RC connection, and the path MTU (code) in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub mtu: u8,
    /// `access` bits of ALLOC (remote read, write, atomic).
    pub access: u8,
}

/// What a device built for one lease; `region` names it in later calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Built {
    pub region: Region,
    pub rkey: u32,
    pub addr: u64,
    pub qpn: u32,
}

/// One lease's objects on the device (buffer, PD, MR, QP), as the device names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Region(pub u64);

/// The verbs a lease needs, so the bookkeeping runs over a fake in tests. Each call acts on one object of one
/// region and fails without side effects beyond what its message says.
pub trait Device: Send {
    fn port(&self) -> &PortInfo;
    /// A zeroed buffer of `len` bytes (page aligned), its own PD, an MR over it with `peer.access`, and an RC
    /// QP taken through INIT and RTR (toward `peer`, path MTU `peer.mtu`) to RTS with starting PSN `psn`. On
    /// failure the device undoes what it built (keeping what it cannot undo) and says why.
    fn build(&mut self, len: u64, peer: &Peer, psn: u32) -> Result<Built, ErrorBody>;
    /// `ibv_dereg_mr`.
    fn dereg_mr(&mut self, r: Region) -> Result<(), String>;
    /// `ibv_modify_qp` to ERR.
    fn qp_to_err(&mut self, r: Region) -> Result<(), String>;
    /// `ibv_destroy_qp`.
    fn destroy_qp(&mut self, r: Region) -> Result<(), String>;
    /// `ibv_dealloc_pd` and the buffer freed: only once the MR and the QP are gone.
    fn release(&mut self, r: Region) -> Result<(), String>;
    /// The region's slot is fenced: whatever is left of it is kept for good (its buffer is never freed, the
    /// device may still reach it).
    fn quarantine(&mut self, r: Region);
}

/// FENCED_SUMMARY `failed_mask` bits (docs/wire-protocol.md): the verbs that stand for each step.
pub mod failed {
    /// `ibv_dereg_mr` (DESTROY_MKEY).
    pub const DEREG_MR: u32 = 0x1;
    /// `ibv_modify_qp` to ERR (2ERR_QP).
    pub const QP_TO_ERR: u32 = 0x2;
    /// `ibv_destroy_qp` (DESTROY_QP).
    pub const DESTROY_QP: u32 = 0x20;
    /// `ibv_dealloc_pd` (DEALLOC_PD).
    pub const DEALLOC_PD: u32 = 0x40;
}

/// FENCED_SUMMARY `origin`.
mod origin {
    pub const REVOKE: u8 = 1;
    pub const SWEEP: u8 = 2;
    pub const EXPIRY: u8 = 3;
}

/// The largest TTL a lease may ask for (as the lease service's `max_ttl_ms`).
const MAX_TTL_MS: u32 = 3_600_000;
/// Buffers are whole pages.
const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Granted {
        ready_by_ms: u64,
    },
    Active,
    /// The immediate phase is over; the sweep runs at `sweep_at_ms`.
    PendingDestroy {
        sweep_at_ms: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Qp {
    Live,
    InErr,
    Gone,
}

#[derive(Clone, Debug)]
struct Lease {
    generation: u32,
    tenant: String,
    /// The session holding it; `None` while orphaned (since `orphaned_at_ms`).
    session: Option<u64>,
    orphaned_at_ms: u64,
    phase: Phase,
    region: Region,
    size: u64,
    /// Bytes counted against the pool (the buffer, whole pages).
    bytes: u64,
    access: u8,
    mtu: u8,
    rkey: u32,
    server_qpn: u32,
    client_qpn: u32,
    ttl_ms: u32,
    expires_at_ms: u64,
    mr: bool,
    qp: Qp,
}

#[derive(Clone, Debug)]
struct Fence {
    generation: u32,
    tenant: String,
    failed_mask: u32,
    origin: u8,
    at_ms: u64,
    bytes: u64,
}

#[derive(Clone, Debug)]
enum Slot {
    /// Never used, or swept; the next lease here gets `generation + 1`.
    Free {
        generation: u32,
    },
    Busy(Lease),
    /// Never lent again this boot.
    Fenced(Fence),
}

/// Why a lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Free,
    Revoke,
    Expiry,
}

/// The lease backend of `leasebox-hosted --verbs`: slots with generations, and the verbs objects of each lease
/// on a [`Device`].
pub struct VerbsLeases {
    dev: Box<dyn Device>,
    opts: LeaseOptions,
    qp_teardown: QpTeardown,
    boot_id: [u8; BOOT_ID_LEN],
    slots: Vec<Slot>,
    rng: IdRng,
    notices: Vec<(String, Notice)>,
    stats: LeaseStats,
}

fn err(code: ErrorCode, message: &str) -> ErrorBody {
    ErrorBody::new(code, message)
}

fn is_admin(who: &Principal) -> bool {
    who.role == Role::Admin
}

impl VerbsLeases {
    /// Leases on `dev`; PSNs from `rng`. (What HEALTH says of the device is the hosted appliance's:
    /// `crate::HostedAppliance::Verbs`.)
    pub fn new(dev: Box<dyn Device>, opts: LeaseOptions, qp_teardown: QpTeardown, rng: IdRng) -> Self {
        let slots =
            vec![Slot::Free { generation: 0 }; opts.slots.unwrap_or(leasebox_lease::setup::DEFAULT_SLOTS) as usize];
        VerbsLeases {
            dev,
            opts,
            qp_teardown,
            boot_id: [0; BOOT_ID_LEN],
            slots,
            rng,
            notices: Vec::new(),
            stats: LeaseStats::default(),
        }
    }

    fn pool_bytes(&self) -> u64 {
        u64::from(self.opts.pool_mib) << 20
    }

    fn leased_bytes(&self, tenant: Option<&str>) -> u64 {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Busy(l) if tenant.is_none_or(|t| t == l.tenant) => l.bytes,
                Slot::Fenced(f) if tenant.is_none_or(|t| t == f.tenant) => f.bytes,
                _ => 0,
            })
            .sum()
    }

    fn id(&self, slot: usize, generation: u32) -> LeaseId {
        LeaseId { boot_id: self.boot_id, slot: slot as u32, generation }
    }

    /// The live lease `id` names if `who` may see it (NOT_FOUND otherwise, STALE for an older generation).
    fn owned(&self, who: &Principal, id: LeaseId) -> Result<&Lease, ErrorBody> {
        if id.boot_id != self.boot_id {
            return Err(err(ErrorCode::NotFound, &format!("no lease {id} in this boot")));
        }
        match self.slots.get(id.slot as usize) {
            Some(Slot::Busy(l)) if is_admin(who) || l.tenant == who.name => {
                if l.generation == id.generation {
                    Ok(l)
                } else {
                    Err(err(
                        ErrorCode::Stale,
                        &format!("lease {id} is stale (slot now at generation {})", l.generation),
                    )
                    .with_detail([l.generation, 0, 0]))
                }
            }
            _ => Err(err(ErrorCode::NotFound, &format!("no lease {id}"))),
        }
    }

    fn busy_mut(&mut self, slot: u32) -> Option<&mut Lease> {
        match self.slots.get_mut(slot as usize) {
            Some(Slot::Busy(l)) => Some(l),
            _ => None,
        }
    }

    /// A tenant's session using an orphaned lease of its tenant takes it over.
    fn adopt(&mut self, who: &Principal, slot: u32) {
        if is_admin(who) {
            return;
        }
        if let Some(l) = self.busy_mut(slot)
            && l.session.is_none()
            && l.tenant == who.name
        {
            l.session = Some(who.session_id);
        }
    }

    fn alloc(&mut self, who: &Principal, a: &AllocReq, now_ms: u64) -> Reply {
        let started = Instant::now();
        let pool = self.pool_bytes();
        if a.size == 0 || a.size > pool {
            return Err(err(
                ErrorCode::BadParam,
                &format!("ALLOC: field 'alloc.size' must be 1 to {pool} bytes (the largest lease)"),
            ));
        }
        if a.access & !access::ALL != 0 {
            return Err(err(
                ErrorCode::BadParam,
                "ALLOC: field 'alloc.access' has a value the protocol does not allow",
            ));
        }
        if mtu_bytes(a.mtu).is_none() {
            return Err(err(ErrorCode::BadParam, "ALLOC: field 'alloc.mtu' is not an IB MTU code (1 to 5)"));
        }
        if a.ttl_ms > MAX_TTL_MS {
            return Err(err(ErrorCode::BadParam, &format!("ALLOC: field 'alloc.ttl_ms' must be at most {MAX_TTL_MS}")));
        }
        let bytes = a.size.div_ceil(PAGE) * PAGE;
        if self.leased_bytes(None) + bytes > pool {
            return Err(err(ErrorCode::NoMemory, &format!("ALLOC: {} bytes are not free in the pool", a.size)));
        }
        let held = self.slots.iter().filter(|s| matches!(s, Slot::Busy(l) if l.tenant == who.name)).count();
        if held >= self.opts.tenant_leases as usize {
            return Err(err(ErrorCode::Limit, &format!("ALLOC: tenant '{}' holds {held} leases, its limit", who.name)));
        }
        let Some(slot) = self.slots.iter().position(|s| matches!(s, Slot::Free { .. })) else {
            return Err(err(ErrorCode::Limit, "ALLOC: every lease slot is in use"));
        };
        let Slot::Free { generation } = self.slots[slot] else { unreachable!("found free above") };
        let generation = generation.wrapping_add(1).max(1);
        let mtu = a.mtu.min(self.dev.port().active_mtu);
        let peer = Peer { qpn: a.client_qpn, psn: a.client_psn, gid: a.client_gid, mtu, access: a.access };
        let psn = self.rng.next_u32() & 0xff_ffff;
        let b = self.dev.build(a.size, &peer, psn)?;
        let ttl = if a.ttl_ms == 0 { self.opts.ttl_ms } else { a.ttl_ms };
        self.slots[slot] = Slot::Busy(Lease {
            generation,
            tenant: who.name.clone(),
            session: Some(who.session_id),
            orphaned_at_ms: 0,
            phase: Phase::Granted { ready_by_ms: now_ms + u64::from(self.opts.ready_ms) },
            region: b.region,
            size: a.size,
            bytes,
            access: a.access,
            mtu,
            rkey: b.rkey,
            server_qpn: b.qpn,
            client_qpn: a.client_qpn,
            ttl_ms: ttl,
            expires_at_ms: now_ms + u64::from(ttl),
            mr: true,
            qp: Qp::Live,
        });
        self.stats.allocs += 1;
        self.stats.alloc_us.record(started.elapsed().as_micros() as u64);
        let port = self.dev.port();
        Ok(Response::Alloc(AllocResp {
            lease: self.id(slot, generation),
            rkey: b.rkey,
            remote_addr: b.addr,
            length: a.size,
            server_qpn: b.qpn,
            server_psn: psn,
            server_gid: port.gid,
            mtu,
            ttl_ms: ttl,
            server_mac: port.mac,
        }))
    }

    fn ready(&mut self, who: &Principal, id: LeaseId, client_qpn: u32, server_qpn: u32) -> Reply {
        let l = self.owned(who, id)?;
        if l.server_qpn != server_qpn || l.client_qpn != client_qpn {
            return Err(err(
                ErrorCode::BadParam,
                &format!("READY: QPNs do not match the lease (client {:#x}, server {:#x})", l.client_qpn, l.server_qpn),
            ));
        }
        match l.phase {
            Phase::Granted { .. } | Phase::Active => {
                if let Some(l) = self.busy_mut(id.slot) {
                    l.phase = Phase::Active;
                }
                self.adopt(who, id.slot);
                Ok(Response::Ready { state: LeaseState::Active })
            }
            Phase::PendingDestroy { .. } => Err(err(ErrorCode::BadState, "READY: lease is PendingDestroy")),
        }
    }

    fn renew(&mut self, who: &Principal, id: LeaseId, ttl_ms: u32, now_ms: u64) -> Reply {
        let l = self.owned(who, id)?;
        if matches!(l.phase, Phase::PendingDestroy { .. }) {
            return Err(err(ErrorCode::BadState, "RENEW: lease is PendingDestroy"));
        }
        if ttl_ms > MAX_TTL_MS {
            return Err(err(
                ErrorCode::BadParam,
                &format!("RENEW: field 'renew.ttl_ms' must be at most {MAX_TTL_MS} ms"),
            ));
        }
        let ttl = if ttl_ms == 0 { self.opts.ttl_ms } else { ttl_ms };
        if let Some(l) = self.busy_mut(id.slot) {
            l.ttl_ms = ttl;
            l.expires_at_ms = now_ms + u64::from(ttl);
        }
        self.adopt(who, id.slot);
        Ok(Response::Renew { ttl_ms: ttl })
    }

    fn info(&self, slot: usize, l: &Lease, now_ms: u64) -> LeaseInfo {
        let state = match l.phase {
            Phase::Granted { .. } => LeaseState::Granted,
            Phase::Active => LeaseState::Active,
            Phase::PendingDestroy { .. } => LeaseState::PendingDestroy,
        };
        LeaseInfo {
            lease: self.id(slot, l.generation),
            state,
            access: l.access,
            mtu: l.mtu,
            size: l.size,
            rkey: if l.mr { l.rkey } else { 0 },
            server_qpn: l.server_qpn,
            client_qpn: l.client_qpn,
            ttl_left_ms: l.expires_at_ms.saturating_sub(now_ms).min(u64::from(u32::MAX)) as u32,
            tenant: l.tenant.clone(),
        }
    }

    fn query(&mut self, who: &Principal, id: LeaseId, now_ms: u64) -> Reply {
        let info = self.owned(who, id).map(|l| self.info(id.slot as usize, l, now_ms))?;
        if matches!(info.state, LeaseState::Granted | LeaseState::Active) {
            self.adopt(who, id.slot);
        }
        Ok(Response::Query(info))
    }

    fn list(&self, who: &Principal, cursor: u32, max: u16, now_ms: u64) -> Reply {
        let max = usize::from(max).clamp(1, MAX_PAGE);
        let mut leases = Vec::new();
        for (i, s) in self.slots.iter().enumerate().skip(cursor as usize) {
            if let Slot::Busy(l) = s
                && (is_admin(who) || l.tenant == who.name)
            {
                if leases.len() == max {
                    return Ok(Response::List { next_cursor: i as u32, leases });
                }
                leases.push(self.info(i, l, now_ms));
            }
        }
        Ok(Response::List { next_cursor: 0, leases })
    }

    /// FREE and REVOKE: the immediate phase, at once (verbs calls return when done), with its outcome.
    fn end(&mut self, who: &Principal, id: LeaseId, cause: Cause, order: RevokeOrder, now_ms: u64) -> Reply {
        let answer = |outcome, elapsed_us| {
            Ok(if cause == Cause::Free {
                Response::Free { outcome, elapsed_us }
            } else {
                Response::Revoke { outcome, elapsed_us }
            })
        };
        if id.boot_id != self.boot_id {
            return answer(Outcome::NotFound, 0);
        }
        let mine = |tenant: &str| is_admin(who) || tenant == who.name;
        match self.slots.get(id.slot as usize) {
            Some(Slot::Busy(l)) if mine(&l.tenant) && l.generation == id.generation => match l.phase {
                Phase::PendingDestroy { .. } => answer(Outcome::TornDown, 0),
                Phase::Granted { .. } | Phase::Active => {
                    let (outcome, elapsed_us) = self.cut(id.slot, cause, order, now_ms);
                    answer(outcome, elapsed_us)
                }
            },
            Some(Slot::Fenced(f)) if mine(&f.tenant) && f.generation == id.generation => answer(Outcome::Fenced, 0),
            _ => answer(Outcome::NotFound, 0),
        }
    }

    /// The immediate phase of lease `slot` (Granted or Active) in `order`: every cut the order names runs even
    /// after one failed (a failed deregistration in MKEY-first order cuts the QP instead, as the appliance's
    /// fallback fence); any failure fences the slot. Returns the outcome and the microseconds it took.
    fn cut(&mut self, slot: u32, cause: Cause, order: RevokeOrder, now_ms: u64) -> (Outcome, u32) {
        let started = Instant::now();
        let teardown = self.qp_teardown;
        let grace = u64::from(self.opts.grace_ms);
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return (Outcome::NotFound, 0) };
        let dev = self.dev.as_mut();
        let mut mask = 0;
        if order == RevokeOrder::QpFirst {
            mask |= cut_qp(dev, teardown, l, slot);
        }
        match dev.dereg_mr(l.region) {
            Ok(()) => l.mr = false,
            Err(e) => {
                log::warn!("lease slot {slot}: ibv_dereg_mr: {e}");
                mask |= failed::DEREG_MR;
                if order == RevokeOrder::MkeyFirst {
                    mask |= cut_qp(dev, teardown, l, slot);
                }
            }
        }
        let elapsed_us = started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        let (generation, tenant) = (l.generation, l.tenant.clone());
        let outcome = if mask == 0 {
            l.phase = Phase::PendingDestroy { sweep_at_ms: now_ms + grace };
            Outcome::TornDown
        } else {
            let o = if cause == Cause::Expiry { origin::EXPIRY } else { origin::REVOKE };
            self.fence(slot, mask, o, now_ms);
            Outcome::Fenced
        };
        match cause {
            Cause::Expiry => self.stats.expiries += 1,
            Cause::Free | Cause::Revoke => {
                self.stats.revokes += 1;
                self.stats.revoke_us.record(u64::from(elapsed_us));
            }
        }
        // `revoke_notices=off` withholds the notice (a diagnostic for clients' QUERY fallback).
        if cause != Cause::Free && self.opts.revoke_notices {
            let lease = self.id(slot as usize, generation);
            self.notices.push((tenant, Notice::Revoked { lease, outcome }));
        }
        (outcome, elapsed_us)
    }

    /// Fences a busy slot for good; the device keeps what is left of its objects.
    fn fence(&mut self, slot: u32, failed_mask: u32, origin: u8, now_ms: u64) {
        let Some(Slot::Busy(l)) = self.slots.get(slot as usize) else { return };
        let f = Fence {
            generation: l.generation,
            tenant: l.tenant.clone(),
            failed_mask,
            origin,
            at_ms: now_ms,
            bytes: l.bytes,
        };
        self.dev.quarantine(l.region);
        self.slots[slot as usize] = Slot::Fenced(f);
    }

    /// The deferred sweep of a torn-down lease: the QP to ERR (unless it is there or gone) and destroyed, the
    /// PD and the buffer released. A failure fences the slot (and tells the tenant).
    fn sweep(&mut self, slot: u32, now_ms: u64) {
        let teardown = self.qp_teardown;
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        let mut mask = 0;
        if l.qp == Qp::Live && teardown == QpTeardown::Err {
            match self.dev.qp_to_err(l.region) {
                Ok(()) => l.qp = Qp::InErr,
                Err(e) => {
                    log::warn!("lease slot {slot}: sweep: QP to ERR: {e}");
                    mask |= failed::QP_TO_ERR;
                }
            }
        }
        if mask == 0 && l.qp != Qp::Gone {
            match self.dev.destroy_qp(l.region) {
                Ok(()) => l.qp = Qp::Gone,
                Err(e) => {
                    log::warn!("lease slot {slot}: sweep: ibv_destroy_qp: {e}");
                    mask |= failed::DESTROY_QP;
                }
            }
        }
        if mask == 0 && l.mr {
            // Not reached: the immediate phase deregistered it or fenced the slot.
            match self.dev.dereg_mr(l.region) {
                Ok(()) => l.mr = false,
                Err(_) => mask |= failed::DEREG_MR,
            }
        }
        if mask == 0 {
            match self.dev.release(l.region) {
                Ok(()) => {
                    self.slots[slot as usize] = Slot::Free { generation: l.generation };
                    return;
                }
                Err(e) => {
                    log::warn!("lease slot {slot}: sweep: release: {e}");
                    mask |= failed::DEALLOC_PD;
                }
            }
        }
        let (tenant, generation) = (l.tenant.clone(), l.generation);
        let lease = self.id(slot as usize, generation);
        self.fence(slot, mask, origin::SWEEP, now_ms);
        self.notices.push((tenant, Notice::Fenced { lease }));
    }

    fn counts(&self, tenant: Option<&str>) -> LeaseStats {
        let mut s = LeaseStats::default();
        for slot in &self.slots {
            match slot {
                Slot::Busy(l) if tenant.is_none_or(|t| t == l.tenant) => {
                    let state = match l.phase {
                        Phase::Granted { .. } => LeaseState::Granted,
                        Phase::Active => LeaseState::Active,
                        Phase::PendingDestroy { .. } => LeaseState::PendingDestroy,
                    };
                    s.by_state[state as usize] += 1;
                }
                Slot::Fenced(f) if tenant.is_none_or(|t| t == f.tenant) => s.by_state[LeaseState::Fenced as usize] += 1,
                _ => {}
            }
        }
        s.bytes_leased = self.leased_bytes(tenant);
        s.bytes_free = self.pool_bytes().saturating_sub(self.leased_bytes(None));
        s
    }

    fn fenced_count(&self) -> u32 {
        self.slots.iter().filter(|s| matches!(s, Slot::Fenced(_))).count() as u32
    }
}

/// Cuts lease `l`'s QP as `teardown` says; returns the failed-mask bit of a failure (0 when it worked).
fn cut_qp(dev: &mut dyn Device, teardown: QpTeardown, l: &mut Lease, slot: u32) -> u32 {
    let (result, next, bit) = match teardown {
        QpTeardown::Err => (dev.qp_to_err(l.region), Qp::InErr, failed::QP_TO_ERR),
        QpTeardown::Destroy => (dev.destroy_qp(l.region), Qp::Gone, failed::DESTROY_QP),
    };
    match result {
        Ok(()) => {
            l.qp = next;
            0
        }
        Err(e) => {
            log::warn!("lease slot {slot}: QP cut ({}): {e}", teardown.name());
            bit
        }
    }
}

impl Leases for VerbsLeases {
    fn boot(&mut self, boot_id: [u8; BOOT_ID_LEN]) {
        self.boot_id = boot_id;
    }

    fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        out.append(&mut self.notices);
    }

    fn lease_op(&mut self, who: &Principal, req: &Request, _ticket: Ticket, now_ms: u64) -> Answer {
        let reply = match req {
            Request::Alloc(a) => self.alloc(who, a, now_ms),
            Request::Ready { lease, client_qpn, server_qpn } => self.ready(who, *lease, *client_qpn, *server_qpn),
            Request::Renew { lease, ttl_ms } => self.renew(who, *lease, *ttl_ms, now_ms),
            Request::Free { lease } => self.end(who, *lease, Cause::Free, self.opts.order, now_ms),
            Request::Revoke { lease, qp_first } => {
                if *qp_first && !(is_admin(who) && self.opts.allow_order_override) {
                    Err(err(
                        ErrorCode::Forbidden,
                        "REVOKE: only the admin may choose the teardown order (qp_first), and only when allowed",
                    ))
                } else {
                    let order = if *qp_first { RevokeOrder::QpFirst } else { self.opts.order };
                    self.end(who, *lease, Cause::Revoke, order, now_ms)
                }
            }
            Request::Query { lease } => self.query(who, *lease, now_ms),
            Request::List { cursor, max } => self.list(who, *cursor, *max, now_ms),
            Request::Drain { .. } if !is_admin(who) => {
                Err(err(ErrorCode::Forbidden, "DRAIN: only the admin may drain the appliance"))
            }
            other => Err(err(
                ErrorCode::NotImplemented,
                &format!("{}: not served by the verbs reference responder", other.op().name()),
            )),
        };
        Answer::Now(reply)
    }

    fn session_started(&mut self, who: &Principal, _now_ms: u64) {
        if is_admin(who) {
            return;
        }
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session.is_none()
                && l.tenant == who.name
            {
                l.session = Some(who.session_id);
            }
        }
    }

    fn resume(&mut self, from: &Principal, to: &Principal, _now_ms: u64) -> u32 {
        let mut n = 0;
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.tenant == to.name
                && (l.session == Some(from.session_id) || l.session.is_none())
            {
                l.session = Some(to.session_id);
                n += 1;
            }
        }
        n
    }

    fn session_alive(&mut self, who: &Principal, now_ms: u64) {
        if !self.opts.heartbeat_renews || is_admin(who) {
            return;
        }
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(who.session_id)
                && matches!(l.phase, Phase::Granted { .. } | Phase::Active)
            {
                l.expires_at_ms = l.expires_at_ms.max(now_ms + u64::from(l.ttl_ms));
            }
        }
    }

    fn session_lost(&mut self, who: &Principal, _reason: CloseReason, now_ms: u64) {
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(who.session_id)
                && l.tenant == who.name
            {
                l.session = None;
                l.orphaned_at_ms = now_ms;
            }
        }
    }

    /// Expiries (TTL, READY deadline, a session lost for longer than `session_grace_ms=`) and sweeps.
    fn tick(&mut self, now_ms: u64) {
        let session_grace = u64::from(self.opts.session_grace_ms);
        for slot in 0..self.slots.len() as u32 {
            let Some(Slot::Busy(l)) = self.slots.get(slot as usize) else { continue };
            let expired = match l.phase {
                Phase::PendingDestroy { sweep_at_ms } => {
                    if now_ms >= sweep_at_ms {
                        self.sweep(slot, now_ms);
                    }
                    continue;
                }
                Phase::Granted { ready_by_ms } => now_ms >= ready_by_ms,
                Phase::Active => false,
            } || now_ms >= l.expires_at_ms
                || (l.session.is_none() && now_ms >= l.orphaned_at_ms + session_grace);
            if expired {
                self.cut(slot, Cause::Expiry, self.opts.order, now_ms);
            }
        }
    }

    fn lease_stats(&mut self) -> LeaseStats {
        let mut s = self.counts(None);
        s.fenced_slots = self.fenced_count();
        s.allocs = self.stats.allocs;
        s.revokes = self.stats.revokes;
        s.expiries = self.stats.expiries;
        s.alloc_us = self.stats.alloc_us.clone();
        s.revoke_us = self.stats.revoke_us.clone();
        s
    }

    fn tenant_lease_stats(&mut self, who: &Principal) -> LeaseStats {
        self.counts(Some(&who.name))
    }

    fn fenced(&mut self, who: &Principal, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>) {
        let max = usize::from(max).clamp(1, MAX_PAGE);
        let mut out = Vec::new();
        for (i, s) in self.slots.iter().enumerate().skip(cursor as usize) {
            if let Slot::Fenced(f) = s
                && (is_admin(who) || f.tenant == who.name)
            {
                if out.len() == max {
                    return (i as u32, out);
                }
                out.push(FencedSlot {
                    slot: i as u32,
                    generation: f.generation,
                    failed_mask: f.failed_mask,
                    origin: f.origin,
                    fenced_at_ms: f.at_ms,
                });
            }
        }
        (0, out)
    }

    fn health_facts(&mut self) -> LeaseHealth {
        LeaseHealth::On { by_state: self.counts(None).by_state, fenced: self.fenced_count(), detail: String::new() }
    }

    /// Completions are polled on the tick: always ticking soon.
    fn busy(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
