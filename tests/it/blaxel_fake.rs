//! The fake Blaxel (`tests/it/common/fakes/blaxel.rs`) proven with the official Blaxel Python
//! SDK, its fault script exercised over a real socket, the Blaxel adapter
//! (`sandgate::providers::blaxel`) driven through the `Provider` trait against it, and Blaxel
//! pools through a real gateway: advisory egress, and a network-restricted create refused
//! there with the reason.
//!
//! `official_python_sdk_accepts_the_fake` runs `tests/sdk/blaxel_contract.py` with the
//! interpreter named by `SANDGATE_SDK_PYTHON` (default: `/opt/sandgate-sdk-venv/bin/python`
//! when it exists, else `python3`). Without the `blaxel` package it FAILS, in CI or not: the
//! fake counts as evidence only once the SDK accepts it (`.ci/run` installs the pinned SDK).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::blaxel::{CreateOutcome, FakeBlaxel, FakeBlaxelConfig, SandboxStatus};
use crate::common::*;
use sandgate::credentials::Secret;
use sandgate::providers::blaxel::{Blaxel, BlaxelAccount, CA_PATH};
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason, Lifecycle};
use sandgate::providers::{CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/requirements.txt`).
const BLAXEL_SDK_VERSION: &str = "0.4.24";
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakeBlaxelCA\n-----END CERTIFICATE-----\n";
const API_TOKEN: &str = "api-token-ws-a-0123456789";

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
    if let Some(reason) = common::sdk::missing(&python, "blaxel") {
        // Never skipped: without the SDK the fake proves nothing.
        panic!(
            "the Blaxel contract test needs the official SDK ({reason}): \
             pip install blaxel=={BLAXEL_SDK_VERSION} into /opt/sandgate-sdk-venv (.ci/run does), \
             or set SANDGATE_SDK_PYTHON"
        );
    }
    let fake = FakeBlaxel::start(FakeBlaxelConfig::default()).await;
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/blaxel_contract.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("BL_API_KEY", fake.api_key())
        .env("BL_WORKSPACE", fake.workspace())
        .env("BL_FAKE_API_URL", fake.url())
        .env("BLAXEL_SDK_EXPECTED_VERSION", BLAXEL_SDK_VERSION)
        // No telemetry, no ~/.blaxel of the machine's user, no proxy between it and the fake.
        .env("DO_NOT_TRACK", "1")
        .env("HOME", home.path())
        .env("BL_REGION", "us-pdx-1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("BL_ENV")
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
    assert_eq!(report["sdk"], BLAXEL_SDK_VERSION);

    // What the fake recorded of the SDK's requests.
    let name = report["sandbox"].as_str().unwrap();
    let sandbox = fake
        .sandbox(name)
        .expect("the SDK's sandbox is in the inventory");
    assert_eq!(sandbox.labels["suite"], "blaxel-contract");
    assert_eq!(sandbox.labels["run"], report["run"].as_str().unwrap());
    assert_eq!(sandbox.envs["CONTRACT_ENV"], "from-create");
    assert_eq!(sandbox.memory, Some(2048));
    assert_eq!(sandbox.region.as_deref(), Some("us-pdx-1"));
    assert_eq!(sandbox.status, SandboxStatus::Terminated);
    let network = fake.network(name).unwrap();
    assert_eq!(
        network["proxy"]["allowedDomains"],
        json!(["gw.contract.test"])
    );
    assert_eq!(network["firewall"]["rulesets"], json!(["proxy"]));
    assert_eq!(
        fake.file(name, "/home/user/contract.txt").as_deref(),
        Some(&b"written by the SDK\n"[..])
    );
    assert_eq!(
        fake.file(name, "/home/user/blob.bin"),
        Some((0u8..=255).collect::<Vec<u8>>())
    );
    assert_eq!(fake.live_count(), 0, "everything was deleted");
    let requests = fake.requests();
    // The SDK's API version on every control-plane call; the data plane at metadata.url.
    assert!(requests
        .iter()
        .filter(|r| r.path.starts_with("/v0/"))
        .all(|r| r.versioned));
    for (method, path) in [
        ("POST", "/process"),
        ("GET", "/process/sleeper/wait"),
        ("GET", "/process/sleeper/logs"),
        ("DELETE", "/process/forever/kill"),
        ("PUT", "/filesystem//home/user/blob.bin"),
        ("GET", "/filesystem//home/user"),
        ("DELETE", "/filesystem//home/user/gone.txt"),
    ] {
        assert!(
            requests.iter().any(|r| r.method == method
                && r.sandbox.as_deref() == Some(name)
                && r.path.ends_with(path)),
            "the SDK never called {method} {path}: {requests:#?}"
        );
    }
    // The streamed exec asked for the stream.
    assert!(requests.iter().any(|r| r.path.ends_with("/process")
        && r.accept
            .as_deref()
            .is_some_and(|a| a.contains("text/event-stream"))));
    assert!(fake.create_log().contains(&CreateOutcome::Existing));
    println!("{stdout}");
}

// ------------------------------------------------------------------------- raw protocol

async fn create_raw(fake: &FakeBlaxel, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let response = http()
        .post(format!("{}/sandboxes", fake.url()))
        .header(
            "X-Blaxel-Authorization",
            format!("Bearer {}", fake.api_key()),
        )
        .header("X-Blaxel-Workspace", fake.workspace())
        .header("Blaxel-Version", "2026-09-22")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, headers)
}

#[tokio::test]
async fn the_fault_script_and_auth() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig {
        retry_after_secs: 7,
        ..FakeBlaxelConfig::default()
    })
    .await;
    // The SDK's auth headers; a wrong key in the control plane's error shape.
    let response = http()
        .get(format!("{}/sandboxes", fake.url()))
        .header("X-Blaxel-Authorization", "Bearer wrong")
        .header("X-Blaxel-Workspace", fake.workspace())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], 401);
    assert!(body["error"].is_string());

    fake.script([
        "quota",
        "rate_limit",
        "outage",
        "auth_unavailable",
        "failed_before_running",
    ]);
    let (status, body, _) = create_raw(&fake, json!({"metadata": {"name": "q"}})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("QUOTA_EXCEEDED"))
    );
    let (status, body, headers) = create_raw(&fake, json!({"metadata": {"name": "r"}})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("RATE_LIMIT_EXCEEDED"))
    );
    assert_eq!(headers["retry-after"], "7");
    let (status, body, _) = create_raw(&fake, json!({"metadata": {"name": "o"}})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("SERVICE_UNAVAILABLE"))
    );
    let (status, body, _) = create_raw(&fake, json!({"metadata": {"name": "a"}})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("AUTHENTICATION_UNAVAILABLE"))
    );
    let (status, failed, _) = create_raw(&fake, json!({"metadata": {"name": "f"}})).await;
    assert_eq!(status, 200);
    assert_eq!(failed["status"], "FAILED");
    let (status, ok, _) = create_raw(
        &fake,
        json!({"metadata": {"name": "ok-1", "labels": {"k": "v"}}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(ok["status"], "DEPLOYED");
    assert!(ok["metadata"]["url"]
        .as_str()
        .unwrap()
        .ends_with("/run/ok-1"));
    assert_eq!(fake.live_with_label("k", "v").len(), 1);
    // Invalid names and regions are refused in the create's error shape.
    let (status, body, _) = create_raw(&fake, json!({"metadata": {"name": "Bad_Name"}})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("VALIDATION_FAILED"))
    );
    let (status, body, _) = create_raw(
        &fake,
        json!({"metadata": {"name": "x"}, "spec": {"region": "mars-1"}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_REGION"))
    );
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Quota,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::AuthUnavailable,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::Ok,
            CreateOutcome::Rejected,
            CreateOutcome::Rejected,
        ]
    );
}

#[tokio::test]
async fn a_create_answered_never_still_appears() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig {
        hang: Duration::from_millis(200),
        appear_after: Duration::from_millis(500),
        ..FakeBlaxelConfig::default()
    })
    .await;
    fake.script(["timeout_after_send"]);
    let result = http()
        .post(format!("{}/sandboxes", fake.url()))
        .header(
            "X-Blaxel-Authorization",
            format!("Bearer {}", fake.api_key()),
        )
        .header("X-Blaxel-Workspace", fake.workspace())
        .json(&json!({"metadata": {"name": "lost", "labels": {"sandgate_sandbox": "sb-lost"}}}))
        .send()
        .await;
    assert!(result.is_err(), "the connection is dropped: {result:?}");
    assert_eq!(fake.live_with_label("sandgate_sandbox", "sb-lost").len(), 1);
    let list = |fake: &FakeBlaxel| {
        let url = format!("{}/sandboxes", fake.url());
        let key = fake.api_key().to_string();
        let workspace = fake.workspace().to_string();
        async move {
            let body: Value = http()
                .get(url)
                .header("X-Blaxel-Authorization", format!("Bearer {key}"))
                .header("X-Blaxel-Workspace", workspace)
                .header("Blaxel-Version", "2026-09-22")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["data"].as_array().unwrap().len()
        }
    };
    assert_eq!(list(&fake).await, 0, "not listed at once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(list(&fake).await, 1, "listed after appear_after");
}

// ------------------------------------------------------------------------------ adapter

fn account(url: &str, key: &str, workspace: &str) -> BlaxelAccount {
    let options = BTreeMap::from([
        ("workspace".to_string(), workspace.to_string()),
        ("region".to_string(), "us-pdx-1".to_string()),
        ("memory_mb".to_string(), "2048".to_string()),
    ]);
    BlaxelAccount::from_options(Some(url), &options, Secret::new(key.to_string()))
        .expect("account options")
}

fn adapter(fake: &FakeBlaxel) -> Blaxel {
    common::init();
    let account = account(&fake.url(), fake.api_key(), fake.workspace());
    Blaxel::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
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
        pool: "blaxel-1".into(),
        account: "blaxel".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Both streams interleaved as they arrived.
    both: Vec<u8>,
    exit: ExitInfo,
}

async fn run(provider: &Blaxel, id: &str, spec: ExecSpec) -> Ran {
    let mut stream = provider.exec(id, spec).await.expect("exec starts");
    let mut ran = Ran {
        stdout: Vec::new(),
        stderr: Vec::new(),
        both: Vec::new(),
        exit: ExitInfo {
            code: None,
            signal: None,
            reason: ExitReason::Exited,
        },
    };
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.events.recv())
            .await
            .expect("an exec event within 30 s");
        match event {
            Some(ExecEvent::Stdout(b)) => {
                ran.stdout.extend_from_slice(&b);
                ran.both.extend_from_slice(&b);
            }
            Some(ExecEvent::Stderr(b)) => {
                ran.stderr.extend_from_slice(&b);
                ran.both.extend_from_slice(&b);
            }
            Some(ExecEvent::Exit(info)) => {
                ran.exit = info;
                assert!(stream.events.recv().await.is_none(), "nothing after Exit");
                return ran;
            }
            None => panic!("the stream ended without Exit"),
        }
    }
}

fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: args.iter().map(|s| s.to_string()).collect(),
        ..ExecSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_create_gets_labels_proxy_env_and_ca_and_no_native_lockdown() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig::default()).await;
    let provider = adapter(&fake);
    assert_eq!(provider.kind(), "blaxel");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    let instance = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress(false))))
        .await
        .expect("the create succeeds");
    assert_eq!(instance.id, "sg-sb-1-a1", "the name is the attempt's");
    let sandbox = fake
        .sandbox(&instance.id)
        .expect("the sandbox is at the fake");
    assert_eq!(sandbox.status, SandboxStatus::Deployed);
    assert_eq!(sandbox.labels["sandgate_sandbox"], "sb-1");
    assert_eq!(sandbox.labels["sandgate_attempt"], "sb-1-a1");
    assert_eq!(sandbox.image.as_deref(), Some("blaxel/base-image:latest"));
    assert_eq!(sandbox.memory, Some(2048));
    assert_eq!(sandbox.region.as_deref(), Some("us-pdx-1"));
    // Advisory: nothing native is sent or shown.
    assert_eq!(fake.network(&instance.id), None);
    assert!(provider.lockdown(&egress(false)).is_none());
    assert!(provider.lockdown(&egress(true)).is_none());
    // The proxy and CA variables, the placeholder credential, no secret.
    let env = fake.environment(&instance.id).unwrap();
    for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(
            env[var], "https://sb-1:0123abcd@gw.sandgate.test:3128",
            "{var}"
        );
    }
    assert_eq!(env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(env["SANDGATE_CRED_GH"], "placeholder-gh");
    assert!(env.values().all(|v| !v.contains(fake.api_key())));
    assert_eq!(
        fake.file(&instance.id, CA_PATH).as_deref(),
        Some(CA_PEM.as_bytes())
    );
    // A create sent again for the same attempt is the same sandbox (createIfNotExist).
    let again = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress(false))))
        .await
        .unwrap();
    assert_eq!(again.id, instance.id);
    assert_eq!(fake.sandboxes().len(), 1);
    // A pool that would lock down is refused before anything is made.
    let e = provider
        .create(spec("sb-2", "sb-2-a1", Some(egress(true))))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported);
    assert!(e.message.contains("advisory"), "{e}");
    assert_eq!(fake.sandboxes().len(), 1);
    assert!(provider.check().await.unwrap().contains(&fake.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_files_list_get_and_delete() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig::default()).await;
    let provider = adapter(&fake);
    let instance = provider
        .create(spec("sb-x", "sb-x-a1", None))
        .await
        .unwrap();
    let id = instance.id.clone();

    // Streamed output in order, exit code, quoting, env and cwd.
    let ran = run(
        &provider,
        &id,
        ExecSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo one; sleep 0.1; echo \"$1\" >&2; sleep 0.1; echo \"$GREETING\"; pwd; exit 3"
                    .into(),
                "arg0".into(),
                "it's two".into(),
            ],
            env: BTreeMap::from([("GREETING".to_string(), "hi $there".to_string())]),
            cwd: Some("/home/user".into()),
            timeout: None,
            user: None,
        },
    )
    .await;
    let both = String::from_utf8(ran.both).unwrap();
    assert!(both.starts_with("one\nit's two\nhi $there\n"), "{both:?}");
    assert!(String::from_utf8(ran.stdout)
        .unwrap()
        .trim_end()
        .ends_with("/home/user"));
    assert_eq!(String::from_utf8(ran.stderr).unwrap(), "it's two\n");
    assert_eq!(ran.exit.code, Some(3));
    assert_eq!(
        run(&provider, &id, argv(&["true"])).await.exit.code,
        Some(0)
    );
    let many = run(&provider, &id, argv(&["seq", "1", "20000"])).await;
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8(many.stdout).unwrap(), expected);
    // A timeout kills the command (by the name sandgate gave it).
    let started = Instant::now();
    let slow = run(
        &provider,
        &id,
        ExecSpec {
            timeout: Some(Duration::from_millis(500)),
            ..argv(&["sleep", "30"])
        },
    )
    .await;
    assert_eq!(slow.exit.reason, ExitReason::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    wait_until(|| {
        fake.processes()
            .iter()
            .any(|p| p.command.contains("sleep 30") && p.status == "killed")
    })
    .await;
    // Cancel kills too.
    let mut stream = provider
        .exec(&id, argv(&["sh", "-c", "echo started; sleep 30"]))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.events.recv())
        .await
        .unwrap();
    assert!(matches!(first, Some(ExecEvent::Stdout(_))), "{first:?}");
    (stream.cancel)();
    wait_until(|| {
        fake.processes()
            .iter()
            .any(|p| p.command.contains("echo started") && p.exit_code.is_some())
    })
    .await;

    // Files: text, binary, mkdir, delete, missing, escape.
    provider
        .write_file(&id, "/home/user/notes.txt", b"text file\n".to_vec())
        .await
        .unwrap();
    assert_eq!(
        provider
            .read_file(&id, "/home/user/notes.txt")
            .await
            .unwrap(),
        b"text file\n"
    );
    let blob: Vec<u8> = (0u8..=255).rev().collect();
    provider
        .write_file(&id, "/home/user/deep/blob.bin", blob.clone())
        .await
        .unwrap();
    assert_eq!(
        fake.file(&id, "/home/user/deep/blob.bin"),
        Some(blob.clone())
    );
    assert_eq!(
        provider
            .read_file(&id, "/home/user/deep/blob.bin")
            .await
            .unwrap(),
        blob
    );
    provider.mkdir(&id, "/home/user/a/b", true).await.unwrap();
    let listed = run(&provider, &id, argv(&["ls", "/home/user/a"])).await;
    assert_eq!(listed.stdout, b"b\n");
    let entries = provider.list_dir(&id, "/home/user").await.unwrap();
    let names: Vec<(&str, &str)> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        names,
        [("a", "dir"), ("deep", "dir"), ("notes.txt", "file")],
        "{entries:?}"
    );
    let notes = entries.iter().find(|e| e.name == "notes.txt").unwrap();
    assert_eq!((notes.size, notes.mode), (10, 0o644));
    assert!(notes.modified_unix > 0);
    let not_dir = provider
        .list_dir(&id, "/home/user/notes.txt")
        .await
        .unwrap_err();
    assert_eq!(not_dir.kind, OpErrorKind::Invalid);
    provider
        .remove_path(&id, "/home/user/deep", true)
        .await
        .unwrap();
    assert!(fake.file(&id, "/home/user/deep/blob.bin").is_none());
    let missing = provider
        .read_file(&id, "/home/user/nope")
        .await
        .unwrap_err();
    assert_eq!(missing.kind, OpErrorKind::NotFound);
    let escape = provider
        .read_file(&id, "/../../../../etc/passwd")
        .await
        .unwrap_err();
    assert_eq!(escape.kind, OpErrorKind::Invalid, "{escape}");
    // No lifecycle of Blaxel's own.
    let pause = provider.lifecycle(&id, Lifecycle::Pause).await.unwrap_err();
    assert_eq!(pause.kind, OpErrorKind::Unsupported);

    // Capabilities, list_by_tag (across pages), get.
    let caps = provider.capabilities(&id).await.unwrap();
    assert!(caps.process_execute && caps.process_ordered_output && caps.filesystem_write);
    assert!(!caps.pause_resume);
    let mut others = Vec::new();
    for i in 0..120 {
        others.push(
            provider
                .create(spec("sb-y", &format!("sb-y-a{i}"), None))
                .await
                .unwrap(),
        );
    }
    let found = provider.list_by_tag("sb-x", None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, id);
    assert_eq!(found[0].tags.attempt_id, "sb-x-a1");
    assert_eq!(provider.list_by_tag("sb-y", None).await.unwrap().len(), 120);
    assert_eq!(
        provider
            .list_by_tag("sb-y", Some("sb-y-a119"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.query.as_deref().is_some_and(|q| q.contains("cursor="))));
    assert_eq!(provider.get(&id).await.unwrap().unwrap().id, id);
    assert!(provider.get("sg-missing").await.unwrap().is_none());

    // Delete: DELETING then TERMINATED; twice and absent are fine.
    provider.delete(&id).await.unwrap();
    assert_eq!(fake.sandbox(&id).unwrap().status, SandboxStatus::Terminated);
    provider.delete(&id).await.unwrap();
    provider.delete("sg-never-existed").await.unwrap();
    assert!(provider.get(&id).await.unwrap().is_none());
    assert!(provider.list_by_tag("sb-x", None).await.unwrap().is_empty());
    let data_plane = provider.read_file(&id, "/home/user/notes.txt").await;
    assert!(data_plane.is_err(), "a deleted sandbox's files are gone");
}

async fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        ..FakeBlaxelConfig::default()
    })
    .await;
    let provider = adapter(&fake);
    fake.script([
        "quota",
        "rate_limit",
        "outage",
        "auth_unavailable",
        "failed_before_running",
        "timeout_after_send",
        "ok",
    ]);
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Quota, "{e}");
    assert!(!e.maybe_created);
    assert!(e.message.contains("QUOTA_EXCEEDED"), "{e}");
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage);
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage);
    assert!(!e.maybe_created, "answered before anything is created");
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning);
    let failed = e.instance_id.clone().expect("the failed sandbox is named");
    assert_eq!(fake.sandbox(&failed).unwrap().status, SandboxStatus::Failed);
    assert!(e.message.contains("failed to start"), "{e}");
    let e = provider.create(spec("sb-f", "a6", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost create is found by its labels; a failed sandbox is not live.
    let found = provider.list_by_tag("sb-f", Some("a6")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert!(provider
        .list_by_tag("sb-f", Some("a5"))
        .await
        .unwrap()
        .is_empty());
    // The lost create sent again is the same sandbox: no duplicate in the inventory.
    let retried = provider.create(spec("sb-f", "a6", None)).await.unwrap();
    assert_eq!(retried.id, found[0].id);
    assert_eq!(fake.live_with_label("sandgate_attempt", "a6").len(), 1);

    // A wrong key, a wrong workspace: unbound account, the key never shown.
    let wrong = Blaxel::new(
        account(&fake.url(), "wrong-key-123", fake.workspace()),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount, "{e}");
    assert!(!e.message.contains("wrong-key-123"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    let elsewhere = Blaxel::new(
        account(&fake.url(), fake.api_key(), "someone-else"),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = elsewhere
        .create(spec("sb-w", "w2", None))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount, "{e}");
    // A region Blaxel does not offer.
    let mut options = BTreeMap::from([
        ("workspace".to_string(), fake.workspace().to_string()),
        ("region".to_string(), "mars-1".to_string()),
    ]);
    options.insert("image".into(), "blaxel/base-image:latest".into());
    let account = BlaxelAccount::from_options(
        Some(&fake.url()),
        &options,
        Secret::new(fake.api_key().to_string()),
    )
    .unwrap();
    let mars = Blaxel::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = mars.create(spec("sb-m", "m1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RegionUnavailable, "{e}");
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = Blaxel::new(
        account_for(&format!("http://127.0.0.1:{closed}/v0")),
        sandgate::tls::upstream_client_config(&[]).unwrap(),
    )
    .unwrap();
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
}

fn account_for(url: &str) -> BlaxelAccount {
    account(url, "k", "w")
}

// ---------------------------------------------------------------------- through the gateway

struct Env {
    gw: Gateway,
    blaxel: FakeBlaxel,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

fn topology(fake: &FakeBlaxel, keys: &Path) -> String {
    let key = keys.join("blaxel.key");
    std::fs::write(&key, fake.api_key()).unwrap();
    format!(
        r#"
[[providers]]
name = "blaxel"

[[accounts]]
name = "blaxel-main"
provider = "blaxel"
base_url = "{url}"
api_key_file = {key:?}
options = {{ workspace = "{workspace}" }}

[[pools]]
name = "a-blaxel"
provider = "blaxel"
account = "blaxel-main"
"#,
        url = fake.url(),
        key = key.display().to_string(),
        workspace = fake.workspace(),
    )
}

async fn start() -> Env {
    start_with(FakeBlaxelConfig::default(), "").await
}

/// [`start`] with the fake's config and `[create]` settings.
async fn start_with(config: FakeBlaxelConfig, create: &str) -> Env {
    init();
    let blaxel = FakeBlaxel::start(config).await;
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
{create}
{topology}
"#,
            topology = topology(&blaxel, keys.path())
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        blaxel,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blaxel_pool_is_advisory_and_refuses_network_restricted_creates() {
    let env = start().await;
    // The pool declares what the adapter does.
    let pools = env.get("/v1/pools").await;
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "a-blaxel")
        .cloned()
        .unwrap();
    assert_eq!(pool["egress"], "advisory", "{pool:#}");

    // An unrestricted create runs there with the proxy variables and the CA.
    let view = env.running(json!({"labels": {"t": "blaxel"}})).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "a-blaxel", "{view:#}");
    assert_eq!(view["placement"]["provider"], "blaxel");
    assert_eq!(view["egress"]["enforcement"], "advisory", "{view:#}");
    assert!(view["placement"]["lockdown"].is_null(), "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = env.blaxel.sandbox(instance).unwrap();
    assert_eq!(sandbox.labels["sandgate_sandbox"], id);
    assert!(sandbox.network.is_none(), "nothing native");
    assert!(sandbox.envs["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    let ca = env
        .blaxel
        .file(instance, &sandbox.envs["SSL_CERT_FILE"])
        .expect("the CA was written through the filesystem API");
    assert_eq!(ca, env.gw.sandgate_ca_pem);

    // A network-restricted create is refused with the reason, nothing created.
    let before = env.blaxel.sandboxes().len();
    let (status, refused) = env
        .post(
            "/v1/sandboxes",
            json!({"network": {"allow_domains": ["api.a.test"]}}),
        )
        .await;
    assert!(status >= 400, "{status}: {refused:#}");
    let attempts = refused["error"]["details"]["attempts"].as_array().unwrap();
    let unmet = attempts[0]["unmet_requirements"].to_string();
    assert!(unmet.contains("network"), "{refused:#}");
    assert_eq!(env.blaxel.sandboxes().len(), before);
}

impl Env {
    /// Runs `sh -c script` through the gateway's exec API: (stdout, stderr, exit code).
    async fn sh(&self, id: &str, script: &str) -> (String, String, i64) {
        let response = self
            .http
            .post(self.gw.api(&format!("/v1/sandboxes/{id}/exec")))
            .bearer_auth(API_TOKEN)
            .json(&json!({"argv": ["sh", "-c", script], "timeout_ms": 30000}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        let (mut out, mut err, mut code) = (String::new(), String::new(), -1);
        for line in text.lines() {
            let e: Value = serde_json::from_str(line).unwrap();
            match e["type"].as_str() {
                Some("stdout") => out.push_str(e["text"].as_str().unwrap_or_default()),
                Some("stderr") => err.push_str(e["text"].as_str().unwrap_or_default()),
                Some("exit") => code = e["code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, err, code)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_and_files_through_the_gateway_on_a_blaxel_pool() {
    let env = start().await;
    let view = env.running(json!({})).await;
    let id = view["id"].as_str().unwrap();
    let (out, err, code) = env.sh(id, "echo hello; echo oops >&2; exit 4").await;
    assert_eq!((out.as_str(), err.as_str(), code), ("hello\n", "oops\n", 4));
    // The sandbox's proxy variables carry its own identity, never a provider key.
    let (out, _, code) = env.sh(id, "echo \"$HTTPS_PROXY\"; env").await;
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("http://{id}:")), "{out}");
    assert!(
        !out.contains(env.blaxel.api_key()),
        "no provider key in the sandbox"
    );
    let put = env
        .http
        .put(env.gw.api(&format!(
            "/v1/sandboxes/{id}/files/content?path=/home/user/gw.txt"
        )))
        .bearer_auth(API_TOKEN)
        .body(b"through the gateway".to_vec())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    let got = env
        .http
        .get(env.gw.api(&format!(
            "/v1/sandboxes/{id}/files/content?path=/home/user/gw.txt"
        )))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"through the gateway");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    assert_eq!(
        env.blaxel.file(instance, "/home/user/gw.txt").as_deref(),
        Some(&b"through the gateway"[..])
    );
    // No secret in the sandbox's files either.
    let sandbox = env.blaxel.sandbox(instance).unwrap();
    let ca = env.blaxel.file(instance, CA_PATH).unwrap();
    assert!(!String::from_utf8_lossy(&ca).contains(env.blaxel.api_key()));
    assert!(sandbox
        .envs
        .values()
        .all(|v| !v.contains(env.blaxel.api_key())));
    // Deleting the sandbox terminates the Blaxel sandbox.
    let deleted = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.blaxel.live_count() > 0 {
        assert!(Instant::now() < deadline, "{:?}", env.blaxel.live());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_never_answered_is_reconciled_by_label_without_a_duplicate() {
    let env = start_with(
        FakeBlaxelConfig {
            hang: Duration::from_millis(300),
            ..FakeBlaxelConfig::default()
        },
        "",
    )
    .await;
    env.blaxel.script(["timeout_after_send"]);
    let view = env.running(json!({})).await;
    let id = view["id"].as_str().unwrap();
    let live = env.blaxel.live_with_label("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "{:?}", env.blaxel.sandboxes());
    assert_eq!(view["placement"]["instance_id"], live[0].name.as_str());
    assert_eq!(env.blaxel.live_count(), 1, "no duplicate");
    assert_eq!(
        env.blaxel.create_log().first(),
        Some(&CreateOutcome::TimeoutAfterSend),
        "the create was never answered"
    );
    // Adopted, then finished: the CA is in.
    assert_eq!(
        env.blaxel.file(&live[0].name, CA_PATH).as_deref(),
        Some(env.gw.sandgate_ca_pem.as_slice())
    );
}

fn sandgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandgate"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_works_for_a_blaxel_account() {
    let fake = FakeBlaxel::start(FakeBlaxelConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.key");
    std::fs::write(&bad, "bl_wrong_key_0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    let mut text = topology(&fake, dir.path()).replace("a-blaxel", "good");
    text = text.replace("blaxel-main", "good");
    text.push_str(&format!(
        r#"
[[accounts]]
name = "bad"
provider = "blaxel"
base_url = "{url}"
api_key_file = {bad:?}
options = {{ workspace = "{workspace}" }}
[[pools]]
name = "bad"
provider = "blaxel"
account = "bad"
"#,
        url = fake.url(),
        bad = bad.display().to_string(),
        workspace = fake.workspace(),
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
    assert!(stdout.contains("ok: account good (blaxel)"), "{stdout}");
    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("account bad (blaxel): unbound_account"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("bl_wrong_key"),
        "the key is never printed: {stderr}"
    );
}
