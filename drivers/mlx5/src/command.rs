//! One firmware command: the whole `*_in` structure (its first dword carries `opcode` [31:16], the second
//! `op_mod` [15:0]; docs/reference/mlx5.md §c.6), the length of the `*_out` structure expected back, and the key
//! attributes a failure report should name. [`Output`] is the `*_out` bytes of a command that completed with status OK;
//! anything else is a [`CmdError`] naming opcode, op_mod, status name and syndrome.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::ops::{Deref, DerefMut};

use crate::field;

/// Every command's input and output header is 16 bytes (the part that travels inline in the queue entry).
pub const HEADER_LEN: usize = 16;

/// At most this many attributes are kept per command for error reports.
pub const MAX_ATTRS: usize = 4;

/// Key attributes of a command (`pd`, `qpn`, `mkey`, `len` ...), kept for error reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    items: [(&'static str, u64); MAX_ATTRS],
    len: usize,
}

impl Attrs {
    pub fn push(&mut self, name: &'static str, value: u64) {
        if self.len < MAX_ATTRS {
            self.items[self.len] = (name, value);
            self.len += 1;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.items[..self.len].iter().copied()
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

impl fmt::Display for Attrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{n}={v:#x}")?;
        }
        Ok(())
    }
}

/// Inputs and outputs up to this many bytes are kept inside the [`Command`] / [`Output`] rather than on the
/// heap: every command of a lease's teardown and most outputs (a DESTROY_* input is 16 bytes, its output the
/// 16-byte header), so the commands a revoke issues allocate nothing.
pub const INLINE_LEN: usize = 32;

/// Command bytes: inline up to [`INLINE_LEN`], on the heap beyond.
#[derive(Clone)]
enum Bytes {
    Inline { len: u8, buf: [u8; INLINE_LEN] },
    Heap(Vec<u8>),
}

impl Bytes {
    fn zeroed(len: usize) -> Bytes {
        match u8::try_from(len) {
            Ok(l) if len <= INLINE_LEN => Bytes::Inline { len: l, buf: [0; INLINE_LEN] },
            _ => Bytes::Heap(vec![0; len]),
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Inline { len, buf } => &buf[..usize::from(*len)],
            Bytes::Heap(v) => v,
        }
    }
}

impl DerefMut for Bytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Bytes::Inline { len, buf } => &mut buf[..usize::from(*len)],
            Bytes::Heap(v) => v,
        }
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl Eq for Bytes {}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A command ready to be posted: the complete input structure and the output length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    input: Bytes,
    out_len: usize,
    attrs: Attrs,
}

impl Command {
    /// A zeroed `in_len`-byte input with `opcode` and `op_mod` set; `out_len` bytes of output expected.
    pub fn new(opcode: u16, op_mod: u16, in_len: usize, out_len: usize) -> Command {
        let in_len = in_len.max(HEADER_LEN);
        let mut input = Bytes::zeroed(in_len);
        field::set(&mut input, 0x00, 16, u32::from(opcode));
        field::set(&mut input, 0x30, 16, u32::from(op_mod));
        Command { input, out_len: out_len.max(HEADER_LEN), attrs: Attrs::default() }
    }

    pub fn opcode(&self) -> u16 {
        field::get(&self.input, 0x00, 16) as u16
    }

    pub fn op_mod(&self) -> u16 {
        field::get(&self.input, 0x30, 16) as u16
    }

    pub fn input(&self) -> &[u8] {
        &self.input
    }

    pub fn input_mut(&mut self) -> &mut [u8] {
        &mut self.input
    }

    pub fn out_len(&self) -> usize {
        self.out_len
    }

    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    /// Adds an attribute for error reports (builder style).
    pub fn with(mut self, name: &'static str, value: u64) -> Command {
        self.attrs.push(name, value);
        self
    }

    /// `MLX5_SET(<in struct>, in, field, value)` with the field's bit offset and width.
    pub fn set(&mut self, bit_off: usize, width: usize, value: u32) {
        field::set(&mut self.input, bit_off, width, value);
    }

    /// `MLX5_SET64` at a byte offset.
    pub fn set64(&mut self, byte_off: usize, value: u64) {
        field::set64(&mut self.input, byte_off, value);
    }

    /// Copies `bytes` into the input at `byte_off` (MAC/GID arrays, nested contexts).
    pub fn put(&mut self, byte_off: usize, bytes: &[u8]) {
        self.input[byte_off..byte_off + bytes.len()].copy_from_slice(bytes);
    }

    /// Builds the error this command would report for `kind`.
    pub fn error(&self, kind: ErrorKind) -> CmdError {
        CmdError { opcode: self.opcode(), op_mod: self.op_mod(), kind, attrs: self.attrs }
    }
}

/// The `*_out` bytes of a command that completed with delivery status 0 and command status OK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    bytes: Bytes,
}

impl Output {
    pub fn new(bytes: Vec<u8>) -> Output {
        Output { bytes: Bytes::Heap(bytes) }
    }

    /// `len` zero bytes, for the command queue to fill from the entry and the mailboxes.
    pub fn zeroed(len: usize) -> Output {
        Output { bytes: Bytes::zeroed(len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// `MLX5_GET(<out struct>, out, field)`; a field past the end of what the device returned reads 0.
    pub fn get(&self, bit_off: usize, width: usize) -> u32 {
        if (bit_off / 32) * 4 + 4 > self.bytes.len() { 0 } else { field::get(&self.bytes, bit_off, width) }
    }

    pub fn get64(&self, byte_off: usize) -> u64 {
        if byte_off + 8 > self.bytes.len() { 0 } else { field::get64(&self.bytes, byte_off) }
    }

    /// Bytes `[byte_off, byte_off + len)`, shorter when the output is.
    pub fn slice(&self, byte_off: usize, len: usize) -> &[u8] {
        let start = byte_off.min(self.bytes.len());
        let end = (byte_off + len).min(self.bytes.len());
        &self.bytes[start..end]
    }
}

/// Command status (`device.h:1474-1492`; names as Linux `core/cmd.c:744-784` prints them).
pub fn status_name(status: u8) -> &'static str {
    match status {
        0x00 => "OK",
        0x01 => "INT_ERR",
        0x02 => "BAD_OP",
        0x03 => "BAD_PARAM",
        0x04 => "BAD_SYS_STATE",
        0x05 => "BAD_RES",
        0x06 => "RES_BUSY",
        0x07 => "NOT_READY",
        0x08 => "EXCEED_LIM",
        0x09 => "BAD_RES_STATE",
        0x0a => "BAD_INDEX",
        0x0f => "NO_RESOURCES",
        0x10 => "BAD_QP_STATE",
        0x30 => "BAD_PKT",
        0x40 => "BAD_SIZE_OUTS_CQES",
        0x50 => "BAD_INP_LEN",
        0x51 => "BAD_OUTP_LEN",
        _ => "UNKNOWN_STATUS",
    }
}

/// What a status means for one particular command, where the firmware's answer is known to carry a more
/// specific meaning than its generic name.
pub fn status_note(opcode: u16, status: u8) -> Option<&'static str> {
    match (opcode, status) {
        // A CX-5 (fw 16.35.4506) answered 0x08 to an entry on an occupied index, reported as BAD_INDEX
        // (docs/reference/revoke-spec.md §3.2); Linux `device.h` names 0x08 EXCEED_LIM (`docs/hca-model.md`, "Flow
        // steering").
        (0x936, 0x08) => Some("BAD_INDEX: flow_index already holds an entry"),
        _ => None,
    }
}

/// Delivery status (`status_own >> 1`; Linux `core/cmd.c:78-90`).
pub fn delivery_name(status: u8) -> &'static str {
    match status {
        0x0 => "OK",
        0x1 => "SIGNATURE_ERR",
        0x2 => "TOKEN_ERR",
        0x3 => "BAD_BLOCK_NUMBER",
        0x4 => "OUTPUT_POINTER_NOT_ALIGNED",
        0x5 => "INPUT_POINTER_NOT_ALIGNED",
        0x6 => "FW_INTERNAL_ERR",
        0x7 => "INPUT_LENGTH_ERR",
        0x8 => "OUTPUT_LENGTH_ERR",
        0x9 => "RESERVED_NOT_ZERO",
        0x10 => "BAD_COMMAND_TYPE",
        _ => "UNKNOWN_DELIVERY_STATUS",
    }
}

/// Names of the opcodes this driver sends (`mlx5_ifc.h:119-320`).
pub fn opcode_name(opcode: u16) -> &'static str {
    match opcode {
        0x100 => "QUERY_HCA_CAP",
        0x101 => "QUERY_ADAPTER",
        0x102 => "INIT_HCA",
        0x103 => "TEARDOWN_HCA",
        0x104 => "ENABLE_HCA",
        0x105 => "DISABLE_HCA",
        0x107 => "QUERY_PAGES",
        0x108 => "MANAGE_PAGES",
        0x109 => "SET_HCA_CAP",
        0x10a => "QUERY_ISSI",
        0x10b => "SET_ISSI",
        0x200 => "CREATE_MKEY",
        0x201 => "QUERY_MKEY",
        0x202 => "DESTROY_MKEY",
        0x203 => "QUERY_SPECIAL_CONTEXTS",
        0x301 => "CREATE_EQ",
        0x302 => "DESTROY_EQ",
        0x303 => "QUERY_EQ",
        0x400 => "CREATE_CQ",
        0x401 => "DESTROY_CQ",
        0x402 => "QUERY_CQ",
        0x500 => "CREATE_QP",
        0x501 => "DESTROY_QP",
        0x502 => "RST2INIT_QP",
        0x503 => "INIT2RTR_QP",
        0x504 => "RTR2RTS_QP",
        0x505 => "RTS2RTS_QP",
        0x507 => "2ERR_QP",
        0x50a => "2RST_QP",
        0x50b => "QUERY_QP",
        0x750 => "QUERY_VPORT_STATE",
        0x754 => "QUERY_NIC_VPORT_CONTEXT",
        0x755 => "MODIFY_NIC_VPORT_CONTEXT",
        0x760 => "QUERY_ROCE_ADDRESS",
        0x761 => "SET_ROCE_ADDRESS",
        0x762 => "QUERY_HCA_VPORT_CONTEXT",
        0x764 => "QUERY_HCA_VPORT_GID",
        0x771 => "ALLOC_Q_COUNTER",
        0x772 => "DEALLOC_Q_COUNTER",
        0x773 => "QUERY_Q_COUNTER",
        0x800 => "ALLOC_PD",
        0x801 => "DEALLOC_PD",
        0x802 => "ALLOC_UAR",
        0x803 => "DEALLOC_UAR",
        0x805 => "ACCESS_REG",
        0x816 => "ALLOC_TRANSPORT_DOMAIN",
        0x817 => "DEALLOC_TRANSPORT_DOMAIN",
        0x900 => "CREATE_TIR",
        0x902 => "DESTROY_TIR",
        0x904 => "CREATE_SQ",
        0x905 => "MODIFY_SQ",
        0x906 => "DESTROY_SQ",
        0x907 => "QUERY_SQ",
        0x908 => "CREATE_RQ",
        0x909 => "MODIFY_RQ",
        0x90a => "DESTROY_RQ",
        0x90b => "QUERY_RQ",
        0x912 => "CREATE_TIS",
        0x914 => "DESTROY_TIS",
        0x92f => "SET_FLOW_TABLE_ROOT",
        0x930 => "CREATE_FLOW_TABLE",
        0x931 => "DESTROY_FLOW_TABLE",
        0x932 => "QUERY_FLOW_TABLE",
        0x933 => "CREATE_FLOW_GROUP",
        0x934 => "DESTROY_FLOW_GROUP",
        0x935 => "QUERY_FLOW_GROUP",
        0x936 => "SET_FLOW_TABLE_ENTRY",
        0x937 => "QUERY_FLOW_TABLE_ENTRY",
        0x938 => "DELETE_FLOW_TABLE_ENTRY",
        _ => "UNKNOWN_OPCODE",
    }
}

/// Why a command did not produce an [`Output`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The firmware executed the command and refused it: output `status` != 0 with its `syndrome`.
    Status { status: u8, syndrome: u32 },
    /// The command interface refused the entry (`status_own >> 1` != 0).
    Delivery { status: u8 },
    /// No completion within the deadline; the slot stays quarantined until the firmware completes it.
    Timeout { slot: u8, waited_ms: u64 },
    /// The health monitor saw a fatal syndrome (or a hang): the command interface is no longer trusted and
    /// the command was failed by the driver (Linux `MLX5_DRIVER_STATUS_ABORTED`).
    Fatal { health_syndrome: u8 },
    /// Every slot is in use (or quarantined); nothing was posted.
    Busy,
    /// The input or output does not fit the driver's mailbox chains.
    TooLarge { len: usize },
    /// The platform could not provide DMA memory for the command.
    NoDma,
    /// The driver was shut down before the command completed.
    Shutdown,
    /// The caller's tag used a bit the command engine reserves for its own marks: refused, never posted
    /// (`engine::CLIENT_TAG_BITS`).
    ReservedTag { tag: u64 },
}

/// A failed command: opcode, op_mod, what went wrong, and the attributes it was attempted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdError {
    pub opcode: u16,
    pub op_mod: u16,
    pub kind: ErrorKind,
    pub attrs: Attrs,
}

impl CmdError {
    /// The firmware status, when the firmware answered.
    pub fn status(&self) -> Option<u8> {
        match self.kind {
            ErrorKind::Status { status, .. } => Some(status),
            _ => None,
        }
    }

    pub fn syndrome(&self) -> Option<u32> {
        match self.kind {
            ErrorKind::Status { syndrome, .. } => Some(syndrome),
            _ => None,
        }
    }

    /// A status byte for reports that need one: the firmware's, or Linux's driver-synthesized 0xFE
    /// (`MLX5_DRIVER_STATUS_ABORTED`) for everything the driver decided itself.
    pub fn status_or_aborted(&self) -> u8 {
        self.status().unwrap_or(0xfe)
    }
}

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#x}) op_mod {:#x}: ", opcode_name(self.opcode), self.opcode, self.op_mod)?;
        match self.kind {
            ErrorKind::Status { status, syndrome } => {
                write!(f, "status {} ({status:#x}) syndrome {syndrome:#x}", status_name(status))?;
                if let Some(note) = status_note(self.opcode, status) {
                    write!(f, " ({note})")?;
                }
            }
            ErrorKind::Delivery { status } => write!(f, "delivery status {} ({status:#x})", delivery_name(status))?,
            ErrorKind::Timeout { slot, waited_ms } => {
                write!(f, "no completion after {waited_ms} ms (slot {slot} quarantined)")?
            }
            ErrorKind::Fatal { health_syndrome } => {
                write!(f, "aborted: HCA in internal error (health syndrome {health_syndrome:#x})")?
            }
            ErrorKind::Busy => write!(f, "all command slots busy")?,
            ErrorKind::TooLarge { len } => write!(f, "{len} bytes do not fit the mailbox chain")?,
            ErrorKind::NoDma => write!(f, "no DMA memory")?,
            ErrorKind::Shutdown => write!(f, "driver shut down")?,
            ErrorKind::ReservedTag { tag } => {
                write!(f, "not posted: tag {tag:#x} uses a bit the command engine reserves (a caller's bug)")?
            }
        }
        if self.attrs.iter().next().is_some() {
            write!(f, " [{}]", self.attrs)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command the Ethernet port sends has its name in the command log (they read UNKNOWN_OPCODE once).
    #[test]
    fn the_ethernet_ports_opcodes_are_named() {
        use crate::ifc::eth::*;
        for (op, name) in [
            (MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS, "QUERY_SPECIAL_CONTEXTS"),
            (MLX5_CMD_OP_ALLOC_Q_COUNTER, "ALLOC_Q_COUNTER"),
            (MLX5_CMD_OP_DEALLOC_Q_COUNTER, "DEALLOC_Q_COUNTER"),
            (MLX5_CMD_OP_QUERY_Q_COUNTER, "QUERY_Q_COUNTER"),
            (MLX5_CMD_OP_CREATE_TIR, "CREATE_TIR"),
            (MLX5_CMD_OP_DESTROY_TIR, "DESTROY_TIR"),
            (MLX5_CMD_OP_CREATE_SQ, "CREATE_SQ"),
            (MLX5_CMD_OP_MODIFY_SQ, "MODIFY_SQ"),
            (MLX5_CMD_OP_DESTROY_SQ, "DESTROY_SQ"),
            (MLX5_CMD_OP_QUERY_SQ, "QUERY_SQ"),
            (MLX5_CMD_OP_CREATE_RQ, "CREATE_RQ"),
            (MLX5_CMD_OP_MODIFY_RQ, "MODIFY_RQ"),
            (MLX5_CMD_OP_DESTROY_RQ, "DESTROY_RQ"),
            (MLX5_CMD_OP_QUERY_RQ, "QUERY_RQ"),
            (MLX5_CMD_OP_CREATE_TIS, "CREATE_TIS"),
            (MLX5_CMD_OP_DESTROY_TIS, "DESTROY_TIS"),
        ] {
            assert_eq!(opcode_name(op), name, "{op:#x}");
        }
    }

    #[test]
    fn header_fields_and_error_text() {
        let c = Command::new(0x200, 0, 0x110, 0x10).with("pd", 5).with("len", 0x20_0000);
        assert_eq!(&c.input()[..8], &[0x02, 0x00, 0, 0, 0, 0, 0, 0]);
        assert_eq!(c.opcode(), 0x200);
        let c2 = Command::new(0x108, 1, 16, 16);
        assert_eq!(c2.input()[7], 1);
        assert_eq!(c2.op_mod(), 1);
        let e = c.error(ErrorKind::Status { status: 3, syndrome: 0x20_0001 });
        let s = alloc::format!("{e}");
        assert_eq!(s, "CREATE_MKEY (0x200) op_mod 0x0: status BAD_PARAM (0x3) syndrome 0x200001 [pd=0x5 len=0x200000]");
        assert_eq!(e.status(), Some(3));
        assert_eq!(c.error(ErrorKind::Busy).status_or_aborted(), 0xfe);
    }
}
