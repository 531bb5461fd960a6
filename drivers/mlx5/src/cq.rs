//! A polled completion queue (docs/reference/mlx5.md §f.2, §f.3; Linux `core/wq.h`, `infiniband/hw/mlx5/cq.c`): a ring
//! of 64-byte CQEs initialised as Linux does (`op_own` = INVALID << 4 | owner), a doorbell record whose first
//! dword is the consumer counter. A CQE at counter `cc` belongs to software when its owner bit equals
//! `(cc >> log_cq_size) & 1` and its opcode is not INVALID. CQs are never armed. CQE fields:
//! [`crate::ifc::cq::Cqe`].

use crate::ifc::cq::{CQE_INIT_OP_OWN, CQE_OP_OWN_BYTE, CQE_SIZE, Cqe, MLX5_CQE_INVALID};
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

/// Doorbell records get 64 bytes each, as the selftest aligns them.
pub const DBR_LEN: usize = 64;

/// The DMA side of a CQ.
pub struct CqRing {
    pub buf: DmaBuf,
    pub dbr: DmaBuf,
    pub log_size: u32,
    /// CQEs consumed, wrapping at 2^32; the doorbell record gets its low 24 bits (`set_ci`), which is all the
    /// HCA's producer counter has. The owner bit `(cc >> log_size) & 1` agrees with the HCA's across both wraps,
    /// since 2^24 and 2^32 are multiples of the ring's size (2^log_size, log_size below 24).
    cc: u32,
}

impl CqRing {
    pub fn alloc<P: Platform + ?Sized>(p: &P, log_size: u32) -> Option<CqRing> {
        let buf = p.dma_alloc(Self::bytes(log_size), PAGE_SIZE)?;
        let Some(dbr) = p.dma_alloc(DBR_LEN, DBR_LEN) else {
            p.dma_free(buf);
            return None;
        };
        for i in 0..1usize << log_size {
            p.dma_write(buf, i * CQE_SIZE + CQE_OP_OWN_BYTE, &[CQE_INIT_OP_OWN]);
        }
        Some(CqRing { buf, dbr, log_size, cc: 0 })
    }

    pub fn bytes(log_size: u32) -> usize {
        (CQE_SIZE << log_size).max(PAGE_SIZE)
    }

    pub fn pages(&self) -> impl Iterator<Item = u64> + '_ {
        (0..Self::bytes(self.log_size) / PAGE_SIZE).map(|i| self.buf.at((i * PAGE_SIZE) as u64))
    }

    /// CQEs consumed so far.
    pub fn consumer_counter(&self) -> u32 {
        self.cc
    }

    /// The next software-owned CQE, consuming it (and publishing the new counter in the doorbell record).
    pub fn next<P: Platform + ?Sized>(&mut self, p: &P) -> Option<Cqe> {
        let mask = (1u32 << self.log_size) - 1;
        let at = (self.cc & mask) as usize * CQE_SIZE;
        let op_own = p.dma_read8(self.buf, at + CQE_OP_OWN_BYTE);
        if u32::from(op_own & 1) != (self.cc >> self.log_size) & 1 || op_own >> 4 == MLX5_CQE_INVALID {
            return None;
        }
        let mut e = [0u8; CQE_SIZE];
        p.dma_read(self.buf, at, &mut e);
        self.cc = self.cc.wrapping_add(1);
        p.dma_write32(self.dbr, 0, self.cc & 0xff_ffff);
        Some(Cqe::parse(&e))
    }

    pub fn release<P: Platform + ?Sized>(self, p: &P) {
        p.dma_free(self.buf);
        p.dma_free(self.dbr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::cq::MLX5_CQE_REQ;
    use crate::testing::Fake;

    const LOG: u32 = 2;

    /// The device writes the CQE of its `count`th completion: slot `count mod 4`, the owner bit of that pass.
    /// The device's own counter is 24 bits; only its low `LOG + 1` bits matter here, which a 24-bit and a
    /// 32-bit count of the same completions share.
    fn produce(p: &Fake, r: &CqRing, count: u32) {
        let slot = (count & ((1 << LOG) - 1)) as usize;
        let owner = ((count & 0xff_ffff) >> LOG) as u8 & 1;
        p.dma_write(r.buf, slot * CQE_SIZE + CQE_OP_OWN_BYTE, &[(MLX5_CQE_REQ << 4) | owner]);
    }

    /// The consumer counter wraps at 2^32 and the doorbell record carries its low 24 bits, which wrap at 2^24
    /// (docs/reference/mlx5.md, CREATE_CQ and its doorbell record): started just below each limit, every
    /// completion the device writes across the wrap is read once, in order, and none before it is written.
    #[test]
    fn the_consumer_counter_crosses_2_pow_24_and_2_pow_32_in_step_with_the_device() {
        for start in [0x00ff_fffau32, u32::MAX - 5] {
            let p = Fake::new();
            let mut r = CqRing::alloc(&p, LOG).unwrap();
            // The ring as the previous pass left it: each slot holds its last completion before `start`.
            for back in 1..=4 {
                produce(&p, &r, start.wrapping_sub(back));
            }
            r.cc = start;
            assert!(r.next(&p).is_none(), "start {start:#x}: nothing new yet");
            for i in 0..12u32 {
                let count = start.wrapping_add(i);
                produce(&p, &r, count);
                assert!(r.next(&p).is_some(), "start {start:#x}: completion {count:#x} is read");
                assert!(r.next(&p).is_none(), "start {start:#x}: only one per completion written");
                assert_eq!(r.consumer_counter(), count.wrapping_add(1));
                assert_eq!(p.dma_read32(r.dbr, 0), count.wrapping_add(1) & 0xff_ffff, "the doorbell record");
            }
            r.release(&p);
        }
    }
}
