//! How a store is configured (docs/kv.md, "Configuration"): a connection URL, `LEASEBOX_*` environment variables,
//! and the tenant's key read from a file (never written in the URL, where it would end up in logs and process
//! listings).
//!
//! - `leasebox://TENANT@HOST:PORT[,HOST:PORT...][?rdma=ADDR:PORT[,...]&requester=SPEC[,SPEC...]]`: those
//!   appliances; `rdma` the software requester's peers (one, or one per appliance), `requester` a spec of
//!   [`crate::REQUESTER_SPECS`] (one, or one per appliance).
//! - `leasebox+etcd://HOST:PORT[,HOST:PORT...][/leasebox/v1]?tenant=TENANT[&requester=SPEC]`: the appliances the
//!   fleet's etcd advertises (docs/fleet.md; the key prefix is the fleet's own, `/leasebox/v1/`).
//!
//! An argument wins over its environment variable, which wins over the default.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the appliances are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// These control addresses (`HOST:PORT`).
    Appliances(Vec<String>),
    /// The appliances these etcd endpoints advertise.
    Etcd(Vec<String>),
}

/// A parsed connection URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    pub target: Target,
    pub tenant: String,
    /// The software requester's peers (`rdma=`).
    pub rdma: Vec<String>,
    /// Requester specs (`requester=`).
    pub requester: Vec<String>,
}

fn list(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(str::to_string).collect()
}

impl StoreUrl {
    /// Parses `url`; the error says what is wrong.
    pub fn parse(url: &str) -> Result<StoreUrl, String> {
        let url = url.trim();
        let bad = |why: &str| {
            format!(
                "store URL '{url}': {why} (give leasebox://TENANT@HOST:PORT[,HOST:PORT...] or \
                 leasebox+etcd://HOST:PORT[,...]?tenant=TENANT)"
            )
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut tenant_q = None;
        let (mut rdma, mut requester) = (Vec::new(), Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| bad(&format!("query item '{pair}' is not KEY=VALUE")))?;
            match k {
                "tenant" => tenant_q = Some(v.to_string()),
                "rdma" => rdma = list(v),
                "requester" => requester = list(v),
                "key" => return Err(bad("a key does not go in the URL: give key_file or LEASEBOX_KEY_FILE")),
                _ => return Err(bad(&format!("unknown query key '{k}' (tenant, rdma, requester)"))),
            }
        }
        match scheme {
            "leasebox" => {
                let (tenant, hosts) = rest.split_once('@').ok_or_else(|| bad("no TENANT@"))?;
                if tenant.contains(':') {
                    return Err(bad("a key does not go in the URL: give key_file or LEASEBOX_KEY_FILE"));
                }
                if tenant.is_empty() {
                    return Err(bad("empty tenant"));
                }
                if tenant_q.is_some() {
                    return Err(bad("the tenant is given twice"));
                }
                let hosts = list(hosts.trim_end_matches('/'));
                if hosts.is_empty() {
                    return Err(bad("no HOST:PORT"));
                }
                if let Some(h) = hosts.iter().find(|h| !h.contains(':') || h.contains('/')) {
                    return Err(bad(&format!("'{h}' is not HOST:PORT")));
                }
                Ok(StoreUrl { target: Target::Appliances(hosts), tenant: tenant.to_string(), rdma, requester })
            }
            "leasebox+etcd" => {
                if rest.contains('@') {
                    return Err(bad("the tenant goes in ?tenant= for etcd"));
                }
                let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                let prefix = prefix.trim_matches('/');
                if !prefix.is_empty() && prefix != "leasebox/v1" {
                    return Err(bad(&format!("prefix '/{prefix}': the fleet's keys are under /leasebox/v1/")));
                }
                let hosts = list(hosts);
                if hosts.is_empty() {
                    return Err(bad("no etcd HOST:PORT"));
                }
                let tenant = tenant_q.filter(|t| !t.is_empty()).ok_or_else(|| bad("no ?tenant="))?;
                if !rdma.is_empty() {
                    return Err(bad("rdma= is for appliance lists: etcd advertises each appliance's"));
                }
                Ok(StoreUrl { target: Target::Etcd(hosts), tenant, rdma, requester })
            }
            other => Err(bad(&format!("unknown scheme '{other}'"))),
        }
    }
}

/// What a store is opened with; [`StoreOptions::resolve`] fills it from arguments, the environment and defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    pub url: StoreUrl,
    /// The tenant's key (bytes).
    pub key: Vec<u8>,
    /// The largest value (bytes); values are placed in slots of powers of two up to it.
    pub max_value_size: u64,
    /// Bytes per lease.
    pub lease_size: u64,
    /// Leases taken at open (and kept: a lost one is replaced).
    pub leases: usize,
    /// Copy hot keys to other appliances when one drains.
    pub migrate_on_drain: bool,
    /// Every network wait (and each call's deadline).
    pub timeout: Duration,
}

impl StoreConfig {
    /// A configuration for [`super::Store::connect`] and [`super::Store::with_client`], which take the
    /// appliances and credentials themselves: these sizes, no migration, the default timeout.
    pub fn sized(max_value_size: u64, lease_size: u64, leases: usize) -> StoreConfig {
        StoreConfig {
            url: StoreUrl {
                target: Target::Appliances(Vec::new()),
                tenant: String::new(),
                rdma: Vec::new(),
                requester: Vec::new(),
            },
            key: Vec::new(),
            max_value_size,
            lease_size,
            leases,
            migrate_on_drain: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// The defaults.
pub const DEFAULT_MAX_VALUE: u64 = 1 << 20;
pub const DEFAULT_LEASE_SIZE: u64 = 64 << 20;
pub const DEFAULT_LEASES: usize = 2;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The arguments a program gives (each `None`: the environment's, else the default).
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    pub url: Option<String>,
    pub key_file: Option<PathBuf>,
    pub max_value_size: Option<u64>,
    pub lease_size: Option<u64>,
    pub leases: Option<usize>,
    pub migrate_on_drain: Option<bool>,
    /// Overrides the URL's `requester=` (one spec, or one per appliance).
    pub requester: Option<Vec<String>>,
    pub timeout: Option<Duration>,
    /// Read `LEASEBOX_*` variables for what is not given.
    pub env: bool,
}

/// The environment variables read.
pub const ENV_VARS: [&str; 8] = [
    "LEASEBOX_URL",
    "LEASEBOX_KEY_FILE",
    "LEASEBOX_MAX_VALUE_SIZE",
    "LEASEBOX_LEASE_SIZE",
    "LEASEBOX_LEASES",
    "LEASEBOX_MIGRATE_ON_DRAIN",
    "LEASEBOX_REQUESTER",
    "LEASEBOX_TIMEOUT_MS",
];

fn number(name: &str, v: &str) -> Result<u64, String> {
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    };
    parsed.ok_or_else(|| format!("{name}='{v}' is not a number"))
}

/// Reads the tenant's key from `path`: hex text (whitespace around it ignored).
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("key file {}: {e}", path.display()))?;
    let key = crate::hex::decode(text.trim()).map_err(|e| format!("key file {}: {e}", path.display()))?;
    if key.is_empty() {
        return Err(format!("key file {}: empty", path.display()));
    }
    leasebox_proto::key::check_key(&key).map_err(|e| format!("key file {}: {e}", path.display()))?;
    Ok(key)
}

impl StoreOptions {
    /// The configuration, taking what is not given from `getenv` (when `env`) and the defaults.
    pub fn resolve(&self, getenv: impl Fn(&str) -> Option<String>) -> Result<StoreConfig, String> {
        let env = |name: &str| if self.env { getenv(name).filter(|v| !v.trim().is_empty()) } else { None };
        let url = self.url.clone().or_else(|| env("LEASEBOX_URL")).ok_or("no URL: give url or set LEASEBOX_URL")?;
        let mut url = StoreUrl::parse(&url)?;
        let key_file = self
            .key_file
            .clone()
            .or_else(|| env("LEASEBOX_KEY_FILE").map(PathBuf::from))
            .ok_or("no key: give key_file or set LEASEBOX_KEY_FILE")?;
        let key = read_key_file(&key_file)?;
        let num = |given: Option<u64>, name: &str, default: u64| -> Result<u64, String> {
            match given {
                Some(v) => Ok(v),
                None => env(name).map(|v| number(name, &v)).transpose().map(|v| v.unwrap_or(default)),
            }
        };
        let max_value_size = num(self.max_value_size, "LEASEBOX_MAX_VALUE_SIZE", DEFAULT_MAX_VALUE)?;
        let lease_size = num(self.lease_size, "LEASEBOX_LEASE_SIZE", DEFAULT_LEASE_SIZE)?;
        let leases = num(self.leases.map(|l| l as u64), "LEASEBOX_LEASES", DEFAULT_LEASES as u64)? as usize;
        let timeout_ms = num(
            self.timeout.map(|t| t.as_millis().min(u64::MAX as u128) as u64),
            "LEASEBOX_TIMEOUT_MS",
            DEFAULT_TIMEOUT.as_millis() as u64,
        )?;
        let migrate_on_drain = match self.migrate_on_drain {
            Some(b) => b,
            None => match env("LEASEBOX_MIGRATE_ON_DRAIN").as_deref().map(str::trim) {
                None | Some("0" | "false" | "no" | "off") => false,
                Some("1" | "true" | "yes" | "on") => true,
                Some(v) => return Err(format!("LEASEBOX_MIGRATE_ON_DRAIN='{v}' is not 0/1/true/false")),
            },
        };
        if let Some(r) = self.requester.clone().or_else(|| env("LEASEBOX_REQUESTER").map(|v| list(&v))) {
            url.requester = r;
        }
        if max_value_size == 0 {
            return Err("max_value_size must be at least 1 byte".into());
        }
        if max_value_size > 1 << 30 {
            return Err("max_value_size is at most 1 GiB".into());
        }
        let page = max_value_size.max(super::slab::MIN_SLOT).next_power_of_two();
        if lease_size < page {
            return Err(format!(
                "lease_size {lease_size} is smaller than one slab page ({page} bytes: max_value_size rounded up to \
                 a power of two)"
            ));
        }
        if !(1..=1024).contains(&leases) {
            return Err(format!("leases must be 1 to 1024 (got {leases})"));
        }
        if timeout_ms == 0 {
            return Err("timeout must be positive".into());
        }
        Ok(StoreConfig {
            url,
            key,
            max_value_size,
            lease_size,
            leases,
            migrate_on_drain,
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appliance_urls_parse() {
        let u =
            StoreUrl::parse("leasebox://demo@10.0.0.1:7470, 10.0.0.2:7470?rdma=10.0.0.1:4791&requester=soft").unwrap();
        assert_eq!(u.target, Target::Appliances(vec!["10.0.0.1:7470".into(), "10.0.0.2:7470".into()]));
        assert_eq!((u.tenant.as_str(), u.rdma.len(), u.requester.len()), ("demo", 1, 1));
        let e = StoreUrl::parse("leasebox+etcd://127.0.0.1:2379,127.0.0.1:2380/leasebox/v1?tenant=t").unwrap();
        assert_eq!(e.target, Target::Etcd(vec!["127.0.0.1:2379".into(), "127.0.0.1:2380".into()]));
        assert_eq!(e.tenant, "t");
        assert!(StoreUrl::parse("leasebox+etcd://127.0.0.1:2379?tenant=t").is_ok());
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let err = |u: &str| StoreUrl::parse(u).unwrap_err();
        assert!(err("demo@h:1").contains("no scheme"));
        assert!(err("leasebox://h:1").contains("no TENANT@"));
        assert!(err("leasebox://demo:00ff@h:1").contains("a key does not go in the URL"));
        assert!(err("leasebox://demo@h:1?key=00").contains("a key does not go in the URL"));
        assert!(err("leasebox://demo@h").contains("'h' is not HOST:PORT"));
        assert!(err("leasebox://@h:1").contains("empty tenant"));
        assert!(err("leasebox://demo@h:1?x=1").contains("unknown query key 'x'"));
        assert!(err("leasebox+etcd://h:1").contains("no ?tenant="));
        assert!(err("leasebox+etcd://h:1/other?tenant=t").contains("/leasebox/v1/"));
        assert!(err("redis://h:1").contains("unknown scheme 'redis'"));
    }

    fn key_file(dir: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("leasebox-kv-config-{dir}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("key");
        std::fs::write(&p, "00112233445566778899aabbccddeeff\n").unwrap();
        p
    }

    #[test]
    fn arguments_win_over_the_environment_which_wins_over_defaults() {
        let kf = key_file("env");
        let vars = |name: &str| -> Option<String> {
            match name {
                "LEASEBOX_URL" => Some("leasebox://env@h:1".into()),
                "LEASEBOX_KEY_FILE" => Some(kf.display().to_string()),
                "LEASEBOX_LEASES" => Some("3".into()),
                "LEASEBOX_MAX_VALUE_SIZE" => Some("0x10000".into()),
                "LEASEBOX_MIGRATE_ON_DRAIN" => Some("true".into()),
                "LEASEBOX_REQUESTER" => Some("soft:127.0.0.1:9".into()),
                _ => None,
            }
        };
        let c = StoreOptions { env: true, ..Default::default() }.resolve(vars).unwrap();
        assert_eq!(c.url.tenant, "env");
        assert_eq!(c.key.len(), 16);
        assert_eq!((c.leases, c.max_value_size, c.migrate_on_drain), (3, 65536, true));
        assert_eq!(c.url.requester, vec!["soft:127.0.0.1:9".to_string()]);
        assert_eq!((c.lease_size, c.timeout), (DEFAULT_LEASE_SIZE, DEFAULT_TIMEOUT));
        let given = StoreOptions {
            url: Some("leasebox://arg@h:2".into()),
            leases: Some(1),
            migrate_on_drain: Some(false),
            env: true,
            ..Default::default()
        };
        let c = given.resolve(vars).unwrap();
        assert_eq!((c.url.tenant.as_str(), c.leases, c.migrate_on_drain), ("arg", 1, false));
        // env=false: nothing is read from the environment.
        let e = StoreOptions { env: false, ..Default::default() }.resolve(vars).unwrap_err();
        assert!(e.contains("no URL"), "{e}");
    }

    #[test]
    fn bad_settings_are_refused() {
        let kf = key_file("bad");
        let base = || StoreOptions {
            url: Some("leasebox://d@h:1".into()),
            key_file: Some(kf.clone()),
            env: false,
            ..Default::default()
        };
        let none = |_: &str| None;
        assert!(base().resolve(none).is_ok());
        let e = StoreOptions { lease_size: Some(4096), ..base() }.resolve(none).unwrap_err();
        assert!(e.contains("smaller than one slab page"), "{e}");
        let e = StoreOptions { leases: Some(0), ..base() }.resolve(none).unwrap_err();
        assert!(e.contains("leases must be 1 to 1024"), "{e}");
        let e = StoreOptions { key_file: Some("/nonexistent/key".into()), ..base() }.resolve(none).unwrap_err();
        assert!(e.starts_with("key file /nonexistent/key"), "{e}");
        let e = StoreOptions { max_value_size: Some(0), ..base() }.resolve(none).unwrap_err();
        assert!(e.contains("at least 1 byte"), "{e}");
        let env_bad = |n: &str| (n == "LEASEBOX_LEASES").then(|| "many".to_string());
        let e = StoreOptions { env: true, ..base() }.resolve(env_bad).unwrap_err();
        assert!(e.contains("LEASEBOX_LEASES='many'"), "{e}");
    }
}
