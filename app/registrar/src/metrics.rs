//! `/metrics`: the Prometheus text exposition format (version 0.0.4) of every appliance's last STATS and
//! HEALTH, and the registrar's own state. Every metric is listed in docs/operations.md ("Metrics"); the fleet
//! tests run `promtool check metrics` over a live page.
//!
//! Each appliance's series carry `appliance` (its control address) and `boot_id`. Counters restart with a
//! reboot (a new `boot_id`), as Prometheus expects of counters that reset.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use crate::publish::Shared;

/// A label value with `\`, `"` and newlines escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Page {
    out: String,
}

impl Page {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        let _ = writeln!(self.out, "{name}{{{labels}}} {v}");
    }
}

const STATES: [&str; 5] = ["granted", "active", "fencing", "pending_destroy", "fenced"];
const ROLES: [&str; 4] = ["net", "cmd", "event", "idle"];

/// The histogram's buckets: STATS's 16 power-of-two microsecond buckets (docs/wire-protocol.md, "STATS") as
/// cumulative `le` buckets in seconds; bucket 15 is open-ended and only in `+Inf`. There is no `_sum` on the
/// wire: it is estimated from each bucket's midpoint (docs/operations.md says so).
fn histogram(p: &mut Page, name: &str, labels: &str, counts: &[u32; 16]) {
    let mut cum = 0u64;
    let mut sum_us = 0f64;
    for (i, &c) in counts.iter().enumerate() {
        cum += u64::from(c);
        let lo = if i == 0 { 0.0 } else { (1u64 << i) as f64 };
        let hi = (1u64 << (i + 1)) as f64;
        sum_us += f64::from(c) * (lo + hi) / 2.0;
        if i < 15 {
            p.sample(&format!("{name}_bucket"), &format!("{labels},le=\"{}\"", hi / 1e6), cum);
        }
    }
    p.sample(&format!("{name}_bucket"), &format!("{labels},le=\"+Inf\""), cum);
    p.sample(&format!("{name}_sum"), labels, sum_us / 1e6);
    p.sample(&format!("{name}_count"), labels, cum);
}

pub(crate) fn render(sh: &Shared) -> String {
    let mut p = Page { out: String::new() };
    let status = sh.status().clone();
    let name = esc(&sh.cfg.name);
    let seen: Vec<_> = sh.seen.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect();
    let who = |i: usize| {
        let boot = seen[i].last.as_ref().map(|s| s.boot_id.as_str()).unwrap_or("");
        format!("appliance=\"{}\",boot_id=\"{}\"", esc(&sh.cfg.appliances[i].control), esc(boot))
    };
    // Appliances that answered at least once, with their last answer.
    let answered: Vec<usize> = (0..seen.len()).filter(|&i| seen[i].last.is_some()).collect();

    p.family("leasebox_up", "gauge", "1 if the appliance answered the last poll (STATS and HEALTH), else 0.");
    for (i, s) in seen.iter().enumerate() {
        p.sample("leasebox_up", &who(i), u8::from(s.ok));
    }
    p.family("leasebox_polls_total", "counter", "Polls of the appliance by this registrar, by result.");
    for (i, s) in seen.iter().enumerate() {
        p.sample("leasebox_polls_total", &format!("{},result=\"ok\"", who(i)), s.polls_ok);
        p.sample("leasebox_polls_total", &format!("{},result=\"failed\"", who(i)), s.polls_failed);
    }
    type Get = fn(&crate::poll::Sample) -> u64;
    let gauges: [(&str, &str, &str, Get); 8] = [
        ("leasebox_uptime_seconds", "gauge", "Appliance uptime (STATS uptime_ms).", |s| s.stats.uptime_ms),
        ("leasebox_leased_bytes", "gauge", "Bytes lent out (STATS bytes_leased).", |s| s.stats.leases.bytes_leased),
        ("leasebox_free_bytes", "gauge", "Bytes of the lease pool free (STATS bytes_free).", |s| {
            s.stats.leases.bytes_free
        }),
        ("leasebox_scrubbing_bytes", "gauge", "Pool bytes being cleared before reuse (STATS bytes_scrubbing).", |s| {
            s.stats.leases.bytes_scrubbing
        }),
        ("leasebox_fenced_slots", "gauge", "Lease slots fenced this boot, never reused (HEALTH fenced_slots).", |s| {
            u64::from(s.health.fenced_slots)
        }),
        ("leasebox_sessions", "gauge", "Control connections open (STATS sessions_current).", |s| {
            u64::from(s.stats.sessions_current)
        }),
        ("leasebox_health_status", "gauge", "HEALTH status: 0 ok, 1 degraded, 2 failed.", |s| s.health.status as u64),
        ("leasebox_hca_state", "gauge", "HEALTH hca: 0 absent, 1 initializing, 2 ok, 3 fatal.", |s| {
            s.health.hca as u64
        }),
    ];
    for (metric, kind, help, get) in gauges {
        p.family(metric, kind, help);
        for &i in &answered {
            let s = seen[i].last.as_ref().expect("answered");
            let v = get(s);
            if metric == "leasebox_uptime_seconds" {
                p.sample(metric, &who(i), v as f64 / 1000.0);
            } else {
                p.sample(metric, &who(i), v);
            }
        }
    }
    p.family("leasebox_leases", "gauge", "Leases by state (STATS leases_by_state).");
    for &i in &answered {
        let s = seen[i].last.as_ref().expect("answered");
        for (k, st) in STATES.iter().enumerate() {
            p.sample("leasebox_leases", &format!("{},state=\"{st}\"", who(i)), s.stats.leases.by_state[k]);
        }
    }
    let counters: [(&str, &str, Get); 7] = [
        ("leasebox_allocs_total", "Leases granted (STATS allocs).", |s| s.stats.leases.allocs),
        ("leasebox_revokes_total", "FREEs and REVOKEs whose immediate phase ended (STATS revokes).", |s| {
            s.stats.leases.revokes
        }),
        ("leasebox_expiries_total", "Leases ended by a timer or a dead HCA (STATS expiries).", |s| {
            s.stats.leases.expiries
        }),
        ("leasebox_reconnects_total", "Sessions that took over an earlier session's leases (STATS reconnects).", |s| {
            s.stats.leases.reconnects
        }),
        ("leasebox_sessions_total", "Control connections accepted (STATS sessions_total).", |s| s.stats.sessions_total),
        ("leasebox_sessions_refused_total", "Connections refused BUSY (STATS sessions_refused).", |s| {
            s.stats.sessions_refused
        }),
        ("leasebox_frames_in_total", "Control frames received (STATS frames_in).", |s| s.stats.frames_in),
    ];
    for (metric, help, get) in counters {
        p.family(metric, "counter", help);
        for &i in &answered {
            p.sample(metric, &who(i), get(seen[i].last.as_ref().expect("answered")));
        }
    }
    p.family("leasebox_frames_out_total", "counter", "Control frames sent, notices included (STATS frames_out).");
    for &i in &answered {
        p.sample("leasebox_frames_out_total", &who(i), seen[i].last.as_ref().expect("answered").stats.frames_out);
    }
    // The session layer's guards (STATS' guard block): only appliances that sent one (older ones have none).
    type Guard = fn(&leasebox_proto::SessionGuards) -> u64;
    let guards: [(&str, &str, Guard); 5] = [
        (
            "leasebox_preauth_evicted_total",
            "Unauthenticated connections evicted for newer ones (STATS evicted).",
            |g| g.evicted,
        ),
        ("leasebox_rate_refusals_total", "Connections and HELLOs refused for a rate (STATS rate_refusals).", |g| {
            g.rate_refusals
        }),
        ("leasebox_hellos_replayed_total", "HELLO messages 1 refused as replays (STATS hellos_replayed).", |g| {
            g.hellos_replayed
        }),
        ("leasebox_records_in_total", "Authenticated records received (STATS records_in).", |g| g.records_in),
        ("leasebox_records_empty_total", "Records received with no whole frame (STATS records_empty).", |g| {
            g.records_empty
        }),
    ];
    for (metric, help, get) in guards {
        p.family(metric, "counter", help);
        for &i in &answered {
            if let Some(g) = &seen[i].last.as_ref().expect("answered").stats.guards {
                p.sample(metric, &who(i), get(g));
            }
        }
    }
    p.family("leasebox_errors_total", "counter", "Error frames sent, by error code (STATS error list).");
    for &i in &answered {
        for &(code, n) in &seen[i].last.as_ref().expect("answered").stats.errors {
            let name =
                leasebox_proto::ErrorCode::from_raw(code).map_or_else(|| code.to_string(), |c| c.name().to_string());
            p.sample("leasebox_errors_total", &format!("{},code=\"{}\"", who(i), esc(&name)), n);
        }
    }
    p.family("leasebox_role_iterations_total", "counter", "Iterations of each core's role loop (STATS roles).");
    for &i in &answered {
        for &(core, role, n) in &seen[i].last.as_ref().expect("answered").stats.roles {
            let r = ROLES.get(usize::from(role)).copied().unwrap_or("unknown");
            p.sample("leasebox_role_iterations_total", &format!("{},core=\"{core}\",role=\"{r}\"", who(i)), n);
        }
    }
    p.family(
        "leasebox_hca_commands_total",
        "counter",
        "mlx5 commands by result (HCA_STATS; appliances that drive an mlx5 command queue).",
    );
    for &i in &answered {
        if let Some(c) = seen[i].last.as_ref().expect("answered").hca {
            let results = [
                ("submitted", c.submitted),
                ("ok", c.ok),
                ("failed", c.failed),
                ("timeout", c.timeout),
                ("late", c.late),
                ("aborted", c.aborted),
            ];
            for (result, n) in results {
                p.sample("leasebox_hca_commands_total", &format!("{},result=\"{result}\"", who(i)), n);
            }
        }
    }
    for (metric, help, revoke) in [
        ("leasebox_alloc_latency_seconds", "ALLOC latency, request to answer (STATS alloc_us).", false),
        ("leasebox_revoke_latency_seconds", "REVOKE latency, request to answer (STATS revoke_us).", true),
    ] {
        p.family(metric, "histogram", help);
        for &i in &answered {
            let l = &seen[i].last.as_ref().expect("answered").stats.leases;
            histogram(&mut p, metric, &who(i), if revoke { &l.revoke_us.buckets } else { &l.alloc_us.buckets });
        }
    }
    let me = format!("registrar=\"{name}\"");
    p.family("leasebox_registrar_leader", "gauge", "1 while this registrar leads (publishes to etcd).");
    p.sample("leasebox_registrar_leader", &me, u8::from(status.leader));
    p.family("leasebox_registrar_etcd_up", "gauge", "1 if this registrar's last etcd request succeeded.");
    p.sample("leasebox_registrar_etcd_up", &me, u8::from(status.etcd_up));
    p.family("leasebox_registrar_published", "gauge", "Appliance keys this registrar keeps alive now.");
    p.sample("leasebox_registrar_published", &me, status.published);
    p.family("leasebox_registrar_etcd_writes_total", "counter", "etcd writes by this registrar, by kind.");
    let w = status.writes;
    for (kind, n) in [("put", w.puts), ("keepalive", w.keepalives), ("grant", w.grants), ("revoke", w.revokes)] {
        p.sample("leasebox_registrar_etcd_writes_total", &format!("{me},kind=\"{kind}\""), n);
    }
    p.out
}

/// Serves `GET /metrics` (anything else: 404) until the registrar stops.
pub(crate) fn serve(l: TcpListener, sh: &Shared) {
    let _ = l.set_nonblocking(true);
    while !sh.stopping() {
        match l.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                let mut r = BufReader::new(&s);
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                // The rest of the request head.
                let mut h = String::new();
                while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                    h.clear();
                }
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let (status, body, ctype) = if line.starts_with("GET ") && path.split('?').next() == Some("/metrics") {
                    ("200 OK", render(sh), "text/plain; version=0.0.4; charset=utf-8")
                } else {
                    ("404 Not Found", "only /metrics is served here\n".to_string(), "text/plain")
                };
                let mut w = &s;
                let _ = write!(
                    w,
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn histograms_are_cumulative_with_an_infinite_bucket() {
        let mut p = Page { out: String::new() };
        let mut counts = [0u32; 16];
        counts[0] = 2;
        counts[3] = 1;
        counts[15] = 4;
        histogram(&mut p, "h", "a=\"x\"", &counts);
        assert!(p.out.contains("h_bucket{a=\"x\",le=\"0.000002\"} 2\n"), "{}", p.out);
        assert!(p.out.contains("h_bucket{a=\"x\",le=\"0.000016\"} 3\n"));
        assert!(p.out.contains("h_bucket{a=\"x\",le=\"0.032768\"} 3\n"));
        assert!(p.out.contains("h_bucket{a=\"x\",le=\"+Inf\"} 7\n"));
        assert!(p.out.contains("h_count{a=\"x\"} 7\n"));
    }
}
