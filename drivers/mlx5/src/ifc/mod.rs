//! Command builders and output parsers, one module per PRM concept, each encoding fields exactly at the bit
//! offsets `mlx5_ifc.h` gives (as `offsetof` gives them, docs/reference/mlx5.md §0; structures missing there were
//! measured with `offsetof` over Linux 6.12's `mlx5_ifc.h`). Builders return a [`Command`] carrying the key attributes
//! for error reports; parsers take the [`Output`](crate::command::Output) of a command that succeeded
//! (`parse_*` in `init`, `resources`, `eq`, `cq`; `*_out` in `mkey`, `qp`, `vport`, `flow`).
//!
//! Every field is a typed constant ([`crate::field`]) declared once with its bit offset and width from
//! `mlx5_ifc.h`: a structure used in more than one command (`qpc`, `mkc`, `cqc`, `eqc`, `wq`, ...) gets a module
//! of its own with offsets relative to its start, placed into each command with `.at(base)`; the fields of a
//! `*_in` / `*_out` structure are absolute. Builders and parsers name the field, never a width. The opcodes
//! are one list, [`opcode`].

use crate::command::Command;
use crate::field::{Field, Field64};

pub mod cq;
pub mod eq;
pub mod eth;
pub mod flow;
pub mod init;
pub mod mkey;
pub mod opcode;
pub mod qp;
pub mod resources;
pub mod umr;
pub mod vport;

/// Size of every 16-byte `*_in` / `*_out` (header only or header plus one dword pair).
pub const CMD_HDR_LEN: usize = 0x10;

/// Byte offset of `pas[]` (`cmd_pas` list) after the 0x110-byte fixed part of CREATE_EQ / CREATE_CQ /
/// CREATE_QP, and of `klm_pas_mtt[]` in CREATE_MKEY.
pub const PAS_OFFSET: usize = 0x110;
/// The first entry of that list.
pub const PAS: Field64 = Field64::new(PAS_OFFSET * 8);

/// The 24-bit object number at bit 0x48 that most 16-byte structures carry: the `pd`, `uar`, `cqn`, `qpn`,
/// `mkey_index`, `table_id`, `sqn`... of a `create_*_out` / `alloc_*_out`, and of a `destroy_*_in` /
/// `dealloc_*_in` / `query_*_in`.
pub const OBJECT_ID: Field = Field::new(0x48, 24);

/// Writes a list of 64-bit big-endian page addresses (`cmd_pas`) from entry `first` on.
pub(crate) fn put_pas(cmd: &mut Command, first: Field64, pages: &[u64]) {
    for (i, &p) in pages.iter().enumerate() {
        cmd.set64(first.nth(i), p);
    }
}

/// Bytes a 16-byte-header command needs for `n` PAS entries after its fixed part.
pub(crate) const fn with_pas(fixed: usize, n: usize) -> usize {
    fixed + 8 * n
}

#[cfg(test)]
pub(crate) mod golden {
    //! Independent readers for the tests: plain byte arithmetic, not the `field` helpers under test.

    pub fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    pub fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    pub fn be64(b: &[u8], at: usize) -> u64 {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(x)
    }

    /// An output buffer of `len` bytes with `(byte offset, bytes)` patches.
    pub fn out(len: usize, patches: &[(usize, &[u8])]) -> crate::command::Output {
        let mut v = alloc::vec![0u8; len];
        for (at, b) in patches {
            v[*at..*at + b.len()].copy_from_slice(b);
        }
        crate::command::Output::new(v)
    }
}
