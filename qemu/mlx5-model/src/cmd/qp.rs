//! CREATE_QP, QUERY_QP, DESTROY_QP and the RC state transitions RST2INIT_QP, INIT2RTR_QP, RTR2RTS_QP,
//! RTS2RTS_QP, 2ERR_QP, 2RST_QP (`mlx5_ifc.h` `create_qp_in/out`, `query_qp_in/out`, `destroy_qp_in`,
//! `rst2init_qp_in`, `init2rtr_qp_in`, `rtr2rts_qp_in`, `rts2rts_qp_in`, `qp_2err_in`, `qp_2rst_in`, `qpc`,
//! `ads`; docs/reference/mlx5.md §e.5). Which fields each transition takes follows Linux `__mlx5_ib_modify_qp`
//! (`infiniband/hw/mlx5/qp.c`) and its `opt_mask` table; a command from the wrong state is `BAD_QP_STATE`.

use super::{CmdError, CmdResult, Ctx, need_initialized, reason, status};
use crate::hca::Hca;
use crate::ifc::{self, Field};
use crate::pages::PAGE_SIZE;
use crate::qp::{
    PM_MIGRATED, Qp, RQ_REGULAR, RQ_ZERO_LEN, ST_RC, ST_REG_UMR, SqProgress, Transition, ads, optpar, qpc, state_code,
};
use crate::roce::responder::{QpState, RespState};

/// `create_qp_in` (0x110 bytes before `pas`) and the `*2*_qp_in` structures (also 0x110).
const QP_IN_SIZE: usize = 0x110;
/// `qpc` at byte 0x18 of `create_qp_in`, the modify inputs and `query_qp_out`.
const QPC: u32 = 0x18;
const QPC_EXT: Field = Field::new(0x40, 1);
/// `create_qp_in.input_qpn`; `*_qp_in.qpn`; `create_qp_out.qpn`.
const QPN: Field = Field::new(0x48, 24);
const OPT_PARAM_MASK: Field = Field::new(0x80, 32);
const ECE: Field = Field::new(0xa0, 32);
const WQ_UMEM_ID: Field = Field::new(0x840, 32);
const WQ_UMEM_VALID: Field = Field::new(0x860, 1);
const WQ_UMEM_OFFSET: usize = 0x100;
const PAS: usize = 0x110;
/// `query_qp_out`: fixed part up to the `pas` union.
const QUERY_QP_OUT_FIXED: usize = 0x110;

/// `cmd_hca_cap.log_max_qp_sz` and `log_max_msg` (`mlx5_ifc.h`).
const LOG_MAX_QP_SZ: Field = Field::new(0x88, 8);
const LOG_MAX_MSG: Field = Field::new(0x1c3, 5);
/// `cmd_hca_cap.log_max_ra_req_qp` / `log_max_ra_res_qp`: the most RDMA READs/atomics a QP may have in flight
/// as requester (`qpc.log_sra_max`) and as responder (`qpc.log_rra_max`).
const LOG_MAX_RA_REQ_QP: Field = Field::new(0x14a, 6);
const LOG_MAX_RA_RES_QP: Field = Field::new(0x15a, 6);
/// `cmd_hca_cap.atomic`: the atomic capability block is present and atomics are supported.
const CAP_ATOMIC: Field = Field::new(0x21e, 1);
/// `roce_cap.r_roce_max_src_udp_port` / `r_roce_min_src_udp_port`: the UDP source ports firmware sends from.
const R_ROCE_MAX_SRC_UDP_PORT: Field = Field::new(0xc0, 16);
const R_ROCE_MIN_SRC_UDP_PORT: Field = Field::new(0xd0, 16);
/// Largest WQ buffer page the model accepts (`qpc.log_page_size` is log2(page / 4 KiB)): 1 GiB.
const MAX_LOG_PAGE_SIZE: u32 = 18;
/// The model has one port (`vhca_port_num` is 1-based) and one P_Key (index 0).
const PORT: u32 = 1;

fn qpc_get(c: &Ctx, f: Field) -> u32 {
    c.get(f.at(QPC))
}

fn path_get(c: &Ctx, f: Field) -> u32 {
    c.get(f.at(qpc::PRIMARY_ADDRESS_PATH).at(QPC))
}

fn bad(c: &Ctx, why: u16) -> CmdError {
    c.err(status::BAD_PARAM, why)
}

pub fn create_qp(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(QP_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(QPC as usize, &[QPC_EXT, QPN, OPT_PARAM_MASK, ECE])?;
    need_initialized(hca, c)?;
    // Not modelled: the extended context, a driver-chosen QPN, ECE, user memory (DEVX).
    if c.get(QPC_EXT) != 0
        || c.get(QPN) != 0
        || c.get(ECE) != 0
        || c.get(WQ_UMEM_VALID) != 0
        || c.get(WQ_UMEM_ID) != 0
        || ifc::get64(c.input, WQ_UMEM_OFFSET) != 0
        || qpc_get(c, qpc::DBR_UMEM_VALID) != 0
    {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    // No transition takes place at creation, so no optional parameter can apply.
    if c.get(OPT_PARAM_MASK) != 0 {
        return Err(bad(c, reason::QP_BAD_OPT_PARAM));
    }
    if qpc_get(c, qpc::STATE) != 0 {
        return Err(bad(c, reason::QP_BAD_FIELD));
    }
    // RC (the responder's QPs) and REG_UMR (`crate::umr`); other service types are not modelled.
    let umr = match qpc_get(c, qpc::ST) {
        ST_RC => false,
        ST_REG_UMR => true,
        _ => return Err(bad(c, reason::UNSUPPORTED_FEATURE)),
    };
    if qpc_get(c, qpc::PM_STATE) != PM_MIGRATED {
        return Err(bad(c, reason::QP_BAD_FIELD));
    }
    if qpc_get(c, qpc::OFFLOAD_TYPE) != 0
        || qpc_get(c, qpc::CD_MASTER) != 0
        || qpc_get(c, qpc::CD_SLAVE_SEND) != 0
        || qpc_get(c, qpc::CD_SLAVE_RECEIVE) != 0
    {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    // Linux creates its UMR QP without a PD (`qpc.pd` 0) and names the PD on every modify
    // (docs/hca-model.md, "UMR").
    let pd = qpc_get(c, qpc::PD);
    let pd_ok = hca.pds.contains(&pd) || (umr && pd == 0);
    if !pd_ok {
        return Err(bad(c, reason::BAD_PD));
    }
    if !hca.uars.contains(&qpc_get(c, qpc::UAR_PAGE)) {
        return Err(bad(c, reason::QP_BAD_UAR));
    }
    // Both CQs must exist (Linux sets both for every RC QP); an unknown handle is BAD_PARAM, as for the PD. A
    // REG_UMR QP has no receive side: its `cqn_rcv` may be 0.
    for f in [qpc::CQN_SND, qpc::CQN_RCV] {
        let cqn = qpc_get(c, f);
        let cq_ok = hca.cqs.cqs.contains_key(&cqn) || (umr && f == qpc::CQN_RCV && cqn == 0);
        if !cq_ok {
            return Err(bad(c, reason::QP_BAD_CQ));
        }
    }
    // A REG_UMR QP is a send queue: `no_sq` 0 and a zero-length RQ (Linux `get_rx_type` for a QP without
    // receive WQEs).
    if umr && (qpc_get(c, qpc::NO_SQ) == 1 || qpc_get(c, qpc::RQ_TYPE) != RQ_ZERO_LEN) {
        return Err(bad(c, reason::QP_BAD_SIZE));
    }
    // The clock the QP stamps with must be one the caps offer (Linux `get_qp_ts_format`; firmware refuses
    // others with BAD_PARAM).
    if !crate::caps::ts_format_offered(hca.caps.qp_ts_format_cap(), qpc_get(c, qpc::TS_FORMAT)) {
        return Err(bad(c, reason::QP_BAD_TS_FORMAT));
    }
    // CQE version 1 carries `user_index` in every CQE: it must be the kernel consumer's (Linux gives
    // MLX5_IB_DEFAULT_UIDX); with version 0 the field is unused and must stay 0 (stricter than known).
    if qpc_get(c, qpc::USER_INDEX) != hca.caps.qp_user_index() {
        return Err(bad(c, reason::QP_BAD_USER_INDEX));
    }
    let max_sz = hca.caps.general(LOG_MAX_QP_SZ);
    let log_max_msg = hca.caps.general(LOG_MAX_MSG);
    if qpc_get(c, qpc::LOG_MSG_MAX) > log_max_msg {
        return Err(bad(c, reason::QP_BAD_SIZE));
    }
    let sq_bytes = if qpc_get(c, qpc::NO_SQ) == 1 {
        if qpc_get(c, qpc::LOG_SQ_SIZE) != 0 {
            return Err(bad(c, reason::QP_BAD_SIZE));
        }
        0
    } else {
        let log = qpc_get(c, qpc::LOG_SQ_SIZE);
        if log > max_sz {
            return Err(bad(c, reason::QP_BAD_SIZE));
        }
        // SQ WQE basic blocks are 64 bytes (`qp.h` `MLX5_SEND_WQE_BB`).
        64u64 << log
    };
    let rq_bytes = match qpc_get(c, qpc::RQ_TYPE) {
        RQ_REGULAR => {
            let log = qpc_get(c, qpc::LOG_RQ_SIZE);
            if log > max_sz {
                return Err(bad(c, reason::QP_BAD_SIZE));
            }
            (1u64 << log) << (qpc_get(c, qpc::LOG_RQ_STRIDE) + 4)
        }
        RQ_ZERO_LEN => {
            if qpc_get(c, qpc::LOG_RQ_SIZE) != 0 || qpc_get(c, qpc::LOG_RQ_STRIDE) != 0 {
                return Err(bad(c, reason::QP_BAD_SIZE));
            }
            0
        }
        // SRQ-attached receive queues are not modelled.
        _ => return Err(bad(c, reason::UNSUPPORTED_FEATURE)),
    };
    let dbr = ifc::get64(c.input, QPC as usize + qpc::DBR_ADDR);
    if !dbr.is_multiple_of(8) || !c.ram.holds(dbr, 8) {
        return Err(bad(c, reason::QP_BAD_DBR));
    }
    let log_page = qpc_get(c, qpc::LOG_PAGE_SIZE);
    if log_page > MAX_LOG_PAGE_SIZE {
        return Err(bad(c, reason::BAD_PAGE_SIZE));
    }
    let page = PAGE_SIZE << log_page;
    let offset = u64::from(qpc_get(c, qpc::PAGE_OFFSET)) * 64;
    let bytes = sq_bytes + rq_bytes;
    let npas = if bytes == 0 { 0 } else { (offset + bytes).div_ceil(page) };
    if npas > u64::from(crate::cmdq::MAX_MSG_LEN) / 8 {
        return Err(bad(c, reason::TRANSLATIONS_SHORT));
    }
    c.need_input(PAS + 8 * npas as usize)?;
    let mut pas = Vec::with_capacity(npas as usize);
    for i in 0..npas as usize {
        let a = ifc::get64(c.input, PAS + 8 * i);
        if !a.is_multiple_of(page) {
            return Err(bad(c, reason::PAGE_MISALIGNED));
        }
        if !c.ram.holds(a, page) {
            return Err(bad(c, reason::TRANSLATION_OUTSIDE_RAM));
        }
        pas.push(a);
    }
    let mut out = c.output(0x10)?;
    let hi = 1u32 << hca.caps.general(crate::caps::cmd_hca_cap::LOG_MAX_QP).min(24);
    let Some(qpn) = hca.qps.free_qpn(hi) else { return Err(c.err(status::NO_RES, reason::TABLE_FULL)) };
    let mut ctx = c.input[QPC as usize..QPC as usize + qpc::SIZE].to_vec();
    ifc::set(&mut ctx, qpc::STATE, 0);
    let q = Qp {
        qpn,
        state: QpState::Reset,
        qpc: ctx,
        pas,
        resp: RespState::default(),
        rq_consumed: 0,
        sq: SqProgress::default(),
    };
    hca.qps.qps.insert(qpn, q);
    if umr {
        hca.umr.qps.insert(qpn);
    }
    ifc::set(&mut out, QPN, qpn);
    Ok(out)
}

fn existing(hca: &Hca, c: &Ctx) -> Result<u32, CmdError> {
    let qpn = c.get(QPN);
    if !hca.qps.qps.contains_key(&qpn) {
        return Err(bad(c, reason::NO_SUCH_OBJECT));
    }
    Ok(qpn)
}

pub fn destroy_qp(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[QPN])?;
    need_initialized(hca, c)?;
    let qpn = existing(hca, c)?;
    let out = c.output(0x10)?;
    hca.qps.qps.remove(&qpn);
    hca.umr.forget(qpn);
    Ok(out)
}

pub fn query_qp(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[QPC_EXT, QPN])?;
    need_initialized(hca, c)?;
    if c.get(QPC_EXT) != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    let qpn = existing(hca, c)?;
    let mut out = c.output(QUERY_QP_OUT_FIXED)?;
    if let Some(q) = hca.qps.get(qpn) {
        let at = QPC as usize;
        out[at..at + qpc::SIZE].copy_from_slice(&q.qpc);
        ifc::set(&mut out, qpc::STATE.at(QPC), state_code(q.state));
        // As many `pas` entries as the driver's output holds.
        let room = c.output_length.saturating_sub(QUERY_QP_OUT_FIXED) / 8;
        for &a in q.pas.iter().take(room) {
            out.extend_from_slice(&a.to_be_bytes());
        }
    }
    Ok(out)
}

/// 2ERR_QP and 2RST_QP (16-byte inputs).
pub fn to_err_or_rst(hca: &mut Hca, c: &Ctx, t: Transition) -> CmdResult {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(0x10, &[QPN])?;
    need_initialized(hca, c)?;
    let qpn = existing(hca, c)?;
    let out = c.output(0x10)?;
    if let Some(q) = hca.qps.get_mut(qpn) {
        q.state = t.to();
        if t == Transition::ToRst {
            q.resp = RespState::default();
            q.rq_consumed = 0;
            // Linux zeroes both doorbell record counters on RESET; the send queue starts again at 0.
            q.sq = SqProgress::default();
        }
    }
    // Receive WQEs still posted complete with flush errors (2ERR from ERR flushes those posted since), and so
    // do the send WQEs of a UMR QP.
    if t == Transition::ToErr {
        crate::completion::flush_rq(hca, c.ram, qpn);
        crate::umr::flush(hca, c.ram, qpn);
    }
    Ok(out)
}

/// RST2INIT, INIT2RTR, RTR2RTS, RTS2RTS: the `qpc`-carrying transitions.
pub fn modify(hca: &mut Hca, c: &Ctx, t: Transition) -> CmdResult {
    c.need_input(QP_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    c.reserved_zero(QPC as usize, &[QPN, OPT_PARAM_MASK, ECE])?;
    need_initialized(hca, c)?;
    let qpn = existing(hca, c)?;
    let Some(q) = hca.qps.get(qpn) else { return Err(bad(c, reason::NO_SUCH_OBJECT)) };
    if !t.legal_from(q.state) {
        return Err(c.err(status::BAD_QP_STATE, reason::QP_WRONG_STATE));
    }
    let opt = c.get(OPT_PARAM_MASK);
    if opt & !t.allowed_optpar() != 0 {
        return Err(bad(c, reason::QP_BAD_OPT_PARAM));
    }
    if c.get(ECE) != 0 {
        return Err(bad(c, reason::UNSUPPORTED_FEATURE));
    }
    // Linux sends the creation fields again with every modify; they cannot change. Its UMR QP is the
    // exception it needs: created without a PD, it names the UMR PD on every modify (the QP takes the first one
    // named), and leaves `cqn_rcv` 0 (`get_cqs` gives a REG_UMR QP no receive CQ).
    let umr = q.is_umr();
    let pd = qpc_get(c, qpc::PD);
    let pd_ok = pd == q.pd() || (umr && q.pd() == 0 && hca.pds.contains(&pd));
    let rcv = qpc_get(c, qpc::CQN_RCV);
    let rcv_ok = rcv == q.get(qpc::CQN_RCV) || (umr && rcv == 0);
    if qpc_get(c, qpc::ST) != q.get(qpc::ST)
        || qpc_get(c, qpc::PM_STATE) != PM_MIGRATED
        || !pd_ok
        || qpc_get(c, qpc::CQN_SND) != q.get(qpc::CQN_SND)
        || !rcv_ok
    {
        return Err(bad(c, reason::QP_BAD_FIELD));
    }
    // The `qpc` fields the transition takes from the input.
    let mut take: Vec<Field> = Vec::new();
    let path = |f: Field| f.at(qpc::PRIMARY_ADDRESS_PATH);
    match t {
        Transition::Rst2Init => {
            if path_get(c, ads::PKEY_INDEX) != 0 || path_get(c, ads::VHCA_PORT_NUM) != PORT {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            // RST2INIT names every access bit (Linux sends `rre`/`rwe`/`rae` with `atomic_mode` at RST2INIT).
            take.push(qpc::ATOMIC_MODE);
            take.extend([qpc::RRE, qpc::RWE, qpc::RAE, qpc::COUNTER_SET_ID, qpc::RLKY]);
        }
        Transition::Init2Rtr if umr => {
            // No address path: Linux gives its UMR QP mtu 4096 and log_msg_max 12 and nothing else. A remote
            // address would be a QP of another kind.
            if !(1..=5).contains(&qpc_get(c, qpc::MTU)) {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            if qpc_get(c, qpc::LOG_MSG_MAX) > hca.caps.general(LOG_MAX_MSG) {
                return Err(bad(c, reason::QP_BAD_SIZE));
            }
            let rgid_at = (QPC + qpc::PRIMARY_ADDRESS_PATH) as usize + ads::RGID_RIP;
            if qpc_get(c, qpc::REMOTE_QPN) != 0
                || path_get(c, ads::RMAC_47_32) != 0
                || path_get(c, ads::RMAC_31_0) != 0
                || c.input[rgid_at..rgid_at + 16].iter().any(|&b| b != 0)
            {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            take.extend([qpc::MTU, qpc::LOG_MSG_MAX]);
        }
        Transition::Rtr2Rts if umr => {
            if qpc_get(c, qpc::LOG_SRA_MAX) > hca.caps.general(LOG_MAX_RA_REQ_QP) {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            take.extend([qpc::NEXT_SEND_PSN, qpc::LOG_SRA_MAX, qpc::LOG_ACK_REQ_FREQ]);
        }
        Transition::Init2Rtr => {
            if !(1..=5).contains(&qpc_get(c, qpc::MTU)) {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            if qpc_get(c, qpc::LOG_MSG_MAX) > hca.caps.general(LOG_MAX_MSG) {
                return Err(bad(c, reason::QP_BAD_SIZE));
            }
            // The path MTU fits the port (Linux `mlx5_query_port_roce`: `active_mtu` = `iboe_get_mtu`).
            if qpc_get(c, qpc::MTU) > hca.port.ib_mtu() {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            if qpc_get(c, qpc::LOG_RRA_MAX) > hca.caps.general(LOG_MAX_RA_RES_QP) {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            let mut rgid = [0u8; 16];
            let rgid_at = (QPC + qpc::PRIMARY_ADDRESS_PATH) as usize + ads::RGID_RIP;
            rgid.copy_from_slice(&c.input[rgid_at..rgid_at + 16]);
            if !sgid_fits(hca, path_get(c, ads::SRC_ADDR_INDEX), &rgid) {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            // The next hop's MAC: a unicast station (not zero, group bit clear).
            let rmac_hi = path_get(c, ads::RMAC_47_32);
            if rmac_hi == 0 && path_get(c, ads::RMAC_31_0) == 0 || rmac_hi & 0x0100 != 0 {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            let roce = hca.caps.block(crate::caps::cap_type::ROCE, true).unwrap_or(&[]);
            let (lo, hi) = if roce.is_empty() {
                (1, 0)
            } else {
                (ifc::get(roce, R_ROCE_MIN_SRC_UDP_PORT), ifc::get(roce, R_ROCE_MAX_SRC_UDP_PORT))
            };
            if !(lo..=hi).contains(&path_get(c, ads::UDP_SPORT)) {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            // RoCE: one port; no LID routing (IB only); the remote address must be given.
            let rgid_at = (QPC + qpc::PRIMARY_ADDRESS_PATH) as usize + ads::RGID_RIP;
            if path_get(c, ads::VHCA_PORT_NUM) != PORT
                || path_get(c, ads::RLID) != 0
                || path_get(c, ads::MLID) != 0
                || c.input[rgid_at..rgid_at + 16].iter().all(|&b| b == 0)
            {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            if opt & optpar::PKEY_INDEX != 0 && path_get(c, ads::PKEY_INDEX) != 0 {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            take.extend([
                qpc::MTU,
                qpc::LOG_MSG_MAX,
                qpc::REMOTE_QPN,
                qpc::LOG_RRA_MAX,
                qpc::MIN_RNR_NAK,
                qpc::NEXT_RCV_PSN,
                path(ads::FL),
                path(ads::GRH),
                path(ads::SRC_ADDR_INDEX),
                path(ads::STAT_RATE),
                path(ads::HOP_LIMIT),
                path(ads::TCLASS),
                path(ads::FLOW_LABEL),
                path(ads::F_DSCP),
                path(ads::F_ECN),
                path(ads::F_ETH_PRIO),
                path(ads::ECN),
                path(ads::DSCP),
                path(ads::UDP_SPORT),
                path(ads::DEI_CFI),
                path(ads::ETH_PRIO),
                path(ads::SL),
                path(ads::VHCA_PORT_NUM),
                path(ads::RMAC_47_32),
                path(ads::RMAC_31_0),
            ]);
            for i in 0..4 {
                take.push(Field::new(32 * i, 32).at(qpc::PRIMARY_ADDRESS_PATH + ads::RGID_RIP as u32));
            }
        }
        Transition::Rtr2Rts => {
            if qpc_get(c, qpc::LOG_SRA_MAX) > hca.caps.general(LOG_MAX_RA_REQ_QP) {
                return Err(bad(c, reason::QP_BAD_FIELD));
            }
            // The GID the QP sends from must still be there as INIT2RTR found it.
            let mut rgid = [0u8; 16];
            let at = qpc::PRIMARY_ADDRESS_PATH as usize + ads::RGID_RIP;
            rgid.copy_from_slice(&q.qpc[at..at + 16]);
            if !sgid_fits(hca, q.get(ads::SRC_ADDR_INDEX.at(qpc::PRIMARY_ADDRESS_PATH)), &rgid) {
                return Err(bad(c, reason::QP_BAD_PATH));
            }
            take.extend([
                path(ads::ACK_TIMEOUT),
                qpc::RETRY_COUNT,
                qpc::RNR_RETRY,
                qpc::NEXT_SEND_PSN,
                qpc::LOG_SRA_MAX,
                qpc::LOG_ACK_REQ_FREQ,
            ]);
        }
        Transition::Rts2Rts | Transition::ToErr | Transition::ToRst => {}
    }
    // Optional parameters apply only when their bit is set (PRM `opt_param_mask`).
    for (bit, f) in [(optpar::RRE, qpc::RRE), (optpar::RWE, qpc::RWE), (optpar::RAE, qpc::RAE)] {
        if opt & bit != 0 && !take.contains(&f) {
            take.push(f);
        }
    }
    // Remote atomics need an atomic mode (Linux `to_mlx5_access_flags`: `rae` only with `atomic_mode` from
    // `get_atomic_mode`) and the atomic capability.
    if take.contains(&qpc::RAE) && qpc_get(c, qpc::RAE) == 1 {
        if qpc_get(c, qpc::ATOMIC_MODE) == 0 || hca.caps.general(CAP_ATOMIC) == 0 {
            return Err(bad(c, reason::QP_BAD_FIELD));
        }
        if !take.contains(&qpc::ATOMIC_MODE) {
            take.push(qpc::ATOMIC_MODE);
        }
    }
    if opt & optpar::RNR_TIMEOUT != 0 {
        take.push(qpc::MIN_RNR_NAK);
    }
    if opt & optpar::LAG_TX_AFF != 0 {
        take.push(qpc::LAG_TX_PORT_AFFINITY);
    }
    let out = c.output(0x10)?;
    if let Some(q) = hca.qps.get_mut(qpn) {
        for f in take {
            ifc::set(&mut q.qpc, f, c.get(f.at(QPC)));
        }
        if umr {
            ifc::set(&mut q.qpc, qpc::PD, pd);
        }
        q.state = t.to();
    }
    Ok(out)
}

/// Does GID table entry `index` suit a path toward `rgid`? It must be written, RoCE version 2 (the only version
/// the model carries) and of the same L3 type as the remote address (Linux `mlx5_ib` takes `src_addr_index`
/// from the `sgid_attr` of the address handle, whose type matches the path; stricter than known for a mismatch).
fn sgid_fits(hca: &Hca, index: u32, rgid: &[u8; 16]) -> bool {
    let Some(e) = hca.port.roce_addrs.get(index as usize) else { return false };
    let l3 = if crate::port::gid_ipv4(rgid).is_some() {
        crate::port::ROCE_L3_TYPE_IPV4
    } else {
        crate::port::ROCE_L3_TYPE_IPV6
    };
    !e.is_empty() && e.version == crate::port::ROCE_VERSION_2 && e.l3_type == l3
}
