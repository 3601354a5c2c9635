//! The fake Prime Intellect (`tests/it/common/fakes/prime.rs`) proven with the official
//! `prime-sandboxes` Python SDK, its fault script exercised over a real socket, the Prime
//! adapter (`sandgate::providers::prime`) driven through the `Provider` trait against it,
//! and a whole gateway (`sandgate serve`) placing sandboxes on a Prime pool.
//!
//! `official_python_sdk_accepts_the_fake` runs `tests/sdk/prime_contract.py` with the
//! interpreter of `common::sdk::python()` and `prime-sandboxes` from its own directory
//! (`SANDGATE_PRIME_SDK_DIR`, default `/opt/sandgate-sdk-venv/prime-sandboxes-0.5.1`, which
//! `.ci/run` installs with `pip --target`: the SDK pins `connectrpc<0.12` while `e2b` needs
//! `>=0.12.1`, so they cannot share the venv). Without the SDK it FAILS, never skips.

use crate::common;
use crate::common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::prime::{CreateOutcome, FakePrime, FakePrimeConfig};
use sandgate::credentials::Secret;
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason};
use sandgate::providers::prime::{Prime, PrimeAccount, CA_PATH};
use sandgate::providers::{CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/requirements-prime.txt`).
const PRIME_SDK_VERSION: &str = "0.5.1";
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakePrimeCA\n-----END CERTIFICATE-----\n";

fn http() -> reqwest::Client {
    common::init();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn sdk_dir() -> PathBuf {
    std::env::var_os("SANDGATE_PRIME_SDK_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/opt/sandgate-sdk-venv/prime-sandboxes-{PRIME_SDK_VERSION}"
            ))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_accepts_the_fake() {
    let python = common::sdk::python();
    let dir = sdk_dir();
    let probe = std::process::Command::new(&python)
        .args(["-c", "import prime_sandboxes"])
        .env("PYTHONPATH", &dir)
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        other => panic!(
            "the Prime contract test needs the official SDK ({} with PYTHONPATH={}: {other:?}): \
             .ci/run installs prime-sandboxes=={PRIME_SDK_VERSION} there (pip --target)",
            python.display(),
            dir.display()
        ),
    }

    let fake = FakePrime::start(FakePrimeConfig::default()).await;
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/prime_contract.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .env("PYTHONPATH", &dir)
        .env("HOME", home.path())
        .env("PRIME_API_KEY", fake.api_key())
        .env("PRIME_API_BASE_URL", fake.url())
        .env("PRIME_SDK_EXPECTED_VERSION", PRIME_SDK_VERSION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("PRIME_TEAM_ID")
        .env_remove("PRIME_CONTEXT")
        .env_remove("PRIME_BASE_URL")
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
    assert_eq!(report["sdk"], PRIME_SDK_VERSION);

    // What the fake recorded of the SDK's requests.
    let id = report["sandbox"].as_str().unwrap();
    let sandbox = fake
        .sandbox(id)
        .expect("the SDK's sandbox is in the inventory");
    assert_eq!(sandbox.status, "TERMINATED");
    assert_eq!(sandbox.idempotency_key.as_deref(), report["key"].as_str());
    assert_eq!(sandbox.request["vm"], true, "the SDK sends vm: true");
    assert!(sandbox.labels.contains(&"suite=prime-contract".to_string()));
    assert_eq!(
        sandbox.network_allowlist,
        Some(vec![
            "192.0.2.10".to_string(),
            "gw.contract.test".to_string()
        ])
    );
    assert_eq!(
        fake.file(id, "/root/data/blob.bin"),
        Some((0u8..=255).collect::<Vec<u8>>())
    );
    assert_eq!(
        fake.sandboxes().len(),
        2,
        "one idempotency key, one sandbox (and a restore)"
    );
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::Ok,
            CreateOutcome::Replayed,
            CreateOutcome::Ok
        ]
    );
    let restored = fake.sandbox(report["restored"].as_str().unwrap()).unwrap();
    assert_eq!(
        restored.checkpoint_id.as_deref(),
        report["checkpoint"].as_str()
    );
    assert!(
        fake.checkpoints().is_empty(),
        "the SDK deleted its checkpoint"
    );
    let requests = fake.requests();
    for path in [
        "/api/v1/sandbox/status:batchGet",
        "/command_session.CommandSession/Start",
        "/upload",
        "/download",
        "/read-file",
        "/egress-policy",
    ] {
        assert!(
            requests.iter().any(|r| r.path.ends_with(path)),
            "the SDK never called {path}"
        );
    }
    assert!(requests
        .iter()
        .filter(|r| r.path.ends_with("/Start"))
        .all(|r| r.gateway && r.status == Some(200)));
    let commands = fake.commands();
    assert!(
        commands.iter().all(|c| c.argv[0] == "/bin/bash"),
        "the SDK runs bash -c"
    );
    println!("{stdout}");
}

// ------------------------------------------------------------------------- raw protocol

async fn post(
    fake: &FakePrime,
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
async fn the_fault_script_egress_rules_and_auth() {
    let fake = FakePrime::start(FakePrimeConfig {
        retry_after_secs: 7,
        ..FakePrimeConfig::default()
    })
    .await;
    let response = http()
        .get(format!("{}/api/v1/sandbox", fake.url()))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert!(response.json::<Value>().await.unwrap()["detail"].is_string());

    let body = json!({"name": "n", "docker_image": "python:3.11-slim"});
    fake.script(["capacity", "rate_limit", "outage", "failed_before_running"]);
    let (status, said, _) = post(&fake, "/api/v1/sandbox", body.clone()).await;
    assert_eq!(status, 503);
    assert!(said["detail"].as_str().unwrap().contains("capacity"));
    let (status, _, headers) = post(&fake, "/api/v1/sandbox", body.clone()).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "7");
    let (status, _, _) = post(&fake, "/api/v1/sandbox", body.clone()).await;
    assert_eq!(status, 502);
    let (status, failing, _) = post(&fake, "/api/v1/sandbox", body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(failing["status"], "PENDING");
    assert!(failing["gatewayAuth"]["token"].is_string());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let id = failing["id"].as_str().unwrap();
    assert_eq!(fake.sandbox(id).unwrap().status, "ERROR");

    // Prime's egress contract: one list, IPv4/CIDR/hostnames, no IPv6 or ports.
    for bad in [
        json!({"network_allowlist": ["a.test"], "network_denylist": ["b.test"]}),
        json!({"network_allowlist": ["2001:db8::1"]}),
        json!({"network_allowlist": ["203.0.113.7:3128"]}),
        json!({"network_allowlist": ["https://a.test"]}),
        json!({"docker_image": null, "checkpoint_id": null}),
    ] {
        let mut b = body.clone();
        b.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let (status, said, _) = post(&fake, "/api/v1/sandbox", b).await;
        assert_eq!(status, 422, "{bad}: {said}");
    }
    let mut ok = body.clone();
    ok["network_allowlist"] = json!(["203.0.113.7", "10.0.0.0/8", "*.a.test"]);
    let (status, _, _) = post(&fake, "/api/v1/sandbox", ok).await;
    assert_eq!(status, 200);
    assert_eq!(
        fake.create_log().last(),
        Some(&CreateOutcome::Ok),
        "{:?}",
        fake.create_log()
    );
}

#[tokio::test]
async fn a_create_answered_never_still_appears() {
    let fake = FakePrime::start(FakePrimeConfig {
        hang: Duration::from_millis(200),
        appear_after: Duration::from_millis(500),
        ..FakePrimeConfig::default()
    })
    .await;
    fake.script(["timeout_after_send"]);
    let result = http()
        .post(format!("{}/api/v1/sandbox", fake.url()))
        .bearer_auth(fake.api_key())
        .json(&json!({"name": "n", "docker_image": "i", "labels": ["sandgate_sandbox=sb-lost"]}))
        .send()
        .await;
    assert!(result.is_err(), "the connection is dropped: {result:?}");
    assert_eq!(fake.live_with_label("sandgate_sandbox", "sb-lost").len(), 1);
    let list = |fake: &FakePrime| {
        let url = format!(
            "{}/api/v1/sandbox?labels=sandgate_sandbox%3Dsb-lost",
            fake.url()
        );
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
            body["total"].as_u64().unwrap()
        }
    };
    assert_eq!(list(&fake).await, 0, "not listed at once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(list(&fake).await, 1, "listed after appear_after");
}

// ------------------------------------------------------------------------------ adapter

fn adapter(fake: &FakePrime, options: &[(&str, &str)]) -> Prime {
    common::init();
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let account =
        PrimeAccount::from_options(Some(&fake.url()), &options, Secret::new(fake.api_key()))
            .expect("account options");
    Prime::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn egress(host: &str, lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: format!("http://sb-1:0123abcd@{host}:3128"),
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
        pool: "prime-1".into(),
        account: "prime".into(),
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

async fn run(provider: &Prime, id: &str, spec: ExecSpec) -> Ran {
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
async fn a_locked_create_runs_with_the_allowlist_env_and_ca() {
    let fake = FakePrime::start(FakePrimeConfig::default()).await;
    let provider = adapter(&fake, &[("cpu_cores", "2"), ("timeout_minutes", "120")]);
    assert_eq!(provider.kind(), "prime-intellect");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    let instance = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress("203.0.113.7", true))))
        .await
        .expect("the create succeeds");
    let sandbox = fake
        .sandbox(&instance.id)
        .expect("the sandbox is at the fake");
    assert_eq!(sandbox.status, "RUNNING");
    assert_eq!(
        sandbox.labels,
        vec![
            "sandgate_sandbox=sb-1".to_string(),
            "sandgate_attempt=sb-1-a1".to_string()
        ]
    );
    assert_eq!(sandbox.idempotency_key.as_deref(), Some("sb-1-a1"));
    assert_eq!(sandbox.request["vm"], true);
    assert_eq!(sandbox.request["cpu_cores"], 2.0);
    assert_eq!(sandbox.request["timeout_minutes"], 120);
    assert_eq!(sandbox.docker_image.as_deref(), Some("python:3.11-slim"));

    // The lock-down: the gateway is the only allowed destination, exactly as shown.
    assert_eq!(
        fake.egress(&instance.id).unwrap(),
        (Some(vec!["203.0.113.7".to_string()]), None)
    );
    let shown = provider.lockdown(&egress("203.0.113.7", true)).unwrap();
    assert_eq!(shown, json!({"network_allowlist": ["203.0.113.7"]}));
    assert!(provider.lockdown(&egress("203.0.113.7", false)).is_none());

    // The proxy and CA variables, the placeholder credential, and no secret.
    let env = fake.environment(&instance.id).unwrap();
    for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(env[var], "http://sb-1:0123abcd@203.0.113.7:3128", "{var}");
    }
    assert_eq!(env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(env["SANDGATE_CRED_GH"], "placeholder-gh");
    assert!(env.values().all(|v| !v.contains(fake.api_key())));
    // The CA in the sandbox, and nothing else written.
    assert_eq!(
        fake.file(&instance.id, CA_PATH).as_deref(),
        Some(CA_PEM.as_bytes())
    );
    let files = fake.files(&instance.id);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(!String::from_utf8_lossy(&files[0].1).contains(fake.api_key()));
    // The gateway was called with the sandbox's token, never the key.
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.gateway && r.path.ends_with("/upload")));

    // An advisory pool: variables and CA, no allowlist.
    let advisory = provider
        .create(spec("sb-2", "sb-2-a1", Some(egress("203.0.113.7", false))))
        .await
        .unwrap();
    assert_eq!(fake.egress(&advisory.id).unwrap(), (None, None));
    assert_eq!(
        fake.environment(&advisory.id).unwrap()["HTTPS_PROXY"],
        "http://sb-1:0123abcd@203.0.113.7:3128"
    );
    // A gateway Prime cannot name alone: unsupported, nothing created.
    let before = fake.sandboxes().len();
    for host in ["2001:db8::1", "gw.sandgate.test"] {
        let err = provider
            .create(spec("sb-6", "sb-6-a1", Some(egress(host, true))))
            .await
            .unwrap_err();
        assert_eq!(err.class, ErrorClass::Unsupported, "{host}: {err}");
    }
    assert_eq!(fake.sandboxes().len(), before);
    assert!(provider.check().await.unwrap().contains(&fake.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_files_list_and_delete() {
    let fake = FakePrime::start(FakePrimeConfig::default()).await;
    let provider = adapter(&fake, &[("docker_image", "ubuntu:24.04")]);
    let instance = provider
        .create(spec("sb-x", "sb-x-a1", None))
        .await
        .unwrap();
    let id = instance.id.clone();
    assert_eq!(
        fake.sandbox(&id).unwrap().docker_image.as_deref(),
        Some("ubuntu:24.04")
    );

    // Output in order, exit code, argv as given (no shell), env and cwd.
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
            cwd: Some("/root".into()),
            timeout: None,
            user: None,
        },
    )
    .await;
    let stdout = String::from_utf8(ran.stdout).unwrap();
    assert!(stdout.starts_with("one hi $there\n"), "{stdout:?}");
    assert!(stdout.trim_end().ends_with("/root"), "{stdout:?}");
    assert_eq!(String::from_utf8(ran.stderr).unwrap(), "it's two");
    assert_eq!(ran.exit.code, Some(3));
    assert_eq!(
        run(&provider, &id, argv(&["true"])).await.exit.code,
        Some(0)
    );
    let many = run(&provider, &id, argv(&["seq", "1", "20000"])).await;
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8(many.stdout).unwrap(), expected);
    let ordered = run(
        &provider,
        &id,
        argv(&["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.05; done"]),
    )
    .await;
    assert_eq!(ordered.stdout, b"1\n2\n3\n");
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
    let empty = provider.exec(&id, argv(&[])).await.unwrap_err();
    assert_eq!(empty.kind, OpErrorKind::Invalid);

    // Files: text, binary in a new directory, missing, outside.
    provider
        .write_file(&id, "/root/notes.txt", b"text file\n".to_vec())
        .await
        .unwrap();
    assert_eq!(
        provider.read_file(&id, "/root/notes.txt").await.unwrap(),
        b"text file\n"
    );
    let blob: Vec<u8> = (0u8..=255).rev().collect();
    provider
        .write_file(&id, "/root/work/blob.bin", blob.clone())
        .await
        .unwrap();
    assert_eq!(fake.file(&id, "/root/work/blob.bin"), Some(blob.clone()));
    assert_eq!(
        provider.read_file(&id, "work/blob.bin").await.unwrap(),
        blob
    );
    let seen = run(&provider, &id, argv(&["cat", "/root/notes.txt"])).await;
    assert_eq!(seen.stdout, b"text file\n");
    let missing = provider.read_file(&id, "nope.txt").await.unwrap_err();
    assert_eq!(missing.kind, OpErrorKind::NotFound);
    let escape = provider
        .read_file(&id, "../../../../etc/passwd")
        .await
        .unwrap_err();
    assert_eq!(escape.kind, OpErrorKind::Invalid, "{escape}");

    // A checkpoint seeds a new sandbox (checkpoint_id, no image or disk), then goes.
    let snap = provider.snapshot(&id).await.unwrap();
    assert!(snap.size_bytes > 0, "{snap:?}");
    let mut restore = spec("sb-r", "sb-r-a1", None);
    restore.snapshot = Some(snap.id.clone());
    let restored = provider.create(restore).await.unwrap();
    let sandbox = fake.sandbox(&restored.id).unwrap();
    assert_eq!(sandbox.checkpoint_id.as_deref(), Some(snap.id.as_str()));
    assert!(sandbox.request["docker_image"].is_null() && sandbox.request["disk_size_gb"].is_null());
    assert_eq!(
        provider.read_file(&restored.id, "notes.txt").await.unwrap(),
        b"text file\n"
    );
    provider.delete(&restored.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();
    assert!(fake.checkpoints().is_empty());

    // Capabilities, list_by_tag, get.
    let caps = provider.capabilities(&id).await.unwrap();
    assert!(caps.process_execute && caps.process_ordered_output && caps.process_cancel);
    assert!(caps.filesystem_read && caps.filesystem_write && !caps.pause_resume);
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
    assert!(provider.get("missing").await.unwrap().is_none());

    // Delete: twice is fine, absent is fine; a deleted sandbox is gone to sandgate.
    for box_id in [&id, &other.id] {
        provider.delete(box_id).await.unwrap();
        provider.delete(box_id).await.unwrap();
    }
    provider.delete("never-existed").await.unwrap();
    assert_eq!(fake.live_count(), 0);
    assert!(provider.get(&id).await.unwrap().is_none());
    assert!(provider.list_by_tag("sb-x", None).await.unwrap().is_empty());
    let gone = provider.exec(&id, argv(&["true"])).await.unwrap_err();
    assert_ne!(gone.kind, OpErrorKind::Invalid, "{gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_command() {
    let fake = FakePrime::start(FakePrimeConfig::default()).await;
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
            .commands()
            .iter()
            .any(|c| c.argv.iter().any(|a| a.contains("sleep 30")) && c.exit_code.is_some());
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the command was not killed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.path.ends_with("/SendSignal")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakePrime::start(FakePrimeConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        ..FakePrimeConfig::default()
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
    // Prime documents no capacity signal: its 503 is an outage (both advance).
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert!(e.message.contains("capacity"), "the detail is kept: {e}");
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage);
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning, "{e}");
    let failed_id = e.instance_id.clone().expect("the failed sandbox is named");
    assert_eq!(fake.sandbox(&failed_id).unwrap().status, "ERROR");
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost create is found by its labels; the failed one is not live.
    let found = provider.list_by_tag("sb-f", Some("a5")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert!(provider
        .list_by_tag("sb-f", Some("a4"))
        .await
        .unwrap()
        .is_empty());
    // Re-sending the lost create is the same sandbox (idempotency_key).
    let again = provider.create(spec("sb-f", "a5", None)).await.unwrap();
    assert_eq!(again.id, found[0].id);
    assert_eq!(fake.live_with_label("sandgate_attempt", "a5").len(), 1);
    let ok = provider.create(spec("sb-f", "a6", None)).await.unwrap();
    assert_eq!(provider.list_by_tag("sb-f", None).await.unwrap().len(), 2);
    assert!(!ok.id.is_empty());

    // A wrong key: unbound account, the key never echoed.
    let account = PrimeAccount::from_options(
        Some(&fake.url()),
        &BTreeMap::new(),
        Secret::new("wrong-key".to_string()),
    )
    .unwrap();
    let wrong = Prime::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);
    assert!(!e.message.contains("wrong-key"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    // A checkpoint that is not on the account: unsupported, nothing made.
    let mut restore = spec("sb-s", "s1", None);
    restore.snapshot = Some("ckpt-missing".into());
    let live = fake.live_count();
    let e = provider.create(restore).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert_eq!(fake.live_count(), live);
    // A template Prime has not: unsupported before any call.
    let mut template = spec("sb-t", "t1", None);
    template.request = Arc::new(sandgate_router::Request {
        source: Some(sandgate_router::Source::Template("tpl".into())),
        ..sandgate_router::Request::default()
    });
    let before = fake.create_log().len();
    let e = provider.create(template).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert_eq!(fake.create_log().len(), before);
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let account = PrimeAccount::from_options(
        Some(&format!("http://127.0.0.1:{closed}")),
        &BTreeMap::new(),
        Secret::new("k".to_string()),
    )
    .unwrap();
    let down = Prime::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
}

// ------------------------------------------------------------------- through the gateway

const API_TOKEN: &str = "api-token-ws-a-0123456789";

struct Env {
    gw: Gateway,
    prime: FakePrime,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

/// One pool `p-prime` on the fake, `[proxy] public_url` on 127.0.0.1.
async fn start(create: &str, config: FakePrimeConfig) -> Env {
    init();
    let prime = FakePrime::start(config).await;
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("prime.key");
    std::fs::write(&key, prime.api_key()).unwrap();
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
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

[[providers]]
name = "prime-intellect"

[[accounts]]
name = "prime-main"
provider = "prime-intellect"
base_url = "{url}"
api_key_file = {key:?}

[[pools]]
name = "p-prime"
provider = "prime-intellect"
account = "prime-main"
"#,
            url = prime.url(),
            key = key.display().to_string(),
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        prime,
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

    /// Creates and waits (up to 20 s) for the create to leave pending/provisioning/
    /// reconciling; the view, whatever its state.
    async fn settled(&self, body: Value) -> Value {
        let (status, created) = self.post("/v1/sandboxes", body).await;
        assert!(
            status == 201 || status == 202 || status == 503,
            "{status}: {created:#}"
        );
        let id = match created["id"].as_str() {
            Some(id) => id.to_string(),
            None => created["error"]["details"]["sandbox_id"]
                .as_str()
                .unwrap()
                .to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view = self.get(&format!("/v1/sandboxes/{id}")).await;
            let placing = ["pending", "provisioning", "reconciling"]
                .contains(&view["state"].as_str().unwrap_or_default());
            if !placing || Instant::now() > deadline {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs argv in the sandbox: (stdout, exit code).
    async fn exec(&self, id: &str, argv: &[&str]) -> (String, i64) {
        let response = self
            .http
            .post(self.gw.api(&format!("/v1/sandboxes/{id}/exec")))
            .bearer_auth(API_TOKEN)
            .json(&json!({"argv": argv, "timeout_ms": 30000}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        let (mut out, mut code) = (String::new(), -1);
        for line in text.lines() {
            let e: Value = serde_json::from_str(line).unwrap();
            match e["type"].as_str() {
                Some("stdout") => out.push_str(e["text"].as_str().unwrap_or_default()),
                Some("exit") => code = e["code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, code)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restricted_create_on_prime_is_locked_to_the_gateway() {
    let env = start(
        "",
        FakePrimeConfig {
            boot_delay: Duration::from_millis(50),
            ..FakePrimeConfig::default()
        },
    )
    .await;
    let view = env
        .settled(json!({"network": {"allow_domains": ["api.a.test"]}}))
        .await;
    assert_eq!(view["state"], "running", "{view:#}");
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "p-prime", "{view:#}");
    assert_eq!(view["placement"]["provider"], "prime-intellect", "{view:#}");
    assert_eq!(view["egress"]["enforcement"], "gateway", "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = env.prime.sandbox(instance).unwrap();
    assert!(sandbox.labels.contains(&format!("sandgate_sandbox={id}")));
    // Prime's own field name, the gateway's address alone, as sent and as shown.
    assert_eq!(
        sandbox.network_allowlist,
        Some(vec!["127.0.0.1".to_string()])
    );
    assert_eq!(sandbox.network_denylist, None);
    assert_eq!(
        view["placement"]["lockdown"],
        json!({"network_allowlist": ["127.0.0.1"]}),
        "{view:#}"
    );
    let vars = &sandbox.environment_vars;
    assert!(vars["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    assert!(vars["HTTPS_PROXY"].ends_with("@127.0.0.1:3999"));
    assert_eq!(vars["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(
        env.prime.file(instance, CA_PATH).unwrap(),
        env.gw.sandgate_ca_pem
    );
    // No secret in the sandbox: not the Prime key, not the API token.
    for (name, value) in vars {
        assert!(!value.contains(env.prime.api_key()), "{name}");
        assert!(!value.contains(API_TOKEN), "{name}");
    }
    for (path, bytes) in env.prime.files(instance) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(env.prime.api_key()) && !text.contains(API_TOKEN),
            "{path}"
        );
    }

    // Commands and files through sandgate's API.
    let (out, code) = env
        .exec(
            id,
            &["sh", "-c", "test -s \"$SSL_CERT_FILE\" && echo ca; exit 4"],
        )
        .await;
    assert_eq!((out.as_str(), code), ("ca\n", 4));
    let r = env
        .http
        .put(env.gw.api(&format!(
            "/v1/sandboxes/{id}/files/content?path=/root/in.txt"
        )))
        .bearer_auth(API_TOKEN)
        .body("through sandgate")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert_eq!(
        env.prime.file(instance, "/root/in.txt").unwrap(),
        b"through sandgate"
    );
    let (out, _) = env.exec(id, &["cat", "/root/in.txt"]).await;
    assert_eq!(out, "through sandgate");
    // Delete through sandgate deletes at Prime.
    let r = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.prime.live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.prime.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_after_send_on_prime_is_reconciled_by_tag_with_no_duplicate() {
    let env = start(
        "",
        FakePrimeConfig {
            boot_delay: Duration::from_millis(50),
            hang: Duration::from_millis(300),
            appear_after: Duration::from_millis(200),
            ..FakePrimeConfig::default()
        },
    )
    .await;
    env.prime.script(["timeout_after_send"]);
    let view = env.settled(json!({"labels": {"t": "lost"}})).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "p-prime", "{view:#}");
    let live = env.prime.live_with_label("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "no duplicate: {:?}", env.prime.live());
    assert_eq!(env.prime.live_count(), 1, "{:?}", env.prime.live());
    assert_eq!(view["placement"]["instance_id"], live[0].id.as_str());
    // The lost create was the only one made (a re-send would have been the same sandbox).
    let made: Vec<_> = env
        .prime
        .create_log()
        .into_iter()
        .filter(|o| !matches!(o, CreateOutcome::Replayed | CreateOutcome::Rejected))
        .collect();
    assert_eq!(
        made,
        vec![CreateOutcome::TimeoutAfterSend],
        "{:?}",
        env.prime.create_log()
    );
    // Adopted, then finished like a create: the CA is in place.
    let vars = &live[0].environment_vars;
    let ca = env.prime.file(&live[0].id, &vars["SSL_CERT_FILE"]);
    assert_eq!(ca.as_deref(), Some(env.gw.sandgate_ca_pem.as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failure_rows_on_the_prime_pool_are_recorded_as_documented() {
    let env = start(
        "provisioning_window_ms = 200\nretry_backoff_ms = 20\n",
        FakePrimeConfig {
            boot_delay: Duration::from_millis(50),
            ..FakePrimeConfig::default()
        },
    )
    .await;
    for (script, class) in [
        ("capacity", "outage"),
        ("outage", "outage"),
        ("failed_before_running", "failed_before_running"),
    ] {
        env.prime.script([script]);
        let view = env.settled(json!({})).await;
        assert_ne!(view["state"], "running", "{script}: {view:#}");
        let first = &view["attempts"][0];
        assert_eq!(first["pool"], "p-prime", "{view:#}");
        assert_eq!(first["error_class"], class, "{script}: {view:#}");
    }
    assert_eq!(env.prime.live_count(), 0, "{:?}", env.prime.live());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_works_for_prime() {
    let fake = FakePrime::start(FakePrimeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.key");
    let bad = dir.path().join("bad.key");
    std::fs::write(&good, fake.api_key()).unwrap();
    std::fs::write(&bad, "pit_wrong_key_0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[providers]]
name = "prime-intellect"
[[accounts]]
name = "good"
provider = "prime-intellect"
base_url = "{url}"
api_key_file = {good:?}
[[accounts]]
name = "bad"
provider = "prime-intellect"
base_url = "{url}"
api_key_file = {bad:?}
[[pools]]
name = "good"
provider = "prime-intellect"
account = "good"
[[pools]]
name = "bad"
provider = "prime-intellect"
account = "bad"
"#,
            url = fake.url(),
            good = good.display().to_string(),
            bad = bad.display().to_string(),
        ),
    )
    .unwrap();
    let run = |account: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
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
    assert!(
        stdout.contains("ok: account good (prime-intellect)"),
        "{stdout}"
    );
    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unbound_account") && stderr.contains("401"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("pit_wrong_key"),
        "the key is never printed: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_beyond_primes_fixed_clock_is_reported() {
    let fake = FakePrime::start(FakePrimeConfig::default()).await;
    let provider = adapter(&fake, &[("timeout_minutes", "30")]);
    let instance = provider
        .create(spec("sb-l", "sb-l-a1", None))
        .await
        .unwrap();
    assert_eq!(
        fake.sandbox(&instance.id).unwrap().request["timeout_minutes"],
        30
    );
    for fits in [None, Some(Duration::from_secs(600))] {
        provider.extend_lifetime(&instance.id, fits).await.unwrap();
    }
    let e = provider
        .extend_lifetime(&instance.id, Some(Duration::from_secs(3600)))
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("timeout_minutes"), "{e}");
}
