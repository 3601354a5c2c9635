//! The E2B adapter through the whole gateway: sandgate's API on a real socket, pools of kind
//! `e2b` whose accounts point at fake E2B servers (`tests/it/common/fakes/e2b.rs`, proven with
//! the official SDK by `tests/it/e2b_fake.rs`) that run commands for real.
//!
//! The gateway is given `[proxy] public_url` = a relay port in front of its proxy (the
//! address a load balancer would give it), so a command inside a fake sandbox really goes
//! out through `HTTPS_PROXY` with its own identity and the CA the adapter installed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::fakes::e2b::{FakeE2b, FakeE2bConfig, SandboxState};
use crate::common::*;
use serde_json::{json, Value};

const API_TOKEN: &str = "api-token-ws-a-0123456789";
const SECRET: &str = "ghp_e2b_provider_secret_0123456789";

struct Env {
    gw: Gateway,
    fakes: Vec<FakeE2b>,
    http: reqwest::Client,
    origin: Origin,
    relay_port: u16,
    _keys: tempfile::TempDir,
}

/// `[[accounts]]` and `[[pools]]` `e2b-0`, `e2b-1`, ... one per fake, tried in name order.
fn topology(fakes: &[FakeE2b], keys: &std::path::Path) -> String {
    let mut toml = String::from("[[providers]]\nname = \"e2b\"\n");
    for (i, fake) in fakes.iter().enumerate() {
        let key = keys.join(format!("e2b-{i}.key"));
        std::fs::write(&key, format!("{}\n", fake.api_key())).unwrap();
        toml.push_str(&format!(
            r#"
[[accounts]]
name = "e2b-{i}"
provider = "e2b"
base_url = "{url}"
api_key_file = {key:?}
options = {{ sandbox_url = "{url}", template = "base", timeout_secs = 600 }}

[[pools]]
name = "e2b-{i}"
provider = "e2b"
account = "e2b-{i}"
"#,
            url = fake.url(),
            key = key.display().to_string(),
        ));
    }
    toml
}

async fn start(configs: Vec<FakeE2bConfig>, create: &str) -> Env {
    init();
    let mut fakes = Vec::new();
    for config in configs {
        fakes.push(FakeE2b::start(config).await);
    }
    let keys = tempfile::tempdir().unwrap();
    let secret_file = keys.path().join("gh.secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test", "blocked.test"]))).await;
    // The relay's port must be known before the gateway starts (it is in public_url); the
    // relay learns its target once the gateway has bound its proxy.
    let (tx, rx) = tokio::sync::oneshot::channel::<std::net::SocketAddr>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let Ok(target) = rx.await else { return };
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let gw = Gateway::start(GatewayOptions {
        identities: vec![],
        hosts: vec![("api.a.test", "127.0.0.1"), ("blocked.test", "127.0.0.1")],
        upstream_ca: Some(ca.pem_path.clone()),
        proxy_toml: format!("public_url = \"http://127.0.0.1:{relay_port}\"\n"),
        extra_toml: format!(
            r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"

[[credentials]]
workspace = "ws-a"
name = "gh"
secret_file = {secret:?}
placeholder_env = "GH_TOKEN"
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}

[create]
short_wait_ms = 8000
janitor_interval_ms = 100
{create}
{topology}
"#,
            topology = topology(&fakes, keys.path()),
            secret = secret_file.display().to_string(),
            port = origin.addr.port(),
        ),
        ..GatewayOptions::default()
    })
    .await;
    tx.send(gw.server.proxy_addr()).unwrap();
    // Keep the test CA's files alive as long as the gateway trusts them.
    std::mem::forget(ca);
    Env {
        gw,
        fakes,
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        origin,
        relay_port,
        _keys: keys,
    }
}

impl Env {
    async fn create(&self, body: Value) -> (reqwest::StatusCode, Value) {
        let response = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(API_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn get(&self, id: &str) -> Value {
        self.http
            .get(self.gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Runs `sh -c script` in the sandbox: (stdout, stderr, exit code, events).
    async fn sh(&self, id: &str, script: &str) -> (String, String, i64, Vec<Value>) {
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
        let events: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (mut out, mut err, mut code) = (String::new(), String::new(), -1);
        for e in &events {
            match e["type"].as_str() {
                Some("stdout") => out.push_str(e["text"].as_str().unwrap_or_default()),
                Some("stderr") => err.push_str(e["text"].as_str().unwrap_or_default()),
                Some("exit") => code = e["code"].as_i64().unwrap_or(-1),
                _ => {}
            }
        }
        (out, err, code, events)
    }

    async fn wait_running(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view = self.get(id).await;
            if view["state"] == "running" || Instant::now() > deadline {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn created_id(status: reqwest::StatusCode, body: &Value) -> String {
    assert!(status == 201 || status == 202, "{status}: {body:#}");
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restricted_create_lands_on_e2b_locked_to_the_gateway() {
    let env = start(vec![FakeE2bConfig::default()], "").await;
    let (status, body) = env
        .create(json!({
            "network": {"allow_domains": ["api.a.test"]},
            "credentials": ["gh"],
            "labels": {"t": "lock"},
        }))
        .await;
    let id = created_id(status, &body);
    assert_eq!(status, 201, "{body:#}");
    let token = body["egress"]["token"].as_str().unwrap().to_string();
    let fake = &env.fakes[0];
    let instance = body["placement"]["instance_id"].as_str().unwrap();
    let sandbox = fake.sandbox(instance).expect("the instance is at the fake");

    // Lock-down: every IPv4 destination denied, the gateway's advertised host allowed.
    assert_eq!(sandbox.deny_out, vec!["0.0.0.0/0".to_string()]);
    assert_eq!(sandbox.allow_out, vec!["127.0.0.1".to_string()]);
    assert_eq!(sandbox.metadata["sandgate_sandbox"], id);
    assert!(sandbox.metadata["sandgate_attempt"].starts_with(&id));
    // Its proxy is the public URL with its own identity; the CA is where the variables say.
    let proxy = format!("http://{id}:{token}@127.0.0.1:{}", env.relay_port);
    for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(sandbox.env_vars[var], proxy, "{var}");
    }
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "CURL_CA_BUNDLE",
    ] {
        assert_eq!(
            sandbox.env_vars[var], "/home/user/.sandgate/ca.pem",
            "{var}"
        );
    }
    let ca = fake
        .file(instance, "/home/user/.sandgate/ca.pem")
        .expect("the CA file was written through envd");
    assert_eq!(ca, env.gw.sandgate_ca_pem);
    // The credential is a placeholder in the sandbox; the secret is nowhere in it.
    assert!(
        sandbox.env_vars["GH_TOKEN"].starts_with("sgph_"),
        "{:?}",
        sandbox.env_vars
    );
    assert!(sandbox.env_vars.values().all(|v| !v.contains(SECRET)));
    let (found, _, _, _) = env
        .sh(
            &id,
            &format!("grep -rl {SECRET} \"$HOME\" 2>/dev/null; true"),
        )
        .await;
    assert!(found.trim().is_empty(), "the secret is in a file: {found}");

    // The view names the instance and the lock-down, and never the token.
    let view = env.get(&id).await;
    assert_eq!(view["placement"]["provider"], "e2b");
    assert_eq!(view["placement"]["instance_id"], instance);
    assert_eq!(
        view["placement"]["lockdown"],
        json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["127.0.0.1"]})
    );
    assert_eq!(view["egress"]["enforcement"], "gateway");
    assert_eq!(
        view["egress"]["proxy_url"],
        format!("http://{id}:{{token}}@127.0.0.1:{}", env.relay_port)
    );
    assert!(!view.to_string().contains(&token));

    // A command inside the sandbox goes out through the gateway as this sandbox: allowed
    // where the policy allows, refused elsewhere.
    let port = env.origin.addr.port();
    let (out, err, code, _) = env
        .sh(
            &id,
            &format!("curl -sS --cacert \"$HOME/.sandgate/ca.pem\" -H \"Authorization: Bearer $GH_TOKEN\" https://api.a.test:{port}/from-e2b"),
        )
        .await;
    assert_eq!(code, 0, "stdout {out} stderr {err}");
    assert!(out.contains("/from-e2b"), "{out}");
    let seen = env.origin.last().unwrap();
    assert_eq!(seen.path, "/from-e2b");
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {SECRET}"),
        "the secret was injected outside the sandbox"
    );
    let (out, _, code, _) = env
        .sh(
            &id,
            &format!("curl -sS -o /dev/null -w '%{{http_code}}' --cacert \"$HOME/.sandgate/ca.pem\" https://blocked.test:{port}/"),
        )
        .await;
    assert_ne!(code, 0, "a CONNECT the policy refuses fails: {out}");
    let decisions = env.gw.decisions(2).await;
    assert!(
        decisions.iter().any(|d| d["sandbox"] == id.as_str()
            && d["host"] == "blocked.test"
            && d["decision"] == "deny"),
        "{decisions:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_files_lifecycle_and_delete() {
    let env = start(vec![FakeE2bConfig::default()], "").await;
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let instance = body["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    let fake = &env.fakes[0];

    // Streamed in order, with the exit code.
    let (out, err, code, events) = env
        .sh(
            &id,
            "printf one; sleep 0.2; printf two >&2; sleep 0.2; printf three; exit 3",
        )
        .await;
    assert_eq!((out.as_str(), err.as_str(), code), ("onethree", "two", 3));
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"started"));
    assert_eq!(kinds.last(), Some(&"exit"));
    let order: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "stdout" || e["type"] == "stderr")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(order, vec!["one", "two", "three"]);

    // Files round trip through envd.
    let url = env.gw.api(&format!(
        "/v1/sandboxes/{id}/files/content?path=/home/user/notes/a.bin"
    ));
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let r = env
        .http
        .put(&url)
        .bearer_auth(API_TOKEN)
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert_eq!(
        fake.file(&instance, "/home/user/notes/a.bin").unwrap(),
        data
    );
    let r = env
        .http
        .get(&url)
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().to_vec(), data);
    let missing = env
        .http
        .get(
            env.gw
                .api(&format!("/v1/sandboxes/{id}/files/content?path=/nope")),
        )
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    // Pause and resume are E2B's; stop is not.
    for (op, state) in [
        ("pause", SandboxState::Paused),
        ("resume", SandboxState::Running),
    ] {
        let r = env
            .http
            .post(env.gw.api(&format!("/v1/sandboxes/{id}/{op}")))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{op}: {}", r.text().await.unwrap());
        assert_eq!(fake.sandbox(&instance).unwrap().state, state, "{op}");
    }
    let r = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/stop")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unsupported");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("e2b"),
        "{body}"
    );

    let r = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_eq!(fake.sandbox(&instance).unwrap().state, SandboxState::Killed);
    assert_eq!(fake.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_advances_to_the_next_account_under_one_sandbox_id() {
    let env = start(
        vec![FakeE2bConfig::default(), FakeE2bConfig::default()],
        "provisioning_window_ms = 200\nretry_backoff_ms = 20\n",
    )
    .await;
    env.fakes[0].script(["capacity", "capacity", "capacity", "capacity", "capacity"]);
    let (status, body) = env.create(json!({"labels": {"t": "failover"}})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "e2b-1", "{view:#}");
    let attempts = view["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["pool"], "e2b-0");
    assert_eq!(attempts[0]["error_class"], "capacity", "{view:#}");
    assert_eq!(env.fakes[0].live_count(), 0);
    assert_eq!(env.fakes[1].live_count(), 1);
    assert_eq!(env.fakes[1].live()[0].metadata["sandgate_sandbox"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_is_retried_after_retry_after() {
    let env = start(
        vec![FakeE2bConfig {
            retry_after_secs: 1,
            ..FakeE2bConfig::default()
        }],
        "provisioning_window_ms = 5000\nretry_backoff_ms = 20\n",
    )
    .await;
    env.fakes[0].script(["rate_limit", "ok"]);
    let started = Instant::now();
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["state"], "running", "{view:#}");
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "retried before Retry-After: {:?}",
        started.elapsed()
    );
    assert_eq!(view["attempts"].as_array().unwrap().len(), 1, "{view:#}");
    assert_eq!(env.fakes[0].create_attempts(), 2);
    assert_eq!(env.fakes[0].live_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_whose_answer_is_lost_is_reconciled_by_tag_without_a_duplicate() {
    let env = start(
        vec![
            FakeE2bConfig {
                hang: Duration::from_millis(300),
                appear_after: Duration::from_millis(600),
                ..FakeE2bConfig::default()
            },
            FakeE2bConfig::default(),
        ],
        "reconcile_window_ms = 3000\nprovisioning_window_ms = 200\n",
    )
    .await;
    env.fakes[0].script(["timeout_after_send"]);
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "e2b-0", "{view:#}");
    assert_eq!(env.fakes[0].live_count(), 1, "{:?}", env.fakes[0].live());
    assert_eq!(env.fakes[1].live_count(), 0, "nothing created elsewhere");
    assert_eq!(
        view["placement"]["instance_id"],
        env.fakes[0].live()[0].sandbox_id.as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_instance_is_deleted_by_the_janitor() {
    let env = start(
        vec![
            FakeE2bConfig {
                hang: Duration::from_millis(200),
                appear_after: Duration::from_millis(3000),
                ..FakeE2bConfig::default()
            },
            FakeE2bConfig::default(),
        ],
        "reconcile_window_ms = 400\nprovisioning_window_ms = 200\n",
    )
    .await;
    env.fakes[0].script(["timeout_after_send"]);
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["placement"]["pool"], "e2b-1", "{view:#}");
    // The abandoned attempt's instance shows up after the window; the janitor removes it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.fakes[0].live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.fakes[0].live_count(), 0, "{:?}", env.fakes[0].live());
    assert_eq!(env.fakes[1].live_count(), 1);
}

fn sandgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandgate"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_check_reports_whether_the_account_works() {
    let fake = FakeE2b::start(FakeE2bConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.key");
    let bad = dir.path().join("bad.key");
    std::fs::write(&good, fake.api_key()).unwrap();
    std::fs::write(&bad, "e2b_wrong_key_0123456789").unwrap();
    let config = dir.path().join("sandgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[providers]]
name = "e2b"
[[accounts]]
name = "good"
provider = "e2b"
base_url = "{url}"
api_key_file = {good:?}
[[accounts]]
name = "bad"
provider = "e2b"
base_url = "{url}"
api_key_file = {bad:?}
[[pools]]
name = "good"
provider = "e2b"
account = "good"
[[pools]]
name = "bad"
provider = "e2b"
account = "bad"
"#,
            url = fake.url(),
            good = good.display().to_string(),
            bad = bad.display().to_string(),
        ),
    )
    .unwrap();
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
    assert!(stdout.contains("ok: account good (e2b)"), "{stdout}");

    let out = run("bad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("account bad (e2b)"), "{stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    assert!(
        !stderr.contains("e2b_wrong_key"),
        "the key is never printed: {stderr}"
    );

    let out = run("nobody");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no account \"nobody\""));
}

/// `kill -9` of the real binary while E2B holds the create's answer, then a restart on the
/// same data: the create resumes, finds the instance by its tags, and exactly one instance
/// is live across every account.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_gateway_mid_create_leaves_exactly_one_live_instance() {
    init();
    let fakes = vec![
        FakeE2b::start(FakeE2bConfig {
            hang: Duration::from_secs(3),
            ..FakeE2bConfig::default()
        })
        .await,
        FakeE2b::start(FakeE2bConfig::default()).await,
    ];
    fakes[0].script(["timeout_after_send"]);
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        r#"
[[api.tokens]]
token = "{API_TOKEN}"
principal = "alice"
workspace = "ws-a"
[create]
short_wait_ms = 100
lease_ttl_ms = 1000
janitor_interval_ms = 100
reconcile_window_ms = 5000
provisioning_window_ms = 2000
{topology}
"#,
        topology = topology(&fakes, dir.path()),
    );
    let config = dir.path().join("sandgate.toml");
    std::fs::write(&config, process_config(dir.path(), "", "", &extra)).unwrap();
    let serve = || {
        let mut command = std::process::Command::new(sandgate_bin());
        command.args(["serve", "--config"]).arg(&config);
        serve_process(command)
    };
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut first = serve();
    let r = http
        .post(format!("http://{}/v1/sandboxes", first.api))
        .bearer_auth(API_TOKEN)
        .json(&json!({"labels": {"t": "restart"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fakes[0].create_attempts() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fakes[0].create_attempts(), 1, "the create reached E2B");
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);

    let second = serve();
    let deadline = Instant::now() + Duration::from_secs(30);
    let view = loop {
        let view: Value = http
            .get(format!("http://{}/v1/sandboxes/{id}", second.api))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let settled = !matches!(view["state"].as_str(), Some("provisioning" | "pending"));
        if settled || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["state"], "running", "{view:#}");
    let live: usize = fakes.iter().map(FakeE2b::live_count).sum();
    assert_eq!(live, 1, "{:?} {:?}", fakes[0].live(), fakes[1].live());
    assert_eq!(
        view["placement"]["instance_id"],
        fakes[0].live()[0].sandbox_id.as_str(),
        "{view:#}"
    );
}

/// A request through the gateway's public proxy as sandbox `id`: the status the proxy answers.
async fn proxy_status(env: &Env, id: &str, token: &str) -> u16 {
    let proxy = reqwest::Proxy::all(format!("http://127.0.0.1:{}", env.relay_port))
        .unwrap()
        .basic_auth(id, token);
    let client = reqwest::Client::builder()
        .proxy(proxy)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("http://api.a.test:{}/alive", env.origin.addr.port());
    match client.get(url).send().await {
        Ok(r) => r.status().as_u16(),
        Err(e) => panic!("proxy request failed: {e}"),
    }
}

async fn wait_state(env: &Env, id: &str, state: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let view = env.get(id).await;
        if view["state"] == state || Instant::now() > deadline {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sandboxs_lifetime_is_e2bs_timeout_too() {
    let env = start(vec![FakeE2bConfig::default()], "").await;
    let fake = &env.fakes[0];
    let margin = 120;

    // A lifetime of two hours is E2B's timeout (plus the margin by which sandgate's own
    // expiry comes first), not the account's 600 s.
    let (status, body) = env.create(json!({"ttl_secs": 7200})).await;
    let id = created_id(status, &body);
    let instance = body["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    let set = fake.sandbox(&instance).unwrap().timeout_secs;
    assert!((7200 + margin - 2..=7200 + margin).contains(&set), "{set}");

    // Moving the lifetime moves E2B's timeout, shorter as well as longer.
    for ttl in [900u64, 20_000] {
        let r = env
            .http
            .post(env.gw.api(&format!("/v1/sandboxes/{id}/timeout")))
            .bearer_auth(API_TOKEN)
            .json(&json!({"ttl_secs": ttl}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let set = fake.sandbox(&instance).unwrap().timeout_secs;
        // The store's clock and the request's take a moment: within two seconds.
        assert!(
            (ttl + margin - 2..=ttl + margin).contains(&set),
            "ttl {ttl}: E2B timeout {set}"
        );
    }

    // Without a lifetime, the account's timeout, which the liveness pass keeps refreshing.
    let (status, body) = env.create(json!({})).await;
    created_id(status, &body);
    let other = body["placement"]["instance_id"].as_str().unwrap();
    assert_eq!(fake.sandbox(other).unwrap().timeout_secs, 600);
    let timeouts_before = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with(&format!("{other}/timeout")))
        .count();
    env.gw.server.sandboxes.liveness_pass().await;
    let timeouts_after = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with(&format!("{other}/timeout")))
        .count();
    assert_eq!(timeouts_after, timeouts_before + 1, "a pass refreshes it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_its_provider_ended_is_failed_with_the_reason_and_loses_its_egress() {
    // The periodic pass notices it.
    let env = start(vec![FakeE2bConfig::default()], "liveness_interval_secs = 1").await;
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let token = body["egress"]["token"].as_str().unwrap().to_string();
    let instance = body["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Known to the proxy (its policy answers; 407 would mean an unknown identity).
    assert_ne!(proxy_status(&env, &id, &token).await, 407);

    assert!(
        env.fakes[0].expire(&instance),
        "E2B ends it on its own clock"
    );
    let view = wait_state(&env, &id, "failed", Duration::from_secs(10)).await;
    assert_eq!(view["state"], "failed", "{view:#}");
    assert_eq!(view["error"]["error"]["code"], "instance_lost", "{view:#}");
    assert_eq!(view["error"]["error"]["details"]["instance_id"], instance);
    assert!(
        view["error"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("provider ended"),
        "{view:#}"
    );
    assert_eq!(proxy_status(&env, &id, &token).await, 407, "egress revoked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_exec_on_an_ended_instance_marks_the_sandbox_at_once() {
    // No periodic pass: only the failed operation can notice it.
    let env = start(vec![FakeE2bConfig::default()], "liveness_interval_secs = 0").await;
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let token = body["egress"]["token"].as_str().unwrap().to_string();
    let instance = body["placement"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(proxy_status(&env, &id, &token).await, 407);
    assert!(env.fakes[0].expire(&instance));
    // Still `running` in sandgate's record until something looks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.get(&id).await["state"], "running");

    let r = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{id}/exec")))
        .bearer_auth(API_TOKEN)
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .unwrap();
    assert!(!r.status().is_success(), "{}", r.status());
    let view = wait_state(&env, &id, "failed", Duration::from_secs(5)).await;
    assert_eq!(view["state"], "failed", "{view:#}");
    assert_eq!(view["error"]["error"]["code"], "instance_lost");
    assert_eq!(proxy_status(&env, &id, &token).await, 407);
}

/// Issue 25 item 6: a `Retry-After` that ends past the provisioning window is not waited for
/// (nor ignored): the route advances to the next pool at once, in either of its forms (an
/// HTTP-date was not understood, and the pool was called every `retry_backoff_ms` instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_past_the_provisioning_window_advances_at_once() {
    let env = start(
        vec![
            FakeE2bConfig {
                retry_after_secs: 60,
                retry_after_as_date: true,
                ..FakeE2bConfig::default()
            },
            FakeE2bConfig {
                retry_after_secs: 60,
                ..FakeE2bConfig::default()
            },
            FakeE2bConfig::default(),
        ],
        "provisioning_window_ms = 5000\nretry_backoff_ms = 20\n",
    )
    .await;
    env.fakes[0].script(["rate_limit"]);
    env.fakes[1].script(["rate_limit"]);
    let started = Instant::now();
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    let took = started.elapsed();
    let calls: Vec<usize> = env.fakes.iter().map(|f| f.create_attempts()).collect();
    println!("create calls per pool {calls:?} in {took:?}");
    assert_eq!(view["placement"]["pool"], "e2b-2", "{calls:?}: {view:#}");
    assert_eq!(calls, [1, 1, 1], "{view:#}");
    assert!(took < Duration::from_secs(3), "held for {took:?}");
    for a in &view["attempts"].as_array().unwrap()[..2] {
        assert_eq!(a["error_class"], "rate_limit", "{view:#}");
        let message = a["message"].as_str().unwrap();
        assert!(
            message.contains("Retry-After") && message.contains("provisioning window"),
            "{message}"
        );
    }
}

/// Issue 25 item 6: a retry that succeeded left no trace of the failure before it. E2B applies
/// a create and answers 500; the retry (same `Idempotency-Key`) is answered with the same
/// sandbox. The attempt record shows the retry and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_500_then_a_success_on_retry_is_in_the_attempt_record() {
    let env = start(
        vec![FakeE2bConfig::default()],
        "provisioning_window_ms = 5000\nretry_backoff_ms = 20\n",
    )
    .await;
    env.fakes[0].script(["applied_then_500"]);
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["state"], "running", "{view:#}");
    let attempts = view["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{view:#}");
    let retries = attempts[0]["retries"].as_array().expect("retries recorded");
    assert_eq!(retries.len(), 1, "{view:#}");
    assert_eq!(retries[0]["error_class"], "provider_error");
    assert!(retries[0]["message"].as_str().unwrap().contains("500"));
    assert!(retries[0]["wait_ms"].as_u64().unwrap() >= 20);
    assert!(retries[0]["at_ms"].as_i64().unwrap() >= attempts[0]["started_ms"].as_i64().unwrap());
    let log: Vec<_> = env.fakes[0]
        .create_log()
        .iter()
        .map(|c| c.outcome)
        .collect();
    use crate::common::fakes::e2b::CreateOutcome;
    assert_eq!(
        log,
        [CreateOutcome::AppliedThen500, CreateOutcome::Replayed],
        "the retry replayed the applied create"
    );
    assert_eq!(env.fakes[0].live_count(), 1, "no duplicate");
    assert_eq!(
        view["placement"]["instance_id"],
        env.fakes[0].live()[0].sandbox_id.as_str()
    );

    // A 500 that made nothing, then a success: the same trace.
    env.fakes[0].script(["server_error"]);
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["state"], "running", "{view:#}");
    let retries = view["attempts"][0]["retries"].as_array().unwrap();
    assert_eq!(retries.len(), 1, "{view:#}");
    assert_eq!(retries[0]["error_class"], "provider_error");
    assert_eq!(env.fakes[0].live_count(), 2);
}

/// Issue 25 item 9: the janitor listed an abandoned attempt at every pass (every
/// `janitor_interval_ms`) for `abandoned_watch_secs`. Now the pauses double from the interval
/// up to `abandoned_check_max_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_janitor_backs_off_on_an_abandoned_attempt() {
    let env = start(
        vec![
            FakeE2bConfig {
                hang: Duration::from_millis(200),
                // Never listed while the test runs: the janitor keeps looking.
                appear_after: Duration::from_secs(600),
                ..FakeE2bConfig::default()
            },
            FakeE2bConfig::default(),
        ],
        "reconcile_window_ms = 300\nprovisioning_window_ms = 200\n",
    )
    .await;
    env.fakes[0].script(["timeout_after_send"]);
    let (status, body) = env.create(json!({})).await;
    let id = created_id(status, &body);
    let view = env.wait_running(&id).await;
    assert_eq!(view["placement"]["pool"], "e2b-1", "{view:#}");
    assert_eq!(view["attempts"][0]["state"], "abandoned", "{view:#}");
    // janitor_interval_ms = 100: one listing per pass would be ~30 in 3 s; backing off from
    // 100 ms (0, 0.1, 0.3, 0.7, 1.5, 3.1 s) it is about 5.
    let before = env.fakes[0].list_calls();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listings = env.fakes[0].list_calls() - before;
    println!("janitor listings of one abandoned attempt in 3 s: {listings}");
    assert!(listings >= 2, "the janitor still looks: {listings}");
    assert!(listings <= 7, "{listings} listings in 3 s");
}
