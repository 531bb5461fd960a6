//! Big-endian bit fields as `mlx5_ifc.h` lays them out: a field is named by its bit offset from the start of
//! its structure (bit 0 = the most significant bit of byte 0) and its width, exactly the numbers
//! `offsetof` gives over the header (docs/reference/mlx5.md §0). `set` / `get` are `MLX5_SET` / `MLX5_GET` for fields
//! of up to 32 bits that do not cross a dword; 64-bit fields and byte arrays have their own helpers.

/// Writes `value` into the `width`-bit field at `bit_off` (`MLX5_SET`). The field must lie inside one
/// big-endian dword; bits of `value` above `width` are dropped, as `MLX5_SET` masks them.
pub fn set(buf: &mut [u8], bit_off: usize, width: usize, value: u32) {
    assert!((1..=32).contains(&width), "field width {width}");
    let dw = bit_off / 32;
    let first = bit_off % 32;
    assert!(first + width <= 32, "field at bit {bit_off:#x} width {width} crosses a dword");
    let shift = 32 - first - width;
    let mask: u32 = if width == 32 { u32::MAX } else { ((1u32 << width) - 1) << shift };
    let at = dw * 4;
    let old = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    let new = (old & !mask) | ((value << shift) & mask);
    buf[at..at + 4].copy_from_slice(&new.to_be_bytes());
}

/// Reads the `width`-bit field at `bit_off` (`MLX5_GET`).
pub fn get(buf: &[u8], bit_off: usize, width: usize) -> u32 {
    assert!((1..=32).contains(&width), "field width {width}");
    let dw = bit_off / 32;
    let first = bit_off % 32;
    assert!(first + width <= 32, "field at bit {bit_off:#x} width {width} crosses a dword");
    let shift = 32 - first - width;
    let at = dw * 4;
    let v = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    if width == 32 { v } else { (v >> shift) & ((1u32 << width) - 1) }
}

/// A 64-bit big-endian field at byte `at` (`MLX5_SET64`; such fields are 8-byte aligned in mlx5_ifc.h).
pub fn set64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_be_bytes());
}

pub fn get64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_be_bytes(b)
}

/// A big-endian dword at byte `at`.
pub fn set32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

pub fn get32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_follow_mlx5_set() {
        let mut b = [0u8; 8];
        // initial_seg.log_cmdq_size: bit 0xb8 width 4 → dword 5 bits 7:4 (here in a short buffer: bit 0x18).
        set(&mut b, 0x18, 4, 5);
        set(&mut b, 0x1c, 4, 6);
        assert_eq!(b[3], 0x56);
        assert_eq!(get(&b, 0x18, 4), 5);
        set(&mut b, 0x20, 32, 0xdead_beef);
        assert_eq!(get32(&b, 4), 0xdead_beef);
        set(&mut b, 0x20, 16, 0x1_2345); // masked to 16 bits, as MLX5_SET does
        assert_eq!(get32(&b, 4), 0x2345_beef);
        set(&mut b, 0, 1, 1);
        assert_eq!(b[0], 0x80);
    }

    #[test]
    #[should_panic(expected = "crosses a dword")]
    fn a_field_crossing_a_dword_is_a_bug() {
        set(&mut [0u8; 8], 30, 4, 1);
    }
}
