//! `sandgate serve --role all|api|proxy` and the probes (issue 15, item 4): a control-plane
//! replica (`api`) binds no proxy listener but creates sandboxes; a proxy replica (`proxy`)
//! on the same store serves their egress and answers only the probes and metrics on its API
//! listener; `/livez` and `/readyz` answer on every role. Real `sandgate serve` processes,
//! one SQLite store, real HTTP through the proxy (reqwest).

use std::process::Command;

use crate::common::*;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
const TOKEN: &str = "api-token-roles-0123456789";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One configuration for every replica; the proxy listens on `proxy_port`.
fn config(dir: &std::path::Path, proxy_port: u16) -> std::path::PathBuf {
    let extra = format!(
        r#"
[[api.tokens]]
token = "{TOKEN}"
principal = "alice"
workspace = "ws-a"
[dns.hosts]
"plain.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]
[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "pool-a"
provider = "sim"
account = "acct"
egress = "gateway"
"#
    );
    let text = process_config(dir, "", "", &extra).replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{proxy_port}\""),
        1,
    );
    let path = dir.join("sandgate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn serve(config: &std::path::Path, role: &str) -> Served {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--config"])
        .arg(config)
        .args(["--role", role]);
    serve_process(command)
}

async fn get(http: &reqwest::Client, url: String) -> (u16, Value) {
    let r = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_and_proxy_replicas_split_the_planes_over_one_store() {
    init();
    let origin = start_origin(None).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy_port = free_port();
    let cfg = config(dir.path(), proxy_port);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    // The control plane: probes, the API, and no proxy listener.
    let api = serve(&cfg, "api");
    assert!(api
        .stderr
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("role api") && l.contains("not served by this replica")));
    let base = format!("http://{}", api.api);
    assert_eq!(
        get(&http, format!("{base}/livez")).await,
        (200, json!({"live": true, "role": "api"}))
    );
    let (status, ready) = get(&http, format!("{base}/readyz")).await;
    assert_eq!((status, &ready["ready"]), (200, &json!(true)), "{ready}");
    assert!(ready["policy_generation"].as_u64().unwrap() >= 1);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", proxy_port)).is_err(),
        "a replica of role api must not listen on the proxy port"
    );
    let r = http
        .post(format!("{base}/v1/sandboxes"))
        .bearer_auth(TOKEN)
        .json(&json!({"network": {"allow_domains": ["plain.test"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let proxy_url = created["egress"]["proxy_url"].as_str().unwrap().to_string();
    assert!(
        proxy_url.ends_with(&format!("@127.0.0.1:{proxy_port}")),
        "sandboxes are sent to the configured proxy: {proxy_url}"
    );

    // The proxy plane on the same store: the sandbox's egress works through it, and its
    // API listener answers the probes and metrics only.
    let proxy = serve(&cfg, "proxy");
    let pbase = format!("http://{}", proxy.api);
    assert_eq!(
        get(&http, format!("{pbase}/livez")).await,
        (200, json!({"live": true, "role": "proxy"}))
    );
    assert_eq!(get(&http, format!("{pbase}/readyz")).await.0, 200);
    let metrics = http.get(format!("{pbase}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    let (status, refused) = get(&http, format!("{pbase}/v1/sandboxes")).await;
    assert_eq!(status, 404, "{refused}");
    assert_eq!(refused["error"]["code"], "not_found");

    let sandbox = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(&proxy_url).unwrap())
        .build()
        .unwrap();
    let resp = sandbox
        .get(format!(
            "http://plain.test:{}/through-the-proxy",
            origin.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(origin.count(), 1);
    assert_eq!(origin.last().unwrap().path, "/through-the-proxy");
    // Outside its allow-list: refused by the proxy replica's policy.
    let resp = sandbox
        .get(format!("http://localhost:{}/x", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_all_is_the_default_and_an_unknown_role_is_refused() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), free_port());
    let mut command = Command::new(BIN);
    command.args(["serve", "--config"]).arg(&cfg);
    let all = serve_process(command);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let (status, live) = get(&http, format!("http://{}/livez", all.api)).await;
    assert_eq!((status, &live["role"]), (200, &json!("all")));
    drop(all);

    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .args(["--role", "everything"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'everything'") && stderr.contains("proxy"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("SANDGATE_ROLE", "proxy")
        .args(["--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("SANDGATE_ROLE"));
}
