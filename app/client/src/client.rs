//! [`Client`]: the program's handle on one or more appliances (docs/client.md). Each appliance gets a
//! connection thread ([`crate::session`]) that heartbeats, renews and reconnects; [`Client::alloc`] places a
//! lease by free bytes ([`crate::placement`]) and brings it up ([`crate::setup`]).

use std::fmt;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasebox_proto::{ErrorCode, Request, Response};

use crate::connection::{Client as Connection, ClientError, Credentials, Timeouts};
use crate::error::{Error, from_client};
use crate::event::{Callback, Event, Sink};
use crate::lease::{self, Lease};
use crate::placement;
use crate::rdma::{Requester, SoftConfig, SoftRoce};
use crate::session::Session;

/// Which RDMA requester a lease on an appliance uses (each lease gets its own: one QP per lease).
#[derive(Clone, Debug)]
pub enum RequesterConfig {
    /// The software RoCEv2 requester over UDP ([`SoftRoce`]): the hosted appliance's model, or a QEMU hub.
    Soft(SoftConfig),
    /// A real RDMA NIC through libibverbs; `slot_len` bounds one read or write.
    #[cfg(feature = "verbs")]
    Verbs(crate::rdma::verbs::VerbsConfig),
}

impl RequesterConfig {
    /// A fresh requester (a new QP in RESET).
    pub(crate) fn make(&self) -> Result<Box<dyn Requester + Send>, String> {
        match self {
            RequesterConfig::Soft(c) => SoftRoce::new(c.clone())
                .map(|r| Box::new(r) as Box<dyn Requester + Send>)
                .map_err(|e| format!("UDP {} → {}: {e}", c.bind, c.peer)),
            #[cfg(feature = "verbs")]
            RequesterConfig::Verbs(c) => {
                crate::rdma::verbs::Verbs::open(c.clone()).map(|v| Box::new(v) as Box<dyn Requester + Send>)
            }
        }
    }
}

/// One appliance: where its control port is, who we are there, and how RDMA reaches it.
#[derive(Clone, Debug)]
pub struct Appliance {
    /// `HOST:PORT` of the control port (7470 by default).
    pub addr: String,
    pub credentials: Credentials,
    pub requester: RequesterConfig,
}

/// What [`Client::connect`] needs.
#[derive(Clone)]
pub struct ClientConfig {
    pub appliances: Vec<Appliance>,
    /// The control connection's deadlines (connect, one answer, connect + HELLO retries).
    pub timeouts: Timeouts,
    /// How long one RDMA read or write (or batch) may go without a completion before it fails.
    pub rdma_timeout: Duration,
    /// Called with every event, on a connection thread (see [`Callback`]); events also queue for
    /// [`Client::recv_event`].
    pub on_event: Option<Callback>,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("appliances", &self.appliances)
            .field("timeouts", &self.timeouts)
            .field("rdma_timeout", &self.rdma_timeout)
            .field("on_event", &self.on_event.as_ref().map(|_| "callback"))
            .finish()
    }
}

impl ClientConfig {
    /// The defaults: [`Timeouts::default`], 5 s per RDMA operation (the software requester's default QP
    /// gives up after 8 × 67 ms), no callback.
    pub fn new(appliances: Vec<Appliance>) -> ClientConfig {
        ClientConfig { appliances, timeouts: Timeouts::default(), rdma_timeout: Duration::from_secs(5), on_event: None }
    }
}

/// How to allocate a lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocOptions {
    /// The lease's TTL (0: the appliance's default, `lease_ttl_ms=`); the client renews it at half-time.
    pub ttl_ms: u32,
    /// Try this appliance (its index in [`ClientConfig::appliances`]) first, whatever its free bytes.
    pub prefer: Option<usize>,
}

pub(crate) struct Inner {
    pub(crate) sessions: Vec<Session>,
    pub(crate) requesters: Vec<RequesterConfig>,
    pub(crate) timeouts: Timeouts,
    pub(crate) rdma_timeout: Duration,
    pub(crate) sink: Arc<Sink>,
}

impl Inner {
    /// How long a caller waits for the connection thread: a reconnect attempt, a retry and the answer.
    pub(crate) fn call_wait(&self) -> Duration {
        self.timeouts.receive * 2 + Duration::from_secs(3)
    }
}

/// Connections to one or more appliances, and the leases taken through them. Dropping it frees the leases it
/// still tracks, says BYE and ends its threads.
pub struct Client {
    inner: Arc<Inner>,
    events: Mutex<Option<Receiver<Event>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("appliances", &self.appliances()).finish_non_exhaustive()
    }
}

/// A failure that another try will not mend: wrong key, refused name, an appliance speaking something else.
fn fatal(e: &ClientError) -> bool {
    match e {
        ClientError::Server(b) => matches!(b.code, ErrorCode::AuthFailed | ErrorCode::UnsupportedVersion),
        ClientError::ServerProof | ClientError::Usage(_) | ClientError::Protocol(_) => true,
        ClientError::Io(_) | ClientError::Timeout { .. } => false,
    }
}

impl Client {
    /// Connects and authenticates to every appliance. An appliance that cannot be reached now is retried in
    /// the background; it fails only when none can be reached, or when one refuses the credentials.
    pub fn connect(config: ClientConfig) -> Result<Client, Error> {
        if config.appliances.is_empty() {
            return Err(Error::Config("no appliance to connect to".into()));
        }
        let (sink, rx) = Sink::new(config.on_event.clone());
        let mut sessions: Vec<Session> = Vec::new();
        let mut first_err = None;
        let stop = |sessions: &[Session]| sessions.iter().for_each(Session::shutdown);
        for a in &config.appliances {
            let conn = match Connection::connect_and_hello(&a.addr, &a.credentials, config.timeouts) {
                Ok((c, _)) => Some(c),
                Err(e) if fatal(&e) => {
                    stop(&sessions);
                    return Err(from_client(&a.addr, e));
                }
                Err(e) => {
                    first_err.get_or_insert(from_client(&a.addr, e));
                    None
                }
            };
            match Session::start(a.addr.clone(), a.credentials.clone(), config.timeouts, conn, sink.clone()) {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    stop(&sessions);
                    return Err(e);
                }
            }
        }
        if let Some(e) = first_err
            && !sessions.iter().any(Session::is_up)
        {
            stop(&sessions);
            return Err(e);
        }
        let inner = Inner {
            sessions,
            requesters: config.appliances.iter().map(|a| a.requester.clone()).collect(),
            timeouts: config.timeouts,
            rdma_timeout: config.rdma_timeout,
            sink,
        };
        Ok(Client { inner: Arc::new(inner), events: Mutex::new(Some(rx)) })
    }

    /// The appliances' addresses, in the configuration's order (the indexes [`AllocOptions::prefer`] takes).
    pub fn appliances(&self) -> Vec<String> {
        self.inner.sessions.iter().map(|s| s.appliance.clone()).collect()
    }

    /// Allocates a read-write lease of `size` bytes: ALLOC on the appliance with the most free bytes (the next
    /// one when it answers NO_MEMORY or LIMIT), a requester QP brought to RTS toward the lease's QP, READY;
    /// from then on the client renews it until it is freed.
    pub fn alloc(&self, size: u64, options: AllocOptions) -> Result<Lease, Error> {
        if size == 0 {
            return Err(Error::Config("a lease of 0 bytes".into()));
        }
        let order = if self.inner.sessions.len() == 1 {
            vec![0]
        } else {
            placement::order(&self.free_bytes_figures(), options.prefer)
        };
        let mut tried = Vec::new();
        for i in order {
            match lease::open(&self.inner, i, size, options.ttl_ms) {
                Ok(l) => return Ok(l),
                Err(e) if matches!(e.server_code(), Some(ErrorCode::NoMemory | ErrorCode::Limit)) => {
                    tried.push((self.inner.sessions[i].appliance.clone(), e.to_string()));
                }
                // An appliance that cannot be reached now: the next may.
                Err(e @ (Error::Connection { .. } | Error::Timeout { .. })) if self.inner.sessions.len() > 1 => {
                    tried.push((self.inner.sessions[i].appliance.clone(), e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoMemory { size, tried })
    }

    /// Each appliance's `stats.bytes_free` for our tenant (`None` where STATS failed or it is not connected).
    fn free_bytes_figures(&self) -> Vec<Option<u64>> {
        self.inner
            .sessions
            .iter()
            .enumerate()
            .map(|(i, s)| if s.is_up() { self.free_bytes(i).ok() } else { None })
            .collect()
    }

    /// The bytes our tenant may still take on appliance `i` (STATS, `stats.bytes_free`).
    pub fn free_bytes(&self, appliance: usize) -> Result<u64, Error> {
        match self.call(appliance, Request::Stats)? {
            Response::Stats(s) => Ok(s.leases.bytes_free),
            other => Err(Error::Config(format!("STATS answered {other:?}"))),
        }
    }

    /// Any request on appliance `i`'s connection (QUERY, LIST, STATS, HEALTH …), answered in order with the
    /// connection thread's own traffic.
    pub fn call(&self, appliance: usize, req: Request) -> Result<Response, Error> {
        let s = self.inner.sessions.get(appliance).ok_or_else(|| {
            Error::Config(format!("no appliance {appliance} (there are {})", self.inner.sessions.len()))
        })?;
        s.call(req, self.inner.call_wait())
    }

    /// The next event, waiting at most `timeout`; `None` on timeout or when the receiver was taken.
    pub fn recv_event(&self, timeout: Duration) -> Option<Event> {
        let g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        // Timeout, or every sender gone (the client is shutting down): nothing.
        g.as_ref()?.recv_timeout(timeout).ok()
    }

    /// Every event queued now.
    pub fn try_events(&self) -> Vec<Event> {
        let g = self.events.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|rx| rx.try_iter().collect()).unwrap_or_default()
    }

    /// The event channel itself, for a thread of the program's (once; afterwards [`Client::recv_event`] and
    /// [`Client::try_events`] see nothing).
    pub fn take_events(&self) -> Option<Receiver<Event>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Events dropped because the queue ([`crate::event::EVENT_QUEUE`]) was full or its receiver gone.
    pub fn events_dropped(&self) -> u64 {
        self.inner.sink.dropped()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        for s in &self.inner.sessions {
            s.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/client.md promises these: a `Client` shared between threads, a `Lease` moved to one.
    #[test]
    fn client_is_shared_and_leases_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Client>();
        send::<Lease>();
        send::<Event>();
    }

    #[test]
    fn an_empty_configuration_is_refused() {
        let e = Client::connect(ClientConfig::new(Vec::new())).unwrap_err();
        assert_eq!(e.to_string(), "configuration: no appliance to connect to");
    }
}
