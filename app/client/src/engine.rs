//! The data path behind [`crate::Lease`] and [`crate::Client::submit`]: each lease's requester, its work
//! requests in flight and its queue ([`LeaseCore`]), and the client's completions ([`Engine`]).
//!
//! **Work.** An operation (one read or write: a [`Job`]) is cut into work requests ([`Chunk`]s): READs of at
//! most [`READ_CHUNK`] bytes with at most [`READ_IN_FLIGHT`] bytes outstanding per lease (a READ's responses come
//! as a burst the software requester's socket must hold), WRITEs whole up to [`WRITE_CHUNK`]. A lease keeps at
//! most its queue depth of work requests posted ([`DEFAULT_QUEUE_DEPTH`] unless configured); the rest wait in
//! its queue, in order.
//!
//! **Who moves the requesters.** A blocking call on a [`crate::Lease`] posts its own work requests and polls the
//! requester on the calling thread, as it always did. Batches ([`crate::Client::submit`]) are moved by the
//! client's progress thread, started at the first batch: it drives every lease that has work queued, posted or
//! waiting for a verdict, and parks when none has. A caller in [`crate::Client::wait`] drives them too while it
//! waits (a completion then reaches it without a hand-over between threads: at depth 1 that halved a 4 KiB
//! batch's round trip in `bench client`). Whoever polls a lease hands every completion to its operation,
//! whichever caller it belongs to (a lease's state is behind one mutex; the progress thread and waiters only
//! try-lock, so they never wait behind a caller).
//!
//! **Failures.** A completion that fails while the lease is not known to be gone starts a verdict on a thread of
//! its own (QUERY, as `settle` says): revoked → the lease's operations fail with [`Error::Revoked`] (and the
//! client sends the event); alive → its QP is broken, [`Error::Rdma`]. Either way only that lease's operations
//! fail. A lease whose posted work has made no progress for the client's `rdma_timeout` is stuck: its requester
//! is dropped (its QP destroyed, so nothing reads or writes the memory of its work requests any more), its
//! operations fail with [`Error::Timeout`] and later calls with [`Error::Rdma`] (`IBV_WC_RETRY_EXC_ERR`).
//!
//! **Completions of batches** queue in the [`Engine`] until [`crate::Client::poll`] or [`crate::Client::wait`]
//! takes them; its completion fd (one end of a socket pair) holds one byte exactly while that queue is not
//! empty, so it polls readable then.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use leasebox_proto::{LeaseId, Outcome, Request};

use crate::batch::{Completed, Ticket, Wait};
use crate::client::Inner;
use crate::error::Error;
use crate::event::Event;
use crate::rdma::{Completion, MemoryDomain, Requester, Sge, WcStatus};
use crate::region::{RegionHold, RegionInner};
use crate::session::{Cmd, LeaseShared, Session, settle};

/// READs are cut into pieces of this many bytes…
pub(crate) const READ_CHUNK: u64 = 64 << 10;
/// …and at most this many READ bytes are outstanding on a lease (see the module documentation; a 1 MiB READ
/// is 256 packets of 4 KiB, and with several clients on a busy machine the software requester's socket drops
/// what its receive buffer cannot hold, so the drops would outlast the QP's retries).
pub(crate) const READ_IN_FLIGHT: u64 = 128 << 10;
/// WRITEs go whole up to this (an SGE's length is 32 bits, a message at most 2^31 bytes).
pub(crate) const WRITE_CHUNK: u64 = 1 << 30;
/// Work requests a lease keeps posted unless [`crate::ClientConfig::queue_depth`] says otherwise.
pub const DEFAULT_QUEUE_DEPTH: usize = 64;
/// The most a lease may keep posted.
pub const MAX_QUEUE_DEPTH: usize = 4096;
/// A blocking call's longest wait in one poll: short, so the deadline and the other leases are looked at often.
const POLL_STEP: Duration = Duration::from_millis(5);
/// The progress thread's longest wait in one poll when it drives a single lease.
const PROGRESS_STEP: Duration = Duration::from_millis(1);
/// A pause when nothing moved and nothing can be waited on (the software requester's own fine step).
const IDLE_STEP: Duration = Duration::from_micros(50);
/// The progress thread's pause when its leases have nothing posted, only verdicts under way (QUERY round trips).
const VERDICT_STEP: Duration = Duration::from_millis(1);

/// Scatter/gather pieces into memory a [`RegionHold`] (or a bounce buffer) keeps valid.
#[derive(Clone)]
pub(crate) struct Pieces(Vec<Sge>);

// SAFETY: the pointers name memory held for the work request (a region hold in its job, or its bounce buffer),
// which stays valid wherever the list goes; it is dereferenced only by the requester it is posted to.
#[allow(unsafe_code)]
unsafe impl Send for Pieces {}

/// A copying call's private registered memory for one work request: a buffer of its own (software requester), or
/// a slot of the lease's registered pool (verbs), returned when dropped.
pub(crate) struct Bounce {
    region: Arc<RegionInner>,
    at: usize,
    len: usize,
    lkey: u32,
    slot: Option<(Arc<SlotPool>, usize)>,
}

impl Bounce {
    fn sge(&self) -> Sge {
        self.region.sge(self.at, self.len as u32, self.lkey)
    }

    /// Copies the bounce buffer's bytes to `out` (its length).
    ///
    /// # Safety
    ///
    /// The READ that filled it has completed (nothing writes it any more).
    #[allow(unsafe_code)]
    unsafe fn copy_out(&self, out: &mut [u8]) {
        let n = out.len().min(self.len);
        // SAFETY: inside the buffer; the caller's promise: nothing writes it now.
        unsafe { self.region.read_at(self.at, &mut out[..n]) };
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        if let Some((pool, i)) = self.slot.take() {
            pool.free.lock().unwrap_or_else(|e| e.into_inner()).push(i);
        }
    }
}

/// The verbs backend's bounce buffers: one registered region per lease, in slots.
pub(crate) struct SlotPool {
    region: Arc<RegionInner>,
    slot_len: usize,
    lkey: u32,
    free: Mutex<Vec<usize>>,
}

/// Where a work request's local bytes are.
pub(crate) enum Src {
    /// The caller's registered memory (zero copy).
    Pieces(Pieces),
    /// A copying call's bounce buffer.
    Bounce(Bounce),
}

/// One work request of a job, queued or posted.
pub(crate) struct Chunk {
    job: Arc<Job>,
    read: bool,
    /// Offset in the lease.
    lease_off: u64,
    len: u64,
    /// Offset in the job's bytes (where a copying READ's bytes go).
    at: u64,
    src: Src,
}

#[derive(Default)]
struct JobState {
    /// Work requests not completed yet (posted, queued or not made yet).
    remaining: usize,
    /// Work requests that failed while the lease's verdict is not known yet.
    awaiting: usize,
    error: Option<Error>,
    /// The result was given (a batch's: queued in the engine).
    reported: bool,
    /// A copying READ's completed bounce buffers, not yet copied out: (offset in the job, buffer).
    ready: Vec<(u64, Bounce)>,
}

/// One operation: a read or write, of a blocking call or of a batch.
pub(crate) struct Job {
    /// A batch's ticket; `None` for a blocking call's (its caller looks at the state itself).
    ticket: Option<Ticket>,
    len: usize,
    /// The caller's memory this job reads or writes, held until every work request of it is done (the job is
    /// dropped when the last chunk referring to it is).
    _holds: Vec<RegionHold>,
    st: Mutex<JobState>,
}

impl Job {
    fn new(ticket: Option<Ticket>, len: usize, holds: Vec<RegionHold>, chunks: usize) -> Job {
        Job { ticket, len, _holds: holds, st: Mutex::new(JobState { remaining: chunks, ..JobState::default() }) }
    }

    fn state(&self) -> MutexGuard<'_, JobState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result once every work request is done: gives a batch's to the engine.
    fn report_if_done(&self, st: &mut JobState, engine: &Engine) {
        if st.reported || st.remaining > 0 || st.awaiting > 0 {
            return;
        }
        st.reported = true;
        if let Some(t) = self.ticket {
            let r = match &st.error {
                Some(e) => Err(e.again()),
                None => Ok(self.len),
            };
            engine.push(t, r);
        }
    }

    /// One work request is done, successfully or with `err`.
    fn chunk_done(&self, engine: &Engine, err: Option<Error>) {
        let mut st = self.state();
        st.remaining = st.remaining.saturating_sub(1);
        if let Some(e) = err {
            st.error.get_or_insert(e);
        }
        self.report_if_done(&mut st, engine);
    }

    /// One work request failed; what that means waits for the lease's verdict.
    fn chunk_failed_pending(&self) {
        let mut st = self.state();
        st.remaining = st.remaining.saturating_sub(1);
        st.awaiting += 1;
    }

    /// The lease's verdict on every failed work request of the job (they are all on that lease).
    fn verdict(&self, engine: &Engine, err: Error) {
        let mut st = self.state();
        st.awaiting = 0;
        st.error.get_or_insert(err);
        self.report_if_done(&mut st, engine);
    }

    /// Every work request of the job is done and no verdict is awaited: nothing refers to its memory any more.
    fn settled(&self) -> bool {
        let st = self.state();
        st.remaining == 0 && st.awaiting == 0
    }

    fn error(&self) -> Option<Error> {
        self.state().error.as_ref().map(Error::again)
    }

    fn take_ready(&self) -> Vec<(u64, Bounce)> {
        std::mem::take(&mut self.state().ready)
    }
}

/// A lease's data-path state: its requester and what is posted and queued.
pub(crate) struct LeaseIo {
    requester: Option<Box<dyn Requester + Send>>,
    next_wr: u64,
    inflight: HashMap<u64, Chunk>,
    queue: VecDeque<Chunk>,
    depth: usize,
    read_bytes: u64,
    /// The completion status that put the QP in error while the lease still existed, or the stuck lease's.
    broken: Option<WcStatus>,
    /// A verdict (QUERY) is under way.
    settling: bool,
    first_failure: Option<WcStatus>,
    /// Jobs with a failed work request, waiting for the verdict.
    held: Vec<Arc<Job>>,
    /// The last completion (or the first post after an idle spell).
    last_progress: Instant,
}

impl LeaseIo {
    /// Nothing queued, posted or waiting for a verdict.
    fn idle(&self) -> bool {
        self.inflight.is_empty() && self.queue.is_empty() && self.held.is_empty() && !self.settling
    }
}

impl Drop for LeaseIo {
    fn drop(&mut self) {
        // The requester first: once it is gone nothing touches the memory of its work requests, and only then
        // do the chunks (and their jobs' holds on that memory) go.
        drop(self.requester.take());
        self.inflight.clear();
    }
}

/// A lease as the data path sees it; [`crate::Lease`] is a handle on one. Shared with the progress thread
/// while it has work.
pub(crate) struct LeaseCore {
    pub(crate) inner: Arc<Inner>,
    pub(crate) appliance: usize,
    pub(crate) session: Arc<Session>,
    pub(crate) id: LeaseId,
    pub(crate) size: u64,
    remote_addr: u64,
    rkey: u32,
    pub(crate) shared: Arc<LeaseShared>,
    max_sge: usize,
    domain: Option<Arc<dyn MemoryDomain>>,
    /// Slots for the verbs bounce pool: (count, length); `None`: a buffer of their own per work request.
    slots: Option<(usize, usize)>,
    pool: Mutex<Option<Arc<SlotPool>>>,
    io: Mutex<LeaseIo>,
}

impl std::fmt::Debug for LeaseCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCore").field("id", &self.id).field("size", &self.size).finish_non_exhaustive()
    }
}

/// What [`LeaseCore::new`] is made of.
pub(crate) struct LeaseParts {
    pub(crate) inner: Arc<Inner>,
    pub(crate) appliance: usize,
    pub(crate) session: Arc<Session>,
    pub(crate) id: LeaseId,
    pub(crate) size: u64,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) shared: Arc<LeaseShared>,
    pub(crate) requester: Box<dyn Requester + Send>,
    pub(crate) slots: Option<(usize, usize)>,
    pub(crate) depth: usize,
}

/// A blocking call's work before it is posted: the copying calls' bounce buffers are made (and filled) only
/// when their work request goes out, so a large call does not hold a second copy of itself.
pub(crate) enum PlanSrc<'a> {
    Pieces(Pieces),
    /// WRITE these bytes of the caller's.
    Copy(&'a [u8]),
    /// READ into a bounce buffer.
    CopyRead,
}

pub(crate) struct Plan<'a> {
    job: usize,
    read: bool,
    lease_off: u64,
    len: u64,
    at: u64,
    src: PlanSrc<'a>,
}

/// One item of a blocking call.
pub(crate) enum Item<'a> {
    Write {
        offset: u64,
        data: &'a [u8],
    },
    Read {
        offset: u64,
        buf: &'a mut [u8],
    },
    /// Zero copy, from or into the pieces `(region, offset, len)`.
    Zero {
        read: bool,
        offset: u64,
        pieces: Vec<(Arc<RegionInner>, usize, usize)>,
    },
}

/// The pieces of a zero-copy operation, cut into work requests: `(offset in the operation, length, pieces)`.
type Cut = Vec<(u64, u64, Pieces)>;

/// Cuts `pieces` (address, length, lkey) into runs of at most `chunk` bytes.
fn cut(pieces: &[(*mut u8, usize, u32)], chunk: u64) -> Cut {
    let mut out: Cut = Vec::new();
    let mut cur: Vec<Sge> = Vec::new();
    let (mut cur_len, mut at) = (0u64, 0u64);
    for &(addr, len, lkey) in pieces {
        let mut off = 0usize;
        while off < len {
            let take = ((len - off) as u64).min(chunk - cur_len);
            cur.push(Sge { addr: addr.wrapping_add(off), len: take as u32, lkey });
            cur_len += take;
            off += take as usize;
            if cur_len == chunk {
                out.push((at, cur_len, Pieces(std::mem::take(&mut cur))));
                at += cur_len;
                cur_len = 0;
            }
        }
    }
    if cur_len > 0 {
        out.push((at, cur_len, Pieces(cur)));
    }
    out
}

impl LeaseCore {
    pub(crate) fn new(p: LeaseParts) -> LeaseCore {
        let max_sge = p.requester.max_sge().max(1);
        let domain = p.requester.domain();
        LeaseCore {
            inner: p.inner,
            appliance: p.appliance,
            session: p.session,
            id: p.id,
            size: p.size,
            remote_addr: p.remote_addr,
            rkey: p.rkey,
            shared: p.shared,
            max_sge,
            domain,
            slots: p.slots,
            pool: Mutex::new(None),
            io: Mutex::new(LeaseIo {
                requester: Some(p.requester),
                next_wr: 1,
                inflight: HashMap::new(),
                queue: VecDeque::new(),
                depth: p.depth.clamp(1, MAX_QUEUE_DEPTH),
                read_bytes: 0,
                broken: None,
                settling: false,
                first_failure: None,
                held: Vec::new(),
                last_progress: Instant::now(),
            }),
        }
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(crate) fn lock_io(&self) -> MutexGuard<'_, LeaseIo> {
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn max_sge(&self) -> usize {
        self.max_sge
    }

    pub(crate) fn depth(&self) -> usize {
        self.lock_io().depth
    }

    pub(crate) fn set_depth(&self, depth: usize) {
        self.lock_io().depth = depth.clamp(1, MAX_QUEUE_DEPTH);
    }

    /// Fails when the lease is known to be gone or its QP broken.
    pub(crate) fn gate(&self, io: &LeaseIo) -> Result<(), Error> {
        if let Some(outcome) = self.shared.revoked() {
            return Err(Error::Revoked { lease: self.id, outcome });
        }
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the lease was freed (or its client dropped)"));
        }
        if let Some(status) = io.broken {
            return Err(Error::Rdma { status, lease: self.id });
        }
        Ok(())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfRange { offset, len, size: self.size });
        }
        Ok(())
    }

    /// A zero-copy operation's pieces held and cut into work requests (lkeys from the lease's memory domain,
    /// registering a region there at its first use); refused before anything is sent when the range does not
    /// fit the lease, there are more pieces than a work request takes, or a piece cannot be held.
    pub(crate) fn prepare(
        &self,
        read: bool,
        offset: u64,
        pieces: &[(Arc<RegionInner>, usize, usize)],
    ) -> Result<(Vec<RegionHold>, Cut), Error> {
        let len: u64 = pieces.iter().map(|p| p.2 as u64).sum();
        self.check_range(offset, len)?;
        if pieces.len() > self.max_sge {
            return Err(Error::Config(format!(
                "{} pieces exceed the {} one work request takes here (Lease::max_sge)",
                pieces.len(),
                self.max_sge
            )));
        }
        let mut holds = Vec::with_capacity(pieces.len());
        let mut raw = Vec::with_capacity(pieces.len());
        for (region, at, n) in pieces {
            holds.push(region.hold(*at, *n, read)?);
            let lkey = match &self.domain {
                Some(d) => region.lkey(d)?,
                None => 0,
            };
            raw.push((region.sge(*at, 0, lkey).addr, *n, lkey));
        }
        let chunk = if read { READ_CHUNK } else { WRITE_CHUNK };
        Ok((holds, cut(&raw, chunk)))
    }

    /// Whether a work request of `len` bytes may be posted now.
    fn can_post(&self, io: &LeaseIo, read: bool, len: u64) -> bool {
        let Some(r) = io.requester.as_ref() else { return false };
        io.inflight.len() < io.depth
            && r.room() > 0
            && (!read || io.read_bytes == 0 || io.read_bytes + len <= READ_IN_FLIGHT)
    }

    /// Posts `c`; a refusal fails its work request with [`Error::Requester`].
    fn post(&self, io: &mut LeaseIo, c: Chunk) {
        let engine = self.engine();
        let wr = io.next_wr;
        let Some(r) = io.requester.as_mut() else {
            let status = io.broken.unwrap_or(WcStatus::GeneralErr);
            c.job.chunk_done(engine, Some(Error::Rdma { status, lease: self.id }));
            return;
        };
        io.next_wr += 1;
        let addr = self.remote_addr + c.lease_off;
        let sges = match &c.src {
            Src::Pieces(p) => p.0.clone(),
            Src::Bounce(b) => vec![b.sge()],
        };
        // SAFETY: the pieces are the caller's registered memory held by the job's region holds (writers of
        // overlapping bytes excluded), or the chunk's own bounce buffer; both live in the chunk, which stays in
        // `inflight` until the requester reports the work request's completion or the requester is dropped
        // (`LeaseIo::drop`, `LeaseCore::stuck`), and memory is registered in the requester's domain by
        // `prepare` / the bounce pool.
        #[allow(unsafe_code)]
        let posted = unsafe {
            if c.read {
                r.post_read_sg(wr, addr, self.rkey, &sges)
            } else {
                r.post_write_sg(wr, addr, self.rkey, &sges)
            }
        };
        match posted {
            Ok(()) => {
                if io.inflight.is_empty() {
                    io.last_progress = Instant::now();
                }
                if c.read {
                    io.read_bytes += c.len;
                }
                io.inflight.insert(wr, c);
            }
            Err(e) => {
                c.job.chunk_done(engine, Some(Error::Requester(format!("posting work request {wr}: {e}"))));
            }
        }
    }

    /// Fails every queued work request with `e`.
    fn fail_queue(&self, io: &mut LeaseIo, e: &Error) {
        for c in io.queue.drain(..) {
            c.job.chunk_done(self.engine(), Some(e.again()));
        }
    }

    /// Posts queued work, polls the requester (waiting at most `wait` when work is posted), hands the
    /// completions out, and gives up on a stuck lease. Whether anything happened.
    fn progress(self: &Arc<Self>, io: &mut LeaseIo, wait: Duration) -> bool {
        let mut moved = false;
        while let Some(c) = io.queue.front() {
            if let Err(e) = self.gate(io) {
                self.fail_queue(io, &e);
                moved = true;
                break;
            }
            if io.settling || !self.can_post(io, c.read, c.len) {
                break;
            }
            if let Some(c) = io.queue.pop_front() {
                self.post(io, c);
                moved = true;
            }
        }
        if io.inflight.is_empty() {
            return moved;
        }
        let done: Vec<Completion> = io.requester.as_mut().map(|r| r.poll(wait)).unwrap_or_default();
        for c in done {
            moved = true;
            self.complete(io, c);
        }
        if !io.inflight.is_empty() && self.shared.revoked().is_some() {
            // Known revoked (its notice came, or a verdict said so): what is still posted cannot succeed, and
            // its failures would come at the transport's pace (after a QP-first revoke, the retry timer's: on
            // Soft-RoCE under TCG more than `rdma_timeout`). Give up on them now, with the revoke.
            self.give_up(io, None);
            moved = true;
        } else if !io.inflight.is_empty() && io.last_progress.elapsed() > self.inner.rdma_timeout {
            self.stuck(io);
            moved = true;
        }
        moved
    }

    fn complete(self: &Arc<Self>, io: &mut LeaseIo, c: Completion) {
        let Some(chunk) = io.inflight.remove(&c.wr_id) else { return };
        if chunk.read {
            io.read_bytes = io.read_bytes.saturating_sub(chunk.len);
        }
        io.last_progress = Instant::now();
        let engine = self.engine();
        if c.status == WcStatus::Success {
            if u64::from(c.byte_len) != chunk.len {
                let e = Error::Requester(format!("a work request of {} bytes moved {} bytes", chunk.len, c.byte_len));
                chunk.job.chunk_done(engine, Some(e));
                return;
            }
            let Chunk { job, read, at, src, .. } = chunk;
            if let (true, Src::Bounce(b)) = (read, src) {
                job.state().ready.push((at, b));
            }
            job.chunk_done(engine, None);
            return;
        }
        match self.gate(io) {
            Err(e) => chunk.job.chunk_done(engine, Some(e)),
            Ok(()) => {
                io.first_failure.get_or_insert(c.status);
                chunk.job.chunk_failed_pending();
                if !io.held.iter().any(|j| Arc::ptr_eq(j, &chunk.job)) {
                    io.held.push(chunk.job.clone());
                }
                self.start_verdict(io);
            }
        }
    }

    /// No completion for `rdma_timeout`: the requester is dropped (nothing touches the memory of its work
    /// requests after that), its work fails with [`Error::Timeout`], the lease's QP counts as broken.
    fn stuck(&self, io: &mut LeaseIo) {
        self.give_up(io, Some(Error::Timeout { what: "RDMA completion", after: self.inner.rdma_timeout }));
    }

    /// Drops the requester (its QP destroyed: the NIC no longer reads or writes the memory of its work requests)
    /// and fails the lease's posted and queued work: with the revoke when the lease is known revoked, else with
    /// `e` (a stuck lease's timeout), and the QP counts as broken.
    fn give_up(&self, io: &mut LeaseIo, e: Option<Error>) {
        drop(io.requester.take());
        io.broken.get_or_insert(WcStatus::RetryExcErr);
        io.read_bytes = 0;
        let e = match (self.shared.revoked(), e) {
            (Some(outcome), _) => Error::Revoked { lease: self.id, outcome },
            (None, Some(e)) => e,
            (None, None) => Error::Rdma { status: WcStatus::RetryExcErr, lease: self.id },
        };
        let engine = self.engine();
        for (_, c) in io.inflight.drain() {
            c.job.chunk_done(engine, Some(e.again()));
        }
        self.fail_queue(io, &e);
    }

    /// A failed completion on a lease not known to be gone: is it revoked (QUERY, on a thread of its own so no
    /// other lease waits), or is its QP broken?
    fn start_verdict(self: &Arc<Self>, io: &mut LeaseIo) {
        if io.settling {
            return;
        }
        io.settling = true;
        let core = self.clone();
        let started = std::thread::Builder::new().name("leasebox verdict".into()).spawn(move || {
            let s = &core.session;
            let wait = core.inner.call_wait();
            let query = || match s.call(Request::Query { lease: core.id }, wait) {
                Ok(r) => Ok(r),
                Err(Error::Server { error, .. }) => Err(crate::ClientError::Server(error)),
                Err(e) => Err(crate::ClientError::Usage(e.to_string())),
            };
            let outcome = settle(query);
            let event = core.apply_verdict(&mut core.lock_io(), outcome);
            // Sent with the lease unlocked: the program's callback may use the lease.
            if let Some(e) = event {
                core.inner.sink.emit(e);
            }
        });
        if started.is_err() {
            // No thread, no QUERY: the QP is broken, and nothing to tell.
            let _ = self.apply_verdict(io, None);
        }
    }

    /// Fails the lease's held and queued work with the verdict; the event to send (the first time the client
    /// learns the lease is gone).
    fn apply_verdict(&self, io: &mut LeaseIo, outcome: Option<Outcome>) -> Option<Event> {
        io.settling = false;
        let status = io.first_failure.unwrap_or(WcStatus::GeneralErr);
        let mut event = None;
        let e = match outcome {
            Some(outcome) => {
                let _ = self.session.send(Cmd::Forget { lease: self.id });
                if self.shared.mark_revoked(outcome) {
                    let appliance = self.session.appliance.clone();
                    event = Some(Event::Revoked { appliance, lease: self.id, outcome });
                }
                Error::Revoked { lease: self.id, outcome: self.shared.revoked().unwrap_or(outcome) }
            }
            None => {
                io.broken = Some(status);
                Error::Rdma { status, lease: self.id }
            }
        };
        let engine = self.engine();
        for j in io.held.drain(..) {
            j.verdict(engine, e.again());
        }
        self.fail_queue(io, &e);
        engine.wake();
        event
    }

    /// A copying call's bounce buffer of `len` bytes (holding `data` for a WRITE); `None` while every slot of
    /// the lease's pool is in use. Counts the bytes copied in.
    fn bounce(&self, len: usize, data: Option<&[u8]>) -> Result<Option<Bounce>, Error> {
        let engine = self.engine();
        let Some((count, slot_len)) = self.slots else {
            let region = match data {
                Some(d) => {
                    engine.copied(d.len());
                    RegionInner::owned(d.to_vec())
                }
                None => RegionInner::owned(vec![0; len]),
            };
            return Ok(Some(Bounce { region: Arc::new(region), at: 0, len, lkey: 0, slot: None }));
        };
        let pool = {
            let mut g = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_ref() {
                Some(p) => p.clone(),
                None => {
                    let region = Arc::new(RegionInner::owned(vec![0; count * slot_len]));
                    let lkey = match &self.domain {
                        Some(d) => region.lkey(d)?,
                        None => 0,
                    };
                    let p = Arc::new(SlotPool { region, slot_len, lkey, free: Mutex::new((0..count).rev().collect()) });
                    *g = Some(p.clone());
                    p
                }
            }
        };
        let Some(i) = pool.free.lock().unwrap_or_else(|e| e.into_inner()).pop() else { return Ok(None) };
        let b = Bounce {
            region: pool.region.clone(),
            at: i * pool.slot_len,
            len,
            lkey: pool.lkey,
            slot: Some((pool.clone(), i)),
        };
        if let Some(d) = data {
            // SAFETY: the slot is inside the pool's region (`len <= slot_len`: the plans are cut so) and was free:
            // no work request uses it until this bounce is posted.
            #[allow(unsafe_code)]
            unsafe {
                b.region.write_at(b.at, d)
            };
            engine.copied(d.len());
        }
        Ok(Some(b))
    }

    /// The longest work request of a copying call (a slot, or [`WRITE_CHUNK`] / [`READ_CHUNK`]).
    fn copy_chunk(&self, read: bool) -> u64 {
        let limit = if read { READ_CHUNK } else { WRITE_CHUNK };
        self.slots.map_or(limit, |(_, l)| limit.min(l.max(1) as u64))
    }

    /// A blocking call: every range checked (and every zero-copy piece held) before anything is sent, then its
    /// work posted and polled on this thread until every work request of it is done, whatever the outcome (so
    /// none outlives the call's borrows). The first failed item's error, in the items' order.
    pub(crate) fn run(self: &Arc<Self>, items: Vec<Item<'_>>) -> Result<(), Error> {
        self.gate(&self.lock_io())?;
        for it in &items {
            match it {
                Item::Write { offset, data } => self.check_range(*offset, data.len() as u64)?,
                Item::Read { offset, buf } => self.check_range(*offset, buf.len() as u64)?,
                Item::Zero { .. } => {}
            }
        }
        let mut jobs: Vec<Arc<Job>> = Vec::with_capacity(items.len());
        let mut plans: Vec<Plan<'_>> = Vec::new();
        let mut outs: Vec<Option<&mut [u8]>> = Vec::with_capacity(items.len());
        for (j, it) in items.into_iter().enumerate() {
            let (read, offset, len, src): (bool, u64, u64, Option<&[u8]>) = match it {
                Item::Zero { read, offset, pieces } => {
                    let (holds, cuts) = self.prepare(read, offset, &pieces)?;
                    let len: u64 = cuts.iter().map(|c| c.1).sum();
                    jobs.push(Arc::new(Job::new(None, len as usize, holds, cuts.len())));
                    outs.push(None);
                    for (at, n, p) in cuts {
                        plans.push(Plan { job: j, read, lease_off: offset + at, len: n, at, src: PlanSrc::Pieces(p) });
                    }
                    continue;
                }
                Item::Write { offset, data } => {
                    outs.push(None);
                    (false, offset, data.len() as u64, Some(data))
                }
                Item::Read { offset, buf } => {
                    let len = buf.len() as u64;
                    outs.push(Some(buf));
                    (true, offset, len, None)
                }
            };
            let step = self.copy_chunk(read);
            let n = len.div_ceil(step);
            jobs.push(Arc::new(Job::new(None, len as usize, Vec::new(), n as usize)));
            for k in 0..n {
                let (at, l) = (k * step, (len - k * step).min(step));
                let src = match src {
                    Some(d) => PlanSrc::Copy(&d[at as usize..(at + l) as usize]),
                    None => PlanSrc::CopyRead,
                };
                plans.push(Plan { job: j, read, lease_off: offset + at, len: l, at, src });
            }
        }
        let engine = self.engine();
        let mut next = 0;
        loop {
            let (moved, nothing_posted) = {
                let mut io = self.lock_io();
                let mut moved = false;
                while next < plans.len() {
                    let p = &plans[next];
                    if let Err(e) = self.gate(&io) {
                        for q in &plans[next..] {
                            jobs[q.job].chunk_done(engine, Some(e.again()));
                        }
                        next = plans.len();
                        moved = true;
                        break;
                    }
                    if io.settling || !self.can_post(&io, p.read, p.len) {
                        break;
                    }
                    let src = match &p.src {
                        PlanSrc::Pieces(x) => Src::Pieces(x.clone()),
                        PlanSrc::Copy(d) => match self.bounce(d.len(), Some(*d)) {
                            Ok(Some(b)) => Src::Bounce(b),
                            Ok(None) => break,
                            Err(e) => {
                                jobs[p.job].chunk_done(engine, Some(e));
                                next += 1;
                                continue;
                            }
                        },
                        PlanSrc::CopyRead => match self.bounce(p.len as usize, None) {
                            Ok(Some(b)) => Src::Bounce(b),
                            Ok(None) => break,
                            Err(e) => {
                                jobs[p.job].chunk_done(engine, Some(e));
                                next += 1;
                                continue;
                            }
                        },
                    };
                    let c = Chunk {
                        job: jobs[p.job].clone(),
                        read: p.read,
                        lease_off: p.lease_off,
                        len: p.len,
                        at: p.at,
                        src,
                    };
                    self.post(&mut io, c);
                    next += 1;
                    moved = true;
                }
                if next == plans.len() && jobs.iter().all(|j| j.settled()) {
                    if !io.idle() {
                        // Another caller's work, or a batch's: the progress thread carries on with it.
                        self.inner.engine.activate(self);
                    }
                    break;
                }
                moved |= self.progress(&mut io, POLL_STEP);
                (moved, io.inflight.is_empty())
            };
            self.copy_out(&jobs, &mut outs);
            if !moved && nothing_posted {
                // Waiting for a verdict or a free slot, with nothing of ours to poll.
                std::thread::sleep(IDLE_STEP * 4);
            }
        }
        self.copy_out(&jobs, &mut outs);
        for j in &jobs {
            if let Some(e) = j.error() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Copies what the copying READs brought into the callers' buffers (counted as copied bytes).
    fn copy_out(&self, jobs: &[Arc<Job>], outs: &mut [Option<&mut [u8]>]) {
        for (j, out) in jobs.iter().zip(outs.iter_mut()) {
            let Some(buf) = out.as_deref_mut() else { continue };
            for (at, b) in j.take_ready() {
                let at = at as usize;
                let end = (at + b.len).min(buf.len());
                // SAFETY: the READ into `b` completed (it is in `ready` only then): nothing writes it any more.
                #[allow(unsafe_code)]
                unsafe {
                    b.copy_out(&mut buf[at..end])
                };
                self.engine().copied(end - at);
            }
        }
    }

    /// A batch's operation: checked, held and queued (the progress thread posts it; true), nothing to move
    /// (false: zero bytes), or failed at once.
    pub(crate) fn queue(
        self: &Arc<Self>,
        ticket: Ticket,
        read: bool,
        offset: u64,
        pieces: &[(Arc<RegionInner>, usize, usize)],
    ) -> Result<bool, Error> {
        self.gate(&self.lock_io())?;
        if pieces.is_empty() {
            return Err(Error::Config("an operation with no pieces".into()));
        }
        let (holds, cuts) = self.prepare(read, offset, pieces)?;
        if cuts.is_empty() {
            return Ok(false);
        }
        let len: u64 = cuts.iter().map(|c| c.1).sum();
        let job = Arc::new(Job::new(Some(ticket), len as usize, holds, cuts.len()));
        let mut io = self.lock_io();
        self.gate(&io)?;
        for (at, n, p) in cuts {
            io.queue.push_back(Chunk {
                job: job.clone(),
                read,
                lease_off: offset + at,
                len: n,
                at,
                src: Src::Pieces(p),
            });
        }
        self.inner.engine.activate(self);
        Ok(true)
    }
}

#[derive(Default)]
struct EngineState {
    /// Leases with work queued, posted or awaiting a verdict: the progress thread drives them.
    active: Vec<Arc<LeaseCore>>,
    /// Batches' results not taken yet, in completion order.
    results: VecDeque<Completed>,
    /// Tickets given out whose result is not in `results` yet.
    outstanding: HashSet<Ticket>,
    /// The progress thread is running.
    running: bool,
    /// The client is gone: the thread ends once nothing is active.
    stop: bool,
}

/// A client's batches: results, the completion fd, the progress thread, the copied-bytes counter.
pub(crate) struct Engine {
    st: Mutex<EngineState>,
    /// Wakes the progress thread.
    work: Condvar,
    /// Wakes [`Engine::wait`].
    done: Condvar,
    /// The completion fd: one byte in `fd_write` → `fd_read` while `results` is not empty.
    fd_read: UnixStream,
    fd_write: UnixStream,
    copied: AtomicU64,
    next_ticket: AtomicU64,
    /// The queue depth of new leases.
    pub(crate) depth: usize,
}

impl Engine {
    pub(crate) fn new(depth: usize) -> Result<Arc<Engine>, Error> {
        let (fd_read, fd_write) =
            UnixStream::pair().map_err(|e| Error::Config(format!("the completion fd's socket pair: {e}")))?;
        for s in [&fd_read, &fd_write] {
            s.set_nonblocking(true).map_err(|e| Error::Config(format!("the completion fd: {e}")))?;
        }
        Ok(Arc::new(Engine {
            st: Mutex::new(EngineState::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            fd_read,
            fd_write,
            copied: AtomicU64::new(0),
            next_ticket: AtomicU64::new(1),
            depth: depth.clamp(1, MAX_QUEUE_DEPTH),
        }))
    }

    fn state(&self) -> MutexGuard<'_, EngineState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn copied(&self, n: usize) {
        self.copied.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn bytes_copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    pub(crate) fn completion_fd(&self) -> RawFd {
        self.fd_read.as_raw_fd()
    }

    /// A new ticket, outstanding until its result is pushed.
    pub(crate) fn ticket(&self) -> Ticket {
        let t = Ticket(self.next_ticket.fetch_add(1, Ordering::Relaxed));
        self.state().outstanding.insert(t);
        t
    }

    /// A batch operation's result.
    pub(crate) fn push(&self, t: Ticket, r: Result<usize, Error>) {
        let mut st = self.state();
        st.outstanding.remove(&t);
        st.results.push_back((t, r));
        if st.results.len() == 1 {
            // Cannot block (one byte at most in the pair) nor fail but for a closed pair, which cannot be: both
            // ends are ours.
            let _ = (&self.fd_write).write(&[1]);
        }
        self.done.notify_all();
    }

    /// Empties the completion fd once `results` is empty (under the state lock).
    fn drained(&self, st: &EngineState) {
        if st.results.is_empty() {
            let mut b = [0u8; 8];
            while matches!((&self.fd_read).read(&mut b), Ok(n) if n > 0) {}
        }
    }

    pub(crate) fn poll(&self, max: usize) -> Vec<Completed> {
        let mut st = self.state();
        let n = max.min(st.results.len());
        let out = st.results.drain(..n).collect();
        self.drained(&st);
        out
    }

    pub(crate) fn wait(&self, what: Wait, timeout: Duration) -> Result<Vec<Completed>, Error> {
        let end = Instant::now() + timeout;
        let mut st = self.state();
        loop {
            match what {
                Wait::Ticket(t) => {
                    if let Some(i) = st.results.iter().position(|(x, _)| *x == t) {
                        let r = st.results.remove(i).into_iter().collect();
                        self.drained(&st);
                        return Ok(r);
                    }
                    if !st.outstanding.contains(&t) {
                        return Err(Error::Config(format!("ticket {} is not outstanding (its result was taken)", t.0)));
                    }
                }
                Wait::All => {
                    if st.outstanding.is_empty() {
                        let r = st.results.drain(..).collect();
                        self.drained(&st);
                        return Ok(r);
                    }
                }
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout { what: "batch completions", after: timeout });
            }
            // The caller moves the leases itself while it waits, as a blocking call does (no hand-over to the
            // progress thread and back for each completion); the progress thread skips a lease a caller holds.
            let leases = st.active.clone();
            if leases.is_empty() {
                st = self.done.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            drop(st);
            let step = if leases.len() == 1 { PROGRESS_STEP.min(left) } else { Duration::ZERO };
            let (moved, _) = self.drive(&leases, step);
            st = self.state();
            if !moved && st.results.is_empty() {
                // Another thread holds the leases (or only verdicts are under way): wait for its results.
                st = self.done.wait_timeout(st, IDLE_STEP.min(left)).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
    }

    /// One pass over `leases` (each not held by another thread), waiting up to `wait` on a single one: whether
    /// anything moved, and whether any has work posted.
    fn drive(&self, leases: &[Arc<LeaseCore>], wait: Duration) -> (bool, bool) {
        let (mut moved, mut posted) = (false, false);
        for l in leases {
            let mut io = match l.io.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                // A caller of the lease (or the progress thread) is polling it.
                Err(TryLockError::WouldBlock) => {
                    posted = true;
                    continue;
                }
            };
            moved |= l.progress(&mut io, wait);
            posted |= !io.inflight.is_empty();
            if io.idle() {
                let mut st = self.state();
                st.active.retain(|c| !Arc::ptr_eq(c, l));
            }
        }
        (moved, posted)
    }

    /// The progress thread drives `core` from now on (it is started when not running).
    pub(crate) fn activate(self: &Arc<Self>, core: &Arc<LeaseCore>) {
        let mut st = self.state();
        if !st.active.iter().any(|c| Arc::ptr_eq(c, core)) {
            st.active.push(core.clone());
        }
        if !st.running {
            let engine = self.clone();
            let started = std::thread::Builder::new().name("leasebox progress".into()).spawn(move || engine.run());
            st.running = started.is_ok();
        }
        self.work.notify_all();
    }

    pub(crate) fn wake(&self) {
        self.work.notify_all();
    }

    /// The client is gone: the progress thread finishes what is active and ends.
    pub(crate) fn stop(&self) {
        self.state().stop = true;
        self.work.notify_all();
    }

    /// The progress thread (see the module documentation).
    fn run(self: Arc<Self>) {
        loop {
            let leases = {
                let mut st = self.state();
                loop {
                    if !st.active.is_empty() {
                        break st.active.clone();
                    }
                    if st.stop {
                        st.running = false;
                        return;
                    }
                    st = self.work.wait_timeout(st, Duration::from_secs(1)).unwrap_or_else(|e| e.into_inner()).0;
                }
            };
            let wait = if leases.len() == 1 { PROGRESS_STEP } else { Duration::ZERO };
            let (moved, posted) = self.drive(&leases, wait);
            if !moved {
                // Nothing posted anywhere (every active lease waits for a verdict): no answer can come sooner.
                std::thread::sleep(if posted { IDLE_STEP } else { VERDICT_STEP });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_cut_into_work_requests_at_chunk_boundaries() {
        let (a, b) = (0x1000 as *mut u8, 0x9000 as *mut u8);
        let cuts = cut(&[(a, 100, 7), (b, 250, 9)], 128);
        type Piece = (usize, u32, u32);
        let view: Vec<(u64, u64, Vec<Piece>)> = cuts
            .iter()
            .map(|(at, n, p)| (*at, *n, p.0.iter().map(|s| (s.addr as usize, s.len, s.lkey)).collect()))
            .collect();
        assert_eq!(
            view,
            [
                (0, 128, vec![(0x1000, 100, 7), (0x9000, 28, 9)]),
                (128, 128, vec![(0x9000 + 28, 128, 9)]),
                (256, 94, vec![(0x9000 + 156, 94, 9)]),
            ]
        );
        assert!(cut(&[(a, 0, 0)], 128).is_empty());
        assert_eq!(cut(&[(a, 256, 0)], 128).len(), 2);
    }
}
