//! Applying a sandbox's bound credentials to one outbound request.
//!
//! Contract (the "declared slot" rule):
//! - A bound credential applies to a request when its destinations match (host, port, method
//!   and the normalised path); it is authorized by the `sandgate.credential` layer and then
//!   written into its slot: the header its `apply` names, `Authorization: Basic`, or the
//!   query parameter. Whatever the sandbox sent in that slot is replaced.
//! - A placeholder is accepted only in its own credential's slot on a request that
//!   credential applies to (where it is overwritten by the secret's slot value). A
//!   placeholder anywhere else — another header, a header name, the path, another query
//!   parameter, the method, a request trailer, a malformed one, or one of a credential that
//!   does not apply here — refuses the request with 403 `credential_destination_mismatch`,
//!   and nothing is forwarded. So a secret is only ever written where its credential says,
//!   never into a field an API might echo back.
//! - The secret never enters a header value or URL the sandbox chose: substitution inside
//!   sandbox-written text does not exist.

use std::sync::Arc;

use base64::Engine as _;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use regorus::Value;

use super::scan::{self, Token};
use super::scrub::{Scrubber, QUERY_VALUE};
use super::{aws, Apply, Credential, CredentialStore, DestinationRule, Material};
use crate::error::{Blame, Details, Error, Kind, Retry};
use crate::identity::Identity;
use crate::policy::input::{credential_input, CredentialFacts};
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
    /// An AWS credential whose placeholder signed the request: the request is signed again
    /// with the real key once its final form is known (see [`AwsSigning::sign`]).
    pub aws: Option<AwsSigning>,
    pub scrubbers: Vec<Arc<Scrubber>>,
    /// Some applied credential asks for its secret to be scrubbed from response bodies.
    pub scrub_body: bool,
    /// The credentials as applied; checked again just before forwarding.
    credentials: Vec<Arc<Credential>>,
}

impl Applied {
    /// The `type` of each applied credential, in the order of `names`.
    pub fn types(&self) -> Vec<&'static str> {
        self.credentials
            .iter()
            .map(|c| c.meta.apply.kind())
            .collect()
    }

    /// Whether an applied credential was deleted or replaced since it was applied.
    pub fn retired(&self) -> bool {
        self.credentials.iter().any(|c| c.is_retired())
    }
}

/// An AWS request to sign again, with what the sandbox's SDK declared.
pub struct AwsSigning {
    credential: Arc<Credential>,
    signed_by: aws::SignedBy,
    payload: aws::Payload,
}

impl AwsSigning {
    /// Whether the signature must cover the body's hash, which the caller then computes.
    pub fn needs_body_hash(&self) -> bool {
        matches!(self.payload, aws::Payload::Absent)
    }

    /// Signs the request as it will be forwarded to `uri` (`scheme://authority/path`),
    /// replacing the sandbox's signature. `host_header` is the `Host` the HTTP client will
    /// send for that URI. For a signed streaming body, returns what re-signs its chunks.
    pub fn sign(
        &self,
        method: &http::Method,
        headers: &mut HeaderMap,
        uri: &str,
        host_header: &str,
        body_sha256: Option<&str>,
    ) -> Result<Option<super::aws_chunked::ChunkResigner>, Error> {
        let (
            Apply::AwsSigv4 {
                service, region, ..
            },
            Material::Aws(keys),
        ) = (&self.credential.meta.apply, &self.credential.material)
        else {
            return Err(aws_error(
                &self.credential,
                &aws::AwsError::CredentialInvalid("not an aws_sigv4 credential".into()),
            ));
        };
        let now = std::time::SystemTime::now();
        let seed = aws::resign(
            headers,
            method,
            uri,
            host_header,
            &self.signed_by,
            &self.payload,
            body_sha256,
            keys,
            service,
            region,
            now,
        )
        .map_err(|e| aws_error(&self.credential, &e))?;
        Ok(match self.payload {
            aws::Payload::StreamingSigned { trailer } => Some(
                super::aws_chunked::ChunkResigner::new(seed, keys, region, service, now, trailer),
            ),
            _ => None,
        })
    }
}

fn aws_error(credential: &Credential, e: &aws::AwsError) -> Error {
    let (kind, blame) = match e {
        aws::AwsError::StreamingSignedUnsupported => (Kind::Unsupported, Blame::Sandgate),
        aws::AwsError::SigningFailed(_) | aws::AwsError::CredentialInvalid(_) => {
            (Kind::Internal, Blame::Sandgate)
        }
        _ => (Kind::Invalid, Blame::Sandbox),
    };
    let message = format!("credential {:?} (aws_sigv4): {e}", credential.meta.name);
    Error::new(kind, e.code(), message)
        .blame(blame)
        .with_details(Details {
            credential: Some(credential.meta.name.clone()),
            reasons: Some(vec![e.to_string()]),
            ..Details::default()
        })
}

/// Where in a request a placeholder was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Header(HeaderName),
    HeaderName,
    Path,
    QueryName,
    QueryValue(Vec<u8>),
    Method,
}

impl Place {
    fn describe(&self) -> String {
        match self {
            Place::Header(name) => format!("header {:?}", name.as_str()),
            Place::HeaderName => "a header name".into(),
            Place::Path => "the path".into(),
            Place::QueryName => "a query parameter name".into(),
            Place::QueryValue(name) => {
                format!("query parameter {:?}", String::from_utf8_lossy(name))
            }
            Place::Method => "the method".into(),
        }
    }
}

/// Every placeholder in the parts of a request a sandbox writes before the body.
pub fn find_placeholders(
    method: &str,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Vec<(Place, Token)> {
    let mut found = Vec::new();
    // The place is built only for what was found: most requests find nothing, and a header
    // name is cloned (allocated, for a custom one) only when its value holds a placeholder.
    let mut push = |place: &dyn Fn() -> Place, tokens: &mut Vec<Token>| {
        if !tokens.is_empty() {
            let place = place();
            found.extend(tokens.drain(..).map(|t| (place.clone(), t)));
        }
    };
    let mut tokens = Vec::new();
    scan::find(method.as_bytes(), &mut tokens);
    push(&|| Place::Method, &mut tokens);
    for (name, value) in headers {
        scan::find(name.as_str().as_bytes(), &mut tokens);
        push(&|| Place::HeaderName, &mut tokens);
        scan::find_with_basic(value.as_bytes(), &mut tokens);
        push(&|| Place::Header(name.clone()), &mut tokens);
    }
    let (path, query) = split_query(path_and_query);
    scan::find(path.as_bytes(), &mut tokens);
    push(&|| Place::Path, &mut tokens);
    for pair in scan::query_pairs(query.unwrap_or("")) {
        scan::find(&pair.name, &mut tokens);
        push(&|| Place::QueryName, &mut tokens);
        scan::find(pair.value.as_bytes(), &mut tokens);
        push(&|| Place::QueryValue(pair.name.clone()), &mut tokens);
    }
    found
}

fn split_query(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    }
}

/// Whether a bound credential of this identity covers `host:port` at all (any method or
/// path): such requests must have a canonical path, since the path decides whether the
/// credential is attached.
pub fn credentialed_destination(
    credentials: &CredentialStore,
    identity: &Identity,
    view: &RequestView<'_>,
) -> bool {
    view.scheme == "https"
        && identity.bindings.iter().any(|binding| {
            credentials
                .get(&identity.workspace, &binding.name)
                .is_some_and(|c| {
                    c.meta
                        .destinations
                        .iter()
                        .any(|d| d.covers(view.host, view.port))
                })
        })
}

/// Applies credentials to `headers` and `path_and_query` (rewritten in place). The path
/// is already normalised (see `egress::path`). Waits only when a minted credential has no
/// usable token (see `credentials::tokens`).
pub async fn apply(
    credentials: &CredentialStore,
    policy: &PolicyEngine,
    identity: &Identity,
    view: &RequestView<'_>,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
) -> Result<Applied, Error> {
    let found = find_placeholders(view.method, headers, path_and_query);
    if identity.bindings.is_empty() && found.is_empty() {
        return Ok(Applied::default());
    }
    let applicable = applicable(credentials, identity, view, path_and_query);
    for (place, token) in &found {
        if !in_declared_slot(&applicable, place, token.as_deref()) {
            let (path, _) = split_query(path_and_query);
            let rule = token
                .as_deref()
                .and_then(|token| refusing_rule(credentials, identity, view, path, place, token));
            return Err(mismatch_error(view, place, rule));
        }
    }
    let applicable = signed_by_placeholder(applicable, headers)?;
    // Network permission alone never grants credential use: each one is authorized.
    for (_, credential, signed_by) in &applicable {
        authorize(
            policy,
            credential,
            view,
            path_and_query,
            headers,
            signed_by.as_ref(),
        )?;
    }
    let mut applied = Applied::default();
    for (_, credential, signed_by) in applicable {
        write(
            &credential,
            signed_by,
            headers,
            path_and_query,
            view,
            &mut applied,
        )
        .await?;
        metrics::counter!(
            "sandgate_credential_applied_total",
            "workspace" => credential.meta.workspace.clone(),
            "credential" => credential.meta.name.clone()
        )
        .increment(1);
        applied.names.push(credential.meta.name.clone());
        applied.scrubbers.push(credential.scrubber.clone());
        applied.scrub_body |= credential.meta.scrub_response_body;
        applied.credentials.push(credential);
    }
    Ok(applied)
}

/// One credential, applied: a static secret or a minted token written into its slot, or
/// an AWS signature noted for signing once the request is final.
async fn write(
    credential: &Arc<Credential>,
    signed_by: Option<aws::SignedBy>,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
    view: &RequestView<'_>,
    applied: &mut Applied,
) -> Result<(), Error> {
    match &credential.material {
        Material::Static => {
            write_slot(credential, headers, path_and_query).map_err(|()| slot_error(view))
        }
        Material::Tokens(source) => {
            let minted = source
                .token()
                .await
                .map_err(|e| unavailable(credential, view, &e))?;
            let value = match &credential.meta.apply {
                Apply::GithubApp { .. } => {
                    super::github::authorization(&minted.token, path_and_query)
                }
                _ => format!("Bearer {}", minted.token.expose()),
            };
            headers.insert(
                header::AUTHORIZATION,
                sensitive(&value).map_err(|()| slot_error(view))?,
            );
            applied.scrubbers.push(minted.scrubber.clone());
            Ok(())
        }
        Material::Aws(_) => {
            let signed_by = signed_by.ok_or_else(|| slot_error(view))?;
            let payload = aws::payload_of(headers).map_err(|e| aws_error(credential, &e))?;
            if matches!(payload, aws::Payload::StreamingSignedEcdsa) {
                return Err(aws_error(
                    credential,
                    &aws::AwsError::StreamingSignedUnsupported,
                ));
            }
            applied.aws = Some(AwsSigning {
                credential: credential.clone(),
                signed_by,
                payload,
            });
            Ok(())
        }
    }
}

fn unavailable(
    credential: &Credential,
    view: &RequestView<'_>,
    e: &super::tokens::TokenError,
) -> Error {
    // An ended grant needs someone to bind a new credential; an unavailable token endpoint
    // may answer on the next request.
    let (kind, retry) = match e {
        super::tokens::TokenError::Ended(_) => (Kind::Forbidden, Retry::No),
        super::tokens::TokenError::Unavailable(_) => (Kind::Unavailable, Retry::Yes),
    };
    // The endpoint's own words may quote what it was sent: scrub them.
    let reason = credential
        .scrubber
        .scrub(e.to_string().as_bytes())
        .map_or_else(
            || e.to_string(),
            |scrubbed| String::from_utf8_lossy(&scrubbed).into_owned(),
        );
    Error::new(
        kind,
        "credential_unavailable",
        format!(
            "credential {:?} ({}) for {}:{} is unavailable: {reason}",
            credential.meta.name,
            credential.meta.apply.kind(),
            view.host,
            view.port
        ),
    )
    .blame(Blame::Upstream)
    .retry(retry)
    .with_details(Details {
        credential: Some(credential.meta.name.clone()),
        credential_type: Some(credential.meta.apply.kind().to_string()),
        ..Details::destination(view.host, view.port).with_reasons(vec![reason])
    })
}

type Candidate = (String, Arc<Credential>, Option<aws::SignedBy>);

/// An AWS credential applies only to a request its placeholder signed (what the sandbox's
/// SDK signed with); an unsigned request, or one signed with another key, is left as it is.
fn signed_by_placeholder(
    applicable: Vec<(String, Arc<Credential>)>,
    headers: &HeaderMap,
) -> Result<Vec<Candidate>, Error> {
    let mut out = Vec::with_capacity(applicable.len());
    for (placeholder, credential) in applicable {
        if !matches!(credential.meta.apply, Apply::AwsSigv4 { .. }) {
            out.push((placeholder, credential, None));
            continue;
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            continue;
        };
        if !scan::mentions_placeholder(value.as_bytes()) {
            continue;
        }
        let signed_by =
            aws::parse_authorization(value.as_bytes()).map_err(|e| aws_error(&credential, &e))?;
        if signed_by.access_key_id.eq_ignore_ascii_case(&placeholder) {
            out.push((placeholder, credential, Some(signed_by)));
        }
    }
    Ok(out)
}

/// Bound credentials whose own destinations cover this request, with their placeholders.
fn applicable(
    credentials: &CredentialStore,
    identity: &Identity,
    view: &RequestView<'_>,
    path_and_query: &str,
) -> Vec<(String, Arc<Credential>)> {
    if view.scheme != "https" {
        return Vec::new();
    }
    let (path, _) = split_query(path_and_query);
    identity
        .bindings
        .iter()
        .filter_map(|binding| {
            let credential = credentials.get(&identity.workspace, &binding.name)?;
            let matches = credential
                .meta
                .destinations
                .iter()
                .any(|d| d.matches(view.host, view.port, view.method, path));
            matches.then(|| (binding.placeholder.clone(), credential))
        })
        .collect()
}

fn in_declared_slot(
    applicable: &[(String, Arc<Credential>)],
    place: &Place,
    token: Option<&str>,
) -> bool {
    let Some(token) = token else {
        return false;
    };
    applicable
        .iter()
        .find(|(placeholder, _)| placeholder == token)
        .is_some_and(|(_, credential)| slot_matches(&credential.meta.apply, place))
}

fn slot_matches(apply: &Apply, place: &Place) -> bool {
    match (apply, place) {
        (Apply::Header { name, .. }, Place::Header(found)) => {
            found.as_str().eq_ignore_ascii_case(name)
        }
        (Apply::Basic { .. }, Place::Header(found)) => found == header::AUTHORIZATION,
        (Apply::Query { param }, Place::QueryValue(found)) => found == param.as_bytes(),
        // Where the sandbox's SDK puts its access key (`Credential=<key>/...`), or the
        // sandbox's own `Bearer`/`Basic` for a minted token: replaced either way.
        (
            Apply::AwsSigv4 { .. } | Apply::Oauth2 { .. } | Apply::GithubApp { .. },
            Place::Header(found),
        ) => found == header::AUTHORIZATION,
        _ => false,
    }
}

fn authorize(
    policy: &PolicyEngine,
    credential: &Credential,
    view: &RequestView<'_>,
    path_and_query: &str,
    headers: &HeaderMap,
    signed_by: Option<&aws::SignedBy>,
) -> Result<(), Error> {
    let aws = signed_by.and_then(|_| match &credential.meta.apply {
        Apply::AwsSigv4 {
            service,
            region,
            endpoint,
        } => Some(
            aws::operation_at(
                service,
                region,
                endpoint.as_deref(),
                view.method,
                view.host,
                path_and_query,
                headers,
            )
            .to_value(),
        ),
        _ => None,
    });
    let input = credential_input(CredentialFacts {
        credential: &credential.policy_value,
        sandbox: &view.sandbox,
        destination: &view.destination,
        method: view.method,
        path: path_and_query,
        aws,
    });
    let decision = policy.decide(crate::policy::Layer::Credential, input);
    if decision.allowed {
        return Ok(());
    }
    Err(Error::new(
        Kind::Refused,
        "credential_denied",
        format!(
            "use of credential {:?} for {}:{} is denied by policy: {}",
            credential.meta.name,
            view.host,
            view.port,
            decision.reasons.join("; ")
        ),
    )
    .blame(Blame::Sandbox)
    .with_details(Details {
        credential: Some(credential.meta.name.clone()),
        ..Details::destination(view.host, view.port).with_reasons(decision.reasons)
    }))
}

/// Writes the secret into the credential's slot, replacing what the sandbox sent there.
fn write_slot(
    credential: &Credential,
    headers: &mut HeaderMap,
    path_and_query: &mut String,
) -> Result<(), ()> {
    let secret = credential.secret.expose();
    match &credential.meta.apply {
        Apply::Header { name, template } => {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| ())?;
            let value = sensitive(&template.replace("{secret}", secret))?;
            headers.insert(name, value);
        }
        Apply::Basic { username } => {
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{secret}"));
            headers.insert(
                header::AUTHORIZATION,
                sensitive(&format!("Basic {encoded}"))?,
            );
        }
        Apply::Query { param } => {
            *path_and_query = set_query_param(path_and_query, param, secret);
        }
        // Written by `write`: these never put the stored secret itself on a request.
        Apply::AwsSigv4 { .. } | Apply::Oauth2 { .. } | Apply::GithubApp { .. } => return Err(()),
    }
    Ok(())
}

fn sensitive(text: &str) -> Result<HeaderValue, ()> {
    let mut value = HeaderValue::from_str(text).map_err(|_| ())?;
    value.set_sensitive(true);
    Ok(value)
}

/// When a placeholder sits in its own credential's slot but that credential's destinations
/// do not cover this request: which part of them refused it (host, port, method or path
/// prefix), with the values the rule allows, so the refusal blames the rule and not the
/// slot. Names only configuration and the request's method and port: never the path (the
/// sandbox's own text), the placeholder or the secret.
fn refusing_rule(
    credentials: &CredentialStore,
    identity: &Identity,
    view: &RequestView<'_>,
    path: &str,
    place: &Place,
    token: &str,
) -> Option<String> {
    if view.scheme != "https" {
        return None;
    }
    let binding = identity.bindings.iter().find(|b| b.placeholder == token)?;
    let credential = credentials.get(&identity.workspace, &binding.name)?;
    if !slot_matches(&credential.meta.apply, place) {
        return None;
    }
    let rules = &credential.meta.destinations;
    let named = |what: String| {
        Some(format!(
            "credential {:?} is bound to this sandbox but its destinations do not cover this request: {what}",
            credential.meta.name
        ))
    };
    let for_host: Vec<&DestinationRule> = rules
        .iter()
        .filter(|d| crate::domain::matches(&d.host, view.host))
        .collect();
    if for_host.is_empty() {
        let hosts: Vec<&str> = rules.iter().map(|d| d.host.as_str()).collect();
        return named(format!(
            "the host {} is not among its destination hosts {hosts:?}",
            view.host
        ));
    }
    let for_port: Vec<&DestinationRule> = for_host
        .iter()
        .copied()
        .filter(|d| d.covers(view.host, view.port))
        .collect();
    if for_port.is_empty() {
        let allowed: Vec<String> = for_host
            .iter()
            .map(|d| {
                let ports: Vec<String> = d.ports.iter().map(u16::to_string).collect();
                let note = if d.ports.is_empty() {
                    " (443 only)"
                } else {
                    ""
                };
                format!("ports = [{}]{note}", ports.join(", "))
            })
            .collect();
        return named(format!(
            "the port {} is not allowed by its destination's {}",
            view.port,
            allowed.join(" or ")
        ));
    }
    let for_method: Vec<&DestinationRule> = for_port
        .iter()
        .copied()
        .filter(|d| {
            d.methods.is_empty()
                || d.methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(view.method))
        })
        .collect();
    if for_method.is_empty() {
        let allowed: Vec<String> = for_port
            .iter()
            .map(|d| format!("methods = {:?}", d.methods))
            .collect();
        return named(format!(
            "the method {} is not allowed by its destination's {}",
            view.method,
            allowed.join(" or ")
        ));
    }
    let prefixes: Vec<String> = for_method
        .iter()
        .filter_map(|d| d.path_prefix.as_deref())
        .filter(|prefix| !path.starts_with(prefix))
        .map(|prefix| format!("path_prefix = {prefix:?}"))
        .collect();
    if prefixes.len() == for_method.len() {
        return named(format!(
            "the path is not under its destination's {}",
            prefixes.join(" or ")
        ));
    }
    None
}

fn mismatch_error(view: &RequestView<'_>, place: &Place, rule: Option<String>) -> Error {
    let reason = if let Some(rule) = rule {
        format!(
            "{rule}; its placeholder in {} was not replaced",
            place.describe()
        )
    } else if view.scheme == "https" {
        format!(
            "the request carries a credential placeholder in {} that is not the declared slot of a credential bound to this sandbox for this destination",
            place.describe()
        )
    } else {
        "the request carries a credential placeholder over plain HTTP; credentials are applied only over HTTPS".to_string()
    };
    Error::new(
        Kind::Forbidden,
        "credential_destination_mismatch",
        format!(
            "{reason} ({}:{}); it was not forwarded",
            view.host, view.port
        ),
    )
    .blame(Blame::Sandbox)
    .with_details(Details::destination(view.host, view.port).with_reasons(vec![reason]))
}

fn slot_error(view: &RequestView<'_>) -> Error {
    Error::new(
        Kind::Internal,
        "credential_unusable",
        format!(
            "a credential for {}:{} cannot be written into its slot (its secret is not a valid header value)",
            view.host, view.port
        ),
    )
}

/// `?param=secret`, replacing every pair the sandbox sent under that name (compared
/// decoded, so `k%65y=` is the same parameter as `key=`).
fn set_query_param(path_and_query: &str, param: &str, value: &str) -> String {
    let (path, query) = split_query(path_and_query);
    let mut parts: Vec<String> = scan::query_pairs(query.unwrap_or(""))
        .filter(|pair| pair.name != param.as_bytes())
        .map(|pair| pair.raw.to_string())
        .collect();
    parts.push(format!(
        "{}={}",
        percent_encoding::utf8_percent_encode(param, QUERY_VALUE),
        percent_encoding::utf8_percent_encode(value, QUERY_VALUE)
    ));
    format!("{path}?{}", parts.join("&"))
}

/// Whether request trailers carry a placeholder (trailers are never a declared slot).
pub fn trailers_mention_placeholder(trailers: &HeaderMap) -> bool {
    trailers.iter().any(|(name, value)| {
        scan::mentions_placeholder(name.as_str().as_bytes()) || {
            let mut found = Vec::new();
            scan::find_with_basic(value.as_bytes(), &mut found);
            !found.is_empty()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::seal::PLACEHOLDER_PREFIX;

    #[test]
    fn query_param_is_replaced_not_duplicated() {
        assert_eq!(
            set_query_param("/a?key=old&x=1", "key", "s e"),
            "/a?x=1&key=s%20e"
        );
        assert_eq!(set_query_param("/a?k%65y=old", "key", "v"), "/a?key=v");
        assert_eq!(set_query_param("/a", "key", "v"), "/a?key=v");
    }

    #[test]
    fn placeholders_are_found_in_every_place_before_the_body() {
        let p = format!("{PLACEHOLDER_PREFIX}{}", "0f".repeat(20));
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_str(&format!("v {p}")).unwrap());
        headers.insert(
            HeaderName::from_bytes(p.as_bytes()).unwrap(),
            HeaderValue::from_static("1"),
        );
        let path = format!("/r/%73gph_{}?{p}=1&q=sgph%5F{}", &p[5..], &p[5..]);
        let found = find_placeholders("GET", &headers, &path);
        let places: Vec<&Place> = found.iter().map(|(p, _)| p).collect();
        assert!(places.contains(&&Place::Header(HeaderName::from_static("x-a"))));
        assert!(places.contains(&&Place::HeaderName));
        assert!(places.contains(&&Place::Path));
        assert!(places.contains(&&Place::QueryName));
        assert!(places.contains(&&Place::QueryValue(b"q".to_vec())));
        assert!(found.iter().all(|(_, t)| t.as_deref() == Some(p.as_str())));
    }

    #[test]
    fn slots_follow_the_apply_type() {
        let auth = Place::Header(header::AUTHORIZATION);
        let header_apply = Apply::Header {
            name: "X-Api-Key".into(),
            template: "{secret}".into(),
        };
        assert!(slot_matches(
            &header_apply,
            &Place::Header(HeaderName::from_static("x-api-key"))
        ));
        assert!(!slot_matches(&header_apply, &auth));
        let basic = Apply::Basic {
            username: "u".into(),
        };
        assert!(slot_matches(&basic, &auth));
        assert!(!slot_matches(&basic, &Place::Path));
        let query = Apply::Query {
            param: "key".into(),
        };
        assert!(slot_matches(&query, &Place::QueryValue(b"key".to_vec())));
        assert!(!slot_matches(&query, &Place::QueryValue(b"q".to_vec())));
        assert!(!slot_matches(&query, &Place::QueryName));
    }
}
