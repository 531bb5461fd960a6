//! Memory keys as the device holds them after CREATE_MKEY (`mlx5_ifc.h` `mkc`, `mtt`): what the RoCE
//! responder needs to check and translate an access — PD, range, access flags, translation pages.

/// `mkc.access_mode` (`mlx5_ifc.h:4289-4297`); only PA and MTT are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    /// Physical addresses: the virtual address is the device address.
    Pa,
    /// Memory translation table: 2^log_page_size pages listed at creation.
    Mtt,
}

/// The access bits of `mkc` (`a`, `rw`, `rr`, `lw`, `lr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub remote_atomic: bool,
    pub remote_write: bool,
    pub remote_read: bool,
    pub local_write: bool,
    pub local_read: bool,
}

/// One `mtt` entry: page address (`ptag`) and its `rd_en` / `wr_en` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mtt {
    pub addr: u64,
    pub read: bool,
    pub write: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkeyInfo {
    /// `(mkey_index << 8) | mkey_7_0`, what the driver uses as lkey / rkey.
    pub key: u32,
    pub index: u32,
    pub pd: u32,
    pub start_addr: u64,
    pub len: u64,
    /// `length64`: the key covers 2^64 bytes from `start_addr` (PA mode only).
    pub length64: bool,
    /// `free` (`mkc.free`, the mkey segment's status bit): the key exists but grants no access. Set at
    /// CREATE_MKEY or by a UMR (`crate::umr`), cleared by a UMR that enables the key.
    pub free: bool,
    pub umr_en: bool,
    pub access: Access,
    pub access_mode: AccessMode,
    pub log_page_size: u8,
    /// The translation table (MTT mode): `2 × translations_octword_size` entries as CREATE_MKEY sized it, those
    /// the input gave first, the rest not present (zero) until a UMR writes them. The key's range uses the
    /// first [`MkeyInfo::covered`] of them.
    pub mtt: Vec<Mtt>,
    /// The 64-byte `mkc` as created (QUERY_MKEY returns it).
    pub mkc: Vec<u8>,
}

impl MkeyInfo {
    /// The table entries the key's range `[start_addr, start_addr + len)` uses (MTT mode; empty in PA mode),
    /// or all there are when the range needs more than the table holds.
    pub fn covered(&self) -> &[Mtt] {
        if self.access_mode != AccessMode::Mtt {
            return &[];
        }
        let ps = 1u64 << self.log_page_size;
        let n = (self.start_addr & (ps - 1)).saturating_add(self.len).div_ceil(ps);
        &self.mtt[..usize::try_from(n).unwrap_or(usize::MAX).min(self.mtt.len())]
    }

    /// `[va, va+len)` as device-address segments, or `None` when any byte lies outside the key's range or its
    /// translation. Access flags are not checked here (the caller knows which access it is).
    pub fn translate(&self, va: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let end = va.checked_add(len)?;
        if va < self.start_addr || (!self.length64 && end > self.start_addr.checked_add(self.len)?) {
            return None;
        }
        if len == 0 {
            return Some(Vec::new());
        }
        match self.access_mode {
            AccessMode::Pa => Some(vec![(va, len)]),
            AccessMode::Mtt => {
                let ps = 1u64 << self.log_page_size;
                let base = self.start_addr & !(ps - 1);
                let mut out: Vec<(u64, u64)> = Vec::new();
                let mut at = va;
                while at < end {
                    let off = at - base;
                    let page = self.mtt.get(usize::try_from(off >> self.log_page_size).ok()?)?;
                    let in_page = off & (ps - 1);
                    let n = (ps - in_page).min(end - at);
                    let pa = page.addr + in_page;
                    match out.last_mut() {
                        Some((a, l)) if *a + *l == pa => *l += n,
                        _ => out.push((pa, n)),
                    }
                    at += n;
                }
                Some(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtt_translation_splits_and_merges() {
        let m = MkeyInfo {
            key: 0x100,
            index: 1,
            pd: 1,
            start_addr: 0x7000_0800,
            len: 0x2000,
            length64: false,
            free: false,
            umr_en: false,
            access: Access::default(),
            access_mode: AccessMode::Mtt,
            log_page_size: 12,
            mtt: vec![
                Mtt { addr: 0x10000, read: true, write: true },
                Mtt { addr: 0x11000, read: true, write: true },
                Mtt { addr: 0x30000, read: true, write: true },
            ],
            mkc: vec![0; 64],
        };
        assert_eq!(m.translate(0x7000_0800, 0x1000), Some(vec![(0x10800, 0x1000)]));
        assert_eq!(m.translate(0x7000_1f00, 0x200), Some(vec![(0x11f00, 0x100), (0x30000, 0x100)]));
        assert_eq!(m.translate(0x7000_0700, 0x10), None);
        assert_eq!(m.translate(0x7000_2800, 1), None);
    }
}
