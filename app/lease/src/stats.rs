//! The service's counters and latency histograms (STATS).

use leasebox_proto::Histogram;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub allocs_started: u64,
    pub allocs: u64,
    pub revokes: u64,
    pub expiries: u64,
    pub reconnects: u64,
    pub fenced: u64,
    pub swept: u64,
    pub commands: u64,
    pub failed_commands: u64,
    /// ALLOCs with `client_mac` 0 whose MAC the host resolved, and those that waited in vain.
    pub resolved: u64,
    pub resolve_timeouts: u64,
    /// Notices not queued because nobody took the earlier ones (`service::NOTICES_PER_SLOT`).
    pub notices_dropped: u64,
    /// ALLOCs granted by a UMR work request (the warm path), and those built by commands.
    pub umr_grants: u64,
    /// Immediate phases cut by a UMR revoke, and UMR revokes that failed (DESTROY_MKEY followed).
    pub umr_revokes: u64,
    pub umr_revoke_failures: u64,
    /// Warm entries built, recycled by the sweep, and builds that failed.
    pub warm_built: u64,
    pub warm_recycled: u64,
    pub warm_failed: u64,
    /// Commands the warm pool's builds issued (part of `commands`): the rest are the leases' own.
    pub warm_commands: u64,
    /// Pool bytes zeroed by the scrub (freed leases' memory, and the pool's own at boot).
    pub scrubbed_bytes: u64,
    /// ALLOC and FREE/REVOKE, request to answer, in microseconds.
    pub alloc_us: Histogram,
    pub revoke_us: Histogram,
}
