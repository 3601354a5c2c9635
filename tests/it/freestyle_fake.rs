//! The fake Freestyle (`tests/it/common/fakes/freestyle.rs`) proven with the official npm SDK
//! `freestyle-sandboxes`, and the Freestyle adapter (`sandgate::providers::freestyle`) driven
//! through the `Provider` trait against it, then placed on by a whole gateway.
//!
//! `official_js_sdk_accepts_the_fake` runs `node tests/sdk/freestyle_contract.mjs` with the SDK
//! installed in `SANDGATE_SDK_NODE` (default `/opt/sandgate-sdk-node`, where `.ci/run` runs
//! `npm ci` with `tests/sdk/package.json`). Without node or the pinned SDK it fails: a fake is
//! evidence only once the provider's own client accepts it.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::freestyle::{CreateOutcome, FakeFreestyle, FakeFreestyleConfig};
use crate::common::*;
use sandgate::credentials::Secret;
use sandgate::providers::freestyle::{
    Freestyle, FreestyleAccount, CAPABILITIES, CA_PATH, ENV_PATH, TAGS_PATH,
};
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitReason, Lifecycle};
use sandgate::providers::{CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/package.json`).
const FREESTYLE_SDK_VERSION: &str = "0.1.46";
const DEFAULT_SDK_NODE: &str = "/opt/sandgate-sdk-node";
const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBfakeFreestyleCA\n-----END CERTIFICATE-----\n";

fn sdk_dir() -> PathBuf {
    std::env::var_os("SANDGATE_SDK_NODE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SDK_NODE))
}

/// `Some(reason)` when node or the pinned SDK is missing.
fn sdk_missing(dir: &Path) -> Option<String> {
    match std::process::Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("node --version failed: {}", out.status)),
        Err(e) => return Some(format!("node does not run: {e}")),
    }
    let package = dir.join("node_modules/freestyle-sandboxes/package.json");
    match std::fs::read_to_string(&package) {
        Ok(text) => {
            let version = serde_json::from_str::<Value>(&text).ok()?["version"].clone();
            (version != FREESTYLE_SDK_VERSION).then(|| {
                format!(
                    "{} is version {version}, not {FREESTYLE_SDK_VERSION}",
                    package.display()
                )
            })
        }
        Err(e) => Some(format!("{}: {e}", package.display())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freestyle_official_js_sdk_accepts_the_fake() {
    let dir = sdk_dir();
    if let Some(reason) = sdk_missing(&dir) {
        panic!(
            "the Freestyle contract test needs node and the official SDK ({reason}): \
             npm ci --prefix {DEFAULT_SDK_NODE} with tests/sdk/package.json (.ci/run does), \
             or set SANDGATE_SDK_NODE"
        );
    }
    common::init();
    let fake = FakeFreestyle::start(FakeFreestyleConfig::default()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/freestyle_contract.mjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .env("FREESTYLE_API_URL", fake.url())
        .env("FREESTYLE_API_KEY", fake.api_key())
        .env("SANDGATE_SDK_NODE", &dir)
        .env("FREESTYLE_SDK_EXPECTED_VERSION", FREESTYLE_SDK_VERSION)
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
    assert_eq!(report["sdk"], FREESTYLE_SDK_VERSION);

    // The fake's inventory agrees with what the SDK did.
    let vm = fake
        .vm(report["vm"].as_str().unwrap())
        .expect("the SDK's VM");
    assert!(vm.deleted);
    assert_eq!(vm.body["persistence"], json!({"type": "sticky"}));
    assert_eq!(vm.body["ports"], json!([]));
    assert_eq!(vm.body["idleTimeoutSeconds"], 600);
    let tags: Value = serde_json::from_str(
        vm.body["additionalFiles"][TAGS_PATH]["content"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        tags["sandgate_attempt"],
        format!("sb-contract-{}", report["run"].as_str().unwrap())
    );
    let restored = fake.vm(report["restored"].as_str().unwrap()).unwrap();
    assert_eq!(restored.snapshot_id.as_deref(), report["snapshot"].as_str());
    assert!(fake.vm(report["fork"].as_str().unwrap()).unwrap().deleted);
    assert_eq!(fake.live_count(), 0, "everything was deleted");
    // The SDK's commands really ran, with the create's environment file.
    let execs = fake.execs();
    assert!(execs
        .iter()
        .any(|e| e.command.contains("CONTRACT_ENV") && e.status_code == Some(0)));
    assert!(execs.iter().any(|e| e.status_code == Some(3)));
    let calls: Vec<String> = report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    for want in [
        "POST /v1/vms",
        "GET /v1/vms",
        "/exec-await",
        "/suspend",
        "/start",
        "/stop",
        "/snapshot",
        "/fork",
        "PUT /v1/vms/",
        "/files/%2Froot%2Fhello.txt",
        "DELETE /v1/vms/snapshots/",
    ] {
        assert!(calls.iter().any(|c| c.contains(want)), "{want}: {calls:?}");
    }
    assert!(fake.create_log().contains(&CreateOutcome::Rejected));
}

// ------------------------------------------------------------------------------ adapter

fn adapter(fake: &FakeFreestyle, options: &[(&str, &str)]) -> Freestyle {
    common::init();
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let account =
        FreestyleAccount::from_options(Some(&fake.url()), &options, Secret::new(fake.api_key()))
            .expect("account options");
    Freestyle::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn egress(lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: "https://sb-1:0123abcd@gw.example:3128".into(),
        gateway_host: "gw.example".into(),
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
        pool: "freestyle-1".into(),
        account: "freestyle".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

/// Runs an exec to its end: (stdout, stderr, exit code, reason).
async fn run(
    provider: &Freestyle,
    id: &str,
    spec: ExecSpec,
) -> (String, String, Option<i32>, ExitReason) {
    let mut stream = provider.exec(id, spec).await.expect("exec starts");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.events.recv())
            .await
            .expect("an exec event within 30 s");
        match event {
            Some(ExecEvent::Stdout(b)) => out.extend_from_slice(&b),
            Some(ExecEvent::Stderr(b)) => err.extend_from_slice(&b),
            Some(ExecEvent::Exit(info)) => {
                assert!(stream.events.recv().await.is_none(), "nothing after Exit");
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    String::from_utf8_lossy(&err).into_owned(),
                    info.code,
                    info.reason,
                );
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
async fn freestyle_an_advisory_create_carries_tags_env_and_ca_and_locks_nothing() {
    let fake = FakeFreestyle::start(FakeFreestyleConfig::default()).await;
    let provider = adapter(&fake, &[("idle_timeout_secs", "900")]);
    let instance = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress(false))))
        .await
        .unwrap();
    let vm = fake.vm(&instance.id).unwrap();
    assert_eq!(vm.state, "running");
    assert_eq!(vm.body["persistence"], json!({"type": "sticky"}));
    assert_eq!(vm.body["ports"], json!([]));
    assert_eq!(vm.body["idleTimeoutSeconds"], 900);
    assert_eq!(vm.body["waitForReadySignal"], true);
    // Nothing native restricts egress: Freestyle has no such field; nothing is shown.
    assert!(provider.lockdown(&egress(true)).is_none());
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    assert_eq!(fake.file(&instance.id, CA_PATH).unwrap(), CA_PEM.as_bytes());
    let tags: Value = serde_json::from_slice(&fake.file(&instance.id, TAGS_PATH).unwrap()).unwrap();
    assert_eq!(
        tags,
        json!({"sandgate_sandbox": "sb-1", "sandgate_attempt": "sb-1-a1"})
    );
    // The proxy and CA variables reach commands; the credential is a placeholder only.
    let env = String::from_utf8(fake.file(&instance.id, ENV_PATH).unwrap()).unwrap();
    assert!(
        env.contains("export SANDGATE_CRED_GH=placeholder-gh"),
        "{env}"
    );
    let (out, _, code, _) = run(
        &provider,
        &instance.id,
        argv(&[
            "sh",
            "-c",
            "echo $HTTPS_PROXY; echo $SSL_CERT_FILE; echo $SANDGATE_CRED_GH",
        ]),
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        format!("https://sb-1:0123abcd@gw.example:3128\n{CA_PATH}\nplaceholder-gh\n")
    );
    assert!(!env.contains(fake.api_key()), "no provider key in the VM");
    // Asked to lock down, the create is refused and nothing is made.
    let before = fake.vms().len();
    let e = provider
        .create(spec("sb-1", "sb-1-a2", Some(egress(true))))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported);
    assert!(e.message.contains("advisory"), "{e}");
    assert!(!e.maybe_created);
    assert_eq!(fake.vms().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freestyle_exec_files_lifecycle_snapshot_list_and_delete() {
    let fake = FakeFreestyle::start(FakeFreestyleConfig::default()).await;
    let provider = adapter(&fake, &[]);
    let a = provider
        .create(spec("sb-2", "sb-2-a1", None))
        .await
        .unwrap();
    let got = provider.get(&a.id).await.unwrap().unwrap();
    assert_eq!(got.tags.attempt_id, "sb-2-a1");

    // Exec: argv, env, cwd, exit codes, a timeout.
    let (out, err, code, _) = run(
        &provider,
        &a.id,
        ExecSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo \"$GREETING\"; pwd; echo e >&2; exit 7".into(),
            ],
            env: BTreeMap::from([("GREETING".to_string(), "it's here".to_string())]),
            cwd: Some("/root".into()),
            timeout: None,
            user: None,
        },
    )
    .await;
    assert_eq!(code, Some(7));
    assert_eq!(out.lines().next(), Some("it's here"));
    assert!(out.lines().nth(1).unwrap().ends_with("/root"), "{out}");
    assert_eq!(err, "e\n");
    let (_, _, code, reason) = run(
        &provider,
        &a.id,
        ExecSpec {
            timeout: Some(Duration::from_millis(300)),
            ..argv(&["sleep", "5"])
        },
    )
    .await;
    assert_eq!((code, reason), (None, ExitReason::TimedOut));

    // Files: bytes round trip, mkdir, list, remove.
    let bytes: Vec<u8> = (0u8..=255).collect();
    provider.mkdir(&a.id, "/root/d/e", true).await.unwrap();
    provider
        .write_file(&a.id, "/root/d/e/blob.bin", bytes.clone())
        .await
        .unwrap();
    assert_eq!(
        provider
            .read_file(&a.id, "/root/d/e/blob.bin")
            .await
            .unwrap(),
        bytes
    );
    let listed = provider.list_dir(&a.id, "/root/d").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), listed[0].kind), ("e", "dir"));
    let e = provider.mkdir(&a.id, "/root/x/y", false).await.unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Invalid, "{e}");
    provider.remove_path(&a.id, "/root/d", true).await.unwrap();
    let e = provider
        .read_file(&a.id, "/root/d/e/blob.bin")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::NotFound, "{e}");
    // Not offered: moves and metrics answer unsupported, naming the provider.
    let e = provider
        .rename(&a.id, "/root/a", "/root/b")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Unsupported);
    assert!(e.message.contains("freestyle"), "{e}");
    assert_eq!(
        provider.usage(&a.id).await.unwrap_err().kind,
        OpErrorKind::Unsupported
    );

    // Lifecycle: pause/resume keep the files; stop/start too.
    provider
        .write_file(&a.id, "/root/keep.txt", b"kept".to_vec())
        .await
        .unwrap();
    provider.lifecycle(&a.id, Lifecycle::Pause).await.unwrap();
    assert_eq!(fake.vm(&a.id).unwrap().state, "suspended");
    assert!(
        provider.get(&a.id).await.unwrap().is_some(),
        "a suspended VM lives"
    );
    let e = provider
        .read_file(&a.id, "/root/keep.txt")
        .await
        .unwrap_err();
    assert_eq!(
        e.kind,
        OpErrorKind::Invalid,
        "a suspended VM refuses files: {e}"
    );
    provider.lifecycle(&a.id, Lifecycle::Resume).await.unwrap();
    assert_eq!(fake.vm(&a.id).unwrap().state, "running");
    assert_eq!(
        provider.read_file(&a.id, "/root/keep.txt").await.unwrap(),
        b"kept"
    );
    provider.lifecycle(&a.id, Lifecycle::Stop).await.unwrap();
    assert_eq!(fake.vm(&a.id).unwrap().state, "stopped");
    provider.lifecycle(&a.id, Lifecycle::Start).await.unwrap();
    assert_eq!(fake.vm(&a.id).unwrap().state, "running");

    // Snapshot: a new VM from it has the files.
    let snap = provider.snapshot(&a.id).await.unwrap();
    assert!(snap.id.starts_with("sc-"), "{}", snap.id);
    let mut from = spec("sb-3", "sb-3-a1", None);
    from.snapshot = Some(snap.id.clone());
    let b = provider.create(from).await.unwrap();
    assert_eq!(
        fake.vm(&b.id).unwrap().snapshot_id.as_deref(),
        Some(snap.id.as_str())
    );
    assert_eq!(
        provider.read_file(&b.id, "/root/keep.txt").await.unwrap(),
        b"kept"
    );
    // The new VM carries its own tags, not the snapshot's.
    let found = provider.list_by_tag("sb-3", None).await.unwrap();
    assert_eq!(
        found.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [b.id.as_str()]
    );
    provider.delete_snapshot(&snap.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();

    // A fresh adapter (another replica) finds VMs by their tag files.
    let other = adapter(&fake, &[]);
    let found = other.list_by_tag("sb-2", Some("sb-2-a1")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, a.id);
    assert!(other
        .list_by_tag("sb-2", Some("nope"))
        .await
        .unwrap()
        .is_empty());

    // Delete; twice is fine; get is None.
    for id in [&a.id, &b.id] {
        provider.delete(id).await.unwrap();
        provider.delete(id).await.unwrap();
        assert!(provider.get(id).await.unwrap().is_none());
    }
    assert!(provider.list_by_tag("sb-2", None).await.unwrap().is_empty());
    assert_eq!(fake.live_count(), 0);
    assert_eq!(provider.capabilities(&a.id).await.unwrap(), CAPABILITIES);
    // Exactly what the adapter does (driven above): no ordered output, cancel, append,
    // public ports or PTY.
    let declared: Vec<&str> = CAPABILITIES
        .flags()
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(
        declared,
        [
            "features.process.execute",
            "features.filesystem.read",
            "features.filesystem.write",
            "features.filesystem.list",
            "features.filesystem.delete",
            "features.filesystem.mkdir",
            "features.pause_resume",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freestyle_failures_are_classified_as_documented() {
    let fake = FakeFreestyle::start(FakeFreestyleConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        appear_after: Duration::from_millis(300),
        ..FakeFreestyleConfig::default()
    })
    .await;
    let provider = adapter(&fake, &[]);
    fake.script([
        "capacity",
        "quota",
        "rate_limit",
        "outage",
        "failed_before_running",
        "timeout_after_send",
        "ok",
    ]);
    // Freestyle documents no capacity signal: its 503 is an outage (both advance).
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Quota, "{e}");
    assert!(e.message.contains("VM_LIMIT_EXCEEDED"), "{e}");
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning, "{e}");
    let failed = e.instance_id.clone().expect("the failed VM is named");
    assert_eq!(fake.vm(&failed).unwrap().state, "stopped");
    let e = provider.create(spec("sb-f", "a6", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost create's VM appears later and is found by its tag file.
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let found = provider.list_by_tag("sb-f", Some("a6")).await.unwrap();
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(found.len(), 1);
    let ok = provider.create(spec("sb-f", "a7", None)).await.unwrap();
    assert!(!ok.id.is_empty());
    assert_eq!(
        fake.create_log(),
        [
            CreateOutcome::Capacity,
            CreateOutcome::Quota,
            CreateOutcome::RateLimit,
            CreateOutcome::Outage,
            CreateOutcome::FailedBeforeRunning,
            CreateOutcome::TimeoutAfterSend,
            CreateOutcome::Ok,
        ]
    );

    // A snapshot that is not on the account: unsupported, nothing made.
    let mut missing = spec("sb-s", "s1", None);
    missing.snapshot = Some("sc-00000000000000000000".into());
    let e = provider.create(missing).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    // Operations on a VM that is gone: not found.
    let e = provider
        .read_file("novmnovmnovmnovmnovm", "/x")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::NotFound, "{e}");

    // A wrong key: unbound account, the key never shown.
    let account = FreestyleAccount::from_options(
        Some(&fake.url()),
        &BTreeMap::new(),
        Secret::new("wrong-key".to_string()),
    )
    .unwrap();
    let wrong =
        Freestyle::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);
    assert!(!e.message.contains("wrong-key"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    assert!(provider.check().await.unwrap().contains("VMs"));
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let account = FreestyleAccount::from_options(
        Some(&format!("http://127.0.0.1:{closed}")),
        &BTreeMap::new(),
        Secret::new("k".to_string()),
    )
    .unwrap();
    let down =
        Freestyle::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap();
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert!(!e.maybe_created);
}

// ------------------------------------------------------------------- through the gateway

const API_TOKEN: &str = "api-token-ws-a-0123456789";

struct Env {
    gw: Gateway,
    fake: FakeFreestyle,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

fn topology(fake: &FakeFreestyle, keys: &Path) -> String {
    let key = keys.join("freestyle.key");
    std::fs::write(&key, fake.api_key()).unwrap();
    format!(
        r#"
[[providers]]
name = "freestyle"

[[accounts]]
name = "freestyle-main"
provider = "freestyle"
base_url = "{url}"
api_key_file = {key:?}

[[pools]]
name = "a-freestyle"
provider = "freestyle"
account = "freestyle-main"
"#,
        url = fake.url(),
        key = key.display().to_string(),
    )
}

async fn start() -> Env {
    init();
    let fake = FakeFreestyle::start(FakeFreestyleConfig::default()).await;
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
            topology = topology(&fake, keys.path())
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        fake,
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
async fn freestyle_explicit_placement_through_the_gateway_is_advisory() {
    let env = start().await;
    let pools = env.get("/v1/pools").await;
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "a-freestyle")
        .cloned()
        .unwrap();
    assert_eq!(pool["egress"], "advisory", "{pool:#}");

    // Explicit placement lands on the Freestyle pool, advisory, nothing native shown.
    let view = env.running(json!({"provider": "freestyle"})).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "a-freestyle", "{view:#}");
    assert_eq!(view["placement"]["provider"], "freestyle");
    assert_eq!(view["egress"]["enforcement"], "advisory", "{view:#}");
    assert!(view["placement"]["lockdown"].is_null(), "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let tags: Value = serde_json::from_slice(&env.fake.file(instance, TAGS_PATH).unwrap()).unwrap();
    assert_eq!(tags["sandgate_sandbox"], id);
    assert_eq!(
        env.fake.file(instance, CA_PATH).unwrap(),
        env.gw.sandgate_ca_pem
    );

    // Exec through the gateway: the sandbox's own proxy identity, never a provider key.
    let (out, err, code) = env
        .sh(id, "echo \"$HTTPS_PROXY\"; echo oops >&2; exit 4")
        .await;
    assert_eq!((err.as_str(), code), ("oops\n", 4));
    assert!(out.starts_with(&format!("http://{id}:")), "{out}");
    let (out, _, _) = env.sh(id, "cat /etc/sandgate/env.sh; env").await;
    assert!(
        !out.contains(env.fake.api_key()),
        "no provider key in the VM"
    );

    // A network-restricted create is refused with the reason, nothing created.
    let before = env.fake.vms().len();
    let (status, refused) = env
        .post(
            "/v1/sandboxes",
            json!({"provider": "freestyle", "network": {"allow_domains": ["api.a.test"]}}),
        )
        .await;
    assert!(status >= 400, "{status}: {refused:#}");
    let unmet = refused["error"]["details"]["attempts"].to_string();
    assert!(unmet.contains("network"), "{refused:#}");
    assert_eq!(env.fake.vms().len(), before);
    // What the adapter does not do is refused by name, never placed.
    for (features, unmet) in [
        (
            json!({"process": {"ordered_output": true}}),
            "features.process.ordered_output",
        ),
        (
            json!({"process": {"cancel": true}}),
            "features.process.cancel",
        ),
        (json!({"pty": true}), "features.pty"),
    ] {
        let (status, refused) = env
            .post(
                "/v1/sandboxes",
                json!({"provider": "freestyle", "features": features}),
            )
            .await;
        assert!(status >= 400, "{status}: {refused:#}");
        let attempts = refused["error"]["details"]["attempts"].to_string();
        assert!(attempts.contains(unmet), "{unmet}: {refused:#}");
    }
    assert_eq!(env.fake.vms().len(), before);
    // A declared pause/resume is honoured through the gateway.
    let (status, paused) = env
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert!(status < 300, "{status}: {paused:#}");
    assert_eq!(env.fake.vm(instance).unwrap().state, "suspended");
    let (status, resumed) = env
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert!(status < 300, "{status}: {resumed:#}");
    assert_eq!(env.fake.vm(instance).unwrap().state, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freestyle_provider_check_through_the_binary() {
    init();
    let fake = FakeFreestyle::start(FakeFreestyleConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.key");
    let bad = dir.path().join("bad.key");
    std::fs::write(&good, fake.api_key()).unwrap();
    std::fs::write(&bad, "fs_wrong_key").unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[providers]]
name = "freestyle"
[[accounts]]
name = "good"
provider = "freestyle"
base_url = "{url}"
api_key_file = {good:?}
[[accounts]]
name = "bad"
provider = "freestyle"
base_url = "{url}"
api_key_file = {bad:?}
[[pools]]
name = "good"
provider = "freestyle"
account = "good"
[[pools]]
name = "bad"
provider = "freestyle"
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
    assert!(stdout.contains("ok: account good (freestyle)"), "{stdout}");
    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unbound_account") && stderr.contains("401"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("fs_wrong_key"),
        "the key is never printed: {stderr}"
    );
}
