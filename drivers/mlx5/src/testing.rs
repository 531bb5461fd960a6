//! The driver's test platform, shipped with the crate: always built for its own unit tests, and for other
//! crates' tests with the `testing` feature (`[dev-dependencies] leasebox-mlx5 = { path = ..., features =
//! ["testing"] }`), as rust-vmm's `virtio-queue` ships its mock queues behind `test-utils`.
//!
//! [`Fake`] is a [`Platform`] with no device behind it: BAR0 registers in a map, DMA memory (sparse pages: any
//! device address can be backed, and what was never written reads zero) with every access checked against the
//! live allocations as the real platforms do, allocations from a bump allocator or at the addresses a test
//! scripts ([`Fake::script_allocations`]), and a virtual clock that moves only when the test moves it or when the driver relaxes. The test plays the
//! device: it sets registers ([`Fake::set_bar`]), writes what the device would write (CQEs, command
//! completions) and reads what the driver wrote (BAR writes in order, doorbells, memory by device address).
//!
//! A refused DMA access or free is counted, not fatal at once (a read sees all ones, as the platform contract
//! says); dropping a `Fake` that counted any fails the test, unless [`Fake::take_faults`] collected them.

extern crate std;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use spin::Mutex;

use crate::cq::CqRing;
use crate::ifc::cq::CQE_SIZE;
use crate::initseg;
use crate::platform::{DmaBuf, LiveAllocations, Platform};

/// Bytes of DMA memory [`Fake::new`]'s bump allocator hands out.
pub const MEM: usize = 4 << 20;

/// The backing memory's page size (any size would do; the driver's own page size keeps pieces aligned).
const PAGE: usize = crate::platform::PAGE_SIZE;

/// Where the first allocation starts (device address 0 is never handed out).
const FIRST_ADDR: u64 = 0x1000;

/// A command-queue entry's length (`cmd_queue_entry`).
const CMDQ_ENTRY_LEN: usize = 64;

/// What runs on every [`Platform::relax`], after the clock moved: the platform and the relax's number (from 1).
type RelaxHook = Box<dyn FnMut(&Fake, u64) + Send>;

/// BAR0 registers, DMA memory, a virtual clock (see the module documentation).
pub struct Fake {
    regs: Mutex<BTreeMap<usize, u32>>,
    writes: Mutex<Vec<(usize, u32)>>,
    /// Backing pages by page number; a page nobody wrote reads zero.
    mem: Mutex<BTreeMap<u64, Box<[u8; PAGE]>>>,
    /// The end of the bump allocator's memory.
    mem_len: u64,
    /// Addresses the next allocations take, in order, instead of the bump allocator's (then none).
    script: Mutex<Option<alloc::collections::VecDeque<u64>>>,
    /// Every allocation handed out and every free of a live handle, in order.
    allocated: Mutex<Vec<DmaBuf>>,
    freed: Mutex<Vec<DmaBuf>>,
    /// (handle, offset, length) of every accepted DMA write, once [`Fake::record_dma_writes`] asked for it.
    dma_writes: Mutex<Option<Vec<(DmaBuf, usize, usize)>>>,
    live: Mutex<LiveAllocations<()>>,
    next: Mutex<u64>,
    allocations: AtomicU64,
    faults: AtomicU64,
    now: AtomicU64,
    relax_step_ns: AtomicU64,
    relaxes: AtomicU64,
    on_relax: Mutex<Option<RelaxHook>>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake::new()
    }
}

impl Fake {
    /// [`MEM`] bytes of DMA memory, every register 0, the clock at 0 and still on a relax.
    pub fn new() -> Fake {
        Fake::with_memory(MEM)
    }

    /// `bytes` of DMA memory for the bump allocator (allocations beyond it fail), otherwise as [`Fake::new`].
    pub fn with_memory(bytes: usize) -> Fake {
        Fake {
            regs: Mutex::new(BTreeMap::new()),
            writes: Mutex::new(Vec::new()),
            mem: Mutex::new(BTreeMap::new()),
            mem_len: bytes as u64,
            script: Mutex::new(None),
            allocated: Mutex::new(Vec::new()),
            freed: Mutex::new(Vec::new()),
            dma_writes: Mutex::new(None),
            live: Mutex::new(LiveAllocations::new()),
            next: Mutex::new(FIRST_ADDR),
            allocations: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            now: AtomicU64::new(0),
            relax_step_ns: AtomicU64::new(0),
            relaxes: AtomicU64::new(0),
            on_relax: Mutex::new(None),
        }
    }

    /// An initialization segment a command queue can be set up on: `cmd_interface_rev` 5 and a queue of
    /// `2^log_size` entries `2^log_stride` bytes apart (both read-only to the driver, as on the device).
    pub fn with_cmdq(log_size: u32, log_stride: u32) -> Fake {
        let f = Fake::new();
        f.set_bar(initseg::CMDIF_REV_FW_SUB, initseg::CMD_INTERFACE_REV << 16);
        f.set_bar(initseg::CMDQ_ADDR_L_SZ, (log_size << 4) | log_stride);
        f
    }

    // ---- BAR0

    /// Sets a register as the device would (not recorded as a write).
    pub fn set_bar(&self, offset: usize, value: u32) {
        self.regs.lock().insert(offset, value);
    }

    /// A register's value now (0 when nothing set it).
    pub fn bar(&self, offset: usize) -> u32 {
        self.regs.lock().get(&offset).copied().unwrap_or(0)
    }

    /// Every BAR write the driver made, in order.
    pub fn bar_writes(&self) -> Vec<(usize, u32)> {
        self.writes.lock().clone()
    }

    /// The values the driver wrote to the command doorbell (`CMD_DBELL`), in order.
    pub fn doorbells(&self) -> Vec<u32> {
        self.writes.lock().iter().filter(|(o, _)| *o == initseg::CMD_DBELL).map(|&(_, v)| v).collect()
    }

    // ---- DMA memory

    /// `len` bytes at `at` in `buf`, read through the handle (checked, like the driver's reads).
    pub fn bytes(&self, buf: DmaBuf, at: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.dma_read(buf, at, &mut v);
        v
    }

    /// The device's read at device address `addr` (any address: what was never written reads zero).
    pub fn mem_read(&self, addr: u64, out: &mut [u8]) {
        let mem = self.mem.lock();
        let mut done = 0;
        while done < out.len() {
            let a = addr.wrapping_add(done as u64);
            let (page, at) = (a / PAGE as u64, a as usize % PAGE);
            let n = (PAGE - at).min(out.len() - done);
            match mem.get(&page) {
                Some(p) => out[done..done + n].copy_from_slice(&p[at..at + n]),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// The device's write at device address `addr` (any address).
    pub fn mem_write(&self, addr: u64, data: &[u8]) {
        let mut mem = self.mem.lock();
        let mut done = 0;
        while done < data.len() {
            let a = addr.wrapping_add(done as u64);
            let (page, at) = (a / PAGE as u64, a as usize % PAGE);
            let n = (PAGE - at).min(data.len() - done);
            let p = mem.entry(page).or_insert_with(|| Box::new([0; PAGE]));
            p[at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// From now on allocations take these addresses in order (each as long as asked), and fail once they are
    /// used up: memory wherever the test wants it (above 4 GiB, out of order, with gaps).
    pub fn script_allocations(&self, addrs: impl IntoIterator<Item = u64>) {
        *self.script.lock() = Some(addrs.into_iter().collect());
    }

    /// Every allocation handed out so far, in order.
    pub fn allocated(&self) -> Vec<DmaBuf> {
        self.allocated.lock().clone()
    }

    /// Every free of a live handle so far, in order (refused frees are faults, not listed).
    pub fn freed(&self) -> Vec<DmaBuf> {
        self.freed.lock().clone()
    }

    /// From now on records every accepted DMA write as (handle, offset, length): [`Fake::dma_writes`].
    pub fn record_dma_writes(&self) {
        self.dma_writes.lock().get_or_insert_with(Vec::new);
    }

    /// The DMA writes recorded since [`Fake::record_dma_writes`] (none before it).
    pub fn dma_writes(&self) -> Vec<(DmaBuf, usize, usize)> {
        self.dma_writes.lock().clone().unwrap_or_default()
    }

    /// Allocations live now.
    pub fn live_allocations(&self) -> usize {
        self.live.lock().len()
    }

    /// Allocations handed out so far (freed ones included).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Refused DMA accesses and frees so far.
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// Returns the refused accesses so far and forgets them (for a test that expects some).
    pub fn take_faults(&self) -> u64 {
        self.faults.swap(0, Ordering::Relaxed)
    }

    // ---- the clock

    /// Sets the clock to `ns`.
    pub fn set_now_ns(&self, ns: u64) {
        self.now.store(ns, Ordering::Relaxed);
    }

    /// Sets the clock to `us` microseconds.
    pub fn at_us(&self, us: u64) {
        self.set_now_ns(us * 1000);
    }

    /// Moves the clock on by `ns`.
    pub fn advance_ns(&self, ns: u64) {
        self.now.fetch_add(ns, Ordering::Relaxed);
    }

    /// How far each [`Platform::relax`] moves the clock (0, the default: not at all).
    pub fn set_relax_step_ns(&self, ns: u64) {
        self.relax_step_ns.store(ns, Ordering::Relaxed);
    }

    /// Relaxes so far.
    pub fn relaxes(&self) -> u64 {
        self.relaxes.load(Ordering::Relaxed)
    }

    /// Runs `hook` on every relax from now on, after the clock moved, with the relax's number: the device's
    /// part of a wait (the driver polls, the device answers after so many polls).
    pub fn on_relax(&self, hook: impl FnMut(&Fake, u64) + Send + 'static) {
        *self.on_relax.lock() = Some(Box::new(hook));
    }

    // ---- the device's side of the queues

    /// The device address of command-queue entry `slot`, from the queue address the driver wrote and the
    /// stride in `CMDQ_ADDR_L_SZ`.
    pub fn cmdq_entry_addr(&self, slot: u8) -> u64 {
        let lo = self.bar(initseg::CMDQ_ADDR_L_SZ);
        let base = (u64::from(self.bar(initseg::CMDQ_ADDR_H)) << 32) | u64::from(lo & !0xfff);
        base + (u64::from(slot) << (lo & 0xf))
    }

    /// Command-queue entry `slot` as the device reads it.
    pub fn cmdq_entry(&self, slot: u8) -> [u8; CMDQ_ENTRY_LEN] {
        let mut e = [0u8; CMDQ_ENTRY_LEN];
        self.mem_read(self.cmdq_entry_addr(slot), &mut e);
        e
    }

    /// The firmware finishes the command in `slot`: the output's `status` and `syndrome` in the entry's inline
    /// output, then ownership back to software (delivery status 0).
    pub fn complete_command(&self, slot: u8, status: u8, syndrome: u32) {
        let e = self.cmdq_entry_addr(slot);
        let mut out = [0u8; 8];
        out[0] = status;
        out[4..].copy_from_slice(&syndrome.to_be_bytes());
        self.mem_write(e + 0x20, &out);
        self.mem_write(e + 0x3f, &[0]);
    }

    /// The device writes a CQE at index `i` of `cq` (the owner bit of `i`'s pass): `opcode`, `wqe_counter`,
    /// `byte_cnt` and an error `syndrome` (0 for none).
    pub fn write_cqe(&self, cq: &CqRing, i: usize, opcode: u8, wqe_counter: u16, byte_cnt: u32, syndrome: u8) {
        let mut e = [0u8; CQE_SIZE];
        e[0x2c..0x30].copy_from_slice(&byte_cnt.to_be_bytes());
        e[0x37] = syndrome;
        e[0x3c..0x3e].copy_from_slice(&wqe_counter.to_be_bytes());
        let pass = (i >> cq.log_size) & 1;
        e[0x3f] = (opcode << 4) | pass as u8;
        let at = (i & ((1 << cq.log_size) - 1)) * CQE_SIZE;
        self.dma_write(cq.buf, at, &e);
    }

    fn fault(&self) {
        self.faults.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(self.faults(), 0, "the driver made a DMA access or free the platform refused");
        }
    }
}

impl Platform for Fake {
    fn bar_read32(&self, offset: usize) -> u32 {
        self.bar(offset)
    }

    fn bar_write32(&self, offset: usize, value: u32) {
        self.writes.lock().push((offset, value));
        let value = if offset == initseg::CMDQ_ADDR_L_SZ {
            // The queue's size and stride nibbles are read-only.
            (value & !0xff) | (self.bar(offset) & 0xff)
        } else {
            value
        };
        self.set_bar(offset, value);
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf> {
        let a = match self.script.lock().as_mut() {
            Some(script) => script.pop_front()?,
            None => {
                let mut next = self.next.lock();
                let a = next.next_multiple_of(align as u64);
                let end = a.checked_add(len as u64)?;
                if end > self.mem_len {
                    return None;
                }
                *next = end;
                a
            }
        };
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let buf = self.live.lock().insert(a, len, ()).0;
        self.allocated.lock().push(buf);
        Some(buf)
    }

    fn dma_free(&self, buf: DmaBuf) {
        if self.live.lock().remove(buf).is_err() {
            self.fault();
        } else {
            self.freed.lock().push(buf);
        }
    }

    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        if self.live.lock().get(buf, offset, out.len()).is_err() {
            out.fill(0xff);
            self.fault();
            return;
        }
        self.mem_read(buf.at(offset as u64), out);
    }

    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        if self.live.lock().get(buf, offset, data.len()).is_err() {
            self.fault();
            return;
        }
        if let Some(log) = self.dma_writes.lock().as_mut() {
            log.push((buf, offset, data.len()));
        }
        self.mem_write(buf.at(offset as u64), data);
    }

    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn relax(&self) {
        let n = self.relaxes.fetch_add(1, Ordering::Relaxed) + 1;
        self.advance_ns(self.relax_step_ns.load(Ordering::Relaxed));
        if let Some(hook) = self.on_relax.lock().as_mut() {
            hook(self, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_accesses_are_counted_and_read_all_ones() {
        let p = Fake::with_memory(0x3000);
        let a = p.dma_alloc(16, 16).unwrap();
        assert_eq!(a.addr(), FIRST_ADDR);
        p.dma_write(a, 0, &[1, 2, 3, 4]);
        assert_eq!(p.bytes(a, 0, 4), [1, 2, 3, 4]);
        assert_eq!(p.faults(), 0);
        assert_eq!(p.bytes(a, 14, 4), [0xff; 4], "a read that leaves the handle");
        p.dma_write(a, 16, &[9]);
        p.dma_free(a);
        p.dma_free(a);
        p.dma_write(a, 0, &[9]);
        assert_eq!(p.take_faults(), 4, "out of bounds twice, a double free, a write through a freed handle");
        let mut m = [0u8; 4];
        p.mem_read(FIRST_ADDR, &mut m);
        assert_eq!(m, [1, 2, 3, 4], "refused writes changed nothing");
        assert!(p.dma_alloc(0x2001, 16).is_none(), "beyond the platform's memory");
        assert_eq!((p.allocations(), p.live_allocations()), (1, 0));
    }

    #[test]
    fn scripted_allocations_land_anywhere_and_frees_and_writes_are_listed() {
        let p = Fake::new();
        p.script_allocations([0x1_0000_0ff0, 0x2000]);
        let a = p.dma_alloc(64, 4096).unwrap();
        let b = p.dma_alloc(16, 16).unwrap();
        assert_eq!((a.addr(), b.addr()), (0x1_0000_0ff0, 0x2000), "where the script says, alignment aside");
        assert!(p.dma_alloc(16, 16).is_none(), "none once the script is used up");
        p.record_dma_writes();
        // Across a backing page boundary, above 4 GiB.
        p.dma_write(a, 8, &[7; 24]);
        let mut m = [0u8; 34];
        p.mem_read(0x1_0000_0ff0, &mut m);
        assert_eq!((m[7], m[8], m[31], m[32]), (0, 7, 7, 0));
        p.dma_free(b);
        p.dma_free(b);
        assert_eq!(p.take_faults(), 1, "the second free");
        assert_eq!((p.allocated(), p.freed(), p.dma_writes()), (vec![a, b], vec![b], vec![(a, 8, 24)]));
    }

    #[test]
    fn the_clock_moves_when_told_and_on_every_relax_and_the_hook_runs_after() {
        let p = Fake::new();
        p.at_us(3);
        p.relax();
        assert_eq!((p.now_ns(), p.relaxes()), (3_000, 1), "relaxing moves nothing by default");
        p.set_relax_step_ns(500);
        let seen = alloc::sync::Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        p.on_relax(move |f, n| s.lock().push((n, f.now_ns())));
        p.relax();
        p.relax();
        assert_eq!(*seen.lock(), [(2, 3_500), (3, 4_000)]);
    }

    #[test]
    fn bar_writes_are_recorded_and_the_queue_geometry_is_read_only() {
        let p = Fake::with_cmdq(5, 6);
        p.bar_write32(initseg::CMDQ_ADDR_H, 0);
        p.bar_write32(initseg::CMDQ_ADDR_L_SZ, 0x0001_2000);
        p.bar_write32(initseg::CMD_DBELL, 1 << 3);
        assert_eq!(p.bar(initseg::CMDQ_ADDR_L_SZ), 0x0001_2056);
        assert_eq!(p.cmdq_entry_addr(3), 0x0001_2000 + 3 * 64);
        assert_eq!(p.doorbells(), [1 << 3]);
        assert_eq!(p.bar_writes().len(), 3);
        assert_eq!(p.bar(initseg::HEALTH_COUNTER), 0, "a register nothing set reads 0");
    }
}
