//! A client whose appliances come from etcd (docs/fleet.md): the registrar advertises every appliance that
//! answers under `/leasebox/v1/appliances/`; the client reads that prefix, then watches it. A new key starts a
//! connection thread (the appliance joins the client's list; indexes are never reused), a deleted key takes the
//! appliance out of placement (its leases go on: they are the appliance's, not etcd's), a key under a known
//! control address with a new boot id eases the rebooted appliance in ([`placement::warmup`]).
//!
//! The watch runs on a thread of its own; when etcd cannot be reached it retries with backoff and the client
//! goes on placing on what it last saw.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_fleet::advert::{Advertisement, PREFIX};
use leasebox_fleet::etcd::{Etcd, EtcdUser, Kv, WatchEvent};
use leasebox_fleet::tls::TlsFiles;

use crate::client::{Client, Inner, RequesterConfig};
use crate::connection::{Client as Connection, Credentials, Timeouts};
use crate::error::Error;
use crate::event::{Callback, Sink};
use crate::placement::{self, Candidate, Rng};
use crate::rdma::SoftConfig;
use crate::session::Session;

/// What [`Client::connect_fleet`] needs.
#[derive(Clone)]
pub struct FleetConfig {
    /// etcd's client endpoints, `HOST:PORT` (the JSON gateway; `https://HOST:PORT` with `etcd_tls`).
    pub etcd: Vec<String>,
    /// TLS to etcd: the cluster's CA, and a client certificate and key if it verifies clients. `None`: plain
    /// HTTP.
    pub etcd_tls: Option<TlsFiles>,
    /// etcd authentication (a user whose role may read the advertisements' prefix). `None`: no user.
    pub etcd_user: Option<EtcdUser>,
    /// Who we are on every appliance.
    pub credentials: Credentials,
    /// The requester for every appliance; `None`: the software requester toward each advertisement's `rdma`
    /// address.
    pub requester: Option<RequesterConfig>,
    pub timeouts: Timeouts,
    pub rdma_timeout: Duration,
    /// Work requests each lease keeps posted at most (as [`crate::ClientConfig::queue_depth`]).
    pub queue_depth: usize,
    pub on_event: Option<Callback>,
    /// How long a rebooted appliance's share of new leases takes to grow back to its full weight.
    pub warmup: Duration,
    /// How long `connect_fleet` waits for a first appliance in etcd.
    pub wait: Duration,
}

impl FleetConfig {
    pub fn new(etcd: Vec<String>, credentials: Credentials) -> FleetConfig {
        FleetConfig {
            etcd,
            etcd_tls: None,
            etcd_user: None,
            credentials,
            requester: None,
            timeouts: Timeouts::default(),
            rdma_timeout: Duration::from_secs(5),
            queue_depth: crate::engine::DEFAULT_QUEUE_DEPTH,
            on_event: None,
            warmup: Duration::from_secs(30),
            wait: Duration::from_secs(10),
        }
    }

    /// What the C and Python bindings build from plain values: etcd endpoints (comma-separated allowed) and
    /// TLS to them if given, one principal, an optional timeout for every network wait.
    pub fn software(
        etcd: &[String],
        etcd_tls: Option<TlsFiles>,
        name: &str,
        key_hex: &str,
        timeout: Option<Duration>,
    ) -> Result<FleetConfig, String> {
        let endpoints: Vec<String> =
            etcd.iter().flat_map(|e| e.split(',')).map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        Etcd::with_tls(&endpoints, Duration::from_secs(1), etcd_tls.as_ref())?;
        let key = crate::hex::decode(key_hex).map_err(|e| format!("key: {e}"))?;
        leasebox_proto::key::check_key(&key).map_err(|e| format!("key: {e}"))?;
        let mut c = FleetConfig::new(endpoints, Credentials { name: name.to_string(), key });
        c.etcd_tls = etcd_tls;
        if let Some(t) = timeout {
            if t.is_zero() {
                return Err("timeout must be positive".into());
            }
            c.timeouts = Timeouts { connect: t.min(c.timeouts.connect), receive: t, retry_for: t };
            c.rdma_timeout = t;
            c.wait = t;
        }
        Ok(c)
    }
}

/// One appliance of the fleet as this client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetMember {
    /// Its index in the client's list ([`crate::AllocOptions::prefer`], [`Client::call`]).
    pub index: usize,
    /// Its latest advertisement.
    pub advert: Advertisement,
    /// Whether its key is in etcd now (placement uses only these).
    pub present: bool,
    /// Its weight's factor now (below 1 for a while after a reboot).
    pub warmup: f64,
}

struct Entry {
    index: usize,
    advert: Advertisement,
    present: bool,
    rebooted_at: Option<Instant>,
    placed: placement::Placed,
}

#[derive(Default)]
struct State {
    /// By control address.
    entries: HashMap<String, Entry>,
    /// etcd key → control address.
    keys: HashMap<String, String>,
}

/// The fleet as the watch thread keeps it.
pub(crate) struct View {
    state: Mutex<State>,
    rng: Mutex<Rng>,
    warmup: Duration,
    stop: AtomicBool,
    join: Mutex<Option<JoinHandle<()>>>,
}

impl View {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The appliances to try for a new lease, in order (module docs; `prefer` first if it is in the fleet).
    pub(crate) fn order(&self, prefer: Option<usize>) -> Vec<usize> {
        let now = Instant::now();
        let cands: Vec<Candidate> = self
            .state()
            .entries
            .values()
            .filter(|e| e.present && e.advert.placeable())
            .map(|e| Candidate {
                index: e.index,
                weight: e.advert.free_bytes as f64
                    * e.rebooted_at.map_or(1.0, |t| placement::warmup(now - t, self.warmup)),
                placed: e.placed.now(now),
            })
            .collect();
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = || rng.next_u64();
        let order = placement::two_choices(&cands, &mut next);
        match prefer {
            Some(p) if order.contains(&p) => std::iter::once(p).chain(order.into_iter().filter(|&i| i != p)).collect(),
            _ => order,
        }
    }

    /// A lease of `bytes` went to appliance `index`.
    pub(crate) fn placed(&self, index: usize, bytes: u64) {
        if let Some(e) = self.state().entries.values_mut().find(|e| e.index == index) {
            e.placed.add(Instant::now(), bytes);
        }
    }

    pub(crate) fn members(&self) -> Vec<FleetMember> {
        let now = Instant::now();
        let mut v: Vec<FleetMember> = self
            .state()
            .entries
            .values()
            .map(|e| FleetMember {
                index: e.index,
                advert: e.advert.clone(),
                present: e.present,
                warmup: e.rebooted_at.map_or(1.0, |t| placement::warmup(now - t, self.warmup)),
            })
            .collect();
        v.sort_by_key(|m| m.index);
        v
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let j = self.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = j {
            let _ = j.join();
        }
    }
}

/// What the watch thread needs to add appliances.
struct Joiner {
    credentials: Credentials,
    requester: Option<RequesterConfig>,
    timeouts: Timeouts,
}

impl Joiner {
    fn requester(&self, ad: &Advertisement) -> RequesterConfig {
        if let Some(r) = &self.requester {
            return r.clone();
        }
        let mut soft = SoftConfig::default();
        if let Ok(peer) = ad.rdma.parse() {
            soft.peer = peer;
        }
        RequesterConfig::Soft(soft)
    }

    /// A connection thread for a newly advertised appliance (connected now if it answers, else in the
    /// background).
    fn session(&self, ad: &Advertisement, sink: Arc<Sink>) -> Result<Session, Error> {
        let t = Timeouts { retry_for: self.timeouts.connect, ..self.timeouts };
        let who = credentials_for(&self.credentials, ad);
        let conn = Connection::connect_and_hello(&ad.control, &who, t).ok().map(|(c, _)| c);
        Session::start(ad.control.clone(), who, self.timeouts, conn, sink)
    }
}

/// Who we are on the appliance `ad` advertises: our principal naming the appliance's registered name
/// (`TENANT[#ID]@NAME`, docs/security.md, "Appliance identity"), so that a HELLO meant for it fails on any
/// other appliance sharing the key. An advertisement without a name (an unnamed appliance, or a registrar older
/// than the field) leaves the configured principal as it is, `@NAME` included if the configuration gave one.
pub fn credentials_for(base: &Credentials, ad: &Advertisement) -> Credentials {
    if ad.name.is_empty() {
        return base.clone();
    }
    let principal = base.name.split_once('@').map_or(base.name.as_str(), |(p, _)| p);
    Credentials { name: format!("{principal}@{}", ad.name), key: base.key.clone() }
}

/// Applies one advertisement under `key`.
fn apply(view: &View, inner: &Inner, joiner: &Joiner, key: &str, ad: Advertisement) {
    let known = {
        let mut st = view.state();
        st.keys.insert(key.to_string(), ad.control.clone());
        match st.entries.get_mut(&ad.control) {
            Some(e) => {
                if e.advert.boot_id != ad.boot_id {
                    e.rebooted_at = Some(Instant::now());
                    // What we placed there went with the old boot.
                    e.placed = placement::Placed::default();
                }
                e.advert = ad.clone();
                e.present = true;
                true
            }
            None => false,
        }
    };
    if known {
        return;
    }
    // Connecting may take a while: not under the lock.
    let Ok(session) = joiner.session(&ad, inner.sink.clone()) else { return };
    let index = inner.add(session, joiner.requester(&ad));
    let mut st = view.state();
    st.entries.insert(
        ad.control.clone(),
        Entry { index, advert: ad, present: true, rebooted_at: None, placed: placement::Placed::default() },
    );
}

fn remove(view: &View, key: &str) {
    let mut st = view.state();
    if let Some(control) = st.keys.remove(key)
        && let Some(e) = st.entries.get_mut(&control)
        && e.advert.key() == key
    {
        e.present = false;
    }
}

/// A whole read of the prefix: every key applied, every entry whose key is gone taken out.
fn resync(view: &View, inner: &Inner, joiner: &Joiner, kvs: Vec<Kv>) {
    let mut live = Vec::new();
    for kv in kvs {
        if let Ok(ad) = Advertisement::from_json(&kv.value) {
            live.push(ad.control.clone());
            apply(view, inner, joiner, &kv.key, ad);
        }
    }
    let mut st = view.state();
    for (control, e) in st.entries.iter_mut() {
        if !live.contains(control) {
            e.present = false;
        }
    }
    st.keys.retain(|_, c| live.contains(c));
}

fn watch_loop(view: Weak<View>, inner: Weak<Inner>, joiner: Joiner, etcd: Etcd, mut revision: i64) {
    let mut backoff = Duration::from_millis(200);
    let alive = || view.upgrade().filter(|v| !v.stop.load(Ordering::Acquire));
    while let Some(v) = alive() {
        let Some(inn) = inner.upgrade() else { return };
        if revision == 0 {
            match etcd.get_prefix(PREFIX) {
                Ok((rev, kvs)) => {
                    resync(&v, &inn, &joiner, kvs);
                    revision = rev;
                    backoff = Duration::from_millis(200);
                }
                Err(_) => {
                    drop((v, inn));
                    sleep_unless_stopped(&view, backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let mut w = match etcd.watch(PREFIX, revision + 1, Duration::from_millis(200)) {
            Ok(w) => w,
            Err(_) => {
                revision = 0;
                drop((v, inn));
                sleep_unless_stopped(&view, backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        drop((v, inn));
        loop {
            let (Some(v), Some(inn)) = (alive(), inner.upgrade()) else { return };
            match w.next_events() {
                Ok(Some(events)) => {
                    for e in events {
                        match e {
                            WatchEvent::Put(kv) => {
                                revision = revision.max(kv.mod_revision);
                                if let Ok(ad) = Advertisement::from_json(&kv.value) {
                                    apply(&v, &inn, &joiner, &kv.key, ad);
                                }
                            }
                            WatchEvent::Delete { key, mod_revision } => {
                                revision = revision.max(mod_revision);
                                remove(&v, &key);
                            }
                        }
                    }
                }
                Ok(None) => {}
                // The stream broke (etcd restarted, compaction): read the whole prefix again.
                Err(_) => {
                    revision = 0;
                    break;
                }
            }
        }
    }
}

fn sleep_unless_stopped(view: &Weak<View>, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if view.upgrade().is_none_or(|v| v.stop.load(Ordering::Acquire)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Client {
    /// Connects to the appliances etcd advertises (docs/fleet.md) and keeps following them: new ones join,
    /// vanished ones get no new leases. Fails when etcd cannot be read, or when no appliance is advertised
    /// within `config.wait`.
    pub fn connect_fleet(config: FleetConfig) -> Result<Client, Error> {
        let wait = config.timeouts.connect.max(Duration::from_secs(1));
        let etcd = Etcd::with_tls(&config.etcd, wait, config.etcd_tls.as_ref())
            .map_err(Error::Config)?
            .with_user(config.etcd_user.clone());
        let engine = crate::engine::Engine::new(config.queue_depth)?;
        let (sink, rx) = Sink::new(config.on_event.clone());
        let view = Arc::new(View {
            state: Mutex::new(State::default()),
            rng: Mutex::new(Rng::from_os()),
            warmup: config.warmup,
            stop: AtomicBool::new(false),
            join: Mutex::new(None),
        });
        let client = Client::from_parts(
            Inner {
                members: Default::default(),
                timeouts: config.timeouts,
                rdma_timeout: config.rdma_timeout,
                sink,
                fleet: Some(view.clone()),
                engine,
                devices: Default::default(),
            },
            rx,
        );
        let joiner = Joiner {
            credentials: config.credentials.clone(),
            requester: config.requester.clone(),
            timeouts: config.timeouts,
        };
        let deadline = Instant::now() + config.wait;
        let revision = loop {
            let (rev, kvs) = etcd.get_prefix(PREFIX).map_err(|e| Error::Config(format!("etcd: {e}")))?;
            resync(&view, client.inner(), &joiner, kvs);
            if view.members().iter().any(|m| m.present) {
                break rev;
            }
            if Instant::now() >= deadline {
                return Err(Error::NoMemory {
                    size: 0,
                    tried: vec![("etcd".into(), format!("no appliance under {PREFIX}"))],
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (wv, wi) = (Arc::downgrade(&view), Arc::downgrade(client.inner_arc()));
        let join = std::thread::Builder::new()
            .name("leasebox fleet watch".into())
            .spawn(move || watch_loop(wv, wi, joiner, etcd, revision))
            .map_err(|e| Error::Config(format!("starting the etcd watch: {e}")))?;
        *view.join.lock().unwrap_or_else(|e| e.into_inner()) = Some(join);
        Ok(client)
    }

    /// The fleet as this client sees it (`None` for a client given its appliances).
    pub fn fleet(&self) -> Option<Vec<FleetMember>> {
        self.inner().fleet.as_ref().map(|f| f.members())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_appliance_is_named_as_registered() {
        let base =
            Credentials { name: "demo#1".into(), key: crate::hex::decode("5f0e1d2c3b4a69788796a5b4c3d2e1f0").unwrap() };
        let ad = |name: &str| Advertisement { name: name.into(), ..Advertisement::default() };
        assert_eq!(credentials_for(&base, &ad("mem-a")).name, "demo#1@mem-a");
        // Unnamed (or advertised by an older registrar): the configuration as given.
        assert_eq!(credentials_for(&base, &ad("")).name, "demo#1");
        let pinned = Credentials { name: "demo@old".into(), ..base.clone() };
        assert_eq!(credentials_for(&pinned, &ad("")).name, "demo@old");
        // The registration names the appliance the client reaches; a configured name does not override it.
        assert_eq!(credentials_for(&pinned, &ad("mem-b")).name, "demo@mem-b");
        assert_eq!(credentials_for(&pinned, &ad("mem-b")).key, base.key);
    }
}
