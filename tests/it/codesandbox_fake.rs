//! The fake CodeSandbox API (`tests/it/common/fakes/codesandbox.rs`) proven with the official
//! `@codesandbox/sdk`, the CodeSandbox adapter (`sandgate::providers::codesandbox`) driven
//! through the `Provider` trait against it, and a whole gateway (`sandgate serve`) placing
//! sandboxes on a CodeSandbox pool: explicitly only, since the adapter is lifecycle only.
//!
//! `official_js_sdk_accepts_the_fake` runs `node tests/sdk/codesandbox_contract.mjs` with the
//! SDK installed in `SANDGATE_SDK_NODE` (default `/opt/sandgate-sdk-node`, where `.ci/run`
//! runs `npm ci` on `tests/sdk/package.json`). Without node or the SDK it FAILS, never skips.

use crate::common;
use crate::common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
                user: None,
            },
        )
        .await
        .expect_err("exec is unsupported");
    assert_eq!(e.kind, OpErrorKind::Unsupported);
    assert!(e.to_string().contains("codesandbox"), "{e}");
    // Every operation the table does not declare answers unsupported, naming the provider.
    let id = made.id.as_str();
    let undeclared = [
        provider.read_file(id, "/x").await.map(|_| ()),
        provider.write_file(id, "/x", b"y".to_vec()).await,
        provider.list_dir(id, "/").await.map(|_| ()),
        provider.remove_path(id, "/x", false).await,
        provider.mkdir(id, "/d", true).await,
        provider.rename(id, "/x", "/y").await,
    ];
    for result in undeclared {
        let e = result.unwrap_err();
        assert_eq!(e.kind, OpErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("codesandbox"), "{e}");
    }

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

// ------------------------------------------------------------------- through the gateway

const API_TOKEN: &str = "api-token-ws-a-0123456789";

struct Env {
    gw: Gateway,
    csb: FakeCodesandbox,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

/// One pool `p-csb` on the fake.
async fn start(create: &str, config: FakeConfig) -> Env {
    init();
    let csb = FakeCodesandbox::start(config).await;
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("csb.key");
    std::fs::write(&key, csb.api_key()).unwrap();
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

[[providers]]
name = "codesandbox"

[[accounts]]
name = "csb-main"
provider = "codesandbox"
base_url = "{url}"
api_key_file = {key:?}
options = {{ tier = "Nano" }}

[[pools]]
name = "p-csb"
provider = "codesandbox"
account = "csb-main"
"#,
            url = csb.url(),
            key = key.display().to_string(),
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        csb,
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        _keys: keys,
    }
}

impl Env {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, self.gw.api(path))
            .bearer_auth(API_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let r = request.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.send(reqwest::Method::GET, path, None).await.1
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
}

fn unmet(error: &Value, pool: &str) -> Vec<String> {
    let attempts = error["error"]["details"]["attempts"].as_array().unwrap();
    let attempt = attempts
        .iter()
        .find(|a| a["pool"] == pool)
        .unwrap_or_else(|| panic!("no attempt on {pool}: {error:#}"));
    attempt["unmet_requirements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_codesandbox_pool_is_placed_on_only_when_named() {
    let env = start("", FakeConfig::default()).await;
    // The pool declares what the adapter does: pause/resume, no exec or files; advisory.
    let pools = env.get("/v1/pools").await;
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "p-csb")
        .unwrap_or_else(|| panic!("{pools:#}"))
        .clone();
    let features = &pool["capabilities"]["features"];
    assert_eq!(features["pause_resume"], true, "{pool:#}");
    assert_eq!(features["process.execute"], false, "{pool:#}");
    assert_eq!(features["filesystem.read"], false, "{pool:#}");
    assert_eq!(pool["egress"], "advisory", "{pool:#}");

    // Automatic routing with the portable baseline never selects it, and says why.
    let (status, e) = env.post("/v1/sandboxes", json!({})).await;
    assert_eq!(status, 422, "{e:#}");
    assert_eq!(e["error"]["code"], "no_eligible_provider", "{e:#}");
    let missing = unmet(&e, "p-csb");
    for need in [
        "features.process.execute",
        "features.filesystem.read",
        "features.filesystem.write",
    ] {
        assert!(missing.contains(&need.to_string()), "{need}: {missing:?}");
    }
    // A pin alone keeps the baseline.
    let (status, e) = env
        .post("/v1/sandboxes", json!({"routing": {"pin_pool": "p-csb"}}))
        .await;
    assert_eq!(status, 422, "{e:#}");
    assert!(unmet(&e, "p-csb").contains(&"features.process.execute".to_string()));
    // Named, but restricting egress: an advisory pool cannot satisfy it.
    let (status, e) = env
        .post(
            "/v1/sandboxes",
            json!({"provider": "codesandbox", "network": {"allow_domains": ["api.a.test"]}}),
        )
        .await;
    assert_eq!(status, 422, "{e:#}");
    assert!(
        unmet(&e, "p-csb").iter().any(|u| u.starts_with("network")),
        "{e:#}"
    );
    assert_eq!(env.csb.live_count(), 0);

    // Named explicitly (the baseline off for its pools), it lands there.
    let view = env.settled(json!({"provider": "codesandbox"})).await;
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "p-csb", "{view:#}");
    // Nothing reaches a CodeSandbox sandbox (no CA path, no environment at create), but its
    // view says what the pool says, one word (`advisory`: nothing is enforced), with the
    // public proxy address and the gateway's CA for a client to use.
    assert_eq!(view["egress"]["enforcement"], "advisory", "{view:#}");
    assert_eq!(view["egress"]["enforcement"], pool["egress"], "{view:#}");
    assert_eq!(view["egress"]["proxy"], "http://127.0.0.1:3999", "{view:#}");
    assert!(view["placement"]["lockdown"].is_null(), "{view:#}");
    let id = view["id"].as_str().unwrap().to_string();
    let instance = view["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    let sandbox = env.csb.sandbox(&instance).unwrap();
    assert!(
        sandbox.has_tag(&format!("sandgate_sandbox={id}")),
        "{sandbox:?}"
    );
    assert_eq!(sandbox.starts, [json!({"tier": "Nano"})]);
    // No secret reaches CodeSandbox.
    let sent = sandbox.request.to_string();
    assert!(!sent.contains(env.csb.api_key()) && !sent.contains(API_TOKEN));

    // A pin with the baseline opted out lands there too.
    let opt_out = json!({
        "routing": {"pin_pool": "p-csb"},
        "features": {"process": {"execute": false}, "filesystem": {"read": false, "write": false}},
    });
    let pinned = env.settled(opt_out).await;
    assert_eq!(pinned["state"], "running", "{pinned:#}");
    assert_eq!(pinned["placement"]["pool"], "p-csb", "{pinned:#}");

    // Pause and resume through sandgate: hibernate and start at CodeSandbox.
    let (status, body) = env
        .post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert!(status < 300, "{status}: {body:#}");
    assert_eq!(env.csb.sandbox(&instance).unwrap().vm, "hibernated");
    let (status, body) = env
        .post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert!(status < 300, "{status}: {body:#}");
    assert_eq!(
        env.csb.sandbox(&instance).unwrap().bootups,
        ["FORK", "RESUME"]
    );
    // Exec is 501, naming the provider.
    let (status, body) = env
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"argv": ["true"], "timeout_ms": 5000}),
        )
        .await;
    assert_eq!(status, 501, "{body:#}");
    assert!(body.to_string().contains("codesandbox"), "{body:#}");
    // And so are files.
    let r = env
        .http
        .get(
            env.gw
                .api(&format!("/v1/sandboxes/{id}/files/content?path=/tmp/x")),
        )
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 501);
    assert!(r.text().await.unwrap().contains("codesandbox"));

    // Delete through sandgate deletes at CodeSandbox.
    let (status, body) = env
        .send(
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await;
    assert!(status < 300, "{status}: {body:#}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.csb.sandbox(&instance).is_some_and(|s| s.live()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!env.csb.sandbox(&instance).unwrap().live());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_fork_is_reconciled_by_tag_and_started_with_no_duplicate() {
    let env = start(
        "",
        FakeConfig {
            hang: Duration::from_millis(300),
            appear_after: Duration::from_millis(200),
            ..FakeConfig::default()
        },
    )
    .await;
    env.csb.script(["timeout_after_send"]);
    let view = env.settled(json!({"provider": "codesandbox"})).await;
    assert_eq!(view["state"], "running", "{view:#}");
    let id = view["id"].as_str().unwrap();
    let live = env.csb.live_with_tag("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "no duplicate: {:?}", env.csb.live());
    assert_eq!(env.csb.live_count(), 1);
    assert_eq!(view["placement"]["instance_id"], live[0].id.as_str());
    assert_eq!(
        env.csb.create_log(),
        vec![CreateOutcome::TimeoutAfterSend],
        "the fork was not repeated"
    );
    // Adopted, then started as the create would have.
    assert_eq!(live[0].vm, "running");
    assert_eq!(live[0].bootups, ["FORK"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failure_rows_on_the_codesandbox_pool_are_recorded_as_documented() {
    let env = start(
        "provisioning_window_ms = 200\nretry_backoff_ms = 20\n",
        FakeConfig::default(),
    )
    .await;
    for (script, class) in [
        ("capacity", "capacity"),
        ("rate_limit", "rate_limit"),
        ("outage", "outage"),
        ("failed_before_running", "failed_before_running"),
    ] {
        env.csb.script([script]);
        let view = env.settled(json!({"provider": "codesandbox"})).await;
        let first = &view["attempts"][0];
        assert_eq!(first["pool"], "p-csb", "{view:#}");
        assert_eq!(first["error_class"], class, "{script}: {view:#}");
    }
    // The sandbox whose start failed was deleted; the other creates made nothing or were
    // retried to success.
    let failed: Vec<_> = env
        .csb
        .sandboxes()
        .into_iter()
        .filter(|s| s.outcome == CreateOutcome::FailedBeforeRunning)
        .collect();
    assert_eq!(failed.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.csb.sandbox(&failed[0].id).is_some_and(|s| s.live()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!env.csb.sandbox(&failed[0].id).unwrap().live());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_works_for_codesandbox() {
    let fake = FakeCodesandbox::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.key");
    let bad = dir.path().join("bad.key");
    std::fs::write(&good, fake.api_key()).unwrap();
    std::fs::write(&bad, "csb_v1_wrong_key_0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[providers]]
name = "codesandbox"
[[accounts]]
name = "good"
provider = "codesandbox"
base_url = "{url}"
api_key_file = {good:?}
[[accounts]]
name = "bad"
provider = "codesandbox"
base_url = "{url}"
api_key_file = {bad:?}
[[pools]]
name = "good"
provider = "codesandbox"
account = "good"
[[pools]]
name = "bad"
provider = "codesandbox"
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
        stdout.contains("ok: account good (codesandbox)"),
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
        !stderr.contains("wrong_key"),
        "the key is never printed: {stderr}"
    );
}
