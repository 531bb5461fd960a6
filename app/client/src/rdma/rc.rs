//! The RC requester as a sans-I/O state machine (IBTA Vol. 1 §9.7 "Reliable service": PSN assignment,
//! ACK/NAK handling, the transport timer and retries, RNR retries, §9.7.5.1.x implicit acknowledgement by
//! later ACKs and READ responses; completion statuses as rdma-core reports them). It consumes decoded
//! packets and the clock, and hands out packets to send and completions; [`super::soft`] moves the bytes.
//!
//! Work requests are kept in posting order; a request gets its PSNs when posted (a WRITE one per packet, a
//! READ as many as responses it asks for). Packets are sent within a window of `max_wr` requests and
//! `max_pkts` PSNs past the oldest unacknowledged one. Retransmission is go-back-N from that PSN (a READ
//! resumes at its first missing response with a shortened RETH, IBTA §9.7.5.2.8 / rxe `req_retry`).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::sg::{SgList, Sge};
use super::status::{WcOpcode, WcStatus};
use super::wire::{AethKind, Bth, NakCode, PSN_MASK, Packet, Reth, opcode};
use super::{Completion, QpState, mtu_enum};

/// `a + n` modulo 2^24.
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` as a signed 24-bit distance (valid while the two are less than 2^23 apart).
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

/// Longest message (IBTA: 2^31 bytes).
pub const MAX_MSG_LEN: u32 = 1 << 31;

/// IBTA Table 45, RNR NAK timer field → delay in microseconds.
const RNR_DELAY_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

/// Requester QP attributes (`struct ibv_qp_attr` `timeout`, `retry_cnt`, `rnr_retry`) and our window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcConfig {
    /// Transport timer 4.096 µs × 2^timeout (0 = infinite, as in IB).
    pub timeout: u8,
    /// Retries after a timer expiry or a PSN sequence error before `RETRY_EXC_ERR` (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs before `RNR_RETRY_EXC_ERR` (7 = forever).
    pub rnr_retry: u8,
    /// Work requests in flight (sent, not completed).
    pub max_wr: usize,
    /// PSNs in flight past the oldest unacknowledged one; a WRITE packet at each quarter of it asks for an
    /// ACK so a long message keeps moving. 32 by default: 128 KiB of 4 KiB frames, what the READs keep
    /// outstanding too (`engine::READ_IN_FLIGHT`). A larger window overruns the peer's UDP receive buffer (Linux
    /// gives a socket 208 KiB by default, and a datagram costs more than its bytes there): with 256, `bench
    /// client` measured 1 MiB WRITEs at 2 to 8 MiB/s from dropped frames and go-back-N retransmissions, with 32 at
    /// 30 to 55 MiB/s.
    pub max_pkts: u32,
}

impl Default for RcConfig {
    fn default() -> Self {
        RcConfig { timeout: 14, retry_cnt: 7, rnr_retry: 7, max_wr: 16, max_pkts: 32 }
    }
}

impl RcConfig {
    /// The transport timer period; `None` when `timeout` is 0 (infinite).
    pub fn transport_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096u64 << self.timeout.min(31)))
    }

    fn check(&self) -> Result<(), String> {
        if self.retry_cnt > 7 || self.rnr_retry > 7 || self.timeout > 31 {
            return Err(format!(
                "timeout {} / retry_cnt {} / rnr_retry {} out of range",
                self.timeout, self.retry_cnt, self.rnr_retry
            ));
        }
        if self.max_wr == 0 || self.max_pkts == 0 || self.max_pkts > 1 << 20 {
            return Err("max_wr and max_pkts must be in 1..=2^20".into());
        }
        Ok(())
    }
}

/// Counters for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcStats {
    pub packets_sent: u64,
    pub packets_resent: u64,
    pub timeouts: u64,
    pub retries: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    /// Packets ignored: stale or duplicate PSN, another QP, unexpected opcode, QP not in RTS.
    pub ignored: u64,
}

/// Where a work request's bytes are.
enum Data {
    /// Our own copy: a WRITE's payload, or the bytes a READ received so far (handed out by
    /// [`RcRequester::take_read`]).
    Owned(Vec<u8>),
    /// The caller's memory (zero copy): a WRITE's packets are gathered from it, a READ's responses written
    /// straight into it.
    Sg(SgList),
}

struct Wqe {
    wr_id: u64,
    op: WcOpcode,
    va: u64,
    rkey: u32,
    len: u32,
    data: Data,
    first_psn: u32,
    npkts: u32,
    /// WRITE: packets acknowledged. READ: responses received in order.
    done: u32,
}

pub struct RcRequester {
    cfg: RcConfig,
    qpn: u32,
    initial_psn: u32,
    state: QpState,
    remote_qpn: u32,
    mtu: u32,
    sq: VecDeque<Wqe>,
    /// PSN the next posted request gets.
    next_psn: u32,
    /// Next PSN to transmit (moves back on a retry).
    send_psn: u32,
    /// One past the highest PSN ever transmitted.
    sent_hi: u32,
    retry_left: u8,
    rnr_left: u8,
    timer: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The PSN the last retry went back to, so one loss is retried once, not once per later packet.
    goback: Option<u32>,
    completions: VecDeque<Completion>,
    read_results: HashMap<u64, Vec<u8>>,
    stats: RcStats,
}

impl RcRequester {
    /// A QP in RESET with our QPN and first PSN.
    pub fn new(cfg: RcConfig, qpn: u32, psn: u32) -> Result<RcRequester, String> {
        cfg.check()?;
        if !(2..=PSN_MASK).contains(&qpn) {
            return Err(format!("QPN {qpn:#x} is not a 24-bit RC QPN"));
        }
        let psn = psn & PSN_MASK;
        Ok(RcRequester {
            cfg,
            qpn,
            initial_psn: psn,
            state: QpState::Reset,
            remote_qpn: 0,
            mtu: 0,
            sq: VecDeque::new(),
            next_psn: psn,
            send_psn: psn,
            sent_hi: psn,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            timer: None,
            rnr_until: None,
            goback: None,
            completions: VecDeque::new(),
            read_results: HashMap::new(),
            stats: RcStats::default(),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn initial_psn(&self) -> u32 {
        self.initial_psn
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    pub fn config(&self) -> &RcConfig {
        &self.cfg
    }

    pub fn stats(&self) -> RcStats {
        self.stats
    }

    /// RESET → RTS toward `remote_qpn` with path MTU `mtu` bytes.
    pub fn connect(&mut self, remote_qpn: u32, mtu: u32) -> Result<(), String> {
        if self.state != QpState::Reset {
            return Err(format!("QP is {:?}, not RESET", self.state));
        }
        if mtu_enum(mtu).is_none() {
            return Err(format!("path MTU {mtu} is not 256/512/1024/2048/4096"));
        }
        if remote_qpn > PSN_MASK {
            return Err(format!("remote QPN {remote_qpn:#x} is wider than 24 bits"));
        }
        self.remote_qpn = remote_qpn;
        self.mtu = mtu;
        self.state = QpState::Rts;
        Ok(())
    }

    pub fn post_write(&mut self, now: Instant, wr_id: u64, va: u64, rkey: u32, data: &[u8]) -> Result<(), String> {
        self.post(now, wr_id, WcOpcode::RdmaWrite, va, rkey, data.len(), Data::Owned(data.to_vec()))
    }

    pub fn post_read(&mut self, now: Instant, wr_id: u64, va: u64, rkey: u32, len: u32) -> Result<(), String> {
        let data = Data::Owned(Vec::with_capacity(len.min(1 << 20) as usize));
        self.post(now, wr_id, WcOpcode::RdmaRead, va, rkey, len as usize, data)
    }

    /// An RDMA WRITE of the bytes in `sg`, in order, read from the caller's memory as each packet is sent (and
    /// sent again).
    ///
    /// # Safety
    ///
    /// Every piece stays valid for reads, and unwritten by anyone else, until this request's completion has been
    /// taken ([`RcRequester::take_completions`]) or the requester is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn post_write_sg(
        &mut self,
        now: Instant,
        wr_id: u64,
        va: u64,
        rkey: u32,
        sg: &[Sge],
    ) -> Result<(), String> {
        // SAFETY: the caller's promise is the list's contract; the list lives in the work request, which is
        // dropped when it completes (or with the requester).
        let list = unsafe { SgList::new(sg) };
        let len = usize::try_from(list.len()).unwrap_or(usize::MAX);
        self.post(now, wr_id, WcOpcode::RdmaWrite, va, rkey, len, Data::Sg(list))
    }

    /// An RDMA READ filling the pieces of `sg` in order, each response written straight into them.
    ///
    /// # Safety
    ///
    /// Every piece stays valid for writes, and untouched by anyone else, until this request's completion has
    /// been taken ([`RcRequester::take_completions`]) or the requester is dropped.
    #[allow(unsafe_code)]
    pub unsafe fn post_read_sg(
        &mut self,
        now: Instant,
        wr_id: u64,
        va: u64,
        rkey: u32,
        sg: &[Sge],
    ) -> Result<(), String> {
        // SAFETY: as in `post_write_sg`.
        let list = unsafe { SgList::new(sg) };
        let len = usize::try_from(list.len()).unwrap_or(usize::MAX);
        self.post(now, wr_id, WcOpcode::RdmaRead, va, rkey, len, Data::Sg(list))
    }

    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        now: Instant,
        wr_id: u64,
        op: WcOpcode,
        va: u64,
        rkey: u32,
        len: usize,
        data: Data,
    ) -> Result<(), String> {
        if self.state == QpState::Reset {
            return Err("QP not connected".into());
        }
        if len > MAX_MSG_LEN as usize {
            return Err(format!("message of {len} bytes exceeds 2^31"));
        }
        let len = len as u32;
        if self.state == QpState::Err {
            self.completions.push_back(Completion {
                wr_id,
                status: WcStatus::WrFlushErr,
                opcode: op,
                byte_len: 0,
                at: now,
            });
            return Ok(());
        }
        let npkts = len.div_ceil(self.mtu).max(1);
        self.sq.push_back(Wqe { wr_id, op, va, rkey, len, data, first_psn: self.next_psn, npkts, done: 0 });
        self.next_psn = psn_add(self.next_psn, npkts);
        Ok(())
    }

    /// Oldest PSN not yet acknowledged (or received, for READ responses).
    fn una(&self) -> u32 {
        self.sq.front().map_or(self.next_psn, |w| psn_add(w.first_psn, w.done))
    }

    fn outstanding(&self) -> bool {
        psn_diff(self.sent_hi, self.una()) > 0
    }

    /// When [`RcRequester::on_timer`] or [`RcRequester::transmit`] next has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.state != QpState::Rts {
            return None;
        }
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends what the window allows: `out(bth, reth, payload)` per packet, the payload in one or more pieces (a
    /// zero-copy WRITE's packet may span pieces of its scatter/gather list).
    pub fn transmit<F: FnMut(&Bth, Option<&Reth>, &[&[u8]])>(&mut self, now: Instant, mut out: F) {
        if self.state != QpState::Rts {
            return;
        }
        if let Some(t) = self.rnr_until {
            if now < t {
                return;
            }
            self.rnr_until = None;
        }
        let una = self.una();
        let ack_every = (self.cfg.max_pkts / 4).max(1);
        let mut sent = false;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(4);
        while self.send_psn != self.next_psn {
            let sp = self.send_psn;
            let Some(idx) = self.sq.iter().position(|w| {
                let k = psn_diff(sp, w.first_psn);
                k >= 0 && (k as u32) < w.npkts
            }) else {
                break;
            };
            if idx >= self.cfg.max_wr {
                break;
            }
            let mtu = self.mtu;
            let w = &self.sq[idx];
            let mut k = psn_diff(sp, w.first_psn) as u32;
            if w.op == WcOpcode::RdmaRead {
                k = k.min(w.done);
            }
            let psn = psn_add(w.first_psn, k);
            let end = if w.op == WcOpcode::RdmaRead { psn_add(w.first_psn, w.npkts) } else { psn_add(psn, 1) };
            if psn != una && psn_diff(end, una) as u32 > self.cfg.max_pkts {
                break;
            }
            parts.clear();
            let (bth, reth) = match w.op {
                WcOpcode::RdmaWrite => {
                    let last = k + 1 == w.npkts;
                    let op = match (k == 0, last) {
                        (true, true) => opcode::RDMA_WRITE_ONLY,
                        (true, false) => opcode::RDMA_WRITE_FIRST,
                        (false, true) => opcode::RDMA_WRITE_LAST,
                        (false, false) => opcode::RDMA_WRITE_MIDDLE,
                    };
                    let mut bth = Bth::new(op, self.remote_qpn, psn);
                    bth.ack_req = last || (psn_diff(psn, una) as u32 + 1).is_multiple_of(ack_every);
                    let reth = (k == 0).then_some(Reth { va: w.va, rkey: w.rkey, len: w.len });
                    let from = (k * mtu) as usize;
                    let to = (w.len as usize).min(from + mtu as usize);
                    match &w.data {
                        Data::Owned(d) => parts.push(&d[from..to]),
                        Data::Sg(l) => l.gather(from as u64, (to - from) as u64, &mut parts),
                    }
                    (bth, reth)
                }
                WcOpcode::RdmaRead => {
                    let off = k * mtu;
                    let reth = Reth { va: w.va.wrapping_add(off as u64), rkey: w.rkey, len: w.len - off };
                    (Bth::new(opcode::RDMA_READ_REQUEST, self.remote_qpn, psn), Some(reth))
                }
            };
            out(&bth, reth.as_ref(), &parts);
            self.stats.packets_sent += 1;
            if psn_diff(psn, self.sent_hi) < 0 {
                self.stats.packets_resent += 1;
            }
            sent = true;
            self.send_psn = end;
            if psn_diff(end, self.sent_hi) > 0 {
                self.sent_hi = end;
            }
        }
        if sent && self.timer.is_none() {
            self.timer = self.cfg.transport_timeout().map(|t| now + t);
        }
    }

    /// Runs the transport timer: on expiry, go back to the oldest unacknowledged PSN, or fail with
    /// `RETRY_EXC_ERR` (stamped with the expiry time) when the retries are used up.
    pub fn on_timer(&mut self, now: Instant) {
        if self.state != QpState::Rts {
            return;
        }
        let Some(t) = self.timer else { return };
        if now < t {
            return;
        }
        if !self.outstanding() {
            self.timer = None;
            return;
        }
        self.stats.timeouts += 1;
        self.goback = None;
        self.retry(now, t);
    }

    fn retry(&mut self, now: Instant, at: Instant) {
        if self.retry_left == 0 {
            self.fail(WcStatus::RetryExcErr, at);
            return;
        }
        self.retry_left -= 1;
        self.stats.retries += 1;
        let una = self.una();
        self.goback = Some(una);
        self.send_psn = una;
        self.timer = self.cfg.transport_timeout().map(|t| now + t);
    }

    /// A retry caused by the peer (sequence NAK, a response past a gap): once per PSN.
    fn go_back(&mut self, now: Instant) {
        if self.goback != Some(self.una()) {
            self.retry(now, now);
        }
    }

    fn progress(&mut self, now: Instant) {
        self.retry_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        self.goback = None;
        self.timer = if self.outstanding() { self.cfg.transport_timeout().map(|t| now + t) } else { None };
    }

    fn complete_front(&mut self, status: WcStatus, at: Instant) {
        let Some(w) = self.sq.pop_front() else { return };
        let byte_len = if status.is_success() { w.len } else { 0 };
        if status.is_success()
            && w.op == WcOpcode::RdmaRead
            && let Data::Owned(d) = w.data
        {
            self.read_results.insert(w.wr_id, d);
        }
        self.completions.push_back(Completion { wr_id: w.wr_id, status, opcode: w.op, byte_len, at });
    }

    /// The oldest request completes with `status`; the QP goes to ERR and every later request flushes.
    fn fail(&mut self, status: WcStatus, at: Instant) {
        self.complete_front(status, at);
        self.state = QpState::Err;
        self.timer = None;
        self.rnr_until = None;
        while !self.sq.is_empty() {
            self.complete_front(WcStatus::WrFlushErr, at);
        }
    }

    /// Acknowledges every packet up to `last`: whole WRITEs complete. Returns true when a READ lies wholly
    /// before `last` (its responses were lost: an implicit NAK).
    fn ack_through(&mut self, now: Instant, last: u32) -> bool {
        let mut progressed = false;
        let mut lost_read = false;
        while let Some(w) = self.sq.front_mut() {
            let covered = psn_diff(last, w.first_psn) + 1;
            if covered <= 0 {
                break;
            }
            let covered = covered as u32;
            if w.op == WcOpcode::RdmaRead {
                lost_read = covered >= w.npkts;
                break;
            }
            if covered >= w.npkts {
                self.complete_front(WcStatus::Success, now);
                progressed = true;
                continue;
            }
            if covered > w.done {
                w.done = covered;
                progressed = true;
            }
            break;
        }
        if progressed {
            self.progress(now);
        }
        lost_read
    }

    /// Handles a decoded packet addressed to us.
    pub fn handle(&mut self, now: Instant, p: &Packet<'_>) {
        if self.state != QpState::Rts || p.bth.dest_qp != self.qpn {
            self.stats.ignored += 1;
            return;
        }
        let una = self.una();
        let off = psn_diff(p.bth.psn, una);
        let span = psn_diff(self.sent_hi, una);
        let before = psn_add(p.bth.psn, PSN_MASK); // psn - 1
        match (p.bth.opcode, p.aeth.map(|a| a.kind())) {
            (opcode::ACKNOWLEDGE, Some(AethKind::Ack { .. })) if off >= 0 && off < span => {
                if self.ack_through(now, p.bth.psn) {
                    self.go_back(now);
                }
            }
            (opcode::ACKNOWLEDGE, Some(AethKind::Nak(NakCode::PsnSequence))) if off >= 0 && off <= span => {
                self.stats.naks += 1;
                self.ack_through(now, before);
                self.go_back(now);
            }
            (opcode::ACKNOWLEDGE, Some(AethKind::Nak(code))) if off >= 0 && off < span => {
                self.stats.naks += 1;
                self.ack_through(now, before);
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccess => WcStatus::RemAccessErr,
                    NakCode::RemoteOperational => WcStatus::RemOpErr,
                    NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                    NakCode::PsnSequence | NakCode::Other(_) => WcStatus::BadRespErr,
                };
                self.fail(status, now);
            }
            (opcode::ACKNOWLEDGE, Some(AethKind::RnrNak { timer })) if off >= 0 && off < span => {
                self.stats.rnr_naks += 1;
                self.ack_through(now, before);
                if self.cfg.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        self.fail(WcStatus::RnrRetryExcErr, now);
                        return;
                    }
                    self.rnr_left -= 1;
                }
                self.send_psn = self.una();
                self.goback = None;
                self.timer = None;
                self.rnr_until = Some(now + Duration::from_micros(RNR_DELAY_US[timer as usize & 31].into()));
            }
            (
                opcode::RDMA_READ_RESPONSE_FIRST
                | opcode::RDMA_READ_RESPONSE_MIDDLE
                | opcode::RDMA_READ_RESPONSE_LAST
                | opcode::RDMA_READ_RESPONSE_ONLY,
                _,
            ) if off >= 0 && off < span => self.on_read_response(now, p, off > 0),
            _ => self.stats.ignored += 1,
        }
    }

    fn on_read_response(&mut self, now: Instant, p: &Packet<'_>, past_una: bool) {
        // A READ response acknowledges every earlier request (IBTA §9.7.5.1.1 implicit ACK).
        if past_una && self.ack_through(now, psn_add(p.bth.psn, PSN_MASK)) {
            self.go_back(now);
            return;
        }
        let mtu = self.mtu;
        let Some(w) = self.sq.front() else { return };
        let k = psn_diff(p.bth.psn, w.first_psn);
        if w.op != WcOpcode::RdmaRead || k < 0 || k as u32 >= w.npkts {
            self.stats.ignored += 1;
            return;
        }
        let k = k as u32;
        if k != w.done {
            // Responses before this one were lost.
            self.go_back(now);
            return;
        }
        let last = k + 1 == w.npkts;
        let shape_ok = match p.bth.opcode {
            opcode::RDMA_READ_RESPONSE_FIRST | opcode::RDMA_READ_RESPONSE_MIDDLE => !last,
            _ => last,
        };
        let want = if last { w.len - k * mtu } else { mtu };
        let aeth_ok = p.aeth.is_none_or(|a| matches!(a.kind(), AethKind::Ack { .. }));
        if !shape_ok || !aeth_ok || p.payload.len() != want as usize {
            self.fail(WcStatus::BadRespErr, now);
            return;
        }
        if let Some(w) = self.sq.front_mut() {
            match &mut w.data {
                Data::Owned(d) => d.extend_from_slice(p.payload),
                Data::Sg(l) => l.scatter(u64::from(k) * u64::from(mtu), p.payload),
            }
            w.done += 1;
        }
        if last {
            self.complete_front(WcStatus::Success, now);
        }
        self.progress(now);
    }

    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    pub fn take_completions(&mut self) -> Vec<Completion> {
        self.completions.drain(..).collect()
    }

    /// The data of a completed READ (once).
    pub fn take_read(&mut self, wr_id: u64) -> Option<Vec<u8>> {
        self.read_results.remove(&wr_id)
    }

    /// Requests posted and not yet completed.
    pub fn pending(&self) -> usize {
        self.sq.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::{Addr, Aeth};
    use super::*;
    use std::net::Ipv4Addr;

    const ADDR: Addr = Addr {
        src_mac: [0; 6],
        dst_mac: [0; 6],
        src_ip: Ipv4Addr::LOCALHOST,
        dst_ip: Ipv4Addr::LOCALHOST,
        src_port: 0xC000,
        dst_port: 4791,
        tos: 0,
        ttl: 64,
    };

    fn ack(psn: u32, aeth: Aeth) -> Packet<'static> {
        Packet {
            addr: ADDR,
            bth: Bth::new(opcode::ACKNOWLEDGE, 0x77, psn),
            reth: None,
            aeth: Some(aeth),
            imm: None,
            payload: &[],
        }
    }

    fn sent(r: &mut RcRequester, now: Instant) -> Vec<(u8, u32, bool)> {
        let mut v = Vec::new();
        r.transmit(now, |b, _, _| v.push((b.opcode, b.psn, b.ack_req)));
        v
    }

    fn qp(psn: u32) -> RcRequester {
        let mut r = RcRequester::new(RcConfig::default(), 0x77, psn).unwrap();
        r.connect(0x99, 256).unwrap();
        r
    }

    #[test]
    fn psn_arithmetic_wraps_at_2_pow_24() {
        assert_eq!(psn_add(0xFF_FFFF, 1), 0);
        assert_eq!(psn_diff(0, 0xFF_FFFF), 1);
        assert_eq!(psn_diff(0xFF_FFFF, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(RcConfig::default().transport_timeout(), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(RcConfig { timeout: 0, ..RcConfig::default() }.transport_timeout(), None);
    }

    #[test]
    fn one_coalesced_ack_completes_every_earlier_write() {
        let t = Instant::now();
        let mut r = qp(0xFF_FFFE);
        for id in 0..3 {
            r.post_write(t, id, 0x1000, 5, &[id as u8; 600]).unwrap();
        }
        let s = sent(&mut r, t);
        let psns: Vec<u32> = s.iter().map(|x| x.1).collect();
        assert_eq!(psns, [0xFF_FFFE, 0xFF_FFFF, 0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(s[0].0, opcode::RDMA_WRITE_FIRST);
        assert_eq!(s[2], (opcode::RDMA_WRITE_LAST, 0, true));
        assert!(!r.has_completions());
        r.handle(t, &ack(1, Aeth::ack(0))); // inside the second WRITE: the first completes
        let c = r.take_completions();
        assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(0, WcStatus::Success)]);
        r.handle(t, &ack(1, Aeth::ack(0))); // duplicate: nothing
        assert!(!r.has_completions());
        r.handle(t, &ack(6, Aeth::ack(3)));
        let c = r.take_completions();
        assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);
        assert!(c.iter().all(|c| c.status == WcStatus::Success && c.byte_len == 600));
        assert_eq!(r.next_deadline(), None, "nothing outstanding, timer stopped");
    }

    #[test]
    fn a_sequence_nak_goes_back_once_and_a_fatal_nak_flushes_in_order() {
        let t = Instant::now();
        let mut r = qp(10);
        for id in 0..4 {
            r.post_write(t, id, 0, 5, &[0; 100]).unwrap();
        }
        assert_eq!(sent(&mut r, t).len(), 4);
        r.handle(t, &ack(11, Aeth::nak(NakCode::PsnSequence, 1)));
        r.handle(t, &ack(11, Aeth::nak(NakCode::PsnSequence, 1)));
        assert_eq!(r.take_completions().iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0]);
        let s = sent(&mut r, t);
        assert_eq!(s.iter().map(|x| x.1).collect::<Vec<_>>(), [11, 12, 13], "resent from the NAK's PSN");
        assert_eq!(r.stats().retries, 1);
        r.handle(t, &ack(12, Aeth::nak(NakCode::RemoteAccess, 2)));
        r.post_read(t, 9, 0, 5, 10).unwrap();
        let c = r.take_completions();
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            [(1, WcStatus::Success), (2, WcStatus::RemAccessErr), (3, WcStatus::WrFlushErr), (9, WcStatus::WrFlushErr)]
        );
        assert_eq!(r.state(), QpState::Err);
    }

    #[test]
    fn silence_fails_after_one_plus_retry_cnt_timer_periods_even_after_a_late_ack() {
        // Virtual time: the schedule is exact here, the UDP tests can only bound it.
        let t = Instant::now();
        let rc = RcConfig { timeout: 10, retry_cnt: 7, ..RcConfig::default() };
        let rto = rc.transport_timeout().unwrap();
        let mut r = RcRequester::new(rc, 0x77, 100).unwrap();
        r.connect(0x99, 256).unwrap();
        // The first WRITE's ACK comes after its timer expired once: one resend, then success.
        r.post_write(t, 1, 0, 5, &[1; 10]).unwrap();
        assert_eq!(sent(&mut r, t).len(), 1);
        r.on_timer(t + rto);
        assert_eq!(sent(&mut r, t + rto), [(opcode::RDMA_WRITE_ONLY, 100, true)]);
        r.handle(t + rto + Duration::from_micros(10), &ack(100, Aeth::ack(0)));
        assert_eq!(
            r.take_completions().iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success)]
        );
        let before = r.stats();
        assert_eq!(before.timeouts, 1);

        // Then silence. The ACK gave the retry count back: the next WRITE gets 1 + retry_cnt attempts.
        let t0 = t + rto * 3;
        r.post_write(t0, 2, 0, 5, &[2; 10]).unwrap();
        let mut attempts = sent(&mut r, t0).len();
        r.handle(t0, &ack(100, Aeth::ack(0))); // the resent first WRITE's ACK: stale
        while r.state() == QpState::Rts {
            let due = r.next_deadline().expect("the transport timer runs");
            let early = due - Duration::from_micros(1);
            r.on_timer(early);
            assert!(sent(&mut r, early).is_empty(), "resent before the timer expired");
            r.on_timer(due);
            attempts += sent(&mut r, due).len();
        }
        let c = r.take_completions();
        assert_eq!(c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(2, WcStatus::RetryExcErr)]);
        assert_eq!(c[0].at, t0 + rto * 8, "stamped with the 8th expiry");
        let s = r.stats();
        assert_eq!((s.timeouts - before.timeouts, attempts), (8, 8), "{s:?}");
        assert_eq!(s.ignored - before.ignored, 1, "{s:?}");
    }

    #[test]
    fn an_ack_past_an_unanswered_read_retries_the_read() {
        let t = Instant::now();
        let mut r = qp(0);
        r.post_read(t, 1, 0x1000, 5, 600).unwrap(); // PSN 0..=2
        r.post_write(t, 2, 0, 5, &[1; 10]).unwrap(); // PSN 3
        assert_eq!(sent(&mut r, t).len(), 2);
        r.handle(t, &ack(3, Aeth::ack(2)));
        assert!(!r.has_completions());
        let s = sent(&mut r, t);
        assert_eq!(
            s.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            [(opcode::RDMA_READ_REQUEST, 0), (opcode::RDMA_WRITE_ONLY, 3)]
        );
    }
}
