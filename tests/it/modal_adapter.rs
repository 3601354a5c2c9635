//! The Modal adapter (`sandgate::providers::hosted::modal`) driven through the `Provider`
//! trait against the Modal fake (`tests/it/common/fakes/modal.rs`, a tonic gRPC server
//! proven by the official `modal` SDK in `modal_fake.rs`), then whole gateways (`sandgate
//! serve`) placing sandboxes on a Modal pool, and failing over from Modal to Blaxel.

use crate::common;
use crate::common::*;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::blaxel::{FakeBlaxel, FakeBlaxelConfig};
use crate::common::fakes::modal::{CreateOutcome, FakeModal, FakeModalConfig};
use sandgate::credentials::Secret;
use sandgate::providers::hosted::modal::{Modal, ModalAccount, CA_PATH};
use sandgate::providers::ops::{ExecEvent, ExecSpec, ExitInfo, ExitReason};
use sandgate::providers::{CreateSpec, ErrorClass, OpErrorKind, Provider, RemoteEgress, Tags};
use serde_json::{json, Value};

const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBfakeModalCA\n-----END CERTIFICATE-----\n";
/// The fake's base image.
const IMAGE: &str = "im-fake";

fn key(fake: &FakeModal) -> String {
    format!("{}:{}", fake.token_id(), fake.token_secret())
}

fn adapter_at(url: &str, key: &str, options: &[(&str, &str)]) -> Modal {
    common::init();
    let mut all: BTreeMap<String, String> = BTreeMap::from([("image_id".into(), IMAGE.into())]);
    all.extend(options.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let account =
        ModalAccount::from_options(Some(url), &all, Secret::new(key)).expect("account options");
    Modal::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn adapter(fake: &FakeModal, options: &[(&str, &str)]) -> Modal {
    adapter_at(&fake.url(), &key(fake), options)
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
        pool: "modal-1".into(),
        account: "modal".into(),
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

async fn run(provider: &Modal, id: &str, spec: ExecSpec) -> Ran {
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
    let fake = FakeModal::start(FakeModalConfig::default()).await;
    let provider = adapter(&fake, &[("cpu", "2"), ("memory_mb", "1024")]);
    assert_eq!(provider.kind(), "modal");
    assert_eq!(provider.ca_path(), Some(CA_PATH));
    let instance = provider
        .create(spec("sb-1", "sb-1-a1", Some(egress("203.0.113.7", true))))
        .await
        .expect("the create succeeds");
    let sandbox = fake
        .sandbox(&instance.id)
        .expect("the sandbox is at the fake");
    assert_eq!(sandbox.state, "running");
    assert_eq!(sandbox.tags["sandgate_sandbox"], "sb-1");
    assert_eq!(sandbox.tags["sandgate_attempt"], "sb-1-a1");
    assert_eq!(sandbox.idempotency_key.as_deref(), Some("sb-1-a1"));
    assert_eq!(sandbox.image_id, IMAGE);
    assert_eq!(sandbox.entrypoint_args, ["sleep", "infinity"]);
    assert_eq!(sandbox.timeout_secs, 86400);

    // The lock-down: the gateway is the only allowed destination, exactly as shown.
    assert_eq!(sandbox.network_access_type, "ALLOWLIST");
    assert_eq!(sandbox.allowed_cidrs, ["203.0.113.7/32"]);
    assert!(sandbox.allowed_domains.is_empty() && !sandbox.block_network);
    let shown = provider.lockdown(&egress("203.0.113.7", true)).unwrap();
    assert_eq!(
        shown,
        json!({"network_access": {"network_access_type": "ALLOWLIST",
            "allowed_cidrs": ["203.0.113.7/32"], "allowed_domains": []}})
    );
    assert!(provider.lockdown(&egress("203.0.113.7", false)).is_none());

    // The proxy and CA variables (through the create's secret), the placeholder
    // credential, and no secret.
    let env = &sandbox.env;
    for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(env[var], "http://sb-1:0123abcd@203.0.113.7:3128", "{var}");
    }
    assert_eq!(env["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(env["SANDGATE_CRED_GH"], "placeholder-gh");
    assert!(env.values().all(|v| !v.contains(fake.token_secret())));
    assert_eq!(
        fake.file(&instance.id, CA_PATH).as_deref(),
        Some(CA_PEM.as_bytes())
    );
    // The sandbox's own processes see the variables.
    let seen = run(
        &provider,
        &instance.id,
        argv(&["sh", "-c", "echo $HTTPS_PROXY"]),
    )
    .await;
    assert_eq!(seen.stdout, b"http://sb-1:0123abcd@203.0.113.7:3128\n");

    // An advisory pool: variables and CA, an open network.
    let advisory = provider
        .create(spec("sb-2", "sb-2-a1", Some(egress("203.0.113.7", false))))
        .await
        .unwrap();
    let open = fake.sandbox(&advisory.id).unwrap();
    assert_eq!(open.network_access_type, "OPEN");
    assert!(open.allowed_cidrs.is_empty());
    assert_eq!(
        open.env["HTTPS_PROXY"],
        "http://sb-1:0123abcd@203.0.113.7:3128"
    );
    // A named gateway: Modal's domain allow list, alone.
    let named = provider
        .create(spec(
            "sb-3",
            "sb-3-a1",
            Some(egress("gw.sandgate.test", true)),
        ))
        .await
        .unwrap();
    let named = fake.sandbox(&named.id).unwrap();
    assert_eq!(named.network_access_type, "ALLOWLIST");
    assert_eq!(named.allowed_domains, ["gw.sandgate.test"]);
    assert!(named.allowed_cidrs.is_empty());
    assert!(provider.check().await.unwrap().contains(&fake.url()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_files_snapshots_list_and_delete() {
    let fake = FakeModal::start(FakeModalConfig::default()).await;
    let provider = adapter(&fake, &[]);
    let id = provider
        .create(spec("sb-x", "sb-x-a1", None))
        .await
        .unwrap()
        .id;

    // Output, exit code, argv as given (no shell), env and cwd.
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
    let many = run(&provider, &id, argv(&["seq", "1", "20000"])).await;
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(String::from_utf8(many.stdout).unwrap(), expected);
    // Streamed as produced: the first line arrives before the command ends.
    let mut stream = provider
        .exec(&id, argv(&["sh", "-c", "echo first; sleep 2; echo second"]))
        .await
        .unwrap();
    let started = Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.events.recv())
        .await
        .unwrap();
    assert!(
        matches!(first, Some(ExecEvent::Stdout(ref b)) if &b[..] == b"first\n"),
        "{first:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "not streamed"
    );
    while let Some(event) = stream.events.recv().await {
        if let ExecEvent::Exit(info) = event {
            assert_eq!(info.code, Some(0));
        }
    }
    // A timeout ends the command (the router's timeout_secs).
    let slow = run(
        &provider,
        &id,
        ExecSpec {
            timeout: Some(Duration::from_secs(1)),
            ..argv(&["sleep", "30"])
        },
    )
    .await;
    assert_eq!(slow.exit.reason, ExitReason::TimedOut, "{:?}", slow.exit);
    let empty = provider.exec(&id, argv(&[])).await.unwrap_err();
    assert_eq!(empty.kind, OpErrorKind::Invalid);

    // Files: text, binary in a new directory, missing, a directory.
    provider
        .write_file(&id, "/root/notes.txt", b"text file\n".to_vec())
        .await
        .unwrap();
    assert_eq!(
        provider.read_file(&id, "/root/notes.txt").await.unwrap(),
        b"text file\n"
    );
    let blob: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    provider
        .write_file(&id, "/root/work/deep/blob.bin", blob.clone())
        .await
        .unwrap();
    assert_eq!(
        fake.file(&id, "/root/work/deep/blob.bin"),
        Some(blob.clone())
    );
    assert_eq!(
        provider
            .read_file(&id, "/root/work/deep/blob.bin")
            .await
            .unwrap(),
        blob
    );
    let missing = provider.read_file(&id, "/root/nope.txt").await.unwrap_err();
    assert_eq!(missing.kind, OpErrorKind::NotFound, "{missing}");
    let dir = provider.read_file(&id, "/root/work").await.unwrap_err();
    assert_eq!(dir.kind, OpErrorKind::Invalid, "{dir}");
    provider.mkdir(&id, "/root/a/b", true).await.unwrap();
    let listed = run(&provider, &id, argv(&["ls", "/root/a"])).await;
    assert_eq!(listed.stdout, b"b\n");

    // A filesystem snapshot seeds a new sandbox as its image, then goes.
    let snap = provider.snapshot(&id).await.unwrap();
    assert!(snap.id.starts_with("im-"), "{snap:?}");
    let mut restore = spec("sb-r", "sb-r-a1", None);
    restore.snapshot = Some(snap.id.clone());
    let restored = provider.create(restore).await.unwrap();
    assert_eq!(fake.sandbox(&restored.id).unwrap().image_id, snap.id);
    assert_eq!(
        provider
            .read_file(&restored.id, "/root/notes.txt")
            .await
            .unwrap(),
        b"text file\n"
    );
    provider.delete(&restored.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();
    provider.delete_snapshot(&snap.id).await.unwrap();
    assert!(!fake.images().contains(&snap.id));

    // Capabilities, list_by_tag, get.
    let caps = provider.capabilities(&id).await.unwrap();
    assert!(caps.process_execute && caps.process_ordered_output && !caps.process_cancel);
    assert!(caps.filesystem_read && caps.filesystem_write && !caps.pause_resume);
    let other = provider
        .create(spec("sb-y", "sb-y-a1", None))
        .await
        .unwrap();
    let found = provider.list_by_tag("sb-x", None).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, id);
    assert_eq!(found[0].tags.attempt_id, "sb-x-a1");
    assert!(provider
        .list_by_tag("sb-x", Some("other"))
        .await
        .unwrap()
        .is_empty());
    let got = provider.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (got.id.as_str(), got.tags.sandbox_id.as_str()),
        (id.as_str(), "sb-x")
    );
    assert!(provider.get("sb-missing").await.unwrap().is_none());

    // Delete: twice is fine, absent is fine; a deleted sandbox is gone to sandgate.
    for box_id in [&id, &other.id] {
        provider.delete(box_id).await.unwrap();
        provider.delete(box_id).await.unwrap();
    }
    provider.delete("sb-never-existed").await.unwrap();
    assert_eq!(fake.live_count(), 0, "{:?}", fake.live());
    assert!(provider.get(&id).await.unwrap().is_none());
    assert!(provider.list_by_tag("sb-x", None).await.unwrap().is_empty());
    let gone = provider.exec(&id, argv(&["true"])).await.unwrap_err();
    assert_eq!(gone.kind, OpErrorKind::Conflict, "{gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_lists_walk_every_page() {
    let fake = FakeModal::start(FakeModalConfig {
        boot_delay: Duration::ZERO,
        ..FakeModalConfig::default()
    })
    .await;
    let provider = adapter(&fake, &[]);
    // More sandboxes of one sandbox id than one of Modal's list pages holds.
    for i in 0..120 {
        provider
            .create(spec("sb-many", &format!("a{i}"), None))
            .await
            .unwrap();
    }
    let found = provider.list_by_tag("sb-many", None).await.unwrap();
    assert_eq!(found.len(), 120);
    let attempt = provider.list_by_tag("sb-many", Some("a7")).await.unwrap();
    assert_eq!(attempt.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_as_documented() {
    let fake = FakeModal::start(FakeModalConfig {
        retry_after_secs: 3,
        hang: Duration::from_millis(300),
        ..FakeModalConfig::default()
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
    let e = provider.create(spec("sb-f", "a1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Capacity, "{e}");
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit, "{e}");
    assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    assert!(!e.maybe_created);
    let e = provider.create(spec("sb-f", "a3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    let e = provider.create(spec("sb-f", "a4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::FailedBeforeRunning, "{e}");
    let failed_id = e.instance_id.clone().expect("the failed sandbox is named");
    assert!(!fake.sandbox(&failed_id).unwrap().live());
    let e = provider.create(spec("sb-f", "a5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown, "{e}");
    assert!(e.maybe_created);
    // The lost create is found by its tags; the failed one is not live.
    let deadline = Instant::now() + Duration::from_secs(5);
    let found = loop {
        let found = provider.list_by_tag("sb-f", Some("a5")).await.unwrap();
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(found.len(), 1);
    assert!(provider
        .list_by_tag("sb-f", Some("a4"))
        .await
        .unwrap()
        .is_empty());
    // Re-sending the lost create is the same sandbox (x-idempotency-key).
    let again = provider.create(spec("sb-f", "a5", None)).await.unwrap();
    assert_eq!(again.id, found[0].id);
    assert!(fake.create_log().contains(&CreateOutcome::Replayed));
    assert_eq!(fake.live_with_tag("sandgate_attempt", "a5").len(), 1);
    provider.create(spec("sb-f", "a6", None)).await.unwrap();
    assert_eq!(provider.list_by_tag("sb-f", None).await.unwrap().len(), 2);

    // A wrong token: unbound account, the secret never echoed.
    let wrong = adapter_at(&fake.url(), "ak-wrong:as-wrong-secret", &[]);
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount, "{e}");
    assert!(!e.message.contains("as-wrong-secret"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    // An image not on the account: unsupported, nothing made.
    let live = fake.live_count();
    let mut restore = spec("sb-s", "s1", None);
    restore.snapshot = Some("im-missing".into());
    let e = provider.create(restore).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    assert_eq!(fake.live_count(), live);
    // A template or a registry image Modal would have to build: unsupported before any call.
    let before = fake.create_log().len();
    for source in [
        sandgate_router::Source::Template("tpl".into()),
        sandgate_router::Source::Image("python:3.12".into()),
    ] {
        let mut s = spec("sb-t", "t1", None);
        s.request = Arc::new(sandgate_router::Request {
            source: Some(source),
            ..sandgate_router::Request::default()
        });
        let e = provider.create(s).await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Unsupported, "{e}");
    }
    assert_eq!(fake.create_log().len(), before);
    // Nothing listens: an outage, nothing created.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = adapter_at(&format!("http://127.0.0.1:{closed}"), "a:b", &[]);
    let e = down.create(spec("sb-d", "d1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage, "{e}");
    assert!(!e.maybe_created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_never_scheduled_is_capacity_naming_the_sandbox() {
    let fake = FakeModal::start(FakeModalConfig {
        boot_delay: Duration::from_secs(30),
        ..FakeModalConfig::default()
    })
    .await;
    let provider = adapter(&fake, &[("boot_timeout_secs", "1")]);
    let e = provider.create(spec("sb-b", "b1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Capacity, "{e}");
    let id = e
        .instance_id
        .expect("the unscheduled sandbox is named for cleanup");
    assert!(fake.sandbox(&id).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_beyond_modals_fixed_clock_is_reported() {
    let fake = FakeModal::start(FakeModalConfig::default()).await;
    let provider = adapter(&fake, &[("timeout_secs", "600")]);
    let id = provider.create(spec("sb-l", "l1", None)).await.unwrap().id;
    assert_eq!(fake.sandbox(&id).unwrap().timeout_secs, 600);
    provider
        .extend_lifetime(&id, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let e = provider
        .extend_lifetime(&id, Some(Duration::from_secs(3600)))
        .await
        .unwrap_err();
    assert_eq!(e.kind, OpErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("600"), "{e}");
}

// ------------------------------------------------------------------- through the gateway

const API_TOKEN: &str = "api-token-ws-a-0123456789";

struct Env {
    gw: Gateway,
    modal: FakeModal,
    blaxel: Option<FakeBlaxel>,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

/// The Modal account and pool `a-modal` on the fake (with `image_id`).
fn modal_topology(fake: &FakeModal, keys: &std::path::Path) -> String {
    let key_file = keys.join("modal.key");
    std::fs::write(&key_file, key(fake)).unwrap();
    format!(
        r#"
[[providers]]
name = "modal"

[[accounts]]
name = "modal-main"
provider = "modal"
base_url = "{url}"
api_key_file = {key:?}
options = {{ image_id = "{IMAGE}", boot_timeout_secs = 5 }}

[[pools]]
name = "a-modal"
provider = "modal"
account = "modal-main"
"#,
        url = fake.url(),
        key = key_file.display().to_string(),
    )
}

/// A Blaxel account and pool `b-blaxel`, tried after Modal.
fn blaxel_topology(fake: &FakeBlaxel, keys: &std::path::Path) -> String {
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
name = "b-blaxel"
provider = "blaxel"
account = "blaxel-main"
"#,
        url = fake.url(),
        key = key.display().to_string(),
        workspace = fake.workspace(),
    )
}

async fn start(create: &str, with_blaxel: bool) -> Env {
    init();
    let modal = FakeModal::start(FakeModalConfig {
        boot_delay: Duration::from_millis(50),
        hang: Duration::from_millis(300),
        appear_after: Duration::from_millis(200),
        ..FakeModalConfig::default()
    })
    .await;
    let blaxel = match with_blaxel {
        true => Some(FakeBlaxel::start(FakeBlaxelConfig::default()).await),
        false => None,
    };
    let keys = tempfile::tempdir().unwrap();
    let mut topology = modal_topology(&modal, keys.path());
    if let Some(blaxel) = &blaxel {
        topology.push_str(&blaxel_topology(blaxel, keys.path()));
    }
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
"#
        ),
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        modal,
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
async fn a_restricted_create_on_modal_is_locked_to_the_gateway() {
    let env = start("", false).await;
    let pools = env.get("/v1/pools").await;
    let pool = &pools["pools"][0];
    assert_eq!(pool["pool"], "a-modal", "{pools:#}");
    assert_eq!(pool["egress"], "gateway", "{pools:#}");
    let view = env
        .settled(json!({"network": {"allow_domains": ["api.a.test"]}}))
        .await;
    assert_eq!(view["state"], "running", "{view:#}");
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "a-modal", "{view:#}");
    assert_eq!(view["placement"]["provider"], "modal", "{view:#}");
    assert_eq!(view["egress"]["enforcement"], "gateway", "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = env.modal.sandbox(instance).unwrap();
    assert_eq!(sandbox.tags["sandgate_sandbox"], id);
    // Modal's own field names, the gateway's address alone, as sent and as shown.
    assert_eq!(sandbox.network_access_type, "ALLOWLIST");
    assert_eq!(sandbox.allowed_cidrs, ["127.0.0.1/32"]);
    assert!(sandbox.allowed_domains.is_empty());
    assert_eq!(
        view["placement"]["lockdown"],
        json!({"network_access": {"network_access_type": "ALLOWLIST",
            "allowed_cidrs": ["127.0.0.1/32"], "allowed_domains": []}}),
        "{view:#}"
    );
    let vars = &sandbox.env;
    assert!(vars["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    assert!(vars["HTTPS_PROXY"].ends_with("@127.0.0.1:3999"));
    assert_eq!(vars["SSL_CERT_FILE"], CA_PATH);
    assert_eq!(
        env.modal.file(instance, CA_PATH).unwrap(),
        env.gw.sandgate_ca_pem
    );
    // No secret in the sandbox: not the Modal token secret, not the API token.
    for (name, value) in vars {
        assert!(!value.contains(env.modal.token_secret()), "{name}");
        assert!(!value.contains(API_TOKEN), "{name}");
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
        env.modal.file(instance, "/root/in.txt").unwrap(),
        b"through sandgate"
    );
    // Delete through sandgate terminates at Modal.
    let r = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.modal.live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.modal.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_on_modal_advances_to_blaxel_under_one_sandbox_id() {
    let env = start(
        "provisioning_window_ms = 200\nretry_backoff_ms = 20\n",
        true,
    )
    .await;
    let blaxel = env.blaxel.as_ref().unwrap();
    env.modal
        .script(["capacity", "capacity", "capacity", "capacity", "capacity"]);
    let view = env.settled(json!({"labels": {"t": "cross"}})).await;
    assert_eq!(view["state"], "running", "{view:#}");
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "b-blaxel", "{view:#}");
    assert_eq!(view["placement"]["provider"], "blaxel");
    let attempts = view["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["pool"], "a-modal");
    assert_eq!(attempts[0]["error_class"], "capacity", "{view:#}");
    assert_eq!(env.modal.live_count(), 0, "{:?}", env.modal.live());
    let live = blaxel.live();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].labels["sandgate_sandbox"], id);
    assert_eq!(view["placement"]["instance_id"], live[0].name.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_after_send_on_modal_is_reconciled_by_tag_with_no_duplicate() {
    let env = start("", false).await;
    env.modal.script(["timeout_after_send"]);
    let view = env.settled(json!({"labels": {"t": "lost"}})).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["state"], "running", "{view:#}");
    let live = env.modal.live_with_tag("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "no duplicate: {:?}", env.modal.live());
    assert_eq!(env.modal.live_count(), 1, "{:?}", env.modal.live());
    assert_eq!(view["placement"]["instance_id"], live[0].id.as_str());
    let made: Vec<_> = env
        .modal
        .create_log()
        .into_iter()
        .filter(|o| !matches!(o, CreateOutcome::Replayed | CreateOutcome::Rejected))
        .collect();
    assert_eq!(
        made,
        vec![CreateOutcome::TimeoutAfterSend],
        "{:?}",
        env.modal.create_log()
    );
    // Adopted, then finished like a create: the CA is in place.
    let ca = env.modal.file(&live[0].id, CA_PATH);
    assert_eq!(ca.as_deref(), Some(env.gw.sandgate_ca_pem.as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failure_rows_on_the_modal_pool_are_recorded_as_documented() {
    let env = start(
        "provisioning_window_ms = 200\nretry_backoff_ms = 20\n",
        false,
    )
    .await;
    for (script, class) in [
        ("capacity", "capacity"),
        ("outage", "outage"),
        ("failed_before_running", "failed_before_running"),
    ] {
        env.modal.script([script]);
        let view = env.settled(json!({})).await;
        assert_ne!(view["state"], "running", "{script}: {view:#}");
        let first = &view["attempts"][0];
        assert_eq!(first["pool"], "a-modal", "{view:#}");
        assert_eq!(first["error_class"], class, "{script}: {view:#}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.modal.live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.modal.live_count(), 0, "{:?}", env.modal.live());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_works_for_modal() {
    let fake = FakeModal::start(FakeModalConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.key");
    let bad = dir.path().join("bad.key");
    std::fs::write(&good, key(&fake)).unwrap();
    std::fs::write(&bad, "ak-wrong:as-wrong-0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[providers]]
name = "modal"
[[accounts]]
name = "good"
provider = "modal"
base_url = "{url}"
api_key_file = {good:?}
[[accounts]]
name = "bad"
provider = "modal"
base_url = "{url}"
api_key_file = {bad:?}
[[pools]]
name = "good"
provider = "modal"
account = "good"
[[pools]]
name = "bad"
provider = "modal"
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
    assert!(stdout.contains("ok: account good (modal)"), "{stdout}");
    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unbound_account") && stderr.contains("Unauthenticated"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("as-wrong-0123456789"),
        "the secret is never printed: {stderr}"
    );
}
