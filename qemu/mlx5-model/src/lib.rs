//! `mlx5-model`: a ConnectX-5 stand-in that follows the PRM as recorded in Linux `include/linux/mlx5/mlx5_ifc.h`
//! and `device.h`. It sees the driver only through two memories — the BAR and the guest RAM — exactly as the
//! real HCA sees its host: MMIO registers and DMA. Assumptions where the PRM is unclear are in
//! `docs/hca-model.md`.

pub mod caps;
pub mod cmd;
pub mod cmdq;
pub mod completion;
pub mod cq;
pub mod dataplane;
pub mod eq;
pub mod eth;
pub mod events;
pub mod fault;
pub mod flow;
pub mod hca;
pub mod idle;
pub mod ifc;
pub mod initseg;
pub mod mem;
pub mod mkey;
pub mod model;
pub mod pages;
pub mod port;
pub mod qp;
pub mod roce;
pub mod shm;
pub mod timing;
pub mod trace;
pub mod umr;

pub use hca::{FnState, ModelConfig};
pub use mkey::MkeyInfo;
pub use model::{Doorbells, Model};
pub use timing::Timing;
