//! A fake Vercel Sandbox API on a real socket (`http://127.0.0.1:PORT`, HTTP/1.1), speaking
//! what the official `@vercel/sandbox` SDK 3.5.0 sends (`dist/api-client/*`).
//!
//! `tests/it/vercel_fake.rs::official_js_sdk_accepts_the_fake` proves it with that SDK
//! (`tests/sdk/vercel_contract.mjs`, which points the SDK's `fetch` at the fake: the SDK has
//! no base-URL setting): create (tags, env, networkPolicy), runCommand, writeFiles /
//! readFile, stop and delete go through the SDK's own client and validators.
//!
//! Implemented:
//! - Auth and scope: `Authorization: Bearer <token>` (else 401), `?teamId=` on every call
//!   (missing: 400, another team: 403), the project (`projectId` in bodies and on
//!   get/delete, `project` on lists; another project: 404). Errors are Vercel's
//!   `{error: {code, message}}`.
//! - Sandboxes: `POST /v3/sandboxes` and `/v2/sandboxes` (create: ≤ 5 tags of strings,
//!   `runtime` xor `image`, `source.type = snapshot`, `networkPolicy` validated as the SDK's
//!   request schema and echoed in the legacy response shape `{mode: "custom",
//!   allowedDomains, allowedCIDRs, deniedCIDRs}` the SDK's response schema wants),
//!   `GET /v2/sandboxes` (`tags=key:value`, one filter, `limit`, `cursor`),
//!   `GET /v2/sandboxes/{name}` (`resume=true` starts a new session), `DELETE
//!   /v2/sandboxes/{name}` (stops the session; 404 when absent).
//! - Sessions: `GET /v2/sandboxes/sessions/{id}` (status `pending` until the configured
//!   start delay has passed, then `running`), `POST .../stop`, `.../snapshot` (the session is
//!   stopped, as Vercel does), `.../extend-timeout`, `.../network-policy`, `.../cmd`
//!   (`wait: true`: an `application/x-ndjson` stream of the `{command}` line, `{stream,
//!   data}` lines when `logs` is set, then the finished `{command: {exitCode}}`; detached:
//!   the `{command}` JSON), `GET .../cmd/{id}` (`wait=true`), `POST .../cmd/{id}/kill`
//!   (`{signal}`), `.../fs/read` (`{path, cwd}` → octet-stream, 404), `.../fs/write` (a gzip
//!   tar, entries relative to `x-cwd`), `.../fs/mkdir` (not recursive). A session that is not
//!   running answers 410 `sandbox_stopped` (or 422 `sandbox_snapshotting`).
//! - Snapshots: `GET|DELETE /v2/sandboxes/snapshots/{id}`; a create from one starts with its
//!   files.
//! - Commands run for real on the host (`tokio::process`, their own process group) with the
//!   sandbox's `env` then the command's, HOME = the sandbox's `/vercel/sandbox`; the cwd
//!   (default `/vercel/sandbox`), every file path and every argument under `/vercel/` are
//!   sandbox paths mapped into a per-sandbox directory (`..` refused). A command's `timeout` (ms) kills it; a killed
//!   command exits 128 + signal.
//! - Test knobs: [`FakeVercel::script`] of create outcomes, [`FakeVercelConfig`], the
//!   inventory ([`FakeSandbox`] copies, [`FakeVercel::file`]) and the requests seen.
//!
//! Deliberately not implemented: isolation (other absolute paths in a command line are host
//! paths; a PATH of host directories), egress
//! enforcement (policies are validated and recorded only), forks, drives, interactive
//! shells, logs of detached commands, ports and routes (always `[]`), persistence of the
//! disk across stop/resume (a resumed sandbox keeps its directory), regions.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
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
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// The default session working directory (and the default user's home).
pub const CWD: &str = "/vercel/sandbox";
const MAX_BODY: usize = 64 << 20;
const MAX_TAGS: usize = 5;

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

/// How the fake behaves; every field has a default.
#[derive(Clone, Debug)]
pub struct FakeVercelConfig {
    /// How long a new session stays `pending`.
    pub start_delay: Duration,
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` or `created_then_503` create the sandbox stays
    /// out of listings (`GET /v2/sandboxes/{name}` sees it at once).
    pub appear_after: Duration,
}

impl Default for FakeVercelConfig {
    fn default() -> Self {
        FakeVercelConfig {
            start_delay: Duration::ZERO,
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 503 `{error: {code: "no_capacity"}}` (a stand-in: the SDK names no capacity code).
    Capacity,
    /// 429 `rate_limited` with `Retry-After`.
    RateLimit,
    /// 500 `internal_server_error`.
    Outage,
    /// 402 `payment_required`.
    Billing,
    /// The sandbox is created, the connection dropped without an answer.
    TimeoutAfterSend,
    /// The sandbox is created (its session starts), then 503 is answered, as when Vercel's
    /// edge gives up on a create its backend applied.
    CreatedThen503,
    /// Answered 200 with a `pending` session that then turns `failed`.
    FailedBeforeRunning,
    /// Refused before the script (bad input).
    Rejected,
}

impl CreateOutcome {
    fn parse(name: &str) -> Option<CreateOutcome> {
        Some(match name {
            "ok" => CreateOutcome::Ok,
            "capacity" => CreateOutcome::Capacity,
            "rate_limit" => CreateOutcome::RateLimit,
            "outage" => CreateOutcome::Outage,
            "billing" => CreateOutcome::Billing,
            "timeout_after_send" => CreateOutcome::TimeoutAfterSend,
            "created_then_503" => CreateOutcome::CreatedThen503,
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    Pending,
    Running,
    Stopping,
    Stopped,
    Failed,
    Snapshotting,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Pending => "pending",
            SessionStatus::Running => "running",
            SessionStatus::Stopping => "stopping",
            SessionStatus::Stopped => "stopped",
            SessionStatus::Failed => "failed",
            SessionStatus::Snapshotting => "snapshotting",
        }
    }
}

/// A sandbox as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeSandbox {
    pub name: String,
    pub session_id: String,
    /// Every session it had, oldest first.
    pub sessions: Vec<String>,
    pub status: SessionStatus,
    pub create_path: String,
    pub project_id: String,
    pub tags: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// The `networkPolicy` as the create (or a later update) sent it.
    pub network_policy: Option<Value>,
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub vcpus: Option<u64>,
    pub timeout_ms: u64,
    pub source_snapshot: Option<String>,
    pub deleted: bool,
    /// The sandbox's `/` on the host.
    pub root: PathBuf,
    /// Commands run, as `[command, args...]`.
    pub commands: Vec<Vec<String>>,
}

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// The running fake; dropping it stops the server and kills every command it started.
pub struct FakeVercel {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeVercel {
    pub async fn start(config: FakeVercelConfig) -> FakeVercel {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake Vercel");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            token: format!("vercel_fake_{}", random_hex(16)),
            team_id: "team_fake0123".to_string(),
            project_id: "prj_fake0123".to_string(),
            base,
            inner: Mutex::default(),
        });
        let tasks = vec![tokio::spawn(accept(listener, shared.clone()))];
        FakeVercel {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// The API base (what replaces `https://vercel.com/api`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    pub fn team_id(&self) -> &str {
        &self.shared.team_id
    }

    pub fn project_id(&self) -> &str {
        &self.shared.project_id
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `capacity`, `rate_limit`,
    /// `outage`, `billing`, `timeout_after_send`, `created_then_503`, `failed_before_running`.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Vercel has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// The outcome of every authenticated create, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn sandbox(&self, name: &str) -> Option<FakeSandbox> {
        let inner = self.shared.lock();
        inner
            .sandboxes
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.view(&self.shared.config))
    }

    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let inner = self.shared.lock();
        inner
            .sandboxes
            .iter()
            .map(|s| s.view(&self.shared.config))
            .collect()
    }

    /// Sandboxes not deleted whose session is pending or running.
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes()
            .into_iter()
            .filter(|s| {
                !s.deleted && matches!(s.status, SessionStatus::Pending | SessionStatus::Running)
            })
            .collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn live_with_tag(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        self.live()
            .into_iter()
            .filter(|s| s.tags.get(key).map(String::as_str) == Some(value))
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().requests.clone()
    }

    /// A file of a sandbox, by its sandbox path.
    pub fn file(&self, name: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.sandbox(name)?.root;
        let host = map_path(&root, CWD, path).ok()?;
        std::fs::read(host).ok()
    }
}

impl Drop for FakeVercel {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let mut inner = self.shared.lock();
        for command in inner.commands.iter_mut() {
            command.kill(9);
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeVercelConfig,
    token: String,
    team_id: String,
    project_id: String,
    base: PathBuf,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<CreateOutcome>,
    create_log: Vec<CreateOutcome>,
    sandboxes: Vec<Entry>,
    snapshots: Vec<Snap>,
    commands: Vec<Cmd>,
    requests: Vec<SeenRequest>,
    counter: u64,
}

impl Inner {
    fn next_id(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}_{}{:04}", random_hex(8), self.counter)
    }

    fn by_name(&mut self, name: &str) -> Option<&mut Entry> {
        self.sandboxes
            .iter_mut()
            .find(|s| s.name == name && !s.deleted)
    }

    fn by_session(&mut self, session: &str) -> Option<&mut Entry> {
        self.sandboxes
            .iter_mut()
            .find(|s| s.sessions.iter().any(|id| id == session))
    }

    fn kill_session(&mut self, session: &str) {
        for command in self.commands.iter_mut().filter(|c| c.session == session) {
            command.kill(9);
        }
    }
}

struct Entry {
    name: String,
    sessions: Vec<String>,
    status: SessionStatus,
    /// When the current session started (pending until `start_delay` later).
    started: Instant,
    /// A scripted `failed_before_running`: the session fails instead of running.
    fails: bool,
    hidden_until: Option<Instant>,
    create_path: String,
    project_id: String,
    tags: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    network_policy: Option<Value>,
    runtime: Option<String>,
    image: Option<String>,
    vcpus: Option<u64>,
    timeout_ms: u64,
    source_snapshot: Option<String>,
    deleted: bool,
    root: PathBuf,
    commands: Vec<Vec<String>>,
    created_ms: u64,
}

impl Entry {
    fn session(&self) -> &str {
        self.sessions.last().map(String::as_str).unwrap_or("")
    }

    /// The status now (a pending session turns running, or failed, once its delay passed).
    fn status(&self, config: &FakeVercelConfig) -> SessionStatus {
        if self.status == SessionStatus::Pending && self.started.elapsed() >= config.start_delay {
            return if self.fails {
                SessionStatus::Failed
            } else {
                SessionStatus::Running
            };
        }
        self.status
    }

    fn settle(&mut self, config: &FakeVercelConfig) {
        self.status = self.status(config);
    }

    fn view(&self, config: &FakeVercelConfig) -> FakeSandbox {
        FakeSandbox {
            name: self.name.clone(),
            session_id: self.session().to_string(),
            sessions: self.sessions.clone(),
            status: self.status(config),
            create_path: self.create_path.clone(),
            project_id: self.project_id.clone(),
            tags: self.tags.clone(),
            env: self.env.clone(),
            network_policy: self.network_policy.clone(),
            runtime: self.runtime.clone(),
            image: self.image.clone(),
            vcpus: self.vcpus,
            timeout_ms: self.timeout_ms,
            source_snapshot: self.source_snapshot.clone(),
            deleted: self.deleted,
            root: self.root.clone(),
            commands: self.commands.clone(),
        }
    }

    fn sandbox_json(&self, config: &FakeVercelConfig) -> Value {
        let mut v = json!({
            "name": self.name,
            "persistent": false,
            "region": "iad1",
            "vcpus": self.vcpus.unwrap_or(2),
            "memory": self.vcpus.unwrap_or(2) * 2048,
            "timeout": self.timeout_ms,
            "createdAt": self.created_ms,
            "updatedAt": now_ms(),
            "currentSessionId": self.session(),
            "status": self.status(config).as_str(),
            "cwd": CWD,
            "tags": self.tags,
        });
        if let Some(runtime) = &self.runtime {
            v["runtime"] = json!(runtime);
        }
        if let Some(image) = &self.image {
            v["image"] = json!(image);
        }
        if let Some(policy) = self.network_policy.as_ref().and_then(response_policy) {
            v["networkPolicy"] = policy;
        }
        v
    }

    fn session_json(&self, config: &FakeVercelConfig) -> Value {
        let mut v = json!({
            "id": self.session(),
            "memory": self.vcpus.unwrap_or(2) * 2048,
            "vcpus": self.vcpus.unwrap_or(2),
            "region": "iad1",
            "timeout": self.timeout_ms,
            "status": self.status(config).as_str(),
            "requestedAt": self.created_ms,
            "createdAt": self.created_ms,
            "updatedAt": now_ms(),
            "cwd": CWD,
        });
        if let Some(runtime) = &self.runtime {
            v["runtime"] = json!(runtime);
        }
        if let Some(snapshot) = &self.source_snapshot {
            v["sourceSnapshotId"] = json!(snapshot);
        }
        if let Some(policy) = self.network_policy.as_ref().and_then(response_policy) {
            v["networkPolicy"] = policy;
        }
        v
    }
}

struct Snap {
    id: String,
    session: String,
    files: PathBuf,
    size: u64,
    deleted: bool,
}

impl Snap {
    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "sourceSessionId": self.session,
            "region": "iad1",
            "status": if self.deleted { "deleted" } else { "created" },
            "sizeBytes": self.size,
            "createdAt": now_ms(),
            "updatedAt": now_ms(),
        })
    }
}

struct Cmd {
    id: String,
    session: String,
    name: String,
    args: Vec<String>,
    cwd: String,
    pgid: Option<i32>,
    exit_code: Option<i32>,
    started_ms: u64,
}

impl Cmd {
    fn kill(&mut self, signal: i32) {
        if let (Some(pgid), None) = (self.pgid, self.exit_code) {
            // SAFETY: signalling a process group this fake started.
            unsafe {
                libc::kill(-pgid, signal);
            }
        }
    }

    fn json(&self, finished: bool) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "args": self.args,
            "cwd": self.cwd,
            "sessionId": self.session,
            "exitCode": if finished { json!(self.exit_code.unwrap_or(0)) } else { json!(self.exit_code) },
            "startedAt": self.started_ms,
        })
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
    let _ = hyper::server::conn::http1::Builder::new()
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

    fn params(&self, name: &str) -> Vec<String> {
        self.query
            .as_deref()
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (decode(k) == name).then(|| decode(v))
            })
            .collect()
    }

    fn param(&self, name: &str) -> Option<String> {
        self.params(name).into_iter().next()
    }

    fn json(&self) -> Result<Value, Box<Reply>> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| refuse(400, "bad_request", &format!("invalid JSON body: {e}")))
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(api_error(413, "payload_too_large", "the body is too large")),
    };
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let result = route(&shared, &req).await;
    let status = result.as_ref().ok().map(|r| r.status().as_u16());
    shared.lock().requests.push(SeenRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
        query: req.query.clone(),
        status,
    });
    result
}

async fn route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let bearer = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(shared.token.as_str()) {
        return Ok(api_error(
            401,
            "forbidden",
            "Not authorized: the token is missing or invalid",
        ));
    }
    match req.param("teamId") {
        None => {
            return Ok(api_error(400, "bad_request", "teamId is required"));
        }
        Some(team) if team != shared.team_id => {
            return Ok(api_error(
                403,
                "forbidden",
                "You don't have permission to access this team",
            ));
        }
        Some(_) => {}
    }
    let path = req.path.strip_prefix("/api").unwrap_or(&req.path);
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode)
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let m = &req.method;
    Ok(match segs.as_slice() {
        [v, "sandboxes"] if *m == Method::POST && (*v == "v3" || *v == "v2") => {
            return create(shared, req, path).await
        }
        ["v2", "sandboxes"] if *m == Method::GET => list(shared, req),
        ["v2", "sandboxes", "snapshots", id] => snapshot_route(shared, req, id),
        ["v2", "sandboxes", "sessions", session, rest @ ..] => {
            session_route(shared, req, session, rest).await
        }
        ["v2", "sandboxes", name] if *m == Method::GET => get(shared, req, name),
        ["v2", "sandboxes", name] if *m == Method::DELETE => delete(shared, req, name),
        _ => api_error(
            404,
            "not_found",
            &format!("No route for {} {}", req.method, req.path),
        ),
    })
}

fn check_project(shared: &Shared, project: Option<&str>) -> Result<(), Box<Reply>> {
    match project {
        Some(p) if p == shared.project_id => Ok(()),
        Some(p) => Err(refuse(404, "not_found", &format!("Project not found: {p}"))),
        None => Err(refuse(400, "bad_request", "projectId is required")),
    }
}

// ---------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------

async fn create(shared: &Arc<Shared>, req: &Req, path: &str) -> Result<Reply, io::Error> {
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return Ok(*reply),
    };
    let parsed = match parse_create(shared, &body, path) {
        Ok(p) => p,
        Err(reply) => {
            shared.lock().create_log.push(CreateOutcome::Rejected);
            return Ok(*reply);
        }
    };
    let outcome = {
        let mut inner = shared.lock();
        let outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        outcome
    };
    let reply = match outcome {
        CreateOutcome::Capacity => {
            return Ok(api_error(
                503,
                "no_capacity",
                "No sandbox capacity available",
            ))
        }
        CreateOutcome::RateLimit => {
            let mut reply = api_error(429, "rate_limited", "Too many requests");
            reply.headers_mut().insert(
                "retry-after",
                shared.config.retry_after_secs.to_string().parse().unwrap(),
            );
            return Ok(reply);
        }
        CreateOutcome::Outage => {
            return Ok(api_error(
                500,
                "internal_server_error",
                "An unexpected error occurred",
            ))
        }
        CreateOutcome::Billing => {
            return Ok(api_error(
                402,
                "payment_required",
                "The team's plan does not allow this",
            ))
        }
        CreateOutcome::Ok
        | CreateOutcome::FailedBeforeRunning
        | CreateOutcome::CreatedThen503
        | CreateOutcome::TimeoutAfterSend => match new_sandbox(shared, parsed, outcome) {
            Ok(reply) => reply,
            Err(reply) => return Ok(*reply),
        },
        CreateOutcome::Rejected => unreachable!(),
    };
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other("scripted timeout_after_send"));
    }
    if outcome == CreateOutcome::CreatedThen503 {
        return Ok(api_error(
            503,
            "service_unavailable",
            "The service is temporarily unavailable",
        ));
    }
    Ok(reply)
}

struct NewSandbox {
    path: String,
    tags: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    network_policy: Option<Value>,
    runtime: Option<String>,
    image: Option<String>,
    vcpus: Option<u64>,
    timeout_ms: u64,
    snapshot: Option<String>,
}

fn string_map(value: &Value, field: &str) -> Result<BTreeMap<String, String>, Box<Reply>> {
    match value {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_string())),
                None => Err(refuse(
                    400,
                    "bad_request",
                    &format!("{field}.{k} must be a string"),
                )),
            })
            .collect(),
        _ => Err(refuse(
            400,
            "bad_request",
            &format!("{field} must be an object"),
        )),
    }
}

fn parse_create(shared: &Shared, body: &Value, path: &str) -> Result<NewSandbox, Box<Reply>> {
    check_project(shared, body["projectId"].as_str())?;
    let tags = string_map(&body["tags"], "tags")?;
    if tags.len() > MAX_TAGS {
        return Err(refuse(
            400,
            "bad_request",
            &format!("at most {MAX_TAGS} tags are allowed"),
        ));
    }
    let env = string_map(&body["env"], "env")?;
    let runtime = body["runtime"].as_str().map(str::to_string);
    let image = body["image"].as_str().map(str::to_string);
    if runtime.is_some() && image.is_some() {
        return Err(refuse(
            400,
            "bad_request",
            "runtime and image cannot be used together",
        ));
    }
    let network_policy = match &body["networkPolicy"] {
        Value::Null => None,
        policy => {
            validate_policy(policy).map_err(|m| refuse(400, "bad_request", &m))?;
            Some(policy.clone())
        }
    };
    let snapshot = match &body["source"] {
        Value::Null => None,
        source if source["type"] == "snapshot" => Some(
            source["snapshotId"]
                .as_str()
                .ok_or_else(|| refuse(400, "bad_request", "source.snapshotId is required"))?
                .to_string(),
        ),
        source => {
            return Err(refuse(
                400,
                "bad_request",
                &format!("the fake supports only snapshot sources, not {source}"),
            ))
        }
    };
    Ok(NewSandbox {
        path: path.to_string(),
        tags,
        env,
        network_policy,
        runtime,
        image,
        vcpus: body["resources"]["vcpus"].as_u64(),
        timeout_ms: body["timeout"].as_u64().unwrap_or(300_000),
        snapshot,
    })
}

/// The SDK's request schema: `"allow-all"`/`"deny-all"` (or `{mode}`), else `{allow:
/// [domains] | {domain: rules}, subnets: {allow: [cidr], deny: [cidr]}}`.
fn validate_policy(policy: &Value) -> Result<(), String> {
    if let Some(mode) = policy.as_str().or_else(|| policy["mode"].as_str()) {
        return match mode {
            "allow-all" | "deny-all" => Ok(()),
            other => Err(format!(
                "networkPolicy mode {other:?} is not allow-all or deny-all"
            )),
        };
    }
    let Some(object) = policy.as_object() else {
        return Err("networkPolicy must be a mode or an object".into());
    };
    for key in object.keys() {
        if key != "allow" && key != "subnets" {
            return Err(format!("networkPolicy.{key} is not a field"));
        }
    }
    match &policy["allow"] {
        Value::Null | Value::Object(_) => {}
        Value::Array(items) if items.iter().all(Value::is_string) => {}
        _ => return Err("networkPolicy.allow must be a list of domains or a map".into()),
    }
    for side in ["allow", "deny"] {
        match &policy["subnets"][side] {
            Value::Null => {}
            Value::Array(items) => {
                for item in items {
                    let cidr = item.as_str().unwrap_or_default();
                    if cidr.parse::<ipnet::IpNet>().is_err() {
                        return Err(format!(
                            "networkPolicy.subnets.{side}: {item} is not a CIDR"
                        ));
                    }
                }
            }
            _ => return Err(format!("networkPolicy.subnets.{side} must be a list")),
        }
    }
    Ok(())
}

/// The legacy shape the SDK's response validator accepts.
fn response_policy(policy: &Value) -> Option<Value> {
    if let Some(mode) = policy.as_str().or_else(|| policy["mode"].as_str()) {
        return Some(json!({"mode": mode}));
    }
    let mut out = json!({"mode": "custom"});
    match &policy["allow"] {
        Value::Array(domains) => out["allowedDomains"] = json!(domains),
        Value::Object(map) => out["allowedDomains"] = json!(map.keys().collect::<Vec<_>>()),
        _ => {}
    }
    if policy["subnets"]["allow"].is_array() {
        out["allowedCIDRs"] = policy["subnets"]["allow"].clone();
    }
    if policy["subnets"]["deny"].is_array() {
        out["deniedCIDRs"] = policy["subnets"]["deny"].clone();
    }
    Some(out)
}

fn new_sandbox(
    shared: &Arc<Shared>,
    spec: NewSandbox,
    outcome: CreateOutcome,
) -> Result<Reply, Box<Reply>> {
    let mut inner = shared.lock();
    let name = format!("sbx-{}", random_hex(12));
    let session = inner.next_id("sbx_sess");
    let root = shared.base.join(&name);
    std::fs::create_dir_all(root.join(CWD.trim_start_matches('/'))).expect("a sandbox root");
    if let Some(snapshot) = &spec.snapshot {
        let Some(snap) = inner
            .snapshots
            .iter()
            .find(|s| &s.id == snapshot && !s.deleted)
        else {
            return Err(refuse(
                410,
                "snapshot_not_found",
                &format!("Snapshot not found: {snapshot}"),
            ));
        };
        copy_tree(&snap.files, &root).expect("restore a snapshot");
    }
    let entry = Entry {
        name,
        sessions: vec![session],
        status: SessionStatus::Pending,
        started: Instant::now(),
        fails: outcome == CreateOutcome::FailedBeforeRunning,
        hidden_until: matches!(
            outcome,
            CreateOutcome::TimeoutAfterSend | CreateOutcome::CreatedThen503
        )
        .then(|| Instant::now() + shared.config.appear_after),
        create_path: spec.path,
        project_id: shared.project_id.clone(),
        tags: spec.tags,
        env: spec.env,
        network_policy: spec.network_policy,
        runtime: spec.runtime,
        image: spec.image,
        vcpus: spec.vcpus,
        timeout_ms: spec.timeout_ms,
        source_snapshot: spec.snapshot,
        deleted: false,
        root,
        commands: Vec::new(),
        created_ms: now_ms(),
    };
    let reply = json_reply(200, &sandbox_and_session(&shared.config, &entry, false));
    inner.sandboxes.push(entry);
    Ok(reply)
}

fn sandbox_and_session(config: &FakeVercelConfig, e: &Entry, resumed: bool) -> Value {
    json!({
        "sandbox": e.sandbox_json(config),
        "session": e.session_json(config),
        "routes": [],
        "resumed": resumed,
    })
}

fn list(shared: &Shared, req: &Req) -> Reply {
    if let Err(reply) = check_project(shared, req.param("project").as_deref()) {
        return *reply;
    }
    let tags = req.params("tags");
    if tags.len() > 1 {
        return api_error(
            400,
            "bad_request",
            "Filtering by multiple tags is not supported",
        );
    }
    let filter = match tags.first() {
        Some(tag) => match tag.split_once(':') {
            Some((k, v)) => Some((k.to_string(), v.to_string())),
            None => return api_error(400, "bad_request", "tags must be key:value"),
        },
        None => None,
    };
    let limit = match req.param("limit") {
        Some(l) => match l.parse::<usize>() {
            Ok(l) if (1..=100).contains(&l) => l,
            _ => return api_error(400, "bad_request", "limit must be from 1 to 100"),
        },
        None => 50,
    };
    let offset = match req.param("cursor") {
        Some(c) => match c.parse::<usize>() {
            Ok(c) => c,
            Err(_) => return api_error(400, "bad_request", "invalid cursor"),
        },
        None => 0,
    };
    let inner = shared.lock();
    let now = Instant::now();
    let mut matching: Vec<&Entry> = inner
        .sandboxes
        .iter()
        .filter(|e| !e.deleted)
        .filter(|e| e.hidden_until.is_none_or(|t| now >= t))
        .filter(|e| {
            filter
                .as_ref()
                .is_none_or(|(k, v)| e.tags.get(k) == Some(v))
        })
        .collect();
    matching.reverse(); // newest first, Vercel's default order
    let page: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|e| e.sandbox_json(&shared.config))
        .collect();
    let next = (offset + limit < matching.len()).then(|| (offset + limit).to_string());
    json_reply(
        200,
        &json!({"sandboxes": page, "pagination": {"count": page.len(), "next": next}}),
    )
}

fn get(shared: &Shared, req: &Req, name: &str) -> Reply {
    if let Err(reply) = check_project(shared, req.param("projectId").as_deref()) {
        return *reply;
    }
    let resume = req.param("resume").as_deref() == Some("true");
    let mut inner = shared.lock();
    let session = inner.next_id("sbx_sess");
    let Some(entry) = inner.by_name(name) else {
        return api_error(404, "not_found", &format!("Sandbox not found: {name}"));
    };
    entry.settle(&shared.config);
    let mut resumed = false;
    if resume && entry.status != SessionStatus::Running && entry.status != SessionStatus::Pending {
        entry.sessions.push(session);
        entry.status = SessionStatus::Pending;
        entry.started = Instant::now();
        entry.fails = false;
        resumed = true;
    }
    json_reply(200, &sandbox_and_session(&shared.config, entry, resumed))
}

fn delete(shared: &Shared, req: &Req, name: &str) -> Reply {
    if let Err(reply) = check_project(shared, req.param("projectId").as_deref()) {
        return *reply;
    }
    let mut inner = shared.lock();
    let Some(entry) = inner.by_name(name) else {
        return api_error(404, "not_found", &format!("Sandbox not found: {name}"));
    };
    entry.settle(&shared.config);
    if matches!(
        entry.status,
        SessionStatus::Running | SessionStatus::Pending
    ) {
        entry.status = SessionStatus::Stopped;
    }
    entry.deleted = true;
    let body = json!({"sandbox": entry.sandbox_json(&shared.config)});
    let session = entry.session().to_string();
    inner.kill_session(&session);
    json_reply(200, &body)
}

fn snapshot_route(shared: &Shared, req: &Req, id: &str) -> Reply {
    let mut inner = shared.lock();
    let Some(snap) = inner.snapshots.iter_mut().find(|s| s.id == id) else {
        return api_error(404, "not_found", &format!("Snapshot not found: {id}"));
    };
    match req.method {
        Method::GET => json_reply(200, &json!({"snapshot": snap.json()})),
        Method::DELETE => {
            snap.deleted = true;
            json_reply(200, &json!({"snapshot": snap.json()}))
        }
        _ => api_error(404, "not_found", "No route"),
    }
}

// ---------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------

/// What a session operation needs, copied out of the lock.
struct SessionView {
    root: PathBuf,
    env: BTreeMap<String, String>,
    current: bool,
    status: SessionStatus,
}

async fn session_route(shared: &Arc<Shared>, req: &Req, session: &str, rest: &[&str]) -> Reply {
    let view = {
        let mut inner = shared.lock();
        let Some(entry) = inner.by_session(session) else {
            return api_error(404, "not_found", &format!("Session not found: {session}"));
        };
        entry.settle(&shared.config);
        SessionView {
            root: entry.root.clone(),
            env: entry.env.clone(),
            current: entry.session() == session && !entry.deleted,
            status: entry.status,
        }
    };
    let status = if view.current {
        view.status
    } else {
        SessionStatus::Stopped
    };
    let m = &req.method;
    match rest {
        [] if *m == Method::GET => {
            let mut inner = shared.lock();
            let entry = inner.by_session(session).expect("the session's sandbox");
            let mut body = entry.session_json(&shared.config);
            body["status"] = json!(status.as_str());
            json_reply(200, &json!({"session": body, "routes": []}))
        }
        ["stop"] if *m == Method::POST => {
            let mut inner = shared.lock();
            let entry = inner.by_session(session).expect("the session's sandbox");
            if view.current && matches!(status, SessionStatus::Running | SessionStatus::Pending) {
                entry.status = SessionStatus::Stopped;
            }
            let mut session_body = entry.session_json(&shared.config);
            session_body["status"] = json!(if view.current {
                entry.status.as_str()
            } else {
                "stopped"
            });
            let body =
                json!({"session": session_body, "sandbox": entry.sandbox_json(&shared.config)});
            inner.kill_session(session);
            json_reply(200, &body)
        }
        _ if status == SessionStatus::Snapshotting => {
            api_error(422, "sandbox_snapshotting", "Sandbox is snapshotting")
        }
        _ if status != SessionStatus::Running => {
            api_error(410, "sandbox_stopped", "Sandbox is stopped")
        }
        ["snapshot"] if *m == Method::POST => take_snapshot(shared, session, &view),
        ["extend-timeout"] if *m == Method::POST => {
            let body = match req.json() {
                Ok(b) => b,
                Err(reply) => return *reply,
            };
            let mut inner = shared.lock();
            let entry = inner.by_session(session).expect("the session's sandbox");
            entry.timeout_ms += body["duration"].as_u64().unwrap_or(0);
            json_reply(200, &json!({"session": entry.session_json(&shared.config)}))
        }
        ["network-policy"] if *m == Method::POST => {
            let body = match req.json() {
                Ok(b) => b,
                Err(reply) => return *reply,
            };
            if let Err(m) = validate_policy(&body) {
                return api_error(400, "bad_request", &m);
            }
            let mut inner = shared.lock();
            let entry = inner.by_session(session).expect("the session's sandbox");
            entry.network_policy = Some(body);
            json_reply(200, &json!({"session": entry.session_json(&shared.config)}))
        }
        ["cmd"] if *m == Method::POST => run_command(shared, req, session, &view).await,
        ["cmd", id] if *m == Method::GET => {
            let wait = req.param("wait").as_deref() == Some("true");
            loop {
                let done = {
                    let inner = shared.lock();
                    let Some(cmd) = inner.commands.iter().find(|c| c.id == *id) else {
                        return api_error(404, "not_found", &format!("Command not found: {id}"));
                    };
                    if !wait || cmd.exit_code.is_some() {
                        Some(json!({"command": cmd.json(wait)}))
                    } else {
                        None
                    }
                };
                if let Some(body) = done {
                    return json_reply(200, &body);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        ["cmd", id, "kill"] if *m == Method::POST => {
            let body = match req.json() {
                Ok(b) => b,
                Err(reply) => return *reply,
            };
            let signal = body["signal"].as_i64().unwrap_or(15) as i32;
            let mut inner = shared.lock();
            let Some(cmd) = inner.commands.iter_mut().find(|c| c.id == *id) else {
                return api_error(404, "not_found", &format!("Command not found: {id}"));
            };
            cmd.kill(signal);
            json_reply(200, &json!({"command": cmd.json(false)}))
        }
        ["fs", "read"] if *m == Method::POST => fs_read(req, &view),
        ["fs", "write"] if *m == Method::POST => fs_write(req, &view),
        ["fs", "mkdir"] if *m == Method::POST => fs_mkdir(req, &view),
        _ => api_error(
            404,
            "not_found",
            &format!("No route for {} {}", req.method, req.path),
        ),
    }
}

fn take_snapshot(shared: &Shared, session: &str, view: &SessionView) -> Reply {
    let mut inner = shared.lock();
    let id = inner.next_id("snap");
    let files = shared.base.join(format!("snapshot-{id}"));
    if let Err(e) = copy_tree(&view.root, &files) {
        return api_error(
            500,
            "internal_server_error",
            &format!("snapshot failed: {e}"),
        );
    }
    let size = tree_size(&files);
    let snap = Snap {
        id,
        session: session.to_string(),
        files,
        size,
        deleted: false,
    };
    let snapshot = snap.json();
    inner.snapshots.push(snap);
    inner.kill_session(session);
    let entry = inner.by_session(session).expect("the session's sandbox");
    // Vercel stops the session it snapshots.
    entry.status = SessionStatus::Stopped;
    json_reply(
        200,
        &json!({"snapshot": snapshot, "session": entry.session_json(&shared.config)}),
    )
}

/// A sandbox path (absolute, or relative to `cwd`) on the host, `..` refused.
fn map_path(root: &Path, cwd: &str, raw: &str) -> Result<PathBuf, String> {
    let full = if raw.starts_with('/') {
        raw.to_string()
    } else {
        format!("{}/{raw}", cwd.trim_end_matches('/'))
    };
    let mut host = root.to_path_buf();
    for component in Path::new(&full).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => host.push(part),
            Component::ParentDir => return Err(format!("{raw}: `..` is not allowed")),
            Component::Prefix(_) => return Err(format!("{raw}: not a sandbox path")),
        }
    }
    Ok(host)
}

fn fs_read(req: &Req, view: &SessionView) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return *reply,
    };
    let Some(path) = body["path"].as_str() else {
        return api_error(400, "bad_request", "path is required");
    };
    let cwd = body["cwd"].as_str().unwrap_or(CWD);
    let host = match map_path(&view.root, cwd, path) {
        Ok(h) => h,
        Err(m) => return api_error(400, "bad_request", &m),
    };
    match std::fs::read(&host) {
        Ok(data) => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(full(data))
            .expect("a response"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            api_error(404, "file_not_found", &format!("File not found: {path}"))
        }
        Err(e) => api_error(400, "bad_request", &format!("{path}: {e}")),
    }
}

fn fs_write(req: &Req, view: &SessionView) -> Reply {
    if req.header("content-type") != Some("application/gzip") {
        return api_error(
            400,
            "bad_request",
            "fs/write takes an application/gzip body",
        );
    }
    let extract = req.header("x-cwd").unwrap_or("/").to_string();
    if !extract.starts_with('/') {
        return api_error(400, "bad_request", "x-cwd must be absolute");
    }
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&req.body[..]));
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => return api_error(400, "bad_request", &format!("not a gzip tar: {e}")),
    };
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => return api_error(400, "bad_request", &format!("a broken tar entry: {e}")),
        };
        let name = match entry.path() {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) => return api_error(400, "bad_request", &format!("a tar entry name: {e}")),
        };
        if name.starts_with('/') {
            return api_error(400, "bad_request", &format!("{name}: absolute tar entry"));
        }
        let host = match map_path(&view.root, &extract, &name) {
            Ok(h) => h,
            Err(m) => return api_error(400, "bad_request", &m),
        };
        let kind = entry.header().entry_type();
        let result = if kind.is_dir() {
            std::fs::create_dir_all(&host)
        } else if kind.is_file() {
            let mut data = Vec::new();
            io::Read::read_to_end(&mut entry, &mut data)
                .and_then(|_| std::fs::create_dir_all(host.parent().unwrap_or(&view.root)))
                .and_then(|_| std::fs::write(&host, &data))
                .and_then(|_| {
                    let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
                    let permissions = std::os::unix::fs::PermissionsExt::from_mode(mode);
                    std::fs::set_permissions(&host, permissions)
                })
        } else {
            return api_error(
                400,
                "bad_request",
                &format!("{name}: unsupported tar entry"),
            );
        };
        if let Err(e) = result {
            return api_error(400, "bad_request", &format!("{name}: {e}"));
        }
    }
    json_reply(200, &json!({}))
}

fn fs_mkdir(req: &Req, view: &SessionView) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return *reply,
    };
    let Some(path) = body["path"].as_str() else {
        return api_error(400, "bad_request", "path is required");
    };
    let cwd = body["cwd"].as_str().unwrap_or(CWD);
    let host = match map_path(&view.root, cwd, path) {
        Ok(h) => h,
        Err(m) => return api_error(400, "bad_request", &m),
    };
    match std::fs::create_dir(&host) {
        Ok(()) => json_reply(200, &json!({})),
        Err(e) => api_error(400, "bad_request", &format!("mkdir failed: {path}: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------------------

async fn run_command(shared: &Arc<Shared>, req: &Req, session: &str, view: &SessionView) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return *reply,
    };
    let Some(program) = body["command"].as_str().filter(|c| !c.is_empty()) else {
        return api_error(400, "bad_request", "command is required");
    };
    let args: Vec<String> = match &body["args"] {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => return api_error(400, "bad_request", "args must be a list of strings"),
    };
    let env = match string_map(&body["env"], "env") {
        Ok(e) => e,
        Err(reply) => return *reply,
    };
    let cwd = body["cwd"].as_str().unwrap_or(CWD).to_string();
    if !cwd.starts_with('/') {
        return api_error(400, "bad_request", "cwd must be absolute");
    }
    let host_cwd = match map_path(&view.root, CWD, &cwd) {
        Ok(h) => h,
        Err(m) => return api_error(400, "bad_request", &m),
    };
    let wait = body["wait"].as_bool().unwrap_or(false);
    let logs = body["logs"].as_bool().unwrap_or(false);
    let timeout = body["timeout"].as_u64().map(Duration::from_millis);

    // Arguments naming the sandbox's own tree (`/vercel/...`) are mapped into it; other
    // absolute paths are host paths.
    let mut host_args = Vec::with_capacity(args.len());
    for arg in &args {
        if arg == "/vercel" || arg.starts_with("/vercel/") {
            match map_path(&view.root, CWD, arg) {
                Ok(h) => host_args.push(h.into_os_string()),
                Err(m) => return api_error(400, "bad_request", &m),
            }
        } else {
            host_args.push(arg.into());
        }
    }
    let home = view.root.join(CWD.trim_start_matches('/'));
    let mut command = tokio::process::Command::new(program);
    command
        .args(&host_args)
        .current_dir(&host_cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", &home)
        .env("USER", "vercel-sandbox")
        .envs(&view.env)
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let id;
    let started_ms = now_ms();
    let spawned = command.spawn();
    {
        let mut inner = shared.lock();
        id = inner.next_id("cmd");
        if let Some(entry) = inner.by_session(session) {
            let mut line = vec![program.to_string()];
            line.extend(args.iter().cloned());
            entry.commands.push(line);
        }
        let pgid = spawned.as_ref().ok().and_then(|c| c.id()).map(|p| p as i32);
        inner.commands.push(Cmd {
            id: id.clone(),
            session: session.to_string(),
            name: program.to_string(),
            args: args.clone(),
            cwd: cwd.clone(),
            pgid,
            // A program that cannot start exits 127, as a shell reports it.
            exit_code: if spawned.is_err() { Some(127) } else { None },
            started_ms,
        });
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let first = {
        let inner = shared.lock();
        let cmd = inner
            .commands
            .iter()
            .find(|c| c.id == id)
            .expect("the command");
        let mut v = cmd.json(false);
        v["exitCode"] = Value::Null;
        json!({"command": v})
    };
    let spawn_error = spawned.as_ref().err().map(|e| format!("{program}: {e}\n"));
    let shared2 = shared.clone();
    let id2 = id.clone();
    tokio::spawn(async move {
        let stream_logs = wait && logs;
        let code = match spawned {
            Ok(mut child) => {
                let stdout = child.stdout.take().expect("stdout");
                let stderr = child.stderr.take().expect("stderr");
                let out = tokio::spawn(pump(stdout, "stdout", tx.clone(), stream_logs));
                let err = tokio::spawn(pump(stderr, "stderr", tx.clone(), stream_logs));
                let status = match timeout {
                    Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                        Ok(status) => status,
                        Err(_) => {
                            if let Some(pid) = child.id() {
                                // SAFETY: the command's own process group.
                                unsafe {
                                    libc::kill(-(pid as i32), 9);
                                }
                            }
                            child.wait().await
                        }
                    },
                    None => child.wait().await,
                };
                let _ = tokio::time::timeout(Duration::from_millis(500), out).await;
                let _ = tokio::time::timeout(Duration::from_millis(500), err).await;
                match status {
                    Ok(status) => status.code().unwrap_or_else(|| {
                        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(9)
                    }),
                    Err(_) => 1,
                }
            }
            Err(_) => {
                if let (Some(message), true) = (spawn_error, stream_logs) {
                    let line = json!({"stream": "stderr", "data": message});
                    let _ = tx.send(ndjson_line(&line)).await;
                }
                127
            }
        };
        let last = {
            let mut inner = shared2.lock();
            let cmd = inner
                .commands
                .iter_mut()
                .find(|c| c.id == id2)
                .expect("the command");
            cmd.exit_code = Some(code);
            json!({"command": cmd.json(true)})
        };
        if wait {
            let _ = tx.send(ndjson_line(&last)).await;
        }
    });
    if !wait {
        return json_reply(200, &first);
    }
    let (frames_tx, frames_rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(64);
    tokio::spawn(async move {
        let mut rx = rx;
        if frames_tx
            .send(Ok(Frame::data(ndjson_line(&first))))
            .await
            .is_err()
        {
            return;
        }
        while let Some(line) = rx.recv().await {
            if frames_tx.send(Ok(Frame::data(line))).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/x-ndjson")
        .body(BodyExt::boxed(ChannelBody(frames_rx)))
        .expect("a response")
}

/// Forwards one pipe as `{stream, data}` lines.
async fn pump(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    stream: &'static str,
    tx: mpsc::Sender<Bytes>,
    forward: bool,
) {
    let mut buf = vec![0u8; 16 << 10];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !forward {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        // Keep an incomplete UTF-8 sequence for the next read.
        let valid = match std::str::from_utf8(&pending) {
            Ok(_) => pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => pending.len(),
        };
        if valid == 0 {
            continue;
        }
        let chunk: Vec<u8> = pending.drain(..valid).collect();
        let line = json!({"stream": stream, "data": String::from_utf8_lossy(&chunk)});
        if tx.send(ndjson_line(&line)).await.is_err() {
            return;
        }
    }
    if forward && !pending.is_empty() {
        let line = json!({"stream": stream, "data": String::from_utf8_lossy(&pending)});
        let _ = tx.send(ndjson_line(&line)).await;
    }
}

fn ndjson_line(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).expect("JSON");
    line.push(b'\n');
    Bytes::from(line)
}

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

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

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

/// An error answer, boxed (for `Result`s).
fn refuse(status: u16, code: &str, message: &str) -> Box<Reply> {
    Box::new(api_error(status, code, message))
}

/// Vercel's error shape.
fn api_error(status: u16, code: &str, message: &str) -> Reply {
    json_reply(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn random_hex(len: usize) -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    bytes
        .iter()
        .take(len.div_ceil(2))
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .chars()
        .take(len)
        .collect()
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn tree_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(k) if k.is_dir() => tree_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}
