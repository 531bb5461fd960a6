//! The `scale-qemu` scenario (docs/operations.md, "Scale"): the appliance as shipped (model attached,
//! virtio-net) in a 640 MiB guest, with no `sessions=`: the budget it sizes from its memory (the ready line's
//! `sessions=`) holds at least 257 places. 256 tenant sessions log in and heartbeat through two heartbeat
//! periods while leases are granted (ALLOC + READY) and revoked by the admin; at the end every one of the 256
//! still answers, and STATS counts them. Under TCG on a shared machine, so the deadlines are generous.

use crate::Artifacts;
use crate::control::{Nic, SHIPPED_BOOT_DEADLINE, Target, spawn_appliance_mem};
use leasebox_proto::{AllocReq, LeaseState, Outcome, Request, Response, access};
use leasectl::{Client, ClientError, Credentials, Timeouts};
use std::time::{Duration, Instant};

pub const NAME: &str = "scale-qemu";
/// Sessions held at once.
pub const SESSIONS: usize = 256;
/// Guest memory: enough that the budget sized from it covers [`SESSIONS`] and the admin.
const MEM_MIB: u32 = 640;
/// The appliance's heartbeat timeout (`heartbeat_ms=`, its default): sessions heartbeat every third of it.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// Logging all sessions in may take this long (the appliance answers 32 connections and HELLOs a second from
/// one address after a burst of 64, and each handshake costs the guest's core milliseconds under TCG).
const LOGIN_DEADLINE: Duration = Duration::from_secs(300);

/// Connects and authenticates, trying again while the appliance answers BUSY (its rates).
fn login(addr: &str, who: &Credentials, until: Instant) -> Result<Client, String> {
    let t = Timeouts {
        connect: Duration::from_secs(10),
        receive: Duration::from_secs(30),
        retry_for: Duration::from_secs(30),
    };
    loop {
        match Client::connect_and_hello(addr, who, t) {
            Ok((c, _)) => return Ok(c),
            Err(ClientError::Server(_)) if Instant::now() < until => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("{}: {e}", who.name)),
        }
    }
}

fn heartbeat(c: &mut Client, echo: u64) -> Result<(), String> {
    match c.call(&Request::Heartbeat { echo }) {
        Ok(Response::Heartbeat { echo: e, .. }) if e == echo => Ok(()),
        other => Err(format!("HEARTBEAT {echo}: {other:?}")),
    }
}

/// One round: every session heartbeats.
fn round(clients: &mut [Client], tag: u64) -> Result<(), String> {
    for (i, c) in clients.iter_mut().enumerate() {
        heartbeat(c, (tag << 16) | i as u64).map_err(|e| format!("session {i}: {e}"))?;
    }
    Ok(())
}

/// ALLOC + READY of a 4 KiB lease on `c`, then the admin's REVOKE of it: TornDown.
fn grant_and_revoke(c: &mut Client, admin: &mut Client) -> Result<(), String> {
    let a = AllocReq {
        size: 4096,
        access: access::REMOTE_READ | access::REMOTE_WRITE,
        mtu: 3,
        ttl_ms: 0,
        client_qpn: 0x1234,
        client_psn: 1,
        client_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 2],
        client_mac: [2, 0, 0, 0, 0, 2],
    };
    let Ok(Response::Alloc(a)) = c.call(&Request::Alloc(a)) else { return Err("ALLOC refused".into()) };
    let ready = Request::Ready { lease: a.lease, client_qpn: 0x1234, server_qpn: a.server_qpn };
    match c.call(&ready) {
        Ok(Response::Ready { state: LeaseState::Active }) => {}
        other => return Err(format!("READY: {other:?}")),
    }
    match admin.call(&Request::Revoke { lease: a.lease, qp_first: false }) {
        Ok(Response::Revoke { outcome: Outcome::TornDown, .. }) => Ok(()),
        other => Err(format!("REVOKE: {other:?}")),
    }
}

/// The scenario: see the module's comment.
pub fn run(a: &Artifacts) -> Result<String, String> {
    let mut t = spawn_appliance_mem(a, 1, Nic::Virtio, "", Some(MEM_MIB))?;
    let (ready, _) = t.wait_ready(SHIPPED_BOOT_DEADLINE)?;
    let sessions: usize =
        ready.get("sessions").and_then(|v| v.parse().ok()).ok_or("the ready line has no sessions=")?;
    if sessions < SESSIONS + 1 {
        return Err(format!("a {MEM_MIB} MiB guest sized sessions={sessions}: fewer than {} places", SESSIONS + 1));
    }
    drive(&t, sessions).map_err(|e| format!("{e} (ready line sessions={sessions})"))
}

fn drive(t: &Target, sessions: usize) -> Result<String, String> {
    let until = Instant::now() + LOGIN_DEADLINE;
    let mut admin = login(&t.addr, &t.admin(), until)?;
    let mut holder = login(&t.addr, &t.tenant(), until)?;
    let period = HEARTBEAT / 3;
    let t0 = Instant::now();
    let mut clients: Vec<Client> = Vec::with_capacity(SESSIONS);
    let mut last = Instant::now();
    let mut churned = 0u32;
    for i in 0..SESSIONS {
        clients.push(login(&t.addr, &t.tenant(), until).map_err(|e| format!("session {i}: {e}"))?);
        if last.elapsed() >= period {
            round(&mut clients, 1)?;
            heartbeat(&mut holder, 1)?;
            heartbeat(&mut admin, 1)?;
            last = Instant::now();
        }
    }
    let logged_in = t0.elapsed();
    // Two heartbeat periods, every session heartbeating, a lease granted and revoked each round.
    let t1 = Instant::now();
    let mut rounds = 0u64;
    while t1.elapsed() < 2 * HEARTBEAT {
        let r0 = Instant::now();
        round(&mut clients, 2 + rounds)?;
        grant_and_revoke(&mut holder, &mut admin)?;
        churned += 1;
        rounds += 1;
        std::thread::sleep(period.saturating_sub(r0.elapsed()));
    }
    round(&mut clients, 99)?;
    let Ok(Response::Stats(s)) = admin.call(&Request::Stats) else { return Err("STATS".into()) };
    if (s.sessions_current as usize) < SESSIONS + 2 {
        return Err(format!("STATS counts {} sessions, want at least {}", s.sessions_current, SESSIONS + 2));
    }
    Ok(format!(
        "sessions={sessions} sized from {MEM_MIB} MiB; {SESSIONS} sessions logged in in {:.1} s; {rounds} heartbeat \
         rounds over {:.1} s with {churned} leases granted and revoked; all {SESSIONS} answered; STATS \
         sessions_current={}",
        logged_in.as_secs_f64(),
        t1.elapsed().as_secs_f64(),
        s.sessions_current
    ))
}
