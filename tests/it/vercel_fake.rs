//! The fake Vercel Sandbox API (`tests/it/common/fakes/vercel.rs`) proven with the official
//! `@vercel/sandbox` SDK, its fault script over a real socket, and the Vercel adapter
//! (`sandgate::providers::vercel`) driven through the `Provider` trait against it.
//!
//! `official_js_sdk_accepts_the_fake` runs `node tests/sdk/vercel_contract.mjs` with the SDK
//! installed in `SANDGATE_SDK_NODE` (default `/opt/sandgate-sdk-node`, where `.ci/run` runs
//! `npm ci` on `tests/sdk/package.json`). Without node or the SDK it prints `SKIPPED ...`,
//! except under CI (`CI` set, not `0`/`false`), where it fails.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::vercel::{CreateOutcome, FakeVercel, FakeVercelConfig, SessionStatus};
use sandgate::credentials::Secret;
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitReason, Lifecycle};
use sandgate::providers::vercel::{Vercel, VercelAccount, CA_PATH};
use sandgate::providers::{CreateSpec, ErrorClass, InstanceState, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/package.json`).
const VERCEL_SDK_VERSION: &str = "3.5.0";
const DEFAULT_SDK_NODE: &str = "/opt/sandgate-sdk-node";

fn sdk_dir() -> PathBuf {
    std::env::var_os("SANDGATE_SDK_NODE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SDK_NODE))
}

/// `Some(reason)` when node or the SDK is missing.
fn sdk_missing(dir: &Path) -> Option<String> {
    match std::process::Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("node --version failed: {}", out.status)),
        Err(e) => return Some(format!("node does not run: {e}")),
    }
    let package = dir.join("node_modules/@vercel/sandbox/package.json");
    match std::fs::read_to_string(&package) {
        Ok(text) => {
            let version = serde_json::from_str::<Value>(&text).ok()?["version"].clone();
            (version != VERCEL_SDK_VERSION).then(|| {
                format!(
                    "{} is version {version}, not {VERCEL_SDK_VERSION}",
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
        if common::in_ci() {
            panic!(
                "the Vercel contract test needs node and the official SDK under CI ({reason}): \
                 .ci/run installs @vercel/sandbox@{VERCEL_SDK_VERSION} into {DEFAULT_SDK_NODE}"
            );
        }
        eprintln!(
            "SKIPPED vercel_fake::official_js_sdk_accepts_the_fake: {reason} \
             (npm ci --prefix {DEFAULT_SDK_NODE} with tests/sdk/package.json, or set SANDGATE_SDK_NODE)"
        );
        return;
    }
    common::init();
    let fake = FakeVercel::start(FakeVercelConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/vercel_contract.mjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .env("VERCEL_FAKE_URL", fake.url())
        .env("VERCEL_TOKEN", fake.token())
        .env("VERCEL_TEAM_ID", fake.team_id())
        .env("VERCEL_PROJECT_ID", fake.project_id())
        .env("SANDGATE_SDK_NODE", &dir)
        .env("VERCEL_SDK_EXPECTED_VERSION", VERCEL_SDK_VERSION)
        .env("VERCEL_SANDBOX_TELEMETRY_DISABLED", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("VERCEL_OIDC_TOKEN")
        .env_remove("DEBUG_FETCH")
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
    assert_eq!(report["sdk"], VERCEL_SDK_VERSION);
    println!("{stdout}");

    let name = report["sandbox"].as_str().unwrap();
    let sandbox = fake
        .sandbox(name)
        .expect("the SDK's sandbox is in the inventory");
    assert_eq!(sandbox.create_path, "/v3/sandboxes");
    assert_eq!(sandbox.project_id, fake.project_id());
    assert_eq!(sandbox.tags["suite"], "vercel-contract");
    assert_eq!(sandbox.tags["run"], report["run"].as_str().unwrap());
    assert_eq!(sandbox.env["CONTRACT_ENV"], "from-create");
    assert_eq!(
        sandbox.network_policy,
        Some(json!({"allow": [], "subnets": {"allow": ["192.0.2.10/32"]}}))
    );
    assert_eq!(sandbox.vcpus, Some(2));
    assert_eq!(sandbox.timeout_ms, 120_000);
    assert!(sandbox.deleted);
    assert_eq!(sandbox.status, SessionStatus::Stopped);
    assert_eq!(sandbox.session_id, report["session"].as_str().unwrap());
    assert!(sandbox
        .commands
        .iter()
        .any(|c| c == &["sh".to_string(), "-c".into(), "exit 3".into()]));
    // Every call carried the team, and the 401 was the one wrong token.
    let requests = fake.requests();
    assert!(requests
        .iter()
        .all(|r| r.query.as_deref().unwrap_or("").contains("teamId=")));
    assert_eq!(requests.iter().filter(|r| r.status == Some(401)).count(), 1);
    for call in [
        "POST /v3/sandboxes",
        "GET /v2/sandboxes",
        &format!("DELETE /v2/sandboxes/{name}"),
        &format!(
            "POST /v2/sandboxes/sessions/{}/fs/write",
            sandbox.session_id
        ),
        &format!("POST /v2/sandboxes/sessions/{}/fs/read", sandbox.session_id),
        &format!("POST /v2/sandboxes/sessions/{}/cmd", sandbox.session_id),
        &format!("POST /v2/sandboxes/sessions/{}/stop", sandbox.session_id),
    ] {
        assert!(
            report["calls"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c == call),
            "the SDK made no {call}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The fault script, over reqwest
// ---------------------------------------------------------------------------------------

async fn raw_create(fake: &FakeVercel, body: Value) -> reqwest::Result<reqwest::Response> {
    http()
        .post(format!("{}/v3/sandboxes", fake.url()))
        .query(&[("teamId", fake.team_id())])
        .bearer_auth(fake.token())
        .json(&body)
        .send()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_create_faults() {
    let fake = FakeVercel::start(FakeVercelConfig {
        retry_after_secs: 7,
        hang: Duration::from_millis(200),
        ..FakeVercelConfig::default()
    })
    .await;
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "billing",
        "timeout_after_send",
        "failed_before_running",
        "ok",
    ]);
    let body = json!({"projectId": fake.project_id(), "tags": {"k": "v"}});
    let expect = [
        (503, "no_capacity"),
        (429, "rate_limited"),
        (500, "internal_server_error"),
        (402, "payment_required"),
    ];
    for (status, code) in expect {
        let response = raw_create(&fake, body.clone()).await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], code);
        assert!(error["error"]["message"].is_string());
        if status == 429 {
            assert_eq!(retry_after.as_deref(), Some("7"));
        }
    }
    assert_eq!(fake.live_count(), 0);
    // timeout_after_send: no answer, yet a sandbox exists.
    assert!(raw_create(&fake, body.clone()).await.is_err());
    assert_eq!(fake.live_with_tag("k", "v").len(), 1);
    // failed_before_running: answered, then the session fails.
    let response = raw_create(&fake, body.clone()).await.unwrap();
    assert_eq!(response.status(), 200);
    let created: Value = response.json().await.unwrap();
    let name = created["sandbox"]["name"].as_str().unwrap().to_string();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    let polled: Value = http()
        .get(format!("{}/v2/sandboxes/sessions/{session}", fake.url()))
        .query(&[("teamId", fake.team_id())])
        .bearer_auth(fake.token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(polled["session"]["status"], "failed");
    assert_eq!(fake.sandbox(&name).unwrap().status, SessionStatus::Failed);
    let response = raw_create(&fake, body.clone()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Capacity,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::Billing,
            CreateOutcome::TimeoutAfterSend,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::Ok,
        ]
    );
    assert!(fake.requests().iter().any(|r| r.status.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_team_and_input_are_checked() {
    let fake = FakeVercel::start(FakeVercelConfig::default()).await;
    let url = format!("{}/v2/sandboxes", fake.url());
    let project = [("project", fake.project_id())];
    let no_token = http().get(&url).query(&project).send().await.unwrap();
    assert_eq!(no_token.status(), 401);
    let body: Value = no_token.json().await.unwrap();
    assert_eq!(body["error"]["code"], "forbidden");
    let no_team = http()
        .get(&url)
        .query(&project)
        .bearer_auth(fake.token())
        .send()
        .await
        .unwrap();
    assert_eq!(no_team.status(), 400);
    let other_team = http()
        .get(&url)
        .query(&project)
        .query(&[("teamId", "team_other")])
        .bearer_auth(fake.token())
        .send()
        .await
        .unwrap();
    assert_eq!(other_team.status(), 403);
    let six_tags: BTreeMap<String, String> =
        (0..6).map(|i| (format!("k{i}"), "v".to_string())).collect();
    let refused = raw_create(
        &fake,
        json!({"projectId": fake.project_id(), "tags": six_tags}),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 400);
    let refused = raw_create(
        &fake,
        json!({"projectId": fake.project_id(), "networkPolicy": {"subnets": {"deny": ["nope"]}}}),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 400);
    let refused = raw_create(&fake, json!({"projectId": "prj_other"}))
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    assert_eq!(fake.live_count(), 0);
}

// ---------------------------------------------------------------------------------------
// The adapter against the fake
// ---------------------------------------------------------------------------------------

fn adapter(fake: &FakeVercel) -> Vercel {
    common::init();
    let options: BTreeMap<String, String> = [
        ("team_id", fake.team_id()),
        ("project_id", fake.project_id()),
        ("vcpus", "2"),
        ("timeout_ms", "600000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let account = VercelAccount::from_options(
        Some(&fake.url()),
        &options,
        Secret::new(fake.token().to_string()),
    )
    .unwrap();
    let tls = sandgate::tls::upstream_client_config(&[]).unwrap();
    Vercel::new(account, tls).unwrap()
}

fn spec(sandbox: &str, attempt: &str, egress: Option<RemoteEgress>) -> CreateSpec {
    let request = sandgate_router::Request::default();
    CreateSpec {
        tags: Tags {
            sandbox_id: sandbox.into(),
            attempt_id: attempt.into(),
        },
        pool: "vercel".into(),
        account: "vercel".into(),
        request: Arc::new(request),
        env: [("GH_TOKEN".to_string(), "sandgate-placeholder".to_string())].into(),
        snapshot: None,
        egress,
    }
}

fn egress(host: &str) -> RemoteEgress {
    RemoteEgress {
        proxy_url: format!("https://sb-1:tok@{host}:8443"),
        gateway_host: host.into(),
        gateway_port: 8443,
        ca_pem: "-----BEGIN CERTIFICATE-----\nFAKE\n-----END CERTIFICATE-----\n".into(),
        lock_down: true,
    }
}

async fn run(provider: &Vercel, id: &str, argv: &[&str]) -> (Vec<ExecEvent>, String, String) {
    let spec = ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..ExecSpec::default()
    };
    let mut stream = provider.exec(id, spec).await.unwrap();
    let mut events = Vec::new();
    let (mut out, mut err) = (String::new(), String::new());
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), stream.events.recv())
        .await
        .expect("exec events within 20 s")
    {
        match &event {
            ExecEvent::Stdout(b) => out.push_str(&String::from_utf8_lossy(b)),
            ExecEvent::Stderr(b) => err.push_str(&String::from_utf8_lossy(b)),
            ExecEvent::Exit(_) => {}
        }
        events.push(event);
    }
    (events, out, err)
}

fn exit_code(events: &[ExecEvent]) -> Option<i32> {
    match events.last() {
        Some(ExecEvent::Exit(info)) => info.code,
        _ => panic!("the stream did not end with an exit: {events:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_creates_locked_down_and_operates() {
    let fake = FakeVercel::start(FakeVercelConfig {
        start_delay: Duration::from_millis(600),
        ..FakeVercelConfig::default()
    })
    .await;
    let provider = adapter(&fake);
    assert_eq!(provider.kind(), "vercel");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    assert!(provider.check().await.unwrap().contains(fake.project_id()));

    let egress = egress("203.0.113.7");
    let started = Instant::now();
    let instance = provider
        .create(spec("sb-1", "at-1", Some(egress.clone())))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "create waited for running"
    );
    assert_eq!(instance.state, InstanceState::Running);
    let sandbox = fake.sandbox(&instance.id).unwrap();
    assert_eq!(sandbox.status, SessionStatus::Running);
    assert_eq!(sandbox.create_path, "/v3/sandboxes");
    assert_eq!(sandbox.tags["sandgate_sandbox"], "sb-1");
    assert_eq!(sandbox.tags["sandgate_attempt"], "at-1");
    assert_eq!(sandbox.network_policy, provider.lockdown(&egress));
    assert_eq!(
        sandbox.network_policy,
        Some(json!({"allow": [], "subnets": {"allow": ["203.0.113.7/32"]}}))
    );
    assert_eq!(sandbox.env["HTTPS_PROXY"], egress.proxy_url);
    assert_eq!(sandbox.env["http_proxy"], egress.proxy_url);
    assert_eq!(sandbox.env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(sandbox.env["GH_TOKEN"], "sandgate-placeholder");
    assert_eq!(sandbox.vcpus, Some(2));
    assert_eq!(sandbox.timeout_ms, 600_000);
    assert_eq!(
        fake.file(&instance.id, CA_PATH).as_deref(),
        Some(egress.ca_pem.as_bytes())
    );

    // A hostname gateway is allowed by name.
    let by_name = provider.lockdown(&self::egress("gw.example.com")).unwrap();
    assert_eq!(by_name, json!({"allow": ["gw.example.com"]}));

    // exec: ordered output and the exit code.
    let (events, out, err) = run(
        &provider,
        &instance.id,
        &["sh", "-c", "echo one; echo two >&2; echo three; exit 4"],
    )
    .await;
    assert_eq!(out, "one\nthree\n");
    assert_eq!(err, "two\n");
    assert_eq!(exit_code(&events), Some(4));
    let (events, out, _) = run(&provider, &instance.id, &["pwd"]).await;
    assert_eq!(exit_code(&events), Some(0));
    assert!(out.ends_with("/vercel/sandbox\n"), "{out}");

    // Cancel kills a long command.
    let stream = provider
        .exec(
            &instance.id,
            ExecSpec {
                argv: vec!["sleep".into(), "30".into()],
                ..ExecSpec::default()
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    (stream.cancel)();
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fake
        .requests()
        .iter()
        .any(|r| r.method == "POST" && r.path.ends_with("/kill") && r.status == Some(200))
    {
        assert!(Instant::now() < deadline, "cancel sent no kill");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A timeout ends a command as timed out.
    let mut timed = provider
        .exec(
            &instance.id,
            ExecSpec {
                argv: vec!["sleep".into(), "30".into()],
                timeout: Some(Duration::from_millis(500)),
                ..ExecSpec::default()
            },
        )
        .await
        .unwrap();
    let mut last = None;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), timed.events.recv())
        .await
        .unwrap()
    {
        last = Some(event);
    }
    match last {
        Some(ExecEvent::Exit(info)) => assert_eq!(info.reason, ExitReason::TimedOut),
        other => panic!("no exit: {other:?}"),
    }

    // Files round trip; mkdir.
    provider
        .write_file(
            &instance.id,
            "/vercel/sandbox/a/b.txt",
            b"payload\n".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(
        provider
            .read_file(&instance.id, "/vercel/sandbox/a/b.txt")
            .await
            .unwrap(),
        b"payload\n"
    );
    let (_, out, _) = run(&provider, &instance.id, &["cat", "a/b.txt"]).await;
    assert_eq!(out, "payload\n");
    let missing = provider
        .read_file(&instance.id, "/vercel/sandbox/none")
        .await
        .unwrap_err();
    assert_eq!(missing.kind, sandgate::providers::OpErrorKind::NotFound);
    provider
        .mkdir(&instance.id, "/vercel/sandbox/d", false)
        .await
        .unwrap();
    provider
        .mkdir(&instance.id, "/vercel/sandbox/e/f/g", true)
        .await
        .unwrap();
    assert!(fake
        .sandbox(&instance.id)
        .unwrap()
        .root
        .join("vercel/sandbox/e/f/g")
        .is_dir());

    // list_by_tag and get.
    let found = provider.list_by_tag("sb-1", None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, instance.id);
    assert_eq!(found[0].tags.attempt_id, "at-1");
    assert!(provider
        .list_by_tag("sb-1", Some("at-2"))
        .await
        .unwrap()
        .is_empty());
    assert!(provider.list_by_tag("sb-2", None).await.unwrap().is_empty());
    let got = provider.get(&instance.id).await.unwrap().unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert!(provider.get("sbx-absent").await.unwrap().is_none());

    // Stop, then start again (resume: a new session).
    provider
        .lifecycle(&instance.id, Lifecycle::Stop)
        .await
        .unwrap();
    assert_eq!(
        fake.sandbox(&instance.id).unwrap().status,
        SessionStatus::Stopped
    );
    let stopped = provider
        .exec(
            &instance.id,
            ExecSpec {
                argv: vec!["true".into()],
                ..ExecSpec::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(stopped.kind, sandgate::providers::OpErrorKind::Conflict);
    assert_eq!(
        provider.get(&instance.id).await.unwrap().unwrap().state,
        InstanceState::Failed
    );
    provider
        .lifecycle(&instance.id, Lifecycle::Start)
        .await
        .unwrap();
    assert_eq!(fake.sandbox(&instance.id).unwrap().sessions.len(), 2);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (events, _, _) = run(&provider, &instance.id, &["true"]).await;
    assert_eq!(exit_code(&events), Some(0));
    let pause = provider
        .lifecycle(&instance.id, Lifecycle::Pause)
        .await
        .unwrap_err();
    assert_eq!(pause.kind, sandgate::providers::OpErrorKind::Unsupported);

    // Snapshot, restore into a new sandbox, delete the snapshot.
    let snap = provider.snapshot(&instance.id).await.unwrap();
    let mut from = spec("sb-2", "at-1", None);
    from.snapshot = Some(snap.id.clone());
    let restored = provider.create(from).await.unwrap();
    assert_eq!(
        fake.file(&restored.id, "/vercel/sandbox/a/b.txt")
            .as_deref(),
        Some(&b"payload\n"[..])
    );
    provider.delete_snapshot(&snap.id).await.unwrap();
    provider.delete_snapshot("snap_absent").await.unwrap();

    // delete, twice.
    provider.delete(&instance.id).await.unwrap();
    provider.delete(&instance.id).await.unwrap();
    provider.delete(&restored.id).await.unwrap();
    assert!(fake.sandbox(&instance.id).unwrap().deleted);
    assert!(provider.get(&instance.id).await.unwrap().is_none());
    assert_eq!(fake.live_count(), 0);
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.query.as_deref().unwrap_or("").contains("teamId=")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_failure_table_over_the_wire() {
    let fake = FakeVercel::start(FakeVercelConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(300),
        ..FakeVercelConfig::default()
    })
    .await;
    let provider = adapter(&fake);
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "billing",
        "failed_before_running",
    ]);
    let mut classes = Vec::new();
    for i in 0..5 {
        let e = provider
            .create(spec("sb-f", &format!("at-{i}"), None))
            .await
            .unwrap_err();
        if e.class == ErrorClass::RateLimit {
            assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        }
        if e.class == ErrorClass::FailedBeforeRunning {
            let id = e.instance_id.clone().expect("the failed instance is named");
            assert!(fake.sandbox(&id).is_some());
            provider.delete(&id).await.unwrap();
        }
        classes.push(e.class);
    }
    assert_eq!(
        classes,
        vec![
            ErrorClass::Outage,
            ErrorClass::RateLimit,
            ErrorClass::Outage,
            ErrorClass::Billing,
            ErrorClass::FailedBeforeRunning,
        ]
    );

    // A create the provider never answers: unknown, and list_by_tag finds it.
    fake.script(["timeout_after_send"]);
    let e = provider
        .create(spec("sb-lost", "at-lost", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    let found = provider
        .list_by_tag("sb-lost", Some("at-lost"))
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    provider.delete(&found[0].id).await.unwrap();

    // Wrong token: unbound account, no secret in the message.
    let options: BTreeMap<String, String> = [
        ("team_id".to_string(), fake.team_id().to_string()),
        ("project_id".to_string(), fake.project_id().to_string()),
    ]
    .into();
    let wrong = Vercel::new(
        VercelAccount::from_options(
            Some(&fake.url()),
            &options,
            Secret::new("wrong-secret-token".to_string()),
        )
        .unwrap(),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = wrong.check().await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);
    assert!(!e.message.contains("wrong-secret-token"));
    let e = wrong.create(spec("sb-x", "at-x", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);

    // Another project: not on this account.
    let options: BTreeMap<String, String> = [
        ("team_id".to_string(), fake.team_id().to_string()),
        ("project_id".to_string(), "prj_other".to_string()),
    ]
    .into();
    let other = Vercel::new(
        VercelAccount::from_options(
            Some(&fake.url()),
            &options,
            Secret::new(fake.token().to_string()),
        )
        .unwrap(),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = other.create(spec("sb-y", "at-y", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported);

    // A snapshot that does not exist: 410 snapshot_not_found.
    let mut from = spec("sb-z", "at-z", None);
    from.snapshot = Some("snap_absent".into());
    let e = provider.create(from).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");

    // Nothing reached: outage.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let options: BTreeMap<String, String> = [
        ("team_id".to_string(), "t".to_string()),
        ("project_id".to_string(), "p".to_string()),
    ]
    .into();
    let down = Vercel::new(
        VercelAccount::from_options(
            Some(&format!("http://{closed}")),
            &options,
            Secret::new("k".to_string()),
        )
        .unwrap(),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = down.create(spec("sb-d", "at-d", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert_eq!(fake.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_timeout_follows_the_sandbox_lifetime() {
    let fake = FakeVercel::start(FakeVercelConfig::default()).await;
    let provider = adapter(&fake);
    let instance = provider
        .create(spec("sb-life", "sb-life-a1", None))
        .await
        .unwrap();
    let timeout = |fake: &FakeVercel| fake.sandbox(&instance.id).unwrap().timeout_ms;
    // The account's 10 minutes at create.
    assert_eq!(timeout(&fake), 600_000);

    // A two-hour lifetime: Vercel's deadline is extended to it plus the margin. The
    // session started a moment ago, so its whole timeout is a little more than that.
    let two_hours = Duration::from_secs(7200);
    provider
        .extend_lifetime(&instance.id, Some(two_hours))
        .await
        .unwrap();
    let wanted = (two_hours + sandgate::providers::LIFETIME_MARGIN).as_millis() as u64;
    let set = timeout(&fake);
    assert!((wanted..wanted + 10_000).contains(&set), "timeout {set} ms");

    // Vercel's timeout only grows: a shorter lifetime, or none while plenty is left, leaves
    // it (sandgate's own expiry ends the sandbox first).
    provider
        .extend_lifetime(&instance.id, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    provider.extend_lifetime(&instance.id, None).await.unwrap();
    assert_eq!(timeout(&fake), set);
    let extends = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/extend-timeout"))
        .count();
    assert_eq!(extends, 1);
    provider.delete(&instance.id).await.unwrap();
}
