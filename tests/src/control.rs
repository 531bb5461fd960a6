//! The control channel end to end: boots the image with virtio-net, user networking and fresh keys (or starts
//! the hosted appliance), then talks to it as clients do — the `leasectl` binary for the CLI, the `leasectl`
//! library for concurrent sessions, raw frames for abuse. Used by `cargo xtask test` (scenario) and
//! `cargo xtask bench control` (figures).

use crate::{Artifacts, serial};
use leasebox_hosted::{Hosted, HostedConfig};
use leasebox_proto::{ErrorCode, Kind, Op, Request, Response, frame};
use leasebox_qemu::{Boot, HostFwd, NextLine, QemuConfig, QemuProcess, Stdio};
use leasectl::client::{Client, Credentials, Timeouts};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "control-qemu";
/// Guest control port.
const GUEST_PORT: u16 = 7470;
/// Boot to the ready line (with DHCP) under TCG on a busy 2-core host.
const BOOT_DEADLINE: Duration = Duration::from_secs(90);
/// Frames sent on the abusive connection.
pub const MALFORMED_FRAMES: u32 = 1000;

/// A random 32-byte key in hex, from the OS.
pub(crate) fn random_hex() -> Result<String, String> {
    leasectl::hex::random_key(32)
}

pub(crate) fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap_or(0)).collect()
}

/// Something serving the control protocol, kept alive as long as this value.
pub struct Target {
    pub addr: String,
    pub tenant_hex: String,
    pub admin_hex: String,
    pub what: &'static str,
    _guard: Guard,
}

enum Guard {
    Qemu(Box<QemuProcess>),
    Hosted(Option<Hosted>),
}

impl Drop for Target {
    fn drop(&mut self) {
        match &mut self._guard {
            Guard::Qemu(q) => {
                let _ = q.kill();
            }
            Guard::Hosted(h) => {
                if let Some(h) = h.take() {
                    h.stop();
                }
            }
        }
    }
}

impl Target {
    pub fn tenant(&self) -> Credentials {
        Credentials { name: "demo".into(), key: hex_bytes(&self.tenant_hex) }
    }
    pub fn admin(&self) -> Credentials {
        Credentials { name: "admin".into(), key: hex_bytes(&self.admin_hex) }
    }
    /// An authenticated session.
    pub fn session(&self, who: &Credentials) -> Result<Client, String> {
        let t = Timeouts { retry_for: Duration::from_secs(30), ..Timeouts::default() };
        Client::connect_and_hello(&self.addr, who, t)
            .map(|(c, _)| c)
            .map_err(|e| format!("session to {}: {e}", self.addr))
    }
}

/// Boots the image under QEMU with the control port forwarded to a free host port.
pub fn boot_qemu(a: &Artifacts, smp: u32, extra_args: &str) -> Result<Target, String> {
    let (tenant_hex, admin_hex) = (random_hex()?, random_hex()?);
    let port = free_port()?;
    let append = format!("tenant=demo:{tenant_hex} admin={admin_hex} {extra_args}");
    let mut c = QemuConfig::new(Boot::Kernel { elf: a.elf.clone(), append });
    c.qemu = a.qemu.clone();
    c.cpu = a.cpu.clone();
    c.smp = smp;
    c.net = Some(HostFwd::localhost(port, GUEST_PORT));
    let mut q = QemuProcess::spawn(&c, Stdio::Capture { echo: a.echo }, vec![]).map_err(|e| e.to_string())?;
    let deadline = q.started() + BOOT_DEADLINE;
    loop {
        match q.next_line(deadline) {
            NextLine::Line(l) => {
                if let Some(r) = serial::parse_ready(&l.text) {
                    let ip = r.fields.iter().find(|(k, _)| k == "ip").map(|(_, v)| v.as_str());
                    if ip.is_none_or(|ip| ip == "none") {
                        return Err(format!("the ready line has no address: {}", l.text));
                    }
                    break;
                }
                if l.text.contains("!!!") {
                    return Err(format!("guest failed: {}", l.text));
                }
            }
            NextLine::Closed => return Err("QEMU exited before the ready line".into()),
            NextLine::TimedOut => return Err(format!("no ready line within {} s", BOOT_DEADLINE.as_secs())),
        }
    }
    let addr = format!("127.0.0.1:{port}");
    Ok(Target { addr, tenant_hex, admin_hex, what: "QEMU guest", _guard: Guard::Qemu(Box::new(q)) })
}

/// Starts the hosted appliance in this process on a free port, with extra option words.
pub fn start_hosted(extra_args: &[&str]) -> Result<Target, String> {
    let (tenant_hex, admin_hex) = (random_hex()?, random_hex()?);
    let mut args: Vec<String> =
        ["--listen".into(), "127.0.0.1:0".into(), format!("tenant=demo:{tenant_hex}"), format!("admin={admin_hex}")]
            .into();
    args.extend(extra_args.iter().map(|a| a.to_string()));
    let h = Hosted::start(HostedConfig::from_args(&args)?)?;
    let addr = h.addr().to_string();
    Ok(Target { addr, tenant_hex, admin_hex, what: "hosted", _guard: Guard::Hosted(Some(h)) })
}

/// Runs the `leasectl` binary against `t`; returns its stdout.
fn leasectl(bin: &Path, t: &Target, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args(["--addr", &t.addr, "--tenant", "demo", "--key", &t.tenant_hex, "--timeout", "30"])
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "leasectl {} failed ({}): {stdout}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// One malformed-but-framed request: four kinds in turn, each with the error code it must earn.
fn malformed(i: u32) -> (Vec<u8>, ErrorCode) {
    let mut f = Vec::new();
    match i % 4 {
        0 => {
            frame(Kind::Request, 0x0999, i, &[], &mut f);
            (f, ErrorCode::UnknownOp)
        }
        1 => {
            frame(Kind::Request, Op::Heartbeat as u16, i, &[1, 2, 3], &mut f);
            (f, ErrorCode::Malformed)
        }
        2 => {
            frame(Kind::Response, Op::Heartbeat as u16, i, &[0; 8], &mut f);
            (f, ErrorCode::Malformed)
        }
        _ => {
            frame(Kind::Request, Op::Revoke as u16, i, &[0, 0, 0, 1, 0, 0, 0, 1, 0x80, 0, 0, 0], &mut f);
            (f, ErrorCode::BadParam)
        }
    }
}

/// The scenario: CLI ping / stats --json / health; 1,000 malformed frames on one session while a second
/// session keeps answering HEARTBEAT; garbage on a third (framing lost: error, then closed); the appliance
/// still answers afterwards and counted the errors. Returns a one-line summary.
pub fn check(t: &Target, leasectl_bin: &Path) -> Result<String, String> {
    let ping = leasectl(leasectl_bin, t, &["ping"])?;
    if !ping.contains("pong") {
        return Err(format!("leasectl ping: {ping}"));
    }
    let stats = leasectl(leasectl_bin, t, &["stats", "--json"])?;
    let v: serde_json::Value =
        serde_json::from_str(&stats).map_err(|e| format!("leasectl stats --json is not JSON ({e}): {stats}"))?;
    if !(v["sessions_current"].is_u64() && v["roles"].is_array()) {
        return Err(format!("leasectl stats --json lacks sessions_current or roles: {stats}"));
    }
    let health = leasectl(leasectl_bin, t, &["health"])?;
    if !health.contains("status") {
        return Err(format!("leasectl health: {health}"));
    }

    let mut abuser = t.session(&t.tenant())?;
    let mut steady = t.session(&t.tenant())?;
    // A third session heartbeats between every chunk of the flood, so the interleaving is certain.
    let mut interleaved = t.session(&t.admin())?;
    let mut interleaved_beats = 0u32;
    let stop = Arc::new(AtomicBool::new(false));
    let beats = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<u32, String> {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                match steady.call(&Request::Heartbeat { echo: u64::from(n) }) {
                    Ok(Response::Heartbeat { echo, .. }) if echo == u64::from(n) => n += 1,
                    other => return Err(format!("heartbeat {n} during the flood: {other:?}")),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(n)
        })
    };
    let flood = (|| -> Result<(), String> {
        for chunk in (0..MALFORMED_FRAMES).collect::<Vec<_>>().chunks(50) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|i| malformed(*i).0).collect();
            abuser.send_raw(&bytes).map_err(|e| format!("sending malformed frames: {e}"))?;
            match interleaved.call(&Request::Heartbeat { echo: u64::from(chunk[0]) }) {
                Ok(Response::Heartbeat { .. }) => interleaved_beats += 1,
                other => return Err(format!("heartbeat beside the flood: {other:?}")),
            }
            for &i in chunk {
                let a = abuser.receive().map_err(|e| format!("answer to malformed frame {i}: {e}"))?;
                let want = malformed(i).1;
                match a.body {
                    Err(e) if e.code == want && a.header.request_id == i => {}
                    other => return Err(format!("malformed frame {i}: wanted {want:?}, got {other:?}")),
                }
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let beats = beats.join().map_err(|_| "heartbeat thread panicked")??;
    flood?;
    if beats == 0 || interleaved_beats != MALFORMED_FRAMES / 50 {
        return Err(format!("heartbeats during the flood: {beats} concurrent, {interleaved_beats} interleaved"));
    }
    // The abused session is still a session.
    match abuser.call(&Request::Heartbeat { echo: 7 }) {
        Ok(Response::Heartbeat { echo: 7, .. }) => {}
        other => return Err(format!("abused session after the flood: {other:?}")),
    }

    // Garbage loses framing: one BAD_MAGIC error, then the server closes.
    let mut garbage = t.session(&t.tenant())?;
    garbage.send_raw(b"GET / HTTP/1.1\r\nHost: leasebox\r\n\r\n").map_err(|e| e.to_string())?;
    match garbage.receive() {
        Ok(a) if matches!(&a.body, Err(e) if e.code == ErrorCode::BadMagic) => {}
        other => return Err(format!("garbage: wanted BAD_MAGIC, got {other:?}")),
    }
    if garbage.receive().is_ok() {
        return Err("the server kept talking after losing framing".into());
    }

    let mut admin = t.session(&t.admin())?;
    let s = match admin.call(&Request::Stats) {
        Ok(Response::Stats(s)) => s,
        other => return Err(format!("stats after the flood: {other:?}")),
    };
    let count = |c: ErrorCode| s.errors.iter().find(|(code, _)| *code == c as u16).map_or(0, |(_, n)| *n);
    if count(ErrorCode::UnknownOp) < u64::from(MALFORMED_FRAMES / 4) || count(ErrorCode::BadMagic) < 1 {
        return Err(format!("error counters do not show the flood: {:?}", s.errors));
    }
    Ok(format!(
        "{}: ping/stats/health via leasectl ok; {MALFORMED_FRAMES} malformed frames answered while {} heartbeats succeeded; \
         garbage closed; {} frames in",
        t.what,
        beats + interleaved_beats,
        s.frames_in
    ))
}

/// The `control-qemu` scenario: boots the image (one CPU) and runs [`check`] against it with
/// [`Artifacts::leasectl_bin`].
pub fn run(a: &Artifacts) -> Result<String, String> {
    let t = boot_qemu(a, 1, "")?;
    check(&t, &a.leasectl_bin)
}

/// HEARTBEAT round trips with `sessions` concurrent sessions for `dur`: (round trips per second, p50 µs, p99 µs).
pub fn heartbeat_load(t: &Target, sessions: usize, dur: Duration) -> Result<(f64, f64, f64), String> {
    let clients: Vec<Client> = (0..sessions).map(|_| t.session(&t.tenant())).collect::<Result<_, _>>()?;
    let start = Instant::now();
    let handles: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> Result<Vec<u32>, String> {
                let mut lat = Vec::new();
                while start.elapsed() < dur {
                    let t0 = Instant::now();
                    match c.call(&Request::Heartbeat { echo: 1 }) {
                        Ok(Response::Heartbeat { .. }) => lat.push(t0.elapsed().as_micros() as u32),
                        other => return Err(format!("heartbeat: {other:?}")),
                    }
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().map_err(|_| "load thread panicked")??);
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all.get(((all.len() as f64 - 1.0) * p) as usize).map_or(f64::NAN, |v| f64::from(*v));
    Ok((all.len() as f64 / secs, pct(0.5), pct(0.99)))
}

/// Memory per session, measured in the hosted appliance: the process's resident set before and after opening
/// `n` (≤ 64) authenticated sessions. It includes both ends' thread stacks touched so far and the session
/// core's buffers, so it is an upper bound on the session core's own cost.
pub fn hosted_bytes_per_session(n: usize) -> Result<f64, String> {
    fn rss_kib() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
    }
    let t = start_hosted(&["sessions=64"])?;
    let _warm = t.session(&t.tenant())?;
    let before = rss_kib().ok_or("no /proc/self/status")?;
    let held: Vec<Client> = (0..n).map(|_| t.session(&t.tenant())).collect::<Result<_, _>>()?;
    let after = rss_kib().ok_or("no /proc/self/status")?;
    drop(held);
    Ok((after.saturating_sub(before) as f64 * 1024.0) / n as f64)
}
