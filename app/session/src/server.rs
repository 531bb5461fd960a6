//! The session table and the per-connection protocol machine.

use crate::admission::{Admission, Budget, EVICT_MIN_AGE_MS, MemoryGauge, Refusal, Source};
use crate::backend::{Answer, Appliance, CloseReason, ConnId, Leases, Principal, Ticket};
use crate::keyring::Keyring;
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use leasebox_proto::v2::{Announce, Responder, Transport};
use leasebox_proto::{
    BOOT_ID_LEN, DecodeError, ErrorBody, ErrorCode, FrameBuf, Header, Hello, HelloNoise, HelloReply, Kind, Next,
    Notice, Op, RESUME_TOKEN_LEN, Reply, Request, Response, Role, STATS_WANT_GUARDS, SessionGuards, Stats, v2,
};

/// Protocol versions this server speaks: v2 only (docs/security.md, "Protocol v1").
const VERSION_MIN: u16 = 2;
const VERSION_MAX: u16 = 2;
/// What a v1 HELLO (step 1) is told before the connection closes.
pub const V1_REFUSED: &str = "protocol v1 is not served: use v2 (docs/wire-protocol.md)";
/// Output a client may leave unread before its session is closed (it is not reading its answers).
const MAX_PENDING_OUTPUT: usize = 256 * 1024;
/// Refused connections that still get their BUSY frame; beyond this they are just closed.
const MAX_REFUSED: usize = 4;
/// A connection must finish HELLO within this time of opening, whatever it sends meanwhile: otherwise a
/// client that never authenticates could hold a session place forever.
pub const HELLO_DEADLINE_MS: u64 = 5_000;
/// A record must arrive at no less than this rate once its first byte is in (bytes per second), with
/// [`RECORD_GRACE_MS`] besides: a record of `n` bytes has `RECORD_GRACE_MS + n * 1000 / MIN_RECORD_RATE` ms.
/// A peer that trickles a record in more slowly is closed: a byte every few seconds holds nothing.
pub const MIN_RECORD_RATE: u64 = 4096;
pub const RECORD_GRACE_MS: u64 = 1_000;
/// Records in a row that complete no frame (empty records, or pieces of one frame) a session may send; the
/// next one closes it. Every frame fits in one record, so a client never needs any: this bounds the work
/// records that carry nothing cost (each is an AEAD tag to check) the way credits bound frames.
pub const MAX_RECORDS_WITHOUT_FRAME: u32 = 8;
/// Ended sessions whose resume token is kept for a later RESUME, per principal (its oldest is forgotten first,
/// so no principal can push out another's). Whether their leases still wait is the lease service's business
/// (its session grace period); this only bounds memory: at most this many per configured principal.
pub const MAX_LOST_PER_PRINCIPAL: usize = 8;
/// Messages 1 remembered (by the first half of their ephemeral key) so that a replayed one is refused before
/// the server answers it: answering costs an X25519 key and a DH, reading only a tag. 16 KiB of keys.
pub const MAX_SEEN_HELLOS: usize = 1024;
/// The heap one established, idle session holds at most (its connection state, record layer and buffers, as
/// measured by `tests/scale.rs` with a thousand sessions): what a host budgets per session place when it sizes
/// `sessions=` from its memory (docs/operations.md, "Scale"). A session with requests in flight holds more
/// for a while, bounded by its credits and [`MAX_PENDING_OUTPUT`].
pub const SESSION_HEAP_BYTES: usize = 16 * 1024;
/// The heap an established session holds while idle, at most (measured: under 1 KiB, `tests/session_heap.rs`):
/// the rest of [`SESSION_HEAP_BYTES`] is room for the buffers a session's traffic grows and keeps.
pub const SESSION_IDLE_HEAP_BYTES: usize = 2 * 1024;
/// The one answer to a RESUME that names no session it may take over: an unknown id, a wrong token and another
/// principal's session look the same.
const RESUME_REFUSED: &str = "RESUME: no such session";

/// The random source failed (or does not exist).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntropyError;

/// Where nonces come from: the CPU's RDSEED/RDRAND in the appliance, the OS in hosted mode.
pub trait Entropy {
    /// Fills `buf` with unpredictable bytes, or fails (never a predictable fallback).
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError>;
}

/// Budgets (docs/operations.md: `sessions=`, `credits=`, `heartbeat_ms=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub sessions: usize,
    pub credits: u16,
    pub heartbeat_ms: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { sessions: 16, credits: 8, heartbeat_ms: 10_000 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartError {
    /// No unpredictable source of nonces: the control service must not start.
    NoEntropy,
    /// Nobody could ever authenticate.
    NoPrincipals,
}

impl core::fmt::Display for StartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StartError::NoEntropy => write!(f, "no hardware random source (RDSEED/RDRAND) for session nonces"),
            StartError::NoPrincipals => {
                write!(f, "no tenant or admin key configured (tenant=NAME:HEXKEY, admin=HEXKEY)")
            }
        }
    }
}

enum State {
    AwaitHello,
    /// Noise message 1 verified and message 2 sent, but the client has not yet shown that it holds the session
    /// keys: message 1 alone can be replayed by anyone who once saw it. Until the client's first record opens
    /// this is still an unauthenticated connection (the pre-authentication pool, the HELLO deadline, no session
    /// place); that record confirms it (docs/wire-protocol.md, "Key confirmation").
    Confirming(Pending, Box<Transport>),
    /// After key confirmation: every byte either way goes through the session's record layer.
    Authenticated(Principal, Box<Transport>),
}

/// Who a confirming connection will be, and the key it used.
struct Pending {
    who: Principal,
    key: usize,
}

struct Conn {
    id: ConnId,
    /// Where it comes from (the per-source limits).
    source: Source,
    /// Since when its place in the unauthenticated pool counts as held, for eviction ([`Server::make_room`]).
    standing_ms: u64,
    state: State,
    frames: FrameBuf,
    out: VecDeque<u8>,
    /// Stream offsets (bytes queued so far) at which each answered request's response ends: a request counts
    /// against the credits until the transport has taken its whole answer.
    answer_ends: VecDeque<u64>,
    /// Requests the backend answers later ([`Answer::Later`]): they hold credits until their answer is taken.
    deferred: usize,
    queued: u64,
    taken: u64,
    opened_ms: u64,
    /// When the last complete, authenticated record came (or the connection opened): the silence timer.
    last_rx_ms: u64,
    /// When the first byte of the record now arriving came (none while no record is partly in).
    record_since_ms: Option<u64>,
    /// Records in a row that completed no frame.
    records_without_frame: u32,
    close: bool,
    /// This session's resume token (announced in the handshake; all zero before it).
    token: [u8; RESUME_TOKEN_LEN],
    /// A RESUME elsewhere took this session's leases over: its token is spent and it is not kept in `lost`.
    resumed: bool,
}

/// An ended session a RESUME may still name.
struct Lost {
    who: Principal,
    token: [u8; RESUME_TOKEN_LEN],
}

/// Equal, in time that does not depend on where the inputs differ (a resume token is a secret).
fn ct_eq(a: &[u8; RESUME_TOKEN_LEN], b: &[u8; RESUME_TOKEN_LEN]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]))
}

impl Conn {
    fn outstanding(&self) -> usize {
        self.answer_ends.len() + self.deferred
    }

    /// Whether a deferred answer with this ticket may still be delivered here.
    fn awaits(&self, t: &Ticket) -> bool {
        !self.close
            && self.deferred > 0
            && matches!(&self.state, State::Authenticated(p, _) if p.session_id == t.session_id)
    }
}

/// The control service: every connection's session state and statistics, over the lease service (`L`) and the
/// appliance's facts and entropy (`A`).
pub struct Server<L: Leases, A: Appliance> {
    limits: Limits,
    keys: Keyring,
    backend: L,
    platform: A,
    conns: Vec<Conn>,
    /// Where each connection sits in `conns`: a lookup per call stays O(log n) with a thousand sessions
    /// (docs/operations.md, "Scale").
    index: alloc::collections::BTreeMap<ConnId, usize>,
    refused: Vec<(ConnId, VecDeque<u8>)>,
    /// Connections that got output or were marked to close since the last [`Server::take_touched`], while a
    /// transport asked for them ([`Server::track_touched`]; `None` otherwise).
    touched: Option<Vec<ConnId>>,
    /// The next session id: 1 up, one per HELLO answered (at most `hello_work`'s rate). 64 bits are never used
    /// up (2^64 - 1 HELLOs at a million a second take 584,000 years), so ids are never reused within a boot.
    next_session: u64,
    start_ms: u64,
    stats: Stats,
    errors: [u64; 32],
    /// Deferred answers whose session had ended (or that matched no deferred request).
    answers_dropped: u64,
    /// Scratch for [`Leases::take_answers`], kept to avoid an allocation per call.
    answers: Vec<(Ticket, Reply)>,
    /// A random PSK nobody knows: an unknown name's (or key id's) Noise message 1 is checked against it, so it
    /// costs the same work as a known name with a wrong key and gets the same answer.
    dummy_psk: [u8; 32],
    /// Noise messages 1 checked (one AEAD tag each, known names and unknown alike).
    hello_macs: u64,
    /// Places: the unauthenticated pool, session budgets per principal, the memory budget (`admission`).
    admission: Admission,
    /// Records that failed authentication (each closed its session).
    records_rejected: u64,
    /// Records that opened, and how many of them were empty.
    records_in: u64,
    records_empty: u64,
    /// This boot's random id (announced in every handshake, in STATS and in every lease id).
    boot_id: [u8; BOOT_ID_LEN],
    /// Ended sessions RESUME may name, oldest first.
    lost: VecDeque<Lost>,
    /// Scratch for [`Leases::take_notices`].
    notices: Vec<(String, Notice)>,
    /// Messages 1 that verified recently (their ephemeral keys' first halves), oldest first, and as a set.
    seen_hellos: VecDeque<[u8; 16]>,
    seen_set: alloc::collections::BTreeSet<[u8; 16]>,
    /// Messages 1 refused as replays of one seen.
    hellos_replayed: u64,
    /// This appliance's name (`appliance=`), bound into every handshake's prologue; empty: none.
    appliance: String,
    /// Notice frames queued (one per receiving session).
    notices_sent: u64,
}

fn error_frame(code: ErrorCode, op: u16, request_id: u32, message: &str, detail: [u32; 3]) -> Vec<u8> {
    let mut v = Vec::new();
    ErrorBody::new(code, message).with_detail(detail).encode(op, request_id, &mut v);
    v
}

impl<L: Leases, A: Appliance> Server<L, A> {
    /// Starts the service over the lease service `backend` and the `appliance` (its facts and its entropy);
    /// refuses without a working entropy source or without any principal.
    pub fn new(
        limits: Limits,
        keys: Keyring,
        mut backend: L,
        mut appliance: A,
        now_ms: u64,
    ) -> Result<Self, StartError> {
        let mut dummy_psk = [0u8; 32];
        appliance.fill(&mut dummy_psk).map_err(|_| StartError::NoEntropy)?;
        // The boot id: random, so that lease ids of an earlier boot (whose slots and generations start again
        // the same way) name nothing in this one.
        let mut boot_id = [0u8; BOOT_ID_LEN];
        appliance.fill(&mut boot_id).map_err(|_| StartError::NoEntropy)?;
        if keys.is_empty() {
            return Err(StartError::NoPrincipals);
        }
        backend.boot(boot_id);
        let stats = Stats { session_budget: limits.sessions as u32, ..Stats::default() };
        let mut admission = Admission::new(Budget::for_sessions(limits.sessions));
        admission.set_tenants(keys.tenants());
        Ok(Server {
            limits,
            keys,
            backend,
            platform: appliance,
            conns: Vec::new(),
            index: alloc::collections::BTreeMap::new(),
            refused: Vec::new(),
            touched: None,
            next_session: 1,
            start_ms: now_ms,
            stats,
            errors: [0; 32],
            answers_dropped: 0,
            answers: Vec::new(),
            dummy_psk,
            hello_macs: 0,
            admission,
            records_rejected: 0,
            records_in: 0,
            records_empty: 0,
            boot_id,
            lost: VecDeque::new(),
            notices: Vec::new(),
            notices_sent: 0,
            seen_hellos: VecDeque::new(),
            seen_set: alloc::collections::BTreeSet::new(),
            hellos_replayed: 0,
            appliance: String::new(),
        })
    }

    /// From now on, notes every connection that gets output or is marked to close, whatever caused it (its own
    /// input, another connection's, a timer, an eviction), for [`Server::take_touched`]: a transport that
    /// serves each connection on its own thread wakes exactly those threads instead of polling.
    pub fn track_touched(&mut self) {
        self.touched.get_or_insert_with(Vec::new);
    }

    /// The connections touched since the last call (sorted, each once); empty unless tracked.
    pub fn take_touched(&mut self) -> Vec<ConnId> {
        let Some(t) = &mut self.touched else { return Vec::new() };
        let mut ids = core::mem::take(t);
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    fn touch(&mut self, id: ConnId) {
        if let Some(t) = &mut self.touched {
            t.push(id);
        }
    }

    /// Names this appliance (`appliance=`): from now on a HELLO completes only if its client named the same
    /// appliance ([`v2::prologue_for`]); empty: no name, the prologue of clients that name none.
    pub fn set_appliance_name(&mut self, name: &str) {
        self.appliance = String::from(name);
    }

    /// This boot's id.
    pub fn boot_id(&self) -> [u8; BOOT_ID_LEN] {
        self.boot_id
    }

    /// Notice frames queued so far (one per session that got one).
    pub fn notices_sent(&self) -> u64 {
        self.notices_sent
    }

    /// The lease service.
    pub fn backend(&self) -> &L {
        &self.backend
    }
    pub fn backend_mut(&mut self) -> &mut L {
        &mut self.backend
    }
    /// The appliance's facts.
    pub fn platform(&self) -> &A {
        &self.platform
    }
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The admission budgets (defaults: [`Budget::for_sessions`] of `limits.sessions`).
    pub fn budget(&self) -> Budget {
        self.admission.budget()
    }

    /// Sets the admission budgets (`sessions_per_tenant=`, `admin_sessions=`, `preauth_sessions=`); its
    /// `sessions` is the session budget STATS reports.
    pub fn set_budget(&mut self, budget: Budget) {
        self.stats.session_budget = budget.sessions as u32;
        self.admission.set_budget(budget);
    }

    /// Where heap use is read for the memory budget (none: no memory budget).
    pub fn set_memory_gauge(&mut self, gauge: MemoryGauge) {
        self.admission.set_gauge(gauge);
    }

    /// The admission counts (places held, refusals for memory).
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// STATS as `who` sees it: the admin gets the global figures ([`Server::stats`]); a tenant its own
    /// sessions (current, total, refused, its cap as the budget) and its own leases, and zeros elsewhere.
    pub fn stats_for(&mut self, who: &Principal, now_ms: u64) -> Stats {
        if who.role == leasebox_proto::Role::Admin {
            return self.stats(now_ms);
        }
        let p = self.admission.principal(&who.name);
        Stats {
            uptime_ms: now_ms.saturating_sub(self.start_ms),
            boot_id: self.boot_id,
            sessions_current: p.current as u32,
            session_budget: self.admission.budget().per_tenant as u32,
            sessions_total: p.total,
            sessions_refused: p.refused,
            leases: self.backend.tenant_lease_stats(who),
            ..Stats::default()
        }
    }

    /// A snapshot of the counters (STATS), the lease service's included.
    pub fn stats(&mut self, now_ms: u64) -> Stats {
        let mut s = self.stats.clone();
        s.uptime_ms = now_ms.saturating_sub(self.start_ms);
        s.boot_id = self.boot_id;
        s.sessions_current = self.conns.len() as u32;
        s.errors = (0..self.errors.len()).filter(|c| self.errors[*c] > 0).map(|c| (c as u16, self.errors[c])).collect();
        s.roles = self.platform.role_counts();
        s.leases = self.backend.lease_stats();
        s
    }

    /// The session layer's defences at work since start (STATS' guard block).
    pub fn guards(&self) -> SessionGuards {
        SessionGuards {
            evicted: self.admission.evicted,
            rate_refusals: self.admission.rate_refusals,
            hellos_replayed: self.hellos_replayed,
            records_in: self.records_in,
            records_empty: self.records_empty,
        }
    }

    /// HELLO messages 1 checked so far: every one is checked with the same key derivation and one AEAD tag, for a
    /// name (or key id) no key is configured for too (against a random stand-in PSK), so the answer's timing does
    /// not tell which names exist.
    pub fn hello_macs(&self) -> u64 {
        self.hello_macs
    }

    /// Messages 1 refused because one with the same ephemeral key verified recently (a replay).
    pub fn hellos_replayed(&self) -> u64 {
        self.hellos_replayed
    }

    /// Records that failed authentication (altered, replayed, reordered, truncated, misplaced); each closed its
    /// session.
    pub fn records_rejected(&self) -> u64 {
        self.records_rejected
    }

    /// Records received that opened, and of them the empty ones (each counted against the session's
    /// [`MAX_RECORDS_WITHOUT_FRAME`]).
    pub fn records_in(&self) -> (u64, u64) {
        (self.records_in, self.records_empty)
    }

    /// Deferred answers dropped because their session had ended before they came.
    pub fn answers_dropped(&self) -> u64 {
        self.answers_dropped
    }

    fn idx(&self, id: ConnId) -> Option<usize> {
        self.index.get(&id).copied()
    }

    /// A new connection whose source address the transport does not know: a source of its own (the
    /// per-source limits cannot apply). Transports that know the peer use [`Server::open_from`].
    pub fn open(&mut self, id: ConnId, now_ms: u64) -> bool {
        self.open_from(id, Source::unique(id.0), now_ms)
    }

    /// A new connection from `source`; `false` = refused: it gets a BUSY frame from `output`, then closes.
    /// When the unauthenticated pool (or the source's share of it) is full, the oldest idle unauthenticated
    /// connection is evicted for this one ([`Server::evictable`]); only when none may be evicted, or the source
    /// is over its connection rate or the heap over its budget, is the new one refused.
    pub fn open_from(&mut self, id: ConnId, source: Source, now_ms: u64) -> bool {
        let standing_ms = match self.make_room(source, now_ms) {
            Ok(t) => t,
            Err(r) => {
                self.refuse(id, r);
                return false;
            }
        };
        self.admission.enter();
        self.stats.sessions_total += 1;
        self.index.insert(id, self.conns.len());
        self.conns.push(Conn {
            id,
            source,
            standing_ms,
            state: State::AwaitHello,
            frames: FrameBuf::new(),
            out: VecDeque::new(),
            answer_ends: VecDeque::new(),
            deferred: 0,
            queued: 0,
            taken: 0,
            opened_ms: now_ms,
            last_rx_ms: now_ms,
            record_since_ms: None,
            records_without_frame: 0,
            close: false,
            token: [0; RESUME_TOKEN_LEN],
            resumed: false,
        });
        true
    }

    /// A refused connection gets its BUSY frame (the first [`MAX_REFUSED`] at once; beyond them it is just closed).
    fn refuse(&mut self, id: ConnId, r: Refusal) {
        self.stats.sessions_refused += 1;
        self.count_error(ErrorCode::Busy);
        if self.refused.len() < MAX_REFUSED {
            let msg = alloc::format!("{r}");
            let f = error_frame(ErrorCode::Busy, Op::Hello as u16, 0, &msg, r.detail());
            self.stats.frames_out += 1;
            self.refused.push((id, f.into()));
        }
    }

    /// Whether connection `c` holds a place in the unauthenticated pool.
    fn preauth(c: &Conn) -> bool {
        !c.close && !matches!(c.state, State::Authenticated(..))
    }

    /// Room in the unauthenticated pool for a connection from `source`: within the rates and the memory budget,
    /// and, when the source holds its share or the pool is full, by evicting one connection. Returns the new
    /// connection's standing for later evictions: a source replacing its own connection hands the new one the
    /// old one's (so churning its own places does not make them younger), otherwise `now_ms`.
    fn make_room(&mut self, source: Source, now_ms: u64) -> Result<u64, Refusal> {
        self.admission.connect(source, now_ms)?;
        let b = self.admission.budget();
        let mine = self.held(source);
        // A proven source's share is the whole pool: it competes for places only once the pool is full.
        let victim = if mine >= b.preauth_per_source && !self.admission.proven(source) {
            Some(self.evictable(source, true, 0, now_ms).ok_or(Refusal::SourceShare(b.preauth_per_source))?)
        } else if self.admission.preauth_full() {
            // Another source's place first; a proven source, which has no share, may also replace its own.
            let other = self.evictable(source, false, mine + 1, now_ms);
            let own = || self.admission.proven(source).then(|| self.evictable(source, true, 0, now_ms)).flatten();
            Some(other.or_else(own).ok_or(Refusal::PreauthFull(b.preauth))?)
        } else {
            None
        };
        let Some(v) = victim else { return Ok(now_ms) };
        let standing = if self.conns[v].source == source { self.conns[v].standing_ms } else { now_ms };
        self.admission.evicted += 1;
        let msg = "evicted: a newer connection took this unauthenticated place (finish HELLO sooner)";
        let d = [b.preauth as u32, 1, 0];
        self.send_error(v, ErrorCode::Busy, Op::Hello as u16, 0, msg, d);
        self.close(v, CloseReason::ProtocolError, now_ms);
        Ok(standing)
    }

    /// Places of the unauthenticated pool that connections from `source` hold.
    fn held(&self, source: Source) -> usize {
        self.conns.iter().filter(|c| Self::preauth(c) && c.source == source).count()
    }

    /// The unauthenticated connection to evict for a new one from `newcomer`: of that source only, when
    /// `own`, otherwise of a source holding at least `min_held` places (so no source is pushed below what the
    /// newcomer's would hold). A connection from a proven source (one a session authenticated from,
    /// [`Admission::prove`]) is evicted only for another from a proven source; a newcomer from a proven source
    /// may evict one from an unproven source at any age, everything else only after [`EVICT_MIN_AGE_MS`]. Of
    /// the candidates: unproven before proven, one whose message 1 has not verified before one whose has, then
    /// one from the source holding the most places, then the longest standing.
    fn evictable(&self, newcomer: Source, own: bool, min_held: usize, now_ms: u64) -> Option<usize> {
        let a = &self.admission;
        let vip = a.proven(newcomer);
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| Self::preauth(c) && (!own || c.source == newcomer))
            .map(|(i, c)| (i, c, a.proven(c.source), self.held(c.source)))
            .filter(|(_, c, proven, held)| {
                let aged = now_ms.saturating_sub(c.standing_ms) >= EVICT_MIN_AGE_MS;
                (aged || (vip && !proven)) && (vip || !proven) && (own || (vip && !proven) || *held >= min_held)
            })
            .min_by_key(|(_, c, proven, held)| {
                (*proven, matches!(c.state, State::Confirming(..)), core::cmp::Reverse(*held), c.standing_ms)
            })
            .map(|(i, _, _, _)| i)
    }

    fn count_error(&mut self, code: ErrorCode) {
        if let Some(n) = self.errors.get_mut(code as usize) {
            *n += 1;
        }
    }

    /// Queues frame bytes on connection `i`: sealed into records once the session is established, in clear
    /// before (HELLO and its errors).
    fn queue(&mut self, i: usize, f: Vec<u8>) {
        let c = &mut self.conns[i];
        let wire = match &mut c.state {
            State::Confirming(_, t) | State::Authenticated(_, t) => {
                let mut w = Vec::with_capacity(f.len() + v2::RECORD_HEADER_LEN + v2::TAG_LEN);
                if t.seal(&f, &mut w).is_err() {
                    // 2^64 - 1 records sent: the session cannot go on.
                    let now_ms = c.last_rx_ms;
                    return self.close(i, CloseReason::ProtocolError, now_ms);
                }
                w
            }
            State::AwaitHello => f,
        };
        c.queued += wire.len() as u64;
        c.out.extend(wire);
        let id = c.id;
        self.touch(id);
    }

    /// Queues an error frame on connection `i` (not an answer that holds a credit).
    fn send_error(&mut self, i: usize, code: ErrorCode, op: u16, request_id: u32, message: &str, detail: [u32; 3]) {
        self.count_error(code);
        self.stats.frames_out += 1;
        let f = error_frame(code, op, request_id, message, detail);
        self.queue(i, f);
    }

    /// Queues the answer to an accepted request: it holds a credit until fully taken by the transport.
    fn send_answer(&mut self, i: usize, op: Op, request_id: u32, reply: Result<Response, ErrorBody>) {
        let mut f = Vec::new();
        match reply {
            Ok(r) => r.encode(op, request_id, &mut f),
            Err(e) => {
                self.count_error(e.code);
                e.encode(op as u16, request_id, &mut f);
            }
        }
        self.stats.frames_out += 1;
        self.queue(i, f);
        let c = &mut self.conns[i];
        c.answer_ends.push_back(c.queued);
    }

    /// Bytes received on `id`; then delivers the answers the backend has finished.
    pub fn input(&mut self, id: ConnId, data: &[u8], now_ms: u64) {
        self.receive(id, data, now_ms);
        self.deliver(now_ms);
    }

    fn receive(&mut self, id: ConnId, data: &[u8], now_ms: u64) {
        let Some(i) = self.idx(id) else { return };
        if self.conns[i].close {
            return;
        }
        self.ingest(i, data, now_ms);
        loop {
            if self.conns[i].close {
                break;
            }
            match self.conns[i].frames.next_frame() {
                Next::Pending => break,
                Next::Bad(e) => {
                    self.stats.frames_in += 1;
                    self.send_error(i, e.code, e.op, e.request_id, e.reason, [0; 3]);
                    // Lost framing always closes; a framed bad header (unknown kind, reserved bytes set) only
                    // before authentication, where every malformed frame ends the connection.
                    let authenticated = matches!(self.conns[i].state, State::Authenticated(..));
                    if e.framing_lost || !authenticated {
                        self.close(i, CloseReason::ProtocolError, now_ms);
                    }
                }
                Next::Frame(h, payload) => {
                    self.stats.frames_in += 1;
                    let awaited_hello = matches!(self.conns[i].state, State::AwaitHello);
                    self.frame(i, h, &payload, now_ms);
                    if awaited_hello && !matches!(self.conns[i].state, State::AwaitHello) {
                        // Bytes after HELLO in the same read are records: they go through the record layer.
                        let rest = self.conns[i].frames.take_buffered();
                        self.ingest(i, &rest, now_ms);
                    }
                }
            }
            if self.conns[i].out.len() > MAX_PENDING_OUTPUT {
                // The client sends but does not read: stop serving it rather than buffer without bound.
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
    }

    /// Received bytes into the frame reassembler: as they are before authentication; after it, through the
    /// record layer, where a record that fails authentication (altered, replayed, reordered, cut short, or
    /// from another session) ends the connection.
    fn ingest(&mut self, i: usize, data: &[u8], now_ms: u64) {
        let c = &mut self.conns[i];
        match &mut c.state {
            State::AwaitHello => return c.frames.push(data),
            State::Confirming(_, t) | State::Authenticated(_, t) => t.push(data),
        }
        loop {
            let c = &mut self.conns[i];
            let opened = match &mut c.state {
                State::Confirming(_, t) | State::Authenticated(_, t) => t.open(),
                State::AwaitHello => return,
            };
            match opened {
                None => {
                    // A record partly in starts its clock; none partly in stops it.
                    let c = &mut self.conns[i];
                    let partial = matches!(&c.state, State::Confirming(_, t) | State::Authenticated(_, t)
                        if t.buffered() > 0);
                    c.record_since_ms = if partial { Some(c.record_since_ms.unwrap_or(now_ms)) } else { None };
                    return;
                }
                Some(Ok(plain)) => {
                    if matches!(self.conns[i].state, State::Confirming(..)) && !self.confirm(i, now_ms) {
                        return;
                    }
                    // Only a complete, authenticated record keeps the session alive.
                    let c = &mut self.conns[i];
                    c.last_rx_ms = now_ms;
                    c.record_since_ms = None;
                    self.records_in += 1;
                    if plain.is_empty() {
                        self.records_empty += 1;
                    }
                    c.frames.push(&plain);
                    // A record that is empty, or leaves part of a frame behind, carried no frame.
                    if plain.is_empty() || !c.frames.whole_frames() {
                        c.records_without_frame += 1;
                        if c.records_without_frame > MAX_RECORDS_WITHOUT_FRAME {
                            let msg = alloc::format!(
                                "more than {MAX_RECORDS_WITHOUT_FRAME} records in a row carried no frame: closing the session"
                            );
                            self.send_error(i, ErrorCode::Malformed, 0, 0, &msg, [MAX_RECORDS_WITHOUT_FRAME, 0, 0]);
                            return self.close(i, CloseReason::ProtocolError, now_ms);
                        }
                    } else {
                        c.records_without_frame = 0;
                    }
                }
                Some(Err(e)) => {
                    self.records_rejected += 1;
                    let msg = alloc::format!("{e}: closing the session");
                    self.send_error(i, ErrorCode::Malformed, 0, 0, &msg, [0; 3]);
                    return self.close(i, CloseReason::ProtocolError, now_ms);
                }
            }
        }
    }

    /// The client's first record opened: it holds the session keys, so the handshake was its own (not a
    /// replayed message 1). The session takes its place in the budgets now, or is refused BUSY (request id 0:
    /// news for the session, not an answer to the record's request) and closed.
    fn confirm(&mut self, i: usize, now_ms: u64) -> bool {
        let State::Confirming(p, _) = &self.conns[i].state else { return true };
        if !self.admit(i, 0, p.key, now_ms) {
            return false;
        }
        let State::Confirming(p, t) = core::mem::replace(&mut self.conns[i].state, State::AwaitHello) else {
            unreachable!("checked above")
        };
        self.admission.prove(self.conns[i].source, now_ms);
        self.backend.session_started(&p.who, now_ms);
        self.conns[i].state = State::Authenticated(p.who, t);
        true
    }

    /// Queues the answers the backend has finished ([`Leases::take_answers`]) on their connections. An answer
    /// whose session has ended (closed, or its connection gone) is dropped; the request ids tell the client
    /// which request each answers, whatever the order.
    pub fn deliver(&mut self, now_ms: u64) {
        let mut answers = core::mem::take(&mut self.answers);
        self.backend.take_answers(&mut answers);
        for (t, reply) in answers.drain(..) {
            let Some(i) = self.idx(t.conn).filter(|i| self.conns[*i].awaits(&t)) else {
                self.answers_dropped += 1;
                continue;
            };
            self.conns[i].deferred -= 1;
            self.send_answer(i, t.op, t.request_id, reply);
            if self.conns[i].out.len() > MAX_PENDING_OUTPUT {
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
        self.answers = answers;
        self.deliver_notices(now_ms);
    }

    /// Queues the backend's notices ([`Leases::take_notices`]) on every open session of the tenant each
    /// concerns (every tenant's for the empty name); the admin's sessions and other tenants' get none. A notice
    /// answers no request and holds no credit; like everything after the handshake it travels sealed.
    fn deliver_notices(&mut self, now_ms: u64) {
        let mut notices = core::mem::take(&mut self.notices);
        self.backend.take_notices(&mut notices);
        for (tenant, n) in notices.drain(..) {
            let mut f = Vec::new();
            n.encode(&mut f);
            for i in 0..self.conns.len() {
                let c = &self.conns[i];
                let to = !c.close
                    && matches!(&c.state, State::Authenticated(p, _)
                        if p.role == Role::Tenant && (tenant.is_empty() || p.name == tenant));
                if !to {
                    continue;
                }
                self.stats.frames_out += 1;
                self.notices_sent += 1;
                self.queue(i, f.clone());
                if self.conns[i].out.len() > MAX_PENDING_OUTPUT {
                    self.close(i, CloseReason::ProtocolError, now_ms);
                }
            }
        }
        self.notices = notices;
    }

    /// RESUME from `who`: takes over the leases of session `session_id` if it is one of `who`'s
    /// own (same principal) and `token` is its resume token; an open session is then closed without orphaning
    /// anything, an ended one is forgotten (a token is good for one RESUME). Every refusal is the same NOT_FOUND.
    fn resume(&mut self, who: &Principal, session_id: u64, token: &[u8; RESUME_TOKEN_LEN], now_ms: u64) -> Reply {
        let refused = || Err(ErrorBody::new(ErrorCode::NotFound, RESUME_REFUSED));
        let same = |p: &Principal| p.session_id == session_id && p.name == who.name && p.role == who.role;
        if session_id == who.session_id {
            return refused();
        }
        let open = self.conns.iter().position(|c| {
            !c.close && !c.resumed && matches!(&c.state, State::Authenticated(p, _) if p.session_id == session_id)
        });
        if let Some(j) = open {
            let State::Authenticated(p, _) = &self.conns[j].state else { return refused() };
            // The token is compared whatever the principal, so the time taken does not tell them apart.
            let token_ok = ct_eq(&self.conns[j].token, token);
            if !(token_ok && same(p)) {
                return refused();
            }
            let from = p.clone();
            let n = self.backend.resume(&from, who, now_ms);
            self.conns[j].resumed = true;
            self.close(j, CloseReason::Resumed, now_ms);
            return Ok(Response::Resume { leases: n });
        }
        let Some(k) = self.lost.iter().position(|l| l.who.session_id == session_id) else { return refused() };
        let token_ok = ct_eq(&self.lost[k].token, token);
        if !(token_ok && same(&self.lost[k].who)) {
            return refused();
        }
        let Some(l) = self.lost.remove(k) else { return refused() };
        let n = self.backend.resume(&l.who, who, now_ms);
        Ok(Response::Resume { leases: n })
    }

    fn close(&mut self, i: usize, reason: CloseReason, now_ms: u64) {
        if self.conns[i].close {
            return;
        }
        let id = self.conns[i].id;
        self.touch(id);
        let c = &mut self.conns[i];
        c.close = true;
        // The place is given back now: a closing connection no longer counts against any budget.
        if let State::Authenticated(p, _) = &c.state {
            let p = p.clone();
            if !c.resumed {
                // A later session of the same principal may RESUME it while its leases wait; the principal's
                // oldest is forgotten beyond its bound.
                let mine = self.lost.iter().filter(|l| l.who.name == p.name).count();
                if mine >= MAX_LOST_PER_PRINCIPAL
                    && let Some(k) = self.lost.iter().position(|l| l.who.name == p.name)
                {
                    self.lost.remove(k);
                }
                self.lost.push_back(Lost { who: p.clone(), token: c.token });
            }
            self.admission.disconnect(Some(&p.name));
            self.backend.session_lost(&p, reason, now_ms);
        } else {
            self.admission.disconnect(None);
        }
    }

    /// The handshake under the key of principal `p` is confirmed: it takes a session place (`true`), or, over a
    /// budget, the connection is answered BUSY and closed (`false`).
    fn admit(&mut self, i: usize, request_id: u32, p: usize, now_ms: u64) -> bool {
        let (name, role) = {
            let e = self.keys.get(p);
            (e.name.clone(), e.role)
        };
        let Err(r) = self.admission.authenticate(&name, role) else { return true };
        self.stats.sessions_refused += 1;
        let msg = alloc::format!("{r}");
        self.send_error(i, ErrorCode::Busy, Op::Hello as u16, request_id, &msg, r.detail());
        self.close(i, CloseReason::ProtocolError, now_ms);
        false
    }

    /// A lease operation under the memory budget: an ALLOC above the high-water mark is refused BUSY (the
    /// others free memory or only read, and go on).
    fn admit_op(&mut self, req: &Request) -> Result<(), ErrorBody> {
        if !matches!(req, Request::Alloc(_)) {
            return Ok(());
        }
        self.admission.memory().map_err(|r: Refusal| {
            ErrorBody::new(ErrorCode::Busy, &alloc::format!("ALLOC: {r}")).with_detail(r.detail())
        })
    }

    /// Before authentication every error ends the connection; afterwards the session survives its mistakes.
    fn close_unless(&mut self, authenticated: bool, i: usize, now_ms: u64) {
        if !authenticated {
            self.close(i, CloseReason::ProtocolError, now_ms);
        }
    }

    fn frame(&mut self, i: usize, h: Header, payload: &[u8], now_ms: u64) {
        let authenticated = matches!(self.conns[i].state, State::Authenticated(..));
        if h.kind != Kind::Request {
            self.send_error(i, ErrorCode::Malformed, h.op, h.request_id, "clients send requests only", [0; 3]);
            return self.close_unless(authenticated, i, now_ms);
        }
        let Some(op) = Op::from_raw(h.op) else {
            let msg = alloc::format!("unknown operation {:#06x}", h.op);
            self.send_error(i, ErrorCode::UnknownOp, h.op, h.request_id, &msg, [u32::from(h.op), 0, 0]);
            return self.close_unless(authenticated, i, now_ms);
        };
        if let (Op::Heartbeat, State::Authenticated(who, _)) = (op, &self.conns[i].state) {
            // Even a HEARTBEAT refused for credits shows the tenant is alive: its leases must not expire while
            // its credits are held by answers the HCA is slow to give.
            self.backend.session_alive(who, now_ms);
        }
        if authenticated && self.conns[i].outstanding() >= usize::from(self.limits.credits) {
            let msg = alloc::format!("more than {} requests outstanding", self.limits.credits);
            let credits = u32::from(self.limits.credits);
            return self.send_error(i, ErrorCode::CreditExceeded, h.op, h.request_id, &msg, [credits, 0, 0]);
        }
        let req = match Request::decode(op, payload) {
            Ok(r) => r,
            Err(e) => {
                let msg = alloc::format!("{}: {e}", op.name());
                let code = match e {
                    DecodeError::Invalid { .. } => ErrorCode::BadParam,
                    _ => ErrorCode::Malformed,
                };
                self.send_error(i, code, h.op, h.request_id, &msg, [0; 3]);
                return self.close_unless(authenticated, i, now_ms);
            }
        };
        if !authenticated {
            return self.hello(i, h.request_id, req, now_ms);
        }
        let who = match &self.conns[i].state {
            State::Authenticated(p, _) => p.clone(),
            _ => return,
        };
        if let Err(e) = self.admit_op(&req) {
            return self.send_answer(i, op, h.request_id, Err(e));
        }
        let reply = match &req {
            Request::Hello(_) => Err(ErrorBody::new(ErrorCode::BadState, "already authenticated")),
            Request::Heartbeat { echo } => {
                Ok(Response::Heartbeat { echo: *echo, uptime_ms: now_ms.saturating_sub(self.start_ms) })
            }
            Request::Bye => Ok(Response::Bye),
            Request::Stats => Ok(Response::Stats(Box::new(self.stats_for(&who, now_ms)))),
            Request::StatsWith { want } => {
                let mut s = self.stats_for(&who, now_ms);
                if want & STATS_WANT_GUARDS != 0 {
                    // The appliance's defences are the admin's figures; a tenant gets the block, zeroed.
                    let admin = who.role == leasebox_proto::Role::Admin;
                    s.guards = Some(if admin { self.guards() } else { SessionGuards::default() });
                }
                Ok(Response::Stats(Box::new(s)))
            }
            Request::Health => {
                let (hca, hca_message) = self.platform.hca();
                let leases = self.backend.health_facts();
                Ok(Response::Health(crate::health::health(
                    hca,
                    &hca_message,
                    &leases,
                    now_ms.saturating_sub(self.start_ms),
                )))
            }
            Request::HcaStats => self.platform.hca_stats().map(Response::HcaStats).ok_or_else(|| {
                ErrorBody::new(ErrorCode::NotImplemented, "HCA_STATS: this appliance drives no mlx5 command queue")
            }),
            Request::FencedSummary { cursor, max } => {
                let (next_cursor, slots) = self.backend.fenced(&who, *cursor, *max);
                Ok(Response::FencedSummary { next_cursor, slots })
            }
            Request::LeaseLog { .. } if who.role != Role::Admin => Err(ErrorBody::new(
                ErrorCode::Forbidden,
                "LEASE_LOG: only the admin may read the lease transitions (they name every tenant's slots)",
            )),
            Request::LeaseLog { cursor, max } => match self.backend.lease_log(*cursor, *max) {
                Some((next_cursor, lost, records)) => Ok(Response::LeaseLog { next_cursor, lost, records }),
                None => {
                    Err(ErrorBody::new(ErrorCode::NotImplemented, "LEASE_LOG: the lease service keeps no transitions"))
                }
            },
            Request::Resume { session_id, token } => self.resume(&who, *session_id, token, now_ms),
            Request::Drain { .. } if who.role != Role::Admin => {
                Err(ErrorBody::new(ErrorCode::Forbidden, "DRAIN: only the admin may drain the appliance"))
            }
            _ => {
                let ticket =
                    Ticket { conn: self.conns[i].id, session_id: who.session_id, request_id: h.request_id, op };
                match self.backend.lease_op(&who, &req, ticket, now_ms) {
                    // The lease service keeps its own clock; the deadline is told on the uptime clock HEARTBEAT
                    // reports, which is the one the client sees.
                    Answer::Now(Ok(Response::Drain { leases, .. })) => {
                        let notice_ms = match &req {
                            Request::Drain { notice_ms, .. } => u64::from(*notice_ms),
                            _ => 0,
                        };
                        let deadline_ms = now_ms.saturating_sub(self.start_ms) + notice_ms;
                        Ok(Response::Drain { leases, deadline_ms })
                    }
                    Answer::Now(reply) => reply,
                    Answer::Later => {
                        self.conns[i].deferred += 1;
                        return;
                    }
                }
            }
        };
        self.send_answer(i, op, h.request_id, reply);
        if req == Request::Bye {
            self.close(i, CloseReason::Bye, now_ms);
        }
    }

    /// HELLO before authentication: v2's Noise handshake (step 3); v1's step 1 is refused naming v2.
    fn hello(&mut self, i: usize, request_id: u32, req: Request, now_ms: u64) {
        let hello = Op::Hello as u16;
        match req {
            Request::Hello(Hello::Noise(h)) => self.hello_v2(i, request_id, h, now_ms),
            Request::Hello(Hello::Init(_)) => {
                let d = [u32::from(VERSION_MIN), u32::from(VERSION_MAX), 0];
                self.send_error(i, ErrorCode::UnsupportedVersion, hello, request_id, V1_REFUSED, d);
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
            req => {
                let (code, msg) = match req {
                    Request::Hello(_) => (ErrorCode::BadState, "HELLO steps out of order"),
                    _ => (ErrorCode::NotAuthenticated, "authenticate with HELLO first"),
                };
                self.send_error(i, code, req.op() as u16, request_id, msg, [0; 3]);
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
    }

    /// HELLO step 3: reads Noise message 1 under the named key's PSK (a random stand-in for an unknown name or
    /// key id: the same work and the same answer), then answers with message 2, whose encrypted payload carries
    /// everything the server announces; from then on every frame travels in records.
    fn hello_v2(&mut self, i: usize, request_id: u32, h: HelloNoise, now_ms: u64) {
        let op = Op::Hello as u16;
        let version = h.max_version.min(VERSION_MAX);
        if h.min_version > h.max_version || version < h.min_version.max(VERSION_MIN) {
            let msg = alloc::format!("this server speaks versions {VERSION_MIN}..={VERSION_MAX}");
            let d = [u32::from(VERSION_MIN), u32::from(VERSION_MAX), 0];
            self.send_error(i, ErrorCode::UnsupportedVersion, op, request_id, &msg, d);
            return self.close(i, CloseReason::ProtocolError, now_ms);
        }
        // Reading message 1 costs a key derivation and an AEAD tag: at most the source's HELLO rate of them.
        if let Err(r) = self.admission.hello(self.conns[i].source, now_ms) {
            self.stats.sessions_refused += 1;
            self.send_error(i, ErrorCode::Busy, op, request_id, &alloc::format!("{r}"), r.detail());
            return self.close(i, CloseReason::ProtocolError, now_ms);
        }
        let principal = self.keys.find(&h.name, h.key_id);
        let psk = match principal {
            Some(p) => self.keys.get(p).psk,
            None => self.dummy_psk,
        };
        let prologue = v2::prologue_for(h.min_version, h.max_version, h.key_id, &h.name, &self.appliance);
        let read = Responder::read(&prologue, &psk, &h.msg1);
        self.hello_macs += 1;
        let (Some(p), Ok(responder)) = (principal, read) else {
            self.send_error(i, ErrorCode::AuthFailed, op, request_id, "authentication failed", [0; 3]);
            return self.close(i, CloseReason::ProtocolError, now_ms);
        };
        // A replayed message 1 (its ephemeral key seen in one that verified) gets the answer a wrong key gets,
        // before any costly work: only its sender's own message 1 can be answered usefully anyway.
        let mut seen = [0u8; 16];
        seen.copy_from_slice(&h.msg1[..16]);
        if !self.seen_set.insert(seen) {
            self.hellos_replayed += 1;
            self.send_error(i, ErrorCode::AuthFailed, op, request_id, "authentication failed", [0; 3]);
            return self.close(i, CloseReason::ProtocolError, now_ms);
        }
        self.seen_hellos.push_back(seen);
        if self.seen_hellos.len() > MAX_SEEN_HELLOS
            && let Some(old) = self.seen_hellos.pop_front()
        {
            self.seen_set.remove(&old);
        }
        // Answering costs two entropy draws, an X25519 key and a DH: at most so many a second in total.
        if let Err(r) = self.admission.hello_work(now_ms) {
            self.stats.sessions_refused += 1;
            self.send_error(i, ErrorCode::Busy, op, request_id, &alloc::format!("{r}"), r.detail());
            return self.close(i, CloseReason::ProtocolError, now_ms);
        }
        let (mut e, mut token) = ([0u8; 32], [0u8; RESUME_TOKEN_LEN]);
        if self.platform.fill(&mut e).is_err() || self.platform.fill(&mut token).is_err() {
            self.send_error(i, ErrorCode::Internal, op, request_id, "no random source", [0; 3]);
            return self.close(i, CloseReason::ProtocolError, now_ms);
        }
        let session_id = self.next_session;
        self.next_session += 1;
        let role = self.keys.get(p).role;
        let announce = Announce {
            version,
            role: role as u8,
            credits: self.limits.credits,
            heartbeat_ms: self.limits.heartbeat_ms,
            session_id,
            boot_id: self.boot_id,
            resume_token: token,
        };
        // A low-order client ephemeral would make the session keys depend on the PSK alone: refused as any
        // other failed handshake is.
        let Ok((msg2, transport)) = responder.reply(e, &announce.encode()) else {
            self.send_error(i, ErrorCode::AuthFailed, op, request_id, "authentication failed", [0; 3]);
            return self.close(i, CloseReason::ProtocolError, now_ms);
        };
        self.stats.frames_out += 1;
        let mut f = Vec::new();
        Response::Hello(HelloReply::Noise { msg2 }).encode(Op::Hello, request_id, &mut f);
        self.queue(i, f);
        let who = Principal { name: h.name, role, session_id };
        self.conns[i].token = token;
        self.conns[i].state = State::Confirming(Pending { who, key: p }, Box::new(transport));
    }

    /// Copies pending output for `id` into `buf`.
    pub fn output(&mut self, id: ConnId, buf: &mut [u8]) -> usize {
        if let Some(r) = self.refused.iter_mut().find(|(c, _)| *c == id) {
            return drain(&mut r.1, buf);
        }
        let Some(i) = self.idx(id) else { return 0 };
        let c = &mut self.conns[i];
        let n = drain(&mut c.out, buf);
        c.taken += n as u64;
        while c.answer_ends.front().is_some_and(|end| *end <= c.taken) {
            c.answer_ends.pop_front();
        }
        n
    }

    /// Whether `id` should be closed once its output is drained.
    pub fn wants_close(&self, id: ConnId) -> bool {
        if self.refused.iter().any(|(c, _)| *c == id) {
            return true;
        }
        self.idx(id).is_none_or(|i| self.conns[i].close)
    }

    /// Whether `id` has output waiting.
    pub fn has_output(&self, id: ConnId) -> bool {
        self.refused.iter().any(|(c, o)| *c == id && !o.is_empty())
            || self.idx(id).is_some_and(|i| !self.conns[i].out.is_empty())
    }

    /// The transport connection is gone.
    pub fn closed(&mut self, id: ConnId, now_ms: u64) {
        self.refused.retain(|(c, _)| *c != id);
        if let Some(i) = self.idx(id) {
            self.close(i, CloseReason::PeerClosed, now_ms);
            self.conns.remove(i);
            self.index.remove(&id);
            for c in &self.conns[i..] {
                if let Some(at) = self.index.get_mut(&c.id) {
                    *at -= 1;
                }
            }
        }
    }

    /// Timers: the backend's first, then sessions silent for longer than the heartbeat timeout, and connections
    /// that have not authenticated within [`HELLO_DEADLINE_MS`], are told TIMEOUT and closed; then the answers
    /// the backend has finished are delivered.
    pub fn tick(&mut self, now_ms: u64) {
        self.backend.tick(now_ms);
        let limit = u64::from(self.limits.heartbeat_ms);
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.close {
                continue;
            }
            // A record partly in for longer than its size allows at MIN_RECORD_RATE.
            let trickle = match (&c.state, c.record_since_ms) {
                (State::Confirming(_, t) | State::Authenticated(_, t), Some(since)) => {
                    let n = t.pending_record().unwrap_or(v2::RECORD_HEADER_LEN) as u64;
                    now_ms.saturating_sub(since) > RECORD_GRACE_MS + n * 1000 / MIN_RECORD_RATE
                }
                _ => false,
            };
            if trickle {
                let msg = alloc::format!("a record arrived slower than {MIN_RECORD_RATE} bytes/s");
                let d = [MIN_RECORD_RATE as u32, RECORD_GRACE_MS as u32, 0];
                self.send_error(i, ErrorCode::Timeout, 0, 0, &msg, d);
                self.close(i, CloseReason::HeartbeatTimeout, now_ms);
                continue;
            }
            let (silent, unauthenticated) = (
                now_ms.saturating_sub(c.last_rx_ms) > limit,
                !matches!(c.state, State::Authenticated(..)) && now_ms.saturating_sub(c.opened_ms) > HELLO_DEADLINE_MS,
            );
            if silent {
                let msg = alloc::format!("no complete record for {limit} ms");
                self.send_error(i, ErrorCode::Timeout, Op::Heartbeat as u16, 0, &msg, [self.limits.heartbeat_ms, 0, 0]);
                self.close(i, CloseReason::HeartbeatTimeout, now_ms);
            } else if unauthenticated {
                let msg = alloc::format!("HELLO not completed within {HELLO_DEADLINE_MS} ms");
                self.send_error(i, ErrorCode::Timeout, Op::Hello as u16, 0, &msg, [HELLO_DEADLINE_MS as u32, 0, 0]);
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
        self.deliver(now_ms);
    }

    /// Connections currently open (sessions, authenticated or not).
    pub fn sessions(&self) -> usize {
        self.conns.len()
    }
}

fn drain(q: &mut VecDeque<u8>, buf: &mut [u8]) -> usize {
    let n = q.len().min(buf.len());
    for (d, s) in buf.iter_mut().zip(q.drain(..n)) {
        *d = s;
    }
    n
}
