//! `cargo xtask rxe-guest [--boot]`: a Linux guest with Soft-RoCE (`rdma_rxe`) built from Debian packages.
//! The `rxe-qemu` scenario of `cargo xtask test` builds and boots it (tests/src/rxe.rs); see docs/rxe-guest.md.
//!
//! Everything comes from `apt-get download` into `target/leasebox/rxe-guest/debs/`, unpacked with
//! `dpkg-deb -x` into `target/leasebox/rxe-guest/root/`: Debian's kernel (its vmlinuz and the modules
//! `rdma_rxe`, `ib_core`, `ib_uverbs`, virtio-net and what they depend on, read from each module's
//! `depends=` modinfo field since the deb carries no modules.dep), busybox-static, rdma-core's libraries and
//! its rxe provider, `rdma` (iproute2), `ibv_devices` (ibverbs-utils). The shared libraries of every ELF we
//! ship are found with `ldd` (run against the unpacked tree first), their packages with `dpkg -S`, and those
//! packages are downloaded and unpacked too, so no library is copied from the host. leasectl and
//! leasebox-hosted (the reference responder, `--verbs`) are built with `--features verbs`. The initramfs is an
//! uncompressed newc cpio written here (the kernel accepts one without compression), so no host `cpio` or
//! `gzip` is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use leasebox_scenarios::rxe::{self, Guest};

use crate::image::{self, Paths};

/// Debian's packages taken whole (the kernel's is looked up: `apt-cache depends linux-image-amd64`).
const PACKAGES: &[&str] =
    &["busybox-static", "libibverbs1", "ibverbs-providers", "librdmacm1", "iproute2", "ibverbs-utils"];
/// Debian's CPython and pytest, for the client bindings' tests inside the guest (docs/rxe-guest.md, "The
/// bindings in the guest"): the interpreter, its standard library, and pytest with what bookworm's
/// python3-pytest depends on (the first of each alternative). The binding's extension module is built on the
/// host for the same CPython (bookworm's 3.11).
const PY_PACKAGES: &[&str] = &[
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "python3-pytest",
    "python3-attr",
    "python3-more-itertools",
    "python3-pkg-resources",
    "python3-pluggy",
    "python3-py",
    "python3-exceptiongroup",
    "python3-iniconfig",
    "python3-packaging",
];
/// The interpreter's version directory (`usr/lib/python3.11`) and binary.
const PY_VERSION: &str = "python3.11";
/// Parts of the standard library no test imports, left out of the initramfs (it is unpacked into the guest's
/// RAM).
const PY_SKIP: &[&str] = &["idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "test"];
/// The modules loaded at boot, with their dependencies found by [`module_order`]. `crc32_generic` is not in
/// rdma_rxe's `depends=`: rxe computes the ICRC with `crypto_alloc_shash("crc32")`, which the kernel satisfies
/// by `request_module("crypto-crc32")` through modprobe, and there is no modprobe here (without it rxe logs
/// "failed to add eth0" and `rdma link add` fails with ENOENT).
const MODULES: &[&str] = &["virtio_pci", "virtio_net", "crc32_generic", "rdma_rxe"];
/// The multiarch library directory of Debian amd64.
const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";
/// The guest's static address on QEMU's user network.
const GUEST_ADDR: &str = "10.0.2.15/24";

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The kernel package the metapackage `linux-image-amd64` depends on, e.g. `linux-image-6.1.0-56-amd64`.
pub fn kernel_package(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|l| {
        let name = l.trim().strip_prefix("Depends:")?.trim();
        (name.starts_with("linux-image-") && name.ends_with("-amd64")).then(|| name.to_string())
    })
}

/// `apt-get download` of `pkg` into `debs` unless a deb of it is there; returns the deb.
fn download(debs: &Path, pkg: &str) -> Result<PathBuf, String> {
    let find = || -> Result<Option<PathBuf>, String> {
        let rd = std::fs::read_dir(debs).map_err(|e| format!("{}: {e}", debs.display()))?;
        Ok(rd.filter_map(Result::ok).map(|e| e.path()).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".deb") && n.split('_').next() == Some(pkg))
        }))
    };
    if let Some(p) = find()? {
        return Ok(p);
    }
    run(Command::new("apt-get").arg("download").arg(pkg).current_dir(debs))?;
    find()?.ok_or_else(|| format!("apt-get download {pkg} left no deb in {}", debs.display()))
}

/// Downloads and unpacks `pkg` into `root` (once: a marker file records it).
fn fetch(dir: &Path, pkg: &str) -> Result<(), String> {
    let marker = dir.join("unpacked").join(pkg);
    if marker.exists() {
        return Ok(());
    }
    let deb = download(&dir.join("debs"), pkg)?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dir.join("root")))?;
    std::fs::write(&marker, deb.display().to_string()).map_err(|e| e.to_string())
}

/// A module's `depends=` from its `.modinfo` section (NUL-separated `key=value` strings).
pub fn modinfo_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .filter_map(|s| s.strip_prefix(b"depends="))
        .flat_map(|d| d.split(|&b| b == b',').map(|m| String::from_utf8_lossy(m).into_owned()))
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every module under `moddir/kernel` by name (`-` and `_` are the same to the kernel).
fn module_index(moddir: &Path) -> BTreeMap<String, PathBuf> {
    let mut idx = BTreeMap::new();
    let pattern = format!("{}/kernel/**/*.ko", moddir.display());
    for p in glob::glob(&pattern).into_iter().flatten().flatten() {
        if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
            idx.insert(stem.replace('-', "_"), p);
        }
    }
    idx
}

/// `wanted` and their dependencies, each after what it depends on (the order to insmod them).
pub fn module_order(
    wanted: &[&str],
    depends: &dyn Fn(&str) -> Result<Vec<String>, String>,
) -> Result<Vec<String>, String> {
    fn visit(
        m: &str,
        depends: &dyn Fn(&str) -> Result<Vec<String>, String>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        if !seen.insert(m.to_string()) {
            return Ok(());
        }
        for d in depends(m)? {
            visit(&d, depends, seen, out)?;
        }
        out.push(m.to_string());
        Ok(())
    }
    let (mut seen, mut out) = (BTreeSet::new(), Vec::new());
    for m in wanted {
        visit(m, depends, &mut seen, &mut out)?;
    }
    Ok(out)
}

/// The library paths `ldd` prints for `elf` (`name => /path (addr)` and the loader's `/path (addr)`).
pub fn ldd_paths(ldd_out: &str) -> Vec<String> {
    ldd_out
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => l,
            };
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then(|| path.to_string())
        })
        .collect()
}

/// An uncompressed newc cpio archive: what the kernel unpacks as an initramfs.
#[derive(Default)]
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name_z = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name_z,
            0
        );
        self.buf.extend_from_slice(header.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }
    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, data);
    }
    pub fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, target.as_bytes());
    }
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.buf
    }
}

/// The guest's `/init`: modules, eth0 (address `rxe.ip=`, gateway `rxe.gw=`, static neighbours `rxe.neigh=IP@MAC,...`
/// from the kernel command line; QEMU's user network by default), eth1 when `rxe.ctlip=` names its address, rxe0
/// on eth0, the evidence, then `rxe.cmd=` when given
/// (its output between `rxe-guest: running:` and `rxe-guest: command exit N`), then power off.
pub fn init_script(modules: &[String]) -> String {
    let insmods: String =
        modules.iter().map(|m| format!("insmod /modules/{m}.ko || echo \"rxe-guest: insmod {m} failed\"\n")).collect();
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin /proc /sys /dev /tmp
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
export PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin
export LEASECTL_CONFIG=/nonexistent/leasectl.conf
echo "rxe-guest: kernel $(uname -r)"
{insmods}echo "rxe-guest: modules: $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"
arg() {{ sed -n "s/.*$1=\([^ ]*\).*/\1/p" /proc/cmdline; }}
IP=$(arg rxe.ip); IP=${{IP:-{GUEST_ADDR}}}
GW=$(arg rxe.gw)
ip link set lo up
ip link set eth0 up
ip addr add "$IP" dev eth0
[ -n "$GW" ] && ip route add default via "$GW"
for n in $(arg rxe.neigh | tr ',' ' '); do
  arp -i eth0 -s "${{n%@*}}" "${{n#*@}}" && echo "rxe-guest: neighbour $n"
done
echo "rxe-guest: eth0 $IP mac $(cat /sys/class/net/eth0/address)"
CTLIP=$(arg rxe.ctlip)
if [ -n "$CTLIP" ]; then
  ip link set eth1 up && ip addr add "$CTLIP" dev eth1 && echo "rxe-guest: eth1 $CTLIP (control)"
fi
rdma link add rxe0 type rxe netdev eth0 && echo "rxe-guest: rdma link add rxe0: ok"
echo "rxe-guest: rdma link show:"
rdma link show
echo "rxe-guest: ibv_devices:"
ibv_devices
echo "rxe-guest: ibv_devinfo -d rxe0:"
ibv_devinfo -d rxe0
for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  echo "rxe-guest: gid ${{g##*/}} $(cat $g 2>/dev/null) $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/${{g##*/}} 2>/dev/null)"
done 2>/dev/null | grep -v ' 0000:0000:0000:0000:0000:0000:0000:0000'
echo "rxe-guest: leasectl verify --help:"
leasectl verify --help >/dev/null && echo "rxe-guest: leasectl runs"
CMD=$(sed -n 's/.*rxe\.cmd="\([^"]*\)".*/\1/p' /proc/cmdline)
if [ -n "$CMD" ]; then
  echo "rxe-guest: running: $CMD"
  sh -c "$CMD"
  echo "rxe-guest: command exit $?"
fi
echo "rxe-guest: done"
poweroff -f
"#
    )
}

/// Builds (or reuses) the kernel and initramfs under `target/leasebox/rxe-guest/`.
pub fn build(p: &Paths) -> Result<Guest, String> {
    let dir = p.out.join("rxe-guest");
    for d in ["debs", "root", "unpacked"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| e.to_string())?;
    }
    let depends =
        || run(Command::new("apt-cache").args(["depends", "linux-image-amd64"])).ok().and_then(|o| kernel_package(&o));
    let kpkg = match depends() {
        Some(k) => k,
        None => {
            // A machine whose package lists were never fetched knows no linux-image-amd64: fetch them once.
            println!("rxe-guest: apt-cache knows no linux-image-amd64; apt-get update");
            run(Command::new("apt-get").arg("update"))?;
            depends()
                .ok_or("apt-cache depends linux-image-amd64 names no linux-image-*-amd64, even after apt-get update")?
        }
    };
    fetch(&dir, &kpkg)?;
    for pkg in PACKAGES.iter().chain(PY_PACKAGES) {
        fetch(&dir, pkg)?;
    }
    let root = dir.join("root");
    let abi = kpkg.trim_start_matches("linux-image-");
    let moddir = root.join("lib/modules").join(abi);
    let kernel = root.join("boot").join(format!("vmlinuz-{abi}"));

    // Modules and their dependencies.
    let index = module_index(&moddir);
    let depends = |m: &str| -> Result<Vec<String>, String> {
        let path = index.get(m).ok_or_else(|| format!("module {m} not in {}", moddir.display()))?;
        Ok(modinfo_depends(&std::fs::read(path).map_err(|e| e.to_string())?))
    };
    let modules = module_order(MODULES, &depends)?;

    // leasectl with the verbs backend, and the hosted appliance with the verbs reference responder.
    for pkg in ["leasectl", "leasebox-hosted"] {
        println!("rxe-guest: cargo build -p {pkg} --features verbs --release");
        let status = Command::new(image::cargo())
            .args(["build", "-p", pkg, "--features", "verbs", "--release"])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("building {pkg} --features verbs failed"));
        }
    }
    let leasectl = p.target.join("release/leasectl");
    let hosted = p.target.join("release/leasebox-hosted");

    // The ELFs we ship, and where they go in the guest.
    let rxe_provider = glob::glob(&format!("{}/{LIBDIR}/libibverbs/librxe-rdmav*.so", root.display()))
        .map_err(|e| e.to_string())?
        .flatten()
        .next()
        .ok_or("ibverbs-providers has no librxe-rdmav*.so")?;
    let files: Vec<(String, PathBuf, u32)> = vec![
        ("bin/busybox".into(), root.join("bin/busybox"), 0o755),
        ("usr/bin/rdma".into(), root.join("usr/bin/rdma"), 0o755),
        ("usr/bin/ibv_devices".into(), root.join("usr/bin/ibv_devices"), 0o755),
        ("usr/bin/ibv_devinfo".into(), root.join("usr/bin/ibv_devinfo"), 0o755),
        ("usr/local/bin/leasectl".into(), leasectl.clone(), 0o755),
        ("usr/local/bin/leasebox-hosted".into(), hosted.clone(), 0o755),
        (rel(&rxe_provider, &root)?, rxe_provider.clone(), 0o644),
        ("etc/libibverbs.d/rxe.driver".into(), root.join("etc/libibverbs.d/rxe.driver"), 0o644),
    ];

    // Shared libraries: ldd against the unpacked tree first; a library found only on the host names its
    // package (dpkg -S), which is downloaded and unpacked, and ldd is asked again.
    let mut files = files;
    let mut symlinks: Vec<(String, String)> = Vec::new();
    let python = python_tree(&root, &mut files, &mut symlinks)?;
    files.extend(bindings(p, &dir)?);
    // Every dynamically linked ELF we ship (busybox is static; the interpreter's extension modules are
    // handled below).
    let mut elfs: Vec<PathBuf> = files
        .iter()
        .filter(|(n, _, _)| *n != "bin/busybox" && !n.contains("/lib-dynload/"))
        .map(|f| f.1.clone())
        .filter(|src| is_elf(src))
        .collect();
    // libibverbs itself: the verbs backend opens it with dlopen, so ldd of leasectl does not name it.
    let libibverbs = root.join(LIBDIR).join("libibverbs.so.1");
    elfs.push(libibverbs.clone());
    elfs.push(root.join("usr/bin").join(PY_VERSION));
    // The interpreter's extension modules: those whose libraries resolve go in (their libraries too); one that
    // needs a library no package here has is left out and named (an import of it fails in the guest).
    let ld_probe = format!("{0}/{LIBDIR}:{0}/lib/x86_64-linux-gnu", root.display());
    let mut dropped = Vec::new();
    files.retain(|(n, src, _)| {
        if !n.contains("/lib-dynload/") {
            return true;
        }
        let ok = run(Command::new("ldd").arg(src).env("LD_LIBRARY_PATH", &ld_probe))
            .map(|o| !o.contains("not found"))
            .unwrap_or(false);
        if ok {
            elfs.push(src.clone());
        } else {
            dropped.push(n.rsplit('/').next().unwrap_or(n).to_string());
        }
        ok
    });
    if !dropped.is_empty() {
        println!("rxe-guest: extension modules left out (a library they need is not unpacked): {}", dropped.join(" "));
    }
    let ld_path = format!("{0}/{LIBDIR}:{0}/lib/x86_64-linux-gnu:{0}/{LIBDIR}/libibverbs", root.display());
    let mut libs: BTreeSet<String> = BTreeSet::new();
    let mut settled = false;
    for _round in 0..4 {
        let mut missing = BTreeSet::new();
        libs.clear();
        for elf in &elfs {
            let out = run(Command::new("ldd").arg(elf).env("LD_LIBRARY_PATH", &ld_path))?;
            if out.contains("not found") {
                return Err(format!("ldd {}: a library is not found:\n{out}", elf.display()));
            }
            for lib in ldd_paths(&out) {
                let name = Path::new(&lib).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                if name.starts_with("ld-linux") {
                    // The loader is named by its absolute path (PT_INTERP), so ldd always shows the host's:
                    // ship the one from its package (libc6, unpacked for libc) instead.
                    libs.insert(format!("{LIBDIR}/{name}"));
                    continue;
                }
                match Path::new(&lib).strip_prefix(&root) {
                    Ok(r) => {
                        libs.insert(r.display().to_string());
                    }
                    Err(_) => {
                        missing.insert(lib);
                    }
                }
            }
        }
        if missing.is_empty() {
            settled = true;
            break;
        }
        for lib in &missing {
            let pkg = owner_package(lib)?;
            println!("rxe-guest: {lib} comes from {pkg}");
            fetch(&dir, &pkg)?;
        }
    }
    if !settled {
        return Err("ldd still finds libraries outside the unpacked packages after 4 rounds".into());
    }

    // The archive.
    let mut cpio = Cpio::default();
    let mut dirs = BTreeSet::new();
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "usr", "usr/lib", "modules", "lib64"] {
        dirs.insert(d.to_string());
    }
    let add_dirs = |name: &str, dirs: &mut BTreeSet<String>| {
        let mut acc = String::new();
        for part in Path::new(name).parent().into_iter().flat_map(|p| p.iter()) {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(&part.to_string_lossy());
            dirs.insert(acc.clone());
        }
    };
    let mut entries: Vec<(String, Vec<u8>, u32)> = Vec::new();
    for (name, src, mode) in &files {
        add_dirs(name, &mut dirs);
        entries.push((name.clone(), std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?, *mode));
    }
    for lib in &libs {
        // Everything lands in usr/lib/x86_64-linux-gnu; /lib is a symlink to usr/lib (merged /usr).
        let name = Path::new(lib).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let mut src = root.join(lib);
        if !src.exists() {
            src = root.join("lib/x86_64-linux-gnu").join(&name);
        }
        let data = std::fs::read(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        let dest = format!("{LIBDIR}/{name}");
        add_dirs(&dest, &mut dirs);
        entries.push((dest, data, 0o755));
    }
    for m in &modules {
        let path = &index[m];
        entries.push((format!("modules/{m}.ko"), std::fs::read(path).map_err(|e| e.to_string())?, 0o644));
    }
    entries.push(("init".into(), init_script(&modules).into_bytes(), 0o755));
    for (name, _) in &symlinks {
        add_dirs(name, &mut dirs);
    }
    for d in &dirs {
        cpio.dir(d);
    }
    cpio.symlink("lib", "usr/lib");
    for (name, target) in &symlinks {
        cpio.symlink(name, target);
    }
    cpio.symlink("lib64/ld-linux-x86-64.so.2", "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    let mut seen = BTreeSet::new();
    for (name, data, mode) in &entries {
        if seen.insert(name.clone()) {
            cpio.file(name, *mode, data);
        }
    }
    println!("rxe-guest: {python}");
    let initramfs = dir.join("initramfs.cpio");
    std::fs::write(&initramfs, cpio.finish()).map_err(|e| e.to_string())?;
    println!("rxe-guest: modules (load order): {}", modules.join(" "));
    println!("rxe-guest: libraries: {}", libs.iter().cloned().collect::<Vec<_>>().join(" "));
    let stable = Guest::in_target_dir(&p.target);
    if stable.initramfs != initramfs {
        return Err(format!(
            "the initramfs is at {}, the scenarios look at {}",
            initramfs.display(),
            stable.initramfs.display()
        ));
    }
    std::fs::copy(&kernel, &stable.kernel)
        .map_err(|e| format!("{} -> {}: {e}", kernel.display(), stable.kernel.display()))?;
    println!("rxe-guest: kernel {} (from {})", stable.kernel.display(), kernel.display());
    println!("rxe-guest: initramfs {}", initramfs.display());
    Ok(stable)
}

/// The interpreter, its standard library (less [`PY_SKIP`]) and Debian's `dist-packages` (pytest), from the
/// unpacked packages into `files` and `symlinks`; `usr/bin/python3` names the interpreter. Returns a summary.
fn python_tree(
    root: &Path,
    files: &mut Vec<(String, PathBuf, u32)>,
    symlinks: &mut Vec<(String, String)>,
) -> Result<String, String> {
    let bin = root.join("usr/bin").join(PY_VERSION);
    if !bin.exists() {
        return Err(format!("{} is missing: python3.11-minimal did not unpack", bin.display()));
    }
    files.push((format!("usr/bin/{PY_VERSION}"), bin, 0o755));
    symlinks.push(("usr/bin/python3".into(), PY_VERSION.into()));
    let trees = [format!("usr/lib/{PY_VERSION}"), "usr/lib/python3/dist-packages".to_string()];
    precompile(root, &trees);
    let before = files.len();
    let mut bytes = 0u64;
    for tree in trees {
        let mut stack = vec![root.join(&tree)];
        while let Some(d) = stack.pop() {
            let rd = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            for e in rd.filter_map(Result::ok) {
                let path = e.path();
                let name = rel(&path, root)?;
                let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                if meta.is_dir() {
                    if !PY_SKIP.iter().any(|s| e.file_name() == *s) {
                        stack.push(path);
                    }
                } else if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    symlinks.push((name, target.display().to_string()));
                } else {
                    use std::os::unix::fs::PermissionsExt;
                    bytes += meta.len();
                    files.push((name, path, meta.permissions().mode() & 0o777));
                }
            }
        }
    }
    Ok(format!("python: {PY_VERSION}, {} files, {:.1} MiB", files.len() - before, bytes as f64 / 1048576.0))
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == *b"\x7fELF"
}

/// The client bindings as a program in the guest uses them (docs/rxe-guest.md, "The bindings in the guest"):
/// the C example `kv_blocks` linked with the C library's static archive, and the Python package (its extension
/// module built by the `python-client` step's `pip install`) with the binding's test suite under
/// `/opt/leasebox/app/client-py/tests`.
fn bindings(p: &Paths, dir: &Path) -> Result<Vec<(String, PathBuf, u32)>, String> {
    let mut out = Vec::new();
    println!("rxe-guest: cargo build -p leasebox-client-c --release");
    let status = Command::new(image::cargo())
        .args(["build", "-p", "leasebox-client-c", "--release"])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err("building leasebox-client-c failed".into());
    }
    let example = dir.join("kv_blocks");
    let c = p.root.join("app/client-c");
    run(Command::new("gcc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&c)
        .arg(c.join("examples/kv_blocks.c"))
        .arg(p.target.join("release/libleasebox_client_c.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&example))?;
    out.push(("usr/local/bin/kv_blocks".to_string(), example, 0o755));
    let package = crate::python::install(p)?;
    for (src, name) in tree_files(&package)? {
        out.push((format!("usr/lib/python3/dist-packages/leasebox/{name}"), src, 0o644));
    }
    let tests = p.root.join("app/client-py/tests");
    for (src, name) in tree_files(&tests)? {
        if name.ends_with(".py") {
            out.push((format!("opt/leasebox/app/client-py/tests/{name}"), src, 0o644));
        }
    }
    Ok(out)
}

/// The regular files under `dir` (no `__pycache__`), with their paths relative to it.
fn tree_files(dir: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?.filter_map(Result::ok) {
            let path = e.path();
            if path.is_dir() {
                if e.file_name() != "__pycache__" {
                    stack.push(path);
                }
            } else {
                out.push((path.clone(), rel(&path, dir)?));
            }
        }
    }
    Ok(out)
}

/// Byte-compiles `trees` (under `root`) with the host's CPython when it is the guest's version, so the guest,
/// which runs under TCG, does not compile pytest and the standard library at every boot. The `.pyc` files are
/// `unchecked-hash` ones: the initramfs gives every file mtime 0, so timestamp-checked ones would be stale.
/// With another host version nothing is compiled (the guest compiles at import, slower but the same).
fn precompile(root: &Path, trees: &[String]) {
    let host = run(Command::new("python3").arg("--version")).unwrap_or_default();
    let guest = PY_VERSION.trim_start_matches("python");
    if !host.trim().strip_prefix("Python ").is_some_and(|v| v.starts_with(&format!("{guest}."))) {
        println!("rxe-guest: the host's python3 is not {guest} ({}): the guest compiles at import", host.trim());
        return;
    }
    let marker = root.join(".leasebox-precompiled");
    if marker.exists() {
        return;
    }
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash"]);
    for t in trees {
        cmd.arg(root.join(t));
    }
    // compileall exits 1 when a file does not compile (bookworm's stdlib has a few deliberately broken test
    // files): the rest is compiled all the same.
    let _ = cmd.output();
    let _ = std::fs::write(&marker, "");
}

fn rel(p: &Path, root: &Path) -> Result<String, String> {
    p.strip_prefix(root).map(|r| r.display().to_string()).map_err(|e| e.to_string())
}

/// The Debian package that owns `lib` (`dpkg -S`; merged /usr means the database may name it under
/// `/lib` or `/usr/lib`).
fn owner_package(lib: &str) -> Result<String, String> {
    let alt = match lib.strip_prefix("/usr") {
        Some(rest) => rest.to_string(),
        None => format!("/usr{lib}"),
    };
    for path in [lib, alt.as_str()] {
        if let Ok(out) = run(Command::new("dpkg").args(["-S", path]))
            && let Some((pkgs, _)) = out.lines().next().and_then(|l| l.split_once(": "))
        {
            let pkg = pkgs.split(',').next().unwrap_or(pkgs).trim();
            return Ok(pkg.split(':').next().unwrap_or(pkg).to_string());
        }
    }
    Err(format!("dpkg -S {lib}: no package owns it"))
}

/// `cargo xtask rxe-guest [--boot] [--cmd CMD]`.
pub fn cmd(
    p: &Paths,
    boot_it: bool,
    guest_cmd: Option<&str>,
    wire: Option<(SocketAddrV4, SocketAddrV4)>,
    ip: Option<String>,
) -> Result<(), String> {
    let t = Instant::now();
    let g = build(p)?;
    println!("rxe-guest: build took {:.1} s", t.elapsed().as_secs_f64());
    if boot_it {
        let mut run = rxe::GuestRun::user(p.out.join("rxe-guest").join("boot.log"), guest_cmd.map(str::to_string));
        if let Some((local, peer)) = wire {
            run.nic = rxe::Nic::Socket { local, peer };
            run.ip = format!("{}/24", rxe::GUEST_IP);
            run.gw = None;
        }
        if let Some(ip) = ip {
            run.ip = ip;
        }
        let out = rxe::boot(Path::new("qemu-system-x86_64"), &g, &run)?;
        println!("rxe-guest: boot took {:.1} s; transcript {}", out.took.as_secs_f64(), run.log.display());
        if !out.powered_off {
            return Err(format!("the guest did not power off within {} s", run.deadline.as_secs()));
        }
        rxe::check_guest(&out.transcript)?;
        println!("rxe-guest: PASS: rdma_rxe loaded, rxe0 on eth0, leasectl (verbs) runs in the guest");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_package_from_apt_cache() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(kernel_package(out).as_deref(), Some("linux-image-6.1.0-56-amd64"));
        assert_eq!(kernel_package("linux-image-amd64\n"), None);
    }

    #[test]
    fn depends_from_modinfo() {
        let ko = b"\x7fELF...\0license=GPL\0depends=ib_uverbs,ib_core,udp_tunnel\0name=rdma_rxe\0";
        assert_eq!(modinfo_depends(ko), ["ib_uverbs", "ib_core", "udp_tunnel"]);
        assert!(modinfo_depends(b"\0depends=\0").is_empty());
    }

    #[test]
    fn modules_after_their_dependencies() {
        let deps = |m: &str| -> Result<Vec<String>, String> {
            Ok(match m {
                "rdma_rxe" => vec!["ib_uverbs".into(), "ib_core".into()],
                "ib_uverbs" => vec!["ib_core".into()],
                _ => vec![],
            })
        };
        assert_eq!(module_order(&["rdma_rxe"], &deps).unwrap(), ["ib_core", "ib_uverbs", "rdma_rxe"]);
    }

    #[test]
    fn ldd_lines() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x2)\n";
        assert_eq!(ldd_paths(out), ["/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]);
    }

    #[test]
    fn cpio_newc_layout() {
        let mut c = Cpio::default();
        c.file("init", 0o755, b"hi");
        let b = c.finish();
        assert!(b.starts_with(b"070701"));
        assert_eq!(b.len() % 4, 0);
        assert_eq!(&b[110..115], b"init\0");
        assert!(b.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
