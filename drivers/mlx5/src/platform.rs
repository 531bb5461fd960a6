//! What the driver needs from the world it runs in (`docs/architecture.md`, "The platform trait"): the HCA's
//! BAR0 as 32-bit big-endian registers, DMA memory handed out as [`DmaBuf`] handles and addressed by device
//! address, a monotonic clock and a relax hint. The image implements it over the kernel's register windows and
//! DMA regions (`image/src/hca_platform.rs`); `mlx5-hosted` over the model's shared files (device address =
//! offset in the RAM file).
//!
//! Everything here is safe to call, and fails closed: implementations keep the live allocations and refuse
//! any DMA access that is not inside one (a read sees all ones, a write is dropped), and any free of a handle
//! that is not live, as BAR accesses outside the BAR read all ones.

/// Size of the pages the HCA is given and of command-queue / queue buffers (`MLX5_ADAPTER_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

/// DMA memory from [`Platform::dma_alloc`]: its device address, its length, and which allocation it is (the
/// platform's id for it). A free names exactly what it returns, and a handle kept past its free cannot free a
/// later allocation at the same address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DmaBuf {
    addr: u64,
    len: usize,
    id: u64,
}

impl DmaBuf {
    /// For platforms: the handle of allocation `id`, `len` bytes at device address `addr`.
    pub const fn new(addr: u64, len: usize, id: u64) -> DmaBuf {
        DmaBuf { addr, len, id }
    }

    /// The device address of its first byte.
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// Its length in bytes, as asked for.
    pub const fn len(self) -> usize {
        self.len
    }

    /// Whether it is empty (platforms hand out no empty buffers).
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The platform's id for the allocation.
    pub const fn id(self) -> u64 {
        self.id
    }

    /// The device address `offset` bytes in.
    pub const fn at(self, offset: u64) -> u64 {
        self.addr + offset
    }
}

pub trait Platform: Sync {
    /// Reads the 32-bit register at BAR0 `offset`; the device stores it big-endian and the value returned
    /// is already in host order.
    fn bar_read32(&self, offset: usize) -> u32;

    /// Writes the 32-bit register at BAR0 `offset` (stored big-endian). Every earlier DMA write is visible
    /// to the device before this write reaches it (a doorbell is always written last).
    fn bar_write32(&self, offset: usize, value: u32);

    /// Zeroed DMA memory of `len` (> 0) bytes aligned to `align` (a power of two), or `None` when exhausted.
    fn dma_alloc(&self, len: usize, align: usize) -> Option<DmaBuf>;

    /// Returns memory from [`Platform::dma_alloc`]. A handle that is not live frees nothing.
    fn dma_free(&self, buf: DmaBuf);

    /// Reads DMA memory at device address `addr`, which must lie inside one live allocation with the whole
    /// range (else `buf` is all ones). Aligned 4- and 8-byte pieces are single accesses.
    fn dma_read(&self, addr: u64, buf: &mut [u8]);

    /// Writes DMA memory at device address `addr`, inside one live allocation (else nothing is written).
    /// Aligned 4- and 8-byte pieces are single accesses.
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
