//! A real in-process gateway on `[store] url` (Postgres): sandboxes created on simulated
//! pools through the HTTP API, an idempotent replay, a delete, and a restart on the same
//! database that finds the sandbox again (its egress identity included). Runs on the server
//! `SANDGATE_TEST_POSTGRES_URL` names, in a database of its own; outside CI without it, it
//! prints `SKIPPED`; under CI it fails.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{json, Value};

use crate::common::postgres::{self, TestDatabase};
use crate::common::*;

const TOKEN_A: &str = "api-token-ws-a-0123456789";

fn config(state_dir: &Path) -> String {
    format!(
        r#"
[[api.tokens]]
token = "{TOKEN_A}"
principal = "alice"
workspace = "ws-a"

[create]
short_wait_ms = 3000
janitor_interval_ms = 100

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

[[pools]]
name = "pool-a"
provider = "sim"
account = "acct-a"
[[pools]]
name = "pool-b"
provider = "sim"
account = "acct-b"

# The inventories outlive the gateway, as a remote provider's would, so the restarted
# gateway finds the instances again.
[simulated.pool-a]
state_file = {a:?}
[simulated.pool-b]
state_file = {b:?}
"#,
        a = state_dir.join("pool-a.json").display().to_string(),
        b = state_dir.join("pool-b.json").display().to_string(),
    )
}

struct Api {
    gw: Gateway,
    http: reqwest::Client,
}

impl Api {
    async fn start(url: &str, shared: &Path) -> Api {
        let gw = Gateway::start(GatewayOptions {
            extra_toml: config(shared),
            store_url: Some(url.to_string()),
            master_key_file: Some(shared.join("master.key")),
            ..GatewayOptions::default()
        })
        .await;
        Api {
            gw,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        }
    }

    async fn create(&self, body: &Value, key: Option<&str>) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.gw.api("/v1/sandboxes"))
            .bearer_auth(TOKEN_A)
            .json(body);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn call(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .request(method, self.gw.api(path))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_on_postgres_creates_replays_deletes_and_survives_a_restart() {
    const TEST: &str = "gateway_on_postgres_creates_replays_deletes_and_survives_a_restart";
    init();
    let Some(server) = postgres::server_or_skip(TEST) else {
        return;
    };
    let db = TestDatabase::create(&server, "gateway_restart").await;
    let url = db.url.expose().to_string();
    let outcome = AssertUnwindSafe(run(url)).catch_unwind().await;
    db.drop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn run(url: String) {
    let shared = tempfile::tempdir().unwrap();
    let api = Api::start(&url, shared.path()).await;

    // The store the gateway opened is Postgres, and says so without its password.
    let store = api.gw.server.sandboxes.store();
    assert_eq!(store.dialect(), sandgate::store::Dialect::Postgres);
    if let Some(password) = url::Url::parse(&url).unwrap().password() {
        assert!(!format!("{store:?}").contains(&format!(":{password}@")));
    }

    let body = json!({"labels": {"app": "pg"}});
    let (status, first) = api.create(&body, Some("pg-key-1")).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["state"], "running", "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let token = first["egress"]["token"].as_str().unwrap().to_string();
    let pool = first["placement"]["pool"].as_str().unwrap().to_string();

    // The same key and body: the same sandbox, without the token.
    let (status, replay) = api.create(&body, Some("pg-key-1")).await;
    assert_eq!(status, 201, "{replay}");
    assert_eq!(replay["id"], id.as_str());
    assert_eq!(replay["egress"]["token_already_shown"], true, "{replay}");
    // The same key with another body: a conflict naming the holder.
    let (status, conflict) = api
        .create(&json!({"labels": {"app": "other"}}), Some("pg-key-1"))
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "idempotency_conflict");
    assert_eq!(conflict["error"]["details"]["sandbox_id"], id.as_str());

    // A second sandbox, deleted.
    let (status, second) = api.create(&json!({"labels": {"app": "gone"}}), None).await;
    assert_eq!(status, 201, "{second}");
    let gone = second["id"].as_str().unwrap().to_string();
    let (status, deleted) = api
        .call(reqwest::Method::DELETE, &format!("/v1/sandboxes/{gone}"))
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["state"], "deleted", "{deleted}");

    // Listing by label goes through the Postgres JSON filter.
    let (status, list) = api
        .call(reqwest::Method::GET, "/v1/sandboxes?label=app=pg")
        .await;
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(listed, [id.as_str()], "{list}");

    // Restart on the same database (and master key): the sandbox is there, still running,
    // its egress identity registered again from the sealed token.
    api.gw.server.shutdown();
    let api = Api::start(&url, shared.path()).await;
    let (status, again) = api
        .call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["state"], "running", "{again}");
    assert_eq!(again["placement"]["pool"], pool.as_str(), "{again}");
    let (_, gone_again) = api
        .call(reqwest::Method::GET, &format!("/v1/sandboxes/{gone}"))
        .await;
    assert_eq!(gone_again["state"], "deleted", "{gone_again}");
    let (status, replay) = api.create(&body, Some("pg-key-1")).await;
    assert_eq!(status, 201, "{replay}");
    assert_eq!(replay["id"], id.as_str(), "the key survived the restart");
    let (status, _) = connect_tunnel(
        api.gw.server.proxy_addr(),
        "api.b.test:443",
        Some((&id, &token)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(
        status, 403,
        "authenticated after the restart, then refused by policy"
    );
    api.gw.server.shutdown();

    // `sandgate route explain` reads the measured context from the configured store: the
    // Postgres one, named without its password.
    let cli_config = shared.path().join("explain.toml");
    std::fs::write(
        &cli_config,
        format!("{}\n[store]\nurl = {url:?}\n", config(shared.path())),
    )
    .unwrap();
    let request = shared.path().join("request.json");
    std::fs::write(&request, json!({"labels": {"app": "pg"}}).to_string()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["route", "explain", "--config"])
        .arg(&cli_config)
        .arg("--request")
        .arg(&request)
        .current_dir(shared.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("measured context of the store at postgres://"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("(0 samples"),
        "the creates' samples were read: {stderr}"
    );
    if let Some(password) = url::Url::parse(&url).unwrap().password() {
        assert!(!stderr.contains(&format!(":{password}@")), "{stderr}");
    }
    let explanation: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(explanation.is_object(), "{explanation}");
}

/// `/readyz` follows the store: with the database refusing connections (and the gateway's
/// own connections cut) it answers 503 `not_ready` naming the store, without its address;
/// `/livez` stays 200 (a slow database must not restart replicas); once the database takes
/// connections again the replica is ready again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_postgres_store() {
    const TEST: &str = "readiness_follows_the_postgres_store";
    init();
    let Some(server) = postgres::server_or_skip(TEST) else {
        return;
    };
    let db = TestDatabase::create(&server, "readiness").await;
    let outcome = AssertUnwindSafe(readiness(&server, &db))
        .catch_unwind()
        .await;
    // Connections allowed again whatever happened, or the drop below cannot run.
    set_connections(&server, db.name(), true).await;
    db.drop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn set_connections(server: &sandgate::store::DatabaseUrl, name: &str, allow: bool) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(server.expose()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {allow}"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    if !allow {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&mut admin)
            .await
            .unwrap();
    }
    admin.close().await.unwrap();
}

async fn readiness(server: &sandgate::store::DatabaseUrl, db: &TestDatabase) {
    let shared = tempfile::tempdir().unwrap();
    let api = Api::start(db.url.expose(), shared.path()).await;
    let probe = |path: &'static str| {
        let http = api.http.clone();
        let url = api.gw.api(path);
        async move {
            let resp = http.get(url).send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap())
        }
    };
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, 200, "{body}");

    set_connections(server, db.name(), false).await;
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, 503, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["error"]["code"], "not_ready", "{body}");
    assert_eq!(reply["error"]["details"]["store"], "unreachable", "{body}");
    assert!(reply["error"]["details"]["policy_generation"].as_u64() > Some(0));
    assert!(
        !body.contains("127.0.0.1") && !body.contains(db.name()),
        "{body}"
    );
    if let Some(password) = url::Url::parse(db.url.expose()).unwrap().password() {
        assert!(!body.contains(password), "{body}");
    }
    assert_eq!(probe("/livez").await.0, 200, "liveness ignores the store");

    set_connections(server, db.name(), true).await;
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, 200, "ready again without a restart: {body}");
    api.gw.server.shutdown();
}

/// A TCP forwarder the test controls, standing between the gateway and Postgres: cutting it
/// closes its listener (new connections are refused, as by a database that is down) and
/// every connection it carries; restoring it listens again on the same address.
struct Forwarder {
    addr: std::net::SocketAddr,
    target: std::net::SocketAddr,
    accept: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    pipes: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Forwarder {
    async fn start(target: std::net::SocketAddr) -> Forwarder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let forwarder = Forwarder {
            addr: listener.local_addr().unwrap(),
            target,
            accept: Default::default(),
            pipes: Default::default(),
        };
        forwarder.serve(listener);
        forwarder
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (target, pipes) = (self.target, self.pipes.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                pipes.lock().unwrap().push(pipe);
            }
        });
        *self.accept.lock().unwrap() = Some(task);
    }

    /// The outage: nothing reaches Postgres through here any more.
    fn cut(&self) {
        if let Some(task) = self.accept.lock().unwrap().take() {
            task.abort();
        }
        for pipe in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }

    async fn restore(&self) {
        // tokio binds with SO_REUSEADDR, so the address is free again at once.
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

/// Issue 25 item 10: during a Postgres outage a create is answered 503 `store_unavailable`
/// (retryable, with `Retry-After`) within about `[store] acquire_timeout_ms` (2 s by
/// default), not 500 `internal` after 10 s; once the database is back, the same
/// Idempotency-Key gives exactly one sandbox, and sending it again gives that same one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_answers_503_store_unavailable_promptly_and_loses_nothing() {
    const TEST: &str = "a_store_outage_answers_503_store_unavailable_promptly_and_loses_nothing";
    init();
    let Some(server) = postgres::server_or_skip(TEST) else {
        return;
    };
    let db = TestDatabase::create(&server, "store_outage").await;
    let outcome = AssertUnwindSafe(outage(&db)).catch_unwind().await;
    db.drop().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn outage(db: &TestDatabase) {
    use std::net::ToSocketAddrs;
    let mut url = url::Url::parse(db.url.expose()).unwrap();
    let target = (url.host_str().unwrap(), url.port().unwrap_or(5432))
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap();
    let forwarder = Forwarder::start(target).await;
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(forwarder.addr.port())).unwrap();
    let shared = tempfile::tempdir().unwrap();
    let api = Api::start(url.as_str(), shared.path()).await;

    let (status, warm) = api.create(&json!({"labels": {"app": "warm"}}), None).await;
    assert_eq!(status, 201, "{warm}");

    forwarder.cut();
    let body = json!({"labels": {"app": "outage"}});
    let started = std::time::Instant::now();
    let resp = api
        .http
        .post(api.gw.api("/v1/sandboxes"))
        .bearer_auth(TOKEN_A)
        .header("idempotency-key", "outage-key-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").cloned();
    let reply: Value = resp.json().await.unwrap();
    eprintln!(
        "create during the outage: {status} in {} ms: {reply}",
        took.as_millis()
    );
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["code"], "store_unavailable", "{reply}");
    assert!(
        retry_after.is_some(),
        "a retryable answer says when to retry"
    );
    assert!(
        took < Duration::from_millis(3500),
        "answered within about the 2 s acquire timeout, took {took:?}"
    );
    // A read during the outage says the same.
    let (status, read) = api
        .call(reqwest::Method::GET, "/v1/sandboxes?label=app=warm")
        .await;
    assert_eq!(status, 503, "{read}");
    assert_eq!(read["error"]["code"], "store_unavailable", "{read}");

    forwarder.restore().await;
    // The pool reconnects on demand; the first requests after the restore may still fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let created = loop {
        let (status, created) = api.create(&body, Some("outage-key-1")).await;
        if status != 503 {
            assert!(status == 201 || status == 202, "{status} {created}");
            break created;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still unavailable 15 s after the restore: {created}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let id = created["id"].as_str().unwrap().to_string();
    let (status, again) = api.create(&body, Some("outage-key-1")).await;
    assert!(status == 201 || status == 202, "{status} {again}");
    assert_eq!(again["id"], id.as_str(), "the same key is the same sandbox");
    let (status, list) = api
        .call(reqwest::Method::GET, "/v1/sandboxes?label=app=outage")
        .await;
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(listed, [id.as_str()], "exactly one sandbox: {list}");
    api.gw.server.shutdown();
    forwarder.cut();
}
