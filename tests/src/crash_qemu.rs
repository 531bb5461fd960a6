//! Fail closed on crash under QEMU (docs/revoke-semantics.md, "Fail closed on crash"): the
//! image booted with the mlx5 model and `test=panic-after-lease`, then driven as a client would:
//!
//! 1. ALLOC with the software requester's QP ([`leasectl::rdma::SoftRoce`], the verifier's requester), connect,
//!    READY, a WRITE that succeeds and lands in guest RAM;
//! 2. QUERY of the lease: the image panics on it (the hook), and its fatal path takes the port down (the
//!    emergency PAOS write) and clears bus mastering before QEMU exits — the console says so;
//! 3. the next WRITE to the same lease gets no answer (`IBV_WC_RETRY_EXC_ERR`: no NAK, every attempt's timer
//!    expired) and guest RAM keeps the first WRITE's bytes.
//!
//! Without step 2's port-down the model process, which outlives QEMU here as a real HCA outlives a halted
//! CPU, would go on answering the WRITE from the RAM file: the scenario fails then.

use crate::Artifacts;
use crate::lease_qemu::{Appliance, RdmaLease, expect, one, pattern, rdma_lease};
use leasebox_proto::{Request, mtu_bytes};
use leasectl::rdma::{RcConfig, Requester, WcStatus};
use std::time::{Duration, Instant};

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "crash-fail-closed";
/// Bytes written per WRITE.
const LEN: usize = 4096;
/// The requester's MTU.
const MTU: u32 = 1024;
/// QEMU must be gone this long after the QUERY that panics it (the fatal path waits at most 1 s for the
/// port-down command; the rest is TCG and a busy host).
const EXIT_DEADLINE: Duration = Duration::from_secs(60);
/// Console lines the fatal path must print, in this order.
const FATAL_LINES: [&str; 3] = ["PANIC", "fail-closed: port 1 down", "bus mastering cleared"];

/// Boots the image with `test=panic-after-lease` and runs the three steps. Returns the summary.
pub fn run(a: &Artifacts) -> Result<String, String> {
    let mut app = Appliance::boot(a, &a.elf, NAME, "test=panic-after-lease")?;
    let r = checks(&mut app);
    app.drain();
    r.map_err(|e| app.fail(e))
}

fn checks(app: &mut Appliance) -> Result<String, String> {
    let mut tenant = app.session(&app.tenant())?;
    // Transport timer 16.8 ms, 8 attempts: 134 ms of silence ends the WRITE after the crash; long enough that
    // a model process starved beside the TCG guest does not fail the WRITE before it.
    let rc = RcConfig { timeout: 12, retry_cnt: 7, ..RcConfig::default() };
    let RdmaLease { mut r, alloc: a } = rdma_lease(app, &mut tenant, rc, LEN as u64)?;
    let data = pattern(a.rkey);
    r.post_write(1, a.remote_addr, a.rkey, &data[..LEN])?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("WRITE with the lease live", c.status == WcStatus::Success, &c)?;
    if app.ram(a.remote_addr, LEN)? != data[..LEN] {
        return Err("guest RAM does not hold the first WRITE".into());
    }

    // The request that panics the appliance: no answer can come.
    let asked = Instant::now();
    if let Ok(answer) = tenant.call(&Request::Query { lease: a.lease }) {
        return Err(format!("QUERY was answered ({answer:?}); test=panic-after-lease should have panicked"));
    }
    if !app.wait_exit(asked + EXIT_DEADLINE) {
        return Err(format!("QEMU still running {} s after the panic", EXIT_DEADLINE.as_secs()));
    }
    let lines = app.serial_lines().to_vec();
    let mut at = 0;
    for want in FATAL_LINES {
        match lines[at..].iter().position(|l| l.contains(want)) {
            Some(i) => at += i + 1,
            None => return Err(format!("the console has no `{want}` (after the earlier fatal-path lines)")),
        }
    }

    // The model still runs (a real HCA outlives a halted CPU): the lease must be out of reach.
    let before = r.stats();
    let second = pattern(!a.rkey);
    r.post_write(2, a.remote_addr, a.rkey, &second[..LEN])?;
    let c = one(&mut r, Duration::from_secs(10))?;
    expect("WRITE after the crash", c.status == WcStatus::RetryExcErr, &c)?;
    let s = r.stats();
    let attempts = u64::from(rc.retry_cnt) + 1;
    let path_mtu = mtu_bytes(a.mtu).unwrap_or(MTU).min(MTU);
    let packets = attempts * LEN.div_ceil(path_mtu as usize) as u64;
    let got = (s.naks - before.naks, s.timeouts - before.timeouts, s.packets_sent - before.packets_sent);
    if got != (0, attempts, packets) {
        return Err(format!(
            "after the crash: (NAKs, timeouts, packets sent) {got:?}, expected silence (0, {attempts}, {packets})"
        ));
    }
    if app.ram(a.remote_addr, LEN)? != data[..LEN] {
        return Err("the WRITE after the crash reached guest RAM".into());
    }
    Ok(format!(
        "WRITE ok with the lease live; test=panic-after-lease on QUERY: port down and bus mastering cleared on \
         the console, QEMU gone; the next WRITE unanswered ({attempts} attempts, RETRY_EXC_ERR), RAM unchanged"
    ))
}
