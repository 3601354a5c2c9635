//! Load-time agreement probe between the bytecode VM and the interpreter.
//!
//! regorus's RVM is much faster but not yet identical to the interpreter on every policy:
//! known case, `x := <undefined>` followed by `not ... in x` refuses under the RVM where the
//! interpreter (and OPA) leave the rule undefined. The bundled policies avoid such patterns and
//! a property test keeps them in agreement; for policies a platform team writes, each compiled
//! layer and scope is run on a set of representative inputs under both evaluators when a
//! generation loads, and one that disagrees is evaluated by the interpreter instead (logged
//! and reported by `GET /v1/policies`). This is a safety net on plausible inputs, not a
//! proof: the inputs are the documented input shapes with the workspace set to ones that have
//! data and one that has none (undefined lookups are where the known divergence lives),
//! several roles and operations, and allowed and refused destinations.

use regorus::Value;
use serde_json::json;

use super::input::{ACTION_OPERATIONS, LIFECYCLE_OPERATIONS};

/// Inputs for `layer`, given the loaded `data` (workspaces that have data are tried).
pub(crate) fn inputs(layer: &str, data: &Value) -> Vec<Value> {
    let mut workspaces: Vec<String> = match data["sandgate"]["workspaces"].as_object() {
        Ok(map) => map
            .keys()
            .filter_map(|k| k.as_string().ok().map(|s| s.to_string()))
            .take(3)
            .collect(),
        Err(_) => Vec::new(),
    };
    workspaces.push("acme".into());
    workspaces.push("sandgate-probe-no-data".into());
    let mut out = Vec::new();
    for ws in &workspaces {
        for (caller_ws, roles) in [
            (ws.as_str(), json!(["member"])),
            ("sandgate-probe-other", json!(["member"])),
            ("sandgate-probe-other", json!(["admin"])),
        ] {
            let principal = json!({"principal": "probe", "workspace": caller_ws, "roles": roles});
            match layer {
                "creation" | "provider" => {
                    for (billing, env) in [("good", "production"), ("past_due", "dev")] {
                        out.push(admission(ws, &principal, billing, env));
                    }
                }
                "lifecycle" => {
                    for op in LIFECYCLE_OPERATIONS {
                        out.push(operation(ws, &principal, op, None));
                    }
                }
                "action" => {
                    for op in ACTION_OPERATIONS {
                        out.push(operation(ws, &principal, op, Some("/usr/bin/curl")));
                    }
                }
                _ => {}
            }
        }
        if layer == "egress" || layer == "credential" {
            for host in [
                "api.github.com",
                "pypi.org",
                "files.pypi.org",
                "example.com",
            ] {
                for phase in ["connect", "request"] {
                    out.push(egress(ws, host, phase));
                }
            }
        }
    }
    out.into_iter().map(Value::from).collect()
}

fn admission(
    ws: &str,
    principal: &serde_json::Value,
    billing: &str,
    env: &str,
) -> serde_json::Value {
    json!({
        "phase": "admit",
        "principal": principal,
        "workspace": ws,
        "sandbox": {"id": "sb-probe", "workspace": ws, "labels": {"environment": env}},
        "request": {"workspace": ws, "credentials": [], "provider": null, "fallback_providers": [],
                    "source": {"environment": "python"}, "resources": {"cpu": 1.0, "memory_mb": 1024},
                    "features": {}, "network": {"allow_domains": [], "deny_all": false, "cidrs": []},
                    "regions": [], "labels": {"environment": env}, "routing": {}},
        "pool": {"name": "pool-probe", "provider": "sim", "provider_kind": "simulated",
                 "account": "acct-probe", "geography": "us", "region": "us-east-1", "zone": null,
                 "labels": {"environment": "production"}, "vpc": null, "price": 1.0,
                 "standby": false, "egress": "gateway"},
        "account": {"name": "acct-probe", "provider": "sim", "billing": billing, "labels": {},
                    "credential_bound": true},
        "attempt": {"number": 1}
    })
}

fn operation(
    ws: &str,
    principal: &serde_json::Value,
    op: &str,
    program: Option<&str>,
) -> serde_json::Value {
    let labels = if op == "delete" {
        json!({"protected": "true"})
    } else {
        json!({})
    };
    json!({
        "operation": op,
        "principal": principal,
        "workspace": ws,
        "sandbox": {"id": "sb-probe", "workspace": ws, "labels": labels, "state": "running",
                    "pool": "pool-probe", "provider": "sim", "account": "acct-probe"},
        "exec": if op == "exec" { json!({"argv": [program.unwrap_or("sh"), "-c", "true"], "cwd": "/"}) } else { json!(null) },
        "file": if op.starts_with("files.") { json!({"path": "/home/user/x"}) } else { json!(null) },
    })
}

fn egress(ws: &str, host: &str, phase: &str) -> serde_json::Value {
    let mut match_names = vec![host.to_string()];
    let labels: Vec<&str> = host.split('.').collect();
    for i in 1..labels.len() {
        match_names.push(format!("*.{}", labels[i..].join(".")));
    }
    let mut input = json!({
        "phase": phase,
        "sandbox": {"id": "sb-probe", "workspace": ws, "labels": {},
                    "allow_domains": ["api.github.com", "*.pypi.org"], "cidrs": []},
        "destination": {"host": host, "port": 443, "ip": null, "ips": [],
                        "scheme": if phase == "connect" { "connect" } else { "https" },
                        "match_names": match_names},
        "credential": {"name": "probe", "workspace": ws, "user": null,
                       "destinations": [{"host": "api.github.com", "ports": [], "methods": ["GET"], "path_prefix": "/repos/"}]},
    });
    if phase == "request" {
        input["request"] =
            json!({"method": "GET", "path": "/repos/x?page=1", "headers": {"accept": "*/*"}});
    }
    input
}
