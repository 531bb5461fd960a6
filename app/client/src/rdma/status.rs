//! Work completion status and opcode with rdma-core's names and numbers (`libibverbs/verbs.h`,
//! `enum ibv_wc_status`, `enum ibv_wc_opcode`), so a report reads the same whichever backend produced it.

use core::fmt;

/// `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
    TmErr = 22,
    TmRndvIncomplete = 23,
}

impl WcStatus {
    const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// The numeric value of `enum ibv_wc_status`.
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn from_code(code: u32) -> Option<WcStatus> {
        WcStatus::ALL.get(code as usize).copied()
    }

    /// The rdma-core constant's name, e.g. `IBV_WC_REM_ACCESS_ERR`.
    pub fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
            WcStatus::TmErr => "IBV_WC_TM_ERR",
            WcStatus::TmRndvIncomplete => "IBV_WC_TM_RNDV_INCOMPLETE",
        }
    }

    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `enum ibv_wc_opcode` values a requester of RDMA WRITE and READ completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    RdmaWrite = 1,
    RdmaRead = 2,
}

impl WcOpcode {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
        }
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_follow_rdma_core() {
        let cases = [
            (WcStatus::Success, 0, "IBV_WC_SUCCESS"),
            (WcStatus::LocLenErr, 1, "IBV_WC_LOC_LEN_ERR"),
            (WcStatus::LocQpOpErr, 2, "IBV_WC_LOC_QP_OP_ERR"),
            (WcStatus::LocProtErr, 4, "IBV_WC_LOC_PROT_ERR"),
            (WcStatus::WrFlushErr, 5, "IBV_WC_WR_FLUSH_ERR"),
            (WcStatus::BadRespErr, 7, "IBV_WC_BAD_RESP_ERR"),
            (WcStatus::LocAccessErr, 8, "IBV_WC_LOC_ACCESS_ERR"),
            (WcStatus::RemInvReqErr, 9, "IBV_WC_REM_INV_REQ_ERR"),
            (WcStatus::RemAccessErr, 10, "IBV_WC_REM_ACCESS_ERR"),
            (WcStatus::RemOpErr, 11, "IBV_WC_REM_OP_ERR"),
            (WcStatus::RetryExcErr, 12, "IBV_WC_RETRY_EXC_ERR"),
            (WcStatus::RnrRetryExcErr, 13, "IBV_WC_RNR_RETRY_EXC_ERR"),
            (WcStatus::GeneralErr, 21, "IBV_WC_GENERAL_ERR"),
        ];
        for (s, code, name) in cases {
            assert_eq!(s.code(), code);
            assert_eq!(s.name(), name);
            assert_eq!(WcStatus::from_code(code), Some(s));
        }
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(s.code() as usize, i);
        }
        assert_eq!(WcStatus::from_code(24), None);
        assert_eq!(WcOpcode::RdmaRead.code(), 2);
    }
}
