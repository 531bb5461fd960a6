//! Application-processor start-up: INIT-SIPI-SIPI (Intel SDM vol. 3, 9.4.4; Linux `wakeup_secondary_cpu_via_init`)
//! through the real-mode trampoline at 0x8000. APs are started one after another; each gets its own stack,
//! IST stacks, GDT and TSS, then runs the function the image registered.

use super::boot::{self, TRAMPOLINE_ADDR};
use super::cpu::cpuid;
use super::descriptors::{self, IST_STACKS};
use super::lapic::Lapic;
use super::memory::FRAMES;
use super::percpu::{self, MAX_CPUS};
use crate::frames::FRAME_SIZE;
use crate::time::{Deadline, delay, wait_until};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;

pub const STACK_BYTES: u64 = 64 * 1024;
pub const IST_BYTES: u64 = 16 * 1024;

static AP_MAIN: AtomicUsize = AtomicUsize::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);
static APIC_IDS: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
static IST_TOPS: [[AtomicU64; IST_STACKS]; MAX_CPUS] = [const { [const { AtomicU64::new(0) }; IST_STACKS] }; MAX_CPUS];

#[derive(Clone, Copy, Debug)]
pub enum SmpError {
    NoMemory,
    TrampolineUnavailable,
    IpiNotDelivered { apic_id: u32 },
    NoResponse { apic_id: u32 },
}

impl core::fmt::Display for SmpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SmpError::NoMemory => write!(f, "no memory for AP stacks"),
            SmpError::TrampolineUnavailable => write!(f, "the trampoline page at 0x8000 is not free RAM"),
            SmpError::IpiNotDelivered { apic_id } => write!(f, "IPI to APIC {apic_id} was not delivered"),
            SmpError::NoResponse { apic_id } => write!(f, "CPU with APIC {apic_id} did not start"),
        }
    }
}

/// Allocates a stack and returns its top (16-byte aligned).
fn stack(bytes: u64) -> Result<u64, SmpError> {
    let base = FRAMES.lock().alloc(bytes / FRAME_SIZE, FRAME_SIZE).ok_or(SmpError::NoMemory)?;
    Ok(base + bytes)
}

/// IST stacks for core `index`; returns their tops.
pub fn alloc_ist(index: usize) -> Result<[u64; IST_STACKS], SmpError> {
    let mut tops = [0; IST_STACKS];
    for (i, t) in tops.iter_mut().enumerate() {
        *t = stack(IST_BYTES)?;
        IST_TOPS[index][i].store(*t, Ordering::Relaxed);
    }
    Ok(tops)
}

/// Whether INIT needs the legacy 10 ms settle time: Linux skips it for Intel family 6, AMD family ≥ 0xF
/// and Hygon ≥ 0x18 (`smp_quirk_init_udelay`).
fn init_delay() -> Duration {
    let (_, b, c, d) = cpuid(0, 0);
    let family = {
        let eax = cpuid(1, 0).0;
        let base = (eax >> 8) & 0xF;
        if base == 0xF { base + ((eax >> 20) & 0xFF) } else { base }
    };
    let vendor = |s: &[u8; 12]| s[0..4] == b.to_le_bytes() && s[4..8] == d.to_le_bytes() && s[8..12] == c.to_le_bytes();
    let modern = (vendor(b"GenuineIntel") && family == 6)
        || (vendor(b"AuthenticAMD") && family >= 0xF)
        || (vendor(b"HygonGenuine") && family >= 0x18);
    if modern { Duration::from_micros(10) } else { Duration::from_millis(10) }
}

/// Copies the trampoline to 0x8000. The caller has checked the page is RAM nobody else uses.
fn install_trampoline() {
    // SAFETY: the trampoline's bytes are read-only data in the image; 0x8000..0x9000 is identity-mapped low
    // RAM reserved for this purpose (below the frame allocator's floor), and the code fits in it.
    unsafe {
        let start = &boot::ap_trampoline_start as *const u8;
        let end = &boot::ap_trampoline_end as *const u8;
        let len = end as usize - start as usize;
        assert!(len <= 4096, "AP trampoline larger than a page");
        core::ptr::copy_nonoverlapping(start, TRAMPOLINE_ADDR as *mut u8, len);
    }
}

fn tramp_slot(sym: &u8) -> *mut u64 {
    // SAFETY: only addresses are computed; both symbols belong to the trampoline blob.
    let off = sym as *const u8 as u64 - unsafe { &boot::ap_trampoline_start as *const u8 as u64 };
    (TRAMPOLINE_ADDR + off) as *mut u64
}

/// Starts each `(index, apic_id)` in turn; `main(index)` runs on it after its descriptors are loaded.
/// Returns at the first failure (earlier APs keep running).
pub fn start_aps(lapic: &Lapic, aps: &[(usize, u32)], main: fn(usize) -> !) -> Result<(), SmpError> {
    AP_MAIN.store(main as usize, Ordering::SeqCst);
    install_trampoline();
    let settle = init_delay();
    for &(index, apic_id) in aps {
        let top = stack(STACK_BYTES)?;
        alloc_ist(index)?;
        APIC_IDS[index].store(apic_id, Ordering::Relaxed);
        STARTED.store(false, Ordering::SeqCst);
        // SAFETY: the parameter slots lie inside the copied trampoline page; no AP is running the trampoline
        // now (the previous one signalled STARTED after reading them).
        unsafe {
            super::mmio::write(tramp_slot(&boot::ap_tramp_stack), top);
            super::mmio::write(tramp_slot(&boot::ap_tramp_arg), index as u64);
            super::mmio::write(tramp_slot(&boot::ap_tramp_entry), ap_entry64 as *const () as u64);
        }
        if !lapic.send_init(apic_id) {
            return Err(SmpError::IpiNotDelivered { apic_id });
        }
        delay(settle);
        let page = (TRAMPOLINE_ADDR >> 12) as u8;
        for attempt in 0..2 {
            if !lapic.send_startup(apic_id, page) {
                return Err(SmpError::IpiNotDelivered { apic_id });
            }
            // The second SIPI only matters if the first was lost; a running AP ignores it.
            let wait = if attempt == 0 { Duration::from_millis(1) } else { Duration::from_secs(2) };
            if wait_until(Deadline::after(wait), || STARTED.load(Ordering::SeqCst)) {
                break;
            }
        }
        if !STARTED.load(Ordering::SeqCst) {
            return Err(SmpError::NoResponse { apic_id });
        }
    }
    Ok(())
}

/// First Rust code on an AP (called by the trampoline with the core index, on the core's own stack).
extern "C" fn ap_entry64(index: u64) -> ! {
    let index = index as usize;
    let apic = APIC_IDS[index].load(Ordering::Relaxed);
    let ist: [u64; IST_STACKS] = core::array::from_fn(|i| IST_TOPS[index][i].load(Ordering::Relaxed));
    // SAFETY: this CPU is core `index` (the BSP handed it this index alone), nothing has used its per-CPU
    // block, and the IST stacks were allocated for this core.
    unsafe {
        percpu::activate(index, apic);
        descriptors::load(index, ist);
    }
    STARTED.store(true, Ordering::SeqCst);
    let main = AP_MAIN.load(Ordering::SeqCst);
    // SAFETY: AP_MAIN holds a `fn(usize) -> !` stored by `start_aps` before any AP could run.
    let main: fn(usize) -> ! = unsafe { core::mem::transmute::<usize, fn(usize) -> !>(main) };
    main(index)
}
