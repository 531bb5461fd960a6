//! `leasectl bench-data`: the client library's data path measured on one client and one lease.
//! For each of [`SIZES`], writes then reads: the copying calls (`Lease::write` / `Lease::read`, which block:
//! depth 1) and zero copy (`Op::write_from` / `Op::read_into` batches from a registered region, `depth`
//! operations in flight, each finished one replaced by the next) at each of [`DEPTHS`]; operations/s and MiB/s
//! per cell.
//!
//! The same code measures the software requester (`cargo xtask bench client` calls [`rows`] in-process against
//! the hosted appliance) and verbs (`--backend verbs --device rxe0`, run inside the Soft-RoCE guest against the
//! QEMU appliance and against the rxe reference responder); `--json` hands the rows to the bench
//! ([`rows_from_json`]).

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use leasebox_client::{AllocOptions, Appliance, Client, ClientConfig, Lease, Op, Region, RequesterConfig, Ticket};
use serde_json::{Value, json};

use crate::args::{Global, number};
use crate::client::exit;

/// Transfer sizes, one pair of rows (write, read) each.
pub const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Zero-copy operations kept in flight on the lease.
pub const DEPTHS: [usize; 3] = [1, 16, 64];
/// The lease (default): the operations in flight go to slots of one size each, `span / size` of them at most
/// (1 MiB at depth 64 reuses 16 slots of the lease). The registered region has a slot of its own for each
/// operation in flight ([`REGION`]): the library refuses a READ into bytes another transfer in flight holds.
pub const DEFAULT_SPAN: usize = 16 << 20;
/// The registered region: the largest size at the largest depth.
pub const REGION: usize = SIZES[SIZES.len() - 1] * DEPTHS[DEPTHS.len() - 1];
/// Time per cell by default.
pub const DEFAULT_PER: Duration = Duration::from_millis(1000);

/// One measured cell: `ops` operations of `bytes` each completed in `secs`; `error`: what stopped it early.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rate {
    pub ops: u64,
    pub bytes: usize,
    pub secs: f64,
    pub error: Option<String>,
}

impl Rate {
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }

    pub fn mib_per_s(&self) -> f64 {
        self.ops_per_s() * self.bytes as f64 / (1 << 20) as f64
    }

    /// `ops/s, MiB/s` for a table cell.
    pub fn cell(&self) -> String {
        match &self.error {
            Some(e) if self.ops == 0 => format!("error: {e}"),
            Some(_) => format!("{:.0} ops/s, {:.1} MiB/s (then an error)", self.ops_per_s(), self.mib_per_s()),
            None => format!("{:.0} ops/s, {:.1} MiB/s", self.ops_per_s(), self.mib_per_s()),
        }
    }

    fn json(&self) -> Value {
        json!({"ops": self.ops, "secs": self.secs, "error": self.error})
    }

    fn from_json(v: &Value, bytes: usize) -> Result<Rate, String> {
        let ops = v["ops"].as_u64().ok_or_else(|| format!("a cell without ops: {v}"))?;
        let secs = v["secs"].as_f64().ok_or_else(|| format!("a cell without secs: {v}"))?;
        Ok(Rate { ops, bytes, secs, error: v["error"].as_str().map(str::to_string) })
    }
}

/// One row: a size and a direction; the copying calls at depth 1, zero copy at each of [`DEPTHS`].
#[derive(Clone, Debug, PartialEq)]
pub struct DataRow {
    pub bytes: usize,
    pub read: bool,
    pub copying: Rate,
    pub zero_copy: [Rate; 3],
}

impl DataRow {
    pub fn json(&self) -> Value {
        json!({
            "bytes": self.bytes,
            "op": if self.read { "read" } else { "write" },
            "copying": self.copying.json(),
            "zero_copy": DEPTHS.iter().zip(&self.zero_copy).map(|(d, r)| {
                let mut v = r.json();
                v["depth"] = json!(d);
                v
            }).collect::<Vec<_>>(),
        })
    }
}

/// The rows of `leasectl --json bench-data`'s object (`{"bench_data": {"per_ms", "rows": [...]}}`).
pub fn rows_from_json(v: &Value) -> Result<Vec<DataRow>, String> {
    let rows = v["bench_data"]["rows"].as_array().ok_or("no bench_data.rows in the JSON")?;
    rows.iter()
        .map(|r| {
            let bytes = r["bytes"].as_u64().ok_or_else(|| format!("a row without bytes: {r}"))? as usize;
            let read = match r["op"].as_str() {
                Some("read") => true,
                Some("write") => false,
                _ => return Err(format!("a row whose op is not read or write: {r}")),
            };
            let copying = Rate::from_json(&r["copying"], bytes)?;
            let zc = r["zero_copy"].as_array().ok_or_else(|| format!("a row without zero_copy: {r}"))?;
            if zc.len() != DEPTHS.len() {
                return Err(format!("a row with {} zero-copy cells, not {}: {r}", zc.len(), DEPTHS.len()));
            }
            let mut zero_copy: [Rate; 3] = Default::default();
            for (z, v) in zero_copy.iter_mut().zip(zc) {
                *z = Rate::from_json(v, bytes)?;
            }
            Ok(DataRow { bytes, read, copying, zero_copy })
        })
        .collect()
}

/// Zero copy at `depth`: `depth` operations in flight on `lease`, operation `i` on the `bytes` slot `i mod depth`
/// of `region` and `i mod lease_slots` of the lease, each one finished replaced by the next, for `per`.
#[allow(clippy::too_many_arguments)]
fn zero_copy(
    c: &Client,
    lease: &Lease,
    region: &Region<'static>,
    lease_slots: usize,
    bytes: usize,
    depth: usize,
    read: bool,
    per: Duration,
) -> Rate {
    let mut r = Rate { bytes, ..Rate::default() };
    let lease_slots = lease_slots.clamp(1, depth) as u64;
    let op = |i: u64| {
        let at = (i % depth as u64) as usize * bytes;
        let lease_at = (i % lease_slots) * bytes as u64;
        if read {
            Op::read_into(lease, region, at, lease_at, bytes)
        } else {
            Op::write_from(lease, region, at, lease_at, bytes)
        }
    };
    let (mut next, mut queue, mut done) = (0u64, VecDeque::<Ticket>::new(), HashSet::<u64>::new());
    let t0 = Instant::now();
    let end = t0 + per;
    let submit = |n: usize, next: &mut u64, queue: &mut VecDeque<Ticket>| {
        let ops: Vec<_> = (0..n).map(|k| op(*next + k as u64)).collect();
        *next += n as u64;
        queue.extend(c.submit(ops));
    };
    submit(depth, &mut next, &mut queue);
    while let Some(&first) = queue.front() {
        if !done.remove(&first.id()) {
            let mut got = match c.wait(first, Duration::from_secs(10)) {
                Ok(g) => g,
                Err(e) => {
                    r.error = Some(e.to_string());
                    break;
                }
            };
            got.extend(c.poll(usize::MAX));
            let mut failed = None;
            for (t, res) in got {
                match res {
                    Ok(_) => {
                        done.insert(t.id());
                    }
                    Err(e) => failed = Some(e.to_string()),
                }
            }
            if let Some(e) = failed {
                r.error = Some(e);
                break;
            }
            if !done.remove(&first.id()) {
                continue;
            }
        }
        queue.pop_front();
        r.ops += 1;
        let mut refill = 1;
        while let Some(&t) = queue.front() {
            if !done.remove(&t.id()) {
                break;
            }
            queue.pop_front();
            r.ops += 1;
            refill += 1;
        }
        if Instant::now() < end {
            submit(refill, &mut next, &mut queue);
        }
    }
    r.secs = t0.elapsed().as_secs_f64();
    if r.error.is_some() {
        // Take what is still in flight so the next cell starts clean.
        let _ = c.wait(leasebox_client::Wait::All, Duration::from_secs(10));
    }
    r
}

/// The copying calls, one at a time, for `per`.
fn copying(lease: &mut Lease, buf: &mut [u8], read: bool, per: Duration) -> Rate {
    let mut r = Rate { bytes: buf.len(), ..Rate::default() };
    let t0 = Instant::now();
    while t0.elapsed() < per {
        let res = if read { lease.read(0, buf) } else { lease.write(0, buf) };
        if let Err(e) = res {
            r.error = Some(e.to_string());
            break;
        }
        r.ops += 1;
    }
    r.secs = t0.elapsed().as_secs_f64();
    r
}

/// Every row on client `c`: one lease of `span` bytes (at least the largest size), a registered region of
/// [`REGION`] bytes, `per` per cell. The lease is freed at the end.
pub fn rows(c: &Client, per: Duration, span: usize) -> Result<Vec<DataRow>, String> {
    let largest = SIZES[SIZES.len() - 1];
    let span = span.max(largest);
    let mut lease = c.alloc(span as u64, AllocOptions::default()).map_err(|e| format!("alloc: {e}"))?;
    lease.set_queue_depth(DEPTHS[DEPTHS.len() - 1]);
    let region = c.register_owned(vec![0x5a; REGION]).map_err(|e| format!("register: {e}"))?;
    let mut buf = vec![0xa5u8; largest];
    let mut rows = Vec::new();
    for &bytes in &SIZES {
        for read in [false, true] {
            let copying = copying(&mut lease, &mut buf[..bytes], read, per);
            let zero_copy = DEPTHS.map(|d| zero_copy(c, &lease, &region, span / bytes, bytes, d, read, per));
            rows.push(DataRow { bytes, read, copying, zero_copy });
        }
    }
    drop(region);
    let _ = lease.free();
    Ok(rows)
}

/// `bench-data`'s options (after the word; the global flags are [`Global`]).
#[derive(Clone, Debug, PartialEq, Eq, Args)]
#[command(args_override_self = true)]
pub struct BenchDataArgs {
    /// Time per cell (default 1000)
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 10, 600_000))]
    per_ms: Option<u64>,
    /// The lease, at least 1 MiB (default 16M; units: 64K, 1M); the registered region is 64 MiB
    #[arg(long, value_name = "BYTES", value_parser = span)]
    span: Option<u64>,
    /// Which requester carries the RDMA traffic
    #[arg(long, value_enum, default_value = "soft")]
    backend: Backend,
    /// --backend soft: where RDMA frames go (default: rdma_peer in the configuration file, else 127.0.0.1:4791)
    #[arg(long, value_name = "ADDR:PORT")]
    udp: Option<std::net::SocketAddr>,
    /// --backend verbs: the RDMA device (see ibv_devices)
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// --backend verbs: the GID index
    #[arg(long, value_name = "N", default_value = "0", value_parser = |v: &str| number(v, 0, 255).map(|n| n as u8))]
    gid_index: u8,
    /// --backend verbs: the port
    #[arg(long, value_name = "N", default_value = "1", value_parser = |v: &str| number(v, 1, 255).map(|n| n as u8))]
    ib_port: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The software RoCEv2 requester over UDP
    Soft,
    /// A real RDMA device through libibverbs (a leasectl built with --features verbs)
    Verbs,
}

/// `--span`: 1 MiB to 1 GiB.
fn span(v: &str) -> Result<u64, String> {
    leasebox_units::parse_size_in(v, 1 << 20..=1 << 30).map_err(|e| e.to_string())
}

/// The requester `a` asks for.
fn requester(a: &BenchDataArgs, file: &crate::config::Rdma) -> Result<RequesterConfig, String> {
    match a.backend {
        Backend::Soft => {
            if a.device.is_some() {
                return Err("--device is for --backend verbs".into());
            }
            let d = leasebox_client::rdma::SoftConfig::default();
            let peer = a.udp.or(file.peer).unwrap_or(d.peer);
            Ok(RequesterConfig::Soft(leasebox_client::rdma::SoftConfig { peer, ..d }))
        }
        Backend::Verbs => {
            if a.udp.is_some() {
                return Err("--udp is for --backend soft (the verbs device resolves addresses itself)".into());
            }
            let device = a.device.as_deref().ok_or("--backend verbs needs --device NAME (see ibv_devices)")?;
            verbs(device, a.ib_port, a.gid_index)
        }
    }
}

#[cfg(feature = "verbs")]
fn verbs(device: &str, port: u8, gid_index: u8) -> Result<RequesterConfig, String> {
    // The copying calls' bounce slots take the largest size whole.
    let cfg = leasebox_client::VerbsConfig {
        slot_len: SIZES[SIZES.len() - 1],
        ..leasebox_client::VerbsConfig::new(device, port, gid_index)
    };
    Ok(RequesterConfig::Verbs(cfg))
}

#[cfg(not(feature = "verbs"))]
fn verbs(_device: &str, _port: u8, _gid_index: u8) -> Result<RequesterConfig, String> {
    Err("this leasectl was built without the verbs backend: cargo build -p leasectl --features verbs".into())
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

/// Runs `leasectl bench-data`. Returns the exit code.
pub fn main(
    a: &BenchDataArgs,
    g: &Global,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let fail = |out: &mut dyn Write, err: &mut dyn Write, code: &str, exit: u8, m: &str| {
        if g.json {
            let _ = writeln!(out, "{}", json!({"error": {"code": code, "detail": [], "message": m}}));
        } else {
            let _ = writeln!(err, "leasectl bench-data: {m}");
        }
        exit
    };
    let s = match crate::config::settings(g, env) {
        Ok(s) => s,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let file = match crate::config::file(g, env).and_then(|(f, _)| f.rdma()) {
        Ok(f) => f,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let requester = match requester(a, &file) {
        Ok(r) => r,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let per = a.per_ms.map_or(DEFAULT_PER, Duration::from_millis);
    let span = a.span.map_or(DEFAULT_SPAN, |n| n as usize);
    let app = Appliance { addr: s.addr.clone(), credentials: s.who.clone(), requester };
    let c = match Client::connect(ClientConfig { timeouts: s.timeouts, ..ClientConfig::new(vec![app]) }) {
        Ok(c) => c,
        Err(e) => return fail(out, err, "CONNECT", exit::CONNECTION, &format!("{}: {e}", s.addr)),
    };
    let rows = match rows(&c, per, span) {
        Ok(r) => r,
        Err(m) => return fail(out, err, "BENCH", exit::SERVER_ERROR, &m),
    };
    if g.json {
        let rows: Vec<Value> = rows.iter().map(DataRow::json).collect();
        let _ = writeln!(out, "{}", json!({"bench_data": {"per_ms": per.as_millis() as u64, "rows": rows}}));
    } else {
        let _ = writeln!(out, "{} ms per cell; copying at depth 1, zero copy at depth {DEPTHS:?}", per.as_millis());
        for r in &rows {
            let _ = write!(
                out,
                "{:>6} {:<5} copying {}",
                size_name(r.bytes),
                if r.read { "read" } else { "write" },
                r.copying.cell()
            );
            for (d, z) in DEPTHS.iter().zip(&r.zero_copy) {
                let _ = write!(out, " | zero copy {d}: {}", z.cell());
            }
            let _ = writeln!(out);
        }
    }
    let errors = rows.iter().flat_map(|r| std::iter::once(&r.copying).chain(&r.zero_copy)).any(|c| c.error.is_some());
    if errors { exit::SERVER_ERROR } else { exit::OK }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(read: bool) -> DataRow {
        let r = |ops, error: Option<&str>| Rate { ops, bytes: 4096, secs: 0.5, error: error.map(str::to_string) };
        DataRow {
            bytes: 4096,
            read,
            copying: r(100, None),
            zero_copy: [r(200, None), r(800, Some("revoked")), r(0, Some("x"))],
        }
    }

    #[test]
    fn rows_round_trip_through_json() {
        let rows = vec![row(false), row(true)];
        let v = json!({"bench_data": {"per_ms": 500, "rows": rows.iter().map(DataRow::json).collect::<Vec<_>>()}});
        let text = v.to_string();
        let back = rows_from_json(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, rows);
        assert_eq!(back[0].zero_copy[0].ops_per_s(), 400.0);
        assert_eq!(back[0].copying.mib_per_s(), 200.0 * 4096.0 / (1 << 20) as f64);
        assert_eq!(v["bench_data"]["rows"][0]["zero_copy"][2]["depth"], 64);
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(rows_from_json(&json!({})).unwrap_err().contains("bench_data.rows"));
        let mut r = row(false).json();
        r["op"] = json!("copy");
        assert!(rows_from_json(&json!({"bench_data": {"rows": [r]}})).unwrap_err().contains("op"));
        let mut r = row(false).json();
        r["zero_copy"] = json!([]);
        assert!(rows_from_json(&json!({"bench_data": {"rows": [r]}})).unwrap_err().contains("0 zero-copy cells"));
        let mut r = row(true).json();
        r["copying"] = json!({"secs": 1.0});
        assert!(rows_from_json(&json!({"bench_data": {"rows": [r]}})).unwrap_err().contains("without ops"));
    }

    #[test]
    fn cells_say_what_stopped_them() {
        let r = row(false);
        assert_eq!(r.copying.cell(), "200 ops/s, 0.8 MiB/s");
        assert!(r.zero_copy[1].cell().contains("(then an error)"));
        assert_eq!(r.zero_copy[2].cell(), "error: x");
    }
}
