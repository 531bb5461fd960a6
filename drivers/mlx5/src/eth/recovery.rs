//! The port's upkeep after `into_engines` (Linux `en/reporter_tx.c`, `en/reporter_rx.c`): the Q counter read
//! every second, and SQ/RQ recovery from error (ERR → RST → RDY, buffers reposted), one command at a time
//! through the command engine's side client, never waiting.

use super::{EthPort, EthStats};
use crate::command::CmdError;
use crate::engine::SideClient;
use crate::ifc;
use crate::ifc::eth::{MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RDY, MLX5_WQ_STATE_RST};
use crate::platform::Platform;

/// How often [`EthPort::maintain`] reads the Q counter.
pub const Q_COUNTER_PERIOD_MS: u64 = 1_000;
/// How long a failed recovery step waits before it is tried again.
pub const RECOVERY_RETRY_MS: u64 = 1_000;

/// Which command a maintenance tag belongs to (one in flight each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Counter = 1,
    Sq = 2,
    Rq = 3,
}
// The largest maintenance tag is one the command engine takes (`engine::CLIENT_TAG_BITS` owns the layout).
const _: () = assert!((((Purpose::Rq as u64) << 32) | 0xffff_ffff) & !crate::engine::CLIENT_TAG_BITS == 0);

/// Where a queue's recovery stands: the next command to send (Linux `mlx5e_tx_reporter_err_cqe_recover` and
/// `mlx5e_flush_rq`: read the state, ERR → RST, the ring reset, RST → RDY, the buffers posted again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Query,
    ToReset,
    ToReady,
}

#[derive(Clone, Copy, Debug)]
struct Recovery {
    step: Step,
    /// The tag of the command in flight.
    tag: Option<u64>,
    not_before_ms: u64,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery { step: Step::Query, tag: None, not_before_ms: 0 }
    }
}

/// The port's maintenance state (see [`EthPort::maintain`]).
#[derive(Debug, Default)]
pub(super) struct Maintenance {
    counter_tag: Option<u64>,
    next_counter_ms: u64,
    /// The last `out_of_buffer` read (the counter is free-running; the stats get the differences).
    last_out_of_buffer: u32,
    sq: Recovery,
    rq: Recovery,
    seq: u64,
}

impl Maintenance {
    /// A side-client tag: the purpose above bit 32, a sequence number below; always within the engine's
    /// client bits (checked at build time below).
    fn tag(&mut self, purpose: Purpose) -> u64 {
        self.seq = (self.seq + 1) & 0xffff_ffff;
        ((purpose as u64) << 32) | self.seq
    }

    /// Sends the next command of the SQ's or RQ's recovery (`command` builds it for the current step), unless
    /// one is in flight or the retry time has not come; returns whether one went out.
    fn recover(
        &mut self,
        purpose: Purpose,
        side: &mut SideClient,
        now_ms: u64,
        command: impl FnOnce(Step) -> crate::command::Command,
    ) -> bool {
        let r = if purpose == Purpose::Sq { self.sq } else { self.rq };
        if r.tag.is_some() || now_ms < r.not_before_ms {
            return false;
        }
        let tag = self.tag(purpose);
        if side.submit_as(tag, command(r.step)).is_err() {
            return false;
        }
        let r = if purpose == Purpose::Sq { &mut self.sq } else { &mut self.rq };
        r.tag = Some(tag);
        true
    }
}

impl<P: Platform> EthPort<P> {
    /// The port's upkeep after `into_engines`, driven by its owner (the core that runs the data path) with the
    /// command engine's [`SideClient`]; never waits. Each call first takes the side's completions, then submits
    /// what is due, at most one command in flight per purpose:
    ///
    /// - every [`Q_COUNTER_PERIOD_MS`], QUERY_Q_COUNTER; `out_of_buffer` grows `rx_out_of_buffer` by what it
    ///   moved since the last read;
    /// - when an error CQE put the SQ or the RQ in error, its recovery, one step per completion: QUERY_SQ/RQ
    ///   (nothing to do unless the queue is in ERR), MODIFY ERR → RST, the ring reset (leftover CQEs consumed,
    ///   counters and doorbell record 0, the receive WQEs written afresh), MODIFY RST → RDY, then for the RQ every
    ///   buffer posted again. Sends are refused ([`Dropped::QueueInError`](super::Dropped::QueueInError)) and
    ///   received buffers not reposted meanwhile. A failed step counts in `maintenance_errors` and is tried
    ///   again after [`RECOVERY_RETRY_MS`].
    ///
    /// Once the HCA is fatal nothing more is submitted. `now_ms` is any monotonic millisecond clock. Returns
    /// whether anything happened.
    pub fn maintain(&mut self, side: &mut SideClient, now_ms: u64) -> bool {
        let p = self.p.clone();
        let mut did = false;
        while let Some(c) = side.poll() {
            did = true;
            let m = &mut self.maint;
            if m.counter_tag == Some(c.tag) {
                m.counter_tag = None;
                match c.result {
                    Ok(out) => {
                        let v = ifc::eth::query_q_counter_out_of_buffer(&out);
                        self.stats.rx_out_of_buffer += u64::from(v.wrapping_sub(m.last_out_of_buffer));
                        m.last_out_of_buffer = v;
                    }
                    Err(e) => {
                        self.stats.maintenance_errors += 1;
                        log::warn!("mlx5: Ethernet port: {e}");
                    }
                }
            } else if m.sq.tag == Some(c.tag) {
                m.sq.tag = None;
                let tx = &mut self.tx;
                Self::advance(&mut m.sq, c.result, now_ms, &mut self.stats, |step, out, stats| match step {
                    Step::Query => match ifc::eth::query_sq_out(out).state {
                        MLX5_WQ_STATE_ERR => Some(Step::ToReset),
                        MLX5_WQ_STATE_RST => {
                            tx.reset(p.as_ref(), stats);
                            Some(Step::ToReady)
                        }
                        _ => {
                            tx.in_error = false;
                            None
                        }
                    },
                    Step::ToReset => {
                        tx.reset(p.as_ref(), stats);
                        Some(Step::ToReady)
                    }
                    Step::ToReady => {
                        tx.in_error = false;
                        stats.tx_recoveries += 1;
                        None
                    }
                });
            } else if m.rq.tag == Some(c.tag) {
                m.rq.tag = None;
                let rx = &mut self.rx;
                Self::advance(&mut m.rq, c.result, now_ms, &mut self.stats, |step, out, stats| match step {
                    Step::Query => match ifc::eth::query_rq_out(out).state {
                        MLX5_WQ_STATE_ERR => Some(Step::ToReset),
                        MLX5_WQ_STATE_RST => {
                            rx.reset(p.as_ref(), stats);
                            Some(Step::ToReady)
                        }
                        _ => {
                            // Ready after all: post again what was consumed meanwhile.
                            rx.post_all(p.as_ref());
                            None
                        }
                    },
                    Step::ToReset => {
                        rx.reset(p.as_ref(), stats);
                        Some(Step::ToReady)
                    }
                    Step::ToReady => {
                        rx.post_all(p.as_ref());
                        stats.rx_recoveries += 1;
                        None
                    }
                });
            }
        }
        if side.fatal().is_some() {
            return did;
        }
        let (sqn, rqn) = (self.info.sqn, self.info.rqn);
        let m = &mut self.maint;
        if let Some(q) = self.info.q_counter
            && m.counter_tag.is_none()
            && now_ms >= m.next_counter_ms
        {
            let tag = m.tag(Purpose::Counter);
            if side.submit_as(tag, ifc::eth::query_q_counter(q)).is_ok() {
                m.counter_tag = Some(tag);
                m.next_counter_ms = now_ms + Q_COUNTER_PERIOD_MS;
                did = true;
            }
        }
        if self.tx.in_error {
            did |= m.recover(Purpose::Sq, side, now_ms, |step| match step {
                Step::Query => ifc::eth::query_sq(sqn),
                Step::ToReset => ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RST),
                Step::ToReady => ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY),
            });
        }
        if self.rx.in_error {
            did |= m.recover(Purpose::Rq, side, now_ms, |step| match step {
                Step::Query => ifc::eth::query_rq(rqn),
                Step::ToReset => ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RST),
                Step::ToReady => ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY),
            });
        }
        did
    }

    /// Whether a maintenance command is in flight.
    pub fn maintenance_pending(&self) -> bool {
        let m = &self.maint;
        m.counter_tag.is_some() || m.sq.tag.is_some() || m.rq.tag.is_some()
    }

    /// Whether the send or the receive queue waits for recovery.
    pub fn in_error(&self) -> (bool, bool) {
        (self.tx.in_error, self.rx.in_error)
    }

    /// One recovery step finished: `on_ok` says the next step (`None`: done, back to the start). A failure is
    /// counted, and the same step waits [`RECOVERY_RETRY_MS`].
    fn advance(
        r: &mut Recovery,
        result: Result<crate::command::Output, CmdError>,
        now_ms: u64,
        stats: &mut EthStats,
        on_ok: impl FnOnce(Step, &crate::command::Output, &mut EthStats) -> Option<Step>,
    ) {
        match result {
            Ok(out) => r.step = on_ok(r.step, &out, stats).unwrap_or(Step::Query),
            Err(e) => {
                stats.maintenance_errors += 1;
                r.not_before_ms = now_ms + RECOVERY_RETRY_MS;
                log::warn!("mlx5: Ethernet port recovery: {e}");
            }
        }
    }
}
