//! [`Store`]: a key-value tier over a few large leases (docs/kv.md). Keys are byte strings; values up to
//! [`StoreConfig::max_value_size`] bytes are packed into the leases by a slab allocator ([`slab`]) and found by
//! an index on the client ([`index`]), least recently used evicted first when full. The calls are named as
//! Mooncake Store names them where they mean the same (`put`, `get`, `put_from`, `get_into`, `batch_put_from`,
//! `batch_get_into`, `is_exist`, `batch_is_exist`, `remove`), each item with its own integer result: `>= 0`
//! success (bytes for reads), negative a code ([`OK`], [`NOT_FOUND`], [`REVOKED`], [`TOO_LARGE`], [`NO_SPACE`],
//! [`TIMEOUT`], [`FAILED`]).
//!
//! **Data path.** Every call is a batch of the client's zero-copy operations ([`crate::Op`], [`Client::submit`]):
//! a put reserves a slot, RDMA-writes the value there from a registered [`Region`] and makes it visible when the
//! write completed; a get pins its slot while the RDMA read runs. The copying `put`/`get` go through staging
//! regions the store keeps. The `submit_*` forms return a batch ticket at once; [`Store::poll`],
//! [`Store::wait`] and the readable [`Store::fileno`] give its per-item results.
//!
//! **Revokes, drains, reboots** (docs/kv.md, "What a revoke means per key"): the store's worker thread reads
//! the client's events. A revoked or fenced lease (a rebooted appliance's leases are revoked with outcome
//! NOT_FOUND) takes its keys out of the index and queues [`StoreEvent::KeysLost`]; a get that finds its lease
//! already marked gone drops them at once too, so a later get is a miss. A Draining notice stops placement on
//! that appliance; with `migrate_on_drain` its keys are copied to another appliance, most recently used first,
//! until the notice's time is nearly out; the rest are reported lost when the revoke comes. A lost lease is
//! replaced, so the store keeps its size.

pub mod config;
pub mod index;
mod ready;
pub mod slab;
pub mod stats;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_proto::{LeaseId, Outcome};

use crate::batch::{Completed, Op, Ticket, Wait};
use crate::client::{AllocOptions, Appliance, Client, ClientConfig, RequesterConfig};
use crate::connection::Credentials;
use crate::error::Error;
use crate::event::Event;
use crate::fleet::FleetConfig;
use crate::lease::Lease;
use crate::region::Region;

pub use config::{StoreConfig, StoreOptions, StoreUrl, Target};
pub use stats::Stats;

use index::{Refused, Reservation, Table};
use ready::Ready;
use stats::Counters;

/// Success (a put, a remove); a read's success is its byte count.
pub const OK: i64 = 0;
/// The key is not there (never put, removed, evicted, or lost with its lease).
pub const NOT_FOUND: i64 = -1;
/// The key's lease was revoked while the transfer ran (the key is gone now).
pub const REVOKED: i64 = -2;
/// Larger than the store's largest value, or than the caller's buffer.
pub const TOO_LARGE: i64 = -3;
/// No room: every slot is in use by a transfer, or no lease takes new values.
pub const NO_SPACE: i64 = -4;
/// The transfer did not finish within the store's timeout.
pub const TIMEOUT: i64 = -5;
/// Anything else (a range outside the region, a broken QP, a closed store); the log says more.
pub const FAILED: i64 = -6;

/// A code's name (`"NOT_FOUND"`), or `"OK"` for any success.
pub fn code_name(code: i64) -> &'static str {
    match code {
        c if c >= 0 => "OK",
        NOT_FOUND => "NOT_FOUND",
        REVOKED => "REVOKED",
        TOO_LARGE => "TOO_LARGE",
        NO_SPACE => "NO_SPACE",
        TIMEOUT => "TIMEOUT",
        _ => "FAILED",
    }
}

/// The code for a transfer's error.
fn code_of(e: &Error) -> i64 {
    match e {
        Error::Revoked { .. } | Error::Closed(_) => REVOKED,
        Error::Timeout { .. } => TIMEOUT,
        _ => FAILED,
    }
}

fn kv_codes(r: &[i64]) -> String {
    r.iter().map(|c| code_name(*c)).collect::<Vec<_>>().join(",")
}

/// What the store tells the program without being asked ([`Store::events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// A lease was lost (revoked, fenced, its appliance rebooted or drained): these keys left the index.
    KeysLost { appliance: String, lease: LeaseId, outcome: Outcome, count: usize, keys: Vec<Vec<u8>> },
    /// An appliance is draining: nothing new is placed there; its leases go in `in_ms`.
    Draining { appliance: String, in_ms: u32 },
    /// A drain's migration ended: `moved` keys were copied to other appliances, `left` were not (they are
    /// reported lost when their lease goes).
    Migrated { appliance: String, moved: usize, left: usize },
    /// Any other client event (a connection broken or back).
    Client(Event),
}

/// One item of a put batch: `len` bytes at `offset` in `region` become `key`'s value.
#[derive(Clone, Copy)]
pub struct PutItem<'a> {
    pub key: &'a [u8],
    pub region: &'a Region<'static>,
    pub offset: usize,
    pub len: usize,
}

/// One item of a get batch: `key`'s value goes to `offset` in `region`, at most `capacity` bytes.
#[derive(Clone, Copy)]
pub struct GetItem<'a> {
    pub key: &'a [u8],
    pub region: &'a Region<'static>,
    pub offset: usize,
    pub capacity: usize,
}

/// A batch's handle for [`Store::wait`] and [`Store::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchTicket(pub u64);

/// What a finished transfer does to the index.
enum Act {
    Put {
        key: Vec<u8>,
        r: Reservation,
        len: u64,
    },
    Get {
        id: u64,
        len: u64,
    },
    /// A drain's copy of `key` (entry `was`) to `r`.
    Move {
        key: Vec<u8>,
        was: u64,
        r: Reservation,
    },
}

struct Batch {
    results: Vec<i64>,
    acts: Vec<Option<Act>>,
    tickets: Vec<Ticket>,
    pending: usize,
    asynchronous: bool,
    /// A synchronous caller gave up (timeout): the results go nowhere, the index is kept right.
    abandoned: bool,
    started: Instant,
}

struct LeaseSlot {
    lease: Option<Lease>,
    id: LeaseId,
    appliance: usize,
    name: String,
}

struct State {
    table: Table,
    /// By the table's lease number.
    leases: Vec<LeaseSlot>,
    batches: HashMap<u64, Batch>,
    by_ticket: HashMap<Ticket, (u64, usize)>,
    /// Results routed before their ticket was recorded (a poller took them between submit and record).
    orphans: HashMap<Ticket, Result<usize, Error>>,
    /// Asynchronous batches finished, not yet taken.
    finished: VecDeque<u64>,
    next_batch: u64,
    /// Appliance indexes that are draining.
    draining: Vec<usize>,
}

struct Shared {
    client: Client,
    cfg: StoreConfig,
    st: Mutex<State>,
    changed: Condvar,
    counters: Counters,
    events: Mutex<VecDeque<StoreEvent>>,
    staging: Mutex<Vec<Region<'static>>>,
    ready: Ready,
    closed: AtomicBool,
    /// When the worker last tried to replace a lost lease.
    replace_tried: Mutex<Option<Instant>>,
}

/// How often the worker tries again to replace a lost lease.
const REPLACE_EVERY: Duration = Duration::from_secs(1);

/// Events kept for [`Store::events`] at most (older ones are dropped first).
pub const STORE_EVENT_QUEUE: usize = 1024;

/// The key-value store; see the module documentation. Shared between threads (`&self` everywhere).
pub struct Store {
    sh: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("appliances", &self.sh.client.appliances())
            .field("max_value_size", &self.sh.cfg.max_value_size)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The client configuration a store configuration names.
fn requesters(specs: &[String], n: usize, depth: usize) -> Result<Vec<Option<RequesterConfig>>, Error> {
    if specs.is_empty() {
        return Ok(vec![None; n]);
    }
    if specs.len() != 1 && specs.len() != n {
        return Err(Error::Config(format!(
            "{} requesters for {n} appliances (give one, or one per appliance)",
            specs.len()
        )));
    }
    (0..n)
        .map(|i| RequesterConfig::parse(&specs[i.min(specs.len() - 1)], depth).map(Some).map_err(Error::Config))
        .collect()
}

impl Store {
    /// Connects as `cfg` says and takes `cfg.leases` leases of `cfg.lease_size` bytes.
    pub fn open(cfg: StoreConfig) -> Result<Store, Error> {
        let client = match &cfg.url.target {
            Target::Appliances(addrs) => {
                let key_hex: String = cfg.key.iter().map(|b| format!("{b:02x}")).collect();
                let mut cc = ClientConfig::software(addrs, &cfg.url.tenant, &key_hex, &cfg.url.rdma, Some(cfg.timeout))
                    .map_err(Error::Config)?;
                let reqs = requesters(&cfg.url.requester, addrs.len(), cc.queue_depth)?;
                for (a, r) in cc.appliances.iter_mut().zip(reqs) {
                    if let Some(r) = r {
                        a.requester = r;
                    }
                }
                Client::connect(cc)?
            }
            Target::Etcd(endpoints) => {
                let mut fc = FleetConfig::new(
                    endpoints.clone(),
                    Credentials { name: cfg.url.tenant.clone(), key: cfg.key.clone() },
                );
                fc.requester = requesters(&cfg.url.requester, 1, fc.queue_depth)?.pop().flatten();
                fc.timeouts = crate::Timeouts::all(cfg.timeout);
                fc.rdma_timeout = cfg.timeout;
                Client::connect_fleet(fc)?
            }
        };
        Store::with_client(client, cfg)
    }

    /// A store over `appliances` (the Rust programs' and tests' way: credentials and requesters already made).
    pub fn connect(appliances: Vec<Appliance>, cfg: StoreConfig) -> Result<Store, Error> {
        let mut cc = ClientConfig::new(appliances);
        cc.timeouts = crate::Timeouts::all(cfg.timeout);
        cc.rdma_timeout = cfg.timeout;
        Store::with_client(Client::connect(cc)?, cfg)
    }

    /// A store over a client of the program's making (the store takes its events: do not read them elsewhere).
    pub fn with_client(client: Client, cfg: StoreConfig) -> Result<Store, Error> {
        let events = client.take_events().ok_or_else(|| Error::Config("the client's events were taken".into()))?;
        let ready = Ready::new(client.completion_fd()).map_err(Error::Config)?;
        let st = State {
            table: Table::new(cfg.max_value_size),
            leases: Vec::new(),
            batches: HashMap::new(),
            by_ticket: HashMap::new(),
            orphans: HashMap::new(),
            finished: VecDeque::new(),
            next_batch: 1,
            draining: Vec::new(),
        };
        let sh = Arc::new(Shared {
            client,
            cfg,
            st: Mutex::new(st),
            changed: Condvar::new(),
            counters: Counters::default(),
            events: Mutex::new(VecDeque::new()),
            staging: Mutex::new(Vec::new()),
            ready,
            closed: AtomicBool::new(false),
            replace_tried: Mutex::new(None),
        });
        for _ in 0..sh.cfg.leases {
            sh.add_lease(None)?;
        }
        let worker_sh = sh.clone();
        let worker = std::thread::Builder::new()
            .name("leasebox kv".into())
            .spawn(move || worker_sh.worker(events))
            .map_err(|e| Error::Config(format!("the store's thread: {e}")))?;
        Ok(Store { sh, worker: Mutex::new(Some(worker)) })
    }

    /// The client underneath (its appliances, its regions).
    pub fn client(&self) -> &Client {
        &self.sh.client
    }

    pub fn config(&self) -> &StoreConfig {
        &self.sh.cfg
    }

    /// Registers memory the region owns, for the zero-copy calls.
    pub fn register_buffer(&self, memory: Vec<u8>) -> Result<Region<'static>, Error> {
        self.sh.client.register_owned(memory)
    }

    /// Registers `len` bytes at `addr` that belong to someone else (see [`Client::register_raw`]).
    ///
    /// # Safety
    ///
    /// As [`Client::register_raw`]: the memory stays allocated and in place until the region is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(&self, addr: *mut u8, len: usize) -> Result<Region<'static>, Error> {
        // SAFETY: the caller's promise, passed on unchanged.
        unsafe { self.sh.client.register_raw(addr, len) }
    }

    // ---- synchronous calls ----

    /// Stores `value` (copied through a staging region) under `key`: [`OK`] or a negative code.
    pub fn put(&self, key: &[u8], value: &[u8]) -> i64 {
        if value.len() as u64 > self.sh.cfg.max_value_size {
            self.sh.counters.put_failures.fetch_add(1, Ordering::Relaxed);
            return TOO_LARGE;
        }
        let mut staging = match self.sh.staging() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("store: a staging region: {e}");
                return FAILED;
            }
        };
        staging.bytes_mut()[..value.len()].copy_from_slice(value);
        let r = self.batch_put_from(&[PutItem { key, region: &staging, offset: 0, len: value.len() }]);
        self.sh.unstage(staging);
        r[0]
    }

    /// `key`'s value (copied out of a staging region): `Ok(None)` on a miss (a key lost with a revoked lease is
    /// a miss too; so is one whose lease was revoked during this read); `Err(code)` for other failures.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, i64> {
        let mut staging = match self.sh.staging() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("store: a staging region: {e}");
                return Err(FAILED);
            }
        };
        let cap = staging.len();
        let r = self.batch_get_into(&[GetItem { key, region: &staging, offset: 0, capacity: cap }])[0];
        let out = match r {
            n if n >= 0 => Ok(Some(staging.bytes()[..n as usize].to_vec())),
            NOT_FOUND | REVOKED => Ok(None),
            code => Err(code),
        };
        self.sh.unstage(staging);
        out
    }

    /// Stores `len` bytes at `offset` in `region` under `key`, the NIC reading them from the region.
    pub fn put_from(&self, key: &[u8], region: &Region<'static>, offset: usize, len: usize) -> i64 {
        self.batch_put_from(&[PutItem { key, region, offset, len }])[0]
    }

    /// Reads `key`'s value into `region` at `offset` (at most `capacity` bytes): its length, or a negative code
    /// ([`NOT_FOUND`] on a miss, [`TOO_LARGE`] when it does not fit).
    pub fn get_into(&self, key: &[u8], region: &Region<'static>, offset: usize, capacity: usize) -> i64 {
        self.batch_get_into(&[GetItem { key, region, offset, capacity }])[0]
    }

    /// Puts every item; one result each, in order. A failed item fails alone.
    pub fn batch_put_from(&self, items: &[PutItem<'_>]) -> Vec<i64> {
        let b = self.sh.start_puts(items, false);
        self.sh.finish_sync(b)
    }

    /// Gets every item; one result each, in order.
    pub fn batch_get_into(&self, items: &[GetItem<'_>]) -> Vec<i64> {
        let b = self.sh.start_gets(items, false);
        self.sh.finish_sync(b)
    }

    /// 1 when `key` is stored, 0 when not (a key whose lease is known to be gone is not).
    pub fn is_exist(&self, key: &[u8]) -> i64 {
        self.batch_is_exist(&[key])[0]
    }

    /// [`Store::is_exist`] for each key.
    pub fn batch_is_exist(&self, keys: &[&[u8]]) -> Vec<i64> {
        let mut lost = Vec::new();
        let out = {
            let mut st = lock(&self.sh.st);
            keys.iter()
                .map(|k| match st.table.peek(k) {
                    None => 0,
                    Some(e) => match self.sh.gone(&st, e.slot.lease) {
                        Some(outcome) => {
                            lost.extend(self.sh.lose_locked(&mut st, e.slot.lease, outcome));
                            0
                        }
                        None => 1,
                    },
                })
                .collect()
        };
        self.sh.after_loss(lost);
        out
    }

    /// Removes `key`: [`OK`], or [`NOT_FOUND`] when it was not there. A read of it in flight finishes first
    /// (its slot is reused only after).
    pub fn remove(&self, key: &[u8]) -> i64 {
        let mut st = lock(&self.sh.st);
        match st.table.remove(key) {
            Some(_) => {
                self.sh.counters.removes.fetch_add(1, Ordering::Relaxed);
                OK
            }
            None => NOT_FOUND,
        }
    }

    // ---- asynchronous calls ----

    /// Starts a put batch; its results come from [`Store::poll`] or [`Store::wait`].
    pub fn submit_batch_put_from(&self, items: &[PutItem<'_>]) -> BatchTicket {
        BatchTicket(self.sh.start_puts(items, true))
    }

    /// Starts a get batch.
    pub fn submit_batch_get_into(&self, items: &[GetItem<'_>]) -> BatchTicket {
        BatchTicket(self.sh.start_gets(items, true))
    }

    /// Up to `max` finished batches with their per-item results, without waiting.
    pub fn poll(&self, max: usize) -> Vec<(BatchTicket, Vec<i64>)> {
        let sh = &self.sh;
        sh.route(sh.client.poll(usize::MAX));
        let mut st = lock(&sh.st);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(b) = st.finished.pop_front() else { break };
            if let Some(batch) = st.batches.remove(&b) {
                out.push((BatchTicket(b), batch.results));
            }
        }
        if st.finished.is_empty() {
            sh.ready.lower();
        }
        out
    }

    /// Waits up to `timeout` for batch `t`: its per-item results. [`Error::Timeout`] when it is not done yet (it
    /// stays pending), [`Error::Config`] for a ticket unknown or already taken.
    pub fn wait(&self, t: BatchTicket, timeout: Duration) -> Result<Vec<i64>, Error> {
        match self.sh.wait_batch(t.0, timeout) {
            Some(r) => {
                let mut st = lock(&self.sh.st);
                st.finished.retain(|b| *b != t.0);
                if st.finished.is_empty() {
                    self.sh.ready.lower();
                }
                Ok(r)
            }
            None if lock(&self.sh.st).batches.contains_key(&t.0) => {
                Err(Error::Timeout { what: "the batch's results", after: timeout })
            }
            None => Err(Error::Config(format!("batch {} is unknown or its results were taken", t.0))),
        }
    }

    /// A descriptor that polls readable when [`Store::poll`] may have something (it may also be readable
    /// briefly for results of synchronous calls another thread is about to take). Do not read or close it.
    pub fn fileno(&self) -> RawFd {
        self.sh.ready.fd()
    }

    /// Every event queued now.
    pub fn events(&self) -> Vec<StoreEvent> {
        lock(&self.sh.events).drain(..).collect()
    }

    /// The figures now.
    pub fn stats(&self) -> Stats {
        let c = &self.sh.counters;
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let st = lock(&self.sh.st);
        Stats {
            hits: ld(&c.hits),
            misses: ld(&c.misses),
            puts: ld(&c.puts),
            put_failures: ld(&c.put_failures),
            get_failures: ld(&c.get_failures),
            evictions: ld(&c.evictions),
            lost_by_revoke: ld(&c.lost_by_revoke),
            migrated: ld(&c.migrated),
            removes: ld(&c.removes),
            bytes_written: ld(&c.bytes_written),
            bytes_read: ld(&c.bytes_read),
            keys: st.table.len() as u64,
            bytes_stored: st.table.bytes(),
            capacity_bytes: st.table.slab().capacity(),
            free_bytes: st.table.slab().free_bytes(),
            leases: st.leases.iter().filter(|l| l.lease.is_some()).count() as u64,
            put_latency: c.put_latency.snapshot(),
            get_latency: c.get_latency.snapshot(),
        }
    }

    /// [`Store::stats`] as Prometheus text.
    pub fn stats_prometheus(&self) -> String {
        self.stats().prometheus()
    }

    /// The appliance each live lease is on, with its lease id (for tests and operators).
    pub fn leases(&self) -> Vec<(String, LeaseId)> {
        lock(&self.sh.st).leases.iter().filter(|l| l.lease.is_some()).map(|l| (l.name.clone(), l.id)).collect()
    }

    /// The appliance (address) holding `key`, if stored.
    pub fn where_is(&self, key: &[u8]) -> Option<(String, LeaseId)> {
        let st = lock(&self.sh.st);
        let e = st.table.peek(key)?;
        let l = &st.leases[e.slot.lease as usize];
        Some((l.name.clone(), l.id))
    }

    /// Ends the worker and frees the leases (also on drop).
    pub fn close(&self) {
        self.sh.closed.store(true, Ordering::Release);
        if let Some(w) = lock(&self.worker).take() {
            let _ = w.join();
        }
        let leases: Vec<Lease> = lock(&self.sh.st).leases.iter_mut().filter_map(|l| l.lease.take()).collect();
        drop(leases);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    /// Takes one more lease (preferring appliance `prefer`), unless it lands on a draining appliance.
    fn add_lease(&self, prefer: Option<usize>) -> Result<u32, Error> {
        let lease = self.client.alloc(self.cfg.lease_size, AllocOptions { prefer, ..AllocOptions::default() })?;
        let mut st = lock(&self.st);
        if st.draining.contains(&lease.appliance_index()) {
            drop(st);
            let name = lease.appliance().to_string();
            let _ = lease.free();
            return Err(Error::NoMemory { size: self.cfg.lease_size, tried: vec![(name, "draining".into())] });
        }
        let n = st.table.add_lease(lease.size());
        st.leases.push(LeaseSlot {
            id: lease.id(),
            appliance: lease.appliance_index(),
            name: lease.appliance().to_string(),
            lease: Some(lease),
        });
        log::info!("store: lease {n} on {} ({} bytes)", st.leases[n as usize].name, self.cfg.lease_size);
        Ok(n)
    }

    fn staging(&self) -> Result<Region<'static>, Error> {
        if let Some(r) = lock(&self.staging).pop() {
            return Ok(r);
        }
        self.client.register_owned(vec![0u8; self.cfg.max_value_size as usize])
    }

    fn unstage(&self, r: Region<'static>) {
        let mut s = lock(&self.staging);
        // Enough for the threads that use the store at once; the rest go.
        if s.len() < 64 {
            s.push(r);
        }
    }

    /// Whether lease `n` is gone (its outcome) though its keys are still listed.
    fn gone(&self, st: &State, n: u32) -> Option<Outcome> {
        match &st.leases[n as usize].lease {
            Some(l) => l.revoked(),
            None => Some(Outcome::NotFound),
        }
    }

    /// Lease `n` is lost: its keys leave the index, the event is queued; the lease (to drop outside the lock).
    fn lose_locked(&self, st: &mut State, n: u32, outcome: Outcome) -> Option<Lease> {
        let slot = &mut st.leases[n as usize];
        let lease = slot.lease.take()?;
        let (appliance, id) = (slot.name.clone(), slot.id);
        let keys = st.table.drop_lease(n);
        self.counters.lost_by_revoke.fetch_add(keys.len() as u64, Ordering::Relaxed);
        log::warn!(
            "store: lease {}.{} on {appliance} gone ({}): {} keys lost",
            id.slot,
            id.generation,
            outcome.name(),
            keys.len()
        );
        self.push_event(StoreEvent::KeysLost { appliance, lease: id, outcome, count: keys.len(), keys });
        Some(lease)
    }

    /// After a loss: the lease goes (outside the lock).
    fn after_loss(&self, lost: Vec<Lease>) {
        drop(lost);
    }

    fn push_event(&self, e: StoreEvent) {
        let mut q = lock(&self.events);
        if q.len() >= STORE_EVENT_QUEUE {
            q.pop_front();
        }
        q.push_back(e);
    }

    fn new_batch(&self, st: &mut State, n: usize, asynchronous: bool) -> u64 {
        let b = st.next_batch;
        st.next_batch += 1;
        st.batches.insert(
            b,
            Batch {
                results: vec![FAILED; n],
                acts: (0..n).map(|_| None).collect(),
                tickets: Vec::new(),
                pending: 0,
                asynchronous,
                abandoned: false,
                started: Instant::now(),
            },
        );
        b
    }

    /// Whether a new value may go in lease `n`.
    fn placeable(st: &State, n: u32) -> bool {
        let l = &st.leases[n as usize];
        l.lease.as_ref().is_some_and(|x| x.revoked().is_none()) && !st.draining.contains(&l.appliance)
    }

    fn start_puts(&self, items: &[PutItem<'_>], asynchronous: bool) -> u64 {
        let mut ops = Vec::new();
        let b = {
            let mut guard = lock(&self.st);
            let st = &mut *guard;
            let b = self.new_batch(st, items.len(), asynchronous);
            for (i, it) in items.iter().enumerate() {
                // A closed store, or a range outside the region: FAILED.
                let outside = it.offset.checked_add(it.len).is_none_or(|end| end > it.region.len());
                let code = if self.closed.load(Ordering::Acquire) || outside {
                    Err(FAILED)
                } else {
                    let (r, evicted) = {
                        let leases = &st.leases;
                        let draining = &st.draining;
                        st.table.reserve(it.len as u64, |n| {
                            let l = &leases[n as usize];
                            l.lease.as_ref().is_some_and(|x| x.revoked().is_none()) && !draining.contains(&l.appliance)
                        })
                    };
                    self.counters.evictions.fetch_add(evicted.len() as u64, Ordering::Relaxed);
                    match r {
                        Err(Refused::TooLarge) => Err(TOO_LARGE),
                        Err(Refused::NoSpace) => Err(NO_SPACE),
                        Ok(r) => Ok(r),
                    }
                };
                match code {
                    Err(c) => {
                        self.counters.put_failures.fetch_add(1, Ordering::Relaxed);
                        st.batches.get_mut(&b).expect("just made").results[i] = c;
                    }
                    Ok(r) => {
                        debug_assert!(Self::placeable(st, r.slot.lease));
                        let Some(lease) = st.leases[r.slot.lease as usize].lease.as_ref() else {
                            st.table.abort(r);
                            continue;
                        };
                        ops.push((i, Op::write_from(lease, it.region, it.offset, r.slot.offset, it.len)));
                        let batch = st.batches.get_mut(&b).expect("just made");
                        batch.acts[i] = Some(Act::Put { key: it.key.to_vec(), r, len: it.len as u64 });
                        batch.pending += 1;
                    }
                }
            }
            b
        };
        self.submit(b, ops);
        b
    }

    fn start_gets(&self, items: &[GetItem<'_>], asynchronous: bool) -> u64 {
        let mut ops = Vec::new();
        let mut lost = Vec::new();
        let b = {
            let mut guard = lock(&self.st);
            let st = &mut *guard;
            let b = self.new_batch(st, items.len(), asynchronous);
            for (i, it) in items.iter().enumerate() {
                let entry = st.table.peek(it.key);
                let entry = match entry {
                    Some(e) => match self.gone(st, e.slot.lease) {
                        Some(outcome) => {
                            lost.extend(self.lose_locked(st, e.slot.lease, outcome));
                            None
                        }
                        None => Some(e),
                    },
                    None => None,
                };
                let code = match entry {
                    None => {
                        self.counters.misses.fetch_add(1, Ordering::Relaxed);
                        Err(NOT_FOUND)
                    }
                    Some(e) if e.len as usize > it.capacity => Err(TOO_LARGE),
                    Some(e) if it.offset.checked_add(e.len as usize).is_none_or(|end| end > it.region.len()) => {
                        Err(FAILED)
                    }
                    Some(e) => Ok(e),
                };
                match code {
                    Err(c) => st.batches.get_mut(&b).expect("just made").results[i] = c,
                    Ok(e) => {
                        st.table.touch(it.key);
                        st.table.pin(&e);
                        let lease = st.leases[e.slot.lease as usize].lease.as_ref().expect("checked by gone");
                        ops.push((i, Op::read_into(lease, it.region, it.offset, e.slot.offset, e.len as usize)));
                        let batch = st.batches.get_mut(&b).expect("just made");
                        batch.acts[i] = Some(Act::Get { id: e.id, len: e.len });
                        batch.pending += 1;
                    }
                }
            }
            b
        };
        self.after_loss(lost);
        self.submit(b, ops);
        b
    }

    /// Hands `ops` (item index, op) of batch `b` to the client and records their tickets.
    fn submit(&self, b: u64, ops: Vec<(usize, Op<'_>)>) {
        let (idx, ops): (Vec<usize>, Vec<Op<'_>>) = ops.into_iter().unzip();
        let tickets = if ops.is_empty() { Vec::new() } else { self.client.submit(ops) };
        let mut st = lock(&self.st);
        let mut early = Vec::new();
        for (t, i) in tickets.iter().zip(idx) {
            match st.orphans.remove(t) {
                Some(r) => early.push((b, i, r)),
                None => {
                    st.by_ticket.insert(*t, (b, i));
                }
            }
        }
        if let Some(batch) = st.batches.get_mut(&b) {
            batch.tickets = tickets;
        }
        let mut lost = Vec::new();
        for (b, i, r) in early {
            lost.extend(self.finish_item(&mut st, b, i, r));
        }
        // A batch with nothing to transfer is finished now.
        self.check_done(&mut st, b);
        drop(st);
        self.after_loss(lost);
    }

    /// Routes transfer results to their batches.
    fn route(&self, done: Vec<Completed>) {
        if done.is_empty() {
            return;
        }
        let mut lost = Vec::new();
        {
            let mut st = lock(&self.st);
            for (t, r) in done {
                match st.by_ticket.remove(&t) {
                    Some((b, i)) => lost.extend(self.finish_item(&mut st, b, i, r)),
                    None => {
                        st.orphans.insert(t, r);
                    }
                }
            }
        }
        self.after_loss(lost);
    }

    /// Item `i` of batch `b` finished with `r`.
    fn finish_item(&self, st: &mut State, b: u64, i: usize, r: Result<usize, Error>) -> Option<Lease> {
        let mut lost = None;
        let batch = st.batches.get_mut(&b)?;
        let act = batch.acts[i].take();
        let abandoned = batch.abandoned;
        let elapsed = batch.started.elapsed();
        let c = &self.counters;
        let code = match (act, r) {
            (Some(Act::Put { key, r: res, len }), Ok(_)) if !abandoned => {
                if st.table.commit(&key, res, len) {
                    c.puts.fetch_add(1, Ordering::Relaxed);
                    c.bytes_written.fetch_add(len, Ordering::Relaxed);
                    c.put_latency.record(elapsed);
                    OK
                } else {
                    c.put_failures.fetch_add(1, Ordering::Relaxed);
                    REVOKED
                }
            }
            (Some(Act::Put { r: res, .. }), r) => {
                st.table.abort(res);
                c.put_failures.fetch_add(1, Ordering::Relaxed);
                match r {
                    Ok(_) => TIMEOUT,
                    Err(e) => {
                        if let Error::Revoked { lease, outcome } = &e {
                            lost = self.lose_by_id(st, *lease, *outcome);
                        }
                        code_of(&e)
                    }
                }
            }
            (Some(Act::Get { id, len }), r) => {
                st.table.unpin(id);
                match r {
                    Ok(_) => {
                        c.hits.fetch_add(1, Ordering::Relaxed);
                        c.bytes_read.fetch_add(len, Ordering::Relaxed);
                        c.get_latency.record(elapsed);
                        len as i64
                    }
                    Err(e) => {
                        c.get_failures.fetch_add(1, Ordering::Relaxed);
                        if let Error::Revoked { lease, outcome } = &e {
                            lost = self.lose_by_id(st, *lease, *outcome);
                        }
                        log::debug!("store: a read failed: {e}");
                        code_of(&e)
                    }
                }
            }
            (Some(Act::Move { key, was, r: res }), r) => match r {
                Ok(_) if !abandoned && st.table.relocate(&key, was, res) => OK,
                Ok(_) => FAILED,
                Err(e) => {
                    st.table.abort(res);
                    code_of(&e)
                }
            },
            (None, _) => return None,
        };
        if let Some(batch) = st.batches.get_mut(&b) {
            batch.results[i] = code;
            batch.pending -= 1;
        }
        self.check_done(st, b);
        lost
    }

    fn lose_by_id(&self, st: &mut State, id: LeaseId, outcome: Outcome) -> Option<Lease> {
        let n = st.leases.iter().position(|l| l.id == id && l.lease.is_some())?;
        self.lose_locked(st, n as u32, outcome)
    }

    fn check_done(&self, st: &mut State, b: u64) {
        let Some(batch) = st.batches.get(&b) else { return };
        if batch.pending > 0 {
            return;
        }
        if batch.abandoned {
            st.batches.remove(&b);
        } else if batch.asynchronous && !st.finished.contains(&b) {
            st.finished.push_back(b);
            self.ready.raise();
        }
        self.changed.notify_all();
    }

    /// Waits for batch `b` (moving its transfers on this thread meanwhile): its results, taken; `None` on timeout
    /// or for an unknown batch.
    fn wait_batch(&self, b: u64, timeout: Duration) -> Option<Vec<i64>> {
        let end = Instant::now() + timeout;
        loop {
            let next = {
                let mut st = lock(&self.st);
                let batch = st.batches.get(&b)?;
                if batch.pending == 0 {
                    return st.batches.remove(&b).map(|x| x.results);
                }
                let next = batch.tickets.iter().find(|t| st.by_ticket.contains_key(t)).copied();
                if next.is_none() {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    // Another thread took the results and routes them now.
                    st = self
                        .changed
                        .wait_timeout(st, left.min(Duration::from_millis(5)))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    drop(st);
                    continue;
                }
                next
            };
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.client.wait(Wait::Ticket(next.expect("checked")), left.min(Duration::from_millis(50))) {
                Ok(r) => self.route(r),
                Err(Error::Timeout { .. }) => {}
                // Taken by a poller on another thread, which routes it.
                Err(_) => {
                    let st = lock(&self.st);
                    let _ = self.changed.wait_timeout(st, Duration::from_millis(2));
                }
            }
        }
    }

    /// A synchronous call's results: every item's, the unfinished ones [`TIMEOUT`] past the store's timeout.
    fn finish_sync(&self, b: u64) -> Vec<i64> {
        // The transfers' own deadline is the client's RDMA timeout; a little more for the verdicts.
        let wait = self.cfg.timeout + Duration::from_secs(1);
        if let Some(r) = self.wait_batch(b, wait) {
            return r;
        }
        let mut st = lock(&self.st);
        match st.batches.get_mut(&b) {
            Some(batch) => {
                batch.abandoned = true;
                let out = batch
                    .results
                    .iter()
                    .zip(&batch.acts)
                    .map(|(r, a)| if a.is_some() { TIMEOUT } else { *r })
                    .collect();
                if batch.pending == 0 {
                    st.batches.remove(&b);
                }
                out
            }
            None => Vec::new(),
        }
    }

    // ---- the worker: events, drains, replacements ----

    fn worker(self: Arc<Self>, events: Receiver<Event>) {
        while !self.closed.load(Ordering::Acquire) {
            match events.recv_timeout(Duration::from_millis(100)) {
                Ok(e) => self.on_event(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.sweep();
        }
    }

    fn on_event(&self, e: Event) {
        match e {
            Event::Revoked { lease, outcome, .. } => {
                let lost = self.lose_by_id(&mut lock(&self.st), lease, outcome);
                self.after_loss(lost.into_iter().collect());
            }
            Event::Fenced { lease, .. } => {
                let lost = self.lose_by_id(&mut lock(&self.st), lease, Outcome::Fenced);
                self.after_loss(lost.into_iter().collect());
            }
            Event::Draining { appliance, in_ms } => self.drain(appliance, in_ms),
            other => self.push_event(StoreEvent::Client(other)),
        }
    }

    /// Leases marked gone without an event yet lose their keys; lost ones are replaced.
    fn sweep(&self) {
        let lost: Vec<Lease> = {
            let mut st = lock(&self.st);
            let gone: Vec<(u32, Outcome)> = (0..st.leases.len() as u32)
                .filter_map(|n| st.leases[n as usize].lease.as_ref().and_then(|l| l.revoked()).map(|o| (n, o)))
                .collect();
            gone.into_iter().filter_map(|(n, o)| self.lose_locked(&mut st, n, o)).collect()
        };
        self.after_loss(lost);
        // Placeable leases (a draining appliance's do not count) below the configured number: one more, at most
        // one try per REPLACE_EVERY.
        let placeable = {
            let st = lock(&self.st);
            (0..st.leases.len() as u32).filter(|n| Self::placeable(&st, *n)).count()
        };
        let mut last = lock(&self.replace_tried);
        if placeable < self.cfg.leases
            && !self.closed.load(Ordering::Acquire)
            && last.is_none_or(|t| t.elapsed() >= REPLACE_EVERY)
        {
            *last = Some(Instant::now());
            drop(last);
            if let Err(e) = self.add_lease(None) {
                log::debug!("store: no replacement lease yet: {e}");
            }
        }
    }

    /// A Draining notice for `appliance`: stop placing there; migrate when configured.
    fn drain(&self, appliance: String, in_ms: u32) {
        let deadline = Instant::now() + Duration::from_millis(in_ms as u64);
        let from: Vec<u32> = {
            let mut st = lock(&self.st);
            let Some(idx) = st.leases.iter().find(|l| l.name == appliance).map(|l| l.appliance) else {
                self.push_event(StoreEvent::Draining { appliance, in_ms });
                return;
            };
            if !st.draining.contains(&idx) {
                st.draining.push(idx);
            }
            let ns: Vec<u32> =
                (0..st.leases.len() as u32).filter(|n| st.leases[*n as usize].appliance == idx).collect();
            for n in &ns {
                st.table.stop_placing(*n);
            }
            ns
        };
        log::warn!("store: {appliance} drains in {in_ms} ms; nothing new goes there");
        // Room elsewhere first (placement tries the draining appliance last), then the event: a put after it
        // finds a place.
        for _ in 0..self.cfg.leases {
            if let Err(e) = self.add_lease(None) {
                log::warn!("store: no lease off {appliance}: {e}");
                break;
            }
        }
        self.push_event(StoreEvent::Draining { appliance: appliance.clone(), in_ms });
        if !self.cfg.migrate_on_drain {
            return;
        }
        let (mut moved, mut left) = (0, 0);
        // Most recently used first; stop a little before the notice runs out, so no copy runs into the revoke.
        let stop_at = deadline.checked_sub(Duration::from_millis((in_ms as u64 / 5).min(500))).unwrap_or(deadline);
        for n in from {
            let keys = lock(&self.st).table.keys_of(n);
            for (key, e) in keys {
                if Instant::now() >= stop_at || self.closed.load(Ordering::Acquire) {
                    left += 1;
                    continue;
                }
                // Once more if the first copy failed (a transfer's timeout on a busy host).
                if self.migrate_one(&key, e) || self.migrate_one(&key, e) {
                    moved += 1;
                } else {
                    left += 1;
                }
            }
        }
        self.counters.migrated.fetch_add(moved as u64, Ordering::Relaxed);
        log::info!("store: {appliance} drained: {moved} keys copied elsewhere, {left} not");
        self.push_event(StoreEvent::Migrated { appliance, moved, left });
    }

    /// Copies `key` (entry `e`) to a slot on a placeable lease: read into staging, write there, and the key
    /// points at the copy if it was not changed meanwhile.
    fn migrate_one(&self, key: &[u8], e: index::Entry) -> bool {
        let Ok(staging) = self.staging() else { return false };
        let r = self.start_gets(&[GetItem { key, region: &staging, offset: 0, capacity: staging.len() }], false);
        let got = self.finish_sync(r);
        let moved = match got.first() {
            Some(&n) if n >= 0 && n as u64 == e.len => {
                let (b, ops) = {
                    let mut guard = lock(&self.st);
                    let st = &mut *guard;
                    let (leases, draining) = (&st.leases, &st.draining);
                    let (r, evicted) = st.table.reserve(e.len, |x| {
                        let l = &leases[x as usize];
                        l.lease.as_ref().is_some_and(|y| y.revoked().is_none()) && !draining.contains(&l.appliance)
                    });
                    self.counters.evictions.fetch_add(evicted.len() as u64, Ordering::Relaxed);
                    let b = self.new_batch(st, 1, false);
                    let mut ops = Vec::new();
                    if let Ok(r) = r {
                        match st.leases[r.slot.lease as usize].lease.as_ref() {
                            Some(l) => {
                                ops.push((0, Op::write_from(l, &staging, 0, r.slot.offset, e.len as usize)));
                                let batch = st.batches.get_mut(&b).expect("just made");
                                batch.acts[0] = Some(Act::Move { key: key.to_vec(), was: e.id, r });
                                batch.pending = 1;
                            }
                            None => st.table.abort(r),
                        }
                    }
                    (b, ops)
                };
                self.submit(b, ops);
                let r = self.finish_sync(b);
                if r.first() != Some(&OK) {
                    log::debug!("store: a drain's copy was not written: {}", kv_codes(&r));
                }
                r.first() == Some(&OK)
            }
            other => {
                log::debug!("store: a drain's read gave {other:?} for {} bytes", e.len);
                false
            }
        };
        self.unstage(staging);
        moved
    }
}
