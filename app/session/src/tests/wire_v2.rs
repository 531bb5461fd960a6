//! The protocol v2 worked example of docs/wire-protocol.md, byte for byte: the real server, driven with fixed
//! "entropy" (its ephemeral key), and a client with a fixed ephemeral key. The hex is read from the document's
//! code blocks, so the document cannot drift from the code.

use super::*;
use std::string::String as StdString;

/// Entropy that hands out values from a script, up to 32 bytes each (the server's stand-in PSK, the boot id,
/// then its ephemeral key and the session's resume token).
struct Script(Vec<[u8; 32]>);
impl Entropy for Script {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        let v = if self.0.is_empty() { [0; 32] } else { self.0.remove(0) };
        buf.copy_from_slice(&v[..buf.len()]);
        Ok(())
    }
}
impl Appliance for Script {}

fn seq(from: u8) -> [u8; 32] {
    core::array::from_fn(|i| from + i as u8)
}

/// The bytes of the code block tagged ```` ```v2:NAME ```` in docs/wire-protocol.md: on each line, the leading
/// two-digit hex tokens (what follows them is commentary).
fn doc_block(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/wire-protocol.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let tag = alloc::format!("```v2:{name}");
    let start = doc.find(&tag).unwrap_or_else(|| panic!("no block {tag} in the document"));
    let body = &doc[start + tag.len()..];
    let body = &body[..body.find("```").unwrap()];
    let mut out = Vec::new();
    for line in body.lines() {
        for tok in line.split_whitespace() {
            if tok.len() != 2 || !tok.bytes().all(|b| b.is_ascii_hexdigit()) {
                break;
            }
            out.push(u8::from_str_radix(tok, 16).unwrap());
        }
    }
    out
}

fn hex_lines(b: &[u8]) -> StdString {
    b.chunks(16)
        .map(|c| c.iter().map(|x| alloc::format!("{x:02x}")).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_documented_v2_example_is_what_the_code_sends() {
    let mut k = Keyring::new();
    k.add_tenant("demo", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f").unwrap();
    let mut s = Server::new(
        Limits::default(),
        k,
        NoLeases::default(),
        Script(vec![[0xee; 32], seq(0xb0), seq(0x60), seq(0xc0)]),
        0,
    )
    .unwrap();
    s.open(ConnId(1), 0);
    let key: Vec<u8> = (0u8..32).collect();
    let prologue = v2::prologue(2, 2, 0, "demo");
    let (init, msg1) = Initiator::start(&prologue, &v2::psk_from_key(&key), seq(0x40));
    let h = HelloNoise { min_version: 2, max_version: 2, key_id: 0, name: "demo".into(), msg1 };
    let hello = req(Request::Hello(Hello::Noise(h)), 1);
    s.input(ConnId(1), &hello, 0);
    let mut out = vec![0u8; 4096];
    let n = s.output(ConnId(1), &mut out);
    let answer = out[..n].to_vec();
    let Some(Response::Hello(HelloReply::Noise { msg2 })) = v2_tests_take_response(&answer) else {
        panic!("no answer")
    };
    let (announce, mut client) = init.finish(&msg2).unwrap();
    let mut hb = Vec::new();
    client.seal(&req(Request::Heartbeat { echo: 0x0102_0304_0506_0708 }, 2), &mut hb).unwrap();
    s.input(ConnId(1), &hb, 12_345);
    let n = s.output(ConnId(1), &mut out);
    let hb_answer = out[..n].to_vec();
    client.push(&hb_answer);
    let plain = client.open().unwrap().unwrap();

    let show = |what: &str, b: &[u8]| std::eprintln!("{what} ({} bytes):\n{}\n", b.len(), hex_lines(b));
    show("psk", &v2::psk_from_key(&key));
    show("hello", &hello);
    show("answer", &answer);
    show("announce", &announce);
    show("record", &hb);
    show("record answer", &hb_answer);
    show("record answer plain", &plain);
    assert_eq!(doc_block("psk"), v2::psk_from_key(&key));
    assert_eq!(doc_block("hello"), hello);
    assert_eq!(doc_block("answer"), answer);
    assert_eq!(doc_block("announce"), announce);
    assert_eq!(doc_block("heartbeat"), hb);
    assert_eq!(doc_block("heartbeat-answer"), hb_answer);
    assert_eq!(doc_block("heartbeat-answer-plain"), plain);
}

fn v2_tests_take_response(bytes: &[u8]) -> Option<Response> {
    let mut fb = FrameBuf::new();
    fb.push(bytes);
    let Next::Frame(h, p) = fb.next_frame() else { return None };
    Response::decode(Op::from_raw(h.op)?, &p).ok()
}
