//! The HTTP edge's writer for the domain error: how an [`Error`] is answered on `/v1` and
//! by the egress proxy (the E2B facade maps the same error to E2B's shapes itself).
//!
//! The answer is `{"error": {"code", "message", "details"}}` with `X-Sandgate-Error:
//! <code>` and `Cache-Control: no-store`; a retry with a known delay adds `Retry-After`.
//! The status comes from the error's [`Kind`], one table for every edge; the proxy answers an
//! unauthenticated request with 407 instead of 401, as HTTP proxies do.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use crate::error::{Error, Kind, Retry};

pub const ERROR_HEADER: &str = "x-sandgate-error";

/// The status every edge answers a kind with (the proxy's 407 aside).
pub const fn status(kind: Kind) -> StatusCode {
    match kind {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
        Kind::Refused | Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Gone => StatusCode::GONE,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Misdirected => StatusCode::MISDIRECTED_REQUEST,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Kind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Kind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        Kind::Upstream => StatusCode::BAD_GATEWAY,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// The status the egress proxy answers with: as [`status`], but 407 for missing proxy
/// credentials (clients then send `Proxy-Authorization`).
pub const fn proxy_status(kind: Kind) -> StatusCode {
    match kind {
        Kind::Unauthenticated => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        other => status(other),
    }
}

/// A rendered error: the status an edge chose and the error it answers.
#[derive(Debug, Clone)]
pub struct ErrorReply {
    pub status: StatusCode,
    pub error: Error,
}

impl ErrorReply {
    /// The `/v1` answer for `error`.
    pub fn api(error: Error) -> ErrorReply {
        ErrorReply {
            status: status(error.kind),
            error,
        }
    }

    /// The proxy's answer for `error`.
    pub fn proxy(error: Error) -> ErrorReply {
        ErrorReply {
            status: proxy_status(error.kind),
            error,
        }
    }

    /// `{"error": {"code", "message", "details"}}`.
    pub fn body(&self) -> Value {
        json!({"error": self.error.record()})
    }

    /// Builds the HTTP response with any body type constructible from bytes.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        render(self.status, &self.error)
    }
}

/// The answer for `error` with `status`: the error shape, `X-Sandgate-Error`, `no-store`,
/// and `Retry-After` when the error knows how long to wait. Borrows the error, so the proxy
/// writes a refusal without copying it.
pub fn render<B: From<Bytes>>(status: StatusCode, error: &Error) -> Response<B> {
    let body = json!({"error": error.record()});
    let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(ERROR_HEADER, HeaderValue::from_static(error.code));
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    if let Retry::After(wait) = error.retry {
        // Clients that honour it come back once the cause may have passed.
        let secs = wait.as_secs().max(1);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
