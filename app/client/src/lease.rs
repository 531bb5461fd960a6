//! [`Lease`]: remote memory the program reads and writes by offset. Each lease has its own RDMA requester
//! (one RC QP toward the lease's QP on the appliance: the appliance's cost per lease, so a program does best
//! with a few large leases and its own index of blocks inside them, docs/client.md).
//!
//! A read or write is checked against the lease's range before anything is sent, posted, and waited for
//! (at most [`crate::ClientConfig::rdma_timeout`] without a completion). The appliance's REVOKED notice usually
//! marks a revoked lease first, and then every call fails at once with [`Error::Revoked`]; failing that, a failed
//! completion is checked with QUERY: a lease the appliance revoked or no longer knows fails with
//! [`Error::Revoked`] (now and for every later call, and the client sends [`crate::Event::Revoked`]); otherwise
//! [`Error::Rdma`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use leasebox_proto::{LeaseId, Outcome, Request, Response};

use crate::client::Inner;
use crate::error::Error;
use crate::event::Event;
use crate::rdma::{Requester, WcStatus};
use crate::session::{Cmd, LeaseShared, Session, Track, settle};
use crate::setup::{self, SetupError};

/// Work requests one lease keeps outstanding in a batch (the software requester's default `max_wr` is 16).
const WINDOW: usize = 8;
/// READs are cut into chunks of this many bytes, and at most [`READ_IN_FLIGHT`] bytes are outstanding: a READ's
/// responses arrive as a burst of MTU-sized packets the requester must take in, and the software requester's UDP
/// socket drops what its receive buffer cannot hold (a 1 MiB READ is 256 packets of 4 KiB; with several clients
/// on a busy machine the drops outlast the QP's retries, IBV_WC_RETRY_EXC_ERR).
const READ_CHUNK: u64 = 64 << 10;
const READ_IN_FLIGHT: u64 = 128 << 10;
/// One poll's longest wait: short, so the deadline is checked often.
const POLL_STEP: Duration = Duration::from_millis(5);

/// A lease on an appliance; see the module documentation. Freed by [`Lease::free`], or (best effort, without
/// waiting) when dropped.
pub struct Lease {
    inner: Arc<Inner>,
    appliance: usize,
    /// The appliance's connection thread (the client's list may grow meanwhile: a fleet client's does).
    session: Arc<Session>,
    id: LeaseId,
    size: u64,
    remote_addr: u64,
    rkey: u32,
    requester: Box<dyn Requester + Send>,
    shared: Arc<LeaseShared>,
    next_wr: u64,
    /// The completion status that put the requester's QP in error (the lease itself still existed).
    broken: Option<WcStatus>,
    freed: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("appliance", &self.appliance())
            .field("id", &self.id)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// ALLOC on appliance `i`, the requester to RTS, READY, tracking (renewals). A lease granted but not brought
/// up is freed again.
pub(crate) fn open(inner: &Arc<Inner>, i: usize, size: u64, ttl_ms: u32) -> Result<Lease, Error> {
    let (session, requester) = inner.member(i)?;
    let wait = inner.call_wait();
    let mut r = requester.make().map_err(Error::Requester)?;
    let req = setup::alloc_request(&r.local(), size, ttl_ms).map_err(Error::Config)?;
    let a = match session.call(Request::Alloc(req), wait)? {
        Response::Alloc(a) => a,
        other => return Err(Error::Config(format!("ALLOC answered {other:?}"))),
    };
    let shared = Arc::new(LeaseShared::default());
    // READY's answer starts the tracking on the connection thread itself, so a notice right after it is not
    // missed.
    let mut call = |q: &Request| {
        let track = matches!(q, Request::Ready { .. }).then(|| Track {
            lease: a.lease,
            ttl_ms: a.ttl_ms,
            shared: shared.clone(),
        });
        session.call_tracking(q.clone(), track, wait)
    };
    if let Err(e) = setup::connect_and_ready(&mut call, r.as_mut(), &a) {
        let _ = session.send(Cmd::FreeLater { lease: a.lease });
        return Err(match e {
            SetupError::Params(m) | SetupError::Answer(m) => Error::Config(m),
            SetupError::Requester(m) => Error::Requester(m),
            SetupError::Call(_, e) => e,
        });
    }
    Ok(Lease {
        inner: inner.clone(),
        appliance: i,
        session: session.clone(),
        id: a.lease,
        size: a.length,
        remote_addr: a.remote_addr,
        rkey: a.rkey,
        requester: r,
        shared,
        next_wr: 1,
        broken: None,
        freed: false,
    })
}

/// Where a batch's completed READs go.
enum Work<'a> {
    Write { offset: u64, data: &'a [u8] },
    Read { offset: u64, buf: &'a mut [u8] },
}

impl Work<'_> {
    fn range(&self) -> (u64, u64) {
        match self {
            Work::Write { offset, data } => (*offset, data.len() as u64),
            Work::Read { offset, buf } => (*offset, buf.len() as u64),
        }
    }
}

impl Lease {
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The lease's length in bytes (offsets run from 0 to this).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The appliance's index in the client's list.
    pub fn appliance_index(&self) -> usize {
        self.appliance
    }

    /// The appliance's address.
    pub fn appliance(&self) -> &str {
        &self.session.appliance
    }

    /// The revoke's outcome, once the client knows the lease is gone.
    pub fn revoked(&self) -> Option<Outcome> {
        self.shared.revoked()
    }

    /// Writes `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.run(vec![Work::Write { offset, data }])
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.run(vec![Work::Read { offset, buf }])
    }

    /// Several writes, kept in flight together; all ranges are checked before any is sent. On error some may
    /// have landed.
    pub fn write_many(&mut self, writes: &[(u64, &[u8])]) -> Result<(), Error> {
        self.run(writes.iter().map(|&(offset, data)| Work::Write { offset, data }).collect())
    }

    /// Several reads, kept in flight together; all ranges are checked before any is sent.
    pub fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> Result<(), Error> {
        self.run(reads.iter_mut().map(|(offset, buf)| Work::Read { offset: *offset, buf }).collect())
    }

    /// FREE: the appliance tears the lease down; its outcome (TornDown, or Fenced when the teardown failed and
    /// the memory stays out of use).
    pub fn free(mut self) -> Result<Outcome, Error> {
        self.usable()?;
        self.freed = true;
        let s = &self.session;
        let _ = s.send(Cmd::Forget { lease: self.id });
        self.shared.closed.store(true, Ordering::Release);
        match s.call(Request::Free { lease: self.id }, self.inner.call_wait()) {
            Ok(Response::Free { outcome, .. }) => Ok(outcome),
            Ok(other) => Err(Error::Config(format!("FREE answered {other:?}"))),
            // Not reached: the connection thread sends the FREE again once it has reconnected, so the lease does
            // not outlive us on the appliance (where a reconnected session would adopt and keep it).
            Err(e @ (Error::Connection { .. } | Error::Timeout { .. })) => {
                let _ = s.send(Cmd::FreeLater { lease: self.id });
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Fails at once when the lease is known to be gone or its QP broken.
    fn usable(&self) -> Result<(), Error> {
        if let Some(outcome) = self.shared.revoked() {
            return Err(Error::Revoked { lease: self.id, outcome });
        }
        if self.freed || self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("the lease was freed (or its client dropped)"));
        }
        if let Some(status) = self.broken {
            return Err(Error::Rdma { status, lease: self.id });
        }
        Ok(())
    }

    fn run(&mut self, mut work: Vec<Work<'_>>) -> Result<(), Error> {
        self.usable()?;
        for w in &work {
            let (offset, len) = w.range();
            if offset.checked_add(len).is_none_or(|end| end > self.size) {
                return Err(Error::OutOfRange { offset, len, size: self.size });
            }
        }
        // READs in chunks of at most READ_CHUNK bytes, at most READ_IN_FLIGHT bytes outstanding (see READ_CHUNK);
        // a WRITE goes whole (the requester paces its packets by ACKs).
        let chunks: Vec<(usize, u64, u64, bool)> = work
            .iter()
            .enumerate()
            .flat_map(|(i, w)| {
                let len = w.range().1;
                let chunk = match w {
                    Work::Read { .. } => READ_CHUNK,
                    Work::Write { .. } => len.max(1),
                };
                let read = matches!(w, Work::Read { .. });
                (0..len.div_ceil(chunk)).map(move |k| (i, k * chunk, (len - k * chunk).min(chunk), read))
            })
            .collect();
        let mut posted: HashMap<u64, (usize, u64, u64, bool)> = HashMap::new();
        let (mut next, mut in_flight) = (0, 0u64);
        let mut deadline = Instant::now() + self.inner.rdma_timeout;
        while next < chunks.len() || !posted.is_empty() {
            while next < chunks.len()
                && posted.len() < WINDOW
                && (in_flight == 0 || !chunks[next].3 || in_flight + chunks[next].2 <= READ_IN_FLIGHT)
            {
                let (i, at, len, read) = chunks[next];
                let wr = self.next_wr;
                self.next_wr += 1;
                let addr = self.remote_addr + work[i].range().0 + at;
                let r = match &work[i] {
                    Work::Write { data, .. } => {
                        self.requester.post_write(wr, addr, self.rkey, &data[at as usize..(at + len) as usize])
                    }
                    Work::Read { .. } => self.requester.post_read(wr, addr, self.rkey, len as u32),
                };
                r.map_err(|e| Error::Requester(format!("posting work request {wr}: {e}")))?;
                posted.insert(wr, chunks[next]);
                if read {
                    in_flight += len;
                }
                next += 1;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout { what: "RDMA completion", after: self.inner.rdma_timeout });
            }
            for c in self.requester.poll(POLL_STEP) {
                let Some((i, at, len, read)) = posted.remove(&c.wr_id) else { continue };
                if read {
                    in_flight -= len;
                }
                deadline = Instant::now() + self.inner.rdma_timeout;
                if c.status != WcStatus::Success {
                    return Err(self.failed(c.status));
                }
                if let Work::Read { buf, .. } = &mut work[i] {
                    let data = self.requester.read_data(c.wr_id).unwrap_or_default();
                    if data.len() as u64 != len {
                        return Err(Error::Requester(format!("READ of {len} bytes returned {} bytes", data.len())));
                    }
                    buf[at as usize..(at + len) as usize].copy_from_slice(&data);
                }
            }
        }
        Ok(())
    }

    /// A failed completion: revoked (QUERY says the lease is gone or going) or a broken QP.
    fn failed(&mut self, status: WcStatus) -> Error {
        let s = &self.session;
        let query = || match s.call(Request::Query { lease: self.id }, self.inner.call_wait()) {
            Ok(r) => Ok(r),
            Err(Error::Server { error, .. }) => Err(crate::ClientError::Server(error)),
            Err(e) => Err(crate::ClientError::Usage(e.to_string())),
        };
        match settle(query) {
            Some(outcome) => {
                let _ = s.send(Cmd::Forget { lease: self.id });
                if self.shared.mark_revoked(outcome) {
                    let appliance = self.appliance().to_string();
                    self.inner.sink.emit(Event::Revoked { appliance, lease: self.id, outcome });
                }
                Error::Revoked { lease: self.id, outcome: self.shared.revoked().unwrap_or(outcome) }
            }
            None => {
                self.broken = Some(status);
                Error::Rdma { status, lease: self.id }
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Best effort and without waiting: the connection thread sends the FREE; a revoked or already freed
        // lease needs none.
        if !self.freed && self.shared.revoked().is_none() && !self.shared.closed.load(Ordering::Acquire) {
            let _ = self.session.send(Cmd::FreeLater { lease: self.id });
        }
    }
}
