//! `POST /v1/routes:explain`: every pool with eligibility, unmet requirements, rank keys and
//! band values, and the final order, for a create body, with the same measured context the
//! coordinator would use. Nothing is created. Also `GET /openapi.json`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use utoipa::OpenApi;

use super::auth::Caller;
use super::body::JsonBody;
use super::ApiState;
use crate::create::CreateBody;
use crate::error::{Error, Kind};

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/routes:explain", post(explain))
        .route("/openapi.json", get(openapi))
}

/// Explain routing for a create body.
#[utoipa::path(
    post,
    path = "/v1/routes:explain",
    tag = "routing",
    request_body(content = CreateBody, description = "A create request body", content_type = "application/json"),
    responses(
        (status = 200, description = "Explanation: automatic, baseline, priorities, bands, pools[] {pool, provider, account, eligible, unmet_requirements, tier, rank, metrics, soft_score, free_capacity, position}, order, error", body = sandgate_router::Explanation),
        (status = 400, description = "invalid_request: the create body's rules (see POST /v1/sandboxes)"),
        (status = 401, description = "unauthenticated"),
        (status = 413, description = "payload_too_large: the body is over 1 MiB"),
    ),
    security(("bearer" = []))
)]
pub async fn explain(
    State(state): State<ApiState>,
    Caller(caller): Caller,
    JsonBody(body): JsonBody<Value>,
) -> Response {
    let body = match CreateBody::parse(body) {
        Ok(b) => b,
        Err(e) => {
            return Error::new(
                Kind::Invalid,
                "invalid_request",
                format!("`{}`: {}", e.field, e.message),
            )
            .field(e.field)
            .into_response()
        }
    };
    let ctx = match state
        .ops
        .sandboxes
        // The workspace a create of this body would use (its own, else the caller's).
        .route_context_for(
            Some(&body.request),
            Some(body.workspace.as_deref().unwrap_or(&caller.workspace)),
        )
        .await
    {
        Ok(ctx) => ctx,
        Err(e) => {
            tracing::error!(error = %e, "route context");
            return Error::new(
                Kind::Internal,
                "internal",
                "routing statistics could not be read",
            )
            .into_response();
        }
    };
    let explanation = sandgate_router::explain(state.ops.sandboxes.topology(), &body.request, &ctx);
    Json(explanation).into_response()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandgate",
        description = "Policy-first sandbox gateway API. Every error, including 404 for an unknown endpoint, 405 for a method an endpoint does not take (with Allow) and 413 for a body over the endpoint's limit (1 MiB for JSON, 64 MiB for file uploads), is {\"error\": {\"code\", \"message\", \"details\"}} with an X-Sandgate-Error header carrying the code. JSON bodies are exactly one JSON value (nothing after it), with no duplicate keys and no unknown fields; a refusal names the field (details.field) and never echoes the value."
    ),
    paths(
        super::sandboxes::create,
        super::sandboxes::read,
        super::sandboxes::list,
        super::sandboxes::remove,
        super::events::events,
        super::decisions::list,
        super::decisions::stream,
        super::sandbox_ops::exec,
        super::sandbox_ops::cancel,
        super::pty::pty,
        super::pty::pty_post,
        super::pty::stdin,
        super::ports::port,
        super::watch::watch,
        super::sandbox_ops::read_file,
        super::sandbox_ops::write_file,
        super::sandbox_ops::list_dir,
        super::sandbox_ops::remove_path,
        super::sandbox_ops::mkdir,
        super::sandbox_ops::stop,
        super::sandbox_ops::set_timeout,
        super::sandbox_ops::start,
        super::sandbox_ops::pause,
        super::sandbox_ops::resume,
        super::sandbox_ops::snapshot,
        super::sandbox_ops::delete_snapshot,
        super::delegations::mint,
        super::delegations::list,
        super::delegations::revoke,
        explain,
        super::policies::read,
        super::pools::list,
        super::credentials::list,
        super::credentials::read,
        super::credentials::create,
        super::credentials::replace,
        super::credentials::remove,
        super::identities::env,
        super::healthz,
        super::livez,
        super::readyz,
        super::metrics,
        openapi,
    ),
    components(schemas(
        ErrorDoc,
        ErrorDetailDoc,
        super::sandbox_ops::ExecBody,
        super::delegations::MintBody,
        crate::policy::PolicyReport,
        crate::policy::LayerReport,
        crate::policy::ScopeReport,
        crate::policy::Fallback,
        crate::policy::ReloadError
    )),
    modifiers(&BearerAuth, &ErrorAnswers)
)]
pub struct ApiDoc;

/// The error shape every 4xx and 5xx answer has (`api::error_shape` rewrites any other).
#[derive(utoipa::ToSchema)]
#[schema(as = Error)]
#[allow(dead_code)] // documentation only: replies are built by `Error`
struct ErrorDoc {
    error: ErrorDetailDoc,
}

#[derive(utoipa::ToSchema)]
#[schema(as = ErrorDetail)]
#[allow(dead_code)]
struct ErrorDetailDoc {
    /// Stable, machine-readable code (also in the `X-Sandgate-Error` header), e.g.
    /// `invalid_request`, `not_found`, `policy_denied`, `no_eligible_provider`.
    code: String,
    /// For humans; never echoes a secret or a refused value.
    message: String,
    /// Code-specific facts, e.g. `field` for `invalid_request`.
    #[schema(value_type = Object)]
    details: serde_json::Value,
}

/// Gives every 4xx/5xx answer of every operation the `Error` schema, so a client generator
/// types the error body once instead of once per operation, and makes operation ids unique.
struct ErrorAnswers;

impl utoipa::Modify for ErrorAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{Content, Ref, RefOr};
        for item in openapi.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in ops.into_iter().flatten() {
                // Handler names repeat across modules (`sandboxes::read`,
                // `credentials::read`); OpenAPI wants operation ids unique, so the tag
                // (one per module) prefixes them.
                if let (Some(id), Some(tag)) =
                    (&op.operation_id, op.tags.as_ref().and_then(|t| t.first()))
                {
                    op.operation_id = Some(format!("{tag}_{id}"));
                }
                for (status, answer) in op.responses.responses.iter_mut() {
                    let (RefOr::T(answer), true) =
                        (answer, status.starts_with('4') || status.starts_with('5'))
                    else {
                        continue;
                    };
                    answer.content.insert(
                        "application/json".into(),
                        Content::new(Some(Ref::from_schema_name("Error"))),
                    );
                }
            }
        }
    }
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document, generated from the handlers' annotations.
#[utoipa::path(get, path = "/openapi.json", tag = "service", responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)))]
pub async fn openapi() -> Response {
    Json(ApiDoc::openapi()).into_response()
}
