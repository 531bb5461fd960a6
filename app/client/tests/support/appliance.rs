//! Hosted appliances for the tests that run `Client`s against them (tests/hosted.rs, tests/data_path.rs):
//! each with the device model (`--hca`: RDMA over the model's UDP responder), a tenant and an admin key.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leasebox_client::rdma::SoftConfig;
use leasebox_client::{Appliance, Client, ClientConfig, Connection, Credentials, Event, RequesterConfig, Timeouts};
use leasebox_hosted::testing::Rig;

pub const MIB: u64 = 1 << 20;

/// The tests here each run whole appliances with spinning model threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shipped rig and what the tests here take from it: the tenant's and the admin's credentials and the
/// model's UDP responder.
pub struct Hosted1 {
    pub h: Rig,
    pub tenant: Credentials,
    pub admin: Credentials,
    pub udp: SocketAddr,
}

/// A hosted appliance with the model, a 1 s heartbeat timeout (so a broken connection shows within a
/// heartbeat period of 333 ms) and `options` (`KEY=VALUE` words).
pub fn start_hosted(options: &[&str]) -> Hosted1 {
    let b = Rig::builder().model().tenant("demo").admin().lease_grace_ms(100).heartbeat_ms(1000);
    let b = options.iter().fold(b, |b, o| {
        let (k, v) = o.split_once('=').unwrap_or_else(|| panic!("`{o}` is not KEY=VALUE"));
        b.option(k, v)
    });
    let h = b.start().unwrap();
    let udp = h.udp().unwrap();
    let tenant = Credentials { name: "demo".into(), key: h.key("demo").bytes().to_vec() };
    let admin = Credentials { name: "admin".into(), key: h.admin_key().bytes().to_vec() };
    Hosted1 { h, tenant, admin, udp }
}

impl Hosted1 {
    pub fn addr(&self) -> String {
        self.h.addr().to_string()
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
