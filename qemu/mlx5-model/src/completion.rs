//! The one CQE path of the modelled dataplane: flushing a QP's receive queue when the QP enters ERR, and the
//! events around CQEs — the completion EQE (`MLX5_EVENT_TYPE_COMP` 0x0, `mlx5_eqe_comp.cqn`) of an armed CQ,
//! and CQ_ERROR (syndrome 1) on an overrun.
//!
//! The responder consumes no RQ WQE (RDMA WRITE and READ take none), so every WQE the driver posted (the RQ
//! doorbell record counter, dword 0 of `qpc.dbr_addr`, 16 bits; docs/reference/mlx5.md §f.3) beyond those the model
//! completed ([`crate::qp::Qp::rq_consumed`]) is outstanding. When the QP moves to ERR each of them completes, in
//! order, with a flush error CQE (opcode RESP_ERR 0xE, syndrome WR_FLUSH_ERR 0x05, the QPN, `wqe_counter` = the
//! WQE's index counter; with CQE version 1 also the QP's `user_index` in `srqn_uidx`) in the QP's receive CQ
//! (`cqn_rcv`), as the PRM defines for a QP in error.

use crate::cq::{self, CQ_ERROR_OVERRUN, CqeWrite};
use crate::eq::{self, event_type};
use crate::hca::Hca;
use crate::mem::Memory;
use crate::qp::{RQ_REGULAR, qpc};

/// `mlx5_eqe_comp` (`device.h`): the CQN (be32, 24 bits) at byte 0x18 of the event data.
pub fn completion_data(cqn: u32) -> [u8; 28] {
    let mut d = [0u8; 28];
    d[0x18..0x1c].copy_from_slice(&(cqn & 0xff_ffff).to_be_bytes());
    d
}

/// Writes `body` into CQ `cqn`; an armed CQ then gets one completion EQE on its EQ (`c_eqn`; completion EQEs
/// go there whatever the EQ's `event_bitmask`, as Linux's completion EQs subscribe to nothing) and is
/// disarmed. An overrun puts the CQ in error and raises CQ_ERROR (syndrome 1) on the EQs subscribed to it.
pub fn write_cqe(hca: &mut Hca, ram: &dyn Memory, cqn: u32, body: &[u8; cq::cqe::SIZE]) -> CqeWrite {
    let Some(c) = hca.cqs.cqs.get_mut(&cqn) else { return CqeWrite::Dropped };
    let r = c.write_cqe(ram, body);
    match r {
        CqeWrite::Written if c.armed => {
            c.armed = false;
            let eqn = c.c_eqn;
            if let Some(q) = hca.eqs.eqs.get_mut(&eqn) {
                q.post(ram, event_type::COMPLETION, 0, &completion_data(cqn));
            }
        }
        CqeWrite::Overrun => {
            hca.eqs.raise(ram, event_type::CQ_ERROR, 0, &eq::cq_error_data(cqn, CQ_ERROR_OVERRUN));
        }
        _ => {}
    }
    r
}

/// An arm request for `cqn` (from the UAR CQ doorbell): if CQEs are already there that software has not
/// consumed (by its doorbell record), the completion EQE is raised at once and the CQ disarmed, as an arm
/// covers every CQE past the consumer index it carries.
pub fn armed(hca: &mut Hca, ram: &dyn Memory, cqn: u32) {
    let Some(c) = hca.cqs.cqs.get_mut(&cqn) else { return };
    if !c.armed || c.outstanding(ram) == 0 {
        return;
    }
    c.armed = false;
    let eqn = c.c_eqn;
    if let Some(q) = hca.eqs.eqs.get_mut(&eqn) {
        q.post(ram, event_type::COMPLETION, 0, &completion_data(cqn));
    }
}

/// Reads the UAR CQ doorbells and acts on the arm requests found; true when one was found.
pub fn poll_cq_doorbells(hca: &mut Hca, bar: &dyn Memory, ram: &dyn Memory) -> bool {
    let cqns = hca.cqs.poll_doorbells(bar);
    for &cqn in &cqns {
        armed(hca, ram, cqn);
    }
    !cqns.is_empty()
}

/// Flushes the receive queue of `qpn` if it is in ERR: one flush error CQE per outstanding RQ WQE, stopping
/// at a CQE that cannot be written (overrun or a CQ in error; those WQEs stay outstanding). Returns the
/// number of CQEs written.
pub fn flush_rq(hca: &mut Hca, ram: &dyn Memory, qpn: u32) -> u32 {
    let Some(q) = hca.qps.get(qpn) else { return 0 };
    if q.state != crate::roce::responder::QpState::Err || q.get(qpc::RQ_TYPE) != RQ_REGULAR {
        return 0;
    }
    let dbr = crate::ifc::get64(&q.qpc, qpc::DBR_ADDR);
    let Ok(posted) = ram.read_be32(dbr) else { return 0 };
    let size = 1u32 << q.get(qpc::LOG_RQ_SIZE);
    // A counter more than a ring ahead is a driver bug; at most one ring of WQEs can be posted.
    let pending = (posted.wrapping_sub(q.rq_consumed) & 0xffff).min(size);
    let cqn = q.get(qpc::CQN_RCV);
    let mut written = 0;
    for _ in 0..pending {
        let Some(q) = hca.qps.get(qpn) else { break };
        let counter = q.rq_consumed as u16;
        let mut body = cq::error_cqe(cq::opcode::RESP_ERR, cq::syndrome::WR_FLUSH_ERR, qpn, counter);
        // CQE version 1: the QP's `user_index` in `srqn_uidx` (bits 23:0).
        if hca.caps.general(crate::caps::cmd_hca_cap::CQE_VERSION) == 1 {
            let uidx = q.get(qpc::USER_INDEX) & 0xff_ffff;
            body[cq::cqe::SRQN..cq::cqe::SRQN + 4].copy_from_slice(&uidx.to_be_bytes());
        }
        if write_cqe(hca, ram, cqn, &body) != CqeWrite::Written {
            break;
        }
        if let Some(q) = hca.qps.get_mut(qpn) {
            q.rq_consumed = q.rq_consumed.wrapping_add(1) & 0xffff;
        }
        written += 1;
    }
    written
}
