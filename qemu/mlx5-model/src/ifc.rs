//! Big-endian bit fields in the `MLX5_SET` / `MLX5_GET` convention of Linux `include/linux/mlx5/mlx5_ifc.h`:
//! a field is named by its bit offset from the MSB of byte 0 of the structure and its width. A field of at
//! most 32 bits lies inside one big-endian dword; 64-bit fields (addresses) are big-endian u64 at a byte offset.
//!
//! The offsets in the structure modules below are the ones `offsetof()` printed over the real header
//! (docs/reference/mlx5.md §0); every name is the `mlx5_ifc.h` name.
//!
//! Accessors never panic: a field that lies outside the buffer reads as 0 and is not written. Callers check
//! the structure length first (that is what gives `BAD_INPUT_LEN`), so this only guards against model bugs.

/// A field of `width` bits (1..=32, not crossing a dword) at `bit` from the start of its structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub bit: u32,
    pub width: u32,
}

impl Field {
    pub const fn new(bit: u32, width: u32) -> Field {
        Field { bit, width }
    }

    /// The same field inside a structure embedded at `byte` of an outer one (e.g. `mkc` inside
    /// `create_mkey_in`, a capability block inside `query_hca_cap_out`).
    pub const fn at(self, byte: u32) -> Field {
        Field { bit: self.bit + byte * 8, width: self.width }
    }

    const fn mask(self) -> u32 {
        if self.width >= 32 { u32::MAX } else { (1u32 << self.width) - 1 }
    }

    const fn shift(self) -> u32 {
        32 - (self.bit % 32) - self.width
    }

    fn valid(self) -> bool {
        self.width >= 1 && self.width <= 32 && (self.bit % 32) + self.width <= 32
    }
}

fn dword(buf: &[u8], byte: usize) -> Option<u32> {
    let b = buf.get(byte..byte.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// `MLX5_GET`: the value of `f` in `buf`, or 0 when the field is outside `buf`.
pub fn get(buf: &[u8], f: Field) -> u32 {
    if !f.valid() {
        return 0;
    }
    let byte = (f.bit / 32) as usize * 4;
    dword(buf, byte).map_or(0, |d| (d >> f.shift()) & f.mask())
}

/// `MLX5_SET`: stores the low `width` bits of `v` into `f`; other bits of the dword are kept.
pub fn set(buf: &mut [u8], f: Field, v: u32) {
    if !f.valid() {
        return;
    }
    let byte = (f.bit / 32) as usize * 4;
    let Some(d) = dword(buf, byte) else { return };
    let m = f.mask() << f.shift();
    let d = (d & !m) | ((v << f.shift()) & m);
    buf[byte..byte + 4].copy_from_slice(&d.to_be_bytes());
}

/// `MLX5_GET64`: big-endian u64 at byte offset `byte` (0 when outside `buf`).
pub fn get64(buf: &[u8], byte: usize) -> u64 {
    byte.checked_add(8)
        .and_then(|end| buf.get(byte..end))
        .map_or(0, |b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
}

/// `MLX5_SET64`: stores `v` big-endian at byte offset `byte` (ignored when outside `buf`).
pub fn set64(buf: &mut [u8], byte: usize, v: u64) {
    if let Some(b) = byte.checked_add(8).and_then(|end| buf.get_mut(byte..end)) {
        b.copy_from_slice(&v.to_be_bytes());
    }
}

/// Fields every `*_in` / `*_out` structure starts with (`core/cmd.c` `mlx5_cmd_*` helpers, §c.6).
pub mod hdr {
    use super::Field;
    pub const OPCODE: Field = Field::new(0x00, 16);
    pub const UID: Field = Field::new(0x10, 16);
    pub const OP_MOD: Field = Field::new(0x30, 16);
    pub const STATUS: Field = Field::new(0x00, 8);
    pub const SYNDROME: Field = Field::new(0x20, 32);
}

/// `struct mlx5_ifc_initial_seg_bits` (BAR0 offset 0) and `device.h` `struct mlx5_init_seg`.
pub mod initial_seg {
    use super::Field;
    pub const FW_REV_MINOR: Field = Field::new(0x00, 16);
    pub const FW_REV_MAJOR: Field = Field::new(0x10, 16);
    pub const CMD_INTERFACE_REV: Field = Field::new(0x20, 16);
    pub const FW_REV_SUBMINOR: Field = Field::new(0x30, 16);
    pub const CMDQ_PHY_ADDR_63_32: Field = Field::new(0x80, 32);
    pub const CMDQ_PHY_ADDR_31_12: Field = Field::new(0xa0, 20);
    pub const NIC_INTERFACE: Field = Field::new(0xb6, 2);
    pub const LOG_CMDQ_SIZE: Field = Field::new(0xb8, 4);
    pub const LOG_CMDQ_STRIDE: Field = Field::new(0xbc, 4);
    pub const COMMAND_DOORBELL_VECTOR: Field = Field::new(0xc0, 32);
    pub const INITIALIZING: Field = Field::new(0xfe0, 1);
    pub const NIC_INTERFACE_SUPPORTED: Field = Field::new(0xfe5, 3);
    pub const EMBEDDED_CPU: Field = Field::new(0xfe8, 1);
    /// Byte offset of `struct health_buffer`.
    pub const HEALTH_BUFFER: u64 = 0x200;
    pub const HEALTH_SYNDROME: Field = Field::new(0x8080, 8);
    pub const HEALTH_COUNTER: Field = Field::new(0x8088, 24);
    /// `device.h` `struct mlx5_init_seg`: `cmdq_addr_h`, `cmdq_addr_l_sz`, `cmd_dbell`, `initializing`,
    /// `cmd_exec_to`, `cmd_q_init_to`, `internal_timer_h/l`, `health_counter` (byte offsets).
    pub const BYTE_CMDQ_ADDR_H: u64 = 0x10;
    pub const BYTE_CMDQ_ADDR_L_SZ: u64 = 0x14;
    pub const BYTE_CMD_DBELL: u64 = 0x18;
    pub const BYTE_INITIALIZING: u64 = 0x1fc;
    pub const BYTE_CMD_EXEC_TO: u64 = 0xff8;
    pub const BYTE_CMD_Q_INIT_TO: u64 = 0xffc;
    pub const BYTE_INTERNAL_TIMER_H: u64 = 0x1000;
    pub const BYTE_INTERNAL_TIMER_L: u64 = 0x1004;
    pub const BYTE_HEALTH_COUNTER: u64 = 0x1010;
    /// Size of `mlx5_ifc_initial_seg_bits` (0x400c bytes: pages 0..=4 of BAR0 belong to it).
    pub const SIZE: u64 = 0x400c;
}

/// `struct mlx5_ifc_health_buffer_bits` (at `initial_seg::HEALTH_BUFFER`).
pub mod health_buffer {
    use super::Field;
    pub const TIME: Field = Field::new(0x160, 32);
    pub const FW_VERSION: Field = Field::new(0x180, 32);
    pub const HW_ID: Field = Field::new(0x1a0, 32);
    pub const RFR: Field = Field::new(0x1c0, 1);
    pub const SYND: Field = Field::new(0x1e8, 8);
    pub const SIZE: usize = 0x40;
}

/// `struct mlx5_ifc_cmd_queue_entry_bits` (64 bytes).
pub mod cmd_queue_entry {
    use super::Field;
    pub const TYPE: Field = Field::new(0x00, 8);
    pub const INPUT_LENGTH: Field = Field::new(0x20, 32);
    pub const INPUT_MAILBOX_POINTER_63_32: Field = Field::new(0x40, 32);
    pub const INPUT_MAILBOX_POINTER_31_9: Field = Field::new(0x60, 23);
    /// Byte offsets of the inline data and the pointers.
    pub const INPUT_MAILBOX_POINTER: usize = 0x08;
    pub const COMMAND_INPUT_INLINE_DATA: usize = 0x10;
    pub const COMMAND_OUTPUT_INLINE_DATA: usize = 0x20;
    pub const OUTPUT_MAILBOX_POINTER: usize = 0x30;
    pub const OUTPUT_MAILBOX_POINTER_63_32: Field = Field::new(0x180, 32);
    pub const OUTPUT_MAILBOX_POINTER_31_9: Field = Field::new(0x1a0, 23);
    pub const OUTPUT_LENGTH: Field = Field::new(0x1c0, 32);
    pub const TOKEN: Field = Field::new(0x1e0, 8);
    pub const SIGNATURE: Field = Field::new(0x1e8, 8);
    pub const STATUS: Field = Field::new(0x1f8, 7);
    pub const OWNERSHIP: Field = Field::new(0x1ff, 1);
    pub const INLINE_LEN: usize = 16;
    pub const SIZE: usize = 0x40;
    /// `MLX5_PCI_CMD_XPORT` (`device.h:175`).
    pub const TYPE_PCIE: u32 = 7;
}

/// `struct mlx5_ifc_cmd_if_box_bits` (576 bytes used of a 1 KiB-aligned block).
pub mod cmd_if_box {
    use super::Field;
    pub const MAILBOX_DATA_LEN: usize = 512;
    pub const NEXT_POINTER: usize = 0x230;
    pub const NEXT_POINTER_31_10: Field = Field::new(0x11a0, 22);
    pub const BLOCK_NUMBER: Field = Field::new(0x11c0, 32);
    pub const TOKEN: Field = Field::new(0x11e8, 8);
    pub const CTRL_SIGNATURE: Field = Field::new(0x11f0, 8);
    pub const SIGNATURE: Field = Field::new(0x11f8, 8);
    pub const SIZE: usize = 0x240;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_set_follow_mlx5_set_convention() {
        let mut b = [0u8; 16];
        // query_pages_out.num_pages: bit 0x60, width 0x20 → dword 3.
        set(&mut b, Field::new(0x60, 32), 0xdead_beef);
        assert_eq!(&b[12..16], &[0xde, 0xad, 0xbe, 0xef]);
        // create_mkey_out.mkey_index: bit 0x48 w 0x18 → dw 2 [23:0], byte 9..12.
        set(&mut b, Field::new(0x48, 24), 0x00ab_cdef);
        assert_eq!(&b[8..12], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(get(&b, Field::new(0x48, 24)), 0xab_cdef);
        // The neighbouring byte 8 ([31:24]) is untouched by a write to [23:0].
        set(&mut b, Field::new(0x40, 8), 0x5a);
        assert_eq!(get(&b, Field::new(0x48, 24)), 0xab_cdef);
        assert_eq!(b[8], 0x5a);
    }

    #[test]
    fn offsets_from_mlx5_layouts() {
        // initial_seg: initializing bit 0xfe0 = dw 127 [31], byte 0x1fc.
        let mut seg = vec![0u8; 0x2000];
        set(&mut seg, initial_seg::INITIALIZING, 1);
        assert_eq!(seg[0x1fc], 0x80);
        // log_cmdq_size dw 5 [7:4], log_cmdq_stride [3:0] → byte 0x17.
        set(&mut seg, initial_seg::LOG_CMDQ_SIZE, 5);
        set(&mut seg, initial_seg::LOG_CMDQ_STRIDE, 6);
        assert_eq!(seg[0x17], 0x56);
        // nic_interface dw 5 [9:8] → byte 0x16 bits 1:0.
        set(&mut seg, initial_seg::NIC_INTERFACE, 2);
        assert_eq!(seg[0x16], 0x02);
        // health_counter dw 1028 [23:0] (byte 0x1011), health_syndrome [31:24] (byte 0x1010).
        set(&mut seg, initial_seg::HEALTH_COUNTER, 0x01_0203);
        assert_eq!(&seg[0x1010..0x1014], &[0, 1, 2, 3]);
        // fw_rev_minor [31:16] and fw_rev_major [15:0] of dword 0.
        set(&mut seg, initial_seg::FW_REV_MINOR, 12);
        set(&mut seg, initial_seg::FW_REV_MAJOR, 14);
        assert_eq!(&seg[0..4], &[0, 12, 0, 14]);
        // embedded_cpu dw 127 [23] → byte 0x1fd bit 7.
        set(&mut seg, initial_seg::EMBEDDED_CPU, 1);
        assert_eq!(seg[0x1fd], 0x80);

        // cmd_queue_entry: status_own byte 0x3f: status [7:1], ownership [0].
        let mut e = [0u8; 64];
        set(&mut e, cmd_queue_entry::OWNERSHIP, 1);
        set(&mut e, cmd_queue_entry::STATUS, 0x3);
        assert_eq!(e[0x3f], 0x07);
        set(&mut e, cmd_queue_entry::TOKEN, 0xab);
        assert_eq!(e[0x3c], 0xab);
        set(&mut e, cmd_queue_entry::SIGNATURE, 0xcd);
        assert_eq!(e[0x3d], 0xcd);

        // cmd_if_box: block_number byte 0x238, token byte 0x23d, ctrl_signature 0x23e, signature 0x23f.
        let mut bx = vec![0u8; cmd_if_box::SIZE];
        set(&mut bx, cmd_if_box::BLOCK_NUMBER, 7);
        set(&mut bx, cmd_if_box::TOKEN, 0x11);
        set(&mut bx, cmd_if_box::CTRL_SIGNATURE, 0x22);
        set(&mut bx, cmd_if_box::SIGNATURE, 0x33);
        assert_eq!(&bx[0x238..0x240], &[0, 0, 0, 7, 0, 0x11, 0x22, 0x33]);

        // mkc inside create_mkey_in at byte 0x10: pd is bit 0x68 of mkc → absolute 0xe8, byte 0x1d.
        let mut m = vec![0u8; 0x110];
        set(&mut m, Field::new(0x68, 24).at(0x10), 0x12_3456);
        assert_eq!(&m[0x1d..0x20], &[0x12, 0x34, 0x56]);
        set64(&mut m, 0x20, 0x1122_3344_5566_7788);
        assert_eq!(get64(&m, 0x20), 0x1122_3344_5566_7788);
    }

    #[test]
    fn out_of_range_is_harmless() {
        let mut b = [0u8; 4];
        assert_eq!(get(&b, Field::new(0x20, 8)), 0);
        set(&mut b, Field::new(0x20, 8), 1);
        assert_eq!(b, [0; 4]);
        assert_eq!(get64(&b, usize::MAX - 2), 0);
        set64(&mut b, 0, 1);
        assert_eq!(b, [0; 4]);
        // A field crossing a dword boundary is refused rather than half-written.
        assert_eq!(get(&[0xff; 8], Field::new(0x1c, 8)), 0);
    }
}
