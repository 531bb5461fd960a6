//! The client against a tiny fake server on a std TCP thread: the real v2 HELLO (a correct or an altered answer)
//! and records after it,
//! HEARTBEAT, notices around an answer, RESUME, NOT_IMPLEMENTED lease ops, FENCED_SUMMARY in pages, a server that accepts and then closes (QEMU's forwarder before the
//! guest listens), and the CLI's exit codes.

use leasebox_proto::v2::{self, Announce, Responder, Transport};
use leasebox_proto::{
    ErrorBody, ErrorCode, FencedSlot, FrameBuf, Hello, HelloReply, Kind, LeaseId, MAX_PAGE, Next, Notice, Op, Outcome,
    Request, Response, Role,
};
use leasectl::{Client, ClientError, Credentials, Timeouts};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const KEY: [u8; 32] = [
    0x49, 0x72, 0x17, 0x38, 0xdd, 0x86, 0xab, 0x4c, 0x71, 0x1a, 0x3f, 0xe0, 0x85, 0xae, 0x53, 0x74, 0x19, 0xc2, 0xe7,
    0x88, 0xad, 0x56, 0x7b, 0x1c, 0xc1, 0xea, 0x8f, 0xb0, 0x55, 0x7e, 0x23, 0xc4,
];
/// The fake's FENCED_SUMMARY lists every third slot below this.
const FENCED_SLOTS: u32 = 900;
/// The fake's boot id and its session's resume token.
const BOOT: [u8; 16] = [0xb0; 16];
const TOKEN: [u8; 16] = [0x70; 16];
/// A HEARTBEAT with this echo is answered between two notices.
const ECHO_NOTICES: u64 = 0x4e4f;
const KEY_HEX: &str = "49721738dd86ab4c711a3fe085ae537419c2e788ad567b1cc1ea8fb0557e23c4";

#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Connections accepted and closed at once before one is served.
    close_first: usize,
    /// Close every connection, forever.
    always_close: bool,
    /// Accept and never answer.
    silent: bool,
    /// The HELLO answer (Noise message 2) is altered: it does not authenticate.
    wrong_proof: bool,
}

struct Fake {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

fn spawn(b: Behaviour) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    // The thread ends with the test process; tests never wait for it.
    thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { continue };
            let n = count.fetch_add(1, Ordering::SeqCst);
            if b.always_close || n < b.close_first {
                drop(s);
                continue;
            }
            if b.silent {
                thread::spawn(move || {
                    thread::sleep(Duration::from_secs(30));
                    drop(s);
                });
                continue;
            }
            thread::spawn(move || serve(s, b));
        }
    });
    Fake { addr, accepted }
}

fn serve(mut s: TcpStream, b: Behaviour) {
    let mut fb = FrameBuf::new();
    let mut buf = [0u8; 4096];
    let mut transport: Option<Transport> = None;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match &mut transport {
            None => fb.push(&buf[..n]),
            Some(t) => {
                t.push(&buf[..n]);
                while let Some(r) = t.open() {
                    fb.push(&r.expect("the client's records authenticate"));
                }
            }
        }
        while let Next::Frame(h, p) = fb.next_frame() {
            assert_eq!(h.kind, Kind::Request);
            let op = Op::from_raw(h.op).unwrap();
            let req = Request::decode(op, &p).unwrap();
            let mut out = Vec::new();
            let mut close = false;
            match req {
                Request::Hello(Hello::Noise(i)) => {
                    assert_eq!((i.min_version, i.max_version, i.key_id), (2, 2, 0));
                    let prologue = v2::prologue(2, 2, i.key_id, &i.name);
                    match Responder::read(&prologue, &v2::psk_from_key(&KEY), &i.msg1) {
                        Ok(r) if i.name == "demo" => {
                            let a = Announce {
                                version: 2,
                                role: Role::Tenant as u8,
                                credits: 8,
                                heartbeat_ms: 10_000,
                                session_id: 7,
                                boot_id: BOOT,
                                resume_token: TOKEN,
                            };
                            let (mut msg2, t) =
                                r.reply([0x77; 32], &a.encode()).expect("the client's ephemeral is valid");
                            if b.wrong_proof {
                                msg2[40] ^= 1;
                            }
                            Response::Hello(HelloReply::Noise { msg2 }).encode(op, h.request_id, &mut out);
                            s.write_all(&out).unwrap();
                            out.clear();
                            transport = Some(t);
                        }
                        _ => {
                            ErrorBody::new(ErrorCode::AuthFailed, "authentication failed").encode(
                                h.op,
                                h.request_id,
                                &mut out,
                            );
                            close = true;
                        }
                    }
                }
                Request::Heartbeat { echo } if echo == ECHO_NOTICES => {
                    let lease = LeaseId { boot_id: BOOT, slot: 1, generation: 2 };
                    Notice::Revoked { lease, outcome: Outcome::Fenced }.encode(&mut out);
                    Response::Heartbeat { echo, uptime_ms: 4242 }.encode(op, h.request_id, &mut out);
                    Notice::Draining { in_ms: 500 }.encode(&mut out);
                }
                Request::Heartbeat { echo } => {
                    Response::Heartbeat { echo, uptime_ms: 4242 }.encode(op, h.request_id, &mut out);
                }
                Request::Resume { session_id: 7, token: TOKEN } => {
                    Response::Resume { leases: 3 }.encode(op, h.request_id, &mut out)
                }
                Request::Resume { .. } => {
                    ErrorBody::new(ErrorCode::NotFound, "RESUME: no such session").encode(h.op, h.request_id, &mut out)
                }
                Request::Bye => {
                    Response::Bye.encode(op, h.request_id, &mut out);
                    close = true;
                }
                Request::Stats => Response::Stats(Default::default()).encode(op, h.request_id, &mut out),
                // An appliance older than `stats.want`: its decoder finds 4 bytes too many.
                Request::StatsWith { .. } => {
                    let m = "STATS: 4 unexpected bytes after the last field";
                    ErrorBody::new(ErrorCode::Malformed, m).encode(h.op, h.request_id, &mut out);
                }
                Request::FencedSummary { cursor, max } => {
                    // More fenced slots than one page holds: every third slot of 0..900.
                    let take = usize::from(max).clamp(1, MAX_PAGE);
                    let mut slots = (cursor..FENCED_SLOTS).filter(|s| s % 3 == 0);
                    let page: Vec<FencedSlot> = slots
                        .by_ref()
                        .take(take)
                        .map(|slot| FencedSlot { slot, generation: 1, failed_mask: 0x80, origin: 3, fenced_at_ms: 5 })
                        .collect();
                    let next_cursor = slots.next().unwrap_or(0);
                    Response::FencedSummary { next_cursor, slots: page }.encode(op, h.request_id, &mut out);
                }
                other => {
                    let m = format!("{} is specified but the lease service is not built yet", other.op().name());
                    ErrorBody::new(ErrorCode::NotImplemented, &m).encode(h.op, h.request_id, &mut out);
                }
            }
            if let (Some(t), false) = (&mut transport, out.is_empty()) {
                let mut wire = Vec::new();
                t.seal(&out, &mut wire).unwrap();
                out = wire;
            }
            if s.write_all(&out).is_err() || close {
                return;
            }
        }
    }
}

fn demo() -> Credentials {
    Credentials { name: "demo".into(), key: KEY.to_vec() }
}

fn quick(retry_for_ms: u64) -> Timeouts {
    Timeouts {
        connect: Duration::from_millis(500),
        receive: Duration::from_millis(700),
        retry_for: Duration::from_millis(retry_for_ms),
    }
}

#[test]
fn hello_heartbeat_and_request_ids() {
    let f = spawn(Behaviour::default());
    let (mut c, w) = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(5000)).unwrap();
    assert_eq!((w.version, w.role, w.credits, w.heartbeat_ms, w.session_id), (2, Role::Tenant, 8, 10_000, 7));
    assert_eq!(c.welcome(), Some(&w));
    assert_eq!(c.next_request_id(), 3, "HELLO used id 1, the confirming HEARTBEAT id 2");
    assert_eq!(c.call(&Request::Heartbeat { echo: 99 }).unwrap(), Response::Heartbeat { echo: 99, uptime_ms: 4242 });
    assert_eq!(c.next_request_id(), 4);
    assert_eq!((w.boot_id, w.resume_token), (BOOT, TOKEN));
    match c.call(&Request::Free { lease: LeaseId { boot_id: BOOT, slot: 1, generation: 2 } }) {
        Err(ClientError::Server(e)) => {
            assert_eq!(e.code, ErrorCode::NotImplemented);
            assert!(e.message.contains("FREE"));
        }
        other => panic!("{other:?}"),
    }
    c.bye().unwrap();
}

#[test]
fn notices_are_set_aside_while_waiting_for_an_answer_and_waited_for_in_between() {
    let f = spawn(Behaviour::default());
    let (mut c, _) = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(5000)).unwrap();
    assert!(c.take_notices().is_empty());
    // A notice before the answer does not stand in for it, nor is it lost.
    let r = c.call(&Request::Heartbeat { echo: ECHO_NOTICES }).unwrap();
    assert_eq!(r, Response::Heartbeat { echo: ECHO_NOTICES, uptime_ms: 4242 });
    let lease = LeaseId { boot_id: BOOT, slot: 1, generation: 2 };
    let first = Notice::Revoked { lease, outcome: Outcome::Fenced };
    // The one after the answer came in the same record: take_notices finds it without waiting.
    assert_eq!(c.take_notices(), [first, Notice::Draining { in_ms: 500 }]);
    // Again, waiting this time (wait_notices returns at once with what is there).
    c.call(&Request::Heartbeat { echo: ECHO_NOTICES }).unwrap();
    // Wall clock, and it stays (the client's waits take no clock to script): returning with what is there
    // means well before a budget made long for it, so only a wait that runs the budget out fails.
    let t = Instant::now();
    assert_eq!(c.wait_notices(Duration::from_secs(60)).unwrap(), [first, Notice::Draining { in_ms: 500 }]);
    assert!(t.elapsed() < Duration::from_secs(30));
    // Nothing more: an empty wait (the whole budget: a lower bound, which load cannot break), and the
    // connection still answers.
    let t = Instant::now();
    assert!(c.wait_notices(Duration::from_millis(100)).unwrap().is_empty());
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(c.call(&Request::Heartbeat { echo: 1 }).is_ok());
}

#[test]
fn resume_names_the_old_session_and_its_token() {
    let f = spawn(Behaviour::default());
    let (mut c, w) = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(5000)).unwrap();
    assert_eq!(c.resume(w.session_id, w.resume_token).unwrap(), 3);
    match c.resume(w.session_id, [0; 16]) {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::NotFound),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_wrong_server_proof_is_rejected() {
    let f = spawn(Behaviour { wrong_proof: true, ..Behaviour::default() });
    let e = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(5000)).unwrap_err();
    assert!(matches!(e, ClientError::ServerProof), "{e:?}");
    assert_eq!(e.exit_code(), 4);
    assert_eq!(f.accepted.load(Ordering::SeqCst), 1, "an authentication failure is not retried");
}

#[test]
fn a_wrong_key_gets_auth_failed() {
    let f = spawn(Behaviour::default());
    let who =
        Credentials { name: "demo".into(), key: leasectl::hex::decode("5f0e1d2c3b4a69788796a5b4c3d2e1f0").unwrap() };
    let e = Client::connect_and_hello(&f.addr.to_string(), &who, quick(5000)).unwrap_err();
    assert!(matches!(&e, ClientError::Server(b) if b.code == ErrorCode::AuthFailed), "{e:?}");
    assert_eq!(e.exit_code(), 4);
    assert_eq!(f.accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn accept_then_close_is_retried_until_the_server_listens() {
    let f = spawn(Behaviour { close_first: 3, ..Behaviour::default() });
    let (mut c, _) = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(10_000)).unwrap();
    assert_eq!(f.accepted.load(Ordering::SeqCst), 4);
    c.call(&Request::Heartbeat { echo: 1 }).unwrap();
}

#[test]
fn accept_then_close_forever_gives_up_at_the_deadline() {
    let f = spawn(Behaviour { always_close: true, ..Behaviour::default() });
    let t0 = Instant::now();
    let e = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(1500)).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(&e, ClientError::Io(_)), "{e:?}");
    assert_eq!(e.exit_code(), 3);
    // Wall clock, and it stays: the retry deadline is the client's real clock (`Timeouts::retry_for`, no clock
    // to inject), and "gave up at the deadline" is a statement about it. Not before it (a lower bound, which
    // load cannot break); the upper bound allows 2.5 s past it for a loaded machine.
    assert!(took >= Duration::from_millis(1000) && took < Duration::from_millis(4000), "{took:?}");
    assert!(f.accepted.load(Ordering::SeqCst) >= 3);
}

#[test]
fn a_silent_server_times_out() {
    let f = spawn(Behaviour { silent: true, ..Behaviour::default() });
    let t0 = Instant::now();
    let e = Client::connect_and_hello(&f.addr.to_string(), &demo(), quick(1000)).unwrap_err();
    assert!(matches!(&e, ClientError::Timeout { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 3);
    // Wall clock, and it stays: the answer timeout is the socket's, on the real clock; 2 s of margin.
    assert!(t0.elapsed() < Duration::from_millis(3000));
}

#[test]
fn nothing_listening_is_retried_then_fails() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t0 = Instant::now();
    let e = Client::connect_and_hello(&format!("127.0.0.1:{port}"), &demo(), quick(800)).unwrap_err();
    assert!(matches!(&e, ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused), "{e:?}");
    // Retried for its deadline before failing: a wall-clock lower bound, which stays (load cannot break it).
    assert!(t0.elapsed() >= Duration::from_millis(500));
}

/// A server that answers with an id nobody asked for is a protocol violation.
#[test]
fn an_answer_to_another_request_is_a_protocol_violation() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        let mut out = Vec::new();
        Response::Hello(HelloReply::Challenge { version: 1, server_nonce: [0; 32] }).encode(Op::Hello, 77, &mut out);
        let _ = s.write_all(&out);
        thread::sleep(Duration::from_millis(500));
    });
    let e = Client::connect_and_hello(&addr.to_string(), &demo(), quick(2000)).unwrap_err();
    assert!(matches!(&e, ClientError::Protocol(m) if m.contains("77")), "{e:?}");
    assert_eq!(e.exit_code(), 5);
}

fn cli(args: &[&str]) -> (u8, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let none = |_: &str| None;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = leasectl::cli::run(&args, &none, &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

#[test]
fn cli_exit_codes_and_output() {
    let f = spawn(Behaviour::default());
    let addr = f.addr.to_string();
    let base = ["--addr", addr.as_str(), "--tenant", "demo", "--key", KEY_HEX, "--timeout", "3"];
    let with = |extra: &[&str]| cli(&[&base[..], extra].concat());

    let (code, out, _) = with(&["ping"]);
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("pong from {addr}: rtt ")) && out.contains("uptime 4.242 s"), "{out}");

    let (code, out, _) = with(&["--json", "ping"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["uptime_ms"].as_u64(), v["session_id"].as_u64(), v["role"].as_str()),
        (Some(4242), Some(7), Some("tenant"))
    );
    assert!(v["rtt_us"].is_u64());

    // The fake is older than the guard block: leasectl asks again with the plain STATS.
    let (code, out, _) = with(&["--json", "stats"]);
    assert_eq!(code, 0);
    let v = serde_json::from_str::<serde_json::Value>(&out).unwrap();
    assert_eq!((&v["frames_in"], &v["guards"]), (&serde_json::json!(0), &serde_json::Value::Null));

    // FENCED_SUMMARY is paged: leasectl follows every page.
    let (code, out, _) = with(&["--json", "fenced"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let slots: Vec<u64> = v["slots"].as_array().unwrap().iter().map(|s| s["slot"].as_u64().unwrap()).collect();
    assert_eq!(slots, (0..u64::from(FENCED_SLOTS)).step_by(3).collect::<Vec<_>>());

    let (code, _, err) = with(&["free", "3.17"]);
    assert_eq!(code, 1);
    assert_eq!(err, "error: NOT_IMPLEMENTED: FREE is specified but the lease service is not built yet\n");

    let (code, out, _) = with(&["--json", "revoke", "3.17"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["error"]["code"], "NOT_IMPLEMENTED");
    assert_eq!(v["error"]["detail"], serde_json::json!([0, 0, 0]));

    let (code, _, err) =
        cli(&["--addr", &addr, "--tenant", "demo", "--key", "a1b2c3d4e5f60718293a4b5c6d7e8f90", "ping"]);
    assert_eq!(code, 4);
    assert!(err.starts_with("error: AUTH_FAILED"), "{err}");
    // A key the appliances would refuse to load is refused before any connection, with their words.
    let (code, _, err) = cli(&["--addr", &addr, "--tenant", "demo", "--key", "00112233", "ping"]);
    assert_eq!(code, 2);
    assert!(err.contains("key is 4 bytes; keys are 16 to 64 bytes"), "{err}");
    let (code, _, err) = cli(&["--addr", &addr, "--tenant", "demo", "--key", &"42".repeat(32), "ping"]);
    assert_eq!(code, 2);
    assert!(err.contains("one byte repeated") && err.contains("keys must be random"), "{err}");

    let (code, _, _) = with(&["alloc", "--size", "1"]);
    assert_eq!(code, 2);

    let closed = spawn(Behaviour { always_close: true, ..Behaviour::default() });
    let (code, _, err) =
        cli(&["--addr", &closed.addr.to_string(), "--tenant", "demo", "--key", KEY_HEX, "--timeout", "0.5", "ping"]);
    assert_eq!(code, 3);
    assert!(err.starts_with("error: CONNECTION: "), "{err}");

    let bad = spawn(Behaviour { wrong_proof: true, ..Behaviour::default() });
    let (code, out, _) =
        cli(&["--addr", &bad.addr.to_string(), "--tenant", "demo", "--key", KEY_HEX, "--json", "ping"]);
    assert_eq!(code, 4);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["error"]["code"], "SERVER_PROOF", "{out}");
}
