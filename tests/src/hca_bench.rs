//! `cargo xtask bench hca`, QEMU part: kernel entry → HCA ready under TCG, one CPU, `-kernel` on Q35 with the
//! mlx5 model (the `hca-bringup` boot with the one-CPU layout). Per run: (a) the timestamp of the kernel's
//! `mlx5: up:` log line (seconds since kernel entry) and (b) the ready line's `hca_ms` (the driver's
//! bring-up, pre-init wait to port state). Also the goals line, from the hosted figures the `hca_bench`
//! example prints on its `summary:` line. Figures only; nothing asserted.

use std::fmt::Write as _;

use crate::bench::median;
use crate::scenario::{Scenario, Until};
use crate::serial;
use crate::transcript::Transcript;
use crate::{Artifacts, run};

/// Boots unless told otherwise.
pub const DEFAULT_RUNS: usize = 3;
/// Goal: the many-slot command rate over the one-slot rate, against the model.
pub const GOAL_SLOT_RATIO: f64 = 10.0;
/// Goal: the driver's CPU time per command, natively, ns.
pub const GOAL_DRIVER_NS: f64 = 2_000.0;

/// The boot: `hca-bringup`'s, with one CPU and a check that only needs the figures.
pub fn scenario() -> Scenario {
    let base = crate::scenario::boot_scenario("hca-bringup").expect("the hca-bringup scenario exists");
    Scenario {
        name: "hca-bench",
        about: "kernel entry → HCA ready, one CPU, with the mlx5 model",
        smp: 1,
        until: Until::Ready,
        model: true,
        check: |t| Sample::from_transcript(t).map(drop),
        ..base
    }
}

/// One boot's figures, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Kernel entry → the `mlx5: up:` line.
    pub up_ms: f64,
    /// The driver's bring-up (`hca_ms`).
    pub hca_ms: f64,
}

impl Sample {
    pub fn from_transcript(t: &Transcript) -> Result<Sample, String> {
        let up = t
            .lines
            .iter()
            .filter_map(|l| serial::parse_log_line(l))
            .find(|l| l.message.starts_with("mlx5: up:"))
            .ok_or_else(|| format!("no `mlx5: up:` line ({})", t.ending()))?;
        let ready = t.ready()?;
        if ready.get("hca") == Some("failed") || ready.get("hca") == Some("none") {
            return Err(format!("the HCA did not come up: hca={}", ready.get("hca").unwrap_or("")));
        }
        Ok(Sample { up_ms: up.secs as f64 * 1000.0 + f64::from(up.micros) / 1000.0, hca_ms: ready.ms("hca_ms")? })
    }

    /// Kernel entry → the driver's first step (what the kernel does before bring-up).
    pub fn before_ms(&self) -> f64 {
        self.up_ms - self.hca_ms
    }
}

/// Boots once and measures.
pub fn sample(a: &Artifacts) -> Result<Sample, String> {
    let mut a = a.clone();
    a.log_dir = a.log_dir.join("bench");
    let t = run(&scenario(), &a)?;
    Sample::from_transcript(&t)
}

/// The hosted figures from the example's `summary:` line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hosted {
    /// Many-slot / one-slot rate, commands at the model's own speed.
    pub query_ratio: f64,
    pub pair_ratio: f64,
    /// The same with the model holding each command `fw_us` (firmware time).
    pub query_ratio_fw: f64,
    pub pair_ratio_fw: f64,
    pub fw_us: f64,
    /// Worst row, model on its own thread.
    pub driver_ns_max: f64,
    /// Worst row, model stepped in-process (no second thread contending for the memories).
    pub driver_ns_max_in_process: f64,
}

impl Hosted {
    /// Finds and parses the `summary:` line in the example's output.
    pub fn parse(output: &str) -> Option<Hosted> {
        let line = crate::bench::SummaryLine::find(output)?;
        let field = |key: &str| line.field(key);
        Some(Hosted {
            query_ratio: field("query_ratio")?,
            pair_ratio: field("pair_ratio")?,
            query_ratio_fw: field("query_ratio_fw")?,
            pair_ratio_fw: field("pair_ratio_fw")?,
            fw_us: field("fw_us")?,
            driver_ns_max: field("driver_ns_max")?,
            driver_ns_max_in_process: field("driver_ns_max_in_process")?,
        })
    }
}

fn stats(values: &[f64]) -> [String; 3] {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match median(values) {
        Some(m) => [format!("{m:.1}"), format!("{min:.1}"), format!("{max:.1}")],
        None => ["—".into(), "—".into(), "—".into()],
    }
}

/// The QEMU table: median, min and max of each figure, then failed runs.
pub fn report(samples: &[Sample], failures: &[String]) -> String {
    let rows = [
        ("kernel entry → `mlx5: up:` (ms)", samples.iter().map(|s| s.up_ms).collect::<Vec<_>>()),
        ("HCA bring-up, hca_ms (ms)", samples.iter().map(|s| s.hca_ms).collect()),
        ("kernel entry → bring-up start (ms)", samples.iter().map(Sample::before_ms).collect()),
    ];
    let w = rows.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(out, "QEMU, -kernel on Q35, 1 CPU, TCG, with the mlx5 model process:");
    let _ = writeln!(out, "{:<w$} | {:>8} | {:>8} | {:>8}", "figure", "median", "min", "max");
    let _ = writeln!(out, "{:-<w$}-|----------|----------|---------", "");
    for (label, values) in &rows {
        let [m, lo, hi] = stats(values);
        let pad = w - label.chars().count();
        let _ = writeln!(out, "{label}{} | {m:>8} | {lo:>8} | {hi:>8}", " ".repeat(pad));
    }
    let _ = writeln!(
        out,
        "({} of {} boots measured; TCG figures: compare ratios, not absolute times)",
        samples.len(),
        samples.len() + failures.len()
    );
    for f in failures {
        let _ = writeln!(out, "failed boot: {f}");
    }
    out
}

/// The goals and whether each was met (a printed comparison, not an assertion).
pub fn goals(hosted: Option<&Hosted>) -> String {
    let Some(h) = hosted else {
        return format!(
            "goals: 30 slots ≥ {GOAL_SLOT_RATIO:.0}× the 1-slot rate; driver ≤ {GOAL_DRIVER_NS:.0} ns per command — \
             no hosted figures\n"
        );
    };
    let met = |ok: bool| if ok { "met" } else { "NOT MET" };
    let ratio_ok = h.query_ratio_fw >= GOAL_SLOT_RATIO && h.pair_ratio_fw >= GOAL_SLOT_RATIO;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "goal: 30 regular slots ≥ {GOAL_SLOT_RATIO:.0}× the 1-slot rate against the model holding each command \
         {:.0} µs: QUERY_MKEY {:.1}×, CREATE+DESTROY pairs {:.1}× — {} (at the model's own speed, where both \
         sides are CPU-bound on this machine: {:.1}× and {:.1}×)",
        h.fw_us,
        h.query_ratio_fw,
        h.pair_ratio_fw,
        met(ratio_ok),
        h.query_ratio,
        h.pair_ratio
    );
    let _ = writeln!(
        out,
        "goal: driver ≤ {GOAL_DRIVER_NS:.0} ns per command natively: worst row {:.0} ns with the model on its own \
         thread — {}; {:.0} ns with the model in-process — {}",
        h.driver_ns_max,
        met(h.driver_ns_max <= GOAL_DRIVER_NS),
        h.driver_ns_max_in_process,
        met(h.driver_ns_max_in_process <= GOAL_DRIVER_NS)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "\
[    0.000010] c0 INFO  smp: cpu 0 online apic=0 role=net,cmd,event
[    0.276992] c0 INFO  mlx5: up: fw 16.35.4030 issi 1 pages boot 6 init 12868 uar 16 eqn 0 mac [2] mtu 4096 port Active
leasebox: ready cores=1 mem_mib=256 pci=3 boot_ms=300.000 ap_ms=0.000 entry_ms=90.000 hca=ConnectX-5 fw=16.35.4030 port=Active hca_ms=230.093
";

    #[test]
    fn sample_from_a_boot() {
        let s = Sample::from_transcript(&Transcript::from_text(BOOT)).unwrap();
        assert!((s.up_ms - 276.992).abs() < 1e-9, "{s:?}");
        assert_eq!(s.hca_ms, 230.093);
        assert!((s.before_ms() - 46.899).abs() < 1e-9);
        assert_eq!((scenario().check)(&Transcript::from_text(BOOT)), Ok(()));
        let no_up = BOOT.replace("mlx5: up:", "mlx5: down:");
        assert!(Sample::from_transcript(&Transcript::from_text(&no_up)).unwrap_err().contains("mlx5: up:"));
        let failed = BOOT.replace("hca=ConnectX-5", "hca=failed");
        assert!(Sample::from_transcript(&Transcript::from_text(&failed)).is_err());
    }

    #[test]
    fn the_boot_is_hca_bringup_with_one_cpu() {
        let s = scenario();
        assert_eq!((s.smp, s.model, s.until), (1, true, Until::Ready));
        assert_eq!(s.boot, crate::BootKind::Kernel);
    }

    #[test]
    fn summary_line_and_goals() {
        let out = "table\nsummary: query_ratio=3.47 pair_ratio=3.80 query_ratio_fw=9.50 pair_ratio_fw=12.00 fw_us=20 \
                   driver_ns_max=1811 driver_ns_max_in_process=716\n";
        let h = Hosted::parse(out).unwrap();
        assert_eq!(
            (h.query_ratio, h.pair_ratio, h.query_ratio_fw, h.pair_ratio_fw, h.fw_us),
            (3.47, 3.8, 9.5, 12.0, 20.0)
        );
        assert_eq!((h.driver_ns_max, h.driver_ns_max_in_process), (1811.0, 716.0));
        assert!(Hosted::parse("summary: query_ratio=1\n").is_none());
        let g = goals(Some(&h));
        let first = g.lines().next().unwrap();
        assert!(first.contains("holding each command 20 µs: QUERY_MKEY 9.5×") && first.contains("NOT MET"), "{g}");
        assert!(first.contains("own speed") && first.contains("3.5× and 3.8×"), "{g}");
        assert!(g.contains("worst row 1811 ns with the model on its own thread — met"), "{g}");
        let good = Hosted { query_ratio_fw: 10.0, ..h };
        assert!(goals(Some(&good)).lines().next().unwrap().contains("— met"));
        assert!(goals(None).contains("no hosted figures"));
    }

    #[test]
    fn report_has_median_min_max_and_failures() {
        let s = |up, hca| Sample { up_ms: up, hca_ms: hca };
        let r = report(&[s(300.0, 230.0), s(280.0, 220.0), s(290.0, 240.0)], &["timed out".into()]);
        assert!(r.contains("|    290.0 |    280.0 |    300.0"), "{r}");
        assert!(r.contains("|    230.0 |    220.0 |    240.0"), "{r}");
        assert!(r.contains("3 of 4 boots"));
        assert!(r.contains("failed boot: timed out"));
        assert!(report(&[], &[]).contains("—"));
    }
}
