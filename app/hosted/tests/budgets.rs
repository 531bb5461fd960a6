//! Session budgets over real TCP against the hosted appliance (docs/operations.md, "Budgets"): a tenant is
//! capped below the session budget while the admin still gets in, a tenant's STATS are its own, and
//! unauthenticated connections fill only their own pool, one address only its share of it, and the oldest
//! idle one is evicted for a newer one (docs/security.md, "Pre-authentication").

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leasebox_hosted::testing::{Builder, Rig};
use leasebox_proto::{ErrorBody, ErrorCode, FrameBuf, Kind, Next, Request, Response, Role};
use leasectl::{Client, ClientError, Credentials, Timeouts};

/// The rig with tenant `demo` and the admin, and `budgets`' option words.
fn start(budgets: &[(&str, u32)]) -> Rig {
    start_on(Rig::builder(), budgets)
}

fn start_on(b: Builder, budgets: &[(&str, u32)]) -> Rig {
    budgets.iter().fold(b.tenant("demo").admin(), |b, (k, v)| b.option(k, v)).start().unwrap()
}

/// `name`'s credentials on `h` (`admin`: the admin's).
fn who(h: &Rig, name: &str) -> Credentials {
    let key = if name == "admin" { h.admin_key() } else { h.key(name) };
    Credentials { name: name.into(), key: key.bytes().to_vec() }
}

fn login(h: &Rig, name: &str) -> Result<Client, ClientError> {
    login_via(&h.addr().to_string(), h, name)
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
    let h = start(&[("sessions", 4), ("sessions_per_tenant", 2), ("admin_sessions", 1)]);
    let mut held = vec![login(&h, "demo").unwrap(), login(&h, "demo").unwrap()];
    let e = busy(login(&h, "demo"));
    assert!(e.message.contains("holds its 2 sessions"), "{}", e.message);
    let mut admin = login(&h, "admin").unwrap();
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
fn login_via(addr: &str, h: &Rig, name: &str) -> Result<Client, ClientError> {
    Client::connect_and_hello(addr, &who(h, name), Timeouts::all(Duration::from_secs(10))).map(|c| c.0)
}

#[test]
fn unauthenticated_connections_cannot_crowd_out_sessions() {
    // Listening on every IPv6 address (and IPv4 through mapped addresses): 127.0.0.1 and ::1 are two sources.
    let h = start_on(Rig::builder().listen("[::]:0"), &[("sessions", 4), ("preauth_sessions", 2)]);
    let v4 = format!("127.0.0.1:{}", h.addr().port());
    let v6 = format!("[::1]:{}", h.addr().port());
    let mut demo = login_via(&v4, &h, "demo").unwrap();
    let mut admin = login_via(&v4, &h, "admin").unwrap();
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
    let mut other = login_via(&v4, &h, "demo").unwrap();
    heartbeat(&mut other);
    // From ::1, once the silent place is a second old, a new client evicts it (its oldest idle one).
    std::thread::sleep(Duration::from_millis(1_100));
    let mut again = login_via(&v6, &h, "demo").unwrap();
    let evicted = closed_with(&mut silent[holder], Duration::from_secs(5)).expect("the silent connection is evicted");
    assert!(is_busy(&evicted));
    heartbeat(&mut again);
    heartbeat(&mut demo);
    heartbeat(&mut admin);
    h.stop();
}
