//! TLS on both sides of an intercepted tunnel: the server side presents minted leaves to the
//! sandbox; the client side verifies upstreams against the public web roots plus any extra
//! roots the operator configured. One crypto provider (ring) is used everywhere.

pub mod ca;
pub mod leaf;
pub mod served;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use ca::{CaOrigin, CertAuthority};
pub use leaf::{FixedResolver, LeafMinter, SniResolver};

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("upstream CA file {path}: {reason}")]
    UpstreamCa { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process default so crates that ask for "the" provider agree.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// ALPN offered to sandboxes on intercepted connections.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The shared server config for intercepted connections that carry SNI.
pub fn interception_server_config(
    minter: Arc<LeafMinter>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver(minter)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(config))
}

/// A server config that serves one leaf, for connections without SNI (IP-literal CONNECTs).
pub fn fixed_server_config(
    key: Arc<rustls::sign::CertifiedKey>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(FixedResolver(key)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Roots for upstream verification: the public web roots plus `extra` PEM files.
pub fn upstream_roots(extra: &[PathBuf]) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra {
        let err = |reason: String| TlsSetupError::UpstreamCa {
            path: path.clone(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| err(e.to_string()))?;
            roots.add(cert).map_err(|e| err(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(err("no certificate found".into()));
        }
    }
    Ok(roots)
}

/// Client config for upstream connections; ALPN is set by the connector.
pub fn upstream_client_config(extra: &[PathBuf]) -> Result<ClientConfig, TlsSetupError> {
    let roots = upstream_roots(extra)?;
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
