//! The C ABI's data path, from C: `tests/data_path.c`, compiled with gcc against the committed header and
//! linked with the staticlib, runs one scenario per process against a hosted appliance with the device model
//! (`--hca --udp`): registered memory and zero copy both ways (`lbx_bytes_copied` stays 0), a 64-deep
//! asynchronous batch across two leases with the completion fd polled with poll(2), a region that refuses to be
//! freed while a transfer holds it, a lease revoked mid-batch failing only its own operations in both teardown
//! orders, learned by the notice and with notices withheld (`revoke_notices=off`), and a verbs requester chosen
//! where libibverbs or the device is missing. Each scenario prints `PASS`/`FAIL` lines and exits non-zero on a
//! failure.

mod support;

use std::path::PathBuf;
use std::sync::OnceLock;
use support::{compile, run, serial, start, start_with};

fn program() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile("tests/data_path.c", "data_path"))
}

/// Runs `scenario` with `args`; asserts it passed, with each of `lines` in its output.
fn scenario(scenario: &str, args: &[&str], lines: &[&str]) -> String {
    scenario_env(scenario, args, &[], lines)
}

/// As [`scenario`], with `env` set for the program.
fn scenario_env(scenario: &str, args: &[&str], env: &[(&str, &str)], lines: &[&str]) -> String {
    let out = run(program(), &[&[scenario], args].concat(), env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{scenario} exited {}:\n{stdout}", out.status);
    assert!(!stdout.contains("FAIL"), "{stdout}");
    for l in lines.iter().chain(&[format!("{scenario}: PASS").as_str()]) {
        assert!(stdout.contains(l), "no '{l}' in\n{stdout}");
    }
    stdout
}

#[test]
fn registered_memory_goes_both_ways_without_a_copy() {
    let _one = serial();
    let a = start();
    let soft = format!("soft:{}", a.udp);
    scenario(
        "zero_copy",
        &[&a.addr, "demo", &a.tenant, &soft],
        &[
            "PASS zero-copy round trip of 1 MiB + 100 bytes",
            "PASS zero copy: lbx_bytes_copied stays 0",
            "PASS scatter/gather in order",
            "PASS more pieces than max_sge refused",
            "PASS copying calls counted: 128 bytes",
        ],
    );
}

#[test]
fn a_64_deep_batch_across_two_leases_through_the_completion_fd() {
    let _one = serial();
    let a = start();
    let soft = format!("soft:{}", a.udp);
    scenario(
        "batch",
        &[&a.addr, "demo", &a.tenant, &soft],
        &[
            "PASS 64 write completions taken through the fd",
            "PASS fd quiet and nothing pending once all are taken",
            "PASS lbx_wait takes the other 63",
            "PASS 64 blocks through two leases came back identical",
            "PASS a range outside the lease fails alone",
        ],
    );
}

/// A READ toward a UDP socket nobody reads holds its region until the lease's QP gives up: freeing the region
/// meanwhile is refused with `LBX_ERR_BUSY`, and succeeds once the READ's completion is taken.
#[test]
fn a_region_in_use_is_not_freed() {
    let _one = serial();
    let a = start();
    let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer = format!("soft:{}", mute.local_addr().unwrap());
    scenario(
        "busy",
        &[&a.addr, "demo", &a.tenant, &peer],
        &[
            "PASS lbx_region_free refuses a region in use",
            "PASS and still after waiting 50 ms",
            "PASS the READ to a mute peer fails",
        ],
    );
}

/// The revoke scenario in teardown order `order` (`mkey` or `qp`) against an appliance that sends revoke notices
/// or not (`revoke_notices=off`).
fn revoked_mid_batch(order: &str, notices: bool) {
    let _one = serial();
    let a = start_with(|b| if notices { b } else { b.option("revoke_notices", "off") });
    let soft = format!("soft:{}", a.udp);
    let out = scenario(
        "revoke",
        &[&a.addr, "demo", &a.tenant, &soft, &a.admin, order],
        &[
            "PASS REVOKE answered LBX_OUTCOME_TORN_DOWN",
            "PASS only the revoked lease's operations failed, each with LBX_ERR_REVOKED",
            "PASS most of the doomed lease's writes were revoked",
            "PASS LBX_EVENT_REVOKED came once",
            "PASS afterwards the revoked lease refuses, the other works",
        ],
    );
    assert!(out.contains("later writes failed LBX_ERR_REVOKED"), "{out}");
}

/// Learned by the appliance's REVOKED notice (and whichever failed completion comes first), MKEY first.
#[test]
fn a_lease_revoked_mkey_first_fails_only_its_own_operations() {
    revoked_mid_batch("mkey", true);
}

/// The same with the QP torn down first (the admin's order).
#[test]
fn a_lease_revoked_qp_first_fails_only_its_own_operations() {
    revoked_mid_batch("qp", true);
}

/// With the appliance's notices withheld (`revoke_notices=off`), the client learns of the revoke the other way:
/// the first failed completion, then QUERY. MKEY first: the next WRITE is NAKed (REM_ACCESS_ERR).
#[test]
fn a_revoke_without_its_notice_mkey_first_fails_only_its_own_operations() {
    revoked_mid_batch("mkey", false);
}

/// QP first without the notice: the requester's WRITEs go unanswered until its retries run out (RETRY_EXC_ERR),
/// then QUERY.
#[test]
fn a_revoke_without_its_notice_qp_first_fails_only_its_own_operations() {
    revoked_mid_batch("qp", false);
}

/// Verbs chosen at run time where it cannot work: with `LEASEBOX_IBVERBS` naming a library that does not exist
/// (a host without libibverbs), the first lease fails with `LBX_ERR_RDMA` and a message naming the packages to
/// install; with the library, the message names the missing device (or says the host has no RDMA device). The program itself starts
/// either way (libibverbs is loaded at run time, not linked).
#[test]
fn verbs_without_libibverbs_or_the_device_says_why() {
    let _one = serial();
    let a = start();
    let spec = "verbs:leasebox-no-dev0:1:1";
    let out = scenario_env(
        "verbs",
        &[&a.addr, "demo", &a.tenant, spec],
        &[("LEASEBOX_IBVERBS", "/nonexistent/libibverbs.so.1")],
        &["PASS lbx_alloc on a verbs requester that cannot open fails LBX_ERR_RDMA"],
    );
    assert!(out.contains("/nonexistent/libibverbs.so.1 could not be loaded"), "{out}");
    assert!(out.contains("libibverbs1"), "the message names the package: {out}");
    let out = scenario(
        "verbs",
        &[&a.addr, "demo", &a.tenant, spec],
        &["PASS lbx_alloc on a verbs requester that cannot open fails LBX_ERR_RDMA"],
    );
    // A host whose kernel has no ib_uverbs (this one, a container) says so; one with RDMA devices names ours.
    assert!(!out.contains("could not be loaded"), "{out}");
    assert!(out.contains("leasebox-no-dev0") || out.contains("no RDMA devices"), "{out}");
}
