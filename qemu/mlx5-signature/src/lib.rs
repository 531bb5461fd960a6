//! `mlx5-signature`: how the mlx5 device model (CI's stand-in for a ConnectX-5, `docs/hca-model.md`, "Process
//! and QEMU wiring") is recognized behind an ivshmem function — the one copy of the layout, which the model
//! writes (`mlx5_model::shm::write_signature`) and the image looks for (`image/src/hca.rs`).
//!
//! QEMU shows the model's BAR file as `ivshmem-plain` (`1af4:1110`) BAR2, which plays the CX-5's BAR0. The
//! model writes a signature into that BAR's last 4 KiB page, leaving the initialization segment (offset 0)
//! and the UAR pages untouched.
#![no_std]

/// The ivshmem PCI IDs (Red Hat / QEMU).
pub const IVSHMEM_VENDOR: u16 = 0x1af4;
pub const IVSHMEM_DEVICE: u16 = 0x1110;
/// The PCI device id of the part the model plays by default (a ConnectX-5 PF, vendor Mellanox `0x15b3`).
pub const PLAYS_DEVICE: u16 = 0x1017;
/// The PCI device id the model plays with `--vf` (a ConnectX-5 VF; Linux `mlx5_core_pci_table` marks it
/// `MLX5_PCI_DEV_IS_VF`, which is how a driver learns that it runs a VF).
pub const PLAYS_VF_DEVICE: u16 = 0x1018;
/// The BAR that maps the shared file.
pub const IVSHMEM_BAR: usize = 2;
/// Magic bytes at the start of the signature.
pub const SIGNATURE: [u8; 8] = *b"MLX5MODL";
/// Layout version (big-endian u32 at +8). Version 2 carries the played device id.
pub const SIGNATURE_VERSION: u32 = 2;
/// The signature starts this many bytes before the end of the BAR.
pub const SIGNATURE_OFFSET_FROM_END: u64 = 0x1000;
/// magic (8), version (be32), played PCI device id (be16), reserved (2), BAR size (be64).
pub const SIGNATURE_LEN: usize = 24;

/// Where the signature sits in a BAR of `bar_size` bytes, or `None` if the BAR is too small to hold one.
pub fn offset(bar_size: u64) -> Option<u64> {
    (bar_size >= 2 * SIGNATURE_OFFSET_FROM_END).then(|| bar_size - SIGNATURE_OFFSET_FROM_END)
}

/// The signature for a BAR of `bar_size` bytes of a model playing PCI device `device` (Mellanox).
pub fn bytes(bar_size: u64, device: u16) -> [u8; SIGNATURE_LEN] {
    let mut b = [0u8; SIGNATURE_LEN];
    b[0..8].copy_from_slice(&SIGNATURE);
    b[8..12].copy_from_slice(&SIGNATURE_VERSION.to_be_bytes());
    b[12..14].copy_from_slice(&device.to_be_bytes());
    b[16..24].copy_from_slice(&bar_size.to_be_bytes());
    b
}

/// Whether `bytes` (read at [`offset`]) are the model's signature for a BAR of `bar_size` bytes.
pub fn matches(bytes: &[u8; SIGNATURE_LEN], bar_size: u64) -> bool {
    let version = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let mut size = [0u8; 8];
    size.copy_from_slice(&bytes[16..24]);
    bytes[..8] == SIGNATURE && version == SIGNATURE_VERSION && u64::from_be_bytes(size) == bar_size
}

/// The PCI device id a matching signature says the model plays.
pub fn plays(bytes: &[u8; SIGNATURE_LEN]) -> u16 {
    u16::from_be_bytes([bytes[12], bytes[13]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(version: u32, size: u64) -> [u8; SIGNATURE_LEN] {
        let mut b = bytes(size, PLAYS_DEVICE);
        b[8..12].copy_from_slice(&version.to_be_bytes());
        b
    }

    #[test]
    fn recognizes_only_the_exact_signature() {
        assert_eq!(offset(32 << 20), Some((32 << 20) - 0x1000));
        assert_eq!(offset(0x1000), None);
        assert!(matches(&sig(2, 32 << 20), 32 << 20));
        assert!(!matches(&sig(1, 32 << 20), 32 << 20), "version 1 carries no device id");
        assert!(!matches(&sig(2, 16 << 20), 32 << 20));
        let mut b = sig(2, 32 << 20);
        b[0] = b'X';
        assert!(!matches(&b, 32 << 20));
        assert!(!matches(&[0; SIGNATURE_LEN], 32 << 20));
    }

    #[test]
    fn carries_the_played_device() {
        assert_eq!(plays(&bytes(32 << 20, PLAYS_DEVICE)), 0x1017);
        let vf = bytes(32 << 20, PLAYS_VF_DEVICE);
        assert!(matches(&vf, 32 << 20));
        assert_eq!(plays(&vf), 0x1018);
    }
}
