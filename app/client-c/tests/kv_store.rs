//! The key-value store's C ABI from C: `tests/kv_store.c`, compiled with gcc against the committed header and
//! linked with the staticlib, opens a store on a hosted appliance with the device model the way a program does
//! (a `leasebox://` URL and a key file) and checks the copying and zero-copy calls, per-item results in mixed
//! batches, an asynchronous batch through the store's fd, the counters and the Prometheus text into the caller's
//! buffer, and bad arguments refused with a message.

mod support;

use support::{compile, run, serial, start};

#[test]
fn the_store_from_c() {
    let _one = serial();
    let a = start();
    let exe = compile("tests/kv_store.c", "kv_store");
    let dir = std::env::temp_dir().join(format!("leasebox-kv-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("demo.key");
    std::fs::write(&key_file, format!("{}\n", a.tenant)).unwrap();
    let url = format!("leasebox://demo@{}?rdma={}", a.addr, a.udp);
    let out = run(&exe, &[&url, key_file.to_str().unwrap()], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kv_store exited {}:\n{stdout}", out.status);
    assert!(!stdout.contains("FAIL"), "{stdout}");
    for l in [
        "PASS a bad URL is refused with a message",
        "PASS a mixed put batch: OK, TOO_LARGE, OK",
        "PASS a mixed get batch: 16 KiB, NOT_FOUND, 16 KiB",
        "PASS the batch comes back through the fd and poll",
        "PASS Prometheus text into the caller's buffer",
        "kv_store: PASS",
    ] {
        assert!(stdout.contains(l), "no '{l}' in\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
