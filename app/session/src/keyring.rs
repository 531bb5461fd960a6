//! Principals and their keys: tenants (`tenant=NAME:KEYS`) and the admin (`admin=KEYS`). No key is built
//! into any image; they all come from the configuration.
//!
//! `KEYS` is one key or several separated by commas, each `HEX` or `ID/HEX`: a key without an explicit id has
//! its position in the list as id (so a lone `HEX` is key id 0, the syntax before key ids). A principal has
//! two valid keys while rotating (`tenant=demo:0/OLDHEX,1/NEWHEX`); the client names the key id in HELLO
//! (docs/operations.md, "Rotating a key").

use alloc::string::String;
use alloc::vec::Vec;
use leasebox_proto::key::{KeyProblem, check_key};
use leasebox_proto::{MAX_NAME, Role};

/// The key rule is the protocol crate's, shared with every client ([`leasebox_proto::key`]).
pub use leasebox_proto::key::weak_key;
/// The principal name that authenticates with the admin key.
pub const ADMIN_NAME: &str = "admin";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    BadHex,
    KeyLength {
        len: usize,
    },
    BadName,
    Duplicate,
    ReservedName,
    BadKeyId,
    /// The key is long enough but plainly not random (docs/security.md, "Keys").
    WeakKey(&'static str),
}

impl core::fmt::Display for KeyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyError::BadHex => write!(f, "key is not an even number of hex digits"),
            KeyError::KeyLength { len } => core::fmt::Display::fmt(&KeyProblem::Length { len: *len }, f),
            KeyError::BadName => write!(f, "tenant names are 1 to {MAX_NAME} characters of A-Z a-z 0-9 _ . -"),
            KeyError::Duplicate => write!(f, "principal configured twice"),
            KeyError::ReservedName => write!(f, "'admin' is reserved for the admin key (admin=HEXKEY)"),
            KeyError::BadKeyId => write!(f, "key ids are 0 to 255, each at most once per principal (ID/HEX)"),
            KeyError::WeakKey(why) => core::fmt::Display::fmt(&KeyProblem::Weak(why), f),
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
    pub key_id: u8,
    /// The v2 Noise PSK derived from the key ([`leasebox_proto::v2::psk_from_key`]).
    pub psk: [u8; 32],
    pub role: Role,
}

/// The configured principals.
#[derive(Default)]
pub struct Keyring {
    entries: Vec<Entry>,
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

    fn add(&mut self, name: &str, keys: &str, role: Role) -> Result<(), KeyError> {
        if self.entries.iter().any(|e| e.name == name) {
            return Err(KeyError::Duplicate);
        }
        let mut added = Vec::new();
        for item in crate::options::key_list(keys) {
            let (key_id, hex) = item.map_err(|_| KeyError::BadKeyId)?;
            let key = parse_hex(hex)?;
            match check_key(&key) {
                Ok(()) => {}
                Err(KeyProblem::Length { len }) => return Err(KeyError::KeyLength { len }),
                Err(KeyProblem::Weak(why)) => return Err(KeyError::WeakKey(why)),
            }
            if added.iter().any(|e: &Entry| e.key_id == key_id) {
                return Err(KeyError::BadKeyId);
            }
            let psk = leasebox_proto::v2::psk_from_key(&key);
            added.push(Entry { name: String::from(name), key_id, psk, role });
        }
        self.entries.extend(added);
        Ok(())
    }

    /// Adds a tenant.
    pub fn add_tenant(&mut self, name: &str, key_hex: &str) -> Result<(), KeyError> {
        if name == ADMIN_NAME {
            return Err(KeyError::ReservedName);
        }
        if !crate::options::valid_tenant_name(name) {
            return Err(KeyError::BadName);
        }
        self.add(name, key_hex, Role::Tenant)
    }

    /// Sets the admin key (principal name `admin`).
    pub fn set_admin(&mut self, key_hex: &str) -> Result<(), KeyError> {
        self.add(ADMIN_NAME, key_hex, Role::Admin)
    }

    /// Principals configured, the admin included (each once, whatever its key ids).
    pub fn principals(&self) -> usize {
        let mut names: Vec<&str> = self.entries.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// Tenants configured (each once, whatever its key ids).
    pub fn tenants(&self) -> usize {
        let mut names: Vec<&str> =
            self.entries.iter().filter(|e| e.role == Role::Tenant).map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// Keys configured (a principal with two key ids counts twice).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key `key_id` of the principal named `name`. Every entry is compared, each over the same `MAX_NAME`
    /// bytes, so the time taken does not depend on where (or whether) the name is found.
    pub(crate) fn find(&self, name: &str, key_id: u8) -> Option<usize> {
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate() {
            if same_name(&e.name, name) & (e.key_id == key_id) {
                found = Some(i);
            }
        }
        found
    }
    pub(crate) fn get(&self, i: usize) -> &Entry {
        &self.entries[i]
    }
}
