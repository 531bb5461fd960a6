//! One thread per appliance: every poll period, STATS, HEALTH and HCA_STATS as the admin over one control
//! connection (protocol v2; made again after any failure). The last result is kept for the publisher and the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_client::{ClientError, Connection, Credentials, Timeouts};
use leasebox_proto::{HcaStats, Health, Request, Response, Stats};

use crate::config::ApplianceSpec;

/// What one poll learned.
#[derive(Clone, Debug)]
pub struct Sample {
    pub stats: Stats,
    pub health: Health,
    /// The command queue's counters (none from an appliance that drives no mlx5 command queue, or that
    /// predates HCA_STATS).
    pub hca: Option<HcaStats>,
    /// The boot id in hex.
    pub boot_id: String,
}

/// The appliance's last answers.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The last poll that answered.
    pub last: Option<Sample>,
    /// When the last poll that answered ended.
    pub answered_at: Option<Instant>,
    /// Whether the latest poll answered; its error otherwise.
    pub ok: bool,
    pub error: Option<String>,
    pub polls_ok: u64,
    pub polls_failed: u64,
}

/// Asks STATS, HEALTH and HCA_STATS on `conn`.
pub fn ask(conn: &mut Connection) -> Result<Sample, String> {
    // With the guard block where the appliance has one.
    let stats = conn.stats().map_err(|e| format!("STATS: {e}"))?;
    let health = match conn.call(&Request::Health).map_err(|e| format!("HEALTH: {e}"))? {
        Response::Health(h) => h,
        other => return Err(format!("HEALTH answered {other:?}")),
    };
    // The counters are extra: an appliance without a command queue (NOT_IMPLEMENTED), one older than the
    // operation (UNKNOWN_OP) or one that refuses it for now still answered the poll; only a broken connection
    // fails it.
    let hca = match conn.call(&Request::HcaStats) {
        Ok(Response::HcaStats(c)) => Some(c),
        Ok(other) => return Err(format!("HCA_STATS answered {other:?}")),
        Err(ClientError::Server(_)) => None,
        Err(e) => return Err(format!("HCA_STATS: {e}")),
    };
    let boot_id = leasebox_client::hex::encode(&stats.boot_id);
    Ok(Sample { stats, health, hca, boot_id })
}

/// A polling thread.
pub struct Poller {
    pub spec: ApplianceSpec,
    pub seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl Poller {
    pub fn start(spec: ApplianceSpec, every: Duration) -> Poller {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st, sp) = (seen.clone(), stop.clone(), spec.clone());
        let join = std::thread::Builder::new()
            .name(format!("poll {}", spec.control))
            .spawn(move || run(sp, every, s, st))
            .expect("spawning a poll thread");
        Poller { spec, seen, stop, join: Some(join) }
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(spec: ApplianceSpec, every: Duration, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    // A named appliance takes only HELLOs that name it (docs/security.md, "Appliance identity").
    let name = if spec.name.is_empty() { "admin".to_string() } else { format!("admin@{}", spec.name) };
    let who = Credentials { name, key: spec.admin_key.clone() };
    // A poll that gets no answer within 2 s (or the period, if longer) counts as failed: the key of an appliance
    // that does not answer is not kept alive. Not shorter: a loaded host (or appliance) that answers a little
    // late must not lose its key.
    let t = every.max(Duration::from_secs(2));
    let timeouts = Timeouts { connect: Duration::from_secs(1), receive: t, retry_for: t };
    let mut conn: Option<Connection> = None;
    while !stop.load(Ordering::Acquire) {
        let started = Instant::now();
        let result = (|| {
            if conn.is_none() {
                conn = Some(Connection::connect_and_hello(&spec.control, &who, timeouts).map_err(|e| e.to_string())?.0);
            }
            ask(conn.as_mut().expect("connected just now"))
        })();
        {
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(sample) => {
                    s.last = Some(sample);
                    s.answered_at = Some(Instant::now());
                    s.ok = true;
                    s.error = None;
                    s.polls_ok += 1;
                }
                Err(e) => {
                    conn = None;
                    s.ok = false;
                    s.error = Some(e);
                    s.polls_failed += 1;
                }
            }
        }
        // Sleep out the period in small steps, so stop is prompt.
        while !stop.load(Ordering::Acquire) && started.elapsed() < every {
            std::thread::sleep(Duration::from_millis(20).min(every.saturating_sub(started.elapsed())));
        }
    }
    if let Some(c) = conn {
        let _ = c.bye();
    }
}
