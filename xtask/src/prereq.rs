//! Host prerequisites: QEMU, GRUB (both platforms), xorriso, mtools and OVMF. Missing ones are installed with
//! apt-get when running as root on a Debian-like host; otherwise the exact command is printed.
//!
//! The Rust side: the toolchain and components come from `rust-toolchain.toml`; the `x86_64-unknown-none` target
//! is added with rustup here when missing, since rustup does not fetch it by itself when auto-install is off.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::image::KERNEL_TARGET;
use leasebox_qemu::Ovmf;
use leasebox_qemu::process::ChildGuard;

/// How a requirement is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// An executable in `PATH`.
    Exe(&'static str),
    /// A directory, relative to the filesystem root.
    Dir(&'static str),
    /// An OVMF code/vars pair (see `leasebox_qemu::firmware`).
    Ovmf,
    /// A file, relative to the filesystem root.
    File(&'static str),
    /// libclang's shared library (bindgen, for leasectl's verbs backend), under any LLVM version.
    Libclang,
}

/// One requirement and the Debian package that provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub what: &'static str,
    pub probe: Probe,
    pub package: &'static str,
}

pub const REQUIREMENTS: &[Requirement] = &[
    Requirement { what: "qemu-system-x86_64", probe: Probe::Exe("qemu-system-x86_64"), package: "qemu-system-x86" },
    Requirement { what: "grub-mkrescue", probe: Probe::Exe("grub-mkrescue"), package: "grub-common" },
    Requirement { what: "GRUB i386-pc modules", probe: Probe::Dir("usr/lib/grub/i386-pc"), package: "grub-pc-bin" },
    Requirement {
        what: "GRUB x86_64-efi modules",
        probe: Probe::Dir("usr/lib/grub/x86_64-efi"),
        package: "grub-efi-amd64-bin",
    },
    Requirement { what: "xorriso", probe: Probe::Exe("xorriso"), package: "xorriso" },
    Requirement { what: "mformat", probe: Probe::Exe("mformat"), package: "mtools" },
    Requirement { what: "OVMF firmware", probe: Probe::Ovmf, package: "ovmf" },
    // leasectl's verbs backend (`--features verbs`) is built in CI: rdma-core headers, pkg-config and libclang.
    Requirement {
        what: "libibverbs headers",
        probe: Probe::File("usr/include/infiniband/verbs.h"),
        package: "libibverbs-dev",
    },
    Requirement {
        what: "librdmacm headers",
        probe: Probe::File("usr/include/rdma/rdma_cma.h"),
        package: "librdmacm-dev",
    },
    Requirement { what: "pkg-config", probe: Probe::Exe("pkg-config"), package: "pkg-config" },
    Requirement { what: "libclang", probe: Probe::Libclang, package: "libclang-dev" },
];

/// Whether some `libclang*.so*` exists under `root` where Debian puts it.
fn has_libclang(root: &Path) -> bool {
    let in_dir = |d: PathBuf| {
        std::fs::read_dir(d).is_ok_and(|it| {
            it.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libclang") && n.contains(".so")))
        })
    };
    if in_dir(root.join("usr/lib/x86_64-linux-gnu")) {
        return true;
    }
    std::fs::read_dir(root.join("usr/lib")).is_ok_and(|it| {
        it.flatten()
            .any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("llvm-")) && in_dir(e.path().join("lib")))
    })
}

/// apt-get is given this long per command.
const APT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Whether `name` is an executable file in one of the `path_var` directories.
pub fn find_exe(name: &str, path_var: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path_var)
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The requirements not met under `root` with executables searched in `path_var`.
pub fn missing(root: &Path, path_var: &OsStr) -> Vec<Requirement> {
    REQUIREMENTS
        .iter()
        .filter(|r| match r.probe {
            Probe::Exe(name) => find_exe(name, path_var).is_none(),
            Probe::Dir(dir) => !root.join(dir).is_dir(),
            Probe::Ovmf => Ovmf::find_under(root).is_none(),
            Probe::File(f) => !root.join(f).is_file(),
            Probe::Libclang => !has_libclang(root),
        })
        .copied()
        .collect()
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

/// Checks the host and installs what is missing (or explains how).
pub fn ensure() -> Result<(), String> {
    ensure_rust_target()?;
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let root = Path::new("/");
    let missing_now = missing(root, &path_var);
    if missing_now.is_empty() {
        return Ok(());
    }
    let is_root = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| euid_from_status(&s)) == Some(0);
    let has_apt = find_exe("apt-get", &path_var).is_some();
    match plan(&packages(&missing_now), is_root, has_apt) {
        Plan::Instruct(msg) => Err(format!("missing prerequisites: {}\n{msg}", describe(&missing_now))),
        Plan::Install(cmds) => {
            eprintln!("xtask: missing prerequisites: {}; installing", describe(&missing_now));
            for argv in cmds {
                eprintln!("xtask: DEBIAN_FRONTEND=noninteractive {}", argv.join(" "));
                let child = Command::new(&argv[0])
                    .args(&argv[1..])
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .spawn()
                    .map_err(|e| format!("starting {}: {e}", argv[0]))?;
                let mut guard = ChildGuard::new(child);
                let status =
                    guard.wait_until(Instant::now() + APT_TIMEOUT).map_err(|e| e.to_string())?.ok_or_else(|| {
                        format!("`{}` did not finish within {} min", argv.join(" "), APT_TIMEOUT.as_secs() / 60)
                    })?;
                if !status.success() {
                    return Err(format!("`{}` failed ({status})", argv.join(" ")));
                }
            }
            let still = missing(root, &path_var);
            if still.is_empty() {
                eprintln!("xtask: prerequisites installed");
                Ok(())
            } else {
                Err(format!("still missing after apt-get install: {}", describe(&still)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new() -> FakeRoot {
            let p = leasebox_qemu::firmware::unique_path(&std::env::temp_dir(), "xtask-fakeroot", "d");
            fs::create_dir_all(p.join("bin")).unwrap();
            FakeRoot(p)
        }

        fn exe(&self, name: &str, mode: u32) {
            use std::os::unix::fs::PermissionsExt;
            let p = self.0.join("bin").join(name);
            fs::write(&p, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        }

        fn dir(&self, rel: &str) {
            fs::create_dir_all(self.0.join(rel)).unwrap();
        }

        fn file(&self, rel: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"x").unwrap();
        }

        fn path_var(&self) -> std::ffi::OsString {
            std::env::join_paths([self.0.join("nothing-here"), self.0.join("bin")]).unwrap()
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
        let m = missing(&r.0, &r.path_var());
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
                "libclang-dev"
            ]
        );
    }

    #[test]
    fn complete_root_misses_nothing_and_partial_root_names_packages() {
        let r = FakeRoot::new();
        for exe in ["qemu-system-x86_64", "grub-mkrescue", "xorriso", "mformat", "pkg-config"] {
            r.exe(exe, 0o755);
        }
        r.file("usr/include/infiniband/verbs.h");
        r.file("usr/include/rdma/rdma_cma.h");
        r.file("usr/lib/llvm-14/lib/libclang-14.so.1");
        r.dir("usr/lib/grub/i386-pc");
        r.dir("usr/lib/grub/x86_64-efi");
        r.file("usr/share/OVMF/OVMF_CODE_4M.fd");
        r.file("usr/share/OVMF/OVMF_VARS_4M.fd");
        assert_eq!(missing(&r.0, &r.path_var()), vec![]);

        // A non-executable file does not count; neither does half an OVMF pair.
        r.exe("xorriso", 0o644);
        fs::remove_file(r.0.join("usr/share/OVMF/OVMF_VARS_4M.fd")).unwrap();
        fs::remove_dir(r.0.join("usr/lib/grub/x86_64-efi")).unwrap();
        let m = missing(&r.0, &r.path_var());
        assert_eq!(packages(&m), ["grub-efi-amd64-bin", "xorriso", "ovmf"]);

        // The older 2 MiB OVMF pair is accepted too.
        r.file("usr/share/OVMF/OVMF_CODE.fd");
        r.file("usr/share/OVMF/OVMF_VARS.fd");
        assert!(!packages(&missing(&r.0, &r.path_var())).contains(&"ovmf"));
        // An empty PATH finds no executables (qemu, grub-mkrescue, xorriso, mformat, pkg-config), and libclang
        // counts only where Debian puts it.
        assert_eq!(missing(&r.0, OsStr::new("")).len(), 6);
        fs::remove_file(r.0.join("usr/lib/llvm-14/lib/libclang-14.so.1")).unwrap();
        assert!(packages(&missing(&r.0, &r.path_var())).contains(&"libclang-dev"));
        r.file("usr/lib/x86_64-linux-gnu/libclang-16.so.16");
        assert!(!packages(&missing(&r.0, &r.path_var())).contains(&"libclang-dev"));
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
