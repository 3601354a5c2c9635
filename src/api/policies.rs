//! `GET /v1/policies`: the policy generation serving decisions, its files and layers, the
//! newest reload failure, and every live replica's policy (see `crate::replicas`).
//!
//! Any authenticated caller may read it, whatever its workspace or roles: the report holds
//! file names, layer names and parser messages, never rule text, data or secrets, and a
//! workspace's platform team needs to see why its policy change did not load.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use serde_json::Value;

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
        (status = 200, description = "The serving generation (with its content digest) and the newest reload failure, plus the deployment's live replicas: replica (this one's id), replicas[] {id, role, policy_generation, policy_digest, started_ms, seen_ms, this}, replicas_agree (every live replica serves the same digest) and disagreement (a message when they do not)", body = crate::policy::PolicyReport),
        (status = 401, description = "unauthenticated"),
    ),
    security(("bearer" = []))
)]
pub async fn read(State(state): State<ApiState>, Caller(_caller): Caller) -> Response {
    let mut report = match serde_json::to_value(state.ops.policy.report()) {
        Ok(v) => v,
        Err(e) => return crate::create::internal(e).into_response(),
    };
    let store = state.ops.sandboxes.store();
    match state.replica.view(store, &state.ops.policy).await {
        Ok(Value::Object(replicas)) => {
            if let Some(obj) = report.as_object_mut() {
                obj.extend(replicas);
            }
        }
        Ok(_) => {}
        // The report of this replica is still worth answering without the others.
        Err(e) => {
            tracing::warn!(error = %e, "could not read the replica registry");
            report["replicas"] = Value::Null;
        }
    }
    Json(report).into_response()
}
