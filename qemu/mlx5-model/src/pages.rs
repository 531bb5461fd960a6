//! Firmware page ownership (QUERY_PAGES / MANAGE_PAGES, `mlx5_ifc.h` `query_pages_*`, `manage_pages_*`;
//! docs/reference/mlx5.md §b.3). A page the driver gives belongs to the device until the device returns it on a TAKE;
//! the model records each 4 KiB page by its device address and never returns one twice or accepts one twice.

use std::collections::BTreeSet;

use crate::mem::Memory;

/// `MLX5_ADAPTER_PAGE_SIZE` (`device.h:247-248`).
pub const PAGE_SIZE: u64 = 4096;

/// QUERY_PAGES op_mod (`mlx5_ifc.h:5969-5973`).
pub mod query_pages_op_mod {
    pub const BOOT: u16 = 1;
    pub const INIT: u16 = 2;
    pub const REGULAR: u16 = 3;
}

/// MANAGE_PAGES op_mod (`mlx5_ifc.h:7928-7932`).
pub mod manage_pages_op_mod {
    pub const ALLOCATION_FAIL: u16 = 0;
    pub const ALLOCATION_SUCCESS: u16 = 1;
    pub const HCA_RETURN_PAGES: u16 = 2;
}

/// Pages the device owns and the demand it reports.
pub struct PageLedger {
    owned: BTreeSet<u64>,
    pub boot: u32,
    pub init: u32,
    pub regular: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveError {
    /// Index in the PAS list of a misaligned page, one outside RAM, or one the device already owns.
    Misaligned(usize),
    OutsideRam(usize),
    AlreadyOwned(usize),
}

impl PageLedger {
    pub fn new(boot: u32, init: u32, regular: u32) -> PageLedger {
        PageLedger { owned: BTreeSet::new(), boot, init, regular }
    }

    pub fn owned(&self) -> usize {
        self.owned.len()
    }

    pub fn owns(&self, addr: u64) -> bool {
        self.owned.contains(&addr)
    }

    fn cumulative(&self, op_mod: u16) -> i64 {
        let (b, i, r) = (i64::from(self.boot), i64::from(self.init), i64::from(self.regular));
        match op_mod {
            query_pages_op_mod::BOOT => b,
            query_pages_op_mod::INIT => b + i,
            _ => b + i + r,
        }
    }

    /// QUERY_PAGES `num_pages`: what the stage still needs. BOOT and INIT never go negative; REGULAR is
    /// negative when the device holds more than it needs and would return pages.
    pub fn query(&self, op_mod: u16) -> i32 {
        let want = self.cumulative(op_mod) - self.owned.len() as i64;
        let want = if op_mod == query_pages_op_mod::REGULAR { want } else { want.max(0) };
        want.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
    }

    /// Boot and init pages are all present (INIT_HCA's precondition).
    pub fn init_satisfied(&self) -> bool {
        self.owned.len() as i64 >= self.cumulative(query_pages_op_mod::INIT)
    }

    /// Records `pas` as device pages: all or nothing.
    pub fn give(&mut self, pas: &[u64], ram: &dyn Memory) -> Result<(), GiveError> {
        let mut seen = BTreeSet::new();
        for (i, &pa) in pas.iter().enumerate() {
            if !pa.is_multiple_of(PAGE_SIZE) {
                return Err(GiveError::Misaligned(i));
            }
            if !ram.holds(pa, PAGE_SIZE) {
                return Err(GiveError::OutsideRam(i));
            }
            if self.owned.contains(&pa) || !seen.insert(pa) {
                return Err(GiveError::AlreadyOwned(i));
            }
        }
        self.owned.extend(seen);
        Ok(())
    }

    /// Returns up to `n` pages, keeping `keep` (what the device still needs in its current state).
    pub fn take(&mut self, n: usize, keep: usize) -> Vec<u64> {
        let spare = self.owned.len().saturating_sub(keep).min(n);
        let out: Vec<u64> = self.owned.iter().rev().take(spare).copied().collect();
        for pa in &out {
            self.owned.remove(pa);
        }
        out
    }

    /// Drops every page (DISABLE_HCA: the function is gone, so is its memory).
    pub fn release_all(&mut self) {
        self.owned.clear();
    }

    /// Pages needed while the HCA is initialized.
    pub fn in_use_when_initialized(&self) -> usize {
        self.cumulative(query_pages_op_mod::REGULAR).max(0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_and_ownership() {
        let ram = crate::mem::VecMemory::new(1 << 20);
        let mut l = PageLedger::new(2, 3, 1);
        assert_eq!(l.query(1), 2);
        assert_eq!(l.query(2), 5);
        assert_eq!(l.give(&[0x1000, 0x1001], &ram), Err(GiveError::Misaligned(1)));
        assert_eq!(l.give(&[0x1000, 1 << 20], &ram), Err(GiveError::OutsideRam(1)));
        assert_eq!(l.give(&[0x1000, 0x1000], &ram), Err(GiveError::AlreadyOwned(1)));
        assert_eq!(l.owned(), 0);
        l.give(&[0x1000, 0x2000], &ram).unwrap();
        assert_eq!(l.query(1), 0);
        assert_eq!(l.query(2), 3);
        assert!(!l.init_satisfied());
        l.give(&[0x3000, 0x4000, 0x5000], &ram).unwrap();
        assert!(l.init_satisfied());
        assert_eq!(l.query(3), 1);
        l.give(&[0x6000, 0x7000], &ram).unwrap();
        assert_eq!(l.query(3), -1, "the device holds one page more than it needs");
        assert_eq!(l.take(10, 6).len(), 1);
        assert_eq!(l.take(10, 0).len(), 6);
        assert_eq!(l.owned(), 0);
    }
}
