//! The one error shape every sandgate surface answers with:
//! `{"error": {"code", "message", "details"}}` plus an `X-Sandgate-Error: <code>` header.
//! `code` is stable (clients branch on it); `message` is for humans; `details` carries
//! structured context. None of the three ever contains a secret.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

pub const ERROR_HEADER: &str = "x-sandgate-error";

/// The code of a 503 answered while the store cannot be reached (retryable).
pub const STORE_UNAVAILABLE: &str = "store_unavailable";

/// A refusal or failure to report to a client.
#[derive(Debug, Clone)]
pub struct ErrorReply {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Value,
}

impl ErrorReply {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ErrorReply {
            status,
            code,
            message: message.into(),
            details: json!({}),
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message, "details": self.details}})
    }

    /// Builds the HTTP response with any body type constructible from bytes.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let body = Bytes::from(serde_json::to_vec(&self.body()).unwrap_or_default());
        let mut response = Response::new(B::from(body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(ERROR_HEADER, HeaderValue::from_static(self.code));
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        if self.code == STORE_UNAVAILABLE {
            // Clients that honour it come back once the database may be reachable again.
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// An error and its sources on one line, each part once (`a: b: c`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
