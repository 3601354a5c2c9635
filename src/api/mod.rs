//! The control-plane HTTP API: `GET /healthz` (liveness plus policy status), `GET /metrics`
//! (Prometheus text format), and the authenticated `/v1` resources.

pub mod auth;
pub mod body;
pub mod credentials;
pub mod delegations;
pub mod identities;
pub mod policies;
pub mod routes;
pub mod sandbox_ops;
pub mod sandboxes;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::credentials::CredentialStore;
use crate::identity::IdentityRegistry;
use crate::policy::PolicyEngine;

#[derive(Clone)]
pub struct ApiState {
    pub policy: Arc<PolicyEngine>,
    pub identities: Arc<IdentityRegistry>,
    pub credentials: Arc<CredentialStore>,
    pub auth: Arc<auth::ApiAuth>,
    pub metrics: PrometheusHandle,
    /// Where sandboxes reach the proxy, for the environment they are given.
    pub proxy_addr: std::net::SocketAddr,
    pub ca_cert_path: std::path::PathBuf,
    /// Sandbox creation (coordinator, store, router topology).
    pub sandboxes: Arc<crate::create::Coordinator>,
    /// Running execs, for cancellation by id.
    pub execs: Arc<sandbox_ops::ExecRegistry>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(credentials::routes())
        .merge(identities::routes())
        .merge(policies::routes())
        .merge(sandboxes::routes())
        .merge(sandbox_ops::routes())
        .merge(delegations::routes())
        .merge(routes::routes())
        .fallback(not_found)
        .with_state(state)
}

/// `status` is `ok`, or `degraded` when the newest policy files failed to load and the
/// previous generation is still serving (decisions are still made, so this stays 200).
async fn healthz(State(state): State<ApiState>) -> Response {
    let policy = state.policy.status();
    let status = if policy.last_error.is_some() {
        "degraded"
    } else {
        "ok"
    };
    Json(json!({
        "status": status,
        "version": env!("CARGO_PKG_VERSION"),
        "policy": policy,
        "identities": state.identities.len(),
    }))
    .into_response()
}

async fn metrics(State(state): State<ApiState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn not_found() -> Response {
    crate::error::ErrorReply::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
        .to_response::<axum::body::Body>()
}
