//! `leasebox._native`: the Python binding of `leasebox-client` (app/client/src/lib.rs). The package
//! `leasebox` (python/leasebox/__init__.py) re-exports these names; the stubs are python/leasebox/_native.pyi.
//!
//! Every call that waits on the network releases the GIL (so the client's connection threads, which run the
//! `on_event` callback under the GIL, never wait on a caller that holds it). Buffers come in through the buffer
//! protocol: `bytes`, `bytearray`, `memoryview` and anything else exporting bytes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasebox_client::{
    AllocOptions, Callback, Client as RustClient, ClientConfig, Error, Event as RustEvent, FleetConfig,
    Lease as RustLease, LeaseId,
};
use leasebox_proto::{ErrorCode, Request, Response};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
create_exception!(_native, Closed, LeaseboxError, "The lease was freed or its client closed.");

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
        Error::Revoked { .. } => LeaseRevoked::new_err(msg),
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
    #[pyo3(signature = (appliances, tenant, key, *, rdma_peer=None, timeout=None, on_event=None))]
    fn new(
        py: Python<'_>,
        appliances: &Bound<'_, PyAny>,
        tenant: String,
        key: String,
        rdma_peer: Option<&Bound<'_, PyAny>>,
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
        let mut cfg = ClientConfig::software(&addrs, &tenant, &key, &peers, timeout).map_err(ConfigError::new_err)?;
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
    /// own tenant). Returns the outcome: "TornDown", "Fenced" or "NotFound".
    #[pyo3(signature = (lease_id, *, appliance=0))]
    fn revoke(&self, py: Python<'_>, lease_id: &str, appliance: usize) -> PyResult<String> {
        let c = self.get()?;
        let req = Request::Revoke { lease: lease_id_of(lease_id)?, qp_first: false };
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

    /// Reads `len(buf)` bytes at `offset` into `buf` (a writable buffer: bytearray, memoryview, ...).
    fn read_into(&self, py: Python<'_>, offset: u64, buf: &Bound<'_, PyAny>) -> PyResult<()> {
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Client>()?;
    m.add_class::<Lease>()?;
    m.add_class::<Event>()?;
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
