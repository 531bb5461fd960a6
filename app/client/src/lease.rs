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
//!
//! Two ways to move bytes: the copying calls ([`Lease::write`], [`Lease::read`] and their batches) copy through
//! the library's own bounce buffers (counted by [`crate::Client::bytes_copied`]); the zero-copy calls
//! ([`Lease::write_from`], [`Lease::read_into`] and their scatter/gather forms) name a registered [`Region`],
//! whose memory the requester reads and writes itself. Both wait for their work on the calling thread (the data
//! path is `crate::engine`'s); [`crate::Client::submit`] runs zero-copy operations asynchronously.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use leasebox_proto::{LeaseId, Outcome, Request, Response};

use crate::client::Inner;
use crate::engine::{Item, LeaseCore, LeaseParts};
use crate::error::Error;
use crate::region::{Region, RegionInner};
use crate::session::{Cmd, LeaseShared, Track};
use crate::setup::{self, SetupError};

/// A lease on an appliance; see the module documentation. Freed by [`Lease::free`], or (best effort, without
/// waiting) when dropped: operations of a batch still in flight on it then fail.
pub struct Lease {
    core: Arc<LeaseCore>,
    freed: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("appliance", &self.appliance())
            .field("id", &self.core.id)
            .field("size", &self.core.size)
            .finish_non_exhaustive()
    }
}

/// ALLOC on appliance `i`, the requester to RTS, READY, tracking (renewals). A lease granted but not brought
/// up is freed again.
pub(crate) fn open(inner: &Arc<Inner>, i: usize, size: u64, ttl_ms: u32) -> Result<Lease, Error> {
    let (session, requester) = inner.member(i)?;
    let wait = inner.call_wait();
    let mut r = requester.make(inner, inner.engine.depth).map_err(Error::Requester)?;
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
    let core = LeaseCore::new(LeaseParts {
        inner: inner.clone(),
        appliance: i,
        session: session.clone(),
        id: a.lease,
        size: a.length,
        remote_addr: a.remote_addr,
        rkey: a.rkey,
        shared,
        requester: r,
        slots: requester.bounce_slots(),
        depth: inner.engine.depth,
    });
    Ok(Lease { core: Arc::new(core), freed: false })
}

/// The pieces of a zero-copy call.
fn pieces(list: &[(&Region<'_>, usize, usize)]) -> Vec<(Arc<RegionInner>, usize, usize)> {
    list.iter().map(|(r, at, n)| (r.inner.clone(), *at, *n)).collect()
}

impl Lease {
    pub(crate) fn core(&self) -> &Arc<LeaseCore> {
        &self.core
    }

    pub fn id(&self) -> LeaseId {
        self.core.id
    }

    /// The lease's length in bytes (offsets run from 0 to this).
    pub fn size(&self) -> u64 {
        self.core.size
    }

    /// The appliance's index in the client's list.
    pub fn appliance_index(&self) -> usize {
        self.core.appliance
    }

    /// The appliance's address.
    pub fn appliance(&self) -> &str {
        &self.core.session.appliance
    }

    /// The revoke's outcome, once the client knows the lease is gone.
    pub fn revoked(&self) -> Option<Outcome> {
        self.core.shared.revoked()
    }

    /// The most pieces one scatter/gather call (or [`crate::Op`]) may have on this lease: the verbs device's
    /// (`max_sge` and `max_sge_rd`, whichever is smaller, at most 30), or the software requester's
    /// [`crate::rdma::soft::SOFT_MAX_SGE`].
    pub fn max_sge(&self) -> usize {
        self.core.max_sge()
    }

    /// Work requests this lease keeps posted at most (more wait in its queue).
    pub fn queue_depth(&self) -> usize {
        self.core.depth()
    }

    /// Sets [`Lease::queue_depth`] (1 to [`crate::MAX_QUEUE_DEPTH`]; a verbs QP also stops at its send
    /// queue's size, made at allocation from [`crate::ClientConfig::queue_depth`]).
    pub fn set_queue_depth(&self, depth: usize) {
        self.core.set_depth(depth);
    }

    /// Writes `data` at `offset` (copied through the library's buffers).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.run(vec![Item::Write { offset, data }])
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` (copied through the library's buffers).
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.run(vec![Item::Read { offset, buf }])
    }

    /// Several writes, kept in flight together; all ranges are checked before any is sent. On error some may
    /// have landed.
    pub fn write_many(&mut self, writes: &[(u64, &[u8])]) -> Result<(), Error> {
        self.run(writes.iter().map(|&(offset, data)| Item::Write { offset, data }).collect())
    }

    /// Several reads, kept in flight together; all ranges are checked before any is sent.
    pub fn read_many(&mut self, reads: &mut [(u64, &mut [u8])]) -> Result<(), Error> {
        self.run(reads.iter_mut().map(|(offset, buf)| Item::Read { offset: *offset, buf }).collect())
    }

    /// Zero copy: writes `len` bytes at `offset` in `region` to `lease_offset`, the requester reading them
    /// straight from the region (no bounce buffer). Returns once the write completed or failed.
    pub fn write_from(
        &mut self,
        region: &Region<'_>,
        offset: usize,
        lease_offset: u64,
        len: usize,
    ) -> Result<(), Error> {
        self.write_from_sg(&[(region, offset, len)], lease_offset)
    }

    /// Zero copy: reads `len` bytes at `lease_offset` straight into `region` at `offset`.
    pub fn read_into(
        &mut self,
        region: &Region<'_>,
        offset: usize,
        lease_offset: u64,
        len: usize,
    ) -> Result<(), Error> {
        self.read_into_sg(&[(region, offset, len)], lease_offset)
    }

    /// Zero copy, gathered: one write of the pieces `(region, offset, len)`, in order, to `lease_offset`; at
    /// most [`Lease::max_sge`] pieces (a write of more than 1 GiB goes as several work requests).
    pub fn write_from_sg(&mut self, pieces: &[(&Region<'_>, usize, usize)], lease_offset: u64) -> Result<(), Error> {
        self.run(vec![Item::Zero { read: false, offset: lease_offset, pieces: self::pieces(pieces) }])
    }

    /// Zero copy, scattered: one read from `lease_offset` into the pieces `(region, offset, len)`, in order (cut
    /// into READs of 64 KiB, as every read is).
    pub fn read_into_sg(&mut self, pieces: &[(&Region<'_>, usize, usize)], lease_offset: u64) -> Result<(), Error> {
        self.run(vec![Item::Zero { read: true, offset: lease_offset, pieces: self::pieces(pieces) }])
    }

    /// FREE: the appliance tears the lease down; its outcome (TornDown, or Fenced when the teardown failed and
    /// the memory stays out of use).
    pub fn free(mut self) -> Result<Outcome, Error> {
        self.usable()?;
        self.freed = true;
        let (s, id) = (&self.core.session, self.core.id);
        let _ = s.send(Cmd::Forget { lease: id });
        self.core.shared.closed.store(true, Ordering::Release);
        match s.call(Request::Free { lease: id }, self.core.inner.call_wait()) {
            Ok(Response::Free { outcome, .. }) => Ok(outcome),
            Ok(other) => Err(Error::Config(format!("FREE answered {other:?}"))),
            // Not reached: the connection thread sends the FREE again once it has reconnected, so the lease does
            // not outlive us on the appliance (where a reconnected session would adopt and keep it).
            Err(e @ (Error::Connection { .. } | Error::Timeout { .. })) => {
                let _ = s.send(Cmd::FreeLater { lease: id });
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Fails at once when the lease is known to be gone or its QP broken.
    fn usable(&self) -> Result<(), Error> {
        if self.freed {
            return Err(Error::Closed("the lease was freed (or its client dropped)"));
        }
        self.core.gate(&self.core.lock_io())
    }

    fn run(&mut self, items: Vec<Item<'_>>) -> Result<(), Error> {
        self.usable()?;
        self.core.run(items)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Best effort and without waiting: the connection thread sends the FREE; a revoked or already freed
        // lease needs none.
        let shared = &self.core.shared;
        if !self.freed && shared.revoked().is_none() && !shared.closed.load(Ordering::Acquire) {
            let _ = self.core.session.send(Cmd::FreeLater { lease: self.core.id });
        }
    }
}
