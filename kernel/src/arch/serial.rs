//! The serial console: a 16550 UART on COM1 (I/O port 0x3F8), 115200 8N1, polled.
//!
//! Every line the kernel prints goes through [`Console`], under one lock so lines from different cores do
//! not interleave. Fatal paths (exceptions, panics) use [`write_unlocked`]: a core that faulted while holding
//! the lock must still be able to speak.

use super::cpu::{inb, outb};
use core::fmt;
use spin::Mutex;

const COM1: u16 = 0x3F8;
const LSR_THR_EMPTY: u8 = 0x20;
/// Upper bound on polls of the line status register per byte: a UART that never drains (absent, or
/// wedged) costs a bounded delay, not a hang.
const MAX_TX_POLLS: u32 = 100_000;

static LOCK: Mutex<()> = Mutex::new(());

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
    let _ = fmt::Write::write_fmt(&mut Raw, args);
}

/// Prints without taking the lock (fatal paths only).
pub fn write_unlocked(args: fmt::Arguments<'_>) {
    let _ = fmt::Write::write_fmt(&mut Raw, args);
}

/// Prints a line to the console, unprefixed, under the console lock.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::arch::serial::write_locked(format_args!("{}\n", format_args!($($arg)*)))
    };
}
