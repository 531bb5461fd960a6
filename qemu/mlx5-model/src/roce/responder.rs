//! The RC responder: what a ConnectX-5 does with an inbound RoCEv2 request for one of its QPs. Semantics follow
//! IBTA Vol. 1 9.7 (reliable service, responder side) with Linux `drivers/infiniband/sw/rxe/rxe_resp.c` as the
//! readable reference: QP state gate, PSN check (duplicate / in sequence / ahead), opcode sequence, QP remote
//! access enables, R_Key → MKEY (index, variant, PD, access, bounds), then the memory operation and the ACK,
//! NAK or READ responses.
//!
//! The responder does not know how the HCA stores its objects: it works over [`Tables`], which the command
//! side implements on its QP and MKEY tables (and tests implement on plain maps).

use std::collections::VecDeque;

use super::wire::{self, Aeth, Bth, Endpoints, NakCode, Packet, Reth, opcode};
use crate::mem::Memory;

/// QP states as the PRM numbers them (`MLX5_QP_STATE_*` in `include/linux/mlx5/qp.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    /// IBTA 10.3.1: the receive side works in RTR and in every later state except ERR.
    pub fn receives(self) -> bool {
        matches!(self, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
    }
}

/// Access bits in the positions of `mkc` byte 2 in `mlx5_ifc.h` (`a`, `rw`, `rr`, `lw`, `lr`, most significant
/// first). The QP's remote enables (`qpc.rre`, `rwe`, `rae`) use the same three remote bits.
pub const ACCESS_REMOTE_ATOMIC: u8 = 0x80;
pub const ACCESS_REMOTE_WRITE: u8 = 0x40;
pub const ACCESS_REMOTE_READ: u8 = 0x20;
pub const ACCESS_LOCAL_WRITE: u8 = 0x10;
pub const ACCESS_LOCAL_READ: u8 = 0x08;

/// What the responder needs to know about a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpView {
    pub qpn: u32,
    pub state: QpState,
    pub pd: u32,
    /// The requester's QPN (`qpc.remote_qpn`): destination QP of our ACKs and READ responses.
    pub remote_qpn: u32,
    /// Next expected PSN (`qpc.next_rcv_psn`).
    pub expected_psn: u32,
    /// `ACCESS_REMOTE_*` bits enabled on the QP.
    pub access: u8,
    /// Path MTU in bytes of payload (256 … 4096).
    pub mtu: u32,
    /// Where the QP's frames go: its address path. `None`: the QP has no IPv4 RoCEv2 path (the model sends
    /// IPv4 only), so nothing is sent.
    pub path: Option<ReplyPath>,
}

/// A QP's frames as firmware builds them from the QP's address path (`ads`: `rmac`, `rgid`, `udp_sport`,
/// `hop_limit`, `tclass`) and GID table entry `src_addr_index` (source MAC and IPv4), never from the
/// request's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyPath {
    pub endpoints: Endpoints,
    /// IPv4 TOS (`tclass`).
    pub tos: u8,
    /// IPv4 TTL (`hop_limit`).
    pub ttl: u8,
}

/// How an MKEY maps its virtual range onto device addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Translation {
    /// `start` maps to `base`, the whole range contiguously (physical-address style).
    Contiguous { base: u64 },
    /// MTT mode: `pages[i]` is the device address of the i-th page of `2^log_page_size` bytes, the first page
    /// being the one that contains `start` (so `start`'s offset within its page carries over).
    Pages { log_page_size: u8, pages: Vec<u64> },
}

/// What the responder needs to know about a memory key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MkeyView {
    /// The whole key: `index << 8 | variant` (`mkey_7_0` is the variant byte).
    pub key: u32,
    pub pd: u32,
    pub start: u64,
    pub len: u64,
    /// `ACCESS_*` bits.
    pub access: u8,
    pub translation: Translation,
}

/// QP async events the responder raises (`MLX5_EVENT_TYPE_*` in `include/linux/mlx5/device.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum QpEvent {
    /// Responder memory failure that is not the requester's fault (translation outside guest RAM).
    WqCatasError = 0x05,
    /// NAK invalid request sent (IBTA class C error).
    WqInvalReqError = 0x10,
    /// NAK remote access error sent (IBTA class C error).
    WqAccessError = 0x11,
}

/// A completed RDMA READ kept for duplicate requests (IBTA 9.7.5.1.6: a responder re-executes a duplicate
/// READ whose PSN falls within an earlier READ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReadRecord {
    first_psn: u32,
    packets: u32,
    msn: u32,
}

/// A multi-packet RDMA WRITE between its FIRST and LAST packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WriteInProgress {
    rkey: u32,
    va: u64,
    remaining: u64,
}

/// How many completed READs a QP remembers for duplicates (the model's `log_max_ra_res_qp` is not consulted).
pub const READ_HISTORY: usize = 16;

/// Per-QP responder state. It lives with the QP in the HCA's tables and must be reset to `default()` when the
/// QP is created or moved to RESET.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RespState {
    /// Message sequence number: requests completed so far (24 bits).
    pub msn: u32,
    write: Option<WriteInProgress>,
    /// A PSN sequence error NAK was sent and no in-sequence packet has arrived since (IBTA C9-100: one NAK per
    /// sequence error).
    nak_psn_sent: bool,
    reads: VecDeque<ReadRecord>,
}

/// The HCA's side of the responder.
pub trait Tables {
    /// Does the port take RoCE frames addressed to `eth_dst` / `ip_dst`? (RoCE enabled on the vport, the port's
    /// MAC, the IPv4 of a valid RoCEv2 GID.) Frames it does not take are dropped before anything else.
    fn accepts(&self, eth_dst: [u8; 6], ip_dst: [u8; 4]) -> bool;
    fn qp(&self, qpn: u32) -> Option<QpView>;
    /// The QP's responder state (None when the QP does not exist).
    fn resp_state(&mut self, qpn: u32) -> Option<&mut RespState>;
    /// The MKEY in slot `index` (= key >> 8), whatever its variant; None when the slot is free.
    fn mkey(&self, index: u32) -> Option<MkeyView>;
    fn set_qp_psn(&mut self, qpn: u32, next_expected: u32);
    /// The responder hit a class C error: the QP goes to ERR and `event` is raised on its EQ.
    fn qp_error(&mut self, qpn: u32, event: QpEvent);
    /// Guest RAM (device address = offset).
    fn ram(&self) -> &dyn Memory;
}

/// Why a frame got no answer (or what answer it got), for counters, traces and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Malformed frame (`WireError`), bad P_Key, or not a request opcode.
    Malformed,
    /// Not for this port's RoCE: `roce_en` off, or the destination MAC / IPv4 is not the port's / a GID's.
    NotForPort,
    NoSuchQp,
    /// The QP is in RESET, INIT or ERR.
    QpNotReceiving,
    /// Accepted without an ACK (AckReq clear on a FIRST/MIDDLE packet).
    Accepted,
    Acked,
    ReadResponse {
        packets: u32,
    },
    Nak(NakCode),
    /// Ahead of the expected PSN while a sequence NAK is outstanding, or an unknown duplicate READ.
    DroppedSequence,
    /// Duplicate WRITE re-acknowledged.
    DuplicateAcked,
    DuplicateReadResponse {
        packets: u32,
    },
}

const PSN_MASK: u32 = 0x00FF_FFFF;

fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// `psn - base` modulo 2^24, as a signed distance in (-2^23, 2^23].
fn psn_diff(psn: u32, base: u32) -> i32 {
    let d = psn.wrapping_sub(base) & PSN_MASK;
    if d >= 0x80_0000 { d as i32 - 0x100_0000 } else { d as i32 }
}

/// Handles one frame and returns the frames to send back (none = silence).
pub fn handle(tables: &mut dyn Tables, frame: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    handle_into(tables, frame, &mut |f| out.push(f));
    out
}

/// Like [`handle`], handing each reply frame to `send` as soon as it is built (a large READ does not have to
/// sit in memory whole), and saying what happened.
pub fn handle_into(tables: &mut dyn Tables, frame: &[u8], send: &mut dyn FnMut(Vec<u8>)) -> Disposition {
    let Ok(pkt) = wire::parse(frame) else { return Disposition::Malformed };
    if !tables.accepts(pkt.endpoints.eth_dst, pkt.endpoints.ip_dst) {
        return Disposition::NotForPort;
    }
    // P_Key: the model has only the default partition (IBTA 10.9.3: a mismatch is dropped, low 15 bits compared).
    if pkt.bth.pkey & 0x7FFF != wire::DEFAULT_PKEY & 0x7FFF || !is_request(pkt.bth.opcode) {
        return Disposition::Malformed;
    }
    let Some(qp) = tables.qp(pkt.bth.dest_qp) else { return Disposition::NoSuchQp };
    if !qp.state.receives() {
        return Disposition::QpNotReceiving;
    }
    let Some(st) = tables.resp_state(qp.qpn) else { return Disposition::NoSuchQp };
    let mut st = std::mem::take(st);
    let mut r = Responder { tables, qp, pkt: &pkt, send, epsn: qp.expected_psn };
    let d = r.run(&mut st);
    let epsn = r.epsn;
    if epsn != qp.expected_psn {
        tables.set_qp_psn(qp.qpn, epsn);
    }
    if let Some(slot) = tables.resp_state(qp.qpn) {
        *slot = st;
    }
    d
}

fn is_request(op: u8) -> bool {
    op <= opcode::RC_RDMA_READ_REQUEST || op == opcode::RC_COMPARE_SWAP || op == opcode::RC_FETCH_ADD
}

/// A violation that ends in a NAK; class C ones also move the QP to ERR.
enum Fault {
    InvalidRequest,
    RemoteAccess,
    /// Translation led outside guest RAM: NAK remote operational error, QP to ERR with a catastrophic event.
    RemoteOperational,
}

struct Responder<'a, 'p> {
    tables: &'a mut dyn Tables,
    qp: QpView,
    pkt: &'a Packet<'p>,
    send: &'a mut dyn FnMut(Vec<u8>),
    epsn: u32,
}

impl Responder<'_, '_> {
    fn run(&mut self, st: &mut RespState) -> Disposition {
        let psn = self.pkt.bth.psn;
        let d = psn_diff(psn, self.epsn);
        if d > 0 {
            if st.nak_psn_sent {
                return Disposition::DroppedSequence;
            }
            st.nak_psn_sent = true;
            // The NAK carries the PSN the responder expects (IBTA 9.7.5.2.2; rxe `send_ack(qp, NAK, qp->resp.psn)`).
            self.reply_aeth(opcode::RC_ACKNOWLEDGE, self.epsn, Aeth::nak(NakCode::PsnSequenceError, st.msn), &[]);
            return Disposition::Nak(NakCode::PsnSequenceError);
        }
        if d < 0 {
            return self.duplicate(st);
        }
        st.nak_psn_sent = false;
        match self.in_sequence(st) {
            Ok(d) => d,
            Err(fault) => {
                let (code, event) = match fault {
                    Fault::InvalidRequest => (NakCode::InvalidRequest, QpEvent::WqInvalReqError),
                    Fault::RemoteAccess => (NakCode::RemoteAccessError, QpEvent::WqAccessError),
                    Fault::RemoteOperational => (NakCode::RemoteOperationalError, QpEvent::WqCatasError),
                };
                // Class C: NAK with the offending packet's PSN, then the QP goes to ERR (rxe `do_class_ac_error`).
                st.write = None;
                self.reply_aeth(opcode::RC_ACKNOWLEDGE, psn, Aeth::nak(code, st.msn), &[]);
                self.tables.qp_error(self.qp.qpn, event);
                Disposition::Nak(code)
            }
        }
    }

    fn in_sequence(&mut self, st: &mut RespState) -> Result<Disposition, Fault> {
        let op = self.pkt.bth.opcode;
        let payload = self.pkt.payload;
        let mtu = u64::from(self.qp.mtu.clamp(256, 4096));
        let plen = payload.len() as u64;
        // Opcode sequence (IBTA 9.7.5.1.1, rxe `check_op_seq`): a multi-packet WRITE must be continued by its
        // MIDDLE/LAST packets and nothing else; MIDDLE/LAST need a FIRST.
        let continues = matches!(op, opcode::RC_RDMA_WRITE_MIDDLE | opcode::RC_RDMA_WRITE_LAST);
        if st.write.is_some() != continues {
            return Err(Fault::InvalidRequest);
        }
        match op {
            opcode::RC_RDMA_WRITE_FIRST | opcode::RC_RDMA_WRITE_ONLY => {
                self.require_qp_access(ACCESS_REMOTE_WRITE)?;
                let reth = self.pkt.reth.ok_or(Fault::InvalidRequest)?;
                let total = u64::from(reth.dma_len);
                let only = op == opcode::RC_RDMA_WRITE_ONLY;
                // Lengths (rxe `check_length`): ONLY carries the whole message within one MTU; FIRST carries
                // exactly one MTU of a longer message.
                let ok = if only { plen == total && plen <= mtu } else { plen == mtu && total > mtu };
                if !ok {
                    return Err(Fault::InvalidRequest);
                }
                if total > 0 {
                    self.write(reth.rkey, reth.va, payload)?;
                }
                self.epsn = psn_add(self.epsn, 1);
                if only {
                    st.msn = psn_add(st.msn, 1);
                    self.ack(st.msn);
                    Ok(Disposition::Acked)
                } else {
                    st.write = Some(WriteInProgress { rkey: reth.rkey, va: reth.va + plen, remaining: total - plen });
                    Ok(self.ack_if_requested(st.msn))
                }
            }
            opcode::RC_RDMA_WRITE_MIDDLE | opcode::RC_RDMA_WRITE_LAST => {
                let Some(w) = st.write else { return Err(Fault::InvalidRequest) };
                let last = op == opcode::RC_RDMA_WRITE_LAST;
                let ok = if last { plen == w.remaining && plen <= mtu } else { plen == mtu && w.remaining > mtu };
                if !ok {
                    return Err(Fault::InvalidRequest);
                }
                // Every packet is checked against the MKEY as it is now: a key destroyed mid-message stops the
                // message with a NAK.
                self.write(w.rkey, w.va, payload)?;
                self.epsn = psn_add(self.epsn, 1);
                if last {
                    st.write = None;
                    st.msn = psn_add(st.msn, 1);
                    self.ack(st.msn);
                    Ok(Disposition::Acked)
                } else {
                    st.write = Some(WriteInProgress { va: w.va + plen, remaining: w.remaining - plen, ..w });
                    Ok(self.ack_if_requested(st.msn))
                }
            }
            opcode::RC_RDMA_READ_REQUEST => {
                self.require_qp_access(ACCESS_REMOTE_READ)?;
                let reth = self.pkt.reth.ok_or(Fault::InvalidRequest)?;
                if !payload.is_empty() {
                    return Err(Fault::InvalidRequest);
                }
                let segs = self.resolve(&reth, ACCESS_REMOTE_READ)?;
                // MSN counts the READ as soon as it is accepted (IBTA C9-148, rxe `execute`).
                st.msn = psn_add(st.msn, 1);
                let packets = read_packets(reth.dma_len, mtu);
                let psn = self.pkt.bth.psn;
                self.read_responses(&segs, u64::from(reth.dma_len), psn, st.msn, mtu)?;
                self.epsn = psn_add(psn, packets);
                if st.reads.len() == READ_HISTORY {
                    st.reads.pop_front();
                }
                st.reads.push_back(ReadRecord { first_psn: psn, packets, msn: st.msn });
                Ok(Disposition::ReadResponse { packets })
            }
            // SEND, WRITE with immediate and atomics need a receive queue or atomics support the model does not
            // have; IBTA lists unsupported opcodes under NAK invalid request.
            _ => Err(Fault::InvalidRequest),
        }
    }

    /// A duplicate request (PSN behind the expected one): IBTA 9.7.5.1.6 / rxe `duplicate_request`.
    fn duplicate(&mut self, st: &mut RespState) -> Disposition {
        let op = self.pkt.bth.opcode;
        match op {
            opcode::RC_RDMA_READ_REQUEST => {
                let psn = self.pkt.bth.psn;
                let Some(rec) = st.reads.iter().rev().find(|r| {
                    let d = psn_diff(psn, r.first_psn);
                    d >= 0 && (d as u32) < r.packets
                }) else {
                    return Disposition::DroppedSequence;
                };
                let rec = *rec;
                let Some(reth) = self.pkt.reth else { return Disposition::Malformed };
                let mtu = u64::from(self.qp.mtu.clamp(256, 4096));
                // Re-executed against the keys as they are now (the requester may have shortened the RETH to
                // resume mid-READ); a key that went away meanwhile gets the NAK a new request would get.
                let segs = match self.resolve(&reth, ACCESS_REMOTE_READ) {
                    Ok(s) => s,
                    Err(_) => {
                        self.reply_aeth(
                            opcode::RC_ACKNOWLEDGE,
                            psn,
                            Aeth::nak(NakCode::RemoteAccessError, st.msn),
                            &[],
                        );
                        self.tables.qp_error(self.qp.qpn, QpEvent::WqAccessError);
                        return Disposition::Nak(NakCode::RemoteAccessError);
                    }
                };
                if self.read_responses(&segs, u64::from(reth.dma_len), psn, rec.msn, mtu).is_err() {
                    return Disposition::Nak(NakCode::RemoteOperationalError);
                }
                Disposition::DuplicateReadResponse { packets: read_packets(reth.dma_len, mtu) }
            }
            opcode::RC_RDMA_WRITE_FIRST
            | opcode::RC_RDMA_WRITE_MIDDLE
            | opcode::RC_RDMA_WRITE_LAST
            | opcode::RC_RDMA_WRITE_ONLY => {
                // Already executed: acknowledge everything up to the last accepted PSN, change nothing.
                self.reply_aeth(opcode::RC_ACKNOWLEDGE, psn_add(self.epsn, PSN_MASK), Aeth::ack(st.msn), &[]);
                Disposition::DuplicateAcked
            }
            _ => Disposition::DroppedSequence,
        }
    }

    fn require_qp_access(&self, bit: u8) -> Result<(), Fault> {
        // rxe `check_op_valid`: an RDMA operation the QP does not enable is an invalid request.
        if self.qp.access & bit == 0 { Err(Fault::InvalidRequest) } else { Ok(()) }
    }

    /// R_Key checks (IBTA C9-88..C9-90 / rxe `check_rkey`) and translation of `[va, va + len)` to device
    /// address segments. A zero-length request names no memory and is not checked.
    fn resolve(&self, reth: &Reth, need: u8) -> Result<Vec<(u64, usize)>, Fault> {
        if reth.dma_len == 0 {
            return Ok(Vec::new());
        }
        self.resolve_span(reth.rkey, reth.va, u64::from(reth.dma_len), need)
    }

    fn resolve_span(&self, rkey: u32, va: u64, len: u64, need: u8) -> Result<Vec<(u64, usize)>, Fault> {
        let mkey = self.tables.mkey(rkey >> 8).ok_or(Fault::RemoteAccess)?;
        if mkey.key != rkey || mkey.pd != self.qp.pd || mkey.access & need != need {
            return Err(Fault::RemoteAccess);
        }
        let end = va.checked_add(len).ok_or(Fault::RemoteAccess)?;
        let mend = mkey.start.checked_add(mkey.len).ok_or(Fault::RemoteAccess)?;
        if va < mkey.start || end > mend {
            return Err(Fault::RemoteAccess);
        }
        translate(&mkey, va, len).ok_or(Fault::RemoteOperational)
    }

    fn write(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), Fault> {
        if data.is_empty() {
            return Ok(());
        }
        let segs = self.resolve_span(rkey, va, data.len() as u64, ACCESS_REMOTE_WRITE)?;
        let mut at = 0;
        for (addr, n) in segs {
            self.tables.ram().write(addr, &data[at..at + n]).map_err(|_| Fault::RemoteOperational)?;
            at += n;
        }
        Ok(())
    }

    fn read_responses(&mut self, segs: &[(u64, usize)], total: u64, psn: u32, msn: u32, mtu: u64) -> Result<(), Fault> {
        let mut data = Vec::with_capacity(total as usize);
        for &(addr, n) in segs {
            let at = data.len();
            data.resize(at + n, 0);
            self.tables.ram().read(addr, &mut data[at..]).map_err(|_| Fault::RemoteOperational)?;
        }
        let packets = read_packets(total as u32, mtu);
        for i in 0..packets {
            let lo = (u64::from(i) * mtu).min(total) as usize;
            let hi = (u64::from(i + 1) * mtu).min(total) as usize;
            let op = match (packets, i) {
                (1, _) => opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (_, 0) => opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (n, i) if i + 1 == n => opcode::RC_RDMA_READ_RESPONSE_LAST,
                _ => opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            };
            let p = psn_add(psn, i);
            if op == opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                self.reply(op, p, &[], &data[lo..hi]);
            } else {
                self.reply_aeth(op, p, Aeth::ack(msn), &data[lo..hi]);
            }
        }
        Ok(())
    }

    fn ack(&mut self, msn: u32) {
        self.reply_aeth(opcode::RC_ACKNOWLEDGE, self.pkt.bth.psn, Aeth::ack(msn), &[]);
    }

    fn ack_if_requested(&mut self, msn: u32) -> Disposition {
        if self.pkt.bth.ack_req {
            self.ack(msn);
            Disposition::Acked
        } else {
            Disposition::Accepted
        }
    }

    fn reply_aeth(&mut self, op: u8, psn: u32, aeth: Aeth, payload: &[u8]) {
        self.reply(op, psn, &aeth.to_bytes(), payload);
    }

    fn reply(&mut self, op: u8, psn: u32, ext: &[u8], payload: &[u8]) {
        let Some(path) = self.qp.path else { return };
        let bth = Bth {
            opcode: op,
            se: false,
            mig: false,
            pad_cnt: 0,
            tver: 0,
            pkey: wire::DEFAULT_PKEY,
            resv8a: 0,
            dest_qp: self.qp.remote_qpn,
            ack_req: false,
            psn,
        };
        (self.send)(wire::build_with(&path.endpoints, path.tos, path.ttl, &bth, ext, payload));
    }
}

/// Response packets of a READ of `len` bytes: one per MTU, at least one.
pub fn read_packets(len: u32, mtu: u64) -> u32 {
    (u64::from(len).div_ceil(mtu)).max(1) as u32
}

/// Splits `[va, va + len)` of `mkey` (already bounds-checked) into device-address segments.
pub fn translate(mkey: &MkeyView, va: u64, len: u64) -> Option<Vec<(u64, usize)>> {
    let off = va.checked_sub(mkey.start)?;
    match &mkey.translation {
        Translation::Contiguous { base } => {
            base.checked_add(off)?.checked_add(len)?;
            Some(vec![(base + off, usize::try_from(len).ok()?)])
        }
        Translation::Pages { log_page_size, pages } => {
            let shift = u32::from(*log_page_size);
            if shift >= 64 {
                return None;
            }
            let page = 1u64 << shift;
            let mut pos = (mkey.start & (page - 1)).checked_add(off)?;
            let mut left = len;
            let mut out = Vec::new();
            while left > 0 {
                let idx = usize::try_from(pos >> shift).ok()?;
                let within = pos & (page - 1);
                let n = left.min(page - within);
                let base = *pages.get(idx)?;
                let addr = base.checked_add(within)?;
                match out.last_mut() {
                    Some((a, l)) if *a + *l as u64 == addr => *l += n as usize,
                    _ => out.push((addr, n as usize)),
                }
                pos += n;
                left -= n;
            }
            Some(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
    }

    #[test]
    fn page_list_translation_splits_and_merges() {
        let mkey = MkeyView {
            key: 0x100,
            pd: 1,
            start: 0x1_0800,
            len: 0x2000,
            access: ACCESS_REMOTE_READ,
            translation: Translation::Pages { log_page_size: 12, pages: vec![0x5000, 0x6000, 0x9000] },
        };
        // start is 0x800 into its page: va 0x1_0800 → 0x5800.
        assert_eq!(translate(&mkey, 0x1_0800, 0x10), Some(vec![(0x5800, 0x10)]));
        // Spans pages 0 and 1 (contiguous: merged) and 2 (not).
        assert_eq!(translate(&mkey, 0x1_0F00, 0x1200), Some(vec![(0x5F00, 0x1100), (0x9000, 0x100)]));
        // Past the page list.
        assert_eq!(translate(&mkey, 0x1_0800, 0x4000), None);
    }
}
