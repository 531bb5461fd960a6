//! What sessions hand on: lease operations, diagnostics, and the news that a session is gone.

use alloc::string::String;
use alloc::vec::Vec;
use leasebox_proto::{ErrorBody, ErrorCode, FencedSlot, HcaState, Health, HealthStatus, Reply, Request, Role};

/// Who sent a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    pub session_id: u64,
}

/// Why a session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The client said BYE.
    Bye,
    /// The peer closed or reset the connection.
    PeerClosed,
    /// No frame within the heartbeat timeout.
    HeartbeatTimeout,
    /// Framing lost, output overflow or a protocol violation.
    ProtocolError,
}

/// The lease service, as sessions see it.
pub trait Backend {
    /// A lease operation (ALLOC, READY, RENEW, FREE, QUERY, LIST, REVOKE) from an authenticated principal.
    fn lease_op(&mut self, who: &Principal, req: &Request, now_ms: u64) -> Reply;
    /// FENCED_SUMMARY.
    fn fenced(&mut self, who: &Principal) -> Vec<FencedSlot>;
    /// HEALTH (uptime is filled in by the server).
    fn health(&mut self, now_ms: u64) -> Health;
    /// Per-core role loop counts for STATS: (core, role, iterations).
    fn role_counts(&self) -> Vec<(u16, u8, u64)>;
    /// An authenticated session ended: the lease service decides what happens to its leases (kept for a
    /// grace period, then revoked, in the lease-service issue).
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, now_ms: u64);
}

/// The backend until the lease service lands: lease operations answer NOT_IMPLEMENTED; there is no HCA, so
/// nothing can be fenced.
#[derive(Default)]
pub struct NoLeases {
    /// Role counts supplied by the platform (the image fills them from its role loops).
    pub roles: Vec<(u16, u8, u64)>,
    /// Sessions that ended, for tests and diagnostics (bounded).
    pub lost: Vec<(String, CloseReason)>,
}

impl Backend for NoLeases {
    fn lease_op(&mut self, _who: &Principal, req: &Request, _now_ms: u64) -> Reply {
        Err(ErrorBody::new(
            ErrorCode::NotImplemented,
            &alloc::format!("{} is specified but the lease service is not built yet", req.op().name()),
        ))
    }
    fn fenced(&mut self, _who: &Principal) -> Vec<FencedSlot> {
        Vec::new()
    }
    fn health(&mut self, _now_ms: u64) -> Health {
        Health {
            status: HealthStatus::Degraded,
            hca: HcaState::Absent,
            fenced_slots: 0,
            uptime_ms: 0,
            message: String::from("control channel up; no HCA driver yet"),
        }
    }
    fn role_counts(&self) -> Vec<(u16, u8, u64)> {
        self.roles.clone()
    }
    fn session_lost(&mut self, who: &Principal, reason: CloseReason, _now_ms: u64) {
        if self.lost.len() < 64 {
            self.lost.push((who.name.clone(), reason));
        }
    }
}
