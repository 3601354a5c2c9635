//! Across hosted providers, through the whole gateway: a pool of kind `e2b` and one of kind
//! `daytona`, each account pointing at its fake (`tests/it/common/fakes`, each proven with the
//! provider's official SDK). Failover crosses providers under one sandbox id, a restricted
//! create is locked down on Daytona too, and a sandbox continues on another provider from a
//! filesystem export (a provider snapshot cannot cross).

use std::time::{Duration, Instant};

use crate::common::fakes::daytona::{FakeDaytona, FakeDaytonaConfig};
use crate::common::fakes::e2b::{FakeE2b, FakeE2bConfig};
use crate::common::fakes::runloop::{FakeRunloop, FakeRunloopConfig};
use crate::common::fakes::vercel::{FakeVercel, FakeVercelConfig};
use crate::common::*;
use serde_json::{json, Value};

const API_TOKEN: &str = "api-token-ws-a-0123456789";

struct Env {
    gw: Gateway,
    e2b: FakeE2b,
    daytona: FakeDaytona,
    vercel: FakeVercel,
    runloop: FakeRunloop,
    http: reqwest::Client,
    _keys: tempfile::TempDir,
}

/// Pools `a-e2b`, `b-daytona`, `c-vercel` and `d-runloop` (tried in that order),
/// `[proxy] public_url` on 127.0.0.1.
async fn start(create: &str) -> Env {
    start_with(create, Duration::ZERO).await
}

/// [`start`], with Vercel and Runloop listing a sandbox their create answered with a
/// failure (or not at all) only `listed_after` later.
async fn start_with(create: &str, listed_after: Duration) -> Env {
    init();
    let e2b = FakeE2b::start(FakeE2bConfig::default()).await;
    let daytona = FakeDaytona::start(FakeDaytonaConfig {
        start_delay: Duration::from_millis(50),
        ..FakeDaytonaConfig::default()
    })
    .await;
    let vercel = FakeVercel::start(FakeVercelConfig {
        start_delay: Duration::from_millis(50),
        appear_after: listed_after,
        ..FakeVercelConfig::default()
    })
    .await;
    let runloop = FakeRunloop::start(FakeRunloopConfig {
        boot_delay: Duration::from_millis(50),
        appear_after: listed_after,
        ..FakeRunloopConfig::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let key = |name: &str, value: &str| {
        let path = keys.path().join(name);
        std::fs::write(&path, value).unwrap();
        path.display().to_string()
    };
    let topology = format!(
        r#"
[[providers]]
name = "e2b"
[[providers]]
name = "daytona"
# Its adapter pauses VM classes; the fake's sandboxes are containers (see
# a_sandbox_short_of_what_its_pool_declared_is_destroyed_and_the_route_advances).
[providers.capabilities.features]
pause_resume = true
[[providers]]
name = "vercel"
[[providers]]
name = "runloop"

[[accounts]]
name = "e2b-main"
provider = "e2b"
base_url = "{e2b_url}"
api_key_file = {e2b_key:?}
options = {{ sandbox_url = "{e2b_url}" }}
[[accounts]]
name = "daytona-main"
provider = "daytona"
base_url = "{daytona_url}"
api_key_file = {daytona_key:?}

[[accounts]]
name = "vercel-main"
provider = "vercel"
base_url = "{vercel_url}"
api_key_file = {vercel_key:?}
options = {{ team_id = "{team}", project_id = "{project}" }}

[[accounts]]
name = "runloop-main"
provider = "runloop"
base_url = "{runloop_url}"
api_key_file = {runloop_key:?}

[[pools]]
name = "a-e2b"
provider = "e2b"
account = "e2b-main"
[[pools]]
name = "b-daytona"
provider = "daytona"
account = "daytona-main"
[[pools]]
name = "c-vercel"
provider = "vercel"
account = "vercel-main"
[[pools]]
name = "d-runloop"
provider = "runloop"
account = "runloop-main"
"#,
        e2b_url = e2b.url(),
        e2b_key = key("e2b.key", e2b.api_key()),
        daytona_url = daytona.api_url(),
        daytona_key = key("daytona.key", daytona.api_key()),
        vercel_url = vercel.url(),
        vercel_key = key("vercel.key", vercel.token()),
        team = vercel.team_id(),
        project = vercel.project_id(),
        runloop_url = runloop.url(),
        runloop_key = key("runloop.key", runloop.api_key()),
    );
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
        e2b,
        daytona,
        vercel,
        runloop,
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

    /// The pool's entry in `GET /v1/pools`.
    async fn pool(&self, name: &str) -> Value {
        let pools = self.get("/v1/pools").await;
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pool"] == name)
            .cloned()
            .unwrap()
    }

    async fn running(&self, body: Value) -> Value {
        let (status, created) = self.post("/v1/sandboxes", body).await;
        assert!(status == 201 || status == 202, "{status}: {created:#}");
        let id = created["id"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view: Value = self
                .http
                .get(self.gw.api(&format!("/v1/sandboxes/{id}")))
                .bearer_auth(API_TOKEN)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if view["state"] != "provisioning" && view["state"] != "pending"
                || Instant::now() > deadline
            {
                assert_eq!(view["state"], "running", "{view:#}");
                return view;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn put_file(&self, id: &str, path: &str, data: &[u8]) {
        let r = self
            .http
            .put(
                self.gw
                    .api(&format!("/v1/sandboxes/{id}/files/content?path={path}")),
            )
            .bearer_auth(API_TOKEN)
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }

    async fn get_file(&self, id: &str, path: &str) -> (u16, Vec<u8>) {
        let r = self
            .http
            .get(
                self.gw
                    .api(&format!("/v1/sandboxes/{id}/files/content?path={path}")),
            )
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_on_e2b_advances_to_daytona_under_one_sandbox_id() {
    let env = start("provisioning_window_ms = 200\nretry_backoff_ms = 20\n").await;
    env.e2b
        .script(["capacity", "capacity", "capacity", "capacity", "capacity"]);
    let view = env.running(json!({"labels": {"t": "cross"}})).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "b-daytona", "{view:#}");
    assert_eq!(view["placement"]["provider"], "daytona");
    let attempts = view["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["pool"], "a-e2b");
    assert_eq!(attempts[0]["error_class"], "capacity", "{view:#}");
    assert_eq!(env.e2b.live_count(), 0, "{:?}", env.e2b.live());
    let live = env.daytona.live();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].labels["sandgate_sandbox"], id);
    assert_eq!(view["placement"]["instance_id"], live[0].id.as_str());
}

/// Seed 000's runtime re-check: the Daytona pool declares pause/resume (its adapter pauses VM
/// classes), the router places a create needing it there, and the running sandbox (a
/// container class at the fake) reports less: it is destroyed and the route advances.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_short_of_what_its_pool_declared_is_destroyed_and_the_route_advances() {
    let env = start("").await;
    let pool = env.pool("b-daytona").await;
    assert_eq!(
        pool["capabilities"]["features"]["pause_resume"], true,
        "{pool:#}"
    );
    let view = env
        .running(
            json!({"features": {"pause_resume": true}, "routing": {"order": ["daytona", "e2b"]}}),
        )
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "a-e2b", "{view:#}");
    let first = &view["attempts"][0];
    assert_eq!(first["pool"], "b-daytona", "{view:#}");
    assert_eq!(first["error_class"], "runtime_shortfall", "{view:#}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(message.contains("features.pause_resume"), "{message}");
    // The short sandbox was made, then destroyed: nothing of it is left at Daytona.
    assert!(env.daytona.sandboxes().iter().any(|s| s
        .labels
        .get("sandgate_sandbox")
        .map(String::as_str)
        == Some(id)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.daytona.live_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.daytona.live_count(), 0, "{:?}", env.daytona.live());
    assert_eq!(env.e2b.live_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restricted_create_on_daytona_is_locked_to_the_gateway() {
    let env = start("").await;
    let view = env
        .running(json!({
            "network": {"allow_domains": ["api.a.test"]},
            "routing": {"order": ["daytona"]},
        }))
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "b-daytona", "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = env.daytona.sandbox(instance).unwrap();
    assert_eq!(sandbox.network_allow_list.as_deref(), Some("127.0.0.1/32"));
    assert!(!sandbox.network_block_all);
    assert_eq!(view["egress"]["enforcement"], "gateway");
    assert!(view["placement"]["lockdown"].is_object(), "{view:#}");
    assert_eq!(
        view["placement"]["lockdown"]["networkAllowList"], "127.0.0.1/32",
        "{view:#}"
    );
    assert!(sandbox.env["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    assert!(sandbox.env["HTTPS_PROXY"].ends_with("@127.0.0.1:3999"));
    let ca_path = sandbox.env["SSL_CERT_FILE"].clone();
    assert_eq!(
        env.daytona.file(instance, &ca_path).unwrap(),
        env.gw.sandgate_ca_pem
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_filesystem_export_continues_on_another_provider_and_a_provider_snapshot_does_not() {
    let env = start("").await;
    let first = env.running(json!({"routing": {"order": ["e2b"]}})).await;
    let first_id = first["id"].as_str().unwrap();
    assert_eq!(first["placement"]["pool"], "a-e2b");
    let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    env.put_file(first_id, "/home/user/work/data.bin", &data)
        .await;
    env.put_file(first_id, "/home/user/notes.txt", b"continue me")
        .await;

    // A provider snapshot stays with E2B: asking for Daytona is refused, saying why.
    let (status, snap) = env
        .post(&format!("/v1/sandboxes/{first_id}/snapshot"), json!({}))
        .await;
    assert_eq!(status, 201, "{snap:#}");
    assert_eq!(snap["snapshot"]["kind"], "provider");
    let (status, refused) = env
        .post(
            "/v1/sandboxes",
            json!({"snapshot": snap["snapshot"]["id"], "routing": {"order": ["daytona"]}, "provider": "daytona"}),
        )
        .await;
    assert_eq!(status, 422, "{refused:#}");
    assert_eq!(refused["error"]["code"], "no_eligible_pool");
    let unmet = refused["error"]["details"]["attempts"][0]["unmet_requirements"][0]
        .as_str()
        .unwrap();
    assert!(unmet.contains("filesystem export"), "{unmet}");

    // A filesystem export moves the files (not the processes) to Daytona.
    let (status, export) = env
        .post(
            &format!("/v1/sandboxes/{first_id}/snapshot"),
            json!({"kind": "filesystem", "paths": ["/home/user"]}),
        )
        .await;
    assert_eq!(status, 201, "{export:#}");
    assert_eq!(export["snapshot"]["kind"], "filesystem");
    assert!(
        export["export"]["files"].as_u64().unwrap() >= 2,
        "{export:#}"
    );
    let second = env
        .running(json!({"snapshot": export["snapshot"]["id"], "provider": "daytona"}))
        .await;
    let second_id = second["id"].as_str().unwrap();
    assert_eq!(second["placement"]["pool"], "b-daytona", "{second:#}");
    let (status, got) = env.get_file(second_id, "/home/user/work/data.bin").await;
    assert_eq!(status, 200);
    assert_eq!(got, data);
    let (_, notes) = env.get_file(second_id, "/home/user/notes.txt").await;
    assert_eq!(notes, b"continue me");
    let instance = second["placement"]["instance_id"].as_str().unwrap();
    assert_eq!(
        env.daytona.file(instance, "/home/user/notes.txt").unwrap(),
        b"continue me"
    );

    // Bad export requests change nothing.
    for body in [
        json!({"kind": "memory"}),
        json!({"kind": "filesystem", "paths": ["relative"]}),
        json!({"kind": "filesystem", "paths": ["/home/../etc"]}),
        json!({"paths": ["/home/user"]}),
        json!({"kind": "filesystem", "extra": 1}),
    ] {
        let (status, reply) = env
            .post(&format!("/v1/sandboxes/{first_id}/snapshot"), body.clone())
            .await;
        assert_eq!(status, 400, "{body}: {reply:#}");
        assert_eq!(reply["error"]["code"], "invalid_request", "{reply:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_walks_e2b_then_daytona_then_vercel_and_locks_vercel_down() {
    let env = start("provisioning_window_ms = 200\nretry_backoff_ms = 20\n").await;
    env.e2b.script(["capacity"; 8]);
    env.daytona.script(["capacity"; 8]);
    let view = env
        .running(json!({"network": {"allow_domains": ["api.a.test"]}}))
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "c-vercel", "{view:#}");
    let attempts: Vec<(&str, &str)> = view["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["pool"].as_str().unwrap(),
                a["error_class"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        vec![
            ("a-e2b", "capacity"),
            ("b-daytona", "capacity"),
            ("c-vercel", "-")
        ],
        "{view:#}"
    );
    assert_eq!(env.e2b.live_count() + env.daytona.live_count(), 0);
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let sandbox = env.vercel.sandbox(instance).unwrap();
    assert_eq!(sandbox.tags["sandgate_sandbox"], id);
    assert_eq!(
        sandbox.network_policy,
        Some(view["placement"]["lockdown"].clone()),
        "the policy sent is the one recorded"
    );
    assert_eq!(
        view["placement"]["lockdown"]["subnets"]["allow"],
        json!(["127.0.0.1/32"]),
        "{view:#}"
    );
    assert!(sandbox.env["HTTPS_PROXY"].ends_with("@127.0.0.1:3999"));
    let ca = env
        .vercel
        .file(instance, &sandbox.env["SSL_CERT_FILE"])
        .expect("the CA was written through fs/write");
    assert_eq!(ca, env.gw.sandgate_ca_pem);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restricted_create_on_runloop_is_locked_to_the_gateway() {
    let env = start("").await;
    let view = env
        .running(json!({
            "network": {"allow_domains": ["api.a.test"]},
            "routing": {"order": ["runloop"]},
        }))
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["placement"]["pool"], "d-runloop", "{view:#}");
    let instance = view["placement"]["instance_id"].as_str().unwrap();
    let devbox = env.runloop.devbox(instance).unwrap();
    assert_eq!(devbox.metadata["sandgate_sandbox"], id);
    let policy = devbox.policy.expect("a network policy is attached");
    assert!(!policy.allow_all);
    assert!(policy.allowed_hostnames.is_empty(), "{policy:?}");
    assert_eq!(policy.allowed_cidrs.len(), 1, "{policy:?}");
    assert_eq!(policy.allowed_cidrs[0]["cidr"], "127.0.0.1/32");
    assert!(!policy.allow_devbox_to_devbox && !policy.allow_runloop_mirrors);
    assert!(view["placement"]["lockdown"].is_object(), "{view:#}");
    assert_eq!(view["egress"]["enforcement"], "gateway");
    let env_vars = devbox.environment_variables;
    assert!(env_vars["HTTPS_PROXY"].starts_with(&format!("http://{id}:")));
    let ca = env
        .runloop
        .file(instance, &env_vars["SSL_CERT_FILE"])
        .expect("the CA was written");
    assert_eq!(ca, env.gw.sandgate_ca_pem);
}

/// Issue 25 item 6: an E2B pool answering every create with a 500 (no `error_code`) was called
/// every `retry_backoff_ms` for the whole provisioning window. Now: `retry_max` retries with
/// exponential backoff, then the next pool; the pool's circuit (shared by concurrent creates)
/// opens after `circuit_failure_threshold` failed calls and creates skip it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_always_failing_pool_is_retried_a_few_times_with_backoff_then_its_circuit_opens() {
    let env = start("provisioning_window_ms = 3000\nretry_backoff_ms = 100\n").await;
    env.e2b.always("server_error");
    let started = Instant::now();
    let view = env.settled(json!({"labels": {"t": "hammer"}})).await;
    let took = started.elapsed();
    let calls = env.e2b.create_attempts();
    println!("one create against an always-500 pool: {calls} create calls in {took:?}");
    assert_eq!(view["state"], "running", "{calls} calls; {view:#}");
    assert_eq!(view["placement"]["pool"], "b-daytona", "{view:#}");
    // Defaults: retry_max = 3 (4 calls), pauses from 100 ms doubling (with jitter).
    assert_eq!(calls, 4, "{view:#}");
    assert!(took >= Duration::from_millis(700), "backed off: {took:?}");
    let first = &view["attempts"][0];
    assert_eq!(first["pool"], "a-e2b");
    assert_eq!(first["error_class"], "provider_error", "{view:#}");
    let retries = first["retries"]
        .as_array()
        .expect("the retries are recorded");
    assert_eq!(retries.len(), 3, "{view:#}");
    let waits: Vec<u64> = retries
        .iter()
        .map(|r| r["wait_ms"].as_u64().unwrap())
        .collect();
    for (i, wait) in waits.iter().enumerate() {
        let base = 100u64 << i;
        assert!(
            (base..=2 * base).contains(wait),
            "retry {i} waited {wait} ms: {waits:?}"
        );
        assert_eq!(retries[i]["error_class"], "provider_error");
        assert!(
            retries[i]["message"].as_str().unwrap().contains("500"),
            "{view:#}"
        );
    }
    assert!(
        first["message"].as_str().unwrap().contains("retries"),
        "why it stopped: {view:#}"
    );
    let pool = env.pool("a-e2b").await;
    assert_eq!(pool["circuit"]["state"], "closed", "{pool:#}");
    assert_eq!(pool["circuit"]["consecutive_failures"], 4, "{pool:#}");

    // The next failures open the circuit: 8 creates at once call the pool only a few times.
    let before = env.e2b.create_attempts();
    let views = futures_util::future::join_all(
        (0..8).map(|i| env.settled(json!({"labels": {"n": i.to_string()}}))),
    )
    .await;
    let concurrent_calls = env.e2b.create_attempts() - before;
    println!("8 concurrent creates against the same pool: {concurrent_calls} create calls");
    for view in &views {
        assert_eq!(view["placement"]["pool"], "b-daytona", "{view:#}");
    }
    assert!(
        (1..=8).contains(&concurrent_calls),
        "{concurrent_calls} calls for 8 creates"
    );
    let skipped = views
        .iter()
        .filter(|v| v["attempts"][0]["error_class"] == "circuit_open")
        .count();
    assert_eq!(
        skipped,
        8 - concurrent_calls,
        "one call per create not skipped"
    );
    let pool = env.pool("a-e2b").await;
    assert_eq!(pool["circuit"]["state"], "open", "{pool:#}");
    assert!(pool["circuit"]["half_open_at_ms"].as_i64().unwrap() > 0);
    assert!(pool["circuit"]["last_failure"]
        .as_str()
        .unwrap()
        .starts_with("provider_error"));
    // Once open, a create does not call the pool at all.
    let before = env.e2b.create_attempts();
    let view = env.settled(json!({})).await;
    assert_eq!(
        view["attempts"][0]["error_class"], "circuit_open",
        "{view:#}"
    );
    assert_eq!(view["attempts"][0]["state"], "advanced");
    assert_eq!(env.e2b.create_attempts(), before);
    assert_eq!(env.e2b.live_count(), 0);
}

/// Issue 25 item 8: Vercel and Runloop creates that the provider applied and then answered
/// 503 were recorded as `outage` and the route advanced, leaving the instance live. Now a
/// failure that does not prove nothing was made is reconciled by tag first: the instance is
/// found and adopted, and nothing is created elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_applied_then_answered_503_is_reconciled_by_tag_on_vercel_and_runloop() {
    let env = start("").await;
    env.vercel.script(["created_then_503"]);
    let view = env
        .settled(json!({"routing": {"order": ["vercel", "runloop"]}}))
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "c-vercel", "{view:#}");
    assert_eq!(view["attempts"].as_array().unwrap().len(), 1, "{view:#}");
    let live = env.vercel.live_with_tag("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "{:?}", env.vercel.live());
    assert_eq!(view["placement"]["instance_id"], live[0].name.as_str());
    let ca = env
        .vercel
        .file(&live[0].name, &live[0].env["SSL_CERT_FILE"]);
    assert_eq!(
        ca.as_deref(),
        Some(env.gw.sandgate_ca_pem.as_slice()),
        "adopted, then finished"
    );
    assert_eq!(env.vercel.create_log().len(), 1, "no second create");
    assert_eq!(env.runloop.live_count(), 0, "nothing created elsewhere");

    env.runloop.script(["created_then_503"]);
    let view = env
        .settled(json!({"routing": {"order": ["runloop", "vercel"]}}))
        .await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["placement"]["pool"], "d-runloop", "{view:#}");
    let live = env.runloop.live_with_metadata("sandgate_sandbox", id);
    assert_eq!(live.len(), 1, "{:?}", env.runloop.live());
    assert_eq!(view["placement"]["instance_id"], live[0].id.as_str());
    let ca = env
        .runloop
        .file(&live[0].id, &live[0].environment_variables["SSL_CERT_FILE"]);
    assert_eq!(
        ca.as_deref(),
        Some(env.gw.sandgate_ca_pem.as_slice()),
        "adopted, then finished"
    );
    assert_eq!(env.runloop.create_log().len(), 1, "no second create");
    assert_eq!(env.vercel.live_count(), 1, "only the first sandbox's");
}

/// Issue 25 item 8: an instance a 503 create made that the provider lists only later (its
/// list is eventually consistent) is not found when the route advances; the attempt is
/// watched and the janitor deletes it against its own account once it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_a_503_create_made_that_is_listed_late_is_deleted_by_the_janitor() {
    let env = start_with("janitor_interval_ms = 100\n", Duration::from_millis(1500)).await;
    env.vercel.script(["created_then_503"]);
    let first = env
        .settled(json!({"routing": {"order": ["vercel", "runloop"]}}))
        .await;
    env.runloop.script(["created_then_503"]);
    let second = env
        .settled(json!({"routing": {"order": ["runloop", "vercel"]}}))
        .await;
    for (view, pool, abandoned) in [
        (&first, "d-runloop", "c-vercel"),
        (&second, "c-vercel", "d-runloop"),
    ] {
        assert_eq!(view["state"], "running", "{view:#}");
        assert_eq!(view["placement"]["pool"], pool, "{view:#}");
        let a0 = &view["attempts"][0];
        assert_eq!(a0["pool"], abandoned, "{view:#}");
        assert_eq!(a0["state"], "abandoned", "watched by the janitor: {view:#}");
        assert_eq!(a0["error_class"], "outage", "{view:#}");
    }
    let (first_id, second_id) = (
        first["id"].as_str().unwrap(),
        second["id"].as_str().unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let orphans = env.vercel.live_with_tag("sandgate_sandbox", first_id).len()
            + env
                .runloop
                .live_with_metadata("sandgate_sandbox", second_id)
                .len();
        if orphans == 0 || Instant::now() > deadline {
            assert_eq!(
                orphans,
                0,
                "{:?} {:?}",
                env.vercel.live(),
                env.runloop.live()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The placed instances are untouched.
    assert_eq!(
        env.runloop
            .live_with_metadata("sandgate_sandbox", first_id)
            .len(),
        1
    );
    assert_eq!(
        env.vercel
            .live_with_tag("sandgate_sandbox", second_id)
            .len(),
        1
    );
}
