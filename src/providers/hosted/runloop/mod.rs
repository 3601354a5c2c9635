//! The Runloop adapter: devboxes through Runloop's REST API (`runloopai/api-client-python`
//! 3.0.0, `resources/devboxes/*`, `network_policies.py`; the same paths as
//! `runloopai/api-client-ts`).
//!
//! Contract:
//! - Every URL derives from the account's `base_url` (default `https://api.runloop.ai`), as
//!   the SDKs' `base_url` / `RUNLOOP_BASE_URL`; the key goes in `Authorization: Bearer`. Calls
//!   that change something carry `x-request-id`, the header the SDKs send as their
//!   idempotency key (a create carries the attempt id, so a re-sent create is one devbox).
//! - Create: `POST /v1/devboxes` with `metadata` {`sandgate_sandbox`, `sandgate_attempt`},
//!   `environment_variables` (the spec's env, plus [`RemoteEgress::env`] with [`CA_PATH`]
//!   when the spec has egress), a source (`snapshot_id` from the spec's snapshot, else
//!   `blueprint_name` from the request's template/environment source, else the account's
//!   `blueprint_id` / `blueprint_name`, else Runloop's default image) and
//!   `launch_parameters` (`resource_size_request`, `keep_alive_time_seconds`,
//!   `network_policy_id`). Then `GET /v1/devboxes/{id}` is polled until `running`, bounded
//!   by `boot_timeout_secs`; `failure`, `shutdown`, `suspended` or the bound answer
//!   `failed_before_running` naming the devbox (the coordinator destroys it).
//! - Egress: with [`RemoteEgress::lock_down`] the devbox gets a network policy
//!   (`POST /v1/network-policies`, the body [`lockdown`] returns: `allow_all: false`, the
//!   gateway's name in `allowed_hostnames`, or an IPv4 gateway as a `/32` in
//!   `allowed_cidrs` limited to the gateway's TCP port), reused per gateway host:port (cached,
//!   and looked up by name before creating one), attached with
//!   `launch_parameters.network_policy_id`. Runloop's allow lists take IPv4 CIDRs only, so
//!   an IPv6 literal gateway cannot be locked to and the create answers `unsupported`. The
//!   sandbox's `allow_domains` are *not* added to the policy: a native allow entry would be a
//!   direct path around the gateway's per-request policy and credential injection. Runloop's
//!   extra allowances (`allow_runloop_mirrors`, `allow_agent_gateway`, `allow_mcp_gateway`,
//!   `allow_devbox_to_devbox`) are all sent `false`.
//! - The CA PEM is written to [`CA_PATH`] (`mkdir -p` through an execution, then
//!   `POST .../write_file_contents`) once the devbox runs; a failure fails the create as
//!   `failed_before_running` with the devbox id.
//! - `list_by_tag`: Runloop's list (`GET /v1/devboxes?limit=&starting_after=`) has no
//!   metadata filter, so pages (`has_more`, `starting_after` = the last id) are filtered here
//!   by metadata; `shutdown` and `failure` devboxes are not live and are left out.
//! - `get`: `GET /v1/devboxes/{id}`; 404 or `shutdown` is `None` (Runloop keeps shut-down
//!   devboxes visible). `delete`: `POST /v1/devboxes/{id}/shutdown`; 404, or a refusal of a
//!   devbox already `shutdown`/`failure`, is success.
//! - Exec: the argv is quoted into one POSIX shell string ([`shell_quote`]; env as
//!   assignments, cwd as `cd`), started with `POST .../execute_async`; stdout and stderr are
//!   streamed from the SSE endpoints `GET .../executions/{eid}/stream_stdout_updates` and
//!   `stream_stderr_updates` (`data: {"output", "offset"}`; an `error` event with code 408
//!   or a dropped stream is resumed with `?offset=<bytes already received>`), the exit code
//!   comes from `exit_status` of `POST .../executions/{eid}/wait_for_status`. A stream that
//!   cannot be opened falls back to the execution's buffered `stdout`/`stderr`. Cancel (and
//!   the spec's timeout) is `POST .../executions/{eid}/kill` with `kill_process_group`.
//! - Files: read with `POST .../download_file` {path} (bytes); write UTF-8 text with
//!   `POST .../write_file_contents`, other bytes with `POST .../upload_file` (multipart
//!   `path`, `file`). Lifecycle: pause = `suspend` (then polled to `suspended`), resume =
//!   `resume` (then polled to `running`). Snapshot = `POST .../snapshot_disk`, deleted with
//!   `POST /v1/devboxes/disk_snapshots/{id}/delete`. Everything else answers unsupported.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the control-plane calls (devboxes, network
//! policies) and the failure table; `provider` the [`Provider`](crate::providers::Provider)
//! implementation, `exec` commands (quoting, execution, the SSE output streams), `wire`
//! Runloop's JSON.

mod exec;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use reqwest::Method;
use sandgate_router::Source;
use serde_json::{json, Value};

use super::account::known_options;
use super::errors::{own_message, ErrorTable};
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{create_env, gateway_addr, GatewayAddr};
use super::poll::{self, Pace, Seen, Waited};
use super::tags::tag_object;
use crate::credentials::Secret;
use crate::providers::RuntimeCapabilities;
use crate::providers::{CreateSpec, ErrorClass, OpError, OpErrorKind, ProviderError, RemoteEgress};
use exec::wait_completed;
use wire::{DevboxView, ExecutionView, PolicyList};

/// What this adapter does with Runloop: streamed commands it can kill, files read and
/// written, suspend and resume.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

pub use super::shell::{command_line, shell_quote};
/// Where sandgate's CA goes inside a devbox (the default user's home, `/home/user`).
pub const CA_PATH: &str = "/home/user/.sandgate/ca.pem";
const CA_DIR: &str = "/home/user/.sandgate";
/// The header the official SDKs send their idempotency key in.
const REQUEST_ID: &str = "x-request-id";
const OPTIONS: &[&str] = &[
    "blueprint_id",
    "blueprint_name",
    "resource_size",
    "keep_alive_secs",
    "boot_timeout_secs",
];
const RESOURCE_SIZES: &[&str] = &["X_SMALL", "SMALL", "MEDIUM", "LARGE", "X_LARGE", "XX_LARGE"];
/// How often a booting or transitioning devbox is looked at.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long the server holds one `wait_for_status` long poll (Runloop's maximum is 25 s).
const EXEC_LONG_POLL_SECS: u64 = 25;
/// How long a finished command's streams may still deliver output.
const STREAM_GRACE: Duration = Duration::from_secs(5);

/// A Runloop account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct RunloopAccount {
    pub base_url: String,
    pub blueprint_id: Option<String>,
    pub blueprint_name: Option<String>,
    /// `launch_parameters.resource_size_request`.
    pub resource_size: Option<String>,
    /// `launch_parameters.keep_alive_time_seconds`.
    pub keep_alive_secs: Option<u64>,
    /// How long a create waits for `running`.
    pub boot_timeout: Duration,
    pub api_key: Secret,
}

impl RunloopAccount {
    /// Options: `blueprint_id` or `blueprint_name` (the default source; neither: Runloop's
    /// default image), `resource_size` (X_SMALL..XX_LARGE), `keep_alive_secs` (1..=172800),
    /// `boot_timeout_secs` (default 300). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<RunloopAccount, (String, String)> {
        known_options("a runloop", options, OPTIONS)?;
        let non_empty = |name: &str| -> Result<Option<String>, (String, String)> {
            match options.get(name) {
                Some(v) if v.trim().is_empty() => {
                    Err((format!("options.{name}"), "must not be empty".to_string()))
                }
                Some(v) => Ok(Some(v.trim().to_string())),
                None => Ok(None),
            }
        };
        let blueprint_id = non_empty("blueprint_id")?;
        let blueprint_name = non_empty("blueprint_name")?;
        if blueprint_id.is_some() && blueprint_name.is_some() {
            return Err((
                "options.blueprint_name".into(),
                "name one blueprint: blueprint_id or blueprint_name".into(),
            ));
        }
        let resource_size = match non_empty("resource_size")? {
            Some(size) => {
                let upper = size.to_ascii_uppercase();
                if !RESOURCE_SIZES.contains(&upper.as_str()) {
                    return Err((
                        "options.resource_size".into(),
                        format!("must be one of {}", RESOURCE_SIZES.join(", ")),
                    ));
                }
                Some(upper)
            }
            None => None,
        };
        let secs = |name: &str, max: u64| -> Result<Option<u64>, (String, String)> {
            match options.get(name) {
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|v| (1..=max).contains(v))
                    .map(Some)
                    .ok_or((
                        format!("options.{name}"),
                        format!("must be a number of seconds from 1 to {max}"),
                    )),
                None => Ok(None),
            }
        };
        let keep_alive_secs = secs("keep_alive_secs", 172_800)?;
        let boot_timeout = Duration::from_secs(secs("boot_timeout_secs", 3600)?.unwrap_or(300));
        Ok(RunloopAccount {
            base_url: base_url.unwrap_or("https://api.runloop.ai").to_string(),
            blueprint_id,
            blueprint_name,
            resource_size,
            keep_alive_secs,
            boot_timeout,
            api_key,
        })
    }
}

pub struct Runloop {
    http: ProviderHttp,
    account: RunloopAccount,
    /// Network policy ids by the gateway's `host:port`.
    policies: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Runloop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runloop")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// The network policy a devbox locked to the gateway gets (the body of
/// `POST /v1/network-policies`), or why Runloop cannot express it.
pub fn policy_body(egress: &RemoteEgress) -> Result<Value, String> {
    let addr = gateway_addr(&egress.gateway_host);
    let host = match addr {
        GatewayAddr::Name(name) => name.to_string(),
        GatewayAddr::V4(ip) => ip.to_string(),
        GatewayAddr::V6(ip) => ip.to_string(),
    };
    let mut body = json!({
        "name": format!("sandgate-gateway-{host}-{}", egress.gateway_port),
        "description": "sandgate: egress only to the gateway",
        "allow_all": false,
        "allow_devbox_to_devbox": false,
        "allow_runloop_mirrors": false,
        "allow_agent_gateway": false,
        "allow_mcp_gateway": false,
        "allowed_hostnames": [],
    });
    match addr {
        GatewayAddr::V4(ip) => {
            body["allowed_cidrs"] = json!([{
                "cidr": format!("{ip}/32"),
                "ports": [{"port": egress.gateway_port, "protocol": "TCP"}],
            }]);
        }
        GatewayAddr::V6(_) => {
            return Err(format!(
                "runloop network policies allow IPv4 CIDRs only; the gateway {host} cannot be \
                 the only destination"
            ))
        }
        GatewayAddr::Name(_) => body["allowed_hostnames"] = json!([host]),
    }
    Ok(body)
}

/// The native lock-down this adapter applies for `egress` (`None` for an advisory pool).
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    if !egress.lock_down {
        return None;
    }
    policy_body(egress).ok()
}

fn request_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runloop's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | never reached (connect failed) | `outage` |
/// | reached, no answer (timeout, dropped) | `unknown` |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 | `unbound_account` |
/// | 404 (blueprint, snapshot or policy not on this account) | `unsupported` |
/// | 408 (Runloop's long-poll timeout) | `unknown` |
/// | 409 | `provider_error` (a conflicting transition; retryable) |
/// | 429 | `rate_limit` (`Retry-After` kept) |
/// | 502, 503 | `outage` |
/// | 504 | `unknown` (the create may have gone through) |
/// | other 5xx | `provider_error` |
///
/// Runloop's SDKs and API reference document no capacity or quota signal of their own; an
/// answer that names one is not guessed at.
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
        (404, ErrorClass::Unsupported),
        (408, ErrorClass::Unknown),
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
    describe: own_message,
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

impl Runloop {
    pub fn new(account: RunloopAccount, tls: rustls::ClientConfig) -> Result<Runloop, String> {
        let http = ProviderHttp::new(
            "runloop",
            &account.base_url,
            Auth::Bearer,
            account.api_key.clone(),
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Runloop {
            http,
            account,
            policies: Mutex::new(HashMap::new()),
        })
    }

    /// The body of `POST /v1/devboxes` (without the network policy id).
    fn create_body(&self, spec: &CreateSpec) -> Value {
        let mut body = json!({
            "name": format!("sandgate-{}", spec.tags.sandbox_id),
            "metadata": tag_object(&spec.tags),
            "environment_variables": create_env(spec, CA_PATH),
        });
        let template = match &spec.request.source {
            Some(Source::Template(t) | Source::Environment(t)) => Some(t.clone()),
            _ => None,
        };
        if let Some(snapshot) = &spec.snapshot {
            body["snapshot_id"] = json!(snapshot);
        } else if let Some(template) = template {
            body["blueprint_name"] = json!(template);
        } else if let Some(id) = &self.account.blueprint_id {
            body["blueprint_id"] = json!(id);
        } else if let Some(name) = &self.account.blueprint_name {
            body["blueprint_name"] = json!(name);
        }
        let mut launch = serde_json::Map::new();
        if let Some(size) = &self.account.resource_size {
            launch.insert("resource_size_request".into(), json!(size));
        }
        if let Some(secs) = self.account.keep_alive_secs {
            launch.insert("keep_alive_time_seconds".into(), json!(secs));
        }
        body["launch_parameters"] = Value::Object(launch);
        body
    }

    /// The network policy for this gateway: cached, else one of the account's with the same
    /// name and rules, else a new one.
    async fn policy_for(&self, egress: &RemoteEgress) -> Result<String, ProviderError> {
        let body =
            policy_body(egress).map_err(|m| ProviderError::new(ErrorClass::Unsupported, m))?;
        let key = format!("{}:{}", egress.gateway_host, egress.gateway_port);
        if let Some(id) = self
            .policies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(id.clone());
        }
        let id = match self.find_policy(&body).await.map_err(provider_error)? {
            Some(id) => id,
            None => {
                let request = self
                    .http
                    .request(Method::POST, "/v1/network-policies")
                    .header(REQUEST_ID, request_id())
                    .json(&body);
                let response = self.http.send(request).await.map_err(provider_error)?;
                let created: Value = self.http.json(response).await.map_err(provider_error)?;
                created["id"]
                    .as_str()
                    .ok_or_else(|| {
                        ProviderError::new(
                            ErrorClass::ProviderError,
                            "runloop answered a network policy without an id",
                        )
                    })?
                    .to_string()
            }
        };
        self.policies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, id.clone());
        Ok(id)
    }

    async fn find_policy(&self, body: &Value) -> Result<Option<String>, HttpFailure> {
        let name = body["name"].as_str().unwrap_or_default().to_string();
        let mut after: Option<String> = None;
        for _ in 0..20 {
            let build = || {
                let mut query = vec![("name", name.clone()), ("limit", "100".to_string())];
                if let Some(after) = &after {
                    query.push(("starting_after", after.clone()));
                }
                self.http
                    .request(Method::GET, "/v1/network-policies")
                    .query(&query)
            };
            let response = self.http.send_idempotent(build).await?;
            let page: PolicyList = self.http.json(response).await?;
            for policy in &page.network_policies {
                let egress = &policy["egress"];
                let same = policy["name"] == body["name"]
                    && egress["allow_all"] == json!(false)
                    && egress["allowed_hostnames"] == body["allowed_hostnames"]
                    && cidrs_match(&egress["allowed_cidrs"], &body["allowed_cidrs"]);
                if same {
                    if let Some(id) = policy["id"].as_str() {
                        return Ok(Some(id.to_string()));
                    }
                }
            }
            match page.network_policies.last().and_then(|p| p["id"].as_str()) {
                Some(last) if page.has_more => after = Some(last.to_string()),
                _ => break,
            }
        }
        Ok(None)
    }

    async fn view(&self, id: &str) -> Result<Option<DevboxView>, HttpFailure> {
        let path = format!("/v1/devboxes/{}", path_segment(id));
        self.http
            .read_optional(|| self.http.request(Method::GET, &path))
            .await
    }

    /// Polls the devbox until it is in `target`; another settled state is an error.
    async fn await_status(
        &self,
        id: &str,
        target: &str,
        timeout: Duration,
    ) -> Result<(), (Option<HttpFailure>, String)> {
        let fetch = move || async move {
            match self.view(id).await {
                Ok(Some(view)) => Ok(view),
                Ok(None) => Err((None, format!("runloop no longer knows devbox {id}"))),
                Err(f) => {
                    let m = f.message.clone();
                    Err((Some(f), m))
                }
            }
        };
        let judge = |view: DevboxView| {
            if view.status == target {
                return Seen::Ready(());
            }
            let settled = matches!(
                view.status.as_str(),
                "running" | "suspended" | "failure" | "shutdown"
            );
            if !settled {
                return Seen::Waiting(view.status);
            }
            let reason = view
                .failure_reason
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            let became = format!(
                "devbox {id} became {}{reason} instead of {target}",
                view.status
            );
            Seen::Stop((None, became))
        };
        let deadline = Instant::now() + timeout;
        poll::until(deadline, Pace::every(POLL_EVERY), None, judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(status) => (
                    None,
                    format!(
                        "devbox {id} was still {status} after {}s",
                        timeout.as_secs()
                    ),
                ),
            })
    }

    async fn install_ca(&self, id: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        let mkdir = format!("mkdir -p {}", shell_quote(CA_DIR));
        let done = self.run(id, &mkdir).await?;
        if done.exit_status != Some(0) {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!(
                    "creating {CA_DIR} exited with {:?}: {}",
                    done.exit_status,
                    done.stderr.unwrap_or_default().trim()
                ),
            ));
        }
        self.write_text(id, CA_PATH, &egress.ca_pem).await
    }

    async fn write_text(&self, id: &str, path: &str, contents: &str) -> Result<(), OpError> {
        let url = format!("/v1/devboxes/{}/write_file_contents", path_segment(id));
        let body = json!({"file_path": path, "contents": contents});
        let rid = request_id();
        self.http
            .send_idempotent(|| {
                self.http
                    .request(Method::POST, &url)
                    .header(REQUEST_ID, &rid)
                    .json(&body)
            })
            .await
            .map_err(op_error)?;
        Ok(())
    }

    async fn start_execution(&self, id: &str, command: &str) -> Result<ExecutionView, OpError> {
        let url = format!("/v1/devboxes/{}/execute_async", path_segment(id));
        let request = self
            .http
            .request(Method::POST, &url)
            .header(REQUEST_ID, request_id())
            .json(&json!({"command": command}));
        let response = self.http.send(request).await.map_err(op_error)?;
        self.http.json(response).await.map_err(op_error)
    }

    /// Runs a command to its end (no streaming): the completed execution.
    async fn run(&self, id: &str, command: &str) -> Result<ExecutionView, OpError> {
        let started = self.start_execution(id, command).await?;
        if started.status == "completed" {
            return Ok(started);
        }
        wait_completed(&self.http, id, &started.execution_id).await
    }

    async fn shutdown(&self, id: &str) -> Result<(), ProviderError> {
        let path = format!("/v1/devboxes/{}/shutdown", path_segment(id));
        let rid = request_id();
        let result = self
            .http
            .send_idempotent(|| {
                self.http
                    .request(Method::POST, &path)
                    .header(REQUEST_ID, &rid)
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(()),
            Err(f) if f.status.is_some_and(|s| s.is_client_error()) => {
                // Refused: fine when it is already gone.
                match self.view(id).await {
                    Ok(None) => Ok(()),
                    Ok(Some(v)) if v.status == "shutdown" || v.status == "failure" => Ok(()),
                    _ => Err(provider_error(f)),
                }
            }
            Err(f) => Err(provider_error(f)),
        }
    }
}

fn cidrs_match(have: &Value, want: &Value) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
    if empty(have) && empty(want) {
        return true;
    }
    let key = |v: &Value| -> Vec<(String, Vec<i64>)> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let ports = c["ports"]
                            .as_array()
                            .map(|p| p.iter().filter_map(|p| p["port"].as_i64()).collect())
                            .unwrap_or_default();
                        (c["cidr"].as_str().unwrap_or_default().to_string(), ports)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    key(have) == key(want)
}
