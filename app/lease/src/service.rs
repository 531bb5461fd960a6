//! The lease service as a sans-I/O state machine: requests and HCA results in, answers and HCA
//! commands out. It never waits: each command a lease needs is queued with a tag ([`LeaseService::next_command`]),
//! and the lease moves on when its result comes back ([`LeaseService::hca_done`]). Time comes in as
//! microseconds with every call; [`LeaseService::tick`] runs the deadlines (revoke outcome within 1 s,
//! READY, TTL, lost sessions) and the deferred sweep.
//!
//! Revocation (docs/reference/revoke-spec.md, with docs/architecture.md's change of order): the immediate phase
//! destroys the MKEY first and leaves the QP in RTS (or, configured, runs 2ERR_QP first as the spec does); if
//! DESTROY_MKEY fails, 2ERR_QP runs at once as the fallback fence. The outcome — TornDown, Fenced, NotFound — is
//! answered as soon as the immediate phase ends, and never later than the revoke deadline: a hung HCA gets Fenced.
//! After the grace period the sweep runs 2ERR_QP, 2RST_QP, DESTROY_QP, deletes the DROP entry, deallocates
//! the PD, scrubs the memory and frees the slot. Any failed step fences the slot for good.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use leasebox_mlx5::command::{CmdError, Command, Output};
use leasebox_mlx5::handles::{Cqn, FlowGroupId, FlowIndex, FlowTableId, MkeyIndex, MkeyVariant, Qpn, UarPage};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::{MkeyAccess, MkeyParams};
use leasebox_mlx5::ifc::qp::{Mtu, QpAccess, QpBase, RcPeer, RcQpParams, RtsParams};
use leasebox_proto::{
    AllocReq, AllocResp, ErrorBody, ErrorCode, FencedSlot, LeaseId, LeaseInfo, LeaseState, Outcome, Reply, Request,
    Response, access, mtu_bytes,
};

use crate::config::{Config, RevokeOrder};
use crate::lease::{Cause, FenceInfo, Lease, Phase, Slot, Step, Waiter, origin, step_bit};
use crate::pool::ExtentPool;
use crate::stats::Counters;

/// Who asks.
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    pub session: u64,
    pub tenant: &'a str,
    pub admin: bool,
}

/// The memory services the lease service needs from its host: DMA memory for QP buffers and scrubbing.
pub trait Host {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<u64>;
    fn dma_free(&mut self, addr: u64, len: usize);
    /// Writes zeros over `[addr, addr + len)` (a lease's memory before it returns to the pool).
    fn zero(&mut self, addr: u64, len: u64);
}

/// What the service needs to know about the HCA after bring-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcaCtx {
    pub uar: UarPage,
    /// The CQ every lease QP reports to (polled by the event engine).
    pub cqn: Cqn,
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// The largest IB MTU the port carries (1..=5).
    pub port_mtu: u8,
    /// The RDMA_RX table and group for per-slot DROP entries, when `Config::flow_drop` is set.
    pub flow: Option<(FlowTableId, FlowGroupId)>,
}

/// QP work-queue buffer: zero-length RQ, 64 WQEBBs of SQ (the appliance never posts; the QP only responds).
const QP_LOG_SQ: u8 = 6;
const QP_BUF: usize = 64 << QP_LOG_SQ;
const QP_DBR: usize = 64;
/// The most LIST returns in one page.
pub const LIST_MAX: usize = 128;
/// The mkey index FENCE-TEST writes before DESTROY_MKEY (docs/reference/revoke-spec.md §2.3).
pub const FENCE_TEST_MKEY_INDEX: u32 = 0x00ff_ffff;

/// The IB MTU code an Ethernet port of `oper_mtu` bytes (PMTU, L2 included) carries: the largest IB MTU
/// whose RoCEv2 packets (IPv4 20 + UDP 8 + BTH 12 + RETH 16 + ICRC 4 bytes around the payload) fit the
/// IP MTU (`oper_mtu` minus 22 bytes of L2).
pub fn port_ib_mtu(oper_mtu: u16) -> u8 {
    let ip = u32::from(oper_mtu).saturating_sub(22);
    (1..=5u8).rev().find(|&c| mtu_bytes(c).is_some_and(|b| b + 60 <= ip)).unwrap_or(1)
}

pub struct LeaseService<T: Copy> {
    cfg: Config,
    hca: HcaCtx,
    slots: Vec<Slot<T>>,
    pool: ExtentPool,
    /// Tag → slot of commands in flight.
    tags: BTreeMap<u64, u32>,
    next_tag: u64,
    outbox: VecDeque<(u64, Command)>,
    /// Commands of revokes' immediate phases: they go out before anything in `outbox`, so ALLOCs and sweeps
    /// never delay an outcome that is due within the revoke deadline.
    urgent: VecDeque<(u64, Command)>,
    answers: Vec<(T, Reply)>,
    mkey_variant: MkeyVariant,
    psn_state: u64,
    /// Free slots, oldest first (a freed slot goes to the back).
    free: VecDeque<u32>,
    /// Busy leases and bytes per tenant (budgets).
    usage: BTreeMap<String, (u32, u64)>,
    /// The timer scan runs at most this often.
    next_scan_us: u64,
    pub counters: Counters,
}

/// How often [`LeaseService::tick`] walks the table for deadlines (the revoke deadline is 1 s; READY, TTL and
/// grace timers are coarser).
pub const SCAN_INTERVAL_US: u64 = 1_000;

fn err(code: ErrorCode, msg: &str) -> ErrorBody {
    ErrorBody::new(code, msg)
}

fn bad(field: &str, why: &str) -> ErrorBody {
    err(ErrorCode::BadParam, &format!("ALLOC: field '{field}' {why}"))
}

fn hca_error(e: &CmdError) -> ErrorBody {
    ErrorBody::new(ErrorCode::HcaError, &format!("{e}")).with_detail([
        (u32::from(e.opcode) << 16) | u32::from(e.op_mod),
        u32::from(e.status_or_aborted()),
        e.syndrome().unwrap_or(0),
    ])
}

impl<T: Copy> LeaseService<T> {
    pub fn new(cfg: Config, hca: HcaCtx) -> Result<Self, crate::config::ConfigError> {
        cfg.check()?;
        let cfg_slots = cfg.slots;
        let slots = (0..cfg.slots).map(|_| Slot::Free { next_generation: 1 }).collect();
        let pool = ExtentPool::new(&cfg.pool, cfg.extent);
        let psn_state = cfg.psn_seed | 1;
        Ok(LeaseService {
            cfg,
            hca,
            slots,
            pool,
            tags: BTreeMap::new(),
            next_tag: 1,
            outbox: VecDeque::new(),
            urgent: VecDeque::new(),
            answers: Vec::new(),
            mkey_variant: MkeyVariant::default(),
            psn_state,
            free: (0..cfg_slots).collect(),
            usage: BTreeMap::new(),
            next_scan_us: 0,
            counters: Counters::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The next HCA command to submit, with its tag.
    pub fn next_command(&mut self) -> Option<(u64, Command)> {
        self.urgent.pop_front().or_else(|| self.outbox.pop_front())
    }

    /// Puts a command back at the front (the submit ring was full).
    pub fn unsend(&mut self, tag: u64, cmd: Command) {
        // Back where it came from, at the front: an immediate-phase command goes back to the urgent queue.
        let urgent = self
            .tags
            .get(&tag)
            .and_then(|&slot| self.lease(slot))
            .is_some_and(|l| matches!(l.phase, Phase::Fencing { .. }));
        if urgent { self.urgent.push_front((tag, cmd)) } else { self.outbox.push_front((tag, cmd)) }
    }

    pub fn has_commands(&self) -> bool {
        !self.outbox.is_empty() || !self.urgent.is_empty()
    }

    /// Answers ready since the last call.
    pub fn take_answers(&mut self, out: &mut Vec<(T, Reply)>) {
        out.append(&mut self.answers);
    }

    /// Commands issued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.tags.len()
    }

    pub fn pool(&self) -> &ExtentPool {
        &self.pool
    }

    fn next_psn(&mut self) -> u32 {
        // xorshift64: unpredictable enough for initial PSNs, which only need to differ between leases.
        let mut x = self.psn_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.psn_state = x;
        (x >> 20) as u32 & 0xff_ffff
    }

    fn lease(&self, slot: u32) -> Option<&Lease<T>> {
        match self.slots.get(slot as usize) {
            Some(Slot::Busy(l)) => Some(l),
            _ => None,
        }
    }

    fn lease_mut(&mut self, slot: u32) -> Option<&mut Lease<T>> {
        match self.slots.get_mut(slot as usize) {
            Some(Slot::Busy(l)) => Some(l),
            _ => None,
        }
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
            Request::Ready { lease, client_qpn, server_qpn } => Some(self.ready(who, *lease, *client_qpn, *server_qpn)),
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
            Request::List { cursor, max } => Some(self.list(who, *cursor, *max, now_us)),
            other => Some(Err(err(ErrorCode::UnknownOp, &format!("{} is not a lease operation", other.op().name())))),
        }
    }

    // ---- ALLOC ----

    fn alloc(&mut self, who: Who<'_>, a: &AllocReq, ticket: T, now_us: u64, host: &mut dyn Host) -> Option<Reply> {
        if let Err(e) = self.check_alloc(a) {
            return Some(Err(e));
        }
        let extents_needed = a.size.div_ceil(self.cfg.extent);
        let (mine, my_bytes) = self.tenant_usage(who.tenant);
        if mine >= self.cfg.tenant_leases {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("tenant has {mine} leases, the limit is {}", self.cfg.tenant_leases),
            )
            .with_detail([mine, self.cfg.tenant_leases, 0])));
        }
        let bytes = extents_needed * self.cfg.extent;
        if my_bytes.saturating_add(bytes) > self.cfg.tenant_bytes {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("tenant would hold {} bytes, the limit is {}", my_bytes + bytes, self.cfg.tenant_bytes),
            )));
        }
        let Some(slot) = self.slots.iter().position(|s| matches!(s, Slot::Free { .. })) else {
            return Some(Err(err(
                ErrorCode::Limit,
                &format!("all {} lease slots are in use or fenced", self.cfg.slots),
            )));
        };
        let Some(extents) = self.pool.take(extents_needed as usize) else {
            return Some(Err(err(
                ErrorCode::NoMemory,
                &format!("{} bytes asked, {} free in the pool", a.size, self.pool.free_bytes()),
            )));
        };
        let qp_buf = host.dma_alloc(QP_BUF, 4096);
        let qp_dbr = host.dma_alloc(QP_DBR, 64);
        let (Some(qp_buf), Some(qp_dbr)) = (qp_buf, qp_dbr) else {
            if let Some(b) = qp_buf {
                host.dma_free(b, QP_BUF);
            }
            if let Some(d) = qp_dbr {
                host.dma_free(d, QP_DBR);
            }
            self.pool.give_back(&extents);
            return Some(Err(err(ErrorCode::NoMemory, "no DMA memory for the QP's work queue")));
        };
        let Slot::Free { next_generation } = self.slots[slot] else { return None };
        let id = LeaseId { slot: slot as u32, generation: next_generation };
        let mtu = a.mtu.min(self.hca.port_mtu);
        let ttl_ms = if a.ttl_ms == 0 { self.cfg.default_ttl_ms } else { a.ttl_ms };
        let server_psn = self.next_psn();
        let lease = Lease {
            id,
            tenant: who.tenant.to_string(),
            session: Some(who.session),
            orphaned_at: None,
            reconnects: 0,
            phase: Phase::Building,
            size: a.size,
            access: a.access,
            mtu,
            ttl_ms,
            expires_at: now_us + u64::from(ttl_ms) * 1000,
            client_qpn: a.client_qpn,
            client_psn: a.client_psn,
            client_gid: a.client_gid,
            client_mac: a.client_mac,
            server_psn,
            extents,
            qp_buf,
            qp_dbr,
            pd: None,
            mkey: None,
            qpn: None,
            drop_entry: None,
            qp_in_err: false,
            variant: 0,
            plan: alloc::vec![
                Step::AllocPd,
                Step::CreateMkey,
                Step::CreateQp,
                Step::Rst2Init,
                Step::Init2Rtr,
                Step::Rtr2Rts
            ],
            in_flight: None,
            cause: None,
            waiters: Vec::new(),
            alloc_ticket: Some((ticket, now_us)),
            failed_mask: 0,
            failure: String::new(),
        };
        self.slots[slot] = Slot::Busy(lease);
        self.free.pop_front();
        let u = self.usage.entry(who.tenant.to_string()).or_default();
        u.0 += 1;
        u.1 += bytes;
        self.counters.allocs_started += 1;
        self.advance(slot as u32, now_us, host);
        None
    }

    fn check_alloc(&self, a: &AllocReq) -> Result<(), ErrorBody> {
        if a.size == 0 {
            return Err(bad("alloc.size", "must be at least 1 byte"));
        }
        if a.size > self.cfg.max_lease() {
            return Err(bad(
                "alloc.size",
                &format!("must be at most {} bytes (the largest lease)", self.cfg.max_lease()),
            ));
        }
        if a.size > self.cfg.pool_bytes() {
            return Err(err(
                ErrorCode::NoMemory,
                &format!("{} bytes asked, the pool holds {}", a.size, self.cfg.pool_bytes()),
            ));
        }
        if a.access == 0 || a.access & !access::ALL != 0 {
            return Err(bad("alloc.access", "must be a non-empty set of REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC"));
        }
        if mtu_bytes(a.mtu).is_none() {
            return Err(bad("alloc.mtu", "must be an IB MTU code from 1 (256) to 5 (4096)"));
        }
        if a.client_qpn == 0 || a.client_qpn > 0xff_ffff {
            return Err(bad("alloc.client_qpn", "must be a 24-bit QPN other than 0"));
        }
        if a.client_psn > 0xff_ffff {
            return Err(bad("alloc.client_psn", "must be a 24-bit PSN"));
        }
        if a.client_gid == [0; 16] {
            return Err(bad("alloc.client_gid", "must be the client's GID"));
        }
        if a.client_mac == [0; 6] || a.client_mac[0] & 1 != 0 {
            return Err(bad("alloc.client_mac", "must be a unicast MAC (the client's next hop)"));
        }
        if a.ttl_ms > self.cfg.max_ttl_ms {
            return Err(bad("alloc.ttl_ms", &format!("must be at most {} ms", self.cfg.max_ttl_ms)));
        }
        Ok(())
    }

    fn tenant_usage(&self, tenant: &str) -> (u32, u64) {
        self.usage.get(tenant).copied().unwrap_or_default()
    }

    /// A busy lease leaves the table (freed or fenced): its tenant's budget gets it back.
    fn unbook(&mut self, tenant: &str, extents: usize) {
        let bytes = extents as u64 * self.cfg.extent;
        if let Some(u) = self.usage.get_mut(tenant) {
            u.0 = u.0.saturating_sub(1);
            u.1 = u.1.saturating_sub(bytes);
            if u.0 == 0 {
                self.usage.remove(tenant);
            }
        }
    }

    /// Issues the lease's next planned step, or finishes the phase when the plan is empty.
    fn advance(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        let hca = self.hca;
        let cfg_fence_test = self.cfg.fence_test;
        let cfg_timers = (self.cfg.ack_timeout, self.cfg.retry_count, self.cfg.rnr_retry);
        loop {
            let variant = self.mkey_variant.peek();
            let extent_log = self.cfg.extent.trailing_zeros() as u8;
            let Some(l) = self.lease_mut(slot) else { return };
            if l.in_flight.is_some() {
                return;
            }
            if l.plan.is_empty() {
                break;
            }
            let step = l.plan.remove(0);
            let cmd = match step {
                Step::AllocPd => Some(ifc::resources::alloc_pd()),
                Step::CreateMkey => {
                    let mut a = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE;
                    if l.access & access::REMOTE_READ != 0 {
                        a = a | MkeyAccess::REMOTE_READ;
                    }
                    if l.access & access::REMOTE_WRITE != 0 {
                        a = a | MkeyAccess::REMOTE_WRITE;
                    }
                    if l.access & access::REMOTE_ATOMIC != 0 {
                        a = a | MkeyAccess::ATOMIC;
                    }
                    l.pd.map(|pd| {
                        ifc::mkey::create_mkey_mtt(&MkeyParams {
                            pd,
                            variant,
                            start: l.extents[0],
                            len: l.size,
                            access: a,
                            log_page_size: extent_log,
                            pages: &l.extents,
                        })
                        .with("slot", u64::from(slot))
                    })
                }
                Step::CreateQp => l.pd.map(|pd| {
                    ifc::qp::create_rc_qp(&RcQpParams {
                        pd,
                        uar_page: hca.uar,
                        cqn_snd: hca.cqn,
                        cqn_rcv: hca.cqn,
                        log_rq_size: None,
                        log_rq_stride: 0,
                        log_sq_size: QP_LOG_SQ,
                        log_msg_max: 30,
                        log_page_size: 0,
                        dbr_addr: l.qp_dbr,
                        pages: &[l.qp_buf],
                    })
                    .with("slot", u64::from(slot))
                }),
                Step::Rst2Init => qp_base(l, &hca).map(|b| {
                    ifc::qp::rst2init(
                        &b,
                        QpAccess {
                            remote_read: l.access & access::REMOTE_READ != 0,
                            remote_write: l.access & access::REMOTE_WRITE != 0,
                            remote_atomic: l.access & access::REMOTE_ATOMIC != 0,
                        },
                    )
                }),
                Step::Init2Rtr => qp_base(l, &hca).map(|b| {
                    let peer = RcPeer {
                        qpn: Qpn(l.client_qpn),
                        psn: l.client_psn,
                        gid: l.client_gid,
                        mac: l.client_mac,
                        mtu: Mtu::from_raw(l.mtu).unwrap_or(Mtu::Mtu1024),
                        sgid_index: hca.gid_index,
                        hop_limit: 64,
                        udp_sport: ifc::qp::roce_udp_sport(b.qpn, Qpn(l.client_qpn)),
                        tclass: 0,
                        eth_prio: 0,
                        log_rra_max: 4,
                        min_rnr_nak: 12,
                    };
                    ifc::qp::init2rtr(&b, &peer, 30)
                }),
                Step::Rtr2Rts => qp_base(l, &hca).map(|b| {
                    ifc::qp::rtr2rts(
                        &b,
                        &RtsParams {
                            psn: l.server_psn,
                            ack_timeout: cfg_timers.0,
                            retry_count: cfg_timers.1,
                            rnr_retry: cfg_timers.2,
                            log_sra_max: 0,
                        },
                    )
                }),
                Step::DestroyMkey => l.mkey.map(|k| {
                    let revoking = matches!(l.phase, Phase::Fencing { .. });
                    let index = if cfg!(feature = "fence-test") && cfg_fence_test && revoking {
                        MkeyIndex(FENCE_TEST_MKEY_INDEX)
                    } else {
                        k.index()
                    };
                    ifc::mkey::destroy_mkey(index).with("slot", u64::from(slot))
                }),
                Step::Qp2Err => l.qpn.map(ifc::qp::qp_2err),
                Step::Qp2Rst => l.qpn.map(ifc::qp::qp_2rst),
                Step::DestroyQp => l.qpn.map(ifc::qp::destroy_qp),
                Step::SetDrop => match (hca.flow, l.qpn) {
                    (Some((table, group)), Some(qpn)) => Some(ifc::flow::set_fte_bth_dst_qp(
                        ifc::flow::FS_FT_RDMA_RX,
                        table,
                        group,
                        FlowIndex(slot),
                        qpn,
                        ifc::flow::MLX5_FLOW_CONTEXT_ACTION_DROP,
                    )),
                    _ => None,
                },
                Step::DeleteDrop => match (hca.flow, l.drop_entry) {
                    (Some((table, _)), Some(index)) => {
                        Some(ifc::flow::delete_fte(ifc::flow::FS_FT_RDMA_RX, table, index))
                    }
                    _ => None,
                },
                Step::DeallocPd => l.pd.map(ifc::resources::dealloc_pd),
            };
            if step == Step::CreateMkey {
                l.variant = variant;
            }
            let Some(cmd) = cmd else { continue };
            if step == Step::CreateMkey {
                self.mkey_variant.take();
            }
            let tag = self.next_tag;
            self.next_tag += 1;
            if let Some(l) = self.lease_mut(slot) {
                l.in_flight = Some((tag, step));
            }
            self.tags.insert(tag, slot);
            let urgent = self.lease(slot).is_some_and(|l| matches!(l.phase, Phase::Fencing { .. }));
            if urgent {
                self.urgent.push_back((tag, cmd));
            } else {
                self.outbox.push_back((tag, cmd));
            }
            self.counters.commands += 1;
            return;
        }
        self.phase_done(slot, now_us, host);
    }

    /// A command finished.
    pub fn hca_done(&mut self, tag: u64, result: Result<Output, CmdError>, now_us: u64, host: &mut dyn Host) {
        let Some(slot) = self.tags.remove(&tag) else { return };
        let fenced = matches!(self.slots.get(slot as usize), Some(Slot::Fenced(_)));
        if fenced {
            // A late completion for a slot already fenced (its revoke deadline passed): it stays fenced.
            return;
        }
        let Some(l) = self.lease_mut(slot) else { return };
        let Some((t, step)) = l.in_flight.take() else { return };
        if t != tag {
            return;
        }
        match result {
            Ok(out) => {
                match step {
                    Step::AllocPd => l.pd = Some(ifc::resources::parse_alloc_pd(&out)),
                    Step::CreateMkey => l.mkey = Some(ifc::mkey::create_mkey_out_key(&out, l.variant)),
                    Step::CreateQp => l.qpn = Some(ifc::qp::create_qp_out(&out)),
                    Step::DestroyMkey => l.mkey = None,
                    Step::Qp2Err => l.qp_in_err = true,
                    Step::SetDrop => l.drop_entry = Some(FlowIndex(slot)),
                    Step::DeleteDrop => l.drop_entry = None,
                    Step::DestroyQp => l.qpn = None,
                    Step::DeallocPd => l.pd = None,
                    _ => {}
                }
                self.advance(slot, now_us, host);
            }
            Err(e) => self.step_failed(slot, step, &e, now_us, host),
        }
    }

    fn step_failed(&mut self, slot: u32, step: Step, e: &CmdError, now_us: u64, host: &mut dyn Host) {
        self.counters.failed_commands += 1;
        let Some(l) = self.lease_mut(slot) else { return };
        if l.failure.is_empty() {
            l.failure = format!("{e}");
        }
        match l.phase {
            Phase::Building => {
                // Undo what exists; answer the error now.
                if let Some((ticket, since)) = l.alloc_ticket.take() {
                    self.answers.push((ticket, Err(hca_error(e))));
                    self.counters.alloc_us.record(now_us.saturating_sub(since));
                }
                let Some(l) = self.lease_mut(slot) else { return };
                l.phase = Phase::Unwinding;
                l.plan = teardown_plan(l, false);
                self.advance(slot, now_us, host);
            }
            Phase::Fencing { .. } => {
                if step == Step::SetDrop {
                    // Best effort: a DROP entry that cannot be set costs latency, not safety.
                    self.counters.drop_failures += 1;
                    self.advance(slot, now_us, host);
                    return;
                }
                l.failed_mask |= step.bit();
                if step == Step::DestroyMkey && !l.qp_in_err {
                    // The fallback fence: the QP to ERR at once, so the key's memory is cut off anyway.
                    l.plan.clear();
                    l.plan.push(Step::Qp2Err);
                    self.advance(slot, now_us, host);
                } else {
                    l.plan.clear();
                    let origin = l.cause.map_or(origin::REVOKE, Cause::origin);
                    self.fence(slot, origin, now_us);
                }
            }
            Phase::Sweeping => {
                l.failed_mask |= step.bit();
                self.fence(slot, origin::SWEEP, now_us);
            }
            Phase::Unwinding => {
                l.failed_mask |= step.bit() | step_bit::UNWIND;
                self.fence(slot, origin::LEGACY, now_us);
            }
            _ => {}
        }
    }

    /// The plan of the current phase ran out.
    fn phase_done(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        let grace = self.cfg.grace_ms * 1000;
        let ready_timeout = self.cfg.ready_timeout_ms * 1000;
        let gid = self.hca.gid;
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        match l.phase {
            Phase::Building => {
                l.phase = Phase::Granted { ready_by: now_us + ready_timeout };
                let resp = AllocResp {
                    lease: l.id,
                    rkey: l.mkey.map_or(0, |k| k.0),
                    remote_addr: l.extents[0],
                    length: l.size,
                    server_qpn: l.qpn.map_or(0, |q| q.0),
                    server_psn: l.server_psn,
                    server_gid: gid,
                    mtu: l.mtu,
                    ttl_ms: l.ttl_ms,
                };
                if let Some((ticket, since)) = l.alloc_ticket.take() {
                    self.answers.push((ticket, Ok(Response::Alloc(resp))));
                    self.counters.alloc_us.record(now_us.saturating_sub(since));
                }
                self.counters.allocs += 1;
            }
            Phase::Fencing { .. } => {
                // The immediate phase is over: the QP can no longer reach the memory through this key.
                let fenced = l.failed_mask != 0;
                if fenced {
                    let origin = l.cause.map_or(origin::REVOKE, Cause::origin);
                    self.fence(slot, origin, now_us);
                } else {
                    l.phase = Phase::PendingDestroy { at: now_us + grace };
                    self.answer_waiters(slot, Outcome::TornDown, now_us);
                }
            }
            Phase::Sweeping | Phase::Unwinding => self.release(slot, host),
            _ => {}
        }
    }

    fn answer_waiters(&mut self, slot: u32, outcome: Outcome, now_us: u64) {
        let waiters = match self.lease_mut(slot) {
            Some(l) => core::mem::take(&mut l.waiters),
            None => return,
        };
        for w in waiters {
            self.reply_outcome(w, outcome, now_us);
        }
    }

    fn reply_outcome(&mut self, w: Waiter<T>, outcome: Outcome, now_us: u64) {
        let elapsed = now_us.saturating_sub(w.since_us);
        self.counters.revoke_us.record(elapsed);
        let elapsed_us = elapsed.min(u64::from(u32::MAX)) as u32;
        let r = if w.free { Response::Free { outcome, elapsed_us } } else { Response::Revoke { outcome, elapsed_us } };
        self.answers.push((w.ticket, Ok(r)));
    }

    /// Fences `slot` for good: its memory and the slot are never reused until reboot.
    fn fence(&mut self, slot: u32, origin: u8, now_us: u64) {
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        let waiters = core::mem::take(&mut l.waiters);
        let alloc_ticket = l.alloc_ticket.take();
        let info = FenceInfo {
            generation: l.id.generation,
            failed_mask: l.failed_mask,
            origin,
            at_ms: now_us / 1000,
            tenant: l.tenant.clone(),
            detail: core::mem::take(&mut l.failure),
        };
        if let Some((tag, _)) = l.in_flight {
            // Keep the tag mapped so a late completion finds the fence and is ignored.
            self.tags.insert(tag, slot);
        }
        self.pool.quarantine(l.extents.len());
        let (tenant, n) = (core::mem::take(&mut l.tenant), l.extents.len());
        self.slots[slot as usize] = Slot::Fenced(info);
        self.unbook(&tenant, n);
        self.counters.fenced += 1;
        for w in waiters {
            self.reply_outcome(w, Outcome::Fenced, now_us);
        }
        if let Some((ticket, _)) = alloc_ticket {
            self.answers
                .push((ticket, Err(err(ErrorCode::HcaError, "the lease's slot was fenced while it was built"))));
        }
    }

    /// The sweep or an unwind finished: scrub, free the memory, free the slot.
    fn release(&mut self, slot: u32, host: &mut dyn Host) {
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        for &e in &l.extents {
            host.zero(e, self.cfg.extent);
        }
        self.pool.give_back(&l.extents);
        host.dma_free(l.qp_buf, QP_BUF);
        host.dma_free(l.qp_dbr, QP_DBR);
        let next_generation = l.id.generation.wrapping_add(1).max(1);
        let (tenant, n) = (core::mem::take(&mut l.tenant), l.extents.len());
        self.slots[slot as usize] = Slot::Free { next_generation };
        self.free.push_back(slot);
        self.unbook(&tenant, n);
        self.counters.swept += 1;
    }

    // ---- READY, RENEW, QUERY, LIST ----

    /// The lease `id` if `who` may see it: `Err` NOT_FOUND for a free or other tenant's slot, STALE for an
    /// older generation.
    fn owned(&self, who: Who<'_>, id: LeaseId) -> Result<&Lease<T>, ErrorBody> {
        match self.slots.get(id.slot as usize) {
            Some(Slot::Busy(l)) if who.admin || l.tenant == who.tenant => {
                if l.id.generation == id.generation {
                    Ok(l)
                } else {
                    Err(err(
                        ErrorCode::Stale,
                        &format!(
                            "lease {}:{} is stale (slot now at generation {})",
                            id.slot, id.generation, l.id.generation
                        ),
                    )
                    .with_detail([l.id.generation, 0, 0]))
                }
            }
            _ => Err(err(ErrorCode::NotFound, &format!("no lease {}:{}", id.slot, id.generation))),
        }
    }

    fn ready(&mut self, who: Who<'_>, id: LeaseId, client_qpn: u32, server_qpn: u32) -> Reply {
        let l = self.owned(who, id)?;
        if l.qpn.map(|q| q.0) != Some(server_qpn) || l.client_qpn != client_qpn {
            return Err(err(
                ErrorCode::BadParam,
                &format!(
                    "READY: QPNs do not match the lease (client {:#x}, server {:#x})",
                    l.client_qpn,
                    l.qpn.map_or(0, |q| q.0)
                ),
            ));
        }
        match l.phase {
            Phase::Granted { .. } | Phase::Active => {
                let slot = id.slot;
                if let Some(l) = self.lease_mut(slot) {
                    l.phase = Phase::Active;
                }
                Ok(Response::Ready { state: LeaseState::Active })
            }
            _ => Err(err(ErrorCode::BadState, &format!("READY: lease is {}", l.state().name()))),
        }
    }

    fn renew(&mut self, who: Who<'_>, id: LeaseId, ttl_ms: u32, now_us: u64) -> Reply {
        let max = self.cfg.max_ttl_ms;
        let default = self.cfg.default_ttl_ms;
        let l = self.owned(who, id)?;
        if !matches!(l.phase, Phase::Granted { .. } | Phase::Active) {
            return Err(err(ErrorCode::BadState, &format!("RENEW: lease is {}", l.state().name())));
        }
        if ttl_ms > max {
            return Err(err(ErrorCode::BadParam, &format!("RENEW: field 'renew.ttl_ms' must be at most {max} ms")));
        }
        let ttl = if ttl_ms == 0 { default } else { ttl_ms };
        if let Some(l) = self.lease_mut(id.slot) {
            l.ttl_ms = ttl;
            l.expires_at = now_us + u64::from(ttl) * 1000;
        }
        Ok(Response::Renew { ttl_ms: ttl })
    }

    fn info(l: &Lease<T>, now_us: u64) -> LeaseInfo {
        LeaseInfo {
            lease: l.id,
            state: l.state(),
            access: l.access,
            mtu: l.mtu,
            size: l.size,
            rkey: l.mkey.map_or(0, |k| k.0),
            server_qpn: l.qpn.map_or(0, |q| q.0),
            client_qpn: l.client_qpn,
            ttl_left_ms: (l.expires_at.saturating_sub(now_us) / 1000).min(u64::from(u32::MAX)) as u32,
            tenant: l.tenant.clone(),
        }
    }

    fn query(&self, who: Who<'_>, id: LeaseId, now_us: u64) -> Reply {
        self.owned(who, id).map(|l| Response::Query(Self::info(l, now_us)))
    }

    fn list(&self, who: Who<'_>, cursor: u32, max: u16, now_us: u64) -> Reply {
        let max = usize::from(max).clamp(1, LIST_MAX);
        let mut leases = Vec::new();
        let mut next_cursor = 0;
        for (i, s) in self.slots.iter().enumerate().skip(cursor as usize) {
            if let Slot::Busy(l) = s
                && (who.admin || l.tenant == who.tenant)
            {
                if leases.len() == max {
                    next_cursor = i as u32;
                    break;
                }
                leases.push(Self::info(l, now_us));
            }
        }
        Ok(Response::List { next_cursor, leases })
    }

    /// FENCED_SUMMARY: fenced slots (a tenant sees its own).
    pub fn fenced(&self, who: Who<'_>) -> Vec<FencedSlot> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Fenced(f) if who.admin || f.tenant == who.tenant => Some(FencedSlot {
                    slot: i as u32,
                    generation: f.generation,
                    failed_mask: f.failed_mask,
                    origin: f.origin,
                    fenced_at_ms: f.at_ms,
                }),
                _ => None,
            })
            .collect()
    }

    /// Why a fenced slot was fenced (diagnostics).
    pub fn fence_info(&self, slot: u32) -> Option<&FenceInfo> {
        match self.slots.get(slot as usize) {
            Some(Slot::Fenced(f)) => Some(f),
            _ => None,
        }
    }

    // ---- FREE / REVOKE / EXPIRY ----

    #[allow(clippy::too_many_arguments)]
    fn revoke(
        &mut self,
        who: Who<'_>,
        id: LeaseId,
        cause: Cause,
        order: Option<RevokeOrder>,
        ticket: T,
        now_us: u64,
        host: &mut dyn Host,
    ) -> Option<Reply> {
        let free = cause == Cause::Free;
        let answer = |outcome| {
            Some(Ok(if free {
                Response::Free { outcome, elapsed_us: 0 }
            } else {
                Response::Revoke { outcome, elapsed_us: 0 }
            }))
        };
        match self.slots.get(id.slot as usize) {
            Some(Slot::Busy(l)) if who.admin || l.tenant == who.tenant => {
                if l.id.generation != id.generation {
                    return answer(Outcome::NotFound);
                }
                match l.phase {
                    Phase::Fencing { .. } => {
                        // Idempotent: the same outcome as the revoke in progress.
                        if let Some(l) = self.lease_mut(id.slot) {
                            l.waiters.push(Waiter { ticket, free, since_us: now_us });
                        }
                        None
                    }
                    Phase::PendingDestroy { .. } | Phase::Sweeping | Phase::Unwinding => answer(Outcome::TornDown),
                    Phase::Building => Some(Err(err(
                        ErrorCode::BadState,
                        "the lease is still being granted; revoke it once ALLOC has answered",
                    ))),
                    Phase::Granted { .. } | Phase::Active => {
                        self.start_revoke(
                            id.slot,
                            cause,
                            order,
                            Some(Waiter { ticket, free, since_us: now_us }),
                            now_us,
                        );
                        self.advance(id.slot, now_us, host);
                        None
                    }
                }
            }
            Some(Slot::Fenced(f)) if (who.admin || f.tenant == who.tenant) && f.generation == id.generation => {
                answer(Outcome::Fenced)
            }
            _ => answer(Outcome::NotFound),
        }
    }

    /// Starts the immediate phase (its commands go out on the next `advance`).
    fn start_revoke(
        &mut self,
        slot: u32,
        cause: Cause,
        order: Option<RevokeOrder>,
        waiter: Option<Waiter<T>>,
        now_us: u64,
    ) {
        let order = order.unwrap_or(self.cfg.order);
        let deadline = now_us + self.cfg.revoke_deadline_ms * 1000;
        let flow = self.cfg.flow_drop && self.hca.flow.is_some();
        let Some(l) = self.lease_mut(slot) else { return };
        l.phase = Phase::Fencing { deadline };
        l.cause = Some(cause);
        if let Some(w) = waiter {
            l.waiters.push(w);
        }
        l.plan = match order {
            RevokeOrder::MkeyFirst => alloc::vec![Step::DestroyMkey],
            RevokeOrder::QpFirst => alloc::vec![Step::Qp2Err, Step::DestroyMkey],
        };
        if flow {
            l.plan.push(Step::SetDrop);
        }
        self.counters.revokes += 1;
        if cause == Cause::Expiry {
            self.counters.expiries += 1;
        }
    }

    /// Timers: the revoke deadline, READY deadlines, TTLs, lost sessions, and the deferred sweep. Also issues
    /// the commands that revokes started since the last call.
    pub fn tick(&mut self, now_us: u64, host: &mut dyn Host) {
        if now_us < self.next_scan_us {
            return;
        }
        self.next_scan_us = now_us + SCAN_INTERVAL_US;
        let session_grace = self.cfg.session_grace_ms * 1000;
        for slot in 0..self.slots.len() as u32 {
            let Some(l) = self.lease(slot) else { continue };
            match l.phase {
                Phase::Fencing { deadline } => {
                    if l.in_flight.is_none() {
                        self.advance(slot, now_us, host);
                    } else if now_us >= deadline {
                        // The HCA has not answered: fail closed now, do not wait for the command timeout.
                        if let Some(l) = self.lease_mut(slot) {
                            l.failed_mask |= step_bit::DEADLINE;
                            if l.failure.is_empty() {
                                l.failure = String::from("no answer from the HCA within the revoke deadline");
                            }
                        }
                        let origin = l_origin(self.lease(slot));
                        self.fence(slot, origin, now_us);
                    }
                }
                Phase::Granted { ready_by } if now_us >= ready_by => {
                    self.start_revoke(slot, Cause::Expiry, None, None, now_us);
                    self.advance(slot, now_us, host);
                }
                Phase::Granted { .. } | Phase::Active => {
                    let expired = now_us >= l.expires_at;
                    let abandoned = l.orphaned_at.is_some_and(|t| now_us >= t + session_grace);
                    if expired || abandoned {
                        self.start_revoke(slot, Cause::Expiry, None, None, now_us);
                        self.advance(slot, now_us, host);
                    }
                }
                Phase::PendingDestroy { at } if now_us >= at => {
                    let Some(l) = self.lease_mut(slot) else { continue };
                    l.phase = Phase::Sweeping;
                    l.plan = teardown_plan(l, true);
                    self.advance(slot, now_us, host);
                }
                _ => {}
            }
        }
    }

    /// Revokes every live lease (an HCA that died, or shutdown): each gets its immediate phase.
    pub fn revoke_all(&mut self, now_us: u64, host: &mut dyn Host) {
        for slot in 0..self.slots.len() as u32 {
            if self.lease(slot).is_some_and(|l| matches!(l.phase, Phase::Granted { .. } | Phase::Active)) {
                self.start_revoke(slot, Cause::Expiry, None, None, now_us);
                self.advance(slot, now_us, host);
            }
        }
    }

    // ---- sessions ----

    /// A session ended: its leases stay for the session grace period, then expire.
    pub fn session_lost(&mut self, session: u64, now_us: u64) {
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(session)
            {
                l.session = None;
                l.orphaned_at = Some(now_us);
            }
        }
    }

    /// A session of `tenant` started: orphaned leases of that tenant are resumed by it (RTRS's reconnect
    /// counter: each resume counts). Returns how many.
    pub fn session_started(&mut self, session: u64, tenant: &str) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session.is_none()
                && l.tenant == tenant
            {
                l.session = Some(session);
                l.orphaned_at = None;
                l.reconnects += 1;
                n += 1;
            }
        }
        self.counters.reconnects += n as u64;
        n
    }

    /// A heartbeat from `session`: renews its leases' TTL when configured.
    pub fn session_alive(&mut self, session: u64, now_us: u64) {
        if !self.cfg.heartbeat_renews {
            return;
        }
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(session)
                && matches!(l.phase, Phase::Granted { .. } | Phase::Active)
            {
                l.expires_at = l.expires_at.max(now_us + u64::from(l.ttl_ms) * 1000);
            }
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

    /// Free slots (neither busy nor fenced).
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
}

fn l_origin<T>(l: Option<&Lease<T>>) -> u8 {
    l.and_then(|l| l.cause).map_or(origin::REVOKE, Cause::origin)
}

fn qp_base<T>(l: &Lease<T>, hca: &HcaCtx) -> Option<QpBase> {
    Some(QpBase { qpn: l.qpn?, pd: l.pd?, cqn_snd: hca.cqn, cqn_rcv: hca.cqn })
}

/// What destroys a lease's objects, in order: the QP to ERR unless it is there already, to RESET, destroyed;
/// the MKEY if still there; the DROP entry; the PD.
fn teardown_plan<T>(l: &Lease<T>, sweep: bool) -> Vec<Step> {
    let mut plan = Vec::new();
    if l.qpn.is_some() {
        if !l.qp_in_err && sweep {
            plan.push(Step::Qp2Err);
        }
        plan.push(Step::Qp2Rst);
        plan.push(Step::DestroyQp);
    }
    if l.mkey.is_some() {
        plan.push(Step::DestroyMkey);
    }
    if l.drop_entry.is_some() {
        plan.push(Step::DeleteDrop);
    }
    if l.pd.is_some() {
        plan.push(Step::DeallocPd);
    }
    plan
}
