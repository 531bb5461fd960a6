//! The zero-config demo of `cargo xtask run`: fresh random keys for the tenant `demo` and for the admin on
//! every run, passed to the image as `tenant=demo:HEX admin=HEX`, and written to the file `leasectl` reads by
//! default, so that `cargo run -p leasectl -- ping` works from another terminal with no flags.

use std::path::{Path, PathBuf};

use leasectl::FileConfig;

/// The tenant `cargo xtask run` creates.
pub const TENANT: &str = "demo";
/// Key length in bytes (the kernel accepts 16 to 64).
const KEY_BYTES: usize = 32;
/// The control service's port in the guest when the kernel arguments do not set `port=`.
pub const GUEST_PORT: u16 = 7470;

/// One run's keys, as hex.
pub struct DemoKeys {
    pub tenant_hex: String,
    pub admin_hex: String,
}

fn random_hex() -> Result<String, String> {
    leasectl::hex::random_key(KEY_BYTES)
}

impl DemoKeys {
    pub fn generate() -> Result<DemoKeys, String> {
        Ok(DemoKeys { tenant_hex: random_hex()?, admin_hex: random_hex()? })
    }

    /// The kernel options that configure both principals.
    pub fn kernel_words(&self) -> [String; 2] {
        [format!("tenant={TENANT}:{}", self.tenant_hex), format!("admin={}", self.admin_hex)]
    }

    /// `text` with the keys replaced by `***` (for the QEMU command line printed on the terminal).
    pub fn redact(&self, text: &str) -> String {
        text.replace(&self.tenant_hex, "***").replace(&self.admin_hex, "***")
    }

    /// The leasectl configuration for a control port forwarded to `127.0.0.1:host_port`.
    pub fn client_config(&self, host_port: u16) -> FileConfig {
        FileConfig {
            addr: Some(format!("127.0.0.1:{host_port}")),
            tenant: Some(TENANT.to_string()),
            key: Some(self.tenant_hex.clone()),
            admin_key: Some(self.admin_hex.clone()),
            ..FileConfig::default()
        }
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
pub fn write_config(keys: &DemoKeys, host_port: u16, path: &Path) -> Result<(), String> {
    let comment = "written by `cargo xtask run`: keys of the tenant `demo` and of the admin for this run only";
    keys.client_config(host_port).write(path, comment)
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
    fn config_file_is_what_leasectl_reads() {
        let k = DemoKeys::generate().unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-demo-{}", std::process::id()));
        let path = dir.join("leasebox/leasectl.conf");
        write_config(&k, 7471, &path).unwrap();
        let c = FileConfig::load(&path).unwrap();
        assert_eq!(c.addr.as_deref(), Some("127.0.0.1:7471"));
        assert_eq!(c.tenant.as_deref(), Some("demo"));
        assert_eq!(c.key.as_deref(), Some(k.tenant_hex.as_str()));
        assert_eq!(c.admin_key.as_deref(), Some(k.admin_hex.as_str()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
