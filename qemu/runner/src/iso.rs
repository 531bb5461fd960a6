//! The GRUB ISO: one hybrid image for BIOS (El Torito, `multiboot`) and UEFI (`multiboot2`), made by
//! `grub-mkrescue` (which needs xorriso and mtools, and the `i386-pc` and `x86_64-efi` GRUB platforms).
//!
//! GRUB puts its own console on the serial line, so the boot menu (timeout 0) and any GRUB error show up in
//! the same capture as the kernel's log. Kernel arguments are baked into `grub.cfg`; an ISO is rebuilt only when
//! its `grub.cfg` or kernel changed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::run_captured;

/// `grub-mkrescue` is given this long before it is killed.
pub const MKRESCUE_TIMEOUT: Duration = Duration::from_secs(300);

/// Checks that kernel arguments can be put in `grub.cfg` as they are: GRUB's script parser gives meaning to
/// quotes, `$`, `;`, braces and backslashes, so only plain `key=value` material is accepted.
pub fn check_kernel_args(args: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_=.,:/+-@%".contains(c) || c == ' ';
    match args.chars().find(|&c| !ok(c)) {
        None => Ok(()),
        Some(c) => Err(format!(
            "kernel argument string `{args}` contains {c:?}, which grub.cfg would interpret; use letters, digits, \
             spaces and _=.,:/+-@%"
        )),
    }
}

/// The `grub.cfg` for the ISO, with `kernel_args` (space separated) on both multiboot lines.
pub fn grub_cfg(kernel_args: &str) -> Result<String, String> {
    check_kernel_args(kernel_args)?;
    let args = kernel_args.split_whitespace().collect::<Vec<_>>().join(" ");
    let sep = if args.is_empty() { "" } else { " " };
    Ok(format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=0\n\
         menuentry \"Leasebox\" {{\n\
         \x20 if [ \"$grub_platform\" = \"efi\" ]; then multiboot2 /boot/leasebox.elf{sep}{args}; \
         else multiboot /boot/leasebox.elf{sep}{args}; fi\n\
         \x20 boot\n\
         }}\n"
    ))
}

/// What to build.
#[derive(Clone, Debug)]
pub struct IsoSpec {
    /// The kernel ELF (copied into the ISO as `/boot/leasebox.elf`).
    pub elf: PathBuf,
    /// The ISO to write.
    pub iso: PathBuf,
    /// Arguments baked into `grub.cfg`.
    pub kernel_args: String,
    /// The ISO's root directory tree (recreated as needed).
    pub staging: PathBuf,
    /// The `grub-mkrescue` program.
    pub grub_mkrescue: PathBuf,
}

impl IsoSpec {
    /// An ISO at `iso`, staged in `<dir of iso>/iso-root/<iso file stem>`.
    pub fn new(elf: &Path, iso: &Path, kernel_args: &str) -> IsoSpec {
        let stem = iso.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "iso".into());
        let staging = iso.parent().unwrap_or(Path::new(".")).join("iso-root").join(stem);
        IsoSpec {
            elf: elf.to_path_buf(),
            iso: iso.to_path_buf(),
            kernel_args: kernel_args.to_string(),
            staging,
            grub_mkrescue: PathBuf::from("grub-mkrescue"),
        }
    }

    fn staged_cfg(&self) -> PathBuf {
        self.staging.join("boot/grub/grub.cfg")
    }

    fn staged_elf(&self) -> PathBuf {
        self.staging.join("boot/leasebox.elf")
    }

    /// Whether the ISO exists, is newer than the kernel, and was built with the same `grub.cfg`.
    pub fn is_current(&self) -> Result<bool, String> {
        let cfg = grub_cfg(&self.kernel_args)?;
        let (Ok(iso), Ok(elf)) = (fs::metadata(&self.iso), fs::metadata(&self.elf)) else {
            return Ok(false);
        };
        let (Ok(iso_t), Ok(elf_t)) = (iso.modified(), elf.modified()) else {
            return Ok(false);
        };
        if iso_t < elf_t {
            return Ok(false);
        }
        Ok(fs::read_to_string(self.staged_cfg()).is_ok_and(|old| old == cfg)
            && fs::read(self.staged_elf()).ok() == fs::read(&self.elf).ok())
    }

    /// Builds the ISO unless it is current; returns whether it was (re)built.
    pub fn build_if_stale(&self) -> Result<bool, String> {
        if self.is_current()? {
            return Ok(false);
        }
        self.build()?;
        Ok(true)
    }

    /// Stages the tree and runs `grub-mkrescue`.
    pub fn build(&self) -> Result<(), String> {
        let cfg = grub_cfg(&self.kernel_args)?;
        let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
        if self.staging.exists() {
            fs::remove_dir_all(&self.staging).map_err(|e| io("removing", &self.staging, e))?;
        }
        let grub_dir = self.staging.join("boot/grub");
        fs::create_dir_all(&grub_dir).map_err(|e| io("creating", &grub_dir, e))?;
        fs::copy(&self.elf, self.staged_elf()).map_err(|e| io("copying", &self.elf, e))?;
        fs::write(self.staged_cfg(), &cfg).map_err(|e| io("writing", &self.staged_cfg(), e))?;
        if let Some(parent) = self.iso.parent() {
            fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
        }
        let partial = self.iso.with_extension("iso.partial");
        let _ = fs::remove_file(&partial);
        let out = run_captured(
            Command::new(&self.grub_mkrescue).arg("-o").arg(&partial).arg(&self.staging),
            MKRESCUE_TIMEOUT,
        )
        .map_err(|e| e.to_string())?;
        if !out.success() {
            let _ = fs::remove_file(&partial);
            let why = match out.status {
                None => format!("timed out after {} s", MKRESCUE_TIMEOUT.as_secs()),
                Some(s) => format!("failed ({s})"),
            };
            return Err(format!(
                "{} {why}:\n{}{}",
                self.grub_mkrescue.display(),
                out.stdout.trim_end(),
                out.stderr.trim_end()
            ));
        }
        fs::rename(&partial, &self.iso).map_err(|e| io("renaming to", &self.iso, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cfg_without_args_matches_the_contract() {
        let cfg = grub_cfg("").unwrap();
        assert_eq!(
            cfg,
            "serial --unit=0 --speed=115200\n\
             terminal_input serial console\n\
             terminal_output serial console\n\
             set timeout=0\n\
             menuentry \"Leasebox\" {\n  \
             if [ \"$grub_platform\" = \"efi\" ]; then multiboot2 /boot/leasebox.elf; \
             else multiboot /boot/leasebox.elf; fi\n  boot\n}\n"
        );
    }

    #[test]
    fn cfg_bakes_args_into_both_paths() {
        let cfg = grub_cfg("  test=panic   log=debug ").unwrap();
        assert!(cfg.contains("multiboot2 /boot/leasebox.elf test=panic log=debug;"));
        assert!(cfg.contains("multiboot /boot/leasebox.elf test=panic log=debug;"));
    }

    #[test]
    fn cfg_rejects_script_syntax() {
        for bad in ["a;reboot", "x=$y", "q=\"1\"", "a\nb", "c=}", "d=\\"] {
            assert!(grub_cfg(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_kernel_args("cores=0,1,2 log=trace test=pagefault").is_ok());
    }

    #[test]
    fn staging_dir_is_beside_the_iso() {
        let s = IsoSpec::new(Path::new("t/leasebox.elf"), Path::new("t/leasebox/run.iso"), "");
        assert_eq!(s.staging, Path::new("t/leasebox/iso-root/run"));
    }

    #[test]
    fn missing_iso_is_not_current() {
        let dir = crate::firmware::unique_path(&std::env::temp_dir(), "leasebox-iso", "d");
        fs::create_dir_all(&dir).unwrap();
        let elf = dir.join("k.elf");
        fs::write(&elf, b"elf").unwrap();
        let s = IsoSpec::new(&elf, &dir.join("x.iso"), "");
        assert!(!s.is_current().unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}
