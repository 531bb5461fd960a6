//! The verbs backend loads libibverbs at run time (`rdma::verbs::library`): this test binary, built with the
//! `verbs` feature, must start without libibverbs mapped (no `DT_NEEDED libibverbs.so.1`), map it only at the
//! first device open, and, where the library is missing (`LEASEBOX_IBVERBS` naming a file that does not exist),
//! fail that open with an error naming the packages. Runs on a host without an RDMA device.
#![cfg(feature = "verbs")]

use leasebox_client::rdma::verbs::Device;
use std::process::Command;

/// Whether libibverbs is mapped into this process now.
fn ibverbs_mapped() -> bool {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps").contains("libibverbs.so")
}

/// The child half: opens a device with `LEASEBOX_IBVERBS` set by the parent and prints the error.
#[test]
fn child_open_with_a_missing_library() {
    if std::env::var_os("LEASEBOX_VERBS_RUNTIME_CHILD").is_none() {
        return; // only as the parent's child
    }
    match Device::open("rxe0") {
        Ok(_) => println!("CHILD: opened"),
        Err(e) => println!("CHILD: {e}"),
    }
}

#[test]
fn libibverbs_is_loaded_at_the_first_open_and_its_absence_is_named() {
    assert!(
        !ibverbs_mapped(),
        "libibverbs is mapped before any verbs call: something links it (DT_NEEDED) instead of loading it"
    );

    // A host without the library: a child process whose LEASEBOX_IBVERBS names nothing.
    let out = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "child_open_with_a_missing_library", "--nocapture", "--test-threads=1"])
        .env("LEASEBOX_VERBS_RUNTIME_CHILD", "1")
        .env("LEASEBOX_IBVERBS", "/nonexistent/libibverbs.so.1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The harness prints "test NAME ... " on the same line, before the child's own words.
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CHILD: ").map(|(_, said)| said))
        .unwrap_or_else(|| panic!("child said: {stdout}"));
    println!("without the library: {line}");
    assert!(line.starts_with("/nonexistent/libibverbs.so.1 could not be loaded ("), "{line}");
    assert!(line.contains("apt install libibverbs1 ibverbs-providers"), "{line}");

    // With the library (building the feature needs libibverbs-dev): the open loads it, then fails only for the
    // device, which this host lacks.
    let e = match Device::open("leasebox-no-such-device") {
        Ok(_) => panic!("opened a device that does not exist"),
        Err(e) => e,
    };
    println!("with the library: {e}");
    assert!(!e.contains("could not be loaded"), "{e}");
    assert!(ibverbs_mapped(), "the open did not load libibverbs");
}
