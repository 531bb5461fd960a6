//! Firmware time: how long a command stays HW-owned after its doorbell before the device
//! executes and completes it, other slots running meanwhile. [`Timing::Firmware`] is the default: per-opcode
//! latencies from the reference trace (`tests/data/trace-mlx5_core-connectx4.txt.gz`, Linux mlx5_core against a
//! real ConnectX-4) with a deterministic jitter, so commands in different slots complete out of order as they
//! do on hardware. Tests that need speed ask for [`Timing::Zero`] explicitly (`ModelConfig::instant`).
//!
//! The table and where each number comes from are in `docs/hca-model.md`, "Command timing and doorbells".

use std::fmt;
use std::time::Duration;

use crate::cmd::opcode as op;
use crate::ifc::{self, Field, hdr};

/// `manage_pages_in.input_num_entries` (`mlx5_ifc.h`): pages given, or asked back.
const MANAGE_PAGES_IN_INPUT_NUM_ENTRIES: Field = Field::new(0x60, 32);
/// The default seed of [`Timing::firmware`].
pub const DEFAULT_SEED: u64 = 0x4c42_4d4c_5835_0001;

/// INIT_HCA: the reference trace's 189.3 ms from doorbell to output, read through Linux's ~10 ms polling
/// granularity, so the firmware took between about 180 and 190 ms.
pub const INIT_HCA: Duration = Duration::from_millis(185);
/// TEARDOWN_HCA: not in the trace. An assumption of the same order as INIT_HCA, which it undoes, well inside
/// Linux's 3 s teardown timeout (docs/reference/mlx5.md §g).
pub const TEARDOWN_HCA: Duration = Duration::from_millis(100);
/// MANAGE_PAGES: a base plus a per-page time. The trace's INIT give of 12 868 pages took 20.1 ms through the
/// 10 ms polling granularity (so 10–20 ms); 1.2 µs a page puts it at 15.5 ms, the middle of that window.
pub const MANAGE_PAGES_BASE: Duration = Duration::from_micros(30);
pub const MANAGE_PAGES_PER_PAGE: Duration = Duration::from_nanos(1_200);
/// Commands that build, change or destroy a hardware context (EQ, CQ, QP, SQ, RQ, TIS, TIR, MKEY, flow
/// steering): CREATE_EQ is the trace's one command timed by interrupt (119–162 µs, median 129 µs, doorbell to
/// Linux's output dump, which includes the interrupt and Linux's own work), so the firmware part is a little
/// under that.
pub const CONTEXT: Duration = Duration::from_micros(110);
/// Everything else (queries, ALLOC_*/DEALLOC_*, SET_HCA_CAP, SET_ISSI, ENABLE_HCA, ACCESS_REG, ...): the trace
/// shows these only through the 10 ms polling granularity of early boot; tens of µs is an assumption below
/// the CONTEXT class, to be confirmed on a ConnectX-5 (docs/hardware-bringup.md).
pub const SIMPLE: Duration = Duration::from_micros(30);
/// The jitter's amplitude: a command's latency is its base ± up to a quarter of it, at most this much
/// (firmware scheduling noise that does not grow with the command's length).
pub const MAX_JITTER: Duration = Duration::from_micros(25);

/// One UMR WQE (`crate::umr`), doorbell to completion: about a microsecond. Source: UCX PR 9838 (openucx/ucx),
/// which measured re-pointing a cached mkey by UMR at 0.4–1.8 µs on ConnectX hardware against 0.2–0.4 ms to
/// create one by command; 1 µs is the middle of that range. Not jittered: it is below the command jitter's
/// scale, and a send queue completes its WQEs in order anyway.
pub const UMR: Duration = Duration::from_micros(1);

/// How long commands take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// No firmware time: a command completes in the pass that sees its doorbell (tests that need speed, and
    /// tests on the hosted virtual clock, where the model's real-time timers would not line up).
    Zero,
    /// Every command is held exactly this long (benchmarks of pipelining).
    Fixed(Duration),
    /// The per-opcode table ([`Timing::base`]) with a jitter drawn from a PRNG seeded with `seed` and the
    /// command's sequence number (deterministic for a given order of doorbells).
    Firmware { seed: u64 },
}

impl Default for Timing {
    fn default() -> Self {
        Timing::firmware()
    }
}

impl Timing {
    pub const fn firmware() -> Timing {
        Timing::Firmware { seed: DEFAULT_SEED }
    }

    /// The table, without jitter, for a command whose first 16 input bytes (the entry's inline input: opcode,
    /// op_mod and the first dwords of the command) are `inline`.
    pub fn base(inline: &[u8]) -> Duration {
        let opcode = ifc::get(inline, hdr::OPCODE) as u16;
        match opcode {
            op::INIT_HCA => INIT_HCA,
            op::TEARDOWN_HCA => TEARDOWN_HCA,
            op::MANAGE_PAGES => {
                let pages = ifc::get(inline, MANAGE_PAGES_IN_INPUT_NUM_ENTRIES);
                MANAGE_PAGES_BASE + MANAGE_PAGES_PER_PAGE * pages
            }
            _ if is_context(opcode) => CONTEXT,
            _ => SIMPLE,
        }
    }

    /// How long the `n`-th timed command (counting from 0) with inline input `inline` stays HW-owned.
    pub fn latency(&self, inline: &[u8], n: u64) -> Duration {
        match *self {
            Timing::Zero => Duration::ZERO,
            Timing::Fixed(d) => d,
            Timing::Firmware { seed } => {
                let base = Timing::base(inline);
                let amp = (base / 4).min(MAX_JITTER).as_nanos() as u64;
                if amp == 0 {
                    return base;
                }
                // Uniform in [0, 2·amp], then shifted to [-amp, +amp].
                let r = splitmix64(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % (2 * amp + 1);
                let ns = base.as_nanos() as u64 + r;
                Duration::from_nanos(ns.saturating_sub(amp))
            }
        }
    }

    /// How long a UMR WQE takes from the doorbell (or the previous WQE's completion) to its completion: none
    /// with [`Timing::Zero`], [`UMR`] otherwise (a fixed command latency is about commands; a UMR keeps its
    /// own figure).
    pub fn umr_latency(&self) -> Duration {
        match self {
            Timing::Zero => Duration::ZERO,
            _ => UMR,
        }
    }

    /// `firmware`, `zero`, or a fixed latency such as `20us` / `3ms` (the model binary's `--timing`, the
    /// hosted appliance's `--timing`).
    pub fn parse(s: &str) -> Result<Timing, String> {
        let fixed = |digits: &str, unit: fn(u64) -> Duration| {
            digits.parse::<u64>().ok().filter(|n| *n <= 10_000_000).map(|n| Timing::Fixed(unit(n)))
        };
        let t = match s {
            "firmware" => Some(Timing::firmware()),
            "zero" => Some(Timing::Zero),
            _ => match (s.strip_suffix("us"), s.strip_suffix("ms")) {
                (Some(d), _) => fixed(d, Duration::from_micros),
                (_, Some(d)) => fixed(d, Duration::from_millis),
                _ => None,
            },
        };
        t.ok_or_else(|| format!("expected `firmware`, `zero` or a fixed latency such as `20us` or `3ms`, got `{s}`"))
    }
}

impl fmt::Display for Timing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Timing::Zero => f.write_str("zero"),
            Timing::Fixed(d) => write!(f, "{}us", d.as_micros()),
            Timing::Firmware { seed } if *seed == DEFAULT_SEED => f.write_str("firmware"),
            Timing::Firmware { seed } => write!(f, "firmware(seed {seed:#x})"),
        }
    }
}

/// Opcodes that build, modify or destroy a hardware context ([`CONTEXT`]).
fn is_context(opcode: u16) -> bool {
    matches!(
        opcode,
        op::CREATE_MKEY
            | op::DESTROY_MKEY
            | op::CREATE_EQ
            | op::DESTROY_EQ
            | op::CREATE_CQ
            | op::DESTROY_CQ
            | op::CREATE_QP
            | op::DESTROY_QP
            | op::RST2INIT_QP
            | op::INIT2RTR_QP
            | op::RTR2RTS_QP
            | op::RTS2RTS_QP
            | op::QP_2ERR
            | op::QP_2RST
            | op::CREATE_TIR
            | op::DESTROY_TIR
            | op::CREATE_SQ
            | op::MODIFY_SQ
            | op::DESTROY_SQ
            | op::CREATE_RQ
            | op::MODIFY_RQ
            | op::DESTROY_RQ
            | op::CREATE_TIS
            | op::DESTROY_TIS
            | op::SET_FLOW_TABLE_ROOT
            | op::CREATE_FLOW_TABLE
            | op::DESTROY_FLOW_TABLE
            | op::CREATE_FLOW_GROUP
            | op::DESTROY_FLOW_GROUP
            | op::SET_FLOW_TABLE_ENTRY
            | op::DELETE_FLOW_TABLE_ENTRY
    )
}

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit output per input, well mixed; enough for jitter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(opcode: u16, op_mod: u16, dword3: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&(u32::from(opcode) << 16).to_be_bytes());
        b[4..8].copy_from_slice(&u32::from(op_mod).to_be_bytes());
        b[12..16].copy_from_slice(&dword3.to_be_bytes());
        b
    }

    #[test]
    fn parse_and_display() {
        assert_eq!(Timing::parse("firmware"), Ok(Timing::firmware()));
        assert_eq!(Timing::parse("zero"), Ok(Timing::Zero));
        assert_eq!(Timing::parse("20us"), Ok(Timing::Fixed(Duration::from_micros(20))));
        assert_eq!(Timing::parse("3ms"), Ok(Timing::Fixed(Duration::from_millis(3))));
        for bad in ["", "fast", "us", "-1us", "20", "20s"] {
            assert!(Timing::parse(bad).unwrap_err().contains("firmware"), "{bad}");
        }
        for t in [Timing::firmware(), Timing::Zero, Timing::Fixed(Duration::from_micros(20))] {
            assert_eq!(Timing::parse(&t.to_string()), Ok(t));
        }
        assert_eq!(Timing::default(), Timing::firmware());
    }

    #[test]
    fn the_table_follows_the_trace() {
        let base = |opcode, op_mod, d3| Timing::base(&inline(opcode, op_mod, d3));
        assert_eq!(base(op::INIT_HCA, 0, 0), INIT_HCA);
        assert_eq!(base(op::TEARDOWN_HCA, 0, 0), TEARDOWN_HCA);
        assert_eq!(base(op::CREATE_EQ, 0, 0), CONTEXT);
        assert_eq!(base(op::CREATE_CQ, 0, 0), CONTEXT);
        assert_eq!(base(op::QUERY_HCA_CAP, 1, 0), SIMPLE);
        assert_eq!(base(op::ALLOC_PD, 0, 0), SIMPLE);
        // The INIT give of the trace: 12 868 pages, 10–20 ms.
        let give = base(op::MANAGE_PAGES, 1, 12_868);
        assert!(give > Duration::from_millis(10) && give < Duration::from_millis(20), "{give:?}");
        assert!(base(op::MANAGE_PAGES, 1, 6) < Duration::from_micros(100), "a small give is fast");
        assert!(SIMPLE < CONTEXT && CONTEXT < Duration::from_micros(119), "below the trace's fastest CREATE_EQ");
    }

    #[test]
    fn jitter_is_bounded_deterministic_and_reorders() {
        let t = Timing::firmware();
        let q = inline(op::QUERY_HCA_CAP, 1, 0);
        let lat: Vec<Duration> = (0..64).map(|n| t.latency(&q, n)).collect();
        let amp = SIMPLE / 4;
        assert!(lat.iter().all(|d| *d >= SIMPLE - amp && *d <= SIMPLE + amp), "{lat:?}");
        assert_eq!(lat, (0..64).map(|n| t.latency(&q, n)).collect::<Vec<_>>(), "same seed, same latencies");
        assert!(lat.windows(2).any(|w| w[0] > w[1]), "a later command of the same kind can be faster");
        assert!(lat.windows(2).any(|w| w[0] < w[1]));
        let other = Timing::Firmware { seed: 7 };
        assert_ne!(lat, (0..64).map(|n| other.latency(&q, n)).collect::<Vec<_>>(), "the seed matters");
        let init = inline(op::INIT_HCA, 0, 0);
        assert!((0..64).all(|n| t.latency(&init, n).abs_diff(INIT_HCA) <= MAX_JITTER), "jitter is capped");
        assert_eq!(Timing::Zero.latency(&init, 0), Duration::ZERO);
        assert_eq!(Timing::Fixed(Duration::from_micros(5)).latency(&init, 3), Duration::from_micros(5));
    }
}
