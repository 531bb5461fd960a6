//! pytest's closing line, read by the `python-client` step (xtask/src/python.rs) and by the `rxe-qemu`
//! scenario, which runs the Python binding's suite inside the Soft-RoCE guest (tests/src/rxe.rs).

/// pytest's closing line (`N passed in S s`, `N failed, M passed …`, `no tests ran …`): the last line of `output`
/// that names passed, failed or error counts, or says no test ran, without its `=` frame.
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

/// Whether a closing line says at least one test passed and none failed or errored.
pub fn passed(line: &str) -> bool {
    line.contains(" passed") && !line.contains(" failed") && !line.contains(" error")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_lines() {
        let ok =
            "..........                                                               [100%]\n10 passed in 6.70s\n";
        assert_eq!(closing_line(ok).as_deref(), Some("10 passed in 6.70s"));
        assert!(passed("10 passed in 6.70s"));
        assert!(passed("20 passed, 13 skipped in 41.59s"));
        let bad = "F.\n=== FAILURES ===\n___ test_x ___\nassert 1 == 2\n=========== 1 failed, 1 passed in 0.12s ===========\n";
        assert_eq!(closing_line(bad).as_deref(), Some("1 failed, 1 passed in 0.12s"));
        assert!(!passed("1 failed, 1 passed in 0.12s"));
        assert!(!passed("3 passed, 1 error in 2.00s"));
        let none = "\nno tests ran in 0.01s\n";
        assert_eq!(closing_line(none).as_deref(), Some("no tests ran in 0.01s"));
        assert!(!passed("no tests ran in 0.01s"));
        assert_eq!(closing_line("collected 0 items\n"), None);
        assert_eq!(closing_line("ImportError: no module named leasebox\n"), None);
    }
}
