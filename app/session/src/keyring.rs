//! Principals and their keys: tenants (`tenant=NAME:HEXKEY`) and the admin (`admin=HEXKEY`). No key is built
//! into any image; they all come from the configuration.

use alloc::string::String;
use alloc::vec::Vec;
use leasebox_proto::{MAX_NAME, Role};

/// Shortest and longest accepted keys (HMAC-SHA256 keys; 16 bytes is the floor for a secret).
pub const MIN_KEY: usize = 16;
pub const MAX_KEY: usize = 64;
/// The principal name that authenticates with the admin key.
pub const ADMIN_NAME: &str = "admin";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    BadHex,
    KeyLength { len: usize },
    BadName,
    Duplicate,
    ReservedName,
}

impl core::fmt::Display for KeyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyError::BadHex => write!(f, "key is not an even number of hex digits"),
            KeyError::KeyLength { len } => write!(f, "key is {len} bytes; keys are {MIN_KEY} to {MAX_KEY} bytes"),
            KeyError::BadName => write!(f, "tenant names are 1 to {MAX_NAME} characters of A-Z a-z 0-9 _ . -"),
            KeyError::Duplicate => write!(f, "principal configured twice"),
            KeyError::ReservedName => write!(f, "'admin' is reserved for the admin key (admin=HEXKEY)"),
        }
    }
}

/// Decodes hex (either case) into bytes.
pub fn parse_hex(s: &str) -> Result<Vec<u8>, KeyError> {
    if !s.len().is_multiple_of(2) {
        return Err(KeyError::BadHex);
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or(KeyError::BadHex)
}

pub(crate) struct Entry {
    pub name: String,
    pub key: Vec<u8>,
    pub role: Role,
}

/// The configured principals.
#[derive(Default)]
pub struct Keyring {
    entries: Vec<Entry>,
}

fn valid_name(n: &str) -> bool {
    (1..=MAX_NAME).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Compares two names over `MAX_NAME` bytes (the shorter zero-padded; names are never longer) and their
/// lengths, without an early exit.
fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..MAX_NAME.max(a.len()).max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

impl Keyring {
    pub fn new() -> Self {
        Self::default()
    }

    fn add(&mut self, name: &str, key_hex: &str, role: Role) -> Result<(), KeyError> {
        let key = parse_hex(key_hex)?;
        if !(MIN_KEY..=MAX_KEY).contains(&key.len()) {
            return Err(KeyError::KeyLength { len: key.len() });
        }
        if self.entries.iter().any(|e| e.name == name) {
            return Err(KeyError::Duplicate);
        }
        self.entries.push(Entry { name: String::from(name), key, role });
        Ok(())
    }

    /// Adds a tenant.
    pub fn add_tenant(&mut self, name: &str, key_hex: &str) -> Result<(), KeyError> {
        if name == ADMIN_NAME {
            return Err(KeyError::ReservedName);
        }
        if !valid_name(name) {
            return Err(KeyError::BadName);
        }
        self.add(name, key_hex, Role::Tenant)
    }

    /// Sets the admin key (principal name `admin`).
    pub fn set_admin(&mut self, key_hex: &str) -> Result<(), KeyError> {
        self.add(ADMIN_NAME, key_hex, Role::Admin)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal named `name`. Every entry is compared, each over the same `MAX_NAME` bytes, so the time
    /// taken does not depend on where (or whether) the name is found.
    pub(crate) fn find(&self, name: &str) -> Option<usize> {
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate() {
            if same_name(&e.name, name) {
                found = Some(i);
            }
        }
        found
    }
    pub(crate) fn get(&self, i: usize) -> &Entry {
        &self.entries[i]
    }
}
