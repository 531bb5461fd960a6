//! Control sessions and their leases: a lost session's leases go to another live session of the same tenant,
//! or wait for the session grace period; a new session of the same tenant resumes them (at start, or by
//! RESUME naming the old one); heartbeats may renew them.

use alloc::string::String;

use super::LeaseService;
use crate::lease::{Phase, Slot};

impl<T: Copy> LeaseService<T> {
    /// A session ended. Its leases belong to its tenant: if another session of that tenant is still open
    /// (the newest), they are its now (a tenant that renews from a second session must not lose them when the
    /// first times out); otherwise they wait for the session grace period, then expire.
    pub fn session_lost(&mut self, session: u64, now_us: u64) {
        self.drop_parked(session);
        let heir = self
            .live
            .remove(&session)
            .and_then(|tenant| self.live.iter().filter(|(_, t)| **t == tenant).map(|(s, _)| *s).next_back());
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(session)
            {
                l.session = heir;
                l.orphaned_at = if heir.is_some() { None } else { Some(now_us) };
                l.last_session = session;
            }
        }
    }

    /// RESUME: session `to` of `tenant` takes over the leases of its earlier session `from` (the session server
    /// has checked the token): those `from` holds, those orphaned when `from` was lost (within the session
    /// grace period; later they are gone), and those `to` already adopted from it when it started. Counts one
    /// reconnect. Returns how many leases `to` now holds that were `from`'s.
    pub fn resume(&mut self, from: u64, to: u64, tenant: &str) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.tenant == tenant
                && matches!(l.phase, Phase::Building | Phase::Granted { .. } | Phase::Active)
            {
                let held = l.session == Some(from);
                let orphaned = l.session.is_none() && l.last_session == from;
                let adopted = l.session == Some(to) && l.last_session == from;
                if held || orphaned || adopted {
                    if !adopted {
                        l.reconnects += 1;
                    }
                    l.session = Some(to);
                    l.orphaned_at = None;
                    l.last_session = to;
                    n += 1;
                }
            }
        }
        self.counters.reconnects += 1;
        n
    }

    /// A session of `tenant` started: orphaned leases of that tenant are resumed by it (RTRS's reconnect
    /// counter: each session that resumed leases counts once). Returns how many.
    pub fn session_started(&mut self, session: u64, tenant: &str) -> usize {
        self.live.insert(session, String::from(tenant));
        let mut n = 0;
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session.is_none()
                && l.tenant == tenant
            {
                l.session = Some(session);
                l.orphaned_at = None;
                l.reconnects += 1;
                n += 1;
            }
        }
        self.counters.reconnects += u64::from(n > 0);
        n
    }

    /// A heartbeat from `session`: renews its leases' TTL when configured.
    pub fn session_alive(&mut self, session: u64, now_us: u64) {
        if !self.cfg.heartbeat_renews {
            return;
        }
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(session)
                && matches!(l.phase, Phase::Granted { .. } | Phase::Active)
            {
                let renewed = now_us + u64::from(l.ttl_ms) * 1000;
                if renewed > l.expires_at {
                    l.expires_at = renewed;
                    // A later expiry earns a new Expiring notice when it comes near.
                    l.warned = false;
                }
            }
        }
    }
}
