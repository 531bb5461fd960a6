//! The fuzz target's stable twin: the same check (`app/proto/fuzz/src/lib.rs`) on 120,000 inputs from a
//! seeded xorshift generator — random bytes, random payloads under plausible headers, and valid frames of
//! every message (random field values) with random mutations. Deterministic: a failure names its input's
//! index, and `TWIN_SEED` reproduces it.

#[path = "../fuzz/src/lib.rs"]
mod decode_check;

use decode_check::{Counts, check};
use leasebox_proto::{
    AllocReq, AllocResp, ErrorBody, ErrorCode, FencedSlot, HcaState, HcaStats, Health, HealthStatus, Hello, HelloInit,
    HelloNoise, HelloReply, Histogram, Kind, LeaseId, LeaseInfo, LeaseState, LeaseStats, MAX_MESSAGE, MAX_NAME,
    MAX_PAGE, MAX_PAYLOAD, Notice, Op, Outcome, Request, Response, Role, SessionGuards, SlotState, Stats, Transition,
    TransitionCause, frame,
};
use leasebox_twin::{Rng, twin_seed};

const INPUTS: usize = 120_000;
const SEED: u64 = 0x1EA5_EB0C_5EED_0001;

/// Draws that favour the values where length and range checks live; the rest come from [`Rng`] itself.
trait Edges {
    fn edge_u32(&mut self) -> u32;
    fn edge_u64(&mut self) -> u64;
    /// A UTF-8 string of `min..=max` bytes (ASCII, two-byte and three-byte characters).
    fn text(&mut self, min: usize, max: usize) -> String;
}

impl Edges for Rng {
    fn edge_u32(&mut self) -> u32 {
        match self.below(8) {
            0 => 0,
            1 => u32::MAX,
            2 => self.below(300) as u32,
            _ => self.next() as u32,
        }
    }
    fn edge_u64(&mut self) -> u64 {
        if self.chance(8) { u64::MAX } else { self.next() }
    }
    fn text(&mut self, min: usize, max: usize) -> String {
        let want = min + self.below(max - min + 1);
        let mut s = String::new();
        while s.len() < want {
            let c = match self.below(4) {
                0 => '\u{e9}',
                1 => '\u{20ac}',
                _ => (b'a' + self.below(26) as u8) as char,
            };
            if s.len() + c.len_utf8() > want {
                s.push('x');
            } else {
                s.push(c);
            }
        }
        s
    }
}

fn lease(r: &mut Rng) -> LeaseId {
    LeaseId { boot_id: r.bytes(), slot: r.edge_u32(), generation: r.edge_u32() }
}

fn request(r: &mut Rng) -> Request {
    match r.below(18) {
        0 => Request::Hello(Hello::Init(HelloInit {
            min_version: r.u16(),
            max_version: r.u16(),
            name: r.text(1, MAX_NAME),
            client_nonce: r.bytes(),
        })),
        1 if r.chance(2) => Request::Hello(Hello::Noise(HelloNoise {
            min_version: r.u16(),
            max_version: r.u16(),
            key_id: r.u8(),
            name: r.text(1, MAX_NAME),
            msg1: r.bytes(),
        })),
        1 => Request::Hello(Hello::Proof { mac: r.bytes() }),
        2 => Request::Heartbeat { echo: r.edge_u64() },
        3 => Request::Bye,
        4 => Request::Alloc(AllocReq {
            size: r.edge_u64(),
            access: r.u8(),
            mtu: r.u8(),
            ttl_ms: r.edge_u32(),
            client_qpn: r.edge_u32(),
            client_psn: r.edge_u32(),
            client_gid: r.bytes(),
            client_mac: r.bytes(),
        }),
        5 => Request::Ready { lease: lease(r), client_qpn: r.edge_u32(), server_qpn: r.edge_u32() },
        6 => Request::Renew { lease: lease(r), ttl_ms: r.edge_u32() },
        7 => Request::Free { lease: lease(r) },
        8 => Request::Query { lease: lease(r) },
        9 => Request::List { cursor: r.edge_u32(), max: r.u16() },
        10 => Request::Revoke { lease: lease(r), qp_first: r.chance(2) },
        11 if r.chance(2) => Request::Stats,
        11 => Request::StatsWith { want: r.edge_u32() },
        12 => Request::FencedSummary { cursor: r.edge_u32(), max: r.u16() },
        13 => Request::Resume { session_id: r.edge_u64(), token: r.bytes() },
        14 => Request::Drain { tenant: r.text(0, MAX_NAME), notice_ms: r.edge_u32() },
        15 => Request::HcaStats,
        16 => Request::LeaseLog { cursor: r.edge_u64(), max: r.u16() },
        _ => Request::Health,
    }
}

fn info(r: &mut Rng) -> LeaseInfo {
    LeaseInfo {
        lease: lease(r),
        state: r.pick(LeaseState::ALL),
        access: r.u8(),
        mtu: r.u8(),
        size: r.edge_u64(),
        rkey: r.edge_u32(),
        server_qpn: r.edge_u32(),
        client_qpn: r.edge_u32(),
        ttl_left_ms: r.edge_u32(),
        tenant: r.text(0, MAX_NAME),
    }
}

fn notice(r: &mut Rng) -> Notice {
    match r.below(4) {
        0 => Notice::Revoked { lease: lease(r), outcome: r.pick(Outcome::ALL) },
        1 => Notice::Expiring { lease: lease(r), in_ms: r.edge_u32() },
        2 => Notice::Fenced { lease: lease(r) },
        _ => Notice::Draining { in_ms: r.edge_u32() },
    }
}

fn response(r: &mut Rng) -> (Op, Response) {
    // NOTICE has no response: it travels in notice frames (`notice`).
    let op = match r.pick(Op::ALL) {
        Op::Notice => Op::Heartbeat,
        op => op,
    };
    let resp = match op {
        Op::Hello if r.chance(3) => Response::Hello(HelloReply::Noise { msg2: r.bytes() }),
        Op::Hello if r.chance(2) => {
            Response::Hello(HelloReply::Challenge { version: r.u16(), server_nonce: r.bytes() })
        }
        Op::Hello => Response::Hello(HelloReply::Welcome {
            role: r.pick(Role::ALL),
            credits: r.u16(),
            heartbeat_ms: r.edge_u32(),
            session_id: r.edge_u64(),
            server_proof: r.bytes(),
        }),
        Op::Heartbeat => Response::Heartbeat { echo: r.edge_u64(), uptime_ms: r.edge_u64() },
        Op::Bye => Response::Bye,
        Op::Alloc => Response::Alloc(AllocResp {
            lease: lease(r),
            rkey: r.edge_u32(),
            remote_addr: r.edge_u64(),
            length: r.edge_u64(),
            server_qpn: r.edge_u32(),
            server_psn: r.edge_u32(),
            server_gid: r.bytes(),
            mtu: r.u8(),
            ttl_ms: r.edge_u32(),
            server_mac: r.bytes(),
        }),
        Op::Ready => Response::Ready { state: r.pick(LeaseState::ALL) },
        Op::Renew => Response::Renew { ttl_ms: r.edge_u32() },
        Op::Free => Response::Free { outcome: r.pick(Outcome::ALL), elapsed_us: r.edge_u32() },
        Op::Query => Response::Query(info(r)),
        Op::List => {
            let n = r.below(4);
            Response::List { next_cursor: r.edge_u32(), leases: (0..n).map(|_| info(r)).collect() }
        }
        Op::Revoke => Response::Revoke { outcome: r.pick(Outcome::ALL), elapsed_us: r.edge_u32() },
        Op::Resume => Response::Resume { leases: r.edge_u32() },
        Op::Drain => Response::Drain { leases: r.edge_u32(), deadline_ms: r.edge_u64() },
        Op::Notice => unreachable!("replaced above"),
        Op::Stats => {
            let (e, k) = (r.below(5), r.below(5));
            Response::Stats(Box::new(Stats {
                uptime_ms: r.edge_u64(),
                boot_id: r.bytes(),
                sessions_current: r.edge_u32(),
                session_budget: r.edge_u32(),
                sessions_total: r.edge_u64(),
                sessions_refused: r.edge_u64(),
                frames_in: r.edge_u64(),
                frames_out: r.edge_u64(),
                errors: (0..e).map(|_| (r.u16(), r.edge_u64())).collect(),
                roles: (0..k).map(|_| (r.u16(), r.u8(), r.edge_u64())).collect(),
                leases: LeaseStats {
                    by_state: [r.edge_u32(), r.edge_u32(), r.edge_u32(), r.edge_u32(), r.edge_u32()],
                    bytes_leased: r.edge_u64(),
                    bytes_free: r.edge_u64(),
                    fenced_slots: r.edge_u32(),
                    allocs: r.edge_u64(),
                    revokes: r.edge_u64(),
                    expiries: r.edge_u64(),
                    reconnects: r.edge_u64(),
                    alloc_us: Histogram { buckets: core::array::from_fn(|_| r.edge_u32()) },
                    revoke_us: Histogram { buckets: core::array::from_fn(|_| r.edge_u32()) },
                    pool_bytes: r.edge_u64(),
                    bytes_scrubbing: r.edge_u64(),
                },
                guards: r.chance(2).then(|| SessionGuards {
                    evicted: r.edge_u64(),
                    rate_refusals: r.edge_u64(),
                    hellos_replayed: r.edge_u64(),
                    records_in: r.edge_u64(),
                    records_empty: r.edge_u64(),
                }),
            }))
        }
        Op::FencedSummary => {
            let n = r.below(4);
            Response::FencedSummary {
                next_cursor: r.edge_u32(),
                slots: (0..n)
                    .map(|_| FencedSlot {
                        slot: r.edge_u32(),
                        generation: r.edge_u32(),
                        failed_mask: r.edge_u32(),
                        origin: r.u8(),
                        fenced_at_ms: r.edge_u64(),
                    })
                    .collect(),
            }
        }
        Op::Health => Response::Health(Health {
            status: r.pick(HealthStatus::ALL),
            hca: r.pick(HcaState::ALL),
            fenced_slots: r.edge_u32(),
            uptime_ms: r.edge_u64(),
            message: r.text(0, MAX_MESSAGE),
        }),
        Op::HcaStats => Response::HcaStats(HcaStats {
            hca: r.pick(HcaState::ALL),
            submitted: r.edge_u64(),
            ok: r.edge_u64(),
            failed: r.edge_u64(),
            timeout: r.edge_u64(),
            late: r.edge_u64(),
            aborted: r.edge_u64(),
        }),
        Op::LeaseLog => Response::LeaseLog {
            next_cursor: r.edge_u64(),
            lost: r.edge_u64(),
            records: (0..r.below(MAX_PAGE + 1))
                .map(|_| Transition {
                    seq: r.edge_u64(),
                    at_us: r.edge_u64(),
                    slot: r.edge_u32(),
                    generation: r.edge_u32(),
                    from: r.pick(SlotState::ALL),
                    to: r.pick(SlotState::ALL),
                    why: r.pick(TransitionCause::ALL),
                    failed_mask: r.edge_u32(),
                })
                .collect(),
        },
    };
    (op, resp)
}

fn error_body(r: &mut Rng) -> ErrorBody {
    let e = ErrorBody::new(r.pick(ErrorCode::ALL), &r.text(0, MAX_MESSAGE + 20));
    e.with_detail([r.edge_u32(), r.edge_u32(), r.edge_u32()])
}

/// One valid frame of any kind, appended to `out`.
fn valid_frame(r: &mut Rng, out: &mut Vec<u8>) {
    let id = r.edge_u32();
    match r.below(4) {
        0 => request(r).encode(id, out),
        3 => notice(r).encode(out),
        1 => {
            let (op, resp) = response(r);
            resp.encode(op, id, out);
        }
        _ => error_body(r).encode(r.pick(Op::ALL) as u16, id, out),
    }
}

/// A plausible header (right magic and version, mostly) over a random payload.
fn header_and_noise(r: &mut Rng, out: &mut Vec<u8>) {
    let op = if r.chance(4) { r.u16() } else { r.pick(Op::ALL) as u16 };
    let kind = match r.below(9) {
        0 => Kind::Response,
        1 => Kind::Error,
        2 => Kind::Notice,
        _ => Kind::Request,
    };
    let len = r.below(96);
    let payload = r.vec(len);
    frame(kind, op, r.edge_u32(), &payload, out);
}

/// Random edits: bit flips, interesting bytes, insertions, deletions, truncation, a lying length field.
fn mutate(r: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.push(r.u8());
            continue;
        }
        let at = r.below(b.len());
        match r.below(7) {
            0 => b[at] ^= 1 << r.below(8),
            1 => b[at] = r.pick(&[0, 1, 2, 0x7f, 0x80, 0xff, 32, 33, 0x20, 0xfe]),
            2 => b.insert(at, r.u8()),
            3 => {
                b.remove(at);
            }
            4 => b.truncate(at),
            5 if b.len() >= 16 => {
                // The header's length field (of the first frame): shorter, longer, or past the limit.
                let len = match r.below(3) {
                    0 => r.below(64) as u32,
                    1 => (MAX_PAYLOAD + r.below(3)) as u32 - 1,
                    _ => r.edge_u32(),
                };
                b[12..16].copy_from_slice(&len.to_be_bytes());
            }
            _ => {
                let end = (at + 1 + r.below(24)).min(b.len());
                let piece = b[at..end].to_vec();
                b.splice(at..at, piece);
            }
        }
    }
}

/// Valid frames, decoded without mutation, are all accepted (the generator is sound).
#[test]
fn unmutated_frames_are_all_accepted() {
    let mut r = Rng(SEED ^ 0xFF);
    for i in 0..2_000 {
        let mut b = vec![0x80];
        request(&mut r).encode(i, &mut b);
        let n = check(&b);
        assert_eq!((n.frames, n.requests), (1, 1), "request #{i}");
        let mut b = vec![0x80];
        let (op, resp) = response(&mut r);
        resp.encode(op, i, &mut b);
        assert!(check(&b).responses == 1, "response #{i}: {resp:?}");
        let mut b = vec![(i % 64) as u8];
        error_body(&mut r).encode(0x0102, i, &mut b);
        assert_eq!(check(&b).errors, 1, "error #{i}");
        let mut b = vec![0x80];
        let n = notice(&mut r);
        n.encode(&mut b);
        assert_eq!(check(&b).notices, 1, "notice #{i}: {n:?}");
    }
}

#[test]
fn random_and_mutated_frames_never_panic_and_round_trip() {
    let seed = twin_seed(SEED);
    let mut r = Rng(seed);
    let mut total = Counts::default();
    let mut input = Vec::new();
    for i in 0..INPUTS {
        input.clear();
        input.push(r.u8());
        match r.below(10) {
            0 | 1 => {
                let n = r.below(300);
                input.extend(r.vec(n));
            }
            2 | 3 => {
                for _ in 0..1 + r.below(3) {
                    header_and_noise(&mut r, &mut input);
                }
                if r.chance(2) {
                    mutate(&mut r, &mut input);
                }
            }
            _ => {
                let mut body = Vec::new();
                for _ in 0..1 + r.below(3) {
                    valid_frame(&mut r, &mut body);
                }
                if !r.chance(4) {
                    mutate(&mut r, &mut body);
                }
                input.extend(body);
            }
        }
        let result = std::panic::catch_unwind(|| check(&input));
        match result {
            Ok(n) => total += n,
            Err(_) => panic!("input #{i} (seed {seed:#x}) failed the check: {input:02x?}"),
        }
    }
    eprintln!("decode twin: {INPUTS} inputs, {total:?}");
    // The inputs reach every decoder, accepted and refused, and both kinds of framing error.
    assert!(total.frames > 80_000, "{total:?}");
    assert!(total.requests > 15_000, "{total:?}");
    assert!(total.responses > 15_000, "{total:?}");
    assert!(total.errors > 10_000, "{total:?}");
    assert!(total.notices > 5_000, "{total:?}");
    assert!(total.bad_headers > 10_000, "{total:?}");
    assert!(total.framing_lost > 10_000, "{total:?}");
}
