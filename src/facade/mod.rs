//! The E2B-compatible facade (`[e2b] listen`): the official E2B SDKs, pointed at it with
//! `E2B_API_URL` and `E2B_SANDBOX_URL`, create and drive sandboxes that sandgate places,
//! authorizes and polices. It is a translation, not a second implementation: every call
//! becomes the sandgate operation it names, through the same coordinator, router and
//! policy layers as `/v1` (the operations layer, [`crate::operations`], does the work; the
//! facade never reaches into `api`).
//!
//! One origin serves both of E2B's planes, told apart per request:
//! - **envd** (the in-sandbox daemon's API): a request carrying `E2b-Sandbox-Id` (what the
//!   SDKs send on every envd call when `E2B_SANDBOX_URL` is set), or whose `Host` is
//!   `{port}-{sandbox id}.{domain}`. Authenticated by `X-Access-Token`, the sandbox's envd
//!   token (derived from the master key: [`crate::credentials::MasterKey::envd_token`]);
//!   the operation runs as the principal that created the sandbox, *as configured now*.
//!   See [`envd`] and [`process`].
//! - **the control plane** (E2B's REST API): everything else, authenticated by
//!   `X-API-Key` (`[[e2b.api_keys]]`, each standing for a sandgate principal). See
//!   [`control`].
//!
//! Errors are E2B's shapes, made so the SDK raises its matching exception, with sandgate's
//! code and reasons in the message ([`errors`]).

mod call;
pub mod control;
pub mod envd;
pub mod errors;
mod input;
pub mod process;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use axum::Router;
use tower_service::Service;

use crate::callers::{local_admin_principal, local_secret, ApiAuth, Principal};
use crate::config::{E2bConfig, E2bTemplate};
use crate::e2b::envd::ENVD_PORT;

/// What the facade serves with: the operations layer's context (policy, coordinator, the
/// principals of `[[api.tokens]]`) plus its API keys and templates.
#[derive(Clone)]
pub struct FacadeState {
    pub ops: crate::operations::OpsContext,
    pub keys: Arc<ApiAuth>,
    pub templates: Arc<BTreeMap<String, E2bTemplate>>,
    pub domain: Arc<str>,
    pub processes: Arc<process::Registry>,
    /// The watchers of `CreateWatcher`, polled with `GetWatcherEvents`.
    pub watchers: Arc<watch::Watchers>,
    /// `[e2b] allow_out`: the default egress allow list of a create that names no network.
    pub allow_out: Arc<[String]>,
    /// The keys of `[[e2b.api_keys]]` that set their own `allow_out`, and that list.
    pub key_allow_out: Arc<HashMap<String, Vec<String>>>,
    /// The ports gateway, when it serves: the `domain` answered is then its own, so the
    /// SDKs' `get_host(port)` names the gateway's host for that port, and
    /// `trafficAccessToken` opens every port of the sandbox.
    pub ports: Option<crate::ports::PortUrls>,
}

#[derive(Debug, thiserror::Error)]
pub enum FacadeConfigError {
    #[error("config key `e2b.api_keys[{index}].key_env`: environment variable {var} is not set")]
    KeyEnv { index: usize, var: String },
    #[error("config key `e2b.api_keys[{index}]`: the key in {var} must be `e2b_` and 20 to 128 hex digits")]
    KeyFormat { index: usize, var: String },
    #[error("the local E2B API key file {path}: {source}")]
    LocalKey {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl FacadeState {
    /// The facade's state from `[e2b]`; with no `api_keys` (and `generate_local_key`), one
    /// key for the local admin is read from or generated into `local_key_file`.
    pub fn new(
        ops: crate::operations::OpsContext,
        config: &E2bConfig,
        local_key_file: &std::path::Path,
    ) -> Result<FacadeState, FacadeConfigError> {
        let (keys, key_allow_out) = api_keys(config, local_key_file)?;
        Ok(FacadeState {
            ops,
            keys: Arc::new(keys),
            templates: Arc::new(config.templates.clone()),
            domain: config.domain.as_str().into(),
            processes: Arc::default(),
            watchers: Arc::default(),
            allow_out: config.allow_out.clone().into(),
            key_allow_out: Arc::new(key_allow_out),
            ports: None,
        })
    }

    /// The default egress allow list for a create made with `key` (already authenticated):
    /// the key's own `allow_out`, else `[e2b] allow_out`. A template's own wins over both
    /// (see [`control::translate`]).
    pub fn default_allow_out(&self, key: Option<&[u8]>) -> &[String] {
        key.and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| self.key_allow_out.get(k))
            .map_or(&self.allow_out[..], Vec::as_slice)
    }

    /// The envd access token of sandbox `id`.
    pub fn envd_token(&self, id: &str) -> String {
        self.ops.credentials.key().envd_token(id)
    }

    /// Serves with the ports gateway's names (see [`FacadeState::ports`]).
    pub fn with_ports(mut self, ports: Option<crate::ports::PortUrls>) -> FacadeState {
        self.ports = ports;
        self
    }

    /// The `domain` the SDKs are told: the ports gateway's when it serves (so
    /// `get_host(port)` is its host for that port), else `[e2b] domain`.
    pub fn answered_domain(&self) -> String {
        match &self.ports {
            Some(urls) => urls.e2b_domain(),
            None => self.domain.to_string(),
        }
    }

    /// `trafficAccessToken`: the token that opens every port of sandbox `id` through the
    /// ports gateway, when it serves.
    pub fn traffic_token(&self, id: &str) -> Option<String> {
        self.ports
            .as_ref()
            .map(|_| self.ops.credentials.key().port_token(id, None))
    }

    /// The principal a sandbox's envd calls act as: its creator, as configured now (an E2B
    /// key or an API token of the same principal and workspace); `None` once neither is.
    pub fn creator(&self, row: &crate::store::sandboxes::SandboxRow) -> Option<Arc<Principal>> {
        let stored: serde_json::Value = serde_json::from_str(&row.principal_json).ok()?;
        let (principal, workspace) = (stored["principal"].as_str()?, stored["workspace"].as_str()?);
        self.keys
            .principal_named(principal, workspace)
            .or_else(|| self.ops.auth.principal_named(principal, workspace))
    }
}

/// The keys' principals, and the `allow_out` of the keys that set one.
fn api_keys(
    config: &E2bConfig,
    local: &std::path::Path,
) -> Result<(ApiAuth, HashMap<String, Vec<String>>), FacadeConfigError> {
    if config.api_keys.is_empty() && config.generate_local_key {
        let key =
            local_secret(local, "e2b_", 20).map_err(|source| FacadeConfigError::LocalKey {
                path: local.to_path_buf(),
                source,
            })?;
        tracing::info!(path = %local.display(), "no [[e2b.api_keys]] configured: the local admin's E2B API key is in this file");
        return Ok((
            ApiAuth::from_secrets(vec![(key, local_admin_principal())]),
            HashMap::new(),
        ));
    }
    let mut entries = Vec::new();
    let mut allow_out = HashMap::new();
    for (index, k) in config.api_keys.iter().enumerate() {
        let key = match (&k.key, &k.key_env) {
            (Some(key), _) => key.clone(),
            (None, Some(var)) => {
                let key = std::env::var(var).map_err(|_| FacadeConfigError::KeyEnv {
                    index,
                    var: var.clone(),
                })?;
                if !crate::config::valid_e2b_key(&key) {
                    return Err(FacadeConfigError::KeyFormat {
                        index,
                        var: var.clone(),
                    });
                }
                key
            }
            (None, None) => continue,
        };
        if let Some(list) = &k.allow_out {
            allow_out.insert(key.clone(), list.clone());
        }
        entries.push((
            key,
            Principal {
                principal: k.principal.clone(),
                workspace: k.workspace.clone(),
                roles: k.roles.clone(),
                delegation: None,
            },
        ));
    }
    Ok((ApiAuth::from_secrets(entries), allow_out))
}

/// The facade's HTTP service: each request goes to envd's routes or the control plane's.
pub fn router(state: FacadeState) -> Router {
    let control = control::routes(state.clone());
    let envd = envd::routes(state.clone());
    let domain = state.domain.clone();
    Router::new().fallback(move |request: Request<Body>| {
        let (mut control, mut envd) = (control.clone(), envd.clone());
        let domain = domain.clone();
        async move {
            let target = envd_target(&request, &domain);
            let result: Result<Response, Infallible> = match target {
                Some(target) => {
                    let mut request = request;
                    request.extensions_mut().insert(target);
                    envd.call(request).await
                }
                None => control.call(request).await,
            };
            match result {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    })
}

/// Counts each answer as `sandgate_e2b_requests_total{plane, route, status}`: `route` is
/// the matched route pattern (a bounded set), never the raw path.
pub(crate) async fn count(
    plane: &'static str,
    request: Request<Body>,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let response = next.run(request).await;
    metrics::counter!(
        "sandgate_e2b_requests_total",
        "plane" => plane,
        "route" => route,
        "status" => response.status().as_u16().to_string(),
    )
    .increment(1);
    response
}

/// Which sandbox (and port) an envd request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvdTarget {
    pub sandbox_id: String,
    pub port: u16,
}

/// `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`, default envd's), else a `Host` of
/// `{port}-{id}.{domain}`. `None`: a control-plane request.
pub fn envd_target<B>(request: &Request<B>, domain: &str) -> Option<EnvdTarget> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(id) = header("e2b-sandbox-id") {
        let port = match header("e2b-sandbox-port") {
            // An unreadable port is still an envd request: it gets envd's refusal.
            Some(p) => p.trim().parse().unwrap_or(0),
            None => ENVD_PORT,
        };
        return Some(EnvdTarget {
            sandbox_id: id.to_string(),
            port,
        });
    }
    let host = header("host")
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))?;
    let host = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
    let label = host
        .to_ascii_lowercase()
        .strip_suffix(&format!(".{}", domain.to_ascii_lowercase()))?
        .to_string();
    let (port, id) = label.split_once('-')?;
    Some(EnvdTarget {
        sandbox_id: id.to_string(),
        port: port.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri("/files");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn envd_requests_are_told_from_control_plane_ones() {
        let d = "sandgate.localhost";
        let t = envd_target(&request(&[("e2b-sandbox-id", "sb-1")]), d).unwrap();
        assert_eq!((t.sandbox_id.as_str(), t.port), ("sb-1", ENVD_PORT));
        let t = envd_target(
            &request(&[("e2b-sandbox-id", "sb-1"), ("e2b-sandbox-port", "8080")]),
            d,
        )
        .unwrap();
        assert_eq!(t.port, 8080);
        let t = envd_target(
            &request(&[("host", "49983-sb-abc.sandgate.localhost:3000")]),
            d,
        )
        .unwrap();
        assert_eq!((t.sandbox_id.as_str(), t.port), ("sb-abc", 49983));
        assert_eq!(
            envd_target(&request(&[("host", "127.0.0.1:3000")]), d),
            None
        );
        assert_eq!(
            envd_target(&request(&[("host", "x-y.other.test")]), d),
            None
        );
        assert_eq!(
            envd_target(&request(&[("host", "api.sandgate.localhost")]), d),
            None
        );
    }
}
