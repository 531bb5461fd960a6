//! Ethernet frames as the port sees them: the header offsets the inline-mode check and the checksum offload
//! need, the `fte_match_set_lyr_2_4` view flow-table matching compares against (`mlx5_ifc.h`; outer headers
//! only), and the IPv4/TCP/UDP checksums. Every access is bounds-checked: a frame is untrusted input.

use crate::ifc::{self, Field};
use crate::roce::wire::inet_checksum;

pub const ETH_HLEN: usize = 14;
/// The shortest frame on the wire without its FCS (64 − 4).
pub const ETH_ZLEN: usize = 60;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// `struct mlx5_ifc_fte_match_set_lyr_2_4_bits` (0x40 bytes), bit offsets.
pub mod lyr_2_4 {
    use crate::ifc::Field;
    pub const SIZE: usize = 0x40;
    pub const SMAC_47_16: Field = Field::new(0x00, 32);
    pub const SMAC_15_0: Field = Field::new(0x20, 16);
    pub const ETHERTYPE: Field = Field::new(0x30, 16);
    pub const DMAC_47_16: Field = Field::new(0x40, 32);
    pub const DMAC_15_0: Field = Field::new(0x60, 16);
    pub const FIRST_PRIO: Field = Field::new(0x70, 3);
    pub const FIRST_CFI: Field = Field::new(0x73, 1);
    pub const FIRST_VID: Field = Field::new(0x74, 12);
    pub const IP_PROTOCOL: Field = Field::new(0x80, 8);
    pub const IP_DSCP: Field = Field::new(0x88, 6);
    pub const IP_ECN: Field = Field::new(0x8e, 2);
    pub const CVLAN_TAG: Field = Field::new(0x90, 1);
    pub const SVLAN_TAG: Field = Field::new(0x91, 1);
    pub const FRAG: Field = Field::new(0x92, 1);
    pub const IP_VERSION: Field = Field::new(0x93, 4);
    pub const TCP_FLAGS: Field = Field::new(0x97, 9);
    pub const TCP_SPORT: Field = Field::new(0xa0, 16);
    pub const TCP_DPORT: Field = Field::new(0xb0, 16);
    pub const TTL_HOPLIMIT: Field = Field::new(0xd8, 8);
    pub const UDP_SPORT: Field = Field::new(0xe0, 16);
    pub const UDP_DPORT: Field = Field::new(0xf0, 16);
    /// `src_ipv4_src_ipv6` and `dst_ipv4_dst_ipv6` (16 bytes each; IPv4 in the last 4) at these bytes.
    pub const SRC_IP: usize = 0x20;
    pub const DST_IP: usize = 0x30;
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Where a frame's headers are (offsets into the frame), as far as they are present and well-formed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Length of the L2 header (14, or 18 with one VLAN tag, 22 with two).
    pub l2_len: usize,
    /// The ethertype after any VLAN tags.
    pub ethertype: u16,
    /// Offset and length of the IPv4/IPv6 header.
    pub l3: Option<(usize, usize)>,
    pub ip_version: u8,
    pub ip_protocol: u8,
    /// Not the first fragment (L4 header absent) or more fragments follow.
    pub fragment: bool,
    pub first_fragment: bool,
    /// Offset and length of the TCP/UDP header.
    pub l4: Option<(usize, usize)>,
}

/// Parses the headers of `f` (never fails: absent or truncated headers are left out).
pub fn layout(f: &[u8]) -> Layout {
    let mut l = Layout::default();
    let Some(mut et) = be16(f, 12) else { return l };
    let mut at = ETH_HLEN;
    for _ in 0..2 {
        if (et == ETH_P_8021Q || et == ETH_P_8021AD) && f.len() >= at + 4 {
            et = be16(f, at + 2).unwrap_or(0);
            at += 4;
        }
    }
    l.l2_len = at.min(f.len());
    l.ethertype = et;
    match et {
        ETH_P_IP => {
            let Some(&vihl) = f.get(at) else { return l };
            let ihl = usize::from(vihl & 0xf) * 4;
            if vihl >> 4 != 4 || ihl < 20 || f.len() < at + ihl {
                return l;
            }
            l.l3 = Some((at, ihl));
            l.ip_version = 4;
            l.ip_protocol = f[at + 9];
            let frag = be16(f, at + 6).unwrap_or(0);
            let offset = frag & 0x1fff;
            l.fragment = offset != 0 || frag & 0x2000 != 0;
            l.first_fragment = offset == 0;
            at += ihl;
        }
        ETH_P_IPV6 => {
            if f.len() < at + 40 || f[at] >> 4 != 6 {
                return l;
            }
            l.l3 = Some((at, 40));
            l.ip_version = 6;
            l.ip_protocol = f[at + 6];
            l.first_fragment = true;
            at += 40;
        }
        _ => return l,
    }
    if !l.first_fragment {
        return l;
    }
    let l4_len = match l.ip_protocol {
        IPPROTO_TCP => f.get(at + 12).map_or(0, |&d| usize::from(d >> 4) * 4),
        IPPROTO_UDP => 8,
        _ => 0,
    };
    if l4_len >= 8 && f.len() >= at + l4_len {
        l.l4 = Some((at, l4_len));
    }
    l
}

/// The outer `fte_match_set_lyr_2_4` of a frame: what NIC_RX matching compares (masked) against an entry's
/// `match_value.outer_headers`.
pub fn outer_headers(f: &[u8]) -> [u8; lyr_2_4::SIZE] {
    use lyr_2_4::*;
    let mut m = [0u8; SIZE];
    if f.len() < ETH_HLEN {
        return m;
    }
    let l = layout(f);
    let set = |m: &mut [u8; SIZE], fl: Field, v: u32| ifc::set(m, fl, v);
    set(&mut m, DMAC_47_16, u32::from_be_bytes([f[0], f[1], f[2], f[3]]));
    set(&mut m, DMAC_15_0, u32::from(u16::from_be_bytes([f[4], f[5]])));
    set(&mut m, SMAC_47_16, u32::from_be_bytes([f[6], f[7], f[8], f[9]]));
    set(&mut m, SMAC_15_0, u32::from(u16::from_be_bytes([f[10], f[11]])));
    set(&mut m, ETHERTYPE, l.ethertype.into());
    let outer_tag = be16(f, 12).unwrap_or(0);
    if l.l2_len >= 18 && (outer_tag == ETH_P_8021Q || outer_tag == ETH_P_8021AD) {
        let tci = be16(f, 14).unwrap_or(0);
        set(&mut m, if outer_tag == ETH_P_8021Q { CVLAN_TAG } else { SVLAN_TAG }, 1);
        set(&mut m, FIRST_PRIO, u32::from(tci >> 13));
        set(&mut m, FIRST_CFI, u32::from((tci >> 12) & 1));
        set(&mut m, FIRST_VID, u32::from(tci & 0xfff));
    }
    if let Some((at, _)) = l.l3 {
        set(&mut m, IP_VERSION, l.ip_version.into());
        set(&mut m, IP_PROTOCOL, l.ip_protocol.into());
        set(&mut m, FRAG, l.fragment.into());
        let tos =
            if l.ip_version == 4 { f[at + 1] } else { ((u16::from_be_bytes([f[at], f[at + 1]]) >> 4) & 0xff) as u8 };
        set(&mut m, IP_DSCP, u32::from(tos >> 2));
        set(&mut m, IP_ECN, u32::from(tos & 3));
        if l.ip_version == 4 {
            set(&mut m, TTL_HOPLIMIT, f[at + 8].into());
            m[SRC_IP + 12..SRC_IP + 16].copy_from_slice(&f[at + 12..at + 16]);
            m[DST_IP + 12..DST_IP + 16].copy_from_slice(&f[at + 16..at + 20]);
        } else {
            set(&mut m, TTL_HOPLIMIT, f[at + 7].into());
            m[SRC_IP..SRC_IP + 16].copy_from_slice(&f[at + 8..at + 24]);
            m[DST_IP..DST_IP + 16].copy_from_slice(&f[at + 24..at + 40]);
        }
    }
    if let Some((at, _)) = l.l4 {
        let (sp, dp) = (be16(f, at).unwrap_or(0), be16(f, at + 2).unwrap_or(0));
        if l.ip_protocol == IPPROTO_TCP {
            set(&mut m, TCP_SPORT, sp.into());
            set(&mut m, TCP_DPORT, dp.into());
            set(&mut m, TCP_FLAGS, u32::from(be16(f, at + 12).unwrap_or(0) & 0x1ff));
        } else {
            set(&mut m, UDP_SPORT, sp.into());
            set(&mut m, UDP_DPORT, dp.into());
        }
    }
    m
}

/// `MLX5_INLINE_MODE_*` (`mlx5_ifc.h`): how much of a frame a send WQE must carry inline.
pub mod inline_mode {
    pub const NONE: u8 = 0;
    pub const L2: u8 = 1;
    pub const IP: u8 = 2;
    pub const TCP_UDP: u8 = 3;
}

/// Bytes of `f` that inline mode `mode` requires in the WQE's inline headers: the L2 header (with its VLAN
/// tags), plus the IP header, plus the TCP/UDP header — each only as far as the frame has it.
pub fn required_inline(f: &[u8], mode: u8) -> usize {
    let l = layout(f);
    let l2 = l.l2_len.max(ETH_HLEN.min(f.len()));
    match mode {
        inline_mode::NONE => 0,
        inline_mode::L2 => l2,
        inline_mode::IP => l.l3.map_or(l2, |(at, len)| at + len),
        _ => l.l4.map_or_else(|| l.l3.map_or(l2, |(at, len)| at + len), |(at, len)| at + len),
    }
}

/// The pseudo-header's part of a TCP/UDP checksum over IPv4 (RFC 768/793): the addresses at `ip + 12..ip + 20`,
/// the protocol and the L4 length, summed but not folded (an initial sum for `inet_checksum`).
fn pseudo_header_sum(f: &[u8], ip: usize, protocol: u8, l4_len: usize) -> u32 {
    let addrs: u32 = f[ip + 12..ip + 20].chunks_exact(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    addrs + u32::from(protocol) + l4_len as u32
}

/// Fills the IPv4 header checksum (`l3`) and/or the TCP/UDP checksum over IPv4 (`l4`), as the send side's
/// checksum offload does (`MLX5_ETH_WQE_L3_CSUM` / `MLX5_ETH_WQE_L4_CSUM`). Frames that are not IPv4, and
/// fragments, are left as they are.
pub fn offload_checksums(f: &mut [u8], l3: bool, l4: bool) {
    let l = layout(f);
    let Some((at, ihl)) = l.l3.filter(|_| l.ip_version == 4) else { return };
    if l3 {
        f[at + 10..at + 12].fill(0);
        let c = inet_checksum(&f[at..at + ihl], 0);
        f[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
    }
    let Some((l4_at, _)) = l.l4.filter(|_| l4 && !l.fragment) else { return };
    let total = usize::from(be16(f, at + 2).unwrap_or(0));
    let end = (at + total).min(f.len());
    if end < l4_at + 8 {
        return;
    }
    let csum_at = l4_at + if l.ip_protocol == IPPROTO_TCP { 16 } else { 6 };
    if csum_at + 2 > end {
        return;
    }
    f[csum_at..csum_at + 2].fill(0);
    let pseudo = pseudo_header_sum(f, at, l.ip_protocol, end - l4_at);
    let mut c = inet_checksum(&f[l4_at..end], pseudo);
    if c == 0 && l.ip_protocol == IPPROTO_UDP {
        c = 0xffff;
    }
    f[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/UDP frame 02:..:01 → ff:ff:ff:ff:ff:ff, 10.0.2.15:68 → 10.0.2.2:67, 4 bytes of payload.
    fn udp_frame() -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        f.extend_from_slice(&[0x45, 0, 0, 32, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 2, 15, 10, 0, 2, 2]);
        f.extend_from_slice(&[0, 68, 0, 67, 0, 12, 0, 0, 1, 2, 3, 4]);
        f
    }

    #[test]
    fn layout_and_match_view() {
        let f = udp_frame();
        let l = layout(&f);
        assert_eq!((l.l2_len, l.ethertype, l.l3, l.l4), (14, 0x800, Some((14, 20)), Some((34, 8))));
        let m = outer_headers(&f);
        assert_eq!(ifc::get(&m, lyr_2_4::DMAC_47_16), 0xffff_ffff);
        assert_eq!(ifc::get(&m, lyr_2_4::ETHERTYPE), 0x800);
        assert_eq!(ifc::get(&m, lyr_2_4::IP_PROTOCOL), 17);
        assert_eq!(ifc::get(&m, lyr_2_4::UDP_DPORT), 67);
        assert_eq!(ifc::get(&m, lyr_2_4::IP_VERSION), 4);
        assert_eq!(&m[lyr_2_4::DST_IP + 12..lyr_2_4::DST_IP + 16], &[10, 0, 2, 2]);
        assert_eq!(required_inline(&f, inline_mode::L2), 14);
        assert_eq!(required_inline(&f, inline_mode::IP), 34);
        assert_eq!(required_inline(&f, inline_mode::TCP_UDP), 42);
        // Truncated frames never panic.
        for n in 0..f.len() {
            let _ = outer_headers(&f[..n]);
            let _ = required_inline(&f[..n], inline_mode::TCP_UDP);
            offload_checksums(&mut f.clone()[..n], true, true);
        }
    }

    #[test]
    fn checksums_verify_to_zero() {
        let mut f = udp_frame();
        offload_checksums(&mut f, true, true);
        assert_ne!(&f[24..26], &[0, 0]);
        assert_eq!(inet_checksum(&f[14..34], 0), 0, "IPv4 header checksum");
        assert_eq!(
            inet_checksum(&f[34..46], pseudo_header_sum(&f, 14, 17, 12)),
            0,
            "UDP checksum with the pseudo-header"
        );
    }
}
