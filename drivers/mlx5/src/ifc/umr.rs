//! UMR work requests (docs/reference/umr.md): the send WQEs that change a memory key without a command, laid
//! out as Linux `include/linux/mlx5/qp.h` declares them — `mlx5_wqe_ctrl_seg` ([`crate::sq::CtrlSeg`]),
//! `mlx5_wqe_umr_ctrl_seg` (48 bytes), `mlx5_mkey_seg` (64 bytes, the `mkc` layout of `mlx5_ifc.h`), then the
//! translation: inline MTT entries or one `mlx5_wqe_data_seg` pointing at them. What each WQE sets follows
//! Linux `drivers/infiniband/hw/mlx5/umr.c`: [`revoke_wqe`] is `mlx5r_umr_revoke_mr` (free, under a
//! quarantine PD), [`grant_wqe`] is `mlx5r_umr_update_mr_pas` with `MLX5_IB_UPD_XLT_ENABLE`, `_PD`, `_ACCESS`
//! and `_ADDR` on a free cached key, plus a fresh key variant. Which WQEs the HCA allows is [`UmrCaps`]'s
//! question (Linux `umr_check_mkey_mask`, `mlx5r_umr_can_load_pas`).
//!
//! The device model decodes these WQEs with its own code (qemu/mlx5-model); this encoder shares nothing with
//! it, on purpose (two readings of the same layout checking each other).

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::field::Field;
use crate::handles::{Mkey, Pdn};
use crate::ifc::init::GeneralCaps;
use crate::ifc::mkey::{MTT_RD_EN, MTT_WR_EN, MkeyAccess, mkc};
use crate::sq::{
    CtrlSeg, MLX5_FENCE_MODE_INITIATOR_SMALL, MLX5_FENCE_MODE_NONE, MLX5_FENCE_MODE_STRONG_ORDERING,
    MLX5_WQE_CTRL_CQ_UPDATE, SEND_WQE_BB, SEND_WQE_DS,
};

/// `MLX5_OPCODE_UMR` (`qp.h`).
pub const MLX5_OPCODE_UMR: u8 = 0x25;

/// `mlx5_wqe_umr_ctrl_seg.flags` (`device.h`). Note the names: CHECK_NOT_FREE fails the WQE when the key is
/// *not* free (so it is what enabling a free key asks for), CHECK_FREE fails it when the key *is* free.
pub const MLX5_UMR_TRANSLATION_OFFSET_EN: u8 = 1 << 4;
pub const MLX5_UMR_CHECK_NOT_FREE: u8 = 1 << 5;
pub const MLX5_UMR_CHECK_FREE: u8 = 2 << 5;
pub const MLX5_UMR_INLINE: u8 = 1 << 7;

/// `mlx5_wqe_umr_ctrl_seg.mkey_mask` bits (`device.h` `MLX5_MKEY_MASK_*`): which `mkey_seg` fields the
/// WQE writes.
pub const MLX5_MKEY_MASK_LEN: u64 = 1 << 0;
pub const MLX5_MKEY_MASK_PAGE_SIZE: u64 = 1 << 1;
pub const MLX5_MKEY_MASK_START_ADDR: u64 = 1 << 6;
pub const MLX5_MKEY_MASK_PD: u64 = 1 << 7;
pub const MLX5_MKEY_MASK_KEY: u64 = 1 << 13;
pub const MLX5_MKEY_MASK_QPN: u64 = 1 << 14;
pub const MLX5_MKEY_MASK_LR: u64 = 1 << 17;
pub const MLX5_MKEY_MASK_LW: u64 = 1 << 18;
pub const MLX5_MKEY_MASK_RR: u64 = 1 << 19;
pub const MLX5_MKEY_MASK_RW: u64 = 1 << 20;
pub const MLX5_MKEY_MASK_A: u64 = 1 << 21;
pub const MLX5_MKEY_MASK_FREE: u64 = 1 << 29;

/// `cmd_hca_cap.umr_fence` values (`device.h` `MLX5_CAP_UMR_FENCE_*`).
pub const MLX5_CAP_UMR_FENCE_STRONG: u8 = 0;
pub const MLX5_CAP_UMR_FENCE_SMALL: u8 = 1;
pub const MLX5_CAP_UMR_FENCE_NONE: u8 = 2;

/// `MLX5_UMR_MTT_ALIGNMENT`: a translation list is written in whole 64-byte chunks.
pub const MTT_ALIGNMENT: usize = 0x40;

pub const UMR_CTRL_SEG_LEN: usize = 48;
pub const MKEY_SEG_LEN: usize = 64;
pub const DATA_SEG_LEN: usize = 16;
/// Control + UMR control + mkey segments: 128 bytes, two basic blocks. A revoke is exactly this.
pub const UMR_HEADER_LEN: usize = CtrlSeg::LEN + UMR_CTRL_SEG_LEN + MKEY_SEG_LEN;
/// `mkc.qpn` for a key bound to no QP.
const QPN_UNBOUND: u32 = 0xff_ffff;
/// The longest WQE a 6-bit DS count can describe (63 × 16 bytes).
pub const MAX_WQE_BY_DS: usize = crate::sq::MAX_DS * SEND_WQE_DS;

/// Why a UMR cannot be used for a key (the caller falls back to commands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UmrRefused {
    /// `umr_modify_entity_size_disabled`: the HCA refuses `MLX5_MKEY_MASK_PAGE_SIZE`, which every enable of
    /// a translation carries (Linux gives up on UMR translations altogether then).
    EntitySizeDisabled,
    /// `umr_modify_atomic_disabled` and the WQE would change the atomic bit.
    AtomicDisabled,
    /// The WQE is longer than `max_wqe_sz_sq` (or than a DS count can say).
    WqeTooLong { bytes: usize, max: usize },
    /// More translation entries than the key was created for.
    TooManyEntries { entries: usize, capacity: usize },
    /// The translation needs a pointer and the HCA does not let a UMR pointer use the reserved lkey
    /// (`umr_ptr_rlky` = 0).
    NoPointerLkey,
    /// The list is longer than a 16-bit octword count (writing it in parts would need offsets beyond 16 bits,
    /// `umr_extended_translation_offset`, which this driver does not use).
    ListTooLong { octwords: usize },
    /// A zero-length grant or one with no pages: nothing to map.
    Empty,
}

impl fmt::Display for UmrRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UmrRefused::EntitySizeDisabled => write!(f, "umr_modify_entity_size_disabled"),
            UmrRefused::AtomicDisabled => write!(f, "umr_modify_atomic_disabled"),
            UmrRefused::WqeTooLong { bytes, max } => write!(f, "UMR WQE of {bytes} bytes > max_wqe_sz_sq {max}"),
            UmrRefused::TooManyEntries { entries, capacity } => {
                write!(f, "{entries} translation entries > the key's {capacity}")
            }
            UmrRefused::NoPointerLkey => write!(f, "umr_ptr_rlky = 0 and the list does not fit inline"),
            UmrRefused::ListTooLong { octwords } => write!(f, "translation of {octwords} octwords > 16 bits"),
            UmrRefused::Empty => write!(f, "empty grant"),
        }
    }
}

/// The UMR capabilities that decide what a WQE may do (`cmd_hca_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UmrCaps {
    pub modify_entity_size_disabled: bool,
    pub modify_atomic_disabled: bool,
    pub extended_translation_offset: bool,
    pub ptr_rlky: bool,
    /// `MLX5_CAP_UMR_FENCE_*`.
    pub fence: u8,
    /// Bytes; 0 = not reported (then only what a DS count allows).
    pub max_wqe_sz_sq: u16,
    /// `cmd_hca_cap.atomic`: the HCA does atomics at all (Linux puts `MLX5_MKEY_MASK_A` in an access update
    /// only then).
    pub atomic: bool,
}

impl UmrCaps {
    pub fn from_general(g: &GeneralCaps) -> UmrCaps {
        UmrCaps {
            modify_entity_size_disabled: g.umr_modify_entity_size_disabled,
            modify_atomic_disabled: g.umr_modify_atomic_disabled,
            extended_translation_offset: g.umr_extended_translation_offset,
            ptr_rlky: g.umr_ptr_rlky,
            fence: g.umr_fence,
            max_wqe_sz_sq: g.max_wqe_sz_sq,
            atomic: g.atomic,
        }
    }

    /// Whether a UMR revoke (free + PD, no translation) is allowed at all: its mask has neither the page size
    /// nor the atomic bit, so only the WQE size can stop it.
    pub fn revoke_allowed(&self) -> Result<(), UmrRefused> {
        self.check_len(UMR_HEADER_LEN)
    }

    /// Whether grants (a translation enabled on a free key) are allowed: never with
    /// `umr_modify_entity_size_disabled` (Linux `mlx5r_umr_can_load_pas`).
    pub fn grant_allowed(&self) -> Result<(), UmrRefused> {
        if self.modify_entity_size_disabled {
            return Err(UmrRefused::EntitySizeDisabled);
        }
        self.check_len(UMR_HEADER_LEN + DATA_SEG_LEN)
    }

    /// The fence mode a UMR's control segment carries (Linux `mlx5_get_umr_fence`): none, small initiator or
    /// strong ordering, as the HCA asks.
    pub fn fence_mode(&self) -> u8 {
        match self.fence {
            MLX5_CAP_UMR_FENCE_NONE => MLX5_FENCE_MODE_NONE,
            MLX5_CAP_UMR_FENCE_SMALL => MLX5_FENCE_MODE_INITIATOR_SMALL,
            _ => MLX5_FENCE_MODE_STRONG_ORDERING,
        }
    }

    /// The longest WQE the send queue takes.
    pub fn max_wqe(&self) -> usize {
        match self.max_wqe_sz_sq {
            0 => MAX_WQE_BY_DS,
            m => usize::from(m).min(MAX_WQE_BY_DS),
        }
    }

    fn check_len(&self, bytes: usize) -> Result<(), UmrRefused> {
        let max = self.max_wqe();
        if bytes > max { Err(UmrRefused::WqeTooLong { bytes, max }) } else { Ok(()) }
    }

    /// Linux `umr_check_mkey_mask`: a mask the HCA said it refuses.
    pub fn check_mask(&self, mask: u64) -> Result<(), UmrRefused> {
        if mask & MLX5_MKEY_MASK_PAGE_SIZE != 0 && self.modify_entity_size_disabled {
            return Err(UmrRefused::EntitySizeDisabled);
        }
        if mask & MLX5_MKEY_MASK_A != 0 && self.modify_atomic_disabled {
            return Err(UmrRefused::AtomicDisabled);
        }
        Ok(())
    }
}

/// Where a WQE sits in its send queue and how it is signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WqeSlot {
    /// The producer counter in basic blocks.
    pub wqe_index: u16,
    /// The UMR QP's number.
    pub qpn: u32,
    /// [`UmrCaps::fence_mode`].
    pub fence: u8,
}

/// A revoke: the key becomes free and moves to the quarantine PD, so no QP of a client's PD can name it, and
/// its completion means the HCA no longer touches the memory through it (Linux `mlx5r_umr_revoke_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revoke {
    /// The key as clients know it (index and current variant).
    pub mkey: Mkey,
    pub quarantine_pd: Pdn,
}

/// Where the translation entries travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Translation<'a> {
    /// In the WQE after the mkey segment (`MLX5_UMR_INLINE`), padded to [`MTT_ALIGNMENT`].
    Inline(&'a [u64]),
    /// In DMA memory at `addr` (64-byte aligned, already written with [`mtt_entries`]), named by one data
    /// segment with the reserved `lkey`; `pages` entries.
    Pointer { addr: u64, lkey: u32, pages: usize },
}

impl Translation<'_> {
    fn pages(&self) -> usize {
        match self {
            Translation::Inline(p) => p.len(),
            Translation::Pointer { pages, .. } => *pages,
        }
    }
}

/// A grant: a free key re-pointed at a lease's pages, given the client's PD, the lease's start, length and
/// access, and enabled under a fresh 8-bit variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant<'a> {
    /// The key as it stands (free, with its old variant): the control segment names it.
    pub mkey: Mkey,
    /// The variant the key gets (`mkey_7_0`); the caller draws it from the CSPRNG and never repeats the old.
    pub new_variant: u8,
    pub pd: Pdn,
    pub start: u64,
    pub len: u64,
    pub access: MkeyAccess,
    /// `mkc.log_page_size` (absolute: 12 = 4 KiB, 21 = 2 MiB).
    pub log_page_size: u8,
    /// Translation entries the key was created for (`translations_octword_size` × 2).
    pub capacity: usize,
    pub translation: Translation<'a>,
}

/// The octwords a list of `pages` 8-byte entries takes, padded to [`MTT_ALIGNMENT`] (Linux
/// `mlx5r_umr_get_xlt_octo`).
/// Saturates instead of overflowing (a count that large is refused as [`UmrRefused::ListTooLong`]).
pub const fn xlt_octowords(pages: usize) -> usize {
    pages.saturating_mul(8).div_ceil(MTT_ALIGNMENT).saturating_mul(MTT_ALIGNMENT / 16)
}

/// The MTT entries for `pages` (page address with `rd_en` and `wr_en`, as CREATE_MKEY writes them), padded
/// with zeros to [`MTT_ALIGNMENT`]: what an inline translation carries, and what a pointer's memory holds.
pub fn mtt_entries(pages: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; xlt_octowords(pages.len()) * 16];
    for (i, &a) in pages.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&(a | MTT_RD_EN | MTT_WR_EN).to_be_bytes());
    }
    b
}

/// The access mask an access update carries (Linux `get_umr_update_access_mask`): local and remote read and
/// write, and the atomic bit when the HCA does atomics and lets a UMR change it.
fn access_mask(caps: &UmrCaps) -> u64 {
    let mut m = MLX5_MKEY_MASK_LR | MLX5_MKEY_MASK_LW | MLX5_MKEY_MASK_RR | MLX5_MKEY_MASK_RW;
    if caps.atomic && !caps.modify_atomic_disabled {
        m |= MLX5_MKEY_MASK_A;
    }
    m
}

/// `mlx5_wqe_umr_ctrl_seg` (`device.h`), offsets from its start: 48 bytes after the 16-byte control segment.
pub mod umr_ctrl_seg {
    use crate::field::{Field, Field64};
    pub const FLAGS: Field = Field::new(0x00, 8);
    pub const XLT_OCTOWORDS: Field = Field::new(0x20, 16);
    pub const XLT_OFFSET: Field = Field::new(0x30, 16);
    pub const MKEY_MASK: Field64 = Field64::new(0x40);
    pub const XLT_OFFSET_47_16: Field = Field::new(0x80, 32);
}

/// `mlx5_wqe_data_seg` (`qp.h`), offsets from its start.
pub mod data_seg {
    use crate::field::{Field, Field64};
    pub const BYTE_COUNT: Field = Field::new(0x00, 32);
    pub const LKEY: Field = Field::new(0x20, 32);
    pub const ADDR: Field64 = Field64::new(0x40);
}

// Where each segment starts in the WQE, in bits: the UMR control segment after the control segment, the mkey
// segment (`mlx5_mkey_seg`, the `mkc` layout: [`mkc`]) after it, the data segment of a pointer translation
// after that.
const UCTRL: usize = CtrlSeg::LEN * 8;
const MKEY: usize = UCTRL + UMR_CTRL_SEG_LEN * 8;
const DATA: usize = UMR_HEADER_LEN * 8;

/// Writes an `mkc` field of the mkey segment.
fn mkey_set(w: &mut [u8], f: Field, v: u32) {
    f.at(MKEY).write(w, v);
}

fn ctrl(w: &mut [u8], slot: &WqeSlot, mkey: Mkey) {
    CtrlSeg {
        opmod: 0,
        wqe_index: slot.wqe_index,
        opcode: MLX5_OPCODE_UMR,
        qpn: slot.qpn,
        ds: (w.len() / SEND_WQE_DS) as u8,
        fm_ce_se: slot.fence | MLX5_WQE_CTRL_CQ_UPDATE,
        general_id: mkey.0,
    }
    .write(w);
}

/// The revoke WQE, 128 bytes (two basic blocks): UMR control with `INLINE` and the mask FREE | PD; the mkey
/// segment with `free`, the quarantine PD, `qpn` 0xffffff and the key's current variant. Nothing else of the
/// key changes (its translation stays, unreachable: no QP of another PD can use it, and it is free).
pub fn revoke_wqe(slot: &WqeSlot, r: &Revoke) -> [u8; UMR_HEADER_LEN] {
    let mut w = [0u8; UMR_HEADER_LEN];
    ctrl(&mut w, slot, r.mkey);
    umr_ctrl_seg::FLAGS.at(UCTRL).write(&mut w, MLX5_UMR_INLINE.into());
    umr_ctrl_seg::MKEY_MASK.at(UCTRL).write(&mut w, MLX5_MKEY_MASK_PD | MLX5_MKEY_MASK_FREE);
    mkey_set(&mut w, mkc::FREE, 1);
    mkey_set(&mut w, mkc::QPN, QPN_UNBOUND);
    mkey_set(&mut w, mkc::MKEY_7_0, r.mkey.variant().into());
    mkey_set(&mut w, mkc::PD, r.quarantine_pd.0);
    w
}

/// The grant WQE: UMR control with CHECK_NOT_FREE (the key must be free: a grant never re-points a live key)
/// and TRANSLATION_OFFSET_EN at offset 0, `xlt_octowords` for the list, the mask KEY | FREE | PD | access |
/// LEN | PAGE_SIZE | START_ADDR; the mkey segment not free, MTT mode, the access bits, the new variant, the
/// PD, start, length, page size and the translation size; then the entries inline (`INLINE`) or one data
/// segment naming them. Refused (for the command path) where the caps or the key's size do not allow it.
pub fn grant_wqe(slot: &WqeSlot, g: &Grant<'_>, caps: &UmrCaps) -> Result<Vec<u8>, UmrRefused> {
    let pages = g.translation.pages();
    if pages == 0 || g.len == 0 {
        return Err(UmrRefused::Empty);
    }
    if pages > g.capacity {
        return Err(UmrRefused::TooManyEntries { entries: pages, capacity: g.capacity });
    }
    let octwords = xlt_octowords(pages);
    if octwords > usize::from(u16::MAX) {
        return Err(UmrRefused::ListTooLong { octwords });
    }
    let mask = MLX5_MKEY_MASK_KEY
        | MLX5_MKEY_MASK_FREE
        | MLX5_MKEY_MASK_PD
        | access_mask(caps)
        | MLX5_MKEY_MASK_LEN
        | MLX5_MKEY_MASK_PAGE_SIZE
        | MLX5_MKEY_MASK_START_ADDR;
    caps.check_mask(mask)?;
    if g.access.contains(MkeyAccess::ATOMIC) && mask & MLX5_MKEY_MASK_A == 0 {
        // The key's atomic bit cannot change here; asking for atomics through it would silently not get them.
        return Err(UmrRefused::AtomicDisabled);
    }
    let (len, mut flags) = match g.translation {
        Translation::Inline(_) => (UMR_HEADER_LEN + octwords * 16, MLX5_UMR_INLINE),
        Translation::Pointer { .. } => {
            if !caps.ptr_rlky {
                return Err(UmrRefused::NoPointerLkey);
            }
            (UMR_HEADER_LEN + DATA_SEG_LEN, 0)
        }
    };
    caps.check_len(len)?;
    flags |= MLX5_UMR_CHECK_NOT_FREE | MLX5_UMR_TRANSLATION_OFFSET_EN;

    let mut w = vec![0u8; len];
    ctrl(&mut w, slot, g.mkey);
    let u = |f: Field| f.at(UCTRL);
    u(umr_ctrl_seg::FLAGS).write(&mut w, flags.into());
    u(umr_ctrl_seg::XLT_OCTOWORDS).write(&mut w, octwords as u32);
    u(umr_ctrl_seg::XLT_OFFSET).write(&mut w, 0);
    umr_ctrl_seg::MKEY_MASK.at(UCTRL).write(&mut w, mask);
    u(umr_ctrl_seg::XLT_OFFSET_47_16).write(&mut w, 0);

    for (bit, f) in [
        (MkeyAccess::ATOMIC, mkc::A),
        (MkeyAccess::REMOTE_WRITE, mkc::RW),
        (MkeyAccess::REMOTE_READ, mkc::RR),
        (MkeyAccess::LOCAL_WRITE, mkc::LW),
        (MkeyAccess::LOCAL_READ, mkc::LR),
    ] {
        mkey_set(&mut w, f, g.access.contains(bit) as u32);
    }
    mkey_set(&mut w, mkc::ACCESS_MODE_1_0, crate::ifc::mkey::MLX5_MKC_ACCESS_MODE_MTT.into());
    mkey_set(&mut w, mkc::QPN, QPN_UNBOUND);
    mkey_set(&mut w, mkc::MKEY_7_0, g.new_variant.into());
    mkey_set(&mut w, mkc::PD, g.pd.0);
    mkc::START_ADDR.at(MKEY).write(&mut w, g.start);
    mkc::LEN.at(MKEY).write(&mut w, g.len);
    mkey_set(&mut w, mkc::TRANSLATIONS_OCTWORD_SIZE, octwords as u32);
    mkey_set(&mut w, mkc::LOG_PAGE_SIZE, g.log_page_size.into());
    match g.translation {
        Translation::Inline(p) => {
            let e = mtt_entries(p);
            w[UMR_HEADER_LEN..UMR_HEADER_LEN + e.len()].copy_from_slice(&e);
        }
        Translation::Pointer { addr, lkey, .. } => {
            data_seg::BYTE_COUNT.at(DATA).write(&mut w, (octwords * 16) as u32);
            data_seg::LKEY.at(DATA).write(&mut w, lkey);
            data_seg::ADDR.at(DATA).write(&mut w, addr);
        }
    }
    Ok(w)
}

/// Basic blocks a WQE of `len` bytes takes in the send queue.
pub const fn wqebbs(len: usize) -> usize {
    len.div_ceil(SEND_WQE_BB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64};

    const SLOT: WqeSlot = WqeSlot { wqe_index: 0x0102, qpn: 0x00_0abc, fence: MLX5_FENCE_MODE_INITIATOR_SMALL };

    fn caps() -> UmrCaps {
        UmrCaps {
            atomic: true,
            ptr_rlky: true,
            max_wqe_sz_sq: 1024,
            fence: MLX5_CAP_UMR_FENCE_SMALL,
            ..Default::default()
        }
    }

    /// The revoke, byte by byte as Linux's `mlx5r_umr_revoke_mr` lays it out (written by hand from `qp.h`,
    /// `device.h` and the `mkc` layout, not through the builder's constants).
    #[test]
    fn revoke_golden_bytes() {
        let w = revoke_wqe(&SLOT, &Revoke { mkey: Mkey(0x0012_34a7), quarantine_pd: Pdn(0x51) });
        let mut want = [0u8; 128];
        // mlx5_wqe_ctrl_seg: opmod 0, index 0x0102, opcode 0x25; qpn 0xabc, ds 8; fm_ce_se = small fence
        // (0x20) | CQ_UPDATE (0x08); umr_mkey.
        want[0..16].copy_from_slice(&[0, 0x01, 0x02, 0x25, 0, 0x0a, 0xbc, 0x08, 0, 0, 0, 0x28, 0, 0x12, 0x34, 0xa7]);
        // mlx5_wqe_umr_ctrl_seg: flags INLINE; no translation; mkey_mask = FREE (bit 29) | PD (bit 7).
        want[16] = 0x80;
        want[24..32].copy_from_slice(&[0, 0, 0, 0, 0x20, 0, 0, 0x80]);
        // mlx5_mkey_seg at 64: status free (0x40); qpn 0xffffff, mkey_7_0 0xa7; pd 0x51.
        want[64] = 0x40;
        want[68..72].copy_from_slice(&[0xff, 0xff, 0xff, 0xa7]);
        want[76..80].copy_from_slice(&[0, 0, 0, 0x51]);
        assert_eq!(w, want);
        assert_eq!(wqebbs(w.len()), 2);
    }

    #[test]
    fn grant_golden_bytes_inline() {
        let pages = [0x0000_0001_0020_0000u64, 0x0000_0001_0060_0000, 0x0000_0001_00a0_0000];
        let g = Grant {
            mkey: Mkey(0x0000_0733),
            new_variant: 0x5c,
            pd: Pdn(0x12),
            start: 0x0000_7f00_0020_0100,
            len: 0x50_0000,
            access: MkeyAccess::LOCAL_READ
                | MkeyAccess::LOCAL_WRITE
                | MkeyAccess::REMOTE_READ
                | MkeyAccess::REMOTE_WRITE,
            log_page_size: 21,
            capacity: 8,
            translation: Translation::Inline(&pages),
        };
        let w = grant_wqe(&SLOT, &g, &caps()).unwrap();
        // 128 header bytes + 3 entries padded to one 64-byte chunk = 192 bytes, 12 DS, 3 basic blocks.
        assert_eq!(w.len(), 192);
        assert_eq!(&w[0..16], &[0, 0x01, 0x02, 0x25, 0, 0x0a, 0xbc, 12, 0, 0, 0, 0x28, 0, 0, 0x07, 0x33]);
        // flags: INLINE 0x80 | CHECK_NOT_FREE 0x20 | TRANSLATION_OFFSET_EN 0x10; xlt_octowords 4, offset 0.
        assert_eq!(&w[16..24], &[0xb0, 0, 0, 0, 0, 4, 0, 0]);
        // mask: FREE (29) | A (21) | RW (20) | RR (19) | LW (18) | LR (17) | KEY (13) | PD (7) | START (6) |
        // PAGE_SIZE (1) | LEN (0).
        assert_eq!(be64(&w, 24), 0x2000_0000 | 0x003e_0000 | 0x2000 | 0xc3);
        assert_eq!(be32(&w, 32), 0);
        assert!(w[36..64].iter().all(|&b| b == 0));
        // mkey seg: not free; flags rw 0x20 | rr 0x10 | lw 0x08 | lr 0x04 | MTT 0x01; qpn | new variant.
        assert_eq!(&w[64..68], &[0, 0, 0x3d, 0]);
        assert_eq!(be32(&w, 68), 0xffff_ff5c);
        assert_eq!(be32(&w, 76), 0x12);
        assert_eq!(be64(&w, 80), 0x0000_7f00_0020_0100);
        assert_eq!(be64(&w, 88), 0x50_0000);
        assert_eq!(be32(&w, 116), 4); // xlt_oct_size
        assert_eq!(w[123], 21); // log2_page_size
        // Inline MTTs with rd_en | wr_en, the chunk's fourth entry zero.
        assert_eq!(be64(&w, 128), 0x0000_0001_0020_0003);
        assert_eq!(be64(&w, 136), 0x0000_0001_0060_0003);
        assert_eq!(be64(&w, 144), 0x0000_0001_00a0_0003);
        assert!(w[152..192].iter().all(|&b| b == 0));
        assert_eq!(be16(&w, 20), 4);
    }

    #[test]
    fn grant_golden_bytes_pointer() {
        let g = Grant {
            mkey: Mkey(0x0000_0733),
            new_variant: 0x01,
            pd: Pdn(0x12),
            start: 0x1000,
            len: 0x2000,
            access: MkeyAccess::REMOTE_READ,
            log_page_size: 12,
            capacity: 64,
            translation: Translation::Pointer { addr: 0x00ab_cd00_0040, lkey: 0x100, pages: 17 },
        };
        let w = grant_wqe(&SLOT, &g, &caps()).unwrap();
        assert_eq!(w.len(), 144);
        assert_eq!(w[7], 9); // ds
        // No INLINE; 17 entries = 136 bytes → three 64-byte chunks = 12 octwords.
        assert_eq!(&w[16..24], &[0x30, 0, 0, 0, 0, 12, 0, 0]);
        assert_eq!(w[66], 0x11); // rr | MTT
        assert_eq!(be32(&w, 116), 12);
        // mlx5_wqe_data_seg: byte_count 192, lkey, addr.
        assert_eq!(&w[128..144], &[0, 0, 0, 0xc0, 0, 0, 0x01, 0, 0, 0, 0, 0xab, 0xcd, 0, 0, 0x40]);
    }

    #[test]
    fn caps_decide_and_refuse() {
        let c = caps();
        let pages = [0x20_0000u64; 4];
        let g = Grant {
            mkey: Mkey(0x100),
            new_variant: 1,
            pd: Pdn(1),
            start: 0,
            len: 0x80_0000,
            access: MkeyAccess::REMOTE_WRITE | MkeyAccess::ATOMIC,
            log_page_size: 21,
            capacity: 4,
            translation: Translation::Inline(&pages),
        };
        assert!(grant_wqe(&SLOT, &g, &c).is_ok());
        let no_size = UmrCaps { modify_entity_size_disabled: true, ..c };
        assert_eq!(grant_wqe(&SLOT, &g, &no_size), Err(UmrRefused::EntitySizeDisabled));
        assert_eq!(no_size.grant_allowed(), Err(UmrRefused::EntitySizeDisabled));
        assert_eq!(no_size.revoke_allowed(), Ok(()), "a revoke carries no page size");
        // Atomic modify refused: a grant asking for atomics is refused; one without leaves A out of the mask.
        let no_atomic = UmrCaps { modify_atomic_disabled: true, ..c };
        assert_eq!(grant_wqe(&SLOT, &g, &no_atomic), Err(UmrRefused::AtomicDisabled));
        let plain = Grant { access: MkeyAccess::REMOTE_WRITE, ..g };
        let w = grant_wqe(&SLOT, &plain, &no_atomic).unwrap();
        assert_eq!(be64(&w, 24) & MLX5_MKEY_MASK_A, 0);
        assert_eq!(no_atomic.check_mask(MLX5_MKEY_MASK_A), Err(UmrRefused::AtomicDisabled));
        // More pages than the key holds; an empty grant.
        let big = [0u64; 5];
        assert_eq!(
            grant_wqe(&SLOT, &Grant { translation: Translation::Inline(&big), ..g }, &c),
            Err(UmrRefused::TooManyEntries { entries: 5, capacity: 4 })
        );
        assert_eq!(grant_wqe(&SLOT, &Grant { translation: Translation::Inline(&[]), ..g }, &c), Err(UmrRefused::Empty));
        assert_eq!(grant_wqe(&SLOT, &Grant { len: 0, ..g }, &c), Err(UmrRefused::Empty));
        // A WQE longer than max_wqe_sz_sq: 24 inline pages = 192 bytes + 128 = 320 > 256.
        let many = [0x1000u64; 24];
        let small_sq = UmrCaps { max_wqe_sz_sq: 256, ..c };
        let inl = Grant { translation: Translation::Inline(&many), capacity: 64, access: MkeyAccess::REMOTE_READ, ..g };
        assert_eq!(grant_wqe(&SLOT, &inl, &small_sq), Err(UmrRefused::WqeTooLong { bytes: 320, max: 256 }));
        // The same list by pointer fits; without umr_ptr_rlky the pointer is refused.
        let ptr = Grant { translation: Translation::Pointer { addr: 0x40, lkey: 0x100, pages: 24 }, ..inl };
        assert!(grant_wqe(&SLOT, &ptr, &small_sq).is_ok());
        assert_eq!(grant_wqe(&SLOT, &ptr, &UmrCaps { ptr_rlky: false, ..small_sq }), Err(UmrRefused::NoPointerLkey));
        // A DS count caps the WQE at 1008 bytes whatever max_wqe_sz_sq says; 0 means "not reported".
        assert_eq!(UmrCaps { max_wqe_sz_sq: 0, ..c }.max_wqe(), 1008);
        assert_eq!(UmrCaps { max_wqe_sz_sq: 0xffff, ..c }.max_wqe(), 1008);
        assert_eq!(
            UmrCaps { max_wqe_sz_sq: 64, ..c }.revoke_allowed(),
            Err(UmrRefused::WqeTooLong { bytes: 128, max: 64 })
        );
        // A list beyond a 16-bit octword count.
        let huge = Grant {
            translation: Translation::Pointer { addr: 0, lkey: 0, pages: 0x2_0000 },
            capacity: 0x10_0000,
            access: MkeyAccess::REMOTE_READ,
            ..g
        };
        assert_eq!(grant_wqe(&SLOT, &huge, &c), Err(UmrRefused::ListTooLong { octwords: 0x1_0000 }));
    }

    #[test]
    fn fence_follows_the_cap() {
        let f = |fence| UmrCaps { fence, ..UmrCaps::default() }.fence_mode();
        assert_eq!((f(0), f(1), f(2), f(3)), (0x60, 0x20, 0x00, 0x60));
    }

    #[test]
    fn caps_from_the_general_block() {
        let g = GeneralCaps {
            umr_modify_entity_size_disabled: true,
            umr_modify_atomic_disabled: true,
            umr_extended_translation_offset: true,
            umr_ptr_rlky: true,
            umr_fence: 1,
            max_wqe_sz_sq: 512,
            atomic: true,
            ..GeneralCaps::default()
        };
        assert_eq!(
            UmrCaps::from_general(&g),
            UmrCaps {
                modify_entity_size_disabled: true,
                modify_atomic_disabled: true,
                extended_translation_offset: true,
                ptr_rlky: true,
                fence: 1,
                max_wqe_sz_sq: 512,
                atomic: true,
            }
        );
        assert_eq!(xlt_octowords(1), 4);
        assert_eq!(xlt_octowords(8), 4);
        assert_eq!(xlt_octowords(9), 8);
        assert_eq!(mtt_entries(&[0x1000]).len(), 64);
        // No overflow at the limit: saturates, and a grant that large is refused.
        assert_eq!(xlt_octowords(usize::MAX), usize::MAX / 64 * 4 + 4);
        assert!(xlt_octowords(usize::MAX) > usize::from(u16::MAX));
    }
}
