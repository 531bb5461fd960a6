//! The reference responder's verbs (feature `verbs`): rdma-core's libibverbs through the `rdma-sys` bindings,
//! on one device and port. One context and one CQ for the device; per lease a page-aligned zeroed buffer, its
//! own PD (a QP left in RTS by an MKEY-first revoke reaches no other lease's memory), an MR over the buffer and
//! an RC QP that only responds.
//!
//! Written for this responder alone, not shared with leasectl's requester (`app/client/src/rdma/verbs.rs`):
//! the two sides of the data path stay independent. Every unsafe call is to libibverbs on objects this module
//! created and still owns; each says why it is sound. A buffer is freed only after its MR is deregistered and
//! its QP destroyed; a region that could not be torn down is kept, buffer and all, until the process exits.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_void};

use leasebox_proto::{ErrorBody, ErrorCode, access};
use rdma_sys::*;

use super::{Built, Device, Peer, PortInfo, Region};

/// The QP attributes a responder sets that leasectl does not send: as a Linux responder is commonly set up (the
/// appliance's lease QPs use the same values, `app/lease/src/service/plan.rs`).
const MAX_DEST_RD_ATOMIC: u8 = 16;
const MIN_RNR_TIMER: u8 = 12;
const TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;
const RNR_RETRY: u8 = 7;
const HOP_LIMIT: u8 = 64;
const PAGE: usize = 4096;
/// The device's one CQ: lease QPs never post, so it stays empty; a few entries satisfy the provider.
const CQ_ENTRIES: i32 = 16;

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn rc_error(what: &str, rc: i32) -> String {
    format!("{what}: {}", std::io::Error::from_raw_os_error(rc))
}

/// The MAC of the netdev behind `device`'s GID `index` (sysfs `gid_attrs/ndevs/INDEX`, then the netdev's
/// `address`).
fn netdev_mac(device: &str, port: u8, index: u8) -> Result<[u8; 6], String> {
    let ndev_path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{index}");
    let ndev = std::fs::read_to_string(&ndev_path).map_err(|e| format!("{ndev_path}: {e}"))?;
    let addr_path = format!("/sys/class/net/{}/address", ndev.trim());
    let text = std::fs::read_to_string(&addr_path).map_err(|e| format!("{addr_path}: {e}"))?;
    parse_mac(text.trim()).ok_or_else(|| format!("{addr_path}: '{}' is not a MAC", text.trim()))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// A zeroed buffer whose first `len` bytes start on a page: a `Vec` one page longer, never resized (so it never
/// moves while the device may reach it).
struct PageBuf {
    bytes: Vec<u8>,
    offset: usize,
    len: usize,
}

impl PageBuf {
    fn new(len: usize) -> Option<PageBuf> {
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len.checked_add(PAGE)?).ok()?;
        bytes.resize(len + PAGE, 0);
        let offset = (PAGE - bytes.as_ptr() as usize % PAGE) % PAGE;
        Some(PageBuf { bytes, offset, len })
    }

    fn addr(&mut self) -> *mut c_void {
        self.bytes[self.offset..].as_mut_ptr() as *mut c_void
    }
}

/// One lease's objects; a null pointer is an object already gone.
struct Objects {
    pd: *mut ibv_pd,
    mr: *mut ibv_mr,
    qp: *mut ibv_qp,
    buf: PageBuf,
}

/// The device: its context, its CQ, the port's GID and MAC, and every lease's objects.
pub struct Ibv {
    ctx: *mut ibv_context,
    cq: *mut ibv_cq,
    port_num: u8,
    gid_index: u8,
    port: PortInfo,
    regions: BTreeMap<u64, Objects>,
    next_region: u64,
    /// Regions of fenced slots, kept until the process exits.
    quarantined: Vec<Objects>,
}

// SAFETY: the raw pointers are libibverbs objects owned by this struct alone; libibverbs allows using them from
// any thread, one call at a time, which `&mut self` (and the session server's lock around the backend) ensures.
unsafe impl Send for Ibv {}

impl Ibv {
    /// Opens `device` and reads port `port_num`'s GID `gid_index`, its netdev's MAC and the active MTU.
    pub fn open(device: &str, port_num: u8, gid_index: u8) -> Result<Ibv, String> {
        let mut n = 0;
        // SAFETY: libibverbs fills `n` and returns a list freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_error("ibv_get_device_list"));
        }
        let mut ctx: *mut ibv_context = std::ptr::null_mut();
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the first `n` entries of the list are valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a valid device has a NUL-terminated name that lives as long as the list.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            if name == device && ctx.is_null() {
                // SAFETY: `dev` is valid until the list is freed; an opened context outlives the list.
                ctx = unsafe { ibv_open_device(dev) };
            }
            names.push(name);
        }
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(format!("--verbs: no RDMA device '{device}' (found: {})", names.join(", ")));
        }
        let mut v = Ibv {
            ctx,
            cq: std::ptr::null_mut(),
            port_num,
            gid_index,
            port: PortInfo { gid: [0; 16], mac: [0; 6], active_mtu: 1 },
            regions: BTreeMap::new(),
            next_region: 1,
            quarantined: Vec::new(),
        };
        // SAFETY: an all-zero port attribute struct is a valid output buffer.
        let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `pattr` is a valid output buffer.
        if unsafe { ___ibv_query_port(v.ctx, port_num, &mut pattr) } != 0 {
            return Err(os_error("ibv_query_port"));
        }
        // SAFETY: an all-zero GID is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `gid` is a valid output buffer.
        if unsafe { ibv_query_gid(v.ctx, port_num, i32::from(gid_index), &mut gid) } != 0 {
            return Err(os_error(&format!("ibv_query_gid(port {port_num}, index {gid_index})")));
        }
        // SAFETY: every bit pattern of the union is a valid `raw`.
        let gid = unsafe { gid.raw };
        if gid == [0; 16] {
            return Err(format!("--verbs: {device} port {port_num} has no GID at index {gid_index}"));
        }
        let mac = netdev_mac(device, port_num, gid_index)?;
        v.port = PortInfo { gid, mac, active_mtu: (pattr.active_mtu as u8).clamp(1, 5) };
        // SAFETY: `ctx` is open; no completion channel, no vector.
        v.cq = unsafe { ibv_create_cq(v.ctx, CQ_ENTRIES, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if v.cq.is_null() {
            return Err(os_error("ibv_create_cq"));
        }
        Ok(v)
    }

    fn objects(&mut self, r: Region) -> Result<&mut Objects, String> {
        self.regions.get_mut(&r.0).ok_or_else(|| format!("no region {}", r.0))
    }

    /// PD, MR and QP for `buf`, the QP taken to RTS; on error `o` holds what exists so far.
    fn build_into(&mut self, o: &mut Objects, peer: &Peer, psn: u32) -> Result<(), ErrorBody> {
        let hca = |m: String| ErrorBody::new(ErrorCode::HcaError, &format!("ALLOC: {m}"));
        // SAFETY: `ctx` is open.
        o.pd = unsafe { ibv_alloc_pd(self.ctx) };
        if o.pd.is_null() {
            return Err(hca(os_error("ibv_alloc_pd")));
        }
        let mut remote = 0u32;
        if peer.access & access::REMOTE_READ != 0 {
            remote |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if peer.access & access::REMOTE_WRITE != 0 {
            remote |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if peer.access & access::REMOTE_ATOMIC != 0 {
            remote |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        let mr_access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 | remote;
        let addr = o.buf.addr();
        // SAFETY: `pd` is live; `addr..addr + len` lies in `o.buf`, which is not freed or moved before the MR is
        // deregistered (`release` refuses while the MR exists; a fenced region's buffer is never freed).
        o.mr = unsafe { ibv_reg_mr(o.pd, addr, o.buf.len, mr_access as i32) };
        if o.mr.is_null() {
            return Err(hca(os_error("ibv_reg_mr")));
        }
        // SAFETY: all-zero init attributes are valid; the fields used are set below.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = self.cq;
        init.recv_cq = self.cq;
        init.cap.max_send_wr = 1;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        // SAFETY: `pd` and `cq` are live; `init` is valid for the call.
        o.qp = unsafe { ibv_create_qp(o.pd, &mut init) };
        if o.qp.is_null() {
            return Err(hca(os_error("ibv_create_qp")));
        }
        let m = |f: ibv_qp_attr_mask| f.0;
        // SAFETY: all-zero attributes, then filled per transition.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.port_num;
        a.qp_access_flags = remote;
        let mask = m(ibv_qp_attr_mask::IBV_QP_STATE)
            | m(ibv_qp_attr_mask::IBV_QP_PKEY_INDEX)
            | m(ibv_qp_attr_mask::IBV_QP_PORT)
            | m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS);
        modify(o.qp, &mut a, mask, "INIT").map_err(hca)?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = u32::from(peer.mtu);
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = MAX_DEST_RD_ATOMIC;
        a.min_rnr_timer = MIN_RNR_TIMER;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = self.port_num;
        a.ah_attr.grh.dgid = ibv_gid { raw: peer.gid };
        a.ah_attr.grh.sgid_index = self.gid_index;
        a.ah_attr.grh.hop_limit = HOP_LIMIT;
        let mask = m(ibv_qp_attr_mask::IBV_QP_STATE)
            | m(ibv_qp_attr_mask::IBV_QP_AV)
            | m(ibv_qp_attr_mask::IBV_QP_PATH_MTU)
            | m(ibv_qp_attr_mask::IBV_QP_DEST_QPN)
            | m(ibv_qp_attr_mask::IBV_QP_RQ_PSN)
            | m(ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC)
            | m(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER);
        modify(o.qp, &mut a, mask, "RTR").map_err(hca)?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn;
        a.timeout = TIMEOUT;
        a.retry_cnt = RETRY_CNT;
        a.rnr_retry = RNR_RETRY;
        a.max_rd_atomic = 1;
        let mask = m(ibv_qp_attr_mask::IBV_QP_STATE)
            | m(ibv_qp_attr_mask::IBV_QP_SQ_PSN)
            | m(ibv_qp_attr_mask::IBV_QP_TIMEOUT)
            | m(ibv_qp_attr_mask::IBV_QP_RETRY_CNT)
            | m(ibv_qp_attr_mask::IBV_QP_RNR_RETRY)
            | m(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC);
        modify(o.qp, &mut a, mask, "RTS").map_err(hca)?;
        Ok(())
    }
}

fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32, what: &str) -> Result<(), String> {
    // SAFETY: callers pass a live QP of theirs; `attr` is a valid attribute struct for `mask`.
    let rc = unsafe { ibv_modify_qp(qp, attr, mask as i32) };
    if rc != 0 { Err(rc_error(&format!("ibv_modify_qp({what})"), rc)) } else { Ok(()) }
}

/// Destroys what exists of `o`, dependents first; true when everything went (the buffer may be freed).
fn destroy(o: &mut Objects) -> bool {
    if !o.qp.is_null() {
        // SAFETY: `qp` is live and destroyed once (nulled on success).
        if unsafe { ibv_destroy_qp(o.qp) } != 0 {
            return false;
        }
        o.qp = std::ptr::null_mut();
    }
    if !o.mr.is_null() {
        // SAFETY: `mr` is live and deregistered once (nulled on success).
        if unsafe { ibv_dereg_mr(o.mr) } != 0 {
            return false;
        }
        o.mr = std::ptr::null_mut();
    }
    if !o.pd.is_null() {
        // SAFETY: `pd` is live, its MR and QP are gone; deallocated once (nulled on success).
        if unsafe { ibv_dealloc_pd(o.pd) } != 0 {
            return false;
        }
        o.pd = std::ptr::null_mut();
    }
    true
}

impl Device for Ibv {
    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn build(&mut self, len: u64, peer: &Peer, psn: u32) -> Result<Built, ErrorBody> {
        let no_memory = || ErrorBody::new(ErrorCode::NoMemory, &format!("ALLOC: no memory for {len} bytes"));
        let len = usize::try_from(len).map_err(|_| no_memory())?;
        let buf = PageBuf::new(len).ok_or_else(no_memory)?;
        let mut o = Objects { pd: std::ptr::null_mut(), mr: std::ptr::null_mut(), qp: std::ptr::null_mut(), buf };
        if let Err(e) = self.build_into(&mut o, peer, psn) {
            if !destroy(&mut o) {
                log::warn!("ALLOC unwind: a verbs object could not be destroyed; its buffer is kept");
                self.quarantined.push(o);
            }
            return Err(e);
        }
        // SAFETY: `mr` and `qp` are live (built above).
        let (rkey, addr, qpn) = unsafe { ((*o.mr).rkey, (*o.mr).addr as u64, (*o.qp).qp_num) };
        let region = Region(self.next_region);
        self.next_region += 1;
        self.regions.insert(region.0, o);
        Ok(Built { region, rkey, addr, qpn })
    }

    fn dereg_mr(&mut self, r: Region) -> Result<(), String> {
        let o = self.objects(r)?;
        if o.mr.is_null() {
            return Ok(());
        }
        // SAFETY: `mr` is live and deregistered once (nulled on success).
        let rc = unsafe { ibv_dereg_mr(o.mr) };
        if rc != 0 {
            return Err(rc_error("ibv_dereg_mr", rc));
        }
        o.mr = std::ptr::null_mut();
        Ok(())
    }

    fn qp_to_err(&mut self, r: Region) -> Result<(), String> {
        let o = self.objects(r)?;
        if o.qp.is_null() {
            return Err("the QP is gone".into());
        }
        // SAFETY: all-zero attributes with the state set are valid for IBV_QP_STATE.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        modify(o.qp, &mut a, ibv_qp_attr_mask::IBV_QP_STATE.0, "ERR")
    }

    fn destroy_qp(&mut self, r: Region) -> Result<(), String> {
        let o = self.objects(r)?;
        if o.qp.is_null() {
            return Ok(());
        }
        // SAFETY: `qp` is live and destroyed once (nulled on success).
        let rc = unsafe { ibv_destroy_qp(o.qp) };
        if rc != 0 {
            return Err(rc_error("ibv_destroy_qp", rc));
        }
        o.qp = std::ptr::null_mut();
        Ok(())
    }

    fn release(&mut self, r: Region) -> Result<(), String> {
        let o = self.objects(r)?;
        if !o.mr.is_null() || !o.qp.is_null() {
            return Err("the MR or the QP still exists".into());
        }
        if !o.pd.is_null() {
            // SAFETY: `pd` is live with no MR or QP left in it; deallocated once (nulled on success).
            let rc = unsafe { ibv_dealloc_pd(o.pd) };
            if rc != 0 {
                return Err(rc_error("ibv_dealloc_pd", rc));
            }
            o.pd = std::ptr::null_mut();
        }
        // The device can no longer reach the buffer: it is freed with the entry.
        self.regions.remove(&r.0);
        Ok(())
    }

    fn quarantine(&mut self, r: Region) {
        if let Some(o) = self.regions.remove(&r.0) {
            self.quarantined.push(o);
        }
    }
}

impl Drop for Ibv {
    fn drop(&mut self) {
        let live: Vec<u64> = self.regions.keys().copied().collect();
        for k in live {
            if let Some(mut o) = self.regions.remove(&k)
                && !destroy(&mut o)
            {
                self.quarantined.push(o);
            }
        }
        // Whatever could not be torn down keeps its memory: the device may still write it.
        for o in std::mem::take(&mut self.quarantined) {
            std::mem::forget(o);
        }
        // SAFETY: the CQ and the context were created by `open`; the CQ has no QP left (or the QPs that could
        // not be destroyed make these calls fail harmlessly), each is destroyed once.
        unsafe {
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            ibv_close_device(self.ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_buffers_start_on_a_page_and_are_zero() {
        for len in [1usize, 4096, 10_000] {
            let mut b = PageBuf::new(len).unwrap();
            assert_eq!(b.addr() as usize % PAGE, 0);
            assert!(b.bytes[b.offset..b.offset + len].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn macs_from_sysfs_text() {
        assert_eq!(parse_mac("52:54:00:12:34:56"), Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert_eq!(parse_mac("52:54:00"), None);
        assert_eq!(parse_mac("zz:54:00:12:34:56"), None);
    }
}
