//! HEALTH's one rule: the status and the message from the appliance's facts (its HCA) and the lease service's
//! (its leases by state, fenced slots), whoever serves them — the image or the hosted appliance, with the lease
//! service on or off (docs/wire-protocol.md, "HEALTH").

use alloc::format;
use alloc::string::String;
use leasebox_proto::{HcaState, Health, HealthStatus, LeaseState, MAX_MESSAGE};

/// The lease service's part of HEALTH ([`crate::Leases::health_facts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseHealth {
    /// The lease service is off (no HCA, no memory for the pool), and why.
    Off(String),
    /// The lease service runs.
    On {
        /// Leases in each state, indexed by `LeaseState as usize` (as STATS counts them).
        by_state: [u32; 5],
        /// Slots fenced for good (never reused until reboot).
        fenced: u32,
        /// What else the lease service tells HEALTH's reader about itself, one phrase (empty: nothing); it
        /// follows the lease counts in the message.
        detail: String,
    },
}

/// HEALTH from the facts (the server fills in the uptime):
/// - status: `Failed` when the HCA is fatal; otherwise `Degraded` when the lease service is off; otherwise
///   `Failed` when the HCA is anything but `Ok` (the lease service runs on an HCA that is not up), `Degraded`
///   when a slot is fenced, and `Ok` when none is;
/// - message: `leases granted G active A fencing F pending P fenced X[, DETAIL]; HCA` with the lease service
///   on, `lease service off: WHY; HCA` with it off, where HCA is the appliance's own line about its HCA; the
///   DETAIL is left out when the message would not fit the protocol's [`MAX_MESSAGE`] bytes with it, and what
///   still does not fit is cut when encoded.
pub fn health(hca: HcaState, hca_message: &str, leases: &LeaseHealth, uptime_ms: u64) -> Health {
    let (status, fenced_slots, message) = match leases {
        LeaseHealth::Off(why) => {
            let status = if hca == HcaState::Fatal { HealthStatus::Failed } else { HealthStatus::Degraded };
            (status, 0, format!("lease service off: {why}; {hca_message}"))
        }
        LeaseHealth::On { by_state, fenced, detail } => {
            let status = match hca {
                HcaState::Ok if *fenced == 0 => HealthStatus::Ok,
                HcaState::Ok => HealthStatus::Degraded,
                _ => HealthStatus::Failed,
            };
            let n = |s: LeaseState| by_state[s as usize];
            let counts = format!(
                "leases granted {} active {} fencing {} pending {} fenced {}",
                n(LeaseState::Granted),
                n(LeaseState::Active),
                n(LeaseState::Fencing),
                n(LeaseState::PendingDestroy),
                n(LeaseState::Fenced),
            );
            let mut message = format!("{counts}, {detail}; {hca_message}");
            if detail.is_empty() || message.len() > MAX_MESSAGE {
                // The detail gives way before the HCA's line is cut short (the ready line has it too).
                message = format!("{counts}; {hca_message}");
            }
            (status, *fenced, message)
        }
    };
    Health { status, hca, fenced_slots, uptime_ms, message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn on(fenced: u32, detail: &str) -> LeaseHealth {
        LeaseHealth::On { by_state: [1, 2, 3, 4, fenced], fenced, detail: detail.to_string() }
    }

    #[test]
    fn status_follows_the_hca_and_the_fenced_slots() {
        let s = |hca, l: &LeaseHealth| health(hca, "hca", l, 0).status;
        assert_eq!(s(HcaState::Ok, &on(0, "")), HealthStatus::Ok);
        assert_eq!(s(HcaState::Ok, &on(1, "")), HealthStatus::Degraded);
        for hca in [HcaState::Absent, HcaState::Initializing, HcaState::Fatal] {
            assert_eq!(s(hca, &on(0, "")), HealthStatus::Failed, "{hca:?} under a running lease service");
        }
        let off = LeaseHealth::Off("no HCA".into());
        for hca in [HcaState::Absent, HcaState::Initializing, HcaState::Ok] {
            assert_eq!(s(hca, &off), HealthStatus::Degraded, "{hca:?} with the lease service off");
        }
        assert_eq!(s(HcaState::Fatal, &off), HealthStatus::Failed);
    }

    #[test]
    fn the_message_names_the_counts_the_detail_and_the_hca() {
        let h = health(HcaState::Ok, "ConnectX-5 fw 16.35", &on(5, ""), 9);
        assert_eq!(h.message, "leases granted 1 active 2 fencing 3 pending 4 fenced 5; ConnectX-5 fw 16.35");
        assert_eq!((h.fenced_slots, h.uptime_ms, h.hca), (5, 9, HcaState::Ok));
        let h = health(HcaState::Ok, "hca", &on(0, "grant=umr"), 0);
        assert_eq!(h.message, "leases granted 1 active 2 fencing 3 pending 4 fenced 0, grant=umr; hca");
        let h = health(HcaState::Absent, "no HCA", &LeaseHealth::Off("no memory for the pool".into()), 0);
        assert_eq!(h.message, "lease service off: no memory for the pool; no HCA");
        assert_eq!(h.fenced_slots, 0);
    }

    #[test]
    fn the_detail_gives_way_to_the_hca_line() {
        let counts = "leases granted 1 active 2 fencing 3 pending 4 fenced 0";
        let detail = "umr grant+revoke warm 32";
        // An HCA line that fits with the detail, and one a byte longer.
        let fits = "h".repeat(MAX_MESSAGE - counts.len() - detail.len() - 4);
        assert_eq!(health(HcaState::Ok, &fits, &on(0, detail), 0).message, format!("{counts}, {detail}; {fits}"));
        let long = alloc::format!("{fits}x");
        let h = health(HcaState::Ok, &long, &on(0, detail), 0);
        assert_eq!(h.message, format!("{counts}; {long}"), "the detail left out, the HCA line whole");
        assert!(h.message.len() <= MAX_MESSAGE);
    }
}
