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
//!
//! The software requester's cable: `--udp` (where frames go), `--bind` (our socket), `--local-ip`, `--mac` and
//! how the appliance's MAC is learned (`--arp` / `--resolve`, `--remote-mac`), each over the configuration
//! file's `rdma_*` key of the same meaning (config.rs), over the default of today's point-to-point cable to the
//! model's socket (127.0.0.1:4791, no ARP).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{Control, EXIT_VERIFY_FAILED, Mode, Options, Order, perf, plot, report, run_detailed};
use crate::args::{Global, number, parse_mac};
use crate::client::{Credentials, exit};
use crate::config::{self, ResolveKind};
use crate::rdma::{RcConfig, Requester, Resolve, SoftConfig, SoftRoce};

/// `verify`'s options (after the word `verify`; the global flags are [`Global`]). Given twice, the later one
/// counts.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
#[command(args_override_self = true)]
pub struct VerifyArgs {
    /// Non-cooperating client: keep posting until the dataplane refuses (the default)
    #[arg(long, conflicts_with = "cooperating")]
    revoke_test: bool,
    /// Cooperating client: stop posting at the outcome
    #[arg(long)]
    cooperating: bool,
    /// Teardown order the REVOKE asks for; `both` runs mkey-first, then qp-first
    #[arg(long, value_enum, default_value = "mkey-first")]
    order: OrderArg,
    /// Revokes per order (default 1)
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 1, 100_000))]
    iterations: Option<u64>,
    /// Each figure must stay within this (default 2000)
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 1, 3_600_000))]
    budget_ms: Option<u64>,
    /// Bytes per RDMA WRITE, 1 byte to 16 MiB (default 4096; units: 64K, 1M)
    #[arg(long, value_name = "BYTES", value_parser = write_size)]
    size: Option<u64>,
    /// WRITEs (and READ checks) outstanding (default 8)
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 1, 1024))]
    depth: Option<u64>,
    /// How long the loop runs before the REVOKE (default 100)
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 0, 600_000))]
    warmup_ms: Option<u64>,
    /// Where RDMA frames go: the model's UDP port, or QEMU's socket netdev `localaddr` on a hub (default:
    /// rdma_peer in the configuration file, else 127.0.0.1:4791)
    #[arg(long, value_name = "ADDR:PORT")]
    udp: Option<SocketAddr>,
    /// --backend soft: our UDP socket (default: rdma_bind, else 127.0.0.1 on any port)
    #[arg(long, value_name = "ADDR:PORT")]
    bind: Option<SocketAddr>,
    /// --backend soft: our IPv4 in frames and our GID (default: rdma_local_ip, else the bound address)
    #[arg(long, value_name = "IPV4")]
    local_ip: Option<Ipv4Addr>,
    /// --backend soft: learn the appliance's MAC by ARP (same as --resolve arp)
    #[arg(long, conflicts_with_all = ["resolve", "remote_mac"])]
    arp: bool,
    /// --backend soft: how the appliance's MAC is learned (default: rdma_resolve, else endpoint)
    #[arg(long, value_enum, value_name = "HOW", conflicts_with = "remote_mac")]
    resolve: Option<ResolveArg>,
    /// --backend soft: the appliance's MAC, aa:bb:cc:dd:ee:ff: no ARP (default: rdma_remote_mac)
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    remote_mac: Option<[u8; 6]>,
    /// --backend soft with ARP: how long to wait for the reply, three requests spread over it (default 1500)
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 1, 600_000), conflicts_with = "remote_mac")]
    arp_wait_ms: Option<u64>,
    /// The requester QP's `timeout` attribute, 1 to 31 (default 14)
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 1, 31))]
    timeout: Option<u64>,
    /// The requester QP's `retry_cnt`, 0 to 7 (default 7)
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 0, 7))]
    retry_cnt: Option<u64>,
    /// The admin key for --order qp-first (default: admin_key in the configuration file)
    #[arg(long, value_name = "HEX")]
    admin_key: Option<String>,
    /// Draw the figures to an SVG file, one panel per order
    #[arg(long, value_name = "FILE.svg", value_parser = plot_path)]
    plot: Option<PathBuf>,
    /// Which requester carries the RDMA traffic
    #[arg(long, value_enum, default_value = "soft")]
    backend: BackendArg,
    /// --backend verbs: the RDMA device (see ibv_devices)
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// --backend verbs: the GID index
    #[arg(long, value_name = "N", default_value = "0", value_parser = |v: &str| number(v, 0, 255).map(|n| n as u8))]
    gid_index: u8,
    /// --backend verbs: the port
    #[arg(long, value_name = "N", default_value = "1", value_parser = |v: &str| number(v, 1, 255).map(|n| n as u8))]
    ib_port: u8,
    /// Our MAC, aa:bb:cc:dd:ee:ff (--backend soft: default rdma_local_mac, else 02:4c:42:00:00:01)
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    mac: Option<[u8; 6]>,
    /// Measure instead of revoking: WRITE and READ latency (one outstanding) and bandwidth (--depth
    /// outstanding) on one lease for each size, e.g. 64,4K,1M
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = write_size,
          conflicts_with_all = ["revoke_test", "cooperating", "plot"])]
    perf: Vec<u64>,
    /// --perf: time per figure (default 1000)
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 1, 600_000), requires = "perf")]
    perf_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ResolveArg {
    /// ARP on the cable (an Ethernet segment, e.g. a QEMU hub)
    Arp,
    /// ALLOC's answer, else a placeholder (the model's point-to-point socket)
    Endpoint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OrderArg {
    MkeyFirst,
    QpFirst,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The software RoCEv2 requester over UDP
    Soft,
    /// A real RDMA device through libibverbs (a leasectl built with --features verbs)
    Verbs,
}

/// `--size`: 1 byte to 16 MiB.
fn write_size(v: &str) -> Result<u64, String> {
    leasebox_units::parse_size_in(v, 1..=16 << 20).map_err(|e| e.to_string())
}

/// `--plot`: a file name, not a flag.
fn plot_path(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() || v.starts_with('-') {
        return Err("needs a file name (FILE.svg)".into());
    }
    Ok(PathBuf::from(v))
}

/// Which requester carries the RDMA traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Backend {
    /// The software RoCEv2 requester over UDP (the model's cable).
    Soft,
    /// A real RDMA device through libibverbs (feature `verbs`).
    Verbs { device: String, gid_index: u8, port: u8, mac: Option<[u8; 6]> },
}

/// The software requester's cable as the flags give it (`None`: the configuration file's, else the default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Cable {
    udp: Option<SocketAddr>,
    bind: Option<SocketAddr>,
    local_ip: Option<Ipv4Addr>,
    mac: Option<[u8; 6]>,
    resolve: Option<ResolveKind>,
    remote_mac: Option<[u8; 6]>,
    arp_wait: Option<Duration>,
}

impl Cable {
    /// Flags over the file's `rdma_*` keys over the defaults.
    fn soft_config(&self, file: &config::Rdma, rc: RcConfig) -> SoftConfig {
        let d = SoftConfig::default();
        // A MAC given by flag, or the way to learn it given by flag, beats anything in the file.
        let (kind, fixed) = match (self.remote_mac, self.resolve) {
            (Some(m), _) => (None, Some(m)),
            (None, Some(k)) => (Some(k), None),
            (None, None) => (file.resolve, file.remote_mac),
        };
        let resolve = match (fixed, kind) {
            (Some(m), _) => Resolve::Fixed(m),
            (None, Some(ResolveKind::Arp)) => match self.arp_wait {
                Some(deadline) => Resolve::Arp { deadline, tries: crate::rdma::soft::ARP_TRIES },
                None => Resolve::arp(),
            },
            (None, Some(ResolveKind::Endpoint) | None) => Resolve::Endpoint,
        };
        SoftConfig {
            peer: self.udp.or(file.peer).unwrap_or(d.peer),
            bind: self.bind.or(file.bind).unwrap_or(d.bind),
            local_ip: self.local_ip.or(file.local_ip),
            local_mac: self.mac.or(file.local_mac).unwrap_or(d.local_mac),
            resolve,
            rc,
            ..d
        }
    }
}

#[derive(Debug)]
struct Parsed {
    opts: Options,
    /// The orders to run, in turn (`--order both`: mkey-first, then qp-first); `opts.order` is the first.
    orders: Vec<Order>,
    plot: Option<PathBuf>,
    cable: Cable,
    admin_key: Option<String>,
    backend: Backend,
}

/// The verifier's options from `v`, with the defaults of [`Options`] and [`RcConfig`] where `v` is silent.
fn parse(v: &VerifyArgs) -> Result<Parsed, String> {
    let d = Options::default();
    let mut rc = RcConfig::default();
    rc.timeout = v.timeout.map_or(rc.timeout, |n| n as u8);
    rc.retry_cnt = v.retry_cnt.map_or(rc.retry_cnt, |n| n as u8);
    let orders = match v.order {
        OrderArg::MkeyFirst => vec![Order::MkeyFirst],
        OrderArg::QpFirst => vec![Order::QpFirst],
        OrderArg::Both => vec![Order::MkeyFirst, Order::QpFirst],
    };
    let depth = v.depth.map_or(d.depth, |n| n as u32);
    rc.max_wr = (depth as usize + 1).max(rc.max_wr);
    let opts = Options {
        mode: if v.cooperating { Mode::Cooperating } else { Mode::RevokeTest },
        order: orders[0],
        iterations: v.iterations.map_or(d.iterations, |n| n as u32),
        budget: v.budget_ms.map_or(d.budget, Duration::from_millis),
        size: v.size.map_or(d.size, |n| n as u32),
        depth,
        warmup: v.warmup_ms.map_or(d.warmup, Duration::from_millis),
        rc,
    };
    let resolve = match (v.arp, v.resolve) {
        (true, _) | (false, Some(ResolveArg::Arp)) => Some(ResolveKind::Arp),
        (false, Some(ResolveArg::Endpoint)) => Some(ResolveKind::Endpoint),
        (false, None) => None,
    };
    let cable = Cable {
        udp: v.udp,
        bind: v.bind,
        local_ip: v.local_ip,
        mac: v.mac,
        resolve,
        remote_mac: v.remote_mac,
        arp_wait: v.arp_wait_ms.map(Duration::from_millis),
    };
    let backend = match v.backend {
        BackendArg::Soft => {
            if v.device.is_some() {
                return Err("--device is for --backend verbs".into());
            }
            Backend::Soft
        }
        BackendArg::Verbs => {
            let soft_only = [
                ("--bind", v.bind.is_some()),
                ("--local-ip", v.local_ip.is_some()),
                ("--arp", v.arp),
                ("--resolve", v.resolve.is_some()),
                ("--remote-mac", v.remote_mac.is_some()),
                ("--arp-wait-ms", v.arp_wait_ms.is_some()),
            ];
            if let Some((flag, _)) = soft_only.iter().find(|(_, given)| *given) {
                return Err(format!("{flag} is for --backend soft (the verbs device resolves addresses itself)"));
            }
            let device = v.device.clone().ok_or("--backend verbs needs --device NAME (see ibv_devices)")?;
            Backend::Verbs { device, gid_index: v.gid_index, port: v.ib_port, mac: v.mac }
        }
    };
    Ok(Parsed { opts, orders, plot: v.plot.clone(), cable, admin_key: v.admin_key.clone(), backend })
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
            leasebox_proto::key::check_key(&key).map_err(|e| format!("--admin-key: {e}"))?;
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

/// Runs `leasectl verify` with its options `v` and the global flags `g`. Returns the exit code.
pub fn main(
    v: &VerifyArgs,
    g: &Global,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let json = g.json;
    let fail = |out: &mut dyn Write, err: &mut dyn Write, code: &str, exit: u8, m: &str| {
        if json {
            let _ = writeln!(out, "{}", json!({"error": {"code": code, "detail": [], "message": m}}));
        } else {
            let _ = writeln!(err, "leasectl verify: {m}");
        }
        exit
    };
    let p = match parse(v) {
        Ok(p) => p,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let c = match control(&p, g, env) {
        Ok(c) => c,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    // The file was read (and its rdma_* keys checked) by `control` already; a file without them is no error.
    let file = match config::file(g, env).and_then(|(f, _)| f.rdma()) {
        Ok(f) => f,
        Err(m) => return fail(out, err, "USAGE", exit::USAGE, &m),
    };
    let soft = p.cable.soft_config(&file, p.opts.rc);
    let rc = p.opts.rc;
    // A requester's buffers take the largest request: --size, or the largest --perf size.
    let largest = v.perf.iter().copied().max().unwrap_or(0).max(u64::from(p.opts.size));
    let (depth, size) = (p.opts.depth as usize, largest as usize);
    let backend = p.backend.clone();
    let mut factory = || -> Result<Box<dyn Requester>, String> {
        match &backend {
            Backend::Soft => SoftRoce::new(soft.clone())
                .map(|r| Box::new(r) as Box<dyn Requester>)
                .map_err(|e| format!("UDP {} → {}: {e}", soft.bind, soft.peer)),
            Backend::Verbs { device, gid_index, port, mac } => {
                verbs_requester(device, *gid_index, *port, *mac, rc, depth, size)
            }
        }
    };
    if !v.perf.is_empty() {
        let o = perf::PerfOptions {
            sizes: v.perf.iter().map(|&n| n as u32).collect(),
            phase: Duration::from_millis(v.perf_ms.unwrap_or(1000)),
            depth,
        };
        return match perf::run(&o, &c, &mut factory) {
            Ok(rows) if json => {
                let _ = writeln!(out, "{}", json!({"perf": rows.iter().map(perf::PerfRow::json).collect::<Vec<_>>()}));
                exit::OK
            }
            Ok(rows) => {
                for r in &rows {
                    let _ = writeln!(out, "{}", r.human());
                }
                exit::OK
            }
            Err(e) => fail(out, err, "PERF", e.exit, &e.message),
        };
    }
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
        // Room for the WRITE loop, its READ checks and the read-back of every region; a slot takes a region or
        // the fresh lease's read-back, whichever is larger (the first run on a real stack found the slot too
        // small for the latter).
        depth: depth + 2,
        slot_len: size.max(crate::verify::FRESH_READ_MAX as usize),
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
    use crate::args::{self, Command, Invocation};

    /// The whole command line through clap: the global flags and `verify`'s options.
    fn inv(a: &[&str]) -> Result<(Global, VerifyArgs), String> {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        match args::parse(&a).map_err(|e| e.to_string())? {
            Invocation { global, command: Command::Verify(v) } => Ok((global, *v)),
            other => Err(format!("not verify: {other:?}")),
        }
    }

    fn parsed(a: &[&str]) -> Result<Parsed, String> {
        parse(&inv(a)?.1)
    }

    #[test]
    fn finds_the_command_after_global_flags() {
        assert!(inv(&["verify"]).is_ok());
        assert_eq!(inv(&["--addr", "verify", "verify"]).unwrap().0.addr.as_deref(), Some("verify"));
        let (g, _) = inv(&["--json", "--timeout", "3", "verify", "--json"]).unwrap();
        assert!(g.json);
        assert!(inv(&["ping", "verify"]).unwrap_err().contains("unexpected argument 'verify'"));
        assert!(inv(&["--addr=x", "list"]).unwrap_err().contains("not verify"));
    }

    #[test]
    fn options_and_globals() {
        let a = ["--timeout", "3", "verify", "--order", "qp-first", "--timeout", "10", "--retry-cnt=3", "--json"];
        let (g, v) = inv(&a).unwrap();
        let p = parse(&v).unwrap();
        assert_eq!(p.opts.order, Order::QpFirst);
        assert_eq!((p.opts.rc.timeout, p.opts.rc.retry_cnt), (10, 3));
        assert_eq!(p.opts.mode, Mode::RevokeTest);
        // Before `verify`, --timeout is the control channel's; after it, the QP's.
        assert_eq!((g.timeout, g.json), (Some(Duration::from_secs(3)), true));
        let a = ["verify", "--cooperating", "--size", "64K", "--depth", "4", "--addr", "h:1"];
        let (g, v) = inv(&a).unwrap();
        let p = parse(&v).unwrap();
        assert_eq!((p.opts.mode, p.opts.size, p.opts.depth), (Mode::Cooperating, 65536, 4));
        assert_eq!((g.addr.as_deref(), g.timeout, g.json), (Some("h:1"), None, false));
        // Defaults: the verifier's own.
        let p = parsed(&["verify"]).unwrap();
        let d = Options::default();
        assert_eq!((p.opts.iterations, p.opts.budget, p.opts.size), (d.iterations, d.budget, d.size));
        let none = config::Rdma::default();
        let cfg = p.cable.soft_config(&none, p.opts.rc);
        assert_eq!((p.opts.rc.timeout, cfg.peer), (RcConfig::default().timeout, "127.0.0.1:4791".parse().unwrap()));
        assert!(parsed(&["verify", "--revoke-test", "--cooperating"]).unwrap_err().contains("cannot be used with"));
        assert!(parsed(&["verify", "--order", "x"]).unwrap_err().contains("mkey-first"));
        let p = parsed(&["verify", "--order", "both", "--plot", "/tmp/r.svg"]).unwrap();
        assert_eq!((p.orders, p.opts.order), (vec![Order::MkeyFirst, Order::QpFirst], Order::MkeyFirst));
        assert_eq!(p.plot, Some(PathBuf::from("/tmp/r.svg")));
        let p = parsed(&["verify", "--order", "both", "--order=qp-first", "--depth", "2", "--depth", "3"]).unwrap();
        assert_eq!((p.orders, p.opts.depth), (vec![Order::QpFirst], 3));
        let p = parsed(&["verify", "--order=qp-first"]).unwrap();
        assert_eq!((p.orders, p.opts.order, p.plot), (vec![Order::QpFirst], Order::QpFirst, None));
        assert!(parsed(&["verify", "--plot", "--json"]).unwrap_err().contains("--plot <FILE.svg>"));
        assert!(parsed(&["verify", "--plot=-x"]).unwrap_err().contains("file name"));
        assert!(parsed(&["verify", "--timeout", "40"]).unwrap_err().contains("from 1 to 31"));
        assert!(parsed(&["verify", "--size", "17M"]).unwrap_err().contains("from 1 to 16777216 bytes"));
        assert!(parsed(&["verify", "--frob"]).unwrap_err().contains("unexpected argument '--frob'"));
        // --admin is a global flag: verify refuses it, and says where the admin key comes from.
        let none = |_: &str| None;
        let (g, v) = inv(&["verify", "--admin"]).unwrap();
        assert!(control(&parse(&v).unwrap(), &g, &none).unwrap_err().contains("admin_key"));
    }

    #[test]
    fn backends() {
        assert_eq!(parsed(&["verify"]).unwrap().backend, Backend::Soft);
        let p = parsed(&[
            "verify",
            "--backend",
            "verbs",
            "--device",
            "mlx5_0",
            "--gid-index",
            "3",
            "--mac",
            "02:00:00:00:00:09",
        ])
        .unwrap();
        assert_eq!(
            p.backend,
            Backend::Verbs { device: "mlx5_0".into(), gid_index: 3, port: 1, mac: Some([2, 0, 0, 0, 0, 9]) }
        );
        assert!(parsed(&["verify", "--backend", "verbs"]).unwrap_err().contains("--device"));
        assert!(parsed(&["verify", "--device", "mlx5_0"]).unwrap_err().contains("--backend verbs"));
        assert!(parsed(&["verify", "--backend", "dpdk"]).unwrap_err().contains("[possible values: soft, verbs]"));
        assert!(parsed(&["verify", "--mac", "02:00"]).is_err());
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
    fn the_cable_flags_over_the_file_over_the_defaults() {
        let rc = RcConfig::default();
        let cfg = |a: &[&str], file: &config::Rdma| parsed(a).map(|p| p.cable.soft_config(file, rc));
        let none = config::Rdma::default();
        // Defaults: today's point-to-point cable.
        let d = cfg(&["verify"], &none).unwrap();
        assert_eq!((d.peer, d.bind), ("127.0.0.1:4791".parse().unwrap(), "127.0.0.1:0".parse().unwrap()));
        assert_eq!((d.local_ip, d.local_mac), (None, crate::rdma::soft::DEFAULT_LOCAL_MAC));
        assert_eq!(d.resolve, Resolve::Endpoint);
        // The file's keys.
        let file = config::FileConfig::parse(
            "rdma_peer = 127.0.0.1:40001\nrdma_bind = 127.0.0.1:40002\nrdma_local_ip = 10.0.2.100\n\
             rdma_local_mac = 02:00:00:00:00:05\nrdma_resolve = arp\n",
        )
        .unwrap()
        .rdma()
        .unwrap();
        let f = cfg(&["verify"], &file).unwrap();
        assert_eq!((f.peer, f.bind), ("127.0.0.1:40001".parse().unwrap(), "127.0.0.1:40002".parse().unwrap()));
        assert_eq!((f.local_ip, f.local_mac), (Some(Ipv4Addr::new(10, 0, 2, 100)), [2, 0, 0, 0, 0, 5]));
        assert_eq!(f.resolve, Resolve::arp());
        assert_eq!(f.rc, rc);
        // Flags override them, one by one.
        let a = [
            "verify",
            "--udp",
            "127.0.0.1:5001",
            "--bind=127.0.0.1:5002",
            "--local-ip",
            "10.0.2.7",
            "--mac",
            "02:00:00:00:00:06",
            "--resolve",
            "endpoint",
        ];
        let o = cfg(&a, &file).unwrap();
        assert_eq!((o.peer, o.bind), ("127.0.0.1:5001".parse().unwrap(), "127.0.0.1:5002".parse().unwrap()));
        assert_eq!((o.local_ip, o.local_mac), (Some(Ipv4Addr::new(10, 0, 2, 7)), [2, 0, 0, 0, 0, 6]));
        assert_eq!(o.resolve, Resolve::Endpoint);
        let o = cfg(&["verify", "--remote-mac", "52:54:00:12:34:56"], &file).unwrap();
        assert_eq!(o.resolve, Resolve::Fixed([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        let fixed = config::Rdma { remote_mac: Some([2, 0, 0, 0, 0, 9]), ..config::Rdma::default() };
        assert_eq!(cfg(&["verify"], &fixed).unwrap().resolve, Resolve::Fixed([2, 0, 0, 0, 0, 9]));
        assert_eq!(cfg(&["verify", "--arp"], &fixed).unwrap().resolve, Resolve::arp());
        assert_eq!(cfg(&["verify", "--resolve=arp"], &none).unwrap().resolve, Resolve::arp());
        assert_eq!(
            cfg(&["verify", "--arp", "--arp-wait-ms", "3000"], &none).unwrap().resolve,
            Resolve::Arp { deadline: Duration::from_secs(3), tries: 3 }
        );
        // Contradictions and typos.
        assert!(
            parsed(&["verify", "--arp", "--remote-mac", "02:00:00:00:00:01"]).unwrap_err().contains("cannot be used")
        );
        assert!(parsed(&["verify", "--arp", "--resolve", "endpoint"]).unwrap_err().contains("cannot be used"));
        assert!(parsed(&["verify", "--remote-mac", "02:00:00:00:00:01", "--arp-wait-ms", "5"]).is_err());
        assert!(parsed(&["verify", "--resolve", "rarp"]).unwrap_err().contains("[possible values: arp, endpoint]"));
        assert!(parsed(&["verify", "--local-ip", "::1"]).is_err());
        assert!(parsed(&["verify", "--bind", "127.0.0.1"]).is_err());
        assert!(parsed(&["verify", "--remote-mac", "02:00"]).unwrap_err().contains("six hex bytes"));
        let e = parsed(&["verify", "--backend", "verbs", "--device", "d", "--arp"]).unwrap_err();
        assert!(e.contains("--arp is for --backend soft"), "{e}");
        let e = parsed(&["verify", "--backend", "verbs", "--device", "d", "--bind", "127.0.0.1:1"]).unwrap_err();
        assert!(e.contains("--bind is for --backend soft"), "{e}");
    }

    #[test]
    fn qp_first_needs_the_admin_key() {
        const TK: &str = "3a9107ee5c21b468f01d77c2098e43d5";
        const AK: &str = "c4e2a8f1b3d59706e81f2a3c4b5d6e7f";
        let none = |_: &str| None;
        let (g, v) = inv(&["verify", "--order", "qp-first", "--tenant", "t", "--key", TK]).unwrap();
        let e = control(&parse(&v).unwrap(), &g, &none).unwrap_err();
        assert!(e.contains("only the admin") && e.contains("admin key"), "{e}");
        let (g, v) = inv(&["verify", "--order", "both", "--tenant", "t", "--key", TK]).unwrap();
        assert!(control(&parse(&v).unwrap(), &g, &none).unwrap_err().contains("only the admin"));
        let a = ["verify", "--order=qp-first", "--tenant", "t", "--key", TK, "--admin-key", AK];
        let (g, v) = inv(&a).unwrap();
        let c = control(&parse(&v).unwrap(), &g, &none).unwrap();
        assert_eq!(c.admin.unwrap().key, crate::hex::decode(AK).unwrap());
        // The appliances' key rule holds for --admin-key too.
        let weak = [
            "verify",
            "--order=qp-first",
            "--tenant",
            "t",
            "--key",
            TK,
            "--admin-key",
            "0101010101010101010101010101010101",
        ];
        let (g, v) = inv(&weak).unwrap();
        let e = control(&parse(&v).unwrap(), &g, &none).err().unwrap();
        assert!(e.starts_with("--admin-key: the key is one byte repeated"), "{e}");
    }
}
