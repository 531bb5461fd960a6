//! What the lease service needs from a freshly brought-up HCA, and its configuration from the command line's
//! lease options: shared by the image and the hosted appliance.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ops::Range;

use leasebox_mlx5::driver::Driver;
use leasebox_mlx5::platform::{DmaBuf, Platform};

use alloc::sync::Arc;

use crate::config::Config;
use crate::options::{DEFAULT_RDMA_IP, LeaseOptions};
use crate::service::{HcaCtx, Host, Neighbour, UmrCtx, port_ib_mtu};
use leasebox_session::{Entropy, IdRng};

/// The lease service's host over an mlx5 platform: QP buffers from its DMA memory, scrubbing through the
/// pool's DMA handles (in 4 KiB writes, each naming the pool extent it lands in and the offset there).
pub struct PlatformHost<P: Platform>(pub Arc<P>, Scrub);

/// The pool's handles (sorted by device address), the scrubs refused so far, and how neighbours are resolved.
struct Scrub {
    pool: Vec<DmaBuf>,
    refused: u64,
    resolver: Option<fn(core::net::Ipv4Addr) -> Neighbour>,
}

impl<P: Platform> PlatformHost<P> {
    /// The host over `platform` whose lease memory is `pool` (the handles [`allocate_pool`] returned, or any
    /// DMA memory the service's pool lies in).
    pub fn new(platform: Arc<P>, mut pool: Vec<DmaBuf>) -> PlatformHost<P> {
        pool.sort_unstable_by_key(|b| b.addr());
        PlatformHost(platform, Scrub { pool, refused: 0, resolver: None })
    }

    /// Resolves ALLOC's `client_mac` 0 through `f` (the image's ARP on the ConnectX-5 port); without one the
    /// host answers [`Neighbour::Unsupported`].
    pub fn with_resolver(mut self, f: fn(core::net::Ipv4Addr) -> Neighbour) -> PlatformHost<P> {
        self.1.resolver = Some(f);
        self
    }

    /// Scrubs refused because their range was not inside the pool.
    pub fn scrubs_refused(&self) -> u64 {
        self.1.refused
    }
}

impl Scrub {
    /// The pieces of `[addr, addr + len)` as (pool handle, offset in it, length), in address order; `None`
    /// when some of the range is not inside the pool. Finding the first handle is a binary search.
    fn pieces(&self, addr: u64, len: u64) -> Option<Vec<(DmaBuf, usize, usize)>> {
        let end = addr.checked_add(len)?;
        let mut i = self.pool.partition_point(|b| b.addr() <= addr).checked_sub(1)?;
        let mut pieces = Vec::new();
        let mut at = addr;
        while at < end {
            let b = *self.pool.get(i)?;
            let b_end = b.addr() + b.len() as u64;
            if at < b.addr() || at >= b_end {
                return None;
            }
            let n = end.min(b_end) - at;
            pieces.push((b, usize::try_from(at - b.addr()).ok()?, usize::try_from(n).ok()?));
            at += n;
            i += 1;
        }
        Some(pieces)
    }
}

impl<P: Platform> Host for PlatformHost<P> {
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        self.0.dma_alloc(len, align)
    }
    fn dma_free(&mut self, buf: DmaBuf) {
        self.0.dma_free(buf)
    }
    /// Zeroes the range through the pool's handles; a range not wholly inside the pool is refused whole
    /// (nothing written), logged and counted ([`PlatformHost::scrubs_refused`]).
    fn zero(&mut self, addr: u64, len: u64) {
        let Some(pieces) = self.1.pieces(addr, len) else {
            self.1.refused += 1;
            log::error!("lease: scrub of {addr:#x}+{len:#x} refused: not inside the pool");
            return;
        };
        for (buf, offset, n) in pieces {
            self.0.dma_zero(buf, offset, n);
        }
    }
    fn now_us(&self) -> u64 {
        self.0.now_ns() / 1000
    }
    fn neighbour(&mut self, ip: core::net::Ipv4Addr) -> Neighbour {
        match self.1.resolver {
            Some(f) => f(ip),
            None => Neighbour::Unsupported(crate::service::NO_RESOLVER),
        }
    }
}

/// The GID table entry the lease QPs send from (the table starts empty; [`prepare`] writes it).
pub const LEASE_GID_INDEX: u8 = 0;

/// The lease QPs' CQ size (log2 entries).
const LEASE_CQ_LOG: u32 = 12;

/// The pool's extents: `lease_pool_mib=` is a number of these (docs/operations.md).
pub const POOL_EXTENT: u64 = 2 << 20;

/// The service's view of the HCA and its pool.
#[derive(Clone, Debug)]
pub struct LeaseParts {
    pub hca: HcaCtx,
    /// The pool's runs of device addresses (adjacent extents merged).
    pub pool: Vec<Range<u64>>,
    /// The pool's extents as DMA handles, for the host's scrubbing ([`PlatformHost::new`]).
    pub extents: Vec<DmaBuf>,
    /// Those of them that may hold data ([`uncleared`]): `Config::uncleared`.
    pub uncleared: Vec<u64>,
    pub rdma_ip: core::net::Ipv4Addr,
    /// The HCA's largest memory region in bytes (`2^log_max_mrw_sz`; [`Config::max_region`]).
    pub max_region: u64,
    /// Lease slots the HCA's caps allow ([`hca_slots`]).
    pub hca_slots: u32,
}

/// The heap one lease slot costs before it holds a lease, at most: its entry in the slot table and in the free
/// set (`service/tests.rs` checks it). A lease adds its extent list and its owner's name while it lives.
pub const SLOT_HEAP_BYTES: usize = 512;
/// Slots when neither `lease_slots=` nor a large pool asks for more (the default of small machines).
pub const DEFAULT_SLOTS: u32 = 1024;
/// The most slots a computed default gives (`lease_slots=`'s own limit).
pub const MAX_SLOTS: u32 = 1 << 20;
/// QPs, MKEYs and PDs the driver and the service keep for themselves (the Ethernet port's queues, the pool's
/// and the command interface's objects) and that leases may not count on. Generous: a ConnectX-5 reports
/// 2^24 MKEYs and PDs (docs/reference/mlx5.md §e.1, "Object counts").
pub const HCA_RESERVED_OBJECTS: u64 = 64;

/// Leases the HCA can hold at once: each takes one PD, one MKEY and one RC QP, so the fewest of
/// `2^log_max_qp`, `2^log_max_mkey` and `2^log_max_pd` (the caps the firmware reports, current values), less
/// [`HCA_RESERVED_OBJECTS`], at least 1.
pub fn hca_slots(log_max_qp: u8, log_max_mkey: u8, log_max_pd: u8) -> u32 {
    let n = [log_max_qp, log_max_mkey, log_max_pd]
        .into_iter()
        .map(|l| 1u64.checked_shl(u32::from(l.min(40))).unwrap_or(u64::MAX))
        .min()
        .unwrap_or(1);
    n.saturating_sub(HCA_RESERVED_OBJECTS).clamp(1, u64::from(MAX_SLOTS)) as u32
}

/// The slots when `lease_slots=` is absent: as many leases as the pool can hold (one extent each at the
/// least), but no fewer than [`DEFAULT_SLOTS`] (fenced and revoked leases hold slots too), and never more than
/// the HCA allows (`hca`: [`hca_slots`]).
pub fn default_slots(hca: u32, pool_bytes: u64, extent: u64) -> u32 {
    let by_pool = (pool_bytes / extent.max(1)).min(u64::from(MAX_SLOTS)) as u32;
    by_pool.max(DEFAULT_SLOTS).min(hca).max(1)
}

/// The slots the service runs with: `given` (`lease_slots=`) when there is one, no more than the HCA allows
/// (`hca`; a larger value is lowered to it, and the second value says so), else [`default_slots`] for a pool
/// of `pool_bytes`.
pub fn slots(given: Option<u32>, hca: u32, pool_bytes: u64) -> (u32, bool) {
    match given {
        Some(n) if n > hca => (hca, true),
        Some(n) => (n, false),
        None => (default_slots(hca, pool_bytes, POOL_EXTENT), false),
    }
}

/// `mib` MiB of DMA memory in [`POOL_EXTENT`]s wherever the platform has them, as handles in allocation order
/// ([`pool_runs`] merges them into runs of device addresses); nothing (every extent returned) when there are
/// fewer. The extents stay allocated until reboot. They are taken uncleared ([`Platform::dma_alloc_uncleared`]):
/// [`uncleared`] lists those the lease service must scrub before it first hands them out, which it does in
/// the background, so a large pool costs the boot nothing.
pub fn allocate_pool<P: Platform>(p: &P, mib: u32) -> Result<Vec<(DmaBuf, bool)>, String> {
    let want = (u64::from(mib) << 20) / POOL_EXTENT;
    let mut taken: Vec<(DmaBuf, bool)> = Vec::new();
    while (taken.len() as u64) < want {
        match p.dma_alloc_uncleared(POOL_EXTENT as usize, POOL_EXTENT as usize) {
            Some(b) => taken.push(b),
            None => {
                let have = taken.len() as u64 * (POOL_EXTENT >> 20);
                for (b, _) in taken {
                    p.dma_free(b);
                }
                return Err(format!("only {have} of {mib} MiB free for the lease pool (in 2 MiB extents)"));
            }
        }
    }
    Ok(taken)
}

/// The extents of [`allocate_pool`]'s answer that may hold data.
pub fn uncleared(extents: &[(DmaBuf, bool)]) -> Vec<u64> {
    extents.iter().filter(|e| !e.1).map(|e| e.0.addr()).collect()
}

/// The handles of [`allocate_pool`]'s answer.
pub fn handles(extents: &[(DmaBuf, bool)]) -> Vec<DmaBuf> {
    extents.iter().map(|e| e.0).collect()
}

/// The device-address runs of `extents`, adjacent ones (in the order given) merged.
pub fn pool_runs(extents: &[DmaBuf]) -> Vec<Range<u64>> {
    let mut runs: Vec<Range<u64>> = Vec::new();
    for b in extents {
        let (a, len) = (b.addr(), b.len() as u64);
        match runs.last_mut() {
            Some(r) if r.end == a => r.end += len,
            _ => runs.push(a..a + len),
        }
    }
    runs
}

/// On a driver that is up (before its engines are split off): the lease QPs' CQ (watched by the event
/// engine), RoCE on the port and a RoCEv2 GID for `rdma_ip` at [`LEASE_GID_INDEX`] (`Driver::roce_gid`: an InfiniBand port, no
/// RoCEv2 or a GID the firmware refuses is an error naming the fix), and the pool ([`allocate_pool`]).
#[allow(clippy::result_large_err)]
pub fn prepare<P: Platform>(
    d: &mut Driver<P>,
    o: &LeaseOptions,
    net_ip: Option<core::net::Ipv4Addr>,
) -> Result<LeaseParts, String> {
    let cq = d.create_cq(LEASE_CQ_LOG).map_err(|e| format!("lease CQ: {e}"))?;
    let cqn = cq.cqn;
    d.events.watch_cq(cq.cqn, cq.ring);
    let ip = o.rdma_ip.or(net_ip).unwrap_or(DEFAULT_RDMA_IP);
    // The lease QPs' `src_addr_index` is the entry written here and read back; nothing else is used.
    let gid_index = LEASE_GID_INDEX;
    let gid = d.roce_gid(gid_index.into(), ip.octets()).map_err(|e| format!("RoCE set-up for {ip}: {e}"))?;
    let taken = allocate_pool(d.platform().as_ref(), o.pool_mib)?;
    let extents = handles(&taken);
    let pool = pool_runs(&extents);
    let port_mtu = port_ib_mtu(d.info.mtu);
    let max_region = 1u64.checked_shl(d.info.caps.log_max_mrw_sz.into()).unwrap_or(u64::MAX);
    let caps = &d.info.caps;
    let hca_slots = hca_slots(caps.log_max_qp, caps.log_max_mkey, caps.log_max_pd);
    let (n_slots, lowered) = slots(o.slots, hca_slots, u64::from(o.pool_mib) << 20);
    if lowered {
        log::warn!(
            "lease: lease_slots= is more than the HCA's {hca_slots} (its QP, MKEY and PD caps): {n_slots} slots"
        );
    }
    log::info!(
        "lease: pool {} MiB in {} run(s) from {:#x}, largest lease {} MiB, {} slots (the HCA allows {hca_slots}), \
         CQ {cqn}, port IB MTU {}, \
         RDMA address {ip} (GID index {gid_index})",
        o.pool_mib,
        pool.len(),
        pool.first().map_or(0, |r| r.start),
        crate::config::max_lease(POOL_EXTENT, max_region).min(u64::from(o.pool_mib) << 20) >> 20,
        n_slots,
        128u32 << port_mtu,
    );
    let umr = umr_path(d);
    Ok(LeaseParts {
        hca: HcaCtx { uar: d.info.uar, cqn, gid, gid_index, mac: d.info.mac, port_mtu, qp: d.info.qp, umr },
        pool,
        extents,
        uncleared: uncleared(&taken),
        rdma_ip: ip,
        max_region,
        hca_slots,
    })
}

/// The UMR QP for the command engine, when the HCA's caps allow UMR revokes (docs/revoke-semantics.md, "The
/// UMR path"): made on the driver now and handed to the engine ([`leasebox_mlx5::engine::CommandEngine::attach_umr`]);
/// what it allows per direction. Without one (caps, or a set-up command that failed) every lease takes the
/// commands: [`UmrCtx::OFF`].
pub fn umr_path<P: Platform>(d: &mut Driver<P>) -> UmrCtx {
    let caps = leasebox_mlx5::ifc::umr::UmrCaps::from_general(&d.info.caps);
    match leasebox_mlx5::umr::UmrQp::create(d, caps, leasebox_mlx5::umr::DEFAULT_LOG_SQ_BBS) {
        Ok(qp) => {
            let ctx = UmrCtx::from_caps(&caps, qp.quarantine_pd());
            log::info!(
                "lease: UMR QP {} ready: grants {} (up to {} extents inline), revokes {}",
                qp.qpn(),
                if ctx.grant { "by UMR" } else { "by commands" },
                ctx.max_entries,
                if ctx.revoke { "by UMR" } else { "by commands" },
            );
            d.cmd.attach_umr(qp);
            ctx
        }
        Err(e) => {
            log::warn!("lease: no UMR ({e}): every lease takes the command path");
            UmrCtx::OFF
        }
    }
}

impl Config {
    /// The service's configuration from the lease options and the pool `prepare` set aside.
    pub fn from_options(o: &LeaseOptions, parts: &LeaseParts) -> Config {
        let slots = slots(o.slots, parts.hca_slots, parts.pool.iter().map(|r| r.end - r.start).sum()).0;
        Config {
            pool: parts.pool.clone(),
            max_region: parts.max_region,
            slots,
            // No more entries than leases can take at once (`options::MAX_WARM`).
            warm: o.warm.min(slots),
            tenant_leases: o.tenant_leases,
            tenant_bytes: o.tenant_mib.map_or(u64::MAX, |m| u64::from(m) << 20),
            tenants: o.tenants,
            tenant_allocs_per_s: o.tenant_allocs_per_s,
            default_ttl_ms: o.ttl_ms,
            max_ttl_ms: o.ttl_ms.max(3_600_000),
            ready_timeout_ms: u64::from(o.ready_ms),
            grace_ms: u64::from(o.grace_ms),
            session_grace_ms: u64::from(o.session_grace_ms),
            heartbeat_renews: o.heartbeat_renews,
            order: o.order,
            allow_order_override: o.allow_order_override,
            revoke_notices: o.revoke_notices,
            fence_test: o.fence_test,
            tclass: o.rdma_dscp << 2,
            eth_prio: o.rdma_prio,
            uncleared: parts.uncleared.clone(),
            ..Config::default()
        }
    }
}

/// The generator of the service's initial PSNs and MKEY variants, seeded from `entropy` (the CPU's
/// RDSEED/RDRAND in the image, the OS in the hosted appliance). Without entropy the lease service does not
/// start: there is no fallback seed.
pub fn identifiers<E: Entropy + ?Sized>(entropy: &mut E) -> Result<IdRng, String> {
    IdRng::from_entropy(entropy).map_err(|_| {
        String::from("no random source for lease identifiers (initial PSNs, MKEY variants): RDSEED/RDRAND or the OS's")
    })
}

/// The line a host logs when `fence_test=on` cannot take effect.
pub fn fence_test_warning(o: &LeaseOptions) -> Option<String> {
    (o.fence_test && !cfg!(feature = "fence-test"))
        .then(|| String::from("fence_test=on is ignored: built without the `fence-test` feature"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasebox_mlx5::testing::Fake;
    use leasebox_session::EntropyError;

    #[test]
    fn slots_follow_the_hca_caps_and_the_pool() {
        // The model's current caps: log_max_qp 14, log_max_mkey 24, log_max_pd 24: the QPs are the limit.
        assert_eq!(hca_slots(14, 24, 24), 16384 - 64);
        assert_eq!(hca_slots(24, 10, 24), 1024 - 64, "MKEYs the limit");
        assert_eq!(hca_slots(24, 24, 6), 1, "nothing left after the reserve: one slot, not none");
        assert_eq!(hca_slots(63, 63, 63), MAX_SLOTS, "no shift overflow; capped");
        let hca = hca_slots(14, 24, 24);
        // A small pool keeps the default; a large one gets a slot per extent; the HCA caps both.
        assert_eq!(default_slots(hca, 64 << 20, POOL_EXTENT), DEFAULT_SLOTS);
        assert_eq!(default_slots(hca, 8 << 30, POOL_EXTENT), 4096);
        assert_eq!(default_slots(hca, 1 << 40, POOL_EXTENT), hca);
        assert_eq!(default_slots(100, 0, POOL_EXTENT), 100, "an HCA below the default");
        assert_eq!(default_slots(hca, u64::MAX, 0), hca, "no division by zero");
        // lease_slots= wins, but never past the HCA.
        assert_eq!(slots(Some(10), hca, 0), (10, false));
        assert_eq!(slots(Some(1 << 20), hca, 0), (hca, true));
        assert_eq!(slots(None, hca, 8 << 30), (4096, false));
    }

    struct NoEntropy;
    impl Entropy for NoEntropy {
        fn fill(&mut self, _: &mut [u8]) -> Result<(), EntropyError> {
            Err(EntropyError)
        }
    }

    #[test]
    fn no_entropy_no_lease_service() {
        let e = identifiers(&mut NoEntropy).unwrap_err();
        assert!(e.contains("no random source"), "{e}");
    }

    /// The driver's test platform handing out `addrs` as the pool's extents, in order, then nothing.
    fn extents(addrs: &[u64]) -> Fake {
        let p = Fake::new();
        p.script_allocations(addrs.iter().copied());
        p
    }

    fn freed(p: &Fake) -> Vec<u64> {
        assert_eq!(p.take_faults(), 0, "a free of a handle the platform did not hand out, or a double free");
        p.freed().iter().map(|b| b.addr()).collect()
    }

    const M: u64 = 1 << 20;

    #[test]
    fn the_pool_is_built_from_extents_wherever_they_are() {
        let p = extents(&[64 * M, 66 * M, 70 * M, 4096 * M, 4098 * M, 100 * M]);
        let extents = handles(&allocate_pool(&p, 10).unwrap());
        assert!(p.allocated().iter().all(|b| b.len() == POOL_EXTENT as usize), "extents of POOL_EXTENT bytes");
        let addrs: Vec<u64> = extents.iter().map(|b| b.addr()).collect();
        assert_eq!(addrs, [64 * M, 66 * M, 70 * M, 4096 * M, 4098 * M]);
        assert_eq!(pool_runs(&extents), [64 * M..68 * M, 70 * M..72 * M, 4096 * M..4100 * M]);
        assert!(freed(&p).is_empty());
    }

    #[test]
    fn a_pool_that_does_not_fit_returns_every_extent_and_says_how_much_there_was() {
        let p = extents(&[64 * M, 66 * M, 80 * M]);
        let e = allocate_pool(&p, 8).unwrap_err();
        assert_eq!(e, "only 6 of 8 MiB free for the lease pool (in 2 MiB extents)");
        let mut freed = freed(&p);
        freed.sort();
        assert_eq!(freed, [64 * M, 66 * M, 80 * M]);
    }

    /// The writes a scrub of `[addr, addr + len)` makes through a host over a pool at 64..68 and 70..72 MiB
    /// (handed out in another order); `None` when the host refused it.
    fn scrub(addr: u64, len: u64) -> Option<Vec<(u64, usize, usize)>> {
        let p = Arc::new(extents(&[70 * M, 66 * M, 64 * M]));
        let extents = handles(&allocate_pool(p.as_ref(), 6).unwrap());
        // Non-zero memory, so that what the scrub leaves can be read back as zeros.
        for b in &extents {
            p.mem_write(b.addr(), &vec![0xa5; b.len()]);
        }
        p.record_dma_writes();
        let mut host = PlatformHost::new(p.clone(), extents);
        host.zero(addr, len);
        let writes: Vec<(u64, usize, usize)> = p.dma_writes().iter().map(|&(b, off, n)| (b.addr(), off, n)).collect();
        for &(base, off, n) in &writes {
            let mut back = vec![0xffu8; n];
            p.mem_read(base + off as u64, &mut back);
            assert!(back.iter().all(|&b| b == 0), "zeros written at {:#x}+{off:#x}", base);
        }
        match host.scrubs_refused() {
            0 => Some(writes),
            _ => {
                assert!(writes.is_empty(), "a refused scrub writes nothing");
                None
            }
        }
    }

    #[test]
    fn a_scrub_writes_zeros_through_the_pool_handles_it_lies_in() {
        let w = scrub(66 * M, 2 * M).unwrap();
        assert_eq!(w.len(), 512, "4 KiB writes");
        assert!(
            w.iter().enumerate().all(|(i, &w)| w == (66 * M, i * 4096, 4096)),
            "in order, at offsets of the handle"
        );
        // Across two adjacent extents, and not starting at an extent.
        let w = scrub(66 * M - 4096, 8192).unwrap();
        assert_eq!(w, [(64 * M, 2 * M as usize - 4096, 4096), (66 * M, 0, 4096)]);
        let w = scrub(70 * M + 100, 10).unwrap();
        assert_eq!(w, [(70 * M, 100, 10)]);
    }

    #[test]
    fn a_scrub_not_inside_the_pool_is_refused_whole() {
        assert_eq!(scrub(68 * M, 4096), None, "the gap between the runs");
        assert_eq!(scrub(68 * M - 4096, 8192), None, "from the pool into the gap");
        assert_eq!(scrub(72 * M - 4096, 8192), None, "past the pool's end");
        assert_eq!(scrub(62 * M, 4096), None, "below the pool");
        assert_eq!(scrub(u64::MAX - 10, 100), None, "a range that overflows");
    }
}
