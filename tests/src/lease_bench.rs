//! `cargo xtask bench lease`: the goals, from the figures the `lease_bench` example of `leasebox-lease` prints
//! on its `summary:` line (hosted, native timing, the model on its own thread). Figures only; nothing
//! asserted.

use std::fmt::Write as _;

/// Seconds of load per latency row unless told otherwise.
pub const DEFAULT_SECS: u64 = 2;
/// Leases in the mass revoke unless told otherwise.
pub const DEFAULT_LEASES: u32 = 10_000;
/// The most `--leases` may ask for (the model's QP table, the shared RAM).
pub const MAX_LEASES: u32 = 16_000;
/// Goal: REVOKE appliance-side time (request in → outcome out, minus the HCA's own time), p99 with 8 clients, µs.
pub const GOAL_REVOKE_APPLIANCE_US: f64 = 2.0;
/// Goal: ALLOC appliance-side time, p99, µs.
pub const GOAL_ALLOC_APPLIANCE_US: f64 = 5.0;
/// Goal: the mass revoke's last outcome within this multiple of the model's DESTROY_MKEY commands alone,
/// pipelined over the command slots.
pub const GOAL_MASS_RATIO: f64 = 1.5;

/// The example's `summary:` line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// ALLOC appliance-side p99 with 1 and 8 clients, µs.
    pub alloc_app_p99_us_1: f64,
    pub alloc_app_p99_us_8: f64,
    /// REVOKE appliance-side p99 with 1 and 8 clients, µs.
    pub revoke_app_p99_us_1: f64,
    pub revoke_app_p99_us_8: f64,
    /// The service's CPU time per REVOKE, p99, µs.
    pub revoke_cpu_p99_us_1: f64,
    pub revoke_cpu_p99_us_8: f64,
    pub leases: f64,
    /// First REVOKE request → last outcome, and → every slot free again, ms.
    pub mass_last_ms: f64,
    pub mass_swept_ms: f64,
    /// The same commands alone through the driver's client, every slot busy: DESTROY_MKEY ×leases, and the
    /// sweep's four per lease, ms.
    pub model_mkey_ms: f64,
    pub model_sweep_ms: f64,
    /// mass_last_ms / model_mkey_ms; mass_swept_ms / (model_mkey_ms + model_sweep_ms).
    pub mass_ratio: f64,
    pub sweep_ratio: f64,
    /// Mass revoke outcomes that were Fenced.
    pub fenced: f64,
}

impl Summary {
    /// Finds and parses the `summary:` line in the example's output.
    pub fn parse(output: &str) -> Option<Summary> {
        let line = crate::bench::SummaryLine::find(output)?;
        let field = |key: &str| line.field(key);
        Some(Summary {
            alloc_app_p99_us_1: field("alloc_app_p99_us_1")?,
            alloc_app_p99_us_8: field("alloc_app_p99_us_8")?,
            revoke_app_p99_us_1: field("revoke_app_p99_us_1")?,
            revoke_app_p99_us_8: field("revoke_app_p99_us_8")?,
            revoke_cpu_p99_us_1: field("revoke_cpu_p99_us_1")?,
            revoke_cpu_p99_us_8: field("revoke_cpu_p99_us_8")?,
            leases: field("leases")?,
            mass_last_ms: field("mass_last_ms")?,
            mass_swept_ms: field("mass_swept_ms")?,
            model_mkey_ms: field("model_mkey_ms")?,
            model_sweep_ms: field("model_sweep_ms")?,
            mass_ratio: field("mass_ratio")?,
            sweep_ratio: field("sweep_ratio")?,
            fenced: field("fenced")?,
        })
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT MET" }
}

/// The goals and whether each was met (a printed comparison, not an assertion).
pub fn goals(s: Option<&Summary>) -> String {
    let Some(s) = s else {
        return format!(
            "goals: REVOKE appliance-side ≤ {GOAL_REVOKE_APPLIANCE_US:.0} µs p99 with 8 clients; ALLOC \
             appliance-side ≤ {GOAL_ALLOC_APPLIANCE_US:.0} µs p99; mass revoke ≤ {GOAL_MASS_RATIO}× the model's \
             commands alone — no summary line from lease_bench\n"
        );
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "goal: REVOKE appliance-side time (request in → outcome out, minus the HCA's own time) ≤ \
         {GOAL_REVOKE_APPLIANCE_US:.0} µs p99 with 8 clients natively: {:.1} µs — {} (1 client {:.1} µs; service \
         CPU per REVOKE p99: {:.1} µs and {:.1} µs with 1 and 8 clients)",
        s.revoke_app_p99_us_8,
        met(s.revoke_app_p99_us_8 <= GOAL_REVOKE_APPLIANCE_US),
        s.revoke_app_p99_us_1,
        s.revoke_cpu_p99_us_1,
        s.revoke_cpu_p99_us_8
    );
    let _ = writeln!(
        out,
        "goal: ALLOC appliance-side time ≤ {GOAL_ALLOC_APPLIANCE_US:.0} µs p99 natively: 1 client {:.1} µs — {}; 8 \
         clients {:.1} µs — {}",
        s.alloc_app_p99_us_1,
        met(s.alloc_app_p99_us_1 <= GOAL_ALLOC_APPLIANCE_US),
        s.alloc_app_p99_us_8,
        met(s.alloc_app_p99_us_8 <= GOAL_ALLOC_APPLIANCE_US)
    );
    let fenced = if s.fenced > 0.0 { format!("; {:.0} outcomes Fenced", s.fenced) } else { String::new() };
    let _ = writeln!(
        out,
        "goal: mass revoke of {:.0} leases ≤ {GOAL_MASS_RATIO}× the model's commands alone pipelined over the 32 \
         command slots: last outcome {:.1} ms vs {:.1} ms for {:.0} DESTROY_MKEY alone = {:.2}× — {} (all swept \
         {:.1} ms vs {:.1} ms for those plus the sweep's 4 commands per lease alone = {:.2}×{fenced})",
        s.leases,
        s.mass_last_ms,
        s.model_mkey_ms,
        s.leases,
        s.mass_ratio,
        met(s.mass_ratio <= GOAL_MASS_RATIO && s.fenced == 0.0),
        s.mass_swept_ms,
        s.model_mkey_ms + s.model_sweep_ms,
        s.sweep_ratio
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "table\nsummary: alloc_app_p99_us_1=4.5 alloc_app_p99_us_8=7.25 revoke_app_p99_us_1=11.5 revoke_app_p99_us_8=28.0 revoke_cpu_p99_us_1=4.9 \
                       revoke_cpu_p99_us_8=6.2 leases=10000 mass_last_ms=474.1 mass_swept_ms=2010.1 \
                       model_mkey_ms=400.0 model_sweep_ms=1600.0 mass_ratio=1.19 sweep_ratio=1.01 fenced=0\n";

    #[test]
    fn summary_line() {
        let s = Summary::parse(OUT).unwrap();
        assert_eq!((s.alloc_app_p99_us_1, s.alloc_app_p99_us_8), (4.5, 7.25));
        assert_eq!((s.revoke_app_p99_us_1, s.revoke_app_p99_us_8), (11.5, 28.0));
        assert_eq!((s.revoke_cpu_p99_us_1, s.revoke_cpu_p99_us_8), (4.9, 6.2));
        assert_eq!((s.leases, s.mass_last_ms, s.mass_swept_ms), (10000.0, 474.1, 2010.1));
        assert_eq!((s.model_mkey_ms, s.model_sweep_ms, s.mass_ratio, s.sweep_ratio), (400.0, 1600.0, 1.19, 1.01));
        assert_eq!(s.fenced, 0.0);
        assert!(Summary::parse("summary: revoke_app_p99_us_1=1\n").is_none());
        assert!(Summary::parse("no summary\n").is_none());
    }

    #[test]
    fn goal_lines() {
        let s = Summary::parse(OUT).unwrap();
        let g = goals(Some(&s));
        let mut lines = g.lines();
        let revoke = lines.next().unwrap();
        assert!(revoke.contains("with 8 clients natively: 28.0 µs — NOT MET (1 client 11.5 µs"), "{g}");
        assert!(revoke.contains("p99: 4.9 µs and 6.2 µs"), "{g}");
        let alloc = lines.next().unwrap();
        assert!(alloc.contains("1 client 4.5 µs — met; 8 clients 7.2 µs — NOT MET"), "{g}");
        let fast = Summary { revoke_app_p99_us_8: 1.5, ..s };
        assert!(goals(Some(&fast)).lines().next().unwrap().contains("1.5 µs — met"));
        let mass = lines.next().unwrap();
        assert!(mass.contains("474.1 ms vs 400.0 ms for 10000 DESTROY_MKEY alone = 1.19× — met"), "{g}");
        assert!(mass.contains("2010.1 ms vs 2000.0 ms") && !mass.contains("Fenced"), "{g}");
        let slow = Summary { mass_ratio: 1.6, ..s };
        assert!(goals(Some(&slow)).lines().nth(2).unwrap().contains("— NOT MET"));
        let fenced = Summary { fenced: 3.0, ..s };
        let g = goals(Some(&fenced));
        assert!(g.contains("— NOT MET") && g.contains("3 outcomes Fenced"), "{g}");
        assert!(goals(None).contains("no summary line"));
    }
}
