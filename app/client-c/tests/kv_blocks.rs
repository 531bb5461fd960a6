//! The C ABI end to end against a hosted appliance with the device model (`--hca --udp`): the C example
//! `examples/kv_blocks.c`, compiled with gcc against the committed header and linked with the staticlib, stores
//! blocks and reads them back (it exits non-zero on any mismatch); and, called from Rust through the same
//! `extern "C"` functions, a revoke by the admin turns the lease's next call into `LBX_ERR_REVOKED`, and a cut
//! control connection is made again (`LBX_EVENT_RECONNECTED`) and carries new leases.

use leasebox_client_c::*;

// The client library's test proxy (cut connections), not a copy of it.
#[path = "../../client/tests/support/proxy.rs"]
mod proxy;
mod support;
use proxy::Proxy;
use std::ffi::{CStr, CString};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::{Appliance, start};

fn last() -> String {
    // SAFETY: `lbx_last_error` returns a NUL-terminated string valid until the next call on this thread.
    unsafe { CStr::from_ptr(lbx_last_error()) }.to_string_lossy().into_owned()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// The example, as its header says to build it, with the requester given on argv and in the environment.
#[test]
fn c_example_stores_blocks_and_reads_them_back() {
    let exe = support::compile("examples/kv_blocks.c", "kv_blocks");
    let _one = support::serial();
    let a = start();
    let soft = format!("soft:{}", a.udp);
    let run = support::run(&exe, &[&a.addr, "demo", &a.tenant, &soft], &[]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "kv_blocks exited {}:\n{stdout}", run.status);
    for line in [
        "stored 96 blocks of 4096 bytes in 2 leases and read them back identical",
        "PASS async batch: 96 block writes across 2 leases, completions through the fd",
        "PASS zero copy: no byte went through a bounce buffer",
        "PASS revoke: lease 0's 48 reads all completed",
        "PASS revoke: LBX_EVENT_REVOKED names lease 1",
        "kv_blocks: PASS",
    ] {
        assert!(stdout.contains(line), "no '{line}' in\n{stdout}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("lease ")).count(), 2, "{stdout}");
    // Linked without libibverbs: the verbs backend loads it at run time, so the program starts on hosts without it.
    let dynamic = std::process::Command::new("readelf").arg("-d").arg(&exe).output().expect("running readelf");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(dynamic.contains("(NEEDED)"), "readelf -d printed no NEEDED entries: {dynamic}");
    assert!(!dynamic.contains("libibverbs"), "the example links libibverbs:\n{dynamic}");

    // $LEASEBOX_REQUESTER when argv has none; a requester that cannot be parsed is a library error (2).
    let env = std::process::Command::new(&exe)
        .args([&a.addr, "demo", &a.tenant])
        .env("LEASEBOX_REQUESTER", "verbs:rxe0")
        .output()
        .unwrap();
    assert_eq!(env.status.code(), Some(2), "{}", String::from_utf8_lossy(&env.stdout));
    assert!(String::from_utf8_lossy(&env.stderr).contains("requester 'verbs:rxe0'"));
}

#[test]
fn revoke_turns_the_next_call_into_lbx_err_revoked_and_a_cut_connection_is_reconnected() {
    let a = start();
    let (addr, udp) = (c(&a.addr), c(&a.udp));
    // The tenant's control connection goes through a proxy the test can cut.
    let proxy = Proxy::start(a.addr.clone());
    let via = c(&proxy.addr.to_string());
    let mut tenant: *mut lbx_client = std::ptr::null_mut();
    let r = lbx_client_connect(via.as_ptr(), c"demo".as_ptr(), c(&a.tenant).as_ptr(), udp.as_ptr(), 0, &mut tenant);
    assert_eq!(r, LBX_OK, "{}", last());
    let mut admin: *mut lbx_client = std::ptr::null_mut();
    let r = lbx_client_connect(addr.as_ptr(), c"admin".as_ptr(), c(&a.admin).as_ptr(), udp.as_ptr(), 0, &mut admin);
    assert_eq!(r, LBX_OK, "{}", last());

    let mut lease: *mut lbx_lease = std::ptr::null_mut();
    assert_eq!(lbx_alloc(tenant, 1 << 20, 0, &mut lease), LBX_OK, "{}", last());
    assert!(lbx_lease_size(lease) >= 1 << 20);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(lbx_lease_write(lease, 12_345, data.as_ptr(), data.len()), LBX_OK, "{}", last());
    let mut back = vec![0u8; data.len()];
    assert_eq!(lbx_lease_read(lease, 12_345, back.as_mut_ptr(), back.len()), LBX_OK, "{}", last());
    assert_eq!(back, data);

    // The operator revokes it through a second connection, as the admin.
    let id = lbx_lease_id(lease);
    assert_ne!(id, lbx_lease_ident::default(), "a live lease has an id");
    assert_ne!(id.boot_id, [0; 16], "the appliance's boot id is part of it");
    assert_eq!(lbx_client_revoke(admin, 0, &id), LBX_OK, "{}", last());
    let r = lbx_lease_write(lease, 0, data.as_ptr(), 64);
    assert_eq!(r, LBX_ERR_REVOKED, "{}", last());
    assert!(last().contains("revoked"), "{}", last());
    // Later calls fail the same way without the network.
    assert_eq!(lbx_lease_read(lease, 0, back.as_mut_ptr(), 64), LBX_ERR_REVOKED);
    let mut ev =
        lbx_event { kind: -1, appliance: 9, lease: lbx_lease_ident::default(), session_id: 0, in_ms: 0, outcome: 0 };
    let deadline = Instant::now() + Duration::from_secs(5);
    while ev.kind != LBX_EVENT_REVOKED && Instant::now() < deadline {
        assert_eq!(lbx_client_next_event(tenant, 100, &mut ev), LBX_OK);
    }
    assert_eq!((ev.kind, ev.appliance, ev.lease), (LBX_EVENT_REVOKED, 0, id));
    // Freeing a revoked lease says so, and destroys the handle all the same.
    assert_eq!(lbx_lease_free(lease), LBX_ERR_REVOKED);

    // The control connection breaks: the client reconnects on its own and says so.
    proxy.kill();
    let mut ev =
        lbx_event { kind: -1, appliance: 9, lease: lbx_lease_ident::default(), session_id: 0, in_ms: 0, outcome: 0 };
    let deadline = Instant::now() + Duration::from_secs(15);
    while ev.kind != LBX_EVENT_RECONNECTED && Instant::now() < deadline {
        assert_eq!(lbx_client_next_event(tenant, 100, &mut ev), LBX_OK);
    }
    assert_eq!((ev.kind, ev.appliance), (LBX_EVENT_RECONNECTED, 0));
    assert_ne!(ev.session_id, 0);
    assert_eq!(proxy.accepted.load(Ordering::Acquire), 2);
    let mut free = 0;
    assert_eq!(lbx_client_free_bytes(tenant, 0, &mut free), LBX_OK, "{}", last());
    assert!(free >= 4096, "{free}");
    let mut again: *mut lbx_lease = std::ptr::null_mut();
    assert_eq!(lbx_alloc(tenant, 4096, 0, &mut again), LBX_OK, "{}", last());
    assert_eq!(lbx_lease_write(again, 0, data.as_ptr(), 4096), LBX_OK, "{}", last());
    assert_eq!(lbx_lease_read(again, 0, back.as_mut_ptr(), 4096), LBX_OK, "{}", last());
    assert_eq!(back[..4096], data[..4096]);
    assert_eq!(lbx_lease_free(again), LBX_OK, "{}", last());
    assert_eq!(lbx_client_close(tenant), LBX_OK, "{}", last());
    assert_eq!(lbx_client_close(admin), LBX_OK, "{}", last());
}

/// A 1 MiB lease from `client` carries `data` (written at offset 7, read back), is freed; then the client is
/// closed.
fn one_lease_carries(client: *mut lbx_client, data: &[u8]) {
    let mut lease: *mut lbx_lease = std::ptr::null_mut();
    assert_eq!(lbx_alloc(client, 1 << 20, 0, &mut lease), LBX_OK, "{}", last());
    assert_eq!(lbx_lease_write(lease, 7, data.as_ptr(), data.len()), LBX_OK, "{}", last());
    let mut back = vec![0u8; data.len()];
    assert_eq!(lbx_lease_read(lease, 7, back.as_mut_ptr(), back.len()), LBX_OK, "{}", last());
    assert_eq!(back, data);
    assert_eq!(lbx_lease_free(lease), LBX_OK, "{}", last());
    assert_eq!(lbx_client_close(client), LBX_OK, "{}", last());
}

/// `lbx_client_connect_etcd`: the appliance comes from an advertisement in a real etcd (as the registrar
/// writes it, docs/fleet.md), and a lease placed there carries data; an etcd without advertisements is
/// `LBX_ERR_NO_MEMORY` once the timeout has passed.
#[test]
fn a_client_started_from_etcd_places_on_the_advertised_appliance() {
    use leasebox_fleet::advert::Advertisement;
    let a = start();
    let e = leasebox_fleet::local::LocalEtcd::start().unwrap_or_else(|m| panic!("{m}"));
    let endpoint = c(&e.endpoint());

    let mut none: *mut lbx_client = std::ptr::null_mut();
    let r = lbx_client_connect_etcd(endpoint.as_ptr(), c"demo".as_ptr(), c(&a.tenant).as_ptr(), 500, &mut none);
    assert_eq!(r, LBX_ERR_NO_MEMORY, "{}", last());
    assert!(none.is_null());

    let ad = Advertisement {
        boot_id: "0123456789abcdef0123456789abcdef".into(),
        control: a.addr.clone(),
        rdma: a.udp.clone(),
        free_bytes: 64 << 20,
        health: "ok".into(),
        hca: "ok".into(),
        ..Advertisement::default()
    };
    e.client().put(&ad.key(), ad.to_json().as_bytes(), 0).unwrap();
    let mut client: *mut lbx_client = std::ptr::null_mut();
    let r = lbx_client_connect_etcd(endpoint.as_ptr(), c"demo".as_ptr(), c(&a.tenant).as_ptr(), 5000, &mut client);
    assert_eq!(r, LBX_OK, "{}", last());
    one_lease_carries(client, b"placed through etcd");
    let r = lbx_client_connect_etcd(std::ptr::null(), c"demo".as_ptr(), c(&a.tenant).as_ptr(), 0, &mut client);
    assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
    // An https endpoint needs the TLS start.
    let https = c(&format!("https://{}", e.endpoint()));
    let r = lbx_client_connect_etcd(https.as_ptr(), c"demo".as_ptr(), c(&a.tenant).as_ptr(), 500, &mut client);
    assert_eq!(r, LBX_ERR_INVALID_ARGUMENT, "{}", last());
    assert!(last().contains("options.ca_file"), "{}", last());
}

/// An advertisement for appliance `a` in `e`, as the registrar writes it.
fn advertise(e: &leasebox_fleet::local::LocalEtcd, a: &Appliance, boot_id: &str, as_user: Option<(&str, &str)>) {
    let ad = leasebox_fleet::advert::Advertisement {
        boot_id: boot_id.into(),
        control: a.addr.clone(),
        rdma: a.udp.clone(),
        free_bytes: 64 << 20,
        health: "ok".into(),
        hca: "ok".into(),
        ..Default::default()
    };
    let user =
        as_user.map(|(name, password)| leasebox_fleet::EtcdUser { name: name.into(), password: password.into() });
    e.client().with_user(user).put(&ad.key(), ad.to_json().as_bytes(), 0).unwrap();
}

/// `lbx_client_connect_etcd_with` and these options: the status and the client (NULL unless it succeeded).
fn connect_with(endpoint: &str, tenant: &str, o: &lbx_etcd_options) -> (i32, *mut lbx_client) {
    let mut client: *mut lbx_client = std::ptr::null_mut();
    let (endpoint, tenant) = (c(endpoint), c(tenant));
    let r = lbx_client_connect_etcd_with(endpoint.as_ptr(), o, c"demo".as_ptr(), tenant.as_ptr(), 3000, &mut client);
    (r, client)
}

fn no_options() -> lbx_etcd_options {
    let none = std::ptr::null();
    lbx_etcd_options { ca_file: none, cert_file: none, key_file: none, user: none, password: none }
}

/// `lbx_client_connect_etcd_with` over TLS: the same through an etcd that serves TLS only and verifies
/// clients; without the client certificate, or with options that do not go together, it fails and says why.
#[test]
fn a_client_started_from_etcd_over_tls_places_on_the_advertised_appliance() {
    let a = start();
    let e = leasebox_fleet::local::LocalEtcd::start_tls().unwrap_or_else(|m| panic!("{m}"));
    let files = e.client_tls().unwrap().clone();
    advertise(&e, &a, "00112233445566778899aabbccddeeff", None);
    let path = |p: &std::path::Path| c(p.to_str().unwrap());
    let (ca, cert, key) = (path(&files.ca), path(files.cert.as_ref().unwrap()), path(files.key.as_ref().unwrap()));
    let tls =
        lbx_etcd_options { ca_file: ca.as_ptr(), cert_file: cert.as_ptr(), key_file: key.as_ptr(), ..no_options() };
    let (r, client) = connect_with(&e.endpoint(), &a.tenant, &tls);
    assert_eq!(r, LBX_OK, "{}", last());
    one_lease_carries(client, b"placed through etcd over TLS");

    // No client certificate: etcd refuses the handshake; the error says what to give.
    let ca_only = lbx_etcd_options { ca_file: ca.as_ptr(), ..no_options() };
    let (r, client) = connect_with(&e.endpoint(), &a.tenant, &ca_only);
    assert_ne!(r, LBX_OK);
    assert!(client.is_null());
    assert!(last().contains("wants a client certificate"), "{}", last());
    // A certificate without its key, a missing CA file, an https endpoint without a CA: refused before any
    // connection, the options named as the structure names them.
    let no_key = lbx_etcd_options { key_file: std::ptr::null(), ..tls };
    assert_eq!(connect_with(&e.endpoint(), &a.tenant, &no_key).0, LBX_ERR_INVALID_ARGUMENT, "{}", last());
    assert!(last().contains("options.cert_file"), "{}", last());
    let missing = c("/nonexistent/ca.pem");
    let bad_ca = lbx_etcd_options { ca_file: missing.as_ptr(), ..tls };
    assert_eq!(connect_with(&e.endpoint(), &a.tenant, &bad_ca).0, LBX_ERR_INVALID_ARGUMENT, "{}", last());
    assert!(last().contains("/nonexistent/ca.pem"), "{}", last());
    assert_eq!(connect_with(&e.endpoint(), &a.tenant, &no_options()).0, LBX_ERR_INVALID_ARGUMENT, "{}", last());
    assert!(last().contains("options.ca_file"), "{}", last());
}

/// `lbx_client_connect_etcd_with` as an etcd user whose role may only read the advertisements: it places a
/// lease; a wrong password or a user without a password is refused.
#[test]
fn a_client_started_from_etcd_as_a_user_places_on_the_advertised_appliance() {
    let a = start();
    let e = leasebox_fleet::local::LocalEtcd::start().unwrap_or_else(|m| panic!("{m}"));
    e.enable_auth("root-pw", &[("reader", "reader-pw", &[], &["/leasebox/v1/"])]).unwrap();
    advertise(&e, &a, "ffeeddccbbaa99887766554433221100", Some(("root", "root-pw")));
    let (user, good, bad) = (c("reader"), c("reader-pw"), c("wrong"));
    let o = lbx_etcd_options { user: user.as_ptr(), password: good.as_ptr(), ..no_options() };
    let (r, client) = connect_with(&e.endpoint(), &a.tenant, &o);
    assert_eq!(r, LBX_OK, "{}", last());
    one_lease_carries(client, b"placed as an etcd user");

    let wrong = lbx_etcd_options { password: bad.as_ptr(), ..o };
    assert_ne!(connect_with(&e.endpoint(), &a.tenant, &wrong).0, LBX_OK);
    assert!(last().contains("authenticating as etcd user 'reader'"), "{}", last());
    let no_password = lbx_etcd_options { password: std::ptr::null(), ..o };
    assert_eq!(connect_with(&e.endpoint(), &a.tenant, &no_password).0, LBX_ERR_INVALID_ARGUMENT, "{}", last());
    // Without a user, etcd refuses to say anything.
    assert_ne!(connect_with(&e.endpoint(), &a.tenant, &no_options()).0, LBX_OK);
}
