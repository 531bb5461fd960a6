//! `SoftRoce`: the RC requester of [`super::rc`] over a `std::net::UdpSocket`, one datagram per whole Ethernet
//! frame ([`super::wire`]). Two cables look like this:
//!
//! * the ConnectX-5 model's responder socket, point to point (docs/hca-model.md "RoCEv2 responder"; the
//!   default, 127.0.0.1:4791): the model answers to the datagram's source address, in frames addressed from
//!   the lease QP's path — to the MAC and GID we gave in ALLOC (`client_mac`, `client_gid`: ours), from the
//!   appliance's GID and port MAC; our frames carry our IPv4 and MAC, the appliance's IPv4 from its
//!   IPv4-mapped GID and the appliance's MAC from ALLOC's answer (`server_mac`): the model drops RoCE frames
//!   that are not for its port's MAC and one of its GIDs;
//! * an Ethernet segment (a QEMU hub port: `-netdev socket,udp=…,localaddr=…`), shared with the model's port,
//!   QEMU's user network and whoever else is on the hub. There the appliance's MAC is learned by ARP
//!   ([`Resolve::Arp`]), and frames not for our MAC or not RoCE are set aside ([`SoftCounters::frames_other`]).
//!
//! On either cable `SoftRoce` answers ARP requests for its own IPv4, so the appliance can resolve us.
//!
//! Everything happens on the caller's thread: packets go out when posted and from [`Requester::poll`], which
//! also runs the transport timer; ARP requests are answered whenever the socket is read.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufWriter};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::pcap::PcapWriter;
use super::rc::{RcConfig, RcRequester, RcStats};
use super::wire::{self, Addr, Arp, ArpOp, ROCEV2_PORT};
use super::{Completion, MacSource, QpEndpoint, QpState, Requester, Sge, gid_from_ipv4, ipv4_from_gid, mtu_enum};

/// Our default MAC (locally administered).
pub const DEFAULT_LOCAL_MAC: [u8; 6] = [0x02, 0x4C, 0x42, 0x00, 0x00, 0x01];
/// The appliance's MAC when neither the configuration nor its endpoint gives one (an ALLOC answer with
/// `server_mac` 0). The model's port drops frames to it: it is only a well-formed stand-in.
pub const PLACEHOLDER_REMOTE_MAC: [u8; 6] = [0x02, 0x4C, 0x42, 0x00, 0x00, 0x02];
/// ARP's default wait: three requests, half a second apart.
pub const ARP_DEADLINE: Duration = Duration::from_millis(1500);
pub const ARP_TRIES: u32 = 3;

/// How [`SoftRoce`] learns the MAC its frames go to (the appliance's RDMA port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    /// The remote endpoint's MAC, or [`PLACEHOLDER_REMOTE_MAC`] when that is zero: the point-to-point cable
    /// (the default).
    Endpoint,
    /// This MAC (given by the user).
    Fixed([u8; 6]),
    /// ARP for the appliance's IPv4 (from its GID) on the cable before the first frame: `tries` broadcast
    /// requests spread evenly over `deadline`; the first reply from that IPv4 wins.
    Arp { deadline: Duration, tries: u32 },
}

impl Resolve {
    /// ARP with the default wait ([`ARP_TRIES`] requests in [`ARP_DEADLINE`]).
    pub fn arp() -> Resolve {
        Resolve::Arp { deadline: ARP_DEADLINE, tries: ARP_TRIES }
    }
}
/// Largest frame we receive (4096-byte MTU plus headers fits).
const MAX_FRAME: usize = 9216;
/// Waits closer than this to a deadline poll the socket instead of blocking on it (see `SoftRoce::receive`).
const COARSE_SLACK: Duration = Duration::from_millis(25);
/// Sleep between two non-blocking receives: the error on a timer's or a frame's time.
const FINE_STEP: Duration = Duration::from_micros(50);
/// Frames one [`Requester::poll`] takes in without waiting before it looks at its completions.
const DRAIN_FRAMES: usize = 256;
/// Pieces one scatter/gather work request may have ([`Requester::max_sge`]): the software requester gathers
/// a packet's payload from any number of pieces, so this is only a bound on what it keeps per request, set to
/// the order of a real NIC's (a ConnectX-5 takes 30).
pub const SOFT_MAX_SGE: usize = 32;

#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Our UDP socket (default 127.0.0.1:0).
    pub bind: SocketAddr,
    /// The responder's UDP socket (default 127.0.0.1:4791).
    pub peer: SocketAddr,
    /// Source IPv4 in frames and our GID; `None`: the bound address (127.0.0.1 when unspecified).
    pub local_ip: Option<Ipv4Addr>,
    pub local_mac: [u8; 6],
    /// How the destination MAC is learned (default [`Resolve::Endpoint`]).
    pub resolve: Resolve,
    /// Our QPN; `None`: 0x10000 | our UDP port.
    pub qpn: Option<u32>,
    /// Our first PSN; `None`: random.
    pub psn: Option<u32>,
    /// Our path MTU in bytes; the connection uses the smaller of ours and the remote's.
    pub mtu: u32,
    pub rc: RcConfig,
    /// UDP source port of frames (flow entropy); `None`: 0xC000 | (QPN & 0x3FFF), as the model does.
    pub udp_sport: Option<u16>,
    /// Writes every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            peer: SocketAddr::from(([127, 0, 0, 1], ROCEV2_PORT)),
            local_ip: None,
            local_mac: DEFAULT_LOCAL_MAC,
            resolve: Resolve::Endpoint,
            qpn: None,
            psn: None,
            mtu: 4096,
            rc: RcConfig::default(),
            udp_sport: None,
            pcap: None,
        }
    }
}

/// Frame counters of the cable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftCounters {
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Received RoCEv2 or ARP frames failing a [`wire::decode`] / [`wire::decode_arp`] check (and runts).
    pub frames_bad: u64,
    /// Received frames set aside: for another station's MAC, neither RoCEv2 nor ARP, ARP not for us, or an
    /// ARP reply nobody waited for.
    pub frames_other: u64,
    /// ARP requests sent (resolving the appliance's MAC).
    pub arp_requests: u64,
    /// ARP replies sent (answering a request for our IPv4).
    pub arp_replies: u64,
    /// Socket errors on send or receive (e.g. ICMP port unreachable while the model is not listening).
    pub socket_errors: u64,
}

pub struct SoftRoce {
    sock: UdpSocket,
    local: QpEndpoint,
    local_ip: Ipv4Addr,
    resolve: Resolve,
    /// The MAC frames go to and how it was learned, once connected.
    remote_mac: Option<(MacSource, [u8; 6])>,
    sport: u16,
    /// Frame addressing once connected.
    addr: Option<Addr>,
    core: RcRequester,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    tx: Vec<u8>,
    rx: Vec<u8>,
    counters: SoftCounters,
    /// The socket's current mode (see `SoftRoce::receive`).
    blocking: bool,
}

fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish() as u32
}

impl SoftRoce {
    pub fn new(cfg: SoftConfig) -> io::Result<SoftRoce> {
        let bad = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
        if mtu_enum(cfg.mtu).is_none() {
            return Err(bad(format!("MTU {} is not 256/512/1024/2048/4096", cfg.mtu)));
        }
        let sock = UdpSocket::bind(cfg.bind)?;
        sock.connect(cfg.peer)?;
        let me = sock.local_addr()?;
        let local_ip = cfg.local_ip.unwrap_or(match me {
            SocketAddr::V4(a) if !a.ip().is_unspecified() => *a.ip(),
            _ => Ipv4Addr::LOCALHOST,
        });
        let qpn = cfg.qpn.unwrap_or(0x10000 | me.port() as u32);
        let psn = cfg.psn.unwrap_or_else(random_u32) & wire::PSN_MASK;
        let core = RcRequester::new(cfg.rc, qpn, psn).map_err(bad)?;
        let pcap = match &cfg.pcap {
            Some(p) => Some(PcapWriter::new(BufWriter::new(File::create(p)?))?),
            None => None,
        };
        Ok(SoftRoce {
            sock,
            local: QpEndpoint { qpn, psn, gid: gid_from_ipv4(local_ip), mac: cfg.local_mac, mtu: cfg.mtu },
            local_ip,
            resolve: cfg.resolve,
            remote_mac: None,
            sport: cfg.udp_sport.unwrap_or(0xC000 | (qpn & 0x3FFF) as u16),
            addr: None,
            core,
            pcap,
            tx: Vec::with_capacity(MAX_FRAME),
            rx: vec![0; MAX_FRAME],
            counters: SoftCounters::default(),
            blocking: true,
        })
    }

    /// Our UDP socket's address.
    pub fn socket_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn counters(&self) -> SoftCounters {
        self.counters
    }

    pub fn stats(&self) -> RcStats {
        self.core.stats()
    }

    /// The requester state machine (window, configuration).
    pub fn core(&self) -> &RcRequester {
        &self.core
    }

    fn send(&mut self, now: Instant) {
        let Some(addr) = self.addr else { return };
        let SoftRoce { sock, core, pcap, tx, counters, .. } = self;
        core.transmit(now, |bth, reth, parts| {
            let p = wire::Packet { addr, bth: *bth, reth: reth.copied(), aeth: None, imm: None, payload: &[] };
            if wire::encode_gather(&p, parts, tx).is_err() {
                return; // the core only builds layouts encode accepts
            }
            if let Some(w) = pcap.as_mut() {
                let _ = w.frame(tx);
            }
            match sock.send(tx) {
                Ok(_) => counters.frames_sent += 1,
                // Lost on the cable; the transport timer resends it.
                Err(_) => counters.socket_errors += 1,
            }
        });
    }

    /// Sends one frame built outside the RC core (ARP), into the pcap file too.
    fn send_raw(&mut self, frame: &[u8]) -> bool {
        if let Some(w) = self.pcap.as_mut() {
            let _ = w.frame(frame);
        }
        match self.sock.send(frame) {
            Ok(_) => {
                self.counters.frames_sent += 1;
                true
            }
            Err(_) => {
                self.counters.socket_errors += 1;
                false
            }
        }
    }

    /// Receives at most one frame into `self.rx`, waiting until `until`; returns its length.
    ///
    /// Linux rounds a socket receive timeout up to whole jiffies (up to 10 ms late at HZ=100), far too coarse
    /// for a 4 ms transport timer; so the socket blocks only while the deadline is more than
    /// [`COARSE_SLACK`] away, and the last stretch polls it without blocking between short sleeps.
    fn receive_frame(&mut self, until: Instant) -> Option<usize> {
        let wait = until.saturating_duration_since(Instant::now());
        let blocking = wait > COARSE_SLACK;
        if blocking != self.blocking {
            if self.sock.set_nonblocking(!blocking).is_err() {
                self.counters.socket_errors += 1;
                return None;
            }
            self.blocking = blocking;
        }
        if blocking && self.sock.set_read_timeout(Some(wait - COARSE_SLACK)).is_err() {
            self.counters.socket_errors += 1;
            return None;
        }
        match self.sock.recv(&mut self.rx) {
            Ok(n) => {
                self.counters.frames_received += 1;
                if let Some(w) = self.pcap.as_mut() {
                    let _ = w.frame(&self.rx[..n]);
                }
                Some(n)
            }
            Err(e) => {
                // A socket error (e.g. ICMP port unreachable) returns at once even from a blocking socket: pause
                // as for a non-blocking poll, so callers looping until a deadline do not spin.
                let error = !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
                if error {
                    self.counters.socket_errors += 1;
                }
                if !blocking || error {
                    std::thread::sleep(wait.min(FINE_STEP));
                }
                None
            }
        }
    }

    /// Sorts the `n`-byte frame in `self.rx`: a RoCEv2 packet for us goes to the RC core, an ARP request for
    /// our IPv4 is answered; an ARP reply for us is returned (to [`SoftRoce::arp`]); the rest is counted.
    fn accept(&mut self, n: usize, now: Instant) -> Option<Arp> {
        let frame = &self.rx[..n];
        let Some(dst) = wire::dst_mac(frame).filter(|_| n >= wire::ETH_LEN) else {
            self.counters.frames_bad += 1;
            return None;
        };
        if !wire::for_station(dst, self.local.mac) {
            self.counters.frames_other += 1;
            return None;
        }
        if wire::ethertype(frame) == Some(wire::ETHERTYPE_ARP) {
            let arp = match wire::decode_arp(frame) {
                Ok(a) => a,
                Err(_) => {
                    self.counters.frames_bad += 1;
                    return None;
                }
            };
            return match arp.op {
                ArpOp::Request if arp.target_ip == self.local_ip => {
                    let mut out = Vec::with_capacity(wire::ETH_MIN_LEN);
                    wire::encode_arp(&arp.reply_from(self.local.mac), &mut out);
                    if self.send_raw(&out) {
                        self.counters.arp_replies += 1;
                    }
                    None
                }
                ArpOp::Reply if arp.target_ip == self.local_ip => Some(arp),
                _ => {
                    self.counters.frames_other += 1;
                    None
                }
            };
        }
        if !wire::is_rocev2(frame) {
            self.counters.frames_other += 1;
            return None;
        }
        match wire::decode(frame) {
            Ok(p) => self.core.handle(now, &p),
            Err(_) => self.counters.frames_bad += 1,
        }
        None
    }

    /// Receives and sorts at most one frame, waiting until `until`. Returns false when nothing arrived.
    fn receive(&mut self, until: Instant) -> bool {
        let Some(n) = self.receive_frame(until) else { return false };
        if self.accept(n, Instant::now()).is_some() {
            self.counters.frames_other += 1; // a reply nobody is waiting for
        }
        true
    }

    /// The MAC of `ip` on the cable: `tries` broadcast requests spread over `deadline`, the first reply whose
    /// sender is `ip` wins. Frames arriving meanwhile are sorted as usual (RoCE to the core, our own ARP
    /// requests answered).
    fn arp(&mut self, ip: Ipv4Addr, deadline: Duration, tries: u32) -> Result<[u8; 6], String> {
        let tries = tries.max(1);
        let mut req = Vec::with_capacity(wire::ETH_MIN_LEN);
        wire::encode_arp(&Arp::request(self.local.mac, self.local_ip, ip), &mut req);
        let start = Instant::now();
        for k in 1..=tries {
            if self.send_raw(&req) {
                self.counters.arp_requests += 1;
            }
            let until = start + deadline * k / tries;
            while Instant::now() < until {
                let Some(n) = self.receive_frame(until) else { continue };
                match self.accept(n, Instant::now()) {
                    Some(a) if a.op == ArpOp::Reply && a.sender_ip == ip => return Ok(a.sender_mac),
                    Some(_) => self.counters.frames_other += 1,
                    None => {}
                }
            }
        }
        let (me, peer) = (self.sock.local_addr().ok(), self.sock.peer_addr().ok());
        let at = |a: Option<SocketAddr>| a.map_or("?".to_string(), |a| a.to_string());
        let errors = match self.counters.socket_errors {
            0 => String::new(),
            n => format!(" ({n} socket error(s): is anything listening at {}?)", at(peer)),
        };
        Err(format!(
            "no ARP reply for {ip} (the appliance's RDMA address) on the cable {} → {} within {:.1} s ({tries} \
             request(s) as {} at {}){errors}: is the appliance's port on this segment? Give its MAC instead \
             (verify --remote-mac MAC, or rdma_remote_mac in the configuration file)",
            at(me),
            at(peer),
            deadline.as_secs_f64(),
            self.local_ip,
            super::mac_string(&self.local.mac),
        ))
    }
}

impl Requester for SoftRoce {
    fn local(&self) -> QpEndpoint {
        self.local
    }

    fn connect(&mut self, remote: &QpEndpoint) -> Result<(), String> {
        let Some(remote_ip) = ipv4_from_gid(&remote.gid) else {
            return Err(format!("remote GID {:02x?} is not IPv4-mapped (RoCEv2 over IPv4)", remote.gid));
        };
        let (source, dst_mac) = match self.resolve {
            Resolve::Fixed(mac) => (MacSource::Flag, mac),
            Resolve::Endpoint if remote.mac == [0; 6] => (MacSource::Placeholder, PLACEHOLDER_REMOTE_MAC),
            Resolve::Endpoint => (MacSource::Endpoint, remote.mac),
            Resolve::Arp { deadline, tries } => (MacSource::Arp, self.arp(remote_ip, deadline, tries)?),
        };
        let mtu = remote.mtu.min(self.local.mtu);
        self.core.connect(remote.qpn, mtu)?;
        self.remote_mac = Some((source, dst_mac));
        self.addr = Some(Addr {
            src_mac: self.local.mac,
            dst_mac,
            src_ip: self.local_ip,
            dst_ip: remote_ip,
            src_port: self.sport,
            dst_port: ROCEV2_PORT,
            tos: 0,
            ttl: 64,
        });
        Ok(())
    }

    fn post_write(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, data: &[u8]) -> Result<(), String> {
        let now = Instant::now();
        self.core.post_write(now, wr_id, remote_addr, rkey, data)?;
        self.send(now);
        Ok(())
    }

    fn post_read(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, len: u32) -> Result<(), String> {
        let now = Instant::now();
        self.core.post_read(now, wr_id, remote_addr, rkey, len)?;
        self.send(now);
        Ok(())
    }

    fn max_sge(&self) -> usize {
        SOFT_MAX_SGE
    }

    #[allow(unsafe_code)]
    unsafe fn post_write_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String> {
        if sg.len() > SOFT_MAX_SGE {
            return Err(format!("{} pieces exceed the {SOFT_MAX_SGE} a work request takes", sg.len()));
        }
        let now = Instant::now();
        // SAFETY: the trait's contract is the core's: the pieces stay valid until this request's completion is
        // returned by `poll` (which takes it from the core) or the requester is dropped.
        unsafe { self.core.post_write_sg(now, wr_id, remote_addr, rkey, sg) }?;
        self.send(now);
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn post_read_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String> {
        if sg.len() > SOFT_MAX_SGE {
            return Err(format!("{} pieces exceed the {SOFT_MAX_SGE} a work request takes", sg.len()));
        }
        let now = Instant::now();
        // SAFETY: as in `post_write_sg`.
        unsafe { self.core.post_read_sg(now, wr_id, remote_addr, rkey, sg) }?;
        self.send(now);
        Ok(())
    }

    fn poll(&mut self, max_wait: Duration) -> Vec<Completion> {
        let end = Instant::now() + max_wait;
        loop {
            let now = Instant::now();
            self.core.on_timer(now);
            self.send(now);
            // What has arrived already is taken in without waiting, so a poll with no time to wait (the
            // progress thread's, across many leases) still sees its answers.
            let mut taken = 0;
            while taken < DRAIN_FRAMES && self.receive(now) {
                taken += 1;
            }
            if taken > 0 {
                self.core.on_timer(now);
                self.send(now);
            }
            if self.core.has_completions() || now >= end {
                if let Some(w) = self.pcap.as_mut() {
                    let _ = w.flush();
                }
                return self.core.take_completions();
            }
            let until = self.core.next_deadline().map_or(end, |d| d.min(end));
            if until > now {
                self.receive(until);
            }
        }
    }

    fn read_data(&mut self, wr_id: u64) -> Option<Vec<u8>> {
        self.core.take_read(wr_id)
    }

    fn qp_state(&self) -> QpState {
        self.core.state()
    }

    fn remote_mac(&self) -> Option<(MacSource, [u8; 6])> {
        self.remote_mac
    }
}

#[cfg(test)]
mod tests {
    //! Against a tiny fake responder of our own on a thread (not the model): WRITE into its memory, READ
    //! back, NAKs, silence, a lost packet.

    use super::super::WcStatus;
    use super::super::rc::psn_add;
    use super::super::wire::{Aeth, Bth, NakCode, Packet, opcode};
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::JoinHandle;

    const BASE: u64 = 0x10_0000;
    const RKEY: u32 = 0x1234_5600;
    const RESP_QPN: u32 = 0x42;

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Normal,
        /// NAK remote access error to every request.
        NakAccess,
        Silent,
        /// Drops the first packet carrying this PSN (the next one is then ahead: sequence NAK).
        DropOnce(u32),
        /// Normal, on an Ethernet segment: owns [`REMOTE_IP`] at this MAC, answers ARP for it from the second
        /// request on (after some traffic that is not for the requester), and checks every RoCE frame is sent
        /// to this MAC.
        Arp([u8; 6]),
    }

    /// The responder's IPv4 (its GID's).
    const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 9);

    struct Fake {
        stop: Arc<AtomicBool>,
        handle: Option<JoinHandle<Vec<u8>>>,
        addr: SocketAddr,
    }

    impl Fake {
        fn start(mode: Mode, mtu: u32, first_psn: u32) -> Fake {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
            let addr = sock.local_addr().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let handle = std::thread::spawn(move || serve(sock, s, mode, mtu, first_psn));
            Fake { stop, handle: Some(handle), addr }
        }

        /// Stops the responder and returns its memory.
        fn finish(mut self) -> Vec<u8> {
            self.stop.store(true, Ordering::Relaxed);
            self.handle.take().unwrap().join().unwrap()
        }
    }

    fn serve(sock: UdpSocket, stop: Arc<AtomicBool>, mode: Mode, mtu: u32, mut epsn: u32) -> Vec<u8> {
        let mut mem: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7) as u8).collect();
        let mut buf = vec![0u8; MAX_FRAME];
        let mut out = Vec::new();
        let mut dropped = false;
        let mut nakked = false;
        let mut write_va = 0u64;
        let mut msn = 0u32;
        let mut arp_requests = 0;
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            if wire::ethertype(&buf[..n]) == Some(wire::ETHERTYPE_ARP) {
                let Mode::Arp(mac) = mode else { panic!("ARP on a point-to-point cable") };
                let Ok(q) = wire::decode_arp(&buf[..n]) else { panic!("the requester sent a bad ARP frame") };
                assert_eq!((q.op, q.eth_dst, q.target_ip), (ArpOp::Request, wire::BROADCAST_MAC, REMOTE_IP));
                assert_eq!((q.sender_mac, q.eth_src), (DEFAULT_LOCAL_MAC, DEFAULT_LOCAL_MAC));
                arp_requests += 1;
                if arp_requests < 2 {
                    continue;
                }
                // Traffic on the segment that is not for the requester: a unicast RoCE frame to another
                // station, a broadcast that is not RoCE, an ARP reply from another address, an ARP request for
                // another address.
                let other = Addr {
                    src_mac: mac,
                    dst_mac: [2, 0, 0, 0, 0, 0x77],
                    src_ip: REMOTE_IP,
                    dst_ip: q.sender_ip,
                    src_port: 0xC001,
                    dst_port: ROCEV2_PORT,
                    tos: 0,
                    ttl: 64,
                };
                let aeth = Some(Aeth::ack(0));
                let r = Packet {
                    addr: other,
                    bth: Bth::new(opcode::ACKNOWLEDGE, 1, 1),
                    reth: None,
                    aeth,
                    imm: None,
                    payload: &[],
                };
                wire::encode(&r, &mut out).unwrap();
                sock.send_to(&out, from).unwrap();
                let mut bcast = out.clone();
                bcast[..6].copy_from_slice(&wire::BROADCAST_MAC);
                bcast[wire::ETH_LEN + wire::IPV4_LEN + 3] = 67; // UDP to port 67
                sock.send_to(&bcast, from).unwrap();
                let wrong = Arp { sender_ip: Ipv4Addr::new(192, 0, 2, 10), ..q.reply_from([2, 0, 0, 0, 0, 0x66]) };
                wire::encode_arp(&wrong, &mut out);
                sock.send_to(&out, from).unwrap();
                wire::encode_arp(&Arp::request(mac, REMOTE_IP, Ipv4Addr::new(192, 0, 2, 11)), &mut out);
                sock.send_to(&out, from).unwrap();
                wire::encode_arp(&q.reply_from(mac), &mut out);
                sock.send_to(&out, from).unwrap();
                continue;
            }
            let Ok(p) = wire::decode(&buf[..n]) else { panic!("the requester sent a bad frame") };
            assert_eq!(p.bth.dest_qp, RESP_QPN);
            if let Mode::Arp(mac) = mode {
                assert_eq!((p.addr.dst_mac, p.addr.dst_ip), (mac, REMOTE_IP), "RoCE frames go to the ARP'd MAC");
            }
            if mode == Mode::Silent {
                continue;
            }
            if let Mode::DropOnce(psn) = mode
                && p.bth.psn == psn
                && !dropped
            {
                dropped = true;
                continue;
            }
            let mut reply = |bth: Bth, aeth: Option<Aeth>, payload: &[u8]| {
                let r = Packet { addr: p.addr.reply(), bth, reth: None, aeth, imm: None, payload };
                wire::encode(&r, &mut out).unwrap();
                sock.send_to(&out, from).unwrap();
            };
            let to = 0x10000 | from.port() as u32; // the requester's default QPN
            let d = super::super::rc::psn_diff(p.bth.psn, epsn);
            if d > 0 {
                if !nakked {
                    nakked = true;
                    reply(Bth::new(opcode::ACKNOWLEDGE, to, epsn), Some(Aeth::nak(NakCode::PsnSequence, msn)), &[]);
                }
                continue;
            }
            if d < 0 {
                continue; // duplicates do not occur in these tests
            }
            nakked = false;
            if mode == Mode::NakAccess {
                reply(Bth::new(opcode::ACKNOWLEDGE, to, p.bth.psn), Some(Aeth::nak(NakCode::RemoteAccess, msn)), &[]);
                continue;
            }
            match p.bth.opcode {
                opcode::RDMA_WRITE_FIRST
                | opcode::RDMA_WRITE_MIDDLE
                | opcode::RDMA_WRITE_LAST
                | opcode::RDMA_WRITE_ONLY => {
                    if let Some(r) = p.reth {
                        assert_eq!(r.rkey, RKEY);
                        write_va = r.va;
                    }
                    let at = (write_va - BASE) as usize;
                    mem[at..at + p.payload.len()].copy_from_slice(p.payload);
                    write_va += p.payload.len() as u64;
                    epsn = psn_add(epsn, 1);
                    if matches!(p.bth.opcode, opcode::RDMA_WRITE_LAST | opcode::RDMA_WRITE_ONLY) {
                        msn += 1;
                    }
                    if p.bth.ack_req {
                        reply(Bth::new(opcode::ACKNOWLEDGE, to, p.bth.psn), Some(Aeth::ack(msn)), &[]);
                    }
                }
                opcode::RDMA_READ_REQUEST => {
                    let r = p.reth.unwrap();
                    msn += 1;
                    let at = (r.va - BASE) as usize;
                    let data = &mem[at..at + r.len as usize];
                    let chunks: Vec<&[u8]> =
                        if data.is_empty() { vec![data] } else { data.chunks(mtu as usize).collect() };
                    let n = chunks.len();
                    for (i, c) in chunks.into_iter().enumerate() {
                        let op = match (i == 0, i + 1 == n) {
                            (true, true) => opcode::RDMA_READ_RESPONSE_ONLY,
                            (true, false) => opcode::RDMA_READ_RESPONSE_FIRST,
                            (false, true) => opcode::RDMA_READ_RESPONSE_LAST,
                            (false, false) => opcode::RDMA_READ_RESPONSE_MIDDLE,
                        };
                        let aeth = (op != opcode::RDMA_READ_RESPONSE_MIDDLE).then(|| Aeth::ack(msn));
                        reply(Bth::new(op, to, psn_add(p.bth.psn, i as u32)), aeth, c);
                    }
                    epsn = psn_add(epsn, n as u32);
                }
                o => panic!("unexpected opcode {o:#x}"),
            }
        }
        mem
    }

    fn requester(fake: &Fake, mtu: u32, psn: u32, rc: RcConfig) -> SoftRoce {
        let cfg = SoftConfig { peer: fake.addr, mtu, psn: Some(psn), rc, ..SoftConfig::default() };
        let mut r = SoftRoce::new(cfg).unwrap();
        let remote = QpEndpoint { qpn: RESP_QPN, psn: 0, gid: gid_from_ipv4(REMOTE_IP), mac: [0; 6], mtu: 4096 };
        r.connect(&remote).unwrap();
        r
    }

    /// Transport timer 4.096 µs × 2^18 ≈ 1.07 s: on loopback only a lost packet or a missing answer lets it
    /// expire, never a busy machine; so the counters below are exact.
    fn patient() -> RcConfig {
        RcConfig { timeout: 18, ..RcConfig::default() }
    }

    fn wait_all(r: &mut SoftRoce, n: usize, budget: Duration) -> Vec<Completion> {
        let end = Instant::now() + budget;
        let mut all = Vec::new();
        while all.len() < n && Instant::now() < end {
            all.extend(r.poll(Duration::from_millis(20)));
        }
        all
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn a_multi_packet_write_is_acked_and_lands() {
        let fake = Fake::start(Mode::Normal, 1024, 100);
        let mut r = requester(&fake, 1024, 100, patient());
        let data = pattern(3000, 1);
        r.post_write(7, BASE + 16, RKEY, &data).unwrap();
        let c = wait_all(&mut r, 1, Duration::from_secs(2));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len), (7, WcStatus::Success, 3000));
        assert_eq!(r.stats().packets_sent, 3);
        assert_eq!(r.counters().frames_bad, 0);
        let mem = fake.finish();
        assert_eq!(&mem[16..3016], &data[..]);
    }

    #[test]
    fn a_remote_access_nak_fails_the_write_and_flushes_what_follows() {
        let fake = Fake::start(Mode::NakAccess, 1024, 5);
        let rc = patient();
        let mut r = requester(&fake, 1024, 5, rc);
        r.post_write(1, BASE, RKEY, &[1; 64]).unwrap();
        r.post_write(2, BASE, RKEY, &[2; 64]).unwrap();
        let c = wait_all(&mut r, 2, Duration::from_secs(5));
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]);
        assert_eq!(c[0].status.name(), "IBV_WC_REM_ACCESS_ERR");
        // The NAK answered the first transmission: no transport timer expired before it (counted, not timed).
        assert_eq!((r.stats().timeouts, r.stats().naks), (0, 1), "{:?}", r.stats());
        assert_eq!(r.qp_state(), QpState::Err);
        r.post_read(3, BASE, RKEY, 8).unwrap();
        let c = r.poll(Duration::ZERO);
        assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(3, WcStatus::WrFlushErr)]);
        fake.finish();
    }

    #[test]
    fn silence_exhausts_the_retries() {
        let fake = Fake::start(Mode::Silent, 1024, 0);
        // timeout 8: 4.096 µs × 256 ≈ 1.05 ms per attempt; 1 + 3 attempts.
        let rc = RcConfig { timeout: 8, retry_cnt: 3, ..RcConfig::default() };
        let mut r = requester(&fake, 1024, 0, rc);
        let t0 = Instant::now();
        r.post_write(1, BASE, RKEY, &[0; 10]).unwrap();
        r.post_write(2, BASE, RKEY, &[0; 10]).unwrap();
        let c = wait_all(&mut r, 2, Duration::from_secs(2));
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
        // Four expiries, each a whole period after the send before it. Wall clock, and it stays: a lower bound
        // (load only delays the completion, so it cannot fail spuriously) on the real timer. That the timer and
        // not the 2 s budget ended it is the status and the expiry count; the exact schedule is rc.rs's
        // virtual-time test.
        let took = c[0].at.duration_since(t0);
        assert!(took >= rc.transport_timeout().unwrap() * 4, "{took:?}");
        assert_eq!(r.stats().timeouts, 4);
        assert_eq!(r.stats().packets_sent, 8, "two packets, sent 4 times");
        fake.finish();
    }

    #[test]
    fn read_responses_are_reassembled_across_mtu_segments() {
        let fake = Fake::start(Mode::Normal, 256, 0x1000);
        let mut r = requester(&fake, 256, 0x1000, patient());
        r.post_read(1, BASE + 3, RKEY, 1000).unwrap(); // 4 responses: FIRST, MIDDLE, MIDDLE, LAST
        r.post_read(2, BASE + 40, RKEY, 200).unwrap(); // ONLY
        r.post_read(3, BASE, RKEY, 0).unwrap(); // zero length: ONLY, no data
        let c = wait_all(&mut r, 3, Duration::from_secs(2));
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        assert_eq!(got, [(1, WcStatus::Success, 1000), (2, WcStatus::Success, 200), (3, WcStatus::Success, 0)]);
        let mem = fake.finish();
        assert_eq!(r.read_data(1).unwrap(), &mem[3..1003]);
        assert_eq!(r.read_data(2).unwrap(), &mem[40..240]);
        assert_eq!(r.read_data(3).unwrap(), Vec::<u8>::new());
        assert_eq!(r.read_data(1), None);
    }

    #[test]
    #[allow(unsafe_code)]
    fn scatter_gather_requests_move_the_callers_bytes_directly() {
        let fake = Fake::start(Mode::Normal, 256, 300);
        let mut r = requester(&fake, 256, 300, patient());
        assert_eq!(r.max_sge(), SOFT_MAX_SGE);
        // Pieces that do not line up with the 256-byte packets, both ways.
        let (mut a, mut b) = (pattern(700, 5), pattern(300, 6));
        let out = [Sge { addr: a.as_mut_ptr(), len: 700, lkey: 0 }, Sge { addr: b.as_mut_ptr(), len: 300, lkey: 0 }];
        let (mut x, mut y) = (vec![0u8; 400], vec![0u8; 600]);
        let back = [Sge { addr: x.as_mut_ptr(), len: 400, lkey: 0 }, Sge { addr: y.as_mut_ptr(), len: 600, lkey: 0 }];
        // SAFETY: the four buffers outlive both requests' completions (waited for below) and nothing else touches
        // them meanwhile.
        unsafe {
            r.post_write_sg(1, BASE + 10, RKEY, &out).unwrap();
            r.post_read_sg(2, BASE + 10, RKEY, &back).unwrap();
        }
        let c = wait_all(&mut r, 2, Duration::from_secs(2));
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        assert_eq!(got, [(1, WcStatus::Success, 1000), (2, WcStatus::Success, 1000)]);
        assert_eq!(r.read_data(2), None, "a scattered READ's bytes are in the caller's memory only");
        let want = [a, b].concat();
        assert_eq!([x, y].concat(), want);
        let mem = fake.finish();
        assert_eq!(&mem[10..1010], &want[..]);
    }

    #[test]
    fn psns_wrap_modulo_2_pow_24() {
        let start = 0xFF_FFFC;
        let fake = Fake::start(Mode::Normal, 256, start);
        let mut r = requester(&fake, 256, start, patient());
        let a = pattern(1000, 3); // PSN FFFFFC..=FFFFFF
        r.post_write(1, BASE, RKEY, &a).unwrap();
        r.post_read(2, BASE + 100, RKEY, 700).unwrap(); // PSN 0..=2
        r.post_write(3, BASE + 2000, RKEY, &a[..300]).unwrap(); // PSN 3..=4
        let c = wait_all(&mut r, 3, Duration::from_secs(2));
        assert_eq!(
            c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]
        );
        assert_eq!(r.read_data(2).unwrap(), &a[100..800]);
        let mem = fake.finish();
        assert_eq!(&mem[2000..2300], &a[..300]);
    }

    #[test]
    fn a_lost_packet_is_resent_after_the_sequence_nak() {
        let fake = Fake::start(Mode::DropOnce(11), 256, 10);
        let mut r = requester(&fake, 256, 10, patient());
        let a = pattern(1024, 9);
        r.post_write(1, BASE, RKEY, &a).unwrap(); // PSN 10..=13, 11 lost
        let c = wait_all(&mut r, 1, Duration::from_secs(2));
        assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::Success)]);
        assert_eq!(r.stats().naks, 1);
        assert_eq!(r.stats().timeouts, 0, "no timer expiry needed: {:?}", r.stats());
        let mem = fake.finish();
        assert_eq!(&mem[..1024], &a[..]);
    }

    const APPLIANCE_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

    fn remote_endpoint() -> QpEndpoint {
        QpEndpoint { qpn: RESP_QPN, psn: 0, gid: gid_from_ipv4(REMOTE_IP), mac: [0; 6], mtu: 4096 }
    }

    #[test]
    fn the_appliance_mac_is_resolved_by_arp_before_the_first_frame() {
        let fake = Fake::start(Mode::Arp(APPLIANCE_MAC), 1024, 50);
        // Two requests one and a half seconds apart: the fake answers only the second.
        let resolve = Resolve::Arp { deadline: Duration::from_secs(3), tries: 2 };
        let cfg =
            SoftConfig { peer: fake.addr, mtu: 1024, psn: Some(50), rc: patient(), resolve, ..SoftConfig::default() };
        let mut r = SoftRoce::new(cfg).unwrap();
        assert_eq!(r.remote_mac(), None);
        r.connect(&remote_endpoint()).unwrap();
        assert_eq!(r.remote_mac(), Some((MacSource::Arp, APPLIANCE_MAC)));
        let c = r.counters();
        assert_eq!((c.arp_requests, c.frames_sent), (2, 2));
        // Before the reply: a RoCE frame for another MAC, a broadcast that is not RoCE, a reply from another
        // IPv4, a request for another IPv4.
        assert_eq!((c.frames_received, c.frames_other, c.frames_bad, c.arp_replies), (5, 4, 0, 0));
        let data = pattern(2000, 4);
        r.post_write(1, BASE, RKEY, &data).unwrap();
        r.post_read(2, BASE, RKEY, 2000).unwrap();
        let done = wait_all(&mut r, 2, Duration::from_secs(5));
        let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
        assert_eq!(r.read_data(2).unwrap(), data);
        fake.finish(); // its thread checked every RoCE frame's destination MAC
    }

    #[test]
    fn no_arp_reply_is_a_clear_error() {
        // A peer that never reads: nothing answers.
        let mute = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = mute.local_addr().unwrap();
        let resolve = Resolve::Arp { deadline: Duration::from_millis(200), tries: 2 };
        let local_ip = Some(Ipv4Addr::new(10, 0, 2, 100));
        let mut r = SoftRoce::new(SoftConfig { peer, resolve, local_ip, ..SoftConfig::default() }).unwrap();
        let e = r.connect(&remote_endpoint()).unwrap_err();
        for want in ["no ARP reply for 192.0.2.9", &format!("→ {peer}"), "within 0.2 s", "2 request(s) as 10.0.2.100"]
        {
            assert!(e.contains(want), "{want:?} in {e}");
        }
        assert!(e.contains("--remote-mac") && e.contains("rdma_remote_mac"), "{e}");
        assert_eq!(r.counters().arp_requests, 2);
        // Not connected: nothing to send, nothing learned.
        assert_eq!((r.qp_state(), r.remote_mac()), (QpState::Reset, None));
        // Both requests are on the wire, well formed.
        let mut buf = [0u8; 128];
        mute.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for _ in 0..2 {
            let n = mute.recv(&mut buf).unwrap();
            let q = wire::decode_arp(&buf[..n]).unwrap();
            assert_eq!(q, Arp::request(DEFAULT_LOCAL_MAC, Ipv4Addr::new(10, 0, 2, 100), REMOTE_IP));
        }
    }

    #[test]
    fn arp_toward_nothing_listening_says_so() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed again
        let resolve = Resolve::Arp { deadline: Duration::from_millis(100), tries: 1 };
        let mut r = SoftRoce::new(SoftConfig { peer, resolve, ..SoftConfig::default() }).unwrap();
        let e = r.connect(&remote_endpoint()).unwrap_err();
        // Loopback answers with ICMP port unreachable, which the connected socket reports.
        assert!(e.contains(&format!("is anything listening at {peer}?")), "{e}");
        assert!(r.counters().socket_errors >= 1);
    }

    #[test]
    fn arp_requests_for_our_ipv4_are_answered() {
        let asker = UdpSocket::bind("127.0.0.1:0").unwrap();
        asker.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let me_ip = Ipv4Addr::new(10, 0, 2, 100);
        let cfg = SoftConfig { peer: asker.local_addr().unwrap(), local_ip: Some(me_ip), ..SoftConfig::default() };
        let mut r = SoftRoce::new(cfg).unwrap();
        asker.connect(r.socket_addr().unwrap()).unwrap();
        let mut out = Vec::new();
        // For another address (not answered), a unicast to another station (set aside), then for ours.
        wire::encode_arp(&Arp::request(APPLIANCE_MAC, REMOTE_IP, Ipv4Addr::new(10, 0, 2, 101)), &mut out);
        asker.send(&out).unwrap();
        let ours = Arp::request(APPLIANCE_MAC, REMOTE_IP, me_ip);
        wire::encode_arp(&Arp { eth_dst: [2, 0, 0, 0, 0, 0x77], ..ours }, &mut out);
        asker.send(&out).unwrap();
        wire::encode_arp(&ours, &mut out);
        asker.send(&out).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while r.counters().arp_replies == 0 && Instant::now() < end {
            r.poll(Duration::from_millis(20));
        }
        let c = r.counters();
        assert_eq!((c.frames_received, c.arp_replies, c.frames_other, c.frames_bad), (3, 1, 2, 0));
        let mut buf = [0u8; 128];
        let n = asker.recv(&mut buf).unwrap();
        assert_eq!(n, wire::ETH_MIN_LEN);
        let a = wire::decode_arp(&buf[..n]).unwrap();
        assert_eq!(a, ours.reply_from(DEFAULT_LOCAL_MAC));
        assert_eq!(
            (a.eth_dst, a.sender_mac, a.sender_ip, a.target_ip),
            (APPLIANCE_MAC, DEFAULT_LOCAL_MAC, me_ip, REMOTE_IP)
        );
    }

    #[test]
    fn a_fixed_mac_or_the_endpoint_s_is_used_without_arp() {
        let fake = Fake::start(Mode::Normal, 1024, 0);
        let mine = [2, 0, 0, 0, 0, 0x42];
        let cfg = SoftConfig { peer: fake.addr, resolve: Resolve::Fixed(mine), ..SoftConfig::default() };
        let mut r = SoftRoce::new(cfg).unwrap();
        r.connect(&remote_endpoint()).unwrap();
        assert_eq!(r.remote_mac(), Some((MacSource::Flag, mine)));
        let mut r = SoftRoce::new(SoftConfig { peer: fake.addr, ..SoftConfig::default() }).unwrap();
        r.connect(&QpEndpoint { mac: APPLIANCE_MAC, ..remote_endpoint() }).unwrap();
        assert_eq!(r.remote_mac(), Some((MacSource::Endpoint, APPLIANCE_MAC)));
        let r = requester(&fake, 1024, 0, patient());
        assert_eq!(r.remote_mac(), Some((MacSource::Placeholder, PLACEHOLDER_REMOTE_MAC)));
        assert_eq!(r.counters(), SoftCounters::default(), "no frame: no ARP on the point-to-point cable");
        fake.finish();
    }
}
