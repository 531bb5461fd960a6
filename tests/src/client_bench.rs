//! `cargo xtask bench client`: the client library (`app/client`) against the hosted appliance with the device
//! model (std TCP, the model's RoCEv2 responder on UDP, the software requester), with 1 and 8 clients at once,
//! each a [`Client`] of its own: alloc → first write latency, 64 B and 1 MiB writes and reads, and the notice
//! latency (the admin's REVOKE sent → the owning client's `Event::Revoked` callback; the notice goes to every
//! session of the tenant, so with 8 clients it fans out to 8). Prints; asserts nothing.
//!
//! Phases run back to back on a schedule every client follows (phase k starts at `start + k × (secs + gap)`), so
//! the clients load the appliance together without waiting on one another.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{
    AllocOptions, Appliance, Client, ClientConfig, Connection, Event, Lease, LeaseId, RequesterConfig, Timeouts,
};
use leasebox_proto::Request;

use crate::control::start_hosted;

/// Where the clients connect (the hosted appliance stays with the caller).
struct Where {
    addr: String,
    tenant_hex: String,
    admin_hex: String,
    udp: Option<std::net::SocketAddr>,
}

/// Client counts, one column each.
pub const CLIENTS: [usize; 2] = [1, 8];
/// The lease each client reads and writes (and what alloc → first write allocates).
const LEASE: u64 = 2 << 20;
const SMALL: usize = 64;
const LARGE: usize = 1 << 20;
/// Pause between phases (the appliance's grace period for freed leases is 100 ms here).
const GAP: Duration = Duration::from_millis(300);

/// The measured phases, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    AllocFirstWrite,
    WriteSmall,
    ReadSmall,
    WriteLarge,
    ReadLarge,
}

const PHASES: [Phase; 5] =
    [Phase::AllocFirstWrite, Phase::WriteSmall, Phase::ReadSmall, Phase::WriteLarge, Phase::ReadLarge];

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::AllocFirstWrite => "alloc → first write (2 MiB lease, 64 B), then free",
            Phase::WriteSmall => "64 B write",
            Phase::ReadSmall => "64 B read",
            Phase::WriteLarge => "1 MiB write",
            Phase::ReadLarge => "1 MiB read",
        }
    }

    fn bytes(self) -> usize {
        match self {
            Phase::WriteLarge | Phase::ReadLarge => LARGE,
            _ => SMALL,
        }
    }
}

/// One phase's figures over every client: latencies (µs) and how long the phase ran.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    lat_us: Vec<u32>,
    secs: f64,
    errors: Vec<String>,
}

impl Figures {
    fn pct(&self, p: f64) -> Option<u32> {
        let n = self.lat_us.len();
        (n > 0).then(|| self.lat_us[((n - 1) as f64 * p) as usize])
    }
}

/// One cell of the table.
fn cell(f: &Figures, bytes: usize, throughput: bool) -> String {
    let (Some(p50), Some(p99)) = (f.pct(0.5), f.pct(0.99)) else {
        return format!("no figures: {}", f.errors.first().map_or("nothing completed", String::as_str));
    };
    let rate = f.lat_us.len() as f64 / f.secs.max(1e-9);
    let tail = if throughput {
        format!("{:.0} MiB/s", rate * bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{rate:.0} ops/s")
    };
    let errs = if f.errors.is_empty() { String::new() } else { format!(", {} errors", f.errors.len()) };
    format!("p50 {p50} µs, p99 {p99} µs, {tail}{errs}")
}

fn client(t: &Where) -> Result<Client, String> {
    client_with(t, None)
}

fn client_with(t: &Where, on_event: Option<leasebox_client::Callback>) -> Result<Client, String> {
    let key = leasebox_client::hex::decode(&t.tenant_hex).map_err(|e| e.to_string())?;
    let udp = t.udp.ok_or("the hosted appliance has no RoCEv2 responder (--udp)")?;
    let a = Appliance {
        addr: t.addr.clone(),
        credentials: leasebox_client::Credentials { name: "demo".into(), key },
        requester: RequesterConfig::Soft(SoftConfig { peer: udp, ..SoftConfig::default() }),
    };
    let cfg = ClientConfig { timeouts: Timeouts::all(Duration::from_secs(10)), on_event, ..ClientConfig::new(vec![a]) };
    Client::connect(cfg).map_err(|e| e.to_string())
}

/// One client's run: every phase in its slot of the schedule.
fn one_client(t: &Where, start: Instant, per: Duration, seed: u8) -> Vec<Figures> {
    let mut out = vec![Figures::default(); PHASES.len()];
    let fail = |out: &mut Vec<Figures>, e: String| {
        for f in out.iter_mut() {
            f.errors.push(e.clone());
        }
    };
    let c = match client(t) {
        Ok(c) => c,
        Err(e) => {
            fail(&mut out, format!("connect: {e}"));
            return out;
        }
    };
    let mut lease: Option<Lease> = None;
    let small = vec![seed; SMALL];
    let large = vec![seed; LARGE];
    let mut buf = vec![0u8; LARGE];
    for (k, phase) in PHASES.iter().enumerate() {
        let begin = start + (per + GAP) * k as u32;
        std::thread::sleep(begin.saturating_duration_since(Instant::now()));
        let end = begin + per;
        let f = &mut out[k];
        let t0 = Instant::now();
        while Instant::now() < end {
            let op0 = Instant::now();
            let r = match phase {
                Phase::AllocFirstWrite => c.alloc(LEASE, AllocOptions::default()).and_then(|mut l| {
                    l.write(0, &small)?;
                    let us = op0.elapsed().as_micros() as u32;
                    l.free().map(|_| us)
                }),
                _ => {
                    if lease.is_none() {
                        match c.alloc(LEASE, AllocOptions::default()) {
                            Ok(l) => lease = Some(l),
                            Err(e) => {
                                f.errors.push(format!("alloc: {e}"));
                                break;
                            }
                        }
                    }
                    let Some(l) = lease.as_mut() else { break };
                    let r = match phase {
                        Phase::WriteSmall => l.write(0, &small),
                        Phase::ReadSmall => l.read(0, &mut buf[..SMALL]),
                        Phase::WriteLarge => l.write(0, &large),
                        Phase::ReadLarge | Phase::AllocFirstWrite => l.read(0, &mut buf),
                    };
                    r.map(|()| op0.elapsed().as_micros() as u32)
                }
            };
            match r {
                Ok(us) => f.lat_us.push(us),
                Err(e) => {
                    f.errors.push(e.to_string());
                    // A broken lease or appliance: wait for the next phase rather than spin on errors.
                    lease = None;
                    break;
                }
            }
        }
        f.secs = t0.elapsed().as_secs_f64();
    }
    if let Some(l) = lease {
        let _ = l.free();
    }
    out
}

/// Runs `clients` clients through every phase, `per` each; the figures per phase, all clients merged.
fn run(t: &Arc<Where>, clients: usize, per: Duration) -> Vec<Figures> {
    // Time for every client to connect before the first phase.
    let start = Instant::now() + Duration::from_millis(500 + 100 * clients as u64);
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let t = t.clone();
            std::thread::spawn(move || one_client(&t, start, per, i as u8 + 1))
        })
        .collect();
    let mut merged = vec![Figures::default(); PHASES.len()];
    for th in threads {
        let got = th.join().unwrap_or_else(|_| {
            vec![Figures { errors: vec!["a client thread panicked".into()], ..Figures::default() }; PHASES.len()]
        });
        for (m, g) in merged.iter_mut().zip(got) {
            m.lat_us.extend(g.lat_us);
            m.errors.extend(g.errors);
            m.secs = m.secs.max(g.secs);
        }
    }
    for m in &mut merged {
        m.lat_us.sort_unstable();
    }
    merged
}

/// Notice latency with `clients` clients for `per`: rounds of one lease per client, each revoked by the admin
/// in turn; the latency is REVOKE sent → that lease's `Event::Revoked` in its client's callback. Also the REVOKE
/// round trip itself (sent → answered), most of which is the teardown's HCA commands.
fn notices(w: &Where, clients: usize, per: Duration) -> (Figures, Figures) {
    let mut f = Figures::default();
    let mut rtt = Figures::default();
    let (tx, rx) = mpsc::channel::<(LeaseId, Instant)>();
    let mut cs = Vec::new();
    for _ in 0..clients {
        let tx = Mutex::new(tx.clone());
        let cb: leasebox_client::Callback = Arc::new(move |e: &Event| {
            if let Event::Revoked { lease, .. } = e {
                let _ = tx.lock().unwrap_or_else(|p| p.into_inner()).send((*lease, Instant::now()));
            }
        });
        match client_with(w, Some(cb)) {
            Ok(c) => cs.push(c),
            Err(e) => {
                f.errors.push(format!("connect: {e}"));
                return (f, rtt);
            }
        }
    }
    let admin_key = match leasebox_client::hex::decode(&w.admin_hex) {
        Ok(k) => k,
        Err(e) => {
            f.errors.push(e.to_string());
            return (f, rtt);
        }
    };
    let who = leasebox_client::Credentials { name: "admin".into(), key: admin_key };
    let mut admin = match Connection::connect_and_hello(&w.addr, &who, Timeouts::all(Duration::from_secs(10))) {
        Ok((c, _)) => c,
        Err(e) => {
            f.errors.push(format!("admin: {e}"));
            return (f, rtt);
        }
    };
    let t0 = Instant::now();
    'rounds: while t0.elapsed() < per {
        let mut leases = Vec::new();
        for c in &cs {
            match c.alloc(LEASE, AllocOptions::default()) {
                Ok(l) => leases.push(l),
                Err(e) => {
                    f.errors.push(format!("alloc: {e}"));
                    break 'rounds;
                }
            }
        }
        for l in &leases {
            let sent = Instant::now();
            if let Err(e) = admin.call(&Request::Revoke { lease: l.id(), qp_first: false }) {
                f.errors.push(format!("REVOKE: {e}"));
                break 'rounds;
            }
            rtt.lat_us.push(sent.elapsed().as_micros() as u32);
            let deadline = sent + Duration::from_secs(2);
            loop {
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok((id, at)) if id == l.id() => {
                        f.lat_us.push(at.duration_since(sent).as_micros() as u32);
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => {
                        f.errors.push(format!("no Revoked event for lease {} within 2 s", l.id()));
                        break;
                    }
                }
            }
        }
    }
    f.secs = t0.elapsed().as_secs_f64();
    rtt.secs = f.secs;
    f.lat_us.sort_unstable();
    rtt.lat_us.sort_unstable();
    let _ = admin.bye();
    (f, rtt)
}

/// The whole benchmark, `per` per phase: the table (`mlx5_hosted::table`), or why it could not run.
pub fn table(per: Duration) -> Result<String, String> {
    let hosted = start_hosted(&["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=128"])?;
    let w = Arc::new(Where {
        addr: hosted.addr.clone(),
        tenant_hex: hosted.tenant_hex.clone(),
        admin_hex: hosted.admin_hex.clone(),
        udp: hosted.udp,
    });
    let mut runs: Vec<Vec<Figures>> = CLIENTS.iter().map(|&n| run(&w, n, per)).collect();
    for (r, &n) in runs.iter_mut().zip(&CLIENTS) {
        let (f, rtt) = notices(&w, n, per);
        r.push(f);
        r.push(rtt);
    }
    drop(hosted);
    let mut rows = Vec::new();
    for (k, phase) in PHASES.iter().enumerate() {
        let mut row = vec![phase.label().to_string()];
        for r in &runs {
            let large = matches!(phase, Phase::WriteLarge | Phase::ReadLarge);
            row.push(cell(&r[k], phase.bytes(), large));
        }
        rows.push(row);
    }
    let mut row = vec!["notice latency (admin REVOKE sent → client's Revoked event)".to_string()];
    row.extend(runs.iter().map(|r| cell(&r[PHASES.len()], 0, false)));
    rows.push(row);
    let mut row = vec!["  of which the REVOKE (sent → answered, the teardown)".to_string()];
    row.extend(runs.iter().map(|r| cell(&r[PHASES.len() + 1], 0, false)));
    rows.push(row);
    let headers = ["measurement (hosted --hca, software requester)", "1 client", "8 clients"];
    let mut out = mlx5_hosted::table::render(&headers, &rows, 1);
    // What went wrong where a cell counts errors: the first message of each.
    for (n, r) in CLIENTS.iter().zip(&runs) {
        let labels = PHASES.iter().map(|p| p.label()).chain(["notice latency", "REVOKE"]);
        for (label, f) in labels.zip(r) {
            if let Some(e) = f.errors.first() {
                out.push_str(&format!("{n} client(s), {label}: first error: {e}\n"));
            }
        }
    }
    Ok(out)
}

// ---- The data path (issue 26 item 7): sizes × depths, copying vs zero copy ----

/// Transfer sizes of the data-path table.
pub const DATA_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Operations kept in flight on one lease (zero copy: [`Client::submit`] batches).
pub const DATA_DEPTHS: [usize; 3] = [1, 16, 64];

/// One measured cell: operations completed in `secs`, of `bytes` each.
#[derive(Clone, Debug, Default)]
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

    fn cell(&self) -> String {
        match &self.error {
            Some(e) if self.ops == 0 => format!("error: {e}"),
            Some(_) => format!("{:.0} ops/s, {:.1} MiB/s (then an error)", self.ops_per_s(), self.mib_per_s()),
            None => format!("{:.0} ops/s, {:.1} MiB/s", self.ops_per_s(), self.mib_per_s()),
        }
    }
}

/// One row: a size and a direction; the copying calls (`Lease::write` / `Lease::read`, which block: one at a
/// time per lease, depth 1) and zero copy (`Op::write_from` / `Op::read_into` from a registered region) at each
/// of [`DATA_DEPTHS`].
#[derive(Clone, Debug)]
pub struct DataRow {
    pub bytes: usize,
    pub read: bool,
    pub copying: Rate,
    pub zero_copy: [Rate; 3],
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

/// Zero copy at `depth`: `depth` operations in flight on `lease` (each to its own `bytes` slot of the lease and
/// of `region`), each one finished replaced by the next, for `per`.
fn zero_copy(
    c: &Client,
    lease: &Lease,
    region: &leasebox_client::Region<'static>,
    bytes: usize,
    depth: usize,
    read: bool,
    per: Duration,
) -> Rate {
    use leasebox_client::{Op, Ticket};
    use std::collections::{HashSet, VecDeque};
    let mut r = Rate { bytes, ..Rate::default() };
    let op = |i: u64| {
        let slot = (i % depth as u64) as usize * bytes;
        if read {
            Op::read_into(lease, region, slot, slot as u64, bytes)
        } else {
            Op::write_from(lease, region, slot, slot as u64, bytes)
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

/// Waits (up to 60 s) until the appliance has zeroed its whole pool (STATS `bytes_scrubbing` 0): the scrub
/// that follows start would otherwise share the cores with the first cells.
fn pool_prepared(w: &Where) -> Result<(), String> {
    let key = leasebox_client::hex::decode(&w.admin_hex).map_err(|e| e.to_string())?;
    let who = leasebox_client::Credentials { name: "admin".into(), key };
    let (mut admin, _) = Connection::connect_and_hello(&w.addr, &who, Timeouts::all(Duration::from_secs(10)))
        .map_err(|e| format!("admin: {e}"))?;
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        match admin.call(&Request::Stats) {
            Ok(leasebox_proto::Response::Stats(s)) if s.leases.bytes_scrubbing == 0 => break,
            Ok(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Ok(_) => return Err("the appliance's pool was still being zeroed after 60 s".into()),
            Err(e) => return Err(format!("STATS: {e}")),
        }
    }
    let _ = admin.bye();
    Ok(())
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

/// Every row of the data-path table against the hosted appliance with the model and the software requester:
/// one client, one lease, `per` per cell.
pub fn data_path_rows(per: Duration) -> Result<Vec<DataRow>, String> {
    let largest = DATA_SIZES[DATA_SIZES.len() - 1] * DATA_DEPTHS[DATA_DEPTHS.len() - 1];
    let hosted = start_hosted(&["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=128"])?;
    let w = Where {
        addr: hosted.addr.clone(),
        tenant_hex: hosted.tenant_hex.clone(),
        admin_hex: hosted.admin_hex.clone(),
        udp: hosted.udp,
    };
    pool_prepared(&w)?;
    let c = client(&w)?;
    let mut lease = c.alloc(largest as u64, AllocOptions::default()).map_err(|e| format!("alloc: {e}"))?;
    lease.set_queue_depth(DATA_DEPTHS[DATA_DEPTHS.len() - 1]);
    let region = c.register_owned(vec![0x5a; largest]).map_err(|e| format!("register: {e}"))?;
    let mut buf = vec![0xa5u8; DATA_SIZES[DATA_SIZES.len() - 1]];
    let mut rows = Vec::new();
    for &bytes in &DATA_SIZES {
        for read in [false, true] {
            let copying = copying(&mut lease, &mut buf[..bytes], read, per);
            let zero_copy = DATA_DEPTHS.map(|d| zero_copy(&c, &lease, &region, bytes, d, read, per));
            rows.push(DataRow { bytes, read, copying, zero_copy });
        }
    }
    drop(region);
    let _ = lease.free();
    drop(c);
    drop(hosted);
    Ok(rows)
}

/// The data-path table: `soft` (this host: [`data_path_rows`]) and, where given, the same rows measured with the
/// verbs backend in the rxe guest (`rxe`; its columns read "not measured" otherwise), then the zero-copy/copying
/// ratio at depth 1.
pub fn data_path_table(soft: &[DataRow], rxe: Option<&[DataRow]>) -> String {
    let mut headers: Vec<String> = vec!["size, direction".into(), "soft: copying (depth 1)".into()];
    headers.extend(DATA_DEPTHS.iter().map(|d| format!("soft: zero copy, depth {d}")));
    headers.push("soft: zero copy / copying (depth 1)".into());
    headers.push("rxe verbs: copying (depth 1)".into());
    headers.extend(DATA_DEPTHS.iter().map(|d| format!("rxe verbs: zero copy, depth {d}")));
    let mut rows = Vec::new();
    for (i, r) in soft.iter().enumerate() {
        let mut row =
            vec![format!("{} {}", size_name(r.bytes), if r.read { "read" } else { "write" }), r.copying.cell()];
        row.extend(r.zero_copy.iter().map(Rate::cell));
        row.push(format!("{:.2}×", r.zero_copy[0].ops_per_s() / r.copying.ops_per_s().max(1e-9)));
        match rxe.and_then(|x| x.get(i)) {
            Some(x) => {
                row.push(x.copying.cell());
                row.extend(x.zero_copy.iter().map(Rate::cell));
            }
            None => row.extend(std::iter::repeat_n("not measured".to_string(), 1 + DATA_DEPTHS.len())),
        }
        rows.push(row);
    }
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    mlx5_hosted::table::render(&headers, &rows, 1)
}
