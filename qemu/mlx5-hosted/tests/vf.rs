//! VF passthrough (docs/mlx5-driver.md, "VF"): against the model's `--vf` personality, which refuses
//! HOST_ENDIANNESS and the port registers' writes as a VF's firmware does, the driver told it runs a VF
//! comes up, builds its Ethernet port, and leaves the physical port's settings alone; told it runs a PF, it
//! stops at the first register only a PF may touch.

mod common;

use leasebox_mlx5::driver::{Config, Driver, PortState};
use leasebox_mlx5::eth::{EthConfig, EthPort};
use mlx5_model::ModelConfig;

fn vf_model() -> ModelConfig {
    ModelConfig { vf: true, ..common::model_config() }
}

fn vf_driver() -> Config {
    Config { part: "ConnectX-5 VF", vf: true, ..common::driver_config() }
}

#[test]
fn a_vf_comes_up_without_host_endianness() {
    let d = common::up_with(vf_model(), vf_driver());
    assert!(d.info.vf);
    assert_eq!(d.info.part, "ConnectX-5 VF");
    // Reading the port is a VF's right: its state and MTU are the PF's.
    assert_eq!(d.info.port, PortState::Active);
    assert_eq!(d.info.mtu, 1522);
    assert!(d.info.roce, "RoCE on the VF's own vport");
}

#[test]
fn a_pf_bring_up_is_refused_by_a_vf() {
    match Driver::bring_up(common::platform(vf_model()), common::driver_config()) {
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("ACCESS_REG HOST_ENDIANNESS"), "{e}");
        }
        Ok(_) => panic!("a PF's bring-up passed on a VF"),
    }
}

#[test]
fn a_vf_ethernet_port_leaves_the_physical_port_to_the_pf() {
    let mut d = common::up_with(vf_model(), vf_driver());
    let p = d.platform().clone();
    let cfg = EthConfig { log_tx_frames: 3, log_rx_frames: 3, buf_len: 4096, mtu: Some(4000), ..EthConfig::default() };
    let port = EthPort::create(&mut d, &cfg).unwrap_or_else(|e| panic!("create: {e}"));
    {
        let m = p.model().unwrap();
        let hw = &m.hca().port;
        assert_eq!(hw.vport_mtu, 4022, "the VF's own vport takes the MTU");
        assert_eq!((hw.admin_mtu, hw.oper_mtu), (1522, 1522), "the physical port keeps the PF's MTU");
    }
    assert_eq!(port.info.pmtu.oper_mtu, 1522, "PMTU as read back");
    port.destroy(&mut d).unwrap_or_else(|e| panic!("destroy: {e}"));
    // The same port as a PF, on a PF: the physical port's MTU follows.
    let mut pf = common::up_with(common::model_config(), common::driver_config());
    let port = EthPort::create(&mut pf, &cfg).unwrap_or_else(|e| panic!("PF create: {e}"));
    assert_eq!(port.info.pmtu.oper_mtu, 4022, "a PF sets the port's MTU");
    port.destroy(&mut pf).unwrap_or_else(|e| panic!("destroy: {e}"));
}

/// Behind the model's legacy e-switch: bring-up publishes the MAC in the vport's unicast list (on the PF too),
/// so frames for it reach the function.
#[test]
fn bring_up_publishes_the_mac_in_the_unicast_list() {
    let d = common::up_with(vf_model(), vf_driver());
    let mac = d.info.mac;
    assert_ne!(mac, [0; 6]);
    let m = d.platform().model().unwrap();
    assert_eq!(m.hca().port.uc_list, vec![mac], "the VF's own MAC, alone");
    assert!(m.hca().port.eswitch_admits(mac));
    drop(m);
    let pf = common::up_with(common::model_config(), common::driver_config());
    assert_eq!(pf.platform().model().unwrap().hca().port.uc_list, vec![pf.info.mac], "the PF publishes as well");
}

/// A VF whose administrator set no MAC (all zero) refuses to serve and says how to set one.
#[test]
fn a_vf_without_a_mac_refuses_to_come_up() {
    let model = ModelConfig { mac: [0; 6], ..vf_model() };
    match Driver::bring_up(common::platform(model), vf_driver()) {
        Err(e) => {
            assert_eq!(e, leasebox_mlx5::driver::BringUpError::VfWithoutMac);
            let s = e.to_string();
            assert!(s.contains("ip link set <pf> vf <n> mac <mac>"), "{s}");
        }
        Ok(_) => panic!("a VF without a MAC came up"),
    }
}

/// A VF whose firmware refuses the PMTU and PAOS reads comes up all the same: the MTU from the NIC vport
/// context, the link from QUERY_VPORT_STATE, and its Ethernet port too.
#[test]
fn a_vf_refused_the_port_registers_falls_back_to_the_vport() {
    let model = ModelConfig { vf_port_reads_refused: true, ..vf_model() };
    let mut d = common::up_with(model, vf_driver());
    assert!(d.info.port_regs_refused);
    assert_eq!(d.info.mtu, 1522, "the vport's MTU");
    assert_eq!(d.info.port, PortState::Active, "the vport's state");
    let cfg = EthConfig { log_tx_frames: 3, log_rx_frames: 3, buf_len: 4096, mtu: Some(1500), ..EthConfig::default() };
    let port = EthPort::create(&mut d, &cfg).unwrap_or_else(|e| panic!("create: {e}"));
    assert_eq!(port.info.pmtu.oper_mtu, 1522);
    port.destroy(&mut d).unwrap_or_else(|e| panic!("destroy: {e}"));
    // Without the refusal, no fallback is recorded.
    assert!(!common::up_with(vf_model(), vf_driver()).info.port_regs_refused);
}
