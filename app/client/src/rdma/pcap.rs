//! A pcap writer for the cable (classic libpcap format, `LINKTYPE_ETHERNET`), so Wireshark decodes the frames
//! as RoCEv2 (it dissects UDP port 4791 as InfiniBand).

use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

const LINKTYPE_ETHERNET: u32 = 1;
const SNAPLEN: u32 = 65_535;

pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header.
    pub fn new(mut out: W) -> io::Result<PcapWriter<W>> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// One frame, stamped with the wall clock.
    pub fn frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let cap = frame.len().min(SNAPLEN as usize);
        let mut h = Vec::with_capacity(16);
        h.extend_from_slice(&(t.as_secs() as u32).to_le_bytes());
        h.extend_from_slice(&t.subsec_micros().to_le_bytes());
        h.extend_from_slice(&(cap as u32).to_le_bytes());
        h.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&frame[..cap])
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_record_lengths() {
        let mut p = PcapWriter::new(Vec::new()).unwrap();
        p.frame(&[1, 2, 3]).unwrap();
        let b = p.out;
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(&b[..4], &[0xD4, 0xC3, 0xB2, 0xA1]);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 3);
    }
}
