//! The `python-client` step of `cargo xtask test`: the Python binding (app/client-py) built the way a user
//! builds it — `pip install app/client-py` into a virtualenv, which runs maturin — and its pytest suite run
//! against a hosted appliance (app/client-py/tests/conftest.py starts `target/debug/leasebox-hosted`).
//!
//! The virtualenv (`target/py-venv`) and the extension's cargo target directory (`target/client-py`) are kept
//! between runs, so a second run rebuilds only what changed. The crate is not a workspace member (see its
//! Cargo.toml), so this step also runs rustfmt and clippy on it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::image::{self, Paths};

/// The interpreter that makes the virtualenv: `$LEASEBOX_PYTHON`, else `python3` from `PATH`.
fn base_python() -> String {
    std::env::var("LEASEBOX_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn venv_dir(p: &Paths) -> PathBuf {
    p.target.join("py-venv")
}

/// Runs `cmd`, echoing it; an error names the command and its status.
fn run(cmd: &mut Command) -> Result<(), String> {
    println!("==> {}", describe(cmd));
    let status = cmd.status().map_err(|e| format!("running {}: {e}", describe(cmd)))?;
    if status.success() { Ok(()) } else { Err(format!("`{}` failed ({status})", describe(cmd))) }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The virtualenv's interpreter, making the virtualenv first when it is missing or broken.
fn venv(p: &Paths) -> Result<PathBuf, String> {
    let dir = venv_dir(p);
    let py = dir.join("bin").join("python");
    let works = Command::new(&py).args(["-c", "import sys"]).output().is_ok_and(|o| o.status.success());
    if !works {
        let base = base_python();
        let _ = std::fs::remove_dir_all(&dir);
        run(Command::new(&base).arg("-m").arg("venv").arg(&dir)).map_err(|e| {
            format!("{e}: the python-client step needs CPython 3.9 or later with the venv module ({base})")
        })?;
    }
    Ok(py)
}

/// pytest's closing line (`N passed in S s`, `N failed, M passed …`, `no tests ran …`): its last line that
/// starts and ends with `=` or that names passed/failed/error counts.
pub fn closing_line(output: &str) -> Option<String> {
    output
        .lines()
        .rev()
        .map(|l| l.trim().trim_matches('=').trim())
        .find(|l| {
            l.contains(" passed") || l.contains(" failed") || l.contains(" error") || l.starts_with("no tests ran")
        })
        .map(str::to_string)
}

/// Whether pytest's closing line says at least one test passed and none failed or errored.
pub fn closing_line_passed(line: &str) -> bool {
    line.contains(" passed") && !line.contains(" failed") && !line.contains(" error")
}

/// The step: virtualenv, `pip install app/client-py pytest`, rustfmt and clippy on the crate, the hosted
/// appliance built, `pytest -q app/client-py/tests`, its closing line printed.
pub fn step(p: &Paths) -> Result<(), String> {
    let pkg = p.root.join("app").join("client-py");
    let manifest = pkg.join("Cargo.toml");
    let crate_target = p.target.join("client-py");
    let cargo = image::cargo();
    run(Command::new(&cargo).current_dir(&p.root).args(["fmt", "--manifest-path"]).arg(&manifest).arg("--check"))?;
    run(Command::new(&cargo)
        .current_dir(&p.root)
        .env("CARGO_TARGET_DIR", &crate_target)
        .args(["clippy", "--manifest-path"])
        .arg(&manifest)
        .args(["--all-targets", "--", "-D", "warnings"]))?;
    run(Command::new(&cargo).current_dir(&p.root).args(["build", "-p", "leasebox-hosted"]))?;
    let package = install(p)?;
    // Where the built package is: what a Python without a build (the Soft-RoCE guest's) imports from.
    println!("    leasebox package (extension and Python files): {}", package.display());
    pytest(p, &venv(p)?, &pkg.join("tests"))
}

/// `pip install app/client-py pytest` into the virtualenv (maturin builds the extension, with leasebox-client's
/// verbs backend, in `target/client-py`); returns the installed `leasebox` package directory (see
/// [`installed_package`]).
pub fn install(p: &Paths) -> Result<PathBuf, String> {
    let py = venv(p)?;
    run(Command::new(&py)
        .current_dir(&p.root)
        .env("CARGO_TARGET_DIR", p.target.join("client-py"))
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .args(["-m", "pip", "install", "-q"])
        .arg(p.root.join("app").join("client-py"))
        .arg("pytest"))?;
    installed_package(&py)
}

/// The installed `leasebox` package directory of the interpreter `py`: the extension
/// (`_native.cpython-3XX-….so`, no libibverbs or libpython dependency) and the Python files beside it. Copied to
/// `DIR/leasebox/` on a machine with the same CPython minor version, `PYTHONPATH=DIR` imports it (docs/client.md,
/// "The Python data path").
pub fn installed_package(py: &Path) -> Result<PathBuf, String> {
    let out = Command::new(py)
        .args(["-c", "import leasebox, os; print(os.path.dirname(os.path.abspath(leasebox.__file__)))"])
        .output()
        .map_err(|e| format!("running {}: {e}", py.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn pytest(p: &Paths, py: &Path, tests: &Path) -> Result<(), String> {
    let mut cmd = Command::new(py);
    cmd.current_dir(&p.root)
        .env("CARGO_TARGET_DIR", &p.target)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(tests);
    println!("==> {}", describe(&cmd));
    let out = cmd.output().map_err(|e| format!("running pytest: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let closing = closing_line(&text);
    match (&closing, out.status.success()) {
        (Some(line), true) if closing_line_passed(line) => {
            println!("    pytest: {line}");
            Ok(())
        }
        _ => {
            // The whole output when something went wrong: which test, which assertion.
            print!("{text}");
            let code = out.status.code().map_or_else(|| "a signal".to_string(), |c| c.to_string());
            Err(match closing {
                // pytest exits 5 when it collected no test: a step that ran nothing has not passed.
                Some(line) => format!("pytest exited with {code}: {line}"),
                None => format!("pytest exited with {code} and printed no closing line"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytest_closing_lines() {
        let ok =
            "..........                                                               [100%]\n10 passed in 6.70s\n";
        assert_eq!(closing_line(ok).as_deref(), Some("10 passed in 6.70s"));
        assert!(closing_line_passed("10 passed in 6.70s"));
        let bad = "F.\n=== FAILURES ===\n___ test_x ___\nassert 1 == 2\n=========== 1 failed, 1 passed in 0.12s ===========\n";
        assert_eq!(closing_line(bad).as_deref(), Some("1 failed, 1 passed in 0.12s"));
        assert!(!closing_line_passed("1 failed, 1 passed in 0.12s"));
        let none = "\nno tests ran in 0.01s\n";
        assert_eq!(closing_line(none).as_deref(), Some("no tests ran in 0.01s"));
        assert!(!closing_line_passed("no tests ran in 0.01s"));
        assert!(!closing_line_passed("3 passed, 1 error in 1.00s"));
        assert_eq!(closing_line("ImportError: no module named leasebox\n"), None);
    }
}
