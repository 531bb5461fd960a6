//! One lease slot: its identity (index + generation), what it holds on the HCA, where it is in its life
//! cycle, and — once something failed — why it is fenced.

use alloc::string::String;
use alloc::vec::Vec;

use leasebox_mlx5::DmaBuf;
use leasebox_mlx5::handles::{Mkey, Pdn, Qpn};
use leasebox_proto::{LeaseId, LeaseState};

use crate::config::RevokeOrder;
use crate::service::plan::Steps;

/// Teardown steps, as bits of a fenced slot's failed-step mask (FENCED_SUMMARY `failed_mask`). Bits 2 (0x004)
/// and 3 (0x008) are reserved and never set: they were SET DROP and DELETE DROP of the removed `flow_drop`
/// option (docs/revoke-semantics.md, "Why there is no flow-table DROP"); no other bit moved.
pub mod step_bit {
    pub const DESTROY_MKEY: u32 = 1 << 0;
    pub const QP_2ERR: u32 = 1 << 1;
    pub const QP_2RST: u32 = 1 << 4;
    pub const DESTROY_QP: u32 = 1 << 5;
    pub const DEALLOC_PD: u32 = 1 << 6;
    /// The immediate phase did not finish within the revoke deadline (the HCA did not answer).
    pub const DEADLINE: u32 = 1 << 7;
    /// Building the lease failed and so did undoing it.
    pub const UNWIND: u32 = 1 << 8;
    /// The sweep's RST2INIT_QP, which returns a UMR-revoked lease's QP to the warm pool, failed.
    pub const RECYCLE: u32 = 1 << 9;
}

/// Where a fence came from (FENCED_SUMMARY `origin`; docs/reference/revoke-spec.md §2.3).
pub mod origin {
    /// A synchronous path: undoing a failed ALLOC.
    pub const LEGACY: u8 = 0;
    /// The immediate phase of FREE or REVOKE.
    pub const REVOKE: u8 = 1;
    /// The deferred sweep.
    pub const SWEEP: u8 = 2;
    /// The immediate phase of an expiry (TTL, READY deadline, lost session).
    pub const EXPIRY: u8 = 3;

    pub fn name(o: u8) -> &'static str {
        match o {
            LEGACY => "LEGACY",
            REVOKE => "REVOKE",
            SWEEP => "SWEEP",
            EXPIRY => "EXPIRY",
            _ => "UNKNOWN",
        }
    }
}

/// One HCA command of a lease's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    AllocPd,
    CreateMkey,
    CreateQp,
    Rst2Init,
    Init2Rtr,
    Rtr2Rts,
    DestroyMkey,
    Qp2Err,
    Qp2Rst,
    DestroyQp,
    DeallocPd,
    /// A UMR work request, not a command: a warm key re-pointed at the lease's memory (ALLOC's first step on
    /// the UMR path).
    UmrGrant,
    /// A UMR work request: the key set free under the quarantine PD (the UMR path's immediate phase).
    UmrRevoke,
}

impl Step {
    /// The steps that build a lease (a failure of one unwinds the build; nothing to cut when a revoke
    /// overtook it).
    pub fn builds(self) -> bool {
        matches!(
            self,
            Step::AllocPd
                | Step::CreateMkey
                | Step::CreateQp
                | Step::Rst2Init
                | Step::Init2Rtr
                | Step::Rtr2Rts
                | Step::UmrGrant
        )
    }

    /// Whether the step is a UMR work request rather than a command.
    pub fn is_umr(self) -> bool {
        matches!(self, Step::UmrGrant | Step::UmrRevoke)
    }

    /// Its bit in FENCED_SUMMARY's `failed_mask`. The UMR steps have none: a failed UMR revoke falls back to
    /// DESTROY_MKEY, whose bit says whether that failed too; a failed grant unwinds.
    pub fn bit(self) -> u32 {
        match self {
            Step::DestroyMkey => step_bit::DESTROY_MKEY,
            Step::Qp2Err => step_bit::QP_2ERR,
            Step::Qp2Rst => step_bit::QP_2RST,
            Step::DestroyQp => step_bit::DESTROY_QP,
            Step::DeallocPd => step_bit::DEALLOC_PD,
            _ => 0,
        }
    }
}

/// What a lease is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// ALLOC's commands are running.
    Building,
    /// Answered; waiting for READY until `ready_by`.
    Granted {
        ready_by: u64,
    },
    Active,
    /// The immediate phase of a revoke: answer by `deadline`.
    Fencing {
        deadline: u64,
    },
    /// Revoked; the sweep starts at `at`.
    PendingDestroy {
        at: u64,
    },
    /// The deferred phase is running.
    Sweeping,
    /// ALLOC failed; its objects are being destroyed.
    Unwinding,
}

/// Why a revoke happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Free,
    Revoke,
    Expiry,
}

impl Cause {
    pub fn origin(self) -> u8 {
        match self {
            Cause::Free | Cause::Revoke => origin::REVOKE,
            Cause::Expiry => origin::EXPIRY,
        }
    }
}

/// A client waiting for a revoke's outcome.
#[derive(Clone, Copy, Debug)]
pub struct Waiter<T> {
    pub ticket: T,
    pub free: bool,
    pub since_us: u64,
}

/// The clients waiting for a revoke's outcome. The first is kept inline: a revoke that nobody repeats (almost
/// every one) allocates nothing.
#[derive(Debug)]
pub struct Waiters<T> {
    first: Option<Waiter<T>>,
    more: Vec<Waiter<T>>,
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters { first: None, more: Vec::new() }
    }
}

impl<T> Waiters<T> {
    pub fn push(&mut self, w: Waiter<T>) {
        if self.first.is_none() {
            self.first = Some(w);
        } else {
            self.more.push(w);
        }
    }

    /// Every waiter, in arrival order; none left behind.
    pub fn take(&mut self) -> impl Iterator<Item = Waiter<T>> + use<T> {
        let w = core::mem::take(self);
        w.first.into_iter().chain(w.more)
    }
}

/// What a fenced slot keeps for post-mortems.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceInfo {
    pub generation: u32,
    pub failed_mask: u32,
    pub origin: u8,
    pub at_ms: u64,
    pub tenant: String,
    pub detail: String,
}

/// A live lease.
#[derive(Debug)]
pub struct Lease<T> {
    pub id: LeaseId,
    pub tenant: String,
    /// Session that owns it; `None` while orphaned (its session was lost).
    pub session: Option<u64>,
    pub orphaned_at: Option<u64>,
    /// The session that held it last (stays set while orphaned): RESUME names the old session by this.
    pub last_session: u64,
    /// The Expiring notice for the current TTL has gone out (cleared when the TTL moves later).
    pub warned: bool,
    pub reconnects: u32,
    pub phase: Phase,
    pub size: u64,
    pub access: u8,
    pub mtu: u8,
    pub ttl_ms: u32,
    pub expires_at: u64,
    pub client_qpn: u32,
    pub client_psn: u32,
    pub client_gid: [u8; 16],
    pub client_mac: [u8; 6],
    pub server_psn: u32,
    /// Extents of the lease pool, in MKEY page order.
    pub extents: Vec<u64>,
    /// QP work-queue buffer and doorbell record (DMA memory).
    pub qp_buf: DmaBuf,
    pub qp_dbr: DmaBuf,
    pub pd: Option<Pdn>,
    pub mkey: Option<Mkey>,
    pub qpn: Option<Qpn>,
    /// The QP is known to be in ERR (2ERR done).
    pub qp_in_err: bool,
    /// The PD, QP (in INIT) and key came from the warm pool: the key is a UMR-enabled one
    /// (`create_mkey_umr_free`), granted by a UMR work request and revoked by one when the caps allow.
    pub warm: bool,
    /// The key was set free under the quarantine PD by a UMR revoke: it reaches nothing and may be re-granted.
    pub key_free: bool,
    /// The sweep returns the PD, QP and key to the warm pool instead of destroying them.
    pub recycle: bool,
    /// The MKEY variant its CREATE_MKEY used: the rkey's low 8 bits under a 24-bit index (`Mkey`). Drawn, not
    /// counted, so it has no limit to reach; what it must not do is repeat the variant its index had last
    /// (`service::ids`), which holds for every index up to 0xffffff (`tests/limits.rs`).
    pub variant: u8,
    /// Steps of the current phase tried and failed so far (the plan's view), and the one in flight (its tag).
    pub tried: Steps,
    pub failed: Steps,
    pub in_flight: Option<(u64, Step)>,
    /// Immediate-phase bookkeeping: why and in which order.
    pub cause: Option<Cause>,
    pub order: RevokeOrder,
    pub waiters: Waiters<T>,
    /// ALLOC's answer goes here when the lease is built.
    pub alloc_ticket: Option<(T, u64)>,
    /// Steps that failed so far (a fence needs at least one).
    pub failed_mask: u32,
    pub failure: String,
}

impl<T> Lease<T> {
    pub fn state(&self) -> LeaseState {
        match self.phase {
            Phase::Building | Phase::Granted { .. } => LeaseState::Granted,
            Phase::Active => LeaseState::Active,
            Phase::Fencing { .. } => LeaseState::Fencing,
            Phase::PendingDestroy { .. } | Phase::Sweeping | Phase::Unwinding => LeaseState::PendingDestroy,
        }
    }
}

/// A slot of the table. Busy slots carry their lease inline: the table is allocated once, at start.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Slot<T> {
    /// Free; the next lease here gets `next_generation`. Generations of a slot run 1..=u32::MAX, one per lease
    /// built there (granted or not). At the limit the slot is retired: when the lease of generation u32::MAX
    /// is swept the slot becomes `Free { next_generation: 0 }` and stays out of the free list until reboot, so
    /// a lease id is never resolved to a later occupant of its slot (a wrap would let an id 2^32 - 1 leases
    /// old name the new one). Its memory returns to the pool as usual; only the slot is lost, after at least
    /// 2^32 - 1 leases of it, each held through the grace period (`grace_ms`). Generation 0 is never granted.
    Free {
        next_generation: u32,
    },
    Busy(Lease<T>),
    /// Fenced until reboot: never reused, nor its memory.
    Fenced(FenceInfo),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_keep_their_wire_meaning_and_the_reserved_ones_stay_clear() {
        // FENCED_SUMMARY `failed_mask` (docs/wire-protocol.md): 0x004 and 0x008 are reserved since `flow_drop`
        // was removed; every other bit means what it meant before.
        let steps = [
            (Step::AllocPd, 0),
            (Step::CreateMkey, 0),
            (Step::CreateQp, 0),
            (Step::Rst2Init, 0),
            (Step::Init2Rtr, 0),
            (Step::Rtr2Rts, 0),
            (Step::DestroyMkey, 0x001),
            (Step::Qp2Err, 0x002),
            (Step::Qp2Rst, 0x010),
            (Step::DestroyQp, 0x020),
            (Step::DeallocPd, 0x040),
        ];
        for (step, bit) in steps {
            assert_eq!(step.bit(), bit, "{step:?}");
            assert_eq!(step.bit() & 0x00c, 0, "{step:?} sets a reserved bit");
        }
        assert_eq!((step_bit::DEADLINE, step_bit::UNWIND), (0x080, 0x100));
    }
}
