//! `leasectl`'s command line, declared with clap: global flags may come before or after the command
//! (`--timeout` only before `verify`, whose own `--timeout` is the requester QP's); every mistake is a clear
//! message (exit code 2), never a panic. `--help`, `--version` and `completions SHELL` come with it.

use clap::{Args, Parser, Subcommand};
use clap_complete::Shell;
use leasebox_proto::{AllocReq, LeaseId, MAX_NAME, Request, STATS_WANT_GUARDS, access};
use std::path::PathBuf;
use std::time::Duration;

use crate::bench_data::BenchDataArgs;
use crate::verify::command::VerifyArgs;

/// Flags that apply to every command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Global {
    pub addr: Option<String>,
    pub config: Option<PathBuf>,
    pub tenant: Option<String>,
    /// Hex key (the tenant's, or the admin's with `--admin`).
    pub key: Option<String>,
    pub admin: bool,
    /// `--appliance NAME`: the appliance's name (its `appliance=`), bound into the handshake.
    pub appliance: Option<String>,
    pub json: bool,
    pub timeout: Option<Duration>,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// HELLO + one HEARTBEAT round trip.
    Ping,
    /// LIST, every page.
    List,
    /// FENCED_SUMMARY, every page.
    Fenced,
    /// One request, one answer. A lease id given without a boot (`SLOT.GENERATION`) gets the boot id the
    /// appliance announces in the handshake.
    Call(Request),
    /// DRAIN as the admin (the tenant drained, `None`: every tenant), then LIST until the leases are revoked.
    Drain { tenant: Option<String>, notice_ms: u32 },
    /// The revoke verifier.
    Verify(Box<VerifyArgs>),
    /// The data path's figures (copying vs zero copy, sizes × depths) on one lease.
    BenchData(Box<BenchDataArgs>),
    /// A completion script for `shell` on stdout.
    Completions(Shell),
    /// `fleet list`: the appliances etcd advertises (docs/fleet.md).
    FleetList {
        etcd: Vec<String>,
        tls: Option<leasebox_client::TlsFiles>,
        /// `--etcd-user` and `--etcd-password-file` (the file is read when the command runs).
        user: Option<(String, std::path::PathBuf)>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub global: Global,
    pub command: Command,
}

/// What `leasectl --help` ends with.
const AFTER_HELP: &str = "\
LEASE is SLOT.GENERATION, e.g. 3.17 (a lease of the appliance's current boot), or SLOT.GENERATION@BOOT with the
boot id in 32 hex digits. Numbers may be decimal or 0x hex; sizes take a unit (64K, 2M, 1GiB).

Exit codes:
  0  ok
  1  the server answered with an error (NOT_IMPLEMENTED included)
  2  usage error (bad arguments, no credentials, unreadable configuration file)
  3  connection failed or timed out
  4  authentication failed (AUTH_FAILED, or the server's proof did not match the key)
  5  protocol violation by the server
  6  verify: a check failed (a figure over --budget-ms, a completed write missing, a success after the
     outcome, a fresh lease not zero, no failed completion)";

/// Talks to a Leasebox appliance over its control protocol (v2, TCP port 7470).
#[derive(Debug, Parser)]
#[command(name = "leasectl", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(flatten)]
    timeout: Timeout,
    #[command(subcommand)]
    command: Cmd,
}

/// The help section of the flags every command takes.
const GLOBAL: &str = "Global options";

/// The flags every command takes, before or after it; given twice, the later one counts.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// The appliance (default: the file's addr, else 127.0.0.1:7470)
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "HOST:PORT", overrides_with = "addr")]
    addr: Option<String>,
    /// Configuration file (default: $LEASECTL_CONFIG, else $XDG_CONFIG_HOME/leasebox/leasectl.conf, else
    /// ~/.config/leasebox/leasectl.conf; `cargo xtask run` writes it)
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "PATH", overrides_with = "config")]
    config: Option<PathBuf>,
    /// Authenticate as this tenant (default: the file's tenant)
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "NAME", value_parser = tenant, conflicts_with = "admin", overrides_with = "tenant")]
    tenant: Option<String>,
    /// The key to authenticate with (default: the file's key, or admin_key with --admin)
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "HEX", overrides_with = "key")]
    key: Option<String>,
    /// Authenticate as the principal `admin` with the admin key
    #[arg(long, global = true, help_heading = GLOBAL, overrides_with = "admin")]
    admin: bool,
    /// The appliance's name (its appliance= option): the handshake fails on any other appliance
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "NAME", value_parser = appliance, overrides_with = "appliance")]
    appliance: Option<String>,
    /// Print one JSON object (errors: {"error": {"code", "detail", "message"}})
    #[arg(long, global = true, help_heading = GLOBAL, overrides_with = "json")]
    json: bool,
}

/// The control channel's `--timeout` (before any command, or after one other than `verify`).
#[derive(Debug, Args)]
struct Timeout {
    /// How long to keep trying to connect and authenticate, and to wait for each answer (default 20 s to
    /// connect, 10 s per answer)
    #[arg(long, value_name = "SECS", value_parser = timeout, help_heading = GLOBAL, overrides_with = "timeout")]
    timeout: Option<Duration>,
}

/// A command that takes a lease.
#[derive(Debug, Args)]
struct LeaseArg {
    #[arg(value_name = "LEASE", value_parser = parse_lease)]
    lease: LeaseId,
    #[command(flatten)]
    timeout: Timeout,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// HELLO, then one HEARTBEAT round trip: prints the RTT and the server's uptime
    Ping(Timeout),
    /// Sessions, frames, errors by code, per-core role loop counts; leases by state, bytes, lifetime counts,
    /// ALLOC and REVOKE latency (p50, p99)
    Stats(Timeout),
    /// Overall and HCA health
    Health(Timeout),
    /// The HCA's command counters since boot: submitted, ok, failed, timed out, late, aborted (HCA_STATS)
    HcaStats(Timeout),
    /// Lease slots' state changes, oldest first, one line each: time, slot, generation, from -> to, cause and
    /// the failed teardown steps (LEASE_LOG; admin only)
    LeaseLog {
        /// The sequence number to start at (0: the oldest held; the answer's last line gives the next)
        #[arg(long, default_value_t = 0)]
        cursor: u64,
        /// The most transitions in the answer (1 to 128)
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=128))]
        max: u16,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Ask for a lease
    Alloc {
        /// Lease size in bytes (units: 64K, 2M, 1G, 1TiB, ...)
        #[arg(long, value_name = "BYTES", value_parser = lease_size)]
        size: u64,
        /// The client's QP number
        #[arg(long, value_name = "N", value_parser = qpn)]
        qpn: u32,
        /// The client's first PSN
        #[arg(long, value_name = "N", value_parser = qpn)]
        psn: u32,
        /// The client's GID, 32 hex digits (colons allowed between groups)
        #[arg(long, value_name = "HEX32", value_parser = parse_gid)]
        gid: [u8; 16],
        /// Remote access: any of r, w, a (`r,w`, `rwa`, `read,atomic`)
        #[arg(long, value_name = "r,w,a", default_value = "r,w", value_parser = parse_access)]
        access: u8,
        /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096
        #[arg(long, value_name = "BYTES", default_value = "1024", value_parser = parse_mtu)]
        mtu: u8,
        /// Lease lifetime in ms (0: the server's default)
        #[arg(long, value_name = "N", default_value = "0", value_parser = ttl)]
        ttl_ms: u32,
        /// The client's MAC, aa:bb:cc:dd:ee:ff (default 0: "resolve", the appliance ARPs for the GID's IPv4 on its
        /// port where it can)
        #[arg(long, value_name = "MAC", value_parser = parse_mac)]
        mac: Option<[u8; 6]>,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Confirm the client's QP reached RTS
    Ready {
        #[arg(value_name = "LEASE", value_parser = parse_lease)]
        lease: LeaseId,
        #[arg(long, value_name = "N", value_parser = qpn)]
        client_qpn: u32,
        #[arg(long, value_name = "N", value_parser = qpn)]
        server_qpn: u32,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Extend a lease
    Renew {
        #[arg(value_name = "LEASE", value_parser = parse_lease)]
        lease: LeaseId,
        /// The new lifetime in ms (0: the server's default)
        #[arg(long, value_name = "N", default_value = "0", value_parser = ttl)]
        ttl_ms: u32,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Give a lease back
    Free(LeaseArg),
    /// One lease's state
    Query(LeaseArg),
    /// Every lease this principal may see (all pages)
    List(Timeout),
    /// Revoke a lease (another tenant's needs --admin)
    Revoke {
        #[arg(value_name = "LEASE", value_parser = parse_lease)]
        lease: LeaseId,
        /// Tear down in the revoke spec's order (QP first) instead of MKEY first; the admin's to ask for
        #[arg(long)]
        qp_first: bool,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Slots fenced for good (FENCED_SUMMARY)
    Fenced(Timeout),
    /// Drain the appliance as the admin: notify, wait, revoke
    ///
    /// Sends DRAIN as the admin (no --admin needed; the admin key comes from the file or --key): the sessions
    /// of the tenant named by --tenant (every tenant's without it) are told their leases go in --notice-ms,
    /// their ALLOCs are refused meanwhile, then every one of their leases is revoked. leasectl then lists the
    /// leases until none of them is left unrevoked, or gives up --timeout (default 10 s) after the deadline.
    Drain {
        /// Milliseconds between the notice and the revocations
        #[arg(long, value_name = "N", value_parser = ttl)]
        notice_ms: u32,
        #[command(flatten)]
        timeout: Timeout,
    },
    /// Revoke verifier over RDMA
    ///
    /// The software RoCEv2 requester on UDP (default 127.0.0.1:4791), or --backend verbs on a real RDMA
    /// device in a leasectl built with --features verbs: ALLOC, READY, a WRITE loop with READ checks, REVOKE;
    /// reports recall latency (REVOKE sent -> outcome) and dataplane first-fail latency (outcome -> first
    /// failed completion, with its ibv_wc_status); checks that completed writes read back, nothing succeeds
    /// after the outcome and a new lease reads as zeros. After `verify`, --timeout and --retry-cnt are the
    /// requester QP's; qp-first sends REVOKE qp_first as the admin (admin_key in the file, or --admin-key).
    Verify(Box<VerifyArgs>),
    /// The client library's data path: copying vs zero copy, 4 KiB / 64 KiB / 1 MiB, depth 1 / 16 / 64
    ///
    /// One client, one lease: for each size, WRITEs then READs through the copying calls (one at a time) and
    /// zero copy from a registered region with 1, 16 and 64 operations in flight; operations/s and MiB/s per
    /// cell. --backend verbs runs on a real RDMA device (a leasectl built with --features verbs).
    BenchData(Box<BenchDataArgs>),
    /// The fleet in etcd (docs/fleet.md)
    Fleet {
        #[command(subcommand)]
        sub: FleetCmd,
    },
    /// Print a shell completion script (e.g. `leasectl completions bash > /etc/bash_completion.d/leasectl`)
    Completions {
        #[arg(value_name = "SHELL")]
        shell: Shell,
    },
}

#[derive(Debug, Subcommand)]
enum FleetCmd {
    /// The appliances the registrar advertises in etcd, and the leading registrar
    List {
        /// etcd client endpoints, HOST:PORT or https://HOST:PORT (repeat or comma-separate)
        #[arg(long, value_name = "HOST:PORT", required = true)]
        etcd: Vec<String>,
        /// TLS to etcd: the cluster's CA (PEM)
        #[arg(long, value_name = "FILE")]
        etcd_cacert: Option<std::path::PathBuf>,
        /// TLS to etcd: this client's certificate (PEM), for a cluster that verifies clients
        #[arg(long, value_name = "FILE", requires = "etcd_key", requires = "etcd_cacert")]
        etcd_cert: Option<std::path::PathBuf>,
        /// TLS to etcd: the key of --etcd-cert (PEM)
        #[arg(long, value_name = "FILE", requires = "etcd_cert", requires = "etcd_cacert")]
        etcd_key: Option<std::path::PathBuf>,
        /// etcd authentication: the user (its role must read /leasebox/v1/)
        #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
        etcd_user: Option<String>,
        /// etcd authentication: a file whose first line is the user's password
        #[arg(long, value_name = "FILE", requires = "etcd_user")]
        etcd_password_file: Option<std::path::PathBuf>,
    },
}

/// Parses the arguments after the program name. `Err` carries clap's message and kind (help and version
/// requests included: [`clap::error::ErrorKind::DisplayHelp`], [`clap::error::ErrorKind::DisplayVersion`]).
pub fn parse(args: &[String]) -> Result<Invocation, clap::Error> {
    let mut cli = Cli::try_parse_from(std::iter::once("leasectl").chain(args.iter().map(String::as_str)))?;
    let lease_call = |a: LeaseArg, call: fn(LeaseId) -> Request| (a.timeout, Command::Call(call(a.lease)));
    let (after, command) = match cli.command {
        Cmd::Ping(t) => (t, Command::Ping),
        Cmd::List(t) => (t, Command::List),
        Cmd::Stats(t) => (t, Command::Call(Request::StatsWith { want: STATS_WANT_GUARDS })),
        Cmd::Health(t) => (t, Command::Call(Request::Health)),
        Cmd::HcaStats(t) => (t, Command::Call(Request::HcaStats)),
        Cmd::LeaseLog { cursor, max, timeout } => (timeout, Command::Call(Request::LeaseLog { cursor, max })),
        Cmd::Fenced(t) => (t, Command::Fenced),
        Cmd::Alloc { size, qpn, psn, gid, access, mtu, ttl_ms, mac, timeout } => (
            timeout,
            Command::Call(Request::Alloc(AllocReq {
                size,
                access,
                mtu,
                ttl_ms,
                client_qpn: qpn,
                client_psn: psn,
                client_gid: gid,
                client_mac: mac.unwrap_or([0; 6]),
            })),
        ),
        Cmd::Ready { lease, client_qpn, server_qpn, timeout } => {
            (timeout, Command::Call(Request::Ready { lease, client_qpn, server_qpn }))
        }
        Cmd::Renew { lease, ttl_ms, timeout } => (timeout, Command::Call(Request::Renew { lease, ttl_ms })),
        Cmd::Free(a) => lease_call(a, |lease| Request::Free { lease }),
        Cmd::Query(a) => lease_call(a, |lease| Request::Query { lease }),
        Cmd::Revoke { lease, qp_first, timeout } => (timeout, Command::Call(Request::Revoke { lease, qp_first })),
        Cmd::Drain { notice_ms, timeout } => {
            // `--tenant` names the tenant drained here; the command always speaks as the admin.
            (timeout, Command::Drain { tenant: cli.global.tenant.take(), notice_ms })
        }
        Cmd::Verify(v) => (Timeout { timeout: None }, Command::Verify(v)),
        Cmd::BenchData(b) => (Timeout { timeout: None }, Command::BenchData(b)),
        Cmd::Completions { shell } => (Timeout { timeout: None }, Command::Completions(shell)),
        Cmd::Fleet {
            sub: FleetCmd::List { etcd, etcd_cacert, etcd_cert, etcd_key, etcd_user, etcd_password_file },
        } => {
            let tls = etcd_cacert.map(|ca| leasebox_client::TlsFiles { ca, cert: etcd_cert, key: etcd_key });
            let user = etcd_user.zip(etcd_password_file);
            (Timeout { timeout: None }, Command::FleetList { etcd, tls, user })
        }
    };
    let g = cli.global;
    let drain = matches!(command, Command::Drain { .. });
    let global = Global {
        addr: g.addr,
        config: g.config,
        tenant: g.tenant,
        key: g.key,
        admin: g.admin || drain,
        appliance: g.appliance,
        json: g.json,
        timeout: after.timeout.or(cli.timeout.timeout),
    };
    Ok(Invocation { global, command })
}

/// Writes `leasectl`'s completion script for `shell`.
pub fn completions(shell: Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "leasectl", out);
}

/// `--tenant`: 1 to [`MAX_NAME`] bytes.
/// `--tenant NAME` or `NAME#KEYID` (the key id while a key is being rotated; docs/operations.md).
fn tenant(v: &str) -> Result<String, String> {
    let (name, id) = v.split_once('#').map_or((v, None), |(n, id)| (n, Some(id)));
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("names are 1 to {MAX_NAME} bytes"));
    }
    if id.is_some_and(|id| id.parse::<u8>().is_err()) {
        return Err("the key id after '#' is 0 to 255".into());
    }
    Ok(v.to_string())
}

/// `--appliance`: 1 to [`MAX_NAME`] bytes of `A-Z a-z 0-9 _ . -` (the appliance's `appliance=`).
fn appliance(v: &str) -> Result<String, String> {
    let ok = v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if v.is_empty() || v.len() > MAX_NAME || !ok {
        return Err(format!("appliance names are 1 to {MAX_NAME} characters of A-Z a-z 0-9 _ . -"));
    }
    Ok(v.to_string())
}

/// `--timeout` (control channel): seconds, 0.1 to 3600.
fn timeout(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|_| "needs seconds (e.g. 2.5)".to_string())?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err("must be between 0.1 and 3600 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A 24-bit QP number or PSN.
fn qpn(v: &str) -> Result<u32, String> {
    number(v, 0, 0xFF_FFFF).map(|n| n as u32)
}

/// A lifetime in ms (`--ttl-ms`).
fn ttl(v: &str) -> Result<u32, String> {
    number(v, 0, u32::MAX.into()).map(|n| n as u32)
}

/// `alloc --size`: any positive size.
fn lease_size(v: &str) -> Result<u64, String> {
    leasebox_units::parse_size_in(v, 1..=u64::MAX).map_err(|e| e.to_string())
}

/// The boot id of a lease written without one: [`with_boot`] puts the appliance's in its place. A real boot id
/// is 128 random bits, never all zero in practice.
pub const THIS_BOOT: [u8; 16] = [0; 16];

/// A lease written `SLOT.GENERATION` (decimal), e.g. `3.17` (this boot: [`THIS_BOOT`] until the handshake
/// says which), or `SLOT.GENERATION@BOOT` with the boot id in 32 hex digits.
pub fn parse_lease(s: &str) -> Result<LeaseId, String> {
    let bad = || format!("lease '{s}' is not SLOT.GENERATION (e.g. 3.17) or SLOT.GENERATION@BOOT (32 hex digits)");
    let (id, boot) = match s.split_once('@') {
        Some((id, b)) => {
            let b = crate::hex::decode(b).ok().and_then(|v| <[u8; 16]>::try_from(v).ok()).ok_or_else(bad)?;
            (id, b)
        }
        None => (s, THIS_BOOT),
    };
    let (a, b) = id.split_once('.').ok_or_else(bad)?;
    let num = |x: &str| {
        if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        x.parse::<u32>().map_err(|_| bad())
    };
    Ok(LeaseId { boot_id: boot, slot: num(a)?, generation: num(b)? })
}

/// `req` with every lease id written without a boot given `boot` (the one the appliance announced).
pub fn with_boot(req: &Request, boot: [u8; 16]) -> Request {
    let mut req = req.clone();
    match &mut req {
        Request::Ready { lease, .. }
        | Request::Renew { lease, .. }
        | Request::Free { lease }
        | Request::Query { lease }
        | Request::Revoke { lease, .. }
            if lease.boot_id == THIS_BOOT =>
        {
            lease.boot_id = boot;
        }
        _ => {}
    }
    req
}

/// How a lease is written on the command line and in output.
pub fn lease_str(l: LeaseId) -> String {
    format!("{}.{}", l.slot, l.generation)
}

/// A decimal or `0x` hex number from `min` to `max`.
pub(crate) fn number(v: &str, min: u64, max: u64) -> Result<u64, String> {
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse::<u64>(),
    };
    match n {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("needs a number from {min} to {max} (decimal or 0x hex)")),
    }
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
            _ => return Err(format!("'{w}' is not r, w or a")),
        };
    }
    if a == 0 {
        return Err("needs at least one of r, w, a".into());
    }
    Ok(a)
}

/// The path MTU in bytes (256, 512, 1024, 2048, 4096) → the IB encoding (1..=5).
fn parse_mtu(v: &str) -> Result<u8, String> {
    (1u8..=5)
        .find(|c| leasebox_proto::mtu_bytes(*c).is_some_and(|b| b.to_string() == v))
        .ok_or_else(|| "must be 256, 512, 1024, 2048 or 4096".to_string())
}

/// 16 bytes as 32 hex digits (colons allowed between groups, as in `fe80:0000:...`).
fn parse_gid(v: &str) -> Result<[u8; 16], String> {
    let digits: String = v.chars().filter(|c| *c != ':').collect();
    let b = crate::hex::decode(&digits)?;
    b.try_into().map_err(|_| "needs 32 hex digits (16 bytes)".to_string())
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn parse_mac(v: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = v.split(':').collect();
    let bad = || "needs six hex bytes like 02:00:00:00:00:01".to_string();
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
    use clap::error::ErrorKind;

    fn p(args: &[&str]) -> Result<Invocation, clap::Error> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }
    fn cmd(args: &[&str]) -> Command {
        p(args).unwrap().command
    }
    fn err(args: &[&str]) -> String {
        p(args).unwrap_err().to_string()
    }
    fn kind(args: &[&str]) -> ErrorKind {
        p(args).unwrap_err().kind()
    }

    #[test]
    fn fleet_list_takes_etcd_tls_files_that_go_together() {
        let e = || vec!["127.0.0.1:2379".to_string()];
        let plain = Command::FleetList { etcd: e(), tls: None, user: None };
        assert_eq!(cmd(&["fleet", "list", "--etcd", "127.0.0.1:2379"]), plain);
        let with_user =
            ["fleet", "list", "--etcd", "127.0.0.1:2379", "--etcd-user", "ro", "--etcd-password-file", "pw"];
        assert_eq!(
            cmd(&with_user),
            Command::FleetList { etcd: e(), tls: None, user: Some(("ro".into(), "pw".into())) }
        );
        assert!(err(&with_user[..6]).contains("--etcd-password-file"));
        let all = ["fleet", "list", "--etcd", "127.0.0.1:2379", "--etcd-cacert", "ca.pem"];
        let tls = |cert: Option<&str>, key: Option<&str>| leasebox_client::TlsFiles {
            ca: "ca.pem".into(),
            cert: cert.map(Into::into),
            key: key.map(Into::into),
        };
        assert_eq!(cmd(&all), Command::FleetList { etcd: e(), tls: Some(tls(None, None)), user: None });
        let with_cert = [&all[..], &["--etcd-cert", "c.pem", "--etcd-key", "k.pem"]].concat();
        assert_eq!(
            cmd(&with_cert),
            Command::FleetList { etcd: e(), tls: Some(tls(Some("c.pem"), Some("k.pem"))), user: None }
        );
        assert!(err(&[&all[..], &["--etcd-cert", "c.pem"]].concat()).contains("--etcd-key"));
        assert!(
            err(&["fleet", "list", "--etcd", "h:1", "--etcd-cert", "c", "--etcd-key", "k"]).contains("--etcd-cacert")
        );
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
        assert_eq!(i.command, Command::Call(Request::StatsWith { want: STATS_WANT_GUARDS }));
        // --timeout before the command, or after it (the later one wins).
        assert_eq!(p(&["--timeout", "3", "list"]).unwrap().global.timeout, Some(Duration::from_secs(3)));
        assert_eq!(
            p(&["--timeout", "3", "list", "--timeout", "4"]).unwrap().global.timeout,
            Some(Duration::from_secs(4))
        );
    }

    #[test]
    fn help_version_and_usage_errors() {
        assert_eq!(kind(&["--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["help", "alloc"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["ping", "-h"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["--version"]), ErrorKind::DisplayVersion);
        assert!(p(&["--version"]).unwrap_err().to_string().contains(env!("CARGO_PKG_VERSION")));
        // No command: the help, as a usage error.
        assert_eq!(kind(&[]), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(p(&[]).unwrap_err().exit_code(), 2);
        assert!(err(&["frob"]).contains("unrecognized subcommand 'frob'"));
        assert!(err(&["--frob", "ping"]).contains("unexpected argument '--frob'"));
        assert!(err(&["ping", "--size", "4"]).contains("unexpected argument '--size'"));
        assert!(err(&["ping", "extra"]).contains("unexpected argument 'extra'"));
        assert!(err(&["--addr"]).contains("a value is required for '--addr <HOST:PORT>'"));
        assert!(err(&["--json=yes", "ping"]).contains("unexpected value 'yes' for '--json'"));
        assert!(err(&["--timeout", "0", "ping"]).contains("'--timeout <SECS>': must be between 0.1 and 3600"));
        assert!(err(&["--timeout", "soon", "ping"]).contains("'--timeout <SECS>': needs seconds"));
        assert!(err(&["--admin", "--tenant", "x", "ping"]).contains("cannot be used with"));
        assert!(err(&["--tenant", &"x".repeat(33), "ping"]).contains("1 to 32"));
        assert!(err(&["--appliance", "a@b", "ping"]).contains("appliance names"));
        let i = p(&["--appliance", "lb-a", "--admin", "ping"]).unwrap();
        assert_eq!(i.global.appliance.as_deref(), Some("lb-a"));
        assert!(err(&["revoke", "1.2", "--qp-first", "--qp-first"]).contains("cannot be used multiple times"));
        // Every usage error is exit code 2, as clap's own.
        assert_eq!(p(&["frob"]).unwrap_err().exit_code(), i32::from(crate::client::exit::USAGE));
    }

    #[test]
    fn drain_speaks_as_the_admin_and_takes_the_tenant_drained() {
        let i = p(&["drain", "--tenant", "demo", "--notice-ms", "5000"]).unwrap();
        assert_eq!(i.command, Command::Drain { tenant: Some("demo".into()), notice_ms: 5000 });
        assert!(i.global.admin && i.global.tenant.is_none());
        let i = p(&["--json", "drain", "--notice-ms=0"]).unwrap();
        assert_eq!(i.command, Command::Drain { tenant: None, notice_ms: 0 });
        assert!(i.global.admin && i.global.json);
        assert!(err(&["drain"]).contains("--notice-ms <N>"));
        assert!(err(&["drain", "--notice-ms", "-1"]).contains("--notice-ms"));
    }

    #[test]
    fn completions() {
        assert_eq!(cmd(&["completions", "bash"]), Command::Completions(Shell::Bash));
        assert!(err(&["completions", "cmd.exe"]).contains("possible values"));
        let mut out = Vec::new();
        super::completions(Shell::Bash, &mut out);
        let script = String::from_utf8(out).unwrap();
        assert!(script.contains("leasectl") && script.contains("--qp-first") && script.contains("verify"));
    }

    #[test]
    fn lease_commands() {
        let l = LeaseId { boot_id: THIS_BOOT, slot: 3, generation: 17 };
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
        assert!(err(&["ready", "3.17", "--client-qpn", "1"]).contains("--server-qpn <N>"));
        assert!(err(&["ready", "3.17", "--client-qpn", "0x1000000", "--server-qpn", "1"]).contains("0 to 16777215"));
        assert!(err(&["free"]).contains("<LEASE>"));
        assert!(err(&["free", "3"]).contains("SLOT.GENERATION"));
        assert_eq!(cmd(&["list"]), Command::List);
        assert_eq!(cmd(&["fenced"]), Command::Fenced);
        assert_eq!(cmd(&["health"]), Command::Call(Request::Health));
        assert_eq!(cmd(&["hca-stats"]), Command::Call(Request::HcaStats));
        assert_eq!(cmd(&["lease-log"]), Command::Call(Request::LeaseLog { cursor: 0, max: 128 }));
        assert_eq!(
            cmd(&["lease-log", "--cursor", "17", "--max", "5"]),
            Command::Call(Request::LeaseLog { cursor: 17, max: 5 })
        );
        assert!(p(&["lease-log", "--max", "0"]).is_err());
        assert!(p(&["lease-log", "--max", "129"]).is_err());
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
        assert!(with(&[]).contains("--size <BYTES>"));
        assert!(with(&["--size", "0"]).contains("at least 1"));
        assert!(with(&["--size", "3X"]).contains("unknown unit"));
        assert!(with(&["--size", "99999999999T"]).contains("too large"));
        assert!(with(&["--size", "1", "--access", "x"]).contains("'x' is not r, w or a"));
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
        let id = |slot, generation| LeaseId { boot_id: THIS_BOOT, slot, generation };
        assert_eq!(parse_lease("3.17"), Ok(id(3, 17)));
        assert_eq!(parse_lease("0.0"), Ok(id(0, 0)));
        assert_eq!(parse_lease("4294967295.4294967295"), Ok(id(u32::MAX, u32::MAX)));
        let boot = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebf";
        let want = LeaseId { boot_id: core::array::from_fn(|i| 0xb0 + i as u8), slot: 3, generation: 17 };
        assert_eq!(parse_lease(&format!("3.17@{boot}")), Ok(want));
        for bad in ["", "3", "3.", ".17", "3.17.1", "a.b", "-1.2", "+1.2", "3 .17", "4294967296.0", "0x3.1"] {
            assert!(parse_lease(bad).is_err(), "{bad}");
        }
        for bad in ["3.17@", "3.17@b0b1", "3.17@zz", &format!("3.17@{boot}00"), &format!("@{boot}")] {
            assert!(parse_lease(bad).is_err(), "{bad}");
        }
        assert_eq!(lease_str(id(3, 17)), "3.17");
        // The handshake's boot id fills in a lease written without one, and leaves an explicit one alone.
        let b = [0x42; 16];
        let filled = with_boot(&Request::Free { lease: id(3, 17) }, b);
        assert_eq!(filled, Request::Free { lease: LeaseId { boot_id: b, ..id(3, 17) } });
        assert_eq!(with_boot(&Request::Free { lease: want }, b), Request::Free { lease: want });
    }

    #[test]
    fn bench_data_flags() {
        assert!(matches!(cmd(&["bench-data"]), Command::BenchData(_)));
        let i = p(&[
            "--timeout",
            "30",
            "--json",
            "bench-data",
            "--per-ms",
            "200",
            "--backend",
            "verbs",
            "--device",
            "rxe0",
            "--gid-index",
            "1",
        ])
        .unwrap();
        assert!(i.global.json && matches!(i.command, Command::BenchData(_)));
        assert_eq!(i.global.timeout, Some(Duration::from_secs(30)));
        assert!(err(&["bench-data", "--per-ms", "5"]).contains("--per-ms"));
        assert!(err(&["bench-data", "--span", "4K"]).contains("--span"));
        assert!(err(&["bench-data", "--backend", "rdma"]).contains("possible values"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}
