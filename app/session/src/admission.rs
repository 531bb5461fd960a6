//! Admission: who may hold a place, so that nobody can hog the control service (docs/operations.md,
//! "Budgets").
//!
//! - Unauthenticated connections live in their own small pool (`preauth_sessions=`): when it is full a new
//!   connection is refused BUSY, and sessions that have authenticated are not affected. An unauthenticated
//!   connection leaves the pool when HELLO completes, when it fails, or at the HELLO deadline.
//! - Authenticated sessions share the session budget (`sessions=`); a tenant may hold at most
//!   `sessions_per_tenant=` of them, and tenants together never take the last `admin_sessions=` places, so the
//!   admin still gets in when tenants hold all theirs. A session over its budget is refused BUSY at the end of
//!   HELLO (the key was right; there is no place).
//! - A global memory budget: above the high-water mark of the heap ([`MemoryGauge`]), new connections, new
//!   sessions and ALLOCs are refused BUSY, so network load cannot exhaust the heap (whose exhaustion is fatal).

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::string::String;
use leasebox_proto::Role;

/// The pool for unauthenticated connections when `preauth_sessions=` is not given (at most `sessions=`).
pub const DEFAULT_PREAUTH: usize = 8;
/// The places reserved for the admin when `admin_sessions=` is not given (none when `sessions=1`).
pub const DEFAULT_ADMIN_RESERVED: usize = 1;
/// The heap high-water mark in percent of the heap when none is given: above it, new work is refused.
pub const DEFAULT_HEAP_HIGH_WATER_PCT: u8 = 85;

/// Heap use as the allocator counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapUse {
    pub used: usize,
    pub size: usize,
}

/// Reads the heap's use: the kernel allocator's counters in the appliance, a fake in tests.
pub type MemoryGauge = Box<dyn Fn() -> HeapUse + Send>;

/// The admission budgets (docs/operations.md: `sessions=`, `sessions_per_tenant=`, `admin_sessions=`,
/// `preauth_sessions=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Authenticated sessions, admin's included.
    pub sessions: usize,
    /// The most sessions one tenant may hold.
    pub per_tenant: usize,
    /// Places of `sessions` that only the admin may take.
    pub admin_reserved: usize,
    /// Unauthenticated connections at once.
    pub preauth: usize,
    /// Refuse new work when the heap is fuller than this, in percent (1 to 100).
    pub heap_high_water_pct: u8,
}

impl Budget {
    /// The defaults for a session budget of `sessions`: one place for the admin, the rest open to any one
    /// tenant, and a pre-authentication pool of [`DEFAULT_PREAUTH`] (no larger than the budget).
    pub fn for_sessions(sessions: usize) -> Budget {
        let admin_reserved = if sessions > 1 { DEFAULT_ADMIN_RESERVED } else { 0 };
        Budget {
            sessions,
            per_tenant: sessions - admin_reserved,
            admin_reserved,
            preauth: DEFAULT_PREAUTH.min(sessions).max(1),
            heap_high_water_pct: DEFAULT_HEAP_HIGH_WATER_PCT,
        }
    }

    /// The budgets the options give (`sessions_per_tenant=`, `admin_sessions=`, `preauth_sessions=`,
    /// `heap_high_water=`; `None`: the default of [`Budget::for_sessions`]). A tenant cap above the places
    /// tenants may hold has the effect of the latter.
    pub fn from_options(
        sessions: usize,
        per_tenant: Option<usize>,
        admin_reserved: Option<usize>,
        preauth: Option<usize>,
        heap_high_water_pct: Option<u8>,
    ) -> Budget {
        let d = Budget::for_sessions(sessions);
        let admin_reserved = admin_reserved.unwrap_or(d.admin_reserved).min(sessions.saturating_sub(1));
        Budget {
            sessions,
            per_tenant: per_tenant.unwrap_or(sessions - admin_reserved),
            admin_reserved,
            preauth: preauth.unwrap_or(d.preauth),
            heap_high_water_pct: heap_high_water_pct.unwrap_or(d.heap_high_water_pct),
        }
    }

    /// Places tenants together may hold.
    pub fn tenant_places(&self) -> usize {
        self.sessions.saturating_sub(self.admin_reserved)
    }
}

/// Why a place was refused (each answers BUSY, with this as the message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The unauthenticated pool is full.
    PreauthFull(usize),
    /// Every session place is taken.
    SessionsFull(usize),
    /// Tenants hold every place not reserved for the admin.
    AdminReserve(usize),
    /// This tenant holds its cap.
    TenantCap(usize),
    /// The heap is above its high-water mark.
    Memory(HeapUse),
}

impl Refusal {
    /// The error frame's detail words.
    pub fn detail(&self) -> [u32; 3] {
        let w = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        match *self {
            Refusal::PreauthFull(n) => [w(n), 1, 0],
            Refusal::SessionsFull(n) => [w(n), 2, 0],
            Refusal::AdminReserve(n) => [w(n), 3, 0],
            Refusal::TenantCap(n) => [w(n), 4, 0],
            Refusal::Memory(h) => [w(h.used >> 10), 5, w(h.size >> 10)],
        }
    }
}

impl core::fmt::Display for Refusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Refusal::PreauthFull(n) => write!(f, "all {n} places for unauthenticated connections are in use"),
            Refusal::SessionsFull(n) => write!(f, "all {n} sessions are in use"),
            Refusal::AdminReserve(n) => write!(f, "tenants hold all {n} places not reserved for the admin"),
            Refusal::TenantCap(n) => write!(f, "this tenant holds its {n} sessions"),
            Refusal::Memory(h) => {
                write!(f, "out of memory budget (heap {} of {} KiB in use)", h.used >> 10, h.size >> 10)
            }
        }
    }
}

/// A principal's session figures (its part of STATS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrincipalSessions {
    pub current: usize,
    pub total: u64,
    pub refused: u64,
}

/// Places held: counts kept in step with the server's connections.
pub struct Admission {
    budget: Budget,
    preauth: usize,
    sessions: usize,
    by_name: BTreeMap<String, PrincipalSessions>,
    gauge: Option<MemoryGauge>,
    /// Refusals for memory since start.
    pub memory_refusals: u64,
}

impl Admission {
    pub fn new(budget: Budget) -> Admission {
        Admission { budget, preauth: 0, sessions: 0, by_name: BTreeMap::new(), gauge: None, memory_refusals: 0 }
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// New budgets; places already held are kept (the counts go on).
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = budget;
    }

    pub fn set_gauge(&mut self, gauge: MemoryGauge) {
        self.gauge = Some(gauge);
    }

    /// Unauthenticated connections now.
    pub fn preauth(&self) -> usize {
        self.preauth
    }

    /// Authenticated sessions now.
    pub fn sessions(&self) -> usize {
        self.sessions
    }

    /// `name`'s figures.
    pub fn principal(&self, name: &str) -> PrincipalSessions {
        self.by_name.get(name).copied().unwrap_or_default()
    }

    /// `Err` when the heap is above the high-water mark.
    pub fn memory(&mut self) -> Result<(), Refusal> {
        let Some(g) = &self.gauge else { return Ok(()) };
        let h = g();
        let limit = h.size / 100 * usize::from(self.budget.heap_high_water_pct);
        if h.used > limit {
            self.memory_refusals += 1;
            return Err(Refusal::Memory(h));
        }
        Ok(())
    }

    /// A new transport connection: takes a place in the unauthenticated pool.
    pub fn connect(&mut self) -> Result<(), Refusal> {
        if self.preauth >= self.budget.preauth {
            return Err(Refusal::PreauthFull(self.budget.preauth));
        }
        self.memory()?;
        self.preauth += 1;
        Ok(())
    }

    /// HELLO proved `name` (`role`): moves its connection from the unauthenticated pool to a session place,
    /// or refuses (the connection then closes and its pool place is given back by [`Admission::disconnect`]).
    pub fn authenticate(&mut self, name: &str, role: Role) -> Result<(), Refusal> {
        let b = self.budget;
        let mine = self.principal(name).current;
        let refusal = if self.sessions >= b.sessions {
            Some(Refusal::SessionsFull(b.sessions))
        } else if role != Role::Admin && self.tenant_sessions() >= b.tenant_places() {
            Some(Refusal::AdminReserve(b.tenant_places()))
        } else if role != Role::Admin && mine >= b.per_tenant {
            Some(Refusal::TenantCap(b.per_tenant))
        } else {
            None
        };
        let refusal = match refusal {
            Some(r) => Some(r),
            None => self.memory().err(),
        };
        if let Some(r) = refusal {
            self.by_name.entry(String::from(name)).or_default().refused += 1;
            return Err(r);
        }
        self.preauth = self.preauth.saturating_sub(1);
        self.sessions += 1;
        let p = self.by_name.entry(String::from(name)).or_default();
        p.current += 1;
        p.total += 1;
        Ok(())
    }

    /// Sessions tenants hold (every session but the admin's).
    fn tenant_sessions(&self) -> usize {
        self.by_name.iter().filter(|(n, _)| n.as_str() != crate::keyring::ADMIN_NAME).map(|(_, p)| p.current).sum()
    }

    /// A connection is gone: `who` names its principal if it had authenticated.
    pub fn disconnect(&mut self, who: Option<&str>) {
        match who {
            Some(name) => {
                self.sessions = self.sessions.saturating_sub(1);
                if let Some(p) = self.by_name.get_mut(name) {
                    p.current = p.current.saturating_sub(1);
                }
            }
            None => self.preauth = self.preauth.saturating_sub(1),
        }
    }
}
