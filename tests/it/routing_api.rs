//! The router's API and CLI surface: `POST /v1/routes:explain` (a literal colon in the path),
//! measured startup latency and creation success feeding the ranking, `/openapi.json`, and
//! the `sandgate route explain` / `sandgate sandbox ...` client subcommands.

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN_A: &str = "api-token-ws-a-0123456789";

const POOLS: &str = r#"
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct-a"
provider = "sim"
[[accounts]]
name = "acct-b"
provider = "sim"
[[accounts]]
name = "acct-c"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
price = 1.0
region = "us-east-1"
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"
price = 3.0
region = "us-east-1"
[[pools]]
name = "pool-c"
provider = "sim"
account = "acct-c"
price = 2.0
region = "eu-west-1"
"#;

async fn gateway(sims: &str) -> Gateway {
    init();
    Gateway::start(GatewayOptions {
        extra_toml: format!(
            "[[api.tokens]]\ntoken = \"{TOKEN_A}\"\nprincipal = \"alice\"\nworkspace = \"ws-a\"\n[create]\nshort_wait_ms = 3000\n{POOLS}\n{sims}"
        ),
        ..GatewayOptions::default()
    })
    .await
}

async fn explain(gw: &Gateway, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(gw.api("/v1/routes:explain"))
        .bearer_auth(TOKEN_A)
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn create(gw: &Gateway, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

fn order(explanation: &Value) -> Vec<String> {
    explanation["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn explain_over_http_lists_every_pool_and_the_final_order() {
    let gw = gateway("").await;
    let (status, e) = explain(
        &gw,
        json!({"regions": ["us-east-1"], "routing": {"priorities": ["price"]}}),
    )
    .await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(order(&e), ["pool-a", "pool-b"]);
    let pools = e["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 3);
    let c = pools.iter().find(|p| p["pool"] == "pool-c").unwrap();
    assert_eq!(c["eligible"], false);
    assert_eq!(c["unmet_requirements"], json!(["regions"]));
    let a = pools.iter().find(|p| p["pool"] == "pool-a").unwrap();
    assert_eq!(a["rank"][0]["priority"], "price");
    assert_eq!(a["rank"][0]["value"], 1.0);
    // Nothing qualifies: the explanation carries the no_eligible_provider error.
    let (status, e) = explain(&gw, json!({"features": {"pty": true}})).await;
    assert_eq!(status, 200);
    assert!(order(&e).is_empty());
    assert_eq!(e["error"]["code"], "no_eligible_provider");
    assert_eq!(
        e["error"]["details"]["attempts"].as_array().unwrap().len(),
        3
    );
    // A body the router cannot understand is refused, naming the field.
    let (status, e) = explain(&gw, json!({"routing": {"priorities": ["cheapness"]}})).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["code"], "invalid_request");
    // Other paths next to the colon route are not captured by it.
    let resp = reqwest::Client::new()
        .post(gw.api("/v1/routes"))
        .bearer_auth(TOKEN_A)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn measured_startup_latency_and_creation_success_feed_the_ranking() {
    let gw = gateway(
        "[simulated.pool-a]\nlatency_ms = { min = 400, max = 400 }\n[simulated.pool-b]\nlatency_ms = { min = 5, max = 5 }\n[simulated.pool-c]\nfaults = { capacity = 1.0 }\n",
    )
    .await;
    let req = json!({"routing": {"priorities": ["startup_latency"]}});
    // Without samples, ties fall to name order.
    let (_, before) = explain(&gw, req.clone()).await;
    assert_eq!(order(&before), ["pool-a", "pool-b", "pool-c"]);
    for pool in ["pool-a", "pool-b"] {
        let (status, body) = create(&gw, json!({"routing": {"pin_pool": pool}})).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = create(&gw, json!({"routing": {"pin_pool": "pool-c"}})).await;
    assert_eq!(status, 503, "{body}");
    let (_, after) = explain(&gw, req).await;
    // pool-b measured fastest; pool-a slower (another 250 ms band); pool-c has no latency.
    assert_eq!(order(&after), ["pool-b", "pool-a", "pool-c"], "{after}");
    let metrics = |pool: &str| {
        after["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pool"] == pool)
            .unwrap()["metrics"]
            .clone()
    };
    assert_eq!(metrics("pool-a")["startup_latency_samples"], 1);
    assert!(metrics("pool-a")["startup_latency_ms"].as_f64().unwrap() >= 400.0);
    assert_eq!(metrics("pool-a")["creation_success"], 1.0);
    assert_eq!(metrics("pool-c")["creation_success"], 0.0);
    assert_eq!(metrics("pool-c")["attempts"], 1);
    let (_, by_success) = explain(
        &gw,
        json!({"routing": {"priorities": ["creation_success", "price"]}}),
    )
    .await;
    assert_eq!(order(&by_success), ["pool-a", "pool-b", "pool-c"]);
}

#[tokio::test]
async fn openapi_document_describes_the_endpoints() {
    let gw = gateway("").await;
    let doc: Value = reqwest::get(gw.api("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in ["/v1/sandboxes", "/v1/sandboxes/{id}", "/v1/routes:explain"] {
        assert!(paths.contains_key(p), "{p} missing: {:?}", paths.keys());
    }
    assert!(paths["/v1/sandboxes"]["post"]["responses"]
        .as_object()
        .unwrap()
        .contains_key("202"));
    assert!(paths["/v1/sandboxes/{id}"]["delete"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

#[test]
fn route_explain_cli_works_from_a_config_file_without_a_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sandgate.toml"), POOLS).unwrap();
    std::fs::write(
        dir.path().join("req.json"),
        r#"{"regions": ["us-east-1"], "routing": {"priorities": ["price"]}}"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .args(["route", "explain", "--request"])
        .arg(dir.path().join("req.json"))
        .arg("--config")
        .arg(dir.path().join("sandgate.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No store next to this config yet: the context is empty, and stderr says so.
    assert!(String::from_utf8_lossy(&out.stderr).contains("no store at data/sandgate.db"));
    assert!(
        !dir.path().join("data").exists(),
        "explain creates no store"
    );
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(order(&e), ["pool-a", "pool-b"]);
    // No pool qualifies: exit status 1, still the explanation.
    std::fs::write(
        dir.path().join("pty.json"),
        r#"{"features": {"pty": true}}"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .args(["route", "explain", "--request"])
        .arg(dir.path().join("pty.json"))
        .arg("--config")
        .arg(dir.path().join("sandgate.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["code"], "no_eligible_provider");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_cli_creates_gets_lists_and_deletes_through_the_api() {
    let gw = gateway("").await;
    let url = format!("http://{}", gw.server.api_addr());
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("create.json");
    std::fs::write(&body, r#"{"labels": {"via": "cli"}}"#).unwrap();
    let run = move |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(BIN)
                .args(&args)
                .env("SANDGATE_URL", &url)
                .env("SANDGATE_TOKEN", TOKEN_A)
                .output()
                .unwrap();
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            (out.status.code(), v)
        })
    };
    let (code, created) = run(vec![
        "sandbox".into(),
        "create".into(),
        "--file".into(),
        body.display().to_string(),
        "--idempotency-key".into(),
        "cli-1".into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{created}");
    assert_eq!(created["state"], "running");
    let id = created["id"].as_str().unwrap().to_string();
    assert!(created["egress"]["token"].is_string());
    let (code, got) = run(vec!["sandbox".into(), "get".into(), id.clone()])
        .await
        .unwrap();
    assert_eq!(code, Some(0));
    assert_eq!(got["id"], id.as_str());
    assert!(got["egress"].get("token").is_none());
    let (code, list) = run(vec![
        "sandbox".into(),
        "list".into(),
        "--label".into(),
        "via=cli".into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0));
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
    let (code, deleted) = run(vec!["sandbox".into(), "delete".into(), id.clone()])
        .await
        .unwrap();
    assert_eq!(code, Some(0));
    assert_eq!(deleted["state"], "deleted");
    // Not found: exit 3 (the error is on stderr, stdout is empty).
    let (code, missing) = run(vec!["sandbox".into(), "get".into(), "sb-nope".into()])
        .await
        .unwrap();
    assert_eq!(code, Some(3));
    assert_eq!(missing, Value::Null);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Seed 001: "The explicit-order interface also supports a workspace Auto order, a per-create
/// override and a named provider. [...] A provider omitted from that order is not used."
#[tokio::test]
async fn workspace_auto_order_limits_providers_and_a_create_can_override_it() {
    init();
    let gw = Gateway::start(GatewayOptions {
        extra_toml: format!(
            r#"[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[create.workspace_order]
ws-a = ["sim-b"]
[[providers]]
name = "sim-a"
kind = "simulated"
[[providers]]
name = "sim-b"
kind = "simulated"
[[accounts]]
name = "acct-a"
provider = "sim-a"
[[accounts]]
name = "acct-b"
provider = "sim-b"
[[pools]]
name = "pool-a"
provider = "sim-a"
account = "acct-a"
price = 1.0
[[pools]]
name = "pool-b"
provider = "sim-b"
account = "acct-b"
price = 3.0
"#
        ),
        ..GatewayOptions::default()
    })
    .await;
    // ws-a's Auto order names only sim-b: the cheaper sim-a pool is not used.
    let (status, e) = explain(&gw, json!({"routing": {"priorities": ["price"]}})).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(order(&e), ["pool-b"]);
    // A per-create order overrides the workspace's.
    let (status, e) = explain(&gw, json!({"routing": {"order": ["sim-a", "sim-b"]}})).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(order(&e), ["pool-a", "pool-b"]);
    // And a create follows the workspace order too.
    let (status, created) = create(&gw, json!({"routing": {"priorities": ["price"]}})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["placement"]["pool"], "pool-b", "{created}");
    gw.server.shutdown();
}

#[test]
fn a_workspace_order_naming_an_unknown_provider_is_a_config_error() {
    let err = sandgate::config::Config::from_toml("[create.workspace_order]\nws = [\"nope\"]\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("create.workspace_order.ws[0]"), "{err}");
}

/// Seed 001: "Capacity and a deterministic name order resolve remaining ties." Free capacity
/// is the pool's configured capacity minus the sandboxes living on it now.
#[tokio::test]
async fn live_sandboxes_reduce_free_capacity_in_the_tie_break() {
    init();
    let gw = Gateway::start(GatewayOptions {
        extra_toml: format!(
            r#"[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct"
capacity = 2
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct"
capacity = 2
"#
        ),
        ..GatewayOptions::default()
    })
    .await;
    let (_, e) = explain(&gw, json!({})).await;
    assert_eq!(
        order(&e),
        ["pool-a", "pool-b"],
        "equal free capacity: name order"
    );
    let (status, created) = create(&gw, json!({})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["placement"]["pool"], "pool-a");
    let (_, e) = explain(&gw, json!({})).await;
    assert_eq!(
        order(&e),
        ["pool-b", "pool-a"],
        "pool-a now has less free capacity: {e}"
    );
    gw.server.shutdown();
}

/// `route explain` follows the CLI's output contract: JSON in a pipe (the same bytes as
/// `-o json`), a table with stable columns and the final order on request, `-q` the order.
#[test]
fn route_explain_cli_follows_the_output_contract() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(&config, POOLS).unwrap();
    let req = dir.path().join("req.json");
    std::fs::write(
        &req,
        r#"{"regions": ["us-east-1"], "routing": {"priorities": ["price"]}}"#,
    )
    .unwrap();
    let pty = dir.path().join("pty.json");
    std::fs::write(&pty, r#"{"features": {"pty": true}}"#).unwrap();
    let run = |request: &std::path::Path, extra: &[&str]| {
        let out = Command::new(BIN)
            .current_dir(dir.path())
            .args(["route", "explain", "--request"])
            .arg(request)
            .arg("--config")
            .arg(&config)
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        (out.status.code(), stdout, stderr)
    };

    let (code, piped, _) = run(&req, &[]);
    assert_eq!(code, Some(0));
    let (code, json, _) = run(&req, &["-o", "json"]);
    assert_eq!(code, Some(0));
    assert_eq!(json, piped, "-o json is what a pipe gets by default");
    let explanation: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(order(&explanation), ["pool-a", "pool-b"]);

    let (code, table, _) = run(&req, &["-o", "table"]);
    assert_eq!(code, Some(0));
    assert!(!table.contains('\u{1b}'), "{table}");
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["POOL", "PROVIDER", "REGION", "ELIGIBLE", "POSITION", "SCORE", "UNMET"],
        "{table}"
    );
    // One row per pool the JSON lists, with its columns as the JSON has them.
    let pools = explanation["pools"].as_array().unwrap();
    for (row, pool) in lines[1..=pools.len()].iter().zip(pools) {
        assert_eq!(row[0], pool["pool"], "{table}");
        assert_eq!(
            row[3],
            if pool["eligible"] == true {
                "yes"
            } else {
                "no"
            }
        );
        let position = pool["position"].as_u64().map(|p| (p + 1).to_string());
        assert_eq!(row[4], position.as_deref().unwrap_or("-"), "{table}");
        assert_eq!(row[5], pool["soft_score"].to_string(), "{table}");
    }
    assert_eq!(
        table.lines().last(),
        Some("ORDER: pool-a, pool-b"),
        "{table}"
    );

    let (_, wide, _) = run(&req, &["-o", "wide"]);
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[7..], ["TIER", "FREE", "RANK"], "{wide}");
    assert!(wide.contains("price="), "{wide}");

    let (_, quiet, _) = run(&req, &["-q"]);
    assert_eq!(quiet, "pool-a\npool-b\n");

    // No eligible pool: exit 1, every row says why, and the order says there is none.
    let (code, table, _) = run(&pty, &["-o", "table"]);
    assert_eq!(code, Some(1));
    for row in table.lines().skip(1).take_while(|l| !l.is_empty()) {
        assert!(row.contains(" no "), "{table}");
        assert!(row.contains("pty"), "{table}");
    }
    assert!(table.ends_with("ORDER: - (no eligible pool)\n"), "{table}");

    // Errors: on stderr in the contract's shape, stdout empty, exit 2 for bad input.
    let (code, out, err) = run(&dir.path().join("missing.json"), &["-o", "table"]);
    assert_eq!(code, Some(2));
    assert_eq!(out, "");
    assert!(err.starts_with("error: unreadable_input: "), "{err}");
    let (code, out, err) = run(&dir.path().join("missing.json"), &["-o", "json"]);
    assert_eq!(code, Some(2));
    assert_eq!(out, "");
    let body: Value = serde_json::from_str(&err).unwrap();
    assert_eq!(body["error"]["code"], "unreadable_input");
}
