//! The completion and event queue check shared by the fuzz target `rings` (`fuzz_targets/rings.rs`,
//! libFuzzer, nightly) and its stable twin (`drivers/mlx5/tests/rings_twin.rs`); both include this file by
//! path.
//!
//! The device writes CQEs and EQEs into DMA memory and the driver reads them back: every byte of a ring entry
//! is the device's to choose. One input drives one ring as the device would. Byte 0: bit 0 picks the ring (0 a
//! CQ, `cq::CqRing`; 1 an EQ, `eq::EventRing`), bits 1..3 its log size (1 to 128 entries). The rest is a
//! list of device writes of 65 bytes each (an entry index, then the entry's 64 bytes; a short last one is
//! padded with zeros); after each write the driver polls the ring until it is empty. Checked:
//! - no panic, whatever the bytes;
//! - the driver returns only entries software owns (owner bit = the counter's wrap bit; a CQE's opcode not
//!   INVALID), in ring order, each exactly the bytes at the counter's slot (`Cqe::parse` / `Eqe::parse`);
//! - one drain returns at most the ring's size (a device cannot keep the driver polling);
//! - the CQ's doorbell record and the EQ's doorbell carry the counter the driver consumed up to;
//! - every EQE decodes (`Eqe::event`, `page_request`, `PortState::from_event`) consistently.

use leasebox_mlx5::cq::CqRing;
use leasebox_mlx5::driver::PortState;
use leasebox_mlx5::eq::EventRing;
use leasebox_mlx5::handles::{Eqn, UarPage};
use leasebox_mlx5::ifc::cq::{CQE_OP_OWN_BYTE, CQE_SIZE, Cqe, MLX5_CQE_INVALID};
use leasebox_mlx5::ifc::eq::{
    EQE_OWNER_BYTE, EQE_SIZE, Eqe, Event, MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI, MLX5_EVENT_TYPE_PORT_CHANGE,
    eq_doorbell_value, page_request,
};
use leasebox_mlx5::platform::{DmaBuf, PAGE_SIZE, Platform};
use std::sync::Mutex;

/// What one input exercised (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub cqes: u64,
    pub cqe_errors: u64,
    pub eqes: u64,
    pub page_requests: u64,
    pub port_changes: u64,
    pub wraps: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.cqes += o.cqes;
        self.cqe_errors += o.cqe_errors;
        self.eqes += o.eqes;
        self.page_requests += o.page_requests;
        self.port_changes += o.port_changes;
        self.wraps += o.wraps;
    }
}

/// DMA memory as plain vectors and a log of BAR writes: the device's side of the rings, and nothing else.
#[derive(Default)]
pub struct Memory {
    bufs: Mutex<Vec<(DmaBuf, Vec<u8>)>>,
    bar_writes: Mutex<Vec<(usize, u32)>>,
}

impl Memory {
    fn with<R>(&self, buf: DmaBuf, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let mut bufs = self.bufs.lock().unwrap();
        let (_, bytes) = bufs.iter_mut().find(|(b, _)| *b == buf).expect("a live buffer");
        f(bytes)
    }
    /// The device writes `bytes` at `offset` of `buf`.
    pub fn device_write(&self, buf: DmaBuf, offset: usize, bytes: &[u8]) {
        self.with(buf, |m| m[offset..offset + bytes.len()].copy_from_slice(bytes));
    }
    pub fn device_read(&self, buf: DmaBuf, offset: usize, len: usize) -> Vec<u8> {
        self.with(buf, |m| m[offset..offset + len].to_vec())
    }
    pub fn last_bar_write(&self) -> Option<(usize, u32)> {
        self.bar_writes.lock().unwrap().last().copied()
    }
}

impl Platform for Memory {
    fn bar_read32(&self, _offset: usize) -> u32 {
        0
    }
    fn bar_write32(&self, offset: usize, value: u32) {
        self.bar_writes.lock().unwrap().push((offset, value));
    }
    fn dma_alloc(&self, len: usize, _align: usize) -> Option<DmaBuf> {
        let mut bufs = self.bufs.lock().unwrap();
        let id = bufs.len() as u64;
        let buf = DmaBuf::new(0x10_0000 * (id + 1), len, id);
        bufs.push((buf, vec![0; len]));
        Some(buf)
    }
    fn dma_free(&self, buf: DmaBuf) {
        self.bufs.lock().unwrap().retain(|(b, _)| *b != buf);
    }
    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        self.with(buf, |m| out.copy_from_slice(&m[offset..offset + out.len()]));
    }
    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        self.device_write(buf, offset, data);
    }
    fn now_ns(&self) -> u64 {
        0
    }
}

/// The size of one device write in an input: the entry index, then the entry.
pub const WRITE_LEN: usize = 1 + 64;

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let Some((&head, writes)) = data.split_first() else { return n };
    let log_size = u32::from(head >> 1) & 7;
    let mem = Memory::default();
    if head & 1 == 0 {
        cq(&mem, log_size, writes, &mut n);
    } else {
        eq(&mem, log_size, writes, &mut n);
    }
    n
}

/// Splits the device writes: (entry index within the ring, 64 bytes).
fn each_write(writes: &[u8], entries: usize, mut f: impl FnMut(usize, [u8; 64])) {
    for w in writes.chunks(WRITE_LEN) {
        let mut e = [0u8; 64];
        e[..w.len() - 1].copy_from_slice(&w[1..]);
        f(usize::from(w[0]) % entries, e);
    }
}

fn cq(mem: &Memory, log_size: u32, writes: &[u8], n: &mut Counts) {
    let mut ring = CqRing::alloc(mem, log_size).expect("the fake platform never runs out");
    let entries = 1usize << log_size;
    assert!(ring.buf.len() >= entries * CQE_SIZE && ring.buf.len() >= PAGE_SIZE);
    for i in 0..entries {
        let e = mem.device_read(ring.buf, i * CQE_SIZE, CQE_SIZE);
        assert_eq!(e[CQE_OP_OWN_BYTE] >> 4, MLX5_CQE_INVALID, "a fresh CQE is INVALID");
    }
    assert!(ring.next(mem).is_none(), "a fresh CQ is empty");
    each_write(writes, entries, |index, entry| {
        mem.device_write(ring.buf, index * CQE_SIZE, &entry);
        let mut drained = 0;
        loop {
            let cc = ring.consumer_counter();
            let at = (cc as usize & (entries - 1)) * CQE_SIZE;
            let bytes = mem.device_read(ring.buf, at, CQE_SIZE);
            let Some(cqe) = ring.next(mem) else {
                assert_eq!(ring.consumer_counter(), cc, "an empty poll consumes nothing");
                let owned = bytes[CQE_OP_OWN_BYTE] >> 4 != MLX5_CQE_INVALID
                    && u32::from(bytes[CQE_OP_OWN_BYTE] & 1) == (cc >> log_size) & 1;
                assert!(!owned, "the CQE at {cc} is software's yet was not returned");
                break;
            };
            drained += 1;
            assert!(drained <= entries, "one drain returned more CQEs than the ring holds");
            assert_eq!(cqe, Cqe::parse(&bytes), "the CQE returned is the one at the counter's slot");
            assert!(cqe.is_sw_owned(cc, log_size as u8), "{cqe:?} at {cc}");
            assert_ne!(cqe.opcode, MLX5_CQE_INVALID);
            assert!(cqe.opcode <= 0xf && cqe.qpn <= 0xff_ffff);
            assert_eq!(ring.consumer_counter(), cc.wrapping_add(1));
            assert_eq!(mem.device_read(ring.dbr, 0, 4), (ring.consumer_counter() & 0xff_ffff).to_be_bytes());
            if ring.consumer_counter() & (entries as u32 - 1) == 0 {
                n.wraps += 1;
            }
            n.cqes += 1;
            n.cqe_errors += u64::from(cqe.is_error());
        }
    });
    ring.release(mem);
    assert!(mem.bufs.lock().unwrap().is_empty(), "release frees the ring and its doorbell record");
}

fn eq(mem: &Memory, log_size: u32, writes: &[u8], n: &mut Counts) {
    let mut ring = EventRing::alloc(mem, log_size).expect("the fake platform never runs out");
    let eqn = Eqn(0x17);
    ring.bind(eqn, UarPage(3));
    let entries = 1usize << log_size;
    assert!(ring.next(mem).is_none(), "a fresh EQ is empty");
    let mut ci = 0u32;
    each_write(writes, entries, |index, entry| {
        mem.device_write(ring.buf, index * EQE_SIZE, &entry);
        let mut drained = 0;
        loop {
            let at = (ci as usize & (entries - 1)) * EQE_SIZE;
            let bytes = mem.device_read(ring.buf, at, EQE_SIZE);
            let Some(eqe) = ring.next(mem) else {
                let owned = u32::from(bytes[EQE_OWNER_BYTE] & 1) == (ci >> log_size) & 1;
                assert!(!owned, "the EQE at {ci} is software's yet was not returned");
                break;
            };
            drained += 1;
            assert!(drained <= entries, "one drain returned more EQEs than the ring holds");
            assert_eq!(eqe, Eqe::parse(&bytes), "the EQE returned is the one at the counter's slot");
            assert!(eqe.is_sw_owned(ci, log_size as u8));
            ci = ci.wrapping_add(1);
            if ci & (entries as u32 - 1) == 0 {
                n.wraps += 1;
            }
            n.eqes += 1;
            event(&eqe, &bytes, n);
        }
        ring.update_ci(mem);
        if ci != 0 {
            let off = 3 * PAGE_SIZE + MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI;
            assert_eq!(mem.last_bar_write(), Some((off, eq_doorbell_value(eqn, ci))), "the doorbell names ci {ci}");
        }
    });
    ring.release(mem);
    assert!(mem.bufs.lock().unwrap().is_empty(), "release frees the ring");
}

fn event(eqe: &Eqe, bytes: &[u8], n: &mut Counts) {
    let ev = eqe.event();
    match ev {
        Event::Completion { cqn } => assert!(cqn.0 <= 0xff_ffff),
        Event::PageRequest { function_id, num_pages, .. } => {
            n.page_requests += 1;
            let d = page_request(bytes).expect("a page request reads as one");
            assert_eq!((d.function_id, d.num_pages), (function_id, num_pages));
        }
        Event::Qp { qpn, .. } => assert!(qpn <= 0xff_ffff),
        Event::CqError { cqn, .. } => assert!(cqn.0 <= 0xff_ffff),
        Event::PortChange { port, sub_type } => {
            n.port_changes += 1;
            assert_eq!((eqe.event_type, sub_type), (MLX5_EVENT_TYPE_PORT_CHANGE, eqe.sub_type));
            assert!(port <= 0xf);
        }
        Event::Command { .. } | Event::Other { .. } => {}
    }
    if !matches!(ev, Event::PageRequest { .. }) {
        assert!(page_request(bytes).is_none());
    }
    for port in 0..=16u8 {
        if PortState::from_event(eqe, port).is_some() {
            assert_eq!(ev, Event::PortChange { port, sub_type: eqe.sub_type }, "only a PORT_CHANGE moves a port");
        }
    }
}
