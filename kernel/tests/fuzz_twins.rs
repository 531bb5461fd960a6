//! The stable twins of the kernel's fuzz targets (`kernel/fuzz`): the same checks (`kernel/fuzz/src/*.rs`) on
//! the committed seeds (`kernel/fuzz/seeds/<target>/`) and on inputs from a seeded xorshift generator —
//! ARP frames of every kind, Multiboot 1 and Multiboot2 structures and ACPI tables built field by field from
//! their specifications, command lines of every option with good and bad values, each then mutated.
//! Deterministic: a failure names its target and input index, and `TWIN_SEED` reproduces it.
//! `LEASEBOX_WRITE_SEEDS=1` rewrites the seed files from the `*_seeds` functions before the run.

#[path = "../fuzz/src/acpi.rs"]
mod acpi;
#[path = "../fuzz/src/arp.rs"]
mod arp;
#[path = "../fuzz/src/cmdline.rs"]
mod cmdline;
#[path = "../fuzz/src/mem.rs"]
mod mem;
#[path = "../fuzz/src/multiboot.rs"]
mod multiboot;

use std::path::Path;

use leasebox_twin::Rng;

const SEED: u64 = 0x1EA5_EB0C_5EED_0005;

/// Random edits: bit flips, interesting bytes, insertions, deletions, truncation.
fn mutate(r: &mut Rng, b: &mut Vec<u8>, from: usize) {
    for _ in 0..1 + r.below(3) {
        if b.len() <= from {
            b.push(r.u8());
            continue;
        }
        let at = from + r.below(b.len() - from);
        match r.below(5) {
            0 => b[at] ^= 1 << r.below(8),
            1 => b[at] = r.pick(&[0, 1, 2, 0x7f, 0x80, 0xff, b' ', b'=', b'\t', b'\n']),
            2 => b.insert(at, r.u8()),
            3 => {
                b.remove(at);
            }
            _ => b.truncate(at.max(from)),
        }
    }
}

/// Runs `check` on `inputs` generated inputs, naming the failing one.
fn run<C: Default + core::ops::AddAssign>(
    target: &str,
    inputs: usize,
    salt: u64,
    mut gen_input: impl FnMut(&mut Rng) -> Vec<u8>,
    check: impl Fn(&[u8]) -> C + std::panic::RefUnwindSafe,
) -> C {
    let mut r = Rng::from_env(SEED, salt);
    let mut total = C::default();
    for i in 0..inputs {
        let input = gen_input(&mut r);
        match std::panic::catch_unwind(|| check(&input)) {
            Ok(n) => total += n,
            Err(_) => panic!("{target} input #{i} failed the check: {input:02x?}"),
        }
    }
    total
}

fn run_seeds<C: Default + core::ops::AddAssign>(
    target: &str,
    seeds: Vec<(String, Vec<u8>)>,
    check: impl Fn(&[u8]) -> C + std::panic::RefUnwindSafe,
) -> C {
    let dir = format!("{}/fuzz/seeds/{target}", env!("CARGO_MANIFEST_DIR"));
    leasebox_twin::check_seeds(Path::new(&dir), &seeds, check)
}

// ---- arp ----

const ME: [u8; 6] = [0x02, 0x4c, 0x42, 0, 0, 1];

/// The station's MAC, then an ARP frame written from RFC 826's layout: a reply to us (unicast or not), a
/// request, or a reply to someone else.
fn arp_input(r: &mut Rng) -> Vec<u8> {
    let mut v = ME.to_vec();
    let peer: [u8; 6] = match r.below(6) {
        0 => [0xff; 6],
        1 => [0x01, 0, 0x5e, 0, 0, r.u8()],
        2 => [0; 6],
        _ => [r.u8() & 0xfe, r.u8(), r.u8(), r.u8(), r.u8(), r.u8() | 1],
    };
    let to = if r.below(5) == 0 { [0x02, 0, 0, 0, 0, 9] } else { ME };
    let op = if r.below(4) == 0 { 1 } else { 2 };
    v.extend(to);
    v.extend(peer);
    v.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, op]);
    v.extend(peer);
    v.extend([10, 0, r.u8(), r.u8()]);
    v.extend(to);
    v.extend([10, 0, 0, 1]);
    v.resize(6 + 60, 0);
    v
}

fn arp_seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0xA1);
    let mut out = Vec::new();
    let mut learned = 0;
    while out.len() < 6 {
        let v = arp_input(&mut r);
        let l = arp::check(&v);
        if l && learned < 3 || !l && out.len() - learned < 3 {
            learned += usize::from(l);
            out.push((format!("{}-{}", if l { "learned" } else { "ignored" }, out.len()), v));
        }
    }
    out
}

#[test]
fn arp_seeds_pass_and_are_learned_from() {
    let learned = run_seeds("arp", arp_seeds(), |b| u64::from(arp::check(b)));
    assert_eq!(learned, 3);
}

#[test]
fn arp_random_and_mutated_frames() {
    let learned = run(
        "arp",
        50_000,
        0xA1,
        |r| {
            let mut v = if r.below(10) == 0 { (0..r.below(80)).map(|_| r.u8()).collect() } else { arp_input(r) };
            if r.below(3) == 0 {
                mutate(r, &mut v, 6);
            }
            v
        },
        |b| u64::from(arp::check(b)),
    );
    eprintln!("arp twin: 50000 inputs, {learned} learned");
    assert!(learned > 8_000, "{learned}");
}

// ---- multiboot ----

fn le32(v: &mut Vec<u8>, x: u32) {
    v.extend(x.to_le_bytes());
}

fn le64(v: &mut Vec<u8>, x: u64) {
    v.extend(x.to_le_bytes());
}

/// A memory map: usable and reserved runs, in order, some touching.
fn memory_map(r: &mut Rng) -> Vec<(u64, u64, u32)> {
    let mut at = 0u64;
    (0..1 + r.below(6))
        .map(|i| {
            at += r.pick(&[0, 0x1000, 0x10_0000]);
            // The first run is usable RAM, as on every machine; the others anything, empty ones included.
            let len = if i == 0 { 0x9_fc00 } else { r.pick(&[0, 0x9_fc00, 0x10_0000, 0x4000_0000]) };
            let e = (at, len, if i == 0 { 1 } else { r.pick(&[1, 1, 2, 3, 4, 5, 7]) });
            at += len;
            e
        })
        .collect()
}

fn put32(b: &mut [u8], at: usize, x: u32) {
    b[at..at + 4].copy_from_slice(&x.to_le_bytes());
}

/// Mode byte and a Multiboot 1 structure (spec 0.6.96 §3.3) with its strings, module list and map in the
/// same block.
fn mb1_input(r: &mut Rng) -> Vec<u8> {
    let mode = r.pick(&[0, 0, 0, 2]);
    let base = (multiboot::BASE + if mode & 2 != 0 { 4 } else { 0 }) as u32;
    let mut b = vec![0u8; 0x400];
    let mut flags = 0u32;
    if r.below(4) != 0 {
        flags |= 1;
        put32(&mut b, 4, 639);
        put32(&mut b, 8, r.u32() % 0x10_0000);
    }
    if r.below(4) != 0 {
        flags |= 1 << 2;
        put32(&mut b, 16, base + 0x100);
        let s = b"/boot/leasebox.elf log=debug ip=10.0.2.15/24";
        let n = r.below(s.len() + 1);
        b[0x100..0x100 + n].copy_from_slice(&s[..n]);
    }
    if r.below(3) == 0 {
        flags |= 1 << 3;
        let count = r.below(4) as u32;
        put32(&mut b, 20, count);
        put32(&mut b, 24, base + 0x200);
        for i in 0..count as usize {
            let e = 0x200 + i * 16;
            put32(&mut b, e, 0x20_0000);
            put32(&mut b, e + 4, 0x20_0000 + r.u32() % 0x1_0000);
            put32(&mut b, e + 8, if r.below(3) == 0 { 0 } else { base + 0x240 + i as u32 * 16 });
            b[0x240 + i * 16..0x240 + i * 16 + 5].copy_from_slice(b"mod-x");
        }
    }
    if r.below(4) != 0 {
        flags |= 1 << 6;
        let mut m = Vec::new();
        for (start, len, kind) in memory_map(r) {
            le32(&mut m, 20);
            le64(&mut m, start);
            le64(&mut m, len);
            le32(&mut m, kind);
        }
        put32(&mut b, 44, m.len() as u32);
        put32(&mut b, 48, base + 0x300);
        b[0x300..0x300 + m.len()].copy_from_slice(&m);
    }
    put32(&mut b, 0, flags);
    let mut v = vec![mode];
    v.extend(b);
    v
}

fn mb2_tag(v: &mut Vec<u8>, ty: u32, payload: &[u8]) {
    le32(v, ty);
    le32(v, 8 + payload.len() as u32);
    v.extend(payload);
    while !v.len().is_multiple_of(8) {
        v.push(0);
    }
}

/// Mode byte and a Multiboot2 structure (spec 2.0 §3.6): header, tags in random order, end tag.
fn mb2_input(r: &mut Rng) -> Vec<u8> {
    let mut t = vec![0u8; 8];
    let mut tags: Vec<(u32, Vec<u8>)> = Vec::new();
    if r.below(4) != 0 {
        tags.push((1, b"log=debug ip=10.0.2.15/24\0".to_vec()));
    }
    if r.below(3) == 0 {
        let mut m = Vec::new();
        le32(&mut m, 0x20_0000);
        le32(&mut m, 0x21_0000);
        m.extend(b"module\0");
        tags.push((3, m));
    }
    if r.below(3) == 0 {
        let mut m = Vec::new();
        le32(&mut m, 639);
        le32(&mut m, 0x8_0000);
        tags.push((4, m));
    }
    if r.below(4) != 0 {
        let mut m = Vec::new();
        le32(&mut m, 24);
        le32(&mut m, 0);
        for (start, len, kind) in memory_map(r) {
            le64(&mut m, start);
            le64(&mut m, len);
            le32(&mut m, kind);
            le32(&mut m, 0);
        }
        tags.push((6, m));
    }
    if r.below(2) == 0 {
        tags.push((14, b"RSD PTR \0BOCHS \0\0\0\0\0\0".to_vec()));
    }
    if r.below(2) == 0 {
        tags.push((15, [b"RSD PTR \0BOCHS \x02".as_slice(), &[0; 20]].concat()));
    }
    if r.below(4) == 0 {
        tags.push((21, vec![r.u8(); r.below(12)]));
    }
    for _ in 0..tags.len() {
        let (a, b) = (r.below(tags.len()), r.below(tags.len()));
        tags.swap(a, b);
    }
    for (ty, p) in tags {
        mb2_tag(&mut t, ty, &p);
    }
    mb2_tag(&mut t, 0, &[]);
    let total = t.len() as u32;
    t[0..4].copy_from_slice(&total.to_le_bytes());
    let mut v = vec![if r.below(8) == 0 { 3 } else { 1 }];
    v.extend(t);
    v
}

fn multiboot_seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0xB0);
    let mut out = Vec::new();
    for i in 0..4 {
        out.push((format!("mb1-{i}"), mb1_input(&mut r)));
        out.push((format!("mb2-{i}"), mb2_input(&mut r)));
    }
    out
}

#[test]
fn multiboot_seeds_pass() {
    let n = run_seeds("multiboot", multiboot_seeds(), multiboot::check);
    assert!(n.mb1_accepted > 0 && n.mb2_accepted > 0, "{n:?}");
}

#[test]
fn multiboot_random_and_mutated_structures() {
    let n = run(
        "multiboot",
        20_000,
        0xB0,
        |r| {
            let mut v = match r.below(10) {
                0 => (0..r.below(200)).map(|_| r.u8()).collect(),
                1..=4 => mb1_input(r),
                _ => mb2_input(r),
            };
            if r.below(2) == 0 {
                mutate(r, &mut v, 1);
            }
            v
        },
        multiboot::check,
    );
    eprintln!("multiboot twin: 20000 inputs, {n:?}");
    assert!(n.mb1_accepted > 3_000 && n.mb2_accepted > 2_500 && n.refused > 5_000, "{n:?}");
    assert!(n.with_cmdline > 4_000 && n.with_modules > 1_500 && n.with_rsdp > 2_000, "{n:?}");
}

// ---- acpi ----

/// An ACPI table: the System Description Table Header (36 bytes, checksum left 0) and `body`.
fn table(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut t = sig.to_vec();
    le32(&mut t, 36 + body.len() as u32);
    t.extend([1, 0]);
    t.extend(b"LEASEBFUZZTABLE\0");
    t.extend([0; 12]);
    t.truncate(36);
    t.extend(body);
    t
}

/// Mode byte and memory at the BIOS area: an RSDP (ACPI 1.0 or 2.0), its RSDT or XSDT, a MADT of local APIC,
/// x2APIC and override entries, sometimes an MCFG and an SPCR, at fixed offsets.
fn acpi_input(r: &mut Rng) -> Vec<u8> {
    let base = acpi::BASE;
    let mut m = vec![0u8; 0x600];
    let v2 = r.below(2) == 0;
    let (madt_at, mcfg_at, spcr_at, root_at) = (0x100usize, 0x300usize, 0x400usize, if v2 { 0x80 } else { 0x40 });
    let mut madt = Vec::new();
    le32(&mut madt, 0xFEE0_0000);
    le32(&mut madt, r.below(2) as u32);
    for i in 0..r.below(8) {
        match r.below(5) {
            0 => madt.extend(
                [9, 16, 0, 0]
                    .iter()
                    .copied()
                    .chain((0x100 + i as u32).to_le_bytes())
                    .chain((r.below(4) as u32).to_le_bytes())
                    .chain((i as u32).to_le_bytes()),
            ),
            1 if r.below(3) == 0 => madt.extend([5, 12, 0, 0].iter().copied().chain(0xFEE0_1000u64.to_le_bytes())),
            _ => madt.extend([0, 8, i as u8, r.pick(&[i as u8, 0]), r.below(4) as u8, 0, 0, 0]),
        }
    }
    let madt = table(b"APIC", &madt);
    m[madt_at..madt_at + madt.len()].copy_from_slice(&madt);
    let mut listed = vec![base + madt_at as u64];
    if r.below(2) == 0 {
        let mut body = vec![0u8; 8];
        for _ in 0..r.below(3) {
            le64(&mut body, 0xB000_0000);
            body.extend([0, 0, 0, r.pick(&[0xff, 0x7f, 0])]);
            body.extend([0; 4]);
        }
        let mcfg = table(b"MCFG", &body);
        m[mcfg_at..mcfg_at + mcfg.len()].copy_from_slice(&mcfg);
        listed.push(base + mcfg_at as u64);
    }
    if r.below(3) == 0 {
        let mut body = vec![0u8; 44];
        body[4] = 1;
        body[8..16].copy_from_slice(&0x3f8u64.to_le_bytes());
        body[22] = 7;
        let spcr = table(b"SPCR", &body);
        m[spcr_at..spcr_at + spcr.len()].copy_from_slice(&spcr);
        listed.push(base + spcr_at as u64);
    }
    if r.below(4) == 0 {
        listed.insert(r.below(listed.len() + 1), 0);
    }
    let mut root_body = Vec::new();
    for a in &listed {
        if v2 {
            le64(&mut root_body, *a);
        } else {
            le32(&mut root_body, *a as u32);
        }
    }
    let root = table(if v2 { b"XSDT" } else { b"RSDT" }, &root_body);
    m[root_at..root_at + root.len()].copy_from_slice(&root);
    m[0..8].copy_from_slice(b"RSD PTR ");
    m[9..15].copy_from_slice(b"LEASEB");
    m[16..20].copy_from_slice(&((base + 0x40) as u32).to_le_bytes());
    if v2 {
        m[15] = 2;
        m[20..24].copy_from_slice(&36u32.to_le_bytes());
        m[24..32].copy_from_slice(&(base + 0x80).to_le_bytes());
    }
    acpi::repair(&mut m);
    let mut v = vec![r.pick(&[0, 1])];
    v.extend(m);
    v
}

fn acpi_seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0xC0);
    (0..6).map(|i| (format!("tables-{i}"), acpi_input(&mut r))).collect()
}

#[test]
fn acpi_seeds_pass() {
    let n = run_seeds("acpi", acpi_seeds(), acpi::check);
    assert!(n.accepted > 0 && n.cpus > 0, "{n:?}");
}

#[test]
fn acpi_random_and_mutated_tables() {
    let n = run(
        "acpi",
        4_000,
        0xC0,
        |r| {
            let mut v = if r.below(20) == 0 { (0..r.below(300)).map(|_| r.u8()).collect() } else { acpi_input(r) };
            if r.below(2) == 0 {
                // Mutations inside the structures (the first 0x500 bytes), not only in the empty tail.
                v.truncate(0x500 + r.below(0x100));
                mutate(r, &mut v, 1);
                v.resize(v.len().max(0x500), 0);
            }
            v
        },
        acpi::check,
    );
    eprintln!("acpi twin: 4000 inputs, {n:?}");
    assert!(n.accepted > 1_000 && n.refused > 500 && n.xsdt > 300 && n.ecam > 300 && n.cpus > 5_000, "{n:?}");
}

// ---- cmdline ----

const KEY: &str = "00112233445566778899aabbccddeeff";

/// One word: an option the kernel knows with a good or bad value, or a stray word.
fn word(r: &mut Rng) -> String {
    let opts: &[(&str, &[&str])] = &[
        ("log", &["debug", "info", "off", "loud"]),
        ("cores", &["net,cmd+event", "net+cmd+event", "", "net,,cmd", "x"]),
        ("console", &["com1", "com2,115200", "none", "lpt9"]),
        ("watchdog_ms", &["0", "5000", "soon", "99999999999"]),
        ("test", &["panic", "none", "stall", "mlx5"]),
        ("ctl_nic", &["virtio", "mlx5", "auto", "e1000"]),
        ("ip", &["10.0.2.15/24", "dhcp", "300.1.1.1/24", "10.0.0.1", "10.0.2.15/33"]),
        ("gw", &["10.0.2.2", "192.168.1.1", "x"]),
        ("port", &["7470", "0", "70000"]),
        ("tenant", &["alice:KEY", "bob:KEY", "alice:zz", "admin:KEY", ":KEY", "carol"]),
        ("admin", &["KEY", "0/KEY,1/KEY", "abc", ""]),
        ("sessions", &["8", "0", "65"]),
        ("credits", &["4", "0"]),
        ("heartbeat_ms", &["1000", "no"]),
        ("sessions_per_tenant", &["2", "99"]),
        ("admin_sessions", &["1", "70"]),
        ("preauth_sessions", &["4", "0"]),
        ("heap_high_water", &["80", "5"]),
        ("appliance", &["lb-1", "bad name!", ""]),
    ];
    if r.below(8) == 0 {
        return r.pick(&["foo=1", "bare", "=", "==x", "lease_pool_mib=64", "é=ü"]).to_string();
    }
    let (k, vals) = opts[r.below(opts.len())];
    format!("{k}={}", r.pick(vals).replace("KEY", KEY))
}

fn cmdline_input(r: &mut Rng) -> Vec<u8> {
    let mut words: Vec<String> = (0..r.below(8)).map(|_| word(r)).collect();
    if r.below(2) == 0 {
        words.insert(0, "/boot/leasebox.elf".to_string());
    }
    let sep = r.pick(&[" ", " ", "  ", "\t", "\n"]);
    words.join(sep).into_bytes()
}

fn cmdline_seeds() -> Vec<(String, Vec<u8>)> {
    let mut r = Rng(SEED ^ 0xD0);
    let mut out = vec![
        ("qemu-default".to_string(), format!("/boot/leasebox.elf log=info tenant=demo:{KEY} admin={KEY}").into_bytes()),
        ("bad-secret".to_string(), b"admin=not-hex tenant=alice:also-not".to_vec()),
        ("gw-off-subnet".to_string(), b"ip=10.0.2.15/24 gw=192.168.1.1".to_vec()),
    ];
    out.extend((0..5).map(|i| (format!("random-{i}"), cmdline_input(&mut r))));
    out
}

#[test]
fn cmdline_seeds_pass() {
    let n = run_seeds("cmdline", cmdline_seeds(), cmdline::check);
    assert!(n.accepted > 0 && n.refused > 0 && n.refused_by_check > 0 && n.secrets > 0, "{n:?}");
}

#[test]
fn cmdline_random_and_mutated_lines() {
    let n = run(
        "cmdline",
        30_000,
        0xD0,
        |r| {
            let mut v = if r.below(10) == 0 { (0..r.below(100)).map(|_| r.u8()).collect() } else { cmdline_input(r) };
            if r.below(3) == 0 {
                mutate(r, &mut v, 0);
            }
            v
        },
        cmdline::check,
    );
    eprintln!("cmdline twin: 30000 inputs, {n:?}");
    assert!(n.accepted > 3_000 && n.refused > 10_000 && n.refused_by_check > 100 && n.secrets > 5_000, "{n:?}");
}
