//! `cargo xtask bench fleet` (or `cargo run --release -p leasebox-registrar --example fleet_bench`): the fleet's
//! figures with 4 and 64 simulated appliances — hosted appliances in this process (4 with the device model, 64
//! without an HCA: registration needs only the control protocol), one registrar with the production settings
//! (1 s polls, 10 s key TTL), a real etcd on loopback. Prints a table; asserts nothing.
//!
//! - registration: appliance up (listening) → its key visible in etcd;
//! - failure detection: appliance stopped → its key gone (the lease lapses: poll period + up to the TTL);
//! - placement decisions per second: the client's two-random-choices pick over the advertised fleet;
//! - etcd writes per appliance per second in steady state (PUTs on change, keepalives, grants).

use std::collections::HashMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use leasebox_client::placement::{Candidate, Rng, two_choices};
use leasebox_fleet::advert::{Advertisement, PREFIX};
use leasebox_fleet::etcd::Etcd;
use leasebox_fleet::local::LocalEtcd;
use leasebox_hosted::Hosted;
use leasebox_hosted::testing::{Key, Rig};
use leasebox_registrar::{ApplianceSpec, Config, Registrar};

const STEADY: Duration = Duration::from_secs(10);

fn adverts(etcd: &Etcd) -> HashMap<String, Advertisement> {
    let (_, kvs) = etcd.get_prefix(PREFIX).unwrap_or_default();
    kvs.iter().filter_map(|kv| Advertisement::from_json(&kv.value).ok()).map(|a| (a.control.clone(), a)).collect()
}

/// `n` free ports below the kernel's ephemeral range (32768 and up by default): the registrar's pollers connect to
/// them before the appliances listen, and an ephemeral port may not be handed to one of those connections (a
/// TCP connection to itself would take the port).
fn free_ports(n: usize) -> Vec<u16> {
    let start = 20_000 + (std::process::id() % 4_000) as u16;
    (start..32_000).filter(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok()).take(n).collect()
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

struct Row {
    n: usize,
    reg: (Duration, Duration),
    detect: (Duration, Duration, usize),
    decisions: f64,
    writes: f64,
    puts: f64,
}

fn run(n: usize, with_hca: bool, tenant: &Key, admin_key: &Key) -> Result<Row, String> {
    let admin = &admin_key.hex();
    let e = LocalEtcd::start()?;
    let etcd = e.client();
    let ports = free_ports(n);
    let specs: Vec<ApplianceSpec> = ports
        .iter()
        .map(|p| ApplianceSpec::parse(&format!("127.0.0.1:{p} key={admin} zone=bench")))
        .collect::<Result<_, _>>()?;
    let reg = Registrar::start(Config::new("bench", vec![e.endpoint()], specs))?;
    // Leadership first, so the figures are the appliances' and not the election's.
    let t0 = Instant::now();
    while !reg.is_leader() {
        if t0.elapsed() > Duration::from_secs(20) {
            return Err("the registrar did not lead within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut hosts: Vec<Option<Hosted>> = Vec::new();
    let mut up_at = Vec::new();
    for p in &ports {
        let b = Rig::builder().listen(format!("127.0.0.1:{p}")).tenant_with_key("demo", tenant.clone());
        let b = b.admin_with_key(admin_key.clone());
        let b = if with_hca { b.hca().lease_pool_mib(16) } else { b };
        hosts.push(Some(Hosted::start(b.config()?)?));
        up_at.push(Instant::now());
    }
    let mut seen_at: Vec<Option<Duration>> = vec![None; n];
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen_at.iter().any(Option::is_none) && Instant::now() < deadline {
        let ads = adverts(&etcd);
        for (i, p) in ports.iter().enumerate() {
            if seen_at[i].is_none() && ads.contains_key(&format!("127.0.0.1:{p}")) {
                seen_at[i] = Some(up_at[i].elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut reg_times: Vec<Duration> = seen_at.iter().flatten().copied().collect();
    if reg_times.len() != n {
        return Err(format!("only {} of {n} appliances registered within 60 s", reg_times.len()));
    }
    let reg_fig = (pct(&mut reg_times, 0.5), pct(&mut reg_times, 1.0));

    // Steady state: etcd writes per appliance per second.
    let w0 = reg.status().writes;
    std::thread::sleep(STEADY);
    let w1 = reg.status().writes;
    let per = |a: u64, b: u64| (b - a) as f64 / n as f64 / STEADY.as_secs_f64();
    let writes = per(w0.total(), w1.total());
    let puts = per(w0.puts, w1.puts);

    // Placement decisions over the advertised fleet (appliances without an HCA advertise no free bytes: they
    // are weighed as the 16 MiB of the model-backed ones).
    let ads = adverts(&etcd);
    let cands: Vec<Candidate> = ads
        .values()
        .enumerate()
        .map(|(i, a)| Candidate { index: i, weight: a.free_bytes.max(16 << 20) as f64, placed: (i % 7) as f64 })
        .collect();
    let mut rng = Rng::from_os();
    let mut next = || rng.next_u64();
    let t = Instant::now();
    let mut k = 0u64;
    while t.elapsed() < Duration::from_secs(1) {
        for _ in 0..1000 {
            std::hint::black_box(two_choices(std::hint::black_box(&cands), &mut next));
        }
        k += 1000;
    }
    let decisions = k as f64 / t.elapsed().as_secs_f64();

    // Failure detection: a quarter of them (at least one) stopped at once.
    let stop = (n / 4).max(1);
    let mut stopped_at = Vec::new();
    for h in hosts.iter_mut().take(stop) {
        h.take().expect("running").stop();
        stopped_at.push(Instant::now());
    }
    let mut gone_at: Vec<Option<Duration>> = vec![None; stop];
    let deadline = Instant::now() + Duration::from_secs(40);
    while gone_at.iter().any(Option::is_none) && Instant::now() < deadline {
        let ads = adverts(&etcd);
        for (i, p) in ports.iter().take(stop).enumerate() {
            if gone_at[i].is_none() && !ads.contains_key(&format!("127.0.0.1:{p}")) {
                gone_at[i] = Some(stopped_at[i].elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut gone: Vec<Duration> = gone_at.iter().flatten().copied().collect();
    if gone.is_empty() {
        return Err("no stopped appliance's key went within 40 s".into());
    }
    let detect = (pct(&mut gone, 0.5), pct(&mut gone, 1.0), stop);
    reg.stop();
    for h in hosts.into_iter().flatten() {
        h.stop();
    }
    Ok(Row { n, reg: reg_fig, detect, decisions, writes, puts })
}

fn main() {
    let (tenant, admin) = (Key::random(), Key::random());
    println!(
        "fleet: one registrar (poll 1 s, key TTL 10 s, election TTL 5 s), etcd 3.4 on loopback, hosted appliances"
    );
    let mut rows = Vec::new();
    for (n, hca) in [(4, true), (64, false)] {
        eprintln!("==> {n} appliances ({})", if hca { "device model" } else { "no HCA" });
        match run(n, hca, &tenant, &admin) {
            Ok(r) => rows.push(r),
            Err(e) => println!("{n} appliances: failed: {e}"),
        }
    }
    println!();
    println!(
        "{:>10}  {:>17}  {:>17}  {:>22}  {:>22}  {:>20}",
        "appliances",
        "register p50 ms",
        "register max ms",
        "detect down p50/max ms",
        "placement decisions/s",
        "etcd writes/s/appl."
    );
    for r in &rows {
        println!(
            "{:>10}  {:>17}  {:>17}  {:>22}  {:>22.0}  {:>20}",
            r.n,
            ms(r.reg.0),
            ms(r.reg.1),
            format!("{}/{} ({} down)", ms(r.detect.0), ms(r.detect.1), r.detect.2),
            r.decisions,
            format!("{:.2} ({:.2} puts)", r.writes, r.puts),
        );
    }
    println!(
        "(register: Hosted::start returned → key in etcd: the poll period, the poller's connect retries against a port \
         not yet listening, the leader's publish tick; detect: stopped → key gone, up to the TTL after the last \
         keepalive, since the key lapses with its lease; writes: keepalives every TTL/3 plus a PUT when an \
         advertisement changes, idle here)"
    );
}
