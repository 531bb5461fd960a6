//! `leasectl`'s command line, parsed by hand: global flags may come before or after the command; every
//! mistake is a clear message (exit code 2), never a panic.

use leasebox_proto::{AllocReq, LeaseId, MAX_NAME, Request, access};
use std::path::PathBuf;
use std::time::Duration;

/// Flags that apply to every command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Global {
    pub addr: Option<String>,
    pub config: Option<PathBuf>,
    pub tenant: Option<String>,
    /// Hex key (the tenant's, or the admin's with `--admin`).
    pub key: Option<String>,
    pub admin: bool,
    pub json: bool,
    pub timeout: Option<Duration>,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Help,
    /// HELLO + one HEARTBEAT round trip.
    Ping,
    /// LIST, every page.
    List,
    /// FENCED_SUMMARY, every page.
    Fenced,
    /// One request, one answer.
    Call(Request),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub global: Global,
    pub command: Command,
}

/// A command, the flags it takes (name, whether it takes a value) and whether it needs a LEASE argument.
struct Spec {
    name: &'static str,
    flags: &'static [(&'static str, bool)],
    lease: bool,
}

const fn spec(name: &'static str, flags: &'static [(&'static str, bool)], lease: bool) -> Spec {
    Spec { name, flags, lease }
}

const COMMANDS: &[Spec] = &[
    spec("ping", &[], false),
    spec("stats", &[], false),
    spec("health", &[], false),
    spec("fenced", &[], false),
    spec("list", &[], false),
    spec(
        "alloc",
        &[
            ("--size", true),
            ("--access", true),
            ("--mtu", true),
            ("--ttl-ms", true),
            ("--qpn", true),
            ("--psn", true),
            ("--gid", true),
            ("--mac", true),
        ],
        false,
    ),
    spec("ready", &[("--client-qpn", true), ("--server-qpn", true)], true),
    spec("renew", &[("--ttl-ms", true)], true),
    spec("free", &[], true),
    spec("query", &[], true),
    spec("revoke", &[("--qp-first", false)], true),
];

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, String> {
    let mut g = Global::default();
    let mut command: Option<&'static Spec> = None;
    let mut positional: Vec<String> = Vec::new();
    let mut flags: Vec<(&'static str, Option<String>)> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |inline: Option<String>| -> Result<String, String> {
            match inline {
                Some(v) => Ok(v),
                None => it.next().cloned().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        let no_value = |inline: &Option<String>| match inline {
            Some(_) => Err(format!("{flag} takes no value")),
            None => Ok(()),
        };
        match flag {
            "-h" | "--help" => return Ok(Invocation { global: g, command: Command::Help }),
            "--addr" => g.addr = Some(value(inline)?),
            "--config" => g.config = Some(PathBuf::from(value(inline)?)),
            "--tenant" => g.tenant = Some(value(inline)?),
            "--key" => g.key = Some(value(inline)?),
            "--admin" => {
                no_value(&inline)?;
                g.admin = true;
            }
            "--json" => {
                no_value(&inline)?;
                g.json = true;
            }
            "--timeout" => {
                let v = value(inline)?;
                let secs: f64 = v.parse().map_err(|_| format!("--timeout needs seconds, got '{v}'"))?;
                if !(0.1..=3600.0).contains(&secs) {
                    return Err(format!("--timeout must be between 0.1 and 3600 seconds, got '{v}'"));
                }
                g.timeout = Some(Duration::from_secs_f64(secs));
            }
            f if f.starts_with('-') && f.len() > 1 => {
                let Some(cmd) = command else {
                    return Err(format!("unknown option '{f}' (options of a command come after it)"));
                };
                let Some((name, takes)) = cmd.flags.iter().find(|(n, _)| *n == f) else {
                    return Err(format!("unknown option '{f}' for '{}'", cmd.name));
                };
                let v = if *takes {
                    Some(value(inline)?)
                } else {
                    no_value(&inline)?;
                    None
                };
                if flags.iter().any(|(n, _)| n == name) {
                    return Err(format!("{f} given twice"));
                }
                flags.push((name, v));
            }
            word if command.is_none() => {
                if word == "help" {
                    return Ok(Invocation { global: g, command: Command::Help });
                }
                command = Some(
                    COMMANDS
                        .iter()
                        .find(|c| c.name == word)
                        .ok_or_else(|| format!("unknown command '{word}' (see leasectl --help)"))?,
                );
            }
            word => positional.push(word.to_string()),
        }
    }
    let Some(&Spec { name, lease: needs_lease, .. }) = command else {
        return Err("no command given (see leasectl --help)".into());
    };
    if g.admin && g.tenant.is_some() {
        return Err("--admin and --tenant exclude each other".into());
    }
    if let Some(t) = &g.tenant
        && (t.is_empty() || t.len() > MAX_NAME)
    {
        return Err(format!("--tenant: names are 1 to {MAX_NAME} bytes, got '{t}'"));
    }
    let lease = match (needs_lease, positional.as_slice()) {
        (true, [l]) => Some(parse_lease(l)?),
        (true, []) => return Err(format!("'{name}' needs a LEASE (SLOT.GENERATION, e.g. 3.17)")),
        (false, []) => None,
        (_, extra) => return Err(format!("unexpected argument '{}' for '{name}'", extra[extra.len() - 1])),
    };
    let f = Flags(flags);
    let command = match name {
        "ping" => Command::Ping,
        "list" => Command::List,
        "stats" => Command::Call(Request::Stats),
        "health" => Command::Call(Request::Health),
        "fenced" => Command::Fenced,
        "alloc" => Command::Call(Request::Alloc(AllocReq {
            size: parse_size(f.required("--size")?)?,
            access: f.get("--access").map_or(Ok(access::REMOTE_READ | access::REMOTE_WRITE), parse_access)?,
            mtu: f.get("--mtu").map_or(Ok(3), parse_mtu)?,
            ttl_ms: f.get("--ttl-ms").map_or(Ok(0), |v| number("--ttl-ms", v, u32::MAX as u64))? as u32,
            client_qpn: number("--qpn", f.required("--qpn")?, 0xFF_FFFF)? as u32,
            client_psn: number("--psn", f.required("--psn")?, 0xFF_FFFF)? as u32,
            client_gid: parse_gid(f.required("--gid")?)?,
            client_mac: f.get("--mac").map_or(Ok([0; 6]), parse_mac)?,
        })),
        "ready" => Command::Call(Request::Ready {
            lease: lease.expect("checked above"),
            client_qpn: number("--client-qpn", f.required("--client-qpn")?, 0xFF_FFFF)? as u32,
            server_qpn: number("--server-qpn", f.required("--server-qpn")?, 0xFF_FFFF)? as u32,
        }),
        "renew" => Command::Call(Request::Renew {
            lease: lease.expect("checked above"),
            ttl_ms: f.get("--ttl-ms").map_or(Ok(0), |v| number("--ttl-ms", v, u32::MAX as u64))? as u32,
        }),
        "free" => Command::Call(Request::Free { lease: lease.expect("checked above") }),
        "query" => Command::Call(Request::Query { lease: lease.expect("checked above") }),
        "revoke" => {
            Command::Call(Request::Revoke { lease: lease.expect("checked above"), qp_first: f.has("--qp-first") })
        }
        _ => unreachable!("every entry of COMMANDS is handled"),
    };
    Ok(Invocation { global: g, command })
}

struct Flags(Vec<(&'static str, Option<String>)>);

impl Flags {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| *n == name).and_then(|(_, v)| v.as_deref())
    }
    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _)| *n == name)
    }
    fn required(&self, name: &str) -> Result<&str, String> {
        self.get(name).ok_or_else(|| format!("{name} is required"))
    }
}

/// A lease written `SLOT.GENERATION` (decimal), e.g. `3.17`.
pub fn parse_lease(s: &str) -> Result<LeaseId, String> {
    let bad = || format!("lease '{s}' is not SLOT.GENERATION (e.g. 3.17)");
    let (a, b) = s.split_once('.').ok_or_else(bad)?;
    let num = |x: &str| {
        if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        x.parse::<u32>().map_err(|_| bad())
    };
    Ok(LeaseId { slot: num(a)?, generation: num(b)? })
}

/// How a lease is written on the command line and in output.
pub fn lease_str(l: LeaseId) -> String {
    format!("{}.{}", l.slot, l.generation)
}

/// A decimal or `0x` hex number no larger than `max`.
fn number(flag: &str, v: &str, max: u64) -> Result<u64, String> {
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse::<u64>(),
    };
    match n {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("{flag} needs a number from 0 to {max} (decimal or 0x hex), got '{v}'")),
    }
}

/// Bytes, with an optional binary suffix: `4096`, `64K`, `2M`, `1G` (also `KiB`, `MiB`, `GiB`, `TiB`).
fn parse_size(v: &str) -> Result<u64, String> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let shift = match unit {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return Err(format!("--size: unknown unit in '{v}' (use bytes, K, M, G or T)")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("--size needs a positive byte count (e.g. 4096, 2M), got '{v}'"))
}

/// `r,w,a` (any subset, any order; `read`, `write`, `atomic` also accepted; `rwa` without commas too).
fn parse_access(v: &str) -> Result<u8, String> {
    let words: Vec<&str> = if v.contains(',') || ["read", "write", "atomic"].contains(&v) {
        v.split(',').map(str::trim).collect()
    } else {
        // `rwa`: one letter per flag.
        v.char_indices().map(|(i, c)| &v[i..i + c.len_utf8()]).collect()
    };
    let mut a = 0;
    for w in words {
        a |= match w {
            "r" | "read" => access::REMOTE_READ,
            "w" | "write" => access::REMOTE_WRITE,
            "a" | "atomic" => access::REMOTE_ATOMIC,
            _ => return Err(format!("--access: '{w}' is not r, w or a")),
        };
    }
    if a == 0 {
        return Err("--access needs at least one of r, w, a".into());
    }
    Ok(a)
}

/// The path MTU in bytes (256, 512, 1024, 2048, 4096) → the IB encoding (1..=5).
fn parse_mtu(v: &str) -> Result<u8, String> {
    (1u8..=5)
        .find(|c| leasebox_proto::mtu_bytes(*c).is_some_and(|b| b.to_string() == v))
        .ok_or_else(|| format!("--mtu must be 256, 512, 1024, 2048 or 4096, got '{v}'"))
}

/// 16 bytes as 32 hex digits (colons allowed between groups, as in `fe80:0000:...`).
fn parse_gid(v: &str) -> Result<[u8; 16], String> {
    let digits: String = v.chars().filter(|c| *c != ':').collect();
    let b = crate::hex::decode(&digits).map_err(|e| format!("--gid: {e}"))?;
    b.try_into().map_err(|_| format!("--gid needs 32 hex digits (16 bytes), got '{v}'"))
}

/// `aa:bb:cc:dd:ee:ff`.
fn parse_mac(v: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = v.split(':').collect();
    let bad = || format!("--mac needs six hex bytes like 02:00:00:00:00:01, got '{v}'");
    if parts.len() != 6 || parts.iter().any(|p| p.len() != 2) {
        return Err(bad());
    }
    let mut m = [0u8; 6];
    for (o, p) in m.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Invocation, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }
    fn cmd(args: &[&str]) -> Command {
        p(args).unwrap().command
    }
    fn err(args: &[&str]) -> String {
        p(args).unwrap_err()
    }

    #[test]
    fn global_flags_before_and_after_the_command() {
        let i = p(&["--addr", "10.0.0.2:7470", "--json", "ping", "--timeout=2.5", "--tenant", "t1", "--key", "00"])
            .unwrap();
        assert_eq!(i.command, Command::Ping);
        assert_eq!(i.global.addr.as_deref(), Some("10.0.0.2:7470"));
        assert!(i.global.json && !i.global.admin);
        assert_eq!(i.global.timeout, Some(Duration::from_millis(2500)));
        assert_eq!((i.global.tenant.as_deref(), i.global.key.as_deref()), (Some("t1"), Some("00")));
        let i = p(&["--config", "/tmp/x.conf", "--admin", "stats"]).unwrap();
        assert!(i.global.admin);
        assert_eq!(i.global.config, Some(PathBuf::from("/tmp/x.conf")));
        assert_eq!(i.command, Command::Call(Request::Stats));
    }

    #[test]
    fn help_and_usage_errors() {
        assert_eq!(cmd(&["--help"]), Command::Help);
        assert_eq!(cmd(&["help"]), Command::Help);
        assert_eq!(cmd(&["ping", "-h"]), Command::Help);
        assert!(err(&[]).contains("no command"));
        assert!(err(&["frob"]).contains("unknown command 'frob'"));
        assert!(err(&["--frob", "ping"]).contains("unknown option '--frob'"));
        assert!(err(&["ping", "--size", "4"]).contains("unknown option '--size' for 'ping'"));
        assert!(err(&["ping", "extra"]).contains("unexpected argument 'extra'"));
        assert!(err(&["--addr"]).contains("--addr needs a value"));
        assert!(err(&["--json=yes", "ping"]).contains("takes no value"));
        assert!(err(&["--timeout", "0", "ping"]).contains("--timeout"));
        assert!(err(&["--timeout", "soon", "ping"]).contains("--timeout"));
        assert!(err(&["--admin", "--tenant", "x", "ping"]).contains("exclude"));
        assert!(err(&["--tenant", &"x".repeat(33), "ping"]).contains("1 to 32"));
        assert!(err(&["revoke", "1.2", "--qp-first", "--qp-first"]).contains("twice"));
    }

    #[test]
    fn lease_commands() {
        let l = LeaseId { slot: 3, generation: 17 };
        assert_eq!(cmd(&["free", "3.17"]), Command::Call(Request::Free { lease: l }));
        assert_eq!(cmd(&["query", "3.17"]), Command::Call(Request::Query { lease: l }));
        assert_eq!(cmd(&["revoke", "3.17"]), Command::Call(Request::Revoke { lease: l, qp_first: false }));
        assert_eq!(cmd(&["revoke", "--qp-first", "3.17"]), Command::Call(Request::Revoke { lease: l, qp_first: true }));
        assert_eq!(cmd(&["renew", "3.17"]), Command::Call(Request::Renew { lease: l, ttl_ms: 0 }));
        assert_eq!(cmd(&["renew", "3.17", "--ttl-ms=5000"]), Command::Call(Request::Renew { lease: l, ttl_ms: 5000 }));
        assert_eq!(
            cmd(&["ready", "3.17", "--client-qpn", "0x11", "--server-qpn", "72"]),
            Command::Call(Request::Ready { lease: l, client_qpn: 0x11, server_qpn: 72 })
        );
        assert!(err(&["ready", "3.17", "--client-qpn", "1"]).contains("--server-qpn is required"));
        assert!(err(&["ready", "3.17", "--client-qpn", "0x1000000", "--server-qpn", "1"]).contains("0 to 16777215"));
        assert!(err(&["free"]).contains("needs a LEASE"));
        assert!(err(&["free", "3"]).contains("SLOT.GENERATION"));
        assert_eq!(cmd(&["list"]), Command::List);
        assert_eq!(cmd(&["fenced"]), Command::Fenced);
        assert_eq!(cmd(&["health"]), Command::Call(Request::Health));
    }

    #[test]
    fn alloc_fields_and_defaults() {
        let gid = "fe800000000000000000000000000001";
        let Command::Call(Request::Alloc(a)) =
            cmd(&["alloc", "--size", "2M", "--qpn", "0x11", "--psn", "5", "--gid", gid])
        else {
            panic!()
        };
        assert_eq!(a.size, 2 << 20);
        assert_eq!(a.access, access::REMOTE_READ | access::REMOTE_WRITE);
        assert_eq!((a.mtu, a.ttl_ms, a.client_qpn, a.client_psn), (3, 0, 0x11, 5));
        assert_eq!(a.client_gid[0], 0xfe);
        assert_eq!(a.client_gid[15], 1);
        assert_eq!(a.client_mac, [0; 6]);
        let Command::Call(Request::Alloc(a)) = cmd(&[
            "alloc",
            "--size=4096",
            "--access",
            "r,w,a",
            "--mtu",
            "4096",
            "--ttl-ms",
            "30000",
            "--qpn",
            "1",
            "--psn",
            "2",
            "--gid",
            "fe80:0000:0000:0000:0000:0000:0000:0001",
            "--mac",
            "02:00:00:aa:bb:cc",
        ]) else {
            panic!()
        };
        assert_eq!((a.size, a.access, a.mtu, a.ttl_ms), (4096, access::ALL, 5, 30_000));
        assert_eq!(a.client_gid[15], 1);
        assert_eq!(a.client_mac, [2, 0, 0, 0xaa, 0xbb, 0xcc]);
        let base = ["alloc", "--qpn", "1", "--psn", "2", "--gid", gid];
        let with = |extra: &[&str]| err(&[&base[..], extra].concat());
        assert!(with(&[]).contains("--size is required"));
        assert!(with(&["--size", "0"]).contains("positive"));
        assert!(with(&["--size", "3X"]).contains("unit"));
        assert!(with(&["--size", "99999999999T"]).contains("--size"));
        assert!(with(&["--size", "1", "--access", "x"]).contains("--access"));
        assert!(with(&["--size", "1", "--mtu", "1500"]).contains("--mtu"));
        assert!(with(&["--size", "1", "--mac", "02:00"]).contains("--mac"));
        assert!(err(&["alloc", "--size", "1", "--qpn", "1", "--psn", "2", "--gid", "fe80"]).contains("32 hex digits"));
    }

    #[test]
    fn access_spellings() {
        assert_eq!(parse_access("r"), Ok(access::REMOTE_READ));
        assert_eq!(parse_access("rwa"), Ok(access::ALL));
        assert_eq!(parse_access("w,r"), Ok(access::REMOTE_READ | access::REMOTE_WRITE));
        assert_eq!(parse_access("read,atomic"), Ok(access::REMOTE_READ | access::REMOTE_ATOMIC));
        assert_eq!(parse_access("write"), Ok(access::REMOTE_WRITE));
        assert!(parse_access("").is_err());
    }

    #[test]
    fn lease_ids() {
        assert_eq!(parse_lease("3.17"), Ok(LeaseId { slot: 3, generation: 17 }));
        assert_eq!(parse_lease("0.0"), Ok(LeaseId { slot: 0, generation: 0 }));
        assert_eq!(parse_lease("4294967295.4294967295"), Ok(LeaseId { slot: u32::MAX, generation: u32::MAX }));
        for bad in ["", "3", "3.", ".17", "3.17.1", "a.b", "-1.2", "+1.2", "3 .17", "4294967296.0", "0x3.1"] {
            assert!(parse_lease(bad).is_err(), "{bad}");
        }
        assert_eq!(lease_str(LeaseId { slot: 3, generation: 17 }), "3.17");
    }
}
