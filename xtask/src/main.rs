//! `cargo xtask`: Leasebox's one entry point for building images, booting them under QEMU, running every test
//! and measuring boot time. See `cargo xtask help`.
#![forbid(unsafe_code)]

mod cli;
mod demo;
mod image;
mod prereq;
mod python;
mod rxe_guest;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::error::ErrorKind;
use cli::{BenchKind, BenchOpts, Cmd, CtlNic, RunOpts, TestOpts};
use image::Paths;
use leasebox_qemu::model::{self, ModelCommand, ModelFiles, ModelProcess, ModelShm};
use leasebox_qemu::{Boot, HostFwd, Ovmf, QemuConfig, QemuProcess, Stdio, StopSignals, Waited};
use leasebox_scenarios::{
    Artifacts, Build, Entry, bench, control, hca_bench, lease_bench, revoke_bench, scenario, scrub_bench,
};

/// `println!` that ignores a closed stdout (e.g. `cargo xtask help | head`) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Exit status for command-line mistakes.
const USAGE_ERROR: u8 = 2;
/// Exit status when `run --timeout` stopped QEMU (as timeout(1)).
const RUN_TIMED_OUT: i32 = 124;

fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os().skip(1).map(|a| a.into_string()).collect();
    let Ok(args) = args else {
        eprintln!("xtask: arguments must be valid UTF-8");
        return ExitCode::from(USAGE_ERROR);
    };
    let cmd = match cli::parse(args) {
        Ok(cmd) => cmd,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            outln!("{}", e.render().to_string().trim_end());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("{}", e.render());
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let paths = Paths::discover();
    let result = match cmd {
        Cmd::Help(text) => {
            outln!("{}", text.trim_end());
            Ok(0)
        }
        Cmd::Prereqs => prereq::ensure().map(|_| {
            outln!("prerequisites present");
            0
        }),
        Cmd::RxeGuest { boot, cmd, wire, ip } => rxe_guest::cmd(&paths, boot, cmd.as_deref(), wire, ip).map(|_| 0),
        Cmd::Image => cmd_image(&paths),
        Cmd::Run(o) => cmd_run(&o, &paths),
        Cmd::Test(o) => cmd_test(&o, &paths),
        Cmd::Bench(o) => cmd_bench(&o, &paths),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_image(p: &Paths) -> Result<i32, String> {
    prereq::ensure()?;
    image::build_all(p)?;
    outln!("{}", image::describe(&p.elf()));
    outln!("{}", image::describe(&p.iso()));
    Ok(0)
}

/// `run`. SIGTERM, SIGINT and SIGHUP are caught from the start (`leasebox_qemu::lifetime`): one that arrives
/// while something is built ends the run once that step is done, before anything is started; one that arrives
/// while QEMU runs is passed on to it. Either way the run returns 128 + the signal after every guard has dropped
/// (QEMU reaped, the model stopped, the shared files deleted). QEMU and the model also get SIGKILL from the
/// kernel if this process dies without that (SIGKILL, a crash).
fn cmd_run(o: &RunOpts, p: &Paths) -> Result<i32, String> {
    let signals = StopSignals::install().map_err(|e| format!("installing the stop-signal handlers: {e}"))?;
    let stopped = |signal: i32| {
        eprintln!("xtask: stopped by signal {signal}");
        Ok(StopSignals::exit_status(signal))
    };
    prereq::ensure()?;
    image::build_kernel(p)?;
    if let Some(s) = signals.caught() {
        return stopped(s);
    }
    leasebox_qemu::firmware::remove_stale(&p.out, "ovmf-vars", "fd");
    // The zero-config demo: fresh keys on every run, unless the kernel arguments bring their own principals.
    let keys = if demo::has_principals(&o.kernel_args) { None } else { Some(demo::DemoKeys::generate()?) };
    let hub = match o.ctl_nic {
        CtlNic::Mlx5 => Some(demo::Hub::pick()?),
        CtlNic::Virtio => None,
    };
    let mut kernel_args = o.kernel_args.clone();
    if let Some(k) = &keys {
        kernel_args.extend(k.kernel_words());
    }
    if let Some(h) = &hub {
        kernel_args.extend(h.kernel_words(&o.kernel_args));
    }
    let args = kernel_args.join(" ");
    let mut scratch = Vec::new();
    let boot = if o.iso {
        leasebox_qemu::iso::check_kernel_args(&args)?;
        let iso = if args.is_empty() { p.iso() } else { p.run_iso() };
        image::build_iso(p, &iso, &args)?;
        if o.uefi {
            let ovmf = Ovmf::find().ok_or("OVMF firmware not found (Debian: apt-get install ovmf)")?;
            let vars = ovmf.fresh_vars(&p.out).map_err(|e| e.to_string())?;
            let boot = Boot::UefiIso { iso, code: ovmf.code, vars: vars.path().to_path_buf() };
            scratch.push(vars);
            boot
        } else {
            Boot::BiosIso { iso }
        }
    } else {
        Boot::Kernel { elf: p.elf(), append: args }
    };
    let mut config = QemuConfig::new(boot);
    config.machine = o.machine;
    config.cpu = o.cpu.clone();
    config.smp = o.smp;
    config.mem_mib = o.mem_mib;
    config.extra = o.extra.iter().map(Into::into).collect();
    config.net = Some(HostFwd::localhost(o.port, demo::guest_port(&o.kernel_args)));
    if let Some(h) = &hub {
        // No virtio-net: the guest reaches QEMU's user network only through the model's Ethernet port.
        config.virtio_net = false;
        config.hub = h.0.ports();
    }
    // The mlx5 model: fresh shared files for guest RAM and the ivshmem BAR (a dry run only names them).
    let shm_dir = leasebox_qemu::model::shm_dir();
    if o.model {
        config.model = Some(ModelFiles {
            bar: leasebox_qemu::firmware::unique_path(&shm_dir, model::BAR_STEM, "shm"),
            bar_bytes: model::DEFAULT_BAR_BYTES,
            ram: leasebox_qemu::firmware::unique_path(&shm_dir, model::RAM_STEM, "shm"),
        });
    }
    if o.expander {
        config.model_slot = leasebox_qemu::ModelSlot::Expander;
    }
    config.validate()?;
    // Declared before QEMU's guard so they are dropped after it: QEMU reaped, model stopped, files deleted.
    let mut shm = None;
    if o.model && !o.dry_run {
        let s = ModelShm::create(&shm_dir, model::DEFAULT_BAR_BYTES, o.mem_mib).map_err(|e| e.to_string())?;
        config.model = Some(s.files().clone());
        shm = Some(s);
    }
    let shown = config.display();
    eprintln!("xtask: {}", keys.as_ref().map_or(shown.clone(), |k| k.redact(&shown)));
    if o.dry_run {
        return Ok(0);
    }
    match &keys {
        Some(k) => {
            let path = demo::config_path(&p.out);
            demo::write_config(k, o.port, hub.as_ref(), &path)?;
            eprintln!(
                "xtask: control port on 127.0.0.1:{}; leasectl configuration (tenant {}, admin key) written to {}",
                o.port,
                demo::TENANT,
                path.display()
            );
            if let Some(h) = &hub {
                eprintln!(
                    "xtask: control NIC: the model's Ethernet port (no virtio-net); hub ports: model {} ↔ QEMU {}, \
                     leasectl {} ↔ QEMU {}; RDMA address {} (found by ARP)",
                    h.0.model.peer,
                    h.0.model.local,
                    h.0.client.peer,
                    h.0.client.local,
                    demo::HUB_RDMA_IP
                );
            }
            eprintln!("xtask: try `cargo run -p leasectl -- ping` from another terminal");
        }
        None => eprintln!("xtask: control port on 127.0.0.1:{}; principals from the kernel arguments", o.port),
    }
    let _model = match &shm {
        Some(s) => Some(start_model(o, p, s, hub.as_ref())?),
        None => {
            eprintln!("xtask: without the mlx5 model (--no-model)");
            None
        }
    };
    if let Some(s) = signals.caught() {
        return stopped(s);
    }
    eprintln!("xtask: serial console follows; Ctrl-C stops QEMU");
    let mut q = QemuProcess::spawn(&config, Stdio::Inherit, scratch).map_err(|e| e.to_string())?;
    let deadline = o.timeout_secs.map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        // Without --timeout the run lasts until the guest exits or a stop signal: wait in one-hour slices.
        let until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        match q.wait_or_stop(until, &signals).map_err(|e| e.to_string())? {
            Waited::Exited(exit) => {
                eprintln!("xtask: {exit}");
                return Ok(exit.wrapper_status());
            }
            Waited::Signal(s) => return stopped(s),
            Waited::Deadline if deadline.is_some() => {
                q.kill().map_err(|e| e.to_string())?;
                eprintln!("xtask: stopped QEMU after the {} s timeout", o.timeout_secs.unwrap_or(0));
                return Ok(RUN_TIMED_OUT);
            }
            Waited::Deadline => {}
        }
    }
}

/// Builds and starts the mlx5 model on `shm`'s files; it has written its signature when this returns.
fn start_model(o: &RunOpts, p: &Paths, shm: &ModelShm, hub: Option<&demo::Hub>) -> Result<ModelProcess, String> {
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let mut cmd = ModelCommand::new(model_binary(p));
    cmd.eth_udp = hub.map(|h| h.0.model_wire());
    let trace = o.trace.as_ref().map_or_else(|| p.out.join("mlx5-trace.jsonl"), std::path::PathBuf::from);
    if let Some(dir) = trace.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    cmd.trace = Some(trace);
    // Fault injection for this run: append lines to it (docs/hca-model.md, "Fault injection").
    let control = p.out.join("mlx5-control.txt");
    cmd.control = Some(control.clone());
    let m = ModelProcess::spawn(&cmd, shm.files(), o.mem_mib, model::READY_TIMEOUT).map_err(|e| e.to_string())?;
    eprintln!("xtask: {} (pid {})", m.ready_line(), m.id());
    eprintln!("xtask: mlx5 model control file {} (e.g. `echo 'hang 0x104' >> FILE`)", control.display());
    Ok(m)
}

fn model_binary(p: &Paths) -> std::path::PathBuf {
    p.target.join("debug").join("mlx5-model")
}

/// One line of the test report.
struct Outcome {
    name: String,
    passed: bool,
}

fn report(outcomes: &mut Vec<Outcome>, name: &str, started: Instant, result: Result<(), String>) {
    let secs = started.elapsed().as_secs_f64();
    match &result {
        Ok(()) => outln!("PASS {name} ({secs:.1}s)"),
        Err(e) => outln!("FAIL {name}: {e}"),
    }
    outcomes.push(Outcome { name: name.to_string(), passed: result.is_ok() });
}

fn cargo_step(p: &Paths, args: &[&str]) -> Result<(), String> {
    outln!("==> cargo {}", args.join(" "));
    let status = Command::new(image::cargo())
        .current_dir(&p.root)
        .args(args)
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`cargo {}` failed ({status})", args.join(" "))) }
}

fn artifacts(p: &Paths, echo: bool) -> Artifacts {
    let mut a = Artifacts::in_target_dir(&p.target);
    a.echo = echo;
    a.model_bin = model_binary(p);
    a.leasectl_bin = p.target.join("debug").join("leasectl");
    a.fence_test_elf = p.fence_test_elf();
    a
}

fn cmd_test(o: &TestOpts, p: &Paths) -> Result<i32, String> {
    let scenarios = scenario::select(&o.scenarios)?;
    if o.list {
        for s in &scenarios {
            outln!("{:<16} {}", s.name(), s.about());
        }
        return Ok(0);
    }
    let steps = host_step_names();
    if let Some(bad) = o.steps.iter().find(|s| !steps.contains(&s.as_str())) {
        return Err(format!("no host step `{bad}` (host steps: {})", steps.join(", ")));
    }
    prereq::ensure()?;
    let mut outcomes = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    if o.boot_only {
        skipped.extend(steps.iter().map(|name| format!("{name} (--boot-only)")));
    } else {
        let wanted = |name: &str| o.steps.is_empty() || o.steps.iter().any(|s| s == name);
        for (name, args) in HOST_STEPS {
            if wanted(name) {
                let t0 = Instant::now();
                report(&mut outcomes, name, t0, cargo_step(p, args));
            } else {
                skipped.push(format!("{name} (not named by --step)"));
            }
        }
        if wanted(PYTHON_STEP) {
            outln!(
                "==> {PYTHON_STEP}: pip install app/client-py pytest in target/py-venv, pytest -q app/client-py/tests"
            );
            let t0 = Instant::now();
            report(&mut outcomes, PYTHON_STEP, t0, python::step(p));
        } else {
            skipped.push(format!("{PYTHON_STEP} (not named by --step)"));
        }
    }
    if !o.steps.is_empty() {
        // Only host steps were asked for: no image, no scenarios.
        skipped.push("image and scenarios (--step)".into());
        let (lines, ok) = closing_lines(&outcomes, &skipped, None);
        for l in lines {
            outln!("{l}");
        }
        return Ok(if ok { 0 } else { 1 });
    }
    if !o.scenarios.is_empty() {
        let all = scenario::all();
        let unnamed = all.iter().map(Entry::name).filter(|n| !o.scenarios.iter().any(|s| s == n));
        skipped.extend(unnamed.map(|n| format!("{n} (not named)")));
    }
    let prebuilt = image::prebuilt_kernel();
    match &prebuilt {
        Some(elf) => outln!("==> image: {} (from {}) and {}", p.elf().display(), elf.display(), p.iso().display()),
        None => outln!("==> image: {} and {}", p.elf().display(), p.iso().display()),
    }
    let t0 = Instant::now();
    let built = image::build_all(p);
    let image_ok = built.is_ok();
    report(&mut outcomes, "image", t0, built);

    let a = artifacts(p, o.verbose);
    leasebox_qemu::firmware::remove_stale(&a.scratch_dir, "ovmf-vars", "fd");
    // What the selected scenarios need besides the image, each built once; `failed` keeps the failed ones.
    let mut failed = Vec::new();
    for b in Build::ALL {
        if image_ok && scenarios.iter().any(|s| s.needs(b)) {
            let t0 = Instant::now();
            let built = build(p, b);
            if built.is_err() {
                failed.push(b);
            }
            report(&mut outcomes, b.step(), t0, built);
        }
    }
    for s in &scenarios {
        if !image_ok {
            report(&mut outcomes, s.name(), Instant::now(), Err("not run: the image build failed".into()));
            continue;
        }
        if let Some(b) = failed.iter().find(|b| s.needs(**b)) {
            let why = format!("not run: {} failed", b.step());
            report(&mut outcomes, s.name(), Instant::now(), Err(why));
            continue;
        }
        match s {
            Entry::Boot(s) => {
                outln!("==> {}: {} (deadline {} s)", s.name, s.about, s.deadline.as_secs());
                let t0 = Instant::now();
                let (result, transcript) = leasebox_scenarios::run_and_check(s, &a);
                let failed = result.is_err();
                report(&mut outcomes, s.name, t0, result);
                if failed {
                    if let Some(t) = transcript {
                        print_failure_context(&t);
                    }
                    outln!("    full log: {}", a.log_dir.join(format!("{}.log", s.name)).display());
                }
            }
            Entry::Driven(d) => {
                outln!("==> {}: {}", d.name, d.about);
                let t0 = Instant::now();
                let result = (d.run)(&a);
                if let Ok(summary) = &result {
                    outln!("    {summary}");
                }
                report(&mut outcomes, d.name, t0, result.map(|_| ()));
            }
        }
    }

    let substituted = prebuilt.map(|elf| {
        format!(
            "image: {} from {} (not built from this tree); every scenario that boots leasebox.elf ran it (the \
             fence-test image is still built from this tree)",
            elf.display(),
            image::PREBUILT_ENV
        )
    });
    let (lines, ok) = closing_lines(&outcomes, &skipped, substituted.as_deref());
    for l in lines {
        outln!("{l}");
    }
    Ok(if ok { 0 } else { 1 })
}

/// The host steps of `cargo xtask test`, in order: (name, cargo arguments).
const HOST_STEPS: [(&str, &[&str]); 6] = [
    ("format", &["fmt", "--all", "--check"]),
    ("host-tests", &["test", "--workspace"]),
    // Limits that debug assertions could hide run again in a release build: the command tags across the lease
    // service's sequence limits and the engine's refusal of a reserved tag bit.
    ("release-limits", &["test", "--release", "-p", "leasebox-lease", "-p", "mlx5-hosted", "--", "tag_"]),
    ("clippy-host", &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
    // The verbs code (leasectl's backend, the hosted reference responder) linted with its feature on; it runs
    // in the rxe-qemu scenario (a Linux guest with Soft-RoCE).
    (
        "verbs-build",
        &[
            "clippy",
            "-p",
            "leasectl",
            "-p",
            "leasebox-hosted",
            "--features",
            "leasectl/verbs,leasebox-hosted/verbs",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ),
    (
        "clippy-kernel",
        &[
            "clippy",
            "-p",
            "leasebox-image",
            "-p",
            "leasebox-kernel",
            "-p",
            "leasebox-virtio-net",
            "--target",
            image::KERNEL_TARGET,
            "--",
            "-D",
            "warnings",
        ],
    ),
];

/// The step after [`HOST_STEPS`]: the Python binding built by pip (maturin) and its pytest suite against a
/// hosted appliance (xtask/src/python.rs). The C binding's tests (header staleness, the gcc-built example
/// against a hosted appliance) are `leasebox-client-c`'s, so they run in host-tests.
const PYTHON_STEP: &str = "python-client";

/// Every host step's name, in order (what `--step` accepts).
fn host_step_names() -> Vec<&'static str> {
    HOST_STEPS.iter().map(|(name, _)| *name).chain([PYTHON_STEP]).collect()
}

/// The closing lines of a test run: what was skipped, what was substituted for the tree's own build, then
/// `summary: N passed, M failed` (and the failed names). The bool: whether everything that ran passed.
fn closing_lines(outcomes: &[Outcome], skipped: &[String], substituted: Option<&str>) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    if !skipped.is_empty() {
        lines.push(format!("skipped: {}", skipped.join(", ")));
    }
    if let Some(s) = substituted {
        lines.push(format!("substituted: {s}"));
    }
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed).map(|o| o.name.as_str()).collect();
    let passed = outcomes.len() - failed.len();
    if failed.is_empty() {
        lines.push(format!("summary: {passed} passed, 0 failed"));
    } else {
        lines.push(format!("summary: {passed} passed, {} failed: {}", failed.len(), failed.join(", ")));
    }
    (lines, failed.is_empty())
}

fn print_failure_context(t: &leasebox_scenarios::Transcript) {
    const SERIAL_TAIL: usize = 15;
    const STDERR_TAIL: usize = 5;
    outln!("    qemu: {}", t.command);
    outln!("    last serial lines ({} in all):", t.lines.len());
    for l in t.tail(SERIAL_TAIL) {
        outln!("    | {l}");
    }
    let err: Vec<&str> = t.stderr.lines().collect();
    if !err.is_empty() {
        outln!("    qemu stderr:");
        for l in &err[err.len().saturating_sub(STDERR_TAIL)..] {
            outln!("    ! {l}");
        }
    }
}

/// Builds `b` where [`artifacts`] says it is.
fn build(p: &Paths, b: Build) -> Result<(), String> {
    match b {
        Build::Model => cargo_step(p, &["build", "-p", "mlx5-model"]),
        Build::Leasectl => cargo_step(p, &["build", "-p", "leasectl"]),
        Build::RxeGuest => {
            outln!("==> rxe guest: {}", p.out.join("rxe-guest").display());
            rxe_guest::build(p).map(drop)
        }
        Build::FenceTestImage => {
            outln!("==> fence-test image: {}", p.fence_test_elf().display());
            image::build_fence_test_kernel(p).map(drop)
        }
    }
}

fn cmd_bench(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    match o.kind {
        BenchKind::Control => return bench_control(o, p),
        BenchKind::Hca => return bench_hca(o, p),
        BenchKind::Lease => return bench_lease(o, p),
        BenchKind::Revoke => return bench_revoke(o, p),
        BenchKind::Client => return bench_client(o, p),
        BenchKind::Kv => return bench_kv(o),
        BenchKind::Rxe => return bench_rxe(o, p),
        BenchKind::Fleet => return bench_fleet(p),
        BenchKind::Scrub => return bench_scrub(p),
        // tests/src/handshake_bench.rs: the kernel and the model built, one QEMU appliance, the table printed.
        BenchKind::Handshake => {
            return prereq::ensure()
                .and_then(|()| image::build_kernel(p).map(drop))
                .and_then(|()| cargo_step(p, &["build", "-p", "mlx5-model"]))
                .and_then(|()| leasebox_scenarios::handshake_bench::run(&artifacts(p, false), o.secs))
                .map(|table| {
                    outln!("{}", table.trim_end());
                    0
                });
        }
        BenchKind::Boot => {}
    }
    prereq::ensure()?;
    image::build_all(p)?;
    let a = artifacts(p, false);
    leasebox_qemu::firmware::remove_stale(&a.scratch_dir, "ovmf-vars", "fd");
    let mut results = Vec::new();
    for row in bench::rows() {
        let mut r = bench::RowResult { row: row.clone(), samples: Vec::new(), failures: Vec::new() };
        for i in 1..=o.runs {
            match bench::sample(&row, &a) {
                Ok(s) => {
                    eprintln!(
                        "{} run {i}/{}: spawn → ready {:.1} ms, boot_ms {:.3}, ap_ms {:.3}, entry_ms {:.3}",
                        row.label, o.runs, s.total_ms, s.boot_ms, s.ap_ms, s.entry_ms
                    );
                    r.samples.push(s);
                }
                Err(e) => {
                    eprintln!("{} run {i}/{}: failed: {e}", row.label, o.runs);
                    r.failures.push(e);
                }
            }
        }
        results.push(r);
    }
    // The appliance as shipped (model attached, lease service up), per control NIC.
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let mut shipped = Vec::new();
    for nic in control::Nic::ALL {
        let mut r = bench::ControlResult { nic, samples: Vec::new(), failures: Vec::new() };
        let label = bench::control_label(nic);
        for i in 1..=o.runs {
            match bench::control_sample(&a, nic) {
                Ok(s) => {
                    eprintln!(
                        "{label} run {i}/{}: spawn → control port answers {:.1} ms, spawn → ready {:.1} ms",
                        o.runs, s.answers_ms, s.ready_ms
                    );
                    r.samples.push(s);
                }
                Err(e) => {
                    eprintln!("{label} run {i}/{}: failed: {e}", o.runs);
                    r.failures.push(e);
                }
            }
        }
        shipped.push(r);
    }
    let elf_bytes = std::fs::metadata(p.elf()).ok().map(|m| m.len());
    outln!();
    outln!("{}", bench::report(&results, elf_bytes).trim_end());
    outln!();
    outln!("{}", bench::control_report(&shipped).trim_end());
    Ok(0)
}

/// `bench control`: HEARTBEAT round trips per second and latency, 1 and 8 sessions, against the appliance as
/// shipped under QEMU (model attached, lease service up) with the control channel on virtio-net and on the
/// ConnectX-5 model's own Ethernet port, and against the hosted appliance; then memory per session. Prints
/// figures; asserts nothing (a target that does not boot leaves its rows empty, with the reason).
fn bench_control(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    prereq::ensure()?;
    image::build_all(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let a = artifacts(p, false);
    let dur = std::time::Duration::from_secs(o.secs);
    let mut rows = Vec::new();
    let mut image_allocs = Vec::new();
    let targets: Vec<Option<control::Nic>> = control::Nic::ALL.iter().copied().map(Some).chain([None]).collect();
    for nic in targets {
        let (label, t) = match nic {
            Some(n) => (format!("QEMU appliance, {} (TCG, 1 CPU)", n.label()), control::boot_qemu_nic(&a, 1, n, "")),
            None => ("hosted (std TCP)".to_string(), control::start_hosted(&[])),
        };
        for sessions in [1usize, 8] {
            let result = t.as_ref().map_err(Clone::clone).and_then(|t| control::heartbeat_load(t, sessions, dur));
            match &result {
                Ok((rate, p50, p99)) => eprintln!(
                    "{label}, {sessions} session(s): {rate:.0} round trips/s, p50 {p50:.0} µs, p99 {p99:.0} µs"
                ),
                Err(e) => eprintln!("{label}, {sessions} session(s): {e}"),
            }
            rows.push(control::LoadRow { target: label.clone(), sessions, result });
        }
        // ALLOC on the QEMU appliance, and its `net` loop's passes meanwhile (docs/latency.md).
        if let (Some(_), Ok(t)) = (nic, &t) {
            match control::alloc_loop_passes(t, dur) {
                Ok(((rate, p50, p99), per_alloc, us_per_pass)) => image_allocs.push(format!(
                    "ALLOC latency, {label}, 1 session, ALLOC+FREE loop: {rate:.0} ALLOCs/s, p50 {p50:.0} µs, p99 \
                     {p99:.0} µs; the net loop: {per_alloc:.1} passes per ALLOC, {us_per_pass:.1} µs per pass"
                )),
                Err(e) => image_allocs.push(format!("ALLOC latency, {label}: no figures: {e}")),
            }
        }
    }
    outln!();
    outln!("{}", control::load_table(&rows).trim_end());
    outln!(
        "(QEMU rows: the appliance as shipped — -kernel, q35, the mlx5 model attached, lease service up; the control \
         port forwarded by QEMU's user network, to virtio-net or, with no virtio-net, through a hub to the model's \
         Ethernet port)"
    );
    // ALLOC latency (the lease service's work plus the control channel's), hosted with the model, and where it
    // goes (the appliance's stage clock; docs/latency.md).
    let alloc = control::alloc_breakdown(dur);
    outln!();
    for line in &image_allocs {
        outln!("{line}");
    }
    match &alloc {
        Ok(((rate, p50, p99), stages)) => {
            outln!(
                "ALLOC latency, hosted --hca (std TCP, model attached, its firmware timing), 1 session, ALLOC+FREE \
                 loop: {rate:.0} ALLOCs/s, p50 {p50:.0} µs, p99 {p99:.0} µs"
            );
            outln!("{}", stages.trim_end());
        }
        Err(e) => outln!("ALLOC latency, hosted --hca: no figures: {e}"),
    }
    let (hs_us, rec_us) = control::v2_crypto_cost(100_000);
    outln!(
        "protocol v2 on this host's CPU (the bench's build): handshake {hs_us:.0} µs (both sides), one record sealed \
         and opened {rec_us:.2} µs (a HEARTBEAT round trip has two)"
    );
    outln!("(protocol v2: Noise NNpsk0 handshake, ChaCha20-Poly1305 records; v1 figures: docs/security.md, \"Cost\")");
    let per = control::hosted_bytes_per_session(32)?;
    outln!();
    outln!("memory per session: appliance TCP socket buffers 128 KiB (64 KiB each way, preallocated per socket);");
    outln!(
        "  hosted process RSS growth over 32 idle sessions (session state + both ends' threads): {:.1} KiB/session",
        per / 1024.0
    );
    outln!("({} s of load per row; TCG figures: compare ratios, not absolute times)", o.secs);
    Ok(0)
}

/// `bench kv`: the key-value store and the raw lease API against the hosted appliance in this process
/// (tests/src/kv_bench.rs). Prints; asserts nothing.
fn bench_kv(o: &BenchOpts) -> Result<i32, String> {
    outln!("==> bench kv: {} s per cell, hosted appliance with the model, software requester", o.secs);
    let table = leasebox_scenarios::kv_bench::table(Duration::from_secs(o.secs))?;
    outln!();
    outln!("{}", table.trim_end());
    outln!(
        "(per-call latency as the program sees it, a call being one batch; rates in values per second over all \
         threads; raw ÷ store above 1 is the store's own cost: its index, slab, pins and result routing)"
    );
    Ok(0)
}

/// `bench client`: the client library against the hosted appliance in this process (its threads, the model's
/// and the appliance's), 1 and 8 clients, one table (tests/src/client_bench.rs). Prints; asserts nothing.
fn bench_client(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    let per = Duration::from_secs(o.secs);
    outln!("==> bench client: {} s per phase, 1 then 8 clients, hosted appliance with the model", o.secs);
    let table = leasebox_scenarios::client_bench::table(per)?;
    outln!();
    outln!("{}", table.trim_end());
    outln!(
        "(latency per call as the program sees it; rates over all clients; the software requester runs on each \
         client's thread, the model's responder on one thread, on this machine's shared cores)"
    );
    // The data path: one client, one lease, half the phase time per cell.
    let cell = (per / 2).max(Duration::from_millis(500));
    outln!();
    outln!("==> bench client: data path, {} ms per cell, hosted appliance with the model", cell.as_millis());
    let rows = leasebox_scenarios::client_bench::data_path_rows(cell)?;
    // The same cells with verbs on rxe0 in the Soft-RoCE guest: against the QEMU appliance, then against the
    // rxe reference responder (a second guest). Each guest boots in 1–2 minutes under TCG; the cells take
    // 24 × the cell time per side. A side that fails reads "missing" with its reason under the table.
    outln!();
    outln!(
        "==> bench client: data path with verbs in the rxe guest, {} ms per cell: the QEMU appliance, then the rxe \
         reference responder",
        cell.as_millis()
    );
    let per_ms = cell.as_millis() as u64;
    let (rxe, reference) = match rxe_setup(p) {
        Ok(a) => {
            let rxe = leasebox_scenarios::rxe_bench::qemu(&a, per_ms);
            let reference = leasebox_scenarios::rxe_bench::reference(&a, per_ms);
            (rxe, reference)
        }
        Err(e) => {
            let e = format!("the rxe guest could not be set up: {e}");
            (Err(e.clone()), Err(e))
        }
    };
    let table = leasebox_scenarios::client_bench::data_path_table(&rows, &rxe, &reference);
    outln!();
    outln!(
        "Data path: one client, one lease, {} ms per cell; operations/s and MiB/s; the last column is ops/s of the \
         QEMU appliance ÷ the rxe reference",
        cell.as_millis()
    );
    outln!("{}", table.trim_end());
    outln!(
        "(zero copy: Op::write_from / Op::read_into batches from a registered region, depth operations in flight on \
         one lease; copying: Lease::write / Lease::read, which block, so depth 1; soft: the software requester on \
         this host against the hosted appliance; rxe: `leasectl bench-data --backend verbs` on rxe0 in a guest \
         under TCG; a 16 MiB lease (1 MiB at depth 64 reuses 16 of its slots), a 64 MiB region; against the QEMU appliance (the \
         model) and against a second guest serving memory with leasebox-hosted --verbs; compare ratios, not \
         absolute figures)"
    );
    Ok(0)
}

/// What the rxe columns of `bench client` need: the kernel, the model and the guest (with a leasectl that has
/// `bench-data`), as `bench rxe` builds them.
fn rxe_setup(p: &Paths) -> Result<leasebox_scenarios::Artifacts, String> {
    prereq::ensure()?;
    image::build_kernel(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    rxe_guest::build(p)?;
    Ok(artifacts(p, false))
}

/// `bench fleet`: the registrar's `fleet_bench` example (a real etcd, hosted appliances, native timing;
/// docs/fleet.md, "What scales how"). Prints; asserts nothing.
fn bench_fleet(p: &Paths) -> Result<i32, String> {
    // etcd (etcd-server) is one of the prerequisites.
    prereq::ensure()?;
    let table = run_example(p, "leasebox-registrar", "fleet_bench", &[])?;
    outln!("{}", table.trim_end());
    Ok(0)
}

/// Runs `cargo run --release -p PACKAGE --example EXAMPLE -- ARGS` and returns its stdout (the tables); build
/// output and progress go to stderr as they come.
fn run_example(p: &Paths, package: &str, example: &str, extra: &[&str]) -> Result<String, String> {
    let mut args = vec!["run", "--release", "-p", package, "--example", example, "--"];
    args.extend_from_slice(extra);
    outln!("==> cargo {}", args.join(" "));
    let out = Command::new(image::cargo())
        .current_dir(&p.root)
        .args(&args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("`cargo {}` failed ({})", args.join(" "), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `bench lease`: the `lease_bench` example of the lease crate (hosted, native timing), twice: first with the
/// engines polled round-robin from the service's loop (the image's one-CPU layout; two busy threads, which
/// this 2-core machine can run without preemption), then with the engines on their own thread (the three-core
/// layout; three busy threads on two cores, so its latencies mostly show the scheduler), then the one-CPU
/// layout again under the model's firmware command timing (what a client waits for: firmware commands per
/// ALLOC and per REVOKE immediate phase, and the latencies they make). The goals are judged on each. Prints
/// figures; asserts nothing.
fn bench_lease(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    let (secs, leases) = (o.secs.to_string(), o.leases.to_string());
    for (engines, timing, label) in [
        ("inline", "zero", "engines polled from the service loop (the one-CPU layout)"),
        (
            "thread",
            "zero",
            "engines on their own thread (the three-core layout, oversubscribed on this 2-core machine)",
        ),
        ("inline", "firmware", "the one-CPU layout under the model's firmware command timing"),
    ] {
        let table = run_example(
            p,
            "leasebox-lease",
            "lease_bench",
            &["--secs", &secs, "--leases", &leases, "--engines", engines, "--timing", timing],
        )?;
        outln!();
        outln!("#### {label}");
        outln!("{}", table.trim_end());
        outln!();
        outln!("{}", lease_bench::goals(lease_bench::Summary::parse(&table).as_ref()).trim_end());
        outln!();
    }
    Ok(0)
}

/// `bench revoke`: `leasectl verify --revoke-test` in process, `--iterations` per order, against the QEMU guest
/// (image, model, virtio-net) and the hosted appliance. Prints the table; asserts nothing.
/// `bench rxe`: builds what the rxe scenario needs, then the side-by-side table (`secs` holds --perf-ms).
fn bench_rxe(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    prereq::ensure()?;
    image::build_kernel(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    rxe_guest::build(p)?;
    let a = artifacts(p, false);
    outln!(
        "==> bench rxe: {} ms per figure; the QEMU appliance, the hosted appliance, then the rxe reference responder",
        o.secs
    );
    let t = leasebox_scenarios::rxe::bench(&a, o.secs)?;
    outln!();
    outln!("{}", t.trim_end());
    outln!(
        "(one client guest under TCG on this machine's 2 shared cores. QEMU: the model in its own process beside \
         the appliance's guest, whose polling core keeps one host core busy; hosted: the model's responder in the \
         test process; reference: a second guest. Compare ratios, not absolute figures)"
    );
    Ok(0)
}

fn bench_revoke(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    prereq::ensure()?;
    image::build_kernel(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let a = artifacts(p, false);
    // A guest that did not boot still leaves the hosted rows to print.
    let mut rows = revoke_bench::qemu(&a, &p.elf(), o.iterations).unwrap_or_else(|e| {
        eprintln!("{e}");
        let why = format!("boot: {}", e.lines().next().unwrap_or_default());
        let row =
            |order| revoke_bench::Row { target: revoke_bench::QEMU_TARGET.into(), order, result: Err(why.clone()) };
        revoke_bench::ORDERS.iter().map(|&order| row(order)).collect()
    });
    rows.extend(revoke_bench::hosted(o.iterations)?);
    outln!();
    outln!("{}", revoke_bench::table(&rows, o.iterations).trim_end());
    Ok(0)
}

/// `bench scrub`: the pool's preparation at boot and the appliance's answers while a large revoked lease is
/// scrubbed, under QEMU (the kernel built here or `LEASEBOX_KERNEL_ELF`) and hosted (the release build of
/// `leasebox-hosted` or `LEASEBOX_HOSTED_BIN`) (tests/src/scrub_bench.rs). Prints the tables; asserts nothing.
fn bench_scrub(p: &Paths) -> Result<i32, String> {
    prereq::ensure()?;
    image::build_kernel(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let kernel = match image::prebuilt_kernel() {
        Some(elf) => format!("{} (from {})", elf.display(), image::PREBUILT_ENV),
        None => format!("{} (built from this tree)", p.elf().display()),
    };
    let (hosted_bin, hosted) = match std::env::var_os(scrub_bench::HOSTED_BIN_ENV).filter(|v| !v.is_empty()) {
        Some(bin) => {
            let bin = std::path::PathBuf::from(bin);
            let what = format!("{} (from {})", bin.display(), scrub_bench::HOSTED_BIN_ENV);
            eprintln!("xtask: using {what} instead of building leasebox-hosted");
            (bin, what)
        }
        None => {
            cargo_step(p, &["build", "--release", "-p", "leasebox-hosted"])?;
            let bin = p.target.join("release").join("leasebox-hosted");
            let what = format!("{} (built from this tree)", bin.display());
            (bin, what)
        }
    };
    let a = artifacts(p, false);
    outln!(
        "==> bench scrub: QEMU boots with {:?} MiB pools (the last one scrubs a {} MiB lease), then the hosted \
         appliance with {} MiB (a {} GiB lease)",
        scrub_bench::QEMU_POOLS_MIB,
        scrub_bench::QEMU_LEASE >> 20,
        scrub_bench::HOSTED_POOL_MIB,
        scrub_bench::HOSTED_LEASE >> 30
    );
    let out = scrub_bench::run(&a, &p.elf(), &kernel, &hosted_bin, &hosted);
    outln!();
    outln!("{}", out.trim_end());
    Ok(0)
}

/// `bench hca`: the hosted `hca_bench` example (driver and model thread, native timing), then kernel entry →
/// HCA ready under TCG over `--runs` boots, then the goals. Prints figures; asserts nothing.
fn bench_hca(o: &BenchOpts, p: &Paths) -> Result<i32, String> {
    let hosted_table = run_example(p, "mlx5-hosted", "hca_bench", &["--secs", &o.secs.to_string()])?;
    let hosted = hca_bench::Hosted::parse(&hosted_table);

    prereq::ensure()?;
    image::build_kernel(p)?;
    cargo_step(p, &["build", "-p", "mlx5-model"])?;
    let a = artifacts(p, false);
    let (mut samples, mut failures) = (Vec::new(), Vec::new());
    for i in 1..=o.runs {
        match hca_bench::sample(&a) {
            Ok(s) => {
                eprintln!("hca boot {i}/{}: mlx5: up: at {:.3} ms, hca_ms {:.3}", o.runs, s.up_ms, s.hca_ms);
                samples.push(s);
            }
            Err(e) => {
                eprintln!("hca boot {i}/{}: failed: {e}", o.runs);
                failures.push(e);
            }
        }
    }
    outln!();
    outln!("{}", hosted_table.trim_end());
    outln!();
    outln!("{}", hca_bench::report(&samples, &failures).trim_end());
    outln!();
    outln!("{}", hca_bench::goals(hosted.as_ref()).trim_end());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, passed: bool) -> Outcome {
        Outcome { name: name.into(), passed }
    }

    #[test]
    fn closing_lines_name_skips_and_substitutions_and_end_in_the_counts() {
        let all_ok = [outcome("image", true), outcome("boot-kernel", true)];
        assert_eq!(closing_lines(&all_ok, &[], None), (vec!["summary: 2 passed, 0 failed".to_string()], true));

        let skipped: Vec<String> = host_step_names().iter().map(|n| format!("{n} (--boot-only)")).collect();
        let (lines, ok) = closing_lines(&all_ok, &skipped, Some("image: /x.elf from LEASEBOX_KERNEL_ELF"));
        assert!(ok);
        assert_eq!(
            lines,
            [
                "skipped: format (--boot-only), host-tests (--boot-only), release-limits (--boot-only), \
                 clippy-host (--boot-only), verbs-build (--boot-only), clippy-kernel (--boot-only), \
                 python-client (--boot-only)",
                "substituted: image: /x.elf from LEASEBOX_KERNEL_ELF",
                "summary: 2 passed, 0 failed",
            ]
        );

        let one_failed = [outcome("format", true), outcome("verbs-build", false)];
        let (lines, ok) = closing_lines(&one_failed, &[], None);
        assert!(!ok);
        assert_eq!(lines, ["summary: 1 passed, 1 failed: verbs-build"]);
    }
}
