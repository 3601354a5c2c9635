//! How a sandbox reaches the egress proxy, by where it runs.
//!
//! - A local sandbox has its own listener inside its network namespace
//!   (`http://127.0.0.1:<[local] proxy_port>`, no credentials) and the CA at
//!   `/sandgate/ca.pem`: `enforcement = "namespace"`.
//! - A hosted sandbox on a pool that enforces egress through the gateway is given
//!   `[proxy] public_url` with its own identity in the userinfo, and its adapter locks the
//!   provider's native network controls to the gateway: `enforcement = "gateway"`. On an
//!   `advisory` pool it gets the same variables without the lock-down (where its adapter can
//!   pass them: CodeSandbox cannot, and its view says `advisory` all the same, the pool's
//!   word, with the public proxy address for a client to use).
//! - Anything else (the simulated provider, a hosted pool without `public_url`) is shown the
//!   gateway's own proxy address: `enforcement = "proxy_credentials"`.
//!
//! The token is never stored in a view: URLs carry the `{token}` placeholder, filled in
//! only for the response of the create that made the sandbox.

use sandgate_router::EgressEnforcement;
use serde_json::Value;

use super::{token_context, Coordinator, Job, StoredCandidate};
use crate::config::PublicUrl;
use crate::providers::{ErrorClass, ProviderError, RemoteEgress};

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

impl Coordinator {
    /// Where the sandbox on `pool` reaches its proxy (see [`remote`]).
    pub fn endpoint(&self, pool: Option<&str>, sandbox_id: &str) -> Endpoint {
        let topo = &self.deps.topology;
        let pool = pool.and_then(|p| topo.pool(p));
        let kind = pool.map(|p| topo.providers()[p.provider].kind);
        if kind == Some(sandgate_router::ProviderKind::Local) {
            let base = format!("http://127.0.0.1:{}", self.deps.local_proxy_port);
            return Endpoint {
                enforcement: "namespace",
                base: base.clone(),
                url_template: base,
                ca_path: crate::localbox::CA_PATH.to_string(),
            };
        }
        let adapter = pool.and_then(|p| self.deps.providers.for_pool(&p.name));
        // A hosted kind's pool, or any whose adapter installs the CA (the simulated
        // provider's does not: it keeps `proxy_credentials`).
        let remote = adapter.filter(|a| {
            a.ca_path().is_some() || kind.is_some_and(crate::providers::hosted::has_adapter)
        });
        if let (Some(gateway), Some(adapter), Some(pool)) =
            (self.deps.remote.as_ref(), remote, pool)
        {
            let enforcement = match pool.capabilities.egress {
                EgressEnforcement::Gateway => Some("gateway"),
                EgressEnforcement::Advisory => Some("advisory"),
                _ => None,
            };
            if let Some(enforcement) = enforcement {
                // The view says what `GET /v1/pools` says of the pool, one word. An adapter
                // that installs no CA (CodeSandbox: nothing reaches its sandboxes at create)
                // shows the gateway's own CA file, for a client to fetch.
                let ca_path = adapter.ca_path().map(str::to_string);
                return Endpoint {
                    enforcement,
                    base: gateway.url.base(),
                    url_template: gateway.proxy_url(sandbox_id, "{token}"),
                    ca_path: ca_path
                        .unwrap_or_else(|| self.deps.ca_cert_path.display().to_string()),
                };
            }
        }
        Endpoint {
            enforcement: "proxy_credentials",
            base: format!("http://{}", self.deps.proxy_addr),
            url_template: format!("http://{}:{{token}}@{}", sandbox_id, self.deps.proxy_addr),
            ca_path: self.deps.ca_cert_path.display().to_string(),
        }
    }

    /// The egress a hosted sandbox is created with on `cand`'s pool, when it is given the
    /// public proxy (a `gateway` or `advisory` pool with `[proxy] public_url`).
    /// Fails (never creates an open sandbox) when the token cannot be unsealed.
    pub(super) fn remote_egress(
        &self,
        job: &Job,
        cand: &StoredCandidate,
    ) -> Result<Option<RemoteEgress>, ProviderError> {
        let endpoint = self.endpoint(Some(&cand.pool), &job.row.id);
        let Some(gateway) = self.deps.remote.as_ref() else {
            return Ok(None);
        };
        if !matches!(endpoint.enforcement, "gateway" | "advisory") {
            return Ok(None);
        }
        let token = self
            .deps
            .credentials
            .key()
            .open(&job.row.token_sealed, &token_context(&job.row.id))
            .map_err(|_| {
                ProviderError::new(
                    ErrorClass::FailedBeforeRunning,
                    "the sandbox's egress token cannot be unsealed; not creating it without its lock-down",
                )
            })?;
        Ok(Some(gateway.egress(
            &job.row.id,
            token.expose(),
            endpoint.enforcement == "gateway",
        )))
    }

    /// What the adapter set natively for the sandbox's egress on `cand`'s pool (computed
    /// from the same spec it was created with), for its placement record.
    pub(super) fn lockdown(&self, job: &Job, cand: &StoredCandidate) -> Option<Value> {
        let adapter = self.deps.providers.for_pool(&cand.pool)?;
        let egress = self.remote_egress(job, cand).ok()??;
        adapter.lockdown(&egress)
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
