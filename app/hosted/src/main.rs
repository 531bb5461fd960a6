//! `leasebox-hosted [--listen ADDR] [--hca [--udp ADDR] [--timing firmware|zero|Nus]] [--verbs DEVICE[:GID_INDEX]
//! [--verbs-qp-teardown err|destroy]] [OPTION=VALUE ...]` — the appliance as a Linux process: the same session
//! core as the image, driven by std TCP instead of smoltcp; with `--hca`, the device model in-process, the native
//! driver and the lease service; with `--verbs` (a binary built with `--features verbs`), the reference
//! responder: leases served by a real RDMA device through libibverbs (docs/rxe-guest.md). Options are the
//! kernel's (`tenant=`, `admin=`, `sessions=`, `credits=`, `heartbeat_ms=`, the lease options;
//! docs/operations.md). Used by tests and benchmarks.

use leasebox_hosted::{Hosted, HostedConfig};
use std::process::ExitCode;

/// The one-line synopsis, printed after a bad command line.
const SYNOPSIS: &str = "usage: leasebox-hosted [--listen ADDR] [--hca [--udp ADDR] [--timing firmware|zero|Nus]] \
                        [--verbs DEVICE[:GID_INDEX] [--verbs-qp-teardown err|destroy]] \
                        tenant=NAME:HEXKEY|admin=HEXKEY [sessions=N credits=N heartbeat_ms=N lease options...]";

/// `--help`: the synopsis and what each flag does.
const HELP: &str = "\
The Leasebox appliance as a Linux process: the session core over std TCP, with the device model, the mlx5 driver
and the lease service in process (--hca), or the reference responder on a real RDMA device (--verbs).

Flags:
  --listen ADDR                  the control channel's address (default 127.0.0.1:7470; port 0: a free port)
  --hca                          run the ConnectX-5 device model, the driver and the lease service
  --udp ADDR                     the model's RoCEv2 responder on UDP (needs --hca)
  --timing firmware|zero|Nus     the model's firmware time per command (default firmware)
  --verbs DEVICE[:GID_INDEX]     the reference responder on an RDMA device (a build with --features verbs)
  --verbs-qp-teardown err|destroy  how the reference responder tears a lease's QP down (needs --verbs)
  -h, --help                     print this help

Options (KEY=VALUE words, as the image takes them on its command line; docs/operations.md):
  tenant=NAME:HEXKEY  admin=HEXKEY  appliance=NAME  sessions=N  credits=N  heartbeat_ms=N
  sessions_per_tenant=N  admin_sessions=N  preauth_sessions=N  and the lease options (lease_pool_mib=N, ...)

Once serving it prints `leasebox: ready hosted=1 addr=... ctl_port=... ...` on stdout.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Asked for help anywhere before a `--` is help, not a configuration (flags take no value that starts with
    // `-`, so no flag's value is mistaken for it).
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{SYNOPSIS}\n\n{HELP}");
        return ExitCode::SUCCESS;
    }
    let cfg = match HostedConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasebox-hosted: {e}");
            eprintln!("{SYNOPSIS}");
            eprintln!("(leasebox-hosted --help for the flags)");
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
