//! `cargo xtask bench client`'s rxe columns: `leasectl bench-data --backend verbs` on rxe0
//! inside the Soft-RoCE guest (docs/rxe-guest.md), first on the QEMU appliance's segment (the model through its
//! own Ethernet port, as `bench rxe`), then against the rxe reference responder (a second guest running
//! `leasebox-hosted --verbs rxe0:1`). The measurement is leasectl's ([`leasectl::bench_data`]); this module
//! boots the guests, runs it and reads its JSON back.

use crate::Artifacts;
use crate::client_bench::DataRow;
use crate::lease_qemu::{self, Appliance};
use crate::rxe::{self, ANSWER_TIMEOUT_S, Client, ClientOut, GUEST_IP, REF_IP, Wire};

/// The lease in the guest (`--span`): 1 MiB at depth 64 reuses 16 of its slots. The guests have 512 MiB; the
/// client's registered region takes 64 MiB, and the reference responder registers the lease's memory.
pub const GUEST_SPAN: &str = "16M";

/// The command the client guest runs: `bench-data` over rxe0 (GID 1, eth0's IPv4-mapped address).
pub fn bench_cmd(ctl: &str, tenant_hex: &str, per_ms: u64) -> String {
    format!(
        "leasectl --addr {ctl} --timeout {ANSWER_TIMEOUT_S} --tenant demo --key {tenant_hex} --json bench-data \
         --backend verbs --device rxe0 --gid-index 1 --per-ms {per_ms} --span {GUEST_SPAN}"
    )
}

/// The rows in `lines` (the guest command's output): `bench-data`'s JSON, or its error object, or why neither
/// is there.
pub fn parse_rows(lines: &[String], code: i32) -> Result<Vec<DataRow>, String> {
    let json = lines
        .iter()
        .rev()
        .find_map(|l| {
            let t = l.trim();
            (t.starts_with("{\"bench_data\"") || t.starts_with("{\"error\"")).then_some(t)
        })
        .ok_or_else(|| format!("leasectl bench-data printed no JSON (exit {code}): {}", lines.join("\n    | ")))?;
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("bench-data JSON: {e}: {json}"))?;
    if let Some(m) = v["error"]["message"].as_str() {
        return Err(format!("leasectl bench-data (exit {code}): {m}"));
    }
    leasectl::bench_data::rows_from_json(&v)
}

fn rows_of(c: &ClientOut) -> Result<Vec<DataRow>, String> {
    parse_rows(&c.lines, c.code).map_err(|e| format!("{e} ({})", c.at))
}

/// Against the QEMU appliance: it boots with its control channel on the model's port, the client guest joins
/// its segment through a [`Wire`].
pub fn qemu(a: &Artifacts, per_ms: u64) -> Result<Vec<DataRow>, String> {
    let mut app = Appliance::boot_segment(a, &a.elf, "rxe-bench-data", "")?;
    let hub = app.hub.ok_or("booted without the hub")?;
    let ctl = format!("{}:{}", lease_qemu::SEGMENT_CTL_IP, crate::control::GUEST_PORT);
    let wire = Wire::start(hub.client, &a.log_dir.join("rxe-bench-data.pcap"))?;
    let cmd = bench_cmd(&ctl, &app.tenant_hex, per_ms);
    let c = Client { nic: wire.nic(), ip: GUEST_IP, neigh: vec![], cmd, tag: "bench-data-model" };
    let r = rxe::client_guest(a, &a.rxe_guest, c).and_then(|c| rows_of(&c));
    drop(wire);
    r.map_err(|e| app.fail(e))
}

/// Against the rxe reference responder (a second guest): the client guest on its wire, after its control
/// port answers.
pub fn reference(a: &Artifacts, per_ms: u64) -> Result<Vec<DataRow>, String> {
    let (t, ad) = (crate::control::random_hex()?, crate::control::random_hex()?);
    let (refg, wire) = rxe::reference(a, &a.rxe_guest, (&t, &ad), "rxe-bench-data.reference")?;
    let ctl = format!("{REF_IP}:{}", crate::control::GUEST_PORT);
    let cmd = rxe::after_ping(&ctl, &t, &bench_cmd(&ctl, &t, per_ms));
    let c = Client { nic: wire.nic(), ip: GUEST_IP, neigh: vec![], cmd, tag: "bench-data-reference" };
    rxe::client_guest(a, &a.rxe_guest, c)
        .and_then(|c| rows_of(&c))
        .map_err(|e| format!("{e}; responder console {}", refg.log.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rows_from_the_guest_output() {
        let row = DataRow {
            bytes: 4096,
            read: true,
            copying: leasectl::bench_data::Rate { ops: 10, bytes: 4096, secs: 1.0, error: None },
            zero_copy: Default::default(),
        };
        let mut zc = row.clone();
        for z in &mut zc.zero_copy {
            z.bytes = 4096;
        }
        let json = serde_json::json!({"bench_data": {"per_ms": 100, "rows": [zc.json()]}}).to_string();
        let got = parse_rows(&lines(&["rxe: something", &json]), 0).unwrap();
        assert_eq!(got, vec![zc]);
        let err = r#"{"error":{"code":"BENCH","detail":[],"message":"alloc: out of memory"}}"#;
        assert!(parse_rows(&lines(&[err]), 1).unwrap_err().contains("alloc: out of memory"));
        assert!(parse_rows(&lines(&["Segmentation fault"]), 139).unwrap_err().contains("exit 139"));
        assert!(
            bench_cmd("10.0.2.15:7470", "00", 250).contains("--backend verbs --device rxe0 --gid-index 1 --per-ms 250")
        );
    }
}
