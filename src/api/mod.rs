//! The control-plane HTTP API: `GET /healthz` (liveness plus policy status), `GET /metrics`
//! (Prometheus text format), and the authenticated `/v1` resources.
//!
//! Every refusal answers the error shape (`{"error": {"code", "message", "details"}}` plus
//! `X-Sandgate-Error`): bodies through [`body::JsonBody`] / [`body::RawBody`], path and
//! query parameters through [`extract::Path`] / [`extract::Query`], an unknown endpoint is
//! 404 `not_found`, a known one with another method 405 `method_not_allowed` (with
//! `Allow`), a body over the limit 413 `payload_too_large`; [`error_shape`] rewrites any other
//! error response that slipped through (an axum or tower rejection) into the shape.

pub mod auth;
pub mod body;
pub mod credentials;
pub mod decisions;
pub mod delegations;
pub mod events;
pub mod extract;
pub mod identities;
pub mod listener;
pub mod policies;
pub mod pools;
pub mod ports;
pub mod pty;
pub mod request_id;
pub mod routes;
pub mod sandbox_ops;
pub mod sandboxes;
pub mod traced;
pub mod watch;

use crate::error::{Details, Error, Kind};
use crate::reply::ErrorReply;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

/// The `/v1` answer for a domain error: its kind's status and the error shape.
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        ErrorReply::api(self).to_response::<axum::body::Body>()
    }
}

/// What the API serves with: the operations layer's context (shared with the E2B facade)
/// plus what only this HTTP edge needs.
#[derive(Clone)]
pub struct ApiState {
    /// Policy, identities, credentials, callers and the coordinator: what operations need.
    pub ops: crate::operations::OpsContext,
    pub metrics: PrometheusHandle,
    /// Where sandboxes reach the proxy, for the environment they are given.
    pub proxy_addr: std::net::SocketAddr,
    pub ca_cert_path: std::path::PathBuf,
    /// Running execs, for cancellation by id.
    pub execs: Arc<sandbox_ops::ExecRegistry>,
    /// What this replica serves (`sandgate serve --role`).
    pub role: crate::config::Role,
    /// This replica in the deployment's registry (`GET /v1/policies` lists them all).
    pub replica: Arc<crate::replicas::Replica>,
    /// Recent decision records (`GET /v1/decisions`, `/v1/decisions/stream`).
    pub decisions: decisions::Decisions,
    /// How the ports gateway names ports, when it serves (`GET .../ports/{port}`).
    pub ports: Option<crate::ports::PortUrls>,
}

pub fn router(state: ApiState) -> Router {
    probes()
        .merge(credentials::routes())
        .merge(identities::routes())
        .merge(policies::routes())
        .merge(pools::routes())
        .merge(sandboxes::routes())
        .merge(sandbox_ops::routes())
        .merge(pty::routes())
        .merge(ports::routes())
        .merge(watch::routes())
        .merge(delegations::routes())
        .merge(events::routes())
        .merge(decisions::routes())
        .merge(routes::routes())
        .fallback(not_found)
        // After every route: it applies to the routes registered so far.
        .method_not_allowed_fallback(method_not_allowed)
        // A route with its own limit (file uploads) overrides this one.
        .layer(DefaultBodyLimit::max(body::MAX_JSON_BYTES))
        .layer(axum::middleware::map_response(error_shape))
        .layer(axum::middleware::map_response(close_after_too_large))
        .layer(axum::middleware::from_fn(traced::request))
        // Outermost: the id is set before the span opens, and on every answer.
        .layer(axum::middleware::from_fn(request_id::layer))
        .with_state(state)
}

/// The routes every role serves: health, the probes and metrics.
fn probes() -> Router<ApiState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// The API of a replica of role `proxy`: the probes and metrics only; every other path is
/// 404 `not_found` (this replica creates and manages nothing).
pub fn probes_router(state: ApiState) -> Router {
    probes()
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(error_shape))
        .layer(axum::middleware::from_fn(request_id::layer))
        .with_state(state)
}

/// Liveness: the process is serving requests (a Kubernetes `livenessProbe`; a failure means
/// restart it). Nothing is checked beyond answering, so a slow database never restarts a
/// replica.
#[utoipa::path(get, path = "/livez", tag = "service", responses((status = 200, description = "{live: true, role}")))]
pub async fn livez(State(state): State<ApiState>) -> Response {
    Json(json!({"live": true, "role": state.role.as_str()})).into_response()
}

/// Readiness: the store answers and a policy generation is loaded (a `readinessProbe` or a
/// load balancer's health check; a failure means send no traffic here for now).
#[utoipa::path(get, path = "/readyz", tag = "service", responses(
    (status = 200, description = "{ready: true, role, policy_generation}"),
    (status = 503, description = "not_ready with details {store, policy_generation}: the store did not answer, or no policy generation is loaded"),
))]
pub async fn readyz(State(state): State<ApiState>) -> Response {
    let generation = state.ops.policy.status().generation;
    let store = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        state.ops.sandboxes.store().ping(),
    )
    .await;
    let store_ok = matches!(store, Ok(Ok(())));
    if let Ok(Err(e)) = &store {
        tracing::warn!(error = %e, "readiness: the store did not answer");
    }
    if store_ok && generation > 0 {
        return Json(
            json!({"ready": true, "role": state.role.as_str(), "policy_generation": generation}),
        )
        .into_response();
    }
    // The store's error is logged, not shown: it may name hosts and users.
    Error::new(
        Kind::Unavailable,
        "not_ready",
        "this replica is not ready: see details",
    )
    .with_details(Details {
        store: Some(if store_ok { "ok" } else { "unreachable" }.into()),
        policy_generation: Some(generation),
        ..Details::default()
    })
    .into_response()
}

/// `status` is `ok`, or `degraded` when the newest policy files failed to load and the
/// previous generation is still serving (decisions are still made, so this stays 200).
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, description = "{status: ok | degraded, ...}: degraded while the newest policy files failed to load and the previous generation serves")))]
pub async fn healthz(State(state): State<ApiState>) -> Response {
    let policy = state.ops.policy.status();
    let status = if policy.last_error.is_some() {
        "degraded"
    } else {
        "ok"
    };
    Json(json!({
        "status": status,
        "version": env!("CARGO_PKG_VERSION"),
        "policy": policy,
        "identities": state.ops.identities.len(),
    }))
    .into_response()
}

/// Prometheus text exposition
#[utoipa::path(get, path = "/metrics", tag = "service", responses((status = 200, description = "Prometheus text exposition")))]
pub async fn metrics(State(state): State<ApiState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn not_found() -> Response {
    Error::not_found("no such endpoint").into_response()
}

/// axum adds the `Allow` header to this answer.
async fn method_not_allowed() -> Response {
    Error::new(
        Kind::MethodNotAllowed,
        "method_not_allowed",
        "this endpoint does not take this method; the Allow header lists the ones it takes",
    )
    .into_response()
}

/// A 413 is answered before the body is read to its end, so the connection cannot carry
/// another request: say so (`Connection: close`). Without it a client may put its next
/// request on this connection while the server closes it, and see it fail with no answer
/// (the SDKs' scenario suites did, now and then, right after a 413).
async fn close_after_too_large(mut response: Response) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        response.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Any 4xx/5xx that is not already in the error shape (no `X-Sandgate-Error`) becomes it,
/// keeping `Allow`, `WWW-Authenticate` and `Retry-After`. Handlers and extractors answer
/// the shape themselves; this is the net under them.
async fn error_shape(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || response.headers().contains_key(crate::reply::ERROR_HEADER)
    {
        return response;
    }
    let (code, message) = match status {
        StatusCode::BAD_REQUEST => ("invalid_request", "the request is malformed"),
        StatusCode::UNAUTHORIZED => ("unauthenticated", "authentication is required"),
        StatusCode::FORBIDDEN => ("forbidden", "the request is not allowed"),
        StatusCode::NOT_FOUND => ("not_found", "no such endpoint"),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "this endpoint does not take this method",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "payload_too_large",
            "the request body is larger than this endpoint accepts",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            "the request body's content type is not accepted",
        ),
        StatusCode::UNPROCESSABLE_ENTITY => ("invalid_request", "the request is malformed"),
        s if s.is_client_error() => ("invalid_request", "the request was refused"),
        StatusCode::SERVICE_UNAVAILABLE => ("overloaded", "the service is unavailable; retry"),
        _ => ("internal", "the request could not be handled"),
    };
    // The status stays the one the layer below chose; the kind is only for the body.
    let reply = ErrorReply {
        status,
        error: Error::new(Kind::Internal, code, message),
    };
    let mut reply = reply.to_response::<axum::body::Body>();
    for name in [header::ALLOW, header::WWW_AUTHENTICATE, header::RETRY_AFTER] {
        if let Some(value) = response.headers().get(&name) {
            reply.headers_mut().insert(name, value.clone());
        }
    }
    reply
}
