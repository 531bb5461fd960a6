//! The lease service in the image: its host (DMA and scrubbing through the kernel's mlx5 platform), its
//! environment (TSC clock, the `test=` hook) and its construction from the command line's options.

use alloc::string::String;
use spin::Once;

use crate::hca_platform::KernelHca;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use leasebox_kernel::config::Options;
use leasebox_kernel::config::TestHook;
use leasebox_kernel::time::Instant;
use leasebox_lease::backend::{Environment, LeaseBackend};
use leasebox_lease::setup::PlatformHost;
use leasebox_lease::{Config, LeaseOptions, LeaseService};
use leasebox_proto::Request;

/// The lease service's options (`lease_pool_mib=`, ...), filled in by the kernel's configuration parser
/// (registered in `main.rs`).
pub static OPTIONS: Options<'static, LeaseOptions> = Options::new(LeaseOptions::DEFAULT, LeaseOptions::apply);

/// DMA and scrubbing through the kernel's mlx5 platform.
pub type KernelHost = PlatformHost<KernelHca>;

pub struct KernelEnv;

/// `test=panic-after-lease`: armed at boot; a READY makes the next lease request panic.
static PANIC_AFTER_LEASE: AtomicBool = AtomicBool::new(false);
static LEASE_READY: AtomicBool = AtomicBool::new(false);

/// Arms the `test=` hooks that live in the lease service's path (called before the control service is built).
pub fn arm_test(hook: Option<TestHook>) {
    PANIC_AFTER_LEASE.store(hook == Some(TestHook::PanicAfterLease), Ordering::SeqCst);
}

impl Environment for KernelEnv {
    fn request_seen(&mut self, req: &Request) {
        if !PANIC_AFTER_LEASE.load(Ordering::Relaxed) {
            return;
        }
        if matches!(req, Request::Ready { .. }) {
            LEASE_READY.store(true, Ordering::SeqCst);
        } else if LEASE_READY.load(Ordering::SeqCst) {
            panic!("test=panic-after-lease: deliberate panic with a live lease");
        }
    }
    fn now_us(&self) -> u64 {
        Instant::now().since_boot().as_micros() as u64
    }
    fn pool_progress(&mut self, total_bytes: u64, unprepared_bytes: u64) {
        POOL_BYTES.store(total_bytes, Ordering::Relaxed);
        POOL_UNPREPARED.store(unprepared_bytes, Ordering::Relaxed);
    }
}

/// The pool's size and the part still being prepared, as of the service's last tick (for the ready line).
static POOL_BYTES: AtomicU64 = AtomicU64::new(0);
/// The lease service's slots (the ready line's `slots=`).
static SLOTS: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
/// The ready line's grant and revoke paths (`Paths::bits`).
static PATHS: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);
static POOL_UNPREPARED: AtomicU64 = AtomicU64::new(0);

pub type ImageBackend = LeaseBackend<KernelHost, KernelEnv>;

/// The lease service's transition ring, for the panic dump ([`dump_transitions`]).
static TRANSITIONS: Once<leasebox_lease::transitions::SharedTransitions> = Once::new();

/// Transitions the panic dump prints.
const DUMP_TRANSITIONS: usize = 32;

/// The fatal-path dump (beside the command ring's, `hca::dump_commands`): the newest lease transitions, oldest
/// first, if the ring is not locked by another core at that moment (only tried: a panic never waits on it).
pub fn dump_transitions() {
    let say = leasebox_kernel::arch::serial::write_unlocked;
    let Some(ring) = TRANSITIONS.get() else { return };
    let Some(t) = ring.try_lock() else {
        say(format_args!("lease: transition ring busy; not dumped\n"));
        return;
    };
    say(format_args!("lease: last transitions (next #{}):\n", t.next_seq()));
    let from = t.next_seq().saturating_sub(DUMP_TRANSITIONS as u64).max(1);
    t.read(from, DUMP_TRANSITIONS, |r| say(format_args!("lease:   {r}\n")));
}

/// Whether the lease service runs, or why not; set once, when the control service is built.
static STATE: Once<Result<(), String>> = Once::new();

/// The backend, when the HCA is up with its pool and its client is still unclaimed; otherwise why the lease
/// service cannot start. Either way the outcome is kept for the ready line ([`ready_field`]).
pub fn backend(o: &LeaseOptions) -> Result<ImageBackend, String> {
    let made = make_backend(o);
    STATE.call_once(|| made.as_ref().map(|_| ()).map_err(Clone::clone));
    made
}

fn make_backend(o: &LeaseOptions) -> Result<ImageBackend, String> {
    let (parts, platform) = crate::hca::leases().map_err(String::from)?;
    let client = crate::hca::CLIENT.lock().take().ok_or("the HCA's command client is already taken")?;
    // Initial PSNs and MKEY variants from a CSPRNG seeded by RDSEED/RDRAND, as the nonces are. There is no
    // fallback seed: without a hardware random source the lease service does not start.
    let rng = leasebox_lease::setup::identifiers(&mut crate::control::CpuEntropy)?;
    let cfg = Config::from_options(o, parts);
    if let Some(w) = leasebox_lease::setup::fence_test_warning(o) {
        log::warn!("lease: {w}");
    }
    let svc = LeaseService::new(cfg, parts.hca, rng).map_err(|e| alloc::format!("lease configuration: {e}"))?;
    SLOTS.store(svc.config().slots, Ordering::Relaxed);
    PATHS.store(svc.paths().bits(), Ordering::Relaxed);
    TRANSITIONS.call_once(|| svc.transitions());
    KernelEnv.pool_progress(svc.pool().total_bytes(), svc.pool().unprepared_bytes());
    Ok(LeaseBackend::new(
        svc,
        client,
        PlatformHost::new(platform.clone(), parts.extents.clone()).with_resolver(crate::eth::neighbour),
        KernelEnv,
    ))
}

/// The ready line's lease field: `lease=on pool_mib=T pool_ready_mib=R slots=S grant=umr|commands
/// revoke=umr|commands` (the paths: docs/revoke-semantics.md, "The UMR path"; S: the lease slots, from
/// `lease_slots=` or the HCA's caps and the pool; R: the part of the pool prepared so
/// far; the rest is prepared in the background and `lease: pool ready` is logged when it is whole), or
/// `lease=off lease_error="<why>"`.
pub fn ready_field() -> impl core::fmt::Display {
    struct Field(Option<&'static str>);
    impl core::fmt::Display for Field {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            match self.0 {
                None => {
                    let (total, unprepared) =
                        (POOL_BYTES.load(Ordering::Relaxed), POOL_UNPREPARED.load(Ordering::Relaxed));
                    write!(
                        f,
                        "lease=on pool_mib={} pool_ready_mib={} slots={} {}",
                        total >> 20,
                        total.saturating_sub(unprepared) >> 20,
                        SLOTS.load(Ordering::Relaxed),
                        leasebox_lease::Paths::from_bits(PATHS.load(Ordering::Relaxed)).directions()
                    )
                }
                Some(why) => write!(f, "lease=off lease_error=\"{}\"", why.replace('"', "'")),
            }
        }
    }
    Field(match STATE.get() {
        Some(Ok(())) => None,
        Some(Err(e)) => Some(e.as_str()),
        None => Some("the control service was not built"),
    })
}
