//! Big-endian field readers and writers with bounds checks.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// Why a payload could not be decoded. Maps to `ErrorCode::Malformed` (or `BadParam` for `Invalid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ended inside `field`.
    Truncated { field: &'static str },
    /// Bytes were left after the last field.
    TrailingBytes { count: usize },
    /// `field` holds a value the protocol does not allow.
    Invalid { field: &'static str },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { field } => write!(f, "payload ends inside field '{field}'"),
            DecodeError::TrailingBytes { count } => write!(f, "{count} unexpected bytes after the last field"),
            DecodeError::Invalid { field } => write!(f, "field '{field}' has a value the protocol does not allow"),
        }
    }
}

/// Reads fields from a payload, front to back.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated { field });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, field)?);
        Ok(a)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }
    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// Reserved bytes must be zero (so they can carry meaning in a later version).
    pub fn reserved(&mut self, n: usize) -> Result<(), DecodeError> {
        if self.bytes(n, "reserved")?.iter().any(|b| *b != 0) {
            return Err(DecodeError::Invalid { field: "reserved" });
        }
        Ok(())
    }

    /// A UTF-8 string of `len` bytes.
    pub fn str(&mut self, len: usize, field: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(len, field)?;
        core::str::from_utf8(b).map(String::from).map_err(|_| DecodeError::Invalid { field })
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The payload must be fully consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { count }),
        }
    }
}

/// Appends fields to a payload.
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Writer { out }
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.out.resize(self.out.len() + n, 0);
        self
    }
}
