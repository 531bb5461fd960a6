//! A RoCEv2 frame from real hardware, pinned as a test vector for the verifier's codec (`rdma::wire`,
//! `rdma::icrc`): its headers decode to the values in its bytes, and `icrc` recomputes the ICRC the NIC put on
//! the wire (`docs/reference/roce.md`, "A frame from real hardware").
//!
//! The frame: a Congestion Notification Packet (opcode 0x81, RoCEv2 annex A17.9.3) sent by a Mellanox
//! ConnectX-4 Lx, as published in scapy's RoCE tests (github.com/secdev/scapy, `test/contrib/roce.uts`, test
//! "RoCE CNP captured on ConnectX-4 Lx", added in commit ab0784df71436ef2a6a5700f3026843597c57b2f by Haggai
//! Eran, 2020; checked at commit ac38b2734). That test asserts the opcode is CNP and that scapy's recomputed
//! ICRC equals the captured one, 82 fd 00 2a on the wire. The 74 bytes are the captured packet (Ethernet FCS not
//! included), copied as data; scapy itself is GPL-2.0-only and none of its code is used here. This is this
//! codec's own copy; the device model pins another (`qemu/mlx5-model/tests/roce_captured_frame.rs`).

use std::net::Ipv4Addr;

use leasebox_client::rdma::icrc::icrc;
use leasebox_client::rdma::wire::{self, Addr, Bth, Packet, WireError, opcode};

/// The capture, 16 bytes a line as the source prints it.
const CNP_CONNECTX4_LX: &str = "
    e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
    003c 718c 4000 4011 9161 0a00 1101 0a00
    1201 0000 12b7 0028 0000 8100 ffff 4000
    0118 0000 0000 0000 0000 0000 0000 0000
    0000 0000 0000 82fd 002a";

/// The ICRC as the NIC put it on the wire, least significant byte of the CRC first.
const CAPTURED_ICRC: [u8; 4] = [0x82, 0xFD, 0x00, 0x2A];

const IP_AT: usize = wire::ETH_LEN;
const BTH_AT: usize = wire::OUTER_LEN;
/// Frame offsets of the bytes the ICRC masks to ones: IPv4 TOS, TTL and header checksum, UDP checksum, BTH
/// resv8a (a CNP's BECN bit lives there).
const MASKED: [usize; 7] = [IP_AT + 1, IP_AT + 8, IP_AT + 10, IP_AT + 11, IP_AT + 26, IP_AT + 27, BTH_AT + 4];

fn frame() -> Vec<u8> {
    let digits: Vec<u8> = CNP_CONNECTX4_LX.bytes().filter(u8::is_ascii_hexdigit).collect();
    let f: Vec<u8> =
        digits.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect();
    assert_eq!(f.len(), 74, "the capture is 74 bytes");
    f
}

#[test]
fn the_captured_cnp_decodes_to_the_values_in_its_bytes() {
    let f = frame();
    assert!(wire::is_rocev2(&f));
    let p = wire::decode(&f).expect("a ConnectX-4 Lx CNP is a valid RoCEv2 frame");
    assert_eq!(
        p.addr,
        Addr {
            src_mac: [0x7C, 0xFE, 0x90, 0x64, 0x3B, 0x32],
            dst_mac: [0xE4, 0x1D, 0x2D, 0xAB, 0x2B, 0xC2],
            src_ip: Ipv4Addr::new(10, 0, 17, 1),
            dst_ip: Ipv4Addr::new(10, 0, 18, 1),
            src_port: 0,
            dst_port: wire::ROCEV2_PORT,
            tos: 0xC2, // DSCP 48, ECN ECT(0)
            ttl: 64,
        }
    );
    assert_eq!(
        p.bth,
        Bth {
            opcode: opcode::CNP,
            se: false,
            mig: false,
            pad: 0,
            pkey: wire::DEFAULT_PKEY,
            dest_qp: 0x118,
            ack_req: false,
            psn: 0,
        }
    );
    assert_eq!((p.reth, p.aeth, p.imm), (None, None, None));
    assert_eq!(p.payload, &[0u8; wire::CNP_LEN], "16 reserved bytes, zero");
    assert_eq!(f[BTH_AT + 4], 0x40, "BECN set, FECN and the reserved bits clear");
    assert_eq!(&f[f.len() - wire::ICRC_LEN..], &CAPTURED_ICRC);
}

#[test]
fn icrc_recomputes_the_nics_icrc() {
    let f = frame();
    let covered = &f[IP_AT..f.len() - wire::ICRC_LEN];
    assert_eq!(icrc(covered), Some(u32::from_le_bytes(CAPTURED_ICRC)));
    assert_eq!(icrc(covered).map(u32::to_le_bytes), Some(CAPTURED_ICRC), "stored least significant byte first");
}

#[test]
fn every_flipped_bit_outside_the_masked_bytes_changes_the_icrc() {
    let f = frame();
    let want = Some(u32::from_le_bytes(CAPTURED_ICRC));
    let icrc_at = f.len() - wire::ICRC_LEN;
    for at in IP_AT..icrc_at {
        for bit in 0..8 {
            let mut g = f.clone();
            g[at] ^= 1 << bit;
            assert_eq!(icrc(&g[IP_AT..icrc_at]) == want, MASKED.contains(&at), "byte {at} bit {bit}");
        }
    }
    // Through `decode`: one flipped bit anywhere in the BTH, the reserved bytes or the ICRC is a bad ICRC (the
    // ICRC is checked before the BTH is read), while the masked BECN bit may change freely.
    for at in (BTH_AT..f.len()).filter(|&at| at != BTH_AT + 4) {
        let mut g = f.clone();
        g[at] ^= 0x10;
        assert_eq!(wire::decode(&g), Err(WireError::Icrc), "byte {at}");
    }
    let mut g = f.clone();
    g[BTH_AT + 4] = 0; // BECN cleared
    assert!(wire::decode(&g).is_ok());
}

#[test]
fn a_cnp_without_its_16_reserved_bytes_is_refused() {
    let f = frame();
    let p = wire::decode(&f).unwrap();
    let mut g = Vec::new();
    wire::encode(&p, &mut g).unwrap();
    assert_eq!(wire::decode(&g).unwrap().payload, p.payload);
    for len in [0, 12, 20] {
        let bytes = vec![0; len];
        wire::encode(&Packet { payload: &bytes, ..p }, &mut g).unwrap();
        assert_eq!(wire::decode(&g), Err(WireError::Layout), "{len} bytes");
    }
}
