//! The etcd client over TLS against a real etcd (Debian's etcd-server) that serves HTTPS only and asks every
//! client for a certificate (`--client-cert-auth`), its CA made by `openssl` (`LocalEtcd::start_tls`).

use std::time::Duration;

use leasebox_fleet::local::LocalEtcd;
use leasebox_fleet::{Etcd, EtcdError, TlsFiles};

const WAIT: Duration = Duration::from_secs(3);

#[test]
fn tls_with_a_client_certificate_works_and_everything_less_is_refused() {
    let e = LocalEtcd::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let files = e.client_tls().expect("TLS files").clone();
    let endpoint = e.endpoint();
    assert!(endpoint.starts_with("https://127.0.0.1:"), "{endpoint}");

    // The full set: CA, client certificate and key. A put, a read back, a watch that sees the next put.
    let c = Etcd::with_tls(std::slice::from_ref(&endpoint), WAIT, Some(&files)).unwrap();
    assert!(c.is_tls());
    c.put("/leasebox/tls/a", b"one", 0).unwrap();
    assert_eq!(c.get("/leasebox/tls/a").unwrap().expect("the key").value, b"one");
    let mut w = c.watch("/leasebox/tls/", 0, Duration::from_millis(200)).unwrap();
    c.put("/leasebox/tls/b", b"two", 0).unwrap();
    let t0 = std::time::Instant::now();
    let events = loop {
        if let Some(ev) = w.next_events().unwrap()
            && !ev.is_empty()
        {
            break ev;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no watch event over TLS");
    };
    assert!(format!("{events:?}").contains("/leasebox/tls/b"), "{events:?}");

    // The CA alone: etcd wants a client certificate and ends the handshake.
    let ca_only = TlsFiles { cert: None, key: None, ..files.clone() };
    let r = Etcd::with_tls(std::slice::from_ref(&endpoint), WAIT, Some(&ca_only)).unwrap().get("/leasebox/tls/a");
    assert!(
        matches!(&r, Err(EtcdError::Unreachable(why)) if why.contains("TLS") && why.contains("wants a client certificate")),
        "{r:?}"
    );

    // Plain HTTP to the HTTPS port: no answer etcd's gateway would give.
    let plain = Etcd::new(&[endpoint.trim_start_matches("https://").to_string()], WAIT).unwrap();
    assert!(plain.get("/leasebox/tls/a").is_err());

    // A CA that did not sign the server's certificate: this client refuses the server.
    let other = LocalEtcd::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let wrong_ca = TlsFiles { ca: other.client_tls().unwrap().ca.clone(), ..files.clone() };
    let r = Etcd::with_tls(std::slice::from_ref(&endpoint), WAIT, Some(&wrong_ca)).unwrap().get("/leasebox/tls/a");
    assert!(matches!(&r, Err(EtcdError::Unreachable(why)) if why.contains("does not verify under the CA")), "{r:?}");
}
