//! Operations on a placed sandbox: exec (streamed), files, lifecycle and snapshots.
//!
//! Every operation, in this order:
//! 1. finds the sandbox; one that does not exist and one of a workspace the caller may not
//!    manage answer the same 404, so ids of other workspaces stay private;
//! 2. asks policy: `sandgate.action` for exec and files (`exec`, `files.read`,
//!    `files.write`, `files.list`, `files.delete`, `files.mkdir`), `sandgate.lifecycle`
//!    for `start`, `stop`, `pause`, `resume`, `snapshot`, `set_timeout`, `metrics` (the
//!    E2B facade's `get_metrics`) and `delete`; a
//!    refusal is 403
//!    `policy_denied` with the reasons, and nothing is done;
//! 3. checks the state (`running`, `paused`, `stopped`; else 409 `sandbox_state`);
//! 4. calls the pool's adapter; an operation the provider does not offer is 501
//!    `unsupported`.
//!
//! Exec answers `application/x-ndjson`, one JSON object per line, flushed as output comes:
//! `{"type":"started","exec_id":...}`, then `{"type":"stdout"|"stderr","text":...}` (or
//! `"base64"` when a chunk is not valid UTF-8), then `{"type":"exit","code","signal",
//! "reason"}` (`exited`, `timed_out`, `cancelled`). Closing the connection kills the
//! command's process tree, as does `POST .../exec/{exec_id}/cancel`.
//!
//! Files: `GET|PUT /v1/sandboxes/{id}/files/content?path=` read and write raw bytes;
//! `GET /v1/sandboxes/{id}/files?path=` lists a directory; `DELETE` with `recursive`
//! removes; `POST .../files/mkdir?path=&parents=` creates a directory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::{ActionCaller, Principal};
use super::body::{JsonBody, RawBody};
use super::extract::{Path, Query, QueryParams};
use super::ApiState;
use crate::create::Located;
use crate::error::ErrorReply;
use crate::providers::ops::{ExecEvent, ExitReason, Lifecycle};
use crate::providers::{ExecSpec, OpError, Provider};

/// Largest file accepted by `PUT .../files/content`.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Longest exec timeout a caller may ask for.
const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Most arguments, and most environment variables, an exec may carry.
const MAX_EXEC_ENTRIES: usize = 4096;
/// Longest environment variable name, in bytes.
const MAX_ENV_NAME_BYTES: usize = 256;
/// Longest file path or working directory, in bytes (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

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

struct RunningExec {
    sandbox_id: String,
    cancel: Arc<dyn Fn() + Send + Sync>,
}

impl ExecRegistry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunningExec>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes an exec from the registry when its response stream ends or is dropped.
struct Registered {
    registry: Arc<ExecRegistry>,
    exec_id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.map().remove(&self.exec_id);
    }
}

fn not_found(id: &str) -> ErrorReply {
    ErrorReply::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no sandbox {id:?} in your workspace"),
    )
}

/// An operation on sandbox `id` failed at its provider: the sandbox is checked at once in
/// case the provider ended it (see `create::liveness`), and the error becomes the reply.
fn op_failed(state: &ApiState, id: &str, e: OpError) -> ErrorReply {
    // Not for "unsupported": that is the adapter's own answer, whatever the instance's state
    // (a provider that ended an instance answers 400, 404, 409 or 410, depending on which).
    if e.kind != crate::providers::OpErrorKind::Unsupported {
        state.sandboxes.suspect_lost(id);
    }
    op_error(e)
}

fn op_error(e: OpError) -> ErrorReply {
    let status = match e.kind {
        crate::providers::OpErrorKind::NotFound => StatusCode::NOT_FOUND,
        crate::providers::OpErrorKind::Invalid => StatusCode::BAD_REQUEST,
        crate::providers::OpErrorKind::Conflict => StatusCode::CONFLICT,
        crate::providers::OpErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        crate::providers::OpErrorKind::Provider => StatusCode::BAD_GATEWAY,
    };
    ErrorReply::new(status, e.code(), e.message)
}

/// Steps 1 to 3 of the module contract; returns the sandbox and its adapter.
pub(crate) async fn authorize(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    layer: &'static str,
    operation: &str,
    detail: Value,
    states: &[&str],
) -> Result<(Located, Arc<dyn Provider>), ErrorReply> {
    if let Some(d) = &caller.delegation {
        if d.sandbox_id != id || !d.actions.iter().any(|a| a == operation) {
            return Err(ErrorReply::new(
                StatusCode::FORBIDDEN,
                "delegation_scope",
                format!(
                    "this delegated token allows {} on sandbox {}, not {operation} on {id}",
                    d.actions.join(", "),
                    d.sandbox_id
                ),
            )
            .with_details(json!({"delegation": d.id, "operation": operation})));
        }
    }
    let located = match state.sandboxes.locate(id).await? {
        Some(l) if caller.may_manage(&l.row.workspace) => l,
        _ => return Err(not_found(id)),
    };
    let row = &located.row;
    let labels: Value = serde_json::from_str(&row.labels_json).unwrap_or(json!({}));
    let placement = located.placement.as_ref();
    let mut input = json!({
        "operation": operation,
        "principal": {
            "principal": caller.principal,
            "workspace": caller.workspace,
            "roles": caller.roles,
        },
        "workspace": row.workspace,
        "sandbox": {
            "id": row.id,
            "workspace": row.workspace,
            "labels": labels,
            "state": row.state,
            "pool": placement.map(|p| p.pool.as_str()),
            "provider": placement.map(|p| p.provider.as_str()),
            "account": placement.map(|p| p.account.as_str()),
        },
        "exec": null,
        "file": null,
        "delegation": caller.delegation.as_ref().map(|d| json!({
            "id": d.id,
            "agent": d.agent,
            "actions": d.actions,
            "expires_ms": d.expires_ms,
        })),
    });
    if let (Some(object), Some(extra)) = (input.as_object_mut(), detail.as_object()) {
        for (k, v) in extra {
            object.insert(k.clone(), v.clone());
        }
    }
    let decision = state.policy.evaluate(layer, regorus::Value::from(input));
    if !decision.allowed {
        return Err(ErrorReply::new(
            StatusCode::FORBIDDEN,
            "policy_denied",
            format!("policy ({layer}) refused {operation} on sandbox {id}"),
        )
        .with_details(json!({
            "layer": layer,
            "operation": operation,
            "reasons": decision.reasons,
            "generation": decision.generation,
        })));
    }
    if !states.contains(&row.state.as_str()) {
        return Err(ErrorReply::new(
            StatusCode::CONFLICT,
            "sandbox_state",
            format!(
                "sandbox {id} is {}; {operation} needs it {}",
                row.state,
                states.join(" or ")
            ),
        )
        .with_details(json!({"state": row.state})));
    }
    let Some(adapter) = located.adapter.clone() else {
        return Err(ErrorReply::new(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            format!("sandbox {id} has no provider adapter for {operation}"),
        ));
    };
    Ok((located, adapter))
}

fn instance(located: &Located) -> &str {
    located
        .placement
        .as_ref()
        .map(|p| p.instance_id.as_str())
        .unwrap_or_default()
}

const LIVE: &[&str] = &["running", "paused", "stopped"];
/// Every state (for decisions that do not act on the instance, such as minting).
pub(crate) const ANY_STATE: &[&str] = &[
    "pending",
    "provisioning",
    "reconciling",
    "running",
    "paused",
    "stopped",
    "failed",
    "deleted",
];

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
}

impl ExecBody {
    /// An exec as another front end (the E2B facade) asks for it; checked like a body.
    pub(crate) fn new(
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        timeout_ms: Option<u64>,
    ) -> ExecBody {
        ExecBody {
            argv,
            env,
            cwd,
            timeout_ms,
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
        (status = 400, description = "invalid_request: details.field names the field (argv[i], env, env.NAME, cwd, timeout_ms, or an unknown field)"),
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
    match start_exec(&state, &caller, &id, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

fn invalid(field: &str, message: impl Into<String>) -> ErrorReply {
    ErrorReply::new(StatusCode::BAD_REQUEST, "invalid_request", message.into())
        .with_details(json!({"field": field}))
}

/// Everything about an exec body the types do not say, checked before policy sees it:
/// a program, bounded lists, no NUL in any argument, value or the working directory (the
/// kernel cannot pass one), environment names of `[A-Za-z_][A-Za-z0-9_]*`, a timeout of 1 ms
/// to 24 h. Messages never quote a value (values may hold secrets).
fn check_exec(body: &ExecBody) -> Result<(), ErrorReply> {
    if body.argv.is_empty() {
        return Err(invalid("argv", "`argv` must name a program"));
    }
    if body.argv.len() > MAX_EXEC_ENTRIES {
        return Err(invalid(
            "argv",
            format!("`argv` may have at most {MAX_EXEC_ENTRIES} entries"),
        ));
    }
    if body.argv[0].is_empty() {
        return Err(invalid("argv[0]", "`argv[0]` must name a program"));
    }
    if let Some(i) = body.argv.iter().position(|a| a.contains('\0')) {
        return Err(invalid(
            &format!("argv[{i}]"),
            format!("`argv[{i}]` contains a NUL character"),
        ));
    }
    if body.env.len() > MAX_EXEC_ENTRIES {
        return Err(invalid(
            "env",
            format!("`env` may have at most {MAX_EXEC_ENTRIES} entries"),
        ));
    }
    for (name, value) in &body.env {
        let valid = !name.is_empty()
            && name.len() <= MAX_ENV_NAME_BYTES
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(invalid(
                "env",
                format!(
                    "`env`: a variable name must be 1 to {MAX_ENV_NAME_BYTES} of A-Z, a-z, \
                     0-9 and '_', not starting with a digit"
                ),
            ));
        }
        if value.contains('\0') {
            let field = format!("env.{name}");
            return Err(invalid(
                &field,
                format!("`{field}` contains a NUL character"),
            ));
        }
    }
    if let Some(cwd) = &body.cwd {
        if cwd.is_empty() || cwd.len() > MAX_PATH_BYTES || cwd.contains('\0') {
            return Err(invalid(
                "cwd",
                format!("`cwd` must be 1 to {MAX_PATH_BYTES} bytes without a NUL character"),
            ));
        }
    }
    let timeout = body.timeout_ms.map(Duration::from_millis);
    if timeout.is_some_and(|t| t.is_zero() || t > MAX_EXEC_TIMEOUT) {
        return Err(invalid(
            "timeout_ms",
            "`timeout_ms` must be between 1 and 86400000",
        ));
    }
    Ok(())
}

/// Checks, authorizes (`sandgate.action`, `exec`) and starts a command: the module
/// contract's steps for an exec, shared by every front end (this API's NDJSON stream and
/// the E2B facade's Connect stream).
pub(crate) async fn start_command(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    body: ExecBody,
) -> Result<crate::providers::ExecStream, ErrorReply> {
    check_exec(&body)?;
    let timeout = body.timeout_ms.map(Duration::from_millis);
    // Environment values may hold secrets: policy sees the names only.
    let detail = json!({"exec": {
        "argv": body.argv,
        "cwd": body.cwd,
        "env_names": body.env.keys().collect::<Vec<_>>(),
    }});
    let (located, adapter) =
        authorize(state, caller, id, "action", "exec", detail, &["running"]).await?;
    let stream = adapter
        .exec(
            instance(&located),
            ExecSpec {
                argv: body.argv,
                env: body.env,
                cwd: body.cwd,
                timeout,
            },
        )
        .await
        .map_err(|e| op_failed(state, id, e))?;
    metrics::counter!("sandgate_sandbox_execs_total").increment(1);
    Ok(stream)
}

async fn start_exec(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    body: ExecBody,
) -> Result<Response, ErrorReply> {
    let stream = start_command(state, caller, id, body).await?;
    let exec_id = format!("ex-{}", crate::base::ids::random_hex(8));
    state.execs.map().insert(
        exec_id.clone(),
        RunningExec {
            sandbox_id: id.to_string(),
            cancel: stream.cancel.clone(),
        },
    );
    tracing::info!(sandbox = %id, exec = %exec_id, principal = %caller.principal, "exec started");
    let registered = Registered {
        registry: state.execs.clone(),
        exec_id: exec_id.clone(),
    };
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
                ExecEvent::Exit(exit) => ndjson(&json!({
                    "type": "exit",
                    "code": exit.code,
                    "signal": exit.signal,
                    "reason": match exit.reason {
                        ExitReason::Exited => "exited",
                        ExitReason::TimedOut => "timed_out",
                        ExitReason::Cancelled => "cancelled",
                    },
                })),
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
    responses((status = 202, description = "Cancelled"), (status = 404, description = "not_found: no such running exec")),
    security(("bearer" = []))
)]
pub async fn cancel(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path((id, exec_id)): Path<(String, String)>,
) -> Response {
    let detail = json!({"exec": {"exec_id": exec_id}});
    if let Err(e) = authorize(&state, &caller, &id, "action", "exec", detail, LIVE).await {
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
        None => ErrorReply::new(
            StatusCode::NOT_FOUND,
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

async fn file_op<F, T>(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    operation: &'static str,
    q: PathParam,
    op: F,
) -> Result<T, ErrorReply>
where
    F: for<'a> FnOnce(
        &'a dyn Provider,
        &'a str,
        &'a PathQuery,
    ) -> crate::providers::BoxFuture<'a, Result<T, OpError>>,
{
    let Query(q) = q;
    file_action(state, caller, id, operation, &q.path, &q, op).await
}

/// Authorizes (`sandgate.action`, `operation` with `input.file.path`) and runs one file
/// operation on a live sandbox: shared by every front end.
///
/// A file path is 1 to 4096 bytes without NUL (other bytes are legal in Linux file names,
/// so a file with a newline in its name can still be read or removed).
/// `op` gets the adapter, the instance and `with` (what it needs borrowed, such as paths).
pub(crate) async fn file_action<C, F, T>(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    operation: &'static str,
    path: &str,
    with: &C,
    op: F,
) -> Result<T, ErrorReply>
where
    C: ?Sized,
    F: for<'a> FnOnce(
        &'a dyn Provider,
        &'a str,
        &'a C,
    ) -> crate::providers::BoxFuture<'a, Result<T, OpError>>,
{
    check_path("path", path)?;
    let detail = json!({"file": {"path": path}});
    let (located, adapter) =
        authorize(state, caller, id, "action", operation, detail, LIVE).await?;
    op(adapter.as_ref(), instance(&located), with)
        .await
        .map_err(|e| op_failed(state, id, e))
}

fn check_path(field: &str, path: &str) -> Result<(), ErrorReply> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(invalid(
            field,
            format!("`{field}` must be 1 to {MAX_PATH_BYTES} bytes without a NUL character"),
        ));
    }
    Ok(())
}

/// Authorizes `files.move` (`input.file.path` and `input.file.destination`) and moves a
/// file or directory.
pub(crate) async fn move_path(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    from: &str,
    to: &str,
) -> Result<(), ErrorReply> {
    check_path("path", from)?;
    check_path("destination", to)?;
    let detail = json!({"file": {"path": from, "destination": to}});
    let (located, adapter) =
        authorize(state, caller, id, "action", "files.move", detail, LIVE).await?;
    adapter
        .rename(instance(&located), from, to)
        .await
        .map_err(|e| op_failed(state, id, e))
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

/// List a directory.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ("path" = String, Query, description = "Directory")),
    responses((status = 200, description = "{path, entries: [{name, kind, size, mode, modified_unix}]}", body = Object)),
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
        Ok(entries) => Json(json!({"path": path, "entries": entries})).into_response(),
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

async fn transition(
    state: ApiState,
    caller: Arc<Principal>,
    id: String,
    op: Lifecycle,
) -> Response {
    match lifecycle(&state, &caller, &id, op).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Authorizes (`sandgate.lifecycle`) and performs one transition; the sandbox after it.
pub(crate) async fn lifecycle(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    op: Lifecycle,
) -> Result<Option<Value>, ErrorReply> {
    let (located, adapter) = authorize(
        state,
        caller,
        id,
        "lifecycle",
        op.as_str(),
        json!({}),
        op.from_states(),
    )
    .await?;
    adapter
        .lifecycle(instance(&located), op)
        .await
        .map_err(|e| op_failed(state, id, e))?;
    state
        .sandboxes
        .set_state(id, op.from_states(), op.resulting_state())
        .await?;
    tracing::info!(sandbox = %id, operation = op.as_str(), principal = %caller.principal, "sandbox lifecycle");
    state.sandboxes.view(id).await
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
                        (status = 200, description = "The sandbox in its new state", body = Object),
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
        (status = 200, description = "The sandbox, with its new `expires_ms`", body = Object),
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
    match set_lifetime(&state, &caller, &id, body.ttl_secs).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(&id).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Authorizes (`sandgate.lifecycle`, `set_timeout`) and sets the sandbox's end `ttl_secs`
/// from now; the sandbox after it.
pub(crate) async fn set_lifetime(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    ttl_secs: u64,
) -> Result<Option<Value>, ErrorReply> {
    let max = crate::create::body::MAX_TTL_SECS;
    if ttl_secs == 0 || ttl_secs > max {
        return Err(ErrorReply::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`ttl_secs`: must be 1 to {max} seconds"),
        )
        .with_details(json!({"field": "ttl_secs"})));
    }
    authorize(
        state,
        caller,
        id,
        "lifecycle",
        "set_timeout",
        json!({"timeout": {"ttl_secs": ttl_secs}}),
        &[
            "pending",
            "provisioning",
            "reconciling",
            "running",
            "paused",
            "stopped",
        ],
    )
    .await?;
    tracing::info!(sandbox = %id, ttl_secs, principal = %caller.principal, "sandbox lifetime set");
    state.sandboxes.set_timeout(id, ttl_secs).await
}

/// Authorizes (`sandgate.lifecycle`, `metrics`) and reads what a live sandbox uses now:
/// CPU, memory and disk ([`Provider::usage`]; a provider that cannot tell answers 501
/// `unsupported`). E2B's `get_metrics` through the facade.
pub(crate) async fn usage(
    state: &ApiState,
    caller: &Principal,
    id: &str,
) -> Result<crate::providers::Usage, ErrorReply> {
    let (located, adapter) =
        authorize(state, caller, id, "lifecycle", "metrics", json!({}), LIVE).await?;
    adapter
        .usage(instance(&located))
        .await
        .map_err(|e| op_failed(state, id, e))
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

/// Largest filesystem export, in file bytes (the archive is kept in sandgate's database).
pub const MAX_EXPORT_BYTES: u64 = 64 * 1024 * 1024;

impl SnapshotBody {
    fn parse(bytes: &[u8]) -> Result<SnapshotBody, ErrorReply> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(SnapshotBody::default());
        }
        let body: SnapshotBody = super::body::parse_json(bytes)?;
        let invalid = |field: &str, message: &str| {
            ErrorReply::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                message.to_string(),
            )
            .with_details(json!({"field": field}))
        };
        match body.kind.as_deref() {
            None | Some("provider") if body.paths.is_some() => {
                return Err(invalid(
                    "paths",
                    "`paths` is for a filesystem export (kind = \"filesystem\")",
                ))
            }
            None | Some("provider" | "filesystem") => {}
            Some(_) => return Err(invalid("kind", "`kind` is \"provider\" or \"filesystem\"")),
        }
        let paths = body.paths.as_deref().unwrap_or_default();
        if paths.len() > 16 {
            return Err(invalid("paths", "at most 16 paths"));
        }
        for (i, path) in paths.iter().enumerate() {
            let ok = path.starts_with('/')
                && path.len() <= MAX_PATH_BYTES
                && !path.contains('\0')
                && !path.split('/').any(|c| c == "..");
            if !ok {
                return Err(invalid(
                    &format!("paths[{i}]"),
                    "an absolute path without `..` or NUL",
                ));
            }
        }
        Ok(body)
    }

    fn is_filesystem(&self) -> bool {
        self.kind.as_deref() == Some("filesystem")
    }
}

/// Snapshot the sandbox; create a new sandbox from it with `"snapshot": "<id>"`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshot",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = SnapshotBody, description = "Optional: {kind, paths}"),
    responses((status = 201, description = "{snapshot: {id, kind, size_bytes, pool, ...}, export?: {files, dirs, bytes, skipped}}", body = Object)),
    security(("bearer" = []))
)]
pub async fn snapshot(
    State(state): State<ApiState>,
    ActionCaller(caller): ActionCaller,
    Path(id): Path<String>,
    RawBody(bytes): RawBody,
) -> Response {
    let result = match SnapshotBody::parse(&bytes) {
        Ok(body) => take_snapshot(&state, &caller, &id, &body).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(body) => (StatusCode::CREATED, Json(body)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Authorizes (`sandgate.lifecycle`, `snapshot` with `input.snapshot`) and takes a snapshot
/// of a live sandbox: `{snapshot: {id, kind, ...}, export?}`. Shared by `/v1` and the E2B
/// facade's `create_snapshot`.
pub(crate) async fn take_snapshot(
    state: &ApiState,
    caller: &Principal,
    id: &str,
    body: &SnapshotBody,
) -> Result<Value, ErrorReply> {
    let (located, adapter) = authorize(
        state,
        caller,
        id,
        "lifecycle",
        "snapshot",
        json!({"snapshot": {
            "kind": body.kind.as_deref().unwrap_or("provider"),
            "paths": body.paths,
        }}),
        LIVE,
    )
    .await?;
    let Some(placement) = located.placement.clone() else {
        return Err(not_found(id));
    };
    let mut row = crate::store::snapshots::SnapshotRow {
        id: String::new(),
        workspace: located.row.workspace.clone(),
        sandbox_id: id.to_string(),
        pool: placement.pool,
        provider: placement.provider,
        size_bytes: 0,
        created_ms: crate::base::clock::now_ms(),
        kind: crate::store::snapshots::PROVIDER_SNAPSHOT.into(),
    };
    if body.is_filesystem() {
        let roots = body
            .paths
            .clone()
            .unwrap_or_else(|| vec!["/home/user".into()]);
        let limits = crate::providers::export::Limits {
            max_bytes: MAX_EXPORT_BYTES,
            ..Default::default()
        };
        let (archive, summary) =
            crate::providers::export::export(adapter.as_ref(), instance(&located), &roots, limits)
                .await
                .map_err(|e| op_failed(state, id, e))?;
        row.id = format!("fsx-{}", crate::base::ids::random_hex(12));
        row.kind = crate::store::snapshots::FILESYSTEM_EXPORT.into();
        row.size_bytes = archive.len() as i64;
        state
            .sandboxes
            .store()
            .insert_snapshot(&row, Some(&archive))
            .await
            .map_err(|e| crate::create::internal(format!("recording the export: {e}")))?;
        return Ok(json!({"snapshot": row, "export": summary}));
    }
    let info = adapter
        .snapshot(instance(&located))
        .await
        .map_err(|e| op_failed(state, id, e))?;
    row.id = info.id.clone();
    row.size_bytes = info.size_bytes as i64;
    if let Err(e) = state.sandboxes.store().insert_snapshot(&row, None).await {
        let _ = adapter.delete_snapshot(&info.id).await;
        return Err(crate::create::internal(format!(
            "recording the snapshot: {e}"
        )));
    }
    Ok(json!({"snapshot": row}))
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
    let store = state.sandboxes.store();
    let row = match store.get_snapshot(&snapshot_id).await {
        Ok(Some(row)) if caller.may_manage(&row.workspace) => row,
        Ok(_) => {
            return ErrorReply::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no snapshot {snapshot_id:?} in your workspace"),
            )
            .into_response()
        }
        Err(e) => return crate::create::internal(e).into_response(),
    };
    let held_by_provider = row.kind == crate::store::snapshots::PROVIDER_SNAPSHOT;
    if let Some(adapter) = state
        .sandboxes
        .providers()
        .for_pool(&row.pool)
        .filter(|_| held_by_provider)
    {
        if let Err(e) = adapter.delete_snapshot(&row.id).await {
            return op_error(e).into_response();
        }
    }
    match store.delete_snapshot(&row.id).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => crate::create::internal(e).into_response(),
    }
}
