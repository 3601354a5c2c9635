//! A fake E2B on a real socket: the control plane (the REST API at `E2B_API_URL`) and envd
//! (each sandbox's agent) on one `http://127.0.0.1:PORT` origin, HTTP/1.1 or h2c.
//!
//! `tests/it/e2b_fake.rs::official_python_sdk_accepts_the_fake` proves it with the official
//! `e2b` Python SDK 2.63.0 (`tests/sdk/e2b_contract.py`): the SDK's own client creates,
//! inspects, lists (filters, pages), pauses, connects, times out and kills sandboxes, runs
//! commands and moves files through it. Field names, paths, status codes and error bodies
//! come from that SDK's generated client, E2B's `spec/openapi.yml`, `spec/envd/*` and the
//! `e2b-dev/infra` handlers, never from guesses where those say otherwise.
//!
//! envd is reached as the SDKs reach it with `E2B_SANDBOX_URL`: every call on this origin
//! carrying `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`, 49983 by default) is routed to that
//! sandbox; so is a `Host` of `49983-{id}.{domain}`.
//!
//! Implemented:
//! - Control plane (`X-API-Key`; errors `{code, error_code?, message}`): `POST /v2/sandboxes`
//!   and `POST /sandboxes` (NewSandbox, default timeout 300 s and 15 s respectively, egress
//!   rules validated as E2B does, `Idempotency-Key` honoured), `GET /sandboxes/{id}`,
//!   `GET /v2/sandboxes` (metadata / state / template / startedAfter filters, `order`,
//!   `limit` 1..=100, `nextToken` / `X-Next-Token`), `GET /sandboxes` (running only),
//!   `DELETE /sandboxes/{id}`, `POST .../pause`, `.../connect` (also under `/v2`; 200 when
//!   running, 201 when resumed), `.../resume`, `.../timeout`, `.../refreshes`,
//!   `PUT .../network`, `POST .../snapshots` (a copy of the sandbox's files, usable as a
//!   `templateID`), `GET /snapshots`, `DELETE /templates/{snapshot}`. Sandboxes whose timeout
//!   passes are killed (or paused with `autoPause`), as E2B does.
//! - envd (`X-Access-Token`; a sandbox unknown, killed or paused answers a plain 502 JSON the
//!   SDKs map to "not running"): `GET /health`, `GET`/`POST /files` (multipart or
//!   octet-stream), Connect-RPC with the JSON codec: `process.Process/Start` (a server
//!   stream; the command really runs, see below), `List`, `SendSignal`, `SendInput`,
//!   `CloseStdin`, `filesystem.Filesystem/Stat`, `ListDir`, `MakeDir`, `Remove`, `Move`.
//!   Paths are resolved as envd does (relative to `/home/user`, `..` stopping at `/`) inside a
//!   per-sandbox directory on the host, and refused (400) when a symlink leads out of it.
//! - Commands run on the host (`/bin/sh -c 'exec "$@"'`, like envd's wrapper) in their own
//!   process group, with envd's environment: PATH, HOME (the sandbox's `/home/user`), USER,
//!   LOGNAME, the sandbox's `envVars`, then the request's `envs`. Output is streamed as it
//!   comes; `Connect-Timeout-Ms` kills the command and ends the stream `deadline_exceeded`;
//!   a client going away leaves it running (as envd does). Pausing stops the group
//!   (SIGSTOP), resuming continues it, killing the sandbox (or dropping the fake) kills it.
//! - Test knobs: a fault [`FakeE2b::script`] for creates, [`FakeE2bConfig`], the inventory
//!   ([`FakeSandbox`] snapshots), the requests seen ([`SeenRequest`], no secrets), files.
//!
//! Deliberately not implemented: any isolation (commands are the test's own processes;
//! absolute paths in a command line are host paths), PTYs, `Process.Connect`,
//! `StreamInput`, `Update`, filesystem watchers, gzip bodies, file metadata (the reported
//! envd version, 0.5.7, tells the SDK so), templates and builds, volumes, secrets, teams,
//! metrics, logs, forks, egress enforcement (rules are validated and recorded only), and
//! expiry of paused sandboxes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// envd's port, as the SDKs send it in `E2b-Sandbox-Port`.
pub const ENVD_PORT: u16 = 49983;
/// What E2B answers as `clientID` (the SDKs only require it to be present).
const CLIENT_ID: &str = "6532622b";
/// The home of the sandbox's default user, where envd resolves relative paths.
const HOME: &str = "/home/user";
/// The API's upper bound on a sandbox timeout (E2B's Pro tier: 24 h).
const MAX_TIMEOUT_SECS: u64 = 24 * 3600;
const MAX_BODY: usize = 256 << 20;
/// After the command exits, how long output still held open by its children is forwarded.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);
/// Connect's end-of-stream flag.
const END_STREAM: u8 = 0x02;

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

/// How the fake behaves; every field has a default.
#[derive(Clone, Debug)]
pub struct FakeE2bConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// Send that `Retry-After` as an HTTP-date (RFC 9110 allows both forms).
    pub retry_after_as_date: bool,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` create the instance stays out of listings
    /// (E2B's list is eventually consistent; `GET /sandboxes/{id}` sees it at once).
    pub appear_after: Duration,
    /// The `envdVersion` reported; the SDKs gate features on it (0.5.7: octet-stream
    /// uploads yes, file metadata no).
    pub envd_version: String,
    /// How long every create answer takes to be sent. The sandbox exists (and is listed)
    /// from the request on, as when E2B's API is slow to answer a create it already placed.
    pub answer_after: Duration,
}

impl Default for FakeE2bConfig {
    fn default() -> Self {
        FakeE2bConfig {
            retry_after_secs: 1,
            retry_after_as_date: false,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            envd_version: "0.5.7".to_string(),
            answer_after: Duration::ZERO,
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// 201, a running sandbox.
    Ok,
    /// 503 `sandbox_capacity_unavailable`.
    Capacity,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 503 without `error_code`.
    Outage,
    /// 500 without `error_code` (nothing created).
    ServerError,
    /// The sandbox is created (and its `Idempotency-Key` remembered), then 500 without
    /// `error_code` is answered: a retry with the key replays it.
    AppliedThen500,
    /// 504 `sandbox_placement_timeout`.
    PlacementTimeout,
    /// 503 `sandbox_no_compatible_node`.
    NoCompatibleNode,
    /// 500 `sandbox_create_failed`; the inventory keeps a `Failed` entry.
    FailedBeforeRunning,
    /// The sandbox is created but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Answered from an earlier create with the same `Idempotency-Key` (no script used).
    Replayed,
    /// Refused before the script: bad input, or a reused key with another body.
    Rejected,
}

impl CreateOutcome {
    /// The name [`FakeE2b::script`] takes.
    fn parse(name: &str) -> Option<CreateOutcome> {
        Some(match name {
            "ok" => CreateOutcome::Ok,
            "capacity" => CreateOutcome::Capacity,
            "rate_limit" => CreateOutcome::RateLimit,
            "outage" => CreateOutcome::Outage,
            "server_error" => CreateOutcome::ServerError,
            "applied_then_500" => CreateOutcome::AppliedThen500,
            "placement_timeout" => CreateOutcome::PlacementTimeout,
            "no_compatible_node" => CreateOutcome::NoCompatibleNode,
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            "timeout_after_send" => CreateOutcome::TimeoutAfterSend,
            _ => return None,
        })
    }
}

/// One authenticated create request.
#[derive(Clone, Debug)]
pub struct CreateRecord {
    pub outcome: CreateOutcome,
    /// `/v2/sandboxes` or `/sandboxes`.
    pub path: String,
    pub template_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    /// The sandbox created (or replayed), if any.
    pub sandbox_id: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxState {
    Running,
    Paused,
    Killed,
    /// A scripted `failed_before_running`: never reachable.
    Failed,
}

/// One `PUT /sandboxes/{id}/network`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkUpdate {
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    pub allow_internet_access: Option<bool>,
}

/// A sandbox as the fake holds it (a copy: later changes are not reflected).
#[derive(Clone, Debug)]
pub struct FakeSandbox {
    pub sandbox_id: String,
    pub template_id: String,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    /// The timeout last set (create, `connect`, `timeout`).
    pub timeout_secs: u64,
    pub auto_pause: bool,
    /// The create path used: `/v2/sandboxes` or `/sandboxes`.
    pub create_path: String,
    pub state: SandboxState,
    pub network_updates: Vec<NetworkUpdate>,
    /// The sandbox's `/` on the host.
    pub root: PathBuf,
    /// What envd expects in `X-Access-Token` (the create response carries it too).
    pub envd_access_token: String,
    pub idempotency_key: Option<String>,
    /// The snapshot whose files it started with.
    pub restored_from: Option<String>,
    pub started_at: SystemTime,
}

/// Which side of the origin a request reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Control,
    Envd,
}

/// A request the fake received (headers and bodies are not kept: they carry secrets).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: Option<String>,
    pub plane: Plane,
    /// The envd target, or the sandbox named in a control-plane path.
    pub sandbox_id: Option<String>,
    pub idempotency_key: Option<String>,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// The running fake; dropping it stops the server and kills every command it started.
pub struct FakeE2b {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeE2b {
    pub async fn start(config: FakeE2bConfig) -> FakeE2b {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake E2B");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            api_key: format!("e2b_fake_{}", random_hex(16)),
            domain: "fake-e2b.test".to_string(),
            base,
            inner: Mutex::default(),
        });
        let tasks = vec![
            tokio::spawn(accept(listener, shared.clone())),
            tokio::spawn(expire_timed_out(shared.clone())),
        ];
        FakeE2b {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: both `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// The `domain` the fake reports (it resolves nowhere: use [`FakeE2b::url`]).
    pub fn domain(&self) -> &str {
        &self.shared.domain
    }

    /// Outcomes for the next creates, in order (then `ok`, or the [`FakeE2b::always`] one):
    /// `ok`, `capacity`, `rate_limit`, `outage`, `server_error`, `applied_then_500`,
    /// `placement_timeout`, `no_compatible_node`, `failed_before_running`,
    /// `timeout_after_send`. Panics on another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake E2B has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// The outcome of every create once the script is used up (instead of `ok`).
    pub fn always(&self, name: &str) {
        let outcome = CreateOutcome::parse(name)
            .unwrap_or_else(|| panic!("the fake E2B has no create outcome {name:?}"));
        self.shared.lock().always = Some(outcome);
    }

    /// Authenticated `GET /v2/sandboxes` requests (listings) so far.
    pub fn list_calls(&self) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.method == "GET" && r.path.trim_end_matches('/') == "/v2/sandboxes")
            .count()
    }

    pub fn pending_script(&self) -> Vec<CreateOutcome> {
        self.shared.lock().script.iter().copied().collect()
    }

    /// Authenticated create requests, whatever they came to.
    pub fn create_attempts(&self) -> usize {
        self.shared.lock().creates.len()
    }

    pub fn create_log(&self) -> Vec<CreateRecord> {
        self.shared.lock().creates.clone()
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.shared.lock().sandboxes.get(id).map(|e| e.view.clone())
    }

    /// Every sandbox ever created (killed and failed ones too), oldest first.
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let inner = self.shared.lock();
        let mut entries: Vec<&Entry> = inner.sandboxes.values().collect();
        entries.sort_by_key(|e| e.seq);
        entries.into_iter().map(|e| e.view.clone()).collect()
    }

    /// Running or paused sandboxes (what costs money at E2B).
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes()
            .into_iter()
            .filter(|s| matches!(s.state, SandboxState::Running | SandboxState::Paused))
            .collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn live_with_metadata(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        self.live()
            .into_iter()
            .filter(|s| s.metadata.get(key).map(String::as_str) == Some(value))
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().requests.clone()
    }

    /// A file inside a sandbox, by its path there (`/home/user/x`, or relative to it).
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.sandbox(id)?.root;
        std::fs::read(resolve(&root, path).ok()?.host).ok()
    }

    /// Ends a running sandbox's timeout now: it is killed, or paused when `autoPause`.
    /// `false` when it is not running.
    pub fn expire(&self, id: &str) -> bool {
        let mut inner = self.shared.lock();
        match inner.sandboxes.get_mut(id) {
            Some(e) if e.view.state == SandboxState::Running => {
                e.deadline = SystemTime::now();
                inner.sweep();
                true
            }
            _ => false,
        }
    }
}

impl Drop for FakeE2b {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for pid in self.shared.lock().processes.keys() {
            signal_group(*pid, libc::SIGKILL);
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeE2bConfig,
    api_key: String,
    domain: String,
    /// Holds `sandboxes/{id}` (each sandbox's `/`) and `snapshots/{id}`.
    base: PathBuf,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock must not hide the state from others.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, req: &Req, target: Option<&(String, u16)>, status: Option<u16>) {
        let (plane, sandbox_id) = match target {
            Some((id, _)) => (Plane::Envd, Some(id.clone())),
            None => (Plane::Control, path_sandbox_id(&req.segments())),
        };
        self.lock().requests.push(SeenRequest {
            method: req.method.to_string(),
            path: req.path.clone(),
            query: req.query.clone(),
            plane,
            sandbox_id,
            idempotency_key: req.header("idempotency-key").map(str::to_string),
            status,
        });
    }
}

#[derive(Default)]
struct Inner {
    sandboxes: HashMap<String, Entry>,
    script: VecDeque<CreateOutcome>,
    /// What a create comes to once the script is used up (`None`: `ok`).
    always: Option<CreateOutcome>,
    creates: Vec<CreateRecord>,
    requests: Vec<SeenRequest>,
    idempotency: HashMap<String, Remembered>,
    snapshots: Vec<Snapshot>,
    /// Running commands by pid (also their process group).
    processes: HashMap<u32, Proc>,
    seq: u64,
}

struct Entry {
    view: FakeSandbox,
    /// Creation order: listings sort and page by it.
    seq: u64,
    /// Listings show the sandbox from then on.
    visible_at: Instant,
    deadline: SystemTime,
    /// Bumped when the sandbox stops running: open command streams are cut, as E2B's are.
    cut: watch::Sender<u64>,
    /// The `network` object of the create, echoed by `GET /sandboxes/{id}`.
    network: Option<Value>,
}

struct Remembered {
    path: String,
    body: Value,
    sandbox_id: String,
}

struct Snapshot {
    snapshot_id: String,
    template_id: String,
    names: Vec<String>,
    sandbox_id: String,
    dir: PathBuf,
}

impl Snapshot {
    fn answers_to(&self, name: &str) -> bool {
        self.snapshot_id == name || self.template_id == name || self.names.iter().any(|n| n == name)
    }
}

struct Proc {
    sandbox_id: String,
    tag: Option<String>,
    /// The ProcessConfig, as `Process/List` returns it.
    config: Value,
    stdin: Option<Arc<tokio::sync::Mutex<Option<ChildStdin>>>>,
}

impl Inner {
    fn live(&self, id: &str) -> Option<&Entry> {
        self.sandboxes
            .get(id)
            .filter(|e| matches!(e.view.state, SandboxState::Running | SandboxState::Paused))
    }

    fn live_mut(&mut self, id: &str) -> Option<&mut Entry> {
        self.sandboxes
            .get_mut(id)
            .filter(|e| matches!(e.view.state, SandboxState::Running | SandboxState::Paused))
    }

    /// Moves a sandbox to `to`, doing to its commands what E2B's VM does to them.
    fn transition(&mut self, id: &str, to: SandboxState) {
        let signal = match to {
            SandboxState::Killed => libc::SIGKILL,
            SandboxState::Paused => libc::SIGSTOP,
            SandboxState::Running => libc::SIGCONT,
            SandboxState::Failed => return,
        };
        for (pid, p) in &self.processes {
            if p.sandbox_id == id {
                signal_group(*pid, signal);
            }
        }
        if let Some(e) = self.sandboxes.get_mut(id) {
            e.view.state = to;
            if to != SandboxState::Running {
                e.cut.send_modify(|n| *n += 1);
            }
        }
    }

    /// Running sandboxes past their timeout are killed, or paused when `autoPause`.
    fn sweep(&mut self) {
        let now = SystemTime::now();
        let expired: Vec<(String, bool)> = self
            .sandboxes
            .values()
            .filter(|e| e.view.state == SandboxState::Running && e.deadline <= now)
            .map(|e| (e.view.sandbox_id.clone(), e.view.auto_pause))
            .collect();
        for (id, pause) in expired {
            let to = if pause {
                SandboxState::Paused
            } else {
                SandboxState::Killed
            };
            self.transition(&id, to);
        }
    }

    fn snapshot_for(&self, template: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.answers_to(template))
    }

    fn log_create(
        &mut self,
        path: &str,
        spec: Option<&CreateSpec>,
        outcome: CreateOutcome,
        id: Option<&str>,
    ) {
        self.creates.push(CreateRecord {
            outcome,
            path: path.to_string(),
            template_id: spec.map(|s| s.template_id.clone()),
            metadata: spec.map(|s| s.metadata.clone()).unwrap_or_default(),
            idempotency_key: spec.and_then(|s| s.key.clone()),
            sandbox_id: id.map(str::to_string),
        });
    }
}

/// Sandboxes time out even when no request comes to notice.
async fn expire_timed_out(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        shared.lock().sweep();
    }
}

// ---------------------------------------------------------------------------------------
// Server and request plumbing
// ---------------------------------------------------------------------------------------

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in the set, so aborting this task closes them all.
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

/// One request; an `Err` makes hyper drop the connection without an answer.
async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Ok(api_error(
                413,
                None,
                "the request body is too large or broken",
            ))
        }
    };
    let req = Req::new(parts, body);
    shared.lock().sweep();
    let target = req.envd_target();
    let result = match &target {
        Some((id, port)) => Ok(envd(&shared, &req, id, *port).await),
        None => control(&shared, &req).await,
    };
    let status = result.as_ref().ok().map(|r| r.status().as_u16());
    shared.record(&req, target.as_ref(), status);
    result
}

struct Req {
    method: Method,
    path: String,
    query: Option<String>,
    host: Option<String>,
    headers: HeaderMap,
    body: Bytes,
    received: Instant,
}

impl Req {
    fn new(parts: http::request::Parts, body: Bytes) -> Req {
        let host = parts
            .headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| parts.uri.authority().map(|a| a.to_string()));
        Req {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().map(str::to_string),
            host,
            headers: parts.headers,
            body,
            received: Instant::now(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn params(&self) -> Vec<(String, String)> {
        parse_query(self.query.as_deref().unwrap_or(""))
    }

    fn param(&self, name: &str) -> Option<String> {
        self.params()
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

    /// The sandbox and port an envd request is for: `E2b-Sandbox-Id` (what the SDKs send
    /// with `E2B_SANDBOX_URL`), else a `Host` of `{port}-{id}.{domain}`.
    fn envd_target(&self) -> Option<(String, u16)> {
        if let Some(id) = self.header("e2b-sandbox-id") {
            let port = self.header("e2b-sandbox-port").and_then(|p| p.parse().ok());
            return Some((id.to_string(), port.unwrap_or(ENVD_PORT)));
        }
        let label = self.host.as_deref()?.split('.').next()?;
        let (port, id) = label.split_once('-')?;
        Some((id.to_string(), port.parse().ok()?))
    }

    /// The JSON body, or the default when it is empty (optional bodies); `Err` is the 400's
    /// message.
    fn json_or_default<T: for<'de> Deserialize<'de> + Default>(&self) -> Result<T, String> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(T::default());
        }
        serde_json::from_slice(&self.body).map_err(parse_message)
    }
}

/// The sandbox named by a control-plane path (`/sandboxes/{id}/...`, `/v2/sandboxes/{id}/...`).
fn path_sandbox_id(segments: &[String]) -> Option<String> {
    match segments {
        [s, id, ..] if s == "sandboxes" => Some(id.clone()),
        [v, s, id, ..] if v == "v2" && s == "sandboxes" => Some(id.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Control plane
// ---------------------------------------------------------------------------------------

async fn control(shared: &Shared, req: &Req) -> Result<Reply, io::Error> {
    if req.path == "/health" {
        return Ok(json_reply(
            200,
            &json!({"message": "Health check successful"}),
        ));
    }
    if req.header("x-api-key") != Some(shared.api_key.as_str()) {
        return Ok(api_error(
            401,
            None,
            "Invalid API key, please check your E2B_API_KEY",
        ));
    }
    let segments = req.segments();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    Ok(match (req.method.as_str(), segments.as_slice()) {
        ("POST", ["sandboxes"] | ["v2", "sandboxes"]) => return create(shared, req).await,
        ("GET", ["sandboxes"]) => list_running(shared, req),
        ("GET", ["v2", "sandboxes"]) => list(shared, req),
        ("GET", ["sandboxes", id]) => detail(shared, id),
        ("DELETE", ["sandboxes", id]) => kill(shared, id),
        ("POST", ["sandboxes", id, "pause"]) => pause(shared, id),
        ("POST", ["sandboxes", id, "resume"]) => resume(shared, req, id),
        ("POST", ["sandboxes", id, "connect"] | ["v2", "sandboxes", id, "connect"]) => {
            connect(shared, req, id)
        }
        ("POST", ["sandboxes", id, "timeout"]) => set_timeout(shared, req, id),
        ("POST", ["sandboxes", id, "refreshes"]) => refresh(shared, req, id),
        ("PUT", ["sandboxes", id, "network"]) => update_network(shared, req, id),
        ("POST", ["sandboxes", id, "snapshots"]) => snapshot(shared, req, id),
        ("GET", ["snapshots"]) => list_snapshots(shared, req),
        ("DELETE", ["templates", id]) => delete_snapshot(shared, id),
        _ => api_error(
            404,
            None,
            format!("{} {} is not served by the fake E2B", req.method, req.path),
        ),
    })
}

/// A create request, validated (as E2B's API does before placing anything).
struct CreateSpec {
    path: String,
    template_id: String,
    timeout_secs: u64,
    auto_pause: bool,
    metadata: BTreeMap<String, String>,
    env_vars: BTreeMap<String, String>,
    allow_internet_access: Option<bool>,
    allow_out: Vec<String>,
    deny_out: Vec<String>,
    network: Option<Value>,
    key: Option<String>,
    /// The whole body, to compare a retry with the same `Idempotency-Key`.
    body: Value,
}

/// NewSandbox / NewSandboxV2; unknown fields are ignored, as E2B's Go API ignores them.
#[derive(Deserialize)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    allow_internet_access: Option<bool>,
    network: Option<NetworkBody>,
}

#[derive(Deserialize, Default)]
struct NetworkBody {
    #[serde(rename = "allowOut")]
    allow_out: Option<Vec<String>>,
    #[serde(rename = "denyOut")]
    deny_out: Option<Vec<String>>,
    allow_internet_access: Option<bool>,
}

enum Created {
    Reply(Reply),
    /// `timeout_after_send`: hold the connection, then drop it.
    Hang,
}

async fn create(shared: &Shared, req: &Req) -> Result<Reply, io::Error> {
    let spec = match parse_create(req) {
        Ok(spec) => spec,
        Err(message) => {
            shared
                .lock()
                .log_create(&req.path, None, CreateOutcome::Rejected, None);
            return Ok(bad_request(message));
        }
    };
    match create_now(shared, &spec) {
        Created::Reply(reply) => {
            tokio::time::sleep(shared.config.answer_after).await;
            Ok(reply)
        }
        Created::Hang => {
            tokio::time::sleep(shared.config.hang).await;
            Err(io::Error::other(
                "timeout_after_send: the answer is never sent",
            ))
        }
    }
}

/// The create request, or why it is a 400.
fn parse_create(req: &Req) -> Result<CreateSpec, String> {
    let key = req.header("idempotency-key").map(str::to_string);
    if key.as_deref().is_some_and(|k| !valid_idempotency_key(k)) {
        return Err("Idempotency-Key must be 1-255 of [a-z0-9-]".to_string());
    }
    let body: Value = serde_json::from_slice(&req.body).map_err(parse_message)?;
    let new: NewSandbox = serde_json::from_value(body.clone()).map_err(parse_message)?;
    if new.template_id.trim().is_empty() {
        return Err("templateID must not be empty".to_string());
    }
    let legacy = req.path.trim_end_matches('/') == "/sandboxes";
    let timeout_secs = new.timeout.unwrap_or(if legacy { 15 } else { 300 });
    check_timeout(timeout_secs)?;
    let network = new.network.unwrap_or_default();
    let allow_out = network.allow_out.unwrap_or_default();
    let deny_out = network.deny_out.unwrap_or_default();
    validate_egress(&allow_out, &deny_out)?;
    Ok(CreateSpec {
        path: req.path.clone(),
        template_id: new.template_id,
        timeout_secs,
        auto_pause: new.auto_pause.unwrap_or(false),
        metadata: new.metadata.unwrap_or_default(),
        env_vars: new.env_vars.unwrap_or_default(),
        allow_internet_access: new.allow_internet_access,
        allow_out,
        deny_out,
        network: body.get("network").cloned(),
        key,
        body,
    })
}

/// What the SDKs accept as an idempotency key (they refuse others before sending).
fn valid_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn check_timeout(secs: u64) -> Result<(), String> {
    if secs > MAX_TIMEOUT_SECS {
        return Err(format!(
            "Timeout cannot be greater than {} hours",
            MAX_TIMEOUT_SECS / 3600
        ));
    }
    Ok(())
}

fn create_now(shared: &Shared, spec: &CreateSpec) -> Created {
    let mut inner = shared.lock();
    if let Some(reply) = replay(shared, &mut inner, spec) {
        return Created::Reply(reply);
    }
    let outcome = match inner.script.pop_front() {
        Some(outcome) => outcome,
        None => inner.always.unwrap_or(CreateOutcome::Ok),
    };
    let (state, hidden_for) = match outcome {
        CreateOutcome::Ok | CreateOutcome::AppliedThen500 => {
            (SandboxState::Running, Duration::ZERO)
        }
        CreateOutcome::TimeoutAfterSend => (SandboxState::Running, shared.config.appear_after),
        CreateOutcome::FailedBeforeRunning => (SandboxState::Failed, Duration::ZERO),
        _ => {
            inner.log_create(&spec.path, Some(spec), outcome, None);
            return Created::Reply(scripted_failure(shared, outcome));
        }
    };
    let id = new_sandbox(shared, &mut inner, spec, state, hidden_for);
    inner.log_create(&spec.path, Some(spec), outcome, Some(&id));
    if state == SandboxState::Failed {
        return Created::Reply(api_error(
            500,
            Some("sandbox_create_failed"),
            "Failed to place sandbox: sandbox creation failed on 3 node(s), please retry; if the problem persists, contact us",
        ));
    }
    if let Some(key) = &spec.key {
        let remembered = Remembered {
            path: spec.path.clone(),
            body: spec.body.clone(),
            sandbox_id: id.clone(),
        };
        inner.idempotency.insert(key.clone(), remembered);
    }
    if outcome == CreateOutcome::TimeoutAfterSend {
        return Created::Hang;
    }
    if outcome == CreateOutcome::AppliedThen500 {
        return Created::Reply(api_error(500, None, "Internal server error"));
    }
    Created::Reply(json_reply(
        201,
        &created_json(shared, &inner.sandboxes[&id]),
    ))
}

/// The answer to a retry with a known `Idempotency-Key`: the same sandbox, or 422 when the
/// key comes with another request.
fn replay(shared: &Shared, inner: &mut Inner, spec: &CreateSpec) -> Option<Reply> {
    let key = spec.key.as_ref()?;
    let remembered = inner.idempotency.get(key)?;
    if remembered.path != spec.path || remembered.body != spec.body {
        inner.log_create(&spec.path, Some(spec), CreateOutcome::Rejected, None);
        return Some(api_error(
            422,
            Some("idempotency_request_mismatch"),
            "Idempotency-Key was already used with a different request",
        ));
    }
    let id = remembered.sandbox_id.clone();
    let reply = json_reply(201, &created_json(shared, inner.sandboxes.get(&id)?));
    inner.log_create(&spec.path, Some(spec), CreateOutcome::Replayed, Some(&id));
    Some(reply)
}

/// The infrastructure failures E2B answers a create with (messages from `e2b-dev/infra`).
fn scripted_failure(shared: &Shared, outcome: CreateOutcome) -> Reply {
    match outcome {
        CreateOutcome::Capacity => api_error(
            503,
            Some("sandbox_capacity_unavailable"),
            "Failed to place sandbox: not enough capacity for the requested resources right now, please retry shortly",
        ),
        CreateOutcome::RateLimit => {
            let mut reply = api_error(429, None, "Rate limit exceeded, please try again later");
            let secs = shared.config.retry_after_secs;
            let value = if shared.config.retry_after_as_date {
                let at = SystemTime::now() + Duration::from_secs(secs);
                http::HeaderValue::from_str(&http_date(at)).expect("an HTTP-date")
            } else {
                secs.into()
            };
            reply.headers_mut().insert("retry-after", value);
            reply
        }
        CreateOutcome::PlacementTimeout => api_error(
            504,
            Some("sandbox_placement_timeout"),
            "Failed to place sandbox: placement timed out after 2 attempt(s), please retry",
        ),
        CreateOutcome::NoCompatibleNode => api_error(
            503,
            Some("sandbox_no_compatible_node"),
            "Failed to place sandbox: no compatible node for this template's requirements",
        ),
        CreateOutcome::ServerError => api_error(500, None, "Internal server error"),
        _ => api_error(503, None, "Service temporarily unavailable"),
    }
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(at: SystemTime) -> String {
    // RFC 2822's form in UTC is the IMF-fixdate but for the zone's name.
    time::OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc2822)
        .expect("an HTTP-date")
        .replace("+0000", "GMT")
}

/// A new sandbox: its `/` (with `/home/user` and `/tmp`, or a snapshot's files) and its entry.
fn new_sandbox(
    shared: &Shared,
    inner: &mut Inner,
    spec: &CreateSpec,
    state: SandboxState,
    hidden_for: Duration,
) -> String {
    let id = loop {
        let id = new_sandbox_id();
        if !inner.sandboxes.contains_key(&id) {
            break id;
        }
    };
    let root = shared.base.join("sandboxes").join(&id);
    for dir in ["home/user", "tmp"] {
        std::fs::create_dir_all(root.join(dir)).expect("a sandbox directory");
    }
    let restored_from = inner.snapshot_for(&spec.template_id).map(|s| {
        copy_tree(&s.dir, &root).expect("restoring a snapshot");
        s.snapshot_id.clone()
    });
    inner.seq += 1;
    let started_at = SystemTime::now();
    let view = FakeSandbox {
        sandbox_id: id.clone(),
        template_id: spec.template_id.clone(),
        metadata: spec.metadata.clone(),
        env_vars: spec.env_vars.clone(),
        allow_internet_access: spec.allow_internet_access,
        allow_out: spec.allow_out.clone(),
        deny_out: spec.deny_out.clone(),
        timeout_secs: spec.timeout_secs,
        auto_pause: spec.auto_pause,
        create_path: spec.path.clone(),
        state,
        network_updates: Vec::new(),
        root,
        envd_access_token: random_hex(24),
        idempotency_key: spec.key.clone(),
        restored_from,
        started_at,
    };
    let entry = Entry {
        view,
        seq: inner.seq,
        visible_at: Instant::now() + hidden_for,
        deadline: started_at + Duration::from_secs(spec.timeout_secs),
        cut: watch::channel(0).0,
        network: spec.network.clone(),
    };
    inner.sandboxes.insert(id.clone(), entry);
    id
}

/// E2B's egress rules (`validateEgressRules` in `e2b-dev/infra`): `denyOut` holds IPs or
/// CIDRs only; `allowOut` may hold domains too, but then `denyOut` must hold `0.0.0.0/0`.
fn validate_egress(allow_out: &[String], deny_out: &[String]) -> Result<(), String> {
    for entry in deny_out {
        if !is_ip_or_cidr(entry) {
            return Err(format!(
                "invalid deny out entry {entry:?}: domains are not supported in deny rules"
            ));
        }
    }
    let mut has_domain = false;
    for entry in allow_out {
        if is_ip_or_cidr(entry) {
            continue;
        }
        if !is_domain_rule(entry) {
            return Err(format!("invalid allow out entry {entry:?}"));
        }
        has_domain = true;
    }
    if has_domain && !deny_out.iter().any(|d| d == "0.0.0.0/0") {
        return Err(
            "allow out contains domains but deny out is missing 0.0.0.0/0 (ALL_TRAFFIC)"
                .to_string(),
        );
    }
    Ok(())
}

fn is_ip_or_cidr(entry: &str) -> bool {
    entry.parse::<std::net::IpAddr>().is_ok() || entry.parse::<ipnet::IpNet>().is_ok()
}

/// `example.com` or `*.example.com` (no ports, no schemes).
fn is_domain_rule(entry: &str) -> bool {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The Sandbox schema: what create and connect answer.
fn created_json(shared: &Shared, e: &Entry) -> Value {
    let v = &e.view;
    json!({
        "templateID": v.template_id,
        "alias": v.template_id,
        "sandboxID": v.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": shared.config.envd_version,
        "envdAccessToken": v.envd_access_token,
        "domain": shared.domain,
        "trafficAccessToken": null,
    })
}

/// The ListedSandbox schema (every field the SDKs require).
fn listed_json(shared: &Shared, e: &Entry) -> Value {
    let v = &e.view;
    json!({
        "templateID": v.template_id,
        "alias": v.template_id,
        "sandboxID": v.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(v.started_at),
        "endAt": rfc3339(e.deadline),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 10240,
        "envdVersion": shared.config.envd_version,
        "metadata": v.metadata,
        "state": if v.state == SandboxState::Paused { "paused" } else { "running" },
    })
}

/// The SandboxDetail schema: a listed sandbox plus its envd access and settings.
fn detail_json(shared: &Shared, e: &Entry) -> Value {
    let v = &e.view;
    let mut out = listed_json(shared, e);
    out["envdAccessToken"] = json!(v.envd_access_token);
    out["domain"] = json!(shared.domain);
    if let Some(allow) = v.allow_internet_access {
        out["allowInternetAccess"] = json!(allow);
    }
    if e.network.is_some() || !v.network_updates.is_empty() {
        out["network"] = json!({"allowOut": v.allow_out, "denyOut": v.deny_out});
    }
    out["lifecycle"] = json!({
        "autoResume": false,
        "onTimeout": if v.auto_pause { "pause" } else { "kill" },
    });
    out
}

fn not_found(id: &str) -> Reply {
    api_error(
        404,
        None,
        format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

fn detail(shared: &Shared, id: &str) -> Reply {
    let inner = shared.lock();
    match inner.live(id) {
        Some(e) => json_reply(200, &detail_json(shared, e)),
        None => not_found(id),
    }
}

fn kill(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    if inner.live(id).is_none() {
        return not_found(id);
    }
    inner.transition(id, SandboxState::Killed);
    empty(204)
}

fn pause(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    match inner.live(id).map(|e| e.view.state) {
        None => not_found(id),
        Some(SandboxState::Paused) => {
            api_error(409, None, format!("Sandbox \"{id}\" is already paused"))
        }
        Some(_) => {
            inner.transition(id, SandboxState::Paused);
            empty(204)
        }
    }
}

/// ConnectSandbox / ResumedSandbox / SandboxTimeoutRequest (`memory` and the like ignored).
#[derive(Deserialize, Default)]
struct TimeoutBody {
    timeout: Option<u64>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
}

/// Resumes a paused sandbox for `timeout` seconds (or its last timeout).
fn wake(inner: &mut Inner, id: &str, body: &TimeoutBody) {
    inner.transition(id, SandboxState::Running);
    if let Some(e) = inner.live_mut(id) {
        let secs = body.timeout.unwrap_or(e.view.timeout_secs);
        e.view.timeout_secs = secs;
        e.deadline = SystemTime::now() + Duration::from_secs(secs);
        if let Some(auto_pause) = body.auto_pause {
            e.view.auto_pause = auto_pause;
        }
    }
}

/// `connect`: 200 when running (the timeout is only ever extended), 201 when resumed.
fn connect(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: TimeoutBody = match req.json_or_default() {
        Ok(body) => body,
        Err(message) => return bad_request(message),
    };
    if let Err(message) = check_timeout(body.timeout.unwrap_or(0)) {
        return bad_request(message);
    }
    let mut inner = shared.lock();
    let status = match inner.live(id).map(|e| e.view.state) {
        None => return not_found(id),
        Some(SandboxState::Paused) => {
            wake(&mut inner, id, &body);
            201
        }
        Some(_) => 200,
    };
    let e = inner.live_mut(id).expect("a live sandbox");
    if let (200, Some(secs)) = (status, body.timeout) {
        let until = SystemTime::now() + Duration::from_secs(secs);
        if until > e.deadline {
            e.deadline = until;
            e.view.timeout_secs = secs;
        }
    }
    json_reply(status, &created_json(shared, e))
}

/// The deprecated `resume`: paused sandboxes only.
fn resume(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: TimeoutBody = match req.json_or_default() {
        Ok(body) => body,
        Err(message) => return bad_request(message),
    };
    let mut inner = shared.lock();
    match inner.live(id).map(|e| e.view.state) {
        None => not_found(id),
        Some(SandboxState::Running) => api_error(
            409,
            None,
            format!("Sandbox {id} can't be resumed, it's already running"),
        ),
        Some(_) => {
            wake(&mut inner, id, &body);
            json_reply(201, &created_json(shared, &inner.sandboxes[id]))
        }
    }
}

/// `timeout`: the sandbox expires `timeout` seconds from now.
fn set_timeout(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: TimeoutBody = match req.json_or_default() {
        Ok(body) => body,
        Err(message) => return bad_request(message),
    };
    let Some(secs) = body.timeout else {
        return bad_request("timeout is required");
    };
    if let Err(message) = check_timeout(secs) {
        return bad_request(message);
    }
    let mut inner = shared.lock();
    match inner
        .live_mut(id)
        .filter(|e| e.view.state == SandboxState::Running)
    {
        Some(e) => {
            e.view.timeout_secs = secs;
            e.deadline = SystemTime::now() + Duration::from_secs(secs);
            empty(204)
        }
        None => not_found(id),
    }
}

#[derive(Deserialize, Default)]
struct RefreshBody {
    duration: Option<u64>,
}

/// `refreshes`: keeps the sandbox alive at least `duration` more seconds.
fn refresh(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: RefreshBody = match req.json_or_default() {
        Ok(body) => body,
        Err(message) => return bad_request(message),
    };
    let mut inner = shared.lock();
    match inner
        .live_mut(id)
        .filter(|e| e.view.state == SandboxState::Running)
    {
        Some(e) => {
            let secs = body
                .duration
                .unwrap_or(e.view.timeout_secs)
                .min(MAX_TIMEOUT_SECS);
            e.deadline = e
                .deadline
                .max(SystemTime::now() + Duration::from_secs(secs));
            empty(204)
        }
        None => not_found(id),
    }
}

/// `PUT network`: the egress rules are replaced (an omitted list clears it).
fn update_network(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: NetworkBody = match serde_json::from_slice(&req.body) {
        Ok(body) => body,
        Err(e) => return bad_request(parse_message(e)),
    };
    let update = NetworkUpdate {
        allow_out: body.allow_out.unwrap_or_default(),
        deny_out: body.deny_out.unwrap_or_default(),
        allow_internet_access: body.allow_internet_access,
    };
    if let Err(message) = validate_egress(&update.allow_out, &update.deny_out) {
        return bad_request(message);
    }
    let mut inner = shared.lock();
    let Some(e) = inner.live_mut(id) else {
        return not_found(id);
    };
    if e.view.state == SandboxState::Paused {
        return api_error(409, None, format!("Sandbox {id} is paused"));
    }
    e.view.allow_out = update.allow_out.clone();
    e.view.deny_out = update.deny_out.clone();
    if update.allow_internet_access.is_some() {
        e.view.allow_internet_access = update.allow_internet_access;
    }
    e.view.network_updates.push(update);
    empty(204)
}

#[derive(Deserialize, Default)]
struct SnapshotBody {
    name: Option<String>,
}

/// `snapshots`: the sandbox's files are copied; the snapshot can then be a `templateID`.
fn snapshot(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body: SnapshotBody = match req.json_or_default() {
        Ok(body) => body,
        Err(message) => return bad_request(message),
    };
    let mut inner = shared.lock();
    let Some(root) = inner.live(id).map(|e| e.view.root.clone()) else {
        return not_found(id);
    };
    let template_id = new_sandbox_id();
    let dir = shared.base.join("snapshots").join(&template_id);
    if let Err(e) = copy_tree(&root, &dir) {
        return api_error(500, None, format!("snapshotting {id}: {e}"));
    }
    // SnapshotInfo: `team/name:tag` when named, else `templateID:tag`.
    let names: Vec<String> = body
        .name
        .iter()
        .map(|n| format!("fake-team/{n}:default"))
        .collect();
    let snapshot_id = names
        .first()
        .cloned()
        .unwrap_or_else(|| format!("{template_id}:default"));
    let answer = json!({"snapshotID": snapshot_id, "names": names});
    inner.snapshots.push(Snapshot {
        snapshot_id,
        template_id,
        names,
        sandbox_id: id.to_string(),
        dir,
    });
    json_reply(201, &answer)
}

fn list_snapshots(shared: &Shared, req: &Req) -> Reply {
    let of = req.param("sandboxID");
    let inner = shared.lock();
    let items: Vec<Value> = inner
        .snapshots
        .iter()
        .filter(|s| of.as_deref().is_none_or(|id| s.sandbox_id == id))
        .map(|s| json!({"snapshotID": s.snapshot_id, "names": s.names}))
        .collect();
    json_reply(200, &Value::Array(items))
}

/// `DELETE /templates/{id}`: how the SDKs delete a snapshot.
fn delete_snapshot(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    let Some(index) = inner.snapshots.iter().position(|s| s.answers_to(id)) else {
        return api_error(404, None, format!("template '{id}' not found"));
    };
    let snapshot = inner.snapshots.remove(index);
    let _ = std::fs::remove_dir_all(snapshot.dir);
    empty(204)
}

/// `GET /v2/sandboxes` as parsed (E2B's validator refuses what this refuses).
struct ListQuery {
    states: Vec<SandboxState>,
    metadata: BTreeMap<String, String>,
    template: Option<String>,
    started_after: Option<SystemTime>,
    ascending: bool,
    limit: usize,
    next: Option<u64>,
}

/// The listing's query, or why it is a 400.
fn parse_list_query(req: &Req) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        states: Vec::new(),
        metadata: BTreeMap::new(),
        template: None,
        started_after: None,
        ascending: false,
        limit: 100,
        next: None,
    };
    for (key, value) in req.params() {
        match key.as_str() {
            "metadata" => q.metadata.extend(parse_metadata_filter(&value)?),
            "state" => {
                for state in value.split(',').filter(|s| !s.is_empty()) {
                    q.states.push(parse_state(state)?);
                }
            }
            "limit" => q.limit = parse_limit(&value)?,
            "nextToken" => {
                q.next = Some(
                    value
                        .parse()
                        .map_err(|_| "invalid next token".to_string())?,
                )
            }
            "order" => q.ascending = parse_order(&value)?,
            "startedAfter" => {
                q.started_after = Some(parse_rfc3339(&value).ok_or("invalid startedAfter")?)
            }
            "template" => q.template = Some(value),
            _ => {}
        }
    }
    if q.states.is_empty() {
        q.states = vec![SandboxState::Running, SandboxState::Paused];
    }
    Ok(q)
}

fn parse_state(state: &str) -> Result<SandboxState, String> {
    match state {
        "running" => Ok(SandboxState::Running),
        "paused" => Ok(SandboxState::Paused),
        _ => Err(format!(
            "invalid state {state:?}: expected running or paused"
        )),
    }
}

fn parse_limit(value: &str) -> Result<usize, String> {
    value
        .parse()
        .ok()
        .filter(|n| (1..=100).contains(n))
        .ok_or_else(|| "limit must be an integer between 1 and 100".to_string())
}

fn parse_order(value: &str) -> Result<bool, String> {
    match value {
        "asc" => Ok(true),
        "desc" => Ok(false),
        _ => Err("order must be asc or desc".to_string()),
    }
}

impl ListQuery {
    fn matches(&self, e: &Entry, now: Instant) -> bool {
        let v = &e.view;
        now >= e.visible_at
            && self.states.contains(&v.state)
            && self
                .metadata
                .iter()
                .all(|(k, want)| v.metadata.get(k) == Some(want))
            && self.template.as_ref().is_none_or(|t| *t == v.template_id)
            && self.started_after.is_none_or(|after| v.started_at >= after)
    }

    /// Whether `seq` is at or past the cursor, in this query's order.
    fn past_cursor(&self, seq: u64) -> bool {
        match self.next {
            None => true,
            Some(cursor) if self.ascending => seq >= cursor,
            Some(cursor) => seq <= cursor,
        }
    }
}

/// `GET /v2/sandboxes`: newest first unless `order=asc`; a page and `X-Next-Token` (the
/// cursor of the next page's first sandbox) when more remain.
fn list(shared: &Shared, req: &Req) -> Reply {
    let q = match parse_list_query(req) {
        Ok(q) => q,
        Err(message) => return bad_request(message),
    };
    let inner = shared.lock();
    let now = Instant::now();
    let mut found: Vec<&Entry> = inner
        .sandboxes
        .values()
        .filter(|e| q.matches(e, now) && q.past_cursor(e.seq))
        .collect();
    found.sort_by_key(|e| e.seq);
    if !q.ascending {
        found.reverse();
    }
    let page: Vec<Value> = found
        .iter()
        .take(q.limit)
        .map(|e| listed_json(shared, e))
        .collect();
    let mut reply = json_reply(200, &Value::Array(page));
    if let Some(next) = found.get(q.limit) {
        reply.headers_mut().insert("x-next-token", next.seq.into());
    }
    let running = inner
        .sandboxes
        .values()
        .filter(|e| e.view.state == SandboxState::Running)
        .count();
    reply
        .headers_mut()
        .insert("x-total-running", running.into());
    reply
}

/// The deprecated `GET /sandboxes`: running sandboxes, metadata filter only, no pages.
fn list_running(shared: &Shared, req: &Req) -> Reply {
    let metadata = match req
        .param("metadata")
        .map(|m| parse_metadata_filter(&m))
        .transpose()
    {
        Ok(m) => m.unwrap_or_default(),
        Err(message) => return bad_request(message),
    };
    let inner = shared.lock();
    let now = Instant::now();
    let mut found: Vec<&Entry> = inner
        .sandboxes
        .values()
        .filter(|e| e.view.state == SandboxState::Running && now >= e.visible_at)
        .filter(|e| {
            metadata
                .iter()
                .all(|(k, v)| e.view.metadata.get(k) == Some(v))
        })
        .collect();
    found.sort_by_key(|e| std::cmp::Reverse(e.seq));
    json_reply(
        200,
        &Value::Array(found.iter().map(|e| listed_json(shared, e)).collect()),
    )
}

/// The `metadata` filter as E2B parses it (`parseFilters` in `e2b-dev/infra`): the query
/// value is unescaped once more, split into `k=v` pairs, and each side unescaped again.
fn parse_metadata_filter(value: &str) -> Result<BTreeMap<String, String>, String> {
    let query = query_unescape(value)?;
    let mut filters = BTreeMap::new();
    for pair in query.split('&') {
        let parts: Vec<&str> = pair.split('=').collect();
        let [key, value] = parts.as_slice() else {
            return Err("error parsing metadata: invalid key value pair in query".to_string());
        };
        filters.insert(query_unescape(key)?, query_unescape(value)?);
    }
    Ok(filters)
}

// ---------------------------------------------------------------------------------------
// envd
// ---------------------------------------------------------------------------------------

/// What an envd request needs of its sandbox (copied out of the lock).
struct EnvdView {
    id: String,
    root: PathBuf,
    token: String,
    env_vars: BTreeMap<String, String>,
    cut: watch::Receiver<u64>,
}

/// The sandbox an envd request may reach, or the body of the 502 E2B's proxy answers
/// instead (its message holds "was not found", which the SDKs map to "not running").
fn envd_view(shared: &Shared, id: &str) -> Result<EnvdView, Value> {
    let inner = shared.lock();
    match inner.sandboxes.get(id) {
        Some(e) if e.view.state == SandboxState::Running => Ok(EnvdView {
            id: id.to_string(),
            root: e.view.root.clone(),
            token: e.view.envd_access_token.clone(),
            env_vars: e.view.env_vars.clone(),
            cut: e.cut.subscribe(),
        }),
        Some(e) if e.view.state == SandboxState::Paused => Err(proxy_502(
            id,
            format!("The sandbox {id} is paused and was not found running: connect to resume it"),
        )),
        _ => Err(proxy_502(id, format!("The sandbox {id} was not found"))),
    }
}

fn proxy_502(id: &str, message: String) -> Value {
    json!({"code": 502, "message": message, "sandboxId": id})
}

async fn envd(shared: &Arc<Shared>, req: &Req, id: &str, port: u16) -> Reply {
    let sandbox = match envd_view(shared, id) {
        Ok(sandbox) => sandbox,
        Err(body) => return json_reply(502, &body),
    };
    if port != ENVD_PORT {
        let message = format!("The sandbox {id} is running but port {port} is not open");
        return json_reply(
            502,
            &json!({"code": 502, "message": message, "sandboxId": id, "port": port}),
        );
    }
    if req.path == "/health" {
        return empty(204);
    }
    if req.header("x-access-token") != Some(sandbox.token.as_str()) {
        return json_reply(
            401,
            &json!({"code": 401, "message": "invalid or missing access token"}),
        );
    }
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/files") => files_read(req, &sandbox),
        ("POST", "/files") => files_write(req, &sandbox),
        ("POST", "/process.Process/Start") => start(shared, req, sandbox),
        ("POST", rpc)
            if rpc.starts_with("/process.Process/")
                || rpc.starts_with("/filesystem.Filesystem/") =>
        {
            unary(shared, req, &sandbox).await
        }
        _ => plain(404, "404 page not found"),
    }
}

/// A path inside a sandbox: where it is on the host, and how envd names it.
struct SandboxPath {
    host: PathBuf,
    shown: String,
}

/// envd's path resolution: `~` and relative paths from `/home/user`, `.` and `..` applied
/// lexically (`..` stops at `/`), all inside `root`. A symlink leading out is refused.
fn resolve(root: &Path, raw: &str) -> Result<SandboxPath, String> {
    let expanded = match raw {
        "" | "~" => HOME.to_string(),
        _ if raw.starts_with("~/") => format!("{HOME}/{}", &raw[2..]),
        _ if raw.starts_with('/') => raw.to_string(),
        _ => format!("{HOME}/{raw}"),
    };
    if expanded.contains('\0') {
        return Err(format!("invalid path {raw:?}"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in expanded.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    let host = parts
        .iter()
        .fold(root.to_path_buf(), |path, part| path.join(part));
    ensure_inside(root, &host)?;
    Ok(SandboxPath {
        host,
        shown: format!("/{}", parts.join("/")),
    })
}

/// The deepest existing ancestor of `host`, symlinks resolved, must still be under `root`.
fn ensure_inside(root: &Path, host: &Path) -> Result<(), String> {
    let mut probe = host;
    let resolved = loop {
        match probe.canonicalize() {
            Ok(path) => break path,
            Err(_) => probe = probe.parent().ok_or("path outside the sandbox")?,
        }
    };
    if resolved.starts_with(root) {
        Ok(())
    } else {
        Err("path leads outside the sandbox (through a symlink)".to_string())
    }
}

fn basename(shown: &str) -> &str {
    shown.rsplit('/').next().unwrap_or(shown)
}

fn envd_error(status: u16, message: impl Into<String>) -> Reply {
    json_reply(status, &json!({"code": status, "message": message.into()}))
}

/// `GET /files?path=`: the bytes, 404 when missing, 400 for a directory.
fn files_read(req: &Req, sandbox: &EnvdView) -> Reply {
    let path = match resolve(&sandbox.root, &req.param("path").unwrap_or_default()) {
        Ok(path) => path,
        Err(message) => return envd_error(400, message),
    };
    match std::fs::metadata(&path.host) {
        Err(_) => envd_error(404, format!("path '{}' does not exist", path.shown)),
        Ok(meta) if meta.is_dir() => {
            envd_error(400, format!("path '{}' is a directory", path.shown))
        }
        Ok(_) => match std::fs::read(&path.host) {
            Ok(bytes) => Response::builder()
                .status(200)
                .header("content-type", "application/octet-stream")
                .body(full(bytes))
                .expect("a response"),
            Err(e) => envd_error(500, format!("error reading file '{}': {e}", path.shown)),
        },
    }
}

/// `POST /files`: multipart (`file` parts named by their path; `?path=` wins for one part)
/// or a raw body for `?path=`. Answers the EntryInfo of every file written.
fn files_write(req: &Req, sandbox: &EnvdView) -> Reply {
    if req
        .header("content-encoding")
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return envd_error(400, "the fake envd does not decode Content-Encoding");
    }
    let content_type = req.header("content-type").unwrap_or("");
    let uploads = if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        match multipart_files(content_type, &req.body) {
            Ok(parts) if parts.len() == 1 && req.param("path").is_some() => {
                vec![(req.param("path").unwrap_or_default(), parts[0].1.clone())]
            }
            Ok(parts) => parts,
            Err(message) => return envd_error(400, message),
        }
    } else {
        match req.param("path") {
            Some(path) => vec![(path, req.body.clone())],
            None => {
                return envd_error(400, "the path query parameter is required for a raw upload")
            }
        }
    };
    if uploads.is_empty() {
        return envd_error(400, "no file in the upload");
    }
    let mut written = Vec::new();
    for (path, data) in &uploads {
        match write_file(sandbox, path, data) {
            Ok(info) => written.push(info),
            Err((status, message)) => return envd_error(status, message),
        }
    }
    json_reply(200, &Value::Array(written))
}

/// One upload's EntryInfo, or the status and message of its failure.
fn write_file(sandbox: &EnvdView, raw: &str, data: &[u8]) -> Result<Value, (u16, String)> {
    let path = resolve(&sandbox.root, raw).map_err(|m| (400, m))?;
    if path.host.is_dir() {
        return Err((400, format!("path '{}' is a directory", path.shown)));
    }
    let written = path
        .host
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path.host, data));
    if let Err(e) = written {
        return Err((500, format!("error writing file '{}': {e}", path.shown)));
    }
    Ok(json!({"name": basename(&path.shown), "type": "file", "path": path.shown}))
}

/// The `file` parts of a multipart/form-data body: (filename, content).
fn multipart_files(content_type: &str, body: &[u8]) -> Result<Vec<(String, Bytes)>, String> {
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))
        .ok_or("a multipart body without a boundary")?
        .trim_matches('"');
    let delimiter = format!("--{boundary}").into_bytes();
    let next_part = [b"\r\n".as_slice(), &delimiter].concat();
    let start = find(body, &delimiter).ok_or("no multipart delimiter")?;
    let mut rest = &body[start + delimiter.len()..];
    let mut files = Vec::new();
    while !rest.starts_with(b"--") {
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a malformed multipart delimiter")?;
        let head_end = find(rest, b"\r\n\r\n").ok_or("a multipart part without headers")?;
        let head = std::str::from_utf8(&rest[..head_end]).map_err(|_| "non-UTF-8 part headers")?;
        let content = &rest[head_end + 4..];
        let end = find(content, &next_part).ok_or("an unterminated multipart part")?;
        if let Some((name, filename)) = disposition(head) {
            if name == "file" {
                let filename = filename.ok_or("a file part without a filename")?;
                files.push((filename, Bytes::copy_from_slice(&content[..end])));
            }
        }
        rest = &content[end + next_part.len()..];
    }
    Ok(files)
}

/// `name` and `filename` of a part's Content-Disposition (HTML5 form escapes undone).
fn disposition(head: &str) -> Option<(String, Option<String>)> {
    let line = head
        .split("\r\n")
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    let mut name = None;
    let mut filename = None;
    for param in line.split(';').skip(1) {
        let Some((key, value)) = param.trim().split_once('=') else {
            continue;
        };
        let value = value
            .trim_matches('"')
            .replace("%22", "\"")
            .replace("%0D", "\r")
            .replace("%0A", "\n");
        match key {
            "name" => name = Some(value),
            "filename" => filename = Some(value),
            _ => {}
        }
    }
    Some((name?, filename))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

// --- Connect-RPC, unary ------------------------------------------------------------------

/// A Connect error: its code (`not_found`, ...) and message.
struct RpcError {
    code: &'static str,
    message: String,
}

type RpcResult = Result<Value, RpcError>;

fn rpc_error(code: &'static str, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
    }
}

/// The HTTP status of a unary Connect error (the Connect protocol's table).
fn connect_status(code: &str) -> u16 {
    match code {
        "canceled" => 499,
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "deadline_exceeded" => 504,
        "not_found" => 404,
        "already_exists" | "aborted" => 409,
        "permission_denied" => 403,
        "resource_exhausted" => 429,
        "unimplemented" => 501,
        "unavailable" => 503,
        "unauthenticated" => 401,
        _ => 500,
    }
}

/// Unary Connect calls, JSON codec only (what the SDKs use).
async fn unary(shared: &Arc<Shared>, req: &Req, sandbox: &EnvdView) -> Reply {
    let content_type = req.header("content-type").unwrap_or("");
    if !content_type
        .to_ascii_lowercase()
        .starts_with("application/json")
    {
        return plain(415, "the fake envd speaks the Connect JSON codec only");
    }
    let result = match serde_json::from_slice::<Value>(&req.body) {
        Ok(body) => dispatch(shared, &req.path, sandbox, &body).await,
        Err(e) => Err(rpc_error(
            "invalid_argument",
            format!("unmarshal request: {e}"),
        )),
    };
    match result {
        Ok(answer) => json_reply(200, &answer),
        Err(e) => json_reply(
            connect_status(e.code),
            &json!({"code": e.code, "message": e.message}),
        ),
    }
}

async fn dispatch(shared: &Shared, method: &str, sandbox: &EnvdView, body: &Value) -> RpcResult {
    match method {
        "/filesystem.Filesystem/Stat" => fs_stat(sandbox, body),
        "/filesystem.Filesystem/ListDir" => fs_list(sandbox, body),
        "/filesystem.Filesystem/MakeDir" => fs_make_dir(sandbox, body),
        "/filesystem.Filesystem/Remove" => fs_remove(sandbox, body),
        "/filesystem.Filesystem/Move" => fs_move(sandbox, body),
        "/process.Process/List" => Ok(process_list(shared, sandbox)),
        "/process.Process/SendSignal" => send_signal(shared, sandbox, body),
        "/process.Process/SendInput" => send_input(shared, sandbox, body).await,
        "/process.Process/CloseStdin" => close_stdin(shared, sandbox, body).await,
        _ => Err(rpc_error(
            "unimplemented",
            format!("{method} is not implemented by the fake envd"),
        )),
    }
}

fn str_field<'a>(body: &'a Value, name: &str) -> &'a str {
    body.get(name).and_then(Value::as_str).unwrap_or("")
}

/// A proto3-JSON integer: a number, or a string (how 64-bit values travel).
fn u64_field(body: &Value, name: &str) -> Option<u64> {
    let value = body.get(name)?;
    value.as_u64().or_else(|| value.as_str()?.parse().ok())
}

fn rpc_path(sandbox: &EnvdView, raw: &str) -> Result<SandboxPath, RpcError> {
    resolve(&sandbox.root, raw).map_err(|m| rpc_error("invalid_argument", m))
}

/// EntryInfo: a symlink reports its target's type and `isSymlink`, as envd does.
fn entry_info(host: &Path, shown: &str, meta: &std::fs::Metadata) -> Value {
    let is_symlink = meta.file_type().is_symlink();
    let target = if is_symlink {
        std::fs::metadata(host).ok()
    } else {
        Some(meta.clone())
    };
    let kind = match &target {
        Some(m) if m.is_dir() => "FILE_TYPE_DIRECTORY",
        Some(_) => "FILE_TYPE_FILE",
        None => "FILE_TYPE_SYMLINK",
    };
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let mut out = json!({
        "name": basename(shown),
        "type": kind,
        "path": shown,
        "size": meta.len().to_string(),
        "mode": meta.permissions().mode() & 0o777,
        "permissions": permissions_string(meta),
        "owner": "user",
        "group": "user",
        "modifiedTime": rfc3339(modified),
    });
    if is_symlink {
        out["isSymlink"] = json!(true);
        if let Ok(link) = std::fs::read_link(host) {
            out["symlinkTarget"] = json!(link.to_string_lossy());
        }
    }
    out
}

/// Go's `FileMode.String()`, which envd reports as `permissions`.
fn permissions_string(meta: &std::fs::Metadata) -> String {
    let kind = if meta.file_type().is_symlink() {
        'L'
    } else if meta.is_dir() {
        'd'
    } else {
        '-'
    };
    let mode = meta.permissions().mode();
    let bits: String = (0..9)
        .map(|i| {
            if mode & (0o400 >> i) != 0 {
                ['r', 'w', 'x'][i % 3]
            } else {
                '-'
            }
        })
        .collect();
    format!("{kind}{bits}")
}

fn fs_stat(sandbox: &EnvdView, body: &Value) -> RpcResult {
    let path = rpc_path(sandbox, str_field(body, "path"))?;
    let meta = std::fs::symlink_metadata(&path.host)
        .map_err(|_| rpc_error("not_found", format!("file not found: {}", path.shown)))?;
    Ok(json!({"entry": entry_info(&path.host, &path.shown, &meta)}))
}

fn fs_list(sandbox: &EnvdView, body: &Value) -> RpcResult {
    let path = rpc_path(sandbox, str_field(body, "path"))?;
    let depth = u64_field(body, "depth").filter(|d| *d > 0).unwrap_or(1);
    let meta = std::fs::metadata(&path.host)
        .map_err(|_| rpc_error("not_found", format!("directory not found: {}", path.shown)))?;
    if !meta.is_dir() {
        return Err(rpc_error(
            "invalid_argument",
            format!("path is not a directory: {}", path.shown),
        ));
    }
    let mut entries = Vec::new();
    walk(&path.host, &path.shown, depth, &mut entries);
    Ok(json!({"entries": entries}))
}

/// Entries under `dir`, depth-first in name order, down to `depth` levels (no symlinks
/// followed), as envd's `walkDir`.
fn walk(dir: &Path, shown: &str, depth: u64, out: &mut Vec<Value>) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let mut children: Vec<std::fs::DirEntry> = read.filter_map(Result::ok).collect();
    children.sort_by_key(std::fs::DirEntry::file_name);
    for child in children {
        let name = child.file_name().to_string_lossy().into_owned();
        let child_shown = if shown == "/" {
            format!("/{name}")
        } else {
            format!("{shown}/{name}")
        };
        let Ok(meta) = child.path().symlink_metadata() else {
            continue;
        };
        out.push(entry_info(&child.path(), &child_shown, &meta));
        if depth > 1 && meta.is_dir() {
            walk(&child.path(), &child_shown, depth - 1, out);
        }
    }
}

fn fs_make_dir(sandbox: &EnvdView, body: &Value) -> RpcResult {
    let path = rpc_path(sandbox, str_field(body, "path"))?;
    match std::fs::metadata(&path.host) {
        Ok(meta) if meta.is_dir() => {
            return Err(rpc_error(
                "already_exists",
                format!("directory already exists: {}", path.shown),
            ))
        }
        Ok(_) => {
            return Err(rpc_error(
                "invalid_argument",
                format!(
                    "path already exists but it is not a directory: {}",
                    path.shown
                ),
            ))
        }
        Err(_) => {}
    }
    std::fs::create_dir_all(&path.host).map_err(|e| rpc_error("internal", e.to_string()))?;
    let entry =
        json!({"name": basename(&path.shown), "type": "FILE_TYPE_DIRECTORY", "path": path.shown});
    Ok(json!({"entry": entry}))
}

/// envd's `os.RemoveAll`: a missing path is not an error.
fn fs_remove(sandbox: &EnvdView, body: &Value) -> RpcResult {
    let path = rpc_path(sandbox, str_field(body, "path"))?;
    if path.shown == "/" {
        return Err(rpc_error(
            "invalid_argument",
            "the fake envd does not remove the sandbox's /",
        ));
    }
    let removed = match std::fs::symlink_metadata(&path.host) {
        Err(_) => Ok(()),
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path.host),
        Ok(_) => std::fs::remove_file(&path.host),
    };
    removed.map_err(|e| rpc_error("internal", format!("error removing file or directory: {e}")))?;
    Ok(json!({}))
}

fn fs_move(sandbox: &EnvdView, body: &Value) -> RpcResult {
    let source = rpc_path(sandbox, str_field(body, "source"))?;
    let destination = rpc_path(sandbox, str_field(body, "destination"))?;
    if std::fs::symlink_metadata(&source.host).is_err() {
        return Err(rpc_error(
            "not_found",
            format!("source file not found: {}", source.shown),
        ));
    }
    let moved = destination
        .host
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::rename(&source.host, &destination.host));
    moved.map_err(|e| rpc_error("internal", format!("error renaming: {e}")))?;
    let meta = std::fs::symlink_metadata(&destination.host)
        .map_err(|e| rpc_error("internal", e.to_string()))?;
    Ok(json!({"entry": entry_info(&destination.host, &destination.shown, &meta)}))
}

fn process_list(shared: &Shared, sandbox: &EnvdView) -> Value {
    let inner = shared.lock();
    let processes: Vec<Value> = inner
        .processes
        .iter()
        .filter(|(_, p)| p.sandbox_id == sandbox.id)
        .map(|(pid, p)| {
            let mut info = json!({"config": p.config, "pid": pid});
            if let Some(tag) = &p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    json!({"processes": processes})
}

/// The pid a ProcessSelector (`{pid}` or `{tag}`) names in this sandbox.
fn select_process(inner: &Inner, sandbox: &EnvdView, body: &Value) -> Result<u32, RpcError> {
    let selector = body.get("process").unwrap_or(&Value::Null);
    let mine = inner
        .processes
        .iter()
        .filter(|(_, p)| p.sandbox_id == sandbox.id);
    if let Some(pid) = u64_field(selector, "pid") {
        let mut mine = mine;
        return mine
            .find(|(p, _)| u64::from(**p) == pid)
            .map(|(p, _)| *p)
            .ok_or_else(|| rpc_error("not_found", format!("process with pid {pid} not found")));
    }
    if let Some(tag) = selector.get("tag").and_then(Value::as_str) {
        let mut mine = mine;
        return mine
            .find(|(_, p)| p.tag.as_deref() == Some(tag))
            .map(|(p, _)| *p)
            .ok_or_else(|| rpc_error("not_found", format!("process with tag {tag} not found")));
    }
    Err(rpc_error("invalid_argument", "invalid process selector"))
}

/// `SendSignal`: to the command's whole process group, so its children go too.
fn send_signal(shared: &Shared, sandbox: &EnvdView, body: &Value) -> RpcResult {
    let pid = select_process(&shared.lock(), sandbox, body)?;
    let signal = match body.get("signal") {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => libc::SIGKILL,
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => libc::SIGTERM,
        Some(Value::Number(n)) if n.as_i64() == Some(9) => libc::SIGKILL,
        Some(Value::Number(n)) if n.as_i64() == Some(15) => libc::SIGTERM,
        other => {
            return Err(rpc_error(
                "invalid_argument",
                format!("invalid signal: {other:?}"),
            ))
        }
    };
    signal_group(pid, signal);
    Ok(json!({}))
}

fn stdin_of(
    shared: &Shared,
    sandbox: &EnvdView,
    body: &Value,
) -> Result<Arc<tokio::sync::Mutex<Option<ChildStdin>>>, RpcError> {
    let inner = shared.lock();
    let pid = select_process(&inner, sandbox, body)?;
    inner.processes[&pid]
        .stdin
        .clone()
        .ok_or_else(|| rpc_error("failed_precondition", "stdin not enabled or closed"))
}

async fn send_input(shared: &Shared, sandbox: &EnvdView, body: &Value) -> RpcResult {
    let stdin = stdin_of(shared, sandbox, body)?;
    let input = body.get("input").unwrap_or(&Value::Null);
    if input.get("pty").is_some() {
        return Err(rpc_error(
            "failed_precondition",
            "the fake envd runs no PTY",
        ));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(str_field(input, "stdin"))
        .map_err(|e| rpc_error("invalid_argument", format!("stdin is not base64: {e}")))?;
    let mut stdin = stdin.lock().await;
    let pipe = stdin
        .as_mut()
        .ok_or_else(|| rpc_error("failed_precondition", "stdin not enabled or closed"))?;
    pipe.write_all(&data)
        .await
        .map_err(|e| rpc_error("internal", format!("error writing to stdin: {e}")))?;
    Ok(json!({}))
}

/// Dropping the pipe is the EOF (after any write in flight).
async fn close_stdin(shared: &Shared, sandbox: &EnvdView, body: &Value) -> RpcResult {
    let stdin = stdin_of(shared, sandbox, body)?;
    stdin.lock().await.take();
    Ok(json!({}))
}

// --- Connect-RPC, the Start stream ---------------------------------------------------------

/// One Connect envelope: a flag byte, the big-endian length, the message.
fn envelope(flags: u8, message: &Value) -> Bytes {
    let payload = serde_json::to_vec(message).expect("JSON");
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// The single message of a server-stream request.
fn read_envelope(body: &[u8]) -> Result<Value, RpcError> {
    let [flags, a, b, c, d, ..] = *body else {
        return Err(rpc_error(
            "invalid_argument",
            "a truncated Connect envelope",
        ));
    };
    if flags & 0x01 != 0 {
        return Err(rpc_error(
            "internal",
            "the fake envd does not decompress messages",
        ));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    let message = body
        .get(5..5 + len)
        .ok_or_else(|| rpc_error("invalid_argument", "a truncated Connect message"))?;
    serde_json::from_slice(message)
        .map_err(|e| rpc_error("invalid_argument", format!("unmarshal message: {e}")))
}

fn stream_reply(frames: mpsc::Receiver<Result<Frame<Bytes>, io::Error>>) -> Reply {
    Response::builder()
        .status(200)
        .header("content-type", "application/connect+json")
        .body(ChannelBody(frames).boxed())
        .expect("a response")
}

/// A stream that failed before its first message: Connect still answers 200, with the
/// error in the end-of-stream message.
fn stream_failure(e: RpcError) -> Reply {
    let end = envelope(
        END_STREAM,
        &json!({"error": {"code": e.code, "message": e.message}}),
    );
    Response::builder()
        .status(200)
        .header("content-type", "application/connect+json")
        .body(full(end))
        .expect("a response")
}

fn start(shared: &Arc<Shared>, req: &Req, sandbox: EnvdView) -> Reply {
    let content_type = req.header("content-type").unwrap_or("");
    if !content_type
        .to_ascii_lowercase()
        .starts_with("application/connect+json")
    {
        return plain(415, "the fake envd speaks the Connect JSON codec only");
    }
    match read_envelope(&req.body).and_then(|request| spawn(shared, req, sandbox, &request)) {
        Ok(reply) => reply,
        Err(e) => stream_failure(e),
    }
}

/// A StartRequest's command, as envd runs it.
struct Launch {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: SandboxPath,
    cwd_raw: Option<String>,
    stdin: bool,
    tag: Option<String>,
}

fn parse_launch(sandbox: &EnvdView, request: &Value) -> Result<Launch, RpcError> {
    if request.get("pty").is_some_and(|p| !p.is_null()) {
        return Err(rpc_error("unimplemented", "the fake envd runs no PTY"));
    }
    let process = request.get("process").unwrap_or(&Value::Null);
    let cmd = str_field(process, "cmd");
    if cmd.is_empty() {
        return Err(rpc_error("invalid_argument", "process.cmd is required"));
    }
    let strings = |v: &Value| v.as_str().map(str::to_string);
    let args = process
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(strings).collect());
    let envs = process.get("envs").and_then(Value::as_object).map(|m| {
        m.iter()
            .filter_map(|(k, v)| Some((k.clone(), strings(v)?)))
            .collect()
    });
    let cwd_raw = process
        .get("cwd")
        .and_then(Value::as_str)
        .map(str::to_string);
    let cwd = rpc_path(sandbox, cwd_raw.as_deref().unwrap_or(HOME))?;
    if !cwd.host.is_dir() {
        return Err(rpc_error(
            "invalid_argument",
            format!("cwd '{}' does not exist", cwd.shown),
        ));
    }
    Ok(Launch {
        cmd: cmd.to_string(),
        args: args.unwrap_or_default(),
        envs: envs.unwrap_or_default(),
        cwd,
        cwd_raw,
        // Unset means stdin on, for envd's backwards compatibility.
        stdin: request
            .get("stdin")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        tag: request
            .get("tag")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// envd's command line and environment (`handler.New` in `e2b-dev/infra`), on the host.
fn command(sandbox: &EnvdView, launch: &Launch) -> Command {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_string());
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg("exec \"$@\"")
        .arg("--")
        .arg(&launch.cmd)
        .args(&launch.args)
        .current_dir(&launch.cwd.host)
        .env_clear()
        .env("PATH", path)
        .env("HOME", sandbox.root.join("home/user"))
        .env("USER", "user")
        .env("LOGNAME", "user")
        .envs(&sandbox.env_vars)
        .envs(&launch.envs)
        .stdin(if launch.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// Starts the command and answers its event stream (start, data..., end).
fn spawn(
    shared: &Arc<Shared>,
    req: &Req,
    sandbox: EnvdView,
    request: &Value,
) -> Result<Reply, RpcError> {
    let launch = parse_launch(&sandbox, request)?;
    let mut child = command(&sandbox, &launch).spawn().map_err(|e| {
        rpc_error(
            "invalid_argument",
            format!("error starting process '{}': {e}", launch.cmd),
        )
    })?;
    let pid = child
        .id()
        .ok_or_else(|| rpc_error("internal", "the process ended before it started"))?;
    let (out_tx, out_rx) = mpsc::channel(64);
    if let Some(stdout) = child.stdout.take() {
        pump(stdout, true, out_tx.clone());
    }
    if let Some(stderr) = child.stderr.take() {
        pump(stderr, false, out_tx);
    }
    let stdin = child
        .stdin
        .take()
        .map(|s| Arc::new(tokio::sync::Mutex::new(Some(s))));
    let mut config = json!({"cmd": launch.cmd, "args": launch.args, "envs": launch.envs});
    if let Some(cwd) = &launch.cwd_raw {
        config["cwd"] = json!(cwd);
    }
    let process = Proc {
        sandbox_id: sandbox.id.clone(),
        tag: launch.tag,
        config,
        stdin,
    };
    shared.lock().processes.insert(pid, process);
    let (frames, frames_rx) = mpsc::channel(64);
    let start = json!({"event": {"start": {"pid": pid}}});
    let _ = frames.try_send(Ok(Frame::data(envelope(0, &start))));
    let run = Run {
        shared: shared.clone(),
        pid,
        frames: Some(frames),
        deadline: header_millis(req, "connect-timeout-ms").map(|ms| req.received + ms),
        keepalive: req
            .header("keepalive-ping-interval")
            .and_then(|s| s.parse().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
    };
    tokio::spawn(run.drive(child, out_rx, sandbox.cut));
    Ok(stream_reply(frames_rx))
}

fn header_millis(req: &Req, name: &str) -> Option<Duration> {
    req.header(name)?.parse().ok().map(Duration::from_millis)
}

/// Reads one output pipe in envd's 32 KiB chunks until EOF.
fn pump(
    mut pipe: impl AsyncRead + Unpin + Send + 'static,
    stdout: bool,
    tx: mpsc::Sender<(bool, Bytes)>,
) {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((stdout, Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
}

/// A running command's stream.
struct Run {
    shared: Arc<Shared>,
    pid: u32,
    /// `None` once the client is gone or the stream has ended.
    frames: Option<mpsc::Sender<Result<Frame<Bytes>, io::Error>>>,
    deadline: Option<Instant>,
    keepalive: Option<Duration>,
}

enum Event {
    Output(Option<(bool, Bytes)>),
    Exited(io::Result<ExitStatus>),
    Deadline,
    Keepalive,
    GraceOver,
    Cut,
}

impl Run {
    /// Forwards output until the command has exited and its output is drained (or the
    /// grace after the exit is over), then the end event and the end of the stream.
    async fn drive(
        mut self,
        mut child: tokio::process::Child,
        mut output: mpsc::Receiver<(bool, Bytes)>,
        mut cut: watch::Receiver<u64>,
    ) {
        let mut exit: Option<io::Result<ExitStatus>> = None;
        let mut output_open = true;
        let mut grace_until: Option<Instant> = None;
        let mut last_sent = Instant::now();
        while exit.is_none() || output_open {
            let never = Instant::now() + Duration::from_secs(365 * 86400);
            let listening = self.frames.is_some();
            let deadline = self
                .deadline
                .filter(|_| listening && exit.is_none())
                .unwrap_or(never);
            let keepalive = self
                .keepalive
                .filter(|_| listening)
                .map_or(never, |k| last_sent + k);
            let event = tokio::select! {
                chunk = output.recv(), if output_open => Event::Output(chunk),
                status = child.wait(), if exit.is_none() => Event::Exited(status),
                _ = tokio::time::sleep_until(deadline.into()) => Event::Deadline,
                _ = tokio::time::sleep_until(keepalive.into()) => Event::Keepalive,
                _ = tokio::time::sleep_until(grace_until.unwrap_or(never).into()) => Event::GraceOver,
                _ = cut.changed(), if listening => Event::Cut,
            };
            match event {
                Event::Output(Some((stdout, data))) => {
                    self.send(&data_event(stdout, &data)).await;
                    last_sent = Instant::now();
                }
                Event::Output(None) => output_open = false,
                Event::Exited(status) => {
                    // Reaped: the pid is no longer this command's to signal.
                    self.shared.lock().processes.remove(&self.pid);
                    exit = Some(status);
                    grace_until = Some(Instant::now() + OUTPUT_GRACE);
                }
                Event::Deadline => self.timed_out().await,
                Event::Keepalive => {
                    self.send(&json!({"event": {"keepalive": {}}})).await;
                    last_sent = Instant::now();
                }
                Event::GraceOver => break,
                Event::Cut => self.cut_off(),
            }
        }
        if let Some(status) = exit {
            self.send(&end_event(&status)).await;
            self.end_stream(&json!({})).await;
        }
    }

    async fn send(&mut self, message: &Value) {
        let Some(frames) = &self.frames else { return };
        if frames
            .send(Ok(Frame::data(envelope(0, message))))
            .await
            .is_err()
        {
            // The client went away: the command keeps running, as under envd.
            self.frames = None;
        }
    }

    async fn end_stream(&mut self, message: &Value) {
        if let Some(frames) = self.frames.take() {
            let _ = frames
                .send(Ok(Frame::data(envelope(END_STREAM, message))))
                .await;
        }
    }

    /// `Connect-Timeout-Ms` passed: envd's process context kills the command and the
    /// stream ends `deadline_exceeded`.
    async fn timed_out(&mut self) {
        signal_group(self.pid, libc::SIGKILL);
        let error =
            json!({"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}});
        self.end_stream(&error).await;
    }

    /// The sandbox was paused or killed: like E2B's proxy, the connection breaks.
    fn cut_off(&mut self) {
        if let Some(frames) = self.frames.take() {
            let _ = frames.try_send(Err(io::Error::other("the sandbox stopped running")));
        }
    }
}

fn data_event(stdout: bool, data: &[u8]) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(data);
    let field = if stdout { "stdout" } else { "stderr" };
    json!({"event": {"data": {field: encoded}}})
}

/// The EndEvent as envd fills it from Go's `ProcessState`; proto3 JSON leaves out zero
/// values, so `exitCode` is absent on success and `exited` when signalled.
fn end_event(status: &io::Result<ExitStatus>) -> Value {
    let mut end = Map::new();
    match status {
        Ok(status) => {
            let text = go_status(status);
            match status.code() {
                Some(0) => {}
                Some(code) => {
                    end.insert("exitCode".into(), json!(code));
                }
                None => {
                    end.insert("exitCode".into(), json!(-1));
                }
            }
            if status.code().is_some() {
                end.insert("exited".into(), json!(true));
            }
            if !status.success() {
                end.insert("error".into(), json!(text));
            }
            end.insert("status".into(), json!(text));
        }
        Err(e) => {
            end.insert("exitCode".into(), json!(-1));
            end.insert("error".into(), json!(e.to_string()));
        }
    }
    json!({"event": {"end": end}})
}

/// Go's `ProcessState.String()`: `exit status 3`, `signal: killed`.
fn go_status(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    let signal = status.signal().unwrap_or(0);
    let name = match signal {
        libc::SIGHUP => "hangup".to_string(),
        libc::SIGINT => "interrupt".to_string(),
        libc::SIGQUIT => "quit".to_string(),
        libc::SIGABRT => "aborted".to_string(),
        libc::SIGKILL => "killed".to_string(),
        libc::SIGSEGV => "segmentation fault".to_string(),
        libc::SIGPIPE => "broken pipe".to_string(),
        libc::SIGTERM => "terminated".to_string(),
        other => format!("signal {other}"),
    };
    let core = if status.core_dumped() {
        " (core dumped)"
    } else {
        ""
    };
    format!("signal: {name}{core}")
}

/// A response body fed by a channel; an `Err` item breaks the connection.
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

fn plain(status: u16, text: &'static str) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(full(text))
        .expect("a response")
}

fn empty(status: u16) -> Reply {
    Response::builder()
        .status(status)
        .body(full(Bytes::new()))
        .expect("a response")
}

/// E2B's API error body: `{code, error_code?, message}`.
fn api_error(status: u16, error_code: Option<&str>, message: impl Into<String>) -> Reply {
    let mut body = json!({"code": status, "message": message.into()});
    if let Some(code) = error_code {
        body["error_code"] = json!(code);
    }
    json_reply(status, &body)
}

fn bad_request(message: impl Into<String>) -> Reply {
    api_error(400, None, message)
}

fn parse_message(e: serde_json::Error) -> String {
    format!("Error when parsing request: {e}")
}

fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: killpg has no memory-safety preconditions; the group is the command's own
    // (it was started with process_group(0), so its pgid is its pid).
    unsafe {
        libc::killpg(pid as libc::pid_t, signal);
    }
}

/// Copies a directory tree (files, directories, symlinks) into `to`, merging.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            let _ = std::fs::remove_file(&target);
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
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

/// 20 lowercase alphanumerics, like E2B's sandbox IDs.
fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    random_bytes::<20>()
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// `2026-01-02T03:04:05[.fraction](Z|±hh:mm)`, as the SDKs send `startedAfter`.
fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if bytes.len() < 20
        || separators.iter().any(|(i, c)| bytes[*i] != *c)
        || !matches!(bytes[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let number = |from: usize, to: usize| text.get(from..to)?.parse::<u32>().ok();
    let month = time::Month::try_from(u8::try_from(number(5, 7)?).ok()?).ok()?;
    let date = time::Date::from_calendar_date(
        i32::try_from(number(0, 4)?).ok()?,
        month,
        u8::try_from(number(8, 10)?).ok()?,
    )
    .ok()?;
    let (mut rest, mut nanos) = (&text[19..], 0u32);
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        let padded = format!("{:0<9}", &fraction[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_secs: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = rest.get(1..)?.split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60)
        }
    };
    let clock = time::Time::from_hms_nano(
        u8::try_from(number(11, 13)?).ok()?,
        u8::try_from(number(14, 16)?).ok()?,
        u8::try_from(number(17, 19)?).ok()?,
        nanos,
    )
    .ok()?;
    let unix = date.with_time(clock).assume_utc().unix_timestamp() - offset_secs;
    Some(UNIX_EPOCH + Duration::new(u64::try_from(unix).ok()?, nanos))
}

/// A query string's pairs, form-decoded (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(key), form_decode(value))
        })
        .collect()
}

fn form_decode(text: &str) -> String {
    percent_decode(&text.replace('+', " "))
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// Go's `url.QueryUnescape`: `+` is a space, and a malformed `%` escape is an error.
fn query_unescape(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices('%') {
        let hex = bytes
            .get(i + 1..i + 3)
            .ok_or("error when unescaping query: invalid escape")?;
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!(
                "error when unescaping query: invalid escape {:?}",
                String::from_utf8_lossy(hex)
            ));
        }
    }
    Ok(form_decode(text))
}
