//! What one boot produced — serial lines, how QEMU ended, timing — and the questions the checks ask of it.

use std::fmt::Write as _;
use std::time::Duration;

use leasebox_qemu::QemuExit;

use crate::serial::{self, CpuOnline, PciFunction, Ready};

/// The record of one QEMU run.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    /// The QEMU command line.
    pub command: String,
    /// Serial lines, terminators removed.
    pub lines: Vec<String>,
    /// Lines dropped beyond the capture limit.
    pub dropped_lines: usize,
    /// How QEMU ended on its own; `None` when the runner killed it (after it had what it needed, or at the
    /// deadline).
    pub exit: Option<QemuExit>,
    /// The deadline passed before the run had what it waited for.
    pub timed_out: bool,
    /// The run's deadline.
    pub deadline: Duration,
    /// Host time from spawning QEMU to reading the ready line.
    pub ready_after: Option<Duration>,
    /// What QEMU wrote to stderr.
    pub stderr: String,
    /// With the mlx5 model: its command trace (one JSON object per line), read after QEMU stopped.
    pub model_trace: Option<String>,
    /// With two serial ports (`Scenario::com2`): what COM1 received, read after QEMU stopped (`lines` is COM2).
    pub com1: Option<String>,
}

impl Transcript {
    /// A transcript of sample text (tests).
    pub fn from_text(text: &str) -> Transcript {
        Transcript { lines: text.lines().map(str::to_string).collect(), ..Transcript::default() }
    }

    /// Why the run ended, for messages.
    pub fn ending(&self) -> String {
        match (self.exit, self.timed_out) {
            (_, true) => format!("nothing more within the {} s deadline", self.deadline.as_secs()),
            (Some(e), _) => e.to_string(),
            (None, false) => "stopped by the runner".to_string(),
        }
    }

    /// Every ready line.
    pub fn ready_lines(&self) -> Vec<Ready> {
        self.lines.iter().filter_map(|l| serial::parse_ready(l)).collect()
    }

    /// The one ready line.
    pub fn ready(&self) -> Result<Ready, String> {
        let mut all = self.ready_lines();
        match all.len() {
            1 => Ok(all.remove(0)),
            0 => Err(format!("no `{}` line ({})", serial::READY_MARKER, self.ending())),
            n => Err(format!("{n} ready lines, expected exactly one")),
        }
    }

    /// Log messages (lines that parse as log lines).
    pub fn messages(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().filter_map(|l| serial::parse_log_line(l).map(|l| l.message))
    }

    /// The PCI listing; an error if any listing line is malformed.
    pub fn pci(&self) -> Result<Vec<PciFunction>, String> {
        self.messages().filter_map(serial::parse_pci).collect()
    }

    /// Every `smp: cpu N online` report, in order.
    pub fn cpus_online(&self) -> Vec<CpuOnline> {
        self.messages().filter_map(serial::parse_cpu_online).collect()
    }

    /// Fails if any line reports an exception, a panic or a boot error.
    pub fn no_fatal(&self) -> Result<(), String> {
        let fatal = |l: &str| serial::is_exception(l) || serial::is_panic(l) || serial::is_boot_error(l);
        match self.lines.iter().find(|l| fatal(l)) {
            Some(l) => Err(format!("fatal line in output: `{}`", l.trim())),
            None => Ok(()),
        }
    }

    /// The lines from the first one matching `pred` on.
    pub fn from_first(&self, pred: impl Fn(&str) -> bool) -> Option<&[String]> {
        let i = self.lines.iter().position(|l| pred(l))?;
        Some(&self.lines[i..])
    }

    /// The last `n` lines.
    pub fn tail(&self, n: usize) -> &[String] {
        &self.lines[self.lines.len().saturating_sub(n)..]
    }

    /// The whole record as text, for the per-scenario log file.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "command: {}", self.command);
        let _ = writeln!(s, "ending: {}", self.ending());
        if let Some(r) = self.ready_after {
            let _ = writeln!(s, "ready after: {:.3} s", r.as_secs_f64());
        }
        let _ = writeln!(s, "--- serial ({} lines, {} dropped) ---", self.lines.len(), self.dropped_lines);
        for l in &self.lines {
            let _ = writeln!(s, "{l}");
        }
        let _ = writeln!(s, "--- stderr ---");
        s.push_str(&self.stderr);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "\
SeaBIOS (version 1.16.2-debian-1.16.2-1)\r
[    0.000100] c0 INFO  leasebox starting\r
[    0.000200] c0 INFO  smp: cpu 0 online apic=0 role=net,cmd,event
[    0.001000] c0 INFO  pci: ecam at 0xb0000000
[    0.001100] c0 INFO  pci: 00:00.0 8086:29c0 class=06.00.00
[    0.001200] c0 INFO  pci: 00:02.0 8086:100e class=02.00.00 bar0=mem32:0xfeb80000+0x20000 bar1=io:0xc000+0x40
leasebox: ready cores=1 mem_mib=256 pci=2 boot_ms=3.000 ap_ms=0.000 entry_ms=80.500
";

    #[test]
    fn queries() {
        let t = Transcript::from_text(BOOT);
        assert_eq!(t.ready().unwrap().u64("pci"), Ok(2));
        assert_eq!(t.pci().unwrap().len(), 2);
        assert_eq!(t.cpus_online().len(), 1);
        assert!(t.no_fatal().is_ok());
        assert_eq!(t.messages().count(), 5);
        assert_eq!(t.tail(1), [t.lines.last().unwrap().clone()]);
        assert!(t.render().contains("--- serial (7 lines"));
    }

    #[test]
    fn ready_errors() {
        let mut t = Transcript::from_text("[    0.1] c0 INFO  x\n");
        t.timed_out = true;
        t.deadline = Duration::from_secs(60);
        assert!(t.ready().unwrap_err().contains("60 s deadline"));
        let t = Transcript::from_text("leasebox: ready cores=1\nleasebox: ready cores=1\n");
        assert!(t.ready().unwrap_err().contains("2 ready lines"));
        let mut t = Transcript::from_text("");
        t.exit = Some(QemuExit::DebugExit { value: 1 });
        assert!(t.ready().unwrap_err().contains("status 3"));
    }

    #[test]
    fn malformed_pci_line_is_an_error() {
        let t = Transcript::from_text("[    0.000001] c0 INFO  pci: 00:01.0 zzzz:0000 class=06.00.00\n");
        assert!(t.pci().is_err());
    }
}
