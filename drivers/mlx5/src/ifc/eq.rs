//! Event queues (`mlx5_ifc.h`: `create_eq_in/out`, `eqc`, `destroy_eq_in`, `query_eq_in/out`, `eqe`,
//! `pages_req_event`, `cmd_inter_comp_event`, `comp_event`, `qp_events`, `cq_error`,
//! `port_state_change_event`), the event types of `device.h` `enum mlx5_event`, and the EQ doorbell in the
//! UAR page (docs/reference/mlx5.md §f.4, Linux `core/lib/eq.h` `eq_update_ci`).

use crate::command::{Command, Output};
use crate::field::{Field, Field64};
use crate::handles::{Cqn, Eqn, UarPage};
use crate::ifc::init::PageDemand;
use crate::ifc::{CMD_HDR_LEN, PAS, PAS_OFFSET, put_pas, with_pas};

pub use crate::ifc::opcode::{MLX5_CMD_OP_CREATE_EQ, MLX5_CMD_OP_DESTROY_EQ, MLX5_CMD_OP_QUERY_EQ};

/// `query_eq_out` up to its `pas[]`.
pub const QUERY_EQ_OUT_LEN: usize = 0x110;

/// `enum mlx5_event` (`device.h:313-365`).
pub const MLX5_EVENT_TYPE_COMP: u8 = 0x00;
pub const MLX5_EVENT_TYPE_PATH_MIG: u8 = 0x01;
pub const MLX5_EVENT_TYPE_COMM_EST: u8 = 0x02;
pub const MLX5_EVENT_TYPE_SQ_DRAINED: u8 = 0x03;
pub const MLX5_EVENT_TYPE_CQ_ERROR: u8 = 0x04;
pub const MLX5_EVENT_TYPE_WQ_CATAS_ERROR: u8 = 0x05;
pub const MLX5_EVENT_TYPE_PATH_MIG_FAILED: u8 = 0x07;
pub const MLX5_EVENT_TYPE_INTERNAL_ERROR: u8 = 0x08;
pub const MLX5_EVENT_TYPE_PORT_CHANGE: u8 = 0x09;
pub const MLX5_EVENT_TYPE_CMD: u8 = 0x0a;
pub const MLX5_EVENT_TYPE_PAGE_REQUEST: u8 = 0x0b;
pub const MLX5_EVENT_TYPE_PAGE_FAULT: u8 = 0x0c;
pub const MLX5_EVENT_TYPE_NIC_VPORT_CHANGE: u8 = 0x0d;
pub const MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR: u8 = 0x10;
pub const MLX5_EVENT_TYPE_WQ_ACCESS_ERROR: u8 = 0x11;
pub const MLX5_EVENT_TYPE_SRQ_CATAS_ERROR: u8 = 0x12;
pub const MLX5_EVENT_TYPE_SRQ_LAST_WQE: u8 = 0x13;
pub const MLX5_EVENT_TYPE_SRQ_RQ_LIMIT: u8 = 0x14;
pub const MLX5_EVENT_TYPE_GENERAL_EVENT: u8 = 0x22;

/// Port change sub-types (`device.h` `MLX5_PORT_CHANGE_SUBTYPE_*`).
pub const MLX5_PORT_CHANGE_SUBTYPE_DOWN: u8 = 1;
pub const MLX5_PORT_CHANGE_SUBTYPE_ACTIVE: u8 = 4;

/// The event bitmask bit for event type `t` (< 64; `event_bitmask[0]`).
pub const fn event_bit(t: u8) -> u64 {
    1u64 << t
}

/// Linux `MLX5_ASYNC_EVENT_MASK` base (`core/eq.c:69-80`): QP/SRQ events, CQ error, port change.
pub const ASYNC_EVENT_MASK: u64 = event_bit(MLX5_EVENT_TYPE_PATH_MIG)
    | event_bit(MLX5_EVENT_TYPE_COMM_EST)
    | event_bit(MLX5_EVENT_TYPE_SQ_DRAINED)
    | event_bit(MLX5_EVENT_TYPE_CQ_ERROR)
    | event_bit(MLX5_EVENT_TYPE_WQ_CATAS_ERROR)
    | event_bit(MLX5_EVENT_TYPE_PATH_MIG_FAILED)
    | event_bit(MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR)
    | event_bit(MLX5_EVENT_TYPE_WQ_ACCESS_ERROR)
    | event_bit(MLX5_EVENT_TYPE_PORT_CHANGE)
    | event_bit(MLX5_EVENT_TYPE_SRQ_CATAS_ERROR)
    | event_bit(MLX5_EVENT_TYPE_SRQ_LAST_WQE)
    | event_bit(MLX5_EVENT_TYPE_SRQ_RQ_LIMIT);

/// Size of one EQE.
pub const EQE_SIZE: usize = 64;
/// Byte of the EQE holding `owner` (bit 0); Linux initialises every entry with owner = 1.
pub const EQE_OWNER_BYTE: usize = 0x3f;
pub const EQE_INIT_OWNER: u8 = 1;

/// UAR page offsets of the EQ doorbell (`core/eq.c:35`, `core/lib/eq.h:68-76`): update CI and re-arm, or
/// update CI only.
pub const MLX5_EQ_DOORBEL_OFFSET_ARM: usize = 0x40;
pub const MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI: usize = 0x48;

/// The 32-bit value written (big-endian) at either EQ doorbell: `eqn << 24 | ci & 0xffffff`.
pub const fn eq_doorbell_value(eqn: Eqn, ci: u32) -> u32 {
    ((eqn.0 & 0xff) << 24) | (ci & 0x00ff_ffff)
}

/// What to create an EQ with. `log_page_size` is log2(page / 4 KiB), as `eqc.log_page_size` wants.
#[derive(Clone, Copy, Debug)]
pub struct EqParams<'a> {
    /// log2 of the number of 64-byte entries.
    pub log_eq_size: u8,
    pub uar_page: UarPage,
    /// MSI-X vector (`eqc.intr`); 0 when polled.
    pub intr: u16,
    pub log_page_size: u8,
    /// `event_bitmask[0]`: bit t subscribes event type t.
    pub event_mask: u64,
    /// Device addresses of the ring's pages, each `4 KiB << log_page_size` bytes and aligned to it.
    pub pages: &'a [u64],
}

/// `eqc`, offsets from its start; it sits at bit 0x80 ([`EQC`]) of `create_eq_in` and `query_eq_out`.
pub mod eqc {
    use super::Field;
    pub const STATUS: Field = Field::new(0x00, 4);
    pub const LOG_EQ_SIZE: Field = Field::new(0x63, 5);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const INTR: Field = Field::new(0xb4, 12);
    pub const LOG_PAGE_SIZE: Field = Field::new(0xc3, 5);
    pub const CONSUMER_COUNTER: Field = Field::new(0x148, 24);
    pub const PRODUCER_COUNTER: Field = Field::new(0x168, 24);
}

/// Bit offset of `eqc` in `create_eq_in` / `query_eq_out`.
pub const EQC: usize = 0x80;
/// `create_eq_in.event_bitmask[0]` and `query_eq_out.event_bitmask` (byte 0x58).
const EVENT_BITMASK: Field64 = Field64::new(0x2c0);
/// `create_eq_out.eq_number`, `destroy_eq_in.eq_number`, `query_eq_in.eq_number`.
const EQ_NUMBER: Field = Field::new(0x58, 8);

/// CREATE_EQ: `eqc` at bit 0x80, `event_bitmask[0]` at byte 0x58, `pas[]` at byte 0x110.
pub fn create_eq(p: &EqParams<'_>) -> Command {
    let mut c = Command::new(MLX5_CMD_OP_CREATE_EQ, 0, with_pas(PAS_OFFSET, p.pages.len()), CMD_HDR_LEN)
        .with("log_eq_size", p.log_eq_size.into())
        .with("uar", p.uar_page.0.into())
        .with("mask", p.event_mask);
    c.set(eqc::LOG_EQ_SIZE.at(EQC), p.log_eq_size.into());
    c.set(eqc::UAR_PAGE.at(EQC), p.uar_page.0);
    c.set(eqc::INTR.at(EQC), p.intr.into());
    c.set(eqc::LOG_PAGE_SIZE.at(EQC), p.log_page_size.into());
    c.set64(EVENT_BITMASK, p.event_mask);
    put_pas(&mut c, PAS, p.pages);
    c
}

pub fn parse_create_eq(out: &Output) -> Eqn {
    Eqn(out.get(EQ_NUMBER))
}

pub fn destroy_eq(eqn: impl Into<Eqn>) -> Command {
    let eqn: Eqn = eqn.into();
    let mut c = Command::new(MLX5_CMD_OP_DESTROY_EQ, 0, CMD_HDR_LEN, CMD_HDR_LEN).with("eqn", eqn.0.into());
    c.set(EQ_NUMBER, eqn.0);
    c
}

pub fn query_eq(eqn: impl Into<Eqn>) -> Command {
    let eqn: Eqn = eqn.into();
    let mut c = Command::new(MLX5_CMD_OP_QUERY_EQ, 0, CMD_HDR_LEN, QUERY_EQ_OUT_LEN).with("eqn", eqn.0.into());
    c.set(EQ_NUMBER, eqn.0);
    c
}

/// The `eqc` and bitmask QUERY_EQ returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EqInfo {
    pub status: u8,
    pub log_eq_size: u8,
    pub uar_page: UarPage,
    pub intr: u16,
    pub log_page_size: u8,
    pub consumer_counter: u32,
    pub producer_counter: u32,
    pub event_mask: u64,
}

pub fn parse_query_eq(out: &Output) -> EqInfo {
    let g = |f: Field| out.get(f.at(EQC));
    EqInfo {
        status: g(eqc::STATUS) as u8,
        log_eq_size: g(eqc::LOG_EQ_SIZE) as u8,
        uar_page: UarPage(g(eqc::UAR_PAGE)),
        intr: g(eqc::INTR) as u16,
        log_page_size: g(eqc::LOG_PAGE_SIZE) as u8,
        consumer_counter: g(eqc::CONSUMER_COUNTER),
        producer_counter: g(eqc::PRODUCER_COUNTER),
        event_mask: out.get64(EVENT_BITMASK),
    }
}

/// The page request in an EQE's 64 bytes, if it is one (type 0xB).
pub fn page_request(eqe: &[u8]) -> Option<PageDemand> {
    match Eqe::parse(eqe).event() {
        Event::PageRequest { function_id, num_pages, .. } => Some(PageDemand { function_id, num_pages }),
        _ => None,
    }
}

/// The `event_data` union of an EQE (28 bytes from EQE byte 0x20), the fields of each member the driver reads,
/// offsets from the union's start.
pub mod event_data {
    use super::Field;
    /// `comp_event.cq_number`.
    pub const COMP_CQ_NUMBER: Field = Field::new(0xc8, 24);
    /// `cmd_inter_comp_event.command_completion_vector`.
    pub const COMMAND_COMPLETION_VECTOR: Field = Field::new(0x00, 32);
    /// `pages_req_event.ec_function`, `function_id`, `num_pages`.
    pub const PAGES_EC_FUNCTION: Field = Field::new(0x00, 1);
    pub const PAGES_FUNCTION_ID: Field = Field::new(0x10, 16);
    pub const PAGES_NUM_PAGES: Field = Field::new(0x20, 32);
    /// `cq_error.cqn`, `cq_error.syndrome`.
    pub const CQ_ERROR_CQN: Field = Field::new(0x08, 24);
    pub const CQ_ERROR_SYNDROME: Field = Field::new(0x58, 8);
    /// `port_state_change_event.port_num`.
    pub const PORT_NUM: Field = Field::new(0x40, 4);
    /// `qp_events.type` (the resource type) and `qp_events.qpn_rqn_sqn`.
    pub const QP_TYPE: Field = Field::new(0xa0, 8);
    pub const QP_QPN_RQN_SQN: Field = Field::new(0xc8, 24);
}

/// One EQE as read from the ring (`eqe`: `event_type` byte 1, `event_sub_type` byte 3, `event_data` bytes
/// 0x20..0x3c, `owner` byte 0x3f bit 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eqe {
    pub event_type: u8,
    pub sub_type: u8,
    pub owner: bool,
    pub data: [u8; 28],
}

/// An EQE decoded by type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Type 0x0 (`comp_event.cq_number`, data bits 0xc8.. 24 wide).
    Completion {
        cqn: Cqn,
    },
    /// Type 0xA: bitmap of command slots that completed (`command_completion_vector`).
    Command {
        slots: u32,
    },
    /// Type 0xB (`pages_req_event`): `num_pages` > 0 wants pages, < 0 offers them back.
    PageRequest {
        ec_function: bool,
        function_id: u16,
        num_pages: i32,
    },
    /// QP/SRQ events (`qp_events`): `type` is the resource type (0 QP, 1 RQ, 2 SQ…).
    Qp {
        event_type: u8,
        resource_type: u8,
        qpn: u32,
    },
    /// Type 0x4 (`cq_error`): 1 overrun, 2 access violation.
    CqError {
        cqn: Cqn,
        syndrome: u8,
    },
    /// Type 0x9 (`port_state_change_event.port_num`; sub_type 1 down, 4 active).
    PortChange {
        port: u8,
        sub_type: u8,
    },
    Other {
        event_type: u8,
        sub_type: u8,
    },
}

impl Eqe {
    /// Reads an EQE from its 64 bytes (`bytes` must hold at least 64).
    pub fn parse(bytes: &[u8]) -> Eqe {
        let mut data = [0u8; 28];
        data.copy_from_slice(&bytes[0x20..0x3c]);
        Eqe { event_type: bytes[1], sub_type: bytes[3], owner: bytes[EQE_OWNER_BYTE] & 1 != 0, data }
    }

    /// Whether the entry at consumer index `ci` belongs to software (`core/lib/eq.h` `next_eqe_sw`): its
    /// owner bit equals bit `log_eq_size` of `ci`.
    pub fn is_sw_owned(&self, ci: u32, log_eq_size: u8) -> bool {
        self.owner == ((ci >> log_eq_size) & 1 != 0)
    }

    fn data_get(&self, f: Field) -> u32 {
        f.read(&self.data)
    }

    pub fn event(&self) -> Event {
        let t = self.event_type;
        match t {
            MLX5_EVENT_TYPE_COMP => Event::Completion { cqn: Cqn(self.data_get(event_data::COMP_CQ_NUMBER)) },
            MLX5_EVENT_TYPE_CMD => Event::Command { slots: self.data_get(event_data::COMMAND_COMPLETION_VECTOR) },
            MLX5_EVENT_TYPE_PAGE_REQUEST => Event::PageRequest {
                ec_function: self.data_get(event_data::PAGES_EC_FUNCTION) != 0,
                function_id: self.data_get(event_data::PAGES_FUNCTION_ID) as u16,
                num_pages: self.data_get(event_data::PAGES_NUM_PAGES) as i32,
            },
            MLX5_EVENT_TYPE_CQ_ERROR => Event::CqError {
                cqn: Cqn(self.data_get(event_data::CQ_ERROR_CQN)),
                syndrome: self.data_get(event_data::CQ_ERROR_SYNDROME) as u8,
            },
            MLX5_EVENT_TYPE_PORT_CHANGE => {
                Event::PortChange { port: self.data_get(event_data::PORT_NUM) as u8, sub_type: self.sub_type }
            }
            MLX5_EVENT_TYPE_PATH_MIG
            | MLX5_EVENT_TYPE_COMM_EST
            | MLX5_EVENT_TYPE_SQ_DRAINED
            | MLX5_EVENT_TYPE_WQ_CATAS_ERROR
            | MLX5_EVENT_TYPE_PATH_MIG_FAILED
            | MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR
            | MLX5_EVENT_TYPE_WQ_ACCESS_ERROR
            | MLX5_EVENT_TYPE_SRQ_CATAS_ERROR
            | MLX5_EVENT_TYPE_SRQ_LAST_WQE
            | MLX5_EVENT_TYPE_SRQ_RQ_LIMIT => Event::Qp {
                event_type: t,
                resource_type: self.data_get(event_data::QP_TYPE) as u8,
                qpn: self.data_get(event_data::QP_QPN_RQN_SQN),
            },
            _ => Event::Other { event_type: t, sub_type: self.sub_type },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, be64, out};

    #[test]
    fn create_eq_fields() {
        let pages = [0x10_0000u64, 0x20_0000];
        let mask = event_bit(MLX5_EVENT_TYPE_CMD) | event_bit(MLX5_EVENT_TYPE_PAGE_REQUEST);
        let c = create_eq(&EqParams {
            log_eq_size: 7,
            uar_page: UarPage(0x12),
            intr: 3,
            log_page_size: 0,
            event_mask: mask,
            pages: &pages,
        });
        let b = c.input();
        assert_eq!(be16(b, 0), 0x301);
        assert_eq!(b.len(), 0x110 + 16);
        // eqc dword 7 (byte 0x1c): log_eq_size [28:24], uar_page [23:0].
        assert_eq!(be32(b, 0x1c), (7 << 24) | 0x12);
        // eqc dword 9 (byte 0x24): intr [11:0].
        assert_eq!(be32(b, 0x24), 3);
        assert_eq!(be32(b, 0x28), 0);
        // CMD (0xA) is byte 0x5e bit 2, PAGE_REQUEST (0xB) byte 0x5e bit 3 (docs/reference/mlx5.md §e.3).
        assert_eq!(b[0x5e], 0x0c);
        assert_eq!(be64(b, 0x58), 0xc00);
        assert_eq!(be64(b, 0x110), 0x10_0000);
        assert_eq!(be64(b, 0x118), 0x20_0000);
        let c = create_eq(&EqParams {
            log_page_size: 9,
            ..EqParams {
                log_eq_size: 0,
                uar_page: UarPage(0),
                intr: 0,
                log_page_size: 0,
                event_mask: 1 << 4,
                pages: &[],
            }
        });
        assert_eq!(be32(c.input(), 0x28), 9 << 24);
        assert_eq!(c.input()[0x5f], 0x10);
        assert_eq!(parse_create_eq(&out(0x10, &[(0x0b, &[0x11])])), Eqn(0x11));
    }

    #[test]
    fn destroy_query_eq() {
        let d = destroy_eq(Eqn(0x11));
        assert_eq!((be16(d.input(), 0), d.input()[0xb]), (0x302, 0x11));
        let q = query_eq(Eqn(0x12));
        assert_eq!((be16(q.input(), 0), q.input()[0xb], q.out_len()), (0x303, 0x12, 0x110));
        let o = out(
            0x110,
            &[
                (0x1c, &[5, 0, 0, 0x10]),
                (0x26, &[0, 2]),
                (0x28, &[1, 0, 0, 0]),
                (0x38, &[0, 0, 0, 7]),
                (0x3c, &[0, 0, 0, 9]),
                (0x58, &0x400u64.to_be_bytes()),
            ],
        );
        let i = parse_query_eq(&o);
        assert_eq!((i.log_eq_size, i.uar_page, i.intr, i.log_page_size), (5, UarPage(0x10), 2, 1));
        assert_eq!((i.consumer_counter, i.producer_counter, i.event_mask), (7, 9, 0x400));
    }

    fn eqe(t: u8, sub: u8, data: &[(usize, &[u8])], owner: u8) -> Eqe {
        let mut b = [0u8; 64];
        b[1] = t;
        b[3] = sub;
        for (at, d) in data {
            b[0x20 + at..0x20 + at + d.len()].copy_from_slice(d);
        }
        b[0x3f] = owner;
        Eqe::parse(&b)
    }

    #[test]
    fn events() {
        assert_eq!(eqe(0, 0, &[(0x18, &[0xff, 0, 0, 5])], 0).event(), Event::Completion { cqn: Cqn(5) });
        assert_eq!(eqe(0xa, 0, &[(0, &[0, 0, 0, 0x81])], 0).event(), Event::Command { slots: 0x81 });
        assert_eq!(
            eqe(0xb, 0, &[(0, &[0x80, 0]), (2, &[0, 3]), (4, &(-9i32).to_be_bytes())], 0).event(),
            Event::PageRequest { ec_function: true, function_id: 3, num_pages: -9 }
        );
        assert_eq!(
            eqe(0x11, 0, &[(0x14, &[0]), (0x18, &[0, 0, 0x12, 0x34])], 0).event(),
            Event::Qp { event_type: 0x11, resource_type: 0, qpn: 0x1234 }
        );
        assert_eq!(
            eqe(4, 0, &[(0, &[0, 0, 0, 7]), (0xb, &[1])], 0).event(),
            Event::CqError { cqn: Cqn(7), syndrome: 1 }
        );
        assert_eq!(eqe(9, 4, &[(8, &[0x10])], 0).event(), Event::PortChange { port: 1, sub_type: 4 });
        assert_eq!(eqe(0x22, 1, &[], 0).event(), Event::Other { event_type: 0x22, sub_type: 1 });
        let mut raw = [0u8; 64];
        raw[1] = 0xb;
        raw[0x27] = 4;
        assert_eq!(page_request(&raw), Some(PageDemand { function_id: 0, num_pages: 4 }));
        raw[1] = 0xa;
        assert_eq!(page_request(&raw), None);
    }

    #[test]
    fn ownership_and_doorbell() {
        let fresh = eqe(0, 0, &[], EQE_INIT_OWNER);
        // First pass (ci < 2^log): hardware writes owner 0, so an initialised entry is not ours.
        assert!(!fresh.is_sw_owned(0, 4));
        assert!(fresh.is_sw_owned(16, 4));
        assert!(eqe(0, 0, &[], 0).is_sw_owned(3, 4));
        assert_eq!(eq_doorbell_value(Eqn(0x11), 0x0123_4567), 0x1123_4567);
        assert_eq!((MLX5_EQ_DOORBEL_OFFSET_ARM, MLX5_EQ_DOORBEL_OFFSET_UPDATE_CI), (0x40, 0x48));
        assert_eq!(ASYNC_EVENT_MASK & event_bit(MLX5_EVENT_TYPE_CMD), 0);
        assert_ne!(ASYNC_EVENT_MASK & event_bit(MLX5_EVENT_TYPE_PORT_CHANGE), 0);
    }
}
