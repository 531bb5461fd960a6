//! One appliance's connection thread: it owns the control [`Connection`], sends HEARTBEATs every
//! `heartbeat_ms / 3` (the appliance closes a session silent for `heartbeat_ms`), renews the leases it tracks
//! before their TTL runs out, reconnects when the connection breaks, and runs the callers' requests, which
//! reach it through a channel ([`Cmd`]) and are answered through a one-shot channel each.
//!
//! Requests run one at a time on the socket, so every answer is matched to its request id by
//! [`Connection::call`]; the credits the appliance grants are never in question.
//!
//! Protocol v2's notices and resume (issue 16, items 2 and 3) plug in at two places marked `NOTICES` and
//! `RESUME` below: [`Worker::take_notices`] and [`Worker::reconnect`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_proto::{ErrorCode, LeaseId, LeaseState, Outcome, Request, Response};

use crate::connection::{Client as Connection, ClientError, Credentials, Timeouts};
use crate::error::{Error, from_client};
use crate::event::{Event, Sink};

/// First pause before a reconnect attempt; it doubles after each failure up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// How long one reconnect attempt may take (connect + HELLO), so the thread comes back to its queue.
const RECONNECT_ATTEMPT: Duration = Duration::from_secs(2);
/// Leases are renewed when this fraction of their TTL is left… (1/2: one lost RENEW still leaves time).
const RENEW_AT_DIVISOR: u32 = 2;
/// FREEs kept for the next connection at most (each is one lease id; past it the lease is left to its TTL).
const MAX_PENDING_FREES: usize = 4096;
/// How long the shutdown may spend freeing the leases still held and saying BYE.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(3);

/// A lease's state shared by the [`crate::Lease`] and the connection thread.
#[derive(Debug, Default)]
pub(crate) struct LeaseShared {
    /// Set once the lease is known to be gone (a revoke, a vanished lease); every call fails with it.
    revoked: Mutex<Option<Outcome>>,
    /// Freed (by the program, or at the client's shutdown).
    pub(crate) closed: AtomicBool,
}

impl LeaseShared {
    pub(crate) fn revoked(&self) -> Option<Outcome> {
        *self.revoked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the lease revoked; true the first time, so the event is sent once.
    pub(crate) fn mark_revoked(&self, outcome: Outcome) -> bool {
        let mut r = self.revoked.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_some() {
            return false;
        }
        *r = Some(outcome);
        true
    }
}

/// What callers ask of the connection thread.
pub(crate) enum Cmd {
    /// Run a request; the answer goes back on `reply`.
    Call {
        req: Request,
        reply: Sender<Result<Response, Error>>,
    },
    /// Keep this lease alive (RENEW before `ttl_ms` runs out) and tell its holder if it vanishes.
    Track {
        lease: LeaseId,
        ttl_ms: u32,
        shared: Arc<LeaseShared>,
    },
    /// Stop tracking (the program freed it).
    Forget {
        lease: LeaseId,
    },
    /// FREE without anyone waiting for the answer (a lease dropped unfreed).
    FreeLater {
        lease: LeaseId,
    },
    Shutdown,
}

/// The callers' end of one connection thread.
pub(crate) struct Session {
    pub(crate) appliance: String,
    tx: Sender<Cmd>,
    join: Mutex<Option<JoinHandle<()>>>,
    /// The thread has ended (shutdown): calls fail at once.
    ended: Arc<AtomicBool>,
    /// Whether a connection is up right now (placement skips appliances without one).
    up: Arc<AtomicBool>,
}

impl Session {
    /// Starts the thread over `conn` (already authenticated) or, when `None`, with a reconnect pending.
    pub(crate) fn start(
        appliance: String,
        who: Credentials,
        timeouts: Timeouts,
        conn: Option<Connection>,
        sink: Arc<Sink>,
    ) -> Result<Session, Error> {
        let (tx, rx) = mpsc::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let up = Arc::new(AtomicBool::new(conn.is_some()));
        let now = Instant::now();
        let mut w = Worker {
            appliance: appliance.clone(),
            who,
            timeouts,
            heartbeat_every: conn.as_ref().map_or(Duration::from_secs(1), heartbeat_period),
            conn,
            next_heartbeat: now,
            reconnect_at: now,
            backoff: RECONNECT_MIN,
            leases: HashMap::new(),
            pending_frees: Vec::new(),
            sink,
            up: up.clone(),
        };
        w.next_heartbeat = now + w.heartbeat_every;
        let done = ended.clone();
        let join = std::thread::Builder::new()
            .name(format!("leasebox {appliance}"))
            .spawn(move || {
                w.run(rx);
                done.store(true, Ordering::Release);
            })
            .map_err(|e| Error::Config(format!("starting the connection thread: {e}")))?;
        Ok(Session { appliance, tx, join: Mutex::new(Some(join)), ended, up })
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Runs `req` on the connection thread; waits at most `wait` for its answer.
    pub(crate) fn call(&self, req: Request, wait: Duration) -> Result<Response, Error> {
        if self.ended.load(Ordering::Acquire) {
            return Err(Error::Closed("the client was dropped"));
        }
        let (reply, answer) = mpsc::channel();
        self.send(Cmd::Call { req, reply })?;
        match answer.recv_timeout(wait) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                Err(Error::Timeout { what: "answer from the connection thread", after: wait })
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Closed("the client was dropped")),
        }
    }

    pub(crate) fn send(&self, cmd: Cmd) -> Result<(), Error> {
        self.tx.send(cmd).map_err(|_| Error::Closed("the client was dropped"))
    }

    /// Asks the thread to free what it still tracks, say BYE and end; waits for it.
    pub(crate) fn shutdown(&self) {
        let _ = self.tx.send(Cmd::Shutdown);
        let join = self.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = join {
            // Every step of the thread's shutdown has its own deadline (SHUTDOWN_BUDGET, the receive timeout).
            let _ = j.join();
        }
    }
}

/// Heartbeats every third of the appliance's silence timeout.
fn heartbeat_period(c: &Connection) -> Duration {
    let ms = c.welcome().map_or(10_000, |w| w.heartbeat_ms).max(3);
    Duration::from_millis(u64::from(ms / 3))
}

/// A connection error after which the socket is of no more use.
fn breaks_connection(e: &ClientError) -> bool {
    match e {
        ClientError::Io(_) | ClientError::Timeout { .. } | ClientError::Protocol(_) | ClientError::ServerProof => true,
        // The appliance closed the session for silence (request id 0): the connection is closing.
        ClientError::Server(b) => b.code == ErrorCode::Timeout,
        ClientError::Usage(_) => false,
    }
}

/// Requests that may be sent again on a fresh connection when the first try's connection broke: they change
/// nothing twice (ALLOC and REVOKE are not among them: a second ALLOC would leave the first one's lease behind).
fn idempotent(req: &Request) -> bool {
    matches!(
        req,
        Request::Heartbeat { .. }
            | Request::Stats
            | Request::Query { .. }
            | Request::Renew { .. }
            | Request::Free { .. }
            | Request::List { .. }
            | Request::Health
            | Request::FencedSummary { .. }
    )
}

/// What one QUERY says of a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Granted or Active, or the QUERY failed: nothing says it is gone.
    Alive,
    /// Fencing: a revoke is in its immediate phase; its outcome is not decided yet.
    Going,
    /// PendingDestroy (torn down, waiting out its grace period): TornDown; Fenced: Fenced; NOT_FOUND or STALE
    /// (the appliance no longer knows it): NotFound.
    Gone(Outcome),
}

pub(crate) fn seen(answer: &Result<Response, ClientError>) -> Seen {
    match answer {
        Ok(Response::Query(info)) => match info.state {
            LeaseState::Active | LeaseState::Granted => Seen::Alive,
            LeaseState::Fencing => Seen::Going,
            LeaseState::PendingDestroy => Seen::Gone(Outcome::TornDown),
            LeaseState::Fenced => Seen::Gone(Outcome::Fenced),
        },
        Err(ClientError::Server(e)) if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale) => {
            Seen::Gone(Outcome::NotFound)
        }
        _ => Seen::Alive,
    }
}

/// How long a revoke in its immediate phase is waited for: the appliance's revoke deadline is 1 s, past which
/// the slot is fenced (docs/revoke-semantics.md).
const SETTLE: Duration = Duration::from_millis(1500);

/// Whether the lease is gone and with which outcome, asking `query` again while a revoke is still in its
/// immediate phase (Fenced when it is still undecided after [`SETTLE`]).
pub(crate) fn settle(mut query: impl FnMut() -> Result<Response, ClientError>) -> Option<Outcome> {
    let end = Instant::now() + SETTLE;
    loop {
        match seen(&query()) {
            Seen::Alive => return None,
            Seen::Gone(o) => return Some(o),
            Seen::Going if Instant::now() >= end => return Some(Outcome::Fenced),
            Seen::Going => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

struct Tracked {
    ttl_ms: u32,
    renew_at: Instant,
    shared: Arc<LeaseShared>,
}

struct Worker {
    appliance: String,
    who: Credentials,
    timeouts: Timeouts,
    conn: Option<Connection>,
    heartbeat_every: Duration,
    next_heartbeat: Instant,
    reconnect_at: Instant,
    backoff: Duration,
    leases: HashMap<LeaseId, Tracked>,
    /// FREEs that found the connection down, sent again after the next reconnect.
    pending_frees: Vec<LeaseId>,
    sink: Arc<Sink>,
    up: Arc<AtomicBool>,
}

impl Worker {
    fn run(&mut self, rx: Receiver<Cmd>) {
        loop {
            let now = Instant::now();
            let wake = match self.conn {
                Some(_) => self.leases.values().map(|t| t.renew_at).fold(self.next_heartbeat, Instant::min),
                None => self.reconnect_at,
            };
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Cmd::Shutdown) | Err(RecvTimeoutError::Disconnected) => return self.shutdown(),
                Ok(cmd) => self.handle(cmd),
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.tick();
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Call { req, reply } => {
                let r = self.call(&req).map_err(|e| from_client(&self.appliance, e));
                let _ = reply.send(r);
            }
            Cmd::Track { lease, ttl_ms, shared } => {
                let renew_at = Instant::now() + renew_after(ttl_ms);
                self.leases.insert(lease, Tracked { ttl_ms, renew_at, shared });
            }
            Cmd::Forget { lease } => {
                self.leases.remove(&lease);
            }
            Cmd::FreeLater { lease } => {
                if let Some(t) = self.leases.remove(&lease) {
                    t.shared.closed.store(true, Ordering::Release);
                }
                self.free_or_keep(lease);
            }
            Cmd::Shutdown => {}
        }
    }

    /// Timers: the reconnect, the heartbeat, the renewals; and the appliance's notices.
    fn tick(&mut self) {
        let now = Instant::now();
        if self.conn.is_none() {
            if now >= self.reconnect_at {
                self.reconnect();
            }
            return;
        }
        if now >= self.next_heartbeat {
            let _ = self.call(&Request::Heartbeat { echo: 0 });
        }
        self.renew_due();
        self.take_notices();
    }

    /// NOTICES: the one place where the appliance's notices (issue 16, item 2) become [`Event`]s. With them,
    /// this takes `conn.take_notices()` (those that came in with answers) and, with no request outstanding,
    /// `conn.wait_notices(d)` for a short `d` (and `run` bounds its channel wait by the same `d`, so the thread
    /// alternates between callers and the socket); then per notice: `Revoked { lease, outcome }` → the tracked
    /// lease's `shared.mark_revoked(outcome)`, stop tracking it, `Event::Revoked`; `Fenced { lease }` → the same
    /// with `Outcome::Fenced` and `Event::Fenced`; `Expiring { lease, in_ms }` → renew that lease now and pass
    /// `Event::Expiring` on; `Draining { in_ms }` → `Event::Draining`. An error from `wait_notices` that breaks
    /// the connection goes to `self.lost`. Until the protocol has notices, a revoke is found by the renewals
    /// below and by the lease's failed RDMA completions.
    fn take_notices(&mut self) {}

    fn renew_due(&mut self) {
        let now = Instant::now();
        let due: Vec<LeaseId> = self.leases.iter().filter(|(_, t)| t.renew_at <= now).map(|(l, _)| *l).collect();
        for lease in due {
            let Some(ttl_ms) = self.leases.get(&lease).map(|t| t.ttl_ms) else { continue };
            let answer = self.call(&Request::Renew { lease, ttl_ms });
            match answer {
                Ok(Response::Renew { ttl_ms: granted }) => {
                    if let Some(t) = self.leases.get_mut(&lease) {
                        t.ttl_ms = granted.max(1);
                        t.renew_at = Instant::now() + renew_after(t.ttl_ms);
                    }
                }
                Err(ClientError::Server(e))
                    if matches!(e.code, ErrorCode::NotFound | ErrorCode::Stale | ErrorCode::BadState) =>
                {
                    match settle(|| self.call(&Request::Query { lease })) {
                        Some(outcome) => self.vanished(lease, outcome),
                        // QUERY says it lives (or could not say): try again shortly.
                        None => {
                            if let Some(t) = self.leases.get_mut(&lease) {
                                t.renew_at = Instant::now() + Duration::from_secs(1);
                            }
                        }
                    }
                }
                // A broken connection: the reconnect renews everything at once.
                _ => {
                    if let Some(t) = self.leases.get_mut(&lease) {
                        t.renew_at = Instant::now() + Duration::from_millis(200);
                    }
                }
            }
        }
    }

    /// FREE; when the connection is down, kept in [`Worker::pending_frees`] for the next connection (a lost
    /// session's leases go to the tenant's next session, which would otherwise keep them).
    fn free_or_keep(&mut self, lease: LeaseId) {
        let r = self.call(&Request::Free { lease });
        let unsent = matches!(&r, Err(e) if breaks_connection(e) || self.conn.is_none());
        if unsent && self.pending_frees.len() < MAX_PENDING_FREES && !self.pending_frees.contains(&lease) {
            self.pending_frees.push(lease);
        }
    }

    fn vanished(&mut self, lease: LeaseId, outcome: Outcome) {
        if let Some(t) = self.leases.remove(&lease)
            && t.shared.mark_revoked(outcome)
        {
            self.sink.emit(Event::Revoked { appliance: self.appliance.clone(), lease, outcome });
        }
    }

    /// One request on the connection; a broken connection is dropped and, for a request that may be repeated,
    /// the request is tried once more on a fresh one.
    fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        if self.conn.is_none() {
            self.reconnect();
        }
        let first = self.try_call(req);
        match first {
            Err(ref e) if breaks_connection(e) && self.conn.is_none() && idempotent(req) => {
                self.reconnect();
                self.try_call(req)
            }
            other => other,
        }
    }

    fn try_call(&mut self, req: &Request) -> Result<Response, ClientError> {
        let Some(c) = self.conn.as_mut() else {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "not connected (reconnecting)",
            )));
        };
        let r = c.call(req);
        match &r {
            Err(e) if breaks_connection(e) => self.lost(e.to_string()),
            // The appliance heard us: its silence timer restarted.
            _ => self.next_heartbeat = Instant::now() + self.heartbeat_every,
        }
        r
    }

    fn lost(&mut self, reason: String) {
        if self.conn.take().is_some() {
            self.up.store(false, Ordering::Release);
            self.reconnect_at = Instant::now();
            self.backoff = RECONNECT_MIN;
            self.sink.emit(Event::Disconnected { appliance: self.appliance.clone(), reason });
        }
    }

    /// One connect + HELLO attempt (bounded by [`RECONNECT_ATTEMPT`]); on failure the next waits longer.
    ///
    /// RESUME: with protocol resume (issue 16, item 3), the first thing on the new connection is
    /// `c.resume(old_session_id, old_resume_token)` (both from the last Welcome, kept in the worker), so the old
    /// session's leases move over at once; and a Welcome whose `boot_id` differs from the last one means the
    /// appliance rebooted: every tracked lease is gone (`vanished(lease, Outcome::NotFound)` each). Until then
    /// the appliance hands a lost session's leases to the tenant's next session (`session_grace_ms=`,
    /// docs/operations.md), and the RENEW of every tracked lease, due at once after a reconnect, finds out which
    /// survived.
    fn reconnect(&mut self) {
        let t = Timeouts {
            connect: self.timeouts.connect.min(RECONNECT_ATTEMPT),
            receive: self.timeouts.receive.min(RECONNECT_ATTEMPT),
            retry_for: RECONNECT_ATTEMPT,
        };
        match Connection::connect_and_hello(&self.appliance, &self.who, t) {
            Ok((mut c, welcome)) => {
                c.set_timeouts(self.timeouts);
                self.heartbeat_every = heartbeat_period(&c);
                self.next_heartbeat = Instant::now() + self.heartbeat_every;
                self.conn = Some(c);
                self.up.store(true, Ordering::Release);
                self.backoff = RECONNECT_MIN;
                self.sink
                    .emit(Event::Reconnected { appliance: self.appliance.clone(), session_id: welcome.session_id });
                let now = Instant::now();
                for t in self.leases.values_mut() {
                    t.renew_at = now;
                }
                for lease in std::mem::take(&mut self.pending_frees) {
                    self.free_or_keep(lease);
                }
            }
            Err(_) => {
                self.reconnect_at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(RECONNECT_MAX);
            }
        }
    }

    /// Frees every lease still tracked and says BYE, within [`SHUTDOWN_BUDGET`].
    fn shutdown(&mut self) {
        let end = Instant::now() + SHUTDOWN_BUDGET;
        let leases: Vec<(LeaseId, Arc<LeaseShared>)> = self.leases.drain().map(|(l, t)| (l, t.shared)).collect();
        for (lease, shared) in leases {
            shared.closed.store(true, Ordering::Release);
            if Instant::now() < end && self.conn.is_some() {
                let _ = self.try_call(&Request::Free { lease });
            }
        }
        if let Some(c) = self.conn.take() {
            let _ = c.bye();
        }
        self.up.store(false, Ordering::Release);
    }
}

fn renew_after(ttl_ms: u32) -> Duration {
    Duration::from_millis(u64::from((ttl_ms / RENEW_AT_DIVISOR).max(50)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasebox_proto::{ErrorBody, LeaseInfo};

    fn err(code: ErrorCode) -> Result<Response, ClientError> {
        Err(ClientError::Server(ErrorBody { code, detail: [0; 3], message: String::new() }))
    }

    fn info(state: LeaseState) -> Result<Response, ClientError> {
        Ok(Response::Query(LeaseInfo {
            lease: LeaseId { slot: 1, generation: 1 },
            state,
            access: 3,
            mtu: 5,
            size: 4096,
            rkey: 1,
            server_qpn: 2,
            client_qpn: 3,
            ttl_left_ms: 0,
            tenant: "demo".into(),
        }))
    }

    #[test]
    fn a_vanished_lease_is_reported_with_what_query_says() {
        assert_eq!(seen(&info(LeaseState::Active)), Seen::Alive);
        assert_eq!(seen(&info(LeaseState::Fencing)), Seen::Going);
        assert_eq!(seen(&info(LeaseState::PendingDestroy)), Seen::Gone(Outcome::TornDown));
        assert_eq!(seen(&info(LeaseState::Fenced)), Seen::Gone(Outcome::Fenced));
        assert_eq!(seen(&err(ErrorCode::NotFound)), Seen::Gone(Outcome::NotFound));
        assert_eq!(seen(&err(ErrorCode::BadParam)), Seen::Alive);
    }

    #[test]
    fn a_revoke_in_its_immediate_phase_is_waited_for() {
        let mut answers = vec![info(LeaseState::PendingDestroy), info(LeaseState::Fencing), info(LeaseState::Fencing)];
        assert_eq!(settle(|| answers.pop().unwrap_or_else(|| err(ErrorCode::Internal))), Some(Outcome::TornDown));
        assert_eq!(settle(|| info(LeaseState::Active)), None);
        // Never decided: after the revoke deadline the slot is fenced.
        let t = Instant::now();
        assert_eq!(settle(|| info(LeaseState::Fencing)), Some(Outcome::Fenced));
        assert!(t.elapsed() >= SETTLE);
    }

    #[test]
    fn only_harmless_requests_are_repeated_after_a_break() {
        assert!(idempotent(&Request::Heartbeat { echo: 1 }));
        assert!(idempotent(&Request::Free { lease: LeaseId { slot: 1, generation: 1 } }));
        assert!(!idempotent(&Request::Revoke { lease: LeaseId { slot: 1, generation: 1 }, qp_first: false }));
        assert!(idempotent(&Request::Stats));
    }

    #[test]
    fn renewals_come_at_half_the_ttl() {
        assert_eq!(renew_after(60_000), Duration::from_secs(30));
        assert_eq!(renew_after(10), Duration::from_millis(50));
    }
}
