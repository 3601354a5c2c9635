//! Provider failures as the coordinator's error classes, from a table each adapter declares.
//!
//! Contract:
//! - An adapter's classification is data: an [`ErrorTable`] of provider error codes and HTTP
//!   statuses to [`ErrorClass`] (and statuses to [`OpErrorKind`] for sandbox operations),
//!   applied by the one function here, [`ErrorTable::classify`]. A new adapter writes its
//!   table (what its provider documents), not another `match`.
//! - The order is fixed: a call that never got an answer is `outage` when the connection was
//!   never made (nothing can exist) and `unknown` when it was (reconcile by tag first); then
//!   the provider's error codes, then the adapter's message rule (for providers whose only
//!   signal is prose), then the status table, then `provider_error`.
//! - A failed create is marked `maybe_created` when the request reached the provider and was
//!   not refused ([`HttpFailure::may_have_created`]), unless the answer carries one of the
//!   table's codes that prove nothing runs.

use http::StatusCode;

use super::http::HttpFailure;
use crate::ops::{OpError, OpErrorKind};
use crate::providers::{ErrorClass, ProviderError};

/// A provider error code that decides the class whatever the status (`status: None`) or
/// only with one status.
#[derive(Debug, Clone, Copy)]
pub struct CodeRule {
    pub status: Option<u16>,
    pub code: &'static str,
    pub class: ErrorClass,
}

impl CodeRule {
    pub const fn any(code: &'static str, class: ErrorClass) -> CodeRule {
        CodeRule {
            status: None,
            code,
            class,
        }
    }

    pub const fn with(status: u16, code: &'static str, class: ErrorClass) -> CodeRule {
        CodeRule {
            status: Some(status),
            code,
            class,
        }
    }
}

/// One adapter's failure table. Functions (not closures) so a table is a `static`.
pub struct ErrorTable {
    /// Where the provider puts its error code in the JSON body.
    pub code: fn(&HttpFailure) -> Option<&str>,
    /// Checked first, in order.
    pub codes: &'static [CodeRule],
    /// Codes on a failed create that prove no instance was made (a placement refusal).
    pub no_instance: &'static [&'static str],
    /// A rule on the provider's prose, for providers that signal capacity or quota only there.
    pub message: Option<fn(&HttpFailure) -> Option<ErrorClass>>,
    /// Statuses to classes; any other status is `provider_error`.
    pub statuses: &'static [(u16, ErrorClass)],
    /// Statuses to the kind of a failed sandbox operation; any other is `Provider`.
    pub op_kinds: &'static [(u16, OpErrorKind)],
    /// The message an error carries (the failure's own, unless the provider says more).
    pub describe: fn(&HttpFailure) -> String,
}

/// No error code in the body.
pub fn no_code(_: &HttpFailure) -> Option<&str> {
    None
}

/// The failure's own message (already redacted by the HTTP layer).
pub fn own_message(failure: &HttpFailure) -> String {
    failure.message.clone()
}

impl ErrorTable {
    /// The one classification every hosted adapter applies (see the module docs for the order).
    pub fn classify(&self, failure: &HttpFailure) -> ErrorClass {
        let Some(status) = failure.status else {
            return if failure.sent {
                ErrorClass::Unknown
            } else {
                ErrorClass::Outage
            };
        };
        if let Some(class) = self.code_class(status, failure) {
            return class;
        }
        if let Some(class) = self.message.and_then(|rule| rule(failure)) {
            return class;
        }
        lookup(self.statuses, status).unwrap_or(ErrorClass::ProviderError)
    }

    fn code_class(&self, status: StatusCode, failure: &HttpFailure) -> Option<ErrorClass> {
        let code = (self.code)(failure)?;
        self.codes
            .iter()
            .find(|r| r.code == code && r.status.is_none_or(|s| s == status.as_u16()))
            .map(|r| r.class)
    }

    /// The coordinator's error for a failed call, `Retry-After` kept.
    pub fn provider_error(&self, failure: HttpFailure) -> ProviderError {
        let mut error = ProviderError::new(self.classify(&failure), (self.describe)(&failure));
        error.retry_after = failure.retry_after;
        error
    }

    /// A failed create call: [`ErrorTable::provider_error`], marked `maybe_created` unless the
    /// answer proves nothing runs (a refusal, or one of the table's `no_instance` codes).
    pub fn create_error(&self, failure: HttpFailure) -> ProviderError {
        let refused = (self.code)(&failure).is_some_and(|c| self.no_instance.contains(&c));
        let maybe_created = failure.may_have_created() && !refused;
        let mut error = self.provider_error(failure);
        error.maybe_created = maybe_created;
        error
    }

    /// A create the provider accepted but whose answer cannot be read: which instance it
    /// made is unknown, so the coordinator reconciles by tag.
    pub fn unreadable_create(&self, failure: HttpFailure) -> ProviderError {
        let mut error = self.provider_error(failure);
        error.class = ErrorClass::Unknown;
        error
    }

    /// The kind of a failed sandbox operation: `TimedOut` when the call got no answer
    /// within the adapter's timeout, else by the status the provider answered.
    pub fn op_kind(&self, failure: &HttpFailure) -> OpErrorKind {
        if failure.timed_out && failure.status.is_none() {
            return OpErrorKind::TimedOut;
        }
        failure
            .status
            .and_then(|s| lookup(self.op_kinds, s))
            .unwrap_or(OpErrorKind::Provider)
    }

    /// A failed sandbox operation (exec, files, lifecycle).
    pub fn op_error(&self, failure: HttpFailure) -> OpError {
        OpError::new(self.op_kind(&failure), (self.describe)(&failure))
    }
}

fn lookup<T: Copy>(table: &[(u16, T)], status: StatusCode) -> Option<T> {
    table
        .iter()
        .find(|(s, _)| *s == status.as_u16())
        .map(|(_, v)| *v)
}

/// An attempt that made an instance which did not become usable: it names the instance so
/// the coordinator deletes it, and nothing else of it is unknown.
pub fn left_behind(id: &str, class: ErrorClass, message: String) -> ProviderError {
    ProviderError {
        class,
        message,
        instance_id: Some(id.to_string()),
        retry_after: None,
        maybe_created: false,
    }
}

/// `left_behind` as `failed_before_running`, the usual case.
pub fn failed_before_running(id: &str, message: String) -> ProviderError {
    left_behind(id, ErrorClass::FailedBeforeRunning, message)
}

/// A test failure as the HTTP layer builds it (the adapters' table tests share it).
#[cfg(test)]
pub fn test_failure(status: Option<u16>, body: serde_json::Value, sent: bool) -> HttpFailure {
    HttpFailure {
        status: status.map(|s| StatusCode::from_u16(s).unwrap()),
        body: Some(body),
        retry_after: None,
        sent,
        timed_out: false,
        message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(f: &HttpFailure) -> Option<&str> {
        f.field("code")
    }

    static TABLE: ErrorTable = ErrorTable {
        code,
        codes: &[
            CodeRule::any("full", ErrorClass::Capacity),
            CodeRule::with(410, "gone", ErrorClass::Unsupported),
        ],
        no_instance: &["full"],
        message: None,
        statuses: &[(429, ErrorClass::RateLimit), (404, ErrorClass::Unsupported)],
        op_kinds: &[(404, OpErrorKind::NotFound)],
        describe: own_message,
    };

    #[test]
    fn codes_then_statuses_then_provider_error() {
        let f = |s, b| test_failure(Some(s), b, true);
        assert_eq!(
            TABLE.classify(&f(503, json!({"code": "full"}))),
            ErrorClass::Capacity
        );
        assert_eq!(
            TABLE.classify(&f(410, json!({"code": "gone"}))),
            ErrorClass::Unsupported
        );
        assert_eq!(
            TABLE.classify(&f(409, json!({"code": "gone"}))),
            ErrorClass::ProviderError
        );
        assert_eq!(TABLE.classify(&f(429, json!({}))), ErrorClass::RateLimit);
        assert_eq!(
            TABLE.classify(&f(500, json!({}))),
            ErrorClass::ProviderError
        );
        assert_eq!(
            TABLE.classify(&test_failure(None, json!(null), false)),
            ErrorClass::Outage
        );
        assert_eq!(
            TABLE.classify(&test_failure(None, json!(null), true)),
            ErrorClass::Unknown
        );
        assert!(
            !TABLE
                .create_error(f(503, json!({"code": "full"})))
                .maybe_created
        );
        assert!(TABLE.create_error(f(503, json!({}))).maybe_created);
        assert!(!TABLE.create_error(f(429, json!({}))).maybe_created);
        assert_eq!(
            TABLE.op_error(f(404, json!({}))).kind,
            OpErrorKind::NotFound
        );
        assert_eq!(
            TABLE.op_error(f(500, json!({}))).kind,
            OpErrorKind::Provider
        );
    }

    #[test]
    fn an_operation_unanswered_in_time_is_timed_out_and_a_refused_one_is_not() {
        let mut timed_out = test_failure(None, json!(null), true);
        timed_out.timed_out = true;
        assert_eq!(TABLE.op_error(timed_out).kind, OpErrorKind::TimedOut);
        // A connection refused or reset is the provider failing, not slowness.
        let refused = test_failure(None, json!(null), false);
        assert_eq!(TABLE.op_error(refused).kind, OpErrorKind::Provider);
    }
}
