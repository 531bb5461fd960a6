//! `test=mlx5-probe`: a deliberately small stand-in command client for the mlx5 model (issue 4, "Done when"),
//! run after the ready line. It proves that commands from the guest reach the model under QEMU (they appear in
//! the model's trace); the native driver (issue 5) replaces it.
//!
//! On the ivshmem function carrying the model's signature (`crate::model_signature`), whose BAR2 plays the
//! CX-5's BAR0, it follows Linux `core/cmd.c` / `core/main.c` in miniature (facts §b.1, §c): wait for
//! `initializing` (BAR0 0x1fc bit 31) to clear, check `cmd_interface_rev` 5, put a command queue of
//! `1 << log_cmdq_size` entries of `1 << log_cmdq_stride` bytes in one DMA page, write its address to
//! `cmdq_phy_addr_h` / `cmdq_phy_addr_l` (big-endian; the low 12 bits zero, which also selects
//! `nic_interface` FULL_DRIVER), then run ENABLE_HCA (inline input and output) and QUERY_ISSI (inline input;
//! its 0x70-byte output needs one output mailbox, which sits in the same page) in slot 0, each bounded by a
//! deadline. It logs `mlx5-probe: ENABLE_HCA status 0x0; QUERY_ISSI status 0x0 supported_issi 0x2`.

use core::fmt;
use core::sync::atomic::{Ordering, compiler_fence};
use core::time::Duration;

use super::memory::{self, DmaRegion};
use crate::pci;
use crate::time::{Deadline, wait_until};

/// `initializing` must clear within Linux's FW_INIT (`core/lib/tout.c`, 2 s).
const INIT_WAIT: Duration = Duration::from_secs(2);
/// Per command. Shorter than the advertised `cmd_exec_to` (60 s) so a boot test fails well inside its own
/// deadline; the model answers in milliseconds.
const CMD_WAIT: Duration = Duration::from_secs(10);

/// Initialization segment byte offsets (`device.h` `struct mlx5_init_seg`).
const CMDIF_REV_FW_SUB: usize = 0x004;
const CMDQ_ADDR_H: usize = 0x010;
const CMDQ_ADDR_L_SZ: usize = 0x014;
const CMD_DBELL: usize = 0x018;
const INITIALIZING: usize = 0x1fc;
const CMD_INTERFACE_REV: u32 = 5;

/// `cmd_queue_entry` / `cmd_if_box` byte offsets (facts §c.2, §c.3).
const ENT_TYPE_PCIE: u8 = 7;
const ENT_INPUT_LENGTH: usize = 0x04;
const ENT_INPUT_INLINE: usize = 0x10;
const ENT_OUTPUT_INLINE: usize = 0x20;
const ENT_OUTPUT_MAILBOX: usize = 0x30;
const ENT_OUTPUT_LENGTH: usize = 0x38;
const ENT_TOKEN: usize = 0x3c;
const ENT_STATUS_OWN: usize = 0x3f;
const BOX_BLOCK_NUMBER: usize = 0x238;
const BOX_TOKEN: usize = 0x23d;
const BOX_SIZE: usize = 0x240;
/// The output mailbox's place in the queue page (1 KiB aligned, after the 2 KiB of entries).
const OUT_MAILBOX: usize = 0x800;

const ENABLE_HCA: u16 = 0x104;
const QUERY_ISSI: u16 = 0x10a;
const QUERY_ISSI_OUT_LEN: usize = 0x70;
/// `query_issi_out.supported_issi_dw0`.
const SUPPORTED_ISSI_DW0: usize = 0x6c;

/// Why the probe stopped.
#[derive(Debug)]
enum ProbeError {
    NoModel,
    Map,
    StillInitializing,
    CmdifRev(u32),
    Geometry { log_size: u32, log_stride: u32 },
    Dma(memory::DmaError),
    Timeout(u16),
    Delivery { opcode: u16, delivery: u8 },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::NoModel => write!(f, "no ivshmem function carries the model's signature"),
            ProbeError::Map => write!(f, "cannot map the initialization segment"),
            ProbeError::StillInitializing => write!(f, "`initializing` still set after {} s", INIT_WAIT.as_secs()),
            ProbeError::CmdifRev(r) => write!(f, "cmd_interface_rev {r}, expected {CMD_INTERFACE_REV}"),
            ProbeError::Geometry { log_size, log_stride } => {
                write!(f, "command queue log_cmdq_size {log_size} log_cmdq_stride {log_stride} does not fit")
            }
            ProbeError::Dma(e) => write!(f, "command queue page: {e}"),
            ProbeError::Timeout(op) => {
                write!(f, "opcode {op:#x} not completed within {} s (slot 0 left to the device)", CMD_WAIT.as_secs())
            }
            ProbeError::Delivery { opcode, delivery } => write!(f, "opcode {opcode:#x} delivery status {delivery:#x}"),
        }
    }
}

/// Runs the probe and logs its one result line.
pub fn run() {
    match probe() {
        Ok((enable, issi, supported)) => log::info!(
            "mlx5-probe: ENABLE_HCA status {enable:#x}; QUERY_ISSI status {issi:#x} supported_issi {supported:#x}"
        ),
        Err(e) => log::error!("mlx5-probe: {e}"),
    }
}

/// The model's initialization segment (BAR2 base, first page mapped uncached).
struct InitSeg(u64);

impl InitSeg {
    fn read32(&self, off: usize) -> u32 {
        // SAFETY: `off` is one of the dword offsets above (< 0x1000, 4-aligned) in BAR2's first page, mapped
        // uncached by `probe` with memory decoding enabled; a read of the shared BAR has no side effects.
        u32::from_be(unsafe { core::ptr::read_volatile((self.0 as usize + off) as *const u32) })
    }

    fn write32(&self, off: usize, v: u32) {
        // SAFETY: as in `read32`; the writes are the registers the driver owns (cmdq address, doorbell).
        unsafe { core::ptr::write_volatile((self.0 as usize + off) as *mut u32, v.to_be()) }
    }
}

fn dma_write(q: &DmaRegion, off: usize, bytes: &[u8]) {
    assert!(off + bytes.len() <= q.len());
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: inside the region (asserted); the region is identity-mapped memory owned by the probe, which
        // the device (the model process) reads concurrently, hence volatile.
        unsafe { core::ptr::write_volatile(q.as_ptr().add(off + i), b) }
    }
}

fn dma_read(q: &DmaRegion, off: usize, out: &mut [u8]) {
    assert!(off + out.len() <= q.len());
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: as in `dma_write`; the device writes these bytes concurrently, hence volatile.
        *b = unsafe { core::ptr::read_volatile(q.as_ptr().add(off + i)) };
    }
}

fn probe() -> Result<(u8, u8, u32), ProbeError> {
    let (bdf, bar, access) = super::start::model_function().ok_or(ProbeError::NoModel)?;
    memory::map_mmio(bar, 0x1000).map_err(|_| ProbeError::Map)?;
    pci::set_command(access, bdf, pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER, 0);
    let seg = InitSeg(bar);
    if !wait_until(Deadline::after(INIT_WAIT), || seg.read32(INITIALIZING) >> 31 == 0) {
        return Err(ProbeError::StillInitializing);
    }
    let rev = seg.read32(CMDIF_REV_FW_SUB) >> 16;
    if rev != CMD_INTERFACE_REV {
        return Err(ProbeError::CmdifRev(rev));
    }
    let sz = seg.read32(CMDQ_ADDR_L_SZ);
    let (log_size, log_stride) = ((sz >> 4) & 0xf, sz & 0xf);
    if log_stride < 6 || log_size + log_stride > 11 {
        return Err(ProbeError::Geometry { log_size, log_stride });
    }
    let q = memory::dma_alloc(0x1000, 0x1000).map_err(ProbeError::Dma)?;
    let base = q.device_addr();
    seg.write32(CMDQ_ADDR_H, (base >> 32) as u32);
    seg.write32(CMDQ_ADDR_L_SZ, base as u32);

    let (enable, _) = exec(&seg, &q, ENABLE_HCA, 1, 16)?;
    let (issi, out) = exec(&seg, &q, QUERY_ISSI, 2, QUERY_ISSI_OUT_LEN)?;
    let supported = u32::from_be_bytes([
        out[SUPPORTED_ISSI_DW0],
        out[SUPPORTED_ISSI_DW0 + 1],
        out[SUPPORTED_ISSI_DW0 + 2],
        out[SUPPORTED_ISSI_DW0 + 3],
    ]);
    // The initialization segment still points at the page: it stays the device's (the probe never calls
    // `dma_free` on it).
    Ok((enable, issi, supported))
}

/// Runs one command in slot 0 with a 16-byte input (opcode, op_mod 0) and `out_len` bytes of output (at most
/// 16 + 512: one output mailbox); returns the status and the output.
fn exec(seg: &InitSeg, q: &DmaRegion, opcode: u16, token: u8, out_len: usize) -> Result<(u8, [u8; 0x210]), ProbeError> {
    let mut ent = [0u8; 64];
    ent[0] = ENT_TYPE_PCIE;
    ent[ENT_INPUT_LENGTH..ENT_INPUT_LENGTH + 4].copy_from_slice(&16u32.to_be_bytes());
    ent[ENT_INPUT_INLINE..ENT_INPUT_INLINE + 2].copy_from_slice(&opcode.to_be_bytes());
    if out_len > 16 {
        let mut mbox = [0u8; BOX_SIZE];
        mbox[BOX_BLOCK_NUMBER..BOX_BLOCK_NUMBER + 4].copy_from_slice(&0u32.to_be_bytes());
        mbox[BOX_TOKEN] = token;
        dma_write(q, OUT_MAILBOX, &mbox);
        let ptr = q.device_addr() + OUT_MAILBOX as u64;
        ent[ENT_OUTPUT_MAILBOX..ENT_OUTPUT_MAILBOX + 8].copy_from_slice(&ptr.to_be_bytes());
    }
    ent[ENT_OUTPUT_LENGTH..ENT_OUTPUT_LENGTH + 4].copy_from_slice(&(out_len as u32).to_be_bytes());
    ent[ENT_TOKEN] = token;
    // Everything but ownership first; ownership last, then the doorbell (x86 keeps stores in order; the
    // compiler fences keep the compiler from reordering them).
    dma_write(q, 0, &ent[..ENT_STATUS_OWN]);
    compiler_fence(Ordering::SeqCst);
    dma_write(q, ENT_STATUS_OWN, &[1]);
    compiler_fence(Ordering::SeqCst);
    seg.write32(CMD_DBELL, 1);
    let owned = || {
        let mut b = [0u8; 1];
        dma_read(q, ENT_STATUS_OWN, &mut b);
        b[0]
    };
    if !wait_until(Deadline::after(CMD_WAIT), || owned() & 1 == 0) {
        return Err(ProbeError::Timeout(opcode));
    }
    compiler_fence(Ordering::SeqCst);
    let delivery = owned() >> 1;
    if delivery != 0 {
        return Err(ProbeError::Delivery { opcode, delivery });
    }
    let mut out = [0u8; 0x210];
    dma_read(q, ENT_OUTPUT_INLINE, &mut out[..16]);
    if out_len > 16 {
        dma_read(q, OUT_MAILBOX, &mut out[16..]);
    }
    Ok((out[0], out))
}
