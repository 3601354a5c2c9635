//! The TLS proxy listener's certificate and server config.
//!
//! The certificate is either the operator's (`[proxy] tls_cert_file` / `tls_key_file`, PEM,
//! read once at start) or issued by sandgate's own CA for `[proxy] public_name`: the CA
//! sandboxes already trust for interception, so a sandbox needs no second trust anchor. An
//! issued certificate has the interception leaves' validity (`[tls] leaf_validity_hours`)
//! and is renewed as [`crate::tls::served`] says.
//!
//! ALPN offers `http/1.1` only: a proxy client speaks HTTP/1.1 to its proxy (CONNECT and
//! absolute-form requests), whatever it negotiates with the origin inside a tunnel. A client
//! that offers only `h2` is refused at the handshake.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::config::{ProxyCertificate, ProxyConfig};
use crate::tls::leaf::LeafError;
use crate::tls::served::{CertFileError, RenewingLeaf};
use crate::tls::{FixedResolver, LeafMinter};

/// ALPN on the proxy hop.
const ALPN: &[u8] = b"http/1.1";

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
            ProxyCertificate::Issued { name } => {
                Arc::new(RenewingLeaf::new(minter.clone(), name, "proxy_tls")?)
            }
        };
    let mut tls = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Some(Arc::new(tls)))
}

/// The chain in `cert` with the key in `key`, its errors named by the `[proxy]` keys.
fn from_files(cert: &Path, key: &Path) -> Result<CertifiedKey, ListenerCertError> {
    crate::tls::served::from_files(cert, key).map_err(|e| match e {
        CertFileError::Cert { path, reason } => ListenerCertError::CertFile { path, reason },
        CertFileError::Key { path, reason } => ListenerCertError::KeyFile { path, reason },
        CertFileError::Mismatch { cert, key } => ListenerCertError::KeyMismatch { cert, key },
    })
}
