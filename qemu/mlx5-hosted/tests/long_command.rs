//! A command longer than a slot's own mailbox chain (`cmdq::SLOT_BLOCKS` blocks): the chain the driver builds
//! for it, block by block as the PRM lays it out (`mlx5_cmd_prot_block`: data, `next`, `block_num`, `token`,
//! `ctrl_sig`, `sig`; docs/reference/mlx5.md §c), the model's verdict on it (delivered; refused once one block
//! is broken), and the extra DMA memory going back once the slot is free. Then a CREATE_MKEY whose MTT list
//! needs such a chain, end to end.

mod common;

use std::sync::Arc;

use leasebox_mlx5::cmdq::{BLOCK_DATA, CmdQueue, Completion, MAX_MSG, SLOT_BLOCKS};
use leasebox_mlx5::command::{Command, ErrorKind};
use leasebox_mlx5::ifc::mkey::{MAX_MTT_PAGES, MkeyAccess};
use leasebox_mlx5::initseg;
use leasebox_mlx5::platform::Platform;
use mlx5_hosted::HostedPlatform;

/// ACCESS_REG: any opcode serves; what matters is that the transport delivers it.
const OPCODE: u16 = leasebox_mlx5::ifc::opcode::MLX5_CMD_OP_ACCESS_REG;
/// Input blocks: three pieces of the chain, the last one partly used.
const IN_BLOCKS: usize = 2 * SLOT_BLOCKS + 9;
const OUT_BLOCKS: usize = SLOT_BLOCKS + 4;

fn xor(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

/// A platform whose model is out of reset and a queue on it (no ENABLE_HCA: the transport is what is tested).
fn queue() -> (Arc<HostedPlatform>, CmdQueue) {
    let p = common::platform(common::model_config());
    while initseg::initializing(p.as_ref()) {
        p.relax();
    }
    let q = CmdQueue::new(p.as_ref(), 2_000).unwrap();
    (p, q)
}

fn long_command(seed: u8) -> Command {
    let mut c = Command::new(OPCODE, 0, 16 + IN_BLOCKS * BLOCK_DATA - 100, 16 + OUT_BLOCKS * BLOCK_DATA);
    for (i, b) in c.input_mut()[16..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7) ^ seed;
    }
    c
}

fn ram(p: &HostedPlatform, addr: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    p.ram().read(addr, &mut b).unwrap();
    b
}

/// The entry of slot 0 as the driver wrote it.
fn entry(p: &HostedPlatform) -> Vec<u8> {
    let base = (u64::from(p.bar_read32(initseg::CMDQ_ADDR_H)) << 32)
        | u64::from(p.bar_read32(initseg::CMDQ_ADDR_L_SZ) & !0xfff);
    ram(p, base, 64)
}

/// Walks `n` blocks from `first`, checking the chain fields; returns each block's address and bytes.
fn walk(p: &HostedPlatform, first: u64, n: usize, token: u8, signed_data: bool) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = first;
    for i in 0..n {
        assert_eq!(at % 1024, 0, "block {i} at {at:#x}: blocks are 1 KiB aligned");
        let b = ram(p, at, 0x240);
        let next = u64::from_be_bytes(b[0x230..0x238].try_into().unwrap());
        assert_eq!(u32::from_be_bytes(b[0x238..0x23c].try_into().unwrap()), i as u32, "block_num of block {i}");
        assert_eq!(b[0x23d], token, "token of block {i}");
        assert_eq!(xor(&b[0x200..0x23f]), 0xff, "ctrl_sig of block {i}");
        if signed_data {
            assert_eq!(xor(&b), 0xff, "sig of block {i}");
        }
        if i + 1 == n {
            assert_eq!(next, 0, "the last block ends the chain");
        } else {
            assert_ne!(next, 0, "block {i} links to the next");
        }
        out.push((at, b));
        at = next;
    }
    out
}

fn wait(p: &HostedPlatform, q: &mut CmdQueue) -> Completion {
    let mut done = Vec::new();
    for _ in 0..10_000 {
        p.relax();
        q.poll(p, &mut done);
        if let Some(c) = done.pop() {
            return c;
        }
    }
    panic!("no completion");
}

#[test]
fn a_long_command_gets_a_chain_as_long_as_it_needs_laid_out_as_the_prm_says() {
    let (p, mut q) = queue();
    let free = p.dma_free_bytes();
    let cmd = long_command(0x5a);
    q.submit(p.as_ref(), 1, &cmd).unwrap();
    assert!(p.dma_free_bytes() < free, "the chain grew into further DMA pieces");

    let e = entry(&p);
    assert_eq!(xor(&e), 0xff, "entry signature");
    assert_eq!(u32::from_be_bytes(e[0x04..0x08].try_into().unwrap()) as usize, cmd.input().len());
    assert_eq!(u32::from_be_bytes(e[0x38..0x3c].try_into().unwrap()) as usize, cmd.out_len());
    assert_eq!(&e[0x10..0x20], &cmd.input()[..16], "the header travels inline");
    let token = e[0x3c];
    let in_ptr = u64::from_be_bytes(e[0x08..0x10].try_into().unwrap());
    let out_ptr = u64::from_be_bytes(e[0x30..0x38].try_into().unwrap());

    let ins = walk(&p, in_ptr, IN_BLOCKS, token, true);
    let data: Vec<u8> = ins.iter().flat_map(|(_, b)| b[..BLOCK_DATA].to_vec()).collect();
    assert_eq!(&data[..cmd.input().len() - 16], &cmd.input()[16..], "the input, 512 bytes per block, in order");
    assert!(data[cmd.input().len() - 16..].iter().all(|&b| b == 0), "the last block is padded with zeros");
    // Three pieces of SLOT_BLOCKS blocks, each 1 KiB steps inside.
    for (i, w) in ins.windows(2).enumerate() {
        if (i + 1) % SLOT_BLOCKS != 0 {
            assert_eq!(w[1].0, w[0].0 + 1024, "blocks {i} and {} sit in one piece", i + 1);
        }
    }
    // The output chain carries block numbers and tokens; the device writes data and signatures.
    let outs = walk(&p, out_ptr, OUT_BLOCKS, token, false);
    let chains: std::collections::BTreeSet<u64> = ins.iter().chain(&outs).map(|(a, _)| *a).collect();
    assert_eq!(chains.len(), IN_BLOCKS + OUT_BLOCKS, "no block is shared");

    // The model walks the chain and delivers the command (its answer is the command's business).
    let c = wait(&p, &mut q);
    assert_eq!(c.tag, 1);
    if let Err(e) = &c.result {
        assert!(matches!(e.kind, ErrorKind::Status { .. }), "delivered, then answered: {e}");
    }
    assert_eq!(p.dma_free_bytes(), free, "the extra pieces went back when the slot became free");
    assert_eq!(p.dma_faults(), 0);
}

#[test]
fn the_model_refuses_a_long_chain_with_one_broken_block() {
    type Break = fn(&mut [u8]);
    let cases: [(&str, Break, u8); 3] = [
        ("block_num", |b| b[0x23b] ^= 1, 0x3),
        ("token", |b| b[0x23d] ^= 0xff, 0x2),
        ("next", |b| b[0x237] |= 0x10, 0x5),
    ];
    for (what, break_it, delivery) in cases {
        let (p, mut q) = queue();
        q.submit(p.as_ref(), 7, &long_command(1)).unwrap();
        let e = entry(&p);
        let in_ptr = u64::from_be_bytes(e[0x08..0x10].try_into().unwrap());
        // Block 20 sits in the chain's second piece.
        let ins = walk(&p, in_ptr, IN_BLOCKS, e[0x3c], true);
        let (addr, mut b) = ins[20].clone();
        break_it(&mut b);
        p.ram().write(addr, &b).unwrap();
        let c = wait(&p, &mut q);
        let err = c.result.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Delivery { status: delivery }, "{what}: {err}");
    }
}

#[test]
fn nothing_longer_than_the_longest_chain_is_posted() {
    let (p, mut q) = queue();
    let cmd = Command::new(OPCODE, 0, MAX_MSG + 1, 16);
    let e = q.submit(p.as_ref(), 1, &cmd).unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge { len: MAX_MSG + 1 });
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn an_mkey_whose_mtt_list_outgrows_the_slot_chain_is_created_and_translates_every_page() {
    let mut d = common::up();
    // 3000 pages of 4 KiB: 24,000 bytes of MTT list, 47 blocks.
    let n = 3000;
    let run = d.platform().dma_alloc(n * 4096, 4096).unwrap().addr();
    let pages: Vec<u64> = (0..n as u64).map(|i| run + i * 4096).collect();
    assert!(n <= MAX_MTT_PAGES);
    let pd = d.alloc_pd().unwrap();
    let mkey = d.create_mkey(pd, run, (n * 4096) as u64, MkeyAccess::REMOTE_WRITE, 12, &pages).unwrap();
    let info = d.platform().model().unwrap().mkey(mkey.0).unwrap();
    assert_eq!(info.mtt.len(), n, "every MTT entry reached the device");
    assert_eq!(info.mtt.last().unwrap().addr, pages[n - 1]);
}
