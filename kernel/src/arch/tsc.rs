//! TSC calibration at boot. CPUID leaf 0x15 gives the rate exactly where the CPU reports it; otherwise the
//! TSC is measured against PIT channel 2 (1.193182 MHz) over a 5 ms one-shot, as Linux's
//! `pit_calibrate_tsc` does; CPUID leaf 0x16 (nominal MHz) is the last resort.

use super::cpu::{cpuid, inb, outb, rdtsc};

const PIT_HZ: u64 = 1_193_182;
const CALIBRATION_MS: u64 = 5;
/// If OUT2 never rises (no PIT), give up after this many TSC ticks (seconds even at high clock rates).
const PIT_GIVE_UP_TICKS: u64 = 1 << 34;

#[derive(Clone, Copy, Debug)]
pub enum Source {
    Cpuid15,
    Pit,
    Cpuid16,
    Assumed,
}

fn from_cpuid15() -> Option<u64> {
    let (max, ..) = cpuid(0, 0);
    if max < 0x15 {
        return None;
    }
    let (den, num, crystal, _) = cpuid(0x15, 0);
    (den != 0 && num != 0 && crystal != 0).then(|| u64::from(crystal) * u64::from(num) / u64::from(den))
}

fn from_pit() -> Option<u64> {
    let latch = PIT_HZ * CALIBRATION_MS / 1000;
    // SAFETY: ports 0x61 (NMI status/control: gate of channel 2, speaker off) and 0x42/0x43 (PIT) are the
    // standard PC timer; channel 2 drives only the speaker, which stays disabled.
    unsafe {
        outb(0x61, (inb(0x61) & !0x02) | 0x01);
        outb(0x43, 0xB0); // channel 2, lobyte/hibyte, mode 0, binary
        outb(0x42, (latch & 0xFF) as u8);
        outb(0x42, (latch >> 8) as u8);
    }
    let t0 = rdtsc();
    loop {
        // SAFETY: reading port 0x61 has no side effects.
        let out2 = unsafe { inb(0x61) } & 0x20 != 0;
        let t = rdtsc();
        if out2 {
            let ticks = t.wrapping_sub(t0);
            return (ticks > 0).then(|| ticks * 1000 / CALIBRATION_MS);
        }
        if t.wrapping_sub(t0) > PIT_GIVE_UP_TICKS {
            return None;
        }
    }
}

fn from_cpuid16() -> Option<u64> {
    let (max, ..) = cpuid(0, 0);
    if max < 0x16 {
        return None;
    }
    let mhz = cpuid(0x16, 0).0 & 0xFFFF;
    (mhz != 0).then(|| u64::from(mhz) * 1_000_000)
}

/// Measures the TSC frequency (Hz) and says how.
pub fn calibrate() -> (u64, Source) {
    if let Some(hz) = from_cpuid15() {
        return (hz, Source::Cpuid15);
    }
    if let Some(hz) = from_pit() {
        return (hz, Source::Pit);
    }
    if let Some(hz) = from_cpuid16() {
        return (hz, Source::Cpuid16);
    }
    (2_000_000_000, Source::Assumed)
}
