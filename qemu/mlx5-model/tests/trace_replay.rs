//! Replays, in trace order, every command INPUT of `tests/data/trace-mlx5_core-connectx4.txt.gz` (Linux
//! mlx5_core against a real ConnectX-4) whose opcode the model implements, and checks status, the trace's
//! output length and the output fields Linux went on to use.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Drv, be32};
use mlx5_model::ModelConfig;

/// A copy of the reference trace (Linux mlx5_core ↔ ConnectX-4 command hexdump), kept in the repository so the
/// test runs on a clean clone.
const TRACE: &str = "tests/data/trace-mlx5_core-connectx4.txt.gz";
const IMPLEMENTED: &[u16] = &[
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x107, 0x108, 0x109, 0x10a, 0x10b, 0x200, 0x201, 0x202, 0x800, 0x801,
    0x802, 0x803, 0x816, 0x817, 0x301, 0x805,
];

struct Dump {
    opcode: u16,
    input: bool,
    /// Dump offset → 32-bit word, as printed (entry at 0x000, then 576-byte blocks from 0x040).
    words: Vec<(usize, u32)>,
}

fn parse(text: &str) -> Vec<Dump> {
    let mut out: Vec<Dump> = Vec::new();
    for line in text.lines() {
        if let Some(i) = line.find("dump command ") {
            let rest = &line[i..];
            let (Some(a), Some(b)) = (rest.rfind("(0x"), rest.rfind(')')) else { continue };
            let opcode = u16::from_str_radix(&rest[a + 3..b], 16).unwrap();
            out.push(Dump { opcode, input: rest.ends_with("INPUT"), words: Vec::new() });
            continue;
        }
        let Some(close) = line.find("] ") else { continue };
        let body = line[close + 2..].trim();
        let Some((off, words)) = body.split_once(": ") else { continue };
        let Ok(off) = usize::from_str_radix(off, 16) else { continue };
        let ws: Vec<&str> = words.split_whitespace().collect();
        if ws.len() != 4 || ws.iter().any(|w| w.len() != 8) {
            continue;
        }
        if let Some(d) = out.last_mut() {
            for (k, w) in ws.iter().enumerate() {
                d.words.push((off + 4 * k, u32::from_str_radix(w, 16).unwrap()));
            }
        }
    }
    out
}

impl Dump {
    fn bytes(&self) -> Vec<u8> {
        let n = self.words.iter().map(|&(o, _)| o + 4).max().unwrap_or(0);
        let mut b = vec![0u8; n];
        for &(o, w) in &self.words {
            b[o..o + 4].copy_from_slice(&w.to_be_bytes());
        }
        b
    }
    /// The whole input or output structure: 16 inline bytes, then 512 data bytes per dumped block; blocks
    /// the trace did not dump read as zero.
    fn structure(&self, input: bool) -> (Vec<u8>, usize) {
        let b = self.bytes();
        let len = be32(&b, if input { 4 } else { 0x38 }) as usize;
        let inline = if input { 0x10 } else { 0x20 };
        let mut s = b[inline..inline + 16].to_vec();
        let mut at = 0x40;
        while at < b.len() {
            s.extend_from_slice(&b[at..(at + 512).min(b.len())]);
            at += 576;
        }
        s.resize(len.max(16), 0);
        (s, len)
    }
}

#[test]
fn replay_connectx4_trace() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    let text = Command::new("zcat").arg(&path).output().expect("zcat");
    assert!(text.status.success(), "zcat {}", path.display());
    let dumps = parse(&String::from_utf8_lossy(&text.stdout));
    assert_eq!(dumps.len(), 84);

    // The replay compares capability blocks byte for byte: it pins the trace's ConnectX-4 profile (the model's
    // default is the ConnectX-5 one).
    let cfg = ModelConfig { caps: mlx5_model::caps::CapsProfile::ConnectX4Trace, ..ModelConfig::instant() };
    let mut d = Drv::with(cfg, 64 << 20);
    let (mut replayed, mut skipped) = (0, Vec::new());
    for pair in dumps.chunks(2) {
        let [i, o] = pair else { panic!("unpaired dump") };
        assert!(i.input && !o.input && i.opcode == o.opcode);
        if !IMPLEMENTED.contains(&i.opcode) {
            skipped.push(i.opcode);
            continue;
        }
        let (mut input, _) = i.structure(true);
        let (want, out_len) = o.structure(false);
        if i.opcode == 0x108 && be32(&input, 4) & 0xffff == 1 {
            // The trace's page addresses are host-physical addresses of the real machine; give pages of the
            // test RAM instead (same count, same order).
            let n = be32(&input, 12) as usize;
            for k in 0..n {
                input[16 + 8 * k..24 + 8 * k].copy_from_slice(&d.next_page.to_be_bytes());
                d.next_page += 4096;
            }
        }
        if i.opcode == 0x301 {
            // EQ buffers: the trace's PAS are host-physical too; give test RAM pages of the EQ's page size.
            let log_page_size = input[0x28] & 0x1f;
            let ps = 4096u64 << log_page_size;
            let n = input.len().saturating_sub(0x110) / 8;
            d.next_page = d.next_page.next_multiple_of(ps);
            for k in 0..n {
                input[0x110 + 8 * k..0x118 + 8 * k].copy_from_slice(&d.next_page.to_be_bytes());
                d.next_page += ps;
            }
        }
        let r = d.exec(&input, out_len);
        assert_eq!((r.delivery, r.status()), (0, 0), "opcode {:#x} syndrome {:#x}", i.opcode, r.syndrome());
        assert_eq!(r.out.len(), out_len.max(16));
        let op_mod = be32(&input, 4) & 0xffff;
        match i.opcode {
            0x107 => assert_eq!(be32(&r.out, 12), be32(&want, 12), "QUERY_PAGES op_mod {op_mod} num_pages"),
            0x10a => {
                assert_eq!(be32(&r.out, 0x6c), be32(&want, 0x6c), "supported_issi_dw0");
                assert_eq!(be32(&r.out, 8), be32(&want, 8), "current_issi");
            }
            // Capability blocks: byte-for-byte what the ConnectX-4 returned, before and after SET_HCA_CAP.
            0x100 => assert!(r.out[0x10..] == want[0x10..], "QUERY_HCA_CAP op_mod {op_mod:#x}"),
            0x101 => assert_eq!(r.out, want, "QUERY_ADAPTER"),
            0x802 => assert_eq!(be32(&r.out, 8), be32(&want, 8), "ALLOC_UAR index"),
            0x301 => assert_eq!(r.out[0xb], want[0xb], "CREATE_EQ eq_number"),
            _ => {}
        }
        replayed += 1;
    }
    assert_eq!(replayed, 42);
    skipped.sort();
    skipped.dedup();
    assert_eq!(skipped, Vec::<u16>::new());
}
