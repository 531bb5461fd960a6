//! Memory keys (`mlx5_ifc.h`: `create_mkey_in/out`, `mkc`, `mtt`, `destroy_mkey_in`, `query_mkey_in/out`;
//! docs/reference/mlx5.md §e.2). MTT mode over a list of equal pages (4 KiB or 2 MiB), or PA mode for a whole-memory
//! key.

use alloc::vec::Vec;

use crate::command::{Command, Output};
use crate::field::{Field, Field64};
use crate::handles::{Mkey, MkeyIndex, Pdn};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID, PAS, PAS_OFFSET};

pub use crate::ifc::opcode::{MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_OP_DESTROY_MKEY, MLX5_CMD_OP_QUERY_MKEY};

/// `query_mkey_out`: mkc at 0x10, the first four MTTs at 0x110 (read from `mlx5_ifc.h` by hand).
pub const QUERY_MKEY_OUT_LEN: usize = 0x130;

/// `mkc.access_mode_1_0` (`mlx5_ifc.h:4289-4297`).
pub const MLX5_MKC_ACCESS_MODE_PA: u8 = 0;
pub const MLX5_MKC_ACCESS_MODE_MTT: u8 = 1;

/// `mkc.qpn` for a key not bound to a QP.
pub const MKC_QPN_UNBOUND: u32 = 0x00ff_ffff;

/// `mtt.rd_en` / `mtt.wr_en`: bits 0 and 1 of the 64-bit entry (bit offsets 0x3f / 0x3e).
pub const MTT_RD_EN: u64 = 1 << 0;
pub const MTT_WR_EN: u64 = 1 << 1;

/// `mkc` access bits (`a`, `rw`, `rr`, `lw`, `lr`), as a set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MkeyAccess(pub u8);

impl MkeyAccess {
    pub const LOCAL_READ: MkeyAccess = MkeyAccess(1 << 0);
    pub const LOCAL_WRITE: MkeyAccess = MkeyAccess(1 << 1);
    pub const REMOTE_READ: MkeyAccess = MkeyAccess(1 << 2);
    pub const REMOTE_WRITE: MkeyAccess = MkeyAccess(1 << 3);
    pub const ATOMIC: MkeyAccess = MkeyAccess(1 << 4);

    pub const fn contains(self, o: MkeyAccess) -> bool {
        self.0 & o.0 == o.0
    }

    pub const fn union(self, o: MkeyAccess) -> MkeyAccess {
        MkeyAccess(self.0 | o.0)
    }
}

impl core::ops::BitOr for MkeyAccess {
    type Output = MkeyAccess;
    fn bitor(self, o: MkeyAccess) -> MkeyAccess {
        self.union(o)
    }
}

/// `mkc`, offsets from its start; it sits at bit 0x80 ([`MKC`]) of `create_mkey_in` and `query_mkey_out`, and
/// is the `mlx5_mkey_seg` of a UMR work request ([`crate::ifc::umr`]).
pub mod mkc {
    use crate::field::{Field, Field64};
    pub const FREE: Field = Field::new(0x01, 1);
    pub const ACCESS_MODE_4_2: Field = Field::new(0x03, 3);
    pub const UMR_EN: Field = Field::new(0x10, 1);
    pub const A: Field = Field::new(0x11, 1);
    pub const RW: Field = Field::new(0x12, 1);
    pub const RR: Field = Field::new(0x13, 1);
    pub const LW: Field = Field::new(0x14, 1);
    pub const LR: Field = Field::new(0x15, 1);
    pub const ACCESS_MODE_1_0: Field = Field::new(0x16, 2);
    pub const QPN: Field = Field::new(0x20, 24);
    pub const MKEY_7_0: Field = Field::new(0x38, 8);
    pub const LENGTH64: Field = Field::new(0x60, 1);
    pub const PD: Field = Field::new(0x68, 24);
    pub const START_ADDR: Field64 = Field64::new(0x80);
    pub const LEN: Field64 = Field64::new(0xc0);
    pub const TRANSLATIONS_OCTWORD_SIZE: Field = Field::new(0x1a0, 32);
    pub const LOG_PAGE_SIZE: Field = Field::new(0x1da, 6);
}

/// Bit offset of `mkc` in `create_mkey_in` / `query_mkey_out`.
pub const MKC: usize = 0x80;
/// `create_mkey_out.mkey_index`, `destroy_mkey_in.mkey_index`, `query_mkey_in.mkey_index`.
const MKEY_INDEX: Field = OBJECT_ID;
/// `create_mkey_in.translations_octword_actual_size`.
const TRANSLATIONS_OCTWORD_ACTUAL_SIZE: Field = Field::new(0x300, 32);
/// `create_mkey_in.klm_pas_mtt[]` and the MTTs `query_mkey_out` returns: 64-bit entries from byte 0x110.
const MTT: Field64 = PAS;

// The fields as the commands carry them (absolute).
const FREE: Field = mkc::FREE.at(MKC);
const ACCESS_MODE_4_2: Field = mkc::ACCESS_MODE_4_2.at(MKC);
const UMR_EN: Field = mkc::UMR_EN.at(MKC);
const A: Field = mkc::A.at(MKC);
const RW: Field = mkc::RW.at(MKC);
const RR: Field = mkc::RR.at(MKC);
const LW: Field = mkc::LW.at(MKC);
const LR: Field = mkc::LR.at(MKC);
const ACCESS_MODE_1_0: Field = mkc::ACCESS_MODE_1_0.at(MKC);
const QPN: Field = mkc::QPN.at(MKC);
const MKEY_7_0: Field = mkc::MKEY_7_0.at(MKC);
const LENGTH64: Field = mkc::LENGTH64.at(MKC);
const PD: Field = mkc::PD.at(MKC);
const START_ADDR: Field64 = mkc::START_ADDR.at(MKC);
const LEN: Field64 = mkc::LEN.at(MKC);
const TRANSLATIONS_OCTWORD_SIZE: Field = mkc::TRANSLATIONS_OCTWORD_SIZE.at(MKC);
const LOG_PAGE_SIZE: Field = mkc::LOG_PAGE_SIZE.at(MKC);

/// The most MTT entries one CREATE_MKEY carries: what fits the longest command ([`crate::cmdq::MAX_MSG`])
/// after the 0x110 bytes before `klm_pas_mtt`, in whole octwords of two entries.
pub const MAX_MTT_PAGES: usize = (crate::cmdq::MAX_MSG - PAS_OFFSET) / 16 * 2;

/// What to register. For MTT mode `pages` are the device addresses of equal pages of `1 << log_page_size`
/// bytes (12 = 4 KiB, 21 = 2 MiB; `mkc.log_page_size` is absolute, unlike the queues'); `start` is the
/// address the key's users name (its offset inside the first page is `start % page`).
#[derive(Clone, Copy, Debug)]
pub struct MkeyParams<'a> {
    pub pd: Pdn,
    /// `mkey_7_0`: the caller rotates it on every re-creation of an index.
    pub variant: u8,
    pub start: u64,
    pub len: u64,
    pub access: MkeyAccess,
    pub log_page_size: u8,
    pub pages: &'a [u64],
}

fn set_access(c: &mut Command, access: MkeyAccess) {
    c.set(A, access.contains(MkeyAccess::ATOMIC) as u32);
    c.set(RW, access.contains(MkeyAccess::REMOTE_WRITE) as u32);
    c.set(RR, access.contains(MkeyAccess::REMOTE_READ) as u32);
    c.set(LW, access.contains(MkeyAccess::LOCAL_WRITE) as u32);
    c.set(LR, access.contains(MkeyAccess::LOCAL_READ) as u32);
}

/// CREATE_MKEY in MTT mode. Each MTT entry is the page address with `rd_en`/`wr_en` set (Linux
/// `MLX5_IB_MTT_PRESENT`); entries go two per octword, the list padded to a whole octword.
pub fn create_mkey_mtt(p: &MkeyParams<'_>) -> Command {
    let octwords = p.pages.len().div_ceil(2);
    let mut c = Command::new(MLX5_CMD_OP_CREATE_MKEY, 0, PAS_OFFSET + 16 * octwords, CMD_HDR_LEN)
        .with("pd", p.pd.0.into())
        .with("start", p.start)
        .with("len", p.len)
        .with("pages", p.pages.len() as u64);
    set_access(&mut c, p.access);
    c.set(ACCESS_MODE_1_0, MLX5_MKC_ACCESS_MODE_MTT.into());
    c.set(QPN, MKC_QPN_UNBOUND);
    c.set(MKEY_7_0, p.variant.into());
    c.set(PD, p.pd.0);
    c.set64(START_ADDR, p.start);
    c.set64(LEN, p.len);
    c.set(TRANSLATIONS_OCTWORD_SIZE, octwords as u32);
    c.set(LOG_PAGE_SIZE, p.log_page_size.into());
    c.set(TRANSLATIONS_OCTWORD_ACTUAL_SIZE, octwords as u32);
    for (i, &a) in p.pages.iter().enumerate() {
        c.set64(MTT.nth(i), a | MTT_RD_EN | MTT_WR_EN);
    }
    c
}

/// CREATE_MKEY in PA mode: physical addresses `[start, start + len)`, or all of memory with `len` = None
/// (`length64`; Linux `get_dma_mr`). No translation entries.
pub fn create_mkey_pa(pd: Pdn, variant: u8, start: u64, len: Option<u64>, access: MkeyAccess) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_MKEY, 0, PAS_OFFSET, CMD_HDR_LEN)
        .with("pd", pd.0.into())
        .with("start", start)
        .with("len", len.unwrap_or(u64::MAX));
    set_access(&mut c, access);
    c.set(ACCESS_MODE_1_0, MLX5_MKC_ACCESS_MODE_PA.into());
    c.set(QPN, MKC_QPN_UNBOUND);
    c.set(MKEY_7_0, variant.into());
    c.set(PD, pd.0);
    c.set64(START_ADDR, start);
    match len {
        Some(l) => c.set64(LEN, l),
        None => c.set(LENGTH64, 1),
    }
    c
}

/// CREATE_MKEY for a key UMR will re-point (Linux `set_cache_mkc` for the mkey cache): `free` and `umr_en`,
/// MTT mode, room for `entries` translation entries (`translations_octword_size`, none written: the grant
/// brings them), owned by `pd` (the quarantine PD, so no client QP can name it while it is free), no access
/// but what the grant gives. Whether it may later carry remote atomics is fixed here when the HCA refuses
/// UMR atomic changes (`atomic` is then the pool's choice; otherwise the grant sets it).
pub fn create_mkey_umr_free(pd: Pdn, variant: u8, entries: usize, log_page_size: u8, atomic: bool) -> Command {
    let octwords = crate::ifc::umr::xlt_octowords(entries);
    let mut c = Command::new(MLX5_CMD_OP_CREATE_MKEY, 0, PAS_OFFSET, CMD_HDR_LEN)
        .with("pd", pd.0.into())
        .with("entries", entries as u64)
        .with("umr", 1);
    c.set(FREE, 1);
    c.set(UMR_EN, 1);
    c.set(A, atomic as u32);
    c.set(ACCESS_MODE_1_0, MLX5_MKC_ACCESS_MODE_MTT.into());
    c.set(QPN, MKC_QPN_UNBOUND);
    c.set(MKEY_7_0, variant.into());
    c.set(PD, pd.0);
    c.set(TRANSLATIONS_OCTWORD_SIZE, octwords as u32);
    c.set(LOG_PAGE_SIZE, log_page_size.into());
    c
}

/// `create_mkey_out.mkey_index`.
pub fn create_mkey_out(out: &Output) -> MkeyIndex {
    MkeyIndex(out.get(MKEY_INDEX))
}

/// The full key from CREATE_MKEY's output and the variant the command was built with.
pub fn create_mkey_out_key(out: &Output, variant: u8) -> Mkey {
    Mkey::new(create_mkey_out(out), variant)
}

pub fn destroy_mkey(index: impl Into<MkeyIndex>) -> Command {
    let index: MkeyIndex = index.into();
    let mut c = Command::new(MLX5_CMD_OP_DESTROY_MKEY, 0, CMD_HDR_LEN, CMD_HDR_LEN).with("mkey_index", index.0.into());
    c.set(MKEY_INDEX, index.0);
    c
}

pub fn query_mkey(index: impl Into<MkeyIndex>) -> Command {
    let index: MkeyIndex = index.into();
    let mut c =
        Command::new(MLX5_CMD_OP_QUERY_MKEY, 0, CMD_HDR_LEN, QUERY_MKEY_OUT_LEN).with("mkey_index", index.0.into());
    c.set(MKEY_INDEX, index.0);
    c
}

/// The `mkc` QUERY_MKEY returns, with up to four MTT entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkeyInfo {
    pub free: bool,
    pub access: MkeyAccess,
    pub access_mode: u8,
    pub qpn: u32,
    pub variant: u8,
    pub length64: bool,
    pub pd: Pdn,
    pub start: u64,
    pub len: u64,
    pub translations_octword_size: u32,
    pub log_page_size: u8,
    pub mtt: Vec<u64>,
}

pub fn query_mkey_out(out: &Output) -> MkeyInfo {
    let bit = |f: Field| out.get(f) != 0;
    let mut access = MkeyAccess::default();
    for (b, a) in [
        (LR, MkeyAccess::LOCAL_READ),
        (LW, MkeyAccess::LOCAL_WRITE),
        (RR, MkeyAccess::REMOTE_READ),
        (RW, MkeyAccess::REMOTE_WRITE),
        (A, MkeyAccess::ATOMIC),
    ] {
        if bit(b) {
            access = access | a;
        }
    }
    let octwords = out.get(TRANSLATIONS_OCTWORD_SIZE) as usize;
    let room = out.bytes().len().saturating_sub(PAS_OFFSET) / 8;
    MkeyInfo {
        free: bit(FREE),
        access,
        access_mode: out.get(ACCESS_MODE_1_0) as u8 | ((out.get(ACCESS_MODE_4_2) as u8) << 2),
        qpn: out.get(QPN),
        variant: out.get(MKEY_7_0) as u8,
        length64: bit(LENGTH64),
        pd: Pdn(out.get(PD)),
        start: out.get64(START_ADDR),
        len: out.get64(LEN),
        translations_octword_size: octwords as u32,
        log_page_size: out.get(LOG_PAGE_SIZE) as u8,
        mtt: (0..(2 * octwords).min(room)).map(|i| out.get64(MTT.nth(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64, out};
    use alloc::vec;

    #[test]
    fn create_mtt() {
        let pages = [0x20_0000u64, 0x60_0000, 0xa0_0000];
        let c = create_mkey_mtt(&MkeyParams {
            pd: Pdn(0x12),
            variant: 0x5a,
            start: 0x7f00_0020_0100,
            len: 0x50_0000,
            access: MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE | MkeyAccess::REMOTE_WRITE,
            log_page_size: 21,
            pages: &pages,
        });
        let b = c.input();
        assert_eq!(be16(b, 0), 0x200);
        assert_eq!(b.len(), 0x110 + 32); // 3 entries padded to 2 octwords
        // mkc dword 0 (byte 0x10): rw [13], lw [11], lr [10], access_mode_1_0 [9:8] = 1.
        assert_eq!(be32(b, 0x10), (1 << 13) | (1 << 11) | (1 << 10) | (1 << 8));
        assert_eq!(be32(b, 0x14), 0xffff_ff5a);
        assert_eq!(be32(b, 0x1c), 0x12);
        assert_eq!(be64(b, 0x20), 0x7f00_0020_0100);
        assert_eq!(be64(b, 0x28), 0x50_0000);
        assert_eq!(be32(b, 0x44), 2);
        assert_eq!(be32(b, 0x48), 21);
        assert_eq!(be32(b, 0x60), 2);
        assert_eq!(be64(b, 0x110), 0x20_0003);
        assert_eq!(be64(b, 0x120), 0xa0_0003);
        assert_eq!(be64(b, 0x128), 0);
        assert_eq!(c.attrs().get("pd"), Some(0x12));
        assert_eq!(create_mkey_out_key(&out(0x10, &[(0x08, &[0, 0, 0, 7])]), 0x5a), Mkey(0x75a));
    }

    #[test]
    fn create_umr_free() {
        let c = create_mkey_umr_free(Pdn(0x33), 0x9e, 5, 21, false);
        let b = c.input();
        assert_eq!((be16(b, 0), b.len()), (0x200, 0x110));
        // mkc dword 0: free [30], umr_en [15], access_mode_1_0 [9:8] = MTT; no access bits.
        assert_eq!(be32(b, 0x10), (1 << 30) | (1 << 15) | (1 << 8));
        assert_eq!(be32(b, 0x14), 0xffff_ff9e);
        assert_eq!(be32(b, 0x1c), 0x33);
        assert_eq!((be64(b, 0x20), be64(b, 0x28)), (0, 0));
        // 5 entries → one 64-byte chunk of 8 → 4 octwords; none written (actual size 0).
        assert_eq!((be32(b, 0x44), be32(b, 0x48), be32(b, 0x60)), (4, 21, 0));
        assert_eq!(c.attrs().get("umr"), Some(1));
        assert_eq!(
            be32(create_mkey_umr_free(Pdn(1), 0, 9, 12, true).input(), 0x10),
            (1 << 30) | (1 << 15) | (1 << 14) | (1 << 8)
        );
        assert_eq!(be32(create_mkey_umr_free(Pdn(1), 0, 9, 12, true).input(), 0x44), 8);
    }

    #[test]
    fn create_pa() {
        let all = MkeyAccess::LOCAL_READ
            | MkeyAccess::LOCAL_WRITE
            | MkeyAccess::REMOTE_READ
            | MkeyAccess::REMOTE_WRITE
            | MkeyAccess::ATOMIC;
        let c = create_mkey_pa(Pdn(1), 3, 0, None, all);
        let b = c.input();
        assert_eq!(b.len(), 0x110);
        assert_eq!(be32(b, 0x10), 0x1f << 10);
        assert_eq!(be32(b, 0x1c), 0x8000_0001);
        assert_eq!(be32(b, 0x60), 0);
        let c = create_mkey_pa(Pdn(1), 3, 0x1000, Some(0x2000), MkeyAccess::LOCAL_READ);
        assert_eq!(be32(c.input(), 0x1c), 1);
        assert_eq!(be64(c.input(), 0x28), 0x2000);
    }

    #[test]
    fn destroy_and_query() {
        let d = destroy_mkey(MkeyIndex(0xab_cdef));
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8)), (0x202, 0xab_cdef));
        let q = query_mkey(Mkey(0x1234_5678).index());
        assert_eq!((be16(q.input(), 0), be32(q.input(), 8), q.out_len()), (0x201, 0x12_3456, 0x130));
        let o = out(
            0x130,
            &[
                (0x10, &[0x40, 0, 0x19, 0x00]), // free, rr, lw, mode 1
                (0x14, &[0xff, 0xff, 0xff, 0x77]),
                (0x1c, &[0, 0, 0, 9]),
                (0x20, &0x1000u64.to_be_bytes()),
                (0x28, &0x3000u64.to_be_bytes()),
                (0x44, &[0, 0, 0, 2]),
                (0x4b, &[12]),
                (0x110, &0x8003u64.to_be_bytes()),
                (0x118, &0x9001u64.to_be_bytes()),
                (0x120, &0xa003u64.to_be_bytes()),
            ],
        );
        let i = query_mkey_out(&o);
        assert!(i.free && !i.length64);
        assert_eq!(i.access, MkeyAccess::REMOTE_READ | MkeyAccess::LOCAL_WRITE);
        assert_eq!((i.access_mode, i.qpn, i.variant, i.pd), (1, 0xff_ffff, 0x77, Pdn(9)));
        assert_eq!((i.start, i.len, i.translations_octword_size, i.log_page_size), (0x1000, 0x3000, 2, 12));
        assert_eq!(i.mtt, vec![0x8003, 0x9001, 0xa003, 0]);
    }
}
