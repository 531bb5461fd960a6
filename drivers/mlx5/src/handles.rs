//! Typed firmware handles: the numbers the HCA returns from `alloc_pd_out.pd`, `alloc_transport_domain_out`,
//! `alloc_uar_out.uar`, `create_eq_out.eq_number`, `create_cq_out.cqn`, `create_qp_out.qpn`,
//! `create_mkey_out.mkey_index`, `create_flow_table_out.table_id` and `create_flow_group_out.group_id`
//! (`mlx5_ifc.h`), each in its own type so a CQN cannot be passed where a QPN is expected. All print in hex,
//! as firmware traces and Linux's debug output do.

use core::fmt;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl $name {
            pub const fn raw(self) -> u32 {
                self.0
            }
        }

        impl From<u32> for $name {
            fn from(v: u32) -> $name {
                $name(v)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

handle!(
    /// Protection domain (24 bits, `alloc_pd_out.pd`).
    Pdn
);
handle!(
    /// Transport domain (24 bits, `alloc_transport_domain_out.transport_domain`).
    Tdn
);
handle!(
    /// UAR page index: BAR0 page number of the doorbell page (24 bits, `alloc_uar_out.uar`).
    UarPage
);
handle!(
    /// Event queue number (8 bits, `create_eq_out.eq_number`).
    Eqn
);
handle!(
    /// Completion queue number (24 bits, `create_cq_out.cqn`).
    Cqn
);
handle!(
    /// Queue pair number (24 bits, `create_qp_out.qpn`).
    Qpn
);
handle!(
    /// Index of a memory key in the HCA's MKEY table (24 bits, `create_mkey_out.mkey_index`).
    MkeyIndex
);
handle!(
    /// Flow table id (24 bits, `create_flow_table_out.table_id`).
    FlowTableId
);
handle!(
    /// Flow group id (`create_flow_group_out.group_id`).
    FlowGroupId
);
handle!(
    /// Entry index inside a flow table (`set_fte_in.flow_index`).
    FlowIndex
);
handle!(
    /// A whole memory key as lkey/rkey: `mkey_index << 8 | mkey_7_0` (Linux `core/mr.c`, `mlx5_idx_to_mkey`).
    Mkey
);

impl Mkey {
    /// The key for `index` with the 8-bit variant the caller chose for this incarnation.
    pub const fn new(index: MkeyIndex, variant: u8) -> Mkey {
        Mkey(((index.0 & 0x00ff_ffff) << 8) | variant as u32)
    }

    /// The table index DESTROY_MKEY / QUERY_MKEY take (`key >> 8`).
    pub const fn index(self) -> MkeyIndex {
        MkeyIndex(self.0 >> 8)
    }

    /// `mkc.mkey_7_0`.
    pub const fn variant(self) -> u8 {
        (self.0 & 0xff) as u8
    }
}

/// The 8-bit MKEY variant (`mkey_7_0`), rotated on every create so a re-used index yields a different key
/// (Linux mlx5_ib keeps such a counter per device). The driver's own MKEYs (the Ethernet port's, made at
/// bring-up) take from this counter; lease MKEYs take unpredictable variants from the lease service's CSPRNG
/// instead (`leasebox-lease` `service::ids`), which also refuses a variant equal to the one the index had
/// before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MkeyVariant(u8);

impl MkeyVariant {
    /// A counter whose first variant is `first`.
    pub const fn new(first: u8) -> MkeyVariant {
        MkeyVariant(first)
    }

    /// The variant the next [`MkeyVariant::take`] returns.
    pub fn peek(&self) -> u8 {
        self.0
    }

    /// The variant for the next MKEY. After 0xff comes 0x00 (8 bits, wrapping, as Linux's `mkey_key`): an index
    /// re-used 256 creates later gets its old key back, which the driver's own MKEYs (made once, at bring-up)
    /// never come near.
    pub fn take(&mut self) -> u8 {
        let v = self.0;
        self.0 = self.0.wrapping_add(1);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkey_is_index_and_variant() {
        let k = Mkey::new(MkeyIndex(0x12_3456), 0x9a);
        assert_eq!(k.0, 0x1234_569a);
        assert_eq!(k.index(), MkeyIndex(0x12_3456));
        assert_eq!(k.variant(), 0x9a);
        assert_eq!(alloc::format!("{k}"), "0x1234569a");
        assert_eq!(alloc::format!("{}", Qpn(0x1f)), "0x1f");
    }

    /// The key and the variant counter at their limits: the largest index with variant 0xff is the whole 32
    /// bits, an index wider than 24 bits is cut to them, and the variant counter wraps from 0xff to 0x00.
    #[test]
    fn mkey_and_variant_at_their_limits() {
        let k = Mkey::new(MkeyIndex(0xff_ffff), 0xff);
        assert_eq!((k.0, k.index(), k.variant()), (u32::MAX, MkeyIndex(0xff_ffff), 0xff));
        assert_eq!(Mkey::new(MkeyIndex(0x1ff_ffff), 0).index(), MkeyIndex(0xff_ffff));
        let mut v = MkeyVariant::new(0xfe);
        assert_eq!([v.take(), v.take(), v.take(), v.peek()], [0xfe, 0xff, 0x00, 0x01]);
    }
}
