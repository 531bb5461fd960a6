//! The identifiers a lease hands its client that must not be guessable: the server's initial PSN and the MKEY
//! variant (`mkc.mkey_7_0`, the low byte of the rkey). Both come from the session core's CSPRNG
//! ([`IdRng`], seeded from RDSEED/RDRAND or the OS), so earlier leases tell nothing about later ones
//! (docs/security.md, "Identifiers").
//!
//! The HCA picks the MKEY index (`create_mkey_out.mkey_index`) only when it answers CREATE_MKEY, after the
//! variant is chosen, so a re-used index could come back with the variant it had before, and a stale rkey
//! would name the new key. Two rules keep that from being granted: the variant is drawn outside the variants
//! of the lowest retired indices (the ones an HCA that hands out its lowest free index re-uses first), and
//! when CREATE_MKEY still answers an index with its previous variant, the ALLOC fails and unwinds
//! ([`Ids::created`]).

use ::alloc::collections::BTreeMap;
use leasebox_session::IdRng;

/// How many retired indices' variants a new variant avoids (at most 128 of the 256 values, so at least
/// half stay possible).
const AVOID: usize = 128;
/// How many retired indices are remembered; beyond this the highest are forgotten (an HCA that re-uses its
/// lowest free index comes back to the low ones first).
const RETIRED_MAX: usize = 4096;

pub(crate) struct Ids {
    rng: IdRng,
    /// MKEY index → the variant its last key had, for indices the service destroyed and has not seen again.
    retired: BTreeMap<u32, u8>,
}

impl Ids {
    pub(crate) fn new(rng: IdRng) -> Ids {
        Ids { rng, retired: BTreeMap::new() }
    }

    /// A 24-bit initial PSN, uniform over 0..=0xffffff. The QP's PSNs then count from it modulo 2^24 on the HCA
    /// (and in the client's requester), so a PSN near the top simply wraps to 0 (`tests/limits.rs`).
    pub(crate) fn psn(&mut self) -> u32 {
        self.rng.next_u32() & 0x00ff_ffff
    }

    /// The variant for the next CREATE_MKEY: uniform over the values no low retired index last had.
    pub(crate) fn variant(&mut self) -> u8 {
        let mut avoid = [false; 256];
        for v in self.retired.values().take(AVOID) {
            avoid[usize::from(*v)] = true;
        }
        // At least 128 values are allowed, so each draw succeeds with probability ≥ 1/2; after 64 misses
        // (probability ≤ 2^-64) the last draw is taken and [`Ids::created`] still refuses a collision.
        let mut v = self.rng.next_u8();
        for _ in 0..64 {
            if !avoid[usize::from(v)] {
                break;
            }
            v = self.rng.next_u8();
        }
        v
    }

    /// The variant a UMR grant gives a warm key whose variant is `old`: uniform over the other 255 values, so
    /// the rkey a revoked lease's client holds never names the key again at its next grant.
    pub(crate) fn regrant(&mut self, old: u8) -> u8 {
        // Each draw misses with probability 1/256; after 64 misses (≤ 2^-512) `old + 1` is taken.
        for _ in 0..64 {
            let v = self.rng.next_u8();
            if v != old {
                return v;
            }
        }
        old.wrapping_add(1)
    }

    /// CREATE_MKEY answered `index` for a key made with `variant`: `false` when that is the variant the
    /// index's previous key had (the new key would equal the stale one, so it must not be granted).
    pub(crate) fn created(&mut self, index: u32, variant: u8) -> bool {
        self.retired.remove(&index) != Some(variant)
    }

    /// The variant `index` is retired with, if it is.
    #[cfg(test)]
    pub(crate) fn retired_variant(&self, index: u32) -> Option<u8> {
        self.retired.get(&index).copied()
    }

    /// DESTROY_MKEY was issued for `index`, whose key had `variant` (from then on the HCA may re-use the index,
    /// possibly before the service reads the destroy's completion).
    pub(crate) fn destroyed(&mut self, index: u32, variant: u8) {
        self.retired.insert(index, variant);
        if self.retired.len() > RETIRED_MAX {
            self.retired.pop_last();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_variant_avoids_the_low_retired_indices() {
        let mut ids = Ids::new(IdRng::from_seed([3; 32]));
        // 128 retired indices hold the variants 0..128: every new variant is 128..=255.
        for i in 0..128u32 {
            ids.destroyed(i + 1, i as u8);
        }
        for _ in 0..1000 {
            assert!(ids.variant() >= 128);
        }
        // A re-used index with its previous variant is refused, with another variant accepted (once).
        assert!(!ids.created(5, 4));
        assert!(ids.created(5, 4), "index 5 is no longer retired");
        assert!(ids.created(6, 200));
    }

    #[test]
    fn the_retired_map_is_bounded() {
        let mut ids = Ids::new(IdRng::from_seed([4; 32]));
        for i in 0..(RETIRED_MAX as u32 + 10) {
            ids.destroyed(i, 1);
        }
        assert_eq!(ids.retired.len(), RETIRED_MAX);
        assert!(ids.retired.contains_key(&0), "the lowest indices are kept");
    }
}
