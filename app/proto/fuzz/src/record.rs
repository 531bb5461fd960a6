//! The protocol v2 check shared by the fuzz target `record` (`fuzz_targets/record.rs`, libFuzzer, nightly) and
//! its stable twin (`app/proto/tests/record_twin.rs`); both include this file by path.
//!
//! What a peer controls after HELLO is every byte of the Noise handshake message it sends and every record
//! after it. One input is a script, its first byte choosing what it drives:
//! - `0`: the rest, cut or padded to 48 bytes, is message 1 as the server reads it (`Responder::read`); bit 0
//!   of the second byte set: the real message 1 of the fixed handshake with the rest XORed over it;
//! - `1`: the same for message 2 as the client reads it (`Initiator::finish`);
//! - anything else: a record stream from the client's `Transport` to the server's, opened by
//!   `Transport::open` after every push. The rest of the input is a list of steps, each one byte `op` then its
//!   operands: `op % 4 == 0` seal the next `n` bytes (`n` = the following byte) and push the record whole;
//!   `1` seal them and flip one bit of the record (position from the following byte) before pushing; `2` push
//!   the next `n` bytes as they are (noise); `3` seal them and push the record in two pieces.
//!
//! Checked: no panic whatever the bytes; a handshake message that is not the one the fixed handshake wrote
//! never verifies; every record that opens gives exactly the plaintext the client sealed next (a flipped bit,
//! noise or a cut never yields other bytes, nor skips or repeats a record); once `open` fails it fails for
//! good and buffers nothing more; an untouched stream opens completely.

use leasebox_proto::v2::{
    Announce, CryptoError, Initiator, MSG1_LEN, MSG2_LEN, RECORD_HEADER_LEN, Responder, TAG_LEN, Transport, prologue,
    psk_from_key,
};
use std::collections::VecDeque;

/// What one input exercised (the twin sums these to show its inputs reach every outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub handshakes_refused: u64,
    pub handshakes_accepted: u64,
    pub records_opened: u64,
    pub failed_auth: u64,
    pub failed_length: u64,
}

impl core::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.handshakes_refused += o.handshakes_refused;
        self.handshakes_accepted += o.handshakes_accepted;
        self.records_opened += o.records_opened;
        self.failed_auth += o.failed_auth;
        self.failed_length += o.failed_length;
    }
}

/// The fixed handshake: its two messages and the transports of each end.
pub struct Handshake {
    pub msg1: [u8; MSG1_LEN],
    pub msg2: [u8; MSG2_LEN],
    pub client: Transport,
    pub server: Transport,
}

fn prologue_and_psk() -> (Vec<u8>, [u8; 32]) {
    (prologue(2, 2, 0, "fuzz"), psk_from_key(&[0x5a; 16]))
}

fn welcome() -> Announce {
    Announce {
        version: 2,
        role: 1,
        credits: 8,
        heartbeat_ms: 10_000,
        session_id: 7,
        boot_id: [0xb0; 16],
        resume_token: [0x70; 16],
    }
}

/// Runs the handshake with fixed ephemeral keys (the same bytes every time).
pub fn handshake() -> Handshake {
    let (p, psk) = prologue_and_psk();
    let (i, msg1) = Initiator::start(&p, &psk, [1; 32]);
    let r = Responder::read(&p, &psk, &msg1).expect("the fixed message 1 verifies");
    let (msg2, server) = r.reply([2; 32], &welcome().encode()).expect("the fixed ephemeral is not low order");
    let (w, client) = Initiator::finish(i, &msg2).expect("the fixed message 2 verifies");
    assert_eq!(Announce::decode(&w), welcome());
    Handshake { msg1, msg2, client, server }
}

/// Reads bytes off the front of the script.
struct Script<'a>(&'a [u8]);

impl<'a> Script<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// `len` bytes from `fill`, or the fixed message XORed with `fill` when `over` is set.
fn message<const N: usize>(fixed: &[u8; N], over: bool, fill: &[u8]) -> [u8; N] {
    let mut m = if over { *fixed } else { [0; N] };
    for (m, f) in m.iter_mut().zip(fill) {
        if over {
            *m ^= f;
        } else {
            *m = *f;
        }
    }
    m
}

/// Runs one input; panics (which the fuzzer reports) when a property does not hold.
pub fn check(data: &[u8]) -> Counts {
    let mut n = Counts::default();
    let mut s = Script(data);
    let Some(mode) = s.byte() else { return n };
    let (p, psk) = prologue_and_psk();
    match mode {
        0 | 1 => {
            let over = s.byte().is_some_and(|b| b & 1 != 0);
            let fill = s.take(usize::MAX);
            let hs = handshake();
            let (accepted, same) = if mode == 0 {
                let m = message(&hs.msg1, over, fill);
                (Responder::read(&p, &psk, &m).is_ok(), m == hs.msg1)
            } else {
                let (i, _) = Initiator::start(&p, &psk, [1; 32]);
                let m = message(&hs.msg2, over, fill);
                (i.finish(&m).is_ok(), m == hs.msg2)
            };
            assert_eq!(accepted, same, "only the handshake's own message verifies");
            if accepted {
                n.handshakes_accepted += 1;
            } else {
                n.handshakes_refused += 1;
            }
        }
        _ => records(&mut s, &mut n),
    }
    n
}

fn records(s: &mut Script<'_>, n: &mut Counts) {
    let Handshake { mut client, mut server, .. } = handshake();
    // Plaintexts sealed and not yet opened, in order.
    let mut expected: VecDeque<Vec<u8>> = VecDeque::new();
    let mut tampered = false;
    let mut failed = false;
    while let Some(op) = s.byte() {
        let len = usize::from(s.byte().unwrap_or(0));
        let plain = s.take(len).to_vec();
        let mut wire = Vec::new();
        if op % 4 != 2 {
            client.seal_one(&plain, &mut wire).expect("a short plaintext seals");
            assert_eq!(wire.len(), RECORD_HEADER_LEN + plain.len() + TAG_LEN);
            expected.push_back(plain.clone());
        }
        match op % 4 {
            0 => server.push(&wire),
            1 => {
                let at = usize::from(s.byte().unwrap_or(0)) % wire.len();
                wire[at] ^= 1 << (op >> 5);
                tampered = true;
                server.push(&wire);
            }
            2 => {
                tampered |= !plain.is_empty();
                server.push(&plain);
            }
            _ => {
                let cut = usize::from(s.byte().unwrap_or(0)) % (wire.len() + 1);
                server.push(&wire[..cut]);
                drain(&mut server, &mut expected, &mut failed, n);
                server.push(&wire[cut..]);
            }
        }
        drain(&mut server, &mut expected, &mut failed, n);
        if failed {
            assert_eq!(server.buffered(), 0, "a failed record layer keeps nothing");
        }
    }
    if !tampered {
        assert!(!failed, "an untouched stream never fails");
        assert!(expected.is_empty(), "an untouched stream opens completely: {} left", expected.len());
        assert_eq!(server.buffered(), 0);
    }
}

/// Opens every complete record.
fn drain(server: &mut Transport, expected: &mut VecDeque<Vec<u8>>, failed: &mut bool, n: &mut Counts) {
    loop {
        if let Some(len) = server.pending_record() {
            assert!(len >= RECORD_HEADER_LEN);
        }
        match server.open() {
            None => {
                assert!(!*failed, "a failed record layer answers every call with an error");
                return;
            }
            Some(Ok(plain)) => {
                assert!(!*failed, "nothing opens after a failure");
                let want = expected.pop_front().expect("a record opened that nobody sealed");
                assert_eq!(plain, want, "a record opened to other bytes than were sealed");
                n.records_opened += 1;
            }
            Some(Err(e)) => {
                if *failed {
                    assert_eq!(e, CryptoError::Auth, "after a failure every call fails the same way");
                    return;
                }
                match e {
                    CryptoError::Auth => n.failed_auth += 1,
                    CryptoError::Length => n.failed_length += 1,
                    other => panic!("opening a record cannot fail with {other:?}"),
                }
                *failed = true;
            }
        }
    }
}
