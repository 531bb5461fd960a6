//! The key-value store's C ABI (`lbx_store_*`; docs/kv.md): `leasebox_client::Store` behind an opaque handle.
//!
//! Per-item results follow Mooncake Store's convention as the Rust and Python stores do: an `int64_t` `>= 0` is
//! success (bytes for reads), a negative one an `LBX_KV_*` code. The calls that can fail as a whole (a NULL
//! handle, a bad argument) return an `int32_t` `LBX_*` status and set `lbx_last_error()`; the per-item calls
//! return `LBX_KV_FAILED` for those and set it too. No panic crosses the boundary.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use leasebox_client::store::{self as kv, BatchTicket, GetItem, PutItem};
use leasebox_client::{Store, StoreOptions};

use crate::data_path::{lbx_region, region, region_handle};
use crate::{Fail, LBX_ERR_INVALID_ARGUMENT, entry, invalid, out, string};

/// Success (a put, a remove); a read's success is its byte count.
pub const LBX_KV_OK: i64 = 0;
/// The key is not there (never put, removed, evicted, or lost with its lease).
pub const LBX_KV_NOT_FOUND: i64 = -1;
/// The key's lease was revoked while the transfer ran.
pub const LBX_KV_REVOKED: i64 = -2;
/// Larger than the store's largest value, or than the caller's buffer.
pub const LBX_KV_TOO_LARGE: i64 = -3;
/// No room.
pub const LBX_KV_NO_SPACE: i64 = -4;
/// The transfer did not finish in time.
pub const LBX_KV_TIMEOUT: i64 = -5;
/// Anything else (a bad argument, a range outside the region; `lbx_last_error()` says more for arguments).
pub const LBX_KV_FAILED: i64 = -6;

const _: () = assert!(LBX_KV_OK == kv::OK);
const _: () = assert!(LBX_KV_NOT_FOUND == kv::NOT_FOUND);
const _: () = assert!(LBX_KV_REVOKED == kv::REVOKED);
const _: () = assert!(LBX_KV_TOO_LARGE == kv::TOO_LARGE);
const _: () = assert!(LBX_KV_NO_SPACE == kv::NO_SPACE);
const _: () = assert!(LBX_KV_TIMEOUT == kv::TIMEOUT);
const _: () = assert!(LBX_KV_FAILED == kv::FAILED);

const STORE_TAG: u64 = 0x6c62_785f_7374_6f72; // "lbx_stor"

/// A key-value store (opaque), from `lbx_store_open`.
pub struct lbx_store {
    tag: u64,
    store: Store,
    /// Batches `lbx_store_poll` took, until `lbx_store_wait` hands out their results.
    done: Mutex<HashMap<u64, Vec<i64>>>,
}

/// One item of a batch: the key (`key`, `key_len` bytes), and `len` bytes at `offset` in `region` (a put's
/// value; a get's room, at most `len` bytes).
#[repr(C)]
pub struct lbx_kv_item {
    pub key: *const u8,
    pub key_len: usize,
    pub region: *const lbx_region,
    pub offset: usize,
    pub len: usize,
}

/// The store's counters (`lbx_store_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lbx_kv_stats {
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub put_failures: u64,
    pub get_failures: u64,
    pub evictions: u64,
    pub lost_by_revoke: u64,
    pub migrated: u64,
    pub removes: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub keys: u64,
    pub bytes_stored: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub leases: u64,
}

fn store<'a>(s: *const lbx_store) -> Result<&'a lbx_store, Fail> {
    if s.is_null() {
        return Err(invalid("store is NULL"));
    }
    // SAFETY: non-NULL; the caller passes a handle from `lbx_store_open` not yet closed. A stale pointer is caught
    // by the tag as far as its memory still reads.
    let h = unsafe { &*s };
    if h.tag != STORE_TAG {
        return Err(invalid("store is not a live lbx_store handle"));
    }
    Ok(h)
}

fn key<'a>(p: *const u8, len: usize) -> Result<&'a [u8], Fail> {
    if p.is_null() && len > 0 {
        return Err(invalid("key is NULL"));
    }
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-NULL and `len` readable bytes (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

fn items<'a>(p: *const lbx_kv_item, n: usize) -> Result<&'a [lbx_kv_item], Fail> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid("items is NULL"));
    }
    // SAFETY: non-NULL and `n` items (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A per-item call: its value, or `LBX_KV_FAILED` (and the last error) when the arguments or the handle were bad.
fn per_item(what: &str, f: impl FnOnce() -> Result<i64, Fail>) -> i64 {
    let mut v = LBX_KV_FAILED;
    let status = entry(what, || {
        v = f()?;
        Ok(())
    });
    if status != crate::LBX_OK { LBX_KV_FAILED } else { v }
}

fn opt<T: PartialEq + Default>(v: T) -> Option<T> {
    if v == T::default() { None } else { Some(v) }
}

/// Opens a store (docs/kv.md): `url` `leasebox://TENANT@HOST:PORT[,...][?rdma=ADDR:PORT&requester=SPEC]` or
/// `leasebox+etcd://HOST:PORT[,...]?tenant=TENANT` (NULL: `LEASEBOX_URL`); the tenant's key is read (hex) from
/// `key_file` (NULL: `LEASEBOX_KEY_FILE`). Each number 0 (and `migrate_on_drain` < 0) takes its `LEASEBOX_*`
/// variable, else the default (max_value_size 1 MiB, lease_size 64 MiB, leases 2, no migration, 5000 ms).
/// On success `*out` is a handle for `lbx_store_close`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn lbx_store_open(
    url: *const c_char,
    key_file: *const c_char,
    max_value_size: u64,
    lease_size: u64,
    leases: u32,
    migrate_on_drain: c_int,
    timeout_ms: u32,
    out: *mut *mut lbx_store,
) -> i32 {
    entry("lbx_store_open", || {
        let out = self::out(out, "out")?;
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let url = if url.is_null() { None } else { Some(string(url, "url")?.to_string()) };
        let key_file = if key_file.is_null() { None } else { Some(PathBuf::from(string(key_file, "key_file")?)) };
        let opts = StoreOptions {
            url,
            key_file,
            max_value_size: opt(max_value_size),
            lease_size: opt(lease_size),
            leases: opt(leases as usize),
            migrate_on_drain: (migrate_on_drain >= 0).then_some(migrate_on_drain > 0),
            requester: None,
            timeout: opt(timeout_ms).map(|t| Duration::from_millis(t.into())),
            env: true,
        };
        let cfg = opts.resolve(|n| std::env::var(n).ok()).map_err(Fail::Invalid)?;
        let s = Store::open(cfg)?;
        let h = Box::into_raw(Box::new(lbx_store { tag: STORE_TAG, store: s, done: Mutex::new(HashMap::new()) }));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

/// Frees the store's leases and the handle. Regions from `lbx_store_register` are freed with
/// `lbx_region_free` (before this call).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_close(s: *mut lbx_store) -> i32 {
    entry("lbx_store_close", || {
        store(s)?;
        // SAFETY: a live handle from `lbx_store_open` (checked by its tag); it is not used after this.
        let mut h = unsafe { Box::from_raw(s) };
        h.tag = crate::DEAD_TAG;
        h.store.close();
        Ok(())
    })
}

/// Registers `len` bytes at `addr` for the zero-copy calls (as `lbx_register`; free with `lbx_region_free`).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_register(
    s: *const lbx_store,
    addr: *mut c_void,
    len: usize,
    out: *mut *mut lbx_region,
) -> i32 {
    entry("lbx_store_register", || {
        let out = self::out(out, "out")?;
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let h = store(s)?;
        if addr.is_null() || len == 0 {
            return Err(invalid("a region needs a non-NULL address and at least one byte"));
        }
        // SAFETY: `lbx_register`'s contract, stated in the header for this call too.
        #[allow(unsafe_code)]
        let r = unsafe { h.store.register_raw(addr.cast::<u8>(), len) }?;
        // SAFETY: as above.
        unsafe { out.write(region_handle(r)) };
        Ok(())
    })
}

/// Stores `len` bytes at `value` (copied) under the key: `LBX_KV_OK` or a negative code.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_put(
    s: *const lbx_store,
    k: *const u8,
    key_len: usize,
    value: *const u8,
    len: usize,
) -> i64 {
    per_item("lbx_store_put", || {
        let h = store(s)?;
        let v = crate::bytes(value, len, "value")?;
        Ok(h.store.put(key(k, key_len)?, v))
    })
}

/// Copies the key's value into `buf` (at most `cap` bytes): its length, or a negative code (`LBX_KV_NOT_FOUND`
/// on a miss or when its lease was revoked, `LBX_KV_TOO_LARGE` when it does not fit; nothing is written then).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_get(s: *const lbx_store, k: *const u8, key_len: usize, buf: *mut u8, cap: usize) -> i64 {
    per_item("lbx_store_get", || {
        let h = store(s)?;
        let out = crate::bytes_mut(buf, cap, "buf")?;
        Ok(match h.store.get(key(k, key_len)?) {
            Ok(None) => LBX_KV_NOT_FOUND,
            Ok(Some(v)) if v.len() > out.len() => LBX_KV_TOO_LARGE,
            Ok(Some(v)) => {
                out[..v.len()].copy_from_slice(&v);
                v.len() as i64
            }
            Err(code) => code,
        })
    })
}

/// Zero copy: stores `len` bytes at `offset` in `region` under the key.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_put_from(
    s: *const lbx_store,
    k: *const u8,
    key_len: usize,
    r: *const lbx_region,
    offset: usize,
    len: usize,
) -> i64 {
    per_item("lbx_store_put_from", || Ok(store(s)?.store.put_from(key(k, key_len)?, region(r, "region")?, offset, len)))
}

/// Zero copy: reads the key's value into `region` at `offset` (at most `cap` bytes): its length or a code.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_get_into(
    s: *const lbx_store,
    k: *const u8,
    key_len: usize,
    r: *const lbx_region,
    offset: usize,
    cap: usize,
) -> i64 {
    per_item("lbx_store_get_into", || Ok(store(s)?.store.get_into(key(k, key_len)?, region(r, "region")?, offset, cap)))
}

/// 1 when the key is stored, 0 when not.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_is_exist(s: *const lbx_store, k: *const u8, key_len: usize) -> i64 {
    per_item("lbx_store_is_exist", || Ok(store(s)?.store.is_exist(key(k, key_len)?)))
}

/// `LBX_KV_OK`, or `LBX_KV_NOT_FOUND`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_remove(s: *const lbx_store, k: *const u8, key_len: usize) -> i64 {
    per_item("lbx_store_remove", || Ok(store(s)?.store.remove(key(k, key_len)?)))
}

type Parsed<'a> = Vec<(&'a [u8], &'a leasebox_client::Region<'static>, usize, usize)>;

fn parse<'a>(p: *const lbx_kv_item, n: usize) -> Result<Parsed<'a>, Fail> {
    items(p, n)?
        .iter()
        .enumerate()
        .map(|(i, it)| {
            let k = key(it.key, it.key_len).map_err(|_| invalid(format!("item {i}: key is NULL")))?;
            let r = region(it.region, &format!("item {i}: region"))?;
            Ok((k, r, it.offset, it.len))
        })
        .collect()
}

fn results_out<'a>(p: *mut i64, n: usize) -> Result<&'a mut [i64], Fail> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(invalid("results is NULL"));
    }
    // SAFETY: non-NULL and room for `n` results (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// Puts `n` items (zero copy); `results[i]` is item i's result. `LBX_OK` unless the arguments were bad (then
/// nothing was started).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_batch_put_from(
    s: *const lbx_store,
    items: *const lbx_kv_item,
    n: usize,
    results: *mut i64,
) -> i32 {
    entry("lbx_store_batch_put_from", || {
        let h = store(s)?;
        let (parsed, out) = (parse(items, n)?, results_out(results, n)?);
        let its: Vec<PutItem<'_>> =
            parsed.iter().map(|(k, r, o, l)| PutItem { key: k, region: r, offset: *o, len: *l }).collect();
        out.copy_from_slice(&h.store.batch_put_from(&its));
        Ok(())
    })
}

/// Gets `n` items (zero copy, `len` the room of each); `results[i]` is item i's length or code.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_batch_get_into(
    s: *const lbx_store,
    items: *const lbx_kv_item,
    n: usize,
    results: *mut i64,
) -> i32 {
    entry("lbx_store_batch_get_into", || {
        let h = store(s)?;
        let (parsed, out) = (parse(items, n)?, results_out(results, n)?);
        let its: Vec<GetItem<'_>> =
            parsed.iter().map(|(k, r, o, l)| GetItem { key: k, region: r, offset: *o, capacity: *l }).collect();
        out.copy_from_slice(&h.store.batch_get_into(&its));
        Ok(())
    })
}

/// Starts a put batch without waiting; `*ticket` names it for `lbx_store_poll` / `lbx_store_wait`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_submit_batch_put_from(
    s: *const lbx_store,
    items: *const lbx_kv_item,
    n: usize,
    ticket: *mut u64,
) -> i32 {
    entry("lbx_store_submit_batch_put_from", || {
        let h = store(s)?;
        let t = out(ticket, "ticket")?;
        let parsed = parse(items, n)?;
        let its: Vec<PutItem<'_>> =
            parsed.iter().map(|(k, r, o, l)| PutItem { key: k, region: r, offset: *o, len: *l }).collect();
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { t.write(h.store.submit_batch_put_from(&its).0) };
        Ok(())
    })
}

/// Starts a get batch without waiting.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_submit_batch_get_into(
    s: *const lbx_store,
    items: *const lbx_kv_item,
    n: usize,
    ticket: *mut u64,
) -> i32 {
    entry("lbx_store_submit_batch_get_into", || {
        let h = store(s)?;
        let t = out(ticket, "ticket")?;
        let parsed = parse(items, n)?;
        let its: Vec<GetItem<'_>> =
            parsed.iter().map(|(k, r, o, l)| GetItem { key: k, region: r, offset: *o, capacity: *l }).collect();
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { t.write(h.store.submit_batch_get_into(&its).0) };
        Ok(())
    })
}

/// Up to `max` finished batches' tickets into `tickets`, `*count` of them, without waiting; their results are
/// then taken with `lbx_store_wait` (at once).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_poll(s: *const lbx_store, tickets: *mut u64, max: usize, count: *mut usize) -> i32 {
    entry("lbx_store_poll", || {
        let h = store(s)?;
        let count = out(count, "count")?;
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { count.write(0) };
        if max > 0 && tickets.is_null() {
            return Err(invalid("tickets is NULL"));
        }
        let got = h.store.poll(max);
        let mut done = h.done.lock().unwrap_or_else(|p| p.into_inner());
        for (i, (t, r)) in got.into_iter().enumerate() {
            // SAFETY: `i < max` (poll gives at most `max`); room for `max` tickets (the caller's contract).
            unsafe { tickets.add(i).write(t.0) };
            done.insert(t.0, r);
            // SAFETY: as above.
            unsafe { count.write(i + 1) };
        }
        Ok(())
    })
}

/// Waits up to `timeout_ms` for batch `ticket`; its `n` results (as many as it had items) into `results`.
/// `LBX_ERR_TIMEOUT` when it is not done (it stays pending), `LBX_ERR_INVALID_ARGUMENT` for an unknown ticket or
/// a wrong `n`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_wait(
    s: *const lbx_store,
    ticket: u64,
    timeout_ms: u32,
    results: *mut i64,
    n: usize,
) -> i32 {
    entry("lbx_store_wait", || {
        let h = store(s)?;
        let out = results_out(results, n)?;
        let taken = h.done.lock().unwrap_or_else(|p| p.into_inner()).remove(&ticket);
        let r = match taken {
            Some(r) => r,
            None => h.store.wait(BatchTicket(ticket), Duration::from_millis(timeout_ms.into()))?,
        };
        if r.len() != n {
            return Err(invalid(format!("the batch has {} items, not {n} (its results are gone)", r.len())));
        }
        out.copy_from_slice(&r);
        Ok(())
    })
}

/// A descriptor readable when `lbx_store_poll` may have something; -1 for a bad handle. Do not read or close it.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_fileno(s: *const lbx_store) -> c_int {
    let mut fd = -1;
    let _ = entry("lbx_store_fileno", || {
        fd = store(s)?.store.fileno();
        Ok(())
    });
    fd
}

/// The counters now, into `*out`.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_stats(s: *const lbx_store, out: *mut lbx_kv_stats) -> i32 {
    entry("lbx_store_stats", || {
        let h = store(s)?;
        let o = self::out(out, "out")?;
        let st = h.store.stats();
        let v = lbx_kv_stats {
            hits: st.hits,
            misses: st.misses,
            puts: st.puts,
            put_failures: st.put_failures,
            get_failures: st.get_failures,
            evictions: st.evictions,
            lost_by_revoke: st.lost_by_revoke,
            migrated: st.migrated,
            removes: st.removes,
            bytes_written: st.bytes_written,
            bytes_read: st.bytes_read,
            keys: st.keys,
            bytes_stored: st.bytes_stored,
            capacity_bytes: st.capacity_bytes,
            free_bytes: st.free_bytes,
            leases: st.leases,
        };
        // SAFETY: non-NULL and writable (the caller's contract).
        unsafe { o.write(v) };
        Ok(())
    })
}

/// The figures as Prometheus text, NUL-terminated, into `buf` (`cap` bytes). `*needed` (if not NULL) is the
/// text's length plus its NUL. `LBX_ERR_INVALID_ARGUMENT` when `cap` is too small (nothing written but a NUL when
/// `cap` > 0): call again with `*needed` bytes.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_stats_prometheus(
    s: *const lbx_store,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> i32 {
    entry("lbx_store_stats_prometheus", || {
        let h = store(s)?;
        let text = h.store.stats_prometheus();
        let need = text.len() + 1;
        if !needed.is_null() {
            // SAFETY: non-NULL and writable (the caller's contract).
            unsafe { needed.write(need) };
        }
        if buf.is_null() && cap > 0 {
            return Err(invalid("buf is NULL"));
        }
        if cap < need {
            if cap > 0 {
                // SAFETY: `buf` has room for `cap` >= 1 bytes (the caller's contract).
                unsafe { buf.write(0) };
            }
            return Err(Fail::Status(
                LBX_ERR_INVALID_ARGUMENT,
                format!("the text needs {need} bytes, the buffer has {cap}"),
            ));
        }
        // SAFETY: room for `need` bytes (checked against `cap`), which do not overlap the text (ours).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            buf.add(text.len()).write(0);
        }
        Ok(())
    })
}

/// The number of events the store queued (keys lost, drains, migrations) since the last call, which drops them;
/// `*lost_keys` (if not NULL) is the number of keys lost among them. Their details are in the store's log.
#[unsafe(no_mangle)]
pub extern "C" fn lbx_store_take_events(s: *const lbx_store, lost_keys: *mut u64) -> i64 {
    per_item("lbx_store_take_events", || {
        let h = store(s)?;
        let ev = h.store.events();
        let lost: usize =
            ev.iter().map(|e| if let kv::StoreEvent::KeysLost { count, .. } = e { *count } else { 0 }).sum();
        if !lost_keys.is_null() {
            // SAFETY: non-NULL and writable (the caller's contract).
            unsafe { lost_keys.write(lost as u64) };
        }
        Ok(ev.len() as i64)
    })
}
