//! A fake CodeSandbox API on a real socket (`http://127.0.0.1:PORT`, HTTP/1.1 or h2c): the
//! control plane the official SDK `@codesandbox/sdk` 2.4.2 calls (`API` in its
//! `dist/esm/index.js`, the generated client `api-clients/client/sdk.gen`), at the SDK's
//! `baseUrl` / `CSB_BASE_URL`.
//!
//! `tests/it/codesandbox_fake.rs::official_js_sdk_accepts_the_fake` proves it with that SDK
//! (`tests/sdk/codesandbox_contract.mjs`): the SDK's own client creates a sandbox (fork of a
//! template, then VM start) with tags, gets it, lists it by tag, hibernates, resumes,
//! shuts down, restarts, forks it, meets a 429 and a 404 as its `handleResponse` reads them,
//! and deletes. Paths, fields and enums come from the SDK (`types.gen.d.ts`); where it does
//! not say (the error bodies' prose, which statuses a refused start answers, whether a list
//! with several `tags` wants all of them) the choice is noted below.
//!
//! Implemented:
//! - `Authorization: Bearer <key>` on every call (else 401 `{"errors": ["Unauthorized"]}`).
//!   Answers are CodeSandbox's envelope `{"data": ..., "errors": [], "success": true}`;
//!   errors `{"errors": ["<prose>"], "success": false}` (the SDK shows `errors[0]`).
//! - `POST /sandbox/{id}/fork` (`title` ≤ 255, `description`, `tags` ≤ 10 strings, `privacy`
//!   0..=2, `private_preview`, `path` starting with `/`, `is_frozen`, `start_options`: when
//!   given the VM is started too and `start_response` answered) from a template the fake
//!   knows ([`TEMPLATE`], the SDK's default) or any live sandbox (404 otherwise); answers
//!   `{id, alias, title}`. Ids are 6 lowercase letters and digits, as CodeSandbox's short ids.
//! - `POST /vm/{id}/start` (`tier` one of Pico..XLarge, `hibernation_timeout_seconds`
//!   1..=86400, `ipcountry`, `automatic_wakeup_config`; 422 otherwise): `bootup_type` is
//!   `FORK` for a first start, `RESUME` after a hibernation, `CLEAN` after a shutdown,
//!   `RUNNING` when it runs; the pitcher URL/token answered point at nothing.
//!   `POST /vm/{id}/hibernate`, `POST /vm/{id}/shutdown` (idempotent: the SDK retries them),
//!   `DELETE /vm/{id}` (404 when unknown or deleted), `GET /vm/running`.
//! - `GET /sandbox/{id}` (404 unknown or deleted), `GET /sandbox` (`tags` comma-separated:
//!   a sandbox must carry every one (the SDK does not say all or any; the adapter filters
//!   again either way), `page`, `page_size` 1..=100 (default 20), `status=running`,
//!   `order_by`, `direction`; newest first), `{sandboxes, pagination{current_page,
//!   next_page, total_records}}`.
//! - Test knobs: a fault [`FakeCodesandbox::script`] for forks (capacity: 503 as the SDK's
//!   "overloaded"; rate_limit: 429 with `Retry-After` and CodeSandbox's
//!   `x-csb-rate-hourly-*` headers; outage: 502; timeout_after_send: the sandbox is made
//!   and the connection dropped after `hang`, hidden from listings for `appear_after`;
//!   failed_before_running: forked, then its first start answers 500), [`FakeConfig`], the
//!   inventory ([`FakeSandbox`] copies with their tags, fork source, VM state and start
//!   bodies), the requests seen ([`SeenRequest`], no secrets), the [`CreateOutcome`] log.
//!
//! Deliberately not implemented: the VM's agent (pitcher WebSocket, pint REST: exec, files,
//! ports, tasks), which the control plane only points at, templates built from code,
//! preview tokens and hosts, workspaces and API tokens, tiers' resources, hibernation by
//! inactivity.

// Handlers answer a ready `Reply` as their error: its size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The template every fake knows: the SDK's default (`getDefaultTemplateTag`).
pub const TEMPLATE: &str = "pcz35m";
/// The VM tiers a start accepts.
pub const TIERS: &[&str] = &[
    "Pico", "Nano", "Micro", "Small", "Medium", "Large", "XLarge",
];
const MAX_BODY: usize = 1 << 20;

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` fork the sandbox stays out of listings.
    pub appear_after: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
        }
    }
}

/// What a fork (a create) request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 503 `{"errors": ["The sandbox is currently overloaded ..."]}`.
    Capacity,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 502.
    Outage,
    /// The sandbox is forked but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Forked; its first start answers 500.
    FailedBeforeRunning,
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
    pub title: Option<String>,
    pub description: Option<String>,
    pub tags: Vec<String>,
    pub privacy: u64,
    pub private_preview: Option<bool>,
    pub path: String,
    /// The template or sandbox it was forked from.
    pub forked_from: String,
    /// `none` (never started), `running`, `hibernated`, `shutdown`.
    pub vm: String,
    pub deleted: bool,
    /// Every start's body, in order.
    pub starts: Vec<Value>,
    /// Every start's `bootup_type`, in order.
    pub bootups: Vec<String>,
    pub hibernations: usize,
    pub shutdowns: usize,
    /// The fork's body as sent.
    pub request: Value,
    pub outcome: CreateOutcome,
}

impl FakeSandbox {
    pub fn live(&self) -> bool {
        !self.deleted
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }
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

pub struct FakeCodesandbox {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl FakeCodesandbox {
    pub async fn start(config: FakeConfig) -> FakeCodesandbox {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            api_key: format!("csb_v1_fake{}", random_alnum(24)),
            inner: Mutex::default(),
        });
        let tasks = vec![tokio::spawn(accept(listener, shared.clone()))];
        FakeCodesandbox {
            shared,
            addr,
            tasks,
        }
    }

    /// `http://127.0.0.1:PORT`: the SDK's `baseUrl` (or `CSB_BASE_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// Outcomes for the next forks, in order (then `ok`): `ok`, `capacity`, `rate_limit`,
    /// `outage`, `timeout_after_send`, `failed_before_running`. Panics on another name.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake CodeSandbox has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every fork's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        self.shared.lock().sandboxes.get(id).map(|e| e.view.clone())
    }

    /// Every sandbox ever forked, oldest first (deleted ones too).
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let inner = self.shared.lock();
        inner
            .order
            .iter()
            .filter_map(|id| inner.sandboxes.get(id).map(|e| e.view.clone()))
            .collect()
    }

    /// Sandboxes not deleted.
    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes().into_iter().filter(|s| s.live()).collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    /// Live sandboxes carrying the tag `key=value`.
    pub fn live_with_tag(&self, key: &str, value: &str) -> Vec<FakeSandbox> {
        let tag = format!("{key}={value}");
        self.live()
            .into_iter()
            .filter(|s| s.has_tag(&tag))
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }
}

impl Drop for FakeCodesandbox {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Shared {
    config: FakeConfig,
    api_key: String,
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
    seen: Vec<SeenRequest>,
}

struct Entry {
    view: FakeSandbox,
    created: String,
    updated: String,
    /// The next start fails (a scripted `failed_before_running`).
    start_fails: bool,
    hidden_until: Option<Instant>,
}

impl Entry {
    /// CodeSandbox's `Sandbox`.
    fn json(&self) -> Value {
        let v = &self.view;
        json!({
            "id": v.id,
            "title": v.title,
            "description": v.description,
            "tags": v.tags,
            "privacy": v.privacy,
            "is_frozen": v.request["is_frozen"].as_bool().unwrap_or(false),
            "settings": {"use_pint": false},
            "created_at": self.created,
            "updated_at": self.updated,
        })
    }

    fn hidden(&self) -> bool {
        self.hidden_until.is_some_and(|t| Instant::now() < t)
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

    fn bearer(&self) -> Option<&str> {
        self.headers
            .get("authorization")?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
    }

    /// The JSON body (an empty body is `{}`); `Err` is the 422.
    fn json(&self) -> Result<Value, Reply> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if v.is_object() => Ok(v),
            Ok(_) => Err(errors(422, "the body must be a JSON object")),
            Err(e) => Err(errors(422, format!("invalid JSON body: {e}"))),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(errors(413, "the request body is too large or broken")),
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
        query: req.query.clone(),
        status: result.as_ref().ok().map(|r| r.status().as_u16()),
    });
    result
}

async fn route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    if req.bearer() != Some(shared.api_key.as_str()) {
        return Ok(errors(401, "Unauthorized"));
    }
    let segments = req.segments();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    Ok(match (&req.method, s.as_slice()) {
        (&Method::POST, ["sandbox", id, "fork"]) => return fork(shared, req, id).await,
        (&Method::GET, ["sandbox"]) => list(shared, req),
        (&Method::GET, ["sandbox", id]) => {
            let inner = shared.lock();
            match inner.sandboxes.get(*id).filter(|e| e.view.live()) {
                Some(e) => data(200, e.json()),
                None => not_found(),
            }
        }
        (&Method::POST, ["vm", id, "start"]) => start(shared, req, id),
        (&Method::POST, ["vm", id, "hibernate"]) => settle(shared, req, id, "hibernated"),
        (&Method::POST, ["vm", id, "shutdown"]) => settle(shared, req, id, "shutdown"),
        (&Method::DELETE, ["vm", id]) => delete(shared, id),
        (&Method::GET, ["vm", "running"]) => running(shared),
        _ => errors(404, format!("Not Found: {} {}", req.method, req.path)),
    })
}

// ---------------------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------------------

/// The fork body's fields as CodeSandbox's contract takes them; `Err` is the 422.
fn check_fork(body: &Value) -> Result<(), Reply> {
    let bad = |m: &str| Err(errors(422, m.to_string()));
    for field in ["title", "description"] {
        match &body[field] {
            Value::Null => {}
            Value::String(s) if s.chars().count() <= 255 => {}
            _ => {
                return bad(&format!(
                    "{field} must be a string of at most 255 characters"
                ))
            }
        }
    }
    match &body["tags"] {
        Value::Null => {}
        Value::Array(tags) if tags.len() <= 10 && tags.iter().all(Value::is_string) => {}
        _ => return bad("tags must be at most 10 strings"),
    }
    match &body["privacy"] {
        Value::Null => {}
        v if v.as_u64().is_some_and(|p| p <= 2) => {}
        _ => return bad("privacy must be 0, 1 or 2"),
    }
    match &body["path"] {
        Value::Null => {}
        Value::String(p) if p.starts_with('/') => {}
        _ => return bad("path must start with /"),
    }
    for flag in ["private_preview", "is_frozen"] {
        if !body[flag].is_null() && !body[flag].is_boolean() {
            return bad(&format!("{flag} must be a boolean"));
        }
    }
    Ok(())
}

/// A VM start's body; `Err` is the 422.
fn check_start(body: &Value) -> Result<(), Reply> {
    match &body["tier"] {
        Value::Null => {}
        Value::String(t) if TIERS.contains(&t.as_str()) => {}
        _ => {
            return Err(errors(
                422,
                format!("tier must be one of {}", TIERS.join(", ")),
            ))
        }
    }
    match &body["hibernation_timeout_seconds"] {
        Value::Null => Ok(()),
        v if v.as_u64().is_some_and(|s| (1..=86_400).contains(&s)) => Ok(()),
        _ => Err(errors(
            422,
            "hibernation_timeout_seconds must be between 1 and 86400",
        )),
    }
}

/// The scripted outcome of one fork, or the reply a fault answers.
fn next_outcome(shared: &Shared, inner: &mut Inner) -> Result<CreateOutcome, Reply> {
    let outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
    inner.create_log.push(outcome);
    match outcome {
        CreateOutcome::Capacity => Err(errors(
            503,
            "The sandbox is currently overloaded. Please try again in a moment.",
        )),
        CreateOutcome::RateLimit => {
            let mut reply = errors(429, "Too many requests");
            let h = reply.headers_mut();
            let secs = shared.config.retry_after_secs.to_string();
            h.insert("retry-after", secs.parse().unwrap());
            h.insert("x-csb-rate-hourly-remaining", "0".parse().unwrap());
            h.insert("x-csb-rate-hourly-used", "1000".parse().unwrap());
            h.insert("x-csb-rate-hourly-reset", now_rfc3339().parse().unwrap());
            Err(reply)
        }
        CreateOutcome::Outage => Err(errors(502, "Bad Gateway")),
        other => Ok(other),
    }
}

async fn fork(shared: &Arc<Shared>, req: &Req, from: &str) -> Result<Reply, io::Error> {
    let reject = |reply: Reply| {
        shared.lock().create_log.push(CreateOutcome::Rejected);
        Ok(reply)
    };
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return reject(reply),
    };
    if let Err(reply) = check_fork(&body) {
        return reject(reply);
    }
    if let Some(options) = body.get("start_options") {
        if let Err(reply) = check_start(options) {
            return reject(reply);
        }
    }
    let known = from == TEMPLATE
        || shared
            .lock()
            .sandboxes
            .get(from)
            .is_some_and(|e| e.view.live());
    if !known {
        return reject(not_found());
    }
    let (id, outcome) = {
        let mut inner = shared.lock();
        let outcome = match next_outcome(shared, &mut inner) {
            Ok(o) => o,
            Err(reply) => return Ok(reply),
        };
        (
            insert(shared, &mut inner, from, body.clone(), outcome),
            outcome,
        )
    };
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    let start_response = match body.get("start_options") {
        Some(options) => {
            let mut inner = shared.lock();
            let entry = inner.sandboxes.get_mut(&id).expect("just inserted");
            Some(boot(entry, options.clone()))
        }
        None => None,
    };
    let title = shared.lock().sandboxes[&id].view.title.clone();
    Ok(data(
        201,
        json!({"id": id, "alias": id, "title": title, "start_response": start_response}),
    ))
}

/// Records a new sandbox forked from `from`; its id.
fn insert(
    shared: &Shared,
    inner: &mut Inner,
    from: &str,
    body: Value,
    outcome: CreateOutcome,
) -> String {
    let id = loop {
        let id = random_alnum(6);
        if !inner.sandboxes.contains_key(&id) && id != TEMPLATE {
            break id;
        }
    };
    let text = |f: &str| body[f].as_str().map(str::to_string);
    let view = FakeSandbox {
        id: id.clone(),
        title: text("title").or_else(|| Some(format!("{from} (forked)"))),
        description: text("description"),
        tags: body["tags"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        privacy: body["privacy"].as_u64().unwrap_or(0),
        private_preview: body["private_preview"].as_bool(),
        path: text("path").unwrap_or_else(|| "/".into()),
        forked_from: from.to_string(),
        vm: "none".into(),
        deleted: false,
        starts: Vec::new(),
        bootups: Vec::new(),
        hibernations: 0,
        shutdowns: 0,
        request: body,
        outcome,
    };
    let hidden_until = (outcome == CreateOutcome::TimeoutAfterSend
        && !shared.config.appear_after.is_zero())
    .then(|| Instant::now() + shared.config.appear_after);
    let now = now_rfc3339();
    inner.sandboxes.insert(
        id.clone(),
        Entry {
            view,
            created: now.clone(),
            updated: now,
            start_fails: outcome == CreateOutcome::FailedBeforeRunning,
            hidden_until,
        },
    );
    inner.order.push(id.clone());
    id
}

/// Starts (or wakes) the VM: the `VmStartResponse` data.
fn boot(entry: &mut Entry, body: Value) -> Value {
    let bootup = match entry.view.vm.as_str() {
        "none" => "FORK",
        "hibernated" => "RESUME",
        "shutdown" => "CLEAN",
        _ => "RUNNING",
    };
    entry.view.vm = "running".into();
    entry.view.starts.push(body);
    entry.view.bootups.push(bootup.into());
    entry.updated = now_rfc3339();
    let id = &entry.view.id;
    json!({
        "id": id,
        "bootup_type": bootup,
        "cluster": "fake-cluster",
        "latest_pitcher_version": "0.0.0-fake",
        "pitcher_manager_version": "0.0.0-fake",
        "pitcher_version": "0.0.0-fake",
        "pitcher_token": format!("pt_{}", random_alnum(16)),
        "pitcher_url": format!("wss://{id}.pitcher.invalid"),
        "reconnect_token": random_alnum(16),
        "use_pint": false,
        "user_workspace_path": "/project/workspace",
        "workspace_path": "/project/sandbox",
    })
}

fn start(shared: &Shared, req: &Req, id: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Err(reply) = check_start(&body) {
        return reply;
    }
    let mut inner = shared.lock();
    let Some(entry) = inner.sandboxes.get_mut(id).filter(|e| e.view.live()) else {
        return not_found();
    };
    if std::mem::take(&mut entry.start_fails) {
        entry.view.starts.push(body);
        entry.view.bootups.push("FAILED".into());
        return errors(500, "The VM failed to start");
    }
    data(200, boot(entry, body))
}

/// Hibernate or shut down (`state`); a VM not running stays as it is.
fn settle(shared: &Shared, req: &Req, id: &str, state: &str) -> Reply {
    if let Err(r) = req.json() {
        return r;
    }
    let mut inner = shared.lock();
    let Some(entry) = inner.sandboxes.get_mut(id).filter(|e| e.view.live()) else {
        return not_found();
    };
    if entry.view.vm == "running" {
        entry.view.vm = state.into();
    }
    match state {
        "hibernated" => entry.view.hibernations += 1,
        _ => entry.view.shutdowns += 1,
    }
    entry.updated = now_rfc3339();
    data(200, json!({}))
}

fn delete(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    let Some(entry) = inner.sandboxes.get_mut(id).filter(|e| e.view.live()) else {
        return not_found();
    };
    entry.view.deleted = true;
    entry.view.vm = "shutdown".into();
    data(200, json!({}))
}

fn running(shared: &Shared) -> Reply {
    let inner = shared.lock();
    let vms: Vec<Value> = inner
        .order
        .iter()
        .filter_map(|id| inner.sandboxes.get(id))
        .filter(|e| e.view.live() && e.view.vm == "running")
        .map(|e| json!({"id": e.view.id, "credit_basis": "0.5", "last_active_at": e.updated, "session_started_at": e.created, "specs": {"cpu": 2, "memory": 4, "storage": 20}}))
        .collect();
    data(
        200,
        json!({"concurrent_vm_count": vms.len(), "concurrent_vm_limit": 10, "vms": vms}),
    )
}

fn list(shared: &Shared, req: &Req) -> Reply {
    let number = |name: &str, default: usize, max: usize| match req.param(name) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(errors(422, format!("{name} must be 1..={max}"))),
        },
    };
    let (page, size) = match (number("page", 1, 1_000_000), number("page_size", 20, 100)) {
        (Ok(p), Ok(s)) => (p, s),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let tags: Vec<String> = req
        .param("tags")
        .map(|t| {
            t.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let running_only = match req.param("status").as_deref() {
        None => false,
        Some("running") => true,
        Some(_) => return errors(422, "status must be running"),
    };
    let inner = shared.lock();
    let mut matching: Vec<Value> = Vec::new();
    for id in inner.order.iter().rev() {
        let Some(e) = inner.sandboxes.get(id) else {
            continue;
        };
        let keep = e.view.live()
            && !e.hidden()
            && tags.iter().all(|t| e.view.has_tag(t))
            && (!running_only || e.view.vm == "running");
        if keep {
            matching.push(e.json());
        }
    }
    if req.param("direction").as_deref() == Some("asc") {
        matching.reverse();
    }
    let total = matching.len();
    let start = (page - 1).saturating_mul(size).min(total);
    let end = (start + size).min(total);
    data(
        200,
        json!({
            "sandboxes": matching[start..end],
            "pagination": {
                "current_page": page,
                "next_page": if end < total { Some(page + 1) } else { None },
                "total_records": total,
            },
        }),
    )
}

// ---------------------------------------------------------------------------------------
// Replies
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

/// CodeSandbox's success envelope.
fn data(status: u16, value: Value) -> Reply {
    json_reply(
        status,
        &json!({"data": value, "errors": [], "success": true}),
    )
}

/// CodeSandbox's error envelope (the SDK shows `errors[0]`).
fn errors(status: u16, message: impl Into<String>) -> Reply {
    json_reply(
        status,
        &json!({"errors": [message.into()], "success": false}),
    )
}

fn not_found() -> Reply {
    errors(404, "Sandbox not found")
}

fn now_rfc3339() -> String {
    let secs = SystemTime::now()
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

/// The sandboxes' tags as `key=value` pairs (other tags left out), for assertions.
pub fn tag_map(sandbox: &FakeSandbox) -> BTreeMap<String, String> {
    sandbox
        .tags
        .iter()
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
