//! `[ports]`, owned by the ports gateway: its listener, the domain ports are named under,
//! its certificate and its connection limits.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde::Deserialize;

use crate::base::ConfigError;

/// Where the listener binds when `listen` is not set.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7443);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortsConfig {
    /// Serve the ports of local sandboxes at `https://{port}-{sandbox}.{domain}`. When the
    /// listener cannot serve, the local pools declare `features.public_ports = false`.
    pub enabled: bool,
    /// Where the HTTPS listener binds. Unset: `127.0.0.1:7443`, and a start that finds it
    /// taken says so and serves without ports; set, a failure to bind fails the start.
    pub listen: Option<SocketAddr>,
    /// The domain ports are named under: `{port}-{sandbox id}.{domain}`. At least two labels
    /// (a `*.` wildcard certificate for one label is refused by clients). The default,
    /// under `localhost`, resolves to loopback in browsers and curl (RFC 6761); elsewhere
    /// point a wildcard DNS record `*.{domain}` at the listener.
    pub domain: String,
    /// The port URLs name, when clients reach the listener through another one (a load
    /// balancer on 443). Unset: the listener's own. 443 is left out of URLs.
    pub public_port: Option<u16>,
    /// The listener's certificate chain (PEM) for `*.{domain}`, with `tls_key_file`; both
    /// or neither. Without them the certificate is issued by sandgate's own CA
    /// (`[tls] ca_dir`), which clients then trust (`curl --cacert <ca_dir>/ca.pem`).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// At most this many client connections at once; more are closed at accept.
    pub max_connections: usize,
    /// Seconds a client may take to complete its TLS handshake, and then to send each
    /// request head.
    pub header_read_timeout_secs: u64,
}

impl Default for PortsConfig {
    fn default() -> Self {
        PortsConfig {
            enabled: true,
            listen: None,
            domain: "sandgate.localhost".into(),
            public_port: None,
            tls_cert_file: None,
            tls_key_file: None,
            max_connections: 1024,
            header_read_timeout_secs: 10,
        }
    }
}

impl PortsConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(message) = domain_problem(&self.domain) {
            return Err(ConfigError::invalid("ports.domain", message));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(ConfigError::invalid(
                "ports.tls_cert_file",
                "set both tls_cert_file and tls_key_file, or neither",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid(
                "ports.max_connections",
                "must be at least 1",
            ));
        }
        if self.header_read_timeout_secs == 0 {
            return Err(ConfigError::invalid(
                "ports.header_read_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.public_port == Some(0) {
            return Err(ConfigError::invalid(
                "ports.public_port",
                "must be 1 to 65535",
            ));
        }
        Ok(())
    }

    /// The address to bind, and whether it was configured (then a failure to bind it fails
    /// the start).
    pub fn listen_addr(&self) -> (SocketAddr, bool) {
        match self.listen {
            Some(addr) => (addr, true),
            None => (DEFAULT_LISTEN, false),
        }
    }
}

/// What is wrong with a ports domain, if anything: lower-case DNS labels (letters, digits,
/// hyphens), at least two, at most 200 characters, so `{port}-{id}.` still fits a name.
fn domain_problem(domain: &str) -> Option<&'static str> {
    let labels: Vec<&str> = domain.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if domain.len() > 200 || !labels.iter().all(label_ok) {
        Some("must be a lower-case DNS name (letters, digits, hyphens), at most 200 characters")
    } else if labels.len() < 2 {
        Some("needs at least two labels (e.g. sandgate.localhost): clients refuse a wildcard certificate for a single label")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domain_is_two_or_more_lower_case_labels() {
        assert_eq!(domain_problem("sandgate.localhost"), None);
        assert_eq!(domain_problem("p.example.com"), None);
        for bad in [
            "localhost",
            "",
            "a..b",
            "A.b",
            "-a.b",
            "a_b.c",
            "a.b.",
            &"a.".repeat(150),
        ] {
            assert!(domain_problem(bad).is_some(), "{bad:?}");
        }
    }
}
