//! What one established session holds on the heap (docs/operations.md, "Scale"): 256 sessions log in and
//! confirm, and the bytes the server holds afterwards, per session, stay within
//! [`leasebox_session::SESSION_IDLE_HEAP_BYTES`] (hosts size `sessions=` by `SESSION_HEAP_BYTES`, which leaves
//! room for the buffers traffic grows). The allocator of this test
//! binary counts the bytes each thread holds; only what the server's calls leave allocated is counted (the
//! client ends are built outside the counted calls).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use leasebox_proto::v2::{self, Initiator, Transport};
use leasebox_proto::{FrameBuf, Header, Hello, HelloNoise, HelloReply, Kind, Next, Op, Request, Response};
use leasebox_session::{
    Appliance, Budget, ConnId, Entropy, EntropyError, Keyring, Limits, NoLeases, Rate, SESSION_IDLE_HEAP_BYTES, Server,
};

/// The system allocator, counting the bytes each thread holds.
struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: every call goes to the system allocator unchanged; the counter is a thread-local `Cell` with a
// `const` initializer, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = HELD.try_with(|h| h.set(h.get() + layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = HELD.try_with(|h| h.set(h.get() - layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = HELD.try_with(|h| h.set(h.get() + new_size as isize - layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn held() -> isize {
    HELD.with(|h| h.get())
}

/// Deterministic nonces (a counter through an LCG): the figure is the same on every run.
struct Counter(u64);
impl Entropy for Counter {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        for b in buf {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *b = (self.0 >> 33) as u8;
        }
        Ok(())
    }
}
/// An appliance without an HCA.
impl Appliance for Counter {}

const KEY: &str = "7a3f09c4e18b52d6a0f4c93e7b215d8869e2c07f14ab38d5e9061c7fa2b4d03e";

fn frames(bytes: &[u8]) -> Vec<(Header, Vec<u8>)> {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    let mut v = Vec::new();
    while let Next::Frame(h, p) = fb.next_frame() {
        v.push((h, p));
    }
    v
}

#[test]
fn an_established_session_holds_at_most_the_stated_heap() {
    const N: u64 = 256;
    let mut keys = Keyring::new();
    keys.add_tenant("demo", KEY).unwrap();
    let limits = Limits { sessions: N as usize + 1, ..Limits::default() };
    let mut s = Server::new(limits, keys, NoLeases::default(), Counter(1), 0).unwrap();
    // Rates are not what this test measures.
    let unlimited = Rate { burst: u32::MAX, per_s: u32::MAX };
    let budget = Budget::for_sessions(limits.sessions);
    s.set_budget(Budget { hello_work: unlimited, conn_rate: unlimited, hello_rate: unlimited, ..budget });
    let psk = v2::psk_from_key(&leasebox_session::parse_hex(KEY).unwrap());
    let prologue = v2::prologue(2, 2, 0, "demo");
    let mut out = vec![0u8; 1 << 16];
    let mut clients: Vec<Transport> = Vec::with_capacity(N as usize);
    let mut server_bytes = 0isize;
    for i in 0..N {
        let mut e = [0x42u8; 32];
        e[8..16].copy_from_slice(&(i + 1).to_le_bytes());
        let (init, msg1) = Initiator::start(&prologue, &psk, e);
        let h = HelloNoise { min_version: 2, max_version: 2, key_id: 0, name: "demo".into(), msg1 };
        let mut hello = Vec::new();
        Request::Hello(Hello::Noise(h)).encode(1, &mut hello);
        let c = ConnId(i + 1);

        let before = held();
        assert!(s.open(c, 0));
        s.input(c, &hello, 0);
        let n = s.output(c, &mut out);
        server_bytes += held() - before;

        let f = frames(&out[..n]);
        let [(h, p)] = f.as_slice() else { panic!("one answer to HELLO, got {}", f.len()) };
        assert_eq!(h.kind, Kind::Response, "session {i}: {:?}", leasebox_proto::ErrorBody::decode(p));
        let Ok(Response::Hello(HelloReply::Noise { msg2 })) = Response::decode(Op::Hello, p) else {
            panic!("HELLO answered with message 2")
        };
        let init: Initiator = init;
        let (_, mut t) = init.finish(&msg2).expect("the server holds the key");
        let mut confirm = Vec::new();
        Request::Heartbeat { echo: i }.encode(2, &mut confirm);
        let mut wire = Vec::new();
        t.seal(&confirm, &mut wire).unwrap();

        let before = held();
        s.input(c, &wire, 0);
        let n = s.output(c, &mut out);
        server_bytes += held() - before;
        t.push(&out[..n]);
        let plain = t.open().expect("a record").expect("it authenticates");
        assert!(matches!(frames(&plain).as_slice(), [(h, _)] if h.kind == Kind::Response), "session {i} confirmed");
        clients.push(t);
    }
    assert_eq!(s.admission().sessions(), N as usize);
    let per_session = server_bytes / N as isize;
    println!("heap per established session: {per_session} bytes (stated: at most {SESSION_IDLE_HEAP_BYTES})");
    assert!(per_session > 0, "the count works");
    assert!(
        per_session as usize <= SESSION_IDLE_HEAP_BYTES,
        "{per_session} bytes per session; docs/operations.md states at most {SESSION_IDLE_HEAP_BYTES}"
    );
}
