//! The domain error: what failed, whose fault it is and whether retrying can help, as data.
//!
//! Contract:
//! - Everything below the HTTP edges (the create path, sandbox operations, credentials, the
//!   address guard, the egress phases) fails with [`Error`]. It becomes an HTTP answer only
//!   at an edge: `/v1` JSON and the proxy's denials through [`crate::reply`], the E2B
//!   facade's shapes in `facade::errors`. An edge reads the kind, the reasons and the
//!   attempts as typed fields; no edge parses JSON it built.
//! - `code` is stable (clients branch on it; every code in use is the API contract and keeps
//!   its status); `message` is for humans; [`Details`] is the structured context an answer
//!   shows, field by field. None of them ever holds a secret.
//! - [`Kind`] decides the HTTP status at the edges (one table, [`crate::reply::status`]);
//!   [`Blame`] and [`Retry`] default from the kind and are set where the source knows better
//!   (an egress refusal blames the sandbox; an upstream failure's class says if a retry can
//!   help).
//!
//! This module imports nothing from the crate but [`crate::base`]: every layer may use it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::Layer;

/// The code of a 503 answered while the store cannot be reached (retryable).
pub const STORE_UNAVAILABLE: &str = "store_unavailable";

/// What failed. Each kind has one HTTP status at the edges (in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Input that cannot be taken as it is; `details.field` names where (400).
    Invalid,
    /// No valid credentials (401 on the API, 407 at the proxy).
    Unauthenticated,
    /// A policy layer (or a rule standing for one) refused; `details.reasons` says why (403).
    Refused,
    /// The caller may not do this whatever policy says: scope, ownership, state of its
    /// identity (403).
    Forbidden,
    /// No such thing, or not visible to this caller (404).
    NotFound,
    /// The method is not one this endpoint serves (405).
    MethodNotAllowed,
    /// The thing exists but its current state does not allow the operation (409).
    Conflict,
    /// The thing existed and is gone for good (410).
    Gone,
    /// A body over its limit; `details.limit` (413).
    TooLarge,
    /// The request names another destination than the connection it came on (421).
    Misdirected,
    /// Well formed, but nothing can serve it: no eligible pool (with `details.attempts`),
    /// or a provider refusing the request itself (422).
    Unprocessable,
    /// The caller's own share is used up; retry later (429).
    RateLimited,
    /// sandgate failed; the cause is logged, not shown (500).
    Internal,
    /// The operation is not offered here (501).
    Unsupported,
    /// A service past sandgate (an origin, a provider, a resolver) failed (502).
    Upstream,
    /// sandgate cannot serve now: overloaded, not ready, its store unreachable, a create
    /// that found no pool able to place it (503).
    Unavailable,
    /// A service past sandgate did not answer in time (504).
    UpstreamTimeout,
}

impl Kind {
    /// Whose fault a failure of this kind usually is.
    pub const fn default_blame(self) -> Blame {
        match self {
            Kind::Invalid
            | Kind::Unauthenticated
            | Kind::Refused
            | Kind::Forbidden
            | Kind::NotFound
            | Kind::MethodNotAllowed
            | Kind::Conflict
            | Kind::TooLarge
            | Kind::Misdirected
            | Kind::Unprocessable
            | Kind::RateLimited => Blame::Caller,
            Kind::Gone | Kind::Upstream | Kind::UpstreamTimeout => Blame::Upstream,
            Kind::Internal | Kind::Unsupported | Kind::Unavailable => Blame::Sandgate,
        }
    }

    /// Whether the same request sent again can succeed, as far as the kind alone says.
    pub const fn default_retry(self) -> Retry {
        match self {
            Kind::RateLimited
            | Kind::Unavailable
            | Kind::Upstream
            | Kind::UpstreamTimeout
            | Kind::Conflict => Retry::Yes,
            _ => Retry::No,
        }
    }
}

/// Whose fault a failure is: who has to change something for it to go away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Blame {
    /// The API caller: its input, its rights, its request's requirements.
    Caller,
    /// The workload inside a sandbox: what it sent through the proxy.
    Sandbox,
    /// A provider, an origin, a token endpoint, a resolver.
    Upstream,
    /// sandgate itself: a fault, a limit, its store.
    Sandgate,
}

/// Whether retrying the same request can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    No,
    Yes,
    /// Yes, not before this long (answered as `Retry-After`).
    After(Duration),
}

impl Retry {
    pub const fn can_help(self) -> bool {
        !matches!(self, Retry::No)
    }
}

/// A sandgate failure, with its blame and retryability.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Error {
    pub code: &'static str,
    pub kind: Kind,
    pub message: String,
    pub blame: Blame,
    pub retry: Retry,
    /// Boxed: most results are `Ok`, and an `Err` should not make every one of them large.
    pub details: Box<Details>,
}

impl Error {
    pub fn new(kind: Kind, code: &'static str, message: impl Into<String>) -> Error {
        Error {
            code,
            kind,
            message: message.into(),
            blame: kind.default_blame(),
            retry: kind.default_retry(),
            details: Box::default(),
        }
    }

    /// 400 `invalid_request` naming the field at fault.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::new(Kind::Invalid, "invalid_request", message).with_details(Details {
            field: Some(field.into()),
            ..Details::default()
        })
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(Kind::NotFound, "not_found", message)
    }

    /// 500 `internal` with a message that says nothing of the cause (log the cause).
    pub fn internal() -> Error {
        Error::new(
            Kind::Internal,
            "internal",
            "the sandbox operation could not be completed",
        )
    }

    /// 503 `store_unavailable`: the database did not answer within `[store]
    /// acquire_timeout_ms`. The call that failed committed nothing, so the same request (and
    /// the same `Idempotency-Key`) is safe to send again, after a second.
    pub fn store_unavailable() -> Error {
        Error::new(
            Kind::Unavailable,
            STORE_UNAVAILABLE,
            "the store is unreachable; retry (the same Idempotency-Key is safe to send again)",
        )
        .retry(Retry::After(Duration::from_secs(1)))
    }

    /// A refusal by a policy layer, with its reasons; `details.layer` is set by the caller
    /// where the answer names the layer.
    pub fn refused(code: &'static str, message: impl Into<String>, reasons: Vec<String>) -> Error {
        Error::new(Kind::Refused, code, message).with_details(Details {
            reasons: Some(reasons),
            ..Details::default()
        })
    }

    pub fn with_details(mut self, details: Details) -> Error {
        *self.details = details;
        self
    }

    /// Names the input at fault (`details.field`).
    pub fn field(mut self, field: impl Into<String>) -> Error {
        self.details.field = Some(field.into());
        self
    }

    /// Says why (`details.reasons`).
    pub fn reasons(mut self, reasons: Vec<String>) -> Error {
        self.details.reasons = Some(reasons);
        self
    }

    /// Names the destination (`details.host`, `details.port`).
    pub fn destination(mut self, host: &str, port: u16) -> Error {
        self.details.host = Some(host.to_string());
        self.details.port = Some(port);
        self
    }

    /// Names the limit reached (`details.limit`).
    pub fn limit(mut self, limit: u64) -> Error {
        self.details.limit = Some(limit);
        self
    }

    pub fn blame(mut self, blame: Blame) -> Error {
        self.blame = blame;
        self
    }

    pub fn retry(mut self, retry: Retry) -> Error {
        self.retry = retry;
        self
    }

    /// The reasons the error carries, else its message: what a decision record shows.
    pub fn reasons_or_message(&self) -> Vec<String> {
        self.details
            .reasons
            .clone()
            .unwrap_or_else(|| vec![self.message.clone()])
    }

    /// The error as the shape stored with a failed sandbox and shown by the API:
    /// `{"code", "message", "details"}` (the inner object of the error body).
    pub fn record(&self) -> Record {
        Record {
            code: self.code.to_string(),
            message: self.message.clone(),
            details: (*self.details).clone(),
        }
    }
}

impl Record {
    /// The form a failed sandbox's error is stored in and shown as (`GET` shows `error`):
    /// `{"error": {"code", "message", "details"}}`, the body the create answered.
    pub fn to_stored(&self) -> String {
        serde_json::json!({ "error": self }).to_string()
    }

    /// Reads [`Record::to_stored`]'s form back; `None` when it is not that form.
    pub fn from_stored(text: &str) -> Option<Record> {
        #[derive(Deserialize)]
        struct Stored {
            error: Record,
        }
        serde_json::from_str::<Stored>(text).ok().map(|s| s.error)
    }
}

/// An error as stored and shown: code, message and details, without the kind (a stored
/// code may be one this build no longer makes; the reader decides what it means now).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub details: Details,
}

/// The structured context of an error, as its answer shows it under `details`. Each field
/// is shown only when set, under its own name; an error sets the ones its code documents.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Details {
    /// The input at fault: a JSON path, a header, a query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Why a layer refused, one line per rule that fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<Layer>,
    /// The decision log record of the refusal (to find it with the platform team).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<String>,
    /// One line saying what happened and what to do about it, for an agent to act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The policy generation that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<String>,
    /// A destination: host and port, the address it resolved to, the name a request gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named: Option<String>,
    /// A credential by name and type (never its secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub credential_type: Option<String>,
    /// The limit that was reached (bytes, tunnels, events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The state that did not allow the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// Where a sandbox was placed or tried: pool, provider, instance, what the provider said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    /// What kind of thing (a snapshot's kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The pools a create ruled out or tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Attempts>,
    /// Readiness: the store's reachability and the serving policy generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<u64>,
}

impl Details {
    /// A destination's host and port.
    pub fn destination(host: &str, port: u16) -> Details {
        Details {
            host: Some(host.to_string()),
            port: Some(port),
            ..Details::default()
        }
    }

    pub fn with_reasons(mut self, reasons: Vec<String>) -> Details {
        self.reasons = Some(reasons);
        self
    }
}

/// The pools a create ruled out or tried, in one of the shapes the API has always shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Attempts {
    /// Ruled out by the router before any attempt: `no_eligible_provider`.
    Ruled(Vec<sandgate_router::Attempt>),
    /// Tried, as the sandbox's attempt records show them.
    Recorded(Vec<AttemptRecord>),
    /// Tried, one line each, as stored with a create that ran out of pools.
    Summary(Vec<AttemptSummary>),
}

impl Attempts {
    /// Each attempt's pool and what stopped it there: unmet requirements, or the message.
    pub fn why_each(&self) -> Vec<(String, String)> {
        match self {
            Attempts::Ruled(a) => a
                .iter()
                .map(|a| (a.pool.clone(), a.unmet_requirements.join(", ")))
                .collect(),
            Attempts::Recorded(a) => a
                .iter()
                .filter_map(|a| Some((a.pool.clone(), a.message.clone()?)))
                .collect(),
            Attempts::Summary(_) => Vec::new(),
        }
    }
}

/// One create attempt as the API shows it (`GET /v1/sandboxes/{id}`'s `attempts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptRecord {
    pub id: String,
    pub seq: i64,
    pub pool: String,
    pub provider: String,
    pub account: String,
    pub state: String,
    pub outcome: Option<String>,
    pub error_class: Option<String>,
    pub message: Option<String>,
    pub instance_id: Option<String>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    pub duration_ms: Option<i64>,
    /// Each retry on the attempt's pool: `{at_ms, error_class, message, wait_ms}`.
    pub retries: Vec<RetryRecord>,
}

/// One retry on an attempt's pool, as stored by `Store::set_attempt_retries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RetryRecord {
    pub at_ms: i64,
    pub error_class: String,
    pub message: String,
    pub wait_ms: u64,
}

/// One tried pool in a `creation_failed` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptSummary {
    pub pool: String,
    pub provider: String,
    pub account: String,
    pub error_class: Option<String>,
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

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
