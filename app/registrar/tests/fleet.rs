//! The fleet end to end against a real etcd (Debian's etcd-server, started here on loopback with a temporary
//! data directory; `cargo xtask prereqs` installs it) and Prometheus's `promtool`: hosted appliances
//! registered by registrars, the client placing leases from etcd, an appliance stopped, a leading registrar
//! killed, etcd restarted without its data (docs/fleet.md, "Failure behaviour").
//!
//! TTLs are shortened (6 s keys, 3 s election) to keep the run short; the bounds asserted are "within the TTL"
//! plus generous slack for a loaded 2-core CI machine.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasebox_client::{AllocOptions, Client, Credentials, FleetConfig, Timeouts};
use leasebox_fleet::advert::{Advertisement, ELECTION, PREFIX};
use leasebox_fleet::etcd::{Etcd, EtcdUser};
use leasebox_fleet::local::{LocalEtcd, promtool_check, sample_value};
use leasebox_hosted::Hosted;
use leasebox_hosted::testing::{Key, Rig};
use leasebox_registrar::{ApplianceSpec, Config, Registrar};

const MIB: u64 = 1 << 20;
const TTL_S: i64 = 6;
const ELECTION_TTL_S: i64 = 3;
/// What "within the TTL" is given on top of the TTL: a poll period, a tick, a slow machine.
const SLACK: Duration = Duration::from_secs(4);

/// Each test runs several appliances with spinning model threads: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn etcd() -> LocalEtcd {
    LocalEtcd::start().unwrap_or_else(|e| panic!("{e}"))
}

struct Keys {
    tenant: Key,
    admin: Key,
    tenant_hex: String,
    admin_hex: String,
}

impl Keys {
    fn new() -> Keys {
        let (tenant, admin) = (Key::random(), Key::random());
        Keys { tenant_hex: tenant.hex(), admin_hex: admin.hex(), tenant, admin }
    }
    fn tenant(&self) -> Credentials {
        Credentials { name: "demo".into(), key: self.tenant.bytes().to_vec() }
    }
}

/// A hosted appliance: with the model (`pool_mib` of lease pool) or, with `None`, without an HCA.
fn appliance(keys: &Keys, pool_mib: Option<u64>) -> Hosted {
    appliance_at(keys, pool_mib, "127.0.0.1:0", "127.0.0.1:0")
}

/// [`appliance`] on given control and RoCEv2 addresses (a reboot in place).
fn appliance_at(keys: &Keys, pool_mib: Option<u64>, control: &str, udp: &str) -> Hosted {
    let mut b = Rig::builder().listen(control).tenant_with_key("demo", keys.tenant.clone());
    b = b.admin_with_key(keys.admin.clone());
    if let Some(mib) = pool_mib {
        // No firmware-like command delays: a FREE's teardown returns its bytes at once, so the free bytes the
        // appliances advertise (the placement weights) do not sag under a burst of ALLOC/FREE on a loaded host.
        b = b.udp(udp).timing("zero").lease_grace_ms(50).lease_pool_mib(mib).option("lease_slots", 4 * mib);
    }
    // A `Hosted` rather than the rig: the tests stop and restart appliances in place themselves.
    Hosted::start(b.config().unwrap()).unwrap()
}

fn spec(keys: &Keys, h: &Hosted, zone: &str) -> ApplianceSpec {
    let rdma = h.hca().and_then(|t| t.udp).map_or(String::new(), |u| format!(" rdma={u}"));
    ApplianceSpec::parse(&format!("{} key={}{rdma} zone={zone}", h.addr(), keys.admin_hex)).unwrap()
}

fn config(name: &str, e: &LocalEtcd, appliances: Vec<ApplianceSpec>) -> Config {
    Config {
        poll: Duration::from_millis(500),
        ttl_s: TTL_S,
        election_ttl_s: ELECTION_TTL_S,
        metrics: Some("127.0.0.1:0".into()),
        ..Config::new(name, vec![e.endpoint()], appliances)
    }
}

/// Every advertisement in etcd, by control address.
fn adverts(etcd: &Etcd) -> HashMap<String, Advertisement> {
    let (_, kvs) = etcd.get_prefix(PREFIX).unwrap_or_default();
    kvs.iter().filter_map(|kv| Advertisement::from_json(&kv.value).ok()).map(|a| (a.control.clone(), a)).collect()
}

/// Waits until `ok` holds, at most `within`; how long it took. Wall clock, and it stays: etcd is a real
/// process whose lease TTLs and elections run on the real clock, so "gone within its TTL (+ slack)" can only be
/// checked against it; the other waits are hang guards with seconds of margin.
fn wait_for(within: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed()
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn appliances_register_spread_leases_by_free_bytes_and_expire_when_stopped() {
    let _one = serial();
    let e = etcd();
    let keys = Keys::new();
    let pools = [32u64, 64, 128];
    let mut hosts: Vec<Option<Hosted>> = pools.iter().map(|&p| Some(appliance(&keys, Some(p)))).collect();
    let specs: Vec<ApplianceSpec> = hosts.iter().map(|h| spec(&keys, h.as_ref().unwrap(), "a")).collect();
    let reg = Registrar::start(config("r1", &e, specs.clone())).unwrap();
    let etcd = e.client();

    wait_for(Duration::from_secs(15), "three appliances advertised", || adverts(&etcd).len() == 3);
    let ads = adverts(&etcd);
    for (s, pool) in specs.iter().zip(pools) {
        let a = &ads[&s.control];
        assert_eq!(a.free_bytes, pool * MIB, "{a:?}");
        assert_eq!((a.health.as_str(), a.hca.as_str(), a.registrar.as_str()), ("ok", "ok", "r1"));
        assert_eq!(a.rdma, s.rdma);
        assert_eq!(a.labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(a.key(), format!("{PREFIX}{}", a.boot_id));
    }
    assert!(reg.is_leader());

    // `leasectl fleet list` shows the same fleet and the leader.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        leasectl::fleet::list(&[e.endpoint()], None, None, true, &mut out, &mut err),
        0,
        "{}",
        String::from_utf8_lossy(&err)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(listed["leader"], "r1");
    let mut controls: Vec<&str> =
        listed["appliances"].as_array().unwrap().iter().map(|a| a["control"].as_str().unwrap()).collect();
    controls.sort();
    let mut want: Vec<&str> = specs.iter().map(|s| s.control.as_str()).collect();
    want.sort();
    assert_eq!(controls, want);

    // /metrics: valid exposition (promtool), every appliance in it.
    let (status, page) = http_get(reg.metrics_addr().unwrap(), "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    promtool_check(&page).unwrap_or_else(|e| panic!("promtool check metrics: {e}\n{page}"));
    for s in &specs {
        let me = format!("appliance=\"{}\"", s.control);
        assert_eq!(sample_value(&page, "leasebox_up", &[&me]), Some(1.0), "{page}");
        // HCA_STATS: the driver's bring-up on the model is dozens of commands, none failed. The warm pool fills
        // in the background, so a few may still be in flight when polled (submitted, not yet ok).
        let cmds = |r: &str| sample_value(&page, "leasebox_hca_commands_total", &[&me, &format!("result=\"{r}\"")]);
        let (submitted, ok, failed) = (cmds("submitted"), cmds("ok"), cmds("failed"));
        assert!(ok >= Some(10.0) && ok <= submitted && failed == Some(0.0), "{page}");
    }
    assert!(page.contains("leasebox_registrar_leader{registrar=\"r1\"} 1"));
    assert_eq!(http_get(reg.metrics_addr().unwrap(), "/other").0, "HTTP/1.1 404 Not Found");

    // 100 leases from a client that knows only etcd: spread in proportion to free bytes (1 : 2 : 4).
    let mut fc = FleetConfig::new(vec![e.endpoint()], keys.tenant());
    fc.timeouts = Timeouts::all(Duration::from_secs(5));
    let client = Client::connect_fleet(fc).unwrap();
    wait_for(Duration::from_secs(10), "the client sees the three", || {
        client.fleet().unwrap().iter().filter(|m| m.present).count() == 3
    });
    let mut per: HashMap<String, u32> = HashMap::new();
    for _ in 0..100 {
        let l = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
        *per.entry(l.appliance().to_string()).or_default() += 1;
        l.free().unwrap();
    }
    let total: u64 = pools.iter().sum();
    println!("100 leases over pools of {pools:?} MiB: {per:?}");
    for (s, pool) in specs.iter().zip(pools) {
        let want = 100.0 * pool as f64 / total as f64;
        let got = f64::from(*per.get(&s.control).unwrap_or(&0));
        assert!(
            (got - want).abs() <= (want * 0.3).max(8.0),
            "{per:?}: {} got {got}, want about {want:.0}; the client's view: {:?}",
            s.control,
            client.fleet()
        );
    }
    // The metrics count them.
    wait_for(Duration::from_secs(5), "allocs in /metrics", || {
        let page = reg.render_metrics();
        specs.iter().all(|s| {
            let n = per.get(&s.control).copied().unwrap_or(0);
            sample_value(&page, "leasebox_allocs_total", &[&format!("appliance=\"{}\"", s.control)])
                == Some(f64::from(n))
        })
    });

    // The middle one stops: its key is gone within the TTL, and the client places nothing more there.
    let gone = specs[1].control.clone();
    hosts[1].take().unwrap().stop();
    let took = wait_for(Duration::from_secs(TTL_S as u64) + SLACK, "the stopped appliance's key gone", || {
        !adverts(&etcd).contains_key(&gone)
    });
    eprintln!("key gone {took:?} after the appliance stopped");
    wait_for(Duration::from_secs(5), "the client takes it out", || {
        client.fleet().unwrap().iter().any(|m| m.advert.control == gone && !m.present)
    });
    for _ in 0..20 {
        let l = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
        assert_ne!(l.appliance(), gone);
        l.free().unwrap();
    }
    assert!(reg.render_metrics().contains(&format!("leasebox_up{{appliance=\"{gone}\"")));

    // It comes back at the same addresses with a new boot id: the client eases leases onto it (FleetConfig's
    // warm-up, 30 s: from a tenth of its weight up), where a client that never knew the old boot does not.
    let old_boot = ads[&gone].boot_id.clone();
    hosts[1] = Some(appliance_at(&keys, Some(pools[1]), &gone, &specs[1].rdma));
    wait_for(Duration::from_secs(15), "the rebooted appliance advertised and seen by the client", || {
        client.fleet().unwrap().iter().any(|m| m.advert.control == gone && m.present && m.advert.boot_id != old_boot)
    });
    let warm = client.fleet().unwrap().into_iter().find(|m| m.advert.control == gone).unwrap().warmup;
    assert!(warm < 0.5, "warm-up factor {warm} right after the reboot");
    let mut fresh = FleetConfig::new(vec![e.endpoint()], keys.tenant());
    fresh.timeouts = Timeouts::all(Duration::from_secs(5));
    let fresh = Client::connect_fleet(fresh).unwrap();
    wait_for(Duration::from_secs(10), "a fresh client sees the three", || {
        fresh.fleet().unwrap().iter().filter(|m| m.present).count() == 3
    });
    let share = |c: &Client| {
        let mut n = 0;
        for _ in 0..60 {
            let l = c.alloc(2 * MIB, AllocOptions::default()).unwrap();
            n += u32::from(l.appliance() == gone);
            l.free().unwrap();
        }
        n
    };
    let (eased, normal) = (share(&client), share(&fresh));
    println!(
        "60 leases each after the reboot: {eased} to it from a client that saw the reboot, {normal} from a fresh one"
    );
    // Its full share is 64 of 224 MiB, about 17 of 60; eased in at well under half of its weight, it gets a few.
    // And it does get some: the client reconnected to the new boot.
    assert!((1..=8).contains(&eased) && normal >= 10, "eased {eased}, normal {normal} (warm-up {warm})");
    drop(fresh);
    drop(client);
    reg.stop();
    for h in hosts.into_iter().flatten() {
        h.stop();
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The registrar as a process, with `--etcd-cacert/--etcd-cert/--etcd-key` when `e` serves TLS.
fn registrar_process(name: &str, e: &LocalEtcd, spec_line: &str) -> Proc {
    registrar_process_with(name, e, spec_line, &[])
}

/// [`registrar_process`] with more arguments.
fn registrar_process_with(name: &str, e: &LocalEtcd, spec_line: &str, extra: &[&str]) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leasebox-registrar"));
    c.args(["--name", name, "--etcd", &e.endpoint(), "--appliance", spec_line, "--poll-ms", "500"]).args(extra).args([
        "--ttl-s",
        &TTL_S.to_string(),
        "--election-ttl-s",
        &ELECTION_TTL_S.to_string(),
    ]);
    if let Some(t) = e.client_tls() {
        c.arg("--etcd-cacert").arg(&t.ca);
        c.arg("--etcd-cert").arg(t.cert.as_ref().unwrap()).arg("--etcd-key").arg(t.key.as_ref().unwrap());
    }
    let c = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    Proc(c)
}

#[test]
fn when_the_leading_registrar_is_killed_the_other_leads_and_publishes_within_the_ttl() {
    let _one = serial();
    let e = etcd();
    let keys = Keys::new();
    // No HCA: registration needs only the control protocol.
    let h = appliance(&keys, None);
    let line = format!("{} key={}", h.addr(), keys.admin_hex);
    let mut procs =
        HashMap::from([("ra", registrar_process("ra", &e, &line)), ("rb", registrar_process("rb", &e, &line))]);
    let etcd = e.client();
    let leader = || etcd.leader(ELECTION).ok().flatten().map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    wait_for(Duration::from_secs(15), "a leader", || leader().is_some());
    let first = leader().unwrap();
    wait_for(Duration::from_secs(10), "the appliance advertised by the leader", || {
        adverts(&etcd).values().any(|a| a.registrar == first)
    });
    let other = if first == "ra" { "rb" } else { "ra" };

    let killed = procs.remove(first.as_str()).unwrap();
    let t0 = Instant::now();
    drop(killed); // SIGKILL: no resign, no revoke
    wait_for(Duration::from_secs(TTL_S as u64) + SLACK, "the standby leads and publishes", || {
        leader().as_deref() == Some(other) && adverts(&etcd).values().any(|a| a.registrar == other)
    });
    eprintln!("{other} leads and publishes {:?} after {first} was killed", t0.elapsed());
    // And the appliance never dropped out meanwhile long enough to lose its key.
    assert_eq!(adverts(&etcd).len(), 1);
    drop(procs);
    h.stop();
}

/// An etcd that serves TLS only and verifies clients (`--client-cert-auth`), as production clusters run: the
/// registrar (a process, with `--etcd-cacert/--etcd-cert/--etcd-key`) registers an appliance, `leasectl fleet
/// list` and a fleet client see it through TLS, and the client places a lease there. A registrar without the
/// TLS options is refused at start for an https endpoint.
#[test]
fn over_tls_with_client_certificates_the_fleet_works_end_to_end() {
    let _one = serial();
    let e = LocalEtcd::start_tls().unwrap_or_else(|m| panic!("{m}"));
    let tls = e.client_tls().unwrap().clone();
    let keys = Keys::new();
    let h = appliance(&keys, Some(16));
    let s = spec(&keys, &h, "tls");
    let line = format!("{} key={} rdma={} zone=tls", s.control, keys.admin_hex, s.rdma);
    let _reg = registrar_process("r-tls", &e, &line);
    let etcd = e.client();
    wait_for(Duration::from_secs(15), "the appliance advertised over TLS", || adverts(&etcd).contains_key(&s.control));

    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(leasectl::fleet::list(&[e.endpoint()], Some(&tls), None, true, &mut out, &mut err), 0);
    let listed: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(listed["appliances"][0]["control"], s.control.as_str(), "{listed}");
    // Without the TLS files, leasectl is told the endpoint needs them.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_ne!(leasectl::fleet::list(&[e.endpoint()], None, None, false, &mut out, &mut err), 0);
    assert!(String::from_utf8_lossy(&err).contains("--etcd-cacert"), "{}", String::from_utf8_lossy(&err));

    let mut fc = FleetConfig::new(vec![e.endpoint()], keys.tenant());
    fc.etcd_tls = Some(tls.clone());
    fc.timeouts = Timeouts::all(Duration::from_secs(5));
    let client = Client::connect_fleet(fc).unwrap();
    let mut l = client.alloc(MIB, AllocOptions::default()).unwrap();
    assert_eq!(l.appliance(), s.control);
    l.write(0, b"over TLS").unwrap();
    let mut back = [0u8; 8];
    l.read(0, &mut back).unwrap();
    assert_eq!(&back, b"over TLS");
    l.free().unwrap();
    drop(client);

    let plain = Config { etcd_tls: None, ..config("r-plain", &e, vec![s.clone()]) };
    let refused = Registrar::start(plain).err().expect("an https endpoint without TLS options is refused");
    assert!(refused.contains("--etcd-cacert"), "{refused}");
    h.stop();
}

/// etcd with authentication and roles, as a shared cluster has them: the registrar (a process, with
/// `--etcd-user` and `--etcd-password-file`) may write only under /leasebox/v1/, clients may only read there.
/// It registers, leads, keeps the key alive; a reader's `leasectl fleet list` and fleet client see the appliance
/// and place a lease; a wrong password is refused and said so.
#[test]
fn with_etcd_users_and_roles_the_registrar_writes_and_clients_read_only_their_prefix() {
    let _one = serial();
    let e = etcd();
    // (name, password, prefixes it may read and write, prefixes it may only read)
    let (v1, nothing): (&[&str], &[&str]) = (&["/leasebox/v1/"], &[]);
    let users = [("registrar", "reg-pw", v1, nothing), ("reader", "read-pw", nothing, v1)];
    e.enable_auth("root-pw", &users).unwrap();
    let dir = std::env::temp_dir().join(format!("leasebox-fleet-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (reg_pw, read_pw, bad_pw) = (dir.join("reg-pw"), dir.join("read-pw"), dir.join("bad-pw"));
    std::fs::write(&reg_pw, "reg-pw\n").unwrap();
    std::fs::write(&read_pw, "read-pw\n").unwrap();
    std::fs::write(&bad_pw, "nope\n").unwrap();

    let keys = Keys::new();
    let h = appliance(&keys, Some(16));
    let s = spec(&keys, &h, "auth");
    let line = format!("{} key={} rdma={}", s.control, keys.admin_hex, s.rdma);
    let _reg = registrar_process_with(
        "r-auth",
        &e,
        &line,
        &["--etcd-user", "registrar", "--etcd-password-file", reg_pw.to_str().unwrap()],
    );
    let as_user =
        |name: &str, pw: &str| e.client().with_user(Some(EtcdUser { name: name.into(), password: pw.into() }));
    let reader = as_user("reader", "read-pw");
    wait_for(Duration::from_secs(15), "the appliance advertised by the registrar user", || {
        adverts(&reader).contains_key(&s.control)
    });
    assert_eq!(reader.leader(ELECTION).unwrap().map(|kv| kv.value), Some(b"r-auth".to_vec()));
    // The reader may not write there.
    let refused = reader.put(&format!("{PREFIX}forged"), b"{}", 0).unwrap_err();
    assert!(refused.to_string().contains("permission denied"), "{refused}");

    let (mut out, mut err) = (Vec::new(), Vec::new());
    let user = Some(("reader".to_string(), read_pw.as_path()));
    assert_eq!(leasectl::fleet::list(&[e.endpoint()], None, user, true, &mut out, &mut err), 0);
    let listed: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(listed["appliances"][0]["control"], s.control.as_str(), "{listed}");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let bad = Some(("reader".to_string(), bad_pw.as_path()));
    assert_ne!(leasectl::fleet::list(&[e.endpoint()], None, bad, false, &mut out, &mut err), 0);
    let said = String::from_utf8_lossy(&err);
    assert!(said.contains("authenticating as etcd user 'reader'"), "{said}");

    let mut fc = FleetConfig::new(vec![e.endpoint()], keys.tenant());
    fc.etcd_user = Some(EtcdUser { name: "reader".into(), password: "read-pw".into() });
    fc.timeouts = Timeouts::all(Duration::from_secs(5));
    let client = Client::connect_fleet(fc).unwrap();
    let l = client.alloc(MIB, AllocOptions::default()).unwrap();
    assert_eq!(l.appliance(), s.control);
    l.free().unwrap();
    drop(client);
    let _ = std::fs::remove_dir_all(&dir);
    h.stop();
}

#[test]
fn etcd_restarted_without_its_data_gets_the_registrations_back() {
    let _one = serial();
    let mut e = etcd();
    let keys = Keys::new();
    let h = appliance(&keys, Some(16));
    let reg = Registrar::start(config("r1", &e, vec![spec(&keys, &h, "b")])).unwrap();
    let etcd = e.client();
    wait_for(Duration::from_secs(15), "advertised", || adverts(&etcd).len() == 1);

    // etcd dies: the registrar says it cannot reach it and keeps retrying; the appliance serves on regardless.
    e.kill();
    wait_for(Duration::from_secs(10), "the registrar notices", || {
        let s = reg.status();
        !s.etcd_up && s.etcd_error.as_deref().is_some_and(|m| m.contains("unreachable"))
    });
    assert!(reg.render_metrics().contains("leasebox_registrar_etcd_up{registrar=\"r1\"} 0"));
    let direct = leasebox_client::ClientConfig::software(
        &[h.addr().to_string()],
        "demo",
        &keys.tenant_hex,
        &[h.hca().unwrap().udp.unwrap().to_string()],
        Some(Duration::from_secs(5)),
    )
    .unwrap();
    let c = Client::connect(direct).unwrap();
    let mut l = c.alloc(2 * MIB, AllocOptions::default()).unwrap();
    l.write(0, b"no etcd needed").unwrap();
    l.free().unwrap();
    drop(c);

    // Back, empty: every lease and key lost. The registrar grants, campaigns and publishes again.
    e.restart(true).unwrap();
    assert!(adverts(&etcd).is_empty(), "a wiped etcd starts empty");
    let took = wait_for(Duration::from_secs(30), "registration back", || adverts(&etcd).len() == 1);
    eprintln!("registration back {took:?} after etcd restarted");
    wait_for(Duration::from_secs(5), "leading again", || reg.is_leader() && reg.status().etcd_up);
    reg.stop();
    h.stop();
}

/// A hosted appliance named `name` (its `appliance=`), with a small pool.
fn named_appliance(keys: &Keys, name: &str) -> Hosted {
    let b = Rig::builder()
        .listen("127.0.0.1:0")
        .model()
        .timing("zero")
        .lease_pool_mib(16)
        .option("lease_slots", 64)
        .appliance(name)
        .tenant_with_key("demo", keys.tenant.clone())
        .admin_with_key(keys.admin.clone());
    Hosted::start(b.config().unwrap()).unwrap()
}

#[test]
fn named_appliances_are_reached_by_their_registered_names() {
    let _one = serial();
    let e = etcd();
    let keys = Keys::new();
    let names = ["mem-a", "mem-b"];
    let hosts: Vec<Hosted> = names.iter().map(|n| named_appliance(&keys, n)).collect();
    // The operator names each appliance once, in the registrar's line; the registrar's own HELLO names it.
    let specs: Vec<ApplianceSpec> = hosts
        .iter()
        .zip(names)
        .map(|(h, n)| {
            let rdma = h.hca().and_then(|t| t.udp).map(|u| u.to_string()).unwrap();
            ApplianceSpec::parse(&format!("{} key={} rdma={rdma} appliance={n}", h.addr(), keys.admin_hex)).unwrap()
        })
        .collect();
    let reg = Registrar::start(config("r1", &e, specs.clone())).unwrap();
    let etcd = e.client();
    wait_for(Duration::from_secs(15), "both appliances advertised", || adverts(&etcd).len() == 2);
    let ads = adverts(&etcd);
    for (s, n) in specs.iter().zip(names) {
        assert_eq!(ads[&s.control].name, n, "{:?}", ads[&s.control]);
    }
    // The registrar's polls authenticated (the guard counters come with them) and the page is valid.
    let page = reg.render_metrics();
    promtool_check(&page).unwrap_or_else(|e| panic!("promtool check metrics: {e}\n{page}"));
    for s in &specs {
        let me = format!("appliance=\"{}\"", s.control);
        assert_eq!(sample_value(&page, "leasebox_up", &[&me]), Some(1.0), "{page}");
        assert_eq!(sample_value(&page, "leasebox_hellos_replayed_total", &[&me]), Some(0.0), "{page}");
        assert!(sample_value(&page, "leasebox_records_in_total", &[&me]) >= Some(1.0), "{page}");
    }
    // `leasectl fleet list` shows the names.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = leasectl::fleet::list(&[e.endpoint()], None, None, false, &mut out, &mut err);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let table = String::from_utf8(out).unwrap();
    for (s, n) in specs.iter().zip(names) {
        assert!(table.contains(&format!("{:<21}  {n}", s.control)), "{table}");
    }

    // A client configured with the bare tenant name reaches both: it names each appliance as registered.
    let mut fc = FleetConfig::new(vec![e.endpoint()], keys.tenant());
    fc.timeouts = Timeouts::all(Duration::from_secs(5));
    let client = Client::connect_fleet(fc).unwrap();
    wait_for(Duration::from_secs(10), "the client sees both", || {
        client.fleet().unwrap().iter().filter(|m| m.present).count() == 2
    });
    for m in client.fleet().unwrap() {
        let l = client.alloc(2 * MIB, AllocOptions { prefer: Some(m.index), ..AllocOptions::default() }).unwrap();
        assert_eq!(l.appliance(), m.advert.control, "the preferred appliance lent");
        l.free().unwrap();
    }

    // A HELLO meant for one fails on the other (same tenant key on both); meant for it, it succeeds.
    let t = Timeouts::all(Duration::from_secs(5));
    let hello = |addr: &str, name: &str| {
        let who = Credentials { name: name.into(), key: keys.tenant().key };
        leasebox_client::Connection::connect_and_hello(addr, &who, t).map(|_| ())
    };
    let (a, b) = (specs[0].control.as_str(), specs[1].control.as_str());
    hello(a, "demo@mem-a").unwrap();
    hello(b, "demo@mem-b").unwrap();
    for (addr, name) in [(b, "demo@mem-a"), (a, "demo@mem-b"), (a, "demo")] {
        match hello(addr, name) {
            Err(leasebox_client::ClientError::Server(e)) => {
                assert_eq!(e.code, leasebox_proto::ErrorCode::AuthFailed, "{name} on {addr}: {e:?}")
            }
            other => panic!("{name} on {addr}: {other:?}"),
        }
    }
    drop(client);
    reg.stop();
    for h in hosts {
        h.stop();
    }
}
