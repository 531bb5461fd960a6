//! Hosted appliances for the tests that run `Client`s against them (tests/hosted.rs, tests/data_path.rs):
//! each with the device model (`--hca`: RDMA over the model's UDP responder), a tenant and an admin key.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{Appliance, Client, ClientConfig, Connection, Credentials, Event, RequesterConfig, Timeouts};
use leasebox_hosted::{Hosted, HostedConfig};

pub const MIB: u64 = 1 << 20;

/// The tests here each run whole appliances with spinning model threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Hosted1 {
    pub h: Option<Hosted>,
    pub tenant: Credentials,
    pub admin: Credentials,
    pub udp: SocketAddr,
}

impl Drop for Hosted1 {
    fn drop(&mut self) {
        if let Some(h) = self.h.take() {
            h.stop();
        }
    }
}

pub fn key() -> (String, Vec<u8>) {
    let hex = leasebox_client::hex::random_key(32).expect("a random key");
    let bytes = leasebox_client::hex::decode(&hex).expect("hex");
    (hex, bytes)
}

/// A hosted appliance with the model, a 1 s heartbeat timeout (so a broken connection shows within a
/// heartbeat period of 333 ms) and `extra` options.
pub fn start_hosted(extra: &[&str]) -> Hosted1 {
    let ((tenant_hex, tenant_key), (admin_hex, admin_key)) = (key(), key());
    let mut args: Vec<String> =
        ["--listen", "127.0.0.1:0", "--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "heartbeat_ms=1000"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.push(format!("tenant=demo:{tenant_hex}"));
    args.push(format!("admin={admin_hex}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    let h = Hosted::start(HostedConfig::from_args(&args).unwrap()).unwrap();
    let udp = h.hca().unwrap().udp.unwrap();
    Hosted1 {
        h: Some(h),
        tenant: Credentials { name: "demo".into(), key: tenant_key },
        admin: Credentials { name: "admin".into(), key: admin_key },
        udp,
    }
}

impl Hosted1 {
    pub fn addr(&self) -> String {
        self.h.as_ref().unwrap().addr().to_string()
    }

    pub fn appliance_at(&self, addr: String) -> Appliance {
        Appliance {
            addr,
            credentials: self.tenant.clone(),
            requester: RequesterConfig::Soft(SoftConfig { peer: self.udp, ..SoftConfig::default() }),
        }
    }

    pub fn appliance(&self) -> Appliance {
        self.appliance_at(self.addr())
    }

    pub fn admin(&self) -> Connection {
        Connection::connect_and_hello(&self.addr(), &self.admin, Timeouts::all(Duration::from_secs(5))).unwrap().0
    }
}

pub fn config(appliances: Vec<Appliance>) -> ClientConfig {
    ClientConfig { timeouts: Timeouts::all(Duration::from_secs(5)), ..ClientConfig::new(appliances) }
}

/// Bytes that differ from block to block and are never all zero.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251 + 1) as u8).collect()
}

/// Waits for the first event `want` accepts, up to `within`.
pub fn wait_event(c: &Client, within: Duration, want: impl Fn(&Event) -> bool) -> Option<Event> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(e) = c.recv_event(Duration::from_millis(50))
            && want(&e)
        {
            return Some(e);
        }
    }
    None
}
