//! The ConnectX's own Ethernet port as a NIC (docs/mlx5-driver.md "The Ethernet port"; docs/reference/mlx5.md
//! §i): one send queue and one receive queue with their CQs, a TIS and a TIR in a transport
//! domain, a NIC_RX root flow table forwarding the port's unicast MAC and broadcast to the TIR, and the port
//! brought up through PAOS and PMTU. Everything is created synchronously through [`Driver::exec`] before
//! `into_engines`; after that the data path ([`EthPort::transmit`], [`EthPort::receive`]) needs no command,
//! no interrupt and no allocation: frames live in preallocated DMA buffers, one per ring entry, and a full ring
//! drops and counts.
//!
//! Send (Linux `en_tx.c` / `en/txrx.h` order): the frame is copied into its slot's buffer; the WQE is a control
//! segment (opcode SEND, WQE index, SQN and DS count, CQ_UPDATE), an Ethernet segment carrying the first
//! header bytes inline as the SQ's minimal inline mode needs, and one data segment for the rest; then the
//! doorbell record gets the producer counter and the UAR page's doorbell register (offset 0x800) the first 8
//! bytes of the control segment. Receive: every RQ entry is one 16-byte data segment over its own buffer, all
//! posted at creation; a completion hands the frame out and reposts the same buffer by advancing the producer
//! counter in the doorbell record.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::command::CmdError;
use crate::cq::{CqRing, DBR_LEN};
use crate::driver::{Driver, PortState};
use crate::engine::{Event, SideClient};
use crate::handles::{FlowGroupId, FlowIndex, FlowTableId, Mkey, Pdn, Tdn, UarPage};
use crate::ifc;
use crate::ifc::cq::{MLX5_CQE_REQ, MLX5_CQE_RESP_SEND};
use crate::ifc::eth::{
    EthCaps, MLX5_CAP_INLINE_MODE_VPORT_CONTEXT, MLX5_INLINE_MODE_IP, MLX5_INLINE_MODE_NONE, MLX5_INLINE_MODE_TCP_UDP,
    MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RDY, MLX5_WQ_STATE_RST, MLX5_WQ_TYPE_CYCLIC, RqParams, SqParams, WqParams,
};
use crate::ifc::flow::FS_FT_NIC_RX;
use crate::ifc::init::{CapMode, MLX5_CAP_ETHERNET_OFFLOADS};
use crate::ifc::mkey::MkeyAccess;
use crate::objects::Cq;
use crate::platform::{Deadline, DmaBuf, PAGE_SIZE, Platform};

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
/// What the port's MTU adds to the L3 MTU (Linux `MLX5E_SW2HW_MTU`: Ethernet header, VLAN tag, FCS).
pub const HW_MTU_OVERHEAD: u16 = 22;
/// The receive WQE stride: one 16-byte data segment (`log_wq_stride` 4).
pub const RQ_WQE_LEN: usize = 16;

/// `mkc.log_page_size` of the buffers' MKEYs: log2 of the page size in bytes (4 KiB pages).
const LOG_PAGE: u8 = PAGE_SIZE.trailing_zeros() as u8;
/// `wq.log_wq_stride` of the SQ: 64-byte basic blocks.
const LOG_SQ_STRIDE: u8 = 6;
const LOG_RQ_STRIDE: u8 = 4;
/// The broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// Sizes and choices for the Ethernet port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthConfig {
    /// log2 of the frames the send ring holds.
    pub log_tx_frames: u8,
    /// log2 of the receive buffers posted.
    pub log_rx_frames: u8,
    /// Bytes per frame buffer (each ring entry owns one).
    pub buf_len: usize,
    /// The L3 MTU to set on the port (PMTU and the NIC vport context get `mtu + 22`); `None` keeps the port's.
    pub mtu: Option<u16>,
    /// PAOS/PMTU `local_port` (1-based).
    pub local_port: u8,
    /// How the buffers' local key is obtained.
    pub lkey: LkeySource,
}

impl Default for EthConfig {
    fn default() -> Self {
        EthConfig {
            log_tx_frames: 6,
            log_rx_frames: 7,
            buf_len: 2048,
            mtu: Some(1500),
            local_port: 1,
            lkey: LkeySource::Reserved,
        }
    }
}

/// Where the data segments' lkey comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LkeySource {
    /// `resd_lkey` from QUERY_SPECIAL_CONTEXTS (physical addresses, no MKEY); when the query fails with a
    /// firmware status, an MKEY per ring as for [`LkeySource::Mkey`].
    Reserved,
    /// An MTT MKEY over each ring's buffers whose virtual addresses are the buffers' device addresses.
    Mkey,
}

/// The lkey in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lkey {
    Reserved(u32),
    Mkeys { tx: Mkey, rx: Mkey },
}

/// Why the port could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EthError {
    Command {
        step: &'static str,
        error: CmdError,
    },
    NoDma {
        step: &'static str,
    },
    /// The configuration cannot work (named).
    Config(&'static str),
}

impl fmt::Display for EthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EthError::Command { step, error } => write!(f, "{step}: {error}"),
            EthError::NoDma { step } => write!(f, "{step}: no DMA memory"),
            EthError::Config(what) => write!(f, "Ethernet port configuration: {what}"),
        }
    }
}

/// Why a frame was not sent (each is counted in `tx_drops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Every send slot is still owned by the hardware.
    RingFull,
    /// Longer than a frame buffer.
    TooLong,
    /// Shorter than an Ethernet header.
    TooShort,
    /// Its headers need more inline bytes than a send slot holds (e.g. two VLAN tags in L2 inline mode).
    HeadersTooLong,
    /// The send queue is in error and waits for [`EthPort::maintain`] to recover it.
    QueueInError,
}

/// Counters (owned by the one core that runs the data path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EthStats {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_drops: u64,
    /// Error CQEs on the send queue (the SQ is then in error and flushes what follows).
    pub tx_errors: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Completions the driver refused: a length of 0 or beyond the buffer, an unexpected opcode, a WQE counter
    /// out of order.
    pub rx_drops: u64,
    /// Error CQEs on the receive queue.
    pub rx_errors: u64,
    /// Frames the HCA dropped because no receive buffer was posted (the port's Q counter `out_of_buffer`, read
    /// by [`EthPort::maintain`]; 0 without a Q counter).
    pub rx_out_of_buffer: u64,
    /// Times the send queue and the receive queue were brought back from error (ERR → RST → RDY).
    pub tx_recoveries: u64,
    pub rx_recoveries: u64,
    /// Maintenance commands that failed (a recovery step is retried a second later).
    pub maintenance_errors: u64,
}

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
    cq: CqRing,
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
    in_error: bool,
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

/// The receive side: RQ buffer, doorbell record, frame buffers, its CQ.
pub struct RxRing {
    wq: DmaBuf,
    dbr: DmaBuf,
    bufs: DmaBuf,
    cq: CqRing,
    lkey: u32,
    log_frames: u8,
    buf_len: usize,
    /// WQEs posted and WQEs completed (16 bits, as the doorbell record and `wqe_counter` carry).
    pc: u16,
    cc: u16,
    scratch: Vec<u8>,
    /// An error CQE arrived: the RQ is in ERR; consumed buffers are not posted again until it is recovered.
    in_error: bool,
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

impl PortState {
    /// From PAOS `oper_status` (1 up, 2 down; Linux `mlx5_query_port_oper_status`).
    pub fn from_paos(oper_status: u8) -> PortState {
        match oper_status {
            ifc::vport::MLX5_PORT_UP => PortState::Active,
            ifc::vport::MLX5_PORT_DOWN => PortState::Down,
            v => PortState::Unknown(v),
        }
    }

    /// The state a PORT_CHANGE event for `local_port` announces (sub-type 4 active, 1 down); `None` for other
    /// events, other ports and other sub-types.
    pub fn from_event(e: &ifc::eq::Eqe, local_port: u8) -> Option<PortState> {
        match e.event() {
            ifc::eq::Event::PortChange { port, sub_type } if port == local_port => match sub_type {
                ifc::eq::MLX5_PORT_CHANGE_SUBTYPE_ACTIVE => Some(PortState::Active),
                ifc::eq::MLX5_PORT_CHANGE_SUBTYPE_DOWN => Some(PortState::Down),
                _ => None,
            },
            _ => None,
        }
    }
}

/// What [`wait_link_up`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkWait {
    Up,
    /// The deadline passed first; the link may still come up (link training takes seconds).
    NotYet(PortState),
}

/// PAOS write `admin_status` = up for `local_port`.
pub fn port_admin_up<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<(), CmdError> {
    d.exec(ifc::vport::paos_set(local_port, ifc::vport::MLX5_PORT_UP)).map(drop)
}

/// PAOS read: the operational state of `local_port`.
pub fn query_port_state<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<PortState, CmdError> {
    match d.exec(ifc::vport::paos_query(local_port)) {
        Ok(o) => Ok(PortState::from_paos(ifc::vport::paos_out(&o).oper_status)),
        // Best effort on a VF: its firmware may refuse the physical port's register; the vport state (Linux
        // `mlx5_query_vport_state`, what `mlx5e_update_carrier` reads) says whether its link is up.
        Err(e) if d.info.vf && e.status().is_some() => {
            let o = d.exec(ifc::vport::query_vport_state())?;
            Ok(match ifc::vport::query_vport_state_out(&o).state {
                ifc::vport::MLX5_VPORT_STATE_UP => PortState::Active,
                _ => PortState::Down,
            })
        }
        Err(e) => Err(e),
    }
}

/// The port's PMTU; on a VF whose firmware refuses the register (best effort, as Linux's VF gets by with the
/// vport's MTU, `mlx5_query_nic_vport_mtu`), the NIC vport context's `mtu` stands for all three (the maximum
/// then is what the vport has: a VF cannot raise it past what it cannot see).
pub fn port_mtu<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<ifc::vport::Pmtu, CmdError> {
    port_mtu_or_vport(d, local_port).map(|(pmtu, _)| pmtu)
}

/// [`port_mtu`], and whether it came from the vport context because the VF's firmware refused PMTU.
pub fn port_mtu_or_vport<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<(ifc::vport::Pmtu, bool), CmdError> {
    match d.exec(ifc::vport::pmtu_query(local_port)) {
        Ok(o) => Ok((ifc::vport::pmtu_out(&o), false)),
        Err(e) if d.info.vf && e.status().is_some() => {
            let o = d.exec(ifc::vport::query_nic_vport_context())?;
            let mtu = ifc::vport::query_nic_vport_context_out(&o).mtu;
            Ok((ifc::vport::Pmtu { max_mtu: mtu, admin_mtu: mtu, oper_mtu: mtu }, true))
        }
        Err(e) => Err(e),
    }
}

/// Polls PAOS until the port is up or `ms` have passed; a port still down is not an error.
pub fn wait_link_up<P: Platform>(d: &mut Driver<P>, local_port: u8, ms: u64) -> Result<LinkWait, CmdError> {
    let p = d.platform().clone();
    let deadline = Deadline::after(p.as_ref(), ms);
    loop {
        let s = query_port_state(d, local_port)?;
        if s == PortState::Active {
            return Ok(LinkWait::Up);
        }
        if deadline.passed(p.as_ref()) {
            return Ok(LinkWait::NotYet(s));
        }
        // Between reads: a millisecond of relaxing (a PAOS read is a firmware command).
        let pause = Deadline::after(p.as_ref(), 1);
        while !pause.passed(p.as_ref()) {
            p.relax();
        }
    }
}

/// Sets the port MTU for an L3 `mtu` as Linux `mlx5e_set_mtu` does: PMTU `admin_mtu` and the NIC vport context
/// `mtu` get `mtu + 22`; refused beyond the port's `max_mtu`. Returns the PMTU read back. As a VF only the
/// vport context changes: the physical port's MTU is the PF's (its firmware refuses the PMTU write).
pub fn set_port_mtu<P: Platform>(d: &mut Driver<P>, local_port: u8, mtu: u16) -> Result<ifc::vport::Pmtu, EthError> {
    let step = |step: &'static str| move |error| EthError::Command { step, error };
    let hw = mtu.checked_add(HW_MTU_OVERHEAD).ok_or(EthError::Config("MTU too large"))?;
    let cur = port_mtu(d, local_port).map_err(step("ACCESS_REG PMTU"))?;
    if hw > cur.max_mtu {
        return Err(EthError::Config("MTU beyond the port's max_mtu"));
    }
    if !d.info.vf {
        d.exec(ifc::vport::pmtu_set(local_port, hw)).map_err(step("ACCESS_REG PMTU write"))?;
    }
    d.exec(ifc::vport::modify_nic_vport_mtu(hw)).map_err(step("MODIFY_NIC_VPORT_CONTEXT mtu"))?;
    port_mtu(d, local_port).map_err(step("ACCESS_REG PMTU"))
}

/// The port's objects (for teardown; each present once created).
#[derive(Default)]
struct Objects {
    pd: Option<Pdn>,
    td: Option<Tdn>,
    uar: Option<UarPage>,
    tisn: Option<u32>,
    tx_cq: Option<Cq>,
    rx_cq: Option<Cq>,
    sqn: Option<u32>,
    rqn: Option<u32>,
    tirn: Option<u32>,
    mkeys: Vec<Mkey>,
    table: Option<FlowTableId>,
    group: Option<FlowGroupId>,
    ftes: Vec<FlowIndex>,
    root: bool,
    /// The Q counter the RQ counts into.
    q_counter: Option<u8>,
    /// DMA memory the queues use, freed once the queues are destroyed.
    dma: Vec<DmaBuf>,
}

impl Objects {
    /// Destroys everything in reverse; returns the first error. DMA memory is freed only when every queue that
    /// could reach it was destroyed (otherwise it is leaked on purpose).
    fn undo<P: Platform>(&mut self, d: &mut Driver<P>) -> Result<(), EthError> {
        let mut first: Option<EthError> = None;
        let mut note = |step: &'static str, r: Result<crate::command::Output, CmdError>| match r {
            Ok(_) => true,
            Err(error) => {
                if first.is_none() {
                    first = Some(EthError::Command { step, error });
                }
                false
            }
        };
        if self.root && note("SET_FLOW_TABLE_ROOT disconnect", d.exec(ifc::flow::clear_flow_table_root(FS_FT_NIC_RX))) {
            self.root = false;
        }
        if let Some(t) = self.table {
            while let Some(i) = self.ftes.pop() {
                note("DELETE_FLOW_TABLE_ENTRY", d.exec(ifc::flow::delete_fte(FS_FT_NIC_RX, t, i)));
            }
            if let Some(g) = self.group.take() {
                note("DESTROY_FLOW_GROUP", d.exec(ifc::flow::destroy_flow_group(FS_FT_NIC_RX, t, g)));
            }
            if note("DESTROY_FLOW_TABLE", d.exec(ifc::flow::destroy_flow_table(FS_FT_NIC_RX, t))) {
                self.table = None;
            }
        }
        if let Some(t) = self.tirn.take() {
            note("DESTROY_TIR", d.exec(ifc::eth::destroy_tir(t)));
        }
        let mut queues_gone = true;
        if let Some(r) = self.rqn.take() {
            queues_gone &= note("DESTROY_RQ", d.exec(ifc::eth::destroy_rq(r)));
        }
        // The counter set outlives the RQ counting into it (the firmware refuses to free one still in use).
        if queues_gone && let Some(q) = self.q_counter.take() {
            note("DEALLOC_Q_COUNTER", d.exec(ifc::eth::dealloc_q_counter(q)));
        }
        if let Some(s) = self.sqn.take() {
            queues_gone &= note("DESTROY_SQ", d.exec(ifc::eth::destroy_sq(s)));
        }
        for cq in [self.tx_cq.take(), self.rx_cq.take()].into_iter().flatten() {
            if let Err((_, error)) = d.destroy_cq(cq) {
                queues_gone = false;
                note("DESTROY_CQ", Err(error));
            }
        }
        if let Some(t) = self.tisn.take() {
            note("DESTROY_TIS", d.exec(ifc::eth::destroy_tis(t)));
        }
        for k in self.mkeys.drain(..) {
            note("DESTROY_MKEY", d.exec(ifc::mkey::destroy_mkey(k.index())));
        }
        if let Some(u) = self.uar.take() {
            note("DEALLOC_UAR", d.exec(ifc::resources::dealloc_uar(u)));
        }
        if let Some(t) = self.td.take() {
            note("DEALLOC_TRANSPORT_DOMAIN", d.exec(ifc::resources::dealloc_transport_domain(t)));
        }
        if let Some(pd) = self.pd.take() {
            note("DEALLOC_PD", d.exec(ifc::resources::dealloc_pd(pd)));
        }
        if queues_gone {
            let p = d.platform().clone();
            for b in self.dma.drain(..) {
                p.dma_free(b);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What the port was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthInfo {
    pub mac: [u8; 6],
    pub caps: EthCaps,
    /// The SQ's minimal inline mode (`MLX5_INLINE_MODE_*`).
    pub inline_mode: u8,
    pub lkey: Lkey,
    pub pd: Pdn,
    pub td: Tdn,
    pub uar: UarPage,
    pub tisn: u32,
    pub tx_cqn: crate::handles::Cqn,
    pub rx_cqn: crate::handles::Cqn,
    pub sqn: u32,
    pub rqn: u32,
    pub tirn: u32,
    pub table: FlowTableId,
    /// PMTU after bring-up.
    pub pmtu: ifc::vport::Pmtu,
    /// The Q counter the RQ counts into (`None` when the HCA has none to give: `max_qp_cnt` 0, or ALLOC failed).
    pub q_counter: Option<u8>,
}

/// How often [`EthPort::maintain`] reads the Q counter.
pub const Q_COUNTER_PERIOD_MS: u64 = 1_000;
/// How long a failed recovery step waits before it is tried again.
pub const RECOVERY_RETRY_MS: u64 = 1_000;

/// Which command a maintenance tag belongs to (one in flight each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Counter = 1,
    Sq = 2,
    Rq = 3,
}
// The largest maintenance tag is one the command engine takes (`engine::CLIENT_TAG_BITS` owns the layout).
const _: () = assert!((((Purpose::Rq as u64) << 32) | 0xffff_ffff) & !crate::engine::CLIENT_TAG_BITS == 0);

/// Where a queue's recovery stands: the next command to send (Linux `mlx5e_tx_reporter_err_cqe_recover` and
/// `mlx5e_flush_rq`: read the state, ERR → RST, the ring reset, RST → RDY, the buffers posted again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Query,
    ToReset,
    ToReady,
}

#[derive(Clone, Copy, Debug)]
struct Recovery {
    step: Step,
    /// The tag of the command in flight.
    tag: Option<u64>,
    not_before_ms: u64,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery { step: Step::Query, tag: None, not_before_ms: 0 }
    }
}

/// The port's maintenance state (see [`EthPort::maintain`]).
#[derive(Debug, Default)]
struct Maintenance {
    counter_tag: Option<u64>,
    next_counter_ms: u64,
    /// The last `out_of_buffer` read (the counter is free-running; the stats get the differences).
    last_out_of_buffer: u32,
    sq: Recovery,
    rq: Recovery,
    seq: u64,
}

impl Maintenance {
    /// A side-client tag: the purpose above bit 32, a sequence number below; always within the engine's
    /// client bits (checked at build time below).
    fn tag(&mut self, purpose: Purpose) -> u64 {
        self.seq = (self.seq + 1) & 0xffff_ffff;
        ((purpose as u64) << 32) | self.seq
    }

    /// Sends the next command of the SQ's or RQ's recovery (`command` builds it for the current step), unless
    /// one is in flight or the retry time has not come; returns whether one went out.
    fn recover(
        &mut self,
        purpose: Purpose,
        side: &mut SideClient,
        now_ms: u64,
        command: impl FnOnce(Step) -> crate::command::Command,
    ) -> bool {
        let r = if purpose == Purpose::Sq { self.sq } else { self.rq };
        if r.tag.is_some() || now_ms < r.not_before_ms {
            return false;
        }
        let tag = self.tag(purpose);
        if side.submit_as(tag, command(r.step)).is_err() {
            return false;
        }
        let r = if purpose == Purpose::Sq { &mut self.sq } else { &mut self.rq };
        r.tag = Some(tag);
        true
    }
}

/// The Ethernet port: its objects, rings, counters and link state.
pub struct EthPort<P: Platform> {
    p: alloc::sync::Arc<P>,
    pub info: EthInfo,
    tx: TxRing,
    rx: RxRing,
    stats: EthStats,
    state: PortState,
    local_port: u8,
    objects: Objects,
    maint: Maintenance,
}

impl<P: Platform> EthPort<P> {
    /// Builds the port (see the module documentation for the order). On failure everything built so far is
    /// destroyed again.
    pub fn create(d: &mut Driver<P>, cfg: &EthConfig) -> Result<EthPort<P>, EthError> {
        if cfg.buf_len < 64 || cfg.log_tx_frames > 12 || cfg.log_rx_frames > 15 {
            return Err(EthError::Config("buffer size or ring size out of range"));
        }
        if let Some(mtu) = cfg.mtu
            && usize::from(mtu) + usize::from(HW_MTU_OVERHEAD) > cfg.buf_len
        {
            return Err(EthError::Config("MTU larger than a frame buffer"));
        }
        let mut o = Objects::default();
        match Self::build(d, cfg, &mut o) {
            Ok(port) => Ok(port),
            Err(e) => {
                let _ = o.undo(d);
                Err(e)
            }
        }
    }

    fn build(d: &mut Driver<P>, cfg: &EthConfig, o: &mut Objects) -> Result<EthPort<P>, EthError> {
        let p = d.platform().clone();
        let step = |step: &'static str| move |error| EthError::Command { step, error };
        // Ethernet capabilities and the minimal inline mode (Linux `mlx5_query_min_inline`).
        let caps = d
            .exec(ifc::init::query_hca_cap(MLX5_CAP_ETHERNET_OFFLOADS, CapMode::Cur))
            .map_err(step("QUERY_HCA_CAP ETHERNET_OFFLOADS"))?;
        let caps = EthCaps::parse(ifc::init::hca_cap_block(&caps));
        let vport = d.exec(ifc::vport::query_nic_vport_context()).map_err(step("QUERY_NIC_VPORT_CONTEXT"))?;
        let mac = ifc::vport::query_nic_vport_context_out(&vport).permanent_address;
        let vport_mode = ifc::eth::nic_vport_min_wqe_inline_mode(&vport);
        let inline_mode = ifc::eth::min_inline_mode(&caps, Some(vport_mode));
        let sq_inline = (caps.wqe_inline_mode == MLX5_CAP_INLINE_MODE_VPORT_CONTEXT).then_some(inline_mode);
        if inline_mode > MLX5_INLINE_MODE_TCP_UDP {
            return Err(EthError::Config("unknown minimal inline mode"));
        }

        let pd = d.alloc_pd().map_err(step("ALLOC_PD"))?;
        o.pd = Some(pd);
        let td = d.alloc_td().map_err(step("ALLOC_TRANSPORT_DOMAIN"))?;
        o.td = Some(td);
        let uar = d.alloc_uar().map_err(step("ALLOC_UAR"))?;
        o.uar = Some(uar);
        // A Q counter for the RQ (Linux `mlx5e_create_q_counters`), when the function may have one; a refusal
        // by the firmware leaves the port without (its drops are then not counted).
        if d.info.caps.max_qp_cnt > 0 {
            match d.exec(ifc::eth::alloc_q_counter()) {
                Ok(out) => o.q_counter = Some(ifc::eth::alloc_q_counter_out(&out)),
                Err(e) if e.status().is_some() => log::warn!("mlx5: Ethernet port without a Q counter: {e}"),
                Err(e) => return Err(step("ALLOC_Q_COUNTER")(e)),
            }
        }

        // DMA memory: frame buffers, the SQ and RQ buffers, two doorbell records.
        let tx_frames = 1usize << cfg.log_tx_frames;
        let rx_frames = 1usize << cfg.log_rx_frames;
        let slot_bbs = wqebbs_per_slot(inline_mode);
        let mut alloc = |len: usize, align: usize, what: &'static str| -> Result<DmaBuf, EthError> {
            let b = p.dma_alloc(len, align).ok_or(EthError::NoDma { step: what })?;
            o.dma.push(b);
            Ok(b)
        };
        let page = |n: usize| n.next_multiple_of(PAGE_SIZE);
        let tx_bufs = alloc(page(tx_frames * cfg.buf_len), PAGE_SIZE, "TX buffers")?;
        let rx_bufs = alloc(page(rx_frames * cfg.buf_len), PAGE_SIZE, "RX buffers")?;
        let sq_buf = alloc(page(tx_frames * slot_bbs * SEND_WQE_BB), PAGE_SIZE, "SQ buffer")?;
        let rq_buf = alloc(page(rx_frames * RQ_WQE_LEN), PAGE_SIZE, "RQ buffer")?;
        let sq_dbr = alloc(DBR_LEN, DBR_LEN, "SQ doorbell record")?;
        let rq_dbr = alloc(DBR_LEN, DBR_LEN, "RQ doorbell record")?;
        let pages =
            |b: DmaBuf| -> Vec<u64> { (0..b.len() / PAGE_SIZE).map(|i| b.at((i * PAGE_SIZE) as u64)).collect() };

        // The lkey: the reserved one, or an MKEY per ring over its buffers (virtual = device addresses).
        let reserved = match cfg.lkey {
            LkeySource::Reserved => match d.exec(ifc::eth::query_special_contexts()) {
                Ok(out) => Some(ifc::eth::query_special_contexts_out(&out).resd_lkey),
                Err(e) if e.status().is_some() => None,
                Err(e) => return Err(step("QUERY_SPECIAL_CONTEXTS")(e)),
            },
            LkeySource::Mkey => None,
        };
        let lkey = match reserved {
            Some(k) => Lkey::Reserved(k),
            None => {
                let access = MkeyAccess::LOCAL_READ.union(MkeyAccess::LOCAL_WRITE);
                let mut mk = |b: DmaBuf| {
                    d.create_mkey(pd, b.addr(), b.len() as u64, access, LOG_PAGE, &pages(b))
                        .map_err(step("CREATE_MKEY"))
                };
                let tx = mk(tx_bufs)?;
                o.mkeys.push(tx);
                let rx = mk(rx_bufs)?;
                o.mkeys.push(rx);
                Lkey::Mkeys { tx, rx }
            }
        };
        let (tx_lkey, rx_lkey) = match lkey {
            Lkey::Reserved(k) => (k, k),
            Lkey::Mkeys { tx, rx } => (tx.0, rx.0),
        };

        let tisn = d.exec(ifc::eth::create_tis(td)).map_err(step("CREATE_TIS"))?;
        let tisn = ifc::eth::create_tis_out(&tisn);
        o.tisn = Some(tisn);
        // The send CQ has an entry per basic block, not per frame (Linux `mlx5e_build_tx_cq_param`: log_cq_size
        // = the SQ's log_wq_sz in WQEBBs): only a slot's last WQE asks for a CQE, but an SQ in error flushes
        // every posted WQE with a CQE of its own, and a slot may hold the frame's WQE and NOPs.
        let log_sq_bbs = cfg.log_tx_frames + slot_bbs.trailing_zeros() as u8;
        let tx_cq = d.create_cq(u32::from(log_sq_bbs)).map_err(step("CREATE_CQ (send)"))?;
        let tx_cqn = tx_cq.cqn;
        o.tx_cq = Some(tx_cq);
        let rx_cq = d.create_cq(u32::from(cfg.log_rx_frames)).map_err(step("CREATE_CQ (receive)"))?;
        let rx_cqn = rx_cq.cqn;
        o.rx_cq = Some(rx_cq);

        // SQ: cyclic, 64-byte strides, rung through the port's UAR page; RST → RDY.
        let sq_pages = pages(sq_buf);
        // With the reserved lkey the queues are created with `rlky`, which lets their WQEs use it.
        let rlky = matches!(lkey, Lkey::Reserved(_));
        let sq = ifc::eth::create_sq(&SqParams {
            rlky,
            cqn: tx_cqn,
            tisn,
            min_wqe_inline_mode: sq_inline,
            wq: WqParams {
                wq_type: MLX5_WQ_TYPE_CYCLIC,
                pd,
                uar_page: uar,
                dbr_addr: sq_dbr.addr(),
                log_wq_stride: LOG_SQ_STRIDE,
                log_wq_pg_sz: 0,
                log_wq_sz: log_sq_bbs,
                pages: &sq_pages,
            },
        });
        let sqn = ifc::eth::create_sq_out(&d.exec(sq).map_err(step("CREATE_SQ"))?);
        o.sqn = Some(sqn);
        d.exec(ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY)).map_err(step("MODIFY_SQ RST2RDY"))?;

        // RQ: cyclic, one data segment per WQE; RST → RDY. Its WQEs are written and posted once it is ready
        // (Linux posts receive WQEs after the RQ reached RDY).
        let rq_pages = pages(rq_buf);
        let rq = ifc::eth::create_rq(&RqParams {
            rlky,
            cqn: rx_cqn,
            vlan_strip_disable: true,
            counter_set_id: o.q_counter.unwrap_or(0),
            wq: WqParams {
                wq_type: MLX5_WQ_TYPE_CYCLIC,
                pd,
                uar_page: UarPage(0),
                dbr_addr: rq_dbr.addr(),
                log_wq_stride: LOG_RQ_STRIDE,
                log_wq_pg_sz: 0,
                log_wq_sz: cfg.log_rx_frames,
                pages: &rq_pages,
            },
        });
        let rqn = ifc::eth::create_rq_out(&d.exec(rq).map_err(step("CREATE_RQ"))?);
        o.rqn = Some(rqn);
        d.exec(ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY)).map_err(step("MODIFY_RQ RST2RDY"))?;

        let tirn = ifc::eth::create_tir_out(&d.exec(ifc::eth::create_tir_direct(td, rqn)).map_err(step("CREATE_TIR"))?);
        o.tirn = Some(tirn);

        // NIC_RX root table: the port's MAC and broadcast → the TIR.
        let t = d.exec(ifc::flow::create_flow_table(FS_FT_NIC_RX, 0, 1)).map_err(step("CREATE_FLOW_TABLE"))?;
        let table = ifc::flow::create_flow_table_out(&t);
        o.table = Some(table);
        let g =
            d.exec(ifc::flow::create_flow_group_dmac(FS_FT_NIC_RX, table, 0, 1)).map_err(step("CREATE_FLOW_GROUP"))?;
        let group = ifc::flow::create_flow_group_out(&g);
        o.group = Some(group);
        for (i, dmac) in [mac, BROADCAST].into_iter().enumerate() {
            let idx = FlowIndex(i as u32);
            d.exec(ifc::flow::set_fte_dmac_to_tir(FS_FT_NIC_RX, table, group, idx, dmac, tirn))
                .map_err(step("SET_FLOW_TABLE_ENTRY"))?;
            o.ftes.push(idx);
        }
        d.exec(ifc::flow::set_flow_table_root(FS_FT_NIC_RX, table)).map_err(step("SET_FLOW_TABLE_ROOT"))?;
        o.root = true;

        // The port: administratively up (PF only: a VF's link is the PF's business, and its firmware refuses
        // the PAOS write), MTU, state.
        if !d.info.vf {
            port_admin_up(d, cfg.local_port).map_err(step("ACCESS_REG PAOS write"))?;
        }
        let pmtu = match cfg.mtu {
            Some(mtu) => set_port_mtu(d, cfg.local_port, mtu)?,
            None => port_mtu(d, cfg.local_port).map_err(step("ACCESS_REG PMTU"))?,
        };
        let state = query_port_state(d, cfg.local_port).map_err(step("ACCESS_REG PAOS"))?;

        // Hand the CQ rings to the data path: receive WQEs written and all posted, the send ring empty.
        let (Some(tx_cq), Some(rx_cq)) = (o.tx_cq.take(), o.rx_cq.take()) else {
            return Err(EthError::Config("CQ missing"));
        };
        let rx_parts = RxParts {
            lkey: rx_lkey,
            log_frames: cfg.log_rx_frames,
            buf_len: cfg.buf_len,
            wq: rq_buf,
            dbr: rq_dbr,
            bufs: rx_bufs,
        };
        let mut rx = RxRing::new(p.as_ref(), rx_parts, rx_cq.ring);
        rx.post_all(p.as_ref());
        let tx = TxRing::new(
            TxParts {
                sqn,
                uar,
                lkey: tx_lkey,
                log_frames: cfg.log_tx_frames,
                inline_mode,
                buf_len: cfg.buf_len,
                wq: sq_buf,
                dbr: sq_dbr,
                bufs: tx_bufs,
            },
            tx_cq.ring,
        );
        let q_counter = o.q_counter;
        let info = EthInfo {
            mac,
            caps,
            inline_mode,
            lkey,
            pd,
            td,
            uar,
            tisn,
            tx_cqn,
            rx_cqn,
            sqn,
            rqn,
            tirn,
            table,
            pmtu,
            q_counter,
        };
        Ok(EthPort {
            p,
            info,
            tx,
            rx,
            stats: EthStats::default(),
            state,
            local_port: cfg.local_port,
            objects: core::mem::take(o),
            maint: Maintenance::default(),
        })
    }

    /// The port's upkeep after `into_engines`, driven by its owner (the core that runs the data path) with the
    /// command engine's [`SideClient`]; never waits. Each call first takes the side's completions, then submits
    /// what is due, at most one command in flight per purpose:
    ///
    /// - every [`Q_COUNTER_PERIOD_MS`], QUERY_Q_COUNTER; `out_of_buffer` grows `rx_out_of_buffer` by what it
    ///   moved since the last read;
    /// - when an error CQE put the SQ or the RQ in error, its recovery, one step per completion: QUERY_SQ/RQ
    ///   (nothing to do unless the queue is in ERR), MODIFY ERR → RST, the ring reset (leftover CQEs consumed,
    ///   counters and doorbell record 0, the receive WQEs written afresh), MODIFY RST → RDY, then for the RQ every
    ///   buffer posted again. Sends are refused ([`Dropped::QueueInError`]) and received buffers not reposted
    ///   meanwhile. A failed step counts in `maintenance_errors` and is tried again after
    ///   [`RECOVERY_RETRY_MS`].
    ///
    /// Once the HCA is fatal nothing more is submitted. `now_ms` is any monotonic millisecond clock. Returns
    /// whether anything happened.
    pub fn maintain(&mut self, side: &mut SideClient, now_ms: u64) -> bool {
        let p = self.p.clone();
        let mut did = false;
        while let Some(c) = side.poll() {
            did = true;
            let m = &mut self.maint;
            if m.counter_tag == Some(c.tag) {
                m.counter_tag = None;
                match c.result {
                    Ok(out) => {
                        let v = ifc::eth::query_q_counter_out_of_buffer(&out);
                        self.stats.rx_out_of_buffer += u64::from(v.wrapping_sub(m.last_out_of_buffer));
                        m.last_out_of_buffer = v;
                    }
                    Err(e) => {
                        self.stats.maintenance_errors += 1;
                        log::warn!("mlx5: Ethernet port: {e}");
                    }
                }
            } else if m.sq.tag == Some(c.tag) {
                m.sq.tag = None;
                let tx = &mut self.tx;
                Self::advance(&mut m.sq, c.result, now_ms, &mut self.stats, |step, out, stats| match step {
                    Step::Query => match ifc::eth::query_sq_out(out).state {
                        MLX5_WQ_STATE_ERR => Some(Step::ToReset),
                        MLX5_WQ_STATE_RST => {
                            tx.reset(p.as_ref(), stats);
                            Some(Step::ToReady)
                        }
                        _ => {
                            tx.in_error = false;
                            None
                        }
                    },
                    Step::ToReset => {
                        tx.reset(p.as_ref(), stats);
                        Some(Step::ToReady)
                    }
                    Step::ToReady => {
                        tx.in_error = false;
                        stats.tx_recoveries += 1;
                        None
                    }
                });
            } else if m.rq.tag == Some(c.tag) {
                m.rq.tag = None;
                let rx = &mut self.rx;
                Self::advance(&mut m.rq, c.result, now_ms, &mut self.stats, |step, out, stats| match step {
                    Step::Query => match ifc::eth::query_rq_out(out).state {
                        MLX5_WQ_STATE_ERR => Some(Step::ToReset),
                        MLX5_WQ_STATE_RST => {
                            rx.reset(p.as_ref(), stats);
                            Some(Step::ToReady)
                        }
                        _ => {
                            // Ready after all: post again what was consumed meanwhile.
                            rx.post_all(p.as_ref());
                            None
                        }
                    },
                    Step::ToReset => {
                        rx.reset(p.as_ref(), stats);
                        Some(Step::ToReady)
                    }
                    Step::ToReady => {
                        rx.post_all(p.as_ref());
                        stats.rx_recoveries += 1;
                        None
                    }
                });
            }
        }
        if side.fatal().is_some() {
            return did;
        }
        let (sqn, rqn) = (self.info.sqn, self.info.rqn);
        let m = &mut self.maint;
        if let Some(q) = self.info.q_counter
            && m.counter_tag.is_none()
            && now_ms >= m.next_counter_ms
        {
            let tag = m.tag(Purpose::Counter);
            if side.submit_as(tag, ifc::eth::query_q_counter(q)).is_ok() {
                m.counter_tag = Some(tag);
                m.next_counter_ms = now_ms + Q_COUNTER_PERIOD_MS;
                did = true;
            }
        }
        if self.tx.in_error {
            did |= m.recover(Purpose::Sq, side, now_ms, |step| match step {
                Step::Query => ifc::eth::query_sq(sqn),
                Step::ToReset => ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RST),
                Step::ToReady => ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY),
            });
        }
        if self.rx.in_error {
            did |= m.recover(Purpose::Rq, side, now_ms, |step| match step {
                Step::Query => ifc::eth::query_rq(rqn),
                Step::ToReset => ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_ERR, MLX5_WQ_STATE_RST),
                Step::ToReady => ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY),
            });
        }
        did
    }

    /// Whether a maintenance command is in flight.
    pub fn maintenance_pending(&self) -> bool {
        let m = &self.maint;
        m.counter_tag.is_some() || m.sq.tag.is_some() || m.rq.tag.is_some()
    }

    /// Whether the send or the receive queue waits for recovery.
    pub fn in_error(&self) -> (bool, bool) {
        (self.tx.in_error, self.rx.in_error)
    }

    /// One recovery step finished: `on_ok` says the next step (`None`: done, back to the start). A failure is
    /// counted, and the same step waits [`RECOVERY_RETRY_MS`].
    fn advance(
        r: &mut Recovery,
        result: Result<crate::command::Output, CmdError>,
        now_ms: u64,
        stats: &mut EthStats,
        on_ok: impl FnOnce(Step, &crate::command::Output, &mut EthStats) -> Option<Step>,
    ) {
        match result {
            Ok(out) => r.step = on_ok(r.step, &out, stats).unwrap_or(Step::Query),
            Err(e) => {
                stats.maintenance_errors += 1;
                r.not_before_ms = now_ms + RECOVERY_RETRY_MS;
                log::warn!("mlx5: Ethernet port recovery: {e}");
            }
        }
    }

    /// Sends one frame; a full send ring (after reaping completions), a frame longer than a buffer or shorter
    /// than an Ethernet header is dropped and counted.
    pub fn transmit(&mut self, frame: &[u8]) -> Result<(), Dropped> {
        self.tx.transmit(self.p.as_ref(), &mut self.stats, frame)
    }

    /// Sends a `len`-byte frame written by `fill` (a network stack's transmit token).
    pub fn transmit_with<R>(&mut self, len: usize, fill: impl FnOnce(&mut [u8]) -> R) -> Result<R, Dropped> {
        self.tx.transmit_with(self.p.as_ref(), &mut self.stats, len, fill)
    }

    /// Frees send slots whose completions arrived.
    pub fn poll_tx(&mut self) -> usize {
        self.tx.reap(self.p.as_ref(), &mut self.stats)
    }

    /// Hands up to `budget` received frames to `deliver` and reposts their buffers; also reaps send
    /// completions. Returns the frames delivered.
    pub fn receive(&mut self, budget: usize, deliver: impl FnMut(&mut [u8])) -> usize {
        self.tx.reap(self.p.as_ref(), &mut self.stats);
        self.rx.receive(self.p.as_ref(), &mut self.stats, budget, deliver)
    }

    /// Free send slots.
    pub fn tx_room(&self) -> usize {
        self.tx.room()
    }

    pub fn stats(&self) -> EthStats {
        self.stats
    }

    /// The link state as last read or announced.
    pub fn state(&self) -> PortState {
        self.state
    }

    /// Sets the link state from an announcement read elsewhere (the event engine records PORT_CHANGE events in
    /// [`crate::engine::Shared::port_event`] for whichever core drives the port).
    pub fn set_state(&mut self, s: PortState) {
        self.state = s;
    }

    /// The port's PAOS / PORT_CHANGE number (1-based).
    pub fn local_port(&self) -> u8 {
        self.local_port
    }

    /// Keeps the link state current from a PORT_CHANGE event (other events are ignored). Returns the new state
    /// when the event changed it.
    pub fn on_event(&mut self, e: &Event) -> Option<PortState> {
        let Event::Async(eqe) = e else { return None };
        let s = PortState::from_event(eqe, self.local_port)?;
        let changed = s != self.state;
        self.state = s;
        changed.then_some(s)
    }

    /// Re-reads the link state (before `into_engines`, or whenever the driver is at hand) as Linux
    /// `mlx5e_update_carrier` does on a PORT_CHANGE: QUERY_VPORT_STATE of the function's own vNIC vport
    /// (`state` 1 up, 0 down), which a VF may ask as well as a PF.
    pub fn refresh_state(&mut self, d: &mut Driver<P>) -> Result<PortState, CmdError> {
        let o = d.exec(ifc::vport::query_vport_state())?;
        self.state = match ifc::vport::query_vport_state_out(&o).state {
            ifc::vport::MLX5_VPORT_STATE_UP => PortState::Active,
            _ => PortState::Down,
        };
        Ok(self.state)
    }

    /// Polls the link for up to `ms` and records what it saw; a link still down is `NotYet`, not an error.
    pub fn wait_link_up(&mut self, d: &mut Driver<P>, ms: u64) -> Result<LinkWait, CmdError> {
        let w = wait_link_up(d, self.local_port, ms)?;
        self.state = match w {
            LinkWait::Up => PortState::Active,
            LinkWait::NotYet(s) => s,
        };
        Ok(w)
    }

    /// QUERY_SQ and QUERY_RQ: the queues as the HCA sees them (state, CQ, work queue, counters).
    pub fn query_queues(&self, d: &mut Driver<P>) -> Result<(ifc::eth::SqInfo, ifc::eth::RqInfo), CmdError> {
        let sq = d.exec(ifc::eth::query_sq(self.info.sqn))?;
        let rq = d.exec(ifc::eth::query_rq(self.info.rqn))?;
        Ok((ifc::eth::query_sq_out(&sq), ifc::eth::query_rq_out(&rq)))
    }

    /// Destroys the port in reverse (root disconnected, entries, group, table, TIR, RQ, Q counter, SQ, CQs, TIS,
    /// MKEYs, UAR, TD, PD), then frees its DMA memory. Needs the synchronous driver (before `into_engines`). The first
    /// failing step is reported; the rest still run, and memory a queue may still reach is not freed.
    pub fn destroy(self, d: &mut Driver<P>) -> Result<(), EthError> {
        let EthPort { info, tx, rx, mut objects, .. } = self;
        objects.tx_cq = Some(Cq { cqn: info.tx_cqn, ring: tx.cq });
        objects.rx_cq = Some(Cq { cqn: info.rx_cqn, ring: rx.cq });
        objects.undo(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::cq::{CQE_SIZE, MLX5_CQE_RESP_ERR, MLX5_CQE_SYNDROME_WR_FLUSH_ERR};
    use crate::ifc::eth::MLX5_INLINE_MODE_L2;
    use crate::ifc::golden::{be16, be32, be64};
    use crate::testing::Fake;

    const SQN: u32 = 0x12_3456;
    const UAR: u32 = 5;
    const LKEY: u32 = 0xabc;
    const BUF: usize = 2048;

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

    /// The device's side: a CQE with `opcode`, `wqe_counter`, `byte_cnt` at CQ index `i` of the first pass.
    fn put_cqe(p: &Fake, cq: &CqRing, i: usize, opcode: u8, wqe_counter: u16, byte_cnt: u32, syndrome: u8) {
        let mut e = [0u8; CQE_SIZE];
        e[0x2c..0x30].copy_from_slice(&byte_cnt.to_be_bytes());
        e[0x37] = syndrome;
        e[0x3c..0x3e].copy_from_slice(&wqe_counter.to_be_bytes());
        let pass = (i >> cq.log_size) & 1;
        e[0x3f] = (opcode << 4) | pass as u8;
        let at = (i & ((1 << cq.log_size) - 1)) * CQE_SIZE;
        p.dma_write(cq.buf, at, &e);
    }

    fn frame(len: usize) -> Vec<u8> {
        // Broadcast destination, a source MAC, ethertype ARP (0x0806), then a counting payload.
        let mut f: Vec<u8> = (0..len).map(|i| i as u8).collect();
        f[..6].fill(0xff);
        f[6..12].copy_from_slice(&[2, 0x4c, 0x42, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f
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
        assert_eq!(*p.bar.lock(), vec![(db, MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 4)]);

        // The second frame: slot 1, WQE index 1, its own buffer.
        let g = frame(100);
        tx.transmit(&p, &mut st, &g).unwrap();
        let w = p.bytes(tx.wq, SEND_WQE_BB, SEND_WQE_BB);
        assert_eq!(be32(&w, 0), (1 << 8) | MLX5_OPCODE_SEND as u32);
        assert_eq!((be32(&w, 0x30), be64(&w, 0x38)), (82, tx.bufs.at((BUF + 18) as u64)));
        assert_eq!(p.bytes(tx.bufs, BUF, 100), g);
        assert_eq!(be32(&p.bytes(tx.dbr, 0, 8), 4), 2);
        assert_eq!(p.bar.lock()[2..], [(db, (1 << 8) | MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 4)]);
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
        let writes = p.bar.lock().len();
        assert_eq!(tx.transmit(&p, &mut st, &frame(64)), Err(Dropped::RingFull));
        assert_eq!(p.bar.lock().len(), writes, "a dropped frame rings nothing");
        assert_eq!((st.tx_frames, st.tx_drops), (4, 1));
        // One CQE naming WQE 1 frees slots 0 and 1.
        put_cqe(&p, &tx.cq, 0, MLX5_CQE_REQ, 1, 0, 0);
        tx.transmit(&p, &mut st, &frame(64)).unwrap();
        assert_eq!((tx.room(), st.tx_frames), (1, 5));
        // The fifth frame went to slot 0 again (WQE index 4).
        assert_eq!(be32(&p.bytes(tx.wq, 0, 4), 0), (4 << 8) | MLX5_OPCODE_SEND as u32);
        // A CQE outside the frames in flight frees nothing; an error CQE is counted and frees its slot.
        put_cqe(&p, &tx.cq, 1, MLX5_CQE_REQ, 9, 0, 0);
        put_cqe(&p, &tx.cq, 2, ifc::cq::MLX5_CQE_REQ_ERR, 2, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        assert_eq!(tx.reap(&p, &mut st), 2);
        assert_eq!((tx.room(), st.tx_errors), (2, 1));
        // Too long and too short are dropped and counted too.
        assert_eq!(tx.transmit(&p, &mut st, &frame(BUF + 1)), Err(Dropped::TooLong));
        assert_eq!(tx.transmit(&p, &mut st, &[0u8; 13]), Err(Dropped::TooShort));
        assert_eq!(st.tx_drops, 3);
        // The error CQE left the SQ in error: sends are refused (and counted) until it is reset.
        assert!(tx.in_error());
        let rung = p.bar.lock().len();
        assert_eq!(tx.transmit(&p, &mut st, &frame(64)), Err(Dropped::QueueInError));
        assert_eq!((st.tx_drops, p.bar.lock().len()), (4, rung));
        // The reset consumes what the CQ still holds and starts the ring and its doorbell record at 0.
        put_cqe(&p, &tx.cq, 3, ifc::cq::MLX5_CQE_REQ_ERR, 3, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
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
        assert_eq!(*p.bar.lock(), vec![(db, 1 << 8), (db + 4, (SQN << 8) | 1)]);
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
        assert_eq!(p.bar.lock()[2..], [(db, (2 << 8) | MLX5_OPCODE_SEND as u32), (db + 4, (SQN << 8) | 5)]);
        assert_eq!((tx.room(), be32(&p.bytes(tx.dbr, 0, 8), 4)), (0, 4));
        // Completions free whole slots: the CQE of slot 0 names its NOP (index 1), that of slot 1 its frame WQE
        // (index 2).
        put_cqe(&p, &tx.cq, 0, MLX5_CQE_REQ, 1, 0, 0);
        assert_eq!((tx.reap(&p, &mut st), tx.room()), (1, 1));
        put_cqe(&p, &tx.cq, 1, MLX5_CQE_REQ, 2, 0, 0);
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
        put_cqe(&p, &rx.cq, 0, MLX5_CQE_RESP_SEND, 0, 60, 0);
        put_cqe(&p, &rx.cq, 1, MLX5_CQE_RESP_SEND, 1, 1514, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 2);
        assert_eq!(got, vec![a.clone(), b]);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 6, "both buffers posted again");
        assert_eq!((st.rx_frames, st.rx_bytes), (2, 1574));
        // The CQ's doorbell record follows the consumer counter.
        assert_eq!(be32(&p.bytes(rx.cq.dbr, 0, 4), 0), 2);

        // A length beyond the buffer, a zero length, an out-of-order counter: counted, reposted, never handed
        // out. The budget bounds one call.
        put_cqe(&p, &rx.cq, 2, MLX5_CQE_RESP_SEND, 2, BUF as u32 + 1, 0);
        put_cqe(&p, &rx.cq, 3, MLX5_CQE_RESP_SEND, 3, 0, 0);
        put_cqe(&p, &rx.cq, 4, MLX5_CQE_RESP_SEND, 7, 60, 0);
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
        put_cqe(&p, &rx.cq, 5, MLX5_CQE_RESP_SEND, 5, 70, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 1);
        assert_eq!(got, vec![c]);
        assert_eq!(be32(&p.bytes(rx.dbr, 0, 4), 0), 10);

        // An error CQE (and the flush after it): counted, never handed out, and the RQ in error takes its
        // buffers back no more.
        put_cqe(&p, &rx.cq, 6, MLX5_CQE_RESP_ERR, 6, 0, 0x04);
        put_cqe(&p, &rx.cq, 7, MLX5_CQE_RESP_ERR, 7, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
        got.clear();
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 0);
        assert!(got.is_empty() && rx.in_error());
        assert_eq!((st.rx_errors, be32(&p.bytes(rx.dbr, 0, 4), 0)), (2, 10));
        // The reset consumes what the CQ still holds, zeroes the counters and the doorbell record and writes
        // every WQE afresh (one was scribbled over); posting all of them makes the ring whole again.
        put_cqe(&p, &rx.cq, 8, MLX5_CQE_RESP_ERR, 8, 0, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
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
        put_cqe(&p, &rx.cq, 9, MLX5_CQE_RESP_SEND, 0, 80, 0);
        assert_eq!(rx.receive(&p, &mut st, 8, |f| got.push(f.to_vec())), 1);
        assert_eq!(got, vec![d]);
    }

    #[test]
    fn port_change_events_give_the_link_state() {
        let eqe = |event_type: u8, sub_type: u8, port: u8| {
            let mut data = [0u8; 28];
            data[8] = port << 4;
            ifc::eq::Eqe { event_type, sub_type, owner: false, data }
        };
        let pc = ifc::eq::MLX5_EVENT_TYPE_PORT_CHANGE;
        assert_eq!(PortState::from_event(&eqe(pc, 4, 1), 1), Some(PortState::Active));
        assert_eq!(PortState::from_event(&eqe(pc, 1, 1), 1), Some(PortState::Down));
        assert_eq!(PortState::from_event(&eqe(pc, 5, 1), 1), None, "other sub-types change nothing");
        assert_eq!(PortState::from_event(&eqe(pc, 4, 2), 1), None, "another port");
        assert_eq!(PortState::from_event(&eqe(0x0d, 4, 1), 1), None, "another event");
        assert_eq!(
            (PortState::from_paos(1), PortState::from_paos(2), PortState::from_paos(3)),
            (PortState::Active, PortState::Down, PortState::Unknown(3))
        );
    }
}
