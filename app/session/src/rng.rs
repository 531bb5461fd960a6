//! Unpredictable identifiers: a ChaCha20 CSPRNG (`rand_chacha`) seeded from the same [`Entropy`] source as the
//! HELLO nonces (the CPU's RDSEED/RDRAND in the appliance, the OS in hosted mode). The lease service draws its
//! initial PSNs and MKEY variants from it, so earlier identifiers tell nothing about later ones
//! (docs/security.md, "Identifiers"). There is no fallback seed: without entropy there is no generator, and the
//! service that needs one does not start.

use crate::server::{Entropy, EntropyError};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// A CSPRNG for identifiers a client must not be able to predict.
pub struct IdRng(ChaCha20Rng);

impl IdRng {
    /// Seeds a generator with 32 bytes from `entropy`; fails (never a predictable fallback) when it fails.
    pub fn from_entropy<E: Entropy + ?Sized>(entropy: &mut E) -> Result<Self, EntropyError> {
        let mut seed = [0u8; 32];
        entropy.fill(&mut seed)?;
        Ok(IdRng(ChaCha20Rng::from_seed(seed)))
    }

    /// A generator from an explicit seed: for tests and benchmarks, which want reproducible runs. Nothing that
    /// ships calls it.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        IdRng(ChaCha20Rng::from_seed(seed))
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    pub fn next_u8(&mut self) -> u8 {
        self.0.next_u32() as u8
    }
}

impl core::fmt::Debug for IdRng {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The state is the secret: never print it.
        f.write_str("IdRng(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Broken;
    impl Entropy for Broken {
        fn fill(&mut self, _: &mut [u8]) -> Result<(), EntropyError> {
            Err(EntropyError)
        }
    }

    struct Fixed(u8);
    impl Entropy for Fixed {
        fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
            buf.fill(self.0);
            Ok(())
        }
    }

    #[test]
    fn no_entropy_no_generator() {
        assert_eq!(IdRng::from_entropy(&mut Broken).err(), Some(EntropyError));
    }

    #[test]
    fn the_seed_comes_from_the_entropy_source() {
        let a: alloc::vec::Vec<u32> = {
            let mut r = IdRng::from_entropy(&mut Fixed(7)).unwrap();
            (0..4).map(|_| r.next_u32()).collect()
        };
        let mut same = IdRng::from_seed([7; 32]);
        let mut other = IdRng::from_entropy(&mut Fixed(8)).unwrap();
        assert_eq!(a, (0..4).map(|_| same.next_u32()).collect::<alloc::vec::Vec<_>>());
        assert_ne!(a, (0..4).map(|_| other.next_u32()).collect::<alloc::vec::Vec<_>>());
        assert_eq!(alloc::format!("{:?}", IdRng::from_seed([1; 32])), "IdRng(..)");
    }
}
