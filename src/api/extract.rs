//! Path and query extractors whose rejections answer the error shape (axum's own answer
//! in plain text).
//!
//! - [`Path`]: every path parameter must be valid UTF-8 once percent-decoded, at most
//!   [`MAX_PATH_PARAM_BYTES`] long, and free of control and invisible formatting characters
//!   (an id or a name never holds one); otherwise 400 `invalid_request` with
//!   `details.field` naming the parameter (`id`, `ws`, `name`, ...), never its value.
//! - [`Query`]: the query string must deserialize into the endpoint's closed parameter set
//!   (unknown, repeated, missing or mistyped parameters are refused); the message lists the
//!   parameters the endpoint takes ([`QueryParams`]).

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::{Error, Kind};

/// Longest path parameter, in bytes.
pub const MAX_PATH_PARAM_BYTES: usize = 256;

/// Like `axum::extract::Path`, with the checks and rejections of the module documentation.
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                use axum::extract::rejection::RawPathParamsRejection as R;
                match rejection {
                    R::InvalidUtf8InPathParam(e) => {
                        // The rejection's text is "Invalid UTF-8 in `<key>`".
                        let text = e.to_string();
                        let key = text.split('`').nth(1).unwrap_or_default().to_string();
                        invalid(&key, "is not valid UTF-8 once percent-decoded")
                    }
                    _ => internal(),
                }
            })?;
        for (key, value) in &raw {
            if let Some(problem) = sandgate_router::check_text(value, MAX_PATH_PARAM_BYTES, false) {
                return Err(invalid(key, &problem));
            }
        }
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(axum::extract::rejection::PathRejection::FailedToDeserializePathParams(e)) => {
                use axum::extract::path::ErrorKind as K;
                match e.into_kind() {
                    K::InvalidUtf8InPathParam { key } => {
                        Err(invalid(&key, "is not valid UTF-8 once percent-decoded"))
                    }
                    K::ParseErrorAtKey { key, .. } | K::DeserializeError { key, .. } => {
                        Err(invalid(&key, "has the wrong form"))
                    }
                    K::ParseErrorAtIndex { .. } | K::ParseError { .. } | K::Message(_) => {
                        Err(Error::new(
                            Kind::Invalid,
                            "invalid_request",
                            "a path parameter has the wrong form",
                        ))
                    }
                    _ => Err(internal()),
                }
            }
            Err(_) => Err(internal()),
        }
    }
}

fn invalid(key: &str, problem: &str) -> Error {
    Error::new(
        Kind::Invalid,
        "invalid_request",
        format!("path parameter `{key}` {problem}"),
    )
    .field(key)
}

/// A route declared a parameter its handler does not read (a bug, not the client's fault).
fn internal() -> Error {
    tracing::error!("path parameters do not match the route");
    Error::new(
        Kind::Internal,
        "internal",
        "the request could not be routed",
    )
}

/// The query parameters an endpoint takes, for the refusal's message.
pub trait QueryParams {
    /// E.g. `"path (required), recursive, parents"`.
    const PARAMS: &'static str;
}

/// Like `axum::extract::Query`, with the rejection of the module documentation.
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned + QueryParams + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            // serde's message may quote a value; it is not passed on.
            Err(_) => Err(Error::new(
                Kind::Invalid,
                "invalid_request",
                format!(
                    "the query string has an unknown, repeated, missing or mistyped parameter; \
                     this endpoint takes: {}",
                    T::PARAMS
                ),
            )
            .field("query")),
        }
    }
}
