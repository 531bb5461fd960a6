//! virtio-drivers' PCI `ConfigurationAccess` over the kernel's [`ConfigAccess`], so the virtio transport reads
//! capabilities (virtio 1.1 §4.1.4) and sizes BARs through the same ECAM window or 0xCF8 ports the kernel
//! enumerated with. virtio-drivers' `DeviceFunction` has no segment: the adapter is bound to one.

use leasebox_kernel::pci::{Bdf, ConfigAccess};
use virtio_drivers::transport::pci::bus::{ConfigurationAccess, DeviceFunction};

/// Configuration space of one PCI segment, through the kernel's access method.
pub struct PciConfig<'a, C: ConfigAccess> {
    access: &'a C,
    segment: u16,
}

impl<'a, C: ConfigAccess> PciConfig<'a, C> {
    pub fn new(access: &'a C, segment: u16) -> Self {
        PciConfig { access, segment }
    }

    fn bdf(&self, f: DeviceFunction) -> Bdf {
        Bdf::new(self.segment, f.bus, f.device, f.function)
    }
}

impl<C: ConfigAccess> ConfigurationAccess for PciConfig<'_, C> {
    fn read_word(&self, f: DeviceFunction, register_offset: u8) -> u32 {
        // The kernel's accessors take dword-aligned offsets; virtio-drivers only asks for those.
        self.access.read32(self.bdf(f), u16::from(register_offset & !3))
    }

    fn write_word(&mut self, f: DeviceFunction, register_offset: u8, data: u32) {
        self.access.write32(self.bdf(f), u16::from(register_offset & !3), data);
    }

    unsafe fn unsafe_clone(&self) -> Self {
        // A shared reference and a segment number: cloning cannot create aliasing beyond what `&C` allows.
        PciConfig { access: self.access, segment: self.segment }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::vec::Vec;

    #[derive(Default)]
    struct Recorder {
        log: RefCell<Vec<(Bdf, u16, Option<u32>)>>,
    }

    impl ConfigAccess for Recorder {
        fn read32(&self, a: Bdf, offset: u16) -> u32 {
            self.log.borrow_mut().push((a, offset, None));
            0x1041_1af4
        }
        fn write32(&self, a: Bdf, offset: u16, value: u32) {
            self.log.borrow_mut().push((a, offset, Some(value)));
        }
    }

    #[test]
    fn maps_device_functions_onto_the_bound_segment() {
        let r = Recorder::default();
        let mut c = PciConfig::new(&r, 2);
        let f = DeviceFunction { bus: 0, device: 3, function: 1 };
        assert_eq!(c.read_word(f, 0), 0x1041_1af4);
        c.write_word(f, 0x10, 0xffff_ffff);
        // SAFETY: the clone is only read through, as the contract asks.
        let clone = unsafe { c.unsafe_clone() };
        clone.read_word(DeviceFunction { bus: 1, device: 0, function: 0 }, 0x36);
        assert_eq!(
            *r.log.borrow(),
            [
                (Bdf::new(2, 0, 3, 1), 0, None),
                (Bdf::new(2, 0, 3, 1), 0x10, Some(0xffff_ffff)),
                (Bdf::new(2, 1, 0, 0), 0x34, None),
            ]
        );
    }
}
