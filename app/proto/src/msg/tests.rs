use super::*;
use crate::frame::{FrameBuf, Header, Next};
use alloc::string::ToString;
use alloc::vec;

fn lease() -> LeaseId {
    LeaseId { boot_id: [0xb0; 16], slot: 3, generation: 0x0102_0304 }
}

fn info() -> LeaseInfo {
    LeaseInfo {
        lease: lease(),
        state: LeaseState::Active,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        size: 2 << 20,
        rkey: 0x1234_5601,
        server_qpn: 0x48,
        client_qpn: 0x1_0203,
        ttl_left_ms: 9000,
        tenant: "demo".to_string(),
    }
}

fn lease_stats() -> LeaseStats {
    let mut alloc_us = Histogram::default();
    let mut revoke_us = Histogram::default();
    for us in [0, 1, 3, 40, 40_000] {
        alloc_us.record(us);
    }
    revoke_us.buckets[15] = 0x0102_0304;
    LeaseStats {
        by_state: [1, 2, 3, 4, 5],
        bytes_leased: 6 << 20,
        bytes_free: 0x0A0B_0C0D_0E0F_1011,
        fenced_slots: 5,
        allocs: 7,
        revokes: 8,
        expiries: 9,
        reconnects: 10,
        alloc_us,
        revoke_us,
        pool_bytes: 64 << 20,
        bytes_scrubbing: 0x1122_3344_5566_7788,
    }
}

fn requests() -> Vec<Request> {
    vec![
        Request::Hello(Hello::Init(HelloInit {
            min_version: 1,
            max_version: 1,
            name: "demo".to_string(),
            client_nonce: [7; 16],
        })),
        Request::Hello(Hello::Proof { mac: [9; 32] }),
        Request::Heartbeat { echo: 42 },
        Request::Bye,
        Request::Alloc(AllocReq {
            size: 2 << 20,
            access: access::ALL,
            mtu: 3,
            ttl_ms: 30_000,
            client_qpn: 0x11,
            client_psn: 0x22,
            client_gid: [0xfe; 16],
            client_mac: [2, 0, 0, 0, 0, 1],
        }),
        Request::Ready { lease: lease(), client_qpn: 0x11, server_qpn: 0x48 },
        Request::Renew { lease: lease(), ttl_ms: 5000 },
        Request::Free { lease: lease() },
        Request::Query { lease: lease() },
        Request::List { cursor: 0, max: 64 },
        Request::Revoke { lease: lease(), qp_first: true },
        Request::Resume { session_id: 0x0102_0304_0506_0708, token: [0x7e; 16] },
        Request::Drain { tenant: "demo".to_string(), notice_ms: 2000 },
        Request::Drain { tenant: String::new(), notice_ms: 0 },
        Request::Stats,
        Request::StatsWith { want: STATS_WANT_GUARDS },
        Request::FencedSummary { cursor: 3, max: 128 },
        Request::Health,
        Request::HcaStats,
        Request::LeaseLog { cursor: 0x0102_0304_0506_0708, max: 128 },
    ]
}

fn transition() -> Transition {
    Transition {
        seq: 0x11,
        at_us: 2_500_001,
        slot: 17,
        generation: 4,
        from: SlotState::Fencing,
        to: SlotState::Fenced,
        why: TransitionCause::TeardownFailed,
        failed_mask: 0x001,
    }
}

fn responses() -> Vec<(Op, Response)> {
    vec![
        (Op::Hello, Response::Hello(HelloReply::Challenge { version: 1, server_nonce: [5; 32] })),
        (
            Op::Hello,
            Response::Hello(HelloReply::Welcome {
                role: Role::Admin,
                credits: 8,
                heartbeat_ms: 10_000,
                session_id: 77,
                server_proof: [1; 32],
            }),
        ),
        (Op::Heartbeat, Response::Heartbeat { echo: 42, uptime_ms: 1234 }),
        (Op::Bye, Response::Bye),
        (
            Op::Alloc,
            Response::Alloc(AllocResp {
                lease: lease(),
                rkey: 0xabcd_ef01,
                remote_addr: 0x4000_0000,
                length: 2 << 20,
                server_qpn: 0x48,
                server_psn: 0x99,
                server_gid: [0xaa; 16],
                mtu: 3,
                ttl_ms: 30_000,
                server_mac: [2, 0x4c, 0x42, 0, 0, 1],
            }),
        ),
        (Op::Ready, Response::Ready { state: LeaseState::Active }),
        (Op::Renew, Response::Renew { ttl_ms: 5000 }),
        (Op::Free, Response::Free { outcome: Outcome::TornDown, elapsed_us: 120 }),
        (Op::Query, Response::Query(info())),
        (Op::List, Response::List { next_cursor: 9, leases: vec![info(), info()] }),
        (Op::Revoke, Response::Revoke { outcome: Outcome::Fenced, elapsed_us: 1500 }),
        (Op::Resume, Response::Resume { leases: 3 }),
        (Op::Drain, Response::Drain { leases: 7, deadline_ms: 0x0102_0304_0506 }),
        (
            Op::Stats,
            Response::Stats(Box::new(Stats {
                uptime_ms: 5,
                boot_id: [0xb1; 16],
                sessions_current: 1,
                session_budget: 16,
                sessions_total: 3,
                sessions_refused: 1,
                frames_in: 10,
                frames_out: 11,
                errors: vec![(4, 2), (8, 1)],
                roles: vec![(0, 0, 100), (1, 1, 200)],
                leases: lease_stats(),
                guards: None,
            })),
        ),
        (
            Op::Stats,
            Response::Stats(Box::new(Stats {
                uptime_ms: 6,
                errors: vec![(4, 2)],
                leases: lease_stats(),
                guards: Some(guards()),
                ..Stats::default()
            })),
        ),
        (
            Op::FencedSummary,
            Response::FencedSummary {
                next_cursor: 7,
                slots: vec![FencedSlot { slot: 1, generation: 2, failed_mask: 4, origin: 1, fenced_at_ms: 99 }],
            },
        ),
        (
            Op::Health,
            Response::Health(Health {
                status: HealthStatus::Degraded,
                hca: HcaState::Absent,
                fenced_slots: 0,
                uptime_ms: 7,
                message: "no HCA".to_string(),
            }),
        ),
        (
            Op::HcaStats,
            Response::HcaStats(HcaStats {
                hca: HcaState::Ok,
                submitted: 40,
                ok: 37,
                failed: 1,
                timeout: 1,
                late: 1,
                aborted: u64::MAX,
            }),
        ),
        (Op::LeaseLog, Response::LeaseLog { next_cursor: 0x12, lost: 3, records: vec![transition(); 2] }),
        (Op::LeaseLog, Response::LeaseLog { next_cursor: 1, lost: 0, records: Vec::new() }),
    ]
}

#[test]
fn every_request_round_trips_through_a_frame() {
    for (i, req) in requests().into_iter().enumerate() {
        let mut bytes = Vec::new();
        req.encode(i as u32, &mut bytes);
        let mut fb = FrameBuf::new();
        fb.push(&bytes);
        let Next::Frame(h, payload) = fb.next_frame() else { panic!("no frame for {req:?}") };
        assert_eq!((h.kind, h.request_id), (Kind::Request, i as u32));
        let op = Op::from_raw(h.op).unwrap();
        assert_eq!(Request::decode(op, &payload).unwrap(), req);
        // Every strict prefix of the payload is refused as truncated, never accepted or panicking — but STATS with
        // parts cut to nothing is the plain STATS.
        for cut in 0..payload.len() {
            if matches!(req, Request::StatsWith { .. }) && cut == 0 {
                assert_eq!(Request::decode(op, &[]), Ok(Request::Stats));
                continue;
            }
            assert!(
                matches!(Request::decode(op, &payload[..cut]), Err(DecodeError::Truncated { .. })),
                "{op:?} cut {cut}"
            );
        }
        let mut long = payload.clone();
        long.push(0);
        // A byte after the plain STATS begins `stats.want`.
        let want = match req {
            Request::Stats => Err(DecodeError::Truncated { field: "stats.want" }),
            _ => Err(DecodeError::TrailingBytes { count: 1 }),
        };
        assert_eq!(Request::decode(op, &long), want);
    }
}

#[test]
fn every_response_round_trips() {
    for (op, resp) in responses() {
        let mut bytes = Vec::new();
        resp.encode(op, 5, &mut bytes);
        let h = Header::parse(&bytes).unwrap().unwrap();
        assert_eq!((h.kind, h.op, h.length as usize), (Kind::Response, op as u16, bytes.len() - 16));
        assert_eq!(Response::decode(op, &bytes[16..]).unwrap(), resp);
    }
}

#[test]
fn every_op_has_a_request_and_a_response() {
    let req_ops: Vec<Op> = requests().iter().map(Request::op).collect();
    let resp_ops: Vec<Op> = responses().iter().map(|(o, _)| *o).collect();
    // NOTICE is the server's alone: it is neither a request nor a response (see `notices_round_trip`).
    for op in Op::ALL.iter().filter(|op| **op != Op::Notice) {
        assert!(req_ops.contains(op), "{op:?}");
        assert!(resp_ops.contains(op), "{op:?}");
    }
}

#[test]
fn golden_heartbeat_request() {
    let mut b = Vec::new();
    Request::Heartbeat { echo: 0x0102_0304_0506_0708 }.encode(0x11, &mut b);
    assert_eq!(
        b,
        [
            0x4C, 0x42, 0x01, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x08, //
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08
        ]
    );
}

#[test]
fn golden_hello_init() {
    let mut b = Vec::new();
    Request::Hello(Hello::Init(HelloInit {
        min_version: 1,
        max_version: 1,
        name: "ab".to_string(),
        client_nonce: [0xEE; 16],
    }))
    .encode(1, &mut b);
    let mut want = vec![0x4C, 0x42, 1, 0, 0x01, 0x01, 0, 0, 0, 0, 0, 1, 0, 0, 0, 24];
    want.extend([1, 0, 1, 0, 1, 2, b'a', b'b']);
    want.extend([0xEE; 16]);
    assert_eq!(b, want);
}

#[test]
fn golden_revoke_request_and_response() {
    let mut b = Vec::new();
    Request::Revoke { lease: LeaseId { boot_id: [0xb0; 16], slot: 2, generation: 5 }, qp_first: false }
        .encode(9, &mut b);
    assert_eq!(&b[16..32], [0xb0; 16]);
    assert_eq!(&b[32..], [0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0]);
    assert_eq!(&b[4..6], [0x02, 0x0A]);
    let mut b = Vec::new();
    Response::Revoke { outcome: Outcome::NotFound, elapsed_us: 0x0100 }.encode(Op::Revoke, 9, &mut b);
    assert_eq!(&b[16..], [2, 0, 0, 0, 0, 0, 1, 0]);
}

#[test]
fn golden_alloc_request_layout() {
    let Request::Alloc(a) = &requests()[4] else { unreachable!() };
    let mut p = Vec::new();
    Request::Alloc(a.clone()).encode_payload(&mut p);
    assert_eq!(p.len(), 48);
    assert_eq!(&p[0..8], (2u64 << 20).to_be_bytes());
    assert_eq!(&p[8..12], [access::ALL, 3, 0, 0]);
    assert_eq!(&p[12..16], 30_000u32.to_be_bytes());
    assert_eq!(&p[16..20], 0x11u32.to_be_bytes());
    assert_eq!(&p[24..40], [0xfe; 16]);
    assert_eq!(&p[40..46], [2, 0, 0, 0, 0, 1]);
}

#[test]
fn golden_hca_stats_layout() {
    let h = HcaStats { hca: HcaState::Fatal, submitted: 9, ok: 5, failed: 1, timeout: 1, late: 1, aborted: 1 };
    let mut p = Vec::new();
    Response::HcaStats(h).encode_payload(&mut p);
    assert_eq!(p.len(), 56);
    assert_eq!(&p[0..8], [3, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&p[8..16], 9u64.to_be_bytes());
    assert_eq!(&p[16..24], 5u64.to_be_bytes());
    assert_eq!(&p[48..56], 1u64.to_be_bytes());
    // The reserved bytes are checked.
    p[5] = 1;
    assert!(Response::decode(Op::HcaStats, &p).is_err());
    p[5] = 0;
    p[0] = 9;
    assert_eq!(Response::decode(Op::HcaStats, &p), Err(DecodeError::Invalid { field: "hca_stats.hca" }));
}

#[test]
fn golden_lease_log_layout() {
    let mut b = Vec::new();
    Request::LeaseLog { cursor: 0x0102_0304_0506_0708, max: 0x0080 }.encode(0x11, &mut b);
    assert_eq!(
        &b[16..],
        [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // cursor
            0x00, 0x80, 0, 0, 0, 0, 0, 0, // max, reserved
        ]
    );
    assert_eq!(&b[4..6], [0x03, 0x05], "op 0x0305");
    let mut p = Vec::new();
    Response::LeaseLog { next_cursor: 0x12, lost: 3, records: vec![transition()] }.encode_payload(&mut p);
    assert_eq!(
        p,
        [
            0, 0, 0, 0, 0, 0, 0, 0x12, // next_cursor
            0, 0, 0, 0, 0, 0, 0, 3, // lost
            0, 1, 0, 0, 0, 0, 0, 0, // count, reserved
            0, 0, 0, 0, 0, 0, 0, 0x11, // seq
            0, 0, 0, 0, 0, 0x26, 0x25, 0xa1, // at_us 2_500_001
            0, 0, 0, 17, 0, 0, 0, 4, // slot, generation
            4, 8, 9, 0, 0, 0, 0, 1, // from fencing, to fenced, why teardown-failed, reserved, failed_mask
        ][..]
    );
    // Unknown states and causes, reserved bytes and an over-long count are refused.
    for (at, v, field) in [(48, 10, "lease_log.from"), (49, 99, "lease_log.to"), (50, 0, "lease_log.why")] {
        let mut bad = p.clone();
        bad[at] = v;
        assert_eq!(Response::decode(Op::LeaseLog, &bad), Err(DecodeError::Invalid { field }));
    }
    let mut bad = p.clone();
    bad[51] = 1;
    assert!(Response::decode(Op::LeaseLog, &bad).is_err());
    let mut bad = p.clone();
    bad[20] = 1;
    assert!(Response::decode(Op::LeaseLog, &bad).is_err());
    let mut bad = p.clone();
    bad[16..18].copy_from_slice(&((MAX_PAGE + 1) as u16).to_be_bytes());
    assert!(Response::decode(Op::LeaseLog, &bad).is_err());
    let mut r = b[16..].to_vec();
    r[12] = 1;
    assert!(Request::decode(Op::LeaseLog, &r).is_err(), "request reserved bytes");
}

#[test]
fn golden_error_frame() {
    let mut b = Vec::new();
    ErrorBody::new(ErrorCode::CreditExceeded, "x").with_detail([8, 0, 0]).encode(0x0102, 3, &mut b);
    assert_eq!(
        b,
        [
            0x4C, 0x42, 1, 2, 0x01, 0x02, 0, 0, 0, 0, 0, 3, 0, 0, 0, 17, //
            0, 8, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, b'x'
        ]
    );
    assert_eq!(ErrorBody::decode(&b[16..]).unwrap().code, ErrorCode::CreditExceeded);
}

#[test]
fn error_messages_are_bounded_on_a_char_boundary() {
    let long = "é".repeat(200); // 400 bytes
    let e = ErrorBody::new(ErrorCode::Internal, &long);
    assert!(e.message.len() <= MAX_MESSAGE && e.message.chars().all(|c| c == 'é'));
    let mut p = Vec::new();
    e.encode_payload(&mut p);
    assert_eq!(ErrorBody::decode(&p).unwrap(), e);
}

#[test]
fn invalid_fields_are_named() {
    assert_eq!(Request::decode(Op::Hello, &[4]), Err(DecodeError::Invalid { field: "hello.step" }));
    assert_eq!(Request::decode(Op::Hello, &[3]), Err(DecodeError::Truncated { field: "hello.min_version" }));
    assert_eq!(Request::decode(Op::Hello, &[1, 0, 1, 0, 1, 0]), Err(DecodeError::Invalid { field: "hello.name_len" }));
    let mut p = Vec::new();
    Request::Revoke { lease: lease(), qp_first: false }.encode_payload(&mut p);
    p[24] = 0x80;
    assert_eq!(Request::decode(Op::Revoke, &p), Err(DecodeError::Invalid { field: "revoke.flags" }));
    p[24] = 0;
    p[25] = 1;
    assert_eq!(Request::decode(Op::Revoke, &p), Err(DecodeError::Invalid { field: "reserved" }));
    assert_eq!(mtu_bytes(3), Some(1024));
    assert_eq!(mtu_bytes(6), None);
    assert_eq!(Op::from_raw(0x0207), None);
    assert_eq!(ErrorCode::parse_name("CREDIT_EXCEEDED"), Some(ErrorCode::CreditExceeded));
}

#[test]
fn a_long_health_message_is_cut_on_a_character_boundary() {
    let h =
        Health {
            status: HealthStatus::Ok, hca: HcaState::Ok, fenced_slots: 0, uptime_ms: 1, message: "é".repeat(200)
        };
    let mut p = Vec::new();
    Response::Health(h).encode_payload(&mut p);
    let Response::Health(back) = Response::decode(Op::Health, &p).unwrap() else { panic!("not HEALTH") };
    assert_eq!(back.message, "é".repeat(MAX_MESSAGE / 2));
}

#[test]
fn every_prefix_of_a_stats_response_is_refused() {
    let (op, resp) = responses().into_iter().find(|(op, _)| *op == Op::Stats).unwrap();
    let mut p = Vec::new();
    resp.encode_payload(&mut p);
    assert_eq!(Response::decode(op, &p).unwrap(), resp);
    // An older appliance's STATS end before `pool_bytes` and `bytes_scrubbing`: read with both 0.
    let before_pool = p.len() - (LeaseStats::WIRE_LEN - LeaseStats::WIRE_LEN_BEFORE_POOL);
    let Ok(Response::Stats(older)) = Response::decode(op, &p[..before_pool]) else { panic!("older STATS refused") };
    let Response::Stats(full) = &resp else { unreachable!() };
    let want = LeaseStats { pool_bytes: 0, bytes_scrubbing: 0, ..full.leases.clone() };
    assert_eq!(older.leases, want);
    for cut in (0..p.len()).filter(|&c| c != before_pool) {
        assert!(matches!(Response::decode(op, &p[..cut]), Err(DecodeError::Truncated { .. })), "cut {cut}");
    }
    // A byte after the lease figures begins the guard block.
    let mut long = p.clone();
    long.push(0);
    assert_eq!(Response::decode(op, &long), Err(DecodeError::Truncated { field: "stats.guards_len" }));
    // A STATS answer without the lease tail (the layout before it existed) is refused, not half-read.
    let old_len = p.len() - LeaseStats::WIRE_LEN;
    assert_eq!(Response::decode(op, &p[..old_len]), Err(DecodeError::Truncated { field: "stats.leases_by_state" }));
}

fn guards() -> SessionGuards {
    SessionGuards {
        evicted: 1,
        rate_refusals: 2,
        hellos_replayed: 3,
        records_in: 0x0102_0304_0506_0708,
        records_empty: 5,
    }
}

#[test]
fn golden_stats_guards_block() {
    let s = Stats { guards: Some(guards()), ..Stats::default() };
    let mut p = Vec::new();
    Response::Stats(Box::new(s.clone())).encode_payload(&mut p);
    let at = 68 + LeaseStats::WIRE_LEN;
    assert_eq!(p.len(), at + 2 + SessionGuards::WIRE_LEN);
    let mut want: Vec<u8> = vec![0, 40];
    want.extend([0, 0, 0, 0, 0, 0, 0, 1]); // evicted
    want.extend([0, 0, 0, 0, 0, 0, 0, 2]); // rate_refusals
    want.extend([0, 0, 0, 0, 0, 0, 0, 3]); // hellos_replayed
    want.extend([1, 2, 3, 4, 5, 6, 7, 8]); // records_in
    want.extend([0, 0, 0, 0, 0, 0, 0, 5]); // records_empty
    assert_eq!(&p[at..], &want[..]);
    assert_eq!(Response::decode(Op::Stats, &p).unwrap(), Response::Stats(Box::new(s.clone())));
    // What an older client gets: it never asks for the block, and the answer without it is the layout it knows.
    let mut plain = Vec::new();
    Response::Stats(Box::new(Stats { guards: None, ..s.clone() })).encode_payload(&mut plain);
    assert_eq!(plain[..], p[..at]);
    // A later appliance's longer block: the known fields read, the rest skipped.
    let mut later = p[..at].to_vec();
    later.extend([0, 48]);
    later.extend(&want[2..]);
    later.extend([0xee; 8]);
    assert_eq!(Response::decode(Op::Stats, &later).unwrap(), Response::Stats(Box::new(s)));
    // A block shorter than today's fields is refused, a cut one is truncated.
    let mut short = p[..at].to_vec();
    short.extend([0, 39]);
    short.extend(&want[2..41]);
    assert_eq!(Response::decode(Op::Stats, &short), Err(DecodeError::Invalid { field: "stats.guards_len" }));
    assert!(matches!(Response::decode(Op::Stats, &p[..p.len() - 1]), Err(DecodeError::Truncated { .. })));
    let mut long = p.clone();
    long.push(0);
    assert_eq!(Response::decode(Op::Stats, &long), Err(DecodeError::TrailingBytes { count: 1 }));
}

#[test]
fn stats_requests_with_and_without_parts() {
    let mut p = Vec::new();
    Request::StatsWith { want: STATS_WANT_GUARDS }.encode_payload(&mut p);
    assert_eq!(p, [0, 0, 0, 1]);
    assert_eq!(Request::decode(Op::Stats, &p), Ok(Request::StatsWith { want: 1 }));
    assert_eq!(Request::decode(Op::Stats, &[]), Ok(Request::Stats));
    assert!(matches!(Request::decode(Op::Stats, &[0, 1]), Err(DecodeError::Truncated { .. })));
    assert_eq!(Request::decode(Op::Stats, &[0, 0, 0, 1, 0]), Err(DecodeError::TrailingBytes { count: 1 }));
}

#[test]
fn golden_stats_lease_tail() {
    let s = Stats { leases: lease_stats(), ..Stats::default() };
    let mut p = Vec::new();
    Response::Stats(Box::new(s.clone())).encode_payload(&mut p);
    // 64 bytes of counters and the boot id, error_count 0, role_count 0, then the 216-byte lease tail.
    assert_eq!(p.len(), 64 + 2 + 2 + LeaseStats::WIRE_LEN);
    let tail = &p[68..];
    let mut want: Vec<u8> = Vec::new();
    want.extend([0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5]); // by_state
    want.extend([0, 0, 0, 0, 0, 0x60, 0, 0]); // bytes_leased = 6 MiB
    want.extend([0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11]); // bytes_free
    want.extend([0, 0, 0, 5]); // fenced_slots
    want.extend([0, 0, 0, 0, 0, 0, 0, 7]); // allocs
    want.extend([0, 0, 0, 0, 0, 0, 0, 8]); // revokes
    want.extend([0, 0, 0, 0, 0, 0, 0, 9]); // expiries
    want.extend([0, 0, 0, 0, 0, 0, 0, 10]); // reconnects
    // alloc_us: 0 and 1 in bucket 0, 3 in bucket 1, 40 in bucket 5, 40000 in bucket 15.
    want.extend([0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    want.extend([0; 4 * 9]);
    want.extend([0, 0, 0, 1]);
    // revoke_us: only bucket 15.
    want.extend([0; 4 * 15]);
    want.extend([1, 2, 3, 4]);
    want.extend([0, 0, 0, 0, 0x04, 0, 0, 0]); // pool_bytes = 64 MiB
    want.extend([0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]); // bytes_scrubbing
    assert_eq!(tail, &want[..]);
    assert_eq!(Response::decode(Op::Stats, &p).unwrap(), Response::Stats(Box::new(s)));
}

#[test]
fn histogram_buckets_are_powers_of_two() {
    let cases = [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (1023, 9), (1024, 10), (32_767, 14), (32_768, 15)];
    for (us, b) in cases {
        assert_eq!(Histogram::bucket(us), b, "{us} us");
    }
    assert_eq!(Histogram::bucket(u64::MAX), 15);
    assert_eq!(
        (Histogram::upper_bound(0), Histogram::upper_bound(14), Histogram::upper_bound(15)),
        (2, 1 << 15, u64::MAX)
    );

    let mut h = Histogram::default();
    assert_eq!((h.count(), h.percentile(50.0)), (0, None));
    for _ in 0..98 {
        h.record(10); // bucket 3: [8, 16)
    }
    h.record(1000); // bucket 9: [512, 1024)
    h.record(100_000); // bucket 15
    assert_eq!(h.count(), 100);
    assert_eq!(h.percentile(0.0), Some(16));
    assert_eq!(h.percentile(50.0), Some(16));
    assert_eq!(h.percentile(98.0), Some(16));
    assert_eq!(h.percentile(98.5), Some(1024));
    assert_eq!(h.percentile(99.0), Some(1024));
    assert_eq!(h.percentile(100.0), Some(u64::MAX));
    assert_eq!(h.percentile(250.0), Some(u64::MAX));
    assert_eq!(h.percentile(f64::NAN), Some(16));
    h.buckets[0] = u32::MAX;
    h.record(0);
    assert_eq!(h.buckets[0], u32::MAX, "a full bucket saturates");
}

fn notices() -> Vec<Notice> {
    vec![
        Notice::Revoked { lease: lease(), outcome: Outcome::TornDown },
        Notice::Revoked { lease: lease(), outcome: Outcome::Fenced },
        Notice::Expiring { lease: lease(), in_ms: 4999 },
        Notice::Fenced { lease: lease() },
        Notice::Draining { in_ms: 30_000 },
    ]
}

#[test]
fn notices_round_trip_in_frames_of_their_own_kind() {
    for n in notices() {
        let mut b = Vec::new();
        n.encode(&mut b);
        let h = Header::parse(&b).unwrap().unwrap();
        assert_eq!((h.kind, h.op, h.request_id, h.length), (Kind::Notice, Op::Notice as u16, 0, 32));
        assert_eq!(Notice::decode(&b[16..]).unwrap(), n);
        for cut in 0..b.len() - 16 {
            assert!(matches!(Notice::decode(&b[16..16 + cut]), Err(DecodeError::Truncated { .. })), "{n:?} {cut}");
        }
    }
    // NOTICE is no request: a client that sends one is refused by name, not served.
    assert_eq!(Request::decode(Op::Notice, &[]), Err(DecodeError::Invalid { field: "op" }));
}

#[test]
fn golden_notice_revoked() {
    let mut b = Vec::new();
    Notice::Revoked { lease: LeaseId { boot_id: [0xb0; 16], slot: 2, generation: 5 }, outcome: Outcome::Fenced }
        .encode(&mut b);
    let mut want = vec![0x4C, 0x42, 1, 3, 0x01, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32];
    want.extend([1, 1, 0, 0, 0, 0, 0, 0]);
    want.extend([0xb0; 16]);
    want.extend([0, 0, 0, 2, 0, 0, 0, 5]);
    assert_eq!(b, want);
}

#[test]
fn notices_with_unused_fields_set_are_refused() {
    let mut p = Vec::new();
    Notice::Draining { in_ms: 5 }.encode_payload(&mut p);
    let field = |p: &[u8]| match Notice::decode(p) {
        Err(DecodeError::Invalid { field }) => field,
        other => panic!("{other:?}"),
    };
    let mut bad = p.clone();
    bad[0] = 5;
    assert_eq!(field(&bad), "notice.kind");
    let mut bad = p.clone();
    bad[1] = 1;
    assert_eq!(field(&bad), "notice.outcome");
    let mut bad = p.clone();
    bad[31] = 1;
    assert_eq!(field(&bad), "notice.lease");
    let mut bad = p.clone();
    bad[2] = 1;
    assert_eq!(field(&bad), "reserved");
    let mut p = Vec::new();
    Notice::Revoked { lease: lease(), outcome: Outcome::TornDown }.encode_payload(&mut p);
    p[1] = 9;
    assert_eq!(field(&p), "notice.outcome");
    p[1] = 0;
    p[7] = 1;
    assert_eq!(field(&p), "notice.ms");
}

#[test]
fn drain_tenant_longer_than_a_name_is_refused() {
    let mut p = Vec::new();
    Request::Drain { tenant: "t".repeat(33), notice_ms: 1 }.encode_payload(&mut p);
    assert_eq!(Request::decode(Op::Drain, &p), Err(DecodeError::Invalid { field: "drain.tenant_len" }));
}
