//! OVMF (UEFI firmware for QEMU) lookup, and the per-run copy of its vars file.
//!
//! Debian 12's `ovmf` package ships `/usr/share/OVMF/OVMF_CODE_4M.fd` + `OVMF_VARS_4M.fd` (and the older 2 MiB
//! `OVMF_CODE.fd` + `OVMF_VARS.fd`). Code and vars must come from the same build size, so they are looked up as
//! pairs. The vars file is writable NVRAM: each run gets a fresh copy so one boot cannot leave boot entries or
//! variables behind for the next.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Directories searched for OVMF, relative to the filesystem root (Debian/Ubuntu first, then Fedora/Arch).
pub const OVMF_DIRS: &[&str] = &["usr/share/OVMF", "usr/share/edk2/ovmf", "usr/share/edk2/x64", "usr/share/ovmf/x64"];
/// (code, vars) file name pairs, preferred first.
pub const OVMF_PAIRS: &[(&str, &str)] =
    &[("OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd"), ("OVMF_CODE.fd", "OVMF_VARS.fd"), ("OVMF_CODE.4m.fd", "OVMF_VARS.4m.fd")];

/// Environment variable naming an OVMF code file; used only together with [`VARS_ENV`].
pub const CODE_ENV: &str = "LEASEBOX_OVMF_CODE";
/// Environment variable naming the vars template that goes with [`CODE_ENV`].
pub const VARS_ENV: &str = "LEASEBOX_OVMF_VARS";

/// A matching OVMF code/vars pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ovmf {
    /// Read-only firmware code (pflash unit 0).
    pub code: PathBuf,
    /// The vars template; never written (copy it with [`Ovmf::fresh_vars`]).
    pub vars_template: PathBuf,
}

impl Ovmf {
    /// Looks for OVMF under `/`. `LEASEBOX_OVMF_CODE` and `LEASEBOX_OVMF_VARS`, when both set, take precedence.
    pub fn find() -> Option<Ovmf> {
        Ovmf::find_with(Path::new("/"), |k| std::env::var_os(k))
    }

    /// [`Ovmf::find`] under `root` with the environment `var` (the prerequisite probe asks the same question).
    pub fn find_with(root: &Path, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<Ovmf> {
        if let (Some(code), Some(vars)) = (var(CODE_ENV), var(VARS_ENV)) {
            let (code, vars) = (PathBuf::from(code), PathBuf::from(vars));
            if code.is_file() && vars.is_file() {
                return Some(Ovmf { code, vars_template: vars });
            }
        }
        Ovmf::find_under(root)
    }

    /// Looks for OVMF under `root` (a fake root in tests).
    pub fn find_under(root: &Path) -> Option<Ovmf> {
        for dir in OVMF_DIRS {
            let dir = root.join(dir);
            for (code, vars) in OVMF_PAIRS {
                let (code, vars) = (dir.join(code), dir.join(vars));
                if code.is_file() && vars.is_file() {
                    return Some(Ovmf { code, vars_template: vars });
                }
            }
        }
        None
    }

    /// Copies the vars template to a new, uniquely named file in `scratch_dir`; the copy is deleted when the
    /// returned guard is dropped.
    pub fn fresh_vars(&self, scratch_dir: &Path) -> io::Result<ScratchFile> {
        fs::create_dir_all(scratch_dir)?;
        let path = unique_path(scratch_dir, "ovmf-vars", "fd");
        fs::copy(&self.vars_template, &path).map_err(|e| {
            io::Error::new(e.kind(), format!("copying {} to {}: {e}", self.vars_template.display(), path.display()))
        })?;
        // The template is often installed read-only; QEMU needs to write the copy.
        let mut perms = fs::metadata(&path)?.permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(&path, perms)?;
        Ok(ScratchFile { path })
    }
}

/// A scratch file deleted on drop.
#[derive(Debug)]
pub struct ScratchFile {
    path: PathBuf,
}

impl ScratchFile {
    /// Takes ownership of an existing file.
    pub fn adopt(path: PathBuf) -> Self {
        ScratchFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// `<dir>/<stem>-<pid>-<n>.<ext>`, unique within this process.
pub fn unique_path(dir: &Path, stem: &str, ext: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{stem}-{}-{n}.{ext}", std::process::id()))
}

/// Removes `<stem>-<pid>-<n>.<ext>` files in `dir` left behind by processes that no longer run (e.g. an
/// interactive run ended with Ctrl-C, which kills the runner before its guards run). Returns how many.
pub fn remove_stale(dir: &Path, stem: &str, ext: &str) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = stale_pid(&name.to_string_lossy(), stem, ext) else {
            continue;
        };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// The pid in a `<stem>-<pid>-<n>.<ext>` name.
fn stale_pid(name: &str, stem: &str, ext: &str) -> Option<u32> {
    let rest = name.strip_prefix(stem)?.strip_prefix('-')?.strip_suffix(ext)?.strip_suffix('.')?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_root(name: &str) -> PathBuf {
        let dir = unique_path(&std::env::temp_dir(), &format!("leasebox-qemu-{name}"), "d");
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn prefers_4m_pair_and_requires_both_halves() {
        let root = temp_root("ovmf");
        assert_eq!(Ovmf::find_under(&root), None);
        let dir = root.join("usr/share/OVMF");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("OVMF_CODE.fd"), b"c").unwrap();
        fs::write(dir.join("OVMF_VARS.fd"), b"v").unwrap();
        fs::write(dir.join("OVMF_CODE_4M.fd"), b"c4").unwrap();
        // A code file without its vars is not a pair.
        assert_eq!(Ovmf::find_under(&root).unwrap().code, dir.join("OVMF_CODE.fd"));
        fs::write(dir.join("OVMF_VARS_4M.fd"), b"v4").unwrap();
        let o = Ovmf::find_under(&root).unwrap();
        assert_eq!(o.code, dir.join("OVMF_CODE_4M.fd"));
        assert_eq!(o.vars_template, dir.join("OVMF_VARS_4M.fd"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn fresh_vars_is_a_writable_copy_removed_on_drop() {
        let root = temp_root("vars");
        let template = root.join("VARS.fd");
        fs::write(&template, b"nvram").unwrap();
        let mut perms = fs::metadata(&template).unwrap().permissions();
        perms.set_readonly(true);
        fs::set_permissions(&template, perms).unwrap();
        let o = Ovmf { code: root.join("CODE.fd"), vars_template: template };
        let scratch = root.join("scratch");
        let a = o.fresh_vars(&scratch).unwrap();
        let b = o.fresh_vars(&scratch).unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(fs::read(a.path()).unwrap(), b"nvram");
        assert!(!fs::metadata(a.path()).unwrap().permissions().readonly());
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        drop(b);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn stale_scratch_files_of_dead_processes_are_removed() {
        assert_eq!(stale_pid("ovmf-vars-123-4.fd", "ovmf-vars", "fd"), Some(123));
        assert_eq!(stale_pid("ovmf-vars-x-4.fd", "ovmf-vars", "fd"), None);
        assert_eq!(stale_pid("other-123-4.fd", "ovmf-vars", "fd"), None);
        let root = temp_root("stale");
        // pid_max on Linux is at most 2^22, so this pid cannot be running.
        let dead = root.join("ovmf-vars-4294967295-0.fd");
        let mine = unique_path(&root, "ovmf-vars", "fd");
        let other = root.join("keep.fd");
        for p in [&dead, &mine, &other] {
            fs::write(p, b"x").unwrap();
        }
        assert_eq!(remove_stale(&root, "ovmf-vars", "fd"), 1);
        assert!(!dead.exists() && mine.exists() && other.exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
