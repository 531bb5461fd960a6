//! What the C ABI's tests share: a hosted appliance with the RDMA data path (the device model, `--hca --udp`),
//! and C programs compiled by gcc against the committed header and linked with this crate's staticlib.
#![allow(dead_code)]

use leasebox_hosted::testing::{Builder, Rig};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// What the staticlib needs beside it: the C runtime's threads, dlopen (the verbs backend loads libibverbs at run
/// time, so a program linked this way starts on a host without it) and libm.
pub const LINK: &[&str] = &["-lpthread", "-ldl", "-lm"];

/// Tests that run whole appliances with their model threads go one at a time (the machine is small).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hosted appliance with the RDMA data path (the shipped rig, stopped on drop) and what the C programs take
/// on their command lines: its addresses and the keys in hex.
pub struct Appliance {
    pub h: Rig,
    pub addr: String,
    pub udp: String,
    pub tenant: String,
    pub admin: String,
}

/// An appliance with the model, a tenant `demo` and an admin.
pub fn start() -> Appliance {
    start_with(|b| b)
}

/// [`start`], with what `options` adds to the configuration.
pub fn start_with(options: impl FnOnce(Builder) -> Builder) -> Appliance {
    let h = options(Rig::builder().model().tenant("demo").admin()).start().expect("the hosted appliance starts");
    let addr = h.addr().to_string();
    let udp = h.udp().expect("--udp gives the responder an address").to_string();
    let (tenant, admin) = (h.key("demo").hex(), h.admin_key().hex());
    Appliance { h, addr, udp, tenant, admin }
}

/// Where cargo put this crate's staticlib: next to this test's executable (`target/<profile>/deps/`).
pub fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("the deps directory");
    let lib = deps.join("libleasebox_client_c.a");
    assert!(lib.exists(), "{} is missing: cargo builds it with this test (crate-type staticlib)", lib.display());
    lib
}

/// `source` (relative to the crate) compiled with gcc, warnings as errors, into the test's temporary directory as
/// `name`.
pub fn compile(source: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let gcc = Command::new("gcc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(dir)
        .arg(dir.join(source))
        .arg(staticlib())
        .args(LINK)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("running gcc");
    assert!(gcc.status.success(), "gcc {source} failed:\n{}", String::from_utf8_lossy(&gcc.stderr));
    out
}

/// Runs `program` with `args` and `env`; its output, echoed for the test's log.
pub fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(program).args(args).envs(env.iter().copied()).output().expect("running the C program");
    eprintln!(
        "{} {}: {}\n{}{}",
        program.display(),
        args.first().unwrap_or(&""),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
