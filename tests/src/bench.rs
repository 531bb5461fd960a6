//! Boot-time measurements (`cargo xtask bench boot`): figures only, nothing asserted.
//!
//! Per run, the host measures T_total, QEMU spawn → ready line read; the ready line supplies boot_ms (kernel
//! entry → ready, kernel TSC), ap_ms (the part spent starting APs) and entry_ms (guest TSC at kernel entry;
//! under TCG the TSC starts near 0 at VM start). The table shows medians of the per-run figures:
//! QEMU start → kernel entry = T_total − boot_ms; kernel entry → ready = boot_ms − ap_ms; AP start-up = ap_ms.
//! Under TCG these are not native figures: compare ratios between paths, not absolute times.
//!
//! A second table boots the appliance as shipped (the mlx5 model attached, the lease service up; `-kernel`,
//! q35, one CPU) once per control NIC — virtio-net, and the ConnectX-5 model's own Ethernet port with no
//! virtio-net — and measures QEMU spawn → the forwarded control port answers a HELLO, and QEMU spawn → ready
//! line, which must report the NIC, `hca=ConnectX-5` and `lease=on`. Before the guest listens, QEMU's user
//! network accepts the host's connection and the guest never answers it, so each probe is a fresh connection
//! that waits [`probe_wait`] for the answer, [`PROBE_PAUSE`] apart: the figure is late by up to their sum.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use leasebox_qemu::Machine;

use crate::control::{self, Nic};
use crate::scenario::{BootKind, Scenario, Until};
use crate::transcript::Transcript;
use crate::{Artifacts, run};

/// Runs per row unless told otherwise.
pub const DEFAULT_RUNS: usize = 5;
/// Goal: kernel entry → ready with one CPU, ms.
pub const GOAL_ENTRY_TO_READY_MS: f64 = 30.0;
/// Goal: size of leasebox.elf, bytes.
pub const GOAL_ELF_BYTES: u64 = 1024 * 1024;

/// The `summary:` line a benchmark example prints last: `key=number` words (`cargo xtask bench hca`, `lease`).
pub struct SummaryLine<'a>(&'a str);

impl<'a> SummaryLine<'a> {
    /// The last `summary:` line in `output`.
    pub fn find(output: &'a str) -> Option<SummaryLine<'a>> {
        output.lines().rev().find_map(|l| l.strip_prefix("summary:")).map(SummaryLine)
    }

    /// The number after `key=`.
    pub fn field(&self, key: &str) -> Option<f64> {
        self.0.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse::<f64>().ok())
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub label: &'static str,
    pub boot: BootKind,
    pub machine: Machine,
    pub smp: u32,
}

/// The rows: each boot path with one CPU, then `-kernel` with three CPUs so AP start-up shows.
pub fn rows() -> Vec<Row> {
    vec![
        Row { label: "-kernel (q35, smp 1)", boot: BootKind::Kernel, machine: Machine::Q35, smp: 1 },
        Row { label: "GRUB BIOS (q35, smp 1)", boot: BootKind::GrubBios, machine: Machine::Q35, smp: 1 },
        Row { label: "GRUB UEFI (q35, smp 1)", boot: BootKind::GrubUefi, machine: Machine::Q35, smp: 1 },
        Row { label: "-kernel (q35, smp 3)", boot: BootKind::Kernel, machine: Machine::Q35, smp: 3 },
    ]
}

impl Row {
    /// The row as a scenario (ready line only, no check beyond it).
    pub fn scenario(&self) -> Scenario {
        Scenario {
            name: "bench",
            about: "boot-time measurement",
            boot: self.boot,
            machine: self.machine,
            smp: self.smp,
            mem_mib: leasebox_qemu::config::DEFAULT_MEM_MIB,
            kernel_args: "",
            extra: Vec::new(),
            deadline: self.boot.deadline(),
            until: Until::Ready,
            model: false,
            model_vf: false,
            model_slot: leasebox_qemu::ModelSlot::RootBus,
            com2: false,
            spcr_port: None,
            check: |t| t.ready().map(|_| ()),
        }
    }
}

/// The figures of one run, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub total_ms: f64,
    pub boot_ms: f64,
    pub ap_ms: f64,
    pub entry_ms: f64,
}

impl Sample {
    /// Extracts the figures from a transcript.
    pub fn from_transcript(t: &Transcript) -> Result<Sample, String> {
        let ready = t.ready()?;
        let total = t.ready_after.ok_or("the ready line's arrival time was not recorded")?;
        Ok(Sample {
            total_ms: total.as_secs_f64() * 1000.0,
            boot_ms: ready.ms("boot_ms")?,
            ap_ms: ready.ms("ap_ms")?,
            entry_ms: ready.ms("entry_ms")?,
        })
    }

    pub fn qemu_to_entry(&self) -> f64 {
        self.total_ms - self.boot_ms
    }

    pub fn entry_to_ready(&self) -> f64 {
        self.boot_ms - self.ap_ms
    }
}

/// Boots `row` once and measures it.
pub fn sample(row: &Row, a: &Artifacts) -> Result<Sample, String> {
    let mut a = a.clone();
    a.log_dir = a.log_dir.join("bench");
    let t = run(&row.scenario(), &a)?;
    Sample::from_transcript(&t)
}

/// The median (mean of the middle two for an even count); `None` for no values.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// The results of one row.
#[derive(Clone, Debug)]
pub struct RowResult {
    pub row: Row,
    pub samples: Vec<Sample>,
    /// Failure reasons of runs that produced no sample.
    pub failures: Vec<String>,
}

impl RowResult {
    fn median_of(&self, f: impl Fn(&Sample) -> f64) -> Option<f64> {
        median(&self.samples.iter().map(f).collect::<Vec<_>>())
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("—".to_string(), |x| format!("{x:.1}"))
}

/// The table of medians, then the goals.
pub fn report(results: &[RowResult], elf_bytes: Option<u64>) -> String {
    let headers = [
        "path",
        "qemu start → kernel entry (ms)",
        "kernel entry → ready (ms)",
        "AP start-up (ms)",
        "guest TSC at entry (ms)",
        "spawn → ready (ms)",
        "runs ok",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for r in results {
        rows.push(vec![
            r.row.label.to_string(),
            cell(r.median_of(Sample::qemu_to_entry)),
            cell(r.median_of(Sample::entry_to_ready)),
            cell(r.median_of(|s| s.ap_ms)),
            cell(r.median_of(|s| s.entry_ms)),
            cell(r.median_of(|s| s.total_ms)),
            format!("{}/{}", r.samples.len(), r.samples.len() + r.failures.len()),
        ]);
    }
    let mut out = mlx5_hosted::table::render(&headers, &rows, 1);
    out.push_str("(medians; TCG figures: compare ratios, not absolute times)\n\n");

    let one_cpu = results.iter().find(|r| r.row.boot == BootKind::Kernel && r.row.smp == 1);
    let entry_ready = one_cpu.and_then(|r| r.median_of(Sample::entry_to_ready));
    let verdict = |ok: bool| if ok { "within goal" } else { "OVER GOAL" };
    match entry_ready {
        Some(v) => {
            let _ = writeln!(
                out,
                "kernel entry → ready, one CPU (-kernel): {v:.1} ms — goal ≤ {GOAL_ENTRY_TO_READY_MS:.0} ms: {}",
                verdict(v <= GOAL_ENTRY_TO_READY_MS)
            );
        }
        None => {
            let _ = writeln!(out, "kernel entry → ready, one CPU: no figure — goal ≤ {GOAL_ENTRY_TO_READY_MS:.0} ms");
        }
    }
    match elf_bytes {
        Some(b) => {
            let _ = writeln!(
                out,
                "leasebox.elf: {b} bytes ({:.1} KiB) — goal ≤ 1 MiB: {}",
                b as f64 / 1024.0,
                verdict(b <= GOAL_ELF_BYTES)
            );
        }
        None => out.push_str("leasebox.elf: not found — goal ≤ 1 MiB\n"),
    }
    for r in results {
        for f in &r.failures {
            let _ = writeln!(out, "failed run, {}: {f}", r.row.label);
        }
    }
    out
}

/// How long one HELLO probe waits for the answer: [`PROBE_WAIT`] (a HELLO under TCG takes a few ms), then
/// [`PROBE_WAIT_SLOW`] from probe [`PROBE_FAST`] on (about 10 s after spawn), so a host too busy to answer
/// within [`PROBE_WAIT`] still gets a figure.
pub const PROBE_WAIT: Duration = Duration::from_millis(25);
pub const PROBE_WAIT_SLOW: Duration = Duration::from_secs(1);
pub const PROBE_FAST: u32 = 300;
/// Pause between HELLO probes.
pub const PROBE_PAUSE: Duration = Duration::from_millis(10);

/// The wait of probe `n` (from 0).
pub fn probe_wait(n: u32) -> Duration {
    if n < PROBE_FAST { PROBE_WAIT } else { PROBE_WAIT_SLOW }
}

/// One boot of the appliance as shipped, ms after QEMU's spawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControlSample {
    /// The control port answered a HELLO.
    pub answers_ms: f64,
    /// The host read the ready line.
    pub ready_ms: f64,
}

/// Boots the appliance as shipped with the control channel on `nic` and measures it (see the module text).
pub fn control_sample(a: &Artifacts, nic: Nic) -> Result<ControlSample, String> {
    let mut t = control::spawn_appliance(a, 1, nic, "")?;
    let started = t.qemu_started().ok_or("no QEMU behind the appliance")?;
    let deadline = started + control::SHIPPED_BOOT_DEADLINE;
    let mut probes = 0u32;
    let answered = loop {
        let wait = probe_wait(probes);
        probes += 1;
        match t.probe_hello(wait) {
            Ok(()) => break Instant::now(),
            Err(_) if t.qemu_exited() => return Err("QEMU exited before the control port answered".into()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "the control port did not answer within {} s: {e}",
                    control::SHIPPED_BOOT_DEADLINE.as_secs()
                ));
            }
            Err(_) => std::thread::sleep(PROBE_PAUSE),
        }
    };
    let (_, ready_at) = t.wait_ready(control::SHIPPED_BOOT_DEADLINE)?;
    let ms = |at: Instant| at.saturating_duration_since(started).as_secs_f64() * 1000.0;
    Ok(ControlSample { answers_ms: ms(answered), ready_ms: ms(ready_at) })
}

/// The runs of one NIC.
#[derive(Clone, Debug)]
pub struct ControlResult {
    pub nic: Nic,
    pub samples: Vec<ControlSample>,
    pub failures: Vec<String>,
}

/// The row label of `nic`'s boots.
pub fn control_label(nic: Nic) -> String {
    format!("control NIC {} (-kernel, q35, smp 1)", nic.label())
}

/// The second table: medians per NIC, then the failed runs.
pub fn control_report(results: &[ControlResult]) -> String {
    let headers = [
        "appliance as shipped (model, lease service)",
        "QEMU start → control port answers (ms)",
        "QEMU start → ready line (ms)",
        "runs ok",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let med = |f: fn(&ControlSample) -> f64| median(&r.samples.iter().map(f).collect::<Vec<_>>());
            vec![
                control_label(r.nic),
                cell(med(|s| s.answers_ms)),
                cell(med(|s| s.ready_ms)),
                format!("{}/{}", r.samples.len(), r.samples.len() + r.failures.len()),
            ]
        })
        .collect();
    let mut out = mlx5_hosted::table::render(&headers, &rows, 1);
    let _ = writeln!(
        out,
        "(medians; the answer is a HELLO probe's, a fresh connection every {} ms that waits {} ms for it, so up to \
         ~{} ms late; TCG figures: compare the NICs, not absolute times)",
        PROBE_PAUSE.as_millis(),
        PROBE_WAIT.as_millis(),
        (PROBE_WAIT + PROBE_PAUSE).as_millis()
    );
    for r in results {
        for f in &r.failures {
            let _ = writeln!(out, "failed run, {}: {f}", control_label(r.nic));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn sample_from_transcript() {
        let mut t = Transcript::from_text(
            "x\nleasebox: ready cores=3 mem_mib=256 pci=3 boot_ms=25.500 ap_ms=20.000 entry_ms=90.250\n",
        );
        t.ready_after = Some(Duration::from_millis(150));
        let s = Sample::from_transcript(&t).unwrap();
        assert_eq!(s.total_ms, 150.0);
        assert_eq!(s.qemu_to_entry(), 124.5);
        assert_eq!(s.entry_to_ready(), 5.5);
        assert_eq!(s.entry_ms, 90.25);
        let t = Transcript::from_text("leasebox: ready cores=1 boot_ms=1.000\n");
        assert!(Sample::from_transcript(&t).is_err());
    }

    #[test]
    fn report_has_rows_goals_and_failures() {
        let s = Sample { total_ms: 120.0, boot_ms: 12.0, ap_ms: 0.0, entry_ms: 100.0 };
        let rows = rows();
        let results = vec![
            RowResult { row: rows[0].clone(), samples: vec![s, s, s], failures: vec![] },
            RowResult { row: rows[2].clone(), samples: vec![], failures: vec!["timed out".into()] },
        ];
        let r = report(&results, Some(600 * 1024));
        assert!(r.contains("qemu start → kernel entry (ms)"), "{r}");
        assert!(r.contains("108.0"), "{r}");
        assert!(r.contains("3/3"));
        assert!(r.contains("0/1"));
        assert!(r.contains("12.0 ms — goal ≤ 30 ms: within goal"), "{r}");
        assert!(r.contains("614400 bytes (600.0 KiB)"), "{r}");
        assert!(r.contains("failed run, GRUB UEFI (q35, smp 1): timed out"));
        let r = report(&[], Some(2 * 1024 * 1024));
        assert!(r.contains("OVER GOAL"));
    }

    #[test]
    fn probes_wait_longer_when_slow() {
        assert_eq!(probe_wait(0), PROBE_WAIT);
        assert_eq!(probe_wait(PROBE_FAST - 1), PROBE_WAIT);
        assert_eq!(probe_wait(PROBE_FAST), PROBE_WAIT_SLOW);
        assert!(PROBE_WAIT < PROBE_WAIT_SLOW);
    }

    #[test]
    fn control_report_has_both_nics() {
        let s = |answers_ms, ready_ms| ControlSample { answers_ms, ready_ms };
        let results = vec![
            ControlResult { nic: Nic::Virtio, samples: vec![s(900.0, 850.0), s(1100.0, 1000.0)], failures: vec![] },
            ControlResult { nic: Nic::Mlx5, samples: vec![s(1500.0, 1400.0)], failures: vec!["no ready line".into()] },
        ];
        let r = control_report(&results);
        let lines: Vec<&str> = r.lines().collect();
        assert!(lines[0].contains("QEMU start → control port answers (ms)"), "{r}");
        let cells = |l: &str| l.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
        assert_eq!(cells(lines[2]), ["control NIC virtio-net (-kernel, q35, smp 1)", "1000.0", "925.0", "2/2"]);
        assert_eq!(cells(lines[3]), ["control NIC CX-5 port (-kernel, q35, smp 1)", "1500.0", "1400.0", "1/2"]);
        assert!(r.contains("failed run, control NIC CX-5 port (-kernel, q35, smp 1): no ready line"), "{r}");
        let empty = control_report(&[ControlResult { nic: Nic::Mlx5, samples: vec![], failures: vec![] }]);
        assert!(empty.lines().nth(2).unwrap().contains("— | "), "{empty}");
    }

    #[test]
    fn rows_cover_each_path() {
        let r = rows();
        assert_eq!(r.len(), 4);
        assert!(r.iter().any(|r| r.boot == BootKind::GrubUefi));
        assert!(r.iter().any(|r| r.boot == BootKind::Kernel && r.smp == 3));
        assert!(r.iter().all(|r| r.scenario().until == Until::Ready));
    }
}
