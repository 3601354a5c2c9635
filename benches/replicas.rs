//! Scale-out figures in one run (issue 15): creates on an instant simulated pool through one
//! gateway on SQLite, one on Postgres, and two replicas on one Postgres (creates sent round
//! robin); then the propagation delay between two replicas, on SQLite (polled) and Postgres
//! (NOTIFY): from a create answered by replica A until replica B's proxy accepts the
//! sandbox, and from a delete answered by A until B has cut the sandbox's open tunnel.
//!
//! Baseline in the same run: `GET /healthz` round trips on the first gateway.
//!
//! Run: `SANDGATE_TEST_POSTGRES_URL=postgres://user:pw@127.0.0.1:5432/db cargo bench --bench
//! replicas` (the role must be allowed to create databases; without the variable the Postgres
//! rows are skipped and say so). Env: `REPLICAS_BENCH_N` creates per row (default 1000),
//! `REPLICAS_BENCH_CONCURRENCY` (16), `REPLICAS_BENCH_PROPAGATION_N` (100).

use std::path::Path;
use std::time::{Duration, Instant};

use sandgate::config::Config;
use sandgate::server::Server;
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "bench-token-0123456789abcdef";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>, wall: Option<Duration>) {
    samples.sort();
    let rate = wall
        .map(|w| format!("{:>8.0} /s", samples.len() as f64 / w.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{name:<52} n={:<5} p50={:>9.2} ms  p99={:>9.2} ms  {rate}",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
    );
}

/// `store`: the `[store]` table's keys.
async fn start(dir: &Path, store: &str) -> Server {
    let policy_dir = dir.join("policies");
    std::fs::create_dir_all(&policy_dir).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(repo).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rego") {
            std::fs::copy(&path, policy_dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let toml = format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
max_connections_per_ip = 4096
[[api.tokens]]
token = "{TOKEN}"
principal = "bench"
workspace = "ws-bench"
[tls]
ca_dir = {certs:?}
[store]
{store}
[secrets]
master_key_file = {key:?}
[policy]
dir = {policies:?}
reload_interval_ms = 0
[log]
decisions = "off"
level = "warn"
[create]
janitor_interval_ms = 60000
# Every create is answered once it runs (no 202 under load): the latency is the whole create.
short_wait_ms = 30000
[dns.hosts]
"up.bench.test" = "127.0.0.1"
[egress]
allow_private = ["127.0.0.0/8"]

[[providers]]
name = "sim"
kind = "simulated"
[[accounts]]
name = "acct"
provider = "sim"
[[pools]]
name = "instant"
provider = "sim"
account = "acct"
egress = "gateway"
"#,
        certs = dir.join("certs").display().to_string(),
        key = dir.join("data/master.key").display().to_string(),
        policies = policy_dir.display().to_string(),
    );
    let config = Config::from_toml(&toml).unwrap();
    Server::start(config).await.unwrap()
}

fn body() -> serde_json::Value {
    serde_json::json!({"labels": {"bench": "replicas"}, "network": {"allow_domains": ["up.bench.test"]}})
}

/// `n` creates, `concurrency` at a time, sent round robin to `apis`.
async fn creates(
    http: &reqwest::Client,
    apis: &[String],
    n: usize,
    concurrency: usize,
) -> (Vec<Duration>, Duration) {
    let per_task = n / concurrency.max(1);
    let wall = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let http = http.clone();
        let apis = apis.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let api = &apis[(task + i) % apis.len()];
                let t = Instant::now();
                let r = http
                    .post(format!("{api}/v1/sandboxes"))
                    .bearer_auth(TOKEN)
                    .json(&body())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                r.bytes().await.unwrap();
                samples.push(t.elapsed());
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap());
    }
    (samples, wall.elapsed())
}

/// A CONNECT through `proxy` as the sandbox; the open stream on 200.
async fn tunnel(
    proxy: std::net::SocketAddr,
    authority: &str,
    id: &str,
    token: &str,
) -> Option<TcpStream> {
    use base64::Engine as _;
    let mut stream = TcpStream::connect(proxy).await.ok()?;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{token}"));
    let head = format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    buf.starts_with(b"HTTP/1.1 200").then_some(stream)
}

/// Create on A → accepted by B's proxy; delete on A → B's tunnel cut. `rounds` of each.
async fn propagation(label: &str, a: &Server, b: &Server, rounds: usize, authority: &str) {
    let http = reqwest::Client::new();
    let api = format!("http://{}", a.api_addr());
    let (mut appear, mut cut) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let r = http
            .post(format!("{api}/v1/sandboxes"))
            .bearer_auth(TOKEN)
            .json(&body())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let created: serde_json::Value = r.json().await.unwrap();
        let t = Instant::now();
        let id = created["id"].as_str().unwrap().to_string();
        let token = created["egress"]["token"].as_str().unwrap().to_string();
        let mut open = loop {
            if let Some(stream) = tunnel(b.proxy_addr(), authority, &id, &token).await {
                break stream;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{label}: B never served {id}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        appear.push(t.elapsed());
        let r = http
            .delete(format!("{api}/v1/sandboxes/{id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let t = Instant::now();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), open.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{label}: tunnel not cut"
        );
        cut.push(t.elapsed());
    }
    report(
        &format!("{label}: create on A -> served by B"),
        appear,
        None,
    );
    report(
        &format!("{label}: delete on A -> tunnel on B cut"),
        cut,
        None,
    );
}

/// A fresh database on the server `SANDGATE_TEST_POSTGRES_URL` names; its URL.
async fn postgres_database(name: &str) -> Option<String> {
    let server = std::env::var("SANDGATE_TEST_POSTGRES_URL").ok()?;
    let mut admin = sqlx::PgConnection::connect(&server).await.unwrap();
    let db = format!("sgbench_{name}_{}", std::process::id());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{db}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path(&db);
    Some(url.to_string())
}

async fn run(n: usize, concurrency: usize, rounds: usize) {
    // The upstream the sandboxes' tunnels reach: accepts and holds connections.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = upstream.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = upstream.accept().await {
            held.push(stream);
        }
    });
    let authority = format!("up.bench.test:{port}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    println!("sandgate replicas benchmark: instant simulated pool, n={n} creates per row, {concurrency} concurrent; propagation rounds={rounds}");

    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!(
        "path = {:?}",
        dir.path().join("data/sandgate.db").display().to_string()
    );
    let a = start(dir.path(), &sqlite).await;
    let api_a = format!("http://{}", a.api_addr());
    let mut health = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        http.get(format!("{api_a}/healthz"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        health.push(t.elapsed());
    }
    report("baseline GET /healthz (sequential)", health, None);
    creates(&http, std::slice::from_ref(&api_a), 100, concurrency).await; // warm-up
    let (samples, wall) = creates(&http, std::slice::from_ref(&api_a), n, concurrency).await;
    report("creates, one gateway, SQLite", samples, Some(wall));
    // The second replica joins only now: the row above is one gateway alone.
    let b = start(dir.path(), &sqlite).await;
    propagation("sqlite (poll 250 ms)", &a, &b, rounds, &authority).await;
    a.shutdown();
    b.shutdown();

    let Some(url) = postgres_database("replicas").await else {
        println!("Postgres rows skipped: SANDGATE_TEST_POSTGRES_URL is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pg = format!("url = {url:?}");
    let a = start(dir.path(), &pg).await;
    let api_a = format!("http://{}", a.api_addr());
    creates(&http, std::slice::from_ref(&api_a), 100, concurrency).await; // warm-up
    let (samples, wall) = creates(&http, std::slice::from_ref(&api_a), n, concurrency).await;
    report("creates, one gateway, Postgres", samples, Some(wall));
    let b = start(dir.path(), &pg).await;
    let apis = [api_a, format!("http://{}", b.api_addr())];
    creates(&http, &apis, 100, concurrency).await; // warm-up
    let (samples, wall) = creates(&http, &apis, n, concurrency).await;
    report(
        "creates, two replicas, Postgres (round robin)",
        samples,
        Some(wall),
    );
    propagation("postgres (NOTIFY)", &a, &b, rounds, &authority).await;
    a.shutdown();
    b.shutdown();
}

fn main() {
    let n = env_usize("REPLICAS_BENCH_N", 1000);
    let concurrency = env_usize("REPLICAS_BENCH_CONCURRENCY", 16);
    let rounds = env_usize("REPLICAS_BENCH_PROPAGATION_N", 100);
    sandgate::tls::install_default_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(n, concurrency, rounds));
}
