//! The UMR queue pair (docs/mlx5-driver.md "UMR", docs/reference/umr.md): a QP of service type REG_UMR with
//! its own CQ and quarantine PD, brought to RTS without an address path (Linux `mlx5r_umr_resource_init`,
//! `mlx5r_umr_qp_rst2rts`), on which the lease service grants and revokes memory keys with work requests
//! instead of commands. The ring is sans-I/O over the platform like the Ethernet SQ ([`crate::eth`]), whose
//! control segment and doorbell it shares ([`crate::sq`]); it is polled by whoever owns it (the command core).
//!
//! Every WQE asks for a CQE; completions come back in posting order, each naming its WQE's index, and carry
//! the caller's tag. An error CQE puts the QP in error (the HCA flushes whatever followed it with error CQEs
//! of its own); [`UmrQp::fail_all`] does the same for a completion that never came. Either way the caller
//! falls back to commands for the tags it gets back, sends 2ERR_QP if the HCA may not know yet, and later
//! brings the QP back through [`UmrQp::recovery`] (ERR → RST → INIT → RTR → RTS) and [`UmrQp::reset_ring`].

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;

use crate::command::{CmdError, Command};
use crate::cq::DBR_LEN;
use crate::driver::Driver;
use crate::handles::{Pdn, Qpn, UarPage};
use crate::ifc;
use crate::ifc::cq::Cqe;
use crate::ifc::umr::{Grant, Revoke, UmrCaps, UmrRefused, WqeSlot};
use crate::objects::Cq;
use crate::platform::{DmaBuf, PAGE_SIZE, Platform};
use crate::sq::{MLX5_BF_OFFSET, SEND_WQE_BB};

/// Default log2 of the send queue in basic blocks: 256 blocks, 128 revokes (or up to 85 one-chunk grants) in
/// flight.
pub const DEFAULT_LOG_SQ_BBS: u8 = 8;

/// Why the UMR QP could not be set up (the service then uses commands for every lease).
#[derive(Debug)]
pub enum UmrSetupError {
    /// The capabilities refuse even a revoke.
    Refused(UmrRefused),
    Command {
        step: &'static str,
        error: CmdError,
    },
    NoDma(&'static str),
}

impl fmt::Display for UmrSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UmrSetupError::Refused(r) => write!(f, "UMR refused by the capabilities: {r}"),
            UmrSetupError::Command { step, error } => write!(f, "UMR QP set-up: {step}: {error}"),
            UmrSetupError::NoDma(what) => write!(f, "UMR QP set-up: no DMA memory for {what}"),
        }
    }
}

/// Why a WQE was not posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The caps or the key refuse this WQE: use commands for it.
    Refused(UmrRefused),
    /// No room in the send queue now.
    Full,
    /// The QP is in error (or being recovered).
    InError,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::Refused(r) => write!(f, "{r}"),
            PostError::Full => write!(f, "UMR send queue full"),
            PostError::InError => write!(f, "UMR QP in error"),
        }
    }
}

/// One finished UMR work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UmrDone {
    pub tag: u64,
    /// `None`: done, and the key is as the WQE said. `Some`: the error CQE's syndrome (a flushed WQE
    /// reports the flush syndrome); the key's state is unknown and the QP is in error.
    pub error: Option<(u8, u8)>,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    tag: u64,
    index: u16,
    bbs: u16,
}

/// The UMR QP and its ring.
pub struct UmrQp {
    qpn: Qpn,
    /// The quarantine PD: the UMR QP's own, and every revoked or pooled key's owner.
    pd: Pdn,
    uar: UarPage,
    cq: Cq,
    buf: DmaBuf,
    dbr: DmaBuf,
    log_bbs: u8,
    doorbell: usize,
    caps: UmrCaps,
    /// The reserved lkey, for translations passed by pointer (`umr_ptr_rlky`).
    resd_lkey: Option<u32>,
    /// Producer and consumer counters in basic blocks.
    pc: u16,
    cc: u16,
    in_flight: VecDeque<InFlight>,
    /// Outcomes found by one CQE for more than one work request, handed out one per poll.
    pending: VecDeque<UmrDone>,
    in_error: bool,
}

impl UmrQp {
    /// Creates the quarantine PD, a UAR page, the CQ, the REG_UMR QP and takes it to RTS (8 commands; the
    /// reserved lkey's QUERY_SPECIAL_CONTEXTS too when pointers are allowed). Whatever was made is undone on
    /// failure.
    pub fn create<P: Platform>(d: &mut Driver<P>, caps: UmrCaps, log_bbs: u8) -> Result<UmrQp, UmrSetupError> {
        caps.revoke_allowed().map_err(UmrSetupError::Refused)?;
        let mut made = Made::default();
        match Self::build(d, caps, log_bbs, &mut made) {
            Ok(q) => Ok(q),
            Err(e) => {
                made.undo(d);
                Err(e)
            }
        }
    }

    fn build<P: Platform>(d: &mut Driver<P>, caps: UmrCaps, log_bbs: u8, m: &mut Made) -> Result<UmrQp, UmrSetupError> {
        let p = d.platform().clone();
        let step = |step: &'static str| move |error| UmrSetupError::Command { step, error };
        let pd = d.alloc_pd().map_err(step("ALLOC_PD (quarantine)"))?;
        m.pd = Some(pd);
        let uar = d.alloc_uar().map_err(step("ALLOC_UAR"))?;
        m.uar = Some(uar);
        // One CQE per WQE at most, and a WQE is at least two blocks: a CQ as long as the ring never overflows.
        let cq = d.create_cq(u32::from(log_bbs)).map_err(step("CREATE_CQ (UMR)"))?;
        let cqn = cq.cqn;
        m.cq = Some(cq);
        let bytes = (SEND_WQE_BB << log_bbs).next_multiple_of(PAGE_SIZE);
        let buf = p.dma_alloc(bytes, PAGE_SIZE).ok_or(UmrSetupError::NoDma("the UMR send queue"))?;
        m.dma.push(buf);
        let dbr = p.dma_alloc(DBR_LEN, DBR_LEN).ok_or(UmrSetupError::NoDma("the UMR doorbell record"))?;
        m.dma.push(dbr);
        let pages: Vec<u64> = (0..bytes / PAGE_SIZE).map(|i| buf.at((i * PAGE_SIZE) as u64)).collect();
        let qcaps = d.info.qp;
        let out = d
            .exec(ifc::qp::create_umr_qp(&ifc::qp::UmrQpParams {
                pd,
                uar_page: uar,
                cqn,
                log_sq_size: log_bbs,
                ts_format: qcaps.ts_format,
                user_index: qcaps.user_index,
                log_page_size: 0,
                dbr_addr: dbr.addr(),
                pages: &pages,
            }))
            .map_err(step("CREATE_QP (REG_UMR)"))?;
        let qpn = ifc::qp::create_qp_out(&out);
        m.qpn = Some(qpn);
        for (cmd, what) in [
            (ifc::qp::umr_rst2init(qpn, pd, cqn), "RST2INIT_QP (UMR)"),
            (ifc::qp::umr_init2rtr(qpn, pd, cqn), "INIT2RTR_QP (UMR)"),
            (ifc::qp::umr_rtr2rts(qpn, pd, cqn), "RTR2RTS_QP (UMR)"),
        ] {
            d.exec(cmd).map_err(step(what))?;
        }
        let resd_lkey = if caps.ptr_rlky {
            match d.exec(ifc::eth::query_special_contexts()) {
                Ok(o) => Some(ifc::eth::query_special_contexts_out(&o).resd_lkey),
                Err(e) if e.status().is_some() => None,
                Err(e) => return Err(step("QUERY_SPECIAL_CONTEXTS")(e)),
            }
        } else {
            None
        };
        let Some(cq) = m.cq.take() else { return Err(UmrSetupError::NoDma("the UMR CQ")) };
        m.forget();
        Ok(UmrQp {
            qpn,
            pd,
            uar,
            cq,
            buf,
            dbr,
            log_bbs,
            doorbell: uar.0 as usize * PAGE_SIZE + MLX5_BF_OFFSET,
            caps,
            resd_lkey,
            pc: 0,
            cc: 0,
            in_flight: VecDeque::new(),
            pending: VecDeque::new(),
            in_error: false,
        })
    }

    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The quarantine PD (free keys live under it).
    pub fn quarantine_pd(&self) -> Pdn {
        self.pd
    }

    pub fn caps(&self) -> &UmrCaps {
        &self.caps
    }

    /// The reserved lkey for pointer translations, when the HCA gave one.
    pub fn resd_lkey(&self) -> Option<u32> {
        self.resd_lkey
    }

    pub fn in_error(&self) -> bool {
        self.in_error
    }

    /// Work requests posted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn ring_bbs(&self) -> u16 {
        1u16 << self.log_bbs
    }

    fn room(&self) -> u16 {
        self.ring_bbs() - self.pc.wrapping_sub(self.cc)
    }

    fn slot(&self) -> WqeSlot {
        WqeSlot { wqe_index: self.pc, qpn: self.qpn.0, fence: self.caps.fence_mode() }
    }

    /// Posts a revoke of `r.mkey` (free, into the quarantine PD). `r.quarantine_pd` must be
    /// [`Self::quarantine_pd`].
    pub fn post_revoke<P: Platform + ?Sized>(&mut self, p: &P, r: &Revoke, tag: u64) -> Result<(), PostError> {
        self.ready(2)?;
        let w = ifc::umr::revoke_wqe(&self.slot(), r);
        self.post(p, &w, tag);
        Ok(())
    }

    /// Posts a grant (the WQE from [`ifc::umr::grant_wqe`]); refused by the caps or the key's size, the
    /// caller uses commands instead.
    pub fn post_grant<P: Platform + ?Sized>(&mut self, p: &P, g: &Grant<'_>, tag: u64) -> Result<(), PostError> {
        if self.in_error {
            return Err(PostError::InError);
        }
        let w = ifc::umr::grant_wqe(&self.slot(), g, &self.caps).map_err(PostError::Refused)?;
        self.ready(ifc::umr::wqebbs(w.len()) as u16)?;
        self.post(p, &w, tag);
        Ok(())
    }

    fn ready(&self, bbs: u16) -> Result<(), PostError> {
        if self.in_error {
            Err(PostError::InError)
        } else if self.room() < bbs {
            Err(PostError::Full)
        } else {
            Ok(())
        }
    }

    /// Writes the WQE block by block (it may wrap past the ring's end) and rings the doorbell.
    fn post<P: Platform + ?Sized>(&mut self, p: &P, w: &[u8], tag: u64) {
        let bbs = ifc::umr::wqebbs(w.len()) as u16;
        let mask = self.ring_bbs() - 1;
        for b in 0..bbs {
            let at = usize::from(self.pc.wrapping_add(b) & mask) * SEND_WQE_BB;
            let from = usize::from(b) * SEND_WQE_BB;
            let mut block = [0u8; SEND_WQE_BB];
            let n = (w.len() - from).min(SEND_WQE_BB);
            block[..n].copy_from_slice(&w[from..from + n]);
            p.dma_write(self.buf, at, &block);
        }
        self.in_flight.push_back(InFlight { tag, index: self.pc, bbs });
        self.pc = self.pc.wrapping_add(bbs);
        crate::sq::ring_doorbell(p, self.dbr, self.doorbell, self.pc, &w[..8]);
    }

    /// The next finished work request, if its CQE is there. A CQE names the first block of its WQE. The HCA
    /// completes a send queue in order and every UMR WQE asks for a CQE, so a CQE that skips work requests
    /// posted before it means theirs were lost: those come back as failed (syndrome 0), the QP counts as in
    /// error, and no outcome is ever invented. A CQE that names nothing in flight is dropped.
    pub fn poll<P: Platform + ?Sized>(&mut self, p: &P) -> Option<UmrDone> {
        loop {
            if let Some(d) = self.pending.pop_front() {
                return Some(d);
            }
            let cqe = self.cq.ring.next(p)?;
            self.complete(&cqe);
        }
    }

    fn complete(&mut self, cqe: &Cqe) {
        let Some(pos) = self.in_flight.iter().position(|f| f.index == cqe.wqe_counter) else { return };
        let skipped = pos > 0;
        for f in self.in_flight.drain(..pos) {
            self.pending.push_back(UmrDone { tag: f.tag, error: Some((0, 0)) });
        }
        let Some(f) = self.in_flight.pop_front() else { return };
        self.cc = f.index.wrapping_add(f.bbs);
        let error = if cqe.is_error() { Some((cqe.syndrome, cqe.vendor_err_synd)) } else { None };
        if skipped || error.is_some() {
            self.in_error = true;
        }
        self.pending.push_back(UmrDone { tag: f.tag, error: if skipped { error.or(Some((0, 0))) } else { error } });
    }

    /// A completion did not come within its deadline: the QP counts as in error, and every work request in
    /// flight comes back as failed (the caller sends 2ERR_QP, [`Self::to_error`], and falls back to
    /// commands for each). Late CQEs for them are dropped by [`Self::poll`].
    pub fn fail_all(&mut self) -> Vec<u64> {
        self.in_error = true;
        self.cc = self.pc;
        // Outcomes already found (in `pending`) stay for `poll` to hand out.
        self.in_flight.drain(..).map(|f| f.tag).collect()
    }

    /// 2ERR_QP for the UMR QP.
    pub fn to_error(&self) -> Command {
        ifc::qp::qp_2err(self.qpn)
    }

    /// The commands that bring the QP from ERR back to RTS, in order.
    pub fn recovery(&self) -> [Command; 4] {
        let cqn = self.cq.cqn;
        [
            ifc::qp::qp_2rst(self.qpn),
            ifc::qp::umr_rst2init(self.qpn, self.pd, cqn),
            ifc::qp::umr_init2rtr(self.qpn, self.pd, cqn),
            ifc::qp::umr_rtr2rts(self.qpn, self.pd, cqn),
        ]
    }

    /// After [`Self::recovery`]'s commands: leftover CQEs consumed, counters and doorbell record at 0 (a QP
    /// in RST starts its send queue at 0). Anything still in flight comes back as failed.
    pub fn reset_ring<P: Platform + ?Sized>(&mut self, p: &P) -> Vec<u64> {
        while self.cq.ring.next(p).is_some() {}
        let failed = self.in_flight.drain(..).map(|f| f.tag).collect();
        self.pending.clear();
        self.pc = 0;
        self.cc = 0;
        p.dma_write32(self.dbr, 4, 0);
        self.in_error = false;
        failed
    }

    /// Destroys the QP, the CQ, the UAR page and the PD (the PD last: keys may still name it until the caller
    /// has destroyed them, so call this after them).
    pub fn destroy<P: Platform>(self, d: &mut Driver<P>) -> Result<(), CmdError> {
        let mut m = Made {
            pd: Some(self.pd),
            uar: Some(self.uar),
            cq: Some(self.cq),
            qpn: Some(self.qpn),
            dma: alloc::vec![self.buf, self.dbr],
        };
        m.undo_checked(d)
    }
}

/// What set-up made so far, undone in reverse on failure.
#[derive(Default)]
struct Made {
    pd: Option<Pdn>,
    uar: Option<UarPage>,
    cq: Option<Cq>,
    qpn: Option<Qpn>,
    dma: Vec<DmaBuf>,
}

impl Made {
    fn forget(&mut self) {
        *self = Made::default();
    }

    fn undo<P: Platform>(&mut self, d: &mut Driver<P>) {
        if let Err(e) = self.undo_checked(d) {
            log::warn!("mlx5: UMR set-up undo: {e}");
        }
    }

    /// Reverse order; memory the HCA may reach is freed only once the QP that used it is gone.
    fn undo_checked<P: Platform>(&mut self, d: &mut Driver<P>) -> Result<(), CmdError> {
        let mut first = None;
        let mut keep_dma = false;
        if let Some(q) = self.qpn.take()
            && let Err(e) = d.exec(ifc::qp::destroy_qp(q))
        {
            keep_dma = true;
            first.get_or_insert(e);
        }
        if !keep_dma {
            let p = d.platform().clone();
            for b in self.dma.drain(..) {
                p.dma_free(b);
            }
        }
        if let Some(cq) = self.cq.take()
            && let Err((_, e)) = d.destroy_cq(cq)
        {
            first.get_or_insert(e);
        }
        if let Some(u) = self.uar.take()
            && let Err(e) = d.dealloc_uar(u)
        {
            first.get_or_insert(e);
        }
        if let Some(pd) = self.pd.take()
            && let Err(e) = d.dealloc_pd(pd)
        {
            first.get_or_insert(e);
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
