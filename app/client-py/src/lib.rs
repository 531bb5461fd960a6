//! `leasebox._native`: the Python binding of `leasebox-client` (app/client/src/lib.rs). The package
//! `leasebox` (python/leasebox/__init__.py) re-exports these names; the stubs are python/leasebox/_native.pyi.
//!
//! Every call that waits on the network releases the GIL (so the client's connection threads, which run the
//! `on_event` callback under the GIL, never wait on a caller that holds it). Buffers come in through the buffer
//! protocol: `bytes`, `bytearray`, `memoryview` and anything else exporting bytes.
//!
//! The data path (docs/client.md, "The Python data path"): [`Region`]s of the caller's memory (a writable buffer, whose
//! export is held while registered, or a raw address), zero-copy calls on a [`Lease`], and asynchronous
//! batches of [`Op`]s ([`Client::submit`] → [`Ticket`]s, [`Client::poll`] / [`Client::wait`] → [`Completion`]s,
//! [`Client::fileno`] for an event loop; python/leasebox/_aio.py awaits it).
//!
//! Lock order, so no two threads wait on each other: a lease's mutex before a region's lock, leases and regions
//! each taken in address order ([`Client::submit`] takes several).

use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

use leasebox_client::{
    AllocOptions, Callback, Client as RustClient, ClientConfig, Error, Event as RustEvent, FleetConfig,
    Lease as RustLease, LeaseId, MAX_QUEUE_DEPTH, Op as RustOp, Region as RustRegion, RequesterConfig,
    Ticket as RustTicket, Wait,
};
use leasebox_proto::{ErrorCode, Request, Response};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod store;

create_exception!(_native, LeaseboxError, PyException, "Any failure of a Leasebox call.");
create_exception!(_native, ConfigError, LeaseboxError, "A configuration or argument that cannot work.");
create_exception!(
    _native,
    ConnectionLost,
    LeaseboxError,
    "An appliance could not be reached or the connection broke (the client reconnects on its own)."
);
create_exception!(_native, AuthError, LeaseboxError, "The appliance refused the credentials.");
create_exception!(
    _native,
    ServerError,
    LeaseboxError,
    "The appliance refused the request; `code` names its error code."
);
create_exception!(_native, NoMemory, LeaseboxError, "No appliance had memory for the lease.");
create_exception!(
    _native,
    LeaseRevoked,
    LeaseboxError,
    "The lease was revoked or vanished: stop using it, allocate anew."
);
create_exception!(_native, OutOfRange, LeaseboxError, "An offset and length outside the lease; nothing was sent.");
create_exception!(
    _native,
    RdmaError,
    LeaseboxError,
    "An RDMA operation failed while the lease exists: free it and allocate anew."
);
create_exception!(_native, LeaseboxTimeout, LeaseboxError, "No answer or RDMA completion within the deadline.");
create_exception!(_native, Closed, LeaseboxError, "The lease, region or client was freed or closed.");

/// The Python exception for a client library error.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    if matches!(e.server_code(), Some(ErrorCode::AuthFailed | ErrorCode::NotAuthenticated)) {
        return AuthError::new_err(msg);
    }
    match e {
        Error::Config(_) => ConfigError::new_err(msg),
        Error::Connection { source: leasebox_client::ClientError::ServerProof, .. } => AuthError::new_err(msg),
        Error::Connection { .. } => ConnectionLost::new_err(msg),
        Error::Server { .. } => ServerError::new_err(msg),
        Error::NoMemory { .. } => NoMemory::new_err(msg),
        Error::Revoked { lease, outcome } => Python::with_gil(|py| {
            // The outcome and the lease ride on the exception, so a batch's completion says which revoke it was.
            let e = LeaseRevoked::new_err(msg);
            let v = e.value(py);
            let set = v.setattr("outcome", outcome.name()).and_then(|()| v.setattr("lease", lease_text(lease)));
            if let Err(err) = set {
                return err;
            }
            e
        }),
        Error::OutOfRange { .. } => OutOfRange::new_err(msg),
        Error::Rdma { .. } | Error::Requester(_) => RdmaError::new_err(msg),
        Error::Timeout { .. } => LeaseboxTimeout::new_err(msg),
        Error::Closed(_) => Closed::new_err(msg),
    }
}

/// A lease id as text, `SLOT.GENERATION@BOOT` with the appliance's boot id in 32 hex digits (leasectl's
/// notation): a lease id kept across an appliance reboot names nothing (the appliance answers NOT_FOUND).
fn lease_text(id: LeaseId) -> String {
    let boot: String = id.boot_id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}.{}@{boot}", id.slot, id.generation)
}

/// The [`LeaseId`] of a [`lease_text`].
fn lease_id_of(s: &str) -> PyResult<LeaseId> {
    let bad = || {
        pyo3::exceptions::PyValueError::new_err(format!("lease id '{s}' is not SLOT.GENERATION@BOOT (32 hex digits)"))
    };
    let (ids, boot) = s.split_once('@').ok_or_else(bad)?;
    let (slot, generation) = ids.split_once('.').ok_or_else(bad)?;
    let (slot, generation) = (slot.parse().map_err(|_| bad())?, generation.parse().map_err(|_| bad())?);
    if boot.len() != 32 || !boot.is_ascii() {
        return Err(bad());
    }
    let mut boot_id = [0u8; 16];
    for (i, b) in boot_id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&boot[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(LeaseId { boot_id, slot, generation })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// A timeout in seconds as a duration: finite and not negative.
fn seconds(t: f64, what: &str) -> PyResult<Duration> {
    if !(t.is_finite() && t >= 0.0) {
        return Err(PyValueError::new_err(format!("{what} must be a number of seconds, 0 or more")));
    }
    Ok(Duration::from_secs_f64(t.min(365.0 * 86_400.0)))
}

/// One appliance's RDMA requester as Python names it (python/leasebox/config.py makes these): `soft` (the
/// software RoCEv2 requester toward `rdma_peer`), `soft:HOST:PORT` (toward that UDP address), or
/// `verbs:DEVICE:PORT:GID_INDEX` (a real RDMA NIC through libibverbs). `None`: `soft`, as configured.
fn requester_of(spec: &str, queue_depth: usize) -> Result<Option<RequesterConfig>, String> {
    // leasebox-client owns the grammar; a bare `soft` keeps the configured `rdma_peer`.
    if spec.trim() == "soft" {
        return Ok(None);
    }
    RequesterConfig::parse(spec, queue_depth).map(Some)
}

/// The requester argument: one spec (string or an object whose `str()` is one) for every appliance, or a
/// sequence of them, one per appliance.
fn requester_specs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(vec![s]);
    }
    if let Ok(list) = obj.extract::<Vec<Bound<'_, PyAny>>>() {
        return list.iter().map(|o| Ok(o.str()?.to_string())).collect();
    }
    Ok(vec![obj.str()?.to_string()])
}

/// Something that happened to a connection or a lease.
#[pyclass(module = "leasebox", frozen, get_all)]
#[derive(Clone)]
struct Event {
    /// "revoked", "expiring", "fenced", "draining", "reconnected" or "disconnected".
    kind: String,
    /// The appliance's address.
    appliance: String,
    /// The lease's id (revoked, expiring, fenced), else None.
    lease: Option<String>,
    /// The new session (reconnected), else None.
    session_id: Option<u64>,
    /// Milliseconds left (expiring, draining), else None.
    in_ms: Option<u32>,
    /// The revoke's outcome, "TornDown", "Fenced" or "NotFound" (revoked), else None.
    outcome: Option<String>,
    /// Why the connection broke (disconnected), else None.
    reason: Option<String>,
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        let mut parts = vec![format!("kind={:?}", self.kind), format!("appliance={:?}", self.appliance)];
        if let Some(l) = &self.lease {
            parts.push(format!("lease={l}"));
        }
        if let Some(s) = self.session_id {
            parts.push(format!("session_id={s}"));
        }
        if let Some(m) = self.in_ms {
            parts.push(format!("in_ms={m}"));
        }
        if let Some(o) = &self.outcome {
            parts.push(format!("outcome={o:?}"));
        }
        if let Some(r) = &self.reason {
            parts.push(format!("reason={r:?}"));
        }
        format!("Event({})", parts.join(", "))
    }
}

impl From<RustEvent> for Event {
    fn from(e: RustEvent) -> Event {
        let base = |kind: &str, appliance: String| Event {
            kind: kind.into(),
            appliance,
            lease: None,
            session_id: None,
            in_ms: None,
            outcome: None,
            reason: None,
        };
        match e {
            RustEvent::Revoked { appliance, lease, outcome } => Event {
                lease: Some(lease_text(lease)),
                outcome: Some(outcome.name().to_string()),
                ..base("revoked", appliance)
            },
            RustEvent::Expiring { appliance, lease, in_ms } => {
                Event { lease: Some(lease_text(lease)), in_ms: Some(in_ms), ..base("expiring", appliance) }
            }
            RustEvent::Fenced { appliance, lease } => {
                Event { lease: Some(lease_text(lease)), ..base("fenced", appliance) }
            }
            RustEvent::Draining { appliance, in_ms } => Event { in_ms: Some(in_ms), ..base("draining", appliance) },
            RustEvent::Reconnected { appliance, session_id } => {
                Event { session_id: Some(session_id), ..base("reconnected", appliance) }
            }
            RustEvent::Disconnected { appliance, reason } => {
                Event { reason: Some(reason), ..base("disconnected", appliance) }
            }
        }
    }
}

/// A string, or a sequence of strings.
fn one_or_many(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<String>> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect());
    }
    obj.extract::<Vec<String>>()
        .map_err(|_| ConfigError::new_err(format!("{what} must be a string or a sequence of strings")))
}

/// A Python callable as the client's event callback (called on a connection thread, under the GIL).
fn callback(cb: Py<PyAny>) -> Callback {
    Arc::new(move |e: &RustEvent| {
        Python::with_gil(|py| {
            if let Err(err) = cb.call1(py, (Event::from(e.clone()),)) {
                // A failing callback must not stop the client: Python reports it as unraisable.
                err.write_unraisable(py, None);
            }
        });
    })
}

/// Registers the memory of `obj` with client `c` (Client.register, Store.register_buffer): any writable,
/// C-contiguous buffer-protocol object.
fn register_object(c: &RustClient, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Region> {
    // A byte view of any item type (a float32 array too); the cast refuses non-contiguous memory.
    let view = py.import("builtins")?.getattr("memoryview")?.call1((obj,))?;
    if view.getattr("readonly")?.extract::<bool>()? {
        return Err(PyTypeError::new_err("register needs a writable buffer (bytearray, mmap, numpy array, ...)"));
    }
    let view = view.call_method1("cast", ("B",))?;
    let buf = PyBuffer::<u8>::get(&view)?;
    if buf.readonly() || !buf.is_c_contiguous() {
        return Err(PyTypeError::new_err("register needs a writable, C-contiguous buffer"));
    }
    let (addr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    if len == 0 {
        return Err(ConfigError::new_err("a region of 0 bytes"));
    }
    // SAFETY: the buffer export `buf` keeps the memory allocated and in place until the region is closed
    // or collected, which drops the Rust region (waiting until no transfer uses it) before it releases the
    // export (`Region::close`, `Drop for Region`). What the caller does with the object's bytes while a
    // transfer runs is the caller's affair, as with any buffer handed to I/O; it cannot break memory safety
    // of Rust code, which never reads them but through the requester.
    #[allow(unsafe_code)]
    let r = unsafe { c.register_raw(addr as *mut u8, len) }.map_err(py_err)?;
    Ok(Region::new(r, addr, len, obj.clone().unbind(), Some((buf, view.unbind()))))
}

/// A client of one or more appliances: a connection thread per appliance (heartbeats, lease renewals,
/// reconnect), leases placed by free bytes.
#[pyclass(module = "leasebox", frozen)]
struct Client {
    inner: Mutex<Option<Arc<RustClient>>>,
}

impl Client {
    fn get(&self) -> PyResult<Arc<RustClient>> {
        lock(&self.inner).clone().ok_or_else(|| Closed::new_err("the client is closed"))
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (
        appliances, tenant, key, *, rdma_peer=None, requester=None, queue_depth=64, timeout=None, on_event=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        appliances: &Bound<'_, PyAny>,
        tenant: String,
        key: String,
        rdma_peer: Option<&Bound<'_, PyAny>>,
        requester: Option<&Bound<'_, PyAny>>,
        queue_depth: usize,
        timeout: Option<f64>,
        on_event: Option<Py<PyAny>>,
    ) -> PyResult<Client> {
        let addrs = one_or_many(appliances, "appliances")?;
        let peers = match rdma_peer {
            None => Vec::new(),
            Some(p) => one_or_many(p, "rdma_peer")?,
        };
        let timeout = match timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(ConfigError::new_err("timeout must be a positive number of seconds"));
            }
            t => t.map(Duration::from_secs_f64),
        };
        if !(1..=MAX_QUEUE_DEPTH).contains(&queue_depth) {
            return Err(ConfigError::new_err(format!("queue_depth must be 1 to {MAX_QUEUE_DEPTH}")));
        }
        let mut cfg = ClientConfig::software(&addrs, &tenant, &key, &peers, timeout).map_err(ConfigError::new_err)?;
        cfg.queue_depth = queue_depth;
        if let Some(r) = requester {
            let specs = requester_specs(r)?;
            if specs.len() != 1 && specs.len() != addrs.len() {
                return Err(ConfigError::new_err(format!(
                    "{} requesters for {} appliances (give one, or one per appliance)",
                    specs.len(),
                    addrs.len()
                )));
            }
            for (i, a) in cfg.appliances.iter_mut().enumerate() {
                if let Some(rc) =
                    requester_of(&specs[i.min(specs.len() - 1)], queue_depth).map_err(ConfigError::new_err)?
                {
                    a.requester = rc;
                }
            }
        }
        cfg.on_event = on_event.map(callback);
        let c = py.allow_threads(|| RustClient::connect(cfg)).map_err(py_err)?;
        Ok(Client { inner: Mutex::new(Some(Arc::new(c))) })
    }

    /// A client of the appliances etcd advertises (docs/fleet.md): `etcd` is one `HOST:PORT` (comma-separated
    /// allowed) or a list of them. Leases are placed by two random choices weighted by advertised free bytes;
    /// appliances join and leave as their keys do; RDMA goes to each advertisement's `rdma` address. Raises
    /// `NoMemory` when etcd advertises no appliance within `timeout` (default 10 s). TLS to etcd: `etcd_cacert`
    /// (the cluster's CA, PEM), with `etcd_cert` and `etcd_key` when the cluster verifies clients; endpoints may
    /// then be written `https://HOST:PORT`. etcd authentication: `etcd_user` and `etcd_password` (a user whose
    /// role may read `/leasebox/v1/`).
    #[staticmethod]
    #[pyo3(signature = (
        etcd, tenant, key, *, timeout=None, on_event=None, etcd_cacert=None, etcd_cert=None, etcd_key=None,
        etcd_user=None, etcd_password=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn from_etcd(
        py: Python<'_>,
        etcd: &Bound<'_, PyAny>,
        tenant: String,
        key: String,
        timeout: Option<f64>,
        on_event: Option<Py<PyAny>>,
        etcd_cacert: Option<std::path::PathBuf>,
        etcd_cert: Option<std::path::PathBuf>,
        etcd_key: Option<std::path::PathBuf>,
        etcd_user: Option<String>,
        etcd_password: Option<String>,
    ) -> PyResult<Client> {
        let endpoints = one_or_many(etcd, "etcd")?;
        let tls = leasebox_client::TlsFiles::from_options(etcd_cacert, etcd_cert, etcd_key);
        let tls = tls.map_err(|e| ConfigError::new_err(e.replace("--etcd-", "etcd_")))?;
        let timeout = match timeout {
            Some(t) if !(t.is_finite() && t > 0.0) => {
                return Err(ConfigError::new_err("timeout must be a positive number of seconds"));
            }
            t => t.map(Duration::from_secs_f64),
        };
        // The options' names as Python spells them.
        let cfg = FleetConfig::software(&endpoints, tls, &tenant, &key, timeout);
        let mut cfg = cfg.map_err(|e| ConfigError::new_err(e.replace("--etcd-", "etcd_")))?;
        cfg.etcd_user = match (etcd_user, etcd_password) {
            (None, None) => None,
            (Some(name), Some(password)) if !name.is_empty() && !password.is_empty() => {
                Some(leasebox_client::EtcdUser { name, password })
            }
            _ => return Err(ConfigError::new_err("etcd_user and etcd_password go together, neither empty")),
        };
        cfg.on_event = on_event.map(callback);
        let c = py.allow_threads(|| RustClient::connect_fleet(cfg)).map_err(py_err)?;
        Ok(Client { inner: Mutex::new(Some(Arc::new(c))) })
    }

    /// The appliances' addresses, in the order given.
    #[getter]
    fn appliances(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.appliances())
    }

    /// Allocates a lease of at least `size` bytes, ready for RDMA. Prefer few large leases (each costs the
    /// appliance a queue pair) with your own index of blocks inside them.
    #[pyo3(signature = (size, *, ttl_ms=0, prefer=None))]
    fn alloc(&self, py: Python<'_>, size: u64, ttl_ms: u32, prefer: Option<usize>) -> PyResult<Lease> {
        let c = self.get()?;
        let l = py.allow_threads(|| c.alloc(size, AllocOptions { ttl_ms, prefer })).map_err(py_err)?;
        Ok(Lease {
            id: lease_text(l.id()),
            size: l.size(),
            appliance: l.appliance().to_string(),
            inner: Mutex::new(Some(l)),
        })
    }

    /// The bytes this tenant may still take on appliance `appliance` (its index).
    #[pyo3(signature = (appliance=0))]
    fn free_bytes(&self, py: Python<'_>, appliance: usize) -> PyResult<u64> {
        let c = self.get()?;
        py.allow_threads(|| c.free_bytes(appliance)).map_err(py_err)
    }

    /// REVOKE a lease by id on appliance `appliance` (the operator's command: an admin client, or the lease's
    /// own tenant). `qp_first`: the appliance moves the lease's QP to the error state before it destroys the
    /// MKEY (the default, False, destroys the MKEY first; docs/lease-service.md). Returns the outcome:
    /// "TornDown", "Fenced" or "NotFound".
    #[pyo3(signature = (lease_id, *, appliance=0, qp_first=false))]
    fn revoke(&self, py: Python<'_>, lease_id: &str, appliance: usize, qp_first: bool) -> PyResult<String> {
        let c = self.get()?;
        let req = Request::Revoke { lease: lease_id_of(lease_id)?, qp_first };
        match py.allow_threads(|| c.call(appliance, req)).map_err(py_err)? {
            Response::Revoke { outcome, .. } => Ok(outcome.name().to_string()),
            other => Err(LeaseboxError::new_err(format!("REVOKE answered {other:?}"))),
        }
    }

    /// The next event, waiting at most `timeout` seconds (0: only one already queued); None if none came.
    #[pyo3(signature = (timeout=0.0))]
    fn next_event(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Event>> {
        let c = self.get()?;
        let wait = Duration::from_secs_f64(timeout.clamp(0.0, 86_400.0));
        Ok(py.allow_threads(|| c.recv_event(wait)).map(Event::from))
    }

    /// Every event queued now.
    fn events(&self) -> PyResult<Vec<Event>> {
        Ok(self.get()?.try_events().into_iter().map(Event::from).collect())
    }

    /// Registers the memory of `obj` for zero-copy transfers: any writable, C-contiguous buffer-protocol
    /// object (bytearray, memoryview, mmap, a numpy array, ...). The region holds `obj` and its buffer export
    /// until it is closed, so the memory cannot move or be freed meanwhile (a bytearray cannot be resized, an
    /// mmap cannot be closed: they raise BufferError).
    fn register(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Region> {
        let c = self.get()?;
        register_object(&c, py, obj)
    }

    /// Registers `length` bytes at `address` that belong to someone else (a tensor's `data_ptr()`, memory from
    /// ctypes or a C library). `owner`, if given, is kept alive while the region is registered. The caller
    /// promises that the memory stays allocated and in place until the region is closed (or collected).
    #[pyo3(signature = (address, length, owner=None))]
    fn register_raw(&self, address: usize, length: usize, owner: Option<Py<PyAny>>) -> PyResult<Region> {
        let c = self.get()?;
        if address == 0 || length == 0 {
            return Err(ConfigError::new_err("register_raw needs an address and at least one byte"));
        }
        if address.checked_add(length).is_none() {
            return Err(ConfigError::new_err("address + length overflows"));
        }
        // SAFETY: the caller's promise above (documented in the stubs and docs/client.md, as for ctypes); the
        // region is dropped, waiting for every transfer naming it, before `owner` is let go.
        #[allow(unsafe_code)]
        let r = unsafe { c.register_raw(address as *mut u8, length) }.map_err(py_err)?;
        let owner = owner.unwrap_or_else(|| Python::with_gil(|py| py.None()));
        Ok(Region::new(r, address, length, owner, None))
    }

    /// Starts `ops` (Op objects, against any leases of this client) and returns one Ticket per operation, in
    /// order. Each comes back on its own through `poll`, `wait` or `completions`. Raises (and starts
    /// nothing) if an op's lease was freed or its region closed.
    fn submit(&self, py: Python<'_>, ops: Vec<Bound<'_, Op>>) -> PyResult<Vec<Ticket>> {
        let c = self.get()?;
        let ops: Vec<&Op> = ops.iter().map(|o| o.get()).collect();
        let mut leases: Vec<&Lease> = ops.iter().map(|o| o.lease.get()).collect();
        let mut regions: Vec<&Region> = ops.iter().flat_map(|o| o.pieces.iter().map(|p| p.0.get())).collect();
        // Each lock once, in address order (see the module documentation).
        leases.sort_by_key(|l| *l as *const Lease as usize);
        leases.dedup_by_key(|l| *l as *const Lease as usize);
        regions.sort_by_key(|r| *r as *const Region as usize);
        regions.dedup_by_key(|r| *r as *const Region as usize);
        let tickets = py.allow_threads(|| -> Result<Vec<RustTicket>, Error> {
            let lease_guards: Vec<_> = leases.iter().map(|l| (*l as *const Lease as usize, lock(&l.inner))).collect();
            let region_guards: Vec<_> =
                regions.iter().map(|r| (*r as *const Region as usize, read(&r.region))).collect();
            let find_lease = |l: &Lease| {
                let at = l as *const Lease as usize;
                lease_guards.iter().find(|g| g.0 == at).and_then(|g| g.1.as_ref())
            };
            let find_region = |r: &Region| {
                let at = r as *const Region as usize;
                region_guards.iter().find(|g| g.0 == at).and_then(|g| g.1.as_ref())
            };
            let mut built = Vec::with_capacity(ops.len());
            for o in &ops {
                let lease = find_lease(o.lease.get()).ok_or(Error::Closed("an op's lease was freed"))?;
                let mut pieces = Vec::with_capacity(o.pieces.len());
                for (r, at, n) in &o.pieces {
                    pieces.push((find_region(r.get()).ok_or(Error::Closed("an op's region is closed"))?, *at, *n));
                }
                built.push(if o.read {
                    RustOp::read_into_sg(lease, &pieces, o.lease_offset)
                } else {
                    RustOp::write_from_sg(lease, &pieces, o.lease_offset)
                });
            }
            Ok(c.submit(built))
        });
        Ok(tickets.map_err(py_err)?.into_iter().map(|t| Ticket { t }).collect())
    }

    /// The results of submitted operations that have finished (at most `max`; all by default), in the order
    /// they finished, without waiting.
    #[pyo3(signature = (max=None))]
    fn poll(&self, py: Python<'_>, max: Option<usize>) -> PyResult<Vec<Completion>> {
        let c = self.get()?;
        Ok(c.poll(max.unwrap_or(usize::MAX)).into_iter().map(|done| Completion::new(py, done)).collect())
    }

    /// Waits for `ticket`'s result (a list of one), or with no ticket for every operation submitted so far
    /// (the results not taken yet, in the order they finished). `timeout` in seconds (None: no limit; Ctrl-C
    /// still interrupts); raises LeaseboxTimeout when it runs out (nothing is taken then), ConfigError for a
    /// ticket whose result was already taken.
    #[pyo3(signature = (ticket=None, timeout=None))]
    fn wait(&self, py: Python<'_>, ticket: Option<Ticket>, timeout: Option<f64>) -> PyResult<Vec<Completion>> {
        let c = self.get()?;
        let what = ticket.map_or(Wait::All, |t| Wait::Ticket(t.t));
        let end = timeout.map(|t| seconds(t, "timeout")).transpose()?.map(|d| Instant::now() + d);
        // Slices, so a signal (Ctrl-C) is seen while waiting without a limit.
        const SLICE: Duration = Duration::from_millis(100);
        loop {
            let left = end.map_or(SLICE, |e| e.saturating_duration_since(Instant::now()).min(SLICE));
            match py.allow_threads(|| c.wait(what, left)) {
                Ok(done) => return Ok(done.into_iter().map(|d| Completion::new(py, d)).collect()),
                Err(Error::Timeout { .. }) if end.is_none_or(|e| Instant::now() < e) => py.check_signals()?,
                Err(e) => return Err(py_err(e)),
            }
        }
    }

    /// The completion fd: readable exactly while results wait to be taken (for select/poll/epoll and asyncio's
    /// `loop.add_reader`). Do not read or close it.
    fn fileno(&self) -> PyResult<i32> {
        Ok(self.get()?.completion_fd())
    }

    /// An awaitable of the next results (at least one; at most `max`), waiting on the completion fd in the
    /// running asyncio loop (python/leasebox/_aio.py). One awaiter per client at a time.
    #[pyo3(signature = (max=None))]
    fn completions(slf: &Bound<'_, Self>, max: Option<usize>) -> PyResult<Py<PyAny>> {
        let aio = slf.py().import("leasebox._aio")?;
        Ok(aio.getattr("completions")?.call1((slf, max))?.unbind())
    }

    /// Bytes the copying calls (write, read and their batches) copied through the library's bounce buffers;
    /// zero-copy calls and ops add nothing.
    #[getter]
    fn bytes_copied(&self) -> PyResult<u64> {
        Ok(self.get()?.bytes_copied())
    }

    /// Frees the leases the client still tracks, says BYE and ends its threads. Idempotent.
    fn close(&self, py: Python<'_>) {
        let c = lock(&self.inner).take();
        py.allow_threads(|| drop(c));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: PyObject, _v: PyObject, _tb: PyObject) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(c) => format!("Client(appliances={:?})", c.appliances()),
            None => "Client(closed)".into(),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Joining the connection threads while holding the GIL could wait on a callback that waits for it.
        if let Some(c) = lock(&self.inner).take() {
            Python::with_gil(|py| py.allow_threads(|| drop(c)));
        }
    }
}

/// A lease: `size` bytes of appliance memory, read and written by offset over RDMA.
#[pyclass(module = "leasebox", frozen)]
struct Lease {
    id: String,
    size: u64,
    appliance: String,
    inner: Mutex<Option<RustLease>>,
}

impl Lease {
    /// Runs `f` on the lease without the GIL.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut RustLease) -> Result<T, Error> + Send) -> PyResult<T> {
        py.allow_threads(|| {
            let mut g = lock(&self.inner);
            match g.as_mut() {
                Some(l) => f(l),
                None => Err(Error::Closed("the lease was freed")),
            }
        })
        .map_err(py_err)
    }
}

impl Lease {
    /// A zero-copy write or read of `pieces` at `lease_offset`, waited for without the GIL.
    fn zero_copy(&self, py: Python<'_>, read: bool, pieces: Vec<(&Region, usize, usize)>, at: u64) -> PyResult<()> {
        let mut sorted: Vec<&Region> = pieces.iter().map(|p| p.0).collect();
        sorted.sort_by_key(|r| *r as *const Region as usize);
        sorted.dedup_by_key(|r| *r as *const Region as usize);
        self.with(py, |l| {
            let guards: Vec<_> = sorted.iter().map(|r| (*r as *const Region as usize, self::read(&r.region))).collect();
            let mut list = Vec::with_capacity(pieces.len());
            for (r, off, n) in &pieces {
                let at = *r as *const Region as usize;
                let g = guards.iter().find(|g| g.0 == at).and_then(|g| g.1.as_ref());
                list.push((g.ok_or(Error::Closed("the region is closed"))?, *off, *n));
            }
            if read { l.read_into_sg(&list, at) } else { l.write_from_sg(&list, at) }
        })
    }
}

/// Scatter/gather pieces, `(region, offset, length)` each.
fn pieces_of<'py>(items: &[Bound<'py, PyAny>]) -> PyResult<Vec<(Bound<'py, Region>, usize, usize)>> {
    items
        .iter()
        .map(|p| {
            let (r, at, n): (Bound<'py, PyAny>, usize, usize) =
                p.extract().map_err(|_| PyTypeError::new_err("a piece is a tuple (region, offset, length)"))?;
            let r =
                r.downcast_into::<Region>().map_err(|_| PyTypeError::new_err("a piece's first item is a Region"))?;
            Ok((r, at, n))
        })
        .collect()
}

/// The bytes of a buffer-protocol object (bytes, bytearray, memoryview, ...).
fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let buf = PyBuffer::<u8>::get(obj)?;
    buf.to_vec(obj.py())
}

#[pymethods]
impl Lease {
    /// The lease's id, `SLOT.GENERATION@BOOT`.
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    /// The lease's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The appliance's address.
    #[getter]
    fn appliance(&self) -> String {
        self.appliance.clone()
    }

    /// The revoke's outcome once the client knows the lease is gone ("TornDown", "Fenced", "NotFound"), else
    /// None.
    #[getter]
    fn revoked(&self) -> Option<String> {
        lock(&self.inner).as_ref().and_then(|l| l.revoked()).map(|o| o.name().to_string())
    }

    fn __len__(&self) -> usize {
        self.size as usize
    }

    /// The most pieces one scatter/gather call or Op may have on this lease.
    #[getter]
    fn max_sge(&self) -> PyResult<usize> {
        lock(&self.inner).as_ref().map(|l| l.max_sge()).ok_or_else(|| Closed::new_err("the lease was freed"))
    }

    /// Work requests this lease keeps posted at most (the client's `queue_depth` unless set here, 1 to 4096).
    #[getter]
    fn get_queue_depth(&self) -> PyResult<usize> {
        lock(&self.inner).as_ref().map(|l| l.queue_depth()).ok_or_else(|| Closed::new_err("the lease was freed"))
    }

    #[setter]
    fn set_queue_depth(&self, depth: usize) -> PyResult<()> {
        if !(1..=MAX_QUEUE_DEPTH).contains(&depth) {
            return Err(PyValueError::new_err(format!("queue_depth must be 1 to {MAX_QUEUE_DEPTH}")));
        }
        let g = lock(&self.inner);
        g.as_ref().ok_or_else(|| Closed::new_err("the lease was freed"))?.set_queue_depth(depth);
        Ok(())
    }

    /// Zero copy: writes `length` bytes at `offset` in `region` to `lease_offset`, straight from the region;
    /// returns once the write completed.
    fn write_from(
        &self,
        py: Python<'_>,
        region: &Bound<'_, Region>,
        offset: usize,
        lease_offset: u64,
        length: usize,
    ) -> PyResult<()> {
        self.zero_copy(py, false, vec![(region.get(), offset, length)], lease_offset)
    }

    /// Zero copy, gathered: one write of `pieces`, `[(region, offset, length), ...]` in order (at most
    /// `max_sge`), to `lease_offset`.
    fn write_from_sg(&self, py: Python<'_>, pieces: Vec<Bound<'_, PyAny>>, lease_offset: u64) -> PyResult<()> {
        let pieces = pieces_of(&pieces)?;
        self.zero_copy(py, false, pieces.iter().map(|(r, a, n)| (r.get(), *a, *n)).collect(), lease_offset)
    }

    /// Zero copy, scattered: one read from `lease_offset` into `pieces`, `[(region, offset, length), ...]` in
    /// order (at most `max_sge`).
    fn read_into_sg(&self, py: Python<'_>, pieces: Vec<Bound<'_, PyAny>>, lease_offset: u64) -> PyResult<()> {
        let pieces = pieces_of(&pieces)?;
        self.zero_copy(py, true, pieces.iter().map(|(r, a, n)| (r.get(), *a, *n)).collect(), lease_offset)
    }

    /// Writes `data` (bytes, bytearray, memoryview, ...) at `offset`; returns once it is acknowledged.
    fn write(&self, py: Python<'_>, offset: u64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let data = bytes_of(data)?;
        self.with(py, |l| l.write(offset, &data))
    }

    /// Reads `length` bytes at `offset`.
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: usize) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; length];
        self.with(py, |l| l.read(offset, &mut buf))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Two forms. `read_into(region, offset, lease_offset, length)`: zero copy, `length` bytes at
    /// `lease_offset` straight into `region` at `offset`. `read_into(offset, buf)`: copies `len(buf)` bytes at
    /// `offset` into `buf` (a writable buffer: bytearray, memoryview, ...).
    #[pyo3(signature = (target, offset, lease_offset=None, length=None))]
    fn read_into(
        &self,
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        offset: &Bound<'_, PyAny>,
        lease_offset: Option<u64>,
        length: Option<usize>,
    ) -> PyResult<()> {
        if let Ok(region) = target.downcast::<Region>() {
            let (Some(lease_offset), Some(length)) = (lease_offset, length) else {
                return Err(PyTypeError::new_err("read_into(region, offset, lease_offset, length)"));
            };
            return self.zero_copy(py, true, vec![(region.get(), offset.extract()?, length)], lease_offset);
        }
        if lease_offset.is_some() || length.is_some() {
            return Err(PyTypeError::new_err(
                "read_into(offset, buf) or read_into(region, offset, lease_offset, length)",
            ));
        }
        let (offset, buf) = (target.extract::<u64>()?, offset);
        let target = PyBuffer::<u8>::get(buf)?;
        if target.readonly() {
            return Err(pyo3::exceptions::PyTypeError::new_err("read_into needs a writable buffer"));
        }
        let mut data = vec![0u8; target.item_count()];
        self.with(py, |l| l.read(offset, &mut data))?;
        target.copy_from_slice(py, &data)
    }

    /// Several writes, `[(offset, data), ...]`, pipelined; returns once all are acknowledged.
    fn write_many(&self, py: Python<'_>, items: Vec<(u64, Bound<'_, PyAny>)>) -> PyResult<()> {
        let owned = items.iter().map(|(o, d)| Ok((*o, bytes_of(d)?))).collect::<PyResult<Vec<_>>>()?;
        self.with(py, |l| {
            let ops: Vec<(u64, &[u8])> = owned.iter().map(|(o, d)| (*o, d.as_slice())).collect();
            l.write_many(&ops)
        })
    }

    /// Several reads, `[(offset, length), ...]`, pipelined; returns the bytes of each.
    fn read_many<'py>(&self, py: Python<'py>, items: Vec<(u64, usize)>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let mut bufs: Vec<(u64, Vec<u8>)> = items.iter().map(|&(o, n)| (o, vec![0u8; n])).collect();
        self.with(py, |l| {
            let mut ops: Vec<(u64, &mut [u8])> = bufs.iter_mut().map(|(o, b)| (*o, b.as_mut_slice())).collect();
            l.read_many(&mut ops)
        })?;
        Ok(bufs.iter().map(|(_, b)| PyBytes::new(py, b)).collect())
    }

    /// Gives the memory back (FREE); returns the outcome. Raises LeaseRevoked if the appliance took it back
    /// already. Later calls raise Closed.
    fn free(&self, py: Python<'_>) -> PyResult<String> {
        let l = lock(&self.inner).take().ok_or_else(|| Closed::new_err("the lease was freed"))?;
        py.allow_threads(|| l.free()).map(|o| o.name().to_string()).map_err(py_err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Frees the lease unless it is already freed or revoked.
    fn __exit__(&self, py: Python<'_>, _t: PyObject, _v: PyObject, _tb: PyObject) -> bool {
        if let Some(l) = lock(&self.inner).take() {
            let _ = py.allow_threads(|| l.free());
        }
        false
    }

    fn __repr__(&self) -> String {
        format!("Lease(id={}, size={}, appliance={:?})", self.id, self.size, self.appliance)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(l) = lock(&self.inner).take() {
            Python::with_gil(|py| py.allow_threads(|| drop(l)));
        }
    }
}

/// Memory registered for zero-copy transfers ([`Client::register`], [`Client::register_raw`]).
#[pyclass(module = "leasebox", frozen)]
struct Region {
    /// The client library's region: read-locked by every call that names it, taken by `close`.
    region: RwLock<Option<RustRegion<'static>>>,
    addr: usize,
    len: usize,
    /// The registered object (register) or the owner given (register_raw), until the region is closed.
    obj: Mutex<Option<Py<PyAny>>>,
    /// The byte view of `obj` and its buffer export (register), released after the Rust region is gone.
    export: Mutex<Option<(PyBuffer<u8>, Py<PyAny>)>>,
}

impl Region {
    fn new(
        region: RustRegion<'static>,
        addr: usize,
        len: usize,
        obj: Py<PyAny>,
        export: Option<(PyBuffer<u8>, Py<PyAny>)>,
    ) -> Region {
        Region { region: RwLock::new(Some(region)), addr, len, obj: Mutex::new(Some(obj)), export: Mutex::new(export) }
    }
}

#[pymethods]
impl Region {
    /// The memory's address.
    #[getter]
    fn address(&self) -> usize {
        self.addr
    }

    /// Its length in bytes.
    #[getter]
    fn length(&self) -> usize {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// The registered object (or register_raw's owner); None once closed.
    #[getter]
    fn obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.obj).as_ref().map(|o| o.clone_ref(py))
    }

    /// Whether a transfer uses it now.
    #[getter]
    fn in_use(&self) -> bool {
        read(&self.region).as_ref().is_some_and(|r| r.in_use())
    }

    #[getter]
    fn closed(&self) -> bool {
        read(&self.region).is_none()
    }

    /// Deregisters the region and lets go of the object. It waits until no transfer uses the memory (a
    /// zero-copy call running, a submitted op whose result is not in yet): the memory is never given back
    /// while the NIC may read or write it; every transfer ends within the client's RDMA timeout. With
    /// `timeout` (seconds) it waits at most that long, then raises LeaseboxTimeout and stays registered.
    /// Idempotent.
    #[pyo3(signature = (timeout=None))]
    fn close(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let end = timeout.map(|t| seconds(t, "timeout")).transpose()?.map(|d| Instant::now() + d);
        let taken = py.allow_threads(|| {
            // The write lock waits for zero-copy calls that name the region (they hold it read-locked).
            let mut g = match end {
                None => write(&self.region),
                Some(end) => loop {
                    match self.region.try_write() {
                        Ok(g) => break g,
                        Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                        Err(TryLockError::WouldBlock) if Instant::now() >= end => return Err(()),
                        Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
                    }
                },
            };
            if let (Some(end), Some(r)) = (end, g.as_ref()) {
                // Submitted transfers hold it without the lock.
                if !r.wait_idle(end.saturating_duration_since(Instant::now())) {
                    return Err(());
                }
            }
            let r = g.take();
            // Dropping it waits until no transfer uses it, then deregisters (leasebox-client's Region).
            drop(r);
            Ok(())
        });
        if taken.is_err() {
            return Err(LeaseboxTimeout::new_err(
                "the region is still in use by a transfer; it stays registered (close() without a timeout waits)",
            ));
        }
        // The export goes only now: the memory was the NIC's until the region was dropped.
        drop(lock(&self.export).take());
        drop(lock(&self.obj).take());
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: PyObject, _v: PyObject, _tb: PyObject) -> PyResult<bool> {
        self.close(py, None)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { ", closed" } else { "" };
        format!("Region(address={:#x}, length={}{state})", self.addr, self.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let r = write(&self.region).take();
        if r.is_some() {
            // Waits for the transfers that use it; without the GIL, which they may need to finish.
            Python::with_gil(|py| py.allow_threads(|| drop(r)));
        }
        // `export` (the buffer release) drops after this, with the GIL (PyBuffer's own Drop takes it).
    }
}

/// A zero-copy write or read for [`Client::submit`]; made by `Op.write_from`, `Op.read_into` and their `_sg`
/// forms. Nothing is checked until it is submitted: a bad range, too many pieces, ... come back as that
/// operation's error.
#[pyclass(module = "leasebox", frozen)]
struct Op {
    lease: Py<Lease>,
    read: bool,
    lease_offset: u64,
    pieces: Vec<(Py<Region>, usize, usize)>,
}

impl Op {
    fn one(lease: Py<Lease>, read: bool, region: Py<Region>, offset: usize, lease_offset: u64, length: usize) -> Op {
        Op { lease, read, lease_offset, pieces: vec![(region, offset, length)] }
    }

    fn sg(lease: Py<Lease>, read: bool, pieces: &[Bound<'_, PyAny>], lease_offset: u64) -> PyResult<Op> {
        let pieces = pieces_of(pieces)?.into_iter().map(|(r, a, n)| (r.unbind(), a, n)).collect();
        Ok(Op { lease, read, lease_offset, pieces })
    }
}

#[pymethods]
impl Op {
    /// RDMA WRITE of `length` bytes at `offset` in `region` to `lease_offset` in `lease`.
    #[staticmethod]
    fn write_from(lease: Py<Lease>, region: Py<Region>, offset: usize, lease_offset: u64, length: usize) -> Op {
        Op::one(lease, false, region, offset, lease_offset, length)
    }

    /// RDMA READ of `length` bytes at `lease_offset` in `lease` into `region` at `offset`.
    #[staticmethod]
    fn read_into(lease: Py<Lease>, region: Py<Region>, offset: usize, lease_offset: u64, length: usize) -> Op {
        Op::one(lease, true, region, offset, lease_offset, length)
    }

    /// One WRITE gathered from `pieces`, `[(region, offset, length), ...]`, to `lease_offset`.
    #[staticmethod]
    fn write_from_sg(lease: Py<Lease>, pieces: Vec<Bound<'_, PyAny>>, lease_offset: u64) -> PyResult<Op> {
        Op::sg(lease, false, &pieces, lease_offset)
    }

    /// One READ from `lease_offset` scattered into `pieces`, `[(region, offset, length), ...]`.
    #[staticmethod]
    fn read_into_sg(lease: Py<Lease>, pieces: Vec<Bound<'_, PyAny>>, lease_offset: u64) -> PyResult<Op> {
        Op::sg(lease, true, &pieces, lease_offset)
    }

    /// Its length in bytes.
    fn __len__(&self) -> usize {
        self.pieces.iter().map(|p| p.2).sum()
    }

    fn __repr__(&self) -> String {
        let kind = if self.read { "read_into" } else { "write_from" };
        format!(
            "Op({kind}, lease_offset={}, pieces={}, length={})",
            self.lease_offset,
            self.pieces.len(),
            self.__len__()
        )
    }
}

/// One submitted operation's handle (hashable; equal tickets name the same operation).
#[pyclass(module = "leasebox", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
struct Ticket {
    t: RustTicket,
}

#[pymethods]
impl Ticket {
    /// Its number (increasing within a client).
    #[getter]
    fn id(&self) -> u64 {
        self.t.id()
    }

    fn __int__(&self) -> u64 {
        self.t.id()
    }

    fn __repr__(&self) -> String {
        format!("Ticket({})", self.t.id())
    }
}

/// One finished operation: its ticket, the bytes it moved, or its error.
#[pyclass(module = "leasebox", frozen, get_all)]
struct Completion {
    ticket: Ticket,
    /// Bytes moved (0 when it failed).
    length: usize,
    /// "ok", or the failure: "revoked", "rdma", "timeout", "out_of_range", "closed", "config", "connection",
    /// "server", "no_memory".
    status: String,
    /// The exception it failed with (a LeaseboxError subclass), else None.
    error: Option<Py<PyAny>>,
    /// The revoke's outcome ("TornDown", "Fenced", "NotFound") when status is "revoked", else None.
    outcome: Option<String>,
}

impl Completion {
    fn new(py: Python<'_>, (t, r): (RustTicket, Result<usize, Error>)) -> Completion {
        let ticket = Ticket { t };
        match r {
            Ok(length) => Completion { ticket, length, status: "ok".into(), error: None, outcome: None },
            Err(e) => {
                let status = match &e {
                    Error::Revoked { .. } => "revoked",
                    Error::Rdma { .. } | Error::Requester(_) => "rdma",
                    Error::Timeout { .. } => "timeout",
                    Error::OutOfRange { .. } => "out_of_range",
                    Error::Closed(_) => "closed",
                    Error::Config(_) => "config",
                    Error::Connection { .. } => "connection",
                    Error::Server { .. } => "server",
                    Error::NoMemory { .. } => "no_memory",
                };
                let outcome = match &e {
                    Error::Revoked { outcome, .. } => Some(outcome.name().to_string()),
                    _ => None,
                };
                let error = py_err(e).into_value(py).into_any();
                Completion { ticket, length: 0, status: status.into(), error: Some(error), outcome }
            }
        }
    }
}

#[pymethods]
impl Completion {
    /// Whether it succeeded.
    #[getter]
    fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// The bytes moved, or raises its error.
    fn result(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.error {
            None => Ok(self.length),
            Some(e) => Err(PyErr::from_value(e.bind(py).clone())),
        }
    }

    fn __repr__(&self) -> String {
        match &self.outcome {
            Some(o) => format!("Completion({}, status={:?}, outcome={o:?})", self.ticket.t.id(), self.status),
            None if self.error.is_none() => format!("Completion({}, length={})", self.ticket.t.id(), self.length),
            None => format!("Completion({}, status={:?})", self.ticket.t.id(), self.status),
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Client>()?;
    m.add_class::<Lease>()?;
    m.add_class::<Event>()?;
    m.add_class::<Region>()?;
    m.add_class::<Op>()?;
    m.add_class::<Ticket>()?;
    m.add_class::<Completion>()?;
    m.add_class::<store::Store>()?;
    store::add_codes(m)?;
    m.add("LeaseboxError", py.get_type::<LeaseboxError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ConnectionLost", py.get_type::<ConnectionLost>())?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("NoMemory", py.get_type::<NoMemory>())?;
    m.add("LeaseRevoked", py.get_type::<LeaseRevoked>())?;
    m.add("OutOfRange", py.get_type::<OutOfRange>())?;
    m.add("RdmaError", py.get_type::<RdmaError>())?;
    m.add("LeaseboxTimeout", py.get_type::<LeaseboxTimeout>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
