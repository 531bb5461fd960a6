//! virtio-drivers' [`Hal`] over the kernel: DMA regions for the virtqueues, uncached MMIO mappings for the
//! BARs, and buffer sharing on the identity map. The only unsafe shell of this crate (bare metal only).
//!
//! Leasebox maps all memory 1:1 (virtual = physical = device address, no IOMMU), so sharing a buffer with the
//! device is handing over its address: no bounce buffers, nothing to undo on unshare. Queue memory comes from
//! the kernel's DMA API, which returns both addresses; this Hal passes them on as given.

use core::ptr::NonNull;
use leasebox_kernel::arch::memory::{self, DmaRegion};
use spin::Mutex;
use virtio_drivers::{BufferDirection, Hal, PAGE_SIZE, PhysAddr};

/// DMA regions handed out: virtio-drivers frees by address, the kernel by region. Each virtqueue takes up to
/// three (descriptor table, driver area, device area); one device has two queues.
const MAX_REGIONS: usize = 8;
static REGIONS: Mutex<[Option<DmaRegion>; MAX_REGIONS]> = Mutex::new([const { None }; MAX_REGIONS]);

/// The kernel's side of virtio-drivers.
pub struct KernelHal;

// SAFETY: `dma_alloc` hands out fresh, zeroed, page-aligned frames from the kernel's DMA API that nothing else
// owns, with the device address the kernel gives for them; `mmio_phys_to_virt` maps the range uncached before
// returning its identity address; `share` returns the identity-mapped address of memory the caller keeps in
// place for the device. All of it holds because every address Leasebox uses is identity-mapped.
unsafe impl Hal for KernelHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        // virtio-drivers treats physical address 0 as failure.
        let failed = (0, NonNull::dangling());
        let Some(len) = pages.checked_mul(PAGE_SIZE) else { return failed };
        let region = match memory::dma_alloc(len, PAGE_SIZE) {
            Ok(r) => r,
            Err(e) => {
                log::error!("virtio: {e}");
                return failed;
            }
        };
        let Some(virt) = NonNull::new(region.as_ptr()) else { return failed };
        let device_addr = region.device_addr();
        let mut regions = REGIONS.lock();
        match regions.iter_mut().find(|r| r.is_none()) {
            Some(slot) => {
                *slot = Some(region);
                (device_addr, virt)
            }
            None => {
                drop(regions);
                log::error!("virtio: more than {MAX_REGIONS} DMA regions");
                memory::dma_free(region);
                failed
            }
        }
    }

    unsafe fn dma_dealloc(paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        let region = REGIONS
            .lock()
            .iter_mut()
            .find(|r| r.as_ref().is_some_and(|r| r.device_addr() == paddr))
            .and_then(Option::take);
        match region {
            Some(r) => {
                // virtio-drivers frees a queue's memory only after the device let go of it (reset).
                memory::dma_free(r);
                0
            }
            None => -1,
        }
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, size: usize) -> NonNull<u8> {
        // `probe::open` maps every memory BAR before the transport asks, so this mapping is already in place
        // and cannot fail; a failure would mean a region outside the device's BARs, and no pointer could be
        // returned for it soundly. Boot time only, never reached from the network.
        if let Err(e) = memory::map_mmio(paddr, size as u64) {
            panic!("virtio: MMIO {paddr:#x}+{size:#x} outside the mapped BARs: {e}");
        }
        NonNull::new(paddr as *mut u8).unwrap_or_else(|| panic!("virtio: MMIO at physical address 0"))
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}
