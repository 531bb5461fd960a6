//! The QEMU scenarios `cargo xtask test` runs, in one list ([`all`]) of two kinds:
//!
//! - a boot scenario ([`Scenario`]) is a runner configuration, a stop condition, a deadline and a check on the
//!   transcript; checks are plain functions of a [`Transcript`] so they are unit-tested on sample text;
//! - a driven scenario ([`Driven`]) boots the image with the control port forwarded and runs clients against
//!   it; its runner is a function of this crate ([`crate::control::run`], [`crate::lease_qemu::run`],
//!   [`crate::ctl_mlx5::run`]).

use std::time::Duration;

use leasebox_qemu::config::DEFAULT_MEM_MIB;
use leasebox_qemu::config::EXPANDER_BUS;
use leasebox_qemu::{Boot, Machine, ModelSlot, QemuConfig, ScratchFile};

use crate::Artifacts;
use crate::serial::{self, BarKind, PciFunction};
use crate::transcript::Transcript;

/// How the image is booted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootKind {
    /// QEMU `-kernel` (multiboot1, SeaBIOS).
    Kernel,
    /// The GRUB ISO on SeaBIOS.
    GrubBios,
    /// The GRUB ISO on OVMF.
    GrubUefi,
}

impl BootKind {
    pub fn label(self) -> &'static str {
        match self {
            BootKind::Kernel => "-kernel",
            BootKind::GrubBios => "GRUB BIOS",
            BootKind::GrubUefi => "GRUB UEFI",
        }
    }

    /// A deadline for one boot to the ready line under TCG on a 2-core host, with a wide margin (OVMF alone
    /// takes about 4 s there).
    pub fn deadline(self) -> Duration {
        Duration::from_secs(match self {
            BootKind::Kernel => 60,
            BootKind::GrubBios => 120,
            BootKind::GrubUefi => 240,
        })
    }
}

/// When the runner has what a scenario needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// The ready line, plus [`SETTLE`] for any late lines; then QEMU is killed.
    Ready,
    /// QEMU exits by itself.
    Exit,
}

/// How long the runner keeps reading after the ready line (late or duplicated report-ins).
pub const SETTLE: Duration = Duration::from_millis(300);

/// One boot scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    /// One line on what it proves.
    pub about: &'static str,
    pub boot: BootKind,
    pub machine: Machine,
    pub smp: u32,
    pub mem_mib: u32,
    /// Kernel command line (`-kernel` only: the ISOs have theirs baked in).
    pub kernel_args: &'static str,
    /// Extra QEMU arguments, in order.
    pub extra: Vec<&'static str>,
    pub deadline: Duration,
    pub until: Until,
    /// Boot with the mlx5 model: fresh shared files for guest RAM and the ivshmem BAR, and the model process
    /// running (started before QEMU, stopped after it).
    pub model: bool,
    /// The model plays a VF (`--vf`; needs `model`).
    pub model_vf: bool,
    /// Where the model's function sits: the first root bus, or behind a PCI expander bridge.
    pub model_slot: ModelSlot,
    /// Two serial ports: COM1 to `<log_dir>/<name>.com1.log` (read into [`Transcript::com1`]) and COM2 on the
    /// runner's stdio, so the transcript is COM2's output.
    pub com2: bool,
    /// An ACPI SPCR naming a 16550 at this I/O port, added with `-acpitable` (its body written to
    /// `<log_dir>/<name>.spcr.bin` by the runner: [`spcr_body`]).
    pub spcr_port: Option<u16>,
    pub check: fn(&Transcript) -> Result<(), String>,
}

impl Scenario {
    fn new(
        name: &'static str,
        about: &'static str,
        boot: BootKind,
        check: fn(&Transcript) -> Result<(), String>,
    ) -> Self {
        Scenario {
            name,
            about,
            boot,
            machine: Machine::Q35,
            smp: 1,
            mem_mib: DEFAULT_MEM_MIB,
            kernel_args: "",
            extra: Vec::new(),
            deadline: boot.deadline(),
            until: Until::Ready,
            model: false,
            model_vf: false,
            model_slot: ModelSlot::RootBus,
            com2: false,
            spcr_port: None,
            check,
        }
    }

    /// Where the SPCR's body goes when [`Scenario::spcr_port`] is set.
    pub fn spcr_path(&self, a: &Artifacts) -> std::path::PathBuf {
        a.log_dir.join(format!("{}.spcr.bin", self.name))
    }

    /// Where COM1's output goes when [`Scenario::com2`] is set.
    pub fn com1_path(&self, a: &Artifacts) -> std::path::PathBuf {
        a.log_dir.join(format!("{}.com1.log", self.name))
    }

    /// The QEMU configuration, plus scratch files that must live as long as QEMU (the OVMF vars copy).
    pub fn qemu_config(&self, a: &Artifacts) -> Result<(QemuConfig, Vec<ScratchFile>), String> {
        let mut scratch = Vec::new();
        let boot = match self.boot {
            BootKind::Kernel => Boot::Kernel { elf: a.elf.clone(), append: self.kernel_args.to_string() },
            BootKind::GrubBios | BootKind::GrubUefi if !self.kernel_args.is_empty() => {
                return Err(format!("{}: kernel arguments need an ISO of their own", self.name));
            }
            BootKind::GrubBios => Boot::BiosIso { iso: a.iso.clone() },
            BootKind::GrubUefi => {
                let ovmf = a.ovmf.as_ref().ok_or("OVMF firmware not found (Debian: apt-get install ovmf)")?;
                let vars = ovmf.fresh_vars(&a.scratch_dir).map_err(|e| e.to_string())?;
                let b = Boot::UefiIso { iso: a.iso.clone(), code: ovmf.code.clone(), vars: vars.path().to_path_buf() };
                scratch.push(vars);
                b
            }
        };
        let mut c = QemuConfig::new(boot);
        c.qemu = a.qemu.clone();
        c.cpu = a.cpu.clone();
        c.machine = self.machine;
        c.smp = self.smp;
        c.mem_mib = self.mem_mib;
        c.extra = self.extra.iter().map(Into::into).collect();
        c.model_slot = self.model_slot;
        if self.com2 {
            c.com1_file = Some(self.com1_path(a));
        }
        if self.spcr_port.is_some() {
            c.extra.push("-acpitable".into());
            c.extra.push(format!("sig=SPCR,rev=2,data={}", self.spcr_path(a).display()).into());
        }
        Ok((c, scratch))
    }
}

/// The body (everything after the 36-byte header, which QEMU's `-acpitable sig=SPCR,rev=2,data=` builds) of a
/// revision 2 SPCR for a full 16550 at I/O port `port`, 115200 baud (docs/reference/acpi-tables.md, "SPCR").
pub fn spcr_body(port: u16) -> Vec<u8> {
    let mut b = vec![0u8; 80 - 36];
    b[0] = 0x00; // interface type: 16550
    b[4] = 1; // base address GAS: system I/O space
    b[5] = 8; // register bit width
    b[7] = 1; // access size: byte
    b[8..16].copy_from_slice(&u64::from(port).to_le_bytes());
    b[58 - 36] = 7; // 115200 baud
    b
}

/// What a test run builds, once, before the scenarios that need it (besides the image, which all need).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// The `mlx5-model` binary ([`Artifacts::model_bin`]).
    Model,
    /// The `leasectl` binary ([`Artifacts::leasectl_bin`]).
    Leasectl,
    /// The kernel built with the `fence-test` feature ([`Artifacts::fence_test_elf`]).
    FenceTestImage,
    /// The Soft-RoCE Linux guest ([`Artifacts::rxe_guest`]; `cargo xtask rxe-guest`).
    RxeGuest,
}

impl Build {
    /// Every build, in the order a test run does them.
    pub const ALL: [Build; 4] = [Build::Model, Build::Leasectl, Build::FenceTestImage, Build::RxeGuest];

    /// The step's name in the test report.
    pub fn step(self) -> &'static str {
        match self {
            Build::Model => "model-build",
            Build::Leasectl => "leasectl-build",
            Build::FenceTestImage => "fence-test-image",
            Build::RxeGuest => "rxe-guest",
        }
    }
}

/// A scenario that drives clients against the booted image. Its runner boots what it needs (the image with
/// virtio-net, the control port forwarded to a free host port, fresh keys; the model beside it if it needs
/// one), drives it, stops it, and returns a one-line summary or why it failed (with the serial tail).
#[derive(Clone, Debug)]
pub struct Driven {
    pub name: &'static str,
    /// One line on what it proves.
    pub about: &'static str,
    /// Built before it runs.
    pub needs: &'static [Build],
    pub run: fn(&Artifacts) -> Result<String, String>,
}

/// One entry of the scenario list.
#[derive(Clone, Debug)]
pub enum Entry {
    /// Boot, read the serial console, check the transcript.
    Boot(Scenario),
    /// Boot and drive clients against the image.
    Driven(Driven),
}

impl Entry {
    pub fn name(&self) -> &'static str {
        match self {
            Entry::Boot(s) => s.name,
            Entry::Driven(d) => d.name,
        }
    }

    pub fn about(&self) -> &'static str {
        match self {
            Entry::Boot(s) => s.about,
            Entry::Driven(d) => d.about,
        }
    }

    /// Whether it needs `b` built first.
    pub fn needs(&self, b: Build) -> bool {
        match self {
            Entry::Boot(s) => b == Build::Model && s.model,
            Entry::Driven(d) => d.needs.contains(&b),
        }
    }
}

/// Every scenario, in the order `cargo xtask test` runs them.
pub fn all() -> Vec<Entry> {
    let mut all: Vec<Entry> = boot_scenarios().into_iter().map(Entry::Boot).collect();
    all.push(Entry::Driven(Driven {
        name: crate::control::NAME,
        about: "the control channel under QEMU: leasectl ping/stats/health, 1,000 malformed frames beside a \
                heartbeating session, garbage, an altered v2 record, still answering; 9 silent connections: the \
                pre-authentication pool holds 8, the 9th is refused BUSY",
        needs: &[Build::Leasectl],
        run: crate::control::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::lease_qemu::NAME,
        about: "leases under QEMU with the model and virtio-net: leasectl alloc/ready/list/revoke/fenced, RDMA \
                WRITE/READ with the software requester, REM_ACCESS_ERR after an MKEY-first revoke, RETRY_EXC_ERR \
                after a QP-first one, `leasectl verify --revoke-test --order both`; the fence-test image fences a \
                revoked slot",
        needs: &[Build::Model, Build::Leasectl, Build::FenceTestImage],
        run: crate::lease_qemu::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::crash_qemu::NAME,
        about: "fail closed on crash: test=panic-after-lease with a live lease under QEMU and the model; a WRITE \
                succeeds, the panic takes the port down and clears bus mastering, the next WRITE gets no answer",
        needs: &[Build::Model],
        run: crate::crash_qemu::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::ctl_mlx5::NAME,
        about: "the control channel on the model's own Ethernet port, no virtio-net (hub of QEMU's user network, \
                the model's wire, a client port): leasectl ping/alloc/ready/list/revoke, `verify --revoke-test \
                --order both --arp` with the MAC by ARP; runt, oversize, other-MAC frames, a receive-ring overrun \
                and an ARP storm counted and dropped, still serving",
        needs: &[Build::Model, Build::Leasectl],
        run: crate::ctl_mlx5::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::fleet_qemu::NAME,
        about: "the QEMU appliance in a fleet: a registrar publishes it in a real etcd (loopback, temporary data \
                directory) with its free bytes and health, its /metrics pass `promtool check metrics`, and its key \
                is gone within the TTL once it stops",
        needs: &[Build::Model],
        run: crate::fleet_qemu::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::rxe::NAME,
        about: "Linux's Soft-RoCE as the client: a Debian guest with rdma_rxe on the appliance's segment (the hub's \
                client port) runs `leasectl verify --backend verbs --device rxe0 --revoke-test --order both` \
                through real libibverbs: data reads back, REM_ACCESS_ERR after an MKEY-first revoke, \
                RETRY_EXC_ERR after a QP-first one",
        needs: &[Build::Model, Build::Leasectl, Build::RxeGuest],
        run: crate::rxe::run,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::lease_qemu::LARGE_NAME,
        about: "a 6 GiB guest (q35: RAM above 4 GiB) lends a 2.5 GiB lease through the model: WRITE+READ at both \
                ends over RoCEv2, REVOKE TornDown, REM_ACCESS_ERR after it; while its memory is scrubbed a \
                HEARTBEAT and a 2 MiB lease's REVOKE answer within 1 s and a heartbeat-only session stays alive, \
                then the memory is back and a fresh large lease reads zero",
        needs: &[Build::Model],
        run: crate::lease_qemu::run_large,
    }));
    all.push(Entry::Driven(Driven {
        name: crate::scale_qemu::NAME,
        about: "a memory node's scale under QEMU: a 640 MiB guest sizes sessions= from its memory (at least 257), \
                256 tenant sessions heartbeat through two heartbeat periods while leases are granted and revoked, \
                and every one is still there",
        needs: &[Build::Model],
        run: crate::scale_qemu::run,
    }));
    all
}

/// The boot scenario called `name` (the benchmarks boot variations of them).
pub fn boot_scenario(name: &str) -> Option<Scenario> {
    boot_scenarios().into_iter().find(|s| s.name == name)
}

/// The boot scenarios, in run order.
fn boot_scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            machine: Machine::Pc,
            extra: vec!["-device", "e1000"],
            ..Scenario::new(
                "kernel-smp1-pc",
                "-kernel on i440FX (legacy 0xCF8 PCI), one CPU, an e1000 with a memory and an I/O BAR",
                BootKind::Kernel,
                check_kernel_smp1_pc,
            )
        },
        Scenario {
            smp: 3,
            extra: vec!["-object", "memory-backend-ram,id=hm,size=1M", "-device", "ivshmem-plain,memdev=hm"],
            ..Scenario::new(
                "kernel-smp3-q35",
                "-kernel on Q35 (ECAM), three CPUs, ivshmem with a 64-bit prefetchable BAR2",
                BootKind::Kernel,
                check_kernel_smp3_q35,
            )
        },
        Scenario {
            model: true,
            ..Scenario::new(
                "model-signature",
                "-kernel on Q35 with the mlx5 model: guest RAM and the ivshmem BAR in fresh shared files, the \
                 model process running; the image finds the model's signature in BAR2",
                BootKind::Kernel,
                check_model_signature,
            )
        },
        Scenario {
            model: true,
            smp: 3,
            ..Scenario::new(
                "hca-bringup",
                "-kernel on Q35, three CPUs, with the mlx5 model: the native driver brings the HCA up (ready line \
                 `hca=ConnectX-5 fw=... port=Active`), and the model's trace shows the bring-up in Linux's order",
                BootKind::Kernel,
                check_hca_bringup,
            )
        },
        Scenario {
            model: true,
            model_vf: true,
            ..Scenario::new(
                "hca-vf",
                "-kernel on Q35 with the mlx5 model playing a ConnectX-5 VF behind a legacy e-switch that also \
                 refuses PMTU/PAOS reads (`--vf --vf-port-reads-refused`): the driver learns it is a VF from the \
                 signature, skips HOST_ENDIANNESS and the port registers' writes, publishes its MAC in the unicast \
                 list, falls back to QUERY_VPORT_STATE and the vport MTU, and comes up (ready line \
                 `hca=ConnectX-5-VF ... lease=on`)",
                BootKind::Kernel,
                check_hca_vf,
            )
        },
        Scenario {
            model: true,
            model_slot: ModelSlot::Expander,
            // A static address: the ready line does not wait for DHCP on the model's port.
            kernel_args: "ip=192.0.2.9/24",
            ..Scenario::new(
                "hca-expander-q35",
                "-kernel on Q35 with the mlx5 model behind a pxb-pcie expander (a second PCIe root bus 0x40 with a \
                 root port, as a server's peer host bridge): the kernel finds root bus 0x40 by probing, the HCA \
                 comes up there (ready line `hca=ConnectX-5 ... hca_at=0000:4x:00.0 lease=on`)",
                BootKind::Kernel,
                check_hca_expander_q35,
            )
        },
        Scenario {
            model: true,
            model_slot: ModelSlot::Expander,
            // A static address: the ready line does not wait for DHCP on the model's port.
            kernel_args: "ip=192.0.2.9/24",
            machine: Machine::Pc,
            ..Scenario::new(
                "hca-expander-pc",
                "-kernel on i440FX (0xCF8 ports) with the mlx5 model on a pxb expander (root bus 0x40): found by \
                 probing every bus, the HCA comes up there (ready line `hca_at=0000:4x:00.0`, `lease=on`)",
                BootKind::Kernel,
                check_hca_expander_pc,
            )
        },
        Scenario {
            smp: 72,
            ..Scenario::new(
                "kernel-smp72-q35",
                "-kernel on Q35 with 72 CPUs: the kernel keeps the first 64 of the MADT and says it skipped 8, \
                 starts only the three role cores (ready line `cores=3`), and the other CPUs stay parked",
                BootKind::Kernel,
                check_kernel_smp72_q35,
            )
        },
        Scenario {
            kernel_args: "console=ttyS1",
            com2: true,
            ..Scenario::new(
                "console-com2",
                "two serial ports and `console=ttyS1`: the ready line and the whole boot log, from its first line, \
                 are on COM2; COM1 only says where the console went",
                BootKind::Kernel,
                check_console_com2,
            )
        },
        Scenario {
            com2: true,
            spcr_port: Some(0x2f8),
            ..Scenario::new(
                "console-spcr",
                "two serial ports and an ACPI SPCR naming COM2 (QEMU -acpitable), no console=: the kernel moves \
                 the console to COM2 once it has read the tables and replays the lines printed before on COM1 \
                 there; the ready line is on COM2 only",
                BootKind::Kernel,
                check_console_spcr,
            )
        },
        Scenario::new("grub-bios", "the GRUB ISO on SeaBIOS (multiboot1)", BootKind::GrubBios, check_grub),
        Scenario::new("grub-uefi", "the GRUB ISO on OVMF (multiboot2)", BootKind::GrubUefi, check_grub),
        Scenario {
            kernel_args: "test=pagefault",
            until: Until::Exit,
            ..Scenario::new(
                "fault-pagefault",
                "a deliberate page fault is dumped and QEMU exits with status 3",
                BootKind::Kernel,
                check_fault_pagefault,
            )
        },
        Scenario {
            model: true,
            smp: 3,
            kernel_args: "test=stall watchdog_ms=2000",
            until: Until::Exit,
            ..Scenario::new(
                "fault-watchdog",
                "three CPUs with the mlx5 model; core 0 stops its role loop (`test=stall`): another core's watchdog \
                 notices within `watchdog_ms=2000`, panics, and the fatal path takes the port down and clears bus \
                 mastering before QEMU exits with status 3",
                BootKind::Kernel,
                check_fault_watchdog,
            )
        },
        Scenario {
            kernel_args: "test=panic",
            until: Until::Exit,
            ..Scenario::new(
                "fault-panic",
                "a deliberate panic is reported and QEMU exits with status 3",
                BootKind::Kernel,
                check_fault_panic,
            )
        },
    ]
}

/// The scenarios whose names are in `names` (all if empty), in run order; an error names the unknown ones.
pub fn select(names: &[String]) -> Result<Vec<Entry>, String> {
    let all = all();
    if names.is_empty() {
        return Ok(all);
    }
    let unknown: Vec<&str> = names.iter().filter(|n| !all.iter().any(|s| s.name() == *n)).map(String::as_str).collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = all.iter().map(Entry::name).collect();
        return Err(format!("unknown scenario(s) {} (known: {})", unknown.join(", "), known.join(", ")));
    }
    Ok(all.into_iter().filter(|s| names.iter().any(|n| n == s.name())).collect())
}

fn expect_eq(what: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want { Ok(()) } else { Err(format!("{what} is {got}, expected {want}")) }
}

/// The ready line's `pci=` equals the number of listing lines.
fn check_pci_count(t: &Transcript, pci: &[PciFunction]) -> Result<(), String> {
    expect_eq("ready line's pci=", t.ready()?.u64("pci")?, pci.len() as u64)
}

fn find_device<'a>(pci: &'a [PciFunction], ids: &str) -> Result<&'a PciFunction, String> {
    let found: Vec<&PciFunction> = pci.iter().filter(|f| f.ids() == ids).collect();
    match found.as_slice() {
        [f] => Ok(f),
        [] => Err(format!(
            "no PCI function {ids} listed (listed: {})",
            pci.iter().map(PciFunction::ids).collect::<Vec<_>>().join(", ")
        )),
        _ => Err(format!("{} PCI functions {ids} listed, expected one", found.len())),
    }
}

fn expect_bar(f: &PciFunction, index: Option<u8>, kinds: &[BarKind], size: u64) -> Result<(), String> {
    let hit = f.bars.iter().any(|b| index.is_none_or(|i| b.index == i) && kinds.contains(&b.kind) && b.size == size);
    if hit {
        return Ok(());
    }
    let which = index.map_or("a".to_string(), |i| format!("bar{i} as"));
    let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    Err(format!("{} has no {which} {} BAR of size {size:#x}: `{f}`", f.ids(), kinds.join("/")))
}

/// CPU `n` reported online exactly once.
fn expect_online_once(t: &Transcript, cpu: u32) -> Result<(), String> {
    let n = t.cpus_online().iter().filter(|c| c.cpu == cpu).count();
    match n {
        1 => Ok(()),
        0 => Err(format!("no `smp: cpu {cpu} online` line")),
        n => Err(format!("`smp: cpu {cpu} online` printed {n} times, expected once")),
    }
}

/// No report-in from a CPU beyond `cores`.
fn expect_no_extra_cpus(t: &Transcript, cores: u32) -> Result<(), String> {
    match t.cpus_online().iter().find(|c| c.cpu >= cores) {
        Some(c) => Err(format!("cpu {} reported online with only {cores} CPUs", c.cpu)),
        None => Ok(()),
    }
}

/// `kernel-smp1-pc`.
pub fn check_kernel_smp1_pc(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    expect_eq("ready line's cores=", ready.u64("cores")?, 1)?;
    expect_online_once(t, 0)?;
    expect_no_extra_cpus(t, 1)?;
    let pci = t.pci()?;
    let e1000 = find_device(&pci, "8086:100e")?;
    expect_bar(e1000, None, &[BarKind::Mem32], 0x20000)?;
    expect_bar(e1000, None, &[BarKind::Io], 0x40)?;
    check_pci_count(t, &pci)
}

/// `kernel-smp3-q35`.
pub fn check_kernel_smp3_q35(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    expect_eq("ready line's cores=", ready.u64("cores")?, 3)?;
    for cpu in 0..3 {
        expect_online_once(t, cpu)?;
    }
    expect_no_extra_cpus(t, 3)?;
    let pci = t.pci()?;
    let ivshmem = find_device(&pci, "1af4:1110")?;
    expect_bar(ivshmem, Some(2), &[BarKind::Mem64Pf], 0x100000)?;
    check_pci_count(t, &pci)
}

/// `model-signature`: one ivshmem function with the model's 32 MiB BAR2, and the image's note that it
/// carries the model's signature.
pub fn check_model_signature(t: &Transcript) -> Result<(), String> {
    t.ready()?;
    t.no_fatal()?;
    let pci = t.pci()?;
    let ivshmem = find_device(&pci, "1af4:1110")?;
    expect_bar(ivshmem, Some(2), &[BarKind::Mem64Pf], leasebox_qemu::model::DEFAULT_BAR_BYTES)?;
    let bdf = format!("{:02x}:{:02x}.{:x}", ivshmem.bus, ivshmem.device, ivshmem.function);
    let noted: Vec<&str> = t.messages().filter_map(serial::parse_model_signature).collect();
    match noted.as_slice() {
        [b] if *b == bdf => {}
        [] => return Err(format!("no `pci: {bdf} ivshmem carries the mlx5 model` line")),
        other => return Err(format!("model signature reported for {other:?}, expected exactly [{bdf}]")),
    }
    check_pci_count(t, &pci)
}

/// The ready line's `hca_at=` as (segment, bus), after checking the HCA is up with the lease service on.
fn hca_found(t: &Transcript) -> Result<(u16, u8), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    if ready.get("hca") != Some("ConnectX-5") {
        return Err(format!("ready line reports hca={:?}, expected ConnectX-5", ready.get("hca")));
    }
    if ready.get("lease") != Some("on") {
        return Err(format!(
            "lease={:?}, expected on (lease_error={:?})",
            ready.get("lease"),
            ready.get("lease_error")
        ));
    }
    let at = ready.get("hca_at").ok_or("no hca_at= on the ready line")?;
    let parts: Vec<&str> = at.split([':', '.']).collect();
    let ok = parts.len() == 4 && [4, 2, 2, 1].iter().zip(&parts).all(|(n, p)| p.len() == *n);
    let (Some(seg), Some(bus)) = (
        parts.first().and_then(|p| u16::from_str_radix(p, 16).ok()),
        parts.get(1).and_then(|p| u8::from_str_radix(p, 16).ok()),
    ) else {
        return Err(format!("hca_at={at} is not SSSS:BB:DD.F"));
    };
    if !ok {
        return Err(format!("hca_at={at} is not SSSS:BB:DD.F"));
    }
    Ok((seg, bus))
}

/// The `pci: root buses ...` line lists the expander's root bus as found by probing.
fn expect_peer_root(t: &Transcript) -> Result<(), String> {
    let want = format!("0000:{EXPANDER_BUS:02x}");
    let line = t.messages().find(|m| m.starts_with("pci: root buses ")).ok_or("no `pci: root buses` line")?;
    if !line.split_whitespace().any(|w| w == want) || !line.contains("(1 found by probing") {
        return Err(format!("expected root bus {want} found by probing: `{line}`"));
    }
    Ok(())
}

/// `hca-expander-q35`: the HCA behind the expander's root port (a bus above 0x40), found by probing.
pub fn check_hca_expander_q35(t: &Transcript) -> Result<(), String> {
    let (seg, bus) = hca_found(t)?;
    if seg != 0 || bus <= EXPANDER_BUS {
        return Err(format!(
            "hca_at is segment {seg} bus {bus:#x}, expected behind the root port on bus {EXPANDER_BUS:#x}"
        ));
    }
    expect_peer_root(t)
}

/// `hca-expander-pc`: the HCA under the expander's root bus (QEMU's `pxb` puts its devices behind a PCI
/// bridge on that bus), found by probing through the 0xCF8 ports.
pub fn check_hca_expander_pc(t: &Transcript) -> Result<(), String> {
    let (seg, bus) = hca_found(t)?;
    if seg != 0 || bus < EXPANDER_BUS {
        return Err(format!("hca_at is segment {seg} bus {bus:#x}, expected under root bus {EXPANDER_BUS:#x}"));
    }
    if !t.messages().any(|m| m.starts_with("pci: no MCFG")) {
        return Err("no `pci: no MCFG` line: not the 0xCF8 path".into());
    }
    expect_peer_root(t)
}

/// `kernel-smp72-q35`: 64 of 72 processors kept, 8 reported skipped, three cores started, the rest parked.
pub fn check_kernel_smp72_q35(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    if !t.messages().any(|m| m.starts_with("acpi: ") && m.contains(" cpus 64 ")) {
        return Err("no `acpi: ... cpus 64` line: the MADT's first 64 processors were not kept".into());
    }
    if !t.messages().any(|m| m.starts_with("acpi: 8 more usable processors than the 64")) {
        return Err("no `acpi: 8 more usable processors than the 64 ...` line".into());
    }
    if !t.messages().any(|m| m.starts_with("smp: 3 of 64 CPUs started; 61 without a role stay parked")) {
        return Err("no `smp: 3 of 64 CPUs started; 61 without a role stay parked` line".into());
    }
    expect_eq("ready line's cores=", ready.u64("cores")?, 3)?;
    for cpu in 0..3 {
        expect_online_once(t, cpu)?;
    }
    expect_no_extra_cpus(t, 3)
}

/// `console-com2`: the transcript (COM2) has the boot from its first log line to the ready line; COM1 has the
/// move's announcement and no ready line.
pub fn check_console_com2(t: &Transcript) -> Result<(), String> {
    check_console_moved(t, "console=")
}

/// `console-spcr`: as `console-com2`, the move made for the SPCR after the ACPI tables were read, so the first
/// log lines on COM2 are the ones replayed from before the move.
pub fn check_console_spcr(t: &Transcript) -> Result<(), String> {
    check_console_moved(t, "ACPI SPCR")?;
    let first = t.messages().next().unwrap_or_default();
    if !first.starts_with("leasebox ") {
        return Err(format!("COM2's first log line is `{first}`, expected the replayed `leasebox ... booting via`"));
    }
    Ok(())
}

/// The console moved from COM1 to COM2 for `why` (`console=` or `ACPI SPCR`).
fn check_console_moved(t: &Transcript, why: &str) -> Result<(), String> {
    t.ready()?;
    t.no_fatal()?;
    if !t.messages().any(|m| m.starts_with("leasebox ") && m.contains(" booting via ")) {
        return Err("COM2 lacks the first log line, `leasebox ... booting via`".into());
    }
    let here = format!("console: COM2 (0x2f8) 115200 baud ({why})");
    if !t.messages().any(|m| m == here) {
        return Err(format!("no `{here}` line on COM2"));
    }
    let com1 = t.com1.as_deref().ok_or("COM1's file was not read")?;
    if !com1.contains(&format!("console: moving to COM2 (0x2f8) 115200 baud ({why})")) {
        return Err(format!("COM1 does not say where the console went: {:?}", com1.lines().last()));
    }
    if com1.contains(crate::serial::READY_MARKER) {
        return Err("the ready line is on COM1 too".into());
    }
    Ok(())
}

/// Linux mlx5_core's bring-up order (docs/reference/mlx5.md §b.2) as (opcode, op_mod) pairs the model's trace must
/// contain in this order, each with status 0; `None` matches any op_mod. MANAGE_PAGES appears after each QUERY_PAGES.
pub const BRINGUP_ORDER: &[(&str, Option<u32>, &str)] = &[
    ("0x104", None, "ENABLE_HCA"),
    ("0x10a", None, "QUERY_ISSI"),
    ("0x10b", None, "SET_ISSI"),
    ("0x107", Some(1), "QUERY_PAGES boot"),
    ("0x108", Some(1), "MANAGE_PAGES give"),
    ("0x805", Some(0), "ACCESS_REG HOST_ENDIANNESS"),
    ("0x100", Some(0), "QUERY_HCA_CAP general max"),
    ("0x100", Some(1), "QUERY_HCA_CAP general cur"),
    ("0x109", Some(0), "SET_HCA_CAP general"),
    // The model's default ConnectX-5 caps offer host-endian atomics: Linux `handle_hca_cap_atomic`.
    ("0x100", Some(7), "QUERY_HCA_CAP atomic cur"),
    ("0x109", Some(6), "SET_HCA_CAP atomic"),
    ("0x107", Some(2), "QUERY_PAGES init"),
    ("0x108", Some(1), "MANAGE_PAGES give"),
    ("0x102", None, "INIT_HCA"),
    ("0x802", None, "ALLOC_UAR"),
    ("0x301", None, "CREATE_EQ"),
    ("0x754", None, "QUERY_NIC_VPORT_CONTEXT"),
    ("0x760", None, "QUERY_ROCE_ADDRESS"),
    ("0x805", Some(1), "ACCESS_REG PMTU read"),
    ("0x805", Some(1), "ACCESS_REG PAOS read"),
];

/// `hca-bringup`: the ready line reports the HCA up with its part, firmware and an active port after link
/// training; the cmd and event roles run on cores 1 and 2; and the model's trace holds the bring-up commands in Linux's order,
/// each with status 0.
pub fn check_hca_bringup(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    if ready.get("hca") != Some("ConnectX-5") {
        return Err(format!("ready line reports hca={:?}, expected ConnectX-5", ready.get("hca")));
    }
    let fw = ready.get("fw").ok_or("no fw= on the ready line")?;
    if fw.split('.').count() != 3 || fw.split('.').any(|p| p.parse::<u32>().is_err()) {
        return Err(format!("fw={fw} is not X.Y.Z"));
    }
    if ready.get("port") != Some("Active") {
        return Err(format!("port={:?}, expected Active", ready.get("port")));
    }
    // The model trains its link (1 s by default, docs/hca-model.md): bring-up waited for it rather than
    // finding the port up at once.
    if !t.messages().any(|m| m.starts_with("mlx5: port 1 Active after ")) {
        return Err("no `mlx5: port 1 Active after N ms of link training` line: the link did not train".into());
    }
    ready.ms("hca_ms")?;
    for (cpu, role) in [(1, "cmd"), (2, "event")] {
        let line = t.messages().find(|m| m.starts_with(&format!("smp: cpu {cpu} online")));
        if !line.is_some_and(|l| l.ends_with(&format!("role={role}"))) {
            return Err(format!("cpu {cpu} does not run the {role} role: {line:?}"));
        }
    }
    let trace = t.model_trace.as_deref().ok_or("the model's trace file was not read")?;
    check_bringup_order(trace)
}

/// `hca-vf`: the ready line reports the VF part with an active port and the lease service on; the model's
/// trace holds no HOST_ENDIANNESS access and no register write (a VF's firmware refuses them).
pub fn check_hca_vf(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    if ready.get("hca") != Some("ConnectX-5-VF") {
        return Err(format!("ready line reports hca={:?}, expected ConnectX-5-VF", ready.get("hca")));
    }
    if ready.get("port") != Some("Active") {
        return Err(format!("port={:?}, expected Active", ready.get("port")));
    }
    if ready.get("lease") != Some("on") {
        return Err(format!(
            "lease={:?}, expected on (lease_error={:?})",
            ready.get("lease"),
            ready.get("lease_error")
        ));
    }
    let trace = t.model_trace.as_deref().ok_or("the model's trace file was not read")?;
    check_vf_trace(trace)
}

/// A VF's bring-up in the model's trace: ENABLE_HCA and INIT_HCA succeeded; ACCESS_REG (0x805) only ever read
/// (op_mod 1) — HOST_ENDIANNESS and the PAOS/PMTU writes are the PF's; the model (`--vf-port-reads-refused`)
/// refused at least one of those reads, and the driver fell back to QUERY_VPORT_STATE (0x750) and published
/// its MAC with MODIFY_NIC_VPORT_CONTEXT (0x755), both successfully.
pub fn check_vf_trace(trace: &str) -> Result<(), String> {
    let (mut enable, mut init, mut refused, mut vport_state, mut modify) = (false, false, false, false, false);
    for l in trace.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).map_err(|e| format!("a trace line is not JSON ({e}): {l}"))?;
        let ok = v["status"] == 0 && v.get("delivery").is_none();
        if v["opcode"] == "0x805" && v["op_mod"] != 1 {
            return Err(format!("ACCESS_REG other than a read on a VF: {l}"));
        }
        refused |= v["opcode"] == "0x805" && !ok;
        enable |= v["opcode"] == "0x104" && ok;
        init |= v["opcode"] == "0x102" && ok;
        vport_state |= v["opcode"] == "0x750" && ok;
        modify |= v["opcode"] == "0x755" && ok;
    }
    if !(enable && init) {
        return Err("the trace lacks ENABLE_HCA or INIT_HCA".into());
    }
    if !refused {
        return Err("no ACCESS_REG read was refused: the model did not refuse the port registers".into());
    }
    if !(vport_state && modify) {
        return Err("the trace lacks a successful QUERY_VPORT_STATE or MODIFY_NIC_VPORT_CONTEXT".into());
    }
    Ok(())
}

/// The trace's commands contain [`BRINGUP_ORDER`] as an ordered subsequence, each with status 0.
pub fn check_bringup_order(trace: &str) -> Result<(), String> {
    let mut want = BRINGUP_ORDER.iter().peekable();
    for l in trace.lines() {
        let Some(&&(opcode, op_mod, _)) = want.peek() else { break };
        let v: serde_json::Value =
            serde_json::from_str(l).map_err(|e| format!("a trace line is not JSON ({e}): {l}"))?;
        if v["opcode"] != opcode {
            continue;
        }
        if op_mod.is_some_and(|m| v["op_mod"] != m) {
            continue;
        }
        if v["status"] != 0 || v.get("delivery").is_some() {
            return Err(format!("bring-up command {opcode} did not succeed in the trace: {l}"));
        }
        want.next();
    }
    match want.next() {
        None => Ok(()),
        Some((opcode, _, name)) => Err(format!(
            "the trace ({} lines) lacks {name} ({opcode}) in Linux's bring-up order",
            trace.lines().count()
        )),
    }
}

/// `grub-bios`, `grub-uefi`: the ready line and nothing fatal.
pub fn check_grub(t: &Transcript) -> Result<(), String> {
    let ready = t.ready()?;
    t.no_fatal()?;
    ready.u64("cores")?;
    Ok(())
}

fn expect_debug_exit_failure(t: &Transcript) -> Result<(), String> {
    match t.exit {
        Some(e) if e.is_guest_failure() => Ok(()),
        _ => Err(format!("expected QEMU to exit with status 3 (isa-debug-exit 1), but: {}", t.ending())),
    }
}

/// `fault-pagefault`.
pub fn check_fault_pagefault(t: &Transcript) -> Result<(), String> {
    let dump = t.from_first(serial::is_exception).ok_or_else(|| format!("no EXCEPTION line ({})", t.ending()))?;
    let vector = dump.iter().find_map(|l| serial::token_value(l, "vector"));
    if vector != Some("14") {
        return Err(format!("exception dump has vector={}, expected 14: `{}`", vector.unwrap_or("(none)"), dump[0]));
    }
    for key in ["rip", "cr2"] {
        if !dump.iter().any(|l| serial::token_value(l, key).is_some() || l.contains(&format!("{key}="))) {
            return Err(format!("exception dump has no `{key}=`"));
        }
    }
    expect_debug_exit_failure(t)
}

/// `fault-watchdog`: the stuck core named in a PANIC from another core, then the fatal path's lines in order.
pub fn check_fault_watchdog(t: &Transcript) -> Result<(), String> {
    let panic = t
        .lines
        .iter()
        .position(|l| serial::is_panic(l) && l.contains("watchdog: core 0"))
        .ok_or_else(|| format!("no watchdog PANIC naming core 0 ({})", t.ending()))?;
    if t.lines[panic].contains("!!! c0 ") {
        return Err(format!("the stuck core reported itself: `{}`", t.lines[panic]));
    }
    let mut at = panic;
    for want in ["fail-closed: port 1 down", "bus mastering cleared"] {
        at += t.lines[at..]
            .iter()
            .position(|l| l.contains(want))
            .ok_or_else(|| format!("no `{want}` after the PANIC"))?;
    }
    expect_debug_exit_failure(t)
}

/// `fault-panic`.
pub fn check_fault_panic(t: &Transcript) -> Result<(), String> {
    if !t.lines.iter().any(|l| serial::is_panic(l)) {
        return Err(format!("no PANIC line ({})", t.ending()));
    }
    expect_debug_exit_failure(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasebox_qemu::QemuExit;

    const SMP1_PC: &str = "\
SeaBIOS (version 1.16.2-debian-1.16.2-1)
Booting from ROM..\r
[    0.000010] c0 INFO  leasebox 0.1.0 starting\r
[    0.000020] c0 INFO  smp: cpu 0 online apic=0 role=net,cmd,event\r
[    0.000900] c0 INFO  pci: legacy 0xcf8 mechanism\r
[    0.001000] c0 INFO  pci: 00:00.0 8086:1237 class=06.00.00\r
[    0.001100] c0 INFO  pci: 00:01.0 8086:7000 class=06.01.00\r
[    0.001200] c0 INFO  pci: 00:01.1 8086:7010 class=01.01.80 bar4=io:0xc040+0x10\r
[    0.001300] c0 INFO  pci: 00:01.3 8086:7113 class=06.80.00\r
[    0.001400] c0 INFO  pci: 00:02.0 1234:1111 class=03.00.00 bar0=mem32pf:0xfd000000+0x1000000 bar2=mem32:0xfebf0000+0x1000\r
[    0.001500] c0 INFO  pci: 00:03.0 8086:100e class=02.00.00 bar0=mem32:0xfebc0000+0x20000 bar1=io:0xc000+0x40\r
leasebox: ready cores=1 mem_mib=256 pci=6 boot_ms=2.100 ap_ms=0.000 entry_ms=90.000\r
";

    const SMP3_Q35: &str = "\
[    0.000010] c0 INFO  smp: cpu 0 online apic=0 role=net
[    0.010000] c1 INFO  smp: cpu 1 online apic=1 role=cmd
[    0.020000] c2 INFO  smp: cpu 2 online apic=2 role=event
[    0.021000] c0 INFO  pci: 00:00.0 8086:29c0 class=06.00.00
[    0.021100] c0 INFO  pci: 00:01.0 1af4:1110 class=05.00.00 bar0=mem32:0xfebd1000+0x100 bar2=mem64pf:0xfe800000+0x100000
[    0.021200] c0 INFO  pci: 00:1f.0 8086:2918 class=06.01.00
leasebox: ready cores=3 mem_mib=256 pci=3 boot_ms=22.000 ap_ms=20.000 entry_ms=100.000
";

    #[test]
    fn smp1_pc_passes_on_good_output() {
        assert_eq!(check_kernel_smp1_pc(&Transcript::from_text(SMP1_PC)), Ok(()));
    }

    #[test]
    fn smp1_pc_catches_each_fault() {
        let bad = |from: &str, to: &str| check_kernel_smp1_pc(&Transcript::from_text(&SMP1_PC.replace(from, to)));
        assert!(bad("pci=6", "pci=7").unwrap_err().contains("pci="));
        assert!(bad("cores=1", "cores=2").unwrap_err().contains("cores="));
        assert!(bad("smp: cpu 0 online", "smp: cpu 0 up").unwrap_err().contains("cpu 0"));
        assert!(bad("+0x20000", "+0x10000").unwrap_err().contains("0x20000"));
        assert!(bad("bar1=io:0xc000+0x40", "").unwrap_err().contains("io"));
        assert!(bad("8086:100e", "8086:10d3").unwrap_err().contains("8086:100e"));
        assert!(bad("leasebox: ready", "leasebox: steady").unwrap_err().contains("no `leasebox: ready`"));
        assert!(bad("Booting from ROM..", "PANIC early").unwrap_err().contains("fatal"));
        assert!(bad("class=02.00.00", "class=2.0.0").unwrap_err().contains("bad PCI line"));
    }

    const EXPANDER_Q35: &str = "\
[    0.069959] c0 INFO  pci: root buses 0000:00 0000:40 (1 found by probing for peer host bridges)
[    0.074179] c0 INFO  pci: 41:00.0 1af4:1110 class=05.00.00 bar0=mem32:0xfe800000+0x100 bar2=mem64pf:0xfa000000+0x2000000
leasebox: ready cores=1 mem_mib=255 pci=8 boot_ms=1521.492 ap_ms=0.096 entry_ms=192.086 ip=192.0.2.9 ctl_port=7470 \
ctl_nic=mlx5 link=up hca=ConnectX-5 fw=16.35.4030 port=Active hca_ms=514.850 hca_at=0000:41:00.0 lease=on pool_mib=64
";

    #[test]
    fn expander_checks_pass_and_catch_faults() {
        assert_eq!(check_hca_expander_q35(&Transcript::from_text(EXPANDER_Q35)), Ok(()));
        let bad =
            |from: &str, to: &str| check_hca_expander_q35(&Transcript::from_text(&EXPANDER_Q35.replace(from, to)));
        assert!(bad("hca_at=0000:41:00.0", "hca_at=0000:00:03.0").unwrap_err().contains("behind the root port"));
        assert!(bad("hca_at=0000:41:00.0", "hca_at=41:00.0").unwrap_err().contains("SSSS:BB:DD.F"));
        assert!(bad(" hca_at=0000:41:00.0", "").unwrap_err().contains("no hca_at="));
        assert!(bad("hca=ConnectX-5", "hca=none").unwrap_err().contains("hca="));
        assert!(bad("lease=on", "lease=off").unwrap_err().contains("lease="));
        assert!(bad("(1 found", "(0 found").unwrap_err().contains("found by probing"));
        assert!(bad("0000:00 0000:40", "0000:00").unwrap_err().contains("0000:40"));
        // On pc the device may sit on the root bus itself or behind pxb's bridge, but only with the 0xCF8 path.
        let pc =
            std::format!("[    0.02] c0 INFO  pci: no MCFG, using configuration ports 0xCF8/0xCFC\n{EXPANDER_Q35}");
        assert_eq!(check_hca_expander_pc(&Transcript::from_text(&pc)), Ok(()));
        assert!(check_hca_expander_pc(&Transcript::from_text(EXPANDER_Q35)).unwrap_err().contains("0xCF8"));
        let low = pc.replace("hca_at=0000:41:00.0", "hca_at=0000:3f:00.0");
        assert!(check_hca_expander_pc(&Transcript::from_text(&low)).unwrap_err().contains("under root bus"));
    }

    const SMP72: &str = "\
[    0.032520] c0 INFO  acpi: rsdp 0xf59e0 (LegacySearch) revision 0 oem BOCHS  cpus 64 ecam 1 lapic 0xfee00000
[    0.033927] c0 WARN  acpi: 8 more usable processors than the 64 the kernel drives; they stay parked
[    0.134081] c0 INFO  smp: 3 of 64 CPUs started; 61 without a role stay parked (cores= names more)
[    0.140038] c0 INFO  smp: cpu 0 online apic=0 role=net
[    0.186313] c1 INFO  smp: cpu 1 online apic=1 role=cmd
[    0.196943] c2 INFO  smp: cpu 2 online apic=2 role=event
leasebox: ready cores=3 mem_mib=255 pci=5 boot_ms=226.487 ap_ms=40.815 entry_ms=920.628 ip=none hca=none
";

    #[test]
    fn smp72_passes_and_catches_faults() {
        assert_eq!(check_kernel_smp72_q35(&Transcript::from_text(SMP72)), Ok(()));
        let bad = |from: &str, to: &str| check_kernel_smp72_q35(&Transcript::from_text(&SMP72.replace(from, to)));
        assert!(bad("cpus 64 ", "cpus 1 ").unwrap_err().contains("first 64"));
        assert!(bad("acpi: 8 more", "acpi: 0 more").unwrap_err().contains("8 more"));
        assert!(bad("3 of 64 CPUs", "64 of 64 CPUs").unwrap_err().contains("stay parked"));
        assert!(bad("cores=3", "cores=64").unwrap_err().contains("cores="));
        let extra = std::format!("{SMP72}[    0.2] c3 INFO  smp: cpu 3 online apic=3 role=idle\n");
        assert!(check_kernel_smp72_q35(&Transcript::from_text(&extra)).unwrap_err().contains("cpu 3"));
    }

    const COM2: &str = "\
[    0.010025] c0 INFO  console: COM2 (0x2f8) 115200 baud (console=)
[    0.011255] c0 INFO  leasebox 0.1.0 booting via Multiboot1; cmdline \"k console=ttyS1\"
leasebox: ready cores=1 mem_mib=255 pci=5 boot_ms=50.132 ap_ms=0.117 entry_ms=176.845 ip=none hca=none
";

    #[test]
    fn console_com2_passes_and_catches_faults() {
        let with = |text: &str, com1: Option<&str>| {
            let mut t = Transcript::from_text(text);
            t.com1 = com1.map(str::to_string);
            check_console_com2(&t)
        };
        let moved = "console: moving to COM2 (0x2f8) 115200 baud (console=)\n";
        assert_eq!(with(COM2, Some(moved)), Ok(()));
        assert!(with(COM2, None).unwrap_err().contains("COM1's file"));
        assert!(with(COM2, Some("")).unwrap_err().contains("where the console went"));
        let both = std::format!("{moved}leasebox: ready cores=1\n");
        assert!(with(COM2, Some(&both)).unwrap_err().contains("on COM1 too"));
        assert!(
            with(&COM2.replace("leasebox 0.1.0 booting", "x"), Some(moved)).unwrap_err().contains("first log line")
        );
        assert!(with(&COM2.replace("COM2 (0x2f8)", "COM1 (0x3f8)"), Some(moved)).unwrap_err().contains("on COM2"));
        assert!(with(&COM2.replace("leasebox: ready", "x"), Some(moved)).is_err());

        // The SPCR variant: the reason differs, and the replayed lines come first.
        let spcr = String::from(
            "[    0.006994] c0 INFO  leasebox 0.1.0 booting via Multiboot1; cmdline \"k\"\n\
             [    0.027345] c0 INFO  console: COM2 (0x2f8) 115200 baud (ACPI SPCR)\n\
             leasebox: ready cores=1 hca=none\n",
        );
        let mut t = Transcript::from_text(&spcr);
        t.com1 = Some("[    0.006994] c0 INFO  leasebox 0.1.0 booting via ...\nconsole: moving to COM2 (0x2f8) 115200 baud (ACPI SPCR)\n".into());
        assert_eq!(check_console_spcr(&t), Ok(()));
        assert!(check_console_com2(&t).unwrap_err().contains("(console=)"));
        t.lines.swap(0, 1);
        assert!(check_console_spcr(&t).unwrap_err().contains("replayed"));
    }

    #[test]
    fn spcr_body_layout() {
        let b = spcr_body(0x2f8);
        assert_eq!(b.len(), 44);
        assert_eq!((b[0], b[4], b[22]), (0, 1, 7));
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 0x2f8);
        let a = Artifacts::for_tests();
        let s = boot_scenario("console-spcr").unwrap();
        let (c, _) = s.qemu_config(&a).unwrap();
        let args: Vec<String> = c.args().into_iter().map(|s| s.into_string().unwrap()).collect();
        let want = std::format!("sig=SPCR,rev=2,data={}", s.spcr_path(&a).display());
        assert!(args.windows(2).any(|w| w[0] == "-acpitable" && w[1] == want), "{args:?}");
        assert!(args.windows(2).any(|w| w[0] == "-serial" && w[1].starts_with("file:")), "{args:?}");
    }

    #[test]
    fn smp3_q35_passes_and_catches_faults() {
        assert_eq!(check_kernel_smp3_q35(&Transcript::from_text(SMP3_Q35)), Ok(()));
        let bad = |from: &str, to: &str| check_kernel_smp3_q35(&Transcript::from_text(&SMP3_Q35.replace(from, to)));
        assert!(bad("smp: cpu 2 online", "smp: cpu 1 online").unwrap_err().contains("cpu 1"));
        assert!(bad("smp: cpu 2 online", "smp: cpu 3 online").unwrap_err().contains("cpu 2"));
        assert!(bad("bar2=mem64pf", "bar2=mem64").unwrap_err().contains("bar2"));
        assert!(bad("bar2=mem64pf:0xfe800000", "bar4=mem64pf:0xfe800000").unwrap_err().contains("bar2"));
        assert!(bad("cores=3", "cores=1").unwrap_err().contains("cores="));
        let mut dup = SMP3_Q35.to_string();
        dup.push_str("[    0.030000] c1 INFO  smp: cpu 1 online apic=1 role=cmd\n");
        assert!(check_kernel_smp3_q35(&Transcript::from_text(&dup)).unwrap_err().contains("2 times"));
    }

    const MODEL: &str = "\
[    0.021000] c0 INFO  pci: 00:00.0 8086:29c0 class=06.00.00
[    0.021100] c0 INFO  pci: 00:02.0 1af4:1110 class=05.00.00 bar0=mem32:0xfebd1000+0x100 bar2=mem64pf:0xfc000000+0x2000000
[    0.021200] c0 INFO  pci: 00:1f.0 8086:2918 class=06.01.00
[    0.021300] c0 INFO  pci: 00:02.0 ivshmem carries the mlx5 model (signature at BAR2+0x1fff000)
leasebox: ready cores=1 mem_mib=256 pci=3 boot_ms=22.000 ap_ms=0.000 entry_ms=100.000
";

    #[test]
    fn bringup_order_is_checked() {
        let line = |op: &str, m: u32, st: u32| {
            format!(
                "{{\"t_ns\":1,\"slot\":0,\"opcode\":\"{op}\",\"op_mod\":{m},\"status\":{st},\"syndrome\":\"0x0\"}}\n"
            )
        };
        let good: String = BRINGUP_ORDER.iter().map(|(op, m, _)| line(op, m.unwrap_or(0), 0)).collect();
        assert_eq!(check_bringup_order(&good), Ok(()));
        // Extra commands in between are fine.
        let padded = good.replacen("\n", &format!("\n{}", line("0x200", 0, 0)), 3);
        assert_eq!(check_bringup_order(&padded), Ok(()));
        // INIT_HCA before the init pages: out of order.
        let mut lines: Vec<String> = BRINGUP_ORDER.iter().map(|(op, m, _)| line(op, m.unwrap_or(0), 0)).collect();
        let at = |name: &str| BRINGUP_ORDER.iter().position(|e| e.2 == name).unwrap();
        let init = lines.remove(at("INIT_HCA"));
        lines.insert(at("SET_HCA_CAP general"), init);
        assert!(check_bringup_order(&lines.concat()).unwrap_err().contains("INIT_HCA"));
        let failed = good.replace(
            "\"opcode\":\"0x102\",\"op_mod\":0,\"status\":0",
            "\"opcode\":\"0x102\",\"op_mod\":0,\"status\":3",
        );
        assert!(check_bringup_order(&failed).unwrap_err().contains("did not succeed"));
        assert!(check_bringup_order("{\"opcode\":\"0x104\",").unwrap_err().contains("not JSON"));
        let t = Transcript::from_text(MODEL);
        assert!(check_hca_bringup(&t).unwrap_err().contains("hca="));
        // An active port that never trained (the link up at once) is not the model's default.
        let untrained = "leasebox: ready cores=3 hca=ConnectX-5 fw=16.35.4030 port=Active hca_ms=1.000 lease=on\n";
        assert!(check_hca_bringup(&Transcript::from_text(untrained)).unwrap_err().contains("did not train"));
    }

    #[test]
    fn vf_checks_the_part_the_lease_service_and_the_registers() {
        let line = |op: &str, m: u32, st: u32| {
            format!(
                "{{\"t_ns\":1,\"slot\":0,\"opcode\":\"{op}\",\"op_mod\":{m},\"status\":{st},\"syndrome\":\"0x0\"}}\n"
            )
        };
        let base = [line("0x104", 0, 0), line("0x102", 0, 0), line("0x755", 0, 0), line("0x805", 1, 0)].concat();
        let good = [base.as_str(), &line("0x805", 1, 3), &line("0x750", 0, 0), &line("0x200", 0, 0)].concat();
        assert_eq!(check_vf_trace(&good), Ok(()));
        let he = format!("{good}{}", line("0x805", 0, 3));
        assert!(check_vf_trace(&he).unwrap_err().contains("ACCESS_REG"));
        let no_refusal = [base.as_str(), &line("0x750", 0, 0)].concat();
        assert!(check_vf_trace(&no_refusal).unwrap_err().contains("refused"));
        let no_fallback = [base.as_str(), &line("0x805", 1, 3)].concat();
        assert!(check_vf_trace(&no_fallback).unwrap_err().contains("QUERY_VPORT_STATE"));
        assert!(check_vf_trace(&line("0x104", 0, 0)).unwrap_err().contains("INIT_HCA"));
        let ready = "leasebox: ready cores=1 hca=ConnectX-5-VF fw=16.35.4030 port=Active hca_ms=1.000 lease=on\n";
        let mut t = Transcript::from_text(ready);
        t.model_trace = Some(good.clone());
        assert_eq!(check_hca_vf(&t), Ok(()));
        let mut t = Transcript::from_text(&ready.replace("ConnectX-5-VF", "ConnectX-5"));
        t.model_trace = Some(good.clone());
        assert!(check_hca_vf(&t).unwrap_err().contains("hca="));
        let mut t = Transcript::from_text(&ready.replace("lease=on", "lease=off lease_error=\"x\""));
        t.model_trace = Some(good);
        assert!(check_hca_vf(&t).unwrap_err().contains("lease="));
    }

    #[test]
    fn model_signature_passes_and_catches_faults() {
        assert_eq!(check_model_signature(&Transcript::from_text(MODEL)), Ok(()));
        let bad = |from: &str, to: &str| check_model_signature(&Transcript::from_text(&MODEL.replace(from, to)));
        assert!(bad("ivshmem carries", "ivshmem lacks").unwrap_err().contains("no `pci: 00:02.0 ivshmem carries"));
        assert!(bad("pci: 00:02.0 ivshmem", "pci: 00:03.0 ivshmem").unwrap_err().contains("00:03.0"));
        assert!(bad("+0x2000000", "+0x100000").unwrap_err().contains("bar2"));
        assert!(bad("pci=3", "pci=4").unwrap_err().contains("pci="));
    }

    #[test]
    fn grub_needs_only_ready() {
        let t = Transcript::from_text("\x1b[0m\x1b[30m\x1b[47mGRUB\nleasebox: ready cores=1 pci=0 boot_ms=1.000\n");
        assert_eq!(check_grub(&t), Ok(()));
        assert!(check_grub(&Transcript::from_text("GRUB loading.\n")).is_err());
    }

    #[test]
    fn pagefault() {
        let text = "\
leasebox: ready cores=1 pci=0 boot_ms=1.000 ap_ms=0.000 entry_ms=1.000
[    0.100000] c0 ERROR EXCEPTION #PF vector=14 error=0x2 on core 0
[    0.100001] c0 ERROR   rip=0x0000000000101234 rsp=0x0000000000200000 rflags=0x0000000000000046
[    0.100002] c0 ERROR   cr2=0x00000000dead0000 cr3=0x0000000000300000
";
        let mut t = Transcript::from_text(text);
        t.exit = Some(QemuExit::DebugExit { value: 1 });
        assert_eq!(check_fault_pagefault(&t), Ok(()));
        t.exit = None;
        t.timed_out = true;
        t.deadline = Duration::from_secs(60);
        assert!(check_fault_pagefault(&t).unwrap_err().contains("status 3"));
        let mut t = Transcript::from_text(&text.replace("vector=14", "vector=13"));
        t.exit = Some(QemuExit::DebugExit { value: 1 });
        assert!(check_fault_pagefault(&t).unwrap_err().contains("vector=13"));
        let mut t = Transcript::from_text(&text.replace("cr2=", "cr3x"));
        t.exit = Some(QemuExit::DebugExit { value: 1 });
        assert!(check_fault_pagefault(&t).unwrap_err().contains("cr2"));
        let t = Transcript::from_text("leasebox: ready cores=1\n");
        assert!(check_fault_pagefault(&t).unwrap_err().contains("no EXCEPTION"));
    }

    #[test]
    fn panic() {
        let mut t = Transcript::from_text("[    0.1] c0 ERROR PANIC at image/src/main.rs:42:9: test=panic\n");
        t.exit = Some(QemuExit::DebugExit { value: 1 });
        assert_eq!(check_fault_panic(&t), Ok(()));
        t.exit = Some(QemuExit::Clean);
        assert!(check_fault_panic(&t).unwrap_err().contains("status 0"));
    }

    #[test]
    fn selection() {
        let names: Vec<&str> = all().iter().map(Entry::name).collect();
        assert_eq!(
            names,
            [
                "kernel-smp1-pc",
                "kernel-smp3-q35",
                "model-signature",
                "hca-bringup",
                "hca-vf",
                "hca-expander-q35",
                "hca-expander-pc",
                "kernel-smp72-q35",
                "console-com2",
                "console-spcr",
                "grub-bios",
                "grub-uefi",
                "fault-pagefault",
                "fault-watchdog",
                "fault-panic",
                "control-qemu",
                "lease-qemu",
                "crash-fail-closed",
                "ctl-mlx5-qemu",
                "fleet-qemu",
                "rxe-qemu",
                "lease-qemu-large",
                "scale-qemu"
            ]
        );
        assert_eq!(select(&[]).unwrap().len(), 23);
        assert_eq!(select(&["grub-bios".into()]).unwrap()[0].name(), "grub-bios");
        // Run order, not the order named; driven and boot scenarios alike.
        let picked = select(&["lease-qemu".into(), "kernel-smp1-pc".into(), "control-qemu".into()]).unwrap();
        let picked: Vec<&str> = picked.iter().map(Entry::name).collect();
        assert_eq!(picked, ["kernel-smp1-pc", "control-qemu", "lease-qemu"]);
        let e = select(&["nope".into(), "control-qemu".into()]).unwrap_err();
        assert!(e.contains("nope") && e.contains("known: kernel-smp1-pc") && e.contains("lease-qemu"), "{e}");
    }

    #[test]
    fn builds_follow_the_scenarios() {
        let needing =
            |b: Build| -> Vec<&'static str> { all().iter().filter(|s| s.needs(b)).map(Entry::name).collect() };
        assert_eq!(
            needing(Build::Model),
            [
                "model-signature",
                "hca-bringup",
                "hca-vf",
                "hca-expander-q35",
                "hca-expander-pc",
                "fault-watchdog",
                "lease-qemu",
                "crash-fail-closed",
                "ctl-mlx5-qemu",
                "fleet-qemu",
                "rxe-qemu",
                "lease-qemu-large",
                "scale-qemu"
            ]
        );
        assert_eq!(needing(Build::Leasectl), ["control-qemu", "lease-qemu", "ctl-mlx5-qemu", "rxe-qemu"]);
        assert_eq!(needing(Build::FenceTestImage), ["lease-qemu"]);
        assert_eq!(needing(Build::RxeGuest), ["rxe-qemu"]);
        assert!(matches!(&all()[15], Entry::Driven(d) if d.about.contains("malformed frames")));
    }

    #[test]
    fn configs() {
        let a = Artifacts::for_tests();
        let s = &boot_scenarios()[0];
        let (c, scratch) = s.qemu_config(&a).unwrap();
        assert!(scratch.is_empty());
        let args: Vec<String> = c.args().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert!(args.windows(2).any(|w| w == ["-machine", "pc"]));
        assert!(args.windows(2).any(|w| w == ["-device", "e1000"]));
        let pf = boot_scenario("fault-pagefault").unwrap();
        let (c, _) = pf.qemu_config(&a).unwrap();
        assert!(matches!(c.boot, Boot::Kernel { ref append, .. } if append == "test=pagefault"));
        let uefi = boot_scenario("grub-uefi").unwrap();
        assert!(uefi.qemu_config(&a).unwrap_err().contains("OVMF"));
        let mut bios = boot_scenario("grub-bios").unwrap();
        bios.kernel_args = "test=panic";
        assert!(bios.qemu_config(&a).is_err());
    }
}
