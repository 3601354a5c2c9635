//! A sandbox operation its hosted provider does not answer in time is answered 504
//! `upstream_timeout` on `/v1` (the provider is to blame; whether it applied the operation is
//! unknown), not 502 `provider_error` (a provider that answered with a failure). The fake
//! Daytona's toolbox hang holds every toolbox call past the account's
//! `options.request_timeout_secs` (1 s here), over a real socket.

use std::time::{Duration, Instant};

use crate::common::fakes::daytona::{FakeDaytona, FakeDaytonaConfig};
use crate::common::*;
use serde_json::{json, Value};

const API_TOKEN: &str = "api-token-timeouts-0123456789";

async fn gateway(daytona: &FakeDaytona, keys: &std::path::Path) -> Gateway {
    let key = keys.join("daytona.key");
    std::fs::write(&key, daytona.api_key()).unwrap();
    Gateway::start(GatewayOptions {
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
name = "daytona"
[[accounts]]
name = "daytona-main"
provider = "daytona"
base_url = "{url}"
api_key_file = {key:?}
options = {{ request_timeout_secs = "1" }}
[[pools]]
name = "daytona"
provider = "daytona"
account = "daytona-main"
"#,
            url = daytona.api_url(),
            key = key.display().to_string(),
        ),
        ..GatewayOptions::default()
    })
    .await
}

async fn running(gw: &Gateway) -> String {
    let (status, created) = gw
        .api_post("/v1/sandboxes", API_TOKEN, &json!({"provider": "daytona"}))
        .await;
    assert!(status == 201 || status == 202, "{status}: {created:#}");
    let id = created["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = gw.api_json(&format!("/v1/sandboxes/{id}"), API_TOKEN).await;
        if view["state"] == "running" {
            return id;
        }
        assert!(Instant::now() < deadline, "never ran: {view:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_the_provider_does_not_answer_in_time_is_504_upstream_timeout() {
    init();
    let daytona = FakeDaytona::start(FakeDaytonaConfig {
        start_delay: Duration::from_millis(50),
        ..FakeDaytonaConfig::default()
    })
    .await;
    let keys = tempfile::tempdir().unwrap();
    let gw = gateway(&daytona, keys.path()).await;
    let id = running(&gw).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let list = gw.api(&format!("/v1/sandboxes/{id}/files?path=/home/daytona"));
    let get = || http.get(&list).bearer_auth(API_TOKEN).send();
    assert_eq!(get().await.unwrap().status(), 200);

    daytona.hang_toolbox(Some(Duration::from_secs(5)));
    let started = Instant::now();
    let answer = get().await.unwrap();
    let took = started.elapsed();
    assert_eq!(answer.status(), 504);
    assert_eq!(answer.headers()["x-sandgate-error"], "upstream_timeout");
    assert!(answer.headers().get("retry-after").is_none());
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_timeout", "{body:#}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("daytona"), "{message}");
    assert!(!message.contains(daytona.api_key()), "{message}");
    // The gateway answered at its own timeout, not when the provider finally did.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(4500),
        "answered after {took:?}"
    );
    // A provider that answers with a failure is still 502 provider_error.
    daytona.hang_toolbox(None);
    daytona.fail_toolbox(Some(http::StatusCode::INTERNAL_SERVER_ERROR));
    let failed = get().await.unwrap();
    assert_eq!(failed.status(), 502);
    assert_eq!(failed.headers()["x-sandgate-error"], "provider_error");
    daytona.fail_toolbox(None);
    // The provider was slow, not the sandbox gone: it still runs and answers.
    assert_eq!(get().await.unwrap().status(), 200);
    let view = gw.api_json(&format!("/v1/sandboxes/{id}"), API_TOKEN).await;
    assert_eq!(view["state"], "running", "{view:#}");
}
