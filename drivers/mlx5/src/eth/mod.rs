//! The ConnectX's own Ethernet port as a NIC (docs/mlx5-driver.md "The Ethernet port"; docs/reference/mlx5.md
//! §i): one send queue and one receive queue with their CQs, a TIS and a TIR in a transport
//! domain, a NIC_RX root flow table forwarding the port's unicast MAC and broadcast to the TIR, and the port
//! brought up through PAOS and PMTU. Everything is created synchronously through [`Driver::exec`] before
//! `into_engines`; after that the data path ([`EthPort::transmit`], [`EthPort::receive`]) needs no command,
//! no interrupt and no allocation: frames live in preallocated DMA buffers, one per ring entry, and a full ring
//! drops and counts.
//!
//! By concern, as Linux splits `en_tx.c`, `en_rx.c` and `en/port.c`: `tx` the send ring, `rx` the receive
//! ring, `port` the port's registers and link state, `objects` creation and teardown, `recovery` the upkeep
//! (Q counter, queues brought back from error). This module holds the port itself, its configuration, errors
//! and counters, and names everything the submodules export.
//!
//! [`Driver::exec`]: crate::driver::Driver::exec

use core::fmt;

use crate::command::CmdError;
use crate::driver::PortState;
use crate::handles::{FlowTableId, Mkey, Pdn, Tdn, UarPage};
use crate::ifc;
use crate::ifc::eth::EthCaps;
use crate::platform::Platform;

mod objects;
mod port;
mod recovery;
mod rx;
mod tx;

pub use port::{
    HW_MTU_OVERHEAD, LinkWait, port_admin_up, port_mtu, port_mtu_or_vport, query_port_state, set_port_mtu, wait_link_up,
};
pub use recovery::{Q_COUNTER_PERIOD_MS, RECOVERY_RETRY_MS};
pub use rx::{RQ_WQE_LEN, RxParts, RxRing};
pub use tx::{
    ETH_HLEN, INL_HDR_START_SZ, MIN_INLINE_L2, MLX5_BF_OFFSET, MLX5_OPCODE_NOP, MLX5_OPCODE_SEND,
    MLX5_WQE_CTRL_CQ_UPDATE, SEND_WQE_BB, SEND_WQE_DS, TxParts, TxRing, inline_capacity, inline_len, wqebbs_per_slot,
};

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

/// The Ethernet port: its objects, rings, counters and link state.
pub struct EthPort<P: Platform> {
    p: alloc::sync::Arc<P>,
    pub info: EthInfo,
    tx: TxRing,
    rx: RxRing,
    stats: EthStats,
    state: PortState,
    local_port: u8,
    objects: objects::Objects,
    maint: recovery::Maintenance,
}

impl<P: Platform> EthPort<P> {
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
}

#[cfg(test)]
mod test_support {
    //! What the send and receive rings' tests share (the device's CQEs come from `Fake::write_cqe`).

    pub(super) const LKEY: u32 = 0xabc;
    pub(super) const BUF: usize = 2048;

    pub(super) fn frame(len: usize) -> Vec<u8> {
        // Broadcast destination, a source MAC, ethertype ARP (0x0806), then a counting payload.
        let mut f: Vec<u8> = (0..len).map(|i| i as u8).collect();
        f[..6].fill(0xff);
        f[6..12].copy_from_slice(&[2, 0x4c, 0x42, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f
    }
}
