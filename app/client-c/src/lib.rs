//! The Leasebox client's C ABI (`leasebox_client.h`, generated from this file by cbindgen).
//!
//! - Opaque handles: `lbx_client` (a client of one or more appliances, with its heartbeat thread),
//!   `lbx_lease` (one lease and its RDMA queue pair) and `lbx_region` (registered memory). All may be used from
//!   several threads at once; a lease's calls are serialized on it.
//! - Every call that can fail returns an `int32_t` status: `LBX_OK` (0) or one of the `LBX_ERR_*` codes. The
//!   message of the last failure on the calling thread is `lbx_last_error()`.
//! - No panic crosses the boundary: each entry point runs under `catch_unwind` and a panic becomes
//!   `LBX_ERR_PANIC`. NULL or foreign pointers, and handles already destroyed, are refused with
//!   `LBX_ERR_INVALID_ARGUMENT` as far as the handle's tag can tell (a freed handle's memory may be reused, so
//!   using one stays a bug).
//! - The data path ([`data_path`]): `lbx_region` (memory the caller registers), zero-copy transfers, and
//!   asynchronous batches across leases with one `lbx_completion` per operation and a completion fd.
//! - The RDMA requester of each appliance is chosen at run time ([`requester`], `lbx_client_connect_with`):
//!   software over UDP, or verbs (libibverbs, loaded when the first verbs lease is allocated).
//!
//! - The key-value store ([`store`]): `lbx_store` (docs/kv.md), per-item `int64_t` results with `LBX_KV_*` codes.
//!
//! Handles wrap `leasebox_client::{Client, Lease, Region}` (app/client/src/client.rs, app/client/src/lease.rs,
//! app/client/src/region.rs).
#![allow(non_camel_case_types)]
// These functions are the C ABI: a C caller sees no `unsafe`, and what every pointer must be is the contract the
// header states. Marking them `unsafe fn` would change nothing for C and only move the same contract.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use leasebox_client::{AllocOptions, Client, ClientConfig, Error, Event, FleetConfig, Lease, LeaseId, Ticket};
use leasebox_proto::{ErrorCode, Request, Response};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub mod data_path;
pub mod requester;
pub mod store;
pub use data_path::*;
pub use requester::*;
pub use store::*;

/// Success.
pub const LBX_OK: i32 = 0;
/// A NULL or invalid argument (handle, string, address, key, zero size).
pub const LBX_ERR_INVALID_ARGUMENT: i32 = 1;
/// An appliance could not be reached or the connection broke during the call (the client reconnects on its
/// own; calling again later may succeed).
pub const LBX_ERR_CONNECTION: i32 = 2;
/// No answer or RDMA completion within the deadline.
pub const LBX_ERR_TIMEOUT: i32 = 3;
/// The appliance refused the credentials.
pub const LBX_ERR_AUTH: i32 = 4;
/// No appliance had memory for the lease.
pub const LBX_ERR_NO_MEMORY: i32 = 5;
/// The appliance refused the request (`lbx_last_error()` names its error code).
pub const LBX_ERR_SERVER: i32 = 6;
/// The lease was revoked (by the operator, its TTL, a lost session) or vanished: its memory is no longer
/// ours; every later call on it fails the same way. Free the handle and allocate anew.
pub const LBX_ERR_REVOKED: i32 = 7;
/// An offset and length outside the lease; nothing was sent.
pub const LBX_ERR_OUT_OF_RANGE: i32 = 8;
/// An RDMA operation failed while the lease still exists (its queue pair is in error: free the lease and
/// allocate anew), or the RDMA requester could not be set up.
pub const LBX_ERR_RDMA: i32 = 9;
/// The lease was freed, or its client closed.
pub const LBX_ERR_CLOSED: i32 = 10;
/// A bug inside the library (a caught panic); the message says where.
pub const LBX_ERR_PANIC: i32 = 11;

/// No event within the wait.
pub const LBX_EVENT_NONE: i32 = 0;
/// A lease (`lease`) is gone: stop using it (`outcome`: `LBX_OUTCOME_*`).
pub const LBX_EVENT_REVOKED: i32 = 1;
/// A lease (`lease`) ends in `in_ms` unless renewed.
pub const LBX_EVENT_EXPIRING: i32 = 2;
/// A lease's (`lease`) memory is fenced: it is gone for this client.
pub const LBX_EVENT_FENCED: i32 = 3;
/// The appliance is draining: its leases will be revoked in `in_ms`.
pub const LBX_EVENT_DRAINING: i32 = 4;
/// The connection to `appliance` came back after a break; `session_id` is the new session.
pub const LBX_EVENT_RECONNECTED: i32 = 5;
/// The connection to `appliance` broke; the client keeps trying (the reason is `lbx_last_error()`).
pub const LBX_EVENT_DISCONNECTED: i32 = 6;

/// Tags that tell a live handle of each type from anything else.
const CLIENT_TAG: u64 = 0x6c62_785f_636c_6e74; // "lbx_clnt"
const LEASE_TAG: u64 = 0x6c62_785f_6c65_6173; // "lbx_leas"
const DEAD_TAG: u64 = 0xdead_dead_dead_dead;

/// A client of one or more appliances (opaque).
pub struct lbx_client {
    tag: u64,
    inner: Option<Client>,
    /// The batch operations submitted whose completion has not been taken, by ticket number (`lbx_pending`).
    pending: Mutex<HashMap<u64, Ticket>>,
}

impl lbx_client {
    fn new(c: Client) -> lbx_client {
        lbx_client { tag: CLIENT_TAG, inner: Some(c), pending: Mutex::new(HashMap::new()) }
    }

    fn tickets(&self) -> MutexGuard<'_, HashMap<u64, Ticket>> {
        // Plain bookkeeping: a panic elsewhere leaves it consistent.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A lease (opaque).
pub struct lbx_lease {
    tag: u64,
    id: lbx_lease_ident,
    size: u64,
    inner: Mutex<Option<Lease>>,
}

/// One piece of a batched write or read: `len` bytes at `offset` in the lease, from or into `buf`.
#[repr(C)]
pub struct lbx_iov {
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
}

/// A lease's id: the appliance's boot id (a lease id from another boot of the appliance names nothing, so
/// an id kept across an appliance reboot is answered as unknown), the slot, and the slot's generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct lbx_lease_ident {
    pub boot_id: [u8; 16],
    pub slot: u32,
    pub generation: u32,
}

impl From<LeaseId> for lbx_lease_ident {
    fn from(id: LeaseId) -> Self {
        lbx_lease_ident { boot_id: id.boot_id, slot: id.slot, generation: id.generation }
    }
}

impl From<lbx_lease_ident> for LeaseId {
    fn from(id: lbx_lease_ident) -> Self {
        LeaseId { boot_id: id.boot_id, slot: id.slot, generation: id.generation }
    }
}

/// What `lbx_client_next_event` reports; the fields that do not apply to `kind` are 0.
#[repr(C)]
pub struct lbx_event {
    /// `LBX_EVENT_*`.
    pub kind: i32,
    /// The appliance's index in the list given to `lbx_client_connect`.
    pub appliance: u32,
    /// The lease (as `lbx_lease_id` gives it).
    pub lease: lbx_lease_ident,
    /// The new session of `LBX_EVENT_RECONNECTED`.
    pub session_id: u64,
    /// Milliseconds left, for `LBX_EVENT_EXPIRING` and `LBX_EVENT_DRAINING`.
    pub in_ms: u32,
    /// The revoke's outcome for `LBX_EVENT_REVOKED`: `LBX_OUTCOME_TORN_DOWN`, `LBX_OUTCOME_FENCED` or
    /// `LBX_OUTCOME_NOT_FOUND`.
    pub outcome: u32,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A failure of this layer, or the client library's.
enum Fail {
    Invalid(String),
    /// A status of this layer's own, and its message.
    Status(i32, String),
    Client(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Client(e)
    }
}

fn invalid(msg: impl Into<String>) -> Fail {
    Fail::Invalid(msg.into())
}

/// The status of a client library error.
pub fn status_of(e: &Error) -> i32 {
    if matches!(e.server_code(), Some(ErrorCode::AuthFailed | ErrorCode::NotAuthenticated)) {
        return LBX_ERR_AUTH;
    }
    match e {
        Error::Config(_) => LBX_ERR_INVALID_ARGUMENT,
        Error::Connection { source: leasebox_client::ClientError::ServerProof, .. } => LBX_ERR_AUTH,
        Error::Connection { .. } => LBX_ERR_CONNECTION,
        Error::Server { .. } => LBX_ERR_SERVER,
        Error::NoMemory { .. } => LBX_ERR_NO_MEMORY,
        Error::Revoked { .. } => LBX_ERR_REVOKED,
        Error::OutOfRange { .. } => LBX_ERR_OUT_OF_RANGE,
        Error::Rdma { .. } | Error::Requester(_) => LBX_ERR_RDMA,
        Error::Timeout { .. } => LBX_ERR_TIMEOUT,
        Error::Closed(_) => LBX_ERR_CLOSED,
    }
}

/// Runs `f` as an entry point: its error becomes a status and the thread's last error; a panic becomes
/// `LBX_ERR_PANIC`.
fn entry(what: &str, f: impl FnOnce() -> Result<(), Fail>) -> i32 {
    entry_noting(what, || f().map(|()| None))
}

/// As [`entry`], for a call that succeeds with a note for `lbx_last_error()` (a batch's first failed
/// completion).
fn entry_noting(what: &str, f: impl FnOnce() -> Result<Option<String>, Fail>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(note)) => {
            set_last_error(&note.map(|n| format!("{what}: {n}")).unwrap_or_default());
            LBX_OK
        }
        Ok(Err(Fail::Invalid(m))) => {
            set_last_error(&format!("{what}: {m}"));
            LBX_ERR_INVALID_ARGUMENT
        }
        Ok(Err(Fail::Status(status, m))) => {
            set_last_error(&format!("{what}: {m}"));
            status
        }
        Ok(Err(Fail::Client(e))) => {
            set_last_error(&format!("{what}: {e}"));
            status_of(&e)
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
fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string that stays valid for the call (the header says so).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn client_handle<'a>(c: *const lbx_client) -> Result<&'a lbx_client, Fail> {
    if c.is_null() {
        return Err(invalid("client handle is NULL"));
    }
    // SAFETY: non-NULL; the caller passes a handle from `lbx_client_connect` not yet closed. A stale or foreign
    // pointer is caught by the tag as far as its memory still reads.
    let h = unsafe { &*c };
    match (h.tag, &h.inner) {
        (CLIENT_TAG, Some(_)) => Ok(h),
        _ => Err(invalid("not a live lbx_client handle")),
    }
}

fn client<'a>(c: *const lbx_client) -> Result<&'a Client, Fail> {
    client_handle(c).map(|h| h.inner.as_ref().expect("checked by client_handle"))
}

fn lease_handle<'a>(l: *const lbx_lease) -> Result<&'a lbx_lease, Fail> {
    if l.is_null() {
        return Err(invalid("lease handle is NULL"));
    }
    // SAFETY: as in `client`, for a handle from `lbx_alloc` not yet freed.
    let h = unsafe { &*l };
    if h.tag != LEASE_TAG {
        return Err(invalid("not a live lbx_lease handle"));
    }
    Ok(h)
}

fn lease_guard<'a>(l: *const lbx_lease) -> Result<MutexGuard<'a, Option<Lease>>, Fail> {
    let h = lease_handle(l)?;
    // A panic while the lease was held (caught at the boundary) leaves a lease whose state the library keeps
    // consistent itself: go on with it.
    let g = h.inner.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        return Err(Fail::Client(Error::Closed("the lease was freed")));
    }
    Ok(g)
}

fn out<T>(p: *mut T, what: &str) -> Result<*mut T, Fail> {
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
        LBX_ERR_OUT_OF_RANGE => c"LBX_ERR_OUT_OF_RANGE",
        LBX_ERR_RDMA => c"LBX_ERR_RDMA",
        LBX_ERR_CLOSED => c"LBX_ERR_CLOSED",
        LBX_ERR_PANIC => c"LBX_ERR_PANIC",
        LBX_ERR_BUSY => c"LBX_ERR_BUSY",
        _ => c"LBX_UNKNOWN_STATUS",
    };
    s.as_ptr()
}

/// Builds the client configuration of `lbx_client_connect`'s arguments.
pub fn config(
    appliances: &str,
    name: &str,
    key_hex: &str,
    rdma_peers: Option<&str>,
    timeout_ms: u32,
) -> Result<ClientConfig, String> {
    let addrs: Vec<String> = appliances.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
    let peers: Vec<String> = rdma_peers.map_or(Vec::new(), |p| p.split(',').map(String::from).collect());
    let timeout = (timeout_ms != 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
    ClientConfig::software(&addrs, name, key_hex, &peers, timeout)
}

/// Connects and authenticates to every appliance. `appliances`: control addresses `HOST:PORT`, comma-separated
/// (leases are placed by free bytes). `name`: the tenant (or `admin`); `key_hex`: its key in hex. `rdma_peers`:
/// the appliances' RoCEv2 UDP addresses (one for all, or one per appliance, comma-separated), NULL for
/// 127.0.0.1:4791. `timeout_ms`: the deadline of one answer, of connecting, and of one RDMA operation (0: the
/// defaults). On success `*out` is a new handle for `lbx_client_close`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_connect(
    appliances: *const c_char,
    name: *const c_char,
    key_hex: *const c_char,
    rdma_peers: *const c_char,
    timeout_ms: u32,
    out: *mut *mut lbx_client,
) -> i32 {
    entry("lbx_client_connect", || {
        let out = self::out(out, "out")?;
        // SAFETY: `out` is non-NULL and points to writable storage for a pointer (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let list = string(appliances, "appliances")?;
        let (name, key) = (string(name, "name")?, string(key_hex, "key_hex")?);
        let peers = if rdma_peers.is_null() { None } else { Some(string(rdma_peers, "rdma_peers")?) };
        let cfg = config(list, name, key, peers, timeout_ms).map_err(Fail::Invalid)?;
        let c = Client::connect(cfg)?;
        let h = Box::into_raw(Box::new(lbx_client::new(c)));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// Connects to the appliances etcd advertises (docs/fleet.md) and keeps following them: `etcd_endpoints`, etcd's
/// client endpoints `HOST:PORT`, comma-separated (plain HTTP). Leases are placed by two random choices weighted
/// by advertised free bytes; an appliance whose key vanishes gets no new leases; RDMA goes to each
/// advertisement's `rdma` address. `name`, `key_hex`, `timeout_ms` and `out` as for `lbx_client_connect`
/// (`timeout_ms` also bounds the wait for a first appliance in etcd). `LBX_ERR_NO_MEMORY` when etcd advertises
/// none in time.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_connect_etcd(
    etcd_endpoints: *const c_char,
    name: *const c_char,
    key_hex: *const c_char,
    timeout_ms: u32,
    out: *mut *mut lbx_client,
) -> i32 {
    connect_etcd("lbx_client_connect_etcd", etcd_endpoints, std::ptr::null(), name, key_hex, timeout_ms, out)
}

/// How to reach etcd beyond its endpoints, for `lbx_client_connect_etcd_with`. Every field may be NULL.
#[repr(C)]
pub struct lbx_etcd_options {
    /// TLS: the etcd cluster's CA (a PEM file). Endpoints are then `HOST:PORT` or `https://HOST:PORT`.
    pub ca_file: *const c_char,
    /// TLS: this client's certificate and key (PEM files; both or neither, and only with `ca_file`), for a
    /// cluster that verifies clients.
    pub cert_file: *const c_char,
    pub key_file: *const c_char,
    /// etcd authentication: the user (its role must read `/leasebox/v1/`) and its password (both or neither).
    pub user: *const c_char,
    pub password: *const c_char,
}

/// `lbx_client_connect_etcd` with TLS and/or an etcd user (`options`; NULL: as `lbx_client_connect_etcd`).
/// `LBX_ERR_INVALID_ARGUMENT` when the options do not go together or a file cannot be read or used; the last
/// error names it.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_connect_etcd_with(
    etcd_endpoints: *const c_char,
    options: *const lbx_etcd_options,
    name: *const c_char,
    key_hex: *const c_char,
    timeout_ms: u32,
    out: *mut *mut lbx_client,
) -> i32 {
    connect_etcd("lbx_client_connect_etcd_with", etcd_endpoints, options, name, key_hex, timeout_ms, out)
}

/// A configuration message with the options named as the C structure names them.
fn c_names(message: &str) -> String {
    message
        .replace("--etcd-cacert", "options.ca_file")
        .replace("--etcd-cert", "options.cert_file")
        .replace("--etcd-key", "options.key_file")
}

/// Both etcd starts.
fn connect_etcd(
    what: &'static str,
    etcd_endpoints: *const c_char,
    options: *const lbx_etcd_options,
    name: *const c_char,
    key_hex: *const c_char,
    timeout_ms: u32,
    out: *mut *mut lbx_client,
) -> i32 {
    entry(what, || {
        let out = self::out(out, "out")?;
        // SAFETY: `out` is non-NULL and points to writable storage for a pointer (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let etcd = string(etcd_endpoints, "etcd_endpoints")?;
        let opt = |p: *const c_char, what: &str| -> Result<Option<&str>, Fail> {
            if p.is_null() { Ok(None) } else { string(p, what).map(Some) }
        };
        let (mut tls, mut user) = (None, None);
        if !options.is_null() {
            // SAFETY: non-NULL; the caller passes a valid `lbx_etcd_options` for the call (the header says so).
            let o = unsafe { &*options };
            let path = |p, what| opt(p, what).map(|s| s.map(std::path::PathBuf::from));
            let (ca, cert) = (path(o.ca_file, "options.ca_file")?, path(o.cert_file, "options.cert_file")?);
            let files = leasebox_client::TlsFiles::from_options(ca, cert, path(o.key_file, "options.key_file")?);
            tls = files.map_err(|e| invalid(c_names(&e)))?;
            user = match (opt(o.user, "options.user")?, opt(o.password, "options.password")?) {
                (None, None) => None,
                (Some(name), Some(password)) if !name.is_empty() && !password.is_empty() => {
                    Some(leasebox_client::EtcdUser { name: name.into(), password: password.into() })
                }
                _ => return Err(invalid("options.user and options.password go together, neither empty")),
            };
        }
        let (name, key) = (string(name, "name")?, string(key_hex, "key_hex")?);
        let timeout = (timeout_ms != 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
        let cfg = FleetConfig::software(&[etcd.to_string()], tls, name, key, timeout);
        let mut cfg = cfg.map_err(|e| invalid(c_names(&e)))?;
        cfg.etcd_user = user;
        let c = Client::connect_fleet(cfg)?;
        let h = Box::into_raw(Box::new(lbx_client::new(c)));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// Frees the leases the client still tracks, says BYE, ends its threads and destroys the handle (NULL:
/// nothing). Free lease handles first: afterwards their calls fail with `LBX_ERR_CLOSED`.
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
        drop(h.inner.take());
        Ok(())
    })
}

/// The bytes the tenant may still take on appliance `appliance` (its index in the list) into `*bytes`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_free_bytes(client: *const lbx_client, appliance: u32, bytes: *mut u64) -> i32 {
    entry("lbx_client_free_bytes", || {
        let c = self::client(client)?;
        let p = out(bytes, "bytes")?;
        let n = c.free_bytes(appliance as usize)?;
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { p.write(n) };
        Ok(())
    })
}

/// Waits up to `wait_ms` for the next event; `event->kind` is `LBX_EVENT_NONE` when none came.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_next_event(client: *const lbx_client, wait_ms: u32, event: *mut lbx_event) -> i32 {
    entry("lbx_client_next_event", || {
        let c = self::client(client)?;
        let p = out(event, "event")?;
        let mut e = lbx_event {
            kind: LBX_EVENT_NONE,
            appliance: 0,
            lease: lbx_lease_ident::default(),
            session_id: 0,
            in_ms: 0,
            outcome: 0,
        };
        let list = c.appliances();
        let index = |a: &str| list.iter().position(|x| x == a).unwrap_or(0) as u32;
        match c.recv_event(Duration::from_millis(u64::from(wait_ms))) {
            None => {}
            Some(Event::Revoked { appliance, lease, outcome }) => {
                e = lbx_event {
                    kind: LBX_EVENT_REVOKED,
                    appliance: index(&appliance),
                    lease: lease.into(),
                    outcome: outcome as u32,
                    ..e
                }
            }
            Some(Event::Expiring { appliance, lease, in_ms }) => {
                e = lbx_event {
                    kind: LBX_EVENT_EXPIRING,
                    appliance: index(&appliance),
                    lease: lease.into(),
                    in_ms,
                    ..e
                }
            }
            Some(Event::Fenced { appliance, lease }) => {
                e = lbx_event { kind: LBX_EVENT_FENCED, appliance: index(&appliance), lease: lease.into(), ..e }
            }
            Some(Event::Draining { appliance, in_ms }) => {
                e = lbx_event { kind: LBX_EVENT_DRAINING, appliance: index(&appliance), in_ms, ..e }
            }
            Some(Event::Reconnected { appliance, session_id }) => {
                e = lbx_event { kind: LBX_EVENT_RECONNECTED, appliance: index(&appliance), session_id, ..e }
            }
            Some(Event::Disconnected { appliance, reason }) => {
                e = lbx_event { kind: LBX_EVENT_DISCONNECTED, appliance: index(&appliance), ..e };
                // SAFETY: non-NULL, writable (the caller's contract).
                unsafe { p.write(e) };
                set_last_error(&reason);
                return Ok(());
            }
        }
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { p.write(e) };
        Ok(())
    })
}

/// `lbx_client_revoke_with`'s order: the memory key first (the appliance's default: the lease's next RDMA
/// request is refused at once).
pub const LBX_REVOKE_MKEY_FIRST: i32 = 0;
/// `lbx_client_revoke_with`'s order: the lease's QP to the error state first (the admin's alone; a tenant
/// asking for it gets `LBX_ERR_SERVER`, FORBIDDEN).
pub const LBX_REVOKE_QP_FIRST: i32 = 1;

/// REVOKE lease `*lease_id` on appliance `appliance` (the operator's command: admin clients, or the lease's own
/// tenant), memory key first; as `lbx_client_revoke_with(client, appliance, lease_id, LBX_REVOKE_MKEY_FIRST,
/// NULL)`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_revoke(
    client: *const lbx_client,
    appliance: u32,
    lease_id: *const lbx_lease_ident,
) -> i32 {
    revoke("lbx_client_revoke", client, appliance, lease_id, LBX_REVOKE_MKEY_FIRST, std::ptr::null_mut())
}

/// REVOKE lease `*lease_id` on appliance `appliance` in teardown order `order` (`LBX_REVOKE_MKEY_FIRST` or
/// `LBX_REVOKE_QP_FIRST`); the appliance's answer goes to `*outcome` (`LBX_OUTCOME_*`; `outcome` may be NULL).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_revoke_with(
    client: *const lbx_client,
    appliance: u32,
    lease_id: *const lbx_lease_ident,
    order: i32,
    outcome: *mut u32,
) -> i32 {
    revoke("lbx_client_revoke_with", client, appliance, lease_id, order, outcome)
}

fn revoke(
    what: &str,
    client: *const lbx_client,
    appliance: u32,
    lease_id: *const lbx_lease_ident,
    order: i32,
    outcome: *mut u32,
) -> i32 {
    entry(what, || {
        let c = self::client(client)?;
        if lease_id.is_null() {
            return Err(invalid("lease_id is NULL"));
        }
        let qp_first = match order {
            LBX_REVOKE_MKEY_FIRST => false,
            LBX_REVOKE_QP_FIRST => true,
            o => return Err(invalid(format!("order {o} (LBX_REVOKE_MKEY_FIRST or LBX_REVOKE_QP_FIRST)"))),
        };
        // SAFETY: non-NULL, points to an lbx_lease_ident (the caller's contract); read by value.
        let id = unsafe { lease_id.read() };
        match c.call(appliance as usize, Request::Revoke { lease: id.into(), qp_first })? {
            Response::Revoke { outcome: o, .. } => {
                if !outcome.is_null() {
                    // SAFETY: non-NULL, writable (the caller's contract).
                    unsafe { outcome.write(o as u32) };
                }
                Ok(())
            }
            other => Err(invalid(format!("REVOKE answered {other:?}"))),
        }
    })
}

/// Allocates a lease of at least `size` bytes, ready for RDMA, on the appliance with the most free bytes.
/// `ttl_ms`: its lifetime (0: the appliance's default; the client renews it). Prefer few large leases (each
/// costs the appliance a queue pair) and place blocks inside them.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_alloc(client: *const lbx_client, size: u64, ttl_ms: u32, out: *mut *mut lbx_lease) -> i32 {
    entry("lbx_alloc", || {
        let out = self::out(out, "out")?;
        // SAFETY: non-NULL, writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let l = self::client(client)?.alloc(size, AllocOptions { ttl_ms, prefer: None })?;
        let h = lbx_lease { tag: LEASE_TAG, id: l.id().into(), size: l.size(), inner: Mutex::new(Some(l)) };
        let h = Box::into_raw(Box::new(h));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// The lease's id; all zero for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_id(lease: *const lbx_lease) -> lbx_lease_ident {
    catch_unwind(|| lease_handle(lease).map_or(lbx_lease_ident::default(), |h| h.id)).unwrap_or_default()
}

/// The lease's size in bytes, 0 for an invalid handle.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_size(lease: *const lbx_lease) -> u64 {
    catch_unwind(|| lease_handle(lease).map_or(0, |h| h.size)).unwrap_or(0)
}

fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes `len` readable bytes that stay valid for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

fn bytes_mut<'a>(p: *mut u8, len: usize, what: &str) -> Result<&'a mut [u8], Fail> {
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
    entry("lbx_lease_write", || {
        let data = bytes(data, len, "data")?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").write(offset, data)?)
    })
}

/// Reads `len` bytes at `offset` into `buf`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_read(lease: *const lbx_lease, offset: u64, buf: *mut u8, len: usize) -> i32 {
    entry("lbx_lease_read", || {
        let buf = bytes_mut(buf, len, "buf")?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").read(offset, buf)?)
    })
}

fn iovs<'a>(iov: *const lbx_iov, n: usize) -> Result<&'a [lbx_iov], Fail> {
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
        let ops = iovs(iov, n)?
            .iter()
            .map(|v| Ok((v.offset, bytes(v.buf, v.len, "iov[].buf")?)))
            .collect::<Result<Vec<_>, Fail>>()?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").write_many(&ops)?)
    })
}

/// `n` reads (lease at `iov[i].offset` → `iov[i].buf`), pipelined. The buffers must not overlap.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_read_batch(lease: *const lbx_lease, iov: *const lbx_iov, n: usize) -> i32 {
    entry("lbx_lease_read_batch", || {
        let mut ops = iovs(iov, n)?
            .iter()
            .map(|v| Ok((v.offset, bytes_mut(v.buf, v.len, "iov[].buf")?)))
            .collect::<Result<Vec<_>, Fail>>()?;
        let mut g = lease_guard(lease)?;
        Ok(g.as_mut().expect("checked by lease_guard").read_many(&mut ops)?)
    })
}

/// FREEs the lease at the appliance and destroys the handle, whatever the status (NULL: nothing). A revoked
/// lease answers `LBX_ERR_REVOKED` here too: its memory was already taken back.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_lease_free(lease: *mut lbx_lease) -> i32 {
    entry("lbx_lease_free", || {
        if lease.is_null() {
            return Ok(());
        }
        lease_handle(lease)?;
        // SAFETY: checked live above; the handle came from `Box::into_raw` in `lbx_alloc`, and the caller gives it
        // up with this call.
        let mut h = unsafe { Box::from_raw(lease) };
        h.tag = DEAD_TAG;
        let l = h.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        match l {
            Some(l) => l.free().map(drop).map_err(Fail::Client),
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
        assert_eq!(lbx_client_free_bytes(std::ptr::null(), 0, std::ptr::null_mut()), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("client handle is NULL"), "{}", last());
        assert_eq!(lbx_lease_write(std::ptr::null(), 0, std::ptr::null(), 0), LBX_ERR_INVALID_ARGUMENT);
        assert_eq!(lbx_alloc(std::ptr::null(), 4096, 0, std::ptr::null_mut()), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("out is NULL"), "{}", last());
        assert_eq!(lbx_lease_id(std::ptr::null()), lbx_lease_ident::default());
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
        let r = lbx_client_connect(
            c" , ".as_ptr(),
            c"demo".as_ptr(),
            c"8f3a1c9e5b7d2f4061a8c3e9d7b5f1a2".as_ptr(),
            std::ptr::null(),
            0,
            &mut c,
        );
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        let r = lbx_client_connect(
            c"127.0.0.1:1".as_ptr(),
            c"demo".as_ptr(),
            c"8f3a1c9e5b7d2f4061a8c3e9d7b5f1a2".as_ptr(),
            c"nope".as_ptr(),
            0,
            &mut c,
        );
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("rdma_peer 'nope'"), "{}", last());
        let r = lbx_client_connect(
            c"a:1,b:2,c:3".as_ptr(),
            c"demo".as_ptr(),
            c"8f3a1c9e5b7d2f4061a8c3e9d7b5f1a2".as_ptr(),
            c"127.0.0.1:1,127.0.0.1:2".as_ptr(),
            0,
            &mut c,
        );
        assert_eq!(r, LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("2 rdma peers for 3 appliances"), "{}", last());
    }

    #[test]
    fn a_handle_of_the_wrong_type_is_refused() {
        let fake = lbx_lease { tag: DEAD_TAG, id: lbx_lease_ident::default(), size: 0, inner: Mutex::new(None) };
        assert_eq!(lbx_lease_read(&fake, 0, std::ptr::null_mut(), 0), LBX_ERR_INVALID_ARGUMENT);
        assert!(last().contains("not a live lbx_lease"), "{}", last());
        let fake = lbx_client { tag: LEASE_TAG, inner: None, pending: Mutex::new(HashMap::new()) };
        assert_eq!(lbx_client_revoke(&fake, 0, &lbx_lease_ident::default()), LBX_ERR_INVALID_ARGUMENT);
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
