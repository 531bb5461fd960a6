//! The HCA's state, which the commands act on ([`Hca`]: function state, capabilities, pages, objects), and the
//! model's configuration. The device that polls the BAR and runs commands against it is [`crate::model`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::caps::{Caps, CapsProfile, cmd_hca_cap};
use crate::flow::FlowSteering;
use crate::mkey::MkeyInfo;
use crate::pages::PageLedger;
use crate::qp::QpTable;

/// [`ModelConfig::link_up_delay`] by default: one second of link training (a real ConnectX-5 takes seconds).
pub const DEFAULT_LINK_UP_DELAY: Duration = Duration::from_millis(1000);

/// Model configuration; every default's source is in `docs/hca-model.md`.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// `initializing` (BAR0 0x1fc bit 31) clears this long after [`Model::new`].
    pub init_delay: Duration,
    /// (major, minor, subminor).
    pub fw_rev: (u16, u16, u16),
    /// Command trace file (also `MLX5_MODEL_TRACE`).
    pub trace: Option<PathBuf>,
    /// Health counter (BAR0 0x1010) period.
    pub health_period: Duration,
    /// Advertised in `cmd_exec_to` / `cmd_q_init_to`.
    pub cmd_exec_to: Duration,
    pub cmd_q_init_to: Duration,
    /// QUERY_PAGES demand for BOOT, INIT and REGULAR.
    pub boot_pages: u32,
    pub init_pages: u32,
    pub regular_pages: u32,
    /// Lowest UAR index (= BAR0 4 KiB page number) ALLOC_UAR hands out.
    pub first_uar: u32,
    /// The port's permanent MAC (NIC vport context; GUIDs and the default GID derive from it).
    pub mac: [u8; 6],
    /// Runtime PAGE_REQUEST (`crate::events`); `None` = never.
    pub page_request: Option<crate::events::PageRequest>,
    /// Firmware time: how long each command stays HW-owned after its doorbell, other slots running meanwhile
    /// (`crate::timing`; the trace's per-opcode latencies by default, [`ModelConfig::instant`] for none).
    pub timing: crate::timing::Timing,
    /// Which HW-owned entries a doorbell runs (`crate::model::Doorbells`; by default what the BAR allows).
    pub doorbells: crate::model::Doorbells,
    /// The link comes up this long after the port is administratively up (at INIT_HCA, or a PAOS write of
    /// `admin_status` up), announced by a PORT_CHANGE (ACTIVE) event; zero: at once. Real link training takes
    /// seconds; the default, [`DEFAULT_LINK_UP_DELAY`], keeps a QEMU boot short (docs/hca-model.md).
    pub link_up_delay: Duration,
    /// The port starts administratively down (`--admin-down`): the link stays down until the driver writes
    /// PAOS `admin_status` up (Linux `mlx5_set_port_admin_status`, on netdev open), then trains. A VF may not
    /// write PAOS: its port follows the PF, which in this model never brings it up, so a VF with this set
    /// keeps a down link (docs/hca-model.md, "Events and the port").
    pub admin_down: bool,
    /// The NIC vport context's `min_wqe_inline_mode` (the Ethernet caps report `wqe_inline_mode` =
    /// VPORT_CONTEXT): 1 = L2 (`MLX5_INLINE_MODE_L2`).
    pub min_wqe_inline_mode: u8,
    /// The function starts as a previous owner left it (a VM rebooted with the card live and no function
    /// reset): enabled, ISSI 1, INIT_HCA done, no objects and no pages. ENABLE_HCA is then refused
    /// (BAD_SYS_STATE) until TEARDOWN_HCA and DISABLE_HCA bring it down (docs/hca-model.md, "Configuration").
    pub left_initialized: bool,
    /// The model plays a ConnectX-5 VF (`--vf`): the signature names device 0x1018, the general caps say
    /// `vport_group_manager` 0 and a non-zero `vhca_id`, and ACCESS_REGISTER refuses HOST_ENDIANNESS and
    /// writes of PAOS and PMTU (docs/hca-model.md, "VF personality").
    pub vf: bool,
    /// With `vf`: ACCESS_REGISTER also refuses *reads* of PMTU and PAOS (`--vf-port-reads-refused`), as a VF's
    /// firmware may (Linux's Ethernet driver falls back to QUERY_VPORT_STATE and the vport MTU there;
    /// docs/hca-model.md, "VF personality"). Ignored on the PF.
    pub vf_port_reads_refused: bool,
    /// The capability blocks reported (`--caps`): a ConnectX-5 by default, the reference trace's ConnectX-4
    /// for the trace replay (docs/hca-model.md, "The ConnectX-5 profile").
    pub caps: CapsProfile,
    /// Plays firmware that reports `umr_modify_entity_size_disabled` = 1 (`--umr-entity-size-disabled`): a UMR
    /// whose mask changes the page size completes in error (docs/hca-model.md, "UMR").
    pub umr_entity_size_disabled: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            init_delay: Duration::from_millis(50),
            fw_rev: (16, 35, 4030),
            trace: None,
            health_period: Duration::from_secs(1),
            cmd_exec_to: Duration::from_secs(60),
            cmd_q_init_to: Duration::from_secs(2),
            boot_pages: 6,
            init_pages: 0x3244,
            regular_pages: 0,
            first_uar: 0x10,
            mac: [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01],
            page_request: None,
            timing: crate::timing::Timing::firmware(),
            doorbells: crate::model::Doorbells::Auto,
            link_up_delay: DEFAULT_LINK_UP_DELAY,
            admin_down: false,
            min_wqe_inline_mode: crate::eth::frame::inline_mode::L2,
            left_initialized: false,
            vf: false,
            vf_port_reads_refused: false,
            caps: CapsProfile::ConnectX5,
            umr_entity_size_disabled: false,
        }
    }
}

impl ModelConfig {
    /// The defaults without firmware time: no command latency, `initializing` clear at once, the link up as
    /// soon as the port is administratively up (no link training). For tests that need speed, and for tests
    /// on the hosted virtual clock (the model's timers are real time).
    pub fn instant() -> ModelConfig {
        ModelConfig {
            init_delay: Duration::ZERO,
            timing: crate::timing::Timing::Zero,
            link_up_delay: Duration::ZERO,
            ..ModelConfig::default()
        }
    }
}

/// Function state (PRM: ENABLE_HCA → INIT_HCA → TEARDOWN_HCA → DISABLE_HCA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FnState {
    Disabled,
    Enabled,
    Initialized,
}

/// Everything the commands act on.
pub struct Hca {
    pub state: FnState,
    pub issi: u16,
    pub caps: Caps,
    pub pages: PageLedger,
    pub first_uar: u32,
    pub uars: BTreeSet<u32>,
    pub pds: BTreeSet<u32>,
    pub tds: BTreeSet<u32>,
    pub mkeys: BTreeMap<u32, MkeyInfo>,
    pub qps: QpTable,
    pub flow: FlowSteering,
    pub eqs: crate::eq::EqTable,
    pub cqs: crate::cq::CqTable,
    pub port: crate::port::Port,
    pub page_waits: crate::events::PageWaits,
    /// TIS, SQ, RQ, TIR and the Ethernet data path's counters (`crate::eth`).
    pub eth: crate::eth::Eth,
    /// Plays a VF (`ModelConfig::vf`).
    pub vf: bool,
    /// `ModelConfig::vf_port_reads_refused` on a VF.
    pub port_reads_refused: bool,
    /// The PCI command register's Bus Master Enable as the hosted rigs play it (`Model::set_bus_master`):
    /// cleared, the device makes no DMA at all — no command, queue or doorbell-record access, no received
    /// frame written, no RoCE request answered or executed. Over QEMU the model cannot see the ivshmem
    /// function's configuration space, so it stays set there (docs/hca-model.md).
    pub bus_master: bool,
    /// REG_UMR QPs and their send queues' bookkeeping (`crate::umr`).
    pub umr: crate::umr::UmrState,
}

impl Hca {
    pub fn new(cfg: &ModelConfig) -> Hca {
        let left = cfg.left_initialized;
        let mut caps = Caps::new(cfg.caps, cfg.vf);
        if cfg.umr_entity_size_disabled {
            for current in [false, true] {
                caps.set_field(
                    crate::caps::cap_type::GENERAL,
                    current,
                    cmd_hca_cap::UMR_MODIFY_ENTITY_SIZE_DISABLED,
                    1,
                );
            }
        }
        // The port's RoCE address table is as large as the caps say.
        let gids = caps.current(crate::caps::cap_type::ROCE, crate::caps::roce_cap::ROCE_ADDRESS_TABLE_SIZE) as usize;
        Hca {
            state: if left { FnState::Initialized } else { FnState::Disabled },
            issi: if left { 1 } else { 0 },
            caps,
            pages: PageLedger::new(cfg.boot_pages, cfg.init_pages, cfg.regular_pages),
            first_uar: cfg.first_uar,
            uars: BTreeSet::new(),
            pds: BTreeSet::new(),
            tds: BTreeSet::new(),
            mkeys: BTreeMap::new(),
            qps: QpTable::default(),
            flow: FlowSteering::default(),
            eqs: crate::eq::EqTable::default(),
            cqs: crate::cq::CqTable::default(),
            port: crate::port::Port {
                // A VF sits behind its PF's e-switch (legacy SR-IOV mode).
                eswitch: cfg.vf,
                ..crate::port::Port::new(cfg.mac, gids).with_link(
                    cfg.link_up_delay,
                    cfg.admin_down,
                    cfg.min_wqe_inline_mode,
                )
            },
            page_waits: crate::events::PageWaits::new(cfg.page_request),
            eth: crate::eth::Eth::default(),
            vf: cfg.vf,
            port_reads_refused: cfg.vf && cfg.vf_port_reads_refused,
            bus_master: true,
            umr: crate::umr::UmrState { latency: cfg.timing.umr_latency(), ..Default::default() },
        }
    }

    /// TEARDOWN_HCA: every object goes; pages stay the device's until taken back.
    pub fn teardown(&mut self) {
        self.uars.clear();
        self.pds.clear();
        self.tds.clear();
        self.mkeys.clear();
        self.qps.clear();
        self.umr.clear();
        self.eth.clear();
        self.flow.clear();
        self.cqs.clear();
        self.eqs.clear();
        self.state = FnState::Enabled;
    }

    /// DISABLE_HCA: back to reset state.
    pub fn disable(&mut self) {
        self.teardown();
        // The vport context's address list goes with the function.
        self.port.uc_list.clear();
        self.pages.release_all();
        self.issi = 0;
        self.state = FnState::Disabled;
    }

    /// Command-interface checksums are enforced when the current `cmdif_checksum` is 3 (the selftest's
    /// "enabled"; Linux sets 0).
    pub fn checksums(&self) -> bool {
        self.caps.general(cmd_hca_cap::CMDIF_CHECKSUM) == 3
    }

    /// `per_protocol_networking_offload_caps.wqe_inline_mode` (bit 0x12, 2 bits) of the current Ethernet
    /// offloads block: 0 L2, 1 VPORT_CONTEXT, 2 NOT_REQUIRED (`MLX5_CAP_INLINE_MODE_*`).
    pub fn eth_inline_cap(&self) -> u32 {
        self.caps
            .block(crate::caps::cap_type::ETHERNET_OFFLOADS, true)
            .map_or(0, |b| crate::ifc::get(b, crate::ifc::Field::new(0x12, 2)))
    }
}
