//! The driver as one object: bring-up in Linux mlx5_core's order (docs/reference/mlx5.md §b.2), the synchronous `exec`
//! used by bring-up, tests and the one-CPU layout, teardown in reverse (docs/reference/mlx5.md §b.4), and the split
//! into engines for dedicated cores. Every wait has a deadline; every failure names its step and, for commands, opcode,
//! status and syndrome.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::fmt;

use crate::cmdq::{CmdQueue, Completion, SetupError};
use crate::command::{CmdError, Command, ErrorKind, Output};
use crate::engine::{self, Client, CommandEngine, Event, EventEngine, PageRequest};
use crate::eq::EventRing;
use crate::handles::{Eqn, UarPage};
use crate::health::Health;
use crate::ifc;
use crate::ifc::init::{CapMode, MLX5_CAP_GENERAL, PagesKind, RegOp};
use crate::initseg::{self, FwRev, Timeouts};
use crate::platform::{Deadline, Platform};

/// The EQ's subscriptions: Linux's async set (`MLX5_ASYNC_EVENT_MASK`) plus page requests; never command
/// completions (the queue is polled) and never completion events (CQs are polled, never armed).
pub const EQ_EVENTS: u64 = ifc::eq::ASYNC_EVENT_MASK | ifc::eq::event_bit(ifc::eq::MLX5_EVENT_TYPE_PAGE_REQUEST);

/// Linux 6.12's async EQ size: `order_base_2(MLX5_NUM_ASYNC_EQE + MLX5_NUM_SPARE_EQE)`, with 0x1000 and 0x80
/// entries: 13 (8192 entries, 512 KiB). Our one EQ takes what Linux's async and page EQs take; a mass revoke
/// with clients still writing produces one async event per QP at most (errors), well below this while the
/// event engine keeps consuming.
pub const ASYNC_EQ_LOG_SIZE: u32 = 13;

/// Command status BAD_SYS_STATE (`MLX5_CMD_STAT_BAD_SYS_STATE_ERR`).
const STATUS_BAD_SYS_STATE: u8 = 0x04;

/// Bring-up choices.
#[derive(Clone, Debug)]
pub struct Config {
    /// Part name for reports (from the PCI device id).
    pub part: &'static str,
    /// The function is a VF (the probe's `Part::vf`, from the PCI device id, as Linux `mlx5_core_is_pf`):
    /// bring-up skips what only the PF may do (HOST_ENDIANNESS; the port registers' writes in `crate::eth`).
    pub vf: bool,
    /// Bound on the first wait for `initializing` (Linux FW_PRE_INIT: 120 s).
    pub pre_init_timeout_ms: u64,
    /// How often that wait reports that it is still waiting (Linux: every 20 s).
    pub pre_init_report_ms: u64,
    /// Overrides the command timeout (default: `cmd_exec_to`, else Linux's 60 s).
    pub cmd_timeout_ms: Option<u64>,
    /// Health poll period (Linux: 2 s).
    pub health_interval_ms: u64,
    /// log2 of the async/page EQ's entries, bounded by `cmd_hca_cap.log_max_eq_sz` at bring-up (default
    /// [`ASYNC_EQ_LOG_SIZE`], as Linux sizes its async EQ).
    pub log_eq_size: u32,
    /// After bring-up, wait up to this long for the port's link (PAOS `oper_status` up); 0 = do not wait, as
    /// Linux does not. Link training takes seconds on a ConnectX-5; a link still down then is not an error
    /// (`HcaInfo::port` says Down, and PORT_CHANGE reports it when it comes up).
    pub link_wait_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            part: "ConnectX",
            vf: false,
            pre_init_timeout_ms: initseg::FW_PRE_INIT_TIMEOUT_MS,
            pre_init_report_ms: initseg::FW_PRE_INIT_WARN_MS,
            cmd_timeout_ms: None,
            health_interval_ms: initseg::HEALTH_POLL_INTERVAL_MS,
            log_eq_size: ASYNC_EQ_LOG_SIZE,
            link_wait_ms: 0,
        }
    }
}

/// Port state (PAOS `oper_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    Down,
    Active,
    Unknown(u8),
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Down => f.write_str("Down"),
            PortState::Active => f.write_str("Active"),
            PortState::Unknown(v) => write!(f, "Unknown({v})"),
        }
    }
}

/// What bring-up learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaInfo {
    pub part: &'static str,
    /// Brought up as a VF (`Config::vf`).
    pub vf: bool,
    pub fw: FwRev,
    pub timeouts: Timeouts,
    pub issi: u16,
    pub boot_pages: i32,
    pub init_pages: i32,
    pub uar: UarPage,
    pub eqn: Eqn,
    pub mac: [u8; 6],
    pub mtu: u16,
    pub port: PortState,
    pub roce: bool,
    pub caps: ifc::init::GeneralCaps,
    /// log2 of the EQ's entries (the configured size bounded by `log_max_eq_sz`).
    pub log_eq_size: u32,
    /// How long the pre-init wait waited, and how many times it reported that it was still waiting.
    pub pre_init_waited_ms: u64,
    pub pre_init_reports: u32,
    /// ENABLE_HCA found the function still enabled by a previous owner, and bring-up brought it down first.
    pub previous_owner: bool,
    /// The VF's firmware refused the PMTU read: `mtu` is the vport context's, and `port` the vport state when
    /// PAOS is refused as well (`crate::eth::port_mtu`, `crate::eth::query_port_state`).
    pub port_regs_refused: bool,
    /// The QP context values the caps dictate (`log_msg_max`, read-atomic bounds, `ts_format`,
    /// `user_index`, atomic mode).
    pub qp: ifc::qp::QpCaps,
    pub bring_up_ns: u64,
}

/// The step bring-up stopped at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BringUpError {
    /// `initializing` still set after the deadline.
    Initializing {
        waited_ms: u64,
    },
    CmdQueue(SetupError),
    Command {
        step: &'static str,
        error: CmdError,
    },
    NoDma {
        step: &'static str,
    },
    /// A VF whose permanent MAC address is 00:00:00:00:00:00: the host administrator has not given it one, and
    /// behind the e-switch it would receive nothing.
    VfWithoutMac,
}

impl fmt::Display for BringUpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BringUpError::Initializing { waited_ms } => write!(f, "firmware still initializing after {waited_ms} ms"),
            BringUpError::CmdQueue(e) => write!(f, "command queue: {e}"),
            BringUpError::Command { step, error } => write!(f, "{step}: {error}"),
            BringUpError::NoDma { step } => write!(f, "{step}: no DMA memory"),
            BringUpError::VfWithoutMac => f.write_str(
                "this VF has no MAC address (00:00:00:00:00:00): the e-switch would deliver it nothing; set one on \
                 the host with `ip link set <pf> vf <n> mac <mac>` and boot again",
            ),
        }
    }
}

pub struct Driver<P: Platform> {
    p: Arc<P>,
    pub cmd: CommandEngine<P>,
    pub events: EventEngine<P>,
    pub client: Client,
    pub info: HcaInfo,
    /// Completions `exec` saw for other tags (async users interleaved with `exec`).
    stash: Vec<Completion>,
    embedded_cpu: bool,
    pub(crate) mkey_variant: crate::handles::MkeyVariant,
}

fn wait<P: Platform + ?Sized>(p: &P, ms: u64, mut done: impl FnMut() -> bool) -> bool {
    let d = Deadline::after(p, ms);
    loop {
        if done() {
            return true;
        }
        if d.passed(p) {
            return done();
        }
        p.relax();
    }
}

/// Waits up to `ms` for `initializing` to clear, logging every `report_ms` how long is left (Linux
/// `wait_fw_init`'s warning). Returns whether it cleared and how many reports were made.
fn wait_reporting<P: Platform + ?Sized>(p: &P, ms: u64, report_ms: u64) -> (bool, u32) {
    let start = p.now_ns();
    let d = Deadline::after(p, ms);
    let mut next = Deadline::after(p, report_ms.max(1));
    let mut reports = 0;
    loop {
        if !initseg::initializing(p) {
            return (true, reports);
        }
        if d.passed(p) {
            return (!initseg::initializing(p), reports);
        }
        if report_ms > 0 && next.passed(p) {
            let waited = p.now_ns().saturating_sub(start) / 1_000_000;
            log::warn!(
                "mlx5: waiting for firmware initialization ({waited} ms so far), giving up in {} s",
                ms.saturating_sub(waited) / 1000
            );
            reports += 1;
            next = Deadline::after(p, report_ms);
        }
        p.relax();
    }
}

impl<P: Platform> Driver<P> {
    /// Brings the HCA up: pre-init wait, command queue, init wait, health, ENABLE_HCA, ISSI, boot pages,
    /// HOST_ENDIANNESS (PF only), capabilities, init pages, INIT_HCA, ALLOC_UAR, the async/page EQ, RoCE on the vport,
    /// then the port's MAC, GID, MTU and state.
    pub fn bring_up(p: Arc<P>, cfg: Config) -> Result<Driver<P>, BringUpError> {
        let t0 = p.now_ns();
        // 1. Wait for `initializing` to clear (FW_PRE_INIT), reporting while it waits as Linux `wait_fw_init`.
        let (cleared, pre_init_reports) = wait_reporting(p.as_ref(), cfg.pre_init_timeout_ms, cfg.pre_init_report_ms);
        if !cleared {
            return Err(BringUpError::Initializing { waited_ms: cfg.pre_init_timeout_ms });
        }
        let pre_init_waited_ms = p.now_ns().saturating_sub(t0) / 1_000_000;
        // 2. Command queue; 3. timeouts from the init segment; 4. the init wait.
        let timeouts = initseg::timeouts(p.as_ref());
        let cmd_ms = cfg.cmd_timeout_ms.unwrap_or(timeouts.cmd_ms);
        let q = CmdQueue::new(p.as_ref(), cmd_ms).map_err(BringUpError::CmdQueue)?;
        if !wait(p.as_ref(), timeouts.init_ms, || !initseg::initializing(p.as_ref())) {
            return Err(BringUpError::Initializing { waited_ms: timeouts.init_ms });
        }
        // 5. Health monitor.
        let health = Health::new(p.now_ns(), cfg.health_interval_ms);
        let (cmd, events, client) = engine::assemble(p.clone(), q, health);
        let mut d = Driver {
            p: p.clone(),
            cmd,
            events,
            client,
            info: HcaInfo {
                part: cfg.part,
                vf: cfg.vf,
                fw: initseg::fw_rev(p.as_ref()),
                pre_init_waited_ms,
                pre_init_reports,
                previous_owner: false,
                port_regs_refused: false,
                timeouts: Timeouts { cmd_ms, init_ms: timeouts.init_ms },
                issi: 0,
                boot_pages: 0,
                init_pages: 0,
                uar: UarPage(0),
                eqn: Eqn(0),
                mac: [0; 6],
                mtu: 0,
                port: PortState::Unknown(0),
                roce: false,
                caps: ifc::init::GeneralCaps::default(),
                log_eq_size: 0,
                qp: ifc::qp::QpCaps::default(),
                bring_up_ns: 0,
            },
            stash: Vec::new(),
            embedded_cpu: initseg::embedded_cpu(p.as_ref()),
            mkey_variant: crate::handles::MkeyVariant::default(),
        };
        let step = |step: &'static str| move |error| BringUpError::Command { step, error };
        // 6. ENABLE_HCA. Refused with BAD_SYS_STATE, the function is still enabled (or initialised) by a previous
        // owner — a VM rebooted with the card live and no function reset: bring it down first.
        match d.exec(ifc::init::enable_hca(d.embedded_cpu)) {
            Ok(_) => {}
            Err(e) if e.status() == Some(STATUS_BAD_SYS_STATE) => {
                log::warn!("mlx5: {e}: the function was left enabled by a previous owner; bringing it down first");
                d.bring_down_previous_owner().map_err(step("bringing down the previous owner's function"))?;
                d.info.previous_owner = true;
                d.exec(ifc::init::enable_hca(d.embedded_cpu)).map_err(step("ENABLE_HCA"))?;
            }
            Err(e) => return Err(step("ENABLE_HCA")(e)),
        }
        // 7. ISSI: 1 when the firmware supports it, else 0 (a failing QUERY_ISSI means ISSI 0, as Linux).
        match d.exec(ifc::init::query_issi()) {
            Ok(out) => {
                if ifc::init::parse_query_issi(&out).supports(1) {
                    d.exec(ifc::init::set_issi(1)).map_err(step("SET_ISSI"))?;
                    d.info.issi = 1;
                }
            }
            Err(e) if e.status().is_some() => {}
            Err(e) => return Err(step("QUERY_ISSI")(e)),
        }
        // 8. Boot pages.
        d.info.boot_pages = d.satisfy_pages(PagesKind::Boot).map_err(step("boot pages"))?;
        // 10. HOST_ENDIANNESS: little-endian host. PF only, as Linux `set_hca_ctrl` (`!mlx5_core_is_pf`
        // returns at once): a VF's firmware keeps the PF's setting and refuses the register.
        if !cfg.vf {
            let he = ifc::init::access_reg(RegOp::Write, ifc::init::MLX5_REG_HOST_ENDIANNESS, 0, &[0u8; 16]);
            d.exec(he).map_err(step("ACCESS_REG HOST_ENDIANNESS"))?;
        }
        // 11. Capabilities: general (max and current), then SET_HCA_CAP with what we use.
        let max =
            d.exec(ifc::init::query_hca_cap(MLX5_CAP_GENERAL, CapMode::Max)).map_err(step("QUERY_HCA_CAP max"))?;
        let max = ifc::init::GeneralCaps::parse(ifc::init::hca_cap_block(&max));
        let cur =
            d.exec(ifc::init::query_hca_cap(MLX5_CAP_GENERAL, CapMode::Cur)).map_err(step("QUERY_HCA_CAP cur"))?;
        let block = ifc::init::general_caps_to_set(ifc::init::hca_cap_block(&cur), &max);
        d.exec(ifc::init::set_hca_cap(MLX5_CAP_GENERAL, &block)).map_err(step("SET_HCA_CAP"))?;
        // 11b. ATOMIC: host-endian 8-byte atomic responses where the HCA offers them (Linux
        // `handle_hca_cap_atomic`, after the general caps and before INIT_HCA).
        if ifc::init::GeneralCaps::parse(ifc::init::hca_cap_block(&cur)).atomic {
            let out = d
                .exec(ifc::init::query_hca_cap(ifc::init::MLX5_CAP_ATOMIC, CapMode::Cur))
                .map_err(step("QUERY_HCA_CAP ATOMIC"))?;
            let atomic = ifc::init::AtomicCaps::parse(ifc::init::hca_cap_block(&out));
            if let Some(b) = ifc::init::atomic_caps_to_set(true, &atomic) {
                d.exec(ifc::init::set_hca_cap(ifc::init::MLX5_CAP_ATOMIC, &b)).map_err(step("SET_HCA_CAP ATOMIC"))?;
            }
        }
        // 12. Init pages; 13. INIT_HCA.
        d.info.init_pages = d.satisfy_pages(PagesKind::Init).map_err(step("init pages"))?;
        d.exec(ifc::init::init_hca()).map_err(step("INIT_HCA"))?;
        // 14. Re-read the capabilities in force.
        let cur = d.exec(ifc::init::query_hca_cap(MLX5_CAP_GENERAL, CapMode::Cur)).map_err(step("QUERY_HCA_CAP"))?;
        d.info.caps = ifc::init::GeneralCaps::parse(ifc::init::hca_cap_block(&cur));
        d.info.roce = d.info.caps.roce;
        // The RoCE caps (timestamp format) and the ATOMIC caps (atomic mode) the QPs' contexts follow, read
        // only where the general caps announce them.
        let roce = if d.info.roce {
            let out = d
                .exec(ifc::init::query_hca_cap(ifc::init::MLX5_CAP_ROCE, CapMode::Cur))
                .map_err(step("QUERY_HCA_CAP ROCE"))?;
            Some(ifc::init::RoceCaps::parse(ifc::init::hca_cap_block(&out)))
        } else {
            None
        };
        let atomic = if d.info.caps.atomic {
            let out = d
                .exec(ifc::init::query_hca_cap(ifc::init::MLX5_CAP_ATOMIC, CapMode::Cur))
                .map_err(step("QUERY_HCA_CAP ATOMIC"))?;
            Some(ifc::init::AtomicCaps::parse(ifc::init::hca_cap_block(&out)))
        } else {
            None
        };
        d.info.qp = ifc::qp::QpCaps::from_caps(&d.info.caps, roce.as_ref(), atomic.as_ref());
        // 15. The driver's UAR page.
        let uar = d.exec(ifc::resources::alloc_uar()).map_err(step("ALLOC_UAR"))?;
        d.info.uar = ifc::resources::parse_alloc_uar(&uar);
        // 17. One EQ for async events and page requests, polled, never armed; as large as the caps allow.
        let log_eq_size = cfg.log_eq_size.min(d.info.caps.log_max_eq_sz.into());
        d.info.log_eq_size = log_eq_size;
        let mut ring = EventRing::alloc(p.as_ref(), log_eq_size).ok_or(BringUpError::NoDma { step: "EQ buffer" })?;
        let pages: Vec<u64> = ring.pages().collect();
        let create = ifc::eq::create_eq(&ifc::eq::EqParams {
            log_eq_size: log_eq_size as u8,
            uar_page: d.info.uar,
            intr: 0,
            log_page_size: 0,
            event_mask: EQ_EVENTS,
            pages: &pages,
        });
        let eqn = match d.exec(create) {
            Ok(out) => ifc::eq::parse_create_eq(&out),
            Err(e) => {
                ring.release(p.as_ref());
                return Err(step("CREATE_EQ")(e));
            }
        };
        ring.bind(eqn, d.info.uar);
        d.info.eqn = eqn;
        d.events.attach_eq(ring);
        // RoCE on the vport, then the port's identity and state.
        if d.info.roce {
            d.exec(ifc::vport::modify_nic_vport_roce_en(true)).map_err(step("MODIFY_NIC_VPORT_CONTEXT"))?;
        }
        let ctx = d.exec(ifc::vport::query_nic_vport_context()).map_err(step("QUERY_NIC_VPORT_CONTEXT"))?;
        d.info.mac = ifc::vport::query_nic_vport_context_out(&ctx).permanent_address;
        // The MAC into the vport's unicast address list, on every function, as Linux's Ethernet driver does
        // (`mlx5_modify_nic_vport_mac_list`, own address first): in legacy SR-IOV mode the e-switch forwards a
        // function only the unicast addresses in that list. A VF without an address cannot be reached at all.
        if d.info.mac == [0; 6] {
            if cfg.vf {
                return Err(BringUpError::VfWithoutMac);
            }
            log::warn!("mlx5: the port has no permanent MAC address; no unicast address published");
        } else {
            let mac = d.info.mac;
            d.exec(ifc::vport::modify_nic_vport_mac_list(&[mac]))
                .map_err(step("MODIFY_NIC_VPORT_CONTEXT addresses_list"))?;
        }
        // No GID is read here: firmware holds none until one is written, and the lease path writes the one its
        // QPs use and checks it back (`Driver::roce_gid`).
        // PMTU (a VF falls back to the vport MTU when its firmware refuses the register).
        let (pmtu, refused) = crate::eth::port_mtu_or_vport(&mut d, 1).map_err(step("ACCESS_REG PMTU"))?;
        d.info.mtu = pmtu.oper_mtu;
        d.info.port_regs_refused = refused;
        // The port administratively up, as Linux `mlx5e_open_locked` does through `mlx5_set_port_admin_status`
        // (the appliance has no netdev to open, and RoCE needs the link). PF only: a VF's port follows the PF,
        // and its firmware refuses the PAOS write.
        if !d.info.vf {
            crate::eth::port_admin_up(&mut d, 1).map_err(step("ACCESS_REG PAOS write"))?;
        }
        // Port state as Linux `mlx5_query_port_oper_status` reads it: PAOS `oper_status` (1 up, 2 down); a VF
        // whose firmware refuses PAOS asks QUERY_VPORT_STATE instead.
        d.info.port = crate::eth::query_port_state(&mut d, 1).map_err(step("ACCESS_REG PAOS"))?;
        if d.info.port_regs_refused {
            log::info!(
                "mlx5: the VF's firmware refuses PMTU/PAOS reads: MTU {} from the vport context, port {} from \
                 QUERY_VPORT_STATE",
                d.info.mtu,
                d.info.port
            );
        }
        d.info.bring_up_ns = p.now_ns().saturating_sub(t0);
        // Link training: bounded, never an error (the link may come up later, announced by PORT_CHANGE).
        if cfg.link_wait_ms > 0 && d.info.port != PortState::Active {
            let w = crate::eth::wait_link_up(&mut d, 1, cfg.link_wait_ms).map_err(step("ACCESS_REG PAOS"))?;
            d.info.port = match w {
                crate::eth::LinkWait::Up => PortState::Active,
                crate::eth::LinkWait::NotYet(s) => s,
            };
            let waited = p.now_ns().saturating_sub(t0).saturating_sub(d.info.bring_up_ns);
            log::info!("mlx5: port 1 {} after {} ms of link training", d.info.port, waited / 1_000_000);
        }
        Ok(d)
    }

    /// A function a previous owner left enabled (and maybe initialised): TEARDOWN_HCA graceful, FORCE_CLOSE if
    /// that is refused for another reason than "not initialised" (BAD_SYS_STATE), then DISABLE_HCA, which ends
    /// the firmware's use of the pages the previous owner gave (their addresses are unknown here, so they
    /// cannot be taken back one by one).
    fn bring_down_previous_owner(&mut self) -> Result<(), CmdError> {
        use ifc::init::{
            MLX5_TEARDOWN_HCA_IN_PROFILE_FORCE_CLOSE as FORCE, MLX5_TEARDOWN_HCA_IN_PROFILE_GRACEFUL_CLOSE as GRACEFUL,
        };
        match self.exec(ifc::init::teardown_hca(GRACEFUL)) {
            Ok(_) => log::info!("mlx5: previous owner's function torn down (TEARDOWN_HCA)"),
            Err(e) if e.status() == Some(STATUS_BAD_SYS_STATE) => {}
            Err(e) if e.status().is_some() => {
                log::warn!("mlx5: {e}; trying FORCE_CLOSE");
                if let Err(e) = self.exec(ifc::init::teardown_hca(FORCE)) {
                    log::warn!("mlx5: {e}");
                }
            }
            Err(e) => return Err(e),
        }
        self.exec(ifc::init::disable_hca(self.embedded_cpu))?;
        log::info!("mlx5: previous owner's function disabled (DISABLE_HCA)");
        Ok(())
    }

    pub fn platform(&self) -> &Arc<P> {
        &self.p
    }

    /// One round of both engines (the one-CPU layout's HCA share of core 0).
    pub fn pump(&mut self) -> bool {
        let a = self.cmd.poll();
        let b = self.events.poll();
        a | b
    }

    /// Runs `cmd` to completion: queues it, pumps both engines (so page requests are served on the page slot
    /// meanwhile), and returns its output or error. Bounded by the command deadline plus one second of
    /// queueing.
    pub fn exec(&mut self, cmd: Command) -> Result<Output, CmdError> {
        let limit = self.cmd.queue().timeout_ms().saturating_add(1_000);
        let deadline = Deadline::after(self.p.as_ref(), limit);
        // For the report if the command never gets a slot: the command itself is in the ring by then.
        let never_posted = cmd.error(ErrorKind::Busy);
        let mut cmd = cmd;
        let tag = loop {
            match self.client.submit(cmd) {
                Ok(t) => break t,
                Err(c) => {
                    if deadline.passed(self.p.as_ref()) {
                        return Err(c.error(ErrorKind::Busy));
                    }
                    cmd = c;
                    self.pump();
                    self.p.relax();
                }
            }
        };
        loop {
            self.pump();
            while let Some(c) = self.client.poll() {
                if c.tag == tag {
                    return c.result;
                }
                self.stash.push(c);
            }
            if deadline.passed(self.p.as_ref()) {
                // The queue reports its own timeout before this; reaching here means the command never got a
                // slot (all quarantined).
                return Err(never_posted);
            }
            self.p.relax();
        }
    }

    /// Completions of commands queued through `client` directly that `exec` collected meanwhile.
    pub fn take_stashed(&mut self) -> Vec<Completion> {
        core::mem::take(&mut self.stash)
    }

    pub fn next_event(&mut self) -> Option<Event> {
        self.client.next_event()
    }

    /// QUERY_PAGES(`op_mod`), then gives that many pages through the page slot and waits until they are
    /// given. Returns the number the firmware asked for.
    fn satisfy_pages(&mut self, kind: PagesKind) -> Result<i32, CmdError> {
        let out = self.exec(ifc::init::query_pages(kind))?;
        let q = ifc::init::parse_query_pages(&out);
        if q.num_pages > 0 {
            let before = self.cmd.pages().given();
            self.cmd.request_pages(PageRequest { function_id: q.function_id, num_pages: q.num_pages });
            let limit = self.cmd.queue().timeout_ms().saturating_add(1_000);
            let p = self.p.clone();
            let deadline = Deadline::after(p.as_ref(), limit);
            while !self.cmd.pages().idle() {
                self.pump();
                if deadline.passed(p.as_ref()) {
                    return Err(ifc::init::query_pages(kind).error(ErrorKind::Timeout { slot: 0xff, waited_ms: limit }));
                }
                p.relax();
            }
            let got = self.cmd.pages().given() - before;
            if got < q.num_pages as usize {
                return Err(ifc::init::manage_pages_give(q.function_id, &[])
                    .error(ErrorKind::Status { status: 0xfe, syndrome: got as u32 }));
            }
        }
        Ok(q.num_pages)
    }

    /// Teardown in reverse (docs/reference/mlx5.md §b.4): DESTROY_EQ, DEALLOC_UAR, TEARDOWN_HCA (graceful), reclaim
    /// every page (MANAGE_PAGES take, retried until none is held or RECLAIM_PAGES passes without progress),
    /// DISABLE_HCA, then the driver's DMA memory. The
    /// first failing step is reported; the rest still run where that is safe. Pages the firmware did not give
    /// back are leaked on purpose (it may still write them), unless DISABLE_HCA succeeded.
    pub fn teardown(mut self) -> Result<TeardownReport, (TeardownReport, CmdError)> {
        let mut report = TeardownReport::default();
        let mut first: Option<CmdError> = None;
        let note = |r: Result<Output, CmdError>, first: &mut Option<CmdError>| match r {
            Ok(o) => Some(o),
            Err(e) => {
                if first.is_none() {
                    *first = Some(e);
                }
                None
            }
        };
        let eqn = self.info.eqn;
        if let Some(ring) = self.events.detach_eq() {
            let ok = note(self.exec(ifc::eq::destroy_eq(eqn)), &mut first).is_some();
            if ok {
                ring.release(self.p.as_ref());
            }
        }
        note(self.exec(ifc::resources::dealloc_uar(self.info.uar)), &mut first);
        let torn = note(
            self.exec(ifc::init::teardown_hca(ifc::init::MLX5_TEARDOWN_HCA_IN_PROFILE_GRACEFUL_CLOSE)),
            &mut first,
        )
        .is_some();
        report.teardown_hca = torn;
        // Reclaim as Linux `mlx5_reclaim_root_pages`: ask for everything the firmware holds until it holds
        // nothing. A round that brings pages back restarts the RECLAIM_PAGES deadline; a round that brings none
        // (or fails) is retried until the deadline passes.
        let p = self.p.clone();
        let mut deadline = Deadline::after(p.as_ref(), initseg::RECLAIM_PAGES_TIMEOUT_MS);
        report.pages_before = self.cmd.pages().given();
        while self.cmd.pages().given() > 0 {
            let before = self.cmd.pages().given();
            self.cmd.request_pages(PageRequest { function_id: 0, num_pages: -(before as i32) });
            while !self.cmd.pages().idle() && !deadline.passed(p.as_ref()) {
                self.pump();
                p.relax();
            }
            report.reclaim_rounds += 1;
            if self.cmd.pages().given() < before {
                deadline = Deadline::after(p.as_ref(), initseg::RECLAIM_PAGES_TIMEOUT_MS);
            } else if deadline.passed(p.as_ref()) {
                log::warn!("mlx5: the firmware did not return {before} pages within the reclaim deadline");
                break;
            } else {
                p.relax();
            }
        }
        report.pages_left = self.cmd.pages().given();
        let disabled = note(self.exec(ifc::init::disable_hca(self.embedded_cpu)), &mut first).is_some();
        report.disable_hca = disabled;
        let (q, mut pages) = self.cmd.into_parts();
        if disabled {
            pages.release_all(p.as_ref());
            q.release(p.as_ref());
        }
        match first {
            None => Ok(report),
            Some(e) => Err((report, e)),
        }
    }

    /// Splits into the engines for dedicated cores and the client for core 0.
    /// The fatal path's command (`docs/revoke-semantics.md`, "Fail closed on crash"): a PAOS write of
    /// `admin_status` down for port 1, built now in the command queue's emergency slot and posted by
    /// [`crate::cmdq::Emergency::fire`] from a panicking core. `None` for a VF (its firmware refuses PAOS
    /// writes: the physical port is the PF's) or a queue without an emergency slot.
    pub fn prepare_port_down(&mut self) -> Option<crate::cmdq::Emergency> {
        if self.info.vf {
            return None;
        }
        let cmd = ifc::vport::paos_set(1, ifc::vport::MLX5_PORT_DOWN);
        self.cmd.q.prepare_emergency(&*self.p, &cmd)
    }

    pub fn into_engines(self) -> (CommandEngine<P>, EventEngine<P>, Client, HcaInfo) {
        (self.cmd, self.events, self.client, self.info)
    }
}

/// What teardown did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeardownReport {
    pub teardown_hca: bool,
    pub pages_before: usize,
    pub pages_left: usize,
    /// MANAGE_PAGES take rounds (each asks for everything still held).
    pub reclaim_rounds: u32,
    pub disable_hca: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::DmaBuf;
    use core::sync::atomic::{AtomicU64, Ordering};

    /// `initializing` set until `clears_ms` of virtual time (each `relax` is 2 ms, Linux's FW_PRE_INIT_WAIT).
    struct Slow {
        now_ns: AtomicU64,
        clears_ms: u64,
    }

    impl Platform for Slow {
        fn bar_read32(&self, offset: usize) -> u32 {
            let now_ms = self.now_ns.load(Ordering::Relaxed) / 1_000_000;
            if offset == initseg::INITIALIZING && now_ms < self.clears_ms { 1 << 31 } else { 0 }
        }
        fn bar_write32(&self, _offset: usize, _value: u32) {}
        fn dma_alloc(&self, _len: usize, _align: usize) -> Option<DmaBuf> {
            None
        }
        fn dma_free(&self, _buf: DmaBuf) {}
        fn dma_read(&self, _buf: DmaBuf, _offset: usize, _out: &mut [u8]) {}
        fn dma_write(&self, _buf: DmaBuf, _offset: usize, _data: &[u8]) {}
        fn now_ns(&self) -> u64 {
            self.now_ns.load(Ordering::Relaxed)
        }
        fn relax(&self) {
            self.now_ns.fetch_add(2_000_000, Ordering::Relaxed);
        }
    }

    fn slow(clears_ms: u64) -> Slow {
        Slow { now_ns: AtomicU64::new(0), clears_ms }
    }

    /// A real device's defaults are Linux's: 120 s, with a warning every 20 s.
    #[test]
    fn the_default_pre_init_wait_is_linux_s() {
        let c = Config::default();
        assert_eq!((c.pre_init_timeout_ms, c.pre_init_report_ms), (120_000, 20_000));
    }

    /// Firmware that takes 65 s (after `mlxfwreset`, say) is waited for, with three warnings on the way.
    #[test]
    fn firmware_slower_than_ten_seconds_is_waited_for() {
        let p = slow(65_000);
        let c = Config::default();
        assert_eq!(wait_reporting(&p, c.pre_init_timeout_ms, c.pre_init_report_ms), (true, 3));
        let ms = p.now_ns() / 1_000_000;
        assert!((65_000..65_010).contains(&ms), "stopped waiting when it cleared: {ms} ms");
    }

    /// Firmware that never comes up is given up on at the deadline, after five warnings (20 s .. 100 s).
    #[test]
    fn the_pre_init_wait_gives_up_at_its_deadline() {
        let p = slow(u64::MAX);
        assert_eq!(wait_reporting(&p, 120_000, 20_000), (false, 5));
        let ms = p.now_ns() / 1_000_000;
        assert!((120_000..120_010).contains(&ms), "{ms} ms");
        // The model's short bound.
        let p = slow(u64::MAX);
        assert_eq!(wait_reporting(&p, 10_000, 20_000), (false, 0));
        assert!(p.now_ns() / 1_000_000 < 10_010);
    }
}
