//! The Prime Intellect adapter: VM sandboxes through Prime's REST API and its sandbox
//! gateway, as the official SDK `prime-sandboxes` 0.5.1 (PyPI) speaks them.
//!
//! Contract:
//! - The control plane is the account's `base_url` (default `https://api.primeintellect.ai`,
//!   the SDK's `PRIME_API_BASE_URL`) plus `/api/v1`; the key goes in `Authorization: Bearer`.
//! - Create: `POST /api/v1/sandbox` with `name`, `docker_image` (the request's image, else
//!   the account's `docker_image`), `cpu_cores`/`memory_gb`/`disk_size_gb`/`gpu_count` (the
//!   request's resources, else the account's), `timeout_minutes`, `environment_vars` (the
//!   spec's env plus [`RemoteEgress::env`] with [`CA_PATH`] when it has egress), `labels`
//!   (`sandgate_sandbox=<id>`, `sandgate_attempt=<id>`: Prime's labels are plain strings),
//!   `vm: true` (the SDK sends it so the runtime never depends on a server default) and
//!   `idempotency_key` = the attempt id, so a create re-sent after a lost answer is the same
//!   sandbox. A restored snapshot is `checkpoint_id` (no image or disk then). Then `GET
//!   /api/v1/sandbox/{id}` is polled until `RUNNING` (`PENDING` → `PROVISIONING` →
//!   `RUNNING`), bounded by `boot_timeout_secs`; `ERROR`, `TIMEOUT`, `TERMINATED` or the
//!   bound answer `failed_before_running` naming the sandbox (the coordinator deletes it).
//! - Egress: with [`RemoteEgress::lock_down`] the create carries `network_allowlist` with
//!   the gateway as its only entry ([`lockdown`]). Prime takes IPv4 addresses, IPv4 CIDRs
//!   and hostnames (`*.` wildcards), at most 1024 entries, allowlist xor denylist; IPv6 is
//!   refused, and a hostname entry is matched by TLS SNI or HTTP Host on ports 80 and 443
//!   only. So an IPv4 gateway is its address (Prime refuses ports in entries for now), a
//!   named gateway is its name only when the proxy is `https://` on port 443 (the SNI is
//!   then the gateway's name), and any other gateway cannot be the only destination: the
//!   create answers `unsupported` and nothing is made. The sandbox's `allow_domains` are not
//!   added: a native allow entry would be a way around the gateway's policy.
//! - The CA PEM is written to [`CA_PATH`] once the sandbox runs (`mkdir -p` through a
//!   command, then the gateway's upload); a failure fails the create as
//!   `failed_before_running` with the sandbox id.
//! - `list_by_tag`: `GET /api/v1/sandbox?labels=..&is_active=true&page=&per_page=100`
//!   (`hasNext`), filtered here by label too; `ERROR`/`TIMEOUT`/`TERMINATED` are not live.
//!   `get`: 404 or a terminal status is `None`. `delete`: `DELETE /api/v1/sandbox/{id}`;
//!   404 is success.
//! - Commands and files do not go through the platform API but through Prime's gateway:
//!   `POST /api/v1/sandbox/{id}/auth` (or the create's `gatewayAuth`) answers
//!   `{gateway_url, user_ns, job_id, token, expires_at}`; calls go to
//!   `{gateway_url}/{user_ns}/{job_id}` with `Authorization: Bearer <token>` (never the API
//!   key), and a 401 refreshes the token once. Exec is the Connect server stream
//!   `command_session.CommandSession/Start` with the protobuf codec
//!   (`application/connect+proto`, [`proto`]): the argv as given (`cmd`, `args`), the env,
//!   the cwd and a session uuid; events `start`, `data` (stdout/stderr, in order), `end`
//!   (`exit_code`). Cancel and the spec's timeout send `CommandSession/SendSignal` SIGKILL
//!   to that session. Files: `GET /download?path=&sandbox_id=` (bytes; 404 absent) and
//!   `POST /upload?path=&sandbox_id=` (multipart `file`).
//! - Snapshot: `POST /api/v1/sandbox/{id}/checkpoints`, polled (`GET
//!   /api/v1/sandbox/checkpoints/{cid}`) until `DURABLE`; its id restores as `checkpoint_id`;
//!   deleted with `DELETE /api/v1/sandbox/checkpoints/{cid}` (404: already gone). Prime has
//!   no pause/resume, stop/start or lifetime extension: a sandbox ends after the account's
//!   `timeout_minutes` whatever sandgate's lifetime says, so `extend_lifetime` answers
//!   `unsupported` (logged by the liveness pass) when the lifetime outlasts that clock.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the control-plane calls and the failure table;
//! `provider` the [`Provider`](crate::providers::Provider) implementation, `gateway` the
//! gateway's commands and files, `proto` the protobuf subset, `wire` Prime's JSON.

mod gateway;
pub mod proto;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::Method;
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::ErrorTable;
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{create_env, gateway_addr, GatewayAddr};
use super::poll::{self, Pace, Seen, Waited};
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};
use wire::{GatewayAuth, SandboxView};

/// What this adapter does with Prime: commands streamed in order that it can kill,
/// files read and written. No pause/resume.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    ..RuntimeCapabilities::NONE
};

/// Where sandgate's CA goes inside a sandbox (commands run as `root`).
pub const CA_PATH: &str = "/root/.sandgate/ca.pem";
const CA_DIR: &str = "/root/.sandgate";
const OPTIONS: &[&str] = &[
    "docker_image",
    "cpu_cores",
    "memory_gb",
    "disk_size_gb",
    "timeout_minutes",
    "region",
    "team_id",
    "boot_timeout_secs",
];
/// The SDK's default image for a sandbox that names none.
const DEFAULT_IMAGE: &str = "python:3.11-slim";
/// How often a booting sandbox is looked at (the SDK starts at 1 s and backs off).
const POLL_FIRST: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(2);
/// A cached gateway token is renewed this long before it expires (as the SDK does).
const AUTH_MARGIN: Duration = Duration::from_secs(60);

/// A Prime Intellect account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct PrimeAccount {
    pub base_url: String,
    pub docker_image: String,
    pub cpu_cores: Option<f64>,
    pub memory_gb: Option<f64>,
    pub disk_size_gb: Option<f64>,
    /// Prime ends a sandbox after this long (the SDK's default: 60).
    pub timeout_minutes: u64,
    pub region: Option<String>,
    pub team_id: Option<String>,
    /// How long a create waits for `RUNNING`.
    pub boot_timeout: Duration,
    pub api_key: Secret,
}

impl PrimeAccount {
    /// Options: `docker_image` (default `python:3.11-slim`), `cpu_cores`, `memory_gb`,
    /// `disk_size_gb` (positive numbers), `timeout_minutes` (default 60), `region`,
    /// `team_id`, `boot_timeout_secs` (default 600). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<PrimeAccount, (String, String)> {
        known_options("a prime-intellect", options, OPTIONS)?;
        let text = |name: &str| -> Result<Option<String>, (String, String)> {
            match options.get(name).map(|v| v.trim()) {
                Some("") => Err((format!("options.{name}"), "must not be empty".into())),
                Some(v) => Ok(Some(v.to_string())),
                None => Ok(None),
            }
        };
        let number = |name: &str| -> Result<Option<f64>, (String, String)> {
            match options.get(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .map(Some)
                    .ok_or((
                        format!("options.{name}"),
                        "must be a positive number".to_string(),
                    )),
            }
        };
        Ok(PrimeAccount {
            base_url: base_url
                .unwrap_or("https://api.primeintellect.ai")
                .trim_end_matches('/')
                .trim_end_matches("/api/v1")
                .to_string(),
            docker_image: text("docker_image")?.unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            cpu_cores: number("cpu_cores")?,
            memory_gb: number("memory_gb")?,
            disk_size_gb: number("disk_size_gb")?,
            timeout_minutes: positive(options, "timeout_minutes", "minutes")?.unwrap_or(60),
            region: text("region")?,
            team_id: text("team_id")?,
            boot_timeout: Duration::from_secs(
                positive(options, "boot_timeout_secs", "seconds")?.unwrap_or(600),
            ),
            api_key,
        })
    }
}

pub struct Prime {
    http: ProviderHttp,
    account: PrimeAccount,
    /// Gateway tokens by sandbox id, with when to renew them.
    auth: Mutex<HashMap<String, (GatewayAuth, Instant)>>,
}

impl std::fmt::Debug for Prime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prime")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// The `network_allowlist` entry that names only the gateway, or why Prime cannot express it.
pub fn allow_entry(egress: &RemoteEgress) -> Result<String, String> {
    match gateway_addr(&egress.gateway_host) {
        GatewayAddr::V4(ip) => Ok(ip.to_string()),
        GatewayAddr::V6(ip) => Err(format!(
            "prime's network_allowlist takes no IPv6 entries; the gateway {ip} cannot be the \
             only destination"
        )),
        GatewayAddr::Name(name)
            if egress.gateway_port == 443 && egress.proxy_url.starts_with("https://") =>
        {
            Ok(name.to_string())
        }
        GatewayAddr::Name(name) => Err(format!(
            "prime matches a hostname entry by TLS SNI or HTTP Host on ports 80 and 443 only; \
             the gateway {name}:{} cannot be the only destination (give [proxy] public_url an \
             IPv4 address, or an https:// URL on port 443)",
            egress.gateway_port
        )),
    }
}

/// The native lock-down this adapter applies for `egress`, in Prime's field names as sent
/// (`None` for an advisory pool).
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    if !egress.lock_down {
        return None;
    }
    let entry = allow_entry(egress).ok()?;
    Some(json!({"network_allowlist": [entry]}))
}

/// Prime's error code: FastAPI's `detail` when it is a string.
fn detail(failure: &HttpFailure) -> Option<&str> {
    failure.field("detail")
}

/// The provider's message: its `detail` (FastAPI), else the HTTP layer's.
fn describe(failure: &HttpFailure) -> String {
    match (failure.status, detail(failure)) {
        (Some(status), Some(detail)) => format!(
            "prime-intellect answered {status}: {}",
            detail.chars().take(300).collect::<String>()
        ),
        _ => failure.message.clone(),
    }
}

/// Prime's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 | `unbound_account` |
/// | 402 (the SDK: "Payment required. Check billing status.") | `billing` |
/// | 404 (image or checkpoint not on this account) | `unsupported` |
/// | 409 | `provider_error` (retryable) |
/// | 429 | `rate_limit` (`Retry-After` kept) |
/// | 502, 503 | `outage` |
/// | 504 | `unknown` (the create may have gone through) |
/// | other 5xx | `provider_error` |
/// | `ERROR` / `TIMEOUT` / `TERMINATED` before `RUNNING` | `failed_before_running` |
///
/// Prime's SDK and API document no capacity signal of their own (errors are FastAPI's
/// `{"detail"}` prose); a capacity shortage answered as 503 is an `outage`, which advances
/// the route the same way.
pub static ERRORS: ErrorTable = ErrorTable {
    code: super::errors::no_code,
    codes: &[],
    no_instance: &[],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (402, ErrorClass::Billing),
        (404, ErrorClass::Unsupported),
        (409, ErrorClass::ProviderError),
        (429, ErrorClass::RateLimit),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
        (422, OpErrorKind::Invalid),
        (409, OpErrorKind::Conflict),
    ],
    describe,
};

/// [`ERRORS`] applied to one failure.
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    ERRORS.classify(failure)
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    ERRORS.provider_error(failure)
}

fn op_error(failure: HttpFailure) -> OpError {
    ERRORS.op_error(failure)
}

impl Prime {
    pub fn new(account: PrimeAccount, tls: rustls::ClientConfig) -> Result<Prime, String> {
        let http = ProviderHttp::new(
            "prime-intellect",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Prime {
            http,
            account,
            auth: Mutex::new(HashMap::new()),
        })
    }

    /// The body of `POST /api/v1/sandbox`, or why the request cannot be made on Prime.
    fn create_body(&self, spec: &CreateSpec) -> Result<Value, ProviderError> {
        let a = &self.account;
        let r = &spec.request.resources;
        let mut body = json!({
            "name": format!("sandgate-{}", spec.tags.sandbox_id),
            "labels": wire::tag_labels(&spec.tags),
            "environment_vars": create_env(spec, CA_PATH),
            "timeout_minutes": a.timeout_minutes,
            "vm": true,
            "idempotency_key": spec.tags.attempt_id,
        });
        if let Some(cpu) = r.cpu.or(a.cpu_cores) {
            body["cpu_cores"] = json!(cpu);
        }
        let memory = r.memory_mb.map(|mb| mb.div_ceil(1024) as f64);
        if let Some(gb) = memory.or(a.memory_gb) {
            body["memory_gb"] = json!(gb);
        }
        if let Some(gpu) = r.gpu.filter(|g| *g > 0) {
            // Prime needs a GPU type with a count; sandgate's request names none.
            return Err(ProviderError::new(
                ErrorClass::Unsupported,
                format!("prime-intellect needs a gpu_type for {gpu} GPUs; this adapter sends none"),
            ));
        }
        if let Some(checkpoint) = &spec.snapshot {
            body["checkpoint_id"] = json!(checkpoint);
        } else {
            let image = match &spec.request.source {
                Some(Source::Image(image)) => image.clone(),
                Some(Source::Template(t)) => {
                    return Err(ProviderError::new(
                        ErrorClass::Unsupported,
                        format!("prime-intellect has no templates (asked for {t:?})"),
                    ))
                }
                Some(Source::Environment(_)) | None => a.docker_image.clone(),
            };
            body["docker_image"] = json!(image);
            let disk = r.disk_gb.map(|gb| gb as f64).or(a.disk_size_gb);
            body["disk_size_gb"] = json!(disk.unwrap_or(5.0));
        }
        if let Some(region) = &a.region {
            body["region"] = json!(region);
        }
        if let Some(team) = &a.team_id {
            body["team_id"] = json!(team);
        }
        if let Some(egress) = spec.egress.as_ref().filter(|e| e.lock_down) {
            let entry =
                allow_entry(egress).map_err(|m| ProviderError::new(ErrorClass::Unsupported, m))?;
            body["network_allowlist"] = json!([entry]);
        }
        Ok(body)
    }

    async fn view(&self, id: &str) -> Result<Option<SandboxView>, HttpFailure> {
        let path = format!("/api/v1/sandbox/{}", path_segment(id));
        self.http
            .read_optional(|| self.http.request(Method::GET, &path))
            .await
    }

    /// Polls the sandbox until `RUNNING`; a terminal state is an error.
    async fn await_running(&self, id: &str) -> Result<(), (Option<HttpFailure>, String)> {
        let fetch = move || async move {
            match self.view(id).await {
                Ok(Some(view)) => Ok(view),
                Ok(None) => Err((None, format!("prime no longer knows sandbox {id}"))),
                Err(f) => {
                    let m = f.message.clone();
                    Err((Some(f), m))
                }
            }
        };
        let judge = |view: SandboxView| match view.status.as_str() {
            "RUNNING" => Seen::Ready(()),
            status if wire::live(status) => Seen::Waiting(status.to_string()),
            status => {
                let why = [view.error_type, view.error_message]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(": ");
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                };
                Seen::Stop((None, format!("sandbox {id} became {status}{why}")))
            }
        };
        let timeout = self.account.boot_timeout;
        let deadline = Instant::now() + timeout;
        poll::until(
            deadline,
            Pace::growing(POLL_FIRST, POLL_MAX),
            None,
            judge,
            fetch,
        )
        .await
        .map_err(|waited| match waited {
            Waited::Stopped(e) => e,
            Waited::TimedOut(status) => (
                None,
                format!(
                    "sandbox {id} was still {status} after {}s",
                    timeout.as_secs()
                ),
            ),
        })
    }

    /// The sandbox's gateway access: cached until a minute before it expires, else
    /// `POST /api/v1/sandbox/{id}/auth`.
    async fn gateway_auth(&self, id: &str, fresh: bool) -> Result<GatewayAuth, OpError> {
        if !fresh {
            let cached = self
                .auth
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned();
            if let Some((auth, renew_at)) = cached {
                if Instant::now() < renew_at {
                    return Ok(auth);
                }
            }
        }
        let path = format!("/api/v1/sandbox/{}/auth", path_segment(id));
        // Asking for a token changes nothing but the token: safe to retry.
        let response = self
            .http
            .send_idempotent(|| self.http.request(Method::POST, &path))
            .await
            .map_err(op_error)?;
        let auth: GatewayAuth = self.http.json(response).await.map_err(op_error)?;
        self.remember_auth(id, auth.clone());
        Ok(auth)
    }

    fn remember_auth(&self, id: &str, auth: GatewayAuth) {
        let rfc3339 = &time::format_description::well_known::Rfc3339;
        let left = auth
            .expires_at
            .as_deref()
            .and_then(|at| time::OffsetDateTime::parse(at, rfc3339).ok())
            .map(|at| Duration::try_from(at - time::OffsetDateTime::now_utc()).unwrap_or_default())
            // No expiry (or one the SDK's format does not have): ask again in five minutes.
            .unwrap_or(Duration::from_secs(300) + AUTH_MARGIN);
        let renew_at = Instant::now() + left.saturating_sub(AUTH_MARGIN);
        self.auth
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), (auth, renew_at));
    }

    async fn remove(&self, id: &str) -> Result<(), ProviderError> {
        self.auth
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        let path = format!("/api/v1/sandbox/{}", path_segment(id));
        let result = self
            .http
            .send_idempotent(|| self.http.request(Method::DELETE, &path))
            .await;
        super::http::absent_ok(result)
            .map(|_| ())
            .map_err(provider_error)
    }

    async fn install_ca(&self, id: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        let mkdir = ["mkdir", "-p", CA_DIR].map(String::from).to_vec();
        let (code, stderr) = self.run(id, mkdir).await?;
        if code != Some(0) {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!("creating {CA_DIR} exited with {code:?}: {}", stderr.trim()),
            ));
        }
        self.upload(id, CA_PATH, egress.ca_pem.clone().into_bytes())
            .await
    }
}
