//! `Client` and `Lease` against hosted appliances with the device model (`--hca`: RDMA over the model's UDP
//! responder): the round trip with data checked, ranges refused before anything is sent, placement by free
//! bytes and the retry elsewhere on NO_MEMORY, a killed connection the client comes back from (RESUME), an
//! operator's REVOKE that the next write reports, and the appliance's notices as events (revoke, drain).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::proxy::Proxy;

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{
    AllocOptions, Appliance, Client, ClientConfig, Connection, Credentials, Error, Event, Outcome, RequesterConfig,
    Timeouts,
};
use leasebox_hosted::{Hosted, HostedConfig};
use leasebox_proto::{Request, Response};

const MIB: u64 = 1 << 20;

/// The tests here each run whole appliances with spinning model threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

struct Hosted1 {
    h: Option<Hosted>,
    tenant: Credentials,
    admin: Credentials,
    udp: SocketAddr,
}

impl Drop for Hosted1 {
    fn drop(&mut self) {
        if let Some(h) = self.h.take() {
            h.stop();
        }
    }
}

fn key() -> (String, Vec<u8>) {
    let hex = leasebox_client::hex::random_key(32).expect("a random key");
    let bytes = leasebox_client::hex::decode(&hex).expect("hex");
    (hex, bytes)
}

/// A hosted appliance with the model, a 1 s heartbeat timeout (so a broken connection shows within a
/// heartbeat period of 333 ms) and `extra` options.
fn start_hosted(extra: &[&str]) -> Hosted1 {
    let ((tenant_hex, tenant_key), (admin_hex, admin_key)) = (key(), key());
    let mut args: Vec<String> =
        ["--listen", "127.0.0.1:0", "--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "heartbeat_ms=1000"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.push(format!("tenant=demo:{tenant_hex}"));
    args.push(format!("admin={admin_hex}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    let h = Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap();
    let udp = h.hca().unwrap().udp.unwrap();
    Hosted1 {
        h: Some(h),
        tenant: Credentials { name: "demo".into(), key: tenant_key },
        admin: Credentials { name: "admin".into(), key: admin_key },
        udp,
    }
}

impl Hosted1 {
    fn addr(&self) -> String {
        self.h.as_ref().unwrap().addr().to_string()
    }

    fn appliance_at(&self, addr: String) -> Appliance {
        Appliance {
            addr,
            credentials: self.tenant.clone(),
            requester: RequesterConfig::Soft(SoftConfig { peer: self.udp, ..SoftConfig::default() }),
        }
    }

    fn appliance(&self) -> Appliance {
        self.appliance_at(self.addr())
    }

    fn admin(&self) -> Connection {
        Connection::connect_and_hello(&self.addr(), &self.admin, Timeouts::all(Duration::from_secs(5))).unwrap().0
    }
}

fn config(appliances: Vec<Appliance>) -> ClientConfig {
    ClientConfig { timeouts: Timeouts::all(Duration::from_secs(5)), ..ClientConfig::new(appliances) }
}

/// Bytes that differ from block to block and are never all zero.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251 + 1) as u8).collect()
}

/// Waits for the first event `want` accepts, up to `within`.
fn wait_event(c: &Client, within: Duration, want: impl Fn(&Event) -> bool) -> Option<Event> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(e) = c.recv_event(Duration::from_millis(50))
            && want(&e)
        {
            return Some(e);
        }
    }
    None
}

#[test]
fn alloc_write_read_free_round_trip() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let mut lease = client.alloc(4 * MIB, AllocOptions::default()).unwrap();
    assert_eq!(lease.size(), 4 * MIB);
    assert_eq!(lease.appliance(), a.addr());

    // Small, then 1 MiB (256 packets at 4096 bytes), each read back.
    let small = pattern(1, 64);
    lease.write(100, &small).unwrap();
    let mut back = vec![0u8; 64];
    lease.read(100, &mut back).unwrap();
    assert_eq!(back, small);
    let big = pattern(2, MIB as usize);
    lease.write(MIB, &big).unwrap();
    let mut back = vec![0u8; MIB as usize];
    lease.read(MIB, &mut back).unwrap();
    assert!(back == big, "1 MiB did not read back");

    // Batches: eight 4 KiB blocks written together, read back together (one more than fits the window too).
    let blocks: Vec<Vec<u8>> = (0..9).map(|i| pattern(10 + i, 4096)).collect();
    let writes: Vec<(u64, &[u8])> =
        blocks.iter().enumerate().map(|(i, b)| (3 * MIB + i as u64 * 4096, b.as_slice())).collect();
    lease.write_many(&writes).unwrap();
    let mut bufs = vec![vec![0u8; 4096]; 9];
    let mut reads: Vec<(u64, &mut [u8])> =
        bufs.iter_mut().enumerate().map(|(i, b)| (3 * MIB + i as u64 * 4096, b.as_mut_slice())).collect();
    lease.read_many(&mut reads).unwrap();
    assert_eq!(bufs, blocks);

    let id = lease.id();
    assert_eq!(lease.free().unwrap(), Outcome::TornDown);
    match client.call(0, Request::Query { lease: id }) {
        Err(e) => assert!(e.server_code().is_some(), "{e}"),
        Ok(Response::Query(info)) => assert_ne!(info.state, leasebox_proto::LeaseState::Active),
        Ok(other) => panic!("QUERY answered {other:?}"),
    }
}

#[test]
fn out_of_range_is_refused_before_anything_is_sent() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let size = lease.size();
    let e = lease.write(size - 4, &[1; 8]).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { offset, len: 8, .. } if offset == size - 4), "{e}");
    assert!(e.to_string().contains("nothing was sent"), "{e}");
    let e = lease.read(u64::MAX, &mut [0; 2]).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    // One bad range refuses the whole batch: the good first write did not land either.
    let e = lease.write_many(&[(0, &[7; 16]), (size, &[1])]).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { offset, .. } if offset == size), "{e}");
    let mut back = [0xAAu8; 16];
    lease.read(0, &mut back).unwrap();
    assert_eq!(back, [0; 16], "a refused batch wrote nothing");
    // The lease is still fine; its last byte is reachable.
    lease.write(size - 1, &[9]).unwrap();
    let mut b = [0u8; 1];
    lease.read(size - 1, &mut b).unwrap();
    assert_eq!(b, [9]);
    assert_eq!(client.alloc(0, AllocOptions::default()).unwrap_err().to_string(), "configuration: a lease of 0 bytes");
}

#[test]
fn placement_follows_free_bytes_and_no_memory_goes_elsewhere() {
    let _one = serial();
    let small = start_hosted(&["lease_pool_mib=16"]);
    let large = start_hosted(&["lease_pool_mib=32"]);
    let client = Client::connect(config(vec![small.appliance(), large.appliance()])).unwrap();
    assert_eq!(client.free_bytes(0).unwrap(), 16 * MIB);
    assert_eq!(client.free_bytes(1).unwrap(), 32 * MIB);

    // 32 free beats 16, then 24 beats 16; at 16 against 16 the list's order decides.
    let l1 = client.alloc(8 * MIB, AllocOptions::default()).unwrap();
    assert_eq!(l1.appliance_index(), 1);
    let l2 = client.alloc(8 * MIB, AllocOptions::default()).unwrap();
    assert_eq!(l2.appliance_index(), 1);
    let mut l3 = client.alloc(8 * MIB, AllocOptions::default()).unwrap();
    assert_eq!(l3.appliance_index(), 0);

    // The small appliance first, by preference: it has 8 MiB left, answers NO_MEMORY, the large one lends.
    let mut l4 = client.alloc(12 * MIB, AllocOptions { prefer: Some(0), ..AllocOptions::default() }).unwrap();
    assert_eq!(l4.appliance_index(), 1);
    for (l, seed) in [(&mut l3, 3), (&mut l4, 4)] {
        let data = pattern(seed, 4096);
        l.write(l.size() - 4096, &data).unwrap();
        let mut back = vec![0; 4096];
        l.read(l.size() - 4096, &mut back).unwrap();
        assert_eq!(back, data);
    }

    // Nobody has 16 MiB left: the error names both appliances.
    match client.alloc(16 * MIB, AllocOptions::default()) {
        Err(Error::NoMemory { size, tried }) => {
            assert_eq!(size, 16 * MIB);
            assert_eq!(tried.len(), 2, "{tried:?}");
        }
        other => panic!("expected NoMemory, got {other:?}"),
    }
    drop((l1, l2, l3, l4));
}

#[test]
fn a_killed_connection_is_reconnected_and_leases_go_on() {
    let _one = serial();
    let a = start_hosted(&[]);
    let proxy = Proxy::start(a.addr());
    let client = Client::connect(config(vec![a.appliance_at(proxy.addr.to_string())])).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let before = pattern(5, 4096);
    lease.write(0, &before).unwrap();

    proxy.kill();
    let lost = wait_event(&client, Duration::from_secs(10), |e| matches!(e, Event::Disconnected { .. }));
    assert!(lost.is_some(), "no Disconnected event");
    let back = wait_event(&client, Duration::from_secs(10), |e| matches!(e, Event::Reconnected { .. }));
    assert!(back.is_some(), "no Reconnected event");
    assert_eq!(proxy.accepted.load(Ordering::Acquire), 2);

    // The lease lives on (the tenant's new session took it over) and its data with it.
    let mut got = vec![0; 4096];
    lease.read(0, &mut got).unwrap();
    assert_eq!(got, before);
    lease.write(4096, &before).unwrap();
    // New control traffic goes over the new connection.
    let mut l2 = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    l2.write(0, &[1, 2, 3]).unwrap();
    assert!(matches!(client.call(0, Request::Query { lease: lease.id() }), Ok(Response::Query(_))));
    assert_eq!(lease.free().unwrap(), Outcome::TornDown);
    assert_eq!(l2.free().unwrap(), Outcome::TornDown);
}

#[test]
fn a_request_on_a_killed_connection_is_repeated_on_the_new_one() {
    let _one = serial();
    // A long heartbeat timeout: no heartbeat finds the break first, the next call does.
    let a = start_hosted(&["heartbeat_ms=60000"]);
    let proxy = Proxy::start(a.addr());
    let client = Client::connect(config(vec![a.appliance_at(proxy.addr.to_string())])).unwrap();
    proxy.kill();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(client.free_bytes(0).unwrap(), 64 * MIB);
    assert!(client.try_events().iter().any(|e| matches!(e, Event::Reconnected { .. })));
}

#[test]
fn an_admin_revoke_fails_the_next_write_with_the_revoke_error() {
    let _one = serial();
    let a = start_hosted(&[]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let cfg = ClientConfig {
        on_event: Some(Arc::new(move |e: &Event| s.lock().unwrap().push(e.clone()))),
        ..config(vec![a.appliance()])
    };
    let client = Client::connect(cfg).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    lease.write(0, &[1; 64]).unwrap();

    let mut admin = a.admin();
    match admin.call(&Request::Revoke { lease: lease.id(), qp_first: false }).unwrap() {
        Response::Revoke { outcome, .. } => assert_eq!(outcome, Outcome::TornDown),
        other => panic!("REVOKE answered {other:?}"),
    }
    let e = lease.write(0, &[2; 64]).unwrap_err();
    let Error::Revoked { lease: id, outcome } = e else { panic!("expected Revoked, got {e}") };
    assert_eq!(id, lease.id());
    assert!(matches!(outcome, Outcome::TornDown | Outcome::NotFound), "{outcome:?}");
    assert_eq!(lease.revoked(), Some(outcome));
    // From now on every call fails at once, with the same error.
    let t = Instant::now();
    assert!(matches!(lease.read(0, &mut [0; 8]), Err(Error::Revoked { .. })));
    assert!(t.elapsed() < Duration::from_millis(100));
    assert!(matches!(lease.free(), Err(Error::Revoked { .. })));
    // The event came once, through the channel and the callback.
    let ev = wait_event(&client, Duration::from_secs(2), |e| matches!(e, Event::Revoked { .. }));
    assert!(matches!(ev, Some(Event::Revoked { lease: l, .. }) if l == id), "{ev:?}");
    let revokes = seen.lock().unwrap().iter().filter(|e| matches!(e, Event::Revoked { .. })).count();
    assert_eq!(revokes, 1);
    let _ = admin.bye();
}

#[test]
fn a_dropped_lease_is_freed_and_a_dropped_client_ends_its_session() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let id = lease.id();
    drop(lease);
    let end = Instant::now() + Duration::from_secs(5);
    let gone = loop {
        match client.call(0, Request::Query { lease: id }) {
            Ok(Response::Query(i)) if i.state == leasebox_proto::LeaseState::Active => {}
            _ => break true,
        }
        if Instant::now() > end {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(gone, "the dropped lease was not freed");

    // A lease still held when the client goes is freed by the client's shutdown; its calls then fail.
    let mut kept = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let kept_id = kept.id();
    drop(client);
    assert!(matches!(kept.write(0, &[1]), Err(Error::Closed(_))));
    let mut admin = a.admin();
    match admin.call(&Request::Query { lease: kept_id }) {
        Ok(Response::Query(i)) => assert_ne!(i.state, leasebox_proto::LeaseState::Active),
        Ok(other) => panic!("QUERY answered {other:?}"),
        Err(_) => {}
    }
    let _ = admin.bye();
}

#[test]
fn a_wrong_key_is_refused_at_connect() {
    let _one = serial();
    let a = start_hosted(&[]);
    let mut app = a.appliance();
    app.credentials.key = key().1;
    let e = Client::connect(config(vec![app])).unwrap_err();
    assert!(matches!(e, Error::Server { .. } | Error::Connection { .. }), "{e}");
}

#[test]
fn the_client_renews_a_short_ttl_and_reports_a_revoke_with_no_rdma() {
    let _one = serial();
    // Heartbeats do not renew here: only the client's RENEWs keep a lease past its TTL.
    let a = start_hosted(&["heartbeat_renews=off"]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let opts = AllocOptions { ttl_ms: 600, ..AllocOptions::default() };
    let mut kept = client.alloc(2 * MIB, opts).unwrap();
    let mut revoked = client.alloc(2 * MIB, opts).unwrap();
    std::thread::sleep(Duration::from_millis(1800));
    kept.write(0, &[5; 32]).unwrap();

    // Revoked with no RDMA traffic: the notice (or else the next RENEW, within 300 ms) says so.
    let mut admin = a.admin();
    assert!(matches!(
        admin.call(&Request::Revoke { lease: revoked.id(), qp_first: false }),
        Ok(Response::Revoke { .. })
    ));
    let id = revoked.id();
    let ev = wait_event(&client, Duration::from_secs(3), |e| matches!(e, Event::Revoked { .. }));
    assert!(matches!(ev, Some(Event::Revoked { lease, .. }) if lease == id), "{ev:?}");
    // Known before any RDMA: the write fails at once.
    assert!(revoked.revoked().is_some());
    assert!(matches!(revoked.write(0, &[1]), Err(Error::Revoked { .. })));
    assert_eq!(kept.free().unwrap(), Outcome::TornDown);
    let _ = admin.bye();
}

#[test]
fn a_lease_freed_while_the_appliance_is_unreachable_is_freed_after_the_reconnect() {
    let _one = serial();
    let a = start_hosted(&[]);
    let proxy = Proxy::start(a.addr());
    let client = Client::connect(config(vec![a.appliance_at(proxy.addr.to_string())])).unwrap();
    let dropped = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let freed = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let ids = [dropped.id(), freed.id()];

    proxy.refuse.store(true, Ordering::Release);
    proxy.kill();
    drop(dropped);
    let e = freed.free().unwrap_err();
    assert!(matches!(e, Error::Connection { .. } | Error::Timeout { .. }), "{e}");
    proxy.refuse.store(false, Ordering::Release);
    let back = wait_event(&client, Duration::from_secs(10), |e| matches!(e, Event::Reconnected { .. }));
    assert!(back.is_some(), "no Reconnected event");

    // Both FREEs went out on the new connection: neither lease is active (nor kept by the new session).
    let end = Instant::now() + Duration::from_secs(5);
    for id in ids {
        loop {
            match client.call(0, Request::Query { lease: id }) {
                Ok(Response::Query(i)) if i.state == leasebox_proto::LeaseState::Active => {
                    assert!(Instant::now() < end, "lease {id:?} still active");
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break,
            }
        }
    }
}

#[test]
fn notices_become_events_at_once() {
    let _one = serial();
    let (small, large) = (start_hosted(&[]), start_hosted(&[]));
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let cfg = ClientConfig {
        on_event: Some(Arc::new(move |e: &Event| {
            let _ = tx.lock().unwrap().send((Instant::now(), e.clone()));
        })),
        ..config(vec![small.appliance(), large.appliance()])
    };
    let client = Client::connect(cfg).unwrap();
    // The default TTL (60 s): a RENEW would come only after 30 s; the notice must be what tells the client.
    let mut lease = client.alloc(2 * MIB, AllocOptions { prefer: Some(0), ..AllocOptions::default() }).unwrap();
    assert_eq!(lease.appliance_index(), 0);
    let mut admin = small.admin();
    let sent = Instant::now();
    assert!(matches!(admin.call(&Request::Revoke { lease: lease.id(), qp_first: false }), Ok(Response::Revoke { .. })));
    let (at, ev) = rx.recv_timeout(Duration::from_secs(2)).expect("no event after the REVOKE");
    assert!(matches!(&ev, Event::Revoked { lease: l, outcome: Outcome::TornDown, .. } if *l == lease.id()), "{ev:?}");
    eprintln!("REVOKE → event: {} µs", at.duration_since(sent).as_micros());
    assert!(at.duration_since(sent) < Duration::from_secs(1));
    // Known before any RDMA was tried.
    assert!(matches!(lease.write(0, &[1]), Err(Error::Revoked { outcome: Outcome::TornDown, .. })));

    // A drain of our tenant: the Draining event, then placement avoids that appliance while it lasts, then the
    // lease held there is revoked.
    let mut doomed = client.alloc(2 * MIB, AllocOptions { prefer: Some(0), ..AllocOptions::default() }).unwrap();
    assert_eq!(doomed.appliance_index(), 0);
    assert!(matches!(
        admin.call(&Request::Drain { tenant: "demo".into(), notice_ms: 1500 }),
        Ok(Response::Drain { leases: 1, .. })
    ));
    let (_, ev) = rx.recv_timeout(Duration::from_secs(2)).expect("no Draining event");
    assert!(matches!(ev, Event::Draining { in_ms: 1500, .. }), "{ev:?}");
    let elsewhere = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    assert_eq!(elsewhere.appliance_index(), 1, "placed on the draining appliance");
    // Even when asked for first, the draining appliance answers BUSY and the other lends.
    let pushed = client.alloc(2 * MIB, AllocOptions { prefer: Some(0), ..AllocOptions::default() }).unwrap();
    assert_eq!(pushed.appliance_index(), 1);
    let (_, ev) = rx.recv_timeout(Duration::from_secs(5)).expect("no Revoked event after the drain");
    assert!(matches!(&ev, Event::Revoked { lease: l, .. } if *l == doomed.id()), "{ev:?}");
    assert!(matches!(doomed.read(0, &mut [0; 4]), Err(Error::Revoked { .. })));
    let _ = admin.bye();
}

#[test]
fn a_silent_connection_is_replaced_and_resumed_before_the_old_session_times_out() {
    let _one = serial();
    // The appliance keeps a silent session for a minute; the client gives up on an answer after 1 s.
    let a = start_hosted(&["heartbeat_ms=60000"]);
    let proxy = Proxy::start(a.addr());
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        receive: Duration::from_secs(1),
        retry_for: Duration::from_secs(5),
    };
    let cfg = ClientConfig { timeouts, ..ClientConfig::new(vec![a.appliance_at(proxy.addr.to_string())]) };
    let client = Client::connect(cfg).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    lease.write(0, &[3; 64]).unwrap();

    proxy.freeze();
    // STATS on the silent connection: no answer within 1 s, a new connection, and STATS again there.
    assert_eq!(client.free_bytes(0).unwrap(), 62 * MIB);
    let events = client.try_events();
    assert!(events.iter().any(|e| matches!(e, Event::Disconnected { .. })), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, Event::Reconnected { .. })), "{events:?}");
    // The new session RESUMEd the old one at once (the old one would hold the lease for another minute):
    // the appliance counts it.
    let mut admin = a.admin();
    match admin.call(&Request::Stats) {
        Ok(Response::Stats(s)) => assert_eq!(s.leases.reconnects, 1),
        other => panic!("STATS answered {other:?}"),
    }
    let mut back = [0u8; 64];
    lease.read(0, &mut back).unwrap();
    assert_eq!(back, [3; 64]);
    assert_eq!(lease.free().unwrap(), Outcome::TornDown);
    let _ = admin.bye();
}
