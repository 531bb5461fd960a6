//! `leasebox._native.Store`: the Python binding of `leasebox_client::Store` (the key-value tier, docs/kv.md),
//! re-exported by python/leasebox/kv.py. Integer results follow Mooncake Store's convention: `>= 0` success
//! (bytes for reads), negative a code (`OK`, `NOT_FOUND`, `REVOKED`, `TOO_LARGE`, `NO_SPACE`, `TIMEOUT`,
//! `FAILED`). Every call that waits releases the GIL.
//!
//! Rust `log` records (the store's revokes, drains, migrations) reach Python's `logging` (logger
//! `leasebox.<target>`, `leasebox_client::store` → `leasebox.client.store`): a [`log::Log`] here queues them (bounded), and every call of this module passes the
//! queue to `logging` with the GIL held, so no thread of the client ever waits for the GIL.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once, RwLockReadGuard};
use std::time::Duration;

use leasebox_client::store::{self as kv, BatchTicket, GetItem, PutItem, StoreEvent};
use leasebox_client::{Region as RustRegion, Store as RustStore, StoreOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::{Closed, ConfigError, LeaseboxError, LeaseboxTimeout, Region, lease_text, lock, py_err, read};

/// Log records queued at most between two calls (older ones are dropped first).
const LOG_QUEUE: usize = 1024;

struct Bridge {
    q: Mutex<VecDeque<(log::Level, String, String)>>,
}

static BRIDGE: Bridge = Bridge { q: Mutex::new(VecDeque::new()) };
static INSTALL: Once = Once::new();

impl log::Log for Bridge {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("leasebox")
    }

    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= LOG_QUEUE {
            q.pop_front();
        }
        q.push_back((r.level(), r.target().replace("::", "."), r.args().to_string()));
    }

    fn flush(&self) {}
}

/// Installs the bridge (once; a program that set another `log` logger keeps its own).
pub(crate) fn install_logging() {
    INSTALL.call_once(|| {
        if log::set_logger(&BRIDGE).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    });
}

/// Hands the queued records to `logging` (with the GIL).
pub(crate) fn flush_logs(py: Python<'_>) {
    let records: Vec<_> = BRIDGE.q.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
    if records.is_empty() {
        return;
    }
    let Ok(logging) = py.import("logging") else { return };
    for (level, target, msg) in records {
        let lvl = match level {
            log::Level::Error => 40,
            log::Level::Warn => 30,
            log::Level::Info => 20,
            log::Level::Debug | log::Level::Trace => 10,
        };
        // Under the `leasebox` logger: `leasebox_client::store` → `leasebox.client.store`.
        let name = match target.strip_prefix("leasebox_") {
            Some(rest) => format!("leasebox.{rest}"),
            None => format!("leasebox.{target}"),
        };
        if let Ok(logger) = logging.call_method1("getLogger", (name,)) {
            let _ = logger.call_method1("log", (lvl, msg));
        }
    }
}

/// A key: bytes, or text (UTF-8).
fn key_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(s.to_str()?.as_bytes().to_vec());
    }
    crate::bytes_of(obj).map_err(|_| pyo3::exceptions::PyTypeError::new_err("a key is bytes (or str)"))
}

fn keys_of(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<Vec<u8>>> {
    objs.iter().map(key_of).collect()
}

/// The Rust region of a Python one, read-locked for the call.
fn region_of<'a>(r: &'a Bound<'_, Region>) -> PyResult<RwLockReadGuard<'a, Option<RustRegion<'static>>>> {
    let g = read(&r.get().region);
    if g.is_none() {
        return Err(Closed::new_err("the region is closed"));
    }
    Ok(g)
}

fn same_len(what: &str, n: usize, others: &[(&str, usize)]) -> PyResult<()> {
    for (name, m) in others {
        if *m != n {
            return Err(PyValueError::new_err(format!("{what}: {n} keys but {m} {name}")));
        }
    }
    Ok(())
}

/// A key-value store over leases (docs/kv.md): `Store.open(url, key_file=...)`.
#[pyclass(module = "leasebox", frozen)]
pub(crate) struct Store {
    inner: Mutex<Option<Arc<RustStore>>>,
}

impl Store {
    fn store(&self) -> PyResult<Arc<RustStore>> {
        lock(&self.inner).clone().ok_or_else(|| Closed::new_err("the store is closed"))
    }

    fn puts(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        lengths: Vec<usize>,
        submit: bool,
    ) -> PyResult<Result<Vec<i64>, u64>> {
        same_len("batch put", keys.len(), &[("offsets", offsets.len()), ("lengths", lengths.len())])?;
        let s = self.store()?;
        let keys = keys_of(&keys)?;
        let g = region_of(region)?;
        let r = g.as_ref().expect("checked");
        let out = py.allow_threads(|| {
            let items: Vec<PutItem<'_>> = keys
                .iter()
                .zip(offsets.iter().zip(&lengths))
                .map(|(k, (o, n))| PutItem { key: k, region: r, offset: *o, len: *n })
                .collect();
            if submit { Err(s.submit_batch_put_from(&items).0) } else { Ok(s.batch_put_from(&items)) }
        });
        flush_logs(py);
        Ok(out)
    }

    fn gets(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        capacities: Vec<usize>,
        submit: bool,
    ) -> PyResult<Result<Vec<i64>, u64>> {
        same_len("batch get", keys.len(), &[("offsets", offsets.len()), ("capacities", capacities.len())])?;
        let s = self.store()?;
        let keys = keys_of(&keys)?;
        let g = region_of(region)?;
        let r = g.as_ref().expect("checked");
        let out = py.allow_threads(|| {
            let items: Vec<GetItem<'_>> = keys
                .iter()
                .zip(offsets.iter().zip(&capacities))
                .map(|(k, (o, n))| GetItem { key: k, region: r, offset: *o, capacity: *n })
                .collect();
            if submit { Err(s.submit_batch_get_into(&items).0) } else { Ok(s.batch_get_into(&items)) }
        });
        flush_logs(py);
        Ok(out)
    }
}

fn event_dict<'py>(py: Python<'py>, e: StoreEvent) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match e {
        StoreEvent::KeysLost { appliance, lease, outcome, count, keys } => {
            d.set_item("kind", "keys_lost")?;
            d.set_item("appliance", appliance)?;
            d.set_item("lease", lease_text(lease))?;
            d.set_item("outcome", outcome_name(outcome))?;
            d.set_item("count", count)?;
            let keys: Vec<Bound<'py, PyBytes>> = keys.iter().map(|k| PyBytes::new(py, k)).collect();
            d.set_item("keys", keys)?;
        }
        StoreEvent::Draining { appliance, in_ms } => {
            d.set_item("kind", "draining")?;
            d.set_item("appliance", appliance)?;
            d.set_item("in_ms", in_ms)?;
        }
        StoreEvent::Migrated { appliance, moved, left } => {
            d.set_item("kind", "migrated")?;
            d.set_item("appliance", appliance)?;
            d.set_item("moved", moved)?;
            d.set_item("left", left)?;
        }
        StoreEvent::Client(e) => {
            let e = crate::Event::from(e);
            d.set_item("kind", e.kind.clone())?;
            d.set_item("appliance", e.appliance.clone())?;
            d.set_item("detail", e.__repr__())?;
        }
    }
    Ok(d)
}

/// An outcome as the store's events name it: `torn_down`, `fenced`, `not_found`.
fn outcome_name(o: leasebox_client::Outcome) -> &'static str {
    match o {
        leasebox_client::Outcome::TornDown => "torn_down",
        leasebox_client::Outcome::Fenced => "fenced",
        _ => "not_found",
    }
}

#[pymethods]
impl Store {
    /// Opens a store: `url` is `leasebox://TENANT@HOST:PORT[,HOST:PORT...][?rdma=ADDR:PORT&requester=SPEC]` or
    /// `leasebox+etcd://HOST:PORT[,...][/leasebox/v1]?tenant=TENANT` (None: `LEASEBOX_URL`); the tenant's key is
    /// read (hex) from `key_file` (None: `LEASEBOX_KEY_FILE`). Each setting left None comes from its
    /// `LEASEBOX_*` variable when `env` is true, else its default (max_value_size 1 MiB, lease_size 64 MiB,
    /// leases 2, migrate_on_drain False, timeout_ms 5000). `requester`: one spec or a list (per appliance).
    #[staticmethod]
    #[pyo3(signature = (
        url=None, *, key_file=None, max_value_size=None, lease_size=None, leases=None, migrate_on_drain=None,
        requester=None, timeout_ms=None, env=true
    ))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        url: Option<String>,
        key_file: Option<PathBuf>,
        max_value_size: Option<u64>,
        lease_size: Option<u64>,
        leases: Option<usize>,
        migrate_on_drain: Option<bool>,
        requester: Option<&Bound<'_, PyAny>>,
        timeout_ms: Option<u64>,
        env: bool,
    ) -> PyResult<Store> {
        install_logging();
        let requester = requester.map(crate::requester_specs).transpose()?;
        let opts = StoreOptions {
            url,
            key_file,
            max_value_size,
            lease_size,
            leases,
            migrate_on_drain,
            requester,
            timeout: timeout_ms.map(Duration::from_millis),
            env,
        };
        let cfg = opts.resolve(|name| std::env::var(name).ok()).map_err(ConfigError::new_err)?;
        let s = py.allow_threads(|| RustStore::open(cfg));
        flush_logs(py);
        Ok(Store { inner: Mutex::new(Some(Arc::new(s.map_err(py_err)?))) })
    }

    /// Registers a writable buffer (bytearray, mmap, memoryview, numpy array) for the zero-copy calls.
    fn register_buffer(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<Region> {
        let s = self.store()?;
        crate::register_object(s.client(), py, buf)
    }

    /// Stores `value` (any bytes-like object) under `key`: 0, or a negative code.
    fn put(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<i64> {
        let s = self.store()?;
        let (key, value) = (key_of(key)?, crate::bytes_of(value)?);
        let r = py.allow_threads(|| s.put(&key, &value));
        flush_logs(py);
        Ok(r)
    }

    /// `key`'s value, or None on a miss (a key lost with a revoked lease is a miss); raises LeaseboxError for
    /// other failures (TIMEOUT, FAILED), naming the code.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'_, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let s = self.store()?;
        let key = key_of(key)?;
        let r = py.allow_threads(|| s.get(&key));
        flush_logs(py);
        match r {
            Ok(v) => Ok(v.map(|v| PyBytes::new(py, &v))),
            Err(kv::TIMEOUT) => Err(LeaseboxTimeout::new_err("get: TIMEOUT")),
            Err(c) => Err(LeaseboxError::new_err(format!("get: {} ({c})", kv::code_name(c)))),
        }
    }

    /// Stores `length` bytes at `offset` in `region` under `key` (zero copy): 0 or a negative code.
    fn put_from(
        &self,
        py: Python<'_>,
        key: Bound<'_, PyAny>,
        region: &Bound<'_, Region>,
        offset: usize,
        length: usize,
    ) -> PyResult<i64> {
        Ok(self.puts(py, vec![key], region, vec![offset], vec![length], false)?.unwrap_or_default()[0])
    }

    /// Reads `key`'s value into `region` at `offset`: bytes read, or a negative code (NOT_FOUND on a miss,
    /// TOO_LARGE when it exceeds `capacity`).
    fn get_into(
        &self,
        py: Python<'_>,
        key: Bound<'_, PyAny>,
        region: &Bound<'_, Region>,
        offset: usize,
        capacity: usize,
    ) -> PyResult<i64> {
        Ok(self.gets(py, vec![key], region, vec![offset], vec![capacity], false)?.unwrap_or_default()[0])
    }

    /// One result per key, in order.
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        lengths: Vec<usize>,
    ) -> PyResult<Vec<i64>> {
        Ok(self.puts(py, keys, region, offsets, lengths, false)?.unwrap_or_default())
    }

    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        capacities: Vec<usize>,
    ) -> PyResult<Vec<i64>> {
        Ok(self.gets(py, keys, region, offsets, capacities, false)?.unwrap_or_default())
    }

    /// 1 when stored, 0 when not.
    fn is_exist(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let s = self.store()?;
        let key = key_of(key)?;
        let r = py.allow_threads(|| s.is_exist(&key));
        flush_logs(py);
        Ok(r)
    }

    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
        let s = self.store()?;
        let keys = keys_of(&keys)?;
        let r = py.allow_threads(|| s.batch_is_exist(&keys.iter().map(|k| k.as_slice()).collect::<Vec<_>>()));
        flush_logs(py);
        Ok(r)
    }

    /// 0, or NOT_FOUND.
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let s = self.store()?;
        let key = key_of(key)?;
        let r = py.allow_threads(|| s.remove(&key));
        flush_logs(py);
        Ok(r)
    }

    /// Starts a put batch without waiting: its ticket (an int) for poll/wait.
    fn submit_batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        lengths: Vec<usize>,
    ) -> PyResult<u64> {
        Ok(self.puts(py, keys, region, offsets, lengths, true)?.err().unwrap_or_default())
    }

    fn submit_batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        region: &Bound<'_, Region>,
        offsets: Vec<usize>,
        capacities: Vec<usize>,
    ) -> PyResult<u64> {
        Ok(self.gets(py, keys, region, offsets, capacities, true)?.err().unwrap_or_default())
    }

    /// Up to `max` finished batches: `[(ticket, [result, ...]), ...]`, without waiting.
    #[pyo3(signature = (max=64))]
    fn poll(&self, py: Python<'_>, max: usize) -> PyResult<Vec<(u64, Vec<i64>)>> {
        let s = self.store()?;
        let r = py.allow_threads(|| s.poll(max));
        flush_logs(py);
        Ok(r.into_iter().map(|(t, v)| (t.0, v)).collect())
    }

    /// Waits up to `timeout_ms` for batch `ticket`: its results. Raises LeaseboxTimeout when not done (it stays
    /// pending), ConfigError for a ticket unknown or already taken.
    #[pyo3(signature = (ticket, timeout_ms=5000))]
    fn wait(&self, py: Python<'_>, ticket: u64, timeout_ms: u64) -> PyResult<Vec<i64>> {
        let s = self.store()?;
        let r = py.allow_threads(|| s.wait(BatchTicket(ticket), Duration::from_millis(timeout_ms)));
        flush_logs(py);
        r.map_err(py_err)
    }

    /// The store's live leases: `[(appliance address, lease id "SLOT.GENERATION@BOOT"), ...]`.
    fn leases(&self) -> PyResult<Vec<(String, String)>> {
        Ok(self.store()?.leases().into_iter().map(|(a, l)| (a, lease_text(l))).collect())
    }

    /// Where `key` is stored: `(appliance address, lease id)`, or None.
    fn where_is(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<(String, String)>> {
        let key = key_of(key)?;
        Ok(self.store()?.where_is(&key).map(|(a, l)| (a, lease_text(l))))
    }

    /// A descriptor readable when poll() may have something (for select/epoll/asyncio's add_reader).
    fn fileno(&self) -> PyResult<i32> {
        Ok(self.store()?.fileno())
    }

    /// Events since the last call: dicts with "kind" ("keys_lost", "draining", "migrated", or a client event's
    /// kind: "disconnected", "reconnected", ...) and "appliance"; keys_lost adds "lease", "outcome"
    /// ("torn_down", "fenced", "not_found"), "count" and "keys" (bytes each).
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let s = self.store()?;
        flush_logs(py);
        s.events().into_iter().map(|e| event_dict(py, e)).collect()
    }

    /// The figures: counters, gauges and the put/get latency histograms (`{"buckets": [(le_seconds, count),
    /// ...], "count": n, "sum": seconds}`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.store()?.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("hits", st.hits),
            ("misses", st.misses),
            ("puts", st.puts),
            ("put_failures", st.put_failures),
            ("get_failures", st.get_failures),
            ("evictions", st.evictions),
            ("lost_by_revoke", st.lost_by_revoke),
            ("migrated", st.migrated),
            ("removes", st.removes),
            ("bytes_written", st.bytes_written),
            ("bytes_read", st.bytes_read),
            ("keys", st.keys),
            ("bytes_stored", st.bytes_stored),
            ("capacity_bytes", st.capacity_bytes),
            ("free_bytes", st.free_bytes),
            ("leases", st.leases),
        ] {
            d.set_item(k, v)?;
        }
        for (name, h) in [("put_latency", &st.put_latency), ("get_latency", &st.get_latency)] {
            let hd = PyDict::new(py);
            let mut bounds: Vec<f64> = kv::stats::BUCKETS.to_vec();
            bounds.push(f64::INFINITY);
            let buckets: Vec<(f64, u64)> = bounds.into_iter().zip(h.counts.iter().copied()).collect();
            hd.set_item("buckets", buckets)?;
            hd.set_item("count", h.count)?;
            hd.set_item("sum", h.sum_seconds)?;
            d.set_item(name, hd)?;
        }
        Ok(d)
    }

    /// The figures as Prometheus text (metric names `leasebox_kv_*`).
    fn stats_prometheus(&self) -> PyResult<String> {
        Ok(self.store()?.stats_prometheus())
    }

    /// Frees the leases and ends the store's thread. Idempotent.
    fn close(&self, py: Python<'_>) {
        let s = lock(&self.inner).take();
        if let Some(s) = s {
            py.allow_threads(|| s.close());
        }
        flush_logs(py);
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
            Some(s) => format!("Store(appliances={:?})", s.client().appliances()),
            None => "Store(closed)".into(),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let s = lock(&self.inner).take();
        if let Some(s) = s {
            Python::with_gil(|py| py.allow_threads(|| s.close()));
        }
    }
}

/// The codes, for the module.
pub(crate) fn add_codes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, v) in [
        ("KV_OK", kv::OK),
        ("KV_NOT_FOUND", kv::NOT_FOUND),
        ("KV_REVOKED", kv::REVOKED),
        ("KV_TOO_LARGE", kv::TOO_LARGE),
        ("KV_NO_SPACE", kv::NO_SPACE),
        ("KV_TIMEOUT", kv::TIMEOUT),
        ("KV_FAILED", kv::FAILED),
    ] {
        m.add(name, v)?;
    }
    Ok(())
}
