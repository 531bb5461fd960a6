//! The command trace: one JSON object per completed command per line (`ModelConfig::trace` or
//! `MLX5_MODEL_TRACE=<path>`), with the whole input and output structures as the driver and device saw them
//! (inline part and mailbox data, `input_length` / `output_length` bytes). Hand-formatted; no serde.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

pub struct Record<'a> {
    pub t_ns: u128,
    pub slot: u32,
    pub opcode: u16,
    pub op_mod: u16,
    pub status: u8,
    pub syndrome: u32,
    /// Delivery status when the transport refused the entry (then status/syndrome are 0).
    pub delivery: u8,
    pub input: &'a [u8],
    pub output: &'a [u8],
}

impl Record<'_> {
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(128 + 2 * (self.input.len() + self.output.len()));
        let _ = write!(
            s,
            "{{\"t_ns\":{},\"slot\":{},\"opcode\":\"{:#x}\",\"op_mod\":{},\"status\":{},\"syndrome\":\"{:#x}\"",
            self.t_ns, self.slot, self.opcode, self.op_mod, self.status, self.syndrome
        );
        if self.delivery != 0 {
            let _ = write!(s, ",\"delivery\":{}", self.delivery);
        }
        s.push_str(",\"input\":\"");
        hex(&mut s, self.input);
        s.push_str("\",\"output\":\"");
        hex(&mut s, self.output);
        s.push_str("\"}");
        s
    }
}

/// One UMR WQE the device executed (or flushed) on a REG_UMR QP's send queue (`crate::umr`): a line with
/// `"umr"` instead of `"opcode"`, so readers of the command lines pass over it. `status` is the CQE's: 0 for a
/// completed WQE, else the error CQE's syndrome (5, WR_FLUSH_ERR: flushed, never executed); `wqe` is the WQE's
/// bytes as read from the queue.
pub struct UmrRecord<'a> {
    pub t_ns: u128,
    pub qpn: u32,
    pub wqe_counter: u16,
    pub syndrome: u8,
    pub wqe: &'a [u8],
}

impl UmrRecord<'_> {
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(96 + 2 * self.wqe.len());
        let _ = write!(
            s,
            "{{\"t_ns\":{},\"umr\":{{\"qpn\":\"{:#x}\",\"wqe_counter\":{},\"status\":{}}},\"wqe\":\"",
            self.t_ns, self.qpn, self.wqe_counter, self.syndrome
        );
        hex(&mut s, self.wqe);
        s.push_str("\"}");
        s
    }
}

fn hex(s: &mut String, b: &[u8]) {
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
}

pub struct Trace {
    file: File,
}

impl Trace {
    pub fn create(path: &Path) -> io::Result<Trace> {
        Ok(Trace { file: File::create(path)? })
    }

    /// Writes one line; flushed at once so a killed model leaves a complete trace.
    pub fn write(&mut self, r: &Record) -> io::Result<()> {
        self.write_line(&r.to_json())
    }

    /// Writes one JSON line (a command's [`Record`] or a [`UmrRecord`]).
    pub fn write_line(&mut self, json: &str) -> io::Result<()> {
        let mut line = String::with_capacity(json.len() + 1);
        line.push_str(json);
        line.push('\n');
        self.file.write_all(line.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_format() {
        let r = Record {
            t_ns: 5,
            slot: 3,
            opcode: 0x104,
            op_mod: 0,
            status: 0,
            syndrome: 0,
            delivery: 0,
            input: &[0x01, 0x04],
            output: &[0xab],
        };
        assert_eq!(
            r.to_json(),
            r#"{"t_ns":5,"slot":3,"opcode":"0x104","op_mod":0,"status":0,"syndrome":"0x0","input":"0104","output":"ab"}"#
        );
    }
}
