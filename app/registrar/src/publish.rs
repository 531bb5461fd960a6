//! The registrar's loop: an election lease kept alive, a campaign for leadership, and — while leading — each
//! answering appliance's advertisement under an etcd lease of its own, kept alive while the appliance answers
//! (docs/fleet.md, "How a key lives and dies").
//!
//! etcd writes per appliance: a PUT when the advertisement changes (free bytes, leases, health), a keepalive
//! every third of the TTL, a grant when the appliance (re)appears. An appliance that stops answering is simply
//! no longer kept alive: its key lapses with its lease. A registrar that cannot reach etcd retries with
//! exponential backoff (0.5 s to 8 s) and says so once per change of state.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_fleet::advert::{Advertisement, ELECTION};
use leasebox_fleet::etcd::{Etcd, EtcdError, LeaderKey};

use crate::config::{ApplianceSpec, Config};
use crate::metrics;
use crate::poll::{Poller, Sample, Seen};

/// etcd requests by kind, since start (`bench fleet`'s write load, and the metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Writes {
    pub puts: u64,
    pub keepalives: u64,
    pub grants: u64,
    pub revokes: u64,
}

impl Writes {
    pub fn total(&self) -> u64 {
        self.puts + self.keepalives + self.grants + self.revokes
    }
}

/// What the registrar says about itself.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub leader: bool,
    /// Whether the last etcd request succeeded.
    pub etcd_up: bool,
    pub etcd_error: Option<String>,
    /// Appliances whose key this registrar keeps alive now.
    pub published: usize,
    pub writes: Writes,
    /// Times leadership was won.
    pub elected: u64,
}

pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) seen: Vec<Arc<Mutex<Seen>>>,
    pub(crate) status: Mutex<Status>,
    election: Mutex<Election>,
    stop: AtomicBool,
    /// Stop as a crash would: no resign, no revoke.
    crash: AtomicBool,
}

#[derive(Default)]
struct Election {
    lease: i64,
    leader: Option<LeaderKey>,
}

impl Shared {
    pub(crate) fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn election(&self) -> std::sync::MutexGuard<'_, Election> {
        self.election.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    fn say(&self, what: &str) {
        eprintln!("leasebox-registrar[{}]: {what}", self.cfg.name);
    }
}

/// A running registrar: its pollers, its etcd loop, its campaign and (if configured) its metrics server.
pub struct Registrar {
    shared: Arc<Shared>,
    pollers: Vec<Poller>,
    threads: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
}

impl Registrar {
    pub fn start(cfg: Config) -> Result<Registrar, String> {
        let etcd =
            Etcd::with_tls(&cfg.etcd, Duration::from_secs(2), cfg.etcd_tls.as_ref())?.with_user(cfg.etcd_user.clone());
        let listener = match &cfg.metrics {
            Some(a) => Some(TcpListener::bind(a).map_err(|e| format!("metrics on {a}: {e}"))?),
            None => None,
        };
        let metrics_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        let pollers: Vec<Poller> = cfg.appliances.iter().map(|a| Poller::start(a.clone(), cfg.poll)).collect();
        let shared = Arc::new(Shared {
            seen: pollers.iter().map(|p| p.seen.clone()).collect(),
            cfg,
            status: Mutex::new(Status::default()),
            election: Mutex::new(Election::default()),
            stop: AtomicBool::new(false),
            crash: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let (s, e) = (shared.clone(), etcd.clone());
        threads.push(spawn("registrar etcd", move || publish_loop(&s, &e))?);
        let (s, e) = (shared.clone(), etcd);
        // The campaign blocks in etcd until it wins: not joined at stop (revoking the election lease ends it).
        spawn("registrar campaign", move || campaign_loop(&s, &e))?;
        if let Some(l) = listener {
            let s = shared.clone();
            threads.push(spawn("registrar metrics", move || metrics::serve(l, &s))?);
        }
        Ok(Registrar { shared, pollers, threads, metrics_addr })
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn status(&self) -> Status {
        self.shared.status().clone()
    }

    pub fn is_leader(&self) -> bool {
        self.shared.status().leader
    }

    /// The metrics page as `/metrics` serves it.
    pub fn render_metrics(&self) -> String {
        metrics::render(&self.shared)
    }

    /// Stops: resigns the leadership and revokes the election lease (a standby takes over at once); the
    /// appliances' keys stay until the next leader takes them over or their leases lapse.
    pub fn stop(self) {
        self.end(false)
    }

    /// Stops as a crash would (tests): nothing more is sent to etcd, so the election lease and every key lapse
    /// with their TTLs.
    pub fn crash(self) {
        self.end(true)
    }

    fn end(mut self, crash: bool) {
        self.shared.crash.store(crash, Ordering::Release);
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for p in &mut self.pollers {
            p.stop();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, String> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| format!("starting {name}: {e}"))
}

/// The advertisement for an appliance's last answer.
pub fn advertisement(spec: &ApplianceSpec, s: &Sample, registrar: &str) -> Advertisement {
    let l = &s.stats.leases;
    Advertisement {
        boot_id: s.boot_id.clone(),
        control: spec.control.clone(),
        name: spec.name.clone(),
        rdma: spec.rdma.clone(),
        free_bytes: l.bytes_free,
        leased_bytes: l.bytes_leased,
        leases: l.by_state,
        fenced_slots: s.health.fenced_slots.max(l.fenced_slots),
        health: s.health.status.name().to_string(),
        hca: s.health.hca.name().to_string(),
        labels: spec.labels.clone(),
        registrar: registrar.to_string(),
    }
}

/// One appliance's key as this registrar keeps it.
struct Published {
    boot_id: String,
    key: String,
    lease: i64,
    json: String,
    kept_at: Instant,
}

fn lease_gone(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Refused { message, .. } if message.contains("lease not found"))
}

struct Loop<'a> {
    sh: &'a Shared,
    etcd: &'a Etcd,
    keys: HashMap<usize, Published>,
    election_kept: Instant,
    /// After a failure, the election lease is confirmed before anything is published.
    confirm: bool,
}

impl Loop<'_> {
    fn count(&self, f: impl FnOnce(&mut Writes)) {
        f(&mut self.sh.status().writes);
    }

    fn step(&mut self) -> Result<(), EtcdError> {
        let cfg = &self.sh.cfg;
        let election_every = Duration::from_secs(cfg.election_ttl_s as u64) / 3;
        let lease = self.sh.election().lease;
        if lease == 0 {
            let id = self.etcd.grant(cfg.election_ttl_s)?;
            self.count(|w| w.grants += 1);
            self.sh.election().lease = id;
            self.election_kept = Instant::now();
            self.confirm = false;
        } else if self.confirm || self.election_kept.elapsed() >= election_every {
            let ttl = self.etcd.keepalive(lease)?;
            self.count(|w| w.keepalives += 1);
            self.confirm = false;
            if ttl == 0 {
                // The election lease lapsed (etcd unreachable too long, or its data lost): no longer leading.
                let was = self.sh.election().leader.take().is_some();
                self.sh.election().lease = 0;
                self.sh.status().leader = false;
                self.keys.clear();
                if was {
                    self.sh.say("the election lease lapsed: no longer leading");
                }
                return Ok(());
            }
            self.election_kept = Instant::now();
        }
        let leading = self.sh.election().leader.is_some();
        if !leading {
            self.keys.clear();
            self.sh.status().published = 0;
            return Ok(());
        }
        let ttl = Duration::from_secs(cfg.ttl_s as u64);
        for (i, spec) in cfg.appliances.iter().enumerate() {
            let seen = self.sh.seen[i].lock().unwrap_or_else(|e| e.into_inner()).clone();
            let sample = match (&seen.last, seen.ok) {
                (Some(s), true) => s.clone(),
                _ => {
                    // Not answering: no keepalive, the key lapses; forget a lease that must have lapsed.
                    if self.keys.get(&i).is_some_and(|p| p.kept_at.elapsed() > ttl) {
                        self.keys.remove(&i);
                    }
                    continue;
                }
            };
            self.publish(i, advertisement(spec, &sample, &cfg.name))?;
        }
        self.sh.status().published = self.keys.len();
        Ok(())
    }

    fn publish(&mut self, i: usize, ad: Advertisement) -> Result<(), EtcdError> {
        let cfg = &self.sh.cfg;
        let json = ad.to_json();
        if let Some(p) = self.keys.get(&i)
            && p.boot_id != ad.boot_id
        {
            // A reboot: the old boot's key goes now (its leases are gone with it).
            let old = self.keys.remove(&i).expect("present");
            let _ = self.etcd.revoke(old.lease);
            self.count(|w| w.revokes += 1);
        }
        let keep_every = Duration::from_secs(cfg.ttl_s as u64) / 3;
        if let Some(p) = self.keys.get_mut(&i) {
            let mut gone = false;
            if p.json != json {
                match self.etcd.put(&p.key, json.as_bytes(), p.lease) {
                    Ok(_) => p.json = json.clone(),
                    Err(e) if lease_gone(&e) => gone = true,
                    Err(e) => return Err(e),
                }
                self.sh.status().writes.puts += 1;
            }
            if !gone && p.kept_at.elapsed() >= keep_every {
                gone = self.etcd.keepalive(p.lease)? == 0;
                self.sh.status().writes.keepalives += 1;
                p.kept_at = Instant::now();
            }
            if !gone {
                return Ok(());
            }
            self.keys.remove(&i);
        }
        let lease = self.etcd.grant(cfg.ttl_s)?;
        self.count(|w| w.grants += 1);
        self.etcd.put(&ad.key(), json.as_bytes(), lease)?;
        self.count(|w| w.puts += 1);
        self.keys
            .insert(i, Published { boot_id: ad.boot_id.clone(), key: ad.key(), lease, json, kept_at: Instant::now() });
        Ok(())
    }
}

fn publish_loop(sh: &Shared, etcd: &Etcd) {
    let mut l = Loop { sh, etcd, keys: HashMap::new(), election_kept: Instant::now(), confirm: false };
    let (min, max) = (Duration::from_millis(500), Duration::from_secs(8));
    let mut backoff = min;
    let mut next = Instant::now();
    let tick = (sh.cfg.poll / 4).clamp(Duration::from_millis(50), Duration::from_millis(250));
    while !sh.stopping() {
        if Instant::now() >= next {
            match l.step() {
                Ok(()) => {
                    let was_down = {
                        let mut s = sh.status();
                        let was = !s.etcd_up && s.etcd_error.is_some();
                        s.etcd_up = true;
                        s.etcd_error = None;
                        was
                    };
                    if was_down {
                        sh.say("etcd reachable again");
                    }
                    backoff = min;
                    next = Instant::now() + tick;
                }
                Err(e) => {
                    let first = sh.status().etcd_error.is_none();
                    {
                        let mut s = sh.status();
                        s.etcd_up = false;
                        s.etcd_error = Some(e.to_string());
                    }
                    if first {
                        sh.say(&format!(
                            "{e}; retrying with backoff ({} ms, doubling to {} s)",
                            backoff.as_millis(),
                            max.as_secs()
                        ));
                    }
                    l.confirm = true;
                    next = Instant::now() + backoff;
                    backoff = (backoff * 2).min(max);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if sh.crash.load(Ordering::Acquire) {
        return;
    }
    let (leader, lease) = {
        let mut e = sh.election();
        (e.leader.take(), std::mem::take(&mut e.lease))
    };
    if let Some(k) = leader {
        let _ = etcd.resign(&k);
    }
    if lease != 0 {
        let _ = etcd.revoke(lease);
    }
    sh.status().leader = false;
}

fn campaign_loop(sh: &Shared, etcd: &Etcd) {
    while !sh.stopping() {
        let (lease, leading) = {
            let e = sh.election();
            (e.lease, e.leader.is_some())
        };
        if lease == 0 || leading {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match etcd.campaign(ELECTION, lease, sh.cfg.name.as_bytes(), Duration::from_secs(10)) {
            Ok(key) => {
                if sh.stopping() && sh.crash.load(Ordering::Acquire) {
                    return;
                }
                let mut e = sh.election();
                if e.lease == lease {
                    e.leader = Some(key);
                    drop(e);
                    let mut s = sh.status();
                    s.leader = true;
                    s.elected += 1;
                    drop(s);
                    sh.say("leading: publishing the appliances");
                }
            }
            // Not leading yet (the wait ran out), or etcd unreachable (the etcd loop says so): again.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
