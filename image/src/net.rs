//! The `net` role: the control channel. smoltcp (TCP per RFC 9293, ARP, the DHCPv4 client of RFC 2131) over
//! the control NIC, polled from the role loop with interrupts off: the virtio-net device (virtio 1.1 §5.1),
//! or the ConnectX-5's own Ethernet port (`crate::eth`), as `ctl_nic=` picks ([`choose`]).
//!
//! - On the ConnectX-5 port the interface also owns the RDMA address (`rdma_ip=`, when it is not the control
//!   address): smoltcp answers ARP for it, so a client's RDMA stack resolves the appliance's RoCEv2 MAC like
//!   any neighbour's, and a gratuitous ARP announces it whenever the link comes up. RoCEv2 itself never
//!   reaches smoltcp: the HCA hands it to the RDMA engine.
//!
//! - Addressing: `ip=`/`gw=` when configured, otherwise DHCPv4. The address is published for the ready line
//!   ([`status`]); a lost lease is asked for again.
//! - The control port: a pool of listening sockets, one per session place (`sessions=`) and per place for
//!   unauthenticated connections (`preauth_sessions=`), and one more, so one connection past the budgets still
//!   reaches the service, which can answer BUSY before it is closed (`crate::control::sockets`). Further
//!   connections find no listener and are reset by smoltcp.
//! - Half-open connections hold a socket briefly: a handshake still in SYN-RECEIVED after [`SYN_TIMEOUT_MS`]
//!   is reset and the socket listens again (smoltcp would otherwise retransmit its SYN-ACK until
//!   [`TCP_TIMEOUT`], 30 s); an accepted connection that never authenticates is closed by the service at its
//!   HELLO deadline, and reset [`CLOSE_TIMEOUT_MS`] later if it does not finish the close.
//! - Each accepted connection is handed to a [`StreamService`]; the loop only moves bytes. Input is fed only
//!   once the service's output for that connection is drained into the socket, in chunks of at most
//!   [`INPUT_CHUNK`], so a peer that stops reading stops being served rather than growing buffers.
//! - A step does bounded work (ingress and egress budgets) so the other roles on the core keep running, and
//!   every closing connection has a deadline.
//! - Memory: socket buffers (64 KiB each way per socket, smaller when many sockets would take more than an
//!   eighth of memory: `crate::control::socket_buf`) come from frames once at boot; nothing is allocated per
//!   packet or per connection.

use crate::eth::Mlx5Nic;
use crate::service::{ConnId, StreamService};
use alloc::boxed::Box;
use alloc::format;
use alloc::vec::Vec;
use core::net::Ipv4Addr;
use core::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use leasebox_kernel::arch::start::Platform;
use leasebox_kernel::arch::{memory, rng};
use leasebox_kernel::net_config::ControlNic;
use leasebox_kernel::time;
use leasebox_virtio_net::probe::{self, KernelNic, ProbeError};
use smoltcp::iface::{Config, Interface, PollIngressSingleResult, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::Device;
use smoltcp::socket::{dhcpv4, tcp};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

/// The most bytes handed to the service per connection and pass.
pub const INPUT_CHUNK: usize = 16 * 1024;
/// Frames taken from the device per step.
const INGRESS_BUDGET: usize = 32;
/// Transmit rounds per step (each sends at most one segment per socket).
const EGRESS_BUDGET: usize = 32;
/// A connection being closed (or refused) that is still there after this is reset.
const CLOSE_TIMEOUT_MS: u64 = 5_000;
/// A listening socket whose handshake is still in SYN-RECEIVED after this is reset and listens again: a
/// client completes the handshake in one round trip, a SYN flood does not hold the pool.
const SYN_TIMEOUT_MS: u64 = 2_000;
/// smoltcp resets a connection whose sent data stays unacknowledged this long.
const TCP_TIMEOUT: smoltcp::time::Duration = smoltcp::time::Duration::from_secs(30);

const ABSENT: u8 = 0;
const WAITING: u8 = 1;
const UP: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(ABSENT);
static ADDRESS: AtomicU32 = AtomicU32::new(0);

/// The control channel as the ready line reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No device (or it could not be used): no control channel this boot.
    Absent,
    /// Waiting for a DHCP lease.
    Waiting,
    Up(Ipv4Addr),
}

/// The control channel's state, readable from any core.
pub fn status() -> Status {
    match STATE.load(Ordering::Acquire) {
        UP => Status::Up(Ipv4Addr::from(ADDRESS.load(Ordering::Relaxed))),
        WAITING => Status::Waiting,
        _ => Status::Absent,
    }
}

fn publish(s: Status) {
    let (state, addr) = match s {
        Status::Absent => (ABSENT, 0),
        Status::Waiting => (WAITING, 0),
        Status::Up(a) => (UP, u32::from(a)),
    };
    ADDRESS.store(addr, Ordering::Relaxed);
    STATE.store(state, Ordering::Release);
}

/// Milliseconds since kernel entry: the clock of smoltcp and of the service.
pub(crate) fn now_ms() -> u64 {
    u64::try_from(time::Instant::now().since_boot().as_millis()).unwrap_or(u64::MAX)
}

fn smol_instant(ms: u64) -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_millis(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// An accepted connection on a listening slot.
struct Conn {
    id: ConnId,
    refused: bool,
    /// When closing, by now, is overdue (set once a close is wanted).
    deadline: Option<u64>,
}

struct Slot {
    handle: SocketHandle,
    conn: Option<Conn>,
    /// When this slot's socket was first seen in SYN-RECEIVED (a handshake in progress).
    syn_since: Option<u64>,
}

/// Which NIC carries the control channel this boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Virtio,
    /// The ConnectX-5's Ethernet port: HCA bring-up builds it (`crate::eth::build`).
    Mlx5,
}

impl core::fmt::Display for Choice {
    /// The ready line's `ctl_nic=` field; the ConnectX-5 port adds its link state.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Choice::Virtio => f.write_str("ctl_nic=virtio"),
            Choice::Mlx5 => write!(f, "ctl_nic=mlx5 link={}", crate::eth::link()),
        }
    }
}

/// `ctl_nic=` against the machine: `auto` takes virtio-net when there is one, else the ConnectX-5's port.
pub fn choose(p: &Platform) -> Choice {
    match p.config.net.nic {
        ControlNic::Virtio => Choice::Virtio,
        ControlNic::Mlx5 => Choice::Mlx5,
        ControlNic::Auto => {
            if p.pci.functions().iter().any(|f| leasebox_virtio_net::is_virtio_net(f.vendor, f.device)) {
                Choice::Virtio
            } else {
                Choice::Mlx5
            }
        }
    }
}

/// The network stack over the NIC `ctl_nic=` picked.
pub enum NetStack {
    Virtio(Box<Stack<KernelNic>>),
    Mlx5(Box<Stack<Mlx5Nic>>),
}

impl NetStack {
    /// One pass: frames in, addressing, timers, connections, frames out. Never waits.
    pub fn step(&mut self) {
        match self {
            NetStack::Virtio(s) => s.step(),
            NetStack::Mlx5(s) => {
                let announced = crate::hca::port_event();
                if s.nic.update_link(announced).is_some() && s.nic.link_up() {
                    s.announce();
                }
                s.step();
                if let Some(sender) = s.rdma.or_else(|| s.address()) {
                    s.nic.ask_neighbours(sender);
                }
                s.nic.maintain();
            }
        }
    }
}

/// The network stack and the service behind the control port, over one NIC.
pub struct Stack<D: Device> {
    nic: D,
    iface: Interface,
    sockets: SocketSet<'static>,
    dhcp: Option<SocketHandle>,
    /// Whether a DHCP lease is in force.
    leased: bool,
    slots: Vec<Slot>,
    service: Box<dyn StreamService + Send>,
    port: u16,
    next_conn: u64,
    /// The RDMA address the interface answers ARP for (ConnectX-5 port only).
    rdma: Option<Ipv4Addr>,
    mac: [u8; 6],
}

/// `bytes` of zeroed memory for the whole boot, from frames (the socket buffers: megabytes, more than the heap
/// should carry).
fn boot_memory(bytes: usize) -> Option<&'static mut [u8]> {
    let region = match memory::dma_alloc(bytes, 4096) {
        Ok(r) => r,
        Err(e) => {
            log::error!("net: socket buffers: {e}");
            return None;
        }
    };
    // SAFETY: the region is fresh frames, zeroed and identity-mapped, at least `bytes` long, and owned by
    // nobody else; it is never freed (the sockets live as long as the boot), so the slice may be `'static`.
    Some(unsafe { core::slice::from_raw_parts_mut(region.as_ptr(), bytes) })
}

/// Opens the NIC `choice` names and builds the stack, or reports why there is no control channel (status
/// `Absent`). Call on the bootstrap processor before other cores start (the device's BARs get mapped), after
/// HCA bring-up (which builds the ConnectX-5 port).
pub fn init(p: &Platform, choice: Choice, service: Box<dyn StreamService + Send>) -> Option<NetStack> {
    publish(Status::Absent);
    match choice {
        Choice::Virtio => {
            let (bdf, nic) = match probe::open(p.pci, p.pci_access) {
                Ok(found) => found,
                Err(ProbeError::NotFound) => {
                    log::warn!("net: no virtio-net device: no control channel this boot");
                    return None;
                }
                Err(e) => {
                    log::error!("net: no control channel this boot: {e}");
                    return None;
                }
            };
            let mac = nic.mac();
            let label = format!("virtio-net {bdf}");
            build(p, nic, mac, &label, None, service).map(|s| NetStack::Virtio(Box::new(s)))
        }
        Choice::Mlx5 => {
            let Some(nic) = crate::eth::take() else {
                if p.config.net.nic == ControlNic::Auto {
                    log::warn!(
                        "net: no virtio-net device, and no ConnectX-5 Ethernet port (no HCA, or it did not come up): \
                         no control channel this boot"
                    );
                } else {
                    log::error!(
                        "net: ctl_nic=mlx5 but the ConnectX-5's Ethernet port is not there: no control channel"
                    );
                }
                return None;
            };
            let mac = nic.mac();
            let rdma = crate::hca::leases().ok().map(|(parts, _)| parts.rdma_ip);
            let mut s = build(p, nic, mac, "the ConnectX-5 port", rdma, service)?;
            if s.nic.link_up() {
                s.announce();
            } else {
                log::warn!("net: the ConnectX-5 port's link is not up yet; the control channel starts when it is");
            }
            Some(NetStack::Mlx5(Box::new(s)))
        }
    }
}

/// The stack over `nic`; `rdma`: the RDMA address the interface also answers ARP for.
fn build<D: Device>(
    p: &Platform,
    mut nic: D,
    mac: [u8; 6],
    label: &str,
    rdma: Option<Ipv4Addr>,
    service: Box<dyn StreamService + Send>,
) -> Option<Stack<D>> {
    // smoltcp draws TCP initial sequence numbers and DHCP transaction IDs from this seed: predictable values
    // would let an off-path host inject into control connections, so there is no fallback.
    let Some(seed) = rng::random_u64() else {
        log::error!("net: no hardware random source (RDSEED/RDRAND; try -cpu max): no control channel this boot");
        return None;
    };
    let net = p.config.net;
    let sockets_n = crate::control::sockets(p);
    // A full window at ~15 MB/s and ~80 µs RTT under QEMU user networking is far less than 64 KiB; 64 KiB keeps
    // bulk transfers (LIST, STATS) from stalling on the window, and a smaller buffer only slows those.
    let buf = crate::control::socket_buf(p);
    let Some(memory) = boot_memory(sockets_n * 2 * buf) else {
        log::error!(
            "net: {sockets_n} sockets need {} KiB of socket buffers ({} KiB each way): lower sessions= or give the \
             machine more memory; no control channel this boot",
            (sockets_n * 2 * buf) >> 10,
            buf >> 10
        );
        return None;
    };

    let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    cfg.random_seed = seed;
    let now = now_ms();
    let mut iface = Interface::new(cfg, &mut nic, smol_instant(now));
    let mut sockets = SocketSet::new(Vec::with_capacity(sockets_n + 1));

    let mut slots = Vec::with_capacity(sockets_n);
    for pair in memory.chunks_exact_mut(2 * buf) {
        let (rx, tx) = pair.split_at_mut(buf);
        let mut s = tcp::Socket::new(tcp::SocketBuffer::new(rx), tcp::SocketBuffer::new(tx));
        // Request/response traffic: answers go out at once, not after the previous segment is acknowledged.
        s.set_nagle_enabled(false);
        s.set_timeout(Some(TCP_TIMEOUT));
        relisten(&mut s, net.port);
        slots.push(Slot { handle: sockets.add(s), conn: None, syn_since: None });
    }

    let dhcp = match net.ip {
        Some(ip) => {
            iface.update_ip_addrs(|a| {
                let _ = a.push(IpCidr::new(IpAddress::Ipv4(ip.addr), ip.prefix));
            });
            if let Some(gw) = net.gw
                && iface.routes_mut().add_default_ipv4_route(gw).is_err()
            {
                log::error!("net: no room for the default route via {gw}");
            }
            publish(Status::Up(ip.addr));
            None
        }
        None => {
            publish(Status::Waiting);
            Some(sockets.add(dhcpv4::Socket::new()))
        }
    };
    // The RDMA address on the same port: smoltcp answers ARP (and ICMP echo) for every address it holds.
    let rdma = rdma.filter(|r| net.ip.is_none_or(|n| n.addr != *r));
    if let Some(r) = rdma {
        iface.update_ip_addrs(|a| {
            if a.push(IpCidr::new(IpAddress::Ipv4(r), 32)).is_err() {
                log::error!("net: no room for the RDMA address {r}");
            }
        });
    }
    log::info!(
        "net: {label} mac {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} address {}{}{} seed from {}",
        mac[0],
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5],
        net.ip.map_or(Addressing::Dhcp, Addressing::Static),
        Gateway(net.gw),
        RdmaAddr(rdma),
        rng::source().unwrap_or("?"),
    );
    log::info!("net: control port tcp/{} ({sockets_n} sockets, {} KiB buffers each way)", net.port, buf >> 10);
    Some(Stack { nic, iface, sockets, dhcp, leased: false, slots, service, port: net.port, next_conn: 1, rdma, mac })
}

struct RdmaAddr(Option<Ipv4Addr>);

impl core::fmt::Display for RdmaAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(a) => write!(f, ", answers ARP for RDMA address {a}"),
            None => Ok(()),
        }
    }
}

enum Addressing {
    Dhcp,
    Static(leasebox_kernel::net_config::Ipv4Net),
}

impl core::fmt::Display for Addressing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Addressing::Dhcp => f.write_str("by DHCPv4"),
            Addressing::Static(n) => write!(f, "{n}"),
        }
    }
}

struct Gateway(Option<Ipv4Addr>);

impl core::fmt::Display for Gateway {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(g) => write!(f, " gateway {g}"),
            None => Ok(()),
        }
    }
}

fn relisten(s: &mut tcp::Socket<'_>, port: u16) {
    if let Err(e) = s.listen(port) {
        log::error!("net: listening on port {port}: {e}");
    }
}

impl<D: Device> Stack<D> {
    /// The interface's first IPv4 address (the control address), if it has one yet.
    fn address(&self) -> Option<Ipv4Addr> {
        self.iface.ipv4_addr()
    }
}

impl Stack<Mlx5Nic> {
    /// A gratuitous ARP for the RDMA address (a request for itself, RFC 5227 §3's announcement), so that
    /// neighbours update a MAC they hold for it.
    fn announce(&mut self) {
        if let Some(ip) = self.rdma {
            let frame = gratuitous_arp(self.mac, ip);
            if !self.nic.send_raw(&frame) {
                log::warn!("net: gratuitous ARP for {ip} not sent (send ring full)");
            }
        }
    }
}

/// An ARP announcement of `ip` at `mac` (RFC 5227 §2.3): a broadcast request whose sender and target
/// address are both `ip`.
fn gratuitous_arp(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 60] {
    crate::eth::arp_request(mac, ip, ip)
}

impl<D: Device> Stack<D> {
    /// One pass: frames in, addressing, timers, connections, frames out. Never waits.
    pub fn step(&mut self) {
        let now = now_ms();
        let t = smol_instant(now);
        self.iface.poll_maintenance(t);
        for _ in 0..INGRESS_BUDGET {
            if matches!(
                self.iface.poll_ingress_single(t, &mut self.nic, &mut self.sockets),
                PollIngressSingleResult::None
            ) {
                break;
            }
        }
        self.dhcp();
        self.service.tick(now);
        for slot in &mut self.slots {
            let sock = self.sockets.get_mut::<tcp::Socket>(slot.handle);
            serve(slot, sock, self.service.as_mut(), now, self.port, &mut self.next_conn);
        }
        for _ in 0..EGRESS_BUDGET {
            if matches!(self.iface.poll_egress(t, &mut self.nic, &mut self.sockets), PollResult::None) {
                break;
            }
        }
    }

    /// Applies DHCP client events (RFC 2131: lease acquired, renewed, lost).
    fn dhcp(&mut self) {
        let Some(h) = self.dhcp else { return };
        let lease = match self.sockets.get_mut::<dhcpv4::Socket>(h).poll() {
            None => return,
            Some(dhcpv4::Event::Configured(c)) => Some((c.address, c.router)),
            Some(dhcpv4::Event::Deconfigured) => None,
        };
        let was_leased = core::mem::replace(&mut self.leased, lease.is_some());
        // The leased address comes first (smoltcp's source for what it originates), then the RDMA address,
        // which stays whatever DHCP does.
        let rdma = self.rdma.map(|r| IpCidr::new(IpAddress::Ipv4(r), 32));
        self.iface.update_ip_addrs(|a| {
            a.clear();
            if let Some((cidr, _)) = lease {
                let _ = a.push(IpCidr::Ipv4(cidr));
            }
            if let Some(r) = rdma {
                let _ = a.push(r);
            }
        });
        self.iface.routes_mut().remove_default_ipv4_route();
        match lease {
            Some((cidr, router)) => {
                if let Some(r) = router {
                    let _ = self.iface.routes_mut().add_default_ipv4_route(r);
                }
                log::info!("net: DHCP lease {cidr}{}", Gateway(router));
                publish(Status::Up(cidr.address()));
            }
            // The client reports "deconfigured" once at start, before any lease: only a lost lease is news.
            None if was_leased => {
                log::warn!("net: DHCP lease lost; asking again");
                publish(Status::Waiting);
            }
            None => {}
        }
    }
}

/// Serves one listening slot: accept, move bytes, close.
fn serve(
    slot: &mut Slot,
    sock: &mut tcp::Socket<'_>,
    svc: &mut dyn StreamService,
    now: u64,
    port: u16,
    next: &mut u64,
) {
    use tcp::State;
    let Some(conn) = slot.conn.as_mut() else {
        if sock.state() != State::SynReceived {
            slot.syn_since = None;
        }
        match sock.state() {
            State::Listen => {}
            State::SynReceived => {
                // A half-open connection (the peer's ACK never came): it may not hold the socket for long.
                let since = *slot.syn_since.get_or_insert(now);
                if now.saturating_sub(since) >= SYN_TIMEOUT_MS {
                    log::debug!("net: handshake not completed within {SYN_TIMEOUT_MS} ms; reset");
                    sock.abort();
                    slot.syn_since = None;
                }
            }
            // Reset during the handshake: listen again.
            State::Closed | State::TimeWait => relisten(sock, port),
            // Accepted (possibly already half-closed by a quick peer): served from the next pass.
            _ => {
                let id = ConnId(*next);
                *next += 1;
                let peer = sock.remote_endpoint();
                let refused = !svc.open(id, peer.map(|p| p.addr.into()), now);
                if let Some(peer) = peer {
                    log::debug!("net: conn {} from {peer} {}", id.0, if refused { "refused" } else { "accepted" });
                }
                slot.conn = Some(Conn { id, refused, deadline: None });
            }
        }
        return;
    };
    let id = conn.id;
    if matches!(sock.state(), State::Closed | State::TimeWait) {
        log::debug!("net: conn {} closed", id.0);
        svc.closed(id, now);
        slot.conn = None;
        relisten(sock, port);
        return;
    }
    if conn.deadline.is_some_and(|d| now >= d) {
        // A peer that neither reads nor finishes the close: reset it (seen as Closed on the next pass).
        log::debug!("net: conn {} did not close in time; reset", id.0);
        sock.abort();
        return;
    }

    let mut drained = pump_output(sock, svc, id);
    if sock.can_recv() {
        if conn.refused {
            let _ = sock.recv(|b| (b.len(), ()));
        } else if drained {
            let _ = sock.recv(|b| {
                let n = b.len().min(INPUT_CHUNK);
                svc.input(id, &b[..n], now);
                (n, ())
            });
            drained = pump_output(sock, svc, id);
        }
    }

    // Our side closes once the service's output is out: when it asks, when it refused the connection, or
    // when the peer has closed its side and sent everything.
    let peer_done = !sock.may_recv() && !sock.can_recv();
    if conn.refused || peer_done || svc.wants_close(id) {
        conn.deadline.get_or_insert(now.saturating_add(CLOSE_TIMEOUT_MS));
        if drained && sock.may_send() {
            sock.close();
        }
    }
}

/// Moves the service's pending output for `id` into the socket. Returns whether the service has nothing
/// left for it (also when the socket can no longer send: the output has nowhere to go).
fn pump_output(sock: &mut tcp::Socket<'_>, svc: &mut dyn StreamService, id: ConnId) -> bool {
    if !sock.may_send() {
        return true;
    }
    // The transmit ring wraps at most once, so two contiguous windows cover its free space.
    for _ in 0..2 {
        if !sock.can_send() {
            return false;
        }
        match sock.send(|buf| {
            let n = svc.output(id, buf).min(buf.len());
            (n, n < buf.len())
        }) {
            Ok(true) | Err(_) => return true,
            Ok(false) => {}
        }
    }
    false
}
