//! A single-member etcd on loopback for tests and benchmarks: Debian's `etcd-server` (etcd 3.4), free ports, a
//! temporary data directory (on /dev/shm when there is one) removed afterwards. `cargo xtask prereqs` installs
//! it; without it [`LocalEtcd::start`] fails with a message that says so (the fleet tests fail, not skip).
//! [`LocalEtcd::start_tls`] serves TLS only and asks every client for a certificate, from a throwaway CA made
//! with the `openssl` command (Debian package openssl).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::etcd::Etcd;
use crate::tls::TlsFiles;

/// Where etcd is looked for: `$LEASEBOX_ETCD`, else `etcd` in `PATH`.
pub fn etcd_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("LEASEBOX_ETCD").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    find_in_path("etcd").ok_or_else(|| {
        "etcd not found in PATH: the fleet tests need a real etcd server (Debian package etcd-server); \
         run `cargo xtask prereqs` (or `cargo xtask test`, which installs it)"
            .to_string()
    })
}

/// An executable named `name` in `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Prometheus's `promtool check metrics` over an exposition `page` (Debian package prometheus, installed by
/// `cargo xtask prereqs`): `Err` with what promtool said, or why it could not run.
pub fn promtool_check(page: &str) -> Result<(), String> {
    use std::io::Write;
    let bin = find_in_path("promtool")
        .ok_or("promtool not found in PATH (Debian package prometheus): run `cargo xtask prereqs`")?;
    let mut c = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    c.stdin.take().ok_or("promtool has no stdin")?.write_all(page.as_bytes()).map_err(|e| e.to_string())?;
    let out = c.wait_with_output().map_err(|e| e.to_string())?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(()) } else { Err(said) }
}

/// The value of the first sample of `metric` in an exposition `page` whose labels contain every one of
/// `labels` (each written `name="value"`): tests read a figure back without trusting the HELP and TYPE lines.
pub fn sample_value(page: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    page.lines().find_map(|l| {
        let rest = l.strip_prefix(metric)?.strip_prefix('{')?;
        let (set, value) = rest.rsplit_once("} ")?;
        labels.iter().all(|want| set.split(',').any(|have| have == *want)).then(|| value.trim().parse().ok())?
    })
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// A running etcd; stopped and its data removed when dropped.
pub struct LocalEtcd {
    bin: PathBuf,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// With TLS: the server's certificate and key, and a client's files.
    tls: Option<(PathBuf, PathBuf, TlsFiles)>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl LocalEtcd {
    /// Starts etcd and waits (at most 20 s) until it answers.
    pub fn start() -> Result<LocalEtcd, String> {
        LocalEtcd::start_with(false)
    }

    /// As [`LocalEtcd::start`], serving HTTPS only with client certificates required (`--client-cert-auth`):
    /// a CA, a server certificate for 127.0.0.1 and a client certificate are made in its directory first.
    pub fn start_tls() -> Result<LocalEtcd, String> {
        LocalEtcd::start_with(true)
    }

    fn start_with(tls: bool) -> Result<LocalEtcd, String> {
        let bin = etcd_binary()?;
        // On tmpfs when there is one: etcd fsyncs its log on every write, and a test machine's disk under a
        // parallel build can stall an fsync for seconds, longer than the tests' lease TTLs.
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!("leasebox-etcd-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let mut e = LocalEtcd { bin, dir, client_port: free_port()?, peer_port: free_port()?, child: None, tls: None };
        if tls {
            e.tls = Some(make_certificates(&e.dir.join("pki"))?);
        }
        e.launch()?;
        Ok(e)
    }

    /// The client endpoint, `127.0.0.1:PORT` (`https://127.0.0.1:PORT` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https://" } else { "" };
        format!("{scheme}127.0.0.1:{}", self.client_port)
    }

    /// With TLS: the CA and a client certificate and key that this server accepts.
    pub fn client_tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|t| &t.2)
    }

    /// A client for this server.
    pub fn client(&self) -> Etcd {
        Etcd::with_tls(&[self.endpoint()], Duration::from_secs(3), self.client_tls()).expect("a loopback endpoint")
    }

    fn launch(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        if let Some((cert, key, files)) = &self.tls {
            cmd.arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--trusted-ca-file={}", files.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name=leasebox-test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=leasebox-test={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e} (run `cargo xtask prereqs`)", self.bin.display()))?;
        self.child = Some(child);
        let c = self.client();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if c.get("/leasebox/ping").is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(format!("etcd exited ({status}): {}", tail.join(" | ")));
            }
            if Instant::now() > deadline {
                return Err(format!("etcd on {} did not answer within 20 s", self.endpoint()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Turns etcd's authentication on: user `root` (password `root_password`, role root) and, for each of
    /// `users` (name, password, key prefixes it may read and write, prefixes it may only read), a role that
    /// grants exactly those ranges. Afterwards [`LocalEtcd::client`] (no user) is refused.
    pub fn enable_auth(&self, root_password: &str, users: &[(&str, &str, &[&str], &[&str])]) -> Result<(), String> {
        let c = self.client();
        let call =
            |path: &str, body: serde_json::Value| c.raw(path, body).map(|_| ()).map_err(|e| format!("{path}: {e}"));
        call("auth/user/add", serde_json::json!({"name": "root", "password": root_password}))?;
        call("auth/user/grant", serde_json::json!({"user": "root", "role": "root"}))?;
        for (name, password, write, read) in users {
            let role = format!("{name}-role");
            call("auth/role/add", serde_json::json!({"name": role}))?;
            let ranges = write.iter().map(|p| (p, "READWRITE")).chain(read.iter().map(|p| (p, "READ")));
            for (prefix, perm) in ranges {
                let perm = serde_json::json!({
                    "permType": perm,
                    "key": crate::base64::encode(prefix.as_bytes()),
                    "range_end": crate::base64::encode(&crate::etcd::prefix_end(prefix.as_bytes())),
                });
                call("auth/role/grant", serde_json::json!({"name": role, "perm": perm}))?;
            }
            call("auth/user/add", serde_json::json!({"name": name, "password": password}))?;
            call("auth/user/grant", serde_json::json!({"user": name, "role": role}))?;
        }
        call("auth/enable", serde_json::json!({}))
    }

    /// Kills etcd (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports; with `wipe`, from an empty data directory (a cluster that lost its
    /// data: every lease and key gone).
    pub fn restart(&mut self, wipe: bool) -> Result<(), String> {
        self.kill();
        if wipe {
            let _ = std::fs::remove_dir_all(self.dir.join("data"));
        }
        self.launch()
    }
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &std::path::Path, args: &[&str]) -> Result<(), String> {
    let bin = find_in_path("openssl")
        .ok_or("openssl not found in PATH (Debian package openssl): the TLS fleet test makes its CA with it")?;
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A throwaway CA (P-256), a server certificate for 127.0.0.1 (server and client use: etcd's gateway dials its
/// own gRPC port with it) and a client certificate: (server cert, server key, the client's files).
fn make_certificates(dir: &std::path::Path) -> Result<(PathBuf, PathBuf, TlsFiles), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = [&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"]].concat();
    let ca_ext = ["-subj", "/CN=leasebox test CA", "-addext", "basicConstraints=critical,CA:TRUE"];
    openssl(dir, &[&ca[..], &ca_ext, &["-addext", "keyUsage=critical,keyCertSign,cRLSign"]].concat())?;
    for (name, eku, san) in [
        (
            "server",
            "serverAuth,clientAuth",
            "subjectAltName=IP:127.0.0.1
",
        ),
        ("client", "clientAuth", ""),
    ] {
        let (key, csr, pem, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        let text = format!(
            "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage={eku}
{san}"
        );
        std::fs::write(dir.join(&ext), text).map_err(|e| e.to_string())?;
        let subj = format!("/CN=leasebox test {name}");
        openssl(dir, &[&["req"][..], &ec, &["-keyout", &key, "-out", &csr, "-subj", &subj]].concat())?;
        openssl(
            dir,
            &["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem]
                .into_iter()
                .chain(["-days", "2", "-extfile", &ext])
                .collect::<Vec<_>>(),
        )?;
    }
    let client =
        TlsFiles { ca: dir.join("ca.pem"), cert: Some(dir.join("client.pem")), key: Some(dir.join("client.key")) };
    Ok((dir.join("server.pem"), dir.join("server.key"), client))
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::sample_value;

    #[test]
    fn samples_are_found_by_name_and_labels() {
        let page = "# HELP m_total x\n# TYPE m_total counter\nm_total{a=\"1\",result=\"ok\"} 5\n\
                    m_total{a=\"2\",result=\"ok\"} 7\nm_total_x{a=\"2\",result=\"ok\"} 9\n";
        assert_eq!(sample_value(page, "m_total", &["a=\"2\"", "result=\"ok\""]), Some(7.0));
        assert_eq!(sample_value(page, "m_total", &["result=\"ok\""]), Some(5.0));
        assert_eq!(sample_value(page, "m_total", &["a=\"3\""]), None);
        // The HELP and TYPE lines are not samples.
        assert_eq!(sample_value("# HELP m_total x\n# TYPE m_total counter\n", "m_total", &[]), None);
    }
}
