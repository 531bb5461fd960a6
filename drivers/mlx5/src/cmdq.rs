//! The command queue (docs/reference/mlx5.md §c; `device.h` `struct mlx5_cmd_layout`, `mlx5_cmd_prot_block`; ifc
//! `cmd_queue_entry`, `cmd_if_box`): one 4 KiB page of `2^log_cmdq_size` 64-byte entries, a mailbox chain
//! per slot and direction, polled ownership bits, a deadline per command.
//!
//! Each slot keeps a chain of [`SLOT_BLOCKS`] blocks per direction, enough for every command but the long
//! lists (MANAGE_PAGES, a large lease's MTT). A command that needs more grows the slot's chain for as long as
//! it runs, as Linux `mlx5_alloc_cmd_msg` sizes a message to the command (`DIV_ROUND_UP(len - 16, 512)`
//! blocks): further pieces from the platform's DMA memory, linked by the blocks' `next` pointers, freed
//! when the slot is free again. The longest command is [`MAX_MSG`] bytes.
//!
//! Slots 0 .. n-2 take regular commands, the last slot only MANAGE_PAGES, as Linux reserves it (`core/cmd.c`
//! "pages queue"): firmware may hold a regular command until pages arrive, and the pages must then still
//! have a slot. A command that misses its deadline is reported as a timeout and its slot is quarantined until
//! the firmware hands it back (Linux "Avoid using pending command interface slots"); once the health
//! monitor declares the HCA dead, every in-flight and later command fails at once.
//!
//! Nothing here blocks: [`CmdQueue::submit`] posts and rings, [`CmdQueue::poll`] collects what completed.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use spin::Mutex;

use crate::command::{CmdError, Command, ErrorKind, HEADER_LEN, Output};
use crate::initseg;
use crate::log::{CmdLog, Outcome};
use crate::platform::{PAGE_SIZE, Platform};

/// `MLX5_MAX_COMMANDS`.
pub const MAX_SLOTS: usize = 32;
/// `MLX5_CMD_DATA_BLOCK_SIZE`.
pub const BLOCK_DATA: usize = 512;
/// Mailbox blocks are 576 bytes, 1 KiB apart (the `next` pointer's low 10 bits are reserved).
pub const BLOCK_STRIDE: usize = 1024;
const BLOCK_LEN: usize = 0x240;
/// Blocks a slot keeps per direction, one DMA piece of 16 KiB: 8 KiB of mailbox data beyond the inline 16
/// bytes (MANAGE_PAGES gives up to 1024 pages per command; QUERY_HCA_CAP's 0x1010-byte output needs 8
/// blocks). Longer chains are built from further pieces of this size.
pub const SLOT_BLOCKS: usize = 16;
/// The largest input or output a slot carries without growing its chain.
pub const SLOT_MSG: usize = HEADER_LEN + SLOT_BLOCKS * BLOCK_DATA;
/// The most blocks one chain may have: 4 MiB of mailbox data (8 MiB of DMA memory per direction at most),
/// as much as Linux's largest command cache holds (`LONG_LIST_SIZE`, the MTT list of 2 GiB of 4 KiB pages).
pub const MAX_CHAIN_BLOCKS: usize = 8192;
/// The largest input or output of any command.
pub const MAX_MSG: usize = HEADER_LEN + MAX_CHAIN_BLOCKS * BLOCK_DATA;

const ENTRY_LEN: usize = 64;
const CMD_TYPE_PCIE: u8 = 7;
const MANAGE_PAGES: u16 = 0x108;

/// Which slots a command may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotClass {
    Regular,
    Pages,
}

impl SlotClass {
    pub fn of(cmd: &Command) -> SlotClass {
        if cmd.opcode() == MANAGE_PAGES { SlotClass::Pages } else { SlotClass::Regular }
    }
}

/// Why the queue could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetupError {
    CmdifRev(u32),
    Geometry { log_size: u32, log_stride: u32 },
    NoDma,
}

impl core::fmt::Display for SetupError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SetupError::CmdifRev(r) => write!(f, "cmd_interface_rev {r}, expected {}", initseg::CMD_INTERFACE_REV),
            SetupError::Geometry { log_size, log_stride } => {
                write!(f, "command queue log_cmdq_size {log_size} log_cmdq_stride {log_stride} does not fit one page")
            }
            SetupError::NoDma => write!(f, "no DMA memory for the command queue"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    tag: u64,
    opcode: u16,
    op_mod: u16,
    attrs: crate::command::Attrs,
    out_len: usize,
    posted_ns: u64,
    deadline_ns: u64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Free,
    Busy(Pending),
    /// Timed out or aborted: the firmware still owns the entry; free again when it hands it back.
    Quarantined(Pending),
}

/// Memory for one mailbox chain: pieces of [`SLOT_BLOCKS`] blocks [`BLOCK_STRIDE`] apart, each one DMA
/// allocation (the blocks' `next` pointers link them, so pieces need not touch). The first piece stays.
struct Chain {
    pieces: Vec<u64>,
}

const PIECE_LEN: usize = SLOT_BLOCKS * BLOCK_STRIDE;

impl Chain {
    fn new<P: Platform + ?Sized>(p: &P) -> Option<Chain> {
        Some(Chain { pieces: vec![p.dma_alloc(PIECE_LEN, PAGE_SIZE)?] })
    }

    /// Device address of block `i` (within the pieces held).
    fn block(&self, i: usize) -> u64 {
        self.pieces[i / SLOT_BLOCKS] + ((i % SLOT_BLOCKS) * BLOCK_STRIDE) as u64
    }

    /// Grows the chain to hold `blocks` blocks; `false` when the platform has no DMA memory left.
    fn reserve<P: Platform + ?Sized>(&mut self, p: &P, blocks: usize) -> bool {
        while self.pieces.len() * SLOT_BLOCKS < blocks {
            let Some(a) = p.dma_alloc(PIECE_LEN, PAGE_SIZE) else { return false };
            self.pieces.push(a);
        }
        true
    }

    /// Back to the first piece (the slot's own blocks).
    fn shrink<P: Platform + ?Sized>(&mut self, p: &P) {
        for a in self.pieces.drain(1..) {
            p.dma_free(a, PIECE_LEN);
        }
    }

    fn release<P: Platform + ?Sized>(self, p: &P) {
        for a in self.pieces {
            p.dma_free(a, PIECE_LEN);
        }
    }
}

struct Slot {
    input: Chain,
    output: Chain,
    state: State,
}

impl Slot {
    fn new<P: Platform + ?Sized>(p: &P) -> Option<Slot> {
        let input = Chain::new(p)?;
        let Some(output) = Chain::new(p) else {
            input.release(p);
            return None;
        };
        Some(Slot { input, output, state: State::Free })
    }

    /// The slot is free again: its chains give back what a long command added.
    fn settle<P: Platform + ?Sized>(&mut self, p: &P) {
        self.state = State::Free;
        self.input.shrink(p);
        self.output.shrink(p);
    }

    fn release<P: Platform + ?Sized>(self, p: &P) {
        self.input.release(p);
        self.output.release(p);
    }
}

/// A finished command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub slot: u8,
    pub result: Result<Output, CmdError>,
    /// Doorbell to completion seen.
    pub elapsed_ns: u64,
}

pub struct CmdQueue {
    base: u64,
    log_stride: u32,
    slots: Vec<Slot>,
    token: u8,
    timeout_ns: u64,
    /// Set by the health monitor: the command interface is no longer trusted.
    fatal: Option<u8>,
    busy_mask: u32,
    /// Shared so the control channel and the panic path can read it while the engine runs on its core.
    log: Arc<Mutex<CmdLog>>,
}

fn xor(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

impl CmdQueue {
    /// Sets the queue up as Linux `mlx5_cmd_enable` does: checks `cmd_interface_rev` and the geometry, puts
    /// the entries in one 4 KiB-aligned page and writes `cmdq_phy_addr` high then low (which also selects
    /// `nic_interface` FULL_DRIVER). `timeout_ms` bounds every command.
    pub fn new<P: Platform + ?Sized>(p: &P, timeout_ms: u64) -> Result<CmdQueue, SetupError> {
        let rev = initseg::cmd_interface_rev(p);
        if rev != initseg::CMD_INTERFACE_REV {
            return Err(SetupError::CmdifRev(rev));
        }
        let lo = p.bar_read32(initseg::CMDQ_ADDR_L_SZ);
        let log_size = (lo >> 4) & 0xf;
        let log_stride = lo & 0xf;
        if (1usize << log_size) > MAX_SLOTS
            || log_size < 1
            || log_size + log_stride > 12
            || (1usize << log_stride) < ENTRY_LEN
        {
            return Err(SetupError::Geometry { log_size, log_stride });
        }
        let n = 1usize << log_size;
        let base = p.dma_alloc(PAGE_SIZE, PAGE_SIZE).ok_or(SetupError::NoDma)?;
        let mut slots: Vec<Slot> = Vec::with_capacity(n);
        for _ in 0..n {
            let Some(slot) = Slot::new(p) else {
                for s in slots {
                    s.release(p);
                }
                p.dma_free(base, PAGE_SIZE);
                return Err(SetupError::NoDma);
            };
            slots.push(slot);
        }
        p.bar_write32(initseg::CMDQ_ADDR_H, (base >> 32) as u32);
        p.bar_write32(initseg::CMDQ_ADDR_L_SZ, (base as u32) & !0xfff);
        Ok(CmdQueue {
            base,
            log_stride,
            slots,
            token: 0,
            timeout_ns: timeout_ms.saturating_mul(1_000_000),
            fatal: None,
            busy_mask: 0,
            log: Arc::new(Mutex::new(CmdLog::default())),
        })
    }

    /// The command ring (locked briefly by the engine once per completion).
    pub fn log(&self) -> spin::MutexGuard<'_, CmdLog> {
        self.log.lock()
    }

    /// A handle on the command ring for readers on other cores (HEALTH, the panic dump).
    pub fn log_handle(&self) -> Arc<Mutex<CmdLog>> {
        self.log.clone()
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ns / 1_000_000
    }

    fn entry_addr(&self, slot: usize) -> u64 {
        self.base + ((slot as u64) << self.log_stride)
    }

    fn range(&self, class: SlotClass) -> core::ops::Range<usize> {
        let n = self.slots.len();
        match class {
            SlotClass::Regular => 0..n - 1,
            SlotClass::Pages => n - 1..n,
        }
    }

    /// A free slot for `class`, if any.
    pub fn has_free(&self, class: SlotClass) -> bool {
        self.range(class).any(|i| matches!(self.slots[i].state, State::Free))
    }

    /// Commands posted and not yet completed (quarantined slots not counted).
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.state, State::Busy(_))).count()
    }

    pub fn quarantined(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.state, State::Quarantined(_))).count()
    }

    pub fn fatal(&self) -> Option<u8> {
        self.fatal
    }

    /// Writes `cmd` into a free slot of its class and rings the doorbell; returns the slot. The result
    /// arrives later from [`CmdQueue::poll`] with `tag`.
    pub fn submit<P: Platform + ?Sized>(&mut self, p: &P, tag: u64, cmd: &Command) -> Result<u8, CmdError> {
        if let Some(s) = self.fatal {
            return Err(cmd.error(ErrorKind::Fatal { health_syndrome: s }));
        }
        let input = cmd.input();
        let out_len = cmd.out_len();
        if input.len() > MAX_MSG {
            return Err(cmd.error(ErrorKind::TooLarge { len: input.len() }));
        }
        if out_len > MAX_MSG {
            return Err(cmd.error(ErrorKind::TooLarge { len: out_len }));
        }
        let class = SlotClass::of(cmd);
        let slot = self
            .range(class)
            .find(|&i| matches!(self.slots[i].state, State::Free))
            .ok_or_else(|| cmd.error(ErrorKind::Busy))?;
        self.token = self.token.wrapping_add(1);
        if self.token == 0 {
            self.token = 1;
        }
        let token = self.token;
        let data = &input[HEADER_LEN.min(input.len())..];
        let out_blocks = out_len.saturating_sub(HEADER_LEN).div_ceil(BLOCK_DATA);
        let s = &mut self.slots[slot];
        if !s.input.reserve(p, data.len().div_ceil(BLOCK_DATA)) || !s.output.reserve(p, out_blocks) {
            s.settle(p);
            return Err(cmd.error(ErrorKind::NoDma));
        }
        let in_chain = Self::write_chain(p, &s.input, data, token);
        let out_chain = Self::prepare_out_chain(p, &s.output, out_blocks, token);

        let mut e = [0u8; ENTRY_LEN];
        e[0x00] = CMD_TYPE_PCIE;
        e[0x04..0x08].copy_from_slice(&(input.len() as u32).to_be_bytes());
        e[0x08..0x10].copy_from_slice(&in_chain.to_be_bytes());
        let inline = input.len().min(HEADER_LEN);
        e[0x10..0x10 + inline].copy_from_slice(&input[..inline]);
        e[0x30..0x38].copy_from_slice(&out_chain.to_be_bytes());
        e[0x38..0x3c].copy_from_slice(&(out_len as u32).to_be_bytes());
        e[0x3c] = token;
        e[0x3f] = 1; // ownership: hardware
        // The entry's XOR over all 64 bytes must be 0xff (`core/cmd.c:267-270`).
        e[0x3d] = !xor(&e);
        let addr = self.entry_addr(slot);
        // Everything but the ownership byte first, then the dword holding it, so the device never sees an
        // owned entry that is half written.
        p.dma_write(addr, &e[..0x3c]);
        p.dma_write(addr + 0x3c, &e[0x3c..0x40]);
        let now = p.now_ns();
        self.slots[slot].state = State::Busy(Pending {
            tag,
            opcode: cmd.opcode(),
            op_mod: cmd.op_mod(),
            attrs: *cmd.attrs(),
            out_len,
            posted_ns: now,
            deadline_ns: now.saturating_add(self.timeout_ns),
        });
        self.busy_mask |= 1 << slot;
        self.log.lock().counters.submitted += 1;
        p.bar_write32(initseg::CMD_DBELL, 1 << slot);
        Ok(slot as u8)
    }

    /// Writes `data` as a signed mailbox chain into `chain`; returns the chain's address (0 when empty).
    fn write_chain<P: Platform + ?Sized>(p: &P, chain: &Chain, data: &[u8], token: u8) -> u64 {
        let n = data.len().div_ceil(BLOCK_DATA);
        let mut blk = [0u8; BLOCK_LEN];
        for i in 0..n {
            blk.fill(0);
            let chunk = &data[i * BLOCK_DATA..((i + 1) * BLOCK_DATA).min(data.len())];
            blk[..chunk.len()].copy_from_slice(chunk);
            Self::seal_block(&mut blk, chain, i, n, token);
            p.dma_write(chain.block(i), &blk);
        }
        if n == 0 { 0 } else { chain.block(0) }
    }

    /// Output blocks carry only the chain fields; the device fills the data.
    fn prepare_out_chain<P: Platform + ?Sized>(p: &P, chain: &Chain, n: usize, token: u8) -> u64 {
        let mut blk = [0u8; BLOCK_LEN];
        for i in 0..n {
            blk.fill(0);
            Self::seal_block(&mut blk, chain, i, n, token);
            p.dma_write(chain.block(i) + BLOCK_DATA as u64, &blk[BLOCK_DATA..]);
        }
        if n == 0 { 0 } else { chain.block(0) }
    }

    /// `next`, `block_number`, `token` and both signatures (`core/cmd.c:233-253`): Linux leaves block
    /// signatures off (`cmdif_checksum` 0), but a signed block is valid either way.
    fn seal_block(blk: &mut [u8; BLOCK_LEN], chain: &Chain, i: usize, n: usize, token: u8) {
        let next = if i + 1 < n { chain.block(i + 1) } else { 0 };
        blk[0x230..0x238].copy_from_slice(&next.to_be_bytes());
        blk[0x238..0x23c].copy_from_slice(&(i as u32).to_be_bytes());
        blk[0x23d] = token;
        blk[0x23e] = 0;
        blk[0x23f] = 0;
        blk[0x23e] = !xor(&blk[0x200..0x23e]);
        blk[0x23f] = !xor(&blk[..0x23f]);
    }

    /// Collects finished commands into `done`: completions, timeouts (the slot is quarantined) and, once
    /// the HCA is fatal, aborts. Slots leaving quarantine are logged as late completions.
    pub fn poll<P: Platform + ?Sized>(&mut self, p: &P, done: &mut Vec<Completion>) {
        let mut mask = self.busy_mask;
        if mask == 0 {
            return;
        }
        let now = p.now_ns();
        while mask != 0 {
            let slot = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let addr = self.entry_addr(slot);
            let status_own = p.dma_read8(addr + 0x3f);
            match self.slots[slot].state {
                State::Busy(pend) => {
                    if status_own & 1 == 0 {
                        let result = self.read_result(p, slot, &pend, status_own >> 1);
                        let elapsed = now.saturating_sub(pend.posted_ns);
                        let outcome = match &result {
                            Ok(_) => Outcome::Status(0, 0),
                            Err(e) => Outcome::from_error(&e.kind),
                        };
                        self.log.lock().record(pend.opcode, pend.op_mod, slot as u8, outcome, elapsed);
                        self.slots[slot].settle(p);
                        self.busy_mask &= !(1 << slot);
                        done.push(Completion { tag: pend.tag, slot: slot as u8, result, elapsed_ns: elapsed });
                    } else if now >= pend.deadline_ns {
                        let waited = now.saturating_sub(pend.posted_ns);
                        self.log.lock().record(pend.opcode, pend.op_mod, slot as u8, Outcome::Timeout, waited);
                        self.slots[slot].state = State::Quarantined(pend);
                        let err = CmdError {
                            opcode: pend.opcode,
                            op_mod: pend.op_mod,
                            kind: ErrorKind::Timeout { slot: slot as u8, waited_ms: waited / 1_000_000 },
                            attrs: pend.attrs,
                        };
                        done.push(Completion { tag: pend.tag, slot: slot as u8, result: Err(err), elapsed_ns: waited });
                    }
                }
                State::Quarantined(pend) => {
                    if status_own & 1 == 0 && self.fatal.is_none() {
                        let elapsed = now.saturating_sub(pend.posted_ns);
                        self.log.lock().record(
                            pend.opcode,
                            pend.op_mod,
                            slot as u8,
                            Outcome::LateCompletion(status_own >> 1),
                            elapsed,
                        );
                        log::warn!(
                            "mlx5: {} completion arrived after its timeout; slot {slot} leaves quarantine",
                            crate::command::opcode_name(pend.opcode)
                        );
                        self.slots[slot].settle(p);
                        self.busy_mask &= !(1 << slot);
                    }
                }
                State::Free => self.busy_mask &= !(1 << slot),
            }
        }
    }

    fn read_result<P: Platform + ?Sized>(
        &self,
        p: &P,
        slot: usize,
        pend: &Pending,
        delivery: u8,
    ) -> Result<Output, CmdError> {
        let err = |kind| CmdError { opcode: pend.opcode, op_mod: pend.op_mod, kind, attrs: pend.attrs };
        if delivery != 0 {
            return Err(err(ErrorKind::Delivery { status: delivery }));
        }
        let mut out = vec![0u8; pend.out_len.max(HEADER_LEN)];
        p.dma_read(self.entry_addr(slot) + 0x20, &mut out[..HEADER_LEN]);
        let status = out[0];
        if status != 0 {
            let syndrome = u32::from_be_bytes([out[4], out[5], out[6], out[7]]);
            return Err(err(ErrorKind::Status { status, syndrome }));
        }
        let chain = &self.slots[slot].output;
        let mut at = HEADER_LEN;
        let mut blk = 0;
        while at < out.len() {
            let n = (out.len() - at).min(BLOCK_DATA);
            p.dma_read(chain.block(blk), &mut out[at..at + n]);
            at += n;
            blk += 1;
        }
        Ok(Output::new(out))
    }

    /// The HCA is dead (health monitor): fails every in-flight command with `Fatal` and every later one at
    /// submission. The slots stay quarantined: nothing the firmware writes is trusted any more.
    pub fn abort_all(&mut self, health_syndrome: u8, p_now_ns: u64, done: &mut Vec<Completion>) {
        self.fatal = Some(health_syndrome);
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let State::Busy(pend) = s.state {
                let elapsed = p_now_ns.saturating_sub(pend.posted_ns);
                self.log.lock().record(pend.opcode, pend.op_mod, i as u8, Outcome::Aborted, elapsed);
                s.state = State::Quarantined(pend);
                let err = CmdError {
                    opcode: pend.opcode,
                    op_mod: pend.op_mod,
                    kind: ErrorKind::Fatal { health_syndrome },
                    attrs: pend.attrs,
                };
                done.push(Completion { tag: pend.tag, slot: i as u8, result: Err(err), elapsed_ns: elapsed });
            }
        }
    }

    /// Frees the queue's DMA memory. Only after DISABLE_HCA (or when the device is gone): the firmware
    /// must no longer read the entries.
    pub fn release<P: Platform + ?Sized>(self, p: &P) {
        for s in self.slots {
            s.release(p);
        }
        p.dma_free(self.base, PAGE_SIZE);
    }
}
