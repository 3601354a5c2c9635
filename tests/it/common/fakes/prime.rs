//! A fake Prime Intellect on a real socket: the platform API at `PRIME_API_BASE_URL`
//! (`http://127.0.0.1:PORT`, HTTP/1.1 or h2c) and the sandbox gateway on the same socket
//! under `/gw`.
//!
//! `tests/it/prime_fake.rs::official_python_sdk_accepts_the_fake` proves it with the official
//! `prime-sandboxes` Python SDK 0.5.1 (`tests/sdk/prime_contract.py`): the SDK's own client
//! creates a sandbox with a `network_allowlist`, waits for it (batch status, then a
//! reachability command through the gateway), runs commands (Connect stream, protobuf
//! codec), uploads, downloads and reads files, lists by label, reads the egress policy and
//! deletes. Paths, fields and enums come from that SDK (`sandbox.py`, `models.py`,
//! `rpc_command_session.py`, `_proto/command_session`); where it does not say (error
//! bodies beyond `detail`, what the server does with a missing parent directory) the choice
//! is noted below.
//!
//! Implemented:
//! - Platform API under `/api/v1`, `Authorization: Bearer <key>`; errors are FastAPI's
//!   `{"detail": "..."}` (what the SDK reads). `POST /sandbox` (snake_case request: `name`,
//!   `docker_image` xor `checkpoint_id`, `cpu_cores`, `memory_gb`, `disk_size_gb`,
//!   `gpu_count` + `gpu_type`, `timeout_minutes`, `environment_vars`, `labels` (strings),
//!   `network_allowlist` xor `network_denylist` (≤ 1024 entries: IPv4, IPv4 CIDR, hostname
//!   or `*.` wildcard; IPv6, schemes and ports refused), `vm`, `team_id`, `region`,
//!   `idempotency_key` (the same key answers the same sandbox)); the answer is the sandbox
//!   in camelCase with a `gatewayAuth` block. `GET /sandbox` (`page`, `per_page` ≤ 100,
//!   `labels` repeated = all of them, `status`, `is_active`; `{sandboxes, total, page,
//!   perPage, hasNext}`, newest first), `GET|DELETE /sandbox/{id}` (404 unknown; a deleted
//!   sandbox stays visible as `TERMINATED`), `POST /sandbox/status:batchGet`,
//!   `POST /sandbox/{id}/auth`, `GET /sandbox/{id}/egress-policy`,
//!   `GET /sandbox/{id}/error-context`, checkpoints (`POST /sandbox/{id}/checkpoints` copies
//!   a running sandbox's files, `PENDING` then `DURABLE`; `GET|DELETE
//!   /sandbox/checkpoints/{cid}`, `POST /sandbox/checkpoints:batchGet`; a create with a
//!   durable `checkpoint_id` starts from its files). States `PENDING` → `PROVISIONING` → `RUNNING` (each
//!   half of `boot_delay`); a scripted `failed_before_running` boots into `ERROR`.
//! - Gateway `/gw/{user_ns}/{job_id}/...` with the sandbox's token (`Bearer`, from `auth`):
//!   `command_session.CommandSession/Start` (Connect server stream,
//!   `application/connect+proto`: `start`, `data` (stdout/stderr as produced), `end`
//!   (`exit_code` sint32, `exited`), then the end-of-stream message; `Connect-Timeout-Ms`
//!   kills the command and ends with `deadline_exceeded`), `CommandSession/SendSignal`
//!   (unary `application/proto`, by `session_uuid`), `POST /upload?path=&sandbox_id=`
//!   (multipart `file`; the fake makes missing parent directories), `GET /download`,
//!   `GET /read-file` (`{content, size}`). Commands REALLY run: the program and its
//!   arguments as given (no shell), in their own process group, with `HOME=/root`, the
//!   sandbox's `environment_vars` and the request's envs; every `/root` in arguments, env
//!   values and the cwd is mapped to the sandbox's directory on the host (the only mapping:
//!   other absolute paths are the host's). Files resolve inside the sandbox's directory
//!   (relative to `/root`); `..` above `/` is refused (400). A sandbox not `RUNNING`
//!   answers 409 (`TERMINATED`: 410 `{"error": "sandbox_terminated"}`).
//! - Test knobs: a fault [`FakePrime::script`] for creates, [`FakePrimeConfig`], the
//!   inventory ([`FakeSandbox`] copies with their labels, environment and egress lists), the
//!   requests seen ([`SeenRequest`], no secrets), the commands run, files.
//!
//! Deliberately not implemented: isolation and egress enforcement (lists are validated and
//! recorded), stdin, PTYs, background jobs, LAN networks, volumes,
//! images, SSH, logs, timeouts ending a sandbox.

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
use sandgate::e2b::connect as connect_rpc;
use sandgate::providers::prime::proto::{Reader, Writer};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// The sandbox user's home, where relative paths and commands start.
pub const HOME: &str = "/root";
const MAX_BODY: usize = 256 << 20;
const USER_NS: &str = "u-fake";

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FakePrimeConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` create the sandbox stays out of listings.
    pub appear_after: Duration,
    /// PENDING → PROVISIONING → RUNNING takes this long.
    pub boot_delay: Duration,
}

impl Default for FakePrimeConfig {
    fn default() -> Self {
        FakePrimeConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            boot_delay: Duration::from_millis(300),
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 503 `{"detail": "no capacity ..."}` (Prime documents no distinct capacity signal).
    Capacity,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 502.
    Outage,
    /// The sandbox is created but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Accepted, then boots into `ERROR`.
    FailedBeforeRunning,
    /// Answered from an earlier create with the same `idempotency_key`.
    Replayed,
    /// Refused (4xx) before the script.
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
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

/// A sandbox as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeSandbox {
    pub id: String,
    pub name: String,
    /// `PENDING`, `PROVISIONING`, `RUNNING`, `ERROR`, `TERMINATED`.
    pub status: String,
    pub labels: Vec<String>,
    pub environment_vars: BTreeMap<String, String>,
    pub docker_image: Option<String>,
    pub checkpoint_id: Option<String>,
    pub network_allowlist: Option<Vec<String>>,
    pub network_denylist: Option<Vec<String>>,
    /// The create's body as sent.
    pub request: Value,
    pub idempotency_key: Option<String>,
    /// The sandbox's `/` on the host.
    pub root: PathBuf,
    pub outcome: CreateOutcome,
}

impl FakeSandbox {
    pub fn live(&self) -> bool {
        !matches!(self.status.as_str(), "ERROR" | "TERMINATED" | "TIMEOUT")
    }
}

/// A sandbox's (`network_allowlist`, `network_denylist`) as created.
pub type EgressLists = (Option<Vec<String>>, Option<Vec<String>>);

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Whether the gateway token (not the API key) authorized it.
    pub gateway: bool,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// One command the fake ran.
#[derive(Clone, Debug)]
pub struct FakeCommand {
    pub sandbox_id: String,
    pub argv: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub session_uuid: String,
    pub exit_code: Option<i32>,
}

pub struct FakePrime {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakePrime {
    pub async fn start(config: FakePrimeConfig) -> FakePrime {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake Prime");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            api_key: format!("pit_fake_{}", random_hex(16)),
            base,
            addr,
            inner: Mutex::default(),
        });
        let tasks = vec![tokio::spawn(accept(listener, shared.clone()))];
        FakePrime {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: the SDK's `PRIME_API_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `capacity`, `rate_limit`,
    /// `outage`, `timeout_after_send`, `failed_before_running`. Panics on another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Prime has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every create attempt's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        let mut inner = self.shared.lock();
        let config = self.shared.config.clone();
        inner.sandboxes.get_mut(id).map(|e| {
            e.advance(&config);
            e.view.clone()
        })
    }

    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let mut inner = self.shared.lock();
        let config = self.shared.config.clone();
        let order = inner.order.clone();
        order
            .iter()
            .filter_map(|id| {
                let e = inner.sandboxes.get_mut(id)?;
                e.advance(&config);
                Some(e.view.clone())
            })
            .collect()
    }

    /// Sandboxes not deleted or failed.
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes().into_iter().filter(|s| s.live()).collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    /// Live sandboxes carrying the label `key=value`.
    pub fn live_with_label(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        let label = format!("{key}={value}");
        self.live()
            .into_iter()
            .filter(|s| s.labels.contains(&label))
            .collect()
    }

    /// The egress lists a sandbox was created with: (`network_allowlist`,
    /// `network_denylist`).
    pub fn egress(&self, id: &str) -> Option<EgressLists> {
        let s = self.sandbox(id)?;
        Some((s.network_allowlist, s.network_denylist))
    }

    pub fn environment(&self, id: &str) -> Option<BTreeMap<String, String>> {
        Some(self.sandbox(id)?.environment_vars)
    }

    /// Ids of the checkpoints the fake holds.
    pub fn checkpoints(&self) -> Vec<String> {
        self.shared.lock().checkpoints.keys().cloned().collect()
    }

    pub fn commands(&self) -> Vec<FakeCommand> {
        self.shared.lock().commands.clone()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }

    /// A file in a sandbox (path absolute or relative to `/root`).
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.sandbox(id)?.root;
        std::fs::read(resolve(&root, path).ok()?).ok()
    }

    /// Every file under a sandbox's `/` (paths as the sandbox sees them).
    pub fn files(&self, id: &str) -> Vec<(String, Vec<u8>)> {
        let Some(root) = self.sandbox(id).map(|s| s.root) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out
    }
}

impl Drop for FakePrime {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let inner = self.shared.lock();
        for pid in inner.running.values() {
            // SAFETY: a plain syscall on a process group this fake started.
            unsafe {
                libc::kill(-(*pid as i32), libc::SIGKILL);
            }
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(root, &path, out),
            Ok(t) if t.is_file() => {
                let shown = format!("/{}", path.strip_prefix(root).unwrap().display());
                out.push((shown, std::fs::read(&path).unwrap_or_default()));
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakePrimeConfig,
    api_key: String,
    base: PathBuf,
    addr: SocketAddr,
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
    sandboxes: HashMap<String, Entry>,
    order: Vec<String>,
    by_key: HashMap<String, String>,
    /// Gateway tokens to sandbox ids.
    tokens: HashMap<String, String>,
    checkpoints: HashMap<String, Checkpoint>,
    /// Running command sessions (`session_uuid`) to their process group.
    running: HashMap<String, u32>,
    commands: Vec<FakeCommand>,
    seen: Vec<SeenRequest>,
}

/// A filesystem checkpoint: a copy of its sandbox's files, `PENDING` for half of
/// `boot_delay`, then `DURABLE`.
struct Checkpoint {
    sandbox_id: String,
    image: Option<String>,
    root: PathBuf,
    since: Instant,
    created: String,
}

impl Checkpoint {
    fn state(&self, config: &FakePrimeConfig) -> &'static str {
        if self.since.elapsed() < config.boot_delay / 2 {
            "PENDING"
        } else {
            "DURABLE"
        }
    }

    fn json(&self, id: &str, config: &FakePrimeConfig) -> Value {
        let size = dir_size(&self.root);
        json!({
            "id": id,
            "sandbox_id": self.sandbox_id,
            "parent_id": null,
            "team_id": null,
            "state": self.state(config),
            "depth": 0,
            "docker_image": self.image.clone().unwrap_or_default(),
            "disk_size_bytes": size,
            "stored_bytes": size,
            "occupied_bytes": size,
            "error": null,
            "created_at": self.created,
            "updated_at": self.created,
        })
    }
}

struct Entry {
    view: FakeSandbox,
    since: Instant,
    created: String,
    fails: bool,
    hidden_until: Option<Instant>,
}

impl Entry {
    fn advance(&mut self, config: &FakePrimeConfig) {
        loop {
            let half = config.boot_delay / 2;
            if self.since.elapsed() < half {
                return;
            }
            let next = match self.view.status.as_str() {
                "PENDING" => "PROVISIONING",
                "PROVISIONING" if self.fails => "ERROR",
                "PROVISIONING" => "RUNNING",
                _ => return,
            };
            self.view.status = next.to_string();
            self.since += half;
        }
    }

    fn json(&self) -> Value {
        let v = &self.view;
        let r = &v.request;
        let error = v.status == "ERROR";
        json!({
            "id": v.id,
            "name": v.name,
            "dockerImage": v.docker_image.clone().unwrap_or_default(),
            "startCommand": null,
            "cpuCores": r["cpu_cores"].as_f64().unwrap_or(1.0),
            "memoryGB": r["memory_gb"].as_f64().unwrap_or(1.0),
            "diskSizeGB": r["disk_size_gb"].as_f64().unwrap_or(5.0),
            "diskMountPath": "/sandbox-workspace",
            "gpuCount": r["gpu_count"].as_u64().unwrap_or(0),
            "gpuType": r["gpu_type"],
            "vm": r["vm"].as_bool().unwrap_or(false),
            "networkAllowlist": v.network_allowlist,
            "networkDenylist": v.network_denylist,
            "status": v.status,
            "timeoutMinutes": r["timeout_minutes"].as_u64().unwrap_or(60),
            "environmentVars": v.environment_vars,
            "labels": v.labels,
            "createdAt": self.created,
            "updatedAt": self.created,
            "startedAt": if v.status == "RUNNING" { Some(&self.created) } else { None },
            "terminatedAt": if v.live() { None } else { Some(now_rfc3339()) },
            "errorType": if error { Some("STARTUP_FAILED") } else { None },
            "errorMessage": if error { Some("the sandbox failed to start") } else { None },
            "userId": "user-fake",
            "teamId": r["team_id"],
            "region": r["region"],
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

    fn params(&self, name: &str) -> Vec<String> {
        parse_query(self.query.as_deref().unwrap_or(""))
            .into_iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v)
            .collect()
    }

    fn param(&self, name: &str) -> Option<String> {
        self.params(name).into_iter().next()
    }

    fn segments(&self) -> Vec<String> {
        self.path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect()
    }

    fn bearer(&self) -> Option<&str> {
        self.header("authorization")?.strip_prefix("Bearer ")
    }

    /// The JSON body (an empty body is `{}`); `Err` is the 422.
    fn json(&self) -> Result<Value, Reply> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if v.is_object() => Ok(v),
            Ok(_) => Err(detail(422, "the body must be a JSON object")),
            Err(e) => Err(detail(422, format!("invalid JSON body: {e}"))),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(detail(413, "the request body is too large or broken")),
    };
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let gateway = req.path.starts_with("/gw/");
    let result = if gateway {
        gateway_route(&shared, &req).await
    } else {
        api_route(&shared, &req).await
    };
    shared.lock().seen.push(SeenRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
        query: req.query.clone(),
        gateway,
        status: result.as_ref().ok().map(|r| r.status().as_u16()),
    });
    result
}

async fn api_route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    if req.bearer() != Some(shared.api_key.as_str()) {
        return Ok(detail(401, "Invalid API key"));
    }
    let segments = req.segments();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let m = &req.method;
    Ok(match (m, s.as_slice()) {
        (&Method::POST, ["api", "v1", "sandbox"]) => return create(shared, req).await,
        (&Method::GET, ["api", "v1", "sandbox"]) => list(shared, req),
        (&Method::POST, ["api", "v1", "sandbox", "status:batchGet"]) => batch_status(shared, req),
        (&Method::POST, ["api", "v1", "sandbox", "checkpoints:batchGet"]) => {
            batch_checkpoints(shared, req)
        }
        (&Method::GET, ["api", "v1", "sandbox", "checkpoints", cid]) => {
            let inner = shared.lock();
            match inner.checkpoints.get(*cid) {
                Some(c) => json_reply(200, &c.json(cid, &shared.config)),
                None => detail(404, format!("Checkpoint {cid} not found")),
            }
        }
        (&Method::DELETE, ["api", "v1", "sandbox", "checkpoints", cid]) => {
            delete_checkpoint(shared, cid)
        }
        (&Method::POST, ["api", "v1", "sandbox", id, "checkpoints"]) => checkpoint(shared, id)?,
        (&Method::GET, ["api", "v1", "sandbox", id]) => {
            with_entry(shared, id, |e| json_reply(200, &e.json()))
        }
        (&Method::DELETE, ["api", "v1", "sandbox", id]) => delete(shared, id),
        (&Method::POST, ["api", "v1", "sandbox", id, "auth"]) => auth(shared, id),
        (&Method::GET, ["api", "v1", "sandbox", id, "egress-policy"]) => {
            with_entry(shared, id, |e| {
                json_reply(
                    200,
                    &json!({
                        "policy": {"allowlist": e.view.network_allowlist, "denylist": e.view.network_denylist},
                        "generation": 1,
                        "applied_generation": 1,
                        "applied": true,
                    }),
                )
            })
        }
        (&Method::GET, ["api", "v1", "sandbox", id, "error-context"]) => {
            with_entry(shared, id, |e| {
                let j = e.json();
                json_reply(
                    200,
                    &json!({"status": j["status"], "errorType": j["errorType"], "errorMessage": j["errorMessage"]}),
                )
            })
        }
        _ => detail(404, format!("Not Found: {} {}", req.method, req.path)),
    })
}

/// `f` on the sandbox (advanced to now), or the 404.
fn with_entry(shared: &Shared, id: &str, f: impl FnOnce(&Entry) -> Reply) -> Reply {
    let mut inner = shared.lock();
    match inner.sandboxes.get_mut(id) {
        Some(e) => {
            e.advance(&shared.config);
            f(e)
        }
        None => detail(404, format!("Sandbox {id} not found")),
    }
}

// ---------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------

/// One `network_allowlist` / `network_denylist` entry as Prime's contract takes it: an IPv4
/// address, an IPv4 CIDR, a hostname or a `*.` wildcard; no IPv6, scheme, port or path.
fn valid_entry(entry: &str) -> Result<(), String> {
    let e = entry.trim();
    if e.is_empty() {
        return Err("empty entry".into());
    }
    if e.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    if let Some((ip, bits)) = e.split_once('/') {
        return match (ip.parse::<Ipv4Addr>(), bits.parse::<u8>()) {
            (Ok(_), Ok(b)) if b <= 32 => Ok(()),
            _ => Err(format!("'{entry}' is not a valid IPv4 CIDR")),
        };
    }
    if e.contains(':') {
        return Err(format!(
            "'{entry}': IPv6, schemes and ports are not supported"
        ));
    }
    let domain = e.strip_prefix("*.").unwrap_or(e).trim_end_matches('.');
    let ok = !domain.is_empty()
        && domain
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if ok {
        Ok(())
    } else {
        Err(format!("'{entry}' is not a hostname, IPv4 address or CIDR"))
    }
}

fn string_list(body: &Value, field: &str) -> Result<Option<Vec<String>>, Reply> {
    match &body[field] {
        Value::Null => Ok(None),
        Value::Array(items) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| detail(422, format!("{field} must hold strings")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        _ => Err(detail(422, format!("{field} must be a list of strings"))),
    }
}

/// The create's body checked as Prime's API does; `Err` is the refusal.
fn parse_create(body: &Value) -> Result<FakeSandbox, Reply> {
    let name = body["name"]
        .as_str()
        .ok_or_else(|| detail(422, "name is required"))?
        .to_string();
    let image = body["docker_image"].as_str().map(str::to_string);
    let checkpoint = body["checkpoint_id"].as_str().map(str::to_string);
    if image.is_some() == checkpoint.is_some() {
        return Err(detail(
            422,
            "give exactly one of docker_image and checkpoint_id",
        ));
    }
    let gpus = body["gpu_count"].as_u64().unwrap_or(0);
    if gpus > 0 && !body["gpu_type"].is_string() {
        return Err(detail(
            422,
            "gpu_type is required when gpu_count is greater than 0",
        ));
    }
    let env = match &body["environment_vars"] {
        Value::Null => BTreeMap::new(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_string())),
                None => Err(detail(
                    422,
                    format!("environment_vars.{k} must be a string"),
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(detail(422, "environment_vars must be an object of strings")),
    };
    let labels = string_list(body, "labels")?.unwrap_or_default();
    let allow = string_list(body, "network_allowlist")?;
    let deny = string_list(body, "network_denylist")?;
    if allow.is_some() && deny.is_some() {
        return Err(detail(
            422,
            "network_allowlist and network_denylist are mutually exclusive; provide at most one",
        ));
    }
    for (field, list) in [("network_allowlist", &allow), ("network_denylist", &deny)] {
        let Some(list) = list else { continue };
        if list.len() > 1024 {
            return Err(detail(
                422,
                format!("{field} supports at most 1024 entries"),
            ));
        }
        for entry in list {
            valid_entry(entry).map_err(|m| detail(422, format!("{field}: {m}")))?;
        }
    }
    Ok(FakeSandbox {
        id: String::new(),
        name,
        status: "PENDING".into(),
        labels,
        environment_vars: env,
        docker_image: image,
        checkpoint_id: checkpoint,
        network_allowlist: allow,
        network_denylist: deny,
        request: body.clone(),
        idempotency_key: body["idempotency_key"].as_str().map(str::to_string),
        root: PathBuf::new(),
        outcome: CreateOutcome::Ok,
    })
}

/// The sandbox's JSON with a fresh `gatewayAuth` (what a create answers).
fn with_auth(shared: &Shared, id: &str) -> Value {
    let mut inner = shared.lock();
    let token = new_token(&mut inner, id);
    let e = inner.sandboxes.get_mut(id).expect("a sandbox just made");
    e.advance(&shared.config);
    let mut out = e.json();
    out["gatewayAuth"] = auth_json(shared, id, &token);
    out
}

async fn create(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let reject = |reply: Reply| {
        shared.lock().create_log.push(CreateOutcome::Rejected);
        Ok(reply)
    };
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return reject(reply),
    };
    let mut view = match parse_create(&body) {
        Ok(v) => v,
        Err(reply) => return reject(reply),
    };
    let outcome;
    let id;
    {
        let mut inner = shared.lock();
        let replayed = view
            .idempotency_key
            .as_ref()
            .and_then(|k| inner.by_key.get(k))
            .cloned();
        if let Some(existing) = replayed {
            inner.create_log.push(CreateOutcome::Replayed);
            drop(inner);
            return Ok(json_reply(200, &with_auth(shared, &existing)));
        }
        outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        match outcome {
            CreateOutcome::Capacity => {
                return Ok(detail(
                    503,
                    "no capacity is available for this sandbox in the requested region",
                ))
            }
            CreateOutcome::RateLimit => {
                let mut reply = detail(429, "Too many requests");
                reply.headers_mut().insert(
                    "retry-after",
                    shared.config.retry_after_secs.to_string().parse().unwrap(),
                );
                return Ok(reply);
            }
            CreateOutcome::Outage => return Ok(detail(502, "Bad Gateway")),
            _ => {}
        }
        let from = match &view.checkpoint_id {
            Some(cid) => match inner.checkpoints.get(cid) {
                Some(c) if c.state(&shared.config) == "DURABLE" => {
                    view.docker_image = c.image.clone();
                    Some(c.root.clone())
                }
                Some(_) => {
                    inner.create_log.pop();
                    inner.create_log.push(CreateOutcome::Rejected);
                    return Ok(detail(409, format!("Checkpoint {cid} is not durable yet")));
                }
                None => {
                    inner.create_log.pop();
                    inner.create_log.push(CreateOutcome::Rejected);
                    return Ok(detail(404, format!("Checkpoint {cid} not found")));
                }
            },
            None => None,
        };
        id = random_alnum(24).to_lowercase();
        let root = shared.base.join(&id);
        match from {
            Some(from) => copy_dir(&from, &root)?,
            None => std::fs::create_dir_all(root.join("root"))?,
        }
        view.id = id.clone();
        view.root = root;
        view.outcome = outcome;
        let hidden_until = (outcome == CreateOutcome::TimeoutAfterSend
            && !shared.config.appear_after.is_zero())
        .then(|| Instant::now() + shared.config.appear_after);
        if let Some(k) = &view.idempotency_key {
            inner.by_key.insert(k.clone(), id.clone());
        }
        inner.sandboxes.insert(
            id.clone(),
            Entry {
                view,
                since: Instant::now(),
                created: now_rfc3339(),
                fails: outcome == CreateOutcome::FailedBeforeRunning,
                hidden_until,
            },
        );
        inner.order.push(id.clone());
    }
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    Ok(json_reply(200, &with_auth(shared, &id)))
}

fn list(shared: &Shared, req: &Req) -> Reply {
    let number = |name: &str, default: usize, max: usize| match req.param(name) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(detail(422, format!("{name} must be 1..={max}"))),
        },
    };
    let (page, per_page) = match (number("page", 1, 1_000_000), number("per_page", 50, 100)) {
        (Ok(p), Ok(pp)) => (p, pp),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let labels = req.params("labels");
    let status = req.param("status");
    let active_only = req.param("is_active").as_deref() == Some("true");
    let mut inner = shared.lock();
    let config = shared.config.clone();
    let order: Vec<String> = inner.order.iter().rev().cloned().collect();
    let mut matching = Vec::new();
    for id in order {
        let Some(e) = inner.sandboxes.get_mut(&id) else {
            continue;
        };
        e.advance(&config);
        if e.hidden_until.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        let keep = labels.iter().all(|l| e.view.labels.contains(l))
            && status.as_ref().is_none_or(|s| &e.view.status == s)
            && (!active_only || e.view.live());
        if keep {
            matching.push(e.json());
        }
    }
    let total = matching.len();
    let start = (page - 1).saturating_mul(per_page).min(total);
    let end = (start + per_page).min(total);
    json_reply(
        200,
        &json!({
            "sandboxes": matching[start..end],
            "total": total,
            "page": page,
            "perPage": per_page,
            "hasNext": end < total,
        }),
    )
}

fn batch_status(shared: &Shared, req: &Req) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(ids) = body["sandbox_ids"].as_array() else {
        return detail(422, "sandbox_ids is required");
    };
    let mut inner = shared.lock();
    let (mut statuses, mut errors) = (Vec::new(), Vec::new());
    for id in ids.iter().filter_map(Value::as_str) {
        match inner.sandboxes.get_mut(id) {
            Some(e) => {
                e.advance(&shared.config);
                let j = e.json();
                statuses.push(json!({
                    "sandbox_id": id,
                    "status": j["status"],
                    "error_type": j["errorType"],
                    "error_message": j["errorMessage"],
                }));
            }
            None => {
                errors.push(json!({"sandbox_id": id, "code": "NOT_FOUND", "message": "not found"}))
            }
        }
    }
    json_reply(200, &json!({"statuses": statuses, "errors": errors}))
}

fn delete(shared: &Shared, id: &str) -> Reply {
    let sessions: Vec<u32>;
    {
        let mut inner = shared.lock();
        let Some(e) = inner.sandboxes.get_mut(id) else {
            return detail(404, format!("Sandbox {id} not found"));
        };
        e.view.status = "TERMINATED".into();
        inner.tokens.retain(|_, s| s != id);
        let sandbox_sessions: Vec<String> = inner
            .commands
            .iter()
            .filter(|c| c.sandbox_id == id)
            .map(|c| c.session_uuid.clone())
            .collect();
        sessions = sandbox_sessions
            .iter()
            .filter_map(|s| inner.running.get(s).copied())
            .collect();
    }
    for pid in sessions {
        // SAFETY: a plain syscall on a process group this fake started.
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
    json_reply(200, &json!({"success": true, "message": "Sandbox deleted"}))
}

/// `POST /sandbox/{id}/checkpoints`: copies the running sandbox's files.
fn checkpoint(shared: &Shared, id: &str) -> io::Result<Reply> {
    let mut inner = shared.lock();
    let Some(e) = inner.sandboxes.get_mut(id) else {
        return Ok(detail(404, format!("Sandbox {id} not found")));
    };
    e.advance(&shared.config);
    if e.view.status != "RUNNING" {
        return Ok(detail(409, format!("Sandbox {id} is {}", e.view.status)));
    }
    let (from, image) = (e.view.root.clone(), e.view.docker_image.clone());
    let cid = format!("ckpt_{}", random_alnum(20));
    let root = shared.base.join(&cid);
    copy_dir(&from, &root)?;
    let c = Checkpoint {
        sandbox_id: id.to_string(),
        image,
        root,
        since: Instant::now(),
        created: now_rfc3339(),
    };
    let reply = json_reply(200, &c.json(&cid, &shared.config));
    inner.checkpoints.insert(cid, c);
    Ok(reply)
}

fn batch_checkpoints(shared: &Shared, req: &Req) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(ids) = body["checkpoint_ids"].as_array() else {
        return detail(422, "checkpoint_ids is required");
    };
    let inner = shared.lock();
    let (mut found, mut errors) = (Vec::new(), Vec::new());
    for cid in ids.iter().filter_map(Value::as_str) {
        match inner.checkpoints.get(cid) {
            Some(c) => found.push(c.json(cid, &shared.config)),
            None => errors
                .push(json!({"checkpoint_id": cid, "code": "NOT_FOUND", "message": "not found"})),
        }
    }
    json_reply(200, &json!({"checkpoints": found, "errors": errors}))
}

fn delete_checkpoint(shared: &Shared, cid: &str) -> Reply {
    let mut inner = shared.lock();
    match inner.checkpoints.get(cid).map(|c| c.state(&shared.config)) {
        None => detail(404, format!("Checkpoint {cid} not found")),
        Some("PENDING") => detail(409, format!("Checkpoint {cid} is pending")),
        Some(_) => {
            if let Some(c) = inner.checkpoints.remove(cid) {
                let _ = std::fs::remove_dir_all(c.root);
            }
            json_reply(200, &json!({}))
        }
    }
}

fn new_token(inner: &mut Inner, id: &str) -> String {
    let token = format!("gwt_{}", random_hex(20));
    inner.tokens.insert(token.clone(), id.to_string());
    token
}

fn auth_json(shared: &Shared, id: &str, token: &str) -> Value {
    let expires = SystemTime::now() + Duration::from_secs(3600);
    json!({
        "gateway_url": format!("http://{}/gw", shared.addr),
        "user_ns": USER_NS,
        "job_id": id,
        "token": token,
        "expires_at": rfc3339(expires),
    })
}

fn auth(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    match inner.sandboxes.get(id).map(|e| e.view.live()) {
        None => detail(404, format!("Sandbox {id} not found")),
        Some(false) => detail(409, format!("Sandbox {id} is not running")),
        Some(true) => {
            let token = new_token(&mut inner, id);
            drop(inner);
            json_reply(200, &auth_json(shared, id, &token))
        }
    }
}

// ---------------------------------------------------------------------------------------
// The gateway
// ---------------------------------------------------------------------------------------

/// The sandbox a gateway call is for, when its token and path agree and it runs.
fn gateway_sandbox(shared: &Shared, req: &Req, job: &str) -> Result<FakeSandbox, Reply> {
    let mut inner = shared.lock();
    let owner = req.bearer().and_then(|t| inner.tokens.get(t)).cloned();
    if owner.as_deref() != Some(job) {
        return Err(connect_error(
            401,
            "unauthenticated",
            "invalid or expired token",
        ));
    }
    let e = inner
        .sandboxes
        .get_mut(job)
        .ok_or_else(|| json_reply(502, &json!({"error": "sandbox_not_found"})))?;
    e.advance(&shared.config);
    match e.view.status.as_str() {
        "RUNNING" => Ok(e.view.clone()),
        "TERMINATED" => Err(json_reply(410, &json!({"error": "sandbox_terminated"}))),
        other => Err(json_reply(
            409,
            &json!({"error": "sandbox_not_running", "status": other}),
        )),
    }
}

async fn gateway_route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let segments = req.segments();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (ns, job, rest) = match s.as_slice() {
        ["gw", ns, job, rest @ ..] => (*ns, *job, rest),
        _ => return Ok(detail(404, "no such gateway route")),
    };
    if ns != USER_NS {
        return Ok(json_reply(502, &json!({"error": "sandbox_not_found"})));
    }
    let sandbox = match gateway_sandbox(shared, req, job) {
        Ok(s) => s,
        Err(reply) => return Ok(reply),
    };
    Ok(match (&req.method, rest) {
        (&Method::POST, ["command_session.CommandSession", "Start"]) => {
            start(shared, req, &sandbox)
        }
        (&Method::POST, ["command_session.CommandSession", "SendSignal"]) => {
            send_signal(shared, req)
        }
        (&Method::POST, ["upload"]) => upload(req, &sandbox),
        (&Method::GET, ["download"]) => read(req, &sandbox, false),
        (&Method::GET, ["read-file"]) => read(req, &sandbox, true),
        _ => detail(404, format!("no gateway route {} {}", req.method, req.path)),
    })
}

/// A Connect error answered as HTTP (before a stream starts, or to a unary call).
fn connect_error(status: u16, code: &str, message: &str) -> Reply {
    json_reply(status, &json!({"code": code, "message": message}))
}

/// One `StartResponse` holding one `CommandSessionEvent` (`kind` is its oneof field).
fn event(kind: u32, body: &Writer) -> Bytes {
    let mut e = Writer::new();
    e.message(kind, body);
    let mut response = Writer::new();
    response.message(1, &e);
    connect_rpc::envelope(&response.finish())
}

/// A `StartRequest` read back: argv, envs, cwd, session uuid.
type StartArgs = (
    Vec<String>,
    BTreeMap<String, String>,
    Option<String>,
    String,
);

fn read_start(payload: &[u8]) -> Result<StartArgs, String> {
    let (mut argv, mut envs, mut cwd, mut session) =
        (Vec::new(), BTreeMap::new(), None, String::new());
    let mut request = Reader::new(payload);
    while let Some((field, value)) = request.next_field().map_err(|e| e.to_string())? {
        match field {
            1 => {
                let mut spec = Reader::new(value.as_bytes());
                while let Some((f, v)) = spec.next_field().map_err(|e| e.to_string())? {
                    match f {
                        1 => argv.insert(0, v.as_str()),
                        2 => argv.push(v.as_str()),
                        3 => {
                            let (mut key, mut val) = (String::new(), String::new());
                            let mut entry = Reader::new(v.as_bytes());
                            while let Some((ef, ev)) =
                                entry.next_field().map_err(|e| e.to_string())?
                            {
                                match ef {
                                    1 => key = ev.as_str(),
                                    2 => val = ev.as_str(),
                                    _ => {}
                                }
                            }
                            envs.insert(key, val);
                        }
                        4 => cwd = Some(v.as_str()),
                        _ => {}
                    }
                }
            }
            5 => session = value.as_str(),
            _ => {}
        }
    }
    if argv.first().is_none_or(|c| c.is_empty()) {
        return Err("command.cmd is required".into());
    }
    Ok((argv, envs, cwd, session))
}

/// The one message of a server-stream request: a whole, uncompressed envelope.
fn single_frame(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut decoder = connect_rpc::Decoder::default();
    decoder.push(body);
    match decoder.next_frame() {
        Ok(Some(frame)) if frame.flags == 0 => {
            if decoder.finish().is_err() || decoder.next_frame() != Ok(None) {
                return Err("a server-stream request holds exactly one message".into());
            }
            Ok(frame.payload.to_vec())
        }
        Ok(Some(_)) => Err("compressed or end-of-stream request messages are refused".into()),
        Ok(None) | Err(_) => Err("a truncated Connect envelope".into()),
    }
}

/// `/root` in an argument, a variable or the cwd, as the sandbox's home on the host.
fn map_home(text: &str, home: &Path) -> String {
    let home = home.to_string_lossy();
    if text == HOME {
        return home.into_owned();
    }
    text.replace("/root/", &format!("{home}/"))
}

/// `CommandSession/Start`: runs the command and streams its events.
fn start(shared: &Arc<Shared>, req: &Req, sandbox: &FakeSandbox) -> Reply {
    if !req
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/connect+proto"))
    {
        return connect_error(415, "unimplemented", "expected application/connect+proto");
    }
    let (argv, envs, cwd, session) = match single_frame(&req.body).and_then(|p| read_start(&p)) {
        Ok(parsed) => parsed,
        Err(m) => {
            return stream_reply(
                vec![connect_rpc::end_stream(Some(&connect_rpc::RpcError::new(
                    "invalid_argument",
                    m,
                )))],
                None,
            )
        }
    };
    let home = sandbox.root.join("root");
    let dir = match cwd.as_deref() {
        Some(c) => match resolve(&sandbox.root, c) {
            Ok(d) if d.is_dir() => d,
            _ => {
                return stream_reply(
                    vec![connect_rpc::end_stream(Some(&connect_rpc::RpcError::new(
                        "invalid_argument",
                        format!("cwd {c} is not a directory"),
                    )))],
                    None,
                )
            }
        },
        None => home.clone(),
    };
    let timeout = req
        .header("connect-timeout-ms")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_millis);
    let mut cmd = Command::new(map_home(&argv[0], &home));
    cmd.args(argv[1..].iter().map(|a| map_home(a, &home)))
        .current_dir(&dir)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &home)
        .env("USER", "root")
        .envs(
            sandbox
                .environment_vars
                .iter()
                .chain(envs.iter())
                .map(|(k, v)| (k.clone(), map_home(v, &home))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return stream_reply(
                vec![connect_rpc::end_stream(Some(&connect_rpc::RpcError::new(
                    "failed_precondition",
                    format!("the command could not start: {e}"),
                )))],
                None,
            )
        }
    };
    let pid = child.id().unwrap_or(0);
    {
        let mut inner = shared.lock();
        inner.running.insert(session.clone(), pid);
        inner.commands.push(FakeCommand {
            sandbox_id: sandbox.id.clone(),
            argv: argv.clone(),
            envs,
            session_uuid: session.clone(),
            exit_code: None,
        });
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(64);
    let mut started = Writer::new();
    started.uint(1, pid as u64);
    let first = event(1, &started);
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let shared = shared.clone();
    tokio::spawn(async move {
        let _ = tx.send(Ok(Frame::data(first))).await;
        let (chunks_tx, mut chunks) = mpsc::channel::<(bool, Vec<u8>)>(64);
        for (pipe, is_out) in [
            (
                out.map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                true,
            ),
            (
                err.map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                false,
            ),
        ] {
            if let Some(mut pipe) = pipe {
                let chunks_tx = chunks_tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    while let Ok(n) = pipe.read(&mut buf).await {
                        if n == 0 || chunks_tx.send((is_out, buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
        drop(chunks_tx);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut timed_out = false;
        loop {
            let limit = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                chunk = chunks.recv() => match chunk {
                    Some((is_out, bytes)) => {
                        let mut data = Writer::new();
                        data.bytes(if is_out { 1 } else { 2 }, &bytes);
                        if tx.send(Ok(Frame::data(event(2, &data)))).await.is_err() {
                            // The client went away: the command goes with it.
                            // SAFETY: a plain syscall on a process group this fake started.
                            unsafe { libc::kill(-(pid as i32), libc::SIGKILL); }
                        }
                    }
                    None => break,
                },
                _ = limit, if !timed_out => {
                    timed_out = true;
                    // SAFETY: a plain syscall on a process group this fake started.
                    unsafe { libc::kill(-(pid as i32), libc::SIGKILL); }
                }
            }
        }
        let status = child.wait().await;
        let (code, exited) = match status {
            Ok(s) => match s.code() {
                Some(c) => (c, true),
                None => (128 + s.signal().unwrap_or(9), false),
            },
            Err(_) => (255, true),
        };
        {
            let mut inner = shared.lock();
            inner.running.remove(&session);
            if let Some(c) = inner
                .commands
                .iter_mut()
                .rev()
                .find(|c| c.session_uuid == session)
            {
                c.exit_code = Some(code);
            }
        }
        if timed_out {
            let end = connect_rpc::end_stream(Some(&connect_rpc::RpcError::new(
                "deadline_exceeded",
                "the command's deadline passed",
            )));
            let _ = tx.send(Ok(Frame::data(end))).await;
            return;
        }
        let mut end = Writer::new();
        end.sint32(1, code)
            .bool(2, exited)
            .string(3, if exited { "exited" } else { "signaled" });
        let _ = tx.send(Ok(Frame::data(event(3, &end)))).await;
        let _ = tx
            .send(Ok(Frame::data(connect_rpc::end_stream(None))))
            .await;
    });
    stream_reply(Vec::new(), Some(rx))
}

/// A Connect stream: `frames` first, then whatever `rest` delivers.
fn stream_reply(
    frames: Vec<Bytes>,
    rest: Option<mpsc::Receiver<Result<Frame<Bytes>, io::Error>>>,
) -> Reply {
    let body: Body = match rest {
        Some(rx) => ChannelBody(rx).boxed(),
        None => full(frames.concat()),
    };
    Response::builder()
        .status(200)
        .header("content-type", "application/connect+proto")
        .body(body)
        .expect("a response")
}

/// `CommandSession/SendSignal` (unary): signals the session's process group.
fn send_signal(shared: &Shared, req: &Req) -> Reply {
    let mut session = String::new();
    let mut signal = 0u64;
    let mut reader = Reader::new(&req.body);
    loop {
        match reader.next_field() {
            Ok(Some((1, v))) => {
                let mut selector = Reader::new(v.as_bytes());
                while let Ok(Some((f, sv))) = selector.next_field() {
                    if f == 3 {
                        session = sv.as_str();
                    }
                }
            }
            Ok(Some((2, v))) => signal = v.as_u64(),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => return connect_error(400, "invalid_argument", &e.to_string()),
        }
    }
    let Some(pid) = shared.lock().running.get(&session).copied() else {
        return connect_error(404, "not_found", "no such running session");
    };
    // SAFETY: a plain syscall on a process group this fake started.
    unsafe {
        libc::kill(-(pid as i32), signal as i32);
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/proto")
        .body(full(Bytes::new()))
        .expect("a response")
}

fn upload(req: &Req, sandbox: &FakeSandbox) -> Reply {
    let Some(path) = req.param("path") else {
        return detail(422, "path is required");
    };
    let Some(boundary) = req
        .header("content-type")
        .filter(|c| c.starts_with("multipart/form-data"))
        .and_then(|c| c.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_string())
    else {
        return detail(422, "upload takes multipart/form-data");
    };
    let parts = multipart(&req.body, &boundary);
    let Some((_, data)) = parts.into_iter().find(|(n, _)| n == "file") else {
        return detail(422, "the file part is required");
    };
    let host = match resolve(&sandbox.root, &path) {
        Ok(h) => h,
        Err(m) => return detail(400, m),
    };
    if let Some(parent) = host.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::write(&host, &data) {
        Ok(()) => json_reply(
            200,
            &json!({"success": true, "path": path, "size": data.len(), "timestamp": now_rfc3339()}),
        ),
        Err(e) => detail(400, format!("cannot write {path}: {e}")),
    }
}

fn read(req: &Req, sandbox: &FakeSandbox, as_json: bool) -> Reply {
    let Some(path) = req.param("path") else {
        return detail(422, "path is required");
    };
    let host = match resolve(&sandbox.root, &path) {
        Ok(h) => h,
        Err(m) => return detail(400, m),
    };
    match std::fs::read(&host) {
        Ok(bytes) if as_json => json_reply(
            200,
            &json!({"content": String::from_utf8_lossy(&bytes), "size": bytes.len()}),
        ),
        Ok(bytes) => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(full(bytes))
            .expect("a response"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            detail(404, format!("File not found: {path}"))
        }
        Err(e) => detail(400, format!("cannot read {path}: {e}")),
    }
}

/// A sandbox path (absolute, or relative to `/root`) inside `root`; `..` above `/` or a
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
    let mut out = root.to_path_buf();
    let mut depth = 0usize;
    for c in full.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(format!("{path} leads outside the sandbox"));
                }
                depth -= 1;
                out.pop();
            }
            Component::Normal(s) => {
                depth += 1;
                out.push(s);
            }
            Component::Prefix(_) => return Err("a path prefix".into()),
        }
    }
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

/// The named parts of a multipart body.
fn multipart(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
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
    let mut out = Vec::new();
    for pair in positions.windows(2) {
        let part = &body[pair[0] + d.len()..pair[1]];
        let part = part.strip_prefix(b"\r\n").unwrap_or(part);
        let Some(split) = part.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let headers = String::from_utf8_lossy(&part[..split]);
        let data = &part[split + 4..];
        let data = data.strip_suffix(b"\r\n").unwrap_or(data);
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

/// FastAPI's error shape, which the SDK reads.
fn detail(status: u16, message: impl Into<String>) -> Reply {
    json_reply(status, &json!({"detail": message.into()}))
}

fn rfc3339(at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
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
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
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
