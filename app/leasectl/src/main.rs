//! `leasectl` — the Leasebox control CLI. See `leasectl --help` and docs/operations.md ("leasectl").

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os().skip(1).map(|a| a.into_string()).collect() {
        Ok(a) => a,
        Err(a) => {
            eprintln!("leasectl: argument {a:?} is not valid UTF-8");
            return ExitCode::from(leasectl::client::exit::USAGE);
        }
    };
    let env = |k: &str| std::env::var(k).ok();
    let code = leasectl::cli::run(&args, &env, &mut std::io::stdout().lock(), &mut std::io::stderr().lock());
    ExitCode::from(code)
}
