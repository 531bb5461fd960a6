//! TLS to etcd (rustls, ring): the cluster's CA, and a client certificate when the cluster asks for one
//! (`--client-cert-auth`), the same three files etcdctl takes (`--cacert`, `--cert`, `--key`). The server's
//! certificate must name the endpoint's host (a DNS name or an IP address in its subjectAltName).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM files for TLS to etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificates the servers' certificates must chain to.
    pub ca: PathBuf,
    /// This client's certificate chain, for clusters that verify clients.
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// From the three options as given (`--etcd-cacert`, `--etcd-cert`, `--etcd-key`): none at all is plain
    /// HTTP; a certificate needs its key and the other way round, and both need the CA.
    pub fn from_options(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<Self>, String> {
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), cert, key) if cert.is_some() == key.is_some() => Ok(Some(TlsFiles { ca, cert, key })),
            (Some(_), ..) => Err("--etcd-cert and --etcd-key go together".into()),
            (None, ..) => Err("--etcd-cert and --etcd-key need --etcd-cacert (the CA of the etcd servers)".into()),
        }
    }

    /// The rustls client configuration; an error names the file and what is wrong with it.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certificates(&self.ca)? {
            roots.add(c).map_err(|e| format!("{}: not a usable CA certificate: {e}", self.ca.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert)?;
                let k = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("{}: no PEM private key: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, k)
                    .map_err(|e| format!("{} with {}: {e}", cert.display(), key.display()))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}

/// Every certificate in a PEM file (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_go_together() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(TlsFiles::from_options(None, None, None), Ok(None));
        assert_eq!(
            TlsFiles::from_options(p("ca"), None, None),
            Ok(Some(TlsFiles { ca: "ca".into(), cert: None, key: None }))
        );
        assert!(TlsFiles::from_options(p("ca"), p("c"), p("k")).unwrap().is_some());
        assert!(TlsFiles::from_options(p("ca"), p("c"), None).unwrap_err().contains("go together"));
        assert!(TlsFiles::from_options(None, p("c"), p("k")).unwrap_err().contains("--etcd-cacert"));
    }

    #[test]
    fn bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("leasebox-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let missing = TlsFiles { ca: dir.join("missing.pem"), cert: None, key: None };
        assert!(missing.client_config().unwrap_err().contains("missing.pem"));
        let none = TlsFiles { ca: empty.clone(), cert: None, key: None };
        assert!(none.client_config().unwrap_err().contains("no PEM certificate"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
