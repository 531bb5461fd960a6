//! The `rings` fuzz target's stable twin: the same check (`drivers/mlx5/fuzz/src/rings.rs`) on the committed
//! seeds (`drivers/mlx5/fuzz/seeds/rings/`) and on 20,000 inputs from a seeded xorshift generator — a device
//! that writes CQEs and EQEs in ring order with the right owner bit (every CQE opcode, error syndromes, every
//! event type), one that writes the wrong phase or the wrong slot, and random bytes. Deterministic: a failure
//! names its input's index, and `TWIN_SEED` reproduces it. `LEASEBOX_WRITE_SEEDS=1` rewrites the seed files
//! from [`seeds`] before the run.

#[path = "../fuzz/src/rings.rs"]
mod rings_check;

use std::path::Path;

use leasebox_mlx5::ifc::cq::CQE_OP_OWN_BYTE;
use leasebox_mlx5::ifc::eq::{EQE_OWNER_BYTE, MLX5_EVENT_TYPE_PAGE_REQUEST, MLX5_EVENT_TYPE_PORT_CHANGE};
use leasebox_twin::{Rng, check_seeds, twin_seed};
use rings_check::{Counts, WRITE_LEN, check};

const INPUTS: usize = 20_000;
const SEED: u64 = 0x1EA5_EB0C_5EED_0004;
const SEED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/rings");

/// Event types an EQ of this driver sees, and a few it does not.
const EVENT_TYPES: [u8; 12] = [0x00, 0x01, 0x04, 0x05, 0x08, 0x09, 0x0a, 0x0b, 0x0d, 0x13, 0x22, 0xff];

/// One input: ring kind, log size, and `writes` device writes; `faithful`: all in ring order with the right
/// owner bit, else some at a random slot or with the wrong phase, and the input maybe cut short.
fn input(r: &mut Rng, eq: bool, log_size: u8, writes: usize, faithful: bool) -> Vec<u8> {
    let mut v = vec![u8::from(eq) | log_size << 1];
    for pi in 0..writes {
        let mut e: Vec<u8> = (0..64).map(|_| r.u8()).collect();
        // The index byte is taken modulo the ring size (at most 128), so `pi as u8` names slot `pi % size`.
        let index = if faithful || r.below(4) != 0 { pi as u8 } else { r.u8() };
        let phase = ((pi >> log_size) & 1) as u8;
        let phase = if faithful || r.below(8) != 0 { phase } else { phase ^ 1 };
        if eq {
            e[1] = EVENT_TYPES[r.below(EVENT_TYPES.len())];
            if e[1] == MLX5_EVENT_TYPE_PORT_CHANGE {
                e[3] = [1, 4, 5][r.below(3)];
                e[0x28] = (r.below(3) as u8) << 4;
            }
            e[EQE_OWNER_BYTE] = (e[EQE_OWNER_BYTE] & !1) | phase;
        } else {
            let opcode = [0u8, 1, 2, 3, 4, 5, 13, 14, 15, 0][r.below(10)];
            e[CQE_OP_OWN_BYTE] = opcode << 4 | (e[CQE_OP_OWN_BYTE] & 0x0e) | phase;
        }
        v.push(index);
        v.extend(e);
    }
    if !faithful && r.below(3) == 0 {
        let cut = r.below(v.len());
        v.truncate(cut.max(1));
    }
    v
}

/// The committed seeds: each ring at three sizes, written faithfully past one wrap and disorderly, and a page
/// request that gives pages back.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0x5EED);
    let mut out = Vec::new();
    for (eq, name) in [(false, "cq"), (true, "eq")] {
        for log_size in [0u8, 2, 4] {
            let writes = (3usize << log_size).min(40);
            out.push((format!("{name}-log{log_size}-in-order"), input(&mut r, eq, log_size, writes, true)));
            out.push((format!("{name}-log{log_size}-disorderly"), input(&mut r, eq, log_size, writes, false)));
        }
    }
    let mut page = vec![1, 0];
    page.extend([0u8; 64]);
    page[2 + 1] = MLX5_EVENT_TYPE_PAGE_REQUEST;
    page[2 + 0x24..2 + 0x28].copy_from_slice(&(-3i32).to_be_bytes());
    out.push(("eq-page-request-giving-back".to_string(), page));
    out
}

#[test]
fn the_committed_seeds_pass_and_reach_every_outcome() {
    let total: Counts = check_seeds(Path::new(SEED_DIR), &seeds(), check);
    assert!(total.cqes > 20 && total.cqe_errors > 0 && total.eqes > 20, "{total:?}");
    assert!(total.page_requests > 0 && total.port_changes > 0 && total.wraps > 2, "{total:?}");
}

#[test]
fn random_device_writes_never_panic_nor_confuse_the_rings() {
    let seed = twin_seed(SEED);
    let mut r = Rng(seed);
    let mut total = Counts::default();
    for i in 0..INPUTS {
        let input = match r.below(8) {
            0 => (0..r.below(4 * WRITE_LEN)).map(|_| r.u8()).collect(),
            k => {
                let log_size = r.below(8) as u8;
                let writes = 1 + r.below(3usize << log_size.min(4));
                input(&mut r, k % 2 == 0, log_size, writes, k < 5)
            }
        };
        let result = std::panic::catch_unwind(|| check(&input));
        match result {
            Ok(n) => total += n,
            Err(_) => panic!("input #{i} (seed {seed:#x}) failed the check: {input:02x?}"),
        }
    }
    eprintln!("rings twin: {INPUTS} inputs, {total:?}");
    assert!(total.cqes > 25_000 && total.cqe_errors > 5_000 && total.eqes > 50_000, "{total:?}");
    assert!(total.page_requests > 2_000 && total.port_changes > 2_000 && total.wraps > 5_000, "{total:?}");
}
