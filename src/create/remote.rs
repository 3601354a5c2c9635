//! How a sandbox reaches the egress proxy, by where it runs.
//!
//! - A local sandbox has its own listener inside its network namespace
//!   (`http://127.0.0.1:<[local] proxy_port>`, no credentials) and the CA at
//!   `/sandgate/ca.pem`: `enforcement = "namespace"`.
//! - A hosted sandbox on a pool that enforces egress through the gateway is given
//!   `[proxy] public_url` with its own identity in the userinfo, and its adapter locks the
//!   provider's native network controls to the gateway: `enforcement = "gateway"`. On an
//!   `advisory` pool it gets the same variables without the lock-down.
//! - Anything else (the simulated provider, a hosted pool without `public_url`) is shown the
//!   gateway's own proxy address: `enforcement = "proxy_credentials"`.
//!
//! The token is never stored in a view: URLs carry the `{token}` placeholder, filled in
//! only for the response of the create that made the sandbox.

use crate::config::PublicUrl;
use crate::providers::RemoteEgress;

/// The proxy address hosted sandboxes are given, and the CA they are told to trust.
#[derive(Debug, Clone)]
pub struct RemoteGateway {
    pub url: PublicUrl,
    /// sandgate's CA certificate (PEM), installed in each hosted sandbox.
    pub ca_pem: String,
}

impl RemoteGateway {
    /// The egress a hosted sandbox is created with.
    pub fn egress(&self, sandbox_id: &str, token: &str, lock_down: bool) -> RemoteEgress {
        RemoteEgress {
            proxy_url: self.proxy_url(sandbox_id, token),
            gateway_host: self.host(),
            gateway_port: self.url.port,
            ca_pem: self.ca_pem.clone(),
            lock_down,
        }
    }

    /// `scheme://<id>:<token>@host:port`; the id and token are URL-safe (an id is
    /// `[a-z0-9-]`, a token is hex), so nothing needs escaping.
    pub fn proxy_url(&self, sandbox_id: &str, token: &str) -> String {
        format!(
            "{}://{}:{}@{}:{}",
            self.url.scheme, sandbox_id, token, self.url.host, self.url.port
        )
    }

    /// The host without IPv6 brackets: what a provider's allow list takes.
    pub fn host(&self) -> String {
        self.url
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    }
}

/// Where a sandbox's proxy is, as its view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `namespace`, `gateway`, `advisory` or `proxy_credentials`.
    pub enforcement: &'static str,
    /// The proxy without credentials.
    pub base: String,
    /// The proxy URL with `{token}` where the sandbox's token goes (no token: `base`).
    pub url_template: String,
    /// The CA file's path as the sandbox sees it.
    pub ca_path: String,
}

impl Endpoint {
    /// Whether the sandbox authenticates to its proxy with its token.
    pub fn takes_token(&self) -> bool {
        self.url_template.contains("{token}")
    }

    /// The proxy URL with the token in place.
    pub fn url_with(&self, token: &str) -> String {
        self.url_template.replace("{token}", token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosted_sandboxes_get_the_public_url_with_their_identity() {
        let gateway = RemoteGateway {
            url: PublicUrl::parse("https://[2001:db8::1]:3129").unwrap(),
            ca_pem: "PEM".into(),
        };
        let egress = gateway.egress("sb-1", "abc", true);
        assert_eq!(egress.proxy_url, "https://sb-1:abc@[2001:db8::1]:3129");
        assert_eq!(egress.gateway_host, "2001:db8::1");
        assert_eq!(egress.gateway_port, 3129);
        assert!(egress.lock_down);
        let endpoint = Endpoint {
            enforcement: "gateway",
            base: "https://[2001:db8::1]:3129".into(),
            url_template: gateway.proxy_url("sb-1", "{token}"),
            ca_path: "/home/user/.sandgate/ca.pem".into(),
        };
        assert!(endpoint.takes_token());
        assert_eq!(endpoint.url_with("abc"), egress.proxy_url);
    }
}
