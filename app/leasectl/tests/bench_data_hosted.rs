//! `leasectl bench-data` against the hosted appliance (the device model, its RoCEv2 responder on UDP, the
//! software requester): every cell of the table measured, the JSON the bench reads back, and the usage errors.

use leasebox_hosted::testing::Rig;

fn run(args: &[&str]) -> (u8, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    // No environment: no configuration file, everything from the flags.
    let code = leasectl::cli::run(&args, &|_| None, &mut out, &mut err);
    (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
}

#[test]
fn every_cell_is_measured_and_read_back() {
    let h = Rig::builder().model().tenant("demo").admin().lease_pool_mib(64).start().unwrap();
    let key = h.key("demo").hex();
    let (addr, udp) = (h.addr().to_string(), h.udp().unwrap().to_string());
    let (code, out, err) = run(&[
        "--addr",
        &addr,
        "--tenant",
        "demo",
        "--key",
        &key,
        "--json",
        "bench-data",
        "--per-ms",
        "20",
        "--udp",
        &udp,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["bench_data"]["per_ms"], 20);
    let rows = leasectl::bench_data::rows_from_json(&v).unwrap();
    let shape: Vec<(usize, bool)> = rows.iter().map(|r| (r.bytes, r.read)).collect();
    let sizes = leasectl::bench_data::SIZES;
    assert_eq!(shape, sizes.iter().flat_map(|&b| [(b, false), (b, true)]).collect::<Vec<_>>());
    for r in &rows {
        for c in std::iter::once(&r.copying).chain(&r.zero_copy) {
            assert!(c.ops > 0 && c.error.is_none() && c.secs >= 0.02, "{r:?}");
            assert_eq!(c.bytes, r.bytes);
        }
    }
    // The human form: one line per row.
    let (code, out, _) =
        run(&["--addr", &addr, "--tenant", "demo", "--key", &key, "bench-data", "--per-ms", "10", "--udp", &udp]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().filter(|l| l.contains("copying") && l.contains("zero copy 64:")).count(), 6, "{out}");
    h.stop();
}

#[test]
fn usage_errors_are_clear() {
    let key = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let base = ["--addr", "127.0.0.1:1", "--tenant", "demo", "--key", key, "--json", "bench-data"];
    let with = |extra: &[&str]| run(&[&base[..], extra].concat());
    let (code, out, _) = with(&["--backend", "verbs"]);
    assert_eq!(code, 2);
    assert!(out.contains("--backend verbs needs --device NAME"), "{out}");
    let (code, out, _) = with(&["--device", "rxe0"]);
    assert_eq!(code, 2);
    assert!(out.contains("--device is for --backend verbs"), "{out}");
    let (code, out, _) = with(&["--backend", "verbs", "--device", "rxe0", "--udp", "127.0.0.1:4791"]);
    assert_eq!(code, 2);
    assert!(out.contains("--udp is for --backend soft"), "{out}");
    if !cfg!(feature = "verbs") {
        let (code, out, _) = with(&["--backend", "verbs", "--device", "rxe0"]);
        assert_eq!(code, 2);
        assert!(out.contains("--features verbs"), "{out}");
    }
}
