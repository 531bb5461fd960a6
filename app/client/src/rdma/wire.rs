//! RoCEv2 frames on the virtual cable: Ethernet II + IPv4 (IHL 5, DF) + UDP (destination 4791) + BTH + RETH /
//! AETH / ImmDt + payload + pad + ICRC (IBTA Vol. 1 §9.2–9.3 header layouts, RoCEv2 annex A17; RFC 791 and
//! RFC 768). Sans-I/O: [`encode`] builds one frame, [`decode`] checks and splits one. ARP for IPv4 over
//! Ethernet (RFC 826) resolves the appliance's MAC on a cable that is an Ethernet segment: [`encode_arp`] and
//! [`decode_arp`], and [`dst_mac`] / [`ethertype`] to sort frames before either decoder.
//!
//! This codec (and `icrc.rs`) is the verifier's own and shares no code with the device model's
//! (`qemu/mlx5-model/src/roce/`) on purpose: a checker written from the same code as what it checks would
//! repeat its mistakes. The likeness between the two is the cost of an independent oracle.

use core::fmt;
use std::net::Ipv4Addr;

use super::icrc::icrc;

pub const ETH_LEN: usize = 14;
pub const IPV4_LEN: usize = 20;
pub const UDP_LEN: usize = 8;
pub const BTH_LEN: usize = 12;
pub const RETH_LEN: usize = 16;
pub const AETH_LEN: usize = 4;
pub const IMMDT_LEN: usize = 4;
pub const ICRC_LEN: usize = 4;
/// Headers before the BTH.
pub const OUTER_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// The ARP packet for IPv4 over Ethernet (RFC 826): htype, ptype, hlen, plen, oper, sha, spa, tha, tpa.
pub const ARP_LEN: usize = 28;
/// The shortest Ethernet frame without its FCS (IEEE 802.3 `ETH_ZLEN`); [`encode_arp`] pads to it.
pub const ETH_MIN_LEN: usize = 60;
pub const BROADCAST_MAC: [u8; 6] = [0xFF; 6];
pub const ROCEV2_PORT: u16 = 4791;
pub const IPPROTO_UDP: u8 = 17;
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// PSNs are 24 bits wide.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// RC opcodes (BTH OpCode, transport 000).
pub mod opcode {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_WITH_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_WITH_IMM: u8 = 0x05;
    pub const RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RDMA_WRITE_LAST: u8 = 0x08;
    pub const RDMA_WRITE_LAST_WITH_IMM: u8 = 0x09;
    pub const RDMA_WRITE_ONLY: u8 = 0x0A;
    pub const RDMA_WRITE_ONLY_WITH_IMM: u8 = 0x0B;
    pub const RDMA_READ_REQUEST: u8 = 0x0C;
    pub const RDMA_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RDMA_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// Congestion Notification Packet (RoCEv2 annex A17.9.3), outside the RC opcodes: a receiver that saw ECN
    /// CE marks sends it to the flow's sender (BECN set in the BTH byte the ICRC masks). [`super::decode`]
    /// accepts it; the requester ignores it.
    pub const CNP: u8 = 0x81;
}

/// A CNP's reserved bytes between its BTH and its ICRC (RoCEv2 annex A17.9.3).
pub const CNP_LEN: usize = 16;

/// Which extension headers follow the BTH (IBTA Table 38; a CNP has none, its 16 reserved bytes decode as the
/// payload); `None` for opcodes this cable does not carry (atomics, other transports).
fn layout(op: u8) -> Option<(bool, bool, bool)> {
    use opcode::*;
    // (RETH, AETH, ImmDt)
    Some(match op {
        SEND_FIRST | SEND_MIDDLE | SEND_LAST | SEND_ONLY | RDMA_WRITE_MIDDLE | RDMA_WRITE_LAST => (false, false, false),
        SEND_LAST_WITH_IMM | SEND_ONLY_WITH_IMM | RDMA_WRITE_LAST_WITH_IMM => (false, false, true),
        RDMA_WRITE_FIRST | RDMA_WRITE_ONLY | RDMA_READ_REQUEST => (true, false, false),
        RDMA_WRITE_ONLY_WITH_IMM => (true, false, true),
        RDMA_READ_RESPONSE_FIRST | RDMA_READ_RESPONSE_LAST | RDMA_READ_RESPONSE_ONLY | ACKNOWLEDGE => {
            (false, true, false)
        }
        RDMA_READ_RESPONSE_MIDDLE | CNP => (false, false, false),
        _ => return None,
    })
}

/// Base Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub se: bool,
    pub mig: bool,
    /// PadCnt; [`encode`] computes it from the payload length.
    pub pad: u8,
    pub pkey: u16,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl Bth {
    /// An RC BTH with the default P_Key and nothing else set.
    pub fn new(opcode: u8, dest_qp: u32, psn: u32) -> Bth {
        Bth { opcode, se: false, mig: false, pad: 0, pkey: DEFAULT_PKEY, dest_qp, ack_req: false, psn }
    }
}

/// RDMA Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

/// ACK Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    pub syndrome: u8,
    pub msn: u32,
}

/// What an AETH syndrome says (bits 6:5 the kind, 4:0 credits / timer / NAK code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AethKind {
    Ack { credits: u8 },
    RnrNak { timer: u8 },
    Nak(NakCode),
    Reserved,
}

/// NAK codes (IBTA Table 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    PsnSequence,
    InvalidRequest,
    RemoteAccess,
    RemoteOperational,
    InvalidRdRequest,
    Other(u8),
}

impl NakCode {
    pub fn code(self) -> u8 {
        match self {
            NakCode::PsnSequence => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccess => 2,
            NakCode::RemoteOperational => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Other(c) => c,
        }
    }
}

impl Aeth {
    pub fn kind(self) -> AethKind {
        let v = self.syndrome & 0x1F;
        match (self.syndrome >> 5) & 3 {
            0 => AethKind::Ack { credits: v },
            1 => AethKind::RnrNak { timer: v },
            3 => AethKind::Nak(match v {
                0 => NakCode::PsnSequence,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccess,
                3 => NakCode::RemoteOperational,
                4 => NakCode::InvalidRdRequest,
                c => NakCode::Other(c),
            }),
            _ => AethKind::Reserved,
        }
    }

    /// ACK with "unlimited" credits (0x1F), as rxe sends.
    pub fn ack(msn: u32) -> Aeth {
        Aeth { syndrome: 0x1F, msn }
    }

    pub fn nak(code: NakCode, msn: u32) -> Aeth {
        Aeth { syndrome: 0x60 | (code.code() & 0x1F), msn }
    }
}

/// Link and network addressing of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    /// Flow entropy (RoCEv2 lets the sender choose; 0xC000.. by convention).
    pub src_port: u16,
    pub dst_port: u16,
    pub tos: u8,
    pub ttl: u8,
}

impl Addr {
    /// The addressing of a reply: MACs and IPs swapped; UDP ports kept (RoCEv2 sends to 4791 both ways, the
    /// source port is the flow's entropy).
    pub fn reply(&self) -> Addr {
        Addr {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.src_port,
            dst_port: self.dst_port,
            tos: 0,
            ttl: 64,
        }
    }
}

/// One RoCEv2 packet (borrowing its payload, without pad).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub addr: Addr,
    pub bth: Bth,
    pub reth: Option<Reth>,
    pub aeth: Option<Aeth>,
    pub imm: Option<u32>,
    pub payload: &'a [u8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    Short,
    NotIpv4,
    IpHeader,
    IpChecksum,
    Fragment,
    NotUdp,
    UdpLength,
    UdpChecksum,
    NotRoce,
    Tver,
    Opcode(u8),
    Layout,
    Pad,
    Icrc,
    TooLong,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short => f.write_str("frame too short"),
            WireError::NotIpv4 => f.write_str("not IPv4 (EtherType)"),
            WireError::IpHeader => f.write_str("IPv4 version/IHL/length not accepted"),
            WireError::IpChecksum => f.write_str("bad IPv4 header checksum"),
            WireError::Fragment => f.write_str("IPv4 fragment"),
            WireError::NotUdp => f.write_str("not UDP"),
            WireError::UdpLength => f.write_str("UDP length mismatch"),
            WireError::UdpChecksum => f.write_str("bad UDP checksum"),
            WireError::NotRoce => f.write_str("UDP destination port is not 4791"),
            WireError::Tver => f.write_str("BTH TVer is not 0"),
            WireError::Opcode(o) => write!(f, "opcode {o:#04x} not carried"),
            WireError::Layout => f.write_str("packet does not fit its opcode's headers (or a CNP's 16 bytes)"),
            WireError::Pad => f.write_str("PadCnt larger than the payload"),
            WireError::Icrc => f.write_str("bad ICRC"),
            WireError::TooLong => f.write_str("packet longer than an IPv4 datagram"),
        }
    }
}

impl std::error::Error for WireError {}

/// RFC 1071 one's-complement sum, folded (not complemented).
fn ones_sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [b] = chunks.remainder() {
        acc += (*b as u32) << 8;
    }
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    acc
}

/// The IPv4 header checksum of a 20-byte header whose checksum field is zero.
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    !(ones_sum(0, hdr) as u16)
}

fn udp_checksum_ok(ip: &[u8], udp: &[u8]) -> bool {
    let mut acc = ones_sum(0, &ip[12..20]);
    acc = ones_sum(acc, &[0, IPPROTO_UDP]);
    acc = ones_sum(acc, &(udp.len() as u16).to_be_bytes());
    ones_sum(acc, udp) == 0xFFFF
}

/// Builds a whole frame: IPv4 identification 0 with DF (RFC 6864 allows it for atomic datagrams), UDP
/// checksum 0 (permitted for IPv4 and what RoCEv2 senders put there), PadCnt from the payload length, ICRC.
pub fn encode(p: &Packet<'_>, out: &mut Vec<u8>) -> Result<(), WireError> {
    encode_gather(p, &[], out)
}

/// [`encode`] with a payload in pieces: `p.payload` followed by each of `more` (a zero-copy WRITE's packet
/// gathered from the caller's scatter/gather list, `super::sg`), copied once, into the frame.
pub fn encode_gather(p: &Packet<'_>, more: &[&[u8]], out: &mut Vec<u8>) -> Result<(), WireError> {
    let (has_reth, has_aeth, has_imm) = layout(p.bth.opcode).ok_or(WireError::Opcode(p.bth.opcode))?;
    if has_reth != p.reth.is_some() || has_aeth != p.aeth.is_some() || has_imm != p.imm.is_some() {
        return Err(WireError::Layout);
    }
    let payload_len = p.payload.len() + more.iter().map(|m| m.len()).sum::<usize>();
    let pad = (4 - payload_len % 4) % 4;
    let ext = has_reth as usize * RETH_LEN + has_aeth as usize * AETH_LEN + has_imm as usize * IMMDT_LEN;
    let ip_len = IPV4_LEN + UDP_LEN + BTH_LEN + ext + payload_len + pad + ICRC_LEN;
    if ip_len > 0xFFFF {
        return Err(WireError::TooLong);
    }
    out.clear();
    out.reserve(ETH_LEN + ip_len);
    out.extend_from_slice(&p.addr.dst_mac);
    out.extend_from_slice(&p.addr.src_mac);
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip_at = out.len();
    out.extend_from_slice(&[0x45, p.addr.tos]);
    out.extend_from_slice(&(ip_len as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, p.addr.ttl, IPPROTO_UDP, 0, 0]);
    out.extend_from_slice(&p.addr.src_ip.octets());
    out.extend_from_slice(&p.addr.dst_ip.octets());
    let csum = ipv4_checksum(&out[ip_at..ip_at + IPV4_LEN]);
    out[ip_at + 10..ip_at + 12].copy_from_slice(&csum.to_be_bytes());
    out.extend_from_slice(&p.addr.src_port.to_be_bytes());
    out.extend_from_slice(&p.addr.dst_port.to_be_bytes());
    out.extend_from_slice(&((ip_len - IPV4_LEN) as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    let b = &p.bth;
    out.push(b.opcode);
    out.push((b.se as u8) << 7 | (b.mig as u8) << 6 | (pad as u8) << 4);
    out.extend_from_slice(&b.pkey.to_be_bytes());
    out.extend_from_slice(&(b.dest_qp & 0x00FF_FFFF).to_be_bytes());
    out.extend_from_slice(&((b.ack_req as u32) << 31 | (b.psn & PSN_MASK)).to_be_bytes());
    if let Some(r) = p.reth {
        out.extend_from_slice(&r.va.to_be_bytes());
        out.extend_from_slice(&r.rkey.to_be_bytes());
        out.extend_from_slice(&r.len.to_be_bytes());
    }
    if let Some(a) = p.aeth {
        out.extend_from_slice(&((a.syndrome as u32) << 24 | (a.msn & 0x00FF_FFFF)).to_be_bytes());
    }
    if let Some(i) = p.imm {
        out.extend_from_slice(&i.to_be_bytes());
    }
    out.extend_from_slice(p.payload);
    for m in more {
        out.extend_from_slice(m);
    }
    out.extend_from_slice(&[0u8; 3][..pad]);
    let crc = icrc(&out[ip_at..]).ok_or(WireError::Short)?;
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks and splits one frame. Trailing bytes after the IPv4 total length (Ethernet padding) are ignored.
pub fn decode(frame: &[u8]) -> Result<Packet<'_>, WireError> {
    if frame.len() < OUTER_LEN + BTH_LEN + ICRC_LEN {
        return Err(WireError::Short);
    }
    if be16(frame, 12) != ETHERTYPE_IPV4 {
        return Err(WireError::NotIpv4);
    }
    let ip_all = &frame[ETH_LEN..];
    if ip_all[0] != 0x45 {
        return Err(WireError::IpHeader);
    }
    let ip_len = be16(ip_all, 2) as usize;
    if ip_len > ip_all.len() || ip_len < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN {
        return Err(WireError::IpHeader);
    }
    let ip = &ip_all[..ip_len];
    if ones_sum(0, &ip[..IPV4_LEN]) != 0xFFFF {
        return Err(WireError::IpChecksum);
    }
    if be16(ip, 6) & 0x3FFF != 0 {
        return Err(WireError::Fragment);
    }
    if ip[9] != IPPROTO_UDP {
        return Err(WireError::NotUdp);
    }
    let udp = &ip[IPV4_LEN..];
    if be16(udp, 4) as usize != udp.len() {
        return Err(WireError::UdpLength);
    }
    if be16(udp, 6) != 0 && !udp_checksum_ok(ip, udp) {
        return Err(WireError::UdpChecksum);
    }
    if be16(udp, 2) != ROCEV2_PORT {
        return Err(WireError::NotRoce);
    }
    let crc_at = ip.len() - ICRC_LEN;
    let want = u32::from_le_bytes([ip[crc_at], ip[crc_at + 1], ip[crc_at + 2], ip[crc_at + 3]]);
    if icrc(&ip[..crc_at]) != Some(want) {
        return Err(WireError::Icrc);
    }
    let t = &ip[IPV4_LEN + UDP_LEN..crc_at];
    if t[1] & 0x0F != 0 {
        return Err(WireError::Tver);
    }
    let w = be32(t, 8);
    let bth = Bth {
        opcode: t[0],
        se: t[1] & 0x80 != 0,
        mig: t[1] & 0x40 != 0,
        pad: (t[1] >> 4) & 3,
        pkey: be16(t, 2),
        dest_qp: be32(t, 4) & 0x00FF_FFFF,
        ack_req: w & 0x8000_0000 != 0,
        psn: w & PSN_MASK,
    };
    let (has_reth, has_aeth, has_imm) = layout(bth.opcode).ok_or(WireError::Opcode(bth.opcode))?;
    let mut at = BTH_LEN;
    let ext = has_reth as usize * RETH_LEN + has_aeth as usize * AETH_LEN + has_imm as usize * IMMDT_LEN;
    if t.len() < at + ext {
        return Err(WireError::Layout);
    }
    let reth = has_reth.then(|| {
        let r = Reth {
            va: (be32(t, at) as u64) << 32 | be32(t, at + 4) as u64,
            rkey: be32(t, at + 8),
            len: be32(t, at + 12),
        };
        at += RETH_LEN;
        r
    });
    let aeth = has_aeth.then(|| {
        let v = be32(t, at);
        at += AETH_LEN;
        Aeth { syndrome: (v >> 24) as u8, msn: v & 0x00FF_FFFF }
    });
    let imm = has_imm.then(|| {
        let v = be32(t, at);
        at += IMMDT_LEN;
        v
    });
    let body = &t[at..];
    if (bth.pad as usize) > body.len() {
        return Err(WireError::Pad);
    }
    if bth.opcode == opcode::CNP && (body.len() != CNP_LEN || bth.pad != 0) {
        return Err(WireError::Layout);
    }
    let addr = Addr {
        dst_mac: frame[0..6].try_into().unwrap_or_default(),
        src_mac: frame[6..12].try_into().unwrap_or_default(),
        src_ip: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst_ip: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        src_port: be16(udp, 0),
        dst_port: be16(udp, 2),
        tos: ip[1],
        ttl: ip[8],
    };
    Ok(Packet { addr, bth, reth, aeth, imm, payload: &body[..body.len() - bth.pad as usize] })
}

/// ARP's `ar$op` (RFC 826).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpOp {
    Request,
    Reply,
}

impl ArpOp {
    pub fn code(self) -> u16 {
        match self {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
        }
    }
}

/// One ARP packet for IPv4 over Ethernet with its Ethernet addressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    /// The Ethernet header's destination (broadcast for a request, the asker for a reply).
    pub eth_dst: [u8; 6],
    /// The Ethernet header's source.
    pub eth_src: [u8; 6],
    pub op: ArpOp,
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    /// Zero in a request (RFC 826: "don't care"; RFC 5227 §2.1.1 says zero).
    pub target_mac: [u8; 6],
    pub target_ip: Ipv4Addr,
}

impl Arp {
    /// "Who has `target_ip`? Tell `sender_ip`": broadcast, from `mac`.
    pub fn request(mac: [u8; 6], ip: Ipv4Addr, target_ip: Ipv4Addr) -> Arp {
        Arp {
            eth_dst: BROADCAST_MAC,
            eth_src: mac,
            op: ArpOp::Request,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: [0; 6],
            target_ip,
        }
    }

    /// The answer to this request from the owner of `target_ip` at `mac`: sent to the asker.
    pub fn reply_from(&self, mac: [u8; 6]) -> Arp {
        Arp {
            eth_dst: self.sender_mac,
            eth_src: mac,
            op: ArpOp::Reply,
            sender_mac: mac,
            sender_ip: self.target_ip,
            target_mac: self.sender_mac,
            target_ip: self.sender_ip,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpError {
    Short,
    NotArp,
    /// `ar$hrd` is not 1 (Ethernet).
    HardwareType(u16),
    /// `ar$pro` is not 0x0800 (IPv4).
    ProtocolType(u16),
    /// `ar$hln` / `ar$pln` are not 6 / 4.
    AddressLengths(u8, u8),
    /// `ar$op` is neither 1 (request) nor 2 (reply).
    Op(u16),
}

impl fmt::Display for ArpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArpError::Short => f.write_str("ARP frame too short"),
            ArpError::NotArp => f.write_str("not ARP (EtherType)"),
            ArpError::HardwareType(h) => write!(f, "ARP hardware type {h} is not 1 (Ethernet)"),
            ArpError::ProtocolType(p) => write!(f, "ARP protocol type {p:#06x} is not 0x0800 (IPv4)"),
            ArpError::AddressLengths(h, p) => write!(f, "ARP address lengths {h}/{p} are not 6/4"),
            ArpError::Op(o) => write!(f, "ARP operation {o} is neither request (1) nor reply (2)"),
        }
    }
}

impl std::error::Error for ArpError {}

/// Builds an ARP frame, padded with zeros to [`ETH_MIN_LEN`].
pub fn encode_arp(a: &Arp, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&a.eth_dst);
    out.extend_from_slice(&a.eth_src);
    out.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    out.extend_from_slice(&[6, 4]);
    out.extend_from_slice(&a.op.code().to_be_bytes());
    out.extend_from_slice(&a.sender_mac);
    out.extend_from_slice(&a.sender_ip.octets());
    out.extend_from_slice(&a.target_mac);
    out.extend_from_slice(&a.target_ip.octets());
    out.resize(ETH_MIN_LEN, 0);
}

/// Checks and splits an ARP frame: EtherType 0x0806, hardware type 1, protocol type 0x0800, address lengths
/// 6 and 4, operation 1 or 2. Trailing bytes (Ethernet padding) are ignored.
pub fn decode_arp(frame: &[u8]) -> Result<Arp, ArpError> {
    if frame.len() < ETH_LEN + ARP_LEN {
        return Err(ArpError::Short);
    }
    if be16(frame, 12) != ETHERTYPE_ARP {
        return Err(ArpError::NotArp);
    }
    let a = &frame[ETH_LEN..ETH_LEN + ARP_LEN];
    match (be16(a, 0), be16(a, 2), a[4], a[5]) {
        (1, ETHERTYPE_IPV4, 6, 4) => {}
        (1, ETHERTYPE_IPV4, h, p) => return Err(ArpError::AddressLengths(h, p)),
        (1, p, ..) => return Err(ArpError::ProtocolType(p)),
        (h, ..) => return Err(ArpError::HardwareType(h)),
    }
    let op = match be16(a, 6) {
        1 => ArpOp::Request,
        2 => ArpOp::Reply,
        o => return Err(ArpError::Op(o)),
    };
    let mac = |at: usize| -> [u8; 6] { [a[at], a[at + 1], a[at + 2], a[at + 3], a[at + 4], a[at + 5]] };
    let ip = |at: usize| Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]);
    Ok(Arp {
        eth_dst: [frame[0], frame[1], frame[2], frame[3], frame[4], frame[5]],
        eth_src: [frame[6], frame[7], frame[8], frame[9], frame[10], frame[11]],
        op,
        sender_mac: mac(8),
        sender_ip: ip(14),
        target_mac: mac(18),
        target_ip: ip(24),
    })
}

/// A frame's destination MAC (`None` when shorter than an Ethernet header).
pub fn dst_mac(frame: &[u8]) -> Option<[u8; 6]> {
    frame.get(..6)?.try_into().ok()
}

/// A frame's EtherType (`None` when shorter than an Ethernet header).
pub fn ethertype(frame: &[u8]) -> Option<u16> {
    (frame.len() >= ETH_LEN).then(|| be16(frame, 12))
}

/// Whether a frame is a RoCEv2 packet by its headers (EtherType IPv4, IPv4 protocol UDP, UDP destination port
/// 4791), whatever its checks say: [`decode`]'s errors on such a frame are a bad packet, on any other frame
/// just traffic that is not RoCE.
pub fn is_rocev2(frame: &[u8]) -> bool {
    if ethertype(frame) != Some(ETHERTYPE_IPV4) {
        return false;
    }
    let Some(&vihl) = frame.get(ETH_LEN) else { return false };
    let ihl = (vihl & 0x0F) as usize * 4;
    if vihl >> 4 != 4 || frame.get(ETH_LEN + 9) != Some(&IPPROTO_UDP) {
        return false;
    }
    frame.len() >= ETH_LEN + ihl + 4 && be16(frame, ETH_LEN + ihl + 2) == ROCEV2_PORT
}

/// Whether a frame sent to `dst` is for the station at `mine`: its own address or broadcast (it joins no
/// multicast group).
pub fn for_station(dst: [u8; 6], mine: [u8; 6]) -> bool {
    dst == mine || dst == BROADCAST_MAC
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> Addr {
        Addr {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 0xC123,
            dst_port: ROCEV2_PORT,
            tos: 0,
            ttl: 64,
        }
    }

    #[test]
    fn a_write_first_round_trips_with_pad_and_icrc() {
        let data: Vec<u8> = (0..1021u32).map(|i| i as u8).collect();
        let mut bth = Bth::new(opcode::RDMA_WRITE_FIRST, 0x12345, 0xFFFFFF);
        bth.ack_req = true;
        let p = Packet {
            addr: addr(),
            bth,
            reth: Some(Reth { va: 0x1122_3344_5566_7788, rkey: 0xABCD_EF01, len: 4000 }),
            aeth: None,
            imm: None,
            payload: &data,
        };
        let mut f = Vec::new();
        encode(&p, &mut f).unwrap();
        assert_eq!(f.len(), OUTER_LEN + BTH_LEN + RETH_LEN + 1024 + ICRC_LEN);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(f[ETH_LEN + 6], 0x40, "DF");
        let q = decode(&f).unwrap();
        assert_eq!(q.bth.pad, 3);
        assert_eq!(Packet { bth: Bth { pad: 0, ..q.bth }, ..q }, p);
        // The same payload gathered from three pieces makes the same frame.
        let mut g = Vec::new();
        let head = Packet { payload: &data[..10], ..p };
        encode_gather(&head, &[&data[10..500], &[], &data[500..]], &mut g).unwrap();
        assert_eq!(g, f);
        // Ethernet padding after the datagram is ignored.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 6]);
        assert!(decode(&padded).is_ok());
        // Any flipped bit outside the masked fields fails a check.
        for i in [0x10, ETH_LEN + 12, OUTER_LEN + 5, OUTER_LEN + 20, f.len() - 6, f.len() - 1] {
            let mut g = f.clone();
            g[i] ^= 1;
            assert!(decode(&g).is_err(), "byte {i}");
        }
    }

    #[test]
    fn an_ack_round_trips_and_known_bad_frames_are_refused() {
        let p = Packet {
            addr: addr(),
            bth: Bth::new(opcode::ACKNOWLEDGE, 7, 42),
            reth: None,
            aeth: Some(Aeth::nak(NakCode::RemoteAccess, 3)),
            imm: None,
            payload: &[],
        };
        let mut f = Vec::new();
        encode(&p, &mut f).unwrap();
        let q = decode(&f).unwrap();
        assert_eq!(q, p);
        assert_eq!(q.aeth.unwrap().kind(), AethKind::Nak(NakCode::RemoteAccess));
        assert_eq!(Aeth::ack(0).kind(), AethKind::Ack { credits: 0x1F });
        assert_eq!(Aeth { syndrome: 0x2E, msn: 0 }.kind(), AethKind::RnrNak { timer: 0x0E });
        let mut g = f.clone();
        g[ETH_LEN + 8] = 1; // TTL is masked by the ICRC but covered by the IPv4 checksum
        assert_eq!(decode(&g), Err(WireError::IpChecksum));
        let mut g = f.clone();
        g[ETH_LEN + IPV4_LEN + 6] = 0x12; // a non-zero UDP checksum must be right
        assert_eq!(decode(&g), Err(WireError::UdpChecksum));
        let mut g = f.clone();
        g.truncate(f.len() - 1);
        assert!(decode(&g).is_err());
        let bad = Packet { reth: Some(Reth { va: 0, rkey: 0, len: 0 }), ..p };
        assert_eq!(encode(&bad, &mut g), Err(WireError::Layout));
    }

    #[test]
    fn a_valid_udp_checksum_is_accepted() {
        let p = Packet {
            addr: addr(),
            bth: Bth::new(opcode::RDMA_READ_RESPONSE_MIDDLE, 7, 42),
            reth: None,
            aeth: None,
            imm: None,
            payload: &[1, 2, 3, 4, 5],
        };
        let mut f = Vec::new();
        encode(&p, &mut f).unwrap();
        let (ip, udp) = f[ETH_LEN..].split_at(IPV4_LEN);
        let mut acc = ones_sum(0, &ip[12..20]);
        acc = ones_sum(acc, &[0, IPPROTO_UDP]);
        acc = ones_sum(acc, &(udp.len() as u16).to_be_bytes());
        let c = !(ones_sum(acc, udp) as u16);
        f[OUTER_LEN - 2..OUTER_LEN].copy_from_slice(&c.to_be_bytes());
        assert_eq!(decode(&f).unwrap().payload, &[1, 2, 3, 4, 5]);
        assert!(is_rocev2(&f));
        // Another UDP port, another IP protocol: not RoCE (whatever the checks would say).
        let mut g = f.clone();
        g[ETH_LEN + IPV4_LEN + 3] = 67;
        assert!(!is_rocev2(&g));
        let mut g = f.clone();
        g[ETH_LEN + 9] = 6;
        assert!(!is_rocev2(&g) && !is_rocev2(&f[..ETH_LEN + 10]));
    }

    /// RFC 826 layout, byte by byte: who has 10.0.2.20? Tell 10.0.2.16 at 02:4c:42:00:00:01.
    const ARP_REQUEST: [u8; 42] = [
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02, 0x4C, 0x42, 0x00, 0x00, 0x01, 0x08, 0x06, // Ethernet
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // hrd 1, pro 0x0800, hln 6, pln 4, op 1
        0x02, 0x4C, 0x42, 0x00, 0x00, 0x01, 0x0A, 0x00, 0x02, 0x10, // sha, spa
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0A, 0x00, 0x02, 0x14, // tha, tpa
    ];
    /// 10.0.2.20 is at 52:54:00:12:34:56, to the asker.
    const ARP_REPLY: [u8; 42] = [
        0x02, 0x4C, 0x42, 0x00, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, // Ethernet
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, // op 2
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0A, 0x00, 0x02, 0x14, // sha, spa
        0x02, 0x4C, 0x42, 0x00, 0x00, 0x01, 0x0A, 0x00, 0x02, 0x10, // tha, tpa
    ];

    #[test]
    fn arp_request_and_reply_golden_bytes() {
        let me = [0x02, 0x4C, 0x42, 0x00, 0x00, 0x01];
        let them = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let q = Arp::request(me, Ipv4Addr::new(10, 0, 2, 16), Ipv4Addr::new(10, 0, 2, 20));
        let mut f = Vec::new();
        encode_arp(&q, &mut f);
        assert_eq!(f.len(), ETH_MIN_LEN);
        assert_eq!(&f[..42], &ARP_REQUEST[..]);
        assert!(f[42..].iter().all(|&b| b == 0), "zero padding");
        assert_eq!(decode_arp(&f), Ok(q));
        assert_eq!(decode_arp(&ARP_REQUEST), Ok(q), "unpadded");
        let r = q.reply_from(them);
        encode_arp(&r, &mut f);
        assert_eq!(&f[..42], &ARP_REPLY[..]);
        let d = decode_arp(&ARP_REPLY).unwrap();
        assert_eq!(d, r);
        assert_eq!((d.op, d.sender_ip, d.sender_mac), (ArpOp::Reply, Ipv4Addr::new(10, 0, 2, 20), them));
        assert_eq!((dst_mac(&ARP_REPLY), ethertype(&ARP_REPLY)), (Some(me), Some(ETHERTYPE_ARP)));
        assert_eq!((dst_mac(&[1, 2]), ethertype(&ARP_REPLY[..13])), (None, None));
        assert!(for_station(BROADCAST_MAC, me) && for_station(me, me) && !for_station(them, me));
        assert!(!is_rocev2(&ARP_REPLY));
    }

    #[test]
    fn arp_frames_with_bad_fields_are_refused() {
        let bad = |at: usize, v: u8| {
            let mut f = ARP_REQUEST;
            f[at] = v;
            decode_arp(&f)
        };
        assert_eq!(decode_arp(&ARP_REQUEST[..41]), Err(ArpError::Short));
        assert_eq!(bad(13, 0x00), Err(ArpError::NotArp)); // EtherType 0x0800
        assert_eq!(bad(15, 6), Err(ArpError::HardwareType(6))); // IEEE 802
        assert_eq!(bad(16, 0x86), Err(ArpError::ProtocolType(0x8600)));
        assert_eq!(bad(18, 8), Err(ArpError::AddressLengths(8, 4)));
        assert_eq!(bad(19, 16), Err(ArpError::AddressLengths(6, 16)));
        assert_eq!(bad(21, 3), Err(ArpError::Op(3))); // RARP request
        assert_eq!(bad(21, 0), Err(ArpError::Op(0)));
        // A RoCE frame is not ARP, and ARP is not RoCE.
        assert_eq!(decode(&ARP_REQUEST), Err(WireError::Short));
        let mut padded = ARP_REQUEST.to_vec();
        padded.resize(200, 0);
        assert_eq!(decode(&padded), Err(WireError::NotIpv4));
        assert!(ArpError::Op(3).to_string().contains("neither request"));
    }
}
