//! The RoCEv2 decoder check shared by the fuzz target `roce` (`fuzz_targets/roce.rs`, libFuzzer, nightly) and
//! its stable twin (`app/client/tests/roce_twin.rs`); both include this file by path.
//!
//! The client's software requester decodes every frame the cable delivers: RoCEv2 packets from the appliance
//! and anyone else on the segment, and ARP. One input is one frame after a mode byte. The mode's low three
//! bits make the frame reach past the checks random bytes never pass, so the fuzzer spends its time on the
//! transport headers: bit 0 forces EtherType IPv4, IHL 5, protocol UDP and port 4791; bit 1 sets the UDP
//! length from the IPv4 total length; bit 2 writes a correct IPv4 header checksum, a zero UDP checksum and the
//! ICRC. Checked, for `wire::decode`, `wire::decode_arp`, `is_rocev2`, `ethertype` and `dst_mac`:
//! - no panic, whatever the bytes;
//! - an accepted packet's pieces add up to the IPv4 total length, and it is RoCEv2 by its headers;
//! - an accepted packet re-encodes (`wire::encode`) to a frame that decodes to the same packet (PadCnt
//!   recomputed), byte for byte the same frame when the input was in the encoder's own form (the bytes the
//!   decoder does not keep, such as the pad's, were zero);
//! - an accepted ARP frame re-encodes (`wire::encode_arp`) to one that decodes to the same ARP.

use leasebox_client::rdma::icrc::icrc;
use leasebox_client::rdma::wire::{
    self, AETH_LEN, BTH_LEN, ETH_LEN, ETHERTYPE_ARP, ETHERTYPE_IPV4, ICRC_LEN, IMMDT_LEN, IPPROTO_UDP, IPV4_LEN,
    RETH_LEN, ROCEV2_PORT, UDP_LEN, ipv4_checksum,
};

/// What one input exercised (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub packets: u64,
    pub refused: u64,
    pub refused_past_icrc: u64,
    pub arps: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.packets += o.packets;
        self.refused += o.refused;
        self.refused_past_icrc += o.refused_past_icrc;
        self.arps += o.arps;
    }
}

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

/// Applies the mode's repairs to `f` in place (each only where the frame is long enough to hold its field).
pub fn repair(mode: u8, f: &mut [u8]) {
    const IP: usize = ETH_LEN;
    const UDP: usize = ETH_LEN + IPV4_LEN;
    if f.len() < UDP + UDP_LEN {
        return;
    }
    if mode & 1 != 0 {
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[IP] = 0x45;
        f[IP + 9] = IPPROTO_UDP;
        f[UDP + 2..UDP + 4].copy_from_slice(&ROCEV2_PORT.to_be_bytes());
    }
    let ip_len = be16(f, IP + 2);
    let ip_fits = ip_len >= IPV4_LEN + UDP_LEN + ICRC_LEN && IP + ip_len <= f.len();
    if mode & 2 != 0 && ip_fits {
        f[UDP + 4..UDP + 6].copy_from_slice(&((ip_len - IPV4_LEN) as u16).to_be_bytes());
    }
    if mode & 4 != 0 && ip_fits {
        f[IP + 10..IP + 12].fill(0);
        let c = ipv4_checksum(&f[IP..IP + IPV4_LEN]);
        f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
        f[UDP + 6..UDP + 8].fill(0);
        let end = IP + ip_len - ICRC_LEN;
        if let Some(crc) = icrc(&f[IP..end]) {
            f[end..end + ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let Some((&mode, rest)) = data.split_first() else { return n };
    let mut frame = rest.to_vec();
    repair(mode, &mut frame);
    let _ = (wire::dst_mac(&frame), wire::for_station([0; 6], [0; 6]));
    let rocev2 = wire::is_rocev2(&frame);
    match wire::decode(&frame) {
        Ok(p) => {
            n.packets += 1;
            assert!(rocev2, "a packet decode accepts is RoCEv2 by its headers");
            let ext = p.reth.map_or(0, |_| RETH_LEN) + p.aeth.map_or(0, |_| AETH_LEN) + p.imm.map_or(0, |_| IMMDT_LEN);
            let ip_len = be16(&frame, ETH_LEN + 2);
            let pieces = IPV4_LEN + UDP_LEN + BTH_LEN + ext + p.payload.len() + usize::from(p.bth.pad) + ICRC_LEN;
            assert_eq!(pieces, ip_len, "{p:?}");
            let mut again = Vec::new();
            wire::encode(&p, &mut again).expect("a decoded packet encodes");
            let q = wire::decode(&again).expect("an encoded packet decodes");
            let normalized = wire::Bth { pad: q.bth.pad, ..p.bth };
            assert_eq!((q.addr, q.bth, q.reth, q.aeth, q.imm), (p.addr, normalized, p.reth, p.aeth, p.imm));
            assert_eq!(q.payload, p.payload);
            if frame.len() == again.len() && usize::from(p.bth.pad) == (4 - p.payload.len() % 4) % 4 {
                // The encoder's own form: identification 0, DF, UDP checksum 0, reserved bits and pad bytes clear.
                let crc_at = ETH_LEN + ip_len - ICRC_LEN;
                let canonical = frame[ETH_LEN + 4..ETH_LEN + 8] == [0, 0, 0x40, 0]
                    && frame[crc_at - usize::from(p.bth.pad)..crc_at].iter().all(|&b| b == 0)
                    && frame[ETH_LEN + IPV4_LEN + 6..ETH_LEN + IPV4_LEN + 8] == [0, 0]
                    && frame[ETH_LEN + IPV4_LEN + UDP_LEN + 4] == 0
                    && frame[ETH_LEN + IPV4_LEN + UDP_LEN + 8] & 0x7f == 0;
                if canonical {
                    assert_eq!(again, frame, "the encoder's own frame re-encodes byte for byte");
                }
            }
        }
        Err(e) => {
            n.refused += 1;
            if !matches!(
                e,
                wire::WireError::Short
                    | wire::WireError::NotIpv4
                    | wire::WireError::IpHeader
                    | wire::WireError::IpChecksum
                    | wire::WireError::Fragment
                    | wire::WireError::NotUdp
                    | wire::WireError::UdpLength
                    | wire::WireError::UdpChecksum
                    | wire::WireError::NotRoce
                    | wire::WireError::Icrc
            ) {
                n.refused_past_icrc += 1;
            }
            assert!(!e.to_string().is_empty());
        }
    }
    if let Ok(a) = wire::decode_arp(&frame) {
        n.arps += 1;
        assert_eq!(wire::ethertype(&frame), Some(ETHERTYPE_ARP));
        let mut again = Vec::new();
        wire::encode_arp(&a, &mut again);
        assert_eq!(wire::decode_arp(&again), Ok(a));
        assert_eq!(again[..ETH_LEN + 28], frame[..ETH_LEN + 28], "ARP carries every byte it reads");
    }
    n
}
