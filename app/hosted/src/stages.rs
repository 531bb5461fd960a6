//! Where a deferred lease operation's time goes in the hosted appliance (docs/latency.md): a timestamp at each
//! hand-off between its threads, taken only while a reader has switched them on ([`Stages::record`]), and
//! counters of what woke the service thread and the connection threads, always on (an atomic add each).
//!
//! The stages of one operation, in order: the connection thread's read returns; the session core hands the
//! request to the lease service (under the server's lock); the engines' thread finishes its last pass with
//! work (the operation's last command completion reaches the service's ring); the service thread's pass
//! delivers the answer; the connection thread writes it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use leasebox_proto::Op;
use leasebox_session::ConnId;

/// What ran a pass of the service thread (the session core's timers and the lease service's step).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cause {
    /// The engines' thread finished a pass that did work (a command completion, an event) and woke it.
    Engine,
    /// A connection's input left work under way and woke it.
    Input,
    /// Its pause ran out.
    #[default]
    Timer,
    /// Not a pass of the service thread: the answer was ready during the request's own input.
    Inline,
}

/// Wake-up counts since start.
#[derive(Debug, Default)]
pub struct Counters {
    /// Service-thread passes run because the engines woke it.
    pub passes_engine: AtomicU64,
    /// Service-thread passes run because input woke it.
    pub passes_input: AtomicU64,
    /// Service-thread passes run because their pause ran out.
    pub passes_timer: AtomicU64,
    /// Connection-thread passes begun because another thread queued output for it and woke it.
    pub conn_woken: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Passes {
    pub engine: u64,
    pub input: u64,
    pub timer: u64,
    pub conn_woken: u64,
}

/// One deferred operation, its stages in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub op: Op,
    /// The connection thread's read returned → the lease service took the request (the server's lock, the
    /// record layer, dispatch, the first command queued).
    pub read_to_op: u32,
    /// The request taken → its answer delivered by the session core (the HCA's commands and every hand-off
    /// between them).
    pub op_to_answer: u32,
    /// Of which the operation's commands as the driver timed them (doorbell → completion seen), summed, and
    /// how many there were ([`Stages::commands_of`] tells which commands count as the operation's).
    pub command_us: u32,
    pub commands: u32,
    /// The engines' last pass with work before the answer (its completion on the service's ring) → the answer
    /// delivered.
    pub completion_to_answer: u32,
    /// The answer delivered → written to the socket by the connection thread.
    pub answer_to_written: u32,
    /// Service-thread passes between the request and its answer.
    pub passes: u32,
    /// What ran the pass that delivered the answer.
    pub cause: Cause,
}

#[derive(Default)]
struct Open {
    read_at: Option<Instant>,
    op_at: Option<Instant>,
    log_seq: u64,
    passes_at: u64,
}

#[derive(Default)]
struct Inner {
    /// Requests taken, by connection and request id.
    open: HashMap<(ConnId, u32), Open>,
    /// Answers delivered and not yet written, per connection: the sample and when it was delivered.
    delivered: HashMap<ConnId, Vec<(Sample, Instant)>>,
    done: Vec<Sample>,
}

/// The most samples kept (the oldest are dropped past it).
const MAX_SAMPLES: usize = 100_000;

/// The hosted appliance's stage clock ([`crate::Hosted::stages`]).
pub struct Stages {
    on: AtomicBool,
    start: Instant,
    /// The engines' last pass with work, in ns since `start`.
    engine_work_ns: AtomicU64,
    pub counters: Counters,
    inner: Mutex<Inner>,
}

impl Default for Stages {
    fn default() -> Self {
        Stages {
            on: AtomicBool::new(false),
            start: Instant::now(),
            engine_work_ns: AtomicU64::new(0),
            counters: Counters::default(),
            inner: Mutex::default(),
        }
    }
}

impl Stages {
    /// Starts (or stops) taking timestamps; starting drops the samples taken so far.
    pub fn record(&self, on: bool) {
        if on {
            *self.lock() = Inner::default();
        }
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The samples of the operations answered and written since [`Stages::record`].
    pub fn samples(&self) -> Vec<Sample> {
        self.lock().done.clone()
    }

    pub fn passes(&self) -> Passes {
        let c = &self.counters;
        Passes {
            engine: c.passes_engine.load(Ordering::Relaxed),
            input: c.passes_input.load(Ordering::Relaxed),
            timer: c.passes_timer.load(Ordering::Relaxed),
            conn_woken: c.conn_woken.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn total_passes(&self) -> u64 {
        let p = self.passes();
        p.engine + p.input + p.timer
    }

    pub(crate) fn pass(&self, cause: Cause) {
        let c = match cause {
            Cause::Engine => &self.counters.passes_engine,
            Cause::Input => &self.counters.passes_input,
            Cause::Timer | Cause::Inline => &self.counters.passes_timer,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn conn_woken(&self) {
        self.counters.conn_woken.fetch_add(1, Ordering::Relaxed);
    }

    /// The engines' thread finished a pass that did work.
    pub(crate) fn engine_work(&self) {
        if self.on() {
            self.engine_work_ns.store(self.start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// The lease service took request `request_id` of `conn`, read from the socket at `read_at`; `log_seq`:
    /// the driver's command log's next sequence number.
    pub(crate) fn op(&self, conn: ConnId, request_id: u32, read_at: Option<Instant>, log_seq: u64) {
        if !self.on() {
            return;
        }
        let passes_at = self.total_passes();
        let o = Open { read_at, op_at: Some(Instant::now()), log_seq, passes_at };
        self.lock().open.insert((conn, request_id), o);
    }

    /// Whether request `request_id` of `conn` is being timed (its log sequence number, to sum its commands).
    pub(crate) fn log_seq(&self, conn: ConnId, request_id: u32) -> Option<u64> {
        if !self.on() {
            return None;
        }
        self.lock().open.get(&(conn, request_id)).map(|o| o.log_seq)
    }

    /// The answer to `request_id` of `conn` was delivered, in a pass that `cause` ran; `commands`: its commands'
    /// count and driver time in ns.
    pub(crate) fn answered(&self, conn: ConnId, request_id: u32, op: Op, cause: Cause, commands: (u32, u64)) {
        if !self.on() {
            return;
        }
        let now = Instant::now();
        let passes = self.total_passes();
        let work = self.start + std::time::Duration::from_nanos(self.engine_work_ns.load(Ordering::Relaxed));
        let mut inner = self.lock();
        let Some(o) = inner.open.remove(&(conn, request_id)) else { return };
        let us = |a: Option<Instant>, b: Instant| a.map_or(0, |a| b.saturating_duration_since(a).as_micros() as u32);
        let s = Sample {
            op,
            read_to_op: o.op_at.map_or(0, |op| us(o.read_at, op)),
            op_to_answer: us(o.op_at, now),
            command_us: (commands.1 / 1000) as u32,
            commands: commands.0,
            completion_to_answer: if o.op_at.is_some_and(|op| work >= op) { us(Some(work), now) } else { 0 },
            answer_to_written: 0,
            passes: passes.saturating_sub(o.passes_at) as u32,
            cause,
        };
        inner.delivered.entry(conn).or_default().push((s, now));
    }

    /// The connection thread wrote all `conn`'s output so far.
    pub(crate) fn written(&self, conn: ConnId) {
        if !self.on() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(list) = inner.delivered.remove(&conn) else { return };
        for (mut s, at) in list {
            s.answer_to_written = now.saturating_duration_since(at).as_micros() as u32;
            if inner.done.len() >= MAX_SAMPLES {
                inner.done.remove(0);
            }
            inner.done.push(s);
        }
    }

    /// The connection is gone: what it had not written is dropped.
    pub(crate) fn closed(&self, conn: ConnId) {
        if self.on() {
            let mut inner = self.lock();
            inner.delivered.remove(&conn);
            inner.open.retain(|(c, _), _| *c != conn);
        }
    }

    /// Whether a command (by its mlx5 opcode name) belongs to an operation `op` on its own path: ALLOC's are the
    /// ones that build a lease's objects, REVOKE's and FREE's the immediate phase's; the sweep's teardown of
    /// earlier leases, which runs beside them, is left out.
    pub fn commands_of(op: Op, opcode: &str) -> bool {
        match op {
            Op::Alloc => matches!(
                opcode,
                "ALLOC_PD" | "CREATE_MKEY" | "CREATE_QP" | "RST2INIT_QP" | "INIT2RTR_QP" | "RTR2RTS_QP"
            ),
            Op::Revoke | Op::Free => matches!(opcode, "DESTROY_MKEY" | "2ERR_QP"),
            _ => true,
        }
    }
}

/// p50 and p99 of `f` over `samples`, µs (0 for none).
pub fn percentiles(samples: &[Sample], f: impl Fn(&Sample) -> u32) -> (u32, u32) {
    let mut v: Vec<u32> = samples.iter().map(f).collect();
    v.sort_unstable();
    let at = |p: f64| v.get(((v.len().saturating_sub(1)) as f64 * p) as usize).copied().unwrap_or(0);
    (at(0.5), at(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_follows_its_request_to_the_socket_and_only_while_on() {
        let s = Stages::default();
        let c = ConnId(7);
        s.op(c, 1, Some(Instant::now()), 0);
        s.answered(c, 1, Op::Alloc, Cause::Engine, (6, 660_000));
        s.written(c);
        assert!(s.samples().is_empty(), "off: nothing recorded");
        s.record(true);
        s.op(c, 2, Some(Instant::now()), 5);
        assert_eq!(s.log_seq(c, 2), Some(5));
        s.pass(Cause::Engine);
        s.pass(Cause::Timer);
        s.engine_work();
        s.answered(c, 2, Op::Alloc, Cause::Engine, (6, 660_000));
        // Another connection's write does not complete it.
        s.written(ConnId(8));
        assert!(s.samples().is_empty());
        s.written(c);
        let got = s.samples();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].op, got[0].commands, got[0].command_us), (Op::Alloc, 6, 660));
        assert_eq!((got[0].passes, got[0].cause), (2, Cause::Engine));
        assert_eq!(s.passes(), Passes { engine: 1, input: 0, timer: 1, conn_woken: 0 });
        // An answer to a request never seen (taken before recording began) is not a sample.
        s.answered(c, 3, Op::Free, Cause::Timer, (0, 0));
        s.written(c);
        assert_eq!(s.samples().len(), 1);
    }

    #[test]
    fn the_sweeps_commands_are_not_an_allocs() {
        assert!(Stages::commands_of(Op::Alloc, "RTR2RTS_QP"));
        assert!(!Stages::commands_of(Op::Alloc, "DESTROY_QP"));
        assert!(Stages::commands_of(Op::Revoke, "DESTROY_MKEY"));
        assert!(!Stages::commands_of(Op::Revoke, "DEALLOC_PD"));
    }

    #[test]
    fn percentiles_of_nothing_are_zero() {
        assert_eq!(percentiles(&[], |s| s.op_to_answer), (0, 0));
    }
}
