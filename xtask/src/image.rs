//! Building the bootable artifacts: the kernel ELF and the GRUB ISOs, under `target/leasebox/`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use leasebox_qemu::iso::IsoSpec;

/// The kernel's target triple.
pub const KERNEL_TARGET: &str = "x86_64-unknown-none";

/// Environment variable naming a prebuilt kernel ELF to use instead of building `leasebox-image`.
pub const PREBUILT_ENV: &str = "LEASEBOX_KERNEL_ELF";

/// Where everything is.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The workspace root.
    pub root: PathBuf,
    /// Cargo's target directory.
    pub target: PathBuf,
    /// `target/leasebox/`: images, ISOs, scratch files, scenario logs.
    pub out: PathBuf,
}

impl Paths {
    /// From this crate's location (`<root>/xtask`) and `CARGO_TARGET_DIR`.
    pub fn discover() -> Paths {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).to_path_buf();
        Paths::new(root, std::env::var_os("CARGO_TARGET_DIR"))
    }

    pub fn new(root: PathBuf, target_dir: Option<OsString>) -> Paths {
        let target = match target_dir {
            Some(t) if !t.is_empty() => root.join(t),
            _ => root.join("target"),
        };
        let out = target.join("leasebox");
        Paths { root, target, out }
    }

    /// What cargo produces.
    pub fn built_kernel(&self) -> PathBuf {
        self.target.join(KERNEL_TARGET).join("release").join("leasebox")
    }

    pub fn elf(&self) -> PathBuf {
        self.out.join("leasebox.elf")
    }

    pub fn iso(&self) -> PathBuf {
        self.out.join("leasebox.iso")
    }

    /// The ISO with `run`'s kernel arguments baked in.
    pub fn run_iso(&self) -> PathBuf {
        self.out.join("run.iso")
    }

    /// The kernel built with the `fence-test` feature (only for the `lease-qemu` test step).
    pub fn fence_test_elf(&self) -> PathBuf {
        self.out.join("leasebox-fence-test.elf")
    }

    /// Its own cargo target directory: the feature changes the binary `leasebox`, and sharing the directory
    /// would let one build overwrite the other's output before it is copied.
    pub fn fence_test_target(&self) -> PathBuf {
        self.target.join("fence-test")
    }
}

/// The cargo that runs us (so the same toolchain builds the kernel).
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// `cargo build -p leasebox-image --release --target x86_64-unknown-none`, then copies the result to
/// `target/leasebox/leasebox.elf` (only when it changed, so ISOs are not rebuilt needlessly).
///
/// With `LEASEBOX_KERNEL_ELF=<path>` in the environment, that prebuilt ELF is used instead of building.
/// `.ci/run` unsets it: CI tests the kernel its checkout builds. `cargo xtask test` names it in its summary.
pub fn build_kernel(p: &Paths) -> Result<PathBuf, String> {
    let built = match prebuilt_kernel() {
        Some(prebuilt) => {
            eprintln!("xtask: using {} from {PREBUILT_ENV} instead of building the kernel", prebuilt.display());
            prebuilt
        }
        None => cargo_build_kernel(p)?,
    };
    let bytes = fs::read(&built).map_err(|e| format!("reading {}: {e}", built.display()))?;
    fs::create_dir_all(&p.out).map_err(|e| format!("creating {}: {e}", p.out.display()))?;
    let elf = p.elf();
    if fs::read(&elf).ok().as_deref() != Some(bytes.as_slice()) {
        fs::write(&elf, &bytes).map_err(|e| format!("writing {}: {e}", elf.display()))?;
    }
    Ok(elf)
}

/// The prebuilt kernel ELF named by `LEASEBOX_KERNEL_ELF`, if set (and not empty).
pub fn prebuilt_kernel() -> Option<PathBuf> {
    std::env::var_os(PREBUILT_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// `cargo build -p leasebox-image --features fence-test` into its own target directory, copied to
/// `target/leasebox/leasebox-fence-test.elf`: revokes corrupt the MKEY index when booted with `fence_test=on`.
pub fn build_fence_test_kernel(p: &Paths) -> Result<PathBuf, String> {
    let target = p.fence_test_target();
    cargo_build_kernel_in(p, &target, &["--features", "fence-test"])?;
    let built = target.join(KERNEL_TARGET).join("release").join("leasebox");
    fs::create_dir_all(&p.out).map_err(|e| format!("creating {}: {e}", p.out.display()))?;
    let elf = p.fence_test_elf();
    fs::copy(&built, &elf).map_err(|e| format!("copying {} to {}: {e}", built.display(), elf.display()))?;
    Ok(elf)
}

fn cargo_build_kernel(p: &Paths) -> Result<PathBuf, String> {
    cargo_build_kernel_in(p, &p.target, &[])?;
    Ok(p.built_kernel())
}

/// Builds the kernel into `target_dir` with `extra` cargo arguments.
fn cargo_build_kernel_in(p: &Paths, target_dir: &Path, extra: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(&p.root).args(["build", "-p", "leasebox-image", "--release", "--target", KERNEL_TARGET]);
    cmd.args(extra);
    if target_dir != p.target {
        cmd.arg("--target-dir").arg(target_dir);
    }
    // RUSTFLAGS from the environment would replace `-C relocation-model=static` from .cargo/config.toml and
    // break the link of the 32-bit multiboot entry.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"] {
        if std::env::var_os(var).is_some() {
            eprintln!("xtask: ignoring {var} for the kernel build (it would replace .cargo/config.toml's rustflags)");
            cmd.env_remove(var);
        }
    }
    let status = cmd.status().map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("kernel build failed ({status})"));
    }
    Ok(())
}

/// Builds (if stale) the ISO at `iso` with `kernel_args` baked into grub.cfg.
pub fn build_iso(p: &Paths, iso: &Path, kernel_args: &str) -> Result<PathBuf, String> {
    let spec = IsoSpec::new(&p.elf(), iso, kernel_args);
    if spec.build_if_stale()? {
        eprintln!("xtask: built {}", iso.display());
    }
    Ok(iso.to_path_buf())
}

/// The kernel and the default ISO.
pub fn build_all(p: &Paths) -> Result<(), String> {
    build_kernel(p)?;
    build_iso(p, &p.iso(), "")?;
    Ok(())
}

/// `path (N bytes, X KiB)`.
pub fn describe(path: &Path) -> String {
    match fs::metadata(path) {
        Ok(m) => format!("{} ({} bytes, {:.1} KiB)", path.display(), m.len(), m.len() as f64 / 1024.0),
        Err(e) => format!("{} ({e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = Paths::new("/ws".into(), None);
        assert_eq!(p.elf(), Path::new("/ws/target/leasebox/leasebox.elf"));
        assert_eq!(p.iso(), Path::new("/ws/target/leasebox/leasebox.iso"));
        assert_eq!(p.run_iso(), Path::new("/ws/target/leasebox/run.iso"));
        assert_eq!(p.fence_test_elf(), Path::new("/ws/target/leasebox/leasebox-fence-test.elf"));
        assert_eq!(p.fence_test_target(), Path::new("/ws/target/fence-test"));
        assert_eq!(p.built_kernel(), Path::new("/ws/target/x86_64-unknown-none/release/leasebox"));
        assert_eq!(Paths::new("/ws".into(), Some("out".into())).elf(), Path::new("/ws/out/leasebox/leasebox.elf"));
        assert_eq!(Paths::new("/ws".into(), Some("/abs".into())).out, Path::new("/abs/leasebox"));
        assert_eq!(Paths::new("/ws".into(), Some("".into())).target, Path::new("/ws/target"));
    }

    #[test]
    fn discovered_root_is_the_workspace() {
        let p = Paths::discover();
        assert!(p.root.join("Cargo.toml").is_file());
        assert!(p.root.join("xtask").is_dir());
    }
}
