//! Which PCI functions this driver takes (docs/reference/mlx5.md §a; Linux `core/main.c`
//! `mlx5_core_pci_table`): the mlx5 PFs and VFs from ConnectX-4 to ConnectX-6 Dx. (The device model behind
//! ivshmem is the image's business: `mlx5-signature` names it and the part it plays.)

pub const MELLANOX: u16 = 0x15b3;

/// A supported part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub device: u16,
    pub name: &'static str,
    pub vf: bool,
}

pub const PARTS: &[Part] = &[
    Part { device: 0x1013, name: "ConnectX-4", vf: false },
    Part { device: 0x1014, name: "ConnectX-4 VF", vf: true },
    Part { device: 0x1015, name: "ConnectX-4 Lx", vf: false },
    Part { device: 0x1016, name: "ConnectX-4 Lx VF", vf: true },
    Part { device: 0x1017, name: "ConnectX-5", vf: false },
    Part { device: 0x1018, name: "ConnectX-5 VF", vf: true },
    Part { device: 0x1019, name: "ConnectX-5 Ex", vf: false },
    Part { device: 0x101a, name: "ConnectX-5 Ex VF", vf: true },
    Part { device: 0x101b, name: "ConnectX-6", vf: false },
    Part { device: 0x101c, name: "ConnectX-6 VF", vf: true },
    Part { device: 0x101d, name: "ConnectX-6 Dx", vf: false },
    Part { device: 0x101e, name: "ConnectX-6 Dx VF", vf: true },
];

/// The supported part with these PCI ids, if any.
pub fn classify(vendor: u16, device: u16) -> Option<Part> {
    PARTS.iter().find(|p| vendor == MELLANOX && p.device == device).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(classify(0x15b3, 0x1017), Some(Part { device: 0x1017, name: "ConnectX-5", vf: false }));
        assert!(matches!(classify(0x15b3, 0x1018), Some(Part { vf: true, .. })));
        assert_eq!(classify(0x15b3, 0x1011), None, "Connect-IB is not supported");
        assert_eq!(classify(0x1af4, 0x1017), None, "another vendor's id");
        assert_eq!(PARTS.len(), 12);
    }
}
