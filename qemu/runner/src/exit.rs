//! What QEMU's exit status means.
//!
//! `isa-debug-exit`: a guest write of `v` to the port makes QEMU exit with status `(v << 1) | 1`. The Leasebox
//! kernel writes 1 on a fatal exception or panic, so status 3 is a guest-reported failure. Status 0 is a clean
//! shutdown (with `-no-reboot`, also a guest reset or triple fault). Status 1 is ambiguous: QEMU's own errors
//! (bad arguments, missing files) and a guest write of 0 both give it.

use std::fmt;
use std::process::ExitStatus;

/// The kernel's failure status: it writes 1 to `isa-debug-exit`.
pub const GUEST_FAILURE_STATUS: i32 = 3;

/// A classified QEMU exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QemuExit {
    /// Status 0: the guest shut down or reset (`-no-reboot`).
    Clean,
    /// Status 1: a QEMU error, or the guest wrote 0 to `isa-debug-exit`.
    QemuError,
    /// An odd status ≥ 3: the guest wrote `value` to `isa-debug-exit`.
    DebugExit { value: i32 },
    /// Any other status.
    Other { status: i32 },
    /// Killed by a signal (Ctrl-C, or the runner's kill).
    Signal { signal: i32 },
}

impl QemuExit {
    /// Classifies a raw exit code (`None` with a signal number when killed by a signal).
    pub fn from_parts(code: Option<i32>, signal: Option<i32>) -> Self {
        match (code, signal) {
            (Some(0), _) => QemuExit::Clean,
            (Some(1), _) => QemuExit::QemuError,
            (Some(c), _) if c & 1 == 1 && c > 1 => QemuExit::DebugExit { value: c >> 1 },
            (Some(c), _) => QemuExit::Other { status: c },
            (None, Some(s)) => QemuExit::Signal { signal: s },
            (None, None) => QemuExit::Other { status: -1 },
        }
    }

    /// Classifies a process status.
    pub fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        QemuExit::from_parts(status.code(), status.signal())
    }

    /// Whether the guest reported failure through `isa-debug-exit` (the kernel writes 1: status 3).
    pub fn is_guest_failure(self) -> bool {
        matches!(self, QemuExit::DebugExit { value: 1 })
    }

    /// The status a command-line wrapper should exit with: QEMU's own status, or 128 + signal (shell
    /// convention) when QEMU was killed by a signal.
    pub fn wrapper_status(self) -> i32 {
        match self {
            QemuExit::Clean => 0,
            QemuExit::QemuError => 1,
            QemuExit::DebugExit { value } => (value << 1) | 1,
            QemuExit::Other { status } => {
                if (0..=255).contains(&status) {
                    status
                } else {
                    1
                }
            }
            QemuExit::Signal { signal } => 128 + signal,
        }
    }
}

impl fmt::Display for QemuExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QemuExit::Clean => {
                write!(f, "QEMU exited with status 0 (guest shut down or reset, or QEMU stopped by Ctrl-C)")
            }
            QemuExit::QemuError => {
                write!(f, "QEMU exited with status 1 (QEMU error, or the guest wrote 0 to isa-debug-exit)")
            }
            QemuExit::DebugExit { value: 1 } => {
                write!(f, "QEMU exited with status 3: the guest reported a failure (isa-debug-exit 1)")
            }
            QemuExit::DebugExit { value } => {
                write!(f, "QEMU exited with status {}: the guest wrote {value} to isa-debug-exit", (value << 1) | 1)
            }
            QemuExit::Other { status } => write!(f, "QEMU exited with status {status}"),
            QemuExit::Signal { signal } => write!(f, "QEMU was terminated by signal {signal}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(QemuExit::from_parts(Some(0), None), QemuExit::Clean);
        assert_eq!(QemuExit::from_parts(Some(1), None), QemuExit::QemuError);
        assert_eq!(QemuExit::from_parts(Some(3), None), QemuExit::DebugExit { value: 1 });
        assert!(QemuExit::from_parts(Some(3), None).is_guest_failure());
        assert_eq!(QemuExit::from_parts(Some(33), None), QemuExit::DebugExit { value: 16 });
        assert_eq!(QemuExit::from_parts(Some(2), None), QemuExit::Other { status: 2 });
        assert_eq!(QemuExit::from_parts(None, Some(9)), QemuExit::Signal { signal: 9 });
    }

    #[test]
    fn wrapper_status_keeps_failure_nonzero() {
        assert_eq!(QemuExit::Clean.wrapper_status(), 0);
        assert_eq!(QemuExit::DebugExit { value: 1 }.wrapper_status(), 3);
        assert_eq!(QemuExit::QemuError.wrapper_status(), 1);
        assert_eq!(QemuExit::Signal { signal: 2 }.wrapper_status(), 130);
        assert_eq!(QemuExit::Other { status: 1000 }.wrapper_status(), 1);
    }

    #[test]
    fn display_names_failure() {
        assert!(QemuExit::DebugExit { value: 1 }.to_string().contains("failure"));
    }
}
