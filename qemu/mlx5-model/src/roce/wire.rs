//! RoCEv2 frames as carried on the model's virtual cable: Ethernet II + IPv4 + UDP (destination port 4791) + BTH
//! + extension headers + payload + pad + ICRC, one frame per UDP datagram (`docs/reference/roce.md`).
//!
//! Header layouts follow the IBTA Vol. 1 transport headers (BTH 9.2, RETH 9.3.3, AETH 9.3.5) and the RoCEv2
//! annex (A17.4 ICRC); names follow Linux `drivers/infiniband/sw/rxe/rxe_hdr.h` and `include/rdma/ib_pack.h`.
//! Every decode is bounds-checked and returns a [`WireError`]; nothing here panics on untrusted input.
//!
//! The revoke verifier has its own RoCEv2 codec (`app/client/src/rdma/wire.rs`, `icrc.rs`) and must keep it:
//! an oracle shares no code with what it checks, so neither side is ever refactored into the other.

use std::fmt;

/// IANA port of RoCEv2 (`ROCE_V2_UDP_DPORT` in Linux).
pub const ROCE_V2_UDP_DPORT: u16 = 4791;
pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const IPV4_HLEN: usize = 20;
pub const IPPROTO_UDP: u8 = 17;
pub const UDP_HLEN: usize = 8;
pub const BTH_BYTES: usize = 12;
pub const RETH_BYTES: usize = 16;
pub const AETH_BYTES: usize = 4;
pub const IMMDT_BYTES: usize = 4;
pub const ATMETH_BYTES: usize = 28;
pub const ATMACK_BYTES: usize = 8;
pub const ICRC_BYTES: usize = 4;
/// Offset of the BTH in a frame (no VLAN tag, no IPv4 options).
pub const BTH_OFFSET: usize = ETH_HLEN + IPV4_HLEN + UDP_HLEN;
/// The default P_Key (full membership of the default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// RC opcodes (`IB_OPCODE_RC_*` in `include/rdma/ib_pack.h`; the RC transport has the top 3 bits 000).
pub mod opcode {
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_WITH_IMMEDIATE: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: u8 = 0x05;
    pub const RC_RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RC_RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_RDMA_WRITE_LAST: u8 = 0x08;
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: u8 = 0x09;
    pub const RC_RDMA_WRITE_ONLY: u8 = 0x0A;
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: u8 = 0x0B;
    pub const RC_RDMA_READ_REQUEST: u8 = 0x0C;
    pub const RC_RDMA_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RC_RDMA_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RC_RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    /// Congestion Notification Packet (RoCEv2 annex A17.9.3): sent by a receiver that saw ECN CE marks to the
    /// sender of the marked flow, BECN set in the BTH byte the ICRC masks. Not an RC packet: the responder
    /// answers none.
    pub const CNP: u8 = 0x81;
}

/// The reserved bytes between a CNP's BTH and its ICRC (RoCEv2 annex A17.9.3).
pub const CNP_RESERVED_BYTES: usize = 16;

/// Which extension headers follow the BTH for an RC opcode, in wire order (IBTA Vol. 1 table 38), or for a CNP
/// (none: 16 reserved bytes, which [`parse`] returns as the payload); `None` for other opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpcodeLayout {
    pub reth: bool,
    pub atmeth: bool,
    pub aeth: bool,
    pub atmack: bool,
    pub immdt: bool,
}

pub fn layout(op: u8) -> Option<OpcodeLayout> {
    use opcode::*;
    let none = OpcodeLayout { reth: false, atmeth: false, aeth: false, atmack: false, immdt: false };
    Some(match op {
        RC_SEND_FIRST | RC_SEND_MIDDLE | RC_SEND_LAST | RC_SEND_ONLY | RC_RDMA_WRITE_MIDDLE | RC_RDMA_WRITE_LAST => {
            none
        }
        RC_RDMA_READ_RESPONSE_MIDDLE => none,
        RC_SEND_LAST_WITH_IMMEDIATE | RC_SEND_ONLY_WITH_IMMEDIATE | RC_RDMA_WRITE_LAST_WITH_IMMEDIATE => {
            OpcodeLayout { immdt: true, ..none }
        }
        RC_RDMA_WRITE_FIRST | RC_RDMA_WRITE_ONLY | RC_RDMA_READ_REQUEST => OpcodeLayout { reth: true, ..none },
        RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE => OpcodeLayout { reth: true, immdt: true, ..none },
        RC_RDMA_READ_RESPONSE_FIRST | RC_RDMA_READ_RESPONSE_LAST | RC_RDMA_READ_RESPONSE_ONLY | RC_ACKNOWLEDGE => {
            OpcodeLayout { aeth: true, ..none }
        }
        RC_ATOMIC_ACKNOWLEDGE => OpcodeLayout { aeth: true, atmack: true, ..none },
        RC_COMPARE_SWAP | RC_FETCH_ADD => OpcodeLayout { atmeth: true, ..none },
        CNP => none,
        _ => return None,
    })
}

impl OpcodeLayout {
    pub fn ext_len(&self) -> usize {
        let mut n = 0;
        n += if self.reth { RETH_BYTES } else { 0 };
        n += if self.atmeth { ATMETH_BYTES } else { 0 };
        n += if self.aeth { AETH_BYTES } else { 0 };
        n += if self.atmack { ATMACK_BYTES } else { 0 };
        n += if self.immdt { IMMDT_BYTES } else { 0 };
        n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// Ethertype other than IPv4 (VLAN tags and IPv6 are not carried on this cable yet).
    NotIpv4 {
        ethertype: u16,
    },
    /// IPv4 version/IHL/fragmentation/length we do not accept.
    Ipv4Header(&'static str),
    BadIpv4Checksum {
        got: u16,
        want: u16,
    },
    NotUdp {
        protocol: u8,
    },
    NotRoce {
        dport: u16,
    },
    BadUdpLength {
        udp_len: u16,
        ip_payload: usize,
    },
    BadUdpChecksum {
        got: u16,
        want: u16,
    },
    /// BTH TVer other than 0.
    BadTver(u8),
    UnknownOpcode(u8),
    /// PadCnt larger than the bytes after the headers.
    BadPad {
        pad: u8,
        rest: usize,
    },
    BadIcrc {
        got: u32,
        want: u32,
    },
    /// A CNP whose body after the BTH is not the 16 reserved bytes (pad and ICRC aside).
    BadCnp {
        len: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { what, need, have } => write!(f, "{what}: need {need} bytes, have {have}"),
            WireError::NotIpv4 { ethertype } => write!(f, "ethertype {ethertype:#06x} is not IPv4"),
            WireError::Ipv4Header(why) => write!(f, "IPv4 header: {why}"),
            WireError::BadIpv4Checksum { got, want } => write!(f, "IPv4 checksum {got:#06x}, want {want:#06x}"),
            WireError::NotUdp { protocol } => write!(f, "IP protocol {protocol} is not UDP"),
            WireError::NotRoce { dport } => write!(f, "UDP destination port {dport} is not RoCEv2 (4791)"),
            WireError::BadUdpLength { udp_len, ip_payload } => {
                write!(f, "UDP length {udp_len} but {ip_payload} bytes of IP payload")
            }
            WireError::BadUdpChecksum { got, want } => write!(f, "UDP checksum {got:#06x}, want {want:#06x}"),
            WireError::BadTver(v) => write!(f, "BTH TVer {v}, want 0"),
            WireError::UnknownOpcode(op) => write!(f, "opcode {op:#04x} is not an RC opcode"),
            WireError::BadPad { pad, rest } => write!(f, "PadCnt {pad} with {rest} bytes left"),
            WireError::BadIcrc { got, want } => write!(f, "ICRC {got:#010x}, want {want:#010x}"),
            WireError::BadCnp { len } => write!(f, "CNP with {len} bytes after the BTH, want 16 reserved"),
        }
    }
}

impl std::error::Error for WireError {}

fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), WireError> {
    if b.len() < n { Err(WireError::Truncated { what, need: n, have: b.len() }) } else { Ok(()) }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Base Transport Header (IBTA Vol. 1 9.2; `struct rxe_bth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// MigReq.
    pub mig: bool,
    pub pad_cnt: u8,
    pub tver: u8,
    pub pkey: u16,
    /// Reserved in RoCEv2 (FECN/BECN/resv6 in IB); masked to ones in the ICRC.
    pub resv8a: u8,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl Bth {
    pub fn parse(b: &[u8]) -> Result<Bth, WireError> {
        need("BTH", b, BTH_BYTES)?;
        Ok(Bth {
            opcode: b[0],
            se: b[1] & 0x80 != 0,
            mig: b[1] & 0x40 != 0,
            pad_cnt: (b[1] >> 4) & 0x3,
            tver: b[1] & 0xF,
            pkey: be16(b, 2),
            resv8a: b[4],
            dest_qp: be32(b, 4) & 0x00FF_FFFF,
            ack_req: b[8] & 0x80 != 0,
            psn: be32(b, 8) & 0x00FF_FFFF,
        })
    }

    pub fn to_bytes(&self) -> [u8; BTH_BYTES] {
        let mut b = [0u8; BTH_BYTES];
        b[0] = self.opcode;
        b[1] = (u8::from(self.se) << 7) | (u8::from(self.mig) << 6) | ((self.pad_cnt & 3) << 4) | (self.tver & 0xF);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4..8].copy_from_slice(&(((self.resv8a as u32) << 24) | (self.dest_qp & 0x00FF_FFFF)).to_be_bytes());
        b[8..12].copy_from_slice(&((u32::from(self.ack_req) << 31) | (self.psn & 0x00FF_FFFF)).to_be_bytes());
        b
    }
}

/// RDMA Extended Transport Header (IBTA Vol. 1 9.3.3; `struct rxe_reth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Reth {
    pub fn parse(b: &[u8]) -> Result<Reth, WireError> {
        need("RETH", b, RETH_BYTES)?;
        Ok(Reth { va: (u64::from(be32(b, 0)) << 32) | u64::from(be32(b, 4)), rkey: be32(b, 8), dma_len: be32(b, 12) })
    }

    pub fn to_bytes(&self) -> [u8; RETH_BYTES] {
        let mut b = [0u8; RETH_BYTES];
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
        b
    }
}

/// NAK codes in AETH syndrome bits 4:0 when bits 6:5 are 11 (IBTA Vol. 1 table 43; `AETH_NAK_*` in rxe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NakCode {
    PsnSequenceError = 0,
    InvalidRequest = 1,
    RemoteAccessError = 2,
    RemoteOperationalError = 3,
    InvalidRdRequest = 4,
}

/// Syndrome of a plain ACK with "unlimited" credits (rxe `AETH_ACK_UNLIMITED`): the model has no receive queue
/// whose WQEs it could count.
pub const AETH_ACK_UNLIMITED: u8 = 0x1F;

/// ACK Extended Transport Header (IBTA Vol. 1 9.3.5; `struct rxe_aeth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    pub syndrome: u8,
    pub msn: u32,
}

impl Aeth {
    pub fn ack(msn: u32) -> Aeth {
        Aeth { syndrome: AETH_ACK_UNLIMITED, msn: msn & 0x00FF_FFFF }
    }

    pub fn nak(code: NakCode, msn: u32) -> Aeth {
        Aeth { syndrome: 0x60 | code as u8, msn: msn & 0x00FF_FFFF }
    }

    /// The NAK code when bits 6:5 of the syndrome say NAK.
    pub fn nak_code(&self) -> Option<u8> {
        if self.syndrome & 0x60 == 0x60 { Some(self.syndrome & 0x1F) } else { None }
    }

    pub fn parse(b: &[u8]) -> Result<Aeth, WireError> {
        need("AETH", b, AETH_BYTES)?;
        Ok(Aeth { syndrome: b[0], msn: be32(b, 0) & 0x00FF_FFFF })
    }

    pub fn to_bytes(&self) -> [u8; AETH_BYTES] {
        ((u32::from(self.syndrome) << 24) | (self.msn & 0x00FF_FFFF)).to_be_bytes()
    }
}

/// CRC-32 of IEEE 802.3 (reflected polynomial 0xEDB88320), table-driven.
const CRC32_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Feeds `data` into a raw CRC-32 register (no pre- or post-inversion, like Linux `crc32_le`).
pub fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC32_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    crc
}

/// The register after the 8 bytes of 0xFF that stand for the masked LRH in RoCEv2; rxe seeds its ICRC with
/// this value (`rxe_icrc_hdr`).
pub const ICRC_SEED_AFTER_LRH: u32 = 0xDEBB_20E3;

/// The ICRC that belongs in the last 4 bytes of `ip_to_end` (a packet from its IPv4 header, IHL 5, up to and
/// including the ICRC, whatever those 4 bytes hold now), as a number stored least significant byte first;
/// `None` when shorter than IPv4 + UDP + BTH + ICRC. [`parse`] checks with it; tests recompute with it.
pub fn icrc(ip_to_end: &[u8]) -> Option<u32> {
    (ip_to_end.len() >= IPV4_HLEN + UDP_HLEN + BTH_BYTES + ICRC_BYTES).then(|| icrc_of(ip_to_end))
}

/// ICRC of a frame whose IPv4 header starts at `ETH_HLEN` and whose ICRC occupies the last 4 bytes of `roce`
/// (`roce` = the frame from the IPv4 header up to and including the ICRC). RoCEv2 annex A17.4: the IPv4 TOS,
/// TTL and header checksum, the UDP checksum and the BTH resv8a are replaced by ones.
fn icrc_of(ip_to_end: &[u8]) -> u32 {
    let covered = &ip_to_end[..ip_to_end.len() - ICRC_BYTES];
    let mut crc = crc32_update(0xFFFF_FFFF, &[0xFF; 8]);
    let mut ip = [0u8; IPV4_HLEN];
    ip.copy_from_slice(&covered[..IPV4_HLEN]);
    ip[1] = 0xFF; // TOS (DSCP + ECN)
    ip[8] = 0xFF; // TTL
    ip[10] = 0xFF; // header checksum
    ip[11] = 0xFF;
    crc = crc32_update(crc, &ip);
    let mut udp = [0u8; UDP_HLEN];
    udp.copy_from_slice(&covered[IPV4_HLEN..IPV4_HLEN + UDP_HLEN]);
    udp[6] = 0xFF;
    udp[7] = 0xFF;
    crc = crc32_update(crc, &udp);
    let bth_at = IPV4_HLEN + UDP_HLEN;
    let mut bth = [0u8; BTH_BYTES];
    bth.copy_from_slice(&covered[bth_at..bth_at + BTH_BYTES]);
    bth[4] = 0xFF; // resv8a
    crc = crc32_update(crc, &bth);
    crc = crc32_update(crc, &covered[bth_at + BTH_BYTES..]);
    !crc
}

/// Internet checksum (RFC 1071) of `data`, folded and complemented.
pub fn inet_checksum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

fn udp_checksum(src: [u8; 4], dst: [u8; 4], udp: &[u8]) -> u16 {
    let pseudo = u32::from(u16::from_be_bytes([src[0], src[1]]))
        + u32::from(u16::from_be_bytes([src[2], src[3]]))
        + u32::from(u16::from_be_bytes([dst[0], dst[1]]))
        + u32::from(u16::from_be_bytes([dst[2], dst[3]]))
        + u32::from(IPPROTO_UDP)
        + udp.len() as u32;
    let c = inet_checksum(udp, pseudo);
    if c == 0 { 0xFFFF } else { c }
}

/// Addresses of one side of a RoCEv2 exchange, as seen in the frame it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub eth_src: [u8; 6],
    pub eth_dst: [u8; 6],
    pub ip_src: [u8; 4],
    pub ip_dst: [u8; 4],
    pub udp_sport: u16,
}

/// A decoded frame; `payload` excludes the pad bytes and the ICRC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub endpoints: Endpoints,
    pub ip_tos: u8,
    pub ip_ttl: u8,
    pub udp_dport: u16,
    pub bth: Bth,
    pub reth: Option<Reth>,
    pub aeth: Option<Aeth>,
    pub immdt: Option<u32>,
    /// The raw AtomicETH or AtomicAckETH, when the opcode carries one.
    pub atomic: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub icrc: u32,
}

/// Decodes and verifies one frame: IPv4 header checksum, UDP length and (when not 0) checksum, BTH TVer, the
/// opcode's header layout (a CNP's 16 reserved bytes come back as the payload), PadCnt and ICRC. Ethernet
/// padding after the IPv4 total length is ignored.
pub fn parse(frame: &[u8]) -> Result<Packet<'_>, WireError> {
    need("Ethernet header", frame, ETH_HLEN)?;
    let ethertype = be16(frame, 12);
    if ethertype != ETH_P_IP {
        return Err(WireError::NotIpv4 { ethertype });
    }
    let ip = &frame[ETH_HLEN..];
    need("IPv4 header", ip, IPV4_HLEN)?;
    if ip[0] != 0x45 {
        return Err(WireError::Ipv4Header("version 4 with IHL 5 (no options) expected"));
    }
    let total = usize::from(be16(ip, 2));
    if total < IPV4_HLEN || total > ip.len() {
        return Err(WireError::Ipv4Header("total length outside the frame"));
    }
    if be16(ip, 6) & 0x3FFF != 0 {
        return Err(WireError::Ipv4Header("fragments are not RoCEv2"));
    }
    let got = be16(ip, 10);
    let mut hdr = [0u8; IPV4_HLEN];
    hdr.copy_from_slice(&ip[..IPV4_HLEN]);
    hdr[10] = 0;
    hdr[11] = 0;
    let want = inet_checksum(&hdr, 0);
    if got != want {
        return Err(WireError::BadIpv4Checksum { got, want });
    }
    if ip[9] != IPPROTO_UDP {
        return Err(WireError::NotUdp { protocol: ip[9] });
    }
    let ip = &ip[..total];
    let ip_src = [ip[12], ip[13], ip[14], ip[15]];
    let ip_dst = [ip[16], ip[17], ip[18], ip[19]];
    let udp = &ip[IPV4_HLEN..];
    need("UDP header", udp, UDP_HLEN)?;
    let udp_len = be16(udp, 4);
    if usize::from(udp_len) != udp.len() {
        return Err(WireError::BadUdpLength { udp_len, ip_payload: udp.len() });
    }
    let udp_dport = be16(udp, 2);
    if udp_dport != ROCE_V2_UDP_DPORT {
        return Err(WireError::NotRoce { dport: udp_dport });
    }
    let got = be16(udp, 6);
    if got != 0 {
        let mut copy = udp.to_vec();
        copy[6] = 0;
        copy[7] = 0;
        let want = udp_checksum(ip_src, ip_dst, &copy);
        if got != want {
            return Err(WireError::BadUdpChecksum { got, want });
        }
    }
    let roce = &udp[UDP_HLEN..];
    let bth = Bth::parse(roce)?;
    if bth.tver != 0 {
        return Err(WireError::BadTver(bth.tver));
    }
    let lay = layout(bth.opcode).ok_or(WireError::UnknownOpcode(bth.opcode))?;
    let hdrs = BTH_BYTES + lay.ext_len();
    need("RoCEv2 headers and ICRC", roce, hdrs + ICRC_BYTES)?;
    let mut at = BTH_BYTES;
    let mut reth = None;
    let mut aeth = None;
    let mut atomic = None;
    let mut immdt = None;
    if lay.reth {
        reth = Some(Reth::parse(&roce[at..])?);
        at += RETH_BYTES;
    }
    if lay.atmeth {
        atomic = Some(&roce[at..at + ATMETH_BYTES]);
        at += ATMETH_BYTES;
    }
    if lay.aeth {
        aeth = Some(Aeth::parse(&roce[at..])?);
        at += AETH_BYTES;
    }
    if lay.atmack {
        atomic = Some(&roce[at..at + ATMACK_BYTES]);
        at += ATMACK_BYTES;
    }
    if lay.immdt {
        immdt = Some(be32(roce, at));
        at += IMMDT_BYTES;
    }
    let rest = roce.len() - at - ICRC_BYTES;
    if usize::from(bth.pad_cnt) > rest {
        return Err(WireError::BadPad { pad: bth.pad_cnt, rest });
    }
    if bth.opcode == opcode::CNP && (rest != CNP_RESERVED_BYTES || bth.pad_cnt != 0) {
        return Err(WireError::BadCnp { len: rest });
    }
    let payload = &roce[at..at + rest - usize::from(bth.pad_cnt)];
    let icrc_at = roce.len() - ICRC_BYTES;
    let got = u32::from_le_bytes([roce[icrc_at], roce[icrc_at + 1], roce[icrc_at + 2], roce[icrc_at + 3]]);
    let want = icrc_of(ip);
    if got != want {
        return Err(WireError::BadIcrc { got, want });
    }
    Ok(Packet {
        endpoints: Endpoints {
            eth_dst: frame[0..6].try_into().unwrap_or_default(),
            eth_src: frame[6..12].try_into().unwrap_or_default(),
            ip_src,
            ip_dst,
            udp_sport: be16(udp, 0),
        },
        ip_tos: ip[1],
        ip_ttl: ip[8],
        udp_dport,
        bth,
        reth,
        aeth,
        immdt,
        atomic,
        payload,
        icrc: got,
    })
}

/// TTL of frames the model sends (Linux default `ip_default_ttl`).
pub const DEFAULT_TTL: u8 = 64;

/// Builds a frame: `ext` is the extension headers in wire order, PadCnt in `bth` is recomputed from the payload
/// length. IPv4: DF set, identification 0, TOS 0, TTL 64. UDP checksum 0 (allowed for RoCEv2 over IPv4).
pub fn build(ep: &Endpoints, bth: &Bth, ext: &[u8], payload: &[u8]) -> Vec<u8> {
    build_with(ep, 0, DEFAULT_TTL, bth, ext, payload)
}

/// [`build`] with the IPv4 TOS and TTL given (a QP's `tclass` and `hop_limit`).
pub fn build_with(ep: &Endpoints, tos: u8, ttl: u8, bth: &Bth, ext: &[u8], payload: &[u8]) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let roce_len = BTH_BYTES + ext.len() + payload.len() + pad + ICRC_BYTES;
    let udp_len = UDP_HLEN + roce_len;
    let ip_len = IPV4_HLEN + udp_len;
    let mut f = Vec::with_capacity(ETH_HLEN + ip_len);
    f.extend_from_slice(&ep.eth_dst);
    f.extend_from_slice(&ep.eth_src);
    f.extend_from_slice(&ETH_P_IP.to_be_bytes());
    let mut ip = [0u8; IPV4_HLEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[1] = tos;
    ip[6] = 0x40; // DF
    ip[8] = ttl;
    ip[9] = IPPROTO_UDP;
    ip[12..16].copy_from_slice(&ep.ip_src);
    ip[16..20].copy_from_slice(&ep.ip_dst);
    let c = inet_checksum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&ep.udp_sport.to_be_bytes());
    f.extend_from_slice(&ROCE_V2_UDP_DPORT.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    let mut b = *bth;
    b.pad_cnt = pad as u8;
    f.extend_from_slice(&b.to_bytes());
    f.extend_from_slice(ext);
    f.extend_from_slice(payload);
    f.extend(std::iter::repeat_n(0u8, pad + ICRC_BYTES));
    let icrc = icrc_of(&f[ETH_HLEN..]);
    let n = f.len();
    f[n - ICRC_BYTES..].copy_from_slice(&icrc.to_le_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_check_value_and_rxe_seed() {
        assert_eq!(!crc32_update(0xFFFF_FFFF, b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_update(0xFFFF_FFFF, &[0xFF; 8]), ICRC_SEED_AFTER_LRH);
    }

    #[test]
    fn headers_round_trip() {
        let bth = Bth {
            opcode: opcode::RC_RDMA_WRITE_ONLY,
            se: true,
            mig: false,
            pad_cnt: 3,
            tver: 0,
            pkey: 0xFFFF,
            resv8a: 0,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: 0xAB_CDEF,
        };
        assert_eq!(Bth::parse(&bth.to_bytes()).unwrap(), bth);
        let reth = Reth { va: 0x1122_3344_5566_7788, rkey: 0xAABB_CCDD, dma_len: 4096 };
        assert_eq!(Reth::parse(&reth.to_bytes()).unwrap(), reth);
        let aeth = Aeth::nak(NakCode::RemoteAccessError, 7);
        assert_eq!(aeth.to_bytes(), [0x62, 0, 0, 7]);
        assert_eq!(Aeth::parse(&aeth.to_bytes()).unwrap().nak_code(), Some(2));
    }

    #[test]
    fn build_then_parse_and_every_truncation_fails_cleanly() {
        let ep = Endpoints {
            eth_src: [2, 0, 0, 0, 0, 1],
            eth_dst: [2, 0, 0, 0, 0, 2],
            ip_src: [10, 0, 0, 1],
            ip_dst: [10, 0, 0, 2],
            udp_sport: 50000,
        };
        let bth = Bth {
            opcode: opcode::RC_RDMA_WRITE_ONLY,
            se: false,
            mig: false,
            pad_cnt: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            resv8a: 0,
            dest_qp: 5,
            ack_req: true,
            psn: 9,
        };
        let reth = Reth { va: 0x1000, rkey: 0x0100, dma_len: 5 };
        let f = build(&ep, &bth, &reth.to_bytes(), b"hello");
        let p = parse(&f).unwrap();
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.bth.pad_cnt, 3);
        assert_eq!(p.reth, Some(reth));
        assert_eq!(p.endpoints, ep);
        for n in 0..f.len() {
            assert!(parse(&f[..n]).is_err(), "truncated to {n}");
        }
        // Masked fields may change without breaking the ICRC; others may not.
        let mut g = f.clone();
        g[BTH_OFFSET + 4] = 0x5A; // resv8a
        assert!(parse(&g).is_ok());
        let mut g = f.clone();
        g[BTH_OFFSET + 11] ^= 1; // PSN
        assert!(matches!(parse(&g), Err(WireError::BadIcrc { .. })));
    }
}
