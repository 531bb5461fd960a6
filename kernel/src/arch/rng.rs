//! Hardware random numbers: RDSEED, falling back to RDRAND (Intel SDM vol. 1 §7.3.17; Intel "Digital Random
//! Number Generator (DRNG) Software Implementation Guide" §5.2 and §5.3).
//!
//! RDSEED reads the entropy conditioner directly and may run dry under load, so it gets more retries; RDRAND
//! reads the DRBG that the conditioner reseeds and, per the guide, failing 10 times in a row means the unit is
//! broken. Some AMD parts have returned all-ones after resume (Linux `arch/x86/kernel/cpu/rdrand.c` checks the
//! same), so that value counts as a failure. There is never a fallback to a predictable source (TSC, a
//! counter): callers get `None`/`Err` and decide what cannot run without randomness.

use super::cpu::cpuid;
use core::arch::asm;
use core::fmt;
use core::sync::atomic::{AtomicU8, Ordering};

/// Intel's DRNG guide: 10 RDRAND attempts, then the unit is considered failed.
const RDRAND_RETRIES: u32 = 10;
/// RDSEED may legitimately underflow for a while; the guide suggests retrying with a pause. 128 attempts
/// are microseconds, not a wait worth a deadline.
const RDSEED_RETRIES: u32 = 128;

const FEATURES_UNKNOWN: u8 = 0;
const HAS_RDRAND: u8 = 1 << 1;
const HAS_RDSEED: u8 = 1 << 2;
const PROBED: u8 = 1 << 7;

static FEATURES: AtomicU8 = AtomicU8::new(FEATURES_UNKNOWN);

/// Both instructions are missing or kept failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngError;

impl fmt::Display for RngError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no working hardware random source (RDSEED/RDRAND)")
    }
}

fn features() -> u8 {
    let f = FEATURES.load(Ordering::Relaxed);
    if f & PROBED != 0 {
        return f;
    }
    let mut f = PROBED;
    // CPUID.1:ECX bit 30 = RDRAND; CPUID.(7,0):EBX bit 18 = RDSEED (leaf 7 only if the maximum leaf allows).
    if cpuid(1, 0).2 & (1 << 30) != 0 {
        f |= HAS_RDRAND;
    }
    if cpuid(0, 0).0 >= 7 && cpuid(7, 0).1 & (1 << 18) != 0 {
        f |= HAS_RDSEED;
    }
    FEATURES.store(f, Ordering::Relaxed);
    f
}

fn rdseed_once() -> Option<u64> {
    let v: u64;
    let ok: u8;
    // SAFETY: only called when CPUID reports RDSEED; it writes a register and CF, touches no memory.
    unsafe { asm!("rdseed {v}", "setc {ok}", v = out(reg) v, ok = out(reg_byte) ok, options(nomem, nostack)) }
    (ok != 0).then_some(v)
}

fn rdrand_once() -> Option<u64> {
    let v: u64;
    let ok: u8;
    // SAFETY: only called when CPUID reports RDRAND; it writes a register and CF, touches no memory.
    unsafe { asm!("rdrand {v}", "setc {ok}", v = out(reg) v, ok = out(reg_byte) ok, options(nomem, nostack)) }
    (ok != 0).then_some(v)
}

fn retry(attempts: u32, mut once: impl FnMut() -> Option<u64>) -> Option<u64> {
    (0..attempts).find_map(|_| match once() {
        Some(v) if v != u64::MAX => Some(v),
        _ => {
            core::hint::spin_loop();
            None
        }
    })
}

/// 64 random bits from RDSEED, else RDRAND; `None` when neither exists or both keep failing.
pub fn random_u64() -> Option<u64> {
    let f = features();
    if f & HAS_RDSEED != 0
        && let Some(v) = retry(RDSEED_RETRIES, rdseed_once)
    {
        return Some(v);
    }
    if f & HAS_RDRAND != 0 {
        return retry(RDRAND_RETRIES, rdrand_once);
    }
    None
}

/// Fills `buf` with random bytes, or fails without a partial fallback.
pub fn fill(buf: &mut [u8]) -> Result<(), RngError> {
    for chunk in buf.chunks_mut(8) {
        let v = random_u64().ok_or(RngError)?.to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    Ok(())
}

/// Which instruction [`random_u64`] tries first: `"rdseed"`, `"rdrand"`, or `None` without either.
pub fn source() -> Option<&'static str> {
    let f = features();
    if f & HAS_RDSEED != 0 {
        Some("rdseed")
    } else if f & HAS_RDRAND != 0 {
        Some("rdrand")
    } else {
        None
    }
}
