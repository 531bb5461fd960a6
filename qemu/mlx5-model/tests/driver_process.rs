//! The native driver in hosted mode against the model running as its own process, over the same two shared
//! files QEMU would use: bring-up, objects, teardown.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leasebox_mlx5::driver::{Config, Driver, PortState};
use leasebox_mlx5::ifc::mkey::MkeyAccess;
use leasebox_mlx5::platform::Platform;
use mlx5_hosted::HostedPlatform;

struct Files(Vec<PathBuf>);

impl Drop for Files {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn shm_file(name: &str, len: u64) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let p = dir.join(format!("leasebox-driver-test-{}-{name}.shm", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(len).unwrap();
    p
}

/// The model binary over `bar` and `ram` (RoCE cable on a free port, stopped by closing its stdin) with
/// `extra` arguments; returns the child and its first line (the ready line).
fn spawn_model(bar: &std::path::Path, ram: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    let mut model = Command::new(env!("CARGO_BIN_EXE_mlx5-model"))
        .args(["--bar", bar.to_str().unwrap(), "--ram", ram.to_str().unwrap(), "--udp", "127.0.0.1:0"])
        .args(extra)
        .arg("--exit-on-stdin-eof")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the model");
    let mut line = String::new();
    BufReader::new(model.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (model, line)
}

#[test]
fn the_driver_brings_up_the_model_process_over_shared_files() {
    let bar = shm_file("bar", 32 << 20);
    let ram = shm_file("ram", 128 << 20);
    let _files = Files(vec![bar.clone(), ram.clone()]);
    // Administratively down: the link comes up only because the driver (a PF) writes PAOS admin_status up,
    // then trains (the binary's default delay) while bring-up waits for it.
    let (mut model, line) = spawn_model(&bar, &ram, &["--admin-down"]);
    assert!(line.starts_with("mlx5-model: ready"), "{line}");

    let p = Arc::new(HostedPlatform::open_files(&bar, &ram, Duration::from_secs(5)).unwrap());
    let cfg = Config { part: "ConnectX-5", pre_init_timeout_ms: 5_000, link_wait_ms: 10_000, ..Config::default() };
    let mut d = Driver::bring_up(p.clone(), cfg).unwrap_or_else(|e| panic!("bring-up: {e}"));
    assert_eq!(d.info.port, PortState::Active);
    let pd = d.alloc_pd().unwrap();
    let page = p.dma_alloc(4096, 4096).unwrap().addr();
    let key = d.create_mkey(pd, page, 4096, MkeyAccess::REMOTE_WRITE | MkeyAccess::LOCAL_READ, 12, &[page]).unwrap();
    let info = d.query_mkey(key).unwrap();
    assert_eq!((info.pd, info.start, info.len), (pd, page, 4096));
    d.destroy_mkey(key).unwrap();
    d.dealloc_pd(pd).unwrap();
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert_eq!(report.pages_left, 0);

    let _ = model.stdin.take().map(|mut s| s.flush());
    let status = model.wait().unwrap();
    assert!(status.success(), "the model exits cleanly when its stdin closes: {status}");
}

#[test]
fn the_process_carries_an_ethernet_wire_and_survives_what_arrives_on_it() {
    let bar = shm_file("ethbar", 32 << 20);
    let ram = shm_file("ethram", 64 << 20);
    let _files = Files(vec![bar.clone(), ram.clone()]);
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let wire = format!("127.0.0.1:0,{}", peer.local_addr().unwrap());
    let (mut model, line) = spawn_model(&bar, &ram, &["--eth-udp", &wire, "--link-up-delay", "10"]);
    let eth = line.trim().rsplit_once(" eth=").map(|(_, e)| e.to_string()).unwrap_or_default();
    let (local, to) = eth.split_once(',').unwrap_or_else(|| panic!("no eth= in {line}"));
    assert_eq!(to, peer.local_addr().unwrap().to_string());
    let local: std::net::SocketAddr = local.parse().unwrap();
    assert_ne!(local.port(), 0, "the bound address");
    // Garbage, runts, a giant and a RoCE-looking frame: the device is not even initialized; nothing may crash it.
    let mut roce = vec![0u8; 80];
    roce[..6].copy_from_slice(&[0x02, 0x4c, 0x42, 0, 0, 1]);
    roce[12..14].copy_from_slice(&[0x08, 0x00]);
    roce[14] = 0x45;
    roce[23] = 17;
    roce[36..38].copy_from_slice(&4791u16.to_be_bytes());
    for f in [vec![], vec![0xff; 3], vec![0xab; 60], vec![0x5a; 9000], roce] {
        peer.send_to(&f, local).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(model.try_wait().unwrap().is_none(), "the model is still running");
    let _ = model.stdin.take().map(|mut s| s.flush());
    let status = model.wait().unwrap();
    assert!(status.success(), "the model exits cleanly when its stdin closes: {status}");
}

#[test]
fn the_vf_personality_names_a_vf_and_a_vf_driver_comes_up_on_it() {
    let bar = shm_file("vfbar", 32 << 20);
    let ram = shm_file("vfram", 128 << 20);
    let _files = Files(vec![bar.clone(), ram.clone()]);
    let (mut model, line) = spawn_model(&bar, &ram, &["--vf"]);
    assert!(line.contains(" function=vf "), "{line}");
    // The signature (last 4 KiB of the BAR) names the device played: a ConnectX-5 VF.
    let bytes = std::fs::read(&bar).unwrap();
    let sig: &[u8; mlx5_signature::SIGNATURE_LEN] =
        bytes[bytes.len() - 0x1000..][..mlx5_signature::SIGNATURE_LEN].try_into().unwrap();
    assert!(mlx5_signature::matches(sig, 32 << 20));
    assert_eq!(mlx5_signature::plays(sig), 0x1018);

    let p = Arc::new(HostedPlatform::open_files(&bar, &ram, Duration::from_secs(5)).unwrap());
    // The VF does not write PAOS; its port (the PF's, up from power-on in the model) trains and comes up.
    let cfg = Config {
        part: "ConnectX-5 VF",
        vf: true,
        pre_init_timeout_ms: 5_000,
        link_wait_ms: 10_000,
        ..Config::default()
    };
    let d = Driver::bring_up(p, cfg).unwrap_or_else(|e| panic!("bring-up as a VF: {e}"));
    assert_eq!(d.info.port, PortState::Active);
    let report = d.teardown().unwrap_or_else(|(r, e)| panic!("teardown: {e} ({r:?})"));
    assert_eq!(report.pages_left, 0);

    let _ = model.stdin.take().map(|mut s| s.flush());
    assert!(model.wait().unwrap().success());
}
