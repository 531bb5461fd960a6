//! Moves work between the lease service and the mlx5 engines' client: the service's commands go out on the
//! client's ring (what does not fit waits in the service), results come back to the service by tag, and a
//! fatal HCA makes every live lease fail closed. The image's core 0, the hosted appliance and the tests all
//! drive the service through this one loop step. UMR work requests (grants and revokes on the warm path) travel
//! the same way (`Client::submit_umr`), their results back through the same completion ring.

use leasebox_mlx5::engine::{Client, Event, Refused};

use crate::service::{Host, LeaseService};

/// The service's tags travel through the client as they are (`Client::submit_as`), so results come back by
/// tag with no map in between.
#[derive(Default)]
pub struct Link {
    /// Commands handed to the client and not yet answered.
    outstanding: usize,
    fatal_seen: bool,
    pub events: u64,
}

impl Link {
    pub fn new() -> Link {
        Link::default()
    }

    /// One step: submit, collect, react to events, run the service's timers. Returns true if anything moved.
    pub fn step<T: Copy>(
        &mut self,
        svc: &mut LeaseService<T>,
        client: &mut Client,
        now_us: u64,
        host: &mut dyn Host,
    ) -> bool {
        let mut did = false;
        while let Some(c) = client.poll() {
            did = true;
            self.outstanding = self.outstanding.saturating_sub(1);
            svc.hca_done(c.tag, c.result, now_us, host);
        }
        while let Some(e) = client.next_event() {
            self.events += 1;
            if let Event::Fatal(_) = e
                && !self.fatal_seen
            {
                // The command interface is gone: every lease goes through its immediate phase, whose commands
                // now fail at once, so each slot fences (fail closed).
                self.fatal_seen = true;
                svc.revoke_all(now_us, host);
            }
            did = true;
        }
        svc.tick(now_us, host);
        // UMR work first: a revoke's work request is its immediate phase (grants queue behind revokes).
        while client.room() > 0 {
            let Some((tag, work)) = svc.next_umr() else { break };
            match client.submit_umr(tag, work) {
                Ok(()) => {
                    self.outstanding += 1;
                    did = true;
                }
                Err((work, None)) => {
                    svc.unsend_umr(tag, work);
                    break;
                }
                Err((_, Some(e))) => {
                    log::error!("lease: {e}");
                    svc.hca_done(tag, Err(e), now_us, host);
                    did = true;
                }
            }
        }
        while client.room() > 0 {
            let Some((tag, cmd)) = svc.next_command() else { break };
            match client.submit_as(tag, cmd) {
                Ok(()) => {
                    self.outstanding += 1;
                    did = true;
                }
                Err(Refused::Full(cmd)) => {
                    svc.unsend(tag, cmd);
                    break;
                }
                Err(Refused::ReservedTag(e)) => {
                    // Never with the service's own tags (its layout is derived from the engine's); if it
                    // happened, the step fails as a refused command would, and the plan fails closed.
                    log::error!("lease: {e}");
                    svc.hca_done(tag, Err(e), now_us, host);
                    did = true;
                }
            }
        }
        did
    }

    /// Commands handed to the client and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }
}
