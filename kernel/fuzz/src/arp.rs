//! The ARP check shared by the fuzz target `arp` (`fuzz_targets/arp.rs`, libFuzzer, nightly) and its stable
//! twin (`kernel/tests/fuzz_twins.rs`); both include this file by path.
//!
//! Anyone on the ConnectX-5 port's segment can send the appliance frames; the neighbour table learns from
//! `leasebox_kernel::arp::reply_to`. One input is the station's own MAC (6 bytes) and then one frame. Checked:
//! no panic; a frame is learned from only when it is an IPv4-over-Ethernet ARP reply addressed to the station
//! (Ethernet destination and target MAC), and what is learned is the sender's address and a unicast, non-zero
//! MAC, read from where RFC 826 puts them; the request the station sends is never mistaken for a reply.

use core::net::Ipv4Addr;
use leasebox_kernel::arp::{ARP_FRAME_LEN, reply_to, request};

/// Runs one input; returns whether the frame was learned from. Panics when a property does not hold.
pub fn check(data: &[u8]) -> bool {
    let Some((me, frame)) = data.split_first_chunk::<6>() else { return false };
    let learned = reply_to(frame, *me);
    if let Some((ip, mac)) = learned {
        let f = &frame[..ARP_FRAME_LEN];
        assert_eq!(&f[0..6], me, "sent to the station");
        assert_eq!(&f[32..38], me, "targeting the station");
        assert_eq!(f[12..22], [0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2], "an IPv4-over-Ethernet ARP reply");
        assert_eq!((ip.octets(), mac), (f[28..32].try_into().unwrap(), f[22..28].try_into().unwrap()));
        assert!(mac[0] & 1 == 0 && mac != [0; 6], "a unicast sender");
    }
    let target: [u8; 4] = frame.get(..4).map_or([0; 4], |b| b.try_into().unwrap());
    let ask = request(*me, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::from(target));
    assert_eq!(reply_to(&ask, *me), None, "our own request is not a reply");
    learned.is_some()
}
