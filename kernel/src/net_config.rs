//! Options of the control channel and the control service (docs/operations.md):
//!
//! - the interface: `ctl_nic=auto|virtio|mlx5`, which NIC carries it; `ip=A.B.C.D/N` and `gw=A.B.C.D` for a
//!   static address, DHCPv4 (RFC 2131) when `ip=` is absent; `port=N`, the control service's TCP port;
//! - the control service: principals (`tenant=NAME:KEYS`, repeatable; `admin=KEYS`; KEYS is `HEXKEY` or a
//!   comma-separated list of `HEXKEY` / `ID/HEXKEY` for key rotation) and budgets
//!   (`sessions=`, `credits=`, `heartbeat_ms=`). Without `sessions=` the host sizes the session budget from
//!   its memory ([`ControlConfig::sessions_or`]; docs/operations.md, "Scale").
//!
//! Everything is parsed and validated here, at boot, so a bad value stops the boot with a message instead of
//! surfacing later in the network loop or the session core. Keys are secrets: they are kept as the hex text
//! of the configuration (no copy), and neither `Debug` nor errors ever show them.

use core::fmt;
use core::net::Ipv4Addr;
use core::ops::RangeInclusive;

/// The control service's TCP port when `port=` is absent (docs/wire-protocol.md).
pub const DEFAULT_PORT: u16 = 7470;
/// Budget: tenants the configuration may name.
pub const MAX_TENANTS: usize = 16;
/// Tenant names are 1 to 32 characters (the wire protocol's `MAX_NAME`).
pub const MAX_TENANT_NAME: usize = 32;
/// The principal name reserved for the admin key.
pub const ADMIN_NAME: &str = "admin";
/// Key lengths in bytes (HMAC-SHA256 keys; 16 bytes is the floor for a secret).
pub const KEY_BYTES: RangeInclusive<usize> = 16..=64;
/// Concurrent sessions (`sessions=`): up to a cluster's worth of clients on one memory node.
pub const SESSIONS: RangeInclusive<u32> = 1..=MAX_SESSIONS;
pub const MAX_SESSIONS: u32 = 4096;
/// The session budget when `sessions=` is absent and the host gives no figure of its own (the host normally
/// sizes it from its memory: [`ControlConfig::sessions_or`]).
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

/// An IPv4 interface address with its prefix length, e.g. `10.0.2.15/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    /// 1..=32.
    pub prefix: u8,
}

impl Ipv4Net {
    /// The network mask, e.g. 255.255.255.0 for /24.
    pub fn netmask(&self) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0)
    }

    /// Whether `a` is on this subnet.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        (u32::from(a) ^ u32::from(self.addr)) & self.netmask() == 0
    }

    /// Whether `a` is this subnet's network or broadcast address (only meaningful up to /30: /31 and /32
    /// have no such addresses, RFC 3021).
    fn is_network_or_broadcast(&self, a: Ipv4Addr) -> bool {
        let host = u32::from(a) & !self.netmask();
        self.prefix <= 30 && (host == 0 || host == !self.netmask())
    }

    /// Parses `A.B.C.D/N` (N in 1..=32) with a unicast host address.
    pub fn parse(s: &str) -> Result<Ipv4Net, &'static str> {
        let (addr, prefix) = s.split_once('/').ok_or("expected A.B.C.D/N (address and prefix length)")?;
        let addr = parse_unicast(addr)?;
        let prefix = parse_decimal(prefix).ok_or("the prefix length is not a number")?;
        if !(1..=32).contains(&prefix) {
            return Err("the prefix length must be 1 to 32");
        }
        let net = Ipv4Net { addr, prefix: prefix as u8 };
        if net.is_network_or_broadcast(addr) {
            return Err("the address is the subnet's network or broadcast address");
        }
        Ok(net)
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A dotted-quad unicast host address (no leading zeros: `010` is ambiguous).
fn parse_unicast(s: &str) -> Result<Ipv4Addr, &'static str> {
    let a: Ipv4Addr = s.parse().map_err(|_| "not an IPv4 address A.B.C.D")?;
    if a.is_unspecified() || a.is_loopback() || a.is_multicast() || a.is_broadcast() || a.octets()[0] >= 240 {
        return Err("not a unicast host address");
    }
    Ok(a)
}

/// A plain decimal number (digits only, no sign), or `None` on overflow or anything else.
pub(crate) fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_in(s: &str, range: RangeInclusive<u32>, reason: &'static str) -> Result<u32, &'static str> {
    parse_decimal(s).filter(|v| range.contains(v)).ok_or(reason)
}

/// Which NIC carries the control channel (`ctl_nic=`). Only a name here: the image owns the drivers and acts on
/// it (docs/operations.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlNic {
    /// virtio-net when the machine has one, else the ConnectX-5's own Ethernet port.
    #[default]
    Auto,
    /// virtio-net only (no control channel without one).
    Virtio,
    /// The ConnectX-5's Ethernet port, even when a virtio-net device is present.
    Mlx5,
}

impl ControlNic {
    pub fn parse(v: &str) -> Result<ControlNic, &'static str> {
        match v {
            "auto" => Ok(ControlNic::Auto),
            "virtio" => Ok(ControlNic::Virtio),
            "mlx5" => Ok(ControlNic::Mlx5),
            _ => Err("expected auto, virtio or mlx5"),
        }
    }
}

impl fmt::Display for ControlNic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ControlNic::Auto => "auto",
            ControlNic::Virtio => "virtio",
            ControlNic::Mlx5 => "mlx5",
        })
    }
}

/// The control channel's interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// Which NIC (`ctl_nic=`).
    pub nic: ControlNic,
    /// A static address (`ip=`); `None`: DHCPv4.
    pub ip: Option<Ipv4Net>,
    /// The default gateway (`gw=`, static addressing only).
    pub gw: Option<Ipv4Addr>,
    /// The control service's TCP port (`port=`).
    pub port: u16,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig { nic: ControlNic::Auto, ip: None, gw: None, port: DEFAULT_PORT }
    }
}

impl NetConfig {
    /// Whether the address comes from DHCP.
    pub fn dhcp(&self) -> bool {
        self.ip.is_none()
    }

    pub(crate) fn set_ip(&mut self, v: &str) -> Result<(), &'static str> {
        self.ip = Some(Ipv4Net::parse(v)?);
        Ok(())
    }

    pub(crate) fn set_gw(&mut self, v: &str) -> Result<(), &'static str> {
        self.gw = Some(parse_unicast(v)?);
        Ok(())
    }

    pub(crate) fn set_nic(&mut self, v: &str) -> Result<(), &'static str> {
        self.nic = ControlNic::parse(v)?;
        Ok(())
    }

    pub(crate) fn set_port(&mut self, v: &str) -> Result<(), &'static str> {
        self.port = parse_in(v, 1..=65535, "expected a TCP port 1 to 65535")? as u16;
        Ok(())
    }

    /// Checks that need every option: a gateway needs a static address on the same subnet.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        match (self.ip, self.gw) {
            (None, Some(_)) => Err("gw= needs a static address (ip=A.B.C.D/N); with DHCP the server names the router"),
            (Some(net), Some(gw)) if gw == net.addr => Err("the gateway is the interface's own address"),
            (Some(net), Some(gw)) if !net.contains(gw) => Err("the gateway is not on the ip= subnet"),
            (Some(net), Some(gw)) if net.is_network_or_broadcast(gw) => {
                Err("the gateway is the subnet's network or broadcast address")
            }
            _ => Ok(()),
        }
    }
}

/// Whether `name` is a valid tenant name: 1 to 32 characters of `A-Z a-z 0-9 _ . -`.
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=MAX_TENANT_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Checks a hex key: an even number of hex digits (either case) giving 16 to 64 bytes. The same rules as the
/// session core's `Keyring` (app/session), which decodes the key; checking here makes a bad key a boot error
/// like any other bad option.
pub fn check_key_hex(hex: &str) -> Result<(), &'static str> {
    // A key list (protocol v2 key ids): `KEY[,KEY…]`, each `HEX` or `ID/HEX` (docs/operations.md).
    if hex.contains(',') || hex.contains('/') {
        let mut ids = [false; 256];
        for (i, item) in hex.split(',').enumerate() {
            let (id, h) = match item.split_once('/') {
                Some((id, h)) => (id.parse::<u8>().map_err(|_| "key ids are 0 to 255 (ID/HEX)")?, h),
                None => (u8::try_from(i).map_err(|_| "more than 256 keys")?, item),
            };
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
    if !KEY_BYTES.contains(&(hex.len() / 2)) {
        return Err("keys are 16 to 64 bytes (32 to 128 hex digits)");
    }
    Ok(())
}

/// The control service's principals and budgets. Keys stay hex text borrowed from the configuration.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ControlConfig<'a> {
    tenants: [(&'a str, &'a str); MAX_TENANTS],
    tenants_len: usize,
    admin: Option<&'a str>,
    /// Concurrent session budget (`sessions=`); `None`: sized by the host from its memory
    /// ([`ControlConfig::sessions_or`]).
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
}

impl Default for ControlConfig<'_> {
    fn default() -> Self {
        ControlConfig {
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
        }
    }
}

/// Names only: keys never reach a log.
impl fmt::Debug for ControlConfig<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Names<'b, 'a>(&'b ControlConfig<'a>);
        impl fmt::Debug for Names<'_, '_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.tenants().map(|(name, _)| name)).finish()
            }
        }
        f.debug_struct("ControlConfig")
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
            .finish()
    }
}

impl<'a> ControlConfig<'a> {
    /// The tenants as `(name, hex key)` pairs, in configuration order.
    pub fn tenants(&self) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + '_ {
        self.tenants[..self.tenants_len].iter().copied()
    }

    /// The admin principal's key as hex text, if configured.
    pub fn admin_key_hex(&self) -> Option<&'a str> {
        self.admin
    }

    /// `NAME:HEXKEY`.
    pub(crate) fn add_tenant(&mut self, v: &'a str) -> Result<(), &'static str> {
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

    pub(crate) fn set_admin(&mut self, v: &'a str) -> Result<(), &'static str> {
        check_key_hex(v)?;
        self.admin = Some(v);
        Ok(())
    }

    pub(crate) fn set_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.sessions = Some(parse_in(v, SESSIONS, "expected a session budget 1 to 4096")?);
        Ok(())
    }

    pub(crate) fn set_credits(&mut self, v: &str) -> Result<(), &'static str> {
        self.credits = parse_in(v, CREDITS, "expected 1 to 64 credits per session")?;
        Ok(())
    }

    pub(crate) fn set_heartbeat_ms(&mut self, v: &str) -> Result<(), &'static str> {
        self.heartbeat_ms = parse_in(v, HEARTBEAT_MS, "expected a timeout of 1000 to 600000 ms")?;
        Ok(())
    }

    pub(crate) fn set_sessions_per_tenant(&mut self, v: &str) -> Result<(), &'static str> {
        self.sessions_per_tenant = Some(parse_in(v, SESSIONS_PER_TENANT, "expected 1 to 4096 sessions per tenant")?);
        Ok(())
    }

    pub(crate) fn set_admin_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.admin_sessions = Some(parse_in(v, ADMIN_SESSIONS, "expected 0 to 4095 places reserved for the admin")?);
        Ok(())
    }

    pub(crate) fn set_preauth_sessions(&mut self, v: &str) -> Result<(), &'static str> {
        self.preauth_sessions =
            Some(parse_in(v, PREAUTH_SESSIONS, "expected 1 to 4096 places for unauthenticated connections")?);
        Ok(())
    }

    pub(crate) fn set_appliance(&mut self, v: &'a str) -> Result<(), &'static str> {
        if !valid_tenant_name(v) {
            return Err("appliance names are 1 to 32 characters of A-Z a-z 0-9 _ . -");
        }
        self.appliance = Some(v);
        Ok(())
    }

    pub(crate) fn set_heap_high_water(&mut self, v: &str) -> Result<(), &'static str> {
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

    /// Checks between the budgets once every option is applied: `(key, reason)` of the first conflict. Without
    /// `sessions=` nothing conflicts: the computed budget makes room ([`ControlConfig::sessions_or`]).
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
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
    use super::*;

    const KEY16: &str = "00112233445566778899aabbccddeeff";
    const ALICE: &str = "alice:00112233445566778899aabbccddeeff";

    #[test]
    fn addresses_and_prefixes() {
        let n = Ipv4Net::parse("10.0.2.15/24").unwrap();
        assert_eq!((n.addr, n.prefix), (Ipv4Addr::new(10, 0, 2, 15), 24));
        assert_eq!(n.netmask(), 0xffff_ff00);
        assert!(n.contains(Ipv4Addr::new(10, 0, 2, 2)));
        assert!(!n.contains(Ipv4Addr::new(10, 0, 3, 2)));
        assert_eq!(std::format!("{n}"), "10.0.2.15/24");
        assert_eq!(Ipv4Net::parse("192.168.1.7/32").unwrap().netmask(), u32::MAX);
        assert_eq!(Ipv4Net::parse("11.0.0.1/1").unwrap().netmask(), 0x8000_0000);
        assert!(Ipv4Net::parse("10.0.0.0/31").is_ok(), "RFC 3021: /31 has no network address");
        for bad in [
            "10.0.2.15",
            "10.0.2.15/0",
            "10.0.2.15/33",
            "10.0.2.15/",
            "10.0.2.15/+8",
            "10.0.2/24",
            "10.0.2.256/24",
            "10.0.02.15/24",
            "0.0.0.0/8",
            "127.0.0.1/8",
            "224.0.0.1/4",
            "255.255.255.255/32",
            "10.0.2.0/24",
            "10.0.2.255/24",
            " 10.0.2.15/24",
        ] {
            assert!(Ipv4Net::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gateway_rules() {
        let mut n = NetConfig::default();
        assert!(n.dhcp());
        assert_eq!(n.port, 7470);
        n.set_gw("10.0.2.2").unwrap();
        assert!(n.check().is_err(), "gw without ip");
        n.set_ip("10.0.2.15/24").unwrap();
        assert_eq!(n.check(), Ok(()));
        n.set_gw("10.0.3.2").unwrap();
        assert!(n.check().is_err(), "off-subnet gateway");
        n.set_gw("10.0.2.15").unwrap();
        assert!(n.check().is_err(), "own address");
        n.set_gw("10.0.2.255").unwrap();
        assert!(n.check().is_err(), "broadcast");
        assert!(n.set_gw("10.0.2.2/24").is_err());
    }

    #[test]
    fn ports() {
        let mut n = NetConfig::default();
        n.set_port("1").unwrap();
        assert_eq!(n.port, 1);
        n.set_port("65535").unwrap();
        assert_eq!(n.port, 65535);
        for bad in ["0", "65536", "", "-1", "+80", "80x", "99999999999"] {
            assert!(n.set_port(bad).is_err(), "{bad}");
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
        let mut c = ControlConfig::default();
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
        let mut c = ControlConfig::default();
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
        let mut c = ControlConfig::default();
        for w in &words[..16] {
            c.add_tenant(w).unwrap();
        }
        assert!(c.add_tenant(&words[16]).unwrap_err().contains("16"));
    }

    #[test]
    fn admin_key_and_decoding() {
        let mut c = ControlConfig::default();
        assert_eq!(c.admin_key_hex(), None);
        let upper = "00112233445566778899AABBCCDDEEFF";
        c.set_admin(upper).unwrap();
        assert_eq!(c.admin_key_hex(), Some(upper));
        assert!(c.set_admin("0011").is_err());
        assert_eq!(c.admin_key_hex(), Some(upper), "a bad value leaves the old key");
    }

    #[test]
    fn budgets() {
        let mut c = ControlConfig::default();
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
        let mut c = ControlConfig::default();
        c.set_preauth_sessions("40").unwrap();
        c.set_admin_sessions("99").unwrap();
        assert_eq!(c.check(), Ok(()), "no sessions=: nothing to conflict with");
        assert_eq!(c.sessions_or(16), 100, "admin_sessions= + 1");
        c.set_sessions_per_tenant("200").unwrap();
        assert_eq!(c.sessions_or(16), 200);
        assert_eq!(c.sessions_or(1024), 1024);
        c.set_sessions("100").unwrap();
        assert_eq!(c.check(), Err(("sessions_per_tenant", "must be at most sessions=")));
    }

    #[test]
    fn debug_never_shows_keys() {
        let mut c = ControlConfig::default();
        c.add_tenant(ALICE).unwrap();
        c.set_admin("ffeeddccbbaa99887766554433221100").unwrap();
        let d = std::format!("{c:?}");
        assert!(d.contains("alice") && d.contains("***"), "{d}");
        assert!(!d.contains("0011") && !d.contains("ffee"), "{d}");
    }
}
