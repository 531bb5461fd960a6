//! [`Client`]: the program's handle on one or more appliances (docs/client.md). Each appliance gets a
//! connection thread (`app/client/src/session.rs`) that heartbeats, renews and reconnects; [`Client::alloc`] places a
//! lease by free bytes ([`crate::placement`]) and brings it up ([`crate::setup`]).

use std::fmt;
use std::net::SocketAddr;
use std::os::unix::io::RawFd;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use leasebox_proto::{ErrorCode, Request, Response};

use crate::batch::{Completed, Op, Ticket, Wait};
use crate::connection::{Client as Connection, ClientError, Credentials, Timeouts};
use crate::engine::{DEFAULT_QUEUE_DEPTH, Engine};
use crate::error::{Error, from_client};
use crate::event::{Callback, Event, Sink};
use crate::lease::{self, Lease};
use crate::placement;
use crate::rdma::{MemoryDomain, Requester, SoftConfig, SoftRoce};
use crate::region::{Region, RegionInner};
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

/// The requester spec grammar, as the bindings and programs take it from a command line or the environment.
pub const REQUESTER_SPECS: &str = "soft, soft:ADDR:PORT or verbs:DEVICE:PORT:GID_INDEX";

impl RequesterConfig {
    /// The requester a spec names (the one grammar of the C and Python bindings and their examples):
    /// - `soft`: the software requester toward 127.0.0.1:4791 ([`SoftConfig::default`]);
    /// - `soft:ADDR:PORT`: the software requester toward that UDP address;
    /// - `verbs:DEVICE:PORT:GID_INDEX`: an RC QP on RDMA device `DEVICE` (as `ibv_devices` names it, e.g.
    ///   `mlx5_0`, `rxe0`), its port `PORT` (1 to 255), our RoCEv2 GID at `GID_INDEX`; `depth` work requests
    ///   (the lease's queue depth: its send queue and copy slots) and the rest of [`crate::rdma::verbs::VerbsConfig::new`].
    ///
    /// A verbs spec in a build without the `verbs` feature is refused with a message saying so.
    pub fn parse(spec: &str, depth: usize) -> Result<RequesterConfig, String> {
        let spec = spec.trim();
        let bad = |why: &str| format!("requester '{spec}': {why} (give {REQUESTER_SPECS})");
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        match kind {
            "soft" if rest.is_empty() => Ok(RequesterConfig::Soft(SoftConfig::default())),
            "soft" => {
                let peer = rest.parse().map_err(|_| bad("not ADDR:PORT after soft:"))?;
                Ok(RequesterConfig::Soft(SoftConfig { peer, ..SoftConfig::default() }))
            }
            "verbs" => {
                let parts: Vec<&str> = rest.split(':').collect();
                let [device, port, gid] = parts[..] else { return Err(bad("verbs takes DEVICE:PORT:GID_INDEX")) };
                if device.is_empty() {
                    return Err(bad("no device"));
                }
                let port: u8 = port.parse().ok().filter(|p| *p >= 1).ok_or_else(|| bad("the port is 1 to 255"))?;
                let gid_index: u8 = gid.parse().map_err(|_| bad("the GID index is 0 to 255"))?;
                Self::verbs(device, port, gid_index, depth).map_err(|e| bad(&e))
            }
            _ => Err(bad("unknown kind")),
        }
    }

    #[cfg(feature = "verbs")]
    fn verbs(device: &str, port: u8, gid_index: u8, depth: usize) -> Result<RequesterConfig, String> {
        let c = crate::rdma::verbs::VerbsConfig::new(device, port, gid_index);
        Ok(RequesterConfig::Verbs(crate::rdma::verbs::VerbsConfig { depth, ..c }))
    }

    #[cfg(not(feature = "verbs"))]
    fn verbs(_device: &str, _port: u8, _gid_index: u8, _depth: usize) -> Result<RequesterConfig, String> {
        Err("this leasebox-client was built without its `verbs` feature".into())
    }

    /// A fresh requester (a new QP in RESET) taking `depth` work requests at once; a verbs QP goes on the
    /// client's device context for its device (opened at first use, shared by every lease there).
    pub(crate) fn make(&self, inner: &Inner, depth: usize) -> Result<Box<dyn Requester + Send>, String> {
        // Only the verbs QP uses them (the software requester queues any number and has no device).
        let _ = (inner, depth);
        match self {
            RequesterConfig::Soft(c) => SoftRoce::new(c.clone())
                .map(|r| Box::new(r) as Box<dyn Requester + Send>)
                .map_err(|e| format!("UDP {} → {}: {e}", c.bind, c.peer)),
            #[cfg(feature = "verbs")]
            RequesterConfig::Verbs(c) => {
                let dev = inner.devices.open(&c.device)?;
                crate::rdma::verbs::Verbs::on(dev, c.clone(), depth).map(|v| Box::new(v) as Box<dyn Requester + Send>)
            }
        }
    }

    /// The copying calls' bounce buffers: a registered pool of (count, length) slots per lease (verbs, from
    /// `depth` and `slot_len`), or `None`: a buffer of their own per work request (software: nothing to
    /// register).
    pub(crate) fn bounce_slots(&self) -> Option<(usize, usize)> {
        match self {
            RequesterConfig::Soft(_) => None,
            #[cfg(feature = "verbs")]
            RequesterConfig::Verbs(c) => Some((c.depth.max(1), c.slot_len.max(1))),
        }
    }
}

/// The device contexts a client has open (verbs: one per device, shared by every lease there), where regions are
/// registered.
#[derive(Default)]
pub(crate) struct Devices {
    #[cfg(feature = "verbs")]
    open: Mutex<Vec<Arc<crate::rdma::verbs::Device>>>,
}

impl Devices {
    /// The device context for `name`, opened at its first use.
    #[cfg(feature = "verbs")]
    fn open(&self, name: &str) -> Result<Arc<crate::rdma::verbs::Device>, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = open.iter().find(|d| d.name() == name) {
            return Ok(d.clone());
        }
        let d = crate::rdma::verbs::Device::open(name)?;
        open.push(d.clone());
        Ok(d)
    }

    /// Every open device context, as a place to register memory.
    pub(crate) fn domains(&self) -> Vec<Arc<dyn MemoryDomain>> {
        #[cfg(feature = "verbs")]
        {
            let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            open.iter().map(|d| d.clone() as Arc<dyn MemoryDomain>).collect()
        }
        #[cfg(not(feature = "verbs"))]
        Vec::new()
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
    /// How long one RDMA read or write (or batch) may go without a completion before it fails (and the lease's
    /// QP with it: it is destroyed, so nothing still touches the memory it was given).
    pub rdma_timeout: Duration,
    /// Work requests each lease keeps posted at most ([`crate::DEFAULT_QUEUE_DEPTH`]; more wait in the
    /// lease's queue; [`Lease::set_queue_depth`] changes one lease's).
    pub queue_depth: usize,
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
            .field("queue_depth", &self.queue_depth)
            .field("on_event", &self.on_event.as_ref().map(|_| "callback"))
            .finish()
    }
}

impl ClientConfig {
    /// The defaults: [`Timeouts::default`], 5 s per RDMA operation (the software requester's default QP
    /// gives up after 8 × 67 ms), 64 work requests posted per lease, no callback.
    pub fn new(appliances: Vec<Appliance>) -> ClientConfig {
        ClientConfig {
            appliances,
            timeouts: Timeouts::default(),
            rdma_timeout: Duration::from_secs(5),
            queue_depth: DEFAULT_QUEUE_DEPTH,
            on_event: None,
        }
    }

    /// The configuration the C and Python bindings build from plain values: the appliances' control addresses,
    /// one principal (`name`, `key_hex`), the software requester toward `rdma_peers` (`ADDR:PORT` each: one
    /// for every appliance, or one per appliance; none: [`SoftConfig::default`]'s peer), and `timeout` (if
    /// given) for every network wait. The error names the argument that is wrong.
    pub fn software(
        addrs: &[String],
        name: &str,
        key_hex: &str,
        rdma_peers: &[String],
        timeout: Option<Duration>,
    ) -> Result<ClientConfig, String> {
        if addrs.is_empty() {
            return Err("no appliance address given".into());
        }
        let key = crate::hex::decode(key_hex).map_err(|e| format!("key: {e}"))?;
        leasebox_proto::key::check_key(&key).map_err(|e| format!("key: {e}"))?;
        let peers: Vec<SocketAddr> = if rdma_peers.is_empty() {
            vec![SoftConfig::default().peer]
        } else {
            rdma_peers
                .iter()
                .map(|a| a.trim().parse().map_err(|_| format!("rdma_peer '{a}' is not ADDR:PORT")))
                .collect::<Result<_, _>>()?
        };
        if peers.len() != 1 && peers.len() != addrs.len() {
            return Err(format!(
                "{} rdma peers for {} appliances (give one, or one per appliance)",
                peers.len(),
                addrs.len()
            ));
        }
        let list = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Appliance {
                addr: a.trim().to_string(),
                credentials: Credentials { name: name.to_string(), key: key.clone() },
                requester: RequesterConfig::Soft(SoftConfig {
                    peer: peers[i.min(peers.len() - 1)],
                    ..SoftConfig::default()
                }),
            })
            .collect();
        let mut cfg = ClientConfig::new(list);
        if let Some(t) = timeout {
            if t.is_zero() {
                return Err("timeout must be positive".into());
            }
            cfg.timeouts.receive = t;
            cfg.timeouts.retry_for = t;
            cfg.timeouts.connect = t.min(cfg.timeouts.connect);
            cfg.rdma_timeout = t;
        }
        Ok(cfg)
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

/// One appliance the client knows: its connection thread and how RDMA reaches it. Appliances are only ever
/// added (a fleet client adds those etcd announces), so an index stays valid.
#[derive(Clone)]
pub(crate) struct Member {
    pub(crate) session: Arc<Session>,
    pub(crate) requester: RequesterConfig,
}

pub(crate) struct Inner {
    pub(crate) members: RwLock<Vec<Member>>,
    pub(crate) timeouts: Timeouts,
    pub(crate) rdma_timeout: Duration,
    pub(crate) sink: Arc<Sink>,
    /// Set when the appliances come from etcd (`Client::connect_fleet`).
    pub(crate) fleet: Option<Arc<crate::fleet::View>>,
    /// Batches, completions, the progress thread.
    pub(crate) engine: Arc<Engine>,
    pub(crate) devices: Devices,
}

impl Inner {
    /// How long a caller waits for the connection thread: a reconnect attempt, a retry and the answer.
    pub(crate) fn call_wait(&self) -> Duration {
        self.timeouts.receive * 2 + Duration::from_secs(3)
    }

    pub(crate) fn members(&self) -> std::sync::RwLockReadGuard<'_, Vec<Member>> {
        self.members.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Appliance `i`'s connection thread and requester configuration.
    pub(crate) fn member(&self, i: usize) -> Result<(Arc<Session>, RequesterConfig), Error> {
        let m = self.members();
        let n = m.len();
        m.get(i)
            .map(|m| (m.session.clone(), m.requester.clone()))
            .ok_or_else(|| Error::Config(format!("no appliance {i} (there are {n})")))
    }

    /// Adds an appliance; its index.
    pub(crate) fn add(&self, session: Session, requester: RequesterConfig) -> usize {
        let mut m = self.members.write().unwrap_or_else(|e| e.into_inner());
        m.push(Member { session: Arc::new(session), requester });
        m.len() - 1
    }

    pub(crate) fn shutdown(&self) {
        let all: Vec<Arc<Session>> = self.members().iter().map(|m| m.session.clone()).collect();
        for s in all {
            s.shutdown();
        }
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
    pub(crate) fn from_parts(inner: Inner, events: Receiver<Event>) -> Client {
        Client { inner: Arc::new(inner), events: Mutex::new(Some(events)) }
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub(crate) fn inner_arc(&self) -> &Arc<Inner> {
        &self.inner
    }

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
        let members: Vec<Member> = sessions
            .into_iter()
            .zip(&config.appliances)
            .map(|(s, a)| Member { session: Arc::new(s), requester: a.requester.clone() })
            .collect();
        let engine = match Engine::new(config.queue_depth) {
            Ok(e) => e,
            Err(e) => {
                members.iter().for_each(|m: &Member| m.session.shutdown());
                return Err(e);
            }
        };
        let inner = Inner {
            members: RwLock::new(members),
            timeouts: config.timeouts,
            rdma_timeout: config.rdma_timeout,
            sink,
            fleet: None,
            engine,
            devices: Devices::default(),
        };
        Ok(Client { inner: Arc::new(inner), events: Mutex::new(Some(rx)) })
    }

    /// The appliances' addresses, in the configuration's order (the indexes [`AllocOptions::prefer`] takes).
    pub fn appliances(&self) -> Vec<String> {
        self.inner.members().iter().map(|m| m.session.appliance.clone()).collect()
    }

    /// Allocates a read-write lease of `size` bytes: ALLOC on the appliance with the most free bytes (the next
    /// one when it answers NO_MEMORY, LIMIT or BUSY), a requester QP brought to RTS toward the lease's QP, READY;
    /// from then on the client renews it until it is freed.
    pub fn alloc(&self, size: u64, options: AllocOptions) -> Result<Lease, Error> {
        if size == 0 {
            return Err(Error::Config("a lease of 0 bytes".into()));
        }
        let order = if let Some(f) = &self.inner.fleet {
            f.order(options.prefer)
        } else if self.inner.members().len() == 1 {
            vec![0]
        } else {
            placement::order(&self.free_bytes_figures(), options.prefer)
        };
        let several = order.len() > 1;
        let mut tried = Vec::new();
        for i in order {
            let name = || self.inner.member(i).map(|(s, _)| s.appliance.clone()).unwrap_or_default();
            match lease::open(&self.inner, i, size, options.ttl_ms) {
                Ok(l) => {
                    if let Some(f) = &self.inner.fleet {
                        f.placed(i, l.size());
                    }
                    return Ok(l);
                }
                // No room for us there (NO_MEMORY, LIMIT), or not now (BUSY: draining, over the ALLOC rate, the
                // heap's high-water mark): the next appliance may lend.
                Err(e) if matches!(e.server_code(), Some(ErrorCode::NoMemory | ErrorCode::Limit | ErrorCode::Busy)) => {
                    tried.push((name(), e.to_string()));
                }
                // An appliance that cannot be reached now: the next may.
                Err(e @ (Error::Connection { .. } | Error::Timeout { .. })) if several => {
                    tried.push((name(), e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoMemory { size, tried })
    }

    /// Each appliance's `stats.bytes_free` for our tenant (`None` where STATS failed, it is not connected or it
    /// is draining).
    fn free_bytes_figures(&self) -> Vec<Option<u64>> {
        let sessions: Vec<Arc<Session>> = self.inner.members().iter().map(|m| m.session.clone()).collect();
        sessions
            .iter()
            .enumerate()
            // Draining (the appliance refuses ALLOCs until its leases are revoked) or down: tried last.
            .map(|(i, s)| if s.is_up() && !s.is_draining() { self.free_bytes(i).ok() } else { None })
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
        let (s, _) = self.inner.member(appliance)?;
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

    /// Registers `memory` for zero-copy transfers ([`Lease::write_from`], [`Lease::read_into`]) for as long as
    /// the returned region lives (it borrows the memory). Verbs: registered now on every device context the
    /// client has open, and on others at its first use there (`crate::region`). Dropping the region waits until
    /// no transfer uses it.
    pub fn register<'a>(&self, memory: &'a mut [u8]) -> Result<Region<'a>, Error> {
        if memory.is_empty() {
            return Err(Error::Config("a region of 0 bytes".into()));
        }
        let r = Region::borrowed(memory.as_mut_ptr(), memory.len());
        r.register_in(&self.inner.devices.domains())?;
        Ok(r)
    }

    /// Registers memory the region owns from now on (for batches: [`Client::submit`] takes regions of `'static`
    /// memory); [`Region::bytes`] and [`Region::bytes_mut`] reach it. Dropping the region does not wait: the
    /// memory goes when the last transfer using it is done.
    pub fn register_owned(&self, memory: Vec<u8>) -> Result<Region<'static>, Error> {
        if memory.is_empty() {
            return Err(Error::Config("a region of 0 bytes".into()));
        }
        let r = Region::from_inner(RegionInner::owned(memory));
        r.register_in(&self.inner.devices.domains())?;
        Ok(r)
    }

    /// Registers `len` bytes at `addr` that belong to someone else (a tensor's data, a buffer from a C caller),
    /// as [`Client::register`] does.
    ///
    /// # Safety
    ///
    /// Until the returned region is dropped (or forever, if it is leaked), the memory stays allocated, readable
    /// and writable, and nothing else reads or writes it while a transfer that names it is in flight (a
    /// zero-copy call on a lease runs until its transfer is done; a batch's, from [`Client::submit`] until its
    /// result is given). Dropping the region waits until no transfer uses it; after that the memory is its
    /// owner's again.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(&self, addr: *mut u8, len: usize) -> Result<Region<'static>, Error> {
        if addr.is_null() || len == 0 {
            return Err(Error::Config("a region needs an address and at least one byte".into()));
        }
        let r = Region::borrowed(addr, len);
        r.register_in(&self.inner.devices.domains())?;
        Ok(r)
    }

    /// Starts `ops` (against any leases of this client, on any of its appliances) and returns one ticket per
    /// operation, in order. The client's progress thread runs them, each lease's in order up to its queue depth;
    /// each comes back on its own through [`Client::poll`] or [`Client::wait`] with the bytes moved or its own
    /// error: a range refused, a lease revoked ([`Error::Revoked`]: only that lease's operations fail), an
    /// operation on another client's lease ([`Error::Config`]).
    pub fn submit<'r>(&self, ops: impl IntoIterator<Item = Op<'r>>) -> Vec<Ticket> {
        let engine = &self.inner.engine;
        ops.into_iter()
            .map(|op| {
                let t = engine.ticket();
                let r = if !Arc::ptr_eq(&op.lease.inner, &self.inner) {
                    Err(Error::Config("the operation's lease belongs to another client".into()))
                } else {
                    op.lease.queue(t, op.read, op.lease_offset, &op.pieces)
                };
                match r {
                    Ok(true) => {}
                    Ok(false) => engine.push(t, Ok(0)),
                    Err(e) => engine.push(t, Err(e)),
                }
                t
            })
            .collect()
    }

    /// Up to `max` results of submitted operations that have finished, in the order they finished, without
    /// waiting.
    pub fn poll(&self, max: usize) -> Vec<Completed> {
        self.inner.engine.poll(max)
    }

    /// Waits up to `timeout` for one operation ([`Wait::Ticket`]: its result alone is taken) or for every
    /// operation submitted so far ([`Wait::All`]: every result not taken yet, in the order they finished).
    /// [`Error::Timeout`] when the time ran out (nothing is taken then), [`Error::Config`] for a ticket whose
    /// result was already taken.
    pub fn wait(&self, what: impl Into<Wait>, timeout: Duration) -> Result<Vec<Completed>, Error> {
        self.inner.engine.wait(what.into(), timeout)
    }

    /// A file descriptor that polls readable exactly while results wait to be taken by [`Client::poll`] or
    /// [`Client::wait`] (for an event loop: `poll(2)`, `epoll`; Linux and other Unixes). Do not read or close it:
    /// the client does.
    pub fn completion_fd(&self) -> RawFd {
        self.inner.engine.completion_fd()
    }

    /// Bytes the copying calls ([`Lease::write`], [`Lease::read`] and their batches) have copied between the
    /// caller's buffers and the library's bounce buffers; zero-copy transfers add nothing.
    pub fn bytes_copied(&self) -> u64 {
        self.inner.engine.bytes_copied()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(f) = &self.inner.fleet {
            f.stop();
        }
        self.inner.shutdown();
        self.inner.engine.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requester_specs_name_what_is_wrong() {
        let soft = |s: &str| match RequesterConfig::parse(s, 64) {
            Ok(RequesterConfig::Soft(c)) => c.peer.to_string(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(soft("soft"), "127.0.0.1:4791");
        assert_eq!(soft(" soft:10.0.0.2:4792 "), "10.0.0.2:4792");
        #[cfg(feature = "verbs")]
        match RequesterConfig::parse("verbs:rxe0:1:3", 16) {
            Ok(RequesterConfig::Verbs(v)) => {
                assert_eq!((v.device.as_str(), v.port, v.gid_index, v.depth), ("rxe0", 1, 3, 16));
            }
            other => panic!("{other:?}"),
        }
        #[cfg(not(feature = "verbs"))]
        assert!(RequesterConfig::parse("verbs:rxe0:1:3", 16).unwrap_err().contains("without its `verbs` feature"));
        let err = |s: &str| RequesterConfig::parse(s, 64).unwrap_err();
        assert!(err("verbs:rxe0").contains("verbs takes DEVICE:PORT:GID_INDEX"), "{}", err("verbs:rxe0"));
        assert!(err("verbs::1:1").contains("no device"));
        assert!(err("verbs:rxe0:x:1").contains("the port is 1 to 255"));
        assert!(err("verbs:rxe0:0:1").contains("the port is 1 to 255"));
        assert!(err("verbs:rxe0:1:300").contains("the GID index is 0 to 255"));
        assert!(err("soft:nowhere").contains("not ADDR:PORT"));
        assert!(err("ucx").contains("requester 'ucx': unknown kind"));
        assert!(err("ucx").contains(REQUESTER_SPECS));
    }

    #[test]
    fn the_bindings_configuration_names_what_is_wrong() {
        let addrs = vec!["10.0.0.1:7470".to_string(), " 10.0.0.2:7470".to_string()];
        let key = "000102030405060708090a0b0c0d0e0f";
        let peers = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = ClientConfig::software(&addrs, "demo", key, &[], None).unwrap();
        assert_eq!(c.appliances.len(), 2);
        assert_eq!(c.appliances[1].addr, "10.0.0.2:7470", "addresses are trimmed");
        assert_eq!(c.appliances[0].credentials.key.len(), 16);
        let c = ClientConfig::software(&addrs, "demo", key, &peers(&["1.2.3.4:4791", "5.6.7.8:4791"]), None).unwrap();
        let peer = |i: usize| match &c.appliances[i].requester {
            RequesterConfig::Soft(s) => s.peer.to_string(),
            #[allow(unreachable_patterns)]
            _ => unreachable!(),
        };
        assert_eq!((peer(0), peer(1)), ("1.2.3.4:4791".to_string(), "5.6.7.8:4791".to_string()));
        let t = Duration::from_millis(700);
        let c = ClientConfig::software(&addrs, "demo", key, &[], Some(t)).unwrap();
        assert_eq!((c.timeouts.receive, c.rdma_timeout), (t, t));
        let err = |r: Result<ClientConfig, String>| match r {
            Err(e) => e,
            Ok(_) => panic!("accepted"),
        };
        assert!(err(ClientConfig::software(&[], "demo", key, &[], None)).contains("no appliance"));
        assert!(err(ClientConfig::software(&addrs, "demo", "xyz", &[], None)).starts_with("key:"));
        assert!(err(ClientConfig::software(&addrs, "demo", "", &[], None)).starts_with("key:"));
        // The appliances' key rule, in their words (the C and Python bindings build their configuration here).
        let typed = "0102".repeat(8);
        assert_eq!(
            err(ClientConfig::software(&addrs, "demo", &typed, &[], None)),
            format!("key: {}", leasebox_proto::key::KeyProblem::Weak("is a short pattern repeated"))
        );
        assert_eq!(
            err(ClientConfig::software(&addrs, "demo", "0011", &[], None)),
            "key: key is 2 bytes; keys are 16 to 64 bytes"
        );
        let fleet =
            |k: &str| crate::FleetConfig::software(&["127.0.0.1:2379".into()], None, "demo", k, None).err().unwrap();
        assert!(fleet(&"00".repeat(32)).starts_with("key: the key is one byte repeated: keys must be random"));
        assert!(err(ClientConfig::software(&addrs, "demo", key, &peers(&["nope"]), None)).contains("'nope'"));
        let three = peers(&["1.2.3.4:1", "1.2.3.4:2", "1.2.3.4:3"]);
        assert!(err(ClientConfig::software(&addrs, "demo", key, &three, None)).contains("3 rdma peers for 2"));
        assert!(err(ClientConfig::software(&addrs, "demo", key, &[], Some(Duration::ZERO))).contains("positive"));
    }

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
