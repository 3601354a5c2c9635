//! sandgate's refusals in E2B's shapes, so the SDK raises the exception that matches and
//! its message carries sandgate's code and reasons.
//!
//! | sandgate | control plane (`{code, message}`) | envd Connect code |
//! |---|---|---|
//! | 400 `invalid_request` | 400 | `invalid_argument` |
//! | 401 `unauthenticated` | 401 (`AuthenticationException`) | `unauthenticated` |
//! | 403 `policy_denied`, `forbidden`, ... | 403 | `permission_denied` |
//! | 404 `not_found` | 404 (`NotFoundException` and kin) | `not_found` |
//! | 409 `idempotency_conflict` | 422 with `error_code: idempotency_request_mismatch` | — |
//! | 409 `sandbox_state` | 409 | `failed_precondition` |
//! | 422 `no_eligible_provider` | 422 | `failed_precondition` |
//! | 429 | 429 (`RateLimitException`) | `resource_exhausted` |
//! | 501 `unsupported` | 501 | `unimplemented` |
//! | 502 (provider) | 502 | `unavailable` |
//! | 503 `creation_failed`, `overloaded` | 503 (`ServiceBusyException`) | `unavailable` |
//! | 504 `upstream_timeout` (a provider did not answer in time) | 504 | `deadline_exceeded` |
//! | other 5xx | 500 | `internal` |
//!
//! The message is `<sandgate code>: <message>`, then the policy's reasons (`reasons: a; b`)
//! or each attempt's unmet requirements when there are any. It never holds more than the
//! `/v1` answer would.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::e2b::connect::RpcError;
use crate::e2b::wire;
use crate::error::Error;
use crate::reply;

/// The E2B message of a sandgate refusal.
pub fn message(e: &Error) -> String {
    let mut text = format!("{}: {}", e.code, e.message);
    // Reasons the message does not already say (creation refusals quote the first one).
    let reasons: Vec<&String> = e
        .details
        .reasons
        .iter()
        .flatten()
        .filter(|r| !text.contains(r.as_str()))
        .collect();
    if !reasons.is_empty() {
        let reasons: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
        text.push_str(&format!(" (reasons: {})", reasons.join("; ")));
    }
    let attempts = match e.code {
        "no_eligible_provider" | "creation_failed" => e.details.attempts.as_ref(),
        _ => None,
    };
    let unmet: Vec<String> = attempts
        .map(|a| a.why_each())
        .unwrap_or_default()
        .into_iter()
        .map(|(pool, why)| format!("{pool}: {why}"))
        .collect();
    if !unmet.is_empty() {
        text.push_str(&format!(" (attempts: {})", unmet.join("; ")));
    }
    text
}

/// A control-plane answer for a sandgate refusal.
pub fn api_error(e: &Error) -> Response {
    let (status, error_code) = match (reply::status(e.kind).as_u16(), e.code) {
        (409, "idempotency_conflict") => (422, Some("idempotency_request_mismatch")),
        (s @ (400..=404 | 409 | 422 | 429 | 501..=504), _) => (s, None),
        (s, _) if s >= 500 => (500, None),
        (s, _) => (s, None),
    };
    api_reply(status, error_code, &message(e))
}

/// A control-plane refusal made by the facade itself (before sandgate is asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRefusal {
    pub status: u16,
    pub message: String,
}

impl ApiRefusal {
    pub fn new(status: u16, message: impl Into<String>) -> ApiRefusal {
        ApiRefusal {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiRefusal {
    fn into_response(self) -> Response {
        api_reply(self.status, None, &self.message)
    }
}

/// E2B's control-plane error body with its status.
pub fn api_reply(status: u16, error_code: Option<&str>, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        Json(wire::error_body(code.as_u16(), error_code, message)),
    )
        .into_response()
}

/// The Connect error of a sandgate refusal (envd's RPCs).
pub fn rpc_error(e: &Error) -> RpcError {
    let code = match reply::status(e.kind).as_u16() {
        400 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 | 422 => "failed_precondition",
        429 => "resource_exhausted",
        501 => "unimplemented",
        502 | 503 => "unavailable",
        // A provider that did not answer in time (`upstream_timeout`).
        504 => "deadline_exceeded",
        _ => "internal",
    };
    RpcError::new(code, message(e))
}

/// A unary Connect error answer.
pub fn rpc_reply(e: &RpcError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Attempts, Details, Kind};

    #[test]
    fn a_policy_refusal_names_its_code_and_reasons() {
        let e = Error::new(
            Kind::Refused,
            "policy_denied",
            "policy (action) refused exec",
        )
        .reasons(vec!["curl is not allowed here".into()]);
        assert_eq!(
            message(&e),
            "policy_denied: policy (action) refused exec (reasons: curl is not allowed here)"
        );
        assert_eq!(rpc_error(&e).code, "permission_denied");
    }

    #[test]
    fn unmet_requirements_are_listed_per_pool() {
        let e = Error::new(
            Kind::Unprocessable,
            "no_eligible_provider",
            "no pool can take this",
        )
        .with_details(Details {
            attempts: Some(Attempts::Ruled(vec![sandgate_router::Attempt {
                provider: "local".into(),
                pool: "local".into(),
                unmet_requirements: vec!["gpu".into()],
            }])),
            ..Details::default()
        });
        let quoted =
            Error::new(Kind::Forbidden, "forbidden", "refused: tier").reasons(vec!["tier".into()]);
        assert_eq!(message(&quoted), "forbidden: refused: tier");
        assert!(
            message(&e).ends_with("(attempts: local: gpu)"),
            "{}",
            message(&e)
        );
    }

    #[test]
    fn a_provider_that_did_not_answer_in_time_is_a_deadline_not_an_internal_error() {
        let e = Error::new(
            Kind::UpstreamTimeout,
            "upstream_timeout",
            "daytona could not be reached: operation timed out",
        );
        assert_eq!(rpc_error(&e).code, "deadline_exceeded");
        assert_eq!(api_error(&e).status(), StatusCode::GATEWAY_TIMEOUT);
        let failed = Error::new(Kind::Upstream, "provider_error", "daytona answered 500");
        assert_eq!(rpc_error(&failed).code, "unavailable");
        assert_eq!(api_error(&failed).status(), StatusCode::BAD_GATEWAY);
    }
}
