//! Admission: who may hold a place, so that nobody can hog the control service (docs/operations.md,
//! "Budgets").
//!
//! - Unauthenticated connections live in their own small pool (`preauth_sessions=`), and sessions that have
//!   authenticated are not affected by it. Nobody can lock the pool (docs/security.md, "Pre-authentication"):
//!   one source address (an IPv4 address, an IPv6 /64) holds at most `preauth_per_source` places and opens
//!   connections at most at its connection rate; when the pool (or the source's share) is full, the oldest
//!   idle unauthenticated connection (one that has not yet sent a HELLO that verified), from the source that
//!   holds the most places, is evicted for the new one, provided it is older than [`EVICT_MIN_AGE_MS`]. An
//!   unauthenticated connection leaves the pool when HELLO completes, when it fails, or at the HELLO deadline.
//! - HELLOs are rated too: each source may have at most its HELLO rate of message 1 read, and the work after a
//!   message 1 verifies (an X25519 key and a DH) is limited in total per second ([`Budget::hello_work`]).
//! - Authenticated sessions share the session budget (`sessions=`); a tenant may hold at most
//!   `sessions_per_tenant=` of them, and tenants together never take the last `admin_sessions=` places, so the
//!   admin still gets in when tenants hold all theirs. A session over its budget is refused BUSY at the end of
//!   HELLO (the key was right; there is no place).
//! - A global memory budget: above the high-water mark of the heap ([`MemoryGauge`]), new connections, new
//!   sessions and ALLOCs are refused BUSY, so network load cannot exhaust the heap (whose exhaustion is fatal).

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::string::String;
use core::net::IpAddr;
use leasebox_proto::Role;

/// The pool for unauthenticated connections when `preauth_sessions=` is not given (at most `sessions=`).
pub const DEFAULT_PREAUTH: usize = 8;
/// The places reserved for the admin when `admin_sessions=` is not given (none when `sessions=1`).
pub const DEFAULT_ADMIN_RESERVED: usize = 1;
/// The heap high-water mark in percent of the heap when none is given: above it, new work is refused.
pub const DEFAULT_HEAP_HIGH_WATER_PCT: u8 = 85;
/// An unauthenticated connection younger than this is never evicted for a newer one: a client finishes HELLO
/// in two round trips, so a flood of new connections cannot push out one that is about to authenticate.
pub const EVICT_MIN_AGE_MS: u64 = 1_000;
/// New connections one source may open: a burst of 64, then 32 a second.
pub const DEFAULT_CONN_RATE: Rate = Rate { burst: 64, per_s: 32 };
/// HELLO messages 1 one source may have read: a burst of 64, then 32 a second.
pub const DEFAULT_HELLO_RATE: Rate = Rate { burst: 64, per_s: 32 };
/// Messages 1 that verified and get a message 2 (an X25519 key generation and a DH each), all sources
/// together: a burst of 128, then 128 a second (the figures: docs/security.md, "Cost of a handshake").
pub const DEFAULT_HELLO_WORK: Rate = Rate { burst: 128, per_s: 128 };
/// Sources whose rates are remembered; beyond this the one seen least recently is forgotten.
pub const MAX_SOURCES: usize = 1024;
/// Proven sources remembered (addresses from which a session authenticated); beyond this the one that
/// authenticated least recently is forgotten.
pub const MAX_PROVEN: usize = 256;

/// Where a connection comes from, for the per-source limits: an IPv4 address, an IPv6 /64 (one subscriber's
/// usual allocation, so that an attacker cannot take a new address per connection), or the connection itself
/// when the transport knows no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Source {
    kind: u8,
    key: u128,
}

impl Source {
    /// The source of a connection from `ip`.
    pub fn ip(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(a) => Source { kind: 4, key: u128::from(u32::from(a)) },
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(a) => Source::ip(IpAddr::V4(a)),
                None => Source { kind: 6, key: u128::from(a) >> 64 },
            },
        }
    }

    /// A connection whose address is unknown: a source of its own.
    pub fn unique(conn: u64) -> Source {
        Source { kind: 0, key: u128::from(conn) }
    }
}

/// A token bucket: `burst` at once, refilled at `per_s` a second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub burst: u32,
    pub per_s: u32,
}

/// A bucket's fill, in thousandths of a token, and when it was last refilled.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli: u64,
    at_ms: u64,
}

impl Bucket {
    fn full(rate: Rate, now_ms: u64) -> Bucket {
        Bucket { milli: u64::from(rate.burst) * 1000, at_ms: now_ms }
    }

    /// Takes one token if there is one.
    fn take(&mut self, rate: Rate, now_ms: u64) -> bool {
        let cap = u64::from(rate.burst) * 1000;
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.milli = self.milli.saturating_add(elapsed.saturating_mul(u64::from(rate.per_s))).min(cap);
        self.at_ms = self.at_ms.max(now_ms);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// One source's rates.
#[derive(Clone, Copy, Debug)]
struct SourceRates {
    conns: Bucket,
    hellos: Bucket,
    seen_ms: u64,
}

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
    /// Unauthenticated places one source may hold (default: a quarter of `preauth`, at least 1); a proven
    /// source (one a session has authenticated from) may hold any free place.
    pub preauth_per_source: usize,
    /// New connections per source.
    pub conn_rate: Rate,
    /// HELLO messages 1 read per source.
    pub hello_rate: Rate,
    /// Messages 1 that verified and are answered (the costly part of a handshake), all sources together.
    pub hello_work: Rate,
    /// Fair shares of the session places (docs/security.md, "Fair shares"): each configured tenant is
    /// guaranteed `tenant_places / tenants` places (at least 1); a tenant takes more only while the places left
    /// still cover every other tenant's unused guarantee. On by default; off when `sessions_per_tenant=` is
    /// given (the operator's cap is the policy).
    pub shares: bool,
}

/// The per-source share of a pre-authentication pool of `preauth` places.
pub fn default_preauth_per_source(preauth: usize) -> usize {
    (preauth / 4).max(1)
}

impl Budget {
    /// The defaults for a session budget of `sessions`: one place for the admin, the rest open to any one
    /// tenant, and a pre-authentication pool of [`DEFAULT_PREAUTH`] (no larger than the budget).
    pub fn for_sessions(sessions: usize) -> Budget {
        let admin_reserved = if sessions > 1 { DEFAULT_ADMIN_RESERVED } else { 0 };
        let preauth = DEFAULT_PREAUTH.min(sessions).max(1);
        Budget {
            sessions,
            per_tenant: sessions - admin_reserved,
            admin_reserved,
            preauth,
            heap_high_water_pct: DEFAULT_HEAP_HIGH_WATER_PCT,
            preauth_per_source: default_preauth_per_source(preauth),
            conn_rate: DEFAULT_CONN_RATE,
            hello_rate: DEFAULT_HELLO_RATE,
            hello_work: DEFAULT_HELLO_WORK,
            shares: true,
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
        let preauth = preauth.unwrap_or(d.preauth);
        Budget {
            sessions,
            per_tenant: per_tenant.unwrap_or(sessions - admin_reserved),
            admin_reserved,
            preauth,
            heap_high_water_pct: heap_high_water_pct.unwrap_or(d.heap_high_water_pct),
            preauth_per_source: default_preauth_per_source(preauth),
            shares: per_tenant.is_none(),
            ..d
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
    /// This tenant holds its fair share, and the places left are other tenants' unused shares.
    TenantShare(usize),
    /// The heap is above its high-water mark.
    Memory(HeapUse),
    /// This source opens connections faster than its rate.
    SourceRate(Rate),
    /// This source holds its share of the unauthenticated pool, none of it old enough to evict.
    SourceShare(usize),
    /// This source sends HELLOs faster than its rate.
    HelloRate(Rate),
    /// Handshakes that verified exceed what the appliance answers per second.
    HelloWork(Rate),
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
            Refusal::TenantShare(n) => [w(n), 10, 0],
            Refusal::Memory(h) => [w(h.used >> 10), 5, w(h.size >> 10)],
            Refusal::SourceRate(r) => [r.per_s, 6, r.burst],
            Refusal::SourceShare(n) => [w(n), 7, 0],
            Refusal::HelloRate(r) => [r.per_s, 8, r.burst],
            Refusal::HelloWork(r) => [r.per_s, 9, r.burst],
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
            Refusal::TenantShare(n) => write!(
                f,
                "this tenant holds its fair share of {n} sessions and the places left are other tenants' shares"
            ),
            Refusal::Memory(h) => {
                write!(f, "out of memory budget (heap {} of {} KiB in use)", h.used >> 10, h.size >> 10)
            }
            Refusal::SourceRate(r) => {
                write!(f, "this address opens connections faster than {} a second (burst {})", r.per_s, r.burst)
            }
            Refusal::SourceShare(n) => {
                write!(
                    f,
                    "this address holds its {n} places for unauthenticated connections, all in their first second"
                )
            }
            Refusal::HelloRate(r) => {
                write!(f, "this address sends HELLOs faster than {} a second (burst {})", r.per_s, r.burst)
            }
            Refusal::HelloWork(r) => {
                write!(
                    f,
                    "the appliance answers at most {} handshakes a second (burst {}); try again",
                    r.per_s, r.burst
                )
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
    /// Rates per source, bounded by [`MAX_SOURCES`].
    sources: BTreeMap<Source, SourceRates>,
    /// The budget for answering messages 1 that verified, all sources together.
    hello_work: Bucket,
    /// Sources from which a session authenticated, and when it last did: their new connections come before
    /// those of addresses never seen to hold a key.
    proven: BTreeMap<Source, u64>,
    /// Tenants configured (for the fair shares).
    tenants: usize,
    /// Unauthenticated connections evicted for newer ones.
    pub evicted: u64,
    /// Connections and HELLOs refused for a per-source or the total rate.
    pub rate_refusals: u64,
}

impl Admission {
    pub fn new(budget: Budget) -> Admission {
        Admission {
            budget,
            preauth: 0,
            sessions: 0,
            by_name: BTreeMap::new(),
            gauge: None,
            memory_refusals: 0,
            sources: BTreeMap::new(),
            hello_work: Bucket::full(budget.hello_work, 0),
            proven: BTreeMap::new(),
            tenants: 0,
            evicted: 0,
            rate_refusals: 0,
        }
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// New budgets; places already held are kept (the counts go on).
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = budget;
        self.hello_work = Bucket::full(budget.hello_work, self.hello_work.at_ms);
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

    /// The number of tenants configured (the fair shares divide the tenants' places among them).
    pub fn set_tenants(&mut self, tenants: usize) {
        self.tenants = tenants;
    }

    /// A tenant's guaranteed places, when fair shares apply (on, and at least two tenants).
    pub fn share(&self) -> Option<usize> {
        (self.budget.shares && self.tenants >= 2).then(|| (self.budget.tenant_places() / self.tenants).max(1))
    }

    /// Whether `name` taking one more place would leave fewer places than the other tenants' unused shares.
    fn over_share(&self, name: &str) -> Option<usize> {
        let share = self.share()?;
        if self.principal(name).current < share {
            return None;
        }
        let others =
            self.by_name.iter().filter(|(n, _)| n.as_str() != name && n.as_str() != crate::keyring::ADMIN_NAME);
        let (seen, unused) = others.fold((0, 0), |(k, u), (_, p)| (k + 1, u + share.saturating_sub(p.current)));
        let unused = unused + self.tenants.saturating_sub(1 + seen) * share;
        (self.tenant_sessions() + 1 + unused > self.budget.tenant_places()).then_some(share)
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

    /// `source`'s rates, created full (the least recently seen source is forgotten beyond [`MAX_SOURCES`]).
    fn rates(&mut self, source: Source, now_ms: u64) -> &mut SourceRates {
        if !self.sources.contains_key(&source) && self.sources.len() >= MAX_SOURCES {
            let oldest = self.sources.iter().min_by_key(|(_, r)| r.seen_ms).map(|(s, _)| *s);
            if let Some(s) = oldest {
                self.sources.remove(&s);
            }
        }
        let b = self.budget;
        let r = self.sources.entry(source).or_insert_with(|| SourceRates {
            conns: Bucket::full(b.conn_rate, now_ms),
            hellos: Bucket::full(b.hello_rate, now_ms),
            seen_ms: now_ms,
        });
        r.seen_ms = now_ms;
        r
    }

    /// A new connection from `source`: within its connection rate and the memory budget, or refused. (A place
    /// in the pool is taken by [`Admission::enter`], once the server has made room.)
    pub fn connect(&mut self, source: Source, now_ms: u64) -> Result<(), Refusal> {
        self.memory()?;
        let rate = self.budget.conn_rate;
        if !self.rates(source, now_ms).conns.take(rate, now_ms) {
            self.rate_refusals += 1;
            return Err(Refusal::SourceRate(rate));
        }
        Ok(())
    }

    /// A session from `source` authenticated: the source is proven (bounded by [`MAX_PROVEN`]).
    pub fn prove(&mut self, source: Source, now_ms: u64) {
        if source.kind == 0 {
            return; // a connection of unknown address: nobody comes from it again
        }
        if !self.proven.contains_key(&source) && self.proven.len() >= MAX_PROVEN {
            let oldest = self.proven.iter().min_by_key(|(_, t)| **t).map(|(s, _)| *s);
            if let Some(s) = oldest {
                self.proven.remove(&s);
            }
        }
        self.proven.insert(source, now_ms);
    }

    /// Whether a session from `source` has authenticated (and it is still remembered).
    pub fn proven(&self, source: Source) -> bool {
        self.proven.contains_key(&source)
    }

    /// Whether the unauthenticated pool is full.
    pub fn preauth_full(&self) -> bool {
        self.preauth >= self.budget.preauth
    }

    /// Takes a place in the unauthenticated pool (the server made room first).
    pub fn enter(&mut self) {
        self.preauth += 1;
    }

    /// A HELLO message 1 from `source` is about to be read: within the source's HELLO rate, or refused.
    pub fn hello(&mut self, source: Source, now_ms: u64) -> Result<(), Refusal> {
        let rate = self.budget.hello_rate;
        if !self.rates(source, now_ms).hellos.take(rate, now_ms) {
            self.rate_refusals += 1;
            return Err(Refusal::HelloRate(rate));
        }
        Ok(())
    }

    /// A message 1 verified and is about to be answered (key generation, DH): within the total rate, or
    /// refused.
    pub fn hello_work(&mut self, now_ms: u64) -> Result<(), Refusal> {
        let rate = self.budget.hello_work;
        if !self.hello_work.take(rate, now_ms) {
            self.rate_refusals += 1;
            return Err(Refusal::HelloWork(rate));
        }
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
        } else if role != Role::Admin {
            self.over_share(name).map(Refusal::TenantShare)
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
