//! A fake Blaxel on a real socket: the control plane at `http://127.0.0.1:PORT/v0` and each
//! sandbox's own API at its `metadata.url`, `http://127.0.0.1:PORT/run/<name>` (the real one
//! is a host of its own; a path prefix keeps the fake on one socket, and clients only ever
//! append paths to `metadata.url`).
//!
//! `tests/it/blaxel_fake.rs::official_python_sdk_accepts_the_fake` proves it with the official
//! `blaxel` Python SDK 0.4.24 (`tests/sdk/blaxel_contract.py`): the SDK's own client creates a
//! labelled sandbox with envs and network settings, lists and reads it, runs commands (waited,
//! streamed as NDJSON, long-polled, their logs), writes, reads, lists and removes files, and
//! deletes the sandbox through it. Paths, fields and enums come from that SDK's generated
//! clients (`blaxel/core/client/api/compute/*`, `blaxel/core/sandbox/client/*`,
//! `blaxel/core/sandbox/default/*`); where it does not say (the status a code comes with, what
//! a refused transition answers) the choice is noted below.
//!
//! Implemented:
//! - Auth as the SDK sends it: `X-Blaxel-Authorization: Bearer <key>` and
//!   `X-Blaxel-Workspace: <workspace>` on both planes. Control-plane errors are the generic
//!   `{error, code: <status>}`, except on a create, whose errors are the SDK's `SandboxError`
//!   `{code: "<CODE>", message, status_code}`; the sandbox API's errors are `{error}`, the edge's
//!   (a sandbox that is absent or not deployed) `{error: {code, message, status}}`.
//! - `POST /v0/sandboxes[?createIfNotExist=true]`: `metadata` {`name` (lowercase letters,
//!   digits, single hyphens, ≤ 49; absent: one is assigned), `labels` (strings)}, `spec`
//!   {`runtime` {`image`, `memory`, `envs` `[{name, value}]`, `ports`}, `region` (one of
//!   [`REGIONS`], else 400 `INVALID_REGION`), `network` (recorded as sent)}. It answers once the
//!   sandbox is deployed (`DEPLOYING` → `DEPLOYED` after `boot_delay`), as the SDK expects
//!   ("a sandbox returned by create is ready to use"). A name in use is 409
//!   `SANDBOX_ALREADY_EXISTS`, or with `createIfNotExist` the existing sandbox (a `FAILED` or
//!   `TERMINATED` one is replaced). `GET /v0/sandboxes` (`limit` 1..=1000, `cursor`,
//!   `showTerminated`; `{data, meta{hasMore, nextCursor, total}}` with a `Blaxel-Version`
//!   header, a bare array without, as the SDK's comment says; no label filter, like Blaxel's),
//!   `GET /v0/sandboxes/{name}` (a `TERMINATED` one stays readable), `DELETE
//!   /v0/sandboxes/{name}` (`DELETING`, then `TERMINATED` after `delete_delay`; its processes
//!   are killed; 404 when absent or terminated, 409 `SANDBOX_DELETION_IN_PROGRESS` while
//!   deleting).
//! - Processes: `POST /process` {`command`, `name`, `env`, `workingDir`,
//!   `waitForCompletion`}: without waiting the process answers `running` at once; waiting, it
//!   answers the finished process, or, with `Accept: text/event-stream`, streams
//!   `application/x-ndjson` `{type: "stdout"|"stderr", data}` lines as output arrives and a
//!   last `{type: "result", data: "<process JSON>"}`. A name held by a running process is 400.
//!   `GET /process`, `GET /process/{name|pid}`, `GET .../wait?timeout=` (long poll),
//!   `GET .../logs` {`logs`, `stdout`, `stderr`}, `GET .../logs/stream` (`stdout:`/`stderr:`
//!   text lines), `DELETE /process/{id}` (SIGTERM) and `DELETE .../kill` (SIGKILL). Commands
//!   REALLY run: `sh -c <command>` in their own process group, cwd the sandbox's `/home/user`
//!   (a directory on the host) or `workingDir` inside the sandbox, the sandbox's and the
//!   request's env; `/home/user` in the command and in variable values is mapped to that host
//!   directory (the only mapping: other absolute paths in a command are the host's). Status
//!   `completed` (exit 0), `failed` (another exit) or `killed`.
//! - Files: `GET /filesystem/{path}` (a directory as `{path, name, files, subdirectories}`, a
//!   file as `{path, name, content, size, …}` or, with `Accept: application/octet-stream`, its
//!   bytes), `PUT` (`{content}`, `{isDirectory: true}` or multipart `file`; parents are made),
//!   `DELETE` (`?recursive=true` for a non-empty directory). Every path is taken from the
//!   sandbox's `/` (the SDK's `/filesystem//tmp/x` and `/filesystem/tmp/x` are the same file);
//!   `..` above `/` or a symlink out of the sandbox is refused (400).
//! - Test knobs: a fault [`FakeBlaxel::script`] for creates, [`FakeBlaxelConfig`], the
//!   inventory ([`FakeSandbox`] copies with their labels, envs and `network`), the processes
//!   run, the requests seen ([`SeenRequest`], no secrets), files.
//!
//! Deliberately not implemented: isolation (commands are the test's processes), egress
//! enforcement (`network` is recorded, not applied), previews, ports, sessions, volumes,
//! drives, snapshots, archives, schedules, code generation, stdin, standby, TTLs.

// Handlers answer a ready `Reply` as their error: its size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// Where commands start and the `/home/user` of a sandbox.
pub const HOME: &str = "/home/user";
/// The regions the fake accepts (the SDK's examples).
pub const REGIONS: &[&str] = &["us-pdx-1", "eu-lon-1", "us-was-1"];
const MAX_BODY: usize = 256 << 20;
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FakeBlaxelConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` create the sandbox stays out of listings.
    pub appear_after: Duration,
    /// `DEPLOYING` → `DEPLOYED` (or `FAILED`) takes this long.
    pub boot_delay: Duration,
    /// `DELETING` → `TERMINATED` takes this long.
    pub delete_delay: Duration,
}

impl Default for FakeBlaxelConfig {
    fn default() -> Self {
        FakeBlaxelConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            boot_delay: Duration::from_millis(100),
            delete_delay: Duration::from_millis(100),
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 403 `QUOTA_EXCEEDED` (Blaxel's nearest to "no capacity": the workspace's quota).
    Quota,
    /// 429 `RATE_LIMIT_EXCEEDED` with `Retry-After`.
    RateLimit,
    /// 503 `SERVICE_UNAVAILABLE`.
    Outage,
    /// 503 `AUTHENTICATION_UNAVAILABLE` (answered before anything is made).
    AuthUnavailable,
    /// The sandbox is made but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Made, then deploys into `FAILED` (answered 200 with that status).
    FailedBeforeRunning,
    /// `createIfNotExist` found the name live: the existing sandbox answered.
    Existing,
    /// Refused (400/409) before the script.
    Rejected,
}

impl CreateOutcome {
    fn parse(name: &str) -> Option<CreateOutcome> {
        Some(match name {
            "ok" => CreateOutcome::Ok,
            "quota" | "capacity" => CreateOutcome::Quota,
            "rate_limit" => CreateOutcome::RateLimit,
            "outage" => CreateOutcome::Outage,
            "auth_unavailable" => CreateOutcome::AuthUnavailable,
            "timeout_after_send" => CreateOutcome::TimeoutAfterSend,
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxStatus {
    Deploying,
    Deployed,
    Failed,
    Deleting,
    Terminated,
}

impl SandboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Deploying => "DEPLOYING",
            SandboxStatus::Deployed => "DEPLOYED",
            SandboxStatus::Failed => "FAILED",
            SandboxStatus::Deleting => "DELETING",
            SandboxStatus::Terminated => "TERMINATED",
        }
    }

    pub fn live(self) -> bool {
        matches!(self, SandboxStatus::Deploying | SandboxStatus::Deployed)
    }
}

/// A sandbox as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeSandbox {
    pub name: String,
    pub status: SandboxStatus,
    pub labels: BTreeMap<String, String>,
    /// `spec.runtime.envs` by name.
    pub envs: BTreeMap<String, String>,
    pub image: Option<String>,
    pub memory: Option<u64>,
    pub region: Option<String>,
    /// `spec.network` as sent (what its egress was set to).
    pub network: Option<Value>,
    /// The sandbox's `/` on the host.
    pub root: PathBuf,
    pub outcome: CreateOutcome,
}

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// The sandbox a data-plane call went to.
    pub sandbox: Option<String>,
    /// Whether `Blaxel-Version` was sent.
    pub versioned: bool,
    pub accept: Option<String>,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// One command the fake ran.
#[derive(Clone, Debug)]
pub struct FakeProcess {
    pub name: String,
    pub pid: String,
    pub sandbox: String,
    pub command: String,
    pub env: BTreeMap<String, String>,
    pub exit_code: Option<i32>,
    pub status: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

pub struct FakeBlaxel {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeBlaxel {
    pub async fn start(config: FakeBlaxelConfig) -> FakeBlaxel {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake Blaxel");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let (tick, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            config,
            api_key: format!("bl_fake_{}", random_hex(16)),
            workspace: "sandgate-test".to_string(),
            origin: format!("http://{addr}"),
            base,
            inner: Mutex::default(),
            tick,
        });
        let tasks = vec![
            tokio::spawn(accept(listener, shared.clone())),
            tokio::spawn(ticker(shared.clone())),
        ];
        FakeBlaxel {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT/v0`: the control plane's base (the SDK's `settings.base_url`).
    pub fn url(&self) -> String {
        format!("http://{}/v0", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    pub fn workspace(&self) -> &str {
        &self.shared.workspace
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `quota` (or `capacity`),
    /// `rate_limit`, `outage`, `auth_unavailable`, `timeout_after_send`,
    /// `failed_before_running`. Panics on another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Blaxel has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every create attempt's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn sandbox(&self, name: &str) -> Option<FakeSandbox> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner.sandboxes.get(name).map(|e| e.view.clone())
    }

    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner
            .order
            .iter()
            .filter_map(|n| inner.sandboxes.get(n).map(|e| e.view.clone()))
            .collect()
    }

    /// Sandboxes deploying or deployed.
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes()
            .into_iter()
            .filter(|s| s.status.live())
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

    /// The `spec.network` a sandbox was created with.
    pub fn network(&self, name: &str) -> Option<Value> {
        self.sandbox(name)?.network
    }

    pub fn environment(&self, name: &str) -> Option<BTreeMap<String, String>> {
        Some(self.sandbox(name)?.envs)
    }

    pub fn processes(&self) -> Vec<FakeProcess> {
        let inner = self.shared.lock();
        inner
            .process_order
            .iter()
            .filter_map(|key| inner.processes.get(key).map(|p| p.view()))
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }

    /// A file in a sandbox (an absolute path inside it).
    pub fn file(&self, name: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.sandbox(name)?.root;
        std::fs::read(resolve(&root, path).ok()?).ok()
    }
}

impl Drop for FakeBlaxel {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let inner = self.shared.lock();
        for p in inner.processes.values() {
            p.signal(libc::SIGKILL);
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeBlaxelConfig,
    api_key: String,
    workspace: String,
    origin: String,
    base: PathBuf,
    inner: Mutex<Inner>,
    /// Bumped on every change long polls and streams wait for.
    tick: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.tick.send_modify(|t| *t += 1);
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<CreateOutcome>,
    create_log: Vec<CreateOutcome>,
    sandboxes: HashMap<String, Entry>,
    order: Vec<String>,
    /// By `<sandbox>/<pid>`.
    processes: HashMap<String, Proc>,
    process_order: Vec<String>,
    next_pid: u64,
    seen: Vec<SeenRequest>,
}

struct Entry {
    view: FakeSandbox,
    since: Instant,
    created_at: String,
    fails: bool,
    hidden_until: Option<Instant>,
}

struct Proc {
    name: String,
    pid: String,
    sandbox: String,
    command: String,
    working_dir: String,
    env: BTreeMap<String, String>,
    os_pid: Option<u32>,
    started_at: String,
    completed_at: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Output in the order it was read: `(stdout?, bytes)`.
    chunks: Vec<(bool, Vec<u8>)>,
    exit: Option<i32>,
    killed: bool,
}

impl Proc {
    fn status(&self) -> &'static str {
        match self.exit {
            None => "running",
            Some(_) if self.killed => "killed",
            Some(0) => "completed",
            Some(_) => "failed",
        }
    }

    fn json(&self) -> Value {
        let logs: Vec<u8> = self.chunks.iter().flat_map(|(_, b)| b.clone()).collect();
        json!({
            "command": self.command,
            "completedAt": self.completed_at,
            "exitCode": self.exit.unwrap_or(0),
            "logs": String::from_utf8_lossy(&logs),
            "name": self.name,
            "pid": self.pid,
            "startedAt": self.started_at,
            "status": self.status(),
            "stderr": String::from_utf8_lossy(&self.stderr),
            "stdout": String::from_utf8_lossy(&self.stdout),
            "workingDir": self.working_dir,
        })
    }

    fn view(&self) -> FakeProcess {
        FakeProcess {
            name: self.name.clone(),
            pid: self.pid.clone(),
            sandbox: self.sandbox.clone(),
            command: self.command.clone(),
            env: self.env.clone(),
            exit_code: self.exit,
            status: self.status().to_string(),
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
        }
    }

    fn signal(&self, signal: i32) {
        if let (Some(pid), None) = (self.os_pid, self.exit) {
            // SAFETY: a plain syscall on a process group this fake started.
            unsafe {
                libc::kill(-(pid as i32), signal);
            }
        }
    }
}

impl Entry {
    fn set(&mut self, status: SandboxStatus) {
        self.view.status = status;
        self.since = Instant::now();
    }

    fn advance(&mut self, config: &FakeBlaxelConfig) {
        let elapsed = self.since.elapsed();
        let next = match self.view.status {
            SandboxStatus::Deploying if elapsed >= config.boot_delay => {
                if self.fails {
                    SandboxStatus::Failed
                } else {
                    SandboxStatus::Deployed
                }
            }
            SandboxStatus::Deleting if elapsed >= config.delete_delay => SandboxStatus::Terminated,
            _ => return,
        };
        self.set(next);
    }

    fn hidden(&self) -> bool {
        self.hidden_until.is_some_and(|t| Instant::now() < t)
    }
}

impl Inner {
    fn advance_all(&mut self, config: &FakeBlaxelConfig) {
        for e in self.sandboxes.values_mut() {
            e.advance(config);
        }
    }

    /// A process of `sandbox` by name (the newest holding it) or pid.
    fn process_key(&self, sandbox: &str, id: &str) -> Option<String> {
        let direct = format!("{sandbox}/{id}");
        if self.processes.contains_key(&direct) {
            return Some(direct);
        }
        self.process_order
            .iter()
            .rev()
            .find(|k| {
                self.processes
                    .get(*k)
                    .is_some_and(|p| p.sandbox == sandbox && p.name == id)
            })
            .cloned()
    }
}

async fn ticker(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let changed = {
            let mut inner = shared.lock();
            let before: Vec<SandboxStatus> =
                inner.sandboxes.values().map(|e| e.view.status).collect();
            inner.advance_all(&shared.config);
            let after: Vec<SandboxStatus> =
                inner.sandboxes.values().map(|e| e.view.status).collect();
            before != after
        };
        if changed {
            shared.bump();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Server plumbing
// ---------------------------------------------------------------------------------------

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, shared.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

struct Req {
    method: Method,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn param(&self, name: &str) -> Option<String> {
        parse_query(self.query.as_deref().unwrap_or(""))
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    fn accepts(&self, media: &str) -> bool {
        self.header("accept").is_some_and(|a| a.contains(media))
    }

    /// The JSON body (an empty body is `{}`); `Err` is the 400 in `shape`.
    fn json(&self, create: bool) -> Result<Value, Reply> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if v.is_object() => Ok(v),
            _ if create => Err(create_error(400, "PARSE_FAILED", "the body is not JSON")),
            _ => Err(sandbox_error(400, "the body is not a JSON object")),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Ok(sandbox_error(
                413,
                "the request body is too large or broken",
            ))
        }
    };
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let result = route(&shared, &req).await;
    let sandbox = req
        .path
        .strip_prefix("/run/")
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string);
    shared.lock().seen.push(SeenRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
        query: req.query.clone(),
        sandbox,
        versioned: req.header("blaxel-version").is_some(),
        accept: req.header("accept").map(str::to_string),
        status: result.as_ref().ok().map(|r| r.status().as_u16()),
    });
    result
}

async fn route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let create = req.method == Method::POST && req.path == "/v0/sandboxes";
    let key_ok = req
        .header("x-blaxel-authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|key| key == shared.api_key);
    if !key_ok {
        return Ok(if create {
            create_error(403, "UNAUTHORIZED", "Authorization failed")
        } else {
            api_error(401, "Unauthorized: missing or invalid credentials")
        });
    }
    if req.header("x-blaxel-workspace") != Some(shared.workspace.as_str()) {
        return Ok(if create {
            create_error(403, "UNAUTHORIZED_WORKSPACE", "no access to this workspace")
        } else {
            api_error(403, "no access to this workspace")
        });
    }
    if let Some(rest) = req.path.strip_prefix("/run/") {
        let (name, tail) = rest.split_once('/').unwrap_or((rest, ""));
        return data_plane(shared, req, &percent_decode(name), &format!("/{tail}")).await;
    }
    let segments: Vec<String> = req
        .path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    Ok(match (&req.method, s.as_slice()) {
        (&Method::POST, ["v0", "sandboxes"]) => return create_sandbox(shared, req).await,
        (&Method::GET, ["v0", "sandboxes"]) => list_sandboxes(shared, req),
        (&Method::GET, ["v0", "sandboxes", name]) => match sandbox_json(shared, name) {
            Some(v) => json_reply(200, &v),
            None => api_error(404, format!("Sandbox {name} not found")),
        },
        (&Method::DELETE, ["v0", "sandboxes", name]) => delete_sandbox(shared, name),
        _ => api_error(404, format!("no route for {} {}", req.method, req.path)),
    })
}

// ---------------------------------------------------------------------------------------
// Control plane
// ---------------------------------------------------------------------------------------

fn sandbox_json(shared: &Shared, name: &str) -> Option<Value> {
    let mut inner = shared.lock();
    let e = inner.sandboxes.get_mut(name)?;
    e.advance(&shared.config);
    Some(entry_json(shared, e))
}

fn entry_json(shared: &Shared, e: &Entry) -> Value {
    let v = &e.view;
    let envs: Vec<Value> = v
        .envs
        .iter()
        .map(|(k, val)| json!({"name": k, "value": val}))
        .collect();
    let mut spec = json!({"runtime": {"envs": envs}});
    if let Some(image) = &v.image {
        spec["runtime"]["image"] = json!(image);
    }
    if let Some(memory) = v.memory {
        spec["runtime"]["memory"] = json!(memory);
    }
    if let Some(region) = &v.region {
        spec["region"] = json!(region);
    }
    if let Some(network) = &v.network {
        spec["network"] = network.clone();
    }
    let errors = if v.status == SandboxStatus::Failed {
        json!([{"fatal": true, "message": "the sandbox's image failed to start"}])
    } else {
        json!([])
    };
    json!({
        "metadata": {
            "name": v.name,
            "labels": v.labels,
            "url": format!("{}/run/{}", shared.origin, v.name),
            "workspace": shared.workspace,
            "createdAt": e.created_at,
        },
        "spec": spec,
        "status": v.status.as_str(),
        "errors": errors,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 49
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

struct Parsed {
    name: String,
    labels: BTreeMap<String, String>,
    envs: BTreeMap<String, String>,
    image: Option<String>,
    memory: Option<u64>,
    region: Option<String>,
    network: Option<Value>,
}

fn parse_create(body: &Value) -> Result<Parsed, Reply> {
    let invalid = |m: String| create_error(400, "VALIDATION_FAILED", m);
    let name = match &body["metadata"]["name"] {
        Value::Null => format!("sandbox-{}", random_hex(4)),
        Value::String(n) if valid_name(n) => n.clone(),
        other => return Err(invalid(format!("invalid sandbox name {other}"))),
    };
    let mut labels = BTreeMap::new();
    match &body["metadata"]["labels"] {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                let v = v
                    .as_str()
                    .ok_or_else(|| invalid(format!("label {k} must be a string")))?;
                labels.insert(k.clone(), v.to_string());
            }
        }
        _ => return Err(invalid("metadata.labels must be an object".into())),
    }
    let runtime = &body["spec"]["runtime"];
    let mut envs = BTreeMap::new();
    match &runtime["envs"] {
        Value::Null => {}
        Value::Array(items) => {
            for item in items {
                let (Some(k), Some(v)) = (item["name"].as_str(), item["value"].as_str()) else {
                    return Err(invalid("envs are [{name, value}] strings".into()));
                };
                envs.insert(k.to_string(), v.to_string());
            }
        }
        _ => return Err(invalid("spec.runtime.envs must be a list".into())),
    }
    let region = match &body["spec"]["region"] {
        Value::Null => None,
        Value::String(r) if REGIONS.contains(&r.as_str()) => Some(r.clone()),
        other => {
            return Err(create_error(
                400,
                "INVALID_REGION",
                format!("region {other} is not available"),
            ))
        }
    };
    let network = match &body["spec"]["network"] {
        Value::Null => None,
        v @ Value::Object(_) => Some(v.clone()),
        _ => return Err(invalid("spec.network must be an object".into())),
    };
    Ok(Parsed {
        name,
        labels,
        envs,
        image: runtime["image"].as_str().map(str::to_string),
        memory: runtime["memory"].as_u64(),
        region,
        network,
    })
}

async fn create_sandbox(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let reject = |shared: &Shared, reply: Reply| {
        shared.lock().create_log.push(CreateOutcome::Rejected);
        Ok(reply)
    };
    let parsed = match req.json(true).and_then(|b| parse_create(&b)) {
        Ok(p) => p,
        Err(reply) => return reject(shared, reply),
    };
    let if_absent = req.param("createIfNotExist").as_deref() == Some("true");
    let name = parsed.name.clone();
    // An existing name: refused, or (createIfNotExist) answered as it is, or replaced.
    let existing = shared.lock().sandboxes.get_mut(&name).map(|e| {
        e.advance(&shared.config);
        e.view.status
    });
    match existing {
        Some(SandboxStatus::Deleting) => {
            let reply = create_error(409, "SANDBOX_DELETION_IN_PROGRESS", "being deleted");
            return reject(shared, reply);
        }
        Some(_) if !if_absent => {
            let m = format!("sandbox {name} already exists");
            return reject(shared, create_error(409, "SANDBOX_ALREADY_EXISTS", m));
        }
        Some(SandboxStatus::Deploying | SandboxStatus::Deployed) => {
            shared.lock().create_log.push(CreateOutcome::Existing);
            return Ok(answer_when_settled(shared, &name).await);
        }
        _ => {}
    }
    let outcome;
    {
        let mut inner = shared.lock();
        outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        match outcome {
            CreateOutcome::Quota => {
                return Ok(create_error(403, "QUOTA_EXCEEDED", "sandbox quota reached"))
            }
            CreateOutcome::RateLimit => {
                let mut reply = create_error(429, "RATE_LIMIT_EXCEEDED", "too many requests");
                let secs = shared.config.retry_after_secs.to_string();
                reply
                    .headers_mut()
                    .insert("retry-after", secs.parse().expect("a header value"));
                return Ok(reply);
            }
            CreateOutcome::Outage => {
                return Ok(create_error(503, "SERVICE_UNAVAILABLE", "try again later"))
            }
            CreateOutcome::AuthUnavailable => {
                return Ok(create_error(
                    503,
                    "AUTHENTICATION_UNAVAILABLE",
                    "the credential store is unreachable",
                ))
            }
            _ => {}
        }
        let root = shared.base.join(format!("{name}-{}", random_hex(4)));
        std::fs::create_dir_all(root.join("home/user"))?;
        let view = FakeSandbox {
            name: name.clone(),
            status: SandboxStatus::Deploying,
            labels: parsed.labels,
            envs: parsed.envs,
            image: parsed.image,
            memory: parsed.memory,
            region: parsed.region,
            network: parsed.network,
            root,
            outcome,
        };
        let hidden_until = (outcome == CreateOutcome::TimeoutAfterSend
            && !shared.config.appear_after.is_zero())
        .then(|| Instant::now() + shared.config.appear_after);
        let entry = Entry {
            view,
            since: Instant::now(),
            created_at: httpdate::fmt_http_date(SystemTime::now()),
            fails: outcome == CreateOutcome::FailedBeforeRunning,
            hidden_until,
        };
        if inner.sandboxes.insert(name.clone(), entry).is_none() {
            inner.order.push(name.clone());
        }
    }
    shared.bump();
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    Ok(answer_when_settled(shared, &name).await)
}

/// The sandbox once it has left `DEPLOYING` (Blaxel's create answers a ready sandbox).
async fn answer_when_settled(shared: &Arc<Shared>, name: &str) -> Reply {
    let mut rx = shared.tick.subscribe();
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        let deploying = shared
            .lock()
            .sandboxes
            .get_mut(name)
            .map(|e| {
                e.advance(&shared.config);
                e.view.status == SandboxStatus::Deploying
            })
            .unwrap_or(false);
        if !deploying || Instant::now() >= deadline {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), rx.changed()).await;
    }
    match sandbox_json(shared, name) {
        Some(v) => json_reply(200, &v),
        None => api_error(404, format!("Sandbox {name} not found")),
    }
}

fn list_sandboxes(shared: &Shared, req: &Req) -> Reply {
    let limit = match req.param("limit") {
        Some(l) => match l.parse::<usize>() {
            Ok(l) if (1..=1000).contains(&l) => l,
            _ => return api_error(400, "limit must be 1..=1000"),
        },
        None => 50,
    };
    let start = match req.param("cursor").filter(|c| !c.is_empty()) {
        Some(c) => match c.strip_prefix("c").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return api_error(400, "invalid cursor"),
        },
        None => 0,
    };
    let show_terminated = req.param("showTerminated").as_deref() == Some("true");
    let mut inner = shared.lock();
    inner.advance_all(&shared.config);
    let visible: Vec<Value> = inner
        .order
        .iter()
        .filter_map(|n| inner.sandboxes.get(n))
        .filter(|e| !e.hidden())
        .filter(|e| show_terminated || e.view.status != SandboxStatus::Terminated)
        .map(|e| entry_json(shared, e))
        .collect();
    let page: Vec<Value> = visible.iter().skip(start).take(limit).cloned().collect();
    let has_more = start + page.len() < visible.len();
    if req.header("blaxel-version").is_none() {
        // The API's legacy answer: a bare array, the cursor ignored.
        return json_reply(200, &json!(visible.iter().take(limit).collect::<Vec<_>>()));
    }
    let next = if has_more {
        json!(format!("c{}", start + page.len()))
    } else {
        Value::Null
    };
    json_reply(
        200,
        &json!({
            "data": page,
            "meta": {"hasMore": has_more, "nextCursor": next, "total": visible.len()},
        }),
    )
}

fn delete_sandbox(shared: &Arc<Shared>, name: &str) -> Reply {
    let reply = {
        let mut inner = shared.lock();
        let Some(e) = inner.sandboxes.get_mut(name) else {
            return api_error(404, format!("Sandbox {name} not found"));
        };
        e.advance(&shared.config);
        match e.view.status {
            SandboxStatus::Terminated => {
                return api_error(404, format!("Sandbox {name} not found"))
            }
            SandboxStatus::Deleting => {
                return create_error(409, "SANDBOX_DELETION_IN_PROGRESS", "already deleting")
            }
            _ => {}
        }
        e.set(SandboxStatus::Deleting);
        let reply = json_reply(200, &entry_json(shared, e));
        for p in inner.processes.values().filter(|p| p.sandbox == name) {
            p.signal(libc::SIGKILL);
        }
        reply
    };
    shared.bump();
    reply
}

// ---------------------------------------------------------------------------------------
// Data plane: processes
// ---------------------------------------------------------------------------------------

async fn data_plane(
    shared: &Arc<Shared>,
    req: &Req,
    name: &str,
    tail: &str,
) -> Result<Reply, io::Error> {
    let root = {
        let mut inner = shared.lock();
        match inner.sandboxes.get_mut(name) {
            None => return Ok(edge_error(404, "WORKLOAD_NOT_FOUND", "no such sandbox")),
            Some(e) => {
                e.advance(&shared.config);
                if e.view.status != SandboxStatus::Deployed {
                    let m = format!("the sandbox is {}", e.view.status.as_str());
                    return Ok(edge_error(503, "WORKLOAD_UNAVAILABLE", &m));
                }
                e.view.root.clone()
            }
        }
    };
    if let Some(path) = tail.strip_prefix("/filesystem/") {
        return Ok(filesystem(req, &root, &percent_decode(path)));
    }
    let segments: Vec<String> = tail
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    Ok(match (&req.method, s.as_slice()) {
        (&Method::POST, ["process"]) => start_process(shared, req, name, &root).await,
        (&Method::GET, ["process"]) => {
            let inner = shared.lock();
            let all: Vec<Value> = inner
                .process_order
                .iter()
                .filter_map(|k| inner.processes.get(k))
                .filter(|p| p.sandbox == name)
                .map(Proc::json)
                .collect();
            json_reply(200, &json!(all))
        }
        (&Method::GET, ["process", id]) => {
            with_process(shared, name, id, |p| json_reply(200, &p.json()))
        }
        (&Method::GET, ["process", id, "wait"]) => {
            let secs = req
                .param("timeout")
                .and_then(|t| t.parse::<f64>().ok())
                .unwrap_or(30.0)
                .clamp(0.0, 60.0);
            let key = shared.lock().process_key(name, id);
            if let Some(key) = key {
                wait_process(shared, &key, secs).await;
            }
            with_process(shared, name, id, |p| json_reply(200, &p.json()))
        }
        (&Method::GET, ["process", id, "logs"]) => with_process(shared, name, id, |p| {
            let logs: Vec<u8> = p.chunks.iter().flat_map(|(_, b)| b.clone()).collect();
            json_reply(
                200,
                &json!({
                    "logs": String::from_utf8_lossy(&logs),
                    "stdout": String::from_utf8_lossy(&p.stdout),
                    "stderr": String::from_utf8_lossy(&p.stderr),
                }),
            )
        }),
        (&Method::GET, ["process", id, "logs", "stream"]) => log_stream(shared, name, id),
        (&Method::DELETE, ["process", id]) => signal_process(shared, name, id, libc::SIGTERM),
        (&Method::DELETE, ["process", id, "kill"]) => {
            signal_process(shared, name, id, libc::SIGKILL)
        }
        _ => sandbox_error(404, format!("no route for {} {tail}", req.method)),
    })
}

fn with_process(shared: &Shared, sandbox: &str, id: &str, f: impl FnOnce(&Proc) -> Reply) -> Reply {
    let inner = shared.lock();
    match inner
        .process_key(sandbox, id)
        .and_then(|k| inner.processes.get(&k))
    {
        Some(p) => f(p),
        None => sandbox_error(404, format!("process {id} not found")),
    }
}

fn signal_process(shared: &Shared, sandbox: &str, id: &str, signal: i32) -> Reply {
    let mut inner = shared.lock();
    let Some(key) = inner.process_key(sandbox, id) else {
        return sandbox_error(404, format!("process {id} not found"));
    };
    let Some(p) = inner.processes.get_mut(&key) else {
        return sandbox_error(404, format!("process {id} not found"));
    };
    if p.exit.is_none() {
        p.killed = true;
        p.signal(signal);
    }
    json_reply(200, &json!({"message": "process stopped"}))
}

fn map_home(text: &str, home: &Path) -> String {
    text.replace(HOME, &home.to_string_lossy())
}

async fn start_process(shared: &Arc<Shared>, req: &Req, sandbox: &str, root: &Path) -> Reply {
    let body = match req.json(false) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(command) = body["command"].as_str().map(str::to_string) else {
        return sandbox_error(400, "command is required");
    };
    let mut env = BTreeMap::new();
    match &body["env"] {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return sandbox_error(400, format!("env {k} must be a string"));
                };
                env.insert(k.clone(), v.to_string());
            }
        }
        _ => return sandbox_error(400, "env must be an object"),
    }
    let working_dir = body["workingDir"].as_str().unwrap_or(HOME).to_string();
    let cwd = match resolve(root, &working_dir) {
        Ok(dir) if dir.is_dir() => dir,
        _ => {
            return sandbox_error(
                400,
                format!("working directory {working_dir} does not exist"),
            )
        }
    };
    let name = body["name"].as_str().map(str::to_string);
    if let Some(n) = &name {
        let inner = shared.lock();
        let running = inner
            .processes
            .values()
            .any(|p| p.sandbox == sandbox && &p.name == n && p.exit.is_none());
        if running {
            return sandbox_error(400, format!("a process named {n} is already running"));
        }
    }
    let key = match spawn(
        shared,
        sandbox,
        root,
        &cwd,
        &working_dir,
        &command,
        name,
        env,
    ) {
        Ok(k) => k,
        Err(e) => return sandbox_error(500, format!("the command could not start: {e}")),
    };
    if body["waitForCompletion"] != json!(true) {
        return with_key(shared, &key, |p| json_reply(200, &p.json()));
    }
    if req.accepts("text/event-stream") {
        return ndjson_stream(shared.clone(), key);
    }
    wait_process(shared, &key, 600.0).await;
    with_key(shared, &key, |p| json_reply(200, &p.json()))
}

fn with_key(shared: &Shared, key: &str, f: impl FnOnce(&Proc) -> Reply) -> Reply {
    match shared.lock().processes.get(key) {
        Some(p) => f(p),
        None => sandbox_error(404, "process not found"),
    }
}

async fn wait_process(shared: &Arc<Shared>, key: &str, secs: f64) -> bool {
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    let mut rx = shared.tick.subscribe();
    loop {
        if shared
            .lock()
            .processes
            .get(key)
            .is_none_or(|p| p.exit.is_some())
        {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), rx.changed()).await;
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    shared: &Arc<Shared>,
    sandbox: &str,
    root: &Path,
    cwd: &Path,
    working_dir: &str,
    command: &str,
    name: Option<String>,
    env: BTreeMap<String, String>,
) -> io::Result<String> {
    let home = root.join("home/user");
    let sandbox_env = shared
        .lock()
        .sandboxes
        .get(sandbox)
        .map(|e| e.view.envs.clone())
        .unwrap_or_default();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(map_home(command, &home))
        .current_dir(cwd)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &home)
        .envs(
            sandbox_env
                .iter()
                .chain(env.iter())
                .map(|(k, v)| (k.clone(), map_home(v, &home))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let key = {
        let mut inner = shared.lock();
        inner.next_pid += 1;
        let pid = (1000 + inner.next_pid).to_string();
        let key = format!("{sandbox}/{pid}");
        inner.processes.insert(
            key.clone(),
            Proc {
                name: name.unwrap_or_else(|| format!("proc-{pid}")),
                pid,
                sandbox: sandbox.to_string(),
                command: command.to_string(),
                working_dir: working_dir.to_string(),
                env,
                os_pid: child.id(),
                started_at: httpdate::fmt_http_date(SystemTime::now()),
                completed_at: String::new(),
                stdout: Vec::new(),
                stderr: Vec::new(),
                chunks: Vec::new(),
                exit: None,
                killed: false,
            },
        );
        inner.process_order.push(key.clone());
        key
    };
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let shared = shared.clone();
    let id = key.clone();
    tokio::spawn(async move {
        let readers = [
            stdout.map(|s| tokio::spawn(read_into(shared.clone(), id.clone(), Box::new(s), true))),
            stderr.map(|s| tokio::spawn(read_into(shared.clone(), id.clone(), Box::new(s), false))),
        ];
        let status = child.wait().await;
        for reader in readers.into_iter().flatten() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(OUTPUT_GRACE, reader).await.is_err() {
                abort.abort();
            }
        }
        let code = match status {
            Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)),
            Err(_) => 255,
        };
        if let Some(p) = shared.lock().processes.get_mut(&id) {
            p.exit = Some(code);
            p.completed_at = httpdate::fmt_http_date(SystemTime::now());
        }
        shared.bump();
    });
    Ok(key)
}

async fn read_into(
    shared: Arc<Shared>,
    key: String,
    mut pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stdout: bool,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Some(p) = shared.lock().processes.get_mut(&key) {
                    if stdout {
                        p.stdout.extend_from_slice(&buf[..n]);
                    } else {
                        p.stderr.extend_from_slice(&buf[..n]);
                    }
                    p.chunks.push((stdout, buf[..n].to_vec()));
                }
                shared.bump();
            }
        }
    }
}

/// `POST /process` waiting with `Accept: text/event-stream`: NDJSON output lines as they
/// arrive, then the result.
fn ndjson_stream(shared: Arc<Shared>, key: String) -> Reply {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(16);
    tokio::spawn(async move {
        let mut sent = 0;
        let mut ticks = shared.tick.subscribe();
        loop {
            let (chunks, done) = {
                let inner = shared.lock();
                let Some(p) = inner.processes.get(&key) else {
                    return;
                };
                (p.chunks[sent..].to_vec(), p.exit.is_some())
            };
            sent += chunks.len();
            for (stdout, bytes) in chunks {
                let line = json!({
                    "type": if stdout { "stdout" } else { "stderr" },
                    "data": String::from_utf8_lossy(&bytes),
                });
                if tx.send(Ok(Frame::data(ndjson(&line)))).await.is_err() {
                    return;
                }
            }
            if done {
                let result = shared
                    .lock()
                    .processes
                    .get(&key)
                    .map(|p| p.json().to_string())
                    .unwrap_or_default();
                let line = json!({"type": "result", "data": result});
                let _ = tx.send(Ok(Frame::data(ndjson(&line)))).await;
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), ticks.changed()).await;
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/x-ndjson")
        .body(ChannelBody(rx).boxed())
        .expect("a response")
}

fn ndjson(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).expect("JSON");
    line.push(b'\n');
    Bytes::from(line)
}

/// `GET /process/{id}/logs/stream`: `stdout:`/`stderr:` text lines until the process ends.
fn log_stream(shared: &Arc<Shared>, sandbox: &str, id: &str) -> Reply {
    let Some(key) = shared.lock().process_key(sandbox, id) else {
        return sandbox_error(404, format!("process {id} not found"));
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(16);
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut sent = 0;
        let mut ticks = shared.tick.subscribe();
        loop {
            let (chunks, done) = {
                let inner = shared.lock();
                let Some(p) = inner.processes.get(&key) else {
                    return;
                };
                (p.chunks[sent..].to_vec(), p.exit.is_some())
            };
            sent += chunks.len();
            for (stdout, bytes) in chunks {
                let prefix = if stdout { "stdout:" } else { "stderr:" };
                let mut text = String::new();
                for line in String::from_utf8_lossy(&bytes).lines() {
                    text.push_str(prefix);
                    text.push_str(line);
                    text.push('\n');
                }
                if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), ticks.changed()).await;
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/plain")
        .body(ChannelBody(rx).boxed())
        .expect("a response")
}

// ---------------------------------------------------------------------------------------
// Data plane: files
// ---------------------------------------------------------------------------------------

/// `path` inside a sandbox (every path from its `/`) on the host.
pub fn resolve(root: &Path, path: &str) -> Result<PathBuf, String> {
    if path.contains('\0') {
        return Err("the path holds NUL".into());
    }
    let mut parts: Vec<String> = Vec::new();
    for c in Path::new(&format!("/{path}")).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(format!("{path} leads outside the sandbox"));
                }
            }
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::Prefix(_) => return Err("a path prefix".into()),
        }
    }
    let mut out = root.to_path_buf();
    for p in &parts {
        out.push(p);
    }
    // A symlink on the way out of the sandbox is refused.
    let mut probe = out.clone();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if let Ok(real) = probe.canonicalize() {
        if !real.starts_with(root) {
            return Err(format!("{path} leads outside the sandbox"));
        }
    }
    Ok(out)
}

fn filesystem(req: &Req, root: &Path, path: &str) -> Reply {
    let host = match resolve(root, path) {
        Ok(h) => h,
        Err(m) => return sandbox_error(400, m),
    };
    let shown = format!("/{}", path.trim_start_matches('/'));
    match req.method {
        Method::GET => read_path(req, &host, &shown),
        Method::PUT => write_path(req, &host, &shown),
        Method::DELETE => {
            let recursive = req.param("recursive").as_deref() == Some("true");
            let result = match std::fs::symlink_metadata(&host) {
                Err(_) => return sandbox_error(404, format!("{shown} not found")),
                Ok(m) if m.is_dir() && recursive => std::fs::remove_dir_all(&host),
                Ok(m) if m.is_dir() => std::fs::remove_dir(&host),
                Ok(_) => std::fs::remove_file(&host),
            };
            match result {
                Ok(()) => success(&shown, "Path deleted"),
                Err(e) => sandbox_error(400, format!("cannot delete {shown}: {e}")),
            }
        }
        _ => sandbox_error(405, "method not allowed"),
    }
}

fn file_json(host: &Path, shown: &str) -> Value {
    let meta = std::fs::metadata(host).ok();
    json!({
        "path": shown,
        "name": host.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "size": meta.as_ref().map(|m| m.len()).unwrap_or(0),
        "permissions": "0644",
        "owner": "root",
        "group": "root",
        "lastModified": httpdate::fmt_http_date(
            meta.and_then(|m| m.modified().ok()).unwrap_or(UNIX_EPOCH)
        ),
    })
}

fn read_path(req: &Req, host: &Path, shown: &str) -> Reply {
    if host.is_dir() {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(host)
            .map(|r| r.flatten().collect())
            .unwrap_or_default();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let child = format!(
                "{}/{}",
                shown.trim_end_matches('/'),
                entry.file_name().to_string_lossy()
            );
            if entry.path().is_dir() {
                dirs.push(json!({"name": entry.file_name().to_string_lossy(), "path": child}));
            } else {
                files.push(file_json(&entry.path(), &child));
            }
        }
        return json_reply(
            200,
            &json!({
                "path": shown,
                "name": host.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                "files": files,
                "subdirectories": dirs,
            }),
        );
    }
    match std::fs::read(host) {
        Ok(bytes) if req.accepts("application/octet-stream") => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(full(bytes))
            .expect("a response"),
        Ok(bytes) => {
            let mut v = file_json(host, shown);
            v["content"] = json!(String::from_utf8_lossy(&bytes));
            json_reply(200, &v)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            sandbox_error(404, format!("{shown} not found"))
        }
        Err(e) => sandbox_error(400, format!("cannot read {shown}: {e}")),
    }
}

fn write_path(req: &Req, host: &Path, shown: &str) -> Reply {
    let content_type = req.header("content-type").unwrap_or_default();
    let data: Vec<u8> = if let Some(boundary) = content_type
        .strip_prefix("multipart/form-data")
        .and_then(|rest| rest.split("boundary=").nth(1))
    {
        let boundary = boundary.trim_matches('"');
        match multipart(&req.body, boundary)
            .into_iter()
            .find(|(name, _)| name == "file")
        {
            Some((_, data)) => data,
            None => return sandbox_error(400, "the multipart body has no file"),
        }
    } else {
        let body = match req.json(false) {
            Ok(b) => b,
            Err(r) => return r,
        };
        if body["isDirectory"] == json!(true) {
            return match std::fs::create_dir_all(host) {
                Ok(()) => success(shown, "Directory created"),
                Err(e) => sandbox_error(400, format!("cannot create {shown}: {e}")),
            };
        }
        match body["content"].as_str() {
            Some(text) => text.as_bytes().to_vec(),
            None => return sandbox_error(400, "content is required"),
        }
    };
    if let Some(parent) = host.parent() {
        if let Err(e) = std::fs::create_dir_all(parent) {
            return sandbox_error(400, format!("cannot create the parents of {shown}: {e}"));
        }
    }
    match std::fs::write(host, data) {
        Ok(()) => success(shown, "File created successfully"),
        Err(e) => sandbox_error(400, format!("cannot write {shown}: {e}")),
    }
}

fn success(path: &str, message: &str) -> Reply {
    json_reply(200, &json!({"message": message, "path": path}))
}

fn multipart(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let mut out = Vec::new();
    let mut positions = Vec::new();
    let mut i = 0;
    while i + d.len() <= body.len() {
        if &body[i..i + d.len()] == d {
            positions.push(i);
            i += d.len();
        } else {
            i += 1;
        }
    }
    for pair in positions.windows(2) {
        let part = &body[pair[0] + d.len()..pair[1]];
        let part = part.strip_prefix(b"\r\n").unwrap_or(part);
        let Some(split) = part.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let headers = String::from_utf8_lossy(&part[..split]);
        let mut data = &part[split + 4..];
        data = data.strip_suffix(b"\r\n").unwrap_or(data);
        let name = headers
            .split(';')
            .filter_map(|h| h.trim().strip_prefix("name="))
            .next()
            .map(|n| n.trim_matches('"').to_string());
        if let Some(name) = name {
            out.push((name, data.to_vec()));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------

struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, io::Error>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0.poll_recv(cx)
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn json_reply(status: u16, value: &Value) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(value).expect("JSON")))
        .expect("a response")
}

/// The control plane's generic error (`Error`: `{error, code: <status>, message}`).
fn api_error(status: u16, message: impl Into<String>) -> Reply {
    let message = message.into();
    json_reply(
        status,
        &json!({"error": message, "code": status, "message": message}),
    )
}

/// A create's error (`SandboxError`: `{code, message, status_code}`).
fn create_error(status: u16, code: &str, message: impl Into<String>) -> Reply {
    json_reply(
        status,
        &json!({"code": code, "message": message.into(), "status_code": status}),
    )
}

/// The sandbox API's error (`ErrorResponse`: `{error}`).
fn sandbox_error(status: u16, message: impl Into<String>) -> Reply {
    json_reply(status, &json!({"error": message.into()}))
}

/// The edge's error envelope (a sandbox that cannot be reached).
fn edge_error(status: u16, code: &str, message: &str) -> Reply {
    json_reply(
        status,
        &json!({"error": {"code": code, "message": message, "status": status, "origin": "platform"}}),
    )
}

fn random_hex(len: usize) -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    bytes.iter().take(len).map(|b| format!("{b:02x}")).collect()
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                percent_decode(&key.replace('+', " ")),
                percent_decode(&value.replace('+', " ")),
            )
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}
