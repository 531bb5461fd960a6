//! The verbs backend (feature `verbs`): RC QPs on a real RDMA device through rdma-core's libibverbs, loaded at
//! the first device open ([`library`]: a host without it gets an error naming the package, not a program that
//! fails to start; `rdma-sys` gives the structure layouts), for the client library and `leasectl verify` from a Linux host against a real
//! appliance. The CI machine has no RDMA device: this module is built there (and checked by clippy), and runs
//! only where a device exists (`docs/hardware-bringup.md`, Soft-RoCE in `docs/rxe-guest.md`).
//!
//! A [`Device`] is one device context: the context, one protection domain, one completion queue and its
//! completion channel. A client opens one per device and shares it among every lease there: each lease is
//! one [`Verbs`], one RC QP on the shared PD and CQ. Completions are polled from the shared CQ by whichever QP
//! polls first and sorted by QP number. Memory the program registers ([`crate::Region`]) is registered once
//! per device, in its PD ([`super::MemoryDomain`]: `ibv_reg_mr`, LOCAL_WRITE), and every QP of the device
//! names it by the same lkey: a zero-copy work request's SGEs point into it.
//!
//! The copying calls (`post_write` / `post_read`, which `leasectl verify` uses) go through a buffer of the
//! QP's own, registered at their first use and split into `depth` slots of `slot_len` bytes: a WRITE copies
//! its data into a free slot, a READ lands in one. Every unsafe call is to libibverbs on objects these structs
//! created and own; they are destroyed in reverse order on drop (QPs and registrations hold their device).

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

// Types, and the verbs `verbs.h` defines inline over the context's operations table (no exported symbol); every
// exported verb is called through `library::Ibv`.
use rdma_sys::{
    ibv_access_flags, ibv_comp_channel, ibv_context, ibv_cq, ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_poll_cq,
    ibv_port_attr, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_req_notify_cq, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wr_opcode, rdma_t,
};

pub mod library;
use library::Ibv;

use super::{
    Completion, MemoryDomain, QpEndpoint, QpState, Registration, Requester, Sge, WcOpcode, WcStatus, mtu_enum,
};

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

impl VerbsConfig {
    /// `device`'s `port`, GID `gid_index`, with the defaults: the MAC read from sysfs, 64 work requests per QP,
    /// 64 KiB copy slots (the copying calls' bounce pool: 4 MiB per lease, registered at their first use; the
    /// zero-copy calls use none), and the QP timers Linux's RDMA tools use (local ACK timeout 14 ≈ 67 ms, 7 retries,
    /// 7 RNR retries = unlimited).
    pub fn new(device: &str, port: u8, gid_index: u8) -> VerbsConfig {
        VerbsConfig {
            device: device.to_string(),
            port,
            gid_index,
            mac: None,
            depth: 64,
            slot_len: 64 << 10,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// The most SGEs a work request is given, whatever the device takes (a ConnectX-5 takes 30).
const MAX_SGE_CAP: usize = 30;
/// Completion queue entries at most (the device's `max_cqe` when smaller): shared by every QP of the device, so
/// the work requests outstanding on all of them together stay below it ([`Requester::room`]).
const CQ_ENTRIES: i32 = 16384;
/// Longest single wait on the completion channel, so a caller's deadline is checked often.
const CHANNEL_WAIT: Duration = Duration::from_millis(1);

/// One polled completion, kept for its QP until that QP's requester takes it.
#[derive(Clone, Copy)]
struct Polled {
    wr_id: u64,
    status: WcStatus,
    at: Instant,
}

/// The shared completion queue's bookkeeping.
#[derive(Default)]
struct CqState {
    /// Completions polled for each QP (by QP number), not yet taken by its requester.
    queues: HashMap<u32, VecDeque<Polled>>,
    /// Work requests posted on all the device's QPs whose completions have not been polled yet: the CQ has
    /// room for every one.
    outstanding: usize,
}

/// One device context shared by every QP a client opens on the device: context, protection domain, completion
/// queue and completion channel (see the module documentation).
pub struct Device {
    name: String,
    me: Weak<Device>,
    ibv: &'static Ibv,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    cq_len: usize,
    /// SGEs per work request: the device's `max_sge` and `max_sge_rd`, whichever is smaller, capped.
    max_sge: usize,
    max_qp_wr: usize,
    cq_state: Mutex<CqState>,
}

// SAFETY: the pointers are libibverbs objects owned by the device; libibverbs' verbs are thread-safe (rdma-core
// documents the context, PD, CQ polling, CQ notification and registration calls as callable from any thread),
// and our own bookkeeping of the shared CQ is behind a mutex.
unsafe impl Send for Device {}
// SAFETY: as for `Send`.
unsafe impl Sync for Device {}

fn os_error_code(what: &str, rc: i32) -> String {
    format!("{what}: {}", std::io::Error::from_raw_os_error(rc))
}

impl Device {
    /// Opens `name` (`ibv_devices`): its context, a PD, a CQ with a completion channel.
    /// The first open loads libibverbs ([`library::ibv`]); without it, the error says what to install.
    pub fn open(name: &str) -> Result<Arc<Device>, String> {
        let ibv = library::ibv()?;
        let mut n = 0;
        // SAFETY: libibverbs fills `n` and returns a list we free below.
        let list = unsafe { (ibv.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(os_error("ibv_get_device_list (no RDMA devices: does the kernel have ib_uverbs?)"));
        }
        let mut names = Vec::new();
        let mut ctx: *mut ibv_context = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `i < n` entries of the list are valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a valid device has a NUL-terminated name.
            let found = unsafe { CStr::from_ptr((ibv.get_device_name)(dev)) }.to_string_lossy().into_owned();
            if found == name && ctx.is_null() {
                // SAFETY: `dev` is valid until the list is freed; the context outlives the list.
                ctx = unsafe { (ibv.open_device)(dev) };
            }
            names.push(found);
        }
        // SAFETY: the list came from ibv_get_device_list.
        unsafe { (ibv.free_device_list)(list) };
        if ctx.is_null() {
            return Err(format!("no RDMA device '{name}' (found: {})", names.join(", ")));
        }
        // From here on a failure drops `d`, which releases what was made so far.
        let mut d = Device {
            name: name.to_string(),
            me: Weak::new(),
            ibv,
            ctx,
            pd: std::ptr::null_mut(),
            channel: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            cq_len: 0,
            max_sge: 1,
            max_qp_wr: 1,
            cq_state: Mutex::new(CqState::default()),
        };
        // SAFETY: an all-zero attribute struct is a valid output buffer.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `attr` is a valid output buffer.
        let rc = unsafe { (ibv.query_device)(d.ctx, &mut attr) };
        if rc != 0 {
            return Err(os_error_code("ibv_query_device", rc));
        }
        d.max_sge = (attr.max_sge.min(attr.max_sge_rd).max(1) as usize).min(MAX_SGE_CAP);
        d.max_qp_wr = attr.max_qp_wr.max(1) as usize;
        // SAFETY: `ctx` is open.
        d.pd = unsafe { (ibv.alloc_pd)(d.ctx) };
        if d.pd.is_null() {
            return Err(os_error("ibv_alloc_pd"));
        }
        // SAFETY: `ctx` is open.
        d.channel = unsafe { (ibv.create_comp_channel)(d.ctx) };
        if d.channel.is_null() {
            return Err(os_error("ibv_create_comp_channel"));
        }
        // SAFETY: `channel` is live; its fd is the channel's own.
        let fd = unsafe { (*d.channel).fd };
        // SAFETY: F_GETFL/F_SETFL on an fd we own (through the channel) change only its flags.
        let nonblocking = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            return Err(os_error("fcntl(completion channel, O_NONBLOCK)"));
        }
        let cqe = CQ_ENTRIES.min(attr.max_cqe.max(1));
        // SAFETY: `ctx` and `channel` are live; no CQ context; completion vector 0.
        d.cq = unsafe { (ibv.create_cq)(d.ctx, cqe, std::ptr::null_mut(), d.channel, 0) };
        if d.cq.is_null() {
            return Err(os_error("ibv_create_cq"));
        }
        // SAFETY: `cq` is live.
        d.cq_len = unsafe { (*d.cq).cqe }.max(1) as usize;
        // Moved out of `d` (whose drop then finds nothing to release) into the shared device.
        let ctx = std::mem::replace(&mut d.ctx, std::ptr::null_mut());
        let pd = std::mem::replace(&mut d.pd, std::ptr::null_mut());
        let channel = std::mem::replace(&mut d.channel, std::ptr::null_mut());
        let cq = std::mem::replace(&mut d.cq, std::ptr::null_mut());
        let (cq_len, max_sge, max_qp_wr) = (d.cq_len, d.max_sge, d.max_qp_wr);
        drop(d);
        Ok(Arc::new_cyclic(|me| Device {
            name: name.to_string(),
            me: me.clone(),
            ibv,
            ctx,
            pd,
            channel,
            cq,
            cq_len,
            max_sge,
            max_qp_wr,
            cq_state: Mutex::new(CqState::default()),
        }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SGEs one work request may have.
    pub fn max_sge(&self) -> usize {
        self.max_sge
    }

    fn cq_state(&self) -> std::sync::MutexGuard<'_, CqState> {
        self.cq_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Polls the shared CQ dry, sorting what it holds by QP.
    fn poll_cq(&self) {
        let mut st = self.cq_state();
        loop {
            // SAFETY: an all-zero work completion array is a valid output buffer.
            let mut wc: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
            // SAFETY: `cq` is live; `wc` holds 32 entries.
            let n = unsafe { ibv_poll_cq(self.cq, wc.len() as i32, wc.as_mut_ptr()) };
            let at = Instant::now();
            for w in wc.iter().take(n.max(0) as usize) {
                let status = WcStatus::from_code(w.status).unwrap_or(WcStatus::GeneralErr);
                // A QP already destroyed took its count with it.
                if let Some(q) = st.queues.get_mut(&w.qp_num) {
                    q.push_back(Polled { wr_id: w.wr_id, status, at });
                    st.outstanding = st.outstanding.saturating_sub(1);
                }
            }
            if n < wc.len() as i32 {
                return;
            }
        }
    }

    /// Waits up to `wait` for the CQ's next completion event (the completion channel): arm, look once more
    /// (a completion that came before the arming raises no event), then wait on the channel's fd.
    fn wait(&self, wait: Duration) {
        // SAFETY: `cq` is live; 0: every completion raises the event.
        if unsafe { ibv_req_notify_cq(self.cq, 0) } != 0 {
            std::thread::sleep(wait.min(Duration::from_micros(50)));
            return;
        }
        self.poll_cq();
        if self.cq_state().queues.values().any(|q| !q.is_empty()) {
            return;
        }
        // SAFETY: `channel` is live.
        let fd = unsafe { (*self.channel).fd };
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready > 0 {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: `channel` is live and non-blocking; the outputs are valid pointers. An event taken is
            // acknowledged at once (ibv_destroy_cq waits for every event to be acknowledged).
            unsafe {
                if (self.ibv.get_cq_event)(self.channel, &mut cq, &mut ctx) == 0 {
                    (self.ibv.ack_cq_events)(cq, 1);
                }
            }
        }
    }

    fn qp_opened(&self, qpn: u32) {
        self.cq_state().queues.insert(qpn, VecDeque::new());
    }

    /// A QP is gone: `unpolled` of its work requests will never be polled for it.
    fn qp_closed(&self, qpn: u32, unpolled: usize) {
        let mut st = self.cq_state();
        st.queues.remove(&qpn);
        st.outstanding = st.outstanding.saturating_sub(unpolled);
    }

    /// Takes a place in the CQ for one more work request, if there is one.
    fn reserve(&self) -> bool {
        let mut st = self.cq_state();
        if st.outstanding >= self.cq_len {
            return false;
        }
        st.outstanding += 1;
        true
    }

    fn unreserve(&self) {
        let mut st = self.cq_state();
        st.outstanding = st.outstanding.saturating_sub(1);
    }

    fn cq_room(&self) -> usize {
        self.cq_len.saturating_sub(self.cq_state().outstanding)
    }

    fn take(&self, qpn: u32) -> Vec<Polled> {
        self.cq_state().queues.get_mut(&qpn).map(|q| q.drain(..).collect()).unwrap_or_default()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: each object was created by this device and is destroyed once, dependents first; every QP and
        // registration holds the device, so none is left.
        unsafe {
            if !self.cq.is_null() {
                (self.ibv.destroy_cq)(self.cq);
            }
            if !self.channel.is_null() {
                (self.ibv.destroy_comp_channel)(self.channel);
            }
            if !self.pd.is_null() {
                (self.ibv.dealloc_pd)(self.pd);
            }
            if !self.ctx.is_null() {
                (self.ibv.close_device)(self.ctx);
            }
        }
    }
}

/// Memory registered in a device's PD; deregistered when dropped (before the device it holds can go).
struct Mr {
    mr: *mut ibv_mr,
    device: Arc<Device>,
}

// SAFETY: an MR handle is used only to read its lkey and to deregister it once, which libibverbs allows from
// any thread.
unsafe impl Send for Mr {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mr {}

impl Registration for Mr {
    fn lkey(&self) -> u32 {
        // SAFETY: `mr` is live until drop.
        unsafe { (*self.mr).lkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `Device::register`, deregistered once.
        unsafe { (self.device.ibv.dereg_mr)(self.mr) };
    }
}

impl MemoryDomain for Device {
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Box<dyn Registration>, String> {
        let device = self.me.upgrade().ok_or("the device is being closed")?;
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the caller keeps the memory valid until the registration is dropped; `pd` is live (the
        // registration holds the device).
        let mr = unsafe { (self.ibv.reg_mr)(self.pd, addr as *mut c_void, len, access) };
        if mr.is_null() {
            return Err(os_error(&format!("ibv_reg_mr({len} bytes on {})", self.name)));
        }
        Ok(Box::new(Mr { mr, device }))
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// The copying calls' own registered buffer, in `depth` slots of `slot_len` bytes.
struct Slots {
    buf: Vec<u8>,
    mr: *mut ibv_mr,
    free: Vec<usize>,
}

/// A posted work request: its copy slot (copying calls), opcode and length.
struct Posted {
    slot: Option<usize>,
    opcode: WcOpcode,
    len: u32,
}

/// One RC QP on a shared [`Device`] (see the module documentation).
pub struct Verbs {
    dev: Arc<Device>,
    qp: *mut ibv_qp,
    qpn: u32,
    max_send_wr: usize,
    slots: Option<Slots>,
    posted: HashMap<u64, Posted>,
    reads: HashMap<u64, Vec<u8>>,
    local: QpEndpoint,
    cfg: VerbsConfig,
    state: QpState,
}

// SAFETY: the raw pointers are libibverbs objects owned by this struct alone (the device it shares is `Sync`);
// libibverbs allows using them from any one thread at a time, which `&mut self` methods guarantee.
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
    /// Opens the device on its own and one QP on it (`leasectl verify`: one requester per lease, nothing
    /// shared).
    pub fn open(cfg: VerbsConfig) -> Result<Verbs, String> {
        let dev = Device::open(&cfg.device)?;
        let depth = cfg.depth;
        Verbs::on(dev, cfg, depth)
    }

    /// One QP on `dev`, taking `depth` work requests at once (at least `cfg.depth`, at most what the device
    /// takes).
    pub fn on(dev: Arc<Device>, cfg: VerbsConfig, depth: usize) -> Result<Verbs, String> {
        let max_send_wr = depth.max(cfg.depth).clamp(1, dev.max_qp_wr);
        let mut v = Verbs {
            dev,
            qp: std::ptr::null_mut(),
            qpn: 0,
            max_send_wr,
            slots: None,
            posted: HashMap::new(),
            reads: HashMap::new(),
            local: QpEndpoint { qpn: 0, psn: 0, gid: [0; 16], mac: [0; 6], mtu: 1024 },
            cfg,
            state: QpState::Reset,
        };
        v.create_qp()?;
        Ok(v)
    }

    fn create_qp(&mut self) -> Result<(), String> {
        let (port, index) = (self.cfg.port, self.cfg.gid_index);
        let (ctx, ibv) = (self.dev.ctx, self.dev.ibv);
        // SAFETY: an all-zero port attribute struct is a valid output buffer.
        let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open (the device is held); `pattr` is a valid output buffer, zeroed, larger than the
        // prefix the exported verb fills (the `library` module's documentation).
        if unsafe { (ibv.query_port)(ctx, port, &mut pattr) } != 0 {
            return Err(os_error("ibv_query_port"));
        }
        // SAFETY: an all-zero GID is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `gid` is a valid output buffer.
        if unsafe { (ibv.query_gid)(ctx, port, i32::from(index), &mut gid) } != 0 {
            return Err(os_error("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid `raw`.
        let gid = unsafe { gid.raw };
        let mac = match self.cfg.mac {
            Some(m) => m,
            None => netdev_mac(&self.cfg.device, port, index)?,
        };
        let mtu = 128u32 << pattr.active_mtu.clamp(1, 5);
        // SAFETY: all-zero init attributes, then filled.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = self.dev.cq;
        init.recv_cq = self.dev.cq;
        init.cap.max_send_wr = self.max_send_wr as u32;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = self.dev.max_sge as u32;
        init.cap.max_recv_sge = 1;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 1;
        // SAFETY: the device's `pd` and `cq` are live.
        self.qp = unsafe { (ibv.create_qp)(self.dev.pd, &mut init) };
        if self.qp.is_null() {
            return Err(os_error("ibv_create_qp"));
        }
        let psn = (Instant::now().elapsed().subsec_nanos() ^ std::process::id().rotate_left(7)) & 0xff_ffff;
        // SAFETY: `qp` is live.
        self.qpn = unsafe { (*self.qp).qp_num };
        self.dev.qp_opened(self.qpn);
        self.local = QpEndpoint { qpn: self.qpn, psn, gid, mac, mtu };
        Ok(())
    }

    /// The device this QP is on.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    fn modify(&mut self, attr: &mut ibv_qp_attr, mask: u32, what: &str) -> Result<(), String> {
        // SAFETY: `qp` is live; `attr` is a valid attribute struct for `mask`.
        let rc = unsafe { (self.dev.ibv.modify_qp)(self.qp, attr, mask as i32) };
        if rc != 0 { Err(format!("ibv_modify_qp({what}): {}", std::io::Error::from_raw_os_error(rc))) } else { Ok(()) }
    }

    /// The copying calls' buffer, registered at its first use.
    fn slots(&mut self) -> Result<&mut Slots, String> {
        if self.slots.is_none() {
            let n = self.cfg.depth.max(1);
            let mut buf = vec![0u8; n * self.cfg.slot_len.max(1)];
            let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
            // SAFETY: `buf` lives as long as the MR (both owned by `Slots`, which this struct drops after its QP
            // and deregisters first); the device's `pd` is live.
            let mr = unsafe { (self.dev.ibv.reg_mr)(self.dev.pd, buf.as_mut_ptr() as *mut c_void, buf.len(), access) };
            if mr.is_null() {
                return Err(os_error("ibv_reg_mr"));
            }
            self.slots = Some(Slots { buf, mr, free: (0..n).rev().collect() });
        }
        self.slots.as_mut().ok_or_else(|| "no copy buffer".to_string())
    }

    /// Posts one work request of `sges` (already checked against the device's limits).
    fn post_sges(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        remote_addr: u64,
        rkey: u32,
        sges: &mut [ibv_sge],
        slot: Option<usize>,
    ) -> Result<(), String> {
        if self.posted.len() >= self.max_send_wr {
            return Err(format!("the send queue's {} work requests are all in use", self.max_send_wr));
        }
        if !self.dev.reserve() {
            return Err(format!("the completion queue of {} is full", self.dev.name));
        }
        let len = sges.iter().map(|s| s.length).sum::<u32>();
        // SAFETY: an all-zero work request is valid; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = if sges.is_empty() { std::ptr::null_mut() } else { sges.as_mut_ptr() };
        wr.num_sge = sges.len() as i32;
        wr.opcode = match opcode {
            WcOpcode::RdmaWrite => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            WcOpcode::RdmaRead => ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `qp` is live; `wr` and its SGEs are valid for the call (the provider copies them); the memory
        // the SGEs name is the caller's to keep valid (the slots', or the zero-copy caller's contract).
        let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            self.dev.unreserve();
            return Err(os_error_code("ibv_post_send", rc));
        }
        self.posted.insert(wr_id, Posted { slot, opcode, len });
        Ok(())
    }

    /// A copying work request through a free slot: WRITE copies `data` into it first.
    fn post_copy(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        remote_addr: u64,
        rkey: u32,
        data: Option<&[u8]>,
        len: usize,
    ) -> Result<(), String> {
        let slot_len = self.cfg.slot_len;
        if len > slot_len {
            return Err(format!("{len} bytes exceed the {slot_len}-byte slot"));
        }
        let slots = self.slots()?;
        let slot = slots.free.pop().ok_or("all work request slots are in use")?;
        let at = slot * slot_len;
        if let Some(d) = data {
            slots.buf[at..at + d.len()].copy_from_slice(d);
        }
        // SAFETY: `mr` is live.
        let lkey = unsafe { (*slots.mr).lkey };
        let addr = slots.buf.as_ptr() as u64 + at as u64;
        let mut sge = [ibv_sge { addr, length: len as u32, lkey }];
        let r = self.post_sges(wr_id, opcode, remote_addr, rkey, &mut sge, Some(slot));
        if r.is_err()
            && let Some(s) = self.slots.as_mut()
        {
            s.free.push(slot);
        }
        r
    }

    fn sges(&self, sg: &[Sge]) -> Result<Vec<ibv_sge>, String> {
        if sg.len() > self.dev.max_sge {
            return Err(format!("{} pieces exceed the {} SGEs {} takes", sg.len(), self.dev.max_sge, self.dev.name));
        }
        Ok(sg.iter().map(|p| ibv_sge { addr: p.addr as u64, length: p.len, lkey: p.lkey }).collect())
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
        self.post_copy(wr_id, WcOpcode::RdmaWrite, remote_addr, rkey, Some(data), data.len())
    }

    fn post_read(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, len: u32) -> Result<(), String> {
        self.post_copy(wr_id, WcOpcode::RdmaRead, remote_addr, rkey, None, len as usize)
    }

    fn max_sge(&self) -> usize {
        self.dev.max_sge
    }

    fn domain(&self) -> Option<Arc<dyn MemoryDomain>> {
        Some(self.dev.clone() as Arc<dyn MemoryDomain>)
    }

    fn room(&self) -> usize {
        self.max_send_wr.saturating_sub(self.posted.len()).min(self.dev.cq_room())
    }

    unsafe fn post_write_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String> {
        let mut sges = self.sges(sg)?;
        self.post_sges(wr_id, WcOpcode::RdmaWrite, remote_addr, rkey, &mut sges, None)
    }

    unsafe fn post_read_sg(&mut self, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) -> Result<(), String> {
        let mut sges = self.sges(sg)?;
        self.post_sges(wr_id, WcOpcode::RdmaRead, remote_addr, rkey, &mut sges, None)
    }

    fn poll(&mut self, max_wait: Duration) -> Vec<Completion> {
        let end = Instant::now() + max_wait;
        let mut out = Vec::new();
        loop {
            self.dev.poll_cq();
            for p in self.dev.take(self.qpn) {
                let Some(Posted { slot, opcode, len }) = self.posted.remove(&p.wr_id) else { continue };
                let status = p.status;
                if let (Some(slot), Some(slots)) = (slot, self.slots.as_mut()) {
                    if status == WcStatus::Success && opcode == WcOpcode::RdmaRead {
                        let from = slot * self.cfg.slot_len;
                        self.reads.insert(p.wr_id, slots.buf[from..from + len as usize].to_vec());
                    }
                    slots.free.push(slot);
                }
                if status != WcStatus::Success {
                    self.state = QpState::Err;
                }
                let byte_len = if status == WcStatus::Success { len } else { 0 };
                out.push(Completion { wr_id: p.wr_id, status, opcode, byte_len, at: p.at });
            }
            let now = Instant::now();
            if !out.is_empty() || now >= end {
                return out;
            }
            self.dev.wait((end - now).min(CHANNEL_WAIT));
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
        // SAFETY: the QP and the slots' MR were created by this struct and are destroyed once, the QP first:
        // once it is destroyed the device no longer reads or writes memory for it.
        unsafe {
            if !self.qp.is_null() {
                (self.dev.ibv.destroy_qp)(self.qp);
            }
            if let Some(s) = self.slots.as_ref() {
                (self.dev.ibv.dereg_mr)(s.mr);
            }
        }
        if !self.qp.is_null() {
            let polled = self.dev.cq_state().queues.get(&self.qpn).map_or(0, VecDeque::len);
            self.dev.qp_closed(self.qpn, self.posted.len().saturating_sub(polled));
        }
    }
}
