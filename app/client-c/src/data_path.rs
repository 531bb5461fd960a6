//! The data path in C (docs/client.md, "Zero copy and batches" and "C and Python"): registered memory
//! (`lbx_region`), zero-copy transfers on a lease, and asynchronous batches across leases with one completion
//! per operation. Wraps `leasebox_client::{Region, Op, Client::submit/poll/wait}` (app/client/src/region.rs,
//! app/client/src/batch.rs).
//!
//! **Freeing a region refuses while a transfer uses it.** `lbx_region_free` waits up to its `wait_ms` for the
//! transfers that hold the region to end, and if one still does, answers `LBX_ERR_BUSY` and leaves the region
//! (and its registration) as it was: the caller's memory is never deregistered or given back while the NIC may
//! still read or write it. A transfer holds the bytes from its `lbx_submit` (or the start of a blocking call)
//! until its last work request is done or its QP destroyed, which may be a moment after its completion was
//! polled: a `wait_ms` of a few milliseconds covers that.
//!
//! **Completions.** The client handle keeps the tickets of the operations submitted whose result has not been
//! taken (`lbx_pending`), recorded under a lock that every take also holds, so none is taken before it is known; `lbx_wait` waits on the completion fd (poll(2)) until its array is full or nothing is
//! pending, so a caller that gives room for every operation it submitted waits for all of them.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use leasebox_client::{Completed, Error, Op, Outcome, Region, Wait};

use crate::{
    Fail, LBX_OK, client, client_handle, entry, entry_noting, invalid, lbx_client, lbx_lease, lease_guard, out,
    status_of,
};

/// A region is in use by a transfer (`lbx_region_free`): wait for its completions and try again.
pub const LBX_ERR_BUSY: i32 = 12;

/// The outcome of a revoke (`lbx_completion.outcome`, `lbx_event.outcome`, `lbx_client_revoke_with`): the
/// lease's memory key is gone and its teardown under way.
pub const LBX_OUTCOME_TORN_DOWN: u32 = 0;
/// A teardown step failed or the HCA did not answer in time: the memory is fenced for good (never reused).
pub const LBX_OUTCOME_FENCED: u32 = 1;
/// The appliance does not know the lease (already gone: revoked earlier, expired, another boot).
pub const LBX_OUTCOME_NOT_FOUND: u32 = 2;

// The outcome numbering is the protocol's (app/proto `Outcome`); the header carries it as literals.
const _: () = assert!(LBX_OUTCOME_TORN_DOWN == Outcome::TornDown as u32);
const _: () = assert!(LBX_OUTCOME_FENCED == Outcome::Fenced as u32);
const _: () = assert!(LBX_OUTCOME_NOT_FOUND == Outcome::NotFound as u32);

/// `lbx_op.kind`: an RDMA WRITE from the region(s) to the lease.
pub const LBX_OP_WRITE: i32 = 0;
/// `lbx_op.kind`: an RDMA READ from the lease into the region(s).
pub const LBX_OP_READ: i32 = 1;

const REGION_TAG: u64 = 0x6c62_785f_7267_6e20; // "lbx_rgn "
const DEAD_TAG: u64 = crate::DEAD_TAG;

/// Memory registered for zero-copy transfers (opaque): the caller's bytes, used in place.
pub struct lbx_region {
    tag: u64,
    region: Region<'static>,
}

/// One piece of a scatter/gather list: `len` bytes at `offset` in `region`.
#[repr(C)]
pub struct lbx_sge {
    pub region: *const lbx_region,
    pub offset: usize,
    pub len: usize,
}

/// One operation of a batch (`lbx_submit`): `kind` (`LBX_OP_WRITE` or `LBX_OP_READ`) on `lease` at
/// `lease_offset`, from or into either one piece (`region`, `region_offset`, `len`; `sge` NULL) or a
/// scatter/gather list (`sge`, `n_sge` pieces in order, up to `lbx_lease_max_sge`; `region` NULL).
#[repr(C)]
pub struct lbx_op {
    pub kind: i32,
    pub lease: *const lbx_lease,
    pub lease_offset: u64,
    pub region: *const lbx_region,
    pub region_offset: usize,
    pub len: usize,
    pub sge: *const lbx_sge,
    pub n_sge: usize,
}

/// One finished operation of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct lbx_completion {
    /// The ticket `lbx_submit` gave the operation.
    pub ticket: u64,
    /// `LBX_OK`, or the operation's own error (`LBX_ERR_REVOKED`: its lease is gone; `LBX_ERR_OUT_OF_RANGE`,
    /// `LBX_ERR_INVALID_ARGUMENT`: a range outside the lease or region, too many pieces, an overlap with a
    /// transfer that writes the same bytes; `LBX_ERR_RDMA`, `LBX_ERR_TIMEOUT`: the lease's QP failed).
    pub status: i32,
    /// `LBX_OUTCOME_*` when `status` is `LBX_ERR_REVOKED` (0 otherwise).
    pub outcome: u32,
    /// The bytes moved, when `status` is `LBX_OK` (0 otherwise).
    pub bytes: u64,
}

/// `f`'s value, or `Err` when it panicked (the value-returning entry points answer their default then).
/// A new region handle over `r` (`lbx_register`, `lbx_store_register`).
pub(crate) fn region_handle(r: Region<'static>) -> *mut lbx_region {
    Box::into_raw(Box::new(lbx_region { tag: REGION_TAG, region: r }))
}

fn caught<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

pub(crate) fn region<'a>(r: *const lbx_region, what: &str) -> Result<&'a Region<'static>, Fail> {
    if r.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes a handle from `lbx_register` not yet freed. A stale or foreign pointer
    // is caught by the tag as far as its memory still reads.
    let h = unsafe { &*r };
    if h.tag != REGION_TAG {
        return Err(invalid(format!("{what} is not a live lbx_region handle")));
    }
    Ok(&h.region)
}

/// Registers `len` bytes at `addr` for zero-copy transfers; `*out` is the new region. The memory stays the
/// caller's: it must stay allocated until `lbx_region_free` has succeeded, and nothing else may write it (or,
/// for a write, change it) while a transfer that names it runs. On verbs it is registered with the NIC
/// (`ibv_reg_mr`) once per device context the client uses, shared by every lease there.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_register(
    client: *const lbx_client,
    addr: *mut c_void,
    len: usize,
    out: *mut *mut lbx_region,
) -> i32 {
    entry("lbx_register", || {
        let out = self::out(out, "out")?;
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let c = self::client(client)?;
        if addr.is_null() || len == 0 {
            return Err(invalid("a region needs a non-NULL address and at least one byte"));
        }
        // SAFETY: the header's contract for `lbx_register` is `register_raw`'s: the memory stays valid until the
        // region is freed, and is not touched by others while a transfer naming it runs.
        #[allow(unsafe_code)]
        let r = unsafe { c.register_raw(addr.cast::<u8>(), len) }?;
        let h = Box::into_raw(Box::new(lbx_region { tag: REGION_TAG, region: r }));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// The region's length in bytes; 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_region_len(region: *const lbx_region) -> usize {
    caught(|| self::region(region, "region").map_or(0, |r| r.len())).unwrap_or(0)
}

/// 1 while a transfer holds any of the region's bytes, 0 when none does (or for an invalid handle).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_region_in_use(region: *const lbx_region) -> i32 {
    caught(|| self::region(region, "region").map_or(0, |r| i32::from(r.in_use()))).unwrap_or(0)
}

/// Deregisters the region and destroys the handle once no transfer holds it, waiting up to `wait_ms` for that
/// (NULL: nothing). While a transfer still holds it after `wait_ms`, answers `LBX_ERR_BUSY` and changes
/// nothing: the handle stays valid and the memory registered (take the transfers' completions, then free
/// again). After `LBX_OK` the memory is the caller's again.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_region_free(region: *mut lbx_region, wait_ms: u32) -> i32 {
    entry("lbx_region_free", || {
        if region.is_null() {
            return Ok(());
        }
        let r = self::region(region, "region")?;
        if !r.wait_idle(Duration::from_millis(u64::from(wait_ms))) {
            return Err(Fail::Status(
                LBX_ERR_BUSY,
                "a transfer still uses the region (take its completion first); nothing was freed".into(),
            ));
        }
        // SAFETY: checked live above; the handle came from `Box::into_raw` in `lbx_register`, and the caller gives
        // it up with this call.
        let mut h = unsafe { Box::from_raw(region) };
        h.tag = DEAD_TAG;
        // Dropping the region closes it to new transfers, waits for any that started since the check above (a
        // race of the caller's own threads), and deregisters it.
        drop(h);
        Ok(())
    })
}

/// The pieces `sge[0..n]` as the client library takes them.
fn pieces<'a>(sge: *const lbx_sge, n: usize) -> Result<Vec<(&'a Region<'static>, usize, usize)>, Fail> {
    if n == 0 {
        return Err(invalid("a scatter/gather list of 0 pieces"));
    }
    if sge.is_null() {
        return Err(invalid("sge is NULL"));
    }
    // SAFETY: non-NULL; the caller passes `n` readable `lbx_sge`s for the call.
    let list = unsafe { std::slice::from_raw_parts(sge, n) };
    list.iter().map(|p| Ok((region(p.region, "sge[].region")?, p.offset, p.len))).collect()
}

/// Zero copy: writes `len` bytes at `region_offset` in `region` to `lease_offset` in the lease, the requester
/// reading them straight from the region (no copy); returns once the write completed.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_write_from(
    lease: *const lbx_lease,
    region: *const lbx_region,
    region_offset: usize,
    lease_offset: u64,
    len: usize,
) -> i32 {
    entry("lbx_write_from", || {
        let r = self::region(region, "region")?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").write_from(r, region_offset, lease_offset, len)?)
    })
}

/// Zero copy: reads `len` bytes at `lease_offset` in the lease straight into `region` at `region_offset`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_read_into(
    lease: *const lbx_lease,
    region: *const lbx_region,
    region_offset: usize,
    lease_offset: u64,
    len: usize,
) -> i32 {
    entry("lbx_read_into", || {
        let r = self::region(region, "region")?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").read_into(r, region_offset, lease_offset, len)?)
    })
}

/// Zero copy, gathered: one write of the `n` pieces `sge[]`, in order, to `lease_offset` (at most
/// `lbx_lease_max_sge(lease)` pieces).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_write_from_sg(lease: *const lbx_lease, sge: *const lbx_sge, n: usize, lease_offset: u64) -> i32 {
    entry("lbx_write_from_sg", || {
        let p = pieces(sge, n)?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").write_from_sg(&p, lease_offset)?)
    })
}

/// Zero copy, scattered: one read from `lease_offset` into the `n` pieces `sge[]`, in order.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_read_into_sg(lease: *const lbx_lease, sge: *const lbx_sge, n: usize, lease_offset: u64) -> i32 {
    entry("lbx_read_into_sg", || {
        let p = pieces(sge, n)?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").read_into_sg(&p, lease_offset)?)
    })
}

/// The most pieces one scatter/gather call or `lbx_op` may have on this lease (the verbs device's limit, or 32
/// on the software requester); 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_max_sge(lease: *const lbx_lease) -> usize {
    caught(|| lease_guard(lease).ok().and_then(|g| g.as_ref().map(|l| l.max_sge())).unwrap_or(0)).unwrap_or(0)
}

/// The work requests this lease keeps posted at most (more wait in its queue); 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_queue_depth(lease: *const lbx_lease) -> usize {
    caught(|| lease_guard(lease).ok().and_then(|g| g.as_ref().map(|l| l.queue_depth())).unwrap_or(0)).unwrap_or(0)
}

/// Sets the lease's queue depth: 1 to 4096 (a verbs QP also stops at its send queue, sized at allocation from
/// the client's `queue_depth`).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_set_queue_depth(lease: *const lbx_lease, depth: usize) -> i32 {
    entry("lbx_lease_set_queue_depth", || {
        if depth == 0 || depth > leasebox_client::MAX_QUEUE_DEPTH {
            return Err(invalid(format!("queue depth {depth} (1 to {})", leasebox_client::MAX_QUEUE_DEPTH)));
        }
        let g = lease_guard(lease)?;
        g.as_ref().expect("checked by lease_guard").set_queue_depth(depth);
        Ok(())
    })
}

/// Bytes the copying calls (`lbx_lease_write`, `lbx_lease_read` and their batches) copied between the
/// caller's buffers and the library's; zero-copy transfers add nothing. 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_bytes_copied(client: *const lbx_client) -> u64 {
    caught(|| self::client(client).map_or(0, |c| c.bytes_copied())).unwrap_or(0)
}

/// A file descriptor that polls readable (poll(2), epoll) exactly while completions wait to be taken by
/// `lbx_poll` or `lbx_wait`. Do not read or close it: the client does. -1 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_completion_fd(client: *const lbx_client) -> c_int {
    caught(|| self::client(client).map_or(-1, |c| c.completion_fd())).unwrap_or(-1)
}

/// Operations submitted on this client whose completion has not been taken yet.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_pending(client: *const lbx_client) -> u64 {
    caught(|| client_handle(client).map_or(0, |h| h.tickets().len() as u64)).unwrap_or(0)
}

/// The library's operation for `o`.
fn op<'a>(o: &lbx_op, i: usize) -> Result<Op<'a>, Fail> {
    let read = match o.kind {
        LBX_OP_WRITE => false,
        LBX_OP_READ => true,
        k => return Err(invalid(format!("ops[{i}].kind is {k} (LBX_OP_WRITE or LBX_OP_READ)"))),
    };
    let list = match (o.sge.is_null(), o.region.is_null()) {
        (true, false) => vec![(region(o.region, "ops[].region")?, o.region_offset, o.len)],
        (false, true) => pieces(o.sge, o.n_sge)?,
        (true, true) => return Err(invalid(format!("ops[{i}] names no memory (region or sge)"))),
        (false, false) => return Err(invalid(format!("ops[{i}] names both a region and an sge list"))),
    };
    let g = lease_guard(o.lease).map_err(|e| match e {
        Fail::Invalid(m) => invalid(format!("ops[{i}].lease: {m}")),
        e => e,
    })?;
    let l = g.as_ref().expect("checked by lease_guard");
    Ok(if read { Op::read_into_sg(l, &list, o.lease_offset) } else { Op::write_from_sg(l, &list, o.lease_offset) })
}

/// Starts the `n` operations `ops[]` (on any leases of this client, on any of its appliances) and writes one
/// ticket per operation to `tickets[]`, in order. The client's progress thread runs them, each lease's in order
/// up to its queue depth; each completes on its own (`lbx_poll`, `lbx_wait`, `lbx_wait_ticket`): a lease revoked
/// meanwhile fails only its own operations, with `LBX_ERR_REVOKED` and the outcome. A NULL or invalid handle or
/// kind fails the whole call with `LBX_ERR_INVALID_ARGUMENT` before anything is submitted; the rest (ranges,
/// pieces, overlaps) is each operation's own result. A lease busy in a blocking call on another thread delays
/// the submission until that call returns.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_submit(client: *const lbx_client, ops: *const lbx_op, n: usize, tickets: *mut u64) -> i32 {
    entry("lbx_submit", || {
        let h = client_handle(client)?;
        let c = self::client(client)?;
        if n == 0 {
            return Ok(());
        }
        if ops.is_null() {
            return Err(invalid("ops is NULL"));
        }
        let tickets = out(tickets, "tickets")?;
        // SAFETY: non-NULL; the caller passes `n` readable `lbx_op`s for the call.
        let list = unsafe { std::slice::from_raw_parts(ops, n) };
        let made = list.iter().enumerate().map(|(i, o)| op(o, i)).collect::<Result<Vec<_>, Fail>>()?;
        // Under the ticket lock: every ticket is recorded before another thread can take its result.
        let mut pending = h.tickets();
        let t = c.submit(made);
        pending.extend(t.iter().map(|t| (t.id(), *t)));
        drop(pending);
        // SAFETY: non-NULL; the caller passes room for `n` tickets.
        let out = unsafe { std::slice::from_raw_parts_mut(tickets, n) };
        for (o, t) in out.iter_mut().zip(&t) {
            *o = t.id();
        }
        Ok(())
    })
}

/// The C form of one result.
fn completion(c: &Completed) -> lbx_completion {
    match &c.1 {
        Ok(n) => lbx_completion { ticket: c.0.id(), status: LBX_OK, outcome: 0, bytes: *n as u64 },
        Err(e) => {
            let outcome = if let Error::Revoked { outcome, .. } = e { *outcome as u32 } else { 0 };
            lbx_completion { ticket: c.0.id(), status: status_of(e), outcome, bytes: 0 }
        }
    }
}

/// Writes `got` to `out` from index `at`, noting the first failure's message.
fn write(got: &[Completed], out: *mut lbx_completion, at: usize, note: &mut Option<String>) {
    for (k, c) in got.iter().enumerate() {
        // SAFETY: the callers checked `out` non-NULL with room for `max` completions, and `at + got.len()` stays
        // within `max`.
        unsafe { out.add(at + k).write(completion(c)) };
        if let (Err(e), None) = (&c.1, &note) {
            *note = Some(format!("ticket {}: {e}", c.0.id()));
        }
    }
}

/// Takes up to `max` results there now into `out[at..]` (under the ticket lock, so a submit's tickets are all
/// recorded before any of its results is taken); (operations still pending, room left of `max`).
fn take(
    h: &lbx_client,
    c: &leasebox_client::Client,
    room: usize,
    out: *mut lbx_completion,
    at: usize,
    note: &mut Option<String>,
) -> (usize, usize) {
    let mut pending = h.tickets();
    let got = c.poll(room);
    for g in &got {
        pending.remove(&g.0.id());
    }
    let left = pending.len();
    drop(pending);
    write(&got, out, at, note);
    (left, room - got.len())
}

/// The output array and count of `lbx_poll` / `lbx_wait`, checked; `*count` is 0 from here on.
fn outputs(out: *mut lbx_completion, max: usize, count: *mut usize) -> Result<*mut usize, Fail> {
    let count = self::out(count, "count")?;
    // SAFETY: non-NULL, writable (the caller's contract).
    unsafe { count.write(0) };
    if max > 0 && out.is_null() {
        return Err(invalid("out is NULL"));
    }
    Ok(count)
}

/// Takes up to `max` completions that are there now, in the order they finished, into `out[]`, without
/// waiting; `*count` says how many. `lbx_last_error()` names the first failed one's error ("" when all
/// succeeded).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_poll(client: *const lbx_client, out: *mut lbx_completion, max: usize, count: *mut usize) -> i32 {
    entry_noting("lbx_poll", || {
        let (h, c) = (client_handle(client)?, self::client(client)?);
        let count = outputs(out, max, count)?;
        let mut note = None;
        let (_, room) = take(h, c, max, out, 0, &mut note);
        // SAFETY: checked by `outputs`.
        unsafe { count.write(max - room) };
        Ok(note)
    })
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable(fd: c_int, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Takes completions into `out[]` as operations finish, until `max` are there or no operation is pending
/// (every result submitted so far taken), waiting at most `timeout_ms`; `*count` says how many. Give room for
/// every operation submitted to wait for all of them. `LBX_ERR_TIMEOUT` when the time ran out first: the
/// `*count` completions taken until then are in `out[]` all the same. `lbx_last_error()` names the first
/// failed one's error.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_wait(
    client: *const lbx_client,
    timeout_ms: u32,
    out: *mut lbx_completion,
    max: usize,
    count: *mut usize,
) -> i32 {
    entry_noting("lbx_wait", || {
        let (h, c) = (client_handle(client)?, self::client(client)?);
        let count = outputs(out, max, count)?;
        let end = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let fd = c.completion_fd();
        let (mut taken, mut note) = (0, None);
        loop {
            let left_pending = take(h, c, max - taken, out, taken, &mut note);
            taken = max - left_pending.1;
            // SAFETY: checked by `outputs`.
            unsafe { count.write(taken) };
            if taken == max || left_pending.0 == 0 {
                return Ok(note);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let first = note.map(|n| format!("; the first failed completion: {n}")).unwrap_or_default();
                let pending = left_pending.0;
                return Err(Fail::Status(
                    crate::LBX_ERR_TIMEOUT,
                    format!("{taken} completions within {timeout_ms} ms, {pending} still pending{first}"),
                ));
            }
            // Several threads may wait on the same fd: one takes, the others look again at most every 100 ms.
            readable(fd, left.as_millis().clamp(1, 100) as i32);
        }
    })
}

/// Waits up to `timeout_ms` for the operation of `ticket` and takes its completion alone into `*out`.
/// `LBX_ERR_TIMEOUT` when it did not finish in time; `LBX_ERR_INVALID_ARGUMENT` for a ticket whose completion
/// was already taken (or never given). The completion's own status is in `out->status`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_wait_ticket(
    client: *const lbx_client,
    ticket: u64,
    timeout_ms: u32,
    out: *mut lbx_completion,
) -> i32 {
    entry_noting("lbx_wait_ticket", || {
        let (h, c) = (client_handle(client)?, self::client(client)?);
        let out = self::out(out, "out")?;
        let t = h.tickets().get(&ticket).copied();
        let Some(t) = t else {
            return Err(invalid(format!("ticket {ticket} is not pending (its completion was taken, or never given)")));
        };
        // Not under the ticket lock: nobody else can take this result (the library gives each result once),
        // and other threads' polls and submits go on meanwhile.
        let got = c.wait(Wait::Ticket(t), Duration::from_millis(u64::from(timeout_ms)))?;
        let mut note = None;
        let mut pending = h.tickets();
        for g in &got {
            pending.remove(&g.0.id());
        }
        drop(pending);
        write(&got, out, 0, &mut note);
        Ok(note)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LBX_ERR_INVALID_ARGUMENT, lbx_last_error};

    fn last() -> String {
        // SAFETY: a NUL-terminated string valid until the next call on this thread.
        unsafe { std::ffi::CStr::from_ptr(lbx_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn null_and_foreign_handles_are_refused() {
        let mut r: *mut lbx_region = std::ptr::null_mut();
        let mut byte = 0u8;
        let addr = (&mut byte as *mut u8).cast::<c_void>();
        assert_eq!(lbx_register(std::ptr::null(), addr, 1, &mut r), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("client handle is NULL"), "{}", last());
        assert!(r.is_null());
        assert_eq!(lbx_region_free(std::ptr::null_mut(), 0), LBX_OK);
        assert_eq!((lbx_region_len(std::ptr::null()), lbx_region_in_use(std::ptr::null())), (0, 0));
        assert_eq!(lbx_completion_fd(std::ptr::null()), -1);
        assert_eq!((lbx_bytes_copied(std::ptr::null()), lbx_pending(std::ptr::null())), (0, 0));
        assert_eq!(lbx_lease_max_sge(std::ptr::null()), 0);
        let mut n = 7usize;
        assert_eq!(lbx_poll(std::ptr::null(), std::ptr::null_mut(), 0, &mut n), LBX_ERR_INVALID_ARGUMENT);
        assert_eq!(lbx_submit(std::ptr::null(), std::ptr::null(), 0, std::ptr::null_mut()), LBX_ERR_INVALID_ARGUMENT);
        // Memory that is no live region (whatever the field order, every word of it is a dead tag) is refused.
        let sge = lbx_sge { region: std::ptr::dangling(), offset: 0, len: 1 };
        let junk = [DEAD_TAG; 8];
        const _: () = assert!(std::mem::size_of::<lbx_region>() <= std::mem::size_of::<[u64; 8]>());
        let r = junk.as_ptr().cast::<lbx_region>();
        assert_eq!(lbx_write_from(std::ptr::null(), r, 0, 0, 1), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("region is not a live lbx_region"), "{}", last());
        assert_eq!(lbx_write_from_sg(std::ptr::null(), &sge, 0, 0), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("0 pieces"), "{}", last());
        assert_eq!(lbx_lease_set_queue_depth(std::ptr::null(), 0), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("queue depth 0"), "{}", last());
    }

    #[test]
    fn an_op_names_its_memory_one_way() {
        let both = lbx_op {
            kind: LBX_OP_WRITE,
            lease: std::ptr::null(),
            lease_offset: 0,
            region: std::ptr::dangling(),
            region_offset: 0,
            len: 1,
            sge: std::ptr::dangling(),
            n_sge: 1,
        };
        assert!(matches!(op(&both, 3), Err(Fail::Invalid(m)) if m.contains("ops[3] names both")));
        let none = lbx_op { region: std::ptr::null(), sge: std::ptr::null(), ..both };
        assert!(matches!(op(&none, 0), Err(Fail::Invalid(m)) if m.contains("names no memory")));
        let kind = lbx_op { kind: 7, ..none };
        assert!(matches!(op(&kind, 1), Err(Fail::Invalid(m)) if m.contains("ops[1].kind is 7")));
    }
}
