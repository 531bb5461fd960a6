//! The `leasebox-hosted` binary's command line: `--help` prints its usage and succeeds; a bad flag is refused
//! with the synopsis and exit status 2, before anything starts.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leasebox-hosted")).args(args).output().expect("run leasebox-hosted");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn help_prints_the_usage_and_succeeds() {
    for flag in ["--help", "-h"] {
        let (code, out, err) = run(&[flag]);
        assert_eq!(code, Some(0), "{flag}: {err}");
        assert!(out.starts_with("usage: leasebox-hosted"), "{flag}: {out}");
        for f in ["--listen", "--hca", "--udp", "--timing", "--verbs", "tenant=", "admin="] {
            assert!(out.contains(f), "{flag}'s help names {f}: {out}");
        }
        assert!(!err.contains("unknown flag"), "{err}");
    }
    // Anywhere on the line, even after other flags: the same help and nothing else (nothing is started, so no
    // ready line follows it).
    let (_, help, _) = run(&["--help"]);
    let (code, out, _) = run(&["--hca", "--udp", "127.0.0.1:0", "--help"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, help);
}

#[test]
fn a_bad_flag_is_refused_with_the_synopsis() {
    let (code, out, err) = run(&["--bogus"]);
    assert_eq!(code, Some(2));
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("unknown flag '--bogus'") && err.contains("usage: leasebox-hosted"), "{err}");
    assert!(err.contains("--help"), "points at --help: {err}");
}
