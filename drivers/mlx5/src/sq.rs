//! What every send queue shares (docs/reference/mlx5.md §f.5, docs/reference/umr.md §1): the WQE control
//! segment (`mlx5_wqe_ctrl_seg`, Linux `include/linux/mlx5/qp.h`) and the doorbell (the doorbell record's
//! send counter, then the first 8 bytes of the last WQE to the UAR page's doorbell register, Linux
//! `mlx5e_notify_hw` / `mlx5r_ring_db`). The Ethernet SQ ([`crate::eth`]) and the UMR queue pair
//! ([`crate::umr`]) both build their WQEs' first 16 bytes and ring their doorbells here.

use crate::platform::{DmaBuf, Platform};

/// `MLX5_SEND_WQE_BB` (a send WQE basic block) and `MLX5_SEND_WQE_DS` (a WQE's 16-byte unit).
pub const SEND_WQE_BB: usize = 64;
pub const SEND_WQE_DS: usize = 16;
/// `MLX5_BF_OFFSET`: the send doorbell register inside a UAR page (Linux `doorbell.h`).
pub const MLX5_BF_OFFSET: usize = 0x800;
/// `fm_ce_se` bit asking for a CQE (`qp.h` `MLX5_WQE_CTRL_CQ_UPDATE`).
pub const MLX5_WQE_CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `fm_ce_se` fence modes in bits 7:5 (`qp.h` `MLX5_FENCE_MODE_*`).
pub const MLX5_FENCE_MODE_NONE: u8 = 0;
pub const MLX5_FENCE_MODE_INITIATOR_SMALL: u8 = 1 << 5;
pub const MLX5_FENCE_MODE_FENCE: u8 = 2 << 5;
pub const MLX5_FENCE_MODE_STRONG_ORDERING: u8 = 3 << 5;
pub const MLX5_FENCE_MODE_SMALL_AND_FENCE: u8 = 4 << 5;
/// `MLX5_WQE_CTRL_DS_MASK`: the DS count is 6 bits.
pub const MAX_DS: usize = 0x3f;

/// A WQE's control segment, 16 bytes: `opmod_idx_opcode` (opmod 31:24, WQE index 23:8, opcode 7:0),
/// `qpn_ds` (QP or SQ number 31:8, DS count 5:0), `signature`, two reserved bytes, `fm_ce_se` and the
/// 32-bit `general_id` (for a UMR, `umr_mkey`: the key the WQE modifies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlSeg {
    pub opmod: u8,
    /// The producer counter in basic blocks at this WQE (16 bits, wrapping).
    pub wqe_index: u16,
    pub opcode: u8,
    pub qpn: u32,
    /// The WQE's length in 16-byte units, control segment included (at most [`MAX_DS`]).
    pub ds: u8,
    /// Fence mode | [`MLX5_WQE_CTRL_CQ_UPDATE`] | solicited.
    pub fm_ce_se: u8,
    pub general_id: u32,
}

impl CtrlSeg {
    pub const LEN: usize = SEND_WQE_DS;

    /// The 16 bytes.
    pub fn bytes(&self) -> [u8; 16] {
        let mut s = [0u8; 16];
        let w0 = (u32::from(self.opmod) << 24) | (u32::from(self.wqe_index) << 8) | u32::from(self.opcode);
        s[0..4].copy_from_slice(&w0.to_be_bytes());
        s[4..8].copy_from_slice(&(((self.qpn & 0xff_ffff) << 8) | u32::from(self.ds & MAX_DS as u8)).to_be_bytes());
        s[11] = self.fm_ce_se;
        s[12..16].copy_from_slice(&self.general_id.to_be_bytes());
        s
    }

    /// Writes the segment over the first 16 bytes of `wqe` (at least 16 bytes long).
    pub fn write(&self, wqe: &mut [u8]) {
        wqe[..Self::LEN].copy_from_slice(&self.bytes());
    }
}

/// Rings a send queue's doorbell after its WQEs are in memory: the doorbell record's send counter (dword 1)
/// gets the new producer counter `pc`, then the UAR doorbell register at BAR offset `doorbell` the first 8
/// bytes of the last WQE posted, as two 32-bit big-endian writes (Linux `mlx5_write64` on a 32-bit host;
/// the record first, so the HCA never sees a doorbell ahead of the counter).
pub fn ring_doorbell<P: Platform + ?Sized>(p: &P, dbr: DmaBuf, doorbell: usize, pc: u16, last_wqe: &[u8]) {
    p.dma_write32(dbr, 4, u32::from(pc));
    let w = |i: usize| u32::from_be_bytes([last_wqe[i], last_wqe[i + 1], last_wqe[i + 2], last_wqe[i + 3]]);
    p.bar_write32(doorbell, w(0));
    p.bar_write32(doorbell + 4, w(4));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_seg_golden_bytes() {
        // A UMR WQE at index 0x1234 on QP 0xabcdef, 8 DS, small-initiator fence with a CQE, on key 0x00012345.
        let c = CtrlSeg {
            opmod: 0,
            wqe_index: 0x1234,
            opcode: 0x25,
            qpn: 0xab_cdef,
            ds: 8,
            fm_ce_se: MLX5_FENCE_MODE_INITIATOR_SMALL | MLX5_WQE_CTRL_CQ_UPDATE,
            general_id: 0x0001_2345,
        };
        assert_eq!(c.bytes(), [0x00, 0x12, 0x34, 0x25, 0xab, 0xcd, 0xef, 0x08, 0, 0, 0, 0x28, 0x00, 0x01, 0x23, 0x45]);
        // opmod in the top byte; a DS count and QPN beyond their widths are cut to them.
        let c = CtrlSeg { opmod: 0x7f, wqe_index: 0xffff, opcode: 0x0a, qpn: 0x1ff_ffff, ds: 0xff, ..c };
        assert_eq!(&c.bytes()[..8], &[0x7f, 0xff, 0xff, 0x0a, 0xff, 0xff, 0xff, 0x3f]);
        assert_eq!(
            (MLX5_FENCE_MODE_FENCE, MLX5_FENCE_MODE_STRONG_ORDERING, MLX5_FENCE_MODE_SMALL_AND_FENCE),
            (0x40, 0x60, 0x80)
        );
    }
}
