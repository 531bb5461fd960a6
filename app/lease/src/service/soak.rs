//! The lease soak ("counters at their limits"): a million leases churned through the lease service on
//! a virtual clock, against a fake HCA that fails commands, answers some late and a few never within the revoke
//! deadline, while the tenants' control sessions are lost and come back (at once, by RESUME, or too late).
//!
//! It drives the [`LeaseService`] the hosted appliance runs, directly: the calls `LeaseBackend` makes for the
//! session core (requests, `session_started`/`session_lost`/`resume`, heartbeats, the timer tick, the scrub),
//! and what `Link::step` does with the engine's client, reproduced here (at most [`RING`] commands outstanding,
//! results by tag). No session core, `LeaseBackend`, `Link`, engine or model runs. The fake HCA is its own oracle: it hands out PDs, MKEY
//! indices and QPNs lowest-free first as firmware does, refuses a command on a handle it does not hold, and
//! remembers which slot made each object, so at the end every object still alive must belong to a fenced slot.
//!
//! At the end everything returns to its baseline: the pool's bytes are free or quarantined (a fenced slot's),
//! the slots are free or fenced, no PD, MKEY or QP is left but a fenced slot's, the only DMA memory held is
//! the fenced slots' QP buffers, no tenant is charged for anything; and no fenced slot was ever used again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use leasebox_mlx5::command::{CmdError, Command, ErrorKind, Output};
use leasebox_mlx5::handles::{Cqn, UarPage};
use leasebox_mlx5::ifc::mkey::{MKC, mkc};
use leasebox_mlx5::ifc::opcode::{
    MLX5_CMD_OP_2ERR_QP as QP_2ERR, MLX5_CMD_OP_2RST_QP as QP_2RST, MLX5_CMD_OP_ALLOC_PD as ALLOC_PD,
    MLX5_CMD_OP_CREATE_MKEY as CREATE_MKEY, MLX5_CMD_OP_CREATE_QP as CREATE_QP, MLX5_CMD_OP_DEALLOC_PD as DEALLOC_PD,
    MLX5_CMD_OP_DESTROY_MKEY as DESTROY_MKEY, MLX5_CMD_OP_DESTROY_QP as DESTROY_QP,
    MLX5_CMD_OP_INIT2RTR_QP as INIT2RTR, MLX5_CMD_OP_RST2INIT_QP as RST2INIT, MLX5_CMD_OP_RTR2RTS_QP as RTR2RTS,
};
use leasebox_proto::{AllocReq, ErrorCode, LeaseId, Notice, Outcome, Reply, Request, Response, access};

use super::*;
use crate::lease::{Slot, step_bit};

/// Leases granted before the churn stops.
const LEASES: u64 = 1_000_000;
/// Commands the engine's client holds at once (its request ring, `engine::REQUEST_RING`).
const RING: usize = leasebox_mlx5::engine::REQUEST_RING;
/// Virtual time per step of the soak.
const STEP_US: u64 = 100;
/// ALLOCs each tenant with a session sends per step.
const ALLOCS_PER_STEP: usize = 2;
const SLOTS: u32 = 4096;
const EXTENT: u64 = 4096;
const POOL_EXTENTS: u64 = 16_384;
/// Faults, in millionths of a command: a build command fails; a teardown command fails (the slot fences); a
/// command answers late (0.1 to 1 ms); a command hangs past the revoke deadline.
const FAIL_BUILD_PPM: u64 = 5_000;
const FAIL_TEARDOWN_PPM: u64 = 30;
const SLOW_PPM: u64 = 10_000;
const HANG_PPM: u64 = 10;
const HANG_US: u64 = 1_500_000;

/// splitmix64: the soak's own deterministic randomness.
struct Rand(u64);

impl Rand {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `ppm` millionths.
    fn ppm(&mut self, ppm: u64) -> bool {
        self.below(1_000_000) < ppm
    }
}

/// Handles of one kind, lowest free first (as firmware re-uses them), with the slot that made each live one.
#[derive(Default)]
struct Handles {
    next: u32,
    free: BTreeSet<u32>,
    live: HashMap<u32, u32>,
}

impl Handles {
    fn create(&mut self, slot: u32) -> u32 {
        let h = self.free.pop_first().unwrap_or_else(|| {
            self.next += 1;
            self.next
        });
        self.live.insert(h, slot);
        h
    }
    fn destroy(&mut self, h: u32) -> bool {
        if self.live.remove(&h).is_some() {
            self.free.insert(h);
            true
        } else {
            false
        }
    }
}

/// The fake HCA: objects, faults, and the results it owes, by when.
#[derive(Default)]
struct FakeHca {
    pds: Handles,
    mkeys: Handles,
    qps: Handles,
    /// Results answered at once, and those owed later: (due µs, order) → (tag, result).
    now: std::collections::VecDeque<(u64, Result<Output, CmdError>)>,
    owed: BTreeMap<(u64, u64), (u64, Result<Output, CmdError>)>,
    order: u64,
    /// Commands that named a handle the HCA does not hold (the service must never send one).
    bad_handles: u64,
    /// MKEY index → the variant of its live key, and the key its last destroyed incarnation had.
    variants: HashMap<u32, u8>,
    retired_keys: HashMap<u32, u32>,
    /// Live keys equal to their index's previous key: a client of the old lease could still use them, so the
    /// service must never grant one.
    stale_keys: std::collections::HashSet<u32>,
    commands: u64,
    failed: u64,
    slow: u64,
    hung: u64,
}

impl FakeHca {
    fn execute(&mut self, tag: u64, cmd: &Command, now_us: u64, rand: &mut Rand) {
        self.commands += 1;
        let slot = tag_slot(tag);
        let op = cmd.opcode();
        let handle = leasebox_mlx5::ifc::OBJECT_ID.read(cmd.input());
        let build = matches!(op, ALLOC_PD | CREATE_MKEY | CREATE_QP | RST2INIT | INIT2RTR | RTR2RTS);
        let known = match op {
            DEALLOC_PD => self.pds.live.contains_key(&handle),
            DESTROY_MKEY => self.mkeys.live.contains_key(&handle),
            RST2INIT | INIT2RTR | RTR2RTS | QP_2ERR | QP_2RST | DESTROY_QP => self.qps.live.contains_key(&handle),
            _ => true,
        };
        let fail = !known || rand.ppm(if build { FAIL_BUILD_PPM } else { FAIL_TEARDOWN_PPM });
        let result = if fail {
            self.failed += 1;
            if !known {
                self.bad_handles += 1;
            }
            Err(cmd.error(ErrorKind::Status { status: 0x03, syndrome: 0x50a4 }))
        } else {
            let mut out = vec![0u8; cmd.out_len()];
            let made = match op {
                ALLOC_PD => Some(self.pds.create(slot)),
                CREATE_MKEY => {
                    let h = self.mkeys.create(slot);
                    // `create_mkey_in.mkc.mkey_7_0` (bit 0x80 + 0x38).
                    let variant = mkc::MKEY_7_0.at(MKC).read(cmd.input()) as u8;
                    self.variants.insert(h, variant);
                    let key = h << 8 | u32::from(variant);
                    if self.retired_keys.get(&h) == Some(&key) {
                        self.stale_keys.insert(key);
                    }
                    Some(h)
                }
                CREATE_QP => Some(self.qps.create(slot)),
                DEALLOC_PD => {
                    self.pds.destroy(handle);
                    None
                }
                DESTROY_MKEY => {
                    self.mkeys.destroy(handle);
                    let key = handle << 8 | u32::from(self.variants.remove(&handle).unwrap_or(0));
                    self.stale_keys.remove(&key);
                    self.retired_keys.insert(handle, key);
                    None
                }
                DESTROY_QP => {
                    self.qps.destroy(handle);
                    None
                }
                _ => None,
            };
            if let Some(h) = made {
                leasebox_mlx5::ifc::OBJECT_ID.write(&mut out, h);
            }
            Ok(Output::new(out))
        };
        let delay = if rand.ppm(HANG_PPM) {
            self.hung += 1;
            HANG_US
        } else if rand.ppm(SLOW_PPM) {
            self.slow += 1;
            100 + rand.below(900)
        } else {
            0
        };
        if delay == 0 {
            self.now.push_back((tag, result));
        } else {
            self.order += 1;
            self.owed.insert((now_us + delay, self.order), (tag, result));
        }
    }

    fn due(&mut self, now_us: u64) -> Option<(u64, Result<Output, CmdError>)> {
        if let Some(r) = self.now.pop_front() {
            return Some(r);
        }
        let (&(at, _), _) = self.owed.first_key_value()?;
        (at <= now_us).then(|| self.owed.pop_first().unwrap().1)
    }
}

/// DMA memory from a bump allocator (addresses are never touched), every free checked.
#[derive(Default)]
struct SoakHost {
    next: u64,
    live: HashMap<u64, usize>,
    now_us: u64,
    zeroed: u64,
}

impl Host for SoakHost {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let a = (0x1_0000_0000 + self.next).next_multiple_of(align as u64);
        self.next = a + len as u64 - 0x1_0000_0000;
        self.live.insert(a, len);
        Some(DmaBuf::new(a, len, a))
    }
    fn dma_free(&mut self, buf: DmaBuf) {
        assert_eq!(self.live.remove(&buf.addr()), Some(buf.len()), "freed what was allocated, once");
    }
    fn zero(&mut self, _addr: u64, len: u64) {
        self.zeroed += len;
    }
    fn now_us(&self) -> u64 {
        self.now_us
    }
}

const TENANTS: [&str; 4] = ["t0", "t1", "t2", "t3"];
const ADMIN_SESSION: u64 = 1 << 40;

/// What a ticket was for.
#[derive(Clone, Copy)]
enum Pending {
    /// ALLOC from this tenant, with this client QPN.
    Alloc(usize, u32),
    Ready,
    Renew,
    End,
}

/// A lease as its client knows it.
struct Known {
    tenant: usize,
    client_qpn: u32,
    server_qpn: u32,
}

/// What a client does next with a lease.
#[derive(Clone, Copy)]
enum Action {
    Ready(u32, u32),
    End(u32, u32),
}

struct Soak {
    svc: LeaseService<u64>,
    host: SoakHost,
    hca: FakeHca,
    rand: Rand,
    now_us: u64,
    outstanding: usize,
    next_ticket: u64,
    tickets: HashMap<u64, Pending>,
    /// Each tenant's open session, and when a lost one comes back: (at, RESUME from the lost one?).
    sessions: [Option<u64>; 4],
    returning: [Option<(u64, Option<u64>)>; 4],
    next_session: u64,
    known: HashMap<(u32, u32), Known>,
    actions: BTreeMap<(u64, u64), Action>,
    action_order: u64,
    /// Fenced slots and the generation each was fenced at.
    fenced: BTreeMap<u32, u32>,
    fenced_seen: u64,
    /// The newest generation granted per slot.
    generations: Vec<u32>,
    granted: u64,
    /// Leases granted with a key equal to the one their MKEY index had before (must stay 0).
    stale_granted: u64,
    alloc_errors: BTreeMap<ErrorCode, u64>,
    outcomes: BTreeMap<&'static str, u64>,
    notices: BTreeMap<&'static str, u64>,
    sessions_lost: u64,
}

fn who(tenant: usize, session: u64) -> Who<'static> {
    Who { session, tenant: TENANTS[tenant], admin: false }
}

const ADMIN: Who<'static> = Who { session: ADMIN_SESSION, tenant: "admin", admin: true };

impl Soak {
    fn new() -> Soak {
        let cfg = Config {
            pool: core::iter::once(0x4000_0000..0x4000_0000 + POOL_EXTENTS * EXTENT).collect(),
            extent: EXTENT,
            slots: SLOTS,
            tenant_leases: SLOTS,
            default_ttl_ms: 50,
            ready_timeout_ms: 5,
            grace_ms: 2,
            session_grace_ms: 10,
            ..Config::default()
        };
        let hca = HcaCtx {
            uar: UarPage(1),
            cqn: Cqn(2),
            gid: [7; 16],
            gid_index: 0,
            mac: [2, 0, 0, 0, 0, 7],
            port_mtu: 3,
            qp: leasebox_mlx5::ifc::qp::QpCaps {
                log_msg_max: 30,
                log_max_ra_res: 4,
                log_max_ra_req: 4,
                ts_format: 0,
                user_index: None,
                atomic_mode: None,
            },
            umr: UmrCtx::OFF,
        };
        let mut svc = LeaseService::new(cfg, hca, leasebox_session::IdRng::from_seed([0x50; 32])).unwrap();
        svc.set_boot_id([0x27; BOOT_ID_LEN]);
        let mut s = Soak {
            svc,
            host: SoakHost::default(),
            hca: FakeHca::default(),
            rand: Rand(27),
            now_us: 1_000_000,
            outstanding: 0,
            next_ticket: 1,
            tickets: HashMap::new(),
            sessions: [None; 4],
            returning: [None; 4],
            next_session: 1,
            known: HashMap::new(),
            actions: BTreeMap::new(),
            action_order: 0,
            fenced: BTreeMap::new(),
            fenced_seen: 0,
            generations: vec![0; SLOTS as usize],
            granted: 0,
            stale_granted: 0,
            alloc_errors: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            notices: BTreeMap::new(),
            sessions_lost: 0,
        };
        s.svc.session_started(ADMIN_SESSION, "admin");
        for t in 0..TENANTS.len() {
            s.open(t, None);
        }
        s
    }

    fn open(&mut self, t: usize, resume_from: Option<u64>) {
        let id = self.next_session;
        self.next_session += 1;
        self.svc.session_started(id, TENANTS[t]);
        if let Some(from) = resume_from {
            self.svc.resume(from, id, TENANTS[t]);
        }
        self.sessions[t] = Some(id);
    }

    fn request(&mut self, w: Who<'_>, req: &Request, kind: Pending) {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(t, kind);
        if let Some(r) = self.svc.request(w, req, t, self.now_us, &mut self.host) {
            self.answered(t, r);
        }
    }

    /// `a` in `min_us` plus up to `spread_us` more.
    fn later(&mut self, min_us: u64, spread_us: u64, a: Action) {
        let at = self.now_us + min_us + self.rand.below(spread_us);
        self.action_order += 1;
        self.actions.insert((at, self.action_order), a);
    }

    fn answered(&mut self, ticket: u64, r: Reply) {
        let kind = self.tickets.remove(&ticket).expect("every answer is for a ticket sent, once");
        match (kind, r) {
            (Pending::Alloc(tenant, client_qpn), Ok(Response::Alloc(a))) => {
                let (slot, generation) = (a.lease.slot, a.lease.generation);
                assert!(!self.fenced.contains_key(&slot), "slot {slot} was fenced and is granted again");
                let last = &mut self.generations[slot as usize];
                assert!(generation > *last, "slot {slot}: generation {generation} after {last}");
                *last = generation;
                self.granted += 1;
                if self.hca.stale_keys.contains(&a.rkey) {
                    self.stale_granted += 1;
                }
                self.known.insert((slot, generation), Known { tenant, client_qpn, server_qpn: a.server_qpn });
                // Most clients confirm at once; a few never do (the READY deadline expires the lease).
                if !self.rand.ppm(20_000) {
                    self.later(0, 300, Action::Ready(slot, generation));
                }
            }
            (Pending::Alloc(..), Err(e)) => {
                assert!(
                    matches!(e.code, ErrorCode::HcaError | ErrorCode::Internal | ErrorCode::NotFound),
                    "ALLOC: {e:?} after {} granted at {} µs; by state {:?}, tenants {:?}, fenced {}",
                    self.granted,
                    self.now_us,
                    self.svc.by_state(),
                    self.svc.usage,
                    self.fenced.len()
                );
                *self.alloc_errors.entry(e.code).or_default() += 1;
            }
            (Pending::End, Ok(Response::Free { outcome, .. } | Response::Revoke { outcome, .. })) => {
                let name = match outcome {
                    Outcome::TornDown => "torn down",
                    Outcome::Fenced => "fenced",
                    Outcome::NotFound => "not found",
                };
                *self.outcomes.entry(name).or_default() += 1;
            }
            (Pending::Ready, Ok(Response::Ready { .. })) | (Pending::Renew, Ok(Response::Renew { .. })) => {}
            // The lease ended meanwhile (expired, revoked, its session's grace ran out).
            (Pending::Ready | Pending::Renew, Err(e))
                if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale | ErrorCode::BadState) => {}
            (_, r) => panic!("unexpected answer: {r:?}"),
        }
    }

    /// One pass of what `Link::step` and the session core's tick do: results in, timers, commands out (at
    /// most [`RING`] outstanding), until nothing moves; then a share of the scrub, answers and notices.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some((tag, result)) = self.hca.due(self.now_us) {
                self.outstanding -= 1;
                self.svc.hca_done(tag, result, self.now_us, &mut self.host);
                moved = true;
            }
            self.svc.tick(self.now_us, &mut self.host);
            while self.outstanding < RING {
                let Some((tag, cmd)) = self.svc.next_command() else { break };
                assert_eq!(tag & !leasebox_mlx5::engine::CLIENT_TAG_BITS, 0, "a tag the engine takes");
                if cmd.opcode() == ALLOC_PD {
                    assert!(!self.fenced.contains_key(&tag_slot(tag)), "a build on fenced slot {}", tag_slot(tag));
                }
                self.outstanding += 1;
                self.hca.execute(tag, &cmd, self.now_us, &mut self.rand);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        self.svc.scrub(self.now_us, &mut self.host);
        let mut out = Vec::new();
        self.svc.take_answers(&mut out);
        for (t, r) in out {
            self.answered(t, r);
        }
        let mut notices = Vec::new();
        self.svc.take_notices(&mut notices);
        for (_, n) in notices {
            let name = match n {
                Notice::Revoked { .. } => "revoked",
                Notice::Expiring { .. } => "expiring",
                Notice::Fenced { .. } => "fenced",
                Notice::Draining { .. } => "draining",
            };
            *self.notices.entry(name).or_default() += 1;
        }
        if self.svc.counters.fenced != self.fenced_seen {
            self.fenced_seen = self.svc.counters.fenced;
            for (slot, s) in self.svc.slots.iter().enumerate() {
                if let Slot::Fenced(f) = s {
                    let g = *self.fenced.entry(slot as u32).or_insert(f.generation);
                    assert_eq!(g, f.generation, "fenced slot {slot} changed generation");
                }
            }
            assert_eq!(self.fenced.len() as u64, self.fenced_seen, "a fence counted once per slot, for good");
        }
    }

    /// The clients' part of one step.
    fn clients(&mut self, churn: bool) {
        // Sessions: one is lost every 2 ms; it comes back at once, by RESUME after 3 ms, or after the grace.
        if churn && self.now_us.is_multiple_of(2_000) {
            let t = self.rand.below(TENANTS.len() as u64) as usize;
            if let Some(s) = self.sessions[t].take() {
                self.svc.session_lost(s, self.now_us);
                self.sessions_lost += 1;
                self.returning[t] = Some(match self.rand.below(3) {
                    0 => (self.now_us, None),
                    1 => (self.now_us + 3_000, Some(s)),
                    _ => (self.now_us + 15_000, None),
                });
            }
        }
        for t in 0..TENANTS.len() {
            if let Some((at, from)) = self.returning[t]
                && at <= self.now_us
                && churn
            {
                self.returning[t] = None;
                self.open(t, from);
            }
        }
        // Heartbeats, every millisecond: t0's renew its leases (heartbeat_renews); the others rely on RENEW.
        if self.now_us.is_multiple_of(1_000)
            && let Some(s) = self.sessions[0]
        {
            self.svc.session_alive(s, self.now_us);
        }
        if churn && self.granted < LEASES {
            for t in 0..TENANTS.len() {
                let Some(s) = self.sessions[t] else { continue };
                for _ in 0..ALLOCS_PER_STEP {
                    let client_qpn = 1 + self.rand.below(0xff_fffe) as u32;
                    let req = AllocReq {
                        size: EXTENT * (1 + self.rand.below(2)),
                        access: access::REMOTE_READ | access::REMOTE_WRITE,
                        mtu: 3,
                        ttl_ms: if t == 0 { 50 } else { 4 },
                        client_qpn,
                        client_psn: self.rand.below(0x100_0000) as u32,
                        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 7],
                        client_mac: [2, 0, 0, 0, 0, 2],
                    };
                    self.request(who(t, s), &Request::Alloc(req), Pending::Alloc(t, client_qpn));
                }
            }
        }
        while let Some((&(at, _), _)) = self.actions.first_key_value() {
            if at > self.now_us {
                break;
            }
            let (_, a) = self.actions.pop_first().unwrap();
            let (Action::Ready(slot, generation) | Action::End(slot, generation)) = a;
            let Some(k) = self.known.get(&(slot, generation)) else { continue };
            let (t, client_qpn, server_qpn) = (k.tenant, k.client_qpn, k.server_qpn);
            let lease = LeaseId { boot_id: self.svc.boot_id(), slot, generation };
            // A tenant without a session cannot act: the lease is left to its grace or TTL.
            let Some(s) = self.sessions[t] else {
                self.known.remove(&(slot, generation));
                continue;
            };
            match a {
                Action::Ready(..) => {
                    self.request(who(t, s), &Request::Ready { lease, client_qpn, server_qpn }, Pending::Ready);
                    self.later(200, 4_000, Action::End(slot, generation));
                }
                Action::End(..) => match self.rand.below(20) {
                    0..=10 => {
                        self.known.remove(&(slot, generation));
                        self.request(who(t, s), &Request::Free { lease }, Pending::End);
                    }
                    11..=13 => {
                        self.known.remove(&(slot, generation));
                        let qp_first = self.rand.below(4) == 0;
                        self.request(ADMIN, &Request::Revoke { lease, qp_first }, Pending::End);
                    }
                    14..=16 => {
                        self.request(who(t, s), &Request::Renew { lease, ttl_ms: 5 }, Pending::Renew);
                        self.later(200, 3_000, Action::End(slot, generation));
                    }
                    // Abandoned: its TTL (or, for t0, whose heartbeats renew it, its session's loss) ends it.
                    _ => {
                        self.known.remove(&(slot, generation));
                    }
                },
            }
        }
    }

    fn step(&mut self, churn: bool) {
        self.now_us += STEP_US;
        self.host.now_us = self.now_us;
        self.clients(churn);
        self.pump();
    }
}

/// A million leases through the service with failed, slow and hung commands and lost sessions; everything
/// returns to its baseline and no fenced slot is ever used again (module documentation).
#[test]
fn a_million_leases_with_faults_and_lost_sessions_leave_nothing_behind() {
    let started = std::time::Instant::now();
    let mut s = Soak::new();
    let (pool_bytes, slots) = (s.svc.pool().free_bytes(), s.svc.free_slots());
    assert_eq!((pool_bytes, slots), (POOL_EXTENTS * EXTENT, SLOTS as usize));
    while s.granted < LEASES {
        s.step(true);
    }
    let churned_us = s.now_us;
    // Wind down: the clients go away (every session lost, none back) and time passes until every lease has
    // expired, every hung command has answered, every sweep and scrub has run.
    for t in 0..TENANTS.len() {
        if let Some(id) = s.sessions[t].take() {
            s.svc.session_lost(id, s.now_us);
        }
        s.returning[t] = None;
    }
    s.actions.clear();
    let mut idle_steps = 0;
    while idle_steps < 100 {
        s.step(false);
        let busy = s.svc.slots.iter().any(|x| matches!(x, Slot::Busy(_)));
        let quiet = !busy
            && s.hca.owed.is_empty()
            && s.hca.now.is_empty()
            && s.svc.pool().scrubbing_bytes() == 0
            && s.tickets.is_empty();
        idle_steps = if quiet { idle_steps + 1 } else { 0 };
        assert!(s.now_us - churned_us < 10_000_000, "the service did not settle within 10 s of virtual time");
    }
    let fenced = s.fenced.len();
    let c = &s.svc.counters;
    eprintln!(
        "soak: {} leases granted ({} ALLOCs started, errors {:?}) in {} s of virtual time, {:.1} s of wall time; \
         {} granted a stale rkey; {} commands ({} failed, {} slow, {} hung past the revoke deadline); {} sessions lost; revokes {}, \
         expiries {}, outcomes {:?}, notices {:?}; {} slots fenced",
        s.granted,
        c.allocs_started,
        s.alloc_errors,
        churned_us / 1_000_000,
        started.elapsed().as_secs_f64(),
        s.stale_granted,
        s.hca.commands,
        s.hca.failed,
        s.hca.slow,
        s.hca.hung,
        s.sessions_lost,
        c.revokes,
        c.expiries,
        s.outcomes,
        s.notices,
        fenced,
    );
    // The faults happened, and each kind of ending too.
    assert!(s.granted >= LEASES);
    assert!(s.hca.failed > 10_000 && s.hca.slow > 50_000 && s.hca.hung > 10, "faults injected");
    assert!(s.alloc_errors.get(&ErrorCode::HcaError).copied().unwrap_or(0) > 10_000, "failed builds answered");
    assert!(c.revokes > 100_000 && c.expiries > 100_000 && s.sessions_lost > 1_000);
    assert!(s.outcomes.get("fenced").copied().unwrap_or(0) > 0, "a revoke answered Fenced");
    assert!((10..SLOTS as usize / 4).contains(&fenced), "{fenced} slots fenced");
    let deadline = s.fenced.keys().filter(|&&x| s.svc.fence_info(x).unwrap().failed_mask & step_bit::DEADLINE != 0);
    assert!(deadline.count() > 0, "a hung immediate phase fenced at the revoke deadline");
    assert_eq!(s.hca.bad_handles, 0, "no command named an object the HCA did not hold");
    assert_eq!(s.stale_granted, 0, "a lease was granted the rkey its MKEY index had before");
    // Back to the baseline.
    let svc = &s.svc;
    assert_eq!(svc.in_flight(), 0);
    assert!(!svc.has_commands());
    assert_eq!(s.outstanding, 0);
    assert_eq!(svc.free_slots() + fenced, slots, "every slot free or fenced");
    assert_eq!(svc.fenced_count() as usize, fenced);
    let quarantined = svc.pool().quarantined_extents() as u64 * EXTENT;
    assert_eq!(svc.pool().free_bytes() + quarantined, pool_bytes, "every byte free or a fenced slot's");
    assert_eq!(svc.pool().scrubbing_bytes(), 0);
    assert!(quarantined <= fenced as u64 * 2 * EXTENT);
    assert!(svc.usage.is_empty(), "no tenant charged: {:?}", svc.usage);
    assert_eq!(svc.bytes_leased(), 0);
    for (kind, h) in [("PD", &s.hca.pds), ("MKEY", &s.hca.mkeys), ("QP", &s.hca.qps)] {
        for (handle, slot) in &h.live {
            assert!(s.fenced.contains_key(slot), "{kind} {handle:#x} of slot {slot} left behind, not fenced");
        }
    }
    assert_eq!(s.host.live.len(), 2 * fenced, "the only DMA memory held: fenced slots' QP buffers");
    // No fenced slot was used again: each is still fenced at the generation it was fenced at, and the free list
    // never held it.
    for (&slot, &generation) in &s.fenced {
        assert!(matches!(&svc.slots[slot as usize], Slot::Fenced(f) if f.generation == generation), "slot {slot}");
        assert!(!svc.free.contains(&slot));
        assert_eq!(s.generations[slot as usize].max(generation), generation, "slot {slot} granted after its fence");
    }
}
