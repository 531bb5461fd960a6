//! A profiling harness for the mass revoke: `--leases` leases (default 10,000) granted, then every REVOKE
//! issued at once and the link loop run until the last outcome — the service, its link, the driver's engines
//! and the in-process model all on this one thread, so an instruction-counting profiler sees the whole path
//! and repeats it exactly:
//!
//! `valgrind --tool=callgrind --toggle-collect='*mass_revoke*' target/release/examples/revoke_profile`
//!
//! Prints the time per lease (which under a profiler means little); `cargo xtask bench lease` is the benchmark.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use common::{Rig, TENANT, alloc_req};
use leasebox_lease::Config;
use leasebox_mlx5::platform::Platform;
use leasebox_proto::{LeaseId, Outcome, Request, Response};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u32 = match (args.next().as_deref(), args.next()) {
        (None, _) => 10_000,
        (Some("--leases"), Some(v)) => v.parse().unwrap_or_else(|_| usage()),
        _ => usage(),
    };
    let cfg = Config {
        extent: 4096,
        slots: n,
        tenant_leases: n,
        ready_timeout_ms: 600_000,
        default_ttl_ms: 600_000,
        // No sweep before the last outcome, as in service (the default grace is 5 s).
        grace_ms: Config::default().grace_ms,
        ..common::config()
    };
    let mut r = Rig::with(common::model(), cfg, u64::from(n) * 4096);
    let leases = fill(&mut r, n);
    let t = Instant::now();
    mass_revoke(&mut r, &leases);
    let per = t.elapsed() / n;
    eprintln!(
        "revoke_profile: {n} REVOKEs to the last outcome, {per:?} per lease (service, engines and model on one thread)"
    );
}

fn usage() -> ! {
    eprintln!("usage: revoke_profile [--leases N]");
    std::process::exit(2)
}

/// `n` leases, ALLOCs pipelined 64 deep.
#[inline(never)]
fn fill(r: &mut Rig, n: u32) -> Vec<LeaseId> {
    let mut leases = Vec::new();
    let mut pending = VecDeque::new();
    for i in 0..n {
        let (t, _) = r.send(TENANT, &Request::Alloc(alloc_req(4096, 0x10 + i)));
        pending.push_back(t);
        while pending.len() > 64 || (i + 1 == n && !pending.is_empty()) {
            let t = pending.pop_front().expect("pending");
            let Ok(Response::Alloc(a)) = r.wait(t, Duration::from_secs(10)) else { panic!("ALLOC") };
            leases.push(a.lease);
        }
    }
    leases
}

/// Every REVOKE at once, then the link loop until the last outcome. The clock is the rig's virtual one, set
/// here to one microsecond per loop pass (about what a pass takes natively), so a profiler's slowdown changes
/// neither the deadlines nor how often the timers scan.
#[inline(never)]
fn mass_revoke(r: &mut Rig, leases: &[LeaseId]) {
    r.host.0.clock().go_virtual(Duration::from_micros(1));
    let now = r.now_us();
    for (ticket, &lease) in leases.iter().enumerate() {
        let answer =
            r.svc.request(TENANT, &Request::Revoke { lease, qp_first: false }, ticket as u64, now, &mut r.host);
        assert!(answer.is_none(), "{answer:?}");
    }
    let mut out = Vec::new();
    let mut answered = 0;
    while answered < leases.len() {
        let now = r.now_us();
        r.link.step(&mut r.svc, &mut r.d.client, now, &mut r.host);
        r.d.pump();
        r.host.0.relax();
        r.svc.take_answers(&mut out);
        for (_, reply) in out.drain(..) {
            assert!(matches!(reply, Ok(Response::Revoke { outcome: Outcome::TornDown, .. })), "{reply:?}");
            answered += 1;
        }
    }
}
