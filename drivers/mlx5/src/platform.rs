//! What the driver needs from the world it runs in (docs/architecture.md, "The platform trait"): the HCA's BAR0
//! as 32-bit big-endian registers, DMA memory addressed by device address, a monotonic clock and a relax hint.
//! The kernel implements it on identity-mapped memory with volatile accesses; hosted mode implements it over
//! the model's shared files (device address = offset in the RAM file); unit tests over plain buffers.
//!
//! Everything here is safe to call: the unsafe accesses live in the implementations, which are small.

/// Size of the pages the HCA is given and of command-queue / queue buffers (`MLX5_ADAPTER_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

pub trait Platform: Sync {
    /// Reads the 32-bit register at BAR0 `offset`; the device stores it big-endian and the value returned
    /// is already in host order.
    fn bar_read32(&self, offset: usize) -> u32;

    /// Writes the 32-bit register at BAR0 `offset` (stored big-endian). Every earlier DMA write is visible
    /// to the device before this write reaches it (a doorbell is always written last).
    fn bar_write32(&self, offset: usize, value: u32);

    /// Zeroed DMA memory of `len` bytes aligned to `align` (a power of two, at most 4096); returns its device
    /// address, or `None` when exhausted.
    fn dma_alloc(&self, len: usize, align: usize) -> Option<u64>;

    /// Returns memory from [`Platform::dma_alloc`]; `len` is the length it was allocated with.
    fn dma_free(&self, addr: u64, len: usize);

    /// Reads DMA memory at device address `addr`. Aligned 4- and 8-byte pieces are single accesses.
    fn dma_read(&self, addr: u64, buf: &mut [u8]);

    /// Writes DMA memory at device address `addr`. Aligned 4- and 8-byte pieces are single accesses.
    fn dma_write(&self, addr: u64, data: &[u8]);

    /// Monotonic nanoseconds.
    fn now_ns(&self) -> u64;

    /// Called in every wait loop iteration (a `pause`, a yield, or a step of an in-process model).
    fn relax(&self) {}

    fn dma_read32(&self, addr: u64) -> u32 {
        let mut b = [0u8; 4];
        self.dma_read(addr, &mut b);
        u32::from_be_bytes(b)
    }

    fn dma_write32(&self, addr: u64, value: u32) {
        self.dma_write(addr, &value.to_be_bytes());
    }

    fn dma_read8(&self, addr: u64) -> u8 {
        let mut b = [0u8; 1];
        self.dma_read(addr, &mut b);
        b[0]
    }
}

/// A deadline on the platform's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(pub u64);

impl Deadline {
    pub fn after<P: Platform + ?Sized>(p: &P, ms: u64) -> Deadline {
        Deadline(p.now_ns().saturating_add(ms.saturating_mul(1_000_000)))
    }

    pub fn passed<P: Platform + ?Sized>(&self, p: &P) -> bool {
        p.now_ns() >= self.0
    }
}
