//! The RoCEv2 invariant CRC (IBTA Vol. 1 §7.8.1 and the RoCEv2 annex A17.3.3; facts in
//! `docs/reference/roce.md`): CRC-32 with the Ethernet polynomial over a masked copy of the IPv4, UDP
//! and BTH headers preceded by 8 bytes of ones (the LRH RoCEv2 does not carry), then the rest of the packet.

use super::wire::{BTH_LEN, IPV4_LEN, UDP_LEN};

/// Reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xEDB8_8320;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// A running CRC-32 register (initial value all ones; [`Crc32::finish`] complements it).
#[derive(Clone, Copy, Debug)]
pub struct Crc32 {
    reg: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Crc32 { reg: 0xFFFF_FFFF }
    }
}

impl Crc32 {
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.reg = TABLE[((self.reg ^ b as u32) & 0xFF) as usize] ^ (self.reg >> 8);
        }
    }

    /// The raw register, before the final complement (Linux rxe seeds with such a value).
    pub fn register(&self) -> u32 {
        self.reg
    }

    pub fn finish(&self) -> u32 {
        !self.reg
    }
}

/// CRC-32 as zlib computes it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::default();
    c.update(data);
    c.finish()
}

/// Bytes of the IPv4 + UDP + BTH headers the ICRC masks.
const MASKED_LEN: usize = IPV4_LEN + UDP_LEN + BTH_LEN;

/// The ICRC of a RoCEv2 packet given from its IPv4 header up to (excluding) the ICRC: the IPv4 header (IHL 5)
/// with TOS, TTL and header checksum as ones, the UDP checksum as ones, BTH resv8a as ones, then the rest.
/// Stored on the wire least-significant byte first ([`u32::to_le_bytes`]). `None` when too short.
pub fn icrc(ip_packet: &[u8]) -> Option<u32> {
    if ip_packet.len() < MASKED_LEN {
        return None;
    }
    let mut hdr = [0u8; MASKED_LEN];
    hdr.copy_from_slice(&ip_packet[..MASKED_LEN]);
    hdr[1] = 0xFF; // TOS (DSCP + ECN)
    hdr[8] = 0xFF; // TTL
    hdr[10..12].fill(0xFF); // header checksum
    hdr[IPV4_LEN + 6..IPV4_LEN + 8].fill(0xFF); // UDP checksum
    hdr[IPV4_LEN + UDP_LEN + 4] = 0xFF; // BTH resv8a
    let mut c = Crc32::default();
    c.update(&[0xFF; 8]);
    c.update(&hdr);
    c.update(&ip_packet[MASKED_LEN..]);
    Some(c.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_and_the_rxe_seed() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        let mut c = Crc32::default();
        c.update(&[0xFF; 8]);
        assert_eq!(c.register(), 0xDEBB_20E3, "rxe's seed is the register after the masked LRH");
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc() {
        let mut p: Vec<u8> = (0..80u8).collect();
        let base = icrc(&p).unwrap();
        for i in [1, 8, 10, 11, IPV4_LEN + 6, IPV4_LEN + 7, IPV4_LEN + UDP_LEN + 4] {
            p[i] ^= 0x5A;
            assert_eq!(icrc(&p), Some(base), "byte {i} is masked");
        }
        p[IPV4_LEN + UDP_LEN + 5] ^= 1; // DestQP
        assert_ne!(icrc(&p), Some(base));
        assert_eq!(icrc(&p[..MASKED_LEN - 1]), None);
    }
}
