//! What makes a configured key acceptable: one rule for every reader of keys — the appliance's key ring (hosted
//! and image), the client library (and the C and Python bindings through it) and leasectl — so that a key one
//! side refuses the other refuses too, with the same words (docs/security.md, "Keys").
//!
//! The PSK is one HMAC of the key ([`crate::v2::psk_from_key`]) and a captured message 1 can be replayed to
//! test guesses offline, so a key is only as strong as it is unpredictable. The length floor ([`MIN_KEY`]
//! bytes = 128 bits) assumes random bytes; [`weak_key`] catches the keys people type, not every weak one.

/// Shortest and longest accepted keys (HMAC-SHA256 keys; 16 bytes is the floor for a secret).
pub const MIN_KEY: usize = 16;
pub const MAX_KEY: usize = 64;

/// Distinct byte values a key must have: 16 random bytes have fewer than 5 with a probability below 2^-60.
pub const MIN_DISTINCT_BYTES: usize = 5;

/// How to make a key, said with every refusal.
pub const KEY_ADVICE: &str = "keys must be random (e.g. `head -c 32 /dev/urandom | xxd -p -c 64`)";

/// Why a key is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyProblem {
    /// Shorter than [`MIN_KEY`] or longer than [`MAX_KEY`] bytes.
    Length { len: usize },
    /// Long enough but plainly not random ([`weak_key`]'s reason).
    Weak(&'static str),
}

impl core::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyProblem::Length { len } => write!(f, "key is {len} bytes; keys are {MIN_KEY} to {MAX_KEY} bytes"),
            KeyProblem::Weak(why) => write!(f, "the key {why}: {KEY_ADVICE}"),
        }
    }
}

/// Why `key` is plainly not random, if it is: one byte repeated, a pattern of up to 4 bytes repeated, or fewer
/// than [`MIN_DISTINCT_BYTES`] distinct byte values.
pub fn weak_key(key: &[u8]) -> Option<&'static str> {
    if key.windows(2).all(|w| w[0] == w[1]) {
        return Some("is one byte repeated");
    }
    if (2..=4).any(|p| key.len() > p && key.iter().enumerate().all(|(i, b)| *b == key[i % p])) {
        return Some("is a short pattern repeated");
    }
    let mut seen = [false; 256];
    key.iter().for_each(|b| seen[usize::from(*b)] = true);
    if seen.iter().filter(|s| **s).count() < MIN_DISTINCT_BYTES {
        return Some("has fewer than 5 distinct byte values");
    }
    None
}

/// The whole rule: the length, then [`weak_key`].
pub fn check_key(key: &[u8]) -> Result<(), KeyProblem> {
    if !(MIN_KEY..=MAX_KEY).contains(&key.len()) {
        return Err(KeyProblem::Length { len: key.len() });
    }
    match weak_key(key) {
        Some(why) => Err(KeyProblem::Weak(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn typed_keys_are_refused_random_ones_pass() {
        let random = [0x3a, 0x91, 0x07, 0xee, 0x5c, 0x21, 0xb4, 0x68, 0xf0, 0x1d, 0x77, 0xc2, 0x09, 0x8e, 0x43, 0xd5];
        assert_eq!(check_key(&random), Ok(()));
        assert_eq!(check_key(&[0x41; 16]), Err(KeyProblem::Weak("is one byte repeated")));
        assert_eq!(
            check_key(&[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]),
            Err(KeyProblem::Weak("is a short pattern repeated"))
        );
        assert_eq!(
            check_key(&[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]),
            Err(KeyProblem::Weak("is a short pattern repeated"))
        );
        // Four distinct values in no period of up to 4.
        let four = [1, 2, 3, 4, 4, 3, 2, 1, 1, 1, 2, 2, 3, 3, 4, 4];
        assert_eq!(check_key(&four), Err(KeyProblem::Weak("has fewer than 5 distinct byte values")));
        // A period of 5 with 5 values passes the rule: it catches typed keys, not every weak one.
        assert_eq!(check_key(&[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1]), Ok(()));
        assert_eq!(check_key(&random[..15]), Err(KeyProblem::Length { len: 15 }));
        assert_eq!(check_key(&[random; 5].concat()[..65]), Err(KeyProblem::Length { len: 65 }));
        assert_eq!(check_key(&[random; 4].concat()), Ok(()));
        let msg = KeyProblem::Weak("is one byte repeated").to_string();
        assert!(msg.starts_with("the key is one byte repeated: keys must be random"), "{msg}");
        assert_eq!(KeyProblem::Length { len: 4 }.to_string(), "key is 4 bytes; keys are 16 to 64 bytes");
    }
}
