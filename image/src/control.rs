//! The control service behind the network loop: the session core (`app/session`, protocol v2) over the lease
//! service (`app/lease`, through `crate::lease`) when the HCA is up, and the image's own facts
//! ([`ImageAppliance`]: role counts, the HCA's state and counters, RDSEED/RDRAND for handshake keys), with the
//! principals and budgets of the session's options. When the lease service cannot start (no HCA, no memory for
//! the pool), lease operations answer NOT_IMPLEMENTED with the reason and HEALTH says why.

use crate::service::{ConnId, StreamService};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use leasebox_kernel::arch::memory;
use leasebox_kernel::arch::rng;
use leasebox_kernel::arch::start::Platform;
use leasebox_proto::{HcaState, HcaStats};
use leasebox_session::{
    Appliance, Budget, Entropy, EntropyError, HeapUse, Keyring, Leases, Limits, NoLeases, Server, SessionOptions,
};

/// Nonces from the CPU; no predictable fallback exists.
pub(crate) struct CpuEntropy;

impl Entropy for CpuEntropy {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        rng::fill(buf).map_err(|_| EntropyError)
    }
}

/// What the image knows of itself, for the session core: its cores' role loops, its HCA (`crate::hca`), and
/// RDSEED/RDRAND.
pub(crate) struct ImageAppliance;

impl Entropy for ImageAppliance {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        CpuEntropy.fill(buf)
    }
}

impl Appliance for ImageAppliance {
    fn role_counts(&self) -> Vec<(u16, u8, u64)> {
        crate::appliance::role_counts()
    }
    fn hca(&self) -> (HcaState, String) {
        crate::hca::health()
    }
    fn hca_stats(&self) -> Option<HcaStats> {
        crate::hca::stats()
    }
}

/// The session core's options (`tenant=`, `admin=`, `sessions=`, ...), as the configuration gave them.
fn options() -> SessionOptions<'static> {
    crate::SESSION_OPTIONS.get()
}

/// Each socket's receive and transmit buffer at most; the sockets' share of memory may make them smaller
/// ([`socket_buf`]).
pub const SOCKET_BUF_MAX: usize = 64 * 1024;
/// The smallest socket buffer: a request or an answer of the usual size still fits in one window.
pub const SOCKET_BUF_MIN: usize = 8 * 1024;
/// The socket buffers together take at most one part in this many of usable memory ([`socket_buf`]).
const SOCKET_SHARE: u64 = 8;
/// A budget sized from memory counts one part in this many of usable memory for its places' socket buffers, at
/// [`SOCKET_BUF_MAX`] each way (half the sockets' share: the unauthenticated pool's sockets and slack).
const SESSION_SOCKET_SHARE: u64 = 16;

/// The session budget in force, for the ready line (`sessions=`; 0 until the service is built).
static SESSIONS: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// The session budget the control service runs with (the ready line's `sessions=`).
pub fn sessions_in_force() -> u32 {
    SESSIONS.load(core::sync::atomic::Ordering::Relaxed)
}

/// The machine's usable memory in bytes (the memory map's).
fn usable(p: &Platform) -> u64 {
    p.boot.memory.usable_bytes()
}

/// The session budget: `sessions=`, or what the heap and the memory for socket buffers afford
/// (`leasebox_session::scale::default_sessions`; docs/operations.md, "Scale").
pub fn sessions(p: &Platform) -> usize {
    let sized = leasebox_session::scale::default_sessions(
        heap().size as u64,
        usable(p) / SESSION_SOCKET_SHARE,
        2 * SOCKET_BUF_MAX as u64,
    );
    options().sessions_or(sized) as usize
}

/// Each socket's buffer (each way): [`SOCKET_BUF_MAX`], halved until [`sockets`] × 2 of them fit in an eighth of
/// usable memory, but never below [`SOCKET_BUF_MIN`].
pub fn socket_buf(p: &Platform) -> usize {
    let buffers = 2 * sockets(p) as u64;
    leasebox_session::scale::buffer_size(buffers, usable(p) / SOCKET_SHARE, SOCKET_BUF_MIN, SOCKET_BUF_MAX)
}

/// The admission budgets the options give (`sessions=` or its computed default, `sessions_per_tenant=`,
/// `admin_sessions=`, `preauth_sessions=`, `heap_high_water=`): also how many listening sockets the network
/// loop needs ([`sockets`]).
pub fn budget(p: &Platform) -> Budget {
    let c = options();
    Budget::from_options(
        sessions(p),
        c.sessions_per_tenant.map(|n| n as usize),
        c.admin_sessions.map(|n| n as usize),
        c.preauth_sessions.map(|n| n as usize),
        c.heap_high_water.map(|n| n as u8),
    )
}

/// Listening sockets for the control port: one per session place and per unauthenticated place, and one more
/// so a connection past the budget still hears BUSY.
pub fn sockets(p: &Platform) -> usize {
    let b = budget(p);
    b.sessions + b.preauth + 1
}

/// The kernel heap's use, for the memory budget.
fn heap() -> HeapUse {
    let (used, free) = memory::heap_usage();
    HeapUse { used, size: used + free }
}

/// The session core with the budgets and the heap gauge.
fn control<L: Leases + Send + 'static>(
    mut server: Server<L, ImageAppliance>,
    budget: Budget,
    appliance: Option<&str>,
) -> Box<dyn StreamService + Send> {
    server.set_budget(budget);
    if let Some(name) = appliance {
        log::info!("control: appliance name '{name}' (clients name it: TENANT@{name})");
        server.set_appliance_name(name);
    }
    server.set_memory_gauge(Box::new(heap));
    let h = heap();
    log::info!(
        "control: budgets: {} per tenant, {} for the admin alone, {} unauthenticated; heap {} of {} KiB in use, \
         new work refused above {} %",
        budget.per_tenant,
        budget.admin_reserved,
        budget.preauth,
        h.used >> 10,
        h.size >> 10,
        budget.heap_high_water_pct
    );
    Box::new(server)
}

/// The network loop drives the session core itself: nothing stands between them.
impl<L: Leases, A: Appliance> StreamService for Server<L, A> {
    fn open(&mut self, conn: ConnId, peer: Option<core::net::IpAddr>, now_ms: u64) -> bool {
        match peer {
            Some(ip) => self.open_from(conn, leasebox_session::Source::ip(ip), now_ms),
            None => Server::open(self, conn, now_ms),
        }
    }
    fn input(&mut self, conn: ConnId, data: &[u8], now_ms: u64) {
        Server::input(self, conn, data, now_ms)
    }
    fn output(&mut self, conn: ConnId, buf: &mut [u8]) -> usize {
        Server::output(self, conn, buf)
    }
    fn wants_close(&self, conn: ConnId) -> bool {
        Server::wants_close(self, conn)
    }
    fn closed(&mut self, conn: ConnId, now_ms: u64) {
        Server::closed(self, conn, now_ms)
    }
    fn tick(&mut self, now_ms: u64) {
        Server::tick(self, now_ms)
    }
}

/// What serves the port when the control service cannot start: every connection is closed at once.
struct Unavailable;

impl StreamService for Unavailable {
    fn open(&mut self, _: ConnId, _: Option<core::net::IpAddr>, _: u64) -> bool {
        false
    }
    fn input(&mut self, _: ConnId, _: &[u8], _: u64) {}
    fn output(&mut self, _: ConnId, _: &mut [u8]) -> usize {
        0
    }
    fn wants_close(&self, _: ConnId) -> bool {
        true
    }
    fn closed(&mut self, _: ConnId, _: u64) {}
    fn tick(&mut self, _: u64) {}
}

fn keyring(c: &SessionOptions<'_>) -> Result<Keyring, String> {
    let mut keys = Keyring::new();
    for (name, hex) in c.tenants() {
        keys.add_tenant(name, hex).map_err(|e| alloc::format!("tenant={name}: {e}"))?;
    }
    if let Some(hex) = c.admin_key_hex() {
        keys.set_admin(hex).map_err(|e| alloc::format!("admin=: {e}"))?;
    }
    Ok(keys)
}

/// The service for the control port: the session core over the lease service (or, when it cannot start,
/// [`NoLeases`], which answers lease operations with the reason) and the image's facts, or [`Unavailable`] with
/// the reason logged.
pub fn service(p: &Platform, now_ms: u64) -> Box<dyn StreamService + Send> {
    let c = options();
    let limits = Limits { sessions: sessions(p), credits: c.credits as u16, heartbeat_ms: c.heartbeat_ms };
    SESSIONS.store(limits.sessions as u32, core::sync::atomic::Ordering::Relaxed);
    let keys = match keyring(&c) {
        Ok(k) => k,
        Err(e) => return unavailable(&e),
    };
    let announce = |what: &str| {
        log::info!(
            "control: {} principal(s), {} sessions ({}), {} credits, heartbeat {} ms, protocol v2, keys from {}, {what}",
            c.tenants().len() + usize::from(c.admin_key_hex().is_some()),
            limits.sessions,
            if c.sessions.is_some() { "sessions=" } else { "sized from memory" },
            limits.credits,
            limits.heartbeat_ms,
            rng::source().unwrap_or("?")
        )
    };
    let budget = budget(p);
    // The pool's fair shares divide it among the configured tenants (docs/security.md, "Fair shares").
    let lease = leasebox_lease::LeaseOptions { tenants: c.tenants().len() as u32, ..crate::lease::OPTIONS.get() };
    match crate::lease::backend(&lease) {
        Ok(backend) => match Server::new(limits, keys, backend, ImageAppliance, now_ms) {
            Ok(server) => {
                announce("lease service on");
                control(server, budget, c.appliance)
            }
            Err(e) => unavailable(&alloc::format!("{e}")),
        },
        Err(why) => {
            log::error!("lease: service off: {why}");
            announce("lease service off");
            match Server::new(limits, keys, NoLeases::off(why), ImageAppliance, now_ms) {
                Ok(server) => control(server, budget, c.appliance),
                Err(e) => unavailable(&alloc::format!("{e}")),
            }
        }
    }
}

fn unavailable(e: &str) -> Box<dyn StreamService + Send> {
    log::error!("control: service not started: {e}; connections to the control port are closed");
    Box::new(Unavailable)
}
