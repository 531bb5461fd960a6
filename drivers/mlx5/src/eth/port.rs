//! The port's registers (Linux `en/port.c`, `port.c`): PAOS administrative and operational state, PMTU, the
//! vport state a VF reads instead, waiting for the link, and the link state the port keeps from PORT_CHANGE
//! events.

use super::{EthError, EthPort};
use crate::command::CmdError;
use crate::driver::{Driver, PortState};
use crate::engine::Event;
use crate::ifc;
use crate::platform::{Deadline, Platform};

/// What the port's MTU adds to the L3 MTU (Linux `MLX5E_SW2HW_MTU`: Ethernet header, VLAN tag, FCS).
pub const HW_MTU_OVERHEAD: u16 = 22;

impl PortState {
    /// From PAOS `oper_status` (1 up, 2 down; Linux `mlx5_query_port_oper_status`).
    pub fn from_paos(oper_status: u8) -> PortState {
        match oper_status {
            ifc::vport::MLX5_PORT_UP => PortState::Active,
            ifc::vport::MLX5_PORT_DOWN => PortState::Down,
            v => PortState::Unknown(v),
        }
    }

    /// The state a PORT_CHANGE event for `local_port` announces (sub-type 4 active, 1 down); `None` for other
    /// events, other ports and other sub-types.
    pub fn from_event(e: &ifc::eq::Eqe, local_port: u8) -> Option<PortState> {
        match e.event() {
            ifc::eq::Event::PortChange { port, sub_type } if port == local_port => match sub_type {
                ifc::eq::MLX5_PORT_CHANGE_SUBTYPE_ACTIVE => Some(PortState::Active),
                ifc::eq::MLX5_PORT_CHANGE_SUBTYPE_DOWN => Some(PortState::Down),
                _ => None,
            },
            _ => None,
        }
    }
}

/// What [`wait_link_up`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkWait {
    Up,
    /// The deadline passed first; the link may still come up (link training takes seconds).
    NotYet(PortState),
}

/// PAOS write `admin_status` = up for `local_port`.
pub fn port_admin_up<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<(), CmdError> {
    d.exec(ifc::vport::paos_set(local_port, ifc::vport::MLX5_PORT_UP)).map(drop)
}

/// PAOS read: the operational state of `local_port`.
pub fn query_port_state<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<PortState, CmdError> {
    match d.exec(ifc::vport::paos_query(local_port)) {
        Ok(o) => Ok(PortState::from_paos(ifc::vport::paos_out(&o).oper_status)),
        // Best effort on a VF: its firmware may refuse the physical port's register; the vport state (Linux
        // `mlx5_query_vport_state`, what `mlx5e_update_carrier` reads) says whether its link is up.
        Err(e) if d.info.vf && e.status().is_some() => {
            let o = d.exec(ifc::vport::query_vport_state())?;
            Ok(match ifc::vport::query_vport_state_out(&o).state {
                ifc::vport::MLX5_VPORT_STATE_UP => PortState::Active,
                _ => PortState::Down,
            })
        }
        Err(e) => Err(e),
    }
}

/// The port's PMTU; on a VF whose firmware refuses the register (best effort, as Linux's VF gets by with the
/// vport's MTU, `mlx5_query_nic_vport_mtu`), the NIC vport context's `mtu` stands for all three (the maximum
/// then is what the vport has: a VF cannot raise it past what it cannot see).
pub fn port_mtu<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<ifc::vport::Pmtu, CmdError> {
    port_mtu_or_vport(d, local_port).map(|(pmtu, _)| pmtu)
}

/// [`port_mtu`], and whether it came from the vport context because the VF's firmware refused PMTU.
pub fn port_mtu_or_vport<P: Platform>(d: &mut Driver<P>, local_port: u8) -> Result<(ifc::vport::Pmtu, bool), CmdError> {
    match d.exec(ifc::vport::pmtu_query(local_port)) {
        Ok(o) => Ok((ifc::vport::pmtu_out(&o), false)),
        Err(e) if d.info.vf && e.status().is_some() => {
            let o = d.exec(ifc::vport::query_nic_vport_context())?;
            let mtu = ifc::vport::query_nic_vport_context_out(&o).mtu;
            Ok((ifc::vport::Pmtu { max_mtu: mtu, admin_mtu: mtu, oper_mtu: mtu }, true))
        }
        Err(e) => Err(e),
    }
}

/// Polls PAOS until the port is up or `ms` have passed; a port still down is not an error.
pub fn wait_link_up<P: Platform>(d: &mut Driver<P>, local_port: u8, ms: u64) -> Result<LinkWait, CmdError> {
    let p = d.platform().clone();
    let deadline = Deadline::after(p.as_ref(), ms);
    loop {
        let s = query_port_state(d, local_port)?;
        if s == PortState::Active {
            return Ok(LinkWait::Up);
        }
        if deadline.passed(p.as_ref()) {
            return Ok(LinkWait::NotYet(s));
        }
        // Between reads: a millisecond of relaxing (a PAOS read is a firmware command).
        let pause = Deadline::after(p.as_ref(), 1);
        while !pause.passed(p.as_ref()) {
            p.relax();
        }
    }
}

/// Sets the port MTU for an L3 `mtu` as Linux `mlx5e_set_mtu` does: PMTU `admin_mtu` and the NIC vport context
/// `mtu` get `mtu + 22`; refused beyond the port's `max_mtu`. Returns the PMTU read back. As a VF only the
/// vport context changes: the physical port's MTU is the PF's (its firmware refuses the PMTU write).
pub fn set_port_mtu<P: Platform>(d: &mut Driver<P>, local_port: u8, mtu: u16) -> Result<ifc::vport::Pmtu, EthError> {
    let step = |step: &'static str| move |error| EthError::Command { step, error };
    let hw = mtu.checked_add(HW_MTU_OVERHEAD).ok_or(EthError::Config("MTU too large"))?;
    let cur = port_mtu(d, local_port).map_err(step("ACCESS_REG PMTU"))?;
    if hw > cur.max_mtu {
        return Err(EthError::Config("MTU beyond the port's max_mtu"));
    }
    if !d.info.vf {
        d.exec(ifc::vport::pmtu_set(local_port, hw)).map_err(step("ACCESS_REG PMTU write"))?;
    }
    d.exec(ifc::vport::modify_nic_vport_mtu(hw)).map_err(step("MODIFY_NIC_VPORT_CONTEXT mtu"))?;
    port_mtu(d, local_port).map_err(step("ACCESS_REG PMTU"))
}

impl<P: Platform> EthPort<P> {
    /// The link state as last read or announced.
    pub fn state(&self) -> PortState {
        self.state
    }

    /// Sets the link state from an announcement read elsewhere (the event engine records PORT_CHANGE events in
    /// [`crate::engine::Shared::port_event`] for whichever core drives the port).
    pub fn set_state(&mut self, s: PortState) {
        self.state = s;
    }

    /// The port's PAOS / PORT_CHANGE number (1-based).
    pub fn local_port(&self) -> u8 {
        self.local_port
    }

    /// Keeps the link state current from a PORT_CHANGE event (other events are ignored). Returns the new state
    /// when the event changed it.
    pub fn on_event(&mut self, e: &Event) -> Option<PortState> {
        let Event::Async(eqe) = e else { return None };
        let s = PortState::from_event(eqe, self.local_port)?;
        let changed = s != self.state;
        self.state = s;
        changed.then_some(s)
    }

    /// Re-reads the link state (before `into_engines`, or whenever the driver is at hand) as Linux
    /// `mlx5e_update_carrier` does on a PORT_CHANGE: QUERY_VPORT_STATE of the function's own vNIC vport
    /// (`state` 1 up, 0 down), which a VF may ask as well as a PF.
    pub fn refresh_state(&mut self, d: &mut Driver<P>) -> Result<PortState, CmdError> {
        let o = d.exec(ifc::vport::query_vport_state())?;
        self.state = match ifc::vport::query_vport_state_out(&o).state {
            ifc::vport::MLX5_VPORT_STATE_UP => PortState::Active,
            _ => PortState::Down,
        };
        Ok(self.state)
    }

    /// Polls the link for up to `ms` and records what it saw; a link still down is `NotYet`, not an error.
    pub fn wait_link_up(&mut self, d: &mut Driver<P>, ms: u64) -> Result<LinkWait, CmdError> {
        let w = wait_link_up(d, self.local_port, ms)?;
        self.state = match w {
            LinkWait::Up => PortState::Active,
            LinkWait::NotYet(s) => s,
        };
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_change_events_give_the_link_state() {
        let eqe = |event_type: u8, sub_type: u8, port: u8| {
            let mut data = [0u8; 28];
            data[8] = port << 4;
            ifc::eq::Eqe { event_type, sub_type, owner: false, data }
        };
        let pc = ifc::eq::MLX5_EVENT_TYPE_PORT_CHANGE;
        assert_eq!(PortState::from_event(&eqe(pc, 4, 1), 1), Some(PortState::Active));
        assert_eq!(PortState::from_event(&eqe(pc, 1, 1), 1), Some(PortState::Down));
        assert_eq!(PortState::from_event(&eqe(pc, 5, 1), 1), None, "other sub-types change nothing");
        assert_eq!(PortState::from_event(&eqe(pc, 4, 2), 1), None, "another port");
        assert_eq!(PortState::from_event(&eqe(0x0d, 4, 1), 1), None, "another event");
        assert_eq!(
            (PortState::from_paos(1), PortState::from_paos(2), PortState::from_paos(3)),
            (PortState::Active, PortState::Down, PortState::Unknown(3))
        );
    }
}
