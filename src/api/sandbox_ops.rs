//! The `/v1` routes of operations on a placed sandbox: exec (streamed), files, lifecycle
//! and snapshots. Each handler parses its request into the operations layer's typed values
//! and renders the result; [`crate::operations`] finds, authorizes (policy layer
//! `sandgate.action` or `sandgate.lifecycle`), checks the state and calls the provider.
//!
//! Exec answers `application/x-ndjson`, one JSON object per line, flushed as output comes:
//! `{"type":"started","exec_id":...}`, then `{"type":"stdout"|"stderr","text":...}` (or
//! `"base64"` when a chunk is not valid UTF-8), then `{"type":"exit","code","signal",
//! "reason"}` (`exited`, `timed_out`, `cancelled`). Closing the connection kills the
//! command's process tree, as does `POST .../exec/{exec_id}/cancel`. An exec started with
//! `"stdin": true` reads what `POST .../exec/{exec_id}/stdin` sends (see [`super::pty`],
//! which also serves terminal sessions).
//!
//! Files: `GET|PUT /v1/sandboxes/{id}/files/content?path=` read and write raw bytes;
//! `GET /v1/sandboxes/{id}/files?path=` lists a directory; `DELETE` with `recursive`
//! removes; `POST .../files/mkdir?path=&parents=` creates a directory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::auth::{ActionCaller, Principal};
use super::body::{JsonBody, RawBody};
use super::extract::{Path, Query, QueryParams};
use super::ApiState;
use crate::error::{Error, Kind};
use crate::operations::authorize::not_found;
use crate::operations::commands::{start_command, ExecRequest};
use crate::operations::files::{file_action, MAX_FILE_BYTES};
use crate::operations::interactive::start_interactive;
use crate::operations::lifecycle::{lifecycle, set_lifetime};
use crate::operations::snapshots::{take_snapshot, SnapshotRequest};
use crate::providers::ops::{ExecEvent, ExecInput, ExitInfo, ExitReason, Lifecycle};
use crate::providers::{InputMode, OpError, Provider};

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/{exec_id}/cancel", post(cancel))
        .route(
            "/v1/sandboxes/{id}/files/content",
            get(read_file)
                .put(write_file)
                .layer(DefaultBodyLimit::max(MAX_FILE_BYTES)),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(list_dir).delete(remove_path),
        )
        .route("/v1/sandboxes/{id}/files/mkdir", post(mkdir))
        .route("/v1/sandboxes/{id}/stop", post(stop))
        .route("/v1/sandboxes/{id}/timeout", post(set_timeout))
        .route("/v1/sandboxes/{id}/start", post(start))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshot))
        .route(
            "/v1/snapshots/{snapshot_id}",
            axum::routing::delete(delete_snapshot),
        )
}

/// Running execs, so one can be cancelled by id.
#[derive(Default)]
pub struct ExecRegistry {
    running: Mutex<HashMap<String, RunningExec>>,
}

pub(super) struct RunningExec {
    pub sandbox_id: String,
    pub cancel: Arc<dyn Fn() + Send + Sync>,
    /// The command's input, when it was started with `stdin` or on a terminal.
    pub input: Option<mpsc::Sender<ExecInput>>,
}

impl ExecRegistry {
    pub(super) fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunningExec>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes an exec from the registry when its response stream ends or is dropped.
pub(super) struct Registered {
    registry: Arc<ExecRegistry>,
    exec_id: String,
}

impl Registered {
    /// Registers a running command under `exec_id` until the returned value is dropped.
    pub(super) fn insert(
        registry: &Arc<ExecRegistry>,
        exec_id: String,
        running: RunningExec,
    ) -> Registered {
        registry.map().insert(exec_id.clone(), running);
        Registered {
            registry: registry.clone(),
            exec_id,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.map().remove(&self.exec_id);
    }
}

// ------------------------------------------------------------------------------ exec

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The program and its arguments (no shell: use `["sh", "-c", "..."]` for one); 1 to
    /// 4096 entries, none containing NUL.
    argv: Vec<String>,
    /// Extra environment variables (the proxy and CA variables cannot be redefined); names
    /// `[A-Za-z_][A-Za-z0-9_]*` (at most 256 bytes), values without NUL.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default its home); at most 4096 bytes, no NUL.
    cwd: Option<String>,
    /// Kill the command's process tree after this many milliseconds (1 to 86400000).
    timeout_ms: Option<u64>,
    /// Give the command a stdin pipe, fed with `POST .../exec/{exec_id}/stdin` (operation
    /// `stdin`); without it stdin is empty (`/dev/null`).
    #[serde(default)]
    stdin: bool,
    /// Run as this user, one the sandbox's pool declares (a local pool's are in its
    /// `sandgate.users` label; default: the pool's default user). An undeclared user is
    /// 400 `invalid_request`; a provider that cannot choose the user answers 501.
    user: Option<String>,
}

impl From<ExecBody> for ExecRequest {
    fn from(body: ExecBody) -> ExecRequest {
        ExecRequest {
            argv: body.argv,
            env: body.env,
            cwd: body.cwd,
            timeout_ms: body.timeout_ms,
            user: body.user,
        }
    }
}

/// Run a command in a sandbox; output streams back as NDJSON.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = ExecBody, content_type = "application/json"),
    responses(
        (status = 200, description = "application/x-ndjson: started, stdout/stderr chunks in order, exit", content_type = "application/x-ndjson"),
        (status = 400, description = "invalid_request: details.field names the field (argv[i], env, env.NAME, cwd, timeout_ms, user, or an unknown field); a user the pool does not declare"),
        (status = 403, description = "policy_denied (layer sandgate.action, operation exec)"),
        (status = 404, description = "not_found"),
        (status = 409, description = "sandbox_state: not running"),
        (status = 501, description = "unsupported by the sandbox's provider"),
    ),
    security(("bearer" = []))
)]
pub async fn exec(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ExecBody>,
) -> Response {
    let stdin = body.stdin;
    match start_exec(&state, &caller, &id, body.into(), stdin).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// Starts the command and streams its events as NDJSON lines, registered for cancellation
/// by exec id until the stream ends or is dropped.
async fn start_exec(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    request: ExecRequest,
    stdin: bool,
) -> Result<Response, Error> {
    let (stream, input) = if stdin {
        let started = start_interactive(&state.ops, caller, id, request, InputMode::Stdin).await?;
        (started.stream, Some(started.input))
    } else {
        (start_command(&state.ops, caller, id, request).await?, None)
    };
    let exec_id = format!("ex-{}", crate::base::ids::random_hex(8));
    let registered = Registered::insert(
        &state.execs,
        exec_id.clone(),
        RunningExec {
            sandbox_id: id.to_string(),
            cancel: stream.cancel.clone(),
            input,
        },
    );
    tracing::info!(sandbox = %id, exec = %exec_id, principal = %caller.principal, "exec started");
    let started = ndjson(&json!({"type": "started", "exec_id": exec_id}));
    let events = futures_util::stream::unfold(
        (stream.events, Some(registered), Some(started)),
        |(mut events, registered, first)| async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, std::convert::Infallible>(first),
                    (events, registered, None),
                ));
            }
            registered.as_ref()?;
            let event = events.recv().await?;
            let line = match event {
                ExecEvent::Stdout(b) => chunk("stdout", &b),
                ExecEvent::Stderr(b) => chunk("stderr", &b),
                ExecEvent::Exit(exit) => ndjson(&exit_json(&exit)),
            };
            Some((Ok(line), (events, registered, None)))
        },
    );
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// An exec's `exit` line (also a terminal session's last text frame).
pub(super) fn exit_json(exit: &ExitInfo) -> Value {
    json!({
        "type": "exit",
        "code": exit.code,
        "signal": exit.signal,
        "reason": match exit.reason {
            ExitReason::Exited => "exited",
            ExitReason::TimedOut => "timed_out",
            ExitReason::Cancelled => "cancelled",
        },
    })
}

fn ndjson(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn chunk(stream: &str, bytes: &[u8]) -> Bytes {
    match std::str::from_utf8(bytes) {
        Ok(text) => ndjson(&json!({"type": stream, "text": text})),
        Err(_) => ndjson(&json!({
            "type": stream,
            "base64": base64::engine::general_purpose::STANDARD.encode(bytes),
        })),
    }
}

/// Cancel a running exec: its whole process tree is killed; its stream ends with
/// `reason: cancelled`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec/{exec_id}/cancel",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), ("exec_id" = String, Path, description = "From the exec's `started` line")),
    responses((status = 202, description = "Cancelled"), (status = 404, description = "not_found: no such running exec"), (status = 501, description = "unsupported: the sandbox's provider cannot cancel a command")),
    security(("bearer" = []))
)]
pub async fn cancel(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path((id, exec_id)): Path<(String, String)>,
) -> Response {
    let detail = crate::operations::OperationDetail::ExecId(&exec_id);
    let authorized =
        crate::operations::commands::authorize_cancel(&state.ops, &caller, &id, detail);
    if let Err(e) = authorized.await {
        return e.into_response();
    }
    let cancel = state
        .execs
        .map()
        .get(&exec_id)
        .filter(|r| r.sandbox_id == id)
        .map(|r| r.cancel.clone());
    match cancel {
        Some(cancel) => {
            cancel();
            (
                StatusCode::ACCEPTED,
                Json(json!({"exec_id": exec_id, "cancelled": true})),
            )
                .into_response()
        }
        None => Error::new(
            Kind::NotFound,
            "not_found",
            format!("no running exec {exec_id:?} in sandbox {id}"),
        )
        .into_response(),
    }
}

// ----------------------------------------------------------------------------- files

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    parents: bool,
}

impl QueryParams for PathQuery {
    const PARAMS: &'static str = "path (required), recursive, parents";
}

type PathParam = Query<PathQuery>;

/// One file operation with the query's path (the whole query is lent to `op`).
async fn file_op<F, T>(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    operation: &'static str,
    q: PathParam,
    op: F,
) -> Result<T, Error>
where
    F: for<'a> FnOnce(
        &'a dyn Provider,
        &'a str,
        &'a PathQuery,
    ) -> crate::providers::BoxFuture<'a, Result<T, OpError>>,
{
    let Query(q) = q;
    file_action(&state.ops, caller, id, operation, &q.path, &q, op).await
}

/// Read a file's bytes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/content",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "Absolute, or relative to the sandbox's home")),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream"), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn read_file(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    q: PathParam,
) -> Response {
    match file_op(&state, &caller, &id, "files.read", q, |a, i, q| {
        a.read_file(i, &q.path)
    })
    .await
    {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Create or replace a file with the request body (any bytes).
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files/content",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "Under the home directory or /tmp")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Written"), (status = 400, description = "invalid_request"), (status = 413, description = "payload_too_large: over 64 MiB")),
    security(("bearer" = []))
)]
pub async fn write_file(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    q: PathParam,
    RawBody(body): RawBody,
) -> Response {
    let data = body.to_vec();
    match file_op(&state, &caller, &id, "files.write", q, move |a, i, q| {
        a.write_file(i, &q.path, data)
    })
    .await
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

/// The answer to `GET /v1/sandboxes/{id}/files` (serialized from this type, so the OpenAPI
/// document's schema is what the gateway answers).
#[derive(Serialize, utoipa::ToSchema)]
pub struct FileList {
    /// The directory listed, as asked.
    pub path: String,
    pub entries: Vec<crate::ops::SandboxEntry>,
}

/// List a directory.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "Directory")),
    responses((status = 200, description = "The directory's entries", body = FileList)),
    security(("bearer" = []))
)]
pub async fn list_dir(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    q: PathParam,
) -> Response {
    let path = q.0.path.clone();
    match file_op(&state, &caller, &id, "files.list", q, |a, i, q| {
        a.list_dir(i, &q.path)
    })
    .await
    {
        Ok(entries) => Json(FileList { path, entries }).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Delete a file, a symlink, an empty directory, or a tree with `recursive=true`.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "What to delete"), ("recursive" = Option<bool>, Query, description = "Delete a directory tree")),
    responses((status = 204, description = "Deleted")),
    security(("bearer" = []))
)]
pub async fn remove_path(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    q: PathParam,
) -> Response {
    match file_op(&state, &caller, &id, "files.delete", q, |a, i, q| {
        a.remove_path(i, &q.path, q.recursive)
    })
    .await
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Create a directory (and its missing parents with `parents=true`).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "Directory to create"), ("parents" = Option<bool>, Query, description = "Create missing parents")),
    responses((status = 201, description = "Created")),
    security(("bearer" = []))
)]
pub async fn mkdir(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    q: PathParam,
) -> Response {
    match file_op(&state, &caller, &id, "files.mkdir", q, |a, i, q| {
        a.mkdir(i, &q.path, q.parents)
    })
    .await
    {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => e.into_response(),
    }
}

// ------------------------------------------------------------------------- lifecycle

/// One lifecycle transition as a `/v1` answer: the sandbox in its new state.
async fn transition(
    state: ApiState,
    caller: Arc<Principal>,
    id: String,
    op: Lifecycle,
) -> Response {
    match lifecycle(&state.ops, &caller, &id, op).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

macro_rules! lifecycle_route {
    ($name:ident, $op:expr, $path:literal, $doc:literal) => {
        #[doc = $doc]
        #[utoipa::path(
                    post,
                    path = $path,
                    tag = "sandboxes",
                    params(("id" = String, Path, description = "Sandbox id")),
                    responses(
                        (status = 200, description = "The sandbox in its new state", body = crate::create::SandboxView),
                        (status = 403, description = "policy_denied (layer sandgate.lifecycle)"),
                        (status = 409, description = "sandbox_state"),
                    ),
                    security(("bearer" = []))
                )]
        pub async fn $name(
            State(state): State<ApiState>,
            ActionCaller(caller): ActionCaller,
            Path(id): Path<String>,
        ) -> Response {
            transition(state, caller, id, $op).await
        }
    };
}

lifecycle_route!(
    stop,
    Lifecycle::Stop,
    "/v1/sandboxes/{id}/stop",
    "Stop: every process is killed; files stay."
);
lifecycle_route!(
    start,
    Lifecycle::Start,
    "/v1/sandboxes/{id}/start",
    "Start a stopped sandbox again."
);
lifecycle_route!(
    pause,
    Lifecycle::Pause,
    "/v1/sandboxes/{id}/pause",
    "Pause: every process is frozen."
);
lifecycle_route!(
    resume,
    Lifecycle::Resume,
    "/v1/sandboxes/{id}/resume",
    "Resume a paused sandbox."
);

/// `POST .../timeout` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutBody {
    /// Seconds from now until the sandbox is deleted (1 to 30 days' worth).
    #[schema(minimum = 1, maximum = 2592000)]
    pub ttl_secs: u64,
}

/// Set when the sandbox's lifetime ends: `ttl_secs` from now, longer or shorter than before
/// (E2B's `set_timeout`). Once it has passed, sandgate deletes the sandbox.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/timeout",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = TimeoutBody,
    responses(
        (status = 200, description = "The sandbox, with its new `expires_ms`", body = crate::create::SandboxView),
        (status = 400, description = "invalid_request"),
        (status = 403, description = "policy_denied (layer sandgate.lifecycle, operation set_timeout)"),
        (status = 404, description = "not_found"),
    ),
    security(("bearer" = []))
)]
pub async fn set_timeout(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TimeoutBody>,
) -> Response {
    match set_lifetime(&state.ops, &caller, &id, body.ttl_secs).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST .../snapshot` body (optional; empty = a provider snapshot).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotBody {
    /// `provider` (default): the provider's own snapshot, restorable only on this pool.
    /// `filesystem`: the files under `paths`, read through the files API into an archive
    /// sandgate keeps, restorable on any provider that writes files (no memory state).
    pub kind: Option<String>,
    /// Roots of a filesystem export (absolute; default `["/home/user"]`).
    pub paths: Option<Vec<String>>,
}

impl SnapshotBody {
    /// An empty body is a provider snapshot; anything else must be this JSON object (the
    /// operations layer checks its values).
    fn parse(bytes: &[u8]) -> Result<SnapshotRequest, Error> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(SnapshotRequest::default());
        }
        let body: SnapshotBody = super::body::parse_json(bytes)?;
        Ok(SnapshotRequest {
            kind: body.kind,
            paths: body.paths,
        })
    }
}

/// Snapshot the sandbox; create a new sandbox from it with `"snapshot": "<id>"`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshot",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = SnapshotBody, description = "Optional: {kind, paths}"),
    responses((status = 201, description = "The snapshot (and, for a filesystem export, what it moved)", body = crate::operations::snapshots::SnapshotTaken)),
    security(("bearer" = []))
)]
pub async fn snapshot(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    RawBody(bytes): RawBody,
) -> Response {
    let result = match SnapshotBody::parse(&bytes) {
        Ok(request) => take_snapshot(&state.ops, &caller, &id, &request).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(body) => (StatusCode::CREATED, Json(body)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Delete a snapshot of your workspace.
#[utoipa::path(
    delete,
    path = "/v1/snapshots/{snapshot_id}",
    tag = "sandboxes",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "not_found")),
    security(("bearer" = []))
)]
pub async fn delete_snapshot(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(snapshot_id): Path<String>,
) -> Response {
    let deleted = crate::operations::snapshots::delete_snapshot(&state.ops, &caller, &snapshot_id);
    match deleted.await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}
