//! What the hosted tests share.
pub mod appliance;
pub mod proxy;
