//! Policy input documents, built directly as regorus values (no JSON round trip on the
//! request path). Field names are a stable contract with policy authors; see
//! `policies/README.md`.
//!
//! Egress input:
//! ```json
//! {
//!   "phase": "connect" | "request",
//!   "sandbox": {"id", "workspace", "labels": {}, "allow_domains": [], "cidrs": ["10.0.0.0/8"]},
//!   "destination": {"host", "port", "ip" (null before resolution), "ips" ([] before it),
//!                   "scheme", "match_names": ["api.x.com", "*.x.com", "*.com"]},
//!   "request": {"method", "path", "headers": {"lower-case-name": "value"}}  // phase request
//! }
//! ```
//! At `connect` sandgate has not resolved the name yet: a name the policy refuses is never
//! looked up, because DNS queries are themselves an exfiltration channel.

use std::collections::BTreeMap;
use std::net::IpAddr;

use regorus::Value;

use crate::identity::Identity;

pub struct Destination<'a> {
    pub host: &'a str,
    pub port: u16,
    /// Every address the connection may be dialed on (vetted), in dialing order; empty
    /// before a name is resolved. An IP literal is its own single address.
    pub ips: &'a [IpAddr],
    pub scheme: &'a str,
}

pub struct RequestFacts<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a http::HeaderMap,
}

fn obj(entries: Vec<(&str, Value)>) -> Value {
    let map: BTreeMap<Value, Value> = entries
        .into_iter()
        .map(|(k, v)| (Value::from(k), v))
        .collect();
    Value::from(map)
}

pub fn sandbox_value(identity: &Identity) -> Value {
    let labels: BTreeMap<Value, Value> = identity
        .labels
        .iter()
        .map(|(k, v)| (Value::from(k.as_str()), Value::from(v.as_str())))
        .collect();
    obj(vec![
        ("id", Value::from(identity.id.as_str())),
        ("workspace", Value::from(identity.workspace.as_str())),
        ("labels", Value::from(labels)),
        (
            "allow_domains",
            Value::from(
                identity
                    .allow_domains
                    .iter()
                    .map(|d| Value::from(d.as_str()))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "cidrs",
            Value::from(
                identity
                    .cidrs
                    .iter()
                    .map(|net| Value::from(net.to_string()))
                    .collect::<Vec<_>>(),
            ),
        ),
    ])
}

/// `input.operation` values of the `sandgate.action` layer.
pub const ACTION_OPERATIONS: &[&str] = &[
    "exec",
    "files.read",
    "files.write",
    "files.list",
    "files.delete",
    "files.mkdir",
];

/// `input.operation` values of the `sandgate.lifecycle` layer.
pub const LIFECYCLE_OPERATIONS: &[&str] =
    &["start", "stop", "pause", "resume", "snapshot", "delete"];

pub fn destination_value(d: &Destination<'_>) -> Value {
    obj(vec![
        ("host", Value::from(d.host)),
        ("port", Value::from(d.port as u64)),
        (
            "ip",
            d.ips
                .first()
                .map(|ip| Value::from(ip.to_string()))
                .unwrap_or(Value::Null),
        ),
        (
            "ips",
            Value::from(
                d.ips
                    .iter()
                    .map(|ip| Value::from(ip.to_string()))
                    .collect::<Vec<_>>(),
            ),
        ),
        ("scheme", Value::from(d.scheme)),
        (
            "match_names",
            Value::from(
                crate::domain::match_names(d.host)
                    .into_iter()
                    .map(Value::from)
                    .collect::<Vec<_>>(),
            ),
        ),
    ])
}

/// Headers a policy may look at. `proxy-authorization` is consumed by sandgate and never
/// shown; other headers are the sandbox's own and are shown as sent (first value per name).
pub fn request_value(r: &RequestFacts<'_>) -> Value {
    let mut headers: BTreeMap<Value, Value> = BTreeMap::new();
    for (name, value) in r.headers.iter() {
        if name == http::header::PROXY_AUTHORIZATION {
            continue;
        }
        let key = Value::from(name.as_str());
        if headers.contains_key(&key) {
            continue;
        }
        headers.insert(
            key,
            Value::from(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        );
    }
    obj(vec![
        ("method", Value::from(r.method)),
        ("path", Value::from(r.path)),
        ("headers", Value::from(headers)),
    ])
}

pub fn egress_input(
    phase: &str,
    sandbox: Value,
    destination: Value,
    request: Option<Value>,
) -> Value {
    let mut entries = vec![
        ("phase", Value::from(phase)),
        ("sandbox", sandbox),
        ("destination", destination),
    ];
    if let Some(request) = request {
        entries.push(("request", request));
    }
    obj(entries)
}
