//! Host prerequisites: QEMU, GRUB (both platforms), xorriso, mtools, OVMF, and what leasectl's verbs backend
//! needs to build (rdma-core headers and pkg-config modules, pkg-config, libclang), the fleet tests' etcd,
//! promtool and openssl, and the Debian tools the Soft-RoCE guest is built with (apt-get, apt-cache, dpkg, dpkg-deb, ldd).
//! Missing ones are installed with apt-get when running as root on a Debian-like host; otherwise the
//! exact command is printed.
//!
//! Each probe asks the question its consumer asks, in the consumer's environment: libclang is looked for where
//! bindgen's clang-sys looks, the rdma-core modules are asked of the pkg-config program rdma-sys's build script
//! runs, OVMF is found by the same function the runner uses, and a GRUB platform counts only when the files
//! grub-mkrescue reads from it are there. A probe that says yes when its consumer would fail lets a fresh
//! machine skip an install and fail later in a build step.
//!
//! The Rust side: the toolchain and components come from `rust-toolchain.toml`; the `x86_64-unknown-none` target
//! is added with rustup here when missing, since rustup does not fetch it by itself when auto-install is off.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::image::KERNEL_TARGET;
use leasebox_qemu::Ovmf;
use leasebox_qemu::process::{ChildGuard, run_captured};

/// How a requirement is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// An executable in `PATH`.
    Exe(&'static str),
    /// Files that must all exist, relative to the filesystem root.
    Files(&'static [&'static str]),
    /// An OVMF code/vars pair, found as the runner finds it (`leasebox_qemu::Ovmf::find_with`).
    Ovmf,
    /// The pkg-config program the `pkg-config` crate runs: `$PKG_CONFIG`, else `pkg-config`, else `pkgconf`.
    PkgConfig,
    /// A pkg-config module at this version or newer, as `pkg-config --atleast-version V MODULE` answers it.
    PkgModule { module: &'static str, at_least: &'static str },
    /// A libclang shared library that bindgen (through clang-sys, loading at run time) would load.
    Libclang,
}

/// One requirement and the Debian package that provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub what: &'static str,
    pub probe: Probe,
    pub package: &'static str,
}

/// The files grub-mkrescue reads from `/usr/lib/grub/i386-pc` to make the El Torito (BIOS) image: the
/// module list, the kernel, the decompressor, and the CD and hybrid boot sectors.
const GRUB_I386_PC: &[&str] = &[
    "usr/lib/grub/i386-pc/moddep.lst",
    "usr/lib/grub/i386-pc/kernel.img",
    "usr/lib/grub/i386-pc/lzma_decompress.img",
    "usr/lib/grub/i386-pc/cdboot.img",
    "usr/lib/grub/i386-pc/boot_hybrid.img",
];
/// What it reads from `/usr/lib/grub/x86_64-efi` for the EFI system partition's image.
const GRUB_X86_64_EFI: &[&str] = &["usr/lib/grub/x86_64-efi/moddep.lst", "usr/lib/grub/x86_64-efi/kernel.img"];

pub const REQUIREMENTS: &[Requirement] = &[
    Requirement { what: "qemu-system-x86_64", probe: Probe::Exe("qemu-system-x86_64"), package: "qemu-system-x86" },
    Requirement { what: "grub-mkrescue", probe: Probe::Exe("grub-mkrescue"), package: "grub-common" },
    Requirement { what: "GRUB i386-pc platform", probe: Probe::Files(GRUB_I386_PC), package: "grub-pc-bin" },
    Requirement {
        what: "GRUB x86_64-efi platform",
        probe: Probe::Files(GRUB_X86_64_EFI),
        package: "grub-efi-amd64-bin",
    },
    Requirement { what: "xorriso", probe: Probe::Exe("xorriso"), package: "xorriso" },
    Requirement { what: "mformat", probe: Probe::Exe("mformat"), package: "mtools" },
    Requirement { what: "OVMF firmware", probe: Probe::Ovmf, package: "ovmf" },
    // leasectl's verbs backend (`--features verbs`) is built in CI. rdma-sys's build script asks pkg-config for
    // libibverbs >= 1.8.28 and librdmacm >= 1.2.28, then runs bindgen over these headers.
    Requirement {
        what: "libibverbs headers",
        probe: Probe::Files(&["usr/include/infiniband/verbs.h"]),
        package: "libibverbs-dev",
    },
    Requirement {
        what: "pkg-config module libibverbs >= 1.8.28",
        probe: Probe::PkgModule { module: "libibverbs", at_least: "1.8.28" },
        package: "libibverbs-dev",
    },
    Requirement {
        what: "librdmacm headers",
        probe: Probe::Files(&["usr/include/rdma/rdma_cma.h", "usr/include/rdma/rdma_verbs.h"]),
        package: "librdmacm-dev",
    },
    Requirement {
        what: "pkg-config module librdmacm >= 1.2.28",
        probe: Probe::PkgModule { module: "librdmacm", at_least: "1.2.28" },
        package: "librdmacm-dev",
    },
    Requirement { what: "pkg-config", probe: Probe::PkgConfig, package: "pkg-config" },
    Requirement { what: "libclang", probe: Probe::Libclang, package: "libclang-dev" },
    // The fleet tests and `bench fleet` (docs/fleet.md): a real etcd, started by the tests on loopback, and
    // Prometheus's `promtool`, which checks the registrar's /metrics.
    Requirement { what: "etcd", probe: Probe::Exe("etcd"), package: "etcd-server" },
    Requirement { what: "promtool", probe: Probe::Exe("promtool"), package: "prometheus" },
    // The TLS fleet tests make a throwaway CA and certificates for their etcd with it.
    Requirement { what: "openssl", probe: Probe::Exe("openssl"), package: "openssl" },
    // The Soft-RoCE guest of the rxe-qemu scenario (docs/rxe-guest.md) is built from Debian's packages with these
    // (every Debian system has them; a host without them is told so here rather than midway through a build).
    Requirement { what: "apt-get", probe: Probe::Exe("apt-get"), package: "apt" },
    Requirement { what: "apt-cache", probe: Probe::Exe("apt-cache"), package: "apt" },
    Requirement { what: "dpkg", probe: Probe::Exe("dpkg"), package: "dpkg" },
    Requirement { what: "dpkg-deb", probe: Probe::Exe("dpkg-deb"), package: "dpkg" },
    Requirement { what: "ldd", probe: Probe::Exe("ldd"), package: "libc-bin" },
];

/// The host as the consumers of the prerequisites see it: a filesystem root (`/` but in tests) and the
/// environment they run with. Absolute paths taken from the environment or printed by a program (`PATH`,
/// `LIBCLANG_PATH`, `llvm-config --prefix`) are used as they are.
#[derive(Clone, Debug)]
pub struct Host {
    pub root: PathBuf,
    vars: BTreeMap<OsString, OsString>,
}

impl Host {
    /// This machine, with this process's environment (which cargo, bindgen and pkg-config inherit from us).
    pub fn current() -> Host {
        Host::new("/", std::env::vars_os())
    }

    pub fn new(
        root: impl Into<PathBuf>,
        vars: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
    ) -> Host {
        Host { root: root.into(), vars: vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect() }
    }

    /// A variable's value; an empty one counts as unset.
    pub fn var(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(name)).map(OsString::as_os_str).filter(|v| !v.is_empty())
    }

    fn path_var(&self) -> &OsStr {
        self.var("PATH").unwrap_or_default()
    }

    /// `name` as a shell would find it: a name with a slash as it is, others in `PATH`.
    pub fn exe(&self, name: &OsStr) -> Option<PathBuf> {
        if Path::new(name).components().count() > 1 {
            return is_executable(Path::new(name)).then(|| PathBuf::from(name));
        }
        find_exe(name, self.path_var())
    }

    /// Runs `program` with `args` in this environment; its stdout when it exits 0.
    /// A probe tool that hangs (a broken `llvm-config` wrapper) is killed after [`PROBE_TIMEOUT`] and counts
    /// as failed.
    fn run(&self, program: &Path, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(program);
        cmd.args(args).env_clear().envs(&self.vars);
        let out = run_captured(&mut cmd, PROBE_TIMEOUT).ok()?;
        out.success().then_some(out.stdout)
    }

    /// Whether `requirement` is met.
    pub fn has(&self, requirement: &Requirement) -> bool {
        match requirement.probe {
            Probe::Exe(name) => self.exe(OsStr::new(name)).is_some(),
            Probe::Files(files) => files.iter().all(|f| self.root.join(f).is_file()),
            Probe::Ovmf => Ovmf::find_with(&self.root, |k| self.var(k).map(OsStr::to_os_string)).is_some(),
            Probe::PkgConfig => self.pkg_config().is_some(),
            Probe::PkgModule { module, at_least } => {
                self.pkg_config().is_some_and(|pc| self.run(&pc, &["--atleast-version", at_least, module]).is_some())
            }
            Probe::Libclang => !libclang::find(self).is_empty(),
        }
    }

    /// The program the `pkg-config` crate (0.3, building for this host) runs: `$PKG_CONFIG` when set, else
    /// `pkg-config`, falling back to `pkgconf`.
    fn pkg_config(&self) -> Option<PathBuf> {
        match self.var("PKG_CONFIG") {
            Some(p) => self.exe(p),
            None => self.exe(OsStr::new("pkg-config")).or_else(|| self.exe(OsStr::new("pkgconf"))),
        }
    }
}

/// Where bindgen finds libclang: the search of clang-sys 1.x (`build/common.rs`, `build/dynamic.rs`) when it
/// loads libclang at run time on Linux, which is how bindgen uses it here (its default `runtime` feature).
pub mod libclang {
    use super::Host;
    use std::io::Read;
    use std::path::{Path, PathBuf};

    /// File-name patterns, in clang-sys's order.
    pub const NAMES: &[&str] = &["libclang.so", "libclang-*.so", "libclang.so.*", "libclang-*.so.*"];
    /// Directory patterns searched after `llvm-config --prefix`, `LD_LIBRARY_PATH` and `LIBRARY_PATH`.
    pub const DIRS: &[&str] = &[
        "usr/local/llvm*/lib*",
        "usr/local/lib*/*/*",
        "usr/local/lib*/*",
        "usr/local/lib*",
        "usr/lib*/*/*",
        "usr/lib*/*",
        "usr/lib*",
    ];

    /// What a person is told when none is found.
    pub const WHERE: &str = "bindgen (clang-sys) looks for libclang.so, libclang-*.so, libclang.so.* or \
        libclang-*.so.* (a 64-bit ELF; libclang-cpp does not count) only in $LIBCLANG_PATH when that is set, \
        otherwise in `llvm-config --prefix`/{bin,lib,lib64}, $LD_LIBRARY_PATH, $LIBRARY_PATH, \
        /usr/local/llvm*/lib*, /usr/local/lib* and /usr/lib* (two levels down)";

    fn glob(pattern: &Path) -> Vec<PathBuf> {
        let opts = glob::MatchOptions { require_literal_separator: true, ..glob::MatchOptions::new() };
        let Some(p) = pattern.to_str() else { return Vec::new() };
        glob::glob_with(p, opts).map(|it| it.flatten().collect()).unwrap_or_default()
    }

    /// Escapes `dir` for a glob pattern, then joins `pattern`.
    fn under(dir: &Path, pattern: &str) -> PathBuf {
        Path::new(&glob::Pattern::escape(&dir.to_string_lossy())).join(pattern)
    }

    /// The files in `dir` whose names match [`NAMES`], less `libclang-cpp` (which those patterns also match).
    fn in_dir(dir: &Path) -> Vec<PathBuf> {
        NAMES
            .iter()
            .flat_map(|n| glob(&under(dir, n)))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| !n.contains("-cpp.")))
            .collect()
    }

    /// Whether `path` is a 64-bit ELF file (clang-sys rejects anything else for a 64-bit target).
    pub fn is_elf64(path: &Path) -> bool {
        let mut head = [0u8; 5];
        std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && head == *b"\x7fELF\x02"
    }

    /// The directories searched, in clang-sys's order, when `LIBCLANG_PATH` is not set.
    fn dirs(host: &Host) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        let llvm_config = host.var("LLVM_CONFIG_PATH").unwrap_or("llvm-config".as_ref());
        let out = host.exe(llvm_config).and_then(|exe| host.run(&exe, &["--prefix"]));
        if let Some(prefix) = out.as_deref().and_then(|o| o.lines().next()) {
            dirs.extend(["bin", "lib", "lib64"].map(|d| Path::new(prefix).join(d)));
        }
        for var in ["LD_LIBRARY_PATH", "LIBRARY_PATH"] {
            if let Some(v) = host.var(var) {
                dirs.extend(std::env::split_paths(v));
            }
        }
        for d in DIRS {
            dirs.extend(glob(&under(&host.root, d)).into_iter().filter(|p| p.is_dir()));
        }
        dirs
    }

    /// Every libclang clang-sys would accept, best place first (empty: bindgen fails with "Unable to find
    /// libclang").
    pub fn find(host: &Host) -> Vec<PathBuf> {
        let found = match host.var("LIBCLANG_PATH").map(Path::new) {
            // Only there: a file that one of the patterns matches in its directory, or a directory.
            Some(p) => match (p.parent(), p.file_name()) {
                (Some(dir), Some(name)) if in_dir(dir).iter().any(|f| f.file_name() == Some(name)) => {
                    vec![p.to_path_buf()]
                }
                _ => in_dir(p),
            },
            None => dirs(host).iter().flat_map(|d| in_dir(d)).collect(),
        };
        let mut valid: Vec<PathBuf> = Vec::new();
        for p in found {
            // A directory can come up twice (llvm-config's prefix is under /usr/lib too): once is enough.
            if is_elf64(&p) && !valid.contains(&p) {
                valid.push(p);
            }
        }
        valid
    }
}

/// A probe's tool (`pkg-config`, `llvm-config`) is given this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// apt-get is given this long per command.
const APT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `name` is an executable file in one of the `path_var` directories.
pub fn find_exe(name: impl AsRef<OsStr>, path_var: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var).map(|d| d.join(name.as_ref())).find(|p| is_executable(p))
}

/// The requirements `host` does not meet.
pub fn missing(host: &Host) -> Vec<Requirement> {
    REQUIREMENTS.iter().filter(|r| !host.has(r)).copied().collect()
}

/// The packages for `missing`, each once, in order.
pub fn packages(missing: &[Requirement]) -> Vec<&'static str> {
    let mut p: Vec<&'static str> = Vec::new();
    for r in missing {
        if !p.contains(&r.package) {
            p.push(r.package);
        }
    }
    p
}

/// The effective uid from `/proc/self/status` text (`Uid: real effective saved fs`).
pub fn euid_from_status(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// What to do about missing packages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Run these commands (argv), with `DEBIAN_FRONTEND=noninteractive`.
    Install(Vec<Vec<String>>),
    /// Tell the user to run this and stop.
    Instruct(String),
}

pub fn plan(packages: &[&str], is_root: bool, has_apt: bool) -> Plan {
    let list = packages.join(" ");
    if is_root && has_apt {
        let mut install: Vec<String> = ["apt-get", "install", "-y"].iter().map(|s| s.to_string()).collect();
        install.extend(packages.iter().map(|s| s.to_string()));
        Plan::Install(vec![vec!["apt-get".into(), "update".into()], install])
    } else if has_apt {
        Plan::Instruct(format!(
            "run: sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y {list}"
        ))
    } else {
        Plan::Instruct(format!(
            "no apt-get on this host; install the equivalents of these Debian packages: {list}\n\
             (on Debian/Ubuntu: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y {list})"
        ))
    }
}

fn describe(missing: &[Requirement]) -> String {
    missing.iter().map(|r| format!("{} ({})", r.what, r.package)).collect::<Vec<_>>().join(", ")
}

impl Requirement {
    /// Where, or how, the probe looked: for the message when a requirement is still missing after an install.
    pub fn looked_for(&self) -> String {
        match self.probe {
            Probe::Exe(name) => format!("`{name}` in PATH"),
            Probe::Files(files) => files.iter().map(|f| format!("/{f}")).collect::<Vec<_>>().join(", "),
            Probe::Ovmf => format!(
                "${} + ${}, else a code/vars pair in /{}",
                leasebox_qemu::firmware::CODE_ENV,
                leasebox_qemu::firmware::VARS_ENV,
                leasebox_qemu::firmware::OVMF_DIRS.join(", /")
            ),
            Probe::PkgConfig => "$PKG_CONFIG, else `pkg-config` or `pkgconf` in PATH".into(),
            Probe::PkgModule { module, at_least } => {
                format!("`pkg-config --atleast-version {at_least} {module}` (PKG_CONFIG_PATH as set)")
            }
            Probe::Libclang => libclang::WHERE.into(),
        }
    }
}

/// Adds the kernel's Rust target when rustup lacks it: with auto-install off (RUSTUP_AUTO_INSTALL=0) rustup
/// does not fetch the targets rust-toolchain.toml lists by itself.
fn ensure_rust_target() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("running rustup (needed for the {KERNEL_TARGET} target): {e}"))?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == KERNEL_TARGET) {
        return Ok(());
    }
    eprintln!("xtask: rustup target add {KERNEL_TARGET}");
    let status = Command::new("rustup")
        .args(["target", "add", KERNEL_TARGET])
        .status()
        .map_err(|e| format!("running rustup target add: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`rustup target add {KERNEL_TARGET}` failed ({status})")) }
}

/// Runs one install command (argv) with `DEBIAN_FRONTEND=noninteractive`.
fn run_install(argv: &[String]) -> Result<(), String> {
    eprintln!("xtask: DEBIAN_FRONTEND=noninteractive {}", argv.join(" "));
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .spawn()
        .map_err(|e| format!("starting {}: {e}", argv[0]))?;
    let mut guard = ChildGuard::new(child);
    let status = guard
        .wait_until(Instant::now() + APT_TIMEOUT)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("`{}` did not finish within {} min", argv.join(" "), APT_TIMEOUT.as_secs() / 60))?;
    if status.success() { Ok(()) } else { Err(format!("`{}` failed ({status})", argv.join(" "))) }
}

/// Checks the host and installs what is missing (or explains how).
pub fn ensure() -> Result<(), String> {
    ensure_rust_target()?;
    let host = Host::current();
    let is_root = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| euid_from_status(&s)) == Some(0);
    let has_apt = host.exe(OsStr::new("apt-get")).is_some();
    ensure_on(&host, is_root, has_apt, run_install)
}

/// [`ensure`] on `host`, with `install` running each install command. After installing, every requirement is
/// probed again: one still missing stops here, named with where its probe looked, rather than failing a later
/// build step.
pub fn ensure_on(
    host: &Host,
    is_root: bool,
    has_apt: bool,
    mut install: impl FnMut(&[String]) -> Result<(), String>,
) -> Result<(), String> {
    let missing_now = missing(host);
    if missing_now.is_empty() {
        return Ok(());
    }
    match plan(&packages(&missing_now), is_root, has_apt) {
        Plan::Instruct(msg) => Err(format!("missing prerequisites: {}\n{msg}", describe(&missing_now))),
        Plan::Install(cmds) => {
            eprintln!("xtask: missing prerequisites: {}; installing", describe(&missing_now));
            for argv in cmds {
                install(&argv)?;
            }
            let still = missing(host);
            if still.is_empty() {
                eprintln!("xtask: prerequisites installed");
                return Ok(());
            }
            let detail: Vec<String> = still
                .iter()
                .map(|r| format!("  {} (package {}): looked for {}", r.what, r.package, r.looked_for()))
                .collect();
            Err(format!(
                "still missing after apt-get install: {}\n{}\nstopping here: the steps that need them would fail",
                describe(&still),
                detail.join("\n")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A 64-bit ELF header's first bytes: enough for clang-sys's check, and for ours.
    const ELF64: &[u8] = b"\x7fELF\x02\x01\x01\x00";
    const ELF32: &[u8] = b"\x7fELF\x01\x01\x01\x00";

    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new() -> FakeRoot {
            let p = leasebox_qemu::firmware::unique_path(&std::env::temp_dir(), "xtask-fakeroot", "d");
            fs::create_dir_all(p.join("bin")).unwrap();
            FakeRoot(p)
        }

        fn exe(&self, name: &str, mode: u32) {
            self.script(name, "", mode);
        }

        /// `bin/NAME`, a shell script with `body`.
        fn script(&self, name: &str, body: &str, mode: u32) {
            use std::os::unix::fs::PermissionsExt;
            let p = self.0.join("bin").join(name);
            fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        }

        fn dir(&self, rel: &str) {
            fs::create_dir_all(self.0.join(rel)).unwrap();
        }

        fn write(&self, rel: &str, bytes: &[u8]) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, bytes).unwrap();
        }

        fn file(&self, rel: &str) {
            self.write(rel, b"x");
        }

        fn remove(&self, rel: &str) {
            fs::remove_file(self.0.join(rel)).unwrap();
        }

        fn path_var(&self) -> OsString {
            std::env::join_paths([self.0.join("nothing-here"), self.0.join("bin")]).unwrap()
        }

        /// The host with PATH on the fake `bin/` and `more` variables besides.
        fn host_with(&self, more: &[(&str, &OsStr)]) -> Host {
            let mut vars = vec![(OsString::from("PATH"), self.path_var())];
            vars.extend(more.iter().map(|(k, v)| (OsString::from(k), v.to_os_string())));
            Host::new(&self.0, vars)
        }

        fn host(&self) -> Host {
            self.host_with(&[])
        }

        /// A pkg-config that knows the modules whose `.pc` files exist under `pc/` (any version).
        fn fake_pkg_config(&self, name: &str) {
            let pc = self.0.join("pc");
            self.script(name, &format!("for m; do :; done; test -f \"{}/$m.pc\"", pc.display()), 0o755);
        }

        /// Everything a complete host has, libclang where Debian's libclang1-14 and libclang-14-dev put it.
        fn complete(&self) {
            for exe in [
                "qemu-system-x86_64",
                "grub-mkrescue",
                "xorriso",
                "mformat",
                "etcd",
                "promtool",
                "openssl",
                "apt-get",
                "apt-cache",
                "dpkg",
                "dpkg-deb",
                "ldd",
            ] {
                self.exe(exe, 0o755);
            }
            self.fake_pkg_config("pkg-config");
            self.file("pc/libibverbs.pc");
            self.file("pc/librdmacm.pc");
            self.file("usr/include/infiniband/verbs.h");
            self.file("usr/include/rdma/rdma_cma.h");
            self.file("usr/include/rdma/rdma_verbs.h");
            self.write("usr/lib/llvm-14/lib/libclang-14.so.1", ELF64);
            for f in GRUB_I386_PC.iter().chain(GRUB_X86_64_EFI) {
                self.file(f);
            }
            self.file("usr/share/OVMF/OVMF_CODE_4M.fd");
            self.file("usr/share/OVMF/OVMF_VARS_4M.fd");
        }

        /// The near-misses a fresh Debian 12 machine of this project's kind starts with: llvm-14 (with
        /// `llvm-config`), libclang-cpp14, libLLVM 14 and 15; no libclang.
        fn fresh_debian_llvm(&self) {
            let prefix = self.0.join("usr/lib/llvm-14");
            self.script("llvm-config", &format!("echo {}", prefix.display()), 0o755);
            self.write("usr/lib/llvm-14/bin/llvm-config", ELF64);
            self.write("usr/lib/llvm-14/lib/libclang-cpp.so.14", ELF64);
            self.write("usr/lib/llvm-14/lib/libLLVM-14.so", ELF64);
            self.write("usr/lib/llvm-14/lib/libLLVM-14.so.1", ELF64);
            self.dir("usr/lib/llvm-14/include/clang-c");
            self.dir("usr/lib/llvm-14/lib/cmake/llvm");
            self.write("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14", ELF64);
            self.write("usr/lib/x86_64-linux-gnu/libLLVM-14.so.1", ELF64);
            self.write("usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", ELF64);
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn empty_root_misses_everything() {
        let r = FakeRoot::new();
        let m = missing(&r.host());
        assert_eq!(m.len(), REQUIREMENTS.len());
        assert_eq!(
            packages(&m),
            [
                "qemu-system-x86",
                "grub-common",
                "grub-pc-bin",
                "grub-efi-amd64-bin",
                "xorriso",
                "mtools",
                "ovmf",
                "libibverbs-dev",
                "librdmacm-dev",
                "pkg-config",
                "libclang-dev",
                "etcd-server",
                "prometheus",
                "openssl",
                "apt",
                "dpkg",
                "libc-bin"
            ]
        );
    }

    #[test]
    fn complete_root_misses_nothing_and_partial_root_names_packages() {
        let r = FakeRoot::new();
        r.complete();
        assert_eq!(missing(&r.host()), vec![]);

        // A non-executable file does not count; neither does half an OVMF pair.
        r.exe("xorriso", 0o644);
        r.remove("usr/share/OVMF/OVMF_VARS_4M.fd");
        assert_eq!(packages(&missing(&r.host())), ["xorriso", "ovmf"]);

        // The older 2 MiB OVMF pair is accepted too, and so is a pair named in the runner's variables.
        r.file("usr/share/OVMF/OVMF_CODE.fd");
        r.file("usr/share/OVMF/OVMF_VARS.fd");
        assert!(!packages(&missing(&r.host())).contains(&"ovmf"));
        r.remove("usr/share/OVMF/OVMF_CODE.fd");
        r.file("elsewhere/code.fd");
        r.file("elsewhere/vars.fd");
        assert!(packages(&missing(&r.host())).contains(&"ovmf"));
        let (code, vars) = (r.0.join("elsewhere/code.fd"), r.0.join("elsewhere/vars.fd"));
        let h = r.host_with(&[("LEASEBOX_OVMF_CODE", code.as_os_str()), ("LEASEBOX_OVMF_VARS", vars.as_os_str())]);
        assert!(!packages(&missing(&h)).contains(&"ovmf"));

        // An empty PATH finds no executables: qemu, grub-mkrescue, xorriso, mformat, pkg-config, etcd, promtool,
        // openssl, and with pkg-config gone, neither rdma-core module can be confirmed.
        let none = Host::new(&r.0, [("PATH", "")]);
        assert_eq!(
            packages(&missing(&none)),
            [
                "qemu-system-x86",
                "grub-common",
                "xorriso",
                "mtools",
                "ovmf",
                "libibverbs-dev",
                "librdmacm-dev",
                "pkg-config",
                "etcd-server",
                "prometheus",
                "openssl",
                "apt",
                "dpkg",
                "libc-bin"
            ]
        );
    }

    #[test]
    fn a_grub_platform_counts_only_with_the_files_grub_mkrescue_reads() {
        let r = FakeRoot::new();
        r.complete();
        // An empty platform directory (a half-removed package) is not a platform.
        fs::remove_dir_all(r.0.join("usr/lib/grub/x86_64-efi")).unwrap();
        r.dir("usr/lib/grub/x86_64-efi");
        assert_eq!(packages(&missing(&r.host())), ["grub-efi-amd64-bin"]);
        r.remove("usr/lib/grub/i386-pc/cdboot.img");
        assert_eq!(packages(&missing(&r.host())), ["grub-pc-bin", "grub-efi-amd64-bin"]);
    }

    #[test]
    fn rdma_core_modules_are_asked_of_the_pkg_config_the_crate_runs() {
        let r = FakeRoot::new();
        r.complete();
        // Headers present but no .pc file: rdma-sys's pkg-config probe would fail.
        r.remove("pc/librdmacm.pc");
        assert_eq!(packages(&missing(&r.host())), ["librdmacm-dev"]);
        r.file("pc/librdmacm.pc");
        // Only `pkgconf` installed: the crate falls back to it.
        r.remove("bin/pkg-config");
        assert_eq!(packages(&missing(&r.host())), ["libibverbs-dev", "librdmacm-dev", "pkg-config"]);
        r.fake_pkg_config("pkgconf");
        assert_eq!(missing(&r.host()), vec![]);
        // $PKG_CONFIG names the program; one that is not there is not replaced by another.
        let gone = r.0.join("bin/no-such-pkg-config");
        assert_eq!(
            packages(&missing(&r.host_with(&[("PKG_CONFIG", gone.as_os_str())]))),
            ["libibverbs-dev", "librdmacm-dev", "pkg-config"]
        );
        // A missing header is missing whatever pkg-config says.
        r.remove("usr/include/rdma/rdma_verbs.h");
        assert_eq!(packages(&missing(&r.host())), ["librdmacm-dev"]);
    }

    #[test]
    fn libclang_near_misses_of_a_fresh_machine_count_as_missing() {
        let r = FakeRoot::new();
        r.fresh_debian_llvm();
        let h = r.host();
        assert_eq!(libclang::find(&h), Vec::<PathBuf>::new());
        assert!(packages(&missing(&h)).contains(&"libclang-dev"));

        // Not an ELF, or a 32-bit one, is rejected as clang-sys rejects it.
        r.file("usr/lib/x86_64-linux-gnu/libclang.so");
        r.write("usr/lib/i386-linux-gnu/libclang-14.so.1", ELF32);
        assert_eq!(libclang::find(&h), Vec::<PathBuf>::new());

        // What libclang1-14 installs is found, through llvm-config's prefix and in the multiarch directory.
        r.write("usr/lib/llvm-14/lib/libclang.so.1", ELF64);
        r.write("usr/lib/x86_64-linux-gnu/libclang-14.so.14", ELF64);
        assert_eq!(
            libclang::find(&h),
            [r.0.join("usr/lib/llvm-14/lib/libclang.so.1"), r.0.join("usr/lib/x86_64-linux-gnu/libclang-14.so.14")]
        );
        assert!(!packages(&missing(&h)).contains(&"libclang-dev"));

        // LIBCLANG_PATH, when set, is the only place clang-sys looks: a directory without it means missing.
        let empty = r.0.join("opt/empty");
        r.dir("opt/empty");
        assert_eq!(libclang::find(&r.host_with(&[("LIBCLANG_PATH", empty.as_os_str())])), Vec::<PathBuf>::new());
        // It may name the file itself, or its directory.
        let file = r.0.join("opt/llvm/libclang-17.so");
        r.write("opt/llvm/libclang-17.so", ELF64);
        assert_eq!(libclang::find(&r.host_with(&[("LIBCLANG_PATH", file.as_os_str())])), std::slice::from_ref(&file));
        let dir = r.0.join("opt/llvm");
        assert_eq!(libclang::find(&r.host_with(&[("LIBCLANG_PATH", dir.as_os_str())])), [file]);
    }

    #[test]
    fn libclang_only_in_a_search_variable_directory() {
        let r = FakeRoot::new();
        r.write("opt/clang/lib/libclang.so", ELF64);
        assert_eq!(libclang::find(&r.host()), Vec::<PathBuf>::new());
        let dir = r.0.join("opt/clang/lib");
        for var in ["LD_LIBRARY_PATH", "LIBRARY_PATH"] {
            assert_eq!(libclang::find(&r.host_with(&[(var, dir.as_os_str())])), [dir.join("libclang.so")], "{var}");
        }
        // Under /usr/local/llvm*/lib*, and not deeper than clang-sys looks in /usr/lib.
        r.write("usr/local/llvm18/lib64/libclang-18.so", ELF64);
        r.write("usr/lib/a/b/c/libclang.so", ELF64);
        assert_eq!(libclang::find(&r.host()), [r.0.join("usr/local/llvm18/lib64/libclang-18.so")]);
    }

    #[test]
    fn after_an_install_that_did_not_deliver_it_stops_naming_what_is_missing() {
        let r = FakeRoot::new();
        r.complete();
        r.remove("usr/lib/llvm-14/lib/libclang-14.so.1");
        r.fresh_debian_llvm();
        let mut ran = Vec::new();
        // The "install" brings libclang-cpp only, as if the wrong package had been installed.
        let err = ensure_on(&r.host(), true, true, |argv| {
            ran.push(argv.join(" "));
            r.write("usr/lib/llvm-14/lib/libclang-cpp.so.15", ELF64);
            Ok(())
        })
        .unwrap_err();
        assert_eq!(ran, ["apt-get update", "apt-get install -y libclang-dev"]);
        assert!(err.starts_with("still missing after apt-get install: libclang (libclang-dev)"), "{err}");
        assert!(err.contains("LIBCLANG_PATH") && err.contains("libclang-cpp does not count"), "{err}");

        // An install that delivers passes; nothing to install runs nothing.
        let ok = ensure_on(&r.host(), true, true, |_| {
            r.write("usr/lib/llvm-14/lib/libclang.so.1", ELF64);
            Ok(())
        });
        assert_eq!(ok, Ok(()));
        assert_eq!(ensure_on(&r.host(), true, true, |_| Err("ran".into())), Ok(()));
        // Not root: the command to run, and nothing run.
        r.remove("usr/lib/llvm-14/lib/libclang.so.1");
        let err = ensure_on(&r.host(), false, true, |_| Err("ran".into())).unwrap_err();
        assert!(err.contains("sudo DEBIAN_FRONTEND=noninteractive apt-get install -y libclang-dev"), "{err}");
    }

    #[test]
    fn uid_parsing() {
        let s = "Name:\tcargo\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(euid_from_status(s), Some(0));
        assert_eq!(euid_from_status("Uid:\t0\t1000\t1000\t1000\n"), Some(1000));
        assert_eq!(euid_from_status("nothing"), None);
    }

    #[test]
    fn plans() {
        match plan(&["ovmf", "mtools"], true, true) {
            Plan::Install(cmds) => {
                assert_eq!(cmds[0], ["apt-get", "update"]);
                assert_eq!(cmds[1], ["apt-get", "install", "-y", "ovmf", "mtools"]);
            }
            other => panic!("{other:?}"),
        }
        match plan(&["ovmf"], false, true) {
            Plan::Instruct(m) => {
                assert!(m.contains("sudo DEBIAN_FRONTEND=noninteractive apt-get install -y ovmf"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        match plan(&["ovmf"], true, false) {
            Plan::Instruct(m) => assert!(m.contains("no apt-get")),
            other => panic!("{other:?}"),
        }
    }
}
