//! The command-line check shared by the fuzz target `cmdline` (`fuzz_targets/cmdline.rs`, libFuzzer, nightly)
//! and its stable twin (`kernel/tests/fuzz_twins.rs`); both include this file by path.
//!
//! The kernel command line comes from the boot loader (or a GRUB menu someone edited) and carries the
//! control channel's keys. One input is a command line as bytes (what the multiboot parser accepts is UTF-8,
//! so invalid bytes are replaced). It goes through `Config::apply_cmdline`, then `Config::check`, with the
//! session core's option parser registered as the image registers it (the principals, keys and budgets are
//! its words, not the kernel's). Checked:
//! - no panic, whatever the text;
//! - an error names a key that is one of the line's words, with that word's value, and a reason;
//! - no error message and no `Redacted` rendering of the line shows the value of `tenant=` or `admin=`: both
//!   print `***` in its place;
//! - `Redacted` keeps every other word as it was, in order, single-spaced;
//! - applying the same line twice to fresh configurations gives the same result.

use leasebox_kernel::config::{Config, OptionParser, Options, Redacted};
use leasebox_session::SessionOptions;

/// What a line gave, owned: `Ok` with a few parsed values, or the error's key, value and reason.
type Outcome =
    Result<Result<(log::LevelFilter, u32, bool, u32), (String, String, &'static str)>, (String, String, &'static str)>;

/// Parses `line` as the image does (kernel keys, then the session core's parser) and checks it.
fn parse(line: &str) -> Outcome {
    let session = Options::checked(SessionOptions::DEFAULT, SessionOptions::apply, SessionOptions::check);
    let parsers: [&dyn OptionParser; 1] = [&session];
    let mut c = Config::with_parsers(&parsers);
    let owned = |e: leasebox_kernel::config::ConfigError<'_>| (e.key.to_string(), e.value.to_string(), e.reason);
    c.apply_cmdline(line)
        .map(|()| c.check().map(|()| (c.log, c.watchdog_ms, c.cores.is_some(), session.get().credits)).map_err(owned))
        .map_err(owned)
}

/// What one input did (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub accepted: u64,
    pub refused: u64,
    pub refused_by_check: u64,
    pub secrets: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.accepted += o.accepted;
        self.refused += o.refused;
        self.refused_by_check += o.refused_by_check;
        self.secrets += o.secrets;
    }
}

const SECRET_KEYS: [&str; 2] = ["tenant", "admin"];

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let text = String::from_utf8_lossy(data);
    let line: &str = &text;
    let words: Vec<&str> = line.split_ascii_whitespace().collect();

    let redacted = Redacted(line).to_string();
    let shown: Vec<&str> = redacted.split(' ').filter(|w| !w.is_empty()).collect();
    assert_eq!(shown.len(), words.len(), "Redacted keeps every word: {redacted:?}");
    for (w, s) in words.iter().zip(&shown) {
        match w.split_once('=') {
            Some((key, _)) if is_secret(key) => {
                n.secrets += 1;
                assert_eq!(*s, format!("{key}=***"), "a secret shows as ***");
            }
            _ => assert_eq!(s, w),
        }
    }

    let first = parse(line);
    assert_eq!(first, parse(line), "the same line, the same outcome");

    let session = Options::checked(SessionOptions::DEFAULT, SessionOptions::apply, SessionOptions::check);
    let parsers: [&dyn OptionParser; 1] = [&session];
    let mut c = Config::with_parsers(&parsers);
    match c.apply_cmdline(line) {
        Ok(()) => match c.check() {
            Ok(()) => n.accepted += 1,
            Err(e) => {
                n.refused_by_check += 1;
                error_is_sound(&e.to_string(), format!("{e:?}"), e.key, e.value, e.reason);
            }
        },
        Err(e) => {
            n.refused += 1;
            let word = if e.value.is_empty() { e.key.to_string() } else { format!("{}={}", e.key, e.value) };
            assert!(
                words.iter().any(|w| *w == word || w.split_once('=') == Some((e.key, e.value))),
                "the error names one of the line's words: {word:?}"
            );
            error_is_sound(&e.to_string(), format!("{e:?}"), e.key, e.value, e.reason);
        }
    }
    n
}

fn error_is_sound(shown: &str, debug: String, key: &str, value: &str, reason: &str) {
    assert!(!reason.is_empty());
    if is_secret(key) {
        assert_eq!(shown, format!("bad option {key}=***: {reason}"), "a secret's value never shows");
        assert_eq!(debug, format!("ConfigError {{ key: {key:?}, value: \"***\", reason: {reason:?} }}"));
    } else {
        assert_eq!(shown, format!("bad option {key}={value}: {reason}"));
    }
}
