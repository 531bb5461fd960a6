//! A polled event queue (docs/reference/mlx5.md §f.1, §f.4; Linux `core/eq.c`, `core/lib/eq.h`): a ring of 64-byte EQEs
//! in DMA memory, every entry initialised with owner = 1; the entry at consumer index `ci` belongs to software
//! when its owner bit equals `(ci >> log_eq_size) & 1`. The consumer index goes back to the device through
//! the UAR's no-arm doorbell (UAR + 0x48), so the EQ never raises an interrupt.

use crate::handles::{Eqn, UarPage};
use crate::ifc::eq::{
    EQE_INIT_OWNER, EQE_OWNER_BYTE, EQE_SIZE, Eqe, MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI, eq_doorbell_value,
};
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

/// Linux updates the consumer index at least this often while draining (`MLX5_NUM_SPARE_EQE`).
pub const UPDATE_EVERY: u32 = 128;

/// The DMA side of an EQ: its buffer (one contiguous run of 4 KiB pages) and consumer index.
pub struct EventRing {
    pub buf: DmaBuf,
    pub log_size: u32,
    /// EQEs consumed, wrapping at 2^32; the doorbell carries its low 24 bits (`eq_doorbell_value`). As the CQ's
    /// counter (`CqRing`), its owner bit agrees with the HCA's 24-bit producer counter across both wraps.
    ci: u32,
    eqn: Eqn,
    uar_page: UarPage,
    unacked: u32,
}

impl EventRing {
    /// Allocates `2^log_size` entries, all owned by hardware (owner = 1).
    pub fn alloc<P: Platform + ?Sized>(p: &P, log_size: u32) -> Option<EventRing> {
        let len = Self::bytes(log_size);
        let buf = p.dma_alloc(len, PAGE_SIZE)?;
        for i in 0..1usize << log_size {
            p.dma_write(buf, i * EQE_SIZE + EQE_OWNER_BYTE, &[EQE_INIT_OWNER]);
        }
        Some(EventRing { buf, log_size, ci: 0, eqn: Eqn(0), uar_page: UarPage(0), unacked: 0 })
    }

    pub fn bytes(log_size: u32) -> usize {
        (EQE_SIZE << log_size).max(PAGE_SIZE)
    }

    /// The 4 KiB pages of the buffer, for CREATE_EQ's PAS list.
    pub fn pages(&self) -> impl Iterator<Item = u64> + '_ {
        (0..Self::bytes(self.log_size) / PAGE_SIZE).map(|i| self.buf.at((i * PAGE_SIZE) as u64))
    }

    /// Binds the ring to the EQ the firmware created on it.
    pub fn bind(&mut self, eqn: Eqn, uar_page: UarPage) {
        self.eqn = eqn;
        self.uar_page = uar_page;
    }

    pub fn eqn(&self) -> Eqn {
        self.eqn
    }

    /// The next software-owned EQE, consuming it.
    pub fn next<P: Platform + ?Sized>(&mut self, p: &P) -> Option<Eqe> {
        let mask = (1u32 << self.log_size) - 1;
        let at = (self.ci & mask) as usize * EQE_SIZE;
        let owner = p.dma_read8(self.buf, at + EQE_OWNER_BYTE) & 1;
        if u32::from(owner) != (self.ci >> self.log_size) & 1 {
            return None;
        }
        let mut e = [0u8; EQE_SIZE];
        p.dma_read(self.buf, at, &mut e);
        self.ci = self.ci.wrapping_add(1);
        self.unacked += 1;
        if self.unacked >= UPDATE_EVERY {
            self.update_ci(p);
        }
        Some(Eqe::parse(&e))
    }

    /// Tells the device how far software has read (no arm: the EQ stays polled).
    pub fn update_ci<P: Platform + ?Sized>(&mut self, p: &P) {
        if self.unacked == 0 {
            return;
        }
        self.unacked = 0;
        let off = self.uar_page.0 as usize * PAGE_SIZE + MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI;
        p.bar_write32(off, eq_doorbell_value(self.eqn, self.ci));
    }

    pub fn release<P: Platform + ?Sized>(self, p: &P) {
        p.dma_free(self.buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Fake;

    const LOG: u32 = 2;

    /// The device writes the EQE of its `count`th event: slot `count mod 4`, the owner bit of that pass.
    fn produce(p: &Fake, r: &EventRing, count: u32) {
        let slot = (count & ((1 << LOG) - 1)) as usize;
        let owner = ((count & 0xff_ffff) >> LOG) as u8 & 1;
        p.dma_write(r.buf, slot * EQE_SIZE + EQE_OWNER_BYTE, &[owner]);
    }

    /// The consumer index wraps at 2^32 and the doorbell carries its low 24 bits (`eq_doorbell_value`), which
    /// wrap at 2^24: started just below each limit, every event written across the wrap is read once, in order,
    /// and the doorbell names the index consumed up to.
    #[test]
    fn the_consumer_index_crosses_2_pow_24_and_2_pow_32_in_step_with_the_device() {
        for start in [0x00ff_fffau32, u32::MAX - 5] {
            let p = Fake::new();
            let mut r = EventRing::alloc(&p, LOG).unwrap();
            r.bind(Eqn(7), UarPage(3));
            for back in 1..=4 {
                produce(&p, &r, start.wrapping_sub(back));
            }
            r.ci = start;
            assert!(r.next(&p).is_none(), "start {start:#x}: nothing new yet");
            for i in 0..12u32 {
                let count = start.wrapping_add(i);
                produce(&p, &r, count);
                assert!(r.next(&p).is_some(), "start {start:#x}: event {count:#x} is read");
                assert!(r.next(&p).is_none(), "start {start:#x}: only one per event written");
                r.update_ci(&p);
                let db = 3 * PAGE_SIZE + MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI;
                let want = (7 << 24) | (count.wrapping_add(1) & 0xff_ffff);
                assert_eq!(p.bar_writes().last(), Some(&(db, want)), "start {start:#x}: the doorbell");
            }
            r.release(&p);
        }
    }
}
