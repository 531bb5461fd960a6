//! Leasebox control protocol (version 2; [`v2`] holds its Noise handshake and record layer) — the normative description is `docs/wire-protocol.md`; this crate
//! is its executable form, shared by the appliance and its clients.
//!
//! Every frame is a 16-byte big-endian header followed by a payload of at most [`MAX_PAYLOAD`] bytes.
//! Requests carry an opcode and a client-chosen request id; the answer is a response frame with the same
//! opcode and id, or an error frame carrying an [`ErrorCode`] and a message. Decoding never panics: every
//! malformed input is a [`DecodeError`] that names what was wrong.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

mod codec;
mod frame;
pub mod key;
mod msg;
pub mod v2;

pub use codec::{DecodeError, Reader, Writer};
pub use frame::{FrameBuf, FrameError, HEADER_LEN, Header, Kind, MAGIC, MAX_PAYLOAD, Next, VERSION, frame};
pub use msg::*;
