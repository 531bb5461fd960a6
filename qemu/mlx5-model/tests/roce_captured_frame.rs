//! A RoCEv2 frame from real hardware, pinned as a test vector for the model's codec (`roce::wire`) and for the
//! tests' own oracle (`tests/rocev2`): its headers parse to the values in its bytes, and the ICRC the NIC
//! computed is the one both recompute (`docs/reference/roce.md`, "A frame from real hardware").
//!
//! The frame: a Congestion Notification Packet (opcode 0x81, RoCEv2 annex A17.9.3) sent by a Mellanox
//! ConnectX-4 Lx, as published in scapy's RoCE tests (github.com/secdev/scapy, `test/contrib/roce.uts`, test
//! "RoCE CNP captured on ConnectX-4 Lx", added in commit ab0784df71436ef2a6a5700f3026843597c57b2f by Haggai
//! Eran, 2020; checked at commit ac38b2734). That test asserts the opcode is CNP and that scapy's recomputed
//! ICRC equals the captured one, 82 fd 00 2a on the wire. The 74 bytes are the captured packet (Ethernet FCS not
//! included), copied as data; scapy itself is GPL-2.0-only and none of its code is used here. The verifier's
//! codec pins its own copy of the same bytes (`app/client/tests/captured_frame.rs`).

use mlx5_model::roce::wire::{self, Bth, Endpoints, WireError, opcode};

mod rocev2;

/// The capture, 16 bytes a line as the source prints it.
const CNP_CONNECTX4_LX: &str = "
    e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
    003c 718c 4000 4011 9161 0a00 1101 0a00
    1201 0000 12b7 0028 0000 8100 ffff 4000
    0118 0000 0000 0000 0000 0000 0000 0000
    0000 0000 0000 82fd 002a";

/// The ICRC as the NIC put it on the wire (the codec stores the CRC least significant byte first).
const CAPTURED_ICRC: [u8; 4] = [0x82, 0xFD, 0x00, 0x2A];

const IP_AT: usize = wire::ETH_HLEN;
const BTH_AT: usize = wire::BTH_OFFSET;
/// Bytes of the frame, from the IPv4 header on, that the ICRC masks to ones: TOS, TTL, header checksum, UDP
/// checksum, BTH resv8a (which carries a CNP's BECN bit).
const MASKED: [usize; 7] = [IP_AT + 1, IP_AT + 8, IP_AT + 10, IP_AT + 11, IP_AT + 26, IP_AT + 27, BTH_AT + 4];

fn frame() -> Vec<u8> {
    let hex: Vec<u8> = CNP_CONNECTX4_LX.bytes().filter(u8::is_ascii_hexdigit).collect();
    let f: Vec<u8> = hex.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect();
    assert_eq!(f.len(), 74, "the capture is 74 bytes");
    f
}

#[test]
fn the_captured_cnp_parses_to_the_values_in_its_bytes() {
    let f = frame();
    let p = wire::parse(&f).expect("a ConnectX-4 Lx CNP is a valid RoCEv2 frame");
    assert_eq!(
        p.endpoints,
        Endpoints {
            eth_dst: [0xE4, 0x1D, 0x2D, 0xAB, 0x2B, 0xC2],
            eth_src: [0x7C, 0xFE, 0x90, 0x64, 0x3B, 0x32],
            ip_src: [10, 0, 17, 1],
            ip_dst: [10, 0, 18, 1],
            udp_sport: 0,
        }
    );
    // DSCP 48 with ECN ECT(0); TTL 64. Both are masked by the ICRC, both are covered by the IPv4 checksum.
    assert_eq!((p.ip_tos, p.ip_ttl, p.udp_dport), (0xC2, 64, wire::ROCE_V2_UDP_DPORT));
    assert_eq!(
        p.bth,
        Bth {
            opcode: opcode::CNP,
            se: false,
            mig: false,
            pad_cnt: 0,
            tver: 0,
            pkey: wire::DEFAULT_PKEY,
            resv8a: 0x40, // BECN (FECN 0, 6 reserved bits 0)
            dest_qp: 0x118,
            ack_req: false,
            psn: 0,
        }
    );
    assert_eq!((p.reth, p.aeth, p.immdt, p.atomic), (None, None, None, None));
    assert_eq!(p.payload, &[0u8; wire::CNP_RESERVED_BYTES], "16 reserved bytes, zero");
    assert_eq!(p.icrc.to_le_bytes(), CAPTURED_ICRC);
}

#[test]
fn the_model_and_the_test_oracle_recompute_the_nics_icrc() {
    let f = frame();
    let want = u32::from_le_bytes(CAPTURED_ICRC);
    assert_eq!(wire::icrc(&f[IP_AT..]), Some(want), "roce::wire");
    assert_eq!(rocev2::icrc(&f[IP_AT..f.len() - wire::ICRC_BYTES]), want, "tests/rocev2");
    assert_eq!(wire::icrc(&f[IP_AT..BTH_AT + wire::BTH_BYTES + 3]), None, "shorter than the headers");
}

#[test]
fn every_flipped_bit_outside_the_masked_bytes_changes_the_icrc() {
    let f = frame();
    let want = u32::from_le_bytes(CAPTURED_ICRC);
    let icrc_at = f.len() - wire::ICRC_BYTES;
    for at in IP_AT..icrc_at {
        for bit in 0..8 {
            let mut g = f.clone();
            g[at] ^= 1 << bit;
            let same = wire::icrc(&g[IP_AT..]) == Some(want);
            assert_eq!(same, MASKED.contains(&at), "byte {at} bit {bit}");
        }
    }
    // Through `parse`: a flipped bit in the P_Key, destination QP, PSN, reserved bytes or the ICRC itself is a
    // bad ICRC (no other check looks at those bits), while the masked BECN bit may change freely.
    for at in [BTH_AT + 2, BTH_AT + 7, BTH_AT + 11, BTH_AT + 12, BTH_AT + 27, icrc_at, f.len() - 1] {
        let mut g = f.clone();
        g[at] ^= 0x01;
        assert!(matches!(wire::parse(&g), Err(WireError::BadIcrc { .. })), "byte {at}");
    }
    let mut g = f.clone();
    g[BTH_AT + 4] = 0; // BECN cleared
    assert_eq!(wire::parse(&g).unwrap().bth.resv8a, 0);
}

#[test]
fn a_cnp_without_its_16_reserved_bytes_is_refused() {
    let ep = Endpoints {
        eth_src: [0x7C, 0xFE, 0x90, 0x64, 0x3B, 0x32],
        eth_dst: [0xE4, 0x1D, 0x2D, 0xAB, 0x2B, 0xC2],
        ip_src: [10, 0, 17, 1],
        ip_dst: [10, 0, 18, 1],
        udp_sport: 0,
    };
    let bth = wire::Bth::parse(&frame()[BTH_AT..]).unwrap();
    assert!(wire::parse(&wire::build(&ep, &bth, &[], &[0; 16])).is_ok());
    for len in [0, 12, 20] {
        let f = wire::build(&ep, &bth, &[], &vec![0; len]);
        assert_eq!(wire::parse(&f), Err(WireError::BadCnp { len }), "{len} bytes");
    }
}
