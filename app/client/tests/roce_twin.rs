//! The `roce` fuzz target's stable twin: the same check (`app/client/fuzz/src/roce.rs`) on the committed seeds
//! (`app/client/fuzz/seeds/roce/`) and on 60,000 frames from a seeded xorshift generator — packets of every
//! opcode the cable carries and ARP frames, encoded with random fields, then mutated (bit flips, interesting
//! bytes, truncation, insertion, a lying length), under every repair mode. Deterministic: a failure names its
//! input's index, and `TWIN_SEED` reproduces it. `LEASEBOX_WRITE_SEEDS=1` rewrites the seed files from
//! [`seeds`] before the run.

#[path = "../fuzz/src/roce.rs"]
mod roce_check;

use std::net::Ipv4Addr;
use std::path::Path;

use leasebox_client::rdma::wire::{self, Addr, Aeth, Arp, Bth, Packet, Reth, opcode};
use leasebox_twin::{Rng, check_seeds, twin_seed};
use roce_check::{Counts, check};

const INPUTS: usize = 60_000;
const SEED: u64 = 0x1EA5_EB0C_5EED_0003;
const SEED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/roce");

const OPCODES: [u8; 19] = [
    opcode::SEND_FIRST,
    opcode::SEND_MIDDLE,
    opcode::SEND_LAST,
    opcode::SEND_LAST_WITH_IMM,
    opcode::SEND_ONLY,
    opcode::SEND_ONLY_WITH_IMM,
    opcode::RDMA_WRITE_FIRST,
    opcode::RDMA_WRITE_MIDDLE,
    opcode::RDMA_WRITE_LAST,
    opcode::RDMA_WRITE_LAST_WITH_IMM,
    opcode::RDMA_WRITE_ONLY,
    opcode::RDMA_WRITE_ONLY_WITH_IMM,
    opcode::RDMA_READ_REQUEST,
    opcode::RDMA_READ_RESPONSE_FIRST,
    opcode::RDMA_READ_RESPONSE_MIDDLE,
    opcode::RDMA_READ_RESPONSE_LAST,
    opcode::RDMA_READ_RESPONSE_ONLY,
    opcode::ACKNOWLEDGE,
    opcode::CNP,
];

/// A packet of `op` with random fields, encoded (the extension headers the opcode needs and no others).
fn packet(r: &mut Rng, op: u8) -> Vec<u8> {
    use opcode::*;
    let reth = matches!(op, RDMA_WRITE_FIRST | RDMA_WRITE_ONLY | RDMA_WRITE_ONLY_WITH_IMM | RDMA_READ_REQUEST);
    let aeth = matches!(op, RDMA_READ_RESPONSE_FIRST | RDMA_READ_RESPONSE_LAST | RDMA_READ_RESPONSE_ONLY | ACKNOWLEDGE);
    let imm =
        matches!(op, SEND_LAST_WITH_IMM | SEND_ONLY_WITH_IMM | RDMA_WRITE_LAST_WITH_IMM | RDMA_WRITE_ONLY_WITH_IMM);
    let len = if op == CNP { 16 } else { [0, 1, 2, 3, 4, 64, 255, 1024][r.below(8)] };
    let payload: Vec<u8> = (0..len).map(|_| r.u8()).collect();
    let p = Packet {
        addr: Addr {
            src_mac: r.bytes::<6>(),
            dst_mac: r.bytes::<6>(),
            src_ip: Ipv4Addr::from(r.u32()),
            dst_ip: Ipv4Addr::from(r.u32()),
            src_port: r.u32() as u16,
            dst_port: wire::ROCEV2_PORT,
            tos: r.u8(),
            ttl: r.u8(),
        },
        bth: Bth {
            opcode: op,
            se: r.below(2) == 0,
            mig: r.below(2) == 0,
            pad: 0,
            pkey: r.u32() as u16,
            dest_qp: r.u32() & 0xFF_FFFF,
            ack_req: r.below(2) == 0,
            psn: r.u32() & wire::PSN_MASK,
        },
        reth: reth.then(|| Reth { va: r.next(), rkey: r.u32(), len: r.u32() }),
        aeth: aeth.then(|| Aeth { syndrome: r.u8(), msn: r.u32() & 0xFF_FFFF }),
        imm: imm.then(|| r.u32()),
        payload: &payload,
    };
    let mut out = Vec::new();
    wire::encode(&p, &mut out).unwrap();
    out
}

fn arp(r: &mut Rng) -> Vec<u8> {
    let q = Arp::request(r.bytes::<6>(), Ipv4Addr::from(r.u32()), Ipv4Addr::from(r.u32()));
    let a = if r.below(2) == 0 { q } else { q.reply_from(r.bytes::<6>()) };
    let mut out = Vec::new();
    wire::encode_arp(&a, &mut out);
    out
}

/// Random edits: bit flips, interesting bytes, insertions, deletions, truncation, a lying IPv4 total length, a
/// BTH opcode or PadCnt byte.
fn mutate(r: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + r.below(3) {
        if b.is_empty() {
            b.push(r.u8());
            continue;
        }
        let at = r.below(b.len());
        match r.below(7) {
            // The BTH opcode or PadCnt byte: past the ICRC when the mode repairs it.
            6 if b.len() > 43 => b[42 + r.below(2)] = r.u8(),
            0 => b[at] ^= 1 << r.below(8),
            1 => b[at] = [0, 1, 0x0f, 0x10, 0x7f, 0x80, 0x81, 0xff][r.below(8)],
            2 => b.insert(at, r.u8()),
            3 => {
                b.remove(at);
            }
            4 => b.truncate(at),
            _ if b.len() >= 18 => {
                let len = match r.below(3) {
                    0 => r.below(64) as u16,
                    1 => (b.len() - 14 + r.below(9) - 4) as u16,
                    _ => r.u32() as u16,
                };
                b[16..18].copy_from_slice(&len.to_be_bytes());
            }
            _ => {}
        }
    }
}

/// The committed seeds: one packet of each opcode and both ARP operations, as encoded (mode 0), and a few
/// mutated ones under each repair mode.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0x5EED);
    let mut out = Vec::new();
    for op in OPCODES {
        let mut f = vec![0];
        f.extend(packet(&mut r, op));
        out.push((format!("packet-{op:02x}"), f));
    }
    for name in ["arp-a", "arp-b"] {
        let mut f = vec![0];
        f.extend(arp(&mut r));
        out.push((name.to_string(), f));
    }
    for mode in 0..8u8 {
        let op = OPCODES[r.below(OPCODES.len())];
        let mut f = packet(&mut r, op);
        mutate(&mut r, &mut f);
        f.insert(0, mode);
        out.push((format!("mutated-mode{mode}"), f));
    }
    out
}

#[test]
fn the_committed_seeds_pass_and_reach_every_outcome() {
    let total: Counts = check_seeds(Path::new(SEED_DIR), &seeds(), check);
    assert!(total.packets >= OPCODES.len() as u64, "{total:?}");
    assert!(total.arps >= 2 && total.refused >= 1, "{total:?}");
}

#[test]
fn random_and_mutated_frames_never_panic_and_round_trip() {
    let seed = twin_seed(SEED);
    let mut r = Rng(seed);
    let mut total = Counts::default();
    for i in 0..INPUTS {
        let mut input = match r.below(10) {
            0 => (0..r.below(120)).map(|_| r.u8()).collect(),
            1 => arp(&mut r),
            _ => {
                let op = OPCODES[r.below(OPCODES.len())];
                packet(&mut r, op)
            }
        };
        if r.below(5) != 0 {
            mutate(&mut r, &mut input);
        }
        input.insert(0, r.u8());
        let result = std::panic::catch_unwind(|| check(&input));
        match result {
            Ok(n) => total += n,
            Err(_) => panic!("input #{i} (seed {seed:#x}) failed the check: {input:02x?}"),
        }
    }
    eprintln!("roce twin: {INPUTS} inputs, {total:?}");
    assert!(total.packets > 12_000, "{total:?}");
    assert!(total.refused_past_icrc > 1_000, "{total:?}");
    assert!(total.arps > 1_000, "{total:?}");
}
