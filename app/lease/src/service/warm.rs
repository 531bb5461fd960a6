//! The warm pool (docs/revoke-semantics.md, "The UMR path"): entries of a PD, an RC QP in INIT and a free
//! UMR-enabled MTT key (in the UMR QP's quarantine PD, room for `UmrCtx::max_entries` extents), made ahead of
//! the ALLOCs that take them. An ALLOC on a warm entry is one UMR grant and two commands (INIT2RTR, RTR2RTS)
//! instead of six commands; the sweep of a lease whose key a UMR revoke set free resets its QP to INIT and
//! gives the entry back.
//!
//! Entries are built lazily by the timer scan (`LeaseService::tick`), never on the request path and not at
//! boot, so neither grows with the pool: at most [`FILL_PARALLEL`] at a time, four commands each (ALLOC_PD,
//! CREATE_MKEY, CREATE_QP, RST2INIT), until `Config::warm` are ready. A build step that fails stops the
//! entry; what it made is destroyed in reverse, and after [`FILL_FAILURES_MAX`] failures the pool stops
//! filling until reboot (ALLOCs then take the commands).

use alloc::collections::{BTreeMap, VecDeque};

use leasebox_mlx5::DmaBuf;
use leasebox_mlx5::command::{CmdError, Output};
use leasebox_mlx5::handles::{Mkey, Pdn, Qpn};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::qp::{QpBase, RcQpParams};

use super::plan::{QP_BUF, QP_DBR, QP_LOG_SQ, warm_rst2init};
use super::{Host, LeaseService, SEQ_MAX, tag_of};
use crate::lease::{Lease, Step};

/// Tags of warm-pool commands name a "slot" from here up (lease slots stay below `setup::MAX_SLOTS`).
pub(super) const FILL_SLOT_BASE: u32 = 0x8000_0000;
/// Entries built at once.
pub(super) const FILL_PARALLEL: usize = 2;
/// Failed builds after which the pool stops filling.
pub(super) const FILL_FAILURES_MAX: u32 = 8;

/// A ready entry: PD, QP in INIT with the widest access, a free UMR key in the quarantine PD.
#[derive(Clone, Copy, Debug)]
pub(super) struct Warm {
    pub pd: Pdn,
    pub mkey: Mkey,
    pub qpn: Qpn,
    pub qp_buf: DmaBuf,
    pub qp_dbr: DmaBuf,
}

/// The entry a lease holds, when it holds a whole one.
pub(super) fn entry_of<T>(l: &Lease<T>) -> Option<Warm> {
    let (Some(pd), Some(mkey), Some(qpn)) = (l.pd, l.mkey, l.qpn) else { return None };
    Some(Warm { pd, mkey, qpn, qp_buf: l.qp_buf, qp_dbr: l.qp_dbr })
}

/// An entry being built (or, after a failure, undone).
struct Fill {
    pd: Option<Pdn>,
    mkey: Option<Mkey>,
    qpn: Option<Qpn>,
    qp_buf: DmaBuf,
    qp_dbr: DmaBuf,
    /// The command in flight: its tag and step.
    in_flight: Option<(u64, Step)>,
    /// A step failed: destroying what exists.
    undoing: bool,
}

#[derive(Default)]
pub(super) struct WarmPool {
    ready: VecDeque<Warm>,
    fills: BTreeMap<u32, Fill>,
    next_fill: u32,
    failures: u32,
}

impl WarmPool {
    pub fn ready(&self) -> usize {
        self.ready.len()
    }
}

impl<T: Copy> LeaseService<T> {
    /// Whether an ALLOC of `extents` extents with `access` can take a warm entry.
    pub(super) fn warm_fits(&self, extents: usize, access: u8) -> bool {
        let umr = &self.hca.umr;
        self.paths().grant_umr
            && extents <= umr.max_entries
            && (access & leasebox_proto::access::REMOTE_ATOMIC == 0 || umr.atomic)
    }

    /// Takes a ready entry, if there is one.
    pub(super) fn take_warm(&mut self) -> Option<Warm> {
        self.warm.ready.pop_front()
    }

    /// The sweep of a lease ended with its QP back in INIT and its key free: its entry goes back to the pool.
    pub(super) fn give_back(&mut self, w: Warm) -> bool {
        self.warm.ready.push_back(w);
        self.counters.warm_recycled += 1;
        true
    }

    /// Whether a revoked lease's sweep should recycle its objects: the pool has room for them.
    pub(super) fn warm_wants(&self) -> bool {
        self.paths().grant_umr && self.warm.ready.len() < 2 * self.cfg.warm as usize
    }

    /// Starts building entries until `Config::warm` are ready or being built (the timer scan calls it).
    pub(super) fn fill_warm(&mut self, host: &mut dyn Host) {
        if !self.paths().grant_umr || self.warm.failures >= FILL_FAILURES_MAX {
            return;
        }
        while self.warm.ready.len() + self.warm.fills.len() < self.cfg.warm as usize
            && self.warm.fills.len() < FILL_PARALLEL
        {
            let qp_buf = host.dma_alloc(QP_BUF, 4096);
            let qp_dbr = host.dma_alloc(QP_DBR, 64);
            let (Some(qp_buf), Some(qp_dbr)) = (qp_buf, qp_dbr) else {
                for b in [qp_buf, qp_dbr].into_iter().flatten() {
                    host.dma_free(b);
                }
                return;
            };
            let id = self.warm.next_fill;
            self.warm.next_fill = (self.warm.next_fill + 1) % (u32::MAX - FILL_SLOT_BASE);
            let f = Fill { pd: None, mkey: None, qpn: None, qp_buf, qp_dbr, in_flight: None, undoing: false };
            self.warm.fills.insert(id, f);
            self.fill_next(id, host);
        }
    }

    /// Issues entry `id`'s next command, or finishes it.
    fn fill_next(&mut self, id: u32, host: &mut dyn Host) {
        let umr = self.hca.umr;
        let extent_log = self.cfg.extent.trailing_zeros() as u8;
        let Some(f) = self.warm.fills.get_mut(&id) else { return };
        let base = |f: &Fill| {
            f.qpn.zip(f.pd).map(|(qpn, pd)| QpBase { qpn, pd, cqn_snd: self.hca.cqn, cqn_rcv: self.hca.cqn })
        };
        let (step, cmd) = if f.undoing {
            match (f.qpn, f.mkey, f.pd) {
                (Some(q), _, _) => (Step::DestroyQp, ifc::qp::destroy_qp(q)),
                (None, Some(k), _) => (Step::DestroyMkey, ifc::mkey::destroy_mkey(k.index())),
                (None, None, Some(pd)) => (Step::DeallocPd, ifc::resources::dealloc_pd(pd)),
                (None, None, None) => {
                    if let Some(f) = self.warm.fills.remove(&id) {
                        host.dma_free(f.qp_buf);
                        host.dma_free(f.qp_dbr);
                    }
                    return;
                }
            }
        } else {
            match (f.pd, f.mkey, f.qpn) {
                (None, _, _) => (Step::AllocPd, ifc::resources::alloc_pd()),
                (Some(_), None, _) => {
                    // The variant is replaced by the first grant; drawn all the same, so no key is predictable.
                    let v = self.ids.variant();
                    f.mkey = Some(Mkey::new(leasebox_mlx5::handles::MkeyIndex(0), v));
                    (
                        Step::CreateMkey,
                        ifc::mkey::create_mkey_umr_free(umr.quarantine_pd, v, umr.max_entries, extent_log, false),
                    )
                }
                (Some(pd), Some(_), None) => (
                    Step::CreateQp,
                    ifc::qp::create_rc_qp(&RcQpParams {
                        pd,
                        uar_page: self.hca.uar,
                        cqn_snd: self.hca.cqn,
                        cqn_rcv: self.hca.cqn,
                        log_rq_size: None,
                        log_rq_stride: 0,
                        log_sq_size: QP_LOG_SQ,
                        log_msg_max: self.hca.qp.log_msg_max,
                        ts_format: self.hca.qp.ts_format,
                        user_index: self.hca.qp.user_index,
                        log_page_size: 0,
                        dbr_addr: f.qp_dbr.addr(),
                        pages: &[f.qp_buf.addr()],
                    }),
                ),
                (Some(_), Some(_), Some(_)) => match base(f) {
                    Some(b) => (Step::Rst2Init, warm_rst2init(&b, &self.hca)),
                    None => return,
                },
            }
        };
        let tag = tag_of(self.next_seq, FILL_SLOT_BASE + id);
        self.next_seq = self.next_seq % SEQ_MAX + 1;
        f.in_flight = Some((tag, step));
        self.in_flight += 1;
        self.counters.commands += 1;
        self.counters.warm_commands += 1;
        self.outbox.push_back((tag, cmd.with("warm", u64::from(id))));
    }

    /// A warm-pool command finished.
    pub(super) fn fill_done(&mut self, tag: u64, result: Result<Output, CmdError>, host: &mut dyn Host) {
        let id = super::tag_slot(tag) - FILL_SLOT_BASE;
        let Some(f) = self.warm.fills.get_mut(&id) else { return };
        let Some((t, step)) = f.in_flight.take() else { return };
        if t != tag {
            f.in_flight = Some((t, step));
            return;
        }
        match result {
            Ok(out) => match step {
                Step::AllocPd => f.pd = Some(ifc::resources::parse_alloc_pd(&out)),
                Step::CreateMkey => {
                    let v = f.mkey.map_or(0, |k| k.variant());
                    let key = ifc::mkey::create_mkey_out_key(&out, v);
                    self.ids.created(key.index().raw(), v);
                    f.mkey = Some(key);
                }
                Step::CreateQp => f.qpn = Some(ifc::qp::create_qp_out(&out)),
                Step::Rst2Init => {
                    if let Some(f) = self.warm.fills.remove(&id)
                        && let (Some(pd), Some(mkey), Some(qpn)) = (f.pd, f.mkey, f.qpn)
                    {
                        self.warm.ready.push_back(Warm { pd, mkey, qpn, qp_buf: f.qp_buf, qp_dbr: f.qp_dbr });
                        self.counters.warm_built += 1;
                    }
                    return;
                }
                Step::DestroyQp => f.qpn = None,
                Step::DestroyMkey => f.mkey = None,
                Step::DeallocPd => f.pd = None,
                _ => {}
            },
            Err(e) if f.undoing => {
                // Undoing failed: the objects are left as they are (they reach no memory: the key is free in the
                // quarantine PD with no translation, the QP never left INIT), and so is the entry's DMA memory,
                // which the QP may still name.
                log::warn!("lease: warm entry {id}: undo: {e}; its objects are left");
                self.warm.fills.remove(&id);
                return;
            }
            Err(e) => {
                if step == Step::CreateMkey {
                    f.mkey = None;
                }
                log::warn!("lease: warm entry {id}: {e}; undone");
                f.undoing = true;
                self.warm.failures += 1;
                self.counters.warm_failed += 1;
                self.counters.failed_commands += 1;
            }
        }
        self.fill_next(id, host);
    }
}
