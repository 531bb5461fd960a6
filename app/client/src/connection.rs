//! The control client: TCP connection with deadlines, the v2 HELLO and records (docs/wire-protocol.md,
//! "Protocol v2"), and request/answer calls.
//!
//! QEMU user networking accepts a forwarded TCP connection before the guest listens, then either closes it or
//! holds it while its SYN to the guest is retransmitted (seconds apart); so [`Client::connect_and_hello`] retries
//! the whole connect + HELLO while nothing has come back from the server, until [`Timeouts::retry_for`] has
//! passed. A new connection is opened every [`RETRY_PAUSE`] (50 ms), never less often, while none has been
//! answered: refused, closed or reset ones are replaced, and a silent one is kept (its patience grows: 1 s, 2 s,
//! 4 s … for a slow server) beside up to [`PROBES`] fresh ones of [`PROBE_LIFE`] each, the first to answer
//! taking the session. So a client started before its appliance connects within about 50 ms of the appliance
//! listening (a booting appliance is the common case), and 20 attempts a second is no load.

use leasebox_proto::v2::{self, Announce, Initiator, Transport};
use leasebox_proto::{
    BOOT_ID_LEN, DecodeError, ErrorBody, ErrorCode, FrameBuf, Header, Hello, HelloNoise, HelloReply, Kind, MAX_NAME,
    Next, Notice, Op, RESUME_TOKEN_LEN, Request, Response, Role, STATS_WANT_GUARDS, Stats,
};
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The control port the appliance listens on.
pub const DEFAULT_PORT: u16 = 7470;
/// Protocol versions this client speaks (offered in HELLO as min/max).
pub const VERSION_MIN: u16 = 2;
pub const VERSION_MAX: u16 = 2;
/// Pause between connection attempts: fixed, so the wait after the appliance starts to listen is at most this
/// (plus the connect and HELLO themselves), and never a spin.
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Fresh connections kept beside a silent one, each for [`PROBE_LIFE`] (see the module documentation).
pub const PROBES: usize = 3;
pub const PROBE_LIFE: Duration = Duration::from_millis(250);
/// How often the silent connections are looked at for an answer.
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// A connection whose HELLO is sent, waiting for the server's first byte until `until`.
struct Attempt {
    c: Client,
    init: Initiator,
    id: u32,
    until: Instant,
}

/// What a silent connection has to say now.
enum Heard {
    Nothing,
    Something,
    Gone(ClientError),
}

fn heard(stream: &TcpStream) -> Heard {
    let mut b = [0u8; 1];
    if let Err(e) = stream.set_nonblocking(true) {
        return Heard::Gone(e.into());
    }
    let r = stream.peek(&mut b);
    if let Err(e) = stream.set_nonblocking(false) {
        return Heard::Gone(e.into());
    }
    match r {
        Ok(0) => Heard::Gone(ClientError::Io(io::Error::new(ErrorKind::UnexpectedEof, "closed before HELLO's answer"))),
        Ok(_) => Heard::Something,
        Err(e) if e.kind() == ErrorKind::WouldBlock => Heard::Nothing,
        Err(e) => Heard::Gone(e.into()),
    }
}

/// How long to wait for what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// One TCP connection attempt.
    pub connect: Duration,
    /// One answer, from sending the request to its whole answer frame.
    pub receive: Duration,
    /// Connect + HELLO, all retries included.
    pub retry_for: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(3),
            receive: Duration::from_secs(10),
            retry_for: Duration::from_secs(20),
        }
    }
}

impl Timeouts {
    /// One limit for everything (`leasectl --timeout SECS`).
    pub fn all(t: Duration) -> Self {
        Timeouts { connect: t.min(Duration::from_secs(3)), receive: t, retry_for: t }
    }
}

/// A principal and its key. `name` is `NAME` (key id 0) or `NAME#ID` for key id `ID` while a key is being
/// rotated (docs/operations.md, "Rotating a key").
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub name: String,
    pub key: Vec<u8>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials {{ name: {:?}, key: <{} bytes> }}", self.name, self.key.len())
    }
}

/// What the server granted in its Welcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    pub role: Role,
    /// Requests this session may have outstanding.
    pub credits: u16,
    /// Silence timeout: send something (HEARTBEAT) at least every `heartbeat_ms / 3`.
    pub heartbeat_ms: u32,
    pub session_id: u64,
    /// The appliance's boot: every lease id this session gets carries it, and a different one after a
    /// reconnect means the appliance rebooted (every earlier lease is gone).
    pub boot_id: [u8; BOOT_ID_LEN],
    /// This session's secret for a later [`Client::resume`] from a new connection of the same principal.
    pub resume_token: [u8; RESUME_TOKEN_LEN],
}

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The connection could not be made, or broke.
    Io(io::Error),
    /// No (whole) answer within the deadline.
    Timeout { what: &'static str, after: Duration },
    /// The server sent something the protocol does not allow (or this client cannot accept).
    Protocol(String),
    /// The server answered with an error frame.
    Server(ErrorBody),
    /// The server's HELLO answer does not authenticate under the key (it does not hold the key, or the answer
    /// belongs to another handshake), or a record from the server failed authentication.
    ServerProof,
    /// The caller asked for something the protocol cannot carry (e.g. a name over 32 bytes).
    Usage(String),
}

/// `leasectl`'s exit codes (docs/operations.md, "leasectl").
pub mod exit {
    pub const OK: u8 = 0;
    pub const SERVER_ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const CONNECTION: u8 = 3;
    pub const AUTH: u8 = 4;
    pub const PROTOCOL: u8 = 5;
}

impl ClientError {
    /// The exit code `leasectl` uses for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Io(_) | ClientError::Timeout { .. } => exit::CONNECTION,
            ClientError::Protocol(_) => exit::PROTOCOL,
            ClientError::Server(e) if e.code == ErrorCode::AuthFailed => exit::AUTH,
            ClientError::Server(_) => exit::SERVER_ERROR,
            ClientError::ServerProof => exit::AUTH,
            ClientError::Usage(_) => exit::USAGE,
        }
    }

    /// A short upper-case name: the server's error code, or what went wrong on this side.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::Io(_) => "CONNECTION",
            ClientError::Timeout { .. } => "TIMEOUT",
            ClientError::Protocol(_) => "PROTOCOL",
            ClientError::Server(e) => e.code.name(),
            ClientError::ServerProof => "SERVER_PROOF",
            ClientError::Usage(_) => "USAGE",
        }
    }

    /// A failure that a fresh connection may not see (QEMU's forwarder closing on us, the listener not up yet).
    fn retryable(&self) -> bool {
        match self {
            ClientError::Io(e) => matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::ConnectionRefused
                    | ErrorKind::BrokenPipe
                    | ErrorKind::NotConnected
                    | ErrorKind::TimedOut
            ),
            ClientError::Timeout { .. } => true,
            _ => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Timeout { what, after } => write!(f, "no {what} within {:.1} s", after.as_secs_f64()),
            ClientError::Protocol(m) => write!(f, "protocol violation: {m}"),
            ClientError::Server(e) => write!(f, "{}: {}", e.code.name(), e.message),
            ClientError::ServerProof => {
                write!(f, "the server's HELLO answer or a record does not authenticate under the key")
            }
            ClientError::Usage(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// One answer frame as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub header: Header,
    pub body: Result<Response, ErrorBody>,
}

/// The request id after `id`: ids count 1..=u32::MAX and then start again at 1, never 0 (the id of notices,
/// which answer no request). An id comes back only after 2^32 - 1 more requests on the connection, while the
/// server's credits bound how many are outstanding at once, so it never meets an answer still owed to it.
fn request_id_after(id: u32) -> u32 {
    id.wrapping_add(1).max(1)
}

/// An open control connection.
pub struct Client {
    stream: TcpStream,
    peer: SocketAddr,
    frames: FrameBuf,
    next_id: u32,
    timeouts: Timeouts,
    /// Whether the server has sent a single byte on this connection (then it is listening for real).
    heard: bool,
    /// While nothing has been heard, answers are awaited this long instead of `timeouts.receive`.
    first_wait: Option<Duration>,
    welcome: Option<Welcome>,
    /// The session's record layer, once HELLO has completed.
    transport: Option<Transport>,
    /// Notices the server sent while this client waited for answers, oldest first, until taken.
    notices: VecDeque<Notice>,
    /// Frames [`Client::take_notices`] read past while looking for notices already received: the next
    /// [`Client::receive`] starts with them, in order.
    ahead: VecDeque<(Header, Vec<u8>)>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("peer", &self.peer)
            .field("next_id", &self.next_id)
            .field("welcome", &self.welcome)
            .finish_non_exhaustive()
    }
}

/// Unpredictable bytes from the OS.
fn random(buf: &mut [u8]) -> io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Splits `NAME#ID` into the name and key id (`NAME` alone is key id 0).
pub fn split_key_id(spec: &str) -> Result<(&str, u8), ClientError> {
    match spec.split_once('#') {
        None => Ok((spec, 0)),
        Some((name, id)) => {
            let id =
                id.parse::<u8>().map_err(|_| ClientError::Usage(format!("key id in '{spec}' must be 0 to 255")))?;
            Ok((name, id))
        }
    }
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>, ClientError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| ClientError::Usage(format!("address '{addr}': {e} (expected HOST:PORT)")))?
        .collect();
    if addrs.is_empty() {
        return Err(ClientError::Usage(format!("address '{addr}' resolves to nothing")));
    }
    Ok(addrs)
}

impl Client {
    /// Opens a TCP connection to `addr` (`HOST:PORT`), retrying refused connections until
    /// `timeouts.retry_for` has passed; each attempt waits at most `timeouts.connect`.
    pub fn connect(addr: &str, timeouts: Timeouts) -> Result<Client, ClientError> {
        let deadline = Instant::now() + timeouts.retry_for;
        Self::connect_until(addr, timeouts, deadline)
    }

    fn connect_until(addr: &str, timeouts: Timeouts, deadline: Instant) -> Result<Client, ClientError> {
        let addrs = resolve(addr)?;
        loop {
            let e = match Self::connect_once(addr, &addrs, timeouts, deadline) {
                Ok(c) => return Ok(c),
                Err(e) => e,
            };
            if !e.retryable() || Instant::now() + RETRY_PAUSE >= deadline {
                return Err(e);
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// One try at each of `addrs`, each waiting at most `timeouts.connect` and not past `deadline`.
    fn connect_once(
        addr: &str,
        addrs: &[SocketAddr],
        timeouts: Timeouts,
        deadline: Instant,
    ) -> Result<Client, ClientError> {
        {
            let mut last = None;
            for sa in addrs {
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                match TcpStream::connect_timeout(sa, timeouts.connect.min(left)) {
                    Ok(stream) => {
                        stream.set_nodelay(true)?;
                        return Ok(Client {
                            stream,
                            peer: *sa,
                            frames: FrameBuf::new(),
                            next_id: 1,
                            timeouts,
                            heard: false,
                            first_wait: None,
                            welcome: None,
                            transport: None,
                            notices: VecDeque::new(),
                            ahead: VecDeque::new(),
                        });
                    }
                    Err(e) => last = Some(e),
                }
            }
            let e = last.unwrap_or_else(|| io::Error::other("no address to connect to"));
            Err(ClientError::Io(io::Error::new(e.kind(), format!("connecting to {addr}: {e}"))))
        }
    }

    /// Connects and authenticates, retrying the whole exchange while the server has not answered a single
    /// byte (connection refused, closed or reset, or silent), until `timeouts.retry_for` has passed.
    pub fn connect_and_hello(
        addr: &str,
        who: &Credentials,
        timeouts: Timeouts,
    ) -> Result<(Client, Welcome), ClientError> {
        let deadline = Instant::now() + timeouts.retry_for;
        let addrs = resolve(addr)?;
        // The connection kept while silent (its patience doubling from 1 s), and fresh ones beside it.
        let mut kept: Option<Attempt> = None;
        let mut probes: VecDeque<Attempt> = VecDeque::new();
        let (mut kept_count, mut next_open) = (0u32, Instant::now());
        let mut last: Option<ClientError> = None;
        loop {
            let now = Instant::now();
            if kept.as_ref().is_some_and(|a| now >= a.until) {
                kept = None;
            }
            probes.retain(|a| now < a.until);
            if now >= deadline {
                return Err(match last {
                    Some(e) if kept.is_none() && probes.is_empty() && !matches!(e, ClientError::Timeout { .. }) => e,
                    _ => ClientError::Timeout { what: "answer to HELLO", after: timeouts.retry_for },
                });
            }
            if now >= next_open && (kept.is_none() || probes.len() < PROBES) {
                next_open = now + RETRY_PAUSE;
                // Nothing is waiting: wait here for the listener (refused connections, every RETRY_PAUSE).
                let c = if kept.is_none() && probes.is_empty() {
                    Self::connect_until(addr, timeouts, deadline)?
                } else {
                    match Self::connect_once(addr, &addrs, timeouts, deadline) {
                        Ok(c) => c,
                        Err(e) => {
                            last = Some(e);
                            continue;
                        }
                    }
                };
                let left = deadline.saturating_duration_since(Instant::now());
                let life = if kept.is_none() {
                    kept_count += 1;
                    Duration::from_secs(1 << (kept_count - 1).min(6))
                } else {
                    PROBE_LIFE
                };
                let until = Instant::now() + life.min(timeouts.receive).min(left).max(Duration::from_millis(100));
                match Self::hello_send(c, &who.name, &who.key) {
                    Ok((c, init, id)) if kept.is_none() => kept = Some(Attempt { c, init, id, until }),
                    Ok((c, init, id)) => probes.push_back(Attempt { c, init, id, until }),
                    Err(e) if e.retryable() => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            // The first connection the server answers on takes the session.
            let mut answered = None;
            if let Some(a) = kept.as_ref() {
                match heard(&a.c.stream) {
                    Heard::Nothing => {}
                    Heard::Something => answered = kept.take(),
                    Heard::Gone(e) => (kept, last) = (None, Some(e)),
                }
            }
            let mut i = 0;
            while answered.is_none() && i < probes.len() {
                match heard(&probes[i].c.stream) {
                    Heard::Nothing => i += 1,
                    Heard::Something => answered = probes.remove(i),
                    Heard::Gone(e) => {
                        probes.remove(i);
                        last = Some(e);
                    }
                }
            }
            if let Some(Attempt { mut c, init, id, .. }) = answered {
                let left = deadline.saturating_duration_since(Instant::now());
                c.first_wait = Some(timeouts.receive.min(left).max(Duration::from_millis(100)));
                match c.hello_finish(init, id) {
                    Ok(w) => return Ok((c, w)),
                    Err(e) if e.retryable() && !c.heard => last = Some(e),
                    Err(e) => return Err(e),
                }
                continue;
            }
            std::thread::sleep(LOOK_EVERY);
        }
    }

    /// The v2 HELLO on this connection (docs/wire-protocol.md, "Protocol v2"): Noise NNpsk0 under the key's
    /// PSK with a fresh ephemeral key; the server's answer must authenticate under the same PSK, and from then on
    /// every frame travels in records; a first HEARTBEAT confirms the keys and gets the session its place.
    /// `name` is `NAME` or `NAME#KEYID`.
    pub fn hello(&mut self, name: &str, key: &[u8]) -> Result<Welcome, ClientError> {
        let mut e = [0u8; 32];
        random(&mut e)?;
        self.hello_with(name, key, e)
    }

    /// [`Client::hello`] with the given ephemeral private key (tests; nothing that ships calls it with anything
    /// but fresh random bytes).
    pub fn hello_with(&mut self, name: &str, key: &[u8], e: [u8; 32]) -> Result<Welcome, ClientError> {
        let (init, id) = self.hello_start(name, key, e)?;
        self.hello_finish(init, id)
    }

    /// Sends HELLO with the ephemeral private key `e`: the handshake's state and the request id.
    fn hello_start(&mut self, name: &str, key: &[u8], e: [u8; 32]) -> Result<(Initiator, u32), ClientError> {
        // `NAME[#ID]@APPLIANCE`: the appliance this HELLO is meant for (its `appliance=`), bound into the
        // prologue, so that it fails on any other appliance holding the same key (docs/security.md,
        // "Appliance identity").
        let (name, appliance) = match name.split_once('@') {
            Some((_, a)) if a.is_empty() || a.len() > MAX_NAME || a.contains('@') => {
                return Err(ClientError::Usage(format!("appliance name '{a}' must be 1 to {MAX_NAME} bytes")));
            }
            Some((n, a)) => (n, a),
            None => (name, ""),
        };
        let (name, key_id) = split_key_id(name)?;
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(ClientError::Usage(format!("principal name '{name}' must be 1 to {MAX_NAME} bytes")));
        }
        // The appliance's own rule (a key it would refuse to load can only be a mistake here too).
        leasebox_proto::key::check_key(key).map_err(|e| ClientError::Usage(format!("key for '{name}': {e}")))?;
        let prologue = v2::prologue_for(VERSION_MIN, VERSION_MAX, key_id, name, appliance);
        let (init, msg1) = Initiator::start(&prologue, &v2::psk_from_key(key), e);
        let h = HelloNoise { min_version: VERSION_MIN, max_version: VERSION_MAX, key_id, name: name.into(), msg1 };
        let id = self.send(&Request::Hello(Hello::Noise(h)))?;
        Ok((init, id))
    }

    /// Sends HELLO on a fresh connection with a fresh ephemeral key; [`Client::hello_finish`] takes its answer.
    fn hello_send(mut c: Client, name: &str, key: &[u8]) -> Result<(Client, Initiator, u32), ClientError> {
        let mut e = [0u8; 32];
        random(&mut e)?;
        let (init, id) = c.hello_start(name, key, e)?;
        Ok((c, init, id))
    }

    /// HELLO's answer (request `id`), the session's keys and the key confirmation.
    fn hello_finish(&mut self, init: Initiator, id: u32) -> Result<Welcome, ClientError> {
        let msg2 = match self.answer(id, Op::Hello)? {
            Response::Hello(HelloReply::Noise { msg2 }) => msg2,
            other => return Err(ClientError::Protocol(format!("expected a HELLO v2 answer, got {other:?}"))),
        };
        let (announce, transport) = init.finish(&msg2).map_err(|_| ClientError::ServerProof)?;
        let a = Announce::decode(&announce);
        if !(VERSION_MIN..=VERSION_MAX).contains(&a.version) {
            return Err(ClientError::Protocol(format!(
                "server chose version {}, outside the offered range",
                a.version
            )));
        }
        let role = Role::from_raw(a.role).ok_or_else(|| ClientError::Protocol(format!("unknown role {}", a.role)))?;
        let welcome = Welcome {
            version: a.version,
            role,
            credits: a.credits,
            heartbeat_ms: a.heartbeat_ms,
            session_id: a.session_id,
            boot_id: a.boot_id,
            resume_token: a.resume_token,
        };
        // Whatever the server sent after its answer is already records.
        let mut transport = transport;
        transport.push(&self.frames.take_buffered());
        self.transport = Some(transport);
        // Key confirmation (docs/wire-protocol.md): the server makes the session on the first record it can
        // open, and refuses it there (BUSY, request id 0) when a budget is full; so HELLO ends with one answered
        // HEARTBEAT.
        match self.call(&Request::Heartbeat { echo: 0 })? {
            Response::Heartbeat { .. } => {}
            other => return Err(ClientError::Protocol(format!("expected a HEARTBEAT answer, got {other:?}"))),
        }
        self.welcome = Some(welcome.clone());
        Ok(welcome)
    }

    /// Sends `req` and waits for its answer: `Ok` for a response, [`ClientError::Server`] for an error frame.
    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        let id = self.send(req)?;
        self.answer(id, req.op())
    }

    /// STATS with every part this client knows (the session guards included). An appliance older than the parts
    /// answers the longer request MALFORMED and keeps the session; it is asked again with the plain STATS, whose
    /// answer has no guard block (`guards: None`).
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        let answer = match self.call(&Request::StatsWith { want: STATS_WANT_GUARDS }) {
            Err(ClientError::Server(e)) if e.code == ErrorCode::Malformed => self.call(&Request::Stats)?,
            other => other?,
        };
        match answer {
            Response::Stats(s) => Ok(*s),
            other => Err(ClientError::Protocol(format!("STATS answered {other:?}"))),
        }
    }

    /// The answer to request `id` of `op`: `Ok` for a response, [`ClientError::Server`] for an error frame.
    fn answer(&mut self, id: u32, op: Op) -> Result<Response, ClientError> {
        let a = self.receive()?;
        if a.header.request_id != id {
            // Request id 0 carries session-level news (TIMEOUT, BUSY) that is not an answer to anything.
            if a.header.kind == Kind::Error && a.header.request_id == 0 {
                return Err(ClientError::Server(a.body.expect_err("error frames decode to ErrorBody")));
            }
            return Err(ClientError::Protocol(format!(
                "answer for request id {} while waiting for {id}",
                a.header.request_id
            )));
        }
        if a.header.op != op as u16 {
            return Err(ClientError::Protocol(format!("answer to {} carries op {:#06x}", op.name(), a.header.op)));
        }
        a.body.map_err(ClientError::Server)
    }

    /// Sends `req` with the next request id (returned) without waiting; see [`Client::receive`].
    pub fn send(&mut self, req: &Request) -> Result<u32, ClientError> {
        let id = self.next_id;
        self.next_id = request_id_after(id);
        let mut bytes = Vec::new();
        req.encode(id, &mut bytes);
        self.send_raw(&bytes)?;
        Ok(id)
    }

    /// Writes frame bytes as they are (tests use it for malformed frames): sealed in a record once the session
    /// is established, so the server sees exactly these bytes in its frame stream.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        match &mut self.transport {
            Some(t) => {
                let mut wire = Vec::with_capacity(bytes.len() + 32);
                t.seal(bytes, &mut wire).map_err(|e| ClientError::Protocol(e.to_string()))?;
                self.send_wire(&wire)
            }
            None => self.send_wire(bytes),
        }
    }

    /// Writes bytes to the connection as they are, past the record layer (tests use it to replay, reorder or
    /// alter records).
    pub fn send_wire(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.set_write_timeout(Some(self.timeouts.receive.max(Duration::from_millis(1))))?;
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Seals frame bytes into records without sending them (tests keep them to replay or reorder).
    pub fn seal(&mut self, bytes: &[u8]) -> Result<Vec<u8>, ClientError> {
        let t = self.transport.as_mut().ok_or_else(|| ClientError::Usage("no session yet".into()))?;
        let mut wire = Vec::new();
        t.seal(bytes, &mut wire).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(wire)
    }

    /// The next answer frame from the server, decoded, within the receive timeout. Notices that come first are
    /// set aside ([`Client::take_notices`]); they are not answers.
    pub fn receive(&mut self) -> Result<Answer, ClientError> {
        let wait = match self.first_wait {
            Some(w) if !self.heard => w,
            _ => self.timeouts.receive,
        };
        let deadline = Instant::now() + wait;
        loop {
            let (header, payload) = self.read_frame(deadline, wait)?;
            if let Some(a) = self.answer_or_notice(header, payload)? {
                return Ok(a);
            }
        }
    }

    /// A notice frame goes to the queue (`None`); anything else is decoded as an answer.
    fn answer_or_notice(&mut self, header: Header, payload: Vec<u8>) -> Result<Option<Answer>, ClientError> {
        let bad = |what: &str, e: DecodeError| ClientError::Protocol(format!("{what}: {e}"));
        let body = match header.kind {
            Kind::Notice => {
                if header.op != Op::Notice as u16 || header.request_id != 0 {
                    return Err(ClientError::Protocol(format!(
                        "notice frame with op {:#06x} and request id {}",
                        header.op, header.request_id
                    )));
                }
                self.notices.push_back(Notice::decode(&payload).map_err(|e| bad("NOTICE", e))?);
                return Ok(None);
            }
            Kind::Request => return Err(ClientError::Protocol("the server sent a request frame".into())),
            Kind::Error => Err(ErrorBody::decode(&payload).map_err(|e| bad("error frame", e))?),
            Kind::Response => {
                let op = Op::from_raw(header.op)
                    .ok_or_else(|| ClientError::Protocol(format!("response with unknown op {:#06x}", header.op)))?;
                Ok(Response::decode(op, &payload).map_err(|e| bad(op.name(), e))?)
            }
        };
        Ok(Some(Answer { header, body }))
    }

    /// The notices received so far (while waiting for answers, or in [`Client::wait_notices`], or read with an
    /// answer and not yet looked at), oldest first. Does not wait.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        // Frames that came in the same read as an earlier answer are complete but not yet parsed: the notices
        // among them count; anything else waits for `receive`.
        while let Next::Frame(h, p) = self.frames.next_frame() {
            if h.kind == Kind::Notice
                && let Ok(n) = Notice::decode(&p)
            {
                self.notices.push_back(n);
                continue;
            }
            self.ahead.push_back((h, p));
        }
        self.notices.drain(..).collect()
    }

    /// Notices, waiting up to `wait` for one when none is queued. Call it when no request is outstanding: an
    /// answer frame arriving meanwhile is a protocol error, and session news from the server (TIMEOUT, BUSY:
    /// an error frame with request id 0) is returned as [`ClientError::Server`]. An empty vector means nothing
    /// came within `wait`.
    pub fn wait_notices(&mut self, wait: Duration) -> Result<Vec<Notice>, ClientError> {
        let deadline = Instant::now() + wait;
        while self.notices.is_empty() {
            let (header, payload) = match self.read_frame(deadline, wait) {
                Ok(f) => f,
                Err(ClientError::Timeout { .. }) => break,
                Err(e) => return Err(e),
            };
            match self.answer_or_notice(header, payload)? {
                None => {}
                Some(Answer { header, body: Err(e) }) if header.request_id == 0 => return Err(ClientError::Server(e)),
                Some(a) => {
                    return Err(ClientError::Protocol(format!(
                        "an answer (op {:#06x}, request id {}) with no request outstanding",
                        a.header.op, a.header.request_id
                    )));
                }
            }
        }
        // Notices already buffered behind the first come along.
        Ok(self.take_notices())
    }

    /// RESUME: this session takes over the leases of the earlier session `session_id` of the same principal,
    /// whose [`Welcome::resume_token`] is `token` (the old session is closed if it is still open). Returns how
    /// many leases this session now holds that were the old one's. A wrong token, another principal's session
    /// and an unknown one all answer NOT_FOUND.
    pub fn resume(&mut self, session_id: u64, token: [u8; RESUME_TOKEN_LEN]) -> Result<u32, ClientError> {
        match self.call(&Request::Resume { session_id, token })? {
            Response::Resume { leases } => Ok(leases),
            other => Err(ClientError::Protocol(format!("expected a RESUME answer, got {other:?}"))),
        }
    }

    fn read_frame(&mut self, deadline: Instant, wait: Duration) -> Result<(Header, Vec<u8>), ClientError> {
        if let Some(f) = self.ahead.pop_front() {
            return Ok(f);
        }
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.frames.next_frame() {
                Next::Frame(h, p) => return Ok((h, p)),
                Next::Bad(e) => return Err(ClientError::Protocol(format!("bad frame from the server: {}", e.reason))),
                Next::Pending => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout { what: "answer", after: wait });
            }
            self.stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(ClientError::Io(io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )));
                }
                Ok(n) => self.absorb(&buf[..n])?,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => return Err(ClientError::Io(e)),
            }
        }
    }

    /// Bytes read from the socket into the frame reassembler, through the record layer once there is one.
    fn absorb(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.heard = true;
        match &mut self.transport {
            None => self.frames.push(bytes),
            Some(t) => {
                t.push(bytes);
                while let Some(r) = t.open() {
                    let plain = r.map_err(|_| ClientError::ServerProof)?;
                    self.frames.push(&plain);
                }
            }
        }
        Ok(())
    }

    /// What the socket holds right now, read without waiting (the socket is non-blocking meanwhile, so nothing
    /// else may read it concurrently), then [`Client::take_notices`]. For a thread told by a watcher
    /// ([`Client::watch_handle`]) that bytes came: if a call of its own took them first, this returns at once.
    /// The end of the connection is an error.
    pub fn drain_notices(&mut self) -> Result<Vec<Notice>, ClientError> {
        self.stream.set_nonblocking(true)?;
        let mut buf = [0u8; 16 * 1024];
        let read = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    break Err(ClientError::Io(io::Error::new(
                        ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )));
                }
                Ok(n) => {
                    if let Err(e) = self.absorb(&buf[..n]) {
                        break Err(e);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(ClientError::Io(e)),
            }
        };
        self.stream.set_nonblocking(false)?;
        read?;
        Ok(self.take_notices())
    }

    /// Says BYE (waits for its answer) and closes.
    pub fn bye(mut self) -> Result<(), ClientError> {
        let r = self.call(&Request::Bye).map(|_| ());
        let _ = self.stream.shutdown(Shutdown::Both);
        r
    }

    /// The server's Welcome, once authenticated.
    pub fn welcome(&self) -> Option<&Welcome> {
        self.welcome.as_ref()
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Another handle on this connection's socket, for a thread that waits for it to become readable
    /// (`TcpStream::peek`) while this one is idle: std cannot wait on a socket and a channel at once.
    /// [`Connection::park`] makes that wait block until bytes (or the end) arrive.
    pub fn watch_handle(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    /// Clears the socket's read timeout (each call sets its own), so that a peek on a
    /// [`Connection::watch_handle`] waits until something arrives instead of timing out over and over.
    pub fn park(&self) -> io::Result<()> {
        self.stream.set_read_timeout(None)
    }

    /// Changes the deadlines of later calls (a connection made with short ones for a quick reconnect).
    pub fn set_timeouts(&mut self, timeouts: Timeouts) {
        self.timeouts = timeouts;
    }

    /// The request id the next request will carry.
    pub fn next_request_id(&self) -> u32 {
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Request ids just below their limit: u32::MAX is used, then 1; 0 (notices) never.
    #[test]
    fn request_ids_wrap_past_u32_max_to_1_never_0() {
        let ids: Vec<u32> =
            core::iter::successors(Some(u32::MAX - 2), |&i| Some(request_id_after(i))).take(5).collect();
        assert_eq!(ids, [u32::MAX - 2, u32::MAX - 1, u32::MAX, 1, 2]);
    }
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A key the appliances would refuse to load is refused before HELLO goes out: a usage error naming the
    /// rule, not retried, nothing sent.
    #[test]
    fn a_weak_key_is_refused_before_hello() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got.len()
        });
        let who = Credentials { name: "demo".into(), key: vec![7; 32] };
        let t = Timeouts {
            connect: Duration::from_secs(1),
            receive: Duration::from_secs(1),
            retry_for: Duration::from_secs(3),
        };
        let t0 = Instant::now();
        let e = Client::connect_and_hello(&addr, &who, t).unwrap_err();
        assert!(
            matches!(&e, ClientError::Usage(m) if m.contains("key for 'demo': the key is one byte repeated")),
            "{e:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "not retried");
        assert_eq!(server.join().unwrap(), 0, "nothing sent");
    }

    /// A listener that accepts and closes at once (QEMU's forwarder before the guest listens) sees one
    /// attempt per [`RETRY_PAUSE`]: the retries neither back off nor spin.
    #[test]
    fn attempts_come_every_retry_pause_without_backing_off_or_spinning() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        l.set_nonblocking(true).unwrap();
        let (count, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (c, st) = (count.clone(), stop.clone());
        let server = std::thread::spawn(move || {
            while !st.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((s, _)) => {
                        c.fetch_add(1, Ordering::AcqRel);
                        drop(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        let who =
            Credentials { name: "demo".into(), key: crate::hex::decode("5f0e1d2c3b4a69788796a5b4c3d2e1f0").unwrap() };
        let window = Duration::from_millis(1500);
        let t = Timeouts { connect: Duration::from_secs(1), receive: Duration::from_secs(1), retry_for: window };
        let t0 = Instant::now();
        let e = Client::connect_and_hello(&addr, &who, t).unwrap_err();
        let took = t0.elapsed();
        stop.store(true, Ordering::Release);
        server.join().unwrap();
        let n = count.load(Ordering::Acquire);
        // 1.5 s at one attempt per 50 ms (plus each attempt's own time) is about 30; a backoff to 250 ms or more
        // would make it 6 or fewer, a spin hundreds.
        // Wall clock, and it stays: the retry pause and `retry_for` run on the real clock (no clock to inject),
        // and the property is their rate; the range sits between a backoff and a spin with a factor 2 each way.
        assert!((12..=45).contains(&n), "{n} attempts in {took:?} ({e})");
        assert!(took < window + Duration::from_secs(1), "{took:?}");
    }
}
