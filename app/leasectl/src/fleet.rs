//! `leasectl fleet list --etcd HOST:PORT`: the appliances the registrar advertises in etcd
//! (`/leasebox/v1/appliances/`, docs/fleet.md) and the registrar that leads. Reads etcd only; asks no
//! appliance anything.

use std::io::Write;
use std::time::Duration;

use leasebox_fleet::advert::{Advertisement, ELECTION, PREFIX};
use leasebox_fleet::etcd::Etcd;
use serde_json::json;

use crate::client::exit;

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / f64::from(1 << 20))
}

/// The table for people.
pub fn table(ads: &[Advertisement], leader: Option<&str>) -> String {
    let mut t = format!(
        "{:<32}  {:<21}  {:<16}  {:<21}  {:>9}  {:>10}  {:>6}  {:<8}  {:<6}  {}\n",
        "BOOT ID", "CONTROL", "NAME", "RDMA", "FREE MIB", "LEASED MIB", "LEASES", "HEALTH", "HCA", "LABELS"
    );
    for a in ads {
        let labels: Vec<String> = a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        t.push_str(&format!(
            "{:<32}  {:<21}  {:<16}  {:<21}  {:>9}  {:>10}  {:>6}  {:<8}  {:<6}  {}\n",
            a.boot_id,
            a.control,
            if a.name.is_empty() { "-" } else { &a.name },
            if a.rdma.is_empty() { "-" } else { &a.rdma },
            mib(a.free_bytes),
            mib(a.leased_bytes),
            a.lease_count(),
            a.health,
            a.hca,
            labels.join(",")
        ));
    }
    t.push_str(&format!("{} appliance(s); leading registrar: {}\n", ads.len(), leader.unwrap_or("none")));
    t
}

/// `leasectl fleet list`: `tls` and `user` (name, password file) as given on the command line.
pub fn list(
    etcd: &[String],
    tls: Option<&leasebox_client::TlsFiles>,
    user: Option<(String, &std::path::Path)>,
    json_out: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let fail = |err: &mut dyn Write, out: &mut dyn Write, m: String, code: u8| {
        if json_out {
            let _ = writeln!(out, "{}", json!({"error": {"code": "ETCD", "message": m}}));
        } else {
            let _ = writeln!(err, "leasectl: {m}");
        }
        code
    };
    let (name, file) = user.map_or((None, None), |(n, f)| (Some(n), Some(f)));
    let e = match (
        Etcd::with_tls(etcd, Duration::from_secs(3), tls),
        leasebox_client::EtcdUser::from_options(name, file),
    ) {
        (Ok(e), Ok(user)) => e.with_user(user),
        (Err(m), _) | (_, Err(m)) => return fail(err, out, m, exit::USAGE),
    };
    let (_, kvs) = match e.get_prefix(PREFIX) {
        Ok(r) => r,
        Err(m) => return fail(err, out, m.to_string(), exit::CONNECTION),
    };
    let mut ads: Vec<Advertisement> = kvs.iter().filter_map(|kv| Advertisement::from_json(&kv.value).ok()).collect();
    ads.sort_by(|a, b| a.control.cmp(&b.control));
    let leader = e.leader(ELECTION).ok().flatten().map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    if json_out {
        let list: Vec<serde_json::Value> =
            ads.iter().map(|a| serde_json::from_str(&a.to_json()).unwrap_or_default()).collect();
        let _ = writeln!(out, "{}", json!({"appliances": list, "leader": leader}));
    } else {
        let _ = write!(out, "{}", table(&ads, leader.as_deref()));
    }
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_appliance_and_the_leader() {
        let a = Advertisement {
            boot_id: "00112233445566778899aabbccddeeff".into(),
            control: "10.0.0.1:7470".into(),
            name: "mem-a".into(),
            free_bytes: 64 << 20,
            leases: [1, 2, 0, 0, 0],
            health: "ok".into(),
            hca: "ok".into(),
            labels: [("zone".to_string(), "a".to_string())].into(),
            ..Advertisement::default()
        };
        let t = table(&[a], Some("r1"));
        assert!(t.lines().nth(1).unwrap().contains(&format!("{:<21}  mem-a", "10.0.0.1:7470")), "{t}");
        assert!(t.contains("zone=a") && t.contains("       64  ") && t.contains("leading registrar: r1"), "{t}");
    }

    #[test]
    fn no_etcd_is_a_connection_failure() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let code = list(&[format!("127.0.0.1:{port}")], None, None, false, &mut out, &mut err);
        assert_eq!(code, exit::CONNECTION);
        assert!(String::from_utf8_lossy(&err).contains("etcd unreachable"));
    }
}
