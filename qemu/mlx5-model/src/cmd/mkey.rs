//! CREATE_MKEY, QUERY_MKEY, DESTROY_MKEY (`mlx5_ifc.h` `create_mkey_in/out`, `mkc`, `query_mkey_in/out`,
//! `destroy_mkey_in`; docs/reference/mlx5.md §e.2). PA and MTT access modes; the MTT list comes from the input mailbox
//! (`klm_pas_mtt` at byte 0x110).

use super::{CmdResult, Ctx, need_initialized, reason, status};
use crate::caps::cmd_hca_cap;
use crate::hca::Hca;
use crate::ifc::{self, Field};
use crate::mkey::{Access, AccessMode, MkeyInfo, Mtt};
use crate::pages::PAGE_SIZE;

/// `create_mkey_in` fixed part and its fields; `mkc` at byte 0x10.
const CREATE_MKEY_IN_SIZE: usize = 0x110;
const MKC: u32 = 0x10;
const PG_ACCESS: Field = Field::new(0x60, 1);
const MKEY_UMEM_VALID: Field = Field::new(0x61, 1);
const DATA_DIRECT: Field = Field::new(0x62, 1);
const TRANSLATIONS_OCTWORD_ACTUAL_SIZE: Field = Field::new(0x300, 32);
const KLM_PAS_MTT: usize = 0x110;
/// `mkc` fields (bit offsets inside `mkc`).
pub(crate) mod mkc {
    use crate::ifc::Field;
    pub const FREE: Field = Field::new(0x01, 1);
    pub const ACCESS_MODE_4_2: Field = Field::new(0x03, 3);
    pub const UMR_EN: Field = Field::new(0x10, 1);
    pub const A: Field = Field::new(0x11, 1);
    pub const RW: Field = Field::new(0x12, 1);
    pub const RR: Field = Field::new(0x13, 1);
    pub const LW: Field = Field::new(0x14, 1);
    pub const LR: Field = Field::new(0x15, 1);
    pub const ACCESS_MODE_1_0: Field = Field::new(0x16, 2);
    pub const QPN: Field = Field::new(0x20, 24);
    pub const MKEY_7_0: Field = Field::new(0x38, 8);
    pub const LENGTH64: Field = Field::new(0x60, 1);
    pub const BSF_EN: Field = Field::new(0x61, 1);
    pub const PD: Field = Field::new(0x68, 24);
    pub const START_ADDR: usize = 0x10;
    pub const LEN: usize = 0x18;
    pub const BSF_OCTWORD_SIZE: Field = Field::new(0x100, 32);
    pub const TRANSLATIONS_OCTWORD_SIZE: Field = Field::new(0x1a0, 32);
    pub const LOG_PAGE_SIZE: Field = Field::new(0x1da, 6);
    pub const SIZE: usize = 0x40;
}
/// `create_mkey_out.mkey_index`, `destroy_mkey_in.mkey_index`, `query_mkey_in.mkey_index`.
const MKEY_INDEX: Field = Field::new(0x48, 24);
/// `query_mkey_out` (0x130 bytes): `memory_key_mkey_entry` at 0x10, `bsf0_klm0_pas_mtt0_1` at 0x110,
/// `bsf1_klm1_pas_mtt2_3` at 0x120.
const QUERY_MKEY_OUT_SIZE: usize = 0x130;
const QUERY_MKEY_OUT_MTT0: usize = 0x110;
/// MKEY index 0x00FFFFFF is never handed out: FENCE-TEST destroys it expecting BAD_PARAM.
const MAX_INDEX: u32 = 0x00ff_fffe;
/// Largest MTT page the model accepts (`log_page_size`); keeps shifts and RAM checks in range.
const MAX_LOG_PAGE_SIZE: u32 = 30;
/// Largest `translations_octword_size` of an MTT key: 2^19 entries (2 GiB in 4 KiB pages, 1 TiB in 2 MiB
/// pages), held as a table of that many entries.
pub const MAX_TRANSLATIONS_OCTWORD_SIZE: u32 = 1 << 18;
/// `mkc.qpn` when the key is not bound to a QP.
pub(crate) const QPN_UNBOUND: u32 = 0x00ff_ffff;

pub fn create_mkey(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(CREATE_MKEY_IN_SIZE)?;
    c.op_mod_in(&[0])?;
    need_initialized(hca, c)?;
    let m = |f: Field| c.get(f.at(MKC));
    let bad = |why| Err(c.err(status::BAD_PARAM, why));
    // Features the model does not implement are refused rather than ignored.
    if c.get(PG_ACCESS) != 0
        || c.get(MKEY_UMEM_VALID) != 0
        || c.get(DATA_DIRECT) != 0
        || m(mkc::BSF_EN) != 0
        || m(mkc::BSF_OCTWORD_SIZE) != 0
        || m(mkc::QPN) != QPN_UNBOUND
    {
        return bad(reason::UNSUPPORTED_FEATURE);
    }
    let mode = match (m(mkc::ACCESS_MODE_4_2), m(mkc::ACCESS_MODE_1_0)) {
        (0, 0) => AccessMode::Pa,
        (0, 1) => AccessMode::Mtt,
        _ => return bad(reason::BAD_ACCESS_MODE),
    };
    let pd = m(mkc::PD);
    if !hca.pds.contains(&pd) {
        return bad(reason::BAD_PD);
    }
    let base = MKC as usize;
    let start_addr = ifc::get64(c.input, base + mkc::START_ADDR);
    let len = ifc::get64(c.input, base + mkc::LEN);
    let length64 = m(mkc::LENGTH64) == 1;
    let log_page_size = m(mkc::LOG_PAGE_SIZE);
    let actual = c.get(TRANSLATIONS_OCTWORD_ACTUAL_SIZE) as usize;
    let mut mtt = Vec::new();
    match mode {
        AccessMode::Pa => {
            if actual != 0 || m(mkc::TRANSLATIONS_OCTWORD_SIZE) != 0 {
                return bad(reason::BAD_LENGTH);
            }
            if !length64 && start_addr.checked_add(len).is_none() {
                return bad(reason::BAD_LENGTH);
            }
        }
        AccessMode::Mtt => {
            if length64 {
                return bad(reason::BAD_LENGTH);
            }
            if !(12..=MAX_LOG_PAGE_SIZE).contains(&log_page_size) {
                return bad(reason::BAD_PAGE_SIZE);
            }
            // The table is held whole (a UMR may write any entry of it), so its size is bounded.
            if m(mkc::TRANSLATIONS_OCTWORD_SIZE) > MAX_TRANSLATIONS_OCTWORD_SIZE {
                return bad(reason::BAD_LENGTH);
            }
            if actual > m(mkc::TRANSLATIONS_OCTWORD_SIZE) as usize || actual > crate::cmdq::MAX_MSG_LEN as usize / 16 {
                return bad(reason::TRANSLATIONS_SHORT);
            }
            c.need_input(KLM_PAS_MTT + 16 * actual)?;
            let ps = 1u64 << log_page_size;
            let Some(span) = (start_addr & (ps - 1)).checked_add(len) else { return bad(reason::BAD_LENGTH) };
            let needed = span.div_ceil(ps);
            if needed > 2 * actual as u64 {
                return bad(reason::TRANSLATIONS_SHORT);
            }
            for i in 0..needed as usize {
                let e = ifc::get64(c.input, KLM_PAS_MTT + 8 * i);
                let addr = e & !0xff;
                if !addr.is_multiple_of(ps) || !addr.is_multiple_of(PAGE_SIZE) {
                    return bad(reason::PAGE_MISALIGNED);
                }
                if !c.ram.holds(addr, ps) {
                    return bad(reason::TRANSLATION_OUTSIDE_RAM);
                }
                mtt.push(Mtt { addr, read: e & 1 != 0, write: e & 2 != 0 });
            }
            // The table as sized (a UMR may fill the rest, `crate::umr`); entries not given are not present.
            mtt.resize(2 * m(mkc::TRANSLATIONS_OCTWORD_SIZE) as usize, Mtt { addr: 0, read: false, write: false });
        }
    }
    let mut out = c.output(0x10)?;
    let hi = (1u32 << hca.caps.general(cmd_hca_cap::LOG_MAX_MKEY).min(24)).min(MAX_INDEX + 1);
    let mut index = 1;
    for &k in hca.mkeys.range(1..hi).map(|(k, _)| k) {
        if k != index {
            break;
        }
        index += 1;
    }
    if index >= hi {
        return Err(c.err(status::NO_RES, reason::TABLE_FULL));
    }
    let variant = m(mkc::MKEY_7_0);
    let info = MkeyInfo {
        key: (index << 8) | variant,
        index,
        pd,
        start_addr,
        len,
        length64,
        free: m(mkc::FREE) == 1,
        umr_en: m(mkc::UMR_EN) == 1,
        access: Access {
            remote_atomic: m(mkc::A) == 1,
            remote_write: m(mkc::RW) == 1,
            remote_read: m(mkc::RR) == 1,
            local_write: m(mkc::LW) == 1,
            local_read: m(mkc::LR) == 1,
        },
        access_mode: mode,
        log_page_size: log_page_size as u8,
        mtt,
        mkc: c.input[base..base + mkc::SIZE].to_vec(),
    };
    hca.mkeys.insert(index, info);
    ifc::set(&mut out, MKEY_INDEX, index);
    Ok(out)
}

fn index_of(hca: &Hca, c: &Ctx) -> Result<u32, super::CmdError> {
    c.need_input(0x10)?;
    c.op_mod_in(&[0])?;
    need_initialized(hca, c)?;
    let index = c.get(MKEY_INDEX);
    if !hca.mkeys.contains_key(&index) {
        return Err(c.err(status::BAD_PARAM, reason::NO_SUCH_OBJECT));
    }
    Ok(index)
}

pub fn query_mkey(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.reserved_zero(0x10, &[MKEY_INDEX])?;
    let index = index_of(hca, c)?;
    let mut out = c.output(QUERY_MKEY_OUT_SIZE)?;
    if let Some(k) = hca.mkeys.get(&index) {
        out[0x10..0x10 + mkc::SIZE].copy_from_slice(&k.mkc);
        for (i, t) in k.mtt.iter().take(4).enumerate() {
            let v = t.addr | u64::from(t.read) | (u64::from(t.write) << 1);
            ifc::set64(&mut out, QUERY_MKEY_OUT_MTT0 + 8 * i, v);
        }
    }
    Ok(out)
}

pub fn destroy_mkey(hca: &mut Hca, c: &Ctx) -> CmdResult {
    c.need_input(0x10)?;
    c.reserved_zero(0x10, &[MKEY_INDEX])?;
    let index = index_of(hca, c)?;
    let out = c.output(0x10)?;
    hca.mkeys.remove(&index);
    Ok(out)
}
