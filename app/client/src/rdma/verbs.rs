//! The verbs backend (feature `verbs`): an RC QP on a real RDMA device through rdma-core's libibverbs
//! (`rdma-sys` bindings), for `leasectl verify` from a Linux host against a real appliance. The CI machine has
//! no RDMA device: this module is built there, and runs only where a device exists
//! (`docs/hardware-bringup.md`).
//!
//! One protection domain, one CQ, one RC QP, and one registered buffer split into `depth` slots of
//! `slot_len` bytes: a WRITE copies its data into a free slot, a READ lands in one. Every unsafe call is to
//! libibverbs on objects this struct created and owns; they are destroyed in reverse order on drop.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::{Completion, QpEndpoint, QpState, Requester, WcOpcode, WcStatus, mtu_enum};

/// What to open.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// The device (`ibv_devices`), e.g. `mlx5_0`.
    pub device: String,
    pub port: u8,
    /// Our RoCEv2 GID's index (`show_gids`).
    pub gid_index: u8,
    /// Our MAC (the appliance's QP needs it for its address path); `None`: read from sysfs for the GID's netdev.
    pub mac: Option<[u8; 6]>,
    /// Work requests outstanding at most, and the size of each buffer slot.
    pub depth: usize,
    pub slot_len: usize,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

pub struct Verbs {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    buf: Vec<u8>,
    free_slots: Vec<usize>,
    /// wr_id → (slot, opcode, length).
    posted: HashMap<u64, (usize, WcOpcode, u32)>,
    reads: HashMap<u64, Vec<u8>>,
    local: QpEndpoint,
    cfg: VerbsConfig,
    state: QpState,
}

// SAFETY: the raw pointers are libibverbs objects owned by this struct alone; libibverbs allows using them from
// any one thread at a time, which `&mut self` methods guarantee.
unsafe impl Send for Verbs {}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// The MAC of the netdev behind `device`'s GID `index` (sysfs `gid_attrs/ndevs`).
fn netdev_mac(device: &str, port: u8, index: u8) -> Result<[u8; 6], String> {
    let ndev_path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{index}");
    let ndev = std::fs::read_to_string(&ndev_path).map_err(|e| format!("{ndev_path}: {e} (give --mac)"))?;
    let addr_path = format!("/sys/class/net/{}/address", ndev.trim());
    let text = std::fs::read_to_string(&addr_path).map_err(|e| format!("{addr_path}: {e} (give --mac)"))?;
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{addr_path}: '{}' is not a MAC", text.trim()));
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| format!("{addr_path}: '{}' is not a MAC", text.trim()))?;
    }
    Ok(mac)
}

impl Verbs {
    pub fn open(cfg: VerbsConfig) -> Result<Verbs, String> {
        let mut v = Verbs {
            ctx: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            mr: std::ptr::null_mut(),
            buf: vec![0u8; cfg.depth.max(1) * cfg.slot_len.max(1)],
            free_slots: (0..cfg.depth.max(1)).rev().collect(),
            posted: HashMap::new(),
            reads: HashMap::new(),
            local: QpEndpoint { qpn: 0, psn: 0, gid: [0; 16], mac: [0; 6], mtu: 1024 },
            cfg,
            state: QpState::Reset,
        };
        v.open_device()?;
        v.create_objects()?;
        Ok(v)
    }

    fn open_device(&mut self) -> Result<(), String> {
        let mut n = 0;
        // SAFETY: libibverbs fills `n` and returns a list we free below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_error("ibv_get_device_list"));
        }
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: `i < n` entries of the list are valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a valid device has a NUL-terminated name.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            if name == self.cfg.device && self.ctx.is_null() {
                // SAFETY: `dev` is valid until the list is freed; the context outlives the list.
                self.ctx = unsafe { ibv_open_device(dev) };
            }
            names.push(name);
        }
        // SAFETY: the list came from ibv_get_device_list.
        unsafe { ibv_free_device_list(list) };
        if self.ctx.is_null() {
            return Err(format!("no RDMA device '{}' (found: {})", self.cfg.device, names.join(", ")));
        }
        Ok(())
    }

    fn create_objects(&mut self) -> Result<(), String> {
        let (port, index) = (self.cfg.port, self.cfg.gid_index);
        // SAFETY: an all-zero port attribute struct is a valid output buffer.
        let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `pattr` is a valid output buffer.
        if unsafe { ___ibv_query_port(self.ctx, port, &mut pattr) } != 0 {
            return Err(os_error("ibv_query_port"));
        }
        // SAFETY: an all-zero GID is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `gid` is a valid output buffer.
        if unsafe { ibv_query_gid(self.ctx, port, i32::from(index), &mut gid) } != 0 {
            return Err(os_error("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid `raw`.
        let gid = unsafe { gid.raw };
        let mac = match self.cfg.mac {
            Some(m) => m,
            None => netdev_mac(&self.cfg.device, port, index)?,
        };
        let mtu = 128u32 << pattr.active_mtu.clamp(1, 5);
        // SAFETY: `ctx` is open.
        self.pd = unsafe { ibv_alloc_pd(self.ctx) };
        if self.pd.is_null() {
            return Err(os_error("ibv_alloc_pd"));
        }
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: `buf` lives as long as the MR (both owned by self; the MR is deregistered first on drop).
        self.mr = unsafe { ibv_reg_mr(self.pd, self.buf.as_mut_ptr() as *mut c_void, self.buf.len(), access) };
        if self.mr.is_null() {
            return Err(os_error("ibv_reg_mr"));
        }
        let cqe = (self.cfg.depth.max(1) * 2) as i32;
        // SAFETY: `ctx` is open; no completion channel.
        self.cq = unsafe { ibv_create_cq(self.ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if self.cq.is_null() {
            return Err(os_error("ibv_create_cq"));
        }
        // SAFETY: all-zero init attributes, then filled.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = self.cq;
        init.recv_cq = self.cq;
        init.cap.max_send_wr = self.cfg.depth.max(1) as u32;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 1;
        // SAFETY: `pd` and `cq` are live.
        self.qp = unsafe { ibv_create_qp(self.pd, &mut init) };
        if self.qp.is_null() {
            return Err(os_error("ibv_create_qp"));
        }
        let psn = (Instant::now().elapsed().subsec_nanos() ^ std::process::id().rotate_left(7)) & 0xff_ffff;
        // SAFETY: `qp` is live.
        let qpn = unsafe { (*self.qp).qp_num };
        self.local = QpEndpoint { qpn, psn, gid, mac, mtu };
        Ok(())
    }

    fn modify(&mut self, attr: &mut ibv_qp_attr, mask: u32, what: &str) -> Result<(), String> {
        // SAFETY: `qp` is live; `attr` is a valid attribute struct for `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 { Err(format!("ibv_modify_qp({what}): {}", std::io::Error::from_raw_os_error(rc))) } else { Ok(()) }
    }

    fn post(&mut self, wr_id: u64, opcode: WcOpcode, remote_addr: u64, rkey: u32, len: usize) -> Result<usize, String> {
        if len > self.cfg.slot_len {
            return Err(format!("{len} bytes exceed the {}-byte slot", self.cfg.slot_len));
        }
        let slot = self.free_slots.pop().ok_or("all work request slots are in use")?;
        // SAFETY: `mr` is live.
        let lkey = unsafe { (*self.mr).lkey };
        let mut sge =
            ibv_sge { addr: self.buf.as_ptr() as u64 + (slot * self.cfg.slot_len) as u64, length: len as u32, lkey };
        // SAFETY: an all-zero work request is valid; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = match opcode {
            WcOpcode::RdmaWrite => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            WcOpcode::RdmaRead => ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `qp` is live; `wr` and `sge` are valid for the call (the provider copies them).
        let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            self.free_slots.push(slot);
            return Err(format!("ibv_post_send: {}", std::io::Error::from_raw_os_error(rc)));
        }
        self.posted.insert(wr_id, (slot, opcode, len as u32));
        Ok(slot)
    }
}

impl Requester for Verbs {
    fn local(&self) -> QpEndpoint {
        self.local
    }

    fn connect(&mut self, remote: &QpEndpoint) -> Result<(), String> {
        let mtu = remote.mtu.min(self.local.mtu);
        let path_mtu = mtu_enum(mtu).ok_or_else(|| format!("MTU {mtu} is not an IB MTU"))?;
        // SAFETY: all-zero attributes, then filled per transition.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.cfg.port;
        a.qp_access_flags = 0;
        let m = |f: ibv_qp_attr_mask| f.0;
        self.modify(
            &mut a,
            m(ibv_qp_attr_mask::IBV_QP_STATE)
                | m(ibv_qp_attr_mask::IBV_QP_PKEY_INDEX)
                | m(ibv_qp_attr_mask::IBV_QP_PORT)
                | m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS),
            "INIT",
        )?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = u32::from(path_mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = self.cfg.port;
        a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
        a.ah_attr.grh.sgid_index = self.cfg.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        self.modify(
            &mut a,
            m(ibv_qp_attr_mask::IBV_QP_STATE)
                | m(ibv_qp_attr_mask::IBV_QP_AV)
                | m(ibv_qp_attr_mask::IBV_QP_PATH_MTU)
                | m(ibv_qp_attr_mask::IBV_QP_DEST_QPN)
                | m(ibv_qp_attr_mask::IBV_QP_RQ_PSN)
                | m(ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC)
                | m(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER),
            "RTR",
        )?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = self.local.psn;
        a.timeout = self.cfg.timeout;
        a.retry_cnt = self.cfg.retry_cnt;
        a.rnr_retry = self.cfg.rnr_retry;
        a.max_rd_atomic = 1;
        self.modify(
            &mut a,
            m(ibv_qp_attr_mask::IBV_QP_STATE)
                | m(ibv_qp_attr_mask::IBV_QP_SQ_PSN)
                | m(ibv_qp_attr_mask::IBV_QP_TIMEOUT)
                | m(ibv_qp_attr_mask::IBV_QP_RETRY_CNT)
                | m(ibv_qp_attr_mask::IBV_QP_RNR_RETRY)
                | m(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC),
            "RTS",
        )?;
        self.state = QpState::Rts;
        Ok(())
    }

    fn post_write(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, data: &[u8]) -> Result<(), String> {
        if data.len() > self.cfg.slot_len {
            return Err(format!("{} bytes exceed the {}-byte slot", data.len(), self.cfg.slot_len));
        }
        let Some(&slot) = self.free_slots.last() else { return Err("all work request slots are in use".into()) };
        let at = slot * self.cfg.slot_len;
        self.buf[at..at + data.len()].copy_from_slice(data);
        self.post(wr_id, WcOpcode::RdmaWrite, remote_addr, rkey, data.len()).map(drop)
    }

    fn post_read(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, len: u32) -> Result<(), String> {
        self.post(wr_id, WcOpcode::RdmaRead, remote_addr, rkey, len as usize).map(drop)
    }

    fn poll(&mut self, max_wait: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + max_wait;
        let mut out = Vec::new();
        loop {
            // SAFETY: an all-zero work completion array is a valid output buffer.
            let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
            // SAFETY: `cq` is live; `wc` holds 16 entries.
            let n = unsafe { ibv_poll_cq(self.cq, wc.len() as i32, wc.as_mut_ptr()) };
            let at = Instant::now();
            for w in wc.iter().take(n.max(0) as usize) {
                let Some((slot, opcode, len)) = self.posted.remove(&w.wr_id) else { continue };
                let status = WcStatus::from_code(w.status).unwrap_or(WcStatus::GeneralErr);
                if status == WcStatus::Success && opcode == WcOpcode::RdmaRead {
                    let from = slot * self.cfg.slot_len;
                    self.reads.insert(w.wr_id, self.buf[from..from + len as usize].to_vec());
                }
                if status != WcStatus::Success {
                    self.state = QpState::Err;
                }
                self.free_slots.push(slot);
                let byte_len = if status == WcStatus::Success { len } else { 0 };
                out.push(Completion { wr_id: w.wr_id, status, opcode, byte_len, at });
            }
            if !out.is_empty() || at >= deadline {
                return out;
            }
            std::hint::spin_loop();
        }
    }

    fn read_data(&mut self, wr_id: u64) -> Option<Vec<u8>> {
        self.reads.remove(&wr_id)
    }

    fn qp_state(&self) -> QpState {
        self.state
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // SAFETY: each object was created by this struct and is destroyed once, dependents first.
        unsafe {
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
            }
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            if !self.mr.is_null() {
                ibv_dereg_mr(self.mr);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            if !self.ctx.is_null() {
                ibv_close_device(self.ctx);
            }
        }
    }
}
