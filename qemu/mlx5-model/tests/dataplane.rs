//! End to end through the model: PD, MKEY (MTT) and an RC QP made by real commands, driven to RTS, then RoCEv2
//! requests over UDP loopback from an encoder written here (ICRC included), answered by
//! `dataplane::poll_udp` over the model's own tables. Covers both revoke orders of ARCHITECTURE.md.

mod common;
mod support_qp;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::Drv;
use mlx5_model::dataplane;
use mlx5_model::mem::Memory;
use mlx5_model::roce::udp::UdpResponder;
use support_qp::*;

const OP_WRITE_ONLY: u8 = 0x0A;
const OP_READ_REQ: u8 = 0x0C;
const OP_READ_RESP_ONLY: u8 = 0x10;
const OP_ACK: u8 = 0x11;

const CLIENT_MAC: [u8; 6] = [0x02, 0xAA, 0, 0, 0, 1];
const MODEL_MAC: [u8; 6] = [0x02, 0xBB, 0, 0, 0, 2];
const CLIENT_IP: [u8; 4] = [192, 168, 7, 1];
const MODEL_IP: [u8; 4] = [192, 168, 7, 2];

/// Bit-at-a-time reflected CRC-32 (zlib's `crc32`).
fn zlib_crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            let lsb = crc & 1;
            crc >>= 1;
            if lsb == 1 {
                crc ^= 0xEDB8_8320;
            }
        }
    }
    !crc
}

/// ICRC over the frame from the IPv4 header to just before the ICRC field.
fn icrc(ip_to_payload_end: &[u8]) -> u32 {
    let mut v = vec![0xFFu8; 8];
    v.extend_from_slice(ip_to_payload_end);
    let ip = 8;
    v[ip + 1] = 0xFF; // TOS
    v[ip + 8] = 0xFF; // TTL
    v[ip + 10] = 0xFF; // checksum
    v[ip + 11] = 0xFF;
    v[ip + 20 + 6] = 0xFF; // UDP checksum
    v[ip + 20 + 7] = 0xFF;
    v[ip + 28 + 4] = 0xFF; // BTH resv8a
    zlib_crc32(&v)
}

fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for i in (0..h.len()).step_by(2) {
        s += ((h[i] as u32) << 8) | h[i + 1] as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xFFFF) + (s >> 16);
    }
    !(s as u16)
}

struct Req {
    opcode: u8,
    qpn: u32,
    psn: u32,
    ack_req: bool,
    reth: Option<(u64, u32, u32)>,
    payload: Vec<u8>,
}

fn encode(r: &Req) -> Vec<u8> {
    let mut roce = Vec::new();
    let pad = (4 - r.payload.len() % 4) % 4;
    roce.push(r.opcode);
    roce.push((pad as u8) << 4);
    roce.extend_from_slice(&[0xFF, 0xFF]);
    roce.push(0x00);
    roce.extend_from_slice(&r.qpn.to_be_bytes()[1..]);
    roce.push(if r.ack_req { 0x80 } else { 0 });
    roce.extend_from_slice(&r.psn.to_be_bytes()[1..]);
    if let Some((va, rkey, len)) = r.reth {
        roce.extend_from_slice(&va.to_be_bytes());
        roce.extend_from_slice(&rkey.to_be_bytes());
        roce.extend_from_slice(&len.to_be_bytes());
    }
    roce.extend_from_slice(&r.payload);
    roce.extend(std::iter::repeat_n(0, pad));
    let udp_len = 8 + roce.len() + 4;
    let ip_len = 20 + udp_len;
    let mut ip = vec![0x45, 0x02 /* ECT(0), masked by the ICRC */, (ip_len >> 8) as u8, ip_len as u8];
    ip.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 17 /* TTL */, 17 /* UDP */, 0, 0]);
    ip.extend_from_slice(&CLIENT_IP);
    ip.extend_from_slice(&MODEL_IP);
    let c = ip_checksum(&ip);
    ip[10] = (c >> 8) as u8;
    ip[11] = c as u8;
    let mut body = ip;
    body.extend_from_slice(&51234u16.to_be_bytes());
    body.extend_from_slice(&4791u16.to_be_bytes());
    body.extend_from_slice(&(udp_len as u16).to_be_bytes());
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&roce);
    let crc = icrc(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&MODEL_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&body);
    f
}

#[derive(Debug, PartialEq)]
struct Reply {
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    syndrome: Option<u8>,
    payload: Vec<u8>,
}

/// Decodes a reply, checking the IPv4 checksum, UDP length and ICRC.
fn decode(f: &[u8]) -> Reply {
    assert_eq!(&f[0..6], &CLIENT_MAC);
    let ip = &f[14..];
    assert_eq!(ip_checksum(&ip[..20]), 0, "IPv4 header checksum");
    let udp = &ip[20..];
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, udp.len());
    let n = ip.len();
    assert_eq!(u32::from_le_bytes(ip[n - 4..].try_into().unwrap()), icrc(&ip[..n - 4]), "ICRC");
    let bth = &udp[8..];
    let pad = ((bth[1] >> 4) & 3) as usize;
    let mut at = 12;
    let mut syndrome = None;
    if matches!(bth[0], OP_ACK | OP_READ_RESP_ONLY) {
        syndrome = Some(bth[at]);
        at += 4;
    }
    Reply {
        opcode: bth[0],
        dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
        psn: u32::from_be_bytes([0, bth[9], bth[10], bth[11]]),
        syndrome,
        payload: bth[at..bth.len() - 4 - pad].to_vec(),
    }
}

const ACK_OK: u8 = 0x1f;
const NAK_REM_ACCESS: u8 = 0x62;
const REMOTE_QPN: u32 = 0x77;
const VA: u64 = 0x7000_0000;
/// The MKEY's two MTT pages (not contiguous).
const PAGES: [u64; 2] = [0x30_0000, 0x35_0000];

struct Rig {
    d: Drv,
    udp: UdpResponder,
    client: UdpSocket,
    r: Res,
}

impl Rig {
    fn new() -> Rig {
        let mut d = Drv::new();
        d.bring_up();
        let r = setup(&mut d);
        let udp = UdpResponder::bind("127.0.0.1:0", Duration::from_millis(1)).unwrap();
        udp.set_nonblocking(true).unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.connect(udp.local_addr().unwrap()).unwrap();
        client.set_nonblocking(true).unwrap();
        Rig { d, udp, client, r }
    }

    /// An RC QP at RTS expecting PSN 0x100 from REMOTE_QPN.
    fn rts_qp(&mut self) -> u32 {
        let (d, r) = (&mut self.d, self.r);
        let q = create_qp(d, r);
        d.ok(&rst2init_in(q, r), 16);
        d.ok(&init2rtr_in(q, r, REMOTE_QPN, 0x100), 16);
        d.ok(&rtr2rts_in(q, r, 0x500), 16);
        q
    }

    /// Sends one request and polls the model (commands and UDP) for up to `wait`, collecting replies.
    fn send(&mut self, r: &Req, wait: Duration) -> Vec<Reply> {
        self.client.send(&encode(r)).unwrap();
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 9216];
        while Instant::now() < end {
            self.d.model.poll();
            dataplane::poll_udp(&mut self.d.model, &mut self.udp).unwrap();
            while let Ok(n) = self.client.recv(&mut buf) {
                got.push(decode(&buf[..n]));
            }
            if !got.is_empty() {
                // Give a multi-packet answer a moment to finish, then stop.
                std::thread::sleep(Duration::from_millis(5));
                while let Ok(n) = self.client.recv(&mut buf) {
                    got.push(decode(&buf[..n]));
                }
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        got
    }
}

fn write_only(qpn: u32, psn: u32, rkey: u32, va: u64, data: &[u8]) -> Req {
    Req {
        opcode: OP_WRITE_ONLY,
        qpn,
        psn,
        ack_req: true,
        reth: Some((va, rkey, data.len() as u32)),
        payload: data.to_vec(),
    }
}

fn read_req(qpn: u32, psn: u32, rkey: u32, va: u64, len: u32) -> Req {
    Req { opcode: OP_READ_REQ, qpn, psn, ack_req: true, reth: Some((va, rkey, len)), payload: Vec::new() }
}

const WAIT: Duration = Duration::from_secs(2);

#[test]
fn write_and_read_back_then_mkey_first_revoke_naks() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    // 64 bytes straddling the MTT page boundary: 32 land at the end of page 0, 32 at the start of page 1.
    let data: Vec<u8> = (0..64u8).collect();
    let got = r.send(&write_only(q, 0x100, key, VA + 0x1000 - 32, &data), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome, got[0].psn, got[0].dest_qp), (OP_ACK, Some(ACK_OK), 0x100, REMOTE_QPN));
    let mut a = [0u8; 32];
    r.d.ram.read(PAGES[0] + 0x1000 - 32, &mut a).unwrap();
    assert_eq!(&a[..], &data[..32]);
    r.d.ram.read(PAGES[1], &mut a).unwrap();
    assert_eq!(&a[..], &data[32..]);

    let got = r.send(&read_req(q, 0x101, key, VA + 0x1000 - 32, 64), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome), (OP_READ_RESP_ONLY, Some(ACK_OK)));
    assert_eq!(got[0].payload, data);
    // The responder's PSN reached the QP context.
    assert_eq!(getf(&query_qp(&mut r.d, q), bit::NEXT_RCV_PSN, 24), 0x102);

    // MKEY first, QP left in RTS: the next request is NAKed (remote access error) within one round trip,
    // then the QP is in ERR and its WQ_ACCESS_ERROR event went to the EQ side (no EQ here to receive it).
    destroy_mkey(&mut r.d, key);
    let got = r.send(&write_only(q, 0x102, key, VA, &data), WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].opcode, got[0].syndrome, got[0].psn), (OP_ACK, Some(NAK_REM_ACCESS), 0x102));
    assert_eq!(qp_state(&mut r.d, q), 6);
    assert!(r.d.model.hca_mut().qps.take_events().is_empty(), "forwarded by poll_udp");
    // From then on: silence.
    assert!(r.send(&write_only(q, 0x103, key, VA, &data), Duration::from_millis(200)).is_empty());
}

#[test]
fn qp_first_revoke_is_silent_and_2rst_resets_the_responder() {
    let mut r = Rig::new();
    let key = create_mkey_mtt(&mut r.d, r.r.pd, VA, 0x2000, &PAGES);
    let q = r.rts_qp();
    let data = vec![0xabu8; 16];
    assert_eq!(r.send(&write_only(q, 0x100, key, VA, &data), WAIT).len(), 1);
    r.d.ok(&short_in(QP_2ERR, q), 16);
    assert!(r.send(&write_only(q, 0x101, key, VA + 16, &data), Duration::from_millis(200)).is_empty());
    let mut a = [0u8; 16];
    r.d.ram.read(PAGES[0] + 16, &mut a).unwrap();
    assert_eq!(a, [0u8; 16], "nothing written while in ERR");
    // A driver-requested 2ERR raises no async event.
    assert!(r.d.model.hca_mut().qps.take_events().is_empty());
    // 2RST and back to RTS: the responder starts over from the new next_rcv_psn.
    r.d.ok(&short_in(QP_2RST, q), 16);
    r.d.ok(&rst2init_in(q, r.r), 16);
    r.d.ok(&init2rtr_in(q, r.r, REMOTE_QPN, 0x10), 16);
    r.d.ok(&rtr2rts_in(q, r.r, 0), 16);
    let got = r.send(&write_only(q, 0x10, key, VA + 16, &data), WAIT);
    assert_eq!((got[0].syndrome, got[0].psn), (Some(ACK_OK), 0x10));
    // Destroyed QP: silence.
    r.d.ok(&short_in(DESTROY_QP, q), 16);
    assert!(r.send(&write_only(q, 0x11, key, VA, &data), Duration::from_millis(200)).is_empty());
}
