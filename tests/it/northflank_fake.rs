//! The fake Northflank API (`tests/it/common/fakes/northflank.rs`) proven with the official JS
//! client `@northflank/js-client`, its fault script exercised over a real socket, the Northflank
//! adapter (`sandgate::providers::northflank`) driven through the `Provider` trait against it,
//! and Northflank pools through a real gateway: lifecycle only (automatic routing never selects
//! them while the portable baseline is on; an explicit create with the baseline off lands
//! there), advisory egress, and `provider check`.
//!
//! `official_js_sdk_accepts_the_fake` runs `node tests/sdk/northflank_contract.mjs` with the
//! client installed in `SANDGATE_SDK_NODE` (default `/opt/sandgate-sdk-node`, where `.ci/run`
//! runs `npm ci` on `tests/sdk/package.json`). Without node or the client it FAILS, in CI or
//! not: the fake counts as evidence only once the client accepts it.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::northflank::{CreateOutcome, FakeNorthflank, FakeNorthflankConfig};
use crate::common::*;
use sandgate::credentials::Secret;
use sandgate::providers::northflank::{
    Northflank, NorthflankAccount, CAPABILITIES, CA_PATH, DEFAULT_COMMAND,
};
use sandgate::providers::ops::{ExecSpec, Lifecycle};
use sandgate::providers::{
    CreateSpec, ErrorClass, InstanceState, OpErrorKind, Provider, RemoteEgress, Tags,
};
use serde_json::{json, Value};

/// The client version the fake was proven against (pinned in `tests/sdk/package.json`).
const NORTHFLANK_SDK_VERSION: &str = "0.9.5";
const DEFAULT_SDK_NODE: &str = "/opt/sandgate-sdk-node";
const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBfakeNorthflankCA\n-----END CERTIFICATE-----\n";
const API_TOKEN: &str = "api-token-ws-a-0123456789";

fn sdk_dir() -> PathBuf {
    std::env::var_os("SANDGATE_SDK_NODE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SDK_NODE))
}

/// `Some(reason)` when node or the pinned client is missing.
fn sdk_missing(dir: &Path) -> Option<String> {
    match std::process::Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("node --version failed: {}", out.status)),
        Err(e) => return Some(format!("node does not run: {e}")),
    }
    let package = dir.join("node_modules/@northflank/js-client/package.json");
    match std::fs::read_to_string(&package) {
        Ok(text) => {
            let version = serde_json::from_str::<Value>(&text).ok()?["version"].clone();
            (version != NORTHFLANK_SDK_VERSION).then(|| {
                format!(
                    "{} is version {version}, not {NORTHFLANK_SDK_VERSION}",
                    package.display()
                )
            })
        }
        Err(e) => Some(format!("{}: {e}", package.display())),
    }
}

fn http() -> reqwest::Client {
    common::init();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_js_sdk_accepts_the_fake() {
    let dir = sdk_dir();
    if let Some(reason) = sdk_missing(&dir) {
        // Never skipped: without the client the fake proves nothing.
        panic!(
            "the Northflank contract test needs node and the official client ({reason}): \
             .ci/run installs @northflank/js-client@{NORTHFLANK_SDK_VERSION} into \
             {DEFAULT_SDK_NODE} (npm ci with tests/sdk/package.json), or set SANDGATE_SDK_NODE"
        );
    }
    common::init();
    let fake = FakeNorthflank::start(FakeNorthflankConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/northflank_contract.mjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .env("NORTHFLANK_FAKE_URL", fake.url())
        .env("NORTHFLANK_TOKEN", fake.token())
        .env("NORTHFLANK_PROJECT", fake.project())
        .env("NORTHFLANK_TEAM", fake.team())
        .env("SANDGATE_SDK_NODE", &dir)
        .env("NORTHFLANK_SDK_EXPECTED_VERSION", NORTHFLANK_SDK_VERSION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .kill_on_drop(true);
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(proxy);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the contract script finishes within 120 s")
        .expect("the contract script starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "contract script failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(
        last.strip_prefix("CONTRACT OK ")
            .unwrap_or_else(|| panic!("no CONTRACT OK line:\n{stdout}\n{stderr}")),
    )
    .unwrap();
    assert_eq!(report["sdk"], NORTHFLANK_SDK_VERSION);
    println!("{stdout}");

    // The inventory holds what the client made, as it sent it.
    let run = report["run"].as_str().unwrap();
    let id = report["service"].as_str().unwrap();
    let service = fake
        .service(id)
        .expect("the client's service is in the inventory");
    assert_eq!(
        service.description.as_deref(),
        Some(format!("sandgate_sandbox=sb-contract sandgate_attempt=sb-contract-{run}").as_str())
    );
    assert_eq!(service.plan, "nf-compute-20");
    assert_eq!(service.image, "ubuntu:24.04");
    assert_eq!(
        service.docker.as_ref().unwrap()["customCommand"],
        DEFAULT_COMMAND
    );
    assert_eq!(service.env["CONTRACT_ENV"], run);
    assert_eq!(
        service.files[CA_PATH],
        format!("CA for {run}\n").into_bytes()
    );
    assert!(service.deleted && service.instances == 1 && !service.paused);
    let other = fake.service(report["other"].as_str().unwrap()).unwrap();
    assert_eq!(
        other.team.as_deref(),
        Some(fake.team()),
        "the team-scoped path"
    );
    assert!(other.deleted);
    assert!(fake.live().is_empty());
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Ok,
            CreateOutcome::Rejected,
            CreateOutcome::Ok
        ]
    );
    let requests = fake.requests();
    assert!(requests.iter().all(|r| r
        .user_agent
        .as_deref()
        .is_some_and(|ua| ua.starts_with("northflank-js-client/"))));
    assert_eq!(requests.iter().filter(|r| r.status == Some(401)).count(), 1);
    let pages = requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/v1/projects/sandboxes/services")
        .count();
    assert_eq!(pages, 2, "two services listed one per page");
    for (method, tail) in [
        ("PUT", "/services/deployment".to_string()),
        ("POST", format!("/services/{id}/pause")),
        ("POST", format!("/services/{id}/resume")),
        ("POST", format!("/services/{id}/scale")),
        ("DELETE", format!("/services/{id}")),
    ] {
        let path = format!("/v1/projects/sandboxes{tail}");
        assert!(
            requests
                .iter()
                .any(|r| r.method == method && r.path == path && r.status == Some(200)),
            "the client made no {method} {path}"
        );
    }
}

// ------------------------------------------------------------------- the fault script

async fn create_raw(fake: &FakeNorthflank, name: &str) -> (u16, Value, reqwest::header::HeaderMap) {
    let body = json!({
        "name": name,
        "billing": {"deploymentPlan": "nf-compute-20"},
        "deployment": {"instances": 1, "external": {"imagePath": "nginx:latest"}},
    });
    let response = http()
        .post(format!(
            "{}/v1/projects/{}/services/deployment",
            fake.url(),
            fake.project()
        ))
        .bearer_auth(fake.token())
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (
        status,
        response.json().await.unwrap_or(Value::Null),
        headers,
    )
}

async fn get_raw(fake: &FakeNorthflank, id: &str) -> (u16, Value) {
    let response = http()
        .get(format!(
            "{}/v1/projects/{}/services/{id}",
            fake.url(),
            fake.project()
        ))
        .bearer_auth(fake.token())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_fault_script_and_auth() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig {
        retry_after_secs: 7,
        ..FakeNorthflankConfig::default()
    })
    .await;
    // A wrong token, an unknown project: Northflank's error body.
    let response = http()
        .get(format!("{}/v1/projects/{}", fake.url(), fake.project()))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["status"], 401);
    assert!(body["error"]["message"].is_string());
    let response = http()
        .get(format!("{}/v1/projects/elsewhere/services", fake.url()))
        .bearer_auth(fake.token())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);

    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "billing",
        "failed_before_running",
    ]);
    let (status, body, _) = create_raw(&fake, "c").await;
    assert_eq!(status, 503);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("capacity"));
    let (status, _, headers) = create_raw(&fake, "r").await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(create_raw(&fake, "o").await.0, 502);
    assert_eq!(create_raw(&fake, "b").await.0, 402);
    let (status, failed, _) = create_raw(&fake, "Failing One").await;
    assert_eq!(status, 200);
    assert_eq!(
        failed["data"]["id"], "failing-one",
        "the id is the name's slug"
    );
    wait_until(|| fake.service("failing-one").unwrap().deployment == "FAILED").await;
    let (status, ok, _) = create_raw(&fake, "ok-1").await;
    assert_eq!(status, 200);
    assert_eq!(ok["data"]["status"]["deployment"]["status"], "PENDING");
    wait_until(|| fake.service("ok-1").unwrap().deployment == "COMPLETED").await;
    // A taken id and an unknown plan are refused.
    assert_eq!(create_raw(&fake, "OK 1").await.0, 409);
    let response = http()
        .put(format!(
            "{}/v1/projects/{}/services/deployment",
            fake.url(),
            fake.project()
        ))
        .bearer_auth(fake.token())
        .json(&json!({"name": "x", "billing": {"deploymentPlan": "huge"},
                       "deployment": {"instances": 1, "external": {"imagePath": "a"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Capacity,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::Billing,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::Ok,
            CreateOutcome::Rejected,
            CreateOutcome::Rejected,
        ]
    );
}

#[tokio::test]
async fn a_create_answered_never_still_appears() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig {
        hang: Duration::from_millis(200),
        appear_after: Duration::from_millis(500),
        ..FakeNorthflankConfig::default()
    })
    .await;
    fake.script(["timeout_after_send"]);
    let result = http()
        .post(format!(
            "{}/v1/projects/{}/services/deployment",
            fake.url(),
            fake.project()
        ))
        .bearer_auth(fake.token())
        .json(
            &json!({"name": "lost", "description": "sandgate_sandbox=sb-lost",
                       "billing": {"deploymentPlan": "nf-compute-20"},
                       "deployment": {"instances": 1, "external": {"imagePath": "a"}}}),
        )
        .send()
        .await;
    assert!(result.is_err(), "the connection is dropped: {result:?}");
    assert_eq!(fake.with_tag("sandgate_sandbox", "sb-lost").len(), 1);
    assert_eq!(get_raw(&fake, "lost").await.0, 404, "not visible at once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        get_raw(&fake, "lost").await.0,
        200,
        "visible after appear_after"
    );
}

async fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ------------------------------------------------------------------------------ adapter

fn account(url: &str, token: &str, project: &str, team: Option<&str>) -> NorthflankAccount {
    let mut options = BTreeMap::from([
        ("project".to_string(), project.to_string()),
        ("boot_timeout_secs".to_string(), "10".to_string()),
    ]);
    if let Some(team) = team {
        options.insert("team".into(), team.into());
    }
    NorthflankAccount::from_options(Some(url), &options, Secret::new(token.to_string()))
        .expect("account options")
}

fn build(account: NorthflankAccount) -> Northflank {
    common::init();
    Northflank::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn adapter(fake: &FakeNorthflank) -> Northflank {
    build(account(&fake.url(), fake.token(), fake.project(), None))
}

fn egress(lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: "https://sb-1:0123abcd@gw.sandgate.test:3128".to_string(),
        gateway_host: "gw.sandgate.test".to_string(),
        gateway_port: 3128,
        ca_pem: CA_PEM.to_string(),
        lock_down,
    }
}

fn spec(sandbox: &str, attempt: &str, egress: Option<RemoteEgress>) -> CreateSpec {
    CreateSpec {
        tags: Tags {
            sandbox_id: sandbox.to_string(),
            attempt_id: attempt.to_string(),
        },
        pool: "northflank-1".into(),
        account: "northflank".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_create_gets_tags_proxy_env_and_ca_and_no_native_lockdown() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig::default()).await;
    let provider = adapter(&fake);
    let instance = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress(false))))
        .await
        .unwrap();
    assert_eq!(instance.id, "sg-sb-1-a1");
    assert_eq!(instance.state, InstanceState::Running);
    let service = fake.service(&instance.id).unwrap();
    assert_eq!(service.deployment, "COMPLETED");
    assert_eq!(
        service.description.as_deref(),
        Some("sandgate_sandbox=sb-1 sandgate_attempt=sb-1-a1")
    );
    assert_eq!(service.plan, "nf-compute-20");
    assert_eq!(service.image, "ubuntu:24.04");
    assert_eq!(
        service.docker,
        Some(json!({"configType": "customCommand", "customCommand": "sleep infinity"}))
    );
    // The proxy and CA variables, the CA as a runtime file; no provider token anywhere.
    assert_eq!(service.env["SANDGATE_CRED_GH"], "placeholder-gh");
    assert_eq!(service.env["HTTPS_PROXY"], egress(false).proxy_url);
    assert_eq!(service.env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(service.files[CA_PATH], CA_PEM.as_bytes());
    assert_eq!(service.files.len(), 1);
    for value in service.env.values() {
        assert!(!value.contains(fake.token()), "no provider token in env");
    }
    assert!(provider.lockdown(&egress(true)).is_none(), "nothing native");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    // Adopting needs nothing: the CA went in with the create.
    provider
        .adopt(&instance.id, Some(&egress(false)))
        .await
        .unwrap();
    // A create that must lock down is refused before anything is made.
    let before = fake.services().len();
    let e = provider
        .create(spec("sb-2", "sb-2-a1", Some(egress(true))))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert!(e.message.contains("advisory"), "{e}");
    assert_eq!(fake.services().len(), before);
    // The same attempt created again is the same service (PUT by name).
    let again = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress(false))))
        .await
        .unwrap();
    assert_eq!(again.id, instance.id);
    assert_eq!(fake.with_tag("sandgate_attempt", "sb-1-a1").len(), 1);
    assert_eq!(fake.create_log().last(), Some(&CreateOutcome::Existing));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_get_list_and_delete() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig::default()).await;
    // Team-scoped, as with an organization token.
    let provider = build(account(
        &fake.url(),
        fake.token(),
        fake.project(),
        Some(fake.team()),
    ));
    let a = provider
        .create(spec("sb-l", "sb-l-a1", None))
        .await
        .unwrap();
    let b = provider
        .create(spec("sb-l", "sb-l-a2", None))
        .await
        .unwrap();
    provider
        .create(spec("sb-m", "sb-m-a1", None))
        .await
        .unwrap();
    assert_eq!(
        fake.service(&a.id).unwrap().team.as_deref(),
        Some(fake.team())
    );
    let got = provider.get(&a.id).await.unwrap().unwrap();
    assert_eq!(
        (got.state, got.tags.attempt_id.as_str()),
        (InstanceState::Running, "sb-l-a1")
    );
    let mut ids: Vec<String> = provider
        .list_by_tag("sb-l", None)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    ids.sort();
    assert_eq!(ids, vec![a.id.clone(), b.id.clone()]);
    let one = provider.list_by_tag("sb-l", Some("sb-l-a2")).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].id, b.id);

    // Pause scales to 0; resume brings it back and waits for the deployment.
    provider.lifecycle(&a.id, Lifecycle::Pause).await.unwrap();
    let paused = fake.service(&a.id).unwrap();
    assert!(paused.paused && paused.instances == 0);
    assert!(
        provider.get(&a.id).await.unwrap().is_some(),
        "a paused service stays"
    );
    let e = provider
        .lifecycle(&a.id, Lifecycle::Pause)
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Conflict, "{e}");
    provider.lifecycle(&a.id, Lifecycle::Resume).await.unwrap();
    let resumed = fake.service(&a.id).unwrap();
    assert!(!resumed.paused && resumed.instances == 1);
    assert_eq!(resumed.deployment, "COMPLETED");

    // Lifecycle only: everything else answers unsupported, naming the provider.
    assert_eq!(provider.capabilities(&a.id).await.unwrap(), CAPABILITIES);
    const { assert!(CAPABILITIES.pause_resume && !CAPABILITIES.process_execute) };
    let unsupported = [
        provider
            .lifecycle(&a.id, Lifecycle::Stop)
            .await
            .unwrap_err(),
        provider
            .exec(
                &a.id,
                ExecSpec {
                    argv: vec!["true".into()],
                    ..ExecSpec::default()
                },
            )
            .await
            .err()
            .unwrap(),
        provider
            .read_file(&a.id, "/etc/hostname")
            .await
            .unwrap_err(),
        provider
            .write_file(&a.id, "/tmp/x", b"x".to_vec())
            .await
            .unwrap_err(),
        provider.snapshot(&a.id).await.unwrap_err(),
    ];
    for e in unsupported {
        assert_eq!(e.kind, OpErrorKind::Unsupported, "{e}");
        assert!(e.message.contains("northflank"), "{e}");
    }

    // Delete; absent afterwards, and deleting again succeeds.
    provider.delete(&a.id).await.unwrap();
    assert!(fake.service(&a.id).unwrap().deleted);
    assert!(provider.get(&a.id).await.unwrap().is_none());
    provider.delete(&a.id).await.unwrap();
    assert_eq!(provider.list_by_tag("sb-l", None).await.unwrap().len(), 1);
    assert!(provider.check().await.unwrap().contains(fake.project()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        ..FakeNorthflankConfig::default()
    })
    .await;
    let provider = adapter(&fake);
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "billing",
        "failed_before_running",
        "timeout_after_send",
    ]);
    let e = provider
        .create(spec("sb-f", "sb-f-a1", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "503: {e}");
    assert!(e.maybe_created, "a 5xx may have made it");
    let e = provider
        .create(spec("sb-f", "sb-f-a2", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    assert!(!e.maybe_created);
    let e = provider
        .create(spec("sb-f", "sb-f-a3", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "502: {e}");
    let e = provider
        .create(spec("sb-f", "sb-f-a4", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Billing, "{e}");
    assert!(!e.maybe_created);
    let e = provider
        .create(spec("sb-f", "sb-f-a5", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning, "{e}");
    let failed = e.instance_id.clone().expect("the failed service is named");
    assert_eq!(fake.service(&failed).unwrap().deployment, "FAILED");
    assert!(e.message.contains("FAILED"), "{e}");
    let e = provider
        .create(spec("sb-f", "sb-f-a6", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost create is found by its tags; a failed service is not live.
    let found = provider.list_by_tag("sb-f", Some("sb-f-a6")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert!(provider
        .list_by_tag("sb-f", Some("sb-f-a5"))
        .await
        .unwrap()
        .is_empty());
    // Sent again, the lost create is the same service: no duplicate.
    let retried = provider
        .create(spec("sb-f", "sb-f-a6", None))
        .await
        .unwrap();
    assert_eq!(retried.id, found[0].id);
    assert_eq!(fake.with_tag("sandgate_attempt", "sb-f-a6").len(), 1);

    // A wrong token: unbound account, never shown. An unknown project: unsupported.
    let wrong = build(account(
        &fake.url(),
        "nf-wrong-token-123",
        fake.project(),
        None,
    ));
    let e = wrong
        .create(spec("sb-w", "sb-w-a1", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount, "{e}");
    assert!(!e.message.contains("nf-wrong-token-123"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    let elsewhere = build(account(&fake.url(), fake.token(), "no-such-project", None));
    let e = elsewhere
        .create(spec("sb-w", "sb-w-a2", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = build(account(
        &format!("http://127.0.0.1:{closed}"),
        "k",
        "p",
        None,
    ));
    let e = down
        .create(spec("sb-d", "sb-d-a1", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert!(!e.maybe_created);
}

// ---------------------------------------------------------------------- through the gateway

struct Env {
    gw: Gateway,
    northflank: FakeNorthflank,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

fn topology(fake: &FakeNorthflank, keys: &Path) -> String {
    let key = keys.join("northflank.key");
    std::fs::write(&key, fake.token()).unwrap();
    format!(
        r#"
[[providers]]
name = "northflank"

[[accounts]]
name = "northflank-main"
provider = "northflank"
base_url = "{url}"
api_key_file = {key:?}
options = {{ project = "{project}" }}

[[pools]]
name = "a-northflank"
provider = "northflank"
account = "northflank-main"
"#,
        url = fake.url(),
        key = key.display().to_string(),
        project = fake.project(),
    )
}

async fn start() -> Env {
    init();
    let northflank = FakeNorthflank::start(FakeNorthflankConfig::default()).await;
    let keys = tempfile::tempdir().unwrap();
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        // The advertised proxy address; these tests do not dial it.
        proxy_toml: "public_url = \"http://127.0.0.1:3999\"\n".into(),
        extra_toml: format!(
            r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 8000
{topology}
"#,
            topology = topology(&northflank, keys.path())
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        northflank,
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        _keys: keys,
    }
}

impl Env {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.gw.api_post(path, API_TOKEN, &body).await
    }

    async fn get(&self, path: &str) -> Value {
        self.gw.api_json(path, API_TOKEN).await
    }

    async fn running(&self, body: Value) -> Value {
        let (status, created) = self.post("/v1/sandboxes", body).await;
        assert!(status == 201 || status == 202, "{status}: {created:#}");
        let id = created["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view = self.get(&format!("/v1/sandboxes/{id}")).await;
            if view["state"] != "provisioning" && view["state"] != "pending"
                || Instant::now() > deadline
            {
                assert_eq!(view["state"], "running", "{view:#}");
                return view;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The portable baseline turned off: no exec, no file read or write asked for.
fn no_baseline() -> Value {
    json!({"process": {"execute": false}, "filesystem": {"read": false, "write": false}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_northflank_pool_is_lifecycle_only_advisory_and_placed_only_when_asked() {
    let env = start().await;
    let pools = env.get("/v1/pools").await;
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "a-northflank")
        .cloned()
        .unwrap();
    assert_eq!(pool["egress"], "advisory", "{pool:#}");

    // Automatic routing with the baseline on never selects it, and says why.
    let (status, refused) = env.post("/v1/sandboxes", json!({})).await;
    assert!(status >= 400, "{status}: {refused:#}");
    let attempts = refused["error"]["details"]["attempts"].as_array().unwrap();
    let unmet = attempts[0]["unmet_requirements"].to_string();
    for need in [
        "features.process.execute",
        "features.filesystem.read",
        "features.filesystem.write",
    ] {
        assert!(unmet.contains(need), "{need}: {refused:#}");
    }
    assert!(env.northflank.services().is_empty(), "nothing was created");

    // Named explicitly with the baseline off, it lands there: advisory, no native lock-down.
    let view = env
        .running(
            json!({"provider": "northflank", "features": no_baseline(), "labels": {"t": "nf"}}),
        )
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "a-northflank", "{view:#}");
    assert_eq!(view["placement"]["provider"], "northflank");
    assert_eq!(view["egress"]["enforcement"], "advisory", "{view:#}");
    assert!(view["placement"]["lockdown"].is_null(), "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let service = env.northflank.service(instance).unwrap();
    assert!(service
        .description
        .as_deref()
        .unwrap()
        .contains(&format!("sandgate_sandbox={id}")));
    assert!(service.env["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    assert_eq!(
        service.files[&service.env["SSL_CERT_FILE"]],
        env.gw.sandgate_ca_pem
    );
    for value in service.env.values() {
        assert!(!value.contains(env.northflank.token()), "no provider token");
    }

    // Naming the provider alone (an explicit provider needs only what is asked), or turning
    // the baseline off under automatic routing, places there too.
    for body in [
        json!({"provider": "northflank"}),
        json!({"features": no_baseline()}),
    ] {
        let placed = env.running(body.clone()).await;
        assert_eq!(
            placed["placement"]["pool"], "a-northflank",
            "{body}: {placed:#}"
        );
    }

    // Pause and resume through the gateway; exec answers 501 naming the provider.
    let (status, paused) = env
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{paused:#}");
    assert!(env.northflank.service(instance).unwrap().paused);
    let (status, resumed) = env
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{resumed:#}");
    assert!(!env.northflank.service(instance).unwrap().paused);
    let (status, exec) = env
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"argv": ["true"], "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(status, 501, "{exec:#}");
    assert!(exec.to_string().contains("northflank"), "{exec:#}");

    // A network-restricted create is refused with the reason, nothing created.
    let before = env.northflank.services().len();
    let (status, refused) = env
        .post(
            "/v1/sandboxes",
            json!({"provider": "northflank", "features": no_baseline(),
                   "network": {"allow_domains": ["api.a.test"]}}),
        )
        .await;
    assert!(status >= 400, "{status}: {refused:#}");
    let unmet = refused["error"]["details"]["attempts"][0]["unmet_requirements"].to_string();
    assert!(unmet.contains("network"), "{refused:#}");
    assert_eq!(env.northflank.services().len(), before);

    // Deleting the sandbox deletes the service.
    let r = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env.northflank.service(instance).unwrap().deleted {
        assert!(Instant::now() < deadline, "the service was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sandgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandgate"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_works_for_a_northflank_account() {
    let fake = FakeNorthflank::start(FakeNorthflankConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "nf_wrong_token_0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    let mut text = topology(&fake, dir.path()).replace("a-northflank", "good");
    text = text.replace("northflank-main", "good");
    text.push_str(&format!(
        r#"
[[accounts]]
name = "bad"
provider = "northflank"
base_url = "{url}"
api_key_file = {bad:?}
options = {{ project = "{project}" }}
[[pools]]
name = "bad"
provider = "northflank"
account = "bad"
"#,
        url = fake.url(),
        bad = bad.display().to_string(),
        project = fake.project(),
    ));
    std::fs::write(&config, text).unwrap();
    let run = |account: &str| {
        std::process::Command::new(sandgate_bin())
            .args(["provider", "check", account, "--config"])
            .arg(&config)
            .output()
            .unwrap()
    };
    let out = run("good");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok: account good (northflank)"), "{stdout}");
    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("account bad (northflank): unbound_account"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("nf_wrong_token"),
        "the key is never printed: {stderr}"
    );
}
