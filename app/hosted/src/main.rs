//! `leasebox-hosted [--listen ADDR] [OPTION=VALUE ...]` — the appliance's control service as a Linux process:
//! the same session core as the image, driven by std TCP instead of smoltcp. Options are the kernel's
//! (`tenant=`, `admin=`, `sessions=`, `credits=`, `heartbeat_ms=`; docs/operations.md). Used by tests and by
//! `cargo xtask bench control`.

use leasebox_hosted::{Hosted, HostedConfig};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match HostedConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasebox-hosted: {e}");
            eprintln!(
                "usage: leasebox-hosted [--listen ADDR] tenant=NAME:HEXKEY|admin=HEXKEY [sessions=N credits=N heartbeat_ms=N]"
            );
            return ExitCode::from(2);
        }
    };
    match Hosted::start(cfg) {
        Ok(h) => {
            // The ready line mirrors the image's, so scripts can wait for it the same way.
            println!("leasebox: ready hosted=1 addr={} port={}", h.addr().ip(), h.addr().port());
            h.join();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("leasebox-hosted: {e}");
            ExitCode::FAILURE
        }
    }
}
