//! The port's objects (docs/mlx5-driver.md "The Ethernet port"): PD, transport domain, UAR, Q counter, the
//! lkey (reserved, or an MKEY per ring), TIS, the two CQs, SQ and RQ (RST → RDY), a direct TIR, and a NIC_RX
//! root flow table forwarding the port's MAC and broadcast to the TIR; the port brought up through PAOS and
//! PMTU. All built synchronously through [`Driver::exec`] before `into_engines`, and torn down in reverse.

use alloc::vec::Vec;

use super::port::{HW_MTU_OVERHEAD, port_admin_up, port_mtu, query_port_state, set_port_mtu};
use super::recovery::Maintenance;
use super::rx::{RQ_WQE_LEN, RxParts, RxRing};
use super::tx::{SEND_WQE_BB, TxParts, TxRing, wqebbs_per_slot};
use super::{BROADCAST, EthConfig, EthError, EthInfo, EthPort, EthStats, Lkey, LkeySource};
use crate::command::CmdError;
use crate::cq::DBR_LEN;
use crate::driver::Driver;
use crate::handles::{FlowGroupId, FlowIndex, FlowTableId, Mkey, Pdn, Tdn, UarPage};
use crate::ifc;
use crate::ifc::eth::{
    EthCaps, MLX5_CAP_INLINE_MODE_VPORT_CONTEXT, MLX5_INLINE_MODE_TCP_UDP, MLX5_WQ_STATE_RDY, MLX5_WQ_STATE_RST,
    MLX5_WQ_TYPE_CYCLIC, RqParams, SqParams, WqParams,
};
use crate::ifc::flow::FS_FT_NIC_RX;
use crate::ifc::init::{CapMode, MLX5_CAP_ETHERNET_OFFLOADS};
use crate::ifc::mkey::MkeyAccess;
use crate::objects::Cq;
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

/// `mkc.log_page_size` of the buffers' MKEYs: log2 of the page size in bytes (4 KiB pages).
const LOG_PAGE: u8 = PAGE_SIZE.trailing_zeros() as u8;
/// `wq.log_wq_stride` of the SQ: 64-byte basic blocks.
const LOG_SQ_STRIDE: u8 = 6;
const LOG_RQ_STRIDE: u8 = 4;

/// The port's objects (for teardown; each present once created).
#[derive(Default)]
pub(super) struct Objects {
    pd: Option<Pdn>,
    td: Option<Tdn>,
    uar: Option<UarPage>,
    tisn: Option<u32>,
    tx_cq: Option<Cq>,
    rx_cq: Option<Cq>,
    sqn: Option<u32>,
    rqn: Option<u32>,
    tirn: Option<u32>,
    mkeys: Vec<Mkey>,
    table: Option<FlowTableId>,
    group: Option<FlowGroupId>,
    ftes: Vec<FlowIndex>,
    root: bool,
    /// The Q counter the RQ counts into.
    q_counter: Option<u8>,
    /// DMA memory the queues use, freed once the queues are destroyed.
    dma: Vec<DmaBuf>,
}

impl Objects {
    /// Destroys everything in reverse; returns the first error. DMA memory is freed only when every queue that
    /// could reach it was destroyed (otherwise it is leaked on purpose).
    fn undo<P: Platform>(&mut self, d: &mut Driver<P>) -> Result<(), EthError> {
        let mut first: Option<EthError> = None;
        let mut note = |step: &'static str, r: Result<crate::command::Output, CmdError>| match r {
            Ok(_) => true,
            Err(error) => {
                if first.is_none() {
                    first = Some(EthError::Command { step, error });
                }
                false
            }
        };
        if self.root && note("SET_FLOW_TABLE_ROOT disconnect", d.exec(ifc::flow::clear_flow_table_root(FS_FT_NIC_RX))) {
            self.root = false;
        }
        if let Some(t) = self.table {
            while let Some(i) = self.ftes.pop() {
                note("DELETE_FLOW_TABLE_ENTRY", d.exec(ifc::flow::delete_fte(FS_FT_NIC_RX, t, i)));
            }
            if let Some(g) = self.group.take() {
                note("DESTROY_FLOW_GROUP", d.exec(ifc::flow::destroy_flow_group(FS_FT_NIC_RX, t, g)));
            }
            if note("DESTROY_FLOW_TABLE", d.exec(ifc::flow::destroy_flow_table(FS_FT_NIC_RX, t))) {
                self.table = None;
            }
        }
        if let Some(t) = self.tirn.take() {
            note("DESTROY_TIR", d.exec(ifc::eth::destroy_tir(t)));
        }
        let mut queues_gone = true;
        if let Some(r) = self.rqn.take() {
            queues_gone &= note("DESTROY_RQ", d.exec(ifc::eth::destroy_rq(r)));
        }
        // The counter set outlives the RQ counting into it (the firmware refuses to free one still in use).
        if queues_gone && let Some(q) = self.q_counter.take() {
            note("DEALLOC_Q_COUNTER", d.exec(ifc::eth::dealloc_q_counter(q)));
        }
        if let Some(s) = self.sqn.take() {
            queues_gone &= note("DESTROY_SQ", d.exec(ifc::eth::destroy_sq(s)));
        }
        for cq in [self.tx_cq.take(), self.rx_cq.take()].into_iter().flatten() {
            if let Err((_, error)) = d.destroy_cq(cq) {
                queues_gone = false;
                note("DESTROY_CQ", Err(error));
            }
        }
        if let Some(t) = self.tisn.take() {
            note("DESTROY_TIS", d.exec(ifc::eth::destroy_tis(t)));
        }
        for k in self.mkeys.drain(..) {
            note("DESTROY_MKEY", d.exec(ifc::mkey::destroy_mkey(k.index())));
        }
        if let Some(u) = self.uar.take() {
            note("DEALLOC_UAR", d.exec(ifc::resources::dealloc_uar(u)));
        }
        if let Some(t) = self.td.take() {
            note("DEALLOC_TRANSPORT_DOMAIN", d.exec(ifc::resources::dealloc_transport_domain(t)));
        }
        if let Some(pd) = self.pd.take() {
            note("DEALLOC_PD", d.exec(ifc::resources::dealloc_pd(pd)));
        }
        if queues_gone {
            let p = d.platform().clone();
            for b in self.dma.drain(..) {
                p.dma_free(b);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl<P: Platform> EthPort<P> {
    /// Builds the port (see the module documentation for the order). On failure everything built so far is
    /// destroyed again.
    pub fn create(d: &mut Driver<P>, cfg: &EthConfig) -> Result<EthPort<P>, EthError> {
        if cfg.buf_len < 64 || cfg.log_tx_frames > 12 || cfg.log_rx_frames > 15 {
            return Err(EthError::Config("buffer size or ring size out of range"));
        }
        if let Some(mtu) = cfg.mtu
            && usize::from(mtu) + usize::from(HW_MTU_OVERHEAD) > cfg.buf_len
        {
            return Err(EthError::Config("MTU larger than a frame buffer"));
        }
        let mut o = Objects::default();
        match Self::build(d, cfg, &mut o) {
            Ok(port) => Ok(port),
            Err(e) => {
                let _ = o.undo(d);
                Err(e)
            }
        }
    }

    fn build(d: &mut Driver<P>, cfg: &EthConfig, o: &mut Objects) -> Result<EthPort<P>, EthError> {
        let p = d.platform().clone();
        let step = |step: &'static str| move |error| EthError::Command { step, error };
        // Ethernet capabilities and the minimal inline mode (Linux `mlx5_query_min_inline`).
        let caps = d
            .exec(ifc::init::query_hca_cap(MLX5_CAP_ETHERNET_OFFLOADS, CapMode::Cur))
            .map_err(step("QUERY_HCA_CAP ETHERNET_OFFLOADS"))?;
        let caps = EthCaps::parse(ifc::init::hca_cap_block(&caps));
        let vport = d.exec(ifc::vport::query_nic_vport_context()).map_err(step("QUERY_NIC_VPORT_CONTEXT"))?;
        let mac = ifc::vport::query_nic_vport_context_out(&vport).permanent_address;
        let vport_mode = ifc::eth::nic_vport_min_wqe_inline_mode(&vport);
        let inline_mode = ifc::eth::min_inline_mode(&caps, Some(vport_mode));
        let sq_inline = (caps.wqe_inline_mode == MLX5_CAP_INLINE_MODE_VPORT_CONTEXT).then_some(inline_mode);
        if inline_mode > MLX5_INLINE_MODE_TCP_UDP {
            return Err(EthError::Config("unknown minimal inline mode"));
        }

        let pd = d.alloc_pd().map_err(step("ALLOC_PD"))?;
        o.pd = Some(pd);
        let td = d.alloc_td().map_err(step("ALLOC_TRANSPORT_DOMAIN"))?;
        o.td = Some(td);
        let uar = d.alloc_uar().map_err(step("ALLOC_UAR"))?;
        o.uar = Some(uar);
        // A Q counter for the RQ (Linux `mlx5e_create_q_counters`), when the function may have one; a refusal
        // by the firmware leaves the port without (its drops are then not counted).
        if d.info.caps.max_qp_cnt > 0 {
            match d.exec(ifc::eth::alloc_q_counter()) {
                Ok(out) => o.q_counter = Some(ifc::eth::alloc_q_counter_out(&out)),
                Err(e) if e.status().is_some() => log::warn!("mlx5: Ethernet port without a Q counter: {e}"),
                Err(e) => return Err(step("ALLOC_Q_COUNTER")(e)),
            }
        }

        // DMA memory: frame buffers, the SQ and RQ buffers, two doorbell records.
        let tx_frames = 1usize << cfg.log_tx_frames;
        let rx_frames = 1usize << cfg.log_rx_frames;
        let slot_bbs = wqebbs_per_slot(inline_mode);
        let mut alloc = |len: usize, align: usize, what: &'static str| -> Result<DmaBuf, EthError> {
            let b = p.dma_alloc(len, align).ok_or(EthError::NoDma { step: what })?;
            o.dma.push(b);
            Ok(b)
        };
        let page = |n: usize| n.next_multiple_of(PAGE_SIZE);
        let tx_bufs = alloc(page(tx_frames * cfg.buf_len), PAGE_SIZE, "TX buffers")?;
        let rx_bufs = alloc(page(rx_frames * cfg.buf_len), PAGE_SIZE, "RX buffers")?;
        let sq_buf = alloc(page(tx_frames * slot_bbs * SEND_WQE_BB), PAGE_SIZE, "SQ buffer")?;
        let rq_buf = alloc(page(rx_frames * RQ_WQE_LEN), PAGE_SIZE, "RQ buffer")?;
        let sq_dbr = alloc(DBR_LEN, DBR_LEN, "SQ doorbell record")?;
        let rq_dbr = alloc(DBR_LEN, DBR_LEN, "RQ doorbell record")?;
        let pages =
            |b: DmaBuf| -> Vec<u64> { (0..b.len() / PAGE_SIZE).map(|i| b.at((i * PAGE_SIZE) as u64)).collect() };

        // The lkey: the reserved one, or an MKEY per ring over its buffers (virtual = device addresses).
        let reserved = match cfg.lkey {
            LkeySource::Reserved => match d.exec(ifc::eth::query_special_contexts()) {
                Ok(out) => Some(ifc::eth::query_special_contexts_out(&out).resd_lkey),
                Err(e) if e.status().is_some() => None,
                Err(e) => return Err(step("QUERY_SPECIAL_CONTEXTS")(e)),
            },
            LkeySource::Mkey => None,
        };
        let lkey = match reserved {
            Some(k) => Lkey::Reserved(k),
            None => {
                let access = MkeyAccess::LOCAL_READ.union(MkeyAccess::LOCAL_WRITE);
                let mut mk = |b: DmaBuf| {
                    d.create_mkey(pd, b.addr(), b.len() as u64, access, LOG_PAGE, &pages(b))
                        .map_err(step("CREATE_MKEY"))
                };
                let tx = mk(tx_bufs)?;
                o.mkeys.push(tx);
                let rx = mk(rx_bufs)?;
                o.mkeys.push(rx);
                Lkey::Mkeys { tx, rx }
            }
        };
        let (tx_lkey, rx_lkey) = match lkey {
            Lkey::Reserved(k) => (k, k),
            Lkey::Mkeys { tx, rx } => (tx.0, rx.0),
        };

        let tisn = d.exec(ifc::eth::create_tis(td)).map_err(step("CREATE_TIS"))?;
        let tisn = ifc::eth::create_tis_out(&tisn);
        o.tisn = Some(tisn);
        // The send CQ has an entry per basic block, not per frame (Linux `mlx5e_build_tx_cq_param`: log_cq_size
        // = the SQ's log_wq_sz in WQEBBs): only a slot's last WQE asks for a CQE, but an SQ in error flushes
        // every posted WQE with a CQE of its own, and a slot may hold the frame's WQE and NOPs.
        let log_sq_bbs = cfg.log_tx_frames + slot_bbs.trailing_zeros() as u8;
        let tx_cq = d.create_cq(u32::from(log_sq_bbs)).map_err(step("CREATE_CQ (send)"))?;
        let tx_cqn = tx_cq.cqn;
        o.tx_cq = Some(tx_cq);
        let rx_cq = d.create_cq(u32::from(cfg.log_rx_frames)).map_err(step("CREATE_CQ (receive)"))?;
        let rx_cqn = rx_cq.cqn;
        o.rx_cq = Some(rx_cq);

        // SQ: cyclic, 64-byte strides, rung through the port's UAR page; RST → RDY.
        let sq_pages = pages(sq_buf);
        // With the reserved lkey the queues are created with `rlky`, which lets their WQEs use it.
        let rlky = matches!(lkey, Lkey::Reserved(_));
        let sq = ifc::eth::create_sq(&SqParams {
            rlky,
            cqn: tx_cqn,
            tisn,
            min_wqe_inline_mode: sq_inline,
            wq: WqParams {
                wq_type: MLX5_WQ_TYPE_CYCLIC,
                pd,
                uar_page: uar,
                dbr_addr: sq_dbr.addr(),
                log_wq_stride: LOG_SQ_STRIDE,
                log_wq_pg_sz: 0,
                log_wq_sz: log_sq_bbs,
                pages: &sq_pages,
            },
        });
        let sqn = ifc::eth::create_sq_out(&d.exec(sq).map_err(step("CREATE_SQ"))?);
        o.sqn = Some(sqn);
        d.exec(ifc::eth::modify_sq(sqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY)).map_err(step("MODIFY_SQ RST2RDY"))?;

        // RQ: cyclic, one data segment per WQE; RST → RDY. Its WQEs are written and posted once it is ready
        // (Linux posts receive WQEs after the RQ reached RDY).
        let rq_pages = pages(rq_buf);
        let rq = ifc::eth::create_rq(&RqParams {
            rlky,
            cqn: rx_cqn,
            vlan_strip_disable: true,
            counter_set_id: o.q_counter.unwrap_or(0),
            wq: WqParams {
                wq_type: MLX5_WQ_TYPE_CYCLIC,
                pd,
                uar_page: UarPage(0),
                dbr_addr: rq_dbr.addr(),
                log_wq_stride: LOG_RQ_STRIDE,
                log_wq_pg_sz: 0,
                log_wq_sz: cfg.log_rx_frames,
                pages: &rq_pages,
            },
        });
        let rqn = ifc::eth::create_rq_out(&d.exec(rq).map_err(step("CREATE_RQ"))?);
        o.rqn = Some(rqn);
        d.exec(ifc::eth::modify_rq(rqn, MLX5_WQ_STATE_RST, MLX5_WQ_STATE_RDY)).map_err(step("MODIFY_RQ RST2RDY"))?;

        let tirn = ifc::eth::create_tir_out(&d.exec(ifc::eth::create_tir_direct(td, rqn)).map_err(step("CREATE_TIR"))?);
        o.tirn = Some(tirn);

        // NIC_RX root table: the port's MAC and broadcast → the TIR.
        let t = d.exec(ifc::flow::create_flow_table(FS_FT_NIC_RX, 0, 1)).map_err(step("CREATE_FLOW_TABLE"))?;
        let table = ifc::flow::create_flow_table_out(&t);
        o.table = Some(table);
        let g =
            d.exec(ifc::flow::create_flow_group_dmac(FS_FT_NIC_RX, table, 0, 1)).map_err(step("CREATE_FLOW_GROUP"))?;
        let group = ifc::flow::create_flow_group_out(&g);
        o.group = Some(group);
        for (i, dmac) in [mac, BROADCAST].into_iter().enumerate() {
            let idx = FlowIndex(i as u32);
            d.exec(ifc::flow::set_fte_dmac_to_tir(FS_FT_NIC_RX, table, group, idx, dmac, tirn))
                .map_err(step("SET_FLOW_TABLE_ENTRY"))?;
            o.ftes.push(idx);
        }
        d.exec(ifc::flow::set_flow_table_root(FS_FT_NIC_RX, table)).map_err(step("SET_FLOW_TABLE_ROOT"))?;
        o.root = true;

        // The port: administratively up (PF only: a VF's link is the PF's business, and its firmware refuses
        // the PAOS write), MTU, state.
        if !d.info.vf {
            port_admin_up(d, cfg.local_port).map_err(step("ACCESS_REG PAOS write"))?;
        }
        let pmtu = match cfg.mtu {
            Some(mtu) => set_port_mtu(d, cfg.local_port, mtu)?,
            None => port_mtu(d, cfg.local_port).map_err(step("ACCESS_REG PMTU"))?,
        };
        let state = query_port_state(d, cfg.local_port).map_err(step("ACCESS_REG PAOS"))?;

        // Hand the CQ rings to the data path: receive WQEs written and all posted, the send ring empty.
        let (Some(tx_cq), Some(rx_cq)) = (o.tx_cq.take(), o.rx_cq.take()) else {
            return Err(EthError::Config("CQ missing"));
        };
        let rx_parts = RxParts {
            lkey: rx_lkey,
            log_frames: cfg.log_rx_frames,
            buf_len: cfg.buf_len,
            wq: rq_buf,
            dbr: rq_dbr,
            bufs: rx_bufs,
        };
        let mut rx = RxRing::new(p.as_ref(), rx_parts, rx_cq.ring);
        rx.post_all(p.as_ref());
        let tx = TxRing::new(
            TxParts {
                sqn,
                uar,
                lkey: tx_lkey,
                log_frames: cfg.log_tx_frames,
                inline_mode,
                buf_len: cfg.buf_len,
                wq: sq_buf,
                dbr: sq_dbr,
                bufs: tx_bufs,
            },
            tx_cq.ring,
        );
        let q_counter = o.q_counter;
        let info = EthInfo {
            mac,
            caps,
            inline_mode,
            lkey,
            pd,
            td,
            uar,
            tisn,
            tx_cqn,
            rx_cqn,
            sqn,
            rqn,
            tirn,
            table,
            pmtu,
            q_counter,
        };
        Ok(EthPort {
            p,
            info,
            tx,
            rx,
            stats: EthStats::default(),
            state,
            local_port: cfg.local_port,
            objects: core::mem::take(o),
            maint: Maintenance::default(),
        })
    }

    /// QUERY_SQ and QUERY_RQ: the queues as the HCA sees them (state, CQ, work queue, counters).
    pub fn query_queues(&self, d: &mut Driver<P>) -> Result<(ifc::eth::SqInfo, ifc::eth::RqInfo), CmdError> {
        let sq = d.exec(ifc::eth::query_sq(self.info.sqn))?;
        let rq = d.exec(ifc::eth::query_rq(self.info.rqn))?;
        Ok((ifc::eth::query_sq_out(&sq), ifc::eth::query_rq_out(&rq)))
    }

    /// Destroys the port in reverse (root disconnected, entries, group, table, TIR, RQ, Q counter, SQ, CQs, TIS,
    /// MKEYs, UAR, TD, PD), then frees its DMA memory. Needs the synchronous driver (before `into_engines`). The first
    /// failing step is reported; the rest still run, and memory a queue may still reach is not freed.
    pub fn destroy(self, d: &mut Driver<P>) -> Result<(), EthError> {
        let EthPort { info, tx, rx, mut objects, .. } = self;
        objects.tx_cq = Some(Cq { cqn: info.tx_cqn, ring: tx.cq });
        objects.rx_cq = Some(Cq { cqn: info.rx_cqn, ring: rx.cq });
        objects.undo(d)
    }
}
