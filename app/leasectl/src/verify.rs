//! `leasectl verify`: the revoke verifier (the spec's revoke test, docs/reference/revoke-spec.md §3.3). Per
//! iteration: HELLO → ALLOC with the requester's QP parameters → our QP to RTS → READY → a sustained RDMA
//! WRITE loop with READ-back checks → REVOKE while the loop keeps posting (non-cooperating, `--revoke-test`)
//! or stops at the outcome (`--cooperating`). It measures
//!
//! * (a) control-plane recall latency: REVOKE sent → outcome received;
//! * (b) dataplane first-fail latency: outcome received → the first failed completion (negative when the
//!   dataplane refused a request before the answer came back), with that completion's `ibv_wc_status`;
//!
//! and checks integrity: every WRITE that completed successfully before the revoke reads back; no request
//! posted after the outcome completes successfully; a lease allocated afterwards reads as zeros.
//!
//! The verifier is backend-neutral: it drives a [`Requester`] made by the caller's factory (the software
//! RoCEv2 requester here; a verbs backend later) and talks to the appliance through [`Control`].

pub mod command;
pub mod perf;
pub mod plot;
pub mod report;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use leasebox_client::setup::{self, SetupError};
use leasebox_proto::{AllocResp, ErrorCode, Outcome, Request, Response};

use crate::args::lease_str;
use crate::client::{Client, ClientError, Credentials, Timeouts};
use crate::rdma::{Completion, MacSource, QpState, RcConfig, Requester, WcOpcode, WcStatus};

/// `leasectl verify`'s exit code when a check fails (a figure over budget, a missing write, a success after
/// the outcome, a non-zero fresh lease, no failure seen). Codes 1–5 keep their meaning from `leasectl`.
pub const EXIT_VERIFY_FAILED: u8 = 6;

/// Which teardown order the REVOKE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The appliance's configured order (MKEY first by default): a plain REVOKE by the lease's tenant.
    MkeyFirst,
    /// The revoke spec's order (QP first; docs/reference/revoke-spec.md §2.1): REVOKE with `qp_first`, which only the
    /// admin may ask for.
    QpFirst,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::MkeyFirst => "mkey-first",
            Order::QpFirst => "qp-first",
        }
    }
}

/// What the client does when the outcome arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Non-cooperating: keeps posting until the dataplane refuses it.
    RevokeTest,
    /// Cooperating: stops posting at the outcome; (b) does not apply.
    Cooperating,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::RevokeTest => "revoke-test",
            Mode::Cooperating => "cooperating",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub mode: Mode,
    pub order: Order,
    pub iterations: u32,
    /// Each figure must stay within this.
    pub budget: Duration,
    /// Bytes per RDMA WRITE.
    pub size: u32,
    /// WRITEs (and READ checks) outstanding.
    pub depth: u32,
    /// How long the loop runs before the pre-revoke check and the REVOKE.
    pub warmup: Duration,
    /// The requester's QP attributes (`timeout`, `retry_cnt`), for the deadline of a silent dataplane.
    pub rc: RcConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::RevokeTest,
            order: Order::MkeyFirst,
            iterations: 1,
            budget: Duration::from_millis(2000),
            size: 4096,
            depth: 8,
            warmup: Duration::from_millis(100),
            rc: RcConfig::default(),
        }
    }
}

/// Where the appliance is and who talks to it: the lease's tenant, and the admin for `--order qp-first`.
#[derive(Clone, Debug)]
pub struct Control {
    pub addr: String,
    pub tenant: Credentials,
    pub admin: Option<Credentials>,
    pub timeouts: Timeouts,
}

/// Makes a fresh requester (a new QP in RESET) for each lease.
pub type RequesterFactory<'a> = dyn FnMut() -> Result<Box<dyn Requester>, String> + 'a;

/// The first completion that did not succeed.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstFail {
    pub status: WcStatus,
    pub wr_id: u64,
    /// When the status was decided (the NAK's arrival, the transport timer's expiry).
    pub at: Instant,
    /// Outcome received → this completion (µs, negative when it came first); `None` without an outcome.
    pub after_outcome_us: Option<i64>,
    /// REVOKE sent → this completion (µs, negative when it came first).
    pub after_revoke_us: Option<i64>,
}

/// One iteration's figures and checks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Iteration {
    pub index: u32,
    pub lease: String,
    pub outcome: Option<String>,
    /// (a) REVOKE sent → outcome received.
    pub recall_us: Option<u64>,
    /// The appliance's own REVOKE time (`elapsed_us` in the answer).
    pub server_us: Option<u32>,
    /// (b) outcome → first failed completion; `None` when cooperating or nothing failed.
    pub dataplane_us: Option<i64>,
    pub first_fail: Option<FirstFail>,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub bytes_written: u64,
    pub reads_ok: u64,
    /// Bytes compared by RDMA READ (periodic checks and the pre-revoke check).
    pub bytes_verified: u64,
    /// Successfully completed WRITEs whose bytes did not read back.
    pub missing_writes: u64,
    /// Completions that succeeded for requests posted after the outcome was received.
    pub late_successes: u64,
    /// Requests posted after the outcome was received.
    pub posted_after_outcome: u64,
    /// Bytes of a fresh lease (allocated after the revoke) read back, and how many were not zero.
    pub fresh_bytes_read: u64,
    pub fresh_nonzero: u64,
    /// The MAC the lease's RDMA frames went to and how the requester learned it (`None`: the backend does not
    /// say, e.g. verbs).
    pub remote_mac: Option<(MacSource, [u8; 6])>,
    pub failures: Vec<String>,
}

/// Every iteration and the verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub options: Options,
    pub iterations: Vec<Iteration>,
}

impl Report {
    pub fn passed(&self) -> bool {
        !self.iterations.is_empty() && self.iterations.iter().all(|i| i.failures.is_empty())
    }
}

/// A failure that stops the run before a report exists, with the exit code `leasectl` uses for it.
#[derive(Debug)]
pub struct VerifyError {
    pub exit: u8,
    pub message: String,
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn client_err(what: &str) -> impl Fn(ClientError) -> VerifyError + '_ {
    move |e| VerifyError { exit: e.exit_code(), message: format!("{what}: {e}") }
}

fn usage(message: String) -> VerifyError {
    VerifyError { exit: crate::client::exit::USAGE, message }
}

fn local(message: String) -> VerifyError {
    VerifyError { exit: EXIT_VERIFY_FAILED, message }
}

/// Runs the verifier; `Err` when it could not run (connection, authentication, ALLOC refused, requester).
pub fn run(opts: &Options, client: &Control, requesters: &mut RequesterFactory<'_>) -> Result<Report, String> {
    run_detailed(opts, client, requesters).map_err(|e| e.message)
}

/// [`run`] with the exit code of a failure to run.
pub fn run_detailed(
    opts: &Options,
    client: &Control,
    requesters: &mut RequesterFactory<'_>,
) -> Result<Report, VerifyError> {
    if opts.size == 0 || opts.depth == 0 || opts.iterations == 0 {
        return Err(usage("--size, --depth and --iterations must be at least 1".into()));
    }
    if opts.order == Order::QpFirst && client.admin.is_none() {
        return Err(usage(
            "--order qp-first: REVOKE with qp_first is admin-only; verify needs the admin key \
             (admin_key in the configuration file, or --admin-key HEX)"
                .into(),
        ));
    }
    let mut iterations = Vec::new();
    for index in 0..opts.iterations {
        iterations.push(iteration(index, opts, client, requesters)?);
    }
    Ok(Report { options: opts.clone(), iterations })
}

/// The most of a fresh lease read back to check that it holds zeros (a requester's buffers must take it).
pub const FRESH_READ_MAX: u64 = 64 << 10;

/// The bytes WRITE `wr_id` carries (never all zero, so a scrubbed region cannot pass for written data).
fn pattern(wr_id: u64, len: usize) -> Vec<u8> {
    let mut x = wr_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&(x | 0x0101_0101_0101_0101).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// How long ALLOC keeps retrying NO_MEMORY (the appliance's grace period, 5 s by default, plus its sweep).
const ALLOC_RETRY: Duration = Duration::from_secs(15);

/// ALLOC with `r`'s QP parameters, `r` to RTS toward the appliance's QP, READY (the client library's steps,
/// `leasebox_client::setup`, with the verifier's own NO_MEMORY patience).
fn open_lease(c: &mut Client, r: &mut dyn Requester, size: u64) -> Result<AllocResp, VerifyError> {
    let req = setup::alloc_request(&r.local(), size, 0).map_err(local)?;
    // Revoked leases come back to the pool only after the appliance's grace period (5 s by default): an ALLOC
    // answered NO_MEMORY is retried for a while rather than failing a long run.
    let give_up = Instant::now() + ALLOC_RETRY;
    let a = loop {
        match c.call(&Request::Alloc(req.clone())) {
            Ok(Response::Alloc(a)) => break a,
            Ok(other) => return Err(local(format!("ALLOC answered {other:?}"))),
            Err(ClientError::Server(e)) if e.code == ErrorCode::NoMemory && Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(client_err("ALLOC")(e)),
        }
    };
    setup::connect_and_ready(&mut |q| c.call(q), r, &a).map_err(|e| match e {
        SetupError::Params(m) | SetupError::Requester(m) | SetupError::Answer(m) => local(m),
        SetupError::Call(what, e) => client_err(what)(e),
    })?;
    Ok(a)
}

#[derive(Clone, Copy)]
enum Work {
    /// A WRITE of `pattern(wr_id)` into a region.
    Write { region: usize },
    /// A READ of a region, expected to hold `pattern(of)`.
    Read { of: u64 },
}

#[derive(Clone, Copy)]
struct Posted {
    work: Work,
    at: Instant,
}

/// The WRITE loop over one lease: regions of `size` bytes, `depth` requests outstanding.
struct Loop<'a> {
    r: &'a mut dyn Requester,
    base: u64,
    rkey: u32,
    size: usize,
    depth: usize,
    regions: usize,
    next_wr: u64,
    next_region: usize,
    posted: HashMap<u64, Posted>,
    /// The last WRITE that completed successfully into each region.
    landed: Vec<Option<u64>>,
    it: Iteration,
}

/// A READ check follows every this many WRITEs.
const CHECK_EVERY: u64 = 16;

impl Loop<'_> {
    fn outstanding(&self) -> usize {
        self.posted.len()
    }

    /// Posts a WRITE to the next region, and a READ check of it every [`CHECK_EVERY`] WRITEs.
    fn post_write(&mut self, outcome: Option<Instant>) -> Result<(), VerifyError> {
        let region = self.next_region;
        self.next_region = (self.next_region + 1) % self.regions;
        let wr = self.next_wr;
        self.next_wr += 1;
        let addr = self.base + (region * self.size) as u64;
        let data = pattern(wr, self.size);
        self.r.post_write(wr, addr, self.rkey, &data).map_err(|e| local(format!("posting WRITE {wr}: {e}")))?;
        let at = Instant::now();
        if outcome.is_some_and(|o| at > o) {
            self.it.posted_after_outcome += 1;
        }
        self.posted.insert(wr, Posted { work: Work::Write { region }, at });
        if wr.is_multiple_of(CHECK_EVERY) {
            self.post_read_of(wr, region, outcome)?;
        }
        Ok(())
    }

    fn post_read_of(&mut self, of: u64, region: usize, outcome: Option<Instant>) -> Result<(), VerifyError> {
        let wr = self.next_wr;
        self.next_wr += 1;
        let addr = self.base + (region * self.size) as u64;
        self.r.post_read(wr, addr, self.rkey, self.size as u32).map_err(|e| local(format!("posting READ: {e}")))?;
        let at = Instant::now();
        if outcome.is_some_and(|o| at > o) {
            self.it.posted_after_outcome += 1;
        }
        self.posted.insert(wr, Posted { work: Work::Read { of }, at });
        Ok(())
    }

    /// Polls once and accounts for every completion. `outcome`: when the REVOKE's answer arrived.
    fn poll(&mut self, wait: Duration, outcome: Option<Instant>) {
        for c in self.r.poll(wait) {
            self.complete(&c, outcome);
        }
    }

    fn complete(&mut self, c: &Completion, outcome: Option<Instant>) {
        let Some(p) = self.posted.remove(&c.wr_id) else {
            self.it.failures.push(format!("completion for unknown work request {}", c.wr_id));
            return;
        };
        if c.status == WcStatus::Success {
            if outcome.is_some_and(|o| p.at > o) {
                self.it.late_successes += 1;
            }
            match p.work {
                Work::Write { region } => {
                    self.landed[region] = Some(c.wr_id);
                    self.it.writes_ok += 1;
                    self.it.bytes_written += self.size as u64;
                }
                Work::Read { of } => {
                    self.it.reads_ok += 1;
                    let got = self.r.read_data(c.wr_id).unwrap_or_default();
                    self.it.bytes_verified += got.len() as u64;
                    if got != pattern(of, self.size) {
                        self.it.missing_writes += 1;
                    }
                }
            }
            return;
        }
        if c.opcode == WcOpcode::RdmaWrite || matches!(p.work, Work::Write { .. }) {
            self.it.writes_failed += 1;
        }
        if self.it.first_fail.is_none() {
            let (status, wr_id, at) = (c.status, c.wr_id, c.at);
            self.it.first_fail = Some(FirstFail { status, wr_id, at, after_outcome_us: None, after_revoke_us: None });
        }
    }

    /// Waits for every outstanding request (until `deadline`).
    fn drain(&mut self, deadline: Instant, outcome: Option<Instant>) -> bool {
        while self.outstanding() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            self.poll(Duration::from_millis(2), outcome);
        }
        true
    }

    /// Keeps `depth` requests outstanding for `run_for`.
    fn sustain(&mut self, run_for: Duration) -> Result<(), VerifyError> {
        let end = Instant::now() + run_for;
        while Instant::now() < end && self.it.first_fail.is_none() {
            while self.outstanding() < self.depth {
                self.post_write(None)?;
            }
            self.poll(Duration::from_millis(1), None);
        }
        Ok(())
    }

    /// Reads back every region a WRITE landed in.
    fn check_all(&mut self, deadline: Instant) -> Result<(), VerifyError> {
        let todo: Vec<(usize, u64)> =
            self.landed.iter().enumerate().filter_map(|(region, w)| w.map(|w| (region, w))).collect();
        for (region, of) in todo {
            while self.outstanding() >= self.depth {
                if Instant::now() >= deadline {
                    return Ok(());
                }
                self.poll(Duration::from_millis(2), None);
            }
            self.post_read_of(of, region, None)?;
        }
        self.drain(deadline, None);
        Ok(())
    }
}

/// Signed microseconds `to - from`.
fn signed_us(from: Instant, to: Instant) -> i64 {
    if to >= from { to.duration_since(from).as_micros() as i64 } else { -(from.duration_since(to).as_micros() as i64) }
}

fn connect(c: &Control, who: &Credentials) -> Result<Client, VerifyError> {
    Client::connect_and_hello(&c.addr, who, c.timeouts).map(|(c, _)| c).map_err(client_err(if who.name == "admin" {
        "HELLO (admin)"
    } else {
        "HELLO"
    }))
}

/// The requester's retry time: (1 + retry_cnt) transport timer periods.
fn retry_time(rc: &RcConfig) -> Duration {
    rc.transport_timeout().unwrap_or(Duration::from_secs(10)) * (u32::from(rc.retry_cnt) + 1)
}

fn iteration(
    index: u32,
    opts: &Options,
    control: &Control,
    requesters: &mut RequesterFactory<'_>,
) -> Result<Iteration, VerifyError> {
    let mut tenant = connect(control, &control.tenant)?;
    let mut admin = match (opts.order, &control.admin) {
        (Order::QpFirst, Some(who)) => Some(connect(control, who)?),
        _ => None,
    };
    let size = opts.size as usize;
    let depth = opts.depth as usize;
    let regions = (2 * depth).max(2);
    let lease_len = (size * regions) as u64;
    let mut r = requesters().map_err(|e| local(format!("requester: {e}")))?;
    let a = open_lease(&mut tenant, r.as_mut(), lease_len)?;
    let remote_mac = r.remote_mac();
    let mut l = Loop {
        r: r.as_mut(),
        base: a.remote_addr,
        rkey: a.rkey,
        size,
        depth,
        regions,
        next_wr: 1,
        next_region: 0,
        posted: HashMap::new(),
        landed: vec![None; regions],
        it: Iteration { index, lease: lease_str(a.lease), remote_mac, ..Iteration::default() },
    };
    let slack = retry_time(&opts.rc) + Duration::from_secs(1);

    // Before the revoke: a sustained loop, then everything that landed must read back.
    l.sustain(opts.warmup)?;
    if let Some(f) = &l.it.first_fail {
        let msg = format!("before the revoke: work request {} failed with {}", f.wr_id, f.status.name());
        l.it.failures.push(msg);
    }
    if !l.drain(Instant::now() + slack, None) {
        l.it.failures.push("before the revoke: requests still outstanding after the retry time".into());
    }
    l.check_all(Instant::now() + slack)?;
    l.it.first_fail = None;

    // The revoke: REVOKE on a thread of its own while this one keeps the dataplane busy.
    let outcome_at: OnceLock<Instant> = OnceLock::new();
    let revoke_sent: OnceLock<Instant> = OnceLock::new();
    let revoker: &mut Client = admin.as_mut().unwrap_or(&mut tenant);
    let req = Request::Revoke { lease: a.lease, qp_first: opts.order == Order::QpFirst };
    let answer = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let _ = revoke_sent.set(Instant::now());
            let r = revoker.call(&req);
            let _ = outcome_at.set(Instant::now());
            r
        });
        let deadline = Instant::now() + opts.budget + slack + Duration::from_secs(1);
        let mut result = Ok(());
        loop {
            let outcome = outcome_at.get().copied();
            let stop_posting = match opts.mode {
                Mode::Cooperating => outcome.is_some(),
                Mode::RevokeTest => l.it.first_fail.is_some() || l.r.qp_state() == QpState::Err,
            };
            if !stop_posting {
                while l.outstanding() < l.depth {
                    if let Err(e) = l.post_write(outcome) {
                        result = Err(e);
                        break;
                    }
                }
            }
            l.poll(Duration::from_millis(1), outcome);
            let done = outcome.is_some() && stop_posting && l.outstanding() == 0;
            if done || result.is_err() || Instant::now() >= deadline {
                break;
            }
        }
        (t.join().unwrap_or_else(|_| Err(ClientError::Protocol("the REVOKE thread panicked".into()))), result)
    });
    let (answer, posted) = answer;
    posted?;
    let (sent, got) = (revoke_sent.get().copied(), outcome_at.get().copied());
    let budget_us = opts.budget.as_micros() as i64;
    match answer {
        Ok(Response::Revoke { outcome, elapsed_us }) => {
            l.it.outcome = Some(outcome.name().to_string());
            l.it.server_us = Some(elapsed_us);
            if let (Some(s), Some(g)) = (sent, got) {
                l.it.recall_us = Some(g.duration_since(s).as_micros() as u64);
            }
            if outcome == Outcome::NotFound {
                l.it.failures.push("REVOKE answered NotFound for a live lease".into());
            }
        }
        Ok(other) => l.it.failures.push(format!("REVOKE answered {other:?}")),
        Err(e) => return Err(client_err("REVOKE")(e)),
    }
    if l.it.recall_us.is_some_and(|us| us as i64 > budget_us) {
        let msg = format!("recall latency {} ms exceeds the budget", l.it.recall_us.unwrap_or(0) / 1000);
        l.it.failures.push(msg);
    }
    if let Some(f) = l.it.first_fail.as_mut() {
        // Signed: with MKEY first the NAK may well arrive before the REVOKE's answer does.
        f.after_outcome_us = got.map(|g| signed_us(g, f.at));
        f.after_revoke_us = sent.map(|s| signed_us(s, f.at));
    }
    l.it.dataplane_us = match opts.mode {
        Mode::Cooperating => None,
        Mode::RevokeTest => l.it.first_fail.as_ref().and_then(|f| f.after_outcome_us),
    };
    if opts.mode == Mode::RevokeTest {
        match l.it.dataplane_us {
            None => l.it.failures.push("no failed completion after the revoke".into()),
            Some(us) if us > budget_us => {
                l.it.failures.push(format!("dataplane first-fail latency {} ms exceeds the budget", us / 1000))
            }
            Some(_) => {}
        }
    }
    if l.outstanding() > 0 {
        l.it.failures.push(format!("{} requests still outstanding at the end", l.outstanding()));
    }
    if l.it.missing_writes > 0 {
        l.it.failures.push(format!("{} successfully completed writes did not read back", l.it.missing_writes));
    }
    if l.it.late_successes > 0 {
        l.it.failures.push(format!("{} requests posted after the outcome succeeded", l.it.late_successes));
    }
    let mut it = l.it;
    drop(r);

    // A fresh lease must read as zeros.
    let mut r2 = requesters().map_err(|e| local(format!("requester: {e}")))?;
    let b = open_lease(&mut tenant, r2.as_mut(), lease_len)?;
    let len = lease_len.min(FRESH_READ_MAX) as u32;
    r2.post_read(1, b.remote_addr, b.rkey, len).map_err(|e| local(format!("posting READ: {e}")))?;
    let end = Instant::now() + slack;
    let mut done = None;
    while done.is_none() && Instant::now() < end {
        done = r2.poll(Duration::from_millis(5)).into_iter().find(|c| c.wr_id == 1);
    }
    match done {
        Some(c) if c.status == WcStatus::Success => {
            let data = r2.read_data(1).unwrap_or_default();
            it.fresh_bytes_read = data.len() as u64;
            it.fresh_nonzero = data.iter().filter(|&&x| x != 0).count() as u64;
            if it.fresh_nonzero > 0 || data.len() != len as usize {
                it.failures.push(format!("a fresh lease holds {} non-zero bytes", it.fresh_nonzero));
            }
        }
        Some(c) => it.failures.push(format!("READ of a fresh lease failed with {}", c.status.name())),
        None => it.failures.push("READ of a fresh lease did not complete".into()),
    }
    let _ = tenant.call(&Request::Free { lease: b.lease });
    let _ = tenant.bye();
    if let Some(a) = admin {
        let _ = a.bye();
    }
    Ok(it)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_and_are_never_zero() {
        let (a, b) = (pattern(1, 4096), pattern(2, 4096));
        assert_ne!(a, b);
        assert!(a.iter().chain(&b).all(|&x| x != 0));
        assert_eq!(pattern(7, 13), pattern(7, 13));
        assert_eq!(pattern(7, 13).len(), 13);
    }

    #[test]
    fn retry_time_follows_timeout_and_retries() {
        let rc = RcConfig { timeout: 10, retry_cnt: 7, ..RcConfig::default() };
        assert_eq!(retry_time(&rc), Duration::from_nanos(4096 << 10) * 8);
    }
}
