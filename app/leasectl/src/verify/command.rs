//! `leasectl verify`'s command line: its options, the credentials (the tenant for the lease, the admin for
//! `--order qp-first`), the software RoCEv2 requester as the backend, and the report on stdout.
//!
//! `--order both` runs mkey-first, then qp-first, with the same options: the human output is both tables, the
//! JSON an object with `passed` and `runs` (one report object each), and `--plot FILE.svg` draws one panel
//! per order.
//!
//! Global flags keep their meaning (`--addr`, `--config`, `--tenant`, `--key`, `--json`) wherever they stand;
//! `--timeout` is the global control-channel timeout (seconds) before the word `verify` and the requester
//! QP's `timeout` attribute after it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use super::{Control, EXIT_VERIFY_FAILED, Mode, Options, Order, plot, report, run_detailed};
use crate::args::{self, Global};
use crate::client::{Credentials, exit};
use crate::config;
use crate::rdma::{RcConfig, Requester, SoftConfig, SoftRoce};

/// Global flags that take a value.
const GLOBAL_VALUE: [&str; 5] = ["--addr", "--config", "--tenant", "--key", "--timeout"];

/// Where the word `verify` stands, when it is the command.
pub fn position(args: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "verify" {
            return Some(i);
        }
        if !a.starts_with('-') {
            return None; // another command
        }
        if GLOBAL_VALUE.contains(&a) {
            i += 1;
        }
        i += 1;
    }
    None
}

/// Which requester carries the RDMA traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Backend {
    /// The software RoCEv2 requester over UDP (the model's cable).
    Soft,
    /// A real RDMA device through libibverbs (feature `verbs`).
    Verbs { device: String, gid_index: u8, port: u8, mac: Option<[u8; 6]> },
}

#[derive(Debug)]
struct Parsed {
    global: Vec<String>,
    opts: Options,
    /// The orders to run, in turn (`--order both`: mkey-first, then qp-first); `opts.order` is the first.
    orders: Vec<Order>,
    plot: Option<PathBuf>,
    udp: SocketAddr,
    admin_key: Option<String>,
    backend: Backend,
}

fn mac(v: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = v.split(':').collect();
    let mut m = [0u8; 6];
    if parts.len() != 6 {
        return Err(format!("--mac needs aa:bb:cc:dd:ee:ff, got '{v}'"));
    }
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("--mac needs aa:bb:cc:dd:ee:ff, got '{v}'"))?;
    }
    Ok(m)
}

fn number(flag: &str, v: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    };
    n.filter(|n| (min..=max).contains(n)).ok_or_else(|| format!("{flag} needs a number from {min} to {max}, got '{v}'"))
}

fn size(v: &str) -> Result<u64, String> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let shift = match unit {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "MiB" => 20,
        _ => return Err(format!("--size: unknown unit in '{v}' (use bytes, K or M)")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|n| (1..=16 << 20).contains(n))
        .ok_or_else(|| format!("--size needs 1 byte to 16 MiB (e.g. 4096, 64K), got '{v}'"))
}

fn parse(args: &[String], at: usize) -> Result<Parsed, String> {
    let mut global: Vec<String> = args[..at].to_vec();
    let mut o = Options::default();
    let mut rc = RcConfig::default();
    let mut udp: SocketAddr = "127.0.0.1:4791".parse().expect("literal address");
    let mut admin_key = None;
    let mut orders = vec![Order::MkeyFirst];
    let mut plot = None;
    let (mut revoke_test, mut cooperating) = (false, false);
    let (mut backend, mut device, mut gid_index, mut port, mut mac_addr) = (String::from("soft"), None, 0u8, 1u8, None);
    let mut it = args[at + 1..].iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag {
            "--revoke-test" => revoke_test = true,
            "--cooperating" => cooperating = true,
            "--order" => {
                orders = match value()?.as_str() {
                    "mkey-first" => vec![Order::MkeyFirst],
                    "qp-first" => vec![Order::QpFirst],
                    "both" => vec![Order::MkeyFirst, Order::QpFirst],
                    v => return Err(format!("--order is mkey-first, qp-first or both, got '{v}'")),
                }
            }
            "--plot" => {
                let v = value()?;
                if v.is_empty() || v.starts_with('-') {
                    return Err(format!("--plot needs a file name (FILE.svg), got '{v}'"));
                }
                plot = Some(PathBuf::from(v));
            }
            "--iterations" => o.iterations = number(flag, &value()?, 1, 100_000)? as u32,
            "--budget-ms" => o.budget = Duration::from_millis(number(flag, &value()?, 1, 3_600_000)?),
            "--size" => o.size = size(&value()?)? as u32,
            "--depth" => o.depth = number(flag, &value()?, 1, 1024)? as u32,
            "--warmup-ms" => o.warmup = Duration::from_millis(number(flag, &value()?, 0, 600_000)?),
            "--udp" => {
                let v = value()?;
                udp = v.parse().map_err(|_| format!("--udp needs ADDR:PORT, got '{v}'"))?;
            }
            "--timeout" => rc.timeout = number(flag, &value()?, 1, 31)? as u8,
            "--retry-cnt" => rc.retry_cnt = number(flag, &value()?, 0, 7)? as u8,
            "--admin-key" => admin_key = Some(value()?),
            "--backend" => backend = value()?,
            "--device" => device = Some(value()?),
            "--gid-index" => gid_index = number(flag, &value()?, 0, 255)? as u8,
            "--ib-port" => port = number(flag, &value()?, 1, 255)? as u8,
            "--mac" => mac_addr = Some(mac(&value()?)?),
            "--admin" => {
                return Err("verify runs as the tenant; the admin key for --order qp-first comes from admin_key \
                            in the configuration file or --admin-key HEX"
                    .into());
            }
            "--json" => global.push(arg.clone()),
            "--addr" | "--config" | "--tenant" | "--key" => {
                let v = value()?;
                global.push(flag.to_string());
                global.push(v);
            }
            other => return Err(format!("unknown option '{other}' for 'verify'")),
        }
    }
    if revoke_test && cooperating {
        return Err("--revoke-test and --cooperating exclude each other".into());
    }
    o.order = orders[0];
    o.mode = if cooperating { Mode::Cooperating } else { Mode::RevokeTest };
    rc.max_wr = (o.depth as usize + 1).max(rc.max_wr);
    o.rc = rc;
    let backend = match backend.as_str() {
        "soft" => {
            if device.is_some() {
                return Err("--device is for --backend verbs".into());
            }
            Backend::Soft
        }
        "verbs" => {
            let device = device.ok_or("--backend verbs needs --device NAME (see ibv_devices)")?;
            Backend::Verbs { device, gid_index, port, mac: mac_addr }
        }
        other => return Err(format!("--backend is soft or verbs, got '{other}'")),
    };
    Ok(Parsed { global, opts: o, orders, plot, udp, admin_key, backend })
}

/// The tenant's and (for qp-first) the admin's credentials, where to connect and the timeouts.
fn control(p: &Parsed, g: &Global, env: &dyn Fn(&str) -> Option<String>) -> Result<Control, String> {
    if g.admin {
        return Err(
            "verify runs as the tenant: drop --admin (the admin key comes from admin_key or --admin-key)".into()
        );
    }
    let s = config::settings(g, env)?;
    let admin = match (p.orders.contains(&Order::QpFirst), &p.admin_key) {
        (false, _) => None,
        (true, Some(hex)) => {
            let key = crate::hex::decode(hex).map_err(|e| format!("--admin-key: {e}"))?;
            Some(Credentials { name: "admin".into(), key })
        }
        (true, None) => {
            let ga = Global { admin: true, tenant: None, key: None, ..g.clone() };
            let a = config::settings(&ga, env).map_err(|e| {
                format!("--order qp-first sends REVOKE with qp_first, which only the admin may ask for: {e}")
            })?;
            Some(a.who)
        }
    };
    Ok(Control { addr: s.addr, tenant: s.who, admin, timeouts: s.timeouts })
}

/// Runs `leasectl verify`; `at` is where the word `verify` stands in `args`. Returns the exit code.
pub fn main(
    args: &[String],
    at: usize,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let json = args.iter().any(|a| a == "--json");
    let fail = |out: &mut dyn Write, err: &mut dyn Write, code: &str, exit: u8, m: &str| {
        if json {
            let _ = writeln!(out, "{}", json!({"error": {"code": code, "detail": [], "message": m}}));
        } else {
            let _ = writeln!(err, "leasectl verify: {m}");
        }
        exit
    };
    let p = match parse(args, at) {
        Ok(p) => p,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let mut gargs = p.global.clone();
    gargs.push("ping".into());
    let g = match args::parse(&gargs) {
        Ok(i) => i.global,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let c = match control(&p, &g, env) {
        Ok(c) => c,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let (udp, rc) = (p.udp, p.opts.rc);
    let (depth, size) = (p.opts.depth as usize, p.opts.size as usize);
    let backend = p.backend.clone();
    let mut factory = || -> Result<Box<dyn Requester>, String> {
        match &backend {
            Backend::Soft => {
                let cfg = SoftConfig { peer: udp, rc, ..SoftConfig::default() };
                SoftRoce::new(cfg)
                    .map(|r| Box::new(r) as Box<dyn Requester>)
                    .map_err(|e| format!("UDP toward {udp}: {e}"))
            }
            Backend::Verbs { device, gid_index, port, mac } => {
                verbs_requester(device, *gid_index, *port, *mac, rc, depth, size)
            }
        }
    };
    let mut reports = Vec::new();
    for &order in &p.orders {
        let o = Options { order, ..p.opts.clone() };
        match run_detailed(&o, &c, &mut factory) {
            Ok(r) => reports.push(r),
            Err(e) => return fail(out, err, "VERIFY", e.exit, &e.message),
        }
    }
    if let Some(path) = &p.plot
        && let Err(m) = plot::svg(&reports, path)
    {
        return fail(out, err, "PLOT", EXIT_VERIFY_FAILED, &format!("--plot {}: {m}", path.display()));
    }
    let passed = reports.iter().all(|r| r.passed());
    let text = match (json, reports.as_slice()) {
        (true, [r]) => format!("{}\n", report::json(r)),
        (true, all) => {
            format!("{}\n", json!({"passed": passed, "runs": all.iter().map(report::json).collect::<Vec<_>>()}))
        }
        (false, all) => all.iter().map(report::human).collect::<Vec<_>>().join("\n"),
    };
    let _ = write!(out, "{text}");
    if !json && let Some(path) = &p.plot {
        let _ = writeln!(out, "plot: {}", path.display());
    }
    if passed { exit::OK } else { EXIT_VERIFY_FAILED }
}

/// A requester on a real RDMA device (`--backend verbs`).
#[cfg(feature = "verbs")]
fn verbs_requester(
    device: &str,
    gid_index: u8,
    port: u8,
    mac: Option<[u8; 6]>,
    rc: RcConfig,
    depth: usize,
    size: usize,
) -> Result<Box<dyn Requester>, String> {
    use crate::rdma::verbs::{Verbs, VerbsConfig};
    let cfg = VerbsConfig {
        device: device.to_string(),
        port,
        gid_index,
        mac,
        // Room for the WRITE loop, its READ checks and the read-back of every region.
        depth: depth + 2,
        slot_len: size,
        timeout: rc.timeout,
        retry_cnt: rc.retry_cnt,
        rnr_retry: rc.rnr_retry,
    };
    Verbs::open(cfg).map(|v| Box::new(v) as Box<dyn Requester>)
}

#[cfg(not(feature = "verbs"))]
fn verbs_requester(
    _device: &str,
    _gid_index: u8,
    _port: u8,
    _mac: Option<[u8; 6]>,
    _rc: RcConfig,
    _depth: usize,
    _size: usize,
) -> Result<Box<dyn Requester>, String> {
    Err("this leasectl was built without the verbs backend: cargo build -p leasectl --features verbs".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finds_the_command_after_global_flags() {
        assert_eq!(position(&v(&["verify"])), Some(0));
        assert_eq!(position(&v(&["--addr", "verify", "verify"])), Some(2));
        assert_eq!(position(&v(&["--json", "--timeout", "3", "verify", "--json"])), Some(3));
        assert_eq!(position(&v(&["ping", "verify"])), None);
        assert_eq!(position(&v(&["--addr=x", "list"])), None);
    }

    #[test]
    fn options_and_globals() {
        let a = v(&["--timeout", "3", "verify", "--order", "qp-first", "--timeout", "10", "--retry-cnt=3", "--json"]);
        let p = parse(&a, 2).unwrap();
        assert_eq!(p.opts.order, Order::QpFirst);
        assert_eq!((p.opts.rc.timeout, p.opts.rc.retry_cnt), (10, 3));
        assert_eq!(p.opts.mode, Mode::RevokeTest);
        assert_eq!(p.global, v(&["--timeout", "3", "--json"]));
        let p = parse(&v(&["verify", "--cooperating", "--size", "64K", "--depth", "4", "--addr", "h:1"]), 0).unwrap();
        assert_eq!((p.opts.mode, p.opts.size, p.opts.depth), (Mode::Cooperating, 65536, 4));
        assert_eq!(p.global, v(&["--addr", "h:1"]));
        assert!(parse(&v(&["verify", "--revoke-test", "--cooperating"]), 0).unwrap_err().contains("exclude"));
        assert!(parse(&v(&["verify", "--order", "x"]), 0).unwrap_err().contains("mkey-first"));
        let p = parse(&v(&["verify", "--order", "both", "--plot", "/tmp/r.svg"]), 0).unwrap();
        assert_eq!((p.orders, p.opts.order), (vec![Order::MkeyFirst, Order::QpFirst], Order::MkeyFirst));
        assert_eq!(p.plot, Some(PathBuf::from("/tmp/r.svg")));
        let p = parse(&v(&["verify", "--order=qp-first"]), 0).unwrap();
        assert_eq!((p.orders, p.opts.order, p.plot), (vec![Order::QpFirst], Order::QpFirst, None));
        assert!(parse(&v(&["verify", "--plot", "--json"]), 0).unwrap_err().contains("file name"));
        assert!(parse(&v(&["verify", "--timeout", "40"]), 0).is_err());
        assert!(parse(&v(&["verify", "--frob"]), 0).unwrap_err().contains("unknown option"));
        assert!(parse(&v(&["verify", "--admin"]), 0).unwrap_err().contains("admin_key"));
    }

    #[test]
    fn backends() {
        assert_eq!(parse(&v(&["verify"]), 0).unwrap().backend, Backend::Soft);
        let p = parse(
            &v(&[
                "verify",
                "--backend",
                "verbs",
                "--device",
                "mlx5_0",
                "--gid-index",
                "3",
                "--mac",
                "02:00:00:00:00:09",
            ]),
            0,
        )
        .unwrap();
        assert_eq!(
            p.backend,
            Backend::Verbs { device: "mlx5_0".into(), gid_index: 3, port: 1, mac: Some([2, 0, 0, 0, 0, 9]) }
        );
        assert!(parse(&v(&["verify", "--backend", "verbs"]), 0).unwrap_err().contains("--device"));
        assert!(parse(&v(&["verify", "--device", "mlx5_0"]), 0).unwrap_err().contains("--backend verbs"));
        assert!(parse(&v(&["verify", "--backend", "dpdk"]), 0).unwrap_err().contains("soft or verbs"));
        assert!(parse(&v(&["verify", "--mac", "02:00"]), 0).is_err());
        // Without a device (or without the feature), opening fails with a clear message, not a panic.
        let e = match verbs_requester("no-such-device", 0, 1, None, RcConfig::default(), 4, 4096) {
            Err(e) => e,
            Ok(_) => panic!("opened a device that does not exist"),
        };
        // (With the feature: no device is named, or, on a machine without RDMA support, libibverbs says so.)
        assert!(
            e.contains("no-such-device") || e.contains("ibv_get_device_list") || e.contains("--features verbs"),
            "{e}"
        );
    }

    #[test]
    fn qp_first_needs_the_admin_key() {
        let none = |_: &str| None;
        let p = parse(&v(&["verify", "--order", "qp-first", "--tenant", "t", "--key", "00"]), 0).unwrap();
        let mut ga = p.global.clone();
        ga.push("ping".into());
        let g = args::parse(&ga).unwrap().global;
        let e = control(&p, &g, &none).unwrap_err();
        assert!(e.contains("only the admin") && e.contains("admin key"), "{e}");
        let p = parse(&v(&["verify", "--order", "both", "--tenant", "t", "--key", "00"]), 0).unwrap();
        assert!(control(&p, &g, &none).unwrap_err().contains("only the admin"));
        let p = parse(&v(&["verify", "--order=qp-first", "--tenant", "t", "--key", "00", "--admin-key", "01"]), 0);
        let c = control(&p.unwrap(), &g, &none).unwrap();
        assert_eq!(c.admin.unwrap().key, vec![1]);
    }
}
