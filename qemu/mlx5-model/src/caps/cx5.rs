//! The ConnectX-5 (firmware 16.x) profile: the reference trace's ConnectX-4 blocks ([`super::cx4_trace`]) with
//! the fields a ConnectX-5 reports differently, each with its source. No CX-5 QUERY_HCA_CAP dump is public, so
//! every value here is either read off public `ibv_devinfo -v` output of a ConnectX-5 (vendor_part_id 4119,
//! firmware 16.23.1020: open-mpi/ompi PR #6137; firmware 16.27.1016: openucx/ucx issue #9830) through the Linux
//! code that derives it from the caps, or taken from the Linux code that exists for firmware of this generation,
//! or is the stricter reading where nothing says (docs/hca-model.md, "The ConnectX-5 profile"). Fields not listed
//! keep the trace's value; the limits `ibv_devinfo` shows (max_qp_wr 32768, max_cq 2^24, max_cqe 2^22 − 1,
//! max_mr 2^24, max_pd 2^24, max_qp_rd_atom / max_qp_init_rd_atom 16, masked atomic sizes 0x3c) are the
//! trace's values already, so they stay as they are.

use super::{atomic_caps, cap_type, cmd_hca_cap, roce_cap};
use crate::ifc::Field;

/// One field of the CX-5 profile: capability type, field, maximum value, current value (before any
/// SET_HCA_CAP), and where the value comes from.
pub(crate) struct Cx5Field {
    pub cap_type: u16,
    pub field: Field,
    pub name: &'static str,
    pub max: u32,
    pub cur: u32,
    pub source: &'static str,
}

const fn f(cap_type: u16, field: Field, name: &'static str, max: u32, cur: u32, source: &'static str) -> Cx5Field {
    Cx5Field { cap_type, field, name, max, cur, source }
}

/// The CX-5 fields, applied over the trace's blocks in this order.
pub(crate) const FIELDS: &[Cx5Field] = &[
    // GENERAL.
    f(
        cap_type::GENERAL,
        cmd_hca_cap::ROCE_RW_SUPPORTED,
        "cmd_hca_cap.roce_rw_supported",
        1,
        1,
        "firmware 16.x lets the driver switch RoCE (Linux handle_hca_cap sets `roce` only when this bit is \
         set, the devlink enable_roce path): a CX-5 branch of bring-up. Trace: 0",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::RELEASE_ALL_PAGES,
        "cmd_hca_cap.release_all_pages",
        1,
        0,
        "offered in the maximum block, off until the driver sets it (Linux handle_hca_cap sets it when \
         MLX5_CAP_GEN_MAX says so). Trace: 0 / 0",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::CQE_VERSION,
        "cmd_hca_cap.cqe_version",
        1,
        1,
        "CQE version 1 (user_index in the CQE's srqn_uidx); Linux mlx5_ib gives kernel QPs \
         MLX5_IB_DEFAULT_UIDX when it is 1. Same as the trace",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::SQ_TS_FORMAT,
        "cmd_hca_cap.sq_ts_format",
        0,
        0,
        "MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING: a ConnectX-5 has the free-running clock only (the real-time \
         clock came with later parts). Same as the trace",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::RQ_TS_FORMAT,
        "cmd_hca_cap.rq_ts_format",
        0,
        0,
        "as sq_ts_format. Same as the trace",
    ),
    // UMR (docs/hca-model.md, "UMR").
    f(
        cap_type::GENERAL,
        cmd_hca_cap::UMR_MODIFY_ENTITY_SIZE_DISABLED,
        "cmd_hca_cap.umr_modify_entity_size_disabled",
        0,
        0,
        "a UMR may change the page size (MLX5_MKEY_MASK_PAGE_SIZE): Linux mlx5_ib offers fast registration \
         (IB_DEVICE_MEM_MGT_EXTENSIONS) and loads MTTs by UMR only when this bit is 0 (main.c, umr.h \
         mlx5r_umr_can_load_pas), which a ConnectX-5 does for NVMe-oF and iSER. Same as the trace. \
         `--umr-entity-size-disabled` plays 1",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::UMR_MODIFY_ATOMIC_DISABLED,
        "cmd_hca_cap.umr_modify_atomic_disabled",
        0,
        0,
        "a UMR may change remote atomic access (MLX5_MKEY_MASK_A; Linux umr_check_mkey_mask refuses it when \
         set). Same as the trace: no CX-5 source differs",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::UMR_EXTENDED_TRANSLATION_OFFSET,
        "cmd_hca_cap.umr_extended_translation_offset",
        0,
        0,
        "translation offsets limited to the 16-bit xlt_offset (in octowords); xlt_offset_47_16 must stay 0. \
         Same as the trace; the stricter reading (Linux then caps its mkey cache at 2^16 pages)",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::UMR_PTR_RLKY,
        "cmd_hca_cap.umr_ptr_rlky",
        1,
        1,
        "a UMR's translation pointer may use the reserved lkey: Linux mlx5e's striding RQ, the default receive \
         mode of a ConnectX-5 port, needs it (mlx5e_check_fragmented_striding_rq_cap). Trace: 0 (a ConnectX-4 \
         has no striding RQ)",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::UMR_FENCE,
        "cmd_hca_cap.umr_fence",
        0,
        0,
        "MLX5_CAP_UMR_FENCE_STRONG: Linux then fences a REG_MR work request with strong ordering (main.c \
         mlx5_get_umr_fence). Same as the trace; the strictest value. The model runs a send queue in order, \
         so every fence mode is honoured",
    ),
    f(
        cap_type::GENERAL,
        cmd_hca_cap::MAX_WQE_SZ_SQ,
        "cmd_hca_cap.max_wqe_sz_sq",
        1024,
        1024,
        "16 WQEBBs (qp.h MLX5_SEND_WQE_MAX_WQEBBS); a longer UMR WQE completes in error. Same as the trace",
    ),
    // ROCE.
    f(
        cap_type::ROCE,
        roce_cap::QP_TS_FORMAT,
        "roce_cap.qp_ts_format",
        0,
        0,
        "MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING (free-running clock only), so Linux mlx5_get_qp_default_ts \
         gives FREE_RUNNING. Same as the trace",
    ),
    f(
        cap_type::ROCE,
        roce_cap::ROCE_VERSION,
        "roce_cap.roce_version",
        0x7,
        0x7,
        "RoCE v1 and v2 (device.h MLX5_ROCE_VERSION_1_CAP | MLX5_ROCE_VERSION_2_CAP, plus bit 1). Same as the \
         trace: no CX-5 source differs",
    ),
    f(
        cap_type::ROCE,
        roce_cap::L3_TYPE,
        "roce_cap.l3_type",
        0x7,
        0x7,
        "IPv4 and IPv6 (device.h MLX5_ROCE_L3_TYPE_IPV4_CAP | _IPV6_CAP, plus bit 0). Same as the trace: no \
         CX-5 source differs",
    ),
    f(
        cap_type::ROCE,
        roce_cap::R_ROCE_MAX_SRC_UDP_PORT,
        "roce_cap.r_roce_max_src_udp_port",
        0xffff,
        0xffff,
        "same as the trace: no CX-5 source differs",
    ),
    f(
        cap_type::ROCE,
        roce_cap::R_ROCE_MIN_SRC_UDP_PORT,
        "roce_cap.r_roce_min_src_udp_port",
        0xc000,
        0xc000,
        "same as the trace (the IANA dynamic range): no CX-5 source differs",
    ),
    f(
        cap_type::ROCE,
        roce_cap::ROCE_ADDRESS_TABLE_SIZE,
        "roce_cap.roce_address_table_size",
        256,
        256,
        "256 GIDs (ibv_devinfo gid_tbl_len). Same as the trace",
    ),
    // ATOMIC.
    f(
        cap_type::ATOMIC,
        atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1,
        "atomic_caps.supported_atomic_req_8B_endianness_mode_1",
        1,
        1,
        "ibv_devinfo of a ConnectX-5 (fw 16.23.1020) says atomic_cap ATOMIC_HCA, which Linux get_atomic_caps \
         reports only when the current atomic_req_8B_endianness_mode is non-zero, which Linux \
         handle_hca_cap_atomic sets only when this bit is offered. Trace: 0",
    ),
    f(
        cap_type::ATOMIC,
        atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE,
        "atomic_caps.atomic_req_8B_endianness_mode",
        1,
        0,
        "maximum 1 (host endianness, MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS) as above; current 0 until the \
         driver sets it: stricter than known (a card might start in host mode). Trace: 0 / 0",
    ),
];
