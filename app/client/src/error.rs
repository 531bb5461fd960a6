//! The high-level API's errors ([`crate::Client`], [`crate::Lease`]): one enum a program can match on, each
//! variant saying what to do next (docs/client.md, "Errors").

use std::fmt;
use std::time::Duration;

use leasebox_proto::{ErrorBody, ErrorCode, LeaseId, Outcome};

use crate::connection::ClientError;
use crate::rdma::WcStatus;

/// Why a [`crate::Client`] or [`crate::Lease`] call failed.
#[derive(Debug)]
pub enum Error {
    /// The configuration cannot work (no appliance, a bad address, a bad requester setting).
    Config(String),
    /// The appliance could not be reached, or the connection broke during the call (the connection thread
    /// reconnects on its own; calling again later may succeed).
    Connection { appliance: String, source: ClientError },
    /// The appliance refused the request with an error frame (docs/wire-protocol.md, "Errors").
    Server { appliance: String, error: ErrorBody },
    /// Every appliance refused the ALLOC for want of memory (NO_MEMORY, LIMIT) or for now (BUSY), or could not
    /// be reached: `(appliance, reason)` each.
    NoMemory { size: u64, tried: Vec<(String, String)> },
    /// The lease was revoked (by the operator, a lost session, its TTL, a dead HCA) or vanished: its memory is
    /// no longer ours. Every later call on the lease fails with this at once; allocate a new lease.
    Revoked { lease: LeaseId, outcome: Outcome },
    /// An offset/length pair outside the lease; nothing was sent.
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// An RDMA work request completed with an error while the lease still exists; the requester's QP is in
    /// the error state, so the lease cannot carry more RDMA: free it and allocate a new one.
    Rdma { status: WcStatus, lease: LeaseId },
    /// The RDMA requester could not be created, connected or posted to.
    Requester(String),
    /// No answer or completion within the deadline.
    Timeout { what: &'static str, after: Duration },
    /// The lease was freed, or its client dropped.
    Closed(&'static str),
}

impl Error {
    /// The appliance's error code, when the appliance refused the request.
    pub fn server_code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { error, .. } => Some(error.code),
            Error::Connection { source: ClientError::Server(e), .. } => Some(e.code),
            _ => None,
        }
    }

    /// Whether the lease is gone for good (revoked, freed): stop using it and allocate anew.
    pub fn lease_gone(&self) -> bool {
        matches!(self, Error::Revoked { .. } | Error::Closed(_))
    }

    /// The same error again, for another of the operations one cause failed (a connection error's source keeps
    /// its kind and message).
    pub(crate) fn again(&self) -> Error {
        match self {
            Error::Config(m) => Error::Config(m.clone()),
            Error::Connection { appliance, source } => {
                let source = match source {
                    ClientError::Io(e) => ClientError::Io(std::io::Error::new(e.kind(), e.to_string())),
                    ClientError::Timeout { what, after } => ClientError::Timeout { what, after: *after },
                    ClientError::Protocol(m) => ClientError::Protocol(m.clone()),
                    ClientError::Server(b) => ClientError::Server(b.clone()),
                    ClientError::ServerProof => ClientError::ServerProof,
                    ClientError::Usage(m) => ClientError::Usage(m.clone()),
                };
                Error::Connection { appliance: appliance.clone(), source }
            }
            Error::Server { appliance, error } => Error::Server { appliance: appliance.clone(), error: error.clone() },
            Error::NoMemory { size, tried } => Error::NoMemory { size: *size, tried: tried.clone() },
            Error::Revoked { lease, outcome } => Error::Revoked { lease: *lease, outcome: *outcome },
            Error::OutOfRange { offset, len, size } => Error::OutOfRange { offset: *offset, len: *len, size: *size },
            Error::Rdma { status, lease } => Error::Rdma { status: *status, lease: *lease },
            Error::Requester(m) => Error::Requester(m.clone()),
            Error::Timeout { what, after } => Error::Timeout { what, after: *after },
            Error::Closed(m) => Error::Closed(m),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) => write!(f, "configuration: {m}"),
            Error::Connection { appliance, source } => write!(f, "appliance {appliance}: {source}"),
            Error::Server { appliance, error } => {
                write!(f, "appliance {appliance}: {}: {}", error.code.name(), error.message)
            }
            Error::NoMemory { size, tried } => {
                write!(f, "no appliance could lend {size} bytes")?;
                for (a, why) in tried {
                    write!(f, "; {a}: {why}")?;
                }
                Ok(())
            }
            Error::Revoked { lease, outcome } => write!(
                f,
                "lease {}.{} was revoked (outcome {}): its memory is no longer yours; allocate a new lease",
                lease.slot,
                lease.generation,
                outcome.name()
            ),
            Error::OutOfRange { offset, len, size } => {
                write!(f, "{len} bytes at offset {offset} do not fit in the lease's {size} bytes (nothing was sent)")
            }
            Error::Rdma { status, lease } => write!(
                f,
                "RDMA on lease {}.{} failed with {}; the requester's QP is in error: free the lease and allocate anew",
                lease.slot,
                lease.generation,
                status.name()
            ),
            Error::Requester(m) => write!(f, "RDMA requester: {m}"),
            Error::Timeout { what, after } => write!(f, "no {what} within {:.1} s", after.as_secs_f64()),
            Error::Closed(what) => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connection { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A `ClientError` from appliance `appliance`: error frames become [`Error::Server`], the rest
/// [`Error::Connection`].
pub(crate) fn from_client(appliance: &str, e: ClientError) -> Error {
    match e {
        ClientError::Server(error) => Error::Server { appliance: appliance.to_string(), error },
        source => Error::Connection { appliance: appliance.to_string(), source },
    }
}
