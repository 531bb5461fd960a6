//! The lease service's counters started just below their limits:
//! a slot's generation, the rkey's MKEY index and variant, the PSNs, the slot index in a command's tag. The
//! command tag's sequence has its own test (`the_command_tag_sequence_crosses_its_limits_...`).

use super::*;
use crate::lease::Slot;

/// A slot at generation u32::MAX - 1: it grants u32::MAX - 1, then u32::MAX, and is then retired rather than
/// wrapped (generation 0 is never granted, and no old id of the slot ever names a later lease); the next lease
/// goes to another slot, and the retired slot's memory comes back.
#[test]
fn a_slot_at_its_last_generation_is_retired_not_wrapped() {
    let mut r = Rig::new(cfg());
    r.svc.slots[0] = Slot::Free { next_generation: u32::MAX - 1 };
    let (slots, extents) = (r.svc.free_slots(), r.svc.pool().free_extents());
    let a = r.active();
    assert_eq!((a.slot, a.generation), (0, u32::MAX - 1));
    assert_eq!(r.revoke(a, false), Outcome::TornDown);
    r.sweep();
    let b = r.active();
    assert_eq!((b.slot, b.generation), (0, u32::MAX));
    assert_eq!(code(r.call(TENANT, &Request::Query { lease: a })), Some(ErrorCode::Stale), "the older id is stale");
    assert_eq!(r.revoke(b, false), Outcome::TornDown);
    r.sweep();
    assert!(matches!(r.svc.slots[0], Slot::Free { next_generation: 0 }), "{:?}", r.svc.slots[0]);
    assert_eq!(r.svc.free_slots(), slots - 1, "slot 0 is retired");
    assert_eq!(r.svc.pool().free_extents(), extents, "its memory came back");
    let c = r.active();
    assert_eq!((c.slot, c.generation), (1, 1), "the next lease goes to the next slot");
    for old in [a, b] {
        assert_eq!(code(r.call(TENANT, &Request::Query { lease: old })), Some(ErrorCode::NotFound), "{old:?}");
        assert_eq!(r.revoke(old, false), Outcome::NotFound);
    }
    // A failed build uses up a generation too: slot 1 at its last one, an ALLOC whose INIT2RTR fails retires it.
    assert_eq!(r.revoke(c, false), Outcome::TornDown);
    r.sweep();
    r.svc.slots[1] = Slot::Free { next_generation: u32::MAX };
    r.script(INIT2RTR, &[Answer::Fail]);
    assert_eq!(code(r.call(TENANT, &Request::Alloc(alloc_req()))), Some(ErrorCode::HcaError));
    r.scrubbed();
    assert!(matches!(r.svc.slots[1], Slot::Free { next_generation: 0 }));
    assert_eq!(r.svc.free_slots(), slots - 2);
    assert_eq!((r.active().slot, r.svc.pool().free_extents()), (2, extents - 2));
}

/// The rkey at its limits: MKEY index 2^24 - 1 (the largest `create_mkey_out.mkey_index`) re-used for every
/// lease. Each key is the whole 32 bits `0xffffff << 8 | variant`, and no variant repeats the one the index had
/// just before (the stale rkey never names the new key), through more leases than there are variants.
#[test]
fn the_highest_mkey_index_re_used_never_gets_its_previous_variant() {
    let mut r = Rig::new(cfg());
    r.mkey_index = Some(|_| 0xff_ffff);
    let mut previous = None;
    let mut seen = [false; 256];
    for i in 0..400 {
        let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(alloc_req())) else { panic!("ALLOC {i}") };
        assert_eq!(a.rkey >> 8, 0xff_ffff, "{:#x}", a.rkey);
        let v = a.rkey as u8;
        assert_ne!(Some(v), previous, "lease {i}: the index's previous variant");
        previous = Some(v);
        seen[usize::from(v)] = true;
        assert_eq!(r.revoke(a.lease, false), Outcome::TornDown);
        r.sweep();
    }
    assert!(seen.iter().filter(|s| **s).count() > 200, "variants spread over the 8 bits");
    let k = leasebox_mlx5::handles::Mkey::new(leasebox_mlx5::handles::MkeyIndex(0xff_ffff), 0xff);
    assert_eq!((k.0, k.index().raw(), k.variant()), (u32::MAX, 0xff_ffff, 0xff));
}

/// PSNs are 24 bits: the client's largest (2^24 - 1) is accepted and programmed as the QP's `next_rcv_psn`,
/// 2^24 is refused naming the field, and every initial PSN the service draws is below 2^24 and reaches its top.
#[test]
fn psns_at_the_top_of_their_24_bits() {
    let mut r = Rig::new(cfg());
    let req = AllocReq { client_psn: 0xff_ffff, ..alloc_req() };
    let Ok(Response::Alloc(a)) = r.call(TENANT, &Request::Alloc(req)) else { panic!("ALLOC") };
    // init2rtr_qp_in.qpc (bit 0xc0), next_rcv_psn at qpc bit 0x4a8; rtr2rts_qp_in's next_send_psn at 0x3c8.
    let rtr = &r.inputs[&INIT2RTR];
    use leasebox_mlx5::ifc::qp::{QPC, qpc};
    assert_eq!(qpc::NEXT_RCV_PSN.at(QPC).read(rtr), 0xff_ffff);
    let rts = &r.inputs[&RTR2RTS];
    assert_eq!(qpc::NEXT_SEND_PSN.at(QPC).read(rts), a.server_psn);
    let e = r.call(TENANT, &Request::Alloc(AllocReq { client_psn: 0x100_0000, ..alloc_req() })).unwrap_err();
    assert!(e.code == ErrorCode::BadParam && e.message.contains("alloc.client_psn"), "{e:?}");
    let mut ids = ids::Ids::new(leasebox_session::IdRng::from_seed([9; 32]));
    let top = (0..100_000).map(|_| ids.psn()).inspect(|&p| assert!(p <= 0xff_ffff, "{p:#x}")).max();
    assert!(top.unwrap() >= 0xff_0000);
}

/// A command's tag at its limits: the largest slot with the largest sequence number is a tag the engine takes
/// and gives the slot back; the table itself stops at 2^20 slots (`Config::check`).
#[test]
fn the_largest_slot_and_sequence_make_a_tag_the_engine_takes() {
    for slot in [0, (1 << 20) - 1, u32::MAX] {
        let tag = tag_of(SEQ_MAX, slot);
        assert_eq!(tag & !leasebox_mlx5::engine::CLIENT_TAG_BITS, 0, "slot {slot:#x}");
        assert_eq!((tag_slot(tag), tag >> SLOT_BITS), (slot, SEQ_MAX));
    }
    assert!(Config { slots: 1 << 20, ..Config::default() }.check().is_ok());
    let e = Config { slots: (1 << 20) + 1, ..Config::default() }.check().unwrap_err();
    assert_eq!(e.0, "slots must be 1 to 1048576");
}

/// Found by the soak (`service::soak`): an HCA acts on DESTROY_MKEY before its completion is read, and may hand
/// the index to a CREATE_MKEY whose completion is read first. The index must already be retired with the
/// revoked key's variant then, or the new lease can be granted the very rkey the revoked lease's client still
/// holds (1 in 256 such races did, when the index was retired only at the destroy's completion).
#[test]
fn an_index_is_retired_when_its_destroy_is_issued_not_when_its_completion_is_read() {
    let mut r = Rig::new(cfg());
    r.mkey_index = Some(|_| 0x77);
    let alloc = |r: &mut Rig| match r.call(TENANT, &Request::Alloc(alloc_req())) {
        Ok(Response::Alloc(a)) => a,
        other => panic!("ALLOC: {other:?}"),
    };
    let mut current = alloc(&mut r);
    for i in 0..300 {
        r.script(DESTROY_MKEY, &[Answer::Hang]);
        let t = r.send(ADMIN, &Request::Revoke { lease: current.lease, qp_first: false });
        assert!(r.take(t).is_none(), "the outcome waits for the destroy");
        assert_eq!(r.svc.ids.retired_variant(0x77), Some(current.rkey as u8), "iteration {i}");
        // The HCA re-uses index 0x77 for the next lease before the destroy's completion is read.
        let next = alloc(&mut r);
        assert_eq!(next.rkey >> 8, 0x77);
        assert_ne!(next.rkey, current.rkey, "iteration {i}: the revoked lease's rkey names the new lease");
        r.late(Answer::Ok);
        assert!(matches!(r.take(t), Some(Ok(Response::Revoke { outcome: Outcome::TornDown, .. }))));
        r.sweep();
        current = next;
    }
}
