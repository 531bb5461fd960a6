//! HCA capabilities as QUERY_HCA_CAP / SET_HCA_CAP see them: one 4 KiB block per capability type, a
//! maximum and a current copy (`hca_cap_union` in `mlx5_ifc.h`; op_mod = `(cap_type << 1) | current`,
//! `device.h:1228-1255`, §e.1 of the facts).
//!
//! Two profiles ([`CapsProfile`]): the blocks a real ConnectX-4 returned in the reference trace
//! ([`cx4_trace`], what the trace replay needs byte for byte) and the default, a ConnectX-5 on firmware 16.x
//! ([`cx5`]: the trace's blocks with the fields a CX-5 reports differently, each with its source;
//! `docs/hca-model.md`, "The ConnectX-5 profile").

mod cx4_trace;
mod cx5;

use std::collections::BTreeMap;

use crate::ifc::{self, Field};

/// Size of a capability block (`query_hca_cap_out.capability`).
pub const CAP_SIZE: usize = 0x1000;

/// Capability types (`device.h` `enum mlx5_cap_type`).
pub mod cap_type {
    pub const GENERAL: u16 = 0;
    pub const ETHERNET_OFFLOADS: u16 = 1;
    pub const ATOMIC: u16 = 3;
    pub const ROCE: u16 = 4;
    pub const FLOW_TABLE: u16 = 7;
}

/// `struct mlx5_ifc_cmd_hca_cap_bits` fields the model reads or lets the driver set.
pub mod cmd_hca_cap {
    use crate::ifc::Field;
    pub const LOG_MAX_QP: Field = Field::new(0x9b, 5);
    pub const LOG_MAX_CQ: Field = Field::new(0xdb, 5);
    pub const LOG_MAX_MKEY: Field = Field::new(0xea, 6);
    pub const LOG_MAX_EQ: Field = Field::new(0xfc, 4);
    pub const RELEASE_ALL_PAGES: Field = Field::new(0x145, 1);
    pub const CQE_VERSION: Field = Field::new(0x1fc, 4);
    pub const ATOMIC: Field = Field::new(0x21e, 1);
    pub const ROCE_RW_SUPPORTED: Field = Field::new(0x3a1, 1);
    pub const SQ_TS_FORMAT: Field = Field::new(0x440, 2);
    pub const RQ_TS_FORMAT: Field = Field::new(0x442, 2);
    pub const CACHE_LINE_128BYTE: Field = Field::new(0x164, 1);
    pub const PKEY_TABLE_SIZE: Field = Field::new(0x190, 16);
    pub const PORT_TYPE: Field = Field::new(0x1b6, 2);
    pub const CMDIF_CHECKSUM: Field = Field::new(0x210, 2);
    pub const DCT: Field = Field::new(0x21a, 1);
    pub const ROCE: Field = Field::new(0x21d, 1);
    pub const UAR_4K: Field = Field::new(0x240, 1);
    pub const LOG_PG_SZ: Field = Field::new(0x258, 8);
    pub const LOG_MAX_TRANSPORT_DOMAIN: Field = Field::new(0x323, 5);
    pub const LOG_MAX_PD: Field = Field::new(0x32b, 5);
    pub const LOG_MAX_CURRENT_MC_LIST: Field = Field::new(0x3f3, 5);
    pub const LOG_MAX_CURRENT_UC_LIST: Field = Field::new(0x3fb, 5);
    pub const LOG_UAR_PAGE_SZ: Field = Field::new(0x490, 16);
    pub const DEVICE_FREQUENCY_KHZ: Field = Field::new(0x4e0, 32);
    pub const NUM_VHCA_PORTS: Field = Field::new(0x610, 8);
    pub const VHCA_ID: Field = Field::new(0x30, 16);
    // UMR (`crate::umr`).
    pub const RELAXED_ORDERING_WRITE_UMR: Field = Field::new(0xd0, 1);
    pub const RELAXED_ORDERING_READ_UMR: Field = Field::new(0xd1, 1);
    pub const UMR_EXTENDED_TRANSLATION_OFFSET: Field = Field::new(0x118, 1);
    pub const UMR_MODIFY_ENTITY_SIZE_DISABLED: Field = Field::new(0x207, 1);
    pub const UMR_MODIFY_ATOMIC_DISABLED: Field = Field::new(0x208, 1);
    pub const UMR_INDIRECT_MKEY_DISABLED: Field = Field::new(0x209, 1);
    /// `MLX5_CAP_UMR_FENCE_*`: 0 STRONG, 1 SMALL, 2 NONE.
    pub const UMR_FENCE: Field = Field::new(0x20a, 2);
    pub const UMR_PTR_RLKY: Field = Field::new(0x230, 1);
    /// Largest send WQE in bytes.
    pub const MAX_WQE_SZ_SQ: Field = Field::new(0x290, 16);
    pub const VPORT_GROUP_MANAGER: Field = Field::new(0x1a0, 1);
    pub const VHCA_GROUP_MANAGER: Field = Field::new(0x1a1, 1);
}

/// The `vhca_id` the `--vf` personality reports: the first VF of PF 0 (the PF is vhca 0).
pub const VF_VHCA_ID: u32 = 1;

/// `struct mlx5_ifc_roce_cap_bits` fields the model reads or the driver may set.
pub mod roce_cap {
    use crate::ifc::Field;
    pub const SW_R_ROCE_SRC_UDP_PORT: Field = Field::new(0x04, 1);
    pub const QP_OOO_TRANSMIT_DEFAULT: Field = Field::new(0x08, 1);
    pub const QP_TS_FORMAT: Field = Field::new(0x1e, 2);
    pub const L3_TYPE: Field = Field::new(0x8c, 4);
    pub const ROCE_VERSION: Field = Field::new(0x98, 8);
    pub const R_ROCE_DEST_UDP_PORT: Field = Field::new(0xb0, 16);
    pub const R_ROCE_MAX_SRC_UDP_PORT: Field = Field::new(0xc0, 16);
    pub const R_ROCE_MIN_SRC_UDP_PORT: Field = Field::new(0xd0, 16);
    pub const ROCE_ADDRESS_TABLE_SIZE: Field = Field::new(0xf0, 16);
}

/// `struct mlx5_ifc_atomic_caps_bits` fields the model reads or the driver may set.
pub mod atomic_caps {
    use crate::ifc::Field;
    /// Settable (Linux `handle_hca_cap_atomic`): 1 = `MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS`.
    pub const ATOMIC_REQ_8B_ENDIANNESS_MODE: Field = Field::new(0x40, 2);
    pub const SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1: Field = Field::new(0x46, 1);
    pub const ATOMIC_OPERATIONS: Field = Field::new(0x90, 16);
    pub const ATOMIC_SIZE_QP: Field = Field::new(0xb0, 16);
}

/// `MLX5_TIMESTAMP_FORMAT_CAP_*` (`mlx5_ifc.h`): which clocks a queue may stamp with.
pub mod ts_format_cap {
    pub const FREE_RUNNING: u32 = 0;
    pub const REAL_TIME: u32 = 1;
    pub const FREE_RUNNING_AND_REAL_TIME: u32 = 2;
}

/// `MLX5_TIMESTAMP_FORMAT_*` (`mlx5_ifc.h`): a queue's `ts_format`.
pub mod ts_format {
    pub const FREE_RUNNING: u32 = 0;
    pub const DEFAULT: u32 = 1;
    pub const REAL_TIME: u32 = 2;
}

/// Whether a queue's `ts_format` is one the capability `cap` (`MLX5_TIMESTAMP_FORMAT_CAP_*`) offers, as Linux
/// `get_ts_format` chooses them (`infiniband/hw/mlx5/qp.c`: free running where `fr_supported`, real time where
/// `rt_supported`, DEFAULT always). A reserved cap value (3) offers DEFAULT only: the stricter reading.
pub fn ts_format_offered(cap: u32, ts: u32) -> bool {
    match ts {
        ts_format::DEFAULT => true,
        ts_format::FREE_RUNNING => {
            matches!(cap, ts_format_cap::FREE_RUNNING | ts_format_cap::FREE_RUNNING_AND_REAL_TIME)
        }
        ts_format::REAL_TIME => matches!(cap, ts_format_cap::REAL_TIME | ts_format_cap::FREE_RUNNING_AND_REAL_TIME),
        _ => false,
    }
}

/// `MLX5_IB_DEFAULT_UIDX` (`infiniband/hw/mlx5/mlx5_ib.h`): the `user_index` Linux gives every kernel QP
/// when `cqe_version` is 1.
pub const DEFAULT_USER_INDEX: u32 = 0xff_ffff;

/// Which capability blocks the model reports (`ModelConfig::caps`, `--caps`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapsProfile {
    /// A ConnectX-5 on firmware 16.x ([`Caps::connectx5`]): the default.
    #[default]
    ConnectX5,
    /// The reference trace's ConnectX-4 (fw 14.12.1220), byte for byte ([`Caps::connectx4_trace`]): what the
    /// trace replay pins.
    ConnectX4Trace,
}

impl CapsProfile {
    /// The `--caps` names: `cx5`, `cx4-trace`.
    pub fn parse(s: &str) -> Option<CapsProfile> {
        match s {
            "cx5" => Some(CapsProfile::ConnectX5),
            "cx4-trace" => Some(CapsProfile::ConnectX4Trace),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CapsProfile::ConnectX5 => "cx5",
            CapsProfile::ConnectX4Trace => "cx4-trace",
        }
    }
}

/// Fields of the current GENERAL block that SET_HCA_CAP may change (the ones Linux `handle_hca_cap`,
/// `core/main.c:575-668`, writes). Every other field keeps its value whatever the input says, as firmware
/// ignores read-only capability bits. A settable value above the maximum block's value is refused.
const GENERAL_SETTABLE: &[Field] = &[
    cmd_hca_cap::LOG_MAX_QP,
    cmd_hca_cap::PKEY_TABLE_SIZE,
    cmd_hca_cap::CMDIF_CHECKSUM,
    cmd_hca_cap::UAR_4K,
    cmd_hca_cap::LOG_UAR_PAGE_SZ,
    cmd_hca_cap::CACHE_LINE_128BYTE,
    cmd_hca_cap::DCT,
    cmd_hca_cap::ROCE,
    cmd_hca_cap::RELEASE_ALL_PAGES,
    cmd_hca_cap::NUM_VHCA_PORTS,
    cmd_hca_cap::LOG_MAX_CURRENT_UC_LIST,
    cmd_hca_cap::LOG_MAX_CURRENT_MC_LIST,
];

const ROCE_SETTABLE: &[Field] = &[roce_cap::SW_R_ROCE_SRC_UDP_PORT, roce_cap::QP_OOO_TRANSMIT_DEFAULT];

/// The one ATOMIC field SET_HCA_CAP may change (Linux `handle_hca_cap_atomic`), checked against the maximum
/// block and offered only with `supported_atomic_req_8B_endianness_mode_1`.
const ATOMIC_SETTABLE: &[Field] = &[atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE];

/// A SET_HCA_CAP refusal: the index of the offending field in the settable list (for the syndrome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCapError {
    /// The capability type cannot be set.
    NotSettable,
    /// A settable field exceeds the maximum; the value is the field's bit offset.
    AboveMax(u32),
    /// A field the current caps make read-only was given another value: `roce` without
    /// `roce_rw_supported`, `atomic_req_8B_endianness_mode` without
    /// `supported_atomic_req_8B_endianness_mode_1`. The value is the field's bit offset.
    ReadOnly(u32),
}

pub struct Caps {
    max: BTreeMap<u16, Vec<u8>>,
    cur: BTreeMap<u16, Vec<u8>>,
}

fn block(dwords: &[(u16, u32)]) -> Vec<u8> {
    let mut b = vec![0u8; CAP_SIZE];
    for &(off, v) in dwords {
        let off = usize::from(off);
        if let Some(d) = b.get_mut(off..off + 4) {
            d.copy_from_slice(&v.to_be_bytes());
        }
    }
    b
}

impl Default for Caps {
    fn default() -> Self {
        Self::connectx5()
    }
}

impl Caps {
    /// The blocks of `profile`, as the PF (`vf` false) or as a VF of it ([`Caps::into_vf`]).
    pub fn new(profile: CapsProfile, vf: bool) -> Caps {
        let c = match profile {
            CapsProfile::ConnectX5 => Caps::connectx5(),
            CapsProfile::ConnectX4Trace => Caps::connectx4_trace(),
        };
        if vf { c.into_vf() } else { c }
    }

    /// A ConnectX-5 on firmware 16.x: the trace's blocks with [`cx5::FIELDS`] applied (maximum and current).
    pub fn connectx5() -> Caps {
        let mut c = Caps::connectx4_trace();
        for x in cx5::FIELDS {
            c.set_field(x.cap_type, false, x.field, x.max);
            c.set_field(x.cap_type, true, x.field, x.cur);
        }
        c
    }

    /// The CX-5 profile's fields with their values and sources (for the docs and the tests): type, name,
    /// field, maximum, current, source.
    pub fn connectx5_fields() -> impl Iterator<Item = (u16, &'static str, Field, u32, u32, &'static str)> {
        cx5::FIELDS.iter().map(|x| (x.cap_type, x.name, x.field, x.max, x.cur, x.source))
    }

    /// The capability blocks of the reference trace's ConnectX-4.
    pub fn connectx4_trace() -> Caps {
        use cx4_trace::*;
        let mut max = BTreeMap::new();
        let mut cur = BTreeMap::new();
        for (t, m, c) in [
            (cap_type::GENERAL, GENERAL_MAX, GENERAL_CUR),
            (cap_type::ETHERNET_OFFLOADS, ETH_OFFLOADS_MAX, ETH_OFFLOADS_CUR),
            (cap_type::ATOMIC, ATOMIC_MAX, ATOMIC_CUR),
            (cap_type::ROCE, ROCE_MAX, ROCE_CUR),
            (cap_type::FLOW_TABLE, FLOW_TABLE_MAX, FLOW_TABLE_CUR),
        ] {
            max.insert(t, block(m));
            cur.insert(t, block(c));
        }
        Caps { max, cur }
    }

    /// The default profile's blocks as a VF reports them ([`Caps::into_vf`]).
    pub fn vf() -> Caps {
        Caps::default().into_vf()
    }

    /// These blocks as a VF of that HCA reports them: it manages no vports (`vport_group_manager` and
    /// `vhca_group_manager` 0, the bits Linux's eswitch and SR-IOV code look for) and is not vhca 0
    /// ([`VF_VHCA_ID`]).
    pub fn into_vf(self) -> Caps {
        let mut c = self;
        for current in [false, true] {
            c.set_field(cap_type::GENERAL, current, cmd_hca_cap::VPORT_GROUP_MANAGER, 0);
            c.set_field(cap_type::GENERAL, current, cmd_hca_cap::VHCA_GROUP_MANAGER, 0);
            c.set_field(cap_type::GENERAL, current, cmd_hca_cap::VHCA_ID, VF_VHCA_ID);
        }
        c
    }

    /// The block for `cap_type`, maximum or current; `None` for a type this HCA does not report.
    pub fn block(&self, cap_type: u16, current: bool) -> Option<&[u8]> {
        if current { self.cur.get(&cap_type) } else { self.max.get(&cap_type) }.map(Vec::as_slice)
    }

    /// A field of the current GENERAL block.
    pub fn general(&self, f: Field) -> u32 {
        self.cur.get(&cap_type::GENERAL).map_or(0, |b| ifc::get(b, f))
    }

    /// A field of a current block (0 for a type this HCA does not report).
    pub fn current(&self, cap_type: u16, f: Field) -> u32 {
        self.cur.get(&cap_type).map_or(0, |b| ifc::get(b, f))
    }

    /// The timestamp formats QPs may use: `roce_cap.qp_ts_format` when RoCE is on, else
    /// `cmd_hca_cap.sq_ts_format` (the cap Linux `mlx5_get_qp_default_ts` reads).
    pub fn qp_ts_format_cap(&self) -> u32 {
        if self.general(cmd_hca_cap::ROCE) == 1 {
            self.current(cap_type::ROCE, roce_cap::QP_TS_FORMAT)
        } else {
            self.general(cmd_hca_cap::SQ_TS_FORMAT)
        }
    }

    /// The `user_index` a QP must carry: [`DEFAULT_USER_INDEX`] with CQE version 1 (the model has no user
    /// contexts, so every QP is a kernel consumer's), 0 with CQE version 0 (the field unused, left zero).
    pub fn qp_user_index(&self) -> u32 {
        if self.general(cmd_hca_cap::CQE_VERSION) == 1 { DEFAULT_USER_INDEX } else { 0 }
    }

    /// Overrides a field of a block (configuration, tests).
    pub fn set_field(&mut self, cap_type: u16, current: bool, f: Field, v: u32) {
        let map = if current { &mut self.cur } else { &mut self.max };
        if let Some(b) = map.get_mut(&cap_type) {
            ifc::set(b, f, v);
        }
    }

    /// SET_HCA_CAP: copies the settable fields of `input` (a 4 KiB block) into the current block after
    /// checking each against the maximum. Nothing changes when any field is refused. A field the current caps
    /// make read-only must keep its current value (`roce` needs `roce_rw_supported`, Linux `handle_hca_cap`;
    /// `atomic_req_8B_endianness_mode` needs `supported_atomic_req_8B_endianness_mode_1`, Linux
    /// `handle_hca_cap_atomic`): another value is refused, the stricter reading of "read-only".
    pub fn set(&mut self, cap_type: u16, input: &[u8]) -> Result<(), SetCapError> {
        let fields = match cap_type {
            cap_type::GENERAL => GENERAL_SETTABLE,
            cap_type::ROCE => ROCE_SETTABLE,
            cap_type::ATOMIC => ATOMIC_SETTABLE,
            _ => return Err(SetCapError::NotSettable),
        };
        let (Some(max), Some(cur)) = (self.max.get(&cap_type), self.cur.get(&cap_type)) else {
            return Err(SetCapError::NotSettable);
        };
        let read_only = |f: Field| match (cap_type, f) {
            (cap_type::GENERAL, cmd_hca_cap::ROCE) => ifc::get(cur, cmd_hca_cap::ROCE_RW_SUPPORTED) == 0,
            (cap_type::ATOMIC, atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE) => {
                ifc::get(cur, atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1) == 0
            }
            _ => false,
        };
        let mut next = cur.clone();
        for &f in fields {
            let v = ifc::get(input, f);
            if read_only(f) && v != ifc::get(cur, f) {
                return Err(SetCapError::ReadOnly(f.bit));
            }
            if v > ifc::get(max, f) {
                return Err(SetCapError::AboveMax(f.bit));
            }
            ifc::set(&mut next, f, v);
        }
        self.cur.insert(cap_type, next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_values_land_in_the_right_fields() {
        let c = Caps::connectx4_trace();
        // From the trace: general max dword 0x10 = 0x0f0f0017 → log_max_qp 0x17; current 0x0e.
        assert_eq!(ifc::get(c.block(0, false).unwrap(), cmd_hca_cap::LOG_MAX_QP), 0x17);
        assert_eq!(c.general(cmd_hca_cap::LOG_MAX_QP), 0x0e);
        // dword 0x1c = 0x16180008 → log_max_mkey 0x18.
        assert_eq!(c.general(cmd_hca_cap::LOG_MAX_MKEY), 0x18);
        // Ethernet port with RoCE.
        assert_eq!(c.general(cmd_hca_cap::PORT_TYPE), 1);
        assert_eq!(c.general(cmd_hca_cap::ROCE), 1);
        // Checksums: max 3, current 0.
        assert_eq!(ifc::get(c.block(0, false).unwrap(), cmd_hca_cap::CMDIF_CHECKSUM), 3);
        assert_eq!(c.general(cmd_hca_cap::CMDIF_CHECKSUM), 0);
        assert!(c.block(2, true).is_none());
    }

    #[test]
    fn a_vf_manages_no_vports_and_is_not_vhca_0() {
        let pf = Caps::default();
        assert_eq!(pf.general(cmd_hca_cap::VHCA_ID), 0);
        let vf = Caps::vf();
        for current in [false, true] {
            let b = vf.block(cap_type::GENERAL, current).unwrap();
            assert_eq!(ifc::get(b, cmd_hca_cap::VPORT_GROUP_MANAGER), 0);
            assert_eq!(ifc::get(b, cmd_hca_cap::VHCA_GROUP_MANAGER), 0);
            assert_eq!(ifc::get(b, cmd_hca_cap::VHCA_ID), VF_VHCA_ID);
        }
        // Everything else is the PF's.
        assert_eq!(vf.general(cmd_hca_cap::LOG_MAX_QP), pf.general(cmd_hca_cap::LOG_MAX_QP));
        assert_eq!(vf.general(cmd_hca_cap::ROCE), 1);
    }

    #[test]
    fn ts_formats_follow_linux_get_ts_format() {
        use ts_format::*;
        let fr = ts_format_cap::FREE_RUNNING;
        let rt = ts_format_cap::REAL_TIME;
        let both = ts_format_cap::FREE_RUNNING_AND_REAL_TIME;
        assert!(ts_format_offered(fr, FREE_RUNNING) && ts_format_offered(fr, DEFAULT));
        assert!(!ts_format_offered(fr, REAL_TIME));
        assert!(!ts_format_offered(rt, FREE_RUNNING) && ts_format_offered(rt, REAL_TIME));
        assert!([FREE_RUNNING, DEFAULT, REAL_TIME].iter().all(|&t| ts_format_offered(both, t)));
        assert!(!ts_format_offered(3, FREE_RUNNING) && ts_format_offered(3, DEFAULT));
        assert!(!ts_format_offered(both, 3));
    }

    #[test]
    fn the_cx5_profile_is_the_default_and_cx4_fields_keep_the_trace() {
        let (cx5, cx4) = (Caps::default(), Caps::connectx4_trace());
        assert_eq!(cx5.general(cmd_hca_cap::ROCE_RW_SUPPORTED), 1);
        assert_eq!(cx4.general(cmd_hca_cap::ROCE_RW_SUPPORTED), 0);
        assert_eq!(cx5.qp_user_index(), DEFAULT_USER_INDEX);
        assert_eq!(cx5.qp_ts_format_cap(), ts_format_cap::FREE_RUNNING);
        assert_eq!(CapsProfile::parse("cx5"), Some(CapsProfile::ConnectX5));
        assert_eq!(CapsProfile::parse("cx4-trace"), Some(CapsProfile::ConnectX4Trace));
        assert_eq!(CapsProfile::parse("cx4"), None);
        for p in [CapsProfile::ConnectX5, CapsProfile::ConnectX4Trace] {
            assert_eq!(CapsProfile::parse(p.name()), Some(p));
        }
        // Outside the listed fields the blocks are the trace's.
        for t in
            [cap_type::GENERAL, cap_type::ETHERNET_OFFLOADS, cap_type::ATOMIC, cap_type::ROCE, cap_type::FLOW_TABLE]
        {
            for current in [false, true] {
                let mut a = cx5.block(t, current).unwrap().to_vec();
                let b = cx4.block(t, current).unwrap();
                for (ty, _, f, _, _, _) in Caps::connectx5_fields() {
                    if ty == t {
                        ifc::set(&mut a, f, ifc::get(b, f));
                    }
                }
                assert_eq!(a, b, "cap type {t} current {current}");
            }
        }
    }

    #[test]
    fn set_checks_against_max_and_ignores_read_only_fields() {
        let mut c = Caps::default();
        let mut inb = c.block(0, true).unwrap().to_vec();
        ifc::set(&mut inb, cmd_hca_cap::LOG_MAX_QP, 0x11);
        ifc::set(&mut inb, cmd_hca_cap::LOG_MAX_MKEY, 0x01); // read-only: ignored
        c.set(0, &inb).unwrap();
        assert_eq!(c.general(cmd_hca_cap::LOG_MAX_QP), 0x11);
        assert_eq!(c.general(cmd_hca_cap::LOG_MAX_MKEY), 0x18);
        ifc::set(&mut inb, cmd_hca_cap::LOG_MAX_QP, 0x18);
        assert_eq!(c.set(0, &inb), Err(SetCapError::AboveMax(cmd_hca_cap::LOG_MAX_QP.bit)));
        assert_eq!(c.general(cmd_hca_cap::LOG_MAX_QP), 0x11);
        assert_eq!(c.set(7, &inb), Err(SetCapError::NotSettable));
    }
}
