//! Protocol v2's record counters at their limit: each direction's counter is the nonce of its next
//! record, and Noise reserves 2^64 - 1 (docs/wire-protocol.md, "Records"). Started just below it, the last
//! two records go through, and then neither end seals nor opens another: the session ends (the session
//! server closes the connection, the client reports a protocol error) rather than reuse a nonce.

use super::*;

/// A client and a server transport from one handshake.
fn pair() -> (Transport, Transport) {
    let p = prologue(2, 2, 0, "demo");
    let psk = psk_from_key(&[7; 16]);
    let (i, m1) = Initiator::start(&p, &psk, [1; 32]);
    let r = Responder::read(&p, &psk, &m1).unwrap();
    let (m2, server) = r.reply([2; 32], &[0; WELCOME_LEN]).unwrap();
    let (_, client) = i.finish(&m2).unwrap();
    (client, server)
}

#[test]
fn the_last_records_before_the_reserved_counter_pass_then_both_ends_stop() {
    let (mut c, mut s) = pair();
    c.send.n = u64::MAX - 2;
    s.recv.n = u64::MAX - 2;
    let mut wire = Vec::new();
    c.seal(b"next to last", &mut wire).unwrap();
    c.seal_one(b"last", &mut wire).unwrap();
    assert_eq!(c.send.n, u64::MAX);
    let before = wire.len();
    assert_eq!(c.seal(b"one more", &mut wire), Err(CryptoError::Exhausted));
    assert_eq!(c.seal_one(b"", &mut wire), Err(CryptoError::Exhausted));
    assert_eq!(wire.len(), before, "nothing sealed with the reserved nonce");
    s.push(&wire);
    assert_eq!(s.open(), Some(Ok(b"next to last".to_vec())));
    assert_eq!(s.open(), Some(Ok(b"last".to_vec())));
    assert_eq!(s.recv.n, u64::MAX);
    // A record the peer sealed anyway (here: under counter 2^64 - 2 again, a replay) is not opened: the
    // receiving side is exhausted, and stays failed.
    let (mut c2, _) = pair();
    c2.send.n = u64::MAX - 1;
    let mut replay = Vec::new();
    c2.seal(b"x", &mut replay).unwrap();
    s.push(&replay);
    assert_eq!(s.open(), Some(Err(CryptoError::Exhausted)));
    assert_eq!(s.open(), Some(Err(CryptoError::Auth)), "failed for good");
}

/// The counters are per direction: one side at its limit does not stop the other.
#[test]
fn each_direction_has_its_own_counter() {
    let (mut c, mut s) = pair();
    c.send.n = u64::MAX;
    s.recv.n = u64::MAX;
    let mut wire = Vec::new();
    assert_eq!(c.seal(b"up", &mut wire), Err(CryptoError::Exhausted));
    s.seal(b"down", &mut wire).unwrap();
    c.push(&wire);
    assert_eq!(c.open(), Some(Ok(b"down".to_vec())));
}
