//! The ConnectX-5's own Ethernet port as the control NIC (`ctl_nic=mlx5`, or `auto` with no virtio-net):
//! smoltcp's `Device` over the driver's [`EthPort`] (docs/mlx5-driver.md, "The Ethernet port").
//!
//! The port is built on the BSP during HCA bring-up, before the driver splits into its engines
//! ([`build`]), and taken by the network stack. The `net` role polls the port's completion queues itself, in
//! its own loop: it is their only consumer, so frames never cross cores and need no second ring (the event
//! core keeps the EQ and the lease CQ). The link state comes from PAOS at bring-up, then from the PORT_CHANGE
//! events the event engine records ([`leasebox_mlx5::engine::Shared::port_event`]). Counters and the link
//! state are published for HEALTH and the ready line ([`summary`]).
//!
//! The `net` core cannot use the lease service's command client, so [`build`] also takes the command engine's
//! side client ([`SideClient`]) for the port: each pass, [`Mlx5Nic::maintain`] runs the port's maintenance over
//! it (the Q counter's `out_of_buffer` read every second, a send or receive queue in error brought back),
//! never waiting for a command.
//!
//! Neighbours for the lease service (ALLOC's `client_mac` 0, "resolve"): [`neighbour`] answers from a small
//! table of ARP replies heard on the port and asks ARP for what it does not know; the `net` role sends the
//! requests ([`Mlx5Nic::ask_neighbours`]). Only replies to our MAC, from an address being asked for, are learned,
//! so an ARP storm cannot fill the table.

use crate::hca_platform::KernelHca;
use crate::net::now_ms;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::net::Ipv4Addr;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use leasebox_lease::service::Neighbour;
use leasebox_mlx5::driver::{Driver, PortState};
use leasebox_mlx5::engine::SideClient;
use leasebox_mlx5::eth::{EthConfig, EthPort, EthStats};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use spin::Mutex;

/// The port and its side client, between HCA bring-up (which builds it) and the network stack (which takes it).
static PORT: Mutex<Option<(EthPort<KernelHca>, Option<SideClient>)>> = Mutex::new(None);

/// The largest frame smoltcp sends: a 1500-byte MTU plus the Ethernet header.
const MAX_FRAME: usize = 1514;

/// Frames taken from the receive queue per `receive` call (smoltcp asks once per frame).
const RX_BUDGET: usize = 1;

/// Builds the Ethernet port on `d` (before `into_engines`) and takes the command engine's side client for its
/// maintenance. The link need not be up: boot never waits for it.
pub fn build(d: &mut Driver<KernelHca>) {
    match EthPort::create(d, &EthConfig::default()) {
        Ok(port) => {
            let i = &port.info;
            log::info!(
                "mlx5: Ethernet port mac {:02x?} inline mode {} lkey {:?} sqn {:#x} rqn {:#x} tirn {:#x} link {}",
                i.mac,
                i.inline_mode,
                i.lkey,
                i.sqn,
                i.rqn,
                i.tirn,
                port.state()
            );
            publish_state(port.state());
            let side = d.cmd.side_client();
            if side.is_none() {
                log::warn!("mlx5: no side client for the Ethernet port: its counters and recovery are off");
            }
            *PORT.lock() = Some((port, side));
        }
        Err(e) => log::error!("mlx5: the Ethernet port could not be built: {e}"),
    }
}

/// The port built by [`build`], once.
pub fn take() -> Option<Mlx5Nic> {
    PORT.lock().take().map(|(port, side)| Mlx5Nic {
        port,
        side,
        rx: Box::new([0; 2048]),
        rx_len: 0,
        spill: Box::new([0; 2048]),
    })
}

/// Entries of the neighbour table; the oldest goes first.
const ARP_ENTRIES: usize = 64;
/// A learned MAC is trusted this long.
const ARP_AGE_MS: u64 = 60_000;
/// An address being asked for is asked again this often, and no longer than this.
const ARP_RETRY_MS: u64 = 250;
const ARP_GIVE_UP_MS: u64 = 5_000;

struct Asking {
    ip: Ipv4Addr,
    since_ms: u64,
    next_ms: u64,
}

/// The neighbour table and the addresses being asked for.
struct Arp {
    known: Vec<(Ipv4Addr, [u8; 6], u64)>,
    asking: Vec<Asking>,
}

static ARP: Mutex<Arp> = Mutex::new(Arp { known: Vec::new(), asking: Vec::new() });

/// The lease service's resolver (`PlatformHost::with_resolver`): the MAC of `ip` on the port's segment.
pub fn neighbour(ip: Ipv4Addr) -> Neighbour {
    if LINK.load(Ordering::Relaxed) == 0 {
        return Neighbour::Unsupported(leasebox_lease::service::NO_RESOLVER);
    }
    let now = now_ms();
    let mut a = ARP.lock();
    if let Some(&(_, mac, _)) = a.known.iter().find(|(k, _, at)| *k == ip && now < at + ARP_AGE_MS) {
        return Neighbour::Known(mac);
    }
    if !a.asking.iter().any(|q| q.ip == ip) {
        a.asking.push(Asking { ip, since_ms: now, next_ms: now });
    }
    Neighbour::Asking
}

/// Learns from an ARP reply to `me` whose sender is being asked for (`leasebox_kernel::arp::reply_to`).
fn learn(frame: &[u8], me: [u8; 6]) {
    let Some((ip, mac)) = leasebox_kernel::arp::reply_to(frame, me) else { return };
    let mut a = ARP.lock();
    let Some(i) = a.asking.iter().position(|q| q.ip == ip) else { return };
    a.asking.swap_remove(i);
    let now = now_ms();
    a.known.retain(|(k, _, _)| *k != ip);
    if a.known.len() >= ARP_ENTRIES {
        a.known.remove(0);
    }
    a.known.push((ip, mac, now));
}

/// An ARP request for `target` from `mac`/`sender` (RFC 826), padded to the 60-byte minimum frame.
pub fn arp_request(mac: [u8; 6], sender: Ipv4Addr, target: Ipv4Addr) -> [u8; 60] {
    leasebox_kernel::arp::request(mac, sender, target)
}

static LINK: AtomicU8 = AtomicU8::new(0);
static TX_FRAMES: AtomicU64 = AtomicU64::new(0);
static TX_DROPS: AtomicU64 = AtomicU64::new(0);
static RX_FRAMES: AtomicU64 = AtomicU64::new(0);
static RX_DROPS: AtomicU64 = AtomicU64::new(0);
static RX_OUT_OF_BUFFER: AtomicU64 = AtomicU64::new(0);
static RECOVERIES: AtomicU64 = AtomicU64::new(0);

fn publish_state(s: PortState) {
    LINK.store(
        match s {
            PortState::Down => 1,
            PortState::Active => 2,
            PortState::Unknown(_) => 3,
        },
        Ordering::Relaxed,
    );
}

/// The link state as the ready line and HEALTH report it (`none` without the port).
pub fn link() -> &'static str {
    match LINK.load(Ordering::Relaxed) {
        1 => "down",
        2 => "up",
        3 => "unknown",
        _ => "none",
    }
}

/// One line for HEALTH: link and frame counters (drops include a full ring, frames the driver refused and
/// error completions), the frames the HCA dropped for want of a receive buffer (its Q counter), and how often a
/// queue was brought back from error.
pub fn summary() -> Option<String> {
    (LINK.load(Ordering::Relaxed) != 0).then(|| {
        format!(
            "ctl port link {} tx {} (dropped {}) rx {} (dropped {}) out-of-buffer {} recovered {}",
            link(),
            TX_FRAMES.load(Ordering::Relaxed),
            TX_DROPS.load(Ordering::Relaxed),
            RX_FRAMES.load(Ordering::Relaxed),
            RX_DROPS.load(Ordering::Relaxed),
            RX_OUT_OF_BUFFER.load(Ordering::Relaxed),
            RECOVERIES.load(Ordering::Relaxed)
        )
    })
}

/// smoltcp's device over the port.
pub struct Mlx5Nic {
    port: EthPort<KernelHca>,
    /// The command engine's side client, for the port's maintenance.
    side: Option<SideClient>,
    /// The frame lent to smoltcp by the last `receive`.
    rx: Box<[u8; 2048]>,
    rx_len: usize,
    /// Where a transmit token's frame is written before it is posted.
    spill: Box<[u8; 2048]>,
}

impl Mlx5Nic {
    pub fn mac(&self) -> [u8; 6] {
        self.port.info.mac
    }

    /// Applies a link change announced by the event engine; returns the new state when it changed.
    pub fn update_link(&mut self, announced: Option<PortState>) -> Option<PortState> {
        let s = announced?;
        if s == self.port.state() && LINK.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.port.set_state(s);
        publish_state(s);
        log::info!("net: ctl port link {}", link());
        Some(s)
    }

    pub fn link_up(&self) -> bool {
        self.port.state() == PortState::Active
    }

    /// Sends one frame of our own (a gratuitous ARP).
    pub fn send_raw(&mut self, frame: &[u8]) -> bool {
        self.port.transmit(frame).is_ok()
    }

    /// Sends the ARP requests the neighbour table owes (as `sender`), and forgets addresses asked for too long.
    pub fn ask_neighbours(&mut self, sender: Ipv4Addr) {
        let now = now_ms();
        let mut due = [Ipv4Addr::UNSPECIFIED; 8];
        let mut n = 0;
        {
            let mut a = ARP.lock();
            a.asking.retain(|q| now < q.since_ms + ARP_GIVE_UP_MS);
            for q in a.asking.iter_mut().filter(|q| now >= q.next_ms) {
                if n == due.len() {
                    break;
                }
                q.next_ms = now + ARP_RETRY_MS;
                due[n] = q.ip;
                n += 1;
            }
        }
        let mac = self.mac();
        for &ip in &due[..n] {
            let _ = self.port.transmit(&arp_request(mac, sender, ip));
        }
    }

    /// Reaps send completions, runs the port's maintenance (Q counter, queue recovery) and publishes the
    /// counters.
    pub fn maintain(&mut self) {
        self.port.poll_tx();
        let before = self.port.stats();
        if let Some(side) = self.side.as_mut() {
            self.port.maintain(side, now_ms());
        }
        let s = self.port.stats();
        if s.tx_recoveries != before.tx_recoveries {
            log::warn!("net: ctl port send queue recovered from error ({} so far)", s.tx_recoveries);
        }
        if s.rx_recoveries != before.rx_recoveries {
            log::warn!("net: ctl port receive queue recovered from error ({} so far)", s.rx_recoveries);
        }
        publish_stats(&s);
    }
}

fn publish_stats(s: &EthStats) {
    TX_FRAMES.store(s.tx_frames, Ordering::Relaxed);
    TX_DROPS.store(s.tx_drops + s.tx_errors, Ordering::Relaxed);
    RX_FRAMES.store(s.rx_frames, Ordering::Relaxed);
    RX_DROPS.store(s.rx_drops + s.rx_errors, Ordering::Relaxed);
    RX_OUT_OF_BUFFER.store(s.rx_out_of_buffer, Ordering::Relaxed);
    RECOVERIES.store(s.tx_recoveries + s.rx_recoveries, Ordering::Relaxed);
}

pub struct RxToken<'a> {
    frame: &'a [u8],
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(self.frame)
    }
}

pub struct TxToken<'a> {
    port: &'a mut EthPort<KernelHca>,
    spill: &'a mut [u8; 2048],
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        // smoltcp never asks for more than `MAX_FRAME`; the frame is written here whatever becomes of it,
        // then posted (a full ring or a refused frame is dropped and counted by the driver).
        let len = len.min(self.spill.len());
        let r = f(&mut self.spill[..len]);
        let _ = self.port.transmit(&self.spill[..len]);
        r
    }
}

impl phy::Device for Mlx5Nic {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        // smoltcp may answer a frame at once (an ACK, ARP): leave frames in the queue until a send slot is
        // free, rather than drop the answer.
        if self.port.tx_room() == 0 && self.port.poll_tx() == 0 {
            return None;
        }
        let Mlx5Nic { port, rx, rx_len, spill, .. } = self;
        *rx_len = 0;
        let me = port.info.mac;
        let got = port.receive(RX_BUDGET, |frame| {
            let n = frame.len().min(rx.len());
            rx[..n].copy_from_slice(&frame[..n]);
            *rx_len = n;
            learn(&frame[..n], me);
        });
        if got == 0 {
            return None;
        }
        Some((RxToken { frame: &rx[..*rx_len] }, TxToken { port, spill }))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<TxToken<'_>> {
        if self.port.tx_room() == 0 && self.port.poll_tx() == 0 {
            return None;
        }
        Some(TxToken { port: &mut self.port, spill: &mut self.spill })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME;
        caps
    }
}
