//! Byte sizes as people write them on command lines: one parser for `leasectl`, xtask, the device model and
//! the appliance's options, so `2M` means the same everywhere. `no_std`, no allocation, no dependencies.
//!
//! A size is a number, decimal (`4096`) or hex after `0x` (`0x1000`), then an optional binary unit:
//! `B` (bytes), `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (upper or lower case for the one-letter forms). In
//! hex, the digits run as far as hex digits do: `0x1B` is 27 bytes, `0x2M` is 2 MiB.
#![no_std]
#![forbid(unsafe_code)]

use core::fmt;
use core::ops::RangeInclusive;

/// Why a size was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing, or a unit without a number.
    NoNumber,
    /// A unit that is none of `B`, `K`, `M`, `G`, `T`, `KiB`, `MiB`, `GiB`, `TiB`.
    UnknownUnit,
    /// More than 2^64 − 1 bytes.
    Overflow,
    /// Outside the caller's range (inclusive, bytes).
    OutOfRange { min: u64, max: u64 },
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NoNumber => write!(f, "not a size (a number with an optional unit, e.g. 4096, 64K, 2MiB)"),
            SizeError::UnknownUnit => write!(f, "unknown unit (use B, K, M, G, T or KiB, MiB, GiB, TiB)"),
            SizeError::Overflow => write!(f, "too large (more than 2^64 - 1 bytes)"),
            SizeError::OutOfRange { min, max } if *max == u64::MAX => write!(f, "must be at least {min} bytes"),
            SizeError::OutOfRange { min, max } => write!(f, "must be from {min} to {max} bytes"),
        }
    }
}

/// The unit's power of two, if `unit` is one.
fn unit_shift(unit: &str) -> Option<u32> {
    Some(match unit {
        "" | "B" => 0,
        "K" | "k" | "KiB" => 10,
        "M" | "m" | "MiB" => 20,
        "G" | "g" | "GiB" => 30,
        "T" | "t" | "TiB" => 40,
        _ => return None,
    })
}

/// Parses a size in bytes (see the crate documentation for the grammar).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
    let (number, unit) = digits.split_at(end);
    if number.is_empty() {
        return Err(SizeError::NoNumber);
    }
    let shift = unit_shift(unit).ok_or(SizeError::UnknownUnit)?;
    let n = u64::from_str_radix(number, radix).map_err(|_| SizeError::Overflow)?;
    n.checked_mul(1 << shift).ok_or(SizeError::Overflow)
}

/// Parses a size and checks it lies in `range` (bytes).
pub fn parse_size_in(s: &str, range: RangeInclusive<u64>) -> Result<u64, SizeError> {
    let n = parse_size(s)?;
    if range.contains(&n) { Ok(n) } else { Err(SizeError::OutOfRange { min: *range.start(), max: *range.end() }) }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn numbers_and_units() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("4096B", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64KiB", 64 << 10),
            ("2M", 2 << 20),
            ("2m", 2 << 20),
            ("2MiB", 2 << 20),
            ("1G", 1 << 30),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("3T", 3 << 40),
            ("3TiB", 3 << 40),
            ("0x1000", 0x1000),
            ("0X2000000", 0x200_0000),
            ("0x2M", 2 << 20),
            ("0x1B", 27),
            ("0xffKiB", 255 << 10),
            ("007", 7),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        for text in ["", "K", "MiB", "0x", "0xK", "-1", "+1", " 1", "x1"] {
            assert_eq!(parse_size(text), Err(SizeError::NoNumber), "{text}");
        }
        for text in ["3X", "1 K", "1KB", "1kib", "1Ki", "2MB", "1.5M", "1M1", "0x1Z"] {
            assert_eq!(parse_size(text), Err(SizeError::UnknownUnit), "{text}");
        }
        assert!(parse_size("3X").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_size("").unwrap_err().to_string().contains("e.g. 4096"));
    }

    #[test]
    fn overflow_is_refused() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("18446744073709551616"), Err(SizeError::Overflow));
        assert_eq!(parse_size("0xffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(parse_size("0x10000000000000000"), Err(SizeError::Overflow));
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 << 40));
        assert_eq!(parse_size("16777216T"), Err(SizeError::Overflow));
        assert_eq!(parse_size("99999999999T"), Err(SizeError::Overflow));
        assert!(parse_size("99999999999T").unwrap_err().to_string().contains("too large"));
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_size_in("1", 1..=u64::MAX), Ok(1));
        assert_eq!(parse_size_in("0", 1..=u64::MAX), Err(SizeError::OutOfRange { min: 1, max: u64::MAX }));
        assert_eq!(parse_size_in("0", 1..=u64::MAX).unwrap_err().to_string(), "must be at least 1 bytes");
        assert_eq!(parse_size_in("16M", 1..=16 << 20), Ok(16 << 20));
        let e = parse_size_in("17M", 1..=16 << 20).unwrap_err();
        assert_eq!(e.to_string(), "must be from 1 to 16777216 bytes");
        // A malformed size is reported as such, not as out of range.
        assert_eq!(parse_size_in("2Q", 1..=10), Err(SizeError::UnknownUnit));
    }
}
