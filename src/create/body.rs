//! The create request body (`POST /v1/sandboxes`): the router's request plus the fields only
//! creation uses (`workspace`, `credentials`). Unknown top-level fields are refused: a
//! requirement sandgate does not understand must not be silently dropped (the router's
//! request is flattened in, so the top level is closed by [`FIELDS`]; every nested object is
//! `deny_unknown_fields`). Bounds the types cannot say are checked too
//! ([`sandgate_router::Request::validate`], plus the names here): every error is a field path
//! and what is allowed, never the value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use sandgate_router::Request;

/// Top-level fields of the create body.
pub const FIELDS: &[&str] = &[
    "workspace",
    "credentials",
    "provider",
    "fallback_providers",
    "source",
    "resources",
    "features",
    "network",
    "regions",
    "labels",
    "routing",
    "snapshot",
    "dry_run",
    "ttl_secs",
    "env",
];

/// Most variables a create's `env` may hold.
pub const MAX_ENV_VARS: usize = 256;
/// Longest value of one `env` variable, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;

/// The longest lifetime a create may ask for (`ttl_secs`): 30 days.
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// A create request: the router's request (placement: provider, source, resources, features,
/// network, regions, labels, routing) plus the fields only creation uses. Unknown fields are
/// refused at every level.
// OpenAPI: the derive writes the flattened request as `allOf: [request, {the fields
// here}]`; `openapi::ClosedRequest` closes the top level.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateBody {
    /// The workspace to create in; defaults to the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<openapi::Name>)]
    pub workspace: Option<String>,
    /// Names of the workspace's credentials to bind to the sandbox's egress identity.
    #[serde(default)]
    #[schema(value_type = std::collections::BTreeSet<openapi::Name>, max_items = 64)]
    pub credentials: Vec<String>,
    /// A snapshot of this workspace to restore (its files) into the new sandbox; the
    /// sandbox is placed on the pool that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<openapi::Name>)]
    pub snapshot: Option<String>,
    /// Plan only: route, evaluate the creation and provider layers for each candidate and
    /// answer the plan; nothing is created and no idempotency key is claimed. Never stored
    /// (a body with `dry_run: false` digests as one without it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The sandbox's lifetime in seconds from its creation (1 to 30 days' worth): once it
    /// has passed, sandgate deletes the sandbox. `POST /v1/sandboxes/{id}/timeout` sets a new
    /// end. Absent: the sandbox lives until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2592000)]
    pub ttl_secs: Option<u64>,
    /// Environment variables every process of the sandbox gets (E2B's `envVars`). Names are
    /// `[A-Za-z_][A-Za-z0-9_]*` (at most 256 bytes), values at most 32 KiB without NUL, at
    /// most 256 variables; the proxy and CA variables cannot be set. Values may be secrets:
    /// they are sealed at rest, policy sees the names only (`input.request.env_names`), and
    /// no answer shows them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Storage only: `env`, sealed (see `create::stored_body`). Never accepted from a caller
    /// (it is not in [`FIELDS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub env_sealed: Option<String>,
    #[serde(flatten)]
    #[schema(value_type = openapi::ClosedRequest, inline)]
    pub request: Request,
}

/// The create body's schema parts the derive cannot write (schema only: parsing is
/// [`CreateBody::parse`]).
mod openapi {
    use std::borrow::Cow;

    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
    use utoipa::openapi::RefOr;
    use utoipa::{PartialSchema, ToSchema};

    use sandgate_router::Request;

    /// The router's request, closed to [`super::FIELDS`]: the parser refuses any other
    /// top-level field, and `additionalProperties: false` cannot say so across an `allOf`
    /// (it sees only its own subschema's properties), while `propertyNames` can.
    pub(super) struct ClosedRequest;

    impl PartialSchema for ClosedRequest {
        fn schema() -> RefOr<Schema> {
            let RefOr::T(Schema::Object(mut request)) = Request::schema() else {
                unreachable!("the router's Request schema is an inline object")
            };
            request.property_names = Some(Box::new(Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(super::FIELDS.iter().copied()))
                    .build(),
            )));
            RefOr::T(Schema::Object(request))
        }
    }

    impl ToSchema for ClosedRequest {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            <Request as ToSchema>::schemas(schemas);
        }
    }

    /// The router's `Name` schema (its text rules: `check_text` with `MAX_NAME_BYTES`), for
    /// the create body's own names; the router registers it with its request's schemas.
    pub(super) struct Name;

    impl PartialSchema for Name {
        fn schema() -> RefOr<Schema> {
            let mut schemas = Vec::new();
            <Request as ToSchema>::schemas(&mut schemas);
            schemas
                .into_iter()
                .find(|(name, _)| *name == Self::name())
                .map(|(_, schema)| schema)
                .expect("the router's request schemas include Name")
        }
    }

    impl ToSchema for Name {
        fn name() -> Cow<'static, str> {
            Cow::Borrowed("Name")
        }
    }
}

#[derive(Debug)]
pub struct BodyError {
    pub field: String,
    pub message: String,
}

impl CreateBody {
    /// Parses and checks a body. Error messages name fields, never echo values.
    pub fn parse(value: serde_json::Value) -> Result<CreateBody, BodyError> {
        let Some(object) = value.as_object() else {
            return Err(BodyError {
                field: ".".into(),
                message: "the request body must be a JSON object".into(),
            });
        };
        for key in object.keys() {
            if !FIELDS.contains(&key.as_str()) {
                return Err(BodyError {
                    field: key.clone(),
                    message: format!("unknown field; expected one of {}", FIELDS.join(", ")),
                });
            }
        }
        let body: CreateBody = match serde_path_to_error::deserialize(value.clone()) {
            Ok(body) => body,
            // `flatten` hides the path; find it by reading each field on its own.
            Err(e) => {
                return Err(BodyError {
                    field: locate_error(object).unwrap_or_else(|| e.path().to_string()),
                    message: "missing, unknown or mistyped field".into(),
                })
            }
        };
        body.request.validate().map_err(|e| BodyError {
            field: e.field,
            message: e.message,
        })?;
        let name = |field: String, text: &str| match sandgate_router::check_text(
            text,
            sandgate_router::MAX_NAME_BYTES,
            false,
        ) {
            Some(message) => Err(BodyError { field, message }),
            None => Ok(()),
        };
        if let Some(workspace) = &body.workspace {
            name("workspace".into(), workspace)?;
        }
        if let Some(snapshot) = &body.snapshot {
            name("snapshot".into(), snapshot)?;
        }
        if body.ttl_secs.is_some_and(|t| t == 0 || t > MAX_TTL_SECS) {
            return Err(BodyError {
                field: "ttl_secs".into(),
                message: format!("must be 1 to {MAX_TTL_SECS} seconds"),
            });
        }
        check_env(&body.env)?;
        if body.credentials.len() > sandgate_router::MAX_ENTRIES {
            return Err(BodyError {
                field: "credentials".into(),
                message: format!("must have at most {} entries", sandgate_router::MAX_ENTRIES),
            });
        }
        for (i, credential) in body.credentials.iter().enumerate() {
            name(format!("credentials[{i}]"), credential)?;
        }
        for (i, domain) in body.request.network.allow_domains.iter().enumerate() {
            crate::domain::validate_pattern(domain).map_err(|message| BodyError {
                field: format!("network.allow_domains[{i}]"),
                message,
            })?;
        }
        let mut seen = std::collections::HashSet::new();
        for (i, name) in body.credentials.iter().enumerate() {
            if !seen.insert(name) {
                return Err(BodyError {
                    field: format!("credentials[{i}]"),
                    message: "duplicate credential name".into(),
                });
            }
        }
        Ok(body)
    }

    /// The body as policy sees it (`input.request`): `env` values may be secrets, so only
    /// their names are given, as `env_names`.
    pub fn policy_view(&self) -> serde_json::Value {
        let mut view = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = view.as_object_mut() {
            o.remove("env");
            o.remove("env_sealed");
            o.insert(
                "env_names".into(),
                self.env.keys().cloned().collect::<Vec<_>>().into(),
            );
        }
        view
    }

    /// A digest of the canonical form, so the same request with different formatting or key
    /// order is recognised as the same for idempotency.
    pub fn digest(&self, workspace: &str) -> String {
        let mut canonical = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = canonical.as_object_mut() {
            o.insert("workspace".into(), serde_json::Value::from(workspace));
        }
        let bytes = serde_json::to_vec(&sort_keys(canonical)).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
        digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn locate_error(object: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    for (key, v) in object {
        let single = serde_json::Value::Object([(key.clone(), v.clone())].into_iter().collect());
        let result: Result<CreateBodyExtras, _> = serde_path_to_error::deserialize(single.clone());
        if let Err(e) = result {
            return Some(e.path().to_string());
        }
        let result: Result<Request, _> = serde_path_to_error::deserialize(single);
        if let Err(e) = result {
            return Some(e.path().to_string());
        }
    }
    None
}

/// The fields of the create body that are not the router's.
#[derive(Deserialize)]
struct CreateBodyExtras {
    #[serde(default)]
    #[allow(dead_code)]
    workspace: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    credentials: Vec<String>,
    #[serde(default)]
    #[allow(dead_code)]
    snapshot: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    dry_run: bool,
    #[serde(default)]
    #[allow(dead_code)]
    ttl_secs: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    env: BTreeMap<String, String>,
}

/// A sandbox's `env`: bounded, names a shell can export, values the kernel can pass, and
/// none of the variables sandgate sets for egress (a sandbox's proxy and CA are not the
/// caller's to move). Messages name the variable, never its value.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), BodyError> {
    let error = |field: String, message: String| Err(BodyError { field, message });
    if env.len() > MAX_ENV_VARS {
        return error(
            "env".into(),
            format!("must have at most {MAX_ENV_VARS} variables"),
        );
    }
    for (name, value) in env {
        let valid = !name.is_empty()
            && name.len() <= 256
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return error(
                "env".into(),
                "a variable name must be 1 to 256 of A-Z, a-z, 0-9 and '_', not starting with a digit".into(),
            );
        }
        if is_reserved_env(name) {
            return error(
                format!("env.{name}"),
                "is set by sandgate (the sandbox's proxy, CA or NO_PROXY) and cannot be given"
                    .into(),
            );
        }
        if value.len() > MAX_ENV_VALUE_BYTES || value.contains('\0') {
            return error(
                format!("env.{name}"),
                format!("must be at most {MAX_ENV_VALUE_BYTES} bytes without a NUL character"),
            );
        }
    }
    Ok(())
}

/// The variables sandgate sets in every sandbox for its egress.
pub fn is_reserved_env(name: &str) -> bool {
    crate::localbox::PROXY_ENV_VARS
        .iter()
        .chain(crate::localbox::CA_ENV_VARS.iter())
        .any(|v| v.eq_ignore_ascii_case(name))
        || name.eq_ignore_ascii_case("NO_PROXY")
}

fn sort_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(o) => {
            let sorted: std::collections::BTreeMap<String, serde_json::Value> =
                o.into_iter().map(|(k, v)| (k, sort_keys(v))).collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_top_level_field_is_refused() {
        let err = CreateBody::parse(json!({"gpu_please": true})).unwrap_err();
        assert_eq!(err.field, "gpu_please");
        let err = CreateBody::parse(json!({"features": {"bogus": true}})).unwrap_err();
        assert!(err.field.starts_with("features"), "{}", err.field);
    }

    #[test]
    fn bounds_are_checked_with_the_field_path() {
        let field = |v| CreateBody::parse(v).unwrap_err().field;
        assert_eq!(field(json!({"resources": {"cpu": -2}})), "resources.cpu");
        assert_eq!(field(json!({"labels": {"a\u{0}": "b"}})), "labels");
        assert_eq!(field(json!({"workspace": "w\n"})), "workspace");
        assert_eq!(field(json!({"snapshot": ""})), "snapshot");
        assert_eq!(
            field(json!({"credentials": ["ok", "x\u{7}"]})),
            "credentials[1]"
        );
        assert!(CreateBody::parse(json!({"resources": {"cpu": 0.5}, "labels": {"a": ""}})).is_ok());
    }

    #[test]
    fn env_is_bounded_and_cannot_move_the_proxy() {
        let field = |v| CreateBody::parse(v).unwrap_err().field;
        assert_eq!(
            field(json!({"env": {"HTTPS_PROXY": "http://x"}})),
            "env.HTTPS_PROXY"
        );
        assert_eq!(field(json!({"env": {"no_proxy": "*"}})), "env.no_proxy");
        assert_eq!(
            field(json!({"env": {"SSL_CERT_FILE": "/x"}})),
            "env.SSL_CERT_FILE"
        );
        assert_eq!(field(json!({"env": {"1A": "x"}})), "env");
        assert_eq!(field(json!({"env": {"A": "x\u{0}"}})), "env.A");
        assert_eq!(field(json!({"env_sealed": "x"})), "env_sealed");
        let body = CreateBody::parse(json!({"env": {"API_KEY": "v", "_x1": ""}})).unwrap();
        assert_eq!(body.env["API_KEY"], "v");
    }

    #[test]
    fn digest_ignores_key_order_but_not_content() {
        let a = CreateBody::parse(json!({"labels": {"a": "1", "b": "2"}, "regions": ["us-east"]}))
            .unwrap();
        let b = CreateBody::parse(json!({"regions": ["us-east"], "labels": {"b": "2", "a": "1"}}))
            .unwrap();
        let c = CreateBody::parse(json!({"regions": ["eu-west"], "labels": {"b": "2", "a": "1"}}))
            .unwrap();
        assert_eq!(a.digest("ws"), b.digest("ws"));
        assert_ne!(a.digest("ws"), c.digest("ws"));
        assert_ne!(a.digest("ws"), a.digest("other"));
    }
}
