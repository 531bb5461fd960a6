//! `leasectl verify --perf SIZES`: RDMA WRITE and READ latency and bandwidth on one lease, through the same
//! requester backends and cable options as the revoke verifier (`cargo xtask bench rxe` compares Linux's
//! Soft-RoCE against the model and against a real rxe responder with it).
//!
//! For each size and each of WRITE and READ: the latency is measured with one request outstanding (post,
//! wait for its completion; p50 and p99 over the samples), the bandwidth with `depth` requests outstanding for
//! the same time, counting the bytes of completed requests over the elapsed time. Every completion must
//! succeed; the first that does not ends the run with its status. The lease is freed at the end.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use leasebox_proto::Request;
use serde_json::{Value, json};

use super::{Control, RequesterFactory, VerifyError, connect, local, open_lease};
use crate::rdma::{Requester, WcStatus};

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfOptions {
    /// Bytes per request, each measured in turn.
    pub sizes: Vec<u32>,
    /// Time per figure (latency, then bandwidth, for each size and operation).
    pub phase: Duration,
    /// Requests outstanding in the bandwidth phase.
    pub depth: usize,
}

/// The most latency samples kept per figure.
const MAX_SAMPLES: usize = 100_000;

/// One line of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfRow {
    pub op: &'static str,
    pub size: u32,
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Bandwidth phase: requests completed per second and MiB/s of payload.
    pub ops_per_s: f64,
    pub mib_per_s: f64,
}

impl PerfRow {
    pub fn json(&self) -> Value {
        json!({
            "op": self.op, "size": self.size, "samples": self.samples, "p50_us": self.p50_us,
            "p99_us": self.p99_us, "ops_per_s": self.ops_per_s, "mib_per_s": self.mib_per_s,
        })
    }

    pub fn human(&self) -> String {
        format!(
            "{:<5} {:>8} B  latency p50 {:>9.1} us  p99 {:>9.1} us ({} samples)  bandwidth {:>9.0} ops/s {:>8.1} MiB/s",
            self.op, self.size, self.p50_us, self.p99_us, self.samples, self.ops_per_s, self.mib_per_s
        )
    }
}

/// The `q`-quantile (0..=1) of sorted `v`, in microseconds.
pub fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Read,
}

struct Bench<'a> {
    r: &'a mut dyn Requester,
    base: u64,
    rkey: u32,
    /// One region per outstanding request, `stride` bytes apart.
    stride: u64,
    next_wr: u64,
    /// wr_id → (region, posted at).
    posted: HashMap<u64, (usize, Instant)>,
    free_regions: Vec<usize>,
}

impl Bench<'_> {
    fn post(&mut self, op: Op, size: u32, data: &[u8]) -> Result<(), VerifyError> {
        let region = self.free_regions.pop().ok_or_else(|| local("no free region".into()))?;
        let (wr, addr) = (self.next_wr, self.base + region as u64 * self.stride);
        self.next_wr += 1;
        // Timed from before the post: a kernel stack may finish the whole exchange inside the post call (rxe
        // handles the answer's interrupt before the system call returns on a busy single-CPU guest).
        let at = Instant::now();
        let r = match op {
            Op::Write => self.r.post_write(wr, addr, self.rkey, &data[..size as usize]),
            Op::Read => self.r.post_read(wr, addr, self.rkey, size),
        };
        r.map_err(|e| local(format!("posting: {e}")))?;
        self.posted.insert(wr, (region, at));
        Ok(())
    }

    /// Waits for completions (at most until `until`); returns each one's latency.
    fn reap(&mut self, until: Instant) -> Result<Vec<Duration>, VerifyError> {
        let wait = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
        let mut out = Vec::new();
        for c in self.r.poll(wait) {
            let Some((region, at)) = self.posted.remove(&c.wr_id) else { continue };
            self.free_regions.push(region);
            let _ = self.r.read_data(c.wr_id);
            if c.status != WcStatus::Success {
                return Err(local(format!("request {} completed with {}", c.wr_id, c.status.name())));
            }
            out.push(c.at.saturating_duration_since(at));
        }
        Ok(out)
    }

    /// Waits for every outstanding request (up to `limit`); returns how many completed.
    fn settle(&mut self, limit: Duration) -> Result<u64, VerifyError> {
        let end = Instant::now() + limit;
        let mut n = 0;
        while !self.posted.is_empty() {
            if Instant::now() >= end {
                return Err(local(format!("{} requests did not complete", self.posted.len())));
            }
            n += self.reap(end)?.len() as u64;
        }
        Ok(n)
    }

    fn row(&mut self, op: Op, size: u32, o: &PerfOptions, data: &[u8]) -> Result<PerfRow, VerifyError> {
        let name = if op == Op::Write { "write" } else { "read" };
        // Latency: one at a time.
        let mut lat = Vec::new();
        let end = Instant::now() + o.phase;
        while Instant::now() < end && lat.len() < MAX_SAMPLES {
            self.post(op, size, data)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let got = self.reap(deadline)?;
                if !got.is_empty() {
                    lat.extend(got);
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(local(format!("a {name} of {size} bytes did not complete within 30 s")));
                }
            }
        }
        lat.sort();
        // Bandwidth: `depth` outstanding.
        let start = Instant::now();
        let end = start + o.phase;
        let mut done = 0u64;
        while Instant::now() < end {
            while self.posted.len() < o.depth {
                self.post(op, size, data)?;
            }
            done += self.reap(end)?.len() as u64;
        }
        // The requests still outstanding at the end count, and so does the time they take.
        done += self.settle(Duration::from_secs(30))?;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        Ok(PerfRow {
            op: name,
            size,
            samples: lat.len(),
            p50_us: quantile_us(&lat, 0.5),
            p99_us: quantile_us(&lat, 0.99),
            ops_per_s: done as f64 / secs,
            mib_per_s: done as f64 * f64::from(size) / secs / f64::from(1u32 << 20),
        })
    }
}

/// Runs the measurements on one lease of `depth` regions of the largest size.
pub fn run(
    o: &PerfOptions,
    control: &Control,
    requesters: &mut RequesterFactory<'_>,
) -> Result<Vec<PerfRow>, VerifyError> {
    let largest = u64::from(o.sizes.iter().copied().max().unwrap_or(0));
    if largest == 0 || o.depth == 0 {
        return Err(super::usage("--perf needs sizes of at least 1 byte and --depth of at least 1".into()));
    }
    let mut tenant = connect(control, &control.tenant)?;
    let mut r = requesters().map_err(|e| local(format!("requester: {e}")))?;
    let a = open_lease(&mut tenant, r.as_mut(), largest * o.depth as u64)?;
    let data: Vec<u8> = (0..largest).map(|i| (i as u8) ^ 0x5a).collect();
    let mut b = Bench {
        r: r.as_mut(),
        base: a.remote_addr,
        rkey: a.rkey,
        stride: largest,
        next_wr: 1,
        posted: HashMap::new(),
        free_regions: (0..o.depth).rev().collect(),
    };
    let mut rows = Vec::new();
    let mut result = Ok(());
    'sizes: for &size in &o.sizes {
        for op in [Op::Write, Op::Read] {
            match b.row(op, size, o, &data) {
                Ok(row) => rows.push(row),
                Err(e) => {
                    result = Err(e);
                    break 'sizes;
                }
            }
        }
    }
    drop(b);
    drop(r);
    let _ = tenant.call(&Request::Free { lease: a.lease });
    let _ = tenant.bye();
    result.map(|()| rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile_us(&v, 0.5), 51.0);
        assert_eq!(quantile_us(&v, 0.99), 99.0);
        assert_eq!(quantile_us(&[], 0.5), 0.0);
    }

    #[test]
    fn rows_print_and_serialize() {
        let r = PerfRow {
            op: "write",
            size: 64,
            samples: 10,
            p50_us: 12.5,
            p99_us: 30.0,
            ops_per_s: 1000.0,
            mib_per_s: 0.06,
        };
        assert_eq!(r.json()["p50_us"], 12.5);
        assert!(r.human().starts_with("write       64 B  latency p50      12.5 us"), "{}", r.human());
    }
}
