//! The BSP's path from the long-mode entry to the image's `leasebox_main`: console, TSC, boot information,
//! configuration, frames, page tables, heap, descriptor tables, ACPI, PCI. Each step's failure is a boot
//! error with a message on the console, never undefined behaviour.

use super::memory::{self, FRAMES, IdentityMem};
use super::pci_access::{Ecam, EcamSet, LegacyPorts, PciAccess};
use super::{boot, descriptors, lapic::Lapic, logger, percpu, serial, smp, tsc};
use crate::acpi::{self, AcpiInfo};
use crate::bootinfo::{self, BootInfo, RegionKind};
use crate::config::{Config, OptionParser, Redacted};
use crate::console::{ConsoleChoice, SpcrConsole, Uart};
use crate::frames::FrameAllocator;
use crate::pci::{self, PciBus};
use crate::physmem::PhysMem;
use crate::time;
use core::fmt;
use core::ops::Range;
use spin::Once;

/// Nothing below 1 MiB is handed out: real-mode structures, the AP trampoline, firmware leftovers.
const FRAME_FLOOR: u64 = 1 << 20;
/// Where the console's configuration module is recognized.
const CONFIG_MODULE: &str = "leasebox.conf";

/// What the kernel found, handed to the image.
pub struct Platform {
    pub boot: &'static BootInfo,
    pub config: Config<'static>,
    pub acpi: Option<&'static AcpiInfo>,
    pub pci: &'static PciBus,
    /// How configuration space was reached (ECAM or the 0xCF8 ports), for drivers.
    pub pci_access: &'static PciAccess,
    pub lapic: Option<Lapic>,
    pub bsp_apic_id: u32,
    /// TSC at kernel entry (the first instruction of `_start`).
    pub entry_tsc: u64,
    pub tsc_hz: u64,
    pub tsc_source: tsc::Source,
}

static BOOT: Once<BootInfo> = Once::new();
static ACPI: Once<AcpiInfo> = Once::new();
static PCI: Once<PciBus> = Once::new();
static PCI_ACCESS: Once<PciAccess> = Once::new();
unsafe extern "Rust" {
    /// The image's main function (defined in `image/`).
    fn leasebox_main(platform: Platform) -> !;
    /// The parsers for the options of the layers above the kernel (defined in `image/`; see
    /// [`crate::config::OptionParser`]).
    fn leasebox_options() -> &'static [&'static dyn OptionParser<'static>];
}

/// Prints a boot error and fails the run.
pub fn boot_error(args: fmt::Arguments<'_>) -> ! {
    serial::write_unlocked(format_args!("!!! c{} BOOT ERROR: {}\n", percpu::core_id(), args));
    super::exit::fail()
}

macro_rules! fatal {
    ($($t:tt)*) => { boot_error(format_args!($($t)*)) };
}

fn image_range() -> Range<u64> {
    // SAFETY: only the addresses of linker-script symbols are taken.
    unsafe { (&boot::__image_start as *const u8 as u64)..(&boot::__image_end as *const u8 as u64) }
}

fn config_from(boot: &'static BootInfo) -> Config<'static> {
    // SAFETY: `leasebox_options` is defined by the image with exactly this signature.
    let mut cfg = Config::with_parsers(unsafe { leasebox_options() });
    for m in boot.modules() {
        if !m.cmdline().split_ascii_whitespace().any(|w| w.ends_with(CONFIG_MODULE)) {
            continue;
        }
        let text = usize::try_from(m.end.saturating_sub(m.start))
            .ok()
            .and_then(|len| IdentityMem.bytes(m.start, len))
            .map(core::str::from_utf8);
        match text {
            Some(Ok(t)) => {
                if let Err(e) = cfg.apply(t) {
                    fatal!("{CONFIG_MODULE}: {e}");
                }
            }
            Some(Err(_)) => fatal!("{CONFIG_MODULE} is not UTF-8 text"),
            None => fatal!("{CONFIG_MODULE} at {:#x}..{:#x} is unreadable", m.start, m.end),
        }
    }
    if let Err(e) = cfg.apply_cmdline(boot.cmdline()) {
        fatal!("command line: {e}");
    }
    if let Err(e) = cfg.check() {
        fatal!("configuration: {e}");
    }
    cfg
}

fn init_frames(boot: &BootInfo) {
    let mut exclude: [Range<u64>; bootinfo::MAX_BOOT_DATA + 1] = core::array::from_fn(|_| 0..0);
    exclude[0] = image_range();
    let data = boot.boot_data();
    exclude[1..=data.len()].clone_from_slice(data);
    *FRAMES.lock() = FrameAllocator::new(&boot.memory, &exclude[..=data.len()], FRAME_FLOOR);
    for r in boot.memory.regions() {
        if r.kind == RegionKind::Usable
            && r.end() > (4 << 30)
            && let Err(e) = memory::map_ram(r.start, r.end())
        {
            fatal!("mapping RAM {:#x}..{:#x}: {e}", r.start, r.end());
        }
    }
}

fn find_acpi(boot: &BootInfo) -> Option<AcpiInfo> {
    let (rsdp, origin) = match boot.rsdp {
        Some((a, o)) => (a, o),
        None => match acpi::find_rsdp_legacy(&IdentityMem) {
            Some(a) => (a, bootinfo::RsdpOrigin::LegacySearch),
            None => {
                log::warn!("acpi: no RSDP found; running on one CPU without ECAM");
                return None;
            }
        },
    };
    match acpi::parse(&IdentityMem, rsdp) {
        Ok(a) => {
            log::info!(
                "acpi: rsdp {rsdp:#x} ({origin:?}) revision {} oem {} cpus {} ecam {} lapic {:#x}",
                a.revision,
                core::str::from_utf8(&a.oem_id).unwrap_or("?"),
                a.cpus().len(),
                a.ecam().len(),
                a.lapic_addr
            );
            if a.skipped_cpus() > 0 {
                log::warn!(
                    "acpi: {} more usable processors than the {} the kernel drives; they stay parked",
                    a.skipped_cpus(),
                    acpi::MAX_CPUS
                );
            }
            Some(a)
        }
        Err(e) => {
            log::error!("acpi: {e}; running on one CPU without ECAM");
            None
        }
    }
}

/// Without `console=`: the SPCR's UART when it is one the kernel drives, else COM1 where it is.
fn settle_console(acpi: Option<&AcpiInfo>) {
    match acpi.and_then(|a| a.spcr) {
        Some(SpcrConsole::Uart(u)) => {
            serial::select(Some(u), "ACPI SPCR");
            log::info!("console: {u} (ACPI SPCR)");
        }
        Some(SpcrConsole::Disabled) | None => serial::select(Some(Uart::COM1), "default"),
        Some(other) => {
            serial::select(Some(Uart::COM1), "default");
            log::warn!("console: the ACPI SPCR names a UART the kernel cannot drive: {other}; staying on COM1");
        }
    }
}

fn log_function(f: &pci::Function) {
    use core::fmt::Write;
    let mut line = heapless_line::Line::new();
    let _ = write!(
        line,
        "pci: {} {:04x}:{:04x} class={:02x}.{:02x}.{:02x}",
        f.bdf, f.vendor, f.device, f.class, f.subclass, f.prog_if
    );
    for (i, b) in f.bars.iter().enumerate() {
        let _ = match *b {
            pci::Bar::None => Ok(()),
            pci::Bar::Io { port, size } => write!(line, " bar{i}=io:{port:#x}+{size:#x}"),
            pci::Bar::Mem32 { addr, size, prefetchable } => {
                write!(line, " bar{i}=mem32{}:{addr:#x}+{size:#x}", if prefetchable { "pf" } else { "" })
            }
            pci::Bar::Mem64 { addr, size, prefetchable } => {
                write!(line, " bar{i}=mem64{}:{addr:#x}+{size:#x}", if prefetchable { "pf" } else { "" })
            }
        };
    }
    log::info!("{}", line.as_str());
}

/// A fixed line buffer so a PCI line is one `log` record (no heap needed, no interleaving).
mod heapless_line {
    pub struct Line {
        buf: [u8; 512],
        len: usize,
    }
    impl Line {
        pub fn new() -> Self {
            Line { buf: [0; 512], len: 0 }
        }
        pub fn as_str(&self) -> &str {
            core::str::from_utf8(&self.buf[..self.len]).unwrap_or("<non-utf8>")
        }
    }
    impl core::fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let n = s.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
}

fn enumerate_pci(acpi: Option<&AcpiInfo>) -> (PciBus, PciAccess) {
    let regions = acpi.map_or(&[][..], |a| a.ecam());
    let mut bus = PciBus::new();
    let access = if regions.is_empty() {
        log::info!("pci: no MCFG, using configuration ports 0xCF8/0xCFC");
        bus.scan_segment(&LegacyPorts, 0, 0, 255);
        PciAccess::Ports(LegacyPorts)
    } else {
        let mut set = EcamSet::new();
        for r in regions {
            let buses = u64::from(r.end_bus - r.start_bus) + 1;
            let base = r.base + (u64::from(r.start_bus) << 20);
            if let Err(e) = memory::map_mmio(base, buses << 20) {
                fatal!("mapping ECAM {base:#x}: {e}");
            }
            log::info!("pci: ECAM at {base:#x} segment {} buses {}-{}", r.segment, r.start_bus, r.end_bus);
            // Both hold at most `acpi::MAX_ECAM` regions.
            let _ = set.push(Ecam { base, segment: r.segment, start_bus: r.start_bus, end_bus: r.end_bus });
        }
        for w in set.windows() {
            bus.scan_segment(&set, w.segment, w.start_bus, w.end_bus);
        }
        PciAccess::Ecam(set)
    };
    if bus.peer_roots() > 0 {
        use core::fmt::Write;
        let mut line = heapless_line::Line::new();
        let _ = write!(line, "pci: root buses");
        for r in bus.roots() {
            let _ = write!(line, " {:04x}:{:02x}", r.segment, r.bus);
        }
        let _ = write!(line, " ({} found by probing for peer host bridges)", bus.peer_roots());
        log::info!("{}", line.as_str());
    }
    for f in bus.functions() {
        log_function(f);
    }
    (bus, access)
}

/// Called by the boot assembly on the BSP, in long mode, on the boot stack.
#[unsafe(no_mangle)]
extern "C" fn kernel_entry64(magic: u32, info: u32) -> ! {
    // SAFETY: first code on the BSP; core index 0 (its APIC id is filled in once the APIC is known).
    unsafe { percpu::activate(0, 0) };
    serial::init();
    // SAFETY: written by `_start` before anything else; read once here.
    let entry_tsc = unsafe { super::mmio::read(&raw const boot::boot_entry_tsc) };
    let t_calib = time::Instant::now();
    let (tsc_hz, tsc_source) = tsc::calibrate();
    time::set_tsc_hz(tsc_hz, entry_tsc);
    logger::init(log::LevelFilter::Info);

    let t_bootinfo = time::Instant::now();
    let boot = match bootinfo::parse(magic, u64::from(info), &IdentityMem) {
        Ok(b) => BOOT.call_once(|| b),
        Err(e) => fatal!("boot information (magic {magic:#x} at {info:#x}): {e}"),
    };
    let config = config_from(boot);
    log::set_max_level(config.log);
    match config.console {
        Some(ConsoleChoice::Uart(u)) => {
            serial::select(Some(u), "console=");
            log::info!("console: {u} (console=)");
        }
        Some(ConsoleChoice::None) => serial::select(None, "console=none"),
        None => {} // the ACPI SPCR may name a port; decided once the tables are read
    }
    log::info!(
        "leasebox {} booting via {:?}; cmdline \"{}\"",
        env!("CARGO_PKG_VERSION"),
        boot.protocol,
        Redacted(boot.cmdline())
    );
    let (unknown, dropped) = config.unknown();
    for w in unknown {
        // Only the key: a mistyped secret option (`admn=HEX`) must not put its value in the log.
        let key = w.split_once('=').map_or(*w, |(k, _)| k);
        log::warn!("config: ignoring unknown option '{key}'");
    }
    if dropped > 0 {
        log::warn!("config: {dropped} more unknown options ignored");
    }
    log::info!("tsc: {}.{:03} MHz ({:?})", tsc_hz / 1_000_000, (tsc_hz / 1000) % 1000, tsc_source);

    let t_memory = time::Instant::now();
    init_frames(boot);
    // SAFETY: only the address of the linker symbol is taken.
    let guard = unsafe { &boot::boot_stack_guard as *const u8 as u64 };
    if let Err(e) = memory::guard_page(guard) {
        fatal!("the boot stack's guard page at {guard:#x}: {e}");
    }
    // The heap grows with the memory (the lease pool and DMA come from frames, not from the heap).
    let heap_bytes = crate::sizing::heap_bytes(boot.memory.usable_bytes());
    let (heap_base, heap_len) = memory::init_heap(heap_bytes).unwrap_or_else(|e| fatal!("{e}"));
    let ist = smp::alloc_ist(0).unwrap_or_else(|e| fatal!("BSP IST stacks: {e}"));
    // SAFETY: on the BSP, after activate; the IST stacks are this core's for good.
    unsafe { descriptors::load(0, ist) };
    {
        let f = FRAMES.lock();
        log::info!(
            "memory: {} MiB usable in {} regions; {} MiB free; heap {} KiB at {heap_base:#x}; image {:#x}..{:#x}",
            boot.memory.usable_bytes() >> 20,
            boot.memory.regions().len(),
            f.free_bytes() >> 20,
            heap_len >> 10,
            image_range().start,
            image_range().end
        );
    }

    let t_acpi = time::Instant::now();
    let acpi = find_acpi(boot).map(|a| ACPI.call_once(|| a));
    if config.console.is_none() {
        settle_console(acpi);
    }
    let lapic = match acpi.map(|_| Lapic::init()) {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            log::error!("lapic: {e}; running on one CPU");
            None
        }
        None => None,
    };
    let bsp_apic_id = lapic.map_or(0, |l| l.id());
    // SAFETY: still the BSP, re-recording its identity now that the APIC id is known.
    unsafe { percpu::activate(0, bsp_apic_id) };
    let t_pci = time::Instant::now();
    let (bus, access) = enumerate_pci(acpi);
    let pci = PCI.call_once(|| bus);
    let pci_access = PCI_ACCESS.call_once(|| access);
    if pci.truncated() {
        log::warn!("pci: more than {} functions; the rest are not listed", pci::MAX_FUNCTIONS);
    }

    let t_end = time::Instant::now();
    let us = |a: time::Instant, b: time::Instant| b.duration_since(a).as_micros();
    log::debug!(
        "boot: phases (us) entry->calibrate {} calibrate {} bootinfo+config {} memory+descriptors {} acpi+apic {} pci {}",
        us(time::Instant::from_ticks(entry_tsc), t_calib),
        us(t_calib, t_bootinfo),
        us(t_bootinfo, t_memory),
        us(t_memory, t_acpi),
        us(t_acpi, t_pci),
        us(t_pci, t_end)
    );
    let platform = Platform { boot, config, acpi, pci, pci_access, lapic, bsp_apic_id, entry_tsc, tsc_hz, tsc_source };
    // SAFETY: `leasebox_main` is defined by the image with exactly this signature.
    unsafe { leasebox_main(platform) }
}
