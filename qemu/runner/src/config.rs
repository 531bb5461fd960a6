//! QEMU command lines for the three boot paths.
//!
//! Every path shares one base (docs/reference/platform.md, "Booting under QEMU"):
//! `-machine <m> -accel tcg -cpu <model> -m <MiB> -smp <n> -display none -no-reboot -serial stdio
//! -device isa-debug-exit,iobase=0xf4,iosize=0x04`, then either `-nic none` or, with [`QemuConfig::net`], a
//! virtio-net NIC on QEMU's user-mode network with the control port forwarded from the host
//! (`-netdev user,id=n0,hostfwd=tcp:127.0.0.1:7470-:7470 -device virtio-net-pci,netdev=n0`). With
//! [`QemuConfig::hub`], the user-mode network joins hub 0 together with UDP socket ports that carry one
//! Ethernet frame per datagram (the ConnectX-5 model's Ethernet wire, the software RoCE requester), and the
//! virtio-net NIC, if any, is one more port on that hub (docs/reference/platform.md, "A hub of UDP ports").
//! KVM is never used: on these hosts it is a nested set-up that runs guests thousands of times slower than TCG.

use std::ffi::OsString;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::str::FromStr;

use crate::model::{MAX_PC_MODEL_MEM_MIB, ModelFiles, RAM_ID};

/// The default guest memory, MiB.
pub const DEFAULT_MEM_MIB: u32 = 256;
/// The default CPU model. `max` exposes everything TCG can emulate.
pub const DEFAULT_CPU: &str = "max";
/// The largest `-smp` value accepted: the most xAPIC IDs (QEMU needs interrupt remapping for more; the
/// appliance uses a handful of cores and keeps the rest parked, which the `kernel-smp72-q35` scenario checks).
pub const MAX_SMP: u32 = 255;
/// The I/O port of `isa-debug-exit`; the kernel writes 1 there on a fatal error.
pub const DEBUG_EXIT_IOBASE: u16 = 0xf4;

/// The emulated chipset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// i440FX + PIIX: no PCIe ECAM, so the kernel uses the legacy 0xCF8 configuration mechanism.
    Pc,
    /// Q35 + ICH9: PCIe with an MCFG table (ECAM).
    Q35,
}

impl Machine {
    /// The `-machine` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Machine::Pc => "pc",
            Machine::Q35 => "q35",
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Machine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pc" => Ok(Machine::Pc),
            "q35" => Ok(Machine::Q35),
            other => Err(format!("unknown machine `{other}` (expected `pc` or `q35`)")),
        }
    }
}

/// Where the mlx5 model's ivshmem function sits: on the first root bus (the default), or behind a PCI expander
/// bridge, a second root bus numbered [`EXPANDER_BUS`] that no bridge on bus 0 leads to, as a server's peer
/// host bridges (docs/reference/pci-peer-host-bridges.md). q35 gets `pxb-pcie` with a PCIe root port on it and
/// the device behind the port; `pc` gets `pxb` with the device on its bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelSlot {
    RootBus,
    Expander,
}

/// The expander's root bus number (`bus_nr=`).
pub const EXPANDER_BUS: u8 = 0x40;

/// A virtio-net NIC on QEMU's user-mode (slirp) network, with one TCP port forwarded from the host. The
/// device is `virtio-net-pci`, QEMU's transitional virtio-net (legacy and modern interfaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostFwd {
    /// Where QEMU listens on the host (127.0.0.1: this machine only).
    pub host_addr: Ipv4Addr,
    pub host_port: u16,
    /// The guest's port the connections are forwarded to (the control service's `port=`).
    pub guest_port: u16,
}

impl HostFwd {
    /// `127.0.0.1:host_port` → guest `guest_port`.
    pub fn localhost(host_port: u16, guest_port: u16) -> Self {
        HostFwd { host_addr: Ipv4Addr::LOCALHOST, host_port, guest_port }
    }

    /// The `-netdev` value.
    pub fn netdev(&self) -> String {
        format!("user,id=n0,hostfwd=tcp:{}:{}-:{}", self.host_addr, self.host_port, self.guest_port)
    }
}

/// A port of hub 0 that is a UDP socket: QEMU reads frames on `local` and sends them to `peer`, one Ethernet
/// frame per datagram (`-netdev socket,udp=PEER,localaddr=LOCAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubSocket {
    pub local: SocketAddrV4,
    pub peer: SocketAddrV4,
}

/// The hub of a boot whose control NIC is the mlx5 model's Ethernet port (docs/reference/platform.md, "A hub
/// of UDP ports"): one socket port for the model's wire and one for a client's RDMA frames, each with its own
/// pair of UDP addresses (`local`: QEMU's end; `peer`: the station's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelHub {
    /// The model binds `peer` (`--eth-udp PEER,LOCAL`).
    pub model: HubSocket,
    /// A client (leasectl) binds `peer` and sends to `local`.
    pub client: HubSocket,
}

impl ModelHub {
    /// Four UDP ports on 127.0.0.1 that were free when asked (nothing holds them until QEMU, the model and
    /// the client bind them).
    pub fn pick() -> std::io::Result<ModelHub> {
        let socks =
            (0..4).map(|_| std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))).collect::<Result<Vec<_>, _>>()?;
        let mut at = Vec::with_capacity(4);
        for s in &socks {
            at.push(SocketAddrV4::new(Ipv4Addr::LOCALHOST, s.local_addr()?.port()));
        }
        Ok(ModelHub { model: HubSocket { local: at[0], peer: at[1] }, client: HubSocket { local: at[2], peer: at[3] } })
    }

    /// The hub's socket ports, for [`QemuConfig::hub`].
    pub fn ports(&self) -> Vec<HubSocket> {
        vec![self.model, self.client]
    }

    /// The model's `--eth-udp` pair: (what it binds, where it sends).
    pub fn model_wire(&self) -> (SocketAddrV4, SocketAddrV4) {
        (self.model.peer, self.model.local)
    }
}

/// How the guest is booted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    /// QEMU's built-in multiboot1 loader (`-kernel`, SeaBIOS). The ELF must carry the a.out-kludge MB1 header.
    /// `append` becomes the multiboot command line (QEMU prefixes it with the kernel path).
    Kernel { elf: PathBuf, append: String },
    /// The GRUB ISO on SeaBIOS (`multiboot` in grub.cfg). Kernel arguments are baked into the ISO.
    BiosIso { iso: PathBuf },
    /// The GRUB ISO on OVMF (`multiboot2` in grub.cfg). `vars` must be a fresh, writable per-run copy of the
    /// OVMF vars template (see [`crate::firmware::Ovmf::fresh_vars`]).
    UefiIso { iso: PathBuf, code: PathBuf, vars: PathBuf },
}

impl Boot {
    /// A short name for messages and tables.
    pub fn label(&self) -> &'static str {
        match self {
            Boot::Kernel { .. } => "-kernel",
            Boot::BiosIso { .. } => "GRUB BIOS",
            Boot::UefiIso { .. } => "GRUB UEFI",
        }
    }
}

/// A complete QEMU invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuConfig {
    /// The QEMU binary (looked up in `PATH` when it has no slash).
    pub qemu: PathBuf,
    pub machine: Machine,
    /// The `-cpu` model.
    pub cpu: String,
    pub mem_mib: u32,
    pub smp: u32,
    pub boot: Boot,
    /// QEMU's user-mode network with a forwarded port, or none at all (`-nic none`).
    pub net: Option<HostFwd>,
    /// Whether the guest gets a virtio-net NIC on that network (the default; false: the network reaches the
    /// guest only through the hub's other ports, e.g. the model's Ethernet wire).
    pub virtio_net: bool,
    /// UDP socket ports joined with the user-mode network on hub 0 (none: no hub).
    pub hub: Vec<HubSocket>,
    /// The mlx5 model's shared files: guest RAM from the RAM file (`-machine ...,memory-backend=`) and the
    /// BAR file as `ivshmem-plain` (see [`crate::model`]).
    pub model: Option<ModelFiles>,
    /// Where the model's ivshmem function goes.
    pub model_slot: ModelSlot,
    /// COM1's output to this file instead of stdio, and COM2 on stdio: what the runner reads is then the
    /// second serial port (a server whose Serial-over-LAN is COM2; the kernel's `console=ttyS1`).
    pub com1_file: Option<PathBuf>,
    /// Extra arguments appended verbatim (e.g. `-device`, `-object`, `-netdev` pairs).
    pub extra: Vec<OsString>,
}

impl QemuConfig {
    /// A q35, one-CPU, 256 MiB configuration for `boot`.
    pub fn new(boot: Boot) -> Self {
        QemuConfig {
            qemu: PathBuf::from("qemu-system-x86_64"),
            machine: Machine::Q35,
            cpu: DEFAULT_CPU.to_string(),
            mem_mib: DEFAULT_MEM_MIB,
            smp: 1,
            boot,
            net: None,
            virtio_net: true,
            hub: Vec::new(),
            model: None,
            model_slot: ModelSlot::RootBus,
            com1_file: None,
            extra: Vec::new(),
        }
    }

    /// Adds `-device <spec>`.
    pub fn device(mut self, spec: &str) -> Self {
        self.extra.push("-device".into());
        self.extra.push(spec.into());
        self
    }

    /// Adds `-object <spec>`.
    pub fn object(mut self, spec: &str) -> Self {
        self.extra.push("-object".into());
        self.extra.push(spec.into());
        self
    }

    /// Checks the values QEMU would otherwise reject with a less helpful message.
    pub fn validate(&self) -> Result<(), String> {
        if self.smp == 0 || self.smp > MAX_SMP {
            return Err(format!("-smp must be between 1 and {MAX_SMP}, got {}", self.smp));
        }
        if self.mem_mib < 16 {
            return Err(format!("guest memory must be at least 16 MiB, got {}", self.mem_mib));
        }
        if self.cpu.is_empty() || self.cpu.contains(char::is_whitespace) {
            return Err(format!("bad CPU model `{}`", self.cpu));
        }
        if self.model.is_some() && self.machine == Machine::Pc && self.mem_mib > MAX_PC_MODEL_MEM_MIB {
            return Err(format!(
                "the mlx5 model supports at most {MAX_PC_MODEL_MEM_MIB} MiB of guest RAM on `pc` (got {}): it maps \
                 RAM above that as q35 does; use -machine q35 or --no-model",
                self.mem_mib
            ));
        }
        Ok(())
    }

    /// The argument vector (without the program name).
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(OsString::from(s));
        push("-machine");
        match &self.model {
            None => push(self.machine.as_str()),
            Some(_) => push(&format!("{},memory-backend={RAM_ID}", self.machine.as_str())),
        }
        push("-accel");
        push("tcg");
        push("-cpu");
        push(&self.cpu);
        push("-m");
        push(&self.mem_mib.to_string());
        push("-smp");
        push(&self.smp.to_string());
        push("-display");
        push("none");
        push("-no-reboot");
        if let Some(f) = &self.com1_file {
            push("-serial");
            push(&format!("file:{}", f.display()));
        }
        push("-serial");
        push("stdio");
        push("-device");
        push(&format!("isa-debug-exit,iobase={DEBUG_EXIT_IOBASE:#x},iosize=0x04"));
        match &self.net {
            Some(fwd) if self.hub.is_empty() && self.virtio_net => {
                push("-netdev");
                push(&fwd.netdev());
                push("-device");
                push("virtio-net-pci,netdev=n0");
            }
            net => {
                push("-nic");
                push("none");
                if let Some(fwd) = net {
                    push("-netdev");
                    push(&fwd.netdev());
                    push("-netdev");
                    push("hubport,id=hn0,hubid=0,netdev=n0");
                    if self.virtio_net {
                        push("-netdev");
                        push("hubport,id=hv0,hubid=0");
                        push("-device");
                        push("virtio-net-pci,netdev=hv0");
                    }
                }
                for (i, h) in self.hub.iter().enumerate() {
                    push("-netdev");
                    push(&format!("socket,id=s{i},udp={},localaddr={}", h.peer, h.local));
                    push("-netdev");
                    push(&format!("hubport,id=hs{i},hubid=0,netdev=s{i}"));
                }
            }
        }
        match &self.boot {
            Boot::Kernel { elf, append } => {
                a.push("-kernel".into());
                a.push(elf.clone().into_os_string());
                if !append.is_empty() {
                    a.push("-append".into());
                    a.push(append.into());
                }
            }
            Boot::BiosIso { iso } => {
                a.push("-cdrom".into());
                a.push(iso.clone().into_os_string());
                a.push("-boot".into());
                a.push("d".into());
            }
            Boot::UefiIso { iso, code, vars } => {
                a.push("-drive".into());
                a.push(pflash(0, true, code));
                a.push("-drive".into());
                a.push(pflash(1, false, vars));
                a.push("-cdrom".into());
                a.push(iso.clone().into_os_string());
                a.push("-boot".into());
                a.push("d".into());
            }
        }
        if let Some(m) = &self.model {
            a.push("-object".into());
            a.push(m.ram_object(self.mem_mib));
            a.push("-object".into());
            a.push(m.bar_object());
            let bus = match (self.model_slot, self.machine) {
                (ModelSlot::RootBus, _) => None,
                (ModelSlot::Expander, Machine::Q35) => {
                    a.push("-device".into());
                    a.push(format!("pxb-pcie,id=pxb1,bus_nr={EXPANDER_BUS:#x},bus=pcie.0").into());
                    a.push("-device".into());
                    a.push("pcie-root-port,id=rp1,bus=pxb1,chassis=1".into());
                    Some("rp1")
                }
                (ModelSlot::Expander, Machine::Pc) => {
                    a.push("-device".into());
                    a.push(format!("pxb,id=pxb1,bus_nr={EXPANDER_BUS:#x},bus=pci.0").into());
                    Some("pxb1")
                }
            };
            a.push("-device".into());
            a.push(match bus {
                Some(b) => format!("{},bus={b}", m.bar_device()).into(),
                None => m.bar_device().into(),
            });
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    /// The command line as one shell-like string, for logs.
    pub fn display(&self) -> String {
        let mut s = self.qemu.display().to_string();
        for arg in self.args() {
            let arg = arg.to_string_lossy();
            s.push(' ');
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
                s.push('\'');
                s.push_str(&arg.replace('\'', r"'\''"));
                s.push('\'');
            } else {
                s.push_str(&arg);
            }
        }
        s
    }
}

/// `if=pflash,format=raw,unit=N[,readonly=on],file=PATH`. QEMU's option parser treats `,` as a separator, so a
/// comma inside the path is doubled.
fn pflash(unit: u8, readonly: bool, file: &std::path::Path) -> OsString {
    let ro = if readonly { ",readonly=on" } else { "" };
    let mut s = OsString::from(format!("if=pflash,format=raw,unit={unit}{ro},file="));
    s.push(file.to_string_lossy().replace(',', ",,"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(c: &QemuConfig) -> Vec<String> {
        c.args().into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    fn has_pair(args: &[String], a: &str, b: &str) -> bool {
        args.windows(2).any(|w| w[0] == a && w[1] == b)
    }

    #[test]
    fn kernel_boot_has_base_and_append() {
        let c = QemuConfig::new(Boot::Kernel {
            elf: "target/leasebox/leasebox.elf".into(),
            append: "test=panic log=warn".into(),
        });
        let a = strings(&c);
        for (k, v) in [
            ("-machine", "q35"),
            ("-accel", "tcg"),
            ("-cpu", "max"),
            ("-m", "256"),
            ("-smp", "1"),
            ("-display", "none"),
            ("-serial", "stdio"),
            ("-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"),
            ("-nic", "none"),
            ("-kernel", "target/leasebox/leasebox.elf"),
            ("-append", "test=panic log=warn"),
        ] {
            assert!(has_pair(&a, k, v), "missing {k} {v} in {a:?}");
        }
        assert!(a.contains(&"-no-reboot".to_string()));
        assert!(!a.iter().any(|s| s.contains("kvm")));
    }

    #[test]
    fn model_behind_an_expander_and_com1_to_a_file() {
        let files =
            crate::model::ModelFiles { bar: "/dev/shm/bar".into(), bar_bytes: 1 << 26, ram: "/dev/shm/ram".into() };
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        c.model = Some(files.clone());
        c.model_slot = ModelSlot::Expander;
        c.com1_file = Some("/tmp/com1.log".into());
        let a = strings(&c);
        let pxb = a.iter().position(|s| s == "pxb-pcie,id=pxb1,bus_nr=0x40,bus=pcie.0").expect("pxb-pcie");
        let port = a.iter().position(|s| s == "pcie-root-port,id=rp1,bus=pxb1,chassis=1").expect("root port");
        let dev = a.iter().position(|s| s == &format!("{},bus=rp1", files_device(&files))).expect("device on rp1");
        assert!(pxb < port && port < dev, "{a:?}");
        // COM1 to the file first, then COM2 on stdio.
        let serial: Vec<&String> = a.windows(2).filter(|w| w[0] == "-serial").map(|w| &w[1]).collect();
        assert_eq!(serial, ["file:/tmp/com1.log", "stdio"]);

        c.machine = Machine::Pc;
        let a = strings(&c);
        assert!(has_pair(&a, "-device", "pxb,id=pxb1,bus_nr=0x40,bus=pci.0"), "{a:?}");
        assert!(has_pair(&a, "-device", &format!("{},bus=pxb1", files_device(&files))), "{a:?}");
        c.model_slot = ModelSlot::RootBus;
        c.com1_file = None;
        let a = strings(&c);
        assert!(!a.iter().any(|s| s.contains("pxb")));
        assert!(has_pair(&a, "-device", &files_device(&files)));
        assert_eq!(a.iter().filter(|s| *s == "-serial").count(), 1);
    }

    fn files_device(f: &crate::model::ModelFiles) -> String {
        f.bar_device()
    }

    #[test]
    fn empty_append_is_omitted() {
        let c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        assert!(!strings(&c).contains(&"-append".to_string()));
    }

    #[test]
    fn bios_iso_boots_from_cdrom() {
        let mut c = QemuConfig::new(Boot::BiosIso { iso: "x.iso".into() });
        c.machine = Machine::Pc;
        c.smp = 3;
        c.mem_mib = 512;
        let a = strings(&c);
        assert!(has_pair(&a, "-cdrom", "x.iso"));
        assert!(has_pair(&a, "-boot", "d"));
        assert!(has_pair(&a, "-machine", "pc"));
        assert!(has_pair(&a, "-smp", "3"));
        assert!(has_pair(&a, "-m", "512"));
        assert!(!a.contains(&"-kernel".to_string()));
    }

    #[test]
    fn uefi_iso_has_two_pflash_drives() {
        let c = QemuConfig::new(Boot::UefiIso {
            iso: "x.iso".into(),
            code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            vars: "/t/vars,1.fd".into(),
        });
        let a = strings(&c);
        assert!(has_pair(&a, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert!(has_pair(&a, "-drive", "if=pflash,format=raw,unit=1,file=/t/vars,,1.fd"));
        assert!(has_pair(&a, "-cdrom", "x.iso"));
    }

    #[test]
    fn extra_devices_come_last() {
        let c = QemuConfig::new(Boot::BiosIso { iso: "x.iso".into() })
            .object("memory-backend-ram,id=hm,size=1M")
            .device("ivshmem-plain,memdev=hm");
        let a = strings(&c);
        let n = a.len();
        assert_eq!(&a[n - 4..], ["-object", "memory-backend-ram,id=hm,size=1M", "-device", "ivshmem-plain,memdev=hm"]);
    }

    #[test]
    fn net_forwards_the_control_port_instead_of_no_nic() {
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        c.net = Some(HostFwd::localhost(7471, 7470));
        let a = strings(&c);
        assert!(has_pair(&a, "-netdev", "user,id=n0,hostfwd=tcp:127.0.0.1:7471-:7470"));
        assert!(has_pair(&a, "-device", "virtio-net-pci,netdev=n0"));
        assert!(!has_pair(&a, "-nic", "none"));
        c.net = None;
        assert!(has_pair(&strings(&c), "-nic", "none"));
    }

    #[test]
    fn hub_joins_the_user_network_and_udp_ports() {
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        c.net = Some(HostFwd::localhost(7471, 7470));
        c.virtio_net = false;
        let sock = |l: u16, p: u16| HubSocket {
            local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, l),
            peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, p),
        };
        c.hub = vec![sock(5001, 5002), sock(5003, 5004)];
        let a = strings(&c);
        assert!(has_pair(&a, "-nic", "none"), "no NIC at all: {a:?}");
        assert!(!a.iter().any(|x| x.contains("virtio-net")));
        assert!(has_pair(&a, "-netdev", "user,id=n0,hostfwd=tcp:127.0.0.1:7471-:7470"));
        assert!(has_pair(&a, "-netdev", "hubport,id=hn0,hubid=0,netdev=n0"));
        assert!(has_pair(&a, "-netdev", "socket,id=s0,udp=127.0.0.1:5002,localaddr=127.0.0.1:5001"));
        assert!(has_pair(&a, "-netdev", "hubport,id=hs0,hubid=0,netdev=s0"));
        assert!(has_pair(&a, "-netdev", "socket,id=s1,udp=127.0.0.1:5004,localaddr=127.0.0.1:5003"));
        assert!(has_pair(&a, "-netdev", "hubport,id=hs1,hubid=0,netdev=s1"));
        // virtio-net as well: one more hub port, not the user network directly.
        c.virtio_net = true;
        let a = strings(&c);
        assert!(has_pair(&a, "-netdev", "hubport,id=hv0,hubid=0"));
        assert!(has_pair(&a, "-device", "virtio-net-pci,netdev=hv0"));
    }

    #[test]
    fn model_files_back_ram_and_an_ivshmem_bar() {
        let mut c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: String::new() });
        c.mem_mib = 512;
        c.model = Some(ModelFiles { bar: "/dev/shm/b.shm".into(), bar_bytes: 32 << 20, ram: "/dev/shm/r.shm".into() });
        let a = strings(&c);
        assert!(has_pair(&a, "-machine", "q35,memory-backend=lbxram"));
        assert!(has_pair(&a, "-m", "512"));
        assert!(has_pair(&a, "-object", "memory-backend-file,id=lbxram,size=512M,share=on,mem-path=/dev/shm/r.shm"));
        assert!(has_pair(
            &a,
            "-object",
            "memory-backend-file,id=mlx5bar,size=33554432,share=on,mem-path=/dev/shm/b.shm"
        ));
        assert!(has_pair(&a, "-device", "ivshmem-plain,memdev=mlx5bar"));
        assert!(c.validate().is_ok());
        // q35 puts RAM beyond 2 GiB at 4 GiB, as the model expects; `pc` would split it elsewhere.
        c.mem_mib = 6144;
        assert!(c.validate().is_ok());
        c.machine = Machine::Pc;
        assert!(c.validate().unwrap_err().contains("-machine q35"));
        c.mem_mib = 2048;
        assert!(c.validate().is_ok());
        c.machine = Machine::Q35;
        c.model = None;
        assert!(c.validate().is_ok());
        assert!(has_pair(&strings(&c), "-machine", "q35"));
    }

    #[test]
    fn machine_parse() {
        assert_eq!("pc".parse::<Machine>(), Ok(Machine::Pc));
        assert_eq!("q35".parse::<Machine>(), Ok(Machine::Q35));
        assert!("microvm".parse::<Machine>().unwrap_err().contains("microvm"));
    }

    #[test]
    fn validate_rejects_bad_values() {
        let mut c = QemuConfig::new(Boot::BiosIso { iso: "x.iso".into() });
        assert!(c.validate().is_ok());
        c.smp = 0;
        assert!(c.validate().is_err());
        c.smp = 2;
        c.mem_mib = 1;
        assert!(c.validate().is_err());
        c.mem_mib = 256;
        c.cpu = "max x".into();
        assert!(c.validate().is_err());
    }

    #[test]
    fn display_quotes_spaces() {
        let c = QemuConfig::new(Boot::Kernel { elf: "k".into(), append: "a b".into() });
        assert!(c.display().ends_with("-append 'a b'"));
    }
}
