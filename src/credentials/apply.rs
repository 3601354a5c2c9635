//! Applying a sandbox's bound credentials to one outbound request.

use std::collections::BTreeMap;

use base64::Engine as _;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use regorus::Value;
use serde_json::json;

use super::seal::{PLACEHOLDER_LEN, PLACEHOLDER_PREFIX};
use super::{Apply, Credential, CredentialStore, Secret};
use crate::error::ErrorReply;
use crate::identity::Identity;
use crate::policy::PolicyEngine;

/// The request facts credential decisions need.
pub struct RequestView<'a> {
    pub host: &'a str,
    pub port: u16,
    pub scheme: &'a str,
    pub method: &'a str,
    pub destination: Value,
    pub sandbox: Value,
}

/// What was applied, for the decision log and for scrubbing responses.
#[derive(Default)]
pub struct Applied {
    pub names: Vec<String>,
    pub secrets: Vec<Secret>,
}

/// Applies credentials to `headers` and `path_and_query` (rewritten in place).
pub fn apply(
    credentials: &CredentialStore,
    policy: &PolicyEngine,
    identity: &Identity,
    view: &RequestView<'_>,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
) -> Result<Applied, ErrorReply> {
    let mut applied = Applied::default();
    let has_placeholder =
        headers_mention_placeholder(headers) || path_and_query.contains(PLACEHOLDER_PREFIX);
    if identity.bindings.is_empty() && !has_placeholder {
        return Ok(applied);
    }
    let path_only = path_and_query.split('?').next().unwrap_or("/").to_string();

    // Bound credentials whose own destinations cover this request.
    let mut applicable: Vec<(&str, std::sync::Arc<Credential>)> = Vec::new();
    for binding in &identity.bindings {
        let Some(credential) = credentials.get(&identity.workspace, &binding.name) else {
            continue;
        };
        if view.scheme != "https" {
            continue;
        }
        let matches = credential
            .meta
            .destinations
            .iter()
            .any(|d| d.matches(view.host, view.port, view.method, &path_only));
        if matches {
            applicable.push((binding.placeholder.as_str(), credential));
        }
    }

    // Network permission alone never grants credential use: each one is authorized.
    for (_, credential) in &applicable {
        let input = credential_input(credential, view, path_and_query);
        let decision = policy.evaluate("credential", input);
        if !decision.allowed {
            return Err(ErrorReply::new(
                StatusCode::FORBIDDEN,
                "credential_denied",
                format!(
                    "use of credential {:?} for {}:{} is denied by policy: {}",
                    credential.meta.name,
                    view.host,
                    view.port,
                    decision.reasons.join("; ")
                ),
            )
            .with_details(json!({
                "host": view.host, "port": view.port,
                "credential": credential.meta.name, "reasons": decision.reasons,
            })));
        }
    }

    if has_placeholder {
        let resolve = |token: &str| -> Option<&Secret> {
            applicable
                .iter()
                .find(|(placeholder, _)| *placeholder == token)
                .map(|(_, c)| &c.secret)
        };
        let mismatch = |_: ()| mismatch_error(view);
        *path_and_query = substitute(path_and_query, &resolve).map_err(mismatch)?;
        let names: Vec<header::HeaderName> = headers.keys().cloned().collect();
        for name in names {
            let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
            let mut rewritten = Vec::with_capacity(values.len());
            let mut changed = false;
            for value in values {
                let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
                let new = if name == header::AUTHORIZATION && is_basic(&text) {
                    substitute_basic(&text, &resolve).map_err(mismatch)?
                } else {
                    substitute(&text, &resolve).map_err(mismatch)?
                };
                if new != text {
                    changed = true;
                    let mut v = HeaderValue::from_str(&new).map_err(|_| mismatch_error(view))?;
                    v.set_sensitive(true);
                    rewritten.push(v);
                } else {
                    rewritten.push(value);
                }
            }
            if changed {
                headers.remove(&name);
                for v in rewritten {
                    headers.append(name.clone(), v);
                }
            }
        }
    }

    for (_, credential) in &applicable {
        let secret = credential.secret.expose();
        match &credential.meta.apply {
            Apply::Header { name, template } => {
                let name = header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| mismatch_error(view))?;
                let mut value = HeaderValue::from_str(&template.replace("{secret}", secret))
                    .map_err(|_| mismatch_error(view))?;
                value.set_sensitive(true);
                headers.insert(name, value);
            }
            Apply::Basic { username } => {
                let encoded = base64::engine::general_purpose::STANDARD
                    .encode(format!("{username}:{secret}"));
                let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))
                    .map_err(|_| mismatch_error(view))?;
                value.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, value);
            }
            Apply::Query { param } => {
                *path_and_query = set_query_param(path_and_query, param, secret);
            }
        }
        applied.names.push(credential.meta.name.clone());
        applied.secrets.push(credential.secret.clone());
    }
    Ok(applied)
}

fn mismatch_error(view: &RequestView<'_>) -> ErrorReply {
    let reason = if view.scheme == "https" {
        "the request carries a credential placeholder that is not bound to this sandbox for this destination"
    } else {
        "the request carries a credential placeholder over plain HTTP; credentials are applied only over HTTPS"
    };
    ErrorReply::new(
        StatusCode::FORBIDDEN,
        "credential_destination_mismatch",
        format!(
            "{reason} ({}:{}); it was not forwarded",
            view.host, view.port
        ),
    )
    .with_details(json!({"host": view.host, "port": view.port, "reasons": [reason]}))
}

fn headers_mention_placeholder(headers: &HeaderMap) -> bool {
    headers.iter().any(|(name, value)| {
        let bytes = value.as_bytes();
        contains(bytes, PLACEHOLDER_PREFIX.as_bytes())
            || (name == header::AUTHORIZATION
                && std::str::from_utf8(bytes)
                    .ok()
                    .and_then(decode_basic)
                    .is_some_and(|d| d.contains(PLACEHOLDER_PREFIX)))
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Replaces every placeholder in `text`; any `sgph_` that is not a placeholder the caller
/// can resolve is an error (it would otherwise leave unresolved).
fn substitute<'s>(text: &str, resolve: &dyn Fn(&str) -> Option<&'s Secret>) -> Result<String, ()> {
    if !text.contains(PLACEHOLDER_PREFIX) {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PLACEHOLDER_PREFIX) {
        out.push_str(&rest[..at]);
        let candidate = rest.get(at..at + PLACEHOLDER_LEN).ok_or(())?;
        let secret = resolve(candidate).ok_or(())?;
        out.push_str(secret.expose());
        rest = &rest[at + PLACEHOLDER_LEN..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_basic(value: &str) -> bool {
    value.len() > 6 && value[..6].eq_ignore_ascii_case("basic ")
}

fn decode_basic(value: &str) -> Option<String> {
    if !is_basic(value) {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value[6..].trim())
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// Placeholders hidden inside `Authorization: Basic` (clients encode `user:password`).
fn substitute_basic<'s>(
    value: &str,
    resolve: &dyn Fn(&str) -> Option<&'s Secret>,
) -> Result<String, ()> {
    match decode_basic(value) {
        Some(decoded) if decoded.contains(PLACEHOLDER_PREFIX) => {
            let replaced = substitute(&decoded, resolve)?;
            Ok(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(replaced)
            ))
        }
        _ => substitute(value, resolve),
    }
}

fn set_query_param(path_and_query: &str, param: &str, value: &str) -> String {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let encoded: String = url_encode(value);
    let mut parts: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| p.split('=').next() != Some(param))
        .map(str::to_string)
        .collect();
    parts.push(format!("{param}={encoded}"));
    format!("{path}?{}", parts.join("&"))
}

fn url_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn credential_input(
    credential: &Credential,
    view: &RequestView<'_>,
    path_and_query: &str,
) -> Value {
    let mut request = BTreeMap::new();
    request.insert(Value::from("method"), Value::from(view.method));
    request.insert(Value::from("path"), Value::from(path_and_query));
    let mut input = BTreeMap::new();
    input.insert(Value::from("credential"), credential.policy_value.clone());
    input.insert(Value::from("sandbox"), view.sandbox.clone());
    input.insert(Value::from("destination"), view.destination.clone());
    input.insert(Value::from("request"), Value::from(request));
    Value::from(input)
}

/// Removes applied secrets from response headers: an upstream that reflects request
/// headers must not hand the secret to the sandbox.
pub fn scrub_response_headers(headers: &mut HeaderMap, secrets: &[Secret]) {
    if secrets.is_empty() {
        return;
    }
    let names: Vec<header::HeaderName> = headers.keys().cloned().collect();
    for name in names {
        let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
        if !values.iter().any(|v| {
            secrets
                .iter()
                .any(|s| contains(v.as_bytes(), s.expose().as_bytes()))
        }) {
            continue;
        }
        headers.remove(&name);
        for value in values {
            let mut text = String::from_utf8_lossy(value.as_bytes()).into_owned();
            for secret in secrets {
                text = text.replace(secret.expose(), "[redacted by sandgate]");
            }
            if let Ok(v) = HeaderValue::from_str(&text) {
                headers.append(name.clone(), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_param_is_replaced_not_duplicated() {
        assert_eq!(
            set_query_param("/a?key=old&x=1", "key", "s e"),
            "/a?x=1&key=s%20e"
        );
        assert_eq!(set_query_param("/a", "key", "v"), "/a?key=v");
    }

    #[test]
    fn unresolvable_placeholders_are_errors() {
        let secret = Secret::new("REAL");
        let good = format!("{PLACEHOLDER_PREFIX}{}", "a".repeat(40));
        let resolve = |t: &str| (t == good).then_some(&secret);
        assert_eq!(
            substitute(&format!("Bearer {good}"), &resolve).unwrap(),
            "Bearer REAL"
        );
        assert!(substitute(
            &format!("Bearer {PLACEHOLDER_PREFIX}{}", "b".repeat(40)),
            &resolve
        )
        .is_err());
        assert!(substitute(&format!("Bearer {PLACEHOLDER_PREFIX}short"), &resolve).is_err());
    }
}
