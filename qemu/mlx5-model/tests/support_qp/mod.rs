//! Test-side builders for PD/UAR/MKEY/RC QP commands, written from `mlx5_ifc.h` offsets (docs/reference/mlx5.md §e.2,
//! §e.5) independently of the model's code.
#![allow(dead_code)]

use crate::common::{Drv, be32, cmd, create_eq_cq, put32};

/// `MLX5_SET`: `width` bits at big-endian bit offset `bit` (field within one dword).
pub fn setf(b: &mut [u8], bit: usize, width: u32, v: u32) {
    let at = bit / 32 * 4;
    let shift = 32 - (bit as u32 % 32) - width;
    let mask = if width == 32 { u32::MAX } else { ((1u32 << width) - 1) << shift };
    let d = (be32(b, at) & !mask) | ((v << shift) & mask);
    put32(b, at, d);
}

pub fn getf(b: &[u8], bit: usize, width: u32) -> u32 {
    let shift = 32 - (bit as u32 % 32) - width;
    let mask = if width == 32 { u32::MAX } else { (1u32 << width) - 1 };
    (be32(b, bit / 32 * 4) >> shift) & mask
}

pub const CREATE_QP: u16 = 0x500;
pub const DESTROY_QP: u16 = 0x501;
pub const RST2INIT: u16 = 0x502;
pub const INIT2RTR: u16 = 0x503;
pub const RTR2RTS: u16 = 0x504;
pub const RTS2RTS: u16 = 0x505;
pub const QP_2ERR: u16 = 0x507;
pub const QP_2RST: u16 = 0x50a;
pub const QUERY_QP: u16 = 0x50b;

/// Absolute bit offsets inside create_qp_in / *2*_qp_in / query_qp_out (docs/reference/mlx5.md §e.5 table).
pub mod bit {
    pub const QPN: usize = 0x048;
    pub const OPT_PARAM_MASK: usize = 0x080;
    pub const STATE: usize = 0x0c0;
    pub const ST: usize = 0x0c8;
    pub const PM_STATE: usize = 0x0d3;
    pub const PD: usize = 0x0e8;
    pub const MTU: usize = 0x100;
    pub const LOG_SQ_SIZE: usize = 0x111;
    pub const UAR_PAGE: usize = 0x128;
    pub const TS_FORMAT: usize = 0x118;
    pub const USER_INDEX: usize = 0x148;
    pub const REMOTE_QPN: usize = 0x168;
    pub const PKEY_INDEX: usize = 0x190;
    pub const ACK_TIMEOUT: usize = 0x1c0;
    pub const HOP_LIMIT: usize = 0x1d8;
    pub const RGID: usize = 0x200;
    pub const UDP_SPORT: usize = 0x290;
    pub const VHCA_PORT_NUM: usize = 0x2a8;
    pub const RMAC_47_32: usize = 0x2b0;
    pub const RMAC_31_0: usize = 0x2c0;
    pub const RETRY_COUNT: usize = 0x44d;
    pub const RNR_RETRY: usize = 0x450;
    pub const NEXT_SEND_PSN: usize = 0x488;
    pub const CQN_SND: usize = 0x4a8;
    pub const RRE: usize = 0x550;
    pub const RWE: usize = 0x551;
    pub const MIN_RNR_NAK: usize = 0x563;
    pub const NEXT_RCV_PSN: usize = 0x568;
    pub const CQN_RCV: usize = 0x5a8;
    pub const DBR_ADDR_BYTE: usize = 0xb8;
    pub const RQ_TYPE: usize = 0x625;
}

/// The WQ buffer page and doorbell record of the test QPs (inside the test RAM, above the command area).
pub const WQ_PAGE: u64 = 0x20_0000;
pub const DBR: u64 = 0x1f_f000;

pub fn alloc(d: &mut Drv, opcode: u16) -> u32 {
    be32(&d.ok(&cmd(opcode, 0, 16), 16), 8) & 0xff_ffff
}

pub fn alloc_pd(d: &mut Drv) -> u32 {
    alloc(d, 0x800)
}

pub fn alloc_uar(d: &mut Drv) -> u32 {
    alloc(d, 0x802)
}

/// What a test QP is created on: a PD, a UAR, and the CQ both its queues complete to.
#[derive(Clone, Copy, Debug)]
pub struct Res {
    pub pd: u32,
    pub uar: u32,
    pub eqn: u32,
    pub cqn: u32,
}

/// The appliance side's RoCE address in these tests: RoCEv2 GID `::ffff:192.168.7.2` at index 0.
pub const LOCAL_IP: [u8; 4] = [192, 168, 7, 2];
/// The model's default port MAC (`ModelConfig::default`).
pub const PORT_MAC: [u8; 6] = [0x02, 0x4c, 0x42, 0x00, 0x00, 0x01];

/// SET_ROCE_ADDRESS `index`: a RoCEv2 (2) IPv4 (L3 type 0) entry for `ip` with source MAC `mac`
/// (`set_roce_address_in`, `roce_addr_layout` at 0x10).
pub fn set_roce_ipv4_in(index: u16, ip: [u8; 4], mac: [u8; 6]) -> Vec<u8> {
    let mut s = cmd(0x761, 0, 0x30);
    put32(&mut s, 8, u32::from(index) << 16);
    s[0x1a] = 0xff;
    s[0x1b] = 0xff;
    s[0x1c..0x20].copy_from_slice(&ip);
    put32(&mut s, 0x20, u32::from(u16::from_be_bytes([mac[0], mac[1]])));
    put32(&mut s, 0x24, u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]));
    put32(&mut s, 0x28, 2);
    s
}

/// MODIFY_NIC_VPORT_CONTEXT selecting `roce_en` = `on`.
pub fn roce_en_in(on: bool) -> Vec<u8> {
    let mut m = cmd(0x755, 0, 0x200);
    put32(&mut m, 0xc, 1 << 1);
    put32(&mut m, 0x100, on.into());
    m
}

/// RoCE enabled on the vport and GID index 0 = [`LOCAL_IP`] on the port MAC.
pub fn roce_port(d: &mut Drv) {
    d.ok(&roce_en_in(true), 16);
    d.ok(&set_roce_ipv4_in(0, LOCAL_IP, PORT_MAC), 16);
}

/// ALLOC_PD, ALLOC_UAR, CREATE_EQ and CREATE_CQ (the QP's send and receive CQ), all through real commands;
/// RoCE enabled on the vport and GID index 0 written ([`LOCAL_IP`]), as a driver does before its first QP.
pub fn setup(d: &mut Drv) -> Res {
    roce_port(d);
    let pd = alloc_pd(d);
    let uar = alloc_uar(d);
    let (eqn, cqn) = create_eq_cq(d, uar);
    Res { pd, uar, eqn, cqn }
}

/// A minimal RC QP as the VFIO selftest builds it: 16 SQ WQEBBs, zero-length RQ, one PAS page.
pub fn create_qp_in(r: Res) -> Vec<u8> {
    let mut c = cmd(CREATE_QP, 0, 0x110 + 8);
    setf(&mut c, bit::ST, 8, 0);
    setf(&mut c, bit::PM_STATE, 2, 3);
    setf(&mut c, bit::PD, 24, r.pd);
    setf(&mut c, bit::UAR_PAGE, 24, r.uar);
    setf(&mut c, bit::LOG_SQ_SIZE, 4, 4);
    setf(&mut c, bit::RQ_TYPE, 3, 3);
    setf(&mut c, bit::CQN_SND, 24, r.cqn);
    setf(&mut c, bit::CQN_RCV, 24, r.cqn);
    // Both profiles report CQE version 1: a kernel QP's user_index (MLX5_IB_DEFAULT_UIDX).
    setf(&mut c, bit::USER_INDEX, 24, 0xff_ffff);
    c[bit::DBR_ADDR_BYTE..bit::DBR_ADDR_BYTE + 8].copy_from_slice(&DBR.to_be_bytes());
    c[0x110..0x118].copy_from_slice(&WQ_PAGE.to_be_bytes());
    c
}

pub fn create_qp(d: &mut Drv, r: Res) -> u32 {
    be32(&d.ok(&create_qp_in(r), 16), 8) & 0xff_ffff
}

/// The input of a modify command with the fields Linux repeats on every modify.
pub fn modify_in(opcode: u16, qpn: u32, r: Res) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 0x110);
    setf(&mut c, bit::QPN, 24, qpn);
    setf(&mut c, bit::PM_STATE, 2, 3);
    setf(&mut c, bit::PD, 24, r.pd);
    setf(&mut c, bit::CQN_SND, 24, r.cqn);
    setf(&mut c, bit::CQN_RCV, 24, r.cqn);
    c
}

pub fn rst2init_in(qpn: u32, r: Res) -> Vec<u8> {
    let mut c = modify_in(RST2INIT, qpn, r);
    setf(&mut c, bit::VHCA_PORT_NUM, 8, 1);
    setf(&mut c, bit::RRE, 1, 1);
    setf(&mut c, bit::RWE, 1, 1);
    c
}

/// INIT2RTR toward `remote_qpn` at 192.168.7.1 (IPv4-mapped GID), path MTU 1024, expecting `rcv_psn`.
pub fn init2rtr_in(qpn: u32, r: Res, remote_qpn: u32, rcv_psn: u32) -> Vec<u8> {
    let mut c = modify_in(INIT2RTR, qpn, r);
    setf(&mut c, bit::MTU, 3, 3);
    setf(&mut c, bit::REMOTE_QPN, 24, remote_qpn);
    setf(&mut c, bit::NEXT_RCV_PSN, 24, rcv_psn);
    setf(&mut c, bit::MIN_RNR_NAK, 5, 12);
    setf(&mut c, bit::VHCA_PORT_NUM, 8, 1);
    setf(&mut c, bit::HOP_LIMIT, 8, 64);
    setf(&mut c, bit::UDP_SPORT, 16, 0xc123);
    let g = bit::RGID / 8;
    c[g..g + 16].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 1]);
    setf(&mut c, bit::RMAC_47_32, 16, 0x02aa);
    setf(&mut c, bit::RMAC_31_0, 32, 0x0000_0001);
    c
}

pub fn rtr2rts_in(qpn: u32, r: Res, send_psn: u32) -> Vec<u8> {
    let mut c = modify_in(RTR2RTS, qpn, r);
    setf(&mut c, bit::ACK_TIMEOUT, 5, 14);
    setf(&mut c, bit::RETRY_COUNT, 3, 7);
    setf(&mut c, bit::RNR_RETRY, 3, 7);
    setf(&mut c, bit::NEXT_SEND_PSN, 24, send_psn);
    c
}

pub fn short_in(opcode: u16, qpn: u32) -> Vec<u8> {
    let mut c = cmd(opcode, 0, 16);
    setf(&mut c, bit::QPN, 24, qpn);
    c
}

/// QUERY_QP output (0x1d0 bytes, `query_qp_out`).
pub fn query_qp(d: &mut Drv, qpn: u32) -> Vec<u8> {
    d.ok(&short_in(QUERY_QP, qpn), 0x1d0)
}

pub fn qp_state(d: &mut Drv, qpn: u32) -> u32 {
    getf(&query_qp(d, qpn), bit::STATE, 4)
}

/// CREATE_MKEY in MTT mode with remote read/write, variant 0x5a, 4 KiB pages; returns the whole key.
pub fn create_mkey_mtt(d: &mut Drv, pd: u32, start: u64, len: u64, mtt: &[u64]) -> u32 {
    let index = be32(&d.ok(&crate::common::create_mkey_in(pd, 1, start, len, mtt), 16), 8) & 0xff_ffff;
    (index << 8) | 0x5a
}

pub fn destroy_mkey(d: &mut Drv, key: u32) {
    let mut c = cmd(0x202, 0, 16);
    put32(&mut c, 8, key >> 8);
    d.ok(&c, 16);
}
