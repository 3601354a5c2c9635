//! The Daytona adapter: the REST control plane (`https://app.daytona.io/api`, the API the
//! official `daytona` SDKs generate their clients from) for sandboxes, and the toolbox (the
//! daemon inside each sandbox, reached through the sandbox's `toolboxProxyUrl`) for commands
//! and files.
//!
//! Contract:
//! - Every URL derives from the account: `base_url` (default `https://app.daytona.io/api`)
//!   for the control plane; the toolbox at `{toolboxProxyUrl}/{sandboxId}/...`, where
//!   `toolboxProxyUrl` is what Daytona answered for the sandbox (as the SDKs do). The API key
//!   goes in `Authorization: Bearer` on both; `options.organization_id` adds
//!   `X-Daytona-Organization-ID`.
//! - Create is `POST /sandbox` with `labels` `{sandgate_sandbox, sandgate_attempt}` and `env`;
//!   Daytona may answer while the sandbox is still `creating` (the call can block for up to
//!   30 s), so the adapter polls `GET /sandbox/{id}` until `state == "started"`, within the
//!   account's create timeout (`options.create_timeout_secs`, default 180). `error` and
//!   `build_failed` end the attempt with the class of the `errorReason` (capacity and quota
//!   messages keep theirs; anything else is `failed_before_running`), naming the instance so
//!   the coordinator deletes it.
//! - [`Provider::list_by_tag`] is `GET /sandbox?labels=<JSON object>` (the encoding the SDKs
//!   use), following `nextCursor` through `{items, nextCursor}` pages; the bare array older
//!   deployments answer is read too. Destroyed sandboxes are not listed.
//! - Delete is `DELETE /sandbox/{id}`: 404 is success; 409 (a state change in progress,
//!   e.g. still `creating` or `stopping`) is retried after a short wait, for up to 30 s.
//! - Egress: with a [`RemoteEgress`] that locks down (`lock_down`, a pool with
//!   `egress = "gateway"`) the sandbox is created with `networkBlockAll: false` and
//!   `networkAllowList: "<gateway IPv4>/32"`, so the gateway is the only destination Daytona
//!   lets it reach. Daytona's allow list takes IPv4 CIDRs only (at most 10): a gateway whose
//!   public host is a name or an IPv6 address cannot be expressed, and the create fails
//!   (`unsupported`, not retried) before anything is provisioned rather than leaving the
//!   sandbox open. The allow list Daytona echoes back is checked; a sandbox that does not
//!   carry exactly the lock-down is not used. The sandbox's `allow_domains` are *not* put in
//!   Daytona's `domainAllowList`: a domain listed there is reachable directly, around the
//!   gateway's per-request policy and credential injection. Daytona's own `outboundProxyUrl`
//!   is not used either: it only sets the proxy variables (convenience routing, by Daytona's
//!   own description), and it would hand the sandbox's proxy credential to Daytona's
//!   configuration. The proxy and CA variables ([`RemoteEgress::env`]) go in `env`, and
//!   sandgate's CA is written to [`CA_PATH`] through the toolbox once the sandbox runs; an
//!   advisory pool (`lock_down` false) gets only these.
//! - Exec is the toolbox's `POST /process/execute` `{command, cwd, envs, timeout}` →
//!   `{exitCode, result}`. It does not stream: the command's whole output (stdout and stderr
//!   merged, as Daytona returns them) arrives as one stdout event when it ends, then the
//!   exit. The argv is quoted for a POSIX shell (the daemon feeds the command to the
//!   sandbox's shell). The command records its shell's pid in a marker file so a cancel (or
//!   dropping the stream) can kill its process group with a second execute; Daytona has no
//!   kill for `execute` of its own.
//! - Files: `GET /files/download?path=` (read), `POST /files/bulk-upload` (write; the form
//!   fields `files[0].path` and `files[0].file`, which the SDKs' uploads use and which creates
//!   parent directories), `GET /files?path=` (list), `DELETE /files?path=&recursive=`,
//!   `POST /files/folder?path=&mode=` (mkdir; Daytona always creates parents, so without
//!   `parents` the adapter checks the parent with `GET /files/info` first).
//! - Lifecycle: `POST /sandbox/{id}/stop|start|pause` (resume is `start` of a paused
//!   sandbox), each waited for until the resulting state; pause is only offered by Daytona's
//!   VM sandbox classes (others answer 422, reported as unsupported). Snapshot is
//!   `POST /sandbox/{id}/snapshot {name}`; the snapshot's name seeds a later create.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]).
//!
//! Files: this one holds the account, the control-plane calls and the failure table;
//! `provider` the [`Provider`](crate::providers::Provider) implementation, `exec` commands
//! through the toolbox, `wire` Daytona's JSON.

mod exec;
mod provider;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use reqwest::{Method, RequestBuilder};
use sandgate_router::{Resources, Source};
use serde_json::{json, Value};

use super::account::{known_options, positive};
use super::errors::{left_behind, own_message, ErrorTable};
use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{ca_not_installed, create_env, gateway_addr, GatewayAddr};
use super::poll::{self, Pace, Seen, Waited};
use super::tags::tag_object;
use crate::credentials::Secret;
use crate::ops::Lifecycle;
use crate::providers::RuntimeCapabilities;
use crate::providers::{
    CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, ProviderError,
    RemoteEgress,
};
use wire::{ListAnswer, SandboxDto};

/// What this adapter does with Daytona: buffered commands (merged output) it can kill, files
/// through the toolbox, pause and resume (on VM classes only: `capabilities` answers without
/// it for a sandbox of another class).
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens).
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_list: true,
    filesystem_delete: true,
    filesystem_mkdir: true,
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

pub use super::shell::quote_argv;

/// Where sandgate's CA goes inside a Daytona sandbox (the default user `daytona`'s home).
pub const CA_PATH: &str = "/home/daytona/.sandgate/ca.pem";
const DEFAULT_BASE_URL: &str = "https://app.daytona.io/api";
const ORG_HEADER: &str = "X-Daytona-Organization-ID";
/// The longest command sandgate's API accepts; sent when an exec names no timeout, since
/// newer daemons otherwise apply a short default of their own.
const MAX_EXEC_SECS: u64 = 24 * 3600;
/// How long a delete keeps retrying a 409 (a state change in progress).
const DELETE_CONFLICT_WINDOW: Duration = Duration::from_secs(30);
/// How often a sandbox (or snapshot) in transition is looked at.
const STATE_PACE: Pace = Pace::growing(Duration::from_millis(200), Duration::from_secs(2));

/// A Daytona account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct DaytonaAccount {
    pub base_url: String,
    /// Sent as `X-Daytona-Organization-ID` when set.
    pub organization_id: Option<String>,
    /// The snapshot new sandboxes start from when the request names none (Daytona's
    /// default snapshot when unset).
    pub snapshot: Option<String>,
    /// The region (`target`); the organization's default when unset.
    pub target: Option<String>,
    /// `autoStopInterval` in minutes (0 disables auto-stop); Daytona's default when unset.
    pub auto_stop_minutes: Option<u32>,
    /// How long a create may take until the sandbox runs.
    pub create_timeout: Duration,
    /// How long one call to Daytona (control plane or toolbox) may take before it counts as
    /// unanswered; a command's own timeout extends it for exec.
    pub request_timeout: Duration,
    pub api_key: Secret,
}

/// A create may block for up to 30 s at Daytona before it answers.
const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 60;

const OPTIONS: [&str; 6] = [
    "organization_id",
    "snapshot",
    "target",
    "auto_stop_minutes",
    "create_timeout_secs",
    "request_timeout_secs",
];

impl DaytonaAccount {
    /// Options: `organization_id`, `snapshot`, `target`, `auto_stop_minutes`,
    /// `create_timeout_secs` (default 180), `request_timeout_secs` (default 60). Errors name
    /// the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<DaytonaAccount, (String, String)> {
        known_options("a daytona", options, &OPTIONS)?;
        for (key, value) in options {
            if value.trim().is_empty() {
                return Err((format!("options.{key}"), "must not be empty".into()));
            }
        }
        let text = |key: &str| options.get(key).map(|v| v.trim().to_string());
        let auto_stop_minutes = match options.get("auto_stop_minutes") {
            Some(v) => Some(v.trim().parse::<u32>().map_err(|_| {
                (
                    "options.auto_stop_minutes".to_string(),
                    "must be a whole number of minutes (0 disables auto-stop)".to_string(),
                )
            })?),
            None => None,
        };
        let create_timeout_secs =
            positive(options, "create_timeout_secs", "seconds")?.unwrap_or(180);
        let request_timeout_secs = positive(options, "request_timeout_secs", "seconds")?
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT_SECS);
        let base_url = base_url.unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/');
        if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
            return Err((
                "base_url".into(),
                "must be an http(s) URL, e.g. https://app.daytona.io/api".into(),
            ));
        }
        Ok(DaytonaAccount {
            base_url: base_url.to_string(),
            organization_id: text("organization_id"),
            snapshot: text("snapshot"),
            target: text("target"),
            auto_stop_minutes,
            create_timeout: Duration::from_secs(create_timeout_secs),
            request_timeout: Duration::from_secs(request_timeout_secs),
            api_key,
        })
    }
}

pub struct Daytona {
    http: ProviderHttp,
    organization_id: Option<String>,
    snapshot: Option<String>,
    target: Option<String>,
    auto_stop_minutes: Option<u32>,
    create_timeout: Duration,
    /// `toolboxProxyUrl` by sandbox id (fetched again from `GET /sandbox/{id}` when absent).
    toolbox: Mutex<HashMap<String, String>>,
    /// What each create asked for, to compare with what Daytona provisioned.
    requested: Mutex<HashMap<String, Resources>>,
}

impl std::fmt::Debug for Daytona {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daytona")
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl Daytona {
    pub fn new(account: DaytonaAccount, tls: rustls::ClientConfig) -> Result<Daytona, String> {
        let http = ProviderHttp::new(
            "daytona",
            &account.base_url,
            Auth::Bearer,
            account.api_key,
            tls,
            account.request_timeout,
        )?;
        Ok(Daytona {
            http,
            organization_id: account.organization_id,
            snapshot: account.snapshot,
            target: account.target,
            auto_stop_minutes: account.auto_stop_minutes,
            create_timeout: account.create_timeout,
            toolbox: Mutex::new(HashMap::new()),
            requested: Mutex::new(HashMap::new()),
        })
    }

    /// An authenticated control-plane request.
    fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.with_org(self.http.request(method, path))
    }

    fn with_org(&self, builder: RequestBuilder) -> RequestBuilder {
        match &self.organization_id {
            Some(org) => builder.header(ORG_HEADER, org),
            None => builder,
        }
    }

    fn create_body(&self, spec: &CreateSpec) -> Result<Value, ProviderError> {
        let mut body = json!({"labels": tag_object(&spec.tags)});
        let source = spec
            .snapshot
            .clone()
            .map(Source::Template)
            .or_else(|| spec.request.source.clone());
        match source {
            Some(Source::Template(name) | Source::Environment(name)) => {
                body["snapshot"] = json!(name)
            }
            Some(Source::Image(image)) => {
                // Daytona builds a snapshot from the image; only then may resources be set.
                body["buildInfo"] = json!({"dockerfileContent": format!("FROM {image}\n")});
                let r = &spec.request.resources;
                if let Some(cpu) = r.cpu {
                    body["cpu"] = json!(cpu.ceil().max(1.0) as u64);
                }
                if let Some(mb) = r.memory_mb {
                    body["memory"] = json!(mb.div_ceil(1024).max(1));
                }
                if let Some(gb) = r.disk_gb {
                    body["disk"] = json!(gb);
                }
                if let Some(gpu) = r.gpu {
                    body["gpu"] = json!(gpu);
                }
            }
            None => {
                if let Some(snapshot) = &self.snapshot {
                    body["snapshot"] = json!(snapshot);
                }
            }
        }
        if let Some(target) = &self.target {
            body["target"] = json!(target);
        }
        // Daytona stops a sandbox after 15 idle minutes unless told otherwise, while sandgate
        // still serves it as running: its lifetime is sandgate's (the janitor ends it), so
        // idle auto-stop is off unless the account asks for it.
        body["autoStopInterval"] = json!(self.auto_stop_minutes.unwrap_or(0));
        // An advisory pool gets the proxy variables and the CA only.
        if let Some(egress) = spec.egress.as_ref().filter(|e| e.lock_down) {
            let cidr = gateway_cidr(&egress.gateway_host)?;
            body["networkBlockAll"] = json!(false);
            body["networkAllowList"] = json!(cidr);
        }
        body["env"] = json!(create_env(spec, CA_PATH));
        Ok(body)
    }

    /// `GET /sandbox/{id}`; `None` when Daytona does not know it.
    async fn detail(&self, id: &str) -> Result<Option<SandboxDto>, HttpFailure> {
        let path = format!("/sandbox/{}", path_segment(id));
        let dto: Option<SandboxDto> = self
            .http
            .read_optional(|| self.api(Method::GET, &path))
            .await?;
        if let Some(dto) = &dto {
            self.remember_toolbox(dto);
        }
        Ok(dto)
    }

    fn remember_toolbox(&self, dto: &SandboxDto) {
        if let Some(url) = dto.toolbox_proxy_url.as_deref().filter(|u| is_http_url(u)) {
            self.toolbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dto.id.clone(), url.trim_end_matches('/').to_string());
        }
    }

    /// Polls until the sandbox reaches one of `targets`, fails, or `deadline` passes.
    async fn wait_for(
        &self,
        id: &str,
        dto: SandboxDto,
        targets: &[&str],
        deadline: Instant,
    ) -> Result<SandboxDto, WaitError> {
        let judge = |dto: SandboxDto| {
            let state = dto.state.clone().unwrap_or_default();
            if targets.contains(&state.as_str()) {
                Seen::Ready(dto)
            } else if matches!(state.as_str(), "error" | "build_failed") {
                let reason = dto.error_reason.unwrap_or_default();
                Seen::Stop(WaitError::Failed(state, reason))
            } else if is_gone(Some(&state)) {
                Seen::Stop(WaitError::Gone)
            } else {
                Seen::Waiting(state)
            }
        };
        let fetch = move || async move {
            match self.detail(id).await {
                Ok(Some(dto)) => Ok(dto),
                Ok(None) => Err(WaitError::Gone),
                Err(f) => Err(WaitError::Http(f)),
            }
        };
        poll::until(deadline, STATE_PACE, Some(dto), judge, fetch)
            .await
            .map_err(|waited| match waited {
                Waited::Stopped(e) => e,
                Waited::TimedOut(state) => WaitError::Timeout(state),
            })
    }

    async fn create_instance(&self, spec: CreateSpec) -> Result<Instance, ProviderError> {
        let deadline = Instant::now() + self.create_timeout;
        let body = self.create_body(&spec)?;
        let request = self.api(Method::POST, "/sandbox").json(&body);
        let response = self
            .http
            .send(request)
            .await
            .map_err(|f| ERRORS.create_error(f))?;
        let created: SandboxDto = self
            .http
            .json(response)
            .await
            .map_err(|f| ERRORS.unreadable_create(f))?;
        let id = created.id.clone();
        self.remember_toolbox(&created);
        self.requested
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), spec.request.resources.clone());
        let left_behind = |class, message| left_behind(&id, class, message);
        let started = match self.wait_for(&id, created, &["started"], deadline).await {
            Ok(dto) => dto,
            Err(WaitError::Failed(state, reason)) => {
                return Err(left_behind(
                    reason_class(&reason),
                    format!("the Daytona sandbox {id} entered state {state}: {reason}"),
                ))
            }
            Err(WaitError::Gone) => {
                return Err(left_behind(
                    ErrorClass::FailedBeforeRunning,
                    format!("the Daytona sandbox {id} was destroyed before it started"),
                ))
            }
            Err(WaitError::Timeout(state)) => {
                return Err(left_behind(
                    ErrorClass::FailedBeforeRunning,
                    format!(
                        "the Daytona sandbox {id} did not start within {} s (state {state})",
                        self.create_timeout.as_secs()
                    ),
                ))
            }
            Err(WaitError::Http(f)) => {
                // Its state could not be read: reconcile before anything else.
                return Err(left_behind(
                    ErrorClass::Unknown,
                    format!("waiting for the Daytona sandbox {id}: {}", f.message),
                ));
            }
        };
        if let Some(egress) = &spec.egress {
            let expected = body["networkAllowList"].as_str().unwrap_or_default();
            if egress.lock_down {
                locked_down(&started, expected)
                    .map_err(|m| left_behind(ErrorClass::FailedBeforeRunning, m))?;
            }
            if let Err(e) = self
                .put_file(&id, CA_PATH, egress.ca_pem.clone().into_bytes())
                .await
            {
                return Err(ca_not_installed(&id, "sandbox", e));
            }
        }
        Ok(Instance {
            id,
            tags: spec.tags,
            state: InstanceState::Running,
        })
    }

    async fn list_page(
        &self,
        labels: &str,
        cursor: Option<&str>,
    ) -> Result<(Vec<SandboxDto>, Option<String>), HttpFailure> {
        let build = || {
            let mut query = vec![("labels", labels.to_string()), ("limit", "100".to_string())];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor.to_string()));
            }
            self.api(Method::GET, "/sandbox").query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        Ok(match self.http.json::<ListAnswer>(response).await? {
            ListAnswer::Page { items, next_cursor } => {
                (items, next_cursor.filter(|c| !c.is_empty()))
            }
            ListAnswer::Bare(items) => (items, None),
        })
    }

    /// `{toolboxProxyUrl}/{sandboxId}`.
    async fn toolbox_base(&self, id: &str) -> Result<String, OpError> {
        let cached = self
            .toolbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        let url = match cached {
            Some(url) => url,
            None => {
                let dto = self
                    .detail(id)
                    .await
                    .map_err(op_error)?
                    .filter(|d| !is_gone(d.state.as_deref()))
                    .ok_or_else(|| not_found(id))?;
                match dto.toolbox_proxy_url.filter(|u| is_http_url(u)) {
                    Some(url) => url.trim_end_matches('/').to_string(),
                    None => self.fetch_toolbox_url(id).await?,
                }
            }
        };
        Ok(format!("{url}/{}", path_segment(id)))
    }

    /// `GET /sandbox/{id}/toolbox-proxy-url`, for deployments that leave it out of the
    /// sandbox.
    async fn fetch_toolbox_url(&self, id: &str) -> Result<String, OpError> {
        let path = format!("/sandbox/{}/toolbox-proxy-url", path_segment(id));
        let response = self
            .http
            .send_idempotent(|| self.api(Method::GET, &path))
            .await
            .map_err(op_error)?;
        let body: Value = self.http.json(response).await.map_err(op_error)?;
        let url = body["url"]
            .as_str()
            .filter(|u| is_http_url(u))
            .ok_or_else(|| OpError::new(OpErrorKind::Provider, "daytona answered no toolbox URL"))?
            .trim_end_matches('/')
            .to_string();
        self.toolbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), url.clone());
        Ok(url)
    }

    /// A toolbox request for sandbox `id`.
    async fn toolbox(
        &self,
        id: &str,
        method: Method,
        path: &str,
    ) -> Result<RequestBuilder, OpError> {
        let base = self.toolbox_base(id).await?;
        Ok(self.with_org(self.http.request_url(method, &format!("{base}{path}"))))
    }

    async fn put_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let part = reqwest::multipart::Part::bytes(data).file_name(path.to_string());
        let form = reqwest::multipart::Form::new()
            .text("files[0].path", path.to_string())
            .part("files[0].file", part);
        let request = self
            .toolbox(id, Method::POST, "/files/bulk-upload")
            .await?
            .multipart(form);
        self.http.send(request).await.map_err(op_error)?;
        Ok(())
    }

    async fn file_exists(&self, id: &str, path: &str) -> Result<bool, OpError> {
        let request = self
            .toolbox(id, Method::GET, "/files/info")
            .await?
            .query(&[("path", path)]);
        match self.http.send(request).await {
            Ok(_) => Ok(true),
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(false),
            Err(f) => Err(op_error(f)),
        }
    }

    /// Sends a lifecycle call and waits for its resulting state.
    async fn transition(&self, id: &str, operation: Lifecycle) -> Result<(), OpError> {
        let (action, targets): (&str, &[&str]) = match operation {
            Lifecycle::Stop => ("stop", &["stopped", "destroyed"]),
            Lifecycle::Start | Lifecycle::Resume => ("start", &["started"]),
            Lifecycle::Pause => ("pause", &["paused"]),
        };
        let path = format!("/sandbox/{}/{action}", path_segment(id));
        let response = match self.http.send(self.api(Method::POST, &path)).await {
            Ok(response) => response,
            Err(f) => {
                return Err(match f.status.map(|s| s.as_u16()) {
                    Some(422) => OpError::new(
                        OpErrorKind::Unsupported,
                        format!(
                            "daytona cannot {} this sandbox: {}",
                            operation.as_str(),
                            f.message
                        ),
                    ),
                    // "Sandbox is not in valid state" and the like.
                    Some(400) | Some(409) => OpError::new(OpErrorKind::Conflict, f.message),
                    _ => op_error(f),
                });
            }
        };
        let dto = match self.http.json::<SandboxDto>(response).await {
            Ok(dto) => dto,
            Err(_) => self
                .detail(id)
                .await
                .map_err(op_error)?
                .ok_or_else(|| not_found(id))?,
        };
        let deadline = Instant::now() + self.create_timeout;
        self.wait_for(id, dto, targets, deadline)
            .await
            .map(|_| ())
            .map_err(|e| e.into_op_error(id, operation.as_str()))
    }
}

enum WaitError {
    Failed(String, String),
    Gone,
    Timeout(String),
    Http(HttpFailure),
}

impl WaitError {
    fn into_op_error(self, id: &str, operation: &str) -> OpError {
        match self {
            WaitError::Failed(state, reason) => OpError::new(
                OpErrorKind::Provider,
                format!("daytona: {operation} left sandbox {id} in state {state}: {reason}"),
            ),
            WaitError::Gone => not_found(id),
            WaitError::Timeout(state) => OpError::new(
                OpErrorKind::Provider,
                format!(
                    "daytona: {operation} of sandbox {id} did not finish in time (state {state})"
                ),
            ),
            WaitError::Http(f) => op_error(f),
        }
    }
}

/// The native egress settings of a create locked to the gateway (`None` for an advisory
/// pool, or when the gateway's host cannot be expressed, in which case the create fails).
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    if !egress.lock_down {
        return None;
    }
    let cidr = gateway_cidr(&egress.gateway_host).ok()?;
    Some(json!({"networkBlockAll": false, "networkAllowList": cidr}))
}

/// `<ip>/32` for a gateway host that is an IPv4 literal; anything else cannot be put in
/// Daytona's allow list, and the create must not go ahead unlocked.
fn gateway_cidr(host: &str) -> Result<String, ProviderError> {
    match gateway_addr(host) {
        GatewayAddr::V4(ip) => Ok(format!("{ip}/32")),
        _ => Err(ProviderError::new(
            ErrorClass::Unsupported,
            format!(
                "daytona: the gateway's public host {host:?} is not an IPv4 address, and Daytona's \
                 network allow list takes IPv4 CIDRs only, so the sandbox cannot be locked to the \
                 gateway; set [proxy] public_url to an IPv4 address to use Daytona pools"
            ),
        )),
    }
}

/// Whether Daytona applied exactly the lock-down sent: anything but the gateway would be
/// open (or, blocked, unusable), and such a sandbox is not used.
fn locked_down(started: &SandboxDto, expected: &str) -> Result<(), String> {
    if same_allow_list(started.network_allow_list.as_deref(), expected)
        && started.network_block_all != Some(true)
    {
        return Ok(());
    }
    Err(format!(
        "the Daytona sandbox {} does not carry the egress lock-down \
         (networkBlockAll {:?}, networkAllowList {:?}, expected {expected:?})",
        started.id, started.network_block_all, started.network_allow_list
    ))
}

fn same_allow_list(answered: Option<&str>, expected: &str) -> bool {
    let norm = |s: &str| {
        let mut v: Vec<String> = s
            .split(',')
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        v.sort();
        v
    };
    answered.is_some_and(|a| norm(a) == norm(expected))
}

fn is_http_url(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("http://")
}

fn is_gone(state: Option<&str>) -> bool {
    matches!(state, Some("destroyed" | "destroying"))
}

fn not_found(id: &str) -> OpError {
    OpError::new(OpErrorKind::NotFound, format!("no Daytona sandbox {id}"))
}

/// Daytona's messages that say more than their status: capacity and quota refusals come as
/// 400s ("No available runners", "Total CPU limit exceeded ..."), a suspended organization
/// and an unavailable region as 403s, an unknown snapshot as a 400.
fn classify_message(said: &str) -> Option<ErrorClass> {
    let said = said.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| said.contains(n));
    if has(&[
        "no available runner",
        "at capacity",
        "insufficient capacity",
        "out of capacity",
        "capacity unavailable",
    ]) {
        Some(ErrorClass::Capacity)
    } else if has(&["limit exceeded", "exceeds maximum allowed", "quota"]) {
        Some(ErrorClass::Quota)
    } else if has(&["organization is suspended"]) {
        Some(ErrorClass::Billing)
    } else if has(&["region not found"])
        || said.contains("region") && has(&["not available", "not found"])
    {
        Some(ErrorClass::RegionUnavailable)
    } else if said.contains("snapshot") && has(&["not found", "not available in region"]) {
        // The pool names a snapshot its account does not have.
        Some(ErrorClass::Unsupported)
    } else {
        None
    }
}

/// The class of a sandbox that reached `error` / `build_failed`, from its `errorReason`.
fn reason_class(reason: &str) -> ErrorClass {
    match classify_message(reason) {
        Some(
            class @ (ErrorClass::Capacity | ErrorClass::Quota | ErrorClass::RegionUnavailable),
        ) => class,
        _ => ErrorClass::FailedBeforeRunning,
    }
}

/// Daytona's answers, as the coordinator's error classes.
///
/// | answer | class |
/// | --- | --- |
/// | no connection made | `outage` |
/// | sent, then timed out or the connection dropped | `unknown` (reconcile by tag) |
/// | 429 | `rate_limit` (`Retry-After` honoured) |
/// | message "No available runners" / capacity | `capacity` |
/// | message "... limit exceeded" / "exceeds maximum allowed" / quota | `quota` |
/// | message "Organization is suspended" | `billing` |
/// | message "Region ... not available" / "Region not found" | `region_unavailable` |
/// | message "Snapshot ... not found" | `unsupported` |
/// | 400, 422 | `invalid_request` |
/// | 401, 403 | `unbound_account` (another account may still serve) |
/// | 404 | `unsupported` |
/// | 408, 504 | `unknown` |
/// | 409 | `provider_error` (retried) |
/// | 502, 503 | `outage` |
/// | other 5xx | `provider_error` (retried) |
pub static ERRORS: ErrorTable = ErrorTable {
    code: super::errors::no_code,
    codes: &[],
    no_instance: &[],
    message: Some(message_class),
    statuses: &[
        (429, ErrorClass::RateLimit),
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        // sandgate's key for this account is refused: another account may still serve (the
        // caller's own authority was checked before any provider was called).
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (404, ErrorClass::Unsupported),
        (408, ErrorClass::Unknown),
        (504, ErrorClass::Unknown),
        (409, ErrorClass::ProviderError),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
        (403, OpErrorKind::Invalid),
        (422, OpErrorKind::Invalid),
        (409, OpErrorKind::Conflict),
    ],
    describe: own_message,
};

/// The class Daytona's message names (its `message`, else `error`); a 429 is a rate limit
/// whatever it says.
fn message_class(failure: &HttpFailure) -> Option<ErrorClass> {
    if failure.status == Some(StatusCode::TOO_MANY_REQUESTS) {
        return None;
    }
    let said = failure
        .field("message")
        .or_else(|| failure.field("error"))
        .unwrap_or_default();
    classify_message(said)
}

/// [`ERRORS`] applied to one failure.
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    ERRORS.classify(failure)
}

fn provider_error(failure: HttpFailure) -> ProviderError {
    ERRORS.provider_error(failure)
}

/// A failed toolbox or lifecycle call, with the toolbox's own `errors` when it gave them.
fn op_error(failure: HttpFailure) -> OpError {
    let kind = ERRORS.op_kind(&failure);
    // The toolbox's bulk upload answers `{"errors": [...]}`.
    let detail = failure
        .body
        .as_ref()
        .and_then(|b| b.get("errors"))
        .and_then(Value::as_array)
        .map(|errors| {
            errors
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|d| !d.is_empty());
    let message = match detail {
        Some(detail) => format!("{}: {detail}", failure.message),
        None => failure.message,
    };
    OpError::new(kind, message)
}
