//! The decoder check shared by the fuzz target (`fuzz_targets/decode.rs`, libFuzzer, nightly) and its
//! deterministic stable twin (`app/proto/tests/decode_twin.rs`, which includes this file as a module).
//!
//! One input is a byte stream as a peer could send it. Its first byte chooses how the stream is cut into
//! `FrameBuf::push` calls (bit 7 set: all at once; otherwise chunks of 1 to 64 bytes), the rest is the stream.
//! Every complete frame goes through `Request::decode`, `Response::decode`, `ErrorBody::decode` and
//! `Notice::decode`. Checked:
//! - no panic, whatever the bytes;
//! - every accepted request, response, error body and notice re-encodes to exactly the payload it came from (so
//!   decode is the inverse of encode and nothing is silently normalized), and a request frame re-encodes to
//!   the same 16-byte header;
//! - a frame never exceeds `MAX_PAYLOAD` and lost framing stays lost.

use leasebox_proto::{
    ErrorBody, FrameBuf, HEADER_LEN, Header, Kind, MAX_MESSAGE, MAX_PAYLOAD, Next, Notice, Op, Request, Response,
};

/// What one input exercised (the twin test sums these to show its inputs reach every decoder).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub frames: u64,
    pub bad_headers: u64,
    pub framing_lost: u64,
    pub requests: u64,
    pub responses: u64,
    pub errors: u64,
    pub notices: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.frames += o.frames;
        self.bad_headers += o.bad_headers;
        self.framing_lost += o.framing_lost;
        self.requests += o.requests;
        self.responses += o.responses;
        self.errors += o.errors;
        self.notices += o.notices;
    }
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let Some((&mode, stream)) = data.split_first() else { return n };
    let chunk = if mode & 0x80 != 0 { stream.len().max(1) } else { usize::from(mode % 64) + 1 };
    let mut fb = FrameBuf::new();
    for piece in stream.chunks(chunk) {
        fb.push(piece);
        assert!(fb.buffered() <= stream.len());
        loop {
            match fb.next_frame() {
                Next::Pending => break,
                Next::Bad(e) => {
                    n.bad_headers += 1;
                    assert!(!e.reason.is_empty());
                    if e.framing_lost {
                        n.framing_lost += 1;
                        assert!(fb.framing_lost());
                    }
                }
                Next::Frame(h, payload) => {
                    n.frames += 1;
                    frame(h, &payload, &mut n);
                }
            }
        }
    }
    if fb.framing_lost() {
        fb.push(stream);
        assert_eq!(fb.next_frame(), Next::Pending, "nothing is delivered after framing is lost");
    }
    n
}

fn frame(h: Header, payload: &[u8], n: &mut Counts) {
    assert_eq!(payload.len(), h.length as usize);
    assert!(payload.len() <= MAX_PAYLOAD);
    assert_eq!(Header::parse(&h.encode()), Some(Ok(h)), "a delivered header re-parses to itself");
    if let Some(op) = Op::from_raw(h.op) {
        if let Ok(req) = Request::decode(op, payload) {
            n.requests += 1;
            assert_eq!(req.op(), op);
            let mut f = Vec::new();
            req.encode(h.request_id, &mut f);
            let as_request = Header { kind: Kind::Request, ..h };
            assert_eq!(f[..HEADER_LEN], as_request.encode(), "{req:?}: header");
            assert_eq!(&f[HEADER_LEN..], payload, "{req:?}: payload");
        }
        if let Ok(resp) = Response::decode(op, payload) {
            n.responses += 1;
            let mut p = Vec::new();
            resp.encode_payload(&mut p);
            assert_eq!(p, payload, "{op:?} {resp:?}");
        }
    }
    if let Ok(notice) = Notice::decode(payload) {
        n.notices += 1;
        let mut p = Vec::new();
        notice.encode_payload(&mut p);
        assert_eq!(p, payload, "{notice:?}");
    }
    if let Ok(e) = ErrorBody::decode(payload) {
        n.errors += 1;
        assert!(e.message.len() <= MAX_MESSAGE);
        let mut p = Vec::new();
        e.encode_payload(&mut p);
        assert_eq!(p, payload, "{e:?}");
    }
}
