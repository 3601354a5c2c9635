//! The Cloudflare adapter (`sandgate::providers::cloudflare`) driven through the `Provider`
//! trait against the fake bridge Worker (`tests/it/common/fakes/cloudflare.rs`) over a real
//! socket: create/get/list/delete, exec in order with the exit code, files, the lock-down
//! and the environment the sandbox gets, and each row of the failure table; then the fake's
//! answers checked against the bridge's TypeScript contract, and one restricted create through
//! a real `sandgate serve`.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::fakes::cloudflare::FakeCloudflare;
use sandgate::credentials::Secret;
use sandgate::providers::cloudflare::{sandbox_name, Cloudflare, CloudflareAccount, CA_PATH};
use sandgate::providers::ops::{ExecEvent, ExecSpec};
use sandgate::providers::{CreateSpec, ErrorClass, Provider, RemoteEgress, Tags};
use serde_json::json;

const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBfakeCloudflareCA\n-----END CERTIFICATE-----\n";

fn adapter(fake: &FakeCloudflare, token: &str) -> Cloudflare {
    common::init();
    let options = BTreeMap::from([("create_timeout_secs".to_string(), "2".to_string())]);
    let account = CloudflareAccount::from_options(
        Some(&fake.url()),
        &options,
        Secret::new(token.to_string()),
    )
    .expect("account options");
    Cloudflare::new(account, sandgate::tls::upstream_client_config(&[]).unwrap()).unwrap()
}

fn egress(lock_down: bool) -> RemoteEgress {
    RemoteEgress {
        proxy_url: "https://sb-1:0123abcd@gw.example:3128".to_string(),
        gateway_host: "gw.example".to_string(),
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
        pool: "cloudflare-1".into(),
        account: "cloudflare".into(),
        request: Arc::new(sandgate_router::Request::default()),
        env: BTreeMap::from([("SANDGATE_CRED_GH".to_string(), "placeholder-gh".to_string())]),
        snapshot: None,
        egress,
    }
}

/// A command's stdout, stderr and exit code, every event in order.
async fn run(provider: &Cloudflare, id: &str, argv: &[&str]) -> (String, String, Option<i32>) {
    let spec = ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..ExecSpec::default()
    };
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
                    String::from_utf8(out).unwrap(),
                    String::from_utf8(err).unwrap(),
                    info.code,
                );
            }
            None => panic!("the stream ended without Exit"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_sandbox_from_create_to_delete() {
    let fake = FakeCloudflare::start().await;
    let cf = adapter(&fake, fake.token());
    let made = cf
        .create(spec("sb-1", "sb-1-a1", Some(egress(true))))
        .await
        .expect("create");
    assert_eq!(made.id, sandbox_name("sb-1-a1"));

    // The lock-down, in the bridge's field names, as the fake received it and as shown.
    let sandbox = fake.sandbox(&made.id).expect("in the inventory");
    let locked = json!({"enableInternet": false, "allowedHosts": ["gw.example"]});
    assert_eq!(sandbox.outbound, locked);
    assert_eq!(cf.lockdown(&egress(true)), Some(locked));
    assert_eq!(sandbox.labels["sandgate_sandbox"], "sb-1");
    assert_eq!(sandbox.labels["sandgate_attempt"], "sb-1-a1");
    // Proxy and CA variables present; the CA written through the files API.
    assert_eq!(
        sandbox.env["HTTPS_PROXY"],
        "https://sb-1:0123abcd@gw.example:3128"
    );
    assert!(
        sandbox.env.values().any(|v| v == CA_PATH),
        "{:?}",
        sandbox.env
    );
    assert_eq!(
        fake.file(&made.id, CA_PATH).as_deref(),
        Some(CA_PEM.as_bytes())
    );
    // The bridge's token is nowhere in the sandbox.
    for (k, v) in &sandbox.env {
        assert!(
            !v.contains(fake.token()) && !k.contains(fake.token()),
            "{k}"
        );
    }
    for (path, bytes) in fake.files(&made.id) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(fake.token()),
            "{path}"
        );
    }

    let got = cf.get(&made.id).await.unwrap().expect("get finds it");
    assert_eq!(got.tags.attempt_id, "sb-1-a1");
    let listed = cf.list_by_tag("sb-1", None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(cf
        .list_by_tag("sb-1", Some("other"))
        .await
        .unwrap()
        .is_empty());
    assert!(cf.list_by_tag("sb-2", None).await.unwrap().is_empty());

    // A create re-sent for the same attempt is the same sandbox, not a second one.
    let again = cf
        .create(spec("sb-1", "sb-1-a1", Some(egress(true))))
        .await
        .unwrap();
    assert_eq!(again.id, made.id);
    assert_eq!(fake.sandboxes().len(), 1);

    let (out, err, code) = run(
        &cf,
        &made.id,
        &["sh", "-c", "echo one; echo two; echo bad >&2; exit 3"],
    )
    .await;
    assert_eq!(out, "one\ntwo\n");
    assert_eq!(err, "bad\n");
    assert_eq!(code, Some(3));

    let blob: Vec<u8> = (0u8..=255).collect();
    cf.write_file(&made.id, "/workspace/dir/blob.bin", blob.clone())
        .await
        .unwrap();
    assert_eq!(
        cf.read_file(&made.id, "/workspace/dir/blob.bin")
            .await
            .unwrap(),
        blob
    );
    let (out, _, code) = run(&cf, &made.id, &["wc", "-c", "/workspace/dir/blob.bin"]).await;
    assert_eq!(code, Some(0));
    assert!(out.starts_with("256"), "{out}");

    cf.delete(&made.id).await.unwrap();
    assert!(cf.get(&made.id).await.unwrap().is_none());
    cf.delete(&made.id).await.expect("absent is deleted");
    assert!(cf.list_by_tag("sb-1", None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advisory_sandbox_is_open_with_the_variables() {
    let fake = FakeCloudflare::start().await;
    let cf = adapter(&fake, fake.token());
    let made = cf
        .create(spec("sb-2", "sb-2-a1", Some(egress(false))))
        .await
        .unwrap();
    let sandbox = fake.sandbox(&made.id).unwrap();
    assert_eq!(
        sandbox.outbound,
        json!({"enableInternet": true, "allowedHosts": []})
    );
    assert!(sandbox.env.contains_key("HTTPS_PROXY"));
    assert!(cf.lockdown(&egress(false)).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_table_over_the_socket() {
    let fake = FakeCloudflare::start().await;
    let cf = adapter(&fake, fake.token());
    fake.script([
        "capacity",
        "rate_limit",
        "outage",
        "internal",
        "timeout_after_send",
    ]);
    let e = cf.create(spec("sb-f", "f1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Capacity);
    assert!(!e.maybe_created);
    assert_eq!(e.retry_after, Some(Duration::from_secs(5)));
    let e = cf.create(spec("sb-f", "f2", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::RateLimit);
    assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
    let e = cf.create(spec("sb-f", "f3", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Outage);
    let e = cf.create(spec("sb-f", "f4", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::ProviderError);
    assert!(e.maybe_created);
    let e = cf.create(spec("sb-f", "f5", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Unknown);
    assert!(e.maybe_created);
    // The two that were made are found by tag; nothing else is.
    let found = cf.list_by_tag("sb-f", None).await.unwrap();
    let mut attempts: Vec<_> = found.iter().map(|i| i.tags.attempt_id.clone()).collect();
    attempts.sort();
    assert_eq!(attempts, ["f4", "f5"]);
    assert_eq!(fake.creates(), 5);

    let wrong = adapter(&fake, "wrong-token");
    let e = wrong.create(spec("sb-w", "w1", None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::UnboundAccount);
    assert!(!e.message.contains("wrong-token"), "{e}");
    assert_eq!(
        wrong.check().await.unwrap_err().class,
        ErrorClass::UnboundAccount
    );
    assert!(cf.check().await.is_ok());
}

/// The fake's answers, as a TypeScript module annotating each with the bridge's own type from
/// `deploy/cloudflare/src/api.ts`. An object literal is checked exactly against its annotation
/// (literal unions, excess properties), so `deploy/cloudflare/check.sh` (run by `.ci/run`)
/// fails when the fake answers something the bridge's contract does not allow.
async fn fake_samples() -> String {
    let fake = FakeCloudflare::start().await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{}{path}", fake.url()))
            .bearer_auth(fake.token())
    };
    // What the adapter itself sends for a locked sandbox, and the fake's answer to it.
    let cf = adapter(&fake, fake.token());
    let made = cf
        .create(spec("sb-s", "sample", Some(egress(true))))
        .await
        .expect("create");
    let create = fake
        .create_bodies()
        .pop()
        .expect("the adapter's create body");
    let created: serde_json::Value =
        call(reqwest::Method::GET, &format!("/v1/sandbox/{}", made.id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let listed: serde_json::Value = call(
        reqwest::Method::GET,
        "/v1/sandbox?label=sandgate_sandbox=sb-s",
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let stream = call(
        reqwest::Method::POST,
        &format!("/v1/sandbox/{}/exec", made.id),
    )
    .json(&json!({"command": "echo out; echo err >&2; exit 2"}))
    .send()
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let events: Vec<serde_json::Value> = stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let missing: serde_json::Value = call(reqwest::Method::GET, "/v1/sandbox/sg-none")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    fake.script(["capacity"]);
    let capacity: serde_json::Value = call(reqwest::Method::POST, "/v1/sandbox")
        .json(&create)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap();
    format!(
        "// Generated by tests/it/cloudflare_fake.rs (the_fakes_answers_are_the_bridges_types) from\n\
         // the fake bridge's real answers; regenerate with SANDGATE_UPDATE_SAMPLES=1. Typechecked\n\
         // by check.sh against the bridge's contract.\n\
         import type {{ CreateSandboxRequest, ErrorResponse, ExecStreamEvent, ListSandboxesResponse, SandboxInfo }} from \"../src/api\";\n\n\
         export const createRequest: CreateSandboxRequest = {};\n\n\
         export const created: SandboxInfo = {};\n\n\
         export const listed: ListSandboxesResponse = {};\n\n\
         export const execEvents: ExecStreamEvent[] = {};\n\n\
         export const notFound: ErrorResponse = {};\n\n\
         export const capacity: ErrorResponse = {};\n",
        pretty(&create),
        pretty(&created),
        pretty(&listed),
        pretty(&serde_json::Value::Array(events)),
        pretty(&missing),
        pretty(&capacity),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fakes_answers_are_the_bridges_types() {
    common::init();
    let samples = fake_samples().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/cloudflare/test/fake-samples.ts");
    if std::env::var_os("SANDGATE_UPDATE_SAMPLES").is_some() {
        std::fs::write(&path, &samples).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed, samples,
        "deploy/cloudflare/test/fake-samples.ts is not what the fake answers: regenerate it \
         (SANDGATE_UPDATE_SAMPLES=1 cargo test --test it -- cloudflare) and run deploy/cloudflare/check.sh"
    );
}

/// Through a real `sandgate serve`: a restricted create on a `cloudflare` pool is locked to the
/// gateway, `GET /v1/sandboxes/{id}` shows the lock-down in the bridge's field names, and the
/// sandbox gets the proxy variables with its own identity and sandgate's CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restricted_create_through_the_gateway_is_locked() {
    common::init();
    let fake = FakeCloudflare::start().await;
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("cloudflare.key");
    std::fs::write(&key, fake.token()).unwrap();
    const API_TOKEN: &str = "api-token-ws-a-0123456789";
    let gw = common::Gateway::start(common::GatewayOptions {
        identities: vec![],
        // The advertised proxy address; this test does not dial it.
        proxy_toml: "public_url = \"http://127.0.0.1:3999\"\n".into(),
        extra_toml: format!(
            r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 8000

[[providers]]
name = "cloudflare"

[[accounts]]
name = "cf-main"
provider = "cloudflare"
base_url = "{url}"
api_key_file = {key:?}

[[pools]]
name = "cf"
provider = "cloudflare"
account = "cf-main"
"#,
            url = fake.url(),
            key = key.display().to_string(),
        ),
        ..common::GatewayOptions::default()
    })
    .await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let created: serde_json::Value = http
        .post(gw.api("/v1/sandboxes"))
        .bearer_auth(API_TOKEN)
        .json(&json!({"network": {"allow_domains": ["api.a.test"]}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created:#}"))
        .to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let view = loop {
        let view: serde_json::Value = http
            .get(gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let placing = ["pending", "provisioning", "reconciling"]
            .contains(&view["state"].as_str().unwrap_or_default());
        if !placing || std::time::Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "cf", "{view:#}");
    assert_eq!(view["egress"]["enforcement"], "gateway", "{view:#}");
    let locked = json!({"enableInternet": false, "allowedHosts": ["127.0.0.1"]});
    assert_eq!(view["placement"]["lockdown"], locked, "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = fake
        .sandbox(instance)
        .expect("the sandbox is in the fake's inventory");
    assert_eq!(sandbox.outbound, locked);
    assert_eq!(sandbox.labels["sandgate_sandbox"], id);
    assert!(sandbox.env["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    assert_eq!(
        fake.file(instance, &sandbox.env["SSL_CERT_FILE"])
            .as_deref(),
        Some(&gw.sandgate_ca_pem[..])
    );
    for (k, v) in &sandbox.env {
        assert!(!v.contains(fake.token()), "{k}");
    }
}
