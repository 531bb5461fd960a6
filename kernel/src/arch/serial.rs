//! The serial console: a 16550 UART, 115200 8N1 unless told otherwise, polled. It starts on COM1 (I/O port
//! 0x3F8) and moves once, early in boot, to the port `console=` or the ACPI SPCR names ([`select`],
//! `crate::console`); the lines printed before the move are kept in a small buffer and replayed on the new port,
//! so the operator's port shows the whole boot.
//!
//! Every line the kernel prints goes through [`Console`], under one lock so lines from different cores do
//! not interleave. Fatal paths (exceptions, panics) use [`write_unlocked`]: a core that faulted while holding
//! the lock must still be able to speak. The first of them claims the console ([`claim_for_fatal`]): from then
//! on only that core's output reaches it, so the crash report is not interleaved with other cores' log lines.

use super::cpu::{inb, outb};
use crate::console::Uart;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use spin::Mutex;

/// The console's base I/O port; 0 = no console output (`console=none`).
static PORT: AtomicU16 = AtomicU16::new(Uart::COM1.port);
/// Set once the console is where it stays ([`select`]); until then output is also kept in [`EARLY`].
static SETTLED: AtomicBool = AtomicBool::new(false);
/// Output before [`select`], replayed on the chosen port (the first bytes only, if there are more).
static EARLY: Mutex<Early> = Mutex::new(Early { buf: [0; EARLY_BYTES], len: 0 });
const EARLY_BYTES: usize = 8192;

struct Early {
    buf: [u8; EARLY_BYTES],
    len: usize,
}
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

/// Programs COM1 for 115200 8N1 with FIFOs, interrupts off: the console until [`select`] moves it.
pub fn init() {
    program(Uart::COM1);
}

/// Programs `u` for 8N1 at its baud rate with FIFOs, interrupts off.
fn program(u: Uart) {
    let base = u.port;
    let [lo, hi] = u.divisor().to_le_bytes();
    // SAFETY: a 16550's eight registers at `base` (the caller's port, checked to fit by `crate::console`);
    // programming them has no memory effects, and a port without a UART ignores the writes.
    unsafe {
        outb(base + 1, 0x00); // IER: no interrupts
        outb(base + 3, 0x80); // LCR: DLAB
        outb(base, lo); // divisor latch
        outb(base + 1, hi);
        outb(base + 3, 0x03); // 8N1, DLAB off
        outb(base + 2, 0xC7); // FIFO on, cleared, 14-byte threshold
        outb(base + 4, 0x03); // DTR | RTS, no OUT2 (no interrupt line)
    }
}

/// Moves the console to `to` (`None`: no output at all), once; later calls do nothing. Announces the move on
/// the old port, then replays there what was printed so far on the new one. Called on the BSP during boot,
/// before the other cores run.
pub fn select(to: Option<Uart>, why: &str) {
    if SETTLED.swap(true, Ordering::SeqCst) {
        return;
    }
    let old = PORT.load(Ordering::SeqCst);
    let new = to.map_or(0, |u| u.port);
    let _g = LOCK.lock();
    if new != old {
        match to {
            Some(u) => emit(old, format_args!("console: moving to {u} ({why})\n")),
            None => emit(old, format_args!("console: off ({why})\n")),
        }
    }
    if let Some(u) = to
        && (new != old || u != Uart::COM1)
    {
        program(u);
    }
    PORT.store(new, Ordering::SeqCst);
    if new != old && new != 0 {
        let early = EARLY.lock();
        for &b in &early.buf[..early.len] {
            put_byte(new, b);
        }
        if early.len == EARLY_BYTES {
            emit(new, format_args!("console: (earlier output cut at {EARLY_BYTES} bytes)\n"));
        }
    }
}

fn put_byte(port: u16, byte: u8) {
    if port == 0 {
        return;
    }
    // SAFETY: reading LSR and writing THR of the console's UART only moves a byte to it.
    unsafe {
        for _ in 0..MAX_TX_POLLS {
            if inb(port + 5) & LSR_THR_EMPTY != 0 {
                break;
            }
        }
        outb(port, byte);
    }
}

fn put_str(s: &str) {
    let port = PORT.load(Ordering::Relaxed);
    if !SETTLED.load(Ordering::Relaxed) {
        // Before the console settles only the BSP runs; `try_lock` keeps a fault inside this very function
        // from deadlocking its own report.
        if let Some(mut early) = EARLY.try_lock() {
            let n = s.len().min(EARLY_BYTES - early.len);
            let at = early.len;
            early.buf[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
            early.len += n;
        }
    }
    write_port(port, s);
}

fn write_port(port: u16, s: &str) {
    for b in s.bytes() {
        if b == b'\n' {
            put_byte(port, b'\r');
        }
        put_byte(port, b);
    }
}

/// Formats straight to `port` (the announcements of [`select`], which must not enter the early buffer).
fn emit(port: u16, args: fmt::Arguments<'_>) {
    struct To(u16);
    impl fmt::Write for To {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            write_port(self.0, s);
            Ok(())
        }
    }
    let _ = fmt::Write::write_fmt(&mut To(port), args);
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
