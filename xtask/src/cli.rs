//! Command-line parsing for `cargo xtask`, declared with clap: clear errors (exit code 2), no panics, `--help`
//! on every command (`cargo xtask help COMMAND`) and `--version`.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use leasebox_qemu::Machine;
use leasebox_qemu::config::{DEFAULT_CPU, DEFAULT_MEM_MIB, MAX_SMP};
use leasebox_scenarios::{bench, handshake_bench, hca_bench, lease_bench, revoke_bench};
use std::net::SocketAddrV4;

/// The host port `run` forwards to the guest's control port.
pub const DEFAULT_CONTROL_PORT: u16 = 7470;

/// What `cargo xtask --help` ends with.
const AFTER_HELP: &str = "\
run, test, bench and image check the host prerequisites first and install missing Debian packages when
running as root (otherwise they print the apt-get command to run).
LEASEBOX_KERNEL_ELF=<path> makes image/run/test/bench use that prebuilt kernel ELF instead of building
leasebox-image (the host tests and clippy still build the workspace); `test` names the substitution in its
summary, and .ci/run ignores the variable (CI tests the kernel its checkout builds).";

/// Leasebox's one entry point: build the image, boot it under QEMU, run every test, measure boot and service
/// times
#[derive(Debug, Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", version, after_long_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Build the kernel and the GRUB ISO: target/leasebox/leasebox.elf, target/leasebox/leasebox.iso
    Image,
    /// Build what is needed and boot under QEMU (TCG), serial console on this terminal
    ///
    /// Runs until the guest exits, Ctrl-C or a stop signal (SIGTERM, SIGINT, SIGHUP: passed on to QEMU; QEMU
    /// and the model stop, their shared files are deleted; both also die if this process is killed). Exits
    /// with QEMU's status (3 = the guest reported a failure through isa-debug-exit; 128+N = QEMU, or the run,
    /// ended by signal N; 124 = stopped by --timeout).
    ///
    /// The control port is forwarded to 127.0.0.1:7470 (virtio-net, QEMU user networking); fresh keys for
    /// the tenant `demo` and the admin are passed to the kernel and written to leasectl's configuration file
    /// (0600; the path is printed), so `cargo run -p leasectl -- ping` works from another terminal. Kernel
    /// args naming tenant= or admin= replace the generated keys (and no file is written).
    ///
    /// The mlx5 model (qemu/mlx5-model, CI's ConnectX-5) runs beside QEMU by default: guest RAM and an
    /// ivshmem BAR in fresh files under /dev/shm, the model process started before QEMU and stopped after it,
    /// the files deleted afterwards.
    Run(RunArgs),
    /// Host tests, clippy, image and ISO build, then the QEMU scenarios; PASS/FAIL lines and a summary
    ///
    /// The host steps: cargo fmt --check, cargo test --workspace (the C client's header check and gcc-built
    /// example included), the tag-limit tests again in a release build, clippy (host, leasectl's verbs feature,
    /// the kernel target), python-client (pip install
    /// app/client-py into target/py-venv, pytest against a hosted appliance); then the image and ISO build, what the named scenarios need (the mlx5 model,
    /// leasectl, the fence-test image), and the scenarios one after another: boot scenarios check the serial
    /// transcript, driven ones (control-qemu, lease-qemu) run clients against the booted image. With
    /// SCENARIO names, only those run (the summary names the skipped ones); with --step, only the named host
    /// steps.
    Test(TestArgs),
    /// Benchmarks: figures only, nothing asserted
    Bench {
        #[command(subcommand)]
        kind: BenchSub,
    },
    /// Check (and, as root with apt-get, install) the host prerequisites
    ///
    /// QEMU, GRUB (BIOS and EFI), xorriso, mtools, OVMF, and for leasectl's verbs backend libibverbs-dev,
    /// librdmacm-dev, pkg-config and libclang-dev; each is probed where its user looks for it.
    Prereqs,
    /// Build a Linux guest with Soft-RoCE (rdma_rxe) from Debian packages; with --boot, boot it under QEMU/TCG
    ///
    /// The `rxe-qemu` scenario of `cargo xtask test` builds and boots it too: kernel, modules, busybox, rdma-core and the
    /// rxe provider, `rdma`, and leasectl (--features verbs) with its libraries, under
    /// target/leasebox/rxe-guest/. The guest adds rxe0 on eth0, prints the evidence, runs --cmd and powers off.
    RxeGuest {
        /// Boot it and check the transcript for rdma_rxe, rxe0 on eth0 and leasectl running
        #[arg(long)]
        boot: bool,
        /// A shell command the guest runs after the evidence (default: none; power off at once)
        #[arg(long, value_name = "CMD", requires = "boot")]
        cmd: Option<String>,
        /// The guest's NIC on a UDP socket instead of QEMU's user network: it binds LOCAL and sends to PEER,
        /// e.g. the leasectl port pair `cargo xtask run --ctl-nic mlx5` prints (a station on the appliance's
        /// segment)
        #[arg(long, value_name = "LOCAL,PEER", requires = "boot", value_parser = parse_wire)]
        wire: Option<(SocketAddrV4, SocketAddrV4)>,
        /// The guest's address (default 10.0.2.15/24 on the user network, 10.0.2.30/24 with --wire)
        #[arg(long, value_name = "A.B.C.D/N", requires = "boot")]
        ip: Option<String>,
    },
}

fn parse_wire(v: &str) -> Result<(SocketAddrV4, SocketAddrV4), String> {
    let (l, p) = v.split_once(',').ok_or("expected LOCAL,PEER (two ADDR:PORT)")?;
    let a = |x: &str| x.trim().parse::<SocketAddrV4>().map_err(|_| format!("'{x}' is not IPv4 ADDR:PORT"));
    Ok((a(l)?, a(p)?))
}

/// Given twice, a flag's later value counts (`--device`, `--object` and `--qemu-arg` add up).
#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct RunArgs {
    /// Host port forwarded to the control port
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONTROL_PORT, value_parser = |v: &str| number(v, 1, u16::MAX))]
    port: u16,
    /// Boot without the mlx5 model (no shared files, no ivshmem, no model process)
    #[arg(long, conflicts_with = "ctl_nic")]
    no_model: bool,
    /// Put the model's device behind a PCI expander bridge (a second root bus 0x40: pxb-pcie with a root port
    /// on q35, pxb on pc), as a server's peer host bridge
    #[arg(long, conflicts_with = "no_model")]
    expander: bool,
    /// The control channel's NIC: virtio-net on QEMU's user network, or mlx5, the model's own Ethernet port
    /// on a hub with QEMU's user network and no virtio-net at all (leasectl's configuration then names the
    /// hub port its RDMA frames use, and the verifier finds the appliance's MAC by ARP)
    #[arg(long, value_enum, value_name = "virtio|mlx5", default_value = "virtio")]
    ctl_nic: CtlNic,
    /// The model's command trace (default target/leasebox/mlx5-trace.jsonl)
    #[arg(long, value_name = "PATH", value_parser = |v: &str| word(v, "a file path"))]
    trace: Option<String>,
    /// Boot the GRUB ISO on SeaBIOS instead of QEMU -kernel
    #[arg(long)]
    iso: bool,
    /// Boot the GRUB ISO on OVMF (UEFI); implies --iso
    #[arg(long)]
    uefi: bool,
    /// CPUs
    #[arg(long, value_name = "N", default_value_t = 1, allow_negative_numbers = true, value_parser = |v: &str| number(v, 1, MAX_SMP))]
    smp: u32,
    /// Guest memory in MiB (at most 2048 with the model on `pc`; q35 puts RAM above 2 GiB at 4 GiB)
    #[arg(long, value_name = "MiB", default_value_t = DEFAULT_MEM_MIB, value_parser = |v: &str| number::<u32>(v, 16, 1024 * 1024))]
    mem: u32,
    /// Chipset: q35, or pc (no ECAM, so the kernel uses 0xCF8 PCI access)
    #[arg(long, value_name = "pc|q35", default_value = "q35", value_parser = |v: &str| v.parse::<Machine>())]
    machine: Machine,
    /// QEMU -cpu model
    #[arg(long, value_name = "MODEL", default_value = DEFAULT_CPU, value_parser = |v: &str| word(v, "a CPU model"))]
    cpu: String,
    /// Add -device SPEC (repeatable)
    #[arg(long, value_name = "SPEC", value_parser = |v: &str| word(v, "a value"))]
    device: Vec<String>,
    /// Add -object SPEC (repeatable)
    #[arg(long, value_name = "SPEC", value_parser = |v: &str| word(v, "a value"))]
    object: Vec<String>,
    /// Add one raw QEMU argument (repeatable)
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    qemu_arg: Vec<String>,
    /// Kill QEMU after SECS seconds
    #[arg(long, value_name = "SECS", value_parser = |v: &str| number::<u64>(v, 1, 7 * 24 * 3600))]
    timeout: Option<u64>,
    /// Print the QEMU command line and exit
    #[arg(long)]
    dry_run: bool,
    /// Kernel arguments, e.g. log=debug cores=... test=pagefault; with --iso/--uefi they are baked into
    /// target/leasebox/run.iso
    #[arg(last = true, value_name = "KERNEL ARGS")]
    kernel_args: Vec<String>,
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct TestArgs {
    /// Only the image build and the scenarios (the summary names the skipped steps)
    #[arg(long)]
    boot_only: bool,
    /// List the scenarios (the named ones, or all) and exit
    #[arg(long)]
    list: bool,
    /// Copy each boot scenario's serial output to stdout as it arrives
    #[arg(long, short)]
    verbose: bool,
    /// Only this host step (repeatable: format, host-tests, release-limits, clippy-host, verbs-build,
    /// clippy-kernel, python-client); no image build and no scenarios
    #[arg(long = "step", value_name = "STEP", conflicts_with_all = ["boot_only", "scenarios"])]
    steps: Vec<String>,
    /// Scenarios to run (default: all; see --list)
    #[arg(value_name = "SCENARIO")]
    scenarios: Vec<String>,
}

#[derive(Debug, Subcommand)]
#[command(args_override_self = true)]
enum BenchSub {
    /// Boot-time table for -kernel, GRUB BIOS, GRUB UEFI and -kernel with 3 CPUs, plus the size of leasebox.elf
    ///
    /// Then the appliance as shipped (model attached, lease service up; -kernel, 1 CPU) per control NIC,
    /// virtio-net and the CX-5 model's own Ethernet port: QEMU start → the control port answers a HELLO, and
    /// QEMU start → ready line.
    Boot {
        /// Runs per row (medians are shown; default 5)
        #[arg(long, value_name = "N", value_parser = runs)]
        runs: Option<usize>,
    },
    /// HEARTBEAT round trips/s and p50/p99 with 1 and 8 sessions, QEMU appliance per control NIC and hosted
    ///
    /// The QEMU rows boot the appliance as shipped (model attached, lease service up; TCG, 1 CPU) with the
    /// control channel on virtio-net, then on the CX-5 model's own Ethernet port with no virtio-net.
    Control {
        /// Seconds of load per row (default 3)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
    },
    /// The mlx5 command path, hosted and under QEMU, then the goals
    ///
    /// Hosted (driver + model thread, native, N s per row): QUERY_MKEY and CREATE+DESTROY_MKEY rates with 1
    /// and 30 slots, p50/p99, driver ns per command; then QEMU (-kernel, 1 CPU, TCG, model; N boots) kernel
    /// entry → `mlx5: up:` and hca_ms; then the goals (30 slots ≥ 10× 1 slot, driver ≤ 2 µs per command).
    Hca {
        /// Seconds per hosted row (default 2)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
        /// QEMU boots (default 3)
        #[arg(long, value_name = "N", value_parser = runs)]
        runs: Option<usize>,
    },
    /// The lease service, hosted (model thread, engines, service; native), then the goals
    ///
    /// ALLOC and REVOKE p50/p99, rate, appliance-side and service CPU time, HCA commands per op with 1 and 8
    /// clients; mass revoke of N leases: last outcome and all swept vs the same HCA commands alone over the
    /// 32 command slots; then the goals (REVOKE appliance-side ≤ 2 µs p99 with 8 clients, ALLOC appliance-side
    /// ≤ 5 µs p99, mass revoke ≤ 1.5× the model alone).
    Lease {
        /// Seconds per row (default 2)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
        /// Leases in the mass revoke (default 10000)
        #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 8, lease_bench::MAX_LEASES))]
        leases: Option<u32>,
    },
    /// The client library (app/client) against the hosted appliance, with 1 and 8 clients
    ///
    /// Hosted appliance with the device model (std TCP; RDMA through the software RoCEv2 requester over UDP):
    /// alloc → first write latency, 64 B and 1 MiB write/read p50/p99 and rates, and the notice latency (REVOKE
    /// sent by the admin → the owning client's event). Prints; asserts nothing.
    Client {
        /// Seconds per phase (default 2)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
    },
    /// The key-value store (docs/kv.md) against the hosted appliance, and the same workload on the raw lease API
    ///
    /// Put and get operations/s and per-call p50/p99 for 4 KiB, 64 KiB and 1 MiB values, 1 and 8 threads, batches
    /// of 1 and 64, through `Store` and through zero-copy `Op`s on two leases; the last column is the raw API's
    /// rate over the store's (the layer's cost). Prints; asserts nothing.
    Kv {
        /// Seconds per cell (default 1)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
    },
    /// Linux's Soft-RoCE as the client: RDMA WRITE/READ latency and bandwidth for 64 B, 4 KiB and 1 MiB, and
    /// the revoke figures, against the QEMU appliance (the model) and against an rxe reference responder
    ///
    /// The rxe guest (`cargo xtask rxe-guest`) runs `leasectl verify --backend verbs --perf` and `--revoke-test
    /// --order both` on the QEMU appliance's segment, against the hosted appliance's responder, then against a
    /// second rxe guest serving memory through real verbs (`leasebox-hosted --verbs`); one table side by side.
    /// Prints; asserts nothing.
    Rxe {
        /// Milliseconds per figure (default 1000)
        #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, 50u64, 60_000))]
        perf_ms: Option<u64>,
    },
    /// The fleet (docs/fleet.md): registrar, etcd and client placement with 4 and 64 hosted appliances
    ///
    /// A real etcd on loopback, one registrar (1 s polls, 10 s key TTL): registration latency (appliance up →
    /// key visible), failure detection (appliance down → key gone), the client's placement decisions per
    /// second, and etcd writes per appliance per second. Prints; asserts nothing.
    Fleet,
    /// `leasectl verify --revoke-test` per order against the QEMU guest and the hosted appliance
    ///
    /// mkey-first and qp-first against the QEMU guest (image, model, virtio-net) and the hosted appliance:
    /// control-plane recall and dataplane first-fail latency p50/p99/max and the failing completion status.
    Revoke {
        /// Verifier iterations per order and target (default 20)
        #[arg(long, value_name = "N", value_parser = |v: &str| number(v, 1, revoke_bench::MAX_ITERATIONS))]
        iterations: Option<u32>,
    },
    /// Replayed HELLOs the QEMU appliance absorbs while its revokes still meet their deadline
    ///
    /// The QEMU appliance as shipped (-kernel, q35, 1 CPU, TCG, virtio-net, model attached): one captured Noise
    /// message 1 replayed at 0, 100, 200, 400 and 800 per second (a new connection each) while a tenant allocates
    /// and revokes leases; per rate, replays answered (AUTH_FAILED) and refused (BUSY) per second, REVOKE →
    /// outcome p50/p99/max and whether every outcome came within 1 s. Prints; asserts nothing.
    Handshake {
        /// Seconds per rate (default 10)
        #[arg(long, value_name = "N", value_parser = secs)]
        secs: Option<u64>,
    },
    /// Scrubbing lease memory: the pool's preparation at boot, and the appliance's answers while a large
    /// revoked lease is zeroed
    ///
    /// The QEMU appliance as shipped (-kernel, q35, 6144 MiB, 1 CPU, TCG, model attached) with a 64 MiB and a
    /// 3000 MiB pool, and the hosted appliance (leasebox-hosted --hca, a process) with a 16 GiB pool: start →
    /// ready line, → first HELLO answered, → whole pool ready (`lease: pool ready`; "(at ready)" for an image
    /// without it). Then on the 3000 MiB guest (a 2560 MiB lease) and the hosted appliance (a 12 GiB lease), with
    /// lease_grace_ms=1000: after an admin REVOKE and its grace, HEARTBEAT round trips p50/max every ~100 ms
    /// while the memory is scrubbed, a 2 MiB lease's REVOKE → outcome during it, and the scrub's GiB/s (until
    /// STATS bytes_free is back); "no answer in 40 s" where one never came. The kernel honours
    /// LEASEBOX_KERNEL_ELF, the hosted binary LEASEBOX_HOSTED_BIN (default: the release build), so an older build
    /// can be measured. Prints; asserts nothing.
    Scrub,
}

fn runs(v: &str) -> Result<usize, String> {
    number(v, 1, 1000)
}

/// `bench client`'s seconds per phase by default.
pub const CLIENT_BENCH_SECS: u64 = 2;

fn secs(v: &str) -> Result<u64, String> {
    number(v, 1, 600)
}

/// A decimal number from `min` to `max`.
fn number<T>(v: &str, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match v.parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(format!("needs a number from {min} to {max}")),
    }
}

/// A value that is neither empty nor a flag.
fn word(v: &str, what: &str) -> Result<String, String> {
    if v.is_empty() || v.starts_with('-') {
        return Err(format!("needs {what}"));
    }
    Ok(v.to_string())
}

/// A parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// Print this text (`cargo xtask` alone).
    Help(String),
    Image,
    Prereqs,
    RxeGuest {
        boot: bool,
        cmd: Option<String>,
        wire: Option<(SocketAddrV4, SocketAddrV4)>,
        ip: Option<String>,
    },
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
    /// `--expander`: the model's device behind a PCI expander bridge.
    pub expander: bool,
    /// The model's trace file (`None`: `target/leasebox/mlx5-trace.jsonl`).
    pub trace: Option<String>,
    pub ctl_nic: CtlNic,
    pub kernel_args: Vec<String>,
}

impl RunOpts {
    /// `a` with the QEMU extras in the order given (`m`: the `run` command's matches, for their positions).
    fn new(a: RunArgs, m: &ArgMatches) -> RunOpts {
        // (position on the command line, the QEMU arguments it adds), sorted by position.
        let at = |id: &str| m.indices_of(id).into_iter().flatten();
        let mut extra: Vec<(usize, Vec<String>)> = Vec::new();
        extra.extend(at("device").zip(&a.device).map(|(i, v)| (i, vec!["-device".into(), v.clone()])));
        extra.extend(at("object").zip(&a.object).map(|(i, v)| (i, vec!["-object".into(), v.clone()])));
        extra.extend(at("qemu_arg").zip(&a.qemu_arg).map(|(i, v)| (i, vec![v.clone()])));
        extra.sort_by_key(|(i, _)| *i);
        RunOpts {
            iso: a.iso || a.uefi,
            uefi: a.uefi,
            smp: a.smp,
            mem_mib: a.mem,
            machine: a.machine,
            cpu: a.cpu,
            extra: extra.into_iter().flat_map(|(_, v)| v).collect(),
            timeout_secs: a.timeout,
            dry_run: a.dry_run,
            port: a.port,
            model: !a.no_model,
            expander: a.expander,
            trace: a.trace,
            ctl_nic: a.ctl_nic,
            kernel_args: a.kernel_args,
        }
    }
}

/// `run --ctl-nic`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CtlNic {
    #[default]
    Virtio,
    Mlx5,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestOpts {
    pub boot_only: bool,
    pub list: bool,
    pub verbose: bool,
    pub scenarios: Vec<String>,
    /// `--step`: only these host steps.
    pub steps: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchKind {
    Boot,
    Control,
    Hca,
    Lease,
    Revoke,
    Client,
    Kv,
    Rxe,
    Fleet,
    Scrub,
    Handshake,
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

impl BenchOpts {
    fn new(b: BenchSub) -> BenchOpts {
        let o = BenchOpts {
            kind: BenchKind::Boot,
            runs: bench::DEFAULT_RUNS,
            secs: 3,
            leases: lease_bench::DEFAULT_LEASES,
            iterations: revoke_bench::DEFAULT_ITERATIONS,
        };
        match b {
            BenchSub::Boot { runs } => BenchOpts { runs: runs.unwrap_or(o.runs), ..o },
            BenchSub::Control { secs } => BenchOpts { kind: BenchKind::Control, secs: secs.unwrap_or(o.secs), ..o },
            BenchSub::Hca { secs, runs } => BenchOpts {
                kind: BenchKind::Hca,
                runs: runs.unwrap_or(hca_bench::DEFAULT_RUNS),
                secs: secs.unwrap_or(2),
                ..o
            },
            BenchSub::Lease { secs, leases } => BenchOpts {
                kind: BenchKind::Lease,
                runs: 1,
                secs: secs.unwrap_or(lease_bench::DEFAULT_SECS),
                leases: leases.unwrap_or(o.leases),
                ..o
            },
            BenchSub::Fleet => BenchOpts { kind: BenchKind::Fleet, runs: 1, ..o },
            BenchSub::Scrub => BenchOpts { kind: BenchKind::Scrub, runs: 1, ..o },
            BenchSub::Handshake { secs } => BenchOpts {
                kind: BenchKind::Handshake,
                runs: 1,
                secs: secs.unwrap_or(handshake_bench::DEFAULT_SECS),
                ..o
            },
            BenchSub::Client { secs } => {
                BenchOpts { kind: BenchKind::Client, runs: 1, secs: secs.unwrap_or(CLIENT_BENCH_SECS), ..o }
            }
            BenchSub::Kv { secs } => BenchOpts { kind: BenchKind::Kv, runs: 1, secs: secs.unwrap_or(1), ..o },
            BenchSub::Rxe { perf_ms } => {
                BenchOpts { kind: BenchKind::Rxe, runs: 1, secs: perf_ms.unwrap_or(1000), ..o }
            }
            BenchSub::Revoke { iterations } => {
                BenchOpts { kind: BenchKind::Revoke, iterations: iterations.unwrap_or(o.iterations), ..o }
            }
        }
    }
}

/// Parses the arguments after `cargo xtask`. `Err` is clap's: a usage error, or a help or version request
/// (kinds [`ErrorKind::DisplayHelp`], [`ErrorKind::DisplayVersion`]) to print as it renders.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Cmd, clap::Error> {
    let args: Vec<String> = args.into_iter().collect();
    let m = Cli::command()
        .try_get_matches_from(std::iter::once("xtask").chain(args.iter().map(String::as_str)))
        .map_err(|e| with_tip(e, &args))?;
    let cli = Cli::from_arg_matches(&m)?;
    Ok(match cli.command {
        None => Cmd::Help(help()),
        Some(Sub::Image) => Cmd::Image,
        Some(Sub::Prereqs) => Cmd::Prereqs,
        Some(Sub::RxeGuest { boot, cmd, wire, ip }) => Cmd::RxeGuest { boot, cmd, wire, ip },
        Some(Sub::Run(a)) => {
            let run = m.subcommand_matches("run").ok_or_else(|| clap::Error::new(ErrorKind::MissingSubcommand))?;
            Cmd::Run(RunOpts::new(a, run))
        }
        Some(Sub::Test(t)) => Cmd::Test(TestOpts {
            boot_only: t.boot_only,
            list: t.list,
            verbose: t.verbose,
            scenarios: t.scenarios,
            steps: t.steps,
        }),
        Some(Sub::Bench { kind }) => Cmd::Bench(BenchOpts::new(kind)),
    })
}

/// `e` with a tip clap does not give: the known commands after an unknown one, and where kernel arguments go.
fn with_tip(mut e: clap::Error, args: &[String]) -> clap::Error {
    let tip = match e.kind() {
        ErrorKind::InvalidSubcommand => {
            // The command the unknown word was given to: follow the known ones.
            let mut cmd = Cli::command();
            for a in args {
                match cmd.find_subcommand(a) {
                    Some(sub) => cmd = sub.clone(),
                    None => break,
                }
            }
            let known: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).filter(|n| *n != "help").collect();
            format!("available: {}", known.join(", "))
        }
        ErrorKind::UnknownArgument
            if args.first().is_some_and(|a| a == "run")
                && matches!(e.get(ContextKind::InvalidArg), Some(ContextValue::String(a)) if !a.starts_with('-')) =>
        {
            "kernel arguments go after `--` (cargo xtask run -- log=debug)".to_string()
        }
        _ => return e,
    };
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
    e
}

/// The long help (`cargo xtask`, `cargo xtask help`, `cargo xtask --help`).
pub fn help() -> String {
    Cli::command().render_long_help().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cmd, String> {
        parse(args.iter().map(|s| s.to_string())).map_err(|e| e.to_string())
    }

    fn kind(args: &[&str]) -> ErrorKind {
        parse(args.iter().map(|s| s.to_string())).unwrap_err().kind()
    }

    fn run(args: &[&str]) -> RunOpts {
        match p(&[&["run"], args].concat()) {
            Ok(Cmd::Run(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    fn run_defaults() -> RunOpts {
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
            expander: false,
            trace: None,
            ctl_nic: CtlNic::Virtio,
            kernel_args: Vec::new(),
        }
    }

    #[test]
    fn expander_needs_the_model() {
        assert!(run(&["--expander"]).expander);
        assert!(!run(&[]).expander);
        assert_eq!(kind(&["run", "--expander", "--no-model"]), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn top_level() {
        assert_eq!(p(&[]), Ok(Cmd::Help(help())));
        assert!(help().contains("LEASEBOX_KERNEL_ELF") && help().contains("prereqs"));
        assert_eq!(kind(&["help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["help", "run"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["--version"]), ErrorKind::DisplayVersion);
        assert_eq!(p(&["image"]), Ok(Cmd::Image));
        assert_eq!(p(&["prereqs"]), Ok(Cmd::Prereqs));
        assert_eq!(p(&["rxe-guest"]), Ok(Cmd::RxeGuest { boot: false, cmd: None, wire: None, ip: None }));
        assert_eq!(
            p(&["rxe-guest", "--boot", "--cmd", "rdma dev"]),
            Ok(Cmd::RxeGuest { boot: true, cmd: Some("rdma dev".into()), wire: None, ip: None })
        );
        let (l, r) = ("127.0.0.1:5001".parse().unwrap(), "127.0.0.1:5002".parse().unwrap());
        assert_eq!(
            p(&["rxe-guest", "--boot", "--wire", "127.0.0.1:5001,127.0.0.1:5002", "--ip", "10.0.2.31/24"]),
            Ok(Cmd::RxeGuest { boot: true, cmd: None, wire: Some((l, r)), ip: Some("10.0.2.31/24".into()) })
        );
        assert!(p(&["rxe-guest", "--boot", "--wire", "127.0.0.1:5001"]).is_err());
        assert!(p(&["rxe-guest", "--cmd", "x"]).is_err(), "--cmd needs --boot");
        assert!(p(&["image", "x"]).unwrap_err().contains("unexpected argument 'x'"));
        let e = p(&["frobnicate"]).unwrap_err();
        assert!(e.contains("frobnicate") && e.contains("available: image, run, test, bench, prereqs"), "{e}");
        // Usage errors exit with 2.
        let e = parse(["frobnicate".to_string()]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn help_texts_say_what_the_commands_do() {
        let test = Cli::command().find_subcommand_mut("test").unwrap().render_long_help().to_string();
        assert!(test.contains("--boot-only") && test.contains("driven ones (control-qemu, lease-qemu)"));
        let run = Cli::command().find_subcommand_mut("run").unwrap().render_long_help().to_string();
        assert!(run.contains("isa-debug-exit") && run.contains("--qemu-arg") && run.contains("[default: 7470]"));
    }

    #[test]
    fn run_defaults_and_flags() {
        assert_eq!(run(&[]), run_defaults());
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
        // QEMU extras keep their order across the three flags.
        let o =
            run(&["--qemu-arg=-S", "--object", "o1", "--device", "d1", "--qemu-arg", "-no-reboot", "--device", "d2"]);
        assert_eq!(o.extra, ["-S", "-object", "o1", "-device", "d1", "-no-reboot", "-device", "d2"]);
        // The later value counts, as before clap; repeatable flags add up.
        let o = run(&["--smp", "2", "--smp=3", "--device", "a", "--device", "b", "--iso", "--iso"]);
        assert_eq!((o.smp, o.extra.len(), o.iso), (3, 4, true));
        assert_eq!(p(&["bench", "boot", "--runs", "2", "--runs", "4"]), p(&["bench", "boot", "--runs", "4"]));
        assert!(run(&["--iso"]).iso);
        assert!(!run(&["--iso"]).uefi);
        assert!(run(&[]).model && run(&[]).trace.is_none());
        assert!(!run(&["--no-model"]).model);
        assert_eq!(run(&["--ctl-nic", "mlx5"]).ctl_nic, CtlNic::Mlx5);
        assert_eq!(run(&[]).ctl_nic, CtlNic::Virtio);
        assert_eq!(run(&["--trace", "/tmp/t.jsonl"]).trace.as_deref(), Some("/tmp/t.jsonl"));
        assert_eq!(run(&["--trace=t.jsonl"]).trace.as_deref(), Some("t.jsonl"));
    }

    #[test]
    fn run_errors_are_clear() {
        let e = |args: &[&str]| p(&[&["run"], args].concat()).unwrap_err();
        assert!(e(&["--smp"]).contains("a value is required for '--smp <N>'"));
        assert!(e(&["--smp", "zero"]).contains("'--smp <N>': needs a number"));
        assert!(e(&["--smp", "0"]).contains("from 1"));
        assert!(e(&["--smp", "-3"]).contains("--smp"));
        assert!(e(&["--mem", "99999999999999999999"]).contains("--mem"));
        assert!(e(&["--machine", "isapc"]).contains("isapc"));
        assert!(e(&["--iso=yes"]).contains("unexpected value 'yes' for '--iso'"));
        assert!(e(&["--fast"]).contains("unexpected argument '--fast'"));
        assert!(e(&["--ctl-nic", "mlx5", "--no-model"]).contains("cannot be used with"));
        assert!(e(&["--ctl-nic", "e1000"]).contains("invalid value 'e1000'"));
        assert!(e(&["log=debug"]).contains("after `--`"));
        assert!(e(&["--cpu", "--iso"]).contains("--cpu <MODEL>"));
        assert!(e(&["--cpu=-x"]).contains("CPU model"));
        assert!(e(&["--device="]).contains("'--device <SPEC>': needs a value"));
        assert!(e(&["--port", "0"]).contains("'--port <N>': needs a number from 1 to 65535"));
        assert!(e(&["--port", "65536"]).contains("--port"));
        assert!(e(&["--no-model=yes"]).contains("unexpected value"));
        assert!(e(&["--trace"]).contains("a value is required for '--trace <PATH>'"));
        assert!(e(&["--trace", "--iso"]).contains("--trace <PATH>"));
        assert!(e(&["--trace=-x"]).contains("file path"));
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
                scenarios: vec!["grub-bios".into()],
                steps: vec![],
            }))
        );
        assert_eq!(
            p(&["test", "--step", "python-client", "--step=format"]),
            Ok(Cmd::Test(TestOpts { steps: vec!["python-client".into(), "format".into()], ..TestOpts::default() }))
        );
        assert!(p(&["test", "--step", "format", "grub-bios"]).is_err());
        assert!(p(&["test", "--step", "format", "--boot-only"]).is_err());
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
        assert_eq!(kind(&["bench"]), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert!(p(&["bench", "net"]).unwrap_err().contains("net"));
        assert!(p(&["bench", "boot", "--runs", "0"]).is_err());
        let hca =
            |runs, secs| Cmd::Bench(BenchOpts { kind: BenchKind::Hca, runs, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "hca"]), Ok(hca(3, 2)));
        assert_eq!(p(&["bench", "hca", "--secs", "1", "--runs=2"]), Ok(hca(2, 1)));
        assert!(p(&["bench", "hca", "--secs", "0"]).unwrap_err().contains("'--secs <N>': needs a number from 1"));
        assert!(p(&["bench", "hca", "--sessions", "8"]).unwrap_err().contains("--sessions"));
        assert!(p(&["bench", "boot", "--secs", "1"]).is_err());
        assert!(p(&["bench", "net"]).unwrap_err().contains("hca"));
        let lease =
            |secs, leases| Cmd::Bench(BenchOpts { kind: BenchKind::Lease, runs: 1, secs, leases, iterations: 20 });
        assert_eq!(p(&["bench", "lease"]), Ok(lease(2, 10_000)));
        assert_eq!(p(&["bench", "lease", "--secs", "1", "--leases=2000"]), Ok(lease(1, 2000)));
        assert!(p(&["bench", "lease", "--leases", "7"]).unwrap_err().contains("'--leases <N>': needs a number from 8"));
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
            p(&["bench", "revoke", "--iterations", "0"])
                .unwrap_err()
                .contains("'--iterations <N>': needs a number from 1")
        );
        assert!(p(&["bench", "revoke", "--secs", "2"]).unwrap_err().contains("--secs"));
        assert!(p(&["bench", "lease", "--iterations", "2"]).unwrap_err().contains("--iterations"));
        assert!(p(&["bench", "net"]).unwrap_err().contains("revoke"));
        let client =
            |secs| Cmd::Bench(BenchOpts { kind: BenchKind::Client, runs: 1, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "client"]), Ok(client(2)));
        assert_eq!(p(&["bench", "client", "--secs", "1"]), Ok(client(1)));
        assert!(p(&["bench", "client", "--runs", "2"]).unwrap_err().contains("--runs"));
        let kv = |secs| Cmd::Bench(BenchOpts { kind: BenchKind::Kv, runs: 1, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "kv"]), Ok(kv(1)));
        assert_eq!(p(&["bench", "kv", "--secs", "3"]), Ok(kv(3)));
        assert!(p(&["bench", "kv", "--secs", "0"]).is_err());
        let rxe = |secs| Cmd::Bench(BenchOpts { kind: BenchKind::Rxe, runs: 1, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "rxe"]), Ok(rxe(1000)));
        assert_eq!(p(&["bench", "rxe", "--perf-ms", "500"]), Ok(rxe(500)));
        assert!(p(&["bench", "rxe", "--perf-ms", "10"]).unwrap_err().contains("--perf-ms"));
        let fleet = Cmd::Bench(BenchOpts { kind: BenchKind::Fleet, runs: 1, secs: 3, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "fleet"]), Ok(fleet));
        assert!(p(&["bench", "fleet", "--secs", "2"]).is_err());
        let scrub = Cmd::Bench(BenchOpts { kind: BenchKind::Scrub, runs: 1, secs: 3, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "scrub"]), Ok(scrub));
        assert!(p(&["bench", "scrub", "--runs", "2"]).unwrap_err().contains("--runs"));
        let hs =
            |secs| Cmd::Bench(BenchOpts { kind: BenchKind::Handshake, runs: 1, secs, leases: 10_000, iterations: 20 });
        assert_eq!(p(&["bench", "handshake"]), Ok(hs(10)));
        assert_eq!(p(&["bench", "handshake", "--secs", "4"]), Ok(hs(4)));
        assert!(p(&["bench", "handshake", "--runs", "2"]).unwrap_err().contains("--runs"));
        assert!(p(&["bench", "net"]).unwrap_err().contains("scrub"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
