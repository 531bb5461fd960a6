//! Linux's Soft-RoCE (`rdma_rxe`) as a client nobody here wrote (docs/rxe-guest.md). The guest itself, a Debian kernel
//! and initramfs, is built by `cargo xtask rxe-guest` (xtask/src/rxe_guest.rs; docs/rxe-guest.md); this module
//! boots it under QEMU/TCG on a chosen network and reads what its command printed.
//!
//! The `rxe-qemu` scenario ([`run`]):
//! 1. the appliance boots with its control channel on the model's own Ethernet port (QEMU's user network, the
//!    model's wire and a client port on hub 0, as in `ctl-mlx5-qemu`);
//! 2. the rxe guest's virtio-net NIC is that client port (a `-netdev socket` pointed at the hub's socket), so
//!    the guest is one more station on 10.0.2.0/24: it reaches the appliance's control port directly and
//!    resolves the appliance's RDMA address by ARP, like any Linux host on the segment;
//! 3. inside the guest, `leasectl verify --backend verbs --device rxe0 --revoke-test --order both --json`
//!    runs against the appliance and must pass the checks the software requester's runs pass
//!    ([`crate::lease_qemu::check_verify_runs`]): data written through real verbs reads back, mkey-first gives
//!    `IBV_WC_REM_ACCESS_ERR`, qp-first `IBV_WC_RETRY_EXC_ERR` after about the QP's retry time.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasebox_client::rdma::pcap::PcapWriter;
use leasebox_qemu::HubSocket;
use leasebox_qemu::process::run_captured;

use crate::Artifacts;
use crate::ctl_mlx5::mac_string;
use crate::lease_qemu::{self, Appliance, VerifyRun};

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "rxe-qemu";
/// The guest's address and MAC on the appliance's segment (10.0.2.0/24: QEMU's user network is 10.0.2.2, the
/// appliance's DHCP address 10.0.2.15 and its RDMA address 10.0.2.16).
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 30);
pub const GUEST_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x1e];
/// Beside the hosted appliance, the RDMA wire is a subnet of its own (the user network is 10.0.2.0/24 on the
/// guest's second NIC): the guest's address there and the hosted appliance's RDMA address (`rdma_ip=`).
pub const HOSTED_GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 3, 30);
pub const HOSTED_RDMA_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 3, 16);
/// From QEMU start to power-off: the guest boots in about 6 s under TCG; the verifier's two orders with their
/// retry timers take tens of seconds more on a loaded 2-core host, and the bindings' C example and pytest suite
/// (against the QEMU appliance) a few minutes more.
const GUEST_DEADLINE: Duration = Duration::from_secs(900);
/// The control channel's answer timeout inside the guest (leasectl `--timeout`).
pub(crate) const ANSWER_TIMEOUT_S: u32 = 30;

/// The built guest (`cargo xtask rxe-guest`).
#[derive(Clone, Debug)]
pub struct Guest {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
}

impl Guest {
    /// Both files are there (else: how to build them).
    fn check_built(&self) -> Result<(), String> {
        match [&self.kernel, &self.initramfs].into_iter().find(|f| !f.exists()) {
            Some(f) => Err(format!("{} is missing: build the guest with `cargo xtask rxe-guest`", f.display())),
            None => Ok(()),
        }
    }

    /// Where `cargo xtask rxe-guest` leaves it, under `<target>/leasebox/rxe-guest/`.
    pub fn in_target_dir(target: &Path) -> Guest {
        let dir = target.join("leasebox").join("rxe-guest");
        Guest { kernel: dir.join("vmlinuz"), initramfs: dir.join("initramfs.cpio") }
    }
}

/// The guest's one NIC (virtio-net).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nic {
    /// QEMU's user network alone (10.0.2.0/24 behind 10.0.2.2).
    User,
    /// A UDP socket carrying one Ethernet frame per datagram: QEMU binds `local` and sends to `peer` (another
    /// QEMU's hub socket port, or a process that is a station on the wire).
    Socket { local: SocketAddrV4, peer: SocketAddrV4 },
    /// The socket (eth0, rxe0's) and a second NIC on QEMU's user network (eth1, address `rxe.ctlip=`
    /// [`CTL_NIC_IP`]), where the host's loopback is 10.0.2.2. Two NICs, not one hub: QEMU's user network reads
    /// every frame on a hub whatever its destination MAC and would take the RDMA frames too.
    SocketAndUser { local: SocketAddrV4, peer: SocketAddrV4 },
}

/// The guest's address on QEMU's user network with [`Nic::SocketAndUser`].
pub const CTL_NIC_IP: &str = "10.0.2.15/24";
/// The host's loopback as the guest on QEMU's user network sees it.
pub const USER_NET_HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// One boot of the guest.
#[derive(Clone, Debug)]
pub struct GuestRun {
    pub nic: Nic,
    /// `a.b.c.d/len`.
    pub ip: String,
    pub gw: Option<Ipv4Addr>,
    pub mac: [u8; 6],
    /// Static neighbour entries (for a station that answers no ARP).
    pub neigh: Vec<(Ipv4Addr, [u8; 6])>,
    /// Run after the checks (busybox sh); no double quote or newline.
    pub cmd: Option<String>,
    pub deadline: Duration,
    /// The serial transcript goes here.
    pub log: PathBuf,
    pub echo: bool,
}

impl GuestRun {
    /// QEMU's user network, the guest at 10.0.2.15 (the spike of `cargo xtask rxe-guest --boot`).
    pub fn user(log: PathBuf, cmd: Option<String>) -> GuestRun {
        GuestRun {
            nic: Nic::User,
            ip: "10.0.2.15/24".into(),
            gw: Some(Ipv4Addr::new(10, 0, 2, 2)),
            mac: GUEST_MAC,
            neigh: vec![],
            cmd,
            deadline: Duration::from_secs(240),
            log,
            echo: true,
        }
    }

    /// The kernel command line.
    pub fn append(&self) -> Result<String, String> {
        let mut a = format!("console=ttyS0 panic=-1 loglevel=4 rxe.ip={}", self.ip);
        if matches!(self.nic, Nic::SocketAndUser { .. }) {
            a.push_str(&format!(" rxe.ctlip={CTL_NIC_IP}"));
        }
        if let Some(gw) = self.gw {
            a.push_str(&format!(" rxe.gw={gw}"));
        }
        if !self.neigh.is_empty() {
            let n: Vec<String> = self.neigh.iter().map(|(ip, mac)| format!("{ip}@{}", mac_string(mac))).collect();
            a.push_str(&format!(" rxe.neigh={}", n.join(",")));
        }
        if let Some(c) = &self.cmd {
            // The kernel's command-line parser knows double quotes but no escapes.
            if c.contains('"') || c.contains('\n') {
                return Err("the guest's command cannot hold a double quote or a newline (rxe.cmd=\"...\")".into());
            }
            a.push_str(&format!(" rxe.cmd=\"{c}\""));
        }
        // x86's COMMAND_LINE_SIZE: the kernel cuts a longer line (and the command with it) silently.
        if a.len() >= 2048 {
            return Err(format!("the guest's kernel command line is {} bytes, over x86's 2047", a.len()));
        }
        Ok(a)
    }

    /// QEMU's arguments after the binary.
    pub fn qemu_args(&self, g: &Guest) -> Result<Vec<String>, String> {
        let mut q: Vec<String> = ["-accel", "tcg", "-m", "512", "-nographic", "-no-reboot", "-kernel"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        q.push(g.kernel.display().to_string());
        q.push("-initrd".into());
        q.push(g.initramfs.display().to_string());
        q.push("-append".into());
        q.push(self.append()?);
        let dev = format!("virtio-net-pci,netdev=g0,mac={}", mac_string(&self.mac));
        let pairs: Vec<String> = match self.nic {
            Nic::User => vec!["-netdev".into(), "user,id=g0".into()],
            Nic::Socket { local, peer } => vec!["-netdev".into(), format!("socket,id=g0,udp={peer},localaddr={local}")],
            Nic::SocketAndUser { local, peer } => vec![
                "-netdev".into(),
                format!("socket,id=g0,udp={peer},localaddr={local}"),
                "-netdev".into(),
                "user,id=u0".into(),
            ],
        };
        q.extend(pairs);
        q.push("-device".into());
        q.push(dev);
        if matches!(self.nic, Nic::SocketAndUser { .. }) {
            let mut mac = self.mac;
            mac[5] ^= 0x80;
            q.push("-device".into());
            q.push(format!("virtio-net-pci,netdev=u0,mac={}", mac_string(&mac)));
        }
        Ok(q)
    }
}

/// What one boot printed.
#[derive(Clone, Debug)]
pub struct GuestOutput {
    pub transcript: String,
    pub powered_off: bool,
    pub took: Duration,
}

impl GuestOutput {
    /// The lines the guest's command printed (between `rxe-guest: running:` and `rxe-guest: command exit`),
    /// and its exit status.
    pub fn command_output(&self) -> Option<(Vec<&str>, i32)> {
        command_output(&self.transcript)
    }
}

/// See [`GuestOutput::command_output`].
pub fn command_output(transcript: &str) -> Option<(Vec<&str>, i32)> {
    let mut lines = transcript.lines().map(|l| l.trim_end_matches('\r'));
    lines.by_ref().find(|l| l.starts_with("rxe-guest: running:"))?;
    let mut out = Vec::new();
    for l in lines {
        if let Some(code) = l.strip_prefix("rxe-guest: command exit ") {
            return Some((out, code.trim().parse().ok()?));
        }
        out.push(l);
    }
    None
}

/// Boots the guest and waits for it to power off (or the deadline); the transcript is written to `r.log`.
pub fn boot(qemu: &Path, g: &Guest, r: &GuestRun) -> Result<GuestOutput, String> {
    g.check_built()?;
    let mut q = Command::new(qemu);
    q.args(r.qemu_args(g)?);
    if r.echo {
        println!("rxe-guest: {q:?}");
    }
    let t = Instant::now();
    let out = run_captured(&mut q, r.deadline).map_err(|e| e.to_string())?;
    let took = t.elapsed();
    if let Some(d) = r.log.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let _ = std::fs::write(&r.log, format!("{}\n--- qemu stderr ---\n{}", out.stdout, out.stderr));
    if r.echo {
        println!("{}", out.stdout);
    }
    Ok(GuestOutput { transcript: out.stdout, powered_off: out.status.is_some(), took })
}

/// What every transcript must show: rdma_rxe loaded, rxe0 on eth0, leasectl (verbs build) running.
pub fn check_guest(transcript: &str) -> Result<(), String> {
    let mut missing = Vec::new();
    if !transcript.lines().any(|l| l.contains("rxe-guest: modules:") && l.contains("rdma_rxe")) {
        missing.push("rdma_rxe in /proc/modules");
    }
    if !transcript.lines().any(|l| l.contains("link rxe0/1") && l.contains("netdev eth0")) {
        missing.push("`rdma link show` listing rxe0 on eth0");
    }
    if !transcript.contains("rxe-guest: leasectl runs") {
        missing.push("leasectl verify --help exiting 0");
    }
    if missing.is_empty() { Ok(()) } else { Err(format!("the guest's transcript lacks: {}", missing.join(", "))) }
}

/// The GID index of rxe0's IPv4-mapped GID for `ip` (`rxe-guest: gid N ...` lines), if the guest listed it.
pub fn gid_index_of(transcript: &str, ip: Ipv4Addr) -> Option<u8> {
    let o = ip.octets();
    let want = format!("0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    transcript.lines().find_map(|l| {
        let rest = l.trim_end_matches('\r').strip_prefix("rxe-guest: gid ")?;
        let mut w = rest.split_whitespace();
        let idx = w.next()?.parse().ok()?;
        (w.next()? == want).then_some(idx)
    })
}

// ---- the wire between the guest and the appliance ----

/// The shortest Ethernet frame without its FCS. A physical MAC pads a shorter frame to it before sending; QEMU's
/// virtual NICs do not (virtio-net hands the guest's 42-byte ARP request over as it is), and the mlx5 model, like
/// a real port, drops what arrives shorter as a runt (docs/hca-model.md, "Frames from QEMU's virtual NICs").
pub const ETH_MIN_FRAME: usize = 60;

/// What crossed the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounts {
    /// Frames from the guest, and how many of them were shorter than [`ETH_MIN_FRAME`] and padded.
    pub from_guest: u64,
    pub padded: u64,
    /// Frames to the guest.
    pub to_guest: u64,
}

/// The guest's frame as a physical MAC would put it on the wire: padded with zeros to [`ETH_MIN_FRAME`].
pub fn pad_frame(frame: &mut Vec<u8>) -> bool {
    if frame.len() < ETH_MIN_FRAME {
        frame.resize(ETH_MIN_FRAME, 0);
        true
    } else {
        false
    }
}

/// A relay standing for the cable between the guest's NIC and the appliance's hub: two UDP sockets, frames
/// forwarded both ways, the guest's short frames padded as its MAC would have (see [`ETH_MIN_FRAME`]), every
/// frame recorded in a pcap file.
pub struct Wire {
    /// Where the guest's QEMU sends its frames (its `udp=` peer).
    pub guest_peer: SocketAddrV4,
    /// What the guest's QEMU binds (its `localaddr=`).
    pub guest_local: SocketAddrV4,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counts: Arc<Mutex<WireCounts>>,
}

impl Wire {
    /// Joins the hub socket `hub` (the wire binds `hub.peer`, sends to `hub.local`); `pcap`: where the frames go.
    pub fn start(hub: HubSocket, pcap: &Path) -> Result<Wire, String> {
        let to_hub = UdpSocket::bind(hub.peer).map_err(|e| format!("binding {}: {e}", hub.peer))?;
        let to_guest =
            UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| format!("binding a UDP socket for the wire: {e}"))?;
        let guest_local = free_udp_port()?;
        let guest_peer = match to_guest.local_addr().map_err(|e| e.to_string())? {
            std::net::SocketAddr::V4(a) => a,
            other => return Err(format!("the wire bound {other}, not IPv4")),
        };
        let file = std::fs::File::create(pcap).map_err(|e| format!("{}: {e}", pcap.display()))?;
        let pcap = Arc::new(Mutex::new(PcapWriter::new(std::io::BufWriter::new(file)).map_err(|e| e.to_string())?));
        let (stop, counts) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(WireCounts::default())));
        let mut threads = Vec::new();
        for from_guest in [true, false] {
            let (rx, tx) = if from_guest { (&to_guest, &to_hub) } else { (&to_hub, &to_guest) };
            let (rx, tx) = (rx.try_clone().map_err(|e| e.to_string())?, tx.try_clone().map_err(|e| e.to_string())?);
            rx.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
            let dest = if from_guest { hub.local } else { guest_local };
            let (stop, counts, pcap) = (Arc::clone(&stop), Arc::clone(&counts), Arc::clone(&pcap));
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = rx.recv(&mut buf) else { continue };
                    if n == 0 {
                        continue;
                    }
                    let mut f = buf[..n].to_vec();
                    {
                        let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
                        if from_guest {
                            c.from_guest += 1;
                            c.padded += u64::from(pad_frame(&mut f));
                        } else {
                            c.to_guest += 1;
                        }
                    }
                    let _ = pcap.lock().unwrap_or_else(|p| p.into_inner()).frame(&f);
                    let _ = tx.send_to(&f, dest);
                }
                let _ = pcap.lock().unwrap_or_else(|p| p.into_inner()).flush();
            }));
        }
        Ok(Wire { guest_peer, guest_local, stop, threads, counts })
    }

    /// The guest's NIC on this wire.
    pub fn nic(&self) -> Nic {
        Nic::Socket { local: self.guest_local, peer: self.guest_peer }
    }

    pub fn counts(&self) -> WireCounts {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A UDP port on 127.0.0.1 that was free when asked.
pub fn free_udp_port() -> Result<SocketAddrV4, String> {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
    match s.local_addr().map_err(|e| e.to_string())? {
        std::net::SocketAddr::V4(a) => Ok(a),
        other => Err(format!("bound {other}, not IPv4")),
    }
}

// ---- the scenario ----

/// The QP's transport retry count in the guest. rxe takes `retry_cnt` 7 as "retry forever", as IBTA defines
/// only for `rnr_retry` (rxe_comp.c: `if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--;`), so the other
/// scenarios' 7 would never end in `IBV_WC_RETRY_EXC_ERR` here (docs/hca-model.md, "Soft-RoCE against the
/// model"). 6 is the largest count that ends on every stack.
pub const RXE_RETRY_CNT: u8 = 6;

/// The verifier's command inside the guest: tenant `demo`, the admin key for the revokes, rxe0's GID `gid`.
fn verify_cmd(ctl: &str, tenant_hex: &str, admin_hex: &str, gid: u8) -> String {
    let v = lease_qemu::verify_args(RXE_RETRY_CNT);
    format!(
        "leasectl --addr {ctl} --timeout {ANSWER_TIMEOUT_S} --tenant demo --key {tenant_hex} --json verify \
         --backend verbs --device rxe0 --gid-index {gid} --revoke-test --order both --admin-key {admin_hex} {}",
        v.join(" ")
    )
}

/// The `rxe-qemu` scenario: the QEMU appliance and one rxe guest on its segment, then the hosted appliance (the
/// model in-process, its RoCEv2 responder on UDP) and the guest again.
pub fn run(a: &Artifacts) -> Result<String, String> {
    let g = a.rxe_guest.clone();
    let mut app = Appliance::boot_segment(a, &a.elf, NAME, "")?;
    // The default options: a real client's leases on the UMR path.
    let r = crate::lease_qemu::check_paths(&app.ready, "umr").and_then(|()| qemu_verify(a, &g, &mut app));
    app.drain();
    let qemu = match r {
        Ok(s) => s,
        Err(e) => return Err(app.fail(e)),
    };
    drop(app);
    let (hosted, _) = hosted_verify(a, &g).map_err(|e| format!("against the hosted appliance: {e}"))?;
    let (reference, ref_runs) =
        reference_verify(a, &g).map_err(|e| format!("against the rxe reference responder: {e}"))?;
    // The statuses are the same by the checks above (each run passed check_verify_runs); the qp-first delays
    // are compared as a ratio.
    let (m, r) = (after_revoke_median(&qemu.1, "qp-first"), after_revoke_median(&ref_runs, "qp-first"));
    let q = m.zip(r).and_then(|(m, r)| ratio(m, r)).ok_or("no qp-first first-fail delays to compare")?;
    if !(RATIO_MIN..=RATIO_MAX).contains(&q) {
        return Err(format!(
            "qp-first: REVOKE sent -> RETRY_EXC_ERR took {m:?} us against the model and {r:?} us against rxe \
             (ratio {q:.2}, allowed {RATIO_MIN}..{RATIO_MAX})"
        ));
    }
    Ok(format!(
        "QEMU appliance: {}; hosted appliance: {hosted}; rxe reference responder: {reference}; qp-first \
         status-12 delay model/reference {q:.2} ({} / {} us)",
        qemu.0,
        m.unwrap_or(0),
        r.unwrap_or(0)
    ))
}

/// The guest on the QEMU appliance's segment: control and RDMA both through the model's Ethernet port. After
/// the verifier, in the same boot, the client bindings run through libibverbs on rxe0 ([`bindings_cmd`]).
fn qemu_verify(a: &Artifacts, g: &Guest, app: &mut Appliance) -> Result<(String, Vec<VerifyRun>), String> {
    let hub = app.hub.ok_or("booted without the hub")?;
    let ctl_ip = app.ready.get("ip").ok_or("the ready line has no ip")?.to_string();
    let ctl = format!("{ctl_ip}:{}", crate::control::GUEST_PORT);
    let wire = Wire::start(hub.client, &a.log_dir.join(format!("{NAME}.pcap")))?;
    let nic = wire.nic();
    let cmd = format!(
        "{}; {}",
        verify_cmd(&ctl, &app.tenant_hex, &app.admin_hex, 1),
        bindings_cmd(&ctl, &app.tenant_hex, &app.admin_hex)
    );
    let out = client_guest(a, g, Client { nic, ip: GUEST_IP, neigh: vec![], cmd, tag: "guest" })?;
    let parts = split_parts(&out.lines);
    let part = |name: &str| {
        parts.iter().find(|p| p.name == name).ok_or_else(|| {
            format!(
                "the guest's command printed no `{PART_MARK}{name} N` line ({}): {}",
                out.at,
                out.lines.join("\n    | ")
            )
        })
    };
    let verify = part("verify")?;
    let verify_out = ClientOut { lines: verify.lines.clone(), code: verify.code, ..out.clone() };
    let (f, runs) = checked_verify(&verify_out)?;
    let bindings =
        check_bindings(part("c-example")?, part("pytest")?, part(KV_PART)?).map_err(|e| format!("{e} ({})", out.at))?;
    Ok((guest_summary(GUEST_IP, &f, Some(&bindings), &out, &wire), runs))
}

/// One client guest's line in the scenario's summary: the verifier's figures, what else it ran, the wire.
fn guest_summary(
    ip: Ipv4Addr,
    f: &lease_qemu::VerifyFigures,
    also: Option<&str>,
    out: &ClientOut,
    wire: &Wire,
) -> String {
    let n = wire.counts();
    format!(
        "rxe guest {ip} (Linux rdma_rxe, libibverbs), verify --backend verbs: {}; {}guest took {:.1} s; wire: {} \
         frames from the guest ({} padded to 60 bytes), {} to it",
        orders_summary(f),
        also.map(|a| format!("{a}; ")).unwrap_or_default(),
        out.out.took.as_secs_f64(),
        n.from_guest,
        n.padded,
        n.to_guest
    )
}

/// What ends each part of a chained guest command: `rxe-guest: part NAME EXIT`.
const PART_MARK: &str = "rxe-guest: part ";

/// The client bindings inside the guest, after the verifier (each part ends with its [`PART_MARK`] line):
/// the C example `kv_blocks` (registered blocks, zero copy, an asynchronous batch across two leases, a revoke
/// that fails only its lease's reads), the Python binding's pytest suite, and its key-value part on its own
/// (`tests/test_kv_*.py`: the store and the LMCache, vLLM and SGLang adapters, docs/kv.md), all through
/// libibverbs on rxe0 (`verbs:rxe0:1:1`: port 1, GID 1, the IPv4-mapped one). Tests that need a hosted
/// appliance started by the suite itself skip themselves when `LEASEBOX_TEST_APPLIANCE` names one
/// (app/client-py/tests/conftest.py).
fn bindings_cmd(ctl: &str, tenant_hex: &str, admin_hex: &str) -> String {
    let requester = "verbs:rxe0:1:1";
    let pytest = "python3 -m pytest -q -rs --color=no -p no:cacheprovider";
    format!(
        "echo {PART_MARK}verify $?; kv_blocks {ctl} demo {tenant_hex} {requester}; echo {PART_MARK}c-example $?; \
         cd /opt/leasebox/app/client-py && export LEASEBOX_TEST_APPLIANCE={ctl} LEASEBOX_TEST_KEY={tenant_hex} \
         LEASEBOX_TEST_ADMIN_KEY={admin_hex} LEASEBOX_TEST_REQUESTER={requester}; {pytest} --ignore-glob='*test_kv_*' \
         tests; echo {PART_MARK}pytest $?; {pytest} tests/test_kv_*.py; echo {PART_MARK}{KV_PART} $?"
    )
}

/// The key-value tests' part of [`bindings_cmd`].
const KV_PART: &str = "pytest-kv";

/// One part of a chained guest command: its lines and exit status.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub name: String,
    pub lines: Vec<String>,
    pub code: i32,
}

/// The parts of `lines` (a command's output), each ended by its [`PART_MARK`] line; lines after the last mark
/// belong to no part.
pub fn split_parts(lines: &[String]) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut acc = Vec::new();
    for l in lines {
        let done = l.strip_prefix(PART_MARK).and_then(|rest| {
            let (name, code) = rest.trim().rsplit_once(' ')?;
            Some((name.to_string(), code.parse::<i32>().ok()?))
        });
        match done {
            Some((name, code)) => parts.push(Part { name, lines: std::mem::take(&mut acc), code }),
            None => acc.push(l.clone()),
        }
    }
    parts
}

/// The C example's and pytest's parts checked: the example printed PASS steps and no FAIL and exited 0; each
/// pytest run (the suite, then its key-value tests) passed at least one test and failed none. Returns the
/// summary with pytest's closing lines.
fn check_bindings(c: &Part, py: &Part, kv: &Part) -> Result<String, String> {
    let passes = c.lines.iter().filter(|l| l.starts_with("PASS ")).count();
    let fails: Vec<&String> = c.lines.iter().filter(|l| l.starts_with("FAIL ")).collect();
    if c.code != 0 || passes == 0 || !fails.is_empty() {
        return Err(format!(
            "the C example kv_blocks over rxe0 exited {} with {passes} PASS and {} FAIL lines:\n    | {}",
            c.code,
            fails.len(),
            c.lines.join("\n    | ")
        ));
    }
    let suite = check_pytest("pytest in the guest", py)?;
    let kv = check_pytest("the key-value tests (pytest tests/test_kv_*.py) in the guest", kv)?;
    Ok(format!(
        "C example kv_blocks over rxe0: {passes} steps PASS; pytest in the guest over rxe0: {suite}; key-value \
         tests over rxe0: {kv}"
    ))
}

/// One pytest run's part: its closing line when it passed (at least one test, none failed, exit 0).
fn check_pytest(what: &str, py: &Part) -> Result<String, String> {
    let closing = crate::pytest::closing_line(&py.lines.join("\n"));
    match closing {
        Some(line) if py.code == 0 && crate::pytest::passed(&line) => Ok(line),
        _ => Err(format!(
            "{what} exited {}: {}\n    | {}",
            py.code,
            closing.as_deref().unwrap_or("no closing line"),
            py.lines.join("\n    | ")
        )),
    }
}

/// The guest beside the hosted appliance: the control channel through QEMU's user network (forwarded to the
/// hosted appliance's TCP port), RDMA through the wire to the model's UDP responder. That responder is a cable
/// end, not a station: it answers no ARP, so the guest gets a static neighbour entry for the RDMA address with
/// the port's MAC (read from an ALLOC's answer).
fn hosted_verify(a: &Artifacts, g: &Guest) -> Result<(String, Vec<VerifyRun>), String> {
    let h = hosted_setup(a, &format!("{NAME}-hosted"))?;
    let cmd = verify_cmd(&h.ctl, &h.t.tenant_hex, &h.t.admin_hex, 1);
    guest_verify(a, g, &h.wire, Client { nic: h.nic, ip: HOSTED_GUEST_IP, neigh: h.neigh, cmd, tag: "hosted-guest" })
}

/// The hosted appliance and the wire from a guest to its responder (see [`hosted_verify`]).
struct HostedSetup {
    /// Declared first: the wire's threads end before the appliance stops.
    wire: Wire,
    t: crate::control::Target,
    nic: Nic,
    neigh: Vec<(Ipv4Addr, [u8; 6])>,
    /// The control port as the guest reaches it.
    ctl: String,
}

fn hosted_setup(a: &Artifacts, pcap: &str) -> Result<HostedSetup, String> {
    let rdma_ip = format!("rdma_ip={HOSTED_RDMA_IP}");
    let t = crate::control::start_hosted(&["--hca", "--udp", "127.0.0.1:0", &rdma_ip])?;
    let udp = match t.udp.ok_or("the hosted appliance has no RoCEv2 responder")? {
        std::net::SocketAddr::V4(u) => u,
        other => return Err(format!("the responder is at {other}, not IPv4")),
    };
    let port = t.addr.rsplit(':').next().unwrap_or_default();
    let mac = server_mac(a, &t)?;
    let peer = free_udp_port()?;
    let wire = Wire::start(HubSocket { local: udp, peer }, &a.log_dir.join(format!("{pcap}.pcap")))?;
    let nic = Nic::SocketAndUser { local: wire.guest_local, peer: wire.guest_peer };
    let neigh = vec![(HOSTED_RDMA_IP, mac)];
    let ctl = format!("{USER_NET_HOST}:{port}");
    Ok(HostedSetup { wire, t, nic, neigh, ctl })
}

/// The hosted appliance's RDMA MAC, from the answer to one ALLOC (freed at once).
fn server_mac(a: &Artifacts, t: &crate::control::Target) -> Result<[u8; 6], String> {
    use crate::control::{Who, run_leasectl};
    let who = Who::Tenant(&t.tenant_hex);
    let gid = "00000000000000000000ffff0a00031e";
    #[rustfmt::skip]
    let args = ["--json", "alloc", "--size", "4096", "--qpn", "0x1234", "--psn", "5", "--gid", gid, "--mac", "02:00:00:00:00:02"];
    let out = run_leasectl(&a.leasectl_bin, &t.addr, Duration::from_secs(30), who, &args)?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("leasectl alloc --json: {e}: {out}"))?;
    let mac = v["server_mac"].as_str().and_then(crate::ctl_mlx5::parse_mac);
    let lease = v["lease"].as_str().unwrap_or_default().to_string();
    run_leasectl(&a.leasectl_bin, &t.addr, Duration::from_secs(30), who, &["free", &lease])?;
    mac.ok_or_else(|| format!("no server_mac in leasectl alloc --json: {out}"))
}

/// A client guest: its NIC and address, static neighbours, the command it runs and the name of its transcript.
pub(crate) struct Client {
    pub(crate) nic: Nic,
    pub(crate) ip: Ipv4Addr,
    pub(crate) neigh: Vec<(Ipv4Addr, [u8; 6])>,
    pub(crate) cmd: String,
    pub(crate) tag: &'static str,
}

/// What a client guest's command printed.
#[derive(Clone)]
pub(crate) struct ClientOut {
    out: GuestOutput,
    pub(crate) lines: Vec<String>,
    pub(crate) code: i32,
    /// Where to look (the transcript), for errors.
    pub(crate) at: String,
}

/// Boots the client guest and waits for it; checks the guest came up as it should (rxe0, the GID, the
/// neighbours) and that its command finished.
pub(crate) fn client_guest(a: &Artifacts, g: &Guest, c: Client) -> Result<ClientOut, String> {
    let run = GuestRun {
        nic: c.nic,
        ip: format!("{}/24", c.ip),
        gw: None,
        mac: GUEST_MAC,
        neigh: c.neigh,
        cmd: Some(c.cmd),
        deadline: GUEST_DEADLINE,
        log: a.log_dir.join(format!("{NAME}.{}.log", c.tag)),
        echo: a.echo,
    };
    let out = boot(&a.qemu, g, &run)?;
    let at = format!("guest transcript {}", run.log.display());
    check_guest(&out.transcript).map_err(|e| format!("{e} ({at})"))?;
    if !run.neigh.is_empty() && !out.transcript.contains("rxe-guest: neighbour ") {
        return Err(format!("the guest did not take its static neighbour entries {:?} ({at})", run.neigh));
    }
    // rxe0's GIDs: index 0 is the link-local one, index 1 the IPv4-mapped one of eth0's address.
    if gid_index_of(&out.transcript, c.ip) != Some(1) {
        return Err(format!("rxe0's GID 1 is not ::ffff:{} ({at})", c.ip));
    }
    let (lines, code) = out
        .command_output()
        .map(|(l, c)| (l.iter().map(|x| x.to_string()).collect::<Vec<_>>(), c))
        .ok_or_else(|| format!("the guest's command did not finish (powered off: {}; {at})", out.powered_off))?;
    Ok(ClientOut { out, lines, code, at })
}

/// The verifier's JSON among `c`'s lines (the last JSON line that is not `--perf`'s), checked as the other
/// scenarios check theirs.
fn checked_verify(c: &ClientOut) -> Result<(lease_qemu::VerifyFigures, Vec<VerifyRun>), String> {
    let at = &c.at;
    let json =
        c.lines.iter().rev().find(|l| l.trim_start().starts_with('{') && !l.contains("\"perf\"")).ok_or_else(|| {
            format!("leasectl printed no JSON (exit {}): {} ({at})", c.code, c.lines.join("\n    | "))
        })?;
    let runs: Vec<VerifyRun> = lease_qemu::parse_verify_json(json).map_err(|e| format!("{e} ({at})"))?;
    let f = lease_qemu::check_verify_runs(&runs).map_err(|e| format!("{e} (exit {}; {at})", c.code))?;
    if c.code != 0 {
        return Err(format!("leasectl exited {} though its verify runs pass ({at})", c.code));
    }
    Ok((f, runs))
}

fn orders_summary(f: &lease_qemu::VerifyFigures) -> String {
    let orders: Vec<String> = f
        .orders
        .iter()
        .map(|(o, recall, dp, status)| format!("{o} {status} (recall {recall} us, first fail {dp} us)"))
        .collect();
    format!("{}; retry time {} us", orders.join(", "), f.retry_time_us)
}

/// The median delay from REVOKE sent to the first failed completion over `order`'s iterations.
pub fn after_revoke_median(runs: &[VerifyRun], order: &str) -> Option<i64> {
    let mut v: Vec<i64> = runs
        .iter()
        .filter(|r| r.order == order)
        .flat_map(|r| r.iterations.iter().filter_map(|i| i.after_revoke_us))
        .collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Boots the client guest on `wire`, runs its verify command and checks the runs.
fn guest_verify(a: &Artifacts, g: &Guest, wire: &Wire, c: Client) -> Result<(String, Vec<VerifyRun>), String> {
    let ip = c.ip;
    let out = client_guest(a, g, c)?;
    let (f, runs) = checked_verify(&out)?;
    Ok((guest_summary(ip, &f, None, &out, wire), runs))
}

// ---- the reference responder: Linux rxe on both ends ----

/// The reference responder guest's address and MAC (on the client guest's segment, 10.0.2.0/24).
pub const REF_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 40);
pub const REF_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x28];

/// A guest running in the background, its console written to a file; killed when dropped.
pub struct Background {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the guest without waiting for it (its console goes to `r.log`).
pub fn spawn(qemu: &Path, g: &Guest, r: &GuestRun) -> Result<Background, String> {
    g.check_built()?;
    let file = std::fs::File::create(&r.log).map_err(|e| format!("{}: {e}", r.log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let child = Command::new(qemu)
        .args(r.qemu_args(g)?)
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", qemu.display()))?;
    Ok(Background { child, log: r.log.clone() })
}

/// The reference responder: a second rxe guest at [`REF_IP`] running `leasebox-hosted --verbs rxe0:1` (the
/// control protocol in front of real verbs: ALLOC registers an MR and makes an RC QP, REVOKE deregisters the MR
/// or moves the QP to ERR first), at the far end of a wire whose near end is for the client guest.
pub(crate) fn reference(a: &Artifacts, g: &Guest, keys: (&str, &str), tag: &str) -> Result<(Background, Wire), String> {
    let (ref_local, wire_bind) = (free_udp_port()?, free_udp_port()?);
    let wire = Wire::start(HubSocket { local: ref_local, peer: wire_bind }, &a.log_dir.join(format!("{tag}.pcap")))?;
    let cmd = format!(
        "leasebox-hosted --listen 0.0.0.0:{} --verbs rxe0:1 tenant=demo:{} admin={}",
        crate::control::GUEST_PORT,
        keys.0,
        keys.1
    );
    let run = GuestRun {
        nic: Nic::Socket { local: ref_local, peer: wire_bind },
        ip: format!("{REF_IP}/24"),
        gw: None,
        mac: REF_MAC,
        neigh: vec![],
        cmd: Some(cmd),
        deadline: GUEST_DEADLINE,
        log: a.log_dir.join(format!("{tag}.log")),
        echo: false,
    };
    Ok((spawn(&a.qemu, g, &run)?, wire))
}

/// A client command that first waits (up to about 150 s) for the control port at `ctl` to answer.
pub(crate) fn after_ping(ctl: &str, tenant_hex: &str, then: &str) -> String {
    format!(
        "i=0; until leasectl --addr {ctl} --timeout 5 --tenant demo --key {tenant_hex} ping >/dev/null 2>&1; do \
         i=$((i+1)); [ $i -gt 150 ] && break; sleep 1; done; {then}"
    )
}

/// The revoke test against the reference responder: the same command and checks as against the appliance.
fn reference_verify(a: &Artifacts, g: &Guest) -> Result<(String, Vec<VerifyRun>), String> {
    let (t, ad) = (crate::control::random_hex()?, crate::control::random_hex()?);
    let (refg, wire) = reference(a, g, (&t, &ad), &format!("{NAME}.reference"))?;
    let ctl = format!("{REF_IP}:{}", crate::control::GUEST_PORT);
    let cmd = after_ping(&ctl, &t, &verify_cmd(&ctl, &t, &ad, 1));
    let c = client_guest(a, g, Client { nic: wire.nic(), ip: GUEST_IP, neigh: vec![], cmd, tag: "reference-client" })
        .map_err(|e| format!("{e}; responder console {}", refg.log.display()))?;
    let (f, runs) = checked_verify(&c).map_err(|e| format!("{e}; responder console {}", refg.log.display()))?;
    Ok((format!("{}; client took {:.1} s", orders_summary(&f), c.out.took.as_secs_f64()), runs))
}

/// Model ÷ reference of the first failed completion's delay after REVOKE was sent, qp-first: the same
/// retry timer on the client decides both, so the ratio must be near 1 (allowed: [`RATIO_MIN`], [`RATIO_MAX`]).
pub const RATIO_MIN: f64 = 0.5;
pub const RATIO_MAX: f64 = 2.0;

pub fn ratio(model_us: i64, reference_us: i64) -> Option<f64> {
    (reference_us > 0 && model_us > 0).then(|| model_us as f64 / reference_us as f64)
}

// ---- the benchmark (`cargo xtask bench rxe`) ----

/// The sizes `cargo xtask bench rxe` measures.
pub const BENCH_SIZES: &str = "64,4K,1M";

fn perf_cmd(ctl: &str, tenant_hex: &str, perf_ms: u64) -> String {
    format!(
        "leasectl --addr {ctl} --timeout {ANSWER_TIMEOUT_S} --tenant demo --key {tenant_hex} --json verify \
         --backend verbs --device rxe0 --gid-index 1 --perf {BENCH_SIZES} --perf-ms {perf_ms} --depth 4"
    )
}

/// One `--perf` row: (op, size, p50 µs, p99 µs, MiB/s).
pub type PerfFigure = (String, u64, f64, f64, f64);

/// `leasectl --json verify --perf`'s rows among `lines`.
pub fn parse_perf(lines: &[String]) -> Result<Vec<PerfFigure>, String> {
    let line = lines.iter().find(|l| l.trim_start().starts_with("{\"perf\"")).ok_or("no --perf JSON")?;
    let v: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| format!("--perf JSON: {e}"))?;
    let rows = v["perf"].as_array().ok_or("--perf JSON without rows")?;
    rows.iter()
        .map(|r| {
            let f = |k: &str| r[k].as_f64().ok_or_else(|| format!("--perf row without {k}: {r}"));
            Ok((
                r["op"].as_str().unwrap_or("?").to_string(),
                r["size"].as_u64().unwrap_or(0),
                f("p50_us")?,
                f("p99_us")?,
                f("mib_per_s")?,
            ))
        })
        .collect()
}

/// What one side of the benchmark measured.
struct Side {
    perf: Vec<PerfFigure>,
    runs: Vec<VerifyRun>,
}

fn side(c: &ClientOut) -> Result<Side, String> {
    let perf = parse_perf(&c.lines).map_err(|e| format!("{e} ({})", c.at))?;
    let (_, runs) = checked_verify(c)?;
    Ok(Side { perf, runs })
}

fn size_name(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// The side-by-side table: each of `sides` (name, figures) against the last one, the reference.
fn table(sides: &[(&str, &Side)], perf_ms: u64) -> String {
    let Some(&(_, reference)) = sides.last() else { return String::new() };
    let mut t = format!(
        "RDMA from Linux rxe (a guest under QEMU/TCG, leasectl verify --backend verbs --perf, --depth 4, {perf_ms} ms \
         per figure); latency p50 / p99 us, bandwidth MiB/s; ratio: p50 against the last column\n{:<6} {:>8}",
        "op", "size"
    );
    for (name, _) in sides {
        t.push_str(&format!(" | {name:>37}"));
    }
    t.push('\n');
    for (i, r) in reference.perf.iter().enumerate() {
        t.push_str(&format!("{:<6} {:>8}", r.0, size_name(r.1)));
        for (_, s) in sides {
            match s.perf.get(i) {
                Some(m) => {
                    let ratio = if r.2 > 0.0 { format!("x{:.2}", m.2 / r.2) } else { "-".into() };
                    t.push_str(&format!(" | {:>9.1} / {:>9.1} {:>7.1} {:>6}", m.2, m.3, m.4, ratio));
                }
                None => t.push_str(&format!(" | {:>37}", "-")),
            }
        }
        t.push('\n');
    }
    t.push_str("revoke: first failed completion after REVOKE sent (median over iterations), and its status\n");
    for order in ["mkey-first", "qp-first"] {
        let status = |s: &Side| {
            s.runs
                .iter()
                .find(|r| r.order == order)
                .and_then(|r| r.iterations.first())
                .and_then(|i| i.status.clone())
                .unwrap_or_else(|| "-".into())
        };
        let r = after_revoke_median(&reference.runs, order);
        t.push_str(&format!("{order:<10}"));
        for (name, s) in sides {
            let m = after_revoke_median(&s.runs, order);
            let q = m.zip(r).and_then(|(m, r)| ratio(m, r)).map_or("-".into(), |q| format!("x{q:.2}"));
            t.push_str(&format!(" | {name}: {} {} us {q}", status(s), m.map_or("-".into(), |v| v.to_string())));
        }
        t.push('\n');
    }
    t
}

/// `cargo xtask bench rxe`: the same client guest against the QEMU appliance and against the rxe reference
/// responder, one after the other; returns the table.
pub fn bench(a: &Artifacts, perf_ms: u64) -> Result<String, String> {
    let g = a.rxe_guest.clone();
    let model = {
        let mut app = Appliance::boot_segment(a, &a.elf, "rxe-bench", "")?;
        let hub = app.hub.ok_or("booted without the hub")?;
        let ctl = format!("{}:{}", lease_qemu::SEGMENT_CTL_IP, crate::control::GUEST_PORT);
        let wire = Wire::start(hub.client, &a.log_dir.join("rxe-bench.pcap"))?;
        let cmd = format!(
            "{}; {}",
            perf_cmd(&ctl, &app.tenant_hex, perf_ms),
            verify_cmd(&ctl, &app.tenant_hex, &app.admin_hex, 1)
        );
        let r = client_guest(a, &g, Client { nic: wire.nic(), ip: GUEST_IP, neigh: vec![], cmd, tag: "bench-model" })
            .and_then(|c| side(&c));
        match r {
            Ok(s) => s,
            Err(e) => return Err(app.fail(format!("against the QEMU appliance: {e}"))),
        }
    };
    let hosted = {
        let h = hosted_setup(a, "rxe-bench-hosted")?;
        let (t, ad) = (&h.t.tenant_hex, &h.t.admin_hex);
        let cmd = format!("{}; {}", perf_cmd(&h.ctl, t, perf_ms), verify_cmd(&h.ctl, t, ad, 1));
        client_guest(a, &g, Client { nic: h.nic, ip: HOSTED_GUEST_IP, neigh: h.neigh, cmd, tag: "bench-hosted" })
            .and_then(|c| side(&c))
            .map_err(|e| format!("against the hosted appliance: {e}"))?
    };
    let reference = {
        let (t, ad) = (crate::control::random_hex()?, crate::control::random_hex()?);
        let (refg, wire) = reference(a, &g, (&t, &ad), "rxe-bench.reference")?;
        let ctl = format!("{REF_IP}:{}", crate::control::GUEST_PORT);
        let cmd = after_ping(&ctl, &t, &format!("{}; {}", perf_cmd(&ctl, &t, perf_ms), verify_cmd(&ctl, &t, &ad, 1)));
        client_guest(a, &g, Client { nic: wire.nic(), ip: GUEST_IP, neigh: vec![], cmd, tag: "bench-reference" })
            .and_then(|c| side(&c))
            .map_err(|e| format!("against the rxe reference responder: {e}; its console {}", refg.log.display()))?
    };
    Ok(table(
        &[("Leasebox, QEMU (model)", &model), ("Leasebox, hosted (model)", &hosted), ("rxe reference", &reference)],
        perf_ms,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_a_chained_command() {
        let lines: Vec<String> =
            ["{\"runs\":1}", "rxe-guest: part verify 0", "PASS a", "FAIL b", "rxe-guest: part c-example 1", "tail"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let p = split_parts(&lines);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].name.as_str(), p[0].code, p[0].lines.len()), ("verify", 0, 1));
        assert_eq!((p[1].name.as_str(), p[1].code), ("c-example", 1));
        assert_eq!(p[1].lines, ["PASS a", "FAIL b"]);
        let kv_ok = Part { name: KV_PART.into(), lines: vec!["....".into(), "9 passed in 40.2s".into()], code: 0 };
        assert!(check_bindings(&p[1], &p[0], &kv_ok).unwrap_err().contains("1 FAIL"));
        let ok_c = Part { name: "c-example".into(), lines: vec!["PASS x".into()], code: 0 };
        let py = |l: &str, code| Part { name: "pytest".into(), lines: vec!["..s".into(), l.into()], code };
        let summary = check_bindings(&ok_c, &py("== 12 passed, 3 skipped in 80.1s ==", 0), &kv_ok).unwrap();
        assert!(summary.contains("12 passed, 3 skipped") && summary.contains("key-value tests over rxe0: 9 passed"));
        assert!(check_bindings(&ok_c, &py("1 failed, 11 passed in 80.1s", 1), &kv_ok).is_err());
        assert!(check_bindings(&ok_c, &py("no tests ran in 0.1s", 5), &kv_ok).is_err());
        let fine = py("12 passed in 80.1s", 0);
        assert!(
            check_bindings(&ok_c, &py("12 passed in 80.1s", 2), &kv_ok).is_err(),
            "an exit status that is not 0 fails"
        );
        let silent = Part { name: "c-example".into(), lines: vec![], code: 0 };
        assert!(check_bindings(&silent, &fine, &kv_ok).is_err(), "an example that printed no PASS");
        // The key-value part is checked on its own: a failure there fails the scenario, and its absence (a
        // glob that matched nothing) too.
        let kv = |l: &str, code| Part { name: KV_PART.into(), lines: vec![l.into()], code };
        let e = check_bindings(&ok_c, &fine, &kv("1 failed, 8 passed in 40.0s", 1)).unwrap_err();
        assert!(e.contains("key-value tests") && e.contains("1 failed"), "{e}");
        assert!(check_bindings(&ok_c, &fine, &kv("no tests ran in 0.1s", 5)).is_err());
        assert!(
            check_bindings(&ok_c, &fine, &kv("ERROR: file or directory not found: tests/test_kv_*.py", 4)).is_err()
        );
    }

    #[test]
    fn the_guest_command_fits_the_kernel_command_line() {
        // The longest command the scenario gives its first guest: the verifier's and the bindings', with 32-byte
        // keys, on the user network with the control NIC and a neighbour entry.
        let key = "ab".repeat(32);
        let ctl = "10.0.2.15:7470";
        let cmd = format!("{}; {}", verify_cmd(ctl, &key, &key, 1), bindings_cmd(ctl, &key, &key));
        assert!(cmd.contains(&format!("{PART_MARK}{KV_PART} $?")) && cmd.contains("--ignore-glob='*test_kv_*'"));
        let mut r = GuestRun::user(PathBuf::from("/tmp/x.log"), Some(cmd));
        r.neigh = vec![(Ipv4Addr::new(10, 0, 3, 16), [2, 0, 0, 0, 0, 1])];
        let line = r.append().unwrap();
        assert!(line.len() < 2000, "{} bytes: little room left under x86's 2047", line.len());
    }

    #[test]
    fn a_command_line_too_long_for_the_kernel_is_refused() {
        let mut r = GuestRun::user(PathBuf::from("/tmp/x.log"), Some("x".repeat(1900)));
        assert!(r.append().is_ok());
        r.cmd = Some("x".repeat(2100));
        assert!(r.append().unwrap_err().contains("2047"));
    }

    #[test]
    fn command_output_between_markers() {
        let t = "boot\nrxe-guest: running: x\r\n{\"a\":1}\r\nrxe-guest: command exit 6\r\nrxe-guest: done\n";
        assert_eq!(command_output(t), Some((vec!["{\"a\":1}"], 6)));
        assert_eq!(command_output("rxe-guest: running: x\nhalf"), None);
        assert_eq!(command_output("nothing"), None);
    }

    #[test]
    fn short_frames_padded_like_a_mac_would() {
        let mut f = vec![0xff; 42];
        assert!(pad_frame(&mut f));
        assert_eq!(f.len(), ETH_MIN_FRAME);
        assert_eq!(&f[42..], &[0u8; 18]);
        let mut g = vec![1u8; 61];
        assert!(!pad_frame(&mut g));
        assert_eq!(g, vec![1u8; 61]);
    }

    #[test]
    fn the_wire_relays_both_ways_and_pads() {
        // The "hub": a socket standing for QEMU's hub port; the "guest": a socket at the wire's guest_local.
        let hub_local = UdpSocket::bind("127.0.0.1:0").unwrap();
        let hub_peer = free_udp_port().unwrap();
        let v4 = |s: &UdpSocket| match s.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let pcap = std::env::temp_dir().join(format!("rxe-wire-{}.pcap", std::process::id()));
        let w = Wire::start(HubSocket { local: v4(&hub_local), peer: hub_peer }, &pcap).unwrap();
        let guest = UdpSocket::bind(w.guest_local).unwrap();
        guest.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        hub_local.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        guest.send_to(&[7u8; 42], w.guest_peer).unwrap();
        let mut b = [0u8; 2048];
        let (n, from) = hub_local.recv_from(&mut b).unwrap();
        assert_eq!((n, &b[..3], from), (60, &[7u8, 7, 7][..], std::net::SocketAddr::V4(hub_peer)));
        hub_local.send_to(&[9u8; 50], hub_peer).unwrap();
        let n = guest.recv(&mut b).unwrap();
        assert_eq!(n, 50, "frames to the guest pass as they are");
        assert_eq!(w.counts(), WireCounts { from_guest: 1, padded: 1, to_guest: 1 });
        drop(w);
        let written = std::fs::read(&pcap).unwrap();
        assert_eq!(written.len(), 24 + 16 + 60 + 16 + 50, "the pcap header and both frames");
        let _ = std::fs::remove_file(&pcap);
    }

    #[test]
    fn medians_and_ratios() {
        let it = |us| lease_qemu::VerifyIteration { after_revoke_us: Some(us), ..Default::default() };
        let run = |order: &str, v: Vec<i64>| VerifyRun {
            order: order.into(),
            passed: true,
            retry_time_us: 0,
            iterations: v.into_iter().map(it).collect(),
            failures: vec![],
        };
        let runs = vec![run("mkey-first", vec![5]), run("qp-first", vec![300, 100, 200])];
        assert_eq!(after_revoke_median(&runs, "qp-first"), Some(200));
        assert_eq!(after_revoke_median(&runs, "none"), None);
        assert_eq!(ratio(150, 100), Some(1.5));
        assert_eq!(ratio(150, 0), None);
    }

    #[test]
    fn perf_rows_and_the_table() {
        let line = r#"{"perf":[{"op":"write","size":64,"p50_us":12.5,"p99_us":30.0,"mib_per_s":1.5,"ops_per_s":9.0}]}"#;
        let rows = parse_perf(&["x".to_string(), line.to_string()]).unwrap();
        assert_eq!(rows, vec![("write".to_string(), 64, 12.5, 30.0, 1.5)]);
        assert!(parse_perf(&["{}".to_string()]).is_err());
        let s = |p50: f64| Side { perf: vec![("write".into(), 1 << 20, p50, 2.0 * p50, 10.0)], runs: vec![] };
        let (m, r) = (s(20.0), s(10.0));
        let t = table(&[("model", &m), ("reference", &r)], 500);
        assert!(t.contains("1 MiB") && t.contains("x2.00") && t.contains("x1.00"), "{t}");
        assert_eq!(size_name(4096), "4 KiB");
        assert_eq!(size_name(64), "64 B");
    }

    #[test]
    fn gid_lines() {
        let t = "rxe-guest: gid 0 fe80:0000:0000:0000:004c:42ff:fe00:001e RoCE v2\n\
                 rxe-guest: gid 1 0000:0000:0000:0000:0000:ffff:0a00:021e RoCE v2\n";
        assert_eq!(gid_index_of(t, GUEST_IP), Some(1));
        assert_eq!(gid_index_of(t, Ipv4Addr::new(10, 0, 2, 31)), None);
    }

    #[test]
    fn command_lines_of_each_nic() {
        let g = Guest { kernel: "/k".into(), initramfs: "/i".into() };
        let mut r = GuestRun::user(PathBuf::from("/tmp/x.log"), Some("rdma dev".into()));
        r.neigh = vec![(Ipv4Addr::new(10, 0, 2, 16), [2, 0, 0, 0, 0, 1])];
        let a = r.qemu_args(&g).unwrap();
        let append = &a[a.iter().position(|x| x == "-append").unwrap() + 1];
        assert!(append.contains("rxe.ip=10.0.2.15/24 rxe.gw=10.0.2.2 rxe.neigh=10.0.2.16@02:00:00:00:00:01"));
        assert!(append.ends_with("rxe.cmd=\"rdma dev\""));
        assert!(a.contains(&"user,id=g0".to_string()));
        let (l, p) = ("127.0.0.1:5003".parse().unwrap(), "127.0.0.1:5004".parse().unwrap());
        r.nic = Nic::Socket { local: l, peer: p };
        assert!(r.qemu_args(&g).unwrap().contains(&"socket,id=g0,udp=127.0.0.1:5004,localaddr=127.0.0.1:5003".into()));
        r.nic = Nic::SocketAndUser { local: l, peer: p };
        let a = r.qemu_args(&g).unwrap();
        assert!(a.contains(&"socket,id=g0,udp=127.0.0.1:5004,localaddr=127.0.0.1:5003".into()));
        assert!(a.contains(&"user,id=u0".into()));
        assert!(a.contains(&"virtio-net-pci,netdev=g0,mac=02:4c:42:00:00:1e".into()));
        assert!(a.contains(&"virtio-net-pci,netdev=u0,mac=02:4c:42:00:00:9e".into()));
        assert!(a[a.iter().position(|x| x == "-append").unwrap() + 1].contains(" rxe.ctlip=10.0.2.15/24"));
        r.cmd = Some("echo \"x\"".into());
        assert!(r.qemu_args(&g).is_err());
    }
}
