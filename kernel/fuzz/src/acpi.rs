//! The ACPI check shared by the fuzz target `acpi` (`fuzz_targets/acpi.rs`, libFuzzer, nightly) and its stable
//! twin (`kernel/tests/fuzz_twins.rs`); both include this file (and `mem.rs`) by path.
//!
//! The firmware's tables decide how many processors the kernel starts and where it looks for PCI devices. One
//! input: byte 0's bit 0 asks for the checksums to be repaired ([`repair`]) so the fuzzer gets past them; the
//! rest is physical memory at [`BASE`] (the BIOS area the legacy search scans), where the RSDP starts, and
//! where its root table and the tables it lists must lie to be reached. Checked, for `acpi::parse` and
//! `acpi::find_rsdp_legacy`:
//! - no panic, whatever the bytes, and an error that prints;
//! - an accepted set of tables has RSDT or XSDT as its root, at most `MAX_CPUS` processors with distinct APIC
//!   ids and the usable ones first, ECAM windows whose bus ranges are not reversed, at most `MAX_ECAM`;
//! - the legacy search returns a 16-byte aligned address in the area, and the RSDP at [`BASE`] when the
//!   tables there parse.

use crate::mem::Block;
use leasebox_kernel::acpi::{self, MAX_CPUS, MAX_ECAM, Signature};

/// Where the input's memory lies: the start of the BIOS read-only area.
pub const BASE: u64 = 0xE_0000;

/// What one input did (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub accepted: u64,
    pub refused: u64,
    pub cpus: u64,
    pub ecam: u64,
    pub xsdt: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.accepted += o.accepted;
        self.refused += o.refused;
        self.cpus += o.cpus;
        self.ecam += o.ecam;
        self.xsdt += o.xsdt;
    }
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Sets the byte at `sum_at` so that `b[from..to]` sums to zero, when that range lies in `b`.
fn fix(b: &mut [u8], from: usize, to: usize, sum_at: usize) {
    if to > b.len() || from > to || !(from..to).contains(&sum_at) {
        return;
    }
    b[sum_at] = 0;
    let s = b[from..to].iter().fold(0u8, |s, &x| s.wrapping_add(x));
    b[sum_at] = 0u8.wrapping_sub(s);
}

/// The offset in the block of physical address `addr`, when it lies in it.
fn offset(b: &[u8], addr: u64) -> Option<usize> {
    let off = usize::try_from(addr.checked_sub(BASE)?).ok()?;
    (off < b.len()).then_some(off)
}

/// Repairs every checksum the parser will check: the RSDP's two, the root table's, and those of the tables
/// the root lists, each by the length its own header claims (tables outside the block are left alone).
pub fn repair(b: &mut [u8]) {
    fix(b, 0, 20, 8);
    let revision = b.get(15).copied().unwrap_or(0);
    let rsdp_len = le32(b, 20).unwrap_or(0) as usize;
    if revision >= 2 {
        fix(b, 0, rsdp_len, 32);
    }
    let (root, ptr_len) = match le64(b, 24) {
        Some(x) if revision >= 2 && rsdp_len >= 36 && x != 0 => (x, 8),
        _ => (u64::from(le32(b, 16).unwrap_or(0)), 4),
    };
    let Some(root_at) = offset(b, root) else { return };
    let root_len = le32(b, root_at + 4).unwrap_or(0) as usize;
    let Some(root_end) = root_at.checked_add(root_len) else { return };
    let mut p = root_at + 36;
    while p + ptr_len <= root_end.min(b.len()) {
        let addr = if ptr_len == 8 { le64(b, p).unwrap_or(0) } else { u64::from(le32(b, p).unwrap_or(0)) };
        if let Some(t) = offset(b, addr) {
            let len = le32(b, t + 4).unwrap_or(0) as usize;
            fix(b, t, t.saturating_add(len), t + 9);
        }
        p += ptr_len;
    }
    fix(b, root_at, root_end, root_at + 9);
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let Some((&mode, rest)) = data.split_first() else { return n };
    let mut bytes = rest.to_vec();
    if mode & 1 != 0 {
        repair(&mut bytes);
    }
    let mem = Block { base: BASE, bytes };
    let parsed = acpi::parse(&mem, BASE);
    let found = acpi::find_rsdp_legacy(&mem);
    if let Some(a) = found {
        assert!(a.is_multiple_of(16) && (BASE..0x10_0000).contains(&a), "{a:#x}");
    }
    match parsed {
        Ok(info) => {
            n.accepted += 1;
            assert_eq!(found, Some(BASE), "the legacy search finds the RSDP the tables parse from");
            assert!(info.root_table == Signature::RSDT || info.root_table == Signature::XSDT);
            n.xsdt += u64::from(info.root_table == Signature::XSDT);
            let cpus = info.cpus();
            assert!(cpus.len() <= MAX_CPUS);
            n.cpus += cpus.len() as u64;
            for (i, c) in cpus.iter().enumerate() {
                assert!(cpus[..i].iter().all(|d| d.apic_id != c.apic_id), "APIC id {} twice", c.apic_id);
                if c.is_usable() {
                    assert!(cpus[..i].iter().all(|d| d.is_usable()), "usable processors come first");
                }
            }
            assert!(info.ecam().len() <= MAX_ECAM);
            n.ecam += info.ecam().len() as u64;
            for e in info.ecam() {
                assert!(e.start_bus <= e.end_bus, "{e:?}");
            }
        }
        Err(e) => {
            n.refused += 1;
            assert!(!e.to_string().is_empty());
        }
    }
    n
}
