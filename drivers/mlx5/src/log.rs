//! The always-on command ring (after Hubris `ringbuf`): the last [`CAPACITY`] commands with opcode,
//! op_mod, status, syndrome, slot and elapsed time, plus totals. Cheap enough to stay on in every build;
//! dumped over the control channel (HEALTH) and on panic.

use core::fmt;

use crate::command::{ErrorKind, opcode_name, status_name};

pub const CAPACITY: usize = 128;

/// How a command ended, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Firmware status (0 = OK) and syndrome.
    Status(u8, u32),
    Delivery(u8),
    Timeout,
    /// Completed by the firmware after its timeout was reported (the slot leaves quarantine).
    LateCompletion(u8),
    Aborted,
}

impl Outcome {
    pub fn from_error(kind: &ErrorKind) -> Outcome {
        match *kind {
            ErrorKind::Status { status, syndrome } => Outcome::Status(status, syndrome),
            ErrorKind::Delivery { status } => Outcome::Delivery(status),
            ErrorKind::Timeout { .. } => Outcome::Timeout,
            _ => Outcome::Aborted,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub opcode: u16,
    pub op_mod: u16,
    pub slot: u8,
    pub outcome: Outcome,
    pub elapsed_ns: u64,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} slot {:2} {}({:#x}) op_mod {:#x} ",
            self.seq,
            self.slot,
            opcode_name(self.opcode),
            self.opcode,
            self.op_mod
        )?;
        match self.outcome {
            Outcome::Status(s, synd) => write!(f, "{} syndrome {synd:#x}", status_name(s))?,
            Outcome::Delivery(d) => write!(f, "delivery {d:#x}")?,
            Outcome::Timeout => f.write_str("TIMEOUT")?,
            Outcome::LateCompletion(d) => write!(f, "late completion (delivery {d:#x})")?,
            Outcome::Aborted => f.write_str("ABORTED")?,
        }
        write!(f, " {} us", self.elapsed_ns / 1000)
    }
}

/// Totals since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub submitted: u64,
    pub ok: u64,
    pub failed: u64,
    pub timeouts: u64,
    pub late: u64,
    pub aborted: u64,
}

/// The log as the command engine and its readers (HEALTH, HCA_STATS, the fatal-path dump) share it.
pub type SharedLog = alloc::sync::Arc<spin::Mutex<CmdLog>>;

pub struct CmdLog {
    ring: [Option<Record>; CAPACITY],
    next: u64,
    pub counters: Counters,
}

impl Default for CmdLog {
    fn default() -> Self {
        CmdLog { ring: [None; CAPACITY], next: 0, counters: Counters::default() }
    }
}

impl CmdLog {
    pub fn record(&mut self, opcode: u16, op_mod: u16, slot: u8, outcome: Outcome, elapsed_ns: u64) {
        match outcome {
            Outcome::Status(0, _) => self.counters.ok += 1,
            Outcome::Status(..) | Outcome::Delivery(_) => self.counters.failed += 1,
            Outcome::Timeout => self.counters.timeouts += 1,
            Outcome::LateCompletion(_) => self.counters.late += 1,
            Outcome::Aborted => self.counters.aborted += 1,
        }
        let seq = self.next;
        self.ring[(seq as usize) % CAPACITY] = Some(Record { seq, opcode, op_mod, slot, outcome, elapsed_ns });
        self.next += 1;
    }

    /// The kept records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        let start = self.next.saturating_sub(CAPACITY as u64);
        (start..self.next).filter_map(move |s| self.ring[(s as usize) % CAPACITY].as_ref())
    }

    /// The newest `n` records, oldest first.
    pub fn last(&self, n: usize) -> impl Iterator<Item = &Record> {
        let skip = self.records().count().saturating_sub(n);
        self.records().skip(skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest() {
        let mut l = CmdLog::default();
        for i in 0..(CAPACITY as u16 + 10) {
            l.record(0x200, 0, 0, Outcome::Status(if i % 2 == 0 { 0 } else { 3 }, i.into()), 5);
        }
        assert_eq!(l.records().count(), CAPACITY);
        assert_eq!(l.records().next().unwrap().seq, 10);
        assert_eq!(
            l.last(2).map(|r| r.seq).collect::<alloc::vec::Vec<_>>(),
            [CAPACITY as u64 + 8, CAPACITY as u64 + 9]
        );
        assert_eq!(l.counters.ok + l.counters.failed, CAPACITY as u64 + 10);
        let s = alloc::format!("{}", l.last(1).next().unwrap());
        assert!(s.contains("CREATE_MKEY(0x200)") && s.contains("BAD_PARAM"), "{s}");
    }
}
