//! A fake Northflank API on a real socket, at `http://127.0.0.1:PORT` (the client's context
//! host; every path starts with `/v1`).
//!
//! `tests/it/northflank_fake.rs::official_js_sdk_accepts_the_fake` proves it with the official
//! JS client `@northflank/js-client` 0.9.5 (`tests/sdk/northflank_contract.mjs`): the client
//! reads the project, creates a tagged deployment service (PUT, then a POST refused as a
//! duplicate), reads and lists it (paginated), pauses, resumes and scales it, is refused with a
//! wrong token, and deletes it. Paths, fields and enums come from that client
//! (`dist/cjs/api-client.d.ts`: `CreateServiceDeploymentData`, `GetServiceResult`,
//! `ListServicesResult`, `ResumeServiceData`; `dist/cjs/api-client.js`: the endpoint URLs and
//! `ApiEndpoint.executeCall`); where it does not say (what a refused transition or a capacity
//! shortage answers) the choice is noted below.
//!
//! Implemented:
//! - Auth as the client sends it: `Authorization: Bearer <token>` (else 401). Every answer is
//!   `{data, pagination?}` with status 200 (the client takes any other status as an error);
//!   errors are `{error: {status, message, id}}` with their status. Paths are
//!   `/v1/projects/{project}/...` or `/v1/teams/{team}/projects/{project}/...` (an unknown
//!   project or team: 404).
//! - `GET /v1/projects/{p}`: the project. `POST /services/deployment` (a name whose id is taken:
//!   409) and `PUT /services/deployment` (create or update: an existing id is answered as it is,
//!   its description and environment updated): `name` (required; the id is its slug: lowercase
//!   letters, digits, single hyphens), `description`, `tags`, `billing.deploymentPlan` (one of
//!   [`PLANS`], else 400), `deployment` {`instances` (required), `external.imagePath`
//!   (required: the fake runs no builds), `docker`}, `runtimeEnvironment` (strings),
//!   `runtimeFiles` {absolute path: {`data` base64, `encoding`}} (decoded and kept). The create
//!   answers the service at once; its `status.deployment.status` goes `PENDING` →
//!   `IN_PROGRESS` → `COMPLETED` (or `FAILED`) over `boot_delay`.
//! - `GET /services?per_page=&cursor=` (1..=100, default 50; `{services}` with
//!   `pagination{hasNextPage, cursor, count}`, no filter, like Northflank's), `GET
//!   /services/{id}` (with `servicePaused`, `deployment`, `billing`, `createdAt`), `DELETE
//!   /services/{id}` (404 when absent), `POST .../pause` (instances to 0; 409 when already
//!   paused), `POST .../resume` `{instances}` (409 when not paused; the deployment goes
//!   `IN_PROGRESS` with reason `SCALING` for `boot_delay`), `POST .../scale` `{instances}`.
//! - Test knobs: a fault [`FakeNorthflank::script`] for creates, [`FakeNorthflankConfig`], the
//!   inventory ([`FakeService`] copies with their description, environment and files), the
//!   create log, the requests seen ([`SeenRequest`], no secrets).
//!
//! Deliberately not implemented: the command exec WebSocket (`/v1/command-exec/...`) and file
//! copy over it, builds, jobs, addons, ports and domains, logs, metrics, secrets groups,
//! volumes; containers are not run (no exec means nothing can observe them).

// Handlers answer a ready `Reply` as their error: its size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The deployment plans the fake accepts (Northflank's `nf-compute-*` family).
pub const PLANS: &[&str] = &[
    "nf-compute-10",
    "nf-compute-20",
    "nf-compute-50",
    "nf-compute-100-1",
    "nf-compute-200",
];
const MAX_BODY: usize = 16 << 20;

type Body = BoxBody<Bytes, io::Error>;
type Reply = Response<Body>;

#[derive(Clone, Debug)]
pub struct FakeNorthflankConfig {
    /// `Retry-After` (seconds) of a scripted `rate_limit`.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the connection before dropping it.
    pub hang: Duration,
    /// How long after a `timeout_after_send` create the service stays invisible.
    pub appear_after: Duration,
    /// `PENDING` → `COMPLETED` (or `FAILED`), and a resume's `IN_PROGRESS`, take this long.
    pub boot_delay: Duration,
}

impl Default for FakeNorthflankConfig {
    fn default() -> Self {
        FakeNorthflankConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            boot_delay: Duration::from_millis(100),
        }
    }
}

/// What a create request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    /// 503 "insufficient capacity" (Northflank documents no capacity answer: the fake's choice).
    Capacity,
    /// 429 with `Retry-After` and the `x-ratelimit-*` headers.
    RateLimit,
    /// 502 from the edge.
    Outage,
    /// 402: the team's billing refuses more.
    Billing,
    /// Made, but the connection is dropped without an answer.
    TimeoutAfterSend,
    /// Made, then its deployment goes `FAILED`.
    FailedBeforeRunning,
    /// A `PUT` for an id that exists: the existing service answered.
    Existing,
    /// Refused (400/409) before the script.
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
            "failed_before_running" => CreateOutcome::FailedBeforeRunning,
            _ => return None,
        })
    }
}

/// A service as the fake holds it (a copy).
#[derive(Clone, Debug)]
pub struct FakeService {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub tags: Vec<String>,
    pub plan: String,
    pub image: String,
    /// `deployment.docker` as sent.
    pub docker: Option<Value>,
    pub instances: u64,
    pub paused: bool,
    /// `PENDING` | `IN_PROGRESS` | `COMPLETED` | `FAILED`.
    pub deployment: String,
    pub env: BTreeMap<String, String>,
    /// `runtimeFiles`, decoded.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The team path it was created under, if any.
    pub team: Option<String>,
    pub outcome: CreateOutcome,
    /// Deleted through the API (kept here for the tests; the API answers 404).
    pub deleted: bool,
}

/// A request the fake received (headers and bodies are not kept).
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub user_agent: Option<String>,
    /// `None` when the connection was dropped without an answer.
    pub status: Option<u16>,
}

pub struct FakeNorthflank {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl FakeNorthflank {
    pub async fn start(config: FakeNorthflankConfig) -> FakeNorthflank {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake's address");
        let shared = Arc::new(Shared {
            config,
            token: format!("nf_fake_{}", random_hex(16)),
            project: "sandboxes".to_string(),
            team: "acme".to_string(),
            inner: Mutex::default(),
        });
        let task = tokio::spawn(accept(listener, shared.clone()));
        FakeNorthflank { shared, addr, task }
    }

    /// `http://127.0.0.1:PORT`: the API host (the client's context `host`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    pub fn project(&self) -> &str {
        &self.shared.project
    }

    /// The team the fake also answers under (`/v1/teams/{team}/...`).
    pub fn team(&self) -> &str {
        &self.shared.team
    }

    /// Outcomes for the next creates, in order (then `ok`): `ok`, `capacity`, `rate_limit`,
    /// `outage`, `billing`, `timeout_after_send`, `failed_before_running`. Panics on another.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name)
                .unwrap_or_else(|| panic!("the fake Northflank has no create outcome {name:?}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every create attempt's outcome, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().create_log.clone()
    }

    pub fn service(&self, id: &str) -> Option<FakeService> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner.services.get(id).map(|e| e.view.clone())
    }

    /// Every service ever made (deleted ones flagged), in creation order.
    pub fn services(&self) -> Vec<FakeService> {
        let mut inner = self.shared.lock();
        inner.advance_all(&self.shared.config);
        inner
            .order
            .iter()
            .filter_map(|id| inner.services.get(id).map(|e| e.view.clone()))
            .collect()
    }

    /// Services not deleted.
    pub fn live(&self) -> Vec<FakeService> {
        self.services().into_iter().filter(|s| !s.deleted).collect()
    }

    /// Live services whose description carries `key=value`.
    pub fn with_tag(&self, key: &str, value: &str) -> Vec<FakeService> {
        let word = format!("{key}={value}");
        self.live()
            .into_iter()
            .filter(|s| {
                s.description
                    .as_deref()
                    .is_some_and(|d| d.split_whitespace().any(|w| w == word))
            })
            .collect()
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.lock().seen.clone()
    }
}

impl Drop for FakeNorthflank {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeNorthflankConfig,
    token: String,
    project: String,
    team: String,
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
    services: HashMap<String, Entry>,
    order: Vec<String>,
    seen: Vec<SeenRequest>,
}

struct Entry {
    view: FakeService,
    /// When the deployment last started moving.
    since: Instant,
    /// `DEPLOYING` or `SCALING`.
    reason: &'static str,
    created_at: String,
    fails: bool,
    hidden_until: Option<Instant>,
}

impl Entry {
    fn advance(&mut self, config: &FakeNorthflankConfig) {
        let elapsed = self.since.elapsed();
        let next = match self.view.deployment.as_str() {
            "PENDING" if elapsed >= config.boot_delay / 2 => "IN_PROGRESS",
            "IN_PROGRESS" if elapsed >= config.boot_delay && self.fails => "FAILED",
            "IN_PROGRESS" if elapsed >= config.boot_delay => "COMPLETED",
            _ => return,
        };
        self.view.deployment = next.to_string();
    }

    /// Not visible through the API: deleted, or a create not answered that has not
    /// appeared yet.
    fn hidden(&self) -> bool {
        self.view.deleted || self.hidden_until.is_some_and(|t| Instant::now() < t)
    }

    /// The service as `GET /services/{id}` answers it.
    fn json(&self) -> Value {
        let v = &self.view;
        let mut deployment = json!({
            "instances": v.instances,
            "external": {"imagePath": v.image, "registryProvider": "dockerhub", "privateImage": false},
        });
        if let Some(docker) = &v.docker {
            deployment["docker"] = docker.clone();
        }
        json!({
            "id": v.id,
            "appId": format!("/acme/{}/{}", v.team.as_deref().unwrap_or("sandboxes"), v.id),
            "name": v.name,
            "description": v.description,
            "tags": v.tags,
            "projectId": "sandboxes",
            "serviceType": "deployment",
            "createdAt": self.created_at,
            "disabledCI": false,
            "disabledCD": false,
            "billing": {"deploymentPlan": v.plan},
            "status": {"deployment": self.deployment_status()},
            "servicePaused": v.paused,
            "deployment": deployment,
        })
    }

    /// The list's shorter form (no `servicePaused`, `deployment` or `billing`).
    fn list_json(&self) -> Value {
        let v = &self.view;
        json!({
            "id": v.id,
            "appId": format!("/acme/sandboxes/{}", v.id),
            "projectId": "sandboxes",
            "name": v.name,
            "tags": v.tags,
            "description": v.description,
            "serviceType": "deployment",
            "disabledCI": false,
            "disabledCD": false,
            "status": {"deployment": self.deployment_status()},
        })
    }

    fn deployment_status(&self) -> Value {
        json!({
            "status": self.view.deployment,
            "reason": self.reason,
            "lastTransitionTime": self.created_at,
        })
    }
}

impl Inner {
    fn advance_all(&mut self, config: &FakeNorthflankConfig) {
        for e in self.services.values_mut() {
            e.advance(config);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Serving
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
        self.query
            .as_deref()
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| percent_decode(v))
    }

    /// The JSON body (an empty body is `{}`).
    fn json(&self) -> Result<Value, Reply> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) if v.is_object() => Ok(v),
            _ => Err(api_error(400, "Request body is not valid JSON")),
        }
    }
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, io::Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(api_error(413, "Request body too large")),
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
        user_agent: req.header("user-agent").map(str::to_string),
        status: result.as_ref().ok().map(|r| r.status().as_u16()),
    });
    result
}

async fn route(shared: &Arc<Shared>, req: &Req) -> Result<Reply, io::Error> {
    let authorized = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token);
    if !authorized {
        return Ok(api_error(401, "Unauthorized: invalid or missing API token"));
    }
    let segments: Vec<String> = req
        .path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    // `/v1[/teams/{team}]/projects/{project}/...`
    let (team, rest) = match s.as_slice() {
        ["v1", "teams", team, rest @ ..] => (Some(*team), rest),
        ["v1", rest @ ..] => (None, rest),
        _ => {
            return Ok(api_error(
                404,
                format!("Cannot {} {}", req.method, req.path),
            ))
        }
    };
    if team.is_some_and(|t| t != shared.team) {
        return Ok(api_error(404, "Team not found"));
    }
    let ["projects", project, rest @ ..] = rest else {
        return Ok(api_error(
            404,
            format!("Cannot {} {}", req.method, req.path),
        ));
    };
    if *project != shared.project {
        return Ok(api_error(404, "Project not found"));
    }
    let team = team.map(str::to_string);
    Ok(match (&req.method, rest) {
        (&Method::GET, []) => data(json!({
            "id": shared.project, "name": "Sandboxes", "description": "sandgate's fake project",
        })),
        (&Method::POST, ["services", "deployment"]) => {
            return create_service(shared, req, team, false).await
        }
        (&Method::PUT, ["services", "deployment"]) => {
            return create_service(shared, req, team, true).await
        }
        (&Method::GET, ["services"]) => list_services(shared, req),
        (&Method::GET, ["services", id]) => with_service(shared, id, |e| data(e.json())),
        (&Method::DELETE, ["services", id]) => delete_service(shared, id),
        (&Method::POST, ["services", id, op @ ("pause" | "resume" | "scale")]) => {
            transition(shared, req, id, op)
        }
        _ => api_error(404, format!("Cannot {} {}", req.method, req.path)),
    })
}

/// What a create body asks for, checked.
struct Parsed {
    name: String,
    id: String,
    description: Option<String>,
    tags: Vec<String>,
    plan: String,
    image: String,
    docker: Option<Value>,
    instances: u64,
    env: BTreeMap<String, String>,
    files: BTreeMap<String, Vec<u8>>,
}

fn parse_create(body: &Value) -> Result<Parsed, Reply> {
    let bad = |m: &str| api_error(400, format!("Validation error: {m}"));
    let name = body["name"].as_str().unwrap_or_default().to_string();
    let id = slug(&name);
    if id.is_empty() {
        return Err(bad("\"name\" is required and must hold letters or digits"));
    }
    let plan = body["billing"]["deploymentPlan"]
        .as_str()
        .unwrap_or_default();
    if !PLANS.contains(&plan) {
        return Err(bad("\"billing.deploymentPlan\" is not a known plan"));
    }
    let deployment = &body["deployment"];
    let instances = deployment["instances"]
        .as_u64()
        .ok_or_else(|| bad("\"deployment.instances\" is required"))?;
    let image = deployment["external"]["imagePath"]
        .as_str()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| bad("\"deployment.external.imagePath\" is required"))?;
    let env = string_map(&body["runtimeEnvironment"])
        .ok_or_else(|| bad("\"runtimeEnvironment\" values must be strings"))?;
    let files = runtime_files(&body["runtimeFiles"]).map_err(|m| bad(&m))?;
    let tags = match body["tags"].as_array() {
        Some(tags) => tags
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        None => vec![],
    };
    Ok(Parsed {
        name,
        id,
        description: body["description"].as_str().map(str::to_string),
        tags,
        plan: plan.to_string(),
        image: image.to_string(),
        docker: deployment.get("docker").cloned(),
        instances,
        env,
        files,
    })
}

fn string_map(value: &Value) -> Option<BTreeMap<String, String>> {
    match value {
        Value::Null => Some(BTreeMap::new()),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => None,
    }
}

fn runtime_files(value: &Value) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let Some(map) = value.as_object() else {
        return match value {
            Value::Null => Ok(BTreeMap::new()),
            _ => Err("\"runtimeFiles\" must be an object".into()),
        };
    };
    let mut files = BTreeMap::new();
    for (path, file) in map {
        if !path.starts_with('/') {
            return Err(format!("runtime file path {path:?} must be absolute"));
        }
        let bytes = file["data"]
            .as_str()
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
            .ok_or(format!("runtime file {path:?}: \"data\" must be base64"))?;
        files.insert(path.clone(), bytes);
    }
    Ok(files)
}

/// Northflank's id for a name: lowercase letters and digits, other runs as one hyphen.
fn slug(name: &str) -> String {
    let mut id = String::new();
    for c in name.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            id.push(c);
        } else if !id.is_empty() && !id.ends_with('-') {
            id.push('-');
        }
    }
    id.trim_end_matches('-').to_string()
}

async fn create_service(
    shared: &Arc<Shared>,
    req: &Req,
    team: Option<String>,
    upsert: bool,
) -> Result<Reply, io::Error> {
    let parsed = match req.json().and_then(|b| parse_create(&b)) {
        Ok(p) => p,
        Err(reply) => {
            shared.lock().create_log.push(CreateOutcome::Rejected);
            return Ok(reply);
        }
    };
    let id = parsed.id.clone();
    if let Some(reply) = existing(shared, &parsed, upsert) {
        return Ok(reply);
    }
    let outcome = {
        let mut inner = shared.lock();
        let outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.create_log.push(outcome);
        if let Some(reply) = refusal(shared, outcome) {
            return Ok(reply);
        }
        let entry = new_entry(shared, parsed, team, outcome);
        if inner.services.insert(id.clone(), entry).is_none() {
            inner.order.push(id.clone());
        }
        outcome
    };
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Err(io::Error::other(
            "timeout_after_send: the answer is never sent",
        ));
    }
    Ok(with_service(shared, &id, |e| data(e.json())))
}

/// A create for an id that exists: 409 for `POST`; for `PUT`, the service updated and
/// answered. `None`: the id is free.
fn existing(shared: &Shared, parsed: &Parsed, upsert: bool) -> Option<Reply> {
    let mut inner = shared.lock();
    let entry = inner
        .services
        .get_mut(&parsed.id)
        .filter(|e| !e.view.deleted)?;
    if !upsert {
        let m = format!("A service with the id {} already exists", parsed.id);
        inner.create_log.push(CreateOutcome::Rejected);
        return Some(api_error(409, m));
    }
    entry.view.description = parsed.description.clone();
    entry.view.env = parsed.env.clone();
    let reply = data(entry.json());
    inner.create_log.push(CreateOutcome::Existing);
    Some(reply)
}

/// The scripted refusals (nothing is made).
fn refusal(shared: &Shared, outcome: CreateOutcome) -> Option<Reply> {
    Some(match outcome {
        CreateOutcome::Capacity => api_error(
            503,
            "Insufficient capacity to schedule the service, please try again later",
        ),
        CreateOutcome::Outage => api_error(502, "Bad Gateway"),
        CreateOutcome::Billing => api_error(402, "Your team's billing does not allow this"),
        CreateOutcome::RateLimit => {
            let mut reply = api_error(429, "Too many requests, please try again later");
            let headers = reply.headers_mut();
            let secs = shared.config.retry_after_secs.to_string();
            headers.insert("retry-after", secs.parse().expect("a header value"));
            headers.insert("x-ratelimit-limit", "1000".parse().expect("a header"));
            headers.insert("x-ratelimit-remaining", "0".parse().expect("a header"));
            headers.insert("x-ratelimit-reset", secs.parse().expect("a header"));
            reply
        }
        _ => return None,
    })
}

fn new_entry(
    shared: &Shared,
    parsed: Parsed,
    team: Option<String>,
    outcome: CreateOutcome,
) -> Entry {
    let hidden_until = (outcome == CreateOutcome::TimeoutAfterSend
        && !shared.config.appear_after.is_zero())
    .then(|| Instant::now() + shared.config.appear_after);
    Entry {
        view: FakeService {
            id: parsed.id,
            name: parsed.name,
            description: parsed.description,
            tags: parsed.tags,
            plan: parsed.plan,
            image: parsed.image,
            docker: parsed.docker,
            instances: parsed.instances,
            paused: false,
            deployment: "PENDING".into(),
            env: parsed.env,
            files: parsed.files,
            team,
            outcome,
            deleted: false,
        },
        since: Instant::now(),
        reason: "DEPLOYING",
        created_at: httpdate::fmt_http_date(SystemTime::now()),
        fails: outcome == CreateOutcome::FailedBeforeRunning,
        hidden_until,
    }
}

fn with_service(shared: &Shared, id: &str, f: impl FnOnce(&mut Entry) -> Reply) -> Reply {
    let mut inner = shared.lock();
    match inner.services.get_mut(id).filter(|e| !e.hidden()) {
        Some(entry) => {
            entry.advance(&shared.config);
            f(entry)
        }
        None => api_error(404, format!("Service {id} not found")),
    }
}

fn list_services(shared: &Shared, req: &Req) -> Reply {
    let per_page = match req.param("per_page") {
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => return api_error(400, "per_page must be between 1 and 100"),
        },
        None => 50,
    };
    let start = match req.param("cursor").filter(|c| !c.is_empty()) {
        Some(c) => match c.strip_prefix('c').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return api_error(400, "Invalid cursor"),
        },
        None => 0,
    };
    let mut inner = shared.lock();
    inner.advance_all(&shared.config);
    let visible: Vec<Value> = inner
        .order
        .iter()
        .filter_map(|id| inner.services.get(id))
        .filter(|e| !e.hidden())
        .map(Entry::list_json)
        .collect();
    let page: Vec<Value> = visible.iter().skip(start).take(per_page).cloned().collect();
    let more = start + page.len() < visible.len();
    let mut pagination = json!({"hasNextPage": more, "count": page.len()});
    if more {
        pagination["cursor"] = json!(format!("c{}", start + page.len()));
    }
    json_reply(
        200,
        &json!({"data": {"services": page}, "pagination": pagination}),
    )
}

fn delete_service(shared: &Shared, id: &str) -> Reply {
    let mut inner = shared.lock();
    match inner.services.get_mut(id).filter(|e| !e.hidden()) {
        Some(entry) => {
            entry.view.deleted = true;
            data(json!({}))
        }
        None => api_error(404, format!("Service {id} not found")),
    }
}

/// `pause`, `resume` and `scale`.
fn transition(shared: &Shared, req: &Req, id: &str, op: &str) -> Reply {
    let body = match req.json() {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let instances = body["instances"].as_u64();
    with_service(shared, id, |e| {
        match op {
            "pause" if e.view.paused => return api_error(409, "Service is already paused"),
            "pause" => {
                e.view.paused = true;
                e.view.instances = 0;
            }
            "resume" if !e.view.paused => return api_error(409, "Service is not paused"),
            "resume" => {
                e.view.paused = false;
                e.view.instances = instances.unwrap_or(1);
                e.view.deployment = "IN_PROGRESS".into();
                e.reason = "SCALING";
                e.since = Instant::now();
            }
            _ => match instances {
                Some(n) => e.view.instances = n,
                None => return api_error(400, "Validation error: \"instances\" is required"),
            },
        }
        data(json!({}))
    })
}

// ---------------------------------------------------------------------------------------
// Answers
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

/// A success: `{data}` with 200.
fn data(value: Value) -> Reply {
    json_reply(200, &json!({ "data": value }))
}

/// Northflank's error: `{error: {status, message, id}}`.
fn api_error(status: u16, message: impl Into<String>) -> Reply {
    json_reply(
        status,
        &json!({"error": {"status": status, "message": message.into(), "id": random_hex(8)}}),
    )
}

fn random_hex(len: usize) -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    bytes.iter().take(len).map(|b| format!("{b:02x}")).collect()
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}
