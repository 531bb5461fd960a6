//! The seam between the buffer bookkeeping ([`crate::nic`]) and the device: the non-blocking half of
//! virtio-drivers' `VirtIONetRaw` (virtio 1.1 §5.1.6 "Device Operation": receiveq1 and transmitq1, each
//! packet a `virtio_net_hdr` followed by the frame). The bare-metal build implements it with `VirtIONetRaw`;
//! host tests with a fake device.
//!
//! The unsafe methods mirror `VirtIONetRaw`'s contract: a buffer handed to the device is the device's until
//! its token comes back, and the Rust code must neither read nor write it meanwhile.

use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::Transport;
use virtio_drivers::{Error, Hal};

/// A virtio-net device's two queues, polled.
pub trait NetQueues {
    /// The device's MAC address (`virtio_net_config.mac`).
    fn mac_address(&self) -> [u8; 6];

    /// Writes a `virtio_net_hdr` (no offloads) at the start of `buf`; returns its length.
    fn fill_buffer_header(&self, buf: &mut [u8]) -> Result<usize, Error>;

    /// Posts `buf` on the receive queue; returns its token (descriptor index).
    ///
    /// # Safety
    /// `buf` must stay valid, unmoved and untouched until [`NetQueues::receive_complete`] takes it back.
    unsafe fn receive_begin(&mut self, buf: &mut [u8]) -> Result<u16, Error>;

    /// The token of the next filled receive buffer, if any (not yet taken).
    fn poll_receive(&self) -> Option<u16>;

    /// Takes back the buffer of `token`; returns (header length, frame length).
    ///
    /// # Safety
    /// `buf` must be the buffer posted with `token`.
    unsafe fn receive_complete(&mut self, token: u16, buf: &mut [u8]) -> Result<(usize, usize), Error>;

    /// Posts `buf` (header + frame) on the transmit queue; returns its token.
    ///
    /// # Safety
    /// `buf` must stay valid, unmoved and unwritten until [`NetQueues::transmit_complete`] takes it back.
    unsafe fn transmit_begin(&mut self, buf: &[u8]) -> Result<u16, Error>;

    /// The token of the next finished transmission, if any (not yet taken).
    fn poll_transmit(&mut self) -> Option<u16>;

    /// Takes back the buffer of `token`.
    ///
    /// # Safety
    /// `buf` must be the buffer posted with `token`, with the same length.
    unsafe fn transmit_complete(&mut self, token: u16, buf: &[u8]) -> Result<usize, Error>;
}

impl<H: Hal, T: Transport, const N: usize> NetQueues for VirtIONetRaw<H, T, N> {
    fn mac_address(&self) -> [u8; 6] {
        VirtIONetRaw::mac_address(self)
    }
    fn fill_buffer_header(&self, buf: &mut [u8]) -> Result<usize, Error> {
        VirtIONetRaw::fill_buffer_header(self, buf)
    }
    unsafe fn receive_begin(&mut self, buf: &mut [u8]) -> Result<u16, Error> {
        // SAFETY: the caller upholds the same contract (the buffer is the device's until completed).
        unsafe { VirtIONetRaw::receive_begin(self, buf) }
    }
    fn poll_receive(&self) -> Option<u16> {
        VirtIONetRaw::poll_receive(self)
    }
    unsafe fn receive_complete(&mut self, token: u16, buf: &mut [u8]) -> Result<(usize, usize), Error> {
        // SAFETY: the caller passes the buffer posted with `token`.
        unsafe { VirtIONetRaw::receive_complete(self, token, buf) }
    }
    unsafe fn transmit_begin(&mut self, buf: &[u8]) -> Result<u16, Error> {
        // SAFETY: the caller upholds the same contract (the buffer is the device's until completed).
        unsafe { VirtIONetRaw::transmit_begin(self, buf) }
    }
    fn poll_transmit(&mut self) -> Option<u16> {
        VirtIONetRaw::poll_transmit(self)
    }
    unsafe fn transmit_complete(&mut self, token: u16, buf: &[u8]) -> Result<usize, Error> {
        // SAFETY: the caller passes the buffer posted with `token`.
        unsafe { VirtIONetRaw::transmit_complete(self, token, buf) }
    }
}
