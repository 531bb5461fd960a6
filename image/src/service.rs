//! The seam between the network loop ([`crate::net`]) and whatever serves the control port: a sans-I/O byte
//! stream service (sans-I/O). The loop moves bytes between smoltcp sockets and the service and tells it
//! about connections; the service never sees a socket, so the same core runs under std TCP in hosted mode.

/// A byte-stream service driven by the network loop (sans-I/O: it never touches sockets).
pub trait StreamService {
    /// A connection from `peer` (its address, when the socket knows it) was accepted; returns false to refuse
    /// it (the loop still sends whatever `output` yields for it, then closes).
    fn open(&mut self, conn: ConnId, peer: Option<core::net::IpAddr>, now_ms: u64) -> bool;
    /// Bytes received on `conn`.
    fn input(&mut self, conn: ConnId, data: &[u8], now_ms: u64);
    /// Copies pending output for `conn` into `buf`; returns the number of bytes written.
    fn output(&mut self, conn: ConnId, buf: &mut [u8]) -> usize;
    /// Whether the service wants `conn` closed once its output is drained.
    fn wants_close(&self, conn: ConnId) -> bool;
    /// The connection is gone (peer closed, reset, or closed by request).
    fn closed(&mut self, conn: ConnId, now_ms: u64);
    /// Called every loop pass (timers).
    fn tick(&mut self, now_ms: u64);
}

/// A connection's identity, unique per connection (never reused within a boot): the session core's own.
pub use leasebox_session::ConnId;
