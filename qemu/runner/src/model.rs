//! The ConnectX-5 model's shared files and process (`qemu/mlx5-model`, `docs/hca-model.md`).
//!
//! QEMU takes its guest RAM from one shared file (`-object memory-backend-file,...,share=on -machine
//! ...,memory-backend=...`, size equal to `-m`) and shows a second one as `ivshmem-plain` BAR2; the model
//! process maps both (docs/reference/platform.md, "Shared memory between QEMU and the model").
//!
//! A backing file that already exists keeps its old contents into the next boot, so every run gets new,
//! uniquely named files ([`ModelShm::create`]): created empty with `O_EXCL` and sized here, before QEMU and
//! the model start, so both map the same fresh zero-filled files and the model can write its signature before
//! the guest runs. They are deleted when the [`ModelShm`] guard drops (after QEMU and the model are gone);
//! files of runs that died without cleaning up are removed by [`remove_stale_files`].
//!
//! [`ModelProcess`] starts the model, waits (bounded) for its `mlx5-model: ready` line — the signature is then
//! in place — and stops it on drop: it closes the model's standard input (`--exit-on-stdin-eof`), waits a
//! moment for a clean exit, then kills and reaps it. A runner killed outright takes the model with it
//! (`crate::lifetime::die_with_parent`).

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::firmware::{remove_stale, unique_path};
use crate::process::ChildGuard;

/// The BAR size: 32 MiB, a ConnectX-5's BAR0.
pub const DEFAULT_BAR_BYTES: u64 = 32 << 20;
/// The most guest RAM the model takes on the `pc` machine. The model lays the RAM file out in guest physical
/// memory as q35 does (up to 2 GiB below the PCI hole, the rest at 4 GiB); `pc` splits larger RAM elsewhere,
/// and up to here both keep all of it below the hole.
pub const MAX_PC_MODEL_MEM_MIB: u32 = 2048;
/// QEMU object ids (unusual enough not to clash with `--object` arguments).
pub const RAM_ID: &str = "lbxram";
pub const BAR_ID: &str = "mlx5bar";
/// File name stems in the shared-memory directory: `<stem>-<pid>-<n>.shm`.
pub const BAR_STEM: &str = "leasebox-mlx5-bar";
pub const RAM_STEM: &str = "leasebox-mlx5-ram";
const EXT: &str = "shm";
/// How long the model may take to map the files and write its signature.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a stopping model gets to exit by itself before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Paths and sizes QEMU and the model share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    /// The BAR file (ivshmem BAR2).
    pub bar: PathBuf,
    pub bar_bytes: u64,
    /// The guest-RAM file; its size is the configuration's `-m`.
    pub ram: PathBuf,
}

impl ModelFiles {
    /// `-object memory-backend-file,...` for the guest RAM of `mem_mib` MiB.
    pub fn ram_object(&self, mem_mib: u32) -> OsString {
        backend(RAM_ID, &format!("{mem_mib}M"), &self.ram)
    }

    /// `-object memory-backend-file,...` for the BAR.
    pub fn bar_object(&self) -> OsString {
        backend(BAR_ID, &self.bar_bytes.to_string(), &self.bar)
    }

    /// `-device ivshmem-plain,memdev=...`.
    pub fn bar_device(&self) -> String {
        format!("ivshmem-plain,memdev={BAR_ID}")
    }
}

/// QEMU's option parser treats `,` as a separator, so a comma inside the path is doubled.
fn backend(id: &str, size: &str, path: &Path) -> OsString {
    let mut s = OsString::from(format!("memory-backend-file,id={id},size={size},share=on,mem-path="));
    s.push(path.to_string_lossy().replace(',', ",,"));
    s
}

/// Where the shared files go: `/dev/shm` (tmpfs) when present, else the system's temporary directory.
pub fn shm_dir() -> PathBuf {
    let dev_shm = Path::new("/dev/shm");
    if dev_shm.is_dir() { dev_shm.to_path_buf() } else { std::env::temp_dir() }
}

/// Removes shared files left in `dir` by runs whose process is gone; returns how many.
pub fn remove_stale_files(dir: &Path) -> usize {
    remove_stale(dir, BAR_STEM, EXT) + remove_stale(dir, RAM_STEM, EXT)
}

/// Fresh shared files for one run, deleted on drop.
#[derive(Debug)]
pub struct ModelShm {
    files: ModelFiles,
}

impl ModelShm {
    /// Creates new, zero-filled files in `dir`: the BAR (`bar_bytes`, a power of two) and the guest RAM
    /// (`mem_mib` MiB). Stale files of dead runs are removed first.
    pub fn create(dir: &Path, bar_bytes: u64, mem_mib: u32) -> io::Result<ModelShm> {
        if !bar_bytes.is_power_of_two() || bar_bytes < 0x4000 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad BAR size {bar_bytes:#x}")));
        }
        fs::create_dir_all(dir)?;
        remove_stale_files(dir);
        let bar = unique_path(dir, BAR_STEM, EXT);
        let ram = unique_path(dir, RAM_STEM, EXT);
        // From here on the guard deletes whatever was created.
        let shm = ModelShm { files: ModelFiles { bar, bar_bytes, ram } };
        fresh_file(&shm.files.bar, bar_bytes)?;
        fresh_file(&shm.files.ram, u64::from(mem_mib) << 20)?;
        Ok(shm)
    }

    pub fn files(&self) -> &ModelFiles {
        &self.files
    }
}

impl Drop for ModelShm {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.files.bar);
        let _ = fs::remove_file(&self.files.ram);
    }
}

/// A new file of `len` zero bytes: whatever had the name before is removed, and `create_new` (O_EXCL)
/// guarantees nothing else slipped in between.
fn fresh_file(path: &Path, len: u64) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("removing old {}: {e}", path.display()))),
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
    f.set_len(len).map_err(|e| io::Error::new(e.kind(), format!("sizing {}: {e}", path.display())))
}

/// How to start the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCommand {
    /// The `mlx5-model` binary.
    pub binary: PathBuf,
    /// `--trace PATH`.
    pub trace: Option<PathBuf>,
    /// `--udp ADDR`.
    pub udp: Option<String>,
    /// `--control PATH` (the fault-injection control file).
    pub control: Option<PathBuf>,
    /// `--eth-udp LOCAL,PEER`: the port's Ethernet wire, one frame per UDP datagram (the model reads on LOCAL
    /// and sends to PEER, a port of QEMU's hub).
    pub eth_udp: Option<(std::net::SocketAddrV4, std::net::SocketAddrV4)>,
    /// Where the model's stderr goes: a file (created or truncated), or this process's stderr.
    pub log: Option<PathBuf>,
    /// `--vf`: the model plays a ConnectX-5 VF (docs/hca-model.md, "VF personality").
    pub vf: bool,
    /// `--vf-port-reads-refused` (with `vf`): the VF's ACCESS_REGISTER refuses PMTU/PAOS reads too.
    pub vf_port_reads_refused: bool,
}

impl ModelCommand {
    pub fn new(binary: PathBuf) -> Self {
        ModelCommand {
            binary,
            trace: None,
            udp: None,
            control: None,
            eth_udp: None,
            log: None,
            vf: false,
            vf_port_reads_refused: false,
        }
    }

    /// The model's arguments for `files` and a guest of `mem_mib` MiB.
    pub fn args(&self, files: &ModelFiles, mem_mib: u32) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--bar".into(),
            files.bar.clone().into(),
            "--ram".into(),
            files.ram.clone().into(),
            "--bar-size".into(),
            files.bar_bytes.to_string().into(),
            "--ram-size".into(),
            (u64::from(mem_mib) << 20).to_string().into(),
            "--exit-on-stdin-eof".into(),
        ];
        if let Some(t) = &self.trace {
            a.push("--trace".into());
            a.push(t.clone().into());
        }
        if let Some(u) = &self.udp {
            a.push("--udp".into());
            a.push(u.into());
        }
        if let Some((local, peer)) = &self.eth_udp {
            a.push("--eth-udp".into());
            a.push(format!("{local},{peer}").into());
        }
        if let Some(c) = &self.control {
            a.push("--control".into());
            a.push(c.clone().into());
        }
        if self.vf {
            a.push("--vf".into());
            if self.vf_port_reads_refused {
                a.push("--vf-port-reads-refused".into());
            }
        }
        a
    }
}

/// A running model process, stopped (and reaped) on drop.
#[derive(Debug)]
pub struct ModelProcess {
    // Declared before `child`: closing stdin is what asks the model to stop.
    stdin: Option<ChildStdin>,
    child: ChildGuard,
    ready_line: String,
}

impl ModelProcess {
    /// Starts the model for `files` and waits until it reports ready (signature written) or `timeout` passes.
    pub fn spawn(cmd: &ModelCommand, files: &ModelFiles, mem_mib: u32, timeout: Duration) -> io::Result<Self> {
        let mut c = Command::new(&cmd.binary);
        c.args(cmd.args(files, mem_mib)).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        crate::lifetime::die_with_parent(&mut c);
        match &cmd.log {
            Some(p) => {
                let f = fs::File::create(p)
                    .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", p.display())))?;
                c.stderr(f);
            }
            None => {
                c.stderr(std::process::Stdio::inherit());
            }
        }
        let child =
            c.spawn().map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", cmd.binary.display())))?;
        let mut child = ChildGuard::new(child);
        let stdin = child.child_mut().stdin.take();
        let stdout = child.child_mut().stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
        let (tx, rx) = mpsc::channel();
        // Sends the first line, then drains stdout until the model exits so it can never block on the pipe.
        thread::Builder::new().name("mlx5-model-stdout".into()).spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            let _ = io::copy(&mut r, &mut io::sink());
        })?;
        let deadline = Instant::now() + timeout;
        let line: String = rx.recv_timeout(timeout).unwrap_or_default();
        let line = line.trim_end().to_string();
        if !line.starts_with("mlx5-model: ready") {
            let status = child.wait_until(deadline.min(Instant::now() + Duration::from_millis(200)))?;
            let why = match status {
                Some(s) => format!("it exited ({s})"),
                None if line.is_empty() => format!("no ready line within {} s", timeout.as_secs()),
                None => format!("unexpected first line `{line}`"),
            };
            let log = cmd.log.as_ref().map_or(String::new(), |p| format!("; its log: {}", p.display()));
            return Err(io::Error::other(format!("the mlx5 model did not start: {why}{log}")));
        }
        Ok(ModelProcess { stdin, child, ready_line: line })
    }

    /// The model's `mlx5-model: ready ...` line.
    pub fn ready_line(&self) -> &str {
        &self.ready_line
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Asks the model to stop (closes its stdin), waits up to a few seconds, then kills it; reaps it either
    /// way. Returns whether it exited by itself.
    pub fn stop(&mut self) -> io::Result<bool> {
        self.stdin = None;
        let clean = self.child.wait_until(Instant::now() + STOP_GRACE)?.is_some();
        self.child.kill()?;
        Ok(clean)
    }
}

impl Drop for ModelProcess {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = unique_path(&std::env::temp_dir(), &format!("leasebox-model-{name}"), "d");
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn qemu_objects_name_the_files() {
        let f = ModelFiles { bar: "/dev/shm/b,1.shm".into(), bar_bytes: 32 << 20, ram: "/dev/shm/r.shm".into() };
        assert_eq!(f.ram_object(256), "memory-backend-file,id=lbxram,size=256M,share=on,mem-path=/dev/shm/r.shm");
        assert_eq!(f.bar_object(), "memory-backend-file,id=mlx5bar,size=33554432,share=on,mem-path=/dev/shm/b,,1.shm");
        assert_eq!(f.bar_device(), "ivshmem-plain,memdev=mlx5bar");
    }

    #[test]
    fn files_are_fresh_sized_and_removed() {
        let dir = temp_dir("shm");
        // A dead run's leftovers go; another name stays.
        let stale = dir.join(format!("{BAR_STEM}-4294967295-0.{EXT}"));
        let other = dir.join("keep.shm");
        fs::write(&stale, b"old contents").unwrap();
        fs::write(&other, b"x").unwrap();
        let shm = ModelShm::create(&dir, 0x10000, 16).unwrap();
        let f = shm.files().clone();
        assert!(!stale.exists() && other.exists());
        assert_eq!(fs::metadata(&f.bar).unwrap().len(), 0x10000);
        assert_eq!(fs::metadata(&f.ram).unwrap().len(), 16 << 20);
        assert!(fs::read(&f.bar).unwrap().iter().all(|&b| b == 0));
        let again = ModelShm::create(&dir, 0x10000, 16).unwrap();
        assert_ne!(again.files().bar, f.bar);
        drop(shm);
        assert!(!f.bar.exists() && !f.ram.exists());
        drop(again);
        assert!(ModelShm::create(&dir, 3 << 20, 16).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn model_arguments() {
        let f = ModelFiles { bar: "b".into(), bar_bytes: 1 << 25, ram: "r".into() };
        let mut c = ModelCommand::new("mlx5-model".into());
        c.trace = Some("t.jsonl".into());
        c.control = Some("c.txt".into());
        c.eth_udp = Some(("127.0.0.1:5001".parse().unwrap(), "127.0.0.1:5002".parse().unwrap()));
        c.vf = true;
        c.vf_port_reads_refused = true;
        let a: Vec<String> = c.args(&f, 256).into_iter().map(|s| s.into_string().unwrap()).collect();
        assert_eq!(
            a,
            [
                "--bar",
                "b",
                "--ram",
                "r",
                "--bar-size",
                "33554432",
                "--ram-size",
                "268435456",
                "--exit-on-stdin-eof",
                "--trace",
                "t.jsonl",
                "--eth-udp",
                "127.0.0.1:5001,127.0.0.1:5002",
                "--control",
                "c.txt",
                "--vf",
                "--vf-port-reads-refused"
            ]
        );
    }

    /// A stand-in model: a shell script that prints the ready line and waits for stdin to close.
    #[test]
    fn spawn_waits_for_ready_and_stop_closes_stdin() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("proc");
        let f = ModelFiles { bar: dir.join("b"), bar_bytes: 1 << 20, ram: dir.join("r") };
        let good = dir.join("good.sh");
        fs::write(&good, "#!/bin/sh\necho 'mlx5-model: ready bar=x'\ncat >/dev/null\necho bye >&2\n").unwrap();
        let bad = dir.join("bad.sh");
        fs::write(&bad, "#!/bin/sh\necho 'mlx5-model: error: no such file' >&2\nexit 1\n").unwrap();
        for s in [&good, &bad] {
            fs::set_permissions(s, fs::Permissions::from_mode(0o755)).unwrap();
        }
        // A concurrent fork in another test thread may briefly hold a script open for writing (ETXTBSY).
        let spawn = |c: &ModelCommand| {
            for _ in 0..50 {
                match ModelProcess::spawn(c, &f, 16, Duration::from_secs(10)) {
                    Err(e) if e.to_string().contains("busy") => thread::sleep(Duration::from_millis(20)),
                    r => return r,
                }
            }
            panic!("could not start the stand-in model")
        };
        let mut c = ModelCommand::new(good);
        c.log = Some(dir.join("good.log"));
        let t = Instant::now();
        let mut m = spawn(&c).unwrap();
        assert_eq!(m.ready_line(), "mlx5-model: ready bar=x");
        assert!(m.stop().unwrap(), "the model should exit by itself once stdin closes");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(fs::read_to_string(dir.join("good.log")).unwrap().trim(), "bye");
        let mut c = ModelCommand::new(bad);
        c.log = Some(dir.join("bad.log"));
        let e = spawn(&c).unwrap_err().to_string();
        assert!(e.contains("exited") && e.contains("bad.log"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
