//! A pcap writer for the virtual cable (classic libpcap format, `LINKTYPE_ETHERNET`), so a capture of the
//! responder's traffic reads as RoCEv2 in Wireshark and tcpdump.

use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

/// `LINKTYPE_ETHERNET` (tcpdump.org link-layer header types).
pub const LINKTYPE_ETHERNET: u32 = 1;
pub const SNAPLEN: u32 = 65535;

pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header (magic 0xa1b2c3d4 in native order, version 2.4, microsecond timestamps).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_C3D4u32.to_ne_bytes());
        h.extend_from_slice(&2u16.to_ne_bytes());
        h.extend_from_slice(&4u16.to_ne_bytes());
        h.extend_from_slice(&0i32.to_ne_bytes()); // thiszone
        h.extend_from_slice(&0u32.to_ne_bytes()); // sigfigs
        h.extend_from_slice(&SNAPLEN.to_ne_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Records one frame with the current wall-clock time.
    pub fn frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.frame_at(now.as_secs() as u32, now.subsec_micros(), frame)
    }

    pub fn frame_at(&mut self, secs: u32, micros: u32, frame: &[u8]) -> io::Result<()> {
        let incl = frame.len().min(SNAPLEN as usize);
        let mut h = Vec::with_capacity(16);
        h.extend_from_slice(&secs.to_ne_bytes());
        h.extend_from_slice(&micros.to_ne_bytes());
        h.extend_from_slice(&(incl as u32).to_ne_bytes());
        h.extend_from_slice(&(frame.len() as u32).to_ne_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&frame[..incl])?;
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_record_layout() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.frame_at(1, 2, &[0xAA; 3]).unwrap();
        let b = w.into_inner();
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()), 0xA1B2_C3D4);
        assert_eq!(u32::from_ne_bytes(b[20..24].try_into().unwrap()), LINKTYPE_ETHERNET);
        assert_eq!(u32::from_ne_bytes(b[32..36].try_into().unwrap()), 3);
        assert_eq!(&b[40..], &[0xAA; 3]);
    }
}
