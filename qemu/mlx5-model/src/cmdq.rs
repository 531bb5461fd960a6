//! The command queue transport (`mlx5_ifc.h` `cmd_queue_entry`, `cmd_if_box`; `device.h` `mlx5_cmd_layout`,
//! `mlx5_cmd_prot_block`; docs/reference/mlx5.md §c): reading a command entry and its input mailbox chain, validating
//! the chain (alignment, block numbers, tokens, signatures when enabled), and writing the output back with
//! ownership returned to software.
//!
//! Transport faults are reported as the entry's delivery status (`status_own >> 1`); the command is then not
//! executed. Faults inside a well-delivered command are the output header's status (see `cmd`).

use crate::ifc::{self, cmd_if_box as bx, cmd_queue_entry as ent};
use crate::mem::Memory;

/// Delivery status codes (`core/cmd.c:78-90`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Delivery {
    Ok = 0x0,
    SignatureErr = 0x1,
    TokenErr = 0x2,
    BadBlockNumber = 0x3,
    OutputPointerNotAligned = 0x4,
    InputPointerNotAligned = 0x5,
    FwInternalErr = 0x6,
    InputLenErr = 0x7,
    OutputLenErr = 0x8,
    ReservedNotZero = 0x9,
    BadCommandType = 0x10,
}

/// Largest input or output the model accepts (bounds allocation and chain walks on driver input). 8 MiB
/// covers an MTT list for 4 GiB of 4 KiB pages.
pub const MAX_MSG_LEN: u32 = 8 << 20;

/// The 64-byte entry as the driver wrote it.
#[derive(Clone)]
pub struct Entry {
    pub raw: [u8; ent::SIZE],
}

impl Entry {
    pub fn read(ram: &dyn Memory, addr: u64) -> Option<Entry> {
        let mut raw = [0u8; ent::SIZE];
        ram.read(addr, &mut raw).ok()?;
        Some(Entry { raw })
    }
    pub fn owned_by_hw(&self) -> bool {
        ifc::get(&self.raw, ent::OWNERSHIP) == 1
    }
    pub fn input_length(&self) -> u32 {
        ifc::get(&self.raw, ent::INPUT_LENGTH)
    }
    pub fn output_length(&self) -> u32 {
        ifc::get(&self.raw, ent::OUTPUT_LENGTH)
    }
    pub fn token(&self) -> u8 {
        ifc::get(&self.raw, ent::TOKEN) as u8
    }
    fn in_ptr(&self) -> u64 {
        ifc::get64(&self.raw, ent::INPUT_MAILBOX_POINTER)
    }
    fn out_ptr(&self) -> u64 {
        ifc::get64(&self.raw, ent::OUTPUT_MAILBOX_POINTER)
    }
}

/// XOR of all bytes (`core/cmd.c` `xor8_buf`).
pub fn xor8(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

fn blocks_for(len: u32) -> usize {
    (len as usize).saturating_sub(ent::INLINE_LEN).div_ceil(bx::MAILBOX_DATA_LEN)
}

/// Walks a mailbox chain of `n` blocks from `first`, checking each block; returns the block addresses and
/// their contents. `bad_ptr` is the delivery status for a misaligned or unreachable pointer.
fn walk(
    ram: &dyn Memory,
    first: u64,
    n: usize,
    token: u8,
    check_sig: bool,
    bad_ptr: Delivery,
) -> Result<Vec<(u64, Vec<u8>)>, Delivery> {
    let mut out = Vec::with_capacity(n);
    let mut addr = first;
    for i in 0..n {
        // The entry's pointers are 512-byte aligned (bits 31:9), next pointers 1 KiB aligned (bits 31:10).
        let align = if i == 0 { 0x1ff } else { 0x3ff };
        if addr == 0 || addr & align != 0 {
            return Err(bad_ptr);
        }
        let mut b = vec![0u8; bx::SIZE];
        ram.read(addr, &mut b).map_err(|_| bad_ptr)?;
        if ifc::get(&b, bx::BLOCK_NUMBER) != i as u32 {
            return Err(Delivery::BadBlockNumber);
        }
        if ifc::get(&b, bx::TOKEN) as u8 != token {
            return Err(Delivery::TokenErr);
        }
        if check_sig && (xor8(&b[0x200..0x23f]) != 0xff || xor8(&b) != 0xff) {
            return Err(Delivery::SignatureErr);
        }
        let next = ifc::get64(&b, bx::NEXT_POINTER);
        out.push((addr, b));
        addr = next;
    }
    Ok(out)
}

/// A delivered command: its whole input and where its output goes.
pub struct Delivered {
    pub input: Vec<u8>,
    pub output_length: usize,
    out_blocks: Vec<u64>,
}

/// Validates the entry and both mailbox chains and gathers the input (inline part + mailbox data,
/// `input_length` bytes).
pub fn deliver(ram: &dyn Memory, e: &Entry, check_sig: bool) -> Result<Delivered, Delivery> {
    if ifc::get(&e.raw, ent::TYPE) != ent::TYPE_PCIE {
        return Err(Delivery::BadCommandType);
    }
    if check_sig && xor8(&e.raw) != 0xff {
        return Err(Delivery::SignatureErr);
    }
    let (ilen, olen) = (e.input_length(), e.output_length());
    if ilen > MAX_MSG_LEN {
        return Err(Delivery::InputLenErr);
    }
    if olen > MAX_MSG_LEN {
        return Err(Delivery::OutputLenErr);
    }
    let token = e.token();
    let ins = walk(ram, e.in_ptr(), blocks_for(ilen), token, check_sig, Delivery::InputPointerNotAligned)?;
    // The driver prepares the output chain (block numbers, tokens); its signatures are the device's to write.
    let outs = walk(ram, e.out_ptr(), blocks_for(olen), token, false, Delivery::OutputPointerNotAligned)?;
    let mut input = Vec::with_capacity(ilen as usize);
    input.extend_from_slice(&e.raw[ent::COMMAND_INPUT_INLINE_DATA..ent::COMMAND_INPUT_INLINE_DATA + ent::INLINE_LEN]);
    for (_, b) in &ins {
        input.extend_from_slice(&b[..bx::MAILBOX_DATA_LEN]);
    }
    input.truncate(ilen as usize);
    Ok(Delivered { input, output_length: olen as usize, out_blocks: outs.into_iter().map(|(a, _)| a).collect() })
}

/// Writes `output` (at most `output_length` bytes; the inline 16 always) into the entry and the output chain,
/// then hands the entry back to software with `delivery`. Returns the bytes as the driver will see them.
pub fn complete(
    ram: &dyn Memory,
    entry_addr: u64,
    d: Option<&Delivered>,
    output: &[u8],
    delivery: Delivery,
    sign: bool,
) -> Vec<u8> {
    let olen = d.map_or(ent::INLINE_LEN, |d| d.output_length);
    let mut seen = output.to_vec();
    seen.resize(olen.max(ent::INLINE_LEN), 0);
    if let Some(d) = d {
        for (i, &addr) in d.out_blocks.iter().enumerate() {
            let from = ent::INLINE_LEN + i * bx::MAILBOX_DATA_LEN;
            let to = (from + bx::MAILBOX_DATA_LEN).min(olen);
            let mut data = [0u8; bx::MAILBOX_DATA_LEN];
            data[..to - from].copy_from_slice(&seen[from..to]);
            // Addresses were read successfully in `deliver`; a write failure here cannot be reported anyway.
            let _ = ram.write(addr, &data);
            if sign {
                let mut b = vec![0u8; bx::SIZE];
                if ram.read(addr, &mut b).is_ok() {
                    b[0x23e] = !xor8(&b[0x200..0x23e]);
                    b[0x23f] = 0;
                    b[0x23f] = !xor8(&b[..0x23f]);
                    let _ = ram.write(addr + 0x23e, &b[0x23e..0x240]);
                }
            }
        }
    }
    let _ = ram.write(entry_addr + ent::COMMAND_OUTPUT_INLINE_DATA as u64, &seen[..ent::INLINE_LEN]);
    // Ownership goes back last: the driver reads the output once it sees bit 0 clear.
    let _ = ram.write(entry_addr + 0x3f, &[(delivery as u8) << 1]);
    seen.truncate(olen);
    seen
}
