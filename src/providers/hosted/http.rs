//! The one small HTTP layer every hosted-provider adapter shares.
//!
//! Contract:
//! - Every URL is the account's `base_url` plus a path: a self-hosted deployment and a test
//!   fake plug in the same way as the public API.
//! - The API key is sent as the provider wants it (a named header or `Authorization:
//!   Bearer`) and never appears in an error: messages are built from statuses and the
//!   provider's own error fields, and anything that still contains the key is redacted.
//! - Timeouts: a connect timeout and a whole-request timeout per call.
//! - Idempotent calls (reads, deletes) are retried with exponential backoff and jitter on
//!   transport failures, 429 and 502/503/504, honouring `Retry-After`; other calls are sent
//!   once, and a failure tells whether the request may have reached the provider (`sent`),
//!   which is what decides between "advance" and "reconcile first".
//! - A 404 on a read or a delete means the thing is absent ([`absent_ok`],
//!   [`ProviderHttp::read_optional`]): `None` for a read, success for a delete.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use http::StatusCode;
use reqwest::{Method, RequestBuilder, Response};

use crate::credentials::Secret;

/// How the API key travels.
#[derive(Debug, Clone, Copy)]
pub enum Auth {
    /// A header of its own, e.g. E2B's `X-API-Key`.
    Header(&'static str),
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `Bearer <key>` in a header of its own, e.g. Blaxel's `X-Blaxel-Authorization`.
    NamedBearer(&'static str),
}

/// A failed provider call, secrets removed.
#[derive(Debug, Clone)]
pub struct HttpFailure {
    /// The provider's status, when it answered.
    pub status: Option<StatusCode>,
    /// Its JSON error body, when it sent one.
    pub body: Option<serde_json::Value>,
    /// What `Retry-After` asked for.
    pub retry_after: Option<Duration>,
    /// Whether the request may have reached the provider (false only when it surely did
    /// not: the connection was never made).
    pub sent: bool,
    /// Whether the call timed out.
    pub timed_out: bool,
    pub message: String,
}

impl HttpFailure {
    /// A string field of the JSON error body.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.body.as_ref()?.get(name)?.as_str()
    }

    /// Whether a create answered this way may still have made its instance: the request
    /// reached the provider and got a server error (a 5xx may come from a proxy in front of a
    /// create that went through, or from a provider that failed after applying it) or no
    /// answer at all. A 4xx is a refusal: nothing was made.
    pub fn may_have_created(&self) -> bool {
        self.sent && self.status.is_none_or(|s| s.is_server_error())
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110 §10.2.3); a date in the past is
/// no wait.
pub fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// An authenticated client for one provider account.
#[derive(Clone)]
pub struct ProviderHttp {
    client: reqwest::Client,
    provider: &'static str,
    base: String,
    auth: Auth,
    key: Secret,
    timeout: Duration,
}

impl std::fmt::Debug for ProviderHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderHttp")
            .field("provider", &self.provider)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ProviderHttp {
    /// `tls` is the upstream trust sandgate already uses (web roots plus extra CAs).
    pub fn new(
        provider: &'static str,
        base_url: &str,
        auth: Auth,
        key: Secret,
        tls: rustls::ClientConfig,
        timeout: Duration,
    ) -> Result<ProviderHttp, String> {
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("sandgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("{provider}: cannot build an HTTP client: {e}"))?;
        Ok(ProviderHttp {
            client,
            provider,
            base: base_url.trim_end_matches('/').to_string(),
            auth,
            key,
            timeout,
        })
    }

    pub fn provider(&self) -> &'static str {
        self.provider
    }

    /// The account's base URL, as configured (without a trailing `/`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `base_url` + `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An authenticated request to the account's base URL.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.request_url(method, &self.url(path))
    }

    /// An authenticated request to a URL derived from the account (e.g. a data plane).
    pub fn request_url(&self, method: Method, url: &str) -> RequestBuilder {
        let builder = self.client.request(method, url).timeout(self.timeout);
        match self.auth {
            Auth::Header(name) => builder.header(name, self.key.expose()),
            Auth::Bearer => builder.bearer_auth(self.key.expose()),
            Auth::NamedBearer(name) => {
                builder.header(name, format!("Bearer {}", self.key.expose()))
            }
        }
    }

    /// A request without the account's key, for a data plane that takes its own short-lived
    /// token (the key is never sent to an origin the provider's answer named).
    pub fn request_plain(&self, method: Method, url: &str) -> RequestBuilder {
        self.client.request(method, url).timeout(self.timeout)
    }

    /// Sends once; a non-success status is a failure.
    pub async fn send(&self, request: RequestBuilder) -> Result<Response, HttpFailure> {
        let response = request.send().await.map_err(|e| self.transport(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.status_failure(response).await)
    }

    /// Sends an idempotent call, retrying transient failures (up to 3 retries, from 200 ms
    /// doubling, with jitter; a `Retry-After` longer than the backoff is waited instead).
    pub async fn send_idempotent(
        &self,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response, HttpFailure> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(3)
            .with_jitter();
        (|| async { self.send(build()).await })
            .retry(backoff)
            .when(transient)
            .adjust(
                |failure: &HttpFailure, delay| match (failure.retry_after, delay) {
                    (Some(asked), Some(delay)) => {
                        Some(asked.max(delay).min(Duration::from_secs(30)))
                    }
                    (_, delay) => delay,
                },
            )
            .await
    }

    /// An idempotent read whose 404 means "absent" (`None`), its JSON body otherwise: every
    /// adapter's `get` of an instance.
    pub async fn read_optional<T: serde::de::DeserializeOwned>(
        &self,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Option<T>, HttpFailure> {
        match absent_ok(self.send_idempotent(build).await)? {
            Some(response) => Ok(Some(self.json(response).await?)),
            None => Ok(None),
        }
    }

    /// Reads a downloaded file's body; a body cut off midway is a provider failure naming
    /// the file.
    pub async fn file_bytes(
        &self,
        response: Response,
        path: &str,
    ) -> Result<Vec<u8>, crate::ops::OpError> {
        let bytes = response.bytes().await.map_err(|e| {
            crate::ops::OpError::new(
                crate::ops::OpErrorKind::Provider,
                format!("{}: reading {path}: {e}", self.provider),
            )
        })?;
        Ok(bytes.to_vec())
    }

    /// Reads a JSON body; a body that is not the expected JSON is a provider failure.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        response: Response,
    ) -> Result<T, HttpFailure> {
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| self.transport(e))?;
        serde_json::from_slice(&bytes).map_err(|e| HttpFailure {
            status: Some(status),
            body: None,
            retry_after: None,
            sent: true,
            timed_out: false,
            message: format!(
                "{} answered a body that is not the expected JSON: {e}",
                self.provider
            ),
        })
    }

    fn transport(&self, e: reqwest::Error) -> HttpFailure {
        let not_sent = e.is_connect();
        HttpFailure {
            status: None,
            body: None,
            retry_after: None,
            sent: !not_sent,
            timed_out: e.is_timeout(),
            message: self.redact(&format!(
                "{} could not be reached: {}",
                self.provider,
                crate::error::chain(&e)
            )),
        }
    }

    async fn status_failure(&self, response: Response) -> HttpFailure {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry_after);
        let text = response.text().await.unwrap_or_default();
        let body: Option<serde_json::Value> = serde_json::from_str(&text).ok();
        let said = body
            .as_ref()
            .and_then(|b| b.get("message").or_else(|| b.get("error")))
            .and_then(|m| m.as_str())
            .map(|m| m.chars().take(300).collect::<String>());
        let message = match said {
            Some(said) => format!("{} answered {status}: {said}", self.provider),
            None => format!("{} answered {status}", self.provider),
        };
        HttpFailure {
            status: Some(status),
            body,
            retry_after,
            sent: true,
            timed_out: false,
            message: self.redact(&message),
        }
    }

    fn redact(&self, text: &str) -> String {
        let key = self.key.expose();
        if key.is_empty() {
            text.to_string()
        } else {
            text.replace(key, "[redacted]")
        }
    }
}

/// A call whose 404 means the thing is absent: `None` for a read, done for a delete (a
/// delete of an absent instance succeeds).
pub fn absent_ok<T>(result: Result<T, HttpFailure>) -> Result<Option<T>, HttpFailure> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(f) if f.status == Some(StatusCode::NOT_FOUND) => Ok(None),
        Err(f) => Err(f),
    }
}

fn transient(failure: &HttpFailure) -> bool {
    match failure.status {
        None => true,
        Some(status) => {
            status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::BAD_GATEWAY
                || status == StatusCode::SERVICE_UNAVAILABLE
                || status == StatusCode::GATEWAY_TIMEOUT
        }
    }
}

/// Everything but RFC 3986's unreserved characters (so a UUID or `sb-1` passes unchanged).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One URL path segment from an id (ids come from callers and providers: never trusted).
/// `.` and `..` are escaped too, since they would change the path.
pub fn path_segment(id: &str) -> String {
    match id {
        "." | ".." => id.replace('.', "%2E"),
        _ => percent_encoding::utf8_percent_encode(id, SEGMENT).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(retry_after(" 7 "), Some(Duration::from_secs(7)));
        let later = std::time::SystemTime::now() + Duration::from_secs(600);
        let asked = retry_after(&httpdate::fmt_http_date(later)).unwrap();
        assert!(asked > Duration::from_secs(590) && asked <= Duration::from_secs(600));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon"), None);
    }
}
