//! The OpenAPI document is complete: every route the API's modules register (read from
//! their `.route("path", method(handler)...)` calls in `src/api/`) is in `/openapi.json`
//! with each of its methods, and every documented operation is answered by the running
//! API (no 404 for the route itself).

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// `(method, path)` for every `.route(...)` call in `src/api/*.rs`.
fn registered_routes() -> BTreeSet<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".route(") {
            let call = balanced(&rest[at + ".route".len()..]);
            rest = &rest[at + ".route(".len()..];
            let Some(start) = call.find('"') else {
                continue;
            };
            let Some(len) = call[start + 1..].find('"') else {
                continue;
            };
            let route = &call[start + 1..start + 1 + len];
            let handlers = &call[start + 2 + len..];
            for method in METHODS {
                if has_call(handlers, method) {
                    out.insert((method.to_string(), route.to_string()));
                }
            }
        }
    }
    out
}

/// The text of the parenthesised group `text` starts with.
fn balanced(text: &str) -> &str {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[..=i];
                }
            }
            _ => {}
        }
    }
    text
}

/// Whether `text` calls `name(` as a whole word (`get(`, `.post(`, `routing::delete(`).
fn has_call(text: &str, name: &str) -> bool {
    let pattern = format!("{name}(");
    text.match_indices(&pattern).any(|(i, _)| {
        i == 0
            || !text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[tokio::test]
async fn every_registered_route_is_documented_and_every_documented_one_is_served() {
    let routes = registered_routes();
    assert!(
        routes.len() >= 30,
        "the source walk found too few routes: {routes:?}"
    );
    assert!(routes.contains(&("post".into(), "/v1/workspaces/{ws}/credentials".into())));

    let gw = Gateway::start(GatewayOptions::default()).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let doc: Value = http
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|m| item.get(**m).is_some())
                .map(|m| (m.to_string(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let missing: Vec<_> = routes.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "served but not in /openapi.json: {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&routes).collect();
    assert!(
        stale.is_empty(),
        "in /openapi.json but not served: {stale:?}"
    );

    // Every documented operation has a description of its answers, and the running API
    // knows the route (an unknown route is 404 not_found; a known one may refuse the
    // unauthenticated call, or the made-up ids, but never as an unknown endpoint).
    for (method, path) in &documented {
        let op = &paths[path.as_str()][method.as_str()];
        assert!(
            op["responses"].as_object().is_some_and(|r| !r.is_empty()),
            "{method} {path}"
        );
        let url = gw.api(&path.replace('{', "x").replace('}', ""));
        let request = http.request(method.to_uppercase().parse().unwrap(), url);
        let r = request.send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert!(
            !(status == 404
                && body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m == "no such endpoint")),
            "{method} {path} is documented but not routed: {status} {body}"
        );
    }
}

/// The document validates as OpenAPI 3.1 with an implementation independent of sandgate's
/// (`openapi-spec-validator` from PyPI, pinned in tests/sdk/requirements.txt; `.ci/run`
/// installs it), and every error answer is described by the shared error schema.
#[tokio::test]
async fn the_document_validates_as_openapi_3_1() {
    let python = common::sdk::python();
    if let Some(reason) = common::sdk::missing(&python, "openapi_spec_validator") {
        if common::in_ci() {
            panic!("the OpenAPI validation needs openapi-spec-validator under CI ({reason})");
        }
        eprintln!("SKIPPED openapi::the_document_validates_as_openapi_3_1: {reason} (pip install -r tests/sdk/requirements.txt)");
        return;
    }
    let gw = Gateway::start(GatewayOptions::default()).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = http
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let file = gw.dir.path().join("openapi.json");
    std::fs::write(&file, &text).unwrap();
    let script = "import json, sys\n\
from openapi_spec_validator import validate\n\
from openapi_spec_validator.validation.validators import OpenAPIV31SpecValidator\n\
doc = json.load(open(sys.argv[1]))\n\
validate(doc, cls=OpenAPIV31SpecValidator)\n\
print('valid')\n";
    let out = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator refused /openapi.json:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every 4xx/5xx answer points at the one error shape.
    let error_schema = &doc["components"]["schemas"]["Error"];
    assert_eq!(
        error_schema["required"],
        serde_json::json!(["error"]),
        "{error_schema}"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, answer) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &answer["content"]["application/json"]["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/Error",
                        "{method} {path} {status} has no error schema"
                    );
                }
            }
        }
    }
    // The credential bodies are typed, not bare objects.
    let create = &doc["paths"]["/v1/workspaces/{ws}/credentials"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    assert!(
        create["$ref"]
            .as_str()
            .is_some_and(|r| r.ends_with("/CredentialBody")),
        "{create}"
    );
}

const TOKEN: &str = "api-token-openapi-0123456789";

/// Bodies the API accepts, from the tests that send them (and the router's own unit test),
/// then the shapes and bounds the schema spells out, at their limits.
fn accepted_bodies() -> Vec<(&'static str, Value)> {
    let labels_64: serde_json::Map<String, Value> = (0..64)
        .map(|i| (format!("k{i}"), Value::from("v")))
        .collect();
    vec![
        ("sandboxes: empty", json!({})),
        ("sandboxes: labels", json!({"labels": {"role": "intern"}})),
        (
            "sandboxes: order",
            json!({"routing": {"order": ["e2b", "sim"]}}),
        ),
        (
            "sandboxes: pty and region",
            json!({"features": {"pty": true}, "regions": ["eu-west"]}),
        ),
        (
            "sandboxes: baseline opt-out",
            json!({"features": {"process": {"execute": false}, "filesystem": {"read": false, "write": false}}}),
        ),
        (
            "sandboxes: environment",
            json!({"labels": {"job": "many"}, "source": {"environment": "metal/python"}}),
        ),
        (
            "sandboxes: empty regions",
            json!({"labels": {"v": "1"}, "regions": []}),
        ),
        (
            "sandboxes: domains and credentials",
            json!({"network": {"allow_domains": ["api.a.test"]}, "credentials": ["api"]}),
        ),
        ("sandboxes: workspace", json!({"workspace": "ws-b"})),
        (
            "dry_run: plan",
            json!({"regions": ["us-east-1"], "routing": {"priorities": ["price"]}, "dry_run": true}),
        ),
        (
            "dry_run: pool affinity",
            json!({
                "regions": ["us-east-1"],
                "routing": {"pool_affinity": {"preferred": [{"weight": 10, "key": "environment", "operator": "in", "values": ["production"]}]}},
                "dry_run": true
            }),
        ),
        (
            "explain_agreement: affinity and soft spread",
            json!({
                "labels": {"app": "web"},
                "routing": {
                    "priorities": ["startup_latency", "creation_success"],
                    "sandbox_affinity": {"preferred": [{"weight": 5, "topology": "region", "match_labels": {"app": "web"}}]},
                    "spread": [{"topology": "region", "mode": "soft", "weight": 1, "match_labels": {"app": "web"}}]
                }
            }),
        ),
        (
            "explain_agreement: pin",
            json!({"labels": {"app": "db"}, "routing": {"pin_pool": "pool-b"}}),
        ),
        (
            "routing_api: priorities",
            json!({"routing": {"priorities": ["creation_success", "price"]}}),
        ),
        (
            "routing_api: nothing qualifies",
            json!({"features": {"pty": true}}),
        ),
        (
            "router: ordinary request",
            json!({
                "resources": {"cpu": 0.5, "memory_mb": 512, "disk_gb": 10, "gpu": 0},
                "labels": {"app.kubernetes.io/name": "web", "empty": ""},
                "network": {"cidrs": ["10.0.0.0/8", "2001:db8::/32", "192.0.2.1"]},
                "routing": {"spread": [{"topology": "zone"}],
                            "pool_affinity": {"preferred": [{"weight": 100, "key": "gen", "values": ["4"]}]}},
                "source": {"image": "python:3.12"}, "regions": ["us-east-1"]
            }),
        ),
        // Shapes: the keyword order, both isolation forms, a template, nulls for options.
        ("shape: order auto", json!({"routing": {"order": "auto"}})),
        (
            "shape: isolation kind",
            json!({"features": {"isolation": "microvm"}}),
        ),
        (
            "shape: isolation object",
            json!({"features": {"isolation": {"kind": "microvm", "hypervisor": "firecracker", "confidential": true, "generation": 2}}}),
        ),
        (
            "shape: template source, nulls",
            json!({"source": {"template": "base"}, "provider": null, "workspace": null, "routing": {"order": null, "pin_pool": null}, "features": {"isolation": null, "pty": null}}),
        ),
        (
            "shape: hard spread, anti-affinity, selector",
            json!({"routing": {
                "spread": [{"topology": "zone", "max_skew": 2, "mode": "hard"}],
                "sandbox_anti_affinity": {"required": [{"topology": "provider", "match_labels": {"app": "db"}}]},
                "pool_selector": {"tier": "gold"},
                "pool_affinity": {"required": [{"key": "gpu", "operator": "exists"}]},
                "standby": true
            }}),
        ),
        (
            "shape: egress",
            json!({"network": {"allow_domains": ["*.example.com", "10.1.2.3", "::1"], "deny_all": false, "cidrs": ["::/0", "0.0.0.0/0"], "vpc": "vpc-1"}}),
        ),
        // Bounds, at their limits.
        (
            "bounds: resources at the maximum",
            json!({"resources": {"cpu": 1024, "memory_mb": 16777216, "disk_gb": 65536, "gpu": 64, "gpu_type": "h100"}}),
        ),
        (
            "bounds: resources at the minimum",
            json!({"resources": {"cpu": 0.001, "memory_mb": 1, "disk_gb": 1, "gpu": 0}}),
        ),
        ("bounds: 64 labels", json!({"labels": labels_64})),
        (
            "bounds: weights",
            json!({"routing": {"pool_affinity": {"preferred": [{"weight": 1000, "key": "k"}]}, "spread": [{"topology": "zone", "max_skew": 1000, "weight": 1000}]}}),
        ),
        (
            "bounds: 128-byte name",
            json!({"provider": "p".repeat(128)}),
        ),
    ]
}

/// Bodies the API refuses with 400 for a reason the schema states (unknown field, type,
/// shape, bound, text rule, uniqueness).
fn refused_bodies() -> Vec<(&'static str, Value)> {
    let labels_65: serde_json::Map<String, Value> = (0..65)
        .map(|i| (format!("k{i}"), Value::from("v")))
        .collect();
    vec![
        ("unknown field: top level", json!({"gpu_please": true})),
        (
            "unknown field: features",
            json!({"features": {"bogus": true}}),
        ),
        (
            "unknown field: in a pool-affinity term",
            json!({"routing": {"pool_affinity": {"required": [{"key": "k", "bogus": 1}]}}}),
        ),
        (
            "unknown field: resources",
            json!({"resources": {"cpus": 2}}),
        ),
        ("not an object", json!([])),
        ("wrong type: dry_run", json!({"dry_run": "yes"})),
        ("wrong type: regions null", json!({"regions": null})),
        (
            "wrong type: memory_mb string",
            json!({"resources": {"memory_mb": "512"}}),
        ),
        (
            "unknown enum value: priority",
            json!({"routing": {"priorities": ["cheapness"]}}),
        ),
        (
            "unknown keyword: order",
            json!({"routing": {"order": "AUTO"}}),
        ),
        ("cpu of 0", json!({"resources": {"cpu": 0}})),
        ("cpu of 2000", json!({"resources": {"cpu": 2000}})),
        ("negative cpu", json!({"resources": {"cpu": -1}})),
        ("memory_mb of 0", json!({"resources": {"memory_mb": 0}})),
        (
            "disk_gb over 64 TiB",
            json!({"resources": {"disk_gb": 65537}}),
        ),
        ("65 gpus", json!({"resources": {"gpu": 65}})),
        ("65 labels", json!({"labels": labels_65})),
        (
            "max_skew of 0",
            json!({"routing": {"spread": [{"topology": "zone", "max_skew": 0}]}}),
        ),
        (
            "weight over 1000",
            json!({"routing": {"sandbox_affinity": {"preferred": [{"weight": 1001, "topology": "zone"}]}}}),
        ),
        (
            "missing topology",
            json!({"routing": {"spread": [{"max_skew": 1}]}}),
        ),
        (
            "source with two keys",
            json!({"source": {"image": "a", "template": "b"}}),
        ),
        ("source as a bare name", json!({"source": "image"})),
        ("empty source", json!({"source": {"image": ""}})),
        (
            "isolation without a kind",
            json!({"features": {"isolation": {"hypervisor": "firecracker"}}}),
        ),
        (
            "isolation property not a scalar",
            json!({"features": {"isolation": {"kind": "vm", "x": [1]}}}),
        ),
        (
            "control character in a label",
            json!({"labels": {"a": "x\ny"}}),
        ),
        (
            "bidi override in a label",
            json!({"labels": {"a": "\u{202E}x"}}),
        ),
        ("empty label key", json!({"labels": {"": "x"}})),
        ("129-byte name", json!({"provider": "p".repeat(129)})),
        ("empty name", json!({"regions": [""]})),
        (
            "repeated order entry",
            json!({"routing": {"order": ["sim", "sim"]}}),
        ),
        ("repeated credential", json!({"credentials": ["a", "a"]})),
        (
            "repeated fallback",
            json!({"fallback_providers": ["a", "b", "a"]}),
        ),
        (
            "bad cidr prefix",
            json!({"network": {"cidrs": ["10.0.0.0/33"]}}),
        ),
        ("not a cidr", json!({"network": {"cidrs": ["nope"]}})),
        (
            "not a domain",
            json!({"network": {"allow_domains": ["exa mple.com"]}}),
        ),
        (
            "wildcard inside a domain",
            json!({"network": {"allow_domains": ["a.*.example.com"]}}),
        ),
    ]
}

/// The create body's schema (both operations' `requestBody`) says what the parser says:
/// every body the API accepts validates, and every body it refuses for a schema-level
/// reason does not, checked with an implementation independent of sandgate (the
/// `openapi_schema_validator`/`jsonschema` pair `openapi-spec-validator` depends on, with
/// `$ref`s resolved against the served document) and against the running API.
#[tokio::test]
async fn the_create_body_schema_accepts_and_refuses_what_the_api_does() {
    let python = common::sdk::python();
    for module in ["openapi_schema_validator", "jsonschema", "referencing"] {
        if let Some(reason) = common::sdk::missing(&python, module) {
            if common::in_ci() {
                panic!("the create-body schema test needs {module} under CI ({reason})");
            }
            eprintln!("SKIPPED openapi::the_create_body_schema_accepts_and_refuses_what_the_api_does: {reason} (pip install -r tests/sdk/requirements.txt)");
            return;
        }
    }
    let gw = Gateway::start(GatewayOptions {
        extra_toml: format!(
            "[[api.tokens]]\ntoken = \"{TOKEN}\"\nprincipal = \"alice\"\nworkspace = \"ws-a\"\n"
        ),
        ..GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = http
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();

    // Both operations take the one typed create body, and no JSON request body is left as a
    // bare object.
    for path in ["/v1/sandboxes", "/v1/routes:explain"] {
        let schema =
            &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
        assert_eq!(
            schema["$ref"], "#/components/schemas/CreateBody",
            "POST {path}: {schema}"
        );
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            assert!(
                schema.is_null() || schema["$ref"].is_string(),
                "{method} {path} has an untyped JSON request body: {schema}"
            );
        }
    }

    let accepted = accepted_bodies();
    let refused = refused_bodies();

    // The API's verdicts: explain parses exactly as create does; a refused body is refused
    // by both operations, as invalid_request.
    for (name, body) in &accepted {
        let r = http
            .post(gw.api("/v1/routes:explain"))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let answer: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 200, "{name}: explain refused {body}: {answer}");
    }
    for (name, body) in &refused {
        for path in ["/v1/routes:explain", "/v1/sandboxes"] {
            let r = http
                .post(gw.api(path))
                .bearer_auth(TOKEN)
                .json(body)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let answer: Value = r.json().await.unwrap_or(Value::Null);
            assert_eq!(
                status, 400,
                "{name}: POST {path} answered {answer} to {body}"
            );
            assert_eq!(
                answer["error"]["code"], "invalid_request",
                "{name}: {answer}"
            );
        }
    }

    // The schema's verdicts.
    let doc_file = gw.dir.path().join("openapi.json");
    std::fs::write(&doc_file, &text).unwrap();
    let bodies: Vec<&Value> = accepted.iter().chain(&refused).map(|(_, b)| b).collect();
    let bodies_file = gw.dir.path().join("bodies.json");
    std::fs::write(&bodies_file, serde_json::to_vec(&bodies).unwrap()).unwrap();
    let script = r#"
import json, sys
from jsonschema.exceptions import best_match
from openapi_schema_validator import OAS31Validator, oas31_format_checker
from referencing import Registry
from referencing.jsonschema import DRAFT202012

doc = json.load(open(sys.argv[1]))
bodies = json.load(open(sys.argv[2]))
# The document is one resource; the operations' `$ref`s (and the schemas' own) resolve in it.
uri = 'urn:sandgate:openapi.json'
registry = Registry().with_resource(uri, DRAFT202012.create_resource(doc))
verdicts = {}
for path in ['/v1/sandboxes', '/v1/routes:explain']:
    ref = doc['paths'][path]['post']['requestBody']['content']['application/json']['schema']['$ref']
    validator = OAS31Validator({'$ref': uri + ref}, registry=registry, format_checker=oas31_format_checker)
    verdicts[path] = []
    for body in bodies:
        error = best_match(validator.iter_errors(body))
        verdicts[path].append(None if error is None else '%s: %s' % (error.json_path, error.message[:300]))
print(json.dumps(verdicts))
"#;
    let out = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&doc_file)
        .arg(&bodies_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the schema validator failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Value = serde_json::from_slice(&out.stdout).unwrap();
    for path in ["/v1/sandboxes", "/v1/routes:explain"] {
        let verdicts = verdicts[path].as_array().unwrap();
        assert_eq!(verdicts.len(), accepted.len() + refused.len());
        let (for_accepted, for_refused) = verdicts.split_at(accepted.len());
        for ((name, body), verdict) in accepted.iter().zip(for_accepted) {
            assert!(
                verdict.is_null(),
                "{name}: the API accepts {body} but the {path} schema refuses it: {verdict}"
            );
        }
        for ((name, body), verdict) in refused.iter().zip(for_refused) {
            assert!(
                verdict.is_string(),
                "{name}: the API refuses {body} but the {path} schema accepts it"
            );
        }
    }
}
