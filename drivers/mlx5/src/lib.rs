//! `leasebox-mlx5`: the native ConnectX-4/5/6 driver. A safe `no_std` core — command encoding and decoding
//! (`command`, `field`, `ifc`), the initialization segment (`initseg`), the command queue with its 32 slots
//! (`cmdq`), EQ/CQ polling and health (`eq`, `cq`, `health`), bring-up, page supply and teardown in Linux
//! mlx5_core's order (`driver`), objects with typed handles (`objects`, `handles`), the polling engines with
//! their SPSC rings (`engine`, `ring`), the port's Ethernet queues (`eth`), what every send queue shares
//! (`sq`), the UMR queue pair that grants and revokes keys without commands (`umr`), the command ring (`log`) and PCI
//! matching (`probe`) — over
//! [`Platform`], which supplies BAR0, DMA memory and time; `testing` (feature `testing`) is the fake platform
//! the driver's tests and other crates' tests share. Field offsets follow Linux `include/linux/mlx5/mlx5_ifc.h` and
//! `device.h` (`docs/reference/mlx5.md`).
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
// A command error carries its opcode, op_mod and key attributes for the report; commands fail rarely, and a
// heap allocation per failure would buy nothing.
#![allow(clippy::result_large_err)]

extern crate alloc;

pub mod command;
pub mod field;
pub mod handles;
pub mod ifc;
pub mod platform;

pub use command::{Attrs, CmdError, Command, ErrorKind, Output};
pub use platform::{Deadline, DmaBuf, DmaFault, LiveAllocations, PAGE_SIZE, Platform};
pub mod cmdq;
pub mod cq;
pub mod driver;
pub mod engine;
pub mod eq;
pub mod eth;
pub mod health;
pub mod initseg;
pub mod log;
pub mod objects;
pub mod probe;
pub mod ring;
pub mod sq;
pub mod umr;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
