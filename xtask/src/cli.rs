//! Command-line parsing for `cargo xtask` (by hand: a few flags, clear errors, no panics).

use leasebox_qemu::Machine;
use leasebox_qemu::config::{DEFAULT_CPU, DEFAULT_MEM_MIB, MAX_SMP};

/// The host port `run` forwards to the guest's control port.
pub const DEFAULT_CONTROL_PORT: u16 = 7470;

pub const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  image                 build the kernel and the GRUB ISO:
                        target/leasebox/leasebox.elf, target/leasebox/leasebox.iso
  run [options] [-- kernel args...]
                        build what is needed and boot under QEMU (TCG), serial console on this terminal,
                        until the guest exits or Ctrl-C. Exits with QEMU's status (3 = the guest reported a
                        failure through isa-debug-exit; 128+N = killed by signal N).
                        The control port is forwarded to 127.0.0.1:7470 (virtio-net, QEMU user networking);
                        fresh keys for the tenant `demo` and the admin are passed to the kernel and written
                        to leasectl's configuration file (0600; the path is printed), so
                        `cargo run -p leasectl -- ping` works from another terminal. Kernel args naming
                        tenant= or admin= replace the generated keys (and no file is written)
                        The mlx5 model (qemu/mlx5-model, CI's ConnectX-5) runs beside QEMU by default:
                        guest RAM and an ivshmem BAR in fresh files under /dev/shm, the model process
                        started before QEMU and stopped after it, the files deleted afterwards
      --port N          host port forwarded to the control port (default 7470)
      --no-model        boot without the mlx5 model (no shared files, no ivshmem, no model process)
      --trace PATH      the model's command trace (default target/leasebox/mlx5-trace.jsonl)
      --iso             boot the GRUB ISO on SeaBIOS instead of QEMU -kernel
      --uefi            boot the GRUB ISO on OVMF (UEFI); implies --iso
      --smp N           CPUs (default 1)
      --mem MiB         guest memory (default 256; at most 2048 with the model)
      --machine pc|q35  chipset (default q35; pc has no ECAM, so the kernel uses 0xCF8 PCI access)
      --cpu MODEL       QEMU -cpu model (default max)
      --device SPEC     add -device SPEC (repeatable)
      --object SPEC     add -object SPEC (repeatable)
      --qemu-arg ARG    add one raw QEMU argument (repeatable)
      --timeout SECS    kill QEMU after SECS seconds
      --dry-run         print the QEMU command line and exit
      kernel args       e.g. log=debug cores=... test=pagefault; with --iso/--uefi they are baked into
                        target/leasebox/run.iso
  test [options] [SCENARIO...]
                        host tests (cargo test --workspace), clippy (host, and the kernel target), image and
                        ISO build, then the QEMU boot scenarios one after another; PASS/FAIL lines and a summary
      --boot-only       only the image build and the boot scenarios (the summary names the skipped steps)
      --list            list the boot scenarios and exit
      --verbose         copy each scenario's serial output to stdout as it arrives
  bench boot [--runs N] boot-time table (medians of N runs, default 5) for -kernel, GRUB BIOS, GRUB UEFI
  bench control [--secs N]  HEARTBEAT round trips/s and p50/p99 with 1 and 8 sessions, QEMU guest and hosted
                        and -kernel with 3 CPUs, plus the size of leasebox.elf; asserts nothing
  bench hca [--secs N] [--runs N]
                        mlx5 command path: hosted (driver + model thread, native, N s per row, default 2)
                        QUERY_MKEY and CREATE+DESTROY_MKEY rates with 1 and 31 slots, p50/p99, driver ns per
                        command; then QEMU (-kernel, 1 CPU, TCG, model; N boots, default 3) kernel entry →
                        `mlx5: up:` and hca_ms; then the goals (32 slots ≥ 10× 1 slot, driver ≤ 2 µs per
                        command); asserts nothing
  bench lease [--secs N] [--leases N]
                        lease service, hosted (model thread, engines thread, service on this one; native):
                        ALLOC and REVOKE p50/p99, rate, appliance-side and service CPU time, HCA commands
                        per op with 1 and 8 clients (N s per row, default 2); mass revoke of N leases
                        (default 10000): last outcome and all swept vs the same HCA commands alone over the
                        32 command slots; then the goals (REVOKE appliance-side ≤ 2 µs p99 with 8 clients,
                        ALLOC appliance-side ≤ 5 µs p99, mass revoke ≤ 1.5× the model alone); asserts
                        nothing
  bench revoke [--iterations N]
                        leasectl verify --revoke-test in process, N iterations per order (default 20), for
                        mkey-first and qp-first against the QEMU guest (image, model, virtio-net) and the
                        hosted appliance: control-plane recall and dataplane first-fail latency p50/p99/max
                        and the failing completion status; asserts nothing
  prereqs               check (and, as root with apt-get, install) QEMU, GRUB (BIOS and EFI), xorriso,
                        mtools, OVMF, and for leasectl's verbs backend libibverbs-dev, librdmacm-dev,
                        pkg-config and libclang-dev; each is probed where its user looks for it
  help                  this text

run, test, bench and image check the host prerequisites first and install missing Debian packages when
running as root (otherwise they print the apt-get command to run).
LEASEBOX_KERNEL_ELF=<path> makes image/run/test/bench use that prebuilt kernel ELF instead of building
leasebox-image (the host tests and clippy still build the workspace); `test` names the substitution in its
summary, and .ci/run ignores the variable (CI tests the kernel its checkout builds).";

/// A parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    Help,
    Image,
    Prereqs,
    Run(RunOpts),
    Test(TestOpts),
    Bench(BenchOpts),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOpts {
    pub iso: bool,
    pub uefi: bool,
    pub smp: u32,
    pub mem_mib: u32,
    pub machine: Machine,
    pub cpu: String,
    /// Extra QEMU arguments in order.
    pub extra: Vec<String>,
    pub timeout_secs: Option<u64>,
    pub dry_run: bool,
    /// The host port forwarded to the guest's control port.
    pub port: u16,
    /// Run the mlx5 model beside QEMU (`--no-model` turns it off).
    pub model: bool,
    /// The model's trace file (`None`: `target/leasebox/mlx5-trace.jsonl`).
    pub trace: Option<String>,
    pub kernel_args: Vec<String>,
}

impl Default for RunOpts {
    fn default() -> Self {
        RunOpts {
            iso: false,
            uefi: false,
            smp: 1,
            mem_mib: DEFAULT_MEM_MIB,
            machine: Machine::Q35,
            cpu: DEFAULT_CPU.to_string(),
            extra: Vec::new(),
            timeout_secs: None,
            dry_run: false,
            port: DEFAULT_CONTROL_PORT,
            model: true,
            trace: None,
            kernel_args: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestOpts {
    pub boot_only: bool,
    pub list: bool,
    pub verbose: bool,
    pub scenarios: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchKind {
    Boot,
    Control,
    Hca,
    Lease,
    Revoke,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchOpts {
    pub kind: BenchKind,
    pub runs: usize,
    /// `bench control`, `bench hca`, `bench lease`: seconds of load per row.
    pub secs: u64,
    /// `bench lease`: leases in the mass revoke.
    pub leases: u32,
    /// `bench revoke`: verifier iterations per order and target.
    pub iterations: u32,
}

/// Splits `--flag=value` and fetches the value of a flag that takes one.
struct Args<I: Iterator<Item = String>> {
    it: I,
}

impl<I: Iterator<Item = String>> Args<I> {
    fn value(&mut self, flag: &str, inline: Option<String>) -> Result<String, String> {
        match inline {
            Some(v) => Ok(v),
            None => self.it.next().ok_or_else(|| format!("{flag} needs a value")),
        }
    }
}

fn number<T>(flag: &str, v: &str, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match v.parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(format!("{flag} needs a number from {min} to {max}, got `{v}`")),
    }
}

fn no_value(flag: &str, inline: &Option<String>) -> Result<(), String> {
    match inline {
        Some(_) => Err(format!("{flag} takes no value")),
        None => Ok(()),
    }
}

/// Parses the arguments after `cargo xtask`.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Cmd, String> {
    let mut it = args.into_iter();
    let Some(cmd) = it.next() else {
        return Ok(Cmd::Help);
    };
    let mut a = Args { it };
    match cmd.as_str() {
        "help" | "-h" | "--help" => Ok(Cmd::Help),
        "image" => no_more(&mut a, "image").map(|_| Cmd::Image),
        "prereqs" => no_more(&mut a, "prereqs").map(|_| Cmd::Prereqs),
        "run" => parse_run(&mut a).map(Cmd::Run),
        "test" => parse_test(&mut a).map(Cmd::Test),
        "bench" => parse_bench(&mut a).map(Cmd::Bench),
        other => Err(format!("unknown command `{other}`")),
    }
}

fn no_more<I: Iterator<Item = String>>(a: &mut Args<I>, cmd: &str) -> Result<(), String> {
    match a.it.next() {
        None => Ok(()),
        Some(x) => Err(format!("`{cmd}` takes no arguments, got `{x}`")),
    }
}

fn split(arg: &str) -> (String, Option<String>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
        _ => (arg.to_string(), None),
    }
}

fn parse_run<I: Iterator<Item = String>>(a: &mut Args<I>) -> Result<RunOpts, String> {
    let mut o = RunOpts::default();
    while let Some(arg) = a.it.next() {
        let (flag, inline) = split(&arg);
        match flag.as_str() {
            "--" => {
                o.kernel_args = a.it.by_ref().collect();
                break;
            }
            "--iso" => {
                no_value(&flag, &inline)?;
                o.iso = true;
            }
            "--uefi" => {
                no_value(&flag, &inline)?;
                o.uefi = true;
                o.iso = true;
            }
            "--dry-run" => {
                no_value(&flag, &inline)?;
                o.dry_run = true;
            }
            "--no-model" => {
                no_value(&flag, &inline)?;
                o.model = false;
            }
            "--trace" => {
                let v = a.value(&flag, inline)?;
                if v.is_empty() || v.starts_with('-') {
                    return Err(format!("--trace needs a file path, got `{v}`"));
                }
                o.trace = Some(v);
            }
            "--smp" => o.smp = number(&flag, &a.value(&flag, inline)?, 1, MAX_SMP)?,
            "--mem" => o.mem_mib = number(&flag, &a.value(&flag, inline)?, 16, 1024 * 1024)?,
            "--machine" => o.machine = a.value(&flag, inline)?.parse()?,
            "--cpu" => {
                let v = a.value(&flag, inline)?;
                if v.is_empty() || v.starts_with('-') {
                    return Err(format!("--cpu needs a CPU model, got `{v}`"));
                }
                o.cpu = v;
            }
            "--device" | "--object" => {
                let v = a.value(&flag, inline)?;
                if v.is_empty() {
                    return Err(format!("{flag} needs a value"));
                }
                o.extra.push(format!("-{}", &flag[2..]));
                o.extra.push(v);
            }
            "--qemu-arg" => o.extra.push(a.value(&flag, inline)?),
            "--timeout" => o.timeout_secs = Some(number(&flag, &a.value(&flag, inline)?, 1, 7 * 24 * 3600)?),
            "--port" => o.port = number(&flag, &a.value(&flag, inline)?, 1, u16::MAX)?,
            f if f.starts_with('-') => return Err(format!("unknown option `{f}` for `run`")),
            other => {
                return Err(format!("unexpected argument `{other}` (kernel arguments go after `--`)"));
            }
        }
    }
    Ok(o)
}

fn parse_test<I: Iterator<Item = String>>(a: &mut Args<I>) -> Result<TestOpts, String> {
    let mut o = TestOpts::default();
    for arg in a.it.by_ref() {
        let (flag, inline) = split(&arg);
        match flag.as_str() {
            "--boot-only" => {
                no_value(&flag, &inline)?;
                o.boot_only = true;
            }
            "--list" => {
                no_value(&flag, &inline)?;
                o.list = true;
            }
            "--verbose" | "-v" => {
                no_value(&flag, &inline)?;
                o.verbose = true;
            }
            f if f.starts_with('-') => return Err(format!("unknown option `{f}` for `test`")),
            name => o.scenarios.push(name.to_string()),
        }
    }
    Ok(o)
}

fn parse_bench<I: Iterator<Item = String>>(a: &mut Args<I>) -> Result<BenchOpts, String> {
    let kind = match a.it.next().as_deref() {
        Some("boot") => BenchKind::Boot,
        Some("control") => BenchKind::Control,
        Some("hca") => BenchKind::Hca,
        Some("lease") => BenchKind::Lease,
        Some("revoke") => BenchKind::Revoke,
        Some(other) => {
            return Err(format!("unknown benchmark `{other}` (available: boot, control, hca, lease, revoke)"));
        }
        None => return Err("`bench` needs a benchmark name (available: boot, control, hca, lease, revoke)".into()),
    };
    let leases = leasebox_scenarios::lease_bench::DEFAULT_LEASES;
    let iterations = leasebox_scenarios::revoke_bench::DEFAULT_ITERATIONS;
    let mut o = match kind {
        BenchKind::Hca => {
            BenchOpts { kind, runs: leasebox_scenarios::hca_bench::DEFAULT_RUNS, secs: 2, leases, iterations }
        }
        BenchKind::Lease => {
            BenchOpts { kind, runs: 1, secs: leasebox_scenarios::lease_bench::DEFAULT_SECS, leases, iterations }
        }
        _ => BenchOpts { kind, runs: leasebox_scenarios::bench::DEFAULT_RUNS, secs: 3, leases, iterations },
    };
    while let Some(arg) = a.it.next() {
        let (flag, inline) = split(&arg);
        match (kind, flag.as_str()) {
            (BenchKind::Boot | BenchKind::Hca, "--runs") => o.runs = number(&flag, &a.value(&flag, inline)?, 1, 1000)?,
            (BenchKind::Control | BenchKind::Hca | BenchKind::Lease, "--secs") => {
                o.secs = number(&flag, &a.value(&flag, inline)?, 1, 600)? as u64
            }
            (BenchKind::Lease, "--leases") => {
                let max = leasebox_scenarios::lease_bench::MAX_LEASES;
                o.leases = number(&flag, &a.value(&flag, inline)?, 8, max)?
            }
            (BenchKind::Revoke, "--iterations") => {
                let max = leasebox_scenarios::revoke_bench::MAX_ITERATIONS;
                o.iterations = number(&flag, &a.value(&flag, inline)?, 1, max)?
            }
            (_, other) => return Err(format!("unknown option `{other}` for this benchmark")),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cmd, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    fn run(args: &[&str]) -> RunOpts {
        match p(&[&["run"], args].concat()) {
            Ok(Cmd::Run(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn top_level() {
        assert_eq!(p(&[]), Ok(Cmd::Help));
        assert_eq!(p(&["help"]), Ok(Cmd::Help));
        assert_eq!(p(&["--help"]), Ok(Cmd::Help));
        assert_eq!(p(&["image"]), Ok(Cmd::Image));
        assert_eq!(p(&["prereqs"]), Ok(Cmd::Prereqs));
        assert!(p(&["image", "x"]).unwrap_err().contains("no arguments"));
        assert!(p(&["frobnicate"]).unwrap_err().contains("frobnicate"));
    }

    #[test]
    fn run_defaults_and_flags() {
        assert_eq!(run(&[]), RunOpts::default());
        let o = run(&[
            "--uefi",
            "--smp",
            "3",
            "--mem=512",
            "--machine",
            "pc",
            "--cpu",
            "qemu64",
            "--device",
            "e1000",
            "--object=memory-backend-ram,id=m,size=1M",
            "--qemu-arg",
            "-S",
            "--timeout",
            "30",
            "--port",
            "7471",
            "--",
            "log=debug",
            "test=panic",
            "--iso",
        ]);
        assert!(o.uefi && o.iso);
        assert_eq!((o.smp, o.mem_mib, o.machine), (3, 512, Machine::Pc));
        assert_eq!(o.cpu, "qemu64");
        assert_eq!(o.extra, ["-device", "e1000", "-object", "memory-backend-ram,id=m,size=1M", "-S"]);
        assert_eq!(o.timeout_secs, Some(30));
        assert_eq!((o.port, run(&[]).port), (7471, 7470));
        assert_eq!(o.kernel_args, ["log=debug", "test=panic", "--iso"]);
        assert!(run(&["--iso"]).iso);
        assert!(!run(&["--iso"]).uefi);
        assert!(run(&[]).model && run(&[]).trace.is_none());
        assert!(!run(&["--no-model"]).model);
        assert_eq!(run(&["--trace", "/tmp/t.jsonl"]).trace.as_deref(), Some("/tmp/t.jsonl"));
        assert_eq!(run(&["--trace=t.jsonl"]).trace.as_deref(), Some("t.jsonl"));
    }

    #[test]
    fn run_errors_are_clear() {
        let e = |args: &[&str]| p(&[&["run"], args].concat()).unwrap_err();
        assert!(e(&["--smp"]).contains("--smp needs a value"));
        assert!(e(&["--smp", "zero"]).contains("--smp needs a number"));
        assert!(e(&["--smp", "0"]).contains("from 1"));
        assert!(e(&["--smp", "-3"]).contains("--smp"));
        assert!(e(&["--mem", "99999999999999999999"]).contains("--mem"));
        assert!(e(&["--machine", "isapc"]).contains("isapc"));
        assert!(e(&["--iso=yes"]).contains("takes no value"));
        assert!(e(&["--fast"]).contains("unknown option `--fast`"));
        assert!(e(&["log=debug"]).contains("after `--`"));
        assert!(e(&["--cpu", "--iso"]).contains("CPU model"));
        assert!(e(&["--device="]).contains("needs a value"));
        assert!(e(&["--port", "0"]).contains("--port needs a number from 1 to 65535"));
        assert!(e(&["--port", "65536"]).contains("--port"));
        assert!(e(&["--no-model=yes"]).contains("takes no value"));
        assert!(e(&["--trace"]).contains("--trace needs a value"));
        assert!(e(&["--trace", "--iso"]).contains("file path"));
    }

    #[test]
    fn test_and_bench() {
        assert_eq!(p(&["test"]), Ok(Cmd::Test(TestOpts::default())));
        assert_eq!(
            p(&["test", "--boot-only", "-v", "grub-bios"]),
            Ok(Cmd::Test(TestOpts {
                boot_only: true,
                list: false,
                verbose: true,
                scenarios: vec!["grub-bios".into()]
            }))
        );
        assert!(p(&["test", "--fast"]).unwrap_err().contains("--fast"));
        let boot =
            |runs| Cmd::Bench(BenchOpts { kind: BenchKind::Boot, runs, secs: 3, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "boot"]), Ok(boot(5)));
        assert_eq!(p(&["bench", "boot", "--runs", "2"]), Ok(boot(2)));
        assert_eq!(
            p(&["bench", "control", "--secs", "4"]),
            Ok(Cmd::Bench(BenchOpts { kind: BenchKind::Control, runs: 5, secs: 4, leases: 10_000, iterations: 20 }))
        );
        assert!(p(&["bench", "control", "--runs", "2"]).is_err());
        assert!(p(&["bench"]).unwrap_err().contains("needs a benchmark"));
        assert!(p(&["bench", "net"]).unwrap_err().contains("net"));
        assert!(p(&["bench", "boot", "--runs", "0"]).is_err());
        let hca =
            |runs, secs| Cmd::Bench(BenchOpts { kind: BenchKind::Hca, runs, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "hca"]), Ok(hca(3, 2)));
        assert_eq!(p(&["bench", "hca", "--secs", "1", "--runs=2"]), Ok(hca(2, 1)));
        assert!(p(&["bench", "hca", "--secs", "0"]).unwrap_err().contains("--secs needs a number from 1"));
        assert!(p(&["bench", "hca", "--sessions", "8"]).unwrap_err().contains("--sessions"));
        assert!(p(&["bench", "boot", "--secs", "1"]).is_err());
        assert!(p(&["bench", "net"]).unwrap_err().contains("hca"));
        let lease =
            |secs, leases| Cmd::Bench(BenchOpts { kind: BenchKind::Lease, runs: 1, secs, leases, iterations: 20 });
        assert_eq!(p(&["bench", "lease"]), Ok(lease(2, 10_000)));
        assert_eq!(p(&["bench", "lease", "--secs", "1", "--leases=2000"]), Ok(lease(1, 2000)));
        assert!(p(&["bench", "lease", "--leases", "7"]).unwrap_err().contains("--leases needs a number from 8"));
        assert!(p(&["bench", "lease", "--leases", "16001"]).is_err());
        assert!(p(&["bench", "lease", "--runs", "2"]).unwrap_err().contains("--runs"));
        assert!(p(&["bench", "hca", "--leases", "100"]).is_err());
        assert!(p(&["bench", "net"]).unwrap_err().contains("lease"));
        let revoke = |iterations| {
            Cmd::Bench(BenchOpts { kind: BenchKind::Revoke, runs: 5, secs: 3, leases: 10_000, iterations })
        };
        assert_eq!(p(&["bench", "revoke"]), Ok(revoke(20)));
        assert_eq!(p(&["bench", "revoke", "--iterations", "5"]), Ok(revoke(5)));
        assert_eq!(p(&["bench", "revoke", "--iterations=1"]), Ok(revoke(1)));
        assert!(
            p(&["bench", "revoke", "--iterations", "0"]).unwrap_err().contains("--iterations needs a number from 1")
        );
        assert!(p(&["bench", "revoke", "--secs", "2"]).unwrap_err().contains("--secs"));
        assert!(p(&["bench", "lease", "--iterations", "2"]).unwrap_err().contains("--iterations"));
        assert!(p(&["bench", "net"]).unwrap_err().contains("revoke"));
    }
}
