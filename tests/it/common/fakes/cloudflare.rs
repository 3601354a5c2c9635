//! A fake of sandgate's Cloudflare bridge Worker (`deploy/cloudflare`, whose `src/api.ts` is the
//! contract) on a real socket, for the Cloudflare adapter's tests.
//!
//! - Bearer auth (401 `unauthorized` otherwise); every error body is `{"error": {code, message}}`.
//! - `POST /v1/sandbox` {id, labels, env, outbound, sleepAfterSeconds?}: 201 the new sandbox
//!   (`running`), 200 the existing one for an id with the same labels, 409 `conflict` with
//!   others, 400 `invalid_request` for a body that is not a `CreateSandboxRequest`.
//!   `GET /v1/sandbox/{id}` (404 `not_found`), `GET /v1/sandbox?label=k=v...` (the inventory,
//!   filtered), `DELETE /v1/sandbox/{id}` (204, also when absent).
//! - `POST /v1/sandbox/{id}/exec` {command, cwd?, env?, timeoutMs?}: the command REALLY runs
//!   (`sh -c`) in the sandbox's directory on the host with its env; the answer is SSE: its
//!   stdout, then its stderr, then `exit`. The sandbox's `/` is a host directory: every
//!   `/etc/sandgate` and `/workspace` in a command line or cwd is mapped into it (the only
//!   mapping there is: other absolute paths are the host's).
//! - `GET|PUT /v1/sandbox/{id}/file/<path>`: raw bytes under the sandbox's directory (parents
//!   made on write; `..` refused; 404 `file_not_found`).
//! - Faults by script for the next creates: `capacity` (503, `Retry-After: 5`, nothing made),
//!   `rate_limit` (429, `Retry-After: 2`), `outage` (502 from "the edge", no code), `internal`
//!   (500 after the sandbox was made), `timeout_after_send` (the sandbox is made, the answer
//!   never comes).
//! - A container start that takes time ([`FakeCloudflareConfig::start_delay`], none by
//!   default): the sandbox is recorded `creating` at once (the bridge records it before the
//!   container exists) and reads `running` once the delay has passed, whether or not the
//!   create's caller is still waiting; the create answers when it runs.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// The sandbox directories the fake maps into each sandbox's host directory.
const MAPPED: &[&str] = &["/etc/sandgate", "/workspace"];

#[derive(Debug, Clone)]
pub struct FakeSandbox {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub outbound: Value,
    pub root: PathBuf,
    /// When its container has started (`creating` until then, `running` after).
    pub ready_at: Instant,
}

impl FakeSandbox {
    /// The bridge's `SandboxState`: `creating` until the container has started, then
    /// `running`.
    pub fn state(&self) -> &'static str {
        if Instant::now() >= self.ready_at {
            "running"
        } else {
            "creating"
        }
    }
}

/// The fake's knobs.
#[derive(Debug, Clone, Default)]
pub struct FakeCloudflareConfig {
    /// How long a new sandbox's container takes to start (the create answers after it).
    pub start_delay: Duration,
}

#[derive(Default)]
struct Inner {
    sandboxes: BTreeMap<String, FakeSandbox>,
    script: VecDeque<String>,
    creates: usize,
    create_bodies: Vec<Value>,
}

struct Shared {
    config: FakeCloudflareConfig,
    token: String,
    base: PathBuf,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct FakeCloudflare {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for FakeCloudflare {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: u16, body: Value) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn error(status: u16, code: &str, message: &str) -> Reply {
    reply(status, json!({"error": {"code": code, "message": message}}))
}

fn info(s: &FakeSandbox) -> Value {
    json!({
        "id": s.id,
        "state": s.state(),
        "labels": s.labels,
        "envKeys": s.env.keys().collect::<Vec<_>>(),
        "outbound": s.outbound,
        "createdAt": "2026-12-05T00:00:00.000Z",
    })
}

impl FakeCloudflare {
    pub async fn start() -> FakeCloudflare {
        FakeCloudflare::start_with(FakeCloudflareConfig::default()).await
    }

    pub async fn start_with(config: FakeCloudflareConfig) -> FakeCloudflare {
        let dir = tempfile::tempdir().expect("a temporary directory for the fake bridge");
        let base = dir.path().canonicalize().expect("the fake's directory");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            token: "bridge-token-fake-0123456789".to_string(),
            base,
            inner: Mutex::default(),
        });
        let accept_shared = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeCloudflare {
            shared,
            addr,
            task,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Faults for the next creates, in order (then none).
    pub fn script<'a>(&self, faults: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for f in faults {
            assert!(
                [
                    "capacity",
                    "rate_limit",
                    "outage",
                    "internal",
                    "timeout_after_send"
                ]
                .contains(&f),
                "the fake bridge has no fault {f:?}"
            );
            inner.script.push_back(f.to_string());
        }
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.shared.lock().sandboxes.get(id).cloned()
    }

    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        self.shared.lock().sandboxes.values().cloned().collect()
    }

    /// Sandboxes not deleted (a delete removes a sandbox from the bridge's index), creating
    /// or running.
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    /// Live sandboxes carrying the label `key=value`.
    pub fn live_with_label(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        self.live()
            .into_iter()
            .filter(|s| s.labels.get(key).map(String::as_str) == Some(value))
            .collect()
    }

    /// The JSON bodies of the creates that reached the fake, in order.
    pub fn create_bodies(&self) -> Vec<Value> {
        self.shared.lock().create_bodies.clone()
    }

    /// How many create requests reached the fake.
    pub fn creates(&self) -> usize {
        self.shared.lock().creates
    }

    /// A file in a sandbox, by its path inside the sandbox.
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.sandbox(id)?.root;
        std::fs::read(inside(&root, path)?).ok()
    }

    /// Every file under a sandbox's directory, as (path inside, bytes).
    pub fn files(&self, id: &str) -> Vec<(String, Vec<u8>)> {
        let Some(s) = self.sandbox(id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut stack = vec![s.root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(bytes) = std::fs::read(&path) {
                    let rel = path.strip_prefix(&s.root).unwrap().to_string_lossy();
                    out.push((format!("/{rel}"), bytes));
                }
            }
        }
        out
    }
}

/// A sandbox path as a host path under `root`; `None` for `..` or a relative path.
fn inside(root: &Path, path: &str) -> Option<PathBuf> {
    let rest = path.strip_prefix('/')?;
    if rest.split('/').any(|s| s == "..") || rest.is_empty() {
        return None;
    }
    Some(root.join(rest))
}

fn map_paths(text: &str, root: &Path) -> String {
    let mut out = text.to_string();
    for dir in MAPPED {
        out = out.replace(dir, &root.join(&dir[1..]).to_string_lossy());
    }
    out
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {}", shared.token));
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if !authorized {
        return Ok(error(401, "unauthorized", "missing or wrong bearer token"));
    }
    let parts: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    if parts.len() < 2 || parts[0] != "v1" || parts[1] != "sandbox" {
        return Ok(error(404, "not_found", "no such route"));
    }
    let id = parts.get(2).cloned();
    let op = parts.get(3).map(String::as_str);
    Ok(match (&method, id, op) {
        (&Method::POST, None, _) => create(&shared, &body).await,
        (&Method::GET, None, _) => list(&shared, &query),
        (&Method::GET, Some(id), None) => describe(&shared, &id),
        (&Method::DELETE, Some(id), None) => delete(&shared, &id),
        (&Method::POST, Some(id), Some("exec")) => exec(&shared, &id, &body).await,
        (&Method::GET | &Method::PUT, Some(id), Some("file")) => {
            file(&shared, &method, &id, &parts[4..].join("/"), body)
        }
        _ => error(405, "invalid_request", "not served here"),
    })
}

/// Records a new sandbox (its answer), or answers an existing id (200 or 409).
fn insert(
    shared: &Shared,
    id: String,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    outbound: Value,
) -> Result<Value, Box<Reply>> {
    let mut inner = shared.lock();
    if let Some(existing) = inner.sandboxes.get(&id) {
        return Err(Box::new(if existing.labels == labels {
            reply(200, info(existing))
        } else {
            error(
                409,
                "conflict",
                "a sandbox with this id exists with other labels",
            )
        }));
    }
    let root = shared.base.join(&id);
    std::fs::create_dir_all(root.join("workspace")).expect("the sandbox's directory");
    let sandbox = FakeSandbox {
        id: id.clone(),
        labels,
        env,
        outbound,
        root,
        ready_at: Instant::now() + shared.config.start_delay,
    };
    let answer = info(&sandbox);
    inner.sandboxes.insert(id, sandbox);
    Ok(answer)
}

fn find(shared: &Shared, id: &str) -> Option<FakeSandbox> {
    shared.lock().sandboxes.get(id).cloned()
}

fn describe(shared: &Shared, id: &str) -> Reply {
    match shared.lock().sandboxes.get(id) {
        Some(s) => reply(200, info(s)),
        None => error(404, "not_found", "no such sandbox"),
    }
}

fn delete(shared: &Shared, id: &str) -> Reply {
    let removed = shared.lock().sandboxes.remove(id);
    if let Some(s) = removed {
        let _ = std::fs::remove_dir_all(&s.root);
    }
    Response::builder()
        .status(204)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn string_map(v: &Value) -> Option<BTreeMap<String, String>> {
    v.as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

async fn create(shared: &Shared, body: &[u8]) -> Reply {
    let fault = {
        let mut inner = shared.lock();
        inner.creates += 1;
        if let Ok(b) = serde_json::from_slice::<Value>(body) {
            inner.create_bodies.push(b);
        }
        inner.script.pop_front()
    };
    match fault.as_deref() {
        Some("capacity") => {
            let mut r = error(503, "capacity", "no container could be placed");
            r.headers_mut().insert("retry-after", "5".parse().unwrap());
            return r;
        }
        Some("rate_limit") => {
            let mut r = error(429, "rate_limited", "slow down");
            r.headers_mut().insert("retry-after", "2".parse().unwrap());
            return r;
        }
        Some("outage") => {
            return Response::builder()
                .status(502)
                .body(Full::new(Bytes::from("bad gateway")))
                .unwrap()
        }
        _ => {}
    }
    let Ok(b) = serde_json::from_slice::<Value>(body) else {
        return error(400, "invalid_request", "body is not JSON");
    };
    let id = b["id"].as_str().unwrap_or_default().to_string();
    let valid_id = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    let outbound = &b["outbound"];
    let (Some(labels), Some(env)) = (string_map(&b["labels"]), string_map(&b["env"])) else {
        return error(
            400,
            "invalid_request",
            "labels and env must map strings to strings",
        );
    };
    let outbound_ok = outbound["enableInternet"].is_boolean()
        && outbound["allowedHosts"]
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string));
    if !valid_id || !outbound_ok {
        return error(400, "invalid_request", "body is not a CreateSandboxRequest");
    }
    let answer = match insert(shared, id.clone(), labels, env, outbound.clone()) {
        Ok(answer) => answer,
        Err(reply) => return *reply,
    };
    // The container starts (on its own: the caller going away does not stop it); the
    // answer waits for it, as the bridge's does.
    let ready_at = find(shared, &id).map(|s| s.ready_at);
    if let Some(wait) = ready_at.and_then(|t| t.checked_duration_since(Instant::now())) {
        tokio::time::sleep(wait).await;
    }
    let answer = find(shared, &id).map(|s| info(&s)).unwrap_or(answer);
    match fault.as_deref() {
        Some("internal") => error(500, "internal", "the Durable Object failed after creating"),
        Some("timeout_after_send") => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            reply(201, answer)
        }
        _ => reply(201, answer),
    }
}

fn list(shared: &Shared, query: &str) -> Reply {
    let mut wanted = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if k == "label" {
            match v.split_once('=') {
                Some((k, v)) if !k.is_empty() => wanted.push((k.to_string(), v.to_string())),
                _ => return error(400, "invalid_request", "label must be key=value"),
            }
        }
    }
    let inner = shared.lock();
    let found: Vec<Value> = inner
        .sandboxes
        .values()
        .filter(|s| wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(info)
        .collect();
    reply(200, json!({"sandboxes": found}))
}

fn sse(event: Value) -> String {
    format!(
        "event: {}\ndata: {event}\n\n",
        event["type"].as_str().unwrap()
    )
}

async fn exec(shared: &Shared, id: &str, body: &[u8]) -> Reply {
    let Some(sandbox) = find(shared, id) else {
        return error(404, "not_found", "no such sandbox");
    };
    let Ok(b) = serde_json::from_slice::<Value>(body) else {
        return error(400, "invalid_request", "body is not JSON");
    };
    let Some(command) = b["command"].as_str() else {
        return error(400, "invalid_request", "body is not an ExecRequest");
    };
    let cwd = b["cwd"].as_str().unwrap_or("/workspace");
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(map_paths(command, &sandbox.root))
        .current_dir(map_paths(cwd, &sandbox.root))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(&sandbox.env)
        .envs(string_map(&b["env"]).unwrap_or_default())
        .kill_on_drop(true);
    let out = match cmd.output().await {
        Ok(out) => out,
        Err(e) => return error(500, "internal", &format!("cannot run: {e}")),
    };
    let mut text = String::new();
    if !out.stdout.is_empty() {
        text += &sse(json!({"type": "stdout", "data": String::from_utf8_lossy(&out.stdout)}));
    }
    if !out.stderr.is_empty() {
        text += &sse(json!({"type": "stderr", "data": String::from_utf8_lossy(&out.stderr)}));
    }
    use std::os::unix::process::ExitStatusExt;
    let code = out
        .status
        .code()
        .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
    text += &sse(json!({"type": "exit", "exitCode": code}));
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Full::new(Bytes::from(text)))
        .unwrap()
}

fn file(shared: &Shared, method: &Method, id: &str, path: &str, body: Bytes) -> Reply {
    let Some(sandbox) = find(shared, id) else {
        return error(404, "not_found", "no such sandbox");
    };
    let Some(host) = inside(&sandbox.root, &format!("/{path}")) else {
        return error(
            400,
            "invalid_request",
            "the file path must be absolute, without '..'",
        );
    };
    if method == Method::PUT {
        if let Some(parent) = host.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        return match std::fs::write(&host, &body) {
            Ok(()) => Response::builder()
                .status(204)
                .body(Full::new(Bytes::new()))
                .unwrap(),
            Err(e) => error(500, "internal", &e.to_string()),
        };
    }
    match std::fs::read(&host) {
        Ok(bytes) => Response::builder()
            .status(200)
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap(),
        Err(_) => error(404, "file_not_found", "no such file"),
    }
}
