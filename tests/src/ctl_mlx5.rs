//! The control channel on the ConnectX-5 model's own Ethernet port under QEMU: the image booted with
//! the mlx5 model and no virtio-net device at all (`-nic none`; QEMU's user network, the model's Ethernet wire
//! and a client's port joined on hub 0; kernel arguments `ctl_nic=mlx5 rdma_ip=10.0.2.16`), then driven as
//! `cargo xtask run --ctl-nic mlx5` is by hand:
//!
//! 1. the ready line says `ctl_nic=mlx5 link=up` with an address and a ConnectX-5, and QEMU's command line
//!    has no virtio-net;
//! 2. `leasectl ping`, then `alloc` → `ready` → `list` (Active) → `revoke` (TornDown) through the forwarded
//!    control port, which reaches the guest only through the model's port;
//! 3. `leasectl verify --revoke-test --order both --json` with the hub's client port as its RDMA cable and
//!    `--arp`: both orders pass and every iteration learned the appliance's MAC by ARP (`mac_source` `arp`,
//!    `remote_mac` the port's MAC as the appliance logged it);
//! 4. bad input on the wire (item 6), sent from the hub's client port: runt frames, oversize frames, frames
//!    for another unicast MAC, a burst that overruns the receive ring, an ARP storm. Then the appliance still
//!    serves (ping, a second lease cycle), nothing panicked, the port's counters in HEALTH moved, and the
//!    model's Ethernet counters (logged when it stops) counted the drops where they happen: runts, oversize,
//!    steering drops, out of receive buffers.
//!
//! Frame builders and output parsers are pure functions, tested below.

use crate::lease_qemu::{self, Appliance, HUB_RDMA_IP};
use crate::{Artifacts, serial};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::time::Duration;

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "ctl-mlx5-qemu";
/// Its kernel arguments beyond the hub's: every lease on the command path.
pub const LEASE_ARGS: &str = "lease_warm=0";
/// leasectl's address and MAC on the hub (its default MAC is the model port's own, which a shared segment
/// cannot have twice); as `cargo xtask run --ctl-nic mlx5` configures it.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
pub const CLIENT_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x64];
/// The guest's DHCP address on QEMU's user network (its first lease).
const GUEST_DHCP_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// A unicast MAC nobody on the hub has, and a multicast one nobody joined (all-hosts, 224.0.0.1): the port
/// steers only its own MAC and broadcast to its receive queue.
const OTHER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x99];
const MULTICAST_MAC: [u8; 6] = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01];
/// Runt frame lengths: shorter than the 60-byte Ethernet minimum (never 0: QEMU's socket netdev takes an
/// empty datagram for the end of the connection).
const RUNT_LENS: [usize; 6] = [1, 13, 14, 20, 42, 59];
/// Runts sent of each length.
const RUNTS_EACH: usize = 5;
/// Oversize frame lengths (the port's MTU is 1500: 1518 bytes with header and VLAN tag, FCS not carried).
const OVERSIZE_LENS: [usize; 3] = [1600, 2000, 9000];
const OVERSIZE_EACH: usize = 5;
/// Frames (IPv4/UDP) to a unicast MAC that is not the port's, and to a multicast MAC.
const OTHER_MAC_FRAMES: usize = 100;
const MULTICAST_FRAMES: usize = 20;
/// UDP frames to the port's MAC and a closed port, back to back: far more than the 128 receive buffers the
/// driver posts, faster than a TCG guest takes them.
const OVERRUN_FRAMES: usize = 1000;
const CLOSED_PORT: u16 = 9;
/// ARP requests: for the DHCP address, the RDMA address and addresses nobody has, in turn.
const ARP_STORM: usize = 2000;
/// Datagrams sent between short pauses, so that the host's socket buffers (QEMU's, the model's) keep up while
/// the guest cannot.
const CHUNK: usize = 50;
const CHUNK_PAUSE: Duration = Duration::from_millis(1);
/// After each kind whose every frame the model must count (runts, oversize, other MACs): time for the host's
/// socket buffers to drain, so that a busy host loses none of them before the model sees them.
const KIND_PAUSE: Duration = Duration::from_millis(100);
/// How long the guest gets to work through what it was sent before it is asked again.
const SETTLE: Duration = Duration::from_secs(3);
/// How long to wait for the appliance's ARP reply after the storm (one request a second).
const ARP_WAIT: Duration = Duration::from_secs(20);

// ---- frames ----

/// An Ethernet II frame.
pub fn eth_frame(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An ARP request (RFC 826, Ethernet/IPv4) to broadcast, padded to the 60-byte minimum.
pub fn arp_request(src_mac: [u8; 6], src_ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut p = Vec::with_capacity(46);
    p.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // htype 1, ptype IPv4, hlen 6, plen 4, op request
    p.extend_from_slice(&src_mac);
    p.extend_from_slice(&src_ip.octets());
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&target.octets());
    p.resize(46, 0);
    eth_frame([0xff; 6], src_mac, 0x0806, &p)
}

/// An ARP packet in an Ethernet frame: (op, sender MAC, sender IP, target MAC, target IP).
pub type Arp = (u16, [u8; 6], Ipv4Addr, [u8; 6], Ipv4Addr);

/// The ARP packet (Ethernet/IPv4) in `frame`, if it is one.
pub fn parse_arp(frame: &[u8]) -> Option<Arp> {
    let p = frame.get(14..42)?;
    if frame[12..14] != [0x08, 0x06] || p[..6] != [0, 1, 0x08, 0x00, 6, 4] {
        return None;
    }
    let mac = |at: usize| -> [u8; 6] { p[at..at + 6].try_into().unwrap_or_default() };
    let ip = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
    Some((u16::from_be_bytes([p[6], p[7]]), mac(8), ip(14), mac(18), ip(24)))
}

/// The Internet checksum (RFC 1071) of `b`.
pub fn internet_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP frame (UDP checksum 0: none), padded to the 60-byte minimum.
pub fn udp_frame(dst_mac: [u8; 6], src_mac: [u8; 6], src: SocketAddrV4, dst: SocketAddrV4, data: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + data.len();
    let mut ip = Vec::with_capacity(total);
    ip.extend_from_slice(&[0x45, 0]);
    ip.extend_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]); // id 0, DF, TTL 64, UDP, checksum below
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    let sum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&src.port().to_be_bytes());
    ip.extend_from_slice(&dst.port().to_be_bytes());
    ip.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(data);
    let mut f = eth_frame(dst_mac, src_mac, 0x0800, &ip);
    if f.len() < 60 {
        f.resize(60, 0);
    }
    f
}

/// A frame of `len` bytes to `dst` (a plain IPv4 ethertype, then a counting pattern; cut short if `len` < 14).
pub fn sized_frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = eth_frame(dst, src, 0x0800, &[]);
    f.extend((0..len.saturating_sub(f.len())).map(|i| i as u8));
    f.truncate(len);
    f
}

// ---- parsers ----

/// `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

pub fn mac_string(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// The control port's MAC from the serial log: `net: the ConnectX-5 port mac 02:4c:42:00:00:01 address ...`.
pub fn parse_port_mac(lines: &[String]) -> Option<[u8; 6]> {
    lines.iter().find_map(|l| {
        let rest = &l[l.find("net: the ConnectX-5 port mac ")? + "net: the ConnectX-5 port mac ".len()..];
        parse_mac(rest.split_whitespace().next()?)
    })
}

/// The control port's line in HEALTH's message:
/// `ctl port link up tx N (dropped N) rx N (dropped N) out-of-buffer N recovered N`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CtlPort {
    pub link: String,
    pub tx: u64,
    pub tx_dropped: u64,
    pub rx: u64,
    pub rx_dropped: u64,
    /// Frames the HCA dropped for want of a receive buffer (the port's Q counter).
    pub out_of_buffer: u64,
    /// Send and receive queue recoveries from error.
    pub recovered: u64,
}

pub fn parse_ctl_port(text: &str) -> Option<CtlPort> {
    let rest = &text[text.find("ctl port link ")? + "ctl port link ".len()..];
    let w: Vec<&str> = rest.split_whitespace().take(13).collect();
    let n = |s: &str| s.trim_end_matches([')', ';', ',']).parse::<u64>().ok();
    match w.as_slice() {
        [link, "tx", tx, "(dropped", txd, "rx", rx, "(dropped", rxd, "out-of-buffer", oob, "recovered", rec] => {
            Some(CtlPort {
                link: link.to_string(),
                tx: n(tx)?,
                tx_dropped: n(txd)?,
                rx: n(rx)?,
                rx_dropped: n(rxd)?,
                out_of_buffer: n(oob)?,
                recovered: n(rec)?,
            })
        }
        _ => None,
    }
}

/// The model's Ethernet counters from its log: the last `mlx5-model: ethernet EthCounters { name: N, ... }`.
pub fn parse_model_eth(log: &str) -> Result<BTreeMap<String, u64>, String> {
    const MARK: &str = "mlx5-model: ethernet EthCounters {";
    let line = log.lines().rev().find(|l| l.contains(MARK)).ok_or("the model logged no Ethernet counters")?;
    let body = &line[line.find(MARK).unwrap_or(0) + MARK.len()..];
    let body = body.trim().strip_suffix('}').ok_or_else(|| format!("unterminated counters: {line}"))?;
    body.split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (k, v) = f.split_once(':').ok_or_else(|| format!("`{f}` in {line}"))?;
            let v = v.trim().parse().map_err(|_| format!("`{f}` in {line}"))?;
            Ok((k.trim().to_string(), v))
        })
        .collect()
}

/// Serial lines that say the guest failed.
fn fatal_line(lines: &[String]) -> Option<&String> {
    lines.iter().find(|l| l.contains("!!!") || l.contains("PANIC") || l.contains("panicked"))
}

// ---- the scenario ----

fn expect(what: &str, ok: bool, got: &dyn std::fmt::Debug) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("{what}: got {got:?}")) }
}

/// The `ctl-mlx5-qemu` scenario: one boot.
pub fn run(a: &Artifacts) -> Result<String, String> {
    // The command path (`lease_warm=0`): the default is UMR (`lease-qemu` checks it); this boot keeps the
    // commands under the same lease cycle and revoke verifier (REVOKE -> TornDown -> REM_ACCESS_ERR).
    let mut app = Appliance::boot_hub(a, &a.elf, NAME, LEASE_ARGS)?;
    if let Err(e) = check_ready(&app.ready).and_then(|()| lease_qemu::check_paths(&app.ready, "commands")) {
        return Err(app.fail(e));
    }
    let bin = a.leasectl_bin.clone();
    let r = checks(&mut app, &bin);
    app.drain();
    let (summary, sent, health1) = match r {
        Ok(x) => x,
        Err(e) => return Err(app.fail(e)),
    };
    // Stop QEMU and the model: the model logs its Ethernet counters as it stops.
    let model_log = app.model_log.clone();
    let serial_log = app.log_path().to_path_buf();
    drop(app);
    let text = std::fs::read_to_string(&model_log).map_err(|e| format!("{}: {e}", model_log.display()))?;
    let c = parse_model_eth(&text).map_err(|e| format!("{e} (log {})", model_log.display()))?;
    let get = |k: &str| c.get(k).copied().unwrap_or(0);
    let want = [
        ("rx_runt", sent.runts),
        ("rx_oversize", sent.oversize),
        ("rx_steering_drop", sent.other_mac),
        ("rx_out_of_buffer", 1),
    ];
    let short: Vec<String> =
        want.iter().filter(|(k, n)| get(k) < *n).map(|(k, n)| format!("{k} {} (expected >= {n})", get(k))).collect();
    if !short.is_empty() || health1.out_of_buffer > get("rx_out_of_buffer") {
        return Err(format!(
            "the model did not count the bad frames, or HEALTH's out-of-buffer {} is more than the model's: {}; its \
             counters: {c:?}\n    model log: {}\n    serial log: {}",
            health1.out_of_buffer,
            short.join(", "),
            model_log.display(),
            serial_log.display()
        ));
    }
    Ok(format!(
        "{summary}; model counted rx_runt {} rx_oversize {} rx_steering_drop {} rx_out_of_buffer {} (rx_frames {}, \
         tx_frames {})",
        get("rx_runt"),
        get("rx_oversize"),
        get("rx_steering_drop"),
        get("rx_out_of_buffer"),
        get("rx_frames"),
        get("tx_frames"),
    ))
}

/// What was sent of each kind of bad frame (the minimum the model must have counted).
#[derive(Clone, Copy, Debug, Default)]
struct Sent {
    runts: u64,
    oversize: u64,
    other_mac: u64,
}

fn checks(app: &mut Appliance, bin: &Path) -> Result<(String, Sent, CtlPort), String> {
    let hub = app.hub.ok_or("booted without the hub")?;
    // 1. No virtio-net anywhere on QEMU's command line; the address and the ConnectX-5 were checked at boot.
    expect("QEMU's command line has no virtio-net", !app.command.contains("virtio-net"), &app.command)?;
    expect("QEMU's command line has -nic none", app.command.contains("-nic none"), &app.command)?;
    let port_mac = parse_port_mac(app.serial_lines()).ok_or("no `net: the ConnectX-5 port mac ...` line")?;

    // 2. The lease service through the model's port.
    let out = app.leasectl(bin, false, &["ping"])?;
    expect("leasectl ping", out.contains("pong"), &out)?;
    let cli_us = lease_qemu::cli_cycle(app, bin)?;

    // 3. The revoke verifier over the hub, the appliance's MAC found by ARP.
    let (peer, bind) = (hub.client.local.to_string(), hub.client.peer.to_string());
    let (ip, mac) = (CLIENT_IP.to_string(), mac_string(&CLIENT_MAC));
    let cable = ["--udp", &peer, "--bind", &bind, "--local-ip", &ip, "--mac", &mac, "--arp"];
    let (vf, runs) = lease_qemu::verify_revoke_test(app, bin, &cable)?;
    let want_mac = mac_string(&port_mac);
    for r in &runs {
        for (n, i) in r.iterations.iter().enumerate() {
            let ok = i.mac_source.as_deref() == Some("arp") && i.remote_mac.as_deref() == Some(want_mac.as_str());
            expect(&format!("verify {} iteration {n}: the appliance's MAC {want_mac} by ARP", r.order), ok, i)?;
        }
    }
    let health0 = health(app, bin)?;

    // 4. Bad input on the wire.
    let s = UdpSocket::bind(hub.client.peer)
        .map_err(|e| format!("binding the hub's client port {}: {e}", hub.client.peer))?;
    let sent = bad_input(&s, hub.client, port_mac)?;
    std::thread::sleep(SETTLE);
    let stray = arp_after_storm(&s, hub.client, port_mac)?;
    drop(s);
    let out = app.leasectl(bin, false, &["ping"])?;
    expect("leasectl ping after the bad input", out.contains("pong"), &out)?;
    let cli2_us = lease_qemu::cli_cycle(app, bin)?;
    // RDMA through the port as before: the verifier's leases, ARP, the revoke orders.
    lease_qemu::verify_revoke_test(app, bin, &cable).map_err(|e| format!("after the bad input: {e}"))?;
    let health1 = health(app, bin)?;
    expect("the ctl port's link after the bad input", health1.link == "up", &health1)?;
    // The ARP storm and the burst reached the driver (what it could take of them).
    expect("HEALTH's ctl port rx count moved", health1.rx > health0.rx, &(&health0, &health1))?;
    // The overrun burst: the driver reads the port's Q counter every second, and the checks since took longer.
    expect(
        "HEALTH's ctl port counted the overrun's out-of-buffer drops",
        health1.out_of_buffer > health0.out_of_buffer,
        &(&health0, &health1),
    )?;
    expect("no queue needed recovery", health1.recovered == 0, &health1)?;
    if let Some(l) = fatal_line(app.serial_lines()) {
        return Err(format!("the guest failed: {l}"));
    }
    let orders: Vec<String> =
        vf.orders.iter().map(|(o, recall, _, status)| format!("{o} {status} (recall max {recall} us)")).collect();
    Ok((
        format!(
            "ready {} {} ip={} grant=commands revoke=commands ({LEASE_ARGS}); no virtio-net; leasectl ping/alloc/ready/list/revoke ok (TornDown in {cli_us} us); \
             verify --arp over the hub: {}, MAC {want_mac} by ARP in every iteration; bad input (runts {}, \
             oversize {}, other/multicast MAC {}, overrun burst {OVERRUN_FRAMES}, ARP storm {ARP_STORM}): ARP for \
             {HUB_RDMA_IP} answered after it ({stray} frames had come back), ping, lease cycle (TornDown in \
             {cli2_us} us) and verify --arp pass again, no panic; HEALTH ctl port rx {} -> {} (dropped {} -> {}), \
             tx {} -> {}, out-of-buffer {} -> {}",
            app.ready.get("ctl_nic").unwrap_or("?"),
            app.ready.get("link").map_or("?".to_string(), |l| format!("link={l}")),
            app.ready.get("ip").unwrap_or("?"),
            orders.join(", "),
            sent.runts,
            sent.oversize,
            sent.other_mac,
            health0.rx,
            health1.rx,
            health0.rx_dropped,
            health1.rx_dropped,
            health0.tx,
            health1.tx,
            health0.out_of_buffer,
            health1.out_of_buffer,
        ),
        sent,
        health1,
    ))
}

fn health(app: &Appliance, bin: &Path) -> Result<CtlPort, String> {
    let out = app.leasectl(bin, false, &["health"])?;
    parse_ctl_port(&out).ok_or_else(|| format!("no `ctl port link ...` in leasectl health: {out}"))
}

/// Sends the bad frames from the hub's client port `s` (bound at `client.peer`); returns how many of each kind
/// went out.
fn bad_input(s: &UdpSocket, client: leasebox_qemu::HubSocket, port_mac: [u8; 6]) -> Result<Sent, String> {
    let mut sent = Sent::default();
    let mut n = 0usize;
    let mut send = |f: &[u8]| -> Result<(), String> {
        s.send_to(f, client.local).map_err(|e| format!("sending {} bytes to {}: {e}", f.len(), client.local))?;
        n += 1;
        if n.is_multiple_of(CHUNK) {
            std::thread::sleep(CHUNK_PAUSE);
        }
        Ok(())
    };
    for len in RUNT_LENS {
        for _ in 0..RUNTS_EACH {
            send(&sized_frame(port_mac, CLIENT_MAC, len))?;
            sent.runts += 1;
        }
    }
    std::thread::sleep(KIND_PAUSE);
    for len in OVERSIZE_LENS {
        for _ in 0..OVERSIZE_EACH {
            send(&sized_frame(port_mac, CLIENT_MAC, len))?;
            sent.oversize += 1;
        }
    }
    std::thread::sleep(KIND_PAUSE);
    let from = SocketAddrV4::new(CLIENT_IP, 40000);
    let to = SocketAddrV4::new(GUEST_DHCP_IP, CLOSED_PORT);
    for i in 0..OTHER_MAC_FRAMES {
        send(&udp_frame(OTHER_MAC, CLIENT_MAC, from, to, &(i as u32).to_be_bytes()))?;
        sent.other_mac += 1;
    }
    let group = SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 1), CLOSED_PORT);
    for i in 0..MULTICAST_FRAMES {
        send(&udp_frame(MULTICAST_MAC, CLIENT_MAC, from, group, &(i as u32).to_be_bytes()))?;
        sent.other_mac += 1;
    }
    std::thread::sleep(KIND_PAUSE);
    for i in 0..OVERRUN_FRAMES {
        send(&udp_frame(port_mac, CLIENT_MAC, from, to, &(i as u32).to_be_bytes()))?;
    }
    for i in 0..ARP_STORM {
        let target = match i % 4 {
            0 => GUEST_DHCP_IP,
            1 => HUB_RDMA_IP,
            // Addresses nobody on 10.0.2.0/24 has (QEMU's user network answers for .2 and .3 only).
            _ => Ipv4Addr::new(10, 0, 2, 150 + (i % 100) as u8),
        };
        send(&arp_request(CLIENT_MAC, CLIENT_IP, target))?;
    }
    Ok(sent)
}

/// After the storm: what the client port received so far has no ARP reply from the port for an address that
/// is not the appliance's; then a fresh ARP request for the RDMA address is answered with the port's MAC.
/// Returns how many frames were waiting.
fn arp_after_storm(s: &UdpSocket, client: leasebox_qemu::HubSocket, port_mac: [u8; 6]) -> Result<usize, String> {
    let mut buf = vec![0u8; 65536];
    let mut waiting = 0;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    while let Ok((n, _)) = s.recv_from(&mut buf) {
        waiting += 1;
        if let Some(a @ (2, mac, ip, ..)) = parse_arp(&buf[..n])
            && mac == port_mac
            && ip != HUB_RDMA_IP
            && ip != GUEST_DHCP_IP
        {
            return Err(format!("the port answered ARP for an address it does not have: {a:?}"));
        }
    }
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(1))).map_err(|e| e.to_string())?;
    let end = std::time::Instant::now() + ARP_WAIT;
    while std::time::Instant::now() < end {
        let req = arp_request(CLIENT_MAC, CLIENT_IP, HUB_RDMA_IP);
        s.send_to(&req, client.local).map_err(|e| format!("sending an ARP request: {e}"))?;
        let until = std::time::Instant::now() + Duration::from_secs(1);
        while std::time::Instant::now() < until {
            let Ok((n, _)) = s.recv_from(&mut buf) else { break };
            if parse_arp(&buf[..n]) == Some((2, port_mac, HUB_RDMA_IP, CLIENT_MAC, CLIENT_IP)) {
                return Ok(waiting);
            }
        }
    }
    Err(format!("no ARP reply for {HUB_RDMA_IP} from {} within {ARP_WAIT:?} after the storm", mac_string(&port_mac)))
}

/// The ready line of a hub boot, for checks on sample text.
pub fn check_ready(r: &serial::Ready) -> Result<(), String> {
    let get = |k| r.get(k).unwrap_or("");
    if get("ctl_nic") != "mlx5" || get("link") != "up" || get("ip").is_empty() || get("ip") == "none" {
        return Err(format!("ready line: ctl_nic={} link={} ip={}", get("ctl_nic"), get("link"), get("ip")));
    }
    if get("hca") != "ConnectX-5" {
        return Err(format!("ready line: hca={}", get("hca")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_known_header() {
        // RFC 1071's worked bytes and a textbook IPv4 header (checksum 0xb861).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(internet_checksum(&h), 0xb861);
        assert_eq!(internet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), !0xddf2);
        // Odd length: the last byte is the high half of a word.
        assert_eq!(internet_checksum(&[0x01]), !0x0100);
    }

    #[test]
    fn arp_request_layout() {
        let f = arp_request(CLIENT_MAC, CLIENT_IP, HUB_RDMA_IP);
        assert_eq!(f.len(), 60);
        assert_eq!(&f[..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &CLIENT_MAC);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[14..22], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&f[22..28], &CLIENT_MAC);
        assert_eq!(&f[28..32], &[10, 0, 2, 100]);
        assert_eq!(&f[32..38], &[0; 6]);
        assert_eq!(&f[38..42], &[10, 0, 2, 16]);
    }

    #[test]
    fn arp_parsing() {
        let req = arp_request(CLIENT_MAC, CLIENT_IP, HUB_RDMA_IP);
        assert_eq!(parse_arp(&req), Some((1, CLIENT_MAC, CLIENT_IP, [0; 6], HUB_RDMA_IP)));
        // A reply: op 2, sender and target filled in.
        let mut reply = req.clone();
        reply[21] = 2;
        reply[22..28].copy_from_slice(&OTHER_MAC);
        reply[28..32].copy_from_slice(&HUB_RDMA_IP.octets());
        reply[32..38].copy_from_slice(&CLIENT_MAC);
        reply[38..42].copy_from_slice(&CLIENT_IP.octets());
        assert_eq!(parse_arp(&reply), Some((2, OTHER_MAC, HUB_RDMA_IP, CLIENT_MAC, CLIENT_IP)));
        assert_eq!(parse_arp(&req[..41]), None, "truncated");
        let from = SocketAddrV4::new(CLIENT_IP, 1);
        assert_eq!(parse_arp(&udp_frame(OTHER_MAC, CLIENT_MAC, from, from, &[])), None, "IPv4");
        let mut ipv6 = req.clone();
        ipv6[16..18].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(parse_arp(&ipv6), None, "not Ethernet/IPv4");
    }

    #[test]
    fn udp_frame_layout() {
        let from = SocketAddrV4::new(CLIENT_IP, 40000);
        let to = SocketAddrV4::new(GUEST_DHCP_IP, 9);
        let f = udp_frame(OTHER_MAC, CLIENT_MAC, from, to, &[1, 2, 3, 4]);
        assert_eq!(f.len(), 60, "padded to the minimum");
        assert_eq!(&f[..6], &OTHER_MAC);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = &f[14..14 + 32];
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 32);
        assert_eq!(ip[9], 17);
        assert_eq!(internet_checksum(&ip[..20]), 0, "a valid header sums to zero");
        assert_eq!(&ip[20..28], &[0x9c, 0x40, 0, 9, 0, 12, 0, 0]);
        assert_eq!(&ip[28..32], &[1, 2, 3, 4]);
        let big = udp_frame(OTHER_MAC, CLIENT_MAC, from, to, &[0; 100]);
        assert_eq!(big.len(), 14 + 20 + 8 + 100);
    }

    #[test]
    fn sized_frames() {
        for len in [1, 13, 14, 20, 59, 2000, 9000] {
            let f = sized_frame(OTHER_MAC, CLIENT_MAC, len);
            assert_eq!(f.len(), len);
            assert_eq!(f[0], OTHER_MAC[0]);
        }
        assert_eq!(&sized_frame(OTHER_MAC, CLIENT_MAC, 14)[12..], &[0x08, 0x00]);
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02:4c:42:00:00:64"), Some(CLIENT_MAC));
        assert_eq!(mac_string(&CLIENT_MAC), "02:4c:42:00:00:64");
        assert_eq!(parse_mac("02:4c:42:00:00"), None);
        assert_eq!(parse_mac("02:4c:42:00:00:64:01"), None);
        assert_eq!(parse_mac("2:4c:42:00:00:64"), None);
        let lines = vec![
            "[    1.0] c0 INFO  mlx5: Ethernet port mac [02, 4c, 42, 00, 00, 01] inline mode 1".to_string(),
            "[    1.1] c0 INFO  net: the ConnectX-5 port mac 02:4c:42:00:00:01 address dhcp rdma 10.0.2.16".to_string(),
        ];
        assert_eq!(parse_port_mac(&lines), Some([2, 0x4c, 0x42, 0, 0, 1]));
        assert_eq!(parse_port_mac(&lines[..1]), None);
    }

    #[test]
    fn ctl_port_in_health() {
        let h = "status ok, HCA ok, 0 fenced slots, uptime 12.3 s: ConnectX-5 fw 16.35.1012; cmds 40 ok 40 failed 0 \
                 timeout 0 late 0 aborted 0; ctl port link up tx 120 (dropped 0) rx 3021 (dropped 7) out-of-buffer \
                 412 recovered 1\n";
        let want = CtlPort {
            link: "up".into(),
            tx: 120,
            tx_dropped: 0,
            rx: 3021,
            rx_dropped: 7,
            out_of_buffer: 412,
            recovered: 1,
        };
        assert_eq!(parse_ctl_port(h), Some(want));
        let cut =
            "...; ctl port link down tx 1 (dropped 0) rx 2 (dropped 0) out-of-buffer 0 recovered 0\nCREATE_MKEY ok";
        assert_eq!(parse_ctl_port(cut).map(|p| (p.link, p.rx)), Some(("down".into(), 2)));
        assert_eq!(parse_ctl_port("status ok, HCA ok: ConnectX-5"), None);
        assert_eq!(
            parse_ctl_port("ctl port link up tx many (dropped 0) rx 1 (dropped 0) out-of-buffer 0 recovered 0"),
            None
        );
        assert_eq!(
            parse_ctl_port("ctl port link up tx 1 (dropped 0) rx 2 (dropped 0)"),
            None,
            "the counters are there"
        );
    }

    #[test]
    fn model_counters() {
        let log = "mlx5-model: ready bar=/dev/shm/x\n\
                   mlx5-model: ethernet EthCounters { tx_frames: 10, tx_bytes: 900, rx_frames: 3, rx_runt: 30, \
                   rx_oversize: 15, rx_out_of_buffer: 412 }\n";
        let c = parse_model_eth(log).unwrap();
        assert_eq!(c["rx_runt"], 30);
        assert_eq!(c["rx_out_of_buffer"], 412);
        assert_eq!(c.len(), 6);
        assert!(parse_model_eth("mlx5-model: ready\n").is_err());
        assert!(parse_model_eth("mlx5-model: ethernet EthCounters { rx_runt: x }").is_err());
        assert!(parse_model_eth("mlx5-model: ethernet EthCounters { rx_runt: 1").is_err());
    }

    #[test]
    fn ready_lines() {
        let ok = "leasebox: ready cores=1 ip=10.0.2.15 hca=ConnectX-5 ctl_nic=mlx5 link=up";
        assert_eq!(check_ready(&serial::parse_ready(ok).unwrap()), Ok(()));
        for bad in [
            "leasebox: ready cores=1 ip=10.0.2.15 hca=ConnectX-5 ctl_nic=virtio link=up",
            "leasebox: ready cores=1 ip=10.0.2.15 hca=ConnectX-5 ctl_nic=mlx5 link=down",
            "leasebox: ready cores=1 ip=none hca=ConnectX-5 ctl_nic=mlx5 link=up",
            "leasebox: ready cores=1 ip=10.0.2.15 hca=none ctl_nic=mlx5 link=up",
        ] {
            assert!(check_ready(&serial::parse_ready(bad).unwrap()).is_err(), "{bad}");
        }
        assert!(fatal_line(&["!!! page fault".to_string()]).is_some());
        assert!(fatal_line(&["net: DHCP lease 10.0.2.15/24".to_string()]).is_none());
    }
}
