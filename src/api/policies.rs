//! `GET /v1/policies`: the policy generation serving decisions, its files and layers, and the
//! newest reload failure.
//!
//! Any authenticated caller may read it, whatever its workspace or roles: the report holds
//! file names, layer names and parser messages, never rule text, data or secrets, and a
//! workspace's platform team needs to see why its policy change did not load.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::auth::Caller;
use super::ApiState;

pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/policies", get(read))
}

/// The loaded policy: generation, files, layers present and missing, last reload error.
#[utoipa::path(
    get,
    path = "/v1/policies",
    tag = "policy",
    responses(
        (status = 200, description = "The serving generation and the newest reload failure", body = crate::policy::PolicyReport),
        (status = 401, description = "unauthenticated"),
    ),
    security(("bearer" = []))
)]
pub async fn read(State(state): State<ApiState>, Caller(_caller): Caller) -> Response {
    Json(state.policy.report()).into_response()
}
