//! The driver's UMR queue pair against the device model (docs/mlx5-driver.md "UMR", docs/reference/umr.md):
//! the REG_UMR QP comes up on the model without an address path; a grant re-points a free UMR-enabled key
//! and a revoke frees it into the quarantine PD, as QUERY_MKEY then reads back; a WQE the model refuses
//! completes in error, puts the QP in error, and the recovery commands bring it back; the capabilities the
//! model reports decide what the driver posts (a model playing `umr_modify_entity_size_disabled` gets no
//! grant). The model decodes the WQEs with its own code: this checks the driver's encoder against it.

mod common;

use leasebox_mlx5::handles::{Mkey, Pdn};
use leasebox_mlx5::ifc;
use leasebox_mlx5::ifc::mkey::MkeyAccess;
use leasebox_mlx5::ifc::qp::QpState;
use leasebox_mlx5::ifc::umr::{Grant, Revoke, Translation, UmrCaps, UmrRefused};
use leasebox_mlx5::platform::{DmaBuf, PAGE_SIZE, Platform};
use leasebox_mlx5::umr::{PostError, UmrDone, UmrQp};
use mlx5_model::ModelConfig;

/// Polls the UMR QP until one work request finishes (the in-process model steps on every relax), at most
/// `limit` relaxes.
fn wait(d: &common::Hosted, q: &mut UmrQp, limit: usize) -> Option<UmrDone> {
    let p = d.platform().clone();
    for _ in 0..limit {
        if let Some(done) = q.poll(p.as_ref()) {
            return Some(done);
        }
        p.relax();
    }
    None
}

/// A free, UMR-enabled key in the quarantine PD with room for `entries` 4 KiB pages.
fn pool_key(d: &mut common::Hosted, pd: Pdn, entries: usize, variant: u8) -> Mkey {
    let out = d.exec(ifc::mkey::create_mkey_umr_free(pd, variant, entries, 12, false)).unwrap();
    ifc::mkey::create_mkey_out_key(&out, variant)
}

fn pages(buf: DmaBuf) -> Vec<u64> {
    (0..buf.len() / PAGE_SIZE).map(|i| buf.at((i * PAGE_SIZE) as u64)).collect()
}

#[test]
fn the_umr_qp_comes_up_grants_and_revokes_a_pool_key() {
    let mut d = common::up();
    let caps = UmrCaps::from_general(&d.info.caps);
    assert_eq!(caps.revoke_allowed(), Ok(()));
    assert_eq!(caps.grant_allowed(), Ok(()), "the ConnectX-5 profile allows UMR translations: {caps:?}");
    let mut q = UmrQp::create(&mut d, caps, 6).unwrap_or_else(|e| panic!("{e}"));
    let info = d.query_qp(q.qpn()).unwrap();
    assert_eq!(info.state, QpState::Rts);

    let qpd = q.quarantine_pd();
    let client_pd = d.alloc_pd().unwrap();
    let key = pool_key(&mut d, qpd, 8, 0x11);
    let before = d.query_mkey(key).unwrap();
    assert!(before.free);
    assert_eq!(before.pd, qpd);

    // Grant: 3 pages inline, a fresh variant, the client's PD.
    let p = d.platform().clone();
    let mem = p.dma_alloc(3 * PAGE_SIZE, PAGE_SIZE).unwrap();
    let pg = pages(mem);
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::LOCAL_WRITE | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let g = Grant {
        mkey: key,
        new_variant: 0x7e,
        pd: client_pd,
        start: mem.addr(),
        len: mem.len() as u64,
        access,
        log_page_size: 12,
        capacity: 8,
        translation: Translation::Inline(&pg),
    };
    q.post_grant(p.as_ref(), &g, 1).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 1, error: None }));
    let granted = Mkey::new(key.index(), 0x7e);
    let info = d.query_mkey(granted).unwrap();
    assert!(!info.free, "granted key still free: {info:?}");
    assert_eq!((info.pd, info.variant, info.start, info.len), (client_pd, 0x7e, mem.addr(), mem.len() as u64));
    assert_eq!(info.access, access);
    assert_eq!(info.log_page_size, 12);
    assert_eq!(&info.mtt[..3], &[pg[0] | 3, pg[1] | 3, pg[2] | 3]);

    // Revoke: free, in the quarantine PD; 0 commands.
    q.post_revoke(p.as_ref(), &Revoke { mkey: granted, quarantine_pd: qpd }, 2).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 2, error: None }));
    let info = d.query_mkey(granted).unwrap();
    assert!(info.free);
    assert_eq!(info.pd, qpd);
    assert!(!q.in_error());

    d.destroy_mkey(granted).unwrap();
    d.dealloc_pd(client_pd).unwrap();
    p.dma_free(mem);
    q.destroy(&mut d).unwrap();
}

#[test]
fn an_error_completion_puts_the_qp_in_error_and_recovery_brings_it_back() {
    let mut d = common::up();
    let caps = UmrCaps::from_general(&d.info.caps);
    let mut q = UmrQp::create(&mut d, caps, 6).unwrap();
    let p = d.platform().clone();
    let qpd = q.quarantine_pd();
    let key = pool_key(&mut d, qpd, 4, 0x21);
    let mem = p.dma_alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
    let pg = pages(mem);
    let g = Grant {
        mkey: key,
        new_variant: 0x22,
        pd: qpd,
        start: mem.addr(),
        len: PAGE_SIZE as u64,
        access: MkeyAccess::REMOTE_READ,
        log_page_size: 12,
        capacity: 4,
        translation: Translation::Inline(&pg),
    };
    q.post_grant(p.as_ref(), &g, 10).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 10, error: None }));
    // A second grant on the now live key: CHECK_NOT_FREE fails it; the revoke posted behind it is flushed.
    let live = Mkey::new(key.index(), 0x22);
    q.post_grant(p.as_ref(), &Grant { mkey: live, new_variant: 0x23, ..g }, 11).unwrap();
    q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 12).unwrap();
    let first = wait(&d, &mut q, 10_000).expect("a completion for the bad grant");
    assert_eq!(first.tag, 11);
    assert!(first.error.is_some(), "the bad grant completed: {first:?}");
    assert!(q.in_error());
    let second = wait(&d, &mut q, 10_000).expect("the flushed revoke");
    assert_eq!(second.tag, 12);
    assert!(second.error.is_some());
    // Nothing is posted on a QP in error; the key is untouched (still live, the old variant).
    assert_eq!(q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 13), Err(PostError::InError));
    let info = d.query_mkey(live).unwrap();
    assert!(!info.free && info.variant == 0x22);
    assert_eq!(d.query_qp(q.qpn()).unwrap().state, QpState::Err);

    // Recovery: ERR → RST → INIT → RTR → RTS, the ring from 0; then the revoke goes through.
    for c in q.recovery() {
        d.exec(c).unwrap();
    }
    assert!(q.reset_ring(p.as_ref()).is_empty());
    assert_eq!(d.query_qp(q.qpn()).unwrap().state, QpState::Rts);
    q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 14).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 14, error: None }));
    assert!(d.query_mkey(live).unwrap().free);
    d.destroy_mkey(live).unwrap();
    p.dma_free(mem);
    q.destroy(&mut d).unwrap();
}

#[test]
fn a_missing_completion_fails_every_request_in_flight() {
    let mut d = common::up();
    let caps = UmrCaps::from_general(&d.info.caps);
    let mut q = UmrQp::create(&mut d, caps, 6).unwrap();
    let p = d.platform().clone();
    let qpd = q.quarantine_pd();
    let key = pool_key(&mut d, qpd, 4, 0x31);
    // Posted, and the deadline passes before the model ran it (no relax in between): the caller gives up.
    q.post_revoke(p.as_ref(), &Revoke { mkey: key, quarantine_pd: qpd }, 7).unwrap();
    assert_eq!(q.in_flight(), 1);
    assert_eq!(q.fail_all(), vec![7]);
    assert!(q.in_error() && q.in_flight() == 0);
    d.exec(q.to_error()).unwrap();
    // A late CQE names nothing in flight and is dropped.
    for _ in 0..1_000 {
        p.relax();
    }
    assert_eq!(q.poll(p.as_ref()), None);
    for c in q.recovery() {
        d.exec(c).unwrap();
    }
    q.reset_ring(p.as_ref());
    assert_eq!(d.query_qp(q.qpn()).unwrap().state, QpState::Rts);
    d.destroy_mkey(key).unwrap();
    q.destroy(&mut d).unwrap();
}

#[test]
fn entity_size_disabled_firmware_gets_revokes_but_no_grants() {
    let model = ModelConfig { umr_entity_size_disabled: true, ..common::model_config() };
    let mut d = common::up_with(model, common::driver_config());
    let caps = UmrCaps::from_general(&d.info.caps);
    assert!(caps.modify_entity_size_disabled, "the model's mode reports the bit");
    assert_eq!(caps.grant_allowed(), Err(UmrRefused::EntitySizeDisabled));
    assert_eq!(caps.revoke_allowed(), Ok(()));
    let mut q = UmrQp::create(&mut d, caps, 6).unwrap();
    let p = d.platform().clone();
    let qpd = q.quarantine_pd();
    let key = pool_key(&mut d, qpd, 4, 0x41);
    let g = Grant {
        mkey: key,
        new_variant: 0x42,
        pd: qpd,
        start: 0,
        len: PAGE_SIZE as u64,
        access: MkeyAccess::REMOTE_READ,
        log_page_size: 12,
        capacity: 4,
        translation: Translation::Inline(&[0x1000]),
    };
    // Refused before anything is posted: the ring stays empty and usable.
    assert_eq!(q.post_grant(p.as_ref(), &g, 1), Err(PostError::Refused(UmrRefused::EntitySizeDisabled)));
    assert_eq!(q.in_flight(), 0);
    q.post_revoke(p.as_ref(), &Revoke { mkey: key, quarantine_pd: qpd }, 2).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 2, error: None }));
    d.destroy_mkey(key).unwrap();
    q.destroy(&mut d).unwrap();
}

/// The model's UMR fault rules against the driver's ring: an injected error completion (the revoke fails
/// with its syndrome, the QP is in error, the key untouched), then a hang (posted and rung, no completion: the
/// caller's deadline gives up with `fail_all`, 2ERR_QP and the recovery commands bring the QP back), then
/// the rules cleared and the same revoke goes through.
#[test]
fn injected_umr_faults_fail_closed() {
    use mlx5_model::fault::Fault;
    let mut d = common::up();
    let caps = UmrCaps::from_general(&d.info.caps);
    let mut q = UmrQp::create(&mut d, caps, 6).unwrap();
    let p = d.platform().clone();
    let qpd = q.quarantine_pd();
    let client_pd = d.alloc_pd().unwrap();
    let key = pool_key(&mut d, qpd, 4, 0x51);
    let g = Grant {
        mkey: key,
        new_variant: 0x52,
        pd: client_pd,
        start: 0x1000,
        len: PAGE_SIZE as u64,
        access: MkeyAccess::REMOTE_WRITE,
        log_page_size: 12,
        capacity: 4,
        translation: Translation::Inline(&[0x10_0000]),
    };
    q.post_grant(p.as_ref(), &g, 1).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 1, error: None }));
    let live = Mkey::new(key.index(), 0x52);

    // An error completion with the injected syndrome: the key stays live in the client's PD.
    p.model().unwrap().inject(Fault::UmrFail { count: 1, syndrome: 0x4 });
    q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 2).unwrap();
    let done = wait(&d, &mut q, 10_000).expect("a completion");
    assert_eq!((done.tag, done.error.map(|e| e.0)), (2, Some(0x4)));
    assert!(q.in_error());
    let info = d.query_mkey(live).unwrap();
    assert!(!info.free && info.pd == client_pd, "a failed revoke changed the key: {info:?}");
    for c in q.recovery() {
        d.exec(c).unwrap();
    }
    q.reset_ring(p.as_ref());

    // A hang: no completion however long we poll; the deadline's `fail_all` hands the tag back.
    p.model().unwrap().inject(Fault::UmrHang);
    q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 3).unwrap();
    assert_eq!(wait(&d, &mut q, 2_000), None);
    assert_eq!(q.fail_all(), vec![3]);
    d.exec(q.to_error()).unwrap();
    p.model().unwrap().inject(Fault::Clear);
    for c in q.recovery() {
        d.exec(c).unwrap();
    }
    q.reset_ring(p.as_ref());
    assert!(!d.query_mkey(live).unwrap().free, "the hung revoke was never applied");

    // Cleared: the revoke goes through.
    q.post_revoke(p.as_ref(), &Revoke { mkey: live, quarantine_pd: qpd }, 4).unwrap();
    assert_eq!(wait(&d, &mut q, 10_000), Some(UmrDone { tag: 4, error: None }));
    let info = d.query_mkey(live).unwrap();
    assert!(info.free && info.pd == qpd);
    d.destroy_mkey(live).unwrap();
    d.dealloc_pd(client_pd).unwrap();
    q.destroy(&mut d).unwrap();
}

// ---- The command engine carries UMR work (`Client::submit_umr`): results come back on the completion ring
// under the caller's tag, and the engine recovers its QP on its own after an error or a missed deadline. ----

use leasebox_mlx5::command::{ErrorKind, Output};
use leasebox_mlx5::engine::{UMR_OP_GRANT, UMR_OP_REVOKE, UMR_PSEUDO_OPCODE, UMR_TIMEOUT_MS, UmrWork};

/// Pumps both engines until the completion of `tag` comes back (other completions are an error here), at most
/// `secs` seconds of the platform's clock.
#[allow(clippy::result_large_err)]
fn engine_wait(d: &mut common::Hosted, tag: u64, secs: u64) -> Result<Output, leasebox_mlx5::CmdError> {
    let p = d.platform().clone();
    let end = p.now_ns() + secs * 1_000_000_000;
    loop {
        d.pump();
        if let Some(c) = d.client.poll() {
            assert_eq!(c.tag, tag, "a completion for another tag");
            return c.result;
        }
        assert!(p.now_ns() < end, "no completion for tag {tag} within {secs} s");
        p.relax();
    }
}

/// Pumps until the engine's UMR QP is usable again (its recovery done).
fn until_usable(d: &mut common::Hosted) {
    let p = d.platform().clone();
    let end = p.now_ns() + 5_000_000_000;
    while !d.cmd.umr_usable() {
        d.pump();
        assert!(p.now_ns() < end, "the UMR QP did not recover");
        p.relax();
    }
}

fn engine_with_umr() -> (common::Hosted, Pdn, leasebox_mlx5::handles::Qpn) {
    let mut d = common::up();
    let caps = UmrCaps::from_general(&d.info.caps);
    let q = UmrQp::create(&mut d, caps, 6).unwrap();
    let (qpd, qpn) = (q.quarantine_pd(), q.qpn());
    d.cmd.attach_umr(q);
    assert!(d.cmd.umr_usable());
    (d, qpd, qpn)
}

#[test]
fn the_engine_grants_and_revokes_by_tag_through_the_completion_ring() {
    let (mut d, qpd, _) = engine_with_umr();
    let p = d.platform().clone();
    let client_pd = d.alloc_pd().unwrap();
    let key = pool_key(&mut d, qpd, 8, 0x61);
    let mem = p.dma_alloc(2 * PAGE_SIZE, PAGE_SIZE).unwrap();
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let grant = UmrWork::Grant {
        mkey: key,
        new_variant: 0x62,
        pd: client_pd,
        start: mem.addr(),
        len: mem.len() as u64,
        access,
        log_page_size: 12,
        capacity: 8,
        pages: pages(mem),
    };
    d.client.submit_umr(0x1234, grant).unwrap();
    engine_wait(&mut d, 0x1234, 5).unwrap();
    let live = Mkey::new(key.index(), 0x62);
    let info = d.query_mkey(live).unwrap();
    assert!(!info.free && info.pd == client_pd && info.access == access, "{info:?}");
    d.client.submit_umr(0x1235, UmrWork::Revoke { mkey: live }).unwrap();
    engine_wait(&mut d, 0x1235, 5).unwrap();
    let info = d.query_mkey(live).unwrap();
    assert!(info.free && info.pd == qpd, "{info:?}");
    let c = d.cmd.umr_counters().unwrap();
    assert_eq!((c.posted, c.ok, c.failed, c.timeouts, c.recoveries), (2, 2, 0, 0, 0));
    // A tag outside the client's bits is refused before it is queued, with the error it would have had.
    let (_, e) = d.client.submit_umr(1 << 63, UmrWork::Revoke { mkey: live }).unwrap_err();
    assert!(matches!(e.map(|e| e.kind), Some(ErrorKind::ReservedTag { .. })));
    d.destroy_mkey(live).unwrap();
    d.dealloc_pd(client_pd).unwrap();
    p.dma_free(mem);
}

#[test]
fn an_engine_error_completion_is_an_error_result_and_the_engine_recovers_the_qp() {
    use mlx5_model::fault::Fault;
    let (mut d, qpd, qpn) = engine_with_umr();
    let p = d.platform().clone();
    let key = pool_key(&mut d, qpd, 4, 0x71);
    p.model().unwrap().inject(Fault::UmrFail { count: 1, syndrome: 0x4 });
    d.client.submit_umr(7, UmrWork::Revoke { mkey: key }).unwrap();
    let e = engine_wait(&mut d, 7, 5).unwrap_err();
    assert_eq!((e.opcode, e.op_mod), (UMR_PSEUDO_OPCODE, UMR_OP_REVOKE));
    assert!(matches!(e.kind, ErrorKind::Status { status: 0x4, .. }), "{e}");
    // The engine brings the QP back to RTS with its own commands (2ERR, 2RST, RST2INIT, INIT2RTR, RTR2RTS).
    until_usable(&mut d);
    assert_eq!(d.query_qp(qpn).unwrap().state, QpState::Rts);
    d.client.submit_umr(8, UmrWork::Revoke { mkey: key }).unwrap();
    engine_wait(&mut d, 8, 5).unwrap();
    let c = d.cmd.umr_counters().unwrap();
    assert_eq!((c.ok, c.failed, c.recoveries), (1, 1, 1));
    d.destroy_mkey(key).unwrap();
}

#[test]
fn a_missing_engine_completion_times_out_every_tag_in_flight_and_the_engine_recovers() {
    use mlx5_model::fault::Fault;
    let (mut d, qpd, qpn) = engine_with_umr();
    let p = d.platform().clone();
    let a = pool_key(&mut d, qpd, 4, 0x81);
    let b = pool_key(&mut d, qpd, 4, 0x82);
    p.model().unwrap().inject(Fault::UmrHang);
    d.client.submit_umr(21, UmrWork::Revoke { mkey: a }).unwrap();
    let t0 = p.now_ns();
    let e = engine_wait(&mut d, 21, 5).unwrap_err();
    assert!(p.now_ns() - t0 >= UMR_TIMEOUT_MS * 1_000_000, "answered before the deadline");
    assert!(matches!(e.kind, ErrorKind::Timeout { .. }), "{e}");
    // While the QP is recovered, UMR work fails at once (Busy) rather than wait: the caller uses commands.
    if !d.cmd.umr_usable() {
        d.client.submit_umr(22, UmrWork::Revoke { mkey: b }).unwrap();
        let e = engine_wait(&mut d, 22, 5).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Busy), "{e}");
    }
    p.model().unwrap().inject(Fault::Clear);
    until_usable(&mut d);
    d.client
        .submit_umr(
            23,
            UmrWork::Grant {
                mkey: b,
                new_variant: 0x83,
                pd: qpd,
                start: 0x1000,
                len: PAGE_SIZE as u64,
                access: MkeyAccess::REMOTE_READ,
                log_page_size: 12,
                capacity: 4,
                pages: vec![0x10_0000],
            },
        )
        .unwrap();
    engine_wait(&mut d, 23, 5).unwrap();
    assert_eq!(d.cmd.umr_counters().map(|c| (c.timeouts, c.recoveries)), Some((1, 1)));
    assert_eq!(d.query_qp(qpn).unwrap().state, QpState::Rts);
    let _ = UMR_OP_GRANT;
    d.destroy_mkey(a).unwrap();
    d.destroy_mkey(Mkey::new(b.index(), 0x83)).unwrap();
}
