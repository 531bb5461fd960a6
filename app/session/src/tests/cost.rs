//! What a HELLO costs the server before key confirmation (docs/security.md, "Cost of a handshake"): a message 1
//! whose tag fails (a wrong key, an unknown name), a replayed one (refused by the memory of recent messages 1),
//! and one answered with message 2 (two entropy draws, an X25519 key, a DH). Wall-clock figures, so the test
//! is ignored by default: `cargo test --release -p leasebox-session handshake_cost -- --ignored --nocapture`.

use super::*;
use crate::admission::Rate;
use std::time::Instant;

/// Microseconds per HELLO the server handles on its own (open, HELLO in, answer out, close), `n` times.
fn per_hello(s: &mut Server<NoLeases, Counter>, hellos: &[Vec<u8>], first: u64) -> f64 {
    let mut out = vec![0u8; 4096];
    let t0 = Instant::now();
    for (k, h) in hellos.iter().enumerate() {
        let c = ConnId(first + k as u64);
        assert!(s.open(c, 0));
        s.input(c, h, 0);
        assert!(s.output(c, &mut out) > 0);
        s.closed(c, 0);
    }
    t0.elapsed().as_secs_f64() * 1e6 / hellos.len() as f64
}

#[test]
#[ignore = "wall-clock figures: run in release with --ignored --nocapture"]
fn handshake_cost() {
    let n = 1_000; // within the memory of recent messages 1 (MAX_SEEN_HELLOS)
    let mut s = server(Limits::default());
    let unlimited = Rate { burst: u32::MAX, per_s: u32::MAX };
    s.set_budget(Budget { hello_work: unlimited, ..Budget::for_sessions(16) });
    let fresh: Vec<Vec<u8>> = (0..n)
        .map(|k| {
            let mut e = [7u8; 32];
            e[8..16].copy_from_slice(&(k as u64).to_le_bytes());
            hello_v2_with("demo", DEMO_KEY, e).0
        })
        .collect();
    let wrong: Vec<Vec<u8>> = (0..n).map(|_| hello_v2("demo", ADMIN_KEY, 9).0).collect();
    let answered = per_hello(&mut s, &fresh, 1);
    let replayed = per_hello(&mut s, &fresh, 1 + n as u64);
    let failed = per_hello(&mut s, &wrong, 1 + 2 * n as u64);
    assert_eq!(s.hellos_replayed(), n as u64);
    std::println!(
        "server CPU per HELLO before key confirmation ({n} each): answered with message 2 {answered:.1} µs, \
         replayed message 1 {replayed:.1} µs, wrong key or unknown name {failed:.1} µs"
    );
    let work = crate::admission::DEFAULT_HELLO_WORK.per_s as f64;
    std::println!(
        "at the default total rate of answered HELLOs ({work} a second) that is {:.1} % of a core; at a source's \
         default HELLO rate ({} a second) of failed or replayed ones, {:.2} % per source",
        work * answered / 1e4,
        crate::admission::DEFAULT_HELLO_RATE.per_s,
        f64::from(crate::admission::DEFAULT_HELLO_RATE.per_s) * failed.max(replayed) / 1e4
    );
}
