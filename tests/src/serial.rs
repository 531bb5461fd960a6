//! Parsers for the kernel's serial console (the contract between the kernel and the host-side tests).
//!
//! - log lines: `[    0.012345] c0 INFO  message`
//! - the AP report-in: message `smp: cpu <N> online apic=<id> role=<roles>`
//! - the PCI listing: message `pci: BB:DD.F VVVV:DDDD class=CC.SS.PP [barN=KIND:0xADDR+0xSIZE]...`
//! - the ready line (not a log line): `leasebox: ready cores=N mem_mib=M pci=K boot_ms=T ap_ms=A entry_ms=E`
//! - fatal ends: a line containing `EXCEPTION` (with `vector=`, `rip=`, `cr2=` nearby) or `PANIC`.
//!
//! Lines may carry junk in front (GRUB leaves terminal escape sequences without a newline before the kernel's
//! first line), so the parsers look for their marker inside the line rather than only at its start. Nothing here
//! panics on bad input: malformed listing lines are reported as errors, unrelated lines are skipped.

use std::fmt;

/// The marker of the ready line.
pub const READY_MARKER: &str = "leasebox: ready";

/// A parsed log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine<'a> {
    pub secs: u64,
    pub micros: u32,
    pub core: u32,
    pub level: &'a str,
    pub message: &'a str,
}

/// Parses a log line, tolerating junk before the `[`.
pub fn parse_log_line(line: &str) -> Option<LogLine<'_>> {
    line.match_indices('[').find_map(|(i, _)| parse_log_line_at(&line[i..]))
}

fn parse_log_line_at(s: &str) -> Option<LogLine<'_>> {
    let rest = s.strip_prefix('[')?;
    let close = rest.find(']')?;
    let (secs, frac) = rest[..close].trim().split_once('.')?;
    if !is_digits(secs) || !is_digits(frac) {
        return None;
    }
    // The contract prints six fraction digits; accept other widths and scale them to microseconds.
    let micros = format!("{:0<6}", &frac[..frac.len().min(6)]);
    let rest = rest[close + 1..].strip_prefix(' ')?;
    let (core, rest) = rest.split_once(' ')?;
    let core = core.strip_prefix('c')?;
    if !is_digits(core) {
        return None;
    }
    let rest = rest.trim_start_matches(' ');
    let (level, message) = rest.split_once(' ').unwrap_or((rest, ""));
    if level.is_empty() || !level.bytes().all(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Some(LogLine {
        secs: secs.parse().ok()?,
        micros: micros.parse().ok()?,
        core: core.parse().ok()?,
        level,
        message: message.trim_start_matches(' '),
    })
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The ready line's `key=value` fields, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    pub fields: Vec<(String, String)>,
}

/// Parses the ready line if `line` contains one. Fields are parsed generically (new keys may appear); tokens
/// without `=` are ignored.
pub fn parse_ready(line: &str) -> Option<Ready> {
    let at = line.find(READY_MARKER)?;
    let rest = &line[at + READY_MARKER.len()..];
    // `leasebox: readyX` is not the ready line.
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    let fields = rest
        .split_whitespace()
        .filter_map(|t| t.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(Ready { fields })
}

impl Ready {
    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn require(&self, key: &str) -> Result<&str, String> {
        self.get(key).ok_or_else(|| format!("ready line has no `{key}=` field"))
    }

    /// An integer field.
    pub fn u64(&self, key: &str) -> Result<u64, String> {
        let v = self.require(key)?;
        v.parse().map_err(|_| format!("ready line field {key}={v} is not an integer"))
    }

    /// A millisecond field (`12.345`).
    pub fn ms(&self, key: &str) -> Result<f64, String> {
        let v = self.require(key)?;
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 && !v.starts_with('+') => Ok(x),
            _ => Err(format!("ready line field {key}={v} is not a millisecond figure")),
        }
    }
}

/// An application processor (or the BSP) reporting in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuOnline {
    pub cpu: u32,
    pub apic: u32,
    pub roles: String,
}

/// Parses a `smp: cpu <N> online apic=<id> role=<roles>` message.
pub fn parse_cpu_online(message: &str) -> Option<CpuOnline> {
    let rest = message.strip_prefix("smp: cpu ")?;
    let mut words = rest.split_whitespace();
    let cpu = words.next()?.parse().ok()?;
    if words.next()? != "online" {
        return None;
    }
    let (mut apic, mut roles) = (None, None);
    for w in words {
        match w.split_once('=') {
            Some(("apic", v)) => apic = parse_int(v),
            Some(("role", v)) => roles = Some(v.to_string()),
            _ => {}
        }
    }
    Some(CpuOnline { cpu, apic: apic?, roles: roles? })
}

fn parse_int(v: &str) -> Option<u32> {
    match v.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// How a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Io,
    Mem32,
    Mem32Pf,
    Mem64,
    Mem64Pf,
}

impl BarKind {
    pub fn parse(s: &str) -> Option<BarKind> {
        Some(match s {
            "io" => BarKind::Io,
            "mem32" => BarKind::Mem32,
            "mem32pf" => BarKind::Mem32Pf,
            "mem64" => BarKind::Mem64,
            "mem64pf" => BarKind::Mem64Pf,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BarKind::Io => "io",
            BarKind::Mem32 => "mem32",
            BarKind::Mem32Pf => "mem32pf",
            BarKind::Mem64 => "mem64",
            BarKind::Mem64Pf => "mem64pf",
        }
    }
}

/// One BAR of a listed function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    pub index: u8,
    pub kind: BarKind,
    pub addr: u64,
    pub size: u64,
}

/// One function from the PCI listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    pub bus: u8,
    pub device: u8,
    pub function: u8,
    pub vendor_id: u16,
    pub device_id: u16,
    /// (class, subclass, prog-if)
    pub class: (u8, u8, u8),
    pub bars: Vec<Bar>,
}

impl PciFunction {
    /// `VVVV:DDDD`, lowercase.
    pub fn ids(&self) -> String {
        format!("{:04x}:{:04x}", self.vendor_id, self.device_id)
    }

    pub fn bar(&self, index: u8) -> Option<&Bar> {
        self.bars.iter().find(|b| b.index == index)
    }
}

impl fmt::Display for PciFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02x}:{:02x}.{} {} class={:02x}.{:02x}.{:02x}",
            self.bus,
            self.device,
            self.function,
            self.ids(),
            self.class.0,
            self.class.1,
            self.class.2
        )?;
        for b in &self.bars {
            write!(f, " bar{}={}:{:#x}+{:#x}", b.index, b.kind.as_str(), b.addr, b.size)?;
        }
        Ok(())
    }
}

/// The `BB:DD.F` of `pci: BB:DD.F ivshmem carries the mlx5 model (signature at BAR2+0x...)`, the kernel's note
/// that an ivshmem function's BAR2 carries the mlx5 model's signature.
pub fn parse_model_signature(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("pci: ")?;
    let (bdf, note) = rest.split_once(' ')?;
    parse_bdf(bdf)?;
    note.strip_prefix("ivshmem carries the mlx5 model (signature at BAR2+0x")?.strip_suffix(')')?;
    Some(bdf)
}

/// Parses a PCI listing message. `None` when the message is not a listing line (other `pci:` messages, e.g.
/// about ECAM, do not start with a `BB:DD.F` address, and notes about one function, such as `pci: 00:02.0
/// ivshmem carries the mlx5 model ...`, follow the address with a word instead of `vendor:device`);
/// `Some(Err)` when it is one but malformed. Unknown trailing `key=value` items are ignored so the kernel can
/// add fields.
pub fn parse_pci(message: &str) -> Option<Result<PciFunction, String>> {
    let rest = message.strip_prefix("pci: ")?;
    let mut words = rest.split_whitespace();
    let (bus, device, function) = parse_bdf(words.next()?)?;
    if words.clone().next().is_some_and(|w| !w.contains(':') && !w.chars().all(|c| c.is_ascii_hexdigit())) {
        return None;
    }
    Some(parse_pci_rest(bus, device, function, words).map_err(|e| format!("bad PCI line `{message}`: {e}")))
}

fn parse_bdf(s: &str) -> Option<(u8, u8, u8)> {
    let (bus, df) = s.split_once(':')?;
    let (dev, func) = df.split_once('.')?;
    if bus.len() != 2 || dev.len() != 2 || func.len() != 1 {
        return None;
    }
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    (dev < 32 && func < 8).then_some((bus, dev, func))
}

fn parse_pci_rest<'a>(
    bus: u8,
    device: u8,
    function: u8,
    mut words: impl Iterator<Item = &'a str>,
) -> Result<PciFunction, String> {
    let ids = words.next().ok_or("no vendor:device")?;
    let (v, d) = ids.split_once(':').ok_or("vendor:device has no `:`")?;
    let hex16 = |s: &str| (s.len() == 4).then(|| u16::from_str_radix(s, 16).ok()).flatten();
    let vendor_id = hex16(v).ok_or_else(|| format!("bad vendor id `{v}`"))?;
    let device_id = hex16(d).ok_or_else(|| format!("bad device id `{d}`"))?;
    let class = words.next().and_then(|w| w.strip_prefix("class=")).ok_or("no class=")?;
    let parts: Vec<&str> = class.split('.').collect();
    let hex8 = |s: &str| (s.len() == 2).then(|| u8::from_str_radix(s, 16).ok()).flatten();
    let class = match parts.as_slice() {
        [c, s, p] => (hex8(c).ok_or("bad class")?, hex8(s).ok_or("bad subclass")?, hex8(p).ok_or("bad prog-if")?),
        _ => return Err(format!("bad class `{class}`")),
    };
    let mut bars = Vec::new();
    for w in words {
        let Some((key, value)) = w.split_once('=') else {
            continue;
        };
        let Some(index) = key.strip_prefix("bar") else {
            continue;
        };
        let index: u8 = index.parse().map_err(|_| format!("bad BAR name `{key}`"))?;
        if index > 5 {
            return Err(format!("BAR index {index} out of range"));
        }
        let (kind, span) = value.split_once(':').ok_or_else(|| format!("bad BAR `{w}`"))?;
        let kind = BarKind::parse(kind).ok_or_else(|| format!("unknown BAR kind `{kind}`"))?;
        let (addr, size) = span.split_once('+').ok_or_else(|| format!("BAR `{w}` has no `+size`"))?;
        let addr = parse_hex64(addr).ok_or_else(|| format!("bad BAR address `{addr}`"))?;
        let size = parse_hex64(size).ok_or_else(|| format!("bad BAR size `{size}`"))?;
        bars.push(Bar { index, kind, addr, size });
    }
    Ok(PciFunction { bus, device, function, vendor_id, device_id, class, bars })
}

fn parse_hex64(s: &str) -> Option<u64> {
    let h = s.strip_prefix("0x")?;
    if h.is_empty() || h.len() > 16 {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// Whether the line reports a fatal CPU exception.
pub fn is_exception(line: &str) -> bool {
    line.contains("EXCEPTION")
}

/// Whether the line reports a panic.
pub fn is_panic(line: &str) -> bool {
    line.contains("PANIC")
}

/// Whether the line reports a fatal boot error (`!!! c0 BOOT ERROR: ...`).
pub fn is_boot_error(line: &str) -> bool {
    line.contains("BOOT ERROR")
}

/// The value of the first `key=` token in `line` (tokens split on whitespace).
pub fn token_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_line() {
        let l = parse_log_line("[    0.012345] c0 INFO  smp: cpu 0 online apic=0 role=net").unwrap();
        assert_eq!((l.secs, l.micros, l.core, l.level), (0, 12345, 0, "INFO"));
        assert_eq!(l.message, "smp: cpu 0 online apic=0 role=net");
        let l = parse_log_line("[12.000001] c12 ERROR x").unwrap();
        assert_eq!((l.secs, l.core, l.level, l.message), (12, 12, "ERROR", "x"));
        let l = parse_log_line("\x1b[2J\x1b[0m[    1.000000] c1 WARN  late").unwrap();
        assert_eq!(l.message, "late");
        assert_eq!(parse_log_line("[0.1] c0 INFO x").unwrap().micros, 100_000);
        let l = parse_log_line("[    0.000000] c0 DEBUG").unwrap();
        assert_eq!(l.message, "");
        for bad in [
            "",
            "[",
            "[]",
            "[ 0.000001]c0 INFO x",
            "[ 0.000001] 0 INFO x",
            "[ a.000001] c0 INFO x",
            "[ 0.000001] c0 info x",
        ] {
            assert_eq!(parse_log_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ready_line() {
        let r = parse_ready(
            "leasebox: ready cores=3 mem_mib=256 pci=7 boot_ms=12.345 ap_ms=10.100 entry_ms=85.000 extra=yes junk",
        )
        .unwrap();
        assert_eq!(r.u64("cores"), Ok(3));
        assert_eq!(r.u64("mem_mib"), Ok(256));
        assert_eq!(r.u64("pci"), Ok(7));
        assert_eq!(r.ms("boot_ms"), Ok(12.345));
        assert_eq!(r.ms("ap_ms"), Ok(10.1));
        assert_eq!(r.get("extra"), Some("yes"));
        assert!(r.u64("nope").unwrap_err().contains("nope"));
        assert!(r.u64("boot_ms").is_err());
        assert!(parse_ready("\x1b[0mleasebox: ready cores=1\r").is_some());
        assert_eq!(parse_ready("leasebox: readying"), None);
        assert_eq!(parse_ready("[    0.1] c0 INFO  leasebox starting"), None);
        let r = parse_ready("leasebox: ready a= =b boot_ms=nan c=-1.0").unwrap();
        assert_eq!(r.get("a"), Some(""));
        assert!(r.ms("boot_ms").is_err());
        assert!(r.ms("c").is_err());
    }

    #[test]
    fn cpu_online() {
        assert_eq!(
            parse_cpu_online("smp: cpu 2 online apic=2 role=event"),
            Some(CpuOnline { cpu: 2, apic: 2, roles: "event".into() })
        );
        assert_eq!(parse_cpu_online("smp: cpu 1 online apic=0x10 role=cmd,event").unwrap().apic, 16);
        assert_eq!(parse_cpu_online("smp: cpu 1 offline apic=1 role=x"), None);
        assert_eq!(parse_cpu_online("smp: cpu x online apic=1 role=x"), None);
        assert_eq!(parse_cpu_online("smp: cpu 1 online"), None);
        assert_eq!(parse_cpu_online("smp: starting 2 APs"), None);
    }

    #[test]
    fn pci_line() {
        let m = "pci: 00:03.0 1af4:1110 class=05.00.00 bar0=mem32:0xfebd1000+0x100 bar2=mem64pf:0xfe800000+0x100000";
        let f = parse_pci(m).unwrap().unwrap();
        assert_eq!((f.bus, f.device, f.function), (0, 3, 0));
        assert_eq!(f.ids(), "1af4:1110");
        assert_eq!(f.class, (5, 0, 0));
        assert_eq!(f.bar(0), Some(&Bar { index: 0, kind: BarKind::Mem32, addr: 0xfebd1000, size: 0x100 }));
        assert_eq!(f.bar(2).unwrap().kind, BarKind::Mem64Pf);
        assert_eq!(f.bar(2).unwrap().size, 0x100000);
        assert_eq!(f.to_string(), m.strip_prefix("pci: ").unwrap());

        let e1000 = "pci: 00:03.0 8086:100e class=02.00.00 bar0=mem32:0xfebc0000+0x20000 bar1=io:0xc000+0x40 note=x";
        let f = parse_pci(e1000).unwrap().unwrap();
        assert_eq!(f.bar(1), Some(&Bar { index: 1, kind: BarKind::Io, addr: 0xc000, size: 0x40 }));
        let host = parse_pci("pci: 00:00.0 8086:29c0 class=06.00.00").unwrap().unwrap();
        assert!(host.bars.is_empty());
    }

    #[test]
    fn pci_other_and_malformed() {
        assert!(parse_pci("pci: ecam at 0xb0000000 buses 0-255").is_none());
        assert!(parse_pci("pci: 7 functions").is_none());
        let note = "pci: 00:02.0 ivshmem carries the mlx5 model (signature at BAR2+0x1fff000)";
        assert!(parse_pci(note).is_none());
        assert_eq!(parse_model_signature(note), Some("00:02.0"));
        assert_eq!(parse_model_signature("pci: 00:02.0 ivshmem without the mlx5 model's signature"), None);
        assert_eq!(parse_model_signature("pci: 00:02.0 1af4:1110 class=05.00.00"), None);
        assert!(parse_pci("smp: cpu 0 online apic=0 role=all").is_none());
        for bad in [
            "pci: 00:03.0",
            "pci: 00:03.0 1af4 class=05.00.00",
            "pci: 00:03.0 1af4:1110",
            "pci: 00:03.0 1af4:1110 class=5.0.0",
            "pci: 00:03.0 1af4:1110 class=05.00.00 bar0=mem:0x0+0x1",
            "pci: 00:03.0 1af4:1110 class=05.00.00 bar0=mem32:0x0",
            "pci: 00:03.0 1af4:1110 class=05.00.00 bar0=mem32:fe+0x1",
            "pci: 00:03.0 1af4:1110 class=05.00.00 bar9=mem32:0x0+0x1",
            "pci: 00:03.0 1af4:1110 class=05.00.00 bar0=mem32:0x11111111111111111+0x1",
        ] {
            assert!(parse_pci(bad).unwrap().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn fatal_markers() {
        let l = "[    0.5] c0 ERROR EXCEPTION #PF vector=14 error=0x2";
        assert!(is_exception(l));
        assert_eq!(token_value(l, "vector"), Some("14"));
        assert_eq!(token_value("rip=0x100123 cr2=0xdead0000", "cr2"), Some("0xdead0000"));
        assert_eq!(token_value("xrip=1", "rip"), None);
        assert!(is_panic("PANIC at image/src/main.rs:10: test=panic"));
        assert!(!is_exception("leasebox: ready cores=1"));
        assert!(is_boot_error("!!! c0 BOOT ERROR: command line: bad option log=loud: unknown level"));
    }
}
