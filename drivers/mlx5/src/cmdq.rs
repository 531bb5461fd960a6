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
//! Slots 0 .. n-3 take regular commands, the last slot only MANAGE_PAGES, as Linux reserves it (`core/cmd.c`
//! "pages queue"): firmware may hold a regular command until pages arrive, and the pages must then still
//! have a slot. The slot before it (n-2) belongs to the fatal path ([`Emergency`]): one command built at
//! bring-up (the port-down PAOS write) that a core in a panic can post without the engine, without allocating
//! and without a lock. A queue of fewer than 3 slots has no emergency slot and gives all but the last to
//! regular commands. A command that misses its deadline is reported as a timeout and its slot is quarantined until
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
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

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
/// Queues with at least this many slots keep slot n-2 for the fatal path ([`Emergency`]).
pub const EMERGENCY_MIN_SLOTS: usize = 3;
/// The emergency command's token (any non-zero value; it only has to match its mailboxes).
const EMERGENCY_TOKEN: u8 = 0xfe;
const CMD_TYPE_PCIE: u8 = 7;
const MANAGE_PAGES: u16 = crate::ifc::init::MLX5_CMD_OP_MANAGE_PAGES;

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
    /// The last poll that still saw the entry owned by the HCA.
    owned_seen_ns: u64,
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
    pieces: Vec<DmaBuf>,
}

const PIECE_LEN: usize = SLOT_BLOCKS * BLOCK_STRIDE;

impl Chain {
    fn new<P: Platform + ?Sized>(p: &P) -> Option<Chain> {
        Some(Chain { pieces: vec![p.dma_alloc(PIECE_LEN, PAGE_SIZE)?] })
    }

    /// Block `i` (within the pieces held): its piece and its offset there.
    fn block(&self, i: usize) -> (DmaBuf, usize) {
        (self.pieces[i / SLOT_BLOCKS], (i % SLOT_BLOCKS) * BLOCK_STRIDE)
    }

    /// The device address of block `i`, for the entry and the `next` pointers.
    fn block_addr(&self, i: usize) -> u64 {
        let (piece, offset) = self.block(i);
        piece.at(offset as u64)
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
            p.dma_free(a);
        }
    }

    fn release<P: Platform + ?Sized>(self, p: &P) {
        for a in self.pieces {
            p.dma_free(a);
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
    /// Doorbell to the last poll that still saw the entry owned by the HCA: the part of `elapsed_ns` the HCA
    /// certainly held the command. The rest may be the engine's polling delay, which is the driver's time, not
    /// the hardware's (0 when the first poll already saw it done, or when it never reached the HCA).
    pub hca_ns: u64,
}

pub struct CmdQueue {
    base: DmaBuf,
    log_stride: u32,
    slots: Vec<Slot>,
    /// The last command's token (`cmdq entry.token`, also in its mailboxes): 8 bits, 1..=0xff and then 1 again,
    /// never 0 (a zeroed mailbox's). Two commands in flight share a token only 255 submissions apart, while at
    /// most 32 slots are ever busy.
    token: u8,
    timeout_ns: u64,
    /// Set by the health monitor: the command interface is no longer trusted.
    fatal: Option<u8>,
    /// One bit per slot that is not Free (busy or quarantined).
    busy_mask: u32,
    /// Shared so the control channel and the panic path can read it while the engine runs on its core.
    log: Arc<Mutex<CmdLog>>,
}

fn xor(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

/// The queue entry for a command (`cmd_queue_entry`): type PCIe, the input's length and first 16 bytes inline
/// with the rest in the input chain, the output chain and length, the token, owned by hardware, and the
/// signature that makes the XOR over all 64 bytes 0xff (`core/cmd.c:267-270`). Regular and emergency commands
/// alike.
fn entry(input: &[u8], in_chain: u64, out_chain: u64, out_len: usize, token: u8) -> [u8; ENTRY_LEN] {
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
    e[0x3d] = !xor(&e);
    e
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
                p.dma_free(base);
                return Err(SetupError::NoDma);
            };
            slots.push(slot);
        }
        p.bar_write32(initseg::CMDQ_ADDR_H, (base.addr() >> 32) as u32);
        p.bar_write32(initseg::CMDQ_ADDR_L_SZ, (base.addr() as u32) & !0xfff);
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
    pub fn log_handle(&self) -> crate::log::SharedLog {
        self.log.clone()
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ns / 1_000_000
    }

    /// Where `slot`'s entry lies in the queue page.
    fn entry_offset(&self, slot: usize) -> usize {
        slot << self.log_stride
    }

    fn range(&self, class: SlotClass) -> core::ops::Range<usize> {
        let n = self.slots.len();
        match class {
            SlotClass::Regular if n >= EMERGENCY_MIN_SLOTS => 0..n - 2,
            SlotClass::Regular => 0..n - 1,
            SlotClass::Pages => n - 1..n,
        }
    }

    /// The free slots of `class`, one bit each (`busy_mask` has a bit for every slot not Free).
    fn free_mask(&self, class: SlotClass) -> u32 {
        let r = self.range(class);
        let class_bits = ((1u64 << r.end) - (1u64 << r.start)) as u32;
        class_bits & !self.busy_mask
    }

    /// A free slot for `class`, if any.
    pub fn has_free(&self, class: SlotClass) -> bool {
        self.free_mask(class) != 0
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
        let free = self.free_mask(SlotClass::of(cmd));
        if free == 0 {
            return Err(cmd.error(ErrorKind::Busy));
        }
        let slot = free.trailing_zeros() as usize;
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

        let e = entry(input, in_chain, out_chain, out_len, token);
        let at = self.entry_offset(slot);
        // Everything but the ownership byte first, then the dword holding it, so the device never sees an
        // owned entry that is half written.
        p.dma_write(self.base, at, &e[..0x3c]);
        p.dma_write(self.base, at + 0x3c, &e[0x3c..0x40]);
        let now = p.now_ns();
        self.slots[slot].state = State::Busy(Pending {
            tag,
            opcode: cmd.opcode(),
            op_mod: cmd.op_mod(),
            attrs: *cmd.attrs(),
            out_len,
            posted_ns: now,
            owned_seen_ns: now,
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
            let (piece, at) = chain.block(i);
            p.dma_write(piece, at, &blk);
        }
        if n == 0 { 0 } else { chain.block_addr(0) }
    }

    /// Output blocks carry only the chain fields; the device fills the data.
    fn prepare_out_chain<P: Platform + ?Sized>(p: &P, chain: &Chain, n: usize, token: u8) -> u64 {
        let mut blk = [0u8; BLOCK_LEN];
        for i in 0..n {
            blk.fill(0);
            Self::seal_block(&mut blk, chain, i, n, token);
            let (piece, at) = chain.block(i);
            p.dma_write(piece, at + BLOCK_DATA, &blk[BLOCK_DATA..]);
        }
        if n == 0 { 0 } else { chain.block_addr(0) }
    }

    /// `next`, `block_number`, `token` and both signatures (`core/cmd.c:233-253`): Linux leaves block
    /// signatures off (`cmdif_checksum` 0), but a signed block is valid either way.
    fn seal_block(blk: &mut [u8; BLOCK_LEN], chain: &Chain, i: usize, n: usize, token: u8) {
        let next = if i + 1 < n { chain.block_addr(i + 1) } else { 0 };
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
            let status_own = p.dma_read8(self.base, self.entry_offset(slot) + 0x3f);
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
                        let hca_ns = pend.owned_seen_ns.saturating_sub(pend.posted_ns);
                        done.push(Completion { tag: pend.tag, slot: slot as u8, result, elapsed_ns: elapsed, hca_ns });
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
                        done.push(Completion {
                            tag: pend.tag,
                            slot: slot as u8,
                            result: Err(err),
                            elapsed_ns: waited,
                            hca_ns: waited,
                        });
                    } else {
                        self.slots[slot].state = State::Busy(Pending { owned_seen_ns: now, ..pend });
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
        let mut output = Output::zeroed(pend.out_len.max(HEADER_LEN));
        let out = output.bytes_mut();
        p.dma_read(self.base, self.entry_offset(slot) + 0x20, &mut out[..HEADER_LEN]);
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
            let (piece, offset) = chain.block(blk);
            p.dma_read(piece, offset, &mut out[at..at + n]);
            at += n;
            blk += 1;
        }
        Ok(output)
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
                let hca_ns = pend.owned_seen_ns.saturating_sub(pend.posted_ns);
                done.push(Completion { tag: pend.tag, slot: i as u8, result: Err(err), elapsed_ns: elapsed, hca_ns });
            }
        }
    }

    /// Builds the fatal path's one command in the emergency slot (n-2): its mailbox chains written now, its
    /// entry kept in the returned [`Emergency`] until [`Emergency::fire`] posts it. `None` when the queue has no
    /// emergency slot or its chains cannot hold `cmd`. Call it once, at bring-up, while nothing else posts.
    pub fn prepare_emergency<P: Platform + ?Sized>(&mut self, p: &P, cmd: &Command) -> Option<Emergency> {
        let n = self.slots.len();
        if n < EMERGENCY_MIN_SLOTS {
            return None;
        }
        let slot = n - 2;
        let input = cmd.input();
        let out_len = cmd.out_len();
        let data = &input[HEADER_LEN.min(input.len())..];
        let out_blocks = out_len.saturating_sub(HEADER_LEN).div_ceil(BLOCK_DATA);
        // The slot's own chains, never grown: the fatal path may not allocate.
        if data.len().div_ceil(BLOCK_DATA) > SLOT_BLOCKS || out_blocks > SLOT_BLOCKS {
            return None;
        }
        let s = &self.slots[slot];
        let in_chain = Self::write_chain(p, &s.input, data, EMERGENCY_TOKEN);
        let out_chain = Self::prepare_out_chain(p, &s.output, out_blocks, EMERGENCY_TOKEN);
        let e = entry(input, in_chain, out_chain, out_len, EMERGENCY_TOKEN);
        Some(Emergency {
            base: self.base,
            at: self.entry_offset(slot),
            slot: slot as u8,
            opcode: cmd.opcode(),
            entry: e,
        })
    }

    /// Frees the queue's DMA memory. Only after DISABLE_HCA (or when the device is gone): the firmware
    /// must no longer read the entries.
    pub fn release<P: Platform + ?Sized>(self, p: &P) {
        for s in self.slots {
            s.release(p);
        }
        p.dma_free(self.base);
    }
}

/// The fatal path's command, ready to post ([`CmdQueue::prepare_emergency`]): plain data (the queue page's
/// handle, the entry's offset and bytes), so a core in a panic can post it through any platform without the
/// command engine, which another core may own.
#[derive(Clone, Copy, Debug)]
pub struct Emergency {
    base: DmaBuf,
    at: usize,
    slot: u8,
    opcode: u16,
    entry: [u8; ENTRY_LEN],
}

/// What became of the emergency command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmergencyOutcome {
    /// The firmware handed the entry back: its delivery status and the output's status (both 0 on success).
    Completed { delivery: u8, status: u8 },
    /// Still owned by the firmware when the deadline passed.
    TimedOut,
}

impl Emergency {
    /// The slot it posts to.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// The command's opcode.
    pub fn opcode(&self) -> u16 {
        self.opcode
    }

    /// Posts the command and rings its doorbell bit, then polls the ownership bit for at most `timeout_ns`.
    /// Allocates nothing and takes no lock of the driver's; what the platform's accessors do is the caller's
    /// choice (the image's fatal path uses accessors that never wait for a lock).
    pub fn fire<P: Platform + ?Sized>(&self, p: &P, timeout_ns: u64) -> EmergencyOutcome {
        // Everything but the ownership byte first, as `submit` does.
        p.dma_write(self.base, self.at, &self.entry[..0x3c]);
        p.dma_write(self.base, self.at + 0x3c, &self.entry[0x3c..0x40]);
        p.bar_write32(initseg::CMD_DBELL, 1 << self.slot);
        let deadline = p.now_ns().saturating_add(timeout_ns);
        loop {
            let status_own = p.dma_read8(self.base, self.at + 0x3f);
            if status_own & 1 == 0 {
                let status = p.dma_read8(self.base, self.at + 0x20);
                return EmergencyOutcome::Completed { delivery: status_own >> 1, status };
            }
            if p.now_ns() >= deadline {
                return EmergencyOutcome::TimedOut;
            }
            p.relax();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The queue over a scripted fake device on a virtual clock: the test plays the firmware (it reads the
    //! doorbells and hands entries back), and time moves only when it says so.

    use super::*;
    use crate::testing::Fake;

    const LOG_SIZE: u32 = 5;
    const LOG_STRIDE: u32 = 6;

    const TIMEOUT_MS: u64 = 100;

    fn queue() -> (Fake, CmdQueue) {
        let p = Fake::with_cmdq(LOG_SIZE, LOG_STRIDE);
        let q = CmdQueue::new(&p, TIMEOUT_MS).unwrap();
        (p, q)
    }

    fn cmd(opcode: u16) -> Command {
        Command::new(opcode, 0, HEADER_LEN, HEADER_LEN)
    }

    fn poll(p: &Fake, q: &mut CmdQueue) -> Vec<Completion> {
        let mut done = Vec::new();
        q.poll(p, &mut done);
        done
    }

    #[test]
    fn regular_commands_take_the_first_free_slots_and_manage_pages_its_own() {
        let (p, mut q) = queue();
        assert_eq!(q.slots(), 32);
        for tag in 0..30 {
            assert_eq!(q.submit(&p, tag, &cmd(0x800)), Ok(tag as u8));
        }
        assert_eq!(q.submit(&p, 99, &cmd(0x800)).unwrap_err().kind, ErrorKind::Busy, "30 regular slots");
        assert!(!q.has_free(SlotClass::Regular) && q.has_free(SlotClass::Pages));
        assert_eq!(q.submit(&p, 100, &cmd(MANAGE_PAGES)), Ok(31), "the pages slot stays for MANAGE_PAGES");
        assert_eq!(q.submit(&p, 101, &cmd(MANAGE_PAGES)).unwrap_err().kind, ErrorKind::Busy);
        assert_eq!(q.in_flight(), 31, "slot 30 is the fatal path's");
        let rung: Vec<u32> = (0..30).chain([31]).map(|s| 1 << s).collect();
        assert_eq!(p.doorbells(), rung, "one doorbell per command, its slot's bit");
        // The entry the firmware reads: type, lengths, token, owned by hardware, XOR 0xff.
        let e = p.cmdq_entry(3);
        assert_eq!((e[0], e[0x3f], xor(&e)), (CMD_TYPE_PCIE, 1, 0xff));
        assert_eq!(u16::from_be_bytes([e[0x10], e[0x11]]), 0x800, "the opcode travels inline");
        // A slot handed back is the next one used.
        p.complete_command(5, 0, 0);
        assert_eq!(poll(&p, &mut q).iter().map(|c| (c.tag, c.slot)).collect::<Vec<_>>(), [(5, 5)]);
        assert_eq!(q.submit(&p, 7, &cmd(0x801)), Ok(5));
    }

    /// The token (8 bits, in the entry and every mailbox of its command) started just below its limit: after
    /// 0xff comes 1, never 0 (0 is what a zeroed mailbox holds), and each command carries the one it was given.
    #[test]
    fn the_command_token_wraps_past_0xff_to_1() {
        let (p, mut q) = queue();
        q.token = 0xfd;
        for (tag, want) in [(1u64, 0xfe_u8), (2, 0xff), (3, 0x01), (4, 0x02)] {
            let slot = q.submit(&p, tag, &cmd(0x800)).unwrap();
            let e = p.cmdq_entry(slot);
            assert_eq!(e[0x3c], want, "tag {tag}");
        }
    }

    #[test]
    fn completions_carry_the_result_and_the_hcas_own_time() {
        let (p, mut q) = queue();
        p.at_us(10);
        q.submit(&p, 1, &cmd(0x800)).unwrap();
        q.submit(&p, 2, &cmd(0x202)).unwrap();
        p.at_us(13);
        assert!(poll(&p, &mut q).is_empty(), "still owned by the HCA at 13 µs");
        p.complete_command(0, 0, 0);
        p.complete_command(1, 0x03, 0x7e57);
        p.at_us(40);
        let done = poll(&p, &mut q);
        assert_eq!(done.len(), 2);
        let (ok, bad) = (&done[0], &done[1]);
        assert_eq!((ok.tag, ok.result.as_ref().map(|o| o.bytes().len())), (1, Ok(HEADER_LEN)));
        assert_eq!(bad.tag, 2);
        assert_eq!(bad.result.as_ref().unwrap_err().kind, ErrorKind::Status { status: 0x03, syndrome: 0x7e57 });
        // Seen done at 40 µs, last seen owned at 13 µs: the 27 µs between are the poller's, not the HCA's.
        assert_eq!((ok.elapsed_ns, ok.hca_ns), (30_000, 3_000));
        let c = q.log().counters;
        assert_eq!((q.in_flight(), c.ok, c.failed), (0, 1, 1));
    }

    #[test]
    fn a_timeout_quarantines_the_slot_until_the_late_completion() {
        let (p, mut q) = queue();
        q.submit(&p, 1, &cmd(0x202)).unwrap();
        p.at_us(TIMEOUT_MS * 1000 - 1);
        assert!(poll(&p, &mut q).is_empty(), "not before the deadline");
        p.at_us(TIMEOUT_MS * 1000);
        let done = poll(&p, &mut q);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].result.as_ref().unwrap_err().kind, ErrorKind::Timeout { slot: 0, waited_ms: TIMEOUT_MS });
        assert_eq!((q.in_flight(), q.quarantined()), (0, 1));
        // The firmware still owns the entry: the slot is not reused.
        assert_eq!(q.submit(&p, 2, &cmd(0x800)), Ok(1));
        p.complete_command(1, 0, 0);
        assert_eq!(poll(&p, &mut q).iter().map(|c| c.tag).collect::<Vec<_>>(), [2]);
        p.at_us(TIMEOUT_MS * 5000);
        assert!(poll(&p, &mut q).is_empty(), "a quarantined slot reports nothing while owned");
        p.complete_command(0, 0, 0);
        assert!(poll(&p, &mut q).is_empty(), "the late completion answers nobody");
        let c = q.log().counters;
        assert_eq!((q.quarantined(), c.timeouts, c.late), (0, 1, 1));
        assert_eq!(q.submit(&p, 3, &cmd(0x800)), Ok(0), "free again");
    }

    #[test]
    fn a_fatal_hca_fails_everything_and_trusts_no_late_completion() {
        let (p, mut q) = queue();
        q.submit(&p, 1, &cmd(0x202)).unwrap();
        q.submit(&p, 2, &cmd(MANAGE_PAGES)).unwrap();
        p.at_us(7);
        let mut done = Vec::new();
        q.abort_all(0x42, p.now_ns(), &mut done);
        assert_eq!(done.iter().map(|c| c.tag).collect::<Vec<_>>(), [1, 2]);
        assert!(done.iter().all(|c| c.result.as_ref().unwrap_err().kind == ErrorKind::Fatal { health_syndrome: 0x42 }));
        assert_eq!(q.fatal(), Some(0x42));
        let e = q.submit(&p, 3, &cmd(0x800)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Fatal { health_syndrome: 0x42 }, "nothing is posted any more");
        assert_eq!(p.doorbells().len(), 2);
        p.complete_command(0, 0, 0);
        assert!(poll(&p, &mut q).is_empty());
        assert_eq!(q.quarantined(), 2, "what the firmware writes is not trusted");
    }

    #[test]
    fn a_long_command_grows_its_chains_by_handle_and_gives_the_pieces_back() {
        let (p, mut q) = queue();
        let resident = p.live_allocations();
        // Twice what a slot keeps in each direction: one more piece per chain while the command runs.
        let len = HEADER_LEN + 2 * SLOT_BLOCKS * BLOCK_DATA;
        let mut c = Command::new(0x800, 0, len, len);
        for (i, b) in c.input_mut().iter_mut().enumerate().skip(HEADER_LEN) {
            *b = i as u8;
        }
        q.submit(&p, 1, &c).unwrap();
        assert_eq!(p.live_allocations(), resident + 2, "one piece more for the input and one for the output");
        // The device follows the input chain from the entry by device address and finds the data in order.
        let e = p.cmdq_entry(0);
        let mut next = u64::from_be_bytes(e[0x08..0x10].try_into().unwrap());
        let mut data = Vec::new();
        while next != 0 {
            let mut blk = [0u8; BLOCK_LEN];
            p.mem_read(next, &mut blk);
            data.extend_from_slice(&blk[..BLOCK_DATA]);
            next = u64::from_be_bytes(blk[0x230..0x238].try_into().unwrap());
        }
        assert_eq!(data, c.input()[HEADER_LEN..]);
        p.complete_command(0, 0, 0);
        let done = poll(&p, &mut q);
        assert_eq!(done[0].result.as_ref().map(|o| o.bytes().len()), Ok(len));
        assert_eq!(p.live_allocations(), resident, "the added pieces are freed when the slot is free again");
        assert_eq!(q.submit(&p, 2, &cmd(0x800)), Ok(0), "the slot works on its own blocks again");
    }

    #[test]
    fn the_geometry_and_the_interface_revision_are_checked() {
        let p = Fake::with_cmdq(LOG_SIZE, LOG_STRIDE);
        p.set_bar(initseg::CMDIF_REV_FW_SUB, 4 << 16);
        assert_eq!(CmdQueue::new(&p, 1).err(), Some(SetupError::CmdifRev(4)));
        let p = Fake::with_cmdq(6, LOG_STRIDE);
        assert_eq!(CmdQueue::new(&p, 1).err(), Some(SetupError::Geometry { log_size: 6, log_stride: LOG_STRIDE }));
    }

    #[test]
    fn the_emergency_command_posts_in_its_own_slot_and_waits_a_bounded_time() {
        let (p, mut q) = queue();
        let paos = crate::ifc::vport::paos_set(1, crate::ifc::vport::MLX5_PORT_DOWN);
        let e = q.prepare_emergency(&p, &paos).expect("32 slots keep one for the fatal path");
        assert_eq!((e.slot(), e.opcode()), (30, paos.opcode()));
        // Every regular slot busy does not touch it.
        for tag in 0..30 {
            q.submit(&p, tag, &cmd(0x800)).unwrap();
        }
        assert_eq!(p.cmdq_entry(30), [0; ENTRY_LEN], "nothing is posted before the fatal path fires");
        // The firmware answers after 3 polls; each poll moves the clock on by 1 ms.
        p.set_relax_step_ns(1_000_000);
        p.on_relax(|f, n| {
            if n == 3 {
                f.complete_command(30, 0, 0);
            }
        });
        let (allocations, live) = (p.allocations(), p.live_allocations());
        assert_eq!(e.fire(&p, 100_000_000), EmergencyOutcome::Completed { delivery: 0, status: 0 });
        assert_eq!(
            (p.allocations(), p.live_allocations()),
            (allocations, live),
            "the fatal path allocates and frees nothing"
        );
        assert_eq!(p.doorbells().last(), Some(&(1 << 30)), "its own doorbell bit");
        // What the firmware read: a valid entry (XOR 0xff, owned by hardware when posted) whose mailbox holds
        // the PAOS data (admin_status down, ase).
        let mut posted = e.entry;
        posted[0x3f] = 1;
        assert_eq!(xor(&posted), 0xff);
        let in_chain = u64::from_be_bytes(posted[0x08..0x10].try_into().unwrap());
        let mut reg = [0u8; 16];
        p.mem_read(in_chain, &mut reg);
        assert_eq!((reg[2] & 0xf, reg[4] & 0x80), (crate::ifc::vport::MLX5_PORT_DOWN, 0x80));
        // A firmware that never answers: the deadline ends the wait.
        let (p, mut q) = queue();
        let e = q.prepare_emergency(&p, &paos).unwrap();
        p.set_relax_step_ns(1_000_000);
        assert_eq!(e.fire(&p, 50_000_000), EmergencyOutcome::TimedOut);
        assert!((50..=51).contains(&p.relaxes()), "bounded by the deadline");
    }
}
