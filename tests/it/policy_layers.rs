//! Policy at every layer, over a real gateway: decision logs and metrics for every layer,
//! `GET /v1/policies` across reloads, and scopes (platform and workspace) with deny-wins.
//! Real Rego files in a temporary policy directory, reqwest as the client.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const TOKEN_A: &str = "api-token-ws-a-0123456789";
const TOKEN_B: &str = "api-token-ws-b-0123456789";
const SECRET_X: &str = "s3cr3t-X-7f1e9a0c";

fn sandbox_config() -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[create]
short_wait_ms = 3000

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}

[[accounts]]
name = "acct-a"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
"#
    )
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn create_as(gw: &Gateway, token: &str, body: Value) -> (u16, Value) {
    let resp = http()
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn assert_opa_shape(record: &Value, layer: &str) {
    // Egress records keep `path` as the request path (older readers), the package path is
    // in `policy_path` there.
    let path = if layer == "egress" {
        &record["policy_path"]
    } else {
        &record["path"]
    };
    assert_eq!(*path, format!("sandgate/{layer}"), "{record}");
    assert_eq!(record["layer"], layer);
    let id = record["decision_id"].as_str().expect("decision_id");
    assert_eq!(id.len(), 36, "{id}");
    assert_eq!(id.matches('-').count(), 4, "{id}");
    let ts = record["timestamp"].as_str().expect("timestamp");
    time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{ts} is not RFC 3339: {e}"));
    assert!(record["labels"]["generation"].as_u64().unwrap() >= 1);
    assert!(record["input"].is_object(), "{record}");
    assert!(record["result"]["allow"].is_boolean(), "{record}");
    assert!(record["result"]["deny"].is_array(), "{record}");
}

/// Creation and provider decisions (allowed and refused) are logged with their input and
/// result; egress keeps one record per decision (the proxy's), now also in the OPA shape.
#[tokio::test]
async fn creation_and_provider_decisions_are_logged_in_the_opa_shape() {
    // The decision counters count every gateway's decisions: with its own recorder, every
    // series below is this test's.
    let _metrics = own_metrics();
    let gw = Gateway::start(GatewayOptions {
        extra_toml: sandbox_config(),
        extra_policies: vec![(
            "frozen.rego",
            "package sandgate.creation\nimport rego.v1\n\ndeny contains \"team frozen is frozen\" if input.request.labels.team == \"frozen\"\n".into(),
        )],
        ..GatewayOptions::default()
    })
    .await;
    let (status, body) = create_as(&gw, TOKEN_A, json!({"labels": {"team": "ml"}})).await;
    assert_eq!(status, 201, "{body}");
    let sandbox_id = body["id"].as_str().unwrap().to_string();
    // Refused by the creation layer (the extra rule above).
    let (status, refused) = create_as(&gw, TOKEN_A, json!({"labels": {"team": "frozen"}})).await;
    assert_eq!(status, 403, "{refused}");

    let creation = gw.policy_decisions("creation", 2).await;
    let provider = gw.policy_decisions("provider", 1).await;
    for r in &creation {
        assert_opa_shape(r, "creation");
    }
    assert_opa_shape(&provider[0], "provider");
    let allowed = creation
        .iter()
        .find(|r| r["input"]["sandbox"]["id"] == sandbox_id.as_str())
        .expect("the allowed create's record");
    assert_eq!(allowed["decision"], "allow");
    assert_eq!(allowed["result"]["allow"], true);
    assert_eq!(allowed["input"]["principal"]["principal"], "alice");
    assert_eq!(allowed["input"]["pool"]["name"], "pool-a");
    assert_eq!(allowed["input"]["request"]["labels"]["team"], "ml");
    assert!(allowed["metrics"]["timer_rego_eval_ns"].as_u64().unwrap() > 0);
    assert_eq!(
        provider[0]["input"]["sandbox"]["id"],
        sandbox_id.as_str(),
        "the provider layer is consulted for the pool the creation layer admitted"
    );
    let denied = creation
        .iter()
        .find(|r| r["decision"] == "deny")
        .expect("the refused create's record");
    assert_eq!(denied["result"]["allow"], false);
    assert_eq!(denied["input"]["request"]["labels"]["team"], "frozen");
    assert_eq!(denied["result"]["deny"], json!(["team frozen is frozen"]));
    // Distinct ids.
    assert_ne!(allowed["decision_id"], denied["decision_id"]);

    // The egress layer is logged once per decision, by the proxy, with the OPA fields too.
    let origin = start_origin(None).await;
    let response = gw
        .client("sb-a", true)
        .get(format!(
            "http://plain.test:{}/p?q=secret-value",
            origin.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let egress = gw.decisions(1).await;
    let record = &egress[0];
    assert_opa_shape(record, "egress");
    assert_eq!(record["input"]["destination"]["host"], "plain.test");
    assert_eq!(record["input"]["request"]["path"], "/p?q=");
    assert_eq!(record["result"]["allow"], true);
    assert_eq!(record["host"], "plain.test", "the flat egress fields stay");
    let all = gw.log_records(1, |_| true).await;
    assert!(
        !all.iter()
            .any(|r| r["kind"] == "policy" && r["layer"] == "egress"),
        "egress decisions are not logged twice"
    );
    assert!(!std::fs::read_to_string(&gw.decision_log)
        .unwrap()
        .contains("secret-value"));

    // Prometheus: decisions by layer and outcome, eval time by layer.
    let metrics = http()
        .get(gw.api("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        r#"sandgate_policy_decisions_total{layer="creation",outcome="allow"}"#,
        r#"sandgate_policy_decisions_total{layer="creation",outcome="deny"}"#,
        r#"sandgate_policy_decisions_total{layer="provider",outcome="allow"}"#,
        r#"sandgate_policy_decisions_total{layer="egress",outcome="allow"}"#,
        r#"sandgate_policy_eval_seconds_bucket{layer="creation",le="0.00001"}"#,
    ] {
        assert!(metrics.contains(needle), "{needle} missing from /metrics");
    }
    gw.server.shutdown();
}

/// A credential decision is logged without the placeholder the sandbox sent (it is as good
/// as the secret to whoever holds it), without query values, and never with the secret.
#[tokio::test]
async fn credential_decisions_are_logged_without_placeholders_or_secrets() {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("x"), SECRET_X).unwrap();
    let extra_toml = format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"

[[credentials]]
workspace = "ws-a"
name = "x"
secret_file = {x:?}
placeholder_env = "X_TOKEN"
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "query", param = "access_token" }}
"#,
        x = secrets.path().join("x").display().to_string(),
        port = origin.port(),
    );
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains: vec!["api.a.test"],
            credentials: vec!["x"],
        }],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_toml,
        ..Default::default()
    })
    .await;
    let env: Value = http()
        .get(gw.api("/v1/identities/sb-a/env"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let placeholder = env["placeholders"]["x"].as_str().unwrap().to_string();
    let response = gw
        .client("sb-a", true)
        .get(format!(
            "https://api.a.test:{}/repos?access_token={placeholder}&page=2",
            origin.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        origin.last().unwrap().path,
        format!("/repos?page=2&access_token={SECRET_X}"),
        "the placeholder was exchanged upstream"
    );
    let records = gw.policy_decisions("credential", 1).await;
    let record = &records[0];
    assert_opa_shape(record, "credential");
    assert_eq!(record["decision"], "allow");
    assert_eq!(record["input"]["credential"]["name"], "x");
    assert_eq!(
        record["input"]["request"]["path"],
        "/repos?access_token=&page="
    );
    let _ = gw.decisions(2).await;
    let log = std::fs::read_to_string(&gw.decision_log).unwrap();
    assert!(
        !log.contains(&placeholder),
        "placeholder in the decision log"
    );
    assert!(!log.contains(SECRET_X), "secret in the decision log");
    gw.server.shutdown();
}

async fn policies(gw: &Gateway) -> Value {
    let resp = http()
        .get(gw.api("/v1/policies"))
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Waits until `GET /v1/policies` satisfies `done` (reloads poll every 100 ms).
async fn policies_until(gw: &Gateway, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..100 {
        let report = policies(gw).await;
        if done(&report) {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("policy report never got there: {}", policies(gw).await);
}

/// The refusal reasons for a CONNECT to api.b.test by sb-a (refused by the egress layer).
async fn egress_refusal(gw: &Gateway) -> String {
    match connect_tunnel(
        gw.server.proxy_addr(),
        "api.b.test:443",
        Some(("sb-a", TOKEN)),
    )
    .await
    {
        Ok(_) => panic!("CONNECT to api.b.test was allowed"),
        Err((status, text)) => {
            assert_eq!(status, 403, "{text}");
            text
        }
    }
}

/// A broken file never replaces the serving generation: `GET /v1/policies` shows the error
/// (file and line, and when), decisions keep coming from the old generation, and fixing the
/// file loads a new one.
#[tokio::test]
async fn policies_endpoint_reports_generations_and_a_broken_reload() {
    let gate_v1 = "package sandgate.egress\nimport rego.v1\n\ndeny contains \"gate v1 refuses api.b.test\" if input.destination.host == \"api.b.test\"\n";
    let gw = Gateway::start(GatewayOptions {
        extra_toml: sandbox_config(),
        extra_policies: vec![("gate.rego", gate_v1.into())],
        ..GatewayOptions::default()
    })
    .await;
    let unauthenticated = http().get(gw.api("/v1/policies")).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);

    let first = policies(&gw).await;
    let generation = first["generation"].as_u64().unwrap();
    assert!(first["last_error"].is_null(), "{first}");
    let files: Vec<&str> = first["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        files.contains(&"gate.rego") && files.contains(&"egress.rego"),
        "{first}"
    );
    assert_eq!(
        first["layers"]["present"],
        json!([
            "egress",
            "credential",
            "creation",
            "provider",
            "lifecycle",
            "action"
        ])
    );
    assert_eq!(first["layers"]["missing"], json!([]));
    assert!(egress_refusal(&gw)
        .await
        .contains("gate v1 refuses api.b.test"));

    // Break the file: a syntax error on line 4.
    std::fs::write(
        gw.policy_dir.join("gate.rego"),
        "package sandgate.egress\nimport rego.v1\n\ndeny contains \"gate v2\" if input.destination.host ==\n",
    )
    .unwrap();
    let broken = policies_until(&gw, |r| !r["last_error"].is_null()).await;
    let error = &broken["last_error"];
    assert!(
        error["message"].as_str().unwrap().contains("gate.rego"),
        "{error}"
    );
    time::OffsetDateTime::parse(
        error["at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(
        broken["generation"].as_u64().unwrap(),
        generation,
        "{broken}"
    );
    // The old generation still decides.
    assert!(egress_refusal(&gw)
        .await
        .contains("gate v1 refuses api.b.test"));
    let health: Value = http()
        .get(gw.api("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "degraded");

    // Fix it: a new generation, no error, and decisions from the new rules.
    std::fs::write(
        gw.policy_dir.join("gate.rego"),
        "package sandgate.egress\nimport rego.v1\n\ndeny contains \"gate v2, fixed, refuses api.b.test\" if input.destination.host == \"api.b.test\"\n",
    )
    .unwrap();
    let fixed = policies_until(&gw, |r| r["generation"].as_u64().unwrap() > generation).await;
    assert!(fixed["last_error"].is_null(), "{fixed}");
    assert!(egress_refusal(&gw)
        .await
        .contains("gate v2, fixed, refuses api.b.test"));

    // A layer whose package goes away is reported missing (and denies by default).
    std::fs::remove_file(gw.policy_dir.join("action.rego")).unwrap();
    let without = policies_until(&gw, |r| r["layers"]["missing"] == json!(["action"])).await;
    assert!(!without["layers"]["present"]
        .as_array()
        .unwrap()
        .contains(&json!("action")));

    // The endpoint is in the OpenAPI document.
    let openapi: Value = http()
        .get(gw.api("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(openapi["paths"]["/v1/policies"]["get"].is_object());
    gw.server.shutdown();
}

// ------------------------------------------------------------------ scopes

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");

/// ws-a's own rules: it keeps itself off api.a.test and away from label `team=risky`, and
/// "allows everything" (which must not restore anything the platform refuses).
fn ws_a_scope() -> Vec<(&'static str, String)> {
    vec![
        (
            "workspaces/ws-a/egress.rego",
            r#"package sandgate.scopes.workspaces["ws-a"].egress
import rego.v1

allow := true

deny contains "workspace ws-a keeps its sandboxes off api.a.test" if input.destination.host == "api.a.test"
"#
            .into(),
        ),
        (
            "workspaces/ws-a/creation.rego",
            r#"package sandgate.scopes.workspaces["ws-a"].creation
import rego.v1

allow := true

deny contains "workspace ws-a does not run risky sandboxes" if input.request.labels.team == "risky"
"#
            .into(),
        ),
        (
            "platform/frozen.rego",
            "package sandgate.creation\nimport rego.v1\n\ndeny contains \"team frozen is frozen platform-wide\" if input.request.labels.team == \"frozen\"\n".into(),
        ),
    ]
}

async fn connect_as(gw: &Gateway, id: &str, authority: &str) -> Result<(), (u16, String)> {
    connect_tunnel(gw.server.proxy_addr(), authority, Some((id, TOKEN)))
        .await
        .map(|_| ())
}

/// Seed 001: "applicable rules compose, every required layer must allow, an explicit deny
/// wins, and a narrower permission cannot restore authority denied by another layer".
#[tokio::test]
async fn workspace_scopes_compose_with_the_platform_and_deny_wins() {
    let gw = Gateway::start(GatewayOptions {
        identities: vec![
            IdentitySpec::new("sb-a", "ws-a", vec!["api.a.test"]),
            IdentitySpec::new("sb-b", "ws-b", vec!["api.a.test"]),
        ],
        extra_toml: sandbox_config(),
        extra_policies: ws_a_scope(),
        ..GatewayOptions::default()
    })
    .await;

    // Egress. The platform allows api.a.test for both sandboxes; ws-a's scope denies it
    // for ws-a only.
    let (status, text) = connect_as(&gw, "sb-a", "api.a.test:443").await.unwrap_err();
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("workspace ws-a keeps its sandboxes off api.a.test"),
        "{text}"
    );
    assert!(
        connect_as(&gw, "sb-b", "api.a.test:443").await.is_ok(),
        "another workspace's scope does not apply to ws-b"
    );
    // ws-a's `allow := true` does not restore what the platform refuses (api.b.test is not
    // in sb-a's allow_domains).
    let (status, text) = connect_as(&gw, "sb-a", "api.b.test:443").await.unwrap_err();
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("no rule allowed this (default deny)"),
        "{text}"
    );

    // Creation, with the scope that decided in the decision log.
    let (status, body) = create_as(&gw, TOKEN_A, json!({"labels": {"team": "risky"}})).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.to_string()
            .contains("workspace ws-a does not run risky sandboxes"),
        "{body}"
    );
    let (status, body) = create_as(&gw, TOKEN_B, json!({"labels": {"team": "risky"}})).await;
    assert_eq!(status, 201, "ws-a's scope does not apply to ws-b: {body}");
    let (status, body) = create_as(&gw, TOKEN_A, json!({"labels": {"team": "frozen"}})).await;
    assert_eq!(
        status, 403,
        "ws-a's allow cannot restore a platform deny: {body}"
    );
    assert!(
        body.to_string()
            .contains("team frozen is frozen platform-wide"),
        "{body}"
    );
    let (status, body) = create_as(&gw, TOKEN_A, json!({"labels": {"team": "ml"}})).await;
    assert_eq!(status, 201, "{body}");

    let records = gw.policy_decisions("creation", 4).await;
    let scope_of = |team: &str, ws: &str| {
        records
            .iter()
            .find(|r| {
                r["input"]["request"]["labels"]["team"] == team && r["input"]["workspace"] == ws
            })
            .unwrap_or_else(|| panic!("no record for {team} in {ws}"))["result"]
            .clone()
    };
    assert_eq!(scope_of("risky", "ws-a")["scope"], "workspaces/ws-a");
    assert_eq!(scope_of("frozen", "ws-a")["scope"], "platform");
    assert_eq!(scope_of("risky", "ws-b")["allow"], true);
    assert!(scope_of("ml", "ws-a")["scope"].is_null());

    let report = policies(&gw).await;
    assert_eq!(
        report["scopes"],
        json!([{"scope": "workspaces/ws-a", "layers": ["egress", "creation"], "bytecode": ["egress", "creation"]}])
    );

    // `policy eval` says which scope decided.
    let input = gw.dir.path().join("input.json");
    std::fs::write(
        &input,
        json!({
            "phase": "connect",
            "sandbox": {"id": "sb-a", "workspace": "ws-a", "labels": {}, "allow_domains": ["api.a.test"]},
            "destination": {"host": "api.a.test", "port": 443, "ip": null, "scheme": "connect",
                            "match_names": ["api.a.test", "*.a.test", "*.test"]}
        })
        .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["policy", "eval", "--layer", "egress", "--input"])
        .arg(&input)
        .arg("--dir")
        .arg(&gw.policy_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "refused: exit 1");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["allowed"], false);
    assert_eq!(printed["deny_scope"], "workspaces/ws-a");
    assert_eq!(printed["scopes"], json!(["platform", "workspaces/ws-a"]));
    gw.server.shutdown();
}

/// A workspace file that declares another scope's package is refused, by `policy check`
/// (file:line, exit 1) and by a reload (the previous generation keeps serving).
/// `sandgate policy check DIR`: its exit code and stderr.
fn policy_check(dir: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(BIN)
        .args(["policy", "check"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_misplaced_package_is_refused_with_file_and_line() {
    let gw = Gateway::start(GatewayOptions {
        extra_toml: sandbox_config(),
        extra_policies: ws_a_scope(),
        ..GatewayOptions::default()
    })
    .await;
    let generation = policies(&gw).await["generation"].as_u64().unwrap();
    // ws-a's folder trying to add an allow rule to the platform's creation package.
    std::fs::write(
        gw.policy_dir.join("workspaces/ws-a/sneaky.rego"),
        "# allow everything\n\npackage sandgate.creation\nimport rego.v1\n\nallow := true\n",
    )
    .unwrap();
    let (code, stderr) = policy_check(&gw.policy_dir);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("workspaces/ws-a/sneaky.rego:3:"),
        "{stderr}"
    );
    assert!(stderr.contains("does not match its folder"), "{stderr}");

    let report = policies_until(&gw, |r| !r["last_error"].is_null()).await;
    assert!(report["last_error"]["message"]
        .as_str()
        .unwrap()
        .contains("workspaces/ws-a/sneaky.rego:3:"));
    assert_eq!(report["generation"].as_u64().unwrap(), generation);

    // A workspace package outside its folder is refused as well.
    std::fs::remove_file(gw.policy_dir.join("workspaces/ws-a/sneaky.rego")).unwrap();
    std::fs::write(
        gw.policy_dir.join("elsewhere.rego"),
        "package sandgate.scopes.workspaces.ws_b.creation\nimport rego.v1\n\ndeny contains \"x\" if false\n",
    )
    .unwrap();
    let (code, stderr) = policy_check(&gw.policy_dir);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("elsewhere.rego:1:"), "{stderr}");
    std::fs::remove_file(gw.policy_dir.join("elsewhere.rego")).unwrap();
    let (code, stderr) = policy_check(&gw.policy_dir);
    assert_eq!(code, Some(0), "{stderr}");
    gw.server.shutdown();
}

/// `policy check` compiles exactly as the server does: a file the server refuses to load
/// (a call to a function that does not exist) fails the check too, with the same reason.
#[tokio::test]
async fn policy_check_refuses_what_the_server_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let policies = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(&policies).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let (code, stderr) = policy_check(dir.path());
    assert_eq!(code, Some(0), "the bundled policies pass: {stderr}");
    std::fs::write(
        dir.path().join("extra.rego"),
        "package sandgate.egress\nimport rego.v1\n\ndeny contains \"x\" if { no_such_function(input.host) }\n",
    )
    .unwrap();
    let Err(server_error) = sandgate::policy::PolicyEngine::load(dir.path()) else {
        panic!("the server refuses the file");
    };
    let server_error = server_error.to_string();
    let (code, stderr) = policy_check(dir.path());
    assert_eq!(code, Some(1), "policy check must refuse it too: {stderr}");
    assert!(stderr.contains("no_such_function"), "{stderr}");
    assert!(server_error.contains("no_such_function"), "{server_error}");
}
