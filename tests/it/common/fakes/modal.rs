//! A fake Modal on a real socket: gRPC over HTTP/2 cleartext (h2c) at `http://127.0.0.1:PORT`,
//! serving both Modal's control plane (`modal.client.ModalClient`) and each task's command
//! router (`modal.task_command_router.TaskCommandRouter`, whose URL
//! `TaskGetCommandRouterAccess` answers: the same socket here).
//!
//! `tests/it/modal_fake.rs::official_python_sdk_accepts_the_fake` proves it with the official
//! `modal` Python SDK 1.6.4 (`tests/sdk/modal_contract.py`): the SDK's own client (grpclib)
//! looks up an app, creates sandboxes with env, an allow list and tags, runs commands (their
//! output streamed, stdin written, exit codes), lists sandboxes by tag, snapshots a
//! filesystem and starts a sandbox from it, and terminates them, all through this fake. The
//! messages are sandgate's own prost definitions
//! (`sandgate::providers::hosted::modal::proto`, field numbers from the SDK's descriptors)
//! plus the few calls only the SDK makes ([`sdk`] below); the SDK decoding every answer and
//! encoding every request is what proves both.
//!
//! Implemented:
//! - gRPC as the SDK and tonic speak it: one length-prefixed protobuf message per unary
//!   request (no compression), answers with `grpc-status` in trailers; failures as
//!   trailers-only responses with `grpc-message` and, for a throttled call,
//!   `grpc-status-details-bin` = `modal.client.RPCStatus{details: [Any{type.modal.com/
//!   modal.client.RPCRetryPolicy}]}` (what the SDK's `CustomProtoStatusDetailsCodec` reads).
//!   An unknown method is `UNIMPLEMENTED`.
//! - Auth: the control plane wants `x-modal-token-id`/`x-modal-token-secret` (else
//!   `UNAUTHENTICATED`); the router wants `authorization: Bearer <jwt>` with a JWT this fake
//!   issued for that task (a JWT-shaped token with an `exp` an hour away; else
//!   `UNAUTHENTICATED`, and `PERMISSION_DENIED` for another task's id).
//! - Control plane: `ClientHello`; `AppGetOrCreate` (by name and environment; created with
//!   `CREATE_IF_MISSING`, else `NOT_FOUND`); `SecretGetOrCreate` (`ANONYMOUS_OWNED_BY_APP`
//!   with `env_dict`); `SandboxCreate` (the app, the image and the secrets must exist, else
//!   `NOT_FOUND`; `timeout_secs` ≤ 86400 and an allow list of CIDRs, else
//!   `INVALID_ARGUMENT`; the same `x-idempotency-key` answers the same sandbox); a sandbox is
//!   pending (no task) for `boot_delay`, then running with a task id; `SandboxGetTaskId` and
//!   `SandboxWait` long-poll up to their `timeout`; `SandboxList` (the app's sandboxes with
//!   every tag given, newest first, at most [`LIST_PAGE`] per answer, `created_at` strictly
//!   before `before_timestamp` when set, unfinished ones unless `include_finished`);
//!   `SandboxTagsGet`/`SandboxTagsSet`; `SandboxTerminate` (its commands killed; unknown:
//!   `NOT_FOUND`); `SandboxSnapshotFs` (the sandbox's files as a new image `im-…`);
//!   `ImageFromId`, `ImageDelete` (`NOT_FOUND` when absent); `TaskGetCommandRouterAccess`
//!   (`FAILED_PRECONDITION` when the task is not running). A sandbox ends by itself after its
//!   `timeout_secs` (`TIMEOUT`).
//! - Commands REALLY run, argv as given (no shell), in their own process group: the
//!   sandbox's `/` is a host directory; every `/root` in argv, `workdir` and environment
//!   values is mapped to the sandbox's `/root` (the only mapping: other absolute paths are
//!   the host's). Environment: the host's `PATH`, `HOME=/root`, the create's secrets, the
//!   request's `env`. `TaskExecStart` (`exec_id` unique per task, else `ALREADY_EXISTS`;
//!   `timeout_secs` kills the command with SIGKILL), `TaskExecStdinWrite` (by offset: a
//!   repeated piece is skipped, a gap is `OUT_OF_RANGE`; `eof` closes stdin),
//!   `TaskExecStdioRead` (a server stream of the descriptor's bytes from `offset`, as they
//!   come, ending when the command has exited and its output is sent), `TaskExecWait`
//!   (`code`, or `signal` when killed).
//! - Faults by script for the next `SandboxCreate`s ([`FakeModal::script`]): `capacity`
//!   (`RESOURCE_EXHAUSTED`, no retry policy, nothing made), `rate_limit`
//!   (`RESOURCE_EXHAUSTED` with `RPCRetryPolicy{retry_after_secs}`), `outage` (`UNAVAILABLE`),
//!   `timeout_after_send` (the sandbox is made, hidden from lists for `appear_after`, and the
//!   connection is dropped after `hang`), `failed_before_running` (made; its task ends with
//!   `FAILURE` instead of running).
//! - Test knobs: [`FakeModalConfig`], the inventory ([`FakeSandbox`]: tags, image, env,
//!   network settings as sent, state, idempotency key), the create log, commands run, files.
//!
//! Deliberately not implemented: isolation (commands are the test's processes), egress
//! enforcement (the network settings are recorded, not applied), image builds, volumes,
//! mounts, tunnels, PTYs, GPUs, named sandboxes, the V2 filesystem API, the Modal web UI.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use sandgate::providers::hosted::modal::proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tonic::Code;

/// The image every account of the fake has.
pub const BASE_IMAGE: &str = "im-fake";
/// The most sandboxes one `SandboxList` answer holds.
pub const LIST_PAGE: usize = 100;
/// The longest `timeout_secs` Modal takes.
const MAX_TIMEOUT_SECS: u32 = 24 * 3600;
const MAX_MESSAGE: usize = 64 << 20;
/// Output is streamed in pieces of at most this size.
const READ_CHUNK: usize = 64 * 1024;
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------------------
// The Rust API the tests use
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FakeModalConfig {
    /// `retry_after_secs` of a scripted `rate_limit`'s retry policy.
    pub retry_after_secs: u64,
    /// How long a scripted `timeout_after_send` holds the call before dropping the connection.
    pub hang: Duration,
    /// How long a `timeout_after_send` sandbox stays out of `SandboxList`.
    pub appear_after: Duration,
    /// How long a new sandbox waits for its task.
    pub boot_delay: Duration,
}

impl Default for FakeModalConfig {
    fn default() -> Self {
        FakeModalConfig {
            retry_after_secs: 1,
            hang: Duration::from_secs(1),
            appear_after: Duration::ZERO,
            boot_delay: Duration::from_millis(100),
        }
    }
}

/// What a `SandboxCreate` came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Ok,
    Capacity,
    RateLimit,
    Outage,
    TimeoutAfterSend,
    FailedBeforeRunning,
    /// The idempotency key of an earlier create: its sandbox, nothing new.
    Replayed,
    /// Refused before the script (a missing app, image or secret, a bad argument).
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
    pub app_id: String,
    pub tags: BTreeMap<String, String>,
    pub image_id: String,
    /// The create's secrets, merged.
    pub env: BTreeMap<String, String>,
    /// `OPEN`, `BLOCKED`, `ALLOWLIST` or `UNSPECIFIED` (no `network_access` sent).
    pub network_access_type: String,
    pub allowed_cidrs: Vec<String>,
    pub allowed_domains: Vec<String>,
    pub block_network: bool,
    pub entrypoint_args: Vec<String>,
    /// `pending`, `running`, `terminated` or `failed`.
    pub state: String,
    pub task_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub timeout_secs: u32,
}

impl FakeSandbox {
    pub fn live(&self) -> bool {
        self.state == "pending" || self.state == "running"
    }
}

pub struct FakeModal {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl FakeModal {
    pub async fn start(config: FakeModalConfig) -> FakeModal {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().expect("a directory for the fake's sandboxes");
        let base = dir.path().join("images").join(BASE_IMAGE);
        std::fs::create_dir_all(base.join("root")).unwrap();
        let (tick, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            config,
            url: format!("http://{addr}"),
            token_id: format!("ak-{}", random_hex(12)),
            token_secret: format!("as-{}", random_hex(24)),
            dir,
            tick,
            inner: Mutex::new(Inner::default()),
        });
        shared.lock().images.insert(BASE_IMAGE.to_string(), base);
        let accept = tokio::spawn(accept(listener, shared.clone()));
        FakeModal {
            shared,
            addr,
            accept,
        }
    }

    /// The control plane's URL (`MODAL_SERVER_URL`); the command router's too.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token_id(&self) -> &str {
        &self.shared.token_id
    }

    pub fn token_secret(&self) -> &str {
        &self.shared.token_secret
    }

    /// Faults for the next `SandboxCreate`s, in order (see the module docs); `ok` passes.
    pub fn script<'a>(&self, outcomes: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.shared.lock();
        for name in outcomes {
            let outcome = CreateOutcome::parse(name).unwrap_or_else(|| panic!("no fault {name}"));
            inner.script.push_back(outcome);
        }
    }

    /// Every `SandboxCreate` that was authenticated, in order.
    pub fn create_log(&self) -> Vec<CreateOutcome> {
        self.shared.lock().log.clone()
    }

    pub fn sandbox(&self, id: &str) -> Option<FakeSandbox> {
        let mut inner = self.shared.lock();
        inner.advance_all();
        inner.sandboxes.get(id).map(|e| e.view.clone())
    }

    /// Every sandbox, oldest first.
    pub fn sandboxes(&self) -> Vec<FakeSandbox> {
        let mut inner = self.shared.lock();
        inner.advance_all();
        inner.sandboxes.values().map(|e| e.view.clone()).collect()
    }

    pub fn live(&self) -> Vec<FakeSandbox> {
        self.sandboxes().into_iter().filter(|s| s.live()).collect()
    }

    pub fn live_count(&self) -> usize {
        self.live().len()
    }

    pub fn live_with_tag(&self, name: &str, value: &str) -> Vec<FakeSandbox> {
        self.live()
            .into_iter()
            .filter(|s| s.tags.get(name).map(String::as_str) == Some(value))
            .collect()
    }

    /// The argv of every command started, as sent.
    pub fn commands(&self) -> Vec<Vec<String>> {
        self.shared.lock().commands.clone()
    }

    /// A file in a sandbox, by its path inside the sandbox.
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        let root = self.shared.lock().sandboxes.get(id)?.root.clone();
        std::fs::read(root.join(path.trim_start_matches('/'))).ok()
    }

    /// The image ids the account has (the base image and snapshots).
    pub fn images(&self) -> Vec<String> {
        self.shared.lock().images.keys().cloned().collect()
    }
}

impl Drop for FakeModal {
    fn drop(&mut self) {
        self.accept.abort();
        for exec in self.shared.lock().execs.values() {
            exec.kill();
        }
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

struct Shared {
    config: FakeModalConfig,
    url: String,
    token_id: String,
    token_secret: String,
    dir: tempfile::TempDir,
    /// Bumped on every change a long poll or a stream may wait for.
    tick: watch::Sender<u64>,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.tick.send_modify(|n| *n += 1);
    }

    /// Waits (up to `max`) until `done` holds, re-checking on every change and every 50 ms
    /// (a sandbox's clock advances without a change).
    async fn wait_until(&self, max: Duration, mut done: impl FnMut(&mut Inner) -> bool) -> bool {
        let deadline = Instant::now() + max;
        let mut rx = self.tick.subscribe();
        loop {
            {
                let mut inner = self.lock();
                inner.advance_all();
                if done(&mut inner) {
                    return true;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let step = left.min(Duration::from_millis(50));
            let _ = tokio::time::timeout(step, rx.changed()).await;
        }
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<CreateOutcome>,
    log: Vec<CreateOutcome>,
    /// (environment, name) → app id.
    apps: BTreeMap<(String, String), String>,
    secrets: HashMap<String, BTreeMap<String, String>>,
    /// By id; ids sort in creation order (see `make_sandbox`).
    sandboxes: BTreeMap<String, Entry>,
    /// Idempotency key → sandbox id.
    keys: HashMap<String, String>,
    images: BTreeMap<String, PathBuf>,
    /// (task id, exec id) → the command.
    execs: HashMap<(String, String), Exec>,
    /// Router JWT → task id.
    jwts: HashMap<String, String>,
    commands: Vec<Vec<String>>,
    serial: u64,
    last_created_at: f64,
}

struct Entry {
    view: FakeSandbox,
    root: PathBuf,
    created_at: f64,
    ready_at: Instant,
    ends_at: Instant,
    visible_at: Instant,
    fail_on_boot: bool,
    result: Option<proto::GenericResult>,
}

impl Entry {
    /// The sandbox's clock: pending → running (or failed) at `ready_at`; `TIMEOUT` at its end.
    fn advance(&mut self, serial: &mut u64) {
        let now = Instant::now();
        if self.view.state == "pending" && now >= self.ready_at {
            if self.fail_on_boot {
                self.finish(
                    "failed",
                    proto::GenericStatus::Failure,
                    "the entrypoint failed",
                );
            } else {
                *serial += 1;
                self.view.state = "running".into();
                self.view.task_id = Some(format!("ta-{:06}{}", serial, random_hex(6)));
            }
        }
        if self.view.live() && now >= self.ends_at {
            self.finish("terminated", proto::GenericStatus::Timeout, "");
        }
    }

    fn finish(&mut self, state: &str, status: proto::GenericStatus, exception: &str) {
        self.view.state = state.into();
        self.result = Some(proto::GenericResult {
            status: status as i32,
            exception: exception.into(),
            exitcode: 0,
        });
    }

    fn info(&self) -> proto::SandboxInfo {
        proto::SandboxInfo {
            id: self.view.id.clone(),
            created_at: self.created_at,
            task_info: self.view.task_id.as_ref().map(|t| proto::TaskInfo {
                id: t.clone(),
                started_at: self.created_at,
                finished_at: 0.0,
                result: self.result.clone(),
                sandbox_id: self.view.id.clone(),
            }),
            app_id: self.view.app_id.clone(),
            tags: self.tags(),
            name: String::new(),
            image_id: self.view.image_id.clone(),
            timeout_secs: self.view.timeout_secs,
        }
    }

    fn tags(&self) -> Vec<proto::SandboxTag> {
        self.view
            .tags
            .iter()
            .map(|(k, v)| proto::SandboxTag {
                tag_name: k.clone(),
                tag_value: v.clone(),
            })
            .collect()
    }
}

impl Inner {
    fn advance_all(&mut self) {
        let serial = &mut self.serial;
        let mut ended = Vec::new();
        for entry in self.sandboxes.values_mut() {
            let was_live = entry.view.live();
            entry.advance(serial);
            if was_live && !entry.view.live() {
                ended.extend(entry.view.task_id.clone());
            }
        }
        for task in ended {
            self.kill_task(&task);
        }
    }

    fn kill_task(&self, task: &str) {
        for ((t, _), exec) in &self.execs {
            if t == task {
                exec.kill();
            }
        }
    }

    /// The running sandbox whose task this is.
    fn running_task(&self, task: &str) -> Option<&Entry> {
        self.sandboxes
            .values()
            .find(|e| e.view.task_id.as_deref() == Some(task) && e.view.state == "running")
    }

    /// A creation time strictly after every earlier one (lists page by it).
    fn created_at(&mut self) -> f64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let t = if now > self.last_created_at {
            now
        } else {
            self.last_created_at + 1e-6
        };
        self.last_created_at = t;
        t
    }
}

struct Exec {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<proto::ExitStatus>,
    os_pid: Option<u32>,
    /// The command's stdin (`None` once closed) and how many bytes went in; one writer at a
    /// time, in offset order.
    stdin: Arc<tokio::sync::Mutex<(Option<ChildStdin>, u64)>>,
}

impl Exec {
    fn kill(&self) {
        if let (Some(pid), None) = (self.os_pid, &self.exit) {
            // SAFETY: a plain syscall on a process group this fake started.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// gRPC over HTTP/2
// ---------------------------------------------------------------------------------------

type Body = http_body_util::combinators::BoxBody<Bytes, io::Error>;

/// A failed call: its status.
#[derive(Debug)]
struct Fail {
    code: Code,
    message: String,
    details: Option<Vec<u8>>,
}

fn fail(code: Code, message: impl Into<String>) -> Fail {
    Fail {
        code,
        message: message.into(),
        details: None,
    }
}

/// What a handler answers.
enum Answer {
    /// One message.
    Unary(Vec<u8>),
    /// A server stream: each message as it comes, then its status.
    Stream(mpsc::Receiver<Result<Vec<u8>, Fail>>),
    /// Drop the connection (a lost answer).
    Drop,
}

fn unary(message: impl Message) -> Result<Answer, Fail> {
    Ok(Answer::Unary(message.encode_to_vec()))
}

/// One call as received.
struct Call {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Call {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The request message (one, uncompressed, length-prefixed).
    fn decode<M: Message + Default>(&self) -> Result<M, Fail> {
        let b = &self.body[..];
        if b.len() < 5 || b[0] != 0 {
            return Err(fail(Code::Internal, "expected one uncompressed message"));
        }
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if b.len() != 5 + len {
            return Err(fail(Code::Internal, "the message length does not match"));
        }
        M::decode(&b[5..]).map_err(|e| fail(Code::Internal, format!("undecodable request: {e}")))
    }
}

fn framed(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

fn status_headers(headers: &mut HeaderMap, code: Code, message: &str, details: Option<&[u8]>) {
    headers.insert("grpc-status", HeaderValue::from(code as i32));
    if !message.is_empty() {
        // gRPC's percent-encoding: every byte outside printable ASCII, and `%`.
        const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
        let encoded = percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE).to_string();
        if let Ok(v) = HeaderValue::from_str(&encoded) {
            headers.insert("grpc-message", v);
        }
    }
    if let Some(details) = details {
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
        headers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_str(&b64).unwrap(),
        );
    }
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

fn grpc_response(body: Body) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(body)
        .expect("a response")
}

/// A failure as a trailers-only response.
fn failure_response(f: Fail) -> Response<Body> {
    let mut response = grpc_response(http_body_util::Empty::new().map_err(|n| match n {}).boxed());
    status_headers(
        response.headers_mut(),
        f.code,
        &f.message,
        f.details.as_deref(),
    );
    response
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    status_headers(&mut trailers, Code::Ok, "", None);
    trailers
}

fn stream_response(mut messages: mpsc::Receiver<Result<Vec<u8>, Fail>>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut trailers = ok_trailers();
        while let Some(item) = messages.recv().await {
            match item {
                Ok(m) => {
                    if tx.send(Ok(Frame::data(framed(&m)))).await.is_err() {
                        return;
                    }
                }
                Err(f) => {
                    trailers = HeaderMap::new();
                    status_headers(&mut trailers, f.code, &f.message, None);
                    break;
                }
            }
        }
        let _ = tx.send(Ok(Frame::trailers(trailers))).await;
    });
    grpc_response(ChannelBody(rx).boxed())
}

fn unary_response(message: Vec<u8>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(2);
    tx.try_send(Ok(Frame::data(framed(&message)))).unwrap();
    tx.try_send(Ok(Frame::trailers(ok_trailers()))).unwrap();
    grpc_response(ChannelBody(rx).boxed())
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        connections.spawn(serve(stream, shared.clone()));
        while connections.try_join_next().is_some() {}
    }
}

/// One HTTP/2 connection; a handler asking to drop it ends it at once.
async fn serve(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let cut = Arc::new(Notify::new());
    let service = {
        let cut = cut.clone();
        hyper::service::service_fn(move |request| {
            let (shared, cut) = (shared.clone(), cut.clone());
            async move { Ok::<_, Infallible>(handle(shared, cut, request).await) }
        })
    };
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        _ = cut.notified() => {}
    }
}

async fn handle(
    shared: Arc<Shared>,
    cut: Arc<Notify>,
    request: Request<Incoming>,
) -> Response<Body> {
    let path = request.uri().path().to_string();
    let headers = request.headers().clone();
    let body = match Limited::new(request.into_body(), MAX_MESSAGE)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return failure_response(fail(Code::ResourceExhausted, e.to_string())),
    };
    let call = Call {
        path,
        headers,
        body,
    };
    let answer = match call
        .path
        .strip_prefix("/modal.task_command_router.TaskCommandRouter/")
    {
        Some(method) => router_call(&shared, method, &call).await,
        None => match call.path.strip_prefix("/modal.client.ModalClient/") {
            Some(method) => control_call(&shared, method, &call).await,
            None => Err(fail(
                Code::Unimplemented,
                format!("no service at {}", call.path),
            )),
        },
    };
    match answer {
        Ok(Answer::Unary(m)) => unary_response(m),
        Ok(Answer::Stream(rx)) => stream_response(rx),
        Ok(Answer::Drop) => {
            cut.notify_one();
            std::future::pending().await
        }
        Err(f) => failure_response(f),
    }
}

// ---------------------------------------------------------------------------------------
// The control plane
// ---------------------------------------------------------------------------------------

fn authenticate(shared: &Shared, call: &Call) -> Result<(), Fail> {
    let id = call.header("x-modal-token-id");
    let secret = call.header("x-modal-token-secret");
    if id == Some(shared.token_id.as_str()) && secret == Some(shared.token_secret.as_str()) {
        return Ok(());
    }
    Err(fail(
        Code::Unauthenticated,
        "Token ID is malformed or missing, or the token secret is wrong",
    ))
}

async fn control_call(shared: &Arc<Shared>, method: &str, call: &Call) -> Result<Answer, Fail> {
    authenticate(shared, call)?;
    match method {
        "ClientHello" => unary(proto::ClientHelloResponse::default()),
        "AppGetOrCreate" => app_get_or_create(shared, call.decode()?),
        "SecretGetOrCreate" => secret_get_or_create(shared, call.decode()?),
        "SandboxCreate" => sandbox_create(shared, call).await,
        "SandboxGetTaskId" => sandbox_get_task_id(shared, call.decode()?).await,
        "SandboxWait" => sandbox_wait(shared, call.decode()?).await,
        "SandboxList" => sandbox_list(shared, call.decode()?),
        "SandboxTagsGet" => sandbox_tags_get(shared, call.decode()?),
        "SandboxTagsSet" => sandbox_tags_set(shared, call.decode()?),
        "SandboxTerminate" => sandbox_terminate(shared, call.decode()?),
        "SandboxSnapshotFs" => sandbox_snapshot_fs(shared, call.decode()?).await,
        "ImageFromId" => image_from_id(shared, call.decode()?),
        "ImageDelete" => image_delete(shared, call.decode()?),
        "TaskGetCommandRouterAccess" => router_access(shared, call.decode()?),
        other => Err(fail(
            Code::Unimplemented,
            format!("{other} is not implemented"),
        )),
    }
}

fn not_found(what: &str, id: &str) -> Fail {
    fail(Code::NotFound, format!("{what} {id} not found"))
}

fn app_get_or_create(shared: &Shared, r: proto::AppGetOrCreateRequest) -> Result<Answer, Fail> {
    if r.app_name.is_empty() {
        return Err(fail(Code::InvalidArgument, "app_name is required"));
    }
    let mut inner = shared.lock();
    let key = (r.environment_name.clone(), r.app_name.clone());
    let create = r.object_creation_type == proto::ObjectCreationType::CreateIfMissing as i32;
    let app_id = match inner.apps.get(&key) {
        Some(id) => id.clone(),
        None if create => {
            let id = format!("ap-{}", random_hex(12));
            inner.apps.insert(key, id.clone());
            id
        }
        None => return Err(not_found("App", &r.app_name)),
    };
    unary(proto::AppGetOrCreateResponse { app_id })
}

fn app_exists(inner: &Inner, app_id: &str) -> bool {
    inner.apps.values().any(|a| a == app_id)
}

fn secret_get_or_create(
    shared: &Shared,
    r: proto::SecretGetOrCreateRequest,
) -> Result<Answer, Fail> {
    if r.object_creation_type != proto::ObjectCreationType::AnonymousOwnedByApp as i32 {
        return Err(fail(
            Code::Unimplemented,
            "the fake keeps only app-owned anonymous secrets",
        ));
    }
    let mut inner = shared.lock();
    if !app_exists(&inner, &r.app_id) {
        return Err(not_found("App", &r.app_id));
    }
    let secret_id = format!("st-{}", random_hex(12));
    inner
        .secrets
        .insert(secret_id.clone(), r.env_dict.into_iter().collect());
    unary(proto::SecretGetOrCreateResponse { secret_id })
}

/// The parts of a create checked before the script: the sandbox's view, without ids.
fn validate_create(inner: &Inner, r: &proto::SandboxCreateRequest) -> Result<FakeSandbox, Fail> {
    if !app_exists(inner, &r.app_id) {
        return Err(not_found("App", &r.app_id));
    }
    let d = r
        .definition
        .as_ref()
        .ok_or_else(|| fail(Code::InvalidArgument, "definition is required"))?;
    if !inner.images.contains_key(&d.image_id) {
        return Err(fail(
            Code::NotFound,
            format!("Image {} not found", d.image_id),
        ));
    }
    if d.timeout_secs == 0 || d.timeout_secs > MAX_TIMEOUT_SECS {
        return Err(fail(
            Code::InvalidArgument,
            format!("timeout_secs must be 1..={MAX_TIMEOUT_SECS}"),
        ));
    }
    let mut env = BTreeMap::new();
    for id in &d.secret_ids {
        let secret = inner
            .secrets
            .get(id)
            .ok_or_else(|| not_found("Secret", id))?;
        env.extend(secret.clone());
    }
    let network = d.network_access.clone().unwrap_or_default();
    let kind = proto::NetworkAccessType::try_from(network.network_access_type)
        .map_err(|_| fail(Code::InvalidArgument, "unknown network_access_type"))?;
    if let Some(bad) = network.allowed_cidrs.iter().find(|c| !valid_cidr(c)) {
        return Err(fail(Code::InvalidArgument, format!("invalid CIDR {bad:?}")));
    }
    let kind = match kind {
        proto::NetworkAccessType::Unspecified => "UNSPECIFIED",
        proto::NetworkAccessType::Open => "OPEN",
        proto::NetworkAccessType::Blocked => "BLOCKED",
        proto::NetworkAccessType::Allowlist => "ALLOWLIST",
    };
    Ok(FakeSandbox {
        id: String::new(),
        app_id: r.app_id.clone(),
        tags: r
            .tags
            .iter()
            .map(|t| (t.tag_name.clone(), t.tag_value.clone()))
            .collect(),
        image_id: d.image_id.clone(),
        env,
        network_access_type: kind.into(),
        allowed_cidrs: network.allowed_cidrs,
        allowed_domains: network.allowed_domains,
        block_network: d.block_network,
        entrypoint_args: d.entrypoint_args.clone(),
        state: "pending".into(),
        task_id: None,
        idempotency_key: None,
        timeout_secs: d.timeout_secs,
    })
}

fn valid_cidr(text: &str) -> bool {
    let Some((ip, bits)) = text.split_once('/') else {
        return false;
    };
    match (ip.parse::<std::net::IpAddr>(), bits.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(b)) => b <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(b)) => b <= 128,
        _ => false,
    }
}

/// Throttled: `RESOURCE_EXHAUSTED` with Modal's retry policy in the status details.
fn rate_limited(retry_after_secs: u64) -> Fail {
    let policy = proto::RpcRetryPolicy {
        retry_after_secs: retry_after_secs as f32,
    };
    let status = proto::RpcStatus {
        code: Code::ResourceExhausted as i32,
        message: "rate limit exceeded".into(),
        details: vec![proto::Any {
            type_url: format!("type.modal.com/{}", proto::RETRY_POLICY_TYPE),
            value: policy.encode_to_vec(),
        }],
    };
    Fail {
        code: Code::ResourceExhausted,
        message: "rate limit exceeded".into(),
        details: Some(status.encode_to_vec()),
    }
}

async fn sandbox_create(shared: &Arc<Shared>, call: &Call) -> Result<Answer, Fail> {
    let r: proto::SandboxCreateRequest = call.decode()?;
    let key = call.header("x-idempotency-key").map(str::to_string);
    let (id, outcome) = {
        let mut inner = shared.lock();
        if let Some(id) = key.as_ref().and_then(|k| inner.keys.get(k)).cloned() {
            inner.log.push(CreateOutcome::Replayed);
            return unary(proto::SandboxCreateResponse { sandbox_id: id });
        }
        let view = match validate_create(&inner, &r) {
            Ok(v) => v,
            Err(f) => {
                inner.log.push(CreateOutcome::Rejected);
                return Err(f);
            }
        };
        let outcome = inner.script.pop_front().unwrap_or(CreateOutcome::Ok);
        inner.log.push(outcome);
        match outcome {
            CreateOutcome::Capacity => {
                return Err(fail(
                    Code::ResourceExhausted,
                    "Insufficient capacity to create the sandbox",
                ))
            }
            CreateOutcome::RateLimit => return Err(rate_limited(shared.config.retry_after_secs)),
            CreateOutcome::Outage => {
                return Err(fail(Code::Unavailable, "the Modal server is unavailable"))
            }
            _ => {}
        }
        let id = make_sandbox(shared, &mut inner, view, key, outcome)?;
        (id, outcome)
    };
    shared.bump();
    if outcome == CreateOutcome::TimeoutAfterSend {
        tokio::time::sleep(shared.config.hang).await;
        return Ok(Answer::Drop);
    }
    unary(proto::SandboxCreateResponse { sandbox_id: id })
}

fn make_sandbox(
    shared: &Shared,
    inner: &mut Inner,
    mut view: FakeSandbox,
    key: Option<String>,
    outcome: CreateOutcome,
) -> Result<String, Fail> {
    inner.serial += 1;
    // Modal's shape (`sb-` and 22 letters or digits: the SDK tells V1 from V2 sandboxes by
    // it), its serial first so ids sort in creation order.
    let id = format!("sb-{:06}{}", inner.serial, random_hex(16));
    let root = shared.dir.path().join("sandboxes").join(&id);
    let image = inner.images[&view.image_id].clone();
    copy_tree(&image, &root).map_err(|e| fail(Code::Internal, format!("image copy: {e}")))?;
    let now = Instant::now();
    let config = &shared.config;
    view.id = id.clone();
    view.idempotency_key = key.clone();
    let created_at = inner.created_at();
    inner.sandboxes.insert(
        id.clone(),
        Entry {
            ends_at: now + Duration::from_secs(u64::from(view.timeout_secs)),
            view,
            root,
            created_at,
            ready_at: now + config.boot_delay,
            visible_at: match outcome {
                CreateOutcome::TimeoutAfterSend => now + config.appear_after,
                _ => now,
            },
            fail_on_boot: outcome == CreateOutcome::FailedBeforeRunning,
            result: None,
        },
    );
    if let Some(key) = key {
        inner.keys.insert(key, id.clone());
    }
    Ok(id)
}

/// `cp -a SRC/. DST`: a sandbox's files from an image, or an image from a sandbox.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from.join("."))
        .arg(to)
        .status()?;
    match status.success() {
        true => Ok(()),
        false => Err(io::Error::other(format!("cp exited with {status}"))),
    }
}

/// A poll's wait: its `timeout`, bounded (a negative or absurd one is none).
fn poll_wait(timeout: f32) -> Duration {
    Duration::from_secs_f32(timeout.clamp(0.0, 300.0))
}

async fn sandbox_get_task_id(
    shared: &Arc<Shared>,
    r: proto::SandboxGetTaskIdRequest,
) -> Result<Answer, Fail> {
    let id = r.sandbox_id.clone();
    let wait = poll_wait(r.timeout.unwrap_or(0.0));
    let mut known = true;
    shared
        .wait_until(wait, |inner| match inner.sandboxes.get(&id) {
            Some(e) => e.view.state != "pending",
            None => {
                known = false;
                true
            }
        })
        .await;
    let inner = shared.lock();
    let entry = match (known, inner.sandboxes.get(&id)) {
        (true, Some(e)) => e,
        _ => return Err(not_found("Sandbox", &id)),
    };
    unary(proto::SandboxGetTaskIdResponse {
        task_id: entry.view.task_id.clone(),
        task_result: entry.result.clone(),
    })
}

async fn sandbox_wait(shared: &Arc<Shared>, r: proto::SandboxWaitRequest) -> Result<Answer, Fail> {
    let id = r.sandbox_id.clone();
    if !shared.lock().sandboxes.contains_key(&id) {
        return Err(not_found("Sandbox", &id));
    }
    shared
        .wait_until(poll_wait(r.timeout), |inner| {
            inner.sandboxes.get(&id).is_none_or(|e| e.result.is_some())
        })
        .await;
    let result = shared
        .lock()
        .sandboxes
        .get(&id)
        .and_then(|e| e.result.clone());
    unary(proto::SandboxWaitResponse { result })
}

fn sandbox_list(shared: &Shared, r: proto::SandboxListRequest) -> Result<Answer, Fail> {
    let mut inner = shared.lock();
    inner.advance_all();
    if !r.app_id.is_empty() && !app_exists(&inner, &r.app_id) {
        return Err(not_found("App", &r.app_id));
    }
    let now = Instant::now();
    let mut found: Vec<&Entry> = inner
        .sandboxes
        .values()
        .filter(|e| r.app_id.is_empty() || e.view.app_id == r.app_id)
        .filter(|e| now >= e.visible_at)
        .filter(|e| r.include_finished || e.result.is_none())
        .filter(|e| r.before_timestamp <= 0.0 || e.created_at < r.before_timestamp)
        .filter(|e| {
            r.tags
                .iter()
                .all(|t| e.view.tags.get(&t.tag_name) == Some(&t.tag_value))
        })
        .collect();
    found.sort_by(|a, b| b.created_at.total_cmp(&a.created_at));
    let sandboxes = found.into_iter().take(LIST_PAGE).map(Entry::info).collect();
    unary(proto::SandboxListResponse { sandboxes })
}

fn sandbox_tags_get(shared: &Shared, r: proto::SandboxTagsGetRequest) -> Result<Answer, Fail> {
    let inner = shared.lock();
    let entry = inner
        .sandboxes
        .get(&r.sandbox_id)
        .ok_or_else(|| not_found("Sandbox", &r.sandbox_id))?;
    unary(proto::SandboxTagsGetResponse { tags: entry.tags() })
}

fn sandbox_tags_set(shared: &Shared, r: sdk::SandboxTagsSetRequest) -> Result<Answer, Fail> {
    let mut inner = shared.lock();
    let entry = inner
        .sandboxes
        .get_mut(&r.sandbox_id)
        .ok_or_else(|| not_found("Sandbox", &r.sandbox_id))?;
    entry.view.tags = r
        .tags
        .into_iter()
        .map(|t| (t.tag_name, t.tag_value))
        .collect();
    unary(sdk::Empty {})
}

fn sandbox_terminate(shared: &Shared, r: proto::SandboxTerminateRequest) -> Result<Answer, Fail> {
    let existing_result = {
        let mut inner = shared.lock();
        inner.advance_all();
        let entry = inner
            .sandboxes
            .get_mut(&r.sandbox_id)
            .ok_or_else(|| not_found("Sandbox", &r.sandbox_id))?;
        let existing = entry.result.clone();
        if entry.view.live() {
            entry.finish("terminated", proto::GenericStatus::Terminated, "");
            let task = entry.view.task_id.clone();
            if let Some(task) = task {
                inner.kill_task(&task);
            }
        }
        existing
    };
    shared.bump();
    unary(proto::SandboxTerminateResponse { existing_result })
}

async fn sandbox_snapshot_fs(
    shared: &Arc<Shared>,
    r: proto::SandboxSnapshotFsRequest,
) -> Result<Answer, Fail> {
    let root = {
        let inner = shared.lock();
        let entry = inner
            .sandboxes
            .get(&r.sandbox_id)
            .ok_or_else(|| not_found("Sandbox", &r.sandbox_id))?;
        if entry.view.state != "running" {
            return Err(fail(Code::FailedPrecondition, "the sandbox is not running"));
        }
        entry.root.clone()
    };
    let image_id = format!("im-{}", random_hex(16));
    let dir = shared.dir.path().join("images").join(&image_id);
    let copied = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || copy_tree(&root, &dir))
            .await
            .expect("the copy runs")
    };
    if let Err(e) = copied {
        return Err(fail(Code::Internal, format!("snapshot failed: {e}")));
    }
    shared.lock().images.insert(image_id.clone(), dir);
    unary(proto::SandboxSnapshotFsResponse {
        image_id,
        result: Some(proto::GenericResult {
            status: proto::GenericStatus::Success as i32,
            exception: String::new(),
            exitcode: 0,
        }),
    })
}

fn image_from_id(shared: &Shared, r: sdk::ImageFromIdRequest) -> Result<Answer, Fail> {
    if !shared.lock().images.contains_key(&r.image_id) {
        return Err(fail(
            Code::NotFound,
            format!("Image {} not found", r.image_id),
        ));
    }
    unary(sdk::ImageFromIdResponse {
        image_id: r.image_id,
        metadata: Some(sdk::ImageMetadata::default()),
    })
}

fn image_delete(shared: &Shared, r: proto::ImageDeleteRequest) -> Result<Answer, Fail> {
    if r.image_id == BASE_IMAGE {
        return Err(fail(
            Code::PermissionDenied,
            "the base image cannot be deleted",
        ));
    }
    let dir = shared.lock().images.remove(&r.image_id);
    match dir {
        Some(dir) => {
            let _ = std::fs::remove_dir_all(dir);
            unary(sdk::Empty {})
        }
        None => Err(fail(
            Code::NotFound,
            format!("Image {} not found", r.image_id),
        )),
    }
}

/// A JWT-shaped router token: the fake checks it by lookup, the client reads its `exp`.
fn router_token(task_id: &str) -> String {
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    format!(
        "{}.{}.{}",
        b64(serde_json::json!({"alg": "HS256", "typ": "JWT"})),
        b64(serde_json::json!({"exp": exp, "sub": task_id})),
        random_hex(32)
    )
}

fn router_access(
    shared: &Shared,
    r: proto::TaskGetCommandRouterAccessRequest,
) -> Result<Answer, Fail> {
    let mut inner = shared.lock();
    inner.advance_all();
    if inner.running_task(&r.task_id).is_none() {
        return Err(fail(
            Code::FailedPrecondition,
            format!("task {} is not running", r.task_id),
        ));
    }
    let jwt = router_token(&r.task_id);
    inner.jwts.insert(jwt.clone(), r.task_id);
    unary(proto::TaskGetCommandRouterAccessResponse {
        jwt,
        url: shared.url.clone(),
    })
}

// ---------------------------------------------------------------------------------------
// The command router
// ---------------------------------------------------------------------------------------

/// The task the call's bearer token was issued for, which must be the one it names.
fn router_auth(shared: &Shared, call: &Call, task_id: &str) -> Result<String, Fail> {
    let token = call
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| fail(Code::Unauthenticated, "a bearer token is required"))?;
    let mut inner = shared.lock();
    inner.advance_all();
    let task = inner
        .jwts
        .get(token)
        .cloned()
        .ok_or_else(|| fail(Code::Unauthenticated, "the token is not valid"))?;
    if task != task_id {
        return Err(fail(
            Code::PermissionDenied,
            "the token is for another task",
        ));
    }
    let entry = inner.running_task(&task).ok_or_else(|| {
        fail(
            Code::FailedPrecondition,
            format!("task {task} is not running"),
        )
    })?;
    Ok(entry.view.id.clone())
}

async fn router_call(shared: &Arc<Shared>, method: &str, call: &Call) -> Result<Answer, Fail> {
    match method {
        "TaskExecStart" => {
            let r: proto::TaskExecStartRequest = call.decode()?;
            let sandbox = router_auth(shared, call, &r.task_id)?;
            exec_start(shared, &sandbox, r)
        }
        "TaskExecStdinWrite" => {
            let r: proto::TaskExecStdinWriteRequest = call.decode()?;
            router_auth(shared, call, &r.task_id)?;
            stdin_write(shared, r).await
        }
        "TaskExecStdioRead" => {
            let r: proto::TaskExecStdioReadRequest = call.decode()?;
            router_auth(shared, call, &r.task_id)?;
            stdio_read(shared, r)
        }
        "TaskExecWait" => {
            let r: proto::TaskExecWaitRequest = call.decode()?;
            router_auth(shared, call, &r.task_id)?;
            exec_wait(shared, r).await
        }
        other => Err(fail(
            Code::Unimplemented,
            format!("{other} is not implemented"),
        )),
    }
}

/// Maps the sandbox's `/root` into its host directory.
fn map_root(text: &str, root: &Path) -> String {
    text.replace("/root", &root.join("root").to_string_lossy())
}

fn exec_start(
    shared: &Arc<Shared>,
    sandbox: &str,
    r: proto::TaskExecStartRequest,
) -> Result<Answer, Fail> {
    let key = (r.task_id.clone(), r.exec_id.clone());
    let (root, mut env) = {
        let mut inner = shared.lock();
        if r.exec_id.is_empty() {
            return Err(fail(Code::InvalidArgument, "exec_id is required"));
        }
        // A start sent again (the SDK retries with the same exec id) is the same command.
        if inner.execs.contains_key(&key) {
            return unary(proto::TaskExecStartResponse {});
        }
        inner.commands.push(r.command_args.clone());
        let entry = &inner.sandboxes[sandbox];
        (entry.root.clone(), entry.view.env.clone())
    };
    // The command's environment: the `env` map, then `secret_sources` (inline or by id).
    env.extend(r.env.clone());
    for source in &r.secret_sources {
        if !source.secret_id.is_empty() {
            let inner = shared.lock();
            let secret = inner
                .secrets
                .get(&source.secret_id)
                .ok_or_else(|| not_found("Secret", &source.secret_id))?;
            env.extend(secret.clone());
        }
        if let Some(map) = &source.env {
            env.extend(map.contents.clone());
        }
    }
    let Some((program, args)) = r.command_args.split_first() else {
        return Err(fail(Code::InvalidArgument, "command_args is empty"));
    };
    let workdir = map_root(r.workdir.as_deref().unwrap_or("/root"), &root);
    let mut command = Command::new(program);
    command
        .args(args.iter().map(|a| map_root(a, &root)))
        .current_dir(&workdir)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("HOME", root.join("root"))
        .envs(env.iter().map(|(k, v)| (k.clone(), map_root(v, &root))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| {
        fail(
            Code::InvalidArgument,
            format!("{program} did not start: {e}"),
        )
    })?;
    let exec = Exec {
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit: None,
        os_pid: child.id(),
        stdin: Arc::new(tokio::sync::Mutex::new((child.stdin.take(), 0))),
    };
    shared.lock().execs.insert(key.clone(), exec);
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let timeout = r.timeout_secs.map(|s| Duration::from_secs(u64::from(s)));
    tokio::spawn(supervise(
        shared.clone(),
        key,
        child,
        stdout,
        stderr,
        timeout,
    ));
    unary(proto::TaskExecStartResponse {})
}

/// Collects a command's output and records its end (killed at its timeout).
async fn supervise(
    shared: Arc<Shared>,
    key: (String, String),
    mut child: tokio::process::Child,
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
    timeout: Option<Duration>,
) {
    let readers = [
        stdout.map(|s| tokio::spawn(collect(shared.clone(), key.clone(), Box::new(s), true))),
        stderr.map(|s| tokio::spawn(collect(shared.clone(), key.clone(), Box::new(s), false))),
    ];
    let status = match timeout {
        Some(t) => match tokio::time::timeout(t, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                if let Some(pid) = child.id() {
                    // SAFETY: a plain syscall on a process group this fake started.
                    unsafe {
                        libc::kill(-(pid as i32), libc::SIGKILL);
                    }
                }
                child.wait().await
            }
        },
        None => child.wait().await,
    };
    for reader in readers.into_iter().flatten() {
        let abort = reader.abort_handle();
        if tokio::time::timeout(OUTPUT_GRACE, reader).await.is_err() {
            abort.abort();
        }
    }
    let exit = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => proto::ExitStatus::Code(code),
            (None, Some(signal)) => proto::ExitStatus::Signal(signal),
            (None, None) => proto::ExitStatus::Code(255),
        },
        Err(_) => proto::ExitStatus::Code(255),
    };
    if let Some(e) = shared.lock().execs.get_mut(&key) {
        e.exit = Some(exit);
    }
    shared.bump();
}

async fn collect(
    shared: Arc<Shared>,
    key: (String, String),
    mut pipe: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    stdout: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(e) = shared.lock().execs.get_mut(&key) {
            let sink = if stdout { &mut e.stdout } else { &mut e.stderr };
            sink.extend_from_slice(&buf[..n]);
        }
        shared.bump();
    }
}

fn exec_key(task_id: &str, exec_id: &str) -> (String, String) {
    (task_id.to_string(), exec_id.to_string())
}

async fn stdin_write(
    shared: &Arc<Shared>,
    r: proto::TaskExecStdinWriteRequest,
) -> Result<Answer, Fail> {
    let stdin = {
        let inner = shared.lock();
        let exec = inner
            .execs
            .get(&exec_key(&r.task_id, &r.exec_id))
            .ok_or_else(|| not_found("Exec", &r.exec_id))?;
        exec.stdin.clone()
    };
    let mut stdin = stdin.lock().await;
    let (pipe, written) = &mut *stdin;
    if r.offset > *written {
        return Err(fail(
            Code::OutOfRange,
            format!("stdin offset {} is past {written}", r.offset),
        ));
    }
    let skip = ((*written - r.offset) as usize).min(r.data.len());
    let fresh = &r.data[skip..];
    if !fresh.is_empty() {
        let Some(p) = pipe.as_mut() else {
            return Err(fail(Code::FailedPrecondition, "stdin is closed"));
        };
        // A command that exited no longer reads: what it would have read is dropped.
        let _ = p.write_all(fresh).await;
        *written += fresh.len() as u64;
    }
    if r.eof {
        *pipe = None;
    }
    unary(proto::TaskExecStdinWriteResponse {})
}

fn stdio_read(shared: &Arc<Shared>, r: proto::TaskExecStdioReadRequest) -> Result<Answer, Fail> {
    let key = exec_key(&r.task_id, &r.exec_id);
    if !shared.lock().execs.contains_key(&key) {
        return Err(not_found("Exec", &r.exec_id));
    }
    let stdout = r.file_descriptor == proto::StdioFileDescriptor::Stdout as i32;
    let (tx, rx) = mpsc::channel(4);
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut offset = r.offset as usize;
        let mut rx_tick = shared.tick.subscribe();
        loop {
            let (chunk, ended) = {
                let inner = shared.lock();
                let Some(e) = inner.execs.get(&key) else {
                    return;
                };
                let all = if stdout { &e.stdout } else { &e.stderr };
                let end = all.len().min(offset + READ_CHUNK);
                (all.get(offset..end).map(<[u8]>::to_vec), e.exit.is_some())
            };
            match chunk {
                Some(data) if !data.is_empty() => {
                    offset += data.len();
                    let message = proto::TaskExecStdioReadResponse { data }.encode_to_vec();
                    if tx.send(Ok(message)).await.is_err() {
                        return;
                    }
                    continue;
                }
                _ if ended => return,
                _ => {}
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), rx_tick.changed()).await;
        }
    });
    Ok(Answer::Stream(rx))
}

async fn exec_wait(shared: &Arc<Shared>, r: proto::TaskExecWaitRequest) -> Result<Answer, Fail> {
    let key = exec_key(&r.task_id, &r.exec_id);
    if !shared.lock().execs.contains_key(&key) {
        return Err(not_found("Exec", &r.exec_id));
    }
    let mut exit = None;
    shared
        .wait_until(Duration::from_secs(24 * 3600), |inner| {
            exit = inner.execs.get(&key).and_then(|e| e.exit.clone());
            exit.is_some()
        })
        .await;
    unary(proto::TaskExecWaitResponse { exit_status: exit })
}

// ---------------------------------------------------------------------------------------
// Messages only the SDK sends (sandgate's adapter does not use them)
// ---------------------------------------------------------------------------------------

/// `modal.client` messages of calls the SDK makes and the adapter does not, with the field
/// numbers of the SDK's descriptors.
mod sdk {
    pub use super::proto::SandboxTag;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SandboxTagsSetRequest {
        #[prost(string, tag = "1")]
        pub environment_name: String,
        #[prost(string, tag = "2")]
        pub sandbox_id: String,
        #[prost(message, repeated, tag = "3")]
        pub tags: Vec<SandboxTag>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageFromIdRequest {
        #[prost(string, tag = "1")]
        pub image_id: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageMetadata {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageFromIdResponse {
        #[prost(string, tag = "1")]
        pub image_id: String,
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<ImageMetadata>,
    }
}

/// `len` lowercase hex digits (at most 64).
fn random_hex(len: usize) -> String {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("system randomness");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(64)].to_string()
}
