use super::*;
use crate::admission::{Budget, HeapUse};
use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use leasebox_proto::v2::{Announce, Initiator, Transport};
use leasebox_proto::{
    ErrorBody, ErrorCode, FrameBuf, Hello, HelloInit, HelloNoise, HelloReply, Histogram, Kind, LeaseId, LeaseStats,
    Next, Notice, Op, Outcome, Reply, Request, Response, Role, v2,
};

extern crate std;
use core::cell::RefCell;
use std::collections::BTreeMap;

std::thread_local! {
    /// The client end of each test connection's record layer, once its HELLO has completed (each test runs on
    /// its own thread, so connection ids do not clash across tests).
    static CLIENTS: RefCell<BTreeMap<u64, Transport>> = const { RefCell::new(BTreeMap::new()) };
    /// The announcement each test connection's handshake decrypted (its boot id and resume token).
    static ANNOUNCED: RefCell<BTreeMap<u64, Announce>> = const { RefCell::new(BTreeMap::new()) };
    /// Logins so far on this thread (each draws its own ephemeral key from it).
    static LOGINS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// What the server announced to connection `c` in its handshake.
fn announced(c: ConnId) -> Announce {
    ANNOUNCED.with(|m| m.borrow()[&c.0])
}

const DEMO_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const ADMIN_KEY: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf";

/// Deterministic "entropy" for tests: a counter, so every nonce differs.
struct Counter(u64);
impl Entropy for Counter {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        for b in buf {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *b = (self.0 >> 33) as u8;
        }
        Ok(())
    }
}
/// The tests' appliance: no HCA, no cores.
impl Appliance for Counter {}
/// An appliance with an HCA whose command queue counts [`DEFERRING_HCA`].
struct WithHca(Counter);
impl Entropy for WithHca {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        self.0.fill(buf)
    }
}
impl Appliance for WithHca {
    fn hca(&self) -> (leasebox_proto::HcaState, String) {
        (leasebox_proto::HcaState::Ok, "ConnectX-5".to_string())
    }
    fn hca_stats(&self) -> Option<leasebox_proto::HcaStats> {
        Some(DEFERRING_HCA)
    }
}
struct Broken;
impl Appliance for Broken {}
impl Entropy for Broken {
    fn fill(&mut self, _: &mut [u8]) -> Result<(), EntropyError> {
        Err(EntropyError)
    }
}

fn keys() -> Keyring {
    let mut k = Keyring::new();
    k.add_tenant("demo", DEMO_KEY).unwrap();
    k.set_admin(ADMIN_KEY).unwrap();
    k
}

fn server(limits: Limits) -> Server<NoLeases, Counter> {
    Server::new(limits, keys(), NoLeases::default(), Counter(1), 0).unwrap()
}

enum Ans {
    Ok(Response),
    Err(ErrorBody),
    Notice(Notice),
}

/// Runs frame bytes through the server (sealed in a record once `c` is authenticated) and decodes every frame
/// it answers.
fn exchange<B: Leases, A: Appliance>(s: &mut Server<B, A>, c: ConnId, bytes: &[u8], now: u64) -> Vec<(u32, Ans)> {
    let wire = seal(c, bytes);
    s.input(c, &wire, now);
    take(s, c)
}

/// `bytes` as the client end of `c` sends them: in records once authenticated.
fn seal(c: ConnId, bytes: &[u8]) -> Vec<u8> {
    CLIENTS.with(|m| match m.borrow_mut().get_mut(&c.0) {
        Some(t) if !bytes.is_empty() => {
            let mut w = Vec::new();
            t.seal(bytes, &mut w).unwrap();
            w
        }
        _ => bytes.to_vec(),
    })
}

/// Decodes every frame the server has queued for `c` (opening records once authenticated).
fn take<B: Leases, A: Appliance>(s: &mut Server<B, A>, c: ConnId) -> Vec<(u32, Ans)> {
    let mut fb = FrameBuf::new();
    fb.push(&take_plain(s, c));
    let mut v = Vec::new();
    while let Next::Frame(h, p) = fb.next_frame() {
        let op = Op::from_raw(h.op);
        let a = match h.kind {
            Kind::Error => Ans::Err(ErrorBody::decode(&p).unwrap()),
            Kind::Notice => Ans::Notice(Notice::decode(&p).unwrap()),
            _ => Ans::Ok(Response::decode(op.unwrap(), &p).unwrap()),
        };
        v.push((h.request_id, a));
    }
    v
}

/// The frame bytes the server has queued for `c`, out of their records once authenticated.
fn take_plain<B: Leases, A: Appliance>(s: &mut Server<B, A>, c: ConnId) -> Vec<u8> {
    let mut out = vec![0u8; 1 << 20];
    let n = s.output(c, &mut out);
    CLIENTS.with(|m| match m.borrow_mut().get_mut(&c.0) {
        Some(t) => {
            t.push(&out[..n]);
            let mut plain = Vec::new();
            while let Some(r) = t.open() {
                plain.extend(r.expect("the server's records authenticate"));
            }
            plain
        }
        None => out[..n].to_vec(),
    })
}

/// HELLO step 3 for `name` (`NAME` or `NAME#ID`) under `key`, with a fixed ephemeral key: the frame and the
/// client's handshake state.
fn hello_v2(name: &str, key: &str, e: u8) -> (Vec<u8>, Initiator) {
    hello_v2_with(name, key, [e; 32])
}

/// [`hello_v2`] with ephemeral private key `e`.
fn hello_v2_with(name: &str, key: &str, e: [u8; 32]) -> (Vec<u8>, Initiator) {
    let (name, key_id) = match name.split_once('#') {
        Some((n, id)) => (n, id.parse().unwrap()),
        None => (name, 0),
    };
    let p = v2::prologue(2, 2, key_id, name);
    let (init, msg1) = Initiator::start(&p, &v2::psk_from_key(&parse_hex(key).unwrap()), e);
    let h = HelloNoise { min_version: 2, max_version: 2, key_id, name: name.to_string(), msg1 };
    (req(Request::Hello(Hello::Noise(h)), 1), init)
}

fn req(r: Request, id: u32) -> Vec<u8> {
    let mut b = Vec::new();
    r.encode(id, &mut b);
    b
}

/// The request id of the HEARTBEAT [`login`] confirms the session with.
const CONFIRM_ID: u32 = 0x7fff_0000;

/// Full v2 HELLO and key confirmation (a first HEARTBEAT); the server's announcement as a
/// `HelloReply::Welcome` (its `server_proof` unused: the announcement authenticated as part of Noise message 2).
/// Afterwards [`exchange`] speaks records on `c`.
fn login<B: Leases, A: Appliance>(
    s: &mut Server<B, A>,
    c: ConnId,
    name: &str,
    key: &str,
) -> Result<HelloReply, ErrorBody> {
    login_at(s, c, name, key, 0)
}

/// [`login`] at `now` (virtual ms).
fn login_at<B: Leases, A: Appliance>(
    s: &mut Server<B, A>,
    c: ConnId,
    name: &str,
    key: &str,
    now: u64,
) -> Result<HelloReply, ErrorBody> {
    CLIENTS.with(|m| m.borrow_mut().remove(&c.0));
    // A fresh ephemeral key for every login, as a client draws one (the server refuses a message 1 it has
    // seen).
    let e = LOGINS.with(|n| {
        let k = n.get() + 1;
        n.set(k);
        let mut e = [0x42u8; 32];
        e[8..16].copy_from_slice(&k.to_le_bytes());
        e
    });
    let (hello, init) = hello_v2_with(name, key, e);
    let a = exchange(s, c, &hello, now);
    match a.into_iter().next().unwrap().1 {
        Ans::Ok(Response::Hello(HelloReply::Noise { msg2 })) => {
            let (w, t) = init.finish(&msg2).expect("the server holds the key");
            let a = Announce::decode(&w);
            assert_eq!(a.version, 2);
            ANNOUNCED.with(|m| m.borrow_mut().insert(c.0, a));
            CLIENTS.with(|m| m.borrow_mut().insert(c.0, t));
            // Key confirmation: the first record makes the session (or is refused BUSY over a budget).
            let confirmed = exchange(s, c, &req(Request::Heartbeat { echo: 0 }, CONFIRM_ID), now);
            match confirmed.into_iter().next().expect("an answer to the first record").1 {
                Ans::Ok(Response::Heartbeat { .. }) => {}
                Ans::Err(e) => return Err(e),
                Ans::Ok(r) => panic!("unexpected {r:?}"),
                Ans::Notice(n) => panic!("unexpected {n:?}"),
            }
            Ok(HelloReply::Welcome {
                role: Role::from_raw(a.role).unwrap(),
                credits: a.credits,
                heartbeat_ms: a.heartbeat_ms,
                session_id: a.session_id,
                server_proof: [0; 32],
            })
        }
        Ans::Err(e) => Err(e),
        Ans::Ok(r) => panic!("unexpected {r:?}"),
        Ans::Notice(n) => panic!("unexpected {n:?}"),
    }
}

#[test]
fn tenant_and_admin_authenticate() {
    let mut s = server(Limits::default());
    assert!(s.open(ConnId(1), 0) && s.open(ConnId(2), 0));
    let HelloReply::Welcome { role, credits, heartbeat_ms, .. } = login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap()
    else {
        unreachable!()
    };
    assert_eq!((role, credits, heartbeat_ms), (Role::Tenant, 8, 10_000));
    let HelloReply::Welcome { role, .. } = login(&mut s, ConnId(2), "admin", ADMIN_KEY).unwrap() else {
        unreachable!()
    };
    assert_eq!(role, Role::Admin);
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 9 }, 5), 10);
    assert!(matches!(a[0], (5, Ans::Ok(Response::Heartbeat { echo: 9, uptime_ms: 10 }))));
}

#[test]
fn nothing_but_hello_before_authentication() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    let a = exchange(&mut s, ConnId(1), &req(Request::Stats, 7), 0);
    assert!(matches!(&a[0], (7, Ans::Err(e)) if e.code == ErrorCode::NotAuthenticated));
    assert!(s.wants_close(ConnId(1)));
    s.open(ConnId(2), 0);
    let a = exchange(&mut s, ConnId(2), &req(Request::Hello(Hello::Proof { mac: [0; 32] }), 1), 0);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::BadState));
}

#[test]
fn credits_bound_outstanding_requests() {
    let mut s = server(Limits { credits: 3, ..Limits::default() });
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    // Five heartbeats in one segment, before the transport drains any answer: three fit, two exceed.
    let mut burst = Vec::new();
    for id in 10..15 {
        Request::Heartbeat { echo: id as u64 }.encode(id, &mut burst);
    }
    let a = exchange(&mut s, ConnId(1), &burst, 0);
    let codes: Vec<Option<ErrorCode>> = a
        .iter()
        .map(|(_, x)| match x {
            Ans::Err(e) => Some(e.code),
            _ => None,
        })
        .collect();
    assert_eq!(codes, [None, None, None, Some(ErrorCode::CreditExceeded), Some(ErrorCode::CreditExceeded)]);
    let Ans::Err(e) = &a[3].1 else { unreachable!() };
    assert_eq!(e.detail[0], 3);
    assert!(!s.wants_close(ConnId(1)), "exceeding credits does not end the session");
    // Drained: the credits are back.
    let a = exchange(&mut s, ConnId(1), &burst[..24 * 3], 0);
    assert!(a.iter().all(|(_, x)| matches!(x, Ans::Ok(_))));
}

#[test]
fn silent_sessions_time_out_and_are_reported() {
    let mut s = server(Limits { heartbeat_ms: 1000, ..Limits::default() });
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    s.tick(900);
    assert!(!s.wants_close(ConnId(1)));
    exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 3), 900);
    s.tick(1800);
    assert!(!s.wants_close(ConnId(1)), "the heartbeat at 900 ms reset the timer");
    s.tick(1901);
    assert!(s.wants_close(ConnId(1)));
    let a = exchange(&mut s, ConnId(1), &[], 1901);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Timeout));
    assert_eq!(s.backend().lost, [("demo".to_string(), CloseReason::HeartbeatTimeout)]);
    s.closed(ConnId(1), 1902);
    assert_eq!(s.sessions(), 0);
    assert_eq!(s.backend().lost.len(), 1, "reported once");
}

#[test]
fn unauthenticated_connections_cannot_hold_a_place() {
    let mut s = server(Limits { heartbeat_ms: 600_000, ..Limits::default() });
    s.open(ConnId(1), 0);
    let mut f = Vec::new();
    leasebox_proto::frame(Kind::Request, 0x0999, 4, &[], &mut f);
    let a = exchange(&mut s, ConnId(1), &f, 0);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::UnknownOp));
    assert!(s.wants_close(ConnId(1)), "any error before HELLO completes ends the connection");
    // A connection that keeps talking but never authenticates is closed at the HELLO deadline.
    s.open(ConnId(2), 0);
    let (hello, _) = hello_v2("demo", DEMO_KEY, 1);
    exchange(&mut s, ConnId(2), &hello[..hello.len() - 1], 4_000);
    s.tick(server::HELLO_DEADLINE_MS);
    assert!(!s.wants_close(ConnId(2)));
    s.tick(server::HELLO_DEADLINE_MS + 1);
    assert!(s.wants_close(ConnId(2)));
    let a = exchange(&mut s, ConnId(2), &[], 5_002);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Timeout));
}

#[test]
fn one_session_over_budget_gets_busy() {
    let mut s = server(Limits { sessions: 2, ..Limits::default() });
    assert!(s.open(ConnId(1), 0));
    assert!(s.open(ConnId(2), 0));
    assert!(!s.open(ConnId(3), 0));
    assert!(s.wants_close(ConnId(3)));
    let mut buf = [0u8; 256];
    let n = s.output(ConnId(3), &mut buf);
    let mut fb = FrameBuf::new();
    fb.push(&buf[..n]);
    let Next::Frame(h, p) = fb.next_frame() else { panic!() };
    assert_eq!(h.kind, Kind::Error);
    assert_eq!(ErrorBody::decode(&p).unwrap().code, ErrorCode::Busy);
    s.closed(ConnId(3), 0);
    s.closed(ConnId(1), 0);
    assert!(s.open(ConnId(4), 0), "a freed place is reusable");
    let st = s.stats(5);
    assert_eq!((st.sessions_current, st.sessions_total, st.sessions_refused), (2, 3, 1));
}

#[test]
fn lease_ops_without_a_lease_service_name_the_reason_and_bye_closes() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let lease = LeaseId { boot_id: [0; 16], slot: 0, generation: 1 };
    for (id, r) in
        [Request::Query { lease }, Request::Revoke { lease, qp_first: false }, Request::List { cursor: 0, max: 10 }]
            .into_iter()
            .enumerate()
    {
        let a = exchange(&mut s, ConnId(1), &req(r, id as u32), 0);
        assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::NotImplemented
                && e.message.ends_with(": the lease service is off: no HCA")));
    }
    let a = exchange(&mut s, ConnId(1), &req(Request::FencedSummary { cursor: 0, max: 128 }, 8), 0);
    assert!(matches!(&a[0].1, Ans::Ok(Response::FencedSummary { next_cursor: 0, slots }) if slots.is_empty()));
    let a = exchange(&mut s, ConnId(1), &req(Request::Bye, 9), 0);
    assert!(matches!(a[0], (9, Ans::Ok(Response::Bye))));
    assert!(s.wants_close(ConnId(1)));
    assert_eq!(s.backend().lost, [("demo".to_string(), CloseReason::Bye)]);
}

#[test]
fn malformed_frames_get_structured_errors() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    // Unknown op, framing kept.
    let mut f = Vec::new();
    leasebox_proto::frame(Kind::Request, 0x0999, 4, &[], &mut f);
    let a = exchange(&mut s, ConnId(1), &f, 0);
    assert!(matches!(&a[0], (4, Ans::Err(e)) if e.code == ErrorCode::UnknownOp && e.detail[0] == 0x999));
    // Truncated payload, framing kept.
    let mut f = Vec::new();
    leasebox_proto::frame(Kind::Request, Op::Heartbeat as u16, 5, &[1, 2], &mut f);
    let a = exchange(&mut s, ConnId(1), &f, 0);
    assert!(
        matches!(&a[0], (5, Ans::Err(e)) if e.code == ErrorCode::Malformed && e.message.contains("heartbeat.echo"))
    );
    assert!(!s.wants_close(ConnId(1)));
    // Garbage: framing lost, error then close.
    let a = exchange(&mut s, ConnId(1), b"GET / HTTP/1.1\r\n\r\n", 0);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::BadMagic));
    assert!(s.wants_close(ConnId(1)));
    assert_eq!(s.backend().lost, [("demo".to_string(), CloseReason::ProtocolError)]);
}

#[test]
fn refuses_to_start_without_entropy_or_keys() {
    assert_eq!(
        Server::new(Limits::default(), keys(), NoLeases::default(), Broken, 0).err(),
        Some(StartError::NoEntropy)
    );
    assert_eq!(
        Server::new(Limits::default(), Keyring::new(), NoLeases::default(), Counter(0), 0).err(),
        Some(StartError::NoPrincipals)
    );
}

#[test]
fn keyring_validates() {
    let mut k = Keyring::new();
    assert_eq!(k.add_tenant("admin", DEMO_KEY), Err(KeyError::ReservedName));
    assert_eq!(k.add_tenant("bad name", DEMO_KEY), Err(KeyError::BadName));
    assert_eq!(k.add_tenant("t", "abc"), Err(KeyError::BadHex));
    assert_eq!(k.add_tenant("t", "zz"), Err(KeyError::BadHex));
    assert_eq!(k.add_tenant("t", "00112233"), Err(KeyError::KeyLength { len: 4 }));
    k.add_tenant("t", DEMO_KEY).unwrap();
    assert_eq!(k.add_tenant("t", DEMO_KEY), Err(KeyError::Duplicate));
    assert_eq!(parse_hex("0aFF"), Ok(vec![0x0a, 0xff]));
}

/// The deterministic twin of the decoder fuzz target, through the whole session core: 100,000 random and
/// mutated inputs; no panic, and every answer is a well-formed frame (errors carry a known code).
#[test]
fn random_and_mutated_frames_never_panic() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for r in [
        Request::Heartbeat { echo: 1 },
        Request::Stats,
        Request::Health,
        Request::HcaStats,
        Request::Revoke { lease: LeaseId { boot_id: [0; 16], slot: 1, generation: 2 }, qp_first: true },
        Request::List { cursor: 0, max: 5 },
        Request::Hello(Hello::Proof { mac: [1; 32] }),
        Request::Resume { session_id: 1, token: [3; 16] },
        Request::Drain { tenant: "demo".to_string(), notice_ms: 5 },
        Request::LeaseLog { cursor: 0, max: 5 },
    ] {
        seeds.push(req(r, 1));
    }
    let mut s = server(Limits { sessions: 4, credits: 64, heartbeat_ms: 600_000 });
    let mut conn = 0u64;
    let mut frames_checked = 0u64;
    for i in 0..100_000u64 {
        if i % 500 == 0 {
            if conn > 0 {
                s.closed(ConnId(conn), i);
            }
            conn += 1;
            assert!(s.open(ConnId(conn), i));
            if conn.is_multiple_of(2) {
                login(&mut s, ConnId(conn), "demo", DEMO_KEY).unwrap();
            }
        }
        let mut input = if next() % 4 == 0 {
            (0..(next() % 64)).map(|_| next() as u8).collect::<Vec<u8>>()
        } else {
            let mut m = seeds[(next() % seeds.len() as u64) as usize].clone();
            for _ in 0..(1 + next() % 4) {
                let pos = (next() % m.len() as u64) as usize;
                match next() % 3 {
                    0 => m[pos] = next() as u8,
                    1 => m.truncate(pos.max(1)),
                    _ => m.insert(pos, next() as u8),
                }
            }
            m
        };
        if next() % 8 == 0 {
            // Keep some inputs framed correctly with a random op so dispatch paths are reached.
            input = Vec::new();
            leasebox_proto::frame(Kind::Request, (next() % 0x400) as u16, 1, &[], &mut input);
        }
        s.input(ConnId(conn), &seal(ConnId(conn), &input), i);
        let mut fb = FrameBuf::new();
        fb.push(&take_plain(&mut s, ConnId(conn)));
        loop {
            match fb.next_frame() {
                Next::Frame(h, p) => {
                    frames_checked += 1;
                    match h.kind {
                        Kind::Error => {
                            ErrorBody::decode(&p).expect("well-formed error body");
                        }
                        Kind::Response => {
                            Response::decode(Op::from_raw(h.op).expect("known op"), &p).expect("well-formed response");
                        }
                        Kind::Request => panic!("server sent a request"),
                        Kind::Notice => panic!("no lease service, no notice"),
                    }
                }
                Next::Pending => break,
                Next::Bad(e) => panic!("server emitted a bad frame: {e:?}"),
            }
        }
        assert_eq!(fb.buffered(), 0, "server output ends on a frame boundary");
        if s.wants_close(ConnId(conn)) {
            s.closed(ConnId(conn), i);
            conn += 1;
            assert!(s.open(ConnId(conn), i));
        }
    }
    assert!(frames_checked > 10_000, "the run exercised the server ({frames_checked} answers)");
}

/// A lease service in miniature: REVOKE waits (as it would on the HCA) until the test finishes it; every other
/// lease operation is answered at once. Records what the session core tells it.
#[derive(Default)]
struct Deferring {
    waiting: Vec<Ticket>,
    done: Vec<(Ticket, Reply)>,
    started: Vec<(String, u64)>,
    alive: Vec<(u64, u64)>,
    ticks: Vec<u64>,
    lost: Vec<(u64, CloseReason)>,
    boot: Option<[u8; 16]>,
    notices: Vec<(String, Notice)>,
    /// RESUMEs as (from, to) session ids.
    resumed: Vec<(u64, u64)>,
}

impl Deferring {
    /// Finishes the waiting REVOKE with `request_id`.
    fn finish(&mut self, request_id: u32) {
        let i = self.waiting.iter().position(|t| t.request_id == request_id).expect("such a REVOKE waits");
        let t = self.waiting.remove(i);
        self.done.push((t, Ok(Response::Revoke { outcome: Outcome::TornDown, elapsed_us: request_id })));
    }
}

impl Leases for Deferring {
    fn lease_op(&mut self, who: &Principal, req: &Request, ticket: Ticket, _now_ms: u64) -> Answer {
        assert_eq!((ticket.session_id, ticket.op), (who.session_id, req.op()));
        match req {
            Request::Revoke { .. } => {
                self.waiting.push(ticket);
                Answer::Later
            }
            Request::Drain { tenant, notice_ms } => {
                self.notices.push((tenant.clone(), Notice::Draining { in_ms: *notice_ms }));
                Answer::Now(Ok(Response::Drain { leases: 4, deadline_ms: 0 }))
            }
            _ => Answer::Now(Err(ErrorBody::new(ErrorCode::NotFound, "no such lease"))),
        }
    }
    fn take_answers(&mut self, out: &mut Vec<(Ticket, Reply)>) {
        out.append(&mut self.done);
    }
    fn session_started(&mut self, who: &Principal, _now_ms: u64) {
        self.started.push((who.name.clone(), who.session_id));
    }
    fn session_alive(&mut self, who: &Principal, now_ms: u64) {
        self.alive.push((who.session_id, now_ms));
    }
    fn tick(&mut self, now_ms: u64) {
        self.ticks.push(now_ms);
    }
    fn lease_stats(&mut self) -> LeaseStats {
        let mut revoke_us = Histogram::default();
        revoke_us.record(700);
        LeaseStats { by_state: [0, 2, 0, 0, 1], allocs: 3, revoke_us, ..LeaseStats::default() }
    }
    fn fenced(&mut self, _who: &Principal, _cursor: u32, _max: u16) -> (u32, Vec<leasebox_proto::FencedSlot>) {
        (0, Vec::new())
    }
    fn health_facts(&mut self) -> LeaseHealth {
        LeaseHealth::On { by_state: [0, 2, 0, 0, 1], fenced: 1, detail: String::new() }
    }
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, _now_ms: u64) {
        self.lost.push((who.session_id, reason));
    }
    fn boot(&mut self, boot_id: [u8; 16]) {
        self.boot = Some(boot_id);
    }
    fn take_notices(&mut self, out: &mut Vec<(String, Notice)>) {
        out.append(&mut self.notices);
    }
    fn resume(&mut self, from: &Principal, to: &Principal, _now_ms: u64) -> u32 {
        self.resumed.push((from.session_id, to.session_id));
        2
    }
}

fn deferring(limits: Limits) -> Server<Deferring, Counter> {
    Server::new(limits, keys(), Deferring::default(), Counter(1), 0).unwrap()
}

fn revoke(slot: u32, id: u32) -> Vec<u8> {
    req(Request::Revoke { lease: LeaseId { boot_id: [0; 16], slot, generation: 1 }, qp_first: false }, id)
}

fn codes(a: &[(u32, Ans)]) -> Vec<(u32, Option<ErrorCode>)> {
    a.iter()
        .map(|(id, x)| match x {
            Ans::Err(e) => (*id, Some(e.code)),
            Ans::Ok(_) | Ans::Notice(_) => (*id, None),
        })
        .collect()
}

#[test]
fn a_deferred_answer_holds_its_credit_until_taken() {
    let mut s = deferring(Limits { credits: 2, ..Limits::default() });
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    // Two REVOKEs wait on the "HCA": no answer yet, both credits held.
    let mut two = revoke(1, 10);
    two.extend(revoke(2, 11));
    assert!(exchange(&mut s, ConnId(1), &two, 1).is_empty());
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 12), 2);
    assert_eq!(codes(&a), [(12, Some(ErrorCode::CreditExceeded))]);
    // The second finishes first: answers follow completion, not request order.
    s.backend_mut().finish(11);
    s.deliver(3);
    assert!(s.has_output(ConnId(1)));
    // Queued but not yet taken by the transport: the credit is still held.
    s.input(ConnId(1), &seal(ConnId(1), &req(Request::Heartbeat { echo: 2 }, 13)), 3);
    let a = take(&mut s, ConnId(1));
    assert_eq!(codes(&a), [(11, None), (13, Some(ErrorCode::CreditExceeded))]);
    assert!(matches!(a[0].1, Ans::Ok(Response::Revoke { outcome: Outcome::TornDown, elapsed_us: 11 })));
    // Taken: one credit is back (the other is still held by REVOKE 10), so one of two heartbeats fits.
    let mut hb = req(Request::Heartbeat { echo: 3 }, 14);
    hb.extend(req(Request::Heartbeat { echo: 4 }, 15));
    let a = exchange(&mut s, ConnId(1), &hb, 4);
    assert_eq!(codes(&a), [(14, None), (15, Some(ErrorCode::CreditExceeded))]);
    // `tick` delivers too.
    s.backend_mut().finish(10);
    s.tick(5);
    assert_eq!(codes(&take(&mut s, ConnId(1))), [(10, None)]);
    let mut hb = req(Request::Heartbeat { echo: 5 }, 16);
    hb.extend(req(Request::Query { lease: LeaseId { boot_id: [0; 16], slot: 1, generation: 1 } }, 17));
    assert_eq!(codes(&exchange(&mut s, ConnId(1), &hb, 6)), [(16, None), (17, Some(ErrorCode::NotFound))]);
    assert_eq!(s.answers_dropped(), 0);
}

#[test]
fn answers_for_ended_sessions_are_dropped() {
    let mut s = deferring(Limits::default());
    for c in 1..=3 {
        s.open(ConnId(c), 0);
        login(&mut s, ConnId(c), "demo", DEMO_KEY).unwrap();
        assert!(exchange(&mut s, ConnId(c), &revoke(c as u32, 20), 1).is_empty());
    }
    // Connection 1 goes away; connection 2 says BYE while its REVOKE waits: BYE is answered and closes.
    s.closed(ConnId(1), 2);
    let a = exchange(&mut s, ConnId(2), &req(Request::Bye, 21), 2);
    assert!(matches!(a[..], [(21, Ans::Ok(Response::Bye))]));
    assert!(s.wants_close(ConnId(2)));
    assert_eq!(s.backend().lost, [(1, CloseReason::PeerClosed), (2, CloseReason::Bye)]);
    let tickets = s.backend().waiting.clone();
    for t in &tickets {
        s.backend_mut().finish(t.request_id);
    }
    // An answer naming the right connection but another session (or answering nothing deferred) is dropped too.
    let stale = Ticket { session_id: 99, ..tickets[2] };
    s.backend_mut().done.push((stale, Ok(Response::Revoke { outcome: Outcome::Fenced, elapsed_us: 0 })));
    s.deliver(3);
    assert!(!s.has_output(ConnId(2)), "nothing after BYE");
    assert_eq!(codes(&take(&mut s, ConnId(3))), [(20, None)]);
    assert_eq!(s.answers_dropped(), 3);
    // A second answer to the same request finds nothing deferred.
    s.backend_mut().done.push((tickets[2], Ok(Response::Revoke { outcome: Outcome::Fenced, elapsed_us: 0 })));
    s.deliver(4);
    assert!(!s.has_output(ConnId(3)));
    assert_eq!(s.answers_dropped(), 4);
}

#[test]
fn the_backend_hears_of_sessions_heartbeats_and_time() {
    let mut s = deferring(Limits { credits: 1, ..Limits::default() });
    s.open(ConnId(1), 0);
    s.open(ConnId(2), 0);
    assert!(s.backend().started.is_empty());
    // A heartbeat before authentication is refused and tells the backend nothing.
    exchange(&mut s, ConnId(2), &req(Request::Heartbeat { echo: 1 }, 1), 0);
    assert!(s.wants_close(ConnId(2)));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    s.open(ConnId(3), 0);
    let HelloReply::Welcome { session_id, .. } = login(&mut s, ConnId(3), "demo", DEMO_KEY).unwrap() else {
        unreachable!()
    };
    assert_eq!(s.backend().started, [("demo".to_string(), 1), ("demo".to_string(), session_id)]);
    // The HEARTBEATs that confirmed the two sessions are their first signs of life.
    assert_eq!(s.backend().alive, [(1, 0), (session_id, 0)]);
    exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 5), 40);
    exchange(&mut s, ConnId(1), &req(Request::Stats, 6), 41);
    assert_eq!(s.backend().alive[2..], [(1, 40)], "heartbeats only");
    // With every credit held by a deferred REVOKE, a heartbeat is refused but still counts as a sign of life.
    exchange(&mut s, ConnId(1), &revoke(1, 7), 50);
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 2 }, 8), 60);
    assert_eq!(codes(&a), [(8, Some(ErrorCode::CreditExceeded))]);
    assert_eq!(s.backend().alive[2..], [(1, 40), (1, 60)]);
    s.tick(70);
    s.tick(80);
    assert_eq!(s.backend().ticks, [70, 80]);
}

const DEFERRING_HCA: leasebox_proto::HcaStats = leasebox_proto::HcaStats {
    hca: leasebox_proto::HcaState::Ok,
    submitted: 12,
    ok: 10,
    failed: 1,
    timeout: 1,
    late: 0,
    aborted: 0,
};

#[test]
fn hca_stats_come_from_the_appliance_or_are_not_implemented() {
    let mut s = Server::new(Limits::default(), keys(), NoLeases::default(), WithHca(Counter(1)), 0).unwrap();
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::HcaStats, 2), 5);
    assert!(matches!(&a[0], (2, Ans::Ok(Response::HcaStats(h))) if *h == DEFERRING_HCA));
    // Without a command queue: NOT_IMPLEMENTED, and the session goes on.
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::HcaStats, 3), 5);
    assert!(matches!(&a[0], (3, Ans::Err(e)) if e.code == ErrorCode::NotImplemented));
    assert!(!s.wants_close(ConnId(1)));
}

#[test]
fn lease_log_is_the_admins_and_not_implemented_without_a_ring() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::LeaseLog { cursor: 0, max: 5 }, 2), 5);
    assert!(matches!(&a[0], (2, Ans::Err(e)) if e.code == ErrorCode::Forbidden), "a tenant is refused");
    s.open(ConnId(2), 0);
    login(&mut s, ConnId(2), "admin", ADMIN_KEY).unwrap();
    let a = exchange(&mut s, ConnId(2), &req(Request::LeaseLog { cursor: 0, max: 5 }, 3), 5);
    assert!(matches!(&a[0], (3, Ans::Err(e)) if e.code == ErrorCode::NotImplemented), "no ring: not implemented");
    assert!(!s.wants_close(ConnId(1)) && !s.wants_close(ConnId(2)));
}

#[test]
fn health_is_made_of_the_appliance_and_the_lease_service_by_one_rule() {
    let health = |s: &mut Server<Deferring, WithHca>| {
        s.open(ConnId(1), 0);
        login(s, ConnId(1), "demo", DEMO_KEY).unwrap();
        let a = exchange(s, ConnId(1), &req(Request::Health, 2), 7);
        let (2, Ans::Ok(Response::Health(h))) = &a[0] else { panic!("no HEALTH: {:?}", a.len()) };
        h.clone()
    };
    let mut s = Server::new(Limits::default(), keys(), Deferring::default(), WithHca(Counter(1)), 0).unwrap();
    let h = health(&mut s);
    assert_eq!(h, crate::health(leasebox_proto::HcaState::Ok, "ConnectX-5", &s.backend_mut().health_facts(), 7));
    assert_eq!((h.status, h.fenced_slots), (leasebox_proto::HealthStatus::Degraded, 1), "one slot fenced");
    assert!(h.message.starts_with("leases granted 0 active 2 ") && h.message.ends_with("; ConnectX-5"), "{h:?}");
    // The lease service off: its reason, whatever the HCA says.
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::Health, 3), 5);
    let (3, Ans::Ok(Response::Health(h))) = &a[0] else { panic!("no HEALTH") };
    assert_eq!(h.status, leasebox_proto::HealthStatus::Degraded);
    assert_eq!(h.message, "lease service off: no HCA; no HCA");
}

#[test]
fn stats_carry_the_lease_figures() {
    let mut s = deferring(Limits::default());
    s.open(ConnId(1), 0);
    // The global figures are the admin's (a tenant's STATS are scoped: `tenant_stats_are_scoped`).
    login(&mut s, ConnId(1), "admin", ADMIN_KEY).unwrap();
    let a = exchange(&mut s, ConnId(1), &req(Request::Stats, 2), 5);
    let Ans::Ok(Response::Stats(st)) = &a[0].1 else { panic!("no STATS") };
    assert_eq!((st.leases.by_state, st.leases.allocs), ([0, 2, 0, 0, 1], 3));
    assert_eq!(st.leases.revoke_us.percentile(50.0), Some(1024));
    assert_eq!(s.stats(6).leases, s.backend_mut().lease_stats());
}

/// A frame of `kind` (raw) with `reserved` header bytes.
fn raw_frame(kind: u8, reserved: u16, op: u16, request_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    leasebox_proto::frame(Kind::Request, op, request_id, payload, &mut f);
    f[3] = kind;
    f[6..8].copy_from_slice(&reserved.to_be_bytes());
    f
}

#[test]
fn after_authentication_a_framed_bad_header_does_not_close() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    for f in [raw_frame(7, 0, Op::Heartbeat as u16, 4, &[0; 8]), raw_frame(0, 1, Op::Heartbeat as u16, 5, &[0; 8])] {
        let a = exchange(&mut s, ConnId(1), &f, 0);
        assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Malformed));
        assert!(!s.wants_close(ConnId(1)), "the session survives its mistakes");
    }
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 6), 0);
    assert!(matches!(a[0], (6, Ans::Ok(Response::Heartbeat { echo: 1, .. }))));
}

fn take_one(bytes: &[u8]) -> Option<(Ans, u32)> {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    let Next::Frame(h, p) = fb.next_frame() else { return None };
    Some((if h.kind == Kind::Error { Ans::Err(ErrorBody::decode(&p).ok()?) } else { return None }, h.request_id))
}

// ---- admission: budgets nobody can hog ----

fn budgeted(sessions: usize, per_tenant: usize, admin_reserved: usize, preauth: usize) -> Server<NoLeases, Counter> {
    let mut k = keys();
    k.add_tenant("other", DEMO_KEY).unwrap();
    let mut s = Server::new(Limits { sessions, ..Limits::default() }, k, NoLeases::default(), Counter(1), 0).unwrap();
    s.set_budget(Budget {
        sessions,
        per_tenant,
        admin_reserved,
        preauth,
        heap_high_water_pct: 75,
        ..Budget::for_sessions(sessions)
    });
    s
}

fn busy(r: Result<HelloReply, ErrorBody>) -> ErrorBody {
    match r {
        Err(e) if e.code == ErrorCode::Busy => e,
        other => panic!("expected BUSY, got {other:?}"),
    }
}

#[test]
fn a_tenant_is_capped_below_the_budget_and_the_admin_still_gets_in() {
    let mut s = budgeted(6, 3, 1, 6);
    for c in 1..=3 {
        assert!(s.open(ConnId(c), 0));
        login(&mut s, ConnId(c), "demo", DEMO_KEY).unwrap();
    }
    // The fourth session of the same tenant: the key is right, there is no place for it.
    assert!(s.open(ConnId(10), 0));
    let e = busy(login(&mut s, ConnId(10), "demo", DEMO_KEY));
    assert_eq!(e.detail, [3, 4, 0], "the cap, and which budget refused");
    assert!(s.wants_close(ConnId(10)));
    s.closed(ConnId(10), 1);
    // Another tenant fills what tenants may hold (5 of 6): the last place is the admin's.
    for c in 4..=5 {
        assert!(s.open(ConnId(c), 1));
        login(&mut s, ConnId(c), "other", DEMO_KEY).unwrap_or_else(|e| panic!("session {c}: {e:?}"));
    }
    assert!(s.open(ConnId(7), 1));
    let e = busy(login(&mut s, ConnId(7), "other", DEMO_KEY));
    assert_eq!(e.detail[1], 3, "refused by the admin's reserve: {e:?}");
    s.closed(ConnId(7), 1);
    assert!(s.open(ConnId(8), 1));
    assert!(matches!(login(&mut s, ConnId(8), "admin", ADMIN_KEY), Ok(HelloReply::Welcome { role: Role::Admin, .. })));
    assert_eq!(s.admission().sessions(), 6);
    // A tenant session that ends gives its place back.
    s.closed(ConnId(1), 2);
    assert!(s.open(ConnId(9), 2));
    login(&mut s, ConnId(9), "demo", DEMO_KEY).unwrap();
}

#[test]
fn unauthenticated_connections_cannot_crowd_out_sessions() {
    let mut s = budgeted(4, 3, 1, 2);
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    assert!(s.open(ConnId(2), 0));
    login(&mut s, ConnId(2), "admin", ADMIN_KEY).unwrap();
    // Two connections that never authenticate fill the pre-authentication pool ...
    assert!(s.open(ConnId(3), 10));
    assert!(s.open(ConnId(4), 10));
    let (hello, _) = hello_v2("demo", DEMO_KEY, 3);
    exchange(&mut s, ConnId(3), &hello[..hello.len() - 1], 10);
    // ... so the next is refused BUSY, while the sessions are served as before.
    assert!(!s.open(ConnId(5), 20));
    let a = take(&mut s, ConnId(5));
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Busy && e.detail == [2, 1, 0]));
    s.closed(ConnId(5), 20);
    for c in [1, 2] {
        let a = exchange(&mut s, ConnId(c), &req(Request::Heartbeat { echo: 9 }, 3), 30);
        assert!(matches!(&a[0].1, Ans::Ok(Response::Heartbeat { echo: 9, .. })), "session {c}");
        assert!(!s.wants_close(ConnId(c)));
    }
    // At the HELLO deadline the pool's places are given back, before the transport has closed them.
    s.tick(10 + server::HELLO_DEADLINE_MS + 1);
    assert!(s.wants_close(ConnId(3)) && s.wants_close(ConnId(4)));
    assert_eq!(s.admission().preauth(), 0);
    assert!(s.open(ConnId(6), 5_100));
    login(&mut s, ConnId(6), "demo", DEMO_KEY).unwrap();
}

#[test]
fn tenant_stats_are_scoped() {
    let mut s = budgeted(8, 3, 1, 4);
    for (c, name, key) in
        [(1, "demo", DEMO_KEY), (2, "demo", DEMO_KEY), (3, "other", DEMO_KEY), (4, "admin", ADMIN_KEY)]
    {
        assert!(s.open(ConnId(c), 0));
        login(&mut s, ConnId(c), name, key).unwrap();
    }
    assert!(s.open(ConnId(5), 0));
    exchange(&mut s, ConnId(5), &req(Request::Stats, 1), 0); // NOT_AUTHENTICATED: an error the admin sees
    let stats = |s: &mut Server<NoLeases, Counter>, c: u64| {
        let a = exchange(s, ConnId(c), &req(Request::Stats, 7), 100);
        let Ans::Ok(Response::Stats(st)) = &a[0].1 else { panic!("no STATS") };
        st.clone()
    };
    let t = stats(&mut s, 3);
    assert_eq!((t.sessions_current, t.session_budget, t.sessions_total, t.sessions_refused), (1, 3, 1, 0));
    assert_eq!((t.frames_in, t.frames_out, t.errors.len(), t.roles.len()), (0, 0, 0, 0));
    assert_eq!(t.leases, LeaseStats::default());
    let t = stats(&mut s, 1);
    assert_eq!((t.sessions_current, t.sessions_total), (2, 2));
    let a = stats(&mut s, 4);
    assert_eq!((a.sessions_current, a.session_budget, a.sessions_total), (5, 8, 5));
    assert!(a.frames_in > 0 && a.errors.iter().any(|(c, _)| *c == ErrorCode::NotAuthenticated as u16));
}

#[test]
fn above_the_memory_high_water_mark_new_work_is_refused_busy() {
    use alloc::sync::Arc;
    use core::sync::atomic::{AtomicUsize, Ordering};
    let used = Arc::new(AtomicUsize::new(1 << 20));
    let mut s = budgeted(4, 3, 1, 4);
    let gauge = used.clone();
    s.set_memory_gauge(Box::new(move || HeapUse { used: gauge.load(Ordering::Relaxed), size: 4 << 20 }));
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    assert!(s.open(ConnId(2), 0));
    // 3.5 of 4 MiB: above 75 %.
    used.store(7 << 19, Ordering::Relaxed);
    let e = busy(login(&mut s, ConnId(2), "demo", DEMO_KEY));
    assert_eq!(e.detail, [3584, 5, 4096]);
    assert!(!s.open(ConnId(3), 0));
    let a = take(&mut s, ConnId(3));
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Busy && e.message.contains("memory")));
    let alloc = Request::Alloc(leasebox_proto::AllocReq {
        size: 4096,
        access: 0,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x11,
        client_psn: 0,
        client_gid: [0; 16],
        client_mac: [2, 0, 0, 0, 0, 1],
    });
    let a = exchange(&mut s, ConnId(1), &req(alloc.clone(), 5), 1);
    assert_eq!(codes(&a), [(5, Some(ErrorCode::Busy))]);
    // What does not take memory goes on: the established session is served.
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 6), 1);
    assert!(matches!(&a[0].1, Ans::Ok(Response::Heartbeat { .. })));
    assert_eq!(s.admission().memory_refusals, 3);
    // Below the mark again, ALLOC reaches the backend (here: the lease service is off).
    used.store(1 << 20, Ordering::Relaxed);
    let a = exchange(&mut s, ConnId(1), &req(alloc, 7), 2);
    assert_eq!(codes(&a), [(7, Some(ErrorCode::NotImplemented))]);
}

#[test]
fn budgets_from_the_options_and_their_defaults() {
    let d = Budget::from_options(16, None, None, None, None);
    assert_eq!(
        (d.sessions, d.per_tenant, d.admin_reserved, d.preauth, d.heap_high_water_pct, d.preauth_per_source),
        (16, 15, 1, 8, 85, 2)
    );
    assert_eq!(Budget::from_options(2, None, None, None, None).preauth, 2, "the pool is no larger than the budget");
    assert_eq!(Budget::from_options(1, None, None, None, None).admin_reserved, 0, "a single place is anyone's");
    let b = Budget::from_options(8, Some(3), Some(2), Some(4), Some(60));
    assert_eq!((b.per_tenant, b.admin_reserved, b.preauth, b.heap_high_water_pct, b.tenant_places()), (3, 2, 4, 60, 6));
    assert_eq!(Budget::from_options(8, None, Some(3), None, None).per_tenant, 5);
}
mod cost;
mod guards;
mod liveness;
mod lockout;
mod scale;
mod v2_tests;
mod wire_v2;

#[test]
fn the_boot_id_is_drawn_once_announced_to_every_session_and_in_stats() {
    let mut s = deferring(Limits::default());
    let boot = s.boot_id();
    assert_eq!(s.backend().boot, Some(boot), "the backend learns the boot id at start");
    assert_ne!(boot, [0; 16]);
    for c in 1..=2 {
        s.open(ConnId(c), 0);
        login(&mut s, ConnId(c), "demo", DEMO_KEY).unwrap();
        assert_eq!(announced(ConnId(c)).boot_id, boot);
    }
    assert_ne!(announced(ConnId(1)).resume_token, announced(ConnId(2)).resume_token, "one token per session");
    let a = exchange(&mut s, ConnId(1), &req(Request::Stats, 3), 1);
    let Ans::Ok(Response::Stats(st)) = &a[0].1 else { panic!("no STATS") };
    assert_eq!(st.boot_id, boot);
    // Another start draws another id.
    let other = Server::new(Limits::default(), keys(), Deferring::default(), Counter(2), 0).unwrap();
    assert_ne!(other.boot_id(), boot);
}

#[test]
fn notices_reach_every_session_of_the_tenant_only_and_hold_no_credit() {
    let mut k = keys();
    k.add_tenant("other", DEMO_KEY).unwrap();
    let mut s =
        Server::new(Limits { credits: 1, ..Limits::default() }, k, Deferring::default(), Counter(1), 0).unwrap();
    for (c, name, key) in
        [(1, "demo", DEMO_KEY), (2, "demo", DEMO_KEY), (3, "other", DEMO_KEY), (4, "admin", ADMIN_KEY)]
    {
        s.open(ConnId(c), 0);
        login(&mut s, ConnId(c), name, key).unwrap();
    }
    let lease = LeaseId { boot_id: s.boot_id(), slot: 4, generation: 2 };
    let n = Notice::Revoked { lease, outcome: Outcome::TornDown };
    s.backend_mut().notices.push(("demo".to_string(), n));
    s.tick(5);
    for c in [1, 2] {
        let a = take(&mut s, ConnId(c));
        assert!(matches!(&a[..], [(0, Ans::Notice(got))] if *got == n), "session {c}");
    }
    assert!(take(&mut s, ConnId(3)).is_empty(), "another tenant hears nothing");
    assert!(take(&mut s, ConnId(4)).is_empty(), "nor does the admin");
    // With its one credit held by a deferred REVOKE, the session still gets notices, and the notice left its
    // credit alone: a heartbeat is still refused, not answered.
    exchange(&mut s, ConnId(1), &revoke(1, 7), 6);
    s.backend_mut().notices.push((String::new(), Notice::Draining { in_ms: 9 }));
    s.tick(7);
    let a = take(&mut s, ConnId(1));
    assert!(matches!(&a[..], [(0, Ans::Notice(Notice::Draining { in_ms: 9 }))]));
    assert!(matches!(&take(&mut s, ConnId(3))[..], [(0, Ans::Notice(Notice::Draining { .. }))]), "every tenant");
    let a = exchange(&mut s, ConnId(1), &req(Request::Heartbeat { echo: 1 }, 8), 8);
    assert_eq!(codes(&a), [(8, Some(ErrorCode::CreditExceeded))]);
    assert_eq!(s.notices_sent(), 5, "2 + 3 sessions");
}

#[test]
fn drain_is_the_admins_and_its_deadline_is_on_the_uptime_clock() {
    let mut s = deferring(Limits::default());
    s.open(ConnId(1), 0);
    s.open(ConnId(2), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    login(&mut s, ConnId(2), "admin", ADMIN_KEY).unwrap();
    let drain = Request::Drain { tenant: "demo".to_string(), notice_ms: 1500 };
    let a = exchange(&mut s, ConnId(1), &req(drain.clone(), 3), 10);
    assert!(matches!(&a[0], (3, Ans::Err(e)) if e.code == ErrorCode::Forbidden));
    assert!(s.backend().notices.is_empty(), "a tenant's DRAIN never reaches the lease service");
    let a = exchange(&mut s, ConnId(2), &req(drain, 4), 100);
    assert!(matches!(a[0], (4, Ans::Ok(Response::Drain { leases: 4, deadline_ms: 1600 }))));
    // The Draining notice went out with the answer, to the tenant.
    assert!(matches!(&take(&mut s, ConnId(1))[..], [(0, Ans::Notice(Notice::Draining { in_ms: 1500 }))]));
}

#[test]
fn resume_takes_over_an_open_or_ended_session_of_the_same_principal_only() {
    let mut k = keys();
    k.add_tenant("other", DEMO_KEY).unwrap();
    let mut s = Server::new(Limits::default(), k, Deferring::default(), Counter(1), 0).unwrap();
    for (c, name, key) in [(1, "demo", DEMO_KEY), (2, "demo", DEMO_KEY), (3, "other", DEMO_KEY)] {
        s.open(ConnId(c), 0);
        login(&mut s, ConnId(c), name, key).unwrap();
    }
    let (a1, a3) = (announced(ConnId(1)), announced(ConnId(3)));
    let resume = |session_id, token| req(Request::Resume { session_id, token }, 9);
    let refused = |a: &[(u32, Ans)]| match a {
        [(9, Ans::Err(e))] => {
            assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "RESUME: no such session"));
            true
        }
        _ => false,
    };
    // Wrong token, another principal's session (with its right token), an unknown session, itself: all the same.
    let mut wrong = a1.resume_token;
    wrong[15] ^= 1;
    assert!(refused(&exchange(&mut s, ConnId(2), &resume(a1.session_id, wrong), 1)));
    assert!(refused(&exchange(&mut s, ConnId(2), &resume(a3.session_id, a3.resume_token), 1)));
    assert!(refused(&exchange(&mut s, ConnId(2), &resume(77, a1.resume_token), 1)));
    let a2 = announced(ConnId(2));
    assert!(refused(&exchange(&mut s, ConnId(2), &resume(a2.session_id, a2.resume_token), 1)));
    assert!(s.backend().resumed.is_empty() && !s.wants_close(ConnId(1)));
    // The right one: session 2 takes session 1's leases, and session 1 is closed without orphaning them.
    let a = exchange(&mut s, ConnId(2), &resume(a1.session_id, a1.resume_token), 2);
    assert!(matches!(a[0], (9, Ans::Ok(Response::Resume { leases: 2 }))));
    assert_eq!(s.backend().resumed, [(a1.session_id, a2.session_id)]);
    assert!(s.wants_close(ConnId(1)));
    assert_eq!(s.backend().lost, [(a1.session_id, CloseReason::Resumed)]);
    // A token is good once.
    assert!(refused(&exchange(&mut s, ConnId(2), &resume(a1.session_id, a1.resume_token), 3)));
    // An ended session (its connection lost) can be resumed by a new one.
    s.closed(ConnId(2), 4);
    s.open(ConnId(4), 5);
    login(&mut s, ConnId(4), "demo", DEMO_KEY).unwrap();
    let a4 = announced(ConnId(4));
    let a = exchange(&mut s, ConnId(4), &resume(a2.session_id, a2.resume_token), 6);
    assert!(matches!(a[0], (9, Ans::Ok(Response::Resume { leases: 2 }))));
    assert_eq!(s.backend().resumed[1], (a2.session_id, a4.session_id));
}

#[test]
fn a_client_cannot_send_notices() {
    let mut s = server(Limits::default());
    s.open(ConnId(1), 0);
    login(&mut s, ConnId(1), "demo", DEMO_KEY).unwrap();
    // A notice frame from the client: the kind is the server's only.
    let a = exchange(&mut s, ConnId(1), &raw_frame(3, 0, Op::Notice as u16, 0, &[0; 32]), 1);
    assert!(matches!(&a[0].1, Ans::Err(e) if e.code == ErrorCode::Malformed), "notice frame");
    // A request with the NOTICE op: no such request.
    let a = exchange(&mut s, ConnId(1), &raw_frame(0, 0, Op::Notice as u16, 4, &[0; 32]), 1);
    assert!(
        matches!(&a[0], (4, Ans::Err(e)) if e.code == ErrorCode::BadParam && e.message.contains("'op'")),
        "request"
    );
    assert!(!s.wants_close(ConnId(1)));
}

// ---- fair shares ----

/// With no `sessions_per_tenant=`, two tenants among 15 tenant places: each is guaranteed 7, the place left
/// over goes to whoever asks first, and no tenant takes another's guarantee; an explicit cap replaces the rule.
#[test]
fn tenants_get_fair_shares_of_session_places_by_default() {
    let fair = |per_tenant: Option<usize>| {
        let mut s = budgeted(16, 15, 1, 8);
        s.set_budget(Budget::from_options(16, per_tenant, None, None, None));
        s
    };
    let mut s = fair(None);
    let mut c = 0;
    let mut open = |s: &mut Server<NoLeases, Counter>, name: &str| {
        c += 1;
        assert!(s.open(ConnId(c), 0));
        login(s, ConnId(c), name, if name == "admin" { ADMIN_KEY } else { DEMO_KEY })
    };
    for i in 0..8 {
        open(&mut s, "demo").unwrap_or_else(|e| panic!("demo's session {i}: {e:?}"));
    }
    let e = busy(open(&mut s, "demo"));
    assert_eq!(e.detail, [7, 10, 0], "refused by the fair share: {}", e.message);
    assert!(e.message.contains("fair share"), "{}", e.message);
    for i in 0..7 {
        open(&mut s, "other").unwrap_or_else(|e| panic!("other's session {i}: {e:?}"));
    }
    assert_eq!(busy(open(&mut s, "other")).detail[1], 3, "the admin's place is left");
    assert!(matches!(open(&mut s, "admin"), Ok(HelloReply::Welcome { role: Role::Admin, .. })));
    // The operator's cap is the policy: one tenant may then take every tenant place.
    let mut s = fair(Some(15));
    for i in 0..15 {
        open(&mut s, "demo").unwrap_or_else(|e| panic!("demo's session {i} under a cap of 15: {e:?}"));
    }
}

// ---- keys that resist guessing; resume memory per principal ----

#[test]
fn plainly_non_random_keys_are_refused_with_the_reason() {
    let weak = |hex: &str| match Keyring::new().add_tenant("t", hex) {
        Err(KeyError::WeakKey(why)) => why,
        other => panic!("{hex}: {other:?}"),
    };
    assert_eq!(weak(&"00".repeat(16)), "is one byte repeated");
    assert_eq!(weak(&"ab".repeat(32)), "is one byte repeated");
    assert_eq!(weak(&"deadbeef".repeat(4)), "is a short pattern repeated");
    assert_eq!(weak(&"0102".repeat(16)), "is a short pattern repeated");
    assert_eq!(weak("00000000000000000000000000010203"), "has fewer than 5 distinct byte values");
    let msg = KeyError::WeakKey("is one byte repeated").to_string();
    assert!(msg.contains("must be random") && msg.contains("/dev/urandom"), "{msg}");
    // The admin's key and every key of a list are held to the same rule; a 16-byte random key passes.
    assert!(matches!(Keyring::new().set_admin(&"11".repeat(16)), Err(KeyError::WeakKey(_))));
    assert!(matches!(
        Keyring::new().add_tenant("t", &alloc::format!("0/{DEMO_KEY},1/{}", "22".repeat(16))),
        Err(KeyError::WeakKey(_))
    ));
    Keyring::new().add_tenant("t", "e7ddcabfe5d9e62e7e024c50798449bd").unwrap();
    // Too short is still refused for its length first.
    assert!(matches!(Keyring::new().add_tenant("t", &"00".repeat(15)), Err(KeyError::KeyLength { len: 15 })));
}

#[test]
fn one_principal_cannot_flush_anothers_resume_memory() {
    let mut k = keys();
    k.add_tenant("other", "f0e1d2c3b4a5968778695a4b3c2d1e0f0f1e2d3c4b5a69788796a5b4c3d2e1f0").unwrap();
    let mut s = Server::new(Limits::default(), k, NoLeases::default(), Counter(3), 0).unwrap();
    // "other" ends one session; "demo" then ends many more than its bound.
    assert!(s.open(ConnId(1), 0));
    login(&mut s, ConnId(1), "other", "f0e1d2c3b4a5968778695a4b3c2d1e0f0f1e2d3c4b5a69788796a5b4c3d2e1f0").unwrap();
    let others = announced(ConnId(1));
    s.closed(ConnId(1), 1);
    let mut demos = Vec::new();
    for c in 2..2 + 3 * server::MAX_LOST_PER_PRINCIPAL as u64 {
        assert!(s.open(ConnId(c), 1));
        login(&mut s, ConnId(c), "demo", DEMO_KEY).unwrap();
        demos.push(announced(ConnId(c)));
        s.closed(ConnId(c), 1);
    }
    let resume = |s: &mut Server<NoLeases, Counter>, c: u64, name: &str, key: &str, a: &Announce| {
        assert!(s.open(ConnId(c), 2));
        login(s, ConnId(c), name, key).unwrap();
        let r = Request::Resume { session_id: a.session_id, token: a.resume_token };
        matches!(&exchange(s, ConnId(c), &req(r, 3), 2)[0].1, Ans::Ok(Response::Resume { .. }))
    };
    assert!(resume(&mut s, 100, "other", "f0e1d2c3b4a5968778695a4b3c2d1e0f0f1e2d3c4b5a69788796a5b4c3d2e1f0", &others));
    assert!(!resume(&mut s, 101, "demo", DEMO_KEY, &demos[0]), "demo's oldest is forgotten");
    assert!(resume(&mut s, 102, "demo", DEMO_KEY, demos.last().unwrap()), "demo's newest is kept");
}

// ---- appliance identity ----

/// A HELLO for appliance `appliance` ("" for none): its frame and the client's state.
fn hello_for(appliance: &str, e: u8) -> (Vec<u8>, Initiator) {
    let p = v2::prologue_for(2, 2, 0, "demo", appliance);
    let (init, msg1) = Initiator::start(&p, &v2::psk_from_key(&parse_hex(DEMO_KEY).unwrap()), [e; 32]);
    let h = HelloNoise { min_version: 2, max_version: 2, key_id: 0, name: "demo".to_string(), msg1 };
    (req(Request::Hello(Hello::Noise(h)), 1), init)
}

#[test]
fn a_hello_for_one_appliance_fails_on_another() {
    let mut a = server(Limits::default());
    a.set_appliance_name("lb-a");
    let mut b = server(Limits::default());
    b.set_appliance_name("lb-b");
    let mut unnamed = server(Limits::default());
    let answer = |s: &mut Server<NoLeases, Counter>, c: u64, hello: &[u8]| {
        assert!(s.open(ConnId(c), 0));
        exchange(s, ConnId(c), hello, 0).into_iter().next().unwrap().1
    };
    let ok = |a: &Ans| matches!(a, Ans::Ok(Response::Hello(HelloReply::Noise { .. })));
    let refused = |a: &Ans| matches!(a, Ans::Err(e) if e.code == ErrorCode::AuthFailed);
    // Meant for lb-a: served there, refused on lb-b (the same key), and on an appliance with no name.
    let (for_a, init) = hello_for("lb-a", 1);
    let Ans::Ok(Response::Hello(HelloReply::Noise { msg2 })) = answer(&mut a, 1, &for_a) else { panic!("lb-a") };
    assert!(init.finish(&msg2).is_ok());
    assert!(refused(&answer(&mut b, 1, &for_a)), "lb-b must not complete lb-a's HELLO");
    assert!(refused(&answer(&mut unnamed, 1, &hello_for("lb-a", 2).0)));
    // A HELLO that names no appliance: refused by a named one, served by an unnamed one (configurations
    // without a name keep working, with the prologue they always had).
    assert!(refused(&answer(&mut a, 2, &hello_for("", 3).0)));
    assert!(ok(&answer(&mut unnamed, 2, &hello_for("", 4).0)));
    assert_eq!(v2::prologue_for(2, 2, 0, "demo", ""), v2::prologue(2, 2, 0, "demo"));
}
