//! The client configuration file: where the appliance is and which keys to use; and [`settings`], which
//! combines it with the flags.
//!
//! ```text
//! # written by `cargo xtask run`
//! addr = 127.0.0.1:7470
//! tenant = demo
//! key = 5f0c…            (hex, the tenant's key)
//! admin_key = 9a41…      (hex, the admin key)
//! ```
//!
//! Default path: `$XDG_CONFIG_HOME/leasebox/leasectl.conf`, else `$HOME/.config/leasebox/leasectl.conf`;
//! `LEASECTL_CONFIG` overrides it and `--config PATH` overrides both. The file holds secrets: it is written
//! with mode 0600.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::args::Global;
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
}

impl std::fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |k: &Option<String>| k.as_ref().map(|_| "<set>");
        f.debug_struct("FileConfig")
            .field("addr", &self.addr)
            .field("tenant", &self.tenant)
            .field("key", &secret(&self.key))
            .field("admin_key", &secret(&self.admin_key))
            .finish()
    }
}

impl FileConfig {
    /// Parses `key = value` lines; `#` starts a comment; blank lines are ignored. Unknown keys and repeated
    /// keys are errors (with the line number), so a typo never silently falls back to a default.
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
                _ => return Err(format!("line {n}: unknown key `{k}` (known: addr, tenant, key, admin_key)")),
            };
            if slot.replace(v.to_string()).is_some() {
                return Err(format!("line {n}: `{k}` given twice"));
            }
        }
        Ok(c)
    }

    /// The file's text (what [`FileConfig::write`] stores).
    pub fn render(&self, comment: &str) -> String {
        let mut s = String::new();
        for l in comment.lines() {
            s.push_str(&format!("# {l}\n"));
        }
        for (k, v) in
            [("addr", &self.addr), ("tenant", &self.tenant), ("key", &self.key), ("admin_key", &self.admin_key)]
        {
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

/// Combines flags, the configuration file and defaults. `env` looks up environment variables.
pub fn settings(g: &Global, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, String> {
    let (file, path) = match &g.config {
        Some(p) => (FileConfig::load(p)?, Some(p.clone())),
        None => match default_path(env) {
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
            admin_key: None,
        };
        let text = c.render("written by a test\nsecond line");
        assert!(text.starts_with("# written by a test\n# second line\n"));
        assert_eq!(FileConfig::parse(&text).unwrap(), c);
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("0011") && dbg.contains("<set>"));
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
