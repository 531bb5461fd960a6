//! Big-endian fields as `mlx5_ifc.h` lays them out (docs/reference/mlx5.md §0): a field is named by its bit
//! offset from the start of its structure (bit 0 = the most significant bit of byte 0) and its width, exactly
//! the numbers `offsetof` gives over the header. Each field is declared once, as a `const`, next to the
//! builders of its structure in `ifc/`; the accessors take the field, so a call cannot name a width of its
//! own.
//!
//! Three kinds, as `MLX5_SET` / `MLX5_SET64` / `MLX5_ADDR_OF` distinguish them:
//! - [`Field`]: up to 32 bits inside one big-endian dword (`MLX5_SET`, `MLX5_GET`);
//! - [`Field64`]: a 64-bit field on a 64-bit boundary (`MLX5_SET64`, `MLX5_GET64`);
//! - [`ByteArray`]: a byte-aligned run of bytes (a GID, a MAC, a capability block, a flexible `[0][..]` tail).
//!
//! Their constructors are `const fn`s that check the layout rule (a [`Field`] does not cross a dword, a
//! [`Field64`] is 64-bit aligned, a [`ByteArray`] starts on a byte); a field declared as a `const` that breaks
//! the rule does not compile. A structure nested inside another is declared at its own offsets and moved with
//! [`Field::at`] (`qpc::PD.at(QPC)`), so each number can be checked against the layout dump.

/// A field of 1 to 32 bits that lies inside one big-endian dword.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    bit: usize,
    width: usize,
}

impl Field {
    /// The `width`-bit field at bit `bit` of its structure. Evaluated in a `const`, a field wider than 32 bits,
    /// of width 0 or crossing a dword fails to compile.
    pub const fn new(bit: usize, width: usize) -> Field {
        assert!(width >= 1 && width <= 32, "a Field is 1 to 32 bits wide (use Field64 or ByteArray)");
        assert!(bit % 32 + width <= 32, "a Field must not cross a dword");
        Field { bit, width }
    }

    /// The same field inside a structure that sits at bit `base` of an outer one.
    pub const fn at(self, base: usize) -> Field {
        Field::new(base + self.bit, self.width)
    }

    pub const fn bit(self) -> usize {
        self.bit
    }

    pub const fn width(self) -> usize {
        self.width
    }

    /// The largest value the field holds.
    pub const fn max(self) -> u32 {
        if self.width == 32 { u32::MAX } else { (1u32 << self.width) - 1 }
    }

    /// Byte offset of the dword holding the field.
    const fn dword_byte(self) -> usize {
        self.bit / 32 * 4
    }

    const fn shift(self) -> usize {
        32 - self.bit % 32 - self.width
    }

    /// Writes `value` into the field of `buf` (`MLX5_SET`); bits of `value` above the width are dropped, as
    /// `MLX5_SET` masks them. `buf` must hold the field's dword (a builder sizes its buffer from the
    /// structure, so a field outside it is a bug in the builder).
    pub fn write(self, buf: &mut [u8], value: u32) {
        let at = self.dword_byte();
        let mask = self.max() << self.shift();
        let old = u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let new = (old & !mask) | ((value << self.shift()) & mask);
        buf[at..at + 4].copy_from_slice(&new.to_be_bytes());
    }

    /// Reads the field of `buf` (`MLX5_GET`); a field past the end of `buf` reads 0 (a device that returned
    /// a shorter structure than the driver knows did not set it).
    pub fn read(self, buf: &[u8]) -> u32 {
        let at = self.dword_byte();
        match buf.get(at..at + 4) {
            Some(d) => (u32::from_be_bytes([d[0], d[1], d[2], d[3]]) >> self.shift()) & self.max(),
            None => 0,
        }
    }
}

/// A 64-bit big-endian field on a 64-bit boundary (`MLX5_SET64` requires both), or one entry of a flexible
/// array of them (`cmd_pas`, MTT lists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field64 {
    bit: usize,
}

impl Field64 {
    /// The 64-bit field at bit `bit`; in a `const`, a bit offset not a multiple of 64 fails to compile.
    pub const fn new(bit: usize) -> Field64 {
        assert!(bit.is_multiple_of(64), "a Field64 must be 64-bit aligned");
        Field64 { bit }
    }

    pub const fn at(self, base: usize) -> Field64 {
        Field64::new(base + self.bit)
    }

    /// Entry `i` of the array of 64-bit entries that starts at this field.
    pub const fn nth(self, i: usize) -> Field64 {
        Field64 { bit: self.bit + 64 * i }
    }

    pub const fn bit(self) -> usize {
        self.bit
    }

    /// Byte offset of the field.
    pub const fn byte(self) -> usize {
        self.bit / 8
    }

    /// Writes `value` (`buf` must hold the field, as for [`Field::write`]).
    pub fn write(self, buf: &mut [u8], value: u64) {
        let at = self.byte();
        buf[at..at + 8].copy_from_slice(&value.to_be_bytes());
    }

    /// Reads the field; past the end of `buf` it reads 0.
    pub fn read(self, buf: &[u8]) -> u64 {
        let at = self.byte();
        match buf.get(at..at + 8) {
            Some(d) => {
                let mut b = [0u8; 8];
                b.copy_from_slice(d);
                u64::from_be_bytes(b)
            }
            None => 0,
        }
    }
}

/// A byte-aligned array of `len` bytes (`u8 gid[0x80]`, `u8 mac[0x30]`, a nested block copied whole), or a
/// flexible tail ([`ByteArray::tail`]) whose length the command decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteArray {
    byte: usize,
    len: usize,
}

impl ByteArray {
    /// `len` bytes from bit `bit`; in a `const`, a bit offset not on a byte fails to compile.
    pub const fn new(bit: usize, len: usize) -> ByteArray {
        assert!(bit.is_multiple_of(8), "a ByteArray must start on a byte");
        ByteArray { byte: bit / 8, len }
    }

    /// A flexible array (`u8 x[0][..]`) from bit `bit` to the end of the structure.
    pub const fn tail(bit: usize) -> ByteArray {
        assert!(bit.is_multiple_of(8), "a ByteArray must start on a byte");
        ByteArray { byte: bit / 8, len: usize::MAX }
    }

    pub const fn at(self, base: usize) -> ByteArray {
        assert!(base.is_multiple_of(8), "a ByteArray must start on a byte");
        ByteArray { byte: self.byte + base / 8, len: self.len }
    }

    /// Entry `i` of an array of such entries laid end to end (`mac_address_layout[]`).
    pub const fn nth(self, i: usize) -> ByteArray {
        ByteArray { byte: self.byte + self.len * i, len: self.len }
    }

    /// The same start, `len` bytes long (a field known to hold less than its declared room).
    pub const fn sub(self, skip: usize, len: usize) -> ByteArray {
        ByteArray { byte: self.byte + skip, len }
    }

    pub const fn byte(self) -> usize {
        self.byte
    }

    /// The declared length in bytes (`usize::MAX` for a tail).
    pub const fn size(self) -> usize {
        self.len
    }

    /// Copies `bytes` to the start of the array. More bytes than the array holds is a bug in the builder.
    pub fn write(self, buf: &mut [u8], bytes: &[u8]) {
        assert!(bytes.len() <= self.len, "{} bytes into a {}-byte array", bytes.len(), self.len);
        buf[self.byte..self.byte + bytes.len()].copy_from_slice(bytes);
    }

    /// The array's bytes in `buf`, shorter when `buf` ends first (empty past its end).
    pub fn read(self, buf: &[u8]) -> &[u8] {
        let start = self.byte.min(buf.len());
        let end = self.byte.saturating_add(self.len).min(buf.len());
        &buf[start..end]
    }

    /// The array's bytes as a fixed array, zero-filled where `buf` ends first (a GID, a MAC).
    pub fn read_array<const N: usize>(self, buf: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        let s = ByteArray { byte: self.byte, len: self.len.min(N) }.read(buf);
        a[..s.len()].copy_from_slice(s);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    #[test]
    fn fields_follow_mlx5_set() {
        let mut b = [0u8; 8];
        // initial_seg.log_cmdq_size: bit 0xb8 width 4 → dword 5 bits 7:4 (here in a short buffer: bit 0x18).
        const A: Field = Field::new(0x18, 4);
        const B: Field = Field::new(0x1c, 4);
        A.write(&mut b, 5);
        B.write(&mut b, 6);
        assert_eq!(b[3], 0x56);
        assert_eq!(A.read(&b), 5);
        const W: Field = Field::new(0x20, 32);
        W.write(&mut b, 0xdead_beef);
        assert_eq!(be32(&b, 4), 0xdead_beef);
        assert_eq!(W.read(&b), 0xdead_beef);
        const H: Field = Field::new(0x20, 16);
        H.write(&mut b, 0x1_2345); // masked to 16 bits, as MLX5_SET does
        assert_eq!(be32(&b, 4), 0x2345_beef);
        const TOP: Field = Field::new(0, 1);
        TOP.write(&mut b, 1);
        assert_eq!(b[0], 0x80);
        assert_eq!((H.max(), W.max(), TOP.max()), (0xffff, u32::MAX, 1));
    }

    #[test]
    fn nesting_adds_offsets_and_reads_past_the_end_are_zero() {
        const INNER: Field = Field::new(0x28, 24);
        const OUTER: Field = INNER.at(0xc0);
        assert_eq!((OUTER.bit(), OUTER.width()), (0xe8, 24));
        let mut b = [0u8; 0x20];
        OUTER.write(&mut b, 0xab_cdef);
        assert_eq!(be32(&b, 0x1c), 0xab_cdef);
        assert_eq!(OUTER.read(&b[..0x1c]), 0, "the dword is not in the buffer");
        const D: Field64 = Field64::new(0x40);
        D.write(&mut b, 0x0102_0304_0506_0708);
        assert_eq!((D.read(&b), D.nth(1).byte(), D.at(0x80).byte()), (0x0102_0304_0506_0708, 0x10, 0x18));
        assert_eq!(D.nth(3).read(&b), 0, "past the end");
    }

    #[test]
    fn byte_arrays_copy_and_clamp() {
        const GID: ByteArray = ByteArray::new(0x20, 4);
        let mut b = [0u8; 10];
        GID.write(&mut b, &[1, 2, 3]);
        assert_eq!(&b[4..8], &[1, 2, 3, 0]);
        assert_eq!(GID.read(&b), &[1, 2, 3, 0]);
        assert_eq!(GID.read(&b[..6]), &[1, 2]);
        assert_eq!(GID.read_array::<4>(&b[..6]), [1, 2, 0, 0]);
        assert_eq!(GID.nth(1).read(&b), &[0, 0], "the second entry runs past the end");
        assert_eq!(ByteArray::tail(0x40).read(&b), &[0, 0]);
        assert_eq!(ByteArray::tail(0x80).read(&b), &[] as &[u8]);
        assert_eq!(GID.sub(2, 2).read(&b), &[3, 0]);
    }

    #[test]
    #[should_panic(expected = "bytes into a")]
    fn too_many_bytes_for_an_array_is_a_bug() {
        ByteArray::new(0, 2).write(&mut [0u8; 8], &[1, 2, 3]);
    }

    /// The layout rules hold at run time too (the same `assert!`s a `const` declaration trips at compile time).
    #[test]
    fn layout_rules() {
        let crossing = std::panic::catch_unwind(|| Field::new(30, 4));
        assert!(crossing.is_err(), "crosses a dword");
        assert!(std::panic::catch_unwind(|| Field::new(0, 33)).is_err(), "wider than a dword");
        assert!(std::panic::catch_unwind(|| Field::new(0, 0)).is_err(), "no width");
        assert!(std::panic::catch_unwind(|| Field64::new(0x20)).is_err(), "not 64-bit aligned");
        assert!(std::panic::catch_unwind(|| ByteArray::new(0x21, 1)).is_err(), "not on a byte");
        assert!(std::panic::catch_unwind(|| Field::new(0x1f, 1)).is_ok());
    }
}
