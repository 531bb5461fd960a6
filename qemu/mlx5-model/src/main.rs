//! The model as its own process (QEMU runs): maps the BAR file and the guest-RAM file that QEMU shares, writes
//! the model's signature into the BAR's last page, and serves the device until stopped.
//!
//! It stops on SIGTERM or SIGINT, when either shared file disappears (the runner deletes them after QEMU
//! exits), and, with `--exit-on-stdin-eof`, when its standard input reaches end of file (the runner holds
//! the other end of a pipe, so the model also ends when the runner dies without cleaning up). Idle polling
//! backs off (spin, yield, then sleeps growing to 1 ms; `mlx5_model::idle`) so a 2-core host stays usable.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlx5_model::idle::Backoff;
use mlx5_model::mem::Memory;
use mlx5_model::shm::{self, SharedFile};

const USAGE: &str = "\
usage: mlx5-model --bar PATH --ram PATH [options]

Serves a ConnectX-5 model over two files shared with QEMU: the BAR (QEMU `-object memory-backend-file,
...,mem-path=PATH,share=on -device ivshmem-plain,memdev=...`) and the guest RAM (`memory-backend-file` named
by `-machine ...,memory-backend=...`). Waits up to --wait seconds for QEMU to create and size them.

  --bar PATH            the BAR file (ivshmem BAR2, the CX-5's BAR0)
  --ram PATH            the guest-RAM file, addressed as q35 maps it (guest physical: up to 2 GiB below
                        the PCI hole, the rest from 4 GiB)
  --bar-size BYTES      expected BAR size (default: whatever size the file has; a power of two)
  --ram-size BYTES      expected guest-RAM size (default: whatever size the file has)
  --trace PATH          write one JSON line per completed command to PATH (as MLX5_MODEL_TRACE=PATH)
  --udp ADDR            the RoCEv2 responder's UDP address (default 127.0.0.1:4791)
  --eth-udp LOCAL,PEER  the port's Ethernet wire: one frame per UDP datagram, read on LOCAL and sent to PEER
                        (the peer of QEMU `-netdev socket,udp=LOCAL,localaddr=PEER`); RoCEv2 frames for the
                        port's MAC on it go to the responder too (default: no Ethernet wire)
  --link-up-delay MS    the link comes up (PORT_CHANGE ACTIVE) MS milliseconds after the port is
                        administratively up (default 1000: link training; 0 = at once)
  --admin-down          the port starts administratively down: no link until the driver writes PAOS
                        admin_status up (as Linux does on netdev open)
  --timing T            firmware time per command: `firmware` (default: per-opcode latencies from a real
                        ConnectX-4 trace, INIT_HCA ~185 ms, MANAGE_PAGES ~1.2 us a page, others 30-110 us,
                        with a deterministic jitter), `zero` (complete in the pass that sees the doorbell),
                        or a fixed latency such as `20us` or `3ms` (docs/hca-model.md, \"Command timing and
                        doorbells\"); without the flag, MLX5_MODEL_TIMING=T sets it (it reaches a model that
                        cargo xtask starts)
  --control PATH        a control file for fault injection, created empty and polled every 100 ms: append one
                        command per line (`fail <opcode> <count> <status> <syndrome>`, `delay <opcode> <ms>`,
                        `hang <opcode>`, `health stop|run`, `health fatal <synd> [rfr=0|1]`, `drop-doorbell`,
                        `umr fail <count> <synd>`, `umr hang`, `clear`;
                        see docs/hca-model.md)
  --vf                  play a ConnectX-5 VF (device 0x1018 in the signature): ACCESS_REGISTER refuses
                        HOST_ENDIANNESS and PAOS/PMTU writes, as only the PF may make them; it sits behind a
                        legacy e-switch: unicast reaches it only for a MAC in its vport's unicast list
  --vf-port-reads-refused
                        with --vf: ACCESS_REGISTER refuses PAOS/PMTU reads too (the driver must fall back to
                        QUERY_VPORT_STATE and the vport MTU)
  --caps PROFILE        the capability blocks: `cx5` (default; a ConnectX-5 on firmware 16.x) or `cx4-trace`
                        (the reference trace's ConnectX-4, byte for byte); --vf applies on top of either
  --umr-entity-size-disabled
                        report umr_modify_entity_size_disabled = 1, as some firmware does: a UMR that changes a
                        key's page size completes in error (docs/hca-model.md, \"UMR\")
  --wait SECS           how long to wait for the files (default 10)
  --exit-on-stdin-eof   stop when standard input closes (for runners that hold a pipe to it)
  -h, --help            this text

Sizes accept a binary unit: K, M, G, T (or KiB, MiB, GiB, TiB), and 0x hex. On success, prints one line `mlx5-model: ready ...` on stdout once
the signature is in place; everything else goes to stderr.";

/// How often the loop checks that the shared files still exist.
const PRESENCE_CHECK: Duration = Duration::from_millis(250);
/// The responder's default UDP address (`docs/architecture.md`).
const DEFAULT_UDP: &str = "127.0.0.1:4791";

#[derive(Debug, PartialEq, Eq)]
struct Opts {
    bar: PathBuf,
    ram: PathBuf,
    bar_size: Option<u64>,
    ram_size: Option<u64>,
    trace: Option<PathBuf>,
    control: Option<PathBuf>,
    udp: SocketAddr,
    eth_udp: Option<(SocketAddr, SocketAddr)>,
    link_up_delay: Duration,
    admin_down: bool,
    timing: mlx5_model::Timing,
    wait: Duration,
    exit_on_stdin_eof: bool,
    vf: bool,
    vf_port_reads_refused: bool,
    caps: mlx5_model::caps::CapsProfile,
    umr_entity_size_disabled: bool,
}

enum Parsed {
    Run(Box<Opts>),
    Help,
}

/// A size as `leasebox-units` reads it: `123`, `0x1000`, `32M`, `2G`; never zero.
fn parse_size(flag: &str, v: &str) -> Result<u64, String> {
    leasebox_units::parse_size_in(v, 1..=u64::MAX)
        .map_err(|e| format!("{flag} needs a size in bytes (e.g. 33554432, 0x2000000, 32M): {e}, got `{v}`"))
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut it = args.into_iter();
    let (mut bar, mut ram, mut bar_size, mut ram_size, mut trace) = (None, None, None, None, None);
    let mut udp: SocketAddr = DEFAULT_UDP.parse().map_err(|e| format!("{e}"))?;
    let mut wait = shm::DEFAULT_WAIT;
    let mut exit_on_stdin_eof = false;
    let mut vf = false;
    let mut vf_port_reads_refused = false;
    let mut umr_entity_size_disabled = false;
    let mut caps = mlx5_model::caps::CapsProfile::default();
    let mut control = None;
    let mut eth_udp = None;
    let mut link_up_delay = mlx5_model::hca::DEFAULT_LINK_UP_DELAY;
    let mut admin_down = false;
    let mut timing = None;
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            let v = match inline.clone() {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("{flag} needs a value"))?,
            };
            if v.is_empty() { Err(format!("{flag} needs a non-empty value")) } else { Ok(v) }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--bar" => bar = Some(PathBuf::from(value()?)),
            "--ram" => ram = Some(PathBuf::from(value()?)),
            "--bar-size" => bar_size = Some(parse_size(&flag, &value()?)?),
            "--ram-size" => ram_size = Some(parse_size(&flag, &value()?)?),
            "--trace" => trace = Some(PathBuf::from(value()?)),
            "--control" => control = Some(PathBuf::from(value()?)),
            "--udp" => {
                let v = value()?;
                udp = v.parse().map_err(|_| format!("--udp needs an address such as {DEFAULT_UDP}, got `{v}`"))?;
            }
            "--eth-udp" => {
                let v = value()?;
                eth_udp = Some(mlx5_model::eth::wire::parse_pair(&v).ok_or_else(|| {
                    format!(
                        "--eth-udp needs LOCAL,PEER socket addresses such as 127.0.0.1:5555,127.0.0.1:5556, got `{v}`"
                    )
                })?);
            }
            "--link-up-delay" => {
                let v = value()?;
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|s| *s <= 600_000)
                    .ok_or_else(|| format!("--link-up-delay needs milliseconds from 0 to 600000, got `{v}`"))?;
                link_up_delay = Duration::from_millis(ms);
            }
            "--timing" => timing = Some(mlx5_model::Timing::parse(&value()?).map_err(|e| format!("--timing: {e}"))?),
            "--wait" => {
                let v = value()?;
                let secs: u64 = v
                    .parse()
                    .ok()
                    .filter(|s| (1..=3600).contains(s))
                    .ok_or_else(|| format!("--wait needs a number of seconds from 1 to 3600, got `{v}`"))?;
                wait = Duration::from_secs(secs);
            }
            "--exit-on-stdin-eof" => {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                exit_on_stdin_eof = true;
            }
            "--vf" => {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                vf = true;
            }
            "--vf-port-reads-refused" => {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                vf_port_reads_refused = true;
            }
            "--admin-down" => {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                admin_down = true;
            }
            "--umr-entity-size-disabled" => {
                if inline.is_some() {
                    return Err(format!("{flag} takes no value"));
                }
                umr_entity_size_disabled = true;
            }
            "--caps" => {
                let v = value()?;
                caps = mlx5_model::caps::CapsProfile::parse(&v)
                    .ok_or_else(|| format!("--caps needs `cx5` or `cx4-trace`, got `{v}`"))?;
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let bar = bar.ok_or("--bar PATH is required")?;
    let ram = ram.ok_or("--ram PATH is required")?;
    if let Some(s) = bar_size
        && (!s.is_power_of_two() || s < shm::MIN_BAR_BYTES)
    {
        return Err(format!("--bar-size must be a power of two of at least {:#x}, got {s:#x}", shm::MIN_BAR_BYTES));
    }
    if trace.is_none() {
        trace = std::env::var_os("MLX5_MODEL_TRACE").filter(|v| !v.is_empty()).map(PathBuf::from);
    }
    let timing = match timing {
        Some(t) => t,
        None => match std::env::var("MLX5_MODEL_TIMING") {
            Ok(v) if !v.is_empty() => mlx5_model::Timing::parse(&v).map_err(|e| format!("MLX5_MODEL_TIMING: {e}"))?,
            _ => mlx5_model::Timing::firmware(),
        },
    };
    Ok(Parsed::Run(Box::new(Opts {
        bar,
        ram,
        bar_size,
        ram_size,
        trace,
        control,
        udp,
        eth_udp,
        link_up_delay,
        admin_down,
        timing,
        wait,
        exit_on_stdin_eof,
        vf,
        vf_port_reads_refused,
        caps,
        umr_entity_size_disabled,
    })))
}

/// Why the loop ended.
#[derive(Debug)]
enum Stop {
    Signal,
    StdinClosed,
    FileGone(PathBuf),
}

fn main() -> ExitCode {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mlx5-model: {e}\n(see `mlx5-model --help`)");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(stop) => {
            eprintln!("mlx5-model: stopping ({})", describe(&stop));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mlx5-model: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn describe(stop: &Stop) -> String {
    match stop {
        Stop::Signal => "signal".into(),
        Stop::StdinClosed => "standard input closed".into(),
        Stop::FileGone(p) => format!("{} was removed", p.display()),
    }
}

fn run(o: &Opts) -> Result<Stop, String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| format!("installing a signal handler: {e}"))?;
    }
    let stdin_closed = Arc::new(AtomicBool::new(false));
    if o.exit_on_stdin_eof {
        let flag = Arc::clone(&stdin_closed);
        std::thread::Builder::new()
            .name("stdin-watch".into())
            .spawn(move || {
                let mut buf = [0u8; 256];
                let mut stdin = std::io::stdin().lock();
                // Anything written is ignored; only end of file (or an error) matters.
                while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
                flag.store(true, Ordering::SeqCst);
            })
            .map_err(|e| format!("starting the stdin watcher: {e}"))?;
    }

    let bar = Arc::new(SharedFile::open_bar(&o.bar, o.bar_size, o.wait).map_err(|e| e.to_string())?);
    let ram = Arc::new(SharedFile::open_ram(&o.ram, o.ram_size, o.wait).map_err(|e| e.to_string())?);
    shm::write_signature(&*bar, o.vf).map_err(|e| format!("writing the signature: {e}"))?;
    let sig_at = shm::signature_offset(bar.size());

    let bar_mem: Arc<dyn Memory> = bar.clone();
    let ram_mem: Arc<dyn Memory> = ram.clone();
    let mut device = Device::new(bar_mem, ram_mem, o);

    {
        let mut out = std::io::stdout().lock();
        // `eth=` stays last: readers take everything after ` eth=` (tests/src/ctl_mlx5.rs, the tests).
        let _ = writeln!(
            out,
            "mlx5-model: ready bar={} ({:#x} bytes, signature at +{sig_at:#x}) ram={} ({} MiB) udp={} trace={} caps={} function={} timing={} doorbells={:?} eth={}",
            o.bar.display(),
            bar.size(),
            o.ram.display(),
            ram.ram_bytes() >> 20,
            o.udp,
            o.trace.as_ref().map_or("off".into(), |p| p.display().to_string()),
            o.caps.name(),
            if o.vf { "vf" } else { "pf" },
            o.timing,
            device.model.doorbells(),
            device.eth_description()
        );
        let _ = out.flush();
    }

    let mut backoff = Backoff::default();
    let mut next_check = Instant::now() + PRESENCE_CHECK;
    let why = loop {
        if stop.load(Ordering::Relaxed) {
            break Stop::Signal;
        }
        if stdin_closed.load(Ordering::Relaxed) {
            break Stop::StdinClosed;
        }
        if device.poll() {
            backoff.reset();
        } else {
            let due = device.model.next_due().map(|t| t.saturating_duration_since(Instant::now()));
            backoff.step().until(due).take();
        }
        if Instant::now() >= next_check {
            next_check = Instant::now() + PRESENCE_CHECK;
            if let Some(f) = [&*bar, ram.file()].into_iter().find(|f| !f.still_present()) {
                break Stop::FileGone(f.path().to_path_buf());
            }
        }
    };
    // What the Ethernet port did, for the run's log.
    if device.eth.is_some() {
        eprintln!("mlx5-model: ethernet {:?}", device.model.eth_counters());
    }
    Ok(why)
}

/// The device behind the loop. The command interface (`mlx5_model::Model`: initialization segment, command
/// queue, HCA state) plugs in here; until it exists the process only carries the signature.
/// Everything the device polls: the command side, the fault control file and the RoCEv2 responder (`roce::udp`).
struct Device {
    model: mlx5_model::Model,
    control: Option<mlx5_model::fault::ControlFile>,
    /// The RoCEv2 responder's socket (non-blocking); None when it could not be bound.
    udp: Option<mlx5_model::roce::udp::UdpResponder>,
    /// The port's Ethernet wire; None without `--eth-udp` (or when it could not be bound).
    eth: Option<mlx5_model::eth::wire::EthWire>,
}

impl Device {
    fn new(bar: Arc<dyn Memory>, ram: Arc<dyn Memory>, o: &Opts) -> Device {
        let cfg = mlx5_model::ModelConfig {
            trace: o.trace.clone(),
            link_up_delay: o.link_up_delay,
            admin_down: o.admin_down,
            timing: o.timing,
            vf: o.vf,
            vf_port_reads_refused: o.vf_port_reads_refused,
            caps: o.caps,
            umr_entity_size_disabled: o.umr_entity_size_disabled,
            ..mlx5_model::ModelConfig::default()
        };
        let control = o.control.as_deref().and_then(|p| match mlx5_model::fault::ControlFile::create(p) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("mlx5-model: control file disabled: {e}");
                None
            }
        });
        let udp = mlx5_model::roce::udp::UdpResponder::bind(&o.udp.to_string(), Duration::from_millis(1))
            .and_then(|u| u.set_nonblocking(true).map(|()| u));
        let udp = udp.map_err(|e| eprintln!("mlx5-model: RoCEv2 responder disabled: {}: {e}", o.udp)).ok();
        let eth = o.eth_udp.and_then(|(local, peer)| {
            mlx5_model::eth::wire::EthWire::bind(local, peer)
                .map_err(|e| eprintln!("mlx5-model: Ethernet wire disabled: {local}: {e}"))
                .ok()
        });
        Device { model: mlx5_model::Model::new(bar, ram, cfg), control, udp, eth }
    }

    /// `LOCAL,PEER` of the Ethernet wire, or `off`.
    fn eth_description(&self) -> String {
        match &self.eth {
            Some(w) => match w.local_addr() {
                Ok(a) => format!("{a},{}", w.peer()),
                Err(_) => format!("?,{}", w.peer()),
            },
            None => "off".into(),
        }
    }

    /// One pass over everything the device polls; `true` if it did work.
    fn poll(&mut self) -> bool {
        if let Some(c) = self.control.as_mut() {
            for (line, parsed) in c.poll(Instant::now()) {
                match parsed {
                    Ok(f) => {
                        eprintln!("mlx5-model: control: {line}");
                        self.model.inject(f);
                    }
                    Err(e) => eprintln!("mlx5-model: control: ignoring `{line}`: {e}"),
                }
            }
        }
        let mut did = self.model.poll();
        if let Some(u) = self.udp.as_mut() {
            match mlx5_model::dataplane::poll_udp(&mut self.model, u) {
                Ok(n) => did |= n > 0,
                Err(e) => eprintln!("mlx5-model: RoCEv2 responder: {e}"),
            }
        }
        match self.eth.as_mut() {
            Some(w) => match mlx5_model::dataplane::poll_eth(&mut self.model, w) {
                Ok(n) => did |= n > 0,
                Err(e) => eprintln!("mlx5-model: Ethernet wire: {e}"),
            },
            // No cable: what the SQs send goes nowhere.
            None => did |= !self.model.take_eth_frames().is_empty(),
        }
        did
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Opts, String> {
        match parse_args(args.iter().map(|s| s.to_string()))? {
            Parsed::Run(o) => Ok(*o),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn options() {
        let o = parse(&["--bar", "/dev/shm/b", "--ram=/dev/shm/r"]).unwrap();
        assert_eq!((o.bar.to_str(), o.ram.to_str()), (Some("/dev/shm/b"), Some("/dev/shm/r")));
        assert_eq!((o.bar_size, o.ram_size, o.wait), (None, None, shm::DEFAULT_WAIT));
        assert_eq!(o.udp.to_string(), DEFAULT_UDP);
        assert!(!o.exit_on_stdin_eof);
        assert!(!o.vf);
        assert_eq!(o.caps, mlx5_model::caps::CapsProfile::ConnectX5, "the CX-5 profile is the default");
        assert_eq!(o.timing, mlx5_model::Timing::firmware(), "firmware timing by default");
        let o = parse(&[
            "--bar",
            "b",
            "--ram",
            "r",
            "--bar-size",
            "32M",
            "--ram-size=0x10000000",
            "--trace",
            "t.jsonl",
            "--udp",
            "127.0.0.1:5000",
            "--wait",
            "3",
            "--exit-on-stdin-eof",
            "--control",
            "c.txt",
            "--eth-udp",
            "127.0.0.1:5555,127.0.0.1:5556",
            "--link-up-delay",
            "1500",
            "--vf",
            "--admin-down",
            "--caps",
            "cx4-trace",
            "--timing",
            "zero",
        ])
        .unwrap();
        assert_eq!(o.caps, mlx5_model::caps::CapsProfile::ConnectX4Trace);
        assert_eq!(
            parse(&["--bar", "b", "--ram", "r", "--caps=cx5"]).unwrap().caps,
            mlx5_model::caps::CapsProfile::ConnectX5
        );
        assert_eq!(o.timing, mlx5_model::Timing::Zero);
        let fixed = parse(&["--bar", "b", "--ram", "r", "--timing=20us"]).unwrap();
        assert_eq!(fixed.timing, mlx5_model::Timing::Fixed(Duration::from_micros(20)));
        assert_eq!(o.eth_udp.map(|(a, b)| (a.port(), b.port())), Some((5555, 5556)));
        assert_eq!(o.link_up_delay, Duration::from_millis(1500));
        assert_eq!(o.control, Some(PathBuf::from("c.txt")));
        assert_eq!((o.bar_size, o.ram_size), (Some(32 << 20), Some(256 << 20)));
        assert_eq!(o.trace, Some(PathBuf::from("t.jsonl")));
        assert_eq!(o.udp.port(), 5000);
        assert_eq!(o.wait, Duration::from_secs(3));
        assert!(o.exit_on_stdin_eof);
        assert!(o.vf);
        assert!(o.admin_down);
        assert!(parse(&["--bar", "b", "--ram", "r", "--vf=1"]).is_err(), "--vf takes no value");
        assert!(parse(&["--bar", "b", "--ram", "r", "--admin-down=1"]).is_err(), "--admin-down takes no value");
        assert!(!o.vf_port_reads_refused);
        let r = parse(&["--bar", "b", "--ram", "r", "--vf", "--vf-port-reads-refused"]).unwrap();
        assert!(r.vf && r.vf_port_reads_refused);
        assert!(parse(&["--bar", "b", "--ram", "r", "--vf-port-reads-refused=1"]).is_err());
        let d = parse(&["--bar", "b", "--ram", "r"]).unwrap();
        assert_eq!((d.link_up_delay, d.admin_down), (mlx5_model::hca::DEFAULT_LINK_UP_DELAY, false));
        assert!(!d.vf_port_reads_refused);
        assert!(!d.umr_entity_size_disabled);
        assert!(parse(&["--bar", "b", "--ram", "r", "--umr-entity-size-disabled"]).unwrap().umr_entity_size_disabled);
        assert!(parse(&["--bar", "b", "--ram", "r", "--umr-entity-size-disabled=1"]).is_err());
        assert!(matches!(parse_args(["-h".to_string()]), Ok(Parsed::Help)));
    }

    #[test]
    fn help_names_the_caps_profiles() {
        assert!(USAGE.contains("--caps PROFILE"));
        assert!(USAGE.contains("`cx5` (default"));
        assert!(USAGE.contains("`cx4-trace`"));
    }

    #[test]
    fn usage_errors_are_clear() {
        let e = |a: &[&str]| parse(a).unwrap_err();
        assert!(e(&[]).contains("--bar PATH is required"));
        assert!(e(&["--bar", "b"]).contains("--ram PATH is required"));
        assert!(e(&["--bar"]).contains("--bar needs a value"));
        assert!(e(&["--bar", "b", "--ram", "r", "--bar-size", "3M"]).contains("power of two"));
        assert!(e(&["--bar", "b", "--ram", "r", "--bar-size", "lots"]).contains("size in bytes"));
        assert!(e(&["--bar", "b", "--ram", "r", "--bar-size", "0"]).contains("at least 1"));
        assert!(e(&["--bar", "b", "--ram", "r", "--ram-size", "99999999T"]).contains("too large"));
        assert!(e(&["--bar", "b", "--ram", "r", "--udp", "nowhere"]).contains("--udp"));
        assert!(e(&["--bar", "b", "--ram", "r", "--wait", "0"]).contains("--wait"));
        assert!(e(&["--bar", "b", "--ram", "r", "--eth-udp", "127.0.0.1:1"]).contains("LOCAL,PEER"));
        assert!(e(&["--bar", "b", "--ram", "r", "--link-up-delay", "soon"]).contains("milliseconds"));
        assert!(e(&["--bar", "b", "--ram", "r", "--fast"]).contains("unknown argument `--fast`"));
        assert!(e(&["--bar", "b", "--ram", "r", "--caps", "cx6"]).contains("--caps needs `cx5` or `cx4-trace`"));
        assert!(e(&["--bar", "b", "--ram", "r", "--caps"]).contains("--caps needs a value"));
        assert!(e(&["--bar", "b", "--ram", "r", "--timing", "quick"]).contains("--timing: expected `firmware`"));
        assert!(e(&["--bar", "b", "--ram", "r", "--timing"]).contains("--timing needs a value"));
        assert!(e(&["--bar=", "--ram", "r"]).contains("non-empty"));
    }
}
