//! Completion queues (`mlx5_ifc.h`: `create_cq_in/out`, `cqc`, `destroy_cq_in`, `query_cq_in/out`) and the
//! 64-byte CQE (`device.h` `struct mlx5_cqe64` / `struct mlx5_err_cqe`, opcodes and syndromes from `cq.h`;
//! docs/reference/mlx5.md §e.4, §f.2, §f.4).

use crate::command::{Command, Output};
use crate::field::{Field, Field64};
use crate::handles::{Cqn, Eqn, UarPage};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID, PAS, PAS_OFFSET, put_pas, with_pas};

pub use crate::ifc::opcode::{MLX5_CMD_OP_CREATE_CQ, MLX5_CMD_OP_DESTROY_CQ, MLX5_CMD_OP_QUERY_CQ};

/// `query_cq_out` up to its `pas[]`.
pub const QUERY_CQ_OUT_LEN: usize = 0x110;

/// `cqc.cqe_sz` (`cq.h` `CQE_STRIDE_*`).
pub const CQE_STRIDE_64: u8 = 0;
pub const CQE_STRIDE_128: u8 = 1;

/// CQE opcodes (`cq.h:82-94`, op_own bits 7:4).
pub const MLX5_CQE_REQ: u8 = 0;
pub const MLX5_CQE_RESP_WR_IMM: u8 = 1;
pub const MLX5_CQE_RESP_SEND: u8 = 2;
pub const MLX5_CQE_RESP_SEND_IMM: u8 = 3;
pub const MLX5_CQE_RESP_SEND_INV: u8 = 4;
pub const MLX5_CQE_RESIZE_CQ: u8 = 5;
pub const MLX5_CQE_REQ_ERR: u8 = 13;
pub const MLX5_CQE_RESP_ERR: u8 = 14;
pub const MLX5_CQE_INVALID: u8 = 15;

/// Error CQE syndromes (`cq.h:66-80`).
pub const MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR: u8 = 0x01;
pub const MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR: u8 = 0x02;
pub const MLX5_CQE_SYNDROME_LOCAL_PROT_ERR: u8 = 0x04;
pub const MLX5_CQE_SYNDROME_WR_FLUSH_ERR: u8 = 0x05;
pub const MLX5_CQE_SYNDROME_MW_BIND_ERR: u8 = 0x06;
pub const MLX5_CQE_SYNDROME_BAD_RESP_ERR: u8 = 0x10;
pub const MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR: u8 = 0x11;
pub const MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR: u8 = 0x12;
pub const MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR: u8 = 0x13;
pub const MLX5_CQE_SYNDROME_REMOTE_OP_ERR: u8 = 0x14;
pub const MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
pub const MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR: u8 = 0x16;
pub const MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR: u8 = 0x22;

pub const CQE_SIZE: usize = 64;
/// Byte of `op_own` in a 64-byte CQE.
pub const CQE_OP_OWN_BYTE: usize = 0x3f;
/// What every CQE's `op_own` is set to before CREATE_CQ: opcode INVALID, owner 1 (Linux `core/wc.c`).
pub const CQE_INIT_OP_OWN: u8 = 0xf1;

/// UAR page offset of the CQ doorbell (`MLX5_CQ_DOORBELL`, 64-bit write: arm word then CQN).
pub const MLX5_CQ_DOORBELL: usize = 0x20;
/// CQ arm commands (`cq.h:146-149`): any next completion, or solicited only.
pub const MLX5_CQ_DB_REQ_NOT: u32 = 0;
pub const MLX5_CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;

/// The arm word for the CQ doorbell record (dword 1) and the UAR doorbell's high dword:
/// `sn << 28 | cmd | ci & 0xffffff` (`cq.h` `mlx5_cq_arm`).
pub const fn cq_arm_value(sn: u8, cmd: u32, ci: u32) -> u32 {
    (((sn & 3) as u32) << 28) | cmd | (ci & 0x00ff_ffff)
}

/// What to create a CQ with. `log_page_size` is log2(page / 4 KiB).
#[derive(Clone, Copy, Debug)]
pub struct CqParams<'a> {
    pub log_cq_size: u8,
    pub uar_page: UarPage,
    pub eqn: Eqn,
    pub log_page_size: u8,
    /// `CQE_STRIDE_64` or `CQE_STRIDE_128`.
    pub cqe_sz: u8,
    /// Device address of the 8-byte doorbell record (`set_ci`, `arm`).
    pub dbr_addr: u64,
    pub pages: &'a [u64],
}

/// `cqc`, offsets from its start; it sits at bit 0x80 ([`CQC`]) of `create_cq_in` and `query_cq_out`.
pub mod cqc {
    use super::{Field, Field64};
    pub const STATUS: Field = Field::new(0x00, 4);
    pub const CQE_SZ: Field = Field::new(0x08, 3);
    pub const LOG_CQ_SIZE: Field = Field::new(0x63, 5);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    /// `c_eqn_or_apu_element`: the EQ completions are reported to.
    pub const C_EQN: Field = Field::new(0xa0, 32);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xc3, 5);
    pub const CONSUMER_COUNTER: Field = Field::new(0x148, 24);
    pub const PRODUCER_COUNTER: Field = Field::new(0x168, 24);
    pub const DBR_ADDR: Field64 = Field64::new(0x1c0);
}

/// Bit offset of `cqc` in `create_cq_in` / `query_cq_out`.
pub const CQC: usize = 0x80;
/// `create_cq_out.cqn`, `destroy_cq_in.cqn`, `query_cq_in.cqn`.
const CQN: Field = OBJECT_ID;

/// CREATE_CQ: `cqc` at bit 0x80, `pas[]` at byte 0x110.
pub fn create_cq(p: &CqParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_CQ, 0, with_pas(PAS_OFFSET, p.pages.len()), CMD_HDR_LEN)
        .with("log_cq_size", p.log_cq_size.into())
        .with("eqn", p.eqn.0.into())
        .with("uar", p.uar_page.0.into());
    c.set(cqc::CQE_SZ.at(CQC), p.cqe_sz.into());
    c.set(cqc::LOG_CQ_SIZE.at(CQC), p.log_cq_size.into());
    c.set(cqc::UAR_PAGE.at(CQC), p.uar_page.0);
    c.set(cqc::C_EQN.at(CQC), p.eqn.0);
    c.set(cqc::LOG_PAGE_SIZE.at(CQC), p.log_page_size.into());
    c.set64(cqc::DBR_ADDR.at(CQC), p.dbr_addr);
    put_pas(&mut c, PAS, p.pages);
    c
}

pub fn parse_create_cq(out: &Output) -> Cqn {
    Cqn(out.get(CQN))
}

pub fn destroy_cq(cqn: impl Into<Cqn>) -> Command {
    let cqn: Cqn = cqn.into();
    let mut c = Command::new(MLX5_CMD_OP_DESTROY_CQ, 0, CMD_HDR_LEN, CMD_HDR_LEN).with("cqn", cqn.0.into());
    c.set(CQN, cqn.0);
    c
}

pub fn query_cq(cqn: impl Into<Cqn>) -> Command {
    let cqn: Cqn = cqn.into();
    let mut c = Command::new(MLX5_CMD_OP_QUERY_CQ, 0, CMD_HDR_LEN, QUERY_CQ_OUT_LEN).with("cqn", cqn.0.into());
    c.set(CQN, cqn.0);
    c
}

/// The `cqc` QUERY_CQ returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqInfo {
    pub status: u8,
    pub cqe_sz: u8,
    pub log_cq_size: u8,
    pub uar_page: UarPage,
    pub eqn: Eqn,
    pub log_page_size: u8,
    pub consumer_counter: u32,
    pub producer_counter: u32,
    pub dbr_addr: u64,
}

pub fn parse_query_cq(out: &Output) -> CqInfo {
    let g = |f: Field| out.get(f.at(CQC));
    CqInfo {
        status: g(cqc::STATUS) as u8,
        cqe_sz: g(cqc::CQE_SZ) as u8,
        log_cq_size: g(cqc::LOG_CQ_SIZE) as u8,
        uar_page: UarPage(g(cqc::UAR_PAGE)),
        eqn: Eqn(g(cqc::C_EQN)),
        log_page_size: g(cqc::LOG_PAGE_SIZE) as u8,
        consumer_counter: g(cqc::CONSUMER_COUNTER),
        producer_counter: g(cqc::PRODUCER_COUNTER),
        dbr_addr: out.get64(cqc::DBR_ADDR.at(CQC)),
    }
}

/// A 64-byte CQE (`mlx5_cqe64`; for error opcodes the `mlx5_err_cqe` fields are meaningful).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// `op_own` bits 7:4.
    pub opcode: u8,
    /// `op_own` bit 0.
    pub owner: bool,
    /// `sop_drop_qpn` / `s_wqe_opcode_qpn` bits 23:0.
    pub qpn: u32,
    /// `s_wqe_opcode_qpn` bits 31:24 (error CQEs: the opcode of the failed WQE).
    pub wqe_opcode: u8,
    pub wqe_counter: u16,
    pub byte_cnt: u32,
    /// `immediate` / `inval_rkey`.
    pub immediate: u32,
    /// `mlx5_err_cqe.syndrome` (byte 0x37).
    pub syndrome: u8,
    /// `mlx5_err_cqe.vendor_err_synd` (byte 0x36).
    pub vendor_err_synd: u8,
}

impl Cqe {
    /// Reads a 64-byte CQE (`bytes` must hold at least 64; with 128-byte CQEs pass the second half).
    pub fn parse(b: &[u8]) -> Cqe {
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let op_own = b[CQE_OP_OWN_BYTE];
        Cqe {
            opcode: op_own >> 4,
            owner: op_own & 1 != 0,
            qpn: be32(0x38) & 0x00ff_ffff,
            wqe_opcode: b[0x38],
            wqe_counter: u16::from_be_bytes([b[0x3c], b[0x3d]]),
            byte_cnt: be32(0x2c),
            immediate: be32(0x24),
            syndrome: b[0x37],
            vendor_err_synd: b[0x36],
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self.opcode, MLX5_CQE_REQ_ERR | MLX5_CQE_RESP_ERR)
    }

    /// Whether the CQE at consumer counter `cc` belongs to software (`core/wq.h`, `infiniband/hw/mlx5/cq.c`):
    /// not INVALID and owner == bit `log_cq_size` of `cc`.
    pub fn is_sw_owned(&self, cc: u32, log_cq_size: u8) -> bool {
        self.opcode != MLX5_CQE_INVALID && self.owner == ((cc >> log_cq_size) & 1 != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64, out};

    #[test]
    fn create_cq_fields() {
        let c = create_cq(&CqParams {
            log_cq_size: 8,
            uar_page: UarPage(0x11),
            eqn: Eqn(0x10),
            log_page_size: 2,
            cqe_sz: CQE_STRIDE_64,
            dbr_addr: 0x1234_5678_9ab8,
            pages: &[0x40_0000],
        });
        let b = c.input();
        assert_eq!(be16(b, 0), 0x400);
        assert_eq!(b.len(), 0x118);
        assert_eq!(be32(b, 0x10), 0); // cqe_sz 0 in dword 4 [23:21]
        assert_eq!(be32(b, 0x1c), (8 << 24) | 0x11);
        assert_eq!(be32(b, 0x24), 0x10);
        assert_eq!(be32(b, 0x28), 2 << 24);
        assert_eq!(be64(b, 0x48), 0x1234_5678_9ab8);
        assert_eq!(be64(b, 0x110), 0x40_0000);
        let c = create_cq(&CqParams {
            cqe_sz: CQE_STRIDE_128,
            ..CqParams {
                log_cq_size: 0,
                uar_page: UarPage(0),
                eqn: Eqn(0),
                log_page_size: 0,
                cqe_sz: 0,
                dbr_addr: 0,
                pages: &[],
            }
        });
        assert_eq!(be32(c.input(), 0x10), 1 << 21);
        assert_eq!(parse_create_cq(&out(0x10, &[(0x08, &[0, 0, 0, 9])])), Cqn(9));
    }

    #[test]
    fn destroy_query_cq() {
        let d = destroy_cq(Cqn(0x12_3456));
        assert_eq!((be16(d.input(), 0), be32(d.input(), 8)), (0x401, 0x12_3456));
        let q = query_cq(Cqn(5));
        assert_eq!((be16(q.input(), 0), be32(q.input(), 8), q.out_len()), (0x402, 5, 0x110));
        let o = out(
            0x110,
            &[
                (0x10, &[0, 0x20, 0, 0]),
                (0x1c, &[6, 0, 0, 0x10]),
                (0x24, &[0, 0, 0, 0x11]),
                (0x38, &[0, 0, 0, 3]),
                (0x3c, &[0, 0, 0, 4]),
                (0x48, &0x8000u64.to_be_bytes()),
            ],
        );
        let i = parse_query_cq(&o);
        assert_eq!((i.cqe_sz, i.log_cq_size, i.uar_page, i.eqn), (1, 6, UarPage(0x10), Eqn(0x11)));
        assert_eq!((i.consumer_counter, i.producer_counter, i.dbr_addr), (3, 4, 0x8000));
    }

    #[test]
    fn cqe_parse() {
        let mut b = [0u8; 64];
        b[0x2c..0x30].copy_from_slice(&4096u32.to_be_bytes());
        b[0x36] = 0x7;
        b[0x37] = MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
        b[0x38..0x3c].copy_from_slice(&[0x08, 0, 0x01, 0x02]);
        b[0x3c..0x3e].copy_from_slice(&[0, 9]);
        b[0x3f] = 0xe1;
        let c = Cqe::parse(&b);
        assert_eq!((c.opcode, c.owner, c.qpn, c.wqe_opcode), (MLX5_CQE_RESP_ERR, true, 0x102, 8));
        assert_eq!((c.wqe_counter, c.byte_cnt, c.syndrome, c.vendor_err_synd), (9, 4096, 5, 7));
        assert!(c.is_error());
        assert!(c.is_sw_owned(1 << 4, 4) && !c.is_sw_owned(0, 4));
        let mut fresh = [0u8; 64];
        fresh[0x3f] = CQE_INIT_OP_OWN;
        let f = Cqe::parse(&fresh);
        assert_eq!(f.opcode, MLX5_CQE_INVALID);
        assert!(!f.is_sw_owned(0, 4) && !f.is_sw_owned(16, 4));
        assert_eq!(cq_arm_value(1, MLX5_CQ_DB_REQ_NOT_SOL, 0x1ff_ffff), 0x11ff_ffff);
    }
}
