//! E2B's control-plane JSON (`spec/openapi.yml` of `e2b-dev/E2B`): the sandbox shapes the
//! API answers, the create and timeout bodies it takes, its error body and its `metadata`
//! list filter. sandgate's E2B adapter reads these from E2B; the facade writes them for
//! the SDKs. Field names are E2B's (`sandboxID`, `envdAccessToken`, ...).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The `Sandbox` schema: what create and connect answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreatedSandbox {
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    #[serde(rename = "envdVersion", default)]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(rename = "trafficAccessToken", default)]
    pub traffic_access_token: Option<String>,
}

/// The `ListedSandbox` schema (every field the SDKs require is always written).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListedSandbox {
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    /// RFC 3339.
    #[serde(rename = "startedAt", default)]
    pub started_at: String,
    /// RFC 3339: when the sandbox's timeout ends it.
    #[serde(rename = "endAt", default)]
    pub end_at: String,
    #[serde(rename = "cpuCount", default)]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB", default)]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB", default)]
    pub disk_size_mb: u64,
    #[serde(rename = "envdVersion", default)]
    pub envd_version: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// `running` or `paused`.
    #[serde(default)]
    pub state: String,
}

/// The `SandboxDetail` schema: a listed sandbox plus how to reach its envd.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
    /// Whether the sandbox may reach the internet (`false`: only `network.allowOut`).
    #[serde(
        rename = "allowInternetAccess",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    /// The sandbox's egress rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
}

/// `NewSandbox` / `NewSandboxV2`: what `POST /sandboxes` and `POST /v2/sandboxes` take.
/// Fields the facade cannot honour are kept as raw JSON so it can refuse them by name
/// rather than drop them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(rename = "autoPause", default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(
        rename = "envVars",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    /// Every other field, by name.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `SandboxNetworkConfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxNetwork {
    #[serde(rename = "allowOut", default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    #[serde(rename = "denyOut", default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// The body of `.../timeout`, `.../connect` and `.../resume` (`timeout` in seconds).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimeoutBody {
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// E2B's error body: `{code, message}` plus `error_code` for some failures.
pub fn error_body(status: u16, error_code: Option<&str>, message: &str) -> Value {
    let mut body = json!({"code": status, "message": message});
    if let Some(code) = error_code {
        body["error_code"] = json!(code);
    }
    body
}

/// The `metadata` query value of `GET /v2/sandboxes` for `pairs`: `k=v&k2=v2` with each side
/// URL-encoded (the HTTP client encodes the whole value once more).
pub fn metadata_filter(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The `metadata` filter as E2B's API parses it (`parseFilters` in `e2b-dev/infra`): the
/// (already query-decoded) value is unescaped once more, split into `k=v` pairs, and each
/// side unescaped again. `Err` is the 400's message.
pub fn parse_metadata_filter(value: &str) -> Result<BTreeMap<String, String>, String> {
    let query = query_unescape(value)?;
    let mut filters = BTreeMap::new();
    for pair in query.split('&') {
        let mut parts = pair.split('=');
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err("error parsing metadata: invalid key value pair in query".to_string());
        };
        filters.insert(query_unescape(key)?, query_unescape(value)?);
    }
    Ok(filters)
}

/// Go's `url.QueryUnescape`: `+` is a space, and a malformed `%` escape is an error.
fn query_unescape(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    for (i, _) in text.match_indices('%') {
        let valid = bytes
            .get(i + 1..i + 3)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
        if !valid {
            return Err("error when unescaping query: invalid escape".to_string());
        }
    }
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "error when unescaping query: not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_filter_round_trips_through_both_sides() {
        // E2B's own parsing cannot carry `&`, `=`, `%` or `+` in a key or value (it unescapes
        // before splitting), so neither side sends them.
        let pairs = [
            ("sandgate_sandbox", "sb-1"),
            ("a b", "ü x"),
            ("run", "7f3a"),
        ];
        let encoded = metadata_filter(&pairs);
        let parsed = parse_metadata_filter(&encoded).unwrap();
        let want: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(parsed, want);
    }

    #[test]
    fn a_malformed_metadata_filter_is_refused() {
        assert!(parse_metadata_filter("a").is_err());
        assert!(parse_metadata_filter("a=b=c").is_err());
        assert!(parse_metadata_filter("a=%zz").is_err());
        assert!(parse_metadata_filter("a=%ff").is_err());
    }

    #[test]
    fn the_shapes_use_e2b_field_names() {
        let created = CreatedSandbox {
            template_id: "base".into(),
            sandbox_id: "sb-1".into(),
            envd_access_token: Some("t".into()),
            ..Default::default()
        };
        let value = serde_json::to_value(&created).unwrap();
        assert_eq!(value["sandboxID"], "sb-1");
        assert_eq!(value["envdAccessToken"], "t");
        assert_eq!(value["trafficAccessToken"], Value::Null);
        let detail: SandboxDetail = serde_json::from_value(json!({
            "sandboxID": "x", "templateID": "base", "metadata": {"k": "v"},
            "envdAccessToken": "tok", "state": "running"
        }))
        .unwrap();
        assert_eq!(detail.listed.metadata["k"], "v");
        assert_eq!(detail.envd_access_token.as_deref(), Some("tok"));
        let new: NewSandbox = serde_json::from_value(json!({
            "templateID": "base", "envVars": {"A": "1"}, "mcp": {"x": 1},
            "network": {"allowOut": ["a.test"], "denyOut": ["0.0.0.0/0"], "maskRequestHost": "h"}
        }))
        .unwrap();
        assert_eq!(new.env_vars["A"], "1");
        assert!(new.other.contains_key("mcp"));
        let network = new.network.unwrap();
        assert_eq!(network.allow_out, ["a.test"]);
        assert!(network.other.contains_key("maskRequestHost"));
    }

    proptest::proptest! {
        #[test]
        fn any_metadata_filter_is_parsed_or_refused(text in "\\PC{0,40}") {
            let _ = parse_metadata_filter(&text);
        }
    }
}
