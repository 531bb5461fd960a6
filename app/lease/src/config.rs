//! The lease service's budgets and switches (declared in one place, with limits and clear errors).

use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use leasebox_mlx5::ifc::mkey::MAX_MTT_PAGES;

/// Which teardown command the immediate phase of a revoke issues first (docs/architecture.md, "Lease life cycle").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevokeOrder {
    /// DESTROY_MKEY, QP left in RTS: a client that keeps posting gets a NAK (remote access error) within one
    /// round trip. The default.
    MkeyFirst,
    /// The spec's order (docs/reference/revoke-spec.md §2.1): 2ERR_QP, then DESTROY_MKEY. A client that keeps posting
    /// hears nothing and learns of the revoke when its transport retries run out. For comparison.
    QpFirst,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Warm entries kept ahead for UMR grants when the HCA allows them (0: every lease takes the command
    /// path); the sweep returns a revoked lease's objects to the pool, up to twice this.
    pub warm: u32,
    /// The lease pool: runs of device addresses, each a whole number of `extent`s (they need not touch: a lease's
    /// MKEY lists its extents one by one).
    pub pool: Vec<Range<u64>>,
    /// Allocation granule and MKEY page size (a power of two, 4 KiB to 1 GiB; 2 MiB by default).
    pub extent: u64,
    /// The HCA's largest memory region, `2^log_max_mrw_sz` bytes ([`Config::max_lease`] is no larger).
    pub max_region: u64,
    /// Lease slots (each: one PD, one MKEY, one RC QP), 1 to 2^20 (`Config::check` refuses more). A slot's index
    /// is 32 bits wherever it travels (lease ids on the wire, the low half of a command's tag), so every index
    /// the table can have fits (`tests/limits.rs`).
    pub slots: u32,
    /// Per-tenant budgets.
    pub tenant_leases: u32,
    pub tenant_bytes: u64,
    /// Tenants configured (`tenant=`): with two or more and no `tenant_mib=` (`tenant_bytes` unlimited), each
    /// is guaranteed `pool / tenants` bytes and may hold more only while the bytes no tenant holds still cover
    /// every other tenant's unused guarantee (docs/security.md, "Fair shares"). 0: not known, no shares.
    pub tenants: u32,
    /// ALLOCs one tenant may start per second, with a burst of as many (0: no limit; the admin has none).
    pub tenant_allocs_per_s: u32,
    /// TTL when ALLOC asks for 0, and the most a lease may ask for.
    pub default_ttl_ms: u32,
    pub max_ttl_ms: u32,
    /// A Granted lease with no READY within this long is revoked (origin EXPIRY).
    pub ready_timeout_ms: u64,
    /// Revoked slots wait this long before the sweep destroys the QP (the spec's grace, 5 s:
    /// docs/reference/revoke-spec.md §2.1).
    pub grace_ms: u64,
    /// A lost session's leases are kept this long for the tenant to reconnect.
    pub session_grace_ms: u64,
    /// Whether a session's heartbeats renew its leases' TTL.
    pub heartbeat_renews: bool,
    pub order: RevokeOrder,
    /// Whether a REVOKE may ask for the other order (admin only).
    pub allow_order_override: bool,
    /// Whether a revoke's owner gets a Revoked notice (`revoke_notices=`; off only to test clients' fallback,
    /// a failed completion followed by QUERY).
    pub revoke_notices: bool,
    /// The outcome of a revoke is answered within this long in every case.
    pub revoke_deadline_ms: u64,
    /// FENCE-TEST (only with the `fence-test` feature).
    pub fence_test: bool,
    /// QP timers toward clients (IB encodings).
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    /// The lease QPs' traffic class byte (DSCP << 2) and 802.1p priority (`rdma_dscp=`, `rdma_prio=`).
    pub tclass: u8,
    pub eth_prio: u8,
    /// Extents of `pool` the platform gave uncleared (they may hold the previous boot's data): scrubbed in the
    /// background before they are first handed out.
    pub uncleared: Vec<u64>,
    /// The scrub's share of each service tick: it zeroes slices of [`SCRUB_SLICE`] until this much time has
    /// passed (or [`SCRUB_TICK_MAX`] bytes), so the control plane keeps answering while memory is cleared.
    pub scrub_budget_us: u64,
}

/// The scrub zeroes this much at a time (then looks at the clock).
pub const SCRUB_SLICE: u64 = 256 << 10;
/// At most this much per tick whatever the clock says (a clock that does not move, as a test's virtual one
/// between steps, must not let one tick scrub a whole pool).
pub const SCRUB_TICK_MAX: u64 = 64 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            pool: Vec::new(),
            extent: 2 << 20,
            max_region: u64::MAX,
            slots: 1024,
            tenant_leases: 256,
            tenant_bytes: u64::MAX,
            tenants: 0,
            tenant_allocs_per_s: 0,
            default_ttl_ms: 60_000,
            max_ttl_ms: 3_600_000,
            ready_timeout_ms: 10_000,
            grace_ms: 5_000,
            session_grace_ms: 30_000,
            heartbeat_renews: true,
            order: RevokeOrder::MkeyFirst,
            uncleared: Vec::new(),
            scrub_budget_us: 500,
            allow_order_override: true,
            revoke_notices: true,
            revoke_deadline_ms: 1_000,
            fence_test: false,
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            tclass: 0,
            eth_prio: 0,
            warm: DEFAULT_WARM,
        }
    }
}

/// Warm entries (PD, QP in INIT, free UMR key) kept ahead by default (`lease_warm=`): leases take the UMR path
/// wherever the HCA's caps allow it (docs/revoke-semantics.md, "The UMR path"). A burst of 32 ALLOCs takes the
/// 2-command path while the timer refills behind it, 4 commands per entry off the request path; filled lazily,
/// so boot time does not grow with it. `lease_warm=0` puts every lease on the command path.
pub const DEFAULT_WARM: u32 = 32;

/// The largest lease in bytes with extents of `extent` bytes on an HCA whose largest memory region is
/// `max_region` bytes (docs/operations.md, "The largest lease"): as many extents as one CREATE_MKEY's MTT
/// list carries in the driver's longest command, and no more than `max_region`.
pub fn max_lease(extent: u64, max_region: u64) -> u64 {
    (MAX_MTT_PAGES as u64).saturating_mul(extent).min(max_region)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub &'static str);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Config {
    /// The pool's size in bytes.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.iter().map(|r| r.end.saturating_sub(r.start)).sum()
    }

    /// The largest lease in bytes ([`max_lease`]). ALLOC refuses anything larger before it touches the HCA.
    pub fn max_lease(&self) -> u64 {
        max_lease(self.extent, self.max_region)
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        if !self.extent.is_power_of_two() || self.extent < 4096 || self.extent > (1 << 30) {
            return Err(ConfigError("extent must be a power of two from 4 KiB to 1 GiB"));
        }
        if self
            .pool
            .iter()
            .any(|r| r.start > r.end || !r.start.is_multiple_of(self.extent) || !r.end.is_multiple_of(self.extent))
        {
            return Err(ConfigError("every run of the pool must start and end on an extent boundary"));
        }
        if self.slots == 0 || self.slots > 1 << 20 {
            return Err(ConfigError("slots must be 1 to 1048576"));
        }
        if self.revoke_deadline_ms == 0 || self.revoke_deadline_ms > 1_000 {
            return Err(ConfigError("revoke_deadline_ms must be 1 to 1000"));
        }
        if self.default_ttl_ms == 0 || self.default_ttl_ms > self.max_ttl_ms {
            return Err(ConfigError("default_ttl_ms must be 1 to max_ttl_ms"));
        }
        Ok(())
    }
}
