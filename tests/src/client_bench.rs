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
    table_with(per, &[])
}

/// As [`table`], with the appliance's option `words` added (`lease_warm=0`: the command path's figures, for
/// docs/latency.md's before and after; the ignored test `command_path_table` prints them).
pub fn table_with(per: Duration, words: &[&str]) -> Result<String, String> {
    let mut args = vec!["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=128"];
    args.extend_from_slice(words);
    let hosted = start_hosted(&args)?;
    let w = Arc::new(Where {
        addr: hosted.addr.clone(),
        tenant_hex: hosted.tenant_hex.clone(),
        admin_hex: hosted.admin_hex.clone(),
        udp: hosted.udp,
    });
    let mut runs: Vec<Vec<Figures>> = CLIENTS.iter().map(|&n| run(&w, n, per)).collect();
    // Where a REVOKE's time goes (the appliance's stage clock, docs/latency.md), with each client count.
    let mut stages = String::new();
    for (r, &n) in runs.iter_mut().zip(&CLIENTS) {
        let clock = hosted.hosted().map(|h| h.stages());
        let before = clock.map(|c| {
            c.record(true);
            c.passes()
        });
        let (f, rtt) = notices(&w, n, per);
        if let (Some(c), Some(before)) = (clock, before) {
            let revokes: Vec<_> = c.samples().into_iter().filter(|s| s.op == leasebox_proto::Op::Revoke).collect();
            let client = (f64::from(rtt.pct(0.5).unwrap_or(0)), f64::from(rtt.pct(0.99).unwrap_or(0)));
            let what = format!("REVOKE ({n} client{})", if n == 1 { "" } else { "s" });
            stages.push('\n');
            stages.push_str(&crate::control::stage_table(&what, &revokes, client, before, c.passes()));
            c.record(false);
        }
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
    out.push_str(&stages);
    Ok(out)
}

// ---- The data path: sizes × depths, copying vs zero copy ----

/// The cells and their measurement are `leasectl bench-data`'s (one owner: the guest runs the same code over
/// verbs); here the software requester's side runs in-process.
pub use leasectl::bench_data::{DEPTHS as DATA_DEPTHS, DataRow, Rate, SIZES as DATA_SIZES};

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

/// Every row of the data-path table against the hosted appliance with the model and the software requester:
/// one client, one lease ([`leasectl::bench_data::DEFAULT_SPAN`]), `per` per cell.
pub fn data_path_rows(per: Duration) -> Result<Vec<DataRow>, String> {
    let hosted = start_hosted(&["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=128"])?;
    let w = Where {
        addr: hosted.addr.clone(),
        tenant_hex: hosted.tenant_hex.clone(),
        admin_hex: hosted.admin_hex.clone(),
        udp: hosted.udp,
    };
    pool_prepared(&w)?;
    let c = client(&w)?;
    let rows = leasectl::bench_data::rows(&c, per, leasectl::bench_data::DEFAULT_SPAN);
    drop(c);
    drop(hosted);
    rows
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

/// A table cell: [`Rate::cell`], an error cut short (the table lists the errors in full).
fn short(r: &Rate) -> String {
    match &r.error {
        Some(e) if r.ops == 0 && e.chars().count() > 40 => {
            format!("error: {}…", e.chars().take(33).collect::<String>())
        }
        _ => r.cell(),
    }
}

/// `a / b` of operations/s, as `1.23×` (`-` where either is missing or nothing completed).
fn ratio_cell(a: Option<&Rate>, b: Option<&Rate>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a.ops > 0 && b.ops > 0 => format!("{:.2}×", a.ops_per_s() / b.ops_per_s()),
        _ => "-".into(),
    }
}

/// The data-path table. Columns: `soft` (this host, the software requester against the hosted appliance:
/// [`data_path_rows`]), `rxe` (verbs on rxe0 in the Soft-RoCE guest against the QEMU appliance), `reference`
/// (the same guest against the rxe reference responder), then Leasebox ÷ reference (ops/s) per cell. Per size
/// and direction: the copying calls at depth 1, zero copy at each depth, then zero copy ÷ copying at depth 1.
/// A side that could not be measured reads "missing" and its reason follows the table.
pub fn data_path_table(
    soft: &[DataRow],
    rxe: &Result<Vec<DataRow>, String>,
    reference: &Result<Vec<DataRow>, String>,
) -> String {
    let headers = [
        "size, direction, call",
        "soft requester → hosted appliance",
        "rxe verbs → QEMU appliance",
        "rxe verbs → rxe reference",
        "QEMU appliance / reference (ops/s)",
    ];
    let side = |s: &Result<Vec<DataRow>, String>, i: usize| s.as_ref().ok().and_then(|x| x.get(i).cloned());
    let mut rows = Vec::new();
    for (i, r) in soft.iter().enumerate() {
        let (x, y) = (side(rxe, i), side(reference, i));
        let name = format!("{} {}", size_name(r.bytes), if r.read { "read" } else { "write" });
        // Call k: 0 the copying calls, 1.. zero copy at DATA_DEPTHS[k - 1].
        let pick = |d: &DataRow, k: usize| if k == 0 { d.copying.clone() } else { d.zero_copy[k - 1].clone() };
        let cell = |d: &Option<DataRow>, k: usize| d.as_ref().map_or("missing".into(), |d| short(&pick(d, k)));
        for k in 0..=DATA_DEPTHS.len() {
            let label = match k {
                0 => format!("{name}, copying (depth 1)"),
                k => format!("{name}, zero copy, depth {}", DATA_DEPTHS[k - 1]),
            };
            let own = Some(r.clone());
            let q = ratio_cell(x.as_ref().map(|d| pick(d, k)).as_ref(), y.as_ref().map(|d| pick(d, k)).as_ref());
            rows.push(vec![label, cell(&own, k), cell(&x, k), cell(&y, k), q]);
        }
        let zc = |d: &Option<DataRow>| {
            d.as_ref().map_or("-".into(), |d| ratio_cell(Some(&d.zero_copy[0]), Some(&d.copying)))
        };
        rows.push(vec![
            format!("{name}, zero copy / copying (depth 1)"),
            zc(&Some(r.clone())),
            zc(&x),
            zc(&y),
            String::new(),
        ]);
    }
    let mut out = mlx5_hosted::table::render(&headers, &rows, 1);
    // The errors in full, once per side and message.
    for (what, s) in [
        ("soft requester → hosted appliance", Ok(soft)),
        ("rxe verbs → QEMU appliance", rxe.as_deref()),
        ("rxe verbs → rxe reference", reference.as_deref()),
    ] {
        let mut seen = Vec::new();
        for r in s.unwrap_or_default() {
            for e in std::iter::once(&r.copying).chain(&r.zero_copy).filter_map(|c| c.error.as_ref()) {
                if !seen.contains(&e) {
                    out.push_str(&format!("{what}: error: {e}\n"));
                    seen.push(e);
                }
            }
        }
    }
    for (what, s) in [("rxe verbs → QEMU appliance", rxe), ("rxe verbs → rxe reference", reference)] {
        if let Err(e) = s {
            out.push_str(&format!("{what}: missing: {e}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test -p leasebox-scenarios --lib command_path_table -- --ignored --nocapture`: `bench client`'s
    /// table (2 s per phase) with every lease on the command path, then with the default (UMR). A benchmark, not
    /// a check.
    #[test]
    #[ignore]
    fn command_path_table() {
        for words in [&["lease_warm=0"][..], &[]] {
            println!("==> {words:?}\n{}", table_with(Duration::from_secs(2), words).unwrap());
        }
    }

    fn row(bytes: usize, read: bool, ops: u64) -> DataRow {
        let r = |ops| Rate { ops, bytes, secs: 1.0, error: None };
        DataRow { bytes, read, copying: r(ops), zero_copy: [r(2 * ops), r(4 * ops), r(8 * ops)] }
    }

    #[test]
    fn data_path_table_has_every_side_and_the_ratios() {
        let soft = vec![row(4096, false, 100), row(4096, true, 50)];
        let rxe = Ok(vec![row(4096, false, 30), row(4096, true, 20)]);
        let reference = Ok(vec![row(4096, false, 60), row(4096, true, 10)]);
        let t = data_path_table(&soft, &rxe, &reference);
        let line = |label: &str| t.lines().find(|l| l.contains(label)).unwrap_or_else(|| panic!("{label}: {t}"));
        // Per cell: the QEMU appliance ÷ the reference.
        let w = line("4 KiB write, copying (depth 1)");
        assert!(
            w.contains("100 ops/s") && w.contains("30 ops/s") && w.contains("60 ops/s") && w.contains("0.50×"),
            "{w}"
        );
        assert!(line("4 KiB read, zero copy, depth 64").contains("2.00×"));
        // Zero copy ÷ copying at depth 1, per side.
        assert!(line("4 KiB read, zero copy / copying (depth 1)").contains("2.00×"));
        assert!(!t.contains("missing"));
    }

    #[test]
    fn a_missing_side_says_why() {
        let soft = vec![row(1 << 20, false, 5)];
        let t = data_path_table(&soft, &Err("the guest did not boot".into()), &Ok(vec![row(1 << 20, false, 5)]));
        assert!(t.contains("1 MiB write, copying (depth 1)"), "{t}");
        assert!(t.contains("rxe verbs → QEMU appliance: missing: the guest did not boot"), "{t}");
        assert!(!t.contains("rxe reference: missing"), "{t}");
        let copying = t.lines().find(|l| l.contains("1 MiB write, copying")).unwrap();
        assert!(copying.contains("missing") && copying.trim_end().ends_with('-'), "{copying}");
    }

    #[test]
    fn errors_are_short_in_cells_and_whole_below() {
        let mut soft = vec![row(4096, true, 7)];
        let long = "configuration: bytes 0..4096 of the region overlap bytes 0..4096 being written";
        soft[0].zero_copy[2] = Rate { ops: 0, bytes: 4096, secs: 0.1, error: Some(long.into()) };
        let t = data_path_table(&soft, &Ok(soft.clone()), &Err("no guest".into()));
        let cell = t.lines().find(|l| l.contains("4 KiB read, zero copy, depth 64")).unwrap();
        assert!(
            cell.contains("error: configuration: bytes 0..4096 of t…") && !cell.contains("being written"),
            "{cell}"
        );
        assert!(t.contains(&format!("soft requester → hosted appliance: error: {long}")), "{t}");
        assert!(t.contains(&format!("rxe verbs → QEMU appliance: error: {long}")), "{t}");
    }
}
