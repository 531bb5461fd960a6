//! A virtio transport whose waits have deadlines.
//!
//! virtio-drivers' PCI transport resets the device on drop and then spins until `device_status` reads 0, with
//! no bound; its `begin_init` writes 0 and carries on without waiting at all, and never checks that the device
//! kept FEATURES_OK. virtio 1.1 asks for both: after writing 0 "the driver MUST wait for a read of
//! device_status to return 0 before reinitializing the device" (§4.1.4.3.2), and after setting FEATURES_OK it
//! "MUST re-read device status to ensure the FEATURES_OK bit is still set" (§3.1.1 step 6). [`Bounded`]
//! delegates everything else to the wrapped transport and does these two with a deadline. A device that
//! misses it is left alone (never dropped through the unbounded path) and reported as failed: its queues
//! cannot be set up, so opening it fails cleanly.

use core::fmt::Debug;
use core::mem::ManuallyDrop;
use core::ops::BitAnd;
use core::time::Duration;
use leasebox_kernel::time::{Deadline, wait_until};
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{Error, PAGE_SIZE, PhysAddr};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// How long a device may take to acknowledge a reset. QEMU resets synchronously; hardware takes microseconds.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(1);
/// Configuration reads retried while the device changes its configuration (§4.1.4.3 `config_generation`).
const CONFIG_READ_ATTEMPTS: u32 = 64;

/// Wraps a transport; see the module documentation.
pub struct Bounded<T: Transport> {
    // Never dropped: the inner transport's drop would wait for the reset without a deadline. It owns only
    // pointers into MMIO, so nothing leaks.
    inner: ManuallyDrop<T>,
    failed: bool,
}

impl<T: Transport> Bounded<T> {
    pub fn new(inner: T) -> Self {
        Bounded { inner: ManuallyDrop::new(inner), failed: false }
    }

    /// Writes 0 to `device_status` and waits (bounded) for the device to finish the reset.
    fn reset(&mut self) -> bool {
        self.inner.set_status(DeviceStatus::empty());
        let done = wait_until(Deadline::after(RESET_TIMEOUT), || self.inner.get_status().is_empty());
        if !done {
            log::error!("virtio: device did not complete its reset within {RESET_TIMEOUT:?}");
        }
        done
    }
}

impl<T: Transport> Drop for Bounded<T> {
    fn drop(&mut self) {
        // Stops the device's DMA before its queues and buffers are freed.
        self.reset();
    }
}

impl<T: Transport> Transport for Bounded<T> {
    fn device_type(&self) -> DeviceType {
        self.inner.device_type()
    }
    fn read_device_features(&mut self) -> u64 {
        self.inner.read_device_features()
    }
    fn write_driver_features(&mut self, driver_features: u64) {
        self.inner.write_driver_features(driver_features)
    }
    fn max_queue_size(&mut self, queue: u16) -> u32 {
        // A failed device offers no queue: virtio-drivers then refuses to set one up (InvalidParam).
        if self.failed { 0 } else { self.inner.max_queue_size(queue) }
    }
    fn notify(&mut self, queue: u16) {
        self.inner.notify(queue)
    }
    fn get_status(&self) -> DeviceStatus {
        self.inner.get_status()
    }
    fn set_status(&mut self, status: DeviceStatus) {
        self.inner.set_status(status)
    }
    fn set_guest_page_size(&mut self, guest_page_size: u32) {
        self.inner.set_guest_page_size(guest_page_size)
    }
    fn requires_legacy_layout(&self) -> bool {
        self.inner.requires_legacy_layout()
    }
    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        self.inner.queue_set(queue, size, descriptors, driver_area, device_area)
    }
    fn queue_unset(&mut self, queue: u16) {
        self.inner.queue_unset(queue)
    }
    fn queue_used(&mut self, queue: u16) -> bool {
        self.inner.queue_used(queue)
    }
    fn ack_interrupt(&mut self) -> InterruptStatus {
        self.inner.ack_interrupt()
    }
    fn read_config_generation(&self) -> u32 {
        self.inner.read_config_generation()
    }
    fn read_config_space<V: FromBytes + IntoBytes>(&self, offset: usize) -> Result<V, Error> {
        self.inner.read_config_space(offset)
    }
    fn write_config_space<V: IntoBytes + Immutable>(&mut self, offset: usize, value: V) -> Result<(), Error> {
        self.inner.write_config_space(offset, value)
    }

    /// virtio 1.1 §3.1.1 steps 1-6, with the reset awaited and FEATURES_OK verified.
    fn begin_init<F: bitflags::Flags<Bits = u64> + BitAnd<Output = F> + Debug>(&mut self, supported_features: F) -> F {
        if !self.reset() {
            self.failed = true;
            return F::from_bits_truncate(0);
        }
        self.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
        let negotiated = F::from_bits_truncate(self.read_device_features()) & supported_features;
        self.write_driver_features(negotiated.bits());
        self.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK);
        if !self.get_status().contains(DeviceStatus::FEATURES_OK) {
            log::error!("virtio: device refused the features {negotiated:?}");
            self.set_status(DeviceStatus::FAILED);
            self.failed = true;
        }
        self.set_guest_page_size(PAGE_SIZE as u32);
        negotiated
    }

    /// As the default, but gives up (I/O error) if the configuration keeps changing under the read.
    fn read_consistent<V>(&self, f: impl Fn() -> Result<V, Error>) -> Result<V, Error> {
        for _ in 0..CONFIG_READ_ATTEMPTS {
            let before = self.read_config_generation();
            let v = f()?;
            if self.read_config_generation() == before {
                return Ok(v);
            }
        }
        Err(Error::IoError)
    }
}
