//! The dataplane of the model: a RoCEv2 RC responder. [`wire`] encodes and decodes the frames
//! of the virtual cable, [`responder`] is the sans-I/O state machine over the HCA's tables, [`udp`] moves frames
//! between a UDP socket and the responder and can record them in a pcap.

pub mod pcap;
pub mod responder;
pub mod udp;
pub mod wire;
