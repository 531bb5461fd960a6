//! The high-level client the C and Python bindings wrap: [`Client`] (connect, heartbeats on a thread of its own,
//! reconnect, events) and [`Lease`] (ALLOC → the requester's QP to RTS → READY → `write`/`read` and their batched
//! variants → FREE, also on drop).
//!
//! Interim: issue 16 (item 4) gives `leasebox-client` its own `Client` and `Lease`; until they land, this crate
//! builds the same names over what `leasebox-client` has today — the control [`Connection`]
//! (app/client/src/connection.rs) and the software RoCEv2 requester [`SoftRoce`] (app/client/src/rdma/soft.rs),
//! in the order `leasectl verify` uses them (app/leasectl/src/verify.rs, `open_lease`). The bindings import only
//! the names below, so moving them to `leasebox-client`'s own types changes their `use` lines, not their code.
//!
//! The protocol has no server-to-client notices yet (issue 16, item 2): a revoke is learned when an RDMA
//! operation fails, and then confirmed with QUERY, so the call that failed reports [`ErrorKind::Revoked`] and
//! every later call on that lease fails the same way without touching the network.
#![forbid(unsafe_code)]

use leasebox_client::rdma::{Completion, QpEndpoint, Requester, SoftConfig, SoftRoce, WcOpcode, WcStatus, mtu_enum};
use leasebox_client::{ClientError, Connection, Credentials, Timeouts};
use leasebox_proto::{AllocReq, ErrorCode, LeaseId, LeaseState, Request, Response, access, mtu_bytes};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The RoCEv2 UDP port: where the appliance's (the device model's) responder listens by default.
pub const DEFAULT_RDMA_PEER: &str = "127.0.0.1:4791";
/// The largest piece one RDMA WRITE or READ work request carries; larger transfers are split.
const CHUNK: usize = 1 << 20;
/// Work requests kept in flight (below the requester's `RcConfig::max_wr`, 16 by default).
const WINDOW: usize = 15;
/// Heartbeat period when the server's welcome says nothing usable (`heartbeat_ms` 0).
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(3);

/// What kind of failure an [`Error`] is; the C ABI's error codes and the Python exception classes map from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A bad argument: out-of-bounds offset, empty appliance list, malformed key, zero size.
    InvalidArgument,
    /// The control connection could not be made or broke.
    Connection,
    /// No answer (or no RDMA completion) within the deadline.
    Timeout,
    /// The appliance refused the credentials, or its answer did not authenticate.
    Auth,
    /// The appliance had no memory for the lease (on every appliance tried).
    NoMemory,
    /// The appliance answered with another error (the message names its code).
    Server,
    /// The lease was revoked (or fenced, or is gone) at the appliance: stop using it.
    Revoked,
    /// The lease was freed by this client.
    Freed,
    /// An RDMA operation failed for another reason (the message names the completion status).
    Rdma,
    /// The appliance sent something the protocol does not allow.
    Protocol,
    /// The client was closed.
    Closed,
}

impl ErrorKind {
    /// A short upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            ErrorKind::Connection => "CONNECTION",
            ErrorKind::Timeout => "TIMEOUT",
            ErrorKind::Auth => "AUTH",
            ErrorKind::NoMemory => "NO_MEMORY",
            ErrorKind::Server => "SERVER",
            ErrorKind::Revoked => "REVOKED",
            ErrorKind::Freed => "FREED",
            ErrorKind::Rdma => "RDMA",
            ErrorKind::Protocol => "PROTOCOL",
            ErrorKind::Closed => "CLOSED",
        }
    }
}

/// A failed call: its kind and a message for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// `e` from the control connection, with what was being done.
    fn control(what: &str, e: ClientError) -> Error {
        let kind = match &e {
            ClientError::Io(_) => ErrorKind::Connection,
            ClientError::Timeout { .. } => ErrorKind::Timeout,
            ClientError::Protocol(_) => ErrorKind::Protocol,
            ClientError::ServerProof => ErrorKind::Auth,
            ClientError::Usage(_) => ErrorKind::InvalidArgument,
            ClientError::Server(b) => match b.code {
                ErrorCode::AuthFailed | ErrorCode::NotAuthenticated => ErrorKind::Auth,
                ErrorCode::NoMemory => ErrorKind::NoMemory,
                ErrorCode::Timeout => ErrorKind::Connection,
                _ => ErrorKind::Server,
            },
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Where the appliances are and who we are.
#[derive(Clone, Debug)]
pub struct Config {
    /// Control addresses (`HOST:PORT`), tried in order: leases go to the first that has memory.
    pub appliances: Vec<String>,
    pub credentials: Credentials,
    /// The appliance's RoCEv2 responder (the device model's UDP socket), [`DEFAULT_RDMA_PEER`] by default.
    pub rdma_peer: SocketAddr,
    pub timeouts: Timeouts,
    /// Whether a background thread sends HEARTBEATs (and reconnects when the connection broke).
    pub heartbeats: bool,
}

impl Config {
    /// One appliance, tenant `name` with its key in hex.
    pub fn new(addr: &str, name: &str, key_hex: &str) -> Result<Config> {
        let key = leasebox_client::hex::decode(key_hex).map_err(|e| Error::invalid(format!("key: {e}")))?;
        if key.is_empty() {
            return Err(Error::invalid("key: empty"));
        }
        Ok(Config {
            appliances: vec![addr.to_string()],
            credentials: Credentials { name: name.to_string(), key },
            rdma_peer: DEFAULT_RDMA_PEER.parse().expect("a valid socket address"),
            timeouts: Timeouts {
                connect: Duration::from_secs(3),
                receive: Duration::from_secs(10),
                retry_for: Duration::from_secs(10),
            },
            heartbeats: true,
        })
    }
}

/// Options of one ALLOC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocOptions {
    /// Lease lifetime in ms; 0 = the appliance's default.
    pub ttl_ms: u32,
}

/// What happened to the client or a lease, in the order it was noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The control connection broke and a new session took its place.
    Reconnected { session_id: u64 },
    /// The control connection broke and could not be made again (the next call tries again).
    Disconnected { reason: String },
    /// A lease was found revoked (or fenced, or gone) at the appliance.
    Revoked { lease: u64, reason: String },
}

/// A lease id as one number: slot in the high 32 bits, generation in the low 32.
pub fn lease_number(id: LeaseId) -> u64 {
    (u64::from(id.slot) << 32) | u64::from(id.generation)
}

/// The [`LeaseId`] of [`lease_number`]'s number.
pub fn lease_id(n: u64) -> LeaseId {
    LeaseId { slot: (n >> 32) as u32, generation: n as u32 }
}

struct Control {
    conn: Option<Connection>,
    /// Index in `Config::appliances` of the connection's appliance.
    appliance: usize,
    session_id: u64,
    heartbeat: Duration,
}

struct Shared {
    config: Config,
    control: Mutex<Control>,
    events: Mutex<VecDeque<Event>>,
    event_ready: Condvar,
    stop: Mutex<bool>,
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a lock was held left plain data behind; the state machines here stay consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn push(&self, e: Event) {
        lock(&self.events).push_back(e);
        self.event_ready.notify_all();
    }

    /// A fresh authenticated connection to the first appliance (from `first`, wrapping) that answers.
    fn open(&self, first: usize) -> Result<(Connection, usize, u64, Duration)> {
        let n = self.config.appliances.len();
        let mut last = None;
        for k in 0..n {
            let i = (first + k) % n;
            let addr = &self.config.appliances[i];
            match Connection::connect_and_hello(addr, &self.config.credentials, self.config.timeouts) {
                Ok((c, w)) => {
                    let hb = if w.heartbeat_ms == 0 {
                        DEFAULT_HEARTBEAT
                    } else {
                        Duration::from_millis(u64::from(w.heartbeat_ms) / 3).max(Duration::from_millis(10))
                    };
                    return Ok((c, i, w.session_id, hb));
                }
                Err(e) => last = Some(Error::control(&format!("connecting to {addr}"), e)),
            }
        }
        Err(last.unwrap_or_else(|| Error::invalid("no appliance address given")))
    }

    /// Replaces the control connection with a fresh one (the old one is dropped: no BYE, so its leases stay
    /// the appliance's business until its session times out).
    fn reconnect(&self, c: &mut Control) -> Result<u64> {
        c.conn = None;
        let (conn, i, sid, hb) = self.open(c.appliance)?;
        *c = Control { conn: Some(conn), appliance: i, session_id: sid, heartbeat: hb };
        Ok(sid)
    }

    /// One request on the control connection; a broken connection is made again once and the request retried
    /// (requests here are idempotent or fail harmlessly on a new session).
    fn call(&self, what: &str, req: &Request) -> Result<Response> {
        let mut c = lock(&self.control);
        if *lock(&self.stop) && c.conn.is_none() {
            return Err(Error::new(ErrorKind::Closed, format!("{what}: the client is closed")));
        }
        if c.conn.is_none() {
            let sid = self.reconnect(&mut c)?;
            self.push(Event::Reconnected { session_id: sid });
        }
        let conn = c.conn.as_mut().expect("connected above");
        match conn.call(req) {
            Ok(r) => Ok(r),
            Err(e @ (ClientError::Io(_) | ClientError::Timeout { .. })) => {
                let first = Error::control(what, e);
                match self.reconnect(&mut c) {
                    Ok(sid) => {
                        self.push(Event::Reconnected { session_id: sid });
                        let conn = c.conn.as_mut().expect("reconnected");
                        conn.call(req).map_err(|e| Error::control(what, e))
                    }
                    Err(_) => Err(first),
                }
            }
            Err(e) => Err(Error::control(what, e)),
        }
    }

    /// The heartbeat thread: a HEARTBEAT every `heartbeat_ms / 3`; a broken connection is made again.
    fn heartbeats(self: Arc<Shared>) {
        let mut echo = 1u64;
        loop {
            let period = lock(&self.control).heartbeat;
            {
                let stop = lock(&self.stop);
                let (stop, _) = self.wake.wait_timeout_while(stop, period, |s| !*s).unwrap_or_else(|p| p.into_inner());
                if *stop {
                    return;
                }
            }
            echo += 1;
            let mut c = lock(&self.control);
            let ok = match c.conn.as_mut() {
                Some(conn) => conn.call(&Request::Heartbeat { echo }).is_ok(),
                None => false,
            };
            if !ok {
                match self.reconnect(&mut c) {
                    Ok(sid) => self.push(Event::Reconnected { session_id: sid }),
                    Err(e) => self.push(Event::Disconnected { reason: e.message }),
                }
            }
        }
    }
}

/// A client of one or more appliances.
pub struct Client {
    shared: Arc<Shared>,
    heartbeat: Option<JoinHandle<()>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("appliances", &self.shared.config.appliances).finish_non_exhaustive()
    }
}

impl Client {
    /// Connects and authenticates to the first appliance of `config` that answers.
    pub fn connect(config: Config) -> Result<Client> {
        if config.appliances.is_empty() {
            return Err(Error::invalid("no appliance address given"));
        }
        let shared = Arc::new(Shared {
            config,
            control: Mutex::new(Control { conn: None, appliance: 0, session_id: 0, heartbeat: DEFAULT_HEARTBEAT }),
            events: Mutex::new(VecDeque::new()),
            event_ready: Condvar::new(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        {
            let mut c = lock(&shared.control);
            let (conn, i, sid, hb) = shared.open(0)?;
            *c = Control { conn: Some(conn), appliance: i, session_id: sid, heartbeat: hb };
        }
        let heartbeat = if shared.config.heartbeats {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name("leasebox-heartbeat".into())
                .spawn(move || s.heartbeats())
                .map_err(|e| Error::new(ErrorKind::Connection, format!("starting the heartbeat thread: {e}")))?;
            Some(h)
        } else {
            None
        };
        Ok(Client { shared, heartbeat })
    }

    /// The current session's id (it changes on reconnect).
    pub fn session_id(&self) -> u64 {
        lock(&self.shared.control).session_id
    }

    /// The control address of the appliance the client is connected to.
    pub fn appliance(&self) -> String {
        let c = lock(&self.shared.control);
        self.shared.config.appliances[c.appliance].clone()
    }

    /// Drops the control connection and opens a new session; returns its id.
    pub fn reconnect(&self) -> Result<u64> {
        let mut c = lock(&self.shared.control);
        let sid = self.shared.reconnect(&mut c)?;
        drop(c);
        self.shared.push(Event::Reconnected { session_id: sid });
        Ok(sid)
    }

    /// One HEARTBEAT round trip; returns the appliance's uptime in ms.
    pub fn ping(&self) -> Result<u64> {
        match self.shared.call("HEARTBEAT", &Request::Heartbeat { echo: 7 })? {
            Response::Heartbeat { uptime_ms, .. } => Ok(uptime_ms),
            other => Err(Error::new(ErrorKind::Protocol, format!("HEARTBEAT answered {other:?}"))),
        }
    }

    /// The next event, waiting up to `wait` (zero: only what is already there).
    pub fn next_event(&self, wait: Duration) -> Option<Event> {
        let deadline = Instant::now() + wait;
        let mut q = lock(&self.shared.events);
        loop {
            if let Some(e) = q.pop_front() {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self.shared.event_ready.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Allocates a lease of `size` bytes and makes it ready for RDMA: ALLOC with a fresh requester QP, the
    /// QP to RTS, READY.
    pub fn alloc(&self, size: u64, options: AllocOptions) -> Result<Lease> {
        if size == 0 {
            return Err(Error::invalid("size must be at least 1 byte"));
        }
        let soft = SoftConfig { peer: self.shared.config.rdma_peer, ..SoftConfig::default() };
        let r = SoftRoce::new(soft)
            .map_err(|e| Error::new(ErrorKind::Rdma, format!("opening the RDMA requester's socket: {e}")))?;
        let me: QpEndpoint = r.local();
        let mtu = mtu_enum(me.mtu).ok_or_else(|| Error::new(ErrorKind::Rdma, "requester MTU is not an IB MTU"))?;
        let req = AllocReq {
            size,
            access: access::REMOTE_READ | access::REMOTE_WRITE,
            mtu,
            ttl_ms: options.ttl_ms,
            client_qpn: me.qpn,
            client_psn: me.psn,
            client_gid: me.gid,
            client_mac: me.mac,
        };
        let a = match self.shared.call("ALLOC", &Request::Alloc(req))? {
            Response::Alloc(a) => a,
            other => return Err(Error::new(ErrorKind::Protocol, format!("ALLOC answered {other:?}"))),
        };
        // From here on the lease exists: a failure frees it before returning.
        let lease = Lease {
            shared: self.shared.clone(),
            id: a.lease,
            remote_addr: a.remote_addr,
            rkey: a.rkey,
            length: a.length,
            rdma: Mutex::new(Rdma { req: r, next_wr: 1, gone: None }),
        };
        let mtu =
            mtu_bytes(a.mtu).ok_or_else(|| Error::new(ErrorKind::Protocol, format!("ALLOC MTU code {}", a.mtu)))?;
        let remote = QpEndpoint { qpn: a.server_qpn, psn: a.server_psn, gid: a.server_gid, mac: a.server_mac, mtu };
        lock(&lease.rdma)
            .req
            .connect(&remote)
            .map_err(|e| Error::new(ErrorKind::Rdma, format!("requester QP to RTS: {e}")))?;
        let ready = Request::Ready { lease: a.lease, client_qpn: me.qpn, server_qpn: a.server_qpn };
        match self.shared.call("READY", &ready)? {
            Response::Ready { state: LeaseState::Active } => Ok(lease),
            other => Err(Error::new(ErrorKind::Protocol, format!("READY answered {other:?}"))),
        }
    }

    /// REVOKE a lease by number (admin sessions only; a tenant gets a server error).
    pub fn revoke(&self, lease: u64) -> Result<()> {
        match self.shared.call("REVOKE", &Request::Revoke { lease: lease_id(lease), qp_first: false })? {
            Response::Revoke { .. } => Ok(()),
            other => Err(Error::new(ErrorKind::Protocol, format!("REVOKE answered {other:?}"))),
        }
    }

    /// Says BYE and stops the heartbeat thread. Leases still held stay usable for RDMA until the appliance
    /// notices the session is gone; freeing them needs the client, so free them first.
    pub fn close(mut self) -> Result<()> {
        self.stop();
        let conn = lock(&self.shared.control).conn.take();
        match conn {
            Some(c) => c.bye().map_err(|e| Error::control("BYE", e)),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Rdma {
    req: SoftRoce,
    next_wr: u64,
    /// Why the lease may no longer be used (revoked, freed).
    gone: Option<Error>,
}

/// One piece of a batch.
pub enum Xfer<'a> {
    Write { offset: u64, data: &'a [u8] },
    Read { offset: u64, buf: &'a mut [u8] },
}

/// A lease: `length` bytes of appliance memory, reached by RDMA through a QP of its own.
pub struct Lease {
    shared: Arc<Shared>,
    id: LeaseId,
    remote_addr: u64,
    rkey: u32,
    length: u64,
    rdma: Mutex<Rdma>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).field("length", &self.length).finish_non_exhaustive()
    }
}

impl Lease {
    /// The lease id as one number ([`lease_number`]).
    pub fn id(&self) -> u64 {
        lease_number(self.id)
    }

    /// Bytes granted (at least what was asked for).
    pub fn len(&self) -> u64 {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Writes `data` at `offset`; returns when the appliance has acknowledged every byte.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.batch(&mut [Xfer::Write { offset, data }])
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.batch(&mut [Xfer::Read { offset, buf }])
    }

    /// Several writes, pipelined; returns when all are acknowledged.
    pub fn write_batch(&self, ops: &[(u64, &[u8])]) -> Result<()> {
        let mut x: Vec<Xfer<'_>> = ops.iter().map(|&(offset, data)| Xfer::Write { offset, data }).collect();
        self.batch(&mut x)
    }

    /// Several reads, pipelined.
    pub fn read_batch(&self, ops: &mut [(u64, &mut [u8])]) -> Result<()> {
        let mut x: Vec<Xfer<'_>> = ops.iter_mut().map(|(offset, buf)| Xfer::Read { offset: *offset, buf }).collect();
        self.batch(&mut x)
    }

    /// Writes and reads in one pipeline, in posting order (a read after a write to the same bytes sees it: RC
    /// executes a QP's requests in order).
    pub fn batch(&self, ops: &mut [Xfer<'_>]) -> Result<()> {
        for op in ops.iter() {
            let (offset, len) = match op {
                Xfer::Write { offset, data } => (*offset, data.len()),
                Xfer::Read { offset, buf } => (*offset, buf.len()),
            };
            if offset.checked_add(len as u64).is_none_or(|end| end > self.length) {
                return Err(Error::invalid(format!(
                    "{len} bytes at offset {offset} do not fit in the lease's {} bytes",
                    self.length
                )));
            }
        }
        let mut r = lock(&self.rdma);
        if let Some(e) = &r.gone {
            return Err(e.clone());
        }
        // The work requests: (op index, offset within the op, length).
        let mut pieces = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let len = match op {
                Xfer::Write { data, .. } => data.len(),
                Xfer::Read { buf, .. } => buf.len(),
            };
            let mut at = 0;
            while at < len {
                let n = (len - at).min(CHUNK);
                pieces.push((i, at, n));
                at += n;
            }
        }
        let patience = self.shared.config.timeouts.receive;
        let mut pending: HashMap<u64, (usize, usize, usize)> = HashMap::new();
        let mut next = 0;
        let mut last_progress = Instant::now();
        while next < pieces.len() || !pending.is_empty() {
            while next < pieces.len() && pending.len() < WINDOW {
                let (i, at, n) = pieces[next];
                let wr = r.next_wr;
                r.next_wr += 1;
                let posted = match &ops[i] {
                    Xfer::Write { offset, data } => {
                        r.req.post_write(wr, self.remote_addr + offset + at as u64, self.rkey, &data[at..at + n])
                    }
                    Xfer::Read { offset, .. } => {
                        r.req.post_read(wr, self.remote_addr + offset + at as u64, self.rkey, n as u32)
                    }
                };
                if let Err(e) = posted {
                    drop(r);
                    return Err(self.failed(format!("posting work request: {e}")));
                }
                pending.insert(wr, (i, at, n));
                next += 1;
            }
            let done: Vec<Completion> = r.req.poll(Duration::from_millis(5));
            if done.is_empty() && last_progress.elapsed() > patience {
                drop(r);
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no RDMA completion within {:.1} s", patience.as_secs_f64()),
                ));
            }
            for c in done {
                last_progress = Instant::now();
                let Some((i, at, n)) = pending.remove(&c.wr_id) else { continue };
                if c.status != WcStatus::Success {
                    drop(r);
                    return Err(self.failed(format!("RDMA {} completed with {:?}", opname(c.opcode), c.status)));
                }
                if let Xfer::Read { buf, .. } = &mut ops[i] {
                    match r.req.read_data(c.wr_id) {
                        Some(d) if d.len() == n => buf[at..at + n].copy_from_slice(&d),
                        other => {
                            let got = other.map_or(0, |d| d.len());
                            return Err(Error::new(ErrorKind::Rdma, format!("RDMA READ returned {got} of {n} bytes")));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// An RDMA failure: asks the appliance what became of the lease, and remembers a revoke.
    fn failed(&self, what: String) -> Error {
        let state = self.shared.call("QUERY", &Request::Query { lease: self.id });
        let gone = match state {
            Ok(Response::Query(info)) if info.state == LeaseState::Active => None,
            Ok(Response::Query(info)) => {
                Some(format!("lease {:#x} is {} at the appliance", self.id(), info.state.name()))
            }
            Err(e) if e.message.contains("NOT_FOUND") || e.message.contains("STALE") => {
                Some(format!("lease {:#x} no longer exists at the appliance", self.id()))
            }
            _ => None,
        };
        match gone {
            Some(why) => {
                let e = Error::new(ErrorKind::Revoked, format!("lease revoked: {why} ({what})"));
                lock(&self.rdma).gone = Some(e.clone());
                self.shared.push(Event::Revoked { lease: self.id(), reason: why });
                e
            }
            None => Error::new(ErrorKind::Rdma, what),
        }
    }

    /// Whether the lease is known revoked or freed (the error later calls get), without asking the appliance.
    pub fn status(&self) -> Option<Error> {
        lock(&self.rdma).gone.clone()
    }

    /// Gives the memory back (FREE). Later calls fail with [`ErrorKind::Freed`].
    pub fn free(&self) -> Result<()> {
        {
            let mut r = lock(&self.rdma);
            match &r.gone {
                Some(e) if e.kind == ErrorKind::Freed => return Ok(()),
                Some(_) => {
                    // Revoked: the appliance already took it back.
                    r.gone = Some(Error::new(ErrorKind::Freed, format!("lease {:#x} was freed", self.id())));
                    return Ok(());
                }
                None => r.gone = Some(Error::new(ErrorKind::Freed, format!("lease {:#x} was freed", self.id()))),
            }
        }
        match self.shared.call("FREE", &Request::Free { lease: self.id }) {
            Ok(Response::Free { .. }) => Ok(()),
            Ok(other) => Err(Error::new(ErrorKind::Protocol, format!("FREE answered {other:?}"))),
            Err(e) if e.message.contains("NOT_FOUND") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if lock(&self.rdma).gone.is_none() {
            // Best effort: a closed client answers at once with an error, which drop cannot report.
            let _ = self.free();
        }
    }
}

fn opname(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::RdmaWrite => "WRITE",
        WcOpcode::RdmaRead => "READ",
    }
}
