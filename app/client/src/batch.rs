//! Asynchronous batches (docs/client.md, "Zero copy and batches"): [`Op`]s handed to
//! [`crate::Client::submit`] run on the client's progress thread, across any of its leases and appliances, and
//! each comes back on its own ([`crate::Client::poll`], [`crate::Client::wait`], readable
//! [`crate::Client::completion_fd`]): one that fails (its lease revoked, a range refused) fails alone.
//!
//! An `Op` names memory of a [`Region`] of `'static` memory (owned, foreign, or leaked): the transfer outlives
//! the call that started it, so the memory must not be able to go back to its owner before the transfer ends
//! (see [`crate::region`]). While an `Op` exists (until it is submitted) its region stays borrowed, so
//! [`Region::bytes_mut`] cannot run beside it; once submitted, the transfer's hold on the region makes
//! `bytes_mut` (and dropping a foreign region) wait for it.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::engine::LeaseCore;
use crate::error::Error;
use crate::lease::Lease;
use crate::region::{Region, RegionInner};

/// One operation's handle: its result comes back with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// Its number (increasing within a client).
    pub fn id(&self) -> u64 {
        self.0
    }
}

/// One finished operation: its ticket, and the bytes it moved or its error.
pub type Completed = (Ticket, Result<usize, Error>);

/// What [`crate::Client::wait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// This operation's result.
    Ticket(Ticket),
    /// Every operation submitted and not yet finished.
    All,
}

impl From<Ticket> for Wait {
    fn from(t: Ticket) -> Wait {
        Wait::Ticket(t)
    }
}

/// A zero-copy write or read against a lease, for [`crate::Client::submit`]; made with [`Op::write_from`],
/// [`Op::read_into`] or their scatter/gather forms. Nothing is checked until it is submitted (a bad range, more
/// pieces than [`Lease::max_sge`], overlapping a transfer that writes the same bytes: that operation's result
/// is the error).
#[derive(Debug)]
pub struct Op<'r> {
    pub(crate) lease: Arc<LeaseCore>,
    pub(crate) read: bool,
    pub(crate) lease_offset: u64,
    pub(crate) pieces: Vec<(Arc<RegionInner>, usize, usize)>,
    _regions: PhantomData<&'r Region<'static>>,
}

impl<'r> Op<'r> {
    fn new(lease: &Lease, read: bool, pieces: &[(&'r Region<'static>, usize, usize)], lease_offset: u64) -> Op<'r> {
        Op {
            lease: lease.core().clone(),
            read,
            lease_offset,
            pieces: pieces.iter().map(|(r, at, n)| (r.inner.clone(), *at, *n)).collect(),
            _regions: PhantomData,
        }
    }

    /// RDMA WRITE of `len` bytes at `offset` in `region` to `lease_offset` in `lease`, straight from the region.
    pub fn write_from(
        lease: &Lease,
        region: &'r Region<'static>,
        offset: usize,
        lease_offset: u64,
        len: usize,
    ) -> Op<'r> {
        Op::new(lease, false, &[(region, offset, len)], lease_offset)
    }

    /// RDMA READ of `len` bytes at `lease_offset` in `lease` into `region` at `offset`, straight into the region.
    pub fn read_into(
        lease: &Lease,
        region: &'r Region<'static>,
        offset: usize,
        lease_offset: u64,
        len: usize,
    ) -> Op<'r> {
        Op::new(lease, true, &[(region, offset, len)], lease_offset)
    }

    /// One RDMA WRITE gathered from `pieces` (`(region, offset, len)` each, in order) to `lease_offset`.
    pub fn write_from_sg(lease: &Lease, pieces: &[(&'r Region<'static>, usize, usize)], lease_offset: u64) -> Op<'r> {
        Op::new(lease, false, pieces, lease_offset)
    }

    /// One RDMA READ from `lease_offset` scattered into `pieces` (`(region, offset, len)` each, in order).
    pub fn read_into_sg(lease: &Lease, pieces: &[(&'r Region<'static>, usize, usize)], lease_offset: u64) -> Op<'r> {
        Op::new(lease, true, pieces, lease_offset)
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(|p| p.2).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
