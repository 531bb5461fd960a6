//! The HCA in the image: find it (a ConnectX PF/VF, or the ivshmem function carrying the model), map its
//! BAR0 uncached, enable memory decoding and bus mastering (INTx off), bring it up on the BSP before the other
//! cores start, then hand the command engine and the event engine to the cores that run the `cmd` and
//! `event` roles (core 0 runs both in the one-CPU layout). The client end stays for the lease service.
//!
//! Fail closed on crash (docs/revoke-semantics.md): the function is registered with the kernel's fatal path
//! (`arch::fail_closed`), which clears its bus mastering before the core halts; before that, the quiesce hook
//! registered here ([`port_down`]) posts the port-down command prepared at bring-up in the command queue's
//! emergency slot and waits for it at most [`EMERGENCY_MS`].

use crate::hca_platform::KernelHca;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use leasebox_kernel::arch::mmio::Mmio;
use leasebox_kernel::arch::start::Platform;
use leasebox_kernel::pci;
use leasebox_lease::setup::LeaseParts;
use leasebox_mlx5::cmdq::{Emergency, EmergencyOutcome};
use leasebox_mlx5::driver::{Config, Driver, HcaInfo};
use leasebox_mlx5::engine::{Client, CommandEngine, EventEngine, Shared};
use leasebox_mlx5::initseg;
use leasebox_mlx5::log::CmdLog;
use leasebox_mlx5::probe;
use leasebox_proto::HcaState;
use mlx5_signature as sig;
use spin::{Mutex, Once};

pub static CMD_ENGINE: Mutex<Option<CommandEngine<KernelHca>>> = Mutex::new(None);
pub static EVENT_ENGINE: Mutex<Option<EventEngine<KernelHca>>> = Mutex::new(None);
/// The submitting end, for the lease service on core 0.
pub static CLIENT: Mutex<Option<Client>> = Mutex::new(None);

/// What the lease service needs from bring-up and the platform its host uses, or why it cannot start.
static LEASES: Once<Result<(LeaseParts, Arc<KernelHca>), String>> = Once::new();

/// The lease parts and the platform once the HCA is up, or why the lease service cannot start.
pub fn leases() -> Result<&'static (LeaseParts, Arc<KernelHca>), &'static str> {
    match LEASES.get() {
        Some(Ok(l)) => Ok(l),
        Some(Err(e)) => Err(e),
        None => Err("no HCA"),
    }
}

/// For readers on core 0 and the panic path: the command ring, the engines' shared state, a one-line summary.
static LOG: Once<Arc<Mutex<CmdLog>>> = Once::new();
static SHARED: Once<Arc<Shared>> = Once::new();
static SUMMARY: Once<String> = Once::new();
/// The fatal path's port-down command and the platform it is posted through.
static EMERGENCY: Once<(Emergency, Arc<KernelHca>)> = Once::new();
/// How long the fatal path waits for the port-down command before it clears bus mastering all the same. A
/// PAOS write is one register access for the firmware (milliseconds); the bound only keeps a hung HCA from
/// holding the halt back.
const EMERGENCY_MS: u64 = 1_000;
/// Commands shown by HEALTH and on a fatal exception or panic.
const DUMP_RECORDS: usize = 16;

/// Bring-up waits at most this long for `initializing` on the mlx5 model (found through its ivshmem signature,
/// never on a real device): shorter than Linux's 120 s so that a CI boot whose model does not start says so
/// within the scenario's deadline. A real ConnectX (found by its Mellanox PCI id) gets Linux's 120 s
/// (`initseg::FW_PRE_INIT_TIMEOUT_MS`), which firmware needs after `mlxfwreset` or a pending activation.
const MODEL_PRE_INIT_MS: u64 = 10_000;

/// Bring-up then waits at most this long for the port's link (PAOS `oper_status`): a ConnectX-5 trains its link
/// for seconds after INIT_HCA or the PAOS write, the model for `--link-up-delay` (1 s by default). A link still
/// down then is reported on the ready line (`port=Down`) and logged when PORT_CHANGE brings it up; boot goes on.
const LINK_WAIT_MS: u64 = 5_000;

/// What the ready line reports.
pub enum Status {
    Absent,
    Up(HcaInfo),
    Failed(String),
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Status::Absent => f.write_str("hca=none"),
            Status::Up(i) => write!(
                f,
                "hca={} fw={} port={} hca_ms={}.{:03}{}",
                i.part.replace(' ', "-"),
                i.fw,
                i.port,
                i.bring_up_ns / 1_000_000,
                (i.bring_up_ns / 1000) % 1000,
                At
            ),
            Status::Failed(e) => write!(f, "hca=failed{At} error=\"{e}\""),
        }
    }
}

/// Where the HCA was found, once `init` found it.
static HCA_AT: Once<pci::Bdf> = Once::new();

/// The HCA's PCI address as `segment:bus:device.function`, always with the segment (the ready line's
/// `hca_at=`, HEALTH's "at"): the address an operator compares with `lspci -D` on the host.
pub struct Location(pub pci::Bdf);

impl core::fmt::Display for Location {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let b = self.0;
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", b.segment, b.bus, b.device, b.function)
    }
}

/// ` hca_at=SSSS:BB:DD.F` when the HCA was found, else nothing.
struct At;

impl core::fmt::Display for At {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match HCA_AT.get() {
            Some(&b) => write!(f, " hca_at={}", Location(b)),
            None => Ok(()),
        }
    }
}

/// The first supported function: (address, BAR base, BAR size, part, whether it is the mlx5 model).
fn find(p: &Platform) -> Option<(pci::Bdf, u64, u64, probe::Part, bool)> {
    for f in p.pci.functions() {
        if let Some(part) = probe::classify(f.vendor, f.device)
            && let Some((base, size)) = f.bars[0].mem()
            && base != 0
        {
            return Some((f.bdf, base, size, part, false));
        }
    }
    p.pci.find(sig::IVSHMEM_VENDOR, sig::IVSHMEM_DEVICE).find_map(|f| {
        let (base, size) = f.bars[sig::IVSHMEM_BAR].mem()?;
        let device = carries_model(p, f.bdf, base, size)?;
        // The part the model plays (a PF, or a VF with `--vf`), named by its signature.
        let plays = probe::classify(probe::MELLANOX, device);
        if plays.is_none() {
            log::warn!("pci: {} the mlx5 model plays device {device:#06x}, which no supported part has", f.bdf);
        }
        Some((f.bdf, base, size, plays?, true))
    })
}

/// The PCI device id the mlx5 model plays, when the ivshmem function's BAR2 carries its signature
/// (`mlx5-signature`). Reads only the BAR's last page: the CX-5 initialization segment at offset 0 is left for
/// the driver.
fn carries_model(p: &Platform, bdf: pci::Bdf, base: u64, size: u64) -> Option<u16> {
    let off = sig::offset(size)?;
    if base == 0 {
        log::warn!("pci: {bdf} ivshmem BAR2 is not assigned; not checked for the mlx5 model");
        return None;
    }
    let page = base + off;
    // SAFETY: `[page, page + 4 KiB)` is the last page of the function's memory BAR (`off + 0x1000 <= size`), not
    // RAM; ivshmem is plain shared memory, so reading it has no side effects.
    let window = match unsafe { Mmio::map(page, sig::SIGNATURE_OFFSET_FROM_END) } {
        Ok(w) => w,
        Err(e) => {
            log::warn!("pci: {bdf} mapping ivshmem BAR2 page {page:#x}: {e}");
            return None;
        }
    };
    // Memory decoding only: no bus mastering, and interrupts stay off (INTx disabled).
    pci::set_command(p.pci_access, bdf, pci::COMMAND_MEMORY | pci::COMMAND_INTX_DISABLE, 0);
    let mut bytes = [0u8; sig::SIGNATURE_LEN];
    for (i, word) in bytes.chunks_exact_mut(4).enumerate() {
        word.copy_from_slice(&window.read32(i * 4).to_ne_bytes());
    }
    if sig::matches(&bytes, size) {
        let device = sig::plays(&bytes);
        log::info!("pci: {bdf} ivshmem carries the mlx5 model (signature at BAR2+{off:#x})");
        Some(device)
    } else {
        log::debug!("pci: {bdf} ivshmem without the mlx5 model's signature");
        None
    }
}

/// What the event engine last heard of port 1's link (PORT_CHANGE), for the control NIC on any core.
pub fn port_event() -> Option<leasebox_mlx5::driver::PortState> {
    SHARED.get()?.port_event(1)
}

/// Finds and brings up the HCA, then parks the engines for their cores; with `eth`, also builds the Ethernet
/// port the control channel runs on (`crate::eth`). Runs on the BSP before the APs start (mapping the BAR is
/// not shot down on other cores).
pub fn init(p: &Platform, eth: bool) -> Status {
    let Some((bdf, base, size, part, model)) = find(p) else {
        LEASES.call_once(|| Err(String::from("no HCA")));
        return Status::Absent;
    };
    HCA_AT.call_once(|| bdf);
    // SAFETY: `[base, base + size)` is the function's memory BAR as enumerated (not RAM), and this platform
    // is the only user of its registers.
    let bar = match unsafe { Mmio::map(base, size) } {
        Ok(bar) => bar,
        Err(e) => {
            LEASES.call_once(|| Err(String::from("the HCA did not come up")));
            return Status::Failed(format!("mapping BAR {base:#x}+{size:#x}: {e}"));
        }
    };
    pci::set_command(p.pci_access, bdf, pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER | pci::COMMAND_INTX_DISABLE, 0);
    // From now on the HCA can reach memory: a crash must take that away again (`arch::fail_closed`).
    leasebox_kernel::arch::fail_closed::register_bus_master(p.pci_access, bdf);
    log::info!("mlx5: {bdf} {} BAR0 {base:#x}+{size:#x}", part.name);
    let platform = Arc::new(KernelHca::new(bar));
    let cfg = Config {
        part: part.name,
        vf: part.vf,
        pre_init_timeout_ms: if model { MODEL_PRE_INIT_MS } else { initseg::FW_PRE_INIT_TIMEOUT_MS },
        link_wait_ms: LINK_WAIT_MS,
        ..Config::default()
    };
    match Driver::bring_up(platform.clone(), cfg) {
        Ok(mut d) => {
            match leasebox_lease::setup::prepare(&mut d, &crate::lease::OPTIONS.get(), p.config.net.ip.map(|n| n.addr))
            {
                Ok(parts) => {
                    LEASES.call_once(|| Ok((parts, platform.clone())));
                }
                Err(e) => {
                    LEASES.call_once(|| Err(e));
                }
            }
            if eth {
                crate::eth::build(&mut d);
            }
            match d.prepare_port_down() {
                Some(e) => {
                    log::info!(
                        "mlx5: fatal path armed: port-down command in slot {}, then bus mastering off",
                        e.slot()
                    );
                    EMERGENCY.call_once(|| (e, platform.clone()));
                    leasebox_kernel::arch::fail_closed::set_quiesce_hook(port_down);
                }
                None => {
                    log::info!("mlx5: fatal path armed: bus mastering off (no port-down command for this function)")
                }
            }
            let (cmd, ev, client, info) = d.into_engines();
            log::info!(
                "mlx5: up: fw {} issi {} pages boot {} init {} uar {} eqn {} mac {:02x?} mtu {} port {}",
                info.fw,
                info.issi,
                info.boot_pages,
                info.init_pages,
                info.uar,
                info.eqn,
                info.mac,
                info.mtu,
                info.port
            );
            LOG.call_once(|| cmd.queue().log_handle());
            SHARED.call_once(|| client.shared_handle());
            SUMMARY.call_once(|| {
                format!("{} at {} fw {} port {} mtu {}", info.part, Location(bdf), info.fw, info.port, info.mtu)
            });
            leasebox_kernel::arch::set_fatal_hook(dump_commands);
            *CMD_ENGINE.lock() = Some(cmd);
            *EVENT_ENGINE.lock() = Some(ev);
            *CLIENT.lock() = Some(client);
            Status::Up(info)
        }
        Err(e) => {
            log::error!("mlx5: bring-up failed: {e}");
            LEASES.call_once(|| Err(String::from("the HCA did not come up")));
            SUMMARY.call_once(|| format!("at {}: bring-up failed: {e}", Location(bdf)));
            Status::Failed(format!("{e}"))
        }
    }
}

/// The HCA's state and a message for HEALTH: the summary (part, PCI address, firmware, port, MTU), the command
/// counters (`failed`, `timeout`, `late`, `aborted` only when not zero), the Ethernet port's line, then the newest
/// commands while they fit the protocol's 256-byte message (the panic dump shows more).
pub fn health() -> (HcaState, String) {
    let Some(summary) = SUMMARY.get() else { return (HcaState::Absent, String::from("no HCA")) };
    let (Some(shared), Some(log)) = (SHARED.get(), LOG.get()) else { return (HcaState::Fatal, summary.clone()) };
    let state = if shared.fatal().is_some() { HcaState::Fatal } else { HcaState::Ok };
    let l = log.lock();
    let c = l.counters;
    // The counters that count trouble only when there is some: the message shares the protocol's 256 bytes with
    // the lease service's summary and the control port's line, and HCA_STATS carries every counter as a number.
    let mut m = format!("{summary}; cmds {} ok {}", c.submitted, c.ok);
    for (name, n) in [("failed", c.failed), ("timeout", c.timeouts), ("late", c.late), ("aborted", c.aborted)] {
        if n != 0 {
            m.push_str(&format!(" {name} {n}"));
        }
    }
    // Health syndromes reported but not fatal (a firmware assert, high temperature), when there were any.
    let reports = shared.health_reports.load(core::sync::atomic::Ordering::Relaxed);
    if reports != 0 {
        m.push_str(&format!("; health reports {reports}"));
    }
    if let Some(eth) = crate::eth::summary() {
        m.push_str("; ");
        m.push_str(&eth);
    }
    let recent: alloc::vec::Vec<String> = l.last(DUMP_RECORDS).map(|r| format!("\n{r}")).collect();
    for line in recent.iter().rev() {
        if m.len() + line.len() > leasebox_proto::MAX_MESSAGE {
            break;
        }
        m.push_str(line);
    }
    (state, m)
}

/// HCA_STATS: the command log's totals, once the HCA is up.
pub fn stats() -> Option<leasebox_proto::HcaStats> {
    let (shared, log) = (SHARED.get()?, LOG.get()?);
    let state = if shared.fatal().is_some() { HcaState::Fatal } else { HcaState::Ok };
    Some(leasebox_lease::backend::hca_stats(state, &log.lock().counters))
}

/// The fatal-path dump: the last commands, if the ring is not locked by another core at that moment, then
/// the lease service's last transitions (`lease::dump_transitions`).
fn dump_commands() {
    dump_ring();
    crate::lease::dump_transitions();
}

fn dump_ring() {
    let Some(log) = LOG.get() else { return };
    let Some(l) = log.try_lock() else {
        leasebox_kernel::arch::serial::write_unlocked(format_args!("mlx5: command ring busy; not dumped\n"));
        return;
    };
    leasebox_kernel::arch::serial::write_unlocked(format_args!("mlx5: last commands ({:?}):\n", l.counters));
    for r in l.last(DUMP_RECORDS) {
        leasebox_kernel::arch::serial::write_unlocked(format_args!("mlx5:   {r}\n"));
    }
}

/// The fatal path's first step (`arch::fail_closed`): posts the port-down command (PAOS `admin_status` down)
/// in the emergency slot and waits for it at most [`EMERGENCY_MS`]. Takes no lock the engines hold and
/// allocates nothing; whatever it returns, bus mastering is cleared next.
fn port_down() {
    let Some((e, platform)) = EMERGENCY.get() else { return };
    let say = leasebox_kernel::arch::serial::write_unlocked;
    let core = leasebox_kernel::arch::percpu::core_id();
    let start = leasebox_kernel::time::Instant::now();
    let outcome = e.fire(&platform.fatal_view(), EMERGENCY_MS * 1_000_000);
    let us = start.elapsed().as_micros();
    match outcome {
        EmergencyOutcome::Completed { delivery: 0, status: 0 } => {
            say(format_args!("!!! c{core} fail-closed: port 1 down (PAOS admin_status down) in {us} us\n"))
        }
        EmergencyOutcome::Completed { delivery, status } => say(format_args!(
            "!!! c{core} fail-closed: port-down command failed (delivery {delivery:#x}, status {status:#x}) after {us} us\n"
        )),
        EmergencyOutcome::TimedOut => {
            say(format_args!("!!! c{core} fail-closed: port-down command unanswered after {EMERGENCY_MS} ms\n"))
        }
    }
}
