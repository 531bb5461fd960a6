//! Fault injection: what a test or the QEMU control file asks the device to do wrong, and
//! the rule book the device consults at three narrow points — once per command before it is executed
//! ([`Faults::on_command`]), once per doorbell read ([`Faults::take_doorbell_drop`]) and in the health tick
//! (the initialization segment's `health_stopped`, set through [`crate::Model::inject`]).
//!
//! The faults mirror what a driver must survive on a real ConnectX-5: a command that fails with a chosen
//! output-header status and syndrome (docs/reference/mlx5.md §c.6); a slow command (the entry stays HW-owned until the
//! delay has passed, other slots run meanwhile); a command that never completes (the driver's timeout path must
//! quarantine the slot, Linux "Avoid using pending command interface slots"); a health counter that stops and
//! a fatal health syndrome (docs/reference/mlx5.md §g); a lost doorbell write. The text form ([`Fault::parse`]) is the
//! control file's language (`docs/hca-model.md`, "Fault injection").

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next `count` commands of `opcode` complete with this output-header status and syndrome and are
    /// not executed (no state changes). A later rule for the same opcode replaces the earlier one.
    Fail { opcode: u16, count: u32, status: u8, syndrome: u32 },
    /// Commands of `opcode` complete `delay` after their doorbell (zero removes the rule).
    Delay { opcode: u16, delay: Duration },
    /// Commands of `opcode` are never completed: ownership stays with hardware, the slot is lost for good.
    Hang { opcode: u16 },
    /// The health counter (BAR0 0x1010) stops (`stopped`) or runs again.
    HealthCounter { stopped: bool },
    /// Fatal health syndrome `synd` (non-zero): the firmware is in internal error from then on. `rfr` is the
    /// health buffer's "firmware requests reset" bit: stock firmware leaves it 0 (its default), a firmware
    /// configured for reset-on-error sets it (docs/hca-model.md, "Fault injection").
    HealthFatal { synd: u8, rfr: bool },
    /// The next doorbell write is ignored (the entries it rang stay HW-owned).
    DropDoorbell,
    /// The next `count` UMR WQEs the device would run complete in error with this CQE syndrome instead, nothing
    /// of them applied (the QP goes to ERR and the WQEs behind them are flushed, as for any failed UMR;
    /// `crate::umr`). Zero removes the rule.
    UmrFail { count: u32, syndrome: u8 },
    /// UMR WQEs are no longer run: posted and rung, they stay in the queue with no completion (a UMR that
    /// never completes; the driver's deadline must catch it) until `clear`.
    UmrHang,
    /// Removes the fail, delay and hang rules (the UMR ones included) and pending doorbell drops. Commands
    /// already hung or delayed, a stopped counter and a fatal syndrome stay as they are; UMR WQEs held by a
    /// UMR hang run from the next pass.
    Clear,
}

/// What the device does with one rung command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Execute it.
    Run,
    /// Complete it with this status and syndrome without executing it.
    Fail { status: u8, syndrome: u32 },
    /// Complete it later (the device re-runs the slot at `due`).
    Delay { due: Instant },
    /// Never complete it.
    Hang,
    /// Firmware in internal error: the command is not executed and not completed.
    Dead,
}

/// Counts of what the faults did (tests and the process's log).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    pub failed: u64,
    pub delayed: u64,
    pub hung: u64,
    pub doorbells_dropped: u64,
    /// Commands rung after a fatal health syndrome.
    pub ignored_after_fatal: u64,
    /// Doorbells for a slot that is delayed or hung (ignored: the device still owns it).
    pub rings_on_busy_slot: u64,
}

#[derive(Clone, Copy, Debug)]
struct FailRule {
    left: u32,
    status: u8,
    syndrome: u32,
}

/// The rule book and the commands it holds back.
#[derive(Debug, Default)]
pub struct Faults {
    fail: BTreeMap<u16, FailRule>,
    delay: BTreeMap<u16, Duration>,
    hang: BTreeSet<u16>,
    drop_doorbells: u32,
    fatal: Option<u8>,
    /// Slot → (entry address, when it may complete).
    delayed: BTreeMap<u32, (u64, Instant)>,
    hung_slots: BTreeSet<u32>,
    counters: FaultCounters,
}

impl Faults {
    /// Records `f`. Health faults are also applied to the initialization segment by the caller.
    pub fn add(&mut self, f: Fault) {
        match f {
            Fault::Fail { opcode, count, status, syndrome } => {
                if count == 0 {
                    self.fail.remove(&opcode);
                } else {
                    self.fail.insert(opcode, FailRule { left: count, status, syndrome });
                }
            }
            Fault::Delay { opcode, delay } => {
                if delay.is_zero() {
                    self.delay.remove(&opcode);
                } else {
                    self.delay.insert(opcode, delay);
                }
            }
            Fault::Hang { opcode } => {
                self.hang.insert(opcode);
            }
            Fault::HealthCounter { .. } => {}
            Fault::HealthFatal { synd, .. } => self.fatal = Some(synd),
            Fault::DropDoorbell => self.drop_doorbells = self.drop_doorbells.saturating_add(1),
            // Kept by the UMR side (`crate::umr::UmrState`, through `Model::inject`).
            Fault::UmrFail { .. } | Fault::UmrHang => {}
            Fault::Clear => {
                self.fail.clear();
                self.delay.clear();
                self.hang.clear();
                self.drop_doorbells = 0;
            }
        }
    }

    /// The fatal health syndrome, once raised.
    pub fn fatal(&self) -> Option<u8> {
        self.fatal
    }

    pub fn counters(&self) -> FaultCounters {
        self.counters
    }

    /// Whether `slot` is held by a delay or a hang, without counting a ring.
    pub fn holds(&self, slot: u32) -> bool {
        self.delayed.contains_key(&slot) || self.hung_slots.contains(&slot)
    }

    /// Whether `slot` is held by a delay or a hang (a new ring of it is ignored).
    pub fn slot_busy(&mut self, slot: u32) -> bool {
        let busy = self.delayed.contains_key(&slot) || self.hung_slots.contains(&slot);
        if busy {
            self.counters.rings_on_busy_slot += 1;
        }
        busy
    }

    /// The doorbell hook: true if this (non-zero) doorbell is to be ignored.
    pub fn take_doorbell_drop(&mut self) -> bool {
        if self.drop_doorbells == 0 {
            return false;
        }
        self.drop_doorbells -= 1;
        self.counters.doorbells_dropped += 1;
        true
    }

    /// The command hook, for `opcode` rung in `slot` (entry at `addr`). `released` is true when a delayed
    /// command comes due (it is not delayed again). `latency`: the command's firmware time (`crate::timing`),
    /// during which it is held like a delayed one while other slots run; a `Delay` rule replaces it.
    pub fn on_command(
        &mut self,
        opcode: u16,
        slot: u32,
        addr: u64,
        now: Instant,
        released: bool,
        latency: Duration,
    ) -> Verdict {
        if self.fatal.is_some() {
            self.counters.ignored_after_fatal += 1;
            return Verdict::Dead;
        }
        if self.hang.contains(&opcode) {
            self.hung_slots.insert(slot);
            self.counters.hung += 1;
            return Verdict::Hang;
        }
        if !released && let Some(&d) = self.delay.get(&opcode) {
            let due = now + d;
            self.delayed.insert(slot, (addr, due));
            self.counters.delayed += 1;
            return Verdict::Delay { due };
        }
        if !released && !latency.is_zero() {
            let due = now + latency;
            self.delayed.insert(slot, (addr, due));
            return Verdict::Delay { due };
        }
        if let Some(r) = self.fail.get_mut(&opcode) {
            let (status, syndrome) = (r.status, r.syndrome);
            r.left -= 1;
            if r.left == 0 {
                self.fail.remove(&opcode);
            }
            self.counters.failed += 1;
            return Verdict::Fail { status, syndrome };
        }
        Verdict::Run
    }

    /// Delayed commands whose time has come, as (slot, entry address), removed from the book, earliest due
    /// first (slots that came due in the same pass complete in the order their time ran out).
    pub fn due(&mut self, now: Instant) -> Vec<(u32, u64)> {
        if self.delayed.is_empty() {
            return Vec::new();
        }
        let mut ready: Vec<(Instant, u32)> =
            self.delayed.iter().filter(|(_, (_, due))| *due <= now).map(|(s, (_, due))| (*due, *s)).collect();
        ready.sort_unstable();
        ready.into_iter().filter_map(|(_, s)| self.delayed.remove(&s).map(|(a, _)| (s, a))).collect()
    }

    /// When the earliest held command comes due (the idle poller wakes by then).
    pub fn next_due(&self) -> Option<Instant> {
        self.delayed.values().map(|(_, due)| *due).min()
    }
}

/// The output header (`status`, `syndrome`; docs/reference/mlx5.md §c.6) of a command failed by [`Fault::Fail`].
pub fn output(status: u8, syndrome: u32) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out[0] = status;
    out[4..8].copy_from_slice(&syndrome.to_be_bytes());
    out
}

/// A control-file line that is not a fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The control language, one command per line (numbers in hex with or without `0x`, except counts and
/// milliseconds, which are decimal).
pub const SYNTAX: &str = "\
fail <opcode hex> <count> <status hex> <syndrome hex>
delay <opcode hex> <ms>
hang <opcode hex>
health stop | health run | health fatal <synd hex> [rfr=0|rfr=1]
drop-doorbell
umr fail <count> <syndrome hex> | umr hang
clear";

fn hex(what: &str, v: Option<&str>, max: u64) -> Result<u64, ParseError> {
    let v = v.ok_or_else(|| ParseError(format!("missing {what}")))?;
    let digits = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")).unwrap_or(v);
    match u64::from_str_radix(digits, 16) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(ParseError(format!("{what} must be hex at most {max:#x}, got `{v}`"))),
    }
}

fn dec(what: &str, v: Option<&str>, max: u64) -> Result<u64, ParseError> {
    let v = v.ok_or_else(|| ParseError(format!("missing {what}")))?;
    match v.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(ParseError(format!("{what} must be a decimal number at most {max}, got `{v}`"))),
    }
}

impl Fault {
    /// Parses one control line; `Ok(None)` for a blank line or a `#` comment.
    pub fn parse(line: &str) -> Result<Option<Fault>, ParseError> {
        let line = line.split('#').next().unwrap_or("");
        let mut w = line.split_ascii_whitespace();
        let Some(verb) = w.next() else { return Ok(None) };
        let f = match verb {
            "fail" => Fault::Fail {
                opcode: hex("opcode", w.next(), 0xffff)? as u16,
                count: dec("count", w.next(), u64::from(u32::MAX))? as u32,
                status: hex("status", w.next(), 0xff)? as u8,
                syndrome: hex("syndrome", w.next(), 0xffff_ffff)? as u32,
            },
            "delay" => Fault::Delay {
                opcode: hex("opcode", w.next(), 0xffff)? as u16,
                delay: Duration::from_millis(dec("milliseconds", w.next(), 3_600_000)?),
            },
            "hang" => Fault::Hang { opcode: hex("opcode", w.next(), 0xffff)? as u16 },
            "health" => match w.next() {
                Some("stop") => Fault::HealthCounter { stopped: true },
                Some("run") => Fault::HealthCounter { stopped: false },
                Some("fatal") => {
                    let synd = match hex("synd", w.next(), 0xff)? as u8 {
                        0 => return Err(ParseError("a fatal syndrome is non-zero".into())),
                        synd => synd,
                    };
                    // Stock firmware's `rfr` is 0; `rfr=1` plays a firmware set to request a reset.
                    let rfr = match w.next() {
                        None | Some("rfr=0") => false,
                        Some("rfr=1") => true,
                        Some(other) => return Err(ParseError(format!("expected `rfr=0` or `rfr=1`, got `{other}`"))),
                    };
                    Fault::HealthFatal { synd, rfr }
                }
                _ => {
                    return Err(ParseError(
                        "expected `health stop`, `health run` or `health fatal <synd> [rfr=0|rfr=1]`".into(),
                    ));
                }
            },
            "drop-doorbell" => Fault::DropDoorbell,
            "umr" => match w.next() {
                Some("fail") => Fault::UmrFail {
                    count: dec("count", w.next(), u64::from(u32::MAX))? as u32,
                    syndrome: match hex("syndrome", w.next(), 0xff)? as u8 {
                        0 => return Err(ParseError("a UMR error syndrome is non-zero".into())),
                        s => s,
                    },
                },
                Some("hang") => Fault::UmrHang,
                _ => return Err(ParseError("expected `umr fail <count> <syndrome>` or `umr hang`".into())),
            },
            "clear" => Fault::Clear,
            other => return Err(ParseError(format!("unknown command `{other}`; expected one of:\n{SYNTAX}"))),
        };
        if let Some(extra) = w.next() {
            return Err(ParseError(format!("unexpected `{extra}` after `{verb}`")));
        }
        Ok(Some(f))
    }
}

/// The QEMU runs' control channel (`mlx5-model --control PATH`): a plain file, created empty (truncated) when
/// the model starts and polled every [`ControlFile::PERIOD`]; each complete line appended to it is one
/// [`Fault::parse`] command (`echo 'hang 0x104' >> PATH`). A file that shrinks is read again from its start.
/// A file rather than a socket: any shell can write it, and what was asked stays on disk next to the trace.
#[derive(Debug)]
pub struct ControlFile {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    next: Instant,
}

impl ControlFile {
    pub const PERIOD: Duration = Duration::from_millis(100);
    /// Longest line kept; a longer one is dropped as a parse error.
    const MAX_LINE: usize = 256;

    pub fn create(path: &Path) -> io::Result<ControlFile> {
        File::create(path).map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        Ok(ControlFile { path: path.to_path_buf(), offset: 0, partial: Vec::new(), next: Instant::now() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lines completed since the last look (at most every [`Self::PERIOD`]), each with its parse; blank
    /// lines and comments are left out. A file that cannot be read is skipped until it can.
    pub fn poll(&mut self, now: Instant) -> Vec<(String, Result<Fault, ParseError>)> {
        if now < self.next {
            return Vec::new();
        }
        self.next = now + Self::PERIOD;
        let Ok(mut f) = File::open(&self.path) else { return Vec::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.take(64 * 1024).read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        self.offset += buf.len() as u64;
        let mut out = Vec::new();
        for &b in &buf {
            if b != b'\n' {
                if self.partial.len() <= Self::MAX_LINE {
                    self.partial.push(b);
                }
                continue;
            }
            let line = String::from_utf8_lossy(&self.partial).trim().to_string();
            self.partial.clear();
            let parsed = if line.len() > Self::MAX_LINE {
                Err(ParseError(format!("line longer than {} bytes", Self::MAX_LINE)))
            } else {
                match Fault::parse(&line) {
                    Ok(None) => continue,
                    Ok(Some(f)) => Ok(f),
                    Err(e) => Err(e),
                }
            };
            out.push((line, parsed));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines() {
        let p = |s: &str| Fault::parse(s).unwrap();
        assert_eq!(
            p("fail 0x104 2 0x3 0x1040001"),
            Some(Fault::Fail { opcode: 0x104, count: 2, status: 3, syndrome: 0x0104_0001 })
        );
        assert_eq!(p("fail 10a 1 4 0"), Some(Fault::Fail { opcode: 0x10a, count: 1, status: 4, syndrome: 0 }));
        assert_eq!(p("delay 0x107 250"), Some(Fault::Delay { opcode: 0x107, delay: Duration::from_millis(250) }));
        assert_eq!(p("hang 0x102  # INIT_HCA"), Some(Fault::Hang { opcode: 0x102 }));
        assert_eq!(p("health stop"), Some(Fault::HealthCounter { stopped: true }));
        assert_eq!(p("health run"), Some(Fault::HealthCounter { stopped: false }));
        assert_eq!(p("health fatal 0x7"), Some(Fault::HealthFatal { synd: 7, rfr: false }));
        assert_eq!(p("health fatal 1 rfr=0"), Some(Fault::HealthFatal { synd: 1, rfr: false }));
        assert_eq!(p("health fatal 8 rfr=1"), Some(Fault::HealthFatal { synd: 8, rfr: true }));
        assert_eq!(p("drop-doorbell"), Some(Fault::DropDoorbell));
        assert_eq!(p("clear"), Some(Fault::Clear));
        assert_eq!(p("   "), None);
        assert_eq!(p("# nothing"), None);
        let e = |s: &str| Fault::parse(s).unwrap_err().0;
        assert!(e("explode").contains("unknown command"));
        assert!(e("fail 0x104 1 0x3").contains("missing syndrome"));
        assert!(e("fail 0x10000 1 3 0").contains("opcode"));
        assert!(e("fail 0x104 x 3 0").contains("count"));
        assert!(e("health fatal 0").contains("non-zero"));
        assert!(e("health fatal 1 rfr=2").contains("rfr=0"));
        assert!(e("health fatal 1 rfr=1 x").contains("unexpected `x`"));
        assert!(e("health").contains("health stop"));
        assert!(e("drop-doorbell now").contains("unexpected `now`"));
        assert_eq!(p("umr fail 2 0x4"), Some(Fault::UmrFail { count: 2, syndrome: 4 }));
        assert_eq!(p("umr hang"), Some(Fault::UmrHang));
        assert!(e("umr fail 1 0").contains("non-zero"));
        assert!(e("umr fail 1").contains("missing syndrome"));
        assert!(e("umr").contains("umr hang"));
        assert!(e("umr hang now").contains("unexpected `now`"));
    }

    #[test]
    fn rules() {
        let now = Instant::now();
        let mut f = Faults::default();
        f.add(Fault::Fail { opcode: 1, count: 2, status: 3, syndrome: 9 });
        assert_eq!(f.on_command(1, 0, 0, now, false, Duration::ZERO), Verdict::Fail { status: 3, syndrome: 9 });
        assert_eq!(f.on_command(2, 0, 0, now, false, Duration::ZERO), Verdict::Run);
        assert_eq!(f.on_command(1, 0, 0, now, false, Duration::ZERO), Verdict::Fail { status: 3, syndrome: 9 });
        assert_eq!(f.on_command(1, 0, 0, now, false, Duration::ZERO), Verdict::Run);
        f.add(Fault::Delay { opcode: 1, delay: Duration::from_millis(5) });
        assert!(matches!(f.on_command(1, 4, 0x40, now, false, Duration::ZERO), Verdict::Delay { .. }));
        assert!(f.slot_busy(4));
        assert!(f.due(now).is_empty());
        assert_eq!(f.due(now + Duration::from_millis(5)), [(4, 0x40)]);
        assert!(!f.slot_busy(4));
        assert_eq!(f.on_command(1, 4, 0x40, now, true, Duration::ZERO), Verdict::Run);
        f.add(Fault::DropDoorbell);
        assert!(f.take_doorbell_drop());
        assert!(!f.take_doorbell_drop());
        f.add(Fault::Clear);
        assert_eq!(f.on_command(1, 0, 0, now, false, Duration::ZERO), Verdict::Run);
        f.add(Fault::HealthFatal { synd: 1, rfr: false });
        assert_eq!(f.on_command(1, 0, 0, now, false, Duration::ZERO), Verdict::Dead);
        assert_eq!(f.counters().ignored_after_fatal, 1);
    }

    #[test]
    fn firmware_latency_holds_and_due_comes_in_time_order() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut f = Faults::default();
        assert_eq!(f.next_due(), None);
        assert_eq!(f.on_command(1, 0, 0x00, now, false, ms(3)), Verdict::Delay { due: now + ms(3) });
        assert_eq!(f.on_command(1, 1, 0x40, now, false, ms(1)), Verdict::Delay { due: now + ms(1) });
        assert_eq!(f.on_command(1, 2, 0x80, now, false, ms(2)), Verdict::Delay { due: now + ms(2) });
        assert_eq!(f.counters().delayed, 0, "firmware time is not a fault");
        assert_eq!(f.next_due(), Some(now + ms(1)));
        assert_eq!(f.due(now + ms(3)), [(1, 0x40), (2, 0x80), (0, 0x00)], "earliest due first, not slot order");
        assert_eq!(f.next_due(), None);
        // A delay rule replaces the firmware time; a released command is not held again.
        f.add(Fault::Delay { opcode: 1, delay: ms(50) });
        assert_eq!(f.on_command(1, 0, 0, now, false, ms(3)), Verdict::Delay { due: now + ms(50) });
        assert_eq!(f.on_command(1, 0, 0, now, true, ms(3)), Verdict::Run);
    }

    #[test]
    fn control_file_reads_appended_complete_lines() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("mlx5-control-{}.txt", std::process::id()));
        std::fs::write(&path, "stale from an old run\n").unwrap();
        let mut c = ControlFile::create(&path).unwrap();
        let t = Instant::now();
        assert!(c.poll(t).is_empty(), "created empty");
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"hang 0x104\n# note\n\nbogus\ndrop-door").unwrap();
        assert!(c.poll(t).is_empty(), "polled at most every PERIOD");
        let got = c.poll(t + ControlFile::PERIOD);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], ("hang 0x104".to_string(), Ok(Fault::Hang { opcode: 0x104 })));
        assert!(got[1].1.is_err());
        f.write_all(b"bell\n").unwrap();
        let got = c.poll(t + 2 * ControlFile::PERIOD);
        assert_eq!(got, [("drop-doorbell".to_string(), Ok(Fault::DropDoorbell))]);
        std::fs::write(&path, "clear\n").unwrap();
        assert_eq!(c.poll(t + 3 * ControlFile::PERIOD)[0].1, Ok(Fault::Clear), "a shrunk file is read again");
        std::fs::remove_file(&path).unwrap();
    }
}
