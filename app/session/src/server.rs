//! The session table and the per-connection protocol machine.

use crate::admission::{Admission, Budget, MemoryGauge, Refusal};
use crate::backend::{Answer, Backend, CloseReason, ConnId, Principal, Ticket};
use crate::keyring::Keyring;
use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use hmac::{Hmac, Mac};
use leasebox_proto::{
    CLIENT_NONCE_LEN, DecodeError, ErrorBody, ErrorCode, FrameBuf, Header, Hello, HelloReply, Kind, Next, Op, Reply,
    Request, Response, SERVER_NONCE_LEN, Stats, hello_transcript,
};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Protocol versions this server speaks.
const VERSION_MIN: u16 = 1;
const VERSION_MAX: u16 = 1;
/// Output a client may leave unread before its session is closed (it is not reading its answers).
const MAX_PENDING_OUTPUT: usize = 256 * 1024;
/// Refused connections that still get their BUSY frame; beyond this they are just closed.
const MAX_REFUSED: usize = 4;
/// The length of the stand-in key HELLO step 2 checks an unknown name's MAC with. HMAC-SHA256 pads every key of
/// up to 64 bytes (every configured key: `keyring::MAX_KEY`) to one 64-byte block, so the check costs the same
/// whatever the real key's length.
const DUMMY_KEY_LEN: usize = 32;
/// A connection must finish HELLO within this time of opening, whatever it sends meanwhile: otherwise a
/// client that never authenticates could hold a session place forever.
pub const HELLO_DEADLINE_MS: u64 = 5_000;

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
    /// `principal` is `None` for an unknown name: the challenge is sent anyway so names cannot be probed.
    Challenged {
        principal: Option<usize>,
        name: String,
        version: u16,
        client_nonce: [u8; CLIENT_NONCE_LEN],
        server_nonce: [u8; SERVER_NONCE_LEN],
    },
    Authenticated(Principal),
}

struct Conn {
    id: ConnId,
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
    last_rx_ms: u64,
    close: bool,
}

impl Conn {
    fn outstanding(&self) -> usize {
        self.answer_ends.len() + self.deferred
    }

    /// Whether a deferred answer with this ticket may still be delivered here.
    fn awaits(&self, t: &Ticket) -> bool {
        !self.close
            && self.deferred > 0
            && matches!(&self.state, State::Authenticated(p) if p.session_id == t.session_id)
    }
}

/// The control service: every connection's session state, statistics and the backend.
pub struct Server<B: Backend, E: Entropy> {
    limits: Limits,
    keys: Keyring,
    backend: B,
    entropy: E,
    conns: Vec<Conn>,
    refused: Vec<(ConnId, VecDeque<u8>)>,
    next_session: u64,
    start_ms: u64,
    stats: Stats,
    errors: [u64; 32],
    /// Deferred answers whose session had ended (or that matched no deferred request).
    answers_dropped: u64,
    /// Scratch for [`Backend::take_answers`], kept to avoid an allocation per call.
    answers: Vec<(Ticket, Reply)>,
    /// A random key nobody knows: HELLO step 2 checks an unknown name's MAC against it, so an unknown name
    /// costs the same work as a known name with a wrong MAC and gets the same answer.
    dummy_key: [u8; DUMMY_KEY_LEN],
    /// HELLO step-2 MACs checked (one HMAC each, known names and unknown alike).
    hello_macs: u64,
    /// Places: the unauthenticated pool, session budgets per principal, the memory budget (`admission`).
    admission: Admission,
}

fn error_frame(code: ErrorCode, op: u16, request_id: u32, message: &str, detail: [u32; 3]) -> Vec<u8> {
    let mut v = Vec::new();
    ErrorBody::new(code, message).with_detail(detail).encode(op, request_id, &mut v);
    v
}

impl<B: Backend, E: Entropy> Server<B, E> {
    /// Starts the service; refuses without a working entropy source or without any principal.
    pub fn new(limits: Limits, keys: Keyring, backend: B, mut entropy: E, now_ms: u64) -> Result<Self, StartError> {
        let mut dummy_key = [0u8; DUMMY_KEY_LEN];
        entropy.fill(&mut dummy_key).map_err(|_| StartError::NoEntropy)?;
        if keys.is_empty() {
            return Err(StartError::NoPrincipals);
        }
        let stats = Stats { session_budget: limits.sessions as u32, ..Stats::default() };
        Ok(Server {
            limits,
            keys,
            backend,
            entropy,
            conns: Vec::new(),
            refused: Vec::new(),
            next_session: 1,
            start_ms: now_ms,
            stats,
            errors: [0; 32],
            answers_dropped: 0,
            answers: Vec::new(),
            dummy_key,
            hello_macs: 0,
            admission: Admission::new(Budget::for_sessions(limits.sessions)),
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
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
        s.sessions_current = self.conns.len() as u32;
        s.errors = (0..self.errors.len()).filter(|c| self.errors[*c] > 0).map(|c| (c as u16, self.errors[c])).collect();
        s.roles = self.backend.role_counts();
        s.leases = self.backend.lease_stats();
        s
    }

    /// HELLO step-2 MACs checked so far: every proof is checked with one HMAC, for a name no key is configured
    /// for too (against a random stand-in key), so the answer's timing does not tell which names exist.
    pub fn hello_macs(&self) -> u64 {
        self.hello_macs
    }

    /// Deferred answers dropped because their session had ended before they came.
    pub fn answers_dropped(&self) -> u64 {
        self.answers_dropped
    }

    fn idx(&self, id: ConnId) -> Option<usize> {
        self.conns.iter().position(|c| c.id == id)
    }

    /// A new connection; `false` = refused (over budget): it gets a BUSY frame from `output`, then closes.
    pub fn open(&mut self, id: ConnId, now_ms: u64) -> bool {
        if let Err(r) = self.admission.connect() {
            self.stats.sessions_refused += 1;
            self.count_error(ErrorCode::Busy);
            if self.refused.len() < MAX_REFUSED {
                let msg = alloc::format!("{r}");
                let f = error_frame(ErrorCode::Busy, Op::Hello as u16, 0, &msg, r.detail());
                self.stats.frames_out += 1;
                self.refused.push((id, f.into()));
            }
            return false;
        }
        self.stats.sessions_total += 1;
        self.conns.push(Conn {
            id,
            state: State::AwaitHello,
            frames: FrameBuf::new(),
            out: VecDeque::new(),
            answer_ends: VecDeque::new(),
            deferred: 0,
            queued: 0,
            taken: 0,
            opened_ms: now_ms,
            last_rx_ms: now_ms,
            close: false,
        });
        true
    }

    fn count_error(&mut self, code: ErrorCode) {
        if let Some(n) = self.errors.get_mut(code as usize) {
            *n += 1;
        }
    }

    /// Queues an error frame on connection `i` (not an answer that holds a credit).
    fn send_error(&mut self, i: usize, code: ErrorCode, op: u16, request_id: u32, message: &str, detail: [u32; 3]) {
        self.count_error(code);
        self.stats.frames_out += 1;
        let f = error_frame(code, op, request_id, message, detail);
        let c = &mut self.conns[i];
        c.queued += f.len() as u64;
        c.out.extend(f);
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
        let c = &mut self.conns[i];
        c.queued += f.len() as u64;
        c.out.extend(f);
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
        self.conns[i].last_rx_ms = now_ms;
        self.conns[i].frames.push(data);
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
                    let authenticated = matches!(self.conns[i].state, State::Authenticated(_));
                    if e.framing_lost || !authenticated {
                        self.close(i, CloseReason::ProtocolError, now_ms);
                    }
                }
                Next::Frame(h, payload) => {
                    self.stats.frames_in += 1;
                    self.frame(i, h, &payload, now_ms);
                }
            }
            if self.conns[i].out.len() > MAX_PENDING_OUTPUT {
                // The client sends but does not read: stop serving it rather than buffer without bound.
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
    }

    /// Queues the answers the backend has finished ([`Backend::take_answers`]) on their connections. An answer
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
    }

    fn close(&mut self, i: usize, reason: CloseReason, now_ms: u64) {
        let c = &mut self.conns[i];
        if c.close {
            return;
        }
        c.close = true;
        // The place is given back now: a closing connection no longer counts against any budget.
        if let State::Authenticated(p) = &c.state {
            let p = p.clone();
            self.admission.disconnect(Some(&p.name));
            self.backend.session_lost(&p, reason, now_ms);
        } else {
            self.admission.disconnect(None);
        }
    }

    /// HELLO proved the key of principal `p`: it takes a session place (`true`), or, over a budget, the
    /// connection is answered BUSY and closed (`false`).
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
        let authenticated = matches!(self.conns[i].state, State::Authenticated(_));
        if h.kind != Kind::Request {
            self.send_error(i, ErrorCode::Malformed, h.op, h.request_id, "clients send requests only", [0; 3]);
            return self.close_unless(authenticated, i, now_ms);
        }
        let Some(op) = Op::from_raw(h.op) else {
            let msg = alloc::format!("unknown operation {:#06x}", h.op);
            self.send_error(i, ErrorCode::UnknownOp, h.op, h.request_id, &msg, [u32::from(h.op), 0, 0]);
            return self.close_unless(authenticated, i, now_ms);
        };
        if let (Op::Heartbeat, State::Authenticated(who)) = (op, &self.conns[i].state) {
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
            State::Authenticated(p) => p.clone(),
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
            Request::Health => {
                let mut hl = self.backend.health(now_ms);
                hl.uptime_ms = now_ms.saturating_sub(self.start_ms);
                Ok(Response::Health(hl))
            }
            Request::FencedSummary { cursor, max } => {
                let (next_cursor, slots) = self.backend.fenced(&who, *cursor, *max);
                Ok(Response::FencedSummary { next_cursor, slots })
            }
            _ => {
                let ticket =
                    Ticket { conn: self.conns[i].id, session_id: who.session_id, request_id: h.request_id, op };
                match self.backend.lease_op(&who, &req, ticket, now_ms) {
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

    /// HELLO before authentication: challenge, then proof.
    fn hello(&mut self, i: usize, request_id: u32, req: Request, now_ms: u64) {
        let state = core::mem::replace(&mut self.conns[i].state, State::AwaitHello);
        match (state, req) {
            (State::AwaitHello, Request::Hello(Hello::Init(init))) => {
                let version = init.max_version.min(VERSION_MAX);
                if init.min_version > init.max_version || version < init.min_version.max(VERSION_MIN) {
                    let msg = alloc::format!("this server speaks versions {VERSION_MIN}..={VERSION_MAX}");
                    let d = [u32::from(VERSION_MIN), u32::from(VERSION_MAX), 0];
                    self.send_error(i, ErrorCode::UnsupportedVersion, Op::Hello as u16, request_id, &msg, d);
                    return self.close(i, CloseReason::ProtocolError, now_ms);
                }
                let mut server_nonce = [0u8; SERVER_NONCE_LEN];
                if self.entropy.fill(&mut server_nonce).is_err() {
                    self.send_error(i, ErrorCode::Internal, Op::Hello as u16, request_id, "no random source", [0; 3]);
                    return self.close(i, CloseReason::ProtocolError, now_ms);
                }
                let principal = self.keys.find(&init.name);
                self.conns[i].state = State::Challenged {
                    principal,
                    name: init.name,
                    version,
                    client_nonce: init.client_nonce,
                    server_nonce,
                };
                self.stats.frames_out += 1;
                let mut f = Vec::new();
                Response::Hello(HelloReply::Challenge { version, server_nonce }).encode(Op::Hello, request_id, &mut f);
                let c = &mut self.conns[i];
                c.queued += f.len() as u64;
                c.out.extend(f);
            }
            (
                State::Challenged { principal, name, version, client_nonce, server_nonce },
                Request::Hello(Hello::Proof { mac }),
            ) => {
                // One HMAC whatever the name: an unknown name's MAC is checked against the random stand-in key
                // and refused exactly as a wrong MAC is, so neither the answer nor the work tells names apart.
                let key = match principal {
                    Some(p) => &self.keys.get(p).key[..],
                    None => &self.dummy_key[..],
                };
                let t = hello_transcript(true, version, &name, &client_nonce, &server_nonce);
                let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
                m.update(&t);
                let mac_ok = m.verify_slice(&mac).is_ok();
                self.hello_macs += 1;
                let verified = principal.filter(|_| mac_ok);
                let Some(p) = verified else {
                    self.send_error(
                        i,
                        ErrorCode::AuthFailed,
                        Op::Hello as u16,
                        request_id,
                        "authentication failed",
                        [0; 3],
                    );
                    return self.close(i, CloseReason::ProtocolError, now_ms);
                };
                if !self.admit(i, request_id, p, now_ms) {
                    return;
                }
                let entry = self.keys.get(p);
                let t = hello_transcript(false, version, &name, &client_nonce, &server_nonce);
                let mut m = <HmacSha256 as Mac>::new_from_slice(&entry.key).expect("HMAC accepts any key length");
                m.update(&t);
                let server_proof: [u8; 32] = m.finalize().into_bytes().into();
                let session_id = self.next_session;
                self.next_session += 1;
                let role = entry.role;
                let who = Principal { name, role, session_id };
                self.conns[i].state = State::Authenticated(who.clone());
                let welcome = HelloReply::Welcome {
                    role,
                    credits: self.limits.credits,
                    heartbeat_ms: self.limits.heartbeat_ms,
                    session_id,
                    server_proof,
                };
                self.stats.frames_out += 1;
                let mut f = Vec::new();
                Response::Hello(welcome).encode(Op::Hello, request_id, &mut f);
                let c = &mut self.conns[i];
                c.queued += f.len() as u64;
                c.out.extend(f);
                self.backend.session_started(&who, now_ms);
            }
            (_, req) => {
                let (code, msg) = match req {
                    Request::Hello(_) => (ErrorCode::BadState, "HELLO steps out of order"),
                    _ => (ErrorCode::NotAuthenticated, "authenticate with HELLO first"),
                };
                self.send_error(i, code, req.op() as u16, request_id, msg, [0; 3]);
                self.close(i, CloseReason::ProtocolError, now_ms);
            }
        }
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
        self.conns.iter().find(|c| c.id == id).is_none_or(|c| c.close)
    }

    /// Whether `id` has output waiting.
    pub fn has_output(&self, id: ConnId) -> bool {
        self.refused.iter().any(|(c, o)| *c == id && !o.is_empty())
            || self.conns.iter().any(|c| c.id == id && !c.out.is_empty())
    }

    /// The transport connection is gone.
    pub fn closed(&mut self, id: ConnId, now_ms: u64) {
        self.refused.retain(|(c, _)| *c != id);
        if let Some(i) = self.idx(id) {
            self.close(i, CloseReason::PeerClosed, now_ms);
            self.conns.remove(i);
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
            let (silent, unauthenticated) = (
                now_ms.saturating_sub(c.last_rx_ms) > limit,
                !matches!(c.state, State::Authenticated(_)) && now_ms.saturating_sub(c.opened_ms) > HELLO_DEADLINE_MS,
            );
            if silent {
                let msg = alloc::format!("no frame for {limit} ms");
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
