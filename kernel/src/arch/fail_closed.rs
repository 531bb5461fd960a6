//! Fail closed on a fatal error (docs/revoke-semantics.md, "Fail closed on crash"). A panic, a CPU exception
//! (heap exhaustion is a panic: `alloc`'s error handler panics) or the role watchdog ends in
//! [`fail_closed`] before the core halts, so that no device keeps serving memory nobody is left to revoke:
//!
//! 1. the quiesce hook the image registered ([`set_quiesce_hook`]), run once for the whole machine: for the HCA,
//!    a bounded emergency command that takes the port down. It needs the device's DMA (the command queue and
//!    its mailboxes are host memory), so it comes first;
//! 2. Bus Master Enable cleared (PCI command register bit 2) on every function registered with
//!    [`register_bus_master`], whatever step 1 did: a function without bus mastering issues no memory request, so
//!    no MKEY or QP reaches host memory any more. This step cannot fail short of the configuration space itself
//!    being gone, and it also runs when a fault interrupts step 1 (the nested fatal path calls
//!    [`clear_bus_masters`] alone).
//!
//! Nothing here allocates or waits for a lock another core may hold for long: the functions are kept in atomics,
//! and the legacy configuration ports' lock is tried a bounded number of times and then ignored (the core that
//! holds it may be the one that stopped).

use super::pci_access::PciAccess;
use super::percpu::{self, MAX_CPUS};
use super::serial;
use crate::pci::{self, Bdf, ConfigAccess};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// Functions the fatal path stops (the HCA; the control NIC's DMA reaches only its own buffers).
const MAX_DEVICES: usize = 4;
/// A registered function: `1 << 63 | segment << 16 | bus << 8 | device << 3 | function`; 0 = empty.
static DEVICES: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static ACCESS: AtomicUsize = AtomicUsize::new(0);
static QUIESCE: AtomicUsize = AtomicUsize::new(0);
/// Step 1 runs once for the machine, on the core that owns the console (the first fatal path) ...
static QUIESCED: AtomicBool = AtomicBool::new(false);
/// ... and a second core that crashes meanwhile waits for it (bounded) before it clears bus mastering, which
/// would leave the command no DMA to complete with.
static QUIESCE_DONE: AtomicBool = AtomicBool::new(false);
/// How long a second core waits for step 1 on another core (longer than the image's 1 s bound on it).
const QUIESCE_WAIT: core::time::Duration = core::time::Duration::from_secs(2);
/// How many times each core entered [`clear_bus_masters`]: a fault inside it gets one more try, no more.
static CLEARING: [AtomicU8; MAX_CPUS] = [const { AtomicU8::new(0) }; MAX_CPUS];

const VALID: u64 = 1 << 63;

fn pack(b: Bdf) -> u64 {
    VALID
        | (u64::from(b.segment) << 16)
        | (u64::from(b.bus) << 8)
        | (u64::from(b.device & 0x1f) << 3)
        | u64::from(b.function & 7)
}

fn unpack(v: u64) -> Bdf {
    Bdf::new((v >> 16) as u16, (v >> 8) as u8, ((v >> 3) & 0x1f) as u8, (v & 7) as u8)
}

/// Records `bdf` (a function the image just gave bus mastering) for the fatal path, with the configuration
/// access to reach it. Returns false when the table is full (the function is then not stopped: logged).
pub fn register_bus_master(access: &'static PciAccess, bdf: Bdf) -> bool {
    ACCESS.store(access as *const PciAccess as usize, Ordering::SeqCst);
    let v = pack(bdf);
    for d in &DEVICES {
        if d.load(Ordering::SeqCst) == v || d.compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return true;
        }
    }
    log::error!("fail-closed: no room to record {bdf}; a crash will not stop its DMA");
    false
}

/// Registers the step that runs before bus mastering is cleared (the HCA's port-down command). It must be
/// bounded in time, allocate nothing and take no lock another core may hold.
pub fn set_quiesce_hook(f: fn()) {
    QUIESCE.store(f as usize, Ordering::SeqCst);
}

fn access() -> Option<&'static PciAccess> {
    let a = ACCESS.load(Ordering::SeqCst);
    // SAFETY: only `register_bus_master` stores here, always the address of a `&'static PciAccess`.
    (a != 0).then(|| unsafe { &*(a as *const PciAccess) })
}

/// The fatal path's step 1 (once for the machine) then step 2 (module docs).
pub fn fail_closed() {
    // Step 1 runs on the core whose report reaches the console (the first fatal path), so what it did is
    // printed; a core that crashed meanwhile waits for it. Every core in a fatal path has claimed the console
    // before it gets here, so that core exists and comes here too.
    if serial::fatal_console_is_mine() && !QUIESCED.swap(true, Ordering::SeqCst) {
        let f = QUIESCE.load(Ordering::SeqCst);
        if f != 0 {
            // SAFETY: only `set_quiesce_hook` stores here, always a valid `fn()`.
            let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
            f();
        }
        QUIESCE_DONE.store(true, Ordering::SeqCst);
    } else {
        let deadline = crate::time::Deadline::after(QUIESCE_WAIT);
        while !QUIESCE_DONE.load(Ordering::SeqCst) && !deadline.expired() {
            core::hint::spin_loop();
        }
    }
    clear_bus_masters();
}

/// Step 2 alone: clears Bus Master Enable on every registered function and prints what the command register
/// reads back. A core that faulted inside this function gets one more try, then nothing.
pub fn clear_bus_masters() {
    let core = percpu::core_id() as usize;
    if CLEARING.get(core).is_none_or(|c| c.fetch_add(1, Ordering::SeqCst) >= 2) {
        return;
    }
    let Some(a) = access() else { return };
    let cfg = FatalAccess(a);
    for d in &DEVICES {
        let v = d.load(Ordering::SeqCst);
        if v == 0 {
            continue;
        }
        let bdf = unpack(v);
        pci::set_command(&cfg, bdf, 0, pci::COMMAND_BUS_MASTER);
        let now = cfg.read16(bdf, pci::COMMAND);
        let state = if now & pci::COMMAND_BUS_MASTER == 0 { "cleared" } else { "STILL SET" };
        serial::write_unlocked(format_args!(
            "!!! c{core} fail-closed: {bdf} bus mastering {state} (command {now:#06x})\n"
        ));
    }
}

/// The kernel's configuration access for the fatal path: ECAM as usual; the legacy ports without waiting for
/// long on their lock.
struct FatalAccess(&'static PciAccess);

impl ConfigAccess for FatalAccess {
    fn read32(&self, a: Bdf, offset: u16) -> u32 {
        self.0.read32_fatal(a, offset)
    }
    fn write32(&self, a: Bdf, offset: u16, value: u32) {
        self.0.write32_fatal(a, offset, value)
    }
}
