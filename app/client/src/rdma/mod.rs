//! RDMA requester for the client library, the verifier and end-to-end tests: RC RDMA WRITE / READ toward an
//! appliance QP, with completions in rdma-core's terms ([`WcStatus`]). [`Requester`] is backend-neutral;
//! [`SoftRoce`] implements it in software over UDP (one datagram per RoCEv2 frame, the model's cable), and
//! `verbs::Verbs` (feature `verbs`) through libibverbs.
//!
//! Two ways to post: from a byte slice (`post_write`, and `post_read` + `read_data`: the requester keeps its
//! own copy, which is what `leasectl verify` uses), or zero copy from scatter/gather pieces of the caller's
//! memory (`post_write_sg` / `post_read_sg`, [`Sge`]), registered where the backend needs it
//! ([`MemoryDomain`]).
//!
//! Layers (sans-I/O): [`wire`] and [`icrc`] encode and check frames, [`rc`] is the sans-I/O requester state
//! machine (IBTA Vol. 1 ch. 9.7 reliable service: PSNs, ACK/NAK, transport timer, retries), [`soft`] moves
//! its frames over a socket.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub mod icrc;
pub mod pcap;
pub mod rc;
mod sg;
pub mod soft;
pub mod status;
#[cfg(feature = "verbs")]
#[allow(unsafe_code)]
pub mod verbs;
pub mod wire;

pub use rc::{RcConfig, RcRequester};
pub use sg::Sge;
pub use soft::{Resolve, SoftConfig, SoftCounters, SoftRoce};
pub use status::{WcOpcode, WcStatus};

/// One side of an RC connection: what a requester sends in ALLOC and what the appliance answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub qpn: u32,
    /// The first PSN this side sends (the peer's expected receive PSN).
    pub psn: u32,
    /// RoCEv2 GID; IPv4 addresses are IPv4-mapped (`::ffff:a.b.c.d`).
    pub gid: [u8; 16],
    pub mac: [u8; 6],
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub mtu: u32,
}

/// How a requester learned the MAC its frames go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacSource {
    /// An ARP reply on the cable.
    Arp,
    /// Given by the user (a flag or the configuration file).
    Flag,
    /// The remote endpoint's MAC (from ALLOC's answer, when it carries one).
    Endpoint,
    /// A fixed placeholder (ALLOC's answer carried no MAC): no port takes RoCE frames to it.
    Placeholder,
}

impl MacSource {
    pub fn name(self) -> &'static str {
        match self {
            MacSource::Arp => "arp",
            MacSource::Flag => "flag",
            MacSource::Endpoint => "endpoint",
            MacSource::Placeholder => "placeholder",
        }
    }
}

/// A MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A work completion (`struct ibv_wc`, the fields a verifier needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes transferred (the message length on success, 0 otherwise).
    pub byte_len: u32,
    /// When the status was decided: the ACK/NAK/response's arrival, or the transport timer's expiry.
    pub at: Instant,
}

/// Requester QP state (the subset of `enum ibv_qp_state` a requester passes through).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Rts,
    Err,
}

/// Where memory must be registered before a requester's scatter/gather work requests may name it: the
/// verbs backend's device context (its protection domain). The software requester has none: it reads and
/// writes the memory itself.
pub trait MemoryDomain: Send + Sync {
    /// Registers `len` bytes at `addr` for local access (LOCAL_WRITE: a READ's data lands there); deregistered
    /// when the returned registration is dropped.
    ///
    /// # Safety
    ///
    /// The memory stays valid (allocated, not unmapped) until the registration is dropped.
    #[allow(unsafe_code)]
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Box<dyn Registration>, String>;
    /// A short name for messages (the device).
    fn name(&self) -> String;
}

/// A registration made by [`MemoryDomain::register`]; dropping it deregisters the memory.
pub trait Registration: Send + Sync {
    /// The local key work requests name the memory with.
    fn lkey(&self) -> u32;
}

/// An RC requester: posts RDMA WRITE / READ and reports completions in order.
pub trait Requester {
    /// Our QP parameters, to send in ALLOC.
    fn local(&self) -> QpEndpoint;
    /// Moves our QP to RTS toward the appliance's QP.
    fn connect(&mut self, remote: &QpEndpoint) -> Result<(), String>;
    /// An RDMA WRITE of `data`, copied into the requester's own buffers before this returns.
    fn post_write(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, data: &[u8]) -> Result<(), String>;
    /// An RDMA READ of `len` bytes into the requester's own buffers ([`Requester::read_data`] hands them out).
    fn post_read(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, len: u32) -> Result<(), String>;
    /// The most pieces one scatter/gather work request may have (verbs: what the device takes, `max_sge`
    /// for WRITEs and `max_sge_rd` for READs, whichever is smaller; the software requester:
    /// [`soft::SOFT_MAX_SGE`]).
    fn max_sge(&self) -> usize;
    /// Where memory named by scatter/gather work requests must be registered (`None`: nowhere, lkeys are
    /// ignored).
    fn domain(&self) -> Option<std::sync::Arc<dyn MemoryDomain>> {
        None
    }
    /// Work requests that may still be posted now (verbs: the send queue's and the shared completion queue's
    /// room); the software requester queues any number.
    fn room(&self) -> usize {
        usize::MAX
    }
    /// An RDMA WRITE of the bytes in `sg`, in order, straight from the caller's memory (zero copy: no bounce
    /// buffer; the software requester builds each frame from the pieces, a NIC reads them by DMA).
    ///
    /// # Safety
    ///
    /// Every piece's memory stays valid for reads, registered under its `lkey` in [`Requester::domain`] (where
    /// there is one), and unwritten by anyone else until this request's completion has been returned by
    /// [`Requester::poll`] or the requester has been dropped.
    #[allow(unsafe_code)]
    unsafe fn post_write_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String>;
    /// An RDMA READ of `sg`'s total length, its bytes landing straight in the pieces, in order.
    ///
    /// # Safety
    ///
    /// As for [`Requester::post_write_sg`], with the memory valid for writes and neither read nor written by
    /// anyone else meanwhile.
    #[allow(unsafe_code)]
    unsafe fn post_read_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String>;
    /// Waits up to `max_wait` for at least one completion and returns every completion ready (possibly none).
    fn poll(&mut self, max_wait: Duration) -> Vec<Completion>;
    /// The bytes a successful RDMA READ posted with [`Requester::post_read`] returned (taken: a second call gives
    /// `None`).
    fn read_data(&mut self, wr_id: u64) -> Option<Vec<u8>>;
    fn qp_state(&self) -> QpState;
    /// The MAC our frames go to and how it was learned, once connected; `None` where the backend does not
    /// address frames itself (verbs: the kernel's neighbour table does).
    fn remote_mac(&self) -> Option<(MacSource, [u8; 6])> {
        None
    }
}

/// The IPv4-mapped GID RoCEv2 uses for an IPv4 address (`::ffff:a.b.c.d`).
pub fn gid_from_ipv4(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The IPv4 address of an IPv4-mapped GID.
pub fn ipv4_from_gid(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    std::net::Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// The IB path MTU enum value (`enum ibv_mtu`, 1 = 256 … 5 = 4096) of a byte count.
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gids() {
        let g = gid_from_ipv4(Ipv4Addr::new(192, 0, 2, 7));
        assert_eq!(g, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 0, 2, 7]);
        assert_eq!(ipv4_from_gid(&g), Some(Ipv4Addr::new(192, 0, 2, 7)));
        assert_eq!(ipv4_from_gid(&[0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(mtu_enum(1024), Some(3));
        assert_eq!(mtu_enum(1000), None);
        assert_eq!(mac_string(&[0x02, 0x4C, 0, 0, 0x0A, 0xFF]), "02:4c:00:00:0a:ff");
        assert_eq!(MacSource::Arp.name(), "arp");
    }
}
