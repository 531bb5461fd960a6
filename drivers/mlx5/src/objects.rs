//! Objects with typed handles, created and destroyed through [`Driver::exec`]: PD, transport domain, UAR,
//! CQ (ring + doorbell record, polled), MKEY in MTT mode (the 8-bit variant rotated on every create), RC QP
//! (buffer + doorbell record; RST→INIT→RTR→RTS, 2ERR, 2RST, destroy), and the diagnostics queries. DMA
//! memory an object owns is freed only after the firmware confirmed the destroy: a destroy that
//! fails hands the object back.
//!
//! The lease service builds the same commands with `crate::ifc` and submits them through the engines'
//! client; this layer is the synchronous path for bring-up, tests and diagnostics.

use crate::command::{CmdError, ErrorKind};
use crate::cq::{CqRing, DBR_LEN};
use crate::driver::Driver;
use crate::handles::{Cqn, Mkey, Pdn, Qpn, Tdn, UarPage};
use crate::ifc;
use crate::ifc::cq::CqParams;
use crate::ifc::mkey::{MkeyAccess, MkeyInfo, MkeyParams};
use crate::ifc::qp::{QpAccess, QpBase, QpInfo, RcPeer, RcQpParams, RtsParams};
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};

/// A polled CQ: its number and its ring.
pub struct Cq {
    pub cqn: Cqn,
    pub ring: CqRing,
}

/// An RC QP and the DMA memory it owns (work queue buffer, doorbell record).
#[derive(Debug)]
pub struct RcQp {
    pub base: QpBase,
    buf: DmaBuf,
    dbr: DmaBuf,
}

impl RcQp {
    pub fn qpn(&self) -> Qpn {
        self.base.qpn
    }
}

/// Sizes of an RC QP's work queues.
#[derive(Clone, Copy, Debug)]
pub struct RcQpSizes {
    /// log2 of the SQ size in 64-byte WQEBBs.
    pub log_sq_size: u8,
    /// log2 of the RQ WQE count; `None` = zero-length RQ (a responder that only serves RDMA READ/WRITE).
    pub log_rq_size: Option<u8>,
    /// log2(RQ WQE bytes) - 4.
    pub log_rq_stride: u8,
}

impl Default for RcQpSizes {
    fn default() -> Self {
        RcQpSizes { log_sq_size: 6, log_rq_size: None, log_rq_stride: 2 }
    }
}

fn no_dma(cmd: &crate::command::Command) -> CmdError {
    cmd.error(ErrorKind::NoDma)
}

/// Why the port cannot carry the lease QPs' RoCEv2 traffic, or a command of the RoCE set-up that failed.
#[derive(Debug)]
pub enum RoceError {
    /// `cmd_hca_cap.port_type` is InfiniBand (0): the port's link type must be changed on the card.
    InfiniBand,
    /// `cmd_hca_cap.roce` is 0.
    NoRoce,
    /// The RoCE capabilities lack RoCE version 2 or IPv4 (`roce_cap.roce_version`, `l3_type`).
    NoRoceV2Ipv4 {
        roce_version: u8,
        l3_type: u8,
    },
    /// The GID table has no entry `index` (`roce_address_table_size`).
    TableTooSmall {
        index: u16,
        size: u16,
    },
    /// The vport still reports `roce_en` = 0 after MODIFY_NIC_VPORT_CONTEXT.
    RoceEnNotSet,
    /// The GID read back is not the one written.
    GidNotWritten {
        index: u16,
    },
    Command {
        step: &'static str,
        error: CmdError,
    },
}

impl core::fmt::Display for RoceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RoceError::InfiniBand => write!(
                f,
                "the port is InfiniBand (port_type 0), but lease QPs run RoCEv2 over Ethernet: set the link type \
                 on the card with `mlxconfig -d <device> set LINK_TYPE_P1=2`, then reset it (mlxfwreset or a \
                 power cycle)"
            ),
            RoceError::NoRoce => write!(f, "the function does not support RoCE (HCA capability roce = 0)"),
            RoceError::NoRoceV2Ipv4 { roce_version, l3_type } => write!(
                f,
                "the port does not offer RoCEv2 over IPv4 (roce_cap roce_version {roce_version:#x}, \
                 l3_type {l3_type:#x})"
            ),
            RoceError::TableTooSmall { index, size } => {
                write!(f, "GID index {index} is outside the RoCE address table ({size} entries)")
            }
            RoceError::RoceEnNotSet => write!(f, "the NIC vport still has roce_en = 0 after enabling it"),
            RoceError::GidNotWritten { index } => {
                write!(f, "GID index {index} does not hold the entry written (QUERY_ROCE_ADDRESS)")
            }
            RoceError::Command { step, error } => write!(f, "{step}: {error}"),
        }
    }
}

impl<P: Platform> Driver<P> {
    /// RoCE set-up as Linux `mlx5_ib` does it for an Ethernet port, then one RoCEv2 GID: the port's link type
    /// is Ethernet (`port_type`), the function has RoCE (`roce`) and RoCEv2 over IPv4 (`roce_cap`), the NIC
    /// vport has `roce_en` (MODIFY_NIC_VPORT_CONTEXT, Linux `mlx5_nic_vport_enable_roce`), and GID `index`
    /// holds `::ffff:ip` from the port MAC (SET_ROCE_ADDRESS, read back). Returns the GID written; QPs use
    /// `index` as `src_addr_index`.
    pub fn roce_gid(&mut self, index: u16, ip: [u8; 4]) -> Result<[u8; 16], RoceError> {
        use ifc::init::{CapMode, MLX5_CAP_ROCE, RoceCaps, hca_cap_block, query_hca_cap};
        let step = |step: &'static str| move |error: CmdError| RoceError::Command { step, error };
        if self.info.caps.port_type != 1 {
            return Err(RoceError::InfiniBand);
        }
        if !self.info.caps.roce {
            return Err(RoceError::NoRoce);
        }
        let out = self.exec(query_hca_cap(MLX5_CAP_ROCE, CapMode::Cur)).map_err(step("QUERY_HCA_CAP ROCE"))?;
        let rc = RoceCaps::parse(hca_cap_block(&out));
        // `MLX5_ROCE_L3_TYPE_IPV4_CAP` is bit 1 of `l3_type`.
        if !rc.supports_roce_v2() || rc.l3_type & (1 << 1) == 0 {
            return Err(RoceError::NoRoceV2Ipv4 { roce_version: rc.roce_version, l3_type: rc.l3_type });
        }
        if index >= rc.roce_address_table_size {
            return Err(RoceError::TableTooSmall { index, size: rc.roce_address_table_size });
        }
        let ctx = self.exec(ifc::vport::query_nic_vport_context()).map_err(step("QUERY_NIC_VPORT_CONTEXT"))?;
        if !ifc::vport::query_nic_vport_context_out(&ctx).roce_en {
            self.exec(ifc::vport::modify_nic_vport_roce_en(true)).map_err(step("MODIFY_NIC_VPORT_CONTEXT"))?;
            let ctx = self.exec(ifc::vport::query_nic_vport_context()).map_err(step("QUERY_NIC_VPORT_CONTEXT"))?;
            if !ifc::vport::query_nic_vport_context_out(&ctx).roce_en {
                return Err(RoceError::RoceEnNotSet);
            }
        }
        let entry = ifc::vport::RoceAddress::rocev2_ipv4(ip, self.info.mac);
        self.exec(ifc::vport::set_roce_address(index, &entry)).map_err(step("SET_ROCE_ADDRESS"))?;
        let back = self.exec(ifc::vport::query_roce_address(index)).map_err(step("QUERY_ROCE_ADDRESS"))?;
        if ifc::vport::query_roce_address_out(&back) != entry {
            return Err(RoceError::GidNotWritten { index });
        }
        Ok(entry.gid)
    }

    pub fn alloc_pd(&mut self) -> Result<Pdn, CmdError> {
        self.exec(ifc::resources::alloc_pd()).map(|o| ifc::resources::parse_alloc_pd(&o))
    }

    pub fn dealloc_pd(&mut self, pd: Pdn) -> Result<(), CmdError> {
        self.exec(ifc::resources::dealloc_pd(pd)).map(drop)
    }

    pub fn alloc_td(&mut self) -> Result<Tdn, CmdError> {
        self.exec(ifc::resources::alloc_transport_domain()).map(|o| ifc::resources::parse_alloc_transport_domain(&o))
    }

    pub fn dealloc_td(&mut self, td: Tdn) -> Result<(), CmdError> {
        self.exec(ifc::resources::dealloc_transport_domain(td)).map(drop)
    }

    pub fn alloc_uar(&mut self) -> Result<UarPage, CmdError> {
        self.exec(ifc::resources::alloc_uar()).map(|o| ifc::resources::parse_alloc_uar(&o))
    }

    pub fn dealloc_uar(&mut self, uar: UarPage) -> Result<(), CmdError> {
        self.exec(ifc::resources::dealloc_uar(uar)).map(drop)
    }

    /// A CQ of `2^log_size` 64-byte CQEs on the driver's UAR, reporting to its EQ (never armed).
    pub fn create_cq(&mut self, log_size: u32) -> Result<Cq, CmdError> {
        let p = self.platform().clone();
        let (uar_page, eqn) = (self.info.uar, self.info.eqn);
        let mk = |dbr_addr: u64, pages: &[u64]| {
            ifc::cq::create_cq(&CqParams {
                log_cq_size: log_size as u8,
                uar_page,
                eqn,
                log_page_size: 0,
                cqe_sz: ifc::cq::CQE_STRIDE_64,
                dbr_addr,
                pages,
            })
        };
        let Some(ring) = CqRing::alloc(p.as_ref(), log_size) else { return Err(no_dma(&mk(0, &[]))) };
        let pages: alloc::vec::Vec<u64> = ring.pages().collect();
        match self.exec(mk(ring.dbr.addr(), &pages)) {
            Ok(o) => Ok(Cq { cqn: ifc::cq::parse_create_cq(&o), ring }),
            Err(e) => {
                ring.release(p.as_ref());
                Err(e)
            }
        }
    }

    /// DESTROY_CQ, then frees the ring. On failure the CQ comes back with the error.
    pub fn destroy_cq(&mut self, cq: Cq) -> Result<(), (Cq, CmdError)> {
        match self.exec(ifc::cq::destroy_cq(cq.cqn)) {
            Ok(_) => {
                cq.ring.release(self.platform().as_ref());
                Ok(())
            }
            Err(e) => Err((cq, e)),
        }
    }

    /// CREATE_MKEY in MTT mode over `pages` (each `1 << log_page_size` bytes), with the next variant.
    pub fn create_mkey(
        &mut self,
        pd: Pdn,
        start: u64,
        len: u64,
        access: MkeyAccess,
        log_page_size: u8,
        pages: &[u64],
    ) -> Result<Mkey, CmdError> {
        let variant = self.mkey_variant.take();
        let cmd = ifc::mkey::create_mkey_mtt(&MkeyParams { pd, variant, start, len, access, log_page_size, pages });
        self.exec(cmd).map(|o| ifc::mkey::create_mkey_out_key(&o, variant))
    }

    pub fn destroy_mkey(&mut self, mkey: Mkey) -> Result<(), CmdError> {
        self.exec(ifc::mkey::destroy_mkey(mkey.index())).map(drop)
    }

    pub fn query_mkey(&mut self, mkey: Mkey) -> Result<MkeyInfo, CmdError> {
        self.exec(ifc::mkey::query_mkey(mkey.index())).map(|o| ifc::mkey::query_mkey_out(&o))
    }

    /// CREATE_QP for an RC QP in `pd` whose send and receive completions go to `cqn`; `log_msg_max`,
    /// `ts_format` and `user_index` from the caps ([`HcaInfo::qp`](crate::driver::HcaInfo)).
    pub fn create_rc_qp(&mut self, pd: Pdn, cqn: Cqn, sizes: RcQpSizes) -> Result<RcQp, CmdError> {
        let p = self.platform().clone();
        let caps = self.info.qp;
        let rq_bytes = sizes.log_rq_size.map_or(0, |n| (16usize << sizes.log_rq_stride) << n);
        let sq_bytes = 64usize << sizes.log_sq_size;
        let buf_len = (rq_bytes + sq_bytes).next_multiple_of(PAGE_SIZE);
        let build = |buf: u64, dbr: u64, pages: &[u64], uar| {
            ifc::qp::create_rc_qp(&RcQpParams {
                pd,
                uar_page: uar,
                cqn_snd: cqn,
                cqn_rcv: cqn,
                log_rq_size: sizes.log_rq_size,
                log_rq_stride: sizes.log_rq_stride,
                log_sq_size: sizes.log_sq_size,
                log_msg_max: caps.log_msg_max,
                ts_format: caps.ts_format,
                user_index: caps.user_index,
                log_page_size: 0,
                dbr_addr: dbr,
                pages,
            })
            .with("buf", buf)
        };
        let uar = self.info.uar;
        let Some(buf) = p.dma_alloc(buf_len, PAGE_SIZE) else { return Err(no_dma(&build(0, 0, &[], uar))) };
        let Some(dbr) = p.dma_alloc(DBR_LEN, DBR_LEN) else {
            p.dma_free(buf);
            return Err(no_dma(&build(0, 0, &[], uar)));
        };
        let pages: alloc::vec::Vec<u64> = (0..buf_len / PAGE_SIZE).map(|i| buf.at((i * PAGE_SIZE) as u64)).collect();
        match self.exec(build(buf.addr(), dbr.addr(), &pages, uar)) {
            Ok(o) => {
                let qpn = ifc::qp::create_qp_out(&o);
                Ok(RcQp { base: QpBase { qpn, pd, cqn_snd: cqn, cqn_rcv: cqn }, buf, dbr })
            }
            Err(e) => {
                p.dma_free(buf);
                p.dma_free(dbr);
                Err(e)
            }
        }
    }

    /// RST→INIT with the remote access the lease grants (remote atomics in the caps' atomic mode).
    pub fn qp_rst2init(&mut self, qp: &RcQp, access: QpAccess) -> Result<(), CmdError> {
        self.exec(ifc::qp::rst2init(&qp.base, access, self.info.qp.atomic_mode)).map(drop)
    }

    /// INIT→RTR toward `peer` (RoCEv2 address path from its GID, MAC, QPN, PSN and MTU), `log_msg_max` from
    /// the caps.
    pub fn qp_init2rtr(&mut self, qp: &RcQp, peer: &RcPeer) -> Result<(), CmdError> {
        self.exec(ifc::qp::init2rtr(&qp.base, peer, self.info.qp.log_msg_max)).map(drop)
    }

    pub fn qp_rtr2rts(&mut self, qp: &RcQp, rts: &RtsParams) -> Result<(), CmdError> {
        self.exec(ifc::qp::rtr2rts(&qp.base, rts)).map(drop)
    }

    pub fn qp_to_err(&mut self, qp: &RcQp) -> Result<(), CmdError> {
        self.exec(ifc::qp::qp_2err(qp.base.qpn)).map(drop)
    }

    pub fn qp_to_rst(&mut self, qp: &RcQp) -> Result<(), CmdError> {
        self.exec(ifc::qp::qp_2rst(qp.base.qpn)).map(drop)
    }

    pub fn query_qp(&mut self, qpn: Qpn) -> Result<QpInfo, CmdError> {
        self.exec(ifc::qp::query_qp(qpn)).map(|o| ifc::qp::query_qp_out(&o))
    }

    /// DESTROY_QP, then frees its buffer and doorbell record. On failure the QP comes back.
    pub fn destroy_qp(&mut self, qp: RcQp) -> Result<(), (RcQp, CmdError)> {
        match self.exec(ifc::qp::destroy_qp(qp.base.qpn)) {
            Ok(_) => {
                let p = self.platform().clone();
                p.dma_free(qp.buf);
                p.dma_free(qp.dbr);
                Ok(())
            }
            Err(e) => Err((qp, e)),
        }
    }
}
