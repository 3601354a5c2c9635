//! A fake Runloop on a real socket: the REST API at `RUNLOOP_BASE_URL`
//! (`http://127.0.0.1:PORT`, HTTP/1.1 or h2c).
//!
//! `tests/it/runloop_fake.rs::official_python_sdk_accepts_the_fake` proves it with the official
//! `runloop-api-client` Python SDK 3.0.0 (`tests/sdk/runloop_contract.py`): the SDK's own
//! client creates a network policy and a devbox with it, waits for `running`, executes
//! commands (streamed stdout/stderr, exit codes), moves files, lists, suspends, resumes and
//! shuts down through it. Paths, fields and status enums come from that SDK's generated
//! client (`resources/devboxes/*`, `network_policies.py`, `types/*`); where the SDK does not
//! say (error bodies, idempotency on the server, what a refused transition answers) the
//! choice is noted below.
//!
//! Implemented:
//! - `Authorization: Bearer <key>`; errors are JSON `{"code": "<status>", "message"}` (the
//!   shape Runloop's SSE `error` events carry; the SDKs read only the status and the body).
//! - Devboxes: `POST /v1/devboxes` and `/v1/devboxes/create_and_await_running` (one of
//!   `blueprint_id` / `blueprint_name` / `snapshot_id`; `metadata`, `environment_variables`,
//!   `launch_parameters` with `network_policy_id` that must name a policy; `x-request-id` is
//!   honoured as an idempotency key), `GET /v1/devboxes` (`limit` 1..=5000, `starting_after`,
//!   `status`, newest first, `has_more`, `total_count`; no metadata filter, like Runloop's),
//!   `GET /v1/devboxes/{id}`, `POST .../wait_for_status` (`statuses`, `timeout_seconds` ≤ 30;
//!   408 when it runs out), `shutdown`, `suspend`, `resume`, `keep_alive`, `snapshot_disk`
//!   (a copy of the devbox's files usable as a `snapshot_id`), `POST
//!   /v1/devboxes/disk_snapshots/{id}/delete`. Status machine: `provisioning` →
//!   `initializing` → `running` (each half of `boot_delay`), `suspending` → `suspended`,
//!   `resuming` → `running` (`transition_delay`), `shutdown`; a scripted
//!   `failed_before_running` boots into `failure`. A transition from the wrong state is 400.
//! - Executions: `POST .../execute_async` {command}, `POST .../execute` {command,
//!   command_id, optimistic_timeout} (the same `command_id` is the same execution),
//!   `POST .../execute_sync`, `GET .../executions/{eid}`, `POST .../executions/{eid}/
//!   wait_for_status` (≤ 25 s, 408), `POST .../executions/{eid}/kill`, and the SSE streams
//!   `GET .../executions/{eid}/stream_stdout_updates|stream_stderr_updates?offset=N`
//!   (`data: {"output", "offset"}` per chunk, `offset` being the byte offset after the chunk;
//!   the stream ends once the command has and its output is sent). Commands REALLY run:
//!   `sh -c <command>` in their own process group, cwd the devbox's `/home/user` (a
//!   directory on the host), `HOME`/`USER`/`PATH` and the devbox's environment variables; every
//!   `/home/user` in the command line and in variable values is mapped to that host directory
//!   (the only mapping there is: other absolute paths are the host's). `exit_status` is the
//!   exit code, or 128 + the signal. A devbox not `running` answers 409.
//! - Files: `POST .../read_file_contents` {file_path} (text/plain), `write_file_contents`
//!   {file_path, contents}, `download_file` {path} (bytes), `upload_file` (multipart `path`,
//!   `file`). Paths are relative to `/home/user` or absolute, resolved inside the devbox's
//!   directory; `..` above `/` or a symlink out of it is refused (400); a missing parent
//!   directory is 400 (the adapter creates it first).
//! - Network policies: `POST /v1/network-policies` (IPv4 CIDRs in canonical form, ports
//!   1..=65535), `GET /v1/network-policies` (`name` partial match, `id`, `limit`,
//!   `starting_after`), `GET /v1/network-policies/{id}`, `POST .../{id}/delete`.
//! - Test knobs: a fault [`FakeRunloop::script`] for creates, [`FakeRunloopConfig`], the
//!   inventory ([`FakeDevbox`] copies with their environment, metadata and attached policy),
//!   the requests seen ([`SeenRequest`], no secrets), files.
//!
//! Deliberately not implemented: isolation (commands are the test's processes), egress
//! enforcement (policies are validated and recorded), stdin, tunnels, SSH, logs, blueprints,
//! secrets, gateways, MCP, mounts, keep-alive expiry, code mounts, PTYs.

// Handlers answer a ready `Reply` as their error: its size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
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

/// The devbox user's home, where relative paths and commands start.
pub const HOME: &str = "/home/user";
const MAX_BODY: usize = 256 << 20;
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FakeRunloopConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` or `created_then_503` create the devbox stays
    /// out of listings.
    pub appear_after: Duration,
    /// provisioning → initializing → running takes this long.
    pub boot_delay: Duration,
    /// suspending → suspended, resuming → running take this long.
    pub transition_delay: Duration,
}

impl Default for FakeRunloopConfig {
    fn default() -> Self {
        FakeRunloopConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            boot_delay: Duration::from_millis(300),
            transition_delay: Duration::from_millis(200),
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 503 "no capacity" (Runloop documents no distinct capacity signal).
    Capacity,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 502.
    Outage,
    /// The devbox is created but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// The devbox is created (it boots), then 503 is answered.
    CreatedThen503,
    /// Accepted, then boots into `failure`.
    FailedBeforeRunning,
    /// Answered from an earlier create with the same `x-request-id`.
    Replayed,
    /// Refused (400) before the script.
    Rejected,
}

impl CreateOutcome {
    fn parse(name: &str) -> Option<CreateOutcome> {
        Some(match name {
            "ok" => CreateOutcome::Ok,
            "capacity" => CreateOutcome::Capacity,
            "rate_limit" => CreateOutcome::RateLimit,
            "outage" => CreateOutcome::Outage,
            "timeout_after_send" => CreateOutcome::TimeoutAfterSend,
            "created_then_503" => CreateOutcome::CreatedThen503,
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevboxStatus {
    Provisioning,
    Initializing,
    Running,
    Suspending,
    Suspended,
    Resuming,
    Failure,
    Shutdown,
}

impl DevboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DevboxStatus::Provisioning => "provisioning",
            DevboxStatus::Initializing => "initializing",
            DevboxStatus::Running => "running",
            DevboxStatus::Suspending => "suspending",
            DevboxStatus::Suspended => "suspended",
            DevboxStatus::Resuming => "resuming",
            DevboxStatus::Failure => "failure",
            DevboxStatus::Shutdown => "shutdown",
        }
    }

    fn parse(name: &str) -> Option<DevboxStatus> {
        [
            DevboxStatus::Provisioning,
            DevboxStatus::Initializing,
            DevboxStatus::Running,
            DevboxStatus::Suspending,
            DevboxStatus::Suspended,
            DevboxStatus::Resuming,
            DevboxStatus::Failure,
            DevboxStatus::Shutdown,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
        .or(match name {
            "scheduled" | "queued" => Some(DevboxStatus::Provisioning),
            _ => None,
        })
    }

    fn live(self) -> bool {
        !matches!(self, DevboxStatus::Failure | DevboxStatus::Shutdown)
    }
}

/// A network policy as created.
#[derive(Clone, Debug)]
pub struct FakePolicy {
    pub id: String,
    pub name: String,
    pub allow_all: bool,
    pub allowed_hostnames: Vec<String>,
    /// `{cidr, ports?}` as sent.
    pub allowed_cidrs: Vec<Value>,
    pub allow_runloop_mirrors: bool,
    pub allow_agent_gateway: bool,
    pub allow_mcp_gateway: bool,
    pub allow_devbox_to_devbox: bool,
    pub description: Option<String>,
}

/// A devbox as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeDevbox {
    pub id: String,
    pub name: Option<String>,
    pub status: DevboxStatus,
    pub metadata: BTreeMap<String, String>,
    pub environment_variables: BTreeMap<String, String>,
    pub blueprint_id: Option<String>,
    pub blueprint_name: Option<String>,
    pub snapshot_id: Option<String>,
    pub launch_parameters: Value,
    /// The policy named by `launch_parameters.network_policy_id`, as it was at create.
    pub policy: Option<FakePolicy>,
    /// The devbox's `/` on the host.
    pub root: PathBuf,
    pub request_id: Option<String>,
    pub outcome: CreateOutcome,
}

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub devbox_id: Option<String>,
    pub request_id: Option<String>,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// One command the fake ran.
#[derive(Clone, Debug)]
pub struct FakeExecution {
    pub id: String,
    pub devbox_id: String,
    pub command: String,
    pub exit_status: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

pub struct FakeRunloop {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeRunloop {
    pub async fn start(config: FakeRunloopConfig) -> FakeRunloop {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake Runloop");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let (tick, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            config,
            api_key: format!("ak_fake_{}", random_hex(16)),
            base,
            inner: Mutex::default(),
            tick,
        });
        let tasks = vec![
            tokio::spawn(accept(listener, shared.clone())),
            tokio::spawn(ticker(shared.clone())),
        ];
        FakeRunloop {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: the SDK's `base_url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `capacity`, `rate_limit`,
    /// `outage`, `timeout_after_send`, `created_then_503`, `failed_before_running`. Panics on
    /// another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Runloop has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every create attempt's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn devbox(&self, id: &str) -> Option<FakeDevbox> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner.devboxes.get(id).map(|e| e.view.clone())
    }

    pub fn devboxes(&self) -> Vec<FakeDevbox> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner
            .order
            .iter()
            .map(|id| inner.devboxes[id].view.clone())
            .collect()
    }

    /// Devboxes not shut down or failed.
    pub fn live(&self) -> Vec<FakeDevbox> {
        self.devboxes()
            .into_iter()
            .filter(|d| d.status.live())
            .collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn live_with_metadata(&self, key: &str, value: &str) -> Vec<FakeDevbox> {
        self.live()
            .into_iter()
            .filter(|d| d.metadata.get(key).map(String::as_str) == Some(value))
            .collect()
    }

    /// The policy attached to a devbox (what its egress was locked to).
    pub fn egress(&self, id: &str) -> Option<FakePolicy> {
        self.devbox(id)?.policy
    }

    pub fn environment(&self, id: &str) -> Option<BTreeMap<String, String>> {
        Some(self.devbox(id)?.environment_variables)
    }

    pub fn policies(&self) -> Vec<FakePolicy> {
        let inner = self.shared.lock();
        inner
            .policy_order
            .iter()
            .map(|id| inner.policies[id].clone())
            .collect()
    }

    pub fn executions(&self) -> Vec<FakeExecution> {
        let inner = self.shared.lock();
        inner
            .exec_order
            .iter()
            .map(|id| {
                let e = &inner.executions[id];
                FakeExecution {
                    id: id.clone(),
                    devbox_id: e.devbox.clone(),
                    command: e.command.clone(),
                    exit_status: e.exit,
                    stdout: e.stdout.clone(),
                    stderr: e.stderr.clone(),
                }
            })
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }

    /// A file in a devbox (path absolute or relative to `/home/user`).
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.devbox(id)?.root;
        std::fs::read(resolve(&root, path).ok()?).ok()
    }
}

impl Drop for FakeRunloop {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let inner = self.shared.lock();
        for e in inner.executions.values() {
            if let (Some(pid), None) = (e.pid, e.exit) {
                // SAFETY: a plain syscall on a process group this fake started.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeRunloopConfig,
    api_key: String,
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
    devboxes: HashMap<String, Entry>,
    order: Vec<String>,
    by_request_id: HashMap<String, String>,
    policies: HashMap<String, FakePolicy>,
    policy_order: Vec<String>,
    policy_times: HashMap<String, u64>,
    executions: HashMap<String, Exec>,
    exec_order: Vec<String>,
    by_command_id: HashMap<(String, String), String>,
    snapshots: HashMap<String, (PathBuf, String, u64)>,
    seen: Vec<SeenRequest>,
}

struct Entry {
    view: FakeDevbox,
    since: Instant,
    created_ms: u64,
    fails: bool,
    hidden_until: Option<Instant>,
    transitions: Vec<(String, u64)>,
}

struct Exec {
    devbox: String,
    command: String,
    pid: Option<u32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<i32>,
}

impl Entry {
    fn set(&mut self, status: DevboxStatus) {
        self.view.status = status;
        self.since = Instant::now();
        self.transitions
            .push((status.as_str().to_string(), now_ms()));
    }

    fn advance(&mut self, config: &FakeRunloopConfig) {
        loop {
            let elapsed = self.since.elapsed();
            let half = config.boot_delay / 2;
            let next = match self.view.status {
                DevboxStatus::Provisioning if elapsed >= half => DevboxStatus::Initializing,
                DevboxStatus::Initializing if elapsed >= half => {
                    if self.fails {
                        DevboxStatus::Failure
                    } else {
                        DevboxStatus::Running
                    }
                }
                DevboxStatus::Suspending if elapsed >= config.transition_delay => {
                    DevboxStatus::Suspended
                }
                DevboxStatus::Resuming if elapsed >= config.transition_delay => {
                    DevboxStatus::Running
                }
                _ => return,
            };
            self.set(next);
        }
    }
}

impl Inner {
    fn advance_all(&mut self, config: &FakeRunloopConfig) {
        for e in self.devboxes.values_mut() {
            e.advance(config);
        }
    }
}

async fn ticker(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let changed = {
            let mut inner = shared.lock();
            let before: Vec<DevboxStatus> =
                inner.devboxes.values().map(|e| e.view.status).collect();
            inner.advance_all(&shared.config);
            let after: Vec<DevboxStatus> = inner.devboxes.values().map(|e| e.view.status).collect();
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

    fn segments(&self) -> Vec<String> {
        self.path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect()
    }

    /// The JSON body (an empty body is `{}`); `Err` is the 400.
    fn json(&self) -> Result<Value, Reply> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if v.is_object() => Ok(v),
            Ok(_) => Err(api_error(400, "the body must be a JSON object")),
            Err(e) => Err(api_error(400, format!("invalid JSON body: {e}"))),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(api_error(413, "the request body is too large or broken")),
    };
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let result = route(&shared, &req).await;
    let segments = req.segments();
    let devbox_id = match segments.as_slice() {
        [v, d, id, ..] if v == "v1" && d == "devboxes" && id.starts_with("dbx_") => {
            Some(id.clone())
        }
        _ => None,
    };
    shared.lock().seen.push(SeenRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
        query: req.query.clone(),
        devbox_id,
        request_id: req.header("x-request-id").map(str::to_string),
        status: result.as_ref().ok().map(|r| r.status().as_u16()),
    });
    result
}

async fn route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let authorized = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|key| key == shared.api_key);
    if !authorized {
        return Ok(api_error(401, "Unauthorized: missing or invalid API key"));
    }
    let segments = req.segments();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let m = &req.method;
    Ok(match (m, s.as_slice()) {
        (&Method::POST, ["v1", "devboxes"]) => return create(shared, req, false).await,
        (&Method::POST, ["v1", "devboxes", "create_and_await_running"]) => {
            return create(shared, req, true).await
        }
        (&Method::GET, ["v1", "devboxes"]) => list_devboxes(shared, req),
        (&Method::POST, ["v1", "devboxes", "disk_snapshots", id, "delete"]) => {
            delete_snapshot(shared, id)
        }
        (&Method::GET, ["v1", "devboxes", id]) => devbox_reply(shared, id),
        (&Method::POST, ["v1", "devboxes", id, "wait_for_status"]) => {
            wait_devbox(shared, req, id).await
        }
        (&Method::POST, ["v1", "devboxes", id, "shutdown"]) => shutdown(shared, id),
        (&Method::POST, ["v1", "devboxes", id, "suspend"]) => {
            transition(shared, id, DevboxStatus::Running, DevboxStatus::Suspending)
        }
        (&Method::POST, ["v1", "devboxes", id, "resume"]) => {
            transition(shared, id, DevboxStatus::Suspended, DevboxStatus::Resuming)
        }
        (&Method::POST, ["v1", "devboxes", id, "keep_alive"]) => match running(shared, id) {
            Ok(_) => json_reply(200, &json!({})),
            Err(reply) => reply,
        },
        (&Method::POST, ["v1", "devboxes", id, "snapshot_disk"]) => snapshot(shared, req, id),
        (&Method::POST, ["v1", "devboxes", id, "execute_async"]) => {
            execute(shared, req, id, Mode::Async).await
        }
        (&Method::POST, ["v1", "devboxes", id, "execute"]) => {
            execute(shared, req, id, Mode::Optimistic).await
        }
        (&Method::POST, ["v1", "devboxes", id, "execute_sync"]) => {
            execute(shared, req, id, Mode::Sync).await
        }
        (&Method::GET, ["v1", "devboxes", id, "executions", eid]) => {
            match execution_json(shared, id, eid) {
                Some(v) => json_reply(200, &v),
                None => api_error(404, format!("execution {eid} not found")),
            }
        }
        (&Method::POST, ["v1", "devboxes", id, "executions", eid, "wait_for_status"]) => {
            wait_execution(shared, req, id, eid).await
        }
        (&Method::POST, ["v1", "devboxes", id, "executions", eid, "kill"]) => {
            kill_execution(shared, id, eid)
        }
        (&Method::GET, ["v1", "devboxes", id, "executions", eid, "stream_stdout_updates"]) => {
            stream(shared, req, id, eid, true)
        }
        (&Method::GET, ["v1", "devboxes", id, "executions", eid, "stream_stderr_updates"]) => {
            stream(shared, req, id, eid, false)
        }
        (&Method::POST, ["v1", "devboxes", id, "read_file_contents"]) => {
            read_file(shared, req, id, "file_path", true)
        }
        (&Method::POST, ["v1", "devboxes", id, "download_file"]) => {
            read_file(shared, req, id, "path", false)
        }
        (&Method::POST, ["v1", "devboxes", id, "write_file_contents"]) => {
            write_file(shared, req, id)
        }
        (&Method::POST, ["v1", "devboxes", id, "upload_file"]) => upload_file(shared, req, id),
        (&Method::POST, ["v1", "network-policies"]) => create_policy(shared, req),
        (&Method::GET, ["v1", "network-policies"]) => list_policies(shared, req),
        (&Method::GET, ["v1", "network-policies", id]) => {
            let found = shared.lock().policies.get(*id).cloned();
            match found {
                Some(p) => json_reply(200, &policy_json(shared, &p)),
                None => api_error(404, format!("network policy {id} not found")),
            }
        }
        (&Method::POST, ["v1", "network-policies", id, "delete"]) => {
            let mut inner = shared.lock();
            match inner.policies.remove(*id) {
                Some(p) => {
                    inner.policy_order.retain(|x| x != id);
                    drop(inner);
                    json_reply(200, &policy_json(shared, &p))
                }
                None => api_error(404, format!("network policy {id} not found")),
            }
        }
        _ => api_error(404, format!("no route {} {}", req.method, req.path)),
    })
}

// ---------------------------------------------------------------------------------------
// Devboxes
// ---------------------------------------------------------------------------------------

fn devbox_json(e: &Entry) -> Value {
    let v = &e.view;
    let terminal = matches!(v.status, DevboxStatus::Failure | DevboxStatus::Shutdown);
    let mut out = json!({
        "id": v.id,
        "name": v.name,
        "status": v.status.as_str(),
        "capabilities": [],
        "create_time_ms": e.created_ms,
        "end_time_ms": if terminal { Some(now_ms()) } else { None },
        "launch_parameters": v.launch_parameters,
        "metadata": v.metadata,
        "state_transitions": e.transitions.iter().map(|(s, t)| json!({"status": s, "transition_time_ms": t})).collect::<Vec<_>>(),
        "blueprint_id": v.blueprint_id,
        "snapshot_id": v.snapshot_id,
        "initiator_type": "api",
    });
    if v.status == DevboxStatus::Failure {
        out["failure_reason"] = json!("execution_failed");
    }
    if v.status == DevboxStatus::Shutdown {
        out["shutdown_reason"] = json!("api_shutdown");
    }
    out
}

fn devbox_reply(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    match inner.devboxes.get_mut(id) {
        Some(e) => {
            e.advance(&shared.config);
            json_reply(200, &devbox_json(e))
        }
        None => api_error(404, format!("devbox {id} not found")),
    }
}

fn string_map(body: &Value, field: &str) -> Result<BTreeMap<String, String>, Reply> {
    match &body[field] {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_string())),
                None => Err(api_error(400, format!("{field}.{k} must be a string"))),
            })
            .collect(),
        _ => Err(api_error(
            400,
            format!("{field} must be an object of strings"),
        )),
    }
}

fn opt_str(body: &Value, field: &str) -> Result<Option<String>, Reply> {
    match &body[field] {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(api_error(400, format!("{field} must be a string"))),
    }
}

async fn create(shared: &Arc<Shared>, req: &Req, await_running: bool) -> Result<Reply, io::Error> {
    let reject = |shared: &Shared, reply: Reply| {
        shared.lock().create_log.push(CreateOutcome::Rejected);
        Ok(reply)
    };
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return reject(shared, reply),
    };
    let parsed = (|| -> Result<_, Reply> {
        let metadata = string_map(&body, "metadata")?;
        let env = string_map(&body, "environment_variables")?;
        let blueprint_id = opt_str(&body, "blueprint_id")?;
        let blueprint_name = opt_str(&body, "blueprint_name")?;
        let snapshot_id = opt_str(&body, "snapshot_id")?;
        let name = opt_str(&body, "name")?;
        let sources = [&blueprint_id, &blueprint_name, &snapshot_id]
            .iter()
            .filter(|s| s.is_some())
            .count();
        if sources > 1 {
            return Err(api_error(
                400,
                "only one of blueprint_id, blueprint_name and snapshot_id may be given",
            ));
        }
        let launch = match &body["launch_parameters"] {
            Value::Null => json!({}),
            v @ Value::Object(_) => v.clone(),
            _ => return Err(api_error(400, "launch_parameters must be an object")),
        };
        if let Some(size) = launch.get("resource_size_request").filter(|v| !v.is_null()) {
            let known = [
                "X_SMALL",
                "SMALL",
                "MEDIUM",
                "LARGE",
                "X_LARGE",
                "XX_LARGE",
                "CUSTOM_SIZE",
            ];
            if !size.as_str().is_some_and(|s| known.contains(&s)) {
                return Err(api_error(
                    400,
                    format!("unknown resource_size_request {size}"),
                ));
            }
        }
        if let Some(k) = launch
            .get("keep_alive_time_seconds")
            .filter(|v| !v.is_null())
        {
            if !k.as_u64().is_some_and(|k| (1..=172_800).contains(&k)) {
                return Err(api_error(400, "keep_alive_time_seconds must be 1..=172800"));
            }
        }
        let policy_id = match launch.get("network_policy_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(api_error(400, "network_policy_id must be a string")),
        };
        Ok((
            metadata,
            env,
            blueprint_id,
            blueprint_name,
            snapshot_id,
            name,
            launch,
            policy_id,
        ))
    })();
    let (metadata, env, blueprint_id, blueprint_name, snapshot_id, name, launch, policy_id) =
        match parsed {
            Ok(p) => p,
            Err(reply) => return reject(shared, reply),
        };
    let request_id = req.header("x-request-id").map(str::to_string);
    let outcome;
    let id;
    {
        let mut inner = shared.lock();
        if let Some(existing) = request_id.as_ref().and_then(|r| inner.by_request_id.get(r)) {
            let existing = existing.clone();
            inner.create_log.push(CreateOutcome::Replayed);
            let e = inner
                .devboxes
                .get_mut(&existing)
                .expect("a replayed devbox");
            e.advance(&shared.config);
            return Ok(json_reply(200, &devbox_json(e)));
        }
        let policy = match &policy_id {
            Some(pid) => match inner.policies.get(pid) {
                Some(p) => Some(p.clone()),
                None => {
                    drop(inner);
                    return reject(
                        shared,
                        api_error(400, format!("network policy {pid} not found")),
                    );
                }
            },
            None => None,
        };
        let snapshot_root = match &snapshot_id {
            Some(sid) => match inner.snapshots.get(sid) {
                Some((root, _, _)) => Some(root.clone()),
                None => {
                    drop(inner);
                    return reject(shared, api_error(404, format!("snapshot {sid} not found")));
                }
            },
            None => None,
        };
        outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        match outcome {
            CreateOutcome::Capacity => {
                return Ok(api_error(503, "no capacity is available for this devbox"))
            }
            CreateOutcome::RateLimit => {
                let mut reply = api_error(429, "Too many requests");
                reply.headers_mut().insert(
                    "retry-after",
                    shared.config.retry_after_secs.to_string().parse().unwrap(),
                );
                return Ok(reply);
            }
            CreateOutcome::Outage => return Ok(api_error(502, "Bad Gateway")),
            _ => {}
        }
        id = format!("dbx_{}", random_alnum(22));
        let root = shared.base.join(&id);
        match &snapshot_root {
            Some(from) => copy_dir(from, &root)?,
            None => std::fs::create_dir_all(root.join("home/user"))?,
        }
        let view = FakeDevbox {
            id: id.clone(),
            name,
            status: DevboxStatus::Provisioning,
            metadata,
            environment_variables: env,
            blueprint_id,
            blueprint_name,
            snapshot_id,
            launch_parameters: launch,
            policy,
            root,
            request_id: request_id.clone(),
            outcome,
        };
        let hidden_until = (matches!(
            outcome,
            CreateOutcome::TimeoutAfterSend | CreateOutcome::CreatedThen503
        ) && !shared.config.appear_after.is_zero())
        .then(|| Instant::now() + shared.config.appear_after);
        let mut entry = Entry {
            view,
            since: Instant::now(),
            created_ms: now_ms(),
            fails: outcome == CreateOutcome::FailedBeforeRunning,
            hidden_until,
            transitions: Vec::new(),
        };
        entry.set(DevboxStatus::Provisioning);
        inner.devboxes.insert(id.clone(), entry);
        inner.order.push(id.clone());
        if let Some(r) = &request_id {
            inner.by_request_id.insert(r.clone(), id.clone());
        }
    }
    shared.bump();
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    if outcome == CreateOutcome::CreatedThen503 {
        return Ok(api_error(503, "Service Unavailable"));
    }
    if await_running {
        let _ = wait_for(shared, &id, &["running", "failure", "shutdown"], 30.0).await;
    }
    Ok(devbox_reply(shared, &id))
}

fn list_devboxes(shared: &Shared, req: &Req) -> Reply {
    let limit = match req.param("limit") {
        Some(l) => match l.parse::<usize>() {
            Ok(l) if (1..=5000).contains(&l) => l,
            _ => return api_error(400, "limit must be 1..=5000"),
        },
        None => 20,
    };
    let status = match req.param("status") {
        Some(s) => match DevboxStatus::parse(&s) {
            Some(s) => Some(s),
            None => return api_error(400, format!("unknown status {s}")),
        },
        None => None,
    };
    let mut inner = shared.lock();
    inner.advance_all(&shared.config);
    let now = Instant::now();
    let mut all: Vec<&Entry> = inner
        .order
        .iter()
        .rev()
        .map(|id| &inner.devboxes[id])
        .filter(|e| e.hidden_until.is_none_or(|t| now >= t))
        .filter(|e| status.is_none_or(|s| e.view.status == s))
        .collect();
    let total = all.len();
    if let Some(after) = req.param("starting_after") {
        match all.iter().position(|e| e.view.id == after) {
            Some(i) => all = all.split_off(i + 1),
            None => all.clear(),
        }
    }
    let has_more = all.len() > limit;
    all.truncate(limit);
    let mut body = json!({
        "devboxes": all.iter().map(|e| devbox_json(e)).collect::<Vec<_>>(),
        "has_more": has_more,
    });
    if req.param("include_total_count").as_deref() != Some("false") {
        body["total_count"] = json!(total);
    }
    json_reply(200, &body)
}

/// Waits until the devbox is in one of `statuses` (names) or `secs` pass.
async fn wait_for(shared: &Arc<Shared>, id: &str, statuses: &[&str], secs: f64) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs.clamp(0.0, 30.0));
    let mut rx = shared.tick.subscribe();
    loop {
        {
            let mut inner = shared.lock();
            let e = inner.devboxes.get_mut(id)?;
            e.advance(&shared.config);
            if statuses.contains(&e.view.status.as_str()) {
                return Some(devbox_json(e));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), rx.changed()).await;
    }
}

fn statuses_of(body: &Value) -> Result<Vec<String>, Reply> {
    let list = body["statuses"]
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| api_error(400, "statuses must name at least one status"))?;
    list.iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| api_error(400, "statuses must be strings"))
        })
        .collect()
}

async fn wait_devbox(shared: &Arc<Shared>, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let statuses = match statuses_of(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if !shared.lock().devboxes.contains_key(id) {
        return api_error(404, format!("devbox {id} not found"));
    }
    let secs = body["timeout_seconds"].as_f64().unwrap_or(30.0);
    let names: Vec<&str> = statuses.iter().map(String::as_str).collect();
    match wait_for(shared, id, &names, secs).await {
        Some(v) => json_reply(200, &v),
        None => api_error(408, "timed out waiting for the devbox status"),
    }
}

fn shutdown(shared: &Shared, id: &str) -> Reply {
    let pids: Vec<u32>;
    let reply;
    {
        let mut inner = shared.lock();
        let Some(e) = inner.devboxes.get_mut(id) else {
            return api_error(404, format!("devbox {id} not found"));
        };
        e.advance(&shared.config);
        if e.view.status == DevboxStatus::Shutdown {
            return api_error(400, format!("devbox {id} is already shut down"));
        }
        e.set(DevboxStatus::Shutdown);
        reply = devbox_json(e);
        pids = inner
            .executions
            .values()
            .filter(|x| x.devbox == id && x.exit.is_none())
            .filter_map(|x| x.pid)
            .collect();
    }
    for pid in pids {
        // SAFETY: a plain syscall on a process group this fake started.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    shared.bump();
    json_reply(200, &reply)
}

fn transition(shared: &Shared, id: &str, from: DevboxStatus, to: DevboxStatus) -> Reply {
    let reply = {
        let mut inner = shared.lock();
        let Some(e) = inner.devboxes.get_mut(id) else {
            return api_error(404, format!("devbox {id} not found"));
        };
        e.advance(&shared.config);
        if e.view.status != from {
            return api_error(
                400,
                format!(
                    "devbox {id} is {}, not {}",
                    e.view.status.as_str(),
                    from.as_str()
                ),
            );
        }
        e.set(to);
        devbox_json(e)
    };
    shared.bump();
    json_reply(200, &reply)
}

/// The devbox's root when it is running; else the reply.
fn running(shared: &Shared, id: &str) -> Result<FakeDevbox, Reply> {
    let mut inner = shared.lock();
    let Some(e) = inner.devboxes.get_mut(id) else {
        return Err(api_error(404, format!("devbox {id} not found")));
    };
    e.advance(&shared.config);
    if e.view.status != DevboxStatus::Running {
        return Err(api_error(
            409,
            format!("devbox {id} is {}, not running", e.view.status.as_str()),
        ));
    }
    Ok(e.view.clone())
}

fn snapshot(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let devbox = match running(shared, id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let sid = format!("snp_{}", random_alnum(22));
    let root = shared.base.join(&sid);
    if let Err(e) = copy_dir(&devbox.root, &root) {
        return api_error(500, format!("snapshot failed: {e}"));
    }
    let size = dir_size(&root);
    shared
        .lock()
        .snapshots
        .insert(sid.clone(), (root, id.to_string(), size));
    json_reply(
        200,
        &json!({
            "id": sid,
            "create_time_ms": now_ms(),
            "metadata": body["metadata"].as_object().cloned().unwrap_or_default(),
            "name": body["name"],
            "source_devbox_id": id,
            "size_bytes": size,
        }),
    )
}

fn delete_snapshot(shared: &Shared, id: &str) -> Reply {
    match shared.lock().snapshots.remove(id) {
        Some((root, _, _)) => {
            let _ = std::fs::remove_dir_all(root);
            json_reply(200, &json!({}))
        }
        None => api_error(404, format!("snapshot {id} not found")),
    }
}

// ---------------------------------------------------------------------------------------
// Executions
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Async,
    Optimistic,
    Sync,
}

fn execution_json(shared: &Shared, devbox: &str, eid: &str) -> Option<Value> {
    let inner = shared.lock();
    let e = inner.executions.get(eid).filter(|e| e.devbox == devbox)?;
    Some(exec_json(eid, e))
}

fn exec_json(eid: &str, e: &Exec) -> Value {
    let done = e.exit.is_some();
    json!({
        "devbox_id": e.devbox,
        "execution_id": eid,
        "status": if done { "completed" } else { "running" },
        "exit_status": e.exit,
        "stdout": done.then(|| String::from_utf8_lossy(&e.stdout).into_owned()),
        "stderr": done.then(|| String::from_utf8_lossy(&e.stderr).into_owned()),
        "stdout_truncated": done.then_some(false),
        "stderr_truncated": done.then_some(false),
    })
}

/// `/home/user` in a command line or a variable, as the host directory.
fn map_home(text: &str, home: &Path) -> String {
    text.replace(HOME, &home.to_string_lossy())
}

async fn execute(shared: &Arc<Shared>, req: &Req, id: &str, mode: Mode) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(command) = body["command"].as_str().map(str::to_string) else {
        return api_error(400, "command is required");
    };
    let devbox = match running(shared, id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let command_id = body["command_id"].as_str().map(str::to_string);
    let existing = command_id.as_ref().and_then(|c| {
        shared
            .lock()
            .by_command_id
            .get(&(id.to_string(), c.clone()))
            .cloned()
    });
    let eid = match existing {
        Some(eid) => eid,
        None => match spawn(shared, &devbox, &command) {
            Ok(eid) => {
                if let Some(c) = command_id {
                    shared
                        .lock()
                        .by_command_id
                        .insert((id.to_string(), c), eid.clone());
                }
                eid
            }
            Err(e) => return api_error(500, format!("the command could not start: {e}")),
        },
    };
    let wait = match mode {
        Mode::Async => 0.0,
        Mode::Optimistic => body["optimistic_timeout"]
            .as_f64()
            .unwrap_or(25.0)
            .min(25.0),
        Mode::Sync => 600.0,
    };
    if wait > 0.0 {
        wait_exec(shared, &eid, wait).await;
    }
    let inner = shared.lock();
    let e = &inner.executions[&eid];
    if mode == Mode::Sync {
        return json_reply(
            200,
            &json!({
                "devbox_id": id,
                "exit_status": e.exit.unwrap_or(-1),
                "stdout": String::from_utf8_lossy(&e.stdout),
                "stderr": String::from_utf8_lossy(&e.stderr),
            }),
        );
    }
    json_reply(200, &exec_json(&eid, e))
}

async fn wait_exec(shared: &Arc<Shared>, eid: &str, secs: f64) -> bool {
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    let mut rx = shared.tick.subscribe();
    loop {
        if shared
            .lock()
            .executions
            .get(eid)
            .is_none_or(|e| e.exit.is_some())
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

fn spawn(shared: &Arc<Shared>, devbox: &FakeDevbox, command: &str) -> io::Result<String> {
    let home = devbox.root.join("home/user");
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(map_home(command, &home))
        .current_dir(&home)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &home)
        .env("USER", "user")
        .env("LOGNAME", "user")
        .envs(
            devbox
                .environment_variables
                .iter()
                .map(|(k, v)| (k.clone(), map_home(v, &home))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let eid = format!("exe_{}", random_alnum(22));
    shared.lock().executions.insert(
        eid.clone(),
        Exec {
            devbox: devbox.id.clone(),
            command: command.to_string(),
            pid: child.id(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit: None,
        },
    );
    shared.lock().exec_order.push(eid.clone());
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let shared = shared.clone();
    let id = eid.clone();
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
        if let Some(e) = shared.lock().executions.get_mut(&id) {
            e.exit = Some(code);
        }
        shared.bump();
    });
    Ok(eid)
}

async fn read_into(
    shared: Arc<Shared>,
    eid: String,
    mut pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stdout: bool,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Some(e) = shared.lock().executions.get_mut(&eid) {
                    if stdout {
                        e.stdout.extend_from_slice(&buf[..n]);
                    } else {
                        e.stderr.extend_from_slice(&buf[..n]);
                    }
                }
                shared.bump();
            }
        }
    }
}

async fn wait_execution(shared: &Arc<Shared>, req: &Req, id: &str, eid: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let statuses = match statuses_of(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if execution_json(shared, id, eid).is_none() {
        return api_error(404, format!("execution {eid} not found"));
    }
    let secs = body["timeout_seconds"].as_f64().unwrap_or(25.0).min(25.0);
    let wants_running = statuses.iter().any(|s| s == "running" || s == "queued");
    if !wants_running && !wait_exec(shared, eid, secs).await {
        return api_error(408, "timed out waiting for the execution status");
    }
    match execution_json(shared, id, eid) {
        Some(v) => json_reply(200, &v),
        None => api_error(404, format!("execution {eid} not found")),
    }
}

fn kill_execution(shared: &Shared, id: &str, eid: &str) -> Reply {
    let pid = {
        let inner = shared.lock();
        match inner.executions.get(eid).filter(|e| e.devbox == id) {
            Some(e) if e.exit.is_none() => e.pid,
            Some(_) => None,
            None => return api_error(404, format!("execution {eid} not found")),
        }
    };
    if let Some(pid) = pid {
        // SAFETY: a plain syscall on a process group this fake started.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    match execution_json(shared, id, eid) {
        Some(v) => json_reply(200, &v),
        None => api_error(404, format!("execution {eid} not found")),
    }
}

/// The SSE output stream of one execution, from `?offset=` on.
fn stream(shared: &Arc<Shared>, req: &Req, id: &str, eid: &str, stdout: bool) -> Reply {
    if execution_json(shared, id, eid).is_none() {
        return api_error(404, format!("execution {eid} not found"));
    }
    let mut offset = match req.param("offset") {
        Some(o) if !o.is_empty() => match o.parse::<usize>() {
            Ok(o) => o,
            Err(_) => return api_error(400, "offset must be a number"),
        },
        _ => 0,
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(16);
    let shared = shared.clone();
    let eid = eid.to_string();
    tokio::spawn(async move {
        let mut ticks = shared.tick.subscribe();
        loop {
            let (chunk, done) = {
                let inner = shared.lock();
                let Some(e) = inner.executions.get(&eid) else {
                    return;
                };
                let all = if stdout { &e.stdout } else { &e.stderr };
                let start = offset.min(all.len());
                let mut end = all.len();
                // Whole UTF-8 characters only (the rest comes with the next chunk).
                while end > start && std::str::from_utf8(&all[start..end]).is_err() {
                    end -= 1;
                }
                let done = e.exit.is_some() && end == all.len();
                (String::from_utf8_lossy(&all[start..end]).into_owned(), done)
            };
            if !chunk.is_empty() {
                offset += chunk.len();
                let event = format!("data: {}\n\n", json!({"output": chunk, "offset": offset}));
                if tx.send(Ok(Frame::data(Bytes::from(event)))).await.is_err() {
                    return;
                }
                continue;
            }
            if done {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), ticks.changed()).await;
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(ChannelBody(rx).boxed())
        .expect("a response")
}

// ---------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------

/// A devbox path (absolute, or relative to `/home/user`) inside `root`; `..` above `/` or a
/// symlink out of `root` is refused.
pub fn resolve(root: &Path, path: &str) -> Result<PathBuf, String> {
    if path.is_empty() || path.contains('\0') {
        return Err("the path is empty or holds NUL".into());
    }
    let full = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        Path::new(HOME).join(path)
    };
    let mut parts: Vec<String> = Vec::new();
    for c in full.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(format!("{path} leads outside the devbox"));
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
    // A symlink on the way out of the devbox is refused.
    let mut probe = out.clone();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if let Ok(real) = probe.canonicalize() {
        if !real.starts_with(root) {
            return Err(format!("{path} leads outside the devbox"));
        }
    }
    Ok(out)
}

fn read_file(shared: &Shared, req: &Req, id: &str, field: &str, text: bool) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(path) = body[field].as_str() else {
        return api_error(400, format!("{field} is required"));
    };
    let devbox = match running(shared, id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let host = match resolve(&devbox.root, path) {
        Ok(h) => h,
        Err(m) => return api_error(400, m),
    };
    match std::fs::read(&host) {
        Ok(bytes) if text => match String::from_utf8(bytes) {
            Ok(s) => Response::builder()
                .status(200)
                .header("content-type", "text/plain; charset=utf-8")
                .body(full(s))
                .expect("a response"),
            Err(_) => api_error(400, format!("{path} is not UTF-8 text: use download_file")),
        },
        Ok(bytes) => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(full(bytes))
            .expect("a response"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            api_error(404, format!("file {path} not found"))
        }
        Err(e) => api_error(400, format!("cannot read {path}: {e}")),
    }
}

fn put(root: &Path, path: &str, data: &[u8]) -> Result<(), Reply> {
    let host = resolve(root, path).map_err(|m| api_error(400, m))?;
    if !host.parent().is_some_and(Path::is_dir) {
        return Err(api_error(
            400,
            format!("the directory of {path} does not exist"),
        ));
    }
    std::fs::write(&host, data).map_err(|e| api_error(400, format!("cannot write {path}: {e}")))
}

fn write_file(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (Some(path), Some(contents)) = (body["file_path"].as_str(), body["contents"].as_str())
    else {
        return api_error(400, "file_path and contents are required");
    };
    let devbox = match running(shared, id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    match put(&devbox.root, path, contents.as_bytes()) {
        Ok(()) => json_reply(
            200,
            &json!({"devbox_id": id, "exit_status": 0, "stdout": "", "stderr": ""}),
        ),
        Err(r) => r,
    }
}

fn upload_file(shared: &Shared, req: &Req, id: &str) -> Reply {
    let Some(boundary) = req
        .header("content-type")
        .filter(|c| c.starts_with("multipart/form-data"))
        .and_then(|c| c.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_string())
    else {
        return api_error(400, "upload_file takes multipart/form-data");
    };
    let parts = multipart(&req.body, &boundary);
    let path = parts
        .iter()
        .find(|(n, _)| n == "path")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    let file = parts.iter().find(|(n, _)| n == "file").map(|(_, v)| v);
    let (Some(path), Some(file)) = (path, file) else {
        return api_error(400, "path and file are required");
    };
    let devbox = match running(shared, id) {
        Ok(d) => d,
        Err(r) => return r,
    };
    match put(&devbox.root, &path, file) {
        Ok(()) => json_reply(200, &json!({})),
        Err(r) => r,
    }
}

/// The named parts of a multipart body.
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
// Network policies
// ---------------------------------------------------------------------------------------

fn policy_json(shared: &Shared, p: &FakePolicy) -> Value {
    let t = shared
        .lock()
        .policy_times
        .get(&p.id)
        .copied()
        .unwrap_or_else(now_ms);
    json!({
        "id": p.id,
        "name": p.name,
        "description": p.description,
        "create_time_ms": t,
        "update_time_ms": t,
        "egress": {
            "allow_all": p.allow_all,
            "allow_agent_gateway": p.allow_agent_gateway,
            "allow_devbox_to_devbox": p.allow_devbox_to_devbox || p.allow_all,
            "allow_mcp_gateway": p.allow_mcp_gateway,
            "allow_runloop_mirrors": p.allow_runloop_mirrors || p.allow_all,
            "allowed_cidrs": p.allowed_cidrs,
            "allowed_hostnames": p.allowed_hostnames,
        },
    })
}

fn validate_cidr(rule: &Value) -> Result<Value, String> {
    let cidr = rule["cidr"]
        .as_str()
        .ok_or("allowed_cidrs[].cidr is required")?;
    let (ip, len) = cidr
        .split_once('/')
        .ok_or(format!("{cidr} is not a CIDR"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("{cidr} is not an IPv4 CIDR"))?;
    let len: u32 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or(format!("{cidr} has a bad prefix length"))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    if u32::from(ip) & !mask != 0 {
        return Err(format!("{cidr} is not in canonical form (host bits set)"));
    }
    let mut out = json!({"cidr": cidr});
    if let Some(ports) = rule["ports"].as_array() {
        let mut checked = Vec::new();
        for p in ports {
            let port = p["port"]
                .as_u64()
                .filter(|p| (1..=65535).contains(p))
                .ok_or("ports[].port must be 1..=65535")?;
            if let Some(end) = p.get("end_port").filter(|v| !v.is_null()) {
                end.as_u64()
                    .filter(|e| (port..=65535).contains(e))
                    .ok_or("ports[].end_port must be port..=65535")?;
            }
            if let Some(proto) = p.get("protocol").filter(|v| !v.is_null()) {
                if !matches!(proto.as_str(), Some("TCP") | Some("UDP")) {
                    return Err("ports[].protocol must be TCP or UDP".into());
                }
            }
            checked.push(p.clone());
        }
        out["ports"] = json!(checked);
    }
    Ok(out)
}

fn create_policy(shared: &Shared, req: &Req) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(name) = body["name"].as_str().filter(|n| !n.is_empty()) else {
        return api_error(400, "name is required");
    };
    let flag = |f: &str| body[f].as_bool().unwrap_or(false);
    let hostnames = match &body["allowed_hostnames"] {
        Value::Null => Vec::new(),
        Value::Array(a) => {
            let mut out = Vec::new();
            for h in a {
                match h.as_str().filter(|h| !h.is_empty() && !h.contains('/')) {
                    Some(h) => out.push(h.to_string()),
                    None => return api_error(400, "allowed_hostnames must be host names"),
                }
            }
            out
        }
        _ => return api_error(400, "allowed_hostnames must be a list"),
    };
    let cidrs = match &body["allowed_cidrs"] {
        Value::Null => Vec::new(),
        Value::Array(a) => {
            let mut out = Vec::new();
            for rule in a {
                match validate_cidr(rule) {
                    Ok(r) => out.push(r),
                    Err(m) => return api_error(400, m),
                }
            }
            out
        }
        _ => return api_error(400, "allowed_cidrs must be a list"),
    };
    let policy = FakePolicy {
        id: format!("np_{}", random_alnum(22)),
        name: name.to_string(),
        allow_all: flag("allow_all"),
        allowed_hostnames: hostnames,
        allowed_cidrs: cidrs,
        allow_runloop_mirrors: flag("allow_runloop_mirrors"),
        allow_agent_gateway: flag("allow_agent_gateway"),
        allow_mcp_gateway: flag("allow_mcp_gateway"),
        allow_devbox_to_devbox: flag("allow_devbox_to_devbox"),
        description: body["description"].as_str().map(str::to_string),
    };
    {
        let mut inner = shared.lock();
        inner.policy_times.insert(policy.id.clone(), now_ms());
        inner.policies.insert(policy.id.clone(), policy.clone());
        inner.policy_order.push(policy.id.clone());
    }
    json_reply(200, &policy_json(shared, &policy))
}

fn list_policies(shared: &Shared, req: &Req) -> Reply {
    let limit = req
        .param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 5000);
    let name = req.param("name");
    let id = req.param("id");
    let search = req.param("search");
    let mut all: Vec<FakePolicy> = {
        let inner = shared.lock();
        inner
            .policy_order
            .iter()
            .rev()
            .map(|i| inner.policies[i].clone())
            .filter(|p| name.as_ref().is_none_or(|n| p.name.contains(n.as_str())))
            .filter(|p| id.as_ref().is_none_or(|i| &p.id == i))
            .filter(|p| {
                search
                    .as_ref()
                    .is_none_or(|s| p.name.contains(s.as_str()) || p.id == *s)
            })
            .collect()
    };
    let total = all.len();
    if let Some(after) = req.param("starting_after") {
        match all.iter().position(|p| p.id == after) {
            Some(i) => all = all.split_off(i + 1),
            None => all.clear(),
        }
    }
    let has_more = all.len() > limit;
    all.truncate(limit);
    json_reply(
        200,
        &json!({
            "network_policies": all.iter().map(|p| policy_json(shared, p)).collect::<Vec<_>>(),
            "has_more": has_more,
            "total_count": total,
        }),
    )
}

// ---------------------------------------------------------------------------------------
// Helpers
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

fn api_error(status: u16, message: impl Into<String>) -> Reply {
    json_reply(
        status,
        &json!({"code": status.to_string(), "message": message.into()}),
    )
}

fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_size(&e.path()),
                    Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    bytes
}

fn random_hex(len: usize) -> String {
    random_bytes::<32>()
        .iter()
        .take(len)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random_alnum(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    random_bytes::<32>()
        .iter()
        .take(len)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
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
