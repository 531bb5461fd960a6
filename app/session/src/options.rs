//! The session core's options (docs/operations.md), parsed wherever the session core runs — the image registers
//! this parser with the kernel's option words, the hosted appliance with its arguments' — so both accept the same
//! words and refuse bad ones with the same errors:
//!
//! - principals: `tenant=NAME:KEYS` (repeatable) and `admin=KEYS`, KEYS being `HEXKEY` or a comma-separated list
//!   of `HEXKEY` / `ID/HEXKEY` for key rotation (the key grammar: [`check_key_hex`]);
//! - budgets: `sessions=`, `credits=`, `heartbeat_ms=`, `sessions_per_tenant=`, `admin_sessions=`,
//!   `preauth_sessions=`, `heap_high_water=`; without `sessions=` the host sizes the session budget from its
//!   memory ([`SessionOptions::sessions_or`]; docs/operations.md, "Scale");
//! - `appliance=NAME`, the name bound into every handshake.
//!
//! Everything is checked when parsed, so a bad value stops the boot (or the process) with a message instead of
//! surfacing later in the session core. Nothing allocates (the image parses before its heap exists): keys are
//! secrets kept as the hex text of the configuration (no copy), decoded by the [`crate::Keyring`]; neither
//! `Debug` nor errors show them (`tenant` and `admin` are among `leasebox_options::SECRET_KEYS`, asserted below).

use crate::keyring::ADMIN_NAME;
use core::fmt;
use core::ops::RangeInclusive;
use leasebox_options::{ConfigError, decimal};
use leasebox_proto::MAX_NAME;
use leasebox_proto::key::{MAX_KEY, MIN_KEY};

/// The keys whose values are secrets: the option machinery redacts them in every error and printed line.
pub const SECRET_OPTIONS: [&str; 2] = ["tenant", "admin"];
const _: () = {
    let mut i = 0;
    while i < SECRET_OPTIONS.len() {
        assert!(leasebox_options::is_secret(SECRET_OPTIONS[i]), "a secret option the option machinery would show");
        i += 1;
    }
};

/// Budget: tenants the configuration may name.
pub const MAX_TENANTS: usize = 16;
/// Concurrent sessions (`sessions=`): up to a cluster's worth of clients on one memory node.
pub const SESSIONS: RangeInclusive<u32> = 1..=MAX_SESSIONS;
pub const MAX_SESSIONS: u32 = 4096;
/// The session budget when `sessions=` is absent and the host gives no figure of its own (the host normally
/// sizes it from its memory: [`SessionOptions::sessions_or`]).
pub const DEFAULT_SESSIONS: u32 = 16;
/// Outstanding requests granted per session (`credits=`).
pub const CREDITS: RangeInclusive<u32> = 1..=64;
pub const DEFAULT_CREDITS: u32 = 8;
/// Session silence timeout in ms (`heartbeat_ms=`).
pub const HEARTBEAT_MS: RangeInclusive<u32> = 1_000..=600_000;
pub const DEFAULT_HEARTBEAT_MS: u32 = 10_000;
/// Sessions one tenant may hold (`sessions_per_tenant=`; default: every place not reserved for the admin).
pub const SESSIONS_PER_TENANT: RangeInclusive<u32> = 1..=MAX_SESSIONS;
/// Session places only the admin may take (`admin_sessions=`; default 1, and less than `sessions=`).
pub const ADMIN_SESSIONS: RangeInclusive<u32> = 0..=MAX_SESSIONS - 1;
/// Unauthenticated connections at once (`preauth_sessions=`; default 8, at most `sessions=`).
pub const PREAUTH_SESSIONS: RangeInclusive<u32> = 1..=MAX_SESSIONS;
/// The heap high-water mark in percent (`heap_high_water=`; default 85): above it new connections, sessions and
/// ALLOCs are refused BUSY.
pub const HEAP_HIGH_WATER: RangeInclusive<u32> = 10..=95;

fn parse_in(s: &str, range: RangeInclusive<u32>, reason: &'static str) -> Result<u32, &'static str> {
    decimal(s).filter(|v| range.contains(v)).ok_or(reason)
}

/// Whether `name` is a valid tenant (or appliance) name: 1 to 32 characters (the wire protocol's `MAX_NAME`) of
/// `A-Z a-z 0-9 _ . -`.
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The key grammar: a hex key is an even number of hex digits (either case) giving [`MIN_KEY`] to [`MAX_KEY`]
/// bytes; a key list is `KEY[,KEY…]`, each `HEX` or `ID/HEX` (ids 0 to 255, each once; a key without an id
/// has its position as id). The [`crate::Keyring`] decodes what passes; checking here makes a bad key an error
/// of the option like any other.
pub fn check_key_hex(hex: &str) -> Result<(), &'static str> {
    // A key list (protocol v2 key ids): `KEY[,KEY…]`, each `HEX` or `ID/HEX` (docs/operations.md).
    if hex.contains(',') || hex.contains('/') {
        let mut ids = [false; 256];
        for item in key_list(hex) {
            let (id, h) = item?;
            if core::mem::replace(&mut ids[usize::from(id)], true) {
                return Err("a key id is given twice");
            }
            check_key_hex(h)?;
        }
        return Ok(());
    }
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the key is not an even number of hex digits");
    }
    if !(MIN_KEY..=MAX_KEY).contains(&(hex.len() / 2)) {
        return Err("keys are 16 to 64 bytes (32 to 128 hex digits)");
    }
    Ok(())
}

/// A key list's items as (key id, hex) in order: `KEY[,KEY…]`, each `HEX` or `ID/HEX`, a key without an id
/// taking its position as id. The one splitter of the grammar: [`check_key_hex`] and [`crate::Keyring`] both
/// read lists through it.
pub fn key_list(keys: &str) -> impl Iterator<Item = Result<(u8, &str), &'static str>> {
    keys.split(',').enumerate().map(|(i, item)| match item.split_once('/') {
        Some((id, h)) => id.parse::<u8>().map(|id| (id, h)).map_err(|_| "key ids are 0 to 255 (ID/HEX)"),
        None => u8::try_from(i).map(|id| (id, item)).map_err(|_| "more than 256 keys"),
    })
}

/// The session core's principals and budgets. Keys stay hex text borrowed from the configuration.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions<'a> {
    tenants: [(&'a str, &'a str); MAX_TENANTS],
    tenants_len: usize,
    admin: Option<&'a str>,
    /// Concurrent session budget (`sessions=`); `None`: sized by the host from its memory
    /// ([`SessionOptions::sessions_or`]).
    pub sessions: Option<u32>,
    /// Outstanding requests granted per session (`credits=`).
    pub credits: u32,
    /// Session silence timeout, ms (`heartbeat_ms=`).
    pub heartbeat_ms: u32,
    /// `sessions_per_tenant=`, `admin_sessions=`, `preauth_sessions=`, `heap_high_water=` when given (the
    /// control service's defaults otherwise).
    pub sessions_per_tenant: Option<u32>,
    pub admin_sessions: Option<u32>,
    pub preauth_sessions: Option<u32>,
    pub heap_high_water: Option<u32>,
    /// `appliance=NAME`: this appliance's name, bound into every handshake (clients name it as
    /// `TENANT@NAME`); none: handshakes name no appliance.
    pub appliance: Option<&'a str>,
    /// The budgets' texts (`key`, value) as given, for the error [`SessionOptions::check`] may report.
    budget_text: [(&'a str, &'a str); 3],
}

impl Default for SessionOptions<'_> {
    fn default() -> Self {
        SessionOptions::DEFAULT
    }
}

impl SessionOptions<'_> {
    /// The defaults (a `static`'s initial value).
    pub const DEFAULT: Self = SessionOptions {
        tenants: [("", ""); MAX_TENANTS],
        tenants_len: 0,
        admin: None,
        sessions: None,
        credits: DEFAULT_CREDITS,
        heartbeat_ms: DEFAULT_HEARTBEAT_MS,
        sessions_per_tenant: None,
        admin_sessions: None,
        preauth_sessions: None,
        heap_high_water: None,
        appliance: None,
        budget_text: [("", ""); 3],
    };
}

/// Names only: keys never reach a log.
impl fmt::Debug for SessionOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Names<'b, 'a>(&'b SessionOptions<'a>);
        impl fmt::Debug for Names<'_, '_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.tenants().map(|(name, _)| name)).finish()
            }
        }
        f.debug_struct("SessionOptions")
            .field("tenants", &Names(self))
            .field("admin_key", &self.admin.map(|_| "***"))
            .field("sessions", &self.sessions)
            .field("credits", &self.credits)
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("sessions_per_tenant", &self.sessions_per_tenant)
            .field("admin_sessions", &self.admin_sessions)
            .field("preauth_sessions", &self.preauth_sessions)
            .field("heap_high_water", &self.heap_high_water)
            .field("appliance", &self.appliance)
            .finish_non_exhaustive()
    }
}

impl<'a> SessionOptions<'a> {
    /// Applies one `key=value`: `Ok(false)` when `key` is not the session core's, `Err(reason)` for a bad value
    /// (a `leasebox_options::ApplyFn`).
    pub fn apply(&mut self, key: &str, value: &'a str) -> Result<bool, &'static str> {
        match key {
            "tenant" => self.add_tenant(value)?,
            "admin" => self.set_admin(value)?,
            "sessions" => self.set_sessions(value)?,
            "credits" => self.set_credits(value)?,
            "heartbeat_ms" => self.set_heartbeat_ms(value)?,
            "sessions_per_tenant" => {
                self.set_sessions_per_tenant(value)?;
                self.budget_text[0] = ("sessions_per_tenant", value);
            }
            "admin_sessions" => {
                self.set_admin_sessions(value)?;
                self.budget_text[1] = ("admin_sessions", value);
            }
            "preauth_sessions" => {
                self.set_preauth_sessions(value)?;
                self.budget_text[2] = ("preauth_sessions", value);
            }
            "heap_high_water" => self.set_heap_high_water(value)?,
            "appliance" => self.set_appliance(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks between the budgets once every option is applied (a `leasebox_options::CheckFn`): the first
    /// conflict, naming the budget at fault with its value ([`SessionOptions::conflict`]).
    pub fn check(&self) -> Result<(), ConfigError<'a>> {
        self.conflict().map_err(|(key, reason)| {
            let value = self.budget_text.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| *v);
            ConfigError { key, value, reason }
        })
    }

    /// The tenants as `(name, hex key)` pairs, in configuration order.
    pub fn tenants(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + '_ {
        self.tenants[..self.tenants_len].iter().copied()
    }

    /// The admin principal's key as hex text, if configured.
    pub fn admin_key_hex(&self) -> Option<&'a str> {
        self.admin
    }

    /// `NAME:HEXKEY`.
    fn add_tenant(&mut self, v: &'a str) -> Result<(), &'static str> {
        let (name, key) = v.split_once(':').ok_or("expected NAME:HEXKEY")?;
        if name == ADMIN_NAME {
            return Err("'admin' is reserved for the admin key (admin=HEXKEY)");
        }
        if !valid_tenant_name(name) {
            return Err("tenant names are 1 to 32 characters of A-Z a-z 0-9 _ . -");
        }
        check_key_hex(key)?;
        if self.tenants().any(|(n, _)| n == name) {
            return Err("a tenant name is configured twice");
        }
        let slot = self.tenants.get_mut(self.tenants_len).ok_or("more than 16 tenants")?;
        *slot = (name, key);
        self.tenants_len += 1;
        Ok(())
    }

    fn set_admin(&mut self, v: &'a str) -> Result<(), &'static str> {
        check_key_hex(v)?;
        self.admin = Some(v);
        Ok(())
    }

    fn set_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.sessions = Some(parse_in(v, SESSIONS, "expected a session budget 1 to 4096")?);
        Ok(())
    }

    fn set_credits(&mut self, v: &str) -> Result<(), &'static str> {
        self.credits = parse_in(v, CREDITS, "expected 1 to 64 credits per session")?;
        Ok(())
    }

    fn set_heartbeat_ms(&mut self, v: &str) -> Result<(), &'static str> {
        self.heartbeat_ms = parse_in(v, HEARTBEAT_MS, "expected a timeout of 1000 to 600000 ms")?;
        Ok(())
    }

    fn set_sessions_per_tenant(&mut self, v: &str) -> Result<(), &'static str> {
        self.sessions_per_tenant = Some(parse_in(v, SESSIONS_PER_TENANT, "expected 1 to 4096 sessions per tenant")?);
        Ok(())
    }

    fn set_admin_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.admin_sessions = Some(parse_in(v, ADMIN_SESSIONS, "expected 0 to 4095 places reserved for the admin")?);
        Ok(())
    }

    fn set_preauth_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.preauth_sessions =
            Some(parse_in(v, PREAUTH_SESSIONS, "expected 1 to 4096 places for unauthenticated connections")?);
        Ok(())
    }

    fn set_appliance(&mut self, v: &'a str) -> Result<(), &'static str> {
        if !valid_tenant_name(v) {
            return Err("appliance names are 1 to 32 characters of A-Z a-z 0-9 _ . -");
        }
        self.appliance = Some(v);
        Ok(())
    }

    fn set_heap_high_water(&mut self, v: &str) -> Result<(), &'static str> {
        self.heap_high_water = Some(parse_in(v, HEAP_HIGH_WATER, "expected a percentage of the heap, 10 to 95")?);
        Ok(())
    }

    /// The session budget: `sessions=` when given, otherwise `sized` (what the host's memory gives, clamped to
    /// [`SESSIONS`]), raised to what the other budgets need (`admin_sessions=` + 1, `sessions_per_tenant=`,
    /// `preauth_sessions=`), so options that fit an explicit budget never conflict with a computed one.
    pub fn sessions_or(&self, sized: u32) -> u32 {
        if let Some(n) = self.sessions {
            return n;
        }
        let need = [
            self.admin_sessions.map_or(1, |a| a + 1),
            self.sessions_per_tenant.unwrap_or(1),
            self.preauth_sessions.unwrap_or(1),
        ];
        sized.clamp(*SESSIONS.start(), *SESSIONS.end()).max(need.into_iter().max().unwrap_or(1))
    }

    /// `(key, reason)` of the first conflict between the budgets. Without `sessions=` nothing conflicts: the
    /// computed budget makes room ([`SessionOptions::sessions_or`]).
    fn conflict(&self) -> Result<(), (&'static str, &'static str)> {
        let Some(sessions) = self.sessions else { return Ok(()) };
        if self.admin_sessions.is_some_and(|a| a >= sessions) {
            return Err(("admin_sessions", "must be less than sessions= (tenants need a place)"));
        }
        if self.sessions_per_tenant.is_some_and(|t| t > sessions) {
            return Err(("sessions_per_tenant", "must be at most sessions="));
        }
        if self.preauth_sessions.is_some_and(|p| p > sessions) {
            return Err(("preauth_sessions", "must be at most sessions="));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use leasebox_options::{OptionParser, Options, Registry};
    use std::string::ToString;

    const KEY16: &str = "00112233445566778899aabbccddeeff";
    const ALICE: &str = "alice:00112233445566778899aabbccddeeff";

    /// `line` through a registry with this parser alone, as the image and the hosted appliance apply it.
    fn parsed(line: &str) -> Result<SessionOptions<'_>, ConfigError<'_>> {
        let opts = Options::checked(SessionOptions::DEFAULT, SessionOptions::apply, SessionOptions::check);
        let parsers: [&dyn OptionParser; 1] = [&opts];
        let mut r = Registry::new(&parsers);
        r.apply(line)?;
        r.check()?;
        Ok(opts.get())
    }

    #[test]
    fn principals_and_budgets_from_words() {
        let line = std::format!(
            "tenant=alice:{KEY16} tenant=bob:{KEY16} admin={KEY16} sessions=4 credits=2 heartbeat_ms=2000 log=debug"
        );
        let c = parsed(&line).unwrap();
        assert_eq!(c.tenants().collect::<std::vec::Vec<_>>(), [("alice", KEY16), ("bob", KEY16)]);
        assert_eq!(c.admin_key_hex(), Some(KEY16));
        assert_eq!((c.sessions, c.credits, c.heartbeat_ms), (Some(4), 2, 2000));
    }

    #[test]
    fn bad_values_name_the_key_and_never_show_a_secret() {
        for (word, key) in [
            ("sessions=4097", "sessions"),
            ("credits=0", "credits"),
            ("heartbeat_ms=10", "heartbeat_ms"),
            ("admin=00", "admin"),
            ("tenant=admin:00112233445566778899aabbccddeeff", "tenant"),
        ] {
            assert_eq!(parsed(word).unwrap_err().key, key, "{word}");
        }
        for bad in
            [std::format!("tenant=alice:{KEY16}00x"), std::format!("admin={KEY16}0"), std::format!("tenant={KEY16}")]
        {
            let shown = parsed(&bad).unwrap_err().to_string();
            assert!(!shown.contains("0011"), "{shown}");
            assert!(shown.contains("=***: "), "{shown}");
        }
        let twice = std::format!("tenant=alice:{KEY16} tenant=alice:{KEY16}");
        let e = parsed(&twice).unwrap_err();
        assert_eq!(e.to_string(), "bad option tenant=***: a tenant name is configured twice");
        assert!(!std::format!("{e:?}").contains("0011"), "Debug redacts too");
    }

    #[test]
    fn the_appliance_name_parses_as_a_tenant_name_does() {
        assert_eq!(parsed("").unwrap().appliance, None);
        assert_eq!(parsed("appliance=lb-a.rack3").unwrap().appliance, Some("lb-a.rack3"));
        for bad in ["appliance=", "appliance=a@b", "appliance=012345678901234567890123456789012"] {
            assert_eq!(parsed(bad).unwrap_err().key, "appliance", "{bad}");
        }
    }

    #[test]
    fn session_budgets_parse_and_must_fit_the_session_budget() {
        let c =
            parsed("sessions=8 sessions_per_tenant=3 admin_sessions=2 preauth_sessions=4 heap_high_water=80").unwrap();
        assert_eq!(
            (c.sessions_per_tenant, c.admin_sessions, c.preauth_sessions, c.heap_high_water),
            (Some(3), Some(2), Some(4), Some(80))
        );
        for (word, key) in [
            ("sessions_per_tenant=0", "sessions_per_tenant"),
            ("admin_sessions=4096", "admin_sessions"),
            ("preauth_sessions=x", "preauth_sessions"),
            ("heap_high_water=99", "heap_high_water"),
        ] {
            assert_eq!(parsed(word).unwrap_err().key, key, "{word}");
        }
        for (line, key, value) in [
            ("sessions=4 admin_sessions=4", "admin_sessions", "4"),
            ("sessions=4 sessions_per_tenant=5", "sessions_per_tenant", "5"),
            ("sessions=16 preauth_sessions=17", "preauth_sessions", "17"),
        ] {
            let e = parsed(line).unwrap_err();
            assert_eq!((e.key, e.value), (key, value), "{line}");
        }
    }

    #[test]
    fn tenants_and_keys() {
        let long = "ab".repeat(64);
        let bob = std::format!("Bob_1.x-y:{long}");
        let dup = std::format!("alice:{long}");
        let admin = std::format!("admin:{KEY16}");
        let bad = [
            KEY16.to_string(),
            std::format!(":{KEY16}"),
            std::format!("{}:{KEY16}", "n".repeat(33)),
            std::format!("a b:{KEY16}"),
            std::format!("caf\u{e9}:{KEY16}"),
            "carol:00112233445566778899aabbccddee".into(),
            std::format!("carol:{KEY16}0"),
            std::format!("carol:{}", "ab".repeat(65)),
            "carol:zz112233445566778899aabbccddeeff".into(),
        ];
        let mut c = SessionOptions::default();
        c.add_tenant(ALICE).unwrap();
        c.add_tenant(&bob).unwrap();
        let names: std::vec::Vec<_> = c.tenants().map(|(n, _)| n).collect();
        assert_eq!(names, ["alice", "Bob_1.x-y"]);
        assert_eq!(c.tenants().nth(1).unwrap().1, long);

        assert!(c.add_tenant(&dup).unwrap_err().contains("twice"));
        assert!(c.add_tenant(&admin).unwrap_err().contains("reserved"));
        for b in &bad {
            assert!(c.add_tenant(b).is_err(), "{b}");
        }
        assert_eq!(c.tenants().len(), 2, "failed adds change nothing");
    }

    #[test]
    fn key_lists_for_rotation() {
        let (dave, erin, admin) = (
            std::format!("dave:0/{KEY16},1/{KEY16}"),
            std::format!("erin:{KEY16},{KEY16}"),
            std::format!("0/{KEY16},7/{KEY16}"),
        );
        let mut c = SessionOptions::default();
        c.add_tenant(&dave).unwrap();
        c.add_tenant(&erin).unwrap();
        let bad = [
            std::format!("frank:1/{KEY16},1/{KEY16}"),
            std::format!("frank:256/{KEY16}"),
            std::format!("frank:x/{KEY16}"),
            std::format!("frank:0/{KEY16},"),
            std::format!("frank:0/{KEY16},1/00"),
        ];
        for b in &bad {
            assert!(c.add_tenant(b).is_err(), "{b}");
        }
        assert!(c.set_admin(&admin).is_ok());
    }

    #[test]
    fn at_most_sixteen_tenants() {
        let words: std::vec::Vec<_> = (0..17).map(|i| std::format!("t{i}:{KEY16}")).collect();
        let mut c = SessionOptions::default();
        for w in &words[..16] {
            c.add_tenant(w).unwrap();
        }
        assert!(c.add_tenant(&words[16]).unwrap_err().contains("16"));
    }

    #[test]
    fn admin_key_and_decoding() {
        let mut c = SessionOptions::default();
        assert_eq!(c.admin_key_hex(), None);
        let upper = "00112233445566778899AABBCCDDEEFF";
        c.set_admin(upper).unwrap();
        assert_eq!(c.admin_key_hex(), Some(upper));
        assert!(c.set_admin("0011").is_err());
        assert_eq!(c.admin_key_hex(), Some(upper), "a bad value leaves the old key");
    }

    #[test]
    fn budgets() {
        let mut c = SessionOptions::default();
        assert_eq!((c.sessions, c.credits, c.heartbeat_ms), (None, 8, 10_000));
        assert_eq!(c.sessions_or(300), 300, "sized from memory without sessions=");
        assert_eq!(c.sessions_or(0), 1);
        assert_eq!(c.sessions_or(1_000_000), MAX_SESSIONS);
        c.set_sessions("64").unwrap();
        c.set_credits("1").unwrap();
        c.set_heartbeat_ms("600000").unwrap();
        assert_eq!((c.sessions, c.credits, c.heartbeat_ms), (Some(64), 1, 600_000));
        assert_eq!(c.sessions_or(300), 64, "sessions= wins");
        c.set_sessions("4096").unwrap();
        assert_eq!(c.sessions, Some(4096));
        assert!(c.set_sessions("0").is_err());
        assert!(c.set_sessions("4097").is_err());
        assert_eq!(c.sessions, Some(4096), "a bad value leaves the old one");
        assert!(c.set_credits("65").is_err());
        assert!(c.set_heartbeat_ms("999").is_err());
        assert!(c.set_heartbeat_ms("600001").is_err());
        assert!(c.set_heartbeat_ms("1e4").is_err());
    }

    #[test]
    fn a_computed_budget_makes_room_for_the_other_budgets() {
        let mut c = SessionOptions::default();
        c.set_preauth_sessions("40").unwrap();
        c.set_admin_sessions("99").unwrap();
        assert_eq!(c.conflict(), Ok(()), "no sessions=: nothing to conflict with");
        assert_eq!(c.sessions_or(16), 100, "admin_sessions= + 1");
        c.set_sessions_per_tenant("200").unwrap();
        assert_eq!(c.sessions_or(16), 200);
        assert_eq!(c.sessions_or(1024), 1024);
        c.set_sessions("100").unwrap();
        assert_eq!(c.conflict(), Err(("sessions_per_tenant", "must be at most sessions=")));
    }

    #[test]
    fn debug_never_shows_keys() {
        let mut c = SessionOptions::default();
        c.add_tenant(ALICE).unwrap();
        c.set_admin("ffeeddccbbaa99887766554433221100").unwrap();
        let d = std::format!("{c:?}");
        assert!(d.contains("alice") && d.contains("***"), "{d}");
        assert!(!d.contains("0011") && !d.contains("ffee"), "{d}");
    }
}
