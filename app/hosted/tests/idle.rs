//! An idle hosted appliance costs next to no CPU (docs/operations.md, "The hosted appliance"): the
//! `leasebox-hosted` binary with the device model (`--hca --udp`) is left alone for a while and its CPU time
//! over that interval (utime + stime from /proc/<pid>/stat) must stay well below one core; a lease is then
//! granted and freed (the sleeping threads wake for it) and the appliance must go quiet again.
//!
//! Before the model thread and the engines' thread backed off, such an appliance took whatever CPU the machine
//! would give (both polled without pause: spin, then yield): 193 % of a quiet 2-core machine.

use std::path::Path;
use std::time::{Duration, Instant};

use leasebox_hosted::testing::{Process, Rig};

use leasebox_proto::{AllocReq, Request, Response, access};
use leasectl::rdma::{Requester, SoftConfig, SoftRoce, mtu_enum};
use leasectl::{Client, Timeouts};

mod common;

/// Clock ticks per second in /proc/<pid>/stat (`USER_HZ`: 100 on every Linux ABI this runs on).
const USER_HZ: f64 = 100.0;
/// How long the appliance is watched while idle.
const IDLE: Duration = Duration::from_secs(2);
/// Time to settle after start-up or after work (the pool's background preparation, the back-off's ramp).
const SETTLE: Duration = Duration::from_secs(1);
/// The most CPU an idle appliance may use, as a share of one core (it used about one whole core before).
const LIMIT: f64 = 0.30;

/// The `leasebox-hosted` binary (the shipped rig's [`Process`], killed when dropped) with the model
/// (`--hca --udp`), a 64 MiB pool and tenant `demo`.
struct Appliance(Process);

impl Appliance {
    fn start() -> Appliance {
        let bin = Path::new(env!("CARGO_BIN_EXE_leasebox-hosted"));
        let p = Rig::builder().model().lease_pool_mib(64).tenant("demo").spawn(bin, Duration::from_secs(120));
        Appliance(p.unwrap())
    }

    /// utime + stime of the whole process so far, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.pid())).expect("its /proc stat");
        // Fields after the command name (which may hold spaces) start at field 3: utime and stime are 14 and 15.
        let rest = stat.rsplit_once(") ").expect("a stat line").1;
        let fields: Vec<u64> = rest.split(' ').map(|f| f.parse().unwrap_or(0)).collect();
        fields[11] + fields[12]
    }

    /// The share of one core the process used over [`IDLE`], after [`SETTLE`].
    fn idle_cpu(&self) -> f64 {
        std::thread::sleep(SETTLE);
        let (t0, c0) = (Instant::now(), self.cpu_ticks());
        std::thread::sleep(IDLE);
        let (secs, ticks) = (t0.elapsed().as_secs_f64(), self.cpu_ticks() - c0);
        ticks as f64 / USER_HZ / secs
    }
}

#[test]
fn an_idle_appliance_with_the_model_uses_little_cpu_and_wakes_for_work() {
    let app = Appliance::start();
    let idle = app.idle_cpu();
    eprintln!("idle hosted appliance (--hca --udp): {:.1} % of one core over {IDLE:?}", idle * 100.0);
    assert!(
        idle < LIMIT,
        "an idle hosted appliance with the model used {:.0} % of one core over {IDLE:?} (limit {:.0} %): some \
         thread polls without backing off (the model thread, the engines' thread or the timer thread; see \
         mlx5_hosted::idle)",
        idle * 100.0,
        LIMIT * 100.0
    );

    // Work after the quiet: an ALLOC (six HCA commands through every sleeping thread) and a FREE.
    let t = Timeouts { receive: Duration::from_secs(30), ..Timeouts::all(Duration::from_secs(10)) };
    let mut c =
        Client::connect_and_hello(&app.0.addr().to_string(), &common::creds("demo", app.0.key("demo")), t).unwrap().0;
    let r = SoftRoce::new(SoftConfig {
        peer: app.0.udp().expect("the ready line names the responder"),
        ..SoftConfig::default()
    })
    .unwrap();
    let me = r.local();
    let t0 = Instant::now();
    let alloc = c
        .call(&Request::Alloc(AllocReq {
            size: 64 << 10,
            access: access::REMOTE_READ | access::REMOTE_WRITE,
            mtu: mtu_enum(me.mtu).unwrap(),
            ttl_ms: 0,
            client_qpn: me.qpn,
            client_psn: me.psn,
            client_gid: me.gid,
            client_mac: me.mac,
        }))
        .unwrap();
    let took = t0.elapsed();
    let Response::Alloc(a) = alloc else { panic!("ALLOC after the quiet answered {alloc:?}") };
    eprintln!("ALLOC after {IDLE:?} idle answered in {took:?}");
    assert!(matches!(c.call(&Request::Free { lease: a.lease }).unwrap(), Response::Free { .. }));
    drop(c);

    let again = app.idle_cpu();
    eprintln!("idle again after the work: {:.1} % of one core over {IDLE:?}", again * 100.0);
    assert!(
        again < LIMIT,
        "after an ALLOC and a FREE the appliance did not go quiet again: {:.0} % of one core over {IDLE:?} \
         (limit {:.0} %)",
        again * 100.0,
        LIMIT * 100.0
    );
}
