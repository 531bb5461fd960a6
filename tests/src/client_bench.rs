//! `cargo xtask bench client`: the client library (`app/client`) against the hosted appliance with the device
//! model (std TCP, the model's RoCEv2 responder on UDP, the software requester), with 1 and 8 clients at once,
//! each a [`Client`] of its own: alloc → first write latency, 64 B and 1 MiB writes and reads, and the notice
//! latency (REVOKE at the appliance → the client's event) once the protocol has notices. Prints; asserts
//! nothing.
//!
//! Phases run back to back on a schedule every client follows (phase k starts at `start + k × (secs + gap)`), so
//! the clients load the appliance together without waiting on one another.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{AllocOptions, Appliance, Client, ClientConfig, Lease, RequesterConfig, Timeouts};

use crate::control::start_hosted;

/// Where the clients connect (the hosted appliance stays with the caller).
struct Where {
    addr: String,
    tenant_hex: String,
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
    let key = leasebox_client::hex::decode(&t.tenant_hex).map_err(|e| e.to_string())?;
    let udp = t.udp.ok_or("the hosted appliance has no RoCEv2 responder (--udp)")?;
    let a = Appliance {
        addr: t.addr.clone(),
        credentials: leasebox_client::Credentials { name: "demo".into(), key },
        requester: RequesterConfig::Soft(SoftConfig { peer: udp, ..SoftConfig::default() }),
    };
    let cfg = ClientConfig { timeouts: Timeouts::all(Duration::from_secs(10)), ..ClientConfig::new(vec![a]) };
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

/// The whole benchmark, `per` per phase: the table (`mlx5_hosted::table`), or why it could not run.
pub fn table(per: Duration) -> Result<String, String> {
    let hosted = start_hosted(&["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=128"])?;
    let w = Arc::new(Where { addr: hosted.addr.clone(), tenant_hex: hosted.tenant_hex.clone(), udp: hosted.udp });
    let runs: Vec<Vec<Figures>> = CLIENTS.iter().map(|&n| run(&w, n, per)).collect();
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
    // The protocol has no notices yet (issue 16, item 2): a revoke reaches the client through the next RENEW
    // (at half the TTL) or the next failed RDMA completion, neither a notice's latency.
    let mut row = vec!["notice latency (REVOKE at the appliance → client event)".to_string()];
    row.extend(CLIENTS.iter().map(|_| "n/a until notices".to_string()));
    rows.push(row);
    let headers = ["measurement (hosted --hca, software requester)", "1 client", "8 clients"];
    let mut out = mlx5_hosted::table::render(&headers, &rows, 1);
    // What went wrong where a cell counts errors: the first message of each.
    for (n, r) in CLIENTS.iter().zip(&runs) {
        for (phase, f) in PHASES.iter().zip(r) {
            if let Some(e) = f.errors.first() {
                out.push_str(&format!("{n} client(s), {}: first error: {e}\n", phase.label()));
            }
        }
    }
    Ok(out)
}
