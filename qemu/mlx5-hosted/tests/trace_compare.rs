//! The driver's own encoding against Linux's, byte by byte. `../mlx5-model/tests/data/trace-mlx5_core-connectx4.txt.gz`
//! is a kernel log of Linux mlx5_core bringing up a real ConnectX-4 (firmware 14.12.1220) with every command
//! dumped. For each command input in it, this test builds the same command with the driver's builders
//! (`leasebox_mlx5::ifc`), with the parameters read from the trace where they are data (op_mod, ISSI, page
//! addresses, the capability block, the EQ's context), and compares the two structures byte by byte; a second
//! set of comparisons builds the commands with the parameters the driver's bring-up itself chooses (its
//! SET_HCA_CAP policy over the trace's capabilities, its one polled EQ, its page batches); a third puts each
//! command through the driver's command queue and compares the entry and mailbox blocks around it with
//! Linux's.
//!
//! Every byte range that differs is listed with its reason. The test fails on a difference not listed and on a
//! listed difference that no longer occurs (a stale explanation). The trace replay (mlx5-model's
//! `trace_replay.rs`) checks the model against the same trace; this test checks the driver against Linux, with
//! no model in between. docs/mlx5-driver.md ("Against Linux's trace") summarises the result.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use leasebox_mlx5::Platform;
use leasebox_mlx5::cmdq::CmdQueue;
use leasebox_mlx5::driver::{Config, EQ_EVENTS};
use leasebox_mlx5::engine::PAGES_PER_COMMAND;
use leasebox_mlx5::handles::UarPage;
use leasebox_mlx5::ifc::{eq, init, resources};
use leasebox_mlx5::initseg;
use leasebox_mlx5::{Command, Output};
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;

const TRACE: &str = "../mlx5-model/tests/data/trace-mlx5_core-connectx4.txt.gz";

/// Opcodes (`mlx5_ifc.h`), named here independently of the driver's constants.
const ENABLE_HCA: u16 = 0x104;
const QUERY_ISSI: u16 = 0x10a;
const SET_ISSI: u16 = 0x10b;
const QUERY_PAGES: u16 = 0x107;
const MANAGE_PAGES: u16 = 0x108;
const ACCESS_REG: u16 = 0x805;
const QUERY_HCA_CAP: u16 = 0x100;
const SET_HCA_CAP: u16 = 0x109;
const INIT_HCA: u16 = 0x102;
const QUERY_ADAPTER: u16 = 0x101;
const ALLOC_UAR: u16 = 0x802;
const CREATE_EQ: u16 = 0x301;

// ---- The trace ------------------------------------------------------------------------------------------

/// One `dump command NAME(0xOP) INPUT|OUTPUT` block: dump offset → byte (the 64-byte command queue entry at
/// 0x000, then 576-byte mailbox blocks from 0x040, as far as Linux printed them).
struct Dump {
    opcode: u16,
    input: bool,
    bytes: BTreeMap<usize, u8>,
}

impl Dump {
    fn byte(&self, at: usize) -> u8 {
        self.bytes
            .get(&at)
            .copied()
            .unwrap_or_else(|| panic!("opcode {:#x}: entry byte {at:#x} not dumped", self.opcode))
    }

    fn entry_be32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.byte(at), self.byte(at + 1), self.byte(at + 2), self.byte(at + 3)])
    }

    /// The `*_in` / `*_out` structure of `len` bytes: 16 bytes inline in the entry (input at 0x10, output at
    /// 0x20), then 512 data bytes per mailbox block; `None` where the trace did not print the byte.
    fn structure(&self, inline_at: usize, len: usize) -> Vec<Option<u8>> {
        (0..len)
            .map(|i| {
                let at = if i < 16 { inline_at + i } else { 0x40 + 576 * ((i - 16) / 512) + (i - 16) % 512 };
                self.bytes.get(&at).copied()
            })
            .collect()
    }
}

/// A command as Linux sent it, with the output the ConnectX-4 returned.
struct Sent {
    /// Position among the trace's commands (0-based), for messages.
    index: usize,
    opcode: u16,
    op_mod: u16,
    /// Entry `input_length` / `output_length`.
    in_len: usize,
    out_len: usize,
    input: Vec<Option<u8>>,
    output: Vec<Option<u8>>,
    /// The INPUT dump as printed: the entry at 0x00, mailbox block k's 576 bytes at 0x40 + 576 k.
    frame: BTreeMap<usize, u8>,
}

impl Sent {
    /// Byte `at` of the input; the test only asks for bytes the trace holds.
    fn b(&self, at: usize) -> u8 {
        self.input[at].unwrap_or_else(|| {
            panic!("command {} ({:#x}): input byte {at:#x} not in the trace", self.index, self.opcode)
        })
    }

    fn be16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.b(at), self.b(at + 1)])
    }

    fn be32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.b(at), self.b(at + 1), self.b(at + 2), self.b(at + 3)])
    }

    fn be64(&self, at: usize) -> u64 {
        (u64::from(self.be32(at)) << 32) | u64::from(self.be32(at + 4))
    }

    /// The output as the driver's parsers take it (bytes the trace did not print read as zero).
    fn output(&self) -> Output {
        Output::new(self.output.iter().map(|b| b.unwrap_or(0)).collect())
    }

    /// Whether every output byte in `range` is in the trace.
    fn output_known(&self, range: Range<usize>) -> bool {
        self.output[range].iter().all(Option::is_some)
    }
}

fn parse(text: &str) -> Vec<Dump> {
    let mut dumps: Vec<Dump> = Vec::new();
    for line in text.lines() {
        if let Some(at) = line.find("dump command ") {
            let rest = &line[at..];
            let (Some(open), Some(close)) = (rest.rfind("(0x"), rest.rfind(')')) else { continue };
            let opcode = u16::from_str_radix(&rest[open + 3..close], 16).expect("opcode");
            let input = match &rest[close + 1..] {
                " INPUT" => true,
                " OUTPUT" => false,
                other => panic!("dump direction {other:?}"),
            };
            dumps.push(Dump { opcode, input, bytes: BTreeMap::new() });
            continue;
        }
        // Hex lines: `[  +0.000004] 010: 01040000 00000000 00000000 00000000`.
        let Some(close) = line.find("] ") else { continue };
        let Some((off, words)) = line[close + 2..].trim().split_once(": ") else { continue };
        if off.len() != 3 {
            continue;
        }
        let Ok(off) = usize::from_str_radix(off, 16) else { continue };
        let words: Vec<&str> = words.split_whitespace().collect();
        if words.len() != 4 || words.iter().any(|w| w.len() != 8) {
            continue;
        }
        let Some(d) = dumps.last_mut() else { continue };
        for (k, w) in words.iter().enumerate() {
            let w = u32::from_str_radix(w, 16).expect("hex word");
            for (j, b) in w.to_be_bytes().into_iter().enumerate() {
                d.bytes.insert(off + 4 * k + j, b);
            }
        }
    }
    dumps
}

/// The trace's commands in order (each INPUT dump with the OUTPUT dump that follows it).
fn trace() -> &'static [Sent] {
    static SENT: OnceLock<Vec<Sent>> = OnceLock::new();
    SENT.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
        let out = std::process::Command::new("zcat").arg(&path).output().expect("run zcat");
        assert!(out.status.success(), "zcat {}", path.display());
        let dumps = parse(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(dumps.len(), 84, "the trace holds 42 commands, each dumped as INPUT and OUTPUT");
        dumps
            .chunks(2)
            .enumerate()
            .map(|(index, pair)| {
                let [i, o] = pair else { unreachable!() };
                assert!(i.input && !o.input && i.opcode == o.opcode, "command {index}: unpaired dump");
                let in_len = i.entry_be32(0x04) as usize;
                let out_len = i.entry_be32(0x38) as usize;
                assert_eq!(o.entry_be32(0x38) as usize, out_len);
                let input = i.structure(0x10, in_len);
                let output = o.structure(0x20, out_len);
                let op_mod = u16::from_be_bytes([i.byte(0x16), i.byte(0x17)]);
                assert_eq!(u16::from_be_bytes([i.byte(0x10), i.byte(0x11)]), i.opcode);
                assert_eq!(o.byte(0x20), 0, "command {index} ({:#x}) failed in the trace", i.opcode);
                Sent { index, opcode: i.opcode, op_mod, in_len, out_len, input, output, frame: i.bytes.clone() }
            })
            .collect()
    })
}

/// The `n`th (0-based) command of the trace with this opcode and op_mod.
fn nth(opcode: u16, op_mod: u16, n: usize) -> &'static Sent {
    trace()
        .iter()
        .filter(|s| s.opcode == opcode && s.op_mod == op_mod)
        .nth(n)
        .unwrap_or_else(|| panic!("no command {opcode:#x}/{op_mod:#x} #{n} in the trace"))
}

// ---- The comparison -------------------------------------------------------------------------------------

/// Where an explained difference lies.
#[derive(Clone, Debug, PartialEq)]
enum Span {
    /// The entry's `input_length`.
    InLen,
    /// The entry's `output_length`.
    OutLen,
    /// Bytes of the `*_in` structure (where one side is shorter, bytes only the other has).
    Bytes(Range<usize>),
}

/// An explained difference: where, and why.
type Why = (Span, &'static str);

/// What a comparison found.
struct Compared {
    /// Input bytes both sides have and the trace holds.
    bytes: usize,
}

/// Compares the driver's `ours` with Linux's `linux` byte by byte. Panics on a difference `expected` does not
/// explain, and on an expected difference that does not occur.
fn compare(what: &str, linux: &Sent, ours: &Command, expected: &[Why]) -> Compared {
    let theirs = &linux.input;
    let mine = ours.input();
    let mut differing = Vec::new();
    let mut bytes = 0;
    for i in 0..theirs.len().max(mine.len()) {
        match (theirs.get(i), mine.get(i)) {
            (Some(Some(l)), Some(o)) => {
                bytes += 1;
                if l != o {
                    differing.push(i);
                }
            }
            // Bytes the trace did not print are not compared.
            (Some(None), _) => {}
            // One side is longer.
            (Some(Some(_)), None) | (None, Some(_)) => differing.push(i),
            (None, None) => unreachable!(),
        }
    }
    let show = |i: usize| {
        let l = theirs.get(i).map_or("-".to_string(), |b| b.map_or("?".into(), |b| format!("{b:02x}")));
        let o = mine.get(i).map_or("-".to_string(), |b| format!("{b:02x}"));
        format!("{i:#x}: linux {l} ours {o}")
    };
    let mut problems = Vec::new();
    for &i in &differing {
        if !expected.iter().any(|(s, _)| matches!(s, Span::Bytes(r) if r.contains(&i))) {
            problems.push(format!("unexplained byte {}", show(i)));
        }
    }
    let len_differs = [(Span::InLen, linux.in_len != mine.len()), (Span::OutLen, linux.out_len != ours.out_len())];
    for (span, differs) in &len_differs {
        let listed = expected.iter().any(|(s, _)| s == span);
        if *differs && !listed {
            problems.push(format!(
                "unexplained {span:?}: linux {:#x}/{:#x}, ours {:#x}/{:#x}",
                linux.in_len,
                linux.out_len,
                mine.len(),
                ours.out_len()
            ));
        }
        if !*differs && listed {
            problems.push(format!("stale explanation: {span:?} no longer differs"));
        }
    }
    for (span, why) in expected {
        if let Span::Bytes(r) = span
            && !differing.iter().any(|i| r.contains(i))
        {
            problems.push(format!("stale explanation: bytes {r:#x?} no longer differ ({why})"));
        }
    }
    assert!(
        problems.is_empty(),
        "{what} (trace command {}, opcode {:#x} op_mod {:#x}):\n  {}",
        linux.index,
        linux.opcode,
        linux.op_mod,
        problems.join("\n  ")
    );
    assert!(bytes >= 16.min(mine.len()), "{what}: nothing compared");
    Compared { bytes }
}

// ---- Parameters read from Linux's commands --------------------------------------------------------------

/// `create_eq_in` as Linux filled it: `eqc` at byte 0x10 (`log_eq_size` byte 0x1c bits 4:0, `uar_page` bytes
/// 0x1d..0x20, `intr` bytes 0x26..0x28 bits 11:0, `log_page_size` byte 0x28 bits 4:0), `event_bitmask[0]` at
/// 0x58, `pas[]` from 0x110 (offsets from `mlx5_ifc.h` via `offsetof`, docs/reference/mlx5.md §0).
struct LinuxEq {
    log_eq_size: u8,
    uar: u32,
    intr: u16,
    log_page_size: u8,
    mask: u64,
    pages: Vec<u64>,
}

fn linux_eq(s: &Sent) -> LinuxEq {
    LinuxEq {
        log_eq_size: s.b(0x1c) & 0x1f,
        uar: s.be32(0x1c) & 0x00ff_ffff,
        intr: s.be16(0x26) & 0x0fff,
        log_page_size: s.b(0x28) & 0x1f,
        mask: s.be64(0x58),
        pages: (0x110..s.in_len).step_by(8).map(|at| s.be64(at)).collect(),
    }
}

/// `manage_pages_in.pas[]` as Linux filled it; entries the trace did not print read as 0 (they are not
/// compared).
fn linux_pas(s: &Sent) -> Vec<u64> {
    let n = s.be32(0x0c) as usize;
    (0..n)
        .map(|k| {
            let at = 0x10 + 8 * k;
            if s.input[at..at + 8].iter().all(Option::is_some) { s.be64(at) } else { 0 }
        })
        .collect()
}

// ---- Same command, same parameters ----------------------------------------------------------------------

/// The driver's command for Linux's `s`, built with Linux's parameters, and the explained differences; `None`
/// for a command the driver never sends.
fn with_linuxs_parameters(s: &Sent) -> Option<(Command, Vec<Why>)> {
    let ours = match s.opcode {
        ENABLE_HCA => init::enable_hca(s.b(8) & 0x80 != 0),
        QUERY_ISSI => init::query_issi(),
        SET_ISSI => init::set_issi(s.be16(0x0a)),
        QUERY_PAGES => {
            let kind = match s.op_mod {
                1 => init::PagesKind::Boot,
                2 => init::PagesKind::Init,
                3 => init::PagesKind::Regular,
                m => panic!("QUERY_PAGES op_mod {m}"),
            };
            init::query_pages(kind)
        }
        MANAGE_PAGES => {
            assert_eq!(s.op_mod, init::MLX5_PAGES_GIVE);
            init::manage_pages_give(s.be16(0x0a), &linux_pas(s))
        }
        ACCESS_REG => {
            // HOST_ENDIANNESS (0x7004) write. The trace printed no mailbox for it, so the 16 register bytes
            // (ours all zero: `he` = 0, a little-endian host) are not compared; the header and both lengths are.
            assert_eq!((s.op_mod, s.be16(0x0a)), (0, init::MLX5_REG_HOST_ENDIANNESS));
            init::host_endianness_le()
        }
        QUERY_HCA_CAP => {
            let mode = if s.op_mod & 1 == 1 { init::CapMode::Cur } else { init::CapMode::Max };
            init::query_hca_cap(s.op_mod >> 1, mode)
        }
        SET_HCA_CAP => {
            // The capability block Linux wrote, as the parameter: the encoding around it must agree.
            let block: Vec<u8> = s.input[0x10..].iter().map(|b| b.unwrap_or(0)).collect();
            init::set_hca_cap(s.op_mod >> 1, &block)
        }
        INIT_HCA => {
            return Some((
                init::init_hca(),
                vec![
                    (
                        Span::InLen,
                        "init_hca_in is 0x20 bytes in Linux 6.12's mlx5_ifc.h (sw_owner_id[4] at 0x10; Linux 6.12 \
                         sends MLX5_ST_SZ_DW(init_hca_in)); the trace's kernel predates sw_owner_id and sent the \
                         16-byte header only",
                    ),
                    (
                        Span::Bytes(0x10..0x20),
                        "sw_owner_id[4], present only in ours and zero: we use no software steering (Linux 6.12 \
                         fills it only when the sw_owner_id cap is set)",
                    ),
                ],
            ));
        }
        ALLOC_UAR => resources::alloc_uar(),
        CREATE_EQ => {
            let e = linux_eq(s);
            eq::create_eq(&eq::EqParams {
                log_eq_size: e.log_eq_size,
                uar_page: UarPage(e.uar),
                intr: e.intr,
                log_page_size: e.log_page_size,
                event_mask: e.mask,
                pages: &e.pages,
            })
        }
        // The driver takes the part name from the PCI device id and never queries the adapter.
        QUERY_ADAPTER => return None,
        op => panic!("command {} opcode {op:#x}: not classified", s.index),
    };
    Some((ours, Vec::new()))
}

/// Every command input of the trace that the driver builds, with Linux's parameters: the encodings are equal
/// byte for byte, except INIT_HCA's length.
#[test]
fn every_command_with_linuxs_parameters() {
    let mut compared = BTreeMap::<u16, (usize, usize)>::new();
    let mut skipped = Vec::new();
    for s in trace() {
        let Some((ours, why)) = with_linuxs_parameters(s) else {
            skipped.push(s.opcode);
            continue;
        };
        let c = compare("same parameters", s, &ours, &why);
        let e = compared.entry(s.opcode).or_default();
        e.0 += 1;
        e.1 += c.bytes;
    }
    for (op, (n, bytes)) in &compared {
        println!("{op:#06x}: {n} command(s), {bytes} input bytes compared");
    }
    assert_eq!(skipped, [QUERY_ADAPTER]);
    let n: usize = compared.values().map(|c| c.0).sum();
    assert_eq!(n, 41, "every command of the trace but QUERY_ADAPTER is compared");
    // The capability block and the PAS lists were compared where the trace printed them.
    assert!(compared[&SET_HCA_CAP].1 >= 0x100 + 16);
    assert!(compared[&MANAGE_PAGES].1 >= 16 + 8 * 448);
}

// ---- Same command, the driver's own parameters ----------------------------------------------------------

/// ISSI: bring-up sets ISSI 1 when QUERY_ISSI says it is supported, as Linux did on this card.
#[test]
fn set_issi_as_bring_up_chooses() {
    let q = nth(QUERY_ISSI, 0, 0);
    assert!(q.output_known(0x6c..0x70));
    let issi = init::parse_query_issi(&q.output());
    assert!(issi.supports(1));
    compare("SET_ISSI as bring-up chooses", nth(SET_ISSI, 0, 0), &init::set_issi(1), &[]);
}

/// SET_HCA_CAP GENERAL with the driver's policy (`init::general_caps_to_set`, what bring-up sends) over the
/// capabilities the ConnectX-4 reported to Linux (QUERY_HCA_CAP max and current, the trace's outputs).
#[test]
fn set_hca_cap_as_bring_up_builds_it() {
    let max = nth(QUERY_HCA_CAP, 0, 0);
    let cur = nth(QUERY_HCA_CAP, 1, 0);
    // The `cmd_hca_cap` structure (the first 0x100 bytes of the block) is what either side copies.
    assert!(max.output_known(0x10..0x110) && cur.output_known(0x10..0x110));
    let set = nth(SET_HCA_CAP, 0, 0);
    let ours = init::set_general_caps(&cur.output(), &max.output());
    let caps = init::GeneralCaps::parse(init::hca_cap_block(&max.output()));
    // Facts the explanations below rest on (byte = 0x10 + bit / 8 of the cmd_hca_cap field).
    assert_eq!(caps.log_max_qp, 23);
    assert_eq!(set.b(0x23) & 0x1f, 17);
    compare(
        "SET_HCA_CAP GENERAL as bring-up builds it",
        set,
        &ours,
        &[(
            Span::Bytes(0x23..0x24),
            "log_max_qp: ours min(18, max 23) = 18 as Linux 6.12 handle_hca_cap (profile LOG_MAX_SUPPORTED_QPS → \
             min(18, max)); the trace's older kernel used its profile's 17",
        )],
    );
}

/// MANAGE_PAGES as the page engine sends it: at most `PAGES_PER_COMMAND` addresses per command, where Linux
/// gave all 12868 init pages in one.
#[test]
fn manage_pages_as_the_page_engine_batches() {
    let init_give = nth(MANAGE_PAGES, 1, 1);
    let all = linux_pas(init_give);
    assert_eq!(all.len(), 0x3244);
    assert!(all.len() > PAGES_PER_COMMAND);
    let ours = init::manage_pages_give(init_give.be16(0x0a), &all[..PAGES_PER_COMMAND]);
    let c = compare(
        "MANAGE_PAGES init, first batch",
        init_give,
        &ours,
        &[
            (Span::InLen, "one batch of PAGES_PER_COMMAND addresses (what one slot's mailbox chain holds)"),
            (Span::Bytes(0x0c..0x10), "input_num_entries: the batch's count, not the whole demand"),
        ],
    );
    // The trace printed only the first 448 addresses, all inside our first batch.
    assert_eq!(c.bytes, 16 + 8 * 448);
    // The boot pages (6) fit one batch: identical.
    let boot = nth(MANAGE_PAGES, 1, 0);
    compare("MANAGE_PAGES boot", boot, &init::manage_pages_give(0, &linux_pas(boot)), &[]);
}

/// CREATE_EQ as bring-up sends it, against Linux's async EQ: the driver's one EQ is Linux's async EQ and pages
/// EQ in one, polled, with the ring listed per 4 KiB page.
#[test]
fn create_eq_as_bring_up_sends_it() {
    // Linux's three control EQs, in order: commands, async events, page requests.
    let cmd = linux_eq(nth(CREATE_EQ, 0, 0));
    let async_eq = nth(CREATE_EQ, 0, 1);
    let l = linux_eq(async_eq);
    let pages = linux_eq(nth(CREATE_EQ, 0, 2));
    assert_eq!((cmd.mask, pages.mask), (1 << 0xa, 1 << 0xb));
    assert_eq!((l.log_eq_size, l.intr, l.log_page_size, l.mask), (9, 2, 3, 0x1f_02be));
    // The UAR Linux's EQs ring is the first page ALLOC_UAR returned; bring-up uses its own ALLOC_UAR's page.
    let uar = nth(ALLOC_UAR, 0, 0);
    assert!(uar.output_known(0x08..0x0c));
    let uar = resources::parse_alloc_uar(&uar.output());
    assert_eq!(uar.0, l.uar);

    let log_eq_size = Config::default().log_eq_size as u8;
    // The driver's ring: 2^log_eq_size 64-byte entries in 4 KiB pages; here placed where Linux's was.
    let n = ((64usize << log_eq_size) / 4096).max(1);
    let ring: Vec<u64> = (0..n as u64).map(|k| l.pages[0] + 4096 * k).collect();
    let ours = eq::create_eq(&eq::EqParams {
        log_eq_size,
        uar_page: uar,
        intr: 0,
        log_page_size: 0,
        event_mask: EQ_EVENTS,
        pages: &ring,
    });
    let mut why: Vec<Why> = Vec::new();
    if log_eq_size != l.log_eq_size {
        why.push((
            Span::Bytes(0x1c..0x1d),
            "eqc.log_eq_size: ours 13, Linux 6.12's async EQ (order_base_2(MLX5_NUM_ASYNC_EQE 0x1000 + \
             MLX5_NUM_SPARE_EQE 0x80)); the trace's older kernel had MLX5_NUM_ASYNC_EQE 0x100: 0x100 + 0x80 → 9",
        ));
    }
    why.push((
        Span::Bytes(0x27..0x28),
        "eqc.intr: ours 0, the EQ is polled and never armed; Linux's async EQ is bound to MSI-X vector 2",
    ));
    why.push((
        Span::Bytes(0x28..0x29),
        "eqc.log_page_size: ours 0, the ring is listed per 4 KiB page; Linux gives one contiguous buffer as one \
         page of 4 KiB << 3",
    ));
    assert_eq!(EQ_EVENTS ^ l.mask, 1 << 0xb, "the mask differs from Linux's async EQ's by PAGE_REQUEST only");
    why.push((
        Span::Bytes(0x5e..0x5f),
        "event_bitmask[0] bit 0xb (PAGE_REQUEST): our one EQ also takes what Linux's separate pages EQ takes; \
         there is no command EQ because the command queue is polled (Linux's async mask 0x1f02be otherwise equal)",
    ));
    if ring.len() > 1 {
        why.push((Span::InLen, "pas[] holds one entry per 4 KiB page of the ring; Linux one entry"));
        why.push((Span::Bytes(0x118..0x110 + 8 * ring.len()), "pas[1..]: the ring's further 4 KiB pages"));
    }
    compare("CREATE_EQ as bring-up sends it", async_eq, &ours, &why);
}

// ---- The framing around the structures ------------------------------------------------------------------

/// The command as the driver's queue frames it, in the trace's dump layout: the 64-byte entry, then each
/// mailbox block's 576 bytes. A fresh queue on a hosted platform whose model is never stepped, so nothing
/// but the driver has written the bytes read back.
fn framed(p: &HostedPlatform, geometry: u32, cmd: &Command) -> Vec<u8> {
    // The queue's set-up overwrote the register's low bits with its address; the firmware (the model, never
    // stepped here) would show the geometry there again.
    p.bar_write32(initseg::CMDQ_ADDR_L_SZ, geometry);
    let mut q = CmdQueue::new(p, 1_000).expect("command queue");
    let slot = q.submit(p, 1, cmd).expect("submit");
    let lo = p.bar_read32(initseg::CMDQ_ADDR_L_SZ);
    let base = (u64::from(p.bar_read32(initseg::CMDQ_ADDR_H)) << 32) | u64::from(lo & !0xfff);
    let mut out = vec![0u8; 64];
    p.ram().read(base + (u64::from(slot) << (geometry & 0xf)), &mut out).expect("entry");
    let mut next = u64::from_be_bytes(out[8..16].try_into().unwrap());
    while next != 0 {
        let mut blk = [0u8; 576];
        p.ram().read(next, &mut blk).expect("mailbox block");
        out.extend_from_slice(&blk);
        next = u64::from_be_bytes(blk[0x230..0x238].try_into().unwrap());
    }
    q.release(p);
    out
}

fn xor(bytes: impl Iterator<Item = u8>) -> u8 {
    bytes.fold(0, |a, b| a ^ b)
}

/// The framing rules one side's frame must follow (`mlx5_cmd_layout`, `mlx5_cmd_prot_block`; docs/reference/
/// mlx5.md §c.2–§c.4), where its values are run-specific: the mailbox pointers (DMA addresses) are present
/// exactly when the structure needs a mailbox and 1 KiB aligned, `next` is present on every block but the
/// last, the token is non-zero and the same in the entry and every block, the entry's XOR is 0xff, the entry
/// is handed to hardware (ownership 1). `get` returns None for a byte the side does not have.
fn frame_rules(side: &str, get: &dyn Fn(usize) -> Option<u8>, in_len: usize, out_len: usize) -> Vec<String> {
    let mut bad = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            bad.push(format!("{side}: {what}"));
        }
    };
    let be64 = |at: usize| (0..8).try_fold(0u64, |a, i| get(at + i).map(|b| (a << 8) | u64::from(b)));
    let Some(entry) = (0..64).map(&get).collect::<Option<Vec<u8>>>() else {
        return vec![format!("{side}: the entry is incomplete")];
    };
    check(entry[0] == 7, format!("type {:#x}, not 7 (PCIe command)", entry[0]));
    let in_ptr = be64(0x08).unwrap();
    let out_ptr = be64(0x30).unwrap();
    check((in_ptr != 0) == (in_len > 16) && in_ptr % 1024 == 0, format!("input mailbox {in_ptr:#x}"));
    check((out_ptr != 0) == (out_len > 16) && out_ptr % 1024 == 0, format!("output mailbox {out_ptr:#x}"));
    let token = entry[0x3c];
    check(token != 0, "token 0".into());
    check(xor(entry.iter().copied()) == 0xff, "entry XOR is not 0xff".into());
    check(entry[0x3e] == 0 && entry[0x3f] == 1, format!("status/ownership {:#x}", entry[0x3f]));
    let blocks = in_len.saturating_sub(16).div_ceil(512);
    for k in 0..blocks {
        let at = 0x40 + 576 * k;
        // Blocks the trace did not print are not checked.
        if get(at + 0x23f).is_none() {
            continue;
        }
        let next = be64(at + 0x230).unwrap();
        check((next != 0) == (k + 1 < blocks) && next % 1024 == 0, format!("block {k}: next {next:#x}"));
        let num = (0..4).fold(0u32, |a, i| (a << 8) | u32::from(get(at + 0x238 + i).unwrap()));
        check(num == k as u32, format!("block {k}: block_num {num}"));
        check(get(at + 0x23d) == Some(token), format!("block {k}: token differs from the entry's"));
        check(get(at + 0x23c) == Some(0), format!("block {k}: reserved byte 0x23c"));
        check((0x200..0x230).all(|i| get(at + i) == Some(0)), format!("block {k}: reserved 0x200..0x230"));
    }
    bad
}

/// The command queue entry and the mailbox blocks around each structure, against Linux's frames in the trace
/// (the entry and up to seven blocks per command were printed). Equal: the entry's type, lengths, inline
/// input and output, status and ownership; every block's data, reserved bytes and number. Run-specific, each
/// side checked by [`frame_rules`]: mailbox addresses, `next`, token, the entry's signature. Different:
/// the block signatures (below).
#[test]
fn framing_as_the_queue_writes_it() {
    let p = HostedPlatform::with_model(
        // Linux's commands against the trace's ConnectX-4 profile, the HCA they were sent to.
        ModelConfig { caps: mlx5_model::caps::CapsProfile::ConnectX4Trace, ..ModelConfig::instant() },
        128 << 20,
        ModelMode::InProcess,
    );
    let geometry = p.bar_read32(initseg::CMDQ_ADDR_L_SZ) & 0xff;
    let mut blocks = 0;
    for s in trace() {
        let Some((cmd, _)) = with_linuxs_parameters(s) else { continue };
        let ours = framed(&p, geometry, &cmd);
        let linux = |at: usize| s.frame.get(&at).copied();
        let mine = |at: usize| ours.get(at).copied();
        let mut bad = frame_rules("linux", &linux, s.in_len, s.out_len);
        bad.extend(frame_rules("ours", &mine, cmd.input().len(), cmd.out_len()));
        // The entry: everything but the pointers, the token and the signature that covers them.
        let same: Vec<usize> = [0x00..0x04, 0x10..0x30, 0x38..0x3c, 0x3e..0x40].into_iter().flatten().collect();
        // INIT_HCA's input length is the one structure difference (every_command_with_linuxs_parameters).
        let same_len = s.opcode != INIT_HCA;
        for at in same.into_iter().chain(if same_len { 0x04..0x08 } else { 0..0 }) {
            if linux(at) != mine(at) {
                bad.push(format!("entry byte {at:#x}: linux {:02x?} ours {:02x?}", linux(at), mine(at)));
            }
        }
        // Blocks both sides have and the trace printed.
        for k in 0..(ours.len() - 64) / 576 {
            let at = 0x40 + 576 * k;
            if linux(at + 0x23f).is_none() {
                continue;
            }
            blocks += 1;
            for i in (0..0x23d).filter(|i| !(0x230..0x238).contains(i)) {
                if linux(at + i) != mine(at + i) {
                    bad.push(format!("block {k} byte {i:#x}: linux {:02x?} ours {:02x?}", linux(at + i), mine(at + i)));
                }
            }
            // The one difference: Linux leaves `ctrl_sig` and `sig` 0 (block signatures are checked only with
            // `cmdif_checksum`, which SET_HCA_CAP turns off and this card's current caps already have off);
            // the driver signs every block, which is valid either way.
            if (linux(at + 0x23e), linux(at + 0x23f)) != (Some(0), Some(0)) {
                bad.push(format!("block {k}: Linux signed it"));
            }
            let ctrl = xor((0x200..0x23f).map(|i| ours[at + i]));
            let all = xor((0..0x240).map(|i| ours[at + i]));
            if (ctrl, all) != (0xff, 0xff) {
                bad.push(format!("block {k}: ours is not signed (explanation stale?)"));
            }
        }
        assert!(bad.is_empty(), "command {} ({:#x}) framing:\n  {}", s.index, s.opcode, bad.join("\n  "));
    }
    // QUERY_ISSI's, QUERY_HCA_CAP's, SET_HCA_CAP's, MANAGE_PAGES' and CREATE_EQ's blocks were compared.
    assert!(blocks >= 20, "{blocks} mailbox blocks compared");
}
