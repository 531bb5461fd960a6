//! The virtual cable's socket: each UDP datagram carries one whole Ethernet frame (`docs/reference/roce.md`).
//! Received frames go to [`responder::handle_into`]; replies go back to the datagram's source address. This is
//! the only I/O of the dataplane; the caller owns the loop, so it can interleave the command side's polling and
//! choose how to share the tables.

use std::fs::File;
use std::io::{self, BufWriter};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use super::pcap::PcapWriter;
use super::responder::{self, Disposition, Tables};

/// Default address of the responder.
pub const DEFAULT_ADDR: &str = "127.0.0.1:4791";
/// Largest datagram: a 4096-byte MTU frame with all headers fits easily.
pub const MAX_DATAGRAM: usize = 9216;

pub struct UdpResponder {
    socket: UdpSocket,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    buf: Vec<u8>,
}

impl UdpResponder {
    /// Binds `addr`; `recv_timeout` bounds each [`UdpResponder::poll`] (no unbounded wait).
    pub fn bind(addr: &str, recv_timeout: Duration) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        socket.set_read_timeout(Some(recv_timeout.max(Duration::from_millis(1))))?;
        Ok(UdpResponder { socket, pcap: None, buf: vec![0; MAX_DATAGRAM] })
    }

    /// Records every received and sent frame in a new pcap file at `path`.
    pub fn with_pcap(mut self, path: &Path) -> io::Result<Self> {
        self.pcap = Some(PcapWriter::new(BufWriter::new(File::create(path)?))?);
        Ok(self)
    }

    /// Non-blocking mode: [`UdpResponder::poll`] returns `Ok(None)` at once when nothing is waiting (the model's
    /// polling loop uses this).
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.socket.set_nonblocking(on)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The socket itself, for a loop that waits on it between passes (the hosted model thread's idle sleep
    /// ends when a datagram arrives).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Waits up to the receive timeout for one datagram and handles it. `Ok(None)` when nothing arrived.
    pub fn poll(&mut self, tables: &mut dyn Tables) -> io::Result<Option<Disposition>> {
        let (n, from) = match self.socket.recv_from(&mut self.buf) {
            Ok(r) => r,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
            Err(e) => return Err(e),
        };
        let frame = &self.buf[..n];
        if let Some(p) = &mut self.pcap {
            p.frame(frame)?;
        }
        // Replies go out as they are built, so a large READ never sits in memory whole.
        let (socket, pcap) = (&self.socket, &mut self.pcap);
        let mut failed = None;
        let d = responder::handle_into(tables, frame, &mut |f| {
            if failed.is_some() {
                return;
            }
            let r = match pcap {
                Some(p) => p.frame(&f),
                None => Ok(()),
            };
            if let Err(e) = r.and_then(|()| socket.send_to(&f, from).map(drop)) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Some(d))
    }
}
