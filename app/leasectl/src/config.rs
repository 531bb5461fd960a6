//! The client configuration file: where the appliance is and which keys to use; and [`settings`], which
//! combines it with the flags.
//!
//! ```text
//! # written by `cargo xtask run`
//! addr = 127.0.0.1:7470
//! tenant = demo
//! key = 5f0c…            (hex, the tenant's key)
//! admin_key = 9a41…      (hex, the admin key)
//! # the RDMA cable of `verify --backend soft` (each optional; `verify`'s flags override them)
//! rdma_peer = 127.0.0.1:4791       (where frames go: the model's UDP socket, or QEMU's socket netdev `localaddr`)
//! rdma_bind = 127.0.0.1:4792       (our UDP socket: QEMU's socket netdev `udp=` sends to a fixed address)
//! rdma_local_ip = 10.0.2.100       (our IPv4 in frames and our GID)
//! rdma_local_mac = 02:4c:42:00:00:01
//! rdma_resolve = arp               (arp: the appliance's MAC by ARP; endpoint: ALLOC's answer, else a placeholder)
//! rdma_remote_mac = 52:54:00:12:34:56   (the appliance's MAC, given: no ARP)
//! ```
//!
//! Default path: `$XDG_CONFIG_HOME/leasebox/leasectl.conf`, else `$HOME/.config/leasebox/leasectl.conf`;
//! `LEASECTL_CONFIG` overrides it and `--config PATH` overrides both. The file holds secrets: it is written
//! with mode 0600.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::args::{Global, parse_mac};
use crate::client::{Credentials, DEFAULT_PORT, Timeouts};
use crate::hex;

/// Environment variable naming the configuration file.
pub const ENV_CONFIG: &str = "LEASECTL_CONFIG";

/// The file's settings; every one is optional (flags may supply them).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileConfig {
    pub addr: Option<String>,
    pub tenant: Option<String>,
    /// The tenant's key, hex.
    pub key: Option<String>,
    /// The admin key, hex.
    pub admin_key: Option<String>,
    /// `verify`'s RDMA cable (see [`Rdma`]), as written; [`FileConfig::parse`] checks the values.
    pub rdma_peer: Option<String>,
    pub rdma_bind: Option<String>,
    pub rdma_local_ip: Option<String>,
    pub rdma_local_mac: Option<String>,
    pub rdma_resolve: Option<String>,
    pub rdma_remote_mac: Option<String>,
}

/// How the appliance's RDMA MAC is learned, as `rdma_resolve` / `verify --resolve` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveKind {
    /// ARP on the cable (an Ethernet segment: the QEMU hub).
    Arp,
    /// ALLOC's answer, else a placeholder (the model's point-to-point socket).
    Endpoint,
}

impl ResolveKind {
    pub fn parse(v: &str) -> Result<ResolveKind, String> {
        match v {
            "arp" => Ok(ResolveKind::Arp),
            "endpoint" => Ok(ResolveKind::Endpoint),
            _ => Err(format!("`{v}` is not arp or endpoint")),
        }
    }
}

/// The file's RDMA cable settings, typed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rdma {
    pub peer: Option<SocketAddr>,
    pub bind: Option<SocketAddr>,
    pub local_ip: Option<Ipv4Addr>,
    pub local_mac: Option<[u8; 6]>,
    pub resolve: Option<ResolveKind>,
    pub remote_mac: Option<[u8; 6]>,
}

/// The keys [`FileConfig::parse`] knows, in the order [`FileConfig::render`] writes them.
const KEYS: &str = "addr, tenant, key, admin_key, rdma_peer, rdma_bind, rdma_local_ip, rdma_local_mac, rdma_resolve, \
                    rdma_remote_mac";

fn socket_addr(v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| format!("`{v}` is not ADDR:PORT (e.g. 127.0.0.1:4791)"))
}

fn ipv4(v: &str) -> Result<Ipv4Addr, String> {
    v.parse().map_err(|_| format!("`{v}` is not an IPv4 address"))
}

fn mac(v: &str) -> Result<[u8; 6], String> {
    parse_mac(v).map_err(|e| format!("`{v}` {e}"))
}

impl std::fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |k: &Option<String>| k.as_ref().map(|_| "<set>");
        f.debug_struct("FileConfig")
            .field("addr", &self.addr)
            .field("tenant", &self.tenant)
            .field("key", &secret(&self.key))
            .field("admin_key", &secret(&self.admin_key))
            .field("rdma_peer", &self.rdma_peer)
            .field("rdma_bind", &self.rdma_bind)
            .field("rdma_local_ip", &self.rdma_local_ip)
            .field("rdma_local_mac", &self.rdma_local_mac)
            .field("rdma_resolve", &self.rdma_resolve)
            .field("rdma_remote_mac", &self.rdma_remote_mac)
            .finish()
    }
}

impl FileConfig {
    /// Parses `key = value` lines; `#` starts a comment; blank lines are ignored. Unknown keys, repeated keys
    /// and malformed `rdma_*` values are errors (with the line number), so a typo never silently falls back
    /// to a default.
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        let mut c = FileConfig::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let n = i + 1;
            let (k, v) = line.split_once('=').ok_or_else(|| format!("line {n}: expected `key = value`"))?;
            let (k, v) = (k.trim(), v.trim());
            if v.is_empty() {
                return Err(format!("line {n}: `{k}` has no value"));
            }
            let slot = match k {
                "addr" => &mut c.addr,
                "tenant" => &mut c.tenant,
                "key" => &mut c.key,
                "admin_key" => &mut c.admin_key,
                "rdma_peer" => &mut c.rdma_peer,
                "rdma_bind" => &mut c.rdma_bind,
                "rdma_local_ip" => &mut c.rdma_local_ip,
                "rdma_local_mac" => &mut c.rdma_local_mac,
                "rdma_resolve" => &mut c.rdma_resolve,
                "rdma_remote_mac" => &mut c.rdma_remote_mac,
                _ => return Err(format!("line {n}: unknown key `{k}` (known: {KEYS})")),
            };
            if slot.replace(v.to_string()).is_some() {
                return Err(format!("line {n}: `{k}` given twice"));
            }
            let check = match k {
                "rdma_peer" | "rdma_bind" => socket_addr(v).map(drop),
                "rdma_local_ip" => ipv4(v).map(drop),
                "rdma_local_mac" | "rdma_remote_mac" => mac(v).map(drop),
                "rdma_resolve" => ResolveKind::parse(v).map(drop),
                _ => Ok(()),
            };
            check.map_err(|e| format!("line {n}: {k}: {e}"))?;
        }
        c.rdma()?;
        Ok(c)
    }

    /// The RDMA cable settings, typed. `rdma_resolve = arp` and `rdma_remote_mac` contradict each other.
    pub fn rdma(&self) -> Result<Rdma, String> {
        fn opt<T>(k: &str, v: &Option<String>, f: fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
            v.as_deref().map(f).transpose().map_err(|e| format!("{k}: {e}"))
        }
        let r = Rdma {
            peer: opt("rdma_peer", &self.rdma_peer, socket_addr)?,
            bind: opt("rdma_bind", &self.rdma_bind, socket_addr)?,
            local_ip: opt("rdma_local_ip", &self.rdma_local_ip, ipv4)?,
            local_mac: opt("rdma_local_mac", &self.rdma_local_mac, mac)?,
            resolve: opt("rdma_resolve", &self.rdma_resolve, ResolveKind::parse)?,
            remote_mac: opt("rdma_remote_mac", &self.rdma_remote_mac, mac)?,
        };
        if r.resolve == Some(ResolveKind::Arp) && r.remote_mac.is_some() {
            return Err("rdma_resolve = arp and rdma_remote_mac contradict each other: keep one".into());
        }
        Ok(r)
    }

    /// The file's text (what [`FileConfig::write`] stores).
    pub fn render(&self, comment: &str) -> String {
        let mut s = String::new();
        for l in comment.lines() {
            s.push_str(&format!("# {l}\n"));
        }
        for (k, v) in [
            ("addr", &self.addr),
            ("tenant", &self.tenant),
            ("key", &self.key),
            ("admin_key", &self.admin_key),
            ("rdma_peer", &self.rdma_peer),
            ("rdma_bind", &self.rdma_bind),
            ("rdma_local_ip", &self.rdma_local_ip),
            ("rdma_local_mac", &self.rdma_local_mac),
            ("rdma_resolve", &self.rdma_resolve),
            ("rdma_remote_mac", &self.rdma_remote_mac),
        ] {
            if let Some(v) = v {
                s.push_str(&format!("{k} = {v}\n"));
            }
        }
        s
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<FileConfig, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        FileConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes the file with mode 0600 (creating its directory), replacing any previous one. The mode is set
    /// before any secret is written, also when the file already existed.
    pub fn write(&self, path: &Path, comment: &str) -> Result<(), String> {
        let err = |e: std::io::Error| format!("{}: {e}", path.display());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(err)?;
        }
        let mut f =
            fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(err)?;
        f.set_permissions(fs::Permissions::from_mode(0o600)).map_err(err)?;
        f.write_all(self.render(comment).as_bytes()).map_err(err)?;
        Ok(())
    }
}

/// The default configuration path from the environment (`LEASECTL_CONFIG`, `XDG_CONFIG_HOME`, `HOME`), or
/// `None` when none of them is set. `env` looks a variable up (the process environment in `leasectl`).
pub fn default_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(p) = set(ENV_CONFIG) {
        return Some(PathBuf::from(p));
    }
    let base = match set("XDG_CONFIG_HOME") {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(set("HOME")?).join(".config"),
    };
    Some(base.join("leasebox").join("leasectl.conf"))
}

/// Where to connect and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub addr: String,
    pub who: Credentials,
    pub timeouts: Timeouts,
}

/// The configuration file `--config` or the environment names (empty when the default one does not exist),
/// and its path.
pub fn file(g: &Global, env: &dyn Fn(&str) -> Option<String>) -> Result<(FileConfig, Option<PathBuf>), String> {
    Ok(match &g.config {
        Some(p) => (FileConfig::load(p)?, Some(p.clone())),
        None => match default_path(env) {
            Some(p) if p.exists() => (FileConfig::load(&p)?, Some(p)),
            other => (FileConfig::default(), other),
        },
    })
}

/// Combines flags, the configuration file and defaults. `env` looks up environment variables.
pub fn settings(g: &Global, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, String> {
    let (file, path) = file(g, env)?;
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
    // The appliance's name rides on the principal's (`NAME@APPLIANCE`, the client library's grammar).
    let name = match &g.appliance {
        Some(a) => format!("{name}@{a}"),
        None => name,
    };
    let key = hex::decode(&key_hex).map_err(|e| format!("key: {e}"))?;
    leasebox_proto::key::check_key(&key).map_err(|e| format!("key: {e}"))?;
    let timeouts = g.timeout.map_or_else(Timeouts::default, Timeouts::all);
    Ok(Settings { addr, who: Credentials { name, key }, timeouts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn parses_keys_comments_and_blank_lines() {
        let c = FileConfig::parse(
            "# leasectl\n\naddr = 127.0.0.1:7470\ntenant=demo   # the tenant\n  key = 00ff \nadmin_key = ab\n",
        )
        .unwrap();
        assert_eq!(c.addr.as_deref(), Some("127.0.0.1:7470"));
        assert_eq!(c.tenant.as_deref(), Some("demo"));
        assert_eq!(c.key.as_deref(), Some("00ff"));
        assert_eq!(c.admin_key.as_deref(), Some("ab"));
        assert_eq!(FileConfig::parse("").unwrap(), FileConfig::default());
    }

    #[test]
    fn errors_name_the_line() {
        assert!(FileConfig::parse("addr 1.2.3.4:5").unwrap_err().contains("line 1"));
        assert!(FileConfig::parse("\nport = 5").unwrap_err().contains("line 2: unknown key `port`"));
        assert!(FileConfig::parse("key =").unwrap_err().contains("no value"));
        assert!(FileConfig::parse("key = a\nkey = b").unwrap_err().contains("line 2: `key` given twice"));
    }

    #[test]
    fn render_parses_back_and_hides_secrets_in_debug() {
        let c = FileConfig {
            addr: Some("127.0.0.1:7471".into()),
            tenant: Some("demo".into()),
            key: Some("0011".into()),
            rdma_peer: Some("127.0.0.1:4791".into()),
            rdma_resolve: Some("arp".into()),
            ..FileConfig::default()
        };
        let text = c.render("written by a test\nsecond line");
        assert!(text.starts_with("# written by a test\n# second line\n"));
        assert_eq!(FileConfig::parse(&text).unwrap(), c);
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("0011") && dbg.contains("<set>"));
    }

    #[test]
    fn rdma_keys_parse_typed_and_bad_values_name_the_line() {
        let c = FileConfig::parse(
            "rdma_peer = 127.0.0.1:40001\nrdma_bind = 127.0.0.1:40002\nrdma_local_ip = 10.0.2.100\n\
             rdma_local_mac = 02:4c:42:00:00:09\nrdma_resolve = arp\n",
        )
        .unwrap();
        let r = c.rdma().unwrap();
        assert_eq!(r.peer, Some("127.0.0.1:40001".parse().unwrap()));
        assert_eq!(r.bind, Some("127.0.0.1:40002".parse().unwrap()));
        assert_eq!(r.local_ip, Some(Ipv4Addr::new(10, 0, 2, 100)));
        assert_eq!(r.local_mac, Some([0x02, 0x4C, 0x42, 0, 0, 9]));
        assert_eq!((r.resolve, r.remote_mac), (Some(ResolveKind::Arp), None));
        let r = FileConfig::parse("rdma_resolve = endpoint\nrdma_remote_mac = 52:54:00:12:34:56").unwrap().rdma();
        assert_eq!(r.unwrap().remote_mac, Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert_eq!(FileConfig::default().rdma().unwrap(), Rdma::default());
        let err = |t: &str| FileConfig::parse(t).unwrap_err();
        assert!(err("\nrdma_peer = localhost").contains("line 2: rdma_peer: `localhost` is not ADDR:PORT"));
        assert!(err("rdma_bind = 127.0.0.1").contains("line 1: rdma_bind"));
        assert!(err("rdma_local_ip = ::1").contains("rdma_local_ip: `::1` is not an IPv4 address"));
        assert!(err("rdma_local_mac = 02:00").contains("rdma_local_mac: `02:00` needs six hex bytes"));
        assert!(err("rdma_resolve = rarp").contains("rdma_resolve: `rarp` is not arp or endpoint"));
        assert!(err("rdma_resolve = arp\nrdma_remote_mac = 02:00:00:00:00:01").contains("contradict"));
        assert!(err("rdma_mac = 02:00:00:00:00:01").contains("known: addr, tenant, key, admin_key, rdma_peer"));
    }

    #[test]
    fn default_path_precedence() {
        let env = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            move |k: &str| m.get(k).cloned()
        };
        assert_eq!(default_path(env(&[])), None);
        assert_eq!(default_path(env(&[("HOME", "/h")])), Some("/h/.config/leasebox/leasectl.conf".into()));
        assert_eq!(
            default_path(env(&[("HOME", "/h"), ("XDG_CONFIG_HOME", "/x")])),
            Some("/x/leasebox/leasectl.conf".into())
        );
        assert_eq!(
            default_path(env(&[("HOME", "/h"), ("XDG_CONFIG_HOME", ""), (ENV_CONFIG, "/c.conf")])),
            Some("/c.conf".into())
        );
        assert_eq!(
            default_path(env(&[("HOME", "/h"), ("XDG_CONFIG_HOME", "")])),
            Some("/h/.config/leasebox/leasectl.conf".into())
        );
    }

    #[test]
    fn written_with_mode_0600() {
        let dir = std::env::temp_dir().join(format!("leasectl-conf-{}", std::process::id()));
        let path = dir.join("sub/leasectl.conf");
        // A pre-existing world-readable file is tightened too.
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let c = FileConfig { key: Some("aa".into()), ..FileConfig::default() };
        c.write(&path, "test").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(FileConfig::load(&path).unwrap(), c);
        fs::remove_dir_all(&dir).unwrap();
    }
}
