//! The `record` fuzz target's stable twin: the same check (`app/proto/fuzz/src/record.rs`) on the committed
//! seeds (`app/proto/fuzz/seeds/record/`) and on 10,000 scripts from a seeded xorshift generator — handshake
//! messages with a few bytes changed, and record streams mixing whole, split, bit-flipped records and noise.
//! Deterministic: a failure names its input's index, and `TWIN_SEED` reproduces it. `LEASEBOX_WRITE_SEEDS=1`
//! rewrites the seed files from [`seeds`] before the run.

#[path = "../fuzz/src/record.rs"]
mod record_check;

use std::path::Path;

use leasebox_twin::{Rng, check_seeds, twin_seed};
use record_check::{Counts, check};

const INPUTS: usize = 10_000;
const SEED: u64 = 0x1EA5_EB0C_5EED_0002;
const SEED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/record");

/// A handshake message (`mode` 0 or 1) XORed with a few random bytes, or none.
fn handshake_input(r: &mut Rng, mode: u8) -> Vec<u8> {
    let len = if mode == 0 { 48 } else { 97 };
    let mut v = vec![mode, 1];
    let mut fill = vec![0u8; len];
    for _ in 0..r.below(3) {
        let at = r.below(len);
        fill[at] = r.u8();
    }
    v.extend(fill);
    v
}

/// A record stream script: steps of (op, len, bytes, operand).
fn stream_input(r: &mut Rng, tamper: bool) -> Vec<u8> {
    let mut v = vec![2 + r.below(250) as u8];
    for _ in 0..1 + r.below(6) {
        let op = match r.below(8) {
            0 if tamper => 1 | (r.u8() & !3),
            1 if tamper => 2,
            2 | 3 => 3,
            _ => 0,
        };
        let most = if r.below(4) == 0 { 256 } else { 24 };
        let len = r.below(most);
        v.push(op);
        v.push(len as u8);
        v.extend((0..len).map(|_| r.u8()));
        if op % 4 == 1 || op % 4 == 3 {
            v.push(r.u8());
        }
    }
    if tamper && r.below(4) == 0 {
        let at = r.below(v.len());
        v.truncate(at.max(1));
    }
    v
}

/// The committed seeds: each handshake message as sent and with one byte changed, and streams of each kind.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut hs_bad = vec![0, 1];
    hs_bad.extend([0u8; 47]);
    hs_bad.push(0x80);
    let mut hs2_bad = vec![1, 1, 0x01];
    hs2_bad.extend([0u8; 96]);
    let whole = vec![2, 0, 5, b'h', b'e', b'l', b'l', b'o', 0, 0];
    let split = vec![2, 3, 4, b'p', b'i', b'n', b'g', 3, 0, 2, 1, 0xaa];
    let flipped = vec![2, 0, 3, b'o', b'n', b'e', 0x21, 3, b't', b'w', b'o', 9, 0, 2, b'n', b'o'];
    let noise = vec![2, 0, 1, b'a', 2, 4, 0x00, 0x10, 0xde, 0xad, 0, 1, b'b'];
    let long_len = vec![2, 2, 2, 0xff, 0xff, 0, 1, b'x'];
    vec![
        ("msg1-as-sent", handshake_input_exact(0)),
        ("msg1-one-byte-changed", hs_bad),
        ("msg2-as-sent", handshake_input_exact(1)),
        ("msg2-one-byte-changed", hs2_bad),
        ("stream-whole-records", whole),
        ("stream-split-records", split),
        ("stream-bit-flipped", flipped),
        ("stream-noise", noise),
        ("stream-impossible-length", long_len),
    ]
}

fn handshake_input_exact(mode: u8) -> Vec<u8> {
    vec![mode, 1]
}

#[test]
fn the_committed_seeds_pass_and_reach_every_outcome() {
    let total: Counts = check_seeds(Path::new(SEED_DIR), &seeds(), check);
    assert_eq!(total.handshakes_accepted, 2, "{total:?}");
    assert_eq!(total.handshakes_refused, 2, "{total:?}");
    assert!(total.records_opened >= 5, "{total:?}");
    assert!(total.failed_auth >= 1 && total.failed_length >= 1, "{total:?}");
}

#[test]
fn random_scripts_never_panic_nor_open_other_bytes() {
    let seed = twin_seed(SEED);
    let mut r = Rng(seed);
    let mut total = Counts::default();
    for i in 0..INPUTS {
        let input = match r.below(10) {
            0 => handshake_input(&mut r, 0),
            1 => handshake_input(&mut r, 1),
            2 => (0..r.below(200)).map(|_| r.u8()).collect(),
            3..=5 => stream_input(&mut r, false),
            _ => stream_input(&mut r, true),
        };
        let result = std::panic::catch_unwind(|| check(&input));
        match result {
            Ok(n) => total += n,
            Err(_) => panic!("input #{i} (seed {seed:#x}) failed the check: {input:02x?}"),
        }
    }
    eprintln!("record twin: {INPUTS} inputs, {total:?}");
    assert!(total.handshakes_accepted > 300 && total.handshakes_refused > 600, "{total:?}");
    assert!(total.records_opened > 10_000, "{total:?}");
    assert!(total.failed_auth > 500 && total.failed_length > 500, "{total:?}");
}
