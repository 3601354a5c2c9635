//! The E2B adapter: the REST control plane (`spec/openapi.yml` of `e2b-dev/E2B`) for
//! sandboxes, and envd, the in-sandbox daemon, for commands (Connect-RPC
//! `process.Process/Start`, JSON codec) and files (`GET|POST /files`).
//!
//! Contract:
//! - Every URL derives from the account: `base_url` (default `https://api.e2b.app`) for the
//!   control plane; envd at `options.sandbox_url` (default `https://sandbox.<domain>`,
//!   `options.domain` default `e2b.app`), addressed per sandbox by the `E2b-Sandbox-Id` and
//!   `E2b-Sandbox-Port` headers, as the official SDKs do. The API key goes in `X-API-Key`.
//! - A create is tagged in `metadata` (`sandgate_sandbox`, `sandgate_attempt`), so
//!   [`Provider::list_by_tag`] finds it through `GET /v2/sandboxes?metadata=...`.
//! - Egress: with [`RemoteEgress`] the sandbox is created with `network.denyOut =
//!   ["0.0.0.0/0"]` and `network.allowOut = [<gateway host>]`, so the gateway is the only
//!   destination E2B lets it reach; its `HTTP(S)_PROXY` name its own identity; sandgate's
//!   CA is written to [`CA_PATH`] through envd and named by the CA variables. The sandbox's
//!   `allow_domains` are *not* added to `allowOut`: E2B's allow list wins over its deny list,
//!   so listing a domain there would open a direct path around the gateway's per-request
//!   policy and credential injection.
//! - Failures are classified by one table ([`ERRORS`], applied by [`classify`]), documented
//!   in the README.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use sandgate_router::Source;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::account::{known_options, positive};
use super::errors::{own_message, CodeRule, ErrorTable};
use super::http::{absent_ok, path_segment, Auth, HttpFailure, ProviderHttp};
use super::lockdown::{ca_not_installed, create_env};
use super::tags::{self, tag_object, tags_of, TagFilter};
use crate::credentials::Secret;
use crate::e2b::connect::{self as connect_rpc, Decoder};
use crate::e2b::envd::{self, ProcessEvent};
use crate::e2b::wire::{CreatedSandbox, ListedSandbox, SandboxDetail};
use crate::ops::{ExecEvent, ExecSpec, ExecStream, ExitInfo, ExitReason, Lifecycle, SandboxEntry};
use crate::providers::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, Provider,
    ProviderError, RemoteEgress, RuntimeCapabilities, SnapshotInfo, LIFETIME_MARGIN,
};

/// What this adapter does with E2B: streamed commands it can kill, files read,
/// written, listed, removed and made through envd, pause and resume.
/// The whole of it: the most this adapter's pools may declare (`[providers.capabilities]`
/// narrows, never widens), and what `capabilities` answers for every sandbox.
pub const CAPABILITIES: RuntimeCapabilities = RuntimeCapabilities {
    process_execute: true,
    process_ordered_output: true,
    process_cancel: true,
    filesystem_read: true,
    filesystem_write: true,
    filesystem_list: true,
    filesystem_delete: true,
    filesystem_mkdir: true,
    pause_resume: true,
    ..RuntimeCapabilities::NONE
};

/// envd's port, named in `E2b-Sandbox-Port`.
const ENVD_PORT: &str = "49983";
/// How long a cancel waits for the command's pid before giving up on killing it.
const PID_WAIT: Duration = Duration::from_secs(10);
const _: () = assert!(envd::ENVD_PORT == 49983);
/// Where sandgate's CA goes inside an E2B sandbox (the default user's home).
pub const CA_PATH: &str = "/home/user/.sandgate/ca.pem";

/// An E2B account's settings (`[[accounts]]` with `options`).
#[derive(Debug, Clone)]
pub struct E2bAccount {
    pub base_url: String,
    pub sandbox_url: String,
    pub template: String,
    /// The sandbox's time to live at E2B, in seconds.
    pub timeout_secs: u64,
    pub api_key: Secret,
}

impl E2bAccount {
    /// Options: `domain`, `sandbox_url`, `template` (default `base`), `timeout_secs`
    /// (default 3600). Errors name the option.
    pub fn from_options(
        base_url: Option<&str>,
        options: &BTreeMap<String, String>,
        api_key: Secret,
    ) -> Result<E2bAccount, (String, String)> {
        let known = ["domain", "sandbox_url", "template", "timeout_secs"];
        known_options("an e2b", options, &known)?;
        let domain = options.get("domain").map_or("e2b.app", String::as_str);
        let timeout_secs = positive(options, "timeout_secs", "seconds")?.unwrap_or(3600);
        Ok(E2bAccount {
            base_url: base_url.unwrap_or("https://api.e2b.app").to_string(),
            sandbox_url: options
                .get("sandbox_url")
                .cloned()
                .unwrap_or_else(|| format!("https://sandbox.{domain}")),
            template: options
                .get("template")
                .cloned()
                .unwrap_or_else(|| "base".into()),
            timeout_secs,
            api_key,
        })
    }
}

/// E2B's longest sandbox timeout (its Pro tier); a longer lifetime is kept by refreshing.
const MAX_TIMEOUT_SECS: u64 = 24 * 3600;

pub struct E2b {
    http: ProviderHttp,
    sandbox_url: String,
    template: String,
    timeout_secs: u64,
    /// envd access tokens by sandbox id (also fetched again from `GET /sandboxes/{id}`).
    tokens: Mutex<HashMap<String, Secret>>,
}

impl E2b {
    pub fn new(account: E2bAccount, tls: rustls::ClientConfig) -> Result<E2b, String> {
        let http = ProviderHttp::new(
            "e2b",
            &account.base_url,
            Auth::Header("X-API-Key"),
            account.api_key,
            tls,
            Duration::from_secs(60),
        )?;
        Ok(E2b {
            http,
            sandbox_url: account.sandbox_url.trim_end_matches('/').to_string(),
            template: account.template,
            timeout_secs: account.timeout_secs,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    fn create_body(&self, spec: &CreateSpec) -> Value {
        let template = spec
            .snapshot
            .clone()
            .or_else(|| match &spec.request.source {
                Some(Source::Template(t) | Source::Environment(t)) => Some(t.clone()),
                _ => None,
            })
            .unwrap_or_else(|| self.template.clone());
        let mut body = json!({
            "templateID": template,
            "timeout": self.timeout_secs,
            "metadata": tag_object(&spec.tags),
        });
        if let Some(network) = spec.egress.as_ref().and_then(lockdown) {
            body["network"] = network;
        }
        body["envVars"] = json!(create_env(spec, CA_PATH));
        body
    }

    async fn token(&self, id: &str) -> Result<Option<Secret>, HttpFailure> {
        if let Some(token) = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Ok(Some(token.clone()));
        }
        let detail = self.detail(id).await?;
        let token = detail.and_then(|d| d.envd_access_token).map(Secret::new);
        if let Some(token) = &token {
            self.tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string(), token.clone());
        }
        Ok(token)
    }

    async fn detail(&self, id: &str) -> Result<Option<SandboxDetail>, HttpFailure> {
        let path = format!("/sandboxes/{}", path_segment(id));
        self.http
            .read_optional(|| self.http.request(Method::GET, &path))
            .await
    }

    /// A request to envd for sandbox `id`.
    async fn envd(
        &self,
        id: &str,
        method: Method,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, OpError> {
        let token =
            self.token(id).await.map_err(op_error)?.ok_or_else(|| {
                OpError::new(OpErrorKind::NotFound, format!("no E2B sandbox {id}"))
            })?;
        Ok(self
            .http
            .request_url(method, &format!("{}{path}", self.sandbox_url))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", ENVD_PORT)
            .header("X-Access-Token", token.expose()))
    }

    async fn install_ca(&self, id: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        self.put_file(id, CA_PATH, egress.ca_pem.clone().into_bytes())
            .await
    }

    async fn put_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), OpError> {
        let part = reqwest::multipart::Part::bytes(data).file_name(path.to_string());
        let form = reqwest::multipart::Form::new().part("file", part);
        let request = self
            .envd(id, Method::POST, "/files")
            .await?
            .query(&[("path", path)])
            .multipart(form);
        self.http.send(request).await.map_err(op_error)?;
        Ok(())
    }

    /// A unary Connect call to envd with the JSON codec (`filesystem.Filesystem/...`).
    async fn envd_unary(&self, id: &str, method: &str, body: Value) -> Result<Value, OpError> {
        let request = self
            .envd(id, Method::POST, &format!("/{method}"))
            .await?
            .header("Connect-Protocol-Version", "1")
            .json(&body);
        let response = self.http.send(request).await.map_err(op_error)?;
        self.http.json(response).await.map_err(op_error)
    }

    async fn list_page(
        &self,
        metadata: &str,
        next: Option<&str>,
    ) -> Result<(Vec<ListedSandbox>, Option<String>), HttpFailure> {
        let build = || {
            let mut query = vec![
                ("metadata", metadata.to_string()),
                ("state", "running,paused".to_string()),
                ("limit", "100".to_string()),
            ];
            if let Some(next) = next {
                query.push(("nextToken", next.to_string()));
            }
            self.http
                .request(Method::GET, "/v2/sandboxes")
                .query(&query)
        };
        let response = self.http.send_idempotent(build).await?;
        let next = response
            .headers()
            .get("x-next-token")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        Ok((self.http.json(response).await?, next))
    }
}

/// The `network` of a create locked to the gateway: every IPv4 destination denied, the
/// gateway's host allowed (E2B's allow list wins over its deny list). `None` when the pool
/// is advisory (the proxy variables only).
pub fn lockdown(egress: &RemoteEgress) -> Option<Value> {
    egress.lock_down.then(|| {
        json!({
            "denyOut": ["0.0.0.0/0"],
            "allowOut": [egress.gateway_host],
        })
    })
}

fn instance(id: String, metadata: &BTreeMap<String, String>) -> Instance {
    Instance {
        id,
        tags: tags_of(Some(metadata)),
        // Paused sandboxes exist and hold capacity; both states are live.
        state: InstanceState::Running,
    }
}

/// E2B's answers, as the coordinator's error classes (the README's E2B table). The
/// placement codes decide whatever the status; a 504 is E2B's gateway giving up waiting (the
/// create may have gone through); 404 is a template (or snapshot) not on this account.
pub static ERRORS: ErrorTable = ErrorTable {
    code: error_code,
    codes: &[
        CodeRule::any("sandbox_capacity_unavailable", ErrorClass::Capacity),
        CodeRule::any("sandbox_no_compatible_node", ErrorClass::Capacity),
        // The placement may still complete: look for it before trying elsewhere.
        CodeRule::any("sandbox_placement_timeout", ErrorClass::Unknown),
        CodeRule::any("sandbox_create_failed", ErrorClass::FailedBeforeRunning),
    ],
    // No node took it, or creating it failed: nothing runs.
    no_instance: &[
        "sandbox_capacity_unavailable",
        "sandbox_no_compatible_node",
        "sandbox_create_failed",
    ],
    message: None,
    statuses: &[
        (400, ErrorClass::InvalidRequest),
        (422, ErrorClass::InvalidRequest),
        (401, ErrorClass::UnboundAccount),
        (403, ErrorClass::UnboundAccount),
        (404, ErrorClass::Unsupported),
        (429, ErrorClass::RateLimit),
        (502, ErrorClass::Outage),
        (503, ErrorClass::Outage),
        (504, ErrorClass::Unknown),
    ],
    op_kinds: &[
        (404, OpErrorKind::NotFound),
        (400, OpErrorKind::Invalid),
        (409, OpErrorKind::Conflict),
        // envd answers a paused sandbox with 502.
        (502, OpErrorKind::Conflict),
    ],
    describe: own_message,
};

/// E2B's `error_code`.
fn error_code(failure: &HttpFailure) -> Option<&str> {
    failure.field("error_code")
}

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

impl Provider for E2b {
    fn kind(&self) -> &'static str {
        "e2b"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let body = self.create_body(&spec);
            // The attempt id as the idempotency key: a create re-sent after a lost answer
            // gets the same sandbox, not a second one.
            let request = self
                .http
                .request(Method::POST, "/v2/sandboxes")
                .header("Idempotency-Key", &spec.tags.attempt_id)
                .json(&body);
            let response = self
                .http
                .send(request)
                .await
                .map_err(|f| ERRORS.create_error(f))?;
            let created: CreatedSandbox = self
                .http
                .json(response)
                .await
                .map_err(|f| ERRORS.unreadable_create(f))?;
            if let Some(token) = created.envd_access_token {
                self.tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(created.sandbox_id.clone(), Secret::new(token));
            }
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&created.sandbox_id, egress).await {
                    return Err(ca_not_installed(&created.sandbox_id, "sandbox", e));
                }
            }
            Ok(Instance {
                id: created.sandbox_id,
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
            let detail = self.detail(instance_id).await.map_err(provider_error)?;
            Ok(detail.map(|d| instance(d.listed.sandbox_id, &d.listed.metadata)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            // The filter is one query value: `k=v&k2=v2`, each part URL-encoded.
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let metadata = crate::e2b::wire::metadata_filter(&filter.pairs());
            let metadata = &metadata;
            tags::list(filter, 100, move |next| async move {
                let (page, more) = self.list_page(metadata, next.as_deref()).await?;
                let found = page
                    .into_iter()
                    .map(|s| instance(s.sandbox_id, &s.metadata))
                    .collect();
                Ok((found, more))
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let path = format!("/sandboxes/{}", path_segment(instance_id));
            let result = self
                .http
                .send_idempotent(|| self.http.request(Method::DELETE, &path))
                .await;
            self.tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(instance_id);
            absent_ok(result).map(|_| ()).map_err(provider_error)
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
                self.http
                    .request(Method::GET, "/v2/sandboxes")
                    .query(&[("limit", "1")])
            };
            self.http
                .send_idempotent(build)
                .await
                .map_err(provider_error)?;
            Ok(format!("listed sandboxes at {}", self.http.base_url()))
        })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async { Ok(CAPABILITIES) })
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
            let request = self
                .envd(instance_id, Method::GET, "/files")
                .await?
                .query(&[("path", path)]);
            let response = self.http.send(request).await.map_err(op_error)?;
            self.http.file_bytes(response, path).await
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

    fn list_dir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SandboxEntry>, OpError>> {
        Box::pin(async move {
            let body = json!({"path": path, "depth": 1});
            let answer = self
                .envd_unary(instance_id, "filesystem.Filesystem/ListDir", body)
                .await?;
            let entries = answer["entries"].as_array().cloned().unwrap_or_default();
            Ok(entries.iter().map(envd::entry_from_info).collect())
        })
    }

    fn remove_path<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        _recursive: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        // envd's Remove removes directories with their contents.
        Box::pin(async move {
            self.envd_unary(
                instance_id,
                "filesystem.Filesystem/Remove",
                json!({"path": path}),
            )
            .await
            .map(|_| ())
        })
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        _parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        // envd's MakeDir creates missing parents too.
        Box::pin(async move {
            self.envd_unary(
                instance_id,
                "filesystem.Filesystem/MakeDir",
                json!({"path": path}),
            )
            .await
            .map(|_| ())
        })
    }

    fn rename<'a>(
        &'a self,
        instance_id: &'a str,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            self.envd_unary(
                instance_id,
                "filesystem.Filesystem/Move",
                json!({"source": from, "destination": to}),
            )
            .await
            .map(|_| ())
        })
    }

    /// E2B's `timeout` (seconds from now, up to its 24 h ceiling): the sandbox's remaining
    /// lifetime plus the margin, or the account's `timeout_secs` for a sandbox without one.
    fn extend_lifetime<'a>(
        &'a self,
        instance_id: &'a str,
        remaining: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let secs = remaining
                .map_or(self.timeout_secs, |r| (r + LIFETIME_MARGIN).as_secs())
                .clamp(1, MAX_TIMEOUT_SECS);
            let path = format!("/sandboxes/{}/timeout", path_segment(instance_id));
            let request = self
                .http
                .request(Method::POST, &path)
                .json(&json!({"timeout": secs}));
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
            let id = path_segment(instance_id);
            let request = match operation {
                Lifecycle::Pause => self
                    .http
                    .request(Method::POST, &format!("/sandboxes/{id}/pause")),
                Lifecycle::Resume => self
                    .http
                    .request(Method::POST, &format!("/v2/sandboxes/{id}/connect"))
                    .json(&json!({"timeout": self.timeout_secs})),
                Lifecycle::Stop | Lifecycle::Start => {
                    return Err(OpError::unsupported("e2b", operation.as_str()))
                }
            };
            self.http.send(request).await.map_err(op_error)?;
            Ok(())
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(async move {
            let path = format!("/sandboxes/{}/snapshots", path_segment(instance_id));
            let request = self.http.request(Method::POST, &path).json(&json!({}));
            let response = self.http.send(request).await.map_err(op_error)?;
            let body: Value = self.http.json(response).await.map_err(op_error)?;
            let id = body["snapshotID"].as_str().ok_or_else(|| {
                OpError::new(
                    OpErrorKind::Provider,
                    "e2b answered a snapshot without snapshotID",
                )
            })?;
            Ok(SnapshotInfo {
                id: id.to_string(),
                size_bytes: 0,
            })
        })
    }
}

impl E2b {
    /// `process.Process/Start`: the command's events, in order, as an [`ExecStream`].
    async fn start(&self, id: &str, spec: ExecSpec) -> Result<ExecStream, OpError> {
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "argv must name a program",
            ));
        };
        let mut process = json!({"cmd": program, "args": args, "envs": spec.env});
        if let Some(cwd) = &spec.cwd {
            process["cwd"] = json!(cwd);
        }
        let payload = serde_json::to_vec(&json!({"process": process, "stdin": false}))
            .map_err(|e| OpError::new(OpErrorKind::Invalid, e.to_string()))?;
        let mut request = self
            .envd(id, Method::POST, "/process.Process/Start")
            .await?
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", "50")
            .body(connect_rpc::envelope(&payload));
        if let Some(timeout) = spec.timeout {
            request = request
                .header("Connect-Timeout-Ms", timeout.as_millis().to_string())
                .timeout(timeout + Duration::from_secs(5));
        } else {
            // Commands may run for long: the stream has no whole-request timeout.
            request = request.timeout(Duration::from_secs(24 * 3600));
        }
        let response = self.http.send(request).await.map_err(op_error)?;
        let (tx, rx) = mpsc::channel(64);
        let cancelled = Arc::new(tokio::sync::Notify::new());
        let (pid_tx, pid_rx) = tokio::sync::watch::channel(None::<u64>);
        let reader = tokio::spawn(read_events(response, tx, pid_tx, spec.timeout.is_some()));
        let kill = self.killer(id, pid_rx);
        let notify = cancelled.clone();
        let reading = reader.abort_handle();
        tokio::spawn(async move {
            notify.notified().await;
            kill().await;
            reading.abort();
        });
        let cancel: Arc<dyn Fn() + Send + Sync> = Arc::new(move || cancelled.notify_one());
        Ok(ExecStream { events: rx, cancel })
    }

    /// `process.Process/SendSignal` with SIGKILL to the started process, once known.
    fn killer(
        &self,
        id: &str,
        mut pid: tokio::sync::watch::Receiver<Option<u64>>,
    ) -> impl FnOnce() -> BoxFuture<'static, ()> + Send + 'static {
        let http = self.http.clone();
        let url = format!("{}/process.Process/SendSignal", self.sandbox_url);
        let id = id.to_string();
        let token = self
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        move || {
            Box::pin(async move {
                // The command runs in the sandbox before its pid (the stream's first event)
                // is read here: a cancel that comes first waits for it, up to `PID_WAIT`,
                // rather than leave the command running. A stream that ends first (the
                // command is done) needs no kill.
                let known = tokio::time::timeout(PID_WAIT, pid.wait_for(Option::is_some));
                let pid = match known.await {
                    Ok(Ok(pid)) => *pid,
                    _ => None,
                };
                let (Some(pid), Some(token)) = (pid, token) else {
                    return;
                };
                let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
                let request = http
                    .request_url(Method::POST, &url)
                    .header("E2b-Sandbox-Id", &id)
                    .header("E2b-Sandbox-Port", ENVD_PORT)
                    .header("X-Access-Token", token.expose())
                    .json(&body);
                if let Err(e) = http.send(request).await {
                    tracing::warn!(sandbox_instance = %id, error = %e.message, "e2b: killing a cancelled command failed");
                }
            })
        }
    }
}

/// Reads envd's Start stream into exec events: `start` (the pid), `data` (base64 stdout /
/// stderr, per proto3 JSON), `end` (exit code, which proto3 JSON omits when it is 0), then
/// the end-of-stream message.
async fn read_events(
    response: reqwest::Response,
    tx: mpsc::Sender<ExecEvent>,
    pid: tokio::sync::watch::Sender<Option<u64>>,
    timed: bool,
) {
    let mut decoder = Decoder::default();
    let mut body = response.bytes_stream();
    let mut exit: Option<ExitInfo> = None;
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            break;
        };
        decoder.push(&chunk);
        while let Ok(Some(frame)) = decoder.next_frame() {
            if frame.is_end() {
                let trailer: Value = serde_json::from_slice(&frame.payload).unwrap_or(Value::Null);
                let deadline = trailer["error"]["code"] == "deadline_exceeded";
                let info = exit.take().unwrap_or(ExitInfo {
                    code: None,
                    signal: None,
                    reason: if deadline && timed {
                        ExitReason::TimedOut
                    } else {
                        ExitReason::Exited
                    },
                });
                let _ = tx.send(ExecEvent::Exit(info)).await;
                return;
            }
            let Ok(message) = serde_json::from_slice::<Value>(&frame.payload) else {
                continue;
            };
            let item = match envd::parse_event(&message) {
                ProcessEvent::Start { pid: p } => {
                    pid.send_replace(Some(p));
                    continue;
                }
                ProcessEvent::Stdout(bytes) => ExecEvent::Stdout(bytes),
                ProcessEvent::Stderr(bytes) => ExecEvent::Stderr(bytes),
                ProcessEvent::End(info) => {
                    exit = Some(info);
                    continue;
                }
                ProcessEvent::Keepalive | ProcessEvent::Other => continue,
            };
            if tx.send(item).await.is_err() {
                return;
            }
        }
    }
    // The stream ended without its end-of-stream message.
    let info = exit.unwrap_or(ExitInfo {
        code: None,
        signal: None,
        reason: ExitReason::Exited,
    });
    let _ = tx.send(ExecEvent::Exit(info)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::providers::hosted::errors::test_failure as failure;

    #[test]
    fn the_failure_table() {
        let cases = [
            (
                Some(503),
                json!({"code": 503, "error_code": "sandbox_capacity_unavailable"}),
                ErrorClass::Capacity,
            ),
            (
                Some(503),
                json!({"code": 503, "error_code": "sandbox_no_compatible_node"}),
                ErrorClass::Capacity,
            ),
            (
                Some(504),
                json!({"code": 504, "error_code": "sandbox_placement_timeout"}),
                ErrorClass::Unknown,
            ),
            (
                Some(500),
                json!({"code": 500, "error_code": "sandbox_create_failed"}),
                ErrorClass::FailedBeforeRunning,
            ),
            (Some(400), json!({"code": 400}), ErrorClass::InvalidRequest),
            (Some(401), json!({"code": 401}), ErrorClass::UnboundAccount),
            (Some(404), json!({"code": 404}), ErrorClass::Unsupported),
            (Some(429), json!({"code": 429}), ErrorClass::RateLimit),
            (Some(502), json!({}), ErrorClass::Outage),
            (Some(503), json!({}), ErrorClass::Outage),
            (Some(504), json!({}), ErrorClass::Unknown),
            (Some(500), json!({}), ErrorClass::ProviderError),
        ];
        for (status, body, class) in cases {
            assert_eq!(
                classify(&failure(status, body.clone(), true)),
                class,
                "{status:?} {body}"
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
    }
}
