//! The polling engines (docs/architecture.md "Cores and roles"): the [`CommandEngine`] owns the command queue and
//! the pages given to the firmware; the [`EventEngine`] owns the EQ, the watched CQs and the health monitor.
//! Everyone else holds a [`Client`] and talks to them through fixed-capacity SPSC rings. With three or more
//! CPUs each engine runs alone on its core; with one CPU the same `poll` methods run round-robin on core 0.
//! Nothing here waits: each `poll` does what is ready and returns whether it did anything. A host whose engine
//! thread sleeps when idle (the hosted rigs) gives the clients a [`Waker`] for it ([`Client::set_waker`]): each
//! queued command wakes it. The image's engine cores poll without pause and set none.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use core::task::Waker;

use crate::cmdq::{CmdQueue, Completion, SlotClass};
use crate::command::{Command, ErrorKind};
use crate::cq::CqRing;
use crate::driver::PortState;
use crate::eq::EventRing;
use crate::handles::Cqn;
use crate::health::{Fatal, Health};
use crate::ifc;
use crate::ifc::cq::Cqe;
use crate::ifc::eq::Eqe;
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};
use crate::ring::{Consumer, Producer, ring};
use crate::umr::{PostError, UmrQp};

/// Ring capacities.
pub const REQUEST_RING: usize = 64;
pub const COMPLETION_RING: usize = 64;
pub const EVENT_RING: usize = 256;
pub const PAGE_RING: usize = 16;
// The rings' counters wrap at 2^64, which only a power-of-two capacity divides (`ring::Inner`).
const _: () = assert!(
    REQUEST_RING.is_power_of_two()
        && COMPLETION_RING.is_power_of_two()
        && EVENT_RING.is_power_of_two()
        && PAGE_RING.is_power_of_two()
);

/// Tags with this bit are the command engine's own (page commands); clients' tags never have it.
const INTERNAL_TAG: u64 = 1 << 63;
/// Tags with this bit (and not [`INTERNAL_TAG`]) came from the [`SideClient`]: the engine sets it on the way in
/// and clears it on the way back, so each side sees its own tags; the main client's tags never have it.
const SIDE_TAG: u64 = 1 << 62;
/// The bits a client's own tag may use (the engine owns the rest for its marks). This is the one statement of
/// the layout: a client that packs fields into its tags derives their widths from it, and
/// [`Client::submit_as`] refuses a tag outside it rather than masking it (a masked tag would come back as
/// another tag, and its result would be lost).
pub const CLIENT_TAG_BITS: u64 = SIDE_TAG - 1;
const _: () = assert!(CLIENT_TAG_BITS & (INTERNAL_TAG | SIDE_TAG) == 0 && CLIENT_TAG_BITS.count_ones() == 62);

/// Why [`Client::submit_as`] (or [`SideClient::submit_as`]) did not queue a command.
#[derive(Debug)]
pub enum Refused {
    /// The request ring is full: the command comes back, to be queued after the next poll.
    Full(Command),
    /// The tag uses a bit outside [`CLIENT_TAG_BITS`]: nothing was queued, in release builds as in debug ones.
    /// This is the caller's bug; the error (kind [`ErrorKind::ReservedTag`]) is what its completion would
    /// have been, so the caller can fail the step it belongs to.
    ReservedTag(crate::command::CmdError),
}

/// Checks a caller's tag against [`CLIENT_TAG_BITS`].
fn client_tag(tag: u64, cmd: Command) -> Result<Request, Refused> {
    if tag & !CLIENT_TAG_BITS != 0 {
        return Err(Refused::ReservedTag(cmd.error(ErrorKind::ReservedTag { tag })));
    }
    Ok(Request { tag, work: Work::Cmd(cmd) })
}
/// Ring capacities of the side client (a port's maintenance keeps a few commands in flight at most).
pub const SIDE_REQUEST_RING: usize = 8;
pub const SIDE_COMPLETION_RING: usize = 8;
/// EQEs handled per event-engine pass (Linux handles at most 128 per pass).
const EQ_BUDGET: usize = 64;
const CQ_BUDGET: usize = 64;

/// Work for the command engine, under the caller's tag.
pub struct Request {
    pub tag: u64,
    pub work: Work,
}

/// What a request asks: a firmware command, or a UMR work request on the engine's UMR QP.
pub enum Work {
    Cmd(Command),
    Umr(UmrWork),
}

impl Work {
    /// The command of work that was pushed as one (a ring gives back what was pushed).
    fn into_cmd(self) -> Command {
        match self {
            Work::Cmd(c) => c,
            // Only `submit`/`submit_as` call this, on work they made as `Cmd`.
            Work::Umr(w) => Command::new(UMR_PSEUDO_OPCODE, 0, 16, 16).with(
                "mkey",
                u64::from(match w {
                    UmrWork::Grant { mkey, .. } | UmrWork::Revoke { mkey } => mkey.0,
                }),
            ),
        }
    }
}

/// A UMR work request the engine posts on its UMR QP (docs/reference/umr.md §4). Its completion comes back on
/// the completion ring under the request's tag, as a command's does: `Ok` (an empty output) when the CQE
/// reports success, else an error from [`umr_error`]'s pseudo-command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UmrWork {
    /// Re-point a free UMR-enabled key (from [`crate::ifc::mkey::create_mkey_umr_free`]) at `pages`, give it
    /// `pd`, `access`, `start`, `len` and the variant `new_variant`; the translation travels inline.
    Grant {
        mkey: crate::handles::Mkey,
        new_variant: u8,
        pd: crate::handles::Pdn,
        start: u64,
        len: u64,
        access: crate::ifc::mkey::MkeyAccess,
        log_page_size: u8,
        /// The entries the key was created for.
        capacity: usize,
        pages: Vec<u64>,
    },
    /// Set the key free under the UMR QP's quarantine PD: once this completes the HCA no longer reaches the
    /// memory through it.
    Revoke { mkey: crate::handles::Mkey },
}

/// The opcode of the pseudo-command a UMR result's error names (`MLX5_OPCODE_UMR`, a WQE opcode: no firmware
/// command has an opcode below 0x100, so a report can never mistake it for one). `op_mod` is
/// [`UMR_OP_GRANT`] or [`UMR_OP_REVOKE`].
pub const UMR_PSEUDO_OPCODE: u16 = crate::ifc::umr::MLX5_OPCODE_UMR as u16;
pub const UMR_OP_GRANT: u16 = 0;
pub const UMR_OP_REVOKE: u16 = 1;

/// How long the engine waits for a UMR completion before it gives up on everything in flight
/// ([`UmrQp::fail_all`]): far above a UMR's microseconds, far below the revoke deadline (1 s), so a revoke
/// whose UMR was lost still has time for its DESTROY_MKEY fallback.
pub const UMR_TIMEOUT_MS: u64 = 100;

/// The error a UMR result carries: `kind` as for a command ([`ErrorKind::Status`] with the CQE's syndrome and
/// vendor syndrome for an error CQE, [`ErrorKind::Timeout`] for a missing one, [`ErrorKind::Busy`] when the
/// QP is full, in error or being recovered, [`ErrorKind::Delivery`] when the caps refuse the WQE or the
/// engine has no UMR QP).
pub fn umr_error(work: &UmrWork, kind: ErrorKind) -> crate::command::CmdError {
    let (op, key) = match work {
        UmrWork::Grant { mkey, .. } => (UMR_OP_GRANT, mkey),
        UmrWork::Revoke { mkey } => (UMR_OP_REVOKE, mkey),
    };
    Command::new(UMR_PSEUDO_OPCODE, op, 16, 16).with("mkey", u64::from(key.0)).error(kind)
}

/// A firmware page request (EQE type 0xB, `pages_req_event`): `num_pages` > 0 gives, < 0 takes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub function_id: u16,
    pub num_pages: i32,
}

/// What the event engine reports to the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The HCA is dead; every command fails from now on.
    Fatal(Fatal),
    /// An EQE other than a page request: type, sub-type, data.
    Async(Eqe),
    /// A CQE from a watched CQ.
    Completion { cqn: Cqn, cqe: Cqe },
}

/// State both engines and the client see.
#[derive(Default)]
pub struct Shared {
    /// 0 while healthy; `0x100 | syndrome` once fatal.
    fatal: AtomicU32,
    pub pages_given: AtomicU64,
    pub page_requests: AtomicU64,
    pub eqes: AtomicU64,
    /// The newest PORT_CHANGE event of ports 1 and 2: 0 none yet, 1 down, 2 active.
    port_events: [AtomicU8; 2],
    /// PORT_CHANGE events seen.
    pub port_changes: AtomicU64,
    /// Health syndromes reported, not fatal (`crate::health::Class::Reported`), as the health monitor counts them.
    pub health_reports: AtomicU64,
    /// Commands the firmware did not complete within their timeout (the health monitor's escalation:
    /// `Health::command_timed_out`).
    pub cmd_timeouts: AtomicU64,
}

impl Shared {
    /// What the newest PORT_CHANGE event said of `port` (1 or 2), if one came: the event engine records them
    /// here for whoever drives that port, on any core (they also go to the client as [`Event::Async`]).
    pub fn port_event(&self, port: u8) -> Option<PortState> {
        let slot = self.port_events.get(usize::from(port).checked_sub(1)?)?;
        match slot.load(Ordering::Acquire) {
            1 => Some(PortState::Down),
            2 => Some(PortState::Active),
            _ => None,
        }
    }

    fn record_port_event(&self, e: &Eqe) {
        for port in 1..=2u8 {
            if let Some(s) = PortState::from_event(e, port) {
                log::info!("mlx5: port {port} link {s} (PORT_CHANGE)");
                let v = if s == PortState::Active { 2 } else { 1 };
                self.port_events[usize::from(port) - 1].store(v, Ordering::Release);
                self.port_changes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn fatal(&self) -> Option<u8> {
        let v = self.fatal.load(Ordering::Acquire);
        (v != 0).then_some(v as u8)
    }

    fn set_fatal(&self, synd: u8) {
        self.fatal.store(0x100 | u32::from(synd), Ordering::Release);
    }
}

/// Pages the firmware holds, and page work waiting for the page slot.
#[derive(Default)]
pub struct PageSupply {
    /// Pages the firmware holds, by device address (MANAGE_PAGES gives addresses back).
    given: BTreeMap<u64, DmaBuf>,
    queue: VecDeque<PageRequest>,
    in_flight: Option<(u64, Vec<DmaBuf>, bool)>,
    pub failures: u64,
}

/// MANAGE_PAGES carries at most this many addresses per command (what the slot's own chain holds).
pub const PAGES_PER_COMMAND: usize = (crate::cmdq::SLOT_MSG - 16) / 8;

impl PageSupply {
    pub fn given(&self) -> usize {
        self.given.len()
    }

    pub fn push(&mut self, r: PageRequest) {
        self.queue.push_back(r);
    }

    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight.is_none()
    }

    /// Builds the next page command, allocating pages for a give; a give the platform cannot back is
    /// answered with MANAGE_PAGES ALLOCATION_FAIL, as Linux does.
    fn next_command<P: Platform + ?Sized>(&mut self, p: &P) -> Option<(Command, Vec<DmaBuf>, bool)> {
        let r = self.queue.pop_front()?;
        if r.num_pages > 0 {
            let n = (r.num_pages as usize).min(PAGES_PER_COMMAND);
            if (r.num_pages as usize) > n {
                self.queue.push_front(PageRequest { num_pages: r.num_pages - n as i32, ..r });
            }
            let mut pages = Vec::with_capacity(n);
            for _ in 0..n {
                match p.dma_alloc(PAGE_SIZE, PAGE_SIZE) {
                    Some(a) => pages.push(a),
                    None => {
                        for a in pages {
                            p.dma_free(a);
                        }
                        self.failures += 1;
                        return Some((ifc::init::manage_pages_cant_give(r.function_id), Vec::new(), false));
                    }
                }
            }
            let addrs: Vec<u64> = pages.iter().map(|b| b.addr()).collect();
            Some((ifc::init::manage_pages_give(r.function_id, &addrs), pages, true))
        } else if r.num_pages < 0 {
            let n = (r.num_pages.unsigned_abs() as usize).min(PAGES_PER_COMMAND);
            if (r.num_pages.unsigned_abs() as usize) > n {
                self.queue.push_front(PageRequest { num_pages: r.num_pages + n as i32, ..r });
            }
            Some((ifc::init::manage_pages_take(r.function_id, n as u32), Vec::new(), false))
        } else {
            None
        }
    }

    /// Books a finished page command: pages given stay the firmware's; pages taken back are freed. A give
    /// that failed returns its pages to the platform.
    fn complete<P: Platform + ?Sized>(&mut self, p: &P, c: &Completion) -> usize {
        let Some((_, pages, give)) = self.in_flight.take() else { return 0 };
        match (&c.result, give) {
            (Ok(_), true) => {
                let n = pages.len();
                self.given.extend(pages.into_iter().map(|b| (b.addr(), b)));
                n
            }
            (Err(_), true) => {
                self.failures += 1;
                for a in pages {
                    p.dma_free(a);
                }
                0
            }
            (Ok(out), false) => {
                for a in ifc::init::parse_manage_pages_take(out) {
                    if let Some(b) = self.given.remove(&a) {
                        p.dma_free(b);
                    }
                }
                0
            }
            (Err(_), false) => {
                self.failures += 1;
                0
            }
        }
    }

    /// Frees every page the firmware held. Only after the firmware can no longer touch them (reclaimed,
    /// or the function disabled).
    pub fn release_all<P: Platform + ?Sized>(&mut self, p: &P) {
        for b in core::mem::take(&mut self.given).into_values() {
            p.dma_free(b);
        }
    }
}

/// Owns the command queue (core 1).
pub struct CommandEngine<P: Platform> {
    p: Arc<P>,
    pub(crate) q: CmdQueue,
    pub(crate) pages: PageSupply,
    requests: Consumer<Request>,
    completions: Producer<Completion>,
    page_requests: Consumer<PageRequest>,
    shared: Arc<Shared>,
    /// Completions the client's ring had no room for yet (delivered first next time; never dropped).
    undelivered: VecDeque<Completion>,
    /// The second submitting side, once [`CommandEngine::side_client`] handed it out.
    side: Option<SideRings>,
    /// Which side the next pass takes a request from first (they alternate, so neither starves the other).
    side_first: bool,
    done: Vec<Completion>,
    next_internal: u64,
    pub busy_ns: u64,
    /// The UMR QP, once [`CommandEngine::attach_umr`] gave it one; `None`: every UMR request fails at once
    /// (the caller uses commands).
    umr: Option<UmrState>,
}

/// The UMR QP and what the engine keeps about it.
struct UmrState {
    qp: UmrQp,
    /// The work requests in flight: tag, what it was (for its error) and when it was posted.
    posted: VecDeque<(u64, UmrWork, u64)>,
    /// Recovery after an error or a missed deadline: the commands left, and the tag of the one in flight.
    recovery: Option<(VecDeque<Command>, Option<u64>)>,
    /// A recovery command failed: the QP stays out of use until reboot (fail closed: every UMR request then
    /// fails at once and the caller uses commands).
    dead: bool,
    pub counters: UmrCounters,
}

/// What the UMR QP did (for reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UmrCounters {
    pub posted: u64,
    pub ok: u64,
    pub failed: u64,
    pub timeouts: u64,
    pub recoveries: u64,
}

/// Tags of the UMR QP's recovery commands: the engine's own ([`INTERNAL_TAG`]), told apart from page commands.
const UMR_RECOVERY_TAG: u64 = INTERNAL_TAG | (1 << 61);

/// The engine's end of the side client's rings.
struct SideRings {
    requests: Consumer<Request>,
    completions: Producer<Completion>,
    /// Completions the side's ring had no room for yet (delivered first next time; never dropped).
    undelivered: VecDeque<Completion>,
}

/// Owns the EQ, the watched CQs and the health monitor (core 2).
pub struct EventEngine<P: Platform> {
    p: Arc<P>,
    pub(crate) eq: Option<EventRing>,
    cqs: Vec<(Cqn, CqRing)>,
    health: Health,
    page_requests: Producer<PageRequest>,
    events: Producer<Event>,
    shared: Arc<Shared>,
    undelivered: VecDeque<Event>,
    pending_pages: VecDeque<PageRequest>,
    /// `Shared::cmd_timeouts` as last seen.
    timeouts_seen: u64,
}

/// The submitting side (core 0).
pub struct Client {
    /// The submitting side every client has ([`SideClient`]'s whole); `Client` derefs to it.
    side: SideClient,
    events: Consumer<Event>,
}

/// A submitting side of the command engine: a request ring, a completion ring and the tags it hands out.
/// [`Client`] is one with the event ring besides; a second one (docs/mlx5-driver.md "The side client") lets a
/// core other than the main client's (the `net` core, for its Ethernet port) issue commands without going
/// through the main client's owner. A side client's tags are its own: the engine marks them on the way in and
/// routes each completion back to that side, unmarked. It sees no events.
pub struct SideClient {
    requests: Producer<Request>,
    completions: Consumer<Completion>,
    shared: Arc<Shared>,
    /// [`SideClient::submit`]'s next tag: 1..=[`CLIENT_TAG_BITS`], then 1 again (never 0, never a bit the
    /// engine owns); 2^62 - 1 commands apart, so it never meets a tag still outstanding.
    next_tag: u64,
    /// Woken after each command queued (the engine's thread, where it sleeps when idle).
    waker: Option<Waker>,
}

impl SideClient {
    fn new(requests: Producer<Request>, completions: Consumer<Completion>, shared: Arc<Shared>) -> SideClient {
        SideClient { requests, completions, shared, next_tag: 1, waker: None }
    }
}

impl core::ops::Deref for Client {
    type Target = SideClient;
    fn deref(&self) -> &SideClient {
        &self.side
    }
}

impl core::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut SideClient {
        &mut self.side
    }
}

/// Creates the three parts around an already set-up command queue.
pub fn assemble<P: Platform>(p: Arc<P>, q: CmdQueue, health: Health) -> (CommandEngine<P>, EventEngine<P>, Client) {
    let shared = Arc::new(Shared::default());
    let (req_tx, req_rx) = ring(REQUEST_RING);
    let (done_tx, done_rx) = ring(COMPLETION_RING);
    let (page_tx, page_rx) = ring(PAGE_RING);
    let (ev_tx, ev_rx) = ring(EVENT_RING);
    let cmd = CommandEngine {
        p: p.clone(),
        q,
        pages: PageSupply::default(),
        requests: req_rx,
        completions: done_tx,
        page_requests: page_rx,
        shared: shared.clone(),
        undelivered: VecDeque::new(),
        side: None,
        side_first: false,
        done: Vec::new(),
        next_internal: 0,
        busy_ns: 0,
        umr: None,
    };
    let ev = EventEngine {
        p,
        eq: None,
        cqs: Vec::new(),
        health,
        page_requests: page_tx,
        events: ev_tx,
        shared: shared.clone(),
        undelivered: VecDeque::new(),
        pending_pages: VecDeque::new(),
        timeouts_seen: 0,
    };
    let client = Client { side: SideClient::new(req_tx, done_rx, shared), events: ev_rx };
    (cmd, ev, client)
}

impl<P: Platform> CommandEngine<P> {
    pub fn queue(&self) -> &CmdQueue {
        &self.q
    }

    pub fn pages(&self) -> &PageSupply {
        &self.pages
    }

    /// Queues page work directly (bring-up's boot and init pages, teardown's reclaim).
    pub fn request_pages(&mut self, r: PageRequest) {
        self.pages.push(r);
    }

    /// The platform the engine drives (a host that runs the engine on a thread of its own finds its device here).
    pub fn platform(&self) -> &Arc<P> {
        &self.p
    }

    /// The second submitting side, the first time it is asked for (`None` after that: it has one owner). Its
    /// rings exist from then on; the engine serves both sides alternately.
    pub fn side_client(&mut self) -> Option<SideClient> {
        if self.side.is_some() {
            return None;
        }
        let (req_tx, req_rx) = ring(SIDE_REQUEST_RING);
        let (done_tx, done_rx) = ring(SIDE_COMPLETION_RING);
        self.side = Some(SideRings { requests: req_rx, completions: done_tx, undelivered: VecDeque::new() });
        Some(SideClient::new(req_tx, done_rx, self.shared.clone()))
    }

    /// The next request from either side, alternating which side is asked first; a side request's tag gets
    /// [`SIDE_TAG`].
    fn next_request(&mut self) -> Option<Request> {
        self.side_first = !self.side_first;
        let side = |s: &mut Option<SideRings>| {
            s.as_mut().and_then(|s| s.requests.pop()).map(|r| Request { tag: r.tag | SIDE_TAG, work: r.work })
        };
        if self.side_first {
            side(&mut self.side).or_else(|| self.requests.pop())
        } else {
            self.requests.pop().or_else(|| side(&mut self.side))
        }
    }

    /// One pass: abort on fatal health, page work, both sides' requests, completions. Returns true if it did
    /// anything.
    pub fn poll(&mut self) -> bool {
        let t0 = self.p.now_ns();
        let mut did = false;
        if let Some(s) = self.shared.fatal()
            && self.q.fatal().is_none()
        {
            self.q.abort_all(s, t0, &mut self.done);
            did = true;
        }
        while let Some(r) = self.page_requests.pop() {
            self.shared.page_requests.fetch_add(1, Ordering::Relaxed);
            self.pages.push(r);
        }
        if self.pages.in_flight.is_none()
            && self.q.has_free(SlotClass::Pages)
            && let Some((cmd, pages, give)) = self.pages.next_command(self.p.as_ref())
        {
            {
                let tag = INTERNAL_TAG | self.next_internal;
                self.next_internal += 1;
                match self.q.submit(self.p.as_ref(), tag, &cmd) {
                    Ok(_) => self.pages.in_flight = Some((tag, pages, give)),
                    Err(e) => {
                        self.pages.in_flight = Some((tag, pages, give));
                        let c = Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 };
                        self.pages.complete(self.p.as_ref(), &c);
                    }
                }
                did = true;
            }
        }
        did |= self.umr_recovery_step(t0);
        while self.q.has_free(SlotClass::Regular) || self.q.fatal().is_some() {
            let Some(r) = self.next_request() else { break };
            did = true;
            match r.work {
                Work::Cmd(cmd) => {
                    if let Err(e) = self.q.submit(self.p.as_ref(), r.tag, &cmd) {
                        self.done.push(Completion { tag: r.tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
                    }
                }
                Work::Umr(w) => self.umr_post(r.tag, w, t0),
            }
        }
        did |= self.umr_poll(t0);
        self.q.poll(self.p.as_ref(), &mut self.done);
        // A recovery command that completes may answer UMR work in turn: batches until none is left.
        while !self.done.is_empty() {
            let mut batch = core::mem::take(&mut self.done);
            for c in batch.drain(..) {
                did = true;
                if let Err(e) = &c.result
                    && matches!(e.kind, crate::command::ErrorKind::Timeout { .. })
                {
                    self.shared.cmd_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                if c.tag & UMR_RECOVERY_TAG == UMR_RECOVERY_TAG {
                    self.umr_recovery_done(&c);
                } else if c.tag & INTERNAL_TAG != 0 {
                    if self.pages.in_flight.as_ref().is_some_and(|f| f.0 == c.tag) {
                        let n = self.pages.complete(self.p.as_ref(), &c);
                        self.shared.pages_given.fetch_add(n as u64, Ordering::Relaxed);
                        if let Err(e) = &c.result {
                            log::warn!("mlx5: page command failed: {e}");
                        }
                    }
                } else if c.tag & SIDE_TAG != 0
                    && let Some(s) = self.side.as_mut()
                {
                    s.undelivered.push_back(Completion { tag: c.tag & !SIDE_TAG, ..c });
                } else {
                    self.undelivered.push_back(c);
                }
            }
        }
        while let Some(c) = self.undelivered.pop_front() {
            if let Err(c) = self.completions.push(c) {
                self.undelivered.push_front(c);
                break;
            }
        }
        if let Some(s) = self.side.as_mut() {
            while let Some(c) = s.undelivered.pop_front() {
                if let Err(c) = s.completions.push(c) {
                    s.undelivered.push_front(c);
                    break;
                }
            }
        }
        if did {
            self.busy_ns += self.p.now_ns().saturating_sub(t0);
        }
        did
    }

    /// Gives the engine its UMR QP (made on the driver before the engines split: [`UmrQp::create`]); from now
    /// on [`Client::submit_umr`]'s work is posted on it and polled here.
    pub fn attach_umr(&mut self, qp: UmrQp) {
        self.umr = Some(UmrState {
            qp,
            posted: VecDeque::new(),
            recovery: None,
            dead: false,
            counters: UmrCounters::default(),
        });
    }

    /// Takes the UMR QP back (to destroy it at teardown); work still in flight is answered as failed first.
    pub fn detach_umr(&mut self) -> Option<UmrQp> {
        let mut u = self.umr.take()?;
        for (tag, w, _) in u.posted.drain(..) {
            let e = umr_error(&w, ErrorKind::Shutdown);
            self.undelivered.push_back(Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
        }
        Some(u.qp)
    }

    /// The UMR QP's figures, when there is one.
    pub fn umr_counters(&self) -> Option<UmrCounters> {
        self.umr.as_ref().map(|u| u.counters)
    }

    /// Whether UMR work can be posted now (a QP, not in error, not being recovered, not dead).
    pub fn umr_usable(&self) -> bool {
        self.umr.as_ref().is_some_and(|u| !u.dead && u.recovery.is_none() && !u.qp.in_error())
    }

    fn umr_fail(&mut self, tag: u64, w: &UmrWork, kind: ErrorKind) {
        if let Some(u) = self.umr.as_mut() {
            u.counters.failed += 1;
        }
        let e = umr_error(w, kind);
        self.done.push(Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
    }

    /// Posts one UMR work request, or answers it failed at once.
    fn umr_post(&mut self, tag: u64, w: UmrWork, now_ns: u64) {
        let p = self.p.clone();
        let Some(u) = self.umr.as_mut() else {
            return self.umr_fail(tag, &w, ErrorKind::Delivery { status: 0 });
        };
        if u.dead || u.recovery.is_some() {
            return self.umr_fail(tag, &w, ErrorKind::Busy);
        }
        let r = match &w {
            UmrWork::Revoke { mkey } => {
                let r = crate::ifc::umr::Revoke { mkey: *mkey, quarantine_pd: u.qp.quarantine_pd() };
                u.qp.post_revoke(p.as_ref(), &r, tag)
            }
            UmrWork::Grant { mkey, new_variant, pd, start, len, access, log_page_size, capacity, pages } => {
                let g = crate::ifc::umr::Grant {
                    mkey: *mkey,
                    new_variant: *new_variant,
                    pd: *pd,
                    start: *start,
                    len: *len,
                    access: *access,
                    log_page_size: *log_page_size,
                    capacity: *capacity,
                    translation: crate::ifc::umr::Translation::Inline(pages),
                };
                u.qp.post_grant(p.as_ref(), &g, tag)
            }
        };
        match r {
            Ok(()) => {
                u.counters.posted += 1;
                u.posted.push_back((tag, w, now_ns));
            }
            Err(PostError::Refused(_)) => self.umr_fail(tag, &w, ErrorKind::Delivery { status: 0 }),
            Err(PostError::Full | PostError::InError) => self.umr_fail(tag, &w, ErrorKind::Busy),
        }
    }

    /// Collects UMR completions, and gives up on what is in flight when the oldest has waited past
    /// [`UMR_TIMEOUT_MS`]; either failure starts the recovery.
    fn umr_poll(&mut self, now_ns: u64) -> bool {
        let p = self.p.clone();
        let Some(u) = self.umr.as_mut() else { return false };
        let mut did = false;
        while let Some(d) = u.qp.poll(p.as_ref()) {
            did = true;
            let Some(i) = u.posted.iter().position(|x| x.0 == d.tag) else { continue };
            let Some((tag, w, _)) = u.posted.remove(i) else { continue };
            let result = match d.error {
                None => {
                    u.counters.ok += 1;
                    Ok(crate::command::Output::new(Vec::new()))
                }
                Some((syndrome, vendor)) => {
                    u.counters.failed += 1;
                    Err(umr_error(&w, ErrorKind::Status { status: syndrome, syndrome: u32::from(vendor) }))
                }
            };
            self.done.push(Completion { tag, slot: 0xff, result, elapsed_ns: 0, hca_ns: 0 });
        }
        let timed_out = u.posted.front().is_some_and(|x| now_ns.saturating_sub(x.2) >= UMR_TIMEOUT_MS * 1_000_000);
        if timed_out {
            did = true;
            u.counters.timeouts += 1;
            let tags = u.qp.fail_all();
            log::warn!("mlx5: UMR completion missing after {UMR_TIMEOUT_MS} ms: {} work request(s) failed", tags.len());
            for tag in tags {
                let Some(i) = u.posted.iter().position(|x| x.0 == tag) else { continue };
                let Some((tag, w, at)) = u.posted.remove(i) else { continue };
                u.counters.failed += 1;
                let waited_ms = now_ns.saturating_sub(at) / 1_000_000;
                let e = umr_error(&w, ErrorKind::Timeout { slot: 0xff, waited_ms });
                self.done.push(Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
            }
        }
        if u.qp.in_error() && u.recovery.is_none() && !u.dead {
            // 2ERR first: after a missed completion the HCA may not know yet (after an error CQE it does, and
            // ERR → ERR is allowed), then back to RTS.
            let mut cmds: VecDeque<Command> = VecDeque::new();
            cmds.push_back(u.qp.to_error());
            cmds.extend(u.qp.recovery());
            u.recovery = Some((cmds, None));
            u.counters.recoveries += 1;
            did = true;
        }
        did
    }

    /// Posts the UMR QP's next recovery command when none is in flight.
    fn umr_recovery_step(&mut self, _now_ns: u64) -> bool {
        let Some(u) = self.umr.as_mut() else { return false };
        let Some((cmds, in_flight)) = u.recovery.as_mut() else { return false };
        if in_flight.is_some() || !self.q.has_free(SlotClass::Regular) {
            return false;
        }
        let Some(cmd) = cmds.pop_front() else { return false };
        let tag = UMR_RECOVERY_TAG | (self.next_internal & 0xffff_ffff);
        self.next_internal += 1;
        *in_flight = Some(tag);
        if let Err(e) = self.q.submit(self.p.as_ref(), tag, &cmd) {
            self.done.push(Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
        }
        true
    }

    /// A recovery command finished: the next one, or the ring reset once the QP is back in RTS; a failure
    /// leaves the QP out of use for good.
    fn umr_recovery_done(&mut self, c: &Completion) {
        let p = self.p.clone();
        let Some(u) = self.umr.as_mut() else { return };
        let Some((cmds, in_flight)) = u.recovery.as_mut() else { return };
        if *in_flight != Some(c.tag) {
            return;
        }
        *in_flight = None;
        if let Err(e) = &c.result {
            log::error!("mlx5: UMR QP recovery failed: {e}; UMR is off until reboot, leases use commands");
            u.dead = true;
            u.recovery = None;
        } else if cmds.is_empty() {
            u.recovery = None;
            for tag in u.qp.reset_ring(p.as_ref()) {
                if let Some(i) = u.posted.iter().position(|x| x.0 == tag)
                    && let Some((tag, w, _)) = u.posted.remove(i)
                {
                    let e = umr_error(&w, ErrorKind::Busy);
                    self.done.push(Completion { tag, slot: 0xff, result: Err(e), elapsed_ns: 0, hca_ns: 0 });
                }
            }
            log::info!("mlx5: UMR QP back in RTS");
        }
    }

    /// Stops: every command still queued or in flight fails with `Shutdown`; returns the queue and pages.
    pub fn into_parts(mut self) -> (CmdQueue, PageSupply) {
        let shutdown = |r: Request| Completion {
            tag: r.tag,
            slot: 0xff,
            result: Err(match &r.work {
                Work::Cmd(cmd) => cmd.error(ErrorKind::Shutdown),
                Work::Umr(w) => umr_error(w, ErrorKind::Shutdown),
            }),
            elapsed_ns: 0,
            hca_ns: 0,
        };
        while let Some(r) = self.requests.pop() {
            let _ = self.completions.push(shutdown(r));
        }
        if let Some(s) = self.side.as_mut() {
            while let Some(r) = s.requests.pop() {
                let _ = s.completions.push(shutdown(r));
            }
        }
        (self.q, self.pages)
    }
}

impl<P: Platform> EventEngine<P> {
    /// Starts polling `eq` (bound to its EQN and UAR).
    pub fn attach_eq(&mut self, eq: EventRing) {
        self.eq = Some(eq);
    }

    pub fn detach_eq(&mut self) -> Option<EventRing> {
        self.eq.take()
    }

    /// Polls `cq` from now on; its CQEs arrive as [`Event::Completion`].
    pub fn watch_cq(&mut self, cqn: Cqn, cq: CqRing) {
        self.cqs.push((cqn, cq));
    }

    pub fn unwatch_cq(&mut self, cqn: Cqn) -> Option<CqRing> {
        let i = self.cqs.iter().position(|(n, _)| *n == cqn)?;
        Some(self.cqs.swap_remove(i).1)
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    fn emit(&mut self, e: Event) {
        if let Err(e) = self.events.push(e) {
            self.undelivered.push_back(e);
        }
    }

    pub fn poll(&mut self) -> bool {
        let p = self.p.clone();
        let mut did = false;
        while let Some(e) = self.undelivered.pop_front() {
            if let Err(e) = self.events.push(e) {
                self.undelivered.push_front(e);
                break;
            }
            did = true;
        }
        if let Some(f) = self.health.poll(p.as_ref(), p.now_ns()) {
            log::error!("mlx5: {f}; the command interface is no longer trusted");
            self.shared.set_fatal(f.syndrome());
            self.emit(Event::Fatal(f));
            did = true;
        }
        self.shared.health_reports.store(self.health.reports, Ordering::Relaxed);
        // A command timed out while a reported syndrome shows: the firmware stopped working after it asserted.
        let timeouts = self.shared.cmd_timeouts.load(Ordering::Relaxed);
        if timeouts != self.timeouts_seen {
            self.timeouts_seen = timeouts;
            if let Some(f) = self.health.command_timed_out() {
                log::error!("mlx5: {f}, and a command timed out after it; the command interface is no longer trusted");
                self.shared.set_fatal(f.syndrome());
                self.emit(Event::Fatal(f));
                did = true;
            }
        }
        if let Some(mut eq) = self.eq.take() {
            for _ in 0..EQ_BUDGET {
                let Some(e) = eq.next(p.as_ref()) else { break };
                did = true;
                self.shared.eqes.fetch_add(1, Ordering::Relaxed);
                match e.event() {
                    ifc::eq::Event::PageRequest { function_id, num_pages, .. } => {
                        self.pending_pages.push_back(PageRequest { function_id, num_pages })
                    }
                    _ => {
                        self.shared.record_port_event(&e);
                        self.emit(Event::Async(e))
                    }
                }
            }
            eq.update_ci(p.as_ref());
            self.eq = Some(eq);
        }
        while let Some(r) = self.pending_pages.pop_front() {
            if let Err(r) = self.page_requests.push(r) {
                self.pending_pages.push_front(r);
                break;
            }
        }
        for i in 0..self.cqs.len() {
            for _ in 0..CQ_BUDGET {
                let (cqn, cq) = &mut self.cqs[i];
                let cqn = *cqn;
                let Some(cqe) = cq.next(p.as_ref()) else { break };
                did = true;
                self.emit(Event::Completion { cqn, cqe });
            }
        }
        did
    }
}

/// Wakes the engine's thread, if it has one that sleeps.
fn wake(waker: &Option<Waker>) {
    if let Some(w) = waker {
        w.wake_by_ref();
    }
}

impl Client {
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop()
    }

    /// A handle on the shared state for readers elsewhere (health reports).
    pub fn shared_handle(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl SideClient {
    /// From now on every command queued wakes `waker` (the thread that polls the command engine, where it
    /// sleeps when idle), so a command never waits for the end of the engine's idle sleep.
    pub fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
    }

    /// Queues `cmd`; returns its tag, or the command back when the ring is full.
    pub fn submit(&mut self, cmd: Command) -> Result<u64, Command> {
        let tag = self.next_tag;
        match self.requests.push(Request { tag, work: Work::Cmd(cmd) }) {
            Ok(()) => {
                self.next_tag = self.next_tag % CLIENT_TAG_BITS + 1;
                wake(&self.waker);
                Ok(tag)
            }
            Err(r) => Err(r.work.into_cmd()),
        }
    }

    /// Queues `cmd` under the caller's `tag` (its completion carries it back, so the caller needs no map of its
    /// own); gives the command back when the ring is full. The caller keeps its tags unique among those
    /// outstanding, apart from [`SideClient::submit`]'s (which count up from 1), and within [`CLIENT_TAG_BITS`]; a
    /// tag outside them is refused ([`Refused::ReservedTag`]).
    pub fn submit_as(&mut self, tag: u64, cmd: Command) -> Result<(), Refused> {
        let r = client_tag(tag, cmd)?;
        self.requests.push(r).map_err(|r| Refused::Full(r.work.into_cmd()))?;
        wake(&self.waker);
        Ok(())
    }

    /// Queues a UMR work request under the caller's `tag` (the rules of [`SideClient::submit_as`]); its result
    /// comes back through [`SideClient::poll`]. Gives the work back when the ring is full or the tag is refused.
    pub fn submit_umr(&mut self, tag: u64, work: UmrWork) -> Result<(), (UmrWork, Option<crate::command::CmdError>)> {
        if tag & !CLIENT_TAG_BITS != 0 {
            let e = umr_error(&work, ErrorKind::ReservedTag { tag });
            return Err((work, Some(e)));
        }
        // One producer: with a free place the push below cannot fail.
        if self.requests.free() == 0 {
            return Err((work, None));
        }
        let _ = self.requests.push(Request { tag, work: Work::Umr(work) });
        wake(&self.waker);
        Ok(())
    }

    pub fn poll(&mut self) -> Option<Completion> {
        self.completions.pop()
    }

    /// Free places in the request ring.
    pub fn room(&self) -> usize {
        self.requests.free()
    }

    /// The health verdict's syndrome, once the HCA is dead.
    pub fn fatal(&self) -> Option<u8> {
        self.shared.fatal()
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }
}

#[cfg(test)]
mod tag_limits {
    use super::*;

    /// [`Client::submit`]'s tags at their limit: `CLIENT_TAG_BITS - 1`, `CLIENT_TAG_BITS`, then 1 — never 0 and
    /// never a bit the engine keeps for itself (`SIDE_TAG`, `INTERNAL_TAG`), which a plain `+ 1` would reach.
    #[test]
    fn submit_tags_wrap_from_the_last_client_tag_to_1() {
        let (requests, mut engine_side) = ring(REQUEST_RING);
        let (_done_tx, completions) = ring(COMPLETION_RING);
        let (_ev_tx, events) = ring(EVENT_RING);
        let shared = Arc::new(Shared::default());
        let mut c = Client { side: SideClient::new(requests, completions, shared), events };
        c.side.next_tag = CLIENT_TAG_BITS - 1;
        let tags: Vec<u64> = (0..3).map(|_| c.submit(Command::new(0x100, 0, 16, 16)).ok().unwrap()).collect();
        assert_eq!(tags, [CLIENT_TAG_BITS - 1, CLIENT_TAG_BITS, 1]);
        let queued: Vec<u64> = core::iter::from_fn(|| engine_side.pop()).map(|r| r.tag).collect();
        assert_eq!(queued, tags);
        assert!(queued.iter().all(|t| *t & (SIDE_TAG | INTERNAL_TAG) == 0));
    }
}
