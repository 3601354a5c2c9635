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
    "pty",
    "stdin",
    "ports",
    "watch",
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

/// The keys and phases of every egress input, made once per thread: `Value::from(&str)`
/// allocates a string, and every request's input names the same ones (with the map built
/// from them in order, this was ~3k instructions of the input a request built).
struct EgressKeys {
    phase: Value,
    sandbox: Value,
    destination: Value,
    request: Value,
    method: Value,
    path: Value,
    headers: Value,
    connect: Value,
}

thread_local! {
    static EGRESS_KEYS: EgressKeys = EgressKeys {
        phase: Value::from("phase"),
        sandbox: Value::from("sandbox"),
        destination: Value::from("destination"),
        request: Value::from("request"),
        method: Value::from("method"),
        path: Value::from("path"),
        headers: Value::from("headers"),
        connect: Value::from("connect"),
    };
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
        // Straight into the engine's string when the bytes are UTF-8 (one copy, not two).
        let text = match std::str::from_utf8(value.as_bytes()) {
            Ok(text) => Value::from(text),
            Err(_) => Value::from(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        };
        headers.insert(key, text);
    }
    EGRESS_KEYS.with(|k| {
        Value::from(BTreeMap::from([
            (k.headers.clone(), Value::from(headers)),
            (k.method.clone(), Value::from(r.method)),
            (k.path.clone(), Value::from(r.path)),
        ]))
    })
}

pub fn egress_input(
    phase: &str,
    sandbox: Value,
    destination: Value,
    request: Option<Value>,
) -> Value {
    EGRESS_KEYS.with(|k| {
        let phase = match phase {
            "connect" => k.connect.clone(),
            "request" => k.request.clone(),
            other => Value::from(other),
        };
        let mut input = BTreeMap::from([
            (k.destination.clone(), destination),
            (k.phase.clone(), phase),
            (k.sandbox.clone(), sandbox),
        ]);
        if let Some(request) = request {
            input.insert(k.request.clone(), request);
        }
        Value::from(input)
    })
}

/// The sandbox a `sandgate.lifecycle` or `sandgate.action` decision is about, as stored.
pub struct SandboxFacts<'a> {
    pub id: &'a str,
    pub workspace: &'a str,
    /// The stored labels (a JSON object; anything else is shown as `{}`).
    pub labels_json: &'a str,
    pub state: &'a str,
    /// The placement, once placed.
    pub pool: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub account: Option<&'a str>,
}

/// What an operation names beyond its name: the input key it fills (`exec`, `file`,
/// `snapshot`, `timeout`); every other such key stays as the base input has it.
pub enum OperationDetail<'a> {
    /// Nothing beyond the operation (lifecycle transitions, minting, metrics, delete).
    None,
    /// `input.exec` of a command to start. Environment values may hold secrets: policy
    /// sees the names only.
    Exec {
        argv: &'a [String],
        cwd: Option<&'a str>,
        env_names: Vec<&'a str>,
        /// The user asked for (`null`: the pool's default user).
        user: Option<&'a str>,
    },
    /// `input.exec.exec_id`: acting on a running `/v1` exec.
    ExecId(&'a str),
    /// `input.exec.pid`: acting on a running E2B facade process.
    ExecPid(u32),
    /// `input.file`: its `path`, and for a move its `destination`.
    File {
        path: &'a str,
        destination: Option<&'a str>,
    },
    /// `input.file` of a `watch`: the directory's `path` and `recursive`.
    Watch { path: &'a str, recursive: bool },
    /// `input.snapshot`: `kind` and `paths` (null for a provider snapshot).
    Snapshot {
        kind: &'a str,
        paths: Option<&'a [String]>,
    },
    /// `input.timeout.ttl_secs` of `set_timeout`.
    Timeout { ttl_secs: u64 },
    /// `input.port` of operation `ports`: the port `number`, and whether the request asks
    /// for `public` access (it carries no token, so no principal vouches for it).
    Port { number: u16, public: bool },
}

impl OperationDetail<'_> {
    /// The input key this detail fills and its value.
    fn entry(&self) -> Option<(&'static str, serde_json::Value)> {
        use serde_json::json;
        Some(match self {
            OperationDetail::None => return None,
            OperationDetail::Exec {
                argv,
                cwd,
                env_names,
                user,
            } => (
                "exec",
                json!({"argv": argv, "cwd": cwd, "env_names": env_names, "user": user}),
            ),
            OperationDetail::ExecId(exec_id) => ("exec", json!({"exec_id": exec_id})),
            OperationDetail::ExecPid(pid) => ("exec", json!({"pid": pid})),
            OperationDetail::File {
                path,
                destination: None,
            } => ("file", json!({"path": path})),
            OperationDetail::File {
                path,
                destination: Some(to),
            } => ("file", json!({"path": path, "destination": to})),
            OperationDetail::Watch { path, recursive } => {
                ("file", json!({"path": path, "recursive": recursive}))
            }
            OperationDetail::Snapshot { kind, paths } => {
                ("snapshot", json!({"kind": kind, "paths": paths}))
            }
            OperationDetail::Timeout { ttl_secs } => ("timeout", json!({"ttl_secs": ttl_secs})),
            OperationDetail::Port { number, public } => {
                ("port", json!({"number": number, "public": public}))
            }
        })
    }
}

/// The input of the `sandgate.lifecycle` and `sandgate.action` layers (see
/// `policies/README.md`): `operation`, `principal`, `workspace`, `sandbox`, `exec`, `file`,
/// `delegation`, plus what `detail` fills.
pub fn operation_input(
    operation: &str,
    caller: &crate::base::Principal,
    sandbox: &SandboxFacts<'_>,
    detail: &OperationDetail<'_>,
) -> Value {
    use serde_json::json;
    let labels: serde_json::Value = serde_json::from_str(sandbox.labels_json).unwrap_or(json!({}));
    let mut input = json!({
        "operation": operation,
        "principal": {
            "principal": caller.principal,
            "workspace": caller.workspace,
            "roles": caller.roles,
        },
        "workspace": sandbox.workspace,
        "sandbox": {
            "id": sandbox.id,
            "workspace": sandbox.workspace,
            "labels": labels,
            "state": sandbox.state,
            "pool": sandbox.pool,
            "provider": sandbox.provider,
            "account": sandbox.account,
        },
        "exec": null,
        "file": null,
        "delegation": caller.delegation.as_ref().map(|d| json!({
            "id": d.id,
            "agent": d.agent,
            "actions": d.actions,
            "expires_ms": d.expires_ms,
        })),
    });
    if let (Some(object), Some((key, value))) = (input.as_object_mut(), detail.entry()) {
        object.insert(key.to_string(), value);
    }
    Value::from(input)
}

/// What the `sandgate.creation` and `sandgate.provider` layers are told about one candidate
/// pool of a create (see `policies/README.md`).
pub struct AdmissionFacts<'a> {
    pub caller: (&'a str, &'a str, &'a [String]),
    pub workspace: &'a str,
    pub sandbox_id: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The create body as policy sees it (environment values removed).
    pub request: serde_json::Value,
    /// The candidate's provider and account names, and its pool and account as configured.
    pub provider: &'a str,
    pub account: &'a str,
    pub pool: Option<&'a sandgate_router::Pool>,
    pub provider_kind: Option<&'a str>,
    pub account_config: Option<&'a sandgate_router::Account>,
    /// 1 for the first pool the walk tries.
    pub attempt: i64,
    pub dry_run: bool,
}

/// The input of the `sandgate.creation` and `sandgate.provider` layers.
pub fn admission_input(f: &AdmissionFacts<'_>) -> Value {
    use serde_json::json;
    let (principal, principal_workspace, roles) = f.caller;
    let pool = f.pool.map(|p| {
        json!({
            "name": p.name.as_ref(),
            "provider": f.provider,
            "provider_kind": f.provider_kind,
            "account": f.account,
            "geography": p.geography,
            "region": p.region.as_deref(),
            "zone": p.zone.as_deref(),
            "labels": p.labels,
            "vpc": p.vpc,
            "price": p.price,
            "standby": p.standby,
            "egress": p.capabilities.egress.as_str(),
        })
    });
    let account = f.account_config.map(|a| {
        json!({
            "name": a.name.as_ref(),
            "provider": f.provider,
            "billing": a.billing,
            "labels": a.labels,
            "credential_bound": a.credential.is_some(),
        })
    });
    Value::from(json!({
        "phase": "admit",
        "principal": {"principal": principal, "workspace": principal_workspace, "roles": roles},
        "workspace": f.workspace,
        "sandbox": {"id": f.sandbox_id, "workspace": f.workspace, "labels": f.labels},
        "request": f.request,
        "pool": pool,
        "account": account,
        "attempt": {"number": f.attempt},
        "dry_run": f.dry_run,
    }))
}

/// What the `sandgate.credential` layer is told about one credential's use.
pub struct CredentialFacts<'a> {
    /// The credential as policy sees it (name, type, destinations; never its secret).
    pub credential: &'a Value,
    pub sandbox: &'a Value,
    pub destination: &'a Value,
    pub method: &'a str,
    pub path: &'a str,
    /// The AWS operation the request's signature names, for `aws_sigv4` credentials.
    pub aws: Option<Value>,
}

/// The input of the `sandgate.credential` layer.
pub fn credential_input(f: CredentialFacts<'_>) -> Value {
    let mut request = vec![
        ("method", Value::from(f.method)),
        ("path", Value::from(f.path)),
    ];
    if let Some(aws) = f.aws {
        request.push(("aws", aws));
    }
    obj(vec![
        ("credential", f.credential.clone()),
        ("sandbox", f.sandbox.clone()),
        ("destination", f.destination.clone()),
        ("request", obj(request)),
    ])
}
