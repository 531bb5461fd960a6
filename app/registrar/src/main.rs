//! `leasebox-registrar --etcd HOST:PORT (--appliance 'HOST:PORT key=HEX ...' | --appliances FILE) ...` — polls
//! the appliances, advertises them in etcd, serves `/metrics` (docs/fleet.md). Runs until killed.

use std::process::ExitCode;

use leasebox_registrar::{Config, Registrar};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", Config::USAGE);
        return ExitCode::SUCCESS;
    }
    let cfg = match Config::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasebox-registrar: {e}\n{}", Config::USAGE);
            return ExitCode::from(2);
        }
    };
    let (name, n, etcd) = (cfg.name.clone(), cfg.appliances.len(), cfg.etcd.join(","));
    match Registrar::start(cfg) {
        Ok(r) => {
            let metrics = r.metrics_addr().map_or("none".to_string(), |a| a.to_string());
            println!("leasebox-registrar: ready name={name} appliances={n} etcd={etcd} metrics={metrics}");
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("leasebox-registrar: {e}");
            ExitCode::FAILURE
        }
    }
}
