//! Session budgets over real TCP against the hosted appliance (docs/operations.md, "Budgets"): a tenant is
//! capped below the session budget while the admin still gets in, a tenant's STATS are its own, and
//! unauthenticated connections fill only their own pool, one address only its share of it, and the oldest
//! idle one is evicted for a newer one (docs/security.md, "Pre-authentication").

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leasebox_hosted::{Hosted, HostedConfig};
use leasebox_proto::{ErrorBody, ErrorCode, FrameBuf, Kind, Next, Request, Response, Role};
use leasectl::{Client, ClientError, Credentials, Timeouts};

const DEMO: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const ADMIN: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf";

fn start(budgets: &[&str]) -> Hosted {
    let mut args: Vec<String> = ["--listen", "127.0.0.1:0"].iter().map(|s| s.to_string()).collect();
    args.push(format!("tenant=demo:{DEMO}"));
    args.push(format!("admin={ADMIN}"));
    args.extend(budgets.iter().map(|s| s.to_string()));
    Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap()
}

fn login(h: &Hosted, name: &str, key: &str) -> Result<Client, ClientError> {
    let who = Credentials { name: name.into(), key: leasectl::hex::decode(key).unwrap() };
    Client::connect_and_hello(&h.addr().to_string(), &who, Timeouts::all(Duration::from_secs(10))).map(|c| c.0)
}

fn busy(r: Result<Client, ClientError>) -> ErrorBody {
    match r {
        Err(ClientError::Server(e)) if e.code == ErrorCode::Busy => e,
        Err(e) => panic!("expected BUSY, got {e}"),
        Ok(_) => panic!("expected BUSY, got a session"),
    }
}

fn heartbeat(c: &mut Client) {
    assert!(matches!(c.call(&Request::Heartbeat { echo: 7 }).unwrap(), Response::Heartbeat { echo: 7, .. }));
}

#[test]
fn a_tenant_is_capped_and_the_admin_still_gets_in() {
    let h = start(&["sessions=4", "sessions_per_tenant=2", "admin_sessions=1"]);
    let mut held = vec![login(&h, "demo", DEMO).unwrap(), login(&h, "demo", DEMO).unwrap()];
    let e = busy(login(&h, "demo", DEMO));
    assert!(e.message.contains("holds its 2 sessions"), "{}", e.message);
    let mut admin = login(&h, "admin", ADMIN).unwrap();
    // The tenant sees its own figures; the admin the appliance's.
    let Response::Stats(t) = held[0].call(&Request::Stats).unwrap() else { panic!("no STATS") };
    assert_eq!((t.sessions_current, t.session_budget, t.sessions_total, t.sessions_refused), (2, 2, 2, 1));
    assert_eq!((t.frames_in, t.errors.len()), (0, 0));
    let Response::Stats(a) = admin.call(&Request::Stats).unwrap() else { panic!("no STATS") };
    assert_eq!((a.sessions_current, a.session_budget), (3, 4));
    assert!(a.frames_in > 0);
    for c in &mut held {
        heartbeat(c);
    }
    h.stop();
}

/// Reads what the server sends on `s` within `wait`: `Some(bytes)` once it closed, `None` while it is open
/// and silent.
fn closed_with(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut v = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(v),
            Ok(n) => v.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && v.is_empty() => return None,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Some(v),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Whether `bytes` hold a BUSY error frame first.
fn is_busy(bytes: &[u8]) -> bool {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    matches!(fb.next_frame(), Next::Frame(hd, p) if hd.kind == Kind::Error
        && ErrorBody::decode(&p).unwrap().code == ErrorCode::Busy)
}

/// Logs in from `addr` (the appliance's port on another loopback address: another source).
fn login_via(addr: &str, name: &str, key: &str) -> Result<Client, ClientError> {
    let who = Credentials { name: name.into(), key: leasectl::hex::decode(key).unwrap() };
    Client::connect_and_hello(addr, &who, Timeouts::all(Duration::from_secs(10))).map(|c| c.0)
}

#[test]
fn unauthenticated_connections_cannot_crowd_out_sessions() {
    // Listening on every IPv6 address (and IPv4 through mapped addresses): 127.0.0.1 and ::1 are two sources.
    let mut args: Vec<String> = ["--listen", "[::]:0", "sessions=4", "preauth_sessions=2"].map(String::from).to_vec();
    args.push(format!("tenant=demo:{DEMO}"));
    args.push(format!("admin={ADMIN}"));
    let h = Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap();
    let v4 = format!("127.0.0.1:{}", h.addr().port());
    let v6 = format!("[::1]:{}", h.addr().port());
    let mut demo = login_via(&v4, "demo", DEMO).unwrap();
    let mut admin = login_via(&v4, "admin", ADMIN).unwrap();
    assert_eq!(admin.welcome().map(|w| w.role), Some(Role::Admin));
    // Three connections from ::1, an address no session has come from, that never say anything: a pool of 2
    // gives such an address 1 place, so the first holds it and the next two are refused BUSY (the place is
    // younger than a second).
    let mut silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&v6).unwrap()).collect();
    let end = Instant::now() + Duration::from_secs(20);
    let mut refused = Vec::new();
    while refused.len() < 2 {
        for (i, s) in silent.iter_mut().enumerate() {
            if !refused.contains(&i) && closed_with(s, Duration::from_millis(50)).is_some_and(|b| is_busy(&b)) {
                refused.push(i);
            }
        }
        assert!(Instant::now() < end, "connections refused BUSY: {refused:?}");
    }
    let holder = (0..3).find(|i| !refused.contains(i)).unwrap();
    assert!(closed_with(&mut silent[holder], Duration::from_millis(50)).is_none(), "the first still holds its place");
    // The address sessions came from is not affected: a login from 127.0.0.1 gets in at once.
    let mut other = login_via(&v4, "demo", DEMO).unwrap();
    heartbeat(&mut other);
    // From ::1, once the silent place is a second old, a new client evicts it (its oldest idle one).
    std::thread::sleep(Duration::from_millis(1_100));
    let mut again = login_via(&v6, "demo", DEMO).unwrap();
    let evicted = closed_with(&mut silent[holder], Duration::from_secs(5)).expect("the silent connection is evicted");
    assert!(is_busy(&evicted));
    heartbeat(&mut again);
    heartbeat(&mut demo);
    heartbeat(&mut admin);
    h.stop();
}
