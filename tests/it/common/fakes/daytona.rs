//! A fake Daytona on a real socket: the control plane under `/api` and the toolbox (the
//! in-sandbox daemon) under `/toolbox`, on one origin. Proven by the official `daytona`
//! Python SDK (`tests/sdk/daytona_contract.py`, run by `tests/it/daytona_fake.rs`).
//!
//! What it speaks (read from the SDK 0.226 sources and Daytona's API/daemon sources):
//! - `Authorization: Bearer <key>` on every call, else 401 in the API's error shape
//!   `{path, timestamp, statusCode, error, message}` (the daemon's own errors are
//!   `{statusCode, message, code, timestamp, path, method}`).
//! - `POST /api/sandbox` answers 200 with the sandbox still `creating`; it becomes `started`
//!   after [`FakeDaytonaConfig::start_delay`]. `GET|DELETE /api/sandbox/{idOrName}`,
//!   `POST /api/sandbox/{id}/start|stop|pause|snapshot|network-settings`,
//!   `PUT /api/sandbox/{id}/labels`, `GET /api/sandbox/{id}/toolbox-proxy-url`,
//!   `GET /api/snapshots/{idOrName}`, `DELETE /api/snapshots/{id}`. Transitions (stopping,
//!   starting, pausing, destroying, snapshotting) take [`FakeDaytonaConfig::transition_delay`];
//!   a delete, stop or start during one answers 409 ("Sandbox state change in progress").
//!   Destroyed sandboxes answer 404.
//! - `GET /api/sandbox?labels=<JSON>&limit=&cursor=&states=` answers `{items, nextCursor}`
//!   (newest first), or the bare array of older deployments with
//!   [`FakeDaytonaConfig::legacy_list`].
//! - Create validates what Daytona validates: `networkAllowList` (IPv4 CIDRs, at most 10),
//!   `domainAllowList`, resources only with a `buildInfo`, the snapshot name.
//! - Every sandbox's `toolboxProxyUrl` is `http://127.0.0.1:PORT/toolbox`, so toolbox calls
//!   arrive as `/toolbox/{sandboxId}/...` (the SDKs prefix the sandbox id). Commands run for
//!   real (`sh`, fed the command on stdin as the daemon does, stdout and stderr merged, in
//!   their own process group, killed at the timeout → 408) in a per-sandbox directory that
//!   stands for the sandbox's `/`: absolute paths and `cwd` are mapped into it, relative
//!   ones are taken from `/home/daytona`, and `..` is refused. Files: `GET /files/download`,
//!   `POST /files/upload`, `/files/upload-v2`, `/files/bulk-upload`, `/files/bulk-download`
//!   (multipart answer), `GET|DELETE /files`, `POST /files/folder`, `GET /files/info`,
//!   `GET /user-home-dir`, `/work-dir`, `/version`. A toolbox call to a sandbox that is not
//!   started answers 409 (the fake's choice; the real proxy's answer is not documented).
//! - The SDK's Socket.IO subscription (`/api/socket.io/`) is answered 404, so the SDK falls
//!   back to polling, as it does when its event stream is unavailable.
//!
//! A fault script ([`FakeDaytona::script`]) decides the next creates: `ok`, `capacity`
//! (400 "No available runners"), `quota` (400 "Total CPU limit exceeded"), `rate_limit` (429
//! with `Retry-After`), `outage` (503), `unauthorized` (401), `timeout_after_send` (the
//! sandbox is created, the request is held for [`FakeDaytonaConfig::hang`] and the connection
//! dropped; listings show it only after [`FakeDaytonaConfig::appear_after`]),
//! `failed_before_running` (created, then `error` with an `errorReason`), `build_failed`.
//!
//! A toolbox fault ([`FakeDaytona::fail_toolbox`], or from another process
//! `POST /_fake/toolbox-fault {"status": 500}` and `DELETE /_fake/toolbox-fault`, the fake's
//! own control endpoint, not Daytona's) makes every toolbox call (commands and files) answer
//! that status in the daemon's error shape until it is cleared, as a daemon failing its
//! operations does; `{"hang_ms": N}` instead holds every toolbox call N ms before serving
//! it, as a daemon too slow to answer does (`DELETE` clears both).
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

pub const API_KEY: &str = "dtn_fake_0123456789abcdef0123456789abcdef";
pub const ORGANIZATION_ID: &str = "00000000-0000-4000-8000-0000000000aa";
pub const HOME: &str = "/home/daytona";
const DEFAULT_SNAPSHOT: &str = "daytona-small";
const BOUNDARY: &str = "sandgate-fake-daytona-7d3f";

#[derive(Debug, Clone)]
pub struct FakeDaytonaConfig {
    pub api_key: String,
    /// `creating` → `started` (and → `error` for `failed_before_running`).
    pub start_delay: Duration,
    /// stopping, starting, pausing, destroying, snapshotting.
    pub transition_delay: Duration,
    pub retry_after_secs: u64,
    /// How long `timeout_after_send` holds the create before dropping the connection.
    pub hang: Duration,
    /// How long a `timeout_after_send` sandbox stays out of listings.
    pub appear_after: Duration,
    /// Answer `GET /api/sandbox` with a bare array (deployments before 2026-05).
    pub legacy_list: bool,
    /// The most a page holds, whatever `limit` asks (Daytona's default limit is 100).
    pub max_page: usize,
    /// `container` (no pause) or `linux-vm`.
    pub sandbox_class: String,
    /// Snapshot names a create may use (besides those taken through the API).
    pub snapshots: Vec<String>,
    /// cpu, memory GiB, disk GiB of a sandbox made from a snapshot.
    pub resources: (u64, u64, u64),
    /// Accept `networkAllowList` but do not apply it (a deployment that ignores the field),
    /// to prove an adapter does not use a sandbox that is not locked down.
    pub ignore_network_allow_list: bool,
}

impl Default for FakeDaytonaConfig {
    fn default() -> Self {
        FakeDaytonaConfig {
            api_key: API_KEY.to_string(),
            start_delay: Duration::from_millis(300),
            transition_delay: Duration::from_millis(200),
            retry_after_secs: 2,
            hang: Duration::from_millis(600),
            appear_after: Duration::ZERO,
            legacy_list: false,
            max_page: 100,
            sandbox_class: "container".into(),
            snapshots: vec![DEFAULT_SNAPSHOT.into(), "python-3.12".into()],
            resources: (1, 1, 3),
            ignore_network_allow_list: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Creating,
    PendingBuild,
    Started,
    Stopping,
    Stopped,
    Starting,
    Pausing,
    Paused,
    Snapshotting,
    Destroying,
    Destroyed,
    Error,
    BuildFailed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        use SandboxState::*;
        match self {
            Creating => "creating",
            PendingBuild => "pending_build",
            Started => "started",
            Stopping => "stopping",
            Stopped => "stopped",
            Starting => "starting",
            Pausing => "pausing",
            Paused => "paused",
            Snapshotting => "snapshotting",
            Destroying => "destroying",
            Destroyed => "destroyed",
            Error => "error",
            BuildFailed => "build_failed",
        }
    }

    fn from_name(name: &str) -> Option<SandboxState> {
        use SandboxState::*;
        [
            Creating,
            PendingBuild,
            Started,
            Stopping,
            Stopped,
            Starting,
            Pausing,
            Paused,
            Snapshotting,
            Destroying,
            Destroyed,
            Error,
            BuildFailed,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// A state change is in progress: delete, stop and start answer 409.
    pub fn in_transition(self) -> bool {
        use SandboxState::*;
        matches!(
            self,
            Creating | PendingBuild | Stopping | Starting | Pausing | Snapshotting | Destroying
        )
    }

    fn desired(self) -> &'static str {
        use SandboxState::*;
        match self {
            Creating | PendingBuild | Started | Starting | Snapshotting | Error | BuildFailed => {
                "started"
            }
            Stopping | Stopped => "stopped",
            Pausing | Paused => "paused",
            Destroying | Destroyed => "destroyed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    Capacity,
    Quota,
    RateLimit,
    Outage,
    Unauthorized,
    TimeoutAfterSend,
    FailedBeforeRunning,
    BuildFailed,
}

impl CreateOutcome {
    pub fn from_name(name: &str) -> Option<CreateOutcome> {
        use CreateOutcome::*;
        Some(match name {
            "ok" => Ok,
            "capacity" => Capacity,
            "quota" => Quota,
            "rate_limit" => RateLimit,
            "outage" => Outage,
            "unauthorized" => Unauthorized,
            "timeout_after_send" => TimeoutAfterSend,
            "failed_before_running" => FailedBeforeRunning,
            "build_failed" => BuildFailed,
            _ => return None,
        })
    }
}

/// One create the fake answered.
#[derive(Debug, Clone)]
pub struct CreateRecord {
    pub outcome: CreateOutcome,
    pub sandbox_id: Option<String>,
    pub body: Value,
}

/// A sandbox as the fake holds it.
#[derive(Debug, Clone)]
pub struct FakeSandbox {
    pub id: String,
    pub name: String,
    pub state: SandboxState,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub snapshot: Option<String>,
    pub target: String,
    pub network_block_all: bool,
    pub network_allow_list: Option<String>,
    pub domain_allow_list: Option<String>,
    pub auto_stop_interval: Option<i64>,
    pub cpu: u64,
    pub memory: u64,
    pub disk: u64,
    pub error_reason: Option<String>,
    /// The create request as sent.
    pub create_body: Value,
    /// `POST /sandbox/{id}/network-settings` bodies, in order.
    pub network_updates: Vec<Value>,
    /// Snapshot names taken of this sandbox.
    pub snapshots_taken: Vec<String>,
    /// The directory standing for the sandbox's `/`.
    pub root: PathBuf,
}

impl FakeSandbox {
    /// The contents of `path` inside the sandbox.
    pub fn file(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(map_path(&self.root, path).ok()?).ok()
    }

    pub fn host_path(&self, path: &str) -> PathBuf {
        map_path(&self.root, path).expect("a path inside the sandbox")
    }
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// The path without the query, e.g. `/api/sandbox` or `/toolbox/{id}/process/execute`.
    pub path: String,
    pub query: String,
    /// The sandbox a `/api/sandbox/{id}...` or toolbox call addressed.
    pub sandbox_id: Option<String>,
    pub authorized: bool,
    /// `X-Daytona-Organization-ID`, `X-Daytona-Source`, `User-Agent`.
    pub organization: Option<String>,
    pub source: Option<String>,
    pub user_agent: Option<String>,
    /// The JSON body, when there was one.
    pub json: Option<Value>,
}

struct Pending {
    to: SandboxState,
    at: Instant,
    reason: Option<String>,
}

struct Sandbox {
    rec: FakeSandbox,
    pending: Option<Pending>,
    listed_after: Instant,
    seq: u64,
    created_at: String,
}

impl Sandbox {
    fn settle(&mut self, now: Instant) {
        if let Some(p) = &self.pending {
            if p.at <= now {
                let p = self.pending.take().expect("pending");
                self.rec.state = p.to;
                if p.reason.is_some() {
                    self.rec.error_reason = p.reason;
                }
            }
        }
    }

    fn go(&mut self, now_state: SandboxState, to: SandboxState, after: Duration) {
        self.rec.state = now_state;
        self.pending = Some(Pending {
            to,
            at: Instant::now() + after,
            reason: None,
        });
        if after.is_zero() {
            self.settle(Instant::now());
        }
    }
}

struct Snapshot {
    id: String,
    name: String,
    source: Option<String>,
    dir: Option<PathBuf>,
    active_at: Instant,
    created_at: String,
}

#[derive(Default)]
struct Inner {
    sandboxes: Vec<Sandbox>,
    script: VecDeque<CreateOutcome>,
    creates: Vec<CreateRecord>,
    requests: Vec<Seen>,
    snapshots: Vec<Snapshot>,
    seq: u64,
    /// The status every toolbox call answers while set.
    toolbox_fault: Option<StatusCode>,
    /// How long every toolbox call is held before it is served, while set.
    toolbox_hang: Option<Duration>,
}

struct Shared {
    config: FakeDaytonaConfig,
    origin: String,
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn toolbox_url(&self) -> String {
        format!("{}/toolbox", self.origin)
    }
}

pub struct FakeDaytona {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeDaytona {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeDaytona {
    pub async fn start(config: FakeDaytonaConfig) -> FakeDaytona {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = Arc::new(Shared {
            config,
            origin: format!("http://{addr}"),
            dir: dir.path().to_path_buf(),
            inner: Mutex::new(Inner::default()),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { handle(shared, req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeDaytona {
            addr,
            shared,
            _dir: dir,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` (the API is under `/api`, the toolbox under `/toolbox`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_url(&self) -> String {
        format!("{}/api", self.url())
    }

    pub fn toolbox_url(&self) -> String {
        self.shared.toolbox_url()
    }

    pub fn api_key(&self) -> &str {
        &self.shared.config.api_key
    }

    /// Every toolbox call (commands, files) answers `status` until called with `None`.
    pub fn fail_toolbox(&self, status: Option<StatusCode>) {
        self.shared.lock().toolbox_fault = status;
    }

    /// Every toolbox call is held `hang` before it is served, until called with `None`.
    pub fn hang_toolbox(&self, hang: Option<Duration>) {
        self.shared.lock().toolbox_hang = hang;
    }

    /// The next creates' outcomes, in order (then `ok`).
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::from_name(name)
                .unwrap_or_else(|| panic!("unknown scripted outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    pub fn pending_script(&self) -> Vec<CreateOutcome> {
        self.shared.lock().script.iter().copied().collect()
    }

    pub fn create_attempts(&self) -> usize {
        self.shared.lock().creates.len()
    }

    pub fn create_log(&self) -> Vec<CreateRecord> {
        self.shared.lock().creates.clone()
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.shared.lock().requests.clone()
    }

    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let mut inner = self.shared.lock();
        let now = Instant::now();
        inner
            .sandboxes
            .iter_mut()
            .map(|s| {
                s.settle(now);
                s.rec.clone()
            })
            .collect()
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.sandboxes().into_iter().find(|s| s.id == id)
    }

    /// Sandboxes that exist (any state but destroying / destroyed).
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes()
            .into_iter()
            .filter(|s| !matches!(s.state, SandboxState::Destroying | SandboxState::Destroyed))
            .collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn live_with_label(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        self.live()
            .into_iter()
            .filter(|s| s.labels.get(key).map(String::as_str) == Some(value))
            .collect()
    }

    /// The contents of `path` inside sandbox `id`.
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        self.sandbox(id)?.file(path)
    }

    /// Puts a sandbox in a state, e.g. to test a 409 during a transition (`None`: stays).
    pub fn force_state(
        &self,
        id: &str,
        state: SandboxState,
        then: Option<(SandboxState, Duration)>,
    ) {
        let mut inner = self.shared.lock();
        let sb = inner
            .sandboxes
            .iter_mut()
            .find(|s| s.rec.id == id)
            .expect("a sandbox of this fake");
        sb.rec.state = state;
        sb.pending = then.map(|(to, after)| Pending {
            to,
            at: Instant::now() + after,
            reason: None,
        });
    }
}

// ------------------------------------------------------------------------------ serving

/// Returned by the service to drop the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by the fake")
    }
}

impl std::error::Error for Dropped {}

type Answer = Response<Full<Bytes>>;

struct Call {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    content_type: String,
    body: Bytes,
}

impl Call {
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn params(&self, name: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(k, _)| k == name)
            .flat_map(|(_, v)| v.split(','))
            .filter(|v| !v.is_empty())
            .collect()
    }

    fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Answer, Dropped> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let call = Call {
        method: parts.method.clone(),
        path: path.clone(),
        query: parse_query(&raw_query),
        content_type: header("content-type").unwrap_or_default(),
        body,
    };
    let authorized =
        header("authorization").as_deref() == Some(&format!("Bearer {}", shared.config.api_key));
    let sandbox_id = sandbox_of(&path);
    shared.lock().requests.push(Seen {
        method: parts.method.to_string(),
        path: path.clone(),
        query: raw_query,
        sandbox_id,
        authorized,
        organization: header("x-daytona-organization-id"),
        source: header("x-daytona-source"),
        user_agent: header("user-agent"),
        json: call.json(),
    });
    if path.starts_with("/api/socket.io") {
        return Ok(api_error(
            &path,
            StatusCode::NOT_FOUND,
            &format!("Cannot GET {path}"),
        ));
    }
    if path == "/_fake/toolbox-fault" {
        return Ok(toolbox_fault(&shared, &call));
    }
    if !authorized {
        return Ok(api_error(&path, StatusCode::UNAUTHORIZED, "Unauthorized"));
    }
    if let Some(rest) = path.strip_prefix("/api") {
        return api(&shared, &call, rest).await;
    }
    if let Some(rest) = path.strip_prefix("/toolbox/") {
        let (id, rest) = rest.split_once('/').unwrap_or((rest, ""));
        return Ok(toolbox(&shared, &call, id, &format!("/{rest}")).await);
    }
    Ok(api_error(
        &path,
        StatusCode::NOT_FOUND,
        &format!("Cannot {} {path}", call.method),
    ))
}

/// The fake's control endpoint: `POST {"status": N}` sets the toolbox fault (a 4xx or 5xx),
/// `POST {"hang_ms": N}` the toolbox hang, `DELETE` clears both; each answers 204.
fn toolbox_fault(shared: &Shared, call: &Call) -> Answer {
    let hang = call.json().and_then(|v| v["hang_ms"].as_u64());
    let status = match call.method {
        Method::DELETE => {
            shared.lock().toolbox_hang = None;
            None
        }
        Method::POST if hang.is_some() => {
            shared.lock().toolbox_hang = hang.map(Duration::from_millis);
            return Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Full::new(Bytes::new()))
                .expect("response");
        }
        Method::POST => {
            let status = call
                .json()
                .and_then(|v| v["status"].as_u64())
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .filter(|s| s.is_client_error() || s.is_server_error());
            match status {
                Some(s) => Some(s),
                None => {
                    return daemon_error(
                        call,
                        StatusCode::BAD_REQUEST,
                        "status: a 4xx or 5xx, or hang_ms",
                    )
                }
            }
        }
        _ => return daemon_error(call, StatusCode::METHOD_NOT_ALLOWED, "POST or DELETE"),
    };
    shared.lock().toolbox_fault = status;
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(Full::new(Bytes::new()))
        .expect("response")
}

fn sandbox_of(path: &str) -> Option<String> {
    if let Some(rest) = path.strip_prefix("/api/sandbox/") {
        return rest.split('/').next().filter(|s| !s.is_empty()).map(decode);
    }
    if let Some(rest) = path.strip_prefix("/toolbox/") {
        return rest.split('/').next().filter(|s| !s.is_empty()).map(decode);
    }
    None
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .to_string()
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

fn now_text() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn json_answer(status: StatusCode, body: &Value) -> Answer {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

/// The API's error shape (NestJS `AllExceptionsFilter`).
fn api_error(path: &str, status: StatusCode, message: &str) -> Answer {
    json_answer(
        status,
        &json!({
            "path": path,
            "timestamp": now_text(),
            "statusCode": status.as_u16(),
            "error": status.canonical_reason().unwrap_or(""),
            "message": message,
        }),
    )
}

/// The daemon's error shape (`ErrorMiddleware`).
fn daemon_error(call: &Call, status: StatusCode, message: &str) -> Answer {
    json_answer(
        status,
        &json!({
            "statusCode": status.as_u16(),
            "message": message,
            "code": status.canonical_reason().unwrap_or(""),
            "timestamp": now_text(),
            "path": call.path,
            "method": call.method.as_str(),
        }),
    )
}

fn random_id() -> String {
    let hex = sandgate::base::ids::random_hex(16);
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

fn dto(shared: &Shared, sb: &Sandbox) -> Value {
    let r = &sb.rec;
    json!({
        "id": r.id,
        "organizationId": ORGANIZATION_ID,
        "name": r.name,
        "snapshot": r.snapshot,
        "user": "daytona",
        "env": r.env,
        "labels": r.labels,
        "public": false,
        "networkBlockAll": r.network_block_all,
        "kvm": false,
        "networkAllowList": r.network_allow_list,
        "domainAllowList": r.domain_allow_list,
        "target": r.target,
        "cpu": r.cpu,
        "gpu": 0,
        "memory": r.memory,
        "disk": r.disk,
        "state": r.state.as_str(),
        "desiredState": r.state.desired(),
        "errorReason": r.error_reason,
        "recoverable": false,
        "backupState": "None",
        "autoStopInterval": r.auto_stop_interval.unwrap_or(15),
        "autoArchiveInterval": 10080,
        "autoDeleteInterval": -1,
        "createdAt": sb.created_at,
        "updatedAt": now_text(),
        "sandboxClass": shared.config.sandbox_class,
        "daemonVersion": "0.226.1-fake",
        "toolboxProxyUrl": shared.toolbox_url(),
    })
}

fn list_item(shared: &Shared, sb: &Sandbox) -> Value {
    let mut v = dto(shared, sb);
    let map = v.as_object_mut().expect("object");
    for key in ["env", "kvm"] {
        map.remove(key);
    }
    v
}

// ------------------------------------------------------------------------ control plane

async fn api(shared: &Arc<Shared>, call: &Call, rest: &str) -> Result<Answer, Dropped> {
    let segments: Vec<String> = rest
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode)
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let path = call.path.as_str();
    let answer = match (&call.method, seg.as_slice()) {
        (&Method::POST, ["sandbox"]) => return create(shared, call).await,
        (&Method::GET, ["sandbox"]) => list(shared, call),
        (&Method::GET, ["sandbox", id]) => with_sandbox(shared, path, id, |_, sb| {
            Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
        }),
        (&Method::DELETE, ["sandbox", id]) => with_sandbox(shared, path, id, |_, sb| {
            if sb.rec.state.in_transition() {
                return Err((
                    StatusCode::CONFLICT,
                    "Sandbox state change in progress".into(),
                ));
            }
            sb.go(
                SandboxState::Destroying,
                SandboxState::Destroyed,
                shared.config.transition_delay,
            );
            Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
        }),
        (&Method::POST, ["sandbox", id, "stop"]) => with_sandbox(shared, path, id, |_, sb| {
            if sb.rec.state.in_transition() {
                return Err((
                    StatusCode::CONFLICT,
                    "Sandbox state change in progress".into(),
                ));
            }
            if !matches!(sb.rec.state, SandboxState::Started | SandboxState::Paused) {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "Sandbox is not in a stoppable state".into(),
                ));
            }
            sb.go(
                SandboxState::Stopping,
                SandboxState::Stopped,
                shared.config.transition_delay,
            );
            Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
        }),
        (&Method::POST, ["sandbox", id, "start"]) => with_sandbox(shared, path, id, |_, sb| {
            match sb.rec.state {
                SandboxState::Started => {}
                s if s.in_transition() => {
                    return Err((
                        StatusCode::CONFLICT,
                        "Sandbox state change in progress".into(),
                    ))
                }
                SandboxState::Paused if shared.config.sandbox_class == "container" => {
                    return Err((
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Resuming is not supported for this sandbox".into(),
                    ))
                }
                SandboxState::Stopped | SandboxState::Paused => sb.go(
                    SandboxState::Starting,
                    SandboxState::Started,
                    shared.config.transition_delay,
                ),
                _ => {
                    return Err((
                        StatusCode::BAD_REQUEST,
                        "Sandbox is not in valid state".into(),
                    ))
                }
            }
            Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
        }),
        (&Method::POST, ["sandbox", id, "pause"]) => with_sandbox(shared, path, id, |_, sb| {
            if shared.config.sandbox_class == "container" {
                return Err((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Pausing is not supported for this sandbox".into(),
                ));
            }
            if sb.rec.state.in_transition() {
                return Err((
                    StatusCode::CONFLICT,
                    "Sandbox state change in progress".into(),
                ));
            }
            if sb.rec.state != SandboxState::Started {
                return Err((StatusCode::BAD_REQUEST, "Sandbox is not started".into()));
            }
            sb.go(
                SandboxState::Pausing,
                SandboxState::Paused,
                shared.config.transition_delay,
            );
            Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
        }),
        (&Method::POST, ["sandbox", id, "snapshot"]) => snapshot(shared, call, id),
        (&Method::POST, ["sandbox", id, "network-settings"]) => {
            let body = call.json().unwrap_or(Value::Null);
            with_sandbox(shared, path, id, |_, sb| {
                if body.get("networkBlockAll").is_none()
                    && body.get("networkAllowList").is_none()
                    && body.get("domainAllowList").is_none()
                {
                    return Err((
                        StatusCode::BAD_REQUEST,
                        "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided".into(),
                    ));
                }
                if let Some(list) = body["networkAllowList"].as_str() {
                    validate_network_allow_list(list).map_err(|m| (StatusCode::BAD_REQUEST, m))?;
                    sb.rec.network_allow_list = Some(list.to_string());
                }
                if let Some(list) = body["domainAllowList"].as_str() {
                    validate_domain_allow_list(list).map_err(|m| (StatusCode::BAD_REQUEST, m))?;
                    sb.rec.domain_allow_list = Some(list.to_string());
                }
                if let Some(block) = body["networkBlockAll"].as_bool() {
                    sb.rec.network_block_all = block;
                }
                sb.rec.network_updates.push(body.clone());
                Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
            })
        }
        (&Method::PUT, ["sandbox", id, "labels"]) => {
            let labels = call.json().and_then(|b| string_map(&b["labels"]).ok());
            with_sandbox(shared, path, id, |_, sb| {
                let labels = labels.clone().ok_or((
                    StatusCode::BAD_REQUEST,
                    "labels must be an object of strings".into(),
                ))?;
                sb.rec.labels = labels;
                Ok(json_answer(
                    StatusCode::OK,
                    &json!({"labels": sb.rec.labels}),
                ))
            })
        }
        (&Method::GET, ["sandbox", id, "toolbox-proxy-url"]) => {
            with_sandbox(shared, path, id, |_, _| {
                Ok(json_answer(
                    StatusCode::OK,
                    &json!({"url": shared.toolbox_url()}),
                ))
            })
        }
        (&Method::GET, ["snapshots", id]) => {
            let inner = shared.lock();
            match inner
                .snapshots
                .iter()
                .find(|s| s.id == *id || s.name == *id)
            {
                Some(s) => json_answer(StatusCode::OK, &snapshot_dto(shared, s)),
                None => api_error(
                    path,
                    StatusCode::NOT_FOUND,
                    &format!("Snapshot {id} not found"),
                ),
            }
        }
        (&Method::DELETE, ["snapshots", id]) => {
            let mut inner = shared.lock();
            let before = inner.snapshots.len();
            inner.snapshots.retain(|s| s.id != *id);
            if inner.snapshots.len() == before {
                api_error(
                    path,
                    StatusCode::NOT_FOUND,
                    &format!("Snapshot with ID {id} not found"),
                )
            } else {
                Response::new(Full::new(Bytes::new()))
            }
        }
        _ => api_error(
            path,
            StatusCode::NOT_FOUND,
            &format!("Cannot {} {path}", call.method),
        ),
    };
    Ok(answer)
}

/// Runs `f` on the (settled) sandbox named `id_or_name`; unknown or destroyed: 404.
fn with_sandbox(
    shared: &Shared,
    path: &str,
    id_or_name: &str,
    f: impl FnOnce(&mut Inner, &mut Sandbox) -> Result<Answer, (StatusCode, String)>,
) -> Answer {
    let mut inner = shared.lock();
    let now = Instant::now();
    let Some(index) = inner.sandboxes.iter_mut().position(|s| {
        s.settle(now);
        (s.rec.id == id_or_name || s.rec.name == id_or_name)
            && s.rec.state != SandboxState::Destroyed
    }) else {
        return api_error(
            path,
            StatusCode::NOT_FOUND,
            &format!("Sandbox with ID or name {id_or_name} not found"),
        );
    };
    let mut sb = inner.sandboxes.remove(index);
    let result = f(&mut inner, &mut sb);
    inner.sandboxes.insert(index, sb);
    match result {
        Ok(answer) => answer,
        Err((status, message)) => api_error(path, status, &message),
    }
}

fn string_map(v: &Value) -> Result<BTreeMap<String, String>, String> {
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_string())),
                None => Err(format!("{k} must be a string")),
            })
            .collect(),
        _ => Err("must be an object".into()),
    }
}

/// Daytona's `validateNetworkAllowList`.
fn validate_network_allow_list(list: &str) -> Result<(), String> {
    let networks: Vec<&str> = list.split(',').map(str::trim).collect();
    for network in &networks {
        if network.is_empty() {
            continue;
        }
        let (ip, prefix) = network.split_once('/').unwrap_or((network, ""));
        if ip.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(format!(
                "Invalid IP address: \"{ip}\" in network \"{network}\". Must be a valid IPv4 address"
            ));
        }
        if prefix.is_empty() {
            return Err(format!(
                "Invalid network format: \"{network}\". Missing CIDR prefix length (e.g., /24)"
            ));
        }
        if !prefix.parse::<u8>().is_ok_and(|p| p <= 32) {
            return Err(format!(
                "Invalid CIDR prefix length: {network}. Prefix must be between 0 and 32"
            ));
        }
    }
    if networks.len() > 10 {
        return Err("Network allow list cannot contain more than 10 networks".into());
    }
    Ok(())
}

/// Daytona's `validateDomainAllowList`.
fn validate_domain_allow_list(list: &str) -> Result<(), String> {
    let domains: Vec<&str> = list.split(',').map(str::trim).collect();
    for domain in &domains {
        if domain.is_empty() {
            continue;
        }
        let name = domain.strip_prefix("*.").unwrap_or(domain);
        let labels: Vec<&str> = name.split('.').collect();
        let label_ok = |l: &&str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        let tld_ok = labels
            .last()
            .is_some_and(|t| t.len() >= 2 && t.chars().all(|c| c.is_ascii_alphabetic()));
        if labels.len() < 2 || !labels.iter().all(label_ok) || !tld_ok {
            return Err(format!(
                "Invalid domain: \"{domain}\". Must be a valid domain name"
            ));
        }
    }
    if domains.len() > 10 {
        return Err("Domain allow list cannot contain more than 10 domains".into());
    }
    Ok(())
}

async fn create(shared: &Arc<Shared>, call: &Call) -> Result<Answer, Dropped> {
    let path = call.path.as_str();
    let bad = |m: &str| Ok(api_error(path, StatusCode::BAD_REQUEST, m));
    let Some(body) = call.json().filter(Value::is_object) else {
        return bad("Invalid JSON body");
    };
    let labels = match string_map(&body["labels"]) {
        Ok(l) => l,
        Err(e) => return bad(&format!("labels: {e}")),
    };
    let env = match string_map(&body["env"]) {
        Ok(e) => e,
        Err(e) => return bad(&format!("env: {e}")),
    };
    let allow = body["networkAllowList"].as_str().map(str::to_string);
    if let Some(list) = &allow {
        if let Err(m) = validate_network_allow_list(list) {
            return bad(&m);
        }
    }
    let domains = body["domainAllowList"].as_str().map(str::to_string);
    if let Some(list) = &domains {
        if let Err(m) = validate_domain_allow_list(list) {
            return bad(&m);
        }
    }
    let build = body.get("buildInfo").filter(|b| b.is_object()).is_some();
    let resource = |k: &str| body.get(k).and_then(Value::as_u64);
    if !build
        && ["cpu", "memory", "disk", "gpu"]
            .iter()
            .any(|k| resource(k).is_some())
    {
        return bad("Cannot specify Sandbox resources when using a snapshot");
    }
    let snapshot = body["snapshot"].as_str().map(str::to_string);
    let (cpu, memory, disk) = shared.config.resources;
    let mut from_dir = None;
    if let Some(name) = &snapshot {
        let inner = shared.lock();
        let taken = inner
            .snapshots
            .iter()
            .find(|s| s.name == *name || s.id == *name);
        if let Some(s) = taken {
            from_dir = s.dir.clone();
        } else if !shared.config.snapshots.contains(name) {
            return bad(&format!(
                "Snapshot {name} not found. Did you add it through the Daytona Dashboard?"
            ));
        }
    }

    let outcome = {
        let mut inner = shared.lock();
        inner.script.pop_front().unwrap_or(CreateOutcome::Ok)
    };
    let refuse = |status: StatusCode, message: &str| {
        let mut answer = api_error(path, status, message);
        if status == StatusCode::TOO_MANY_REQUESTS {
            answer.headers_mut().insert(
                header::RETRY_AFTER,
                shared
                    .config
                    .retry_after_secs
                    .to_string()
                    .parse()
                    .expect("header"),
            );
        }
        answer
    };
    let refusal = match outcome {
        CreateOutcome::Capacity => Some(refuse(StatusCode::BAD_REQUEST, "No available runners")),
        CreateOutcome::Quota => Some(refuse(
            StatusCode::BAD_REQUEST,
            "Total CPU limit exceeded. Maximum allowed: 4.\nTo increase concurrency limits, upgrade your organization's Tier",
        )),
        CreateOutcome::RateLimit => Some(refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "ThrottlerException: Too Many Requests",
        )),
        CreateOutcome::Outage => Some(refuse(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable")),
        CreateOutcome::Unauthorized => Some(refuse(StatusCode::UNAUTHORIZED, "Unauthorized")),
        _ => None,
    };
    if let Some(answer) = refusal {
        shared.lock().creates.push(CreateRecord {
            outcome,
            sandbox_id: None,
            body,
        });
        return Ok(answer);
    }

    let id = random_id();
    let root = shared.dir.join(&id);
    if let Some(dir) = &from_dir {
        copy_dir(dir, &root).expect("restore the snapshot");
    }
    std::fs::create_dir_all(root.join(HOME.trim_start_matches('/'))).expect("sandbox home");
    std::fs::create_dir_all(root.join("tmp")).expect("sandbox tmp");
    let name = body["name"]
        .as_str()
        .map_or_else(|| id.clone(), str::to_string);
    let (cpu, memory, disk) = if build {
        (
            resource("cpu").unwrap_or(cpu),
            resource("memory").unwrap_or(memory),
            resource("disk").unwrap_or(disk),
        )
    } else {
        (cpu, memory, disk)
    };
    let rec = FakeSandbox {
        id: id.clone(),
        name,
        state: SandboxState::Creating,
        labels,
        env,
        snapshot: snapshot.or_else(|| (!build).then(|| DEFAULT_SNAPSHOT.to_string())),
        target: body["target"].as_str().unwrap_or("us").to_string(),
        network_block_all: body["networkBlockAll"].as_bool().unwrap_or(false),
        network_allow_list: allow.filter(|_| !shared.config.ignore_network_allow_list),
        domain_allow_list: domains,
        auto_stop_interval: body["autoStopInterval"].as_i64(),
        cpu,
        memory,
        disk,
        error_reason: None,
        create_body: body.clone(),
        network_updates: Vec::new(),
        snapshots_taken: Vec::new(),
        root,
    };
    let now = Instant::now();
    let (first, pending) = match outcome {
        CreateOutcome::FailedBeforeRunning => (
            SandboxState::Creating,
            Pending {
                to: SandboxState::Error,
                at: now + shared.config.start_delay,
                reason: Some(
                    "Failed to start sandbox: the fake runner refused the container".into(),
                ),
            },
        ),
        CreateOutcome::BuildFailed => (
            SandboxState::PendingBuild,
            Pending {
                to: SandboxState::BuildFailed,
                at: now + shared.config.start_delay,
                reason: Some("Failed to build snapshot: the fake build failed".into()),
            },
        ),
        _ => (
            if build {
                SandboxState::PendingBuild
            } else {
                SandboxState::Creating
            },
            Pending {
                to: SandboxState::Started,
                at: now + shared.config.start_delay,
                reason: None,
            },
        ),
    };
    let listed_after = if outcome == CreateOutcome::TimeoutAfterSend {
        now + shared.config.appear_after
    } else {
        now
    };
    let answer = {
        let mut inner = shared.lock();
        inner.seq += 1;
        let mut sb = Sandbox {
            rec,
            pending: Some(pending),
            listed_after,
            seq: inner.seq,
            created_at: now_text(),
        };
        sb.rec.state = first;
        sb.settle(now);
        let answer = dto(shared, &sb);
        inner.sandboxes.push(sb);
        inner.creates.push(CreateRecord {
            outcome,
            sandbox_id: Some(id),
            body,
        });
        answer
    };
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(Dropped);
    }
    Ok(json_answer(StatusCode::OK, &answer))
}

fn list(shared: &Shared, call: &Call) -> Answer {
    let path = call.path.as_str();
    let labels = match call.param("labels") {
        Some(text) => match serde_json::from_str::<Value>(text).map(|v| string_map(&v)) {
            Ok(Ok(map)) => map,
            _ => return api_error(path, StatusCode::BAD_REQUEST, "Invalid labels JSON format"),
        },
        None => BTreeMap::new(),
    };
    let mut states = Vec::new();
    for name in call.params("states") {
        match SandboxState::from_name(name).filter(|s| *s != SandboxState::Destroyed) {
            Some(s) => states.push(s),
            None => {
                return api_error(
                    path,
                    StatusCode::BAD_REQUEST,
                    &format!("each value in states must be a valid state, not {name:?}"),
                )
            }
        }
    }
    let limit = match call.param("limit").map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if (1..=200).contains(&n) => n,
        Some(_) => {
            return api_error(
                path,
                StatusCode::BAD_REQUEST,
                "limit must be between 1 and 200",
            )
        }
    };
    let offset = match call.param("cursor").map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return api_error(path, StatusCode::BAD_REQUEST, "Invalid cursor"),
    };
    let mut inner = shared.lock();
    let now = Instant::now();
    let mut matching: Vec<&mut Sandbox> = inner
        .sandboxes
        .iter_mut()
        .filter_map(|s| {
            s.settle(now);
            let keep = s.rec.state != SandboxState::Destroyed
                && s.listed_after <= now
                && labels.iter().all(|(k, v)| s.rec.labels.get(k) == Some(v))
                && (states.is_empty() || states.contains(&s.rec.state));
            keep.then_some(s)
        })
        .collect();
    matching.sort_by_key(|s| std::cmp::Reverse(s.seq));
    if shared.config.legacy_list {
        let all: Vec<Value> = matching.iter().map(|s| dto(shared, s)).collect();
        return json_answer(StatusCode::OK, &Value::Array(all));
    }
    let size = limit.min(shared.config.max_page);
    let end = (offset + size).min(matching.len());
    let items: Vec<Value> = matching
        .get(offset..end)
        .unwrap_or_default()
        .iter()
        .map(|s| list_item(shared, s))
        .collect();
    let next = (end < matching.len()).then(|| end.to_string());
    json_answer(StatusCode::OK, &json!({"items": items, "nextCursor": next}))
}

fn snapshot(shared: &Shared, call: &Call, id: &str) -> Answer {
    let path = call.path.as_str();
    let Some(name) = call
        .json()
        .and_then(|b| b["name"].as_str().map(str::to_string))
        .filter(|n| !n.is_empty())
    else {
        return api_error(path, StatusCode::BAD_REQUEST, "name must be a string");
    };
    let delay = shared.config.transition_delay;
    with_sandbox(shared, path, id, |inner, sb| {
        if inner.snapshots.iter().any(|s| s.name == name) {
            return Err((
                StatusCode::CONFLICT,
                format!("Snapshot with name {name} already exists"),
            ));
        }
        if sb.rec.state.in_transition() {
            return Err((
                StatusCode::CONFLICT,
                "Sandbox state change in progress".into(),
            ));
        }
        if !matches!(sb.rec.state, SandboxState::Started | SandboxState::Stopped) {
            return Err((
                StatusCode::BAD_REQUEST,
                "Sandbox is not in valid state".into(),
            ));
        }
        let dir = shared.dir.join("snapshots").join(&name);
        copy_dir(&sb.rec.root, &dir)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let back = sb.rec.state;
        sb.go(SandboxState::Snapshotting, back, delay);
        sb.rec.snapshots_taken.push(name.clone());
        inner.snapshots.push(Snapshot {
            id: random_id(),
            name: name.clone(),
            source: Some(sb.rec.id.clone()),
            dir: Some(dir),
            active_at: Instant::now() + delay,
            created_at: now_text(),
        });
        Ok(json_answer(StatusCode::OK, &dto(shared, sb)))
    })
}

fn snapshot_dto(shared: &Shared, s: &Snapshot) -> Value {
    let (cpu, memory, disk) = shared.config.resources;
    let state = if Instant::now() >= s.active_at {
        "active"
    } else {
        "snapshotting"
    };
    json!({
        "id": s.id,
        "organizationId": ORGANIZATION_ID,
        "general": false,
        "name": s.name,
        "imageName": null,
        "state": state,
        "size": 0.25,
        "entrypoint": null,
        "cpu": cpu,
        "gpu": 0,
        "mem": memory,
        "disk": disk,
        "errorReason": null,
        "createdAt": s.created_at,
        "updatedAt": s.created_at,
        "lastUsedAt": null,
        "sourceSandboxId": s.source,
    })
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------ toolbox

/// `path` inside the sandbox as a host path under `root`: absolute paths from the
/// sandbox's `/`, relative ones from its home; `..` is refused.
fn map_path(root: &Path, path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err("path is required".into());
    }
    let inside = Path::new(path);
    if inside
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err(format!("invalid path {path:?}: `..` is not allowed"));
    }
    let absolute = if inside.is_absolute() {
        inside.to_path_buf()
    } else {
        Path::new(HOME).join(inside)
    };
    let relative: PathBuf = absolute
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    Ok(root.join(relative))
}

async fn toolbox(shared: &Arc<Shared>, call: &Call, id: &str, rest: &str) -> Answer {
    let id = decode(id);
    let hang = shared.lock().toolbox_hang;
    if let Some(hang) = hang {
        tokio::time::sleep(hang).await;
    }
    let root = {
        let mut inner = shared.lock();
        if let Some(status) = inner.toolbox_fault {
            return daemon_error(
                call,
                status,
                &format!("toolbox of sandbox {id} failed (injected fault)"),
            );
        }
        let now = Instant::now();
        inner.sandboxes.iter_mut().for_each(|s| s.settle(now));
        let found = inner
            .sandboxes
            .iter()
            .find(|s| s.rec.id == id && s.rec.state != SandboxState::Destroyed);
        match found {
            None => {
                return daemon_error(
                    call,
                    StatusCode::NOT_FOUND,
                    &format!("sandbox {id} not found"),
                )
            }
            Some(s) if s.rec.state != SandboxState::Started => {
                return daemon_error(
                    call,
                    StatusCode::CONFLICT,
                    &format!("sandbox {id} is {}, not started", s.rec.state.as_str()),
                )
            }
            Some(s) => (s.rec.root.clone(), s.rec.env.clone()),
        }
    };
    let (root, env) = root;
    let path_param = |name: &str| map_path(&root, call.param(name).unwrap_or(""));
    macro_rules! mapped {
        ($name:expr) => {
            match path_param($name) {
                Ok(p) => p,
                Err(message) => return daemon_error(call, StatusCode::BAD_REQUEST, &message),
            }
        };
    }
    match (&call.method, rest) {
        (&Method::POST, "/process/execute") => execute(call, &root, &env).await,
        (&Method::GET, "/files/download") => {
            let host = mapped!("path");
            match std::fs::metadata(&host) {
                Err(e) => io_error(call, &e),
                Ok(m) if m.is_dir() => {
                    daemon_error(call, StatusCode::BAD_REQUEST, "path must be a file")
                }
                Ok(_) => match std::fs::read(&host) {
                    Ok(data) => Response::builder()
                        .header(header::CONTENT_TYPE, "application/octet-stream")
                        .header(header::CONTENT_DISPOSITION, "attachment")
                        .body(Full::new(Bytes::from(data)))
                        .expect("response"),
                    Err(e) => io_error(call, &e),
                },
            }
        }
        (&Method::POST, "/files/upload") | (&Method::POST, "/files/upload-v2") => {
            let host = mapped!("path");
            let data = if call.content_type.starts_with("multipart/form-data") {
                match multipart(&call.content_type, &call.body)
                    .and_then(|parts| parts.into_iter().find(|p| p.name == "file"))
                {
                    Some(part) => part.data,
                    None => {
                        return daemon_error(call, StatusCode::BAD_REQUEST, "http: no such file")
                    }
                }
            } else if rest == "/files/upload-v2" {
                call.body.to_vec()
            } else {
                return daemon_error(
                    call,
                    StatusCode::BAD_REQUEST,
                    "request Content-Type isn't multipart/form-data",
                );
            };
            if let Some(parent) = host.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::write(&host, &data) {
                Ok(()) => json_answer(
                    StatusCode::OK,
                    &json!({"path": call.param("path"), "bytes": data.len()}),
                ),
                Err(e) => io_error(call, &e),
            }
        }
        (&Method::POST, "/files/bulk-upload") => bulk_upload(call, &root),
        (&Method::POST, "/files/bulk-download") => bulk_download(call, &root),
        (&Method::GET, "/files") => {
            let dir = if call.param("path").is_some_and(|p| !p.is_empty()) {
                mapped!("path")
            } else {
                map_path(&root, HOME).expect("home")
            };
            match std::fs::read_dir(&dir) {
                Err(e) => io_error(call, &e),
                Ok(entries) => {
                    let mut infos: Vec<Value> = entries
                        .filter_map(Result::ok)
                        .filter_map(|e| file_info(&e.path(), &e.file_name().to_string_lossy()))
                        .collect();
                    infos.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                    json_answer(StatusCode::OK, &Value::Array(infos))
                }
            }
        }
        (&Method::GET, "/files/info") => {
            let host = mapped!("path");
            let name = host
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            match std::fs::metadata(&host) {
                Err(e) => io_error(call, &e),
                Ok(_) => match file_info(&host, &name) {
                    Some(info) => json_answer(StatusCode::OK, &info),
                    None => daemon_error(call, StatusCode::BAD_REQUEST, "cannot stat"),
                },
            }
        }
        (&Method::DELETE, "/files") => {
            let host = mapped!("path");
            let recursive = call.param("recursive") == Some("true");
            let result = match std::fs::metadata(&host) {
                Err(e) => Err(e),
                Ok(m) if m.is_dir() && !recursive => {
                    return daemon_error(
                        call,
                        StatusCode::BAD_REQUEST,
                        "cannot delete directory without recursive flag",
                    )
                }
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&host),
                Ok(_) => std::fs::remove_file(&host),
            };
            match result {
                Ok(()) => Response::builder()
                    .status(StatusCode::NO_CONTENT)
                    .body(Full::new(Bytes::new()))
                    .expect("response"),
                Err(e) => io_error(call, &e),
            }
        }
        (&Method::POST, "/files/folder") => {
            let host = mapped!("path");
            let mode = call.param("mode").unwrap_or("755");
            let Ok(mode) = u32::from_str_radix(mode, 8) else {
                return daemon_error(call, StatusCode::BAD_REQUEST, "invalid mode format");
            };
            let created = {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(mode)
                    .create(&host)
            };
            match created {
                Ok(()) => Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::new()))
                    .expect("response"),
                Err(e) => io_error(call, &e),
            }
        }
        (&Method::GET, "/user-home-dir") | (&Method::GET, "/work-dir") => {
            json_answer(StatusCode::OK, &json!({"dir": HOME}))
        }
        (&Method::GET, "/version") => {
            json_answer(StatusCode::OK, &json!({"version": "0.226.1-fake"}))
        }
        _ => daemon_error(
            call,
            StatusCode::NOT_FOUND,
            &format!("no route {} {rest}", call.method),
        ),
    }
}

fn io_error(call: &Call, e: &std::io::Error) -> Answer {
    let status = match e.kind() {
        std::io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
        std::io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    };
    daemon_error(call, status, &e.to_string())
}

/// The daemon's `FileInfo`.
fn file_info(host: &Path, name: &str) -> Option<Value> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(host).ok()?;
    let perm = meta.mode() & 0o777;
    let kind = if meta.is_dir() { 'd' } else { '-' };
    let mut mode = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (perm >> shift) & 7;
        mode.push(if bits & 4 != 0 { 'r' } else { '-' });
        mode.push(if bits & 2 != 0 { 'w' } else { '-' });
        mode.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let modified = meta
        .modified()
        .ok()
        .map(time::OffsetDateTime::from)
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    Some(json!({
        "name": name,
        "size": meta.len(),
        "mode": mode,
        "modTime": modified,
        "modifiedAt": modified,
        "isDir": meta.is_dir(),
        "owner": meta.uid().to_string(),
        "group": meta.gid().to_string(),
        "permissions": format!("{perm:04o}"),
    }))
}

struct Part {
    name: String,
    filename: Option<String>,
    data: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A `multipart/form-data` body's parts.
fn multipart(content_type: &str, body: &[u8]) -> Option<Vec<Part>> {
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))?
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let next_delimiter = format!("\r\n--{boundary}");
    let mut parts = Vec::new();
    let mut pos = find(body, delimiter.as_bytes())? + delimiter.len();
    loop {
        if body.get(pos..pos + 2)? == b"--" {
            return Some(parts);
        }
        pos += 2;
        let header_end = pos + find(&body[pos..], b"\r\n\r\n")?;
        let headers = String::from_utf8_lossy(&body[pos..header_end]).to_string();
        let data_start = header_end + 4;
        let data_end = data_start + find(&body[data_start..], next_delimiter.as_bytes())?;
        let mut name = String::new();
        let mut filename = None;
        for line in headers.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            if !key.trim().eq_ignore_ascii_case("content-disposition") {
                continue;
            }
            for param in value.split(';').map(str::trim) {
                if let Some(v) = param.strip_prefix("name=") {
                    name = v.trim_matches('"').to_string();
                } else if let Some(v) = param.strip_prefix("filename=") {
                    filename = Some(v.trim_matches('"').to_string());
                }
            }
        }
        parts.push(Part {
            name,
            filename,
            data: body[data_start..data_end].to_vec(),
        });
        pos = data_end + next_delimiter.len();
    }
}

/// `files[i].path` then `files[i].file`, as the daemon reads them.
fn bulk_upload(call: &Call, root: &Path) -> Answer {
    let Some(parts) = multipart(&call.content_type, &call.body) else {
        return json_answer(
            StatusCode::BAD_REQUEST,
            &json!({"errors": ["invalid multipart form"]}),
        );
    };
    let index = |name: &str| {
        name.trim_start_matches("files[")
            .trim_end_matches("].path")
            .trim_end_matches("].file")
            .to_string()
    };
    let mut dests: BTreeMap<String, String> = BTreeMap::new();
    let mut errors: Vec<String> = Vec::new();
    let mut files: Vec<Value> = Vec::new();
    for part in parts {
        if part.name.ends_with(".path") {
            let dest = String::from_utf8_lossy(&part.data).trim().to_string();
            if dest.is_empty() {
                errors.push(format!("path[{}]: empty path", index(&part.name)));
            } else {
                dests.insert(index(&part.name), dest);
            }
        } else if part.name.ends_with(".file") {
            let i = index(&part.name);
            let Some(dest) = dests.get(&i) else {
                errors.push(format!("file[{i}]: missing .path metadata"));
                continue;
            };
            let host = match map_path(root, dest) {
                Ok(h) => h,
                Err(e) => {
                    errors.push(format!("{dest}: {e}"));
                    continue;
                }
            };
            if let Some(parent) = host.parent() {
                if let Err(e) = std::fs::create_dir_all(parent) {
                    errors.push(format!("{dest}: mkdir: {e}"));
                    continue;
                }
            }
            match std::fs::write(&host, &part.data) {
                Ok(()) => files.push(json!({"path": dest, "bytes": part.data.len()})),
                Err(e) => errors.push(format!("{dest}: create: {e}")),
            }
        }
    }
    if errors.is_empty() {
        json_answer(StatusCode::OK, &json!({"files": files}))
    } else {
        json_answer(
            StatusCode::BAD_REQUEST,
            &json!({"errors": errors, "files": files}),
        )
    }
}

/// `{paths}` → a multipart answer: `file` parts, `error` parts (JSON) for failures.
fn bulk_download(call: &Call, root: &Path) -> Answer {
    let paths: Vec<String> = call
        .json()
        .and_then(|b| b["paths"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    if paths.is_empty() {
        return daemon_error(call, StatusCode::BAD_REQUEST, "paths are required");
    }
    let mut body = Vec::new();
    for path in &paths {
        let label = path.replace('"', "%22");
        let result = map_path(root, path)
            .map_err(|m| (StatusCode::BAD_REQUEST, m))
            .and_then(|host| match std::fs::metadata(&host) {
                Ok(m) if m.is_dir() => {
                    Err((StatusCode::BAD_REQUEST, "path must be a file".to_string()))
                }
                Ok(_) => std::fs::read(&host).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err((StatusCode::NOT_FOUND, format!("file not found: {path}")))
                }
                Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
            });
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match result {
            Ok(data) => {
                body.extend_from_slice(
                    format!(
                        "Content-Disposition: form-data; name=\"file\"; filename=\"{label}\"\r\n\
                         Content-Type: application/octet-stream\r\n\r\n"
                    )
                    .as_bytes(),
                );
                body.extend_from_slice(&data);
            }
            Err((status, message)) => {
                let code = if status == StatusCode::NOT_FOUND {
                    "FILE_NOT_FOUND"
                } else {
                    "INVALID_FILE_PATH"
                };
                body.extend_from_slice(
                    format!(
                        "Content-Disposition: form-data; name=\"error\"; filename=\"{label}\"\r\n\
                         Content-Type: application/json\r\n\r\n"
                    )
                    .as_bytes(),
                );
                body.extend_from_slice(
                    json!({"message": message, "statusCode": status.as_u16(), "code": code, "source": "DAYTONA_DAEMON"})
                        .to_string()
                        .as_bytes(),
                );
            }
        }
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    Response::builder()
        .header(
            header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}

/// `process/execute`: the command on `sh`'s stdin, stdout and stderr merged, in its own
/// process group, killed at the timeout.
async fn execute(call: &Call, root: &Path, sandbox_env: &BTreeMap<String, String>) -> Answer {
    let Some(request) = call.json() else {
        return daemon_error(call, StatusCode::BAD_REQUEST, "invalid request body");
    };
    let command = request["command"].as_str().unwrap_or("");
    if command.trim().is_empty() {
        return daemon_error(
            call,
            StatusCode::BAD_REQUEST,
            "command cannot be empty or whitespace-only",
        );
    }
    let envs = match string_map(&request["envs"]) {
        Ok(e) => e,
        Err(e) => return daemon_error(call, StatusCode::BAD_REQUEST, &format!("envs: {e}")),
    };
    let cwd = match request["cwd"].as_str() {
        Some(cwd) => match map_path(root, cwd) {
            Ok(p) => p,
            Err(m) => return daemon_error(call, StatusCode::BAD_REQUEST, &m),
        },
        None => map_path(root, HOME).expect("home"),
    };
    let home = map_path(root, HOME).expect("home");
    let mut cmd = tokio::process::Command::new("sh");
    cmd.current_dir(&cwd)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &home)
        .envs(sandbox_env)
        .envs(&envs)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return json_answer(
                StatusCode::OK,
                &json!({"exitCode": -1, "result": e.to_string()}),
            )
        }
    };
    let pid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        // Both streams into one, as the daemon collects them. Written aside, so a command
        // with much output cannot block on a full pipe while its script is still fed.
        let script = format!("exec 2>&1\n{command}");
        tokio::spawn(async move {
            let _ = stdin.write_all(script.as_bytes()).await;
        });
    }
    let timeout = request["timeout"]
        .as_u64()
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let waited = match timeout {
        Some(t) => tokio::time::timeout(t, child.wait_with_output()).await,
        None => Ok(child.wait_with_output().await),
    };
    match waited {
        Ok(Ok(out)) => json_answer(
            StatusCode::OK,
            &json!({
                "exitCode": out.status.code().unwrap_or(-1),
                "result": String::from_utf8_lossy(&out.stdout),
            }),
        ),
        Ok(Err(e)) => json_answer(
            StatusCode::OK,
            &json!({"exitCode": -1, "result": e.to_string()}),
        ),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: kill has no memory-safety preconditions; the group is this child's.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
            }
            daemon_error(
                call,
                StatusCode::REQUEST_TIMEOUT,
                "command execution timeout",
            )
        }
    }
}
