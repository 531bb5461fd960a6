//! What the hosted tests share.
pub mod proxy;
