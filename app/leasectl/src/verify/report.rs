//! The verifier's output: a human table and one JSON object with every figure, the failing completion's
//! status (rdma-core name and number) and the verdict.

use serde_json::{Value, json};

use super::{Iteration, Mode, Report, retry_time};
use crate::rdma::{MacSource, mac_string};

/// `mac_source` and `remote_mac` of a report or an iteration (nulls when the backend does not say).
fn mac_fields(m: Option<(MacSource, [u8; 6])>) -> (Value, Value) {
    match m {
        Some((source, mac)) => (json!(source.name()), json!(mac_string(&mac))),
        None => (Value::Null, Value::Null),
    }
}

/// p50 and max of some figures (nearest rank).
fn p50_max(mut v: Vec<i64>) -> Option<(i64, i64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some((v[(v.len() - 1) / 2], v[v.len() - 1]))
}

fn recall(r: &Report) -> Option<(i64, i64)> {
    p50_max(r.iterations.iter().filter_map(|i| i.recall_us).map(|u| u as i64).collect())
}

fn dataplane(r: &Report) -> Option<(i64, i64)> {
    p50_max(r.iterations.iter().filter_map(|i| i.dataplane_us).collect())
}

fn ms(us: i64) -> String {
    format!("{:.3}", us as f64 / 1e3)
}

fn iteration_json(i: &Iteration) -> Value {
    let (mac_source, remote_mac) = mac_fields(i.remote_mac);
    json!({
        "iteration": i.index,
        "lease": i.lease,
        "outcome": i.outcome,
        "recall_us": i.recall_us,
        "server_us": i.server_us,
        "dataplane_us": i.dataplane_us,
        "first_fail": i.first_fail.as_ref().map(|f| json!({
            "status": f.status.name(),
            "status_code": f.status.code(),
            "wr_id": f.wr_id,
            "after_outcome_us": f.after_outcome_us,
            "after_revoke_us": f.after_revoke_us,
        })),
        "writes_ok": i.writes_ok,
        "writes_failed": i.writes_failed,
        "bytes_written": i.bytes_written,
        "reads_ok": i.reads_ok,
        "bytes_verified": i.bytes_verified,
        "missing_writes": i.missing_writes,
        "posted_after_outcome": i.posted_after_outcome,
        "late_successes": i.late_successes,
        "fresh_bytes_read": i.fresh_bytes_read,
        "fresh_nonzero": i.fresh_nonzero,
        "mac_source": mac_source,
        "remote_mac": remote_mac,
        "passed": i.failures.is_empty(),
        "failures": i.failures,
    })
}

pub fn json(r: &Report) -> Value {
    let o = &r.options;
    let stat = |s: Option<(i64, i64)>| s.map(|(p50, max)| json!({ "p50": p50, "max": max }));
    let failures: Vec<String> = r
        .iterations
        .iter()
        .flat_map(|i| i.failures.iter().map(move |f| format!("iteration {}: {f}", i.index)))
        .collect();
    // The first iteration's; every iteration's is in `results`.
    let (mac_source, remote_mac) = mac_fields(r.iterations.first().and_then(|i| i.remote_mac));
    json!({
        "passed": r.passed(),
        "mode": o.mode.name(),
        "order": o.order.name(),
        "iterations": o.iterations,
        "budget_ms": o.budget.as_millis() as u64,
        "size": o.size,
        "depth": o.depth,
        "qp_timeout": o.rc.timeout,
        "retry_cnt": o.rc.retry_cnt,
        "retry_time_us": retry_time(&o.rc).as_micros() as u64,
        "dataplane_applies": o.mode == Mode::RevokeTest,
        "mac_source": mac_source,
        "remote_mac": remote_mac,
        "summary": { "recall_us": stat(recall(r)), "dataplane_us": stat(dataplane(r)) },
        "results": r.iterations.iter().map(iteration_json).collect::<Vec<_>>(),
        "failures": failures,
    })
}

pub fn human(r: &Report) -> String {
    let o = &r.options;
    let mut s = format!(
        "verify {} order {}: {} iteration(s), WRITE {} B × depth {}, QP timeout {} retry_cnt {} \
         (retry time {:.1} ms), budget {} ms\n",
        o.mode.name(),
        o.order.name(),
        o.iterations,
        o.size,
        o.depth,
        o.rc.timeout,
        o.rc.retry_cnt,
        retry_time(&o.rc).as_secs_f64() * 1e3,
        o.budget.as_millis()
    );
    if let Some((source, mac)) = r.iterations.first().and_then(|i| i.remote_mac) {
        s.push_str(&format!("RDMA frames to {} ({})\n", mac_string(&mac), source.name()));
    }
    s.push_str(&format!(
        "{:>4}  {:<10} {:<9} {:>11} {:>14}  {:<26} {:>9} {:>11} {:>5} {:>6}  {}\n",
        "#",
        "lease",
        "outcome",
        "recall ms",
        "dataplane ms",
        "first failed completion",
        "writes",
        "verified B",
        "late",
        "zeros",
        "result"
    ));
    for i in &r.iterations {
        let dp = match (o.mode, i.dataplane_us) {
            (Mode::Cooperating, _) => "n/a".to_string(),
            (_, Some(us)) => ms(us),
            (_, None) => "-".to_string(),
        };
        let ff =
            i.first_fail.as_ref().map_or("-".to_string(), |f| format!("{} ({})", f.status.name(), f.status.code()));
        let zeros = if i.fresh_bytes_read > 0 && i.fresh_nonzero == 0 { "ok" } else { "BAD" };
        s.push_str(&format!(
            "{:>4}  {:<10} {:<9} {:>11} {:>14}  {:<26} {:>9} {:>11} {:>5} {:>6}  {}\n",
            i.index,
            i.lease,
            i.outcome.as_deref().unwrap_or("-"),
            i.recall_us.map_or("-".into(), |u| ms(u as i64)),
            dp,
            ff,
            i.writes_ok,
            i.bytes_verified,
            i.late_successes,
            zeros,
            if i.failures.is_empty() { "pass" } else { "FAIL" }
        ));
    }
    if let Some((p50, max)) = recall(r) {
        s.push_str(&format!("recall latency (REVOKE sent → outcome): p50 {} ms, max {} ms\n", ms(p50), ms(max)));
    }
    match (o.mode, dataplane(r)) {
        (Mode::Cooperating, _) => s.push_str("dataplane first-fail latency: n/a (cooperating client)\n"),
        (_, Some((p50, max))) => s.push_str(&format!(
            "dataplane first-fail latency (outcome → first failed completion): p50 {} ms, max {} ms\n",
            ms(p50),
            ms(max)
        )),
        (_, None) => s.push_str("dataplane first-fail latency: no failed completion seen\n"),
    }
    for i in &r.iterations {
        for f in &i.failures {
            s.push_str(&format!("FAIL iteration {}: {f}\n", i.index));
        }
    }
    s.push_str(if r.passed() { "PASS\n" } else { "FAIL\n" });
    s
}
