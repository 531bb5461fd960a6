//! Idle without burning a core: the model thread and the engines' thread back off when a pass finds nothing
//! to do (`mlx5_model::idle::Backoff`: spin, yield, then sleeps doubling up to [`MAX_SLEEP`]) and are woken
//! as soon as there is work for them, so a quiet hosted appliance costs next to no CPU and a busy one keeps
//! its latency:
//!
//! - the model thread sleeps on an eventfd ([`ModelWake`]) and, when it serves RoCEv2, on its UDP socket too;
//!   every driver write to the BAR (a doorbell) and every datagram ends the sleep at once, and a command held
//!   for firmware time ends it when it comes due;
//! - the engines' thread parks; a command queued by a client (`Client::set_waker`) and every model pass that
//!   did work (a completion, an event, a page request) unpark it.
//!
//! What nobody announces waits at most [`MAX_SLEEP`]: the model's own timers (the health counter, link
//! training), the driver's (its health check every 2 s, command deadlines of seconds).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::task::Wake;
use std::thread::Thread;
use std::time::Duration;

/// The longest idle sleep of the hosted threads. Longer than the model process's 1 ms
/// (`mlx5_model::idle::MAX_IDLE_SLEEP`, whose doorbells nobody announces) because here every kind of work
/// wakes the sleeper: this bounds only the lateness of the timers above. 1 ms would cost ~2 % of a core per
/// thread in wake-ups alone on the project's machines; 10 ms costs a tenth of that.
pub const MAX_SLEEP: Duration = Duration::from_millis(10);

/// Timer slack of the model thread: its sleeps end when a held command comes due, not up to Linux's default
/// 50 µs later.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// How the model thread is woken from an idle sleep: an eventfd it waits on, written only while it sleeps, so
/// a BAR write costs one atomic load when the thread is awake.
pub struct ModelWake {
    sleeping: AtomicBool,
    /// `None` when no eventfd could be made: the thread then sleeps its step out (at most 1 ms late).
    fd: Option<File>,
}

impl ModelWake {
    pub fn new() -> ModelWake {
        let fd = eventfd().map_err(|e| eprintln!("mlx5-hosted: no eventfd ({e}); doorbells wait for the poll")).ok();
        ModelWake { sleeping: AtomicBool::new(false), fd }
    }

    /// Work was posted (the caller's writes are done): ends the thread's sleep, if it sleeps.
    pub fn wake(&self) {
        // Orders the caller's writes (the doorbell) before the look at `sleeping`; the sleeper orders its
        // announcement before its last look at the doorbells the same way, so one of the two sees the other.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed)
            && self.sleeping.swap(false, Ordering::AcqRel)
            && let Some(f) = &self.fd
        {
            let _ = (&*f).write(&1u64.to_ne_bytes());
        }
    }

    /// Sleeps up to `d`, unless `recheck` (one more pass, after the sleep was announced) finds work: then
    /// returns true at once. Otherwise waits on the eventfd and `socket` (a datagram waiting ends the sleep),
    /// which the caller keeps open for the call.
    pub fn sleep(&self, d: Duration, socket: Option<RawFd>, recheck: impl FnOnce() -> bool) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if recheck() {
            self.sleeping.store(false, Ordering::Relaxed);
            return true;
        }
        let fd = self.fd.as_ref().map(|f| f.as_raw_fd());
        wait(fd.into_iter().chain(socket), d);
        self.sleeping.store(false, Ordering::Relaxed);
        if let Some(f) = &self.fd {
            // Non-blocking: nothing to read when the sleep ended otherwise.
            let _ = (&*f).read(&mut [0u8; 8]);
        }
        false
    }
}

impl Default for ModelWake {
    fn default() -> Self {
        Self::new()
    }
}

/// Unparks a thread: the engines' thread, as a `Waker` for the driver's clients and the model thread.
pub struct Unpark(pub Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Sets this thread's timer slack to [`TIMER_SLACK_NS`] (best effort).
pub fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and changes only the calling thread's timer slack;
    // no memory is passed.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS) };
}

/// A non-blocking, close-on-exec eventfd.
fn eventfd() -> std::io::Result<File> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor nothing else owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd, is open, and is owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Waits until one of `fds` (at most two) is readable or `d` has passed (nanosecond timeout: `ppoll`).
fn wait(fds: impl Iterator<Item = RawFd>, d: Duration) {
    let mut p = [libc::pollfd { fd: -1, events: 0, revents: 0 }; 2];
    let mut n = 0;
    for (slot, fd) in p.iter_mut().zip(fds) {
        *slot = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        n += 1;
    }
    let ts = libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `p` holds `n` initialised entries (the rest are never read), each naming a descriptor its owner
    // keeps open for this call; `ts` is a valid timespec; a null signal mask leaves the mask as it is.
    let _ = unsafe { libc::ppoll(p.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wake_ends_the_sleep_at_once_and_only_a_sleeper_is_written_to() {
        let w = Arc::new(ModelWake::new());
        assert!(w.fd.is_some(), "an eventfd on Linux");
        w.wake();
        let t = Instant::now();
        assert!(!w.sleep(Duration::from_millis(20), None, || false));
        assert!(t.elapsed() >= Duration::from_millis(15), "a wake while awake leaves nothing behind");
        let sleeper = {
            let w = w.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                w.sleep(Duration::from_secs(5), None, || false);
                t.elapsed()
            })
        };
        while !w.sleeping.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        w.wake();
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_secs(2), "woken after {slept:?}");
        assert!(w.sleep(Duration::from_secs(5), None, || true), "work found on the last look: no sleep");
    }

    #[test]
    fn a_datagram_ends_the_sleep() {
        let w = ModelWake::new();
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap().send_to(b"x", to).unwrap();
        });
        let t = Instant::now();
        w.sleep(Duration::from_secs(5), Some(rx.as_raw_fd()), || false);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        sender.join().unwrap();
    }
}
