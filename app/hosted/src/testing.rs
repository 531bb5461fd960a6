//! The hosted appliance as a test rig (feature `testing`), shipped with the crate so that every test, benchmark
//! and scenario that needs an appliance starts it the same way:
//!
//! ```no_run
//! use leasebox_hosted::testing::{Key, Rig};
//! let rig = Rig::builder().model().tenant("demo").admin().sessions(4).lease_grace_ms(100).start()?;
//! let (addr, udp, key) = (rig.addr(), rig.udp(), rig.key("demo").bytes());
//! // ... clients against `addr`, RDMA against `udp` ...
//! drop(rig); // stops the appliance, its threads and the model
//! # Ok::<(), String>(())
//! ```
//!
//! [`Builder`] owns the spelling of the appliance's command line for tests: its methods produce the argv the
//! `leasebox-hosted` binary accepts ([`Builder::args`]), which [`HostedConfig::from_args`] turns into the
//! configuration, so a test can no longer drift from what the binary parses. The same argv starts the binary
//! itself ([`Builder::spawn`]) when a test must watch a separate process (its CPU time, a kill). [`Key`] is the
//! one random test key.

use std::collections::VecDeque;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Hosted, HostedConfig};

/// A principal's key: bytes from the OS's random source, or given. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

impl Key {
    /// The length of a [`Key::random`] key (the session core's keys are 32 bytes).
    pub const BYTES: usize = 32;

    /// A fresh key of [`Key::BYTES`] bytes from `/dev/urandom`. Panics (a test helper) when the OS has no
    /// random source; [`Key::try_random`] returns the error instead.
    pub fn random() -> Key {
        Key::try_random().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Key::random`], with a failure to read the OS's random source as an error.
    pub fn try_random() -> Result<Key, String> {
        let mut b = vec![0u8; Key::BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .map_err(|e| format!("reading /dev/urandom for a key: {e}"))?;
        Ok(Key(b))
    }

    /// A key with exactly these bytes (a test that needs a fixed or short key).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Key {
        Key(bytes.into())
    }

    /// The key as the appliance's options spell it: lower-case hex.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

/// A tenant and its keys: `(None, key)` is `tenant=NAME:HEX`; ids make `tenant=NAME:ID/HEX,ID/HEX` (rotation).
struct Tenant {
    name: String,
    keys: Vec<(Option<u8>, Key)>,
}

/// A change to the parsed configuration that has no command-line spelling (an admission rate, say).
type Edit = Box<dyn FnOnce(&mut HostedConfig)>;

/// The hosted appliance's configuration, built a method at a time; each method is one flag or option word of
/// the binary (docs/operations.md). Starts from `--listen 127.0.0.1:0` (a free port), no HCA, no principals.
pub struct Builder {
    listen: String,
    hca: bool,
    udp: Option<String>,
    timing: Option<String>,
    tenants: Vec<Tenant>,
    admin: Option<Key>,
    words: Vec<String>,
    raw: Vec<String>,
    edits: Vec<Edit>,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder {
            listen: "127.0.0.1:0".into(),
            hca: false,
            udp: None,
            timing: None,
            tenants: Vec::new(),
            admin: None,
            words: Vec::new(),
            raw: Vec::new(),
            edits: Vec::new(),
        }
    }
}

impl Builder {
    /// `--listen ADDR` (default `127.0.0.1:0`: a free port on loopback).
    pub fn listen(mut self, addr: impl ToString) -> Builder {
        self.listen = addr.to_string();
        self
    }

    /// `--hca`: the device model, the driver and the lease service, without the data path.
    pub fn hca(mut self) -> Builder {
        self.hca = true;
        self
    }

    /// `--hca --udp 127.0.0.1:0`: the device model with its RoCEv2 responder on a free UDP port
    /// ([`Rig::udp`]), so clients can move data.
    pub fn model(self) -> Builder {
        self.udp("127.0.0.1:0")
    }

    /// `--hca --udp ADDR`: the model's RoCEv2 responder at `addr`.
    pub fn udp(mut self, addr: impl ToString) -> Builder {
        self.hca = true;
        self.udp = Some(addr.to_string());
        self
    }

    /// `--timing T`: the model's firmware time per command (`firmware`, `zero` or a latency such as `20us`).
    pub fn timing(mut self, t: &str) -> Builder {
        self.timing = Some(t.into());
        self
    }

    /// `tenant=NAME:HEX` with a fresh random key ([`Rig::key`]).
    pub fn tenant(self, name: &str) -> Builder {
        self.tenant_with_key(name, Key::random())
    }

    /// `tenant=NAME:HEX` with `key`.
    pub fn tenant_with_key(mut self, name: &str, key: Key) -> Builder {
        self.tenants.push(Tenant { name: name.into(), keys: vec![(None, key)] });
        self
    }

    /// `tenant=NAME:ID/HEX,ID/HEX...`: a tenant with several keys, each under its key id (rotation;
    /// docs/security.md). [`Rig::key`] gives the first.
    pub fn tenant_keys(mut self, name: &str, keys: &[(u8, Key)]) -> Builder {
        self.tenants
            .push(Tenant { name: name.into(), keys: keys.iter().map(|(i, k)| (Some(*i), k.clone())).collect() });
        self
    }

    /// `admin=HEX` with a fresh random key ([`Rig::admin_key`]).
    pub fn admin(self) -> Builder {
        self.admin_with_key(Key::random())
    }

    /// `admin=HEX` with `key`.
    pub fn admin_with_key(mut self, key: Key) -> Builder {
        self.admin = Some(key);
        self
    }

    /// `appliance=NAME`: the name bound into every handshake.
    pub fn appliance(self, name: &str) -> Builder {
        self.option("appliance", name)
    }

    /// `sessions=N`: the session budget.
    pub fn sessions(self, n: u32) -> Builder {
        self.option("sessions", n)
    }

    /// `credits=N`: requests in flight per session.
    pub fn credits(self, n: u32) -> Builder {
        self.option("credits", n)
    }

    /// `heartbeat_ms=N`: a session silent this long is timed out.
    pub fn heartbeat_ms(self, ms: u64) -> Builder {
        self.option("heartbeat_ms", ms)
    }

    /// `lease_pool_mib=N`: the lease pool (with the HCA).
    pub fn lease_pool_mib(self, mib: u64) -> Builder {
        self.option("lease_pool_mib", mib)
    }

    /// `lease_grace_ms=N`: how long a lost session's leases wait for it to come back.
    pub fn lease_grace_ms(self, ms: u64) -> Builder {
        self.option("lease_grace_ms", ms)
    }

    /// Any other option word, `KEY=VALUE` (the session's budgets, the lease options; docs/operations.md).
    pub fn option(mut self, key: &str, value: impl fmt::Display) -> Builder {
        self.words.push(format!("{key}={value}"));
        self
    }

    /// Command-line words passed on as they are, after the builder's own: for callers whose arguments come
    /// from a command line of their own (a benchmark's `--hca ...`). Tests use the methods above.
    pub fn raw<S: AsRef<str>>(mut self, words: &[S]) -> Builder {
        self.raw.extend(words.iter().map(|w| w.as_ref().to_string()));
        self
    }

    /// Changes the parsed configuration before the appliance starts ([`Builder::start`] only): for settings
    /// that have no option word, such as the admission rates a thousand-session test raises.
    pub fn edit(mut self, f: impl FnOnce(&mut HostedConfig) + 'static) -> Builder {
        self.edits.push(Box::new(f));
        self
    }

    /// The argv `leasebox-hosted` is started with for this configuration (without the program name).
    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["--listen".to_string(), self.listen.clone()];
        if self.hca {
            a.push("--hca".into());
        }
        if let Some(u) = &self.udp {
            a.extend(["--udp".into(), u.clone()]);
        }
        if let Some(t) = &self.timing {
            a.extend(["--timing".into(), t.clone()]);
        }
        for t in &self.tenants {
            let keys: Vec<String> = t
                .keys
                .iter()
                .map(|(id, k)| match id {
                    Some(id) => format!("{id}/{}", k.hex()),
                    None => k.hex(),
                })
                .collect();
            a.push(format!("tenant={}:{}", t.name, keys.join(",")));
        }
        if let Some(k) = &self.admin {
            a.push(format!("admin={}", k.hex()));
        }
        a.extend(self.words.iter().cloned());
        a.extend(self.raw.iter().cloned());
        a
    }

    /// The configuration the binary would run with ([`HostedConfig::from_args`] on [`Builder::args`]), with the
    /// [`Builder::edit`]s applied.
    pub fn config(self) -> Result<HostedConfig, String> {
        let mut cfg = HostedConfig::from_args(&self.args())?;
        for e in self.edits {
            e(&mut cfg);
        }
        Ok(cfg)
    }

    fn keys(&self) -> Keys {
        let tenants = self.tenants.iter().map(|t| (t.name.clone(), t.keys[0].1.clone())).collect();
        Keys { tenants, admin: self.admin.clone() }
    }

    /// Starts the appliance in this process.
    pub fn start(self) -> Result<Rig, String> {
        let keys = self.keys();
        let hosted = Hosted::start(self.config()?)?;
        Ok(Rig { hosted: Some(hosted), keys })
    }

    /// Starts the `leasebox-hosted` binary at `bin` (a test's `env!("CARGO_BIN_EXE_leasebox-hosted")`) with
    /// [`Builder::args`] and waits up to `ready_within` for its ready line. [`Builder::edit`]s cannot reach
    /// another process: a builder with any is refused.
    pub fn spawn(self, bin: &Path, ready_within: Duration) -> Result<Process, String> {
        if !self.edits.is_empty() {
            return Err("Builder::edit changes an in-process configuration: use start(), not spawn()".into());
        }
        let keys = self.keys();
        let mut child = Command::new(bin)
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() == STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }
        let out = child.stdout.take().ok_or("no stdout from the child")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Killed and reaped on every error below.
        let mut p = Process { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)), udp: None, keys };
        let tail = || stderr.lock().map(|t| Vec::from(t.clone()).join("\n")).unwrap_or_default();
        let line = loop {
            match rx.recv_timeout(ready_within) {
                Ok(l) if l.starts_with("leasebox: ready ") => break l,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no ready line within {ready_within:?}; stderr:\n{}", tail()));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = p.child.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
                    return Err(format!(
                        "leasebox-hosted exited ({status}) before its ready line; stderr:\n{}",
                        tail()
                    ));
                }
            }
        };
        let ready = Ready::parse(&line)?;
        p.addr = ready.addr;
        p.udp = ready.udp;
        Ok(p)
    }
}

/// Lines of the child's stderr kept for an error message.
const STDERR_LINES: usize = 20;

/// What a test needs from the binary's ready line (`leasebox: ready hosted=1 addr=A ctl_port=P ... udp=U|none
/// ...`; other fields are ignored).
#[derive(Debug, PartialEq, Eq)]
struct Ready {
    addr: SocketAddr,
    udp: Option<SocketAddr>,
}

impl Ready {
    fn parse(line: &str) -> Result<Ready, String> {
        let field = |k: &str| {
            line.split(' ')
                .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .ok_or_else(|| format!("no {k}= in the ready line `{line}`"))
        };
        let ip = field("addr")?;
        let port = field("ctl_port")?;
        let addr = match (ip.parse::<std::net::IpAddr>(), port.parse::<u16>()) {
            (Ok(ip), Ok(port)) => SocketAddr::new(ip, port),
            _ => return Err(format!("addr={ip} ctl_port={port} in `{line}`")),
        };
        let udp = match field("udp")? {
            "none" => None,
            u => Some(u.parse().map_err(|_| format!("udp={u} in `{line}`"))?),
        };
        Ok(Ready { addr, udp })
    }
}

/// The principals' keys, by name.
struct Keys {
    tenants: Vec<(String, Key)>,
    admin: Option<Key>,
}

impl Keys {
    fn tenant(&self, name: &str) -> &Key {
        match self.tenants.iter().find(|(n, _)| n == name) {
            Some((_, k)) => k,
            None => panic!("the rig has no tenant `{name}` (Builder::tenant)"),
        }
    }

    fn admin(&self) -> &Key {
        self.admin.as_ref().expect("the rig has no admin key (Builder::admin)")
    }
}

/// A hosted appliance running in this process, stopped (with its model and threads) when dropped. Dereferences
/// to the [`Hosted`] for what the appliance offers tests (`hca()`, `with_leases`).
pub struct Rig {
    hosted: Option<Hosted>,
    keys: Keys,
}

impl Rig {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The control channel's address.
    pub fn addr(&self) -> SocketAddr {
        self.hosted().addr()
    }

    /// The model's RoCEv2 responder ([`Builder::model`], [`Builder::udp`]).
    pub fn udp(&self) -> Option<SocketAddr> {
        self.hosted().hca().and_then(|h| h.udp)
    }

    pub fn hosted(&self) -> &Hosted {
        self.hosted.as_ref().expect("a rig holds its appliance until it is dropped")
    }

    /// Tenant `name`'s key (its first, with [`Builder::tenant_keys`]). Panics if the rig has no such tenant.
    pub fn key(&self, name: &str) -> &Key {
        self.keys.tenant(name)
    }

    /// The admin's key. Panics if the rig has none.
    pub fn admin_key(&self) -> &Key {
        self.keys.admin()
    }

    /// Stops the appliance now (as dropping the rig does).
    pub fn stop(mut self) {
        if let Some(h) = self.hosted.take() {
            h.stop();
        }
    }
}

impl Deref for Rig {
    type Target = Hosted;
    fn deref(&self) -> &Hosted {
        self.hosted()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(h) = self.hosted.take() {
            h.stop();
        }
    }
}

/// The `leasebox-hosted` binary running as a child process ([`Builder::spawn`]), killed and reaped when dropped.
pub struct Process {
    child: Child,
    addr: SocketAddr,
    udp: Option<SocketAddr>,
    keys: Keys,
}

impl Process {
    /// The control channel's address, from the ready line.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model's RoCEv2 responder, from the ready line.
    pub fn udp(&self) -> Option<SocketAddr> {
        self.udp
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn key(&self, name: &str) -> &Key {
        self.keys.tenant(name)
    }

    pub fn admin_key(&self) -> &Key {
        self.keys.admin()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_hex_and_not_printed() {
        let (a, b) = (Key::random(), Key::random());
        assert_eq!(a.bytes().len(), Key::BYTES);
        assert_ne!(a, b);
        assert_eq!(Key::from_bytes([0u8, 0xab, 0xff]).hex(), "00abff");
        assert_eq!(a.hex().len(), 2 * Key::BYTES);
        assert_eq!(format!("{a:?}"), "Key(32 bytes)");
    }

    /// Each method's word is one the binary's parser accepts and gives the meaning the method names.
    #[test]
    fn the_builders_argv_is_what_the_binary_parses() {
        let demo = Key::random();
        let b = Rig::builder()
            .listen("127.0.0.1:7999")
            .model()
            .timing("zero")
            .tenant_with_key("demo", demo.clone())
            .tenant("other")
            .admin()
            .appliance("lb-a")
            .sessions(7)
            .credits(3)
            .heartbeat_ms(1500)
            .lease_pool_mib(16)
            .lease_grace_ms(25);
        let args = b.args();
        assert_eq!(args[..5], ["--listen", "127.0.0.1:7999", "--hca", "--udp", "127.0.0.1:0"]);
        assert!(args.contains(&format!("tenant=demo:{}", demo.hex())), "{args:?}");
        let cfg = b.config().unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:7999".parse().unwrap());
        assert!(cfg.hca);
        assert_eq!(cfg.udp.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(cfg.timing, mlx5_model::Timing::Zero);
        assert_eq!((cfg.limits.sessions, cfg.limits.credits, cfg.limits.heartbeat_ms), (7, 3, 1500));
        assert_eq!(cfg.appliance.as_deref(), Some("lb-a"));
        assert_eq!((cfg.lease.pool_mib, cfg.lease.grace_ms), (16, 25));
        assert_eq!(cfg.lease.tenants, 2, "both tenants reached the keyring's count");
    }

    #[test]
    fn defaults_rotation_raw_words_and_edits() {
        let b = Rig::builder();
        assert_eq!(b.args(), ["--listen", "127.0.0.1:0"]);
        let cfg = b.config().unwrap();
        assert!(!cfg.hca && cfg.udp.is_none());

        let (k0, k1) = (Key::random(), Key::from_bytes((0xf0..=0xffu8).collect::<Vec<u8>>()));
        let b = Rig::builder().tenant_keys("demo", &[(0, k0.clone()), (1, k1.clone())]).raw(&["--hca"]);
        let args = b.args();
        assert_eq!(args.last().map(String::as_str), Some("--hca"), "raw words come last");
        assert!(args.contains(&format!("tenant=demo:0/{},1/{}", k0.hex(), k1.hex())), "{args:?}");
        let cfg = b.edit(|c| c.limits.credits = 99).config().unwrap();
        assert!(cfg.hca);
        assert_eq!(cfg.limits.credits, 99);
    }

    #[test]
    fn bad_words_are_the_parsers_errors() {
        let e = Rig::builder().option("no_such_option", 1).config().err().unwrap_or_default();
        assert!(e.contains("no_such_option"), "{e}");
        let e = Rig::builder().timing("soon").config().err().unwrap_or_default();
        assert!(e.contains("--timing"), "{e}");
        let e = Rig::builder().edit(|_| {}).spawn(Path::new("/nonexistent"), Duration::ZERO).err().unwrap_or_default();
        assert!(e.contains("use start()"), "{e}");
        let e =
            Rig::builder().spawn(Path::new("/nonexistent/leasebox-hosted"), Duration::ZERO).err().unwrap_or_default();
        assert!(e.contains("starting /nonexistent/leasebox-hosted"), "{e}");
    }

    #[test]
    fn the_ready_line_gives_the_addresses() {
        let r = Ready::parse(
            "leasebox: ready hosted=1 addr=127.0.0.1 ctl_port=4000 sessions=16 hca=true udp=127.0.0.1:5000 verbs=none",
        )
        .unwrap();
        assert_eq!(r, Ready { addr: "127.0.0.1:4000".parse().unwrap(), udp: Some("127.0.0.1:5000".parse().unwrap()) });
        let r = Ready::parse("leasebox: ready hosted=1 addr=::1 ctl_port=1 hca=false udp=none").unwrap();
        assert_eq!(r.udp, None);
        assert!(Ready::parse("leasebox: ready addr=1.2.3.4 udp=none").unwrap_err().contains("no ctl_port="));
        assert!(Ready::parse("leasebox: ready addr=x ctl_port=1 udp=none").unwrap_err().contains("addr=x"));
    }

    #[test]
    fn a_rig_serves_and_its_drop_stops_it() {
        let rig = Rig::builder().tenant("demo").admin().start().unwrap();
        let addr = rig.addr();
        assert!(rig.udp().is_none() && rig.hca().is_none());
        assert_eq!(rig.key("demo").bytes().len(), Key::BYTES);
        assert_ne!(rig.key("demo"), rig.admin_key());
        assert!(std::net::TcpStream::connect(addr).is_ok(), "listening while the rig lives");
        drop(rig);
        assert!(std::net::TcpStream::connect(addr).is_err(), "the listener is closed once the rig is dropped");
    }
}
