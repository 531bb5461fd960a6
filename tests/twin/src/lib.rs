//! What every fuzz target's stable twin shares (CONTRIBUTING.md, "Fuzz targets"): a seeded generator, so a run
//! is repeatable and `TWIN_SEED` reproduces a failure, and the committed seed files under
//! `<crate>/fuzz/seeds/<target>/`, rewritten from the twin's own list when `LEASEBOX_WRITE_SEEDS=1`.
//! Each twin keeps its own input builders and checks; only these two pieces were the same everywhere.

use std::ops::AddAssign;
use std::panic::RefUnwindSafe;
use std::path::Path;

/// xorshift64* (Vigna): small, fast and good enough to drive a parser. Not for anything secret.
pub struct Rng(pub u64);

impl Rng {
    /// A generator from `TWIN_SEED` (decimal) when set, else `default`, XORed with `salt` so that several
    /// targets in one file draw different streams from one seed.
    pub fn from_env(default: u64, salt: u64) -> Rng {
        Rng(twin_seed(default) ^ salt)
    }
    /// The next 64 bits. Not `Iterator::next`: the stream never ends, and the twins call it as a draw.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform enough in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// True once in `one_in` draws on average.
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    pub fn u8(&mut self) -> u8 {
        self.next() as u8
    }
    pub fn u16(&mut self) -> u16 {
        self.next() as u16
    }
    pub fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        core::array::from_fn(|_| self.u8())
    }
    pub fn vec(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.u8()).collect()
    }
    pub fn pick<T: Copy>(&mut self, all: &[T]) -> T {
        all[self.below(all.len())]
    }
}

/// The run's seed: `TWIN_SEED` (decimal) when set, else `default`.
pub fn twin_seed(default: u64) -> u64 {
    std::env::var("TWIN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The seed files in `dir`, sorted by name, after writing `seeds` over them when `LEASEBOX_WRITE_SEEDS` is set.
/// Panics (the twin fails) when the folder cannot be read.
pub fn seed_files<N: AsRef<str>>(dir: &Path, seeds: &[(N, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    if std::env::var_os("LEASEBOX_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, bytes) in seeds {
            let path = dir.join(name.as_ref());
            std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

/// Runs `check` on every seed file in `dir` (after [`seed_files`]) and adds up what it counted; fails when the
/// folder holds fewer files than `seeds` or a seed's check panics, naming the seed.
pub fn check_seeds<N, C>(dir: &Path, seeds: &[(N, Vec<u8>)], check: impl Fn(&[u8]) -> C + RefUnwindSafe) -> C
where
    N: AsRef<str>,
    C: Default + AddAssign,
{
    let files = seed_files(dir, seeds);
    assert!(files.len() >= seeds.len(), "{} holds {} files, {} expected", dir.display(), files.len(), seeds.len());
    let mut total = C::default();
    for (name, bytes) in &files {
        match std::panic::catch_unwind(|| check(bytes)) {
            Ok(n) => total += n,
            Err(_) => panic!("seed {name} in {} failed the check", dir.display()),
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_xorshift64_star() {
        // The first outputs for seed 1 (shifts 12, 25, 27; multiplier 0x2545F4914F6CDD1D), computed apart from
        // this code: a change to the generator would silently change every twin's inputs.
        let mut r = Rng(1);
        assert_eq!(
            [r.next(), r.next(), r.next()],
            [0x47e4_ce4b_896c_dd1d, 0xabcf_a6a8_e079_651d, 0xb9d1_0d8f_eb73_1f57]
        );
    }

    #[test]
    fn seed_files_are_written_when_asked_and_read_sorted() {
        let dir = std::env::temp_dir().join(format!("leasebox-twin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b"), [2]).unwrap();
        std::fs::write(dir.join("a"), [1, 1]).unwrap();
        let got = seed_files::<&str>(&dir, &[]);
        assert_eq!(got, vec![("a".to_string(), vec![1, 1]), ("b".to_string(), vec![2])]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
