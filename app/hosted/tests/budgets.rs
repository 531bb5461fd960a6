//! Session budgets over real TCP against the hosted appliance (docs/operations.md, "Budgets"): a tenant is
//! capped below the session budget while the admin still gets in, a tenant's STATS are its own, and
//! unauthenticated connections fill only their own pool: a new one is refused BUSY while established
//! sessions go on.

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

#[test]
fn unauthenticated_connections_cannot_crowd_out_sessions() {
    let h = start(&["sessions=4", "preauth_sessions=2"]);
    let mut demo = login(&h, "demo", DEMO).unwrap();
    let mut admin = login(&h, "admin", ADMIN).unwrap();
    assert_eq!(admin.welcome().map(|w| w.role), Some(Role::Admin));
    // Three connections that never say anything: two fill the pool, the third is refused BUSY and closed.
    let mut silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(h.addr()).unwrap()).collect();
    let end = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        if let Some(i) = (0..3).find(|i| {
            closed_with(&mut silent[*i], Duration::from_millis(100)).is_some_and(|b| {
                let mut fb = FrameBuf::new();
                fb.push(&b);
                matches!(fb.next_frame(), Next::Frame(hd, p) if hd.kind == Kind::Error
                && ErrorBody::decode(&p).unwrap().code == ErrorCode::Busy)
            })
        }) {
            break i;
        }
        assert!(Instant::now() < end, "no connection refused BUSY");
    };
    for i in (0..3).filter(|i| *i != refused) {
        assert!(closed_with(&mut silent[i], Duration::from_millis(50)).is_none(), "connection {i} still open");
    }
    // With the pool full a new client is refused too; the sessions are served as before.
    let e = busy(login(&h, "demo", DEMO));
    assert!(e.message.contains("unauthenticated"), "{}", e.message);
    heartbeat(&mut demo);
    heartbeat(&mut admin);
    // The silent clients go: their places come back.
    drop(silent);
    let end = Instant::now() + Duration::from_secs(20);
    let mut again = loop {
        match login(&h, "demo", DEMO) {
            Ok(c) => break c,
            Err(ClientError::Server(e)) if e.code == ErrorCode::Busy && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("after the silent clients left: {e}"),
        }
    };
    heartbeat(&mut again);
    h.stop();
}
