//! Framing: the 16-byte header and a stream reassembler.
//!
//! ```text
//! offset  size  field
//!  0      2     magic        0x4C42 ("LB")
//!  2      1     version      1
//!  3      1     kind         0 request, 1 response, 2 error, 3 notice (server → client, unasked)
//!  4      2     op           operation code (Op)
//!  6      2     reserved     0
//!  8      4     request_id   chosen by the client, echoed in the answer
//! 12      4     length       payload bytes that follow, ≤ MAX_PAYLOAD
//! ```

use crate::msg::ErrorCode;
use alloc::vec::Vec;

pub const MAGIC: u16 = 0x4C42;
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 16;
/// Largest payload either side sends or accepts (LIST pages keep responses under it).
pub const MAX_PAYLOAD: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request = 0,
    Response = 1,
    Error = 2,
    /// News from the server that answers no request (request id 0; `msg::Notice`).
    Notice = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub op: u16,
    pub request_id: u32,
    pub length: u32,
}

/// A header that cannot be accepted. When `framing_lost` is set the stream cannot be trusted past this point
/// (the receiver answers with `code` and closes); otherwise the frame's payload is skipped and the stream goes
/// on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameError {
    pub code: ErrorCode,
    pub framing_lost: bool,
    /// The header's op and request id when they could be read (for the error answer).
    pub op: u16,
    pub request_id: u32,
    pub reason: &'static str,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        h[2] = VERSION;
        h[3] = self.kind as u8;
        h[4..6].copy_from_slice(&self.op.to_be_bytes());
        h[8..12].copy_from_slice(&self.request_id.to_be_bytes());
        h[12..16].copy_from_slice(&self.length.to_be_bytes());
        h
    }

    /// Parses a header from the first 16 bytes of `b` (`None` if fewer are available).
    pub fn parse(b: &[u8]) -> Option<Result<Header, FrameError>> {
        let h: &[u8; HEADER_LEN] = b.get(..HEADER_LEN)?.try_into().ok()?;
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let (op, request_id, length) = (be16(4), be32(8), be32(12));
        let err = |code, framing_lost, reason| FrameError { code, framing_lost, op, request_id, reason };
        if be16(0) != MAGIC {
            return Some(Err(FrameError { op: 0, request_id: 0, ..err(ErrorCode::BadMagic, true, "bad magic") }));
        }
        if h[2] != VERSION {
            return Some(Err(err(ErrorCode::BadVersion, true, "unsupported frame version")));
        }
        if length as usize > MAX_PAYLOAD {
            return Some(Err(err(ErrorCode::FrameTooLarge, true, "payload longer than 16384 bytes")));
        }
        let kind = match h[3] {
            0 => Kind::Request,
            1 => Kind::Response,
            2 => Kind::Error,
            3 => Kind::Notice,
            _ => return Some(Err(err(ErrorCode::Malformed, false, "unknown frame kind"))),
        };
        if be16(6) != 0 {
            return Some(Err(err(ErrorCode::Malformed, false, "reserved header bytes are not zero")));
        }
        Some(Ok(Header { kind, op, request_id, length }))
    }
}

/// Builds a whole frame.
pub fn frame(kind: Kind, op: u16, request_id: u32, payload: &[u8], out: &mut Vec<u8>) {
    let h = Header { kind, op, request_id, length: payload.len() as u32 };
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
}

/// Reassembles frames from a byte stream. Holds at most one frame plus what arrived after it; the caller
/// bounds how much it pushes before draining.
#[derive(Default)]
pub struct FrameBuf {
    buf: Vec<u8>,
    /// Bytes of a rejected (but framed) payload still to be skipped.
    skip: usize,
    lost: bool,
}

/// What [`FrameBuf::next_frame`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A complete frame.
    Frame(Header, Vec<u8>),
    /// A bad header; see [`FrameError::framing_lost`].
    Bad(FrameError),
    /// More bytes are needed.
    Pending,
}

impl FrameBuf {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes (ignored once framing is lost).
    pub fn push(&mut self, data: &[u8]) {
        if self.lost {
            return;
        }
        let skipped = self.skip.min(data.len());
        self.skip -= skipped;
        self.buf.extend_from_slice(&data[skipped..]);
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Whether the bytes buffered are whole frames, by their headers' lengths (true when nothing is
    /// buffered, or once framing is lost). A record layer uses it to tell a record that ended a frame from one
    /// that carried only part of one.
    pub fn whole_frames(&self) -> bool {
        if self.lost || self.skip > 0 {
            return self.skip == 0;
        }
        let mut at = 0usize;
        while let Some(h) = self.buf.get(at..at + HEADER_LEN) {
            let len = u32::from_be_bytes([h[12], h[13], h[14], h[15]]) as usize;
            at = at.saturating_add(HEADER_LEN).saturating_add(len);
        }
        at == self.buf.len()
    }

    /// Takes every byte buffered and not yet returned as a frame (a v2 session's first records, which came in
    /// the same read as its HELLO, move to the record layer this way).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.buf)
    }

    /// Whether a framing error has made the stream unusable.
    pub fn framing_lost(&self) -> bool {
        self.lost
    }

    /// The next frame, error or `Pending`.
    pub fn next_frame(&mut self) -> Next {
        if self.lost {
            return Next::Pending;
        }
        let h = match Header::parse(&self.buf) {
            None => return Next::Pending,
            Some(Ok(h)) => h,
            Some(Err(e)) => {
                if e.framing_lost {
                    self.lost = true;
                    self.buf.clear();
                } else {
                    self.discard(HEADER_LEN + e_len(&self.buf));
                }
                return Next::Bad(e);
            }
        };
        let total = HEADER_LEN + h.length as usize;
        if self.buf.len() < total {
            return Next::Pending;
        }
        let payload = self.buf[HEADER_LEN..total].to_vec();
        self.buf.drain(..total);
        Next::Frame(h, payload)
    }

    fn discard(&mut self, n: usize) {
        let now = n.min(self.buf.len());
        self.buf.drain(..now);
        self.skip += n - now;
    }
}

/// The payload length field of a (well-framed) header.
fn e_len(b: &[u8]) -> usize {
    u32::from_be_bytes([b[12], b[13], b[14], b[15]]) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn hb(id: u32) -> Vec<u8> {
        let mut v = Vec::new();
        frame(Kind::Request, 0x0102, id, &[0, 0, 0, 0, 0, 0, 0, 7], &mut v);
        v
    }

    #[test]
    fn header_golden_bytes() {
        let h = Header { kind: Kind::Request, op: 0x0102, request_id: 0x0A0B_0C0D, length: 8 };
        assert_eq!(h.encode(), [0x4C, 0x42, 1, 0, 0x01, 0x02, 0, 0, 0x0A, 0x0B, 0x0C, 0x0D, 0, 0, 0, 8]);
        assert_eq!(Header::parse(&h.encode()), Some(Ok(h)));
        assert_eq!(Header::parse(&h.encode()[..15]), None);
    }

    #[test]
    fn reassembles_byte_by_byte_and_in_bulk() {
        let mut stream = hb(1);
        stream.extend(hb(2));
        let mut fb = FrameBuf::new();
        let mut got = vec![];
        for b in &stream {
            fb.push(core::slice::from_ref(b));
            while let Next::Frame(h, p) = fb.next_frame() {
                got.push((h.request_id, p.len()));
            }
        }
        assert_eq!(got, [(1, 8), (2, 8)]);
        fb.push(&stream);
        assert!(matches!(fb.next_frame(), Next::Frame(h, _) if h.request_id == 1));
        assert!(matches!(fb.next_frame(), Next::Frame(h, _) if h.request_id == 2));
        assert_eq!(fb.next_frame(), Next::Pending);
    }

    #[test]
    fn framing_errors() {
        let mut fb = FrameBuf::new();
        let mut bad = hb(3);
        bad[0] = 0;
        fb.push(&bad);
        assert!(matches!(fb.next_frame(), Next::Bad(FrameError { code: ErrorCode::BadMagic, framing_lost: true, .. })));
        assert!(fb.framing_lost());
        fb.push(&hb(4));
        assert_eq!(fb.next_frame(), Next::Pending, "nothing after lost framing");

        let mut fb = FrameBuf::new();
        let mut big = hb(5);
        big[12..16].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
        fb.push(&big);
        assert!(matches!(
            fb.next_frame(),
            Next::Bad(FrameError { code: ErrorCode::FrameTooLarge, framing_lost: true, .. })
        ));

        let mut v = hb(6);
        v[2] = 2;
        assert!(matches!(Header::parse(&v), Some(Err(FrameError { code: ErrorCode::BadVersion, .. }))));
    }

    #[test]
    fn a_framed_but_bad_header_is_skipped_with_its_payload() {
        let mut fb = FrameBuf::new();
        let mut odd = hb(7);
        odd[3] = 9; // unknown kind
        fb.push(&odd[..10]);
        assert_eq!(fb.next_frame(), Next::Pending);
        fb.push(&odd[10..20]);
        assert!(matches!(
            fb.next_frame(),
            Next::Bad(FrameError { code: ErrorCode::Malformed, framing_lost: false, request_id: 7, .. })
        ));
        fb.push(&odd[20..]);
        fb.push(&hb(8));
        assert!(matches!(fb.next_frame(), Next::Frame(h, _) if h.request_id == 8));
    }
}
