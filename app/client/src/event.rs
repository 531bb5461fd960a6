//! What the client tells a program without being asked ([`Event`]) and how it gets there: a bounded channel
//! ([`crate::Client::recv_event`]) and, optionally, a callback on the connection thread.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use leasebox_proto::{LeaseId, Outcome};

/// Events queued for the program at most; past this they are counted and dropped ([`crate::Client::
/// events_dropped`]), so a program that never reads them cannot make the client grow without bound.
pub const EVENT_QUEUE: usize = 1024;

/// Something that happened to a connection or a lease (docs/client.md, "Events").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The lease is gone: stop using it (its calls fail with [`crate::Error::Revoked`]).
    Revoked { appliance: String, lease: LeaseId, outcome: Outcome },
    /// The lease ends in `in_ms` unless renewed (an appliance notice).
    Expiring { appliance: String, lease: LeaseId, in_ms: u32 },
    /// The lease's teardown failed and its memory is fenced (an appliance notice): it is gone for this client.
    Fenced { appliance: String, lease: LeaseId },
    /// The appliance is draining: its leases will be revoked in `in_ms` (an appliance notice); move data off.
    Draining { appliance: String, in_ms: u32 },
    /// The connection came back after a break; `session_id` is the new session.
    Reconnected { appliance: String, session_id: u64 },
    /// The connection broke; the client keeps trying to reconnect.
    Disconnected { appliance: String, reason: String },
}

/// A program's event callback: runs on a connection thread, so it must be quick and must not wait for the
/// client (hand the event to another thread instead).
pub type Callback = Arc<dyn Fn(&Event) + Send + Sync>;

/// Where events go: the channel and the callback. Shared by the connection threads and the leases.
pub(crate) struct Sink {
    tx: SyncSender<Event>,
    callback: Option<Callback>,
    dropped: AtomicU64,
}

impl Sink {
    pub(crate) fn new(callback: Option<Callback>) -> (Arc<Sink>, Receiver<Event>) {
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        (Arc::new(Sink { tx, callback, dropped: AtomicU64::new(0) }), rx)
    }

    pub(crate) fn emit(&self, e: Event) {
        if let Some(cb) = &self.callback {
            // A panicking callback must not take the connection thread (and the heartbeats) with it.
            let _ = catch_unwind(AssertUnwindSafe(|| cb(&e)));
        }
        match self.tx.try_send(e) {
            Ok(()) => {}
            // Full: the program is not reading; Disconnected: it dropped the receiver it took. Both: count.
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
