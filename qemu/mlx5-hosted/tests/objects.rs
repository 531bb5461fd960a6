//! Every object's create / modify / destroy against the in-process model, with the values read back through
//! the QUERY commands (`leasebox_mlx5::ifc`). What the model answers for refusals is documented in
//! `docs/hca-model.md`.

mod common;

use leasebox_mlx5::handles::{FlowIndex, Mkey, Qpn};
use leasebox_mlx5::ifc::cq::{self, CQE_STRIDE_64, CqParams};
use leasebox_mlx5::ifc::eq::{self, EqParams, MLX5_EVENT_TYPE_CQ_ERROR, event_bit};
use leasebox_mlx5::ifc::flow::{self, FS_FT_RDMA_RX, MLX5_FLOW_CONTEXT_ACTION_DROP};
use leasebox_mlx5::ifc::mkey::{self, MkeyAccess, MkeyParams};
use leasebox_mlx5::ifc::qp::{self, Mtu, QpAccess, QpBase, QpState, RcPeer, RcQpParams, RtsParams};
use leasebox_mlx5::ifc::resources;
use leasebox_mlx5::{PAGE_SIZE, Platform};

use common::Hosted;

fn page(d: &Hosted) -> u64 {
    d.platform().dma_alloc(PAGE_SIZE, PAGE_SIZE).expect("DMA page").addr()
}

#[test]
fn pd_td_uar_alloc_and_dealloc() {
    let mut d = common::up();
    let pd = resources::parse_alloc_pd(&d.exec(resources::alloc_pd()).unwrap());
    let td = resources::parse_alloc_transport_domain(&d.exec(resources::alloc_transport_domain()).unwrap());
    let uar = resources::parse_alloc_uar(&d.exec(resources::alloc_uar()).unwrap());
    assert_ne!(uar, d.info.uar);
    d.exec(resources::dealloc_pd(pd)).unwrap();
    d.exec(resources::dealloc_transport_domain(td)).unwrap();
    d.exec(resources::dealloc_uar(uar)).unwrap();
    // A handle that no longer exists: BAD_PARAM (docs/hca-model.md, "Status choices").
    let e = d.exec(resources::dealloc_pd(pd)).unwrap_err();
    assert_eq!(e.status(), Some(0x03), "{e}");
    assert_eq!(e.attrs.get("pd"), Some(u64::from(pd.0)));
}

#[test]
fn eq_and_cq_create_query_destroy() {
    let mut d = common::up();
    let uar = resources::parse_alloc_uar(&d.exec(resources::alloc_uar()).unwrap());
    let eq_page = page(&d);
    let mask = event_bit(MLX5_EVENT_TYPE_CQ_ERROR);
    let eqn = eq::parse_create_eq(
        &d.exec(eq::create_eq(&EqParams {
            log_eq_size: 6,
            uar_page: uar,
            intr: 0,
            log_page_size: 0,
            event_mask: mask,
            pages: &[eq_page],
        }))
        .unwrap(),
    );
    let info = eq::parse_query_eq(&d.exec(eq::query_eq(eqn)).unwrap());
    assert_eq!((info.log_eq_size, info.uar_page, info.event_mask), (6, uar, mask));

    let cq_page = page(&d);
    let dbr = page(&d);
    let cqn = cq::parse_create_cq(
        &d.exec(cq::create_cq(&CqParams {
            log_cq_size: 6,
            uar_page: uar,
            eqn,
            log_page_size: 0,
            cqe_sz: CQE_STRIDE_64,
            dbr_addr: dbr,
            pages: &[cq_page],
        }))
        .unwrap(),
    );
    // The EQ has a CQ on it: BAD_RES_STATE (docs/hca-model.md, "Events, EQs, CQs and the port").
    assert_eq!(d.exec(eq::destroy_eq(eqn)).unwrap_err().status(), Some(0x09));
    d.exec(cq::destroy_cq(cqn)).unwrap();
    d.exec(eq::destroy_eq(eqn)).unwrap();
    d.exec(resources::dealloc_uar(uar)).unwrap();
}

#[test]
fn mkey_create_query_destroy() {
    let mut d = common::up();
    let pd = resources::parse_alloc_pd(&d.exec(resources::alloc_pd()).unwrap());
    let pages = [page(&d), page(&d)];
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let variant = 0x5a;
    let out = d
        .exec(mkey::create_mkey_mtt(&MkeyParams {
            pd,
            variant,
            start: 0x10_0000_0000,
            len: 2 * PAGE_SIZE as u64,
            access,
            log_page_size: 12,
            pages: &pages,
        }))
        .unwrap();
    let key: Mkey = mkey::create_mkey_out_key(&out, variant);
    assert_eq!(key.variant(), variant);
    let info = mkey::query_mkey_out(&d.exec(mkey::query_mkey(key.index())).unwrap());
    assert_eq!(info.access, access);
    assert_eq!((info.pd, info.start, info.len, info.variant), (pd, 0x10_0000_0000, 2 * PAGE_SIZE as u64, variant));
    assert_eq!((info.access_mode, info.log_page_size, info.free), (1, 12, false));
    assert_eq!(info.mtt[..2], [pages[0] | 3, pages[1] | 3]);
    // The PD still carries an MKEY: BAD_RES_STATE.
    assert_eq!(d.exec(resources::dealloc_pd(pd)).unwrap_err().status(), Some(0x09));
    d.exec(mkey::destroy_mkey(key.index())).unwrap();
    assert_eq!(d.exec(mkey::query_mkey(key.index())).unwrap_err().status(), Some(0x03));
    d.exec(resources::dealloc_pd(pd)).unwrap();
}

#[test]
fn rc_qp_through_its_states() {
    let mut d = common::up();
    let pd = resources::parse_alloc_pd(&d.exec(resources::alloc_pd()).unwrap());
    let uar = resources::parse_alloc_uar(&d.exec(resources::alloc_uar()).unwrap());
    let (cq_page, cq_dbr) = (page(&d), page(&d));
    let cqn = cq::parse_create_cq(
        &d.exec(cq::create_cq(&CqParams {
            log_cq_size: 6,
            uar_page: uar,
            eqn: d.info.eqn,
            log_page_size: 0,
            cqe_sz: CQE_STRIDE_64,
            dbr_addr: cq_dbr,
            pages: &[cq_page],
        }))
        .unwrap(),
    );
    let (sq_page, qp_dbr) = (page(&d), page(&d));
    let log_msg_max = d.info.qp.log_msg_max;
    assert_eq!(log_msg_max, d.info.caps.log_max_msg);
    let qpn = qp::create_qp_out(
        &d.exec(qp::create_rc_qp(&RcQpParams {
            pd,
            uar_page: uar,
            cqn_snd: cqn,
            cqn_rcv: cqn,
            log_rq_size: None,
            log_rq_stride: 0,
            log_sq_size: 6, // 64 WQEBBs of 64 bytes: one page
            log_msg_max,
            ts_format: d.info.qp.ts_format,
            user_index: d.info.qp.user_index,
            log_page_size: 0,
            dbr_addr: qp_dbr,
            pages: &[sq_page],
        }))
        .unwrap(),
    );
    let base = QpBase { qpn, pd, cqn_snd: cqn, cqn_rcv: cqn };
    // The GID table starts empty: the QP's path sends from the entry written here.
    d.roce_gid(0, [192, 0, 2, 1]).unwrap();
    let state = |d: &mut Hosted| qp::query_qp_out(&d.exec(qp::query_qp(qpn)).unwrap()).state;
    assert_eq!(state(&mut d), QpState::Rst);

    let access = QpAccess { remote_read: true, remote_write: true, remote_atomic: false };
    d.exec(qp::rst2init(&base, access, d.info.qp.atomic_mode)).unwrap();
    assert_eq!(state(&mut d), QpState::Init);
    // INIT2RTR again from RTR-less states is refused: RTR2RTS from INIT → BAD_QP_STATE.
    let rts = RtsParams { psn: 0x65_4321, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 2 };
    assert_eq!(d.exec(qp::rtr2rts(&base, &rts)).unwrap_err().status(), Some(0x10));

    let peer = RcPeer {
        qpn: Qpn(0xabcd),
        psn: 0x12_3456,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2],
        mac: [0x02, 0x4c, 0x42, 0, 0, 2],
        mtu: Mtu::Mtu1024,
        sgid_index: 0,
        hop_limit: 64,
        udp_sport: qp::roce_udp_sport(qpn, Qpn(0xabcd)),
        tclass: 0,
        eth_prio: 0,
        log_rra_max: 3,
        min_rnr_nak: 12,
    };
    d.exec(qp::init2rtr(&base, &peer, log_msg_max)).unwrap();
    assert_eq!(state(&mut d), QpState::Rtr);
    d.exec(qp::rtr2rts(&base, &rts)).unwrap();

    let info = qp::query_qp_out(&d.exec(qp::query_qp(qpn)).unwrap());
    assert_eq!(info.state, QpState::Rts);
    assert_eq!((info.remote_qpn, info.next_rcv_psn, info.next_send_psn), (peer.qpn, peer.psn, rts.psn));
    assert_eq!(Mtu::from_raw(info.mtu), Some(Mtu::Mtu1024));
    assert_eq!((info.rgid, info.rmac), (peer.gid, peer.mac));
    assert_eq!((info.pd, info.cqn_snd, info.cqn_rcv, info.uar_page), (pd, cqn, cqn, uar));
    assert!(info.rre && info.rwe && !info.rae);
    assert_eq!((info.ack_timeout, info.retry_count, info.rnr_retry, info.min_rnr_nak), (14, 7, 7, 12));
    assert_eq!((info.udp_sport, info.hop_limit, info.vhca_port_num), (peer.udp_sport, 64, 1));

    d.exec(qp::qp_2err(qpn)).unwrap();
    assert_eq!(state(&mut d), QpState::Err);
    d.exec(qp::qp_2rst(qpn)).unwrap();
    assert_eq!(state(&mut d), QpState::Rst);
    // The CQ is still named by the QP: BAD_RES_STATE.
    assert_eq!(d.exec(cq::destroy_cq(cqn)).unwrap_err().status(), Some(0x09));
    d.exec(qp::destroy_qp(qpn)).unwrap();
    assert_eq!(d.exec(qp::query_qp(qpn)).unwrap_err().status(), Some(0x03));
    d.exec(cq::destroy_cq(cqn)).unwrap();
    d.exec(resources::dealloc_uar(uar)).unwrap();
    d.exec(resources::dealloc_pd(pd)).unwrap();
}

#[test]
fn rdma_rx_drop_rule() {
    let mut d = common::up();
    let table = flow::create_flow_table_out(&d.exec(flow::create_flow_table(FS_FT_RDMA_RX, 0, 4)).unwrap());
    let group =
        flow::create_flow_group_out(&d.exec(flow::create_flow_group_bth_dst_qp(FS_FT_RDMA_RX, table, 0, 15)).unwrap());
    let drop = |i: u32, qpn: u32| {
        flow::set_fte_bth_dst_qp(FS_FT_RDMA_RX, table, group, FlowIndex(i), Qpn(qpn), MLX5_FLOW_CONTEXT_ACTION_DROP)
    };
    d.exec(drop(0, 0x42)).unwrap();
    // An occupied flow_index: status 0x08, what a CX-5 returned (docs/hca-model.md, "Flow steering").
    let e = d.exec(drop(0, 0x43)).unwrap_err();
    assert_eq!(e.status(), Some(0x08), "{e}");
    assert!(format!("{e}").contains("BAD_INDEX: flow_index already holds an entry"), "{e}");
    assert_eq!(e.attrs.get("flow_index"), Some(0));
    d.exec(drop(1, 0x43)).unwrap();
    // A group with entries cannot go: BAD_RES_STATE.
    assert_eq!(d.exec(flow::destroy_flow_group(FS_FT_RDMA_RX, table, group)).unwrap_err().status(), Some(0x09));
    d.exec(flow::delete_fte(FS_FT_RDMA_RX, table, FlowIndex(0))).unwrap();
    d.exec(flow::delete_fte(FS_FT_RDMA_RX, table, FlowIndex(1))).unwrap();
    d.exec(flow::destroy_flow_group(FS_FT_RDMA_RX, table, group)).unwrap();
    d.exec(flow::destroy_flow_table(FS_FT_RDMA_RX, table)).unwrap();
}
