//! What a lease does next, as pure functions: [`next`] picks the next step from the stage, what exists on the
//! HCA and which steps were tried and failed (no HCA, no clock), and [`command`] turns a step into its HCA
//! command. The service only records results and follows the answer.
//!
//! Revocation (`docs/revoke-semantics.md`): the immediate phase runs every cut its order names even after one
//! failed — a failed 2ERR_QP in qp-first order still destroys the MKEY, a failed DESTROY_MKEY in mkey-first
//! order moves the QP to ERR (the fallback fence); it fences when a cut failed. The sweep and the unwinding of a failed ALLOC stop at the first failure and fence.

use leasebox_mlx5::command::Command;
use leasebox_mlx5::handles::{MkeyIndex, Qpn};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::{MkeyAccess, MkeyParams};
use leasebox_mlx5::ifc::qp::{Mtu, QpAccess, QpBase, RcPeer, RcQpParams, RtsParams};
use leasebox_proto::access;

use super::HcaCtx;
use crate::config::RevokeOrder;
use crate::lease::{Lease, Step};

/// Which plan a lease follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// ALLOC: PD, MKEY, QP and its transitions to RTS.
    Build,
    /// The immediate phase of FREE, REVOKE or expiry, in the given order.
    Revoke(RevokeOrder),
    /// The deferred sweep.
    Sweep,
    /// Undoing a failed ALLOC.
    Unwind,
}

/// A set of steps, one bit per [`Step`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Steps(u16);

impl Steps {
    pub fn has(self, s: Step) -> bool {
        self.0 & (1 << s as u16) != 0
    }

    pub fn insert(&mut self, s: Step) {
        self.0 |= 1 << s as u16;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set less `s`.
    pub fn without(self, s: Step) -> Steps {
        Steps(self.0 & !(1 << s as u16))
    }
}

/// What [`next`] needs to know about a lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub pd: bool,
    pub mkey: bool,
    pub qp: bool,
    /// The QP is known to be in ERR.
    pub qp_in_err: bool,
    /// Built from the warm pool: PD, QP in INIT and a free UMR-enabled key exist; the build grants the key.
    pub warm: bool,
    /// The key may be revoked by a UMR work request (a warm key, and the caps allow UMR revokes).
    pub umr_revoke: bool,
    /// The key was set free by a UMR revoke (it reaches nothing).
    pub key_free: bool,
    /// The sweep resets the QP back to INIT for the warm pool instead of destroying everything.
    pub recycle: bool,
    /// Steps of the current stage tried so far, and those of them that failed.
    pub tried: Steps,
    pub failed: Steps,
}

/// What a lease does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Issue this step's command.
    Issue(Step),
    /// The stage is over and nothing failed that matters: Build grants, Revoke answers TornDown, Sweep and
    /// Unwind release the slot.
    Done,
    /// A build step failed: undo what exists.
    Unwind,
    /// Fence the slot for good (Revoke answers Fenced).
    Fence,
}

const BUILD: [Step; 6] =
    [Step::AllocPd, Step::CreateMkey, Step::CreateQp, Step::Rst2Init, Step::Init2Rtr, Step::Rtr2Rts];
/// ALLOC on a warm entry: one UMR work request and the two transitions that carry the client's QPN, PSN and
/// path (no work request changes a QP's state).
const WARM_BUILD: [Step; 3] = [Step::UmrGrant, Step::Init2Rtr, Step::Rtr2Rts];
/// A UMR revoke comes first where it applies; DESTROY_MKEY only when it failed (or does not apply).
const MKEY_FIRST: [Step; 3] = [Step::UmrRevoke, Step::DestroyMkey, Step::Qp2Err];
const QP_FIRST: [Step; 3] = [Step::Qp2Err, Step::UmrRevoke, Step::DestroyMkey];
const TEARDOWN: [Step; 5] = [Step::Qp2Err, Step::Qp2Rst, Step::DestroyQp, Step::DestroyMkey, Step::DeallocPd];
/// The sweep of a lease whose key a UMR revoke set free: the QP back to INIT, everything to the warm pool.
const RECYCLE: [Step; 3] = [Step::Qp2Err, Step::Qp2Rst, Step::Rst2Init];

/// The next step of `stage` for a lease in state `v`.
pub fn next(stage: Stage, v: &View) -> Next {
    let first = |steps: &[Step], wanted: &dyn Fn(Step) -> bool| {
        steps.iter().copied().find(|&s| !v.tried.has(s) && wanted(s)).map_or(Next::Done, Next::Issue)
    };
    match stage {
        Stage::Build if !v.failed.is_empty() => Next::Unwind,
        Stage::Build if v.warm => first(&WARM_BUILD, &|_| true),
        Stage::Build => first(&BUILD, &|_| true),
        Stage::Revoke(order) => {
            let steps = match order {
                RevokeOrder::MkeyFirst => &MKEY_FIRST,
                RevokeOrder::QpFirst => &QP_FIRST,
            };
            let qp_cut = order == RevokeOrder::QpFirst || v.failed.has(Step::DestroyMkey);
            let live_key = v.mkey && !v.key_free;
            match first(steps, &|s| match s {
                Step::UmrRevoke => v.umr_revoke && live_key,
                // The fallback of a UMR revoke that failed (its key's state is unknown: destroy it).
                Step::DestroyMkey => live_key && (!v.umr_revoke || v.failed.has(Step::UmrRevoke)),
                Step::Qp2Err => qp_cut && v.qp && !v.qp_in_err,
                _ => false,
            }) {
                // A failed UMR revoke whose DESTROY_MKEY succeeded cut the key all the same.
                Next::Done if !v.failed.without(Step::UmrRevoke).is_empty() => Next::Fence,
                n => n,
            }
        }
        Stage::Sweep | Stage::Unwind if !v.failed.is_empty() => Next::Fence,
        Stage::Sweep if v.recycle => first(&RECYCLE, &|s| match s {
            Step::Qp2Err => v.qp && !v.qp_in_err,
            Step::Qp2Rst | Step::Rst2Init => v.qp,
            _ => false,
        }),
        Stage::Sweep | Stage::Unwind => first(&TEARDOWN, &|s| match s {
            // The sweep moves the QP to ERR unless it is there; an unwind resets it straight away (it never
            // reached RTS).
            Step::Qp2Err => stage == Stage::Sweep && v.qp && !v.qp_in_err,
            Step::Qp2Rst | Step::DestroyQp => v.qp,
            Step::DestroyMkey => v.mkey,
            Step::DeallocPd => v.pd,
            _ => false,
        }),
    }
}

/// QP work-queue buffer: zero-length RQ, 64 WQEBBs of SQ (the appliance never posts; the QP only responds).
pub(super) const QP_LOG_SQ: u8 = 6;
/// log2 of the RDMA READs/atomics a lease QP accepts in flight (16, as a Linux responder is commonly set up),
/// bounded by `cmd_hca_cap.log_max_ra_res_qp`. The lease QPs never read, so `log_sra_max` is 0.
pub(super) const QP_LOG_RRA: u8 = 4;
pub(super) const QP_BUF: usize = 64 << QP_LOG_SQ;
pub(super) const QP_DBR: usize = 64;
/// The mkey index FENCE-TEST writes before DESTROY_MKEY (docs/reference/revoke-spec.md §2.3).
pub const FENCE_TEST_MKEY_INDEX: u32 = 0x00ff_ffff;

/// What [`command`] needs beyond the lease: the HCA's objects and the service's settings.
#[derive(Clone, Copy, Debug)]
pub struct CmdCtx {
    pub hca: HcaCtx,
    /// The MKEY variant a CREATE_MKEY uses.
    pub variant: u8,
    pub extent_log: u8,
    /// `ack_timeout`, `retry_count`, `rnr_retry` of the lease QPs.
    pub timers: (u8, u8, u8),
    /// FENCE-TEST: the immediate phase's DESTROY_MKEY names a bad index.
    pub fence_test: bool,
    /// The lease QPs' traffic class byte and 802.1p priority (`Config::tclass`, `Config::eth_prio`).
    pub tclass: u8,
    pub eth_prio: u8,
}

/// RST2INIT of a warm QP: remote read and write, and atomics where the HCA does them; the key granted later
/// narrows this to the lease's access.
pub(super) fn warm_rst2init(b: &QpBase, hca: &HcaCtx) -> Command {
    let qa = QpAccess { remote_read: true, remote_write: true, remote_atomic: hca.qp.atomics_refused().is_none() };
    ifc::qp::rst2init(b, qa, hca.qp.atomic_mode)
}

fn qp_base<T>(l: &Lease<T>, hca: &HcaCtx) -> Option<QpBase> {
    Some(QpBase { qpn: l.qpn?, pd: l.pd?, cqn_snd: hca.cqn, cqn_rcv: hca.cqn })
}

/// The HCA command of `step` for lease `l` in `slot` during `stage`, naming the slot for error reports; `None`
/// when the object it needs is gone.
pub fn command<T>(step: Step, stage: Stage, l: &Lease<T>, slot: u32, c: &CmdCtx) -> Option<Command> {
    let hca = &c.hca;
    let remote = |bit| l.access & bit != 0;
    let cmd = match step {
        Step::AllocPd => Some(ifc::resources::alloc_pd()),
        Step::CreateMkey => {
            let mut a = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE;
            if remote(access::REMOTE_READ) {
                a = a | MkeyAccess::REMOTE_READ;
            }
            if remote(access::REMOTE_WRITE) {
                a = a | MkeyAccess::REMOTE_WRITE;
            }
            if remote(access::REMOTE_ATOMIC) {
                a = a | MkeyAccess::ATOMIC;
            }
            l.pd.map(|pd| {
                ifc::mkey::create_mkey_mtt(&MkeyParams {
                    pd,
                    variant: c.variant,
                    start: l.extents[0],
                    len: l.size,
                    access: a,
                    log_page_size: c.extent_log,
                    pages: &l.extents,
                })
            })
        }
        Step::CreateQp => l.pd.map(|pd| {
            ifc::qp::create_rc_qp(&RcQpParams {
                pd,
                uar_page: hca.uar,
                cqn_snd: hca.cqn,
                cqn_rcv: hca.cqn,
                log_rq_size: None,
                log_rq_stride: 0,
                log_sq_size: QP_LOG_SQ,
                log_msg_max: hca.qp.log_msg_max,
                ts_format: hca.qp.ts_format,
                user_index: hca.qp.user_index,
                log_page_size: 0,
                dbr_addr: l.qp_dbr.addr(),
                pages: &[l.qp_buf.addr()],
            })
        }),
        // A warm QP (recycled by the sweep) waits in INIT for any lease: its access is the widest, and the
        // key's own access bits (set by the grant) decide what a client may do.
        Step::Rst2Init if stage == Stage::Sweep => qp_base(l, hca).map(|b| warm_rst2init(&b, hca)),
        Step::Rst2Init => qp_base(l, hca).map(|b| {
            let qa = QpAccess {
                remote_read: remote(access::REMOTE_READ),
                remote_write: remote(access::REMOTE_WRITE),
                remote_atomic: remote(access::REMOTE_ATOMIC),
            };
            ifc::qp::rst2init(&b, qa, hca.qp.atomic_mode)
        }),
        Step::Init2Rtr => qp_base(l, hca).map(|b| {
            let peer = RcPeer {
                qpn: Qpn(l.client_qpn),
                psn: l.client_psn,
                gid: l.client_gid,
                mac: l.client_mac,
                mtu: Mtu::from_raw(l.mtu).unwrap_or(Mtu::Mtu1024),
                sgid_index: hca.gid_index,
                hop_limit: 64,
                udp_sport: ifc::qp::roce_udp_sport(b.qpn, Qpn(l.client_qpn)),
                tclass: c.tclass,
                eth_prio: c.eth_prio,
                log_rra_max: QP_LOG_RRA.min(hca.qp.log_max_ra_res),
                min_rnr_nak: 12,
            };
            ifc::qp::init2rtr(&b, &peer, hca.qp.log_msg_max)
        }),
        Step::Rtr2Rts => qp_base(l, hca).map(|b| {
            let (ack_timeout, retry_count, rnr_retry) = c.timers;
            ifc::qp::rtr2rts(&b, &RtsParams { psn: l.server_psn, ack_timeout, retry_count, rnr_retry, log_sra_max: 0 })
        }),
        Step::DestroyMkey => l.mkey.map(|k| {
            let revoking = matches!(stage, Stage::Revoke(_));
            let index = if cfg!(feature = "fence-test") && c.fence_test && revoking {
                MkeyIndex(FENCE_TEST_MKEY_INDEX)
            } else {
                k.index()
            };
            ifc::mkey::destroy_mkey(index)
        }),
        Step::Qp2Err => l.qpn.map(ifc::qp::qp_2err),
        Step::Qp2Rst => l.qpn.map(ifc::qp::qp_2rst),
        Step::DestroyQp => l.qpn.map(ifc::qp::destroy_qp),
        Step::DeallocPd => l.pd.map(ifc::resources::dealloc_pd),
        // Work requests, not commands (`LeaseService::umr_work`).
        Step::UmrGrant | Step::UmrRevoke => None,
    };
    cmd.map(|cmd| cmd.with("slot", u64::from(slot)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `stage` from `v` to its end, failing the steps in `fail`: the steps issued and the end.
    fn run(stage: Stage, mut v: View, fail: &[Step]) -> (alloc::vec::Vec<Step>, Next) {
        let mut issued = alloc::vec::Vec::new();
        loop {
            match next(stage, &v) {
                Next::Issue(s) => {
                    assert!(issued.len() < 16, "a plan that never ends: {issued:?}");
                    issued.push(s);
                    v.tried.insert(s);
                    if fail.contains(&s) {
                        v.failed.insert(s);
                        continue;
                    }
                    match s {
                        Step::AllocPd => v.pd = true,
                        Step::CreateMkey => v.mkey = true,
                        Step::CreateQp => v.qp = true,
                        Step::DestroyMkey => v.mkey = false,
                        Step::Qp2Err => v.qp_in_err = true,
                        Step::DestroyQp => v.qp = false,
                        Step::DeallocPd => v.pd = false,
                        _ => {}
                    }
                }
                end => return (issued, end),
            }
        }
    }

    fn built() -> View {
        View { pd: true, mkey: true, qp: true, ..View::default() }
    }

    use Step::*;
    const MKEY: Stage = Stage::Revoke(RevokeOrder::MkeyFirst);
    const QP: Stage = Stage::Revoke(RevokeOrder::QpFirst);

    #[test]
    fn build_runs_in_order_and_a_failure_unwinds() {
        let (steps, end) = run(Stage::Build, View::default(), &[]);
        assert_eq!((steps.as_slice(), end), (&BUILD[..], Next::Done));
        let (steps, end) = run(Stage::Build, View::default(), &[CreateQp]);
        assert_eq!((steps.as_slice(), end), (&[AllocPd, CreateMkey, CreateQp][..], Next::Unwind));
    }

    #[test]
    fn mkey_first_cuts_the_key_and_leaves_the_qp() {
        assert_eq!(run(MKEY, built(), &[]), (vec![DestroyMkey], Next::Done));
    }

    #[test]
    fn a_failed_destroy_mkey_falls_back_to_2err_and_fences() {
        assert_eq!(run(MKEY, built(), &[DestroyMkey]), (vec![DestroyMkey, Qp2Err], Next::Fence));
        // Both cuts failed: still fenced, both tried.
        assert_eq!(run(MKEY, built(), &[DestroyMkey, Qp2Err]), (vec![DestroyMkey, Qp2Err], Next::Fence));
    }

    #[test]
    fn qp_first_runs_destroy_mkey_even_after_a_failed_2err() {
        assert_eq!(run(QP, built(), &[]), (vec![Qp2Err, DestroyMkey], Next::Done));
        assert_eq!(run(QP, built(), &[Qp2Err]), (vec![Qp2Err, DestroyMkey], Next::Fence));
        assert_eq!(run(QP, built(), &[Qp2Err, DestroyMkey]), (vec![Qp2Err, DestroyMkey], Next::Fence));
    }

    #[test]
    fn an_abandoned_build_cuts_only_what_exists() {
        // Revoked before CREATE_MKEY answered: nothing can reach the memory.
        let v = View { pd: true, ..View::default() };
        assert_eq!(run(MKEY, v, &[]), (vec![], Next::Done));
        assert_eq!(run(QP, v, &[]), (vec![], Next::Done));
        let v = View { pd: true, mkey: true, ..View::default() };
        assert_eq!(run(QP, v, &[]), (vec![DestroyMkey], Next::Done));
    }

    #[test]
    fn the_sweep_and_the_unwind_stop_at_the_first_failure() {
        let after_mkey_first = View { mkey: false, ..built() };
        assert_eq!(run(Stage::Sweep, after_mkey_first, &[]), (vec![Qp2Err, Qp2Rst, DestroyQp, DeallocPd], Next::Done));
        let after_qp_first = View { mkey: false, qp_in_err: true, ..built() };
        assert_eq!(run(Stage::Sweep, after_qp_first, &[]), (vec![Qp2Rst, DestroyQp, DeallocPd], Next::Done));
        assert_eq!(run(Stage::Sweep, after_qp_first, &[Qp2Rst]), (vec![Qp2Rst], Next::Fence));
        assert_eq!(run(Stage::Unwind, built(), &[]), (vec![Qp2Rst, DestroyQp, DestroyMkey, DeallocPd], Next::Done));
        assert_eq!(run(Stage::Unwind, built(), &[DestroyQp]), (vec![Qp2Rst, DestroyQp], Next::Fence));
    }
}
