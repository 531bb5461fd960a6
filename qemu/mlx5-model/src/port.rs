//! The one RoCE port and its NIC vport: what PAOS and PMTU (ACCESS_REGISTER; `mlx5_ifc.h` `paos_reg`,
//! `pmtu_reg`; docs/reference/mlx5.md §e.6), QUERY/MODIFY_NIC_VPORT_CONTEXT (`nic_vport_context`) and the RoCE address
//! table (QUERY/SET_ROCE_ADDRESS, `roce_addr_layout`; QUERY_HCA_VPORT_GID) report, kept consistent with one MAC.
//! Defaults and their reasons are in `docs/hca-model.md` ("Events and the port").

use std::time::{Duration, Instant};

use crate::eq::{event_type, port_change, port_change_data};
use crate::hca::Hca;
use crate::mem::Memory;

/// PAOS `admin_status` / `oper_status` (`driver.h:231-232`).
pub const PORT_UP: u8 = 1;
pub const PORT_DOWN: u8 = 2;

/// Ethernet MTUs as PMTU counts them (Linux `MLX5E_SW2HW_MTU`: the software
/// MTU + 14 (Ethernet) + 4 (VLAN) + 4 (FCS)).
pub const DEFAULT_HW_MTU: u16 = 1500 + 22;
/// Largest PMTU `max_mtu`: a ConnectX-5 reports a software `maxmtu` of 9978 under Linux = 10000 − 22.
pub const MAX_HW_MTU: u16 = 10000;

/// `roce_addr_layout` (0x20 bytes) `roce_version` values (`mlx5_ifc.h` `MLX5_ROCE_VERSION_*`).
pub const ROCE_VERSION_2: u8 = 2;
/// `roce_l3_type` (`MLX5_ROCE_L3_TYPE_*`).
pub const ROCE_L3_TYPE_IPV6: u8 = 1;
pub const ROCE_L3_TYPE_IPV4: u8 = 0;

/// One RoCE address table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceAddr {
    pub gid: [u8; 16],
    pub mac: [u8; 6],
    pub vlan_valid: bool,
    pub vlan_id: u16,
    pub l3_type: u8,
    pub version: u8,
}

impl RoceAddr {
    pub fn is_empty(&self) -> bool {
        *self == RoceAddr::default()
    }
}

pub struct Port {
    pub mac: [u8; 6],
    pub admin_status: u8,
    pub oper_status: u8,
    /// PAOS `e`: 0 no events, 1 events, 2 one event then 0.
    pub event_mode: u8,
    pub max_mtu: u16,
    pub admin_mtu: u16,
    pub oper_mtu: u16,
    pub roce_en: bool,
    /// `nic_vport_context.mtu`.
    pub vport_mtu: u16,
    pub roce_addrs: Vec<RoceAddr>,
    /// `nic_vport_context.min_wqe_inline_mode` (`MLX5_INLINE_MODE_*`).
    pub min_wqe_inline_mode: u8,
    /// How long link training takes after the port goes administratively up (`ModelConfig::link_up_delay`).
    pub link_delay: Duration,
    /// When the link comes up (training in progress).
    pub link_due: Option<Instant>,
    /// A legacy-mode e-switch stands between the wire and this function (the VF personality): a unicast frame
    /// reaches the function only when its destination MAC is in [`Port::uc_list`] ([`Port::eswitch_admits`]).
    pub eswitch: bool,
    /// The NIC vport context's current unicast address list (`current_uc_mac_address[]`), as the function
    /// last wrote it (MODIFY_NIC_VPORT_CONTEXT `addresses_list`, `allowed_list_type` UC).
    pub uc_list: Vec<[u8; 6]>,
}

/// EUI-64 from a MAC (flip the universal/local bit, insert ff:fe): the node and port GUIDs.
pub fn eui64(mac: [u8; 6]) -> [u8; 8] {
    [mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]
}

/// The IB path MTU code (1 = 256 … 5 = 4096; 0 = none) a RoCE port of `oper_mtu` bytes (PMTU, L2 included)
/// carries: Linux `iboe_get_mtu` (`include/rdma/ib_addr.h`) over the netdev MTU (`oper_mtu` − 22,
/// `MLX5E_HW2SW_MTU`), which takes GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 bytes off.
pub fn ib_mtu(oper_mtu: u16) -> u32 {
    let room = i32::from(oper_mtu) - 22 - (40 + 8 + 12 + 4 + 28 + 4);
    (1..=5u32).rev().find(|&c| (128i32 << c) <= room).unwrap_or(0)
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
pub fn gid_ipv4(gid: &[u8; 16]) -> Option<[u8; 4]> {
    (gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff]).then(|| [gid[12], gid[13], gid[14], gid[15]])
}

impl RoceAddr {
    /// A valid RoCEv2 entry for an IPv4 destination `ip`: written, version 2, L3 type IPv4, that address.
    pub fn is_v2_ipv4(&self, ip: [u8; 4]) -> bool {
        !self.is_empty()
            && self.version == ROCE_VERSION_2
            && self.l3_type == ROCE_L3_TYPE_IPV4
            && gid_ipv4(&self.gid) == Some(ip)
    }
}

impl Port {
    /// Does the RoCE engine take a frame to `eth_dst` / `ip_dst`? Only while the port is up (PAOS
    /// `admin_status` and `oper_status` both up: a port taken down answers and executes nothing, on the
    /// Ethernet wire and on the `--udp` cable alike; docs/hca-model.md, "The port's state and the RoCE
    /// responder"), with `roce_en` set on the vport, to the port's MAC, and to the IPv4 address of a valid RoCEv2
    /// GID entry; anything else is dropped.
    pub fn takes_roce(&self, eth_dst: [u8; 6], ip_dst: [u8; 4]) -> bool {
        self.admin_status == PORT_UP
            && self.oper_status == PORT_UP
            && self.roce_en
            && eth_dst == self.mac
            && self.eswitch_admits(eth_dst)
            && self.roce_addrs.iter().any(|e| e.is_v2_ipv4(ip_dst))
    }

    /// The port's RoCE path MTU code ([`ib_mtu`] of the operational MTU).
    pub fn ib_mtu(&self) -> u32 {
        ib_mtu(self.oper_mtu)
    }

    /// A port that is up at `DEFAULT_HW_MTU`, RoCE disabled in the vport until the driver enables it, and an
    /// empty RoCE address table: firmware holds no GID until the driver writes one (SET_ROCE_ADDRESS; Linux
    /// `mlx5_ib` writes even the default link-local GIDs itself through `set_roce_addr`).
    pub fn new(mac: [u8; 6], table_size: usize) -> Port {
        let roce_addrs = vec![RoceAddr::default(); table_size];
        Port {
            mac,
            admin_status: PORT_UP,
            oper_status: PORT_UP,
            event_mode: 1,
            max_mtu: MAX_HW_MTU,
            admin_mtu: DEFAULT_HW_MTU,
            oper_mtu: DEFAULT_HW_MTU,
            roce_en: false,
            vport_mtu: DEFAULT_HW_MTU,
            roce_addrs,
            min_wqe_inline_mode: crate::eth::frame::inline_mode::L2,
            link_delay: Duration::ZERO,
            link_due: None,
            eswitch: false,
            uc_list: Vec::new(),
        }
    }

    /// Whether the e-switch forwards a frame for `eth_dst` to this function: always without an e-switch;
    /// behind one (legacy SR-IOV mode, Linux `eswitch.c`: the FDB holds one rule per address of a vport's
    /// unicast list) a unicast destination must be in [`Port::uc_list`]. Multicast and broadcast (I/G bit
    /// set) pass: the model keeps no multicast list (docs/hca-model.md, "VF personality").
    pub fn eswitch_admits(&self, eth_dst: [u8; 6]) -> bool {
        !self.eswitch || eth_dst[0] & 1 == 1 || self.uc_list.contains(&eth_dst)
    }

    /// Link training time, the administrative state at power-up and the vport's minimal inline mode. With a
    /// delay the link starts down and trains from INIT_HCA ([`start_link`]); administratively down, it stays
    /// down until a PAOS write brings it up.
    pub fn with_link(mut self, delay: Duration, admin_down: bool, min_wqe_inline_mode: u8) -> Port {
        self.link_delay = delay;
        self.min_wqe_inline_mode = min_wqe_inline_mode;
        if admin_down {
            self.admin_status = PORT_DOWN;
        }
        if admin_down || !delay.is_zero() {
            self.oper_status = PORT_DOWN;
        }
        self
    }
}

/// The operational state changes to `status`: a PORT_CHANGE EQE (sub-type ACTIVE or DOWN, port 1) goes to the
/// EQs subscribed to it when PAOS `e` asks for events (`e` = 2: this one, then no more).
pub fn set_oper(hca: &mut Hca, ram: &dyn Memory, status: u8) {
    let p = &mut hca.port;
    if p.oper_status == status {
        return;
    }
    p.oper_status = status;
    if p.event_mode != 0 {
        let sub = if status == PORT_UP { port_change::ACTIVE } else { port_change::DOWN };
        if p.event_mode == 2 {
            p.event_mode = 0;
        }
        hca.eqs.raise(ram, event_type::PORT_CHANGE, sub, &port_change_data(1));
    }
}

/// The port is administratively up (INIT_HCA with `admin_status` up, or a PAOS write): the link comes up at
/// once when there is no training delay, otherwise after it ([`tick`]).
pub fn start_link(hca: &mut Hca, ram: &dyn Memory, now: Instant) {
    if hca.port.admin_status != PORT_UP || hca.port.oper_status == PORT_UP {
        return;
    }
    if hca.port.link_delay.is_zero() {
        set_oper(hca, ram, PORT_UP);
    } else if hca.port.link_due.is_none() {
        hca.port.link_due = Some(now + hca.port.link_delay);
    }
}

/// Administratively down: the link drops at once and training stops.
pub fn stop_link(hca: &mut Hca, ram: &dyn Memory) {
    hca.port.link_due = None;
    set_oper(hca, ram, PORT_DOWN);
}

/// Link training finished? Returns true when the link came up now.
pub fn tick(hca: &mut Hca, ram: &dyn Memory, now: Instant) -> bool {
    match hca.port.link_due {
        Some(due) if now >= due => {
            hca.port.link_due = None;
            if hca.port.admin_status == PORT_UP {
                set_oper(hca, ram, PORT_UP);
                return true;
            }
            false
        }
        _ => false,
    }
}
