//! The lease service's options on the kernel command line: pool size, slots, timers, the revoke order and the
//! test switches. The image and the hosted appliance register [`LeaseOptions::apply`] with the kernel's
//! configuration parser, which hands it every key the kernel does not know, and turn the result into a
//! [`crate::Config`] (`Config::from_options`).

use crate::config::RevokeOrder;

/// The lease options as given (`docs/operations.md`, "Options").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    /// `lease_pool_mib=`: DRAM lent to clients.
    pub pool_mib: u32,
    /// `lease_slots=`; `None`: as many as the HCA's caps and the pool allow ([`crate::setup::default_slots`]).
    pub slots: Option<u32>,
    /// `tenant_leases=`: leases one tenant may hold.
    pub tenant_leases: u32,
    /// `tenant_mib=`: bytes one tenant may hold, in MiB (leases count whole extents). `None`: the whole pool.
    pub tenant_mib: Option<u32>,
    /// `tenant_allocs_per_s=`: ALLOCs one tenant may start per second (a burst of as many). 0: no limit.
    pub tenant_allocs_per_s: u32,
    /// `lease_grace_ms=`: revoked slots wait this long before the sweep.
    pub grace_ms: u32,
    /// `ready_ms=`: a Granted lease must see READY within this long.
    pub ready_ms: u32,
    /// `lease_ttl_ms=`: TTL when ALLOC asks for 0.
    pub ttl_ms: u32,
    /// `session_grace_ms=`: a lost session's leases wait this long for the tenant to reconnect.
    pub session_grace_ms: u32,
    /// `heartbeat_renews=on|off`.
    pub heartbeat_renews: bool,
    /// `revoke_order=mkey-first|qp-first`.
    pub order: RevokeOrder,
    /// `allow_order_override=on|off`: whether the admin's REVOKE may ask for the other order.
    pub allow_order_override: bool,
    /// `revoke_notices=on|off`: whether a revoke's owner is told by a Revoked notice. `off` is a diagnostic that
    /// makes clients learn of revokes the other way (a failed completion, then QUERY), to test that path.
    pub revoke_notices: bool,
    /// `fence_test=on|off` (only in images built with the `fence-test` feature).
    pub fence_test: bool,
    /// `rdma_ip=a.b.c.d`: the RDMA port's IPv4 address, programmed as a RoCEv2 GID (IPv4-mapped) that lease
    /// QPs use. Unset: the control channel's static `ip=`, else [`DEFAULT_RDMA_IP`].
    pub rdma_ip: Option<core::net::Ipv4Addr>,
    /// `rdma_dscp=0..63`: the DSCP of the lease QPs' RoCEv2 packets (IPv4 TOS = DSCP << 2), so their traffic
    /// runs in the class a lossless fabric is configured for (docs/hardware-bringup.md).
    pub rdma_dscp: u8,
    /// Not an option: the number of tenants the control configuration names (`tenant=`), which the platform
    /// sets after parsing, for the fair shares of the pool ([`crate::Config::tenants`]).
    pub tenants: u32,
    /// `rdma_prio=0..7`: the 802.1p priority of the lease QPs' frames (the QP address path's `eth_prio`; it
    /// reaches the wire only on a VLAN-tagged port, where the switch maps it to a PFC class).
    pub rdma_prio: u8,
    /// `lease_warm=0..`[`MAX_WARM`]: warm entries kept ahead for UMR grants and revokes
    /// (docs/revoke-semantics.md, "The UMR path"); 0 turns the UMR path off and every lease takes the commands.
    pub warm: u32,
}

/// `lease_warm=`'s largest value. A warm entry serves one ALLOC of a burst, so entries past the lease slots
/// could never be used at once ([`crate::Config::from_options`] lowers the figure to the slots); the bound is
/// the slots a small machine gets by default ([`crate::setup::DEFAULT_SLOTS`]). The pool holds up to twice
/// this many entries after sweeps, each a PD, an RC QP and a key outside the lease slots plus 4 KiB of DMA
/// memory: 2048 of each at most, within the 2^14 QPs a ConnectX-5 allows by default and its 2^24 keys and PDs
/// (docs/reference/mlx5.md §e.1). Where the slots already take all the HCA allows, a fill that runs out of
/// objects fails like any other and the pool stops filling after a few (ALLOCs then take the commands).
pub const MAX_WARM: u32 = crate::setup::DEFAULT_SLOTS;

/// The RDMA port's address when nothing else names one (TEST-NET-2: set `rdma_ip=` on a real network).
pub const DEFAULT_RDMA_IP: core::net::Ipv4Addr = core::net::Ipv4Addr::new(198, 51, 100, 2);

impl LeaseOptions {
    /// The defaults (`docs/operations.md`), usable in a `static`.
    pub const DEFAULT: LeaseOptions = LeaseOptions {
        pool_mib: 64,
        slots: None,
        tenant_leases: 256,
        tenant_mib: None,
        tenants: 0,
        tenant_allocs_per_s: 0,
        grace_ms: 5_000,
        ready_ms: 10_000,
        ttl_ms: 60_000,
        session_grace_ms: 30_000,
        heartbeat_renews: true,
        order: RevokeOrder::MkeyFirst,
        allow_order_override: true,
        revoke_notices: true,
        fence_test: false,
        rdma_ip: None,
        rdma_dscp: 0,
        rdma_prio: 0,
        warm: crate::config::DEFAULT_WARM,
    };
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions::DEFAULT
    }
}

fn number(value: &str, min: u32, max: u32, msg: &'static str) -> Result<u32, &'static str> {
    value.parse::<u32>().ok().filter(|v| (min..=max).contains(v)).ok_or(msg)
}

fn on_off(value: &str) -> Result<bool, &'static str> {
    match value {
        "on" | "1" | "yes" => Ok(true),
        "off" | "0" | "no" => Ok(false),
        _ => Err("expected on or off"),
    }
}

impl LeaseOptions {
    /// Applies one `key=value`; `Ok(false)` when the key is not a lease option.
    pub fn apply(&mut self, key: &str, value: &str) -> Result<bool, &'static str> {
        match key {
            "lease_pool_mib" => {
                let v = number(value, 2, 1 << 20, "expected 2 to 1048576 (MiB, even)")?;
                if v % 2 != 0 {
                    return Err("the pool is made of 2 MiB extents: give an even number of MiB");
                }
                self.pool_mib = v;
            }
            "lease_slots" => self.slots = Some(number(value, 1, 1 << 20, "expected 1 to 1048576")?),
            "tenant_leases" => self.tenant_leases = number(value, 1, 1 << 20, "expected 1 to 1048576")?,
            "tenant_mib" => self.tenant_mib = Some(number(value, 1, 1 << 20, "expected 1 to 1048576 (MiB)")?),
            "tenant_allocs_per_s" => {
                self.tenant_allocs_per_s = number(value, 0, 1_000_000, "expected 0 (no limit) to 1000000 per second")?
            }
            "lease_grace_ms" => self.grace_ms = number(value, 0, 3_600_000, "expected 0 to 3600000")?,
            "ready_ms" => self.ready_ms = number(value, 1, 3_600_000, "expected 1 to 3600000")?,
            "lease_ttl_ms" => self.ttl_ms = number(value, 1, 3_600_000, "expected 1 to 3600000")?,
            "session_grace_ms" => self.session_grace_ms = number(value, 0, 3_600_000, "expected 0 to 3600000")?,
            "heartbeat_renews" => self.heartbeat_renews = on_off(value)?,
            "revoke_order" => {
                self.order = match value {
                    "mkey-first" => RevokeOrder::MkeyFirst,
                    "qp-first" => RevokeOrder::QpFirst,
                    _ => return Err("expected mkey-first or qp-first"),
                }
            }
            "allow_order_override" => self.allow_order_override = on_off(value)?,
            "revoke_notices" => self.revoke_notices = on_off(value)?,
            "fence_test" => self.fence_test = on_off(value)?,
            "rdma_ip" => {
                let ip: core::net::Ipv4Addr = value.parse().map_err(|_| "expected an IPv4 address a.b.c.d")?;
                if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                    return Err("expected a unicast IPv4 address");
                }
                self.rdma_ip = Some(ip);
            }
            "rdma_dscp" => self.rdma_dscp = number(value, 0, 63, "expected a DSCP from 0 to 63")? as u8,
            "rdma_prio" => self.rdma_prio = number(value, 0, 7, "expected an 802.1p priority from 0 to 7")? as u8,
            "lease_warm" => self.warm = number(value, 0, MAX_WARM, "expected 0 (UMR path off) to 1024 warm entries")?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let mut o = LeaseOptions::default();
        assert_eq!(o.apply("lease_pool_mib", "128"), Ok(true));
        assert_eq!(o.apply("revoke_order", "qp-first"), Ok(true));
        // Removed (docs/revoke-semantics.md, "Why there is no flow-table DROP"): an unknown option now.
        assert_eq!(o.apply("flow_drop", "on"), Ok(false));
        assert_eq!(o.apply("allow_order_override", "off"), Ok(true));
        assert!(!o.allow_order_override);
        assert!(o.apply("allow_order_override", "maybe").is_err());
        assert!(o.revoke_notices, "notices are on by default");
        assert_eq!(o.apply("revoke_notices", "off"), Ok(true));
        assert!(!o.revoke_notices);
        assert!(o.apply("revoke_notices", "later").is_err());
        assert_eq!(o.apply("lease_grace_ms", "0"), Ok(true));
        assert_eq!(o.apply("port", "1"), Ok(false));
        assert_eq!(o.apply("rdma_ip", "10.1.2.3"), Ok(true));
        assert_eq!(o.rdma_ip, Some(core::net::Ipv4Addr::new(10, 1, 2, 3)));
        assert!(o.apply("rdma_ip", "10.1.2").is_err());
        assert!(o.apply("rdma_ip", "0.0.0.0").is_err());
        assert!(o.apply("revoke_order", "sideways").is_err());
        assert!(o.apply("lease_pool_mib", "3").is_err());
        assert!(o.apply("lease_slots", "0").is_err());
        assert_eq!(o.slots, None, "sized from the HCA and the pool unless given");
        assert_eq!(o.apply("lease_slots", "1048576"), Ok(true));
        assert_eq!(o.slots, Some(1 << 20));
        assert!(o.apply("lease_slots", "1048577").is_err());
        assert_eq!((o.pool_mib, o.order, o.grace_ms), (128, RevokeOrder::QpFirst, 0));
        assert_eq!((o.apply("rdma_dscp", "26"), o.apply("rdma_prio", "3")), (Ok(true), Ok(true)));
        assert_eq!((o.rdma_dscp, o.rdma_prio), (26, 3));
        assert!(o.apply("rdma_dscp", "64").is_err() && o.apply("rdma_prio", "8").is_err());
        assert!(o.apply("rdma_dscp", "-1").is_err());
        assert_eq!((o.apply("tenant_mib", "64"), o.apply("tenant_allocs_per_s", "100")), (Ok(true), Ok(true)));
        assert_eq!((o.tenant_mib, o.tenant_allocs_per_s), (Some(64), 100));
        assert!(o.apply("tenant_mib", "0").is_err() && o.apply("tenant_mib", "64M").is_err());
        assert!(o.apply("tenant_allocs_per_s", "-1").is_err() && o.apply("tenant_allocs_per_s", "2000000").is_err());
    }

    #[test]
    fn lease_warm() {
        let mut o = LeaseOptions::default();
        assert_eq!(o.warm, crate::config::DEFAULT_WARM, "the UMR path by default");
        assert_ne!(o.warm, 0);
        assert_eq!(o.apply("lease_warm", "0"), Ok(true));
        assert_eq!(o.warm, 0, "0: every lease takes the commands");
        assert_eq!(o.apply("lease_warm", "1024"), Ok(true));
        assert_eq!(o.warm, MAX_WARM);
        for bad in ["1025", "-1", "", "32x", "on", "4294967296"] {
            assert_eq!(o.apply("lease_warm", bad), Err("expected 0 (UMR path off) to 1024 warm entries"), "{bad:?}");
        }
        assert_eq!(o.warm, MAX_WARM, "a refused value leaves the option as it was");
    }
}
