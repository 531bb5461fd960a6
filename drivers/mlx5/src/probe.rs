//! Which PCI functions this driver takes (docs/reference/mlx5.md §a; Linux `core/main.c` `mlx5_core_pci_table`): the
//! mlx5 PFs and VFs from ConnectX-4 to ConnectX-6 Dx, and — for CI — an ivshmem function whose BAR2 carries the
//! device model's signature (the caller checks the signature; see `docs/hca-model.md`).

pub const MELLANOX: u16 = 0x15b3;
pub const IVSHMEM_VENDOR: u16 = 0x1af4;
pub const IVSHMEM_DEVICE: u16 = 0x1110;

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

/// The model plays a ConnectX-5 PF.
pub const MODEL_PART: Part = Part { device: 0x1017, name: "ConnectX-5", vf: false };

/// How a function matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// A real HCA: BAR0 is the initialization segment.
    Hca(Part),
    /// An ivshmem function that may carry the model (BAR2 plays BAR0) — confirmed by its signature.
    ModelCandidate,
}

pub fn classify(vendor: u16, device: u16) -> Option<Match> {
    if vendor == MELLANOX {
        return PARTS.iter().find(|p| p.device == device).map(|p| Match::Hca(*p));
    }
    (vendor == IVSHMEM_VENDOR && device == IVSHMEM_DEVICE).then_some(Match::ModelCandidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert_eq!(classify(0x15b3, 0x1017), Some(Match::Hca(MODEL_PART)));
        assert!(matches!(classify(0x15b3, 0x1018), Some(Match::Hca(Part { vf: true, .. }))));
        assert_eq!(classify(0x15b3, 0x1011), None, "Connect-IB is not supported");
        assert_eq!(classify(0x1af4, 0x1110), Some(Match::ModelCandidate));
        assert_eq!(classify(0x1af4, 0x1000), None);
        assert_eq!(PARTS.len(), 12);
    }
}
