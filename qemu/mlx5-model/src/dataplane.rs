//! The responder's view of the model: [`HcaTables`] implements `roce::responder::Tables` over the HCA's QP
//! table (`qp::QpTable`) and MKEY table, and [`poll_udp`] moves frames between a `roce::udp::UdpResponder` and
//! the responder in the model's polling loop without blocking.
//!
//! Responder class C errors move the QP to ERR, flush its receive queue (`crate::completion::flush_rq`) and
//! queue the async event (`QpTable::take_events`); [`poll_udp`] hands them to `Model::raise_qp_event` (EQs).

use std::io;
use std::sync::Arc;

use crate::Model;
use crate::hca::Hca;
use crate::ifc;
use crate::mem::Memory;
use crate::mkey::{AccessMode, MkeyInfo};
use crate::qp::qpc;
use crate::roce::responder::{
    ACCESS_LOCAL_READ, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, MkeyView,
    QpEvent, QpView, RespState, Tables, Translation,
};
use crate::roce::udp::UdpResponder;

/// Frames handled per [`poll_udp`] call at most, so commands are not starved by a flood.
pub const MAX_FRAMES_PER_POLL: usize = 64;

/// The HCA's tables as the responder sees them.
pub struct HcaTables<'a> {
    pub hca: &'a mut Hca,
    pub ram: Arc<dyn Memory>,
}

impl<'a> HcaTables<'a> {
    pub fn new(model: &'a mut Model) -> HcaTables<'a> {
        let ram = model.ram().clone();
        HcaTables { hca: model.hca_mut(), ram }
    }
}

/// An MKEY as the responder checks it. A `free` key grants nothing; an MTT page of the key's range without
/// `rd_en` / `wr_en` withdraws remote read / write from the whole key (the model does not check per page).
pub fn mkey_view(m: &MkeyInfo) -> MkeyView {
    let mut access = 0;
    if !m.free {
        for (on, bit) in [
            (m.access.remote_atomic, ACCESS_REMOTE_ATOMIC),
            (m.access.remote_write && m.covered().iter().all(|p| p.write), ACCESS_REMOTE_WRITE),
            (m.access.remote_read && m.covered().iter().all(|p| p.read), ACCESS_REMOTE_READ),
            (m.access.local_write, ACCESS_LOCAL_WRITE),
            (m.access.local_read, ACCESS_LOCAL_READ),
        ] {
            if on {
                access |= bit;
            }
        }
    }
    let len = if m.length64 { u64::MAX - m.start_addr } else { m.len };
    let translation = match m.access_mode {
        AccessMode::Pa => Translation::Contiguous { base: m.start_addr },
        AccessMode::Mtt => {
            Translation::Pages { log_page_size: m.log_page_size, pages: m.mtt.iter().map(|p| p.addr).collect() }
        }
    };
    MkeyView { key: m.key, pd: m.pd, start: m.start_addr, len, access, translation }
}

impl Tables for HcaTables<'_> {
    fn accepts(&self, eth_dst: [u8; 6], ip_dst: [u8; 4]) -> bool {
        self.hca.bus_master && self.hca.port.takes_roce(eth_dst, ip_dst)
    }

    fn qp(&self, qpn: u32) -> Option<QpView> {
        // A REG_UMR QP has no transport: RoCE requests naming it find no QP.
        self.hca
            .qps
            .get(qpn)
            .filter(|q| !q.is_umr())
            .map(|q| QpView { path: q.reply_path(&self.hca.port.roce_addrs), ..q.view() })
    }

    fn resp_state(&mut self, qpn: u32) -> Option<&mut RespState> {
        self.hca.qps.get_mut(qpn).map(|q| &mut q.resp)
    }

    fn mkey(&self, index: u32) -> Option<MkeyView> {
        self.hca.mkeys.get(&index).map(mkey_view)
    }

    fn set_qp_psn(&mut self, qpn: u32, next_expected: u32) {
        if let Some(q) = self.hca.qps.get_mut(qpn) {
            ifc::set(&mut q.qpc, qpc::NEXT_RCV_PSN, next_expected);
        }
    }

    fn qp_error(&mut self, qpn: u32, event: QpEvent) {
        self.hca.qps.to_error(qpn, event as u8);
        // The QP is in ERR: its posted receive WQEs complete with flush errors.
        crate::completion::flush_rq(self.hca, self.ram.as_ref(), qpn);
    }

    fn ram(&self) -> &dyn Memory {
        self.ram.as_ref()
    }
}

/// Moves frames between the port and its Ethernet wire: sends what the SQs transmitted, then handles up to
/// [`MAX_FRAMES_PER_POLL`] received frames (`Model::eth_receive`; RoCE replies go back on the same wire).
/// Returns how many frames moved.
pub fn poll_eth(model: &mut Model, wire: &mut crate::eth::wire::EthWire) -> io::Result<usize> {
    let out = model.take_eth_frames();
    let mut n = out.len();
    for f in &out {
        wire.send(f)?;
    }
    for _ in 0..MAX_FRAMES_PER_POLL {
        let Some(frame) = wire.recv()?.map(<[u8]>::to_vec) else { break };
        let mut replies = Vec::new();
        model.eth_receive(&frame, &mut |r| replies.push(r));
        for r in &replies {
            wire.send(r)?;
        }
        n += 1;
    }
    Ok(n)
}

/// Handles the datagrams waiting on `udp` (at most [`MAX_FRAMES_PER_POLL`]); `udp` must be non-blocking
/// ([`UdpResponder::set_nonblocking`]). Returns how many were handled. ICMP-induced receive errors
/// (connection refused / reset from an earlier reply) are skipped.
pub fn poll_udp(model: &mut Model, udp: &mut UdpResponder) -> io::Result<usize> {
    let mut n = 0;
    while n < MAX_FRAMES_PER_POLL {
        let mut t = HcaTables::new(model);
        match udp.poll(&mut t) {
            Ok(Some(_)) => n += 1,
            Ok(None) => break,
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset) => n += 1,
            Err(e) => return Err(e),
        }
    }
    // Class C errors queued by `qp_error` go to the EQs subscribed to QP events.
    for e in model.hca_mut().qps.take_events() {
        model.raise_qp_event(e.qpn, e.event_type);
    }
    Ok(n)
}
