//! Finding the virtio-net function in the kernel's PCI listing and opening it: BARs mapped uncached, memory
//! decoding and bus mastering on, INTx off (the driver polls), then virtio 1.1 §3.1.1 initialization through
//! virtio-drivers' modern PCI transport (capabilities per §4.1.4; QEMU puts them in the 64-bit BAR4) and the
//! receive buffers posted (§5.1.5).
//!
//! Boot time, on the bootstrap processor before the other cores start: new MMIO mappings are not shot down
//! on other cores' TLBs.

use crate::nic::VirtioNic;
use crate::pci_config::PciConfig;
use crate::transport::Bounded;
use crate::{QUEUE_SIZE, hal::KernelHal, is_virtio_net};
use core::fmt;
use leasebox_kernel::arch::memory;
use leasebox_kernel::paging::MapError;
use leasebox_kernel::pci::{self, Bdf, ConfigAccess, PciBus};
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::pci::bus::{DeviceFunction, PciRoot};
use virtio_drivers::transport::pci::{PciTransport, VirtioPciError};

/// The device as opened on bare metal.
pub type Device = VirtIONetRaw<KernelHal, Bounded<PciTransport>, QUEUE_SIZE>;
/// The NIC smoltcp runs on.
pub type KernelNic = VirtioNic<Device>;

#[derive(Debug)]
pub enum ProbeError {
    /// No virtio-net function in the PCI listing.
    NotFound,
    /// A memory BAR could not be mapped.
    Bar { bdf: Bdf, bar: usize, error: MapError },
    /// The modern interface is missing or malformed (e.g. QEMU `disable-modern=on`).
    Transport { bdf: Bdf, error: VirtioPciError },
    /// Initialization failed (features refused, queues, DMA memory).
    Device { bdf: Bdf, error: virtio_drivers::Error },
    /// smoltcp needs a unicast MAC address.
    MacNotUnicast { bdf: Bdf, mac: [u8; 6] },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::NotFound => write!(f, "no virtio-net device (PCI 1af4:1000 or 1af4:1041)"),
            ProbeError::Bar { bdf, bar, error } => write!(f, "virtio-net {bdf}: mapping BAR{bar}: {error}"),
            ProbeError::Transport { bdf, error } => {
                write!(f, "virtio-net {bdf}: no usable modern (virtio 1.0) interface: {error}")
            }
            ProbeError::Device { bdf, error } => write!(f, "virtio-net {bdf}: initialization failed: {error}"),
            ProbeError::MacNotUnicast { bdf, mac } => write!(f, "virtio-net {bdf}: MAC {mac:02x?} is not unicast"),
        }
    }
}

/// Opens the first virtio-net function of `pci`.
pub fn open<C: ConfigAccess>(pci: &PciBus, access: &C) -> Result<(Bdf, KernelNic), ProbeError> {
    let f = pci.functions().iter().find(|f| is_virtio_net(f.vendor, f.device)).ok_or(ProbeError::NotFound)?;
    let bdf = f.bdf;
    // virtio-drivers asks the Hal for pieces of the BARs and cannot take a failure there: map them all now.
    for (bar, b) in f.bars.iter().enumerate() {
        if let Some((addr, size)) = b.mem().filter(|&(addr, size)| addr != 0 && size != 0) {
            memory::map_mmio(addr, size).map_err(|error| ProbeError::Bar { bdf, bar, error })?;
        }
    }
    pci::set_command(access, bdf, pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER | pci::COMMAND_INTX_DISABLE, 0);

    let mut root = PciRoot::new(PciConfig::new(access, bdf.segment));
    let df = DeviceFunction { bus: bdf.bus, device: bdf.device, function: bdf.function };
    let transport =
        PciTransport::new::<KernelHal, _>(&mut root, df).map_err(|error| ProbeError::Transport { bdf, error })?;
    let mut raw = Device::new(Bounded::new(transport)).map_err(|error| ProbeError::Device { bdf, error })?;
    // Polled: ask the device not to raise used-buffer notifications at all.
    raw.disable_interrupts();
    let mac = raw.mac_address();
    if mac[0] & 1 != 0 {
        return Err(ProbeError::MacNotUnicast { bdf, mac });
    }
    Ok((bdf, VirtioNic::new(raw)))
}
