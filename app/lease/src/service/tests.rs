//! The service over a scripted fake HCA on a virtual clock: every command is answered (or not) as the test
//! says, at the time the test says. No model, no thread, no wall clock.

use std::collections::{BTreeMap, VecDeque};

use leasebox_mlx5::command::{Command, ErrorKind, Output};
use leasebox_mlx5::handles::{Cqn, UarPage};
use leasebox_mlx5::ifc::opcode::{
    MLX5_CMD_OP_2ERR_QP as QP_2ERR, MLX5_CMD_OP_2RST_QP as QP_2RST, MLX5_CMD_OP_ALLOC_PD as ALLOC_PD,
    MLX5_CMD_OP_CREATE_MKEY as CREATE_MKEY, MLX5_CMD_OP_CREATE_QP as CREATE_QP, MLX5_CMD_OP_DEALLOC_PD as DEALLOC_PD,
    MLX5_CMD_OP_DESTROY_MKEY as DESTROY_MKEY, MLX5_CMD_OP_DESTROY_QP as DESTROY_QP,
    MLX5_CMD_OP_INIT2RTR_QP as INIT2RTR, MLX5_CMD_OP_RST2INIT_QP as RST2INIT, MLX5_CMD_OP_RTR2RTS_QP as RTR2RTS,
};
use leasebox_proto::{
    AllocReq, ErrorCode, HEADER_LEN, LeaseId, MAX_PAYLOAD, Notice, Op, Outcome, Reply, Request, Response, access,
};

use super::*;
use crate::lease::{origin, step_bit};

/// The QP caps of a ConnectX-5 as the model reports them: 2^30-byte messages, 16 reads in flight each way,
/// CQE version 1, IB-compatible atomics.
fn qp_caps() -> QpCaps {
    QpCaps {
        log_msg_max: 30,
        log_max_ra_res: 4,
        log_max_ra_req: 4,
        ts_format: 0,
        user_index: Some(leasebox_mlx5::ifc::qp::DEFAULT_USER_INDEX),
        atomic_mode: Some(leasebox_mlx5::ifc::qp::ATOMIC_MODE_IB_COMP),
    }
}

const BUILD: [u16; 6] = [ALLOC_PD, CREATE_MKEY, CREATE_QP, RST2INIT, INIT2RTR, RTR2RTS];

/// How the fake answers a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// Status BAD_PARAM, syndrome 0x7e57.
    Fail,
    /// Never (until [`Rig::late`]).
    Hang,
}

/// DMA memory from a bump allocator; what was freed and scrubbed is recorded.
#[derive(Default)]
struct FakeHost {
    next: u64,
    live: BTreeMap<u64, usize>,
    zeroed: Vec<(u64, u64)>,
    /// The host's clock as the scrub reads it: moved only by [`Host::zero`].
    clock_us: u64,
    /// Neighbour resolution: off (`Unsupported`) unless set; then the MACs "ARP" has found so far.
    resolves: bool,
    arp: BTreeMap<core::net::Ipv4Addr, [u8; 6]>,
    asked: usize,
}

impl Host for FakeHost {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let a = (0x1000_0000 + self.next).next_multiple_of(align as u64);
        self.next = a + len as u64 - 0x1000_0000;
        self.live.insert(a, len);
        Some(DmaBuf::new(a, len, a))
    }
    fn dma_free(&mut self, buf: DmaBuf) {
        assert_eq!(self.live.remove(&buf.addr()), Some(buf.len()), "freed what was allocated, once");
    }
    /// Each scrub slice takes 1 µs per KiB on the host's clock (1 GiB/s).
    fn zero(&mut self, addr: u64, len: u64) {
        self.clock_us += len >> 10;
        // Adjacent slices of one scrub read as one range.
        match self.zeroed.last_mut() {
            Some((a, n)) if *a + *n == addr && (addr & ((2 << 20) - 1)) != 0 => *n += len,
            _ => self.zeroed.push((addr, len)),
        }
    }
    fn now_us(&self) -> u64 {
        self.clock_us
    }
    fn neighbour(&mut self, ip: core::net::Ipv4Addr) -> Neighbour {
        if !self.resolves {
            return Neighbour::Unsupported("no port to ARP on");
        }
        self.asked += 1;
        self.arp.get(&ip).map_or(Neighbour::Asking, |&m| Neighbour::Known(m))
    }
}

/// The boot id the rig's service runs under.
const BOOT: [u8; 16] = [0xb0; 16];

const TENANT: Who<'static> = Who { session: 1, tenant: "alpha", admin: false };
const ADMIN: Who<'static> = Who { session: 2, tenant: "root", admin: true };

struct Rig {
    svc: LeaseService<u64>,
    host: FakeHost,
    now_us: u64,
    /// Answers scripted per opcode, used in order; an opcode with none left answers Ok.
    script: BTreeMap<u16, VecDeque<Answer>>,
    /// Opcodes in the order the service issued them.
    issued: Vec<u16>,
    /// Per lease command issued: its opcode, the slot its tag names and its `slot` attribute (error reports).
    slot_attrs: Vec<(u16, u32, Option<u64>)>,
    /// The input of the last INIT2RTR_QP issued.
    last_init2rtr: Vec<u8>,
    /// The last input issued per opcode.
    inputs: BTreeMap<u16, Vec<u8>>,
    hung: Vec<(u64, Command)>,
    next_handle: u32,
    /// When set, CREATE_MKEY answers the index this gives for the variant the command carries (an HCA that
    /// re-uses indices as the test says) instead of the next handle.
    mkey_index: Option<fn(u8) -> u32>,
    next_ticket: u64,
    answers: BTreeMap<u64, Reply>,
    /// Every tag the service issued, in order.
    tags: Vec<u64>,
    /// Commands refused for a tag outside the engine's client bits (as the command engine refuses them).
    refused: usize,
    /// UMR work requests hung (never answered until [`Rig::late`]).
    hung_umr: Vec<(u64, UmrWork)>,
    /// The warm pool's build commands, apart from `issued`.
    filled: Vec<u16>,
    /// The warm pool's build commands all answer Ok (the script is for the leases' commands).
    fill_ok: bool,
}

/// The pseudo-opcodes [`Rig::issued`] and [`Rig::script`] use for UMR work requests.
const UMR_GRANT: u16 = 0x1025;
const UMR_REVOKE: u16 = 0x2025;

/// A pool of one run of `bytes` at `base`.
fn one_run(base: u64, bytes: u64) -> Vec<core::ops::Range<u64>> {
    core::iter::once(base..base + bytes).collect()
}

impl Rig {
    fn new(cfg: Config) -> Rig {
        Rig::with_qp(cfg, qp_caps())
    }

    fn with_qp(cfg: Config, qp: QpCaps) -> Rig {
        let pool_bytes = if cfg.pool.is_empty() { 64 << 20 } else { cfg.pool_bytes() };
        let cfg = Config { pool: one_run(0x4000_0000, pool_bytes), ..cfg };
        let hca = HcaCtx {
            uar: UarPage(1),
            cqn: Cqn(2),
            gid: [7; 16],
            gid_index: 0,
            mac: [2, 0, 0, 0, 0, 7],
            port_mtu: 3,
            qp,
            umr: UmrCtx::OFF,
        };
        let mut svc = LeaseService::new(cfg, hca, leasebox_session::IdRng::from_seed([0x5e; 32])).unwrap();
        svc.set_boot_id(BOOT);
        Rig {
            svc,
            host: FakeHost::default(),
            now_us: 1_000_000,
            script: BTreeMap::new(),
            issued: Vec::new(),
            slot_attrs: Vec::new(),
            last_init2rtr: Vec::new(),
            inputs: BTreeMap::new(),
            hung: Vec::new(),
            next_handle: 0x100,
            mkey_index: None,
            next_ticket: 1,
            answers: BTreeMap::new(),
            tags: Vec::new(),
            refused: 0,
            hung_umr: Vec::new(),
            filled: Vec::new(),
            fill_ok: false,
        }
    }

    /// A rig whose HCA has a UMR QP (grants and revokes allowed, 104 extents inline, atomics by UMR).
    fn with_umr(cfg: Config) -> Rig {
        let mut r = Rig::new(cfg);
        r.svc.hca.umr = UmrCtx { grant: true, revoke: true, quarantine_pd: Pdn(0x77), max_entries: 104, atomic: true };
        r
    }

    fn answer_umr(&mut self, tag: u64, w: &UmrWork, a: Answer) {
        let result = match a {
            Answer::Ok => Ok(Output::new(Vec::new())),
            Answer::Fail => Err(leasebox_mlx5::engine::umr_error(w, ErrorKind::Status { status: 0x4, syndrome: 0 })),
            Answer::Hang => unreachable!("a hung work request is never answered here"),
        };
        self.svc.hca_done(tag, result, self.now_us, &mut self.host);
    }

    fn script(&mut self, opcode: u16, answers: &[Answer]) {
        self.script.entry(opcode).or_default().extend(answers);
    }

    fn answer(&mut self, tag: u64, cmd: &Command, a: Answer) {
        let result = match a {
            Answer::Ok => {
                let mut out = vec![0u8; cmd.out_len()];
                // Every handle an output carries (pd, mkey index, qpn) is the 24 bits at 0x48.
                let variant = busy(&mut self.svc.slots, tag_slot(tag)).map_or(0, |l| l.variant);
                let handle = match self.mkey_index {
                    Some(f) if cmd.opcode() == CREATE_MKEY => f(variant),
                    _ => {
                        self.next_handle += 1;
                        self.next_handle - 1
                    }
                };
                leasebox_mlx5::ifc::OBJECT_ID.write(&mut out, handle);
                Ok(Output::new(out))
            }
            Answer::Fail => Err(cmd.error(ErrorKind::Status { status: 0x03, syndrome: 0x7e57 })),
            Answer::Hang => unreachable!("a hung command is never answered here"),
        };
        self.svc.hca_done(tag, result, self.now_us, &mut self.host);
    }

    /// The fake HCA takes every queued command and answers at once (or never, as scripted); then the
    /// service's timers run. Collects answers.
    fn run(&mut self) {
        loop {
            while let Some((tag, w)) = self.svc.next_umr() {
                self.tags.push(tag);
                let op = if matches!(w, UmrWork::Grant { .. }) { UMR_GRANT } else { UMR_REVOKE };
                self.issued.push(op);
                let a = self.script.get_mut(&op).and_then(|q| q.pop_front()).unwrap_or(Answer::Ok);
                if a == Answer::Hang {
                    self.hung_umr.push((tag, w));
                } else {
                    self.answer_umr(tag, &w, a);
                }
            }
            while let Some((tag, cmd)) = self.svc.next_command() {
                self.tags.push(tag);
                if tag & !leasebox_mlx5::engine::CLIENT_TAG_BITS != 0 {
                    // The command engine refuses such a tag (`Refused::ReservedTag`); the link fails the step.
                    self.refused += 1;
                    let e = cmd.error(ErrorKind::ReservedTag { tag });
                    self.svc.hca_done(tag, Err(e), self.now_us, &mut self.host);
                    continue;
                }
                let fill = tag_slot(tag) >= warm::FILL_SLOT_BASE;
                if fill {
                    self.filled.push(cmd.opcode());
                } else {
                    self.issued.push(cmd.opcode());
                    self.slot_attrs.push((cmd.opcode(), tag_slot(tag), cmd.attrs().get("slot")));
                }
                if fill && self.fill_ok {
                    self.answer(tag, &cmd, Answer::Ok);
                    continue;
                }
                if cmd.opcode() == ifc::qp::MLX5_CMD_OP_INIT2RTR_QP {
                    self.last_init2rtr = cmd.input().to_vec();
                }
                self.inputs.insert(cmd.opcode(), cmd.input().to_vec());
                let a = self.script.get_mut(&cmd.opcode()).and_then(|q| q.pop_front()).unwrap_or(Answer::Ok);
                if a == Answer::Hang {
                    self.hung.push((tag, cmd));
                } else {
                    self.answer(tag, &cmd, a);
                }
            }
            self.svc.tick(self.now_us, &mut self.host);
            self.svc.scrub(self.now_us, &mut self.host);
            if !self.svc.has_commands() {
                break;
            }
        }
        let mut out = Vec::new();
        self.svc.take_answers(&mut out);
        for (t, r) in out {
            assert!(self.answers.insert(t, r).is_none(), "ticket {t} answered twice");
        }
    }

    /// Moves the virtual clock on by `us` in timer-scan steps, running everything at each.
    fn advance(&mut self, us: u64) {
        let end = self.now_us + us;
        while self.now_us < end {
            self.now_us = (self.now_us + SCAN_INTERVAL_US).min(end);
            self.run();
        }
    }

    /// The hung commands complete now, as scripted.
    fn late(&mut self, a: Answer) {
        for (tag, cmd) in core::mem::take(&mut self.hung) {
            self.answer(tag, &cmd, a);
        }
        for (tag, w) in core::mem::take(&mut self.hung_umr) {
            self.answer_umr(tag, &w, a);
        }
        self.run();
    }

    fn send(&mut self, who: Who<'_>, req: &Request) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        if let Some(r) = self.svc.request(who, req, t, self.now_us, &mut self.host) {
            self.answers.insert(t, r);
        }
        self.run();
        t
    }

    /// The notices raised so far, as (tenant, notice).
    fn notices(&mut self) -> Vec<(String, Notice)> {
        let mut v = Vec::new();
        self.svc.take_notices(&mut v);
        v
    }

    fn take(&mut self, t: u64) -> Option<Reply> {
        self.answers.remove(&t)
    }

    fn call(&mut self, who: Who<'_>, req: &Request) -> Reply {
        let t = self.send(who, req);
        self.take(t).expect("answered at once by the fake")
    }

    /// ALLOC + READY: an Active lease.
    fn active(&mut self) -> LeaseId {
        let Ok(Response::Alloc(a)) = self.call(TENANT, &Request::Alloc(alloc_req())) else { panic!("ALLOC") };
        let r = self.call(TENANT, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn });
        assert!(matches!(r, Ok(Response::Ready { .. })), "{r:?}");
        self.issued.clear();
        a.lease
    }

    fn revoke(&mut self, lease: LeaseId, qp_first: bool) -> Outcome {
        match self.call(ADMIN, &Request::Revoke { lease, qp_first }) {
            Ok(Response::Revoke { outcome, .. }) => outcome,
            other => panic!("REVOKE: {other:?}"),
        }
    }

    /// Past the grace period: the sweep runs, and the scrub of what it freed ends.
    fn sweep(&mut self) {
        let grace = self.svc.config().grace_ms * 1000;
        self.advance(grace + SCAN_INTERVAL_US);
        self.scrubbed();
    }

    /// Ticks until the scrub queue is empty.
    fn scrubbed(&mut self) {
        for _ in 0..100_000 {
            if self.svc.pool().scrubbing_bytes() == 0 {
                return;
            }
            self.advance(SCAN_INTERVAL_US);
        }
        panic!("the scrub never ended: {} bytes left", self.svc.pool().scrubbing_bytes());
    }

    fn fenced(&self, lease: LeaseId) -> Option<(u32, u8)> {
        self.svc.fence_info(lease.slot).map(|f| {
            assert_eq!(f.generation, lease.generation);
            (f.failed_mask, f.origin)
        })
    }
}

fn alloc_req() -> AllocReq {
    AllocReq {
        size: 4 << 20,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x1234,
        client_psn: 0x100,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 7],
        client_mac: [2, 0, 0, 0, 0, 2],
    }
}

fn cfg() -> Config {
    Config { grace_ms: 50, ..Config::default() }
}

#[test]
fn a_lease_is_built_revoked_swept_and_scrubbed() {
    let mut r = Rig::new(cfg());
    let extents = r.svc.pool().free_extents();
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    assert_eq!(r.issued, [DESTROY_MKEY], "mkey-first: the key; the QP stays");
    assert_eq!(r.svc.counters.revokes, 1);
    r.issued.clear();
    r.sweep();
    assert_eq!(r.issued, [QP_2ERR, QP_2RST, DESTROY_QP, DEALLOC_PD]);
    assert_eq!(r.host.zeroed, [(0x4000_0000, 2 << 20), (0x4020_0000, 2 << 20)], "scrubbed before reuse");
    assert_eq!(r.svc.pool().free_extents(), extents);
    assert!(r.host.live.is_empty(), "QP buffer and doorbell record freed");
    assert_eq!(r.revoke(lease, false), Outcome::NotFound, "swept");
}

#[test]
fn each_teardown_step_failing_in_turn_fences_with_its_mask_and_origin() {
    // (order qp-first?, opcode failing, outcome, the fenced slot's mask and origin).
    let cases: &[(bool, u16, Outcome, (u32, u8))] = &[
        // Immediate phase, mkey-first: the failed key falls back to 2ERR_QP.
        (false, DESTROY_MKEY, Outcome::Fenced, (step_bit::DESTROY_MKEY, origin::REVOKE)),
        // Immediate phase, qp-first: DESTROY_MKEY still runs after a failed 2ERR_QP.
        (true, QP_2ERR, Outcome::Fenced, (step_bit::QP_2ERR, origin::REVOKE)),
        (true, DESTROY_MKEY, Outcome::Fenced, (step_bit::DESTROY_MKEY, origin::REVOKE)),
        // The sweep.
        (false, QP_2ERR, Outcome::TornDown, (step_bit::QP_2ERR, origin::SWEEP)),
        (false, QP_2RST, Outcome::TornDown, (step_bit::QP_2RST, origin::SWEEP)),
        (false, DESTROY_QP, Outcome::TornDown, (step_bit::DESTROY_QP, origin::SWEEP)),
        (false, DEALLOC_PD, Outcome::TornDown, (step_bit::DEALLOC_PD, origin::SWEEP)),
    ];
    for &(qp_first, opcode, outcome, fenced) in cases {
        let mut r = Rig::new(cfg());
        let extents = r.svc.pool().free_extents();
        let lease = r.active();
        r.script(opcode, &[Answer::Fail]);
        let what = format!("qp_first {qp_first} opcode {opcode:#x}");
        assert_eq!(r.revoke(lease, qp_first), outcome, "{what}");
        r.sweep();
        assert_eq!(r.fenced(lease), Some(fenced), "{what}");
        assert_eq!(r.svc.counters.revokes, 1, "{what}: one revoke, counted once");
        assert_eq!(r.svc.pool().free_extents(), extents - 2, "{what}: the memory never returns");
        assert_eq!(r.revoke(lease, false), Outcome::Fenced, "{what}: idempotent");
        assert!(r.host.zeroed.is_empty(), "{what}");
    }
}

/// The tag sequence started just below each of its limits (bit 61 turning on; the top, 2^30 - 1, and the wrap
/// to 1): a lease built across it, revoked with DESTROY_MKEY failing (the 2ERR fallback must run and the slot
/// fence), and another built, revoked and swept. Every tag is one the command engine takes, and every result
/// finds its lease. With the sequence in bits 32..63 (as it once was) bit 62 turned on at 2^30 and the engine
/// took the tag for its side client's.
#[test]
fn the_command_tag_sequence_crosses_its_limits_and_every_result_finds_its_lease() {
    let max = LeaseService::<u64>::SEQUENCE_MAX;
    for start in [(1 << 29) - 3, (1 << 30) - 3, max - 3, max] {
        let mut r = Rig::new(cfg());
        r.svc.start_sequence_at(start);
        let extents = r.svc.pool().free_extents();
        let a = r.active();
        r.script(DESTROY_MKEY, &[Answer::Fail]);
        assert_eq!(r.revoke(a, false), Outcome::Fenced, "start {start}");
        assert_eq!(r.issued, [DESTROY_MKEY, QP_2ERR], "start {start}: the fallback ran");
        assert_eq!(r.fenced(a), Some((step_bit::DESTROY_MKEY, origin::REVOKE)), "start {start}");
        let b = r.active();
        assert_eq!(r.revoke(b, false), Outcome::TornDown, "start {start}");
        r.issued.clear();
        r.sweep();
        assert_eq!(r.issued, [QP_2ERR, QP_2RST, DESTROY_QP, DEALLOC_PD], "start {start}");
        assert_eq!(r.svc.pool().free_extents(), extents - 2, "start {start}: only the fenced lease's memory kept");
        assert_eq!(r.svc.in_flight(), 0, "start {start}: every result came back to its lease");
        assert_eq!(r.refused, 0, "start {start}: every tag within the engine's client bits");
        let n = r.tags.len() as u64;
        assert!(n >= 12, "start {start}: {n} commands");
        assert_eq!(r.svc.next_sequence(), (start - 1 + n) % max + 1, "start {start}: one number per command");
        let seqs: Vec<u64> = r.tags.iter().map(|t| t >> 32).collect();
        assert_eq!(seqs[0], start);
        assert!(seqs.iter().all(|&s| (1..=max).contains(&s)), "start {start}: {seqs:x?}");
    }
    assert_eq!(max, (1 << 30) - 1, "62 client bits: 32 for the slot, 30 for the sequence");
}

/// A large lease's scrub runs in slices on the service's ticks: each tick zeroes at most its budget's worth
/// (plus the slice that crossed it) on the host's clock, a REVOKE of another lease and an ALLOC that fits are
/// served while it runs, an extent is free only once all of it is zero, and an ALLOC larger than what is
/// ready is refused naming what is still being cleared.
#[test]
fn a_large_scrub_runs_in_slices_and_the_service_answers_meanwhile() {
    const E: u64 = 2 << 20;
    let mut r = Rig::new(cfg());
    let total = r.svc.pool().free_extents() as u64 * E;
    let big = AllocReq { size: 48 << 20, ..alloc_req() };
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(big)) else { panic!("ALLOC 48 MiB") };
    let b = r.active();
    assert_eq!(r.revoke(a.lease, false), Outcome::TornDown);
    // Past the grace: the sweep frees the slot; its memory waits to be cleared.
    let grace = r.svc.config().grace_ms * 1000;
    r.advance(grace + SCAN_INTERVAL_US);
    let waiting = r.svc.pool().scrubbing_bytes();
    assert!(waiting > 40 << 20, "most of the 48 MiB still waits: {waiting}");
    // Free: what was never leased, and of the big lease only the extents already wholly zeroed.
    assert_eq!(r.svc.pool().free_bytes(), total - (52 << 20) + ((48 << 20) - waiting) / E * E);
    let mut ticks = 0;
    let mut served = false;
    while r.svc.pool().scrubbing_bytes() > 0 {
        let (before_us, before, issued) = (r.host.clock_us, r.svc.counters.scrubbed_bytes, r.issued.len());
        r.advance(SCAN_INTERVAL_US);
        ticks += 1;
        let (spent, did) = (r.host.clock_us - before_us, r.svc.counters.scrubbed_bytes - before);
        assert!(did > 0, "each tick moves the scrub on");
        if r.issued.len() == issued {
            // One tick (the rig ticks again after issuing commands): its budget and the slice that crossed it.
            assert!(spent <= r.svc.config().scrub_budget_us + 256, "tick {ticks}: {spent} µs of scrub, {did} bytes");
        }
        // Free means wholly zeroed: each free extent of the big lease has one zeroed range over all of it.
        for e in r.svc.pool().free_list() {
            if (a.remote_addr..a.remote_addr + (48 << 20)).contains(&e) {
                assert!(r.host.zeroed.contains(&(e, E)), "tick {ticks}: extent {e:#x} free before it was zeroed");
            }
        }
        if ticks == 10 {
            // Mid-scrub: a revoke of another lease is answered, an ALLOC larger than what is ready is refused
            // naming what is being cleared, and one that fits is granted.
            assert_eq!(r.revoke(b, false), Outcome::TornDown);
            let ready = r.svc.pool().free_bytes();
            let too_big = AllocReq { size: ready + E, ..alloc_req() };
            let Err(e) = r.call(TENANT, &Request::Alloc(too_big)) else { panic!("granted more than is ready") };
            assert_eq!(e.code, ErrorCode::NoMemory);
            assert!(e.message.contains("being cleared"), "{}", e.message);
            let Ok(Response::Alloc(c)) = r.call(TENANT, &Request::Alloc(small_alloc())) else { panic!("ALLOC") };
            assert!(r.host.zeroed.contains(&(c.remote_addr, E)) || c.remote_addr >= a.remote_addr + (48 << 20));
            served = true;
        }
        assert!(ticks < 1_000, "the scrub never ended");
    }
    assert!(served && ticks > 50, "{ticks} ticks: the scrub was sliced");
    let zeroed: u64 =
        r.host.zeroed.iter().filter(|z| (a.remote_addr..a.remote_addr + (48 << 20)).contains(&z.0)).map(|z| z.1).sum();
    assert_eq!(zeroed, 48 << 20, "every byte of the big lease zeroed once");
    assert_eq!(r.svc.counters.scrubbed_bytes, (48 << 20) + (4 << 20), "the big lease and the one revoked meanwhile");
}

/// Boot's uncleared extents are scrubbed before they are handed out: an ALLOC at first gets only the cleared
/// part, and the pool is whole once the background preparation is done.
#[test]
fn uncleared_pool_memory_is_prepared_in_the_background_before_it_is_lent() {
    const E: u64 = 2 << 20;
    let base = 0x4000_0000u64;
    let uncleared: Vec<u64> = (4..32).map(|i| base + i * E).collect();
    let mut r = Rig::new(Config { uncleared: uncleared.clone(), ..cfg() });
    assert_eq!(r.svc.pool().free_bytes(), 4 * E, "the cleared part is ready at once");
    let big = AllocReq { size: 8 * E, ..alloc_req() };
    let Err(e) = r.call(TENANT, &Request::Alloc(big.clone())) else { panic!("granted uncleared memory") };
    assert_eq!(e.code, ErrorCode::NoMemory);
    r.scrubbed();
    assert_eq!(r.svc.pool().unprepared_bytes(), 0);
    for e in &uncleared {
        assert!(r.host.zeroed.contains(&(*e, E)), "extent {e:#x} prepared");
    }
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(big)) else { panic!("ALLOC after preparation") };
    assert_eq!(a.length, 8 * E);
}

#[test]
fn a_failed_destroy_mkey_falls_back_to_2err_at_once() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, false), Outcome::Fenced);
    assert_eq!(r.issued, [DESTROY_MKEY, QP_2ERR]);
    assert_eq!(r.fenced(lease), Some((step_bit::DESTROY_MKEY, origin::REVOKE)), "the fallback succeeded");
    // Both cuts failing: both bits.
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    r.script(QP_2ERR, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, false), Outcome::Fenced);
    assert_eq!(r.issued, [DESTROY_MKEY, QP_2ERR]);
    assert_eq!(r.fenced(lease), Some((step_bit::DESTROY_MKEY | step_bit::QP_2ERR, origin::REVOKE)));
}

#[test]
fn qp_first_runs_destroy_mkey_after_a_failed_2err_and_records_both() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    assert_eq!(r.revoke(lease, true), Outcome::TornDown);
    assert_eq!(r.issued, [QP_2ERR, DESTROY_MKEY], "the spec's order");
    r.issued.clear();
    r.sweep();
    assert_eq!(r.issued, [QP_2RST, DESTROY_QP, DEALLOC_PD], "the QP is in ERR already");

    let lease = r.active();
    r.script(QP_2ERR, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, true), Outcome::Fenced);
    assert_eq!(r.issued, [QP_2ERR, DESTROY_MKEY], "the strongest cut that remains still runs");
    assert_eq!(r.fenced(lease), Some((step_bit::QP_2ERR, origin::REVOKE)));
    assert_eq!(r.svc.counters.failed_commands, 1);

    let lease = r.active();
    r.script(QP_2ERR, &[Answer::Fail]);
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, true), Outcome::Fenced);
    assert_eq!(r.fenced(lease), Some((step_bit::QP_2ERR | step_bit::DESTROY_MKEY, origin::REVOKE)));
}

#[test]
fn the_revoke_deadline_answers_fenced_and_a_late_completion_changes_nothing() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Hang]);
    let t = r.send(ADMIN, &Request::Revoke { lease, qp_first: false });
    let deadline_us = r.svc.config().revoke_deadline_ms * 1000;
    r.advance(deadline_us - SCAN_INTERVAL_US);
    assert!(r.take(t).is_none(), "nothing before the deadline");
    assert_eq!(r.svc.counters.revokes, 0, "counted when the outcome is known, not when it starts");
    r.advance(SCAN_INTERVAL_US);
    let Some(Ok(Response::Revoke { outcome: Outcome::Fenced, elapsed_us })) = r.take(t) else { panic!() };
    assert_eq!(u64::from(elapsed_us), deadline_us, "answered at the deadline, on the virtual clock");
    assert_eq!(r.fenced(lease), Some((step_bit::DEADLINE, origin::REVOKE)));
    assert_eq!(r.svc.counters.revokes, 1);
    assert_eq!(r.issued, [DESTROY_MKEY], "no fallback while the HCA does not answer");
    // The command completes long after: the slot stays fenced and the tag is retired.
    r.late(Answer::Ok);
    assert_eq!(r.fenced(lease), Some((step_bit::DEADLINE, origin::REVOKE)));
    assert_eq!(r.svc.in_flight(), 0);
}

#[test]
fn a_revoke_of_a_lease_being_built_abandons_the_build() {
    let mut r = Rig::new(cfg());
    let extents = r.svc.pool().free_extents();
    r.script(CREATE_QP, &[Answer::Hang]);
    let alloc = r.send(TENANT, &Request::Alloc(alloc_req()));
    assert!(r.take(alloc).is_none());
    let lease = LeaseId { boot_id: BOOT, slot: 0, generation: 1 };
    let free = r.send(TENANT, &Request::Free { lease });
    let e = r.take(alloc).expect("ALLOC answered at once").unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    assert!(r.take(free).is_none(), "the outcome waits for the command in flight");
    // CREATE_QP answers: the QP exists, and the key is cut.
    r.issued.clear();
    r.late(Answer::Ok);
    assert!(matches!(r.take(free), Some(Ok(Response::Free { outcome: Outcome::TornDown, .. }))));
    assert_eq!(r.issued, [DESTROY_MKEY]);
    assert_eq!((r.svc.counters.revokes, r.svc.counters.allocs), (1, 0));
    r.issued.clear();
    r.sweep();
    assert_eq!(r.issued, [QP_2ERR, QP_2RST, DESTROY_QP, DEALLOC_PD]);
    assert_eq!(r.svc.pool().free_extents(), extents);
    assert_eq!(r.svc.free_slots(), r.svc.config().slots as usize);

    // The command in flight hangs: the deadline fences, as for any revoke.
    r.script(CREATE_MKEY, &[Answer::Hang]);
    let alloc = r.send(TENANT, &Request::Alloc(alloc_req()));
    let t =
        r.send(ADMIN, &Request::Revoke { lease: LeaseId { boot_id: BOOT, slot: 0, generation: 2 }, qp_first: false });
    assert!(r.take(alloc).is_some_and(|a| a.is_err()));
    r.advance(r.svc.config().revoke_deadline_ms * 1000);
    assert!(matches!(r.take(t), Some(Ok(Response::Revoke { outcome: Outcome::Fenced, .. }))));
}

#[test]
fn a_failed_build_step_unwinds_and_an_unwind_failure_fences() {
    for (i, &failing) in BUILD.iter().enumerate() {
        let mut r = Rig::new(cfg());
        r.script(failing, &[Answer::Fail]);
        let e = r.call(TENANT, &Request::Alloc(alloc_req())).unwrap_err();
        assert_eq!((e.code, e.detail[0] >> 16), (ErrorCode::HcaError, u32::from(failing)));
        let undo: &[u16] = match i {
            0 => &[],
            1 => &[DEALLOC_PD],
            2 => &[DESTROY_MKEY, DEALLOC_PD],
            _ => &[QP_2RST, DESTROY_QP, DESTROY_MKEY, DEALLOC_PD],
        };
        assert_eq!(&r.issued[i + 1..], undo, "failing {failing:#x}");
        assert_eq!((r.svc.free_slots(), r.svc.fenced_count()), (r.svc.config().slots as usize, 0));
    }
    let mut r = Rig::new(cfg());
    r.script(INIT2RTR, &[Answer::Fail]);
    r.script(DESTROY_QP, &[Answer::Fail]);
    assert!(r.call(TENANT, &Request::Alloc(alloc_req())).is_err());
    let lease = LeaseId { boot_id: BOOT, slot: 0, generation: 1 };
    assert_eq!(r.fenced(lease), Some((step_bit::DESTROY_QP | step_bit::UNWIND, origin::LEGACY)));
}

#[test]
fn expiries_are_counted_when_their_outcome_is_known() {
    let mut r = Rig::new(Config { ready_timeout_ms: 100, ..cfg() });
    let Ok(Response::Alloc(_)) = r.call(TENANT, &Request::Alloc(alloc_req())) else { panic!() };
    r.script(DESTROY_MKEY, &[Answer::Hang]);
    r.advance(100_000 + SCAN_INTERVAL_US);
    assert_eq!(r.svc.counters.expiries, 0, "the immediate phase is still running");
    r.late(Answer::Ok);
    assert_eq!((r.svc.counters.expiries, r.svc.counters.revokes), (1, 0));
}

#[test]
fn fenced_summary_pages_past_one_frame() {
    let n = 300;
    let pool_bytes = u64::from(n) * alloc_req().size;
    let mut r = Rig::new(Config { slots: n, tenant_leases: n, pool: one_run(0, pool_bytes), ..cfg() });
    let mut leases = Vec::new();
    for _ in 0..n {
        leases.push(r.active());
    }
    // An HCA that refuses everything: every slot fences.
    r.script(DESTROY_MKEY, &vec![Answer::Fail; n as usize]);
    r.script(QP_2ERR, &vec![Answer::Fail; n as usize]);
    r.svc.revoke_all(r.now_us, &mut r.host);
    r.run();
    assert_eq!(r.svc.fenced_count(), n);
    assert_eq!(r.svc.counters.expiries, u64::from(n));
    // One page is one frame; all pages together list every fenced slot once, in slot order.
    let mut all = Vec::new();
    let mut cursor = 0;
    loop {
        let (next_cursor, slots) = r.svc.fenced(ADMIN, cursor, u16::MAX);
        assert!(slots.len() <= LIST_MAX);
        let resp = Response::FencedSummary { next_cursor, slots: slots.clone() };
        let mut f = Vec::new();
        resp.encode(Op::FencedSummary, 1, &mut f);
        assert!(f.len() - HEADER_LEN <= MAX_PAYLOAD, "{} bytes", f.len());
        all.extend(slots);
        if next_cursor == 0 {
            break;
        }
        assert!(next_cursor > cursor);
        cursor = next_cursor;
    }
    assert_eq!(all.iter().map(|f| f.slot).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
    assert!(all.iter().all(|f| f.failed_mask == step_bit::DESTROY_MKEY | step_bit::QP_2ERR));
    // A page of one, and a tenant that sees nothing of another's.
    assert_eq!(r.svc.fenced(ADMIN, 5, 1), (6, vec![all[5].clone()]));
    let other = Who { session: 9, tenant: "beta", admin: false };
    assert_eq!(r.svc.fenced(other, 0, 128), (0, vec![]));
}

/// ALLOC with `client_mac` 0 for a client at 10.0.2.100 (IPv4-mapped GID).
fn resolve_req() -> AllocReq {
    let mut gid = [0u8; 16];
    gid[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 2, 100]);
    AllocReq { client_gid: gid, client_mac: [0; 6], ..alloc_req() }
}

#[test]
fn client_mac_zero_waits_for_the_hosts_arp_then_builds() {
    let mut r = Rig::new(cfg());
    r.host.resolves = true;
    let t = r.send(TENANT, &Request::Alloc(resolve_req()));
    assert!(r.take(t).is_none() && r.issued.is_empty(), "nothing built before the MAC is known");
    r.advance(10 * SCAN_INTERVAL_US);
    assert!(r.take(t).is_none(), "still asking");
    assert!(r.host.asked >= 10, "asked again on every scan: {}", r.host.asked);
    r.host.arp.insert(core::net::Ipv4Addr::new(10, 0, 2, 100), [2, 0, 0, 0, 0, 0x64]);
    r.advance(SCAN_INTERVAL_US);
    let reply = r.take(t).expect("answered once the MAC is known");
    assert!(matches!(reply, Ok(Response::Alloc(_))), "{reply:?}");
    assert_eq!(r.svc.counters.resolved, 1);
    assert!(r.issued.contains(&ifc::qp::MLX5_CMD_OP_CREATE_QP), "{:?}", r.issued);
}

#[test]
fn client_mac_zero_times_out_without_an_answer_and_keeps_nothing() {
    let mut r = Rig::new(cfg());
    r.host.resolves = true;
    let free = r.svc.pool().free_extents();
    let t = r.send(TENANT, &Request::Alloc(resolve_req()));
    r.advance(RESOLVE_TIMEOUT_MS * 1000 - SCAN_INTERVAL_US);
    assert!(r.take(t).is_none(), "not before the deadline");
    r.advance(2 * SCAN_INTERVAL_US);
    match r.take(t) {
        Some(Err(e)) => {
            assert_eq!(e.code, ErrorCode::Timeout);
            assert!(e.message.contains("10.0.2.100"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((r.svc.counters.resolve_timeouts, r.svc.pool().free_extents()), (1, free));
    assert!(r.issued.is_empty());
}

#[test]
fn client_mac_zero_is_refused_where_it_cannot_be_resolved() {
    let mut r = Rig::new(cfg());
    let e = |r: &mut Rig, req: AllocReq| match r.call(TENANT, &Request::Alloc(req)) {
        Err(e) => e,
        other => panic!("{other:?}"),
    };
    let no_port = e(&mut r, resolve_req());
    assert_eq!(no_port.code, ErrorCode::BadParam);
    assert!(no_port.message.contains("no port to ARP on"), "{}", no_port.message);
    r.host.resolves = true;
    let not_ipv4 = e(&mut r, AllocReq { client_gid: [0xfe; 16], client_mac: [0; 6], ..alloc_req() });
    assert!(not_ipv4.message.contains("IPv4-mapped"), "{}", not_ipv4.message);
    // With a MAC given too: the lease QP could not send to an IPv6 GID from the appliance's IPv4 one.
    let ipv6 = e(&mut r, AllocReq { client_gid: [0xfe; 16], ..alloc_req() });
    assert_eq!(ipv6.code, ErrorCode::BadParam);
    assert!(ipv6.message.contains("alloc.client_gid") && ipv6.message.contains("IPv4-mapped"), "{}", ipv6.message);
    let multicast = e(&mut r, AllocReq { client_mac: [1, 0, 0, 0, 0, 1], ..alloc_req() });
    assert!(multicast.message.contains("unicast"), "{}", multicast.message);
    assert_eq!(r.host.asked, 0, "nothing asked for a request refused up front");
}

#[test]
fn a_lost_session_drops_its_waiting_alloc() {
    let mut r = Rig::new(cfg());
    r.host.resolves = true;
    let t = r.send(TENANT, &Request::Alloc(resolve_req()));
    r.svc.session_lost(TENANT.session, r.now_us);
    r.host.arp.insert(core::net::Ipv4Addr::new(10, 0, 2, 100), [2, 0, 0, 0, 0, 0x64]);
    r.advance(10 * SCAN_INTERVAL_US);
    assert!(r.take(t).is_none() && r.issued.is_empty(), "no lease built for a session that is gone");
}

/// The lease QPs' contexts carry the HCA's values: `log_msg_max`, `ts_format`, `user_index` at CREATE_QP,
/// the atomic mode at RST2INIT, `log_msg_max` and `log_rra_max` (bounded by `log_max_ra_res_qp`) at INIT2RTR.
#[test]
fn lease_qps_follow_the_caps() {
    let caps = QpCaps {
        log_msg_max: 20,
        log_max_ra_res: 2,
        log_max_ra_req: 1,
        ts_format: 1,
        user_index: None,
        atomic_mode: Some(ifc::qp::ATOMIC_MODE_8B),
    };
    let mut r = Rig::with_qp(cfg(), caps);
    let req = AllocReq { access: access::REMOTE_READ | access::REMOTE_ATOMIC, ..alloc_req() };
    let Ok(Response::Alloc(_)) = r.call(TENANT, &Request::Alloc(req)) else { panic!("ALLOC") };
    // qpc sits at byte 0x18 of every QP command; read the inputs as QUERY_QP images.
    let qpc = |r: &Rig, op: u16| {
        let mut img = r.inputs[&op].clone();
        img.resize(ifc::qp::QUERY_QP_OUT_LEN, 0);
        (ifc::qp::query_qp_out(&Output::new(img.clone())), img)
    };
    let (create, img) = qpc(&r, ifc::qp::MLX5_CMD_OP_CREATE_QP);
    assert_eq!(create.log_msg_max, 20);
    // ts_format: qpc bit 0x58 (2 bits) = byte 0x23 bits 7:6; user_index: qpc bit 0x88 = bytes 0x29..0x2c.
    assert_eq!((img[0x23] >> 6, &img[0x29..0x2c]), (1, &[0u8, 0, 0][..]));
    let (init, img) = qpc(&r, ifc::qp::MLX5_CMD_OP_RST2INIT_QP);
    // atomic_mode: qpc bit 0x48c (4 bits) = byte 0xa9 bits 3:0.
    assert!(init.rae && init.rre && !init.rwe);
    assert_eq!(img[0xa9] & 0xf, ifc::qp::ATOMIC_MODE_8B);
    let (rtr, _) = qpc(&r, ifc::qp::MLX5_CMD_OP_INIT2RTR_QP);
    assert_eq!((rtr.log_msg_max, rtr.log_rra_max), (20, 2));
    let (rts, _) = qpc(&r, ifc::qp::MLX5_CMD_OP_RTR2RTS_QP);
    assert_eq!(rts.log_sra_max, 0, "the lease QPs never read");
}

/// Without atomic caps, ALLOC refuses REMOTE_ATOMIC up front with BAD_PARAM naming the reason, and builds
/// nothing; reads and writes still go.
#[test]
fn alloc_refuses_atomics_the_hca_does_not_offer() {
    let mut r = Rig::with_qp(cfg(), QpCaps { atomic_mode: None, ..qp_caps() });
    let req = AllocReq { access: access::REMOTE_WRITE | access::REMOTE_ATOMIC, ..alloc_req() };
    match r.call(TENANT, &Request::Alloc(req)) {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::BadParam);
            assert!(e.message.contains("alloc.access") && e.message.contains("no remote atomics"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(r.issued.is_empty(), "{:?}", r.issued);
    let Ok(Response::Alloc(_)) = r.call(TENANT, &Request::Alloc(alloc_req())) else { panic!("ALLOC rw") };
    // With the caps, the same request goes through.
    let mut r = Rig::new(cfg());
    let req = AllocReq { access: access::REMOTE_WRITE | access::REMOTE_ATOMIC, ..alloc_req() };
    assert!(matches!(r.call(TENANT, &Request::Alloc(req)), Ok(Response::Alloc(_))));
}

#[test]
fn lease_qps_carry_the_configured_dscp_and_priority() {
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let mut r = Rig::new(cfg());
    r.active();
    let b = r.last_init2rtr.clone();
    assert_eq!((be32(&b, 0x3c) >> 20 & 0xff, b[0x54] >> 4 & 7), (0, 0), "best effort unless configured");
    // rdma_dscp=26 (AF31), rdma_prio=3: the address path's tclass, dscp and eth_prio.
    let mut r = Rig::new(Config { tclass: 26 << 2, eth_prio: 3, ..cfg() });
    r.active();
    let b = &r.last_init2rtr;
    assert_eq!(be32(b, 0x3c) >> 20 & 0xff, 26 << 2, "tclass");
    assert_eq!(be32(b, 0x50) >> 16 & 0x3f, 26, "dscp");
    assert_eq!(b[0x54] >> 4 & 7, 3, "eth_prio");
}

// ---- unpredictable identifiers (docs/security.md, "Identifiers") ----

/// The generator initial PSNs came from before: xorshift64, PSN = state bits 20..43.
fn xorshift_psn(state: &mut u64) -> u32 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    (x >> 20) as u32 & 0xff_ffff
}

/// The attack on it: xorshift64 is linear over GF(2), so each PSN bit is a known XOR of the bits of the
/// unknown seed. Four PSNs give 96 such equations for 64 unknowns; Gaussian elimination recovers the seed,
/// and the generator then gives the next PSN. `None` when the PSNs fit no xorshift64 seed.
fn predict_next_xorshift_psn(psns: &[u32]) -> Option<u32> {
    // Each state bit as a mask over the seed's bits.
    let mut sym: [u64; 64] = core::array::from_fn(|j| 1u64 << j);
    let shl = |s: &[u64; 64], k: usize| -> [u64; 64] { core::array::from_fn(|j| if j >= k { s[j - k] } else { 0 }) };
    let shr =
        |s: &[u64; 64], k: usize| -> [u64; 64] { core::array::from_fn(|j| if j + k < 64 { s[j + k] } else { 0 }) };
    let xor = |a: &mut [u64; 64], b: [u64; 64]| a.iter_mut().zip(b).for_each(|(a, b)| *a ^= b);
    let mut rows: Vec<(u64, bool)> = Vec::new();
    for &psn in psns {
        let t = shl(&sym, 13);
        xor(&mut sym, t);
        let t = shr(&sym, 7);
        xor(&mut sym, t);
        let t = shl(&sym, 17);
        xor(&mut sym, t);
        rows.extend((0..24).map(|i| (sym[20 + i], psn >> i & 1 == 1)));
    }
    // Gaussian elimination over GF(2).
    let mut pivots: Vec<(usize, u64, bool)> = Vec::new();
    for (mut m, mut v) in rows {
        for &(bit, pm, pv) in &pivots {
            if m >> bit & 1 == 1 {
                m ^= pm;
                v ^= pv;
            }
        }
        if m == 0 {
            if v {
                return None; // inconsistent: no xorshift64 seed gives these PSNs
            }
            continue;
        }
        let bit = m.trailing_zeros() as usize;
        for p in pivots.iter_mut() {
            if p.1 >> bit & 1 == 1 {
                p.1 ^= m;
                p.2 ^= v;
            }
        }
        pivots.push((bit, m, v));
    }
    // Back-substituted: each pivot row is its bit plus free bits, which are taken as 0.
    let seed = pivots.iter().filter(|p| p.2).fold(0u64, |s, p| s | 1 << p.0);
    let mut state = seed;
    for _ in psns {
        xorshift_psn(&mut state);
    }
    Some(xorshift_psn(&mut state))
}

fn small_alloc() -> AllocReq {
    AllocReq { size: 2 << 20, ..alloc_req() }
}

/// `n` ALLOCs in a row: their (server PSN, rkey).
fn grant_many(r: &mut Rig, n: usize) -> Vec<(u32, u32)> {
    (0..n)
        .map(|i| match r.call(TENANT, &Request::Alloc(small_alloc())) {
            Ok(Response::Alloc(a)) => (a.server_psn, a.rkey),
            other => panic!("ALLOC {i}: {other:?}"),
        })
        .collect()
}

#[test]
fn the_attack_predicts_the_old_generator() {
    // The attack code is sound: against xorshift64 four PSNs give the fifth, whatever the seed.
    for seed in [0x5eed_1ea5_e0b0_c0de_u64 | 1, 0x1234_5678_9abc_def1, 3, u64::MAX] {
        let mut s = seed;
        let psns: Vec<u32> = (0..5).map(|_| xorshift_psn(&mut s)).collect();
        assert_eq!(predict_next_xorshift_psn(&psns[..4]), Some(psns[4]), "seed {seed:#x}");
    }
}

#[test]
fn initial_psns_do_not_follow_from_earlier_ones() {
    let mut r = Rig::new(Config { pool: one_run(0x4000_0000, 1 << 30), tenant_leases: 1024, ..cfg() });
    let got = grant_many(&mut r, 300);
    let psns: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert!(psns.iter().all(|p| *p <= 0xff_ffff), "24-bit PSNs");
    // Any four consecutive answers, as an attacker who made four ALLOCs sees them: the next PSN is not the
    // one the xorshift64 attack predicts (it is not a xorshift64 sequence at all).
    for w in psns.windows(5) {
        assert_ne!(predict_next_xorshift_psn(&w[..4]), Some(w[4]), "PSN predicted from {:x?}", &w[..4]);
    }
    // Nor does a PSN follow from the last by a fixed step.
    let steps: BTreeSet<u32> = psns.windows(2).map(|w| w[1].wrapping_sub(w[0]) & 0xff_ffff).collect();
    assert!(steps.len() > 290, "{} distinct steps", steps.len());
    let distinct: BTreeSet<u32> = psns.iter().copied().collect();
    assert_eq!(distinct.len(), psns.len(), "300 leases, 300 different initial PSNs");
}

#[test]
fn rkey_variants_are_not_a_counter() {
    let mut r = Rig::new(Config { pool: one_run(0x4000_0000, 1 << 30), tenant_leases: 1024, ..cfg() });
    let variants: Vec<u8> = grant_many(&mut r, 300).iter().map(|g| g.1 as u8).collect();
    let counted = variants.windows(2).filter(|w| w[1] == w[0].wrapping_add(1)).count();
    assert!(counted < 10, "{counted} of 299 variants were the previous one plus 1");
    let distinct: BTreeSet<u8> = variants.iter().copied().collect();
    assert!(distinct.len() > 150, "only {} distinct variants in 300 keys", distinct.len());
}

#[test]
fn a_reused_mkey_index_never_gets_its_previous_variant() {
    // An HCA that hands out the same index each time: every new key must differ from the stale one.
    let mut r = Rig::new(cfg());
    r.mkey_index = Some(|_| 0x42);
    let mut last: Option<u32> = None;
    for _ in 0..100 {
        let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(alloc_req())) else { panic!("ALLOC") };
        assert_eq!(a.rkey >> 8, 0x42);
        assert_ne!(Some(a.rkey), last, "a stale rkey names the new lease");
        last = Some(a.rkey);
        assert_eq!(r.revoke(a.lease, false), Outcome::TornDown);
        r.sweep();
    }
}

#[test]
fn a_key_equal_to_a_stale_one_is_never_granted() {
    // Every index 0x1000 + v last had variant v, and the HCA answers the index whose old variant is the one
    // asked for: the new key would equal a stale one. The ALLOC fails and unwinds; nothing is granted.
    let mut r = Rig::new(cfg());
    for v in 0..=255u8 {
        r.svc.ids.destroyed(0x1000 + u32::from(v), v);
    }
    r.mkey_index = Some(|v| 0x1000 + u32::from(v));
    let extents = r.svc.pool().free_extents();
    let reply = r.call(TENANT, &Request::Alloc(alloc_req()));
    let Err(e) = reply else { panic!("granted: {reply:?}") };
    assert_eq!(e.code, ErrorCode::Internal);
    assert!(e.message.contains("previous variant"), "{}", e.message);
    assert_eq!(r.issued, [ALLOC_PD, CREATE_MKEY, DESTROY_MKEY, DEALLOC_PD], "the key is destroyed at once");
    // The unwound lease's memory is scrubbed like any other before it is free again.
    r.scrubbed();
    assert_eq!(r.svc.pool().free_extents(), extents);
    assert!(r.host.live.is_empty());
}

#[test]
fn a_stale_key_made_for_a_lease_already_revoked_is_torn_down_as_usual() {
    let mut r = Rig::new(cfg());
    for v in 0..=255u8 {
        r.svc.ids.destroyed(0x1000 + u32::from(v), v);
    }
    r.mkey_index = Some(|v| 0x1000 + u32::from(v));
    r.script(CREATE_MKEY, &[Answer::Hang]);
    let alloc = r.send(TENANT, &Request::Alloc(alloc_req()));
    let free = r.send(TENANT, &Request::Free { lease: LeaseId { boot_id: BOOT, slot: 0, generation: 1 } });
    assert!(r.take(alloc).is_some_and(|a| a.is_err()), "the FREE ends the ALLOC");
    r.issued.clear();
    // CREATE_MKEY answers with the stale key: the revoke destroys it; nothing fences.
    r.late(Answer::Ok);
    assert!(matches!(r.take(free), Some(Ok(Response::Free { outcome: Outcome::TornDown, .. }))));
    assert_eq!(r.issued, [DESTROY_MKEY]);
    r.sweep();
    assert_eq!(r.svc.fenced_count(), 0);
    assert_eq!(r.svc.free_slots(), r.svc.config().slots as usize);
}

// ---- per-tenant budgets from the options ----

/// The config the options give: `tenant_mib=` and `tenant_allocs_per_s=` reach the service.
fn from_options(words: &[(&str, &str)]) -> Config {
    let mut o = crate::LeaseOptions::default();
    for (k, v) in words {
        assert_eq!(o.apply(k, v), Ok(true), "{k}={v}");
    }
    let parts = crate::setup::LeaseParts {
        hca: HcaCtx {
            uar: UarPage(1),
            cqn: Cqn(2),
            gid: [7; 16],
            gid_index: 0,
            mac: [2, 0, 0, 0, 0, 7],
            port_mtu: 3,
            qp: qp_caps(),
            umr: UmrCtx::OFF,
        },
        pool: Vec::new(),
        extents: Vec::new(),
        uncleared: Vec::new(),
        rdma_ip: crate::options::DEFAULT_RDMA_IP,
        max_region: u64::MAX,
        hca_slots: 1 << 20,
    };
    Config { grace_ms: cfg().grace_ms, ..Config::from_options(&o, &parts) }
}

#[test]
fn every_lease_command_names_its_slot_in_its_tag_and_its_error_report() {
    // The command path's six build commands and a revoke's, each tagged and labelled with the lease's slot
    // (CREATE_MKEY's `slot` label was once dropped: its builder fills the attributes the command keeps).
    let mut r = Rig::new(cfg());
    let l = r.active();
    assert_eq!(r.revoke(l, false), Outcome::TornDown);
    let ops: Vec<u16> = r.slot_attrs.iter().map(|a| a.0).collect();
    assert_eq!(ops, [ALLOC_PD, CREATE_MKEY, CREATE_QP, RST2INIT, INIT2RTR, RTR2RTS, DESTROY_MKEY]);
    for (op, tag_slot, attr) in &r.slot_attrs {
        assert_eq!((*tag_slot, *attr), (l.slot, Some(u64::from(l.slot))), "opcode {op:#x}");
    }
}

#[test]
fn lease_warm_picks_the_path_and_is_no_more_than_the_slots() {
    // The default: UMR wherever the caps allow it.
    let d = from_options(&[]);
    assert_eq!(d.warm, crate::config::DEFAULT_WARM);
    let r = Rig::with_umr(d);
    assert_eq!((r.svc.paths().grant_umr, r.svc.paths().revoke_umr), (true, true));
    assert!(std::format!("{}", r.svc.paths()).starts_with("grant=umr revoke=umr "), "{}", r.svc.paths());
    // `lease_warm=0`: the commands, whatever the caps say.
    let off = from_options(&[("lease_warm", "0")]);
    assert_eq!(off.warm, 0);
    let r = Rig::with_umr(off);
    assert_eq!((r.svc.paths().grant_umr, r.svc.paths().revoke_umr), (false, false));
    assert!(std::format!("{}", r.svc.paths()).starts_with("grant=commands revoke=commands "), "{}", r.svc.paths());
    // Entries past the slots could never be taken at once: lowered to them.
    assert_eq!(from_options(&[("lease_slots", "4"), ("lease_warm", "1024")]).warm, 4);
    assert_eq!(from_options(&[("lease_slots", "4096"), ("lease_warm", "1024")]).warm, 1024);
}

#[test]
fn a_tenant_is_stopped_at_its_byte_limit() {
    let mut r = Rig::new(from_options(&[("tenant_mib", "8")]));
    // 4 MiB leases: two fit in 8 MiB, the third is refused LIMIT; another principal is not affected.
    for _ in 0..2 {
        assert!(matches!(r.call(TENANT, &Request::Alloc(alloc_req())), Ok(Response::Alloc(_))));
    }
    let e = r.call(TENANT, &Request::Alloc(alloc_req())).unwrap_err();
    assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
    assert!(e.message.contains("limit is 8388608"), "{}", e.message);
    let other = Who { session: 3, tenant: "beta", admin: false };
    assert!(matches!(r.call(other, &Request::Alloc(alloc_req())), Ok(Response::Alloc(_))));
    // Its figures: two leases, 8 MiB held, nothing left to take.
    let (by_state, held, free) = r.svc.tenant_figures("alpha");
    assert_eq!((by_state.iter().sum::<u32>(), held, free), (2, 8 << 20, 0));
    let (by_state, held, free) = r.svc.tenant_figures("beta");
    assert_eq!((by_state.iter().sum::<u32>(), held, free), (1, 4 << 20, 4 << 20));
    assert_eq!(r.svc.tenant_figures("nobody"), ([0; 5], 0, 8 << 20));
}

#[test]
fn a_tenant_alloc_rate_is_limited_on_the_service_clock() {
    let mut r = Rig::new(Config {
        pool: one_run(0x4000_0000, 1 << 30),
        tenant_leases: 1024,
        ..from_options(&[("tenant_allocs_per_s", "2")])
    });
    let small = AllocReq { size: 4096, ..alloc_req() };
    // A burst of one second's worth, then BUSY with the rate and the wait for the next token.
    for _ in 0..2 {
        assert!(matches!(r.call(TENANT, &Request::Alloc(small.clone())), Ok(Response::Alloc(_))));
    }
    let e = r.call(TENANT, &Request::Alloc(small.clone())).unwrap_err();
    assert_eq!((e.code, e.detail), (ErrorCode::Busy, [2, 500, 0]), "{e:?}");
    // The admin and other tenants have their own budgets.
    assert!(matches!(r.call(ADMIN, &Request::Alloc(small.clone())), Ok(Response::Alloc(_))));
    let other = Who { session: 3, tenant: "beta", admin: false };
    assert!(matches!(r.call(other, &Request::Alloc(small.clone())), Ok(Response::Alloc(_))));
    // Half a second on the service's clock gives one token back: one ALLOC, then BUSY again.
    r.now_us += 250_000;
    let e = r.call(TENANT, &Request::Alloc(small.clone())).unwrap_err();
    assert_eq!((e.code, e.detail[1]), (ErrorCode::Busy, 250));
    r.now_us += 250_000;
    assert!(matches!(r.call(TENANT, &Request::Alloc(small.clone())), Ok(Response::Alloc(_))));
    assert_eq!(r.call(TENANT, &Request::Alloc(small.clone())).unwrap_err().code, ErrorCode::Busy);
    // A long pause refills no more than the burst.
    r.now_us += 60_000_000;
    for _ in 0..2 {
        assert!(matches!(r.call(TENANT, &Request::Alloc(small.clone())), Ok(Response::Alloc(_))));
    }
    assert_eq!(r.call(TENANT, &Request::Alloc(small)).unwrap_err().code, ErrorCode::Busy);
}

fn code(r: Reply) -> Option<ErrorCode> {
    r.err().map(|e| e.code)
}

#[test]
fn an_id_from_another_boot_names_no_lease() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    assert_eq!(lease.boot_id, BOOT, "granted under this boot's id");
    // The same slot and generation from an earlier boot: exactly a lease that does not exist.
    let old = LeaseId { boot_id: [0xaa; 16], ..lease };
    assert_eq!(code(r.call(TENANT, &Request::Query { lease: old })), Some(ErrorCode::NotFound));
    assert_eq!(code(r.call(ADMIN, &Request::Query { lease: old })), Some(ErrorCode::NotFound));
    assert_eq!(code(r.call(TENANT, &Request::Renew { lease: old, ttl_ms: 0 })), Some(ErrorCode::NotFound));
    let ready = Request::Ready { lease: old, client_qpn: 0x1234, server_qpn: 0 };
    assert_eq!(code(r.call(TENANT, &ready)), Some(ErrorCode::NotFound));
    assert!(matches!(
        r.call(TENANT, &Request::Free { lease: old }),
        Ok(Response::Free { outcome: Outcome::NotFound, .. })
    ));
    assert_eq!(r.revoke(old, false), Outcome::NotFound);
    // The lease itself is untouched.
    assert!(matches!(r.call(TENANT, &Request::Query { lease }), Ok(Response::Query(i)) if i.lease == lease));
    assert!(r.notices().is_empty());
}

#[test]
fn the_owner_hears_of_revokes_and_expiries_but_not_of_its_own_free() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Revoked { lease, outcome: Outcome::TornDown })]);
    let mine = r.active();
    assert!(matches!(r.call(TENANT, &Request::Free { lease: mine }), Ok(Response::Free { .. })));
    assert!(r.notices().is_empty(), "the tenant's own FREE: the answer says it all");
    // A TTL that runs out: the Expiring notice first, then the revoke's.
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(AllocReq { ttl_ms: 400, ..alloc_req() })) else {
        panic!("ALLOC")
    };
    r.advance(401_000);
    assert_eq!(
        r.notices(),
        [
            ("alpha".to_string(), Notice::Expiring { lease: a.lease, in_ms: 100 }),
            ("alpha".to_string(), Notice::Revoked { lease: a.lease, outcome: Outcome::TornDown }),
        ]
    );
}

#[test]
fn revoke_notices_off_withholds_the_revoked_notice_but_query_still_tells() {
    let mut r = Rig::new(from_options(&[("revoke_notices", "off")]));
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    assert!(r.notices().is_empty(), "revoke_notices=off: no Revoked notice");
    // The owner's QUERY is how a client that missed the notice learns of the revoke.
    assert!(
        matches!(r.call(TENANT, &Request::Query { lease }), Ok(Response::Query(i)) if i.state == LeaseState::PendingDestroy)
    );
    // The Expiring notice is not a revoke's and still comes.
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(AllocReq { ttl_ms: 400, ..alloc_req() })) else {
        panic!("ALLOC")
    };
    r.advance(401_000);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Expiring { lease: a.lease, in_ms: 100 })]);
}

#[test]
fn a_revoke_that_fences_says_so_and_a_fenced_sweep_is_told_as_a_fence() {
    let mut r = Rig::new(cfg());
    let lease = r.active();
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    r.script(QP_2ERR, &[Answer::Fail]);
    assert_eq!(r.revoke(lease, false), Outcome::Fenced);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Revoked { lease, outcome: Outcome::Fenced })]);
    // Torn down, then the sweep fails: the lease had ended (told as Revoked); its slot is now fenced too.
    let lease = r.active();
    assert_eq!(r.revoke(lease, false), Outcome::TornDown);
    r.script(DESTROY_QP, &[Answer::Fail]);
    r.script(QP_2RST, &[Answer::Fail]);
    r.sweep();
    assert!(r.svc.fence_info(lease.slot).is_some(), "the sweep fenced the slot");
    assert_eq!(
        r.notices(),
        [
            ("alpha".to_string(), Notice::Revoked { lease, outcome: Outcome::TornDown }),
            ("alpha".to_string(), Notice::Fenced { lease }),
        ]
    );
}

#[test]
fn expiring_is_told_once_per_ttl_within_a_quarter_of_it_at_most_five_seconds() {
    assert_eq!((expiring_threshold_ms(8_000), expiring_threshold_ms(60_000)), (2_000, 5_000));
    let mut r = Rig::new(Config { heartbeat_renews: false, ..cfg() });
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(AllocReq { ttl_ms: 8_000, ..alloc_req() })) else {
        panic!("ALLOC")
    };
    let ready = Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn };
    assert!(r.call(TENANT, &ready).is_ok());
    r.advance(5_990_000);
    assert!(r.notices().is_empty(), "8 s TTL, 2.01 s left: not yet");
    r.advance(20_000);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Expiring { lease: a.lease, in_ms: 2_000 })]);
    r.advance(1_000_000);
    assert!(r.notices().is_empty(), "once");
    // A renewal re-arms it for the new TTL.
    assert!(r.call(TENANT, &Request::Renew { lease: a.lease, ttl_ms: 8_000 }).is_ok());
    r.advance(6_000_000);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Expiring { lease: a.lease, in_ms: 2_000 })]);
}

#[test]
fn drain_warns_refuses_allocs_waits_then_revokes_the_tenants_leases_only() {
    let mut r = Rig::new(cfg());
    const OTHER: Who<'static> = Who { session: 5, tenant: "beta", admin: false };
    let a = r.active();
    let Ok(Response::Alloc(b)) = r.call(OTHER, &Request::Alloc(alloc_req())) else { panic!("ALLOC beta") };
    let drain = Request::Drain { tenant: "alpha".to_string(), notice_ms: 1_000 };
    assert_eq!(code(r.call(TENANT, &drain)), Some(ErrorCode::Forbidden));
    assert!(matches!(r.call(ADMIN, &drain), Ok(Response::Drain { leases: 1, .. })));
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Draining { in_ms: 1_000 })]);
    let refused = r.call(TENANT, &Request::Alloc(alloc_req())).unwrap_err();
    assert_eq!(refused.code, ErrorCode::Busy);
    assert!(refused.message.contains("draining"), "{}", refused.message);
    assert!(r.call(OTHER, &Request::Alloc(alloc_req())).is_ok(), "another tenant is not drained");
    r.advance(990_000);
    assert!(
        matches!(r.call(TENANT, &Request::Query { lease: a }), Ok(Response::Query(i)) if i.state == LeaseState::Active)
    );
    r.advance(20_000);
    assert_eq!(r.notices(), [("alpha".to_string(), Notice::Revoked { lease: a, outcome: Outcome::TornDown })]);
    assert!(
        matches!(r.call(TENANT, &Request::Query { lease: a }), Ok(Response::Query(i)) if i.state == LeaseState::PendingDestroy)
    );
    assert!(
        matches!(r.call(OTHER, &Request::Query { lease: b.lease }), Ok(Response::Query(i)) if i.state == LeaseState::Granted)
    );
    // The drain is over: the tenant may ALLOC again.
    assert!(r.call(TENANT, &Request::Alloc(alloc_req())).is_ok());
    // Every tenant at once, with no notice time: revoked at the next scan.
    assert!(matches!(
        r.call(ADMIN, &Request::Drain { tenant: String::new(), notice_ms: 0 }),
        Ok(Response::Drain { leases: 3, .. })
    ));
    r.advance(SCAN_INTERVAL_US);
    let n = r.notices();
    assert_eq!(n[0], (String::new(), Notice::Draining { in_ms: 0 }));
    assert_eq!(n.iter().filter(|(_, n)| matches!(n, Notice::Revoked { .. })).count(), 3, "{n:?}");
}

/// The lost-session hand-over, on virtual time: session A of the tenant allocates and goes silent; session B of
/// the same tenant RENEWs and QUERYs the lease every 2 s; at 10 s A's heartbeat timeout ends it. B's renewals must keep
/// the lease (before the fix, the orphaned lease expired at the end of the session grace period — at once with
/// a grace of 0 — and B's RENEW answered BAD_STATE). B is open, so A's leases pass to it when A is lost; and
/// should a lease be orphaned anyway (`known` false: the service never heard B start), B's RENEW adopts it.
#[test]
fn a_second_session_that_renews_keeps_the_lease_when_the_first_times_out() {
    for (grace_ms, known) in [(0, true), (30_000, true), (30_000, false)] {
        let mut r = Rig::new(Config { session_grace_ms: grace_ms, heartbeat_renews: true, ..cfg() });
        const A: Who<'static> = Who { session: 1, tenant: "alpha", admin: false };
        const B: Who<'static> = Who { session: 3, tenant: "alpha", admin: false };
        r.svc.session_started(A.session, "alpha");
        let Ok(Response::Alloc(a)) = r.call(A, &Request::Alloc(AllocReq { ttl_ms: 5_000, ..alloc_req() })) else {
            panic!("ALLOC")
        };
        let ready = Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn };
        assert!(r.call(A, &ready).is_ok());
        if known {
            assert_eq!(r.svc.session_started(B.session, "alpha"), 0, "A still holds it");
        }
        for t in 1..=40 {
            r.advance(2_000_000);
            let now_s = 2 * t;
            if now_s == 10 {
                r.svc.session_lost(A.session, r.now_us);
            }
            let renew = r.call(B, &Request::Renew { lease: a.lease, ttl_ms: 5_000 });
            assert!(matches!(renew, Ok(Response::Renew { ttl_ms: 5_000 })), "{grace_ms} {known} {now_s} s: {renew:?}");
            let q = r.call(B, &Request::Query { lease: a.lease });
            assert!(matches!(&q, Ok(Response::Query(i)) if i.state == LeaseState::Active), "{now_s} s: {q:?}");
        }
        assert_eq!(r.svc.lease(a.lease.slot).and_then(|l| l.session), Some(B.session), "B holds it");
    }
}

#[test]
fn resume_takes_over_held_orphaned_and_adopted_leases_of_the_old_session() {
    let mut r = Rig::new(cfg());
    const NEW: Who<'static> = Who { session: 7, tenant: "alpha", admin: false };
    let held = r.active();
    // Held by the open session 1: taken over at once.
    assert_eq!(r.svc.resume(TENANT.session, NEW.session, "alpha"), 1);
    assert_eq!(r.svc.lease(held.slot).and_then(|l| l.session), Some(NEW.session));
    assert_eq!(r.svc.counters.reconnects, 1);
    // Lost session 7's lease waits orphaned; session 8 resumes it.
    r.svc.session_lost(NEW.session, r.now_us);
    assert_eq!(r.svc.resume(NEW.session, 8, "alpha"), 1);
    assert_eq!(r.svc.lease(held.slot).map(|l| (l.session, l.orphaned_at)), Some((Some(8), None)));
    // Another tenant's RESUME of the same session id takes nothing.
    assert_eq!(r.svc.resume(8, 9, "beta"), 0);
    assert_eq!(r.svc.counters.reconnects, 3);
}

#[test]
fn notices_nobody_takes_are_bounded_and_counted() {
    let mut r = Rig::new(Config { slots: 1, ..cfg() });
    let bound = NOTICES_PER_SLOT + 64;
    for _ in 0..bound + 10 {
        assert!(r.call(ADMIN, &Request::Drain { tenant: "alpha".to_string(), notice_ms: 60_000 }).is_ok());
    }
    assert_eq!(r.svc.counters.notices_dropped, 10);
    assert_eq!(r.notices().len(), bound);
}

/// With no `tenant_mib=` and three tenants configured, each is guaranteed a third of the pool (rounded down to
/// extents); a tenant borrows what no guarantee covers, never another tenant's unused share; `tenant_mib=`
/// replaces the rule.
#[test]
fn tenants_get_fair_shares_of_the_pool_by_default() {
    let alloc = |r: &mut Rig, tenant: &'static str| {
        r.call(Who { session: 9, tenant, admin: false }, &Request::Alloc(alloc_req()))
    };
    // 64 MiB, 3 tenants: shares of 20 MiB (five 4 MiB leases), 4 MiB that no share covers.
    let mut r = Rig::new(Config { tenants: 3, ..cfg() });
    for i in 0..6 {
        assert!(matches!(alloc(&mut r, "alpha"), Ok(Response::Alloc(_))), "alpha's lease {i}");
    }
    let e = alloc(&mut r, "alpha").unwrap_err();
    assert_eq!(e.code, ErrorCode::Limit, "{e:?}");
    assert!(e.message.contains("fair share of 20971520"), "{}", e.message);
    for t in ["beta", "gamma"] {
        for i in 0..5 {
            assert!(matches!(alloc(&mut r, t), Ok(Response::Alloc(_))), "{t}'s lease {i}: its share is whole");
        }
    }
    // An explicit tenant_mib= is the policy instead.
    let mut r = Rig::new(Config { tenants: 3, tenant_bytes: 64 << 20, ..cfg() });
    for i in 0..16 {
        assert!(matches!(alloc(&mut r, "alpha"), Ok(Response::Alloc(_))), "alpha's lease {i} under tenant_mib");
    }
}

mod limits;

// ---- a memory node's scale ----

/// What a lease slot costs the heap before any lease (docs/operations.md, "Scale"): its entry in the slot table
/// and in the free set. The figure the documentation states, [`crate::setup::SLOT_HEAP_BYTES`], bounds it.
#[test]
fn a_slot_costs_at_most_the_stated_heap() {
    let entry = core::mem::size_of::<Slot<u64>>();
    // A BTreeSet<u32> holds up to 11 keys per node of about 100 bytes: about 10 bytes a key, 48 at worst.
    let free_set = 48;
    std::println!("heap per lease slot: {entry} bytes in the table + at most {free_set} in the free set");
    assert!(entry + free_set <= crate::setup::SLOT_HEAP_BYTES, "{entry} + {free_set} bytes");
}

// ---- The UMR path: a warm pool, grants and revokes by work request, the fallbacks. ----

fn umr_cfg(warm: u32) -> Config {
    Config { grace_ms: 50, warm, ..Config::default() }
}

/// A rig with `warm` entries ready (built by the timer scan), the fill's commands cleared.
fn warm_rig(warm: u32) -> Rig {
    let mut r = Rig::with_umr(umr_cfg(warm));
    r.fill_ok = true;
    r.advance(20 * SCAN_INTERVAL_US);
    assert_eq!(r.svc.paths().warm, warm as usize);
    r.issued.clear();
    r
}

fn alloc_ok(r: &mut Rig, req: AllocReq) -> leasebox_proto::AllocResp {
    match r.call(TENANT, &Request::Alloc(req)) {
        Ok(Response::Alloc(a)) => a,
        other => panic!("ALLOC: {other:?}"),
    }
}

#[test]
fn the_warm_pool_fills_lazily_off_the_request_path_two_entries_at_a_time() {
    let mut r = Rig::with_umr(umr_cfg(5));
    assert_eq!(r.svc.paths().warm, 0, "nothing made at start: boot does not grow with the pool");
    assert!(r.issued.is_empty());
    // The first scan starts two entries (four commands each, one at a time per entry).
    r.svc.tick(r.now_us, &mut r.host);
    let mut first = Vec::new();
    while let Some((_, c)) = r.svc.next_command() {
        first.push(c.opcode());
    }
    assert_eq!(first, [ALLOC_PD, ALLOC_PD], "two entries at once, each starting with its PD");
    let mut r = Rig::with_umr(umr_cfg(5));
    r.advance(20 * SCAN_INTERVAL_US);
    assert_eq!(r.svc.paths().warm, 5);
    let per_entry = [ALLOC_PD, CREATE_MKEY, CREATE_QP, RST2INIT];
    assert_eq!(r.filled.len(), 5 * per_entry.len());
    assert!(r.issued.is_empty());
    for op in per_entry {
        assert_eq!(r.filled.iter().filter(|&&o| o == op).count(), 5, "{op:#x}");
    }
    // The warm key is created free and UMR-enabled in the quarantine PD (`create_mkey_umr_free`).
    let mk = &r.inputs[&CREATE_MKEY];
    let pd = u32::from_be_bytes([mk[0x1c], mk[0x1d], mk[0x1e], mk[0x1f]]) & 0xff_ffff;
    assert_eq!(pd, 0x77, "the quarantine PD (mkc.pd)");
    assert_eq!(r.svc.counters.warm_built, 5);
    r.advance(20 * SCAN_INTERVAL_US);
    assert_eq!(r.filled.len(), 20, "full: nothing more");
    assert_eq!(r.svc.paths().to_string(), "grant=umr revoke=umr warm=5");
    assert_eq!(r.svc.paths().brief(), "umr grant+revoke warm 5", "HEALTH's short form");
}

#[test]
fn a_warm_alloc_is_one_grant_and_two_commands_and_a_revoke_is_one_work_request() {
    let mut r = warm_rig(2);
    let a = alloc_ok(&mut r, alloc_req());
    assert_eq!(r.issued, [UMR_GRANT, INIT2RTR, RTR2RTS], "2 commands per ALLOC");
    assert_eq!(r.svc.counters.umr_grants, 1);
    let ready = r.call(TENANT, &Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn });
    assert!(matches!(ready, Ok(Response::Ready { .. })), "{ready:?}");
    r.issued.clear();
    assert_eq!(r.revoke(a.lease, false), Outcome::TornDown);
    assert_eq!(r.issued, [UMR_REVOKE], "0 commands in the immediate phase");
    r.issued.clear();
    let live = r.host.live.len();
    r.sweep();
    // The entry goes back to the pool: the QP to INIT, nothing destroyed, its memory kept; the pool refills the
    // entry the ALLOC took.
    assert_eq!(&r.issued[..3], [QP_2ERR, QP_2RST, RST2INIT]);
    assert!(!r.issued.contains(&DESTROY_QP) && !r.issued.contains(&DESTROY_MKEY));
    assert_eq!(r.svc.counters.warm_recycled, 1);
    assert!(r.host.live.len() >= live, "the recycled QP's buffers stay allocated");
    assert_eq!(r.revoke(a.lease, false), Outcome::NotFound, "swept");
}

#[test]
fn a_regrant_never_gives_a_key_the_variant_a_revoked_client_holds() {
    let mut r = warm_rig(1);
    Config::default();
    let mut r1 = Vec::new();
    for _ in 0..40 {
        let a = alloc_ok(&mut r, alloc_req());
        assert_eq!(r.revoke(a.lease, false), Outcome::TornDown);
        r.sweep();
        r1.push(a.rkey);
    }
    // The one warm key (and the entries refilled behind it) are re-granted over and over: consecutive
    // grants of one index never share a variant.
    for w in r1.windows(2) {
        if w[0] >> 8 == w[1] >> 8 {
            assert_ne!(w[0] & 0xff, w[1] & 0xff, "index {:#x} re-granted with its previous variant", w[0] >> 8);
        }
    }
    let variants: std::collections::BTreeSet<u32> = r1.iter().map(|k| k & 0xff).collect();
    assert!(variants.len() > 20, "variants are drawn, not counted: {variants:?}");
}

#[test]
fn leases_the_warm_path_cannot_carry_take_the_six_commands() {
    // Larger than one inline grant's entries.
    let mut r = warm_rig(2);
    r.svc.hca.umr.max_entries = 1;
    alloc_ok(&mut r, alloc_req());
    assert_eq!(r.issued, BUILD, "4 MiB = 2 extents > 1");
    // Atomics the HCA will not set by UMR.
    let mut r = warm_rig(2);
    r.svc.hca.umr.atomic = false;
    alloc_ok(&mut r, AllocReq { access: access::REMOTE_ATOMIC, ..alloc_req() });
    assert_eq!(r.issued, BUILD);
    // No warm entry ready (the pool is empty): today's path.
    let mut r = warm_rig(1);
    alloc_ok(&mut r, alloc_req());
    r.issued.clear();
    let a = r.svc.request(TENANT, &Request::Alloc(alloc_req()), 99, r.now_us, &mut r.host);
    assert!(a.is_none());
    let mut ops = Vec::new();
    while let Some((_, c)) = r.svc.next_command() {
        ops.push(c.opcode());
    }
    assert_eq!(ops, [ALLOC_PD], "the second ALLOC builds by commands");
    // Caps that refuse grants: commands for everything, and the paths say so.
    let mut r = Rig::with_umr(umr_cfg(4));
    r.svc.hca.umr.grant = false;
    r.advance(10 * SCAN_INTERVAL_US);
    assert!(r.filled.is_empty(), "no warm pool without UMR grants");
    let l = r.active();
    assert_eq!(r.revoke(l, false), Outcome::TornDown);
    assert_eq!(r.issued, [DESTROY_MKEY]);
    assert_eq!(r.svc.paths().to_string(), "grant=commands revoke=commands warm=0");
    assert_eq!(r.svc.paths().brief(), "umr off", "HEALTH's short form");
    // And `warm` 0 switches the UMR path off.
    assert_eq!(Rig::with_umr(umr_cfg(0)).svc.paths().to_string(), "grant=commands revoke=commands warm=0");
}

#[test]
fn a_failed_or_timed_out_grant_answers_the_alloc_and_unwinds_the_entry() {
    for (hang, what) in [(false, "error completion"), (true, "no completion: the engine's timeout")] {
        let mut r = warm_rig(1);
        r.script(UMR_GRANT, &[if hang { Answer::Hang } else { Answer::Fail }]);
        let t = r.send(TENANT, &Request::Alloc(alloc_req()));
        if hang {
            assert!(r.take(t).is_none(), "{what}: waits for the engine");
            r.advance(leasebox_mlx5::engine::UMR_TIMEOUT_MS * 1000);
            // The engine answers a missing completion as failed (`UMR_TIMEOUT_MS`).
            r.late(Answer::Fail);
        }
        let reply = r.take(t).unwrap_or_else(|| panic!("{what}: answered"));
        assert!(matches!(&reply, Err(e) if e.code == ErrorCode::HcaError), "{what}: {reply:?}");
        assert_eq!(r.issued, [UMR_GRANT, QP_2RST, DESTROY_QP, DESTROY_MKEY, DEALLOC_PD], "{what}: unwound");
        assert_eq!(r.svc.fenced_count(), 0, "{what}");
        assert_eq!(r.svc.free_slots(), r.svc.config().slots as usize, "{what}: slot free again");
    }
}

#[test]
fn a_failed_umr_revoke_falls_back_to_destroy_mkey() {
    let mut r = warm_rig(1);
    let l = r.active();
    r.script(UMR_REVOKE, &[Answer::Fail]);
    assert_eq!(r.revoke(l, false), Outcome::TornDown, "the key is cut all the same");
    assert_eq!(r.issued, [UMR_REVOKE, DESTROY_MKEY]);
    assert_eq!(r.svc.counters.umr_revoke_failures, 1);
    r.issued.clear();
    r.sweep();
    // The key is gone: the entry cannot be recycled, the rest is destroyed.
    assert_eq!(&r.issued[..4], [QP_2ERR, QP_2RST, DESTROY_QP, DEALLOC_PD]);
    assert_eq!(r.svc.counters.warm_recycled, 0);
    assert_eq!(r.svc.fenced_count(), 0);
}

#[test]
fn a_failed_umr_revoke_and_a_failed_destroy_mkey_fence_the_slot() {
    let mut r = warm_rig(1);
    let l = r.active();
    r.script(UMR_REVOKE, &[Answer::Fail]);
    r.script(DESTROY_MKEY, &[Answer::Fail]);
    assert_eq!(r.revoke(l, false), Outcome::Fenced);
    assert_eq!(r.issued, [UMR_REVOKE, DESTROY_MKEY, QP_2ERR], "the fallback fence: the QP to ERR");
    assert_eq!(r.fenced(l), Some((step_bit::DESTROY_MKEY, origin::REVOKE)));
}

#[test]
fn a_umr_revoke_the_engine_times_out_falls_back_and_a_silent_hca_fences_at_the_deadline() {
    // The engine's timeout answers the work request as failed: DESTROY_MKEY, TornDown, well within 1 s.
    let mut r = warm_rig(1);
    let l = r.active();
    r.script(UMR_REVOKE, &[Answer::Hang]);
    let t = r.send(ADMIN, &Request::Revoke { lease: l, qp_first: false });
    assert!(r.take(t).is_none());
    r.advance(leasebox_mlx5::engine::UMR_TIMEOUT_MS * 1000);
    r.late(Answer::Fail);
    assert!(matches!(r.take(t), Some(Ok(Response::Revoke { outcome: Outcome::TornDown, .. }))));
    assert_eq!(r.issued, [UMR_REVOKE, DESTROY_MKEY]);
    // Nothing answers at all: Fenced at the revoke deadline, as on the command path.
    let mut r = warm_rig(1);
    let l = r.active();
    r.script(UMR_REVOKE, &[Answer::Hang]);
    let t = r.send(ADMIN, &Request::Revoke { lease: l, qp_first: false });
    r.advance(r.svc.config().revoke_deadline_ms * 1000 + SCAN_INTERVAL_US);
    assert!(matches!(r.take(t), Some(Ok(Response::Revoke { outcome: Outcome::Fenced, .. }))));
    assert_eq!(r.fenced(l), Some((step_bit::DEADLINE, origin::REVOKE)));
}

#[test]
fn qp_first_on_the_umr_path_cuts_the_qp_then_revokes_by_umr() {
    let mut r = warm_rig(1);
    let l = r.active();
    assert_eq!(r.revoke(l, true), Outcome::TornDown);
    assert_eq!(r.issued, [QP_2ERR, UMR_REVOKE]);
    r.issued.clear();
    r.sweep();
    assert_eq!(&r.issued[..2], [QP_2RST, RST2INIT], "already in ERR: reset and back to INIT");
}

#[test]
fn each_recycling_sweep_step_failing_fences_with_its_bit() {
    for (op, bit) in [(QP_2ERR, step_bit::QP_2ERR), (QP_2RST, step_bit::QP_2RST), (RST2INIT, step_bit::RECYCLE)] {
        let mut r = warm_rig(1);
        let l = r.active();
        assert_eq!(r.revoke(l, false), Outcome::TornDown);
        r.script(op, &[Answer::Fail]);
        r.sweep();
        assert_eq!(r.fenced(l), Some((bit, origin::SWEEP)), "{op:#x}: {:x?}", r.issued);
        assert_eq!(r.svc.counters.warm_recycled, 0, "{op:#x}");
    }
}

#[test]
fn a_warm_entry_whose_build_fails_is_undone_and_the_pool_stops_after_repeated_failures() {
    let mut r = Rig::with_umr(umr_cfg(1));
    r.script(CREATE_QP, &[Answer::Fail]);
    r.advance(5 * SCAN_INTERVAL_US);
    // PD and key made, the QP refused: key and PD destroyed in reverse; then a second entry is built.
    assert_eq!(&r.filled[..5], [ALLOC_PD, CREATE_MKEY, CREATE_QP, DESTROY_MKEY, DEALLOC_PD]);
    assert_eq!(r.svc.counters.warm_failed, 1);
    assert_eq!(r.svc.paths().warm, 1, "the next try made it");
    let mut r = Rig::with_umr(umr_cfg(1));
    r.script(ALLOC_PD, &[Answer::Fail; 20]);
    r.advance(50 * SCAN_INTERVAL_US);
    assert_eq!(r.svc.counters.warm_failed, u64::from(warm::FILL_FAILURES_MAX), "stops trying");
    assert_eq!(r.svc.paths().warm, 0);
    // ALLOCs still work, by commands (the scripted failures are used up first).
    r.script.clear();
    alloc_ok(&mut r, alloc_req());
}

#[path = "tests_transitions.rs"]
mod transitions;
