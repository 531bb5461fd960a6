//! The lease dance's steps that every client takes the same way (docs/wire-protocol.md, ALLOC and READY):
//! ALLOC carries the requester's QP parameters; the answer names the appliance's QP, which the requester
//! connects to (its QP to RTS); READY then tells the appliance the client side is up. [`crate::Lease`] and
//! `leasectl verify` both go through here.

use leasebox_proto::{AllocReq, AllocResp, LeaseState, Request, Response, access, mtu_bytes};

use crate::rdma::{QpEndpoint, Requester, mtu_enum};

/// Why bringing a lease up failed.
#[derive(Debug)]
pub enum SetupError<E> {
    /// The requester's or the answer's parameters do not work (an MTU that is not an IB MTU).
    Params(String),
    /// The requester could not move its QP to RTS.
    Requester(String),
    /// The control call failed (`what`: the request).
    Call(&'static str, E),
    /// The appliance answered something other than what the protocol promises.
    Answer(String),
}

/// ALLOC's request for a read-write lease of `size` bytes with `ttl_ms` (0: the appliance's default), carrying
/// the requester's QP parameters `me`.
pub fn alloc_request(me: &QpEndpoint, size: u64, ttl_ms: u32) -> Result<AllocReq, String> {
    let mtu = mtu_enum(me.mtu).ok_or_else(|| format!("requester MTU {} is not an IB MTU", me.mtu))?;
    Ok(AllocReq {
        size,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu,
        ttl_ms,
        client_qpn: me.qpn,
        client_psn: me.psn,
        client_gid: me.gid,
        client_mac: me.mac,
    })
}

/// The appliance's side of the RC connection, from ALLOC's answer.
pub fn remote_endpoint(a: &AllocResp) -> Result<QpEndpoint, String> {
    let mtu = mtu_bytes(a.mtu).ok_or_else(|| format!("ALLOC answered MTU code {}", a.mtu))?;
    Ok(QpEndpoint { qpn: a.server_qpn, psn: a.server_psn, gid: a.server_gid, mac: a.server_mac, mtu })
}

/// After ALLOC: the requester's QP to RTS toward the appliance's QP, then READY (through `call`).
pub fn connect_and_ready<E>(
    call: &mut dyn FnMut(&Request) -> Result<Response, E>,
    r: &mut dyn Requester,
    a: &AllocResp,
) -> Result<(), SetupError<E>> {
    let remote = remote_endpoint(a).map_err(SetupError::Params)?;
    r.connect(&remote).map_err(|e| SetupError::Requester(format!("requester to RTS: {e}")))?;
    let ready = Request::Ready { lease: a.lease, client_qpn: r.local().qpn, server_qpn: a.server_qpn };
    match call(&ready).map_err(|e| SetupError::Call("READY", e))? {
        Response::Ready { state: LeaseState::Active } => Ok(()),
        other => Err(SetupError::Answer(format!("READY answered {other:?}"))),
    }
}
