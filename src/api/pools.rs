//! `GET /v1/pools`: every configured pool with its provider, account, location, isolation
//! modes, egress enforcement, configured and free capacity, the startup latency and creation
//! success routing ranks it by, its recent failures by error class, and its account's last
//! check (see [`crate::create::pools`]).
//!
//! Any authenticated caller may read it, whatever its workspace or roles: it names pools and
//! accounts (configuration every workspace routes over) and aggregate counts, never a
//! sandbox, a workspace's data or a secret.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::auth::Caller;
use super::ApiState;
use crate::error::{Error, Kind};

pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/pools", get(list))
}

/// List every configured pool with its capacity, measurements and account check.
#[utoipa::path(
    get,
    path = "/v1/pools",
    operation_id = "list_pools",
    tag = "routing",
    responses(
        (status = 200, description = "pools[] in name order: {pool, provider, provider_kind, account, geography, region, zone, isolation[], egress, capabilities {environments, image, template, templates, features {<path>: bool}} (the kind's table narrowed to what its adapter does and by the configuration), standby, capacity, free_capacity (capacity minus live), live, startup_latency_ms {median, samples}, creation_success {share, attempts, successes}, recent_failures {<error class>: n} within the window, account_check {status: passed | failed | not_checked | not_applicable, checked_ms, message, error_class}, circuit {state: closed | open | half_open, consecutive_failures, opened_ms, half_open_at_ms, last_failure}}, and window_secs (the stats window)", body = crate::create::pools::PoolsView),
        (status = 401, description = "unauthenticated"),
        (status = 403, description = "delegation_scope: a delegated token cannot read pools"),
        (status = 500, description = "internal: the attempt statistics could not be read"),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>, Caller(_caller): Caller) -> Response {
    match state.ops.sandboxes.pools().await {
        Ok(view) => Json(view).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "pool statistics");
            Error::new(
                Kind::Internal,
                "internal",
                "pool statistics could not be read",
            )
            .into_response()
        }
    }
}
