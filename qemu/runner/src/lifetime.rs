//! Children that do not outlive their runner. Two layers, because a signal can end the runner in two ways:
//!
//! - A stop signal the runner can catch (SIGTERM from a supervisor or a test harness, SIGINT from Ctrl-C,
//!   SIGHUP from a closed terminal): [`StopSignals`] records it instead of letting it end the process, the
//!   waiting loop passes it on to QEMU ([`crate::QemuProcess::wait_or_stop`]), and the runner returns
//!   normally, so every guard drops in order — QEMU reaped, the model stopped, the shared files deleted.
//! - An end it cannot catch (SIGKILL, a crash, an abort): every child the runner spawns asks the kernel for
//!   SIGKILL when its parent goes ([`die_with_parent`]: `prctl(PR_SET_PDEATHSIG)` in the child, between
//!   fork and exec), so nothing is left running, only the shared files (removed by the next run:
//!   `model::remove_stale_files`).
//!
//! Not a process group of their own with the signal forwarded to it: an interactive `run` keeps QEMU in the
//! terminal's foreground process group, where its serial console reads the keyboard and Ctrl-C reaches it;
//! in a group of its own it would be stopped (SIGTTIN) on its first read from the terminal.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The signals [`StopSignals`] catches.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The child `cmd` spawns gets SIGKILL when the thread that spawns it ends (the runner's main thread: when
/// the runner exits or is killed). If the parent is already gone by the time the child asks, the spawn fails
/// (`ESRCH`) instead of starting an orphan. The death signal survives the exec (the programs run here are not
/// set-user-ID).
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: it makes two system calls (prctl, getppid) and builds errors from raw OS codes, which allocate
    // nothing; it touches no lock and no memory shared with the parent's other threads.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Sends `signal` to process `pid` (a child of ours, not yet reaped, so the id cannot have been reused).
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP caught and recorded (the newest one) instead of ending the process, from
/// [`StopSignals::install`] on for the rest of the process's life. Its waiting loops look at
/// [`StopSignals::caught`] and wind down.
#[derive(Clone, Debug)]
pub struct StopSignals {
    caught: Arc<AtomicUsize>,
}

impl StopSignals {
    /// Installs the handlers (signal-hook's: they only store the signal's number).
    pub fn install() -> io::Result<StopSignals> {
        let caught = Arc::new(AtomicUsize::new(0));
        for s in STOP_SIGNALS {
            signal_hook::flag::register_usize(s, Arc::clone(&caught), s as usize)?;
        }
        Ok(StopSignals { caught })
    }

    /// The stop signal caught, if any.
    pub fn caught(&self) -> Option<i32> {
        match self.caught.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }

    /// The exit status a command-line program stopped by `signal` gives: 128 + the signal, as a shell reports
    /// a process the signal ended.
    pub fn exit_status(signal: i32) -> i32 {
        128 + signal
    }
}
