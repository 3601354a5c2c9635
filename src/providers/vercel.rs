//! The Vercel Sandbox adapter: the REST API the official `@vercel/sandbox` SDK (3.5.0,
//! `dist/api-client/*`) speaks, at `https://vercel.com/api`.
//!
//! Contract:
//! - Every URL derives from the account: `base_url` (default `https://vercel.com/api`, the
//!   SDK's `APIClient` default; the SDK itself has no environment override, only a custom
//!   `fetch`) plus the SDK's paths. The token goes in `Authorization: Bearer`, and every call
//!   carries `?teamId=<options.team_id>` as the SDK's client adds it. The project is
//!   `options.project_id`: `projectId` in the create body and on get/delete, `project` on the
//!   list, as the SDK sends them.
//! - An instance id is the sandbox's `name` (Vercel's identifier since SDK 3); commands and
//!   files go to its current *session* (`/v2/sandboxes/sessions/{sessionId}/...`), looked
//!   up from `GET /v2/sandboxes/{name}` and cached.
//! - Create: `POST /v3/sandboxes` (or `/v2/sandboxes` when the account names a legacy
//!   `runtime`, as the SDK chooses) with `projectId`, `tags` {`sandgate_sandbox`,
//!   `sandgate_attempt`} (2 of the 5 tags Vercel allows; the SDK states no other key/value
//!   rule), `env` (the spec's plus [`RemoteEgress::env`] for [`CA_PATH`]), `timeout` (ms),
//!   `resources.vcpus`, `source: {type: "snapshot", snapshotId}` for a snapshot, else the
//!   account's `image`/`runtime` or the request's image, else Vercel's default image. The
//!   session is polled (`GET /v2/sandboxes/sessions/{id}`) until `running`, for at most
//!   [`START_TIMEOUT`]; `failed`/`aborted`/`stopped` or the timeout is
//!   `failed_before_running` naming the instance (to delete).
//! - Egress: with [`RemoteEgress::lock_down`] the create carries the `networkPolicy` of
//!   [`lockdown`] (one function for both what is sent and what [`Provider::lockdown`]
//!   shows): `{allow: [], subnets: {allow: ["<ip>/32"]}}` when the gateway host is an IP
//!   literal (`/128` for IPv6), `{allow: ["<host>"]}` for a name. An object policy denies
//!   everything it does not allow; the SDK documents `subnets.deny` as taking precedence
//!   over allowed domains *and* CIDRs, so `deny: ["0.0.0.0/0"]` would cut the gateway off
//!   too and is not sent. The sandbox's `allow_domains` are *not* added to `allow`: that
//!   would open a direct path around the gateway's per-request policy and credential
//!   injection. sandgate's CA is written to [`CA_PATH`] (under `/vercel/sandbox`, the
//!   default user's writable working directory) through `fs/write` once the session runs;
//!   a failure there fails the create (`failed_before_running` with the instance id).
//! - `list_by_tag`: `GET /v2/sandboxes?project=&tags=sandgate_sandbox:<id>` (the API filters
//!   on one tag only), every page (`pagination.next` → `cursor`), the attempt filtered here.
//!   `delete`: `DELETE /v2/sandboxes/{name}?projectId=` as the SDK's `Sandbox.delete` (it
//!   stops a running session too); 404 is success.
//! - exec: `POST .../cmd` `{command, args, cwd, env, sudo: false, wait: true, logs: true,
//!   timeout}` answered `application/x-ndjson`: a `{command}` line (its id), `{stream:
//!   "stdout"|"stderr", data}` lines, then the finished `{command: {exitCode}}`; a `{stream:
//!   "error", data: {code, message}}` line ends it without an exit code. Cancelling kills the
//!   command (`POST .../cmd/{id}/kill {signal: 9}`). Output arrives as text (`data` is a
//!   string), so non-UTF-8 output is not byte-exact.
//! - Files: `fs/read {path}` → bytes (404: not found), `fs/write` a gzip tar (entries named
//!   relative to the `x-cwd: /` header, as the SDK's `writeFiles`), `fs/mkdir {path}` (not
//!   recursive; `parents` runs `mkdir -p` as the SDK's recursive mkdir does). Lifecycle:
//!   `stop` (`POST .../stop`), `start` (`GET /v2/sandboxes/{name}?resume=true`, the SDK's
//!   resume); no pause. Snapshot: `POST .../snapshot` (Vercel stops the session when it
//!   snapshots); `DELETE /v2/sandboxes/snapshots/{id}`.
//! - Failures are classified by one table ([`classify`]). Vercel errors are
//!   `{error: {code, message}}`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use reqwest::{Method, RequestBuilder};
use sandgate_router::Source;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason, Lifecycle};
use super::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, Provider,
    ProviderError, RemoteEgress, RuntimeCapabilities, SnapshotInfo, Tags, LIFETIME_MARGIN,
};
use crate::credentials::Secret;

/// The SDK's API base.
pub const DEFAULT_BASE_URL: &str = "https://vercel.com/api";
/// Where sandgate's CA goes inside a Vercel sandbox (the default user's working directory,
/// `/vercel/sandbox`, is writable by it).
pub const CA_PATH: &str = "/vercel/sandbox/.sandgate/ca.pem";
/// How long a create waits for its session to run.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The default sandbox timeout (ms): 45 minutes, the Hobby plan's maximum.
pub const DEFAULT_TIMEOUT_MS: u64 = 45 * 60 * 1000;
const TAG_SANDBOX: &str = "sandgate_sandbox";
const TAG_ATTEMPT: &str = "sandgate_attempt";
const KNOWN_OPTIONS: [&str; 6] = [
    "team_id",
    "project_id",
    "runtime",
    "image",
    "vcpus",
    "timeout_ms",
];

/// What a sandbox starts from when no snapshot is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseImage {
    /// Vercel's default image (`POST /v3/sandboxes` without `image`).
    Default,
    /// A container image (`image`, `/v3`).
    Image(String),
    /// A legacy runtime such as `node22` (`runtime`, `/v2`, as the SDK sends it).
    Runtime(String),
}

/// A Vercel account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct VercelAccount {
    pub base_url: String,
    pub team_id: String,
    pub project_id: String,
    pub base: BaseImage,
    pub vcpus: Option<u32>,
    /// The sandbox's timeout at Vercel, in milliseconds.
    pub timeout_ms: u64,
    pub api_key: Secret,
}

impl VercelAccount {
    /// Options: `team_id` and `project_id` (required), `runtime` or `image` (not both),
    /// `vcpus`, `timeout_ms` (default 45 min). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<VercelAccount, (String, String)> {
        for key in options.keys() {
            if !KNOWN_OPTIONS.contains(&key.as_str()) {
                return Err((
                    format!("options.{key}"),
                    format!(
                        "unknown option for a vercel account ({})",
                        KNOWN_OPTIONS.join(", ")
                    ),
                ));
            }
        }
        let required = |name: &str| {
            options
                .get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or((
                    format!("options.{name}"),
                    format!("a vercel account needs {name}"),
                ))
        };
        let team_id = required("team_id")?;
        let project_id = required("project_id")?;
        let base = match (options.get("runtime"), options.get("image")) {
            (Some(_), Some(_)) => {
                return Err((
                    "options.image".into(),
                    "runtime and image cannot be used together".into(),
                ))
            }
            (Some(r), None) if !r.trim().is_empty() => BaseImage::Runtime(r.trim().into()),
            (None, Some(i)) if !i.trim().is_empty() => BaseImage::Image(i.trim().into()),
            (None, None) => BaseImage::Default,
            (Some(_), None) => {
                return Err(("options.runtime".into(), "must not be empty".into()));
            }
            (None, Some(_)) => return Err(("options.image".into(), "must not be empty".into())),
        };
        let vcpus = match options.get("vcpus") {
            Some(v) => Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|v| (1..=64).contains(v))
                    .ok_or((
                        "options.vcpus".to_string(),
                        "must be a number of vCPUs from 1 to 64".to_string(),
                    ))?,
            ),
            None => None,
        };
        let timeout_ms = match options.get("timeout_ms") {
            Some(v) => v.parse::<u64>().ok().filter(|v| *v > 0).ok_or((
                "options.timeout_ms".to_string(),
                "must be a positive number of milliseconds".to_string(),
            ))?,
            None => DEFAULT_TIMEOUT_MS,
        };
        Ok(VercelAccount {
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).to_string(),
            team_id,
            project_id,
            base,
            vcpus,
            timeout_ms,
            api_key,
        })
    }
}

pub struct Vercel {
    http: ProviderHttp,
    team_id: String,
    project_id: String,
    base: BaseImage,
    vcpus: Option<u32>,
    timeout_ms: u64,
    /// Current session ids by sandbox name.
    sessions: Mutex<HashMap<String, String>>,
    /// How often a create polls its session.
    poll: Duration,
}

impl Vercel {
    pub fn new(account: VercelAccount, tls: rustls::ClientConfig) -> Result<Vercel, String> {
        let http = ProviderHttp::new(
            "vercel",
            &account.base_url,
            Auth::Bearer,
            account.api_key,
            tls,
            Duration::from_secs(60),
        )?;
        Ok(Vercel {
            http,
            team_id: account.team_id,
            project_id: account.project_id,
            base: account.base,
            vcpus: account.vcpus,
            timeout_ms: account.timeout_ms,
            sessions: Mutex::new(HashMap::new()),
            poll: Duration::from_millis(250),
        })
    }

    /// An authenticated request carrying `teamId`.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, path)
            .query(&[("teamId", self.team_id.as_str())])
    }

    /// The create endpoint and body.
    fn create_body(&self, spec: &CreateSpec) -> (&'static str, Value) {
        let mut env = spec.env.clone();
        let mut body = json!({
            "projectId": self.project_id,
            "ports": [],
            "timeout": self.timeout_ms,
            "tags": {TAG_SANDBOX: spec.tags.sandbox_id, TAG_ATTEMPT: spec.tags.attempt_id},
        });
        if let Some(vcpus) = self.vcpus {
            body["resources"] = json!({"vcpus": vcpus});
        }
        let mut endpoint = "/v3/sandboxes";
        if let Some(snapshot) = &spec.snapshot {
            body["source"] = json!({"type": "snapshot", "snapshotId": snapshot});
        } else {
            match (&self.base, &spec.request.source) {
                (_, Some(Source::Image(image))) => body["image"] = json!(image),
                (BaseImage::Image(image), _) => body["image"] = json!(image),
                (BaseImage::Runtime(runtime), _) => {
                    body["runtime"] = json!(runtime);
                    endpoint = "/v2/sandboxes";
                }
                (BaseImage::Default, _) => {}
            }
        }
        if let Some(egress) = &spec.egress {
            env.extend(egress.env(CA_PATH));
            if let Some(policy) = lockdown(egress) {
                body["networkPolicy"] = policy;
            }
        }
        body["env"] = json!(env);
        (endpoint, body)
    }

    fn remember(&self, name: &str, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), session.to_string());
    }

    fn forget(&self, name: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// `GET /v2/sandboxes/{name}` (`None`: absent).
    async fn sandbox(&self, name: &str, resume: bool) -> Result<Option<SandboxBody>, HttpFailure> {
        let path = format!("/v2/sandboxes/{}", path_segment(name));
        let build = || {
            let request = self
                .request(Method::GET, &path)
                .query(&[("projectId", self.project_id.as_str())]);
            if resume {
                request.query(&[("resume", "true")])
            } else {
                request
            }
        };
        let result = if resume {
            self.http.send(build()).await
        } else {
            self.http.send_idempotent(build).await
        };
        match result {
            Ok(response) => {
                let body: SandboxAndSession = self.http.json(response).await?;
                let session = body
                    .session
                    .as_ref()
                    .map(|s| s.id.clone())
                    .unwrap_or_else(|| body.sandbox.current_session_id.clone());
                if !session.is_empty() {
                    self.remember(&body.sandbox.name, &session);
                }
                Ok(Some(body.sandbox))
            }
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// The current session of sandbox `name`.
    async fn session_of(&self, name: &str) -> Result<String, OpError> {
        if let Some(id) = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(id.clone());
        }
        let sandbox = self
            .sandbox(name, false)
            .await
            .map_err(op_error)?
            .ok_or_else(|| {
                OpError::new(OpErrorKind::NotFound, format!("no Vercel sandbox {name}"))
            })?;
        Ok(sandbox.current_session_id)
    }

    fn session_path(session: &str, rest: &str) -> String {
        format!("/v2/sandboxes/sessions/{}{rest}", path_segment(session))
    }

    /// Polls the session until it runs.
    async fn wait_running(&self, session: &str, first: &str) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut status = first.to_string();
        let path = Self::session_path(session, "");
        loop {
            match status.as_str() {
                "running" => return Ok(()),
                "failed" | "aborted" | "stopped" | "stopping" => {
                    return Err(format!("the Vercel session {session} is {status}"))
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the Vercel session {session} was still {status} after {}s",
                    START_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(self.poll).await;
            let response = self
                .http
                .send_idempotent(|| self.request(Method::GET, &path))
                .await
                .map_err(|f| f.message)?;
            let body: SessionOnly = self.http.json(response).await.map_err(|f| f.message)?;
            status = body.session.status;
        }
    }

    async fn put_file(&self, name: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let session = self.session_of(name).await?;
        let body = tar_gz(path, &data)?;
        let request = self
            .request(Method::POST, &Self::session_path(&session, "/fs/write"))
            .header("content-type", "application/gzip")
            .header("x-cwd", "/")
            .body(body);
        self.http.send(request).await.map_err(op_error)?;
        Ok(())
    }

    async fn list_page(
        &self,
        sandbox_id: &str,
        cursor: Option<&str>,
    ) -> Result<ListBody, HttpFailure> {
        let tag = format!("{TAG_SANDBOX}:{sandbox_id}");
        let build = || {
            let mut query = vec![
                ("project", self.project_id.as_str()),
                ("limit", "100"),
                ("tags", tag.as_str()),
            ];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor));
            }
            self.request(Method::GET, "/v2/sandboxes").query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        self.http.json(response).await
    }
}

/// The `networkPolicy` of a create locked to the gateway (see the module docs), `None` for
/// an advisory pool.
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    if !egress.lock_down {
        return None;
    }
    let host = egress.gateway_host.trim_matches(|c| c == '[' || c == ']');
    Some(match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => json!({"allow": [], "subnets": {"allow": [format!("{ip}/32")]}}),
        Ok(IpAddr::V6(ip)) => json!({"allow": [], "subnets": {"allow": [format!("{ip}/128")]}}),
        Err(_) => json!({"allow": [host]}),
    })
}

/// `path` made absolute (relative to `/vercel/sandbox`) and normalized, as the SDK's
/// `normalizePath` does; returned relative to `/` for a tar entry.
fn tar_name(path: &str) -> Result<String, OpError> {
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/vercel/sandbox/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(OpError::new(
            OpErrorKind::Invalid,
            "a file path must name a file",
        ));
    }
    Ok(parts.join("/"))
}

/// One file as the gzip tar `fs/write` takes.
fn tar_gz(path: &str, data: &[u8]) -> Result<Vec<u8>, OpError> {
    let name = tar_name(path)?;
    let invalid = |e: std::io::Error| OpError::new(OpErrorKind::Invalid, format!("{path}: {e}"));
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    builder
        .append_data(&mut header, &name, data)
        .map_err(invalid)?;
    let gz = builder.into_inner().map_err(invalid)?;
    gz.finish().map_err(invalid)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxBody {
    name: String,
    #[serde(default)]
    current_session_id: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct SessionBody {
    id: String,
    #[serde(default)]
    status: String,
    /// The session's whole timeout, in milliseconds from `startedAt` (or `createdAt`).
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default, rename = "startedAt")]
    started_at: Option<i64>,
    #[serde(default, rename = "createdAt")]
    created_at: Option<i64>,
}

impl SessionBody {
    /// When Vercel stops the session, in Unix milliseconds.
    fn deadline_ms(&self) -> Option<i64> {
        let start = self.started_at.or(self.created_at)?;
        Some(start + i64::try_from(self.timeout?).ok()?)
    }
}

#[derive(Debug, Deserialize)]
struct SandboxAndSession {
    sandbox: SandboxBody,
    #[serde(default)]
    session: Option<SessionBody>,
}

#[derive(Debug, Deserialize)]
struct SessionOnly {
    session: SessionBody,
}

#[derive(Debug, Deserialize)]
struct ListBody {
    sandboxes: Vec<SandboxBody>,
    #[serde(default)]
    pagination: Option<Pagination>,
}

#[derive(Debug, Deserialize)]
struct Pagination {
    #[serde(default)]
    next: Option<String>,
}

/// A sandbox's status as an instance state: a stopped sandbox is not adopted.
fn state_of(status: &str) -> InstanceState {
    match status {
        "pending" => InstanceState::Starting,
        "running" | "snapshotting" => InstanceState::Running,
        _ => InstanceState::Failed,
    }
}

fn instance(sandbox: &SandboxBody) -> Instance {
    Instance {
        id: sandbox.name.clone(),
        tags: Tags {
            sandbox_id: sandbox.tags.get(TAG_SANDBOX).cloned().unwrap_or_default(),
            attempt_id: sandbox.tags.get(TAG_ATTEMPT).cloned().unwrap_or_default(),
        },
        state: state_of(&sandbox.status),
    }
}

/// Vercel's `error.code`.
fn error_code(failure: &HttpFailure) -> Option<&str> {
    failure.body.as_ref()?.get("error")?.get("code")?.as_str()
}

/// Vercel's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | no connection made | `outage` |
/// | sent, then no answer (timeout, dropped) | `unknown` |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 | `unbound_account` |
/// | 402 | `billing` |
/// | 404 (project, snapshot or image not on this account) | `unsupported` |
/// | 410 `snapshot_not_found` | `unsupported` |
/// | 409, 410, other 4xx | `provider_error` |
/// | 429 (`Retry-After` kept) | `rate_limit` |
/// | 500, 502, 503 | `outage` |
/// | 504 (the create may have gone through) | `unknown` |
///
/// The SDK and Vercel's CLI name no capacity or quota error code; none is guessed here.
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    let Some(status) = failure.status else {
        return if failure.sent {
            ErrorClass::Unknown
        } else {
            ErrorClass::Outage
        };
    };
    if status.as_u16() == 410 && error_code(failure) == Some("snapshot_not_found") {
        return ErrorClass::Unsupported;
    }
    match status.as_u16() {
        400 | 422 => ErrorClass::InvalidRequest,
        401 | 403 => ErrorClass::UnboundAccount,
        402 => ErrorClass::Billing,
        404 => ErrorClass::Unsupported,
        429 => ErrorClass::RateLimit,
        500 | 502 | 503 => ErrorClass::Outage,
        504 => ErrorClass::Unknown,
        _ => ErrorClass::ProviderError,
    }
}

/// The failure's message with Vercel's own `error.message`.
fn message(failure: &HttpFailure) -> String {
    let said = failure
        .body
        .as_ref()
        .and_then(|b| b.get("error"))
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str);
    match said {
        Some(said) if !failure.message.contains(said) => {
            let said: String = said.chars().take(300).collect();
            format!("{}: {said}", failure.message)
        }
        _ => failure.message.clone(),
    }
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    let mut error = ProviderError::new(classify(&failure), message(&failure));
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
        Some(400) => OpErrorKind::Invalid,
        // 410 `sandbox_stopped`, 422 `sandbox_stopping` / `sandbox_snapshotting`.
        Some(409) | Some(410) | Some(422) => OpErrorKind::Conflict,
        _ => OpErrorKind::Provider,
    };
    OpError::new(kind, message(&failure))
}

impl Provider for Vercel {
    fn kind(&self) -> &'static str {
        "vercel"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let (endpoint, body) = self.create_body(&spec);
            let request = self.request(Method::POST, endpoint).json(&body);
            let response = self.http.send(request).await.map_err(create_error)?;
            let created: SandboxAndSession = self.http.json(response).await.map_err(|f| {
                // Vercel said yes but we cannot read which sandbox: reconcile by tag.
                let mut e = provider_error(f);
                e.class = ErrorClass::Unknown;
                e
            })?;
            let name = created.sandbox.name.clone();
            let (session, status) = match &created.session {
                Some(s) => (s.id.clone(), s.status.clone()),
                None => (
                    created.sandbox.current_session_id.clone(),
                    created.sandbox.status.clone(),
                ),
            };
            let failed = |message: String| ProviderError {
                class: ErrorClass::FailedBeforeRunning,
                message,
                instance_id: Some(name.clone()),
                retry_after: None,
                maybe_created: false,
            };
            if session.is_empty() {
                return Err(failed(format!(
                    "Vercel answered sandbox {name} without a session"
                )));
            }
            self.remember(&name, &session);
            self.wait_running(&session, &status).await.map_err(failed)?;
            if let Some(egress) = &spec.egress {
                if let Err(e) = self
                    .put_file(&name, CA_PATH, egress.ca_pem.clone().into_bytes())
                    .await
                {
                    return Err(failed(format!(
                        "the sandbox's CA could not be installed: {e}"
                    )));
                }
            }
            Ok(Instance {
                id: name,
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
            let sandbox = self
                .sandbox(instance_id, false)
                .await
                .map_err(provider_error)?;
            Ok(sandbox.as_ref().map(instance))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut cursor: Option<String> = None;
            // A bound on pages, should a cursor never end.
            for _ in 0..1000 {
                let page = self
                    .list_page(sandbox_id, cursor.as_deref())
                    .await
                    .map_err(provider_error)?;
                out.extend(
                    page.sandboxes
                        .iter()
                        .filter(|s| s.tags.get(TAG_SANDBOX).map(String::as_str) == Some(sandbox_id))
                        .filter(|s| {
                            attempt_id.is_none_or(|a| {
                                s.tags.get(TAG_ATTEMPT).map(String::as_str) == Some(a)
                            })
                        })
                        .map(instance),
                );
                match page
                    .pagination
                    .and_then(|p| p.next)
                    .filter(|n| !n.is_empty())
                {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            Ok(out)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/v2/sandboxes/{}", path_segment(instance_id));
            let result = self
                .http
                .send_idempotent(|| {
                    self.request(Method::DELETE, &path)
                        .query(&[("projectId", self.project_id.as_str())])
                })
                .await;
            self.forget(instance_id);
            match result {
                Ok(_) => Ok(()),
                Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(()),
                Err(f) => Err(provider_error(f)),
            }
        })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        // What this adapter does with Vercel: streamed commands it can kill, files read
        // and written, directories made; no pause (stop/start only), no PTY.
        Box::pin(async {
            Ok(RuntimeCapabilities {
                process_execute: true,
                process_ordered_output: true,
                process_cancel: true,
                filesystem_read: true,
                filesystem_write: true,
                filesystem_mkdir: true,
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

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || {
                self.request(Method::GET, "/v2/sandboxes")
                    .query(&[("project", self.project_id.as_str()), ("limit", "1")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!(
                "listed the sandboxes of project {} at {}",
                self.project_id,
                self.http.base_url()
            ))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(async move { self.start(instance_id, spec).await })
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let request = self
                .request(Method::POST, &Self::session_path(&session, "/fs/read"))
                .json(&json!({"path": path}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let bytes = response.bytes().await.map_err(|e| {
                OpError::new(
                    OpErrorKind::Provider,
                    format!("vercel: reading {path}: {e}"),
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
        Box::pin(async move { self.put_file(instance_id, path, data).await })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            if parents {
                let spec = ExecSpec {
                    argv: vec!["mkdir".into(), "-p".into(), "--".into(), path.into()],
                    ..ExecSpec::default()
                };
                let mut stream = self.start(instance_id, spec).await?;
                let mut stderr = Vec::new();
                while let Some(event) = stream.events.recv().await {
                    match event {
                        ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                        ExecEvent::Stdout(_) => {}
                        ExecEvent::Exit(info) if info.code == Some(0) => return Ok(()),
                        ExecEvent::Exit(_) => {
                            return Err(OpError::new(
                                OpErrorKind::Invalid,
                                format!(
                                    "mkdir -p {path}: {}",
                                    String::from_utf8_lossy(&stderr).trim()
                                ),
                            ))
                        }
                    }
                }
                return Err(OpError::new(
                    OpErrorKind::Provider,
                    format!("mkdir -p {path}: the command stream ended early"),
                ));
            }
            let session = self.session_of(instance_id).await?;
            let request = self
                .request(Method::POST, &Self::session_path(&session, "/fs/mkdir"))
                .json(&json!({"path": path}));
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    /// Vercel's session timeout only grows (`extend-timeout` adds a duration): it is extended
    /// to the sandbox's remaining lifetime plus the margin, or, for a sandbox without one, to
    /// the account's `timeout_ms` from now once less than half of that is left. A shorter
    /// lifetime leaves Vercel's later deadline: sandgate's own expiry deletes the sandbox.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let path = Self::session_path(&session, "");
            let response = self
                .http
                .send_idempotent(|| self.request(Method::GET, &path))
                .await
                .map_err(op_error)?;
            let body: SessionOnly = self.http.json(response).await.map_err(op_error)?;
            let Some(deadline) = body.session.deadline_ms() else {
                return Ok(());
            };
            let now = crate::base::clock::now_ms();
            let wanted = match remaining {
                Some(r) => now + (r + LIFETIME_MARGIN).as_millis() as i64,
                None if deadline - now >= self.timeout_ms as i64 / 2 => return Ok(()),
                None => now + self.timeout_ms as i64,
            };
            if wanted <= deadline {
                return Ok(());
            }
            let request = self
                .request(
                    Method::POST,
                    &Self::session_path(&session, "/extend-timeout"),
                )
                .json(&json!({"duration": wanted - deadline}));
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            match operation {
                Lifecycle::Stop => {
                    let session = self.session_of(instance_id).await?;
                    let request =
                        self.request(Method::POST, &Self::session_path(&session, "/stop"));
                    self.http.send(request).await.map_err(op_error)?;
                    Ok(())
                }
                Lifecycle::Start => {
                    self.forget(instance_id);
                    self.sandbox(instance_id, true)
                        .await
                        .map_err(op_error)?
                        .ok_or_else(|| {
                            OpError::new(
                                OpErrorKind::NotFound,
                                format!("no Vercel sandbox {instance_id}"),
                            )
                        })?;
                    Ok(())
                }
                Lifecycle::Pause | Lifecycle::Resume => {
                    Err(OpError::unsupported("vercel", operation.as_str()))
                }
            }
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let session = self.session_of(instance_id).await?;
            let request = self.request(Method::POST, &Self::session_path(&session, "/snapshot"));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["snapshot"]["id"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "vercel answered a snapshot without snapshot.id",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: body["snapshot"]["sizeBytes"].as_u64().unwrap_or(0),
            })
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let path = format!("/v2/sandboxes/snapshots/{}", path_segment(snapshot_id));
            match self
                .http
                .send_idempotent(|| self.request(Method::DELETE, &path))
                .await
            {
                Ok(_) => Ok(()),
                Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(()),
                Err(f) => Err(op_error(f)),
            }
        })
    }
}

impl Vercel {
    /// `POST .../cmd` with `wait: true`: the command's NDJSON stream as an [`ExecStream`].
    async fn start(&self, name: &str, spec: ExecSpec) -> Result<ExecStream, OpError> {
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        };
        let session = self.session_of(name).await?;
        let mut body = json!({
            "command": program,
            "args": args,
            "env": spec.env,
            "sudo": false,
            "wait": true,
            "logs": true,
        });
        if let Some(cwd) = &spec.cwd {
            body["cwd"] = json!(cwd);
        }
        let mut request = self
            .request(Method::POST, &Self::session_path(&session, "/cmd"))
            .json(&body);
        if let Some(timeout) = spec.timeout {
            body["timeout"] = json!(timeout.as_millis() as u64);
            request = self
                .request(Method::POST, &Self::session_path(&session, "/cmd"))
                .json(&body)
                .timeout(timeout + Duration::from_secs(10));
        } else {
            // Commands may run for long: the stream has no whole-request timeout.
            request = request.timeout(Duration::from_secs(24 * 3600));
        }
        // The command's clock starts before the request is sent: Vercel's starts when it is
        // received, so a stream that ends at Vercel's timeout is always past ours too (taken
        // after the answer's headers, a slow answer made a timed-out command look exited).
        let sent = Instant::now();
        let response = self.http.send(request).await.map_err(op_error)?;
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !content_type.starts_with("application/x-ndjson") {
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!("vercel answered a command with {content_type:?}, not an NDJSON stream"),
            ));
        }
        let (tx, rx) = mpsc::channel(64);
        let command_id = Arc::new(Mutex::new(None::<String>));
        let reader = tokio::spawn(read_events(
            response,
            tx,
            command_id.clone(),
            spec.timeout.map(|t| (sent, t)),
        ));
        let http = self.http.clone();
        let team = self.team_id.clone();
        let cancelled = Arc::new(tokio::sync::Notify::new());
        let notify = cancelled.clone();
        tokio::spawn(async move {
            notify.notified().await;
            let Some(id) = command_id.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
                return;
            };
            let path = format!(
                "/v2/sandboxes/sessions/{}/cmd/{}/kill",
                path_segment(&session),
                path_segment(&id)
            );
            let request = http
                .request(Method::POST, &path)
                .query(&[("teamId", team.as_str())])
                .json(&json!({"signal": 9}));
            if let Err(e) = http.send(request).await {
                tracing::warn!(command = %id, error = %e.message, "vercel: killing a cancelled command failed");
            }
        });
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            reader.abort();
            cancelled.notify_one();
        });
        Ok(ExecStream { events: rx, cancel })
    }
}

/// Reads the NDJSON stream of a waited command into exec events.
async fn read_events(
    response: reqwest::Response,
    tx: mpsc::Sender<ExecEvent>,
    command_id: Arc<Mutex<Option<String>>>,
    timed: Option<(Instant, Duration)>,
) {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut seen_command = false;
    let exit = loop {
        let Some(chunk) = body.next().await else {
            break None;
        };
        let Ok(chunk) = chunk else {
            break None;
        };
        buffer.extend_from_slice(&chunk);
        let mut done = None;
        while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=at).collect();
            match parse_line(&line, &mut seen_command) {
                Line::Command(id) => {
                    *command_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
                }
                Line::Output(event) => {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                Line::Finished(code) => {
                    done = Some(Some(code));
                    break;
                }
                Line::Error => {
                    done = Some(None);
                    break;
                }
                Line::Skip => {}
            }
        }
        if let Some(done) = done {
            break done;
        }
    };
    let timed_out = timed.is_some_and(|(started, limit)| started.elapsed() >= limit);
    let info = match exit {
        Some(code) if !(timed_out && code != 0) => ExitInfo {
            code: Some(code),
            signal: None,
            reason: ExitReason::Exited,
        },
        _ if timed_out => ExitInfo {
            code: None,
            signal: Some(9),
            reason: ExitReason::TimedOut,
        },
        _ => ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        },
    };
    let _ = tx.send(ExecEvent::Exit(info)).await;
}

enum Line {
    /// The first `{command}` line: the command's id.
    Command(String),
    Output(ExecEvent),
    /// The finished `{command}` line: its exit code.
    Finished(i32),
    /// `{stream: "error"}`: the stream ended without an exit (the sandbox stopped).
    Error,
    Skip,
}

fn parse_line(line: &[u8], seen_command: &mut bool) -> Line {
    let Ok(value) = serde_json::from_slice::<Value>(line) else {
        return Line::Skip;
    };
    if let Some(command) = value.get("command").filter(|c| c.is_object()) {
        let code = command.get("exitCode").and_then(Value::as_i64);
        if !*seen_command && code.is_none() {
            *seen_command = true;
            return Line::Command(command["id"].as_str().unwrap_or_default().to_string());
        }
        *seen_command = true;
        return Line::Finished(code.unwrap_or(0) as i32);
    }
    match value.get("stream").and_then(Value::as_str) {
        Some("stdout") => Line::Output(ExecEvent::Stdout(Bytes::from(
            value["data"].as_str().unwrap_or_default().to_string(),
        ))),
        Some("stderr") => Line::Output(ExecEvent::Stderr(Bytes::from(
            value["data"].as_str().unwrap_or_default().to_string(),
        ))),
        Some("error") => Line::Error,
        _ => Line::Skip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(status: Option<u16>, body: Value, sent: bool) -> HttpFailure {
        HttpFailure {
            status: status.map(|s| StatusCode::from_u16(s).unwrap()),
            body: Some(body),
            retry_after: None,
            sent,
            timed_out: !sent,
            message: String::new(),
        }
    }

    fn err(code: &str) -> Value {
        json!({"error": {"code": code, "message": "m"}})
    }

    #[test]
    fn the_failure_table() {
        let cases = [
            (400, err("bad_request"), ErrorClass::InvalidRequest),
            (422, err("sandbox_stopping"), ErrorClass::InvalidRequest),
            (401, err("forbidden"), ErrorClass::UnboundAccount),
            (403, err("forbidden"), ErrorClass::UnboundAccount),
            (402, err("payment_required"), ErrorClass::Billing),
            (404, err("not_found"), ErrorClass::Unsupported),
            (410, err("snapshot_not_found"), ErrorClass::Unsupported),
            (410, err("sandbox_stopped"), ErrorClass::ProviderError),
            (409, err("conflict"), ErrorClass::ProviderError),
            (429, err("rate_limited"), ErrorClass::RateLimit),
            (500, json!({}), ErrorClass::Outage),
            (502, json!({}), ErrorClass::Outage),
            (503, json!({}), ErrorClass::Outage),
            (504, json!({}), ErrorClass::Unknown),
        ];
        for (status, body, class) in cases {
            assert_eq!(
                classify(&failure(Some(status), body.clone(), true)),
                class,
                "{status} {body}"
            );
        }
        assert_eq!(
            classify(&failure(None, json!(null), false)),
            ErrorClass::Outage
        );
        assert_eq!(
            classify(&failure(None, json!(null), true)),
            ErrorClass::Unknown
        );
        let mut limited = failure(Some(429), err("rate_limited"), true);
        limited.retry_after = Some(Duration::from_secs(7));
        assert_eq!(
            provider_error(limited).retry_after,
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn options_are_checked() {
        let key = || Secret::new("k".to_string());
        let opts = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let a = VercelAccount::from_options(
            None,
            &opts(&[("team_id", "team_1"), ("project_id", "prj_1")]),
            key(),
        )
        .unwrap();
        assert_eq!(a.base_url, DEFAULT_BASE_URL);
        assert_eq!(a.base, BaseImage::Default);
        assert_eq!(a.timeout_ms, DEFAULT_TIMEOUT_MS);
        let e =
            VercelAccount::from_options(None, &opts(&[("project_id", "p")]), key()).unwrap_err();
        assert_eq!(e.0, "options.team_id");
        let e = VercelAccount::from_options(None, &opts(&[("team_id", "t")]), key()).unwrap_err();
        assert_eq!(e.0, "options.project_id");
        let e = VercelAccount::from_options(
            None,
            &opts(&[("team_id", "t"), ("project_id", "p"), ("region", "x")]),
            key(),
        )
        .unwrap_err();
        assert_eq!(e.0, "options.region");
        assert!(e
            .1
            .contains("team_id, project_id, runtime, image, vcpus, timeout_ms"));
        let e = VercelAccount::from_options(
            None,
            &opts(&[
                ("team_id", "t"),
                ("project_id", "p"),
                ("runtime", "node22"),
                ("image", "i"),
            ]),
            key(),
        )
        .unwrap_err();
        assert_eq!(e.0, "options.image");
        for (name, bad) in [("vcpus", "0"), ("vcpus", "x"), ("timeout_ms", "0")] {
            let e = VercelAccount::from_options(
                None,
                &opts(&[("team_id", "t"), ("project_id", "p"), (name, bad)]),
                key(),
            )
            .unwrap_err();
            assert_eq!(e.0, format!("options.{name}"));
        }
        let a = VercelAccount::from_options(
            Some("http://127.0.0.1:9"),
            &opts(&[
                ("team_id", "t"),
                ("project_id", "p"),
                ("runtime", "node22"),
                ("vcpus", "4"),
            ]),
            key(),
        )
        .unwrap();
        assert_eq!(a.base, BaseImage::Runtime("node22".into()));
        assert_eq!(a.vcpus, Some(4));
        assert_eq!(a.base_url, "http://127.0.0.1:9");
    }

    fn egress(host: &str, lock_down: bool) -> RemoteEgress {
        RemoteEgress {
            proxy_url: format!("https://sb:tok@{host}:8443"),
            gateway_host: host.into(),
            gateway_port: 8443,
            ca_pem: "PEM".into(),
            lock_down,
        }
    }

    #[test]
    fn lockdown_names_only_the_gateway() {
        assert_eq!(
            lockdown(&egress("203.0.113.7", true)),
            Some(json!({"allow": [], "subnets": {"allow": ["203.0.113.7/32"]}}))
        );
        assert_eq!(
            lockdown(&egress("2001:db8::1", true)),
            Some(json!({"allow": [], "subnets": {"allow": ["2001:db8::1/128"]}}))
        );
        assert_eq!(
            lockdown(&egress("gw.example.com", true)),
            Some(json!({"allow": ["gw.example.com"]}))
        );
        assert_eq!(lockdown(&egress("gw.example.com", false)), None);
    }

    #[test]
    fn tar_names_are_normalized() {
        assert_eq!(
            tar_name("/vercel/sandbox/a.txt").unwrap(),
            "vercel/sandbox/a.txt"
        );
        assert_eq!(tar_name("b/../c.txt").unwrap(), "vercel/sandbox/c.txt");
        assert_eq!(tar_name("/../../etc/x").unwrap(), "etc/x");
        assert!(tar_name("/").is_err());
        let gz = tar_gz(CA_PATH, b"PEM").unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(
            entry.path().unwrap().to_str().unwrap(),
            "vercel/sandbox/.sandgate/ca.pem"
        );
        let mut data = String::new();
        std::io::Read::read_to_string(&mut entry, &mut data).unwrap();
        assert_eq!(data, "PEM");
    }

    #[test]
    fn ndjson_lines() {
        let mut seen = false;
        let first = br#"{"command":{"id":"cmd_1","exitCode":null}}"#;
        assert!(matches!(parse_line(first, &mut seen), Line::Command(id) if id == "cmd_1"));
        assert!(matches!(
            parse_line(br#"{"stream":"stdout","data":"hi"}"#, &mut seen),
            Line::Output(ExecEvent::Stdout(b)) if &b[..] == b"hi"
        ));
        assert!(matches!(
            parse_line(
                br#"{"stream":"error","data":{"code":"x","message":"y"}}"#,
                &mut seen
            ),
            Line::Error
        ));
        assert!(matches!(
            parse_line(br#"{"command":{"id":"cmd_1","exitCode":3}}"#, &mut seen),
            Line::Finished(3)
        ));
    }

    #[test]
    fn sandbox_states() {
        assert_eq!(state_of("pending"), InstanceState::Starting);
        assert_eq!(state_of("running"), InstanceState::Running);
        assert_eq!(state_of("stopped"), InstanceState::Failed);
        assert_eq!(state_of("failed"), InstanceState::Failed);
    }
}
