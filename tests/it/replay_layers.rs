//! `eval --replay` reproduces recorded decisions of every layer exactly: a real gateway
//! (simulated pools, the bundled policies plus a `data.json`) takes real traffic that makes
//! at least 100 logged decisions of each layer (creation, provider, lifecycle, action — exec
//! and files — credential and egress), allowed and refused alike, and every record, read
//! back from the log alone, is evaluated again and must answer exactly as recorded.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use sandgate::cli::replay::eval_replay;
use sandgate::policy::replay::{self, Recorded};
use sandgate::policy::PolicyEngine;
use serde_json::{json, Value};

const ALICE: &str = "api-token-layers-a-0123456789";
const BOB: &str = "api-token-layers-b-0123456789";
const SECRET: &str = "layers-secret-value-42";
/// Enough of each layer for the issue's "100 recorded decisions of every layer".
const PER_LAYER: usize = 100;

/// Two pools on one account: the bundled provider policy refuses `pool-prod` (labelled
/// production) to a create not labelled so, and routing goes on to `pool-a`.
fn config(secret_file: &str, tls_port: u16) -> String {
    format!(
        r#"
[[api.tokens]]
token = "{ALICE}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{BOB}"
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
name = "pool-prod"
provider = "sim"
account = "acct-a"
labels = {{ environment = "production" }}

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"

[[credentials]]
workspace = "ws-a"
name = "x"
secret_file = {secret_file:?}
placeholder_env = "X_TOKEN"
destinations = [{{ host = "api.a.test", ports = [{tls_port}], methods = ["GET"] }}]
apply = {{ type = "query", param = "access_token" }}
"#
    )
}

/// Refusals for every API layer, from data: bob's workspace may use no pool it has, alice's
/// may not run `rm` or write files.
const DATA: &str = r#"{"sandgate": {"workspaces": {
  "ws-a": {"blocked_programs": ["rm"], "blocked_operations": ["files.write"]},
  "ws-b": {"approved_pools": ["pool-none"]}
}}}"#;

/// A platform rule of the credential layer: no credential is applied under `/private`.
const CREDENTIAL_RULE: &str = r#"package sandgate.credential
import rego.v1

deny contains "credentials are not applied under /private" if startswith(input.request.path, "/private/")
"#;

fn api() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Creates (alice's admitted, bob's refused by creation policy); returns alice's sandboxes.
async fn creates(gw: &Gateway, http: &reqwest::Client) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..PER_LAYER + PER_LAYER / 2 {
        let (token, labels) = match i % 3 {
            0 => (BOB, json!({})),
            // Deleting these is refused by lifecycle policy (non-admin).
            1 if i < 30 => (ALICE, json!({"protected": "true"})),
            _ => (ALICE, json!({})),
        };
        let resp = http
            .post(gw.api("/v1/sandboxes"))
            .bearer_auth(token)
            .json(&json!({"labels": labels}))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        if token == ALICE {
            assert_eq!(status, 201, "{body}");
            ids.push(body["id"].as_str().unwrap().to_string());
        } else {
            assert_eq!(status, 403, "{body}");
        }
    }
    // Plans evaluate the provider layer for every candidate pool, `pool-prod` (refused)
    // included; nothing is created.
    for _ in 0..PER_LAYER / 2 {
        let resp = http
            .post(gw.api("/v1/sandboxes"))
            .bearer_auth(ALICE)
            .json(&json!({"dry_run": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    ids
}

/// Lifecycle (timeouts allowed, deleting a protected sandbox refused) and action decisions
/// (exec and files, allowed and refused); the answers beyond policy do not matter here.
async fn operations(gw: &Gateway, http: &reqwest::Client, ids: &[String]) {
    let protected = &ids[0];
    for (i, id) in ids.iter().enumerate() {
        let url = |p: &str| gw.api(&format!("/v1/sandboxes/{id}{p}"));
        let send = |r: reqwest::RequestBuilder| async move {
            r.bearer_auth(ALICE)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .ok()
        };
        send(
            http.post(url("/timeout"))
                .json(&json!({"ttl_secs": 3600 + i})),
        )
        .await;
        let argv = if i % 3 == 0 {
            json!(["/bin/rm", "-rf", format!("/tmp/{i}")])
        } else {
            json!(["echo", format!("hello {i}")])
        };
        send(http.post(url("/exec")).json(&json!({ "argv": argv }))).await;
        send(http.get(url("/files")).query(&[("path", "/tmp")])).await;
        if i % 2 == 0 {
            let write = http.put(url("/files/content")).query(&[("path", "/tmp/f")]);
            send(write.body("data")).await;
        }
    }
    for _ in 0..40 {
        let r = http
            .delete(gw.api(&format!("/v1/sandboxes/{protected}")))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403);
    }
}

/// Egress through the proxy: GETs with the credential's placeholder (the credential allowed
/// under `/v1`, refused under `/private` by [`CREDENTIAL_RULE`]), and a domain not allowed.
async fn egress(gw: &Gateway, tls_port: u16, plain_port: u16) {
    let http = api();
    let env: Value = http
        .get(gw.api("/v1/identities/sb-a/env"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let placeholder = env["placeholders"]["x"].as_str().unwrap().to_string();
    let client = gw.client("sb-a", true);
    for i in 0..PER_LAYER + 10 {
        let dir = if i % 3 == 0 { "private" } else { "v1" };
        let url = format!("https://api.a.test:{tls_port}/{dir}/{i}?access_token={placeholder}");
        let _ = client.get(url).send().await;
    }
    for i in 0..40 {
        let url = format!("http://api.b.test:{plain_port}/b/{i}");
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 403);
    }
}

/// What a record is, for counting: layer, and for the action layer its operation.
fn kind(record: &Recorded) -> String {
    match record.layer.as_str() {
        "action" => format!(
            "action:{}",
            record.input["operation"].as_str().unwrap_or("?")
        ),
        layer => layer.to_string(),
    }
}

#[tokio::test]
async fn a_hundred_recorded_decisions_of_every_layer_replay_exactly() {
    init();
    let ca = TestCa::new();
    let tls_origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let plain_origin = start_origin(None).await;
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("x");
    std::fs::write(&secret_file, SECRET).unwrap();
    let gw = Gateway::start(GatewayOptions {
        identities: vec![IdentitySpec {
            id: "sb-a",
            workspace: "ws-a",
            allow_domains: vec!["api.a.test"],
            credentials: vec!["x"],
        }],
        upstream_ca: Some(ca.pem_path.clone()),
        extra_policies: vec![
            ("data.json", DATA.to_string()),
            ("layers_credential.rego", CREDENTIAL_RULE.to_string()),
        ],
        extra_toml: config(&secret_file.display().to_string(), tls_origin.port()),
        ..GatewayOptions::default()
    })
    .await;
    let http = api();
    let ids = creates(&gw, &http).await;
    operations(&gw, &http, &ids).await;
    egress(&gw, tls_origin.port(), plain_origin.port()).await;
    // The log is written off the request path: wait until the last layers are in it.
    gw.policy_decisions("credential", PER_LAYER).await;
    gw.decisions(PER_LAYER).await;

    let mut records = Vec::new();
    replay::read(&gw.decision_log, |r| {
        records.push(r);
        true
    })
    .unwrap();
    let engine = PolicyEngine::load(&gw.policy_dir).unwrap();
    // (kind) -> (allowed, refused)
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut by_layer: BTreeMap<&str, usize> = BTreeMap::new();
    for record in &records {
        let (answer, _) = record.evaluate(&engine);
        assert_eq!(
            answer, record.recorded,
            "line {} ({}) replays differently: {}",
            record.line, record.decision_id, record.input
        );
        let entry = counts.entry(kind(record)).or_default();
        if record.recorded.allow {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
        *by_layer.entry(record.layer.as_str()).or_default() += 1;
    }
    for layer in sandgate::policy::LAYERS {
        let n = by_layer.get(layer).copied().unwrap_or(0);
        assert!(n >= PER_LAYER, "{n} {layer} records: {counts:?}");
    }
    // Both answers of every layer and action operation were recorded and reproduced.
    for kind in [
        "creation",
        "provider",
        "lifecycle",
        "action:exec",
        "credential",
        "egress",
    ] {
        let (allowed, refused) = counts.get(kind).copied().unwrap_or_default();
        assert!(allowed > 0 && refused > 0, "{kind}: {counts:?}");
    }
    // Files: listing allowed, writing blocked by data.
    assert!(counts.get("action:files.list").is_some_and(|c| c.0 > 0));
    assert!(counts.get("action:files.write").is_some_and(|c| c.1 > 0));
    // A refused exec was replayed from the summarised argv alone (no argument in the log).
    let exec = records
        .iter()
        .find(|r| r.input["operation"] == "exec" && !r.recorded.allow)
        .unwrap();
    assert!(exec.input["exec"].get("argv").is_none(), "{}", exec.input);
    assert_eq!(exec.input["exec"]["argv0"], "/bin/rm");
    let log = std::fs::read_to_string(&gw.decision_log).unwrap();
    assert!(!log.contains(SECRET), "secret in the decision log");

    // The command (`policy eval --replay`) on one record of every kind and answer.
    let mut seen = std::collections::BTreeSet::new();
    for record in &records {
        if !seen.insert((kind(record), record.recorded.allow)) {
            continue;
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = eval_replay(
            &record.decision_id,
            &gw.decision_log,
            &gw.policy_dir,
            &mut out,
            &mut err,
        );
        let out = String::from_utf8(out).unwrap();
        assert_eq!(code, 0, "{out}{}", String::from_utf8_lossy(&err));
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["matches"], true, "{report}");
    }
    assert!(seen.len() >= 14, "{seen:?}");
    gw.server.shutdown();
}
