//! `leasebox-hosted [--listen ADDR] [--hca [--udp ADDR] [--timing firmware|zero|Nus]] [--verbs DEVICE[:GID_INDEX]
//! [--verbs-qp-teardown err|destroy]] [OPTION=VALUE ...]` — the appliance as a Linux process: the same session
//! core as the image, driven by std TCP instead of smoltcp; with `--hca`, the device model in-process, the native
//! driver and the lease service; with `--verbs` (a binary built with `--features verbs`), the reference
//! responder: leases served by a real RDMA device through libibverbs (docs/rxe-guest.md). Options are the
//! kernel's (`tenant=`, `admin=`, `sessions=`, `credits=`, `heartbeat_ms=`, the lease options;
//! docs/operations.md). Used by tests and benchmarks.

use leasebox_hosted::{Hosted, HostedConfig};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match HostedConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasebox-hosted: {e}");
            eprintln!(
                "usage: leasebox-hosted [--listen ADDR] [--hca [--udp ADDR] [--timing firmware|zero|Nus]] \
                 [--verbs DEVICE[:GID_INDEX] [--verbs-qp-teardown err|destroy]] \
                 tenant=NAME:HEXKEY|admin=HEXKEY [sessions=N credits=N heartbeat_ms=N lease options...]"
            );
            return ExitCode::from(2);
        }
    };
    let verbs = cfg
        .verbs
        .as_ref()
        .map_or(String::from("none"), |v| format!("{}:{}:{}", v.device, v.gid_index, v.qp_teardown.name()));
    let sessions = cfg.limits.sessions;
    match Hosted::start(cfg) {
        Ok(h) => {
            let slots = h
                .with_leases(|b| (b.svc.config().slots, b.svc.paths()))
                .map_or(String::new(), |(n, p)| format!(" slots={n} {}", p.directions()));
            // The ready line mirrors the image's, so scripts can wait for it the same way.
            let udp = h.hca().and_then(|t| t.udp).map_or(String::from("none"), |a| a.to_string());
            println!(
                "leasebox: ready hosted=1 addr={} ctl_port={} sessions={sessions} hca={} udp={udp} verbs={verbs}{slots}",
                h.addr().ip(),
                h.addr().port(),
                h.hca().is_some()
            );
            h.join();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("leasebox-hosted: {e}");
            ExitCode::FAILURE
        }
    }
}
