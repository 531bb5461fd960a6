//! The virtio-net NIC as smoltcp sees it: fixed receive and transmit buffers cycled through the device's
//! queues (virtio 1.1 §5.1.6.3 "Setting Up Receive Buffers", §5.1.6.2 "Packet Transmission"), and the
//! [`phy::Device`] impl. Polled: every call looks at the used rings, none waits.
//!
//! Each buffer is its own heap allocation, allocated once: a posted buffer must not move while the device
//! holds it, and keeping them apart means lending one to smoltcp never creates a reference that covers
//! another the device may be writing. Ownership of each buffer is tracked explicitly (posted under a token,
//! lent to smoltcp, or idle) so that no buffer is ever touched while the device has it.
//!
//! Neither offloads nor mergeable receive buffers are negotiated (virtio-drivers offers MAC, STATUS,
//! EVENT_IDX, INDIRECT_DESC and VERSION_1), so a received packet is one 12-byte `virtio_net_hdr` and one
//! frame of at most 1514 bytes, and checksums are computed by smoltcp.

use crate::QUEUE_SIZE;
use crate::queues::NetQueues;
use alloc::boxed::Box;
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

/// One receive or transmit buffer: `virtio_net_hdr` plus the largest frame, with room to spare (virtio-drivers
/// wants receive buffers of at least 1526 bytes).
pub const BUF_LEN: usize = 2048;
/// The largest Ethernet frame without FCS (MTU 1500 + 14-byte header): smoltcp's `max_transmission_unit` for
/// Ethernet.
pub const MAX_FRAME: usize = 1514;

// The ownership masks below are u32 bitmaps.
const _: () = assert!(QUEUE_SIZE <= 32 && QUEUE_SIZE <= u8::MAX as usize);
const ALL: u32 = if QUEUE_SIZE == 32 { u32::MAX } else { (1 << QUEUE_SIZE) - 1 };

type Buf = Box<[u8; BUF_LEN]>;

fn new_bufs() -> [Buf; QUEUE_SIZE] {
    core::array::from_fn(|_| Box::new([0; BUF_LEN]))
}

/// Counters since the device was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Receive buffers that could not be posted, or completions that could not be taken.
    pub rx_errors: u64,
    /// Transmissions the device refused, or completions that could not be taken.
    pub tx_errors: u64,
    /// Frames smoltcp produced while every transmit buffer was in flight (dropped; TCP retransmits them).
    pub tx_dropped: u64,
}

/// A virtio-net device with its buffers, ready for smoltcp.
pub struct VirtioNic<Q: NetQueues> {
    // Declared first so it is dropped first: dropping the device resets it, and only then may the buffers it
    // could write be freed.
    queues: Q,
    mac: [u8; 6],
    rx: RxRing,
    tx: TxRing,
    stats: NicStats,
}

struct RxRing {
    bufs: [Buf; QUEUE_SIZE],
    /// Receive token (descriptor index) → the buffer the device holds under it.
    posted: [Option<u8>; QUEUE_SIZE],
    /// Buffers neither posted nor lent: to be posted (a post failed, or a completion was refused).
    idle: u32,
    /// The buffer lent to smoltcp by the last `receive`; posted again by the next call.
    lent: Option<u8>,
}

struct TxRing {
    bufs: [Buf; QUEUE_SIZE],
    /// Transmit token → (buffer, posted length): `transmit_complete` needs the same slice back.
    posted: [Option<(u8, u16)>; QUEUE_SIZE],
    /// Buffers free to fill.
    free: u32,
    /// Where smoltcp writes a frame when no buffer is free; never posted.
    spill: Buf,
}

fn lowest(mask: u32) -> Option<usize> {
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

impl<Q: NetQueues> VirtioNic<Q> {
    /// Takes an initialized device and posts every receive buffer.
    pub fn new(queues: Q) -> Self {
        let mut nic = VirtioNic {
            mac: queues.mac_address(),
            queues,
            rx: RxRing { bufs: new_bufs(), posted: [None; QUEUE_SIZE], idle: ALL, lent: None },
            tx: TxRing { bufs: new_bufs(), posted: [None; QUEUE_SIZE], free: ALL, spill: Box::new([0; BUF_LEN]) },
            stats: NicStats::default(),
        };
        nic.post_idle();
        nic
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn stats(&self) -> NicStats {
        self.stats
    }

    #[cfg(test)]
    fn queues_mut(&mut self) -> &mut Q {
        &mut self.queues
    }

    /// Posts the lent buffer and any idle ones. Failures leave a buffer idle for the next call.
    fn post_idle(&mut self) {
        if let Some(i) = self.rx.lent.take() {
            self.rx.idle |= 1 << i;
        }
        while let Some(i) = lowest(self.rx.idle) {
            self.rx.idle &= !(1 << i);
            // SAFETY: buffer `i` was idle: not posted and not lent, so nothing references it; it is a heap
            // allocation that neither moves nor is freed before the device is reset (field order above).
            match unsafe { self.queues.receive_begin(&mut self.rx.bufs[i][..]) } {
                Ok(token) => match self.rx.posted.get_mut(usize::from(token)) {
                    Some(slot @ None) => *slot = Some(i as u8),
                    // A token we cannot track: the device keeps this buffer for good (never touched again).
                    _ => self.stats.rx_errors += 1,
                },
                Err(_) => {
                    self.stats.rx_errors += 1;
                    self.rx.idle |= 1 << i;
                    return;
                }
            }
        }
    }

    /// Takes the next filled receive buffer: (buffer, frame start, frame length).
    fn take_rx(&mut self) -> Option<(usize, usize, usize)> {
        // Bounded: each pass either returns or consumes one used entry.
        for _ in 0..QUEUE_SIZE {
            let token = self.queues.poll_receive()?;
            let Some(i) = self.rx.posted.get_mut(usize::from(token)).and_then(Option::take) else {
                // A completion for a token we never posted: its buffer is unknown, so it cannot be taken.
                // Receiving stops here rather than guess (counted; never seen with QEMU).
                self.stats.rx_errors += 1;
                return None;
            };
            let i = usize::from(i);
            // SAFETY: buffer `i` is the one posted under `token` (recorded in `posted`), handed back now.
            match unsafe { self.queues.receive_complete(token, &mut self.rx.bufs[i][..]) } {
                Ok((hdr, len)) if hdr.checked_add(len).is_some_and(|end| end <= BUF_LEN) => {
                    self.rx.lent = Some(i as u8);
                    return Some((i, hdr, len));
                }
                Ok(_) | Err(_) => {
                    self.stats.rx_errors += 1;
                    self.rx.idle |= 1 << i;
                }
            }
        }
        None
    }

    /// Collects finished transmissions, freeing their buffers.
    fn reap_tx(queues: &mut Q, tx: &mut TxRing, stats: &mut NicStats) {
        for _ in 0..QUEUE_SIZE {
            let Some(token) = queues.poll_transmit() else { return };
            let Some((i, len)) = tx.posted.get_mut(usize::from(token)).and_then(Option::take) else {
                stats.tx_errors += 1;
                return;
            };
            let (i, len) = (usize::from(i), usize::from(len));
            // SAFETY: buffer `i` was posted under `token` with exactly this length (recorded in `posted`).
            match unsafe { queues.transmit_complete(token, &tx.bufs[i][..len]) } {
                Ok(_) => tx.free |= 1 << i,
                Err(_) => {
                    // Still the device's: keep the record and try again on the next call.
                    tx.posted[usize::from(token)] = Some((i as u8, len as u16));
                    stats.tx_errors += 1;
                    return;
                }
            }
        }
    }
}

/// A received frame, lent to smoltcp until the next `receive`.
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

/// The right to send one frame.
pub struct TxToken<'a, Q: NetQueues> {
    queues: &'a mut Q,
    tx: &'a mut TxRing,
    stats: &'a mut NicStats,
}

impl<Q: NetQueues> phy::TxToken for TxToken<'_, Q> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let TxToken { queues, tx, stats } = self;
        // smoltcp never asks for more than `max_transmission_unit` (1514), far below a buffer.
        let Some(i) = lowest(tx.free) else {
            stats.tx_dropped += 1;
            return f(&mut tx.spill[..len.min(BUF_LEN)]);
        };
        let buf = &mut tx.bufs[i];
        let Ok(hdr) = queues.fill_buffer_header(&mut buf[..]) else {
            stats.tx_errors += 1;
            return f(&mut tx.spill[..len.min(BUF_LEN)]);
        };
        let end = hdr + len.min(BUF_LEN - hdr);
        let r = f(&mut buf[hdr..end]);
        // SAFETY: buffer `i` is free (not posted), its bytes are final, and it stays untouched until
        // `reap_tx` takes it back under the token recorded here.
        match unsafe { queues.transmit_begin(&buf[..end]) } {
            Ok(token) => match tx.posted.get_mut(usize::from(token)) {
                Some(slot @ None) => {
                    *slot = Some((i as u8, end as u16));
                    tx.free &= !(1 << i);
                    stats.tx_frames += 1;
                }
                _ => {
                    // Untrackable token: the device keeps this buffer for good.
                    tx.free &= !(1 << i);
                    stats.tx_errors += 1;
                }
            },
            Err(_) => stats.tx_errors += 1,
        }
        r
    }
}

impl<Q: NetQueues> phy::Device for VirtioNic<Q> {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a, Q>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(RxToken<'_>, TxToken<'_, Q>)> {
        self.post_idle();
        Self::reap_tx(&mut self.queues, &mut self.tx, &mut self.stats);
        // smoltcp may answer a frame at once (an ACK, ARP): leave frames in the ring until a transmit
        // buffer is free, rather than drop the answer.
        if self.tx.free == 0 {
            return None;
        }
        let (i, start, len) = self.take_rx()?;
        self.stats.rx_frames += 1;
        let VirtioNic { queues, rx, tx, stats, .. } = self;
        Some((RxToken { frame: &rx.bufs[i][start..start + len] }, TxToken { queues, tx, stats }))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<TxToken<'_, Q>> {
        Self::reap_tx(&mut self.queues, &mut self.tx, &mut self.stats);
        if self.tx.free == 0 {
            return None;
        }
        Some(TxToken { queues: &mut self.queues, tx: &mut self.tx, stats: &mut self.stats })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME;
        // No `max_burst_size` window clamp: QEMU queues frames while the receive ring is full rather than
        // dropping them, and the clamp (16 segments) would cap throughput well below the 64 KiB windows.
        caps
    }
}

#[cfg(test)]
mod tests;
