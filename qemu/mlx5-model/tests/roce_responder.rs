//! The RC responder against requests from an encoder written here (not `roce::wire`), over a fake HCA table
//! backed by `VecMemory`. Replies are decoded by this file's own parser, ICRC included.

use std::collections::HashMap;

use mlx5_model::mem::{Memory, VecMemory};
use mlx5_model::roce::responder::{
    self, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, MkeyView, QpEvent, QpState, QpView, ReplyPath,
    RespState, Tables, Translation,
};
use mlx5_model::roce::wire::Endpoints;

mod rocev2;
use rocev2::*;

// ---------------------------------------------------------------------------------------------------------
// Fake HCA tables.

const QPN: u32 = 0x4A;
const REMOTE_QPN: u32 = 0x77;
const PD: u32 = 3;
const MKEY_INDEX: u32 = 0x12;
const MKEY_VARIANT: u32 = 0x5C;
const RKEY: u32 = MKEY_INDEX << 8 | MKEY_VARIANT;
const VA: u64 = 0x7F00_0000_1000;
const LEN: u64 = 0x4000;
const RAM_BASE: u64 = 0x10_0000;
const ACK_OK: u8 = 0x1F;
const NAK_PSN_SEQ: u8 = 0x60;
const NAK_INV_REQ: u8 = 0x61;
const NAK_REM_ACCESS: u8 = 0x62;
/// The QP's address path: to the client, from the model's GID, UDP source port 0xC0DE, TOS 0x68, TTL 9.
const PATH: ReplyPath = ReplyPath {
    endpoints: Endpoints {
        eth_src: MODEL_MAC,
        eth_dst: CLIENT_MAC,
        ip_src: MODEL_IP,
        ip_dst: CLIENT_IP,
        udp_sport: 0xC0DE,
    },
    tos: 0x68,
    ttl: 9,
};

struct Hca {
    qps: HashMap<u32, (QpView, RespState)>,
    mkeys: HashMap<u32, MkeyView>,
    ram: VecMemory,
    events: Vec<(u32, QpEvent)>,
}

impl Tables for Hca {
    fn accepts(&self, eth_dst: [u8; 6], ip_dst: [u8; 4]) -> bool {
        (eth_dst, ip_dst) == (MODEL_MAC, MODEL_IP)
    }
    fn qp(&self, qpn: u32) -> Option<QpView> {
        self.qps.get(&qpn).map(|q| q.0)
    }
    fn resp_state(&mut self, qpn: u32) -> Option<&mut RespState> {
        self.qps.get_mut(&qpn).map(|q| &mut q.1)
    }
    fn mkey(&self, index: u32) -> Option<MkeyView> {
        self.mkeys.get(&index).cloned()
    }
    fn set_qp_psn(&mut self, qpn: u32, next_expected: u32) {
        self.qps.get_mut(&qpn).unwrap().0.expected_psn = next_expected;
    }
    fn qp_error(&mut self, qpn: u32, event: QpEvent) {
        self.qps.get_mut(&qpn).unwrap().0.state = QpState::Err;
        self.events.push((qpn, event));
    }
    fn ram(&self) -> &dyn Memory {
        &self.ram
    }
}

fn hca(mtu: u32, epsn: u32) -> Hca {
    let qp = QpView {
        qpn: QPN,
        state: QpState::Rts,
        pd: PD,
        remote_qpn: REMOTE_QPN,
        expected_psn: epsn,
        access: ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE,
        mtu,
        path: Some(PATH),
    };
    let mkey = MkeyView {
        key: RKEY,
        pd: PD,
        start: VA,
        len: LEN,
        access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE,
        translation: Translation::Contiguous { base: RAM_BASE },
    };
    Hca {
        qps: HashMap::from([(QPN, (qp, RespState::default()))]),
        mkeys: HashMap::from([(MKEY_INDEX, mkey)]),
        ram: VecMemory::new(2 << 20),
        events: Vec::new(),
    }
}

impl Hca {
    fn state(&self) -> QpState {
        self.qps[&QPN].0.state
    }
    fn epsn(&self) -> u32 {
        self.qps[&QPN].0.expected_psn
    }
    fn ram_at(&self, addr: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.ram.read(addr, &mut b).unwrap();
        b
    }
    fn send(&mut self, r: Req) -> Vec<Reply> {
        responder::handle(self, &encode(&r)).iter().map(|f| decode(f)).collect()
    }
}

fn write_only(psn: u32, rkey: u32, va: u64, data: &[u8]) -> Req {
    Req {
        opcode: OP_WRITE_ONLY,
        qpn: QPN,
        psn,
        ack_req: true,
        reth: Some((va, rkey, data.len() as u32)),
        payload: data.to_vec(),
    }
}

fn read_req(psn: u32, rkey: u32, va: u64, len: u32) -> Req {
    Req { opcode: OP_READ_REQ, qpn: QPN, psn, ack_req: true, reth: Some((va, rkey, len)), payload: Vec::new() }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn ack(psn: u32, syndrome: u8, msn: u32) -> Reply {
    Reply { opcode: OP_ACK, dest_qp: REMOTE_QPN, psn, syndrome: Some(syndrome), msn: Some(msn), payload: Vec::new() }
}

// ---------------------------------------------------------------------------------------------------------

#[test]
fn write_only_then_read_back() {
    let mut h = hca(1024, 100);
    let data = b"lease 7 says hello"; // 18 bytes: PadCnt 2 on the wire
    assert_eq!(h.send(write_only(100, RKEY, VA + 0x10, data)), vec![ack(100, ACK_OK, 1)]);
    assert_eq!(h.ram_at(RAM_BASE + 0x10, data.len()), data);
    assert_eq!(h.epsn(), 101);

    let r = h.send(read_req(101, RKEY, VA + 0x10, data.len() as u32));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].opcode, OP_READ_RESP_ONLY);
    assert_eq!((r[0].psn, r[0].syndrome, r[0].msn), (101, Some(ACK_OK), Some(2)));
    assert_eq!(r[0].payload, data);
    assert_eq!(h.epsn(), 102);
    assert!(h.events.is_empty());
}

#[test]
fn multi_packet_write_first_middle_last_through_a_page_list() {
    let mut h = hca(256, 0x00FF_FFFE); // PSNs wrap at 2^24 in the middle of the message
    // Pages deliberately out of order in RAM; the MKEY starts 0x80 into its first page.
    h.mkeys.get_mut(&MKEY_INDEX).unwrap().translation =
        Translation::Pages { log_page_size: 12, pages: vec![0x3000, 0x8000, 0x5000, 0x9000, 0x1000] };
    h.mkeys.get_mut(&MKEY_INDEX).unwrap().start = VA + 0x80;
    let va = VA + 0x80 + 0xF00; // 0xF80 into page 0: the message crosses into page 1
    let data = pattern(256 * 2 + 100, 9);
    let first = Req {
        opcode: OP_WRITE_FIRST,
        qpn: QPN,
        psn: 0x00FF_FFFE,
        ack_req: false,
        reth: Some((va, RKEY, data.len() as u32)),
        payload: data[..256].to_vec(),
    };
    assert_eq!(h.send(first), vec![]);
    let middle = Req {
        opcode: OP_WRITE_MIDDLE,
        qpn: QPN,
        psn: 0x00FF_FFFF,
        ack_req: true,
        reth: None,
        payload: data[256..512].to_vec(),
    };
    assert_eq!(h.send(middle), vec![ack(0x00FF_FFFF, ACK_OK, 0)]);
    let last =
        Req { opcode: OP_WRITE_LAST, qpn: QPN, psn: 0, ack_req: true, reth: None, payload: data[512..].to_vec() };
    assert_eq!(h.send(last), vec![ack(0, ACK_OK, 1)]);
    assert_eq!(h.epsn(), 1);
    // The message starts 0x80 + 0xF00 = 0xF80 into page 0 (0x3000): its first 0x80 bytes land at 0x3F80, the rest
    // in page 1 (0x8000).
    assert_eq!(h.ram_at(0x3F80, 0x80), &data[..0x80]);
    assert_eq!(h.ram_at(0x8000, data.len() - 0x80), &data[0x80..]);
}

#[test]
fn read_response_is_split_by_mtu() {
    let mut h = hca(256, 500);
    let data = pattern(700, 1);
    h.ram.write(RAM_BASE + 0x200, &data).unwrap();
    let r = h.send(read_req(500, RKEY, VA + 0x200, 700));
    let shape: Vec<_> = r.iter().map(|p| (p.opcode, p.psn, p.syndrome, p.msn, p.payload.len())).collect();
    assert_eq!(
        shape,
        vec![
            (OP_READ_RESP_FIRST, 500, Some(ACK_OK), Some(1), 256),
            (OP_READ_RESP_MIDDLE, 501, None, None, 256),
            (OP_READ_RESP_LAST, 502, Some(ACK_OK), Some(1), 188),
        ]
    );
    assert!(r.iter().all(|p| p.dest_qp == REMOTE_QPN));
    let joined: Vec<u8> = r.iter().flat_map(|p| p.payload.clone()).collect();
    assert_eq!(joined, data);
    // The READ consumed three PSNs: the next request is 503.
    assert_eq!(h.epsn(), 503);
    assert_eq!(h.send(write_only(503, RKEY, VA, b"next")), vec![ack(503, ACK_OK, 2)]);

    // A duplicate of the READ (the requester lost the responses) is answered again from its own PSN.
    let again = h.send(read_req(500, RKEY, VA + 0x200, 700));
    assert_eq!(again.len(), 3);
    assert_eq!((again[0].psn, again[0].msn), (500, Some(1)));
    assert_eq!(again.iter().flat_map(|p| p.payload.clone()).collect::<Vec<u8>>(), data);
    assert_eq!(h.epsn(), 504);
}

#[test]
fn bad_rkey_variant_naks_then_qp_is_in_err_and_silent() {
    let mut h = hca(1024, 10);
    let wrong = MKEY_INDEX << 8 | (MKEY_VARIANT ^ 1);
    assert_eq!(h.send(write_only(10, wrong, VA, b"nope")), vec![ack(10, NAK_REM_ACCESS, 0)]);
    assert_eq!(h.ram_at(RAM_BASE, 4), [0; 4]);
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.events, vec![(QPN, QpEvent::WqAccessError)]);
    assert_eq!(QpEvent::WqAccessError as u8, 0x11);
    // Further requests, even good ones, get nothing back.
    assert_eq!(h.send(write_only(10, RKEY, VA, b"good")), vec![]);
    assert_eq!(h.send(read_req(11, RKEY, VA, 4)), vec![]);
    assert_eq!(h.ram_at(RAM_BASE, 4), [0; 4]);
}

#[test]
fn nonexistent_mkey_index_naks_remote_access_error() {
    let mut h = hca(1024, 10);
    assert_eq!(h.send(read_req(10, 0x77 << 8 | MKEY_VARIANT, VA, 8)), vec![ack(10, NAK_REM_ACCESS, 0)]);
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn mkey_first_revoke_naks_remote_access_error() {
    let mut h = hca(1024, 1);
    assert_eq!(h.send(write_only(1, RKEY, VA, b"before")), vec![ack(1, ACK_OK, 1)]);
    // Revoke, MKEY first: DESTROY_MKEY while the QP stays in RTS.
    h.mkeys.remove(&MKEY_INDEX);
    assert_eq!(h.state(), QpState::Rts);
    assert_eq!(h.send(write_only(2, RKEY, VA, b"after!")), vec![ack(2, NAK_REM_ACCESS, 1)]);
    assert_eq!(h.ram_at(RAM_BASE, 6), b"before");
    assert_eq!(h.state(), QpState::Err);
    assert_eq!(h.events, vec![(QPN, QpEvent::WqAccessError)]);
}

#[test]
fn mkey_destroyed_mid_message_naks_the_next_packet() {
    let mut h = hca(256, 0);
    let data = pattern(512, 3);
    let first = Req {
        opcode: OP_WRITE_FIRST,
        qpn: QPN,
        psn: 0,
        ack_req: false,
        reth: Some((VA, RKEY, 512)),
        payload: data[..256].to_vec(),
    };
    assert_eq!(h.send(first), vec![]);
    h.mkeys.remove(&MKEY_INDEX);
    let last =
        Req { opcode: OP_WRITE_LAST, qpn: QPN, psn: 1, ack_req: true, reth: None, payload: data[256..].to_vec() };
    assert_eq!(h.send(last), vec![ack(1, NAK_REM_ACCESS, 0)]);
    assert_eq!(h.ram_at(RAM_BASE + 256, 256), vec![0; 256]);
}

#[test]
fn qp_first_revoke_and_non_receiving_qps_are_silent() {
    for state in [QpState::Err, QpState::Reset, QpState::Init] {
        let mut h = hca(1024, 1);
        h.qps.get_mut(&QPN).unwrap().0.state = state;
        assert_eq!(h.send(write_only(1, RKEY, VA, b"x")), vec![], "{state:?}");
        assert_eq!(h.send(read_req(1, RKEY, VA, 8)), vec![], "{state:?}");
        assert_eq!(h.ram_at(RAM_BASE, 1), [0]);
        assert_eq!(h.epsn(), 1);
        assert!(h.events.is_empty());
    }
    // A destroyed QP as well.
    let mut h = hca(1024, 1);
    h.qps.clear();
    assert_eq!(h.send(write_only(1, RKEY, VA, b"x")), vec![]);
    // RTR already receives.
    let mut h = hca(1024, 1);
    h.qps.get_mut(&QPN).unwrap().0.state = QpState::Rtr;
    assert_eq!(h.send(write_only(1, RKEY, VA, b"x")), vec![ack(1, ACK_OK, 1)]);
}

#[test]
fn pd_mismatch_naks_remote_access_error() {
    let mut h = hca(1024, 1);
    h.mkeys.get_mut(&MKEY_INDEX).unwrap().pd = PD + 1;
    assert_eq!(h.send(read_req(1, RKEY, VA, 16)), vec![ack(1, NAK_REM_ACCESS, 0)]);
    assert_eq!(h.state(), QpState::Err);
}

#[test]
fn out_of_bounds_naks_remote_access_error() {
    for (va, len) in [(VA + LEN - 4, 8u32), (VA - 1, 4), (u64::MAX - 2, 8)] {
        let mut h = hca(4096, 1);
        assert_eq!(h.send(read_req(1, RKEY, va, len)), vec![ack(1, NAK_REM_ACCESS, 0)], "{va:#x}+{len}");
        assert_eq!(h.state(), QpState::Err);
    }
    // Exactly the last bytes are fine.
    let mut h = hca(4096, 1);
    assert_eq!(h.send(write_only(1, RKEY, VA + LEN - 4, b"tail")), vec![ack(1, ACK_OK, 1)]);
    assert_eq!(h.ram_at(RAM_BASE + LEN - 4, 4), b"tail");
}

#[test]
fn missing_access_flags() {
    // MKEY without remote write: remote access error.
    let mut h = hca(1024, 1);
    h.mkeys.get_mut(&MKEY_INDEX).unwrap().access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ;
    assert_eq!(h.send(write_only(1, RKEY, VA, b"w")), vec![ack(1, NAK_REM_ACCESS, 0)]);
    // MKEY without remote read.
    let mut h = hca(1024, 1);
    h.mkeys.get_mut(&MKEY_INDEX).unwrap().access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;
    assert_eq!(h.send(read_req(1, RKEY, VA, 4)), vec![ack(1, NAK_REM_ACCESS, 0)]);
    // QP without remote write enabled: invalid request (rxe check_op_valid), QP to ERR.
    let mut h = hca(1024, 1);
    h.qps.get_mut(&QPN).unwrap().0.access = ACCESS_REMOTE_READ;
    assert_eq!(h.send(write_only(1, RKEY, VA, b"w")), vec![ack(1, NAK_INV_REQ, 0)]);
    assert_eq!(h.events, vec![(QPN, QpEvent::WqInvalReqError)]);
}

#[test]
fn invalid_requests() {
    // MIDDLE without FIRST.
    let mut h = hca(256, 1);
    let mid = Req { opcode: OP_WRITE_MIDDLE, qpn: QPN, psn: 1, ack_req: true, reth: None, payload: vec![0; 256] };
    assert_eq!(h.send(mid), vec![ack(1, NAK_INV_REQ, 0)]);
    assert_eq!(h.state(), QpState::Err);
    // WRITE ONLY longer than the MTU.
    let mut h = hca(256, 1);
    assert_eq!(h.send(write_only(1, RKEY, VA, &[1; 300])), vec![ack(1, NAK_INV_REQ, 0)]);
    // SEND: the model has no receive queue.
    let mut h = hca(256, 1);
    let send = Req { opcode: 0x04, qpn: QPN, psn: 1, ack_req: true, reth: None, payload: vec![1; 8] };
    assert_eq!(h.send(send), vec![ack(1, NAK_INV_REQ, 0)]);
}

#[test]
fn psn_sequence_error_naks_once_then_recovers() {
    let mut h = hca(1024, 40);
    // 42 arrives while 40 is expected: NAK carrying the expected PSN; the QP stays usable (class B).
    assert_eq!(h.send(write_only(42, RKEY, VA, b"ahead")), vec![ack(40, NAK_PSN_SEQ, 0)]);
    assert_eq!(h.ram_at(RAM_BASE, 5), [0; 5]);
    // One NAK per sequence error: the next out-of-order packet is dropped.
    assert_eq!(h.send(write_only(43, RKEY, VA, b"ahead")), vec![]);
    assert_eq!(h.state(), QpState::Rts);
    assert!(h.events.is_empty());
    // The requester resends from 40.
    assert_eq!(h.send(write_only(40, RKEY, VA, b"fine!")), vec![ack(40, ACK_OK, 1)]);
    assert_eq!(h.ram_at(RAM_BASE, 5), b"fine!");
    assert_eq!(h.epsn(), 41);
}

#[test]
fn duplicate_write_is_reacked_without_rewriting() {
    let mut h = hca(1024, 7);
    assert_eq!(h.send(write_only(7, RKEY, VA, b"first")), vec![ack(7, ACK_OK, 1)]);
    assert_eq!(h.send(write_only(8, RKEY, VA + 8, b"second")), vec![ack(8, ACK_OK, 2)]);
    // The requester missed the ACKs and retransmits PSN 7 (with other bytes, to see that nothing is written).
    assert_eq!(h.send(write_only(7, RKEY, VA, b"XXXXX")), vec![ack(8, ACK_OK, 2)]);
    assert_eq!(h.ram_at(RAM_BASE, 5), b"first");
    assert_eq!(h.epsn(), 9);
}

#[test]
fn corrupted_frames_are_dropped() {
    let mut h = hca(1024, 1);
    let mut f = encode(&write_only(1, RKEY, VA, b"data"));
    let n = f.len();
    f[n - 6] ^= 0x40; // a payload byte: ICRC no longer matches
    assert!(responder::handle(&mut h, &f).is_empty());
    assert_eq!(h.ram_at(RAM_BASE, 4), [0; 4]);
    for cut in [0, 13, 30, 50, n - 1] {
        assert!(responder::handle(&mut h, &f[..cut]).is_empty());
    }
    assert_eq!(h.epsn(), 1);
    // The TTL is outside the ICRC: a router may change it (with the IPv4 checksum).
    let mut g = encode(&write_only(1, RKEY, VA, b"data"));
    g[14 + 8] = 3;
    g[14 + 10] = 0;
    g[14 + 11] = 0;
    let c = ip_checksum(&g[14..34]);
    g[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    assert_eq!(responder::handle(&mut h, &g).len(), 1);
}

#[test]
fn udp_cable_answers_the_source_and_records_a_pcap() {
    use mlx5_model::roce::udp::UdpResponder;
    use std::net::UdpSocket;
    use std::time::Duration;

    let pcap = std::env::temp_dir().join(format!("roce-cable-{}.pcap", std::process::id()));
    let mut model = UdpResponder::bind("127.0.0.1:0", Duration::from_millis(50)).unwrap().with_pcap(&pcap).unwrap();
    let to = model.local_addr().unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = hca(1024, 1);
    assert_eq!(model.poll(&mut h).unwrap(), None, "nothing sent yet");
    client.send_to(&encode(&write_only(1, RKEY, VA, b"over the cable")), to).unwrap();
    let mut handled = None;
    for _ in 0..100 {
        handled = model.poll(&mut h).unwrap();
        if handled.is_some() {
            break;
        }
    }
    assert_eq!(handled, Some(responder::Disposition::Acked));
    let mut buf = [0u8; 2048];
    let (n, from) = client.recv_from(&mut buf).unwrap();
    assert_eq!(from, to);
    assert_eq!(decode(&buf[..n]), ack(1, ACK_OK, 1));
    assert_eq!(h.ram_at(RAM_BASE, 14), b"over the cable");
    drop(model);
    let cap = std::fs::read(&pcap).unwrap();
    std::fs::remove_file(&pcap).ok();
    // Global header, then the request and the reply.
    assert_eq!(u32::from_ne_bytes(cap[0..4].try_into().unwrap()), 0xA1B2_C3D4);
    let first_len = u32::from_ne_bytes(cap[24 + 8..24 + 12].try_into().unwrap()) as usize;
    let second = 24 + 16 + first_len;
    let second_len = u32::from_ne_bytes(cap[second + 8..second + 12].try_into().unwrap()) as usize;
    assert_eq!(cap.len(), second + 16 + second_len);
    assert_eq!(decode(&cap[second + 16..]), ack(1, ACK_OK, 1));
}

#[test]
fn replies_follow_the_qps_address_path_not_the_requests_addresses() {
    let mut h = hca(1024, 100);
    // From a station that is not the QP's peer: the answer still goes to the path's rmac/rgid.
    let stranger_mac = [0x02, 0xCC, 0, 0, 0, 9];
    let frames =
        responder::handle(&mut h, &encode_from(&write_only(100, RKEY, VA, b"abcd"), stranger_mac, [10, 9, 9, 9]));
    assert_eq!(frames.len(), 1);
    let f = &frames[0];
    let r = decode(f); // checks MACs and IPs: to CLIENT_MAC / CLIENT_IP, from MODEL_MAC / MODEL_IP
    assert_eq!((r.opcode, r.syndrome), (OP_ACK, Some(ACK_OK)));
    let ip = &f[14..];
    assert_eq!((ip[1], ip[8]), (0x68, 9), "TOS = tclass, TTL = hop_limit");
    assert_eq!(u16::from_be_bytes([ip[20], ip[21]]), 0xC0DE, "UDP source port = udp_sport");
    // A QP without an IPv4 RoCEv2 path sends nothing (but still executes the request).
    h.qps.get_mut(&QPN).unwrap().0.path = None;
    assert!(h.send(write_only(101, RKEY, VA + 4, b"efgh")).is_empty());
    assert_eq!(h.ram_at(RAM_BASE, 8), b"abcdefgh");
}
