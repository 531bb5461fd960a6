//! Protocol v2: the Noise handshake `Noise_NNpsk0_25519_ChaChaPoly_SHA256` (Noise spec rev. 34, sections 5 and
//! 9) carried in HELLO, and the record layer that protects every byte after it (docs/wire-protocol.md,
//! "Protocol v2"). The primitives are RustCrypto's and dalek's (`x25519-dalek`, `chacha20poly1305`, `hkdf`,
//! `hmac`, `sha2`); this module only strings them together as the Noise spec says.
//!
//! ```text
//! NNpsk0:
//!   -> psk, e          HELLO step 3: e.pub ‖ AEAD(empty)                 (48 bytes)
//!   <- e, ee           HELLO step 3 answer: e.pub ‖ AEAD(welcome, 49 B)  (97 bytes)
//! ```
//!
//! The prologue binds what the client sends in clear (versions, key id, name); the responder's encrypted
//! payload carries everything the server announces. Split() gives one ChaCha20-Poly1305 key per direction; a
//! record is `u16 length ‖ Noise transport message` (the spec's section 13 framing): ChaCha20-Poly1305 with empty
//! associated data and the per-direction counter as nonce, so a record that is altered, replayed, reordered,
//! cut short or moved to another session fails its tag.

use alloc::vec::Vec;
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

/// The Noise protocol name (hashed into the initial handshake state).
pub const PROTOCOL_NAME: &[u8] = b"Noise_NNpsk0_25519_ChaChaPoly_SHA256";
/// The protocol version HELLO step 3 negotiates.
pub const VERSION: u16 = 2;
/// What the prologue starts with.
pub const PROLOGUE_LABEL: &[u8] = b"leasebox control v2";
/// The label of the PSK derivation: `psk = HMAC-SHA256(configured key, PSK_LABEL)`.
pub const PSK_LABEL: &[u8] = b"leasebox v2 psk";
pub const DH_LEN: usize = 32;
pub const TAG_LEN: usize = 16;
/// Handshake message 1: `e.pub ‖ tag` (the payload is empty).
pub const MSG1_LEN: usize = DH_LEN + TAG_LEN;
/// The server's announcement inside message 2: version u16, role u8, credits u16, heartbeat_ms u32,
/// session_id u64, boot_id (16), resume_token (16).
pub const WELCOME_LEN: usize = 49;
/// Where the announcement's boot id and resume token lie (their lengths are the message layer's).
const BOOT_AT: usize = 17;
const TOKEN_AT: usize = BOOT_AT + crate::BOOT_ID_LEN;
const _: () = assert!(TOKEN_AT + crate::RESUME_TOKEN_LEN == WELCOME_LEN);
/// Handshake message 2: `e.pub ‖ AEAD(welcome)`.
pub const MSG2_LEN: usize = DH_LEN + WELCOME_LEN + TAG_LEN;
/// The record header: the ciphertext length, big-endian.
pub const RECORD_HEADER_LEN: usize = 2;
/// Most plaintext bytes one record carries (one largest frame).
pub const MAX_RECORD_PLAIN: usize = crate::HEADER_LEN + crate::MAX_PAYLOAD;
/// Most ciphertext bytes one record carries.
pub const MAX_RECORD: usize = MAX_RECORD_PLAIN + TAG_LEN;

type HmacSha256 = Hmac<Sha256>;

/// A handshake message or record failed authentication, or was malformed: the connection must close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CryptoError {
    /// The AEAD tag did not verify (wrong key, altered, replayed, reordered or misplaced bytes).
    Auth,
    /// A length outside what the protocol allows.
    Length,
    /// 2^64 - 1 records in one direction: the session must end.
    Exhausted,
    /// The peer's ephemeral key is a low-order point: the DH result would be all zeros, the same whatever our
    /// key, so the handshake would not be contributory (RFC 7748 §6.1).
    LowOrder,
}

impl core::fmt::Display for CryptoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            CryptoError::Auth => "record or handshake message failed authentication",
            CryptoError::Length => "record length outside 16..=16416 bytes",
            CryptoError::Exhausted => "record counter exhausted",
            CryptoError::LowOrder => "the peer's ephemeral key is a low-order point",
        })
    }
}

/// The 32-byte Noise PSK of a configured key (16 to 64 bytes): `HMAC-SHA256(key, "leasebox v2 psk")`.
pub fn psk_from_key(key: &[u8]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    m.update(PSK_LABEL);
    m.finalize().into_bytes().into()
}

/// The prologue: `"leasebox control v2" ‖ min_version ‖ max_version ‖ key_id ‖ len(name) ‖ name` (integers
/// big-endian), i.e. everything HELLO step 3 carries in clear before the Noise message. For an appliance
/// that has a name, [`prologue_for`].
pub fn prologue(min_version: u16, max_version: u16, key_id: u8, name: &str) -> Vec<u8> {
    prologue_for(min_version, max_version, key_id, name, "")
}

/// The prologue of a HELLO meant for the appliance named `appliance` (`appliance=`): [`prologue`] followed by
/// `len(appliance) ‖ appliance` when the name is not empty (an appliance without a name has the prologue of
/// [`prologue`], byte for byte). Both ends must agree on the name, so a HELLO for one appliance fails on
/// another that holds the same key.
pub fn prologue_for(min_version: u16, max_version: u16, key_id: u8, name: &str, appliance: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROLOGUE_LABEL.len() + 6 + name.len());
    p.extend_from_slice(PROLOGUE_LABEL);
    p.extend_from_slice(&min_version.to_be_bytes());
    p.extend_from_slice(&max_version.to_be_bytes());
    p.push(key_id);
    p.push(name.len() as u8);
    p.extend_from_slice(name.as_bytes());
    if !appliance.is_empty() {
        p.push(appliance.len().min(255) as u8);
        p.extend_from_slice(&appliance.as_bytes()[..appliance.len().min(255)]);
    }
    p
}

/// One direction's ChaCha20-Poly1305 key and counter (Noise's CipherState).
pub struct CipherState {
    aead: ChaCha20Poly1305,
    /// The next record's nonce, 0 up. At 2^64 - 1, which Noise reserves, the direction is exhausted: every
    /// later `encrypt`/`decrypt` fails with [`CryptoError::Exhausted`] and the session must end (the server
    /// closes it); the counter never wraps, so no nonce is used twice (`limits` tests). At 10^9 records a
    /// second that is 584 years away.
    n: u64,
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::from(b)
}

impl CipherState {
    fn new(k: &[u8; 32]) -> Self {
        CipherState { aead: ChaCha20Poly1305::new(Key::from_slice(k)), n: 0 }
    }

    /// Encrypts `buf` in place with `ad` and appends the tag.
    fn encrypt(&mut self, ad: &[u8], buf: &mut Vec<u8>) -> Result<(), CryptoError> {
        if self.n == u64::MAX {
            return Err(CryptoError::Exhausted);
        }
        let tag = self.aead.encrypt_in_place_detached(&nonce(self.n), ad, buf).map_err(|_| CryptoError::Length)?;
        buf.extend_from_slice(&tag);
        self.n += 1;
        Ok(())
    }

    /// Checks and decrypts `buf` (ciphertext ‖ tag) in place; on success `buf` holds the plaintext.
    fn decrypt(&mut self, ad: &[u8], buf: &mut Vec<u8>) -> Result<(), CryptoError> {
        if self.n == u64::MAX {
            return Err(CryptoError::Exhausted);
        }
        let Some(split) = buf.len().checked_sub(TAG_LEN) else { return Err(CryptoError::Length) };
        let tag = Tag::clone_from_slice(&buf[split..]);
        buf.truncate(split);
        self.aead.decrypt_in_place_detached(&nonce(self.n), ad, buf, &tag).map_err(|_| CryptoError::Auth)?;
        self.n += 1;
        Ok(())
    }
}

/// Noise's SymmetricState (chaining key, handshake hash, and the current key once there is one).
struct Symmetric {
    ck: [u8; 32],
    h: [u8; 32],
    k: Option<CipherState>,
}

impl Symmetric {
    fn new(prologue: &[u8]) -> Self {
        // The name is longer than HASHLEN, so h = HASH(name).
        let h: [u8; 32] = Sha256::digest(PROTOCOL_NAME).into();
        let mut s = Symmetric { ck: h, h, k: None };
        s.mix_hash(prologue);
        s
    }

    fn mix_hash(&mut self, data: &[u8]) {
        let mut d = Sha256::new();
        d.update(self.h);
        d.update(data);
        self.h = d.finalize().into();
    }

    /// HKDF(ck, ikm) with `N` outputs (RFC 5869 with salt = ck and empty info is exactly Noise's HKDF).
    fn hkdf<const N: usize>(&self, ikm: &[u8]) -> [[u8; 32]; N] {
        let mut okm = [[0u8; 32]; N];
        let hk = Hkdf::<Sha256>::new(Some(&self.ck), ikm);
        let mut flat = [0u8; 96];
        hk.expand(&[], &mut flat[..32 * N]).expect("at most 3 outputs of 32 bytes");
        for (i, o) in okm.iter_mut().enumerate() {
            o.copy_from_slice(&flat[32 * i..32 * (i + 1)]);
        }
        okm
    }

    fn mix_key(&mut self, ikm: &[u8]) {
        let [ck, k] = self.hkdf::<2>(ikm);
        self.ck = ck;
        self.k = Some(CipherState::new(&k));
    }

    fn mix_key_and_hash(&mut self, ikm: &[u8]) {
        let [ck, th, k] = self.hkdf::<3>(ikm);
        self.ck = ck;
        self.mix_hash(&th);
        self.k = Some(CipherState::new(&k));
    }

    fn encrypt_and_hash(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), CryptoError> {
        let mut buf = plain.to_vec();
        let h = self.h;
        self.k.as_mut().ok_or(CryptoError::Auth)?.encrypt(&h, &mut buf)?;
        self.mix_hash(&buf);
        out.extend_from_slice(&buf);
        Ok(())
    }

    fn decrypt_and_hash(&mut self, cipher: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let mut buf = cipher.to_vec();
        let h = self.h;
        self.k.as_mut().ok_or(CryptoError::Auth)?.decrypt(&h, &mut buf)?;
        self.mix_hash(cipher);
        Ok(buf)
    }

    /// Split(): (initiator → responder, responder → initiator).
    fn split(&self) -> (CipherState, CipherState) {
        let [k1, k2] = self.hkdf::<2>(&[]);
        (CipherState::new(&k1), CipherState::new(&k2))
    }
}

/// The client's side between message 1 and message 2.
pub struct Initiator {
    s: Symmetric,
    e: StaticSecret,
}

impl Initiator {
    /// Writes message 1 (`psk, e`, empty payload) with ephemeral private key `e` (32 random bytes).
    pub fn start(prologue: &[u8], psk: &[u8; 32], e: [u8; 32]) -> (Initiator, [u8; MSG1_LEN]) {
        let mut s = Symmetric::new(prologue);
        s.mix_key_and_hash(psk);
        let e = StaticSecret::from(e);
        let epub = PublicKey::from(&e);
        s.mix_hash(epub.as_bytes());
        s.mix_key(epub.as_bytes());
        let mut msg = Vec::with_capacity(MSG1_LEN);
        msg.extend_from_slice(epub.as_bytes());
        s.encrypt_and_hash(&[], &mut msg).expect("the key is set");
        let mut out = [0u8; MSG1_LEN];
        out.copy_from_slice(&msg);
        (Initiator { s, e }, out)
    }

    /// Reads message 2 (`e, ee`): the server's announcement and the session's transport keys, or
    /// [`CryptoError::Auth`] when the server does not hold the key (or the message is not for this handshake).
    pub fn finish(mut self, msg2: &[u8; MSG2_LEN]) -> Result<([u8; WELCOME_LEN], Transport), CryptoError> {
        let mut re = [0u8; DH_LEN];
        re.copy_from_slice(&msg2[..DH_LEN]);
        self.s.mix_hash(&re);
        self.s.mix_key(&re);
        let dh = self.e.diffie_hellman(&PublicKey::from(re));
        if !dh.was_contributory() {
            return Err(CryptoError::LowOrder);
        }
        self.s.mix_key(dh.as_bytes());
        let plain = self.s.decrypt_and_hash(&msg2[DH_LEN..])?;
        let mut w = [0u8; WELCOME_LEN];
        w.copy_from_slice(&plain);
        let (c1, c2) = self.s.split();
        Ok((w, Transport::new(c1, c2, self.s.h)))
    }
}

/// The server's side after a message 1 that verified.
pub struct Responder {
    s: Symmetric,
    re: [u8; DH_LEN],
}

impl Responder {
    /// Reads message 1 under `psk`. The work is the same whether `psk` is a principal's or a stand-in for an
    /// unknown name; only the tag check tells them apart.
    pub fn read(prologue: &[u8], psk: &[u8; 32], msg1: &[u8; MSG1_LEN]) -> Result<Responder, CryptoError> {
        let mut s = Symmetric::new(prologue);
        s.mix_key_and_hash(psk);
        let mut re = [0u8; DH_LEN];
        re.copy_from_slice(&msg1[..DH_LEN]);
        s.mix_hash(&re);
        s.mix_key(&re);
        let payload = s.decrypt_and_hash(&msg1[DH_LEN..])?;
        if !payload.is_empty() {
            return Err(CryptoError::Length);
        }
        Ok(Responder { s, re })
    }

    /// Writes message 2 with ephemeral private key `e` and the server's announcement; refuses a client
    /// ephemeral of low order ([`CryptoError::LowOrder`]).
    pub fn reply(
        mut self,
        e: [u8; 32],
        welcome: &[u8; WELCOME_LEN],
    ) -> Result<([u8; MSG2_LEN], Transport), CryptoError> {
        let e = StaticSecret::from(e);
        let epub = PublicKey::from(&e);
        self.s.mix_hash(epub.as_bytes());
        self.s.mix_key(epub.as_bytes());
        let dh = e.diffie_hellman(&PublicKey::from(self.re));
        if !dh.was_contributory() {
            return Err(CryptoError::LowOrder);
        }
        self.s.mix_key(dh.as_bytes());
        let mut msg = Vec::with_capacity(MSG2_LEN);
        msg.extend_from_slice(epub.as_bytes());
        self.s.encrypt_and_hash(welcome, &mut msg).expect("the key is set");
        let mut out = [0u8; MSG2_LEN];
        out.copy_from_slice(&msg);
        let (c1, c2) = self.s.split();
        // The responder sends with the second key and receives with the first.
        Ok((out, Transport::new(c2, c1, self.s.h)))
    }
}

/// A session's record layer: seals outgoing bytes into records, opens incoming records in order.
pub struct Transport {
    send: CipherState,
    recv: CipherState,
    rx: Vec<u8>,
    handshake_hash: [u8; 32],
    failed: bool,
}

impl Transport {
    fn new(send: CipherState, recv: CipherState, handshake_hash: [u8; 32]) -> Self {
        Transport { send, recv, rx: Vec::new(), handshake_hash, failed: false }
    }

    /// The final handshake hash (equal on both ends of one handshake).
    pub fn handshake_hash(&self) -> [u8; 32] {
        self.handshake_hash
    }

    /// Seals `plain` into records of at most [`MAX_RECORD_PLAIN`] bytes each, appended to `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), CryptoError> {
        for chunk in plain.chunks(MAX_RECORD_PLAIN) {
            let len = ((chunk.len() + TAG_LEN) as u16).to_be_bytes();
            let mut buf = chunk.to_vec();
            self.send.encrypt(&[], &mut buf)?;
            out.extend_from_slice(&len);
            out.extend_from_slice(&buf);
        }
        Ok(())
    }

    /// Seals `plain` (at most [`MAX_RECORD_PLAIN`] bytes, possibly none) into exactly one record: tests and
    /// tools use it for records [`Transport::seal`] never makes (an empty one, one frame split across two).
    pub fn seal_one(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), CryptoError> {
        if plain.len() > MAX_RECORD_PLAIN {
            return Err(CryptoError::Length);
        }
        let len = ((plain.len() + TAG_LEN) as u16).to_be_bytes();
        let mut buf = plain.to_vec();
        self.send.encrypt(&[], &mut buf)?;
        out.extend_from_slice(&len);
        out.extend_from_slice(&buf);
        Ok(())
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        if !self.failed {
            self.rx.extend_from_slice(data);
        }
    }

    /// Bytes received and not yet opened.
    pub fn buffered(&self) -> usize {
        self.rx.len()
    }

    /// The size on the wire (header included) of the record being received, once its length has arrived.
    pub fn pending_record(&self) -> Option<usize> {
        let len_bytes: [u8; 2] = self.rx.get(..RECORD_HEADER_LEN)?.try_into().ok()?;
        Some(RECORD_HEADER_LEN + usize::from(u16::from_be_bytes(len_bytes)))
    }

    /// The next record's plaintext: `None` while incomplete; an error (for good: every later call fails too)
    /// when a record fails authentication or its length is impossible.
    pub fn open(&mut self) -> Option<Result<Vec<u8>, CryptoError>> {
        if self.failed {
            return Some(Err(CryptoError::Auth));
        }
        let len_bytes: [u8; 2] = self.rx.get(..RECORD_HEADER_LEN)?.try_into().ok()?;
        let len = usize::from(u16::from_be_bytes(len_bytes));
        if !(TAG_LEN..=MAX_RECORD).contains(&len) {
            self.failed = true;
            self.rx.clear();
            return Some(Err(CryptoError::Length));
        }
        if self.rx.len() < RECORD_HEADER_LEN + len {
            return None;
        }
        let mut buf = self.rx[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len].to_vec();
        self.rx.drain(..RECORD_HEADER_LEN + len);
        match self.recv.decrypt(&[], &mut buf) {
            Ok(()) => Some(Ok(buf)),
            Err(e) => {
                self.failed = true;
                self.rx.clear();
                Some(Err(e))
            }
        }
    }
}

/// The server's announcement in message 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Announce {
    pub version: u16,
    pub role: u8,
    pub credits: u16,
    pub heartbeat_ms: u32,
    pub session_id: u64,
    /// This boot's random id: part of every lease id (`LeaseId::boot_id`).
    pub boot_id: [u8; crate::BOOT_ID_LEN],
    /// The secret that lets a later session of the same principal take this session's leases over (RESUME).
    pub resume_token: [u8; crate::RESUME_TOKEN_LEN],
}

impl Announce {
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[0..2].copy_from_slice(&self.version.to_be_bytes());
        b[2] = self.role;
        b[3..5].copy_from_slice(&self.credits.to_be_bytes());
        b[5..9].copy_from_slice(&self.heartbeat_ms.to_be_bytes());
        b[9..17].copy_from_slice(&self.session_id.to_be_bytes());
        b[BOOT_AT..TOKEN_AT].copy_from_slice(&self.boot_id);
        b[TOKEN_AT..].copy_from_slice(&self.resume_token);
        b
    }

    pub fn decode(b: &[u8; WELCOME_LEN]) -> Self {
        Announce {
            version: u16::from_be_bytes([b[0], b[1]]),
            role: b[2],
            credits: u16::from_be_bytes([b[3], b[4]]),
            heartbeat_ms: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
            session_id: u64::from_be_bytes([b[9], b[10], b[11], b[12], b[13], b[14], b[15], b[16]]),
            boot_id: b[BOOT_AT..TOKEN_AT].try_into().unwrap_or_default(),
            resume_token: b[TOKEN_AT..].try_into().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod limits;
#[cfg(test)]
mod tests {
    use super::*;

    /// Message 1 as a key holder would write it with ephemeral public key `epub` (any bytes, a low-order
    /// point included).
    fn msg1_with(p: &[u8], psk: &[u8; 32], epub: [u8; 32]) -> [u8; MSG1_LEN] {
        let mut s = Symmetric::new(p);
        s.mix_key_and_hash(psk);
        s.mix_hash(&epub);
        s.mix_key(&epub);
        let mut msg = epub.to_vec();
        s.encrypt_and_hash(&[], &mut msg).unwrap();
        msg.try_into().unwrap()
    }

    #[test]
    fn a_low_order_ephemeral_is_refused() {
        let p = prologue(2, 2, 0, "demo");
        let psk = psk_from_key(&[7; 16]);
        let mut order8 = [0u8; 32];
        for (i, b) in order8.iter_mut().enumerate() {
            let hex = "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800";
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        let mut one = [0u8; 32];
        one[0] = 1;
        for epub in [[0u8; 32], one, order8] {
            // The tag verifies (the sender holds the PSK); the DH is what gives it away.
            let r = Responder::read(&p, &psk, &msg1_with(&p, &psk, epub)).expect("a key holder's message 1");
            assert_eq!(r.reply([2; 32], &[0; WELCOME_LEN]).err(), Some(CryptoError::LowOrder), "{epub:02x?}");
        }
        // A proper ephemeral, written the same way, goes through.
        let good = *PublicKey::from(&StaticSecret::from([1u8; 32])).as_bytes();
        let r = Responder::read(&p, &psk, &msg1_with(&p, &psk, good)).unwrap();
        assert!(r.reply([2; 32], &[0; WELCOME_LEN]).is_ok());
    }

    fn pair() -> (Transport, Transport, [u8; WELCOME_LEN]) {
        let p = prologue(2, 2, 0, "demo");
        let psk = psk_from_key(&[7; 16]);
        let (i, m1) = Initiator::start(&p, &psk, [1; 32]);
        let r = Responder::read(&p, &psk, &m1).unwrap();
        let a = Announce {
            version: 2,
            role: 1,
            credits: 8,
            heartbeat_ms: 10_000,
            session_id: 5,
            boot_id: [0xb0; 16],
            resume_token: [0x70; 16],
        };
        let (m2, st) = r.reply([2; 32], &a.encode()).unwrap();
        let (w, ct) = i.finish(&m2).unwrap();
        assert_eq!(Announce::decode(&w), a);
        assert_eq!(ct.handshake_hash(), st.handshake_hash());
        (ct, st, w)
    }

    #[test]
    fn records_round_trip_and_tampering_fails() {
        let (mut c, mut s, _) = pair();
        let mut wire = Vec::new();
        c.seal(b"hello", &mut wire).unwrap();
        c.seal(b"world", &mut wire).unwrap();
        s.push(&wire);
        assert_eq!(s.open(), Some(Ok(b"hello".to_vec())));
        assert_eq!(s.open(), Some(Ok(b"world".to_vec())));
        assert_eq!(s.open(), None);
        // A replayed record fails (the counter moved on), and the transport stays failed.
        s.push(&wire[..wire.len() / 2]);
        assert_eq!(s.open(), Some(Err(CryptoError::Auth)));
        assert_eq!(s.open(), Some(Err(CryptoError::Auth)));
    }

    #[test]
    fn wrong_psk_or_prologue_fails_message_1() {
        let p = prologue(2, 2, 0, "demo");
        let psk = psk_from_key(&[7; 16]);
        let (_, m1) = Initiator::start(&p, &psk, [1; 32]);
        assert!(Responder::read(&p, &psk_from_key(&[8; 16]), &m1).is_err());
        assert!(Responder::read(&prologue(2, 2, 1, "demo"), &psk, &m1).is_err());
        assert!(Responder::read(&prologue(2, 2, 0, "demp"), &psk, &m1).is_err());
    }

    /// The same handshake and records through `snow`, an independent implementation of the Noise spec.
    #[test]
    fn interoperates_with_snow() {
        let p = prologue(2, 2, 3, "demo");
        let psk = psk_from_key(&[9; 32]);
        let mut r = snow::Builder::new(core::str::from_utf8(PROTOCOL_NAME).unwrap().parse().unwrap())
            .prologue(&p)
            .psk(0, &psk)
            .build_responder()
            .unwrap();
        let (i, m1) = Initiator::start(&p, &psk, [4; 32]);
        let mut buf = [0u8; 256];
        assert_eq!(r.read_message(&m1, &mut buf).unwrap(), 0);
        let w = [0x5a; WELCOME_LEN];
        let n = r.write_message(&w, &mut buf).unwrap();
        assert_eq!(n, MSG2_LEN);
        let (got, mut ct) = i.finish(buf[..MSG2_LEN].try_into().unwrap()).unwrap();
        assert_eq!(got, w);
        let mut st = r.into_transport_mode().unwrap();
        let mut wire = Vec::new();
        ct.seal(b"ping", &mut wire).unwrap();
        assert_eq!(u16::from_be_bytes([wire[0], wire[1]]) as usize, wire.len() - 2);
        let n = st.read_message(&wire[2..], &mut buf).unwrap();
        assert_eq!(&buf[..n], b"ping");
        let n = st.write_message(b"pong", &mut buf).unwrap();
        let mut rec = (n as u16).to_be_bytes().to_vec();
        rec.extend_from_slice(&buf[..n]);
        ct.push(&rec);
        assert_eq!(ct.open(), Some(Ok(b"pong".to_vec())));
    }
}
