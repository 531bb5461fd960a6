//! `Client` and `Lease` against hosted appliances with the device model (`--hca`: RDMA over the model's UDP
//! responder): the round trip with data checked, ranges refused before anything is sent, placement by free
//! bytes and the retry elsewhere on NO_MEMORY, a killed connection the client comes back from (RESUME), an
//! operator's REVOKE that the next write reports, the appliance's notices as events (revoke, drain), and a client
//! started before its appliance that connects soon after the appliance listens.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::appliance::{MIB, config, pattern, serial, start_hosted, wait_event};
use support::proxy::Proxy;

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{
    AllocOptions, Appliance, Client, ClientConfig, Credentials, Error, Event, Outcome, RequesterConfig, Timeouts,
};
use leasebox_hosted::testing::{Key, Rig};
use leasebox_proto::{Request, Response};

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
    // From now on every call fails at once, with the same error: the client's own record answers (causal, not
    // timed: a READ that went to the wire would meet the destroyed MKEY and fail as an RDMA error instead).
    assert!(matches!(lease.read(0, &mut [0; 8]), Err(Error::Revoked { .. })));
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
    app.credentials.key = Key::random().bytes().to_vec();
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
    // The 2 s wait above is the check, and a wall-clock bound that stays: what tells the client is either the
    // notice or the RENEW 30 s later, and only a deadline between them tells which (15 times the margin).
    eprintln!("REVOKE → event: {} µs", at.duration_since(sent).as_micros());
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

/// A free port on loopback (bound and let go: nothing listens there until the test starts the appliance).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A hosted appliance without the model (the control channel is all this needs) at `addr`.
fn start_control_only(addr: SocketAddr, key: &Key) -> Rig {
    Rig::builder().listen(addr).tenant_with_key("demo", key.clone()).start().unwrap()
}

/// A client started before its appliance connects within about 100 ms of the appliance starting to listen:
/// blocked in `Client::connect` (one appliance), and in the background (a second appliance, down at connect,
/// whose connection thread has been retrying for seconds: no backoff grew meanwhile).
#[test]
fn a_client_started_first_connects_soon_after_the_appliance_listens() {
    let _one = serial();
    let key = Key::random();
    let who = Credentials { name: "demo".into(), key: key.bytes().to_vec() };
    let appliance = |addr: SocketAddr| Appliance {
        addr: addr.to_string(),
        credentials: who.clone(),
        requester: RequesterConfig::Soft(SoftConfig::default()),
    };
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        receive: Duration::from_secs(5),
        retry_for: Duration::from_secs(30),
    };

    // Blocked in connect.
    let first = free_port();
    let cfg = ClientConfig { timeouts, ..ClientConfig::new(vec![appliance(first)]) };
    let waiter = std::thread::spawn(move || Client::connect(cfg).map(|c| (Instant::now(), c)));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!waiter.is_finished(), "connected with nothing listening");
    let before = Instant::now();
    let h1 = start_control_only(first, &key);
    let listening = Instant::now();
    let (connected, c1) = waiter.join().unwrap().unwrap();
    let late = connected.saturating_duration_since(listening);
    eprintln!("listening (start took {:?}) → connected: {late:?}", listening - before);
    assert!(connected > before);
    // Wall clock, and it stays: how soon a waiting client notices a listener is a latency of its real-time
    // reconnect pause (100 ms), with no clock to script; the bound allows 300 ms of scheduling on top.
    assert!(late < Duration::from_millis(100 + 300), "connected {late:?} after the appliance listened");

    // In the background: the second appliance is down at connect; then, for 4 s, something answers there that
    // is not an appliance (each attempt fails at once, as fast as a reconnect can: a backoff would grow to its
    // largest meanwhile); then the appliance comes up.
    let second = free_port();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let cfg = ClientConfig {
        timeouts: Timeouts { retry_for: Duration::from_millis(200), ..timeouts },
        on_event: Some(Arc::new(move |e: &Event| {
            if matches!(e, Event::Reconnected { .. }) {
                let _ = tx.lock().unwrap().send(Instant::now());
            }
        })),
        ..ClientConfig::new(vec![appliance(h1.addr()), appliance(second)])
    };
    let c2 = Client::connect(cfg).unwrap();
    let impostor = TcpListener::bind(second).unwrap();
    impostor.set_nonblocking(true).unwrap();
    let (mut refused, end) = (0, Instant::now() + Duration::from_secs(4));
    while Instant::now() < end {
        match impostor.accept() {
            Ok((mut s, _)) => {
                let _ = std::io::Write::write_all(&mut s, &[0xEE; 64]);
                refused += 1;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    drop(impostor);
    assert!(rx.try_recv().is_err(), "connected to something that is not an appliance");
    // One attempt per pause: not a spin (nor a pause grown to seconds).
    eprintln!("{refused} attempts at the impostor in 4 s");
    assert!((20..=400).contains(&refused), "{refused} attempts in 4 s");
    let before = Instant::now();
    let h2 = start_control_only(second, &key);
    let listening = Instant::now();
    let up = rx.recv_timeout(Duration::from_secs(10)).expect("never connected to the late appliance");
    let late = up.saturating_duration_since(listening);
    eprintln!("listening (start took {:?}) → connected in the background: {late:?}", listening - before);
    assert!(up > before);
    // Wall clock, and it stays (as above).
    assert!(late < Duration::from_millis(100 + 300), "connected {late:?} after the appliance listened");
    let reached = c2.call(1, Request::Health);
    assert!(!matches!(reached, Err(Error::Connection { .. } | Error::Timeout { .. })), "{reached:?}");
    drop((c1, c2));
    h1.stop();
    h2.stop();
}
