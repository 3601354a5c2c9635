//! The fake CodeSandbox API (`tests/it/common/fakes/codesandbox.rs`) proven with the official
//! `@codesandbox/sdk`, the CodeSandbox adapter (`sandgate::providers::codesandbox`) driven
//! through the `Provider` trait against it, and a whole gateway (`sandgate serve`) placing
//! sandboxes on a CodeSandbox pool: explicitly only, since the adapter is lifecycle only.
//!
//! `official_js_sdk_accepts_the_fake` runs `node tests/sdk/codesandbox_contract.mjs` with the
//! SDK installed in `SANDGATE_SDK_NODE` (default `/opt/sandgate-sdk-node`, where `.ci/run`
//! runs `npm ci` on `tests/sdk/package.json`). Without node or the SDK it FAILS, never skips.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::fakes::codesandbox::{
    tag_map, CreateOutcome, FakeCodesandbox, FakeConfig, TEMPLATE,
};
use sandgate::credentials::Secret;
use sandgate::providers::codesandbox::{Codesandbox, CodesandboxAccount};
use sandgate::providers::ops::{ExecSpec, Lifecycle};
use sandgate::providers::{
    CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, RuntimeCapabilities, Tags,
};
use serde_json::{json, Value};

/// The SDK version the fake was proven against (pinned in `tests/sdk/package.json`).
const CSB_SDK_VERSION: &str = "2.4.2";
const DEFAULT_SDK_NODE: &str = "/opt/sandgate-sdk-node";

fn sdk_dir() -> PathBuf {
    std::env::var_os("SANDGATE_SDK_NODE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SDK_NODE))
}

/// `Some(reason)` when node or the SDK (at the pinned version) is missing.
fn sdk_missing(dir: &Path) -> Option<String> {
    match std::process::Command::new("node").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("node --version failed: {}", out.status)),
        Err(e) => return Some(format!("node does not run: {e}")),
    }
    let package = dir.join("node_modules/@codesandbox/sdk/package.json");
    match std::fs::read_to_string(&package) {
        Ok(text) => {
            let version = serde_json::from_str::<Value>(&text).ok()?["version"].clone();
            (version != CSB_SDK_VERSION).then(|| {
                format!(
                    "{} is version {version}, not {CSB_SDK_VERSION}",
                    package.display()
                )
            })
        }
        Err(e) => Some(format!("{}: {e}", package.display())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_js_sdk_accepts_the_fake() {
    let dir = sdk_dir();
    if let Some(reason) = sdk_missing(&dir) {
        panic!(
            "the CodeSandbox contract test needs node and the official SDK ({reason}): \
             .ci/run installs @codesandbox/sdk@{CSB_SDK_VERSION} into {DEFAULT_SDK_NODE} \
             (npm ci --prefix {DEFAULT_SDK_NODE} with tests/sdk/package.json, or set SANDGATE_SDK_NODE)"
        );
    }
    common::init();
    let fake = FakeCodesandbox::start(FakeConfig::default()).await;
    // The script's first create meets a 429.
    fake.script(["rate_limit"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/codesandbox_contract.mjs");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(&script)
        .env("CSB_FAKE_URL", fake.url())
        .env("CSB_API_KEY", fake.api_key())
        .env("SANDGATE_SDK_NODE", &dir)
        .env("CSB_SDK_EXPECTED_VERSION", CSB_SDK_VERSION)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("CSB_BASE_URL")
        .env_remove("TOGETHER_API_KEY")
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
    assert_eq!(report["sdk"], CSB_SDK_VERSION);
    println!("{stdout}");

    // The inventory agrees with what the SDK did.
    let id = report["sandbox"].as_str().unwrap();
    let sandbox = fake
        .sandbox(id)
        .expect("the SDK's sandbox is in the inventory");
    assert_eq!(sandbox.forked_from, TEMPLATE);
    assert!(sandbox.deleted);
    assert_eq!(tag_map(&sandbox)["run"], report["run"].as_str().unwrap());
    assert!(
        sandbox.has_tag("sdk"),
        "the SDK adds its own tag: {sandbox:?}"
    );
    assert_eq!(sandbox.title.as_deref(), Some("contract"));
    assert_eq!((sandbox.privacy, sandbox.private_preview), (2, Some(true)));
    assert_eq!(sandbox.path, "/SDK");
    assert_eq!(sandbox.bootups, ["FORK", "RESUME", "CLEAN", "RUNNING"]);
    assert_eq!(
        sandbox.starts[0],
        json!({"tier": "Nano", "hibernation_timeout_seconds": 120})
    );
    // `shutdown`, then `restart` (a shutdown and a start).
    assert_eq!((sandbox.hibernations, sandbox.shutdowns), (1, 2));
    let forked = fake.sandbox(report["forked"].as_str().unwrap()).unwrap();
    assert_eq!(forked.forked_from, id);
    assert!(forked.deleted);
    assert_eq!(
        fake.create_log(),
        vec![
            CreateOutcome::RateLimit,
            CreateOutcome::Ok,
            CreateOutcome::Ok
        ]
    );
    assert_eq!(fake.live_count(), 0);
    let calls: Vec<&str> = report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for expected in [
        format!("POST /sandbox/{TEMPLATE}/fork"),
        format!("POST /vm/{id}/start"),
        format!("POST /vm/{id}/hibernate"),
        format!("POST /vm/{id}/shutdown"),
        format!("DELETE /vm/{id}"),
        format!("GET /sandbox/{id}"),
        "GET /sandbox".to_string(),
    ] {
        assert!(calls.contains(&expected.as_str()), "{expected}: {calls:?}");
    }
}

// ------------------------------------------------------------------------------ adapter

fn adapter_at(url: &str, key: &str, options: &[(&str, &str)]) -> Codesandbox {
    common::init();
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let account = CodesandboxAccount::from_options(Some(url), &options, Secret::new(key))
        .expect("account options");
    Codesandbox::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn adapter(fake: &FakeCodesandbox, options: &[(&str, &str)]) -> Codesandbox {
    adapter_at(&fake.url(), fake.api_key(), options)
}

fn spec(sandbox: &str, attempt: &str, egress: Option<RemoteEgress>) -> CreateSpec {
    CreateSpec {
        tags: Tags {
            sandbox_id: sandbox.to_string(),
            attempt_id: attempt.to_string(),
        },
        pool: "csb-1".into(),
        account: "csb".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

fn egress(lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: "http://sb-1:0123abcd@127.0.0.1:3128".into(),
        gateway_host: "127.0.0.1".into(),
        gateway_port: 3128,
        ca_pem: "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n".into(),
        lock_down,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_round_trips_the_lifecycle() {
    let fake = FakeCodesandbox::start(FakeConfig::default()).await;
    let provider = adapter(
        &fake,
        &[("tier", "Micro"), ("hibernation_timeout_secs", "900")],
    );
    let made = provider
        .create(spec("sb-1", "sb-1-a1", None))
        .await
        .unwrap();
    assert_eq!(made.tags.attempt_id, "sb-1-a1");
    let sandbox = fake.sandbox(&made.id).unwrap();
    assert_eq!(sandbox.forked_from, TEMPLATE);
    assert_eq!(
        sandbox.tags,
        ["sandgate_sandbox=sb-1", "sandgate_attempt=sb-1-a1"]
    );
    assert_eq!(sandbox.title.as_deref(), Some("sandgate-sb-1"));
    assert_eq!((sandbox.privacy, sandbox.private_preview), (2, Some(true)));
    assert_eq!(sandbox.vm, "running");
    assert_eq!(
        sandbox.starts,
        [json!({"tier": "Micro", "hibernation_timeout_seconds": 900})]
    );
    // No secret and no placeholder reaches CodeSandbox (it takes no environment).
    let body = sandbox.request.to_string();
    assert!(!body.contains(fake.api_key()) && !body.contains("placeholder-gh"));

    let got = provider.get(&made.id).await.unwrap().expect("known");
    assert_eq!(got.tags, made.tags);
    let listed = provider.list_by_tag("sb-1", None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, made.id);
    assert!(provider
        .list_by_tag("sb-1", Some("sb-1-a9"))
        .await
        .unwrap()
        .is_empty());

    // pause = hibernate, resume = start (RESUME), stop = shutdown, start = start (CLEAN).
    provider
        .lifecycle(&made.id, Lifecycle::Pause)
        .await
        .unwrap();
    assert_eq!(fake.sandbox(&made.id).unwrap().vm, "hibernated");
    provider
        .lifecycle(&made.id, Lifecycle::Resume)
        .await
        .unwrap();
    provider.lifecycle(&made.id, Lifecycle::Stop).await.unwrap();
    assert_eq!(fake.sandbox(&made.id).unwrap().vm, "shutdown");
    provider
        .lifecycle(&made.id, Lifecycle::Start)
        .await
        .unwrap();
    assert_eq!(
        fake.sandbox(&made.id).unwrap().bootups,
        ["FORK", "RESUME", "CLEAN"]
    );

    // A snapshot is an unstarted fork; a create from it forks it.
    let snap = provider.snapshot(&made.id).await.unwrap();
    let s = fake.sandbox(&snap.id).unwrap();
    assert_eq!(
        (s.forked_from.as_str(), s.vm.as_str()),
        (made.id.as_str(), "none")
    );
    assert_eq!(s.tags, [format!("sandgate_snapshot={}", made.id)]);
    let mut restore = spec("sb-2", "sb-2-a1", None);
    restore.snapshot = Some(snap.id.clone());
    let restored = provider.create(restore).await.unwrap();
    assert_eq!(fake.sandbox(&restored.id).unwrap().forked_from, snap.id);
    provider.delete_snapshot(&snap.id).await.unwrap();
    assert!(fake.sandbox(&snap.id).unwrap().deleted);

    // Capabilities: pause/resume only; exec and files answer unsupported, naming codesandbox.
    let caps = provider.capabilities(&made.id).await.unwrap();
    assert_eq!(
        caps,
        RuntimeCapabilities {
            pause_resume: true,
            ..RuntimeCapabilities::NONE
        }
    );
    let e = provider
        .exec(
            &made.id,
            ExecSpec {
                argv: vec!["true".into()],
                env: BTreeMap::new(),
                cwd: None,
                timeout: None,
            },
        )
        .await
        .err()
        .expect("exec is unsupported");
    assert_eq!(e.kind, OpErrorKind::Unsupported);
    assert!(e.to_string().contains("codesandbox"), "{e}");
    let e = provider.read_file(&made.id, "/x").await.unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Unsupported);
    let e = provider
        .write_file(&made.id, "/x", b"y".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Unsupported);

    // Delete, twice: the second is a success too.
    provider.delete(&made.id).await.unwrap();
    provider.delete(&made.id).await.unwrap();
    assert!(provider.get(&made.id).await.unwrap().is_none());
    let e = provider
        .lifecycle(&made.id, Lifecycle::Pause)
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::NotFound);
    assert!(provider.check().await.unwrap().contains(&fake.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_advisory_and_a_lockdown_is_refused() {
    let fake = FakeCodesandbox::start(FakeConfig::default()).await;
    let provider = adapter(&fake, &[]);
    let e = provider
        .create(spec("sb-l", "sb-l-a1", Some(egress(true))))
        .await
        .unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert!(e.message.contains("advisory"), "{e}");
    assert!(fake.create_log().is_empty(), "nothing was forked");
    // Advisory: the sandbox is made, nothing native is shown, no CA path.
    let made = provider
        .create(spec("sb-l", "sb-l-a2", Some(egress(false))))
        .await
        .unwrap();
    assert!(provider.lockdown(&egress(false)).is_none());
    assert!(provider.ca_path().is_none());
    let body = fake.sandbox(&made.id).unwrap().request.to_string();
    assert!(!body.contains("0123abcd"), "no proxy token sent: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakeCodesandbox::start(FakeConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(100),
        appear_after: Duration::from_millis(300),
    })
    .await;
    let provider = adapter(&fake, &[]);
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "failed_before_running",
        "timeout_after_send",
    ]);
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Capacity, "{e}");
    assert!(e.message.contains("overloaded"), "the prose is kept: {e}");
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit, "{e}");
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning, "{e}");
    let failed = e.instance_id.clone().expect("the forked sandbox is named");
    assert_eq!(fake.sandbox(&failed).unwrap().bootups, ["FAILED"]);
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost fork shows up by its tags after appear_after; adopting it starts its VM.
    assert!(provider
        .list_by_tag("sb-f", Some("a5"))
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(350)).await;
    let found = provider.list_by_tag("sb-f", Some("a5")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(fake.sandbox(&found[0].id).unwrap().vm, "none");
    provider.adopt(&found[0].id, None).await.unwrap();
    assert_eq!(fake.sandbox(&found[0].id).unwrap().vm, "running");
    // A template CodeSandbox does not know: unsupported, nothing made.
    let mut template = spec("sb-t", "t1", None);
    template.request = Arc::new(sandgate_router::Request {
        source: Some(sandgate_router::Source::Template("nosuch".into())),
        ..sandgate_router::Request::default()
    });
    let live = fake.live_count();
    let e = provider.create(template).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert!(!e.maybe_created);
    assert_eq!(fake.live_count(), live);

    // A wrong key: unbound account, the key never echoed.
    let wrong = adapter_at(&fake.url(), "csb_wrong_key", &[]);
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount, "{e}");
    assert!(!e.message.contains("csb_wrong_key"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = adapter_at(&format!("http://127.0.0.1:{closed}"), "k", &[]);
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert!(!e.maybe_created);
}
