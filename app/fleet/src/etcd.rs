//! A blocking client for etcd v3's JSON gateway (etcd 3.4 serves it on every client URL under `/v3/`, and under
//! `/v3beta/` for older clients). Requests are the gRPC messages in protobuf's JSON mapping: `bytes` fields
//! (keys, values, election names) in base64, 64-bit integers as strings (accepted as numbers too).
//!
//! Endpoints are `HOST:PORT`, plain HTTP, or over TLS when the client is made with [`TlsFiles`]
//! ([`Etcd::with_tls`]; `https://` endpoints need them, and with them an `http://` endpoint is refused rather
//! than spoken to in the clear).
//!
//! A client made with an [`EtcdUser`] ([`Etcd::with_user`]) authenticates (`/v3/auth/authenticate`) before its
//! first request and sends the token with every request; a token etcd no longer takes (expired, or another
//! member's) is replaced once and the request sent again. Against a cluster without authentication the user
//! is not needed and no token is sent, as etcd's own client does.
//!
//! Each call tries the endpoints in turn, starting with the one that answered last; only when none answers is it
//! [`EtcdError::Unreachable`]. What etcd refuses is [`EtcdError::Refused`] (its status and message).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::ClientConfig;
use serde_json::{Value, json};

use crate::base64;
use crate::http;
use crate::tls::TlsFiles;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// No endpoint could be reached or answered in time (each endpoint's reason).
    Unreachable(String),
    /// etcd answered with an error.
    Refused { status: u16, message: String },
    /// The answer was not what the gateway sends.
    Answer(String),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Unreachable(why) => write!(f, "etcd unreachable: {why}"),
            EtcdError::Refused { status, message } => write!(f, "etcd refused (HTTP {status}): {message}"),
            EtcdError::Answer(why) => write!(f, "etcd answered something unexpected: {why}"),
        }
    }
}

impl std::error::Error for EtcdError {}

/// A key and its value as a range or a watch returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub lease: i64,
}

/// One change under a watched prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Put(Kv),
    Delete { key: String, mod_revision: i64 },
}

/// The key an election campaign holds (what proclaim and resign name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderKey {
    name: String,
    key: String,
    rev: i64,
    lease: i64,
}

/// The end of the range that holds every key starting with `prefix` (etcd's `range_end` for a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    v.as_str().and_then(|s| base64::decode(s).ok()).unwrap_or_default()
}

fn kv(v: &Value) -> Kv {
    Kv {
        key: String::from_utf8_lossy(&bytes(&v["key"])).into_owned(),
        value: bytes(&v["value"]),
        mod_revision: int(&v["mod_revision"]),
        lease: int(&v["lease"]),
    }
}

/// The events of one watch message (`{"result": {"events": [...]}}`).
pub fn parse_watch_message(msg: &Value) -> Result<Vec<WatchEvent>, EtcdError> {
    if let Some(e) = msg.get("error") {
        return Err(EtcdError::Refused { status: int(&e["http_code"]) as u16, message: e["message"].to_string() });
    }
    let r = &msg["result"];
    if r.get("canceled").and_then(Value::as_bool) == Some(true) {
        return Err(EtcdError::Refused {
            status: 0,
            message: format!("watch canceled: {}", r["cancel_reason"].as_str().unwrap_or("")),
        });
    }
    let events = r["events"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    Ok(events
        .iter()
        .map(|e| {
            let k = kv(&e["kv"]);
            if e["type"].as_str() == Some("DELETE") {
                WatchEvent::Delete { key: k.key, mod_revision: k.mod_revision }
            } else {
                WatchEvent::Put(k)
            }
        })
        .collect())
}

/// An etcd user and its password (etcd's authentication; RBAC roles decide what it may touch).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser").field("name", &self.name).finish_non_exhaustive()
    }
}

impl EtcdUser {
    /// From `--etcd-user NAME` and `--etcd-password-file FILE` (the file's first line; a password never goes
    /// on a command line): neither is no user, one without the other an error.
    pub fn from_options(name: Option<String>, password_file: Option<&std::path::Path>) -> Result<Option<Self>, String> {
        match (name, password_file) {
            (None, None) => Ok(None),
            (Some(name), Some(file)) => {
                let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
                let password = text.lines().next().unwrap_or("").to_string();
                if name.is_empty() || password.is_empty() {
                    return Err(format!("etcd user '{name}': an empty name or password ({})", file.display()));
                }
                Ok(Some(EtcdUser { name, password }))
            }
            (Some(_), None) => Err("--etcd-user needs --etcd-password-file".into()),
            (None, Some(_)) => Err("--etcd-password-file needs --etcd-user".into()),
        }
    }
}

/// The user and the token etcd gave it (`Some("")`: the cluster has no authentication, send none).
#[derive(Debug)]
struct Auth {
    user: EtcdUser,
    token: Mutex<Option<String>>,
}

/// Connection settings for one etcd cluster.
#[derive(Debug)]
pub struct Etcd {
    endpoints: Vec<String>,
    timeout: Duration,
    good: AtomicUsize,
    tls: Option<Arc<ClientConfig>>,
    auth: Option<Arc<Auth>>,
}

impl Clone for Etcd {
    fn clone(&self) -> Etcd {
        Etcd {
            endpoints: self.endpoints.clone(),
            timeout: self.timeout,
            good: AtomicUsize::new(self.current()),
            tls: self.tls.clone(),
            auth: self.auth.clone(),
        }
    }
}

/// Whether etcd refused a request for its token (expired, from another member, or older than the auth store),
/// so that a fresh token may succeed.
fn stale_token(status: u16, message: &str) -> bool {
    status == 401 || message.contains("invalid auth token") || message.contains("revision of auth store is old")
}

impl Etcd {
    /// Plain HTTP: `endpoints` are `HOST:PORT` (an `http://` prefix is accepted and dropped; several may be
    /// given in one string, comma-separated). Each request waits at most `timeout` per endpoint.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Etcd, String> {
        Etcd::with_tls(endpoints, timeout, None)
    }

    /// As [`Etcd::new`], over TLS when `tls` is given (then endpoints are `HOST:PORT` or `https://HOST:PORT`).
    pub fn with_tls(endpoints: &[String], timeout: Duration, tls: Option<&TlsFiles>) -> Result<Etcd, String> {
        let scheme = if tls.is_some() { "https://" } else { "http://" };
        let mut list = Vec::new();
        for e in endpoints.iter().flat_map(|e| e.split(',')).map(str::trim).filter(|e| !e.is_empty()) {
            let bare = e.strip_prefix(scheme).unwrap_or(e).trim_end_matches('/');
            if bare.contains("://") {
                return Err(match tls {
                    Some(_) => format!("etcd endpoint '{e}': with TLS options every endpoint is https (or HOST:PORT)"),
                    None => format!("etcd endpoint '{e}': https needs the cluster's CA (--etcd-cacert)"),
                });
            }
            if !bare.contains(':') {
                return Err(format!("etcd endpoint '{e}' is not HOST:PORT"));
            }
            list.push(bare.to_string());
        }
        if list.is_empty() {
            return Err("no etcd endpoint given".into());
        }
        let tls = tls.map(TlsFiles::client_config).transpose()?;
        Ok(Etcd { endpoints: list, timeout, good: AtomicUsize::new(0), tls, auth: None })
    }

    /// The same client, authenticating as `user` (none: no authentication).
    pub fn with_user(mut self, user: Option<EtcdUser>) -> Etcd {
        self.auth = user.map(|user| Arc::new(Auth { user, token: Mutex::new(None) }));
        self
    }

    /// The token to send (none without a user, or when the cluster has no authentication), asking etcd for
    /// one first if there is none yet.
    fn token(&self, timeout: Duration) -> Result<Option<String>, EtcdError> {
        let Some(a) = &self.auth else { return Ok(None) };
        let known = a.token.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let token = match known {
            Some(t) => t,
            None => {
                let body = json!({"name": a.user.name, "password": a.user.password}).to_string();
                let t = match self.call_once("auth/authenticate", &body, timeout, None) {
                    Ok(v) => v["token"]
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| EtcdError::Answer(format!("auth/authenticate: no token in {v}")))?,
                    Err(EtcdError::Refused { message, .. }) if message.contains("authentication is not enabled") => {
                        String::new()
                    }
                    Err(EtcdError::Refused { status, message }) => {
                        return Err(EtcdError::Refused {
                            status,
                            message: format!("authenticating as etcd user '{}': {message}", a.user.name),
                        });
                    }
                    Err(e) => return Err(e),
                };
                *a.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
                t
            }
        };
        Ok((!token.is_empty()).then_some(token))
    }

    fn forget_token(&self) {
        if let Some(a) = &self.auth {
            *a.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Whether requests go over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    fn current(&self) -> usize {
        self.good.load(Ordering::Relaxed) % self.endpoints.len()
    }

    /// POSTs `body` to `/v3/<path>` with the token, and once more with a fresh token if etcd refused the first.
    fn call(&self, path: &str, body: Value, timeout: Duration) -> Result<Value, EtcdError> {
        let body = body.to_string();
        let token = self.token(timeout)?;
        match self.call_once(path, &body, timeout, token.as_deref()) {
            Err(EtcdError::Refused { status, message }) if token.is_some() && stale_token(status, &message) => {
                self.forget_token();
                let token = self.token(timeout)?;
                self.call_once(path, &body, timeout, token.as_deref())
            }
            r => r,
        }
    }

    /// POSTs `body` to `/v3/<path>`, trying every endpoint once.
    fn call_once(&self, path: &str, body: &str, timeout: Duration, token: Option<&str>) -> Result<Value, EtcdError> {
        let start = self.current();
        let mut why = Vec::new();
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let ep = &self.endpoints[at];
            let to = http::Target { addr: ep, tls: self.tls.as_ref(), token };
            match http::post(to, &format!("/v3/{path}"), body, timeout) {
                Ok((status, text)) => {
                    self.good.store(at, Ordering::Relaxed);
                    let v: Value = serde_json::from_str(text.lines().next().unwrap_or(""))
                        .map_err(|e| EtcdError::Answer(format!("{path}: {e}: {text:.200}")))?;
                    if status != 200 {
                        let message = v["message"].as_str().or(v["error"].as_str()).unwrap_or(&text).to_string();
                        return Err(EtcdError::Refused { status, message });
                    }
                    // Streamed calls (lease keepalive) wrap their first message in "result".
                    if let Some(e) = v.get("error") {
                        return Err(EtcdError::Refused { status: int(&e["http_code"]) as u16, message: e.to_string() });
                    }
                    return Ok(v);
                }
                Err(e) => why.push(format!("{ep}: {e}")),
            }
        }
        Err(EtcdError::Unreachable(why.join("; ")))
    }

    /// Any gateway call, `/v3/<path>` with `body` as etcd's JSON mapping has it (administration the typed
    /// calls do not cover: users, roles, `auth/enable`).
    pub fn raw(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        self.call(path, body, self.timeout)
    }

    /// Puts `key` = `value`, attached to `lease` (0: none). The store's revision after the put.
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<i64, EtcdError> {
        let mut body = json!({"key": base64::encode(key.as_bytes()), "value": base64::encode(value)});
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        let v = self.call("kv/put", body, self.timeout)?;
        Ok(int(&v["header"]["revision"]))
    }

    /// Every key under `prefix` and the store's revision they were read at.
    pub fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<Kv>), EtcdError> {
        let body = json!({
            "key": base64::encode(prefix.as_bytes()),
            "range_end": base64::encode(&prefix_end(prefix.as_bytes())),
        });
        let v = self.call("kv/range", body, self.timeout)?;
        let kvs = v["kvs"].as_array().map(|a| a.iter().map(kv).collect()).unwrap_or_default();
        Ok((int(&v["header"]["revision"]), kvs))
    }

    /// One key, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<Kv>, EtcdError> {
        let v = self.call("kv/range", json!({"key": base64::encode(key.as_bytes())}), self.timeout)?;
        Ok(v["kvs"].as_array().and_then(|a| a.first()).map(kv))
    }

    /// Deletes `key`; how many keys went.
    pub fn delete(&self, key: &str) -> Result<i64, EtcdError> {
        let v = self.call("kv/deleterange", json!({"key": base64::encode(key.as_bytes())}), self.timeout)?;
        Ok(int(&v["deleted"]))
    }

    /// A new lease of `ttl_s` seconds; its id.
    pub fn grant(&self, ttl_s: i64) -> Result<i64, EtcdError> {
        let v = self.call("lease/grant", json!({"TTL": ttl_s.to_string()}), self.timeout)?;
        match int(&v["ID"]) {
            0 => Err(EtcdError::Answer(format!("lease/grant gave no ID: {v}"))),
            id => Ok(id),
        }
    }

    /// Keeps `lease` alive once: its TTL from now, or 0 when etcd no longer knows it (expired, revoked, or the
    /// cluster's data is gone).
    pub fn keepalive(&self, lease: i64) -> Result<i64, EtcdError> {
        let v = self.call("lease/keepalive", json!({"ID": lease.to_string()}), self.timeout)?;
        let r = v.get("result").unwrap_or(&v);
        Ok(int(&r["TTL"]))
    }

    /// Ends `lease` and deletes its keys at once.
    pub fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("lease/revoke", json!({"ID": lease.to_string()}), self.timeout).map(|_| ())
    }

    /// Campaigns in election `name` with `lease` (the campaign ends when the lease does), announcing `value`;
    /// returns once this campaigner leads, or fails after `wait`.
    pub fn campaign(&self, name: &str, lease: i64, value: &[u8], wait: Duration) -> Result<LeaderKey, EtcdError> {
        let body = json!({
            "name": base64::encode(name.as_bytes()),
            "lease": lease.to_string(),
            "value": base64::encode(value),
        });
        let v = self.call("election/campaign", body, wait)?;
        let l = &v["leader"];
        Ok(LeaderKey {
            name: l["name"].as_str().unwrap_or_default().to_string(),
            key: l["key"].as_str().unwrap_or_default().to_string(),
            rev: int(&l["rev"]),
            lease: int(&l["lease"]),
        })
    }

    fn leader_json(l: &LeaderKey) -> Value {
        json!({"name": l.name, "key": l.key, "rev": l.rev.to_string(), "lease": l.lease.to_string()})
    }

    /// The leader announces a new value without a new election.
    pub fn proclaim(&self, leader: &LeaderKey, value: &[u8]) -> Result<(), EtcdError> {
        let body = json!({"leader": Etcd::leader_json(leader), "value": base64::encode(value)});
        self.call("election/proclaim", body, self.timeout).map(|_| ())
    }

    /// The current leader's announced value, if election `name` has a leader.
    pub fn leader(&self, name: &str) -> Result<Option<Kv>, EtcdError> {
        match self.call("election/leader", json!({"name": base64::encode(name.as_bytes())}), self.timeout) {
            Ok(v) => Ok(v.get("kv").map(kv)),
            // etcd answers "election: no leader" as an error.
            Err(EtcdError::Refused { message, .. }) if message.contains("no leader") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Gives up leadership (the next campaigner leads).
    pub fn resign(&self, leader: &LeaderKey) -> Result<(), EtcdError> {
        self.call("election/resign", json!({"leader": Etcd::leader_json(leader)}), self.timeout).map(|_| ())
    }

    /// Watches every key under `prefix` from `start_revision` on (0: from now). Each [`Watch::next`] waits at
    /// most `poll` for news.
    pub fn watch(&self, prefix: &str, start_revision: i64, poll: Duration) -> Result<Watch, EtcdError> {
        let body = json!({"create_request": {
            "key": base64::encode(prefix.as_bytes()),
            "range_end": base64::encode(&prefix_end(prefix.as_bytes())),
            "start_revision": start_revision.to_string(),
        }})
        .to_string();
        // A stale token surfaces in the stream (an error message); the caller starts over with a range, whose
        // call renews the token.
        let token = self.token(self.timeout)?;
        let mut why = Vec::new();
        let start = self.current();
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let ep = &self.endpoints[at];
            let to = http::Target { addr: ep, tls: self.tls.as_ref(), token: token.as_deref() };
            match http::Stream::open(to, "/v3/watch", &body, self.timeout, poll) {
                Ok(s) => {
                    self.good.store(at, Ordering::Relaxed);
                    return Ok(Watch { stream: s, buf: Vec::new() });
                }
                Err(e) => why.push(format!("{ep}: {e}")),
            }
        }
        Err(EtcdError::Unreachable(why.join("; ")))
    }
}

/// A watch stream (the gateway sends one JSON message per line).
pub struct Watch {
    stream: http::Stream,
    buf: Vec<u8>,
}

impl Watch {
    /// The events of the next message, `Ok(None)` when nothing came within the poll time; an error when the
    /// stream broke or etcd canceled the watch (start again from a fresh range).
    pub fn next_events(&mut self) -> Result<Option<Vec<WatchEvent>>, EtcdError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let text = String::from_utf8_lossy(&line);
                if text.trim().is_empty() {
                    continue;
                }
                let msg: Value =
                    serde_json::from_str(text.trim()).map_err(|e| EtcdError::Answer(format!("watch: {e}")))?;
                return parse_watch_message(&msg).map(Some);
            }
            match self.stream.next_piece() {
                Ok(Some(bytes)) => self.buf.extend_from_slice(&bytes),
                Ok(None) => return Err(EtcdError::Unreachable("the watch stream ended".into())),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Ok(None);
                }
                Err(e) => return Err(EtcdError::Unreachable(format!("watch: {e}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_past_every_key_under_it() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn endpoints_are_host_port_with_the_scheme_the_options_give() {
        let s = Duration::from_secs(1);
        let e = Etcd::new(&["http://127.0.0.1:2379/, 10.0.0.1:2379".into()], s).unwrap();
        assert_eq!(e.endpoints(), ["127.0.0.1:2379", "10.0.0.1:2379"]);
        assert!(!e.is_tls());
        assert!(Etcd::new(&[], s).is_err());
        assert!(Etcd::new(&["https://x:1".into()], s).unwrap_err().contains("--etcd-cacert"));
        assert!(Etcd::new(&["localhost".into()], s).is_err());
        // With TLS options a plain endpoint is refused, not spoken to in the clear (the CA file is not read
        // before the endpoints are checked).
        let tls = TlsFiles { ca: "/nonexistent/ca.pem".into(), cert: None, key: None };
        let err = Etcd::with_tls(&["http://127.0.0.1:2379".into()], s, Some(&tls)).unwrap_err();
        assert!(err.contains("every endpoint is https"), "{err}");
        let err = Etcd::with_tls(&["https://127.0.0.1:2379".into()], s, Some(&tls)).unwrap_err();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    /// Against a real etcd with authentication on: no user, a wrong password, a key outside the user's role
    /// are each refused with etcd's reason; a token etcd does not take is replaced once; a user against a
    /// cluster without authentication sends no token.
    #[test]
    fn a_user_authenticates_renews_its_token_and_stays_within_its_role() {
        let e = crate::local::LocalEtcd::start().unwrap_or_else(|m| panic!("{m}"));
        e.enable_auth("root-pw", &[("reg", "reg-pw", &["/leasebox/"], &[])]).unwrap();
        let user = |name: &str, password: &str| Some(EtcdUser { name: name.into(), password: password.into() });
        let anonymous = e.client().get("/leasebox/x").unwrap_err();
        assert!(
            matches!(&anonymous, EtcdError::Refused { message, .. } if message.contains("user name")),
            "{anonymous}"
        );
        let wrong = e.client().with_user(user("reg", "nope")).get("/leasebox/x").unwrap_err();
        assert!(wrong.to_string().contains("authenticating as etcd user 'reg'"), "{wrong}");

        let reg = e.client().with_user(user("reg", "reg-pw"));
        reg.put("/leasebox/x", b"1", 0).unwrap();
        assert_eq!(reg.get("/leasebox/x").unwrap().unwrap().value, b"1");
        let outside = reg.put("/other/x", b"1", 0).unwrap_err();
        assert!(outside.to_string().contains("permission denied"), "{outside}");
        let a = reg.auth.as_ref().unwrap();
        *a.token.lock().unwrap() = Some("not-a-token.7".into());
        assert_eq!(reg.get("/leasebox/x").unwrap().unwrap().value, b"1");
        assert_ne!(a.token.lock().unwrap().as_deref(), Some("not-a-token.7"));
        // The root user may go anywhere.
        e.client().with_user(user("root", "root-pw")).put("/other/x", b"2", 0).unwrap();

        let open = crate::local::LocalEtcd::start().unwrap_or_else(|m| panic!("{m}"));
        let c = open.client().with_user(user("reg", "reg-pw"));
        c.put("/leasebox/y", b"3", 0).unwrap();
        assert_eq!(c.auth.as_ref().unwrap().token.lock().unwrap().as_deref(), Some(""));
    }

    #[test]
    fn user_options_go_together_and_the_password_comes_from_a_file() {
        let dir = std::env::temp_dir().join(format!("leasebox-etcd-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "s3cret\n").unwrap();
        let u = EtcdUser::from_options(Some("reg".into()), Some(&f)).unwrap().unwrap();
        assert_eq!((u.name.as_str(), u.password.as_str()), ("reg", "s3cret"));
        assert!(!format!("{u:?}").contains("s3cret"));
        assert_eq!(EtcdUser::from_options(None, None), Ok(None));
        assert!(EtcdUser::from_options(Some("reg".into()), None).unwrap_err().contains("--etcd-password-file"));
        assert!(EtcdUser::from_options(None, Some(&f)).unwrap_err().contains("--etcd-user"));
        std::fs::write(&f, "\n").unwrap();
        assert!(EtcdUser::from_options(Some("reg".into()), Some(&f)).unwrap_err().contains("empty"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Messages as etcd 3.4's gateway writes them (`etcdctl`-independent: typed from the proto's JSON mapping).
    #[test]
    fn watch_messages_give_puts_and_deletes() {
        let created: Value = serde_json::from_str(r#"{"result":{"header":{"revision":"5"},"created":true}}"#).unwrap();
        assert_eq!(parse_watch_message(&created).unwrap(), vec![]);
        let put = r#"{"result":{"header":{"revision":"6"},"events":[
            {"kv":{"key":"L2EvYg==","create_revision":"6","mod_revision":"6","version":"1","value":"eA==","lease":"77"}},
            {"type":"DELETE","kv":{"key":"L2EvYw==","mod_revision":"7"}}]}}"#;
        let ev = parse_watch_message(&serde_json::from_str(put).unwrap()).unwrap();
        assert_eq!(
            ev,
            vec![
                WatchEvent::Put(Kv { key: "/a/b".into(), value: b"x".to_vec(), mod_revision: 6, lease: 77 }),
                WatchEvent::Delete { key: "/a/c".into(), mod_revision: 7 }
            ]
        );
        let canceled: Value =
            serde_json::from_str(r#"{"result":{"canceled":true,"cancel_reason":"compacted"}}"#).unwrap();
        assert!(parse_watch_message(&canceled).is_err());
    }
}
