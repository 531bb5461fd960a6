//! Host tests of the buffer bookkeeping and the smoltcp Device over a fake virtio-net device that behaves
//! like QEMU's: it fills posted receive buffers in order (header + frame, written through the pointer it was
//! given, as DMA would), consumes transmissions at once unless told to hold them, and refuses tokens out of
//! order.

use super::*;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, RxToken as _, TxToken as _};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;
use virtio_drivers::Error;

const HDR: usize = 12;

struct FakeDevice {
    mac: [u8; 6],
    rx_tokens: Vec<u16>,
    /// Posted receive buffers, in posting order (the device fills them in this order).
    rx_posted: VecDeque<(u16, *mut u8, usize)>,
    /// Filled buffers: (token, pointer, bytes written).
    rx_used: VecDeque<(u16, *mut u8, usize)>,
    tx_tokens: Vec<u16>,
    /// Transmissions the device has not finished (only while `hold_tx`).
    tx_held: VecDeque<(u16, *const u8, usize)>,
    tx_used: VecDeque<(u16, *const u8, usize)>,
    hold_tx: bool,
    fail_next_post: bool,
    /// Frames sent, without their header.
    wire: Vec<Vec<u8>>,
    /// Frames that arrived with no receive buffer posted.
    dropped: usize,
}

impl FakeDevice {
    fn new(last_mac_byte: u8) -> Self {
        FakeDevice {
            mac: [0x02, 0, 0, 0, 0, last_mac_byte],
            rx_tokens: (0..QUEUE_SIZE as u16).rev().collect(),
            rx_posted: VecDeque::new(),
            rx_used: VecDeque::new(),
            tx_tokens: (0..QUEUE_SIZE as u16).rev().collect(),
            tx_held: VecDeque::new(),
            tx_used: VecDeque::new(),
            hold_tx: false,
            fail_next_post: false,
            wire: Vec::new(),
            dropped: 0,
        }
    }

    /// A frame arrives from the network.
    fn deliver(&mut self, frame: &[u8]) {
        let Some((token, ptr, len)) = self.rx_posted.pop_front() else {
            self.dropped += 1;
            return;
        };
        assert!(HDR + frame.len() <= len);
        // SAFETY: the NIC posted `ptr..ptr + len` and promised not to touch it until the token is completed,
        // so the fake device may write it, as DMA would.
        unsafe {
            core::ptr::write_bytes(ptr, 0, HDR);
            core::ptr::copy_nonoverlapping(frame.as_ptr(), ptr.add(HDR), frame.len());
        }
        self.rx_used.push_back((token, ptr, HDR + frame.len()));
    }

    /// Finishes every held transmission.
    fn release_tx(&mut self) {
        self.tx_used.extend(self.tx_held.drain(..));
    }
}

impl NetQueues for FakeDevice {
    fn mac_address(&self) -> [u8; 6] {
        self.mac
    }
    fn fill_buffer_header(&self, buf: &mut [u8]) -> Result<usize, Error> {
        buf.get_mut(..HDR).ok_or(Error::InvalidParam)?.fill(0);
        Ok(HDR)
    }
    unsafe fn receive_begin(&mut self, buf: &mut [u8]) -> Result<u16, Error> {
        if std::mem::take(&mut self.fail_next_post) {
            return Err(Error::QueueFull);
        }
        assert!(buf.len() >= 1526, "virtio-drivers refuses smaller receive buffers");
        let token = self.rx_tokens.pop().ok_or(Error::QueueFull)?;
        self.rx_posted.push_back((token, buf.as_mut_ptr(), buf.len()));
        Ok(token)
    }
    fn poll_receive(&self) -> Option<u16> {
        self.rx_used.front().map(|u| u.0)
    }
    unsafe fn receive_complete(&mut self, token: u16, buf: &mut [u8]) -> Result<(usize, usize), Error> {
        let &(t, ptr, written) = self.rx_used.front().ok_or(Error::NotReady)?;
        if t != token {
            return Err(Error::WrongToken);
        }
        assert_eq!(ptr, buf.as_mut_ptr(), "a buffer must come back under its own token");
        self.rx_used.pop_front();
        self.rx_tokens.push(token);
        Ok((HDR, written - HDR))
    }
    unsafe fn transmit_begin(&mut self, buf: &[u8]) -> Result<u16, Error> {
        let token = self.tx_tokens.pop().ok_or(Error::QueueFull)?;
        self.wire.push(buf[HDR..].to_vec());
        let entry = (token, buf.as_ptr(), buf.len());
        if self.hold_tx {
            self.tx_held.push_back(entry)
        } else {
            self.tx_used.push_back(entry)
        }
        Ok(token)
    }
    fn poll_transmit(&mut self) -> Option<u16> {
        self.tx_used.front().map(|u| u.0)
    }
    unsafe fn transmit_complete(&mut self, token: u16, buf: &[u8]) -> Result<usize, Error> {
        let &(t, ptr, len) = self.tx_used.front().ok_or(Error::NotReady)?;
        if t != token {
            return Err(Error::WrongToken);
        }
        assert_eq!((ptr, len), (buf.as_ptr(), buf.len()), "the same buffer and length come back");
        self.tx_used.pop_front();
        self.tx_tokens.push(token);
        Ok(len)
    }
}

fn frame(n: usize) -> Vec<u8> {
    (0..60 + n % 1000).map(|i| (i + n) as u8).collect()
}

fn recv_one(nic: &mut VirtioNic<FakeDevice>) -> Option<Vec<u8>> {
    let (rx, _tx) = nic.receive(Instant::ZERO)?;
    Some(rx.consume(|f| f.to_vec()))
}

fn send_one(nic: &mut VirtioNic<FakeDevice>, byte: u8) -> bool {
    match nic.transmit(Instant::ZERO) {
        Some(tx) => {
            tx.consume(100, |b| b.fill(byte));
            true
        }
        None => false,
    }
}

#[test]
fn every_receive_buffer_is_posted_at_once() {
    let nic = VirtioNic::new(FakeDevice::new(1));
    assert_eq!(nic.mac(), [2, 0, 0, 0, 0, 1]);
    let dev = &nic.queues;
    assert_eq!(dev.rx_posted.len(), QUEUE_SIZE);
    let mut ptrs: Vec<_> = dev.rx_posted.iter().map(|p| p.1 as usize).collect();
    ptrs.sort();
    assert!(ptrs.windows(2).all(|w| w[1] - w[0] >= BUF_LEN), "buffers never overlap");
}

#[test]
fn frames_come_through_in_order_and_buffers_cycle() {
    let mut nic = VirtioNic::new(FakeDevice::new(1));
    let mut n = 0;
    for round in 0..10 {
        // More than a ring's worth over the rounds, fewer than a ring per batch.
        let batch = 5 + round % 7;
        for k in 0..batch {
            nic.queues_mut().deliver(&frame(n + k));
        }
        for k in 0..batch {
            assert_eq!(recv_one(&mut nic).as_deref(), Some(&frame(n + k)[..]));
        }
        n += batch;
        assert_eq!(recv_one(&mut nic), None);
        assert_eq!(nic.queues.rx_posted.len(), QUEUE_SIZE, "all buffers back on the ring");
    }
    assert_eq!(nic.stats().rx_frames, n as u64);
    assert_eq!(nic.queues.dropped, 0);
}

#[test]
fn transmissions_carry_a_header_and_free_their_buffers() {
    let mut nic = VirtioNic::new(FakeDevice::new(1));
    for i in 0..3 * QUEUE_SIZE {
        assert!(send_one(&mut nic, i as u8));
    }
    let wire = &nic.queues.wire;
    assert_eq!(wire.len(), 3 * QUEUE_SIZE);
    assert!(wire.iter().enumerate().all(|(i, f)| f.len() == 100 && f.iter().all(|&b| b == i as u8)));
    assert_eq!(nic.stats().tx_frames, 3 * QUEUE_SIZE as u64);
}

#[test]
fn a_full_transmit_ring_holds_back_receive_until_the_device_catches_up() {
    let mut nic = VirtioNic::new(FakeDevice::new(1));
    nic.queues_mut().hold_tx = true;
    for i in 0..QUEUE_SIZE {
        assert!(send_one(&mut nic, i as u8));
    }
    assert!(!send_one(&mut nic, 0xff), "no buffer left");
    nic.queues_mut().deliver(&frame(7));
    assert_eq!(recv_one(&mut nic), None, "receiving waits for a transmit buffer (smoltcp may answer at once)");
    nic.queues_mut().release_tx();
    assert_eq!(recv_one(&mut nic).as_deref(), Some(&frame(7)[..]));
    assert!(send_one(&mut nic, 1));
    assert_eq!(nic.stats().tx_dropped, 0);
}

#[test]
fn a_failed_post_is_retried() {
    let mut nic = VirtioNic::new(FakeDevice::new(1));
    nic.queues_mut().deliver(&frame(1));
    nic.queues_mut().fail_next_post = true;
    assert!(recv_one(&mut nic).is_some());
    // The lent buffer could not be posted on this call...
    nic.queues_mut().fail_next_post = true;
    assert_eq!(recv_one(&mut nic), None);
    assert_eq!(nic.queues.rx_posted.len(), QUEUE_SIZE - 1);
    // ...and goes back on the next.
    assert_eq!(recv_one(&mut nic), None);
    assert_eq!(nic.queues.rx_posted.len(), QUEUE_SIZE);
    assert_eq!(nic.stats().rx_errors, 1);
}

#[test]
fn a_completion_under_an_unknown_token_stops_receiving_without_a_panic() {
    let mut nic = VirtioNic::new(FakeDevice::new(1));
    let stray = (QUEUE_SIZE as u16 + 3, core::ptr::null_mut(), HDR + 60);
    nic.queues_mut().rx_used.push_back(stray);
    assert_eq!(recv_one(&mut nic), None);
    assert_eq!(nic.stats().rx_errors, 1);
    assert!(send_one(&mut nic, 1), "transmission still works");
}

#[test]
fn capabilities_are_plain_ethernet() {
    let nic = VirtioNic::new(FakeDevice::new(1));
    let caps = nic.capabilities();
    assert_eq!(caps.medium, Medium::Ethernet);
    assert_eq!(caps.max_transmission_unit, 1514);
}

/// One end of the test network: a NIC, its interface and its sockets.
struct Host {
    nic: VirtioNic<FakeDevice>,
    iface: Interface,
    sockets: SocketSet<'static>,
}

impl Host {
    fn new(n: u8) -> Host {
        let mut nic = VirtioNic::new(FakeDevice::new(n));
        let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(nic.mac())));
        cfg.random_seed = u64::from(n);
        let mut iface = Interface::new(cfg, &mut nic, Instant::ZERO);
        iface.update_ip_addrs(|a| a.push(IpCidr::new(IpAddress::v4(10, 0, 0, n), 24)).unwrap());
        Host { nic, iface, sockets: SocketSet::new(vec![]) }
    }

    fn tcp(&mut self) -> smoltcp::iface::SocketHandle {
        let buf = || tcp::SocketBuffer::new(vec![0; 64 * 1024]);
        self.sockets.add(tcp::Socket::new(buf(), buf()))
    }
}

/// Moves every frame `from` sent to `to`, as a cable would.
fn carry(from: &mut Host, to: &mut Host) {
    for f in std::mem::take(&mut from.nic.queues_mut().wire) {
        to.nic.queues_mut().deliver(&f);
    }
}

#[test]
fn tcp_echo_between_two_nics() {
    let (mut server, mut client) = (Host::new(1), Host::new(2));
    let s = server.tcp();
    server.sockets.get_mut::<tcp::Socket>(s).listen(7470).unwrap();
    let c = client.tcp();
    let cx = client.iface.context();
    client.sockets.get_mut::<tcp::Socket>(c).connect(cx, (IpAddress::v4(10, 0, 0, 1), 7470), 49152).unwrap();

    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let (mut sent, mut echoed) = (0, Vec::new());
    let mut buf = vec![0; 8192];
    for ms in 0..200_000 {
        let now = Instant::from_millis(ms);
        for h in [&mut server, &mut client] {
            h.iface.poll(now, &mut h.nic, &mut h.sockets);
        }
        let sock = server.sockets.get_mut::<tcp::Socket>(s);
        if sock.can_recv() && sock.send_capacity() - sock.send_queue() >= buf.len() {
            let n = sock.recv_slice(&mut buf).unwrap();
            assert_eq!(sock.send_slice(&buf[..n]).unwrap(), n);
        }
        let sock = client.sockets.get_mut::<tcp::Socket>(c);
        if sock.can_send() && sent < data.len() {
            sent += sock.send_slice(&data[sent..]).unwrap();
        }
        if sock.can_recv() {
            let n = sock.recv_slice(&mut buf).unwrap();
            echoed.extend_from_slice(&buf[..n]);
        }
        for h in [&mut server, &mut client] {
            h.iface.poll(now, &mut h.nic, &mut h.sockets);
        }
        let (a, b) = (&mut server, &mut client);
        carry(a, b);
        carry(b, a);
        if echoed.len() == data.len() {
            break;
        }
    }
    assert_eq!(echoed.len(), data.len(), "everything echoed");
    assert!(echoed == data, "in order and intact");
    for h in [&server, &client] {
        let st = h.nic.stats();
        assert_eq!((st.rx_errors, st.tx_errors), (0, 0), "{st:?}");
        assert!(st.rx_frames > 100 && st.tx_frames > 100, "{st:?}");
    }
}
