//! READY, RENEW, QUERY, LIST and FENCED_SUMMARY: who may see a lease, and paged listings.

use alloc::format;
use alloc::vec::Vec;

use leasebox_proto::{ErrorBody, ErrorCode, FencedSlot, LeaseId, LeaseInfo, LeaseState, Reply, Response};

use super::{LIST_MAX, LeaseService, Who, err};
use crate::lease::{FenceInfo, Lease, Phase, Slot};
use crate::transitions::{State, Why};

impl<T: Copy> LeaseService<T> {
    /// The lease `id` if `who` may see it: `Err` NOT_FOUND for a free or other tenant's slot or an id from
    /// another boot, STALE for an older generation.
    fn owned(&self, who: Who<'_>, id: LeaseId) -> Result<&Lease<T>, ErrorBody> {
        if id.boot_id != self.boot_id {
            // Slots and generations start again every boot: only the boot id tells an old id from a new lease.
            return Err(err(ErrorCode::NotFound, &format!("no lease {id} in this boot")));
        }
        match self.slots.get(id.slot as usize) {
            Some(Slot::Busy(l)) if who.admin || l.tenant == who.tenant => {
                if l.id.generation == id.generation {
                    Ok(l)
                } else {
                    Err(err(
                        ErrorCode::Stale,
                        &format!("lease {id} is stale (slot now at generation {})", l.id.generation),
                    )
                    .with_detail([l.id.generation, 0, 0]))
                }
            }
            _ => Err(err(ErrorCode::NotFound, &format!("no lease {id}"))),
        }
    }

    /// A live session of the owning tenant that uses an orphaned lease (its session was lost) adopts it: the
    /// lease is its now, and no longer waits out the session grace period to expire. Without this, a tenant
    /// that renews a lease from a second session would lose it when the first session times out.
    fn adopt(&mut self, who: Who<'_>, slot: u32) {
        if who.admin {
            return;
        }
        if let Some(l) = self.lease_mut(slot)
            && l.session.is_none()
            && l.tenant == who.tenant
        {
            l.session = Some(who.session);
            l.orphaned_at = None;
            l.reconnects += 1;
        }
    }

    pub(super) fn ready(&mut self, who: Who<'_>, id: LeaseId, client_qpn: u32, server_qpn: u32, now_us: u64) -> Reply {
        let l = self.owned(who, id)?;
        if l.qpn.map(|q| q.0) != Some(server_qpn) || l.client_qpn != client_qpn {
            return Err(err(
                ErrorCode::BadParam,
                &format!(
                    "READY: QPNs do not match the lease (client {:#x}, server {:#x})",
                    l.client_qpn,
                    l.qpn.map_or(0, |q| q.0)
                ),
            ));
        }
        match l.phase {
            Phase::Granted { .. } | Phase::Active => {
                if matches!(l.phase, Phase::Granted { .. }) {
                    self.note(id.slot, State::Active, Why::Confirm, now_us);
                }
                if let Some(l) = self.lease_mut(id.slot) {
                    l.phase = Phase::Active;
                }
                self.adopt(who, id.slot);
                Ok(Response::Ready { state: LeaseState::Active })
            }
            _ => Err(err(ErrorCode::BadState, &format!("READY: lease is {}", l.state().name()))),
        }
    }

    pub(super) fn renew(&mut self, who: Who<'_>, id: LeaseId, ttl_ms: u32, now_us: u64) -> Reply {
        let max = self.cfg.max_ttl_ms;
        let default = self.cfg.default_ttl_ms;
        let l = self.owned(who, id)?;
        if !matches!(l.phase, Phase::Granted { .. } | Phase::Active) {
            return Err(err(ErrorCode::BadState, &format!("RENEW: lease is {}", l.state().name())));
        }
        if ttl_ms > max {
            return Err(err(ErrorCode::BadParam, &format!("RENEW: field 'renew.ttl_ms' must be at most {max} ms")));
        }
        let ttl = if ttl_ms == 0 { default } else { ttl_ms };
        if let Some(l) = self.lease_mut(id.slot) {
            l.ttl_ms = ttl;
            l.expires_at = now_us + u64::from(ttl) * 1000;
            l.warned = false;
        }
        self.adopt(who, id.slot);
        Ok(Response::Renew { ttl_ms: ttl })
    }

    fn info(l: &Lease<T>, now_us: u64) -> LeaseInfo {
        LeaseInfo {
            lease: l.id,
            state: l.state(),
            access: l.access,
            mtu: l.mtu,
            size: l.size,
            rkey: l.mkey.map_or(0, |k| k.0),
            server_qpn: l.qpn.map_or(0, |q| q.0),
            client_qpn: l.client_qpn,
            ttl_left_ms: (l.expires_at.saturating_sub(now_us) / 1000).min(u64::from(u32::MAX)) as u32,
            tenant: l.tenant.clone(),
        }
    }

    pub(super) fn query(&mut self, who: Who<'_>, id: LeaseId, now_us: u64) -> Reply {
        let info = self.owned(who, id).map(|l| Self::info(l, now_us))?;
        if matches!(info.state, LeaseState::Granted | LeaseState::Active) {
            self.adopt(who, id.slot);
        }
        Ok(Response::Query(info))
    }

    /// One page of what `pick` takes from the slots from `cursor` on, at most `max` (1 to [`LIST_MAX`]):
    /// the entries and the cursor of the next page (0 when this is the last).
    fn page<E>(&self, cursor: u32, max: u16, pick: impl Fn(u32, &Slot<T>) -> Option<E>) -> (u32, Vec<E>) {
        let max = usize::from(max).clamp(1, LIST_MAX);
        let mut out = Vec::new();
        for (i, s) in self.slots.iter().enumerate().skip(cursor as usize) {
            if let Some(e) = pick(i as u32, s) {
                if out.len() == max {
                    return (i as u32, out);
                }
                out.push(e);
            }
        }
        (0, out)
    }

    pub(super) fn list(&self, who: Who<'_>, cursor: u32, max: u16, now_us: u64) -> Reply {
        let (next_cursor, leases) = self.page(cursor, max, |_, s| match s {
            Slot::Busy(l) if who.admin || l.tenant == who.tenant => Some(Self::info(l, now_us)),
            _ => None,
        });
        Ok(Response::List { next_cursor, leases })
    }

    /// FENCED_SUMMARY: one page of fenced slots (a tenant sees its own), paged like LIST.
    pub fn fenced(&self, who: Who<'_>, cursor: u32, max: u16) -> (u32, Vec<FencedSlot>) {
        self.page(cursor, max, |i, s| match s {
            Slot::Fenced(f) if who.admin || f.tenant == who.tenant => Some(FencedSlot {
                slot: i,
                generation: f.generation,
                failed_mask: f.failed_mask,
                origin: f.origin,
                fenced_at_ms: f.at_ms,
            }),
            _ => None,
        })
    }

    /// Why a fenced slot was fenced (diagnostics).
    pub fn fence_info(&self, slot: u32) -> Option<&FenceInfo> {
        match self.slots.get(slot as usize) {
            Some(Slot::Fenced(f)) => Some(f),
            _ => None,
        }
    }
}
