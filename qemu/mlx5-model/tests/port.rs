//! ACCESS_REGISTER (PAOS, PMTU, HOST_ENDIANNESS), NIC vport context, HCA vport GID and RoCE addresses: good
//! input, the defaults of the one RoCE port, and each error class.

mod common;

use common::{Drv, be32, cmd, put32};
use mlx5_model::mem::Memory;

const BAD_OP: u8 = 0x02;
const BAD_PARAM: u8 = 0x03;
const BAD_SYS_STATE: u8 = 0x04;
const BAD_INP_LEN: u8 = 0x50;
const BAD_OUTP_LEN: u8 = 0x51;
/// Instant commands, but the default link training (`ModelConfig::instant` skips it).
fn training() -> mlx5_model::ModelConfig {
    mlx5_model::ModelConfig {
        link_up_delay: mlx5_model::hca::DEFAULT_LINK_UP_DELAY,
        ..mlx5_model::ModelConfig::instant()
    }
}

/// The default MAC (`ModelConfig::mac`).
const MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01];
/// fe80::EUI-64(MAC): U/L bit flipped, ff:fe inserted.
const GID0: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x4c, 0x42, 0xff, 0xfe, 0x00, 0x00, 0x01];

fn reg(op_mod: u16, id: u32, dw0: u32, dw1: u32, dw2: u32) -> Vec<u8> {
    let mut b = cmd(0x805, op_mod, 0x20);
    put32(&mut b, 8, id);
    put32(&mut b, 0x10, dw0);
    put32(&mut b, 0x14, dw1);
    put32(&mut b, 0x18, dw2);
    b
}

#[test]
fn pmtu_paos_and_host_endianness() {
    let mut d = Drv::with(training(), 64 << 20);
    assert_eq!(d.exec(&reg(1, 0x5003, 1 << 16, 0, 0), 0x20).status(), BAD_SYS_STATE, "before ENABLE_HCA");
    d.bring_up();
    let out = d.ok(&reg(1, 0x5003, 1 << 16, 0, 0), 0x20);
    assert_eq!((be32(&out, 0x14) >> 16, be32(&out, 0x18) >> 16, be32(&out, 0x1c) >> 16), (10000, 1522, 1522));
    let out = d.ok(&reg(0, 0x5003, 1 << 16, 0, 4096 << 16), 0x20);
    assert_eq!(be32(&out, 0x1c) >> 16, 4096, "oper follows admin");
    assert_eq!(d.exec(&reg(0, 0x5003, 1 << 16, 0, 10001 << 16), 0x20).status(), BAD_PARAM, "above max_mtu");
    assert_eq!(d.exec(&reg(0, 0x5003, 1 << 16, 0, 20 << 16), 0x20).status(), BAD_PARAM, "below minimum");
    assert_eq!(d.exec(&reg(1, 0x5003, 2 << 16, 0, 0), 0x20).status(), BAD_PARAM, "local_port 2");
    let out = d.ok(&reg(1, 0x5006, 1 << 16, 0, 0), 0x20);
    assert_eq!(be32(&out, 0x10) & 0xf0f, 0x102, "admin up, oper down: the link is still training");
    assert_eq!(d.exec(&reg(0, 0x5006, (1 << 16) | (3 << 8), 1 << 31, 0), 0x20).status(), BAD_PARAM);
    d.ok(&reg(0, 0x7004, 0, 0, 0), 0x20);
    assert_eq!(d.exec(&reg(0, 0x7004, 0x80 << 24, 0, 0), 0x20).status(), BAD_PARAM, "big-endian host");
    assert_eq!(d.exec(&reg(1, 0x5008, 1 << 16, 0, 0), 0x20).status(), BAD_PARAM, "PPCNT not modelled");
    assert_eq!(d.exec(&reg(2, 0x5003, 1 << 16, 0, 0), 0x20).status(), BAD_PARAM, "op_mod");
    let mut a = reg(1, 0x5003, 1 << 16, 0, 0);
    put32(&mut a, 12, 1);
    assert_eq!(d.exec(&a, 0x20).status(), BAD_PARAM, "argument");
    assert_eq!(d.exec(&reg(1, 0x5003, 1 << 16, 0, 0)[..0x18], 0x20).status(), BAD_INP_LEN);
    assert_eq!(d.exec(&reg(1, 0x5003, 1 << 16, 0, 0), 0x10).status(), BAD_OUTP_LEN);
}

#[test]
fn nic_vport_context_defaults_and_roce_en() {
    let mut d = Drv::new();
    d.bring_up();
    let out = d.ok(&cmd(0x754, 0, 16), 0x110);
    assert_eq!(be32(&out, 0x10) & 1, 0, "roce_en off until the driver enables it");
    assert_eq!(be32(&out, 0x34) & 0xffff, 1522, "mtu");
    assert_eq!(&out[0x106..0x10c], &MAC, "permanent_address");
    assert_eq!(&out[0x48..0x50], &GID0[8..], "node_guid = EUI-64 of the MAC");
    let mut m = cmd(0x755, 0, 0x200);
    put32(&mut m, 0xc, 1 << 1);
    put32(&mut m, 0x100, 1);
    d.ok(&m, 16);
    assert_eq!(be32(&d.ok(&cmd(0x754, 0, 16), 0x110), 0x10) & 1, 1);
    assert!(d.model.hca().port.roce_en);
    // Unsupported select (promisc), a value without its select, another vport, a list query.
    let mut x = m.clone();
    put32(&mut x, 0xc, 1 << 4);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    let mut x = m.clone();
    put32(&mut x, 0xc, 0);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    let mut x = m.clone();
    put32(&mut x, 8, 1);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    let mut q = cmd(0x754, 0, 16);
    put32(&mut q, 0xc, 1 << 24);
    assert_eq!(d.exec(&q, 0x110).status(), BAD_PARAM);
    assert_eq!(d.exec(&m[..0x100], 16).status(), BAD_INP_LEN);
}

#[test]
fn gid_table_and_roce_addresses() {
    let mut d = Drv::new();
    d.bring_up();
    // The table starts empty, as firmware's does: no GID until the driver writes one.
    let mut g = cmd(0x764, 0, 16);
    let out = d.ok(&g, 0x20);
    assert_eq!((be32(&out, 0xc) >> 16, &out[0x10..0x20]), (1, &[0u8; 16][..]));
    assert_eq!(&d.ok(&cmd(0x760, 0, 16), 0x30)[0x10..0x30], &[0u8; 0x20]);
    assert!(d.model.hca().port.roce_addrs.iter().all(|a| a.is_empty()));
    // Index 0 written as Linux writes its default RoCEv2 GID: fe80::EUI-64, IPv6 (1), version 2, the MAC.
    let mut s0 = cmd(0x761, 0, 0x30);
    s0[0x10..0x20].copy_from_slice(&GID0);
    put32(&mut s0, 0x20, 0x024c);
    put32(&mut s0, 0x24, 0x4200_0001);
    put32(&mut s0, 0x28, 0x102);
    d.ok(&s0, 16);
    let out = d.ok(&g, 0x20);
    assert_eq!(&out[0x10..0x20], &GID0[..]);
    put32(&mut g, 0xc, 0xffff);
    let out = d.ok(&g, 0x10 + 16 * 256);
    assert_eq!(be32(&out, 0xc) >> 16, 256);
    assert_eq!(d.exec(&g, 0x20).status(), BAD_OUTP_LEN);
    put32(&mut g, 0xc, 256);
    assert_eq!(d.exec(&g, 0x20).status(), BAD_PARAM);
    // RoCE address 0: RoCEv2 (2), IPv6 (1), the MAC.
    let out = d.ok(&cmd(0x760, 0, 16), 0x30);
    assert_eq!(&out[0x10..0x20], &GID0);
    assert_eq!((be32(&out, 0x20) & 0xffff, be32(&out, 0x24)), (0x024c, 0x4200_0001));
    assert_eq!(be32(&out, 0x28) & 0xfff, 0x102);
    // SET index 3 to a RoCEv2 IPv4-mapped GID, read it back through both commands.
    let mut s = cmd(0x761, 0, 0x30);
    put32(&mut s, 8, 3 << 16);
    s[0x10 + 10] = 0xff;
    s[0x10 + 11] = 0xff;
    s[0x10 + 12..0x10 + 16].copy_from_slice(&[10, 0, 0, 1]);
    put32(&mut s, 0x20, 0x024c);
    put32(&mut s, 0x24, 0x4200_0001);
    put32(&mut s, 0x28, 2);
    d.ok(&s, 16);
    let mut q = cmd(0x760, 0, 16);
    put32(&mut q, 8, 3 << 16);
    assert_eq!(&d.ok(&q, 0x30)[0x10..0x30], &s[0x10..0x30]);
    let mut g = cmd(0x764, 0, 16);
    put32(&mut g, 0xc, 3);
    assert_eq!(&d.ok(&g, 0x20)[0x10..0x20], &s[0x10..0x20]);
    // Errors: version 5, l3 type 2, vlan id without vlan_valid, index out of range, port 2, short input.
    for (at, v) in [(0x28, 5u32), (0x28, (2 << 8) | 2), (0x20, (5 << 16) | 0x024c)] {
        let mut x = s.clone();
        put32(&mut x, at, v);
        assert_eq!(d.exec(&x, 16).status(), BAD_PARAM, "{at:#x} {v:#x}");
    }
    let mut x = s.clone();
    put32(&mut x, 8, 256 << 16);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    put32(&mut x, 8, (3 << 16) | 2);
    assert_eq!(d.exec(&x, 16).status(), BAD_PARAM);
    assert_eq!(d.exec(&s[..0x20], 16).status(), BAD_INP_LEN);
    // An all-zero entry deletes.
    let mut z = cmd(0x761, 0, 0x30);
    put32(&mut z, 8, 3 << 16);
    d.ok(&z, 16);
    assert_eq!(&d.ok(&q, 0x30)[0x10..0x30], &[0u8; 0x20]);
    // An opcode still not modelled.
    assert_eq!(d.exec(&cmd(0x762, 0, 16), 16).status(), BAD_OP);
}

/// The `--vf` personality (docs/hca-model.md, "VF personality").
fn vf() -> Drv {
    let cfg = mlx5_model::ModelConfig { vf: true, ..training() };
    let mut d = Drv::with(cfg, 64 << 20);
    d.bring_up();
    d
}

/// The model's syndrome for a register only the PF may touch: ACCESS_REGISTER's opcode, reason 0x36.
const NOT_PERMITTED_FOR_VF: u32 = (0x805 << 16) | 0x36;

/// MODIFY_NIC_VPORT_CONTEXT `addresses_list` of `n` entries (field_select bit 0x1d; `allowed_list_size` in the
/// context's dword 0xf0, entries from byte 0x200), input exactly as long as the entries.
fn uc_list(macs: &[[u8; 6]]) -> Vec<u8> {
    let mut m = cmd(0x755, 0, 0x200 + 8 * macs.len());
    put32(&mut m, 0xc, 1 << 2);
    put32(&mut m, 0x1f0, macs.len() as u32);
    for (i, mac) in macs.iter().enumerate() {
        m[0x202 + 8 * i..0x208 + 8 * i].copy_from_slice(mac);
    }
    m
}

/// The vport's unicast address list (Linux `mlx5_modify_nic_vport_mac_list`): UC only, at most
/// 2^`log_max_current_uc_list` entries, each a `mac_address_layout` whose reserved bits are zero, the input as
/// long as the entries; DISABLE_HCA forgets it.
#[test]
fn the_unicast_list_is_written_by_modify_nic_vport_context() {
    let mut d = vf();
    let other = [0x02, 0, 0, 0, 0, 0x09];
    d.ok(&uc_list(&[MAC]), 16);
    assert_eq!(d.model.hca().port.uc_list, vec![MAC]);
    let log_max = d
        .model
        .hca()
        .caps
        .current(mlx5_model::caps::cap_type::GENERAL, mlx5_model::caps::cmd_hca_cap::LOG_MAX_CURRENT_UC_LIST);
    let max = 1usize << log_max;
    let full: Vec<[u8; 6]> = (0..max).map(|i| [0x02, 0, 0, 0, (i >> 8) as u8, i as u8]).collect();
    d.ok(&uc_list(&full), 16);
    assert_eq!(d.model.hca().port.uc_list.len(), max);
    let over: Vec<[u8; 6]> = (0..=max).map(|i| [0x02, 0, 0, 1, (i >> 8) as u8, i as u8]).collect();
    assert_eq!(d.exec(&uc_list(&over), 16).status(), BAD_PARAM, "more than 2^log_max_current_uc_list");
    // A multicast list (allowed_list_type 1, bits 0x785..0x788 of the context) is not modelled.
    let mut mc = uc_list(&[MAC]);
    put32(&mut mc, 0x1f0, (1 << 24) | 1);
    assert_eq!(d.exec(&mc, 16).status(), BAD_PARAM);
    // Entries past the input; a reserved bit of an entry; a size without the select.
    let two = uc_list(&[MAC, other]);
    assert_eq!(d.exec(&two[..0x208], 16).status(), BAD_INP_LEN);
    let mut r = uc_list(&[MAC]);
    r[0x200] = 1;
    assert_eq!(d.exec(&r, 16).status(), BAD_PARAM);
    let mut n = uc_list(&[MAC]);
    put32(&mut n, 0xc, 0);
    assert_eq!(d.exec(&n, 16).status(), BAD_PARAM);
    assert_eq!(d.model.hca().port.uc_list.len(), max, "refused commands changed nothing");
    d.ok(&uc_list(&[other]), 16);
    assert_eq!(d.model.hca().port.uc_list, vec![other]);
}

/// `vf_port_reads_refused`: PMTU and PAOS reads are refused too on a VF, while QUERY_VPORT_STATE and the vport
/// context (the driver's fallbacks) answer; on the PF the option changes nothing.
#[test]
fn a_vf_may_be_refused_the_port_registers_reads() {
    let cfg = mlx5_model::ModelConfig { vf: true, vf_port_reads_refused: true, ..mlx5_model::ModelConfig::instant() };
    let mut d = Drv::with(cfg.clone(), 64 << 20);
    d.bring_up();
    for id in [0x5003, 0x5006] {
        let r = d.exec(&reg(1, id, 1 << 16, 0, 0), 0x20);
        assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF), "register {id:#x}");
    }
    assert_eq!(vport_state(&mut d), (2, 1), "admin AUTO, up");
    assert_eq!(be32(&d.ok(&cmd(0x754, 0, 16), 0x110), 0x34) & 0xffff, 1522, "the vport's mtu");
    let mut pf = Drv::with(mlx5_model::ModelConfig { vf: false, ..cfg }, 64 << 20);
    pf.bring_up();
    pf.ok(&reg(1, 0x5003, 1 << 16, 0, 0), 0x20);
    pf.ok(&reg(1, 0x5006, 1 << 16, 0, 0), 0x20);
}

#[test]
fn a_vf_may_not_set_the_host_endianness() {
    let mut d = vf();
    for op_mod in [0, 1] {
        let r = d.exec(&reg(op_mod, 0x7004, 0, 0, 0), 0x20);
        assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF), "op_mod {op_mod}");
    }
}

#[test]
fn a_vf_may_not_change_the_port_admin_status() {
    let mut d = vf();
    // admin_status down with ase.
    let r = d.exec(&reg(0, 0x5006, (1 << 16) | (2 << 8), 1 << 31, 0), 0x20);
    assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF));
    // Not even the event mode (ee) alone: the whole register write is the PF's.
    let r = d.exec(&reg(0, 0x5006, 1 << 16, 1 << 30, 1), 0x20);
    assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF));
    // Reading the port's state is allowed, and the refused writes changed nothing.
    let out = d.ok(&reg(1, 0x5006, 1 << 16, 0, 0), 0x20);
    assert_eq!(be32(&out, 0x10) & 0xf0f, 0x102, "admin up (the PF's), oper down while training");
    assert_eq!(be32(&out, 0x18) & 3, 0, "no events asked");
}

#[test]
fn a_vf_may_not_set_the_port_mtu() {
    let mut d = vf();
    let r = d.exec(&reg(0, 0x5003, 1 << 16, 0, 4096 << 16), 0x20);
    assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF));
    let out = d.ok(&reg(1, 0x5003, 1 << 16, 0, 0), 0x20);
    assert_eq!((be32(&out, 0x14) >> 16, be32(&out, 0x18) >> 16, be32(&out, 0x1c) >> 16), (10000, 1522, 1522));
    // Unknown registers keep their own refusal.
    let r = d.exec(&reg(1, 0x5008, 1 << 16, 0, 0), 0x20);
    assert_eq!((r.status(), r.syndrome() & 0xffff), (BAD_PARAM, 0x32));
}

#[test]
fn a_vf_reports_itself_in_the_general_caps() {
    let mut d = vf();
    let mut pf = Drv::new();
    pf.bring_up();
    for op_mod in [0, 1] {
        // QUERY_HCA_CAP GENERAL (max, current): vport_group_manager (bit 0x1a0) 0, vhca_id (bit 0x30) 1.
        let out = d.ok(&cmd(0x100, op_mod, 16), 0x1010);
        assert_eq!(be32(&out, 0x10 + 0x34) >> 31, 0, "vport_group_manager");
        assert_eq!(be32(&out, 0x10 + 0x4) & 0xffff, 1, "vhca_id");
        let out = pf.ok(&cmd(0x100, op_mod, 16), 0x1010);
        assert_eq!(be32(&out, 0x10 + 0x4) & 0xffff, 0, "the PF is vhca 0");
    }
}

/// A driver brought up on `cfg` with a 4-entry EQ subscribed to PORT_CHANGE at `buf` (owner bits 1).
fn with_port_eq(cfg: mlx5_model::ModelConfig, buf: u64) -> Drv {
    let mut d = Drv::with(cfg, 64 << 20);
    d.bring_up();
    let uar = be32(&d.ok(&cmd(0x802, 0, 16), 16), 8);
    for i in 0..4 {
        d.ram.write(buf + 64 * i + 63, &[1]).unwrap();
    }
    d.ok(&common::create_eq_in(2, uar, 1 << 0x9, buf), 16);
    d
}

const PORT_EQ: u64 = 0x3c0_0000;

/// PAOS `admin_status` (bits 11:8) and `oper_status` (bits 3:0) of port 1.
fn paos_state(d: &mut Drv) -> (u32, u32) {
    let v = be32(&d.ok(&reg(1, 0x5006, 1 << 16, 0, 0), 0x20), 0x10);
    ((v >> 8) & 0xf, v & 0xf)
}

/// Polls the model until port 1 is up or 5 s pass.
fn poll_until_up(d: &mut Drv) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while paos_state(d).1 != 1 && std::time::Instant::now() < end {
        d.model.poll();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// QUERY_VPORT_STATE (0x750) of the own vNIC vport: (`admin_state`, `state`).
fn vport_state(d: &mut Drv) -> (u32, u32) {
    let v = be32(&d.ok(&cmd(0x750, 0, 16), 16), 0xc);
    ((v >> 4) & 0xf, v & 0xf)
}

/// QUERY_VPORT_STATE: only op_mod VNIC_VPORT (0) and the own vport; before INIT_HCA refused.
#[test]
fn query_vport_state_takes_the_own_vnic_vport_only() {
    let mut d = Drv::new();
    assert_eq!(d.exec(&cmd(0x750, 0, 16), 16).status(), BAD_SYS_STATE, "before INIT_HCA");
    d.bring_up();
    assert_eq!(vport_state(&mut d).0, 2, "admin_state AUTO");
    for op_mod in [1, 2] {
        assert_eq!(d.exec(&cmd(0x750, op_mod, 16), 16).status(), BAD_PARAM, "op_mod {op_mod}");
    }
    let mut other = cmd(0x750, 0, 16);
    put32(&mut other, 8, (1 << 31) | 1);
    assert_eq!(d.exec(&other, 16).status(), BAD_PARAM, "another vport");
    assert_eq!(d.exec(&cmd(0x750, 0, 16), 8).status(), BAD_OUTP_LEN);
}

fn eqe(d: &Drv, i: u64) -> [u8; 64] {
    let mut e = [0u8; 64];
    d.ram.read(PORT_EQ + 64 * i, &mut e).unwrap();
    e
}

/// Rule: link training by default. The model's default configuration trains for a non-zero time after
/// INIT_HCA: the link is down right after bring-up, then up with a PORT_CHANGE (ACTIVE, port 1) EQE.
#[test]
fn the_link_trains_by_default_and_port_change_reports_it() {
    let default = mlx5_model::ModelConfig::default();
    assert!(!default.link_up_delay.is_zero(), "a real ConnectX-5 takes seconds to train its link");
    assert_eq!(default.link_up_delay, mlx5_model::hca::DEFAULT_LINK_UP_DELAY);
    let cfg = training();
    let mut d = with_port_eq(cfg, PORT_EQ);
    assert_eq!(paos_state(&mut d), (1, 2), "admin up, oper down right after INIT_HCA");
    assert_eq!(vport_state(&mut d), (2, 0), "QUERY_VPORT_STATE: admin AUTO, state down");
    d.model.poll();
    assert_eq!(eqe(&d, 0)[0x3f] & 1, 1, "no EQE while training");
    poll_until_up(&mut d);
    assert_eq!(paos_state(&mut d), (1, 1), "up after the training delay");
    assert_eq!(vport_state(&mut d), (2, 1), "QUERY_VPORT_STATE: state up");
    let e = eqe(&d, 0);
    assert_eq!((e[1], e[3], e[0x28] >> 4, e[63] & 1), (0x09, 4, 1, 0), "PORT_CHANGE ACTIVE, port 1");
    assert_eq!(eqe(&d, 1)[63] & 1, 1, "one event only");
}

/// Rule: `admin_down` (`--admin-down`): the port starts administratively down and stays down (no training, no
/// event) until the driver writes PAOS `admin_status` up (Linux `mlx5_set_port_admin_status`); then it trains
/// and PORT_CHANGE (ACTIVE) reports it.
#[test]
fn an_administratively_down_port_trains_only_after_a_paos_write() {
    let delay = std::time::Duration::from_millis(100);
    let cfg = mlx5_model::ModelConfig { link_up_delay: delay, admin_down: true, ..mlx5_model::ModelConfig::instant() };
    let mut d = with_port_eq(cfg, PORT_EQ);
    assert_eq!(paos_state(&mut d), (2, 2), "admin down, oper down");
    // Longer than the training delay: nothing happens.
    let end = std::time::Instant::now() + 2 * delay;
    while std::time::Instant::now() < end {
        d.model.poll();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(paos_state(&mut d), (2, 2), "still down: nobody brought it up");
    assert_eq!(eqe(&d, 0)[0x3f] & 1, 1, "no EQE");
    // admin_status up with ase.
    d.ok(&reg(0, 0x5006, (1 << 16) | (1 << 8), 1 << 31, 0), 0x20);
    assert_eq!(paos_state(&mut d), (1, 2), "admin up, training");
    poll_until_up(&mut d);
    assert_eq!(paos_state(&mut d), (1, 1));
    let e = eqe(&d, 0);
    assert_eq!((e[1], e[3], e[0x28] >> 4), (0x09, 4, 1), "PORT_CHANGE ACTIVE, port 1");
}

/// Rule: a VF may not write PAOS, and its port follows the PF's; with `admin_down` the model's PF never brings
/// the port up, so the VF's link stays down.
#[test]
fn a_vf_on_an_administratively_down_port_stays_down() {
    let delay = std::time::Duration::from_millis(20);
    let cfg = mlx5_model::ModelConfig {
        vf: true,
        link_up_delay: delay,
        admin_down: true,
        ..mlx5_model::ModelConfig::instant()
    };
    let mut d = with_port_eq(cfg, PORT_EQ);
    let r = d.exec(&reg(0, 0x5006, (1 << 16) | (1 << 8), 1 << 31, 0), 0x20);
    assert_eq!((r.status(), r.syndrome()), (BAD_PARAM, NOT_PERMITTED_FOR_VF));
    std::thread::sleep(3 * delay);
    d.model.poll();
    assert_eq!(paos_state(&mut d), (2, 2));
    assert_eq!(eqe(&d, 0)[0x3f] & 1, 1, "no EQE");
}
