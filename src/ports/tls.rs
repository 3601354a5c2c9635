//! The ports listener's certificate and server config: one `*.{domain}` certificate, from
//! `[ports] tls_cert_file`/`tls_key_file` or issued by sandgate's CA
//! ([`crate::tls::served`]). ALPN offers `http/1.1` only (the gateway forwards HTTP/1.1).

use std::sync::Arc;

use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;

use crate::config::PortsConfig;
use crate::tls::leaf::LeafError;
use crate::tls::served::{from_files, CertFileError, RenewingLeaf};
use crate::tls::{FixedResolver, LeafMinter};

#[derive(Debug, thiserror::Error)]
pub enum PortsCertError {
    #[error("ports.tls_cert_file / tls_key_file: {0}")]
    Files(#[from] CertFileError),
    #[error("the ports listener's certificate: {0}")]
    Issue(#[from] LeafError),
    #[error("ports listener TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The ports listener's server config.
pub fn server_config(
    config: &PortsConfig,
    minter: &Arc<LeafMinter>,
) -> Result<Arc<ServerConfig>, PortsCertError> {
    let resolver: Arc<dyn ResolvesServerCert> = match (&config.tls_cert_file, &config.tls_key_file)
    {
        (Some(cert), Some(key)) => Arc::new(FixedResolver(Arc::new(from_files(cert, key)?))),
        _ => Arc::new(RenewingLeaf::new(
            minter.clone(),
            format!("*.{}", config.domain),
            "ports",
        )?),
    };
    let mut tls = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}
