//! Choosing each appliance's RDMA requester at run time (`lbx_client_connect_with`): the software RoCEv2
//! requester over UDP, or a real RDMA device through libibverbs (leasebox-client's `verbs` backend, which this
//! library is built with).
//!
//! A requester is named by a short spec, the same a program can take from its command line or environment
//! (leasebox-client's `RequesterConfig::parse` owns the grammar):
//!
//! - `soft`: the software requester toward 127.0.0.1:4791 (the hosted appliance's model, a QEMU hub port);
//! - `soft:ADDR:PORT`: the software requester toward that UDP address;
//! - `verbs:DEVICE:PORT:GID_INDEX`: an RC QP on RDMA device `DEVICE` (as `ibv_devices` lists it, e.g. `mlx5_0`,
//!   `rxe0`), its port `PORT` (usually 1), our RoCEv2 GID at `GID_INDEX` (`show_gids`; an IPv4 RoCEv2 GID).
//!
//! The device is opened when the first lease on it is allocated, so a device that is missing, or a host
//! without libibverbs, shows in `lbx_alloc`'s `LBX_ERR_RDMA` and its message.

use std::ffi::c_char;

use leasebox_client::{Client, ClientConfig, MAX_QUEUE_DEPTH, RequesterConfig};

use crate::{Fail, entry, lbx_client, out, string};

/// How `lbx_client_connect_with` connects, beyond the appliances and credentials. Every field may be 0/NULL.
#[repr(C)]
pub struct lbx_connect_options {
    /// Each appliance's RDMA requester, comma-separated: one for every appliance, or one per appliance in the
    /// same order. Each is `soft`, `soft:ADDR:PORT` or `verbs:DEVICE:PORT:GID_INDEX`. NULL: `soft`.
    pub requesters: *const c_char,
    /// The deadline of one answer, of connecting, and of one RDMA operation (0: the defaults).
    pub timeout_ms: u32,
    /// Work requests each lease keeps posted at most (0: 64; at most 4096); `lbx_lease_set_queue_depth` changes
    /// one lease's.
    pub queue_depth: u32,
}

/// Builds the configuration of `lbx_client_connect_with`'s arguments: `requesters` as
/// [`lbx_connect_options::requesters`] (`None`: `soft`), `queue_depth` 0 for the default.
pub fn config_with(
    appliances: &str,
    name: &str,
    key_hex: &str,
    requesters: Option<&str>,
    timeout_ms: u32,
    queue_depth: u32,
) -> Result<ClientConfig, String> {
    let mut cfg = crate::config(appliances, name, key_hex, None, timeout_ms)?;
    if queue_depth != 0 {
        let depth = queue_depth as usize;
        if depth > MAX_QUEUE_DEPTH {
            return Err(format!("queue_depth {depth} is more than {MAX_QUEUE_DEPTH}"));
        }
        cfg.queue_depth = depth;
    }
    let specs: Vec<&str> = requesters.unwrap_or("soft").split(',').collect();
    let n = cfg.appliances.len();
    if specs.len() != 1 && specs.len() != n {
        return Err(format!("{} requesters for {n} appliances (give one, or one per appliance)", specs.len()));
    }
    for (i, a) in cfg.appliances.iter_mut().enumerate() {
        a.requester = RequesterConfig::parse(specs[i.min(specs.len() - 1)], cfg.queue_depth)?;
    }
    Ok(cfg)
}

/// Connects and authenticates to every appliance, as `lbx_client_connect`, with each appliance's RDMA
/// requester chosen by `options->requesters` (software or verbs) and the queue depth and timeout of `options`
/// (NULL: all defaults, the software requester toward 127.0.0.1:4791).
#[unsafe(no_mangle)]
pub extern "C" fn lbx_client_connect_with(
    appliances: *const c_char,
    name: *const c_char,
    key_hex: *const c_char,
    options: *const lbx_connect_options,
    out: *mut *mut lbx_client,
) -> i32 {
    entry("lbx_client_connect_with", || {
        let out = self::out(out, "out")?;
        // SAFETY: `out` is non-NULL and points to writable storage for a pointer (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let list = string(appliances, "appliances")?;
        let (name, key) = (string(name, "name")?, string(key_hex, "key_hex")?);
        let (mut requesters, mut timeout_ms, mut depth) = (None, 0, 0);
        if !options.is_null() {
            // SAFETY: non-NULL; the caller passes a valid `lbx_connect_options` for the call.
            let o = unsafe { &*options };
            if !o.requesters.is_null() {
                requesters = Some(string(o.requesters, "options.requesters")?);
            }
            (timeout_ms, depth) = (o.timeout_ms, o.queue_depth);
        }
        let cfg = config_with(list, name, key, requesters, timeout_ms, depth).map_err(Fail::Invalid)?;
        let c = Client::connect(cfg)?;
        let h = Box::into_raw(Box::new(lbx_client::new(c)));
        // SAFETY: as above.
        unsafe { out.write(h) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_requester_for_all_or_one_each() {
        let key = "000102030405060708090a0b0c0d0e0f";
        let c = config_with("a:1,b:2", "demo", key, Some("soft:1.2.3.4:5,verbs:mlx5_0:1:0"), 0, 8).unwrap();
        assert_eq!(c.queue_depth, 8);
        assert!(matches!(&c.appliances[0].requester, RequesterConfig::Soft(s) if s.peer.to_string() == "1.2.3.4:5"));
        assert!(
            matches!(&c.appliances[1].requester, RequesterConfig::Verbs(v) if v.device == "mlx5_0" && v.depth == 8)
        );
        let c = config_with("a:1,b:2", "demo", key, None, 0, 0).unwrap();
        assert_eq!(c.queue_depth, leasebox_client::DEFAULT_QUEUE_DEPTH);
        assert!(c.appliances.iter().all(|a| matches!(a.requester, RequesterConfig::Soft(_))));
        let e = config_with("a:1,b:2,c:3", "demo", key, Some("soft,soft"), 0, 0).unwrap_err();
        assert!(e.contains("2 requesters for 3 appliances"), "{e}");
        let e = config_with("a:1", "demo", key, None, 0, 5000).unwrap_err();
        assert!(e.contains("queue_depth 5000"), "{e}");
    }

    #[test]
    fn connect_with_refuses_a_bad_spec_before_connecting() {
        let mut c: *mut lbx_client = std::ptr::null_mut();
        let o = lbx_connect_options { requesters: c"verbs:rxe0:1".as_ptr(), timeout_ms: 0, queue_depth: 0 };
        let r = lbx_client_connect_with(
            c"127.0.0.1:1".as_ptr(),
            c"demo".as_ptr(),
            c"8f3a1c9e5b7d2f4061a8c3e9d7b5f1a2".as_ptr(),
            &o,
            &mut c,
        );
        assert_eq!(r, crate::LBX_ERR_INVALID_ARGUMENT);
        assert!(c.is_null());
        // SAFETY: a NUL-terminated string valid until the next call on this thread.
        let m = unsafe { std::ffi::CStr::from_ptr(crate::lbx_last_error()) }.to_string_lossy().into_owned();
        assert!(m.contains("requester 'verbs:rxe0:1'"), "{m}");
    }
}
