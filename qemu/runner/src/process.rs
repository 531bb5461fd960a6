//! Spawning QEMU and reading its serial console with deadlines.
//!
//! QEMU's `-serial stdio` puts the guest's COM1 on QEMU's stdout. A reader thread splits it into lines (the
//! kernel ends lines with `\r\n` or `\n`; both are accepted) stamped with the host time they arrived, and sends
//! them through a channel, so every wait is a `recv_timeout` with a deadline. Another thread drains stderr so
//! QEMU can never block on a full pipe. The [`QemuProcess`] guard kills and reaps QEMU when dropped, on every
//! path (early return, `?`, panic unwinding); a runner killed outright takes QEMU with it (a death signal,
//! `crate::lifetime::die_with_parent`), and one that catches stop signals passes them on to QEMU
//! ([`QemuProcess::wait_or_stop`]).

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::config::QemuConfig;
use crate::exit::QemuExit;
use crate::firmware::ScratchFile;

/// A line longer than this is delivered in pieces (a guest that never sends a newline cannot grow memory).
pub const MAX_LINE: usize = 64 * 1024;
/// At most this much of stderr is kept.
pub const MAX_STDERR: usize = 256 * 1024;
/// How often exit polling looks at the child.
const POLL: Duration = Duration::from_millis(5);
/// How long QEMU gets to exit after a stop signal is passed on to it, before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// Where QEMU's standard streams go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stdio {
    /// Serial lines through [`QemuProcess::next_line`], stderr collected, stdin `/dev/null`. With `echo`, the
    /// serial bytes are also copied to this process's stdout as they arrive.
    Capture { echo: bool },
    /// All three streams inherited: the serial console is the terminal (interactive `run`). Ctrl-C reaches QEMU
    /// directly because it stays in the terminal's foreground process group.
    Inherit,
}

/// How [`QemuProcess::wait_or_stop`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    /// QEMU exited by itself.
    Exited(QemuExit),
    /// The deadline passed; QEMU still runs.
    Deadline,
    /// A stop signal was caught, passed on to QEMU, and QEMU is gone.
    Signal(i32),
}

/// One serial line, without its line terminator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SerialLine {
    pub text: String,
    /// When the host read the line's end.
    pub at: Instant,
}

/// The result of waiting for a line.
#[derive(Debug)]
pub enum NextLine {
    Line(SerialLine),
    /// QEMU closed its stdout (it exited); no more lines will come.
    Closed,
    /// The deadline passed first.
    TimedOut,
}

/// A child process that is killed and reaped when the guard is dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    pub fn new(child: Child) -> Self {
        ChildGuard { child, status: None }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The exit status, if the child has exited (non-blocking).
    pub fn try_status(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Waits for the child to exit until `deadline`; `None` if it is still running then.
    pub fn wait_until(&mut self, deadline: Instant) -> io::Result<Option<ExitStatus>> {
        loop {
            if let Some(s) = self.try_status()? {
                return Ok(Some(s));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            thread::sleep(POLL.min(deadline - now));
        }
    }

    /// Sends `signal` to the child, unless it has exited (then nothing is sent: its id may be reaped and reused).
    pub fn signal(&mut self, signal: i32) -> io::Result<()> {
        if self.try_status()?.is_some() {
            return Ok(());
        }
        crate::lifetime::send_signal(self.child.id(), signal)
    }

    /// Kills (SIGKILL) and reaps the child; returns its status. Harmless if it already exited.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        if let Some(s) = self.try_status()? {
            return Ok(s);
        }
        // Fails only if the child already exited, which the wait below then reports.
        let _ = self.child.kill();
        let s = self.child.wait()?;
        self.status = Some(s);
        Ok(s)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A running QEMU.
pub struct QemuProcess {
    child: ChildGuard,
    started: Instant,
    lines: Option<Receiver<SerialLine>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    command: String,
    // Dropped after `child` is reaped (Drop of the struct runs first), so e.g. the OVMF vars copy outlives QEMU.
    _scratch: Vec<ScratchFile>,
}

impl QemuProcess {
    /// Starts QEMU for `config`. `scratch` files (e.g. the OVMF vars copy) are deleted once QEMU is gone.
    pub fn spawn(config: &QemuConfig, stdio: Stdio, scratch: Vec<ScratchFile>) -> io::Result<QemuProcess> {
        config.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut cmd = Command::new(&config.qemu);
        cmd.args(config.args());
        match stdio {
            Stdio::Capture { .. } => {
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
            }
            Stdio::Inherit => {
                cmd.stdin(std::process::Stdio::inherit())
                    .stdout(std::process::Stdio::inherit())
                    .stderr(std::process::Stdio::inherit());
            }
        }
        crate::lifetime::die_with_parent(&mut cmd);
        let started = Instant::now();
        let child = cmd.spawn().map_err(|e| spawn_error(&config.qemu, e))?;
        let mut child = ChildGuard::new(child);
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let mut lines = None;
        if let Stdio::Capture { echo } = stdio {
            let out = child.child_mut().stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
            let err = child.child_mut().stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
            let (tx, rx) = mpsc::channel();
            readers.push(thread::Builder::new().name("qemu-serial".into()).spawn(move || read_lines(out, &tx, echo))?);
            let sink = Arc::clone(&stderr);
            readers.push(thread::Builder::new().name("qemu-stderr".into()).spawn(move || drain(err, &sink))?);
            lines = Some(rx);
        }
        Ok(QemuProcess { child, started, lines, stderr, readers, command: config.display(), _scratch: scratch })
    }

    /// The host time just before QEMU was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The command line, for logs.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the next serial line until `deadline` ([`Stdio::Capture`] only; otherwise `Closed`).
    pub fn next_line(&mut self, deadline: Instant) -> NextLine {
        let Some(rx) = &self.lines else {
            return NextLine::Closed;
        };
        let timeout = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(timeout) {
            Ok(line) => NextLine::Line(line),
            Err(RecvTimeoutError::Timeout) => NextLine::TimedOut,
            Err(RecvTimeoutError::Disconnected) => NextLine::Closed,
        }
    }

    /// Waits for QEMU to exit until `deadline`; `None` if it is still running then.
    pub fn wait_until(&mut self, deadline: Instant) -> io::Result<Option<QemuExit>> {
        Ok(self.child.wait_until(deadline)?.map(QemuExit::from_status))
    }

    /// Waits for QEMU to exit until `deadline`, looking every few milliseconds for a stop signal `signals` caught:
    /// then passes the signal on to QEMU (which ends on SIGTERM, SIGINT and SIGHUP; a Ctrl-C has reached it
    /// already), gives it [`STOP_GRACE`] to exit, kills it after that, and reaps it.
    pub fn wait_or_stop(&mut self, deadline: Instant, signals: &crate::StopSignals) -> io::Result<Waited> {
        loop {
            if let Some(signal) = signals.caught() {
                self.child.signal(signal)?;
                if self.child.wait_until(Instant::now() + STOP_GRACE)?.is_none() {
                    self.child.kill()?;
                }
                self.join_readers();
                return Ok(Waited::Signal(signal));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Waited::Deadline);
            }
            if let Some(exit) = self.wait_until((now + Duration::from_millis(50)).min(deadline))? {
                return Ok(Waited::Exited(exit));
            }
        }
    }

    /// Whether QEMU has exited, without waiting.
    pub fn try_exit(&mut self) -> io::Result<Option<QemuExit>> {
        Ok(self.child.try_status()?.map(QemuExit::from_status))
    }

    /// Kills and reaps QEMU (if still running), then collects the reader threads. Returns how it ended.
    pub fn kill(&mut self) -> io::Result<QemuExit> {
        let status = self.child.kill()?;
        self.join_readers();
        Ok(QemuExit::from_status(status))
    }

    /// What QEMU wrote to stderr so far (lossy UTF-8).
    pub fn stderr_text(&self) -> String {
        let buf = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn join_readers(&mut self) {
        // Only called once the child is reaped: its pipes are closed, so the readers are at EOF.
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        self.join_readers();
    }
}

fn spawn_error(program: &std::path::Path, e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(e.kind(), format!("{} not found (Debian: apt-get install qemu-system-x86)", program.display()))
    } else {
        io::Error::new(e.kind(), format!("starting {}: {e}", program.display()))
    }
}

/// Splits `src` into lines (`\n`, with a trailing `\r` removed) and sends them until EOF or until the
/// receiver is gone.
fn read_lines(mut src: impl Read, tx: &Sender<SerialLine>, echo: bool) {
    let mut splitter = LineSplitter::default();
    let mut buf = [0u8; 4096];
    let stdout = io::stdout();
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if echo {
            let mut out = stdout.lock();
            let _ = out.write_all(&buf[..n]);
            let _ = out.flush();
        }
        let now = Instant::now();
        for text in splitter.push(&buf[..n]) {
            if tx.send(SerialLine { text, at: now }).is_err() {
                return;
            }
        }
    }
    if let Some(text) = splitter.finish() {
        let _ = tx.send(SerialLine { text, at: Instant::now() });
    }
}

fn drain(mut src: impl Read, sink: &Mutex<Vec<u8>>) {
    let mut buf = [0u8; 4096];
    loop {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                let room = MAX_STDERR.saturating_sub(s.len());
                s.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// Incremental line splitter: accepts `\n` and `\r\n` endings, caps line length at [`MAX_LINE`].
#[derive(Default, Debug)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; returns the lines they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                out.push(self.take());
            } else {
                self.pending.push(b);
                if self.pending.len() >= MAX_LINE {
                    out.push(self.take());
                }
            }
        }
        out
    }

    /// The unterminated last line, if any.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() { None } else { Some(self.take()) }
    }

    fn take(&mut self) -> String {
        let mut line = std::mem::take(&mut self.pending);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        String::from_utf8_lossy(&line).into_owned()
    }
}

/// The result of [`run_captured`].
#[derive(Debug)]
pub struct Captured {
    /// `None` when the deadline passed and the process was killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Captured {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs a short-lived tool (e.g. `grub-mkrescue`) with its output captured, killing it if it runs past
/// `timeout`.
pub fn run_captured(cmd: &mut Command, timeout: Duration) -> io::Result<Captured> {
    let program = cmd.get_program().to_owned();
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    crate::lifetime::die_with_parent(cmd);
    let child = cmd.spawn().map_err(|e| tool_error(&program, e))?;
    let mut guard = ChildGuard::new(child);
    let out = guard.child_mut().stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
    let err = guard.child_mut().stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
    let out_buf = Arc::new(Mutex::new(Vec::new()));
    let err_buf = Arc::new(Mutex::new(Vec::new()));
    let (o, e) = (Arc::clone(&out_buf), Arc::clone(&err_buf));
    let ro = thread::spawn(move || drain(out, &o));
    let re = thread::spawn(move || drain(err, &e));
    let status = guard.wait_until(Instant::now() + timeout)?;
    // Kill on timeout; no-op otherwise. Either way the pipes close and the readers end.
    guard.kill()?;
    let _ = ro.join();
    let _ = re.join();
    let text =
        |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    Ok(Captured { status, stdout: text(&out_buf), stderr: text(&err_buf) })
}

fn tool_error(program: &OsStr, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("running {}: {e}", program.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Boot;

    #[test]
    fn splitter_handles_crlf_lf_and_chunks() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"[  0.1] c0 INFO  a\r\nb\n"), vec!["[  0.1] c0 INFO  a", "b"]);
        assert_eq!(s.push(b"leasebox: rea"), Vec::<String>::new());
        assert_eq!(s.push(b"dy cores=1\r"), Vec::<String>::new());
        assert_eq!(s.push(b"\n\n"), vec!["leasebox: ready cores=1", ""]);
        assert_eq!(s.push(b"tail"), Vec::<String>::new());
        assert_eq!(s.finish().as_deref(), Some("tail"));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn splitter_caps_long_lines_and_survives_bad_utf8() {
        let mut s = LineSplitter::default();
        let long = vec![b'x'; MAX_LINE + 10];
        let lines = s.push(&long);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), MAX_LINE);
        assert_eq!(s.finish().unwrap().len(), 10);
        assert_eq!(s.push(b"\xff\xfeok\n"), vec!["\u{fffd}\u{fffd}ok"]);
    }

    /// A stand-in for QEMU: one shell script, written once, that runs the shell code passed as `-append`.
    /// (Writing a new executable per test races with other tests' fork/exec: ETXTBSY.)
    fn fake_qemu(script: &str) -> QemuConfig {
        static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        let path = PATH.get_or_init(|| {
            let path = crate::firmware::unique_path(&std::env::temp_dir(), "fake-qemu", "sh");
            crate::fake::write_fake_qemu(&path).unwrap();
            path
        });
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: script.into() });
        c.qemu = path.clone();
        c
    }

    fn spawn(c: &QemuConfig) -> QemuProcess {
        // A concurrent fork in another test thread may briefly hold the script open for writing.
        for _ in 0..50 {
            match QemuProcess::spawn(c, Stdio::Capture { echo: false }, vec![]) {
                Ok(q) => return q,
                Err(e) if e.to_string().contains("busy") => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("{e}"),
            }
        }
        panic!("could not start the fake qemu")
    }

    #[test]
    fn lines_arrive_and_exit_status_is_classified() {
        let c = fake_qemu("printf 'one\\r\\ntwo\\n'; echo oops >&2; exit 3");
        let mut q = spawn(&c);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        loop {
            match q.next_line(deadline) {
                NextLine::Line(l) => got.push(l.text),
                NextLine::Closed => break,
                NextLine::TimedOut => panic!("timed out"),
            }
        }
        assert_eq!(got, ["one", "two"]);
        let exit = q.wait_until(deadline).unwrap().unwrap();
        assert!(exit.is_guest_failure());
        q.kill().unwrap();
        assert_eq!(q.stderr_text().trim(), "oops");
    }

    #[test]
    fn deadline_is_honoured_and_drop_kills() {
        let c = fake_qemu("echo started; exec sleep 30");
        let mut q = spawn(&c);
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(matches!(q.next_line(deadline), NextLine::Line(l) if l.text == "started"));
        let t = Instant::now();
        assert!(matches!(q.next_line(Instant::now() + Duration::from_millis(100)), NextLine::TimedOut));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(q.wait_until(Instant::now() + Duration::from_millis(50)).unwrap(), None);
        let pid = q.id();
        drop(q);
        // Reaped: no /proc entry (or at least not a zombie of ours).
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn kill_reports_signal() {
        let c = fake_qemu("exec sleep 30");
        let mut q = spawn(&c);
        assert_eq!(q.kill().unwrap(), QemuExit::Signal { signal: 9 });
    }

    /// Set in the environment of the stand-in runner [`children_stop_with_a_runner_that_is_stopped_or_killed`]
    /// starts (this test binary again, running [`stand_in_runner`] alone): a directory for its scripts.
    const STAND_IN: &str = "LEASEBOX_STAND_IN_RUNNER";

    /// What `cargo xtask run` does, with stand-ins: the stop signals caught, a model (here a script that prints
    /// the ready line and sleeps, deaf to its stdin closing) and QEMU (a sleep) started by the same helpers,
    /// their ids printed, then the same wait. A caught signal ends it as `run` ends: 128 + the signal, after
    /// the guards dropped. Does nothing unless [`STAND_IN`] is set.
    #[test]
    fn stand_in_runner() {
        let Some(dir) = std::env::var_os(STAND_IN).map(std::path::PathBuf::from) else { return };
        let signals = crate::StopSignals::install().unwrap();
        let script = dir.join("model.sh");
        std::fs::write(&script, "#!/bin/sh\necho 'mlx5-model: ready'\nexec sleep 60\n").unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).unwrap();
        let files = crate::ModelFiles { bar: dir.join("bar"), bar_bytes: 1 << 20, ram: dir.join("ram") };
        let model =
            crate::ModelProcess::spawn(&crate::ModelCommand::new(script), &files, 16, Duration::from_secs(10)).unwrap();
        let mut q = spawn(&fake_qemu("exec sleep 60"));
        println!("children {} {}", model.id(), q.id());
        let status = match q.wait_or_stop(Instant::now() + Duration::from_secs(60), &signals).unwrap() {
            Waited::Signal(s) => crate::StopSignals::exit_status(s),
            // The signal went to the whole process group (timeout(1) does that) and QEMU ended first.
            Waited::Exited(e) => e.wrapper_status(),
            Waited::Deadline => panic!("no stop signal within 60 s"),
        };
        drop(q);
        drop(model);
        std::process::exit(status);
    }

    /// Whether process `pid` is gone (no entry, or a zombie nobody has reaped yet: it runs no more).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        }
    }

    #[test]
    fn children_stop_with_a_runner_that_is_stopped_or_killed() {
        use std::io::BufRead;
        use std::os::unix::process::ExitStatusExt;
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGKILL] {
            let dir = crate::firmware::unique_path(&std::env::temp_dir(), "leasebox-stand-in", "d");
            std::fs::create_dir_all(&dir).unwrap();
            let runner = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "process::tests::stand_in_runner", "--nocapture", "--test-threads=1"])
                .env(STAND_IN, &dir)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut runner = ChildGuard::new(runner);
            let out = runner.child_mut().stdout.take().unwrap();
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                for line in io::BufReader::new(out).lines().map_while(Result::ok) {
                    // The harness prints its `test ... ` prefix on the same line.
                    if let Some((_, ids)) = line.split_once("children ") {
                        let ids: Vec<u32> = ids.split(' ').filter_map(|i| i.parse().ok()).collect();
                        let _ = tx.send(ids);
                    }
                }
            });
            let children = rx.recv_timeout(Duration::from_secs(60)).expect("the stand-in runner started its children");
            assert_eq!(children.len(), 2, "{children:?}");
            assert!(children.iter().all(|&c| !gone(c)), "both children run before the signal");
            crate::lifetime::send_signal(runner.id(), signal).unwrap();
            let status = runner.wait_until(Instant::now() + Duration::from_secs(30)).unwrap();
            let status = status.unwrap_or_else(|| panic!("the runner did not end within 30 s of signal {signal}"));
            if signal == libc::SIGKILL {
                assert_eq!(status.signal(), Some(libc::SIGKILL));
            } else {
                assert_eq!(status.code(), Some(128 + signal), "a caught signal {signal} ends the runner as run ends");
            }
            let t = Instant::now();
            while !children.iter().all(|&c| gone(c)) && t.elapsed() < Duration::from_secs(10) {
                thread::sleep(Duration::from_millis(20));
            }
            let left: Vec<u32> = children.iter().copied().filter(|&c| !gone(c)).collect();
            assert!(left.is_empty(), "after signal {signal} to the runner, its children {left:?} still run");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn missing_binary_is_a_clear_error() {
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        c.qemu = "/nonexistent/qemu-system-x86_64".into();
        let e = QemuProcess::spawn(&c, Stdio::Capture { echo: false }, vec![]).err().unwrap();
        assert!(e.to_string().contains("not found"), "{e}");
    }

    #[test]
    fn run_captured_times_out_and_kills() {
        let t = Instant::now();
        let r = run_captured(Command::new("sh").args(["-c", "echo hi; exec sleep 30"]), Duration::from_millis(200))
            .unwrap();
        assert!(r.status.is_none());
        assert_eq!(r.stdout.trim(), "hi");
        assert!(t.elapsed() < Duration::from_secs(10));
        let ok = run_captured(Command::new("sh").args(["-c", "echo err >&2"]), Duration::from_secs(10)).unwrap();
        assert!(ok.success());
        assert_eq!(ok.stderr.trim(), "err");
    }
}
