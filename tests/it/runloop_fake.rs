//! The fake Runloop (`tests/it/common/fakes/runloop.rs`) proven with the official Runloop Python
//! SDK, its fault script exercised over a real socket, and the Runloop adapter
//! (`sandgate::providers::runloop`) driven through the `Provider` trait against it.
//!
//! `official_python_sdk_accepts_the_fake` runs `tests/sdk/runloop_contract.py` with the
//! interpreter named by `SANDGATE_SDK_PYTHON` (default: `/opt/sandgate-sdk-venv/bin/python`
//! when it exists, else `python3`). Without the `runloop_api_client` package it prints
//! `SKIPPED ...`, except under CI (`CI` set, not `0`/`false`), where it fails: `.ci/run`
//! installs the pinned SDK first.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::runloop::{CreateOutcome, DevboxStatus, FakeRunloop, FakeRunloopConfig};
use sandgate::credentials::Secret;
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason, Lifecycle};
use sandgate::providers::runloop::{Runloop, RunloopAccount, CA_PATH};
use sandgate::providers::{CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/requirements.txt`).
const RUNLOOP_SDK_VERSION: &str = "3.0.0";
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakeRunloopCA\n-----END CERTIFICATE-----\n";

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
    if let Some(reason) = common::sdk::missing(&python, "runloop_api_client") {
        if common::in_ci() {
            panic!(
                "the Runloop contract test needs the official SDK under CI ({reason}): \
                 .ci/run installs runloop-api-client=={RUNLOOP_SDK_VERSION} into /opt/sandgate-sdk-venv"
            );
        }
        eprintln!(
            "SKIPPED runloop_fake::official_python_sdk_accepts_the_fake: {reason} \
             (pip install runloop-api-client=={RUNLOOP_SDK_VERSION}, or set SANDGATE_SDK_PYTHON)"
        );
        return;
    }

    let fake = FakeRunloop::start(FakeRunloopConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/runloop_contract.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("RUNLOOP_API_KEY", fake.api_key())
        .env("RUNLOOP_BASE_URL", fake.url())
        .env("RUNLOOP_SDK_EXPECTED_VERSION", RUNLOOP_SDK_VERSION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("RUNLOOP_CUSTOM_HEADERS")
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
    assert_eq!(report["sdk"], RUNLOOP_SDK_VERSION);

    // What the fake recorded of the SDK's requests.
    let id = report["devbox"].as_str().unwrap();
    let devbox = fake
        .devbox(id)
        .expect("the SDK's devbox is in the inventory");
    assert_eq!(devbox.metadata["suite"], "runloop-contract");
    assert_eq!(devbox.metadata["run"], report["run"].as_str().unwrap());
    assert_eq!(devbox.environment_variables["CONTRACT_ENV"], "from-create");
    assert_eq!(devbox.status, DevboxStatus::Shutdown);
    assert_eq!(devbox.launch_parameters["resource_size_request"], "SMALL");
    let policy = fake.egress(id).expect("the devbox has the SDK's policy");
    assert_eq!(policy.id, report["policy"].as_str().unwrap());
    assert!(!policy.allow_all);
    assert_eq!(
        policy.allowed_hostnames,
        vec!["gw.contract.test".to_string()]
    );
    assert_eq!(policy.allowed_cidrs[0]["cidr"], "192.0.2.10/32");
    assert_eq!(policy.allowed_cidrs[0]["ports"][0]["port"], 8443);
    assert_eq!(
        fake.file(id, "contract.txt").as_deref(),
        Some(&b"written by the SDK\n"[..])
    );
    assert_eq!(
        fake.file(id, "/home/user/blob.bin"),
        Some((0u8..=255).collect::<Vec<u8>>())
    );
    let restored = fake.devbox(report["restored"].as_str().unwrap()).unwrap();
    assert_eq!(restored.snapshot_id.as_deref(), report["snapshot"].as_str());
    assert_eq!(fake.live_count(), 0, "everything was shut down");
    let requests = fake.requests();
    // The SDK's idempotency header on every call that changes something.
    assert!(requests
        .iter()
        .filter(|r| r.method == "POST" && r.status == Some(200))
        .all(|r| r.request_id.is_some()));
    // The SDK waited through the long polls and read the SSE streams.
    for path in [
        "/wait_for_status",
        "/stream_stdout_updates",
        "/stream_stderr_updates",
        "/suspend",
        "/resume",
        "/upload_file",
        "/download_file",
    ] {
        assert!(
            requests.iter().any(|r| r.path.ends_with(path)),
            "the SDK never called {path}"
        );
    }
    let same = fake
        .executions()
        .into_iter()
        .filter(|e| e.command == "echo once")
        .count();
    assert_eq!(same, 1, "one command_id, one execution");
    println!("{stdout}");
}

// ------------------------------------------------------------------------- raw protocol

async fn post(
    fake: &FakeRunloop,
    path: &str,
    body: Value,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let response = http()
        .post(format!("{}{path}", fake.url()))
        .bearer_auth(fake.api_key())
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
    let fake = FakeRunloop::start(FakeRunloopConfig {
        retry_after_secs: 7,
        ..FakeRunloopConfig::default()
    })
    .await;
    // Bearer auth, in Runloop's error shape.
    let response = http()
        .get(format!("{}/v1/devboxes", fake.url()))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "401");
    assert!(body["message"].is_string());

    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "failed_before_running",
        "ok",
    ]);
    let (status, _, _) = post(&fake, "/v1/devboxes", json!({})).await;
    assert_eq!(status, 503);
    let (status, _, headers) = post(&fake, "/v1/devboxes", json!({})).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "7");
    let (status, _, _) = post(&fake, "/v1/devboxes", json!({})).await;
    assert_eq!(status, 502);
    let (status, failing, _) = post(&fake, "/v1/devboxes", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(failing["status"], "provisioning");
    let (status, ok, _) = post(&fake, "/v1/devboxes", json!({"metadata": {"k": "v"}})).await;
    assert_eq!(status, 200);
    let failing_id = failing["id"].as_str().unwrap();
    let (status, waited, _) = post(
        &fake,
        &format!("/v1/devboxes/{failing_id}/wait_for_status"),
        json!({"statuses": ["running", "failure"], "timeout_seconds": 5}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(waited["status"], "failure");
    assert_eq!(waited["failure_reason"], "execution_failed");
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Capacity,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::Ok,
        ]
    );
    assert_eq!(fake.live_with_metadata("k", "v").len(), 1);
    assert_eq!(
        fake.live_with_metadata("k", "v")[0].id,
        ok["id"].as_str().unwrap()
    );
    // A long poll that runs out answers 408.
    let (status, _, _) = post(
        &fake,
        &format!(
            "/v1/devboxes/{}/wait_for_status",
            ok["id"].as_str().unwrap()
        ),
        json!({"statuses": ["suspended"], "timeout_seconds": 0.2}),
    )
    .await;
    assert_eq!(status, 408);
    // Two sources at once are refused.
    let (status, _, _) = post(
        &fake,
        "/v1/devboxes",
        json!({"blueprint_id": "a", "blueprint_name": "b"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(fake.create_log().last(), Some(&CreateOutcome::Rejected));
}

#[tokio::test]
async fn a_create_answered_never_still_appears() {
    let fake = FakeRunloop::start(FakeRunloopConfig {
        hang: Duration::from_millis(200),
        appear_after: Duration::from_millis(500),
        ..FakeRunloopConfig::default()
    })
    .await;
    fake.script(["timeout_after_send"]);
    let result = http()
        .post(format!("{}/v1/devboxes", fake.url()))
        .bearer_auth(fake.api_key())
        .json(&json!({"metadata": {"sandgate_sandbox": "sb-lost"}}))
        .send()
        .await;
    assert!(result.is_err(), "the connection is dropped: {result:?}");
    assert_eq!(
        fake.live_with_metadata("sandgate_sandbox", "sb-lost").len(),
        1
    );
    let list = |fake: &FakeRunloop| {
        let url = format!("{}/v1/devboxes", fake.url());
        let key = fake.api_key().to_string();
        async move {
            let body: Value = http()
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["devboxes"].as_array().unwrap().len()
        }
    };
    assert_eq!(list(&fake).await, 0, "not listed at once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(list(&fake).await, 1, "listed after appear_after");
}

// ------------------------------------------------------------------------------ adapter

fn adapter(fake: &FakeRunloop, options: &[(&str, &str)]) -> Runloop {
    common::init();
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let account =
        RunloopAccount::from_options(Some(&fake.url()), &options, Secret::new(fake.api_key()))
            .expect("account options");
    Runloop::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn egress(host: &str, lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: format!("https://sb-1:0123abcd@{host}:3128"),
        gateway_host: host.to_string(),
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
        pool: "runloop-1".into(),
        account: "runloop".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: ExitInfo,
}

async fn run(provider: &Runloop, id: &str, spec: ExecSpec) -> Ran {
    let mut stream = provider.exec(id, spec).await.expect("exec starts");
    let mut ran = Ran {
        stdout: Vec::new(),
        stderr: Vec::new(),
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
            Some(ExecEvent::Stdout(b)) => ran.stdout.extend_from_slice(&b),
            Some(ExecEvent::Stderr(b)) => ran.stderr.extend_from_slice(&b),
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
async fn a_locked_create_runs_with_the_gateway_policy_env_and_ca() {
    let fake = FakeRunloop::start(FakeRunloopConfig::default()).await;
    let provider = adapter(
        &fake,
        &[("resource_size", "small"), ("keep_alive_secs", "900")],
    );
    assert_eq!(provider.kind(), "runloop");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    let instance = provider
        .create(spec(
            "sb-1",
            "sb-1-a1",
            Some(egress("gw.sandgate.test", true)),
        ))
        .await
        .expect("the create succeeds");
    let devbox = fake
        .devbox(&instance.id)
        .expect("the devbox is at the fake");
    assert_eq!(devbox.status, DevboxStatus::Running);
    assert_eq!(devbox.metadata["sandgate_sandbox"], "sb-1");
    assert_eq!(devbox.metadata["sandgate_attempt"], "sb-1-a1");
    assert_eq!(devbox.request_id.as_deref(), Some("sb-1-a1"));
    assert_eq!(devbox.launch_parameters["resource_size_request"], "SMALL");
    assert_eq!(devbox.launch_parameters["keep_alive_time_seconds"], 900);

    // The egress policy: nothing but the gateway, attached at create.
    let policy = fake
        .egress(&instance.id)
        .expect("a network policy is attached");
    assert!(!policy.allow_all);
    assert_eq!(
        policy.allowed_hostnames,
        vec!["gw.sandgate.test".to_string()]
    );
    assert!(policy.allowed_cidrs.is_empty());
    assert!(!policy.allow_runloop_mirrors && !policy.allow_agent_gateway);
    let shown = provider
        .lockdown(&egress("gw.sandgate.test", true))
        .unwrap();
    assert_eq!(shown["allowed_hostnames"], json!(["gw.sandgate.test"]));
    assert_eq!(shown["name"], policy.name.as_str(), "one source of truth");
    assert!(provider
        .lockdown(&egress("gw.sandgate.test", false))
        .is_none());

    // The proxy and CA variables, the placeholder credential.
    let env = fake.environment(&instance.id).unwrap();
    for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(
            env[var], "https://sb-1:0123abcd@gw.sandgate.test:3128",
            "{var}"
        );
    }
    assert_eq!(env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(env["SANDGATE_CRED_GH"], "placeholder-gh");
    // The CA in the devbox.
    assert_eq!(
        fake.file(&instance.id, CA_PATH).as_deref(),
        Some(CA_PEM.as_bytes())
    );

    // A second create on the same gateway reuses the policy; an IP gateway gets a /32.
    let second = provider
        .create(spec(
            "sb-2",
            "sb-2-a1",
            Some(egress("gw.sandgate.test", true)),
        ))
        .await
        .unwrap();
    assert_eq!(fake.egress(&second.id).unwrap().id, policy.id);
    let by_ip = provider
        .create(spec("sb-3", "sb-3-a1", Some(egress("192.0.2.44", true))))
        .await
        .unwrap();
    let ip_policy = fake.egress(&by_ip.id).unwrap();
    assert_eq!(ip_policy.allowed_hostnames, Vec::<String>::new());
    assert_eq!(
        ip_policy.allowed_cidrs,
        vec![json!({"cidr": "192.0.2.44/32", "ports": [{"port": 3128, "protocol": "TCP"}]})]
    );
    assert_eq!(fake.policies().len(), 2);
    // A fresh adapter (a restarted gateway) finds the existing policy by name.
    let restarted = adapter(&fake, &[]);
    let third = restarted
        .create(spec(
            "sb-4",
            "sb-4-a1",
            Some(egress("gw.sandgate.test", true)),
        ))
        .await
        .unwrap();
    assert_eq!(fake.egress(&third.id).unwrap().id, policy.id);
    assert_eq!(fake.policies().len(), 2);
    // An advisory pool: variables and CA, no policy.
    let advisory = provider
        .create(spec(
            "sb-5",
            "sb-5-a1",
            Some(egress("gw.sandgate.test", false)),
        ))
        .await
        .unwrap();
    assert!(fake.egress(&advisory.id).is_none());
    assert_eq!(
        fake.environment(&advisory.id).unwrap()["HTTPS_PROXY"],
        "https://sb-1:0123abcd@gw.sandgate.test:3128"
    );
    // An IPv6 gateway cannot be the only destination: unsupported, nothing created.
    let before = fake.devboxes().len();
    let err = provider
        .create(spec("sb-6", "sb-6-a1", Some(egress("2001:db8::1", true))))
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Unsupported);
    assert_eq!(fake.devboxes().len(), before);
    assert!(provider.check().await.unwrap().contains(&fake.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_files_lifecycle_list_and_delete() {
    let fake = FakeRunloop::start(FakeRunloopConfig::default()).await;
    let provider = adapter(&fake, &[("blueprint_name", "sandgate-base")]);
    let instance = provider
        .create(spec("sb-x", "sb-x-a1", None))
        .await
        .unwrap();
    let id = instance.id.clone();
    assert_eq!(
        fake.devbox(&id).unwrap().blueprint_name.as_deref(),
        Some("sandgate-base")
    );

    // Streamed output, exit code, quoting, env and cwd.
    let ran = run(
        &provider,
        &id,
        ExecSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "printf 'one '; printf \"$1\" >&2; echo \"$GREETING\"; pwd; exit 3".into(),
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
    let stdout = String::from_utf8(ran.stdout).unwrap();
    assert!(stdout.starts_with("one hi $there\n"), "{stdout:?}");
    assert!(stdout.trim_end().ends_with("/home/user"), "{stdout:?}");
    assert_eq!(String::from_utf8(ran.stderr).unwrap(), "it's two");
    assert_eq!(ran.exit.code, Some(3));
    let ok = run(&provider, &id, argv(&["true"])).await;
    assert_eq!(ok.exit.code, Some(0));
    // Larger output arrives whole and in order.
    let many = run(&provider, &id, argv(&["seq", "1", "20000"])).await;
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8(many.stdout).unwrap(), expected);
    // A timeout kills the command.
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

    // Files: text, binary, missing.
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
        .write_file(&id, "blob.bin", blob.clone())
        .await
        .unwrap();
    assert_eq!(fake.file(&id, "/home/user/blob.bin"), Some(blob.clone()));
    assert_eq!(provider.read_file(&id, "blob.bin").await.unwrap(), blob);
    let missing = provider.read_file(&id, "nope.txt").await.unwrap_err();
    assert_eq!(missing.kind, OpErrorKind::NotFound);
    let escape = provider
        .read_file(&id, "../../../../etc/passwd")
        .await
        .unwrap_err();
    assert_eq!(escape.kind, OpErrorKind::Invalid);

    // Capabilities, list_by_tag, get.
    let caps = provider.capabilities(&id).await.unwrap();
    assert!(caps.process_execute && caps.filesystem_write && caps.pause_resume);
    let other = provider
        .create(spec("sb-y", "sb-y-a1", None))
        .await
        .unwrap();
    let found = provider.list_by_tag("sb-x", None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, id);
    assert_eq!(found[0].tags.attempt_id, "sb-x-a1");
    assert!(provider
        .list_by_tag("sb-x", Some("other"))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(provider.get(&id).await.unwrap().unwrap().id, id);
    assert!(provider.get("dbx_missing").await.unwrap().is_none());

    // Pause and resume keep the disk.
    provider.lifecycle(&id, Lifecycle::Pause).await.unwrap();
    assert_eq!(fake.devbox(&id).unwrap().status, DevboxStatus::Suspended);
    let paused = provider.exec(&id, argv(&["true"])).await.unwrap_err();
    assert_eq!(paused.kind, OpErrorKind::Conflict);
    provider.lifecycle(&id, Lifecycle::Resume).await.unwrap();
    assert_eq!(fake.devbox(&id).unwrap().status, DevboxStatus::Running);
    assert_eq!(
        provider.read_file(&id, "notes.txt").await.unwrap(),
        b"text file\n"
    );
    let stop = provider.lifecycle(&id, Lifecycle::Stop).await.unwrap_err();
    assert_eq!(stop.kind, OpErrorKind::Unsupported);

    // A snapshot seeds a new devbox.
    let snap = provider.snapshot(&id).await.unwrap();
    let mut restore = spec("sb-z", "sb-z-a1", None);
    restore.snapshot = Some(snap.id.clone());
    let restored = provider.create(restore).await.unwrap();
    assert_eq!(
        provider.read_file(&restored.id, "notes.txt").await.unwrap(),
        b"text file\n"
    );
    provider.delete_snapshot(&snap.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();

    // Delete: shut down, twice is fine, absent is fine.
    for box_id in [&id, &other.id, &restored.id] {
        provider.delete(box_id).await.unwrap();
        provider.delete(box_id).await.unwrap();
    }
    provider.delete("dbx_never_existed").await.unwrap();
    assert_eq!(fake.live_count(), 0);
    assert!(provider.get(&id).await.unwrap().is_none());
    assert!(provider.list_by_tag("sb-x", None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_command() {
    let fake = FakeRunloop::start(FakeRunloopConfig::default()).await;
    let provider = adapter(&fake, &[]);
    let instance = provider
        .create(spec("sb-c", "sb-c-a1", None))
        .await
        .unwrap();
    let mut stream = provider
        .exec(&instance.id, argv(&["sh", "-c", "echo started; sleep 30"]))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.events.recv())
        .await
        .unwrap();
    assert!(matches!(first, Some(ExecEvent::Stdout(_))), "{first:?}");
    (stream.cancel)();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let done = fake
            .executions()
            .iter()
            .any(|e| e.command.contains("sleep 30") && e.exit_status.is_some());
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the command was not killed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakeRunloop::start(FakeRunloopConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        ..FakeRunloopConfig::default()
    })
    .await;
    let provider = adapter(&fake, &[]);
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "failed_before_running",
        "timeout_after_send",
        "ok",
    ]);
    // Runloop documents no capacity signal: a 503 is an outage (both advance).
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage);
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning);
    let failed_id = e.instance_id.clone().expect("the failed devbox is named");
    assert_eq!(
        fake.devbox(&failed_id).unwrap().status,
        DevboxStatus::Failure
    );
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    // The lost create is found by its tags.
    let found = provider.list_by_tag("sb-f", Some("a5")).await.unwrap();
    assert_eq!(found.len(), 1);
    // A failed devbox is not live.
    assert!(provider
        .list_by_tag("sb-f", Some("a4"))
        .await
        .unwrap()
        .is_empty());
    let ok = provider.create(spec("sb-f", "a6", None)).await.unwrap();
    assert_eq!(provider.list_by_tag("sb-f", None).await.unwrap().len(), 2);
    assert!(!ok.id.is_empty());

    // A wrong key: unbound account.
    let account = RunloopAccount::from_options(
        Some(&fake.url()),
        &BTreeMap::new(),
        Secret::new("wrong-key".to_string()),
    )
    .unwrap();
    let wrong = Runloop::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);
    assert!(!e.message.contains("wrong-key"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    // Invalid input: a snapshot that does not exist is unsupported on this account; a bad
    // blueprint combination cannot be sent (options refuse it).
    let mut missing = spec("sb-s", "s1", None);
    missing.snapshot = Some("snp_missing".into());
    let e = provider.create(missing).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported);
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let account = RunloopAccount::from_options(
        Some(&format!("http://127.0.0.1:{closed}")),
        &BTreeMap::new(),
        Secret::new("k".to_string()),
    )
    .unwrap();
    let down = Runloop::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_keeps_the_devbox_alive_with_keep_alives() {
    let fake = FakeRunloop::start(FakeRunloopConfig::default()).await;
    let provider = adapter(&fake, &[("keep_alive_secs", "1800")]);
    let instance = provider
        .create(spec("sb-keep", "sb-keep-a1", None))
        .await
        .unwrap();
    for remaining in [Some(Duration::from_secs(7200)), None] {
        provider
            .extend_lifetime(&instance.id, remaining)
            .await
            .unwrap();
    }
    let keep_alives: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/keep_alive"))
        .collect();
    assert_eq!(keep_alives.len(), 2, "{keep_alives:?}");
    assert!(keep_alives
        .iter()
        .all(|r| r.devbox_id.as_deref() == Some(instance.id.as_str())));
    provider.delete(&instance.id).await.unwrap();
}
