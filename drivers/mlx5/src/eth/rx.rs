//! The port's receive side (Linux `en_rx.c`): every RQ entry is one 16-byte data segment over its own
//! buffer, all posted at creation; a completion hands the frame out and reposts the same buffer by advancing
//! the producer counter in the doorbell record.

use alloc::vec;
use alloc::vec::Vec;

use super::EthStats;
use crate::cq::CqRing;
use crate::ifc::cq::MLX5_CQE_RESP_SEND;
use crate::platform::{DmaBuf, Platform};

/// The receive WQE stride: one 16-byte data segment (`log_wq_stride` 4).
pub const RQ_WQE_LEN: usize = 16;

/// The receive side: RQ buffer, doorbell record, frame buffers, its CQ.
pub struct RxRing {
    wq: DmaBuf,
    dbr: DmaBuf,
    bufs: DmaBuf,
    pub(super) cq: CqRing,
    lkey: u32,
    log_frames: u8,
    buf_len: usize,
    /// WQEs posted and WQEs completed (16 bits, as the doorbell record and `wqe_counter` carry).
    pc: u16,
    cc: u16,
    scratch: Vec<u8>,
    /// An error CQE arrived: the RQ is in ERR; consumed buffers are not posted again until it is recovered.
    pub(super) in_error: bool,
}

/// What an RX ring is built from.
#[derive(Clone, Copy, Debug)]
pub struct RxParts {
    pub lkey: u32,
    pub log_frames: u8,
    pub buf_len: usize,
    /// `frames * 16` bytes (at least a page).
    pub wq: DmaBuf,
    pub dbr: DmaBuf,
    /// `frames * buf_len` bytes.
    pub bufs: DmaBuf,
}

impl RxRing {
    /// Writes every receive WQE (one data segment over its own buffer); nothing is posted yet.
    pub fn new<P: Platform + ?Sized>(p: &P, r: RxParts, cq: CqRing) -> RxRing {
        let rx = RxRing {
            wq: r.wq,
            dbr: r.dbr,
            bufs: r.bufs,
            cq,
            lkey: r.lkey,
            log_frames: r.log_frames,
            buf_len: r.buf_len,
            pc: 0,
            cc: 0,
            scratch: vec![0u8; r.buf_len],
            in_error: false,
        };
        rx.write_wqes(p);
        rx
    }

    /// Every receive WQE: one data segment over its own buffer.
    fn write_wqes<P: Platform + ?Sized>(&self, p: &P) {
        for i in 0..self.frames() {
            let mut seg = [0u8; RQ_WQE_LEN];
            seg[0..4].copy_from_slice(&(self.buf_len as u32).to_be_bytes());
            seg[4..8].copy_from_slice(&self.lkey.to_be_bytes());
            seg[8..16].copy_from_slice(&self.bufs.at((i * self.buf_len) as u64).to_be_bytes());
            p.dma_write(self.wq, i * RQ_WQE_LEN, &seg);
        }
    }

    /// Whether an error CQE put the RQ in error (cleared once it is ready again).
    pub fn in_error(&self) -> bool {
        self.in_error
    }

    /// After MODIFY_RQ ERR → RST (Linux `mlx5e_flush_rq`): the CQ's leftover CQEs are consumed (errors counted,
    /// anything else dropped), the counters and the doorbell record start at 0 and every WQE is written
    /// afresh. [`RxRing::post_all`] posts them once the RQ is ready again.
    pub fn reset<P: Platform + ?Sized>(&mut self, p: &P, stats: &mut EthStats) {
        while let Some(cqe) = self.cq.next(p) {
            if cqe.is_error() {
                stats.rx_errors += 1;
            } else {
                stats.rx_drops += 1;
            }
        }
        self.pc = 0;
        self.cc = 0;
        p.dma_write32(self.dbr, 0, 0);
        self.write_wqes(p);
    }

    fn frames(&self) -> usize {
        1 << self.log_frames
    }

    /// Posts every buffer: the receive counter in the doorbell record (dword 0) becomes the ring size.
    pub fn post_all<P: Platform + ?Sized>(&mut self, p: &P) {
        self.in_error = false;
        self.pc = self.cc.wrapping_add(self.frames() as u16);
        p.dma_write32(self.dbr, 0, u32::from(self.pc));
    }

    /// The lkey every receive WQE carries.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Reaps up to `budget` receive completions: each good frame goes to `deliver`, every consumed buffer is
    /// posted again (one doorbell record update at the end). Returns the frames delivered.
    pub fn receive<P: Platform + ?Sized>(
        &mut self,
        p: &P,
        stats: &mut EthStats,
        budget: usize,
        mut deliver: impl FnMut(&mut [u8]),
    ) -> usize {
        let mut delivered = 0;
        let mut consumed = 0;
        while consumed < budget {
            let Some(cqe) = self.cq.next(p) else { break };
            consumed += 1;
            let mask = self.frames() - 1;
            let slot = usize::from(self.cc) & mask;
            // A cyclic RQ completes in order; compared within the ring (Linux masks the counter too).
            let in_order = usize::from(cqe.wqe_counter) & mask == slot;
            self.cc = self.cc.wrapping_add(1);
            if cqe.is_error() {
                stats.rx_errors += 1;
                self.in_error = true;
                continue;
            }
            let len = cqe.byte_cnt as usize;
            if cqe.opcode != MLX5_CQE_RESP_SEND || !in_order || len == 0 || len > self.buf_len {
                stats.rx_drops += 1;
                continue;
            }
            let frame = &mut self.scratch[..len];
            p.dma_read(self.bufs, slot * self.buf_len, frame);
            stats.rx_frames += 1;
            stats.rx_bytes += len as u64;
            delivered += 1;
            deliver(frame);
        }
        if consumed > 0 && !self.in_error {
            // The buffers just consumed go back to the hardware unchanged: the WQEs already describe them.
            self.pc = self.pc.wrapping_add(consumed as u16);
            p.dma_write32(self.dbr, 0, u32::from(self.pc));
        }
        delivered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::DBR_LEN;
    use crate::eth::test_support::{BUF, LKEY, frame};
    use crate::ifc::cq::{MLX5_CQE_RESP_ERR, MLX5_CQE_SYNDROME_WR_FLUSH_ERR};
    use crate::ifc::golden::{be32, be64};
    use crate::platform::PAGE_SIZE;
    use crate::testing::Fake;

    fn rx_ring(p: &Fake, log_frames: u8) -> RxRing {
        let wq = p.dma_alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        let dbr = p.dma_alloc(DBR_LEN, DBR_LEN).unwrap();
        let bufs = p.dma_alloc(BUF << log_frames, PAGE_SIZE).unwrap();
        let cq = CqRing::alloc(p, u32::from(log_frames)).unwrap();
        let r = RxParts { lkey: LKEY, log_frames, buf_len: BUF, wq, dbr, bufs };
        let mut rx = RxRing::new(p, r, cq);
        rx.post_all(p);
        // Every WQE is one data segment over its own buffer.
        for i in 0..1usize << log_frames {
            let w = p.bytes(wq, i * RQ_WQE_LEN, RQ_WQE_LEN);
            assert_eq!((be32(&w, 0), be32(&w, 4), be64(&w, 8)), (BUF as u32, LKEY, bufs.at((i * BUF) as u64)));
        }
        rx
    }

    #[test]
    fn received_frames_are_handed_out_and_their_buffers_reposted() {
        let p = Fake::new();
        let mut rx = rx_ring(&p, 2);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 4, "all four buffers posted");
        let mut st = EthStats::default();
        let mut got: Vec<Vec<u8>> = Vec::new();
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 0);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 4, "nothing consumed, nothing reposted");

        // The device writes frames into buffers 0 and 1 and completes them.
        let (a, b) = (frame(60), frame(1514));
        p.dma_write(rx.bufs, 0, &a);
        p.dma_write(rx.bufs, BUF, &b);
        p.write_cqe(&rx.cq, 0, MLX5_CQE_RESP_SEND, 0, 60, 0);
        p.write_cqe(&rx.cq, 1, MLX5_CQE_RESP_SEND, 1, 1514, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 2);
        assert_eq!(got, vec![a.clone(), b]);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 6, "both buffers posted again");
        assert_eq!((st.rx_frames, st.rx_bytes), (2, 1574));
        // The CQ's doorbell record follows the consumer counter.
        assert_eq!(be32(&p.bytes(rx.cq.dbr, 0, 4), 0), 2);

        // A length beyond the buffer, a zero length, an out-of-order counter: counted, reposted, never handed
        // out. The budget bounds one call.
        p.write_cqe(&rx.cq, 2, MLX5_CQE_RESP_SEND, 2, BUF as u32 + 1, 0);
        p.write_cqe(&rx.cq, 3, MLX5_CQE_RESP_SEND, 3, 0, 0);
        p.write_cqe(&rx.cq, 4, MLX5_CQE_RESP_SEND, 7, 60, 0);
        got.clear();
        assert_eq!(rx.receive(&p, &mut st, 2, |f| got.push(f.to_vec())), 0);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 8);
        assert_eq!(rx.receive(&p, &mut st, 2, |f| got.push(f.to_vec())), 0);
        assert!(got.is_empty());
        assert_eq!((st.rx_errors, st.rx_drops, st.rx_frames), (0, 3, 2));
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 9);

        // The ring wraps: buffer 1 (counter 5) on the CQ's second pass is delivered from its own buffer.
        let c = frame(70);
        p.dma_write(rx.bufs, BUF, &c);
        p.write_cqe(&rx.cq, 5, MLX5_CQE_RESP_SEND, 5, 70, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 1);
        assert_eq!(got, vec![c]);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 10);

        // An error CQE (and the flush after it): counted, never handed out, and the RQ in error takes its
        // buffers back no more.
        p.write_cqe(&rx.cq, 6, MLX5_CQE_RESP_ERR, 6, 0, 0x04);
        p.write_cqe(&rx.cq, 7, MLX5_CQE_RESP_ERR, 7, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        got.clear();
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 0);
        assert!(got.is_empty() && rx.in_error());
        assert_eq!((st.rx_errors, be32(&p.bytes(rx.dbr, 0, 4), 0)), (2, 10));
        // The reset consumes what the CQ still holds, zeroes the counters and the doorbell record and writes
        // every WQE afresh (one was scribbled over); posting all of them makes the ring whole again.
        p.write_cqe(&rx.cq, 8, MLX5_CQE_RESP_ERR, 8, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        p.dma_write(rx.wq, 0, &[0xee; RQ_WQE_LEN]);
        rx.reset(&p, &mut st);
        assert_eq!((st.rx_errors, be32(&p.bytes(rx.dbr, 0, 4), 0)), (3, 0));
        let w = p.bytes(rx.wq, 0, RQ_WQE_LEN);
        assert_eq!((be32(&w, 0), be32(&w, 4), be64(&w, 8)), (BUF as u32, LKEY, rx.bufs.at(0)));
        rx.post_all(&p);
        assert!(!rx.in_error());
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 4);
        // Counter 0 again, in buffer 0 (the CQ itself goes on: index 9).
        let d = frame(80);
        p.dma_write(rx.bufs, 0, &d);
        p.write_cqe(&rx.cq, 9, MLX5_CQE_RESP_SEND, 0, 80, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 1);
        assert_eq!(got, vec![d]);
    }
}
