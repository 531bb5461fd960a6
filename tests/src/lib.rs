//! Leasebox's QEMU boot scenarios, driven from the host by `cargo xtask test` (and `cargo xtask bench boot`).
//!
//! - [`serial`]: pure parsers for the kernel's console contract (log lines, AP report-ins, PCI listing, the
//!   ready line, exception and panic markers).
//! - [`transcript`]: the record of one boot and the questions asked of it.
//! - [`scenario`]: the scenario list ([`scenario::all`]): boot scenarios (runner configuration, stop condition,
//!   deadline and check) and driven ones (a runner that boots the image and drives clients against it:
//!   [`control`], [`lease_qemu`], [`crash_qemu`], [`ctl_mlx5`]).
//! - [`bench`]: boot-time measurements over the same runner.
//! - [`run`] boots one scenario: it spawns QEMU through `leasebox-qemu`, reads serial lines until the scenario
//!   has what it needs or its deadline passes, kills and reaps QEMU, and writes the transcript to a log file.
#![forbid(unsafe_code)]

pub mod bench;
pub mod client_bench;
pub mod control;
pub mod crash_qemu;
pub mod ctl_mlx5;
pub mod fleet_qemu;
pub mod handshake_bench;
pub mod hca_bench;
pub mod kv_bench;
pub mod lease_bench;
pub mod lease_qemu;
pub mod pytest;
pub mod revoke_bench;
pub mod rxe;
pub mod rxe_bench;
pub mod scale_qemu;
pub mod scenario;
pub mod scrub_bench;
pub mod serial;
pub mod transcript;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use leasebox_qemu::config::DEFAULT_CPU;
use leasebox_qemu::model::{self, ModelCommand, ModelProcess, ModelShm};
use leasebox_qemu::{NextLine, Ovmf, QemuProcess, Stdio};

pub use scenario::{BootKind, Build, Driven, Entry, Scenario, Until};
pub use transcript::Transcript;

/// Serial lines kept per run; a guest that floods the console cannot exhaust host memory.
pub const MAX_LINES: usize = 200_000;
/// How long to wait for QEMU's exit status once it has closed its stdout.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// What the scenarios boot and where they keep scratch files and logs.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// `target/leasebox/leasebox.elf`
    pub elf: PathBuf,
    /// `target/leasebox/leasebox.iso` (default kernel arguments)
    pub iso: PathBuf,
    pub ovmf: Option<Ovmf>,
    /// Where per-run OVMF vars copies go.
    pub scratch_dir: PathBuf,
    /// Where `<scenario>.log` transcripts go.
    pub log_dir: PathBuf,
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The `-cpu` model.
    pub cpu: String,
    /// Copy serial output to stdout as it arrives.
    pub echo: bool,
    /// The `mlx5-model` binary for scenarios that boot with the model (`cargo build -p mlx5-model`).
    pub model_bin: PathBuf,
    /// The `leasectl` binary the driven scenarios run (`cargo build -p leasectl`).
    pub leasectl_bin: PathBuf,
    /// The kernel built with the `fence-test` feature (`lease-qemu`'s second boot).
    pub fence_test_elf: PathBuf,
    /// Where the model's shared files go (`/dev/shm`).
    pub shm_dir: PathBuf,
    /// The Soft-RoCE guest (`cargo xtask rxe-guest`) for the `rxe` scenarios.
    pub rxe_guest: rxe::Guest,
}

impl Artifacts {
    /// Artifacts under `<target>/leasebox/`.
    pub fn in_target_dir(target: &std::path::Path) -> Artifacts {
        let dir = target.join("leasebox");
        Artifacts {
            elf: dir.join("leasebox.elf"),
            iso: dir.join("leasebox.iso"),
            ovmf: Ovmf::find(),
            scratch_dir: dir.clone(),
            log_dir: dir.join("scenarios"),
            qemu: PathBuf::from("qemu-system-x86_64"),
            cpu: DEFAULT_CPU.to_string(),
            echo: false,
            model_bin: target.join("debug").join("mlx5-model"),
            leasectl_bin: target.join("debug").join("leasectl"),
            fence_test_elf: dir.join("leasebox-fence-test.elf"),
            shm_dir: leasebox_qemu::model::shm_dir(),
            rxe_guest: rxe::Guest::in_target_dir(target),
        }
    }

    #[cfg(test)]
    pub(crate) fn for_tests() -> Artifacts {
        let mut a = Artifacts::in_target_dir(&std::env::temp_dir().join("leasebox-scenarios-test"));
        a.ovmf = None;
        a
    }
}

/// Boots `s` and records what happened. `Err` only when QEMU could not be started; everything that happens
/// after that is in the transcript for the scenario's check.
pub fn run(s: &Scenario, a: &Artifacts) -> Result<Transcript, String> {
    let (mut config, scratch) = s.qemu_config(a)?;
    // With the model: fresh shared files, and the model started (signature written) before QEMU. Declared
    // before QEMU, so they are dropped after it: QEMU is reaped, then the model stopped, then the files deleted.
    let (_shm, _model) = if s.model { start_model(s, a, &mut config)? } else { (None, None) };
    if s.com2 || s.spcr_port.is_some() {
        std::fs::create_dir_all(&a.log_dir).map_err(|e| format!("creating {}: {e}", a.log_dir.display()))?;
    }
    if s.com2 {
        let _ = std::fs::remove_file(s.com1_path(a));
    }
    if let Some(port) = s.spcr_port {
        let path = s.spcr_path(a);
        std::fs::write(&path, scenario::spcr_body(port)).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let mut q = QemuProcess::spawn(&config, Stdio::Capture { echo: a.echo }, scratch).map_err(|e| e.to_string())?;
    let started = q.started();
    let deadline = started + s.deadline;
    let mut t = Transcript { command: q.command().to_string(), deadline: s.deadline, ..Transcript::default() };
    let mut settle_until: Option<Instant> = None;
    let mut closed = false;
    loop {
        match q.next_line(settle_until.map_or(deadline, |u| u.min(deadline))) {
            NextLine::Line(line) => {
                if s.until == Until::Ready && t.ready_after.is_none() && serial::parse_ready(&line.text).is_some() {
                    t.ready_after = Some(line.at.saturating_duration_since(started));
                    settle_until = Some(line.at + scenario::SETTLE);
                }
                if t.lines.len() < MAX_LINES {
                    t.lines.push(line.text);
                } else {
                    t.dropped_lines += 1;
                }
            }
            NextLine::Closed => {
                closed = true;
                break;
            }
            NextLine::TimedOut => {
                // During the settle time after the ready line the deadline is not a failure.
                t.timed_out = settle_until.is_none();
                break;
            }
        }
    }
    if closed {
        // QEMU closed stdout: it is exiting; collect its status (bounded).
        t.exit = q.wait_until(Instant::now() + EXIT_GRACE).map_err(|e| e.to_string())?;
    } else if let Ok(Some(exit)) = q.try_exit() {
        t.exit = Some(exit);
    }
    // Reap (killing first if it is still running) and collect the reader threads.
    q.kill().map_err(|e| e.to_string())?;
    t.stderr = q.stderr_text();
    drop(q);
    if s.model {
        t.model_trace = std::fs::read_to_string(model_trace_path(a, s.name)).ok();
    }
    if s.com2 {
        t.com1 = std::fs::read_to_string(s.com1_path(a)).ok();
    }
    write_log(a, s.name, &t);
    Ok(t)
}

/// The shared files and the model process for `s`; `config` gets the files. The model's stderr goes to
/// `<log_dir>/<name>.model.log`, its trace to `<log_dir>/<name>.mlx5-trace.jsonl`.
fn start_model(
    s: &Scenario,
    a: &Artifacts,
    config: &mut leasebox_qemu::QemuConfig,
) -> Result<(Option<ModelShm>, Option<ModelProcess>), String> {
    let shm = ModelShm::create(&a.shm_dir, model::DEFAULT_BAR_BYTES, config.mem_mib).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&a.log_dir).map_err(|e| format!("creating {}: {e}", a.log_dir.display()))?;
    let mut cmd = ModelCommand::new(a.model_bin.clone());
    cmd.log = Some(a.log_dir.join(format!("{}.model.log", s.name)));
    cmd.trace = Some(model_trace_path(a, s.name));
    cmd.vf = s.model_vf;
    // The VF behind a legacy e-switch whose firmware refuses the port registers' reads as well: the driver must
    // publish its MAC and fall back to the vport (docs/hca-model.md, "VF personality").
    cmd.vf_port_reads_refused = s.model_vf;
    let proc = ModelProcess::spawn(&cmd, shm.files(), config.mem_mib, model::READY_TIMEOUT)
        .map_err(|e| format!("{e} (binary {})", a.model_bin.display()))?;
    config.model = Some(shm.files().clone());
    Ok((Some(shm), Some(proc)))
}

/// Where the model started for scenario `name` writes its command trace.
pub fn model_trace_path(a: &Artifacts, name: &str) -> PathBuf {
    a.log_dir.join(format!("{name}.mlx5-trace.jsonl"))
}

fn write_log(a: &Artifacts, name: &str, t: &Transcript) {
    if std::fs::create_dir_all(&a.log_dir).is_ok() {
        let _ = std::fs::write(a.log_dir.join(format!("{name}.log")), t.render());
    }
}

/// Runs `s` and applies its check: `Ok` on a pass, `Err(reason)` otherwise. Also returns the transcript when
/// there is one.
pub fn run_and_check(s: &Scenario, a: &Artifacts) -> (Result<(), String>, Option<Transcript>) {
    match run(s, a) {
        Ok(t) => ((s.check)(&t), Some(t)),
        Err(e) => (Err(format!("could not start QEMU: {e}")), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `qemu-system-x86_64` that prints canned serial output: the shell code to run is passed as the
    /// `-kernel` boot's `-append` string.
    fn fake_qemu(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("fake-qemu.sh");
        leasebox_qemu::fake::write_fake_qemu(&path).unwrap();
        path
    }

    fn fake_scenario(script: &'static str, until: Until, deadline_ms: u64) -> Scenario {
        Scenario {
            kernel_args: script,
            until,
            deadline: Duration::from_millis(deadline_ms),
            ..scenario::boot_scenario("kernel-smp1-pc").unwrap()
        }
    }

    /// One test drives all fake runs sequentially (one executable, written before any fork: no ETXTBSY).
    #[test]
    fn run_with_a_fake_qemu() {
        let dir = leasebox_qemu::firmware::unique_path(&std::env::temp_dir(), "leasebox-scen", "d");
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = Artifacts::in_target_dir(&dir);
        a.qemu = fake_qemu(&dir);

        // Ready, then hang: the runner stops after the settle time, long before the deadline.
        let s = fake_scenario(
            "printf '[    0.000001] c0 INFO  hi\\r\\nleasebox: ready cores=1 pci=0 boot_ms=1.000\\r\\n'; exec sleep 30",
            Until::Ready,
            20_000,
        );
        let t = run(&s, &a).unwrap();
        // Neither the deadline nor the fake's exit (after 30 s) ended the run: the ready line and the settle did.
        assert!(!t.timed_out);
        assert_eq!(t.exit, None);
        assert!(t.ready_after.is_some());
        assert_eq!(t.lines.len(), 2);
        assert!(a.log_dir.join("kernel-smp1-pc.log").exists());

        // Silence: the deadline ends the run.
        let s = fake_scenario("exec sleep 30", Until::Ready, 300);
        let t = run(&s, &a).unwrap();
        assert!(t.timed_out);
        assert!(t.ready().unwrap_err().contains("deadline"));

        // Exit with status 3.
        let s = fake_scenario("echo 'PANIC boom'; echo warn >&2; exit 3", Until::Exit, 20_000);
        let t = run(&s, &a).unwrap();
        assert!(t.exit.unwrap().is_guest_failure());
        assert_eq!(t.stderr.trim(), "warn");
        assert_eq!(scenario::check_fault_panic(&t), Ok(()));

        // QEMU that dies before the ready line.
        let s = fake_scenario("echo 'qemu: bad option' >&2; exit 1", Until::Ready, 20_000);
        let (r, _) = run_and_check(&s, &a);
        assert!(r.unwrap_err().contains("status 1"));

        // QEMU that cannot start.
        a.qemu = dir.join("missing");
        let (r, t) = run_and_check(&s, &a);
        assert!(r.unwrap_err().contains("could not start"));
        assert!(t.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
