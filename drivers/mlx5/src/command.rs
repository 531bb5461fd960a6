//! One firmware command: the whole `*_in` structure (its first dword carries `opcode` [31:16], the second
//! `op_mod` [15:0]; docs/reference/mlx5.md §c.6), the length of the `*_out` structure expected back, and the key
//! attributes a failure report should name. [`Output`] is the `*_out` bytes of a command that completed with status OK;
//! anything else is a [`CmdError`] naming opcode, op_mod, status name and syndrome.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::ops::{Deref, DerefMut};

use crate::field::{ByteArray, Field, Field64};

/// Every command's input and output header is 16 bytes (the part that travels inline in the queue entry).
pub const HEADER_LEN: usize = 16;

/// The header every `*_in` structure opens with: `opcode` [31:16] of dword 0, `op_mod` [15:0] of dword 1.
pub const OPCODE: Field = Field::new(0x00, 16);
pub const OP_MOD: Field = Field::new(0x30, 16);

/// At most this many attributes are kept per command for error reports: the builders in `ifc` set up to four
/// (`create_mkey_mtt`: `pd`, `start`, `len`, `pages`), and a caller may add one of its own (the lease service's
/// `slot`, which was dropped from CREATE_MKEY when this was four).
pub const MAX_ATTRS: usize = 5;

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
        OPCODE.write(&mut input, u32::from(opcode));
        OP_MOD.write(&mut input, u32::from(op_mod));
        Command { input, out_len: out_len.max(HEADER_LEN), attrs: Attrs::default() }
    }

    pub fn opcode(&self) -> u16 {
        OPCODE.read(&self.input) as u16
    }

    pub fn op_mod(&self) -> u16 {
        OP_MOD.read(&self.input) as u16
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

    /// `MLX5_SET(<in struct>, in, field, value)`: bits of `value` above the field's width are dropped.
    pub fn set(&mut self, f: Field, value: u32) {
        f.write(&mut self.input, value);
    }

    /// `MLX5_SET64`.
    pub fn set64(&mut self, f: Field64, value: u64) {
        f.write(&mut self.input, value);
    }

    /// Copies `bytes` to the start of array `f` (MAC/GID arrays, capability blocks, register data).
    pub fn put(&mut self, f: ByteArray, bytes: &[u8]) {
        f.write(&mut self.input, bytes);
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
    pub fn get(&self, f: Field) -> u32 {
        f.read(&self.bytes)
    }

    /// `MLX5_GET64`; past the end of the output it reads 0.
    pub fn get64(&self, f: Field64) -> u64 {
        f.read(&self.bytes)
    }

    /// The bytes of array `f`, shorter when the output is.
    pub fn array(&self, f: ByteArray) -> &[u8] {
        f.read(&self.bytes)
    }
}

/// Declares a list of named codes once: a `pub const` per code, a table of `(value, name)` in declaration
/// order, a name lookup and its inverse, all generated from the same lines. The name is the constant's
/// identifier without `prefix` (`MLX5_CMD_OP_CREATE_MKEY` → `"CREATE_MKEY"`), so value and name cannot drift
/// apart; two codes with one value fail to compile. The HCA opcodes (`ifc::opcode`), command statuses and
/// delivery statuses (here) are declared with it.
macro_rules! codes {
    (
        $(#[$tm:meta])* $all:ident: [$t:ty], prefix $prefix:literal;
        $(#[$nm:meta])* fn $name:ident;
        $(#[$pm:meta])* fn $parse:ident;
        $( $(#[$m:meta])* $id:ident = $v:literal; )*
    ) => {
        $( $(#[$m])* pub const $id: $t = $v; )*

        $(#[$tm])*
        pub const $all: &[($t, &str)] = &[$(($v, $crate::command::strip_prefix(stringify!($id), $prefix)),)*];

        // Each value once: a second code with the same number is a typo in the list.
        const _: () = {
            let all = $all;
            let mut i = 0;
            while i < all.len() {
                let mut j = i + 1;
                while j < all.len() {
                    assert!(all[i].0 != all[j].0, "two codes share one value");
                    j += 1;
                }
                i += 1;
            }
        };

        $(#[$nm])*
        pub fn $name(value: $t) -> Option<&'static str> {
            match value {
                $($v => Some($crate::command::strip_prefix(stringify!($id), $prefix)),)*
                _ => None,
            }
        }

        $(#[$pm])*
        pub fn $parse(name: &str) -> Option<$t> {
            $all.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
        }
    };
}
pub(crate) use codes;

/// `ident` without `prefix`, at compile time (the names [`codes!`] derives). An identifier that does not start
/// with the prefix fails to compile.
pub const fn strip_prefix(ident: &'static str, prefix: &str) -> &'static str {
    let (s, p) = (ident.as_bytes(), prefix.as_bytes());
    assert!(s.len() > p.len(), "a code's name is its prefix and more");
    let mut i = 0;
    while i < p.len() {
        assert!(s[i] == p[i], "a code's identifier starts with the list's prefix");
        i += 1;
    }
    match core::str::from_utf8(s.split_at(p.len()).1) {
        Ok(rest) => rest,
        Err(_) => panic!("an identifier is ASCII"),
    }
}

/// Command status codes (`device.h` `MLX5_CMD_STAT_*`; docs/reference/mlx5.md §c.6), named as the driver's
/// reports print them.
pub mod status {
    super::codes! {
        /// Every status the driver names, in numeric order.
        ALL: [u8], prefix "MLX5_CMD_STAT_";
        /// The status's name, `None` for a code the list does not hold.
        fn name;
        /// The status named `name` (as [`name`] spells it).
        fn from_name;
        MLX5_CMD_STAT_OK = 0x00;
        MLX5_CMD_STAT_INT_ERR = 0x01;
        MLX5_CMD_STAT_BAD_OP = 0x02;
        MLX5_CMD_STAT_BAD_PARAM = 0x03;
        MLX5_CMD_STAT_BAD_SYS_STATE = 0x04;
        MLX5_CMD_STAT_BAD_RES = 0x05;
        MLX5_CMD_STAT_RES_BUSY = 0x06;
        MLX5_CMD_STAT_NOT_READY = 0x07;
        MLX5_CMD_STAT_EXCEED_LIM = 0x08;
        MLX5_CMD_STAT_BAD_RES_STATE = 0x09;
        MLX5_CMD_STAT_BAD_INDEX = 0x0a;
        MLX5_CMD_STAT_NO_RESOURCES = 0x0f;
        MLX5_CMD_STAT_BAD_QP_STATE = 0x10;
        MLX5_CMD_STAT_BAD_PKT = 0x30;
        MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES = 0x40;
        MLX5_CMD_STAT_BAD_INP_LEN = 0x50;
        MLX5_CMD_STAT_BAD_OUTP_LEN = 0x51;
    }
}

/// Delivery status codes (`status_own >> 1` of a queue entry; Linux `core/cmd.c` `MLX5_CMD_DELIVERY_STAT_*`,
/// docs/reference/mlx5.md §c.5).
pub mod delivery {
    super::codes! {
        /// Every delivery status the driver names.
        ALL: [u8], prefix "DELIVERY_";
        /// The delivery status's name, `None` for a code the list does not hold.
        fn name;
        /// The delivery status named `name`.
        fn from_name;
        DELIVERY_OK = 0x0;
        DELIVERY_SIGNATURE_ERR = 0x1;
        DELIVERY_TOKEN_ERR = 0x2;
        DELIVERY_BAD_BLOCK_NUMBER = 0x3;
        DELIVERY_OUTPUT_POINTER_NOT_ALIGNED = 0x4;
        DELIVERY_INPUT_POINTER_NOT_ALIGNED = 0x5;
        DELIVERY_FW_INTERNAL_ERR = 0x6;
        DELIVERY_INPUT_LENGTH_ERR = 0x7;
        DELIVERY_OUTPUT_LENGTH_ERR = 0x8;
        DELIVERY_RESERVED_NOT_ZERO = 0x9;
        DELIVERY_BAD_COMMAND_TYPE = 0x10;
    }
}

/// A command status's name ([`status::ALL`]), `UNKNOWN_STATUS` for any other code.
pub fn status_name(status: u8) -> &'static str {
    status::name(status).unwrap_or("UNKNOWN_STATUS")
}

/// What a status means for one particular command, where the firmware's answer is known to carry a more
/// specific meaning than its generic name.
pub fn status_note(opcode: u16, status: u8) -> Option<&'static str> {
    match (opcode, status) {
        // A CX-5 (fw 16.35.4506) answered 0x08 to an entry on an occupied index, reported as BAD_INDEX
        // (docs/reference/revoke-spec.md §3.2); Linux `device.h` names 0x08 EXCEED_LIM (`docs/hca-model.md`, "Flow
        // steering").
        (crate::ifc::opcode::MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY, status::MLX5_CMD_STAT_EXCEED_LIM) => {
            Some("BAD_INDEX: flow_index already holds an entry")
        }
        _ => None,
    }
}

/// A delivery status's name ([`delivery::ALL`]), `UNKNOWN_DELIVERY_STATUS` for any other code.
pub fn delivery_name(status: u8) -> &'static str {
    delivery::name(status).unwrap_or("UNKNOWN_DELIVERY_STATUS")
}

/// An opcode's name from the one opcode list ([`crate::ifc::opcode::ALL`]), `UNKNOWN_OPCODE` for any other.
pub fn opcode_name(opcode: u16) -> &'static str {
    crate::ifc::opcode::name(opcode).unwrap_or("UNKNOWN_OPCODE")
}

/// The opcode named `name` (as [`opcode_name`] spells it: `"CREATE_MKEY"`), `None` for a name the list does not
/// hold.
pub fn opcode_from_name(name: &str) -> Option<u16> {
    crate::ifc::opcode::from_name(name)
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

    /// Names come from the one opcode list: a few checked against `mlx5_ifc.h`'s spelling, every entry found
    /// back from its name, and unknown codes and names refused.
    #[test]
    fn opcode_names_and_their_parser() {
        use crate::ifc::opcode;
        assert_eq!(opcode_name(0x200), "CREATE_MKEY");
        assert_eq!(opcode_name(0x507), "2ERR_QP");
        assert_eq!(opcode_name(0x936), "SET_FLOW_TABLE_ENTRY");
        assert_eq!(opcode_name(0x203), "QUERY_SPECIAL_CONTEXTS");
        assert_eq!(opcode_name(0x106), "UNKNOWN_OPCODE");
        assert_eq!(opcode_from_name("CREATE_MKEY"), Some(opcode::MLX5_CMD_OP_CREATE_MKEY));
        assert_eq!(opcode_from_name("ALLOC_Q_COUNTER"), Some(0x771));
        assert_eq!((opcode_from_name("create_mkey"), opcode_from_name("UNKNOWN_OPCODE")), (None, None));
        assert_eq!(opcode::ALL.len(), 69);
        for &(op, name) in opcode::ALL {
            assert_eq!((opcode_name(op), opcode_from_name(name)), (name, Some(op)));
            assert!(!name.starts_with("MLX5_CMD_OP_") && !name.is_empty());
        }
    }

    /// Every command a builder in `ifc` makes carries an opcode the list names (so the command ring, HEALTH
    /// and the fatal dump never print UNKNOWN_OPCODE for one of ours).
    #[test]
    fn every_builders_opcode_is_named() {
        use crate::handles::*;
        use crate::ifc::*;
        let base = qp::QpBase { qpn: Qpn(1), pd: Pdn(1), cqn_snd: Cqn(1), cqn_rcv: Cqn(1) };
        let built = [
            init::enable_hca(false),
            init::disable_hca(false),
            init::query_issi(),
            init::set_issi(1),
            init::query_pages(init::PagesKind::Boot),
            init::manage_pages_give(0, &[0x1000]),
            init::query_hca_cap(0, init::CapMode::Cur),
            init::set_hca_cap(0, &[]),
            init::init_hca(),
            init::teardown_hca(0),
            init::host_endianness_le(),
            resources::alloc_pd(),
            resources::dealloc_uar(UarPage(1)),
            resources::alloc_transport_domain(),
            mkey::destroy_mkey(MkeyIndex(1)),
            mkey::query_mkey(MkeyIndex(1)),
            mkey::create_mkey_umr_free(Pdn(1), 0, 8, 12, false),
            eq::query_eq(Eqn(1)),
            eq::destroy_eq(Eqn(1)),
            cq::query_cq(Cqn(1)),
            cq::destroy_cq(Cqn(1)),
            qp::rst2init(&base, qp::QpAccess { remote_read: true, remote_write: true, remote_atomic: false }, None),
            qp::qp_2err(Qpn(1)),
            qp::qp_2rst(Qpn(1)),
            qp::query_qp(Qpn(1)),
            qp::destroy_qp(Qpn(1)),
            vport::query_vport_state(),
            vport::query_nic_vport_context(),
            vport::modify_nic_vport_mtu(1500),
            vport::query_roce_address(0),
            vport::set_roce_address(0, &vport::RoceAddress::default()),
            flow::create_flow_table(flow::FS_FT_NIC_RX, 0, 1),
            flow::destroy_flow_group(flow::FS_FT_NIC_RX, FlowTableId(1), FlowGroupId(1)),
            flow::delete_fte(flow::FS_FT_NIC_RX, FlowTableId(1), FlowIndex(0)),
            flow::clear_flow_table_root(flow::FS_FT_NIC_RX),
            eth::create_tis(Tdn(1)),
            eth::destroy_tis(1),
            eth::modify_sq(1, 0, 1),
            eth::query_sq(1),
            eth::destroy_sq(1),
            eth::modify_rq(1, 0, 1),
            eth::query_rq(1),
            eth::destroy_rq(1),
            eth::create_tir_direct(Tdn(1), 1),
            eth::destroy_tir(1),
            eth::alloc_q_counter(),
            eth::dealloc_q_counter(1),
            eth::query_q_counter(1),
            eth::query_special_contexts(),
        ];
        for c in &built {
            assert_ne!(opcode_name(c.opcode()), "UNKNOWN_OPCODE", "{:#x}", c.opcode());
        }
    }

    #[test]
    fn status_and_delivery_names() {
        assert_eq!((status_name(0), status_name(3), status_name(0x51)), ("OK", "BAD_PARAM", "BAD_OUTP_LEN"));
        assert_eq!((status_name(0x0b), status_name(0xff)), ("UNKNOWN_STATUS", "UNKNOWN_STATUS"));
        assert_eq!(status::from_name("EXCEED_LIM"), Some(status::MLX5_CMD_STAT_EXCEED_LIM));
        assert_eq!(status::ALL.len(), 17);
        assert_eq!(
            (delivery_name(0x7), delivery_name(0x10), delivery_name(0xa)),
            ("INPUT_LENGTH_ERR", "BAD_COMMAND_TYPE", "UNKNOWN_DELIVERY_STATUS")
        );
        assert_eq!(delivery::from_name("TOKEN_ERR"), Some(2));
        assert_eq!(strip_prefix("MLX5_CMD_OP_2ERR_QP", "MLX5_CMD_OP_"), "2ERR_QP");
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
