//! `leasectl`: settings from flags over the configuration file, one command, its output and exit code.

use crate::args::{self, Command, Global, Invocation, lease_str};
use crate::client::{Client, ClientError, Credentials, DEFAULT_PORT, Timeouts, exit};
use crate::config::{self, FileConfig};
use crate::{hex, render};
use leasebox_proto::{MAX_PAGE, Request, Response};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

pub const USAGE: &str = "\
usage: leasectl [--addr HOST:PORT] [--config PATH] [--tenant NAME --key HEX | --admin [--key HEX]]
                [--json] [--timeout SECS] <command> [options]

Talks to a Leasebox appliance over its control protocol (v1, TCP port 7470).

commands:
  ping                          HELLO, then one HEARTBEAT round trip: prints the RTT and the server's uptime
  stats                         sessions, frames, errors by code, per-core role loop counts; leases by
                                state, bytes, lifetime counts, ALLOC and REVOKE latency (p50, p99)
  health                        overall and HCA health
  alloc --size BYTES --qpn N --psn N --gid HEX32 [--access r,w,a] [--mtu 1024] [--ttl-ms N] [--mac aa:bb:..]
                                ask for a lease (size accepts K, M, G suffixes; access default r,w;
                                ttl 0 = the server's default)
  ready LEASE --client-qpn N --server-qpn N
                                confirm the client's QP reached RTS
  renew LEASE [--ttl-ms N]      extend a lease (ttl 0 = the server's default)
  free LEASE                    give a lease back
  query LEASE                   one lease's state
  list                          every lease this principal may see (all pages)
  revoke LEASE [--qp-first]     revoke a lease (another tenant's needs --admin); --qp-first uses the seed's
                                teardown order (QP first) instead of MKEY first
  fenced                        slots fenced for good (FENCED_SUMMARY)
  verify [--revoke-test | --cooperating] [--order mkey-first|qp-first|both] [--iterations N] [--budget-ms 2000]
         [--plot FILE.svg]
         [--size BYTES] [--depth N] [--warmup-ms 100] [--udp ADDR] [--timeout N] [--retry-cnt N]
         [--admin-key HEX] [--backend soft|verbs] [--device NAME] [--gid-index N] [--ib-port N] [--mac M]
                                revoke verifier over RDMA (software RoCEv2 requester on UDP, default
                                127.0.0.1:4791; or --backend verbs on a real RDMA device, in a leasectl built
                                with --features verbs): ALLOC, READY, a WRITE loop with READ checks, REVOKE; reports
                                recall latency (REVOKE sent -> outcome) and dataplane first-fail latency
                                (outcome -> first failed completion, with its ibv_wc_status); checks that
                                completed writes read back, nothing succeeds after the outcome and a new
                                lease reads as zeros. After `verify`, --timeout and --retry-cnt are the
                                requester QP's (default 14 and 7); qp-first sends REVOKE qp_first as the
                                admin (admin_key in the file, or --admin-key)
  help                          this text
LEASE is SLOT.GENERATION, e.g. 3.17. Numbers may be decimal or 0x hex.

options:
  --addr HOST:PORT   the appliance (default: the file's addr, else 127.0.0.1:7470)
  --config PATH      configuration file (default: $LEASECTL_CONFIG, else $XDG_CONFIG_HOME/leasebox/leasectl.conf,
                     else ~/.config/leasebox/leasectl.conf; `cargo xtask run` writes it)
  --tenant NAME      authenticate as this tenant (default: the file's tenant)
  --key HEX          the key to authenticate with (default: the file's key, or admin_key with --admin)
  --admin            authenticate as the principal `admin` with the admin key
  --json             print one JSON object (errors: {\"error\": {\"code\", \"detail\", \"message\"}})
  --timeout SECS     how long to keep trying to connect and authenticate, and to wait for each answer
                     (default 20 s to connect, 10 s per answer)

exit codes:
  0  ok
  1  the server answered with an error (NOT_IMPLEMENTED included)
  2  usage error (bad arguments, no credentials, unreadable configuration file)
  3  connection failed or timed out
  4  authentication failed (AUTH_FAILED, or the server's proof did not match the key)
  5  protocol violation by the server
  6  verify: a check failed (a figure over --budget-ms, a completed write missing, a success after the
     outcome, a fresh lease not zero, no failed completion)";

/// Where to connect and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub addr: String,
    pub who: Credentials,
    pub timeouts: Timeouts,
}

/// Combines flags, the configuration file and defaults. `env` looks up environment variables.
pub fn settings(g: &Global, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, String> {
    let (file, path) = match &g.config {
        Some(p) => (FileConfig::load(p)?, Some(p.clone())),
        None => match config::default_path(env) {
            Some(p) if p.exists() => (FileConfig::load(&p)?, Some(p)),
            other => (FileConfig::default(), other),
        },
    };
    let where_ = |p: &Option<PathBuf>| match p {
        Some(p) => format!("{} (which `cargo xtask run` writes)", p.display()),
        None => "a configuration file (set HOME or LEASECTL_CONFIG)".into(),
    };
    let mut addr = g.addr.clone().or(file.addr.clone()).unwrap_or_else(|| format!("127.0.0.1:{DEFAULT_PORT}"));
    if !addr.contains(':') {
        addr = format!("{addr}:{DEFAULT_PORT}");
    }
    let (name, key_hex) = if g.admin {
        let key = g.key.clone().or(file.admin_key.clone()).ok_or_else(|| {
            format!("--admin needs the admin key: pass --key HEX or put admin_key in {}", where_(&path))
        })?;
        ("admin".to_string(), key)
    } else {
        let name = g.tenant.clone().or(file.tenant.clone()).ok_or_else(|| {
            format!(
                "no principal: pass --tenant NAME --key HEX (or --admin), or put tenant and key in {}",
                where_(&path)
            )
        })?;
        // The file's key belongs to the file's tenant only.
        let file_key = file.key.clone().filter(|_| file.tenant.as_deref() == Some(name.as_str()));
        let key = g.key.clone().or(file_key).ok_or_else(|| format!("no key for tenant '{name}': pass --key HEX"))?;
        (name, key)
    };
    let key = hex::decode(&key_hex).map_err(|e| format!("key: {e}"))?;
    if key.is_empty() {
        return Err("key: empty".into());
    }
    let timeouts = g.timeout.map_or_else(Timeouts::default, Timeouts::all);
    Ok(Settings { addr, who: Credentials { name, key }, timeouts })
}

/// Runs `leasectl` with `args` (after the program name); returns the exit code.
pub fn run(args: &[String], env: &dyn Fn(&str) -> Option<String>, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let json = args.iter().any(|a| a == "--json");
    let usage = |out: &mut dyn Write, err: &mut dyn Write, m: &str| {
        if json {
            let _ = writeln!(out, "{}", render::usage_json(m));
        } else {
            let _ = writeln!(err, "leasectl: {m}\n(see leasectl --help)");
        }
        exit::USAGE
    };
    if let Some(at) = crate::verify::command::position(args) {
        return crate::verify::command::main(args, at, env, out, err);
    }
    let inv: Invocation = match args::parse(args) {
        Ok(i) => i,
        Err(m) => return usage(out, err, &m),
    };
    if inv.command == Command::Help {
        let _ = writeln!(out, "{USAGE}");
        return exit::OK;
    }
    let s = match settings(&inv.global, env) {
        Ok(s) => s,
        Err(m) => return usage(out, err, &m),
    };
    match execute(&inv.command, &s, inv.global.json) {
        Ok(text) => {
            let _ = write!(out, "{text}");
            exit::OK
        }
        Err(e) => {
            if inv.global.json {
                let _ = writeln!(out, "{}", render::error_json(&e));
            } else {
                let _ = write!(err, "{}", render::error_human(&e));
            }
            e.exit_code()
        }
    }
}

/// Every page of a paged request (LIST, FENCED_SUMMARY): `ask` builds the request for a cursor, `page` takes
/// the next cursor and the entries from its answer (or gives back an unexpected answer). A cursor that does
/// not move forward is a protocol error, so a confused server cannot loop the client.
fn every_page<E>(
    c: &mut Client,
    ask: impl Fn(u32, u16) -> Request,
    page: impl Fn(Response) -> Result<(u32, Vec<E>), Response>,
) -> Result<Vec<E>, ClientError> {
    let mut all = Vec::new();
    let mut cursor = 0;
    loop {
        let req = ask(cursor, MAX_PAGE as u16);
        let name = req.op().name();
        let (next_cursor, entries) =
            page(c.call(&req)?).map_err(|o| ClientError::Protocol(format!("{name} answered with {o:?}")))?;
        all.extend(entries);
        if next_cursor == 0 {
            return Ok(all);
        }
        if next_cursor <= cursor {
            return Err(ClientError::Protocol(format!("{name} cursor went from {cursor} to {next_cursor}")));
        }
        cursor = next_cursor;
    }
}

/// Connects, runs `command`, says BYE; returns the rendered output.
fn execute(command: &Command, s: &Settings, json: bool) -> Result<String, ClientError> {
    let t0 = Instant::now();
    let (mut c, welcome) = Client::connect_and_hello(&s.addr, &s.who, s.timeouts)?;
    let connect = t0.elapsed();
    let text = match command {
        Command::Help => unreachable!("handled before connecting"),
        Command::Ping => {
            let echo = u64::from(std::process::id()) << 32 | u64::from(c.next_request_id());
            let t1 = Instant::now();
            let r = c.call(&Request::Heartbeat { echo })?;
            let rtt = t1.elapsed();
            let Response::Heartbeat { echo: got, uptime_ms } = r else {
                return Err(ClientError::Protocol(format!("HEARTBEAT answered with {r:?}")));
            };
            if got != echo {
                return Err(ClientError::Protocol(format!("HEARTBEAT echo {got} for {echo}")));
            }
            let addr = c.peer_addr().to_string();
            let p = render::Ping { addr: &addr, principal: &s.who.name, welcome: &welcome, connect, rtt, uptime_ms };
            if json { format!("{}\n", render::ping_json(&p)) } else { render::ping_human(&p) }
        }
        Command::List | Command::Fenced => {
            let r = if *command == Command::List {
                let leases = every_page(
                    &mut c,
                    |cursor, max| Request::List { cursor, max },
                    |r| match r {
                        Response::List { next_cursor, leases } => Ok((next_cursor, leases)),
                        other => Err(other),
                    },
                )?;
                Response::List { next_cursor: 0, leases }
            } else {
                let slots = every_page(
                    &mut c,
                    |cursor, max| Request::FencedSummary { cursor, max },
                    |r| match r {
                        Response::FencedSummary { next_cursor, slots } => Ok((next_cursor, slots)),
                        other => Err(other),
                    },
                )?;
                Response::FencedSummary { next_cursor: 0, slots }
            };
            if json { format!("{}\n", render::response_json(&r, None)) } else { render::response_human(&r, None) }
        }
        Command::Call(req) => {
            let r = c.call(req)?;
            let lease = match req {
                Request::Ready { lease, .. }
                | Request::Renew { lease, .. }
                | Request::Free { lease }
                | Request::Query { lease }
                | Request::Revoke { lease, .. } => Some(lease_str(*lease)),
                _ => None,
            };
            if json { format!("{}\n", render::response_json(&r, lease)) } else { render::response_human(&r, lease) }
        }
    };
    // The answer is in hand: a failed BYE does not make the command fail.
    let _ = c.bye();
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn g(args: &[&str]) -> Global {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push("ping".into());
        args::parse(&a).unwrap().global
    }

    /// A configuration file in a fresh directory, and an environment pointing at it through HOME.
    fn home_with(conf: Option<&str>) -> (PathBuf, impl Fn(&str) -> Option<String>) {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let home = std::env::temp_dir().join(format!(
            "leasectl-home-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let path = home.join(".config/leasebox/leasectl.conf");
        if let Some(text) = conf {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        }
        let h = home.to_string_lossy().into_owned();
        (home, move |k: &str| (k == "HOME").then(|| h.clone()))
    }

    const FILE: &str = "addr = 127.0.0.1:7471\ntenant = demo\nkey = 0011\nadmin_key = aabb\n";

    #[test]
    fn file_supplies_everything() {
        let (home, env) = home_with(Some(FILE));
        let s = settings(&g(&[]), &env).unwrap();
        assert_eq!(s.addr, "127.0.0.1:7471");
        assert_eq!(s.who, Credentials { name: "demo".into(), key: vec![0x00, 0x11] });
        assert_eq!(s.timeouts, Timeouts::default());
        let s = settings(&g(&["--admin"]), &env).unwrap();
        assert_eq!(s.who, Credentials { name: "admin".into(), key: vec![0xaa, 0xbb] });
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn flags_override_the_file() {
        let (home, env) = home_with(Some(FILE));
        let s = settings(&g(&["--addr", "10.1.1.1", "--key", "ff", "--timeout", "3"]), &env).unwrap();
        assert_eq!(s.addr, "10.1.1.1:7470");
        assert_eq!(s.who, Credentials { name: "demo".into(), key: vec![0xff] });
        assert_eq!(s.timeouts.retry_for, Duration::from_secs(3));
        assert_eq!(s.timeouts.receive, Duration::from_secs(3));
        let s = settings(&g(&["--admin", "--key", "01"]), &env).unwrap();
        assert_eq!(s.who, Credentials { name: "admin".into(), key: vec![1] });
        // Another tenant does not inherit the file's tenant key.
        assert!(settings(&g(&["--tenant", "other"]), &env).unwrap_err().contains("no key for tenant 'other'"));
        let s = settings(&g(&["--tenant", "other", "--key", "02"]), &env).unwrap();
        assert_eq!(s.who.name, "other");
        assert!(settings(&g(&["--key", "0g"]), &env).unwrap_err().contains("not hex"));
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn missing_file_and_credentials() {
        let (_home, env) = home_with(None);
        let e = settings(&g(&[]), &env).unwrap_err();
        assert!(e.contains("no principal") && e.contains("leasectl.conf"), "{e}");
        assert!(settings(&g(&["--admin"]), &env).unwrap_err().contains("admin key"));
        let s = settings(&g(&["--tenant", "t", "--key", "00"]), &env).unwrap();
        assert_eq!(s.addr, "127.0.0.1:7470");
        assert!(settings(&g(&["--config", "/nonexistent/leasectl.conf"]), &env).unwrap_err().contains("/nonexistent"));
    }

    #[test]
    fn leasectl_config_env_and_config_flag() {
        let (home, _) = home_with(Some(FILE));
        let path = home.join(".config/leasebox/leasectl.conf").to_string_lossy().into_owned();
        let p2 = path.clone();
        let env = move |k: &str| (k == config::ENV_CONFIG).then(|| p2.clone());
        assert_eq!(settings(&g(&[]), &env).unwrap().addr, "127.0.0.1:7471");
        let none = |_: &str| None;
        assert_eq!(settings(&g(&["--config", &path]), &none).unwrap().who.name, "demo");
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn run_reports_usage_errors_with_code_2() {
        let none = |_: &str| None;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["frob".into()], &none, &mut out, &mut err), exit::USAGE);
        assert!(String::from_utf8_lossy(&err).contains("unknown command"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["--json".into(), "ping".into()], &none, &mut out, &mut err), exit::USAGE);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], "USAGE");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["--help".into()], &none, &mut out, &mut err), exit::OK);
        assert!(String::from_utf8_lossy(&out).contains("exit codes"));
    }
}
