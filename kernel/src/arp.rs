//! ARP for IPv4 over Ethernet (RFC 826) as the image's neighbour table needs it on the ConnectX-5's own port:
//! the request it sends, and the one kind of frame it learns from. Here rather than in the image so that host
//! tests and the fuzz target reach the parser (`kernel/fuzz`, target `arp`).
//!
//! Frame layout: Ethernet destination (0..6), source (6..12), EtherType 0x0806 (12..14); then `ar$hrd` 1,
//! `ar$pro` 0x0800, `ar$hln` 6, `ar$pln` 4, `ar$op` (14..22), sender MAC (22..28), sender IP (28..32), target
//! MAC (32..38), target IP (38..42). Padding to the 60-byte minimum frame follows.

use core::net::Ipv4Addr;

/// Bytes of an ARP frame up to the target IP, before padding.
pub const ARP_FRAME_LEN: usize = 42;
/// The shortest Ethernet frame without its FCS; [`request`] pads to it.
pub const MIN_FRAME_LEN: usize = 60;
/// EtherType, `ar$hrd`, `ar$pro`, `ar$hln`, `ar$pln` as every IPv4-over-Ethernet ARP frame has them.
const FIXED: [u8; 8] = [0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4];
const OP_REQUEST: u8 = 1;
const OP_REPLY: u8 = 2;

/// A broadcast ARP request for `target` from `mac`/`sender`, padded with zeros to [`MIN_FRAME_LEN`]. With
/// `sender == target` it is the announcement of RFC 5227 §2.3 (a gratuitous ARP).
pub fn request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> [u8; MIN_FRAME_LEN] {
    let mut f = [0u8; MIN_FRAME_LEN];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..20].copy_from_slice(&FIXED);
    f[20..22].copy_from_slice(&[0, OP_REQUEST]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&sender.octets());
    f[38..42].copy_from_slice(&target.octets());
    f
}

/// The sender's address and MAC of an ARP reply sent to `me` (Ethernet destination and target MAC both
/// `me`); `None` for any other frame, and for a reply whose sender MAC is multicast, broadcast or zero (no
/// neighbour has such an address, and learning one would send lease traffic to the whole segment).
pub fn reply_to(frame: &[u8], me: [u8; 6]) -> Option<(Ipv4Addr, [u8; 6])> {
    let f = frame.get(..ARP_FRAME_LEN)?;
    if f[12..20] != FIXED || f[20..22] != [0, OP_REPLY] || f[0..6] != me || f[32..38] != me {
        return None;
    }
    let mac = [f[22], f[23], f[24], f[25], f[26], f[27]];
    if mac[0] & 1 != 0 || mac == [0; 6] {
        return None;
    }
    Some((Ipv4Addr::new(f[28], f[29], f[30], f[31]), mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
    const PEER: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

    /// A reply from `mac` at 10.0.0.2 to `ME`, written byte by byte from RFC 826's layout.
    fn reply(mac: [u8; 6]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(ME);
        f.extend(mac);
        f.extend([0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02]);
        f.extend(mac);
        f.extend([10, 0, 0, 2]);
        f.extend(ME);
        f.extend([10, 0, 0, 1]);
        f.resize(60, 0);
        f
    }

    #[test]
    fn a_reply_to_us_is_learned() {
        assert_eq!(reply_to(&reply(PEER), ME), Some((Ipv4Addr::new(10, 0, 0, 2), PEER)));
        assert_eq!(reply_to(&reply(PEER)[..42], ME), Some((Ipv4Addr::new(10, 0, 0, 2), PEER)));
    }

    #[test]
    fn other_frames_are_not() {
        assert_eq!(reply_to(&reply(PEER)[..41], ME), None, "cut short");
        assert_eq!(reply_to(&reply(PEER), PEER), None, "to someone else");
        for bad_sender in [[0xff; 6], [0x01, 0, 0x5e, 0, 0, 1], [0; 6]] {
            assert_eq!(reply_to(&reply(bad_sender), ME), None, "{bad_sender:02x?}");
        }
        let mut req = reply(PEER);
        req[21] = 1;
        assert_eq!(reply_to(&req, ME), None, "a request");
        let mut f = reply(PEER);
        f[18] = 16;
        assert_eq!(reply_to(&f, ME), None, "another hardware address length");
        let mut f = reply(PEER);
        f[32] ^= 1;
        assert_eq!(reply_to(&f, ME), None, "a target MAC other than ours");
    }

    #[test]
    fn request_layout() {
        let f = request(ME, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut want = std::vec::Vec::new();
        want.extend([0xff; 6]);
        want.extend(ME);
        want.extend([0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01]);
        want.extend(ME);
        want.extend([10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        want.resize(60, 0);
        assert_eq!(f[..], want[..]);
    }
}
