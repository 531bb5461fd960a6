//! The serial console: a 16550 UART on COM1 (I/O port 0x3F8), 115200 8N1, polled.
//!
//! Every line the kernel prints goes through [`Console`], under one lock so lines from different cores do
//! not interleave. Fatal paths (exceptions, panics) use [`write_unlocked`]: a core that faulted while holding
//! the lock must still be able to speak. The first of them claims the console ([`claim_for_fatal`]): from then
//! on only that core's output reaches it, so the crash report is not interleaved with other cores' log lines.

use super::cpu::{inb, outb};
use core::fmt;
use core::sync::atomic::{AtomicU32, Ordering};
use spin::Mutex;

const COM1: u16 = 0x3F8;
const LSR_THR_EMPTY: u8 = 0x20;
/// Upper bound on polls of the line status register per byte: a UART that never drains (absent, or
/// wedged) costs a bounded delay, not a hang.
const MAX_TX_POLLS: u32 = 100_000;

static LOCK: Mutex<()> = Mutex::new(());
/// The core whose fatal path owns the console, or [`NO_OWNER`].
static FATAL_OWNER: AtomicU32 = AtomicU32::new(NO_OWNER);
const NO_OWNER: u32 = u32::MAX;
/// Attempts at the lock when claiming the console (its holder may be the claiming core itself).
const CLAIM_TRIES: u32 = 1_000_000;

/// A fatal path takes the console: only this core's output reaches it from now on (the first core to claim
/// keeps it). A line another core is printing under the lock is let finish first (bounded).
pub fn claim_for_fatal() {
    let me = super::percpu::core_id();
    let _ = FATAL_OWNER.compare_exchange(NO_OWNER, me, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..CLAIM_TRIES {
        if LOCK.try_lock().is_some() {
            break;
        }
        core::hint::spin_loop();
    }
}

/// Whether this core's fatal path owns the console (or no fatal path has claimed it): the core whose report
/// is the one printed. When several cores crash at once (two watchdogs that notice the same stuck core), this
/// one runs the fatal path's port-down step, so its outcome is printed, and ends the run.
pub fn fatal_console_is_mine() -> bool {
    !silenced()
}

/// Whether this core's output is dropped: another core's fatal path owns the console.
fn silenced() -> bool {
    let owner = FATAL_OWNER.load(Ordering::SeqCst);
    owner != NO_OWNER && owner != super::percpu::core_id()
}

/// Programs COM1 for 115200 8N1 with FIFOs, interrupts off.
pub fn init() {
    // SAFETY: COM1's registers are the standard 16550 set; programming them has no memory effects.
    unsafe {
        outb(COM1 + 1, 0x00); // IER: no interrupts
        outb(COM1 + 3, 0x80); // LCR: DLAB
        outb(COM1, 0x01); // divisor 1 = 115200 baud
        outb(COM1 + 1, 0x00);
        outb(COM1 + 3, 0x03); // 8N1, DLAB off
        outb(COM1 + 2, 0xC7); // FIFO on, cleared, 14-byte threshold
        outb(COM1 + 4, 0x03); // DTR | RTS, no OUT2 (no interrupt line)
    }
}

fn put(byte: u8) {
    // SAFETY: reading LSR and writing THR of COM1 only moves a byte to the UART.
    unsafe {
        for _ in 0..MAX_TX_POLLS {
            if inb(COM1 + 5) & LSR_THR_EMPTY != 0 {
                break;
            }
        }
        outb(COM1, byte);
    }
}

fn put_str(s: &str) {
    for b in s.bytes() {
        if b == b'\n' {
            put(b'\r');
        }
        put(b);
    }
}

/// A `fmt::Write` sink over the UART. Holding one does not imply holding the lock.
pub struct Raw;

impl fmt::Write for Raw {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        put_str(s);
        Ok(())
    }
}

/// Prints under the console lock.
pub fn write_locked(args: fmt::Arguments<'_>) {
    let _g = LOCK.lock();
    if silenced() {
        return;
    }
    let _ = fmt::Write::write_fmt(&mut Raw, args);
}

/// Prints without taking the lock (fatal paths only).
pub fn write_unlocked(args: fmt::Arguments<'_>) {
    if silenced() {
        return;
    }
    let _ = fmt::Write::write_fmt(&mut Raw, args);
}

/// Prints a line to the console, unprefixed, under the console lock.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::arch::serial::write_locked(format_args!("{}\n", format_args!($($arg)*)))
    };
}
