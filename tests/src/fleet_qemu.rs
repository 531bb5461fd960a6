//! The QEMU appliance in a fleet (docs/fleet.md): the appliance as shipped (image, model, virtio-net) registered in
//! a real etcd (Debian's etcd-server, started on loopback with a temporary data directory) by a registrar, its
//! metrics valid under Prometheus's `promtool check metrics`, and its key gone within the TTL once it stops.
//! The hosted appliances' fleet tests are app/registrar/tests/fleet.rs; this adds the image, whose HCA_STATS
//! counts the commands of the native driver under QEMU.

use std::time::{Duration, Instant};

use leasebox_fleet::advert::{Advertisement, PREFIX};
use leasebox_fleet::etcd::Etcd;
use leasebox_fleet::local::{LocalEtcd, promtool_check, sample_value};
use leasebox_registrar::{ApplianceSpec, Config, Registrar};

use crate::Artifacts;
use crate::lease_qemu::Appliance;

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "fleet-qemu";
/// Key TTL and election TTL (shortened as in the hosted fleet tests), and the slack on "within the TTL".
const TTL_S: i64 = 6;
const ELECTION_TTL_S: i64 = 3;
const SLACK: Duration = Duration::from_secs(6);
/// Registration of a guest that just booted: its control port answers at once, give TCG time.
const REGISTER_WITHIN: Duration = Duration::from_secs(60);

fn advert_of(etcd: &Etcd, control: &str) -> Option<Advertisement> {
    let (_, kvs) = etcd.get_prefix(PREFIX).ok()?;
    kvs.iter().filter_map(|kv| Advertisement::from_json(&kv.value).ok()).find(|a| a.control == control)
}

/// The `fleet-qemu` scenario.
pub fn run(a: &Artifacts) -> Result<String, String> {
    let e = LocalEtcd::start()?;
    let mut app = Appliance::boot(a, &a.elf, NAME, "")?;
    let r = checks(&e, &mut app);
    match r {
        Ok((reg, control, registered)) => {
            // The appliance stops: QEMU and the model go; its key must lapse within the TTL.
            drop(app);
            let etcd = e.client();
            let t = Instant::now();
            let limit = Duration::from_secs(TTL_S as u64) + SLACK;
            while advert_of(&etcd, &control).is_some() {
                if t.elapsed() > limit {
                    reg.stop();
                    return Err(format!("the stopped appliance's key was still in etcd after {limit:?}"));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let gone = t.elapsed();
            reg.stop();
            Ok(format!(
                "{registered}; appliance stopped → its key gone after {:.1} s (TTL {TTL_S} s)",
                gone.as_secs_f64()
            ))
        }
        Err(m) => Err(app.fail(m)),
    }
}

fn checks(e: &LocalEtcd, app: &mut Appliance) -> Result<(Registrar, String, String), String> {
    // The pool is prepared in the background after the ready line (docs/operations.md, "The lease pool"): its
    // free bytes grow until `lease: pool ready`. The advertisement and the metrics are compared below, so both
    // must see the pool whole.
    let pool_wait = Instant::now() + Duration::from_secs(60);
    if app.wait_line(|l| l.contains(crate::lease_qemu::POOL_READY), pool_wait)?.is_none() {
        return Err("no `lease: pool ready` line within 60 s of the ready line".into());
    }
    let spec = ApplianceSpec::parse(&format!("{} key={} rdma={} site=qemu", app.addr, app.admin_hex, app.udp))?;
    let control = spec.control.clone();
    let cfg = Config {
        poll: Duration::from_millis(500),
        ttl_s: TTL_S,
        election_ttl_s: ELECTION_TTL_S,
        metrics: Some("127.0.0.1:0".into()),
        ..Config::new("r-qemu", vec![e.endpoint()], vec![spec])
    };
    let reg = Registrar::start(cfg)?;
    let etcd = e.client();
    let t = Instant::now();
    let ad = loop {
        if let Some(ad) = advert_of(&etcd, &control) {
            break ad;
        }
        if t.elapsed() > REGISTER_WITHIN {
            let s = reg.status();
            reg.stop();
            return Err(format!("no advertisement for {control} within {REGISTER_WITHIN:?} (registrar: {s:?})"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let registered = t.elapsed();
    let ok = ad.health == "ok"
        && ad.hca == "ok"
        && ad.free_bytes > 0
        && ad.boot_id.len() == 32
        && ad.registrar == "r-qemu"
        && ad.labels.get("site").map(String::as_str) == Some("qemu")
        && ad.key() == format!("{PREFIX}{}", ad.boot_id);
    if !ok {
        reg.stop();
        return Err(format!("the QEMU appliance's advertisement: {ad:?}"));
    }
    // Metrics: one full poll after the key, so the page has the appliance's series.
    std::thread::sleep(Duration::from_secs(1));
    let page = reg.render_metrics();
    let me = format!("appliance=\"{control}\"");
    let value = |metric: &str, extra: &[&str]| {
        let labels: Vec<&str> = std::iter::once(me.as_str()).chain(extra.iter().copied()).collect();
        sample_value(&page, metric, &labels)
    };
    let cmds = |result: &str| value("leasebox_hca_commands_total", &[&format!("result=\"{result}\"")]);
    // Bring-up alone is dozens of commands, every one completed.
    let (submitted, ok) = (cmds("submitted").unwrap_or(0.0), cmds("ok").unwrap_or(0.0));
    if value("leasebox_up", &[]) != Some(1.0)
        || value("leasebox_free_bytes", &[]) != Some(ad.free_bytes as f64)
        || submitted < 10.0
        || ok < 10.0
        || ok > submitted
    {
        reg.stop();
        return Err(format!("/metrics for the QEMU appliance: up, free bytes or HCA command counts wrong:\n{page}"));
    }
    if let Err(m) = promtool_check(&page) {
        reg.stop();
        return Err(format!("promtool check metrics: {m}"));
    }
    let summary = format!(
        "QEMU appliance registered in etcd after {:.1} s as {} (free {} MiB, health {}, hca {}); /metrics {} lines, \
         HCA commands {submitted} submitted, {ok} ok; promtool check metrics: ok",
        registered.as_secs_f64(),
        ad.key(),
        ad.free_bytes >> 20,
        ad.health,
        ad.hca,
        page.lines().count()
    );
    Ok((reg, control, summary))
}
