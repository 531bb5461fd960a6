//! The store's figures ([`super::Store::stats`]): counters, latency histograms, and their Prometheus text
//! exposition (format 0.0.4: `# HELP`, `# TYPE`, one sample a line; histograms as cumulative `_bucket{le=..}`
//! samples with `_sum` and `_count`; docs/reference/prometheus-text.md).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The histograms' upper bounds, in seconds (the last bucket, `+Inf`, is implied).
pub const BUCKETS: [f64; 15] =
    [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0];

/// A latency histogram updated without a lock.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram's figures at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative), the last one past [`BUCKETS`]' end.
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    /// The upper bound (seconds) of the bucket where quantile `q` (0 to 1) falls; `None` when empty or past the
    /// last bound.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let want = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return BUCKETS.get(i).copied();
            }
        }
        None
    }
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS.iter().position(|b| s <= *b).unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let count = counts.iter().sum();
        HistogramSnapshot { counts, count, sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9 }
    }
}

/// The counters the store keeps as it works.
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub puts: AtomicU64,
    pub put_failures: AtomicU64,
    pub get_failures: AtomicU64,
    pub evictions: AtomicU64,
    pub lost_by_revoke: AtomicU64,
    pub migrated: AtomicU64,
    pub removes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub put_latency: Histogram,
    pub get_latency: Histogram,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The store's figures at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Gets (and `is_exist` checks are not counted) that found their key.
    pub hits: u64,
    /// Gets whose key was not there (never put, removed, evicted, or lost with its lease).
    pub misses: u64,
    /// Puts that landed.
    pub puts: u64,
    /// Puts that failed (too large, no space, the lease revoked mid-write, a timeout).
    pub put_failures: u64,
    /// Gets of a key that was there whose read failed (the lease revoked mid-read, a timeout).
    pub get_failures: u64,
    /// Keys evicted to make room.
    pub evictions: u64,
    /// Keys that left the index because their lease was revoked, fenced, or its appliance rebooted or drained.
    pub lost_by_revoke: u64,
    /// Keys copied to another appliance during a drain.
    pub migrated: u64,
    pub removes: u64,
    /// Value bytes written by puts that landed, and read by gets that did.
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Keys stored now and their values' bytes.
    pub keys: u64,
    pub bytes_stored: u64,
    /// Bytes of the leases that take new values, and of them, free.
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// Leases held now (not lost).
    pub leases: u64,
    pub put_latency: HistogramSnapshot,
    pub get_latency: HistogramSnapshot,
}

fn counter(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(out, "# HELP leasebox_kv_{name} {help}\n# TYPE leasebox_kv_{name} {kind}\nleasebox_kv_{name} {v}");
}

fn histogram(out: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    let _ = writeln!(out, "# HELP leasebox_kv_{name} {help}\n# TYPE leasebox_kv_{name} histogram");
    let mut cumulative = 0;
    for (i, c) in h.counts.iter().enumerate() {
        cumulative += c;
        match BUCKETS.get(i) {
            Some(b) => {
                let _ = writeln!(out, "leasebox_kv_{name}_bucket{{le=\"{b}\"}} {cumulative}");
            }
            None => {
                let _ = writeln!(out, "leasebox_kv_{name}_bucket{{le=\"+Inf\"}} {cumulative}");
            }
        }
    }
    let _ = writeln!(out, "leasebox_kv_{name}_sum {}\nleasebox_kv_{name}_count {}", h.sum_seconds, h.count);
}

impl Stats {
    /// The Prometheus text exposition of these figures (metric names `leasebox_kv_*`).
    pub fn prometheus(&self) -> String {
        let mut o = String::new();
        counter(&mut o, "hits_total", "Gets that found their key.", "counter", self.hits);
        counter(&mut o, "misses_total", "Gets whose key was not there.", "counter", self.misses);
        counter(&mut o, "puts_total", "Puts that landed.", "counter", self.puts);
        counter(&mut o, "put_failures_total", "Puts that failed.", "counter", self.put_failures);
        counter(&mut o, "get_failures_total", "Gets of a present key whose read failed.", "counter", self.get_failures);
        counter(&mut o, "evictions_total", "Keys evicted to make room.", "counter", self.evictions);
        counter(&mut o, "lost_by_revoke_total", "Keys lost with their lease.", "counter", self.lost_by_revoke);
        counter(&mut o, "migrated_total", "Keys copied off a draining appliance.", "counter", self.migrated);
        counter(&mut o, "removes_total", "Keys removed by the program.", "counter", self.removes);
        counter(
            &mut o,
            "written_bytes_total",
            "Value bytes written by puts that landed.",
            "counter",
            self.bytes_written,
        );
        counter(
            &mut o,
            "read_bytes_total",
            "Value bytes read by gets that found their key.",
            "counter",
            self.bytes_read,
        );
        counter(&mut o, "keys", "Keys stored.", "gauge", self.keys);
        counter(&mut o, "stored_bytes", "Bytes of the values stored.", "gauge", self.bytes_stored);
        counter(&mut o, "capacity_bytes", "Bytes of the leases that take new values.", "gauge", self.capacity_bytes);
        counter(&mut o, "free_bytes", "Free bytes in the leases that take new values.", "gauge", self.free_bytes);
        counter(&mut o, "leases", "Leases held.", "gauge", self.leases);
        histogram(&mut o, "put_seconds", "Put latency (submit to result).", &self.put_latency);
        histogram(&mut o, "get_seconds", "Get latency (submit to result).", &self.get_latency);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_their_buckets_and_quantiles_read_back() {
        let h = Histogram::default();
        h.record(Duration::from_micros(5));
        h.record(Duration::from_micros(30));
        h.record(Duration::from_micros(30));
        h.record(Duration::from_secs(3));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!((s.counts[0], s.counts[2], s.counts[BUCKETS.len()]), (1, 2, 1));
        assert_eq!(s.quantile_bound(0.5), Some(50e-6));
        assert_eq!(s.quantile_bound(0.99), None, "past the last bound");
        assert!((s.sum_seconds - 3.000065).abs() < 1e-9);
        assert_eq!(HistogramSnapshot::default().quantile_bound(0.5), None);
    }

    #[test]
    fn the_prometheus_text_has_every_family_once_with_cumulative_buckets() {
        let h = Histogram::default();
        h.record(Duration::from_micros(5));
        h.record(Duration::from_millis(2));
        let s = Stats { hits: 7, misses: 2, get_latency: h.snapshot(), ..Stats::default() };
        let text = s.prometheus();
        assert!(text.contains("# TYPE leasebox_kv_hits_total counter\nleasebox_kv_hits_total 7\n"), "{text}");
        assert!(text.contains("leasebox_kv_misses_total 2\n"));
        assert!(text.contains("leasebox_kv_get_seconds_bucket{le=\"0.00001\"} 1\n"), "{text}");
        assert!(text.contains("leasebox_kv_get_seconds_bucket{le=\"0.0025\"} 2\n"), "{text}");
        assert!(text.contains("leasebox_kv_get_seconds_bucket{le=\"+Inf\"} 2\nleasebox_kv_get_seconds_sum "), "{text}");
        assert!(text.contains("leasebox_kv_get_seconds_count 2\n"), "{text}");
        assert_eq!(text.matches("# TYPE ").count(), 18);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(name.starts_with("leasebox_kv_"), "{line}");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
