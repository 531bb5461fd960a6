//! The store's completion fd ([`super::Store::fileno`]): an epoll set (Linux `epoll(7)`) over two descriptors,
//! so one fd polls readable when either is:
//! - the client's completion fd (results of transfers the store has not taken yet: they may finish a batch);
//! - the store's own flag, one end of a socket pair holding a byte exactly while finished batches wait for
//!   [`super::Store::poll`] (it may take fewer than are there).
//!
//! An epoll fd is readable while any descriptor in its set is ready (level-triggered), so nothing has to move
//! bytes between them. The only `unsafe` of the store: the two system calls that make the set.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) struct Ready {
    epoll: OwnedFd,
    flag_read: UnixStream,
    flag_write: UnixStream,
    up: AtomicBool,
}

impl Ready {
    /// The set over `client_fd` (which must outlive it: the client's, owned by the same store) and a new flag.
    pub(crate) fn new(client_fd: RawFd) -> Result<Ready, String> {
        let (flag_read, flag_write) = UnixStream::pair().map_err(|e| format!("the store's flag: {e}"))?;
        for s in [&flag_read, &flag_write] {
            s.set_nonblocking(true).map_err(|e| format!("the store's flag: {e}"))?;
        }
        // SAFETY: epoll_create1 takes no pointer; a non-negative result is a new descriptor we own from here on.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!("epoll_create1: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
        #[allow(unsafe_code)]
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        for watched in [client_fd, flag_read.as_raw_fd()] {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: watched as u64 };
            // SAFETY: both descriptors are open (the client's and our flag's); `ev` is a valid epoll_event that
            // the kernel only reads during the call.
            #[allow(unsafe_code)]
            let r = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, watched, &mut ev) };
            if r < 0 {
                return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
            }
        }
        Ok(Ready { epoll, flag_read, flag_write, up: AtomicBool::new(false) })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Finished batches wait: the flag is up (one byte). Called under the store's state lock, as `lower` is.
    pub(crate) fn raise(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            // Cannot block (one byte in an empty pair) nor fail but for a closed pair, which cannot be: both ends
            // are ours.
            let _ = (&self.flag_write).write(&[1]);
        }
    }

    /// No finished batch waits: the flag is down.
    pub(crate) fn lower(&self) {
        if self.up.swap(false, Ordering::AcqRel) {
            let mut b = [0u8; 16];
            while matches!((&self.flag_read).read(&mut b), Ok(n) if n > 0) {}
        }
    }
}
