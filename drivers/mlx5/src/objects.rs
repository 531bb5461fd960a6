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
    pub log_msg_max: u8,
}

impl Default for RcQpSizes {
    fn default() -> Self {
        RcQpSizes { log_sq_size: 6, log_rq_size: None, log_rq_stride: 2, log_msg_max: 30 }
    }
}

fn no_dma(cmd: &crate::command::Command) -> CmdError {
    cmd.error(ErrorKind::NoDma)
}

impl<P: Platform> Driver<P> {
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

    /// CREATE_QP for an RC QP in `pd` whose send and receive completions go to `cqn`.
    pub fn create_rc_qp(&mut self, pd: Pdn, cqn: Cqn, sizes: RcQpSizes) -> Result<RcQp, CmdError> {
        let p = self.platform().clone();
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
                log_msg_max: sizes.log_msg_max,
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

    /// RST→INIT with the remote access the lease grants.
    pub fn qp_rst2init(&mut self, qp: &RcQp, access: QpAccess) -> Result<(), CmdError> {
        self.exec(ifc::qp::rst2init(&qp.base, access)).map(drop)
    }

    /// INIT→RTR toward `peer` (RoCEv2 address path from its GID, MAC, QPN, PSN and MTU).
    pub fn qp_init2rtr(&mut self, qp: &RcQp, peer: &RcPeer, log_msg_max: u8) -> Result<(), CmdError> {
        self.exec(ifc::qp::init2rtr(&qp.base, peer, log_msg_max)).map(drop)
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
