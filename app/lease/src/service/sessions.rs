//! Control sessions and their leases: a lost session's leases wait for the session grace period, a new
//! session of the same tenant resumes them, heartbeats may renew them.

use super::LeaseService;
use crate::lease::{Phase, Slot};

impl<T: Copy> LeaseService<T> {
    /// A session ended: its leases stay for the session grace period, then expire.
    pub fn session_lost(&mut self, session: u64, now_us: u64) {
        self.drop_parked(session);
        for s in &mut self.slots {
            if let Slot::Busy(l) = s
                && l.session == Some(session)
            {
                l.session = None;
                l.orphaned_at = Some(now_us);
            }
        }
    }

    /// A session of `tenant` started: orphaned leases of that tenant are resumed by it (RTRS's reconnect
    /// counter: each resume counts). Returns how many.
    pub fn session_started(&mut self, session: u64, tenant: &str) -> usize {
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
        self.counters.reconnects += n as u64;
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
                l.expires_at = l.expires_at.max(now_us + u64::from(l.ttl_ms) * 1000);
            }
        }
    }
}
