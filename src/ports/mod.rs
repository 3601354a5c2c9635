//! The ports gateway (`[ports]`): what a local sandbox serves on a port of its own
//! loopback, reachable from outside as `https://{port}-{sandbox id}.{domain}`.
//!
//! # Contract
//!
//! - **Listener**: one HTTPS listener (`[ports] listen`, default `127.0.0.1:7443`), HTTP/1.1
//!   (ALPN `http/1.1`), serving a `*.{domain}` certificate: the operator's files, or issued
//!   by sandgate's CA (`[tls] ca_dir`/`ca.pem`, the CA a client then trusts). It serves only
//!   where local sandboxes run (a pool of kind `local`); the local pools declare
//!   `features.public_ports` true only while it serves.
//! - **Naming**: the TLS server name and every request's `Host` must both be
//!   `{port}-{sandbox}.{domain}` ([`host::parse`]: port 1 to 65535 without leading zeros,
//!   a sandbox id of lower-case letters, digits and hyphens) and name the same port of the
//!   same sandbox: a host outside the domain or malformed is 400 `invalid_host`, a `Host`
//!   that differs from the server name 421 `misdirected` (one connection serves one port).
//! - **Authorization**: every request is a decision of `sandgate.action`, operation
//!   `ports`, in the decision log like any other action ([`crate::operations::ports`]).
//!   A token, from `GET /v1/sandboxes/{id}/ports/{port}` (or the E2B facade's
//!   `trafficAccessToken`), is presented in `X-Sandgate-Port-Token` or
//!   `E2b-Traffic-Access-Token`; both headers are removed before the request is forwarded
//!   and a token is never logged. Refusals are sandgate's error shape: 401
//!   `port_token_required` / `port_token_invalid`, 403 `policy_denied`, 404 `not_found`,
//!   409 `sandbox_state`, 502 `port_closed` (nothing listens), 501 `unsupported`.
//! - **Forwarding**: each admitted request gets its own connection to the port, made from
//!   inside the sandbox's network namespace; the request goes as it came (its `Host`
//!   included) plus `X-Forwarded-For`, `-Proto` and `-Host`, and the answer comes back as
//!   it is. An HTTP/1.1 upgrade (WebSocket) answered 101 is spliced both ways until
//!   either side closes.
//! - **Limits**: at most `max_connections` client connections (more are closed at accept);
//!   a TLS handshake and each request head within `header_read_timeout_secs`.
//! - **Metrics**: `sandgate_port_requests_total{outcome}` (a fixed set of outcomes, never a
//!   sandbox id, host or port) and `sandgate_port_connections_shed_total`.

mod forward;
pub mod host;
mod serve;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use tls::{server_config, PortsCertError};

use crate::config::PortsConfig;
use crate::operations::OpsContext;

/// How the gateway names a sandbox's ports, for the answers that hand out URLs (`/v1`, the
/// E2B facade).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortUrls {
    domain: String,
    /// The port in URLs; `None` for 443.
    port: Option<u16>,
}

impl PortUrls {
    /// URLs under `domain`, reached on `port` (the listener's, or `[ports] public_port`).
    pub fn new(domain: &str, port: u16) -> PortUrls {
        PortUrls {
            domain: domain.to_string(),
            port: (port != 443).then_some(port),
        }
    }

    /// `{port}-{sandbox}.{domain}[:port]`: the URL's authority. Also E2B's `get_host(port)`,
    /// which the SDKs build from the `domain` [`PortUrls::e2b_domain`] gives.
    pub fn host(&self, sandbox: &str, port: u16) -> String {
        format!("{port}-{sandbox}.{}", self.e2b_domain())
    }

    /// `https://{port}-{sandbox}.{domain}[:port]`, spelled out for the start-up log.
    pub fn pattern(&self) -> String {
        format!("https://{{port}}-{{sandbox}}.{}", self.e2b_domain())
    }

    /// `https://{host}`.
    pub fn url(&self, sandbox: &str, port: u16) -> String {
        format!("https://{}", self.host(sandbox, port))
    }

    /// The `domain` an E2B SDK is told: the ports domain, with the listener's port when it
    /// is not 443, so that `get_host(port)` is this gateway's host for that port.
    pub fn e2b_domain(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.domain),
            None => self.domain.clone(),
        }
    }
}

/// A serving ports gateway: what it serves with.
pub(crate) struct Gateway {
    ops: OpsContext,
    domain: String,
    limits: serve::Limits,
}

/// Serves the ports gateway on `listener` until the task is aborted.
pub fn spawn(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    config: &PortsConfig,
    ops: OpsContext,
) -> tokio::task::JoinHandle<()> {
    let gateway = Arc::new(Gateway {
        ops,
        domain: config.domain.clone(),
        limits: serve::Limits::from(config),
    });
    tokio::spawn(serve::serve(listener, tls, gateway))
}

/// The port URLs name, for a listener bound at `bound`.
pub fn url_port(config: &PortsConfig, bound: SocketAddr) -> u16 {
    config.public_port.unwrap_or(bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_port_unless_it_is_443() {
        let urls = PortUrls::new("sandgate.localhost", 7443);
        assert_eq!(
            urls.url("sb-1", 8000),
            "https://8000-sb-1.sandgate.localhost:7443"
        );
        assert_eq!(urls.e2b_domain(), "sandgate.localhost:7443");
        let urls = PortUrls::new("p.example.com", 443);
        assert_eq!(urls.url("sb-1", 3000), "https://3000-sb-1.p.example.com");
        assert_eq!(urls.e2b_domain(), "p.example.com");
    }
}
