//! One appliance's connection thread: it owns the control [`Connection`], sends HEARTBEATs every
//! `heartbeat_ms / 3` (the appliance closes a session silent for `heartbeat_ms`), renews the leases it tracks
//! before their TTL runs out, reconnects when the connection breaks, and runs the callers' requests, which
//! reach it through a channel ([`Cmd`]) and are answered through a one-shot channel each.
//!
//! Requests run one at a time on the socket, so every answer is matched to its request id by
//! [`Connection::call`]; the credits the appliance grants are never in question.
//!
//! While no request is running, the thread waits on its channel alone, until its next timer. The appliance's
//! notices reach it through that channel too: a watcher thread per connection ([`watch`]) waits for the socket to
//! become readable (std cannot wait on a socket and a channel at once) and says so ([`Cmd::Readable`]); the
//! connection thread then reads what came ([`Worker::take_notices`]) and lets the watcher wait again. So a
//! notice becomes an [`Event`] at once, a caller's request starts at once, and an idle connection makes no system
//! call between its timers. After a reconnect the new session RESUMEs the old one with its token, so the leases
//! move over at once ([`Worker::reconnect`]).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_proto::{ErrorCode, LeaseId, LeaseState, Notice, Outcome, Request, Response};

use crate::connection::{Client as Connection, ClientError, Credentials, Timeouts, Welcome};
use crate::error::{Error, from_client};
use crate::event::{Event, Sink};

/// First pause before a reconnect attempt; it doubles after each failure up to [`RECONNECT_MAX`], which is
/// the connection's own retry pause: an appliance coming (back) up is reached within about that of listening,
/// however long it was down, and a down appliance costs an attempt every 50 ms, not a spin.
const RECONNECT_MIN: Duration = Duration::from_millis(20);
const RECONNECT_MAX: Duration = crate::connection::RETRY_PAUSE;
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

/// A lease to keep alive (RENEW before `ttl_ms` runs out) and to report when it vanishes.
pub(crate) struct Track {
    pub(crate) lease: LeaseId,
    pub(crate) ttl_ms: u32,
    pub(crate) shared: Arc<LeaseShared>,
}

/// What callers ask of the connection thread.
pub(crate) enum Cmd {
    /// Run a request; the answer goes back on `reply`. With `track`, a successful answer starts tracking that
    /// lease before the caller hears of it (READY: a notice about the lease that comes right after the answer
    /// then finds it tracked).
    Call {
        req: Request,
        track: Option<Track>,
        reply: Sender<Result<Response, Error>>,
    },
    /// Stop tracking (the program freed it).
    Forget {
        lease: LeaseId,
    },
    /// FREE without anyone waiting for the answer (a lease dropped unfreed).
    FreeLater {
        lease: LeaseId,
    },
    /// The watcher of connection number `conn` saw bytes (or the end) on its socket.
    Readable {
        conn: u64,
    },
    Shutdown,
}

/// The connection thread's side of a connection's watcher thread.
struct Watch {
    /// Which connection it watches ([`Cmd::Readable`]'s `conn`): a late word about an earlier one is ignored.
    conn: u64,
    /// Lets the watcher wait again once what it saw has been read.
    rearm: SyncSender<()>,
    /// The watcher's socket handle: shut down when the connection is left, which ends its wait.
    stream: TcpStream,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The watcher thread of connection number `conn`: waits until its socket has bytes or has ended, tells the
/// connection thread, and waits to be let go again. Ends when its connection is left (the socket shut down, the
/// [`Watch`] dropped) or the connection thread is gone.
fn watch(stream: TcpStream, conn: u64, tx: Sender<Cmd>, rearm: Receiver<()>) {
    let mut b = [0u8; 1];
    loop {
        match stream.peek(&mut b) {
            // Bytes, or the end of the stream (0): the connection thread reads them and finds out which.
            Ok(n) => {
                if tx.send(Cmd::Readable { conn }).is_err() || n == 0 || rearm.recv().is_err() {
                    return;
                }
            }
            // A read timeout the connection thread set for a call of its own (it parks the socket again after).
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => {
                let _ = tx.send(Cmd::Readable { conn });
                return;
            }
        }
    }
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
    /// Until when the appliance said it is draining (DRAIN notice): placement tries it last meanwhile.
    draining_until: Arc<Mutex<Option<Instant>>>,
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
        let draining_until = Arc::new(Mutex::new(None));
        let now = Instant::now();
        let mut w = Worker {
            appliance: appliance.clone(),
            who,
            timeouts,
            heartbeat_every: conn.as_ref().map_or(Duration::from_secs(1), heartbeat_period),
            welcome: conn.as_ref().and_then(|c| c.welcome().cloned()),
            conn,
            next_heartbeat: now,
            reconnect_at: now,
            backoff: RECONNECT_MIN,
            leases: HashMap::new(),
            pending_frees: Vec::new(),
            sink,
            up: up.clone(),
            draining_until: draining_until.clone(),
            tx: tx.clone(),
            watch: None,
            conns: 0,
        };
        w.next_heartbeat = now + w.heartbeat_every;
        w.start_watch();
        let done = ended.clone();
        let join = std::thread::Builder::new()
            .name(format!("leasebox {appliance}"))
            .spawn(move || {
                w.run(rx);
                done.store(true, Ordering::Release);
            })
            .map_err(|e| Error::Config(format!("starting the connection thread: {e}")))?;
        Ok(Session { appliance, tx, join: Mutex::new(Some(join)), ended, up, draining_until })
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Whether the appliance announced a drain that has not ended yet.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining_until.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| Instant::now() < t)
    }

    /// Runs `req` on the connection thread; waits at most `wait` for its answer.
    pub(crate) fn call(&self, req: Request, wait: Duration) -> Result<Response, Error> {
        self.call_tracking(req, None, wait)
    }

    /// [`Session::call`], tracking `track`'s lease from a successful answer on.
    pub(crate) fn call_tracking(&self, req: Request, track: Option<Track>, wait: Duration) -> Result<Response, Error> {
        if self.ended.load(Ordering::Acquire) {
            return Err(Error::Closed("the client was dropped"));
        }
        let (reply, answer) = mpsc::channel();
        self.send(Cmd::Call { req, track, reply })?;
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
            | Request::HcaStats
            | Request::FencedSummary { .. }
            | Request::LeaseLog { .. }
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
    /// The last session's Welcome: its id and resume token for RESUME, its boot id to tell a reboot.
    welcome: Option<Welcome>,
    heartbeat_every: Duration,
    next_heartbeat: Instant,
    reconnect_at: Instant,
    backoff: Duration,
    leases: HashMap<LeaseId, Tracked>,
    /// FREEs that found the connection down, sent again after the next reconnect.
    pending_frees: Vec<LeaseId>,
    sink: Arc<Sink>,
    up: Arc<AtomicBool>,
    draining_until: Arc<Mutex<Option<Instant>>>,
    /// The thread's own channel, for the watchers to write to.
    tx: Sender<Cmd>,
    /// The current connection's watcher.
    watch: Option<Watch>,
    /// Connections made so far (numbers the watchers).
    conns: u64,
}

impl Worker {
    fn run(&mut self, rx: Receiver<Cmd>) {
        loop {
            let now = Instant::now();
            let wake = match self.conn {
                Some(_) => self.leases.values().map(|t| t.renew_at).fold(self.next_heartbeat, Instant::min),
                None => self.reconnect_at,
            };
            // Callers, the watcher and the timers all come through the channel: nothing else to poll.
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Cmd::Shutdown) | Err(RecvTimeoutError::Disconnected) => return self.shutdown(),
                Ok(cmd) => self.handle(cmd),
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.tick();
            // The calls above set read timeouts of their own; the watcher's peek must block again.
            if let Some(c) = self.conn.as_ref()
                && c.park().is_err()
            {
                self.lost("the socket failed".into());
            }
        }
    }

    /// Starts the watcher of the current connection (none without one, or if the socket cannot be shared:
    /// then notices are read only along with answers and the heartbeats, as a fallback).
    fn start_watch(&mut self) {
        self.watch = None;
        let Some(c) = self.conn.as_ref() else { return };
        let (Ok(theirs), Ok(mine)) = (c.watch_handle(), c.watch_handle()) else { return };
        self.conns += 1;
        let conn = self.conns;
        let (rearm, rearmed) = mpsc::sync_channel(1);
        let tx = self.tx.clone();
        let started = std::thread::Builder::new()
            .name(format!("leasebox watch {}", self.appliance))
            .spawn(move || watch(theirs, conn, tx, rearmed));
        if started.is_ok() {
            self.watch = Some(Watch { conn, rearm, stream: mine });
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Call { req, track, reply } => {
                let r = self.call(&req).map_err(|e| from_client(&self.appliance, e));
                if let (Ok(_), Some(Track { lease, ttl_ms, shared })) = (&r, track) {
                    let renew_at = Instant::now() + renew_after(ttl_ms);
                    self.leases.insert(lease, Tracked { ttl_ms, renew_at, shared });
                }
                let _ = reply.send(r);
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
            Cmd::Readable { conn } => {
                if self.watch.as_ref().is_some_and(|w| w.conn == conn) {
                    // What came: notices, or the end of the connection.
                    self.drain_notices();
                    if let Some(w) = self.watch.as_ref() {
                        let _ = w.rearm.try_send(());
                    }
                }
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
        // Notices that came in with answers.
        self.take_notices(Duration::ZERO);
    }

    /// The appliance's notices (docs/wire-protocol.md): those queued while answers were awaited, and, with
    /// `wait` > 0, what comes within `wait` while no request is outstanding; each becomes an [`Event`]. Notices go
    /// to every session of the tenant, so only leases this client tracks count.
    fn take_notices(&mut self, wait: Duration) {
        let Some(c) = self.conn.as_mut() else { return };
        let mut notices = c.take_notices();
        if notices.is_empty() && !wait.is_zero() {
            match c.wait_notices(wait) {
                Ok(n) => notices = n,
                Err(e) if breaks_connection(&e) => return self.lost(e.to_string()),
                // Anything else from the server while idle is not ours to answer; the next call will tell.
                Err(_) => {}
            }
        }
        for n in notices {
            self.notice(n);
        }
    }

    /// The watcher saw bytes: read what is there without waiting (a call may have taken them already) and turn
    /// the notices among them into events; the end of the connection is found here.
    fn drain_notices(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        match c.drain_notices() {
            Ok(notices) => {
                for n in notices {
                    self.notice(n);
                }
            }
            Err(e) => self.lost(e.to_string()),
        }
    }

    fn notice(&mut self, n: Notice) {
        let appliance = self.appliance.clone();
        match n {
            Notice::Revoked { lease, outcome } => self.vanished(lease, outcome),
            Notice::Fenced { lease } => {
                if let Some(t) = self.leases.remove(&lease)
                    && t.shared.mark_revoked(Outcome::Fenced)
                {
                    self.sink.emit(Event::Fenced { appliance, lease });
                }
            }
            Notice::Expiring { lease, in_ms } => {
                if let Some(t) = self.leases.get_mut(&lease) {
                    // Renew now: a RENEW lost or refused earlier must not let it run out.
                    t.renew_at = Instant::now();
                    self.sink.emit(Event::Expiring { appliance, lease, in_ms });
                }
            }
            Notice::Draining { in_ms } => {
                let until = Instant::now() + Duration::from_millis(u64::from(in_ms));
                *self.draining_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
                self.sink.emit(Event::Draining { appliance, in_ms });
            }
        }
    }

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
        self.watch = None;
        if self.conn.take().is_some() {
            self.up.store(false, Ordering::Release);
            self.reconnect_at = Instant::now();
            self.backoff = RECONNECT_MIN;
            self.sink.emit(Event::Disconnected { appliance: self.appliance.clone(), reason });
        }
    }

    /// One connect + HELLO attempt (bounded by [`RECONNECT_ATTEMPT`]); on failure the next waits longer.
    ///
    /// On the same boot, the new session first RESUMEs the old one with its token (docs/wire-protocol.md), so its
    /// leases move over at once, before the old session would time out. A new boot id means the appliance
    /// rebooted: every lease of the old boot is gone. Either way every tracked lease is renewed at once, which
    /// finds out any that did not survive.
    fn reconnect(&mut self) {
        let t = Timeouts {
            connect: self.timeouts.connect.min(RECONNECT_ATTEMPT),
            receive: self.timeouts.receive.min(RECONNECT_ATTEMPT),
            retry_for: RECONNECT_ATTEMPT,
        };
        let (mut c, welcome) = match Connection::connect_and_hello(&self.appliance, &self.who, t) {
            Ok(x) => x,
            Err(_) => {
                self.reconnect_at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(RECONNECT_MAX);
                return;
            }
        };
        let rebooted = self.welcome.as_ref().is_some_and(|w| w.boot_id != welcome.boot_id);
        if let Some(old) = self.welcome.as_ref().filter(|_| !rebooted) {
            // NOT_FOUND (the old session's leases already went, or were taken over): the renewals below tell
            // which leases are left; a broken connection shows at the next call.
            let _ = c.resume(old.session_id, old.resume_token);
        }
        c.set_timeouts(self.timeouts);
        self.heartbeat_every = heartbeat_period(&c);
        self.next_heartbeat = Instant::now() + self.heartbeat_every;
        self.conn = Some(c);
        self.start_watch();
        self.welcome = Some(welcome.clone());
        self.up.store(true, Ordering::Release);
        self.backoff = RECONNECT_MIN;
        self.sink.emit(Event::Reconnected { appliance: self.appliance.clone(), session_id: welcome.session_id });
        if rebooted {
            let gone: Vec<LeaseId> = self.leases.keys().copied().collect();
            for lease in gone {
                self.vanished(lease, Outcome::NotFound);
            }
            // Leases of the old boot: nothing left to free.
            self.pending_frees.clear();
        }
        let now = Instant::now();
        for t in self.leases.values_mut() {
            t.renew_at = now;
        }
        for lease in std::mem::take(&mut self.pending_frees) {
            self.free_or_keep(lease);
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
        // After BYE: dropping the watch shuts the socket down.
        self.watch = None;
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
            lease: LeaseId { boot_id: [0; 16], slot: 1, generation: 1 },
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
        // Wall clock, and it stays: `settle` sleeps between QUERYs and takes no clock; a lower bound cannot fail
        // spuriously (load only makes it later).
        assert!(t.elapsed() >= SETTLE);
    }

    #[test]
    fn only_harmless_requests_are_repeated_after_a_break() {
        assert!(idempotent(&Request::Heartbeat { echo: 1 }));
        assert!(idempotent(&Request::Free { lease: LeaseId { boot_id: [0; 16], slot: 1, generation: 1 } }));
        assert!(!idempotent(&Request::Revoke {
            lease: LeaseId { boot_id: [0; 16], slot: 1, generation: 1 },
            qp_first: false
        }));
        assert!(idempotent(&Request::Stats));
        assert!(idempotent(&Request::LeaseLog { cursor: 3, max: 10 }), "a read: the same cursor reads again");
    }

    #[test]
    fn renewals_come_at_half_the_ttl() {
        assert_eq!(renew_after(60_000), Duration::from_secs(30));
        assert_eq!(renew_after(10), Duration::from_millis(50));
    }
}
