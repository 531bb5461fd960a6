//! Option words: `key=value` from a kernel command line, a configuration file or a process's arguments, and the
//! parsers of the layers that own the keys. The kernel parses its own keys (`log=`, `cores=`, the control
//! channel's interface) and offers every other word to the parsers the layers above registered, in order: the
//! session core's (principals, keys, budgets), the lease service's. The hosted appliance, which has no kernel,
//! offers its words to the same parsers through the same [`Registry`], so a word means the same thing and a bad
//! one gets the same error in both.
//!
//! Nothing here allocates: the image parses its options before its heap exists. Values are borrowed from the
//! text for its lifetime (`'a`: the boot information's, in the image).
//!
//! Some values are secrets (keys): [`SECRET_KEYS`] names them, whoever parses them, so neither an error
//! ([`ConfigError`]) nor a printed line ([`Redacted`]) ever shows one, even when no registered parser knows the
//! key.
#![no_std]
#![forbid(unsafe_code)]

use core::fmt;
use spin::Mutex;

/// Parses the options of one layer. Called once per word, in order, then [`OptionParser::check`] once.
pub trait OptionParser<'a>: Sync + fmt::Debug {
    /// Applies one `key=value`: `Ok(false)` when `key` is not this parser's, `Err(reason)` for a bad value.
    fn apply(&self, key: &str, value: &'a str) -> Result<bool, &'static str>;
    /// Checks between this layer's options, once every word is applied (default: none).
    fn check(&self) -> Result<(), ConfigError<'a>> {
        Ok(())
    }
}

/// How a layer applies one key to its options value (e.g. `LeaseOptions::apply`).
pub type ApplyFn<'a, T> = fn(&mut T, &str, &'a str) -> Result<bool, &'static str>;
/// How a layer checks its options value once every word is applied.
pub type CheckFn<'a, T> = fn(&T) -> Result<(), ConfigError<'a>>;

/// An [`OptionParser`] over a value of the layer's own type: the value behind a lock, and the functions that
/// apply one key to it and check it. A `static` in the image, a local in the hosted appliance; no allocation.
pub struct Options<'a, T> {
    value: Mutex<T>,
    apply: ApplyFn<'a, T>,
    check: CheckFn<'a, T>,
}

fn no_check<'a, T>(_: &T) -> Result<(), ConfigError<'a>> {
    Ok(())
}

impl<'a, T: Copy> Options<'a, T> {
    /// The defaults and the layer's own parser (e.g. `LeaseOptions::apply`); nothing to check between keys.
    pub const fn new(defaults: T, apply: ApplyFn<'a, T>) -> Self {
        Options { value: Mutex::new(defaults), apply, check: no_check::<T> }
    }

    /// The same, with a check between the layer's options (e.g. `SessionOptions::check`).
    pub const fn checked(defaults: T, apply: ApplyFn<'a, T>, check: CheckFn<'a, T>) -> Self {
        Options { value: Mutex::new(defaults), apply, check }
    }

    /// The options as parsed so far (the final value once the configuration is applied).
    pub fn get(&self) -> T {
        *self.value.lock()
    }
}

impl<'a, T: Copy + Send + fmt::Debug> OptionParser<'a> for Options<'a, T> {
    fn apply(&self, key: &str, value: &'a str) -> Result<bool, &'static str> {
        (self.apply)(&mut self.value.lock(), key, value)
    }
    fn check(&self) -> Result<(), ConfigError<'a>> {
        (self.check)(&self.value.lock())
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for Options<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Options").field(&self.get()).finish()
    }
}

/// Option keys whose values are secrets (the session core's keys: `tenant=NAME:KEYS`, `admin=KEYS`): their
/// values never show in an error or a printed line, whoever parses them — or when nobody does. The session core,
/// which parses them, asserts at compile time that each of its secret keys is here.
pub const SECRET_KEYS: [&str; 2] = ["tenant", "admin"];
const REDACTED: &str = "***";

/// Whether `key`'s value is a secret ([`SECRET_KEYS`]); usable in constants, for the owners' assertions.
pub const fn is_secret(key: &str) -> bool {
    let mut i = 0;
    while i < SECRET_KEYS.len() {
        if same(SECRET_KEYS[i].as_bytes(), key.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A bad option: its key, its value (shown as `***` for a secret) and why.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConfigError<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub reason: &'static str,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(self.key) { REDACTED } else { self.value };
        write!(f, "bad option {}={}: {}", self.key, value, self.reason)
    }
}

impl fmt::Debug for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if is_secret(self.key) { REDACTED } else { self.value };
        f.debug_struct("ConfigError")
            .field("key", &self.key)
            .field("value", &value)
            .field("reason", &self.reason)
            .finish()
    }
}

/// A command line (or configuration text) for the log: its words, single-spaced, with the values of the
/// [`SECRET_KEYS`] replaced by `***`.
#[derive(Clone, Copy, Debug)]
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.0.split_ascii_whitespace().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            match word.split_once('=') {
                Some((key, _)) if is_secret(key) => write!(f, "{key}={REDACTED}")?,
                _ => f.write_str(word)?,
            }
        }
        Ok(())
    }
}

/// The words of configuration text: whitespace-separated, `#` to the end of a line is a comment.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    text.lines().flat_map(|line| line.split('#').next().unwrap_or("").split_ascii_whitespace())
}

/// A word's key and value (`key` alone: an empty value).
pub fn split(word: &str) -> (&str, &str) {
    word.split_once('=').unwrap_or((word, ""))
}

/// A plain decimal number (digits only, no sign, no leading `+`), or `None` on overflow or anything else: the
/// one number syntax of option values.
pub fn decimal(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Unknown words kept for the warnings; more are counted.
pub const MAX_WARNINGS: usize = 8;

/// The registered parsers, and the words none of them claimed. Later words override earlier ones (each parser
/// keeps the last value of a key); an unknown word is kept as a warning rather than an error, so a host stays
/// bootable when its loader adds words of its own.
#[derive(Clone, Copy, Debug)]
pub struct Registry<'p, 'a> {
    parsers: &'p [&'p dyn OptionParser<'a>],
    unknown: [&'a str; MAX_WARNINGS],
    unknown_len: usize,
    unknown_dropped: usize,
}

impl<'p, 'a> Registry<'p, 'a> {
    /// The layers' parsers, asked in this order (`'p`: how long they are borrowed; `'a`: the text's lifetime).
    pub const fn new(parsers: &'p [&'p dyn OptionParser<'a>]) -> Self {
        Registry { parsers, unknown: [""; MAX_WARNINGS], unknown_len: 0, unknown_dropped: 0 }
    }

    /// Offers one word to the parsers in order; a word none claims is kept as unknown.
    pub fn apply_word(&mut self, word: &'a str) -> Result<(), ConfigError<'a>> {
        let (key, value) = split(word);
        for p in self.parsers {
            if p.apply(key, value).map_err(|reason| ConfigError { key, value, reason })? {
                return Ok(());
            }
        }
        if self.unknown_len < MAX_WARNINGS {
            self.unknown[self.unknown_len] = word;
            self.unknown_len += 1;
        } else {
            self.unknown_dropped += 1;
        }
        Ok(())
    }

    /// Every word of `text` ([`words`]), in order.
    pub fn apply(&mut self, text: &'a str) -> Result<(), ConfigError<'a>> {
        words(text).try_for_each(|w| self.apply_word(w))
    }

    /// Each parser's check, in order, once every word is applied: the first error.
    pub fn check(&self) -> Result<(), ConfigError<'a>> {
        self.parsers.iter().try_for_each(|p| p.check())
    }

    /// Words that were not understood (to be printed as warnings), and how many more were dropped.
    pub fn unknown(&self) -> (&[&'a str], usize) {
        (&self.unknown[..self.unknown_len], self.unknown_dropped)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct Pool {
        mib: u32,
        min: u32,
    }

    fn pool(p: &mut Pool, key: &str, value: &str) -> Result<bool, &'static str> {
        let field = match key {
            "pool_mib" => &mut p.mib,
            "pool_min" => &mut p.min,
            _ => return Ok(false),
        };
        *field = value.parse().map_err(|_| "expected a number")?;
        Ok(true)
    }

    fn pool_check<'a>(p: &Pool) -> Result<(), ConfigError<'a>> {
        if p.min > p.mib {
            return Err(ConfigError { key: "pool_min", value: "", reason: "must be at most pool_mib=" });
        }
        Ok(())
    }

    #[test]
    fn parsers_get_the_words_in_order_and_the_rest_are_unknown() {
        let opts = Options::checked(Pool { mib: 64, min: 0 }, pool, pool_check);
        let parsers: [&dyn OptionParser; 1] = [&opts];
        let mut r = Registry::new(&parsers);
        r.apply("# conf\npool_mib=128 colour=blue # a comment pool_mib=1\n").unwrap();
        r.apply("pool_mib=256 bare").unwrap();
        assert_eq!(opts.get(), Pool { mib: 256, min: 0 }, "later words override; comments are skipped");
        assert_eq!(r.unknown(), (&["colour=blue", "bare"][..], 0));
        let e = r.apply_word("pool_mib=lots").unwrap_err();
        assert_eq!((e.key, e.value, e.reason), ("pool_mib", "lots", "expected a number"));
        assert_eq!(format!("{e}"), "bad option pool_mib=lots: expected a number");
        assert_eq!(r.check(), Ok(()));
        r.apply_word("pool_min=300").unwrap();
        assert_eq!(r.check().unwrap_err().reason, "must be at most pool_mib=");
    }

    #[test]
    fn decimals() {
        assert_eq!((decimal("0"), decimal("4294967295"), decimal("007")), (Some(0), Some(u32::MAX), Some(7)));
        for bad in ["", "+1", "-1", "1e3", "4294967296", "99999999999", " 1"] {
            assert_eq!(decimal(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_words_are_bounded() {
        let mut r = Registry::new(&[]);
        r.apply("a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10").unwrap();
        assert_eq!(r.unknown().0.len(), MAX_WARNINGS);
        assert_eq!(r.unknown().1, 2);
    }

    #[test]
    fn secrets_never_show() {
        const { assert!(is_secret("tenant") && is_secret("admin") && !is_secret("tenants") && !is_secret("")) };
        let e = ConfigError { key: "admin", value: "00112233", reason: "too short" };
        assert_eq!(format!("{e}"), "bad option admin=***: too short");
        assert!(!format!("{e:?}").contains("0011"));
        let line = "/boot/leasebox.elf  log=debug tenant=alice:0011\tadmin=0011 admin tenant= x=tenant=1";
        assert_eq!(
            format!("{}", Redacted(line)),
            "/boot/leasebox.elf log=debug tenant=*** admin=*** admin tenant=*** x=tenant=1"
        );
        assert_eq!(format!("{}", Redacted("  cores=net  ")), "cores=net");
    }
}
