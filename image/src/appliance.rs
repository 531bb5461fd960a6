//! Role wiring and the ready line.

use crate::hca;
use crate::net::{self, NetStack};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;
use leasebox_kernel::arch::percpu::{self, MAX_CPUS};
use leasebox_kernel::arch::start::{Platform, boot_error};
use leasebox_kernel::arch::{cpu, smp};
use leasebox_kernel::bootinfo::RegionKind;
use leasebox_kernel::config::{CoreLayout, Role, RoleSet, TestHook};
use leasebox_kernel::println;
use leasebox_kernel::time::{Deadline, Instant, ticks_to_duration, wait_until};
use leasebox_kernel::watchdog::Watchdog;
use spin::{Mutex, Once};

/// Each core's roles, fixed before any AP starts.
static LAYOUT: Once<CoreLayout> = Once::new();
/// The network stack, built on the BSP and taken by the core that runs the `net` role.
static NET: Mutex<Option<NetStack>> = Mutex::new(None);
/// How long the ready line waits for an address (DHCP); after that it says `ip=none` and DHCP goes on.
const ADDRESS_WAIT: Duration = Duration::from_secs(10);
/// Iterations of each role's loop, per core (reported by STATS).
static ITERATIONS: [[AtomicU64; Role::ALL.len()]; MAX_CPUS] =
    [const { [const { AtomicU64::new(0) }; Role::ALL.len()] }; MAX_CPUS];
static REPORTED: AtomicUsize = AtomicUsize::new(0);
/// Cores running their role loop (the watchdog watches only these).
static ONLINE: [AtomicBool; MAX_CPUS] = [const { AtomicBool::new(false) }; MAX_CPUS];
/// The watchdog's patience (`watchdog_ms=`), in nanoseconds; 0: off.
static WATCHDOG_NS: AtomicU64 = AtomicU64::new(0);
/// How often a core looks at the others' loop counts.
const WATCH_PERIOD: Duration = Duration::from_millis(250);

/// Passes of `core`'s role loop so far (the sum over its roles).
fn passes(core: usize) -> u64 {
    ITERATIONS[core].iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// (core, role, iterations) for every role a core runs, for STATS.
pub fn role_counts() -> Vec<(u16, u8, u64)> {
    let Some(layout) = LAYOUT.get() else { return Vec::new() };
    let mut v = Vec::new();
    for (core, set) in layout.cores().iter().enumerate() {
        for r in set.iter() {
            v.push((core as u16, r as u8, ITERATIONS[core][r as usize].load(Ordering::Relaxed)));
        }
    }
    v
}

fn roles_of(core: usize) -> RoleSet {
    LAYOUT.get().and_then(|l| l.cores().get(core).copied()).unwrap_or_default()
}

fn report_in(core: usize) {
    log::info!("smp: cpu {core} online apic={} role={}", apic_of(core), roles_of(core));
    REPORTED.fetch_add(1, Ordering::SeqCst);
}

fn apic_of(core: usize) -> u32 {
    let b = percpu::block(core);
    // SAFETY: `b` points into the static per-CPU table; `apic_id` was written by `activate` on that core
    // before it reported in, and is never written again.
    unsafe { leasebox_kernel::arch::mmio::read(core::ptr::addr_of!((*b).apic_id)) }
}

/// Runs a core's roles round-robin, one non-blocking step each per pass: `net` drives the control channel,
/// `cmd` the mlx5 command engine, `event` the mlx5 event engine (EQ, CQs, health). Core 0 also prints the
/// ready line when due.
fn run_roles(core: usize, mut ready: Option<Ready>) -> ! {
    let set = roles_of(core);
    let mut net = if set.contains(Role::Net) { NET.lock().take() } else { None };
    let mut cmd = if set.contains(Role::Cmd) { hca::CMD_ENGINE.lock().take() } else { None };
    let mut event = if set.contains(Role::Event) { hca::EVENT_ENGINE.lock().take() } else { None };
    // Every core watches the others (docs/architecture.md, "Cores and roles"): a loop that stands still for
    // `watchdog_ms=` is stuck, and this core panics so the fatal path fails closed.
    let mut dog = Watchdog::<MAX_CPUS>::new(WATCHDOG_NS.load(Ordering::Relaxed));
    let mut next_watch = Deadline::after(WATCH_PERIOD);
    ONLINE[core].store(true, Ordering::SeqCst);
    loop {
        for r in set.iter() {
            match r {
                Role::Net => {
                    if let Some(n) = net.as_mut() {
                        n.step();
                    }
                }
                Role::Cmd => {
                    if let Some(e) = cmd.as_mut() {
                        e.poll();
                    }
                }
                Role::Event => {
                    if let Some(e) = event.as_mut() {
                        e.poll();
                    }
                }
                Role::Idle => {}
            }
            ITERATIONS[core][r as usize].fetch_add(1, Ordering::Relaxed);
        }
        if next_watch.expired() {
            next_watch = Deadline::after(WATCH_PERIOD);
            let now = Instant::now().since_boot().as_nanos() as u64;
            let seen = |c: usize| (c != core && ONLINE[c].load(Ordering::SeqCst)).then(|| passes(c));
            if let Some(s) = dog.check(now, seen) {
                panic!(
                    "watchdog: core {} (roles {}) made no progress for {} ms",
                    s.core,
                    roles_of(s.core),
                    s.for_ns / 1_000_000
                );
            }
        }
        if ready.as_ref().is_some_and(Ready::due)
            && let Some(r) = ready.take()
        {
            r.announce();
        }
        cpu::relax();
    }
}

fn ap_main(core: usize) -> ! {
    report_in(core);
    run_roles(core, None)
}

/// The ready line, waiting for the control channel's address (with a deadline).
struct Ready {
    deadline: Deadline,
    cores: usize,
    mem_mib: u64,
    pci: usize,
    ap_time: Duration,
    entry: Duration,
    port: u16,
    nic: net::Choice,
    hca: hca::Status,
    test: Option<TestHook>,
}

impl Ready {
    fn due(&self) -> bool {
        net::status() != net::Status::Waiting || self.deadline.expired()
    }

    /// Prints the line, then runs the `test=` hook.
    fn announce(self) {
        let (size, used) = leasebox_kernel::arch::boot::boot_stack_usage();
        log::info!("boot stack: {} of {} KiB used so far", used.div_ceil(1024), size / 1024);
        let status = net::status();
        if status == net::Status::Waiting {
            log::warn!("net: no address after {}s; still asking (DHCP)", ADDRESS_WAIT.as_secs());
        }
        let ip = match status {
            net::Status::Up(a) => IpField(Some(a)),
            _ => IpField(None),
        };
        println!(
            "leasebox: ready cores={} mem_mib={} pci={} boot_ms={} ap_ms={} entry_ms={} ip={ip} ctl_port={} sessions={} {} {} {}",
            self.cores,
            self.mem_mib,
            self.pci,
            ms(Instant::now().since_boot()),
            ms(self.ap_time),
            ms(self.entry),
            self.port,
            crate::control::sessions_in_force(),
            self.nic,
            self.hca,
            crate::lease::ready_field(),
        );
        match self.test {
            Some(TestHook::PageFault) => {
                // Canonical but far above anything mapped (the identity map ends with RAM).
                let bad = 0x1234_5678_9000u64 as *const u64;
                // SAFETY: deliberately unsound: this address is unmapped, and the resulting page fault is the
                // test (`test=pagefault`). The exception handler never returns.
                let v = unsafe { leasebox_kernel::arch::mmio::read(bad) };
                log::error!("test=pagefault: read {v:#x} from an unmapped address without a fault");
            }
            Some(TestHook::Panic) => panic!("test=panic: deliberate panic"),
            Some(TestHook::Stall) => {
                log::warn!("test=stall: core 0 leaves its role loop for good");
                loop {
                    cpu::relax();
                }
            }
            // Armed in the lease service's path (`crate::lease::arm_test`): panics on a request, not here.
            Some(TestHook::PanicAfterLease) | None => {}
        }
    }
}

struct IpField(Option<core::net::Ipv4Addr>);

impl core::fmt::Display for IpField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("none"),
        }
    }
}

fn ms(d: Duration) -> impl core::fmt::Display {
    struct Ms(u128);
    impl core::fmt::Display for Ms {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
        }
    }
    Ms(d.as_micros())
}

/// Cores the default layout gives a role: `net`, `cmd`, `event` (docs/operations.md, "Roles").
const ROLE_CORES: usize = 3;

#[unsafe(no_mangle)]
fn leasebox_main(p: Platform) -> ! {
    // CPUs: the BSP first, then the enabled MADT entries (the kernel keeps the first `acpi::MAX_CPUS`), capped
    // at the per-CPU table's size. Only the cores the layout gives a role are started: by default the role
    // cores (`CoreLayout::default_for`, at most three), with `cores=` as many as it names. The others are never
    // sent INIT/SIPI and stay parked in the firmware's wait-for-SIPI state, costing nothing.
    let mut aps = [(0usize, 0u32); MAX_CPUS];
    let mut n_aps = 0;
    if let (Some(acpi), Some(_)) = (p.acpi, p.lapic) {
        for c in acpi.cpus().iter().filter(|c| c.enabled && c.apic_id != p.bsp_apic_id) {
            if n_aps + 1 >= MAX_CPUS {
                log::warn!("smp: more than {MAX_CPUS} CPUs; the rest stay parked");
                break;
            }
            n_aps += 1;
            aps[n_aps - 1] = (n_aps, c.apic_id);
        }
    }
    let available = n_aps + 1;
    let layout = match p.config.cores {
        Some(l) if l.cores().len() > available => {
            boot_error(format_args!("cores= names {} cores but this machine has {available} CPU(s)", l.cores().len()))
        }
        Some(l) => l,
        None => CoreLayout::default_for(available.min(ROLE_CORES)),
    };
    let cpus = layout.cores().len();
    n_aps = cpus.saturating_sub(1);
    if available > cpus {
        log::info!(
            "smp: {cpus} of {available} CPUs started; {} without a role stay parked (cores= names more)",
            available - cpus
        );
    }
    LAYOUT.call_once(|| layout);
    WATCHDOG_NS.store(u64::from(p.config.watchdog_ms) * 1_000_000, Ordering::Relaxed);
    report_in(0);

    // The control channel comes up before the other cores start: opening the device maps its BARs, and new
    // mappings are not shot down on other cores.
    // The HCA first (bring-up maps its BAR and runs on this core before the engines move to theirs), then the
    // control channel, whose service is the lease service on top of it.
    let nic = net::choose(&p);
    let hca = hca::init(&p, nic == net::Choice::Mlx5);
    crate::lease::arm_test(p.config.test);
    let service = crate::control::service(&p, Instant::now().since_boot().as_millis() as u64);
    *NET.lock() = net::init(&p, nic, service);

    let ap_start = Instant::now();
    if let Some(lapic) = p.lapic.as_ref()
        && n_aps > 0
        && let Err(e) = smp::start_aps(lapic, &aps[..n_aps], ap_main)
    {
        log::error!("smp: {e}");
    }
    let all_in = wait_until(Deadline::after(Duration::from_secs(2)), || REPORTED.load(Ordering::SeqCst) == cpus);
    let ap_time = ap_start.elapsed();
    let online = REPORTED.load(Ordering::SeqCst);
    if !all_in {
        log::error!("smp: only {online} of {cpus} CPUs reported in");
    }

    let mem_mib =
        p.boot.memory.regions().iter().filter(|r| r.kind == RegionKind::Usable).map(|r| r.len).sum::<u64>() >> 20;
    let ready = Ready {
        deadline: Deadline::after(ADDRESS_WAIT),
        cores: online,
        mem_mib,
        pci: p.pci.functions().len(),
        ap_time,
        entry: ticks_to_duration(p.entry_tsc, p.tsc_hz),
        port: p.config.net.port,
        nic,
        hca,
        test: p.config.test,
    };
    run_roles(0, Some(ready))
}
