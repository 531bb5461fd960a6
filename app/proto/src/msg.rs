//! Every message of the control protocol (the frames inside v2's records): opcodes, error codes, request and response bodies, and their encodings.
//! Field layouts are listed in `docs/wire-protocol.md`; each `encode`/`decode` pair below follows them in
//! order, big-endian.

use crate::codec::{DecodeError, Reader, Writer};
use crate::frame::{Kind, frame};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

/// Longest tenant name.
pub const MAX_NAME: usize = 32;
/// Longest error message.
pub const MAX_MESSAGE: usize = 256;
/// HELLO nonces and MACs.
pub const CLIENT_NONCE_LEN: usize = 16;
pub const SERVER_NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;
/// Most entries in one LIST / FENCED_SUMMARY page (keeps the response under MAX_PAYLOAD).
pub const MAX_PAGE: usize = 128;

macro_rules! codes {
    ($(#[$m:meta])* $name:ident : $t:ty { $($(#[$vm:meta])* $v:ident = $n:expr, $s:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr($t)]
        pub enum $name { $($(#[$vm])* $v = $n,)* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            pub fn from_raw(raw: $t) -> Option<Self> {
                match raw { $($n => Some($name::$v),)* _ => None }
            }
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
            pub fn parse_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.name() == s)
            }
        }
    };
}

codes! {
    /// Operation codes: session 0x01xx, leases 0x02xx, diagnostics 0x03xx.
    Op: u16 {
        Hello = 0x0101, "HELLO";
        Heartbeat = 0x0102, "HEARTBEAT";
        Bye = 0x0103, "BYE";
        /// Server → client only, in frames of kind [`Kind::Notice`] (never a request).
        Notice = 0x0104, "NOTICE";
        Resume = 0x0105, "RESUME";
        Alloc = 0x0201, "ALLOC";
        Ready = 0x0202, "READY";
        Renew = 0x0203, "RENEW";
        Free = 0x0204, "FREE";
        Query = 0x0205, "QUERY";
        List = 0x0206, "LIST";
        Revoke = 0x020A, "REVOKE";
        Drain = 0x020B, "DRAIN";
        Stats = 0x0301, "STATS";
        FencedSummary = 0x0302, "FENCED_SUMMARY";
        Health = 0x0303, "HEALTH";
        HcaStats = 0x0304, "HCA_STATS";
        LeaseLog = 0x0305, "LEASE_LOG";
    }
}

codes! {
    /// Where a lease slot is (LEASE_LOG): the lease's phases plus the slot's own states.
    SlotState: u8 {
        Free = 0, "free";
        Building = 1, "building";
        Granted = 2, "granted";
        Active = 3, "active";
        /// The immediate phase of FREE, REVOKE or an expiry.
        Fencing = 4, "fencing";
        PendingDestroy = 5, "pending-destroy";
        Sweeping = 6, "sweeping";
        Unwinding = 7, "unwinding";
        /// Fenced until reboot.
        Fenced = 8, "fenced";
        /// Free, but its generations are used up: out of service until reboot.
        Retired = 9, "retired";
    }
}

codes! {
    /// Why a lease slot changed state (LEASE_LOG).
    TransitionCause: u8 {
        /// ALLOC took the slot and its build started.
        Alloc = 1, "alloc";
        /// The build finished: the QP is in RTS and ALLOC is answered.
        Granted = 2, "granted";
        /// READY confirmed the lease.
        Confirm = 3, "confirm";
        /// The tenant's FREE.
        Free = 4, "free";
        /// A REVOKE (the tenant's, the admin's, or a DRAIN's).
        Revoke = 5, "revoke";
        /// The TTL ran out, or READY did not come in time.
        Expiry = 6, "expiry";
        /// The owning session was lost and its grace period ran out.
        SessionLost = 7, "session-lost";
        /// The immediate phase finished: the key is gone.
        TeardownOk = 8, "teardown-ok";
        /// A teardown command of the immediate phase failed (the record's mask names it).
        TeardownFailed = 9, "teardown-failed";
        /// The HCA did not answer within the revoke deadline.
        Deadline = 10, "deadline";
        /// The grace period ended; the sweep starts.
        SweepStart = 11, "sweep-start";
        /// The sweep finished: the slot is free and its memory goes to the scrub.
        SweepDone = 12, "sweep-done";
        /// A command of the sweep failed (the record's mask names it).
        SweepFailed = 13, "sweep-failed";
        /// A build step failed; what exists is being destroyed.
        BuildFailed = 14, "build-failed";
        /// The unwind of a failed build finished.
        UnwindDone = 15, "unwind-done";
        /// A command of the unwind failed.
        UnwindFailed = 16, "unwind-failed";
    }
}

/// One lease slot's state change (LEASE_LOG; docs/wire-protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Its sequence number in the appliance's ring (1, 2, ...).
    pub seq: u64,
    /// The lease service's clock, in µs.
    pub at_us: u64,
    pub slot: u32,
    pub generation: u32,
    pub from: SlotState,
    pub to: SlotState,
    pub why: TransitionCause,
    /// The teardown steps failed so far (FENCED_SUMMARY's `failed_mask` bits).
    pub failed_mask: u32,
}

impl core::fmt::Display for Transition {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "#{} {}.{:06} slot {} gen {} {} -> {} ({})",
            self.seq,
            self.at_us / 1_000_000,
            self.at_us % 1_000_000,
            self.slot,
            self.generation,
            self.from.name(),
            self.to.name(),
            self.why.name()
        )?;
        if self.failed_mask != 0 {
            write!(f, " failed {:#05x}", self.failed_mask)?;
        }
        Ok(())
    }
}

codes! {
    /// Error codes carried by error frames.
    ErrorCode: u16 {
        BadMagic = 1, "BAD_MAGIC";
        BadVersion = 2, "BAD_VERSION";
        FrameTooLarge = 3, "FRAME_TOO_LARGE";
        Malformed = 4, "MALFORMED";
        UnknownOp = 5, "UNKNOWN_OP";
        NotAuthenticated = 6, "NOT_AUTHENTICATED";
        AuthFailed = 7, "AUTH_FAILED";
        CreditExceeded = 8, "CREDIT_EXCEEDED";
        Busy = 9, "BUSY";
        NotImplemented = 10, "NOT_IMPLEMENTED";
        BadParam = 11, "BAD_PARAM";
        NoMemory = 12, "NO_MEMORY";
        Limit = 13, "LIMIT";
        HcaError = 14, "HCA_ERROR";
        NotFound = 15, "NOT_FOUND";
        Stale = 16, "STALE";
        Forbidden = 17, "FORBIDDEN";
        Timeout = 18, "TIMEOUT";
        Internal = 19, "INTERNAL";
        BadState = 20, "BAD_STATE";
        UnsupportedVersion = 21, "UNSUPPORTED_VERSION";
    }
}

codes! {
    /// REVOKE / FREE outcomes (docs/reference/revoke-spec.md §1.1).
    Outcome: u8 {
        TornDown = 0, "TornDown";
        Fenced = 1, "Fenced";
        NotFound = 2, "NotFound";
    }
}

codes! {
    /// Lease states as QUERY and LIST report them.
    LeaseState: u8 {
        Granted = 0, "Granted";
        Active = 1, "Active";
        Fencing = 2, "Fencing";
        PendingDestroy = 3, "PendingDestroy";
        Fenced = 4, "Fenced";
    }
}

codes! {
    /// The principal a session authenticated as.
    Role: u8 {
        Tenant = 0, "tenant";
        Admin = 1, "admin";
    }
}

codes! {
    /// Overall and HCA health.
    HealthStatus: u8 {
        Ok = 0, "ok";
        Degraded = 1, "degraded";
        Failed = 2, "failed";
    }
}

codes! {
    /// HCA state as HEALTH reports it.
    HcaState: u8 {
        Absent = 0, "absent";
        Initializing = 1, "initializing";
        Ok = 2, "ok";
        Fatal = 3, "fatal";
    }
}

/// Access flags of a lease (ALLOC `access`).
pub mod access {
    pub const REMOTE_READ: u8 = 1 << 0;
    pub const REMOTE_WRITE: u8 = 1 << 1;
    pub const REMOTE_ATOMIC: u8 = 1 << 2;
    pub const ALL: u8 = REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC;
}

/// Path MTU as the IB spec encodes it: 1 = 256 … 5 = 4096 bytes.
pub fn mtu_bytes(code: u8) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128u32 << code)
}

/// Length of a boot id and of a resume token.
pub const BOOT_ID_LEN: usize = 16;
pub const RESUME_TOKEN_LEN: usize = 16;

/// A lease's identity: the boot it was granted in, slot index plus generation, never a bare rkey. The boot id
/// makes an id from an earlier boot name nothing, even though slot generations start again at 1 every boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId {
    pub boot_id: [u8; BOOT_ID_LEN],
    pub slot: u32,
    pub generation: u32,
}

impl LeaseId {
    /// Bytes on the wire: boot_id 16, slot 4, generation 4.
    pub const WIRE_LEN: usize = BOOT_ID_LEN + 4 + 4;

    fn put(&self, w: &mut Writer<'_>) {
        w.bytes(&self.boot_id).u32(self.slot).u32(self.generation);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(LeaseId {
            boot_id: r.array("lease.boot_id")?,
            slot: r.u32("lease.slot")?,
            generation: r.u32("lease.generation")?,
        })
    }
}

/// `SLOT.GENERATION` (the boot id is left out: it is the same for every lease of one appliance's boot).
impl core::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}", self.slot, self.generation)
    }
}

/// HELLO, step 1 (client → server): versions and identity, with the client's nonce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloInit {
    pub min_version: u16,
    pub max_version: u16,
    pub name: String,
    pub client_nonce: [u8; CLIENT_NONCE_LEN],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hello {
    Init(HelloInit),
    /// Step 2: HMAC-SHA256 proof over the transcript (see [`hello_transcript`]).
    Proof {
        mac: [u8; MAC_LEN],
    },
    /// Protocol v2 (step 3): the clear identity and Noise message 1 (see [`crate::v2`]).
    Noise(HelloNoise),
}

/// HELLO step 3 (protocol v2): versions, key id and name in clear (the Noise prologue), then `e ‖ tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloNoise {
    pub min_version: u16,
    pub max_version: u16,
    pub key_id: u8,
    pub name: String,
    pub msg1: [u8; crate::v2::MSG1_LEN],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloReply {
    /// Answer to step 1: the chosen version and the server's nonce.
    Challenge { version: u16, server_nonce: [u8; SERVER_NONCE_LEN] },
    /// Answer to step 2: the session is authenticated.
    Welcome { role: Role, credits: u16, heartbeat_ms: u32, session_id: u64, server_proof: [u8; MAC_LEN] },
    /// Answer to step 3 (protocol v2): Noise message 2, `e ‖ AEAD(announcement)`.
    Noise { msg2: [u8; crate::v2::MSG2_LEN] },
}

/// What each side MACs in HELLO: `label ‖ version ‖ len(name) ‖ name ‖ first nonce ‖ second nonce`. The client
/// proves with label `"leasebox/1 client"` and (client_nonce, server_nonce); the server answers with label
/// `"leasebox/1 server"` and (server_nonce, client_nonce).
pub fn hello_transcript(client: bool, version: u16, name: &str, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(32 + name.len() + client_nonce.len() + server_nonce.len());
    let mut w = Writer::new(&mut t);
    if client {
        w.bytes(b"leasebox/1 client").u16(version).u8(name.len() as u8).bytes(name.as_bytes());
        w.bytes(client_nonce).bytes(server_nonce);
    } else {
        w.bytes(b"leasebox/1 server").u16(version).u8(name.len() as u8).bytes(name.as_bytes());
        w.bytes(server_nonce).bytes(client_nonce);
    }
    t
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocReq {
    pub size: u64,
    pub access: u8,
    pub mtu: u8,
    pub ttl_ms: u32,
    pub client_qpn: u32,
    pub client_psn: u32,
    pub client_gid: [u8; 16],
    pub client_mac: [u8; 6],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocResp {
    pub lease: LeaseId,
    pub rkey: u32,
    pub remote_addr: u64,
    pub length: u64,
    pub server_qpn: u32,
    pub server_psn: u32,
    pub server_gid: [u8; 16],
    pub mtu: u8,
    pub ttl_ms: u32,
    /// The MAC of the appliance's RDMA port (the source MAC of its GID): where the client's RoCE frames go.
    pub server_mac: [u8; 6],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub lease: LeaseId,
    pub state: LeaseState,
    pub access: u8,
    pub mtu: u8,
    pub size: u64,
    pub rkey: u32,
    pub server_qpn: u32,
    pub client_qpn: u32,
    pub ttl_left_ms: u32,
    pub tenant: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedSlot {
    pub slot: u32,
    pub generation: u32,
    pub failed_mask: u32,
    pub origin: u8,
    pub fenced_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Stats {
    pub uptime_ms: u64,
    /// This boot's id (the one in the handshake's announcement and in every lease id).
    pub boot_id: [u8; BOOT_ID_LEN],
    pub sessions_current: u32,
    pub session_budget: u32,
    pub sessions_total: u64,
    pub sessions_refused: u64,
    pub frames_in: u64,
    pub frames_out: u64,
    /// (error code, count) for every code seen at least once.
    pub errors: Vec<(u16, u64)>,
    /// (core, role, iterations) of each role loop.
    pub roles: Vec<(u16, u8, u64)>,
    /// The lease service's figures (all zero until it runs).
    pub leases: LeaseStats,
    /// The session layer's guard counters: present only when the request asked for them
    /// ([`Request::StatsWith`] with [`STATS_WANT_GUARDS`]), so that an older client, which never asks, reads
    /// the layout it knows.
    pub guards: Option<SessionGuards>,
}

/// [`Request::StatsWith`]'s bit asking for [`SessionGuards`]. Bits an appliance does not know it ignores.
pub const STATS_WANT_GUARDS: u32 = 1;

/// The session layer's defences at work since start (docs/security.md, "Availability under a hostile network"):
/// a length-prefixed block after the lease figures, [`SessionGuards::WIRE_LEN`] bytes today. A reader takes the
/// fields it knows and skips the rest of the block, so a later appliance may add counters at its end.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SessionGuards {
    /// Unauthenticated connections evicted for newer ones.
    pub evicted: u64,
    /// Connections and HELLOs refused for a per-source or the appliance-wide rate.
    pub rate_refusals: u64,
    /// Noise messages 1 refused as replays of one that verified recently.
    pub hellos_replayed: u64,
    /// Authenticated records received that opened.
    pub records_in: u64,
    /// Of those, records that carried no whole frame (empty, or a piece of one).
    pub records_empty: u64,
}

impl SessionGuards {
    /// The block's length today (after its u16 length prefix): 5 × u64.
    pub const WIRE_LEN: usize = 40;

    fn put(&self, w: &mut Writer<'_>) {
        w.u16(Self::WIRE_LEN as u16);
        w.u64(self.evicted).u64(self.rate_refusals).u64(self.hellos_replayed).u64(self.records_in);
        w.u64(self.records_empty);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.u16("stats.guards_len")?);
        if len < Self::WIRE_LEN {
            return Err(DecodeError::Invalid { field: "stats.guards_len" });
        }
        let g = SessionGuards {
            evicted: r.u64("stats.evicted")?,
            rate_refusals: r.u64("stats.rate_refusals")?,
            hellos_replayed: r.u64("stats.hellos_replayed")?,
            records_in: r.u64("stats.records_in")?,
            records_empty: r.u64("stats.records_empty")?,
        };
        // Counters of a later appliance: not ours to read.
        r.bytes(len - Self::WIRE_LEN, "stats.guards")?;
        Ok(g)
    }
}

/// The lease service's part of STATS: a fixed-size tail of [`LeaseStats::WIRE_LEN`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Leases in each state, indexed by `LeaseState as u8` (Granted, Active, Fencing, PendingDestroy, Fenced).
    pub by_state: [u32; 5],
    pub bytes_leased: u64,
    pub bytes_free: u64,
    pub fenced_slots: u32,
    /// Granted since start.
    pub allocs: u64,
    /// REVOKE requests completed (torn down or fenced) since start.
    pub revokes: u64,
    /// Leases whose TTL ran out since start.
    pub expiries: u64,
    /// Sessions that resumed leases left by an earlier session of the same tenant.
    pub reconnects: u64,
    /// ALLOC latency, request to answer, in microseconds.
    pub alloc_us: Histogram,
    /// REVOKE latency, request to answer, in microseconds.
    pub revoke_us: Histogram,
    /// The whole lease pool in bytes (0 from an appliance older than the field).
    pub pool_bytes: u64,
    /// Pool bytes waiting to be zeroed before they are lent again: freed leases' memory, and after boot the part
    /// of the pool not prepared yet (0 from an appliance older than the field). `bytes_free` is what is ready.
    pub bytes_scrubbing: u64,
}

impl LeaseStats {
    /// Bytes on the wire: 5×4 + 8 + 8 + 4 + 4×8 + 2 × 16×4 + 8 + 8.
    pub const WIRE_LEN: usize = 216;
    /// What an appliance older than `pool_bytes` and `bytes_scrubbing` sends (decoded with both 0).
    pub const WIRE_LEN_BEFORE_POOL: usize = 200;

    fn put(&self, w: &mut Writer<'_>) {
        for n in self.by_state {
            w.u32(n);
        }
        w.u64(self.bytes_leased).u64(self.bytes_free).u32(self.fenced_slots);
        w.u64(self.allocs).u64(self.revokes).u64(self.expiries).u64(self.reconnects);
        self.alloc_us.put(w);
        self.revoke_us.put(w);
        w.u64(self.pool_bytes).u64(self.bytes_scrubbing);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut by_state = [0u32; 5];
        for n in &mut by_state {
            *n = r.u32("stats.leases_by_state")?;
        }
        let mut s = LeaseStats {
            by_state,
            bytes_leased: r.u64("stats.bytes_leased")?,
            bytes_free: r.u64("stats.bytes_free")?,
            fenced_slots: r.u32("stats.fenced_slots")?,
            allocs: r.u64("stats.allocs")?,
            revokes: r.u64("stats.revokes")?,
            expiries: r.u64("stats.expiries")?,
            reconnects: r.u64("stats.reconnects")?,
            alloc_us: Histogram::get(r, "stats.alloc_us")?,
            revoke_us: Histogram::get(r, "stats.revoke_us")?,
            ..LeaseStats::default()
        };
        // An older appliance's STATS end here.
        if r.remaining() > 0 {
            s.pool_bytes = r.u64("stats.pool_bytes")?;
            s.bytes_scrubbing = r.u64("stats.bytes_scrubbing")?;
        }
        Ok(s)
    }
}

/// A latency histogram in microseconds with power-of-two buckets: bucket `i` (`i < 15`) counts values `v` with
/// `2^i ≤ v < 2^(i+1)`, bucket 0 also counts 0 and 1, and bucket 15 counts every `v ≥ 2^15` (32.768 ms).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Histogram {
    pub buckets: [u32; 16],
}

impl Histogram {
    pub const BUCKETS: usize = 16;

    /// The bucket `us` falls in.
    pub fn bucket(us: u64) -> usize {
        if us < 2 { 0 } else { (63 - us.leading_zeros() as usize).min(Self::BUCKETS - 1) }
    }

    /// The exclusive upper bound of bucket `i` in microseconds (`2^(i+1)`); `u64::MAX` for the last bucket,
    /// which has none.
    pub fn upper_bound(i: usize) -> u64 {
        if i + 1 >= Self::BUCKETS { u64::MAX } else { 1u64 << (i + 1) }
    }

    /// Counts one value (a full bucket stays full rather than wrapping).
    pub fn record(&mut self, us: u64) {
        let b = &mut self.buckets[Self::bucket(us)];
        *b = b.saturating_add(1);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|n| u64::from(*n)).sum()
    }

    /// The `p`-th percentile (`p` in percent, 0 to 100) as the upper bound of the bucket holding it (see
    /// [`Histogram::upper_bound`]): at least `p` % of the values are below it. `None` when nothing was
    /// recorded.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        // The rank of the value, 1-based: ceil(p% of total), at least 1 (no `f64::ceil` in core).
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 100.0) };
        let exact = p / 100.0 * total as f64;
        let mut rank = exact as u64;
        if (rank as f64) < exact {
            rank += 1;
        }
        let rank = rank.clamp(1, total);
        let mut seen = 0u64;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += u64::from(*n);
            if seen >= rank {
                return Some(Self::upper_bound(i));
            }
        }
        None
    }

    fn put(&self, w: &mut Writer<'_>) {
        for n in self.buckets {
            w.u32(n);
        }
    }

    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let mut h = Histogram::default();
        for n in &mut h.buckets {
            *n = r.u32(field)?;
        }
        Ok(h)
    }
}

/// HCA_STATS: the mlx5 command queue's counters since boot (docs/wire-protocol.md, "HCA_STATS").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcaStats {
    pub hca: HcaState,
    /// Commands handed to the HCA.
    pub submitted: u64,
    /// Completed with status 0.
    pub ok: u64,
    /// Completed with a bad status or syndrome.
    pub failed: u64,
    /// Given up on at their deadline.
    pub timeout: u64,
    /// Completed after their deadline had been given up on.
    pub late: u64,
    /// Never completed: the queue was torn down or the HCA went fatal first.
    pub aborted: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub status: HealthStatus,
    pub hca: HcaState,
    pub fenced_slots: u32,
    pub uptime_ms: u64,
    pub message: String,
}

/// A decoded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Hello(Hello),
    Heartbeat {
        echo: u64,
    },
    Bye,
    Alloc(AllocReq),
    Ready {
        lease: LeaseId,
        client_qpn: u32,
        server_qpn: u32,
    },
    Renew {
        lease: LeaseId,
        ttl_ms: u32,
    },
    Free {
        lease: LeaseId,
    },
    Query {
        lease: LeaseId,
    },
    List {
        cursor: u32,
        max: u16,
    },
    Revoke {
        lease: LeaseId,
        qp_first: bool,
    },
    /// Take over the leases of an earlier session of the same principal (its id and resume token from its
    /// handshake).
    Resume {
        session_id: u64,
        token: [u8; RESUME_TOKEN_LEN],
    },
    /// Admin only: tell `tenant`'s sessions (every tenant's when empty) that their leases go in `notice_ms`,
    /// refuse their ALLOCs meanwhile, then revoke them.
    Drain {
        tenant: String,
        notice_ms: u32,
    },
    Stats,
    /// STATS with the extra parts `want` names ([`STATS_WANT_GUARDS`]): a 4-byte request. An appliance older than
    /// the parts refuses it (MALFORMED, trailing bytes); ask again with [`Request::Stats`] then.
    StatsWith {
        want: u32,
    },
    /// One page of fenced slots, from slot `cursor` on, at most `max` (clamped to 1..=[`MAX_PAGE`]).
    FencedSummary {
        cursor: u32,
        max: u16,
    },
    Health,
    HcaStats,
    /// Admin only: up to `max` lease transitions (clamped to 1..=[`MAX_PAGE`]) from sequence `cursor` on (0:
    /// the oldest held).
    LeaseLog {
        cursor: u64,
        max: u16,
    },
}

/// A decoded response (the success answer to a request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Hello(HelloReply),
    Heartbeat {
        echo: u64,
        uptime_ms: u64,
    },
    Bye,
    Alloc(AllocResp),
    Ready {
        state: LeaseState,
    },
    Renew {
        ttl_ms: u32,
    },
    Free {
        outcome: Outcome,
        elapsed_us: u32,
    },
    Query(LeaseInfo),
    List {
        next_cursor: u32,
        leases: Vec<LeaseInfo>,
    },
    Revoke {
        outcome: Outcome,
        elapsed_us: u32,
    },
    /// Leases the new session holds now that were the old session's.
    Resume {
        leases: u32,
    },
    /// Leases the drain will revoke, and when (the HEARTBEAT uptime clock, milliseconds).
    Drain {
        leases: u32,
        deadline_ms: u64,
    },
    /// Boxed: STATS is rare and large; every other answer stays small as it moves through queues.
    Stats(Box<Stats>),
    FencedSummary {
        /// Where the next page starts; 0 when this is the last.
        next_cursor: u32,
        slots: Vec<FencedSlot>,
    },
    Health(Health),
    HcaStats(HcaStats),
    LeaseLog {
        /// The cursor to ask with next.
        next_cursor: u64,
        /// Records from the asked cursor on that the ring no longer holds.
        lost: u64,
        records: Vec<Transition>,
    },
}

/// An error answer: a code, up to three code-specific details and a human message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub detail: [u32; 3],
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: &str) -> Self {
        ErrorBody { code, detail: [0; 3], message: truncate(message, MAX_MESSAGE) }
    }
    pub fn with_detail(mut self, detail: [u32; 3]) -> Self {
        self.detail = detail;
        self
    }
}

/// The longest prefix of `s` within `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    String::from(&s[..end])
}

/// Either answer to a request.
pub type Reply = Result<Response, ErrorBody>;

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Hello(_) => Op::Hello,
            Request::Heartbeat { .. } => Op::Heartbeat,
            Request::Bye => Op::Bye,
            Request::Alloc(_) => Op::Alloc,
            Request::Ready { .. } => Op::Ready,
            Request::Renew { .. } => Op::Renew,
            Request::Free { .. } => Op::Free,
            Request::Query { .. } => Op::Query,
            Request::List { .. } => Op::List,
            Request::Revoke { .. } => Op::Revoke,
            Request::Resume { .. } => Op::Resume,
            Request::Drain { .. } => Op::Drain,
            Request::Stats | Request::StatsWith { .. } => Op::Stats,
            Request::FencedSummary { .. } => Op::FencedSummary,
            Request::Health => Op::Health,
            Request::HcaStats => Op::HcaStats,
            Request::LeaseLog { .. } => Op::LeaseLog,
        }
    }

    /// Encodes the payload only.
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Request::Hello(Hello::Init(h)) => {
                w.u8(1).u16(h.min_version).u16(h.max_version).u8(h.name.len() as u8);
                w.bytes(h.name.as_bytes()).bytes(&h.client_nonce);
            }
            Request::Hello(Hello::Proof { mac }) => {
                w.u8(2).bytes(mac);
            }
            Request::Hello(Hello::Noise(h)) => {
                w.u8(3).u16(h.min_version).u16(h.max_version).u8(h.key_id).u8(h.name.len() as u8);
                w.bytes(h.name.as_bytes()).bytes(&h.msg1);
            }
            Request::Heartbeat { echo } => {
                w.u64(*echo);
            }
            Request::Bye | Request::Stats | Request::Health | Request::HcaStats => {}
            Request::StatsWith { want } => {
                w.u32(*want);
            }
            Request::Alloc(a) => {
                w.u64(a.size).u8(a.access).u8(a.mtu).zeros(2).u32(a.ttl_ms).u32(a.client_qpn).u32(a.client_psn);
                w.bytes(&a.client_gid).bytes(&a.client_mac).zeros(2);
            }
            Request::Ready { lease, client_qpn, server_qpn } => {
                lease.put(&mut w);
                w.u32(*client_qpn).u32(*server_qpn);
            }
            Request::Renew { lease, ttl_ms } => {
                lease.put(&mut w);
                w.u32(*ttl_ms);
            }
            Request::Free { lease } | Request::Query { lease } => lease.put(&mut w),
            Request::List { cursor, max } | Request::FencedSummary { cursor, max } => {
                w.u32(*cursor).u16(*max).zeros(2);
            }
            Request::Revoke { lease, qp_first } => {
                lease.put(&mut w);
                w.u8(u8::from(*qp_first)).zeros(3);
            }
            Request::Resume { session_id, token } => {
                w.u64(*session_id).bytes(token);
            }
            Request::Drain { tenant, notice_ms } => {
                w.u32(*notice_ms).u8(tenant.len() as u8).zeros(3).bytes(tenant.as_bytes());
            }
            Request::LeaseLog { cursor, max } => {
                w.u64(*cursor).u16(*max).zeros(6);
            }
        }
    }

    /// Encodes a whole request frame.
    pub fn encode(&self, request_id: u32, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        self.encode_payload(&mut p);
        frame(Kind::Request, self.op() as u16, request_id, &p, out);
    }

    /// Decodes a request payload for `op`.
    pub fn decode(op: Op, payload: &[u8]) -> Result<Request, DecodeError> {
        let mut r = Reader::new(payload);
        let req = match op {
            Op::Hello => match r.u8("hello.step")? {
                1 => {
                    let min_version = r.u16("hello.min_version")?;
                    let max_version = r.u16("hello.max_version")?;
                    let len = r.u8("hello.name_len")? as usize;
                    if len == 0 || len > MAX_NAME {
                        return Err(DecodeError::Invalid { field: "hello.name_len" });
                    }
                    let name = r.str(len, "hello.name")?;
                    let client_nonce = r.array("hello.client_nonce")?;
                    Request::Hello(Hello::Init(HelloInit { min_version, max_version, name, client_nonce }))
                }
                2 => Request::Hello(Hello::Proof { mac: r.array("hello.mac")? }),
                3 => {
                    let min_version = r.u16("hello.min_version")?;
                    let max_version = r.u16("hello.max_version")?;
                    let key_id = r.u8("hello.key_id")?;
                    let len = r.u8("hello.name_len")? as usize;
                    if len == 0 || len > MAX_NAME {
                        return Err(DecodeError::Invalid { field: "hello.name_len" });
                    }
                    let name = r.str(len, "hello.name")?;
                    let msg1 = r.array("hello.noise")?;
                    Request::Hello(Hello::Noise(HelloNoise { min_version, max_version, key_id, name, msg1 }))
                }
                _ => return Err(DecodeError::Invalid { field: "hello.step" }),
            },
            Op::Heartbeat => Request::Heartbeat { echo: r.u64("heartbeat.echo")? },
            Op::Bye => Request::Bye,
            Op::Alloc => {
                let size = r.u64("alloc.size")?;
                let access = r.u8("alloc.access")?;
                let mtu = r.u8("alloc.mtu")?;
                r.reserved(2)?;
                let a = AllocReq {
                    size,
                    access,
                    mtu,
                    ttl_ms: r.u32("alloc.ttl_ms")?,
                    client_qpn: r.u32("alloc.client_qpn")?,
                    client_psn: r.u32("alloc.client_psn")?,
                    client_gid: r.array("alloc.client_gid")?,
                    client_mac: r.array("alloc.client_mac")?,
                };
                r.reserved(2)?;
                Request::Alloc(a)
            }
            Op::Ready => Request::Ready {
                lease: LeaseId::get(&mut r)?,
                client_qpn: r.u32("ready.client_qpn")?,
                server_qpn: r.u32("ready.server_qpn")?,
            },
            Op::Renew => Request::Renew { lease: LeaseId::get(&mut r)?, ttl_ms: r.u32("renew.ttl_ms")? },
            Op::Free => Request::Free { lease: LeaseId::get(&mut r)? },
            Op::Query => Request::Query { lease: LeaseId::get(&mut r)? },
            Op::List => {
                let cursor = r.u32("list.cursor")?;
                let max = r.u16("list.max")?;
                r.reserved(2)?;
                Request::List { cursor, max }
            }
            Op::Revoke => {
                let lease = LeaseId::get(&mut r)?;
                let flags = r.u8("revoke.flags")?;
                if flags & !1 != 0 {
                    return Err(DecodeError::Invalid { field: "revoke.flags" });
                }
                r.reserved(3)?;
                Request::Revoke { lease, qp_first: flags & 1 != 0 }
            }
            Op::Resume => Request::Resume { session_id: r.u64("resume.session_id")?, token: r.array("resume.token")? },
            Op::Drain => {
                let notice_ms = r.u32("drain.notice_ms")?;
                let len = r.u8("drain.tenant_len")? as usize;
                if len > MAX_NAME {
                    return Err(DecodeError::Invalid { field: "drain.tenant_len" });
                }
                r.reserved(3)?;
                Request::Drain { tenant: r.str(len, "drain.tenant")?, notice_ms }
            }
            // Only the server sends NOTICE, and never as a request.
            Op::Notice => return Err(DecodeError::Invalid { field: "op" }),
            Op::Stats if r.remaining() == 0 => Request::Stats,
            Op::Stats => Request::StatsWith { want: r.u32("stats.want")? },
            Op::FencedSummary => {
                let cursor = r.u32("fenced.cursor")?;
                let max = r.u16("fenced.max")?;
                r.reserved(2)?;
                Request::FencedSummary { cursor, max }
            }
            Op::Health => Request::Health,
            Op::HcaStats => Request::HcaStats,
            Op::LeaseLog => {
                let cursor = r.u64("lease_log.cursor")?;
                let max = r.u16("lease_log.max")?;
                r.reserved(6)?;
                Request::LeaseLog { cursor, max }
            }
        };
        r.finish()?;
        Ok(req)
    }
}

fn put_info(w: &mut Writer<'_>, l: &LeaseInfo) {
    l.lease.put(w);
    w.u8(l.state as u8).u8(l.access).u8(l.mtu).zeros(1).u64(l.size).u32(l.rkey).u32(l.server_qpn);
    w.u32(l.client_qpn).u32(l.ttl_left_ms).u8(l.tenant.len() as u8).bytes(l.tenant.as_bytes());
}

fn get_info(r: &mut Reader<'_>) -> Result<LeaseInfo, DecodeError> {
    let lease = LeaseId::get(r)?;
    let state = LeaseState::from_raw(r.u8("lease.state")?).ok_or(DecodeError::Invalid { field: "lease.state" })?;
    let access = r.u8("lease.access")?;
    let mtu = r.u8("lease.mtu")?;
    r.reserved(1)?;
    let size = r.u64("lease.size")?;
    let rkey = r.u32("lease.rkey")?;
    let server_qpn = r.u32("lease.server_qpn")?;
    let client_qpn = r.u32("lease.client_qpn")?;
    let ttl_left_ms = r.u32("lease.ttl_left_ms")?;
    let len = r.u8("lease.tenant_len")? as usize;
    if len > MAX_NAME {
        return Err(DecodeError::Invalid { field: "lease.tenant_len" });
    }
    let tenant = r.str(len, "lease.tenant")?;
    Ok(LeaseInfo { lease, state, access, mtu, size, rkey, server_qpn, client_qpn, ttl_left_ms, tenant })
}

fn count(r: &mut Reader<'_>, field: &'static str, max: usize) -> Result<usize, DecodeError> {
    let n = r.u16(field)? as usize;
    if n > max {
        return Err(DecodeError::Invalid { field });
    }
    Ok(n)
}

impl Response {
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Response::Hello(HelloReply::Challenge { version, server_nonce }) => {
                w.u8(1).u16(*version).bytes(server_nonce);
            }
            Response::Hello(HelloReply::Welcome { role, credits, heartbeat_ms, session_id, server_proof }) => {
                w.u8(2).u8(*role as u8).u16(*credits).u32(*heartbeat_ms).u64(*session_id).bytes(server_proof);
            }
            Response::Hello(HelloReply::Noise { msg2 }) => {
                w.u8(3).bytes(msg2);
            }
            Response::Heartbeat { echo, uptime_ms } => {
                w.u64(*echo).u64(*uptime_ms);
            }
            Response::Bye => {}
            Response::Alloc(a) => {
                a.lease.put(&mut w);
                w.u32(a.rkey).u64(a.remote_addr).u64(a.length).u32(a.server_qpn).u32(a.server_psn);
                w.bytes(&a.server_gid).u8(a.mtu).zeros(3).u32(a.ttl_ms).bytes(&a.server_mac).zeros(2);
            }
            Response::Ready { state } => {
                w.u8(*state as u8).zeros(3);
            }
            Response::Renew { ttl_ms } => {
                w.u32(*ttl_ms);
            }
            Response::Free { outcome, elapsed_us } | Response::Revoke { outcome, elapsed_us } => {
                w.u8(*outcome as u8).zeros(3).u32(*elapsed_us);
            }
            Response::Resume { leases } => {
                w.u32(*leases);
            }
            Response::Drain { leases, deadline_ms } => {
                w.u32(*leases).u64(*deadline_ms);
            }
            Response::Query(info) => put_info(&mut w, info),
            Response::List { next_cursor, leases } => {
                w.u32(*next_cursor).u16(leases.len() as u16);
                for l in leases {
                    put_info(&mut w, l);
                }
            }
            Response::Stats(s) => {
                w.u64(s.uptime_ms)
                    .bytes(&s.boot_id)
                    .u32(s.sessions_current)
                    .u32(s.session_budget)
                    .u64(s.sessions_total);
                w.u64(s.sessions_refused).u64(s.frames_in).u64(s.frames_out).u16(s.errors.len() as u16);
                for (code, n) in &s.errors {
                    w.u16(*code).u64(*n);
                }
                w.u16(s.roles.len() as u16);
                for (core, role, n) in &s.roles {
                    w.u16(*core).u8(*role).u64(*n);
                }
                s.leases.put(&mut w);
                if let Some(g) = &s.guards {
                    g.put(&mut w);
                }
            }
            Response::FencedSummary { next_cursor, slots } => {
                w.u32(*next_cursor).u16(slots.len() as u16);
                for s in slots {
                    w.u32(s.slot).u32(s.generation).u32(s.failed_mask).u8(s.origin).zeros(3).u64(s.fenced_at_ms);
                }
            }
            Response::Health(h) => {
                w.u8(h.status as u8).u8(h.hca as u8).zeros(2).u32(h.fenced_slots).u64(h.uptime_ms);
                let msg = truncate(&h.message, MAX_MESSAGE);
                w.u16(msg.len() as u16).bytes(msg.as_bytes());
            }
            Response::HcaStats(h) => {
                w.u8(h.hca as u8).zeros(7);
                w.u64(h.submitted).u64(h.ok).u64(h.failed).u64(h.timeout).u64(h.late).u64(h.aborted);
            }
            Response::LeaseLog { next_cursor, lost, records } => {
                w.u64(*next_cursor).u64(*lost).u16(records.len() as u16).zeros(6);
                for t in records {
                    w.u64(t.seq).u64(t.at_us).u32(t.slot).u32(t.generation);
                    w.u8(t.from as u8).u8(t.to as u8).u8(t.why as u8).zeros(1).u32(t.failed_mask);
                }
            }
        }
    }

    pub fn encode(&self, op: Op, request_id: u32, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        self.encode_payload(&mut p);
        frame(Kind::Response, op as u16, request_id, &p, out);
    }

    pub fn decode(op: Op, payload: &[u8]) -> Result<Response, DecodeError> {
        let mut r = Reader::new(payload);
        let resp = match op {
            Op::Hello => match r.u8("hello.step")? {
                1 => Response::Hello(HelloReply::Challenge {
                    version: r.u16("hello.version")?,
                    server_nonce: r.array("hello.server_nonce")?,
                }),
                2 => {
                    let role =
                        Role::from_raw(r.u8("hello.role")?).ok_or(DecodeError::Invalid { field: "hello.role" })?;
                    Response::Hello(HelloReply::Welcome {
                        role,
                        credits: r.u16("hello.credits")?,
                        heartbeat_ms: r.u32("hello.heartbeat_ms")?,
                        session_id: r.u64("hello.session_id")?,
                        server_proof: r.array("hello.server_proof")?,
                    })
                }
                3 => Response::Hello(HelloReply::Noise { msg2: r.array("hello.noise")? }),
                _ => return Err(DecodeError::Invalid { field: "hello.step" }),
            },
            Op::Heartbeat => {
                Response::Heartbeat { echo: r.u64("heartbeat.echo")?, uptime_ms: r.u64("heartbeat.uptime_ms")? }
            }
            Op::Bye => Response::Bye,
            Op::Alloc => {
                let lease = LeaseId::get(&mut r)?;
                let rkey = r.u32("alloc.rkey")?;
                let remote_addr = r.u64("alloc.remote_addr")?;
                let length = r.u64("alloc.length")?;
                let server_qpn = r.u32("alloc.server_qpn")?;
                let server_psn = r.u32("alloc.server_psn")?;
                let server_gid = r.array("alloc.server_gid")?;
                let mtu = r.u8("alloc.mtu")?;
                r.reserved(3)?;
                let ttl_ms = r.u32("alloc.ttl_ms")?;
                let server_mac = r.array("alloc.server_mac")?;
                r.reserved(2)?;
                Response::Alloc(AllocResp {
                    lease,
                    rkey,
                    remote_addr,
                    length,
                    server_qpn,
                    server_psn,
                    server_gid,
                    mtu,
                    ttl_ms,
                    server_mac,
                })
            }
            Op::Ready => {
                let state =
                    LeaseState::from_raw(r.u8("ready.state")?).ok_or(DecodeError::Invalid { field: "ready.state" })?;
                r.reserved(3)?;
                Response::Ready { state }
            }
            Op::Renew => Response::Renew { ttl_ms: r.u32("renew.ttl_ms")? },
            Op::Free | Op::Revoke => {
                let outcome = Outcome::from_raw(r.u8("outcome")?).ok_or(DecodeError::Invalid { field: "outcome" })?;
                r.reserved(3)?;
                let elapsed_us = r.u32("elapsed_us")?;
                if op == Op::Free {
                    Response::Free { outcome, elapsed_us }
                } else {
                    Response::Revoke { outcome, elapsed_us }
                }
            }
            Op::Resume => Response::Resume { leases: r.u32("resume.leases")? },
            Op::Drain => Response::Drain { leases: r.u32("drain.leases")?, deadline_ms: r.u64("drain.deadline_ms")? },
            Op::Notice => return Err(DecodeError::Invalid { field: "op" }),
            Op::Query => Response::Query(get_info(&mut r)?),
            Op::List => {
                let next_cursor = r.u32("list.next_cursor")?;
                let n = count(&mut r, "list.count", MAX_PAGE)?;
                let mut leases = Vec::with_capacity(n);
                for _ in 0..n {
                    leases.push(get_info(&mut r)?);
                }
                Response::List { next_cursor, leases }
            }
            Op::Stats => {
                let mut s = Stats {
                    uptime_ms: r.u64("stats.uptime_ms")?,
                    boot_id: r.array("stats.boot_id")?,
                    sessions_current: r.u32("stats.sessions_current")?,
                    session_budget: r.u32("stats.session_budget")?,
                    sessions_total: r.u64("stats.sessions_total")?,
                    sessions_refused: r.u64("stats.sessions_refused")?,
                    frames_in: r.u64("stats.frames_in")?,
                    frames_out: r.u64("stats.frames_out")?,
                    ..Stats::default()
                };
                for _ in 0..count(&mut r, "stats.error_count", 1024)? {
                    s.errors.push((r.u16("stats.error_code")?, r.u64("stats.error_total")?));
                }
                for _ in 0..count(&mut r, "stats.role_count", 1024)? {
                    s.roles.push((r.u16("stats.core")?, r.u8("stats.role")?, r.u64("stats.iterations")?));
                }
                s.leases = LeaseStats::get(&mut r)?;
                if r.remaining() > 0 {
                    s.guards = Some(SessionGuards::get(&mut r)?);
                }
                Response::Stats(Box::new(s))
            }
            Op::FencedSummary => {
                let next_cursor = r.u32("fenced.next_cursor")?;
                let n = count(&mut r, "fenced.count", MAX_PAGE)?;
                let mut slots = Vec::with_capacity(n);
                for _ in 0..n {
                    let slot = r.u32("fenced.slot")?;
                    let generation = r.u32("fenced.generation")?;
                    let failed_mask = r.u32("fenced.failed_mask")?;
                    let origin = r.u8("fenced.origin")?;
                    r.reserved(3)?;
                    slots.push(FencedSlot {
                        slot,
                        generation,
                        failed_mask,
                        origin,
                        fenced_at_ms: r.u64("fenced.at_ms")?,
                    });
                }
                Response::FencedSummary { next_cursor, slots }
            }
            Op::Health => {
                let status = HealthStatus::from_raw(r.u8("health.status")?)
                    .ok_or(DecodeError::Invalid { field: "health.status" })?;
                let hca =
                    HcaState::from_raw(r.u8("health.hca")?).ok_or(DecodeError::Invalid { field: "health.hca" })?;
                r.reserved(2)?;
                let fenced_slots = r.u32("health.fenced_slots")?;
                let uptime_ms = r.u64("health.uptime_ms")?;
                let len = r.u16("health.message_len")? as usize;
                if len > MAX_MESSAGE {
                    return Err(DecodeError::Invalid { field: "health.message_len" });
                }
                let message = r.str(len, "health.message")?;
                Response::Health(Health { status, hca, fenced_slots, uptime_ms, message })
            }
            Op::HcaStats => {
                let hca = HcaState::from_raw(r.u8("hca_stats.hca")?)
                    .ok_or(DecodeError::Invalid { field: "hca_stats.hca" })?;
                r.reserved(7)?;
                Response::HcaStats(HcaStats {
                    hca,
                    submitted: r.u64("hca_stats.submitted")?,
                    ok: r.u64("hca_stats.ok")?,
                    failed: r.u64("hca_stats.failed")?,
                    timeout: r.u64("hca_stats.timeout")?,
                    late: r.u64("hca_stats.late")?,
                    aborted: r.u64("hca_stats.aborted")?,
                })
            }
            Op::LeaseLog => {
                let next_cursor = r.u64("lease_log.next_cursor")?;
                let lost = r.u64("lease_log.lost")?;
                let n = count(&mut r, "lease_log.count", MAX_PAGE)?;
                r.reserved(6)?;
                let mut records = Vec::with_capacity(n);
                for _ in 0..n {
                    let seq = r.u64("lease_log.seq")?;
                    let at_us = r.u64("lease_log.at_us")?;
                    let slot = r.u32("lease_log.slot")?;
                    let generation = r.u32("lease_log.generation")?;
                    let state = |c| SlotState::from_raw(c);
                    let from =
                        state(r.u8("lease_log.from")?).ok_or(DecodeError::Invalid { field: "lease_log.from" })?;
                    let to = state(r.u8("lease_log.to")?).ok_or(DecodeError::Invalid { field: "lease_log.to" })?;
                    let why = TransitionCause::from_raw(r.u8("lease_log.why")?)
                        .ok_or(DecodeError::Invalid { field: "lease_log.why" })?;
                    r.reserved(1)?;
                    let failed_mask = r.u32("lease_log.failed_mask")?;
                    records.push(Transition { seq, at_us, slot, generation, from, to, why, failed_mask });
                }
                Response::LeaseLog { next_cursor, lost, records }
            }
        };
        r.finish()?;
        Ok(resp)
    }
}

impl ErrorBody {
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        let msg = truncate(&self.message, MAX_MESSAGE);
        let mut w = Writer::new(out);
        w.u16(self.code as u16).u16(msg.len() as u16);
        for d in self.detail {
            w.u32(d);
        }
        w.bytes(msg.as_bytes());
    }

    /// An error frame answering `op` (raw, since it may be an op the server does not know).
    pub fn encode(&self, op: u16, request_id: u32, out: &mut Vec<u8>) {
        let mut p = Vec::new();
        self.encode_payload(&mut p);
        frame(Kind::Error, op, request_id, &p, out);
    }

    pub fn decode(payload: &[u8]) -> Result<ErrorBody, DecodeError> {
        let mut r = Reader::new(payload);
        let code = ErrorCode::from_raw(r.u16("error.code")?).ok_or(DecodeError::Invalid { field: "error.code" })?;
        let len = r.u16("error.message_len")? as usize;
        if len > MAX_MESSAGE {
            return Err(DecodeError::Invalid { field: "error.message_len" });
        }
        let detail = [r.u32("error.detail0")?, r.u32("error.detail1")?, r.u32("error.detail2")?];
        let message = r.str(len, "error.message")?;
        r.finish()?;
        Ok(ErrorBody { code, detail, message })
    }
}

/// News the server sends without being asked (frame kind [`Kind::Notice`], op [`Op::Notice`], request id 0) to
/// every session of the tenant the news concerns. It answers no request and holds no credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The lease is gone (revoked by the admin, a drain, expiry or the tenant's own REVOKE), with the
    /// authoritative outcome: stop using it now.
    Revoked { lease: LeaseId, outcome: Outcome },
    /// The lease's TTL runs out in `in_ms` unless it is renewed.
    Expiring { lease: LeaseId, in_ms: u32 },
    /// The lease's slot was fenced: its memory is never handed out again this boot.
    Fenced { lease: LeaseId },
    /// The appliance revokes this tenant's leases in `in_ms` (DRAIN) and refuses its ALLOCs meanwhile.
    Draining { in_ms: u32 },
}

impl Notice {
    /// Payload bytes: kind u8, outcome u8, reserved u16, ms u32, lease id (24).
    pub const WIRE_LEN: usize = 8 + LeaseId::WIRE_LEN;
    const REVOKED: u8 = 1;
    const EXPIRING: u8 = 2;
    const FENCED: u8 = 3;
    const DRAINING: u8 = 4;

    /// The lease the notice is about (none for Draining).
    pub fn lease(&self) -> Option<LeaseId> {
        match self {
            Notice::Revoked { lease, .. } | Notice::Expiring { lease, .. } | Notice::Fenced { lease } => Some(*lease),
            Notice::Draining { .. } => None,
        }
    }

    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        let none = LeaseId { boot_id: [0; BOOT_ID_LEN], slot: 0, generation: 0 };
        let (kind, outcome, ms, lease) = match *self {
            Notice::Revoked { lease, outcome } => (Self::REVOKED, outcome as u8, 0, lease),
            Notice::Expiring { lease, in_ms } => (Self::EXPIRING, 0, in_ms, lease),
            Notice::Fenced { lease } => (Self::FENCED, 0, 0, lease),
            Notice::Draining { in_ms } => (Self::DRAINING, 0, in_ms, none),
        };
        let mut w = Writer::new(out);
        w.u8(kind).u8(outcome).zeros(2).u32(ms);
        lease.put(&mut w);
    }

    /// A whole notice frame (request id 0).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut p = Vec::with_capacity(Self::WIRE_LEN);
        self.encode_payload(&mut p);
        frame(Kind::Notice, Op::Notice as u16, 0, &p, out);
    }

    /// Decodes a notice payload. Fields a kind does not use must be zero (a later version may use them).
    pub fn decode(payload: &[u8]) -> Result<Notice, DecodeError> {
        let mut r = Reader::new(payload);
        let kind = r.u8("notice.kind")?;
        let outcome = r.u8("notice.outcome")?;
        r.reserved(2)?;
        let ms = r.u32("notice.ms")?;
        let lease = LeaseId::get(&mut r)?;
        r.finish()?;
        let zero = |v: u32, field| if v == 0 { Ok(()) } else { Err(DecodeError::Invalid { field }) };
        let n = match kind {
            Self::REVOKED => {
                zero(ms, "notice.ms")?;
                let outcome = Outcome::from_raw(outcome).ok_or(DecodeError::Invalid { field: "notice.outcome" })?;
                Notice::Revoked { lease, outcome }
            }
            Self::EXPIRING => Notice::Expiring { lease, in_ms: ms },
            Self::FENCED => {
                zero(ms, "notice.ms")?;
                Notice::Fenced { lease }
            }
            Self::DRAINING => {
                let empty = lease.boot_id == [0; BOOT_ID_LEN] && lease.slot == 0 && lease.generation == 0;
                zero(u32::from(!empty), "notice.lease")?;
                Notice::Draining { in_ms: ms }
            }
            _ => return Err(DecodeError::Invalid { field: "notice.kind" }),
        };
        if kind != Self::REVOKED {
            zero(u32::from(outcome), "notice.outcome")?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
