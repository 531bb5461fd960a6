//! Protection domains, UAR pages and transport domains (`mlx5_ifc.h`: `alloc_pd_in/out`, `dealloc_pd_in`,
//! `alloc_uar_in/out`, `dealloc_uar_in`, `alloc_transport_domain_in/out`, `dealloc_transport_domain_in`).
//! All are 16-byte structures with the handle at bit 0x48 (24 bits, [`OBJECT_ID`]).

use crate::command::{Command, Output};
use crate::handles::{Pdn, Tdn, UarPage};
use crate::ifc::{CMD_HDR_LEN, OBJECT_ID};

pub use crate::ifc::opcode::{
    MLX5_CMD_OP_ALLOC_PD, MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN, MLX5_CMD_OP_ALLOC_UAR, MLX5_CMD_OP_DEALLOC_PD,
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN, MLX5_CMD_OP_DEALLOC_UAR,
};

fn handle_cmd(opcode: u16, name: &'static str, handle: u32) -> Command {
    let mut c = Command::new(opcode, 0, CMD_HDR_LEN, CMD_HDR_LEN).with(name, handle.into());
    c.set(OBJECT_ID, handle);
    c
}

fn handle_out(out: &Output) -> u32 {
    out.get(OBJECT_ID)
}

pub fn alloc_pd() -> Command {
    Command::new(MLX5_CMD_OP_ALLOC_PD, 0, CMD_HDR_LEN, CMD_HDR_LEN)
}

pub fn parse_alloc_pd(out: &Output) -> Pdn {
    Pdn(handle_out(out))
}

pub fn dealloc_pd(pd: impl Into<Pdn>) -> Command {
    let pd: Pdn = pd.into();
    handle_cmd(MLX5_CMD_OP_DEALLOC_PD, "pd", pd.0)
}

pub fn alloc_uar() -> Command {
    Command::new(MLX5_CMD_OP_ALLOC_UAR, 0, CMD_HDR_LEN, CMD_HDR_LEN)
}

pub fn parse_alloc_uar(out: &Output) -> UarPage {
    UarPage(handle_out(out))
}

pub fn dealloc_uar(uar: impl Into<UarPage>) -> Command {
    let uar: UarPage = uar.into();
    handle_cmd(MLX5_CMD_OP_DEALLOC_UAR, "uar", uar.0)
}

pub fn alloc_transport_domain() -> Command {
    Command::new(MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN, 0, CMD_HDR_LEN, CMD_HDR_LEN)
}

pub fn parse_alloc_transport_domain(out: &Output) -> Tdn {
    Tdn(handle_out(out))
}

pub fn dealloc_transport_domain(td: impl Into<Tdn>) -> Command {
    let td: Tdn = td.into();
    handle_cmd(MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN, "td", td.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ifc::golden::{be16, be32, out};

    #[test]
    fn alloc_and_dealloc() {
        for (c, op) in [(alloc_pd(), 0x800), (alloc_uar(), 0x802), (alloc_transport_domain(), 0x816)] {
            assert_eq!(be16(c.input(), 0), op);
            assert_eq!((c.input().len(), c.out_len()), (0x10, 0x10));
        }
        let o = out(0x10, &[(0x08, &[0xff, 0x12, 0x34, 0x56])]);
        assert_eq!(parse_alloc_pd(&o), Pdn(0x12_3456));
        assert_eq!(parse_alloc_uar(&o), UarPage(0x12_3456));
        assert_eq!(parse_alloc_transport_domain(&o), Tdn(0x12_3456));

        let d = dealloc_pd(Pdn(0xab_cdef));
        assert_eq!(be16(d.input(), 0), 0x801);
        assert_eq!(be32(d.input(), 8), 0x00ab_cdef);
        assert_eq!(d.attrs().get("pd"), Some(0xab_cdef));
        assert_eq!(be32(dealloc_uar(UarPage(0x10)).input(), 8), 0x10);
        assert_eq!(be16(dealloc_uar(UarPage(0x10)).input(), 0), 0x803);
        assert_eq!(be32(dealloc_transport_domain(Tdn(3)).input(), 8), 3);
        assert_eq!(be16(dealloc_transport_domain(Tdn(3)).input(), 0), 0x817);
    }
}
