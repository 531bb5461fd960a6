//! The receive side: a frame from the wire → length checks → the NIC_RX root flow table (outer headers) → TIR →
//! RQ → the next posted receive WQE (data segments: `byte_count`, `lkey`, `addr`) → a receive CQE
//! (`mlx5_cqe64`: `byte_cnt`, `op_own` = RESP_SEND). RoCEv2 frames for the port are split off before this
//! ([`is_roce`]; the caller hands them to the RDMA responder).
//!
//! The RQ's posted WQEs are counted by dword 0 of its doorbell record (16 bits, WQEs), read when a frame
//! arrives: RQs have no doorbell register.

use crate::completion::write_cqe;
use crate::eth::frame::{self, ETH_P_8021Q, ETH_ZLEN, IPPROTO_TCP, IPPROTO_UDP};
use crate::eth::tx::{INLINE_SEG, cqe_body, cqe_op, syndrome};
use crate::eth::{DataSeg, Rq, TERMINATE_LKEY, WqState, translate_segment};
use crate::flow::{self, DEST_FLOW_TABLE, DEST_TIR, action, miss};
use crate::hca::Hca;
use crate::mem::Memory;

/// What became of a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written into a receive WQE of at least one RQ, with a CQE.
    Delivered,
    /// A RoCEv2 frame for the port: the RDMA responder takes it.
    Roce,
    Runt,
    Oversize,
    LinkDown,
    /// Bus Master Enable cleared (hosted rigs, `Model::set_bus_master`): the device writes nothing.
    NoBusMaster,
    NoRoot,
    SteeringDrop,
    /// Unicast to a MAC the function did not put in its vport's unicast list, behind the e-switch
    /// (`Port::eswitch_admits`): the e-switch forwards it elsewhere, the function never sees it.
    NotInUcList,
    RqNotReady,
    OutOfBuffer,
    /// Completed in error (bad lkey, frame larger than the WQE): RQ to ERR.
    Error,
}

/// Steering depth at most (tables chain only to deeper levels, so this only bounds a model bug).
const MAX_DEPTH: u32 = 16;

/// Whether `f` is RoCEv2 for this port: destination MAC = the port's, IPv4, UDP destination port 4791.
pub fn is_roce(hca: &Hca, f: &[u8]) -> bool {
    if f.get(..6) != Some(&hca.port.mac[..]) {
        return false;
    }
    let l = frame::layout(f);
    let dport = l.l4.and_then(|(at, _)| f.get(at + 2..at + 4)).map(|d| u16::from_be_bytes([d[0], d[1]]));
    l.ip_version == 4 && l.ip_protocol == IPPROTO_UDP && dport == Some(crate::roce::wire::ROCE_V2_UDP_DPORT)
}

/// What the MAC drops before anything else sees the frame (RoCE included): everything while the link is down,
/// runts, unicast the e-switch does not forward to this function, and frames longer than the port MTU allows. `None`: the frame goes on.
pub fn mac_filter(hca: &mut Hca, f: &[u8]) -> Option<RxOutcome> {
    let c = &mut hca.eth.counters;
    if hca.port.oper_status != crate::port::PORT_UP {
        c.rx_link_down += 1;
        return Some(RxOutcome::LinkDown);
    }
    if f.len() < ETH_ZLEN {
        c.rx_runt += 1;
        return Some(RxOutcome::Runt);
    }
    let mut dst = [0u8; 6];
    dst.copy_from_slice(&f[..6]);
    if !hca.port.eswitch_admits(dst) {
        c.rx_eswitch_drop += 1;
        return Some(RxOutcome::NotInUcList);
    }
    if f.len() > usize::from(hca.port.oper_mtu).saturating_sub(4) {
        c.rx_oversize += 1;
        return Some(RxOutcome::Oversize);
    }
    None
}

/// Receives one frame that passed [`mac_filter`] and is not RoCE.
pub fn receive(hca: &mut Hca, ram: &dyn Memory, f: &[u8]) -> RxOutcome {
    let c = &mut hca.eth.counters;
    let Some(&root) = hca.flow.roots.get(&flow::NIC_RX) else {
        c.rx_no_root += 1;
        return RxOutcome::NoRoot;
    };
    let m = frame::outer_headers(f);
    let mut rqns = Vec::new();
    if !steer(hca, &m, root, 0, &mut rqns) || rqns.is_empty() {
        hca.eth.counters.rx_steering_drop += 1;
        return RxOutcome::SteeringDrop;
    }
    rqns.sort_unstable();
    rqns.dedup();
    let mut outcome = RxOutcome::SteeringDrop;
    for rqn in rqns {
        let o = deliver(hca, ram, rqn, f);
        if outcome != RxOutcome::Delivered {
            outcome = o;
        }
    }
    outcome
}

/// Looks `m` (a frame's outer headers) up in NIC_RX table `id`: the first entry in flow-index order whose
/// group's criteria match. Collects the RQs of the TIRs it forwards to; false when the frame is dropped.
fn steer(hca: &Hca, m: &[u8], id: u32, depth: u32, rqns: &mut Vec<u32>) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let Some(t) = hca.flow.table(flow::NIC_RX, id) else { return false };
    let hit = t.entries.values().find(|e| {
        t.groups
            .get(&e.group_id)
            .is_some_and(|g| m.iter().zip(&g.match_criteria).zip(&e.match_value).all(|((&p, &c), &v)| p & c == v))
    });
    match hit {
        Some(e) if e.action & action::FWD_DEST != 0 => {
            let mut any = false;
            for &(dt, did) in &e.destinations {
                match dt {
                    DEST_TIR => {
                        if let Some(tir) = hca.eth.tirs.get(&did) {
                            rqns.push(tir.inline_rqn);
                            any = true;
                        }
                    }
                    DEST_FLOW_TABLE => any |= steer(hca, m, did, depth + 1, rqns),
                    _ => {}
                }
            }
            any
        }
        // DROP, or ALLOW (no destination in a NIC_RX table: nothing takes the frame).
        Some(_) => false,
        None if t.table_miss_action == miss::FORWARD_TO_TABLE => steer(hca, m, t.table_miss_id, depth + 1, rqns),
        None => false,
    }
}

/// `mlx5_cqe64.l4_l3_hdr_type`: L4 type bits 6:4 (TCP 1 no ACK / 3 ACK without data / 4 ACK and data, UDP 2),
/// L3 type bits 3:2 (IPv6 1, IPv4 2), bit 0 a stripped VLAN (`cqe_has_vlan`).
fn hdr_type(f: &[u8], vlan: bool) -> u8 {
    let l = frame::layout(f);
    let l3 = match l.ip_version {
        4 => 2,
        6 => 1,
        _ => 0,
    };
    let l4 = match (l.ip_protocol, l.l4) {
        (IPPROTO_UDP, Some(_)) => 2,
        (IPPROTO_TCP, Some((at, len))) => {
            let ack = f.get(at + 13).is_some_and(|fl| fl & 0x10 != 0);
            let data = l.l3.is_some_and(|(l3at, _)| {
                let total = f.get(l3at + 2..l3at + 4).map_or(0, |t| usize::from(u16::from_be_bytes([t[0], t[1]])));
                l.ip_version == 4 && l3at + total > at + len
            });
            match (ack, data) {
                (false, _) => 1,
                (true, false) => 3,
                (true, true) => 4,
            }
        }
        _ => 0,
    };
    (l4 << 4) | (l3 << 2) | u8::from(vlan)
}

/// Writes `f` into the next posted WQE of `rqn` and completes it.
fn deliver(hca: &mut Hca, ram: &dyn Memory, rqn: u32, f: &[u8]) -> RxOutcome {
    let Some(rq) = hca.eth.rqs.get(&rqn).cloned() else {
        hca.eth.counters.rx_steering_drop += 1;
        return RxOutcome::SteeringDrop;
    };
    if rq.state != WqState::Rdy {
        hca.eth.counters.rx_rq_not_ready += 1;
        return RxOutcome::RqNotReady;
    }
    let posted = rq.wq.doorbell(ram, 0).unwrap_or(rq.consumed);
    if posted == rq.consumed {
        hca.eth.counters.rx_out_of_buffer += 1;
        if let Some(q) = hca.eth.q_counters.get_mut(&rq.counter_set_id) {
            q.out_of_buffer = q.out_of_buffer.wrapping_add(1);
        }
        return RxOutcome::OutOfBuffer;
    }
    // VLAN stripping (vsd = 0): the outer C-VLAN tag goes into the CQE.
    let mut data = f.to_vec();
    let mut vlan = None;
    if !rq.vsd && data.len() >= 18 && u16::from_be_bytes([data[12], data[13]]) == ETH_P_8021Q {
        vlan = Some(u16::from_be_bytes([data[14], data[15]]));
        data.drain(12..16);
    }
    let counter = rq.consumed;
    match scatter(hca, ram, &rq, &data) {
        Ok(()) => {
            let mut body = cqe_body(cqe_op::RESP_SEND, 0, 0, rqn, counter, data.len() as u32);
            body[0x1d] = hdr_type(&data, vlan.is_some());
            if let Some(tci) = vlan {
                body[0x1e..0x20].copy_from_slice(&tci.to_be_bytes());
            }
            if let Some(r) = hca.eth.rqs.get_mut(&rqn) {
                r.consumed = counter.wrapping_add(1);
            }
            let c = &mut hca.eth.counters;
            c.rx_frames += 1;
            c.rx_bytes += data.len() as u64;
            write_cqe(hca, ram, rq.cqn, &body);
            RxOutcome::Delivered
        }
        Err(synd) => {
            hca.eth.counters.rx_errors += 1;
            if let Some(r) = hca.eth.rqs.get_mut(&rqn) {
                r.consumed = counter.wrapping_add(1);
                r.state = WqState::Err;
            }
            let body = cqe_body(cqe_op::RESP_ERR, synd, 0, rqn, counter, 0);
            write_cqe(hca, ram, rq.cqn, &body);
            flush_rq(hca, ram, rqn);
            RxOutcome::Error
        }
    }
}

/// Scatters `data` over the data segments of the WQE at the RQ's consumer counter.
fn scatter(hca: &Hca, ram: &dyn Memory, rq: &Rq, data: &[u8]) -> Result<(), u8> {
    let at = rq.wq.entry_addr(rq.consumed.into()).ok_or(syndrome::LOCAL_QP_OP_ERR)?;
    let mut wqe = vec![0u8; rq.wq.stride() as usize];
    ram.read(at, &mut wqe).map_err(|_| syndrome::LOCAL_QP_OP_ERR)?;
    let mut done = 0usize;
    for seg in wqe.chunks_exact(16).filter_map(DataSeg::parse) {
        if done == data.len() || (seg.lkey == TERMINATE_LKEY && seg.byte_count == 0) {
            break;
        }
        if seg.byte_count & INLINE_SEG != 0 {
            return Err(syndrome::LOCAL_QP_OP_ERR);
        }
        let pieces = translate_segment(hca, ram, rq.rlky, rq.wq.pd, &seg, true, (data.len() - done) as u64)
            .ok_or(syndrome::LOCAL_PROT_ERR)?;
        for (a, l) in pieces {
            let n = l as usize;
            ram.write(a, &data[done..done + n]).map_err(|_| syndrome::LOCAL_PROT_ERR)?;
            done += n;
        }
    }
    if done < data.len() { Err(syndrome::LOCAL_LENGTH_ERR) } else { Ok(()) }
}

/// Completes every posted WQE of an RQ in ERR with a flush error CQE (if `flush_in_error_en`).
pub fn flush_rq(hca: &mut Hca, ram: &dyn Memory, rqn: u32) {
    let Some(rq) = hca.eth.rqs.get(&rqn).cloned() else { return };
    if rq.state != WqState::Err || !rq.flush_in_error {
        return;
    }
    let Some(posted) = rq.wq.doorbell(ram, 0) else { return };
    let mut consumed = rq.consumed;
    let pending = u32::from(posted.wrapping_sub(consumed)).min(rq.wq.entries());
    for _ in 0..pending {
        let body = cqe_body(cqe_op::RESP_ERR, syndrome::WR_FLUSH_ERR, 0, rqn, consumed, 0);
        if write_cqe(hca, ram, rq.cqn, &body) != crate::cq::CqeWrite::Written {
            break;
        }
        consumed = consumed.wrapping_add(1);
    }
    if let Some(r) = hca.eth.rqs.get_mut(&rqn) {
        r.consumed = consumed;
    }
}
