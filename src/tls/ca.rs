//! The interception CA: generated on first start into `ca_dir` (`ca.pem`, `ca.key` with mode
//! 0600), reused afterwards. Its key signs leaf certificates and nothing else; it is never
//! served as a leaf key.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("CA directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("CA directory {dir} holds {present} but not {missing}; restore it or remove both to generate a new CA")]
    Incomplete {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    #[error("CA in {dir} is unusable: {reason}")]
    Invalid { dir: PathBuf, reason: String },
}

pub const CERT_FILE: &str = "ca.pem";
pub const KEY_FILE: &str = "ca.key";

/// A loaded CA ready to sign leaves.
pub struct CertAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    dir: PathBuf,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What `load_or_generate` did, so the caller can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    Loaded,
    Generated,
}

impl CertAuthority {
    /// Loads the CA from `dir`, generating it when neither file exists.
    pub fn load_or_generate(dir: &Path) -> Result<(CertAuthority, CaOrigin), CaError> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => Ok((Self::load(dir)?, CaOrigin::Loaded)),
            (false, false) => {
                Self::generate(dir)?;
                Ok((Self::load(dir)?, CaOrigin::Generated))
            }
            (true, false) => Err(CaError::Incomplete {
                dir: dir.into(),
                present: CERT_FILE,
                missing: KEY_FILE,
            }),
            (false, true) => Err(CaError::Incomplete {
                dir: dir.into(),
                present: KEY_FILE,
                missing: CERT_FILE,
            }),
        }
    }

    pub fn load(dir: &Path) -> Result<CertAuthority, CaError> {
        let io = |source| CaError::Io {
            dir: dir.into(),
            source,
        };
        let invalid = |reason: String| CaError::Invalid {
            dir: dir.into(),
            reason,
        };
        let cert_pem = fs::read_to_string(dir.join(CERT_FILE)).map_err(io)?;
        let key_pem = fs::read_to_string(dir.join(KEY_FILE)).map_err(io)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| invalid(format!("{KEY_FILE}: {e}")))?;
        let cert_der = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .next()
            .ok_or_else(|| invalid(format!("{CERT_FILE} holds no certificate")))?
            .map_err(|e| invalid(format!("{CERT_FILE}: {e}")))?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| invalid(format!("{CERT_FILE}: {e}")))?;
        Ok(CertAuthority {
            cert_pem,
            cert_der,
            issuer,
            dir: dir.into(),
        })
    }

    fn generate(dir: &Path) -> Result<(), CaError> {
        let io = |source| CaError::Io {
            dir: dir.into(),
            source,
        };
        fs::create_dir_all(dir).map_err(io)?;
        let key = KeyPair::generate().map_err(|e| CaError::Invalid {
            dir: dir.into(),
            reason: e.to_string(),
        })?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "sandgate");
        name.push(
            DnType::CommonName,
            format!("sandgate egress interception CA {}", short_id()),
        );
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(3650);
        let cert = params.self_signed(&key).map_err(|e| CaError::Invalid {
            dir: dir.into(),
            reason: e.to_string(),
        })?;
        // Key first, with its mode set at creation, so no window exists where a
        // world-readable key sits on disk.
        write_atomically(&dir.join(KEY_FILE), key.serialize_pem().as_bytes(), 0o600).map_err(io)?;
        write_atomically(&dir.join(CERT_FILE), cert.pem().as_bytes(), 0o644).map_err(io)?;
        Ok(())
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

fn short_id() -> String {
    let mut bytes = [0u8; 4];
    rand_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn rand_bytes(out: &mut [u8]) {
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(out)
        .expect("system random source unavailable");
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn generates_once_then_reuses_with_private_key_mode() {
        let dir = tempfile::tempdir().unwrap();
        let (first, origin) = CertAuthority::load_or_generate(dir.path()).unwrap();
        assert_eq!(origin, CaOrigin::Generated);
        let mode = fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (second, origin) = CertAuthority::load_or_generate(dir.path()).unwrap();
        assert_eq!(origin, CaOrigin::Loaded);
        assert_eq!(first.cert_der(), second.cert_der());
    }

    #[test]
    fn half_a_ca_is_an_error_not_a_silent_regeneration() {
        let dir = tempfile::tempdir().unwrap();
        CertAuthority::load_or_generate(dir.path()).unwrap();
        fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let err = CertAuthority::load_or_generate(dir.path()).unwrap_err();
        assert!(matches!(err, CaError::Incomplete { .. }), "{err}");
    }
}
