//! The fake E2B (`tests/it/common/fakes/e2b.rs`) proven with the official E2B Python SDK, and
//! its fault script and inventory exercised over a real socket for the adapter tests.
//!
//! `official_python_sdk_accepts_the_fake` runs `tests/sdk/e2b_contract.py` with the
//! interpreter named by `SANDGATE_SDK_PYTHON` (default: `/opt/sandgate-sdk-venv/bin/python`
//! when it exists, else `python3`). Without the `e2b` package it prints `SKIPPED ...`,
//! except under CI (`CI` set, not `0`/`false`), where it fails: `.ci/run` installs the
//! pinned SDK first.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::fakes::e2b::{CreateOutcome, FakeE2b, FakeE2bConfig, SandboxState};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/requirements.txt`,
/// which `.ci/run` installs).
const E2B_SDK_VERSION: &str = "2.63.0";

fn http() -> reqwest::Client {
    common::init();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_accepts_the_fake() {
    let python = common::sdk::python();
    if let Some(reason) = common::sdk::missing(&python, "e2b") {
        if common::in_ci() {
            panic!(
                "the E2B contract test needs the official SDK under CI ({reason}): \
                 .ci/run installs e2b=={E2B_SDK_VERSION} into /opt/sandgate-sdk-venv"
            );
        }
        eprintln!(
            "SKIPPED e2b_fake::official_python_sdk_accepts_the_fake: {reason} \
             (pip install e2b=={E2B_SDK_VERSION}, or set SANDGATE_SDK_PYTHON)"
        );
        return;
    }

    let fake = FakeE2b::start(FakeE2bConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/e2b_contract.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("E2B_API_KEY", fake.api_key())
        .env("E2B_API_URL", fake.url())
        .env("E2B_SANDBOX_URL", fake.url())
        .env("E2B_DOMAIN", fake.domain())
        .env("E2B_SDK_EXPECTED_VERSION", E2B_SDK_VERSION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_ACCESS_TOKEN")
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
    let out = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("the contract script finishes within 180 s")
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
    assert_eq!(report["sdk"], E2B_SDK_VERSION);
    println!("{stdout}");

    // What the fake recorded of the SDK's requests.
    let id = report["sandbox"].as_str().unwrap();
    let sandbox = fake
        .sandbox(id)
        .expect("the SDK's sandbox is in the inventory");
    assert_eq!(sandbox.template_id, "base");
    assert_eq!(sandbox.metadata["suite"], "e2b-contract");
    assert_eq!(sandbox.metadata["run"], report["run"].as_str().unwrap());
    assert_eq!(sandbox.env_vars["CONTRACT_ENV"], "from-create");
    assert_eq!(sandbox.allow_internet_access, Some(false));
    assert_eq!(sandbox.allow_out, vec!["192.0.2.10".to_string()]);
    assert_eq!(sandbox.deny_out, vec!["0.0.0.0/0".to_string()]);
    assert_eq!(sandbox.timeout_secs, 120);
    assert_eq!(sandbox.create_path, "/v2/sandboxes");
    assert_eq!(sandbox.state, SandboxState::Killed);
    let other = fake.sandbox(report["other"].as_str().unwrap()).unwrap();
    assert_eq!(other.timeout_secs, 60, "set_timeout reached the fake");
    assert_eq!(other.state, SandboxState::Killed);
    let restored = fake
        .sandbox(report["restored"]["id"].as_str().unwrap())
        .expect("the sandbox restored from a snapshot");
    let snapshot = report["restored"]["snapshot"].as_str().unwrap();
    assert_eq!(restored.template_id, snapshot);
    assert_eq!(restored.restored_from.as_deref(), Some(snapshot));
    assert_eq!(restored.state, SandboxState::Killed);
    assert_eq!(fake.live_count(), 0, "nothing live: {:?}", fake.live());
    assert_eq!(fake.sandboxes().len(), 3);
    let seen = fake.requests();
    assert!(seen.iter().any(
        |r| r.path.starts_with("/process.Process/Start") && r.sandbox_id.as_deref() == Some(id)
    ));
    assert!(seen
        .iter()
        .any(|r| r.method == "POST" && r.path.starts_with("/files")));
    assert!(seen
        .iter()
        .any(|r| r.method == "POST"
            && r.path == format!("/v2/sandboxes/{}/connect", other.sandbox_id)));
}

/// The fault script, the inventory and the error shapes, as an adapter test sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_create_faults() {
    let fake = FakeE2b::start(FakeE2bConfig {
        retry_after_secs: 7,
        ..FakeE2bConfig::default()
    })
    .await;
    let http = http();
    let create = |body: Value| {
        http.post(format!("{}/v2/sandboxes", fake.url()))
            .header("X-API-Key", fake.api_key())
            .json(&body)
            .send()
    };
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "failed_before_running",
        "ok",
    ]);
    assert_eq!(fake.pending_script().len(), 5);

    let r = create(json!({"templateID": "base"})).await.unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], 503);
    assert_eq!(body["error_code"], "sandbox_capacity_unavailable");
    assert!(body["message"].is_string());

    let r = create(json!({"templateID": "base"})).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 429);

    let r = create(json!({"templateID": "base"})).await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.json::<Value>().await.unwrap().get("error_code").is_none());

    let r = create(json!({"templateID": "base"})).await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error_code"],
        "sandbox_create_failed"
    );
    assert_eq!(fake.live_count(), 0, "failed creates leave nothing live");
    assert_eq!(
        fake.sandboxes()
            .iter()
            .filter(|s| s.state == SandboxState::Failed)
            .count(),
        1
    );

    let r = create(json!({"templateID": "base", "metadata": {"k": "v"}}))
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    for field in [
        "templateID",
        "sandboxID",
        "clientID",
        "envdVersion",
        "envdAccessToken",
        "domain",
    ] {
        assert!(created[field].is_string(), "{field} in {created}");
    }
    assert_eq!(created["domain"], fake.domain());
    assert_eq!(fake.live_count(), 1);
    assert!(fake.pending_script().is_empty());
    assert_eq!(fake.create_attempts(), 5);
    let outcomes: Vec<CreateOutcome> = fake.create_log().iter().map(|c| c.outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            CreateOutcome::Capacity,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::Ok
        ]
    );

    // Authentication, in E2B's error shape.
    let r = http
        .get(format!("{}/v2/sandboxes", fake.url()))
        .header("X-API-Key", "wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 401);
    let r = http
        .delete(format!("{}/sandboxes/nope", fake.url()))
        .header("X-API-Key", fake.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 404);
}

/// `timeout_after_send`: the instance is created, the response never comes (the connection
/// is dropped after the hold) and the listing shows the instance only after a delay; a retry
/// with the same `Idempotency-Key` gets the same sandbox, not a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_after_send_creates_an_instance_the_client_never_hears_of() {
    let fake = FakeE2b::start(FakeE2bConfig {
        hang: Duration::from_millis(600),
        appear_after: Duration::from_millis(1200),
        ..FakeE2bConfig::default()
    })
    .await;
    let http = http();
    fake.script(["timeout_after_send"]);
    let started = Instant::now();
    let sent = http
        .post(format!("{}/v2/sandboxes", fake.url()))
        .header("X-API-Key", fake.api_key())
        .header("Idempotency-Key", "key-1")
        .json(&json!({"templateID": "base", "metadata": {"job": "j1"}}))
        .send()
        .await;
    assert!(sent.is_err(), "no response: {sent:?}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(fake.live_count(), 1, "the instance exists");
    let list = |query: &'static str| {
        http.get(format!("{}/v2/sandboxes?{query}", fake.url()))
            .header("X-API-Key", fake.api_key())
            .send()
    };
    let listed: Value = list("metadata=job%3Dj1")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]), "not listed yet");

    // A retry with the same key answers with the same sandbox.
    let r = http
        .post(format!("{}/v2/sandboxes", fake.url()))
        .header("X-API-Key", fake.api_key())
        .header("Idempotency-Key", "key-1")
        .json(&json!({"templateID": "base", "metadata": {"job": "j1"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let again: Value = r.json().await.unwrap();
    assert_eq!(fake.live_count(), 1, "no duplicate: {:?}", fake.live());
    assert_eq!(again["sandboxID"], fake.live()[0].sandbox_id.as_str());
    // The same key with another body is refused.
    let r = http
        .post(format!("{}/v2/sandboxes", fake.url()))
        .header("X-API-Key", fake.api_key())
        .header("Idempotency-Key", "key-1")
        .json(&json!({"templateID": "other"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error_code"],
        "idempotency_request_mismatch"
    );

    tokio::time::sleep(Duration::from_millis(1300).saturating_sub(started.elapsed())).await;
    let listed: Value = list("metadata=job%3Dj1")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "listed after the delay"
    );
    assert_eq!(listed[0]["sandboxID"], again["sandboxID"]);
    assert_eq!(fake.live_with_metadata("job", "j1").len(), 1);
}

/// Listing: metadata and state filters, paging with `limit` / `X-Next-Token`, and the
/// egress settings recorded per sandbox (and replaced by `PUT /sandboxes/{id}/network`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_paging_and_network() {
    let fake = FakeE2b::start(FakeE2bConfig::default()).await;
    let http = http();
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = http
            .post(format!("{}/sandboxes", fake.url()))
            .header("X-API-Key", fake.api_key())
            .json(&json!({
                "templateID": "base",
                "timeout": 30,
                "metadata": {"group": "g", "i": i.to_string()},
                "envVars": {"N": i.to_string()},
                "network": {"allowOut": ["api.example.com"], "denyOut": ["0.0.0.0/0"]},
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(
            r.json::<Value>().await.unwrap()["sandboxID"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let sandbox = fake.sandbox(&ids[1]).unwrap();
    assert_eq!(sandbox.create_path, "/sandboxes");
    assert_eq!(sandbox.env_vars["N"], "1");
    assert_eq!(sandbox.allow_out, vec!["api.example.com".to_string()]);
    assert_eq!(sandbox.timeout_secs, 30);

    let page = |query: String| {
        let http = http.clone();
        let url = format!("{}/v2/sandboxes?{query}", fake.url());
        let key = fake.api_key().to_string();
        async move {
            let r = http.get(url).header("X-API-Key", key).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let next = r
                .headers()
                .get("x-next-token")
                .map(|v| v.to_str().unwrap().to_string());
            (r.json::<Value>().await.unwrap(), next)
        }
    };
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let query = match &token {
            Some(t) => format!("metadata=group%3Dg&limit=2&nextToken={t}"),
            None => "metadata=group%3Dg&limit=2".to_string(),
        };
        let (items, next) = page(query).await;
        assert!(items.as_array().unwrap().len() <= 2);
        seen.extend(
            items
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["sandboxID"].as_str().unwrap().to_string()),
        );
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(sorted, expected, "every sandbox once over the pages");
    let r = http
        .get(format!("{}/v2/sandboxes?limit=0", fake.url()))
        .header("X-API-Key", fake.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .get(format!("{}/v2/sandboxes?state=sleeping", fake.url()))
        .header("X-API-Key", fake.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // Pause one; the state filter sees it.
    let r = http
        .post(format!("{}/sandboxes/{}/pause", fake.url(), ids[0]))
        .header("X-API-Key", fake.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (paused, _) = page("state=paused".to_string()).await;
    assert_eq!(paused.as_array().unwrap().len(), 1);
    assert_eq!(paused[0]["sandboxID"], ids[0].as_str());
    let (running, _) = page("state=running&metadata=group%3Dg".to_string()).await;
    assert_eq!(running.as_array().unwrap().len(), 2);

    // Live network change.
    let r = http
        .put(format!("{}/sandboxes/{}/network", fake.url(), ids[2]))
        .header("X-API-Key", fake.api_key())
        .json(&json!({"allowOut": ["10.1.2.3"], "denyOut": ["0.0.0.0/0"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let sandbox = fake.sandbox(&ids[2]).unwrap();
    assert_eq!(sandbox.allow_out, vec!["10.1.2.3".to_string()]);
    assert_eq!(sandbox.network_updates.len(), 1);

    // A domain in denyOut, and a domain in allowOut without denying all, are refused.
    for network in [
        json!({"denyOut": ["example.com"]}),
        json!({"allowOut": ["example.com"]}),
    ] {
        let r = http
            .post(format!("{}/v2/sandboxes", fake.url()))
            .header("X-API-Key", fake.api_key())
            .json(&json!({"templateID": "base", "network": network}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{network}");
    }
    assert_eq!(fake.live_count(), 3);
}
