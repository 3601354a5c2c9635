//! The TLS proxy listener's certificate and server config.
//!
//! The certificate is either the operator's (`[proxy] tls_cert_file` / `tls_key_file`, PEM,
//! read once at start) or issued by sandgate's own CA for `[proxy] public_name`: the CA
//! sandboxes already trust for interception, so a sandbox needs no second trust anchor. An
//! issued certificate has the interception leaves' validity (`[tls] leaf_validity_hours`)
//! and is re-issued by the first handshake after half of it has passed, so the one served
//! never nears expiry and no timer task is needed.
//!
//! ALPN offers `http/1.1` only: a proxy client speaks HTTP/1.1 to its proxy (CONNECT and
//! absolute-form requests), whatever it negotiates with the origin inside a tunnel. A client
//! that offers only `h2` is refused at the handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::config::{ProxyCertificate, ProxyConfig};
use crate::tls::leaf::LeafError;
use crate::tls::{FixedResolver, LeafMinter};

/// ALPN on the proxy hop.
const ALPN: &[u8] = b"http/1.1";

/// How long to keep serving the current issued certificate after a failed renewal before
/// trying again (it is still valid for half its lifetime then).
const RENEW_RETRY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ListenerCertError {
    #[error("proxy.tls_listen is set but no certificate is configured (set public_name, or tls_cert_file and tls_key_file)")]
    Missing,
    #[error("proxy.tls_cert_file {path}: {reason}")]
    CertFile { path: PathBuf, reason: String },
    #[error("proxy.tls_key_file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("proxy.tls_key_file {key} is not the private key of the first certificate in {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("the TLS proxy listener's certificate: {0}")]
    Issue(#[from] LeafError),
    #[error("TLS proxy listener configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS listener's server config, or `None` when `[proxy] tls_listen` is not set.
pub fn server_config(
    config: &ProxyConfig,
    minter: &Arc<LeafMinter>,
) -> Result<Option<Arc<ServerConfig>>, ListenerCertError> {
    if config.tls_listen.is_none() {
        return Ok(None);
    }
    let resolver: Arc<dyn ResolvesServerCert> =
        match config.tls_certificate().ok_or(ListenerCertError::Missing)? {
            ProxyCertificate::Files { cert, key } => {
                Arc::new(FixedResolver(Arc::new(from_files(&cert, &key)?)))
            }
            ProxyCertificate::Issued { name } => Arc::new(RenewingLeaf::new(minter.clone(), name)?),
        };
    let mut tls = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Some(Arc::new(tls)))
}

/// The chain in `cert` (leaf first) with the key in `key`, checked to belong together.
fn from_files(cert: &Path, key: &Path) -> Result<CertifiedKey, ListenerCertError> {
    let cert_err = |reason: String| ListenerCertError::CertFile {
        path: cert.to_path_buf(),
        reason,
    };
    let key_err = |reason: String| ListenerCertError::KeyFile {
        path: key.to_path_buf(),
        reason,
    };
    let pem = std::fs::read(cert).map_err(|e| cert_err(e.to_string()))?;
    let chain = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate found".into()));
    }
    let pem = std::fs::read(key).map_err(|e| key_err(e.to_string()))?;
    let der = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| key_err(e.to_string()))?
        .ok_or_else(|| key_err("no PEM private key found (PKCS#8, PKCS#1 or SEC1)".into()))?;
    CertifiedKey::from_der(chain, der, &crate::tls::provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => ListenerCertError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        },
        other => key_err(other.to_string()),
    })
}

/// A certificate issued by sandgate's CA for one name, re-issued once half its validity
/// has passed.
struct RenewingLeaf {
    minter: Arc<LeafMinter>,
    name: String,
    current: Mutex<Issued>,
}

struct Issued {
    key: Arc<CertifiedKey>,
    renew_at: Instant,
}

impl std::fmt::Debug for RenewingLeaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewingLeaf")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RenewingLeaf {
    /// Issues the first certificate now, so a name the CA cannot sign for fails the start.
    fn new(minter: Arc<LeafMinter>, name: String) -> Result<RenewingLeaf, LeafError> {
        let key = minter.issue(&name)?;
        let renew_at = Instant::now() + minter.validity() / 2;
        tracing::info!(%name, validity = ?minter.validity(), "issued the TLS proxy listener's certificate from sandgate's CA");
        Ok(RenewingLeaf {
            minter,
            name,
            current: Mutex::new(Issued { key, renew_at }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        // A poisoned lock only means a renewal panicked; the certificate in it is intact.
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() >= current.renew_at {
            self.renew(&mut current);
        }
        current.key.clone()
    }

    fn renew(&self, current: &mut Issued) {
        let now = Instant::now();
        match self.minter.issue(&self.name) {
            Ok(key) => {
                tracing::info!(name = %self.name, "re-issued the TLS proxy listener's certificate");
                *current = Issued {
                    key,
                    renew_at: now + self.minter.validity() / 2,
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing the TLS proxy listener's certificate failed; serving the current one and retrying in a minute");
                current.renew_at = now + RENEW_RETRY;
            }
        }
    }
}

impl ResolvesServerCert for RenewingLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minter(validity: Duration) -> (tempfile::TempDir, Arc<LeafMinter>) {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = crate::tls::CertAuthority::load_or_generate(dir.path()).unwrap();
        (dir, Arc::new(LeafMinter::new(Arc::new(ca), validity, 4)))
    }

    #[test]
    fn an_issued_certificate_is_kept_until_half_its_validity_then_reissued() {
        let (_dir, minter) = minter(Duration::from_secs(3600));
        let leaf = RenewingLeaf::new(minter, "gw.example.com".into()).unwrap();
        let first = leaf.current();
        assert!(Arc::ptr_eq(&first, &leaf.current()), "re-issued too early");
        leaf.current.lock().unwrap().renew_at = Instant::now();
        let second = leaf.current();
        assert!(!Arc::ptr_eq(&first, &second), "not re-issued when due");
        assert_ne!(first.cert[0], second.cert[0]);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["gw.test".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, other.serialize_pem()).unwrap();
        let err = from_files(&cert_file, &key_file).unwrap_err();
        assert!(
            matches!(err, ListenerCertError::KeyMismatch { .. }),
            "{err}"
        );
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        from_files(&cert_file, &key_file).unwrap();
        std::fs::write(&key_file, cert.pem()).unwrap();
        let err = from_files(&cert_file, &key_file).unwrap_err();
        assert!(matches!(err, ListenerCertError::KeyFile { .. }), "{err}");
    }
}
