//! Request bodies: the one JSON extractor every JSON endpoint uses ([`JsonBody`]), and raw
//! bytes for uploads ([`RawBody`]).
//!
//! A JSON body is exactly one JSON value: bytes after it (`{...} xyz`, a second value) are
//! refused, as is an object with the same key twice anywhere in it (parsers disagree on which
//! one wins, and a policy check must not read one while the handler reads the other). The
//! types it is read into are closed (`deny_unknown_fields`). Errors never echo what was sent:
//! a body may carry a secret, and serde's messages quote offending values; they name the
//! field path and the kind of problem only.
//!
//! A body larger than the endpoint's limit ([`MAX_JSON_BYTES`] unless a route sets its own
//! `DefaultBodyLimit`) is 413 `payload_too_large`. The content type is not checked: clients
//! such as `curl -d` label JSON as a form, and the bytes decide.

use std::collections::HashSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::error::{Error, Kind};

/// Largest JSON request body (the API router's `DefaultBodyLimit`).
pub const MAX_JSON_BYTES: usize = 1024 * 1024;

/// A JSON request body read into `T` under the rules of the module documentation.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The request body as bytes (any content), within the route's body limit.
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(body_rejection)
    }
}

/// A body that could not be read: 413 over the limit, else 400.
pub fn body_rejection(rejection: BytesRejection) -> Error {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Error::new(
            Kind::TooLarge,
            "payload_too_large",
            "the request body is larger than this endpoint accepts",
        )
    } else {
        Error::new(
            Kind::Invalid,
            "invalid_request",
            "the request body could not be read",
        )
    }
}

/// Parses exactly one JSON value with no duplicate keys into `T`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    // First pass: syntax, trailing bytes and duplicate keys, whatever `T` is (maps such as
    // `labels` or `env` would otherwise keep the last of two equal keys silently).
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize::<_, Unique>(&mut *de).map_err(json_error)?;
    de.end().map_err(|_| trailing())?;
    // Second pass: the typed value.
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(json_error)?;
    de.end().map_err(|_| trailing())?;
    Ok(value)
}

fn trailing() -> Error {
    Error::new(
        Kind::Invalid,
        "invalid_request",
        "the request body has bytes after its JSON value",
    )
    .field(".")
}

const DUPLICATE_KEY: &str = "duplicate key";

/// Longest field path reported (a deeply nested body has a very long one).
const MAX_PATH_CHARS: usize = 256;

fn json_error(e: serde_path_to_error::Error<serde_json::Error>) -> Error {
    let mut path = e.path().to_string();
    if path.len() > MAX_PATH_CHARS {
        path = ".".into();
    }
    let inner = e.inner();
    let what = match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "is not valid JSON"
        }
        serde_json::error::Category::Io => "could not be read",
        serde_json::error::Category::Data if inner.to_string().starts_with(DUPLICATE_KEY) => {
            "has a duplicate key"
        }
        serde_json::error::Category::Data => "has a missing, unknown or mistyped field",
    };
    let message = if path == "." {
        format!("the request body {what}")
    } else {
        format!("the request body {what} at `{path}`")
    };
    Error::new(Kind::Invalid, "invalid_request", message).field(path)
}

/// Any JSON value, refusing an object with a key twice (reported at that key's path).
struct Unique;

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.insert(key) {
                map.next_value::<Unique>()?;
            } else {
                // Failing inside the value puts the key in the error's path.
                return map.next_value_seed(Duplicate);
            }
        }
        Ok(Unique)
    }
}

struct Duplicate;

impl<'de> DeserializeSeed<'de> for Duplicate {
    type Value = Unique;

    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<Unique, D::Error> {
        Err(de::Error::custom(DUPLICATE_KEY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> Error {
        parse_json::<serde_json::Value>(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn one_value_and_nothing_after_it() {
        assert!(parse_json::<serde_json::Value>(br#" {"a": [1, {"b": null}]} "#).is_ok());
        for bad in [r#"{"a":1} xyz"#, r#"{}{}"#, "{} ]", "", "[1,]", "nul"] {
            let e = err(bad);
            assert_eq!(e.kind, Kind::Invalid, "{bad}");
            assert_eq!(e.code, "invalid_request");
        }
        assert!(err("{} x").message.contains("bytes after"));
    }

    #[test]
    fn duplicate_keys_are_refused_at_their_path() {
        let e = err(r#"{"labels": {"a": "1", "b": {"c": 1}, "a": "2"}}"#);
        assert_eq!(
            e.details.field.as_deref(),
            Some("labels.a"),
            "{}",
            e.message
        );
        assert!(e.message.contains("duplicate key"));
        let e = err(r#"[{"x": 1, "x": 1}]"#);
        assert_eq!(e.details.field.as_deref(), Some("[0].x"));
    }

    #[test]
    fn errors_never_echo_values() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct T {
            n: u32,
        }
        for bad in [
            r#"{"n": "secret-value-1"}"#,
            r#"{"n": 1, "x": "secret-value-1"}"#,
            r#"{"n": 1} "secret-value-1""#,
            r#"{"n": 1, "n": "secret-value-1"}"#,
        ] {
            let e = parse_json::<T>(bad.as_bytes()).unwrap_err();
            let text = serde_json::to_string(&e.record()).unwrap();
            assert!(!text.contains("secret-value-1"), "{text}");
        }
    }
}
