//! The port's Ethernet cable: one UDP datagram carries one whole frame (no FCS), sent to a fixed peer and read
//! from a local address — the format of QEMU's `-netdev socket,udp=PEER,localaddr=LOCAL`, so the model can be
//! joined through a hub to `-netdev user` (QEMU's own ARP, DHCP and TCP forwarding).

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Largest datagram read (a 10000-byte PMTU frame fits).
pub const MAX_FRAME: usize = 10240;

pub struct EthWire {
    socket: UdpSocket,
    peer: SocketAddr,
    buf: Vec<u8>,
}

impl EthWire {
    /// Binds `local` (non-blocking) and sends to `peer`.
    pub fn bind(local: SocketAddr, peer: SocketAddr) -> io::Result<EthWire> {
        let socket = UdpSocket::bind(local)?;
        socket.set_nonblocking(true)?;
        Ok(EthWire { socket, peer, buf: vec![0; MAX_FRAME] })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.socket.send_to(frame, self.peer).map(drop)
    }

    /// The next waiting frame, or `None` when nothing is waiting. ICMP-induced errors from an earlier send
    /// (the peer not listening yet) are skipped.
    pub fn recv(&mut self) -> io::Result<Option<&[u8]>> {
        loop {
            match self.socket.recv_from(&mut self.buf) {
                Ok((n, _)) => return Ok(Some(&self.buf[..n])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Parses `LOCAL,PEER` (two socket addresses).
pub fn parse_pair(v: &str) -> Option<(SocketAddr, SocketAddr)> {
    let (a, b) = v.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}
