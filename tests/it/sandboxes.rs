//! Sandbox creation over real sockets: the API on a port-0 listener, reqwest as the client,
//! the real SQLite file, and in-process simulated pools whose inventories the tests inspect.
//!
//! Topology used throughout: one simulated provider `sim`, pools `pool-a`, `pool-b`, `pool-c`
//! on accounts `acct-a`, `acct-b`, `acct-c`, tried in that order (no priorities: name order).

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const TOKEN_A: &str = "api-token-ws-a-0123456789";
const TOKEN_B: &str = "api-token-ws-b-0123456789";

fn config(sims: &str, extra: &str) -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"
[[api.tokens]]
token = "{TOKEN_B}"
principal = "bob"
workspace = "ws-b"

[create]
short_wait_ms = 3000
janitor_interval_ms = 100
reconcile_window_ms = 1000
provisioning_window_ms = 300
retry_backoff_ms = 20

[[providers]]
name = "sim"
kind = "simulated"
capabilities = {{ isolation = ["microvm"], egress = "gateway" }}

[[accounts]]
name = "acct-a"
provider = "sim"
[[accounts]]
name = "acct-b"
provider = "sim"
[[accounts]]
name = "acct-c"
provider = "sim"

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"
[[pools]]
name = "pool-c"
provider = "sim"
account = "acct-c"
{extra}
{sims}
"#
    )
}

struct Env {
    gw: Gateway,
    http: reqwest::Client,
}

async fn start(sims: &str) -> Env {
    start_with(sims, "", vec![]).await
}

async fn start_with(sims: &str, extra: &str, policies: Vec<(&'static str, String)>) -> Env {
    init();
    let gw = Gateway::start(GatewayOptions {
        extra_toml: config(sims, extra),
        extra_policies: policies,
        ..GatewayOptions::default()
    })
    .await;
    Env {
        gw,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap(),
    }
}

impl Env {
    async fn create(&self, body: Value, key: Option<&str>) -> (u16, Value) {
        self.create_as(TOKEN_A, body, key).await
    }

    async fn create_as(&self, token: &str, body: Value, key: Option<&str>) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(token)
            .json(&body);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    async fn get(&self, id: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(self.gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn get_text(&self, id: &str) -> String {
        self.http
            .get(self.gw.api(&format!("/v1/sandboxes/{id}")))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn wait_state(&self, id: &str, want: &str) -> Value {
        for _ in 0..200 {
            let (_, v) = self.get(id).await;
            if v["state"] == want {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "sandbox {id} never reached {want}: {:?}",
            self.get(id).await
        );
    }

    fn sim(&self, pool: &str) -> std::sync::Arc<sandgate::providers::simulated::SimulatedProvider> {
        self.gw
            .server
            .sandboxes
            .providers()
            .simulated(pool)
            .unwrap()
    }

    fn live(&self, pool: &str) -> usize {
        self.sim(pool).live_instances().len()
    }
}

/// The sandbox id of a failed create (from the error details).
fn failed_id(body: &Value) -> String {
    body["error"]["details"]["sandbox_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no sandbox id in {body}"))
        .to_string()
}

// ------------------------------------------------------------------ failover matrix: advance

/// Seed 001: "Capacity limits, rate limits, exhausted provider quota, unavailable regions and
/// provider outages can cause the route to advance. A provider error, an unsupported pool
/// configuration, an unbound provider account, or an instance that fails before it ever runs
/// can also make that pool unusable."
async fn advances_on(cause: &str) {
    advances_with_class(cause, cause).await
}

async fn advances_with_class(cause: &str, class: &str) {
    let env = start(&format!(
        "[simulated.pool-a]\nfaults = {{ {cause} = 1.0 }}\nlatency_ms = {{ min = 5, max = 5 }}\n"
    ))
    .await;
    let (status, body) = env.create(json!({"labels": {"t": cause}}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "running");
    assert_eq!(body["placement"]["pool"], "pool-b", "{body}");
    assert_eq!(body["placement"]["account"], "acct-b");
    let attempts = body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{body}");
    assert_eq!(attempts[0]["pool"], "pool-a");
    assert_eq!(attempts[0]["account"], "acct-a");
    assert_eq!(attempts[0]["outcome"], "advance");
    assert_eq!(attempts[0]["error_class"], class);
    assert_eq!(attempts[1]["pool"], "pool-b");
    assert_eq!(attempts[1]["outcome"], "success");
    // One sandbox id across every attempt.
    let id = body["id"].as_str().unwrap();
    for a in attempts {
        assert!(a["id"].as_str().unwrap().starts_with(id), "{a}");
    }
    // No capacity left behind on the pool that could not serve; one instance where placed.
    assert_eq!(
        env.live("pool-a"),
        0,
        "{:?}",
        env.sim("pool-a").live_instances()
    );
    assert_eq!(env.live("pool-b"), 1);
    assert_eq!(env.sim("pool-c").create_calls(), 0);
    let placed = &env.sim("pool-b").live_instances()[0];
    assert_eq!(placed.sandbox_id, id);
    assert_eq!(body["placement"]["instance_id"], placed.id.as_str());
}

#[tokio::test]
async fn capacity_advances() {
    advances_on("capacity").await;
}
#[tokio::test]
async fn rate_limit_advances_after_retries_within_the_window() {
    advances_on("rate_limit").await;
}
#[tokio::test]
async fn quota_advances() {
    advances_on("quota").await;
}
#[tokio::test]
async fn region_unavailable_advances() {
    advances_on("region_unavailable").await;
}
#[tokio::test]
async fn outage_advances() {
    advances_on("outage").await;
}
#[tokio::test]
async fn provider_error_advances() {
    advances_on("provider_error").await;
}
#[tokio::test]
async fn unsupported_configuration_advances() {
    advances_on("unsupported").await;
}
#[tokio::test]
async fn unbound_account_advances() {
    advances_on("unbound_account").await;
}
#[tokio::test]
async fn failed_before_running_advances_and_the_instance_is_deleted() {
    advances_with_class("fail_before_running", "failed_before_running").await;
}

#[tokio::test]
async fn rate_limit_is_retried_on_the_same_pool_first() {
    let env =
        start("[simulated.pool-a]\nscript = [\"rate_limit\", \"rate_limit\", \"ok\"]\n").await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-a");
    assert_eq!(body["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(env.sim("pool-a").create_calls(), 3);
}

#[tokio::test]
async fn account_without_credential_on_a_hosted_provider_advances_as_unbound() {
    // A hosted provider's account with no credential reference cannot serve.
    let extra = r#"
[[providers]]
name = "e2b"
[[accounts]]
name = "acct-e2b"
provider = "e2b"
[[pools]]
name = "pool-0"
provider = "e2b"
account = "acct-e2b"
"#;
    let env = start_with("", extra, vec![]).await;
    let (status, body) = env
        .create(json!({"routing": {"order": ["e2b", "sim"]}}), None)
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["attempts"][0]["pool"], "pool-0");
    assert_eq!(body["attempts"][0]["error_class"], "unbound_account");
    assert_eq!(body["placement"]["pool"], "pool-a");
}

// -------------------------------------------------------------------- failover matrix: ends

/// Seed 001: "A refusal of the caller's authority, an applicable policy, billing standing or
/// the request itself ends the operation. Failover does not grant permission to bypass those
/// checks."
async fn ends_on_provider_refusal(cause: &str, code: &str, http: u16) {
    let env = start(&format!(
        "[simulated.pool-a]\nfaults = {{ {cause} = 1.0 }}\n"
    ))
    .await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, http, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let id = failed_id(&body);
    let (_, sandbox) = env.get(&id).await;
    assert_eq!(sandbox["state"], "failed");
    let attempts = sandbox["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{sandbox}");
    assert_eq!(attempts[0]["outcome"], "terminal");
    assert_eq!(attempts[0]["error_class"], cause);
    assert_eq!(
        env.sim("pool-b").create_calls(),
        0,
        "failover went past a refusal"
    );
}

#[tokio::test]
async fn billing_refusal_by_the_provider_ends() {
    ends_on_provider_refusal("billing", "billing_refused", 403).await;
}

#[tokio::test]
async fn invalid_request_refusal_by_the_provider_ends() {
    ends_on_provider_refusal("invalid_request", "invalid_request", 422).await;
}

#[tokio::test]
async fn suspended_account_is_refused_by_the_provider_layer_and_ends() {
    let extra = "[[accounts]]\nname = \"acct-z\"\nprovider = \"sim\"\nbilling = \"suspended\"\n[[pools]]\nname = \"pool-0\"\nprovider = \"sim\"\naccount = \"acct-z\"\n";
    let env = start_with("", extra, vec![]).await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "billing_refused");
    let attempts = body["error"]["details"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["pool"], "pool-0");
    assert_eq!(attempts[0]["error_class"], "billing");
    assert_eq!(env.sim("pool-0").create_calls(), 0);
    assert_eq!(env.sim("pool-a").create_calls(), 0);
}

#[tokio::test]
async fn authority_refusal_by_the_creation_layer_ends() {
    let deny = r#"package sandgate.creation
import rego.v1
deny contains "interns may not create sandboxes" if input.request.labels.role == "intern"
"#;
    let env = start_with("", "", vec![("creation_extra.rego", deny.to_string())]).await;
    let (status, body) = env
        .create(json!({"labels": {"role": "intern"}}), None)
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(
        body["error"]["details"]["attempts"][0]["error_class"],
        "authority"
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("interns may not create sandboxes"));
    assert_eq!(env.sim("pool-a").create_calls(), 0);
    // The same policy lets other requests through.
    let (status, _) = env.create(json!({"labels": {"role": "staff"}}), None).await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn readmission_per_pool_stops_at_the_pool_whose_account_is_refused() {
    // Pool A's account is allowed but A is full; B's account is refused by a provider-layer
    // policy: the walk stops at B instead of carrying A's approval over, and never reaches C.
    let deny_b = r#"package sandgate.provider
import rego.v1
deny contains "account acct-b is closed to ws-a" if {
    input.account.name == "acct-b"
    input.workspace == "ws-a"
}
"#;
    let env = start_with(
        "[simulated.pool-a]\nfaults = { capacity = 1.0 }\n",
        "",
        vec![("provider_extra.rego", deny_b.to_string())],
    )
    .await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "policy_denied");
    let attempts = body["error"]["details"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{body}");
    assert_eq!(attempts[0]["pool"], "pool-a");
    assert_eq!(attempts[0]["error_class"], "capacity");
    assert_eq!(attempts[1]["pool"], "pool-b");
    assert_eq!(attempts[1]["error_class"], "policy");
    assert_eq!(attempts[1]["outcome"], "terminal");
    assert_eq!(env.sim("pool-b").create_calls(), 0);
    assert_eq!(env.sim("pool-c").create_calls(), 0);
    // Another workspace is admitted to B.
    let (status, body) = env.create_as(TOKEN_B, json!({}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-b");
}

#[tokio::test]
async fn exhausted_candidates_fail_with_every_attempt() {
    let sims = "[simulated.pool-a]\nfaults = { capacity = 1.0 }\n[simulated.pool-b]\nfaults = { outage = 1.0 }\n[simulated.pool-c]\nfaults = { quota = 1.0 }\n";
    let env = start(sims).await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "creation_failed");
    let classes: Vec<&str> = body["error"]["details"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["error_class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["capacity", "outage", "quota"]);
}

#[tokio::test]
async fn nothing_qualifies_is_no_eligible_provider_with_unmet_requirements() {
    let env = start("").await;
    let (status, body) = env
        .create(
            json!({"features": {"pty": true}, "regions": ["eu-west"]}),
            None,
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "no_eligible_provider");
    let attempts = body["error"]["details"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    for a in attempts {
        let unmet: Vec<&str> = a["unmet_requirements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap())
            .collect();
        assert!(unmet.contains(&"features.pty"), "{a}");
        assert!(unmet.contains(&"regions"), "{a}");
    }
}

// ------------------------------------------------------------- unknown outcomes, janitor

#[tokio::test]
async fn unknown_outcome_is_reconciled_without_a_duplicate() {
    // The create times out after it was sent; the instance shows up 150 ms later, within the
    // reconcile window: it is adopted, nothing else is tried.
    let env = start(
        "[simulated.pool-a]\nscript = [\"timeout_after_send\"]\ntimeout_ms = 50\nappear_after_ms = 150\n",
    )
    .await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-a");
    let attempts = body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{body}");
    assert_eq!(attempts[0]["state"], "succeeded");
    assert_eq!(
        env.sim("pool-a").create_calls(),
        1,
        "the create was repeated"
    );
    assert_eq!(env.live("pool-a"), 1);
    assert_eq!(env.sim("pool-b").create_calls(), 0);
}

#[tokio::test]
async fn late_instance_of_an_abandoned_attempt_is_deleted_by_the_janitor() {
    // The instance appears only after the reconcile window: the attempt is abandoned (kept
    // against acct-a), the route advances to B, and the janitor deletes the late instance.
    let env = start_with(
        "[simulated.pool-a]\nscript = [\"timeout_after_send\"]\ntimeout_ms = 20\nappear_after_ms = 1200\n",
        "",
        vec![],
    )
    .await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-b");
    assert_eq!(body["attempts"][0]["state"], "abandoned");
    assert_eq!(body["attempts"][0]["account"], "acct-a");
    // Right now the late instance exists at the provider, invisible.
    assert_eq!(env.live("pool-a"), 1);
    let mut cleaned = false;
    for _ in 0..100 {
        if env.live("pool-a") == 0 {
            cleaned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cleaned, "janitor never deleted the late instance");
    assert_eq!(env.sim("pool-a").deleted().len(), 1);
    // The placed instance is untouched.
    assert_eq!(env.live("pool-b"), 1);
    let (_, again) = env.get(body["id"].as_str().unwrap()).await;
    assert_eq!(again["state"], "running");
}

#[tokio::test]
async fn runtime_shortfall_is_destroyed_and_the_route_advances() {
    let env = start("[simulated.pool-a]\nscript = [\"runtime_shortfall\"]\n").await;
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-b");
    let a0 = &body["attempts"][0];
    assert_eq!(a0["error_class"], "runtime_shortfall");
    assert!(a0["message"]
        .as_str()
        .unwrap()
        .contains("features.process.execute"));
    assert_eq!(env.live("pool-a"), 0);
    assert_eq!(env.sim("pool-a").deleted().len(), 1);
}

#[tokio::test]
async fn runtime_shortfall_only_counts_what_the_request_needs() {
    // Opting out of the baseline: an instance without process/filesystem support serves.
    let env = start("[simulated.pool-a]\nscript = [\"runtime_shortfall\"]\n").await;
    let body = json!({"features": {"process": {"execute": false}, "filesystem": {"read": false, "write": false}}});
    let (status, body) = env.create(body, None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["placement"]["pool"], "pool-a");
}

// ------------------------------------------------------------------ 201 / 202, idempotency

#[tokio::test]
async fn slow_placement_answers_202_and_continues_in_the_background() {
    init();
    let env = Env {
        gw: Gateway::start(GatewayOptions {
            extra_toml: config(
                "[simulated.pool-a]\nlatency_ms = { min = 800, max = 800 }\n",
                "",
            )
            .replace("short_wait_ms = 3000", "short_wait_ms = 100"),
            ..GatewayOptions::default()
        })
        .await,
        http: reqwest::Client::new(),
    };
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 202, "{body}");
    assert!(
        ["pending", "provisioning"].contains(&body["state"].as_str().unwrap()),
        "{body}"
    );
    assert!(body["egress"]["token"].is_string());
    let id = body["id"].as_str().unwrap();
    let running = env.wait_state(id, "running").await;
    assert_eq!(running["placement"]["pool"], "pool-a");
}

#[tokio::test]
async fn deleting_an_in_flight_create_leaves_no_instance_behind() {
    init();
    let env = Env {
        gw: Gateway::start(GatewayOptions {
            extra_toml: config(
                "[simulated.pool-a]\nlatency_ms = { min = 600, max = 600 }\n",
                "",
            )
            .replace("short_wait_ms = 3000", "short_wait_ms = 50"),
            ..GatewayOptions::default()
        })
        .await,
        http: reqwest::Client::new(),
    };
    let (status, body) = env.create(json!({}), None).await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let token = body["egress"]["token"].as_str().unwrap().to_string();
    let resp = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The provider finishes starting the instance after the delete; the coordinator must
    // not place the sandbox on it, and must delete it.
    for _ in 0..60 {
        if env.sim("pool-a").deleted().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.sim("pool-a").deleted().len(), 1);
    assert_eq!(env.live("pool-a"), 0);
    let (_, after) = env.get(&id).await;
    assert_eq!(after["state"], "deleted");
    assert!(after["placement"].is_null(), "{after}");
    let (status, _) = connect_tunnel(
        env.gw.server.proxy_addr(),
        "api.a.test:443",
        Some((&id, &token)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(status, 407);
}

#[tokio::test]
async fn fifty_concurrent_identical_creates_make_one_sandbox() {
    let env = start("[simulated.pool-a]\nlatency_ms = { min = 200, max = 200 }\n").await;
    let env = std::sync::Arc::new(env);
    let body = json!({"labels": {"job": "many"}, "source": {"environment": "metal/python"}});
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let env = env.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            env.create(body, Some("key-50")).await
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert!(status == 201 || status == 202, "{status} {body}");
        ids.insert(body["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(env.live("pool-a"), 1);
    assert_eq!(env.sim("pool-a").create_calls(), 1);
    let list: Value = env
        .http
        .get(env.gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1, "{list}");
}

#[tokio::test]
async fn same_key_with_a_different_body_is_a_conflict_and_keys_are_per_workspace() {
    let env = start("").await;
    let (status, first) = env.create(json!({"labels": {"v": "1"}}), Some("k1")).await;
    assert_eq!(status, 201, "{first}");
    // Same body, different formatting and key order: the same sandbox.
    let (status, again) = env
        .create(json!({"labels": {"v": "1"}, "regions": []}), Some("k1"))
        .await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["id"], first["id"]);
    let (status, conflict) = env.create(json!({"labels": {"v": "2"}}), Some("k1")).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "idempotency_conflict");
    // Another workspace's identical key is its own.
    let (status, other) = env
        .create_as(TOKEN_B, json!({"labels": {"v": "1"}}), Some("k1"))
        .await;
    assert_eq!(status, 201, "{other}");
    assert_ne!(other["id"], first["id"]);
    assert_eq!(env.live("pool-a"), 2);
}

/// The egress token is shown once: by the create that made the sandbox. A replay of it (same
/// key, same body) is the same sandbox without the token, saying it was already shown; a
/// `GET`, the list and a `DELETE` never show it.
#[tokio::test]
async fn an_idempotent_replay_returns_the_sandbox_without_its_token() {
    let env = start("").await;
    let body = json!({"labels": {"job": "once"}});
    let (status, first) = env.create(body.clone(), Some("show-once")).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let token = first["egress"]["token"].as_str().unwrap().to_string();
    assert!(token.len() >= 32, "{first}");
    assert_eq!(
        first["egress"]["proxy_url"],
        format!("http://{id}:{token}@{}", env.gw.server.proxy_addr())
    );

    // The replay, over raw HTTP: the same sandbox, no token anywhere in the body.
    for _ in 0..2 {
        let resp = env
            .http
            .post(env.gw.api("/v1/sandboxes"))
            .bearer_auth(TOKEN_A)
            .header("idempotency-key", "show-once")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let text = resp.text().await.unwrap();
        assert!(
            !text.contains(&token),
            "the replay showed the token: {text}"
        );
        let replay: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(replay["id"], id.as_str());
        assert!(replay["egress"].get("token").is_none(), "{replay:#}");
        assert_eq!(replay["egress"]["token_already_shown"], true, "{replay:#}");
        assert_eq!(
            replay["egress"]["proxy_url"],
            format!("http://{id}:{{token}}@{}", env.gw.server.proxy_addr()),
            "the replay's proxy URL names the token's place, not the token"
        );
    }

    assert_eq!(first["egress"]["token_already_shown"], false, "{first}");

    // Neither GET, the list nor DELETE show it.
    let text = env.get_text(&id).await;
    assert!(!text.contains(&token), "GET showed the token: {text}");
    let list = env
        .http
        .get(env.gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains(&id) && !list.contains(&token), "{list}");

    // The token still works: it was only not shown again.
    let (status, _) = connect_tunnel(
        env.gw.server.proxy_addr(),
        "api.b.test:443",
        Some((&id, &token)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(status, 403, "authenticated, then refused by policy");

    let deleted = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !deleted.contains(&token),
        "DELETE showed the token: {deleted}"
    );
}

// --------------------------------------------------------------- read, list, auth, secrets

#[tokio::test]
async fn unauthenticated_calls_are_refused() {
    let env = start("").await;
    for (method, path) in [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/sb-x"),
        ("DELETE", "/v1/sandboxes/sb-x"),
        ("POST", "/v1/routes:explain"),
    ] {
        let resp = env
            .http
            .request(method.parse().unwrap(), env.gw.api(path))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{method} {path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthenticated");
    }
}

#[tokio::test]
async fn other_workspaces_sandboxes_are_invisible() {
    let env = start("").await;
    let (_, body) = env.create(json!({}), None).await;
    let id = body["id"].as_str().unwrap();
    let resp = env
        .http
        .get(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = env
        .http
        .get(env.gw.api("/v1/sandboxes?workspace=ws-a"))
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(env.get(id).await.1["state"], "running");
}

#[tokio::test]
async fn list_filters_by_state_and_label_and_paginates() {
    let env =
        start("[simulated.pool-a]\nscript = [\"ok\", \"ok\", \"ok\", \"invalid_request\"]\n").await;
    for team in ["red", "blue", "red"] {
        let (status, _) = env.create(json!({"labels": {"team": team}}), None).await;
        assert_eq!(status, 201);
    }
    let (status, _) = env.create(json!({"labels": {"team": "red"}}), None).await;
    assert_eq!(status, 422);
    let list = |q: &'static str| {
        let env = &env;
        async move {
            let v: Value = env
                .http
                .get(env.gw.api(&format!("/v1/sandboxes{q}")))
                .bearer_auth(TOKEN_A)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v
        }
    };
    assert_eq!(list("").await["sandboxes"].as_array().unwrap().len(), 4);
    assert_eq!(
        list("?label=team=red").await["sandboxes"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        list("?label=team=red&state=running").await["sandboxes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        list("?state=failed").await["sandboxes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let page1 = list("?limit=3").await;
    assert_eq!(page1["sandboxes"].as_array().unwrap().len(), 3);
    let cursor = page1["next_cursor"].as_str().unwrap().to_string();
    let page2: Value = env
        .http
        .get(
            env.gw
                .api(&format!("/v1/sandboxes?limit=3&cursor={cursor}")),
        )
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let p2 = page2["sandboxes"].as_array().unwrap();
    assert_eq!(p2.len(), 1);
    assert!(page2["next_cursor"].is_null());
    let first_ids: Vec<&Value> = page1["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert!(!first_ids.contains(&&p2[0]["id"]));
}

#[tokio::test]
async fn unknown_fields_and_foreign_credentials_are_invalid_requests() {
    let env = start("").await;
    let (status, body) = env.create(json!({"gpu_please": true}), None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["details"]["field"], "gpu_please");
    let (status, body) = env.create(json!({"credentials": ["nope"]}), None).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["details"]["field"], "credentials[0]");
    let (status, _) = env.create(json!({"workspace": "ws-b"}), None).await;
    assert_eq!(status, 403);
    assert_eq!(env.sim("pool-a").create_calls(), 0);
}

// --------------------------------------------------------------------- egress identity

#[tokio::test]
async fn created_sandbox_identity_works_through_the_proxy_until_deleted() {
    init();
    let ca = TestCa::new();
    let origin = start_origin(Some(ca.server_config(&["api.a.test"]))).await;
    let secret_dir = tempfile::tempdir().unwrap();
    std::fs::write(secret_dir.path().join("s"), "cred-secret-99887766").unwrap();
    let port = origin.port();
    let creds = format!(
        r#"
[[credentials]]
workspace = "ws-a"
name = "api"
secret_file = {s:?}
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "authorization", template = "Bearer {{secret}}" }}
[[credentials]]
workspace = "ws-b"
name = "theirs"
secret_file = {s:?}
destinations = [{{ host = "api.a.test", ports = [{port}] }}]
apply = {{ type = "header", name = "x-theirs", template = "{{secret}}" }}
"#,
        s = secret_dir.path().join("s").display().to_string()
    );
    let gw = Gateway::start(GatewayOptions {
        upstream_ca: Some(ca.pem_path.clone()),
        extra_toml: config("", &creds),
        ..GatewayOptions::default()
    })
    .await;
    let env = Env {
        gw,
        http: reqwest::Client::new(),
    };
    // Another workspace's credential cannot be bound.
    let (status, _) = env.create(json!({"credentials": ["theirs"]}), None).await;
    assert_eq!(status, 400);
    let (status, body) = env
        .create(
            json!({"network": {"allow_domains": ["api.a.test"]}, "credentials": ["api"]}),
            None,
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let token = body["egress"]["token"].as_str().unwrap().to_string();
    let proxy_url = body["egress"]["proxy_url"].as_str().unwrap().to_string();
    assert_eq!(
        proxy_url,
        format!("http://{id}:{token}@{}", env.gw.server.proxy_addr())
    );
    assert_eq!(
        body["egress"]["ca_cert_path"],
        env.gw.server.ca_cert_path().display().to_string()
    );
    // GET never shows the token.
    let text = env.get_text(&id).await;
    assert!(!text.contains(&token), "GET leaked the token");
    assert!(text.contains("{token}"));

    let sandbox = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&proxy_url).unwrap())
        .tls_certs_only([reqwest::Certificate::from_pem(&env.gw.sandgate_ca_pem).unwrap()])
        .build()
        .unwrap();
    let resp = sandbox
        .get(format!("https://api.a.test:{port}/v1/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = origin.last().unwrap();
    assert_eq!(
        seen.headers.get("authorization").map(String::as_str),
        Some("Bearer cred-secret-99887766"),
        "the bound credential was not applied"
    );
    // Outside the allow-list: refused.
    let (status, _) = connect_tunnel(
        env.gw.server.proxy_addr(),
        &format!("api.b.test:{port}"),
        Some((&id, &token)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(status, 403);

    let resp = env
        .http
        .delete(env.gw.api(&format!("/v1/sandboxes/{id}")))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let deleted: Value = resp.json().await.unwrap();
    assert_eq!(deleted["state"], "deleted");
    assert_eq!(env.live("pool-a"), 0, "the instance outlived its sandbox");
    // The identity is revoked at once: a new connection is refused with 407.
    let (status, _) = connect_tunnel(
        env.gw.server.proxy_addr(),
        &format!("api.a.test:{port}"),
        Some((&id, &token)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(status, 407);
}

/// Seed 000: "Candidates must be unique." A repeated provider in the explicit provider and
/// its fallbacks, or in `routing.order`, is refused before anything is created.
#[tokio::test]
async fn repeated_candidates_are_refused_naming_the_field() {
    let env = start("").await;
    for (body, field) in [
        (
            json!({"provider": "sim", "fallback_providers": ["sim"]}),
            "fallback_providers[0]",
        ),
        (
            json!({"routing": {"order": ["sim", "sim"]}}),
            "routing.order[1]",
        ),
    ] {
        let (status, reply) = env.create(body.clone(), None).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_request", "{reply}");
        assert_eq!(reply["error"]["details"]["field"], field, "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap()
                .contains("\"sim\""),
            "{reply}"
        );
    }
    assert_eq!(env.sim("pool-a").create_calls(), 0, "nothing was created");
}

// ------------------------------------------------------------------ lifetimes (`ttl_secs`)

/// A sandbox created with `ttl_secs` is deleted by sandgate once its lifetime has passed
/// (identity revoked, instance gone); `POST .../timeout` moves the end, later or sooner.
#[tokio::test]
async fn a_sandbox_whose_lifetime_ends_is_deleted_and_set_timeout_moves_the_end() {
    // `sandgate_sandboxes_expired_total` has no label of its own: with its own recorder,
    // this gateway's counts only these two.
    let _metrics = own_metrics();
    let env = start("").await;
    let (status, short) = env.create(json!({"ttl_secs": 1}), None).await;
    assert!(status == 201 || status == 202, "{status} {short}");
    let short_id = short["id"].as_str().unwrap().to_string();
    let running = env.wait_state(&short_id, "running").await;
    let expires = running["expires_ms"].as_i64().unwrap();
    let created = running["created_ms"].as_i64().unwrap();
    assert_eq!(expires - created, 1000, "{running}");

    let (_, extended) = env.create(json!({"ttl_secs": 1}), None).await;
    let extended_id = extended["id"].as_str().unwrap().to_string();
    env.wait_state(&extended_id, "running").await;
    let moved = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{extended_id}/timeout")))
        .bearer_auth(TOKEN_A)
        .json(&json!({"ttl_secs": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status(), 200);
    let moved: Value = moved.json().await.unwrap();
    assert!(
        moved["expires_ms"].as_i64().unwrap() > expires + 50_000,
        "{moved}"
    );

    // The short one goes; the extended one stays.
    env.wait_state(&short_id, "deleted").await;
    assert_eq!(env.live("pool-a"), 1, "the expired instance was deleted");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(env.get(&extended_id).await.1["state"], "running");

    // Shortened again, it goes too.
    let shortened = env
        .http
        .post(env.gw.api(&format!("/v1/sandboxes/{extended_id}/timeout")))
        .bearer_auth(TOKEN_A)
        .json(&json!({"ttl_secs": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(shortened.status(), 200);
    env.wait_state(&extended_id, "deleted").await;
    assert_eq!(env.live("pool-a"), 0);
    let metrics = reqwest::get(env.gw.api("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sandgate_sandboxes_expired_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn lifetimes_out_of_range_and_timeouts_of_other_workspaces_are_refused() {
    let env = start("").await;
    for ttl in [json!(0), json!(2_592_001), json!("10"), json!(-1)] {
        let (status, body) = env.create(json!({"ttl_secs": ttl}), None).await;
        assert!(status == 400 || status == 422, "{ttl}: {status} {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    }
    assert_eq!(env.live("pool-a"), 0, "a refused create makes nothing");
    let (_, created) = env.create(json!({}), None).await;
    let id = created["id"].as_str().unwrap().to_string();
    env.wait_state(&id, "running").await;
    let timeout = |token: &'static str, body: Value| {
        let request = env
            .http
            .post(env.gw.api(&format!("/v1/sandboxes/{id}/timeout")))
            .bearer_auth(token)
            .json(&body);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(timeout(TOKEN_B, json!({"ttl_secs": 5})).await, 404);
    assert_eq!(timeout(TOKEN_A, json!({"ttl_secs": 0})).await, 400);
    assert_eq!(timeout(TOKEN_A, json!({"ttl": 5})).await, 400);
    assert!(env.get(&id).await.1["expires_ms"].is_null());
}
