//! virtio-net for Leasebox's control channel (virtio 1.1 §5.1 "Network Device", over §4.1 "Virtio Over PCI
//! Bus"), polled with interrupts off, under smoltcp.
//!
//! The device logic is `virtio-drivers`' [`VirtIONetRaw`](virtio_drivers::device::net::VirtIONetRaw) on its
//! modern PCI transport; this crate supplies what it needs from Leasebox and what smoltcp needs from it:
//!
//! - [`pci_config`]: virtio-drivers' `ConfigurationAccess` over the kernel's [`ConfigAccess`] (ECAM or the
//!   0xCF8 ports) — safe, host-tested;
//! - [`transport`]: a wrapper that gives the transport's device reset a deadline (virtio 1.1 §4.1.4.3.2);
//! - [`nic`]: fixed receive and transmit buffers and the smoltcp [`phy::Device`](smoltcp::phy::Device), over
//!   the [`queues::NetQueues`] seam so host tests drive it with a fake device;
//! - `hal` (bare metal only): the `Hal` over the kernel's DMA regions and MMIO mappings — the unsafe shell;
//! - `probe` (bare metal only): finding the function in the PCI listing and bringing it up.
//!
//! Nothing here allocates per packet: buffers are allocated once when the device is opened.
//!
//! [`ConfigAccess`]: leasebox_kernel::pci::ConfigAccess
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod nic;
pub mod pci_config;
pub mod queues;
pub mod transport;

#[cfg(target_os = "none")]
pub mod hal;
#[cfg(target_os = "none")]
pub mod probe;

pub use nic::{NicStats, VirtioNic};

/// PCI vendor of virtio devices.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// virtio-net PCI device IDs: transitional (legacy + modern interfaces) and modern-only (0x1040 + device
/// type 1), virtio 1.1 §4.1.2.1.
pub const NET_DEVICE_IDS: [u16; 2] = [0x1000, 0x1041];

/// Virtqueue size. 16 entries carry ~15 MB/s through QEMU user networking (docs/reference/platform.md); each entry has
/// a receive and a transmit buffer.
pub const QUEUE_SIZE: usize = 16;

/// Whether a PCI function is a virtio-net device this driver can try.
pub fn is_virtio_net(vendor: u16, device: u16) -> bool {
    vendor == VIRTIO_VENDOR && NET_DEVICE_IDS.contains(&device)
}

#[cfg(test)]
mod tests {
    #[test]
    fn recognizes_transitional_and_modern_ids() {
        assert!(super::is_virtio_net(0x1af4, 0x1000));
        assert!(super::is_virtio_net(0x1af4, 0x1041));
        assert!(!super::is_virtio_net(0x1af4, 0x1001), "virtio-blk");
        assert!(!super::is_virtio_net(0x1af4, 0x1110), "ivshmem");
        assert!(!super::is_virtio_net(0x8086, 0x1000), "e1000 shares the device ID");
    }
}
