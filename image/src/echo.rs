//! A stand-in control service that echoes every byte back. It exists so the network path (virtio-net,
//! smoltcp, the listening pool, refusals) can be exercised end to end before the session core
//! (`app/session`) is plugged into the same [`StreamService`] seam; that service replaces this one.
//!
//! It keeps the real service's budget behaviour: at most `sessions` connections are served, one more is
//! answered `BUSY\n` and closed.

use crate::service::{ConnId, StreamService};
use alloc::boxed::Box;
use alloc::vec::Vec;

/// Bytes held per connection. The network loop feeds a connection only after its output is drained, in
/// chunks no larger than this, so the buffer never overflows.
pub const ECHO_BUF: usize = crate::net::INPUT_CHUNK;
const BUSY: &[u8] = b"BUSY\n";

struct Entry {
    conn: Option<ConnId>,
    refused: bool,
    buf: Box<[u8; ECHO_BUF]>,
    start: usize,
    len: usize,
    /// Input arrived while the buffer was full (not expected from the loop): close rather than lose bytes.
    overflowed: bool,
}

/// Echoes bytes; serves `sessions` connections at a time.
pub struct EchoService {
    entries: Vec<Entry>,
    sessions: usize,
}

impl EchoService {
    /// Room for `sessions` connections plus the one that is refused; allocated here, once.
    pub fn new(sessions: usize) -> Self {
        let entries = (0..=sessions)
            .map(|_| Entry {
                conn: None,
                refused: false,
                buf: Box::new([0; ECHO_BUF]),
                start: 0,
                len: 0,
                overflowed: false,
            })
            .collect();
        EchoService { entries, sessions }
    }

    fn entry(&mut self, conn: ConnId) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.conn == Some(conn))
    }
}

impl StreamService for EchoService {
    fn open(&mut self, conn: ConnId, _now_ms: u64) -> bool {
        let serving = self.entries.iter().filter(|e| e.conn.is_some() && !e.refused).count();
        let refused = serving >= self.sessions;
        let Some(e) = self.entries.iter_mut().find(|e| e.conn.is_none()) else {
            // More connections than the listening pool can hold cannot reach here; refuse without a word.
            return false;
        };
        e.conn = Some(conn);
        e.refused = refused;
        e.start = 0;
        e.len = 0;
        e.overflowed = false;
        if refused {
            e.buf[..BUSY.len()].copy_from_slice(BUSY);
            e.len = BUSY.len();
        }
        !refused
    }

    fn input(&mut self, conn: ConnId, data: &[u8], _now_ms: u64) {
        let Some(e) = self.entry(conn) else { return };
        if e.refused {
            return;
        }
        if e.start + e.len + data.len() > ECHO_BUF && e.start > 0 {
            e.buf.copy_within(e.start..e.start + e.len, 0);
            e.start = 0;
        }
        let end = e.start + e.len;
        let n = data.len().min(ECHO_BUF - end);
        e.buf[end..end + n].copy_from_slice(&data[..n]);
        e.len += n;
        e.overflowed |= n < data.len();
    }

    fn output(&mut self, conn: ConnId, buf: &mut [u8]) -> usize {
        let Some(e) = self.entry(conn) else { return 0 };
        let n = buf.len().min(e.len);
        buf[..n].copy_from_slice(&e.buf[e.start..e.start + n]);
        e.start += n;
        e.len -= n;
        if e.len == 0 {
            e.start = 0;
        }
        n
    }

    fn wants_close(&self, conn: ConnId) -> bool {
        self.entries.iter().any(|e| e.conn == Some(conn) && (e.refused || e.overflowed))
    }

    fn closed(&mut self, conn: ConnId, _now_ms: u64) {
        if let Some(e) = self.entry(conn) {
            e.conn = None;
        }
    }

    fn tick(&mut self, _now_ms: u64) {}
}
