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
//! - Failures are classified by one table ([`classify`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use reqwest::Method;
use sandgate_router::Source;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason, Lifecycle};
use super::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, Provider,
    ProviderError, RemoteEgress, RuntimeCapabilities, SnapshotInfo, Tags,
};
use crate::credentials::Secret;

/// Where sandgate's CA goes inside a devbox (the default user's home, `/home/user`).
pub const CA_PATH: &str = "/home/user/.sandgate/ca.pem";
const CA_DIR: &str = "/home/user/.sandgate";
const TAG_SANDBOX: &str = "sandgate_sandbox";
const TAG_ATTEMPT: &str = "sandgate_attempt";
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
        for key in options.keys() {
            if !OPTIONS.contains(&key.as_str()) {
                return Err((
                    format!("options.{key}"),
                    format!(
                        "unknown option for a runloop account ({})",
                        OPTIONS.join(", ")
                    ),
                ));
            }
        }
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
    let host = egress
        .gateway_host
        .trim_start_matches('[')
        .trim_end_matches(']');
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
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => {
            body["allowed_cidrs"] = json!([{
                "cidr": format!("{ip}/32"),
                "ports": [{"port": egress.gateway_port, "protocol": "TCP"}],
            }]);
        }
        Ok(IpAddr::V6(_)) => {
            return Err(format!(
                "runloop network policies allow IPv4 CIDRs only; the gateway {host} cannot be \
                 the only destination"
            ))
        }
        Err(_) => body["allowed_hostnames"] = json!([host]),
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

/// One argument quoted for a POSIX shell: `'...'`, each `'` as `'\''`.
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The shell command line that runs `spec` as given: `cd <cwd> && K=V ... exec argv...`.
pub fn command_line(spec: &ExecSpec) -> Result<String, OpError> {
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            "argv must name a program",
        ));
    }
    let mut line = String::new();
    if let Some(cwd) = &spec.cwd {
        line.push_str(&format!("cd {} && ", shell_quote(cwd)));
    }
    for (key, value) in &spec.env {
        let valid = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                format!("{key:?} is not a valid environment variable name"),
            ));
        }
        line.push_str(&format!("{key}={} ", shell_quote(value)));
    }
    line.push_str("exec");
    for arg in &spec.argv {
        line.push(' ');
        line.push_str(&shell_quote(arg));
    }
    Ok(line)
}

fn request_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Deserialize)]
struct DevboxView {
    id: String,
    status: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    failure_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DevboxList {
    #[serde(default)]
    devboxes: Vec<DevboxView>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Debug, Deserialize)]
struct PolicyList {
    #[serde(default)]
    network_policies: Vec<Value>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct ExecutionView {
    execution_id: String,
    status: String,
    #[serde(default)]
    exit_status: Option<i64>,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

fn instance_of(view: &DevboxView) -> Instance {
    Instance {
        id: view.id.clone(),
        tags: Tags {
            sandbox_id: view.metadata.get(TAG_SANDBOX).cloned().unwrap_or_default(),
            attempt_id: view.metadata.get(TAG_ATTEMPT).cloned().unwrap_or_default(),
        },
        state: match view.status.as_str() {
            // Suspended devboxes exist and can resume: live.
            "running" | "suspending" | "suspended" | "resuming" => InstanceState::Running,
            "failure" | "shutdown" => InstanceState::Failed,
            _ => InstanceState::Starting,
        },
    }
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
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    let Some(status) = failure.status else {
        return if failure.sent {
            ErrorClass::Unknown
        } else {
            ErrorClass::Outage
        };
    };
    match status.as_u16() {
        400 | 422 => ErrorClass::InvalidRequest,
        401 | 403 => ErrorClass::UnboundAccount,
        404 => ErrorClass::Unsupported,
        408 => ErrorClass::Unknown,
        409 => ErrorClass::ProviderError,
        429 => ErrorClass::RateLimit,
        502 | 503 => ErrorClass::Outage,
        504 => ErrorClass::Unknown,
        _ => ErrorClass::ProviderError,
    }
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    let mut error = ProviderError::new(classify(&failure), failure.message.clone());
    error.retry_after = failure.retry_after;
    error
}

/// A failed create call: [`provider_error`], marked `maybe_created` when the request reached
/// the provider and was not refused (a 5xx, or no answer): the instance may exist.
fn create_error(failure: HttpFailure) -> ProviderError {
    let maybe_created = failure.may_have_created();
    let mut error = provider_error(failure);
    error.maybe_created = maybe_created;
    error
}

fn op_error(failure: HttpFailure) -> OpError {
    let kind = match failure.status.map(|s| s.as_u16()) {
        Some(404) => OpErrorKind::NotFound,
        Some(400) | Some(422) => OpErrorKind::Invalid,
        Some(409) => OpErrorKind::Conflict,
        _ => OpErrorKind::Provider,
    };
    OpError::new(kind, failure.message)
}

fn failed(id: &str, message: String) -> ProviderError {
    ProviderError {
        class: ErrorClass::FailedBeforeRunning,
        message,
        instance_id: Some(id.to_string()),
        retry_after: None,
        maybe_created: false,
    }
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
        let mut env = spec.env.clone();
        if let Some(egress) = &spec.egress {
            env.extend(egress.env(CA_PATH));
        }
        let mut body = json!({
            "name": format!("sandgate-{}", spec.tags.sandbox_id),
            "metadata": {TAG_SANDBOX: spec.tags.sandbox_id, TAG_ATTEMPT: spec.tags.attempt_id},
            "environment_variables": env,
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
        match self
            .http
            .send_idempotent(|| self.http.request(Method::GET, &path))
            .await
        {
            Ok(response) => Ok(Some(self.http.json(response).await?)),
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Polls the devbox until it is in `target`; another settled state is an error.
    async fn await_status(
        &self,
        id: &str,
        target: &str,
        timeout: Duration,
    ) -> Result<(), (Option<HttpFailure>, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let view = self.view(id).await.map_err(|f| {
                let m = f.message.clone();
                (Some(f), m)
            })?;
            let Some(view) = view else {
                return Err((None, format!("runloop no longer knows devbox {id}")));
            };
            if view.status == target {
                return Ok(());
            }
            let settled = matches!(
                view.status.as_str(),
                "running" | "suspended" | "failure" | "shutdown"
            );
            if settled {
                let reason = view
                    .failure_reason
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                return Err((
                    None,
                    format!(
                        "devbox {id} became {}{reason} instead of {target}",
                        view.status
                    ),
                ));
            }
            if Instant::now() >= deadline {
                return Err((
                    None,
                    format!(
                        "devbox {id} was still {} after {}s",
                        view.status,
                        timeout.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
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

/// Long-polls `wait_for_status` until the execution is `completed` (408: poll again).
async fn wait_completed(
    http: &ProviderHttp,
    devbox: &str,
    execution: &str,
) -> Result<ExecutionView, OpError> {
    let url = format!(
        "/v1/devboxes/{}/executions/{}/wait_for_status",
        path_segment(devbox),
        path_segment(execution)
    );
    let body = json!({"statuses": ["completed"], "timeout_seconds": EXEC_LONG_POLL_SECS});
    let mut transient = 0;
    loop {
        let request = http
            .request(Method::POST, &url)
            .timeout(Duration::from_secs(EXEC_LONG_POLL_SECS + 10))
            .json(&body);
        match http.send(request).await {
            Ok(response) => {
                let view: ExecutionView = http.json(response).await.map_err(op_error)?;
                if view.status == "completed" {
                    return Ok(view);
                }
            }
            Err(f) if f.status == Some(StatusCode::REQUEST_TIMEOUT) => {}
            Err(f)
                if transient < 5
                    && (f.status.is_none()
                        || f.status == Some(StatusCode::TOO_MANY_REQUESTS)
                        || f.status.is_some_and(|s| s.is_server_error())) =>
            {
                transient += 1;
                let wait = f
                    .retry_after
                    .unwrap_or(Duration::from_millis(300 * transient));
                tokio::time::sleep(wait.min(Duration::from_secs(10))).await;
            }
            Err(f) => return Err(op_error(f)),
        }
    }
}

/// Which of an execution's outputs a stream carries.
#[derive(Clone, Copy)]
enum Fd {
    Stdout,
    Stderr,
}

/// How one output stream ended.
enum StreamEnd {
    /// It ended (the command is done and its output sent).
    Done,
    /// It could not be opened: the execution's buffered output stands in.
    Unavailable,
    /// The receiver went away.
    Closed,
}

/// Reads one SSE output stream to its end, resuming dropped or timed-out streams from the
/// bytes already received.
async fn pump(
    http: ProviderHttp,
    devbox: String,
    execution: String,
    fd: Fd,
    tx: mpsc::Sender<ExecEvent>,
) -> StreamEnd {
    let name = match fd {
        Fd::Stdout => "stream_stdout_updates",
        Fd::Stderr => "stream_stderr_updates",
    };
    let url = format!(
        "/v1/devboxes/{}/executions/{}/{name}",
        path_segment(&devbox),
        path_segment(&execution)
    );
    let mut received: u64 = 0;
    let mut opened = false;
    for _attempt in 0..50 {
        let request = http
            .request(Method::GET, &url)
            .header("Accept", "text/event-stream")
            .query(&[("offset", received.to_string())])
            .timeout(Duration::from_secs(24 * 3600));
        let response = match http.send(request).await {
            Ok(r) => r,
            Err(f) if f.status.is_some_and(|s| s.is_client_error()) && !opened => {
                return StreamEnd::Unavailable
            }
            Err(_) => {
                if !opened {
                    return StreamEnd::Unavailable;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        opened = true;
        let mut body = response.bytes_stream();
        let mut buffer: Vec<u8> = Vec::new();
        let mut resume = false;
        'read: loop {
            let Some(chunk) = body.next().await else {
                break 'read;
            };
            let Ok(chunk) = chunk else {
                resume = true;
                break 'read;
            };
            buffer.extend_from_slice(&chunk);
            while let Some((event, rest)) = split_event(&buffer) {
                buffer = rest;
                let (kind, data) = parse_event(&event);
                if kind.as_deref() == Some("error") {
                    let code = serde_json::from_str::<Value>(&data).ok().and_then(|v| {
                        v["code"]
                            .as_i64()
                            .or_else(|| v["code"].as_str()?.parse().ok())
                    });
                    if code == Some(408) {
                        resume = true;
                        break 'read;
                    }
                    return StreamEnd::Done;
                }
                let Ok(update) = serde_json::from_str::<Value>(&data) else {
                    continue;
                };
                let Some(output) = update["output"].as_str() else {
                    continue;
                };
                if output.is_empty() {
                    continue;
                }
                received += output.len() as u64;
                let bytes = Bytes::from(output.to_string());
                let event = match fd {
                    Fd::Stdout => ExecEvent::Stdout(bytes),
                    Fd::Stderr => ExecEvent::Stderr(bytes),
                };
                if tx.send(event).await.is_err() {
                    return StreamEnd::Closed;
                }
            }
        }
        if !resume {
            return StreamEnd::Done;
        }
    }
    StreamEnd::Done
}

/// The first complete SSE event in `buffer` and what follows it.
fn split_event(buffer: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = buffer;
    for i in 0..text.len() {
        if text[i] == b'\n' {
            if text.get(i + 1) == Some(&b'\n') {
                return Some((
                    String::from_utf8_lossy(&text[..i]).into_owned(),
                    text[i + 2..].to_vec(),
                ));
            }
            if text.get(i + 1) == Some(&b'\r') && text.get(i + 2) == Some(&b'\n') {
                return Some((
                    String::from_utf8_lossy(&text[..i]).into_owned(),
                    text[i + 3..].to_vec(),
                ));
            }
        }
    }
    None
}

/// An SSE event's `event:` name and its `data:` lines joined.
fn parse_event(event: &str) -> (Option<String>, String) {
    let mut kind = None;
    let mut data: Vec<&str> = Vec::new();
    for line in event.lines() {
        let line = line.trim_end_matches('\r');
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => kind = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    (kind, data.join("\n"))
}

async fn kill(http: &ProviderHttp, devbox: &str, execution: &str) {
    let url = format!(
        "/v1/devboxes/{}/executions/{}/kill",
        path_segment(devbox),
        path_segment(execution)
    );
    let request = http
        .request(Method::POST, &url)
        .header(REQUEST_ID, request_id())
        .json(&json!({"kill_process_group": true}));
    if let Err(e) = http.send(request).await {
        tracing::warn!(devbox = %devbox, error = %e.message, "runloop: killing a command failed");
    }
}

enum Waited {
    Done(Result<ExecutionView, OpError>),
    TimedOut,
    Dropped,
}

/// Drives one execution: both output streams, the completion, the timeout; a caller that
/// drops the stream kills the command.
async fn follow(
    http: ProviderHttp,
    devbox: String,
    execution: String,
    timeout: Option<Duration>,
    tx: mpsc::Sender<ExecEvent>,
) {
    let out = tokio::spawn(pump(
        http.clone(),
        devbox.clone(),
        execution.clone(),
        Fd::Stdout,
        tx.clone(),
    ));
    let err = tokio::spawn(pump(
        http.clone(),
        devbox.clone(),
        execution.clone(),
        Fd::Stderr,
        tx.clone(),
    ));
    // The command's end, its timeout, or the caller going away (which kills it).
    let waited = {
        let completed = wait_completed(&http, &devbox, &execution);
        let limit = async {
            match timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = completed => Waited::Done(result),
            _ = limit => Waited::TimedOut,
            _ = tx.closed() => Waited::Dropped,
        }
    };
    let view = match waited {
        Waited::TimedOut | Waited::Dropped => {
            kill(&http, &devbox, &execution).await;
            out.abort();
            err.abort();
            if matches!(waited, Waited::TimedOut) {
                let _ = tx
                    .send(ExecEvent::Exit(ExitInfo {
                        code: None,
                        signal: Some(9),
                        reason: ExitReason::TimedOut,
                    }))
                    .await;
            }
            return;
        }
        Waited::Done(Err(e)) => {
            tracing::warn!(devbox = %devbox, error = %e, "runloop: following a command failed");
            out.abort();
            err.abort();
            let _ = tx
                .send(ExecEvent::Exit(ExitInfo {
                    code: None,
                    signal: None,
                    reason: ExitReason::Exited,
                }))
                .await;
            return;
        }
        Waited::Done(Ok(view)) => view,
    };
    for (task, fd) in [(out, Fd::Stdout), (err, Fd::Stderr)] {
        let abort = task.abort_handle();
        let end = match tokio::time::timeout(STREAM_GRACE, task).await {
            Ok(Ok(end)) => end,
            Ok(Err(_)) => StreamEnd::Unavailable,
            Err(_) => {
                abort.abort();
                StreamEnd::Done
            }
        };
        match end {
            StreamEnd::Closed => return,
            StreamEnd::Done => {}
            StreamEnd::Unavailable => {
                let text = match fd {
                    Fd::Stdout => view.stdout.clone(),
                    Fd::Stderr => view.stderr.clone(),
                }
                .unwrap_or_default();
                if !text.is_empty() {
                    let bytes = Bytes::from(text);
                    let event = match fd {
                        Fd::Stdout => ExecEvent::Stdout(bytes),
                        Fd::Stderr => ExecEvent::Stderr(bytes),
                    };
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let code = view.exit_status.map(|c| c as i32);
    // A shell reports a command killed by signal N as 128 + N.
    let signal = code.filter(|c| (129..=159).contains(c)).map(|c| c - 128);
    let _ = tx
        .send(ExecEvent::Exit(ExitInfo {
            code,
            signal,
            reason: ExitReason::Exited,
        }))
        .await;
}

impl Provider for Runloop {
    fn kind(&self) -> &'static str {
        "runloop"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let mut body = self.create_body(&spec);
            if let Some(egress) = spec.egress.as_ref().filter(|e| e.lock_down) {
                let policy = self.policy_for(egress).await?;
                body["launch_parameters"]["network_policy_id"] = json!(policy);
            }
            // The attempt id as the idempotency key: a create re-sent after a lost answer is
            // the same devbox.
            let request = self
                .http
                .request(Method::POST, "/v1/devboxes")
                .header(REQUEST_ID, &spec.tags.attempt_id)
                .json(&body);
            let response = self.http.send(request).await.map_err(create_error)?;
            let created: DevboxView = self.http.json(response).await.map_err(|f| {
                let mut e = provider_error(f);
                e.class = ErrorClass::Unknown;
                e
            })?;
            let id = created.id;
            if let Err((failure, message)) = self
                .await_status(&id, "running", self.account.boot_timeout)
                .await
            {
                let mut error = match failure {
                    Some(f) => {
                        let mut e = provider_error(f);
                        e.instance_id = Some(id.clone());
                        e
                    }
                    None => failed(&id, message.clone()),
                };
                error.message = format!("runloop devbox did not start: {message}");
                return Err(error);
            }
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&id, egress).await {
                    return Err(failed(
                        &id,
                        format!("the devbox's CA could not be installed: {e}"),
                    ));
                }
            }
            Ok(Instance {
                id,
                tags: spec.tags,
                state: InstanceState::Running,
            })
        })
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let view = self.view(instance_id).await.map_err(provider_error)?;
            Ok(view
                .filter(|v| v.status != "shutdown")
                .map(|v| instance_of(&v)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut after: Option<String> = None;
            for _ in 0..200 {
                let build = || {
                    let mut query = vec![
                        ("limit", "100".to_string()),
                        ("include_total_count", "false".to_string()),
                    ];
                    if let Some(after) = &after {
                        query.push(("starting_after", after.clone()));
                    }
                    self.http.request(Method::GET, "/v1/devboxes").query(&query)
                };
                let response = self
                    .http
                    .send_idempotent(build)
                    .await
                    .map_err(provider_error)?;
                let page: DevboxList = self.http.json(response).await.map_err(provider_error)?;
                out.extend(
                    page.devboxes
                        .iter()
                        .filter(|d| d.status != "shutdown" && d.status != "failure")
                        .filter(|d| {
                            d.metadata.get(TAG_SANDBOX).map(String::as_str) == Some(sandbox_id)
                        })
                        .filter(|d| {
                            attempt_id.is_none_or(|a| {
                                d.metadata.get(TAG_ATTEMPT).map(String::as_str) == Some(a)
                            })
                        })
                        .map(instance_of),
                );
                match page.devboxes.last() {
                    Some(last) if page.has_more => after = Some(last.id.clone()),
                    _ => break,
                }
            }
            Ok(out)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.shutdown(instance_id).await })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        // What this adapter does with Runloop: streamed commands it can kill, files read and
        // written, suspend and resume.
        Box::pin(async {
            Ok(RuntimeCapabilities {
                process_execute: true,
                process_ordered_output: true,
                process_cancel: true,
                filesystem_read: true,
                filesystem_write: true,
                pause_resume: true,
                ..RuntimeCapabilities::NONE
            })
        })
    }

    fn lockdown(&self, egress: &RemoteEgress) -> Option<Value> {
        lockdown(egress)
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let Some(egress) = egress else {
                return Ok(());
            };
            // Runloop's file write does not make the directory: the trait's default would
            // fail on a fresh devbox.
            self.install_ca(instance_id, egress)
                .await
                .map_err(|e| super::adoption_failed(&e))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || {
                self.http
                    .request(Method::GET, "/v1/devboxes")
                    .query(&[("limit", "1"), ("include_total_count", "false")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed devboxes at {}", self.http.base_url()))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move {
            let command = command_line(&spec)?;
            let started = self.start_execution(instance_id, &command).await?;
            let (tx, rx) = mpsc::channel(64);
            let task = tokio::spawn(follow(
                self.http.clone(),
                instance_id.to_string(),
                started.execution_id.clone(),
                spec.timeout,
                tx,
            ));
            let http = self.http.clone();
            let devbox = instance_id.to_string();
            let execution = started.execution_id;
            let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                task.abort();
                if once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let (http, devbox, execution) = (http.clone(), devbox.clone(), execution.clone());
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { kill(&http, &devbox, &execution).await });
                }
            });
            Ok(ExecStream { events: rx, cancel })
        })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let url = format!("/v1/devboxes/{}/download_file", path_segment(instance_id));
            let body = json!({"path": path});
            let response = self
                .http
                .send_idempotent(|| self.http.request(Method::POST, &url).json(&body))
                .await
                .map_err(op_error)?;
            let bytes = response.bytes().await.map_err(|e| {
                OpError::new(
                    OpErrorKind::Provider,
                    format!("runloop: reading {path}: {e}"),
                )
            })?;
            Ok(bytes.to_vec())
        })
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match String::from_utf8(data) {
                Ok(text) => self.write_text(instance_id, path, &text).await,
                Err(e) => {
                    let data = e.into_bytes();
                    let url = format!("/v1/devboxes/{}/upload_file", path_segment(instance_id));
                    let file_name = path.rsplit('/').next().unwrap_or("file").to_string();
                    let form = reqwest::multipart::Form::new()
                        .text("path", path.to_string())
                        .part(
                            "file",
                            reqwest::multipart::Part::bytes(data).file_name(file_name),
                        );
                    let request = self
                        .http
                        .request(Method::POST, &url)
                        .header(REQUEST_ID, request_id())
                        .multipart(form);
                    self.http.send(request).await.map_err(op_error)?;
                    Ok(())
                }
            }
        })
    }

    /// Runloop's clock is an idle timer (`keep_alive_time_seconds` at launch): a keep-alive
    /// resets it, and the liveness pass sends one far more often than any idle time, so a
    /// devbox sandgate serves is never shut down for idleness, with or without a lifetime.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<std::time::Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        let _ = remaining;
        Box::pin(async move {
            let path = format!("/v1/devboxes/{}/keep_alive", path_segment(instance_id));
            let rid = request_id();
            self.http
                .send_idempotent(|| {
                    self.http
                        .request(Method::POST, &path)
                        .header(REQUEST_ID, &rid)
                })
                .await
                .map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let (verb, target) = match operation {
                Lifecycle::Pause => ("suspend", "suspended"),
                Lifecycle::Resume => ("resume", "running"),
                Lifecycle::Stop | Lifecycle::Start => {
                    return Err(OpError::unsupported("runloop", operation.as_str()))
                }
            };
            let url = format!("/v1/devboxes/{}/{verb}", path_segment(instance_id));
            let request = self
                .http
                .request(Method::POST, &url)
                .header(REQUEST_ID, request_id());
            self.http.send(request).await.map_err(op_error)?;
            self.await_status(instance_id, target, self.account.boot_timeout)
                .await
                .map_err(|(f, message)| match f {
                    Some(f) => op_error(f),
                    None => OpError::new(OpErrorKind::Provider, message),
                })
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let url = format!("/v1/devboxes/{}/snapshot_disk", path_segment(instance_id));
            let request = self
                .http
                .request(Method::POST, &url)
                .header(REQUEST_ID, request_id())
                .timeout(Duration::from_secs(600))
                .json(&json!({"name": format!("sandgate-{instance_id}")}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["id"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "runloop answered a snapshot without an id",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: body["size_bytes"].as_u64().unwrap_or(0),
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let url = format!(
                "/v1/devboxes/disk_snapshots/{}/delete",
                path_segment(snapshot_id)
            );
            let rid = request_id();
            match self
                .http
                .send_idempotent(|| {
                    self.http
                        .request(Method::POST, &url)
                        .header(REQUEST_ID, &rid)
                })
                .await
            {
                Ok(_) => Ok(()),
                Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(()),
                Err(f) => Err(op_error(f)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: Option<u16>, sent: bool) -> HttpFailure {
        HttpFailure {
            status: status.map(|s| StatusCode::from_u16(s).unwrap()),
            body: Some(json!({"message": "x"})),
            retry_after: None,
            sent,
            timed_out: !sent,
            message: String::new(),
        }
    }

    #[test]
    fn the_failure_table() {
        let cases = [
            (Some(400), ErrorClass::InvalidRequest),
            (Some(422), ErrorClass::InvalidRequest),
            (Some(401), ErrorClass::UnboundAccount),
            (Some(403), ErrorClass::UnboundAccount),
            (Some(404), ErrorClass::Unsupported),
            (Some(408), ErrorClass::Unknown),
            (Some(409), ErrorClass::ProviderError),
            (Some(429), ErrorClass::RateLimit),
            (Some(500), ErrorClass::ProviderError),
            (Some(502), ErrorClass::Outage),
            (Some(503), ErrorClass::Outage),
            (Some(504), ErrorClass::Unknown),
        ];
        for (status, class) in cases {
            assert_eq!(classify(&failure(status, true)), class, "{status:?}");
        }
        // Never reached: nothing was created. Reached and timed out: unknown.
        assert_eq!(classify(&failure(None, false)), ErrorClass::Outage);
        let mut timed_out = failure(None, true);
        timed_out.timed_out = true;
        assert_eq!(classify(&timed_out), ErrorClass::Unknown);
    }

    #[test]
    fn rate_limits_keep_retry_after() {
        let mut f = failure(Some(429), true);
        f.retry_after = Some(Duration::from_secs(7));
        let e = provider_error(f);
        assert_eq!(e.class, ErrorClass::RateLimit);
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("plain-word_1.txt"), "plain-word_1.txt");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$HOME;rm -rf /"), "'$HOME;rm -rf /'");
        assert_eq!(shell_quote("a\nb"), "'a\nb'");
        assert_eq!(shell_quote("*"), "'*'");
        // What sh makes of it: the same words.
        let args = ["echo", "it's", "$X", "a  b", "", "\\", "\"q\"", "`id`"];
        let line = args
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf '%s\\0' {line}")])
            .output()
            .unwrap();
        let words: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .split('\0')
            .filter(|_| true)
            .map(str::to_string)
            .collect();
        assert_eq!(&words[..args.len()], &args.map(str::to_string)[..]);
    }

    #[test]
    fn command_lines() {
        let spec = ExecSpec {
            argv: vec!["ls".into(), "-l".into(), "my dir".into()],
            env: BTreeMap::from([("A_B".to_string(), "x y".to_string())]),
            cwd: Some("/home/user/w s".into()),
            timeout: None,
        };
        assert_eq!(
            command_line(&spec).unwrap(),
            "cd '/home/user/w s' && A_B='x y' exec ls -l 'my dir'"
        );
        let bad = ExecSpec {
            argv: vec!["true".into()],
            env: BTreeMap::from([("A-B".to_string(), "x".to_string())]),
            ..ExecSpec::default()
        };
        assert_eq!(command_line(&bad).unwrap_err().kind, OpErrorKind::Invalid);
        assert_eq!(
            command_line(&ExecSpec::default()).unwrap_err().kind,
            OpErrorKind::Invalid
        );
    }

    fn egress(host: &str, lock: bool) -> RemoteEgress {
        RemoteEgress {
            proxy_url: "https://sb:tok@gw.example:8443".into(),
            gateway_host: host.into(),
            gateway_port: 8443,
            ca_pem: "PEM".into(),
            lock_down: lock,
        }
    }

    #[test]
    fn policies() {
        let named = lockdown(&egress("gw.example", true)).unwrap();
        assert_eq!(named["allow_all"], false);
        assert_eq!(named["allowed_hostnames"], json!(["gw.example"]));
        assert!(named.get("allowed_cidrs").is_none());
        let ip = lockdown(&egress("192.0.2.7", true)).unwrap();
        assert_eq!(ip["allowed_hostnames"], json!([]));
        assert_eq!(
            ip["allowed_cidrs"],
            json!([{"cidr": "192.0.2.7/32", "ports": [{"port": 8443, "protocol": "TCP"}]}])
        );
        assert!(lockdown(&egress("gw.example", false)).is_none());
        assert!(policy_body(&egress("2001:db8::1", true)).is_err());
        assert!(lockdown(&egress("2001:db8::1", true)).is_none());
    }

    #[test]
    fn options() {
        let key = || Secret::new("k".to_string());
        let opts = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let a = RunloopAccount::from_options(None, &opts(&[]), key()).unwrap();
        assert_eq!(a.base_url, "https://api.runloop.ai");
        assert_eq!(a.boot_timeout, Duration::from_secs(300));
        let a = RunloopAccount::from_options(
            Some("http://127.0.0.1:1"),
            &opts(&[
                ("blueprint_name", "py"),
                ("resource_size", "small"),
                ("keep_alive_secs", "600"),
            ]),
            key(),
        )
        .unwrap();
        assert_eq!(a.resource_size.as_deref(), Some("SMALL"));
        assert_eq!(a.keep_alive_secs, Some(600));
        let (field, message) =
            RunloopAccount::from_options(None, &opts(&[("template", "x")]), key()).unwrap_err();
        assert_eq!(field, "options.template");
        assert!(message.contains("blueprint_name"), "{message}");
        let (field, _) =
            RunloopAccount::from_options(None, &opts(&[("resource_size", "HUGE")]), key())
                .unwrap_err();
        assert_eq!(field, "options.resource_size");
        let (field, _) = RunloopAccount::from_options(
            None,
            &opts(&[("blueprint_name", "a"), ("blueprint_id", "b")]),
            key(),
        )
        .unwrap_err();
        assert_eq!(field, "options.blueprint_name");
        let (field, _) =
            RunloopAccount::from_options(None, &opts(&[("keep_alive_secs", "0")]), key())
                .unwrap_err();
        assert_eq!(field, "options.keep_alive_secs");
    }

    #[test]
    fn sse_events() {
        let buf = b"event: message\ndata: {\"output\":\"hi\"}\n\ndata: x".to_vec();
        let (event, rest) = split_event(&buf).unwrap();
        assert_eq!(
            parse_event(&event),
            (Some("message".into()), "{\"output\":\"hi\"}".into())
        );
        assert_eq!(rest, b"data: x");
        assert!(split_event(&rest).is_none());
        let crlf = b"data: a\r\n\r\n".to_vec();
        let (event, _) = split_event(&crlf).unwrap();
        assert_eq!(parse_event(&event).1, "a");
    }
}
