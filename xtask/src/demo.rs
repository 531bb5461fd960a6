//! The zero-config demo of `cargo xtask run`: fresh random keys for the tenant `demo` and for the admin on
//! every run, passed to the image as `tenant=demo:HEX admin=HEX`, and written to the file `leasectl` reads by
//! default, so that `cargo run -p leasectl -- ping` works from another terminal with no flags.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use leasebox_qemu::ModelHub;
use leasectl::FileConfig;

/// The tenant `cargo xtask run` creates.
pub const TENANT: &str = "demo";
/// Key length in bytes (the kernel accepts 16 to 64).
const KEY_BYTES: usize = 32;
/// The control service's port in the guest when the kernel arguments do not set `port=`.
pub const GUEST_PORT: u16 = 7470;

/// `run --ctl-nic mlx5`: the appliance's RDMA address (on QEMU's user subnet, so the port answers ARP for it
/// beside its DHCP address) and leasectl's address on that subnet.
pub const HUB_RDMA_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 16);
pub const HUB_LEASECTL_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// leasectl's MAC on the hub (its default is the model port's own MAC, which a shared segment cannot have twice).
pub const HUB_LEASECTL_MAC: &str = "02:4c:42:00:00:64";

/// The hub of `run --ctl-nic mlx5`: QEMU's user network, the model's Ethernet wire and leasectl's RDMA frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hub(pub ModelHub);

impl Hub {
    pub fn pick() -> Result<Hub, String> {
        ModelHub::pick().map(Hub).map_err(|e| format!("free UDP ports for the hub: {e}"))
    }

    /// The kernel options the hub needs: the CX-5 port as the control NIC and an RDMA address on its subnet
    /// (unless the user's arguments set one).
    pub fn kernel_words(&self, kernel_args: &[String]) -> Vec<String> {
        let mut w = vec!["ctl_nic=mlx5".to_string()];
        if !kernel_args.iter().flat_map(|a| a.split_whitespace()).any(|w| w.starts_with("rdma_ip=")) {
            w.push(format!("rdma_ip={HUB_RDMA_IP}"));
        }
        w
    }

    /// leasectl's RDMA cable: frames to QEMU's end of its hub port, from the address QEMU sends to, with an
    /// address on the subnet, the appliance's MAC found by ARP.
    fn rdma(&self, c: &mut FileConfig) {
        c.rdma_peer = Some(self.0.client.local.to_string());
        c.rdma_bind = Some(self.0.client.peer.to_string());
        c.rdma_local_ip = Some(HUB_LEASECTL_IP.to_string());
        c.rdma_local_mac = Some(HUB_LEASECTL_MAC.to_string());
        c.rdma_resolve = Some("arp".to_string());
    }
}

/// One run's keys, as hex.
pub struct DemoKeys {
    pub tenant_hex: String,
    pub admin_hex: String,
}

impl DemoKeys {
    pub fn generate() -> Result<DemoKeys, String> {
        // Real keys for a real run (the appliance's command line and leasectl's configuration file), from the
        // generator leasectl ships for that, not the test rig's.
        Ok(DemoKeys {
            tenant_hex: leasectl::hex::random_key(KEY_BYTES)?,
            admin_hex: leasectl::hex::random_key(KEY_BYTES)?,
        })
    }

    /// The kernel options that configure both principals.
    pub fn kernel_words(&self) -> [String; 2] {
        [format!("tenant={TENANT}:{}", self.tenant_hex), format!("admin={}", self.admin_hex)]
    }

    /// `text` with the keys replaced by `***` (for the QEMU command line printed on the terminal).
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.tenant_hex, "***").replace(&self.admin_hex, "***")
    }

    /// The leasectl configuration for a control port forwarded to `127.0.0.1:host_port`, and the RDMA cable
    /// of `hub` when the control NIC is the model's port.
    pub fn client_config(&self, host_port: u16, hub: Option<&Hub>) -> FileConfig {
        let mut c = FileConfig {
            addr: Some(format!("127.0.0.1:{host_port}")),
            tenant: Some(TENANT.to_string()),
            key: Some(self.tenant_hex.clone()),
            admin_key: Some(self.admin_hex.clone()),
            ..FileConfig::default()
        };
        if let Some(h) = hub {
            h.rdma(&mut c);
        }
        c
    }
}

/// Whether the user's kernel arguments already name principals (then `run` adds no keys of its own).
pub fn has_principals(kernel_args: &[String]) -> bool {
    kernel_args.iter().flat_map(|a| a.split_whitespace()).any(|w| w.starts_with("tenant=") || w.starts_with("admin="))
}

/// The guest's control port: the last `port=N` among the kernel arguments, else 7470.
pub fn guest_port(kernel_args: &[String]) -> u16 {
    kernel_args
        .iter()
        .flat_map(|a| a.split_whitespace())
        .filter_map(|w| w.strip_prefix("port="))
        .filter_map(|v| v.parse().ok())
        .next_back()
        .unwrap_or(GUEST_PORT)
}

/// Where leasectl looks by default; without `HOME` (and without `LEASECTL_CONFIG` / `XDG_CONFIG_HOME`),
/// `target/leasebox/leasectl.conf`.
pub fn config_path(out_dir: &Path) -> PathBuf {
    leasectl::config::default_path(|k| std::env::var(k).ok()).unwrap_or_else(|| out_dir.join("leasectl.conf"))
}

/// Writes the leasectl configuration (mode 0600).
pub fn write_config(keys: &DemoKeys, host_port: u16, hub: Option<&Hub>, path: &Path) -> Result<(), String> {
    let comment = "written by `cargo xtask run`: keys of the tenant `demo` and of the admin for this run only";
    keys.client_config(host_port, hub).write(path, comment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn fresh_keys_each_time() {
        let (a, b) = (DemoKeys::generate().unwrap(), DemoKeys::generate().unwrap());
        assert_eq!(a.tenant_hex.len(), 64);
        assert_ne!(a.tenant_hex, a.admin_hex);
        assert_ne!(a.tenant_hex, b.tenant_hex);
        let [t, ad] = a.kernel_words();
        assert_eq!(t, format!("tenant=demo:{}", a.tenant_hex));
        assert_eq!(ad, format!("admin={}", a.admin_hex));
        assert_eq!(a.redact(&format!("-append 'log=info {t} {ad}'")), "-append 'log=info tenant=demo:*** admin=***'");
        leasebox_qemu::iso::check_kernel_args(&a.kernel_words().join(" ")).unwrap();
    }

    #[test]
    fn user_principals_and_port() {
        assert!(!has_principals(&words(&["log=debug", "port=9000"])));
        assert!(has_principals(&words(&["tenant=x:00"])));
        assert!(has_principals(&words(&["log=debug admin=00"])));
        assert_eq!(guest_port(&words(&[])), 7470);
        assert_eq!(guest_port(&words(&["port=9000", "log=debug"])), 9000);
        assert_eq!(guest_port(&words(&["port=1 port=2"])), 2);
    }

    #[test]
    fn hub_ports_are_distinct_and_name_the_rdma_address() {
        let h = Hub::pick().unwrap();
        let mut ports =
            vec![h.0.model.local.port(), h.0.model.peer.port(), h.0.client.local.port(), h.0.client.peer.port()];
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 4);
        assert_eq!(h.kernel_words(&words(&["log=debug"])), ["ctl_nic=mlx5", "rdma_ip=10.0.2.16"]);
        assert_eq!(h.kernel_words(&words(&["rdma_ip=10.0.2.9"])), ["ctl_nic=mlx5"]);
    }

    #[test]
    fn config_file_is_what_leasectl_reads() {
        let k = DemoKeys::generate().unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-demo-{}", std::process::id()));
        let path = dir.join("leasebox/leasectl.conf");
        write_config(&k, 7471, None, &path).unwrap();
        let c = FileConfig::load(&path).unwrap();
        assert_eq!((c.rdma_peer.as_deref(), c.rdma_resolve.as_deref()), (None, None));
        let hub = Hub::pick().unwrap();
        write_config(&k, 7471, Some(&hub), &path).unwrap();
        let h = FileConfig::load(&path).unwrap();
        assert_eq!(h.rdma_peer, Some(hub.0.client.local.to_string()));
        assert_eq!(h.rdma_bind, Some(hub.0.client.peer.to_string()));
        assert_eq!((h.rdma_local_ip.as_deref(), h.rdma_resolve.as_deref()), (Some("10.0.2.100"), Some("arp")));
        assert_eq!(c.addr.as_deref(), Some("127.0.0.1:7471"));
        assert_eq!(c.tenant.as_deref(), Some("demo"));
        assert_eq!(c.key.as_deref(), Some(k.tenant_hex.as_str()));
        assert_eq!(c.admin_key.as_deref(), Some(k.admin_hex.as_str()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
