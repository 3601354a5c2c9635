//! The OpenAPI document is complete: every route the API's modules register (read from
//! their `.route("path", method(handler)...)` calls in `src/api/`) is in `/openapi.json`
//! with each of its methods, and every documented operation is answered by the running
//! API (no 404 for the route itself).

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use serde_json::Value;

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
