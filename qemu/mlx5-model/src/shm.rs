//! The model's side of QEMU's shared memory (docs/reference/platform.md, "Shared memory between QEMU and the model"):
//! the BAR file (QEMU `ivshmem-plain` BAR2, which plays the CX-5's BAR0) and the guest-RAM file
//! (`memory-backend-file,share=on`), each mapped with `memmap2::MmapRaw` and served as a [`Memory`].
//!
//! The guest reads and writes both files while the model does, so no Rust reference (`&[u8]`) into a mapping
//! is ever formed: every access is a volatile copy through raw pointers, in naturally aligned pieces of up to
//! 8 bytes, so an aligned 4- or 8-byte register or doorbell is one load or store (x86 makes those atomic,
//! and both sides are x86-TSO).
//!
//! Device address = guest physical address. QEMU's q35 machine puts the first `below_4g_mem_size` bytes of the
//! RAM file at guest physical 0 and the rest at 4 GiB, above the PCI hole ([`GuestRam`], [`q35_below_4g`]);
//! an address in the hole is no RAM and every access to it is refused.
//!
//! The BAR's last 4 KiB page carries the model's signature ([`SIGNATURE`], see [`write_signature`]) so a
//! driver can tell an ivshmem function backed by this model from any other ivshmem, without touching the
//! CX-5 layout (initialization segment at 0, UAR pages at 4 KiB steps).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{Ordering, compiler_fence};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use crate::mem::{Memory, OutOfRange, check};

// The signature's layout has one owner, `mlx5-signature`. It sits in the BAR's last 4 KiB page, which is the
// last UAR page of the CX-5 layout and so is never handed to the driver (ALLOC_UAR must not return it).
pub use mlx5_signature::{SIGNATURE, SIGNATURE_LEN, SIGNATURE_OFFSET_FROM_END, SIGNATURE_VERSION};
/// The default BAR size: 32 MiB, the size of a ConnectX-5's BAR0 (and what `cargo xtask run` gives QEMU).
pub const DEFAULT_BAR_BYTES: u64 = 32 << 20;
/// The smallest BAR the model accepts: the initialization segment's page, one UAR page, the signature page.
pub const MIN_BAR_BYTES: u64 = 3 * 0x1000;
/// Where RAM above the PCI hole starts (guest physical).
pub const FOUR_GIB: u64 = 4 << 30;
/// How long [`SharedFile::open`] waits by default for QEMU (or the runner) to create and size a file.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Where the signature lives in a BAR of `bar_size` bytes.
pub fn signature_offset(bar_size: u64) -> u64 {
    bar_size - SIGNATURE_OFFSET_FROM_END
}

/// Writes the signature into the BAR's last page, naming the PCI device the model plays (`vf`: a ConnectX-5
/// VF, else the PF). The rest of that page is cleared.
pub fn write_signature(bar: &dyn Memory, vf: bool) -> Result<(), OutOfRange> {
    let size = bar.size();
    if size < MIN_BAR_BYTES {
        return Err(OutOfRange { addr: 0, len: MIN_BAR_BYTES as usize, size });
    }
    let at = signature_offset(size);
    bar.write(at, &[0u8; SIGNATURE_OFFSET_FROM_END as usize])?;
    let device = if vf { mlx5_signature::PLAYS_VF_DEVICE } else { mlx5_signature::PLAYS_DEVICE };
    bar.write(at, &mlx5_signature::bytes(size, device))
}

/// Reads the signature back: `Some(bar_size)` when `bar` carries a valid one (the driver's check, for tests).
pub fn read_signature(bar: &dyn Memory) -> Option<u64> {
    let size = bar.size();
    if size < MIN_BAR_BYTES {
        return None;
    }
    let mut b = [0u8; SIGNATURE_LEN];
    bar.read(signature_offset(size), &mut b).ok()?;
    mlx5_signature::matches(&b, size).then_some(size)
}

/// Why a shared file could not be used.
#[derive(Debug)]
pub enum ShmError {
    /// The file did not appear, or did not reach the expected size, before the deadline.
    NotReady {
        path: PathBuf,
        waited: Duration,
        size: Option<u64>,
        want: Option<u64>,
    },
    /// The file has the wrong size.
    BadSize {
        path: PathBuf,
        size: u64,
        reason: String,
    },
    Io {
        path: PathBuf,
        what: &'static str,
        err: std::io::Error,
    },
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::NotReady { path, waited, size, want } => {
                write!(f, "{}: not ready after {:.1} s (", path.display(), waited.as_secs_f64())?;
                match size {
                    None => write!(f, "the file does not exist")?,
                    Some(s) => write!(f, "size {s:#x}")?,
                }
                match want {
                    Some(w) => write!(f, ", waiting for size {w:#x}")?,
                    None => write!(f, ", waiting for a non-zero size")?,
                }
                write!(f, "); is QEMU running with this mem-path?")
            }
            ShmError::BadSize { path, size, reason } => write!(f, "{}: size {size:#x}: {reason}", path.display()),
            ShmError::Io { path, what, err } => write!(f, "{}: {what}: {err}", path.display()),
        }
    }
}

impl std::error::Error for ShmError {}

/// One shared file mapped read-write and shared (`MAP_SHARED`), served as [`Memory`].
pub struct SharedFile {
    map: MmapRaw,
    size: u64,
    path: PathBuf,
    /// `(st_dev, st_ino)` at open time: the file is "gone" once the path names something else or nothing.
    identity: (u64, u64),
    _file: File,
}

impl fmt::Debug for SharedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedFile").field("path", &self.path).field("size", &self.size).finish()
    }
}

impl SharedFile {
    /// Waits until `path` exists with a non-zero size (exactly `want` when given), at most `wait`, then maps
    /// it. QEMU creates the file and sizes it with `ftruncate` when it starts; the runner may have created
    /// and sized it already.
    pub fn open(path: &Path, want: Option<u64>, wait: Duration) -> Result<SharedFile, ShmError> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let size = std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len());
            match (size, want) {
                (Some(s), Some(w)) if s == w => break,
                (Some(s), None) if s > 0 => break,
                _ => {}
            }
            let waited = start.elapsed();
            if waited >= wait {
                return Err(ShmError::NotReady { path: path.to_path_buf(), waited, size, want });
            }
            std::thread::sleep(pause.min(wait - waited));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        let io = |what, err| ShmError::Io { path: path.to_path_buf(), what, err };
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io("open", e))?;
        let meta = file.metadata().map_err(|e| io("stat", e))?;
        let size = meta.len();
        if want.is_some_and(|w| w != size) || size == 0 {
            return Err(ShmError::BadSize { path: path.to_path_buf(), size, reason: "changed while opening".into() });
        }
        let len = usize::try_from(size).map_err(|_| ShmError::BadSize {
            path: path.to_path_buf(),
            size,
            reason: "larger than the address space".into(),
        })?;
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(|e| io("mmap", e))?;
        Ok(SharedFile { map, size, path: path.to_path_buf(), identity: (meta.dev(), meta.ino()), _file: file })
    }

    /// Opens the BAR file: a power of two of at least [`MIN_BAR_BYTES`] (a PCI BAR's size always is).
    pub fn open_bar(path: &Path, want: Option<u64>, wait: Duration) -> Result<SharedFile, ShmError> {
        let f = SharedFile::open(path, want, wait)?;
        if !f.size.is_power_of_two() || f.size < MIN_BAR_BYTES {
            return Err(ShmError::BadSize {
                path: f.path.clone(),
                size: f.size,
                reason: format!("a BAR must be a power of two of at least {MIN_BAR_BYTES:#x} bytes"),
            });
        }
        Ok(f)
    }

    /// Opens the guest-RAM file as q35 lays it out in guest physical memory ([`GuestRam`]).
    pub fn open_ram(path: &Path, want: Option<u64>, wait: Duration) -> Result<GuestRam, ShmError> {
        SharedFile::open(path, want, wait).map(GuestRam::q35)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the file that was mapped (the runner deletes the files after QEMU).
    pub fn still_present(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity)
    }
}

impl Memory for SharedFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        let at = check(addr, buf.len(), self.size)?;
        // SAFETY: `check` proved `at + buf.len() <= size`, the mapping's length, so the pointer stays inside the
        // mapping, which lives as long as `self`.
        let src = unsafe { self.map.as_ptr().add(at) };
        // SAFETY: `src` is valid for `buf.len()` bytes (above); `buf` is a distinct, exclusively borrowed buffer.
        unsafe { volatile_copy(src, buf.as_mut_ptr(), buf.len(), Dir::FromShared) };
        compiler_fence(Ordering::Acquire);
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        let at = check(addr, data.len(), self.size)?;
        compiler_fence(Ordering::Release);
        // SAFETY: as in `read`: in bounds of the live mapping, which is mapped writable.
        let dst = unsafe { self.map.as_mut_ptr().add(at) };
        // SAFETY: `dst` is valid for `data.len()` bytes; `data` cannot overlap the mapping's shared bytes as a
        // Rust reference, because no reference into the mapping is ever handed out.
        unsafe { volatile_copy(data.as_ptr(), dst, data.len(), Dir::ToShared) };
        Ok(())
    }
}

/// `below_4g_mem_size` of QEMU 7.2's q35 machine for `ram` bytes of RAM (`pc_q35_init`): with 2.75 GiB
/// (0xB000_0000) or more, 2 GiB sit below the PCI hole and the rest at 4 GiB; with less, all of it sits below.
pub fn q35_below_4g(ram: u64) -> u64 {
    if ram >= 0xb000_0000 { 0x8000_0000 } else { ram }
}

/// Guest RAM in a `memory-backend-file` as q35 maps it: file offsets `[0, below)` at guest physical
/// `[0, below)`, the rest of the file from guest physical 4 GiB. [`Memory`] addresses are guest physical;
/// an access that touches the hole between `below` and 4 GiB, or runs past the end, is refused.
#[derive(Debug)]
pub struct GuestRam {
    file: SharedFile,
    below: u64,
}

impl GuestRam {
    /// The file with q35's split ([`q35_below_4g`]).
    pub fn q35(file: SharedFile) -> GuestRam {
        let below = q35_below_4g(file.size);
        GuestRam { file, below }
    }

    /// The file with the first `below` bytes under the hole (at most the file's size).
    pub fn with_split(file: SharedFile, below: u64) -> GuestRam {
        let below = below.min(file.size);
        GuestRam { file, below }
    }

    pub fn file(&self) -> &SharedFile {
        &self.file
    }

    /// The file's size: the guest's RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.file.size
    }

    /// RAM below the PCI hole (`below_4g_mem_size`); the rest is at 4 GiB.
    pub fn below_4g(&self) -> u64 {
        self.below
    }

    /// The file offset of guest physical `[addr, addr + len)`, which must lie in one of the two parts.
    fn offset(&self, addr: u64, len: usize) -> Result<u64, OutOfRange> {
        let size = self.size();
        let refuse = OutOfRange { addr, len, size };
        let end = addr.checked_add(len as u64).ok_or(refuse)?;
        if end <= self.below {
            Ok(addr)
        } else if addr >= FOUR_GIB && end <= size {
            Ok(addr - FOUR_GIB + self.below)
        } else {
            Err(refuse)
        }
    }
}

impl Memory for GuestRam {
    /// The end of guest physical RAM: 4 GiB plus the RAM above the hole when there is any.
    fn size(&self) -> u64 {
        if self.below == self.file.size { self.below } else { FOUR_GIB + (self.file.size - self.below) }
    }

    fn holds(&self, addr: u64, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| self.offset(addr, len).is_ok())
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        let at = self.offset(addr, buf.len())?;
        self.file.read(at, buf)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        let at = self.offset(addr, data.len())?;
        self.file.write(at, data)
    }
}

/// Which side of a copy is the shared mapping (it gets the volatile, naturally aligned accesses).
#[derive(Clone, Copy)]
enum Dir {
    FromShared,
    ToShared,
}

/// Copies `len` bytes in naturally aligned pieces of 8, 4, 2 or 1 bytes (alignment judged on the shared
/// side), each a single volatile access on the shared side.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the two ranges must not overlap.
#[allow(clippy::disallowed_methods, reason = "the model's one accessor of the shared files")]
unsafe fn volatile_copy(src: *const u8, dst: *mut u8, len: usize, dir: Dir) {
    let mut i = 0;
    while i < len {
        let shared = match dir {
            Dir::FromShared => src as usize + i,
            Dir::ToShared => dst as usize + i,
        };
        let rest = len - i;
        let n = if shared % 8 == 0 && rest >= 8 {
            8
        } else if shared % 4 == 0 && rest >= 4 {
            4
        } else if shared % 2 == 0 && rest >= 2 {
            2
        } else {
            1
        };
        // SAFETY: `i + n <= len`, so both pointers stay in the ranges the caller vouched for; the shared side is
        // aligned for the access size (checked above); the private side is accessed unaligned.
        unsafe {
            let (s, d) = (src.add(i), dst.add(i));
            match (dir, n) {
                (Dir::FromShared, 8) => ptr::write_unaligned(d.cast::<u64>(), ptr::read_volatile(s.cast::<u64>())),
                (Dir::FromShared, 4) => ptr::write_unaligned(d.cast::<u32>(), ptr::read_volatile(s.cast::<u32>())),
                (Dir::FromShared, 2) => ptr::write_unaligned(d.cast::<u16>(), ptr::read_volatile(s.cast::<u16>())),
                (Dir::FromShared, _) => d.write(ptr::read_volatile(s)),
                (Dir::ToShared, 8) => ptr::write_volatile(d.cast::<u64>(), ptr::read_unaligned(s.cast::<u64>())),
                (Dir::ToShared, 4) => ptr::write_volatile(d.cast::<u32>(), ptr::read_unaligned(s.cast::<u32>())),
                (Dir::ToShared, 2) => ptr::write_volatile(d.cast::<u16>(), ptr::read_unaligned(s.cast::<u16>())),
                (Dir::ToShared, _) => ptr::write_volatile(d, s.read()),
            }
        }
        i += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;
    use std::sync::atomic::AtomicU32;

    fn temp(name: &str, size: Option<u64>) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("mlx5-model-shm-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        if let Some(s) = size {
            File::create(&p).unwrap().set_len(s).unwrap();
        }
        p
    }

    #[test]
    fn reads_and_writes_reach_the_file_and_other_mappings() {
        let p = temp("rw", Some(0x4000));
        let a = SharedFile::open(&p, Some(0x4000), Duration::ZERO).unwrap();
        let b = SharedFile::open(&p, None, Duration::ZERO).unwrap();
        a.write_be32(0x10, 0xdead_beef).unwrap();
        a.write(0x23, b"unaligned bytes across words").unwrap();
        assert_eq!(b.read_be32(0x10).unwrap(), 0xdead_beef);
        let mut buf = [0u8; 28];
        b.read(0x23, &mut buf).unwrap();
        assert_eq!(&buf, b"unaligned bytes across words");
        b.write_be64(0x3ff8, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(a.read_be64(0x3ff8).unwrap(), 0x0102_0304_0506_0708);
        let on_disk = std::fs::read(&p).unwrap();
        assert_eq!(&on_disk[0x10..0x14], &[0xde, 0xad, 0xbe, 0xef]);
        assert!(a.write_be32(0x3ffd, 1).is_err());
        assert!(a.read(u64::MAX, &mut [0]).is_err());
        assert!(a.still_present());
        std::fs::remove_file(&p).unwrap();
        assert!(!a.still_present());
    }

    #[test]
    fn waits_for_the_file_to_appear_and_be_sized() {
        let p = temp("wait", None);
        let q = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let f = File::create(&q).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            f.set_len(0x8000).unwrap();
        });
        let f = SharedFile::open_bar(&p, Some(0x8000), Duration::from_secs(10)).unwrap();
        assert_eq!(f.size(), 0x8000);
        t.join().unwrap();
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn clear_errors_for_missing_and_bad_files() {
        let p = temp("missing", None);
        let e = SharedFile::open(&p, None, Duration::from_millis(20)).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let p = temp("odd", Some(0x5000));
        let e = SharedFile::open_bar(&p, None, Duration::ZERO).unwrap_err().to_string();
        assert!(e.contains("power of two"), "{e}");
        let e = SharedFile::open(&p, Some(0x4000), Duration::from_millis(20)).unwrap_err().to_string();
        assert!(e.contains("waiting for size 0x4000"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn q35_puts_ram_past_2_75_gib_partly_above_the_hole() {
        assert_eq!(q35_below_4g(2 << 30), 2 << 30);
        assert_eq!(q35_below_4g(0xafff_f000), 0xafff_f000);
        assert_eq!(q35_below_4g(0xb000_0000), 0x8000_0000);
        assert_eq!(q35_below_4g(6 << 30), 0x8000_0000);
    }

    #[test]
    fn guest_ram_translates_above_4_gib_and_refuses_the_hole() {
        // A sparse 6 GiB file: 2 GiB below the hole, 4 GiB at guest physical 4 GiB.
        let p = temp("split", Some(6 << 30));
        let ram = SharedFile::open_ram(&p, None, Duration::ZERO).unwrap();
        assert_eq!((ram.ram_bytes(), ram.below_4g(), ram.size()), (6 << 30, 2 << 30, 8 << 30));
        let file = SharedFile::open(&p, None, Duration::ZERO).unwrap();
        ram.write_be32(0x1000, 0x1111_1111).unwrap();
        ram.write_be32(FOUR_GIB, 0x2222_2222).unwrap();
        ram.write_be32((8 << 30) - 4, 0x3333_3333).unwrap();
        assert_eq!(file.read_be32(0x1000).unwrap(), 0x1111_1111);
        assert_eq!(file.read_be32(2 << 30).unwrap(), 0x2222_2222, "4 GiB continues the file at below_4g");
        assert_eq!(file.read_be32((6 << 30) - 4).unwrap(), 0x3333_3333);
        assert_eq!(ram.read_be32(FOUR_GIB).unwrap(), 0x2222_2222);
        // The hole, an access straddling its edges, and past the end are refused.
        for (addr, len) in [(2 << 30, 4), ((2 << 30) - 2, 4), (3 << 30, 1), (FOUR_GIB - 2, 4), (8 << 30, 1)] {
            assert!(ram.read(addr, &mut vec![0; len]).is_err(), "{addr:#x}+{len}");
            assert!(ram.write(addr, &vec![0; len]).is_err(), "{addr:#x}+{len}");
            // Commands check their addresses with `holds` (MTT pages, queue pages, doorbell records).
            assert!(!ram.holds(addr, len as u64), "{addr:#x}+{len}");
        }
        assert!(ram.holds(0, 2 << 30) && ram.holds(FOUR_GIB, 4 << 30) && !ram.holds((2 << 30) - 4096, 8192));
        // RAM below 2.75 GiB is all below the hole: guest physical = file offset.
        let q = temp("flat", Some(0x4000));
        let flat = SharedFile::open_ram(&q, None, Duration::ZERO).unwrap();
        assert_eq!((flat.size(), flat.below_4g()), (0x4000, 0x4000));
        assert!(flat.read(0x3ffc, &mut [0; 4]).is_ok() && flat.read(0x3ffd, &mut [0; 4]).is_err());
        std::fs::remove_file(&p).unwrap();
        std::fs::remove_file(&q).unwrap();
    }

    #[test]
    fn signature_sits_in_the_last_page() {
        let bar = VecMemory::new(0x10000);
        assert_eq!(read_signature(&bar), None);
        bar.write(0xf000, &[0xff; 0x1000]).unwrap();
        write_signature(&bar, false).unwrap();
        assert_eq!(read_signature(&bar), Some(0x10000));
        let mut b = [0u8; SIGNATURE_LEN];
        bar.read(0x10000 - SIGNATURE_OFFSET_FROM_END, &mut b).unwrap();
        assert_eq!(&b[..8], b"MLX5MODL");
        assert_eq!(&b[8..12], &[0, 0, 0, 2]);
        assert_eq!(&b[12..14], &[0x10, 0x17], "plays a ConnectX-5 PF");
        assert_eq!(&b[16..], &0x10000u64.to_be_bytes());
        // The rest of the page is cleared; the initialization segment (offset 0) is untouched.
        assert_eq!(bar.read_be32(0xfffc).unwrap(), 0);
        assert_eq!(bar.read_be32(0).unwrap(), 0);
        assert!(write_signature(&VecMemory::new(0x1000), false).is_err());
        write_signature(&bar, true).unwrap();
        bar.read(0x10000 - SIGNATURE_OFFSET_FROM_END, &mut b).unwrap();
        assert_eq!(&b[12..14], &[0x10, 0x18], "--vf plays a ConnectX-5 VF");
        assert_eq!(read_signature(&bar), Some(0x10000));
    }
}
