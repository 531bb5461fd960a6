//! Human and JSON renderings of every answer. JSON objects carry every field of the response, named as in
//! docs/wire-protocol.md; lease ids are strings `"SLOT.GENERATION"` (the boot id, the same for every lease of one
//! boot, is a field of its own: `boot_id`, 32 hex digits).

use crate::args::lease_str;
use crate::client::{ClientError, Welcome};
use crate::hex;
use leasebox_proto::{
    AllocResp, ErrorCode, FencedSlot, Health, Histogram, LeaseInfo, LeaseState, LeaseStats, Outcome, Response, Stats,
    access, mtu_bytes,
};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Duration;

/// Per-core role codes in STATS (the kernel's `Role` order).
pub fn role_name(code: u8) -> String {
    match code {
        0 => "net".into(),
        1 => "cmd".into(),
        2 => "event".into(),
        3 => "idle".into(),
        n => format!("role{n}"),
    }
}

/// Origin codes in FENCED_SUMMARY.
pub fn origin_name(code: u8) -> String {
    match code {
        0 => "LEGACY".into(),
        1 => "REVOKE".into(),
        2 => "SWEEP".into(),
        3 => "EXPIRY".into(),
        n => format!("origin{n}"),
    }
}

fn error_name(code: u16) -> String {
    ErrorCode::from_raw(code).map_or_else(|| format!("code{code}"), |c| c.name().to_string())
}

/// `rw-`-style access flags.
pub fn access_str(a: u8) -> String {
    let f = |bit, c| if a & bit != 0 { c } else { '-' };
    [f(access::REMOTE_READ, 'r'), f(access::REMOTE_WRITE, 'w'), f(access::REMOTE_ATOMIC, 'a')].iter().collect()
}

fn mtu_str(code: u8) -> String {
    mtu_bytes(code).map_or_else(|| format!("code {code}"), |b| b.to_string())
}

fn mtu_json(code: u8) -> Value {
    mtu_bytes(code).map_or(Value::Null, Value::from)
}

fn secs(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// A finished `drain`: what DRAIN answered, and how long until its leases were gone.
pub struct Drain<'a> {
    /// The tenant drained (`None`: every tenant).
    pub tenant: Option<&'a str>,
    pub notice_ms: u32,
    pub leases: u32,
    /// When the revocations started, on the server's uptime clock.
    pub deadline_ms: u64,
    /// From sending DRAIN to the LIST that showed none of the leases left.
    pub waited: Duration,
}

pub fn drain_human(d: &Drain<'_>) -> String {
    format!(
        "drained {}: {} lease(s) told {} ms ahead, revoked at server uptime {}; none left after {:.1} s\n",
        d.tenant.map_or_else(|| "every tenant".to_string(), |t| format!("tenant {t}")),
        d.leases,
        d.notice_ms,
        secs(d.deadline_ms),
        d.waited.as_secs_f64()
    )
}

pub fn drain_json(d: &Drain<'_>) -> Value {
    json!({
        "tenant": d.tenant,
        "notice_ms": d.notice_ms,
        "leases": d.leases,
        "deadline_ms": d.deadline_ms,
        "waited_ms": d.waited.as_millis() as u64,
        "left": 0,
    })
}

/// A successful `ping`.
pub struct Ping<'a> {
    pub addr: &'a str,
    pub principal: &'a str,
    pub welcome: &'a Welcome,
    /// Connect + HELLO, retries included.
    pub connect: Duration,
    pub rtt: Duration,
    pub uptime_ms: u64,
}

pub fn ping_human(p: &Ping<'_>) -> String {
    format!(
        "pong from {}: rtt {:.3} ms, server uptime {}, boot {}; session {} as {} (role {}, protocol v{}, {} \
         credits, heartbeat {} ms), connected in {:.1} ms\n",
        p.addr,
        p.rtt.as_secs_f64() * 1e3,
        secs(p.uptime_ms),
        hex::encode(&p.welcome.boot_id),
        p.welcome.session_id,
        p.principal,
        p.welcome.role.name(),
        p.welcome.version,
        p.welcome.credits,
        p.welcome.heartbeat_ms,
        p.connect.as_secs_f64() * 1e3
    )
}

pub fn ping_json(p: &Ping<'_>) -> Value {
    json!({
        "addr": p.addr,
        "principal": p.principal,
        "role": p.welcome.role.name(),
        "version": p.welcome.version,
        "session_id": p.welcome.session_id,
        "credits": p.welcome.credits,
        "heartbeat_ms": p.welcome.heartbeat_ms,
        "boot_id": hex::encode(&p.welcome.boot_id),
        "connect_us": p.connect.as_micros() as u64,
        "rtt_us": p.rtt.as_micros() as u64,
        "uptime_ms": p.uptime_ms,
    })
}

fn info_json(l: &LeaseInfo) -> Value {
    json!({
        "lease": lease_str(l.lease),
        "boot_id": hex::encode(&l.lease.boot_id),
        "state": l.state.name(),
        "access": access_str(l.access),
        "mtu": mtu_json(l.mtu),
        "size": l.size,
        "rkey": l.rkey,
        "server_qpn": l.server_qpn,
        "client_qpn": l.client_qpn,
        "ttl_left_ms": l.ttl_left_ms,
        "tenant": l.tenant,
    })
}

fn alloc_json(a: &AllocResp) -> Value {
    json!({
        "lease": lease_str(a.lease),
        "boot_id": hex::encode(&a.lease.boot_id),
        "rkey": a.rkey,
        "remote_addr": a.remote_addr,
        "length": a.length,
        "server_qpn": a.server_qpn,
        "server_psn": a.server_psn,
        "server_gid": hex::encode(&a.server_gid),
        "server_mac": crate::rdma::mac_string(&a.server_mac),
        "mtu": mtu_json(a.mtu),
        "ttl_ms": a.ttl_ms,
    })
}

/// A percentile as the upper bound of its bucket: `< N us`, or `>= 32768 us` past the last bound.
fn percentile_str(h: &Histogram, p: f64) -> String {
    match h.percentile(p) {
        None => "-".into(),
        Some(u64::MAX) => format!(">= {} us", Histogram::upper_bound(Histogram::BUCKETS - 2)),
        Some(b) => format!("< {b} us"),
    }
}

/// The upper bound of the percentile's bucket; `null` when nothing was recorded or past the last bound.
fn percentile_json(h: &Histogram, p: f64) -> Value {
    h.percentile(p).filter(|b| *b != u64::MAX).map_or(Value::Null, Value::from)
}

fn histogram_json(h: &Histogram) -> Value {
    json!({
        "count": h.count(),
        "p50_us": percentile_json(h, 50.0),
        "p99_us": percentile_json(h, 99.0),
        "buckets": h.buckets,
    })
}

fn lease_stats_json(l: &LeaseStats) -> Value {
    let by_state: serde_json::Map<String, Value> =
        LeaseState::ALL.iter().map(|st| (st.name().to_string(), json!(l.by_state[*st as usize]))).collect();
    json!({
        "by_state": by_state,
        "bytes_leased": l.bytes_leased,
        "bytes_free": l.bytes_free,
        "pool_bytes": l.pool_bytes,
        "bytes_scrubbing": l.bytes_scrubbing,
        "fenced_slots": l.fenced_slots,
        "allocs": l.allocs,
        "revokes": l.revokes,
        "expiries": l.expiries,
        "reconnects": l.reconnects,
        "alloc_us": histogram_json(&l.alloc_us),
        "revoke_us": histogram_json(&l.revoke_us),
    })
}

fn stats_json(s: &Stats) -> Value {
    let errors: serde_json::Map<String, Value> = s.errors.iter().map(|(c, n)| (error_name(*c), json!(n))).collect();
    let roles: Vec<Value> = s
        .roles
        .iter()
        .map(|(core, role, n)| json!({"core": core, "role": role_name(*role), "iterations": n}))
        .collect();
    json!({
        "uptime_ms": s.uptime_ms,
        "boot_id": hex::encode(&s.boot_id),
        "sessions_current": s.sessions_current,
        "session_budget": s.session_budget,
        "sessions_total": s.sessions_total,
        "sessions_refused": s.sessions_refused,
        "frames_in": s.frames_in,
        "frames_out": s.frames_out,
        "errors": errors,
        "roles": roles,
        "leases": lease_stats_json(&s.leases),
        // Absent from an appliance older than the guard block; zero for a tenant.
        "guards": s.guards.as_ref().map(|g| json!({
            "evicted": g.evicted,
            "rate_refusals": g.rate_refusals,
            "hellos_replayed": g.hellos_replayed,
            "records_in": g.records_in,
            "records_empty": g.records_empty,
        })),
    })
}

fn fenced_json(f: &FencedSlot) -> Value {
    json!({
        "slot": f.slot,
        "generation": f.generation,
        "failed_mask": f.failed_mask,
        "origin": origin_name(f.origin),
        "fenced_at_ms": f.fenced_at_ms,
    })
}

fn health_json(h: &Health) -> Value {
    json!({
        "status": h.status.name(),
        "hca": h.hca.name(),
        "fenced_slots": h.fenced_slots,
        "uptime_ms": h.uptime_ms,
        "message": h.message,
    })
}

fn outcome_json(o: Outcome, elapsed_us: u32) -> Value {
    json!({"outcome": o.name(), "elapsed_us": elapsed_us})
}

/// The JSON object for a response; `lease` is the lease the request named, if any.
pub fn response_json(r: &Response, lease: Option<String>) -> Value {
    let mut v = match r {
        Response::Hello(_) | Response::Bye => json!({}),
        Response::Heartbeat { echo, uptime_ms } => json!({"echo": echo, "uptime_ms": uptime_ms}),
        Response::Alloc(a) => alloc_json(a),
        Response::Ready { state } => json!({"state": state.name()}),
        Response::Renew { ttl_ms } => json!({"ttl_ms": ttl_ms}),
        Response::Free { outcome, elapsed_us } | Response::Revoke { outcome, elapsed_us } => {
            outcome_json(*outcome, *elapsed_us)
        }
        Response::Query(l) => info_json(l),
        Response::List { next_cursor, leases } => {
            json!({"next_cursor": next_cursor, "leases": leases.iter().map(info_json).collect::<Vec<_>>()})
        }
        Response::Stats(s) => stats_json(s),
        Response::FencedSummary { slots, .. } => json!({"slots": slots.iter().map(fenced_json).collect::<Vec<_>>()}),
        Response::Health(h) => health_json(h),
        Response::HcaStats(h) => json!({
            "hca": h.hca.name(),
            "submitted": h.submitted,
            "ok": h.ok,
            "failed": h.failed,
            "timeout": h.timeout,
            "late": h.late,
            "aborted": h.aborted,
        }),
        Response::Resume { leases } => json!({"leases": leases}),
        Response::Drain { leases, deadline_ms } => json!({"leases": leases, "deadline_ms": deadline_ms}),
        Response::LeaseLog { next_cursor, lost, records } => json!({
            "next_cursor": next_cursor,
            "lost": lost,
            "transitions": records.iter().map(|t| json!({
                "seq": t.seq,
                "at_us": t.at_us,
                "slot": t.slot,
                "generation": t.generation,
                "from": t.from.name(),
                "to": t.to.name(),
                "cause": t.why.name(),
                "failed_mask": t.failed_mask,
            })).collect::<Vec<_>>(),
        }),
    };
    if let (Some(l), Some(o)) = (lease, v.as_object_mut()) {
        o.entry("lease").or_insert(Value::from(l));
    }
    v
}

fn info_line(l: &LeaseInfo) -> String {
    format!(
        "{:<14} {:<14} {:<6} {:>12} {:>5} {:#010x} {:#08x} {:#08x} {:>10} {}",
        lease_str(l.lease),
        l.state.name(),
        access_str(l.access),
        l.size,
        mtu_str(l.mtu),
        l.rkey,
        l.server_qpn,
        l.client_qpn,
        l.ttl_left_ms,
        l.tenant
    )
}

const INFO_HEADER: &str =
    "LEASE          STATE          ACCESS         SIZE   MTU RKEY       SRV_QPN  CLI_QPN  TTL_LEFT_MS TENANT";

/// The human rendering of a response; `lease` is the lease the request named, if any.
pub fn response_human(r: &Response, lease: Option<String>) -> String {
    let lease = lease.unwrap_or_default();
    let mut s = String::new();
    match r {
        Response::Hello(_) | Response::Bye => s.push_str("ok\n"),
        Response::Heartbeat { echo, uptime_ms } => {
            let _ = writeln!(s, "heartbeat echo {echo}, server uptime {}", secs(*uptime_ms));
        }
        Response::Alloc(a) => {
            let _ = writeln!(s, "lease        {}", lease_str(a.lease));
            let _ = writeln!(s, "rkey         {:#010x}", a.rkey);
            let _ = writeln!(s, "remote_addr  {:#x}", a.remote_addr);
            let _ = writeln!(s, "length       {}", a.length);
            let _ = writeln!(s, "server_qpn   {:#x}", a.server_qpn);
            let _ = writeln!(s, "server_psn   {:#x}", a.server_psn);
            let _ = writeln!(s, "server_gid   {}", hex::encode(&a.server_gid));
            let _ = writeln!(s, "server_mac   {}", crate::rdma::mac_string(&a.server_mac));
            let _ = writeln!(s, "mtu          {}", mtu_str(a.mtu));
            let _ = writeln!(s, "ttl_ms       {}", a.ttl_ms);
        }
        Response::Ready { state } => {
            let _ = writeln!(s, "lease {lease}: {}", state.name());
        }
        Response::Renew { ttl_ms } => {
            let _ = writeln!(s, "lease {lease}: renewed, ttl {ttl_ms} ms");
        }
        Response::Free { outcome, elapsed_us } | Response::Revoke { outcome, elapsed_us } => {
            let _ = writeln!(s, "lease {lease}: {} in {elapsed_us} us", outcome.name());
        }
        Response::Query(l) => {
            let _ = writeln!(s, "{INFO_HEADER}\n{}", info_line(l));
        }
        Response::List { leases, .. } => {
            if leases.is_empty() {
                s.push_str("no leases\n");
            } else {
                let _ = writeln!(s, "{INFO_HEADER}");
                for l in leases {
                    let _ = writeln!(s, "{}", info_line(l));
                }
            }
        }
        Response::Resume { leases } => {
            let _ = writeln!(s, "resumed: {leases} lease(s) taken over");
        }
        Response::Drain { leases, deadline_ms } => {
            let _ = writeln!(s, "draining {leases} lease(s); revoked at server uptime {}", secs(*deadline_ms));
        }
        Response::Stats(st) => {
            let _ = writeln!(s, "uptime     {}", secs(st.uptime_ms));
            let _ = writeln!(s, "boot       {}", hex::encode(&st.boot_id));
            let _ = writeln!(
                s,
                "sessions   {} current (budget {}), {} total, {} refused",
                st.sessions_current, st.session_budget, st.sessions_total, st.sessions_refused
            );
            let _ = writeln!(s, "frames     {} in, {} out", st.frames_in, st.frames_out);
            if let Some(g) = &st.guards {
                let _ = writeln!(
                    s,
                    "guards     {} evicted, {} rate refusals, {} HELLOs replayed, {} records in ({} without a frame)",
                    g.evicted, g.rate_refusals, g.hellos_replayed, g.records_in, g.records_empty
                );
            }
            let errors: Vec<String> = st.errors.iter().map(|(c, n)| format!("{} {n}", error_name(*c))).collect();
            let _ = writeln!(s, "errors     {}", if errors.is_empty() { "none".into() } else { errors.join(", ") });
            for (core, role, n) in &st.roles {
                let _ = writeln!(s, "core {core:<5} {:<6} {n} iterations", role_name(*role));
            }
            let l = &st.leases;
            let states: Vec<String> =
                LeaseState::ALL.iter().map(|x| format!("{} {}", l.by_state[*x as usize], x.name())).collect();
            let _ = writeln!(s, "leases     {}", states.join(", "));
            let _ = writeln!(
                s,
                "memory     {} bytes leased, {} bytes free, {} fenced slots",
                l.bytes_leased, l.bytes_free, l.fenced_slots
            );
            if l.pool_bytes > 0 {
                let _ = writeln!(s, "pool       {} bytes, {} being cleared", l.pool_bytes, l.bytes_scrubbing);
            }
            let _ = writeln!(
                s,
                "lifetime   {} allocs, {} revokes, {} expiries, {} reconnects",
                l.allocs, l.revokes, l.expiries, l.reconnects
            );
            for (name, h) in [("alloc", &l.alloc_us), ("revoke", &l.revoke_us)] {
                let _ = writeln!(
                    s,
                    "{name:<10} p50 {}, p99 {} ({} timed)",
                    percentile_str(h, 50.0),
                    percentile_str(h, 99.0),
                    h.count()
                );
            }
        }
        Response::FencedSummary { slots, .. } => {
            if slots.is_empty() {
                s.push_str("no fenced slots\n");
            } else {
                let _ = writeln!(s, "SLOT       GENERATION FAILED_MASK ORIGIN  FENCED_AT");
                for f in slots {
                    let _ = writeln!(
                        s,
                        "{:<10} {:<10} {:#010x}  {:<7} {}",
                        f.slot,
                        f.generation,
                        f.failed_mask,
                        origin_name(f.origin),
                        secs(f.fenced_at_ms)
                    );
                }
            }
        }
        Response::Health(h) => {
            let _ = writeln!(
                s,
                "status {}, HCA {}, {} fenced slots, uptime {}: {}",
                h.status.name(),
                h.hca.name(),
                h.fenced_slots,
                secs(h.uptime_ms),
                h.message
            );
        }
        Response::LeaseLog { next_cursor, lost, records } => {
            if *lost != 0 {
                let _ = writeln!(s, "({lost} older transitions no longer held)");
            }
            for t in records {
                let _ = writeln!(s, "{t}");
            }
            let _ = writeln!(s, "next cursor {next_cursor}");
        }
        Response::HcaStats(h) => {
            let _ = writeln!(
                s,
                "HCA {}: commands submitted {}, ok {}, failed {}, timed out {}, late {}, aborted {}",
                h.hca.name(),
                h.submitted,
                h.ok,
                h.failed,
                h.timeout,
                h.late,
                h.aborted
            );
        }
    }
    s
}

/// `error: CODE: message`.
pub fn error_human(e: &ClientError) -> String {
    match e {
        ClientError::Server(b) => format!("error: {}: {}\n", b.code.name(), b.message),
        other => format!("error: {}: {other}\n", other.code()),
    }
}

/// `{"error": {"code": "...", "detail": [..], "message": "..."}}`.
pub fn error_json(e: &ClientError) -> Value {
    match e {
        ClientError::Server(b) => json!({"error": {"code": b.code.name(), "detail": b.detail, "message": b.message}}),
        other => json!({"error": {"code": other.code(), "detail": [], "message": other.to_string()}}),
    }
}

/// A usage error in JSON.
pub fn usage_json(message: &str) -> Value {
    json!({"error": {"code": "USAGE", "detail": [], "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasebox_proto::{ErrorBody, HcaState, HcaStats, HealthStatus, LeaseId, LeaseState};

    #[test]
    fn errors_render_code_and_message() {
        let e = ClientError::Server(ErrorBody::new(ErrorCode::CreditExceeded, "more than 8").with_detail([8, 0, 0]));
        assert_eq!(error_human(&e), "error: CREDIT_EXCEEDED: more than 8\n");
        assert_eq!(
            error_json(&e),
            json!({"error": {"code": "CREDIT_EXCEEDED", "detail": [8, 0, 0], "message": "more than 8"}})
        );
        assert_eq!(
            error_human(&ClientError::ServerProof),
            "error: SERVER_PROOF: the server's HELLO answer or a record does not authenticate under the key\n"
        );
    }

    #[test]
    fn json_has_every_field() {
        let mut s = Stats {
            uptime_ms: 1500,
            boot_id: [0xb0; 16],
            sessions_current: 1,
            session_budget: 16,
            sessions_total: 2,
            sessions_refused: 0,
            frames_in: 5,
            frames_out: 6,
            errors: vec![(4, 2), (99, 1)],
            roles: vec![(0, 0, 10), (1, 7, 3)],
            leases: LeaseStats {
                by_state: [1, 2, 0, 0, 3],
                bytes_leased: 4096,
                bytes_free: 8192,
                fenced_slots: 3,
                allocs: 10,
                revokes: 4,
                expiries: 2,
                reconnects: 1,
                pool_bytes: 1 << 20,
                bytes_scrubbing: 4096,
                ..LeaseStats::default()
            },
            guards: None,
        };
        for us in [5, 6, 7, 900] {
            s.leases.alloc_us.record(us);
        }
        s.leases.revoke_us.record(1 << 20);
        let v = response_json(&Response::Stats(Box::new(s.clone())), None);
        assert_eq!(v["errors"], json!({"MALFORMED": 2, "code99": 1}));
        assert_eq!(v["roles"][1], json!({"core": 1, "role": "role7", "iterations": 3}));
        assert_eq!(v.as_object().unwrap().len(), 12);
        assert_eq!(v["boot_id"], "b0".repeat(16));
        let l = &v["leases"];
        assert_eq!(l.as_object().unwrap().len(), 12);
        assert_eq!((&l["pool_bytes"], &l["bytes_scrubbing"]), (&json!(1 << 20), &json!(4096)));
        assert_eq!(l["by_state"], json!({"Granted": 1, "Active": 2, "Fencing": 0, "PendingDestroy": 0, "Fenced": 3}));
        assert_eq!((&l["bytes_free"], &l["reconnects"]), (&json!(8192), &json!(1)));
        assert_eq!(l["alloc_us"]["count"], 4);
        assert_eq!((&l["alloc_us"]["p50_us"], &l["alloc_us"]["p99_us"]), (&json!(8), &json!(1024)));
        assert_eq!(l["alloc_us"]["buckets"][2], 3);
        assert_eq!((&l["revoke_us"]["p50_us"], &l["revoke_us"]["count"]), (&Value::Null, &json!(1)));
        let h = response_human(&Response::Stats(Box::new(s)), None);
        assert!(h.contains("uptime     1.500 s") && h.contains("MALFORMED 2") && h.contains("core 0     net"));
        assert!(h.contains(&format!("boot       {}", "b0".repeat(16))), "{h}");
        assert!(h.contains("leases     1 Granted, 2 Active, 0 Fencing, 0 PendingDestroy, 3 Fenced"), "{h}");
        assert!(h.contains("pool       1048576 bytes, 4096 being cleared"), "{h}");
        assert!(h.contains("memory     4096 bytes leased, 8192 bytes free, 3 fenced slots"), "{h}");
        assert!(h.contains("lifetime   10 allocs, 4 revokes, 2 expiries, 1 reconnects"), "{h}");
        assert!(h.contains("alloc      p50 < 8 us, p99 < 1024 us (4 timed)"), "{h}");
        assert!(h.contains("revoke     p50 >= 32768 us, p99 >= 32768 us (1 timed)"), "{h}");
        // No guard block (an older appliance's answer): null in JSON, no line.
        assert_eq!(v["guards"], Value::Null);
        assert!(!h.contains("guards"), "{h}");
        let g = leasebox_proto::SessionGuards {
            evicted: 3,
            rate_refusals: 4,
            hellos_replayed: 5,
            records_in: 600,
            records_empty: 7,
        };
        let s = Stats { guards: Some(g), ..Stats::default() };
        let v = response_json(&Response::Stats(Box::new(s.clone())), None);
        assert_eq!(
            v["guards"],
            json!({"evicted": 3, "rate_refusals": 4, "hellos_replayed": 5, "records_in": 600, "records_empty": 7})
        );
        let h = response_human(&Response::Stats(Box::new(s)), None);
        assert!(
            h.contains("guards     3 evicted, 4 rate refusals, 5 HELLOs replayed, 600 records in (7 without a frame)"),
            "{h}"
        );

        let l = LeaseInfo {
            lease: LeaseId { boot_id: [0xb1; 16], slot: 3, generation: 17 },
            state: LeaseState::Active,
            access: access::REMOTE_READ,
            mtu: 3,
            size: 4096,
            rkey: 0x100,
            server_qpn: 0x48,
            client_qpn: 0x11,
            ttl_left_ms: 900,
            tenant: "demo".into(),
        };
        let v = response_json(&Response::Query(l.clone()), Some("3.17".into()));
        assert_eq!(v["lease"], "3.17");
        assert_eq!(v["access"], "r--");
        assert_eq!(v["mtu"], 1024);
        assert_eq!(v["boot_id"], "b1".repeat(16));
        assert_eq!(v.as_object().unwrap().len(), 11);
        assert!(response_human(&Response::List { next_cursor: 0, leases: vec![l] }, None).contains("3.17"));
        let v = response_json(&Response::Revoke { outcome: Outcome::Fenced, elapsed_us: 7 }, Some("1.2".into()));
        assert_eq!(v, json!({"outcome": "Fenced", "elapsed_us": 7, "lease": "1.2"}));
        let h = Health {
            status: HealthStatus::Degraded,
            hca: HcaState::Absent,
            fenced_slots: 0,
            uptime_ms: 2,
            message: "no HCA".into(),
        };
        assert!(response_human(&Response::Health(h), None).starts_with("status degraded, HCA absent"));
        let c = HcaStats { hca: HcaState::Ok, submitted: 7, ok: 6, failed: 1, timeout: 0, late: 0, aborted: 0 };
        assert_eq!(
            response_human(&Response::HcaStats(c), None),
            "HCA ok: commands submitted 7, ok 6, failed 1, timed out 0, late 0, aborted 0\n"
        );
        let v = response_json(&Response::HcaStats(c), None);
        assert_eq!((v["submitted"].as_u64(), v["failed"].as_u64(), v["hca"].as_str()), (Some(7), Some(1), Some("ok")));
        let v = response_json(&Response::Drain { leases: 2, deadline_ms: 9000 }, None);
        assert_eq!(v, json!({"leases": 2, "deadline_ms": 9000}));
        assert_eq!(response_json(&Response::Resume { leases: 4 }, None), json!({"leases": 4}));
    }

    #[test]
    fn a_finished_drain() {
        let d = Drain {
            tenant: Some("demo"),
            notice_ms: 500,
            leases: 3,
            deadline_ms: 12_500,
            waited: Duration::from_millis(700),
        };
        assert_eq!(
            drain_human(&d),
            "drained tenant demo: 3 lease(s) told 500 ms ahead, revoked at server uptime 12.500 s; none left after 0.7 s\n"
        );
        assert_eq!(
            drain_json(&d),
            json!({"tenant": "demo", "notice_ms": 500, "leases": 3, "deadline_ms": 12_500, "waited_ms": 700, "left": 0})
        );
        assert!(drain_human(&Drain { tenant: None, ..d }).starts_with("drained every tenant: "));
    }
}
