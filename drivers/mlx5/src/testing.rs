//! The driver's test platform (unit tests only): DMA memory in one vector, allocations checked, BAR writes
//! recorded in order, reads of BAR registers all ones. The rings' and queues' tests share it.

use crate::platform::{DmaBuf, LiveAllocations, Platform};
use spin::Mutex;

/// Bytes of DMA memory the platform has.
pub(crate) const MEM: usize = 1 << 20;

/// DMA memory in a vector (device address = offset), BAR writes recorded in order.
pub(crate) struct Fake {
    pub(crate) mem: Mutex<Vec<u8>>,
    pub(crate) live: Mutex<LiveAllocations<()>>,
    pub(crate) next: Mutex<u64>,
    pub(crate) bar: Mutex<Vec<(usize, u32)>>,
}

impl Fake {
    pub(crate) fn new() -> Fake {
        Fake {
            mem: Mutex::new(vec![0; MEM]),
            live: Mutex::new(LiveAllocations::new()),
            next: Mutex::new(0x1000),
            bar: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn bytes(&self, b: DmaBuf, at: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.dma_read(b, at, &mut v);
        v
    }
}

impl Platform for Fake {
    fn bar_read32(&self, _offset: usize) -> u32 {
        u32::MAX
    }
    fn bar_write32(&self, offset: usize, value: u32) {
        self.bar.lock().push((offset, value));
    }
    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf> {
        let mut next = self.next.lock();
        let a = next.next_multiple_of(align as u64);
        *next = a + len as u64;
        (*next as usize <= MEM).then(|| self.live.lock().insert(a, len, ()).0)
    }
    fn dma_free(&self, buf: DmaBuf) {
        self.live.lock().remove(buf).expect("freeing a live buffer");
    }
    fn dma_read(&self, buf: DmaBuf, offset: usize, out: &mut [u8]) {
        self.live.lock().get(buf, offset, out.len()).expect("read inside a live buffer");
        let a = buf.at(offset as u64) as usize;
        out.copy_from_slice(&self.mem.lock()[a..a + out.len()]);
    }
    fn dma_write(&self, buf: DmaBuf, offset: usize, data: &[u8]) {
        self.live.lock().get(buf, offset, data.len()).expect("write inside a live buffer");
        let a = buf.at(offset as u64) as usize;
        self.mem.lock()[a..a + data.len()].copy_from_slice(data);
    }
    fn now_ns(&self) -> u64 {
        0
    }
}
