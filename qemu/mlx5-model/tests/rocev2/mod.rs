//! The tests' own RoCEv2 encoder and decoder (IBTA BTH/RETH/AETH, RoCEv2 annex A17 ICRC), written independently
//! of the model's `roce::wire`, shared by the responder tests and the end-to-end dataplane tests.
#![allow(dead_code)]

// ---------------------------------------------------------------------------------------------------------
// Independent encoder / decoder (IBTA BTH/RETH/AETH, RoCEv2 annex A17 ICRC).

pub const OP_WRITE_FIRST: u8 = 0x06;
pub const OP_WRITE_MIDDLE: u8 = 0x07;
pub const OP_WRITE_LAST: u8 = 0x08;
pub const OP_WRITE_ONLY: u8 = 0x0A;
pub const OP_READ_REQ: u8 = 0x0C;
pub const OP_READ_RESP_FIRST: u8 = 0x0D;
pub const OP_READ_RESP_MIDDLE: u8 = 0x0E;
pub const OP_READ_RESP_LAST: u8 = 0x0F;
pub const OP_READ_RESP_ONLY: u8 = 0x10;
pub const OP_ACK: u8 = 0x11;

pub const CLIENT_MAC: [u8; 6] = [0x02, 0xAA, 0, 0, 0, 1];
/// The model's default port MAC (`ModelConfig::default`), which its GID entries carry.
pub const MODEL_MAC: [u8; 6] = [0x02, 0x4C, 0x42, 0, 0, 1];
pub const CLIENT_IP: [u8; 4] = [192, 168, 7, 1];
pub const MODEL_IP: [u8; 4] = [192, 168, 7, 2];

/// Bit-at-a-time reflected CRC-32 (zlib's `crc32`).
pub fn zlib_crc32(data: &[u8]) -> u32 {
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
pub fn icrc(ip_to_payload_end: &[u8]) -> u32 {
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

pub fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for i in (0..h.len()).step_by(2) {
        s += ((h[i] as u32) << 8) | h[i + 1] as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xFFFF) + (s >> 16);
    }
    !(s as u16)
}

pub struct Req {
    pub opcode: u8,
    pub qpn: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub reth: Option<(u64, u32, u32)>,
    pub payload: Vec<u8>,
}

pub fn encode(r: &Req) -> Vec<u8> {
    encode_from(r, CLIENT_MAC, CLIENT_IP)
}

/// [`encode`] from another station's MAC and IPv4 (still to the model's).
pub fn encode_from(r: &Req, mac: [u8; 6], ip_src: [u8; 4]) -> Vec<u8> {
    encode_addr(r, mac, ip_src, MODEL_MAC, MODEL_IP)
}

/// [`encode`] from the client to another MAC / IPv4 destination.
pub fn encode_to(r: &Req, eth_dst: [u8; 6], ip_dst: [u8; 4]) -> Vec<u8> {
    encode_addr(r, CLIENT_MAC, CLIENT_IP, eth_dst, ip_dst)
}

fn encode_addr(r: &Req, mac: [u8; 6], ip_src: [u8; 4], eth_dst: [u8; 6], ip_dst: [u8; 4]) -> Vec<u8> {
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
    ip.extend_from_slice(&ip_src);
    ip.extend_from_slice(&ip_dst);
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
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&body);
    f
}

#[derive(Debug, PartialEq)]
pub struct Reply {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    pub syndrome: Option<u8>,
    pub msn: Option<u32>,
    pub payload: Vec<u8>,
}

/// Decodes a reply and checks everything a real requester would: addresses, IPv4 checksum, UDP, ICRC.
pub fn decode(f: &[u8]) -> Reply {
    assert_eq!(&f[0..6], &CLIENT_MAC);
    assert_eq!(&f[6..12], &MODEL_MAC);
    assert_eq!(&f[12..14], &[0x08, 0x00]);
    let ip = &f[14..];
    assert_eq!(ip[0], 0x45);
    let ip_len = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    assert_eq!(ip_len, ip.len());
    assert_eq!(ip_checksum(&ip[..20]), 0, "IPv4 header checksum");
    assert_eq!(ip[9], 17);
    assert_eq!(&ip[12..16], &MODEL_IP);
    assert_eq!(&ip[16..20], &CLIENT_IP);
    let udp = &ip[20..];
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 4791);
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, udp.len());
    let n = ip.len();
    let got = u32::from_le_bytes(ip[n - 4..].try_into().unwrap());
    assert_eq!(got, icrc(&ip[..n - 4]), "ICRC");
    let bth = &udp[8..];
    let opcode = bth[0];
    let pad = ((bth[1] >> 4) & 3) as usize;
    assert_eq!(bth[1] & 0x0F, 0, "TVer");
    assert_eq!(&bth[2..4], &[0xFF, 0xFF]);
    let dest_qp = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
    let psn = u32::from_be_bytes([0, bth[9], bth[10], bth[11]]);
    let mut at = 12;
    let (mut syndrome, mut msn) = (None, None);
    if matches!(opcode, OP_ACK | OP_READ_RESP_FIRST | OP_READ_RESP_LAST | OP_READ_RESP_ONLY) {
        syndrome = Some(bth[at]);
        msn = Some(u32::from_be_bytes([0, bth[at + 1], bth[at + 2], bth[at + 3]]));
        at += 4;
    }
    let end = bth.len() - 4 - pad;
    Reply { opcode, dest_qp, psn, syndrome, msn, payload: bth[at..end].to_vec() }
}
