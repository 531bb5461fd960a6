//! Options of the control channel's interface (docs/operations.md): `ctl_nic=auto|virtio|mlx5`, which NIC
//! carries it; `ip=A.B.C.D/N` and `gw=A.B.C.D` for a static address, DHCPv4 (RFC 2131) when `ip=` is absent;
//! `port=N`, the control service's TCP port. (The control service's own options — principals, keys, budgets —
//! are the session core's: `leasebox_session::options`, registered by the image.)
//!
//! Everything is parsed and validated here, at boot, so a bad value stops the boot with a message instead of
//! surfacing later in the network loop.

use core::fmt;
use core::net::Ipv4Addr;
use leasebox_options::decimal;

/// The control service's TCP port when `port=` is absent (docs/wire-protocol.md).
pub const DEFAULT_PORT: u16 = 7470;
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
        let prefix = decimal(prefix).ok_or("the prefix length is not a number")?;
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

fn parse_in(s: &str, range: core::ops::RangeInclusive<u32>, reason: &'static str) -> Result<u32, &'static str> {
    decimal(s).filter(|v| range.contains(v)).ok_or(reason)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
