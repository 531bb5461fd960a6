//! `leasectl`: settings from flags over the configuration file, one command, its output and exit code.

use crate::args::{self, Command, Invocation, lease_str, with_boot};
use crate::client::{Client, ClientError, exit};
use crate::config::{Settings, settings};
use crate::render;
use clap::error::ErrorKind;
use leasebox_proto::{LeaseInfo, LeaseState, MAX_PAGE, Request, Response};
use std::io::Write;
use std::time::{Duration, Instant};

/// How often `drain` lists the leases while it waits for them to go.
const DRAIN_POLL: Duration = Duration::from_millis(200);

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
    let inv: Invocation = match args::parse(args) {
        Ok(i) => i,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = write!(out, "{}", e.render());
            return exit::OK;
        }
        // clap's own layout for people (message, usage line, pointer to --help); its message alone in JSON.
        Err(e) if json => return usage(out, err, &clap_message(&e)),
        Err(e) => {
            let _ = write!(err, "{}", e.render());
            return exit::USAGE;
        }
    };
    match &inv.command {
        Command::Verify(v) => return crate::verify::command::main(v, &inv.global, env, out, err),
        Command::BenchData(b) => return crate::bench_data::main(b, &inv.global, env, out, err),
        Command::Completions(shell) => {
            args::completions(*shell, out);
            return exit::OK;
        }
        Command::FleetList { etcd, tls, user } => {
            let user = user.as_ref().map(|(name, file)| (name.clone(), file.as_path()));
            return crate::fleet::list(etcd, tls.as_ref(), user, inv.global.json, out, err);
        }
        _ => {}
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

/// A clap error's message: the first line of its text, without the `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
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

/// Every lease the principal sees (LIST, all pages).
fn list_all(c: &mut Client) -> Result<Vec<LeaseInfo>, ClientError> {
    every_page(
        c,
        |cursor, max| Request::List { cursor, max },
        |r| match r {
            Response::List { next_cursor, leases } => Ok((next_cursor, leases)),
            other => Err(other),
        },
    )
}

/// DRAIN, then LIST (as the admin) until no lease of the drained tenant (every tenant's for `None`) is left
/// unrevoked (Granted, Active or still Fencing), for at most the notice time plus the answer timeout.
fn drain(c: &mut Client, tenant: Option<&str>, notice_ms: u32, json: bool) -> Result<String, ClientError> {
    let t0 = Instant::now();
    let req = Request::Drain { tenant: tenant.unwrap_or_default().to_string(), notice_ms };
    let (leases, deadline_ms) = match c.call(&req)? {
        Response::Drain { leases, deadline_ms } => (leases, deadline_ms),
        other => return Err(ClientError::Protocol(format!("DRAIN answered with {other:?}"))),
    };
    let give_up = Duration::from_millis(u64::from(notice_ms)) + c.timeouts().receive;
    let live = |l: &LeaseInfo| {
        tenant.is_none_or(|t| l.tenant == t)
            && matches!(l.state, LeaseState::Granted | LeaseState::Active | LeaseState::Fencing)
    };
    loop {
        let left = list_all(c)?.iter().filter(|l| live(l)).count();
        let waited = t0.elapsed();
        if left == 0 {
            let d = render::Drain { tenant, notice_ms, leases, deadline_ms, waited };
            return Ok(if json { format!("{}\n", render::drain_json(&d)) } else { render::drain_human(&d) });
        }
        if waited >= give_up {
            return Err(ClientError::Timeout { what: "revocation of the drained leases", after: waited });
        }
        std::thread::sleep(DRAIN_POLL);
    }
}

/// Connects, runs `command`, says BYE; returns the rendered output.
fn execute(command: &Command, s: &Settings, json: bool) -> Result<String, ClientError> {
    let t0 = Instant::now();
    let (mut c, welcome) = Client::connect_and_hello(&s.addr, &s.who, s.timeouts)?;
    let connect = t0.elapsed();
    let text = match command {
        Command::Verify(_) | Command::BenchData(_) | Command::Completions(_) | Command::FleetList { .. } => {
            unreachable!("run before connecting")
        }
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
                Response::List { next_cursor: 0, leases: list_all(&mut c)? }
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
        Command::Drain { tenant, notice_ms } => drain(&mut c, tenant.as_deref(), *notice_ms, json)?,
        Command::Call(req) => {
            let r = match req {
                // Every part this leasectl knows, or what an older appliance has.
                Request::StatsWith { .. } => Response::Stats(Box::new(c.stats()?)),
                _ => c.call(&with_boot(req, welcome.boot_id))?,
            };
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
    use crate::args::Global;
    use crate::client::{Credentials, Timeouts};
    use crate::config;
    use std::path::PathBuf;
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

    // Random keys (the appliances' key rule, which leasectl applies too, refuses typed ones).
    const TK: &str = "3a9107ee5c21b468f01d77c2098e43d5";
    const AK: &str = "c4e2a8f1b3d59706e81f2a3c4b5d6e7f";
    const K3: &str = "5f0e1d2c3b4a69788796a5b4c3d2e1f0";
    const K4: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1ff";
    const K5: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    const FILE: &str = "addr = 127.0.0.1:7471\ntenant = demo\nkey = 3a9107ee5c21b468f01d77c2098e43d5\nadmin_key = c4e2a8f1b3d59706e81f2a3c4b5d6e7f\n";
    fn key(hex: &str) -> Vec<u8> {
        crate::hex::decode(hex).unwrap()
    }

    #[test]
    fn file_supplies_everything() {
        let (home, env) = home_with(Some(FILE));
        let s = settings(&g(&[]), &env).unwrap();
        assert_eq!(s.addr, "127.0.0.1:7471");
        assert_eq!(s.who, Credentials { name: "demo".into(), key: key(TK) });
        assert_eq!(s.timeouts, Timeouts::default());
        let s = settings(&g(&["--admin"]), &env).unwrap();
        assert_eq!(s.who, Credentials { name: "admin".into(), key: key(AK) });
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn flags_override_the_file() {
        let (home, env) = home_with(Some(FILE));
        let s = settings(&g(&["--addr", "10.1.1.1", "--key", K3, "--timeout", "3"]), &env).unwrap();
        assert_eq!(s.addr, "10.1.1.1:7470");
        assert_eq!(s.who, Credentials { name: "demo".into(), key: key(K3) });
        assert_eq!(s.timeouts.retry_for, Duration::from_secs(3));
        assert_eq!(s.timeouts.receive, Duration::from_secs(3));
        let s = settings(&g(&["--admin", "--key", K4]), &env).unwrap();
        assert_eq!(s.who, Credentials { name: "admin".into(), key: key(K4) });
        // Another tenant does not inherit the file's tenant key.
        assert!(settings(&g(&["--tenant", "other"]), &env).unwrap_err().contains("no key for tenant 'other'"));
        let s = settings(&g(&["--tenant", "other", "--key", K5]), &env).unwrap();
        assert_eq!(s.who.name, "other");
        assert!(settings(&g(&["--key", "0g"]), &env).unwrap_err().contains("not hex"));
        // The appliances' key rule, with the same words: a short key, a typed one.
        assert_eq!(settings(&g(&["--key", "ff"]), &env).unwrap_err(), "key: key is 1 bytes; keys are 16 to 64 bytes");
        let weak = settings(&g(&["--key", &"ab".repeat(16)]), &env).unwrap_err();
        assert!(weak.starts_with("key: the key is one byte repeated: keys must be random"), "{weak}");
        let pattern = settings(&g(&["--admin", "--key", &"0102".repeat(8)]), &env).unwrap_err();
        assert!(pattern.contains("a short pattern repeated"), "{pattern}");
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn missing_file_and_credentials() {
        let (_home, env) = home_with(None);
        let e = settings(&g(&[]), &env).unwrap_err();
        assert!(e.contains("no principal") && e.contains("leasectl.conf"), "{e}");
        assert!(settings(&g(&["--admin"]), &env).unwrap_err().contains("admin key"));
        let s = settings(&g(&["--tenant", "t", "--key", K5]), &env).unwrap();
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
        assert!(String::from_utf8_lossy(&err).contains("unrecognized subcommand 'frob'"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["--json".into(), "ping".into()], &none, &mut out, &mut err), exit::USAGE);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["code"], "USAGE");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["--help".into()], &none, &mut out, &mut err), exit::OK);
        assert!(String::from_utf8_lossy(&out).contains("Exit codes"));
    }
}
