//! Both ways a client learns of a revoke, for both teardown orders (docs/revoke-semantics.md), against the hosted
//! appliance with the device model and the software requester:
//! - the appliance's REVOKED notice (the default): the lease is marked gone before the program touches it;
//! - the notice withheld (`revoke_notices=off`): the lease's next work request fails (MKEY first: NAKed with a
//!   remote access error within a round trip; QP first: no answer, its transport retries run out), and the client's
//!   QUERY finds the lease torn down.
//!
//! Each time the client must report the same things: `lease.revoked()`, the failed operation's
//! `Error::Revoked { outcome }`, one `Event::Revoked`, and the other lease in the same batch completing.

use std::time::{Duration, Instant};

mod support;
use support::appliance::{MIB, config, pattern, serial, start_hosted, wait_event};

use leasebox_client::rdma::{RcConfig, SoftConfig};
use leasebox_client::{AllocOptions, Client, Error, Event, Op, Outcome, RequesterConfig, Wait};
use leasebox_proto::{Request, Response};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    Notice,
    FailedCompletionThenQuery,
}

fn revoke_learned(qp_first: bool, way: Way) {
    let _one = serial();
    // A long grace: the revoked lease stays PendingDestroy (QUERY: torn down) for the whole test, so both ways
    // report the same outcome.
    let mut extra = vec!["lease_grace_ms=60000"];
    if way == Way::FailedCompletionThenQuery {
        extra.push("revoke_notices=off");
    }
    let a = start_hosted(&extra);
    let mut appliance = a.appliance();
    // QP first: the appliance's QP is in ERR and drops the request; 16 ms × 4 transport timeouts end it sooner
    // than the default 67 ms × 8 would.
    appliance.requester = RequesterConfig::Soft(SoftConfig {
        peer: a.udp,
        rc: RcConfig { timeout: 12, retry_cnt: 3, ..RcConfig::default() },
        ..SoftConfig::default()
    });
    let client = Client::connect(config(vec![appliance])).unwrap();
    let mut doomed = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let mut kept = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    let src = client.register_owned(pattern(61, 4096)).unwrap();
    // Both work before the revoke.
    let t = client.submit([Op::write_from(&doomed, &src, 0, 0, 4096), Op::write_from(&kept, &src, 0, 0, 4096)]);
    let r = client.wait(Wait::All, Duration::from_secs(10)).unwrap();
    assert!(r.iter().all(|(x, res)| t.contains(x) && matches!(res, Ok(4096))), "{r:?}");

    let mut admin = a.admin();
    let answer = admin.call(&Request::Revoke { lease: doomed.id(), qp_first });
    assert!(matches!(answer, Ok(Response::Revoke { outcome: Outcome::TornDown, .. })), "{answer:?}");
    let revoked_at = Instant::now();

    let is_doomed = |e: &Event| matches!(e, Event::Revoked { lease, .. } if *lease == doomed.id());
    match way {
        Way::Notice => {
            // Learned without touching the lease.
            let e = wait_event(&client, Duration::from_secs(5), is_doomed).expect("no Revoked event: the notice");
            eprintln!("qp_first={qp_first}: the notice came {:?} after the REVOKE's answer", revoked_at.elapsed());
            assert!(matches!(e, Event::Revoked { outcome: Outcome::TornDown, .. }), "{e:?}");
            assert_eq!(doomed.revoked(), Some(Outcome::TornDown));
        }
        Way::FailedCompletionThenQuery => {
            // No notice: nothing tells the client until it uses the lease.
            assert!(wait_event(&client, Duration::from_millis(500), is_doomed).is_none(), "a notice came");
            assert_eq!(doomed.revoked(), None, "the client knew of the revoke without a notice or a failure");
        }
    }

    // One batch over both leases: only the doomed lease's operation fails, with the revoke's outcome.
    let started = Instant::now();
    let t = client.submit([Op::write_from(&doomed, &src, 0, 4096, 4096), Op::write_from(&kept, &src, 0, 4096, 4096)]);
    let r = client.wait(Wait::All, Duration::from_secs(10)).unwrap();
    let result = |i: usize| &r.iter().find(|(x, _)| *x == t[i]).unwrap().1;
    eprintln!("qp_first={qp_first} {way:?}: the batch ended in {:?}", started.elapsed());
    match result(0) {
        Err(Error::Revoked { lease, outcome: Outcome::TornDown }) => assert_eq!(*lease, doomed.id()),
        other => panic!("qp_first={qp_first} {way:?}: the doomed lease's write gave {other:?}"),
    }
    assert!(matches!(result(1), Ok(4096)), "the other lease's write: {:?}", result(1));
    assert_eq!(doomed.revoked(), Some(Outcome::TornDown));
    if way == Way::FailedCompletionThenQuery {
        let e = wait_event(&client, Duration::from_secs(5), is_doomed).expect("no Revoked event after QUERY");
        assert!(matches!(e, Event::Revoked { outcome: Outcome::TornDown, .. }), "{e:?}");
    }
    // The event came once; later calls on the doomed lease fail at once, the kept lease works on.
    assert!(wait_event(&client, Duration::from_millis(200), is_doomed).is_none(), "a second Revoked event");
    let mut back = [0u8; 16];
    assert!(matches!(doomed.read(0, &mut back), Err(Error::Revoked { outcome: Outcome::TornDown, .. })));
    kept.read(4096, &mut back).unwrap();
    assert_eq!(&back[..], &pattern(61, 16)[..]);
    let _ = admin.bye();
}

#[test]
fn mkey_first_revoke_learned_by_the_notice() {
    revoke_learned(false, Way::Notice);
}

#[test]
fn qp_first_revoke_learned_by_the_notice() {
    revoke_learned(true, Way::Notice);
}

#[test]
fn mkey_first_revoke_learned_by_a_failed_completion_and_query() {
    revoke_learned(false, Way::FailedCompletionThenQuery);
}

#[test]
fn qp_first_revoke_learned_by_a_failed_completion_and_query() {
    revoke_learned(true, Way::FailedCompletionThenQuery);
}
