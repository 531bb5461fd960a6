//! Completion queues as CREATE_CQ describes them (`mlx5_ifc.h` `cqc`, `create_cq_in`; facts §e.4, §f.2, §f.3).
//! The model records the ring (PAS pages), the CQE size, the EQ its events go to and the doorbell record
//! address; CQE writing belongs to the data path that completes work requests.

use std::collections::BTreeMap;

/// One completion queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cq {
    pub cqn: u32,
    pub log_cq_size: u8,
    /// 64 or 128 (`cqe_sz` 0 / 1).
    pub cqe_size: u16,
    pub uar_page: u32,
    pub c_eqn: u8,
    pub log_page_size: u8,
    pub dbr_addr: u64,
    pub pas: Vec<u64>,
    /// The `cqc` bytes of the CREATE_CQ input.
    pub cqc: Vec<u8>,
}

/// The CQs of the function, by CQN.
#[derive(Default)]
pub struct CqTable {
    pub cqs: BTreeMap<u32, Cq>,
}

impl CqTable {
    pub fn clear(&mut self) {
        self.cqs.clear();
    }

    /// Whether any CQ reports to `eqn` (DESTROY_EQ is refused while one does).
    pub fn uses_eq(&self, eqn: u8) -> bool {
        self.cqs.values().any(|c| c.c_eqn == eqn)
    }
}
