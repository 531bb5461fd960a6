//! The registrar's configuration: flags, and appliances from flags or a file.
//!
//! An appliance is one line of words: its control address first, then `key=HEX` (the admin key), optionally
//! `rdma=ADDR` (where RDMA reaches it, advertised as is), `appliance=NAME` (its name, when it has one: named in
//! the registrar's HELLO and advertised for clients to name in theirs) and any `NAME=VALUE` (operator labels, e.g.
//! `zone=a rack=12`). In a file, one appliance per line; `#` starts a comment.

use std::collections::BTreeMap;
use std::time::Duration;

use leasebox_fleet::{EtcdUser, TlsFiles};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplianceSpec {
    pub control: String,
    pub admin_key: Vec<u8>,
    pub rdma: String,
    /// The appliance's name (`appliance=NAME`, its own `appliance=` option): the registrar's HELLO names it, and
    /// the advertisement carries it for clients. Empty: unnamed.
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl ApplianceSpec {
    pub fn parse(line: &str) -> Result<ApplianceSpec, String> {
        let mut words = line.split_whitespace();
        let control = words.next().ok_or("an empty appliance line")?.to_string();
        if !control.contains(':') || control.contains('=') {
            return Err(format!("appliance '{control}': the first word must be its control address HOST:PORT"));
        }
        let (mut key, mut rdma, mut name, mut labels) = (None, String::new(), String::new(), BTreeMap::new());
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| format!("appliance {control}: '{w}' is not NAME=VALUE"))?;
            match k {
                "key" => {
                    key = Some(leasebox_client::hex::decode(v).map_err(|e| format!("appliance {control}: key: {e}"))?)
                }
                "rdma" => rdma = v.to_string(),
                "appliance" if v.is_empty() || v.len() > leasebox_proto::MAX_NAME || v.contains('@') => {
                    return Err(format!(
                        "appliance {control}: appliance='{v}' (1 to {} bytes, no '@')",
                        leasebox_proto::MAX_NAME
                    ));
                }
                "appliance" => name = v.to_string(),
                _ if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                    return Err(format!("appliance {control}: label name '{k}' (letters, digits, _)"));
                }
                _ => {
                    labels.insert(k.to_string(), v.to_string());
                }
            }
        }
        let admin_key = key.ok_or_else(|| format!("appliance {control}: no key=HEX (its admin key)"))?;
        leasebox_proto::key::check_key(&admin_key).map_err(|e| format!("appliance {control}: admin {e}"))?;
        Ok(ApplianceSpec { control, admin_key, rdma, name, labels })
    }

    /// Every appliance in a file's text.
    pub fn parse_file(text: &str) -> Result<Vec<ApplianceSpec>, String> {
        text.lines()
            .enumerate()
            .filter_map(|(i, l)| {
                let l = l.split('#').next().unwrap_or("").trim();
                (!l.is_empty()).then(|| ApplianceSpec::parse(l).map_err(|e| format!("line {}: {e}", i + 1)))
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This registrar's name (the election's value; `registrar` in each advertisement).
    pub name: String,
    pub etcd: Vec<String>,
    /// TLS to etcd (`--etcd-cacert`, `--etcd-cert`, `--etcd-key`); `None`: plain HTTP.
    pub etcd_tls: Option<TlsFiles>,
    /// etcd authentication (`--etcd-user`, `--etcd-password-file`); `None`: no user.
    pub etcd_user: Option<EtcdUser>,
    pub appliances: Vec<ApplianceSpec>,
    /// How often each appliance is asked (1–2 s in production).
    pub poll: Duration,
    /// The advertisements' etcd lease TTL, seconds.
    pub ttl_s: i64,
    /// The election lease's TTL, seconds: how soon a standby takes over from a leader that died. Shorter than
    /// `ttl_s`, so a new leader rewrites the keys before the dead one's leases lapse.
    pub election_ttl_s: i64,
    /// Where `/metrics` is served (`None`: not served).
    pub metrics: Option<String>,
}

impl Config {
    pub fn new(name: &str, etcd: Vec<String>, appliances: Vec<ApplianceSpec>) -> Config {
        Config {
            name: name.to_string(),
            etcd,
            etcd_tls: None,
            etcd_user: None,
            appliances,
            poll: Duration::from_millis(1000),
            ttl_s: 10,
            election_ttl_s: 5,
            metrics: None,
        }
    }

    pub const USAGE: &'static str = "usage: leasebox-registrar --etcd [https://]HOST:PORT[,HOST:PORT...] \
        [--etcd-cacert CA.pem [--etcd-cert CERT.pem --etcd-key KEY.pem]] [--etcd-user NAME --etcd-password-file F] \
        (--appliance 'HOST:PORT key=HEX [rdma=ADDR] [label=value ...]' ... | --appliances FILE) \
        [--name NAME] [--metrics ADDR] [--poll-ms 1000] [--ttl-s 10] [--election-ttl-s 5]";

    pub fn from_args(args: &[String]) -> Result<Config, String> {
        let mut c = Config::new("", Vec::new(), Vec::new());
        let (mut ca, mut cert, mut key) = (None, None, None);
        let (mut user, mut password_file) = (None, None::<String>);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--etcd" => c.etcd.extend(val()?.split(',').map(|s| s.trim().to_string())),
                "--appliance" => c.appliances.push(ApplianceSpec::parse(&val()?)?),
                "--appliances" => {
                    let p = val()?;
                    let text = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
                    c.appliances.extend(ApplianceSpec::parse_file(&text).map_err(|e| format!("{p}: {e}"))?);
                }
                "--etcd-cacert" => ca = Some(val()?.into()),
                "--etcd-cert" => cert = Some(val()?.into()),
                "--etcd-key" => key = Some(val()?.into()),
                "--etcd-user" => user = Some(val()?),
                "--etcd-password-file" => password_file = Some(val()?),
                "--name" => c.name = val()?,
                "--metrics" => c.metrics = Some(val()?),
                "--poll-ms" => c.poll = Duration::from_millis(number(&val()?, 100, 60_000)?),
                "--ttl-s" => c.ttl_s = number(&val()?, 2, 3600)? as i64,
                "--election-ttl-s" => c.election_ttl_s = number(&val()?, 2, 3600)? as i64,
                other => return Err(format!("unknown argument '{other}'")),
            }
        }
        if c.etcd.is_empty() {
            return Err("no --etcd endpoint".into());
        }
        c.etcd_tls = TlsFiles::from_options(ca, cert, key)?;
        c.etcd_user = EtcdUser::from_options(user, password_file.as_deref().map(std::path::Path::new))?;
        if c.appliances.is_empty() {
            return Err("no appliance (--appliance or --appliances)".into());
        }
        if c.name.is_empty() {
            c.name = format!("registrar-{}", std::process::id());
        }
        Ok(c)
    }
}

fn number(v: &str, min: u64, max: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("'{v}' is not a number from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn appliance_lines() {
        let a = ApplianceSpec::parse(&format!("10.0.0.1:7470 key={KEY} rdma=10.0.1.1:4791 zone=a")).unwrap();
        assert_eq!(a.control, "10.0.0.1:7470");
        assert_eq!(a.admin_key.len(), 16);
        assert_eq!(a.rdma, "10.0.1.1:4791");
        assert_eq!(a.labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(a.name, "");
        let n = ApplianceSpec::parse(&format!("10.0.0.1:7470 key={KEY} appliance=mem-a")).unwrap();
        assert_eq!((n.name.as_str(), n.labels.len()), ("mem-a", 0));
        assert!(ApplianceSpec::parse(&format!("h:1 key={KEY} appliance=a@b")).unwrap_err().contains("appliance='a@b'"));
        assert!(ApplianceSpec::parse(&format!("h:1 key={KEY} appliance=")).unwrap_err().contains("1 to"));
        // The appliances' own key rule: a typed key is refused with the reason.
        let weak = ApplianceSpec::parse(&format!("h:1 key={}", "ab".repeat(16))).unwrap_err();
        assert!(weak.contains("one byte repeated") && weak.contains("random"), "{weak}");
        assert!(ApplianceSpec::parse("10.0.0.1:7470").unwrap_err().contains("no key"));
        assert!(ApplianceSpec::parse(&format!("key={KEY}")).unwrap_err().contains("control address"));
        assert!(ApplianceSpec::parse(&format!("h:1 key={KEY} bad-label=x")).unwrap_err().contains("label name"));
        assert!(ApplianceSpec::parse("h:1 key=0011").unwrap_err().contains("key is 2 bytes"));
        let file = format!("# fleet\n\nh:1 key={KEY}\nh:2 key={KEY} # second\n");
        assert_eq!(ApplianceSpec::parse_file(&file).unwrap().len(), 2);
        assert!(ApplianceSpec::parse_file("h:1\n").unwrap_err().starts_with("line 1:"));
    }

    #[test]
    fn flags() {
        let args: Vec<String> =
            ["--etcd", "127.0.0.1:2379", "--appliance", &format!("h:1 key={KEY}"), "--poll-ms", "1500", "--name", "r1"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let c = Config::from_args(&args).unwrap();
        assert_eq!((c.poll, c.ttl_s, c.name.as_str()), (Duration::from_millis(1500), 10, "r1"));
        assert!(Config::from_args(&args[2..]).unwrap_err().contains("--etcd"));
        assert!(Config::from_args(&args[..2]).unwrap_err().contains("no appliance"));
        assert_eq!(c.etcd_tls, None);
        let with = |extra: &[&str]| {
            let mut a = args.clone();
            a.extend(extra.iter().map(|s| s.to_string()));
            Config::from_args(&a)
        };
        let tls = with(&["--etcd-cacert", "ca.pem", "--etcd-cert", "c.pem", "--etcd-key", "k.pem"]).unwrap().etcd_tls;
        assert_eq!(tls, Some(TlsFiles { ca: "ca.pem".into(), cert: Some("c.pem".into()), key: Some("k.pem".into()) }));
        assert!(with(&["--etcd-cert", "c.pem"]).unwrap_err().contains("--etcd-cacert"));
        assert!(with(&["--etcd-user", "reg"]).unwrap_err().contains("--etcd-password-file"));
        assert!(
            with(&["--etcd-user", "reg", "--etcd-password-file", "/nonexistent/pw"])
                .unwrap_err()
                .contains("/nonexistent/pw")
        );
        assert!(Config::from_args(&["--poll-ms".to_string(), "5".to_string()]).unwrap_err().contains("100"));
    }
}
