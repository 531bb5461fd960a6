//! [`Region`]: memory the program registers once ([`crate::Client::register`], [`crate::Client::register_owned`],
//! [`crate::Client::register_raw`]) and then reads and writes leases from and into without a copy
//! ([`crate::Lease::write_from`], [`crate::Lease::read_into`], [`crate::Op`]).
//!
//! **Registration.** On the verbs backend the memory is registered in the protection domain of every device
//! context the client has open (`ibv_reg_mr`, LOCAL_WRITE; at most once per region and device, made at
//! registration or at its first use on a device opened later) and every lease's QP on that device names it by
//! the same lkey. The software requester needs no registration: its regions go through the same API and are
//! read and written by the requester itself. Registrations are dropped (deregistered) with the region.
//!
//! **In use.** Every transfer holds the byte range it names from the moment it is accepted until its last work
//! request has completed, failed or been discarded with its QP (a timed-out lease's requester is destroyed:
//! once it is gone nothing reads or writes the memory). Two transfers may not hold overlapping bytes when
//! either writes them (a read into the region); such a transfer is refused. While any transfer holds a region:
//!
//! - dropping a region made from borrowed or foreign memory ([`crate::Client::register`],
//!   [`crate::Client::register_raw`]) waits until none does, then deregisters it: the memory is never given
//!   back, and never deregistered, while a NIC may still read or write it. Every transfer ends within the
//!   client's `rdma_timeout` of its last progress, after which its QP is destroyed; so the wait is bounded;
//! - dropping a region that owns its memory ([`crate::Client::register_owned`]) does not wait: the memory
//!   and its registrations go when the last transfer lets go of them;
//! - [`Region::bytes`] and [`Region::bytes_mut`] wait too, and while they are borrowed no new transfer can
//!   name the region (they take `&mut self`, transfers take `&self`).
//!
//! Transfers that outlive the call that made them ([`crate::Client::submit`]) take only regions of
//! `'static` memory: a region that borrows memory could be leaked (`mem::forget`), ending the borrow without
//! the drop that waits; the calls on a [`crate::Lease`] return only once none of their work requests is in
//! flight any more, so they take any region.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::rdma::{MemoryDomain, Registration, Sge};

/// Registered memory; see the module documentation. `'a` is the borrow of the memory it was made from
/// (`'static` for owned and foreign memory).
pub struct Region<'a> {
    pub(crate) inner: Arc<RegionInner>,
    _memory: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for Region<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region").field("id", &self.inner.id).field("len", &self.inner.len).finish_non_exhaustive()
    }
}

/// Where a region's memory comes from.
enum Memory {
    /// Borrowed by the region (or foreign, under `register_raw`'s contract): valid until the region is dropped.
    Borrowed,
    /// Owned: allocated by `Box<[u8]>`, freed when the last holder lets go.
    Owned,
}

/// One use of a byte range by a transfer.
struct Use {
    token: u64,
    start: usize,
    end: usize,
    /// The transfer writes the bytes (an RDMA READ lands there).
    writes: bool,
}

#[derive(Default)]
struct Uses {
    list: Vec<Use>,
    next: u64,
    /// The region was dropped: nothing may use it any more.
    closed: bool,
}

/// A region's registrations: one per memory domain, with the domain.
type Registrations = Vec<(Arc<dyn MemoryDomain>, Box<dyn Registration>)>;

pub(crate) struct RegionInner {
    id: u64,
    addr: *mut u8,
    len: usize,
    memory: Memory,
    uses: Mutex<Uses>,
    idle: Condvar,
    /// One registration per memory domain (verbs device context) the region was used on.
    regs: Mutex<Registrations>,
}

impl fmt::Debug for RegionInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionInner").field("id", &self.id).field("len", &self.len).finish_non_exhaustive()
    }
}

// SAFETY: `addr` is dereferenced only by requesters through scatter/gather lists made while a use (a
// `RegionHold`) covers the bytes, with writers excluded from overlapping uses, by the copying calls' bounce
// buffers under the same rule, and by `Region::bytes`/`bytes_mut` under `&mut Region` once no use is left;
// the mutexes guard the bookkeeping. Which thread does it does not matter.
#[allow(unsafe_code)]
unsafe impl Send for RegionInner {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for RegionInner {}

static NEXT_REGION: AtomicU64 = AtomicU64::new(1);

/// A held range of a region: released (and waiters on the region woken) when dropped.
pub(crate) struct RegionHold {
    region: Arc<RegionInner>,
    token: u64,
}

impl Drop for RegionHold {
    fn drop(&mut self) {
        let mut u = self.region.lock_uses();
        u.list.retain(|x| x.token != self.token);
        if u.list.is_empty() {
            self.region.idle.notify_all();
        }
    }
}

fn same_domain(a: &Arc<dyn MemoryDomain>, b: &Arc<dyn MemoryDomain>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl RegionInner {
    fn new(addr: *mut u8, len: usize, memory: Memory) -> RegionInner {
        RegionInner {
            id: NEXT_REGION.fetch_add(1, Ordering::Relaxed),
            addr,
            len,
            memory,
            uses: Mutex::new(Uses::default()),
            idle: Condvar::new(),
            regs: Mutex::new(Vec::new()),
        }
    }

    /// A region owning `memory`.
    pub(crate) fn owned(memory: Vec<u8>) -> RegionInner {
        let len = memory.len();
        let addr = Box::into_raw(memory.into_boxed_slice()) as *mut u8;
        RegionInner::new(addr, len, Memory::Owned)
    }

    fn lock_uses(&self) -> MutexGuard<'_, Uses> {
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds bytes `start..start + len` for a transfer that reads them (`writes` false: an RDMA WRITE's source)
    /// or writes them (an RDMA READ's destination). Refused when the range is outside the region, the region
    /// was dropped, or another transfer holds overlapping bytes and either side writes them.
    pub(crate) fn hold(self: &Arc<Self>, start: usize, len: usize, writes: bool) -> Result<RegionHold, Error> {
        let end = start.checked_add(len).filter(|&e| e <= self.len).ok_or_else(|| {
            Error::Config(format!("{len} bytes at {start} are outside the region's {} bytes", self.len))
        })?;
        let mut u = self.lock_uses();
        if u.closed {
            return Err(Error::Closed("the region was dropped"));
        }
        if let Some(x) = u.list.iter().find(|x| x.start < end && start < x.end && (writes || x.writes)) {
            return Err(Error::Config(format!(
                "bytes {start}..{end} of the region overlap bytes {}..{} {} by a transfer in flight",
                x.start,
                x.end,
                if x.writes { "being written" } else { "being read" }
            )));
        }
        let token = u.next;
        u.next += 1;
        u.list.push(Use { token, start, end, writes });
        Ok(RegionHold { region: self.clone(), token })
    }

    /// The region's lkey in `domain`, registering it there the first time.
    pub(crate) fn lkey(&self, domain: &Arc<dyn MemoryDomain>) -> Result<u32, Error> {
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, r)) = regs.iter().find(|(d, _)| same_domain(d, domain)) {
            return Ok(r.lkey());
        }
        if self.lock_uses().closed {
            return Err(Error::Closed("the region was dropped"));
        }
        // SAFETY: the memory is valid until the region is dropped (borrowed, foreign under `register_raw`'s
        // contract) or until this struct is (owned); the registrations are dropped before either: in
        // `Region::drop` for borrowed memory, in `RegionInner::drop` for owned.
        #[allow(unsafe_code)]
        let r = unsafe { domain.register(self.addr, self.len) }
            .map_err(|e| Error::Requester(format!("registering {} bytes: {e}", self.len)))?;
        let lkey = r.lkey();
        regs.push((domain.clone(), r));
        Ok(lkey)
    }

    /// The scatter/gather piece for bytes `at..at + len` (within the region: checked by `hold`).
    pub(crate) fn sge(&self, at: usize, len: u32, lkey: u32) -> Sge {
        Sge { addr: self.addr.wrapping_add(at), len, lkey }
    }

    /// Whether a transfer holds any of the region.
    pub(crate) fn in_use(&self) -> bool {
        !self.lock_uses().list.is_empty()
    }

    /// Waits until no transfer holds the region, at most `timeout` (`None`: as long as it takes); whether it is
    /// idle.
    pub(crate) fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        let end = timeout.map(|t| Instant::now() + t);
        let mut u = self.lock_uses();
        while !u.list.is_empty() {
            match end {
                None => u = self.idle.wait(u).unwrap_or_else(|e| e.into_inner()),
                Some(end) => {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    u = self.idle.wait_timeout(u, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
        true
    }

    /// Copies `data` to bytes `at..` of the region.
    ///
    /// # Safety
    ///
    /// The bytes are inside the region, and no transfer reads or writes them now (a copying call's bounce
    /// buffer before it is posted).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn write_at(&self, at: usize, data: &[u8]) {
        // SAFETY: the caller's promise: inside the region, which is valid, and untouched by anyone else.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr.add(at), data.len()) };
    }

    /// Copies bytes `at..at + out.len()` of the region to `out`.
    ///
    /// # Safety
    ///
    /// The bytes are inside the region, and no transfer writes them now (a copying call's bounce buffer once
    /// its READ completed).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn read_at(&self, at: usize, out: &mut [u8]) {
        // SAFETY: the caller's promise: inside the region, which is valid, and not written by anyone else.
        unsafe { std::ptr::copy_nonoverlapping(self.addr.add(at), out.as_mut_ptr(), out.len()) };
    }

    /// No new transfers; waits until those in flight are done; then no more registrations (the memory may go
    /// after this). Closing first and waiting after leaves no moment for a transfer to start in between.
    fn close(&self) {
        let mut u = self.lock_uses();
        u.closed = true;
        while !u.list.is_empty() {
            u = self.idle.wait(u).unwrap_or_else(|e| e.into_inner());
        }
        drop(u);
        let regs = std::mem::take(&mut *self.regs.lock().unwrap_or_else(|e| e.into_inner()));
        drop(regs);
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        // Registrations first: the memory they name must still be there when they are dropped (no hold is left:
        // every hold holds this struct).
        self.close();
        if matches!(self.memory, Memory::Owned) {
            let slice = std::ptr::slice_from_raw_parts_mut(self.addr, self.len);
            // SAFETY: made by `Box::into_raw` in `RegionInner::owned` with this address and length; nothing else
            // frees it, and no transfer holds it any more (every hold holds this struct).
            #[allow(unsafe_code)]
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl<'a> Region<'a> {
    pub(crate) fn from_inner(inner: RegionInner) -> Region<'a> {
        Region { inner: Arc::new(inner), _memory: PhantomData }
    }

    /// A region over borrowed (or foreign) memory.
    pub(crate) fn borrowed(addr: *mut u8, len: usize) -> Region<'a> {
        Region::from_inner(RegionInner::new(addr, len, Memory::Borrowed))
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Whether a transfer holds any of it now.
    pub fn in_use(&self) -> bool {
        self.inner.in_use()
    }

    /// Waits until no transfer holds it, at most `timeout`; whether none does.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.inner.wait_idle(Some(timeout))
    }

    /// Its bytes, once no transfer holds it (waits for that).
    pub fn bytes(&mut self) -> &[u8] {
        self.inner.wait_idle(None);
        // SAFETY: the memory is valid for the region's life; no transfer holds it, and none can start while
        // `self` is borrowed mutably (transfers take `&Region`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.inner.addr, self.inner.len)
        }
    }

    /// Its bytes, writable, once no transfer holds it (waits for that).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.inner.wait_idle(None);
        // SAFETY: as in `bytes`; `&mut self` makes this the only borrow.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.inner.addr, self.inner.len)
        }
    }

    /// Registers the region in `domains` now (the client's open device contexts).
    pub(crate) fn register_in(&self, domains: &[Arc<dyn MemoryDomain>]) -> Result<(), Error> {
        for d in domains {
            self.inner.lkey(d)?;
        }
        Ok(())
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        if matches!(self.inner.memory, Memory::Borrowed) {
            // The memory goes back to its owner after this: wait until no NIC can touch it, then deregister.
            self.inner.close();
        }
        // Owned memory stays with the last holder (see the module documentation).
    }
}
