//! The advertisement: what the registrar publishes for each appliance it sees answer, at
//! `/leasebox/v1/appliances/<boot id>` (32 hex digits), under an etcd lease that lapses when the appliance stops
//! answering. A JSON object (docs/fleet.md, "The key"): readers ignore fields they do not know, so later
//! versions may add fields; a change of meaning takes a new `/leasebox/v2/` prefix.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Where every appliance's key lives.
pub const PREFIX: &str = "/leasebox/v1/appliances/";
/// The registrars' election (etcd's election API; the leader's value is its name).
pub const ELECTION: &str = "/leasebox/v1/registrar-leader";

/// One appliance as the registrar last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Advertisement {
    /// The boot id (32 hex digits): a new one means the appliance rebooted and its leases are gone.
    pub boot_id: String,
    /// The control port, `HOST:PORT`.
    pub control: String,
    /// The appliance's name (its `appliance=`), which a client names in its HELLO (docs/security.md, "Appliance
    /// identity"); empty: the appliance has none (or the registrar is older than the field).
    pub name: String,
    /// Where RDMA reaches it: the RoCEv2 address as the operator configured it (for the software requester,
    /// the UDP `HOST:PORT` of the cable; empty when not configured).
    pub rdma: String,
    pub free_bytes: u64,
    pub leased_bytes: u64,
    /// Leases by state: Granted, Active, Fencing, PendingDestroy, Fenced (docs/wire-protocol.md "STATS").
    pub leases: [u32; 5],
    pub fenced_slots: u32,
    /// HEALTH's status: `ok`, `degraded` or `failed`.
    pub health: String,
    /// HEALTH's HCA state: `absent`, `initializing`, `ok` or `fatal`.
    pub hca: String,
    /// The operator's labels (zone, rack, …).
    pub labels: BTreeMap<String, String>,
    /// The registrar that wrote it.
    pub registrar: String,
}

impl Advertisement {
    pub fn key(&self) -> String {
        format!("{PREFIX}{}", self.boot_id)
    }

    /// Leases held (every state but Fenced).
    pub fn lease_count(&self) -> u32 {
        self.leases[..4].iter().sum()
    }

    /// Whether placement may send it new leases: healthy enough and with room.
    pub fn placeable(&self) -> bool {
        self.health != "failed" && self.hca == "ok" && self.free_bytes > 0
    }

    pub fn to_json(&self) -> String {
        json!({
            "boot_id": self.boot_id,
            "control": self.control,
            "name": self.name,
            "rdma": self.rdma,
            "free_bytes": self.free_bytes,
            "leased_bytes": self.leased_bytes,
            "leases": {
                "granted": self.leases[0], "active": self.leases[1], "fencing": self.leases[2],
                "pending_destroy": self.leases[3], "fenced": self.leases[4],
            },
            "fenced_slots": self.fenced_slots,
            "health": self.health,
            "hca": self.hca,
            "labels": self.labels,
            "registrar": self.registrar,
        })
        .to_string()
    }

    pub fn from_json(text: &[u8]) -> Result<Advertisement, String> {
        let v: Value = serde_json::from_slice(text).map_err(|e| format!("advertisement: {e}"))?;
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        let n = |k: &Value| k.as_u64().unwrap_or(0);
        let boot_id = s("boot_id");
        if boot_id.len() != 32 || !boot_id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("advertisement: boot_id '{boot_id}' is not 32 hex digits"));
        }
        let control = s("control");
        if control.is_empty() {
            return Err("advertisement: no control address".into());
        }
        let l = &v["leases"];
        let labels = v["labels"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default();
        let name = s("name");
        if name.len() > leasebox_proto::MAX_NAME || name.contains('@') {
            return Err(format!(
                "advertisement: appliance name '{name}' (at most {} bytes, no '@')",
                leasebox_proto::MAX_NAME
            ));
        }
        Ok(Advertisement {
            boot_id,
            control,
            name,
            rdma: s("rdma"),
            free_bytes: n(&v["free_bytes"]),
            leased_bytes: n(&v["leased_bytes"]),
            leases: ["granted", "active", "fencing", "pending_destroy", "fenced"].map(|k| n(&l[k]) as u32),
            fenced_slots: n(&v["fenced_slots"]) as u32,
            health: s("health"),
            hca: s("hca"),
            labels,
            registrar: s("registrar"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let a = Advertisement {
            boot_id: "00112233445566778899aabbccddeeff".into(),
            control: "10.0.0.1:7470".into(),
            name: "mem-a".into(),
            rdma: "10.0.1.1:4791".into(),
            free_bytes: 64 << 20,
            leased_bytes: 4 << 20,
            leases: [1, 2, 0, 0, 1],
            fenced_slots: 1,
            health: "degraded".into(),
            hca: "ok".into(),
            labels: [("zone".to_string(), "a".to_string())].into(),
            registrar: "r1".into(),
        };
        assert_eq!(a.key(), "/leasebox/v1/appliances/00112233445566778899aabbccddeeff");
        assert_eq!(Advertisement::from_json(a.to_json().as_bytes()).unwrap(), a);
        assert_eq!(a.lease_count(), 3);
        assert!(a.placeable());
        assert!(!Advertisement { hca: "fatal".into(), ..a.clone() }.placeable());
        assert!(
            Advertisement::from_json(b"{\"boot_id\":\"xyz\",\"control\":\"a:1\"}").unwrap_err().contains("boot_id")
        );
        assert!(Advertisement::from_json(b"not json").is_err());
        // Unknown fields are ignored: a later version may add some.
        let more = a.to_json().replacen('{', "{\"future\":1,", 1);
        assert_eq!(Advertisement::from_json(more.as_bytes()).unwrap(), a);
        // A registrar older than `name`: the appliance is read as unnamed.
        let mut v: serde_json::Value = serde_json::from_str(&a.to_json()).unwrap();
        v.as_object_mut().unwrap().remove("name");
        assert_eq!(
            Advertisement::from_json(v.to_string().as_bytes()).unwrap(),
            Advertisement { name: String::new(), ..a.clone() }
        );
        v["name"] = "x@y".into();
        assert!(Advertisement::from_json(v.to_string().as_bytes()).unwrap_err().contains("appliance name"));
    }
}
