//! `mlx5-hosted`: where the native mlx5 driver meets its stand-in. The driver's [`Platform`] in a Linux
//! process over the device model's two memories — BAR and RAM, where a device address is an offset in the RAM.
//! The model runs in-process and is stepped from [`Platform::relax`] (deterministic tests), on its own thread
//! (native-speed benchmarks), or as its own process behind the shared files QEMU would use. The hosted
//! appliance, the hosted tests and the benchmarks use it; the driver itself knows nothing of the model. The
//! model thread and the engines' thread ([`spawn_engines`]) sleep when idle and are woken by work ([`idle`]).

pub mod clock;
pub mod idle;
pub mod table;

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlx5_model::mem::{Memory, VecMemory, WriteOneToSet};
use mlx5_model::{Model, ModelConfig};

use leasebox_mlx5::engine::{Client, CommandEngine, EventEngine};
use leasebox_mlx5::{DmaBuf, DmaFault, LiveAllocations, Platform};
use mlx5_model::idle::{Backoff, Idle};

/// BAR size the hosted model gets (the init segment, UAR pages and the signature page fit easily).
pub const HOSTED_BAR_BYTES: usize = 1 << 20;
/// The command doorbell's BAR offset (`initial_seg.cmd_dbell`), write-1-to-set on the hosted BARs.
const DOORBELL: u64 = mlx5_model::ifc::initial_seg::BYTE_CMD_DBELL;

/// First-fit allocator over `[start, end)` of the RAM; freed ranges merge with their neighbours. It keeps the
/// live allocations too, so every DMA access and free is checked against them (handle live, range inside it),
/// as on the kernel's platform.
struct Arena {
    free: BTreeMap<u64, u64>,
    live: LiveAllocations<()>,
    /// RAM from here up was never handed out and is still zero (a fresh memory), so an allocation there
    /// needs no clearing: a large pool in a sparse file stays sparse until it is written.
    fresh_from: u64,
}

impl Arena {
    /// `fresh`: whether the RAM is known to be all zeros.
    fn new(start: u64, end: u64, fresh: bool) -> Arena {
        let mut free = BTreeMap::new();
        free.insert(start, end - start);
        Arena { free, live: LiveAllocations::new(), fresh_from: if fresh { start } else { end } }
    }

    /// Allocates `len` (> 0) bytes and records them live; returns the handle and how many of its first
    /// bytes may hold old data (the rest is fresh).
    fn alloc_live(&mut self, len: usize, align: u64) -> Option<(DmaBuf, u64)> {
        if len == 0 {
            return None;
        }
        let at = self.alloc(len as u64, align)?;
        // The free list never holds live memory, so nothing live is displaced.
        let (buf, _) = self.live.insert(at, len, ());
        let used = self.fresh_from.saturating_sub(at).min(len as u64);
        self.fresh_from = self.fresh_from.max(at + len as u64);
        Some((buf, used))
    }

    /// Frees a live allocation; nothing is freed for a handle that is not live.
    fn free_live(&mut self, buf: DmaBuf) -> Result<(), DmaFault> {
        self.live.remove(buf)?;
        self.free(buf.addr(), buf.len() as u64);
        Ok(())
    }

    fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        let (&start, &size, at) = self.free.iter().find_map(|(s, l)| {
            let at = s.next_multiple_of(align);
            (at + len <= s + l).then_some((s, l, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + len < start + size {
            self.free.insert(at + len, start + size - at - len);
        }
        Some(at)
    }

    fn free(&mut self, addr: u64, len: u64) {
        let mut start = addr;
        let mut size = len;
        if let Some((&s, &l)) = self.free.range(..addr).next_back()
            && s + l == addr
        {
            self.free.remove(&s);
            start = s;
            size += l;
        }
        if let Some(&l) = self.free.get(&(addr + len)) {
            self.free.remove(&(addr + len));
            size += l;
        }
        self.free.insert(start, size);
    }

    fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

enum Stepper {
    /// `relax` runs one model pass.
    InProcess(Arc<Mutex<Model>>),
    /// A model thread polls until stopped, sleeping when idle: `wake` ends its sleep (every BAR write does);
    /// it wakes `engines`, once set, after every pass that did work.
    Thread {
        stop: Arc<AtomicBool>,
        handle: Option<JoinHandle<()>>,
        model: Arc<Mutex<Model>>,
        wake: Arc<idle::ModelWake>,
        engines: Arc<OnceLock<Waker>>,
    },
    /// Someone else runs the model (its own process).
    External,
}

/// The driver's platform over the model's BAR and RAM. A DMA access through a handle that is not live, or
/// past its end, fails closed (a read sees all ones, a write is dropped), as does a free of a handle that is
/// not live; each is counted ([`HostedPlatform::dma_faults`]) and the first few are printed.
pub struct HostedPlatform {
    bar: Arc<dyn Memory>,
    ram: Arc<dyn Memory>,
    arena: RwLock<Arena>,
    faults: AtomicU64,
    clock: clock::Clock,
    stepper: Stepper,
}

/// How the model is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelMode {
    InProcess,
    Thread,
}

impl HostedPlatform {
    /// A fresh model over a BAR and `ram_bytes` of RAM; DMA memory is taken from the RAM above 1 MiB.
    /// In-process, both are plain buffers (the model steps only from `relax`, so nothing contends); with a
    /// model thread they are anonymous shared mappings (files in /dev/shm, unlinked once mapped), accessed
    /// without locks on either side, as in QEMU runs. Either way the driver and the model reach the BAR through
    /// the same object, so its command doorbell is a write-1-to-set register as on a ConnectX-5
    /// (`mlx5_model::mem::WriteOneToSet`) and the model runs exactly the slots rung (`Doorbells::PerSlot` under
    /// `Doorbells::Auto`; docs/hca-model.md, "Command timing and doorbells").
    pub fn with_model(cfg: ModelConfig, ram_bytes: usize, mode: ModelMode) -> HostedPlatform {
        Self::with_model_udp(cfg, ram_bytes, mode, None)
    }

    /// As [`HostedPlatform::with_model`]; with `udp` (a non-blocking RoCEv2 responder socket) the model thread
    /// also serves the data path, as the model process does (`ModelMode::Thread` only).
    pub fn with_model_udp(
        cfg: ModelConfig,
        ram_bytes: usize,
        mode: ModelMode,
        udp: Option<mlx5_model::roce::udp::UdpResponder>,
    ) -> HostedPlatform {
        let (bar, ram): (Arc<dyn Memory>, Arc<dyn Memory>) = match mode {
            ModelMode::InProcess => {
                (Arc::new(VecMemory::with_doorbell(HOSTED_BAR_BYTES, DOORBELL)), Arc::new(VecMemory::new(ram_bytes)))
            }
            ModelMode::Thread => (
                Arc::new(WriteOneToSet::new(scratch_mapping("bar", HOSTED_BAR_BYTES as u64), DOORBELL)),
                Arc::new(scratch_mapping("ram", ram_bytes as u64)),
            ),
        };
        let model = Arc::new(Mutex::new(Model::new(bar.clone(), ram.clone(), cfg)));
        let stepper = match mode {
            ModelMode::InProcess => Stepper::InProcess(model),
            ModelMode::Thread => {
                let stop = Arc::new(AtomicBool::new(false));
                let wake = Arc::new(idle::ModelWake::new());
                let engines = Arc::new(OnceLock::new());
                let (m, s, w, e) = (model.clone(), stop.clone(), wake.clone(), engines.clone());
                let handle = std::thread::Builder::new()
                    .name("mlx5-model".into())
                    .spawn(move || model_thread(&s, &m, udp, &w, &e))
                    .expect("spawn the model thread");
                Stepper::Thread { stop, handle: Some(handle), model, wake, engines }
            }
        };
        Self::assemble(bar, ram, stepper, true)
    }

    /// Maps the BAR and RAM files a model process serves (the files QEMU would use), waiting up to `wait`
    /// for them to appear.
    pub fn open_files(bar: &std::path::Path, ram: &std::path::Path, wait: Duration) -> Result<HostedPlatform, String> {
        use mlx5_model::shm::SharedFile;
        let bar = SharedFile::open_bar(bar, None, wait).map_err(|e| e.to_string())?;
        let ram = SharedFile::open_ram(ram, None, wait).map_err(|e| e.to_string())?;
        if ram.below_4g() != ram.ram_bytes() {
            return Err(format!(
                "{}: {} MiB of RAM lies partly above the PCI hole; the hosted platform allocates from one range",
                ram.file().path().display(),
                ram.ram_bytes() >> 20
            ));
        }
        Ok(Self::attach(Arc::new(bar), Arc::new(ram)))
    }

    /// Attaches to memories someone else's model serves (the model as its own process over shared files).
    pub fn attach(bar: Arc<dyn Memory>, ram: Arc<dyn Memory>) -> HostedPlatform {
        Self::assemble(bar, ram, Stepper::External, false)
    }

    /// `fresh`: the RAM was just created (all zeros); otherwise every allocation is cleared.
    fn assemble(bar: Arc<dyn Memory>, ram: Arc<dyn Memory>, stepper: Stepper, fresh: bool) -> HostedPlatform {
        let arena = RwLock::new(Arena::new(1 << 20, ram.size(), fresh));
        HostedPlatform {
            bar,
            ram,
            arena,
            faults: AtomicU64::new(0),
            clock: clock::Clock::starting(Instant::now()),
            stepper,
        }
    }

    /// The in-process model (fault injection, inspection). `None` when it runs elsewhere.
    pub fn model(&self) -> Option<std::sync::MutexGuard<'_, Model>> {
        match &self.stepper {
            Stepper::InProcess(m) | Stepper::Thread { model: m, .. } => {
                Some(m.lock().unwrap_or_else(|e| e.into_inner()))
            }
            Stepper::External => None,
        }
    }

    pub fn ram(&self) -> &Arc<dyn Memory> {
        &self.ram
    }

    /// The model thread wakes `w` after every pass that did work (the engines' thread, which sleeps when idle:
    /// [`spawn_engines`] sets it). The first one set stays; without a model thread, nothing to do.
    pub fn wake_after_work(&self, w: Waker) {
        if let Stepper::Thread { engines, .. } = &self.stepper {
            let _ = engines.set(w);
        }
    }

    /// Ends the model thread's idle sleep (after a write it must see).
    fn wake_model(&self) {
        if let Stepper::Thread { wake, .. } = &self.stepper {
            wake.wake();
        }
    }

    /// Sets or clears Bus Master Enable, as a host writing the PCI command register's bit 2 would: cleared,
    /// the model makes no DMA (`mlx5_model::Model::set_bus_master`: no command, no queue, no frame, no RoCE
    /// request executed). Returns false when the model runs in another process, which has no configuration
    /// space on this side (the fatal path's port-down command is then what stops it).
    pub fn set_bus_master(&self, on: bool) -> bool {
        match self.model() {
            Some(mut m) => {
                m.set_bus_master(on);
                true
            }
            None => false,
        }
    }

    pub fn bar(&self) -> &Arc<dyn Memory> {
        &self.bar
    }

    /// Bytes of RAM still free for DMA allocations.
    pub fn dma_free_bytes(&self) -> u64 {
        self.arena.read().unwrap_or_else(|e| e.into_inner()).free_bytes()
    }

    /// DMA reads, writes and frees refused so far (a handle not live, or a range past its end).
    pub fn dma_faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// Checks `len` bytes at `offset` in `buf` against the live allocations.
    fn check(&self, buf: DmaBuf, offset: usize, len: usize) -> Result<(), DmaFault> {
        self.arena.read().unwrap_or_else(|e| e.into_inner()).live.get(buf, offset, len).map(|_| ())
    }

    fn fault(&self, what: &str, buf: DmaBuf, offset: usize, len: usize, why: DmaFault) {
        if self.faults.fetch_add(1, Ordering::Relaxed) < 8 {
            eprintln!(
                "mlx5-hosted: DMA {what} {:#x}+{offset:#x} ({len:#x} bytes; handle {:#x} bytes, id {}) refused: {why}",
                buf.addr(),
                buf.len(),
                buf.id()
            );
        }
    }
}

/// The model thread: a pass of the model (and of its RoCEv2 responder on `udp`) after another while there is
/// work, each one that did some waking the engines; idle, it backs off (`mlx5_model::idle::Backoff`), its
/// sleeps cut short by a held command coming due and ended by `wake` (a BAR write) or a datagram ([`idle`]).
fn model_thread(
    stop: &AtomicBool,
    model: &Mutex<Model>,
    mut udp: Option<mlx5_model::roce::udp::UdpResponder>,
    wake: &idle::ModelWake,
    engines: &OnceLock<Waker>,
) {
    idle::tight_timer_slack();
    let pass = |udp: &mut Option<mlx5_model::roce::udp::UdpResponder>| {
        let mut m = model.lock().unwrap_or_else(|e| e.into_inner());
        let did = m.poll();
        let sent = udp.as_mut().map_or(0, |u| mlx5_model::dataplane::poll_udp(&mut m, u).unwrap_or(0));
        let did = did | (sent > 0);
        if did && let Some(w) = engines.get() {
            w.wake_by_ref();
        }
        did
    };
    // The socket outlives the loop (`udp` is this thread's).
    let socket = udp.as_ref().map(|u| u.socket().as_raw_fd());
    let mut backoff = Backoff::capped(idle::MAX_SLEEP);
    while !stop.load(Ordering::Relaxed) {
        if pass(&mut udp) {
            backoff.reset();
            continue;
        }
        let due = model.lock().unwrap_or_else(|e| e.into_inner()).next_due();
        match backoff.step().until(due.map(|t| t.saturating_duration_since(Instant::now()))) {
            Idle::Sleep(d) => {
                // One more pass once the sleep is announced: a doorbell rung before that is seen by it.
                if wake.sleep(d, socket, || pass(&mut udp)) {
                    backoff.reset();
                }
            }
            step => step.take(),
        }
    }
}

/// The engines on a thread of their own (a core of the hosted layout) until `stop` is set. Idle, the thread
/// backs off (spin, yield, then parks up to [`idle::MAX_SLEEP`] at a time); a command `client` queues and
/// every model pass that did work (a completion, an event) unpark it at once.
pub fn spawn_engines(
    cmd: CommandEngine<HostedPlatform>,
    ev: EventEngine<HostedPlatform>,
    client: &mut Client,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    spawn_engines_then(cmd, ev, client, stop, || {})
}

/// [`spawn_engines`], calling `after_work` after every pass of the engines that did work (a command completed,
/// an event came): the hosted appliance wakes its service thread there, so a completion is taken when it lands.
pub fn spawn_engines_then(
    mut cmd: CommandEngine<HostedPlatform>,
    mut ev: EventEngine<HostedPlatform>,
    client: &mut Client,
    stop: Arc<AtomicBool>,
    mut after_work: impl FnMut() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let platform = cmd.platform().clone();
    let handle = std::thread::Builder::new().name("mlx5-engines".into()).spawn(move || {
        let mut backoff = Backoff::capped(idle::MAX_SLEEP);
        while !stop.load(Ordering::Relaxed) {
            if cmd.poll() | ev.poll() {
                after_work();
                backoff.reset();
                continue;
            }
            match backoff.step() {
                Idle::Sleep(d) => std::thread::park_timeout(d),
                step => step.take(),
            }
        }
    })?;
    let waker = Waker::from(Arc::new(idle::Unpark(handle.thread().clone())));
    client.set_waker(waker.clone());
    platform.wake_after_work(waker);
    Ok(handle)
}

/// A zeroed shared mapping of `len` bytes: a file in /dev/shm (or the temporary directory), mapped, then
/// unlinked (the mapping keeps the memory).
fn scratch_mapping(what: &str, len: u64) -> mlx5_model::shm::SharedFile {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("leasebox-hosted-{}-{n}-{what}.shm", std::process::id()));
    let f = std::fs::File::create(&path).expect("create a scratch mapping file");
    f.set_len(len).expect("size the scratch mapping file");
    let m = mlx5_model::shm::SharedFile::open(&path, Some(len), Duration::from_secs(1)).expect("map the scratch file");
    let _ = std::fs::remove_file(&path);
    m
}

impl Drop for HostedPlatform {
    fn drop(&mut self) {
        if let Stepper::Thread { stop, handle, wake, .. } = &mut self.stepper {
            stop.store(true, Ordering::Relaxed);
            wake.wake();
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Platform for HostedPlatform {
    fn bar_read32(&self, offset: usize) -> u32 {
        self.bar.read_be32(offset as u64).unwrap_or(u32::MAX)
    }

    /// Every BAR write the driver makes is one the model must act on (a doorbell, an initialization-segment
    /// field), so it ends the model thread's idle sleep.
    fn bar_write32(&self, offset: usize, value: u32) {
        let _ = self.bar.write_be32(offset as u64, value);
        self.wake_model();
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf> {
        let (buf, used) = self.arena.write().unwrap_or_else(|e| e.into_inner()).alloc_live(len, align.max(1) as u64)?;
        let zero = [0u8; 4096];
        let mut at = 0;
        while at < used as usize {
            let n = (used as usize - at).min(zero.len());
            self.ram.write(buf.at(at as u64), &zero[..n]).ok()?;
            at += n;
        }
        Some(buf)
    }

    /// Memory never handed out before is still zero (a fresh mapping) and is not touched; the rest may hold
    /// old data, and is left for the caller to clear.
    fn dma_alloc_uncleared(&self, len: usize, align: usize) -> Option<(DmaBuf, bool)> {
        let (buf, used) = self.arena.write().unwrap_or_else(|e| e.into_inner()).alloc_live(len, align.max(1) as u64)?;
        Some((buf, used == 0))
    }

    fn dma_free(&self, buf: DmaBuf) {
        let freed = self.arena.write().unwrap_or_else(|e| e.into_inner()).free_live(buf);
        if let Err(why) = freed {
            self.fault("free of", buf, 0, buf.len(), why);
        }
    }

    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        if let Err(why) = self.check(buf, offset, out.len()) {
            out.fill(0xff);
            return self.fault("read of", buf, offset, out.len(), why);
        }
        if self.ram.read(buf.at(offset as u64), out).is_err() {
            out.fill(0xff);
        }
    }

    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        if let Err(why) = self.check(buf, offset, data.len()) {
            return self.fault("write of", buf, offset, data.len(), why);
        }
        let _ = self.ram.write(buf.at(offset as u64), data);
    }

    /// One check, then 64 KiB writes.
    fn dma_zero(&self, buf: DmaBuf, offset: usize, len: usize) {
        if let Err(why) = self.check(buf, offset, len) {
            return self.fault("zeroing of", buf, offset, len, why);
        }
        static Z: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = 0;
        while at < len {
            let k = (len - at).min(Z.len());
            let _ = self.ram.write(buf.at((offset + at) as u64), &Z[..k]);
            at += k;
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn relax(&self) {
        self.clock.relaxed();
        match &self.stepper {
            Stepper::InProcess(m) => {
                m.lock().unwrap_or_else(|e| e.into_inner()).poll();
            }
            _ => std::hint::spin_loop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_merges_and_aligns() {
        let mut a = Arena::new(0x1000, 0x10000, true);
        let x = a.alloc(0x100, 0x1000).unwrap();
        let y = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!((x, y), (0x1000, 0x2000));
        a.free(x, 0x100);
        a.free(y, 0x1000);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.free_bytes(), 0xf000);
        assert!(a.alloc(0x10000, 8).is_none());
    }

    #[test]
    fn only_memory_handed_out_before_is_cleared_again() {
        let addr_used = |r: Option<(DmaBuf, u64)>| r.map(|(b, used)| (b.addr(), used));
        let mut a = Arena::new(0x1000, 0x10000, true);
        let (first, used) = a.alloc_live(0x2000, 0x1000).unwrap();
        assert_eq!((first.addr(), used), (0x1000, 0), "fresh memory");
        assert_eq!(a.free_live(first), Ok(()));
        // Straddles the memory handed out before and fresh memory above it.
        assert_eq!(addr_used(a.alloc_live(0x3000, 0x1000)), Some((0x1000, 0x2000)));
        // Memory of unknown contents is always cleared whole.
        let mut b = Arena::new(0x1000, 0x10000, false);
        assert_eq!(addr_used(b.alloc_live(0x2000, 0x1000)), Some((0x1000, 0x2000)));
        // Through a platform over fresh RAM: a reused allocation reads as zeros.
        let p = HostedPlatform::with_model(ModelConfig::instant(), 4 << 20, ModelMode::InProcess);
        let x = p.dma_alloc(64, 64).unwrap();
        p.dma_write(x, 0, &[7; 64]);
        p.dma_free(x);
        let y = p.dma_alloc(64, 64).unwrap();
        let mut buf = [1u8; 64];
        p.dma_read(y, 0, &mut buf);
        assert_eq!((x.addr(), buf), (y.addr(), [0; 64]));
    }

    #[test]
    fn accesses_and_frees_are_checked_against_live_allocations() {
        let p = HostedPlatform::attach(Arc::new(VecMemory::new(4096)), Arc::new(VecMemory::new(4 << 20)));
        let h = p.dma_alloc(100, 64).unwrap();
        let a = h.addr();
        p.dma_write(h, 96, &[1, 2, 3, 4]);
        let mut b = [0u8; 4];
        p.dma_read(h, 96, &mut b);
        assert_eq!((b, p.dma_faults()), ([1, 2, 3, 4], 0));
        assert_eq!(p.dma_read32(h, 96), 0x0102_0304);
        p.dma_write32(h, 0, 0xdead_beef);
        assert_eq!((p.dma_read8(h, 0), p.dma_read8(h, 3), p.dma_faults()), (0xde, 0xef, 0));
        p.dma_read(h, 98, &mut b);
        assert_eq!((b, p.dma_faults()), ([0xff; 4], 1), "past the end reads all ones");
        p.dma_write(h, 100, &[9]);
        assert_eq!(p.dma_faults(), 2, "a write past the end is dropped");
        p.dma_write(h, usize::MAX, &[9, 9]);
        assert_eq!(p.dma_faults(), 3, "an offset that overflows is past the end");
        let mut tail = [0u8; 1];
        p.ram().read(a + 100, &mut tail).unwrap();
        assert_eq!(tail, [0], "nothing was written past the end");
        // A handle naming a longer buffer at the same address was never handed out.
        let forged = DmaBuf::new(a, 4096, h.id());
        assert_eq!(p.dma_read32(forged, 96), u32::MAX);
        p.dma_write(forged, 200, &[9]);
        assert_eq!(p.dma_faults(), 5, "a forged handle reaches nothing");
        p.dma_free(DmaBuf::new(a, 64, h.id()));
        assert_eq!(p.dma_faults(), 6, "a handle with the wrong length frees nothing");
        p.dma_read(h, 0, &mut b);
        assert_eq!(p.dma_faults(), 6, "still live");
        p.dma_free(h);
        p.dma_read(h, 0, &mut b);
        assert_eq!((b, p.dma_faults()), ([0xff; 4], 7), "freed memory is no longer reachable");
        assert!(p.dma_alloc(0, 8).is_none());
    }

    #[test]
    fn a_stale_handle_reaches_nothing_where_its_address_is_handed_out_again() {
        let p = HostedPlatform::attach(Arc::new(VecMemory::new(4096)), Arc::new(VecMemory::new(4 << 20)));
        let old = p.dma_alloc(100, 64).unwrap();
        p.dma_write(old, 0, &[5; 100]);
        p.dma_free(old);
        let new = p.dma_alloc(100, 64).unwrap();
        assert_eq!((new.addr(), new.len()), (old.addr(), old.len()), "the arena hands the same place out again");
        assert_ne!(new.id(), old.id());
        p.dma_write(new, 0, &[1, 2, 3, 4]);
        assert_eq!(p.dma_faults(), 0);
        // Through the stale handle: reads see all ones, writes change nothing, a free frees nothing.
        let mut b = [0u8; 4];
        p.dma_read(old, 0, &mut b);
        assert_eq!((b, p.dma_read8(old, 1), p.dma_read32(old, 0)), ([0xff; 4], 0xff, u32::MAX));
        p.dma_write(old, 0, &[9; 4]);
        p.dma_write32(old, 0, 0);
        p.dma_free(old);
        assert_eq!(p.dma_faults(), 6, "every access and the free through the stale handle are refused");
        p.dma_read(new, 0, &mut b);
        assert_eq!(b, [1, 2, 3, 4], "the new allocation is untouched and still live");
        assert_eq!(p.dma_faults(), 6);
        p.dma_free(new);
        assert_eq!(p.dma_faults(), 6, "and frees normally");
    }
}
