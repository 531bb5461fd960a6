//! The port's send side (Linux `en_tx.c` / `en/txrx.h` order): the frame is copied into its slot's buffer; the
//! WQE is a control segment (opcode SEND, WQE index, SQN and DS count, CQ_UPDATE), an Ethernet segment
//! carrying the first header bytes inline as the SQ's minimal inline mode needs, and one data segment for the
//! rest; then the doorbell record gets the producer counter and the UAR page's doorbell register (offset
//! 0x800) the first 8 bytes of the control segment.

use alloc::vec;
use alloc::vec::Vec;

use super::{Dropped, EthStats};
use crate::cq::CqRing;
use crate::handles::UarPage;
use crate::ifc::cq::MLX5_CQE_REQ;
use crate::ifc::eth::{MLX5_INLINE_MODE_IP, MLX5_INLINE_MODE_NONE, MLX5_INLINE_MODE_TCP_UDP};
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

// The control segment, the doorbell and these constants are every send queue's (`crate::sq`).
pub use crate::sq::{MLX5_BF_OFFSET, MLX5_WQE_CTRL_CQ_UPDATE, SEND_WQE_BB, SEND_WQE_DS};
/// Send opcodes (`device.h` `MLX5_OPCODE_*`).
pub const MLX5_OPCODE_NOP: u8 = 0x00;
pub const MLX5_OPCODE_SEND: u8 = 0x0a;
/// Inline header bytes that fit in the Ethernet segment itself (`inline_hdr.start[2]`, Linux `INL_HDR_START_SZ`).
pub const INL_HDR_START_SZ: usize = 2;
/// Linux `MLX5E_MIN_INLINE`: the L2 header with one VLAN tag (`ETH_HLEN + VLAN_HLEN`).
pub const MIN_INLINE_L2: usize = 18;
/// `ETH_HLEN`; a shorter frame is not Ethernet.
pub const ETH_HLEN: usize = 14;

/// How many inline header bytes `frame` needs in `mode` (Linux `mlx5e_calc_min_inline`): none; the L2 header
/// with at least [`MIN_INLINE_L2`] bytes; up to the end of the IPv4/IPv6 header; up to the end of the TCP/UDP
/// header. Never more than the frame. Headers are read with bounds checks: a truncated header stops at the
/// frame's end.
pub fn inline_len(mode: u8, frame: &[u8]) -> usize {
    let len = frame.len();
    let be16 = |at: usize| frame.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    // L2: Ethernet header plus up to two VLAN tags (802.1Q 0x8100, 802.1ad 0x88a8).
    let mut l2 = ETH_HLEN;
    let mut ethertype = be16(12);
    for _ in 0..2 {
        match ethertype {
            Some(0x8100) | Some(0x88a8) => {
                ethertype = be16(l2 + 2);
                l2 += 4;
            }
            _ => break,
        }
    }
    let l2_inline = l2.max(MIN_INLINE_L2);
    let want = match mode {
        MLX5_INLINE_MODE_NONE => 0,
        MLX5_INLINE_MODE_IP | MLX5_INLINE_MODE_TCP_UDP => {
            let l3 = match ethertype {
                Some(0x0800) => frame.get(l2).map(|v| (usize::from(v & 0xf) * 4, frame.get(l2 + 9).copied())),
                Some(0x86dd) => Some((40, frame.get(l2 + 6).copied())),
                _ => None,
            };
            match l3 {
                None => l2_inline,
                Some((l3_len, _)) if mode == MLX5_INLINE_MODE_IP => l2 + l3_len,
                Some((l3_len, proto)) => {
                    let l4 = l2 + l3_len;
                    l4 + match proto {
                        Some(6) => frame.get(l4 + 12).map_or(20, |d| usize::from(d >> 4) * 4),
                        Some(17) => 8,
                        _ => 0,
                    }
                }
            }
        }
        _ => l2_inline,
    };
    want.min(len)
}

/// Send WQE basic blocks per slot for `mode`: the largest WQE (control, Ethernet segment with the mode's
/// largest inline headers, one data segment) rounded up to a power of two so slots tile the ring.
pub const fn wqebbs_per_slot(mode: u8) -> usize {
    match mode {
        MLX5_INLINE_MODE_IP => 2,      // 22 + 60 bytes inline: 3 + 5 DS
        MLX5_INLINE_MODE_TCP_UDP => 4, // 22 + 60 + 60 bytes inline: 3 + 9 DS
        _ => 1,                        // none, or 18 bytes: 3 + 1 DS
    }
}

/// Inline bytes a slot of `wqebbs` basic blocks holds: 2 in the Ethernet segment plus 16 per DS left after
/// the control, Ethernet and data segments.
pub const fn inline_capacity(wqebbs: usize) -> usize {
    INL_HDR_START_SZ + SEND_WQE_DS * (wqebbs * (SEND_WQE_BB / SEND_WQE_DS) - 3)
}

/// The send side: SQ buffer, doorbell record, frame buffers, its CQ.
pub struct TxRing {
    sqn: u32,
    wq: DmaBuf,
    dbr: DmaBuf,
    bufs: DmaBuf,
    pub(super) cq: CqRing,
    /// BAR0 offset of the UAR page's send doorbell.
    doorbell: usize,
    lkey: u32,
    log_frames: u8,
    inline_mode: u8,
    /// Basic blocks per frame slot (a power of two).
    slot_bbs: usize,
    buf_len: usize,
    /// Producer and consumer counters in basic blocks (16 bits, as the WQE index and doorbell record carry).
    pc: u16,
    cc: u16,
    scratch: Vec<u8>,
    /// An error CQE arrived: the SQ is in ERR (or was) and takes nothing until it is recovered.
    pub(super) in_error: bool,
}

/// What a TX ring is built from.
#[derive(Clone, Copy, Debug)]
pub struct TxParts {
    pub sqn: u32,
    pub uar: UarPage,
    pub lkey: u32,
    pub log_frames: u8,
    pub inline_mode: u8,
    pub buf_len: usize,
    /// `frames * slot_bbs * 64` bytes, page aligned.
    pub wq: DmaBuf,
    pub dbr: DmaBuf,
    /// `frames * buf_len` bytes.
    pub bufs: DmaBuf,
}

impl TxRing {
    pub fn new(t: TxParts, cq: CqRing) -> TxRing {
        TxRing {
            sqn: t.sqn,
            wq: t.wq,
            dbr: t.dbr,
            bufs: t.bufs,
            cq,
            doorbell: t.uar.0 as usize * PAGE_SIZE + MLX5_BF_OFFSET,
            lkey: t.lkey,
            log_frames: t.log_frames,
            inline_mode: t.inline_mode,
            slot_bbs: wqebbs_per_slot(t.inline_mode),
            buf_len: t.buf_len,
            pc: 0,
            cc: 0,
            scratch: vec![0u8; t.buf_len.max(SEND_WQE_BB * wqebbs_per_slot(t.inline_mode))],
            in_error: false,
        }
    }

    /// Whether an error CQE put the SQ in error (cleared once it is ready again).
    pub fn in_error(&self) -> bool {
        self.in_error
    }

    /// After MODIFY_SQ ERR → RST: the CQ's leftover CQEs are consumed (errors counted), the ring's counters
    /// and the doorbell record start at 0 again, as the SQ's own counter does in RST (Linux
    /// `mlx5e_reset_txqsq_cc_pc` and the work queue reset).
    pub fn reset<P: Platform + ?Sized>(&mut self, p: &P, stats: &mut EthStats) {
        while let Some(cqe) = self.cq.next(p) {
            if cqe.is_error() {
                stats.tx_errors += 1;
            }
        }
        self.pc = 0;
        self.cc = 0;
        p.dma_write32(self.dbr, 4, 0);
    }

    fn frames(&self) -> usize {
        1 << self.log_frames
    }

    /// Frames the hardware still owns.
    pub fn in_flight(&self) -> usize {
        usize::from(self.pc.wrapping_sub(self.cc)) / self.slot_bbs
    }

    /// Free send slots.
    pub fn room(&self) -> usize {
        self.frames() - self.in_flight()
    }

    /// Reaps send completions: each frees the slots up to and including the WQE it names. Returns how many
    /// CQEs were consumed.
    pub fn reap<P: Platform + ?Sized>(&mut self, p: &P, stats: &mut EthStats) -> usize {
        let mut n = 0;
        while let Some(cqe) = self.cq.next(p) {
            n += 1;
            if cqe.is_error() {
                stats.tx_errors += 1;
                self.in_error = true;
            } else if cqe.opcode != MLX5_CQE_REQ {
                continue;
            }
            // The CQE names the last WQE of a slot (the one that asked for it: the frame's own WQE when it
            // fills the slot, else the last NOP), so its whole slot is done. Ignore one outside the frames in
            // flight.
            let slot_start = cqe.wqe_counter & !(self.slot_bbs as u16 - 1);
            let done = slot_start.wrapping_add(self.slot_bbs as u16);
            let ahead = done.wrapping_sub(self.cc);
            if ahead != 0 && ahead <= self.pc.wrapping_sub(self.cc) {
                self.cc = done;
            }
        }
        n
    }

    /// Sends `frame` (copied into the next slot's buffer).
    pub fn transmit<P: Platform + ?Sized>(&mut self, p: &P, stats: &mut EthStats, frame: &[u8]) -> Result<(), Dropped> {
        self.transmit_with(p, stats, frame.len(), |b| b.copy_from_slice(frame))
    }

    /// Sends a `len`-byte frame that `fill` writes into a scratch buffer (for a network stack's transmit
    /// token), then copies into the next slot's buffer.
    pub fn transmit_with<P: Platform + ?Sized, R>(
        &mut self,
        p: &P,
        stats: &mut EthStats,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Dropped> {
        if self.room() == 0 {
            self.reap(p, stats);
        }
        let r = self.post(p, len, fill);
        match r {
            Ok(_) => {
                stats.tx_frames += 1;
                stats.tx_bytes += len as u64;
            }
            Err(_) => stats.tx_drops += 1,
        }
        r
    }

    fn post<P: Platform + ?Sized, R>(
        &mut self,
        p: &P,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Dropped> {
        if len > self.buf_len {
            return Err(Dropped::TooLong);
        }
        if len < ETH_HLEN {
            return Err(Dropped::TooShort);
        }
        if self.in_error {
            return Err(Dropped::QueueInError);
        }
        if self.room() == 0 {
            return Err(Dropped::RingFull);
        }
        let r = fill(&mut self.scratch[..len]);
        let ihs = inline_len(self.inline_mode, &self.scratch[..len]);
        if ihs > inline_capacity(self.slot_bbs) {
            return Err(Dropped::HeadersTooLong);
        }
        let slot = usize::from(self.pc / self.slot_bbs as u16) & (self.frames() - 1);
        let buf_off = slot * self.buf_len;
        p.dma_write(self.bufs, buf_off, &self.scratch[..len]);

        // The WQE: control, Ethernet segment with `ihs` inline bytes, one data segment for the rest.
        let ds_inl = ihs.saturating_sub(INL_HDR_START_SZ).div_ceil(SEND_WQE_DS);
        let has_data = len > ihs;
        let ds = 2 + ds_inl + usize::from(has_data);
        let bbs = ds.div_ceil(SEND_WQE_BB / SEND_WQE_DS);
        let mut w = [0u8; 4 * SEND_WQE_BB];
        let wqe = &mut w[..self.slot_bbs * SEND_WQE_BB];
        let last = self.pc.wrapping_add(self.slot_bbs as u16 - 1);
        ctrl(&mut wqe[..SEND_WQE_DS], self.pc, MLX5_OPCODE_SEND, self.sqn, ds as u8, bbs == self.slot_bbs);
        // mlx5_wqe_eth_seg: cs_flags, mss, metadata 0; inline_hdr.sz at +12, start[2] at +14.
        wqe[0x1c..0x1e].copy_from_slice(&(ihs as u16).to_be_bytes());
        let inl = &self.scratch[..ihs];
        let first = ihs.min(INL_HDR_START_SZ);
        wqe[0x1e..0x1e + first].copy_from_slice(&inl[..first]);
        wqe[0x20..0x20 + (ihs - first)].copy_from_slice(&inl[first..]);
        if has_data {
            let at = 0x20 + ds_inl * SEND_WQE_DS;
            // mlx5_wqe_data_seg: byte_count, lkey, addr.
            wqe[at..at + 4].copy_from_slice(&((len - ihs) as u32).to_be_bytes());
            wqe[at + 4..at + 8].copy_from_slice(&self.lkey.to_be_bytes());
            wqe[at + 8..at + 16].copy_from_slice(&self.bufs.at((buf_off + ihs) as u64).to_be_bytes());
        }
        // Pad the slot with one-block NOPs; the slot's last WQE asks for the CQE.
        for b in bbs..self.slot_bbs {
            let idx = self.pc.wrapping_add(b as u16);
            ctrl(
                &mut wqe[b * SEND_WQE_BB..b * SEND_WQE_BB + SEND_WQE_DS],
                idx,
                MLX5_OPCODE_NOP,
                self.sqn,
                1,
                idx == last,
            );
        }
        let ring_bbs = self.frames() * self.slot_bbs;
        let at = (usize::from(self.pc) & (ring_bbs - 1)) * SEND_WQE_BB;
        p.dma_write(self.wq, at, wqe);
        // The slot's last WQE: the last NOP, or the frame's WQE itself when it fills the slot.
        let last_at = if bbs < self.slot_bbs { (self.slot_bbs - 1) * SEND_WQE_BB } else { 0 };
        self.pc = self.pc.wrapping_add(self.slot_bbs as u16);
        crate::sq::ring_doorbell(p, self.dbr, self.doorbell, self.pc, &wqe[last_at..last_at + 8]);
        Ok(r)
    }
}

/// A control segment (`mlx5_wqe_ctrl_seg`, [`crate::sq::CtrlSeg`]): no fence, a CQE when asked.
fn ctrl(seg: &mut [u8], idx: u16, opcode: u8, sqn: u32, ds: u8, cqe: bool) {
    crate::sq::CtrlSeg {
        wqe_index: idx,
        opcode,
        qpn: sqn,
        ds,
        fm_ce_se: if cqe { MLX5_WQE_CTRL_CQ_UPDATE } else { 0 },
        ..Default::default()
    }
    .write(seg);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::DBR_LEN;
    use crate::eth::test_support::{BUF, LKEY, frame};
    use crate::ifc;
    use crate::ifc::cq::MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
    use crate::ifc::eth::MLX5_INLINE_MODE_L2;
    use crate::ifc::golden::{be16, be32, be64};
    use crate::testing::Fake;

    const SQN: u32 = 0x12_3456;
    const UAR: u32 = 5;

    fn tx_ring(p: &Fake, log_frames: u8, mode: u8) -> TxRing {
        let bbs = wqebbs_per_slot(mode);
        let wq = p.dma_alloc(((SEND_WQE_BB * bbs) << log_frames).next_multiple_of(PAGE_SIZE), PAGE_SIZE).unwrap();
        let dbr = p.dma_alloc(DBR_LEN, DBR_LEN).unwrap();
        let bufs = p.dma_alloc(BUF << log_frames, PAGE_SIZE).unwrap();
        let cq = CqRing::alloc(p, u32::from(log_frames)).unwrap();
        TxRing::new(
            TxParts {
                sqn: SQN,
                uar: UarPage(UAR),
                lkey: LKEY,
                log_frames,
                inline_mode: mode,
                buf_len: BUF,
                wq,
                dbr,
                bufs,
            },
            cq,
        )
    }

    #[test]
    fn a_frame_becomes_one_wqe_a_doorbell_record_and_a_uar_doorbell() {
        let p = Fake::new();
        let mut tx = tx_ring(&p, 2, MLX5_INLINE_MODE_L2);
        let mut st = EthStats::default();
        let f = frame(60);
        tx.transmit(&p, &mut st, &f).unwrap();

        let w = p.bytes(tx.wq, 0, SEND_WQE_BB);
        // Control segment: WQE index 0, opcode SEND; SQN and 4 DS (ctrl, eth, one inline DS, data); CQ_UPDATE.
        assert_eq!((be32(&w, 0), be32(&w, 4)), (MLX5_OPCODE_SEND as u32, (SQN << 8) | 4));
        assert_eq!((w[8], w[11], be32(&w, 12)), (0, MLX5_WQE_CTRL_CQ_UPDATE, 0));
        // Ethernet segment: no offloads; inline_hdr.sz 18, the first two bytes in start[2], the other 16 next.
        assert_eq!(&w[0x10..0x1c], &[0u8; 12]);
        assert_eq!(be16(&w, 0x1c), 18);
        assert_eq!(&w[0x1e..0x30], &f[..18]);
        // Data segment: the other 42 bytes, from the slot's buffer past the inline part.
        assert_eq!((be32(&w, 0x30), be32(&w, 0x34)), (42, LKEY));
        assert_eq!(be64(&w, 0x38), tx.bufs.at(18));
        assert_eq!(p.bytes(tx.bufs, 0, 60), f);
        // Doorbell record: the send counter in dword 1; then the UAR doorbell at 0x800, first 8 bytes of ctrl.
        assert_eq!(be32(&p.bytes(tx.dbr, 0, 8), 4), 1);
        let db = UAR as usize * PAGE_SIZE + MLX5_BF_OFFSET;
        assert_eq!(p.bar_writes(), vec![(db, MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 4)]);

        // The second frame: slot 1, WQE index 1, its own buffer.
        let g = frame(100);
        tx.transmit(&p, &mut st, &g).unwrap();
        let w = p.bytes(tx.wq, SEND_WQE_BB, SEND_WQE_BB);
        assert_eq!(be32(&w, 0), (1 << 8) | MLX5_OPCODE_SEND as u32);
        assert_eq!((be32(&w, 0x30), be64(&w, 0x38)), (82, tx.bufs.at((BUF + 18) as u64)));
        assert_eq!(p.bytes(tx.bufs, BUF, 100), g);
        assert_eq!(be32(&p.bytes(tx.dbr, 0, 8), 4), 2);
        assert_eq!(p.bar_writes()[2..], [(db, (1 << 8) | MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 4)]);
        assert_eq!(st, EthStats { tx_frames: 2, tx_bytes: 160, ..EthStats::default() });
    }

    #[test]
    fn a_full_send_ring_drops_and_counts_until_completions_free_it() {
        let p = Fake::new();
        let mut tx = tx_ring(&p, 2, MLX5_INLINE_MODE_L2);
        let mut st = EthStats::default();
        for _ in 0..4 {
            tx.transmit(&p, &mut st, &frame(64)).unwrap();
        }
        assert_eq!(tx.room(), 0);
        let writes = p.bar_writes().len();
        assert_eq!(tx.transmit(&p, &mut st, &frame(64)), Err(Dropped::RingFull));
        assert_eq!(p.bar_writes().len(), writes, "a dropped frame rings nothing");
        assert_eq!((st.tx_frames, st.tx_drops), (4, 1));
        // One CQE naming WQE 1 frees slots 0 and 1.
        p.write_cqe(&tx.cq, 0, MLX5_CQE_REQ, 1, 0, 0);
        tx.transmit(&p, &mut st, &frame(64)).unwrap();
        assert_eq!((tx.room(), st.tx_frames), (1, 5));
        // The fifth frame went to slot 0 again (WQE index 4).
        assert_eq!(be32(&p.bytes(tx.wq, 0, 4), 0), (4 << 8) | MLX5_OPCODE_SEND as u32);
        // A CQE outside the frames in flight frees nothing; an error CQE is counted and frees its slot.
        p.write_cqe(&tx.cq, 1, MLX5_CQE_REQ, 9, 0, 0);
        p.write_cqe(&tx.cq, 2, ifc::cq::MLX5_CQE_REQ_ERR, 2, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        assert_eq!(tx.reap(&p, &mut st), 2);
        assert_eq!((tx.room(), st.tx_errors), (2, 1));
        // Too long and too short are dropped and counted too.
        assert_eq!(tx.transmit(&p, &mut st, &frame(BUF + 1)), Err(Dropped::TooLong));
        assert_eq!(tx.transmit(&p, &mut st, &[0u8; 13]), Err(Dropped::TooShort));
        assert_eq!(st.tx_drops, 3);
        // The error CQE left the SQ in error: sends are refused (and counted) until it is reset.
        assert!(tx.in_error());
        let rung = p.bar_writes().len();
        assert_eq!(tx.transmit(&p, &mut st, &frame(64)), Err(Dropped::QueueInError));
        assert_eq!((st.tx_drops, p.bar_writes().len()), (4, rung));
        // The reset consumes what the CQ still holds and starts the ring and its doorbell record at 0.
        p.write_cqe(&tx.cq, 3, ifc::cq::MLX5_CQE_REQ_ERR, 3, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        tx.reset(&p, &mut st);
        assert_eq!((st.tx_errors, tx.room(), be32(&p.bytes(tx.dbr, 0, 8), 4)), (2, 4, 0));
        assert!(tx.in_error(), "still refused until the SQ is ready again");
        tx.in_error = false;
        tx.transmit(&p, &mut st, &frame(64)).unwrap();
        assert_eq!(be32(&p.bytes(tx.wq, 0, 4), 0), MLX5_OPCODE_SEND as u32, "WQE index 0 in slot 0 again");
        assert_eq!(be32(&p.bytes(tx.dbr, 0, 8), 4), 1);
    }

    #[test]
    fn inline_headers_follow_the_minimal_inline_mode() {
        // No inline: ctrl, eth (sz 0), data for the whole frame.
        let p = Fake::new();
        let mut tx = tx_ring(&p, 1, MLX5_INLINE_MODE_NONE);
        let mut st = EthStats::default();
        tx.transmit(&p, &mut st, &frame(60)).unwrap();
        let w = p.bytes(tx.wq, 0, SEND_WQE_BB);
        assert_eq!((be32(&w, 4), be16(&w, 0x1c)), ((SQN << 8) | 3, 0));
        assert_eq!((be32(&w, 0x20), be64(&w, 0x28)), (60, tx.bufs.at(0)));

        // IP mode: two basic blocks per slot. An ARP frame needs only the L2 header: one block for the frame
        // WQE, a NOP in the second that asks for the CQE; the doorbell carries the NOP's first 8 bytes.
        let p = Fake::new();
        let mut tx = tx_ring(&p, 1, MLX5_INLINE_MODE_IP);
        tx.transmit(&p, &mut st, &frame(60)).unwrap();
        let w = p.bytes(tx.wq, 0, 2 * SEND_WQE_BB);
        assert_eq!((be32(&w, 0), be32(&w, 4), w[11]), (MLX5_OPCODE_SEND as u32, (SQN << 8) | 4, 0));
        assert_eq!((be32(&w, 0x40), be32(&w, 0x44), w[0x4b]), (1 << 8, (SQN << 8) | 1, MLX5_WQE_CTRL_CQ_UPDATE));
        let db = UAR as usize * PAGE_SIZE + MLX5_BF_OFFSET;
        assert_eq!(p.bar_writes(), vec![(db, 1 << 8), (db + 4, (SQN << 8) | 1)]);
        assert_eq!(be32(&p.bytes(tx.dbr, 0, 8), 4), 2);
        // An IPv4/UDP frame inlines up to the end of the IP header (14 + 20 = 34 bytes: 2 + 2 DS).
        let mut udp = frame(80);
        udp[12..14].copy_from_slice(&[0x08, 0x00]);
        udp[14] = 0x45;
        udp[23] = 17;
        assert_eq!(inline_len(MLX5_INLINE_MODE_IP, &udp), 34);
        assert_eq!(inline_len(MLX5_INLINE_MODE_TCP_UDP, &udp), 42);
        tx.transmit(&p, &mut st, &udp).unwrap();
        let w = p.bytes(tx.wq, 2 * SEND_WQE_BB, 2 * SEND_WQE_BB);
        assert_eq!((be32(&w, 0), be32(&w, 4)), ((2 << 8) | MLX5_OPCODE_SEND as u32, (SQN << 8) | 5));
        assert_eq!((be16(&w, 0x1c), &w[0x1e..0x1e + 34]), (34, &udp[..34]));
        assert_eq!((be32(&w, 0x40), be64(&w, 0x48)), (46, tx.bufs.at((BUF + 34) as u64)));
        assert_eq!(w[0x4b], 0, "a data segment, not a control segment, sits at 0x40");
        assert_eq!(w[11], MLX5_WQE_CTRL_CQ_UPDATE, "the frame fills its slot: it asks for the CQE");
        // ... and its own control segment is the doorbell.
        assert_eq!(p.bar_writes()[2..], [(db, (2 << 8) | MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 5)]);
        assert_eq!((tx.room(), be32(&p.bytes(tx.dbr, 0, 8), 4)), (0, 4));
        // Completions free whole slots: the CQE of slot 0 names its NOP (index 1), that of slot 1 its frame WQE
        // (index 2).
        p.write_cqe(&tx.cq, 0, MLX5_CQE_REQ, 1, 0, 0);
        assert_eq!((tx.reap(&p, &mut st), tx.room()), (1, 1));
        p.write_cqe(&tx.cq, 1, MLX5_CQE_REQ, 2, 0, 0);
        assert_eq!((tx.reap(&p, &mut st), tx.room(), tx.in_flight()), (1, 2, 0));

        // TCP: L2 + IP + the TCP header's data offset; IPv6 is 40 bytes of IP header.
        let mut tcp = udp.clone();
        tcp[23] = 6;
        tcp[34 + 12] = 0x80; // doff 8 = 32 bytes
        assert_eq!(inline_len(MLX5_INLINE_MODE_TCP_UDP, &tcp), 14 + 20 + 32);
        let mut v6 = frame(100);
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[14 + 6] = 17;
        assert_eq!((inline_len(MLX5_INLINE_MODE_IP, &v6), inline_len(MLX5_INLINE_MODE_TCP_UDP, &v6)), (54, 62));
        // L2 with one VLAN tag: 18 bytes; two tags need 22, more than an L2 slot holds: dropped, counted.
        let mut q = frame(64);
        q[12..14].copy_from_slice(&[0x81, 0x00]);
        assert_eq!(inline_len(MLX5_INLINE_MODE_L2, &q), 18);
        q[16..18].copy_from_slice(&[0x81, 0x00]);
        assert_eq!(inline_len(MLX5_INLINE_MODE_L2, &q), 22);
        let p = Fake::new();
        let mut tx = tx_ring(&p, 1, MLX5_INLINE_MODE_L2);
        let mut st = EthStats::default();
        assert_eq!(tx.transmit(&p, &mut st, &q), Err(Dropped::HeadersTooLong));
        assert_eq!((st.tx_drops, tx.room()), (1, 2));
        // Capacities: an L2 slot holds 18 inline bytes, IP 82, TCP/UDP 210.
        assert_eq!((inline_capacity(1), inline_capacity(2), inline_capacity(4)), (18, 82, 210));
    }
}
