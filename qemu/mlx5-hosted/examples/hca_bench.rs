//! `cargo xtask bench hca`, hosted part: the driver in this process against the device model on its own
//! thread (`ModelMode::Thread`), native timing. For a cheap command (QUERY_MKEY) and for CREATE_MKEY +
//! DESTROY_MKEY pairs, with one command outstanding and with every regular slot busy (30; the last of the 32
//! slots is reserved for MANAGE_PAGES, as in Linux `core/cmd.c`, the one before it for the fatal path's
//! port-down command), it prints the rate, the latency and the
//! command engine's CPU time per command. Figures only; nothing is asserted.
//!
//! `cargo run --release -p mlx5-hosted --example hca_bench -- [--secs N]` (N seconds per row, default 2).
//! The last line (`summary: ...`) is for xtask, which states the goals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasebox_mlx5::command::Command;
use leasebox_mlx5::driver::{Config, Driver};
use leasebox_mlx5::handles::{Mkey, MkeyVariant, Pdn};
use leasebox_mlx5::ifc::mkey::{self, MkeyAccess, MkeyParams};
use leasebox_mlx5::platform::Platform;
use mlx5_hosted::{HostedPlatform, ModelMode};
use mlx5_model::ModelConfig;

type Hosted = Driver<HostedPlatform>;

/// RAM for the model: the init pages (~50 MiB with the model's defaults) plus queues.
const RAM_BYTES: usize = 128 << 20;
/// Commands run (and drained) before each row's timed window.
const WARM_UP: u64 = 200;
/// Bound on draining the outstanding commands after a window.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// QUERY_MKEY of one existing key.
    Query,
    /// CREATE_MKEY, then DESTROY_MKEY of the key it returned; one op = one pair.
    Pair,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::Query => "QUERY_MKEY",
            Workload::Pair => "CREATE_MKEY+DESTROY_MKEY",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Workload::Query => "cmd/s",
            Workload::Pair => "pairs/s",
        }
    }
}

/// What an outstanding tag is.
#[derive(Clone, Copy)]
enum Pending {
    Query,
    Create { variant: u8 },
    Destroy,
}

/// Everything a workload needs to build its commands.
struct Fixture {
    pd: Pdn,
    page: u64,
    key: Mkey,
    variant: MkeyVariant,
}

impl Fixture {
    fn create(&mut self) -> (Command, Pending) {
        let variant = self.variant.take();
        let cmd = mkey::create_mkey_mtt(&MkeyParams {
            pd: self.pd,
            variant,
            start: self.page,
            len: 4096,
            access: MkeyAccess::LOCAL_READ | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE,
            log_page_size: 12,
            pages: &[self.page],
        });
        (cmd, Pending::Create { variant })
    }

    fn first(&mut self, w: Workload) -> (Command, Pending) {
        match w {
            Workload::Query => (mkey::query_mkey(self.key.index()), Pending::Query),
            Workload::Pair => self.create(),
        }
    }
}

/// One row's figures.
struct Row {
    workload: Workload,
    window: usize,
    ops: u64,
    commands: u64,
    secs: f64,
    /// Client submit → completion taken from the client ring, ns.
    latency: Vec<u64>,
    /// Doorbell → completion seen by the engine (`Completion::elapsed_ns`), ns.
    held: Vec<u64>,
    /// `CommandEngine::busy_ns` over the window and its drain.
    busy_ns: u64,
    max_in_flight: usize,
}

impl Row {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    fn driver_ns_per_command(&self) -> f64 {
        self.busy_ns as f64 / self.commands.max(1) as f64
    }
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64
}

/// Submits `cmd`, remembering it as pending; when the queue is full it goes back on `next` (`false`).
fn submit(
    d: &mut Hosted,
    pending: &mut HashMap<u64, (Pending, Instant)>,
    next: &mut Vec<(Command, Pending)>,
    cmd: Command,
    what: Pending,
) -> bool {
    match d.client.submit(cmd) {
        Ok(tag) => {
            pending.insert(tag, (what, Instant::now()));
            true
        }
        Err(cmd) => {
            next.push((cmd, what));
            false
        }
    }
}

/// Keeps `window` commands outstanding for `dur` (or until `max_ops` ops when given), then drains.
fn run(d: &mut Hosted, f: &mut Fixture, w: Workload, window: usize, dur: Duration, max_ops: Option<u64>) -> Row {
    let mut pending: HashMap<u64, (Pending, Instant)> = HashMap::with_capacity(window * 2);
    let mut next: Vec<(Command, Pending)> = Vec::with_capacity(window);
    let mut row = Row {
        workload: w,
        window,
        ops: 0,
        commands: 0,
        secs: 0.0,
        latency: Vec::with_capacity(1 << 20),
        held: Vec::with_capacity(1 << 20),
        busy_ns: 0,
        max_in_flight: 0,
    };
    let busy0 = d.cmd.busy_ns;
    let t0 = Instant::now();
    let stop_at = t0 + dur;
    let mut stopped: Option<Instant> = None;
    loop {
        while stopped.is_none() && pending.len() < window {
            let (cmd, what) = next.pop().unwrap_or_else(|| f.first(w));
            if !submit(d, &mut pending, &mut next, cmd, what) {
                break;
            }
        }
        d.pump();
        // Steps the model in `ModelMode::InProcess`; a spin hint with the model on its own thread.
        d.platform().relax();
        row.max_in_flight = row.max_in_flight.max(d.cmd.queue().in_flight());
        while let Some(c) = d.client.poll() {
            let now = Instant::now();
            let Some((what, sent)) = pending.remove(&c.tag) else {
                panic!("completion for unknown tag {}", c.tag);
            };
            let out = match c.result {
                Ok(out) => out,
                Err(e) => panic!("{} failed: {e}", w.label()),
            };
            row.commands += 1;
            row.latency.push(now.duration_since(sent).as_nanos() as u64);
            row.held.push(c.elapsed_ns);
            match what {
                Pending::Query => row.ops += u64::from(stopped.is_none()),
                Pending::Create { variant } => {
                    // The pair continues even after the window: no key is left behind.
                    let key = mkey::create_mkey_out_key(&out, variant);
                    next.push((mkey::destroy_mkey(key.index()), Pending::Destroy));
                }
                Pending::Destroy => row.ops += u64::from(stopped.is_none()),
            }
        }
        // Destroys owed after the window still go out.
        if stopped.is_some() {
            while let Some((cmd, what)) = next.pop() {
                if !submit(d, &mut pending, &mut next, cmd, what) {
                    break;
                }
            }
        }
        match stopped {
            None => {
                let now = Instant::now();
                if now >= stop_at || max_ops.is_some_and(|m| row.ops >= m) {
                    row.secs = now.duration_since(t0).as_secs_f64();
                    stopped = Some(now);
                }
            }
            Some(at) => {
                if pending.is_empty() && next.is_empty() {
                    break;
                }
                assert!(at.elapsed() < DRAIN_LIMIT, "{} commands still outstanding after the window", pending.len());
            }
        }
    }
    row.busy_ns = d.cmd.busy_ns - busy0;
    row.latency.sort_unstable();
    row.held.sort_unstable();
    row
}

fn parse_secs() -> Result<f64, String> {
    let mut secs = 2.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = match a.as_str() {
            "--secs" => args.next().ok_or("--secs needs a value")?,
            s if s.starts_with("--secs=") => s["--secs=".len()..].to_string(),
            other => return Err(format!("unknown argument `{other}` (usage: hca_bench [--secs N])")),
        };
        secs = match v.parse::<f64>() {
            Ok(s) if s > 0.0 && s <= 600.0 => s,
            _ => return Err(format!("--secs needs a number of seconds from 0 to 600, got `{v}`")),
        };
    }
    Ok(secs)
}

/// Firmware time per command for the pipelining table (`Timing::Fixed`): one latency for every command, so the
/// rows compare pipelining alone (the default per-opcode table is docs/hca-model.md, "Command timing and doorbells").
const FIRMWARE_US: u64 = 20;

/// Brings a driver up on a fresh model driven as `mode` (each command held `latency` by the model), runs the
/// four rows, tears the key down.
fn bench(mode: ModelMode, secs: f64, latency: Duration) -> (Vec<Row>, usize) {
    let model = ModelConfig { timing: mlx5_model::Timing::Fixed(latency), ..ModelConfig::instant() };
    let platform = Arc::new(HostedPlatform::with_model(model, RAM_BYTES, mode));
    let cfg = Config { part: "ConnectX-5", pre_init_timeout_ms: 2000, ..Config::default() };
    let mut d = match Driver::bring_up(platform, cfg) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("hca_bench: bring-up failed: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "hca_bench: model {mode:?}: HCA up in {:.3} ms (fw {}, {} command slots); {secs} s per row",
        d.info.bring_up_ns as f64 / 1e6,
        d.info.fw,
        d.cmd.queue().slots()
    );
    let pd = d.alloc_pd().unwrap_or_else(|e| panic!("ALLOC_PD: {e}"));
    let page = d.platform().dma_alloc(4096, 4096).expect("a DMA page").addr();
    let access = MkeyAccess::LOCAL_READ | MkeyAccess::REMOTE_READ | MkeyAccess::REMOTE_WRITE;
    let key = d.create_mkey(pd, page, 4096, access, 12, &[page]).unwrap_or_else(|e| panic!("CREATE_MKEY: {e}"));
    let mut f = Fixture { pd, page, key, variant: MkeyVariant::new(0x40) };
    // The page slot and the fatal path's emergency slot take no regular command.
    let regular = d.cmd.queue().slots() - 2;
    let dur = Duration::from_secs_f64(secs);
    let mut rows = Vec::new();
    for w in [Workload::Query, Workload::Pair] {
        for window in [1, regular] {
            run(&mut d, &mut f, w, window, Duration::from_secs(5), Some(WARM_UP));
            let r = run(&mut d, &mut f, w, window, dur, None);
            eprintln!(
                "hca_bench: model {mode:?}: {} with {window} outstanding: {:.0} {}, driver {:.0} ns/cmd",
                w.label(),
                r.rate(),
                w.unit(),
                r.driver_ns_per_command()
            );
            rows.push(r);
        }
    }
    if let Err(e) = d.destroy_mkey(key) {
        eprintln!("hca_bench: DESTROY_MKEY of the query key: {e}");
    }
    (rows, regular)
}

fn main() {
    let secs = match parse_secs() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hca_bench: {e}");
            std::process::exit(2);
        }
    };
    let (threaded, regular) = bench(ModelMode::Thread, secs, Duration::ZERO);
    let (firmware, _) = bench(ModelMode::Thread, secs, Duration::from_micros(FIRMWARE_US));
    let (in_process, _) = bench(ModelMode::InProcess, secs, Duration::ZERO);
    let mut out = String::new();
    out.push_str(
        "hosted, model on its own thread, commands executed at the model's own speed (CPU-bound on both sides):\n",
    );
    out.push_str(&table(&threaded, regular));
    out.push_str(&format!(
        "\nhosted, model on its own thread holding every command {FIRMWARE_US} µs after its doorbell (firmware time; \
         other slots run meanwhile):\n"
    ));
    out.push_str(&table(&firmware, regular));
    out.push_str(
        "\nhosted, model stepped in-process from Platform::relax (no second thread touching the memories while the \
         engine runs; rates not comparable):\n",
    );
    out.push_str(&table(&in_process, regular));
    out.push_str(&format!(
        "({secs} s per row after {WARM_UP} warm-up ops; rate = ops completed in the window; p50/p99 = client submit \
         → completion taken, per command;\n held = doorbell → completion seen by the engine; driver ns/cmd = \
         CommandEngine::busy_ns / commands: the engine passes that did work (submit, completion handling, page \
         work,\n including polling the pending slots within those passes), not idle polling passes, not the \
         client's command building and rings, not the model's work)\n"
    ));
    let worst = |rows: &[Row]| rows.iter().map(Row::driver_ns_per_command).fold(0.0, f64::max);
    out.push_str(&format!(
        "summary: query_ratio={:.2} pair_ratio={:.2} query_ratio_fw={:.2} pair_ratio_fw={:.2} fw_us={FIRMWARE_US} \
         driver_ns_max={:.0} driver_ns_max_in_process={:.0}\n",
        ratio(&threaded, Workload::Query).unwrap_or(f64::NAN),
        ratio(&threaded, Workload::Pair).unwrap_or(f64::NAN),
        ratio(&firmware, Workload::Query).unwrap_or(f64::NAN),
        ratio(&firmware, Workload::Pair).unwrap_or(f64::NAN),
        worst(&threaded),
        worst(&in_process)
    ));
    print!("{out}");
}

fn one_slot_rate(rows: &[Row], w: Workload) -> Option<f64> {
    rows.iter().find(|r| r.workload == w && r.window == 1).map(Row::rate)
}

/// The many-slot rate over the one-slot rate.
fn ratio(rows: &[Row], w: Workload) -> Option<f64> {
    let one = one_slot_rate(rows, w)?;
    rows.iter().find(|r| r.workload == w && r.window > 1).map(|r| r.rate() / one)
}

fn slots_label(window: usize, regular: usize) -> String {
    if window == 1 {
        "1".to_string()
    } else {
        format!("{window} of {regular} regular slots (+1 page, +1 fatal-path slot)")
    }
}

fn table(rows: &[Row], regular: usize) -> String {
    let headers = [
        "command",
        "outstanding",
        "rate",
        "vs 1",
        "commands/s",
        "p50 µs",
        "p99 µs",
        "held p50 µs",
        "driver ns/cmd",
        "max in flight",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let ratio = one_slot_rate(rows, r.workload).map_or("—".to_string(), |o| format!("{:.1}×", r.rate() / o));
            vec![
                r.workload.label().to_string(),
                slots_label(r.window, regular),
                format!("{:.0} {}", r.rate(), r.workload.unit()),
                ratio,
                format!("{:.0}", r.commands as f64 / r.secs),
                format!("{:.1}", percentile(&r.latency, 0.50) / 1e3),
                format!("{:.1}", percentile(&r.latency, 0.99) / 1e3),
                format!("{:.1}", percentile(&r.held, 0.50) / 1e3),
                format!("{:.0}", r.driver_ns_per_command()),
                r.max_in_flight.to_string(),
            ]
        })
        .collect();
    mlx5_hosted::table::render(&headers, &cells, 2)
}
