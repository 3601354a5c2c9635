//! A fake Freestyle on a real socket: the VM REST API at `FREESTYLE_API_URL`
//! (`http://127.0.0.1:PORT`, HTTP/1.1 or h2c).
//!
//! `tests/it/freestyle_fake.rs::official_js_sdk_accepts_the_fake` proves it with the official
//! npm SDK `freestyle-sandboxes` 0.1.46 (`tests/sdk/freestyle_contract.mjs`): the SDK's own
//! client creates VMs (with `additionalFiles`, `persistence`, `ports`, `idleTimeoutSeconds`),
//! reads them, lists them, runs commands, moves files, suspends, starts, stops, snapshots,
//! creates from the snapshot, forks and deletes. Paths, fields and states come from that SDK
//! (`ApiClient`, `VmsNamespace`, `Vm`, `FileSystem`, the `index.d.mts` types); where it does
//! not say (what a command sees, what a refused transition answers, timeouts) the choice is
//! noted below.
//!
//! Implemented:
//! - `Authorization: Bearer <key>` (the SDK's `apiKey`); errors are JSON `{code, message}`,
//!   `code` one of the SDK's `FREESTYLE_ERROR_CODE_MAP` with its status (`UNAUTHORIZED` 401,
//!   `VM_NOT_FOUND` 404, `VM_NOT_RUNNING` 400, `VM_IS_SUSPENDING` 409, `SNAPSHOT_NOT_FOUND`
//!   404, `FILE_NOT_FOUND` 404, `FILES_BAD_REQUEST` 400, `CREATE_VM_BAD_REQUEST` 400,
//!   `VM_LIMIT_EXCEEDED` 403, `UNAVAILABLE` 503), which the SDK's `errorFromJSON` turns into
//!   its error classes. A 429 carries `Retry-After` and no code (the SDK has none for it).
//! - VMs: `POST /v1/vms` (`additionalFiles` {path: {content, encoding}} written into the VM,
//!   `persistence.type`, `ports`, `idleTimeoutSeconds`, `waitForReadySignal` (the answer
//!   waits for `running`), `snapshotId` (must name a snapshot; the VM starts from its files);
//!   other fields the SDK sends are accepted and ignored) answering `{id, domains, consoleUrl,
//!   snapshotId}`; `GET /v1/vms` (`{vms, totalCount, runningCount, ...}`, no paging,
//!   `includeDeleted`); `GET /v1/vms/{id}` (`{id, state, vmInstanceId, ...}`);
//!   `DELETE /v1/vms/{id}` (`{id}`; afterwards 404). States: `starting` → `running`
//!   (`boot_delay`), `suspend`: `running` → `suspending` → `suspended` (`transition_delay`;
//!   again while suspending is 409), `start`: `suspended`/`stopped` → `starting` → `running`
//!   (a running VM answers at once), `stop`: → `stopped`, `kill`: → `stopped`; other
//!   transitions are 400 `VM_NOT_RUNNING`. A scripted `failed_before_running` boots into
//!   `stopped`.
//! - Exec: `POST /v1/vms/{id}/exec-await` {command, timeoutMs} answers `{stdout, stderr,
//!   statusCode}` once the command ended. Commands REALLY run: `sh -c <command>` in their own
//!   process group, cwd the VM's `/root` (a directory on the host), `HOME=/root`; the VM paths
//!   `/root`, `/etc/sandgate` and `/workspace` in the command line are mapped to the VM's
//!   directory (the only mappings there are: other absolute paths are the host's). After
//!   `timeoutMs` the group is killed and `statusCode` is `null` (Freestyle does not document
//!   it). A VM not `running` (or `starting`) answers 400 `VM_NOT_RUNNING`.
//! - Files: `GET /v1/vms/{id}/files/{filepath}` (the path one percent-encoded segment, as the
//!   SDK's `encodeURIComponent`): `{content (base64), encoding: "base64"}` for a file,
//!   `{files: [{name, kind}]}` for a directory; `PUT` `{content, encoding}` writes one (a
//!   missing parent is 400 `FILES_BAD_REQUEST`: Freestyle does not say it makes parents).
//!   Paths resolve inside the VM's directory (`..` above `/` or a symlink out is refused).
//! - Snapshots and forks: `POST /v1/vms/{id}/snapshot` {name} → `{snapshotId: "sc-…",
//!   sourceVmId}` (a copy of the VM's files), `DELETE /v1/vms/snapshots/{id}` →
//!   `{snapshot_id}`, `POST /v1/vms/{id}/fork` {count} → `{vmId, forks: [{id, domains}]}`.
//! - Test knobs: a fault [`FakeFreestyle::script`] for creates, [`FakeFreestyleConfig`], the
//!   inventory ([`FakeVm`] copies with the create body as sent), the requests seen, files.
//!
//! Deliberately not implemented: isolation (commands are the test's processes), terminals,
//! systemd, users and groups, git repos, domains and ports (recorded only), background
//! requests, idle suspension, resize, optimize, watch-files.

// Handlers answer a ready `Reply` as their error: its size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::{JoinHandle, JoinSet};

/// The VM user's home, where commands start.
pub const HOME: &str = "/root";
/// The VM paths a command line may name that are mapped to the VM's directory.
const MAPPED: &[&str] = &["/etc/sandgate", "/workspace", "/root"];
const MAX_BODY: usize = 64 << 20;

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

#[derive(Clone, Debug)]
pub struct FakeFreestyleConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` create the VM stays out of listings.
    pub appear_after: Duration,
    /// `starting` → `running` takes this long.
    pub boot_delay: Duration,
    /// `suspending` → `suspended` takes this long.
    pub transition_delay: Duration,
}

impl Default for FakeFreestyleConfig {
    fn default() -> Self {
        FakeFreestyleConfig {
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
    /// 503 `UNAVAILABLE` (Freestyle documents no capacity signal of its own).
    Capacity,
    /// 403 `VM_LIMIT_EXCEEDED`: the plan's active VM limit.
    Quota,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 502 from the edge (not JSON).
    Outage,
    /// The VM is created but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Accepted, then boots into `stopped`.
    FailedBeforeRunning,
    /// Refused (400/404) before the script.
    Rejected,
}

impl CreateOutcome {
    fn parse(name: &str) -> Option<CreateOutcome> {
        Some(match name {
            "ok" => CreateOutcome::Ok,
            "capacity" => CreateOutcome::Capacity,
            "quota" => CreateOutcome::Quota,
            "rate_limit" => CreateOutcome::RateLimit,
            "outage" => CreateOutcome::Outage,
            "timeout_after_send" => CreateOutcome::TimeoutAfterSend,
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

/// A VM as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeVm {
    pub id: String,
    /// `starting`, `running`, `suspending`, `suspended` or `stopped`.
    pub state: String,
    pub deleted: bool,
    /// The create body as sent.
    pub body: Value,
    pub snapshot_id: Option<String>,
    /// The VM's `/` on the host.
    pub root: PathBuf,
    pub outcome: CreateOutcome,
}

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

/// One command the fake ran.
#[derive(Clone, Debug)]
pub struct FakeExec {
    pub vm_id: String,
    pub command: String,
    pub status_code: Option<i32>,
}

pub struct FakeFreestyle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeFreestyle {
    pub async fn start(config: FakeFreestyleConfig) -> FakeFreestyle {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake Freestyle");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            api_key: format!("fs_fake_{}", random_alnum(24)),
            base,
            inner: Mutex::default(),
        });
        let tasks = vec![tokio::spawn(accept(listener, shared.clone()))];
        FakeFreestyle {
            shared,
            addr,
            tasks,
            _dir: dir,
        }
    }

    /// `http://127.0.0.1:PORT`: the SDK's `baseUrl` / `FREESTYLE_API_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `capacity`, `quota`,
    /// `rate_limit`, `outage`, `timeout_after_send`, `failed_before_running`. Panics on
    /// another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Freestyle has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every create attempt's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn vm(&self, id: &str) -> Option<FakeVm> {
        let mut inner = self.shared.lock();
        let config = self.shared.config.clone();
        let e = inner.vms.get_mut(id)?;
        e.advance(&config);
        Some(e.view.clone())
    }

    /// Every VM ever made, deleted ones included, in creation order.
    pub fn vms(&self) -> Vec<FakeVm> {
        let order = self.shared.lock().order.clone();
        order.iter().filter_map(|id| self.vm(id)).collect()
    }

    /// VMs not deleted.
    pub fn live(&self) -> Vec<FakeVm> {
        self.vms().into_iter().filter(|v| !v.deleted).collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn execs(&self) -> Vec<FakeExec> {
        self.shared.lock().execs.clone()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }

    /// A file in a VM (an absolute VM path).
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.vm(id)?.root;
        std::fs::read(resolve(&root, path).ok()?).ok()
    }
}

impl Drop for FakeFreestyle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Shared {
    config: FakeFreestyleConfig,
    api_key: String,
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
    vms: HashMap<String, Entry>,
    order: Vec<String>,
    /// Snapshot id → its copy of the files.
    snapshots: HashMap<String, PathBuf>,
    execs: Vec<FakeExec>,
    seen: Vec<SeenRequest>,
}

struct Entry {
    view: FakeVm,
    since: Instant,
    fails: bool,
    hidden_until: Option<Instant>,
}

impl Entry {
    fn set(&mut self, state: &str) {
        self.view.state = state.to_string();
        self.since = Instant::now();
    }

    fn advance(&mut self, config: &FakeFreestyleConfig) {
        let elapsed = self.since.elapsed();
        match self.view.state.as_str() {
            "starting" if elapsed >= config.boot_delay => {
                let next = if self.fails { "stopped" } else { "running" };
                self.fails = false;
                self.set(next);
            }
            "suspending" if elapsed >= config.transition_delay => self.set("suspended"),
            _ => {}
        }
    }

    fn hidden(&self) -> bool {
        self.hidden_until.is_some_and(|t| Instant::now() < t)
    }
}

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
            Ok(_) => Err(error(400, "BAD_REQUEST", "the body must be a JSON object")),
            Err(e) => Err(error(400, "BAD_REQUEST", format!("invalid JSON body: {e}"))),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(error(413, "BAD_REQUEST", "the body is too large or broken")),
    };
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let result = route(&shared, &req).await;
    shared.lock().seen.push(SeenRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
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
        return Ok(error(401, "UNAUTHORIZED", "Unauthorized"));
    }
    let segments = req.segments();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let m = &req.method;
    Ok(match (m, s.as_slice()) {
        (&Method::POST, ["v1", "vms"]) => return create(shared, req).await,
        (&Method::GET, ["v1", "vms"]) => list(shared, req),
        (&Method::DELETE, ["v1", "vms", "snapshots", id]) => delete_snapshot(shared, id),
        (&Method::GET, ["v1", "vms", id]) => vm_reply(shared, id),
        (&Method::DELETE, ["v1", "vms", id]) => delete(shared, id),
        (&Method::POST, ["v1", "vms", id, "suspend"]) => suspend(shared, id),
        (&Method::POST, ["v1", "vms", id, "start"]) => start(shared, id).await,
        (&Method::POST, ["v1", "vms", id, "stop"]) => stop(shared, id, "stop"),
        (&Method::POST, ["v1", "vms", id, "kill"]) => stop(shared, id, "kill"),
        (&Method::POST, ["v1", "vms", id, "exec-await"]) => exec(shared, req, id).await,
        (&Method::POST, ["v1", "vms", id, "snapshot"]) => snapshot(shared, id),
        (&Method::POST, ["v1", "vms", id, "fork"]) => fork(shared, req, id),
        (&Method::GET, ["v1", "vms", id, "files", path]) => read_file(shared, id, path),
        (&Method::PUT, ["v1", "vms", id, "files", path]) => write_file(shared, req, id, path),
        _ => error(
            404,
            "NOT_FOUND",
            format!("no route {} {}", req.method, req.path),
        ),
    })
}

// ------------------------------------------------------------------------------------ VMs

fn vm_json(e: &Entry) -> Value {
    json!({
        "id": e.view.id,
        "vmInstanceId": format!("{}-i", e.view.id),
        "state": e.view.state,
        "lastNetworkActivity": null,
        "cpuTimeSeconds": 0,
    })
}

/// The VM (advanced to now), or 404 `VM_NOT_FOUND`.
fn with_vm<T>(shared: &Shared, id: &str, f: impl FnOnce(&mut Entry) -> T) -> Result<T, Reply> {
    let mut inner = shared.lock();
    match inner.vms.get_mut(id).filter(|e| !e.view.deleted) {
        Some(e) => {
            e.advance(&shared.config);
            Ok(f(e))
        }
        None => Err(error(404, "VM_NOT_FOUND", format!("VM not found: {id}"))),
    }
}

fn vm_reply(shared: &Shared, id: &str) -> Reply {
    match with_vm(shared, id, |e| vm_json(e)) {
        Ok(v) => json_reply(200, &v),
        Err(r) => r,
    }
}

fn list(shared: &Shared, req: &Req) -> Reply {
    let deleted_too = req
        .query
        .as_deref()
        .unwrap_or("")
        .contains("includeDeleted=true");
    let mut inner = shared.lock();
    let order = inner.order.clone();
    let mut vms = Vec::new();
    for id in order {
        let e = inner.vms.get_mut(&id).expect("an ordered VM");
        e.advance(&shared.config);
        if e.hidden() || (e.view.deleted && !deleted_too) {
            continue;
        }
        vms.push(json!({
            "id": e.view.id,
            "state": e.view.state,
            "deleted": e.view.deleted,
            "snapshotId": e.view.snapshot_id,
            "persistence": e.view.body.get("persistence"),
            "createdDeclaratively": false,
        }));
    }
    let count = |state: &str| vms.iter().filter(|v| v["state"] == state).count();
    json_reply(
        200,
        &json!({
            "totalCount": vms.len(),
            "runningCount": count("running"),
            "startingCount": count("starting"),
            "suspendedCount": count("suspended"),
            "stoppedCount": count("stopped"),
            "vms": vms,
        }),
    )
}

/// `additionalFiles` as (path, bytes), or the 400.
fn additional_files(body: &Value) -> Result<Vec<(String, Vec<u8>)>, Reply> {
    let bad = |m: String| error(400, "CREATE_VM_BAD_REQUEST", format!("Bad request: {m}"));
    let mut out = Vec::new();
    let Some(files) = body.get("additionalFiles").filter(|v| !v.is_null()) else {
        return Ok(out);
    };
    let files = files
        .as_object()
        .ok_or_else(|| bad("additionalFiles must be an object".into()))?;
    for (path, file) in files {
        let content = file["content"]
            .as_str()
            .ok_or_else(|| bad(format!("additionalFiles.{path}.content is required")))?;
        let data = match file["encoding"].as_str() {
            None | Some("utf-8") | Some("utf8") => content.as_bytes().to_vec(),
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(content)
                .map_err(|_| bad(format!("additionalFiles.{path} is not base64")))?,
            Some(other) => return Err(bad(format!("unknown encoding {other}"))),
        };
        if !path.starts_with('/') {
            return Err(bad(format!("additionalFiles path {path} must be absolute")));
        }
        out.push((path.clone(), data));
    }
    Ok(out)
}

fn check_create(body: &Value) -> Result<(), Reply> {
    let bad = |m: &str| error(400, "CREATE_VM_BAD_REQUEST", format!("Bad request: {m}"));
    if let Some(p) = body.get("persistence").filter(|v| !v.is_null()) {
        let known = ["sticky", "ephemeral", "persistent"];
        if !p["type"].as_str().is_some_and(|t| known.contains(&t)) {
            return Err(bad(
                "persistence.type must be sticky, ephemeral or persistent",
            ));
        }
    }
    if let Some(ports) = body.get("ports").filter(|v| !v.is_null()) {
        let ok = ports.as_array().is_some_and(|a| {
            a.iter()
                .all(|p| p["port"].is_u64() && p["targetPort"].is_u64())
        });
        if !ok {
            return Err(bad("ports must be [{port, targetPort}]"));
        }
    }
    for field in ["idleTimeoutSeconds", "readySignalTimeoutSeconds"] {
        if body.get(field).is_some_and(|v| !v.is_null() && !v.is_u64()) {
            return Err(bad(&format!("{field} must be a number of seconds")));
        }
    }
    Ok(())
}

fn reject(shared: &Shared, reply: Reply) -> Result<Reply, io::Error> {
    shared.lock().create_log.push(CreateOutcome::Rejected);
    Ok(reply)
}

async fn create(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return reject(shared, r),
    };
    let files = match check_create(&body).and_then(|_| additional_files(&body)) {
        Ok(f) => f,
        Err(r) => return reject(shared, r),
    };
    let snapshot_id = body["snapshotId"].as_str().map(str::to_string);
    let from = match &snapshot_id {
        Some(sid) => match snapshot_root(shared, sid) {
            Some(root) => Some(root),
            None => {
                let r = error(
                    404,
                    "SNAPSHOT_NOT_FOUND",
                    format!("Snapshot not found: {sid}"),
                );
                return reject(shared, r);
            }
        },
        None => None,
    };
    let outcome = {
        let mut inner = shared.lock();
        let outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        outcome
    };
    if let Some(reply) = refusal(shared, outcome) {
        return Ok(reply);
    }
    let id = random_alnum(20);
    let root = shared.base.join(&id);
    match &from {
        Some(from) => copy_dir(from, &root)?,
        None => std::fs::create_dir_all(&root)?,
    }
    std::fs::create_dir_all(root.join("root"))?;
    for (path, data) in files {
        let target = resolve(&root, &path).map_err(io::Error::other)?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(target, data)?;
    }
    add_vm(
        shared,
        &id,
        root,
        body.clone(),
        snapshot_id.clone(),
        outcome,
    );
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    if body["waitForReadySignal"] == json!(true) {
        wait_settled(shared, &id).await;
    }
    Ok(json_reply(
        200,
        &json!({"id": id, "domains": [format!("{id}.vm.freestyle.sh")], "consoleUrl": null, "snapshotId": snapshot_id}),
    ))
}

/// A snapshot's copy of the files (the lock is released before the caller goes on).
fn snapshot_root(shared: &Shared, sid: &str) -> Option<PathBuf> {
    shared.lock().snapshots.get(sid).cloned()
}

/// The scripted refusals of a create.
fn refusal(shared: &Shared, outcome: CreateOutcome) -> Option<Reply> {
    Some(match outcome {
        CreateOutcome::Capacity => error(503, "UNAVAILABLE", "no capacity for this VM"),
        CreateOutcome::Quota => error(
            403,
            "VM_LIMIT_EXCEEDED",
            "VM limit exceeded: your plan allows 1 active VMs, you currently have 1",
        ),
        CreateOutcome::RateLimit => {
            let mut reply = json_reply(429, &json!({"message": "Too many requests"}));
            let after = shared.config.retry_after_secs.to_string();
            reply
                .headers_mut()
                .insert("retry-after", after.parse().expect("a header value"));
            reply
        }
        CreateOutcome::Outage => Response::builder()
            .status(502)
            .header("content-type", "text/html")
            .body(full("<html>502 Bad Gateway</html>"))
            .expect("a response"),
        _ => return None,
    })
}

fn add_vm(
    shared: &Shared,
    id: &str,
    root: PathBuf,
    body: Value,
    snapshot_id: Option<String>,
    outcome: CreateOutcome,
) {
    let hidden_until = (outcome == CreateOutcome::TimeoutAfterSend
        && !shared.config.appear_after.is_zero())
    .then(|| Instant::now() + shared.config.appear_after);
    let entry = Entry {
        view: FakeVm {
            id: id.to_string(),
            state: "starting".into(),
            deleted: false,
            body,
            snapshot_id,
            root,
            outcome,
        },
        since: Instant::now(),
        fails: outcome == CreateOutcome::FailedBeforeRunning,
        hidden_until,
    };
    let mut inner = shared.lock();
    inner.vms.insert(id.to_string(), entry);
    inner.order.push(id.to_string());
}

/// Waits (bounded) until the VM is no longer `starting`.
async fn wait_settled(shared: &Shared, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let state = with_vm(shared, id, |e| e.view.state.clone()).unwrap_or_default();
        if state != "starting" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn delete(shared: &Shared, id: &str) -> Reply {
    match with_vm(shared, id, |e| {
        e.view.deleted = true;
        e.set("stopped");
    }) {
        Ok(()) => json_reply(200, &json!({"id": id})),
        Err(r) => r,
    }
}

fn not_running(id: &str) -> Reply {
    error(400, "VM_NOT_RUNNING", format!("VM is not running: {id}"))
}

fn suspend(shared: &Shared, id: &str) -> Reply {
    let result = with_vm(shared, id, |e| match e.view.state.as_str() {
        "running" => {
            e.set("suspending");
            Ok(
                json!({"id": id, "vmInstanceId": format!("{id}-i"), "snapshotLayerId": format!("sl-{id}")}),
            )
        }
        "suspending" => Err(error(
            409,
            "VM_IS_SUSPENDING",
            "VM is currently being suspended",
        )),
        _ => Err(not_running(id)),
    });
    match result {
        Ok(Ok(v)) => json_reply(200, &v),
        Ok(Err(r)) | Err(r) => r,
    }
}

async fn start(shared: &Shared, id: &str) -> Reply {
    let result = with_vm(shared, id, |e| match e.view.state.as_str() {
        "suspended" | "stopped" => {
            e.set("starting");
            Ok(())
        }
        "running" | "starting" => Ok(()),
        _ => Err(error(
            409,
            "VM_IS_SUSPENDING",
            "VM is currently being suspended",
        )),
    });
    match result {
        Ok(Ok(())) => {
            wait_settled(shared, id).await;
            json_reply(200, &json!({"id": id, "domains": [], "console_url": null}))
        }
        Ok(Err(r)) | Err(r) => r,
    }
}

fn stop(shared: &Shared, id: &str, verb: &str) -> Reply {
    match with_vm(shared, id, |e| e.set("stopped")) {
        Ok(()) if verb == "kill" => json_reply(200, &json!({"id": id})),
        Ok(()) => json_reply(200, &json!({"vmId": id, "vmInstanceId": format!("{id}-i")})),
        Err(r) => r,
    }
}

/// The VM's directory when it is running (or starting), else the 400.
fn running_root(shared: &Shared, id: &str) -> Result<PathBuf, Reply> {
    let (state, root) = with_vm(shared, id, |e| (e.view.state.clone(), e.view.root.clone()))?;
    match state.as_str() {
        "running" | "starting" => Ok(root),
        _ => Err(not_running(id)),
    }
}

fn snapshot(shared: &Shared, id: &str) -> Reply {
    let root = match with_vm(shared, id, |e| e.view.root.clone()) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let sid = format!("sc-{}", random_alnum(20));
    let copy = shared.base.join(&sid);
    if let Err(e) = copy_dir(&root, &copy) {
        return error(500, "INTERNAL_ERROR", format!("Internal error: {e}"));
    }
    shared.lock().snapshots.insert(sid.clone(), copy);
    json_reply(
        200,
        &json!({"snapshotId": sid, "sourceVmId": id, "sourceVmInstanceId": format!("{id}-i")}),
    )
}

fn delete_snapshot(shared: &Shared, sid: &str) -> Reply {
    let removed = shared.lock().snapshots.remove(sid);
    match removed {
        Some(_) => json_reply(200, &json!({"snapshot_id": sid})),
        None => error(
            404,
            "SNAPSHOT_NOT_FOUND",
            format!("Snapshot not found: {sid}"),
        ),
    }
}

fn fork(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let count = body["count"].as_u64().unwrap_or(1).clamp(1, 10);
    let (root, vm_body) = match with_vm(shared, id, |e| (e.view.root.clone(), e.view.body.clone()))
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut forks = Vec::new();
    for _ in 0..count {
        let fid = random_alnum(20);
        let froot = shared.base.join(&fid);
        if let Err(e) = copy_dir(&root, &froot) {
            return error(500, "INTERNAL_ERROR", format!("Internal error: {e}"));
        }
        add_vm(
            shared,
            &fid,
            froot,
            vm_body.clone(),
            None,
            CreateOutcome::Ok,
        );
        let _ = with_vm(shared, &fid, |e| e.set("running"));
        forks.push(json!({"id": fid, "domains": [], "consoleUrl": null}));
    }
    json_reply(200, &json!({"vmId": id, "forks": forks}))
}

// ------------------------------------------------------------------------------- exec

/// The command line with each mapped VM path (at a word's start) replaced by the host's, in
/// one pass, so a replacement is never mapped again.
fn map_paths(text: &str, root: &Path) -> String {
    let mut out = String::new();
    let mut rest = text;
    'scan: while let Some(c) = rest.chars().next() {
        let at_start = out.is_empty() || out.ends_with([' ', '\'', '"', '=', ';', ':']);
        if at_start {
            for prefix in MAPPED {
                if rest.starts_with(prefix) {
                    out.push_str(&root.join(&prefix[1..]).to_string_lossy());
                    rest = &rest[prefix.len()..];
                    continue 'scan;
                }
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

async fn exec(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(command) = body["command"].as_str().map(str::to_string) else {
        return error(400, "BAD_REQUEST", "Bad request: command is required");
    };
    let root = match running_root(shared, id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let limit = body["timeoutMs"].as_u64().map(Duration::from_millis);
    let (stdout, stderr, code) = match run_command(&root, &command, limit).await {
        Ok(done) => done,
        Err(e) => return error(500, "INTERNAL_ERROR", format!("Internal error: {e}")),
    };
    shared.lock().execs.push(FakeExec {
        vm_id: id.to_string(),
        command,
        status_code: code,
    });
    json_reply(
        200,
        &json!({
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "statusCode": code,
        }),
    )
}

/// Runs `sh -c` in the VM's directory: (stdout, stderr, exit code or `None` when killed
/// after `limit`).
async fn run_command(
    root: &Path,
    command: &str,
    limit: Option<Duration>,
) -> io::Result<(Vec<u8>, Vec<u8>, Option<i32>)> {
    let home = root.join("root");
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(map_paths(command, root))
        .current_dir(&home)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", &home)
        .env("USER", "root")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id();
    let waited = match limit {
        Some(limit) => tokio::time::timeout(limit, child.wait_with_output()).await,
        None => Ok(child.wait_with_output().await),
    };
    match waited {
        Ok(out) => {
            let out = out?;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(9));
            Ok((out.stdout, out.stderr, Some(code)))
        }
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: a plain syscall on a process group this fake started.
                unsafe {
                    libc::kill(-(pid as i32), libc::SIGKILL);
                }
            }
            Ok((Vec::new(), Vec::new(), None))
        }
    }
}

// ------------------------------------------------------------------------------ files

/// A VM path inside the VM's directory (`..` above `/` or a symlink out is refused).
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
                    return Err(format!("{path} leads outside the VM"));
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
    let mut probe = out.clone();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if let Ok(real) = probe.canonicalize() {
        if !real.starts_with(root) {
            return Err(format!("{path} leads outside the VM"));
        }
    }
    Ok(out)
}

fn read_file(shared: &Shared, id: &str, path: &str) -> Reply {
    let root = match running_root(shared, id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let target = match resolve(&root, path) {
        Ok(t) => t,
        Err(m) => return error(400, "FILES_BAD_REQUEST", format!("Bad request: {m}")),
    };
    if target.is_dir() {
        let mut files: Vec<Value> = std::fs::read_dir(&target)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| {
                        let dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                        json!({
                            "name": e.file_name().to_string_lossy(),
                            "kind": if dir { "directory" } else { "file" },
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        files.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        return json_reply(200, &json!({"files": files}));
    }
    match std::fs::read(&target) {
        Ok(data) => json_reply(
            200,
            &json!({
                "content": base64::engine::general_purpose::STANDARD.encode(data),
                "encoding": "base64",
            }),
        ),
        Err(_) => error(404, "FILE_NOT_FOUND", format!("File not found: {path}")),
    }
}

fn write_file(shared: &Shared, req: &Req, id: &str, path: &str) -> Reply {
    let bad = |m: String| error(400, "FILES_BAD_REQUEST", format!("Bad request: {m}"));
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    let root = match running_root(shared, id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(content) = body["content"].as_str() else {
        return bad("content is required".into());
    };
    let data = match body["encoding"].as_str() {
        None | Some("utf8") => content.as_bytes().to_vec(),
        Some("base64") => match base64::engine::general_purpose::STANDARD.decode(content) {
            Ok(d) => d,
            Err(_) => return bad("content is not base64".into()),
        },
        Some(other) => return bad(format!("unknown encoding {other}")),
    };
    let target = match resolve(&root, path) {
        Ok(t) => t,
        Err(m) => return bad(m),
    };
    if !target.parent().is_some_and(Path::is_dir) {
        return bad(format!("the parent directory of {path} does not exist"));
    }
    match std::fs::write(&target, data) {
        Ok(()) => json_reply(200, &json!({})),
        Err(e) => bad(format!("{path}: {e}")),
    }
}

// ---------------------------------------------------------------------------- helpers

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

/// Freestyle's error body, `{code, message}` (what the SDK's `errorFromJSON` reads).
fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
    json_reply(status, &json!({"code": code, "message": message.into()}))
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

/// Freestyle's VM ids: 20 lowercase alphanumeric characters.
fn random_alnum(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    bytes
        .iter()
        .take(len)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}
