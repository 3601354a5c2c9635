//! AWS credentials: checking a sandbox's SigV4 request and re-signing it with the real key.
//!
//! Contract:
//! - Inside the sandbox an AWS SDK signs with a placeholder access key id (`sgph_…`) and a
//!   placeholder secret. The proxy parses the request's `Authorization` header
//!   ([`parse_authorization`]), checks (itself) that the access key id is the placeholder it
//!   issued, and calls [`resign`], which replaces the SigV4 signature with one made from the
//!   real key ([`AwsKeys`]). Nothing of the placeholder signature survives: `authorization`,
//!   `x-amz-date` and `x-amz-security-token` are removed and written afresh.
//! - The signature covers exactly what the client's covered: `host`, every header listed in
//!   the client's `SignedHeaders` that is still present, the method, the path and query as
//!   forwarded, and the payload hash the client declared ([`payload_of`]). What the client
//!   did not sign stays in the request, unsigned, so re-signing never widens what the
//!   upstream will take as authenticated.
//! - Payloads: `UNSIGNED-PAYLOAD`, a hex SHA-256 and `STREAMING-UNSIGNED-PAYLOAD-TRAILER` are
//!   re-signed as declared; without `x-amz-content-sha256` (non-S3 services) the caller hashes
//!   the body. Streaming *signed* payloads (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`)
//!   are re-signed as declared, and [`resign`] returns the new seed signature the caller
//!   re-signs every chunk from (`super::aws_chunked`); the SigV4a (ECDSA) streaming forms
//!   are refused ([`AwsError::StreamingSignedUnsupported`]).
//! - Only `AWS4-HMAC-SHA256` in the `Authorization` header is understood; SigV4a and presigned
//!   query strings are not re-signed.
//! - The signing itself (canonical request, string to sign, HMAC chain) is the `aws-sigv4`
//!   crate's; this module only decides what goes into it.
//! - Secrets appear in no error message and no `Debug` output; the headers written from them
//!   (`authorization`, `x-amz-security-token`) are marked sensitive.
//! - [`operation`] names what a request does (`s3:GetObject` on a bucket and key, a DynamoDB
//!   `GetItem`, a Bedrock `InvokeModel` on a model), as policy input. It is best effort and
//!   fails closed: a request it does not recognise has no operation and no action.
//! - S3 addressing (which part of the request names the bucket) is read from the host: an AWS
//!   S3 endpoint name, or the endpoint the credential configures (`<bucket>.<endpoint>` is
//!   virtual-hosted, `<endpoint>` itself path-style). Any other host could be either (for
//!   `a.b.example`, is `a` a bucket?), so such a request gets no addressing, bucket, key,
//!   operation or action rather than a guess a bucket rule could be bypassed with.

use std::borrow::Cow;
use std::time::SystemTime;

use aws_sigv4::http_request::{
    self, PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody,
    SignableRequest, SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use percent_encoding::percent_decode_str;
use serde::Deserialize;
use serde_json::json;

use super::Secret;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// A real `Authorization` header is a few hundred bytes; anything near this is not SigV4.
const MAX_AUTHORIZATION_LEN: usize = 8192;
const MAX_SIGNED_HEADERS: usize = 128;
const CONTENT_SHA256: &str = "x-amz-content-sha256";
const SECURITY_TOKEN: &str = "x-amz-security-token";
const AMZ_DATE: &str = "x-amz-date";
/// What [`resign`] removes and writes afresh; the client's values belong to the placeholder.
const REPLACED: [&str; 3] = ["authorization", AMZ_DATE, SECURITY_TOKEN];

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("malformed AWS SigV4 Authorization header: {0}")]
    AuthorizationMalformed(&'static str),
    #[error(
        "unsupported AWS signature algorithm: only AWS4-HMAC-SHA256 in the Authorization header \
         can be re-signed (SigV4a / ECDSA is not supported)"
    )]
    AlgorithmUnsupported,
    #[error("invalid x-amz-content-sha256: {0}")]
    PayloadHashInvalid(&'static str),
    #[error(
        "streaming signed payloads (STREAMING-AWS4-*-PAYLOAD) cannot be re-signed: each chunk's \
         signature chains from the placeholder's; configure the client to send UNSIGNED-PAYLOAD \
         or STREAMING-UNSIGNED-PAYLOAD-TRAILER (e.g. S3 over HTTPS with checksums in trailers)"
    )]
    StreamingSignedUnsupported,
    #[error("invalid AWS credential: {0}")]
    CredentialInvalid(Cow<'static, str>),
    #[error("AWS request signing failed: {0}")]
    SigningFailed(Cow<'static, str>),
}

impl AwsError {
    /// The stable error code the proxy answers with.
    pub fn code(&self) -> &'static str {
        match self {
            AwsError::AuthorizationMalformed(_) => "aws_authorization_malformed",
            AwsError::AlgorithmUnsupported => "aws_signature_algorithm_unsupported",
            AwsError::PayloadHashInvalid(_) => "aws_payload_hash_invalid",
            AwsError::StreamingSignedUnsupported => "aws_streaming_signature_unsupported",
            AwsError::CredentialInvalid(_) => "aws_credential_invalid",
            AwsError::SigningFailed(_) => "aws_signing_failed",
        }
    }
}

/// The parsed `Authorization: AWS4-HMAC-SHA256 Credential=AK/YYYYMMDD/region/service/aws4_request, SignedHeaders=a;b, Signature=hex` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedBy {
    pub access_key_id: String,
    pub date: String,
    pub region: String,
    pub service: String,
    /// Lower case, in the client's order, without duplicates.
    pub signed_headers: Vec<String>,
}

/// Strict: one algorithm, exactly the three components once each (in any order), a
/// five-part credential scope ending in `aws4_request`, a 64-hex signature. Tolerant of
/// spaces around the commas. The input's text never enters the error.
pub fn parse_authorization(value: &[u8]) -> Result<SignedBy, AwsError> {
    use AwsError::AuthorizationMalformed as Bad;
    if value.len() > MAX_AUTHORIZATION_LEN {
        return Err(Bad("longer than 8192 bytes"));
    }
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|t| t.is_ascii())
        .ok_or(Bad("not ASCII"))?
        .trim_matches([' ', '\t']);
    let Some(rest) = text.strip_prefix(ALGORITHM) else {
        return Err(if text.starts_with("AWS4-ECDSA-") {
            AwsError::AlgorithmUnsupported
        } else {
            Bad("does not start with AWS4-HMAC-SHA256")
        });
    };
    if !rest.starts_with(' ') {
        return Err(Bad("no space after the algorithm"));
    }

    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim_matches(' ');
        let (name, value) = part
            .split_once('=')
            .ok_or(Bad("a component is not name=value"))?;
        let slot = match name {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed_headers,
            "Signature" => &mut signature,
            _ => return Err(Bad("unknown component")),
        };
        if slot.replace(value).is_some() {
            return Err(Bad("a component appears twice"));
        }
    }
    let credential = credential.ok_or(Bad("no Credential"))?;
    let signed_headers = signed_headers.ok_or(Bad("no SignedHeaders"))?;
    let signature = signature.ok_or(Bad("no Signature"))?;

    if !is_hex64(signature) {
        return Err(Bad("Signature is not 64 hex digits"));
    }

    let mut scope = credential.split('/');
    let (Some(access_key_id), Some(date), Some(region), Some(service), Some(terminal), None) = (
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
    ) else {
        return Err(Bad("Credential is not AK/date/region/service/aws4_request"));
    };
    if access_key_id.is_empty()
        || access_key_id.len() > 128
        || !access_key_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Bad("invalid access key id"));
    }
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Bad("Credential date is not YYYYMMDD"));
    }
    if !is_scope_name(region) {
        return Err(Bad("invalid region in Credential"));
    }
    if !is_scope_name(service) {
        return Err(Bad("invalid service in Credential"));
    }
    if terminal != "aws4_request" {
        return Err(Bad("Credential does not end in aws4_request"));
    }

    let mut names: Vec<String> = Vec::new();
    for name in signed_headers.split(';') {
        if name.is_empty() || HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(Bad("invalid name in SignedHeaders"));
        }
        let name = name.to_ascii_lowercase();
        if names.contains(&name) {
            return Err(Bad("a header appears twice in SignedHeaders"));
        }
        if names.len() == MAX_SIGNED_HEADERS {
            return Err(Bad("too many SignedHeaders"));
        }
        names.push(name);
    }

    Ok(SignedBy {
        access_key_id: access_key_id.to_owned(),
        date: date.to_owned(),
        region: region.to_owned(),
        service: service.to_owned(),
        signed_headers: names,
    })
}

const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";

/// What the client declared about its payload (from `x-amz-content-sha256`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// `UNSIGNED-PAYLOAD`
    Unsigned,
    /// 64 hex digits, lower-cased.
    Hash(String),
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER`
    StreamingUnsignedTrailer,
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`: chunk signatures chain from the seed
    /// signature, so the body is re-signed too (`super::aws_chunked`).
    StreamingSigned { trailer: bool },
    /// `STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD[-TRAILER]` (SigV4a): not re-signed.
    StreamingSignedEcdsa,
    /// No header: the signature covers sha256(body), as for non-S3 services.
    Absent,
}

/// Any other value, or more than one header, is an error.
pub fn payload_of(headers: &HeaderMap) -> Result<Payload, AwsError> {
    use AwsError::PayloadHashInvalid as Bad;
    let mut values = headers.get_all(CONTENT_SHA256).iter();
    let Some(value) = values.next() else {
        return Ok(Payload::Absent);
    };
    if values.next().is_some() {
        return Err(Bad("more than one x-amz-content-sha256 header"));
    }
    let value = value.to_str().map_err(|_| Bad("not ASCII"))?;
    Ok(match value {
        "UNSIGNED-PAYLOAD" => Payload::Unsigned,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => Payload::StreamingUnsignedTrailer,
        STREAMING_SIGNED => Payload::StreamingSigned { trailer: false },
        STREAMING_SIGNED_TRAILER => Payload::StreamingSigned { trailer: true },
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"
        | "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER" => Payload::StreamingSignedEcdsa,
        hash if is_hex64(hash) => Payload::Hash(hash.to_ascii_lowercase()),
        _ => return Err(Bad("neither a SHA-256 hex digest nor a known payload mode")),
    })
}

/// The real key a request is re-signed with.
#[derive(Debug, Clone)]
pub struct AwsKeys {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysDocument {
    access_key_id: String,
    secret_access_key: Secret,
    #[serde(default)]
    session_token: Option<Secret>,
}

impl AwsKeys {
    /// The secret document as stored: JSON `{"access_key_id": "...", "secret_access_key": "...", "session_token": "..."?}`
    /// (unknown fields refused, empty values refused).
    pub fn parse(secret: &Secret) -> Result<AwsKeys, AwsError> {
        use AwsError::CredentialInvalid as Bad;
        // serde_json's message may quote the document (an unknown field's name, a value of
        // the wrong type), and the document is the secret: keep only its position.
        let document: KeysDocument = serde_json::from_str(secret.expose()).map_err(|e| {
            Bad(format!(
                "the secret is not a JSON object with string fields access_key_id, \
                 secret_access_key and optionally session_token, and no others \
                 (line {}, column {})",
                e.line(),
                e.column()
            )
            .into())
        })?;
        let access_key_id = document.access_key_id;
        if access_key_id.is_empty() {
            return Err(Bad("access_key_id is empty".into()));
        }
        // It is written into the Authorization header and must not split its components.
        if access_key_id.len() > 128
            || !access_key_id
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"/,;=".contains(&b))
        {
            return Err(Bad(
                "access_key_id must be up to 128 visible ASCII characters without / , ; =".into(),
            ));
        }
        if document.secret_access_key.is_empty() {
            return Err(Bad("secret_access_key is empty".into()));
        }
        if let Some(token) = &document.session_token {
            if token.is_empty() {
                return Err(Bad("session_token is empty".into()));
            }
            // It becomes the x-amz-security-token header as it is.
            if !token.expose().bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Bad(
                    "session_token must be visible ASCII (it is sent as a header)".into(),
                ));
            }
        }
        Ok(AwsKeys {
            access_key_id,
            secret_access_key: document.secret_access_key,
            session_token: document.session_token,
        })
    }
}

/// Re-signs in place: removes the client's `authorization`, `x-amz-date`,
/// `x-amz-security-token`, then signs with `keys` for `service`/`region` at `now`, covering
/// `host` (as `host_header`, not inserted into `headers`: the HTTP client sets it from the
/// URI), every header in `signed_by.signed_headers` still present (except those removed),
/// and what the signer adds (`x-amz-date`, `x-amz-content-sha256` unless the payload is
/// [`Payload::Absent`], `x-amz-security-token` with a session token).
///
/// `headers` must be the headers as they will be forwarded (hop-by-hop ones already
/// stripped): a signed header changed afterwards breaks the signature. `uri` is the URI as
/// forwarded, `https://{authority}{path_and_query}`. `body_sha256` (hex) is required with
/// [`Payload::Absent`] and ignored otherwise. On error `headers` is left unchanged.
#[allow(clippy::too_many_arguments)]
pub fn resign(
    headers: &mut HeaderMap,
    method: &Method,
    uri: &str,
    host_header: &str,
    signed_by: &SignedBy,
    payload: &Payload,
    body_sha256: Option<&str>,
    keys: &AwsKeys,
    service: &str,
    region: &str,
    now: SystemTime,
) -> Result<String, AwsError> {
    use AwsError::SigningFailed as Failed;

    let (body, checksum) = match payload {
        Payload::StreamingSignedEcdsa => return Err(AwsError::StreamingSignedUnsupported),
        Payload::StreamingSigned { trailer } => (
            SignableBody::Precomputed(
                match trailer {
                    true => STREAMING_SIGNED_TRAILER,
                    false => STREAMING_SIGNED,
                }
                .into(),
            ),
            PayloadChecksumKind::XAmzSha256,
        ),
        Payload::Absent => {
            let hash = body_sha256
                .filter(|h| is_hex64(h))
                .ok_or(AwsError::PayloadHashInvalid(
                    "the body's SHA-256 is required when the request has no x-amz-content-sha256",
                ))?;
            (
                SignableBody::Precomputed(hash.to_ascii_lowercase()),
                PayloadChecksumKind::NoHeader,
            )
        }
        Payload::Unsigned => (
            SignableBody::UnsignedPayload,
            PayloadChecksumKind::XAmzSha256,
        ),
        Payload::Hash(hash) if is_hex64(hash) => (
            SignableBody::Precomputed(hash.to_ascii_lowercase()),
            PayloadChecksumKind::XAmzSha256,
        ),
        Payload::Hash(_) => return Err(AwsError::PayloadHashInvalid("not 64 hex digits")),
        Payload::StreamingUnsignedTrailer => (
            SignableBody::StreamingUnsignedPayloadTrailer,
            PayloadChecksumKind::XAmzSha256,
        ),
    };
    if !is_scope_name(service) || !is_scope_name(region) {
        return Err(Failed(
            "service and region must be lower-case letters, digits and '-'".into(),
        ));
    }
    if host_header.is_empty() || HeaderValue::from_str(host_header).is_err() {
        return Err(Failed("the host is not a valid header value".into()));
    }
    // The signature covers `host_header`; a different Host sent upstream would void it.
    if let Some(host) = headers.get(http::header::HOST) {
        if !host.as_bytes().eq_ignore_ascii_case(host_header.as_bytes()) {
            return Err(Failed(
                "the request's Host header differs from the host being signed".into(),
            ));
        }
    }

    // Exactly what gets signed. `host` is given rather than left to the signer, which would
    // derive it from the URI's authority (and panic on a URI without one): the signed value
    // must be the one the HTTP client sends.
    let mut signable: Vec<(&str, &str)> = vec![("host", host_header)];
    for name in &signed_by.signed_headers {
        // `host` is above; `x-amz-content-sha256` is written by the signer from `payload`
        // unless the payload is Absent.
        let written_by_signer =
            name == CONTENT_SHA256 && checksum == PayloadChecksumKind::XAmzSha256;
        if REPLACED.contains(&name.as_str()) || name == "host" || written_by_signer {
            continue;
        }
        for value in headers.get_all(name.as_str()) {
            let value = std::str::from_utf8(value.as_bytes())
                .map_err(|_| Failed(format!("signed header {name:?} is not valid UTF-8").into()))?;
            signable.push((name.as_str(), value));
        }
    }

    let mut settings = SigningSettings::default();
    // S3 signs the path as sent (single encoding, no dot-segment removal); every other
    // service takes the SigV4 defaults.
    if matches!(service, "s3" | "s3-object-lambda" | "s3express") {
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    } else {
        settings.percent_encoding_mode = PercentEncodingMode::Double;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Enabled;
    }
    settings.payload_checksum_kind = checksum;
    settings.session_token_mode = SessionTokenMode::Include;
    // The default excludes user-agent, x-amzn-trace-id and transfer-encoding even when
    // given; we pass only what the client signed, so that is what must be signed.
    settings.excluded_headers = Some(Vec::new());

    let identity: Identity = aws_credential_types::Credentials::new(
        keys.access_key_id.as_str(),
        keys.secret_access_key.expose(),
        keys.session_token.as_ref().map(|t| t.expose().to_owned()),
        None,
        "sandgate",
    )
    .into();
    let params: http_request::SigningParams = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| Failed(format!("signing parameters: {e}").into()))?
        .into();
    let request = SignableRequest::new(method.as_str(), uri, signable.into_iter(), body)
        .map_err(|e| Failed(describe_signing_error(&e).into()))?;
    let (instructions, signature) = http_request::sign(request, &params)
        .map_err(|e| Failed(describe_signing_error(&e).into()))?
        .into_parts();
    let (written, query) = instructions.into_parts();
    if !query.is_empty() {
        return Err(Failed("the signer asked for query parameters".into()));
    }

    let mut values = Vec::with_capacity(written.len());
    for header in &written {
        let mut value = HeaderValue::from_str(header.value())
            .map_err(|_| Failed(format!("signer wrote an invalid {}", header.name()).into()))?;
        // The crate marks only the token sensitive; the Authorization header carries the
        // signature that proves possession of the key, so it is too.
        value.set_sensitive(
            header.sensitive() || matches!(header.name(), "authorization" | SECURITY_TOKEN),
        );
        values.push((header.name(), value));
    }
    for name in REPLACED {
        headers.remove(name);
    }
    for (name, value) in values {
        headers.insert(name, value);
    }
    Ok(signature)
}

fn describe_signing_error(e: &dyn std::error::Error) -> String {
    // The crate's messages and their sources (http's parse errors) name no value.
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The operation a request targets, for policy input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub service: String,
    pub region: String,
    /// The API operation, e.g. `GetObject`.
    pub operation: Option<String>,
    /// The IAM action AWS authorizes it as, e.g. `s3:GetObject` (`s3:ListBucket` for
    /// `ListObjectsV2`).
    pub action: Option<String>,
    pub bucket: Option<String>,
    /// The object key, percent-decoded.
    pub key: Option<String>,
    /// The other resource an operation names: the model id for Bedrock, the copy source
    /// (`bucket/key`, percent-decoded) for S3 copies.
    pub resource: Option<String>,
    /// S3 only: `virtual_hosted` or `path`; `None` when the host does not say (see the
    /// module documentation) and for other services.
    pub addressing: Option<&'static str>,
}

impl Operation {
    pub fn to_value(&self) -> regorus::Value {
        regorus::Value::from(json!({
            "service": self.service,
            "region": self.region,
            "operation": self.operation,
            "action": self.action,
            "bucket": self.bucket,
            "key": self.key,
            "resource": self.resource,
            "addressing": self.addressing,
        }))
    }
}

/// [`operation_at`] for a credential without an `endpoint` (AWS's own host names only).
pub fn operation(
    service: &str,
    region: &str,
    method: &str,
    host: &str,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Operation {
    operation_at(service, region, None, method, host, path_and_query, headers)
}

/// `host` may carry a port; `path_and_query` is the request target as forwarded; `endpoint`
/// is the S3-compatible endpoint host the credential configures.
pub fn operation_at(
    service: &str,
    region: &str,
    endpoint: Option<&str>,
    method: &str,
    host: &str,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Operation {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut op = Operation {
        service: service.to_owned(),
        region: region.to_owned(),
        operation: None,
        action: None,
        bucket: None,
        key: None,
        resource: None,
        addressing: None,
    };
    let named = match service {
        "s3" => s3_operation(&mut op, endpoint, method, host, path, query, headers),
        "bedrock" => bedrock_operation(&mut op, method, path),
        _ => json_or_query_operation(service, query, headers),
    };
    if let Some((operation, action)) = named {
        op.operation = Some(operation);
        op.action = Some(action);
    }
    op
}

/// Query parameters that refine an S3 operation without choosing another one.
const S3_PLAIN_PARAMS: &[&str] = &[
    "x-id",
    "prefix",
    "delimiter",
    "marker",
    "max-keys",
    "encoding-type",
    "list-type",
    "continuation-token",
    "fetch-owner",
    "start-after",
    "key-marker",
    "version-id-marker",
    "upload-id-marker",
    "max-uploads",
    "max-parts",
    "part-number-marker",
    "versionId",
    "partNumber",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "max-buckets",
    "bucket-region",
];

/// Sub-resources that select a different S3 operation, and that [`s3_name`] maps.
const S3_SUBRESOURCES: &[&str] = &[
    "acl",
    "attributes",
    "cors",
    "delete",
    "encryption",
    "lifecycle",
    "location",
    "policy",
    "tagging",
    "uploadId",
    "uploads",
    "versioning",
    "versions",
];

fn s3_operation(
    op: &mut Operation,
    endpoint: Option<&str>,
    method: &str,
    host: &str,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Option<(String, String)> {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let non_empty = |s: String| Some(s).filter(|s| !s.is_empty());
    let rest = path.strip_prefix('/').unwrap_or(path);
    match s3_addressing(host, endpoint) {
        Addressing::VirtualHosted(bucket) => {
            op.addressing = Some("virtual_hosted");
            op.bucket = Some(bucket);
            op.key = non_empty(decode(rest));
        }
        Addressing::Path => {
            op.addressing = Some("path");
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            op.bucket = non_empty(decode(bucket));
            op.key = op.bucket.as_ref().and_then(|_| non_empty(decode(key)));
        }
        // Neither bucket, key nor operation: each would be a guess.
        Addressing::Unknown => return None,
    }

    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let mut sub = None;
    for (name, _) in &params {
        if S3_SUBRESOURCES.contains(&name.as_str()) {
            // Two sub-resources (`?acl&tagging`) name no single operation.
            if sub.is_some_and(|s| s != name.as_str()) {
                return None;
            }
            sub = Some(name.as_str());
        } else if !S3_PLAIN_PARAMS.contains(&name.as_str()) {
            // An unknown parameter may select an operation we do not know: name none.
            return None;
        }
    }
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let copy_source = headers
        .get("x-amz-copy-source")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let v = v.split_once('?').map_or(v, |(source, _)| source);
            decode(v.strip_prefix('/').unwrap_or(v))
        });

    let (operation, action) = s3_name(
        method,
        op.bucket.is_some(),
        op.key.is_some(),
        sub,
        param("list-type"),
        param("partNumber").is_some(),
        copy_source.is_some(),
    )?;
    if operation.contains("Copy") {
        op.resource = copy_source;
    }
    Some((operation.to_owned(), format!("s3:{action}")))
}

/// (operation, IAM action without the `s3:` prefix), as the S3 API reference pairs them.
fn s3_name(
    method: &str,
    bucket: bool,
    key: bool,
    sub: Option<&str>,
    list_type: Option<&str>,
    part_number: bool,
    copy: bool,
) -> Option<(&'static str, &'static str)> {
    Some(match (bucket, key) {
        (false, _) => match (method, sub) {
            ("GET", None) => ("ListBuckets", "ListAllMyBuckets"),
            _ => return None,
        },
        (true, false) => match (method, sub) {
            ("GET", None) => match list_type {
                Some("2") => ("ListObjectsV2", "ListBucket"),
                None => ("ListObjects", "ListBucket"),
                Some(_) => return None,
            },
            ("GET", Some("location")) => ("GetBucketLocation", "GetBucketLocation"),
            ("GET", Some("versions")) => ("ListObjectVersions", "ListBucketVersions"),
            ("GET", Some("uploads")) => ("ListMultipartUploads", "ListBucketMultipartUploads"),
            ("GET", Some("policy")) => ("GetBucketPolicy", "GetBucketPolicy"),
            ("GET", Some("acl")) => ("GetBucketAcl", "GetBucketAcl"),
            ("GET", Some("tagging")) => ("GetBucketTagging", "GetBucketTagging"),
            ("GET", Some("versioning")) => ("GetBucketVersioning", "GetBucketVersioning"),
            ("GET", Some("cors")) => ("GetBucketCors", "GetBucketCORS"),
            ("GET", Some("lifecycle")) => (
                "GetBucketLifecycleConfiguration",
                "GetLifecycleConfiguration",
            ),
            ("GET", Some("encryption")) => ("GetBucketEncryption", "GetEncryptionConfiguration"),
            ("HEAD", None) => ("HeadBucket", "ListBucket"),
            ("PUT", None) => ("CreateBucket", "CreateBucket"),
            ("PUT", Some("policy")) => ("PutBucketPolicy", "PutBucketPolicy"),
            ("PUT", Some("acl")) => ("PutBucketAcl", "PutBucketAcl"),
            ("PUT", Some("tagging")) => ("PutBucketTagging", "PutBucketTagging"),
            ("PUT", Some("versioning")) => ("PutBucketVersioning", "PutBucketVersioning"),
            ("PUT", Some("cors")) => ("PutBucketCors", "PutBucketCORS"),
            ("PUT", Some("lifecycle")) => (
                "PutBucketLifecycleConfiguration",
                "PutLifecycleConfiguration",
            ),
            ("PUT", Some("encryption")) => ("PutBucketEncryption", "PutEncryptionConfiguration"),
            ("DELETE", None) => ("DeleteBucket", "DeleteBucket"),
            ("DELETE", Some("policy")) => ("DeleteBucketPolicy", "DeleteBucketPolicy"),
            ("DELETE", Some("tagging")) => ("DeleteBucketTagging", "PutBucketTagging"),
            ("DELETE", Some("cors")) => ("DeleteBucketCors", "PutBucketCORS"),
            ("DELETE", Some("lifecycle")) => ("DeleteBucketLifecycle", "PutLifecycleConfiguration"),
            ("DELETE", Some("encryption")) => {
                ("DeleteBucketEncryption", "PutEncryptionConfiguration")
            }
            ("POST", Some("delete")) => ("DeleteObjects", "DeleteObject"),
            _ => return None,
        },
        (true, true) => match (method, sub) {
            ("GET", None) => ("GetObject", "GetObject"),
            ("GET", Some("acl")) => ("GetObjectAcl", "GetObjectAcl"),
            ("GET", Some("tagging")) => ("GetObjectTagging", "GetObjectTagging"),
            ("GET", Some("attributes")) => ("GetObjectAttributes", "GetObjectAttributes"),
            ("GET", Some("uploadId")) => ("ListParts", "ListMultipartUploadParts"),
            ("HEAD", None) => ("HeadObject", "GetObject"),
            ("PUT", None) if copy => ("CopyObject", "PutObject"),
            ("PUT", None) => ("PutObject", "PutObject"),
            ("PUT", Some("uploadId")) if !part_number => return None,
            ("PUT", Some("uploadId")) if copy => ("UploadPartCopy", "PutObject"),
            ("PUT", Some("uploadId")) => ("UploadPart", "PutObject"),
            ("PUT", Some("acl")) => ("PutObjectAcl", "PutObjectAcl"),
            ("PUT", Some("tagging")) => ("PutObjectTagging", "PutObjectTagging"),
            ("DELETE", None) => ("DeleteObject", "DeleteObject"),
            ("DELETE", Some("uploadId")) => ("AbortMultipartUpload", "AbortMultipartUpload"),
            ("DELETE", Some("tagging")) => ("DeleteObjectTagging", "DeleteObjectTagging"),
            ("POST", Some("uploads")) => ("CreateMultipartUpload", "PutObject"),
            ("POST", Some("uploadId")) => ("CompleteMultipartUpload", "PutObject"),
            _ => return None,
        },
    })
}

/// Where an S3 request names its bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Addressing {
    /// In the host (`bucket.endpoint`): the whole path is the key.
    VirtualHosted(String),
    /// In the first path segment.
    Path,
    /// The host does not say.
    Unknown,
}

/// The addressing style `host` (possibly with a port) implies: `endpoint` (the credential's
/// S3-compatible endpoint, a host name) is path-style and `<bucket>.<endpoint>` virtual-hosted;
/// an AWS S3 name is read as AWS writes them ([`aws_s3_addressing`]); any other host is
/// [`Addressing::Unknown`].
fn s3_addressing(host: &str, endpoint: Option<&str>) -> Addressing {
    let host = host.to_ascii_lowercase();
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host.as_str(),
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if let Some(endpoint) = endpoint {
        let endpoint = endpoint.to_ascii_lowercase();
        let endpoint = endpoint.strip_suffix('.').unwrap_or(&endpoint);
        if host == endpoint {
            return Addressing::Path;
        }
        if let Some(bucket) = host
            .strip_suffix(endpoint)
            .and_then(|rest| rest.strip_suffix('.'))
            .filter(|bucket| !bucket.is_empty())
        {
            return Addressing::VirtualHosted(bucket.to_owned());
        }
    }
    aws_s3_addressing(host)
}

/// AWS's S3 host names: `bucket.s3.amazonaws.com`, `bucket.s3.REGION.amazonaws.com`,
/// `bucket.s3-REGION.amazonaws.com` (and the dualstack, FIPS and accelerate forms) are
/// virtual-hosted; the bare endpoints path-style. Another host, or an AWS name without an S3
/// endpoint label, is [`Addressing::Unknown`]. `host` is lower case, without port.
fn aws_s3_addressing(host: &str) -> Addressing {
    let Some(rest) = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"))
    else {
        return Addressing::Unknown;
    };
    let labels: Vec<&str> = rest.split('.').collect();
    // The endpoint label (`s3`, `s3-REGION`, `s3-fips`, `s3-accelerate`…) is followed by at
    // most two labels (`dualstack`, a region); bucket names may hold dots and `s3` labels,
    // so the endpoint is the rightmost match.
    let at = (0..labels.len())
        .rev()
        .take(3)
        .find(|&i| labels[i] == "s3" || labels[i].starts_with("s3-"));
    match at {
        None => Addressing::Unknown,
        Some(0) => Addressing::Path,
        Some(at) => Addressing::VirtualHosted(labels[..at].join(".")),
    }
}

/// Checks a credential's `endpoint`: a host name (no scheme, port or path), as the S3
/// client is pointed at.
pub(crate) fn is_endpoint_name(endpoint: &str) -> bool {
    endpoint.len() <= 253
        && !endpoint.is_empty()
        && endpoint.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

fn bedrock_operation(op: &mut Operation, method: &str, path: &str) -> Option<(String, String)> {
    if method != "POST" {
        return None;
    }
    let mut segments = path.split('/');
    let ("", Some("model"), Some(model), Some(verb), None) = (
        segments.next()?,
        segments.next(),
        segments.next(),
        segments.next(),
        segments.next(),
    ) else {
        return None;
    };
    // The IAM actions are the Bedrock API reference's: Converse "requires permission for the
    // bedrock:InvokeModel action", ConverseStream for bedrock:InvokeModelWithResponseStream.
    let (operation, action) = match verb {
        "invoke" => ("InvokeModel", "InvokeModel"),
        "invoke-with-response-stream" => (
            "InvokeModelWithResponseStream",
            "InvokeModelWithResponseStream",
        ),
        "converse" => ("Converse", "InvokeModel"),
        "converse-stream" => ("ConverseStream", "InvokeModelWithResponseStream"),
        _ => return None,
    };
    let model = percent_decode_str(model).decode_utf8_lossy();
    if model.is_empty() {
        return None;
    }
    op.resource = Some(model.into_owned());
    Some((operation.to_owned(), format!("bedrock:{action}")))
}

/// JSON protocol (`X-Amz-Target: Prefix_20120810.GetItem`), else query protocol
/// (`?Action=GetCallerIdentity`).
fn json_or_query_operation(
    service: &str,
    query: &str,
    headers: &HeaderMap,
) -> Option<(String, String)> {
    let mut targets = headers.get_all("x-amz-target").iter();
    let name = match (targets.next(), targets.next()) {
        (Some(target), None) => target.to_str().ok()?.rsplit_once('.')?.1.to_owned(),
        (Some(_), Some(_)) => return None,
        (None, _) => {
            let mut actions = url::form_urlencoded::parse(query.as_bytes())
                .filter(|(k, _)| k == "Action")
                .map(|(_, v)| v.into_owned());
            match (actions.next(), actions.next()) {
                (Some(action), None) => action,
                _ => return None,
            }
        }
    };
    if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    // The IAM prefix is the signing name, except where AWS made them differ.
    let prefix = match service {
        "monitoring" => "cloudwatch",
        other => other,
    };
    let action = format!("{prefix}:{name}");
    Some((name, action))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A region or service name in a credential scope.
pub(crate) fn is_scope_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
#[path = "aws_tests.rs"]
mod tests;
