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
//! - Failures are classified by one table ([`classify`]).

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use reqwest::{Method, RequestBuilder};
use sandgate_router::{Resources, Source};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

use super::http::{path_segment, Auth, HttpFailure, ProviderHttp};
use super::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason, Lifecycle, SandboxEntry};
use super::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, Provider,
    ProviderError, RemoteEgress, RuntimeCapabilities, SnapshotInfo, Tags,
};
use crate::credentials::Secret;

/// Where sandgate's CA goes inside a Daytona sandbox (the default user `daytona`'s home).
pub const CA_PATH: &str = "/home/daytona/.sandgate/ca.pem";
const DEFAULT_BASE_URL: &str = "https://app.daytona.io/api";
const TAG_SANDBOX: &str = "sandgate_sandbox";
const TAG_ATTEMPT: &str = "sandgate_attempt";
const ORG_HEADER: &str = "X-Daytona-Organization-ID";
/// The longest command sandgate's API accepts; sent when an exec names no timeout, since
/// newer daemons otherwise apply a short default of their own.
const MAX_EXEC_SECS: u64 = 24 * 3600;
/// How long a delete keeps retrying a 409 (a state change in progress).
const DELETE_CONFLICT_WINDOW: Duration = Duration::from_secs(30);

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
    pub api_key: Secret,
}

const OPTIONS: [&str; 5] = [
    "organization_id",
    "snapshot",
    "target",
    "auto_stop_minutes",
    "create_timeout_secs",
];

impl DaytonaAccount {
    /// Options: `organization_id`, `snapshot`, `target`, `auto_stop_minutes`,
    /// `create_timeout_secs` (default 180). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<DaytonaAccount, (String, String)> {
        for (key, value) in options {
            if !OPTIONS.contains(&key.as_str()) {
                return Err((
                    format!("options.{key}"),
                    format!(
                        "unknown option for a daytona account ({})",
                        OPTIONS.join(", ")
                    ),
                ));
            }
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
        let create_timeout_secs = match options.get("create_timeout_secs") {
            Some(v) => v.trim().parse::<u64>().ok().filter(|v| *v > 0).ok_or((
                "options.create_timeout_secs".to_string(),
                "must be a positive number of seconds".to_string(),
            ))?,
            None => 180,
        };
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
        // A create may block for up to 30 s at Daytona before it answers.
        let http = ProviderHttp::new(
            "daytona",
            &account.base_url,
            Auth::Bearer,
            account.api_key,
            tls,
            Duration::from_secs(60),
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
        let mut env = spec.env.clone();
        let mut body = json!({
            "labels": {TAG_SANDBOX: spec.tags.sandbox_id, TAG_ATTEMPT: spec.tags.attempt_id},
        });
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
        if let Some(egress) = &spec.egress {
            env.extend(egress.env(CA_PATH));
            // An advisory pool gets the proxy variables and the CA only.
            if egress.lock_down {
                let cidr = gateway_cidr(&egress.gateway_host)?;
                body["networkBlockAll"] = json!(false);
                body["networkAllowList"] = json!(cidr);
            }
        }
        body["env"] = json!(env);
        Ok(body)
    }

    /// `GET /sandbox/{id}`; `None` when Daytona does not know it.
    async fn detail(&self, id: &str) -> Result<Option<SandboxDto>, HttpFailure> {
        let path = format!("/sandbox/{}", path_segment(id));
        match self
            .http
            .send_idempotent(|| self.api(Method::GET, &path))
            .await
        {
            Ok(response) => {
                let dto: SandboxDto = self.http.json(response).await?;
                self.remember_toolbox(&dto);
                Ok(Some(dto))
            }
            Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(f) => Err(f),
        }
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
        mut dto: SandboxDto,
        targets: &[&str],
        deadline: Instant,
    ) -> Result<SandboxDto, WaitError> {
        let mut pause = Duration::from_millis(200);
        loop {
            let state = dto.state.clone().unwrap_or_default();
            if targets.contains(&state.as_str()) {
                return Ok(dto);
            }
            if matches!(state.as_str(), "error" | "build_failed") {
                return Err(WaitError::Failed(
                    state,
                    dto.error_reason.unwrap_or_default(),
                ));
            }
            if matches!(state.as_str(), "destroyed" | "destroying") {
                return Err(WaitError::Gone);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::Timeout(state));
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 3 / 2).min(Duration::from_secs(2));
            dto = match self.detail(id).await {
                Ok(Some(dto)) => dto,
                Ok(None) => return Err(WaitError::Gone),
                Err(f) => return Err(WaitError::Http(f)),
            };
        }
    }

    async fn create_instance(&self, spec: CreateSpec) -> Result<Instance, ProviderError> {
        let deadline = Instant::now() + self.create_timeout;
        let body = self.create_body(&spec)?;
        let request = self.api(Method::POST, "/sandbox").json(&body);
        let response = self.http.send(request).await.map_err(create_error)?;
        let created: SandboxDto = self.http.json(response).await.map_err(|f| {
            // Daytona said yes but we cannot read which sandbox: reconcile by tag.
            let mut e = provider_error(f);
            e.class = ErrorClass::Unknown;
            e
        })?;
        let id = created.id.clone();
        self.remember_toolbox(&created);
        self.requested
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), spec.request.resources.clone());
        let left_behind = |class: ErrorClass, message: String| ProviderError {
            class,
            message,
            instance_id: Some(id.clone()),
            retry_after: None,
            maybe_created: false,
        };
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
            // Anything but exactly the gateway would be open (or, blocked, unusable).
            if egress.lock_down
                && (!same_allow_list(started.network_allow_list.as_deref(), expected)
                    || started.network_block_all == Some(true))
            {
                return Err(left_behind(
                    ErrorClass::FailedBeforeRunning,
                    format!(
                        "the Daytona sandbox {id} does not carry the egress lock-down \
                         (networkBlockAll {:?}, networkAllowList {:?}, expected {expected:?})",
                        started.network_block_all, started.network_allow_list
                    ),
                ));
            }
            if let Err(e) = self
                .put_file(&id, CA_PATH, egress.ca_pem.clone().into_bytes())
                .await
            {
                return Err(left_behind(
                    ErrorClass::FailedBeforeRunning,
                    format!("the sandbox's CA could not be installed: {e}"),
                ));
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

    /// `process/execute` in the background: one stdout event with the whole output, then
    /// the exit.
    async fn start_exec(&self, id: &str, spec: ExecSpec) -> Result<ExecStream, OpError> {
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        }
        let base = self.toolbox_base(id).await?;
        let url = format!("{base}/process/execute");
        let marker = format!("/tmp/.sandgate-exec-{}", crate::base::ids::random_hex(8));
        let command = format!(
            "{{ echo $$ > {marker}; }} 2>/dev/null; trap 'rm -f {marker}' EXIT\n{}\n",
            quote_argv(&spec.argv)
        );
        let timeout_secs = spec
            .timeout
            .map(|t| t.as_secs_f64().ceil().max(1.0) as u64)
            .unwrap_or(MAX_EXEC_SECS);
        let mut body = json!({"command": command, "envs": spec.env, "timeout": timeout_secs});
        if let Some(cwd) = &spec.cwd {
            body["cwd"] = json!(cwd);
        }
        let request = self
            .with_org(self.http.request_url(Method::POST, &url))
            .timeout(Duration::from_secs(timeout_secs) + Duration::from_secs(30))
            .json(&body);
        let kill = {
            let script = format!(
                "for i in 1 2 3 4 5 6 7 8 9 10; do [ -s {marker} ] && break; sleep 0.2; done; \
                 kill -KILL -\"$(cat {marker})\" 2>/dev/null; rm -f {marker}"
            );
            let kill_request = self
                .with_org(self.http.request_url(Method::POST, &url))
                .timeout(Duration::from_secs(30))
                .json(&json!({"command": script, "timeout": 10}));
            let http = self.http.clone();
            let id = id.to_string();
            move || async move {
                if let Err(e) = http.send(kill_request).await {
                    tracing::warn!(sandbox_instance = %id, error = %e.message, "daytona: killing a cancelled command failed");
                }
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let cancelled = Arc::new(Notify::new());
        let notify = cancelled.clone();
        let http = self.http.clone();
        tokio::spawn(async move {
            tokio::select! {
                result = http.send(request) => {
                    let events = match result {
                        Ok(response) => match http.json::<ExecuteAnswer>(response).await {
                            Ok(answer) => exec_events(answer),
                            Err(f) => failed_exec(&f.message),
                        },
                        Err(f) if f.status == Some(StatusCode::REQUEST_TIMEOUT) => vec![ExecEvent::Exit(ExitInfo {
                            code: None,
                            signal: Some(9),
                            reason: ExitReason::TimedOut,
                        })],
                        Err(f) => failed_exec(&f.message),
                    };
                    for event in events {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                _ = notify.notified() => {
                    kill().await;
                    let _ = tx.send(ExecEvent::Exit(ExitInfo {
                        code: None,
                        signal: Some(9),
                        reason: ExitReason::Cancelled,
                    })).await;
                }
                _ = tx.closed() => kill().await,
            }
        });
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
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

fn exec_events(answer: ExecuteAnswer) -> Vec<ExecEvent> {
    let mut events = Vec::new();
    let output = answer.result.unwrap_or_default();
    if !output.is_empty() {
        events.push(ExecEvent::Stdout(Bytes::from(output)));
    }
    // The daemon answers -1 when the command could not start or was killed by a signal.
    let code = answer.exit_code.or(answer.code).filter(|c| *c >= 0);
    events.push(ExecEvent::Exit(ExitInfo {
        code: code.map(|c| c as i32),
        signal: None,
        reason: ExitReason::Exited,
    }));
    events
}

fn failed_exec(message: &str) -> Vec<ExecEvent> {
    vec![
        ExecEvent::Stderr(Bytes::from(format!("sandgate: {message}\n"))),
        ExecEvent::Exit(ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        }),
    ]
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
    match host.trim().parse::<Ipv4Addr>() {
        Ok(ip) => Ok(format!("{ip}/32")),
        Err(_) => Err(ProviderError::new(
            ErrorClass::Unsupported,
            format!(
                "daytona: the gateway's public host {host:?} is not an IPv4 address, and Daytona's \
                 network allow list takes IPv4 CIDRs only, so the sandbox cannot be locked to the \
                 gateway; set [proxy] public_url to an IPv4 address to use Daytona pools"
            ),
        )),
    }
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

/// Quotes each argument for a POSIX shell (single quotes; `'` as `'\''`) and joins them.
pub fn quote_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(arg: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !arg.is_empty() && arg.chars().all(safe) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxDto {
    id: String,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    error_reason: Option<String>,
    #[serde(default)]
    toolbox_proxy_url: Option<String>,
    #[serde(default)]
    network_block_all: Option<bool>,
    #[serde(default)]
    network_allow_list: Option<String>,
    #[serde(default)]
    cpu: Option<f64>,
    /// GiB.
    #[serde(default)]
    memory: Option<f64>,
    /// GiB.
    #[serde(default)]
    disk: Option<f64>,
    #[serde(default)]
    gpu: Option<f64>,
    #[serde(default)]
    sandbox_class: Option<String>,
}

impl SandboxDto {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn instance(&self) -> Instance {
        let state = match self.state.as_deref().unwrap_or("") {
            "error" | "build_failed" => InstanceState::Failed,
            "creating" | "restoring" | "starting" | "pending_build" | "building_snapshot"
            | "pulling_snapshot" | "unknown" | "" => InstanceState::Starting,
            // Started, stopped, paused, archived, ...: the sandbox exists and holds capacity.
            _ => InstanceState::Running,
        };
        Instance {
            id: self.id.clone(),
            tags: Tags {
                sandbox_id: self.label(TAG_SANDBOX).unwrap_or_default().to_string(),
                attempt_id: self.label(TAG_ATTEMPT).unwrap_or_default().to_string(),
            },
            state,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListAnswer {
    #[serde(rename_all = "camelCase")]
    Page {
        items: Vec<SandboxDto>,
        #[serde(default)]
        next_cursor: Option<String>,
    },
    Bare(Vec<SandboxDto>),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecuteAnswer {
    #[serde(default)]
    exit_code: Option<i64>,
    /// Some daemons name it `code`.
    #[serde(default)]
    code: Option<i64>,
    #[serde(default)]
    result: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileInfoDto {
    name: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    is_dir: bool,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    permissions: String,
    #[serde(default)]
    modified_at: Option<String>,
}

impl From<FileInfoDto> for SandboxEntry {
    fn from(f: FileInfoDto) -> SandboxEntry {
        // `mode` is Go's FileMode string (`drwxr-xr-x`, `Lrwxrwxrwx`, `-rw-r--r--`).
        let kind = if f.is_dir {
            "dir"
        } else {
            match f.mode.chars().next() {
                Some('L') => "symlink",
                Some('-') | None => "file",
                _ => "other",
            }
        };
        SandboxEntry {
            name: f.name,
            kind,
            size: f.size,
            mode: u32::from_str_radix(f.permissions.trim(), 8).unwrap_or(0) & 0o7777,
            modified_unix: f.modified_at.as_deref().and_then(rfc3339_unix).unwrap_or(0),
        }
    }
}

/// Seconds since the epoch of an RFC 3339 timestamp (`2026-06-25T13:16:13.5+02:00`).
fn rfc3339_unix(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time_end = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(time_end);
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let min: i64 = t.next()?.parse().ok()?;
    let sec: i64 = t.next().map_or(Some(0.0), |s| s.parse::<f64>().ok())? as i64;
    let offset = match zone.chars().next() {
        None | Some('Z' | 'z') => 0,
        Some(sign) => {
            let (oh, om) = zone[1..].split_once(':').unwrap_or((&zone[1..], "0"));
            let secs = oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60;
            if sign == '-' {
                -secs
            } else {
                secs
            }
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec - offset)
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
/// | 401, 403 | `authority` |
/// | 404 | `unsupported` |
/// | 408, 504 | `unknown` |
/// | 409 | `provider_error` (retried) |
/// | 502, 503 | `outage` |
/// | other 5xx | `provider_error` (retried) |
pub fn classify(failure: &HttpFailure) -> ErrorClass {
    let Some(status) = failure.status else {
        // Never reached Daytona: nothing was created. Reached it and timed out: unknown.
        return if failure.sent {
            ErrorClass::Unknown
        } else {
            ErrorClass::Outage
        };
    };
    if status == StatusCode::TOO_MANY_REQUESTS {
        return ErrorClass::RateLimit;
    }
    let said = failure
        .field("message")
        .or_else(|| failure.field("error"))
        .unwrap_or_default();
    if let Some(class) = classify_message(said) {
        return class;
    }
    match status.as_u16() {
        400 | 422 => ErrorClass::InvalidRequest,
        // sandgate's key for this account is refused: another account may still serve (the
        // caller's own authority was checked before any provider was called).
        401 | 403 => ErrorClass::UnboundAccount,
        404 => ErrorClass::Unsupported,
        408 | 504 => ErrorClass::Unknown,
        409 => ErrorClass::ProviderError,
        502 | 503 => ErrorClass::Outage,
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
        Some(400) | Some(403) | Some(422) => OpErrorKind::Invalid,
        Some(409) => OpErrorKind::Conflict,
        _ => OpErrorKind::Provider,
    };
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

impl Provider for Daytona {
    fn kind(&self) -> &'static str {
        "daytona"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(self.create_instance(spec))
    }

    fn lockdown(&self, egress: &RemoteEgress) -> Option<Value> {
        lockdown(egress)
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let build = || self.api(Method::GET, "/sandbox").query(&[("limit", "1")]);
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed sandboxes at {}", self.http.base_url()))
        })
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            let detail = self.detail(instance_id).await.map_err(provider_error)?;
            Ok(detail
                .filter(|d| !is_gone(d.state.as_deref()))
                .map(|d| d.instance()))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let mut wanted = BTreeMap::from([(TAG_SANDBOX, sandbox_id)]);
            if let Some(attempt) = attempt_id {
                wanted.insert(TAG_ATTEMPT, attempt);
            }
            let labels = serde_json::to_string(&wanted).unwrap_or_default();
            let mut out = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..100 {
                let (page, next) = self
                    .list_page(&labels, cursor.as_deref())
                    .await
                    .map_err(provider_error)?;
                out.extend(
                    page.iter()
                        .filter(|s| !is_gone(s.state.as_deref()))
                        .filter(|s| wanted.iter().all(|(k, v)| s.label(k) == Some(v)))
                        .map(SandboxDto::instance),
                );
                match next {
                    Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                    _ => break,
                }
            }
            Ok(out)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/sandbox/{}", path_segment(instance_id));
            let started = Instant::now();
            let mut pause = Duration::from_millis(250);
            let result = loop {
                match self
                    .http
                    .send_idempotent(|| self.api(Method::DELETE, &path))
                    .await
                {
                    Ok(_) => break Ok(()),
                    Err(f) if f.status == Some(StatusCode::NOT_FOUND) => break Ok(()),
                    // A state change is in progress (creating, stopping, ...): wait for it.
                    Err(f)
                        if f.status == Some(StatusCode::CONFLICT)
                            && started.elapsed() + pause < DELETE_CONFLICT_WINDOW =>
                    {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                    Err(f) => break Err(provider_error(f)),
                }
            };
            if result.is_ok() {
                self.toolbox
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(instance_id);
                self.requested
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(instance_id);
            }
            result
        })
    }

    fn capabilities<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async move {
            let dto = self
                .detail(instance_id)
                .await
                .map_err(provider_error)?
                .ok_or_else(|| {
                    ProviderError::new(
                        ErrorClass::FailedBeforeRunning,
                        format!("daytona does not know sandbox {instance_id}"),
                    )
                })?;
            if dto.state.as_deref() != Some("started") {
                return Err(ProviderError::new(
                    ErrorClass::FailedBeforeRunning,
                    format!(
                        "the Daytona sandbox {instance_id} is {}, not started",
                        dto.state.as_deref().unwrap_or("in no state")
                    ),
                ));
            }
            let requested = self
                .requested
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(instance_id)
                .cloned();
            if let Some(requested) = requested {
                let short = resource_shortfall(&requested, &dto);
                if !short.is_empty() {
                    return Err(ProviderError::new(
                        ErrorClass::RuntimeShortfall,
                        format!(
                            "the Daytona sandbox {instance_id} has less than requested: {}",
                            short.join(", ")
                        ),
                    ));
                }
            }
            // What this adapter does with Daytona: buffered commands (merged output) it can
            // kill, files through the toolbox, pause and resume on VM classes only.
            let pausable = matches!(dto.sandbox_class.as_deref(), Some("linux-vm" | "windows"));
            Ok(RuntimeCapabilities {
                process_execute: true,
                process_cancel: true,
                filesystem_read: true,
                filesystem_write: true,
                filesystem_list: true,
                filesystem_delete: true,
                filesystem_mkdir: true,
                pause_resume: pausable,
                ..RuntimeCapabilities::NONE
            })
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(self.start_exec(instance_id, spec))
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::GET, "/files/download")
                .await?
                .query(&[("path", path)]);
            let response = self.http.send(request).await.map_err(op_error)?;
            let bytes = response.bytes().await.map_err(|e| {
                OpError::new(
                    OpErrorKind::Provider,
                    format!("daytona: reading {path}: {e}"),
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
        Box::pin(self.put_file(instance_id, path, data))
    }

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::GET, "/files")
                .await?
                .query(&[("path", path)]);
            let response = self.http.send(request).await.map_err(op_error)?;
            let entries: Vec<FileInfoDto> = self.http.json(response).await.map_err(op_error)?;
            Ok(entries.into_iter().map(SandboxEntry::from).collect())
        })
    }

    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let request = self
                .toolbox(instance_id, Method::DELETE, "/files")
                .await?
                .query(&[
                    ("path", path),
                    ("recursive", if recursive { "true" } else { "false" }),
                ]);
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            if !parents {
                // Daytona's folder call always creates the parents: check them first.
                if self.file_exists(instance_id, path).await? {
                    return Err(OpError::new(
                        OpErrorKind::Conflict,
                        format!("{path} already exists"),
                    ));
                }
                let trimmed = path.trim_end_matches('/');
                if let Some((parent, _)) = trimmed.rsplit_once('/') {
                    if !parent.is_empty() && !self.file_exists(instance_id, parent).await? {
                        return Err(OpError::new(
                            OpErrorKind::NotFound,
                            format!("the parent directory of {path} does not exist"),
                        ));
                    }
                }
            }
            let request = self
                .toolbox(instance_id, Method::POST, "/files/folder")
                .await?
                .query(&[("path", path), ("mode", "755")]);
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn lifecycle<'a>(
        &'a self,
        instance_id: &'a str,
        operation: Lifecycle,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(self.transition(instance_id, operation))
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let name = format!("sandgate-{}", crate::base::ids::random_hex(8));
            let path = format!("/sandbox/{}/snapshot", path_segment(instance_id));
            let request = self.api(Method::POST, &path).json(&json!({"name": name}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let dto: SandboxDto = self.http.json(response).await.map_err(op_error)?;
            let deadline = Instant::now() + self.create_timeout;
            // The sandbox returns to its previous state once its filesystem is captured.
            let settled = [
                "started",
                "stopped",
                "paused",
                "archived",
                "error",
                "build_failed",
            ];
            self.wait_for(instance_id, dto, &settled[..4], deadline)
                .await
                .map_err(|e| e.into_op_error(instance_id, "snapshot"))?;
            let snapshot_path = format!("/snapshots/{}", path_segment(&name));
            let mut pause = Duration::from_millis(200);
            loop {
                let response = self
                    .http
                    .send_idempotent(|| self.api(Method::GET, &snapshot_path))
                    .await
                    .map_err(op_error)?;
                let snapshot: SnapshotDto = self.http.json(response).await.map_err(op_error)?;
                match snapshot.state.as_deref() {
                    Some("active") => {
                        return Ok(SnapshotInfo {
                            id: name,
                            size_bytes: snapshot
                                .size
                                .map_or(0, |gb| (gb * 1024.0 * 1024.0 * 1024.0) as u64),
                        })
                    }
                    Some(state @ ("error" | "build_failed")) => {
                        return Err(OpError::new(
                            OpErrorKind::Provider,
                            format!(
                                "daytona: snapshot {name} is {state}: {}",
                                snapshot.error_reason.unwrap_or_default()
                            ),
                        ))
                    }
                    _ if Instant::now() >= deadline => {
                        return Err(OpError::new(
                            OpErrorKind::Provider,
                            format!("daytona: snapshot {name} did not become active in time"),
                        ))
                    }
                    _ => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 3 / 2).min(Duration::from_secs(2));
                    }
                }
            }
        })
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            // The snapshot is named by its name; Daytona deletes by its own id.
            let path = format!("/snapshots/{}", path_segment(snapshot_id));
            let snapshot: SnapshotDto = match self
                .http
                .send_idempotent(|| self.api(Method::GET, &path))
                .await
            {
                Ok(response) => self.http.json(response).await.map_err(op_error)?,
                Err(f) if f.status == Some(StatusCode::NOT_FOUND) => return Ok(()),
                Err(f) => return Err(op_error(f)),
            };
            let path = format!("/snapshots/{}", path_segment(&snapshot.id));
            match self
                .http
                .send_idempotent(|| self.api(Method::DELETE, &path))
                .await
            {
                Ok(_) => Ok(()),
                Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(()),
                Err(f) => Err(op_error(f)),
            }
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotDto {
    id: String,
    #[serde(default)]
    state: Option<String>,
    /// GB.
    #[serde(default)]
    size: Option<f64>,
    #[serde(default)]
    error_reason: Option<String>,
}

/// What Daytona provisioned below what the create asked for (Daytona reports GiB).
fn resource_shortfall(requested: &Resources, dto: &SandboxDto) -> Vec<String> {
    let mut short = Vec::new();
    if let (Some(want), Some(has)) = (requested.cpu, dto.cpu) {
        if has + 1e-9 < want {
            short.push(format!("cpu {has} < {want}"));
        }
    }
    if let (Some(want), Some(has)) = (requested.memory_mb, dto.memory) {
        if has * 1024.0 + 1e-6 < want as f64 {
            short.push(format!("memory {} MiB < {want} MiB", (has * 1024.0) as u64));
        }
    }
    if let (Some(want), Some(has)) = (requested.disk_gb, dto.disk) {
        if has + 1e-9 < want as f64 {
            short.push(format!("disk {has} GB < {want} GB"));
        }
    }
    if let (Some(want), Some(has)) = (requested.gpu, dto.gpu) {
        if has + 1e-9 < f64::from(want) {
            short.push(format!("gpu {has} < {want}"));
        }
    }
    short
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
            timed_out: false,
            message: String::new(),
        }
    }

    /// Daytona's error body: `{path, timestamp, statusCode, error, message}`.
    fn said(status: u16, message: &str) -> Value {
        json!({"statusCode": status, "error": "x", "message": message, "path": "/api/sandbox"})
    }

    #[test]
    fn the_failure_table() {
        let cases = [
            (
                Some(400),
                said(400, "No available runners"),
                ErrorClass::Capacity,
            ),
            (
                Some(503),
                said(503, "Region is at capacity"),
                ErrorClass::Capacity,
            ),
            (
                Some(400),
                said(
                    400,
                    "Total CPU limit exceeded. Maximum allowed: 10.\nUpgrade your tier",
                ),
                ErrorClass::Quota,
            ),
            (
                Some(400),
                said(
                    400,
                    "CPU request 8 exceeds maximum allowed per sandbox (4).",
                ),
                ErrorClass::Quota,
            ),
            (
                Some(403),
                said(403, "Organization is suspended: unpaid"),
                ErrorClass::Billing,
            ),
            (
                Some(403),
                said(
                    403,
                    "Region eu is not available to the organization for class container",
                ),
                ErrorClass::RegionUnavailable,
            ),
            (
                Some(404),
                said(404, "Region not found"),
                ErrorClass::RegionUnavailable,
            ),
            (
                Some(400),
                said(
                    400,
                    "Snapshot py-3.12 not found. Did you add it through the Daytona Dashboard?",
                ),
                ErrorClass::Unsupported,
            ),
            (
                Some(400),
                said(400, "Invalid IP address: \"x\""),
                ErrorClass::InvalidRequest,
            ),
            (
                Some(422),
                said(422, "Forking is not supported"),
                ErrorClass::InvalidRequest,
            ),
            (
                Some(401),
                said(401, "Unauthorized"),
                ErrorClass::UnboundAccount,
            ),
            (
                Some(403),
                said(403, "Forbidden resource"),
                ErrorClass::UnboundAccount,
            ),
            (
                Some(404),
                said(404, "Sandbox with ID or name x not found"),
                ErrorClass::Unsupported,
            ),
            (Some(408), json!({}), ErrorClass::Unknown),
            (
                Some(409),
                said(409, "Sandbox state change in progress"),
                ErrorClass::ProviderError,
            ),
            (
                Some(429),
                said(429, "ThrottlerException: Too Many Requests"),
                ErrorClass::RateLimit,
            ),
            // 429 wins over a message that reads like a quota.
            (
                Some(429),
                said(429, "Rate limit exceeded"),
                ErrorClass::RateLimit,
            ),
            (
                Some(500),
                said(500, "An unexpected error occurred."),
                ErrorClass::ProviderError,
            ),
            (Some(502), json!({}), ErrorClass::Outage),
            (
                Some(503),
                said(503, "Service Unavailable"),
                ErrorClass::Outage,
            ),
            (Some(504), json!({}), ErrorClass::Unknown),
        ];
        for (status, body, class) in cases {
            assert_eq!(
                classify(&failure(status, body.clone(), true)),
                class,
                "{status:?} {body}"
            );
        }
        // Never sent: nothing exists. Sent and then lost: reconcile.
        assert_eq!(
            classify(&failure(None, json!(null), false)),
            ErrorClass::Outage
        );
        assert_eq!(
            classify(&failure(None, json!(null), true)),
            ErrorClass::Unknown
        );
        let mut timed_out = failure(None, json!(null), true);
        timed_out.timed_out = true;
        assert_eq!(classify(&timed_out), ErrorClass::Unknown);
        // Classes and what the coordinator does with them.
        assert!(ErrorClass::RateLimit.retryable());
        assert_eq!(
            ErrorClass::UnboundAccount.outcome(),
            crate::providers::Outcome::Advance
        );
        assert_eq!(
            ErrorClass::InvalidRequest.outcome(),
            crate::providers::Outcome::Terminal
        );
        assert_eq!(
            ErrorClass::Unknown.outcome(),
            crate::providers::Outcome::Unknown
        );
    }

    #[test]
    fn retry_after_travels_with_the_error() {
        let mut f = failure(Some(429), said(429, "Too Many Requests"), true);
        f.retry_after = Some(Duration::from_secs(7));
        let e = provider_error(f);
        assert_eq!(e.class, ErrorClass::RateLimit);
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn error_reasons_keep_capacity_and_quota() {
        assert_eq!(reason_class("No available runners"), ErrorClass::Capacity);
        assert_eq!(reason_class("Total disk limit exceeded"), ErrorClass::Quota);
        assert_eq!(
            reason_class("Failed to pull image"),
            ErrorClass::FailedBeforeRunning
        );
        assert_eq!(reason_class(""), ErrorClass::FailedBeforeRunning);
        // An errorReason never ends the whole create.
        assert_eq!(
            reason_class("Unauthorized"),
            ErrorClass::FailedBeforeRunning
        );
    }

    #[test]
    fn quoting_for_a_posix_shell() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(quote_argv(&argv(&["echo", "hello"])), "echo hello");
        assert_eq!(quote_argv(&argv(&["echo", ""])), "echo ''");
        assert_eq!(quote_argv(&argv(&["echo", "a b"])), "echo 'a b'");
        assert_eq!(quote_argv(&argv(&["echo", "it's"])), r"echo 'it'\''s'");
        assert_eq!(
            quote_argv(&argv(&["sh", "-c", "echo $HOME; `id` | cat > /x & *"])),
            "sh -c 'echo $HOME; `id` | cat > /x & *'"
        );
        assert_eq!(
            quote_argv(&argv(&["a\nb", "--k=v", "/p/x.y"])),
            "'a\nb' --k=v /p/x.y"
        );
        // A real shell reads back exactly the arguments.
        let hostile = [
            "'", "''", "a'b'c", "$(id)", "\\", "\"", "x\ny", " ", "!", "#", "~", "-",
        ];
        let script = format!("printf '%s\\0' {}", quote_argv(&argv(&hostile)));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let got: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8(p.to_vec()).unwrap())
            .collect();
        assert_eq!(got, hostile);
    }

    #[test]
    fn the_lock_down_needs_an_ipv4_gateway() {
        assert_eq!(gateway_cidr("203.0.113.7").unwrap(), "203.0.113.7/32");
        for host in ["gateway.example.com", "2001:db8::1", "", "203.0.113.7:3128"] {
            let e = gateway_cidr(host).unwrap_err();
            assert_eq!(e.class, ErrorClass::Unsupported, "{host}");
            assert!(!e.class.retryable());
            assert!(e.message.contains("IPv4"), "{}", e.message);
        }
        let egress = |host: &str, lock_down: bool| RemoteEgress {
            proxy_url: format!("https://sb:tok@{host}:3128"),
            gateway_host: host.to_string(),
            gateway_port: 3128,
            ca_pem: String::new(),
            lock_down,
        };
        assert_eq!(
            lockdown(&egress("203.0.113.7", true)),
            Some(json!({"networkBlockAll": false, "networkAllowList": "203.0.113.7/32"}))
        );
        assert_eq!(lockdown(&egress("203.0.113.7", false)), None);
        assert_eq!(lockdown(&egress("gw.example.com", true)), None);
        assert!(same_allow_list(Some("203.0.113.7/32"), "203.0.113.7/32"));
        assert!(same_allow_list(Some(" 203.0.113.7/32 "), "203.0.113.7/32"));
        assert!(!same_allow_list(None, "203.0.113.7/32"));
        assert!(!same_allow_list(Some("0.0.0.0/0"), "203.0.113.7/32"));
        assert!(!same_allow_list(
            Some("203.0.113.7/32,0.0.0.0/0"),
            "203.0.113.7/32"
        ));
    }

    #[test]
    fn path_segments() {
        assert_eq!(path_segment("0f3e-4b2a_x.y~z"), "0f3e-4b2a_x.y~z");
        assert_eq!(path_segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
        assert_eq!(path_segment(".."), "%2E%2E");
    }

    #[test]
    fn options_are_checked() {
        let opts = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let a = DaytonaAccount::from_options(None, &opts(&[]), Secret::new("k")).unwrap();
        assert_eq!(a.base_url, "https://app.daytona.io/api");
        assert_eq!(a.create_timeout, Duration::from_secs(180));
        assert!(a.organization_id.is_none() && a.snapshot.is_none() && a.target.is_none());
        let a = DaytonaAccount::from_options(
            Some("http://127.0.0.1:9/api/"),
            &opts(&[
                ("organization_id", "org-1"),
                ("snapshot", "py"),
                ("target", "eu"),
                ("auto_stop_minutes", "0"),
                ("create_timeout_secs", "30"),
            ]),
            Secret::new("k"),
        )
        .unwrap();
        assert_eq!(a.base_url, "http://127.0.0.1:9/api");
        assert_eq!(a.organization_id.as_deref(), Some("org-1"));
        assert_eq!(a.auto_stop_minutes, Some(0));
        assert_eq!(a.create_timeout, Duration::from_secs(30));
        for (pairs, field) in [
            (opts(&[("region", "eu")]), "options.region"),
            (
                opts(&[("auto_stop_minutes", "-1")]),
                "options.auto_stop_minutes",
            ),
            (
                opts(&[("create_timeout_secs", "0")]),
                "options.create_timeout_secs",
            ),
            (opts(&[("target", " ")]), "options.target"),
        ] {
            let (got, _) =
                DaytonaAccount::from_options(None, &pairs, Secret::new("k")).unwrap_err();
            assert_eq!(got, field);
        }
        let (field, _) =
            DaytonaAccount::from_options(Some("ftp://x"), &opts(&[]), Secret::new("k"))
                .unwrap_err();
        assert_eq!(field, "base_url");
    }

    #[test]
    fn listings_old_and_new() {
        let page: ListAnswer = serde_json::from_value(json!({
            "items": [{"id": "a", "state": "started", "labels": {"sandgate_sandbox": "s"}}],
            "nextCursor": "c2",
        }))
        .unwrap();
        assert!(
            matches!(page, ListAnswer::Page { ref items, next_cursor: Some(ref c) } if items.len() == 1 && c == "c2")
        );
        let last: ListAnswer =
            serde_json::from_value(json!({"items": [], "nextCursor": null})).unwrap();
        assert!(matches!(
            last,
            ListAnswer::Page {
                next_cursor: None,
                ..
            }
        ));
        let bare: ListAnswer = serde_json::from_value(json!([{"id": "a"}, {"id": "b"}])).unwrap();
        assert!(matches!(bare, ListAnswer::Bare(ref v) if v.len() == 2));
        let dto: SandboxDto = serde_json::from_value(json!({
            "id": "a", "state": "stopped",
            "labels": {"sandgate_sandbox": "s", "sandgate_attempt": "s-a1"},
        }))
        .unwrap();
        let i = dto.instance();
        assert_eq!(
            (i.tags.sandbox_id.as_str(), i.tags.attempt_id.as_str()),
            ("s", "s-a1")
        );
        assert_eq!(i.state, InstanceState::Running);
        for (state, expected) in [
            ("creating", InstanceState::Starting),
            ("pulling_snapshot", InstanceState::Starting),
            ("started", InstanceState::Running),
            ("paused", InstanceState::Running),
            ("error", InstanceState::Failed),
            ("build_failed", InstanceState::Failed),
        ] {
            let dto: SandboxDto =
                serde_json::from_value(json!({"id": "a", "state": state})).unwrap();
            assert_eq!(dto.instance().state, expected, "{state}");
        }
    }

    #[test]
    fn file_entries_and_times() {
        let entry = SandboxEntry::from(FileInfoDto {
            name: "d".into(),
            size: 4096,
            is_dir: true,
            mode: "drwxr-xr-x".into(),
            permissions: "0755".into(),
            modified_at: Some("2026-06-25T13:16:13.123456789+02:00".into()),
        });
        assert_eq!((entry.kind, entry.mode), ("dir", 0o755));
        assert_eq!(entry.modified_unix, 1_782_386_173);
        assert_eq!(rfc3339_unix("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_unix("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(
            rfc3339_unix("2000-03-01T01:00:00-01:00"),
            Some(951_868_800 + 7200)
        );
        assert_eq!(rfc3339_unix("nonsense"), None);
    }

    #[test]
    fn provisioned_resources_are_compared() {
        let dto: SandboxDto =
            serde_json::from_value(json!({"id": "a", "cpu": 1, "memory": 1, "disk": 3})).unwrap();
        let want = Resources {
            cpu: Some(2.0),
            memory_mb: Some(2048),
            disk_gb: Some(3),
            ..Resources::default()
        };
        assert_eq!(resource_shortfall(&want, &dto).len(), 2);
        let fits = Resources {
            cpu: Some(1.0),
            memory_mb: Some(512),
            ..Resources::default()
        };
        assert!(resource_shortfall(&fits, &dto).is_empty());
    }
}
