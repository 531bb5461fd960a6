//! Ending leases: FREE, REVOKE and expiry start the immediate phase (`plan::Stage::Revoke`), whose outcome is
//! answered when it ends or at the revoke deadline; after the grace period the sweep runs; a failed ALLOC is
//! unwound. Whatever fails fences the slot for good.

use alloc::format;
use alloc::string::String;

use leasebox_proto::{ErrorCode, LeaseId, Notice, Outcome, Reply, Response};

use super::plan::{Stage, Steps};
use super::{Host, LeaseService, SCAN_INTERVAL_US, Who, err};
use crate::config::{RevokeOrder, SCRUB_SLICE, SCRUB_TICK_MAX};
use crate::lease::{Cause, FenceInfo, Lease, Phase, Slot, Waiter, origin, step_bit};
use crate::transitions::{State, Why};

/// The FENCED_SUMMARY origin of a fence in `stage`.
pub(super) fn fence_origin<T>(stage: Stage, l: Option<&Lease<T>>) -> u8 {
    match stage {
        Stage::Revoke(_) => l.and_then(|l| l.cause).map_or(origin::REVOKE, Cause::origin),
        Stage::Sweep => origin::SWEEP,
        Stage::Build | Stage::Unwind => origin::LEGACY,
    }
}

impl<T: Copy> LeaseService<T> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn revoke(
        &mut self,
        who: Who<'_>,
        id: LeaseId,
        cause: Cause,
        order: Option<RevokeOrder>,
        ticket: T,
        now_us: u64,
        host: &mut dyn Host,
    ) -> Option<Reply> {
        let free = cause == Cause::Free;
        let answer = |outcome| {
            Some(Ok(if free {
                Response::Free { outcome, elapsed_us: 0 }
            } else {
                Response::Revoke { outcome, elapsed_us: 0 }
            }))
        };
        let waiter = Waiter { ticket, free, since_us: now_us };
        if id.boot_id != self.boot_id {
            // An id from another boot names nothing here (its slot may hold a new lease).
            return answer(Outcome::NotFound);
        }
        match self.slots.get_mut(id.slot as usize) {
            Some(Slot::Busy(l)) if who.admin || l.tenant == who.tenant => {
                if l.id.generation != id.generation {
                    return answer(Outcome::NotFound);
                }
                match l.phase {
                    Phase::Fencing { .. } => {
                        // Idempotent: the same outcome as the revoke in progress.
                        l.waiters.push(waiter);
                        None
                    }
                    Phase::PendingDestroy { .. } | Phase::Sweeping | Phase::Unwinding => answer(Outcome::TornDown),
                    Phase::Building => {
                        // The build is abandoned: ALLOC's asker hears so now, and the lease goes through the
                        // immediate phase once the command in flight has answered.
                        if let Some((t, since)) = l.alloc_ticket.take() {
                            let msg = format!("ALLOC: lease {id} was freed or revoked before it was granted");
                            self.answers.push((t, Err(err(ErrorCode::NotFound, &msg))));
                            self.counters.alloc_us.record(now_us.saturating_sub(since));
                        }
                        self.start_revoke(id.slot, cause, order, Some(waiter), now_us);
                        self.advance(id.slot, now_us, host);
                        None
                    }
                    Phase::Granted { .. } | Phase::Active => {
                        self.start_revoke(id.slot, cause, order, Some(waiter), now_us);
                        self.advance(id.slot, now_us, host);
                        None
                    }
                }
            }
            Some(Slot::Fenced(f)) if (who.admin || f.tenant == who.tenant) && f.generation == id.generation => {
                answer(Outcome::Fenced)
            }
            _ => answer(Outcome::NotFound),
        }
    }

    /// Starts the immediate phase (its commands go out on the next `advance`).
    fn start_revoke(
        &mut self,
        slot: u32,
        cause: Cause,
        order: Option<RevokeOrder>,
        waiter: Option<Waiter<T>>,
        now_us: u64,
    ) {
        let order = order.unwrap_or(self.cfg.order);
        let deadline = now_us + self.cfg.revoke_deadline_ms * 1000;
        self.note(slot, State::Fencing, self.revoke_why(slot, cause), now_us);
        let Some(l) = self.lease_mut(slot) else { return };
        l.phase = Phase::Fencing { deadline };
        l.cause = Some(cause);
        l.order = order;
        (l.tried, l.failed) = (Steps::default(), Steps::default());
        if let Some(w) = waiter {
            l.waiters.push(w);
        }
    }

    /// The immediate phase ended (TornDown or Fenced): STATS counts it as a revoke or an expiry.
    fn count_ended(&mut self, cause: Option<Cause>) {
        match cause {
            Some(Cause::Free | Cause::Revoke) => self.counters.revokes += 1,
            Some(Cause::Expiry) => self.counters.expiries += 1,
            None => {}
        }
    }

    /// The owner's sessions hear that a lease ended, with the outcome, unless it was the tenant's own FREE
    /// (the asker has the answer; a FREE is the client saying it is done). An admin's or the tenant's REVOKE,
    /// a drain and every expiry (TTL, READY deadline, lost session, the HCA failing) are told, unless
    /// `revoke_notices=off` withholds every such notice (a diagnostic: clients must then learn of it from a
    /// failed completion and QUERY).
    fn notify_ended(&mut self, tenant: &str, lease: LeaseId, cause: Option<Cause>, outcome: Outcome) {
        if self.cfg.revoke_notices && matches!(cause, Some(Cause::Revoke | Cause::Expiry)) {
            self.notify(tenant, Notice::Revoked { lease, outcome });
        }
    }

    /// The immediate phase succeeded: the key is gone; the sweep comes after the grace period.
    pub(super) fn torn_down(&mut self, slot: u32, now_us: u64) {
        let at = now_us + self.cfg.grace_ms * 1000;
        self.note(slot, State::PendingDestroy, Why::TeardownOk, now_us);
        let Some(l) = self.lease_mut(slot) else { return };
        l.phase = Phase::PendingDestroy { at };
        let (waiters, cause) = (l.waiters.take(), l.cause);
        let (tenant, id) = (l.tenant.clone(), l.id);
        self.notify_ended(&tenant, id, cause, Outcome::TornDown);
        self.count_ended(cause);
        for w in waiters {
            self.reply_outcome(w, Outcome::TornDown, now_us);
        }
    }

    /// A build step failed: destroy what exists.
    pub(super) fn unwind(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        self.note(slot, State::Unwinding, Why::BuildFailed, now_us);
        let Some(l) = self.lease_mut(slot) else { return };
        l.phase = Phase::Unwinding;
        (l.tried, l.failed) = (Steps::default(), Steps::default());
        self.advance(slot, now_us, host);
    }

    /// A step of `stage` failed for good: fence the slot with the origin the stage names.
    pub(super) fn fail_closed(&mut self, slot: u32, stage: Stage, now_us: u64) {
        let origin = fence_origin(stage, self.lease(slot));
        if let (Stage::Unwind, Some(l)) = (stage, self.lease_mut(slot)) {
            l.failed_mask |= step_bit::UNWIND;
        }
        self.fence(slot, origin, now_us);
    }

    /// Timers: the revoke deadline, READY deadlines, TTLs, lost sessions, and the deferred sweep. Also issues
    /// the commands that revokes started since the last call.
    pub fn tick(&mut self, now_us: u64, host: &mut dyn Host) {
        if now_us < self.next_scan_us {
            return;
        }
        self.next_scan_us = now_us + SCAN_INTERVAL_US;
        self.fill_warm(host);
        self.poll_resolving(now_us, host);
        self.drains_due(now_us, host);
        let session_grace = self.cfg.session_grace_ms * 1000;
        for slot in 0..self.busy_end {
            let Some(l) = self.lease_mut(slot) else { continue };
            match l.phase {
                Phase::Fencing { deadline } => {
                    if l.in_flight.is_none() {
                        self.advance(slot, now_us, host);
                    } else if now_us >= deadline {
                        // The HCA has not answered: fail closed now, do not wait for the command timeout.
                        l.failed_mask |= step_bit::DEADLINE;
                        if l.failure.is_empty() {
                            l.failure = String::from("no answer from the HCA within the revoke deadline");
                        }
                        let stage = Stage::Revoke(l.order);
                        self.fail_closed(slot, stage, now_us);
                    }
                }
                Phase::Granted { ready_by } if now_us >= ready_by => self.expire(slot, now_us, host),
                Phase::Granted { .. } | Phase::Active => {
                    let expired = now_us >= l.expires_at;
                    let abandoned = l.orphaned_at.is_some_and(|t| now_us >= t + session_grace);
                    if expired || abandoned {
                        self.expire(slot, now_us, host);
                    } else if !l.warned {
                        // Once per TTL: when what is left of it is within the threshold (a renewal that moves
                        // the expiry later re-arms it).
                        let left_ms = (l.expires_at - now_us) / 1000;
                        if left_ms <= super::expiring_threshold_ms(l.ttl_ms) {
                            l.warned = true;
                            let in_ms = left_ms.min(u64::from(u32::MAX)) as u32;
                            let (tenant, lease) = (l.tenant.clone(), l.id);
                            self.notify(&tenant, Notice::Expiring { lease, in_ms });
                        }
                    }
                }
                Phase::PendingDestroy { at } if now_us >= at => {
                    self.note(slot, State::Sweeping, Why::SweepStart, now_us);
                    let Some(l) = self.lease_mut(slot) else { continue };
                    l.phase = Phase::Sweeping;
                    (l.tried, l.failed) = (Steps::default(), Steps::default());
                    // A key a UMR revoke set free goes back to the warm pool with its PD and QP, if it wants them.
                    let recyclable = l.warm && l.key_free && l.mkey.is_some() && l.qpn.is_some() && l.pd.is_some();
                    let wants = recyclable && self.warm_wants();
                    if let Some(l) = self.lease_mut(slot) {
                        l.recycle = wants;
                    }
                    self.advance(slot, now_us, host);
                }
                _ => {}
            }
        }
    }

    /// DRAIN (the admin's; the session server has refused it to tenants): tells the sessions of `tenant` (every
    /// tenant's when empty) that their leases go in `notice_ms`, refuses their ALLOCs from now on, and revokes
    /// the leases when the time comes (`drains_due`). Answers how many leases that is; the session server
    /// adds the deadline on its clock.
    pub(super) fn drain(&mut self, who: Who<'_>, tenant: &str, notice_ms: u32, now_us: u64) -> Reply {
        if !who.admin {
            return Err(err(ErrorCode::Forbidden, "DRAIN: only the admin may drain the appliance"));
        }
        let target = (!tenant.is_empty()).then(|| String::from(tenant));
        let covers = |t: &str| target.as_deref().is_none_or(|d| d == t);
        let leases = self
            .slots
            .iter()
            .filter(|s| {
                matches!(s, Slot::Busy(l) if covers(&l.tenant)
                    && matches!(l.phase, Phase::Building | Phase::Granted { .. } | Phase::Active))
            })
            .count() as u32;
        self.notify(tenant, Notice::Draining { in_ms: notice_ms });
        self.drains.push(super::Drain { tenant: target, at_us: now_us + u64::from(notice_ms) * 1000 });
        Ok(Response::Drain { leases, deadline_ms: 0 })
    }

    /// Drains whose time has come: every lease they cover is revoked (each tells its owner, `notify_ended`). A
    /// lease still being built then is revoked at a later scan, once granted; the drain ends (and its
    /// tenant may ALLOC again) when none is left.
    fn drains_due(&mut self, now_us: u64, host: &mut dyn Host) {
        let mut i = 0;
        while i < self.drains.len() {
            if now_us < self.drains[i].at_us {
                i += 1;
                continue;
            }
            let target = self.drains[i].tenant.clone();
            let mut building = false;
            for slot in 0..self.busy_end {
                let Some(l) = self.lease(slot) else { continue };
                if target.as_deref().is_some_and(|t| t != l.tenant) {
                    continue;
                }
                match l.phase {
                    Phase::Building => building = true,
                    Phase::Granted { .. } | Phase::Active => {
                        self.start_revoke(slot, Cause::Revoke, None, None, now_us);
                        self.advance(slot, now_us, host);
                    }
                    _ => {}
                }
            }
            if building {
                i += 1;
            } else {
                self.drains.remove(i);
            }
        }
    }

    fn expire(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        self.start_revoke(slot, Cause::Expiry, None, None, now_us);
        self.advance(slot, now_us, host);
    }

    /// Revokes every live lease (an HCA that died, or shutdown): each gets its immediate phase.
    pub fn revoke_all(&mut self, now_us: u64, host: &mut dyn Host) {
        for slot in 0..self.busy_end {
            if self.lease(slot).is_some_and(|l| matches!(l.phase, Phase::Granted { .. } | Phase::Active)) {
                self.expire(slot, now_us, host);
            }
        }
    }

    fn reply_outcome(&mut self, w: Waiter<T>, outcome: Outcome, now_us: u64) {
        let elapsed = now_us.saturating_sub(w.since_us);
        self.counters.revoke_us.record(elapsed);
        let elapsed_us = elapsed.min(u64::from(u32::MAX)) as u32;
        let r = if w.free { Response::Free { outcome, elapsed_us } } else { Response::Revoke { outcome, elapsed_us } };
        self.answers.push((w.ticket, Ok(r)));
    }

    /// Fences `slot` for good: its memory and the slot are never reused until reboot.
    fn fence(&mut self, slot: u32, origin: u8, now_us: u64) {
        self.note(
            slot,
            State::Fenced,
            crate::transitions::fenced_why(origin, self.lease(slot).map_or(0, |l| l.failed_mask)),
            now_us,
        );
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        let waiters = l.waiters.take();
        let alloc_ticket = l.alloc_ticket.take();
        let immediate = matches!(l.phase, Phase::Fencing { .. }).then_some(l.cause).flatten();
        let id = l.id;
        let info = FenceInfo {
            generation: l.id.generation,
            failed_mask: l.failed_mask,
            origin,
            at_ms: now_us / 1000,
            tenant: core::mem::take(&mut l.tenant),
            detail: core::mem::take(&mut l.failure),
        };
        // A command still in flight keeps its tag: its late completion finds the fence and is ignored.
        self.pool.quarantine(l.extents.len());
        let n = l.extents.len();
        let tenant = info.tenant.clone();
        self.slots[slot as usize] = Slot::Fenced(info);
        self.unbook(&tenant, n);
        self.counters.fenced += 1;
        // The owner hears it: as the outcome of a revoke it was told of (`notify_ended`), else as a fence.
        if matches!(immediate, Some(Cause::Revoke | Cause::Expiry)) {
            self.notify_ended(&tenant, id, immediate, Outcome::Fenced);
        } else {
            self.notify(&tenant, Notice::Fenced { lease: id });
        }
        self.count_ended(immediate);
        for w in waiters {
            self.reply_outcome(w, Outcome::Fenced, now_us);
        }
        if let Some((ticket, _)) = alloc_ticket {
            self.answers
                .push((ticket, Err(err(ErrorCode::HcaError, "the lease's slot was fenced while it was built"))));
        }
    }

    /// The sweep or an unwind finished: scrub, free the memory, free the slot.
    /// The slot is free at once; its memory joins the scrub queue and returns to the pool as it is zeroed
    /// ([`LeaseService::scrub`]).
    pub(super) fn release(&mut self, slot: u32, now_us: u64, host: &mut dyn Host) {
        self.note_released(slot, now_us);
        let Some(Slot::Busy(l)) = self.slots.get(slot as usize) else { return };
        // A recycled lease's PD, QP (back in INIT) and free key return to the warm pool with its QP memory.
        let recycled = l.recycle && self.give_back_slot(slot);
        let Some(Slot::Busy(l)) = self.slots.get_mut(slot as usize) else { return };
        self.pool.retire(&l.extents);
        if !recycled {
            host.dma_free(l.qp_buf);
            host.dma_free(l.qp_dbr);
        }
        // The generation's limit (`Slot::Free`): a slot whose lease had generation u32::MAX is retired, free
        // but never handed out again this boot, rather than wrapping to a generation an old id still names.
        let retired = l.id.generation == u32::MAX;
        let next_generation = l.id.generation.wrapping_add(1);
        let (tenant, n) = (core::mem::take(&mut l.tenant), l.extents.len());
        self.slots[slot as usize] = Slot::Free { next_generation };
        if retired {
            log::warn!("lease: slot {slot} used all {} generations: retired until reboot", u32::MAX);
        } else {
            self.free.insert(slot);
        }
        self.unbook(&tenant, n);
        self.counters.swept += 1;
    }

    /// [`LeaseService::give_back`] for the lease in `slot`.
    fn give_back_slot(&mut self, slot: u32) -> bool {
        let Some(Slot::Busy(l)) = self.slots.get(slot as usize) else { return false };
        let w = super::warm::entry_of(l);
        w.is_some_and(|w| self.give_back(w))
    }

    /// One share of the scrub: slices of [`SCRUB_SLICE`] until `Config::scrub_budget_us` has passed on the
    /// host's clock or [`SCRUB_TICK_MAX`] bytes are done; returns whether it zeroed anything. Logs once when
    /// the pool's boot-time preparation is complete. The loop's timer calls it (`LeaseBackend::tick`), not
    /// the request path, so no request waits behind a share.
    pub fn scrub(&mut self, now_us: u64, host: &mut dyn Host) -> bool {
        let since = *self.preparing_since_us.get_or_insert(now_us);
        let start = host.now_us();
        let mut done = 0;
        while let Some(n) = self.pool.scrub_slice(SCRUB_SLICE, |a, n| host.zero(a, n)) {
            done += n;
            self.counters.scrubbed_bytes += n;
            if done >= SCRUB_TICK_MAX || host.now_us().saturating_sub(start) >= self.cfg.scrub_budget_us {
                break;
            }
        }
        if self.pool.unprepared_bytes() == 0 && !self.pool_ready {
            self.pool_ready = true;
            log::info!(
                "lease: pool ready: {} MiB in {} ms",
                self.pool.total_bytes() >> 20,
                now_us.saturating_sub(since) / 1000
            );
        }
        done > 0
    }
}
