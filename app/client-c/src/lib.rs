//! The Leasebox client's C ABI (`leasebox_client.h`, generated from this file by cbindgen).
//!
//! - Opaque handles: `lbx_client` (a client of one or more appliances, with its heartbeat thread) and
//!   `lbx_lease` (one lease and its RDMA queue pair). Both may be used from several threads at once; a lease's
//!   calls are serialized on it.
//! - Every call that can fail returns an `int32_t` status: `LBX_OK` (0) or one of the `LBX_ERR_*` codes. The
//!   message of the last failure on the calling thread is `lbx_last_error()`.
//! - No panic crosses the boundary: each entry point runs under `catch_unwind` and a panic becomes
//!   `LBX_ERR_PANIC`. NULL or foreign pointers, and handles already destroyed, are refused with
//!   `LBX_ERR_INVALID_ARGUMENT` as far as the handle's tag can tell (a freed handle's memory may be reused, so
//!   using one stays a bug).
//!
//! Handles wrap the high-level client in `leasebox-client-interim` (app/client-interim/src/lib.rs).
#![allow(non_camel_case_types)]
// These functions are the C ABI: a C caller sees no `unsafe`, and what every pointer must be is the contract the
// header states. Marking them `unsafe fn` would change nothing for C and only move the same contract.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use leasebox_client_interim::{AllocOptions, Client, Config, Error, ErrorKind, Event, Lease, Xfer};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

/// Success.
pub const LBX_OK: i32 = 0;
/// A NULL or invalid argument (handle, string, buffer, offset out of the lease).
pub const LBX_ERR_INVALID_ARGUMENT: i32 = 1;
/// The control connection could not be made or broke.
pub const LBX_ERR_CONNECTION: i32 = 2;
/// No answer or RDMA completion within the deadline.
pub const LBX_ERR_TIMEOUT: i32 = 3;
/// The appliance refused the credentials.
pub const LBX_ERR_AUTH: i32 = 4;
/// No appliance had memory for the lease.
pub const LBX_ERR_NO_MEMORY: i32 = 5;
/// The appliance answered with another error (see `lbx_last_error()`).
pub const LBX_ERR_SERVER: i32 = 6;
/// The lease was revoked (or fenced) at the appliance: stop using it, free the handle.
pub const LBX_ERR_REVOKED: i32 = 7;
/// The lease was freed.
pub const LBX_ERR_FREED: i32 = 8;
/// An RDMA operation failed for another reason.
pub const LBX_ERR_RDMA: i32 = 9;
/// The appliance broke the protocol.
pub const LBX_ERR_PROTOCOL: i32 = 10;
/// The client was closed.
pub const LBX_ERR_CLOSED: i32 = 11;
/// A bug inside the library (a caught panic); the message says where.
pub const LBX_ERR_PANIC: i32 = 12;

/// No event within the wait.
pub const LBX_EVENT_NONE: i32 = 0;
/// The control connection broke and a new session replaced it (`session_id`).
pub const LBX_EVENT_RECONNECTED: i32 = 1;
/// The control connection broke and could not be made again yet.
pub const LBX_EVENT_DISCONNECTED: i32 = 2;
/// A lease (`lease`) was found revoked at the appliance.
pub const LBX_EVENT_REVOKED: i32 = 3;

/// Tags that tell a live handle of each type from anything else.
const CLIENT_TAG: u64 = 0x6c62_785f_636c_6e74; // "lbx_clnt"
const LEASE_TAG: u64 = 0x6c62_785f_6c65_6173; // "lbx_leas"
const DEAD_TAG: u64 = 0xdead_dead_dead_dead;

/// A client of one or more appliances (opaque).
pub struct lbx_client {
    tag: u64,
    inner: Option<Client>,
}

/// A lease (opaque).
pub struct lbx_lease {
    tag: u64,
    inner: Option<Lease>,
}

/// One piece of a batched write or read: `len` bytes at `offset` in the lease, from or into `buf`.
#[repr(C)]
pub struct lbx_iov {
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
}

/// What `lbx_client_next_event` reports.
#[repr(C)]
pub struct lbx_event {
    /// `LBX_EVENT_*`.
    pub kind: i32,
    /// The lease of `LBX_EVENT_REVOKED`.
    pub lease: u64,
    /// The new session of `LBX_EVENT_RECONNECTED`.
    pub session_id: u64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn code(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::InvalidArgument => LBX_ERR_INVALID_ARGUMENT,
        ErrorKind::Connection => LBX_ERR_CONNECTION,
        ErrorKind::Timeout => LBX_ERR_TIMEOUT,
        ErrorKind::Auth => LBX_ERR_AUTH,
        ErrorKind::NoMemory => LBX_ERR_NO_MEMORY,
        ErrorKind::Server => LBX_ERR_SERVER,
        ErrorKind::Revoked => LBX_ERR_REVOKED,
        ErrorKind::Freed => LBX_ERR_FREED,
        ErrorKind::Rdma => LBX_ERR_RDMA,
        ErrorKind::Protocol => LBX_ERR_PROTOCOL,
        ErrorKind::Closed => LBX_ERR_CLOSED,
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// Runs `f` as an entry point: its error becomes a status and the thread's last error; a panic becomes
/// `LBX_ERR_PANIC`.
fn entry(what: &str, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            LBX_OK
        }
        Ok(Err(e)) => {
            set_last_error(&format!("{what}: {}", e.message));
            code(e.kind)
        }
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{what}: internal error (panic): {why}"));
            LBX_ERR_PANIC
        }
    }
}

/// The string `p` points to, or an error naming `what`.
fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string that stays valid for the call (the header says so).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn client<'a>(c: *const lbx_client) -> Result<&'a Client, Error> {
    if c.is_null() {
        return Err(invalid("client handle is NULL"));
    }
    // SAFETY: non-NULL; the caller passes a handle from `lbx_client_connect` not yet closed. A stale or foreign
    // pointer is caught by the tag as far as its memory still reads.
    let h = unsafe { &*c };
    match (h.tag, &h.inner) {
        (CLIENT_TAG, Some(inner)) => Ok(inner),
        _ => Err(invalid("not a live lbx_client handle")),
    }
}

fn lease<'a>(l: *const lbx_lease) -> Result<&'a Lease, Error> {
    if l.is_null() {
        return Err(invalid("lease handle is NULL"));
    }
    // SAFETY: as in `client`, for a handle from `lbx_alloc` not yet freed.
    let h = unsafe { &*l };
    match (h.tag, &h.inner) {
        (LEASE_TAG, Some(inner)) => Ok(inner),
        _ => Err(invalid("not a live lbx_lease handle")),
    }
}

fn out<T>(p: *mut T, what: &str) -> Result<*mut T, Error> {
    if p.is_null() { Err(invalid(format!("{what} is NULL"))) } else { Ok(p) }
}

/// The message of the last failed call on this thread ("" after a success). Valid until the next call on this
/// thread; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"internal error".as_ptr())
}

/// The name of a status code (`"LBX_ERR_REVOKED"`); a static string, never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_status_name(status: i32) -> *const c_char {
    let s = match status {
        LBX_OK => c"LBX_OK",
        LBX_ERR_INVALID_ARGUMENT => c"LBX_ERR_INVALID_ARGUMENT",
        LBX_ERR_CONNECTION => c"LBX_ERR_CONNECTION",
        LBX_ERR_TIMEOUT => c"LBX_ERR_TIMEOUT",
        LBX_ERR_AUTH => c"LBX_ERR_AUTH",
        LBX_ERR_NO_MEMORY => c"LBX_ERR_NO_MEMORY",
        LBX_ERR_SERVER => c"LBX_ERR_SERVER",
        LBX_ERR_REVOKED => c"LBX_ERR_REVOKED",
        LBX_ERR_FREED => c"LBX_ERR_FREED",
        LBX_ERR_RDMA => c"LBX_ERR_RDMA",
        LBX_ERR_PROTOCOL => c"LBX_ERR_PROTOCOL",
        LBX_ERR_CLOSED => c"LBX_ERR_CLOSED",
        LBX_ERR_PANIC => c"LBX_ERR_PANIC",
        _ => c"LBX_UNKNOWN_STATUS",
    };
    s.as_ptr()
}

/// Connects and authenticates. `appliances`: one or more control addresses `HOST:PORT`, comma-separated (the
/// first that answers is used; leases go where the connection is). `name`: the tenant (or `admin`); `key_hex`:
/// its key in hex. `rdma_peer`: the appliance's RoCEv2 UDP address, NULL for 127.0.0.1:4791. `timeout_ms`: the
/// deadline of one answer and of connecting (0: 10 s). On success `*out` is a new handle for
/// `lbx_client_close`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_connect(
    appliances: *const c_char,
    name: *const c_char,
    key_hex: *const c_char,
    rdma_peer: *const c_char,
    timeout_ms: u32,
    out: *mut *mut lbx_client,
) -> i32 {
    entry("lbx_client_connect", || {
        let out = self::out(out, "out")?;
        // SAFETY: `out` is non-NULL and points to writable storage for a pointer (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let list = string(appliances, "appliances")?;
        let mut cfg = Config::new("", string(name, "name")?, string(key_hex, "key_hex")?)?;
        cfg.appliances = list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        if cfg.appliances.is_empty() {
            return Err(invalid("appliances names no address"));
        }
        if !rdma_peer.is_null() {
            let p = string(rdma_peer, "rdma_peer")?;
            cfg.rdma_peer = p.parse().map_err(|_| invalid(format!("rdma_peer '{p}' is not ADDR:PORT")))?;
        }
        if timeout_ms != 0 {
            let t = Duration::from_millis(u64::from(timeout_ms));
            cfg.timeouts.receive = t;
            cfg.timeouts.retry_for = t;
            cfg.timeouts.connect = t.min(cfg.timeouts.connect);
        }
        let c = Client::connect(cfg)?;
        let h = Box::into_raw(Box::new(lbx_client { tag: CLIENT_TAG, inner: Some(c) }));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// Says BYE, stops the heartbeat thread and destroys the handle (NULL: nothing). Leases allocated through it
/// must be freed first (after this, `lbx_lease_free` only destroys their handles).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_close(client: *mut lbx_client) -> i32 {
    entry("lbx_client_close", || {
        if client.is_null() {
            return Ok(());
        }
        self::client(client)?;
        // SAFETY: checked live above; the handle came from `Box::into_raw` in `lbx_client_connect`, and the caller
        // gives it up with this call.
        let mut h = unsafe { Box::from_raw(client) };
        h.tag = DEAD_TAG;
        match h.inner.take() {
            Some(c) => c.close(),
            None => Ok(()),
        }
    })
}

/// One HEARTBEAT round trip; `*uptime_ms` (may be NULL) gets the appliance's uptime.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_ping(client: *const lbx_client, uptime_ms: *mut u64) -> i32 {
    entry("lbx_client_ping", || {
        let up = self::client(client)?.ping()?;
        if !uptime_ms.is_null() {
            // SAFETY: non-NULL, writable (the caller's contract).
            unsafe { uptime_ms.write(up) };
        }
        Ok(())
    })
}

/// The current session id (changes on reconnect) into `*session_id`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_session_id(client: *const lbx_client, session_id: *mut u64) -> i32 {
    entry("lbx_client_session_id", || {
        let c = self::client(client)?;
        let p = out(session_id, "session_id")?;
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { p.write(c.session_id()) };
        Ok(())
    })
}

/// Drops the control connection and opens a new session; `*session_id` (may be NULL) gets its id.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_reconnect(client: *const lbx_client, session_id: *mut u64) -> i32 {
    entry("lbx_client_reconnect", || {
        let sid = self::client(client)?.reconnect()?;
        if !session_id.is_null() {
            // SAFETY: non-NULL, writable (the caller's contract).
            unsafe { session_id.write(sid) };
        }
        Ok(())
    })
}

/// Waits up to `wait_ms` for the next event; `event->kind` is `LBX_EVENT_NONE` when none came.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_next_event(client: *const lbx_client, wait_ms: u32, event: *mut lbx_event) -> i32 {
    entry("lbx_client_next_event", || {
        let c = self::client(client)?;
        let p = out(event, "event")?;
        let e = match c.next_event(Duration::from_millis(u64::from(wait_ms))) {
            None => lbx_event { kind: LBX_EVENT_NONE, lease: 0, session_id: 0 },
            Some(Event::Reconnected { session_id }) => lbx_event { kind: LBX_EVENT_RECONNECTED, lease: 0, session_id },
            Some(Event::Disconnected { reason }) => {
                set_last_error(&reason);
                lbx_event { kind: LBX_EVENT_DISCONNECTED, lease: 0, session_id: 0 }
            }
            Some(Event::Revoked { lease, .. }) => lbx_event { kind: LBX_EVENT_REVOKED, lease, session_id: 0 },
        };
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { p.write(e) };
        Ok(())
    })
}

/// REVOKE lease `lease_id` (admin clients only).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_revoke(client: *const lbx_client, lease_id: u64) -> i32 {
    entry("lbx_client_revoke", || self::client(client)?.revoke(lease_id))
}

/// Allocates a lease of at least `size` bytes, ready for RDMA. `ttl_ms`: its lifetime (0: the appliance's
/// default). Prefer few large leases (each costs the appliance a queue pair) and place blocks inside them.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_alloc(client: *const lbx_client, size: u64, ttl_ms: u32, out: *mut *mut lbx_lease) -> i32 {
    entry("lbx_alloc", || {
        let out = self::out(out, "out")?;
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let l = self::client(client)?.alloc(size, AllocOptions { ttl_ms })?;
        let h = Box::into_raw(Box::new(lbx_lease { tag: LEASE_TAG, inner: Some(l) }));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// The lease's id (slot << 32 | generation), 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_id(lease: *const lbx_lease) -> u64 {
    catch_unwind(|| self::lease(lease).map_or(0, Lease::id)).unwrap_or(0)
}

/// The lease's size in bytes, 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_size(lease: *const lbx_lease) -> u64 {
    catch_unwind(|| self::lease(lease).map_or(0, Lease::len)).unwrap_or(0)
}

fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes `len` readable bytes that stay valid for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

fn bytes_mut<'a>(p: *mut u8, len: usize, what: &str) -> Result<&'a mut [u8], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes `len` writable bytes, not aliased during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Writes `len` bytes from `data` at `offset`; returns once the appliance has acknowledged them.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_write(lease: *const lbx_lease, offset: u64, data: *const u8, len: usize) -> i32 {
    entry("lbx_lease_write", || self::lease(lease)?.write(offset, bytes(data, len, "data")?))
}

/// Reads `len` bytes at `offset` into `buf`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_read(lease: *const lbx_lease, offset: u64, buf: *mut u8, len: usize) -> i32 {
    entry("lbx_lease_read", || self::lease(lease)?.read(offset, bytes_mut(buf, len, "buf")?))
}

fn iovs<'a>(iov: *const lbx_iov, n: usize) -> Result<&'a [lbx_iov], Error> {
    if n == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(invalid("iov is NULL"));
    }
    // SAFETY: non-NULL; the caller passes `n` readable `lbx_iov`s.
    Ok(unsafe { std::slice::from_raw_parts(iov, n) })
}

/// `n` writes (`iov[i].buf` → lease at `iov[i].offset`), pipelined; returns once all are acknowledged.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_write_batch(lease: *const lbx_lease, iov: *const lbx_iov, n: usize) -> i32 {
    entry("lbx_lease_write_batch", || {
        let l = self::lease(lease)?;
        let ops = iovs(iov, n)?
            .iter()
            .map(|v| Ok((v.offset, bytes(v.buf, v.len, "iov[].buf")?)))
            .collect::<Result<Vec<_>, Error>>()?;
        l.write_batch(&ops)
    })
}

/// `n` reads (lease at `iov[i].offset` → `iov[i].buf`), pipelined. The buffers must not overlap.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_read_batch(lease: *const lbx_lease, iov: *const lbx_iov, n: usize) -> i32 {
    entry("lbx_lease_read_batch", || {
        let l = self::lease(lease)?;
        let mut ops = iovs(iov, n)?
            .iter()
            .map(|v| Ok(Xfer::Read { offset: v.offset, buf: bytes_mut(v.buf, v.len, "iov[].buf")? }))
            .collect::<Result<Vec<_>, Error>>()?;
        l.batch(&mut ops)
    })
}

/// FREEs the lease at the appliance (nothing to do when it was revoked) and destroys the handle, whatever the
/// status (NULL: nothing).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_free(lease: *mut lbx_lease) -> i32 {
    entry("lbx_lease_free", || {
        if lease.is_null() {
            return Ok(());
        }
        self::lease(lease)?;
        // SAFETY: checked live above; the handle came from `Box::into_raw` in `lbx_alloc`, and the caller gives it
        // up with this call.
        let mut h = unsafe { Box::from_raw(lease) };
        h.tag = DEAD_TAG;
        match h.inner.take() {
            Some(l) => l.free(),
            None => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: `lbx_last_error` returns a NUL-terminated string valid until the next call on this thread.
        unsafe { CStr::from_ptr(lbx_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn null_arguments_are_refused_with_a_message() {
        let mut c: *mut lbx_client = std::ptr::null_mut();
        assert_eq!(
            lbx_client_connect(std::ptr::null(), c"demo".as_ptr(), c"00".as_ptr(), std::ptr::null(), 0, &mut c),
            LBX_ERR_INVALID_ARGUMENT
        );
        assert!(last().contains("appliances is NULL"), "{}", last());
        assert!(c.is_null());
        assert_eq!(lbx_client_ping(std::ptr::null(), std::ptr::null_mut()), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("client handle is NULL"), "{}", last());
        assert_eq!(lbx_lease_write(std::ptr::null(), 0, std::ptr::null(), 0), LBX_ERR_INVALID_ARGUMENT);
        assert_eq!(lbx_alloc(std::ptr::null(), 4096, 0, std::ptr::null_mut()), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("out is NULL"), "{}", last());
        assert_eq!(lbx_lease_id(std::ptr::null()), 0);
        assert_eq!(lbx_lease_free(std::ptr::null_mut()), LBX_OK);
        assert_eq!(lbx_client_close(std::ptr::null_mut()), LBX_OK);
        assert_eq!(last(), "");
    }

    #[test]
    fn bad_keys_and_addresses_are_refused_before_connecting() {
        let mut c: *mut lbx_client = std::ptr::null_mut();
        let r =
            lbx_client_connect(c"127.0.0.1:1".as_ptr(), c"demo".as_ptr(), c"zz".as_ptr(), std::ptr::null(), 0, &mut c);
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("key"), "{}", last());
        let r = lbx_client_connect(c" , ".as_ptr(), c"demo".as_ptr(), c"0011".as_ptr(), std::ptr::null(), 0, &mut c);
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        let r = lbx_client_connect(
            c"127.0.0.1:1".as_ptr(),
            c"demo".as_ptr(),
            c"0011".as_ptr(),
            c"nope".as_ptr(),
            0,
            &mut c,
        );
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("rdma_peer 'nope'"), "{}", last());
    }

    #[test]
    fn a_handle_of_the_wrong_type_is_refused() {
        let fake = lbx_lease { tag: DEAD_TAG, inner: None };
        assert_eq!(lbx_lease_read(&fake, 0, std::ptr::null_mut(), 0), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("not a live lbx_lease"), "{}", last());
        let fake = lbx_client { tag: LEASE_TAG, inner: None };
        assert_eq!(lbx_client_revoke(&fake, 1), LBX_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let r = entry("test", || panic!("boom"));
        assert_eq!(r, LBX_ERR_PANIC);
        assert_eq!(last(), "test: internal error (panic): boom");
        // SAFETY: a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(lbx_status_name(LBX_ERR_REVOKED)) };
        assert_eq!(name.to_str(), Ok("LBX_ERR_REVOKED"));
    }
}
