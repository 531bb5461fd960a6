//! `cargo xtask bench revoke`: `leasectl verify --revoke-test` in process, for each order
//! (mkey-first, qp-first), N iterations, against the QEMU guest (the image with the mlx5 model and virtio-net,
//! booted by [`lease_qemu::Appliance`]) and the hosted appliance (`leasebox_hosted` with the model's RoCEv2
//! responder on UDP): control-plane recall latency (REVOKE sent → outcome) and dataplane first-fail latency
//! (outcome → first failed completion) p50/p99/max, and the failing completions' `ibv_wc_status`. The
//! requester QP keeps perftest's defaults (`timeout` 14, `retry_cnt` 7), as a real client's would; the
//! appliances run with a short revoke grace ([`GRACE_ARG`]). Prints a table; asserts nothing.
//!
//! The summaries and the table are pure functions (tested below); [`hosted`] and [`qemu`] run the iterations.

use std::time::Duration;

use leasectl::client::Timeouts;
use leasectl::rdma::{RcConfig, Requester, SoftConfig, SoftRoce};
use leasectl::verify::{self, Control, Mode, Options, Order, Report};

use crate::Artifacts;
use crate::lease_qemu;

/// Iterations per order unless `--iterations` says otherwise.
pub const DEFAULT_ITERATIONS: u32 = 20;
pub const MAX_ITERATIONS: u32 = 10_000;
/// The orders, in the order they run.
pub const ORDERS: [Order; 2] = [Order::MkeyFirst, Order::QpFirst];
/// Both appliances are started with this: a revoked slot's extent waits out the grace period (default 5 s)
/// before the sweep returns it to the pool, and each iteration revokes one lease, so at the default grace a
/// run of 20 iterations per order exhausts the pool (ALLOC: NO_MEMORY). The grace comes after the outcome and
/// the QP's move to ERR, so it changes neither figure.
pub const GRACE_ARG: &str = "lease_grace_ms=100";
/// The two targets' labels.
pub const QEMU_TARGET: &str = "QEMU guest (TCG, 1 CPU)";
pub const HOSTED_TARGET: &str = "hosted (native)";

/// The verifier's options for one order: a non-cooperating client, the default WRITE size and depth.
pub fn options(order: Order, iterations: u32) -> Options {
    Options { mode: Mode::RevokeTest, order, iterations, rc: RcConfig::default(), ..Options::default() }
}

/// p50, p99 and max (nearest rank) of some figures in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub n: usize,
    pub p50: i64,
    pub p99: i64,
    pub max: i64,
}

/// Nearest-rank percentiles; `None` without figures.
pub fn stats(figures: &[i64]) -> Option<Stats> {
    if figures.is_empty() {
        return None;
    }
    let mut v = figures.to_vec();
    v.sort_unstable();
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some(Stats { n: v.len(), p50: rank(0.50), p99: rank(0.99), max: v[v.len() - 1] })
}

/// One order against one target.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub target: String,
    pub order: Order,
    /// The summary, or why the verifier could not run.
    pub result: Result<Summary, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub iterations: usize,
    pub recall: Option<Stats>,
    pub dataplane: Option<Stats>,
    /// The first failed completion's status per iteration, counted: (name, code, iterations).
    pub statuses: Vec<(String, u32, usize)>,
    /// Iterations with a failed check (over budget, missing write, late success, fresh lease not zero).
    pub failed_checks: usize,
    /// The requester's retry time, for reading qp-first's dataplane figure.
    pub retry_time_us: i64,
}

/// The figures of one verifier report.
pub fn summarize(r: &Report) -> Summary {
    let recall: Vec<i64> = r.iterations.iter().filter_map(|i| i.recall_us).map(|u| u as i64).collect();
    let dataplane: Vec<i64> = r.iterations.iter().filter_map(|i| i.dataplane_us).collect();
    let mut statuses: Vec<(String, u32, usize)> = Vec::new();
    for f in r.iterations.iter().filter_map(|i| i.first_fail.as_ref()) {
        match statuses.iter_mut().find(|(name, _, _)| name == f.status.name()) {
            Some(s) => s.2 += 1,
            None => statuses.push((f.status.name().to_string(), f.status.code(), 1)),
        }
    }
    let rc = &r.options.rc;
    let retry = rc.transport_timeout().unwrap_or_default() * (u32::from(rc.retry_cnt) + 1);
    Summary {
        iterations: r.iterations.len(),
        recall: stats(&recall),
        dataplane: stats(&dataplane),
        statuses,
        failed_checks: r.iterations.iter().filter(|i| !i.failures.is_empty()).count(),
        retry_time_us: retry.as_micros() as i64,
    }
}

fn ms(us: i64) -> String {
    format!("{:.3}", us as f64 / 1e3)
}

fn three(s: Option<Stats>) -> String {
    match s {
        Some(s) => format!("{:>9} {:>9} {:>9}", ms(s.p50), ms(s.p99), ms(s.max)),
        None => format!("{:>9} {:>9} {:>9}", "-", "-", "-"),
    }
}

/// The table: one row per target and order.
pub fn table(rows: &[Row], iterations: u32) -> String {
    let o = options(Order::MkeyFirst, iterations);
    let retry = rows.iter().find_map(|r| r.result.as_ref().ok().map(|s| s.retry_time_us)).unwrap_or(0);
    let mut s = format!(
        "revoke latency: leasectl verify --revoke-test, {iterations} iteration(s) per order, WRITE {} B x depth {}, \
         requester QP timeout {} retry_cnt {} (retry time {} ms)\n",
        o.size,
        o.depth,
        o.rc.timeout,
        o.rc.retry_cnt,
        ms(retry)
    );
    s.push_str(&format!(
        "{:<24} | {:<10} | {:^29} | {:^29} | {:<30} | {}\n",
        "target", "order", "recall ms: p50 p99 max", "dataplane ms: p50 p99 max", "first failed completion", "checks"
    ));
    s.push_str(&format!("{:-<24}-|-{:-<10}-|-{:-<29}-|-{:-<29}-|-{:-<30}-|-------\n", "", "", "", "", ""));
    for r in rows {
        match &r.result {
            Ok(m) => {
                let status = if m.statuses.is_empty() {
                    "none".to_string()
                } else {
                    m.statuses.iter().map(|(n, c, k)| format!("{n} ({c}) x{k}")).collect::<Vec<_>>().join(", ")
                };
                let checks = match m.failed_checks {
                    0 => format!("{}/{} ok", m.iterations, m.iterations),
                    n => format!("{n}/{} FAILED", m.iterations),
                };
                s.push_str(&format!(
                    "{:<24} | {:<10} | {} | {} | {:<30} | {}\n",
                    r.target,
                    r.order.name(),
                    three(m.recall),
                    three(m.dataplane),
                    status,
                    checks
                ));
            }
            Err(e) => s.push_str(&format!("{:<24} | {:<10} | did not run: {e}\n", r.target, r.order.name())),
        }
    }
    s.push_str(
        "recall: REVOKE sent -> outcome received; dataplane: outcome received -> first failed completion \
         (negative: the dataplane refused a request before the outcome arrived). TCG figures: compare ratios, \
         not absolute times.\n",
    );
    s
}

/// Runs both orders against one appliance; a verifier that could not run gives a row with its error.
fn run_orders(target: &str, control: &Control, udp: std::net::SocketAddr, iterations: u32) -> Vec<Row> {
    ORDERS
        .iter()
        .map(|&order| {
            let o = options(order, iterations);
            let rc = o.rc;
            let mut factory = move || -> Result<Box<dyn Requester>, String> {
                let r = SoftRoce::new(SoftConfig { peer: udp, rc, ..SoftConfig::default() })
                    .map_err(|e| format!("UDP toward {udp}: {e}"))?;
                Ok(Box::new(r))
            };
            let result = verify::run(&o, control, &mut factory).map(|r| summarize(&r));
            match &result {
                Ok(m) => eprintln!(
                    "{target}, {}: {} iteration(s), recall p50 {} ms, dataplane p50 {} ms",
                    order.name(),
                    m.iterations,
                    m.recall.map_or("-".into(), |s| ms(s.p50)),
                    m.dataplane.map_or("-".into(), |s| ms(s.p50))
                ),
                Err(e) => eprintln!("{target}, {}: failed: {e}", order.name()),
            }
            Row { target: target.to_string(), order, result }
        })
        .collect()
}

/// The hosted appliance with the model's responder on UDP, both orders.
pub fn hosted(iterations: u32) -> Result<Vec<Row>, String> {
    let t = crate::control::start_hosted(&["--hca", "--udp", "127.0.0.1:0", GRACE_ARG])?;
    let udp = t.udp.ok_or("the hosted appliance has no RoCEv2 UDP port")?;
    let control = Control {
        addr: t.addr.clone(),
        tenant: t.tenant(),
        admin: Some(t.admin()),
        timeouts: Timeouts::all(Duration::from_secs(10)),
    };
    Ok(run_orders(HOSTED_TARGET, &control, udp, iterations))
}

/// The image (`elf`) under QEMU with the model and virtio-net, both orders.
pub fn qemu(a: &Artifacts, elf: &std::path::Path, iterations: u32) -> Result<Vec<Row>, String> {
    let mut app = lease_qemu::Appliance::boot(a, elf, "revoke-bench", GRACE_ARG)?;
    let control = Control {
        addr: app.addr.clone(),
        tenant: app.tenant(),
        admin: Some(app.admin()),
        // ALLOC runs six HCA commands on the one TCG CPU: generous answer timeouts.
        timeouts: Timeouts {
            retry_for: Duration::from_secs(30),
            receive: Duration::from_secs(60),
            ..Timeouts::default()
        },
    };
    let rows = run_orders(QEMU_TARGET, &control, app.udp, iterations);
    if let Some(Err(e)) = rows.iter().map(|r| &r.result).find(|r| r.is_err()) {
        eprintln!("{}", app.fail(e.clone()));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasectl::rdma::WcStatus;
    use leasectl::verify::{FirstFail, Iteration};
    use std::time::Instant;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(stats(&[]), None);
        assert_eq!(stats(&[5]), Some(Stats { n: 1, p50: 5, p99: 5, max: 5 }));
        let v: Vec<i64> = (1..=100).rev().collect();
        assert_eq!(stats(&v), Some(Stats { n: 100, p50: 50, p99: 99, max: 100 }));
        assert_eq!(stats(&[-3, 10, 7]), Some(Stats { n: 3, p50: 7, p99: 10, max: 10 }));
    }

    fn iteration(recall: u64, dp: i64, status: WcStatus, failed: bool) -> Iteration {
        let at = Instant::now();
        Iteration {
            recall_us: Some(recall),
            dataplane_us: Some(dp),
            first_fail: Some(FirstFail { status, wr_id: 1, at, after_outcome_us: Some(dp), after_revoke_us: None }),
            failures: if failed { vec!["over budget".into()] } else { Vec::new() },
            ..Iteration::default()
        }
    }

    #[test]
    fn summaries_and_table() {
        let mut o = options(Order::QpFirst, 3);
        o.rc.timeout = 10;
        let r = Report {
            options: o,
            iterations: vec![
                iteration(1000, 33_000, WcStatus::RetryExcErr, false),
                iteration(3000, 35_000, WcStatus::RetryExcErr, false),
                iteration(2000, 34_000, WcStatus::RemAccessErr, true),
            ],
        };
        let m = summarize(&r);
        assert_eq!(m.recall, Some(Stats { n: 3, p50: 2000, p99: 3000, max: 3000 }));
        assert_eq!(m.dataplane.map(|s| s.p50), Some(34_000));
        assert_eq!(m.statuses, vec![("IBV_WC_RETRY_EXC_ERR".into(), 12, 2), ("IBV_WC_REM_ACCESS_ERR".into(), 10, 1)]);
        assert_eq!(m.failed_checks, 1);
        assert_eq!(m.retry_time_us, 33_554);
        let rows = vec![
            Row { target: HOSTED_TARGET.into(), order: Order::QpFirst, result: Ok(m) },
            Row { target: QEMU_TARGET.into(), order: Order::MkeyFirst, result: Err("HELLO: refused".into()) },
        ];
        let t = table(&rows, 3);
        assert!(t.starts_with("revoke latency: leasectl verify --revoke-test, 3 iteration(s) per order"), "{t}");
        assert!(t.contains("retry time 33.554 ms"), "{t}");
        let row = t.lines().find(|l| l.starts_with(HOSTED_TARGET)).unwrap();
        assert!(row.contains("qp-first") && row.contains("2.000") && row.contains("35.000"), "{row}");
        assert!(row.contains("IBV_WC_RETRY_EXC_ERR (12) x2, IBV_WC_REM_ACCESS_ERR (10) x1"), "{row}");
        assert!(row.ends_with("1/3 FAILED"), "{row}");
        assert!(t.contains("mkey-first | did not run: HELLO: refused"), "{t}");
        let none = Summary {
            iterations: 1,
            recall: None,
            dataplane: None,
            statuses: vec![],
            failed_checks: 0,
            retry_time_us: 0,
        };
        let t = table(&[Row { target: "t".into(), order: Order::MkeyFirst, result: Ok(none) }], 1);
        assert!(t.contains(" - ") && t.contains("none") && t.contains("1/1 ok"), "{t}");
    }

    #[test]
    fn options_are_a_non_cooperating_client_with_perftest_defaults() {
        let o = options(Order::QpFirst, 7);
        assert_eq!((o.mode, o.order, o.iterations), (Mode::RevokeTest, Order::QpFirst, 7));
        assert_eq!((o.rc.timeout, o.rc.retry_cnt), (14, 7));
    }
}
