//! The lease service end to end under QEMU: the image booted with the mlx5 model (guest RAM and
//! BAR in shared files, the model's RoCEv2 responder on a free UDP port) and virtio-net (control port forwarded,
//! fresh keys), then driven as a client would:
//!
//! 1. the `leasectl` binary: `alloc` → `ready` → `list` (Active) → `revoke` (TornDown) → `fenced` (none);
//! 2. RDMA through the model's port with the software requester ([`leasectl::rdma::SoftRoce`]): ALLOC with the
//!    requester's QP, connect, READY, a WRITE that lands in the lease (read back over RDMA and from the RAM
//!    file at `remote_addr`), REVOKE (MKEY first) → the next WRITE gets `IBV_WC_REM_ACCESS_ERR` at once; then
//!    on a fresh lease an admin REVOKE in the revoke spec's order (QP first) → only silence, `IBV_WC_RETRY_EXC_ERR`;
//! 3. the `leasectl` binary's revoke verifier, `verify --revoke-test --order both --json --plot`, against the
//!    guest's control port and the model's UDP port: mkey-first must fail the first request after the revoke
//!    with `IBV_WC_REM_ACCESS_ERR` within [`VERIFY_NAK_BOUND`] of the outcome; qp-first (QP `timeout` 12,
//!    `retry_cnt` 7: a 134 ms retry time) with `IBV_WC_RETRY_EXC_ERR` about one retry time after the REVOKE;
//! 4. a second image built with the `fence-test` feature, booted with `fence_test=on`: REVOKE answers Fenced,
//!    `leasectl fenced` lists the slot (DESTROY_MKEY bit, origin REVOKE), the next ALLOC gets another slot.
//!
//! Parsing of `leasectl` output is done by pure functions (tested below); the boots are driven by
//! [`check_normal`] and [`check_fence_test`], called by [`run`] (the scenario `cargo xtask test lease-qemu`).

use crate::{Artifacts, serial};
use leasebox_proto::{AllocReq, LeaseId, LeaseState, LeaseStats, Outcome, Request, Response, access, mtu_bytes};
use leasebox_qemu::model::{self, ModelCommand, ModelProcess, ModelShm};
use leasebox_qemu::{Boot, HostFwd, ModelHub, NextLine, QemuConfig, QemuProcess, Stdio};
use leasectl::client::{Client, Credentials, Timeouts};
use leasectl::rdma::{Completion, QpEndpoint, RcConfig, Requester, SoftConfig, SoftRoce, WcStatus};
use serde_json::Value;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The scenario's name in `cargo xtask test`.
pub const NAME: &str = "lease-qemu";
/// Guest control port.
const GUEST_PORT: u16 = 7470;
/// Boot to the ready line (DHCP and HCA bring-up) under TCG on a busy 2-core host.
const BOOT_DEADLINE: Duration = Duration::from_secs(150);
/// One answer from the guest (ALLOC runs six HCA commands round-robin on one TCG CPU).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// RDMA bytes written and read back per lease (8 packets at MTU 1024).
const RDMA_LEN: usize = 8192;
/// The requester's MTU (the path MTU is the smaller of this and the appliance's).
const RDMA_MTU: u32 = 1024;
/// The first lease's requester: transport timer 4.096 µs × 2^18 ≈ 1.07 s, so on loopback only a lost packet or
/// a missing answer lets it expire, never a busy host. REM_ACCESS_ERR after an MKEY-first revoke takes one round
/// trip through the model (native, not TCG): it must come before that timer could expire even once.
const PATIENT_QP_TIMEOUT: u8 = 18;
/// `verify` under TCG: iterations per order, WRITE size and depth (small: each iteration ALLOCs twice, and
/// every ALLOC runs six HCA commands on the one TCG CPU).
const VERIFY_ITERATIONS: u32 = 2;
const VERIFY_SIZE: u32 = 4096;
const VERIFY_DEPTH: u32 = 4;
/// The requester QP's `timeout` and `retry_cnt`.
/// QP `timeout` 12: 16.8 ms per attempt, 134 ms for all 8 — short for qp-first, and long enough that a model
/// process descheduled on this 2-core machine does not turn mkey-first's NAK into a retry timeout.
const VERIFY_QP_TIMEOUT: u8 = 12;
pub const VERIFY_RETRY_CNT: u8 = 7;
/// mkey-first: outcome → REM_ACCESS_ERR. The NAK is one round trip through the model (native), and the
/// outcome itself may come after it (negative figures). The status tells the NAK from the retries, and
/// `verify` fails any success after the outcome; this bound only says the refusal follows the outcome at once,
/// with a second of room for a loaded host and TCG's delivery of the answer.
const VERIFY_NAK_BOUND: Duration = Duration::from_secs(1);
/// qp-first: REVOKE sent → RETRY_EXC_ERR lies in [retry time / 2, retry time + this]. The lower half allows
/// for the timer running since the last ACK before the QP went to ERR; the slack covers the recall under TCG
/// (the QP goes to ERR somewhere between REVOKE sent and the outcome) and a busy host.
const VERIFY_RETRY_SLACK: Duration = Duration::from_millis(1500);
/// The appliance's RDMA address on QEMU's user subnet when the control NIC is the model's port (the port
/// answers ARP for it beside its DHCP address), as `cargo xtask run --ctl-nic mlx5` gives it.
pub const HUB_RDMA_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 2, 16);
/// The appliance's static control address on a segment without QEMU's user network ([`Appliance::boot_segment`]).
pub const SEGMENT_CTL_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 2, 15);
/// Serial lines shown with a failure.
const SERIAL_TAIL: usize = 25;
/// The CLI lease's requester parameters (a QP that never sends: the lease is only driven through the CLI).
const CLI_QPN: u32 = 0x1234;
const CLI_GID: &str = "00000000000000000000ffff7f000002";
const CLI_MAC: &str = "02:00:00:00:00:02";

fn free_udp_addr() -> Result<SocketAddr, String> {
    crate::rxe::free_udp_port().map(SocketAddr::V4)
}

/// Where guest physical `[addr, addr + len)` sits in a q35 guest's RAM file of `ram` bytes: QEMU 7.2's q35
/// keeps 2 GiB below the PCI hole once RAM reaches 2.75 GiB (all of it below otherwise) and continues the file
/// at guest physical 4 GiB (docs/reference/platform.md). Worked out here on its own, not taken from the model.
pub fn q35_file_offset(ram: u64, addr: u64, len: u64) -> Option<u64> {
    let below = if ram >= 0xb000_0000 { 2 << 30 } else { ram };
    let end = addr.checked_add(len)?;
    if end <= below {
        Some(addr)
    } else if addr >= 4 << 30 && end - (4 << 30) <= ram - below {
        Some(addr - (4 << 30) + below)
    } else {
        None
    }
}

/// The booted image with the model beside it. Fields drop in order: QEMU is killed and reaped, then the
/// model stopped, then the shared files deleted.
pub struct Appliance {
    qemu: QemuProcess,
    _model: ModelProcess,
    shm: ModelShm,
    pub addr: String,
    pub tenant_hex: String,
    pub admin_hex: String,
    /// The model's RoCEv2 responder.
    pub udp: SocketAddr,
    /// What the ready line said, for the summary.
    pub ready: serial::Ready,
    /// With the control channel on the model's Ethernet port: the hub joining QEMU's user network, the model's
    /// wire and a client's port (no virtio-net).
    pub hub: Option<ModelHub>,
    /// QEMU's command line.
    pub command: String,
    /// Where the model's stderr goes (it logs its Ethernet counters there when it stops).
    pub model_log: PathBuf,
    /// When the host read the ready line ([`Appliance::wait_ready`]).
    pub ready_at: Option<Instant>,
    lines: Vec<String>,
    /// When the host read each of `lines`.
    arrived: Vec<Instant>,
    log: PathBuf,
}

impl Appliance {
    /// Boots `elf` (1 CPU) with the model and virtio-net; `name` names the logs, `extra_args` are appended to
    /// the kernel command line. Returns once the ready line reports an address and a ConnectX-5.
    pub fn boot(a: &Artifacts, elf: &Path, name: &str, extra_args: &str) -> Result<Appliance, String> {
        Self::boot_mem(a, elf, name, extra_args, leasebox_qemu::config::DEFAULT_MEM_MIB)
    }

    /// As [`Appliance::boot`], with `mem_mib` MiB of guest RAM.
    pub fn boot_mem(
        a: &Artifacts,
        elf: &Path,
        name: &str,
        extra_args: &str,
        mem_mib: u32,
    ) -> Result<Appliance, String> {
        Self::boot_with(a, elf, name, extra_args, mem_mib, None)
    }

    /// As [`Appliance::boot_mem`], but returns as soon as the model and QEMU run, without waiting for the ready
    /// line ([`Appliance::wait_ready`]): for a caller that times the boot.
    pub fn spawn_mem(
        a: &Artifacts,
        elf: &Path,
        name: &str,
        extra_args: &str,
        mem_mib: u32,
    ) -> Result<Appliance, String> {
        Self::spawn_with(a, elf, name, extra_args, mem_mib, None)
    }

    /// As [`Appliance::boot`], with the control channel on the model's own Ethernet port and no virtio-net
    /// device: QEMU's user network (control port forwarded) and two UDP socket ports on hub 0, one the model's
    /// wire, one left for a client ([`Appliance::hub`]); kernel arguments `ctl_nic=mlx5 rdma_ip=`[`HUB_RDMA_IP`].
    pub fn boot_hub(a: &Artifacts, elf: &Path, name: &str, extra_args: &str) -> Result<Appliance, String> {
        let hub = ModelHub::pick().map_err(|e| format!("free UDP ports for the hub: {e}"))?;
        let args = format!("ctl_nic=mlx5 rdma_ip={HUB_RDMA_IP} {extra_args}");
        Self::boot_with(a, elf, name, &args, leasebox_qemu::config::DEFAULT_MEM_MIB, Some((hub, true)))
    }

    /// As [`Appliance::boot_hub`], but the hub holds only the model's wire and the client port: no QEMU user
    /// network, so nothing on the host reaches the control port ([`Appliance::addr`] answers nothing) and the
    /// appliance has the static address [`SEGMENT_CTL_IP`]. For a client that is a full station on the
    /// segment (the rxe guest): QEMU's user network reads every frame on a hub whatever its destination MAC
    /// and resets TCP connections between other stations (docs/reference/platform.md, "A hub of UDP ports").
    pub fn boot_segment(a: &Artifacts, elf: &Path, name: &str, extra_args: &str) -> Result<Appliance, String> {
        let hub = ModelHub::pick().map_err(|e| format!("free UDP ports for the hub: {e}"))?;
        let args = format!("ctl_nic=mlx5 ip={SEGMENT_CTL_IP}/24 rdma_ip={HUB_RDMA_IP} {extra_args}");
        Self::boot_with(a, elf, name, &args, leasebox_qemu::config::DEFAULT_MEM_MIB, Some((hub, false)))
    }

    fn boot_with(
        a: &Artifacts,
        elf: &Path,
        name: &str,
        extra_args: &str,
        mem_mib: u32,
        hub: Option<(ModelHub, bool)>,
    ) -> Result<Appliance, String> {
        let mut app = Self::spawn_with(a, elf, name, extra_args, mem_mib, hub)?;
        app.wait_ready()?;
        Ok(app)
    }

    fn spawn_with(
        a: &Artifacts,
        elf: &Path,
        name: &str,
        extra_args: &str,
        mem_mib: u32,
        hub: Option<(ModelHub, bool)>,
    ) -> Result<Appliance, String> {
        let (tenant_hex, admin_hex) = (crate::control::random_hex()?, crate::control::random_hex()?);
        let port = crate::control::free_port()?;
        let udp = free_udp_addr()?;
        let append = format!("tenant=demo:{tenant_hex} admin={admin_hex} {extra_args}");
        let mut c = QemuConfig::new(Boot::Kernel { elf: elf.to_path_buf(), append });
        c.qemu = a.qemu.clone();
        c.cpu = a.cpu.clone();
        c.smp = 1;
        c.mem_mib = mem_mib;
        c.net = Some(HostFwd::localhost(port, GUEST_PORT));
        std::fs::create_dir_all(&a.log_dir).map_err(|e| format!("creating {}: {e}", a.log_dir.display()))?;
        let shm = ModelShm::create(&a.shm_dir, model::DEFAULT_BAR_BYTES, c.mem_mib).map_err(|e| e.to_string())?;
        let model_log = a.log_dir.join(format!("{name}.model.log"));
        let mut cmd = ModelCommand::new(a.model_bin.clone());
        cmd.log = Some(model_log.clone());
        cmd.trace = Some(crate::model_trace_path(a, name));
        cmd.udp = Some(udp.to_string());
        if let Some((h, user_net)) = &hub {
            // No virtio-net: the guest reaches QEMU's user network only through the model's Ethernet port.
            c.virtio_net = false;
            c.hub = h.ports();
            cmd.eth_udp = Some(h.model_wire());
            if !user_net {
                c.net = None;
            }
        }
        let hub = hub.map(|(h, _)| h);
        let model = ModelProcess::spawn(&cmd, shm.files(), c.mem_mib, model::READY_TIMEOUT)
            .map_err(|e| format!("{e} (binary {})", a.model_bin.display()))?;
        c.model = Some(shm.files().clone());
        let qemu = QemuProcess::spawn(&c, Stdio::Capture { echo: a.echo }, vec![]).map_err(|e| e.to_string())?;
        let mut app = Appliance {
            qemu,
            _model: model,
            shm,
            addr: format!("127.0.0.1:{port}"),
            tenant_hex,
            admin_hex,
            udp,
            ready: serial::Ready { fields: Vec::new() },
            hub,
            command: String::new(),
            model_log,
            ready_at: None,
            lines: Vec::new(),
            arrived: Vec::new(),
            log: a.log_dir.join(format!("{name}.log")),
        };
        app.command = app.qemu.command().to_string();
        Ok(app)
    }

    /// Reads serial lines until the ready line (within [`BOOT_DEADLINE`] of QEMU's start), which must report an
    /// address and a ConnectX-5; keeps it in [`Appliance::ready`] and when it came in [`Appliance::ready_at`].
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = self.qemu.started() + BOOT_DEADLINE;
        loop {
            match self.qemu.next_line(deadline) {
                NextLine::Line(l) => {
                    self.push_line(l.text.clone(), l.at);
                    if let Some(r) = serial::parse_ready(&l.text) {
                        if r.get("ip").is_none_or(|ip| ip == "none") {
                            return Err(self.fail(format!("the ready line has no address: {}", l.text)));
                        }
                        if r.get("hca") != Some("ConnectX-5") {
                            return Err(self.fail(format!("the ready line has no ConnectX-5: {}", l.text)));
                        }
                        self.ready = r;
                        self.ready_at = Some(l.at);
                        return Ok(());
                    }
                    if l.text.contains("!!!") || l.text.contains("PANIC") {
                        return Err(self.fail(format!("guest failed: {}", l.text)));
                    }
                }
                NextLine::Closed => return Err(self.fail("QEMU exited before the ready line".into())),
                NextLine::TimedOut => {
                    return Err(self.fail(format!("no ready line within {} s", BOOT_DEADLINE.as_secs())));
                }
            }
        }
    }

    /// When QEMU was spawned.
    pub fn started(&self) -> Instant {
        self.qemu.started()
    }

    fn push_line(&mut self, text: String, at: Instant) {
        self.lines.push(text);
        self.arrived.push(at);
    }

    /// The first serial line that `pred` accepts, among those collected so far or arriving before `deadline`,
    /// with when the host read it. `Ok(None)` when `deadline` passes first; `Err` when QEMU exits or the guest
    /// reports a failure first.
    pub fn wait_line(
        &mut self,
        pred: impl Fn(&str) -> bool,
        deadline: Instant,
    ) -> Result<Option<(String, Instant)>, String> {
        if let Some(i) = self.lines.iter().position(|l| pred(l)) {
            return Ok(Some((self.lines[i].clone(), self.arrived[i])));
        }
        loop {
            match self.qemu.next_line(deadline) {
                NextLine::Line(l) => {
                    self.push_line(l.text.clone(), l.at);
                    if pred(&l.text) {
                        return Ok(Some((l.text, l.at)));
                    }
                    if l.text.contains("!!!") || l.text.contains("PANIC") {
                        return Err(format!("guest failed: {}", l.text));
                    }
                }
                NextLine::Closed => return Err("QEMU exited".into()),
                NextLine::TimedOut => return Ok(None),
            }
        }
    }

    /// Collects the serial lines that arrived so far and writes them to the log.
    pub fn drain(&mut self) {
        while let NextLine::Line(l) = self.qemu.next_line(Instant::now()) {
            self.push_line(l.text, l.at);
        }
        let _ = std::fs::write(&self.log, self.lines.join("\n") + "\n");
    }

    /// Collects serial lines until QEMU exits (true) or `deadline` passes (false).
    pub fn wait_exit(&mut self, deadline: Instant) -> bool {
        loop {
            match self.qemu.next_line(deadline) {
                NextLine::Line(l) => self.push_line(l.text, l.at),
                NextLine::Closed => {
                    let _ = std::fs::write(&self.log, self.lines.join("\n") + "\n");
                    return true;
                }
                NextLine::TimedOut => return false,
            }
        }
    }

    /// Every serial line so far (collected first).
    pub fn serial_lines(&mut self) -> &[String] {
        self.drain();
        &self.lines
    }

    /// Where the serial log is written.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `why`, with the last serial lines and where the full log is.
    pub fn fail(&mut self, why: String) -> String {
        // Give the guest a moment to print what it has to say about the failure.
        std::thread::sleep(Duration::from_millis(500));
        self.drain();
        let tail = &self.lines[self.lines.len().saturating_sub(SERIAL_TAIL)..];
        format!("{why}\n    last serial lines:\n    | {}\n    full log: {}", tail.join("\n    | "), self.log.display())
    }

    pub fn tenant(&self) -> Credentials {
        crate::control::credentials("demo", &self.tenant_hex)
    }

    pub fn admin(&self) -> Credentials {
        crate::control::credentials("admin", &self.admin_hex)
    }

    /// An authenticated session with a generous answer timeout.
    pub fn session(&self, who: &Credentials) -> Result<Client, String> {
        let t = Timeouts { retry_for: Duration::from_secs(30), receive: ANSWER_TIMEOUT, ..Timeouts::default() };
        Client::connect_and_hello(&self.addr, who, t)
            .map(|(c, _)| c)
            .map_err(|e| format!("session to {}: {e}", self.addr))
    }

    /// `len` bytes of guest RAM at device (guest physical) address `addr`, read from the model's RAM file.
    pub fn ram(&self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        let path = &self.shm.files().ram;
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let size = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        let at = q35_file_offset(size, addr, len as u64)
            .ok_or_else(|| format!("{addr:#x}+{len:#x} is not guest RAM (q35, {} MiB)", size >> 20))?;
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, at).map_err(|e| format!("reading {len} bytes at {addr:#x} of the RAM file: {e}"))?;
        Ok(b)
    }

    /// Runs the `leasectl` binary as the tenant (or the admin); returns its stdout.
    pub fn leasectl(&self, bin: &Path, admin: bool, args: &[&str]) -> Result<String, String> {
        use crate::control::Who;
        let who = if admin { Who::Admin(&self.admin_hex) } else { Who::Tenant(&self.tenant_hex) };
        crate::control::run_leasectl(bin, &self.addr, ANSWER_TIMEOUT, who, args)
    }
}

// ---- parsers of leasectl's output (render.rs) ----

/// The fields of an ALLOC answer the checks need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocOut {
    pub lease: String,
    pub rkey: u32,
    pub remote_addr: u64,
    pub server_qpn: u32,
}

impl AllocOut {
    pub fn slot(&self) -> Result<u32, String> {
        Ok(leasectl::args::parse_lease(&self.lease)?.slot)
    }
}

fn number(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("`{s}` is not a number"))
}

/// `leasectl alloc`: `key  value` lines.
pub fn parse_alloc_human(text: &str) -> Result<AllocOut, String> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.split_once(char::is_whitespace).filter(|(key, _)| *key == k).map(|(_, v)| v.trim()))
            .ok_or_else(|| format!("no `{k}` in the alloc output: {text:?}"))
    };
    let u32_field = |k: &str| number(field(k)?).and_then(|n| u32::try_from(n).map_err(|_| format!("{k} {n}")));
    Ok(AllocOut {
        lease: field("lease")?.to_string(),
        rkey: u32_field("rkey")?,
        remote_addr: number(field("remote_addr")?)?,
        server_qpn: u32_field("server_qpn")?,
    })
}

/// `leasectl --json alloc`.
pub fn parse_alloc_json(text: &str) -> Result<AllocOut, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("alloc --json: {e}: {text:?}"))?;
    let n = |k: &str| v[k].as_u64().ok_or_else(|| format!("alloc --json has no number `{k}`: {text:?}"));
    let n32 = |k: &str| n(k).and_then(|x| u32::try_from(x).map_err(|_| format!("{k} {x}")));
    Ok(AllocOut {
        lease: v["lease"].as_str().ok_or_else(|| format!("alloc --json has no lease: {text:?}"))?.to_string(),
        rkey: n32("rkey")?,
        remote_addr: n("remote_addr")?,
        server_qpn: n32("server_qpn")?,
    })
}

/// `lease S.G: STATE` (ready) or `lease S.G: OUTCOME in N us` (free, revoke): the lease, the word after the
/// colon and the microseconds when given.
pub fn parse_lease_line(text: &str) -> Result<(String, String, Option<u32>), String> {
    let line = text.lines().find(|l| l.starts_with("lease ")).ok_or_else(|| format!("no `lease ...:` in {text:?}"))?;
    let (lease, rest) = line["lease ".len()..].split_once(": ").ok_or_else(|| format!("no colon in {line:?}"))?;
    let mut words = rest.split_whitespace();
    let what = words.next().ok_or_else(|| format!("nothing after the colon in {line:?}"))?.to_string();
    let us = match (words.next(), words.next(), words.next()) {
        (Some("in"), Some(n), Some("us")) => Some(n.parse().map_err(|_| format!("bad microseconds in {line:?}"))?),
        (None, _, _) => None,
        _ => return Err(format!("unexpected {line:?}")),
    };
    Ok((lease.to_string(), what, us))
}

/// `leasectl list`: the state column of `lease`'s row, `None` when it is not listed.
pub fn list_state_human(text: &str, lease: &str) -> Option<String> {
    text.lines().skip_while(|l| !l.starts_with("LEASE")).skip(1).find_map(|l| {
        let mut cols = l.split_whitespace();
        (cols.next() == Some(lease)).then(|| cols.next().unwrap_or_default().to_string())
    })
}

/// `leasectl --json list`: the state of `lease`, `None` when it is not listed.
pub fn list_state_json(text: &str, lease: &str) -> Result<Option<String>, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("list --json: {e}: {text:?}"))?;
    let leases = v["leases"].as_array().ok_or_else(|| format!("list --json has no leases array: {text:?}"))?;
    Ok(leases.iter().find(|l| l["lease"] == lease).map(|l| l["state"].as_str().unwrap_or_default().to_string()))
}

/// One row of FENCED_SUMMARY.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedRow {
    pub slot: u32,
    pub generation: u32,
    pub failed_mask: u32,
    pub origin: String,
}

/// `leasectl fenced`: `no fenced slots`, or a header and one row per slot.
pub fn parse_fenced_human(text: &str) -> Result<Vec<FencedRow>, String> {
    if text.trim() == "no fenced slots" {
        return Ok(Vec::new());
    }
    let mut lines = text.lines();
    if !lines.next().is_some_and(|h| h.starts_with("SLOT")) {
        return Err(format!("fenced: no header in {text:?}"));
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            let [slot, generation, mask, origin, ..] = c.as_slice() else {
                return Err(format!("fenced: short row {l:?}"));
            };
            let n32 = |s: &str| number(s).and_then(|n| u32::try_from(n).map_err(|_| format!("{n} in {l:?}")));
            Ok(FencedRow {
                slot: n32(slot)?,
                generation: n32(generation)?,
                failed_mask: n32(mask)?,
                origin: origin.to_string(),
            })
        })
        .collect()
}

/// `leasectl --json fenced`.
pub fn parse_fenced_json(text: &str) -> Result<Vec<FencedRow>, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("fenced --json: {e}: {text:?}"))?;
    let slots = v["slots"].as_array().ok_or_else(|| format!("fenced --json has no slots array: {text:?}"))?;
    slots
        .iter()
        .map(|s| {
            let n = |k: &str| {
                s[k].as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| format!("fenced --json: {k} in {s}"))
            };
            Ok(FencedRow {
                slot: n("slot")?,
                generation: n("generation")?,
                failed_mask: n("failed_mask")?,
                origin: s["origin"].as_str().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// The `outcome` of `leasectl --json revoke` / `free`.
pub fn outcome_json(text: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("--json: {e}: {text:?}"))?;
    v["outcome"].as_str().map(str::to_string).ok_or_else(|| format!("no outcome in {text:?}"))
}

/// DESTROY_MKEY's bit in a fenced slot's failed-step mask (docs/revoke-semantics.md).
pub const FAILED_DESTROY_MKEY: u32 = 1 << 0;

// ---- the checks ----

pub(crate) fn expect(what: &str, ok: bool, got: &dyn std::fmt::Debug) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("{what}: got {got:?}")) }
}

/// One order's run of `leasectl --json verify` (`--order both` prints `{"passed", "runs": [...]}`).
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyRun {
    pub order: String,
    pub passed: bool,
    pub retry_time_us: i64,
    pub iterations: Vec<VerifyIteration>,
    pub failures: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifyIteration {
    pub recall_us: Option<i64>,
    pub dataplane_us: Option<i64>,
    /// The first failed completion's `ibv_wc_status` name and its REVOKE sent → completion time.
    pub status: Option<String>,
    pub after_revoke_us: Option<i64>,
    /// How the requester learned the appliance's MAC (`arp`, `flag`, `endpoint`, `placeholder`) and that MAC.
    pub mac_source: Option<String>,
    pub remote_mac: Option<String>,
}

/// `leasectl --json verify`: one report object, or `{"passed", "runs": [...]}` with one per order.
pub fn parse_verify_json(text: &str) -> Result<Vec<VerifyRun>, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("verify --json: {e}: {text:?}"))?;
    let one = |r: &Value| -> Result<VerifyRun, String> {
        let results = r["results"].as_array().ok_or_else(|| format!("verify --json: no results in {r}"))?;
        Ok(VerifyRun {
            order: r["order"].as_str().ok_or_else(|| format!("verify --json: no order in {r}"))?.to_string(),
            passed: r["passed"].as_bool().ok_or_else(|| format!("verify --json: no passed in {r}"))?,
            retry_time_us: r["retry_time_us"].as_i64().unwrap_or(0),
            iterations: results
                .iter()
                .map(|i| VerifyIteration {
                    recall_us: i["recall_us"].as_i64(),
                    dataplane_us: i["dataplane_us"].as_i64(),
                    status: i["first_fail"]["status"].as_str().map(str::to_string),
                    after_revoke_us: i["first_fail"]["after_revoke_us"].as_i64(),
                    mac_source: i["mac_source"].as_str().map(str::to_string),
                    remote_mac: i["remote_mac"].as_str().map(str::to_string),
                })
                .collect(),
            failures: r["failures"]
                .as_array()
                .map(|f| f.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
        })
    };
    match v["runs"].as_array() {
        Some(runs) => runs.iter().map(one).collect(),
        None if v["error"].is_object() => Err(format!("verify failed to run: {}", v["error"])),
        None => Ok(vec![one(&v)?]),
    }
}

/// The figures of `verify` for the summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifyFigures {
    /// Per order: (order, recall max µs, dataplane max µs, status).
    pub orders: Vec<(String, i64, i64, String)>,
    pub retry_time_us: i64,
}

/// The checks on `verify`'s runs: both orders present and passed, the expected status in every iteration,
/// the dataplane figures within their windows.
pub fn check_verify_runs(runs: &[VerifyRun]) -> Result<VerifyFigures, String> {
    let mut f = VerifyFigures::default();
    for want in ["mkey-first", "qp-first"] {
        let r = runs.iter().find(|r| r.order == want).ok_or_else(|| format!("verify: no {want} run"))?;
        if !r.passed || r.iterations.is_empty() {
            return Err(format!("verify {want} did not pass: {:?}", r.failures));
        }
        let (status, nak) =
            (if want == "mkey-first" { "IBV_WC_REM_ACCESS_ERR" } else { "IBV_WC_RETRY_EXC_ERR" }, want == "mkey-first");
        let (mut recall_max, mut dp_max) = (i64::MIN, i64::MIN);
        for (n, i) in r.iterations.iter().enumerate() {
            let what = format!("verify {want} iteration {n}");
            expect(&format!("{what}: first failed completion"), i.status.as_deref() == Some(status), i)?;
            let (recall, dp) = match (i.recall_us, i.dataplane_us) {
                (Some(r), Some(d)) => (r, d),
                _ => return Err(format!("{what}: no recall or dataplane figure: {i:?}")),
            };
            if nak {
                let bound = VERIFY_NAK_BOUND.as_micros() as i64;
                expect(&format!("{what}: dataplane first-fail < {VERIFY_NAK_BOUND:?}"), dp < bound, i)?;
            } else {
                let since = i.after_revoke_us.unwrap_or(i64::MIN);
                let (lo, hi) = (r.retry_time_us / 2, r.retry_time_us + VERIFY_RETRY_SLACK.as_micros() as i64);
                let ok = since >= lo && since <= hi;
                let msg = format!("{what}: REVOKE sent → RETRY_EXC_ERR within [{lo}, {hi}] µs (retry time)");
                expect(&msg, ok, i)?;
            }
            recall_max = recall_max.max(recall);
            dp_max = dp_max.max(dp);
        }
        if !nak {
            f.retry_time_us = r.retry_time_us;
        }
        f.orders.push((want.to_string(), recall_max, dp_max, status.to_string()));
    }
    Ok(f)
}

/// Item 3: the `leasectl` binary's `verify --revoke-test`, both orders, with a plot beside the logs.
fn verify_cli(app: &Appliance, bin: &Path) -> Result<(VerifyFigures, PathBuf), String> {
    let plot = app.log.with_file_name(format!("{NAME}-revoke.svg"));
    let udp = app.udp.to_string();
    let cable = ["--udp", &udp, "--plot", plot.to_str().unwrap_or("lease-qemu-revoke.svg")];
    let (f, _) = verify_revoke_test(app, bin, &cable)?;
    let svg = std::fs::read_to_string(&plot).map_err(|e| format!("--plot {}: {e}", plot.display()))?;
    expect("the plot", svg.contains("<svg") && svg.contains("dataplane first-fail"), &plot)?;
    Ok((f, plot))
}

/// verify's iterations, sizes and QP timers in every scenario that runs `leasectl verify --revoke-test`, with
/// the QP's transport retry count `retry_cnt` (normally [`VERIFY_RETRY_CNT`]).
pub fn verify_args(retry_cnt: u8) -> Vec<String> {
    #[rustfmt::skip]
    let a = [
        "--iterations", &VERIFY_ITERATIONS.to_string(), "--size", &VERIFY_SIZE.to_string(),
        "--depth", &VERIFY_DEPTH.to_string(), "--timeout", &VERIFY_QP_TIMEOUT.to_string(),
        "--retry-cnt", &retry_cnt.to_string(),
    ].map(str::to_string);
    a.to_vec()
}

/// `leasectl --json verify --revoke-test --order both` with this scenario's iterations, sizes and QP timers,
/// plus `cable` (where the RDMA frames go and how; a plot); its runs must pass [`check_verify_runs`].
pub fn verify_revoke_test(
    app: &Appliance,
    bin: &Path,
    cable: &[&str],
) -> Result<(VerifyFigures, Vec<VerifyRun>), String> {
    let v = verify_args(VERIFY_RETRY_CNT);
    let mut args = vec!["--json", "verify", "--revoke-test", "--order", "both", "--admin-key", &app.admin_hex];
    args.extend(v.iter().map(String::as_str));
    args.extend_from_slice(cable);
    // `leasectl` exits 6 when a check fails: its JSON says which, so parse it before judging the exit status.
    let out = match app.leasectl(bin, false, &args) {
        Ok(out) => out,
        Err(e) => match e.split_once("): ").map(|(_, rest)| parse_verify_json(rest)) {
            Some(Ok(runs)) => {
                let why = check_verify_runs(&runs).err().unwrap_or_else(|| format!("{runs:?}"));
                return Err(format!("leasectl verify exited non-zero: {why}\n    leasectl output: {e}"));
            }
            _ => return Err(e),
        },
    };
    let runs = parse_verify_json(&out)?;
    let f = check_verify_runs(&runs).map_err(|e| format!("{e}\n    leasectl output: {out}"))?;
    Ok((f, runs))
}

/// Item 1: the lease life cycle through the `leasectl` binary. Returns the revoke's elapsed microseconds.
pub fn cli_cycle(app: &Appliance, bin: &Path) -> Result<u32, String> {
    let out = app.leasectl(
        bin,
        false,
        &["alloc", "--size", "4096", "--qpn", "0x1234", "--psn", "5", "--gid", CLI_GID, "--mac", CLI_MAC],
    )?;
    let a = parse_alloc_human(&out)?;
    let (cq, sq) = (format!("{CLI_QPN:#x}"), format!("{:#x}", a.server_qpn));
    let out = app.leasectl(bin, false, &["ready", &a.lease, "--client-qpn", &cq, "--server-qpn", &sq])?;
    let (lease, state, _) = parse_lease_line(&out)?;
    expect("leasectl ready", lease == a.lease && state == "Active", &out)?;
    let out = app.leasectl(bin, false, &["list"])?;
    expect("leasectl list", list_state_human(&out, &a.lease).as_deref() == Some("Active"), &out)?;
    let out = app.leasectl(bin, false, &["--json", "list"])?;
    expect("leasectl --json list", list_state_json(&out, &a.lease)?.as_deref() == Some("Active"), &out)?;
    let out = app.leasectl(bin, false, &["revoke", &a.lease])?;
    let (lease, outcome, us) = parse_lease_line(&out)?;
    expect("leasectl revoke", lease == a.lease && outcome == "TornDown" && us.is_some(), &out)?;
    let out = app.leasectl(bin, false, &["fenced"])?;
    expect("leasectl fenced", parse_fenced_human(&out)?.is_empty(), &out)?;
    let out = app.leasectl(bin, true, &["--json", "fenced"])?;
    expect("leasectl --admin --json fenced", parse_fenced_json(&out)?.is_empty(), &out)?;
    Ok(us.unwrap_or(0))
}

/// The next `n` completions within `budget`.
fn completions(r: &mut SoftRoce, n: usize, budget: Duration) -> Result<Vec<Completion>, String> {
    let end = Instant::now() + budget;
    let mut all = Vec::new();
    while all.len() < n {
        if Instant::now() >= end {
            return Err(format!("{} of {n} completions within {budget:?}: {all:?}", all.len()));
        }
        all.extend(r.poll(Duration::from_millis(20)));
    }
    Ok(all)
}

pub(crate) fn one(r: &mut SoftRoce, budget: Duration) -> Result<Completion, String> {
    Ok(completions(r, 1, budget)?[0])
}

pub(crate) fn pattern(seed: u32) -> Vec<u8> {
    (0..RDMA_LEN as u32).map(|i| (i ^ seed).wrapping_mul(2_654_435_761).to_be_bytes()[0]).collect()
}

/// A lease with a connected software requester.
pub(crate) struct RdmaLease {
    pub(crate) r: SoftRoce,
    pub(crate) alloc: leasebox_proto::AllocResp,
}

/// ALLOC of `size` bytes with `r`'s QP, connect `r` to the server QP, READY.
pub(crate) fn rdma_lease(app: &Appliance, tenant: &mut Client, rc: RcConfig, size: u64) -> Result<RdmaLease, String> {
    rdma_lease_at(app.udp, tenant, rc, size)
}

/// [`rdma_lease`] with the requester toward `peer`, the RoCEv2 responder of any appliance.
pub(crate) fn rdma_lease_at(
    peer: SocketAddr,
    tenant: &mut Client,
    rc: RcConfig,
    size: u64,
) -> Result<RdmaLease, String> {
    let cfg = SoftConfig { peer, rc, mtu: RDMA_MTU, ..SoftConfig::default() };
    let mut r = SoftRoce::new(cfg).map_err(|e| format!("software requester: {e}"))?;
    let me = r.local();
    let req = AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: me.qpn,
        client_psn: me.psn,
        client_gid: me.gid,
        client_mac: me.mac,
    };
    let alloc = match tenant.call(&Request::Alloc(req)) {
        Ok(Response::Alloc(a)) => a,
        other => return Err(format!("ALLOC: {other:?}")),
    };
    let mtu = mtu_bytes(alloc.mtu).ok_or_else(|| format!("ALLOC answered MTU code {}", alloc.mtu))?;
    let remote =
        QpEndpoint { qpn: alloc.server_qpn, psn: alloc.server_psn, gid: alloc.server_gid, mac: alloc.server_mac, mtu };
    r.connect(&remote).map_err(|e| format!("connecting the requester: {e}"))?;
    match tenant.call(&Request::Ready { lease: alloc.lease, client_qpn: me.qpn, server_qpn: alloc.server_qpn }) {
        Ok(Response::Ready { state: LeaseState::Active }) => {}
        other => return Err(format!("READY: {other:?}")),
    }
    Ok(RdmaLease { r, alloc })
}

pub(crate) fn revoke(c: &mut Client, lease: LeaseId, qp_first: bool) -> Result<(Outcome, u32), String> {
    match c.call(&Request::Revoke { lease, qp_first }) {
        Ok(Response::Revoke { outcome, elapsed_us }) => Ok((outcome, elapsed_us)),
        other => Err(format!("REVOKE (qp_first {qp_first}): {other:?}")),
    }
}

/// Figures for the summary line.
#[derive(Clone, Debug, Default)]
pub struct RdmaFigures {
    pub nak_ms: f64,
    pub silence_ms: f64,
    pub revoke_us: u32,
    pub qp_first_revoke_us: u32,
}

/// Item 2: WRITE, READ, RAM, MKEY-first revoke → REM_ACCESS_ERR; QP-first revoke → RETRY_EXC_ERR.
fn rdma_checks(app: &Appliance) -> Result<RdmaFigures, String> {
    let mut f = RdmaFigures::default();
    let mut tenant = app.session(&app.tenant())?;
    let patient = RcConfig { timeout: PATIENT_QP_TIMEOUT, ..RcConfig::default() };
    let RdmaLease { mut r, alloc: a } = rdma_lease(app, &mut tenant, patient, RDMA_LEN as u64)?;
    let data = pattern(a.rkey);
    r.post_write(1, a.remote_addr, a.rkey, &data)?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("RDMA WRITE of 8 KiB", (c.wr_id, c.status, c.byte_len) == (1, WcStatus::Success, RDMA_LEN as u32), &c)?;
    r.post_read(2, a.remote_addr, a.rkey, RDMA_LEN as u32)?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("RDMA READ of 8 KiB", (c.wr_id, c.status, c.byte_len) == (2, WcStatus::Success, RDMA_LEN as u32), &c)?;
    if r.read_data(2).as_deref() != Some(data.as_slice()) {
        return Err("RDMA READ returned other bytes than the WRITE put there".into());
    }
    if app.ram(a.remote_addr, RDMA_LEN)? != data {
        return Err(format!("guest RAM at remote_addr {:#x} does not hold the written bytes", a.remote_addr));
    }

    let (outcome, us) = revoke(&mut tenant, a.lease, false)?;
    expect("REVOKE (MKEY first)", outcome == Outcome::TornDown, &outcome)?;
    f.revoke_us = us;
    let before = r.stats();
    let t0 = Instant::now();
    r.post_write(3, a.remote_addr, a.rkey, &data[..64])?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("WRITE after REVOKE", c.status.name() == "IBV_WC_REM_ACCESS_ERR", &c)?;
    let took = c.at.saturating_duration_since(t0);
    f.nak_ms = took.as_secs_f64() * 1e3;
    // The NAK of the first transmission: the transport timer (over a second) never expired. Counted, not timed.
    let s = r.stats();
    if (s.naks - before.naks, s.timeouts - before.timeouts) != (1, 0) {
        return Err(format!("REM_ACCESS_ERR after {took:?}: not the NAK of the first transmission ({s:?})"));
    }
    if app.ram(a.remote_addr, 64)? != data[..64] {
        return Err("the WRITE after REVOKE changed guest RAM".into());
    }

    // The seed's order on a fresh lease: the QP goes to ERR first and drops requests silently.
    // timeout 12: 16.8 ms per attempt, 134 ms for all 8, so a model process starved for tens of ms beside the
    // TCG guest does not fail the first WRITE by the retry timer.
    let rc = RcConfig { timeout: 12, retry_cnt: 7, ..RcConfig::default() };
    let RdmaLease { mut r, alloc: a } = rdma_lease(app, &mut tenant, rc, RDMA_LEN as u64)?;
    let data = pattern(a.rkey);
    r.post_write(1, a.remote_addr, a.rkey, &data)?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("RDMA WRITE on the second lease", c.status == WcStatus::Success, &c)?;
    let mut admin = app.session(&app.admin())?;
    let (outcome, us) = revoke(&mut admin, a.lease, true)?;
    expect("admin REVOKE (QP first)", outcome == Outcome::TornDown, &outcome)?;
    f.qp_first_revoke_us = us;
    // The counters are cumulative: on a busy host the first WRITE may have been resent once already.
    let before = r.stats();
    let t0 = Instant::now();
    r.post_write(2, a.remote_addr, a.rkey, &pattern(!a.rkey))?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("WRITE after a QP-first REVOKE", c.status.name() == "IBV_WC_RETRY_EXC_ERR", &c)?;
    f.silence_ms = c.at.saturating_duration_since(t0).as_secs_f64() * 1e3;
    // Silence: no NAK; the WRITE (all its packets) went out once per attempt and each attempt's timer expired
    // (counted, not timed).
    let s = r.stats();
    let attempts = u64::from(rc.retry_cnt) + 1;
    let path_mtu = mtu_bytes(a.mtu).unwrap_or(RDMA_MTU).min(RDMA_MTU);
    let packets = attempts * RDMA_LEN.div_ceil(path_mtu as usize) as u64;
    let got = (s.naks - before.naks, s.timeouts - before.timeouts, s.packets_sent - before.packets_sent);
    if got != (0, attempts, packets) {
        return Err(format!(
            "after a QP-first REVOKE: (NAKs, timeouts, packets sent) {got:?}, expected (0, {attempts}, {packets})"
        ));
    }
    if app.ram(a.remote_addr, RDMA_LEN)? != data {
        return Err("the WRITE after a QP-first REVOKE landed in guest RAM".into());
    }
    let _ = tenant.bye();
    let _ = admin.bye();
    Ok(f)
}

/// The `lease-qemu` scenario, two boots: the image (leasectl and RDMA checks), then the `fence-test` image
/// ([`Artifacts::fence_test_elf`]) with `fence_test=on`. Returns both summaries.
pub fn run(a: &Artifacts) -> Result<String, String> {
    let mut app = Appliance::boot(a, &a.elf, NAME, "")?;
    // The default options: leases on the UMR path (`ctl-mlx5-qemu` boots with `lease_warm=0` for the commands).
    if let Err(e) = check_paths(&app.ready, "umr") {
        return Err(app.fail(e));
    }
    let normal = check_normal(&mut app, &a.leasectl_bin)?;
    let normal = format!("grant=umr revoke=umr; {normal}");
    drop(app);
    let name = format!("{NAME}-fence-test");
    let mut app = Appliance::boot(a, &a.fence_test_elf, &name, "fence_test=on")?;
    let fenced = check_fence_test(&mut app, &a.leasectl_bin)?;
    Ok(format!("{normal}; {fenced}"))
}

/// The lease paths the ready line names (`grant=umr|commands revoke=umr|commands`, docs/operations.md): both
/// must be `want`.
pub fn check_paths(r: &serial::Ready, want: &str) -> Result<(), String> {
    let (grant, revoke) = (r.get("grant").unwrap_or("none"), r.get("revoke").unwrap_or("none"));
    if grant != want || revoke != want {
        return Err(format!("ready line: grant={grant} revoke={revoke}, expected grant={want} revoke={want}"));
    }
    Ok(())
}

/// The normal image: items 1 and 2. Returns the summary.
pub fn check_normal(app: &mut Appliance, leasectl_bin: &Path) -> Result<String, String> {
    let r = cli_cycle(app, leasectl_bin)
        .and_then(|cli_us| Ok((cli_us, rdma_checks(app)?)))
        .and_then(|(cli_us, f)| Ok((cli_us, f, verify_cli(app, leasectl_bin)?)));
    let (cli_us, f, (v, plot)) = match r {
        Ok(x) => x,
        Err(e) => return Err(app.fail(e)),
    };
    // Every revoke so far tore down cleanly: nothing is fenced (admin view: all tenants).
    let out = app.leasectl(leasectl_bin, true, &["--json", "fenced"]).map_err(|e| app.fail(e))?;
    if !parse_fenced_json(&out).map_err(|e| app.fail(e))?.is_empty() {
        return Err(app.fail(format!("slots fenced after clean revokes: {out}")));
    }
    app.drain();
    let ms = |us: i64| us as f64 / 1e3;
    let verify: Vec<String> = v
        .orders
        .iter()
        .map(|(order, recall, dp, status)| {
            format!("{order} recall max {:.1} ms, dataplane max {:.1} ms, {status}", ms(*recall), ms(*dp))
        })
        .collect();
    Ok(format!(
        "leasectl alloc/ready/list/revoke (TornDown in {cli_us} us)/fenced ok; RDMA 8 KiB WRITE+READ via the model \
         at {} ok; MKEY-first REVOKE (TornDown in {} us) -> REM_ACCESS_ERR after {:.1} ms; QP-first REVOKE ({} us) \
         -> RETRY_EXC_ERR after {:.1} ms; leasectl verify --revoke-test ({VERIFY_ITERATIONS} it./order, retry time \
         {:.1} ms): {}; plot {}",
        app.udp,
        f.revoke_us,
        f.nak_ms,
        f.qp_first_revoke_us,
        f.silence_ms,
        ms(v.retry_time_us),
        verify.join("; "),
        plot.display()
    ))
}

/// Item 3 on the `fence-test` image booted with `fence_test=on`. Returns the summary.
pub fn check_fence_test(app: &mut Appliance, leasectl_bin: &Path) -> Result<String, String> {
    let r = fence_checks(app, leasectl_bin);
    app.drain();
    r.map_err(|e| app.fail(e))
}

fn fence_checks(app: &Appliance, bin: &Path) -> Result<String, String> {
    let alloc = |app: &Appliance| -> Result<AllocOut, String> {
        let args =
            ["--json", "alloc", "--size", "4096", "--qpn", "0x1234", "--psn", "5", "--gid", CLI_GID, "--mac", CLI_MAC];
        parse_alloc_json(&app.leasectl(bin, false, &args)?)
    };
    let a = alloc(app)?;
    let (cq, sq) = (format!("{CLI_QPN:#x}"), format!("{:#x}", a.server_qpn));
    let out = app.leasectl(bin, false, &["ready", &a.lease, "--client-qpn", &cq, "--server-qpn", &sq])?;
    let (_, state, _) = parse_lease_line(&out)?;
    expect("leasectl ready", state == "Active", &out)?;
    let out = app.leasectl(bin, false, &["--json", "revoke", &a.lease])?;
    expect("leasectl --json revoke on the fence-test image", outcome_json(&out)? == "Fenced", &out)?;
    let slot = a.slot()?;
    let out = app.leasectl(bin, false, &["fenced"])?;
    let rows = parse_fenced_human(&out)?;
    let row = rows.iter().find(|r| r.slot == slot);
    expect(
        &format!("leasectl fenced lists slot {slot} (DESTROY_MKEY bit, origin REVOKE)"),
        row.is_some_and(|r| r.failed_mask & FAILED_DESTROY_MKEY != 0 && r.origin == "REVOKE"),
        &out,
    )?;
    let mask = row.map_or(0, |r| r.failed_mask);
    let out = app.leasectl(bin, true, &["--json", "fenced"])?;
    let json_rows = parse_fenced_json(&out)?;
    expect("leasectl --admin --json fenced", json_rows.iter().any(|r| Some(r) == row), &out)?;
    let b = alloc(app)?;
    if b.slot()? == slot || b.remote_addr == a.remote_addr {
        return Err(format!("the ALLOC after the fence reused slot {slot} or remote_addr: {a:?} then {b:?}"));
    }
    Ok(format!(
        "fence-test image: REVOKE {} -> Fenced; fenced lists slot {slot} mask {mask:#x} origin REVOKE; next ALLOC \
         {} at {:#x} (was {:#x})",
        a.lease, b.lease, b.remote_addr, a.remote_addr
    ))
}

/// The `lease-qemu-large` scenario's name.
pub const LARGE_NAME: &str = "lease-qemu-large";
/// Its guest: 6 GiB of RAM, so q35 puts 2 GiB below the PCI hole and 4 GiB at guest physical 4 GiB.
pub const LARGE_MEM_MIB: u32 = 6144;
pub const LARGE_POOL_MIB: u32 = 3000;
/// Larger than all the RAM below the hole: the lease must take memory above 4 GiB. 1280 extents make an MTT list
/// of 10,240 bytes, a mailbox chain of 21 blocks.
pub const LARGE_LEASE: u64 = 2560 << 20;
/// The revoke grace it boots with (`lease_grace_ms=`): the sweep that tears a revoked lease down and scrubs its
/// memory comes this long after the REVOKE.
pub const LARGE_GRACE: Duration = Duration::from_secs(1);
/// The lease allocated before the large one is revoked, and revoked while the large one is scrubbed.
pub const SMALL_LEASE: u64 = 2 << 20;
/// While a scrub runs, a control round trip and a REVOKE's outcome come back within this.
pub const SCRUB_ANSWER_BOUND: Duration = Duration::from_secs(1);
/// Control round trips are sampled this often while a scrub runs.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The boot-time preparation of the 3000 MiB pool under TCG (the old code zeroed 2560 MiB in 31 s with nothing
/// else running; in slices between control work it may take longer).
const POOL_READY_DEADLINE: Duration = Duration::from_secs(600);
/// The scrub of [`LARGE_LEASE`] under TCG.
const SCRUB_DEADLINE: Duration = Duration::from_secs(600);
/// How long after the grace the sweep may take to start scrubbing (its HCA commands come first).
const SCRUB_START_DEADLINE: Duration = Duration::from_secs(60);
/// A session that only waits sends a HEARTBEAT this often (the silence timeout is 10 s).
const KEEPALIVE: Duration = Duration::from_secs(2);
/// What the lease service logs once the boot-time preparation of the pool is complete:
/// `lease: pool ready: T MiB in N ms`.
pub const POOL_READY: &str = "lease: pool ready: ";

/// `lease: pool ready: T MiB in N ms` anywhere in `line` (the console puts a time stamp and a level first):
/// (T, N).
pub fn parse_pool_ready(line: &str) -> Option<(u64, u64)> {
    let rest = &line[line.find(POOL_READY)? + POOL_READY.len()..];
    match rest.split_whitespace().collect::<Vec<_>>().as_slice() {
        [t, "MiB", "in", n, "ms", ..] => Some((t.parse().ok()?, n.parse().ok()?)),
        _ => None,
    }
}

/// STATS' lease figures (the whole pool's when `c` is the admin's session).
pub(crate) fn lease_stats(c: &mut Client) -> Result<LeaseStats, String> {
    match c.call(&Request::Stats) {
        Ok(Response::Stats(s)) => Ok(s.leases),
        other => Err(format!("STATS: {other:?}")),
    }
}

/// The pool's figures of `s` for a message.
pub(crate) fn pool_figures(s: &LeaseStats) -> String {
    format!(
        "pool_bytes {} bytes_free {} bytes_scrubbing {} bytes_leased {}",
        s.pool_bytes, s.bytes_free, s.bytes_scrubbing, s.bytes_leased
    )
}

/// One HEARTBEAT round trip.
pub(crate) fn ping(c: &mut Client, echo: u64) -> Result<Duration, String> {
    let t0 = Instant::now();
    match c.call(&Request::Heartbeat { echo }) {
        Ok(Response::Heartbeat { echo: e, .. }) if e == echo => Ok(t0.elapsed()),
        other => Err(format!("HEARTBEAT {echo}: {other:?}")),
    }
}

/// A session that only heartbeats, on a thread of its own, once every third of the silence timeout its Welcome
/// announced (as a client must); [`Heartbeater::finish`] says whether it stayed alive.
pub(crate) struct Heartbeater {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Client, Result<Beats, String>)>>,
}

/// What a [`Heartbeater`] saw.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Beats {
    pub n: u32,
    pub max: Duration,
    pub every: Duration,
}

impl Heartbeater {
    pub(crate) fn start(mut c: Client) -> Heartbeater {
        let every = Duration::from_millis(u64::from(c.welcome().map_or(10_000, |w| w.heartbeat_ms)) / 3);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut b = Beats { every, ..Beats::default() };
            let r = loop {
                let at = Instant::now();
                match ping(&mut c, u64::from(b.n) + 1) {
                    Ok(d) => {
                        b.n += 1;
                        b.max = b.max.max(d);
                    }
                    Err(e) => break Err(format!("heartbeat {} (one every {every:?}): {e}", b.n + 1)),
                }
                while at.elapsed() < every && !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if stopped.load(Ordering::Relaxed) {
                    break Ok(b);
                }
            };
            (c, r)
        });
        Heartbeater { stop, thread: Some(thread) }
    }

    /// Stops the heartbeats, then sends one more: every heartbeat must have been answered and the session must
    /// still be there.
    pub(crate) fn finish(mut self) -> Result<Beats, String> {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread.take().ok_or("the heartbeat thread is gone")?;
        let (mut c, r) = t.join().map_err(|_| "the heartbeat thread panicked".to_string())?;
        let b = r?;
        ping(&mut c, u64::MAX).map_err(|e| format!("the last heartbeat, after {} answered: {e}", b.n))?;
        let _ = c.bye();
        Ok(b)
    }
}

impl Drop for Heartbeater {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The `lease-qemu-large` scenario: a guest with RAM above 4 GiB lends a lease larger than 2 GiB, and stays
/// responsive while its memory is scrubbed after the revoke.
pub fn run_large(a: &Artifacts) -> Result<String, String> {
    let args = format!("lease_pool_mib={LARGE_POOL_MIB} lease_grace_ms={}", LARGE_GRACE.as_millis());
    let mut app = Appliance::boot_mem(a, &a.elf, LARGE_NAME, &args, LARGE_MEM_MIB)?;
    let r = large_checks(&mut app);
    app.drain();
    r.map_err(|e| app.fail(e))
}

/// What the image said of its pool at boot.
#[derive(Clone, Copy, Debug)]
struct PoolBoot {
    /// The ready line's `pool_ready_mib=`.
    ready_mib: u64,
    /// `lease: pool ready: T MiB in N ms`: N.
    prepared_ms: u64,
}

/// The ready line's `pool_mib=` and `pool_ready_mib=`; then the `lease: pool ready` line (within
/// [`POOL_READY_DEADLINE`]) and STATS agreeing with it: the whole pool free, nothing left to scrub.
fn large_pool_ready(app: &mut Appliance) -> Result<PoolBoot, String> {
    let pool = u64::from(LARGE_POOL_MIB);
    let field = |k: &str| -> Result<u64, String> {
        app.ready.get(k).and_then(|v| v.parse().ok()).ok_or_else(|| {
            format!("the ready line has no number {k}= (`lease=on pool_mib=T pool_ready_mib=R`): {:?}", app.ready)
        })
    };
    let (total, ready_mib) = (field("pool_mib")?, field("pool_ready_mib")?);
    expect(&format!("the ready line's pool_mib= with lease_pool_mib={pool}"), total == pool, &total)?;
    expect("the ready line's pool_ready_mib= (at most pool_mib=)", ready_mib <= total, &ready_mib)?;
    // The admin's STATS while the pool is prepared also keep its session alive.
    let mut admin = app.session(&app.admin())?;
    let deadline = Instant::now() + POOL_READY_DEADLINE;
    let line = loop {
        if let Some((l, _)) = app.wait_line(|l| l.contains(POOL_READY), Instant::now() + KEEPALIVE)? {
            break l;
        }
        let s = lease_stats(&mut admin)?;
        if Instant::now() >= deadline {
            return Err(format!(
                "no `{POOL_READY}T MiB in N ms` line within {} s of the ready line; STATS: {}",
                POOL_READY_DEADLINE.as_secs(),
                pool_figures(&s)
            ));
        }
    };
    let (mib, ms) = parse_pool_ready(&line).ok_or_else(|| format!("not `{POOL_READY}T MiB in N ms`: {line:?}"))?;
    expect("the MiB of the `lease: pool ready` line", mib == pool, &line)?;
    let s = lease_stats(&mut admin)?;
    let bytes = pool << 20;
    expect(
        "STATS once the pool is ready: pool_bytes and bytes_free the whole pool, bytes_scrubbing 0",
        (s.pool_bytes, s.bytes_free, s.bytes_scrubbing) == (bytes, bytes, 0),
        &pool_figures(&s),
    )?;
    let _ = admin.bye();
    Ok(PoolBoot { ready_mib, prepared_ms: ms })
}

/// Waits for the pool ([`large_pool_ready`]); ALLOC of [`LARGE_LEASE`], WRITE at both ends through the model's
/// port, READ both back, the first bytes in guest RAM; a [`SMALL_LEASE`]; REVOKE of the large one → TornDown and
/// the next WRITE refused; then [`scrub_checks`] while its memory is scrubbed, a session that only heartbeats
/// alive through it, and a fresh large lease reading zero.
fn large_checks(app: &mut Appliance) -> Result<String, String> {
    let boot = large_pool_ready(app)?;
    let app: &Appliance = app;
    let mut tenant = app.session(&app.tenant())?;
    let patient = RcConfig { timeout: PATIENT_QP_TIMEOUT, ..RcConfig::default() };
    let t0 = Instant::now();
    let RdmaLease { mut r, alloc: a } = rdma_lease(app, &mut tenant, patient, LARGE_LEASE)?;
    let granted = t0.elapsed();
    expect("ALLOC length", a.length == LARGE_LEASE, &a.length)?;
    let (head, tail) = (pattern(a.rkey), pattern(!a.rkey));
    let last = a.remote_addr + LARGE_LEASE - RDMA_LEN as u64;
    r.post_write(1, a.remote_addr, a.rkey, &head)?;
    r.post_write(2, last, a.rkey, &tail)?;
    r.post_read(3, a.remote_addr, a.rkey, RDMA_LEN as u32)?;
    r.post_read(4, last, a.rkey, RDMA_LEN as u32)?;
    let cs = completions(&mut r, 4, Duration::from_secs(10))?;
    expect("WRITE and READ at both ends", cs.iter().all(|c| c.status == WcStatus::Success), &cs)?;
    if r.read_data(3).as_deref() != Some(head.as_slice()) || r.read_data(4).as_deref() != Some(tail.as_slice()) {
        return Err("RDMA READ at the ends returned other bytes than the WRITEs put there".into());
    }
    if app.ram(a.remote_addr, RDMA_LEN)? != head {
        return Err(format!("guest RAM at remote_addr {:#x} does not hold the written bytes", a.remote_addr));
    }
    // Before the revoke: the small lease to revoke during the scrub, a session to time round trips on, one that
    // only heartbeats, and the admin's for STATS.
    let small = rdma_lease(app, &mut tenant, RcConfig::default(), SMALL_LEASE)?;
    let mut pinger = app.session(&app.tenant())?;
    let heartbeats = Heartbeater::start(app.session(&app.tenant())?);
    let mut admin = app.session(&app.admin())?;
    let (outcome, us) = revoke(&mut tenant, a.lease, false)?;
    let revoked = Instant::now();
    expect("REVOKE of the large lease", outcome == Outcome::TornDown, &outcome)?;
    r.post_write(5, last, a.rkey, &head[..64])?;
    let c = one(&mut r, Duration::from_secs(5))?;
    expect("WRITE after REVOKE", c.status.name() == "IBV_WC_REM_ACCESS_ERR", &c)?;

    let f = scrub_checks(&mut admin, &mut pinger, &mut tenant, small.alloc.lease, revoked)?;
    let beats = heartbeats
        .finish()
        .map_err(|e| format!("(c) the session that only heartbeats did not stay alive through the scrub: {e}"))?;

    // (d) The old lease's first bytes are zero in guest RAM. The pool hands out the extents it got back last
    // (first in, first out: app/lease/src/pool.rs), so a filler lease takes the extents never lent, and a fresh
    // large lease gets the revoked one's memory in its order: its ends are where the patterns were written.
    if app.ram(a.remote_addr, RDMA_LEN)?.iter().any(|&b| b != 0) {
        return Err(format!(
            "(d) guest RAM at the revoked lease's remote_addr {:#x} is not zero after the scrub",
            a.remote_addr
        ));
    }
    let filler = (u64::from(LARGE_POOL_MIB) << 20) - LARGE_LEASE - SMALL_LEASE;
    let _filler = rdma_lease(app, &mut tenant, RcConfig::default(), filler)
        .map_err(|e| format!("(d) ALLOC of the {} MiB never lent after the scrub: {e}", filler >> 20))?;
    let RdmaLease { r: mut fresh, alloc: b } = rdma_lease(app, &mut tenant, patient, LARGE_LEASE)
        .map_err(|e| format!("(d) ALLOC of {} MiB after the scrub: {e}", LARGE_LEASE >> 20))?;
    expect(
        "(d) the fresh large lease on the revoked one's memory (the pool lends what came back last after what was \
         never lent)",
        b.remote_addr == a.remote_addr,
        &format!("at {:#x}, the revoked lease was at {:#x}", b.remote_addr, a.remote_addr),
    )?;
    let b_last = b.remote_addr + LARGE_LEASE - RDMA_LEN as u64;
    fresh.post_read(1, b.remote_addr, b.rkey, RDMA_LEN as u32)?;
    fresh.post_read(2, b_last, b.rkey, RDMA_LEN as u32)?;
    let cs = completions(&mut fresh, 2, Duration::from_secs(10))?;
    expect("(d) READ at both ends of the fresh lease", cs.iter().all(|c| c.status == WcStatus::Success), &cs)?;
    let zero = vec![0u8; RDMA_LEN];
    if fresh.read_data(1).as_deref() != Some(zero.as_slice()) || fresh.read_data(2).as_deref() != Some(zero.as_slice())
    {
        return Err(format!(
            "(d) the fresh {} MiB lease at {:#x} does not read zero at its ends",
            LARGE_LEASE >> 20,
            b.remote_addr
        ));
    }
    if app.ram(b.remote_addr, RDMA_LEN)? != zero {
        return Err(format!("(d) guest RAM at the fresh lease's remote_addr {:#x} is not zero", b.remote_addr));
    }
    let _ = (tenant.bye(), pinger.bye(), admin.bye());

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pings: Vec<i64> = f.pings.iter().map(|d| d.as_micros() as i64).collect();
    let p = crate::revoke_bench::stats(&pings).ok_or("no round trips sampled")?;
    let secs = f.back_after.as_secs_f64();
    Ok(format!(
        "{} MiB guest (ready line mem_mib={}, pool_mib={LARGE_POOL_MIB} pool_ready_mib={}; `lease: pool ready` after \
         {} ms): {} MiB lease granted in {:.1} s at {:#x}, WRITE+READ at both ends ok, REVOKE TornDown in {us} us, \
         then REM_ACCESS_ERR; scrub (grace {} ms): seen {:.0} ms after the grace, memory back {secs:.1} s after it \
         ({:.2} GiB/s, at most {} MiB waiting); meanwhile HEARTBEAT {:.1} ms, then p50 {:.1} / max {:.1} ms over {} \
         samples, REVOKE of a {} MiB lease {:.1} ms, a heartbeat-only session (every {:.1} s) alive after {} beats \
         (max {:.1} ms); a fresh {} MiB lease on its memory (at {:#x}) reads zero at both ends",
        LARGE_MEM_MIB,
        app.ready.get("mem_mib").unwrap_or("?"),
        boot.ready_mib,
        boot.prepared_ms,
        LARGE_LEASE >> 20,
        granted.as_secs_f64(),
        a.remote_addr,
        LARGE_GRACE.as_millis(),
        ms(f.seen_after),
        LARGE_LEASE as f64 / f64::from(1 << 30) / secs,
        f.max_scrubbing >> 20,
        ms(f.first_ping),
        p.p50 as f64 / 1e3,
        p.max as f64 / 1e3,
        p.n,
        SMALL_LEASE >> 20,
        ms(f.small_revoke),
        beats.every.as_secs_f64(),
        beats.n,
        ms(beats.max),
        LARGE_LEASE >> 20,
        b.remote_addr,
    ))
}

/// What [`scrub_checks`] measured.
struct ScrubFigures {
    /// The grace's end → the first STATS with `bytes_scrubbing > 0`.
    seen_after: Duration,
    /// The grace's end → the first STATS with nothing left to scrub and every byte not leased free.
    back_after: Duration,
    /// The most `bytes_scrubbing` seen.
    max_scrubbing: u64,
    /// (a): the first HEARTBEAT round trip once the scrub was seen; then every sample.
    first_ping: Duration,
    pings: Vec<Duration>,
    /// (b): REVOKE of the small lease → outcome.
    small_revoke: Duration,
}

/// The large lease was revoked at `revoked`. After the grace, once STATS shows its memory being scrubbed: (a) a
/// HEARTBEAT from `pinger` and (b) `tenant`'s REVOKE of `small` answer within [`SCRUB_ANSWER_BOUND`], and STATS
/// after each answer shows the scrub still running (more than the small lease waiting); round trips sampled every
/// [`SAMPLE_EVERY`] stay within the bound until (d, first half) STATS shows the memory back: nothing waiting to
/// be scrubbed, `bytes_free` the pool minus what is still leased.
fn scrub_checks(
    admin: &mut Client,
    pinger: &mut Client,
    tenant: &mut Client,
    small: LeaseId,
    revoked: Instant,
) -> Result<ScrubFigures, String> {
    let grace_end = revoked + LARGE_GRACE;
    std::thread::sleep(grace_end.saturating_duration_since(Instant::now()));
    let deadline = Instant::now() + SCRUB_START_DEADLINE;
    let mut kept = Instant::now();
    let seen = loop {
        let s = lease_stats(admin)?;
        if s.bytes_scrubbing > 0 {
            break s;
        }
        if kept.elapsed() >= KEEPALIVE {
            ping(pinger, u64::MAX)?;
            ping(tenant, u64::MAX)?;
            kept = Instant::now();
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no STATS with bytes_scrubbing > 0 within {} s after the grace (or the scrub was over before STATS \
                 looked): {}",
                SCRUB_START_DEADLINE.as_secs(),
                pool_figures(&s)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let seen_after = grace_end.elapsed();
    let bound = SCRUB_ANSWER_BOUND;

    // (a)
    let first_ping = ping(pinger, 1)?;
    let after_ping = lease_stats(admin)?;
    expect(&format!("(a) a HEARTBEAT round trip during the scrub within {bound:?}"), first_ping < bound, &first_ping)?;
    expect(
        "(a) STATS after the HEARTBEAT's answer: the scrub still running (bytes_scrubbing > 0)",
        after_ping.bytes_scrubbing > 0,
        &pool_figures(&after_ping),
    )?;

    // (b)
    let t0 = Instant::now();
    let (outcome, _) = revoke(tenant, small, false)?;
    let small_revoke = t0.elapsed();
    let after_revoke = lease_stats(admin)?;
    expect(
        &format!("(b) REVOKE of the {} MiB lease during the scrub", SMALL_LEASE >> 20),
        outcome == Outcome::TornDown,
        &outcome,
    )?;
    expect(
        &format!("(b) the REVOKE's outcome during the scrub within {bound:?}"),
        small_revoke < bound,
        &small_revoke,
    )?;
    expect(
        "(b) STATS after the REVOKE's outcome: the large lease still being scrubbed (bytes_scrubbing > the small lease)",
        after_revoke.bytes_scrubbing > SMALL_LEASE,
        &pool_figures(&after_revoke),
    )?;

    let mut pings = vec![first_ping];
    let mut max_scrubbing = seen.bytes_scrubbing.max(after_ping.bytes_scrubbing).max(after_revoke.bytes_scrubbing);
    kept = Instant::now();
    let deadline = Instant::now() + SCRUB_DEADLINE;
    let back = loop {
        std::thread::sleep(SAMPLE_EVERY);
        let d = ping(pinger, pings.len() as u64 + 1)?;
        pings.push(d);
        if d >= bound {
            return Err(format!(
                "a HEARTBEAT round trip during the scrub took {d:?} ({} s after the grace; bound {bound:?})",
                grace_end.elapsed().as_secs()
            ));
        }
        if kept.elapsed() >= KEEPALIVE {
            ping(tenant, u64::MAX)?;
            kept = Instant::now();
        }
        let s = lease_stats(admin)?;
        max_scrubbing = max_scrubbing.max(s.bytes_scrubbing);
        if s.bytes_scrubbing == 0 && s.bytes_free == s.pool_bytes.saturating_sub(s.bytes_leased) {
            break s;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "(d) the memory not back within {} s of the grace: {}",
                SCRUB_DEADLINE.as_secs(),
                pool_figures(&s)
            ));
        }
    };
    let back_after = grace_end.elapsed();
    expect(
        &format!("(d) the pool once the scrub is over (lease_pool_mib={LARGE_POOL_MIB})"),
        back.pool_bytes == u64::from(LARGE_POOL_MIB) << 20,
        &pool_figures(&back),
    )?;
    Ok(ScrubFigures { seen_after, back_after, max_scrubbing, first_ping, pings, small_revoke })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOC: &str = "lease        3.17\nrkey         0x00001203\nremote_addr  0x6400000\nlength       4096\n\
                         server_qpn   0x48\nserver_psn   0xabcdef\nserver_gid   00000000000000000000ffffc6336402\n\
                         server_mac   02:4c:42:00:00:01\nmtu          1024\nttl_ms       60000\n";

    #[test]
    fn q35_ram_file_offsets() {
        const G: u64 = 1 << 30;
        // 2.75 GiB or more: 2 GiB below the hole, the rest from 4 GiB.
        assert_eq!(q35_file_offset(6 * G, 0x1000, 8), Some(0x1000));
        assert_eq!(q35_file_offset(6 * G, 2 * G - 8, 8), Some(2 * G - 8));
        assert_eq!(q35_file_offset(6 * G, 2 * G - 4, 8), None, "straddles the hole");
        assert_eq!(q35_file_offset(6 * G, 3 * G, 1), None, "in the hole");
        assert_eq!(q35_file_offset(6 * G, 4 * G, 8), Some(2 * G));
        assert_eq!(q35_file_offset(6 * G, 8 * G - 8, 8), Some(6 * G - 8));
        assert_eq!(q35_file_offset(6 * G, 8 * G - 4, 8), None, "past the end");
        // Less: all of it below, guest physical = file offset.
        assert_eq!(q35_file_offset(256 << 20, 0x100_0000, 8), Some(0x100_0000));
        assert_eq!(q35_file_offset(256 << 20, 4 * G, 8), None);
    }

    #[test]
    fn ready_line_paths() {
        let line = |paths: &str| {
            serial::parse_ready(&format!("leasebox: ready cores=1 lease=on pool_mib=64 slots=1024 {paths}")).unwrap()
        };
        assert_eq!(check_paths(&line("grant=umr revoke=umr"), "umr"), Ok(()));
        assert_eq!(check_paths(&line("grant=commands revoke=commands"), "commands"), Ok(()));
        let e = check_paths(&line("grant=commands revoke=commands"), "umr").unwrap_err();
        assert!(e.contains("grant=commands revoke=commands, expected grant=umr revoke=umr"), "{e}");
        assert!(check_paths(&line("grant=umr revoke=commands"), "umr").unwrap_err().contains("revoke=commands"));
        assert!(check_paths(&line("grant=commands revoke=umr"), "umr").unwrap_err().contains("grant=commands"));
        assert!(check_paths(&line(""), "commands").unwrap_err().contains("grant=none revoke=none"));
    }

    #[test]
    fn pool_ready_lines() {
        assert_eq!(
            parse_pool_ready("[   41.250000] c0 INFO  lease: pool ready: 3000 MiB in 38211 ms"),
            Some((3000, 38211))
        );
        assert_eq!(parse_pool_ready("lease: pool ready: 64 MiB in 0 ms"), Some((64, 0)));
        assert_eq!(parse_pool_ready("lease: pool ready: 64 MiB"), None);
        assert_eq!(parse_pool_ready("lease: pool ready: many MiB in 3 ms"), None);
        assert_eq!(parse_pool_ready("leasebox: ready cores=1 lease=on pool_mib=64 pool_ready_mib=64"), None);
    }

    #[test]
    fn alloc_outputs() {
        let want = AllocOut { lease: "3.17".into(), rkey: 0x1203, remote_addr: 0x640_0000, server_qpn: 0x48 };
        assert_eq!(parse_alloc_human(ALLOC), Ok(want.clone()));
        assert_eq!(want.slot(), Ok(3));
        let json = r#"{"lease":"3.17","rkey":4611,"remote_addr":104857600,"length":4096,"server_qpn":72}"#;
        assert_eq!(parse_alloc_json(json), Ok(want));
        assert!(parse_alloc_human("lease 1.1\n").unwrap_err().contains("rkey"));
        assert!(parse_alloc_json("{\"error\": {}}").is_err());
    }

    #[test]
    fn lease_lines() {
        assert_eq!(parse_lease_line("lease 3.17: Active\n"), Ok(("3.17".into(), "Active".into(), None)));
        assert_eq!(
            parse_lease_line("lease 3.17: TornDown in 812 us\n"),
            Ok(("3.17".into(), "TornDown".into(), Some(812)))
        );
        assert!(parse_lease_line("error: NOT_FOUND: gone\n").is_err());
        assert!(parse_lease_line("lease 3.17: Fenced in many us\n").is_err());
        assert_eq!(outcome_json(r#"{"outcome":"Fenced","elapsed_us":9,"lease":"0.1"}"#), Ok("Fenced".into()));
    }

    #[test]
    fn list_outputs() {
        let human = "LEASE          STATE          ACCESS         SIZE   MTU RKEY       SRV_QPN  CLI_QPN  TTL_LEFT_MS TENANT\n\
                     0.1            Active         rw-            4096  1024 0x00000103 0x000048 0x001234      59000 demo\n";
        assert_eq!(list_state_human(human, "0.1").as_deref(), Some("Active"));
        assert_eq!(list_state_human(human, "0.2"), None);
        assert_eq!(list_state_human("no leases\n", "0.1"), None);
        let json = r#"{"next_cursor":0,"leases":[{"lease":"0.1","state":"Active"},{"lease":"1.1","state":"Granted"}]}"#;
        assert_eq!(list_state_json(json, "1.1"), Ok(Some("Granted".into())));
        assert_eq!(list_state_json(json, "2.1"), Ok(None));
        assert!(list_state_json("[]", "0.1").is_err());
    }

    fn verify_run(order: &str, status: &str, figures: &[(i64, i64, i64)]) -> String {
        let results: Vec<String> = figures
            .iter()
            .map(|(recall, dp, since)| {
                format!(
                    r#"{{"recall_us":{recall},"dataplane_us":{dp},"first_fail":{{"status":"{status}","after_revoke_us":{since}}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"passed":true,"order":"{order}","retry_time_us":33554,"results":[{}],"failures":[]}}"#,
            results.join(",")
        )
    }

    #[test]
    fn verify_outputs() {
        let mkey = verify_run("mkey-first", "IBV_WC_REM_ACCESS_ERR", &[(900, -150, 750), (1200, 40, 1240)]);
        let qp = verify_run("qp-first", "IBV_WC_RETRY_EXC_ERR", &[(1000, 33_000, 34_000)]);
        let both = format!(r#"{{"passed":true,"runs":[{mkey},{qp}]}}"#);
        let runs = parse_verify_json(&both).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].iterations[0].dataplane_us, Some(-150));
        assert_eq!(runs[1].iterations[0].status.as_deref(), Some("IBV_WC_RETRY_EXC_ERR"));
        let f = check_verify_runs(&runs).unwrap();
        assert_eq!(f.retry_time_us, 33554);
        assert_eq!(f.orders[0], ("mkey-first".into(), 1200, 40, "IBV_WC_REM_ACCESS_ERR".into()));
        assert_eq!(f.orders[1].2, 33_000);
        // One order alone, an error, a wrong status, figures out of their windows.
        assert_eq!(parse_verify_json(&mkey).unwrap().len(), 1);
        assert!(check_verify_runs(&parse_verify_json(&mkey).unwrap()).unwrap_err().contains("no qp-first"));
        assert!(parse_verify_json(r#"{"error":{"code":"VERIFY","message":"x"}}"#).is_err());
        let wrong = verify_run("qp-first", "IBV_WC_REM_ACCESS_ERR", &[(1000, 33_000, 34_000)]);
        let e = check_verify_runs(&parse_verify_json(&format!(r#"{{"runs":[{mkey},{wrong}]}}"#)).unwrap());
        assert!(e.unwrap_err().contains("first failed completion"));
        let slow = verify_run("mkey-first", "IBV_WC_REM_ACCESS_ERR", &[(900, 1_250_000, 1_251_000)]);
        let e = check_verify_runs(&parse_verify_json(&format!(r#"{{"runs":[{slow},{qp}]}}"#)).unwrap());
        assert!(e.unwrap_err().contains("dataplane first-fail"));
        let early = verify_run("qp-first", "IBV_WC_RETRY_EXC_ERR", &[(1000, 2_000, 3_000)]);
        let e = check_verify_runs(&parse_verify_json(&format!(r#"{{"runs":[{mkey},{early}]}}"#)).unwrap());
        assert!(e.unwrap_err().contains("retry time"));
    }

    #[test]
    fn fenced_outputs() {
        assert_eq!(parse_fenced_human("no fenced slots\n"), Ok(vec![]));
        let human = "SLOT       GENERATION FAILED_MASK ORIGIN  FENCED_AT\n\
                     0          1          0x00000001  REVOKE  12.345 s\n";
        let row = FencedRow { slot: 0, generation: 1, failed_mask: 1, origin: "REVOKE".into() };
        assert_eq!(parse_fenced_human(human), Ok(vec![row.clone()]));
        assert!(parse_fenced_human("whatever\n").is_err());
        let json = r#"{"slots":[{"slot":0,"generation":1,"failed_mask":1,"origin":"REVOKE","fenced_at_ms":12345}]}"#;
        assert_eq!(parse_fenced_json(json), Ok(vec![row]));
        assert_eq!(parse_fenced_json(r#"{"slots":[]}"#), Ok(vec![]));
    }
}
