//! Certificates sandgate serves on its own TLS listeners (the TLS proxy listener, the ports
//! gateway): the operator's, read from PEM files once at start, or one issued by sandgate's
//! own CA for a name and renewed by the first handshake after half its validity has passed,
//! so the one served never nears expiry and no timer task is needed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::leaf::LeafError;
use super::LeafMinter;

/// How long to keep serving the current issued certificate after a failed renewal before
/// trying again (it is still valid for half its lifetime then).
const RENEW_RETRY: Duration = Duration::from_secs(60);

/// Why a certificate and key read from files cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertFileError {
    #[error("{path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("{key} is not the private key of the first certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
}

/// The chain in `cert` (leaf first) with the key in `key`, checked to belong together.
pub fn from_files(cert: &Path, key: &Path) -> Result<CertifiedKey, CertFileError> {
    let cert_err = |reason: String| CertFileError::Cert {
        path: cert.to_path_buf(),
        reason,
    };
    let key_err = |reason: String| CertFileError::Key {
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
    CertifiedKey::from_der(chain, der, &super::provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => CertFileError::Mismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        },
        other => key_err(other.to_string()),
    })
}

/// A certificate issued by sandgate's CA for one name (a `*.` wildcard included),
/// re-issued once half its validity has passed. `what` names the listener in logs.
pub struct RenewingLeaf {
    minter: Arc<LeafMinter>,
    name: String,
    what: &'static str,
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
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl RenewingLeaf {
    /// Issues the first certificate now, so a name the CA cannot sign for fails the start.
    pub fn new(
        minter: Arc<LeafMinter>,
        name: String,
        what: &'static str,
    ) -> Result<RenewingLeaf, LeafError> {
        let key = minter.issue(&name)?;
        let renew_at = Instant::now() + minter.validity() / 2;
        tracing::info!(%name, validity = ?minter.validity(), listener = what, "issued a listener certificate from sandgate's CA");
        Ok(RenewingLeaf {
            minter,
            name,
            what,
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
                tracing::info!(name = %self.name, listener = self.what, "re-issued a listener certificate");
                *current = Issued {
                    key,
                    renew_at: now + self.minter.validity() / 2,
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, listener = self.what, "renewing a listener certificate failed; serving the current one and retrying in a minute");
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
        let leaf = RenewingLeaf::new(minter, "gw.example.com".into(), "test").unwrap();
        let first = leaf.current();
        assert!(Arc::ptr_eq(&first, &leaf.current()), "re-issued too early");
        leaf.current.lock().unwrap().renew_at = Instant::now();
        let second = leaf.current();
        assert!(!Arc::ptr_eq(&first, &second), "not re-issued when due");
        assert_ne!(first.cert[0], second.cert[0]);
    }

    #[test]
    fn a_wildcard_name_is_issued() {
        let (_dir, minter) = minter(Duration::from_secs(3600));
        RenewingLeaf::new(minter, "*.sandgate.localhost".into(), "test").unwrap();
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
        assert!(matches!(err, CertFileError::Mismatch { .. }), "{err}");
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        from_files(&cert_file, &key_file).unwrap();
        std::fs::write(&key_file, cert.pem()).unwrap();
        let err = from_files(&cert_file, &key_file).unwrap_err();
        assert!(matches!(err, CertFileError::Key { .. }), "{err}");
    }
}
